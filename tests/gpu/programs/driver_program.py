"""An ordinary cuda.bindings program (nothing Orion in it): device queries, a context, memory, an NVRTC
kernel launched with parameters, streams, events, async copies. Prints one JSON line of results, so the
same program can be run natively and forwarded and the two outputs compared."""
import json
import sys

import numpy as np
from cuda.bindings import driver, nvrtc

SAXPY = rb"""
extern "C" __global__ void saxpy(float a, const float *x, float *y, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


def check(result):
    err, *rest = result
    if int(err) != 0:
        raise SystemExit(f"CUDA error {err!r}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def compile_cubin(major, minor):
    prog = check(nvrtc.nvrtcCreateProgram(SAXPY, b"saxpy.cu", 0, [], []))
    opts = [f"--gpu-architecture=sm_{major}{minor}".encode()]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if int(err) != 0:
        size = check(nvrtc.nvrtcGetProgramLogSize(prog))
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise SystemExit(log.decode())
    size = check(nvrtc.nvrtcGetCUBINSize(prog))
    cubin = b" " * size
    check(nvrtc.nvrtcGetCUBIN(prog, cubin))
    return cubin


def main():
    out = {}
    check(driver.cuInit(0))
    out["count"] = check(driver.cuDeviceGetCount())
    dev = check(driver.cuDeviceGet(0))
    out["name"] = check(driver.cuDeviceGetName(64, dev)).split(b"\0")[0].decode()
    attr = driver.CUdevice_attribute
    major = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    out["cc"] = [major, minor]
    out["total_mem"] = check(driver.cuDeviceTotalMem(dev))
    ctx = check(driver.cuDevicePrimaryCtxRetain(dev))
    check(driver.cuCtxSetCurrent(ctx))
    free, total = check(driver.cuMemGetInfo())
    out["mem_info_total"] = total

    n = 1 << 22  # 16 MiB of floats: staged through the region in chunks
    rng = np.random.default_rng(7)
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    dx = check(driver.cuMemAlloc(x.nbytes))
    dy = check(driver.cuMemAlloc(y.nbytes))
    check(driver.cuMemcpyHtoD(dx, x.ctypes.data, x.nbytes))
    stream = check(driver.cuStreamCreate(0))
    check(driver.cuMemcpyHtoDAsync(dy, y.ctypes.data, y.nbytes, stream))

    module = check(driver.cuModuleLoadData(compile_cubin(major, minor)))
    kernel = check(driver.cuModuleGetFunction(module, b"saxpy"))
    start, stop = check(driver.cuEventCreate(0)), check(driver.cuEventCreate(0))
    check(driver.cuEventRecord(start, stream))
    a = np.array([2.5], dtype=np.float32)
    args = (np.array([int(dx)], dtype=np.uint64), np.array([int(dy)], dtype=np.uint64),
            np.array([n], dtype=np.uint32))
    params = np.array([a.ctypes.data] + [arg.ctypes.data for arg in args], dtype=np.uint64)
    check(driver.cuLaunchKernel(kernel, (n + 255) // 256, 1, 1, 256, 1, 1, 0, stream, params.ctypes.data, 0))
    check(driver.cuEventRecord(stop, stream))
    check(driver.cuEventSynchronize(stop))
    out["elapsed_positive"] = check(driver.cuEventElapsedTime(start, stop)) > 0
    check(driver.cuStreamSynchronize(stream))

    result = np.empty_like(y)
    check(driver.cuMemcpyDtoHAsync(result.ctypes.data, dy, result.nbytes, stream))
    check(driver.cuStreamSynchronize(stream))
    out["saxpy_ok"] = bool(np.allclose(result, 2.5 * x + y, rtol=1e-5, atol=1e-5))  # the GPU fuses a*x+y
    out["saxpy_sum"] = float(np.float64(result.sum()))

    check(driver.cuMemsetD32(dx, 7, 16))
    small = np.zeros(16, dtype=np.uint32)
    check(driver.cuMemcpyDtoH(small.ctypes.data, dx, small.nbytes))
    out["memset_ok"] = bool((small == 7).all())
    check(driver.cuMemcpyDtoD(dy, dx, 64))
    check(driver.cuMemcpyDtoH(small.ctypes.data, dy, small.nbytes))
    out["dtod_ok"] = bool((small == 7).all())

    # unified addressing: cuMemcpy works out the direction from the pointers themselves
    check(driver.cuMemcpy(dy, small.ctypes.data, small.nbytes))  # host -> device
    check(driver.cuMemsetD32(dx, 5, 16))
    check(driver.cuMemcpy(int(dy) + small.nbytes, dx, small.nbytes))  # device -> device
    both = np.zeros(32, dtype=np.uint32)
    check(driver.cuMemcpy(both.ctypes.data, dy, both.nbytes))  # device -> host
    out["uva_ok"] = bool((both[:16] == 7).all() and (both[16:] == 5).all())

    # pointer attributes, a cooperative launch, and a PTX module JIT-compiled with options
    pattr = driver.CUpointer_attribute
    out["memory_type"] = int(check(driver.cuPointerGetAttribute(pattr.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dx)))
    out["ordinal"] = int(check(driver.cuPointerGetAttribute(pattr.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dx)))
    out["range_size"] = int(check(driver.cuPointerGetAttribute(pattr.CU_POINTER_ATTRIBUTE_RANGE_SIZE, dx)))
    m = 4096
    count = np.array([m], dtype=np.uint32)
    coop = np.array([a.ctypes.data, args[0].ctypes.data, args[1].ctypes.data, count.ctypes.data], dtype=np.uint64)
    check(driver.cuMemcpyHtoD(dx, x.ctypes.data, 4 * m))  # the memsets above changed the start of both
    check(driver.cuMemcpyHtoD(dy, y.ctypes.data, 4 * m))
    check(driver.cuLaunchCooperativeKernel(kernel, m // 256, 1, 1, 256, 1, 1, 0, stream, coop.ctypes.data))
    check(driver.cuStreamSynchronize(stream))
    part = np.empty(m, dtype=np.float32)
    check(driver.cuMemcpyDtoH(part.ctypes.data, dy, part.nbytes))
    out["cooperative_ok"] = bool(np.allclose(part, 2.5 * x[:m] + y[:m], rtol=1e-5, atol=1e-5))
    out["cooperative_sum"] = float(part.sum(dtype=np.float64))
    prog = check(nvrtc.nvrtcCreateProgram(SAXPY, b"saxpy.cu", 0, [], []))
    check(nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture=compute_{major}{minor}".encode()]))
    ptx = b" " * check(nvrtc.nvrtcGetPTXSize(prog))
    check(nvrtc.nvrtcGetPTX(prog, ptx))
    jit = driver.CUjit_option
    log = bytes(1024)  # cuda-python wants the log buffer itself
    options = [jit.CU_JIT_MAX_REGISTERS, jit.CU_JIT_INFO_LOG_BUFFER, jit.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES]
    jitted = check(driver.cuModuleLoadDataEx(ptx, len(options), options, [32, log, 1024]))
    check(driver.cuModuleGetFunction(jitted, b"saxpy"))
    out["jit_ok"] = True
    check(driver.cuModuleUnload(jitted))

    for handle in (start, stop):
        check(driver.cuEventDestroy(handle))
    check(driver.cuStreamDestroy(stream))
    check(driver.cuModuleUnload(module))
    check(driver.cuMemFree(dx))
    check(driver.cuMemFree(dy))
    check(driver.cuDevicePrimaryCtxRelease(dev))
    print("RESULT " + json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
