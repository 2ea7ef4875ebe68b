"""A cuda.bindings program that fills most of a small vGPU quota, resets its device (cuDevicePrimaryCtxReset, what
cudaDeviceReset does), allocates as much again, releases its primary context for the last time, and allocates once
more in a new one. Prints one JSON line of CUDA results.

Natively every allocation succeeds: a reset and a last release free what was allocated in the context. Forwarded
under `oriond --gmem 16` the quota must give that memory back too (host_agent/session/executor.py,
forget_freed_allocations); before, the allocations after the reset failed with CUDA_ERROR_OUT_OF_MEMORY.
"""
import json

from cuda.bindings import driver

MIB = 1 << 20


def status(result):
    return int(result[0])


def current_primary(device):
    err, context = driver.cuDevicePrimaryCtxRetain(device)
    assert status((err,)) == 0, err
    assert status(driver.cuCtxSetCurrent(context)) == 0
    return context


out = {}
assert status(driver.cuInit(0)) == 0
err, device = driver.cuDeviceGet(0)
current_primary(device)
out["first_12_mib"] = status(driver.cuMemAlloc(12 * MIB))
out["reset"] = status(driver.cuDevicePrimaryCtxReset(device))
driver.cuCtxSetCurrent(driver.cuDevicePrimaryCtxRetain(device)[1])  # reset does not release: used again
driver.cuDevicePrimaryCtxRelease(device)  # (the retain just made)
out["after_reset_12_mib"] = status(driver.cuMemAlloc(12 * MIB))
out["last_release"] = status(driver.cuDevicePrimaryCtxRelease(device))
current_primary(device)
out["new_context_12_mib"] = status(driver.cuMemAlloc(12 * MIB))
err, free, total = driver.cuMemGetInfo()
out["free_mib"] = int(free) // MIB if status((err,)) == 0 else None
print("RESULT " + json.dumps(out))
