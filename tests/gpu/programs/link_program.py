"""An ordinary cuda.bindings program (nothing Orion in it): the JIT linker. A kernel compiled to PTX with NVRTC is
linked with cuLinkCreate / cuLinkAddData / cuLinkComplete, the cubin loaded with cuModuleLoadData and launched, the
result read back. Prints one JSON line (the results, and whether the cubin had bytes: never the bytes), so the same
program can be run natively and forwarded and the two outputs compared."""
import ctypes
import json

import numpy as np
from cuda.bindings import driver, nvrtc

SCALE = rb"""
extern "C" __global__ void scale_add(const int *x, int *y, int k, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = k * x[i] + y[i];
}
"""


def check(result):
    err, *rest = result
    if int(err) != 0:
        raise SystemExit(f"CUDA error {err!r}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def compile_ptx(major, minor):
    prog = check(nvrtc.nvrtcCreateProgram(SCALE, b"scale_add.cu", 0, [], []))
    opts = [f"--gpu-architecture=compute_{major}{minor}".encode()]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if int(err) != 0:
        size = check(nvrtc.nvrtcGetProgramLogSize(prog))
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise SystemExit(log.decode())
    size = check(nvrtc.nvrtcGetPTXSize(prog))  # with its NUL, as cuLinkAddData wants PTX
    ptx = b" " * size
    check(nvrtc.nvrtcGetPTX(prog, ptx))
    return ptx


def main():
    out = {}
    check(driver.cuInit(0))
    dev = check(driver.cuDeviceGet(0))
    attr = driver.CUdevice_attribute
    major = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    ctx = check(driver.cuDevicePrimaryCtxRetain(dev))
    check(driver.cuCtxSetCurrent(ctx))
    ptx = compile_ptx(major, minor)

    level = driver.CUjit_option.CU_JIT_OPTIMIZATION_LEVEL
    state = check(driver.cuLinkCreate(1, [level], [3]))
    (err,) = driver.cuLinkAddData(state, driver.CUjitInputType.CU_JIT_INPUT_PTX, ptx, len(ptx), b"scale_add.ptx",
                                  0, [], [])
    out["add"] = int(err)
    cubin_at, size = check(driver.cuLinkComplete(state))
    cubin = ctypes.string_at(int(cubin_at), size)
    out["cubin_bytes"] = size > 0 and len(cubin) == size
    out["cubin_is_elf"] = cubin[:4] == b"\x7fELF"
    module = check(driver.cuModuleLoadData(cubin))  # loaded before the state goes, as the driver documents
    check(driver.cuLinkDestroy(state))
    # (no second cuLinkDestroy: the H200's driver frees the state twice and the process aborts, so a program must
    # not; the forwarded host refuses it before its driver, tests/wire/test_native_link_calls.py)
    function = check(driver.cuModuleGetFunction(module, b"scale_add"))

    n = 4096
    x = np.arange(n, dtype=np.int32)
    y = np.full(n, 5, dtype=np.int32)
    dx, dy = check(driver.cuMemAlloc(x.nbytes)), check(driver.cuMemAlloc(y.nbytes))
    check(driver.cuMemcpyHtoD(dx, x, x.nbytes))
    check(driver.cuMemcpyHtoD(dy, y, y.nbytes))
    args = [np.array([int(dx)], dtype=np.uint64), np.array([int(dy)], dtype=np.uint64),
            np.array([3], dtype=np.int32), np.array([n], dtype=np.uint32)]
    params = np.array([a.ctypes.data for a in args], dtype=np.uint64)
    check(driver.cuLaunchKernel(function, (n + 255) // 256, 1, 1, 256, 1, 1, 0, 0, params.ctypes.data, 0))
    check(driver.cuCtxSynchronize())
    got = np.empty_like(y)
    check(driver.cuMemcpyDtoH(got, dy, got.nbytes))
    out["result_ok"] = bool(np.array_equal(got, 3 * x + 5))
    out["result_head"] = got[:4].tolist()
    check(driver.cuMemFree(dx))
    check(driver.cuMemFree(dy))
    check(driver.cuModuleUnload(module))
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
