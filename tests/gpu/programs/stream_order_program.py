"""Copies on a non-blocking stream come after that stream's earlier work: a slow kernel writes 42, then an
async device-to-host copy on the same stream must read 42 (and a host-to-device copy must land after it)."""
import json

import numpy as np
from cuda.bindings import driver, nvrtc

SLOW = rb"""
extern "C" __global__ void slow_write(unsigned int *out, unsigned int value) {
    long long start = clock64();
    while (clock64() - start < 200000000LL) { }   // about 0.1 s
    *out = value;
}
"""


def ok(result):
    assert int(result[0]) == 0, result
    return result[1] if len(result) == 2 else result[1:]


driver.cuInit(0)
dev = ok(driver.cuDeviceGet(0))
driver.cuCtxSetCurrent(ok(driver.cuDevicePrimaryCtxRetain(dev)))
attr = driver.CUdevice_attribute
major = ok(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
minor = ok(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
arch = f"{major}{minor}"
prog = ok(nvrtc.nvrtcCreateProgram(SLOW, b"slow.cu", 0, [], []))
assert int(nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture=sm_{arch}".encode()])[0]) == 0
cubin = b" " * ok(nvrtc.nvrtcGetCUBINSize(prog))
nvrtc.nvrtcGetCUBIN(prog, cubin)
kernel = ok(driver.cuModuleGetFunction(ok(driver.cuModuleLoadData(cubin)), b"slow_write"))
stream = ok(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))
cell = ok(driver.cuMemAlloc(4))
ok((*driver.cuMemsetD32(cell, 7, 1), None))
value = np.zeros(1, dtype=np.uint32)
pointer, number = np.array([int(cell)], dtype=np.uint64), np.array([42], dtype=np.uint32)
params = np.array([pointer.ctypes.data, number.ctypes.data], dtype=np.uint64)
ok((*driver.cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, stream, params.ctypes.data, 0), None))
ok((*driver.cuMemcpyDtoHAsync(value.ctypes.data, cell, 4, stream), None))
ok((*driver.cuStreamSynchronize(stream), None))
after_kernel = int(value[0])
number[0] = 43
ok((*driver.cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, stream, params.ctypes.data, 0), None))
value[0] = 99
ok((*driver.cuMemcpyHtoDAsync(cell, value.ctypes.data, 4, stream), None))
ok((*driver.cuStreamSynchronize(stream), None))
ok((*driver.cuMemcpyDtoH(value.ctypes.data, cell, 4), None))
print("RESULT " + json.dumps({"dtoh_after_kernel": after_kernel, "htod_after_kernel": int(value[0])}))
