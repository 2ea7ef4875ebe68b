"""An ordinary cuda.bindings program (nothing Orion in it): page-locked host memory (copies, async copies, a kernel
reading mapped host memory through the host pointer), contexts on several threads, cuGetProcAddress and occupancy
queries. Prints one JSON line, so native and forwarded runs can be compared."""
import ctypes
import json
import sys
import threading

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


def compile_kernel(major, minor):
    prog = check(nvrtc.nvrtcCreateProgram(SAXPY, b"saxpy.cu", 0, [], []))
    check(nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture=sm_{major}{minor}".encode()]))
    cubin = b" " * check(nvrtc.nvrtcGetCUBINSize(prog))
    check(nvrtc.nvrtcGetCUBIN(prog, cubin))
    module = check(driver.cuModuleLoadData(cubin))
    return module, check(driver.cuModuleGetFunction(module, b"saxpy"))


def floats(address, count):
    return np.ctypeslib.as_array((ctypes.c_float * count).from_address(int(address)))


def launch(kernel, stream, a, x, y, n):
    values = (np.array([a], dtype=np.float32), np.array([int(x)], dtype=np.uint64),
              np.array([int(y)], dtype=np.uint64), np.array([n], dtype=np.uint32))
    params = np.array([v.ctypes.data for v in values], dtype=np.uint64)
    check(driver.cuLaunchKernel(kernel, (n + 255) // 256, 1, 1, 256, 1, 1, 0, stream, params.ctypes.data, 0))


def page_locked(out, kernel, stream):
    n = 1 << 20
    rng = np.random.default_rng(11)
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    host_x = check(driver.cuMemAllocHost(4 * n))
    host_y = check(driver.cuMemHostAlloc(4 * n, driver.CU_MEMHOSTALLOC_DEVICEMAP))
    floats(host_x, n)[:] = x
    dx, dy = check(driver.cuMemAlloc(4 * n)), check(driver.cuMemAlloc(4 * n))
    check(driver.cuMemcpyHtoD(dx, host_x, 4 * n))
    floats(host_y, n)[:] = y
    check(driver.cuMemcpyHtoDAsync(dy, host_y, 4 * n, stream))
    launch(kernel, stream, 2.0, dx, dy, n)
    floats(host_y, n)[:] = 0
    check(driver.cuMemcpyDtoHAsync(host_y, dy, 4 * n, stream))
    check(driver.cuStreamSynchronize(stream))
    out["pinned_copies_ok"] = bool(np.allclose(floats(host_y, n), 2.0 * x + y, rtol=1e-5, atol=1e-5))
    out["pinned_copies_sum"] = float(floats(host_y, n).sum(dtype=np.float64))

    # A kernel reading page-locked host memory through the pointer the host allocation gave (unified addressing).
    # Where page-locked memory has no device pointer (a relayed session: CUDA_ERROR_NOT_SUPPORTED, docs/remote.md)
    # that status is the result, and no kernel is handed the host's pages.
    err, device_y = driver.cuMemHostGetDevicePointer(host_y, 0)
    out["device_pointer_status"] = int(err)
    if int(err) == 0:
        out["device_pointer_is_host_pointer"] = int(device_y) == int(host_y)
        check(driver.cuMemcpyHtoD(dy, y.ctypes.data, 4 * n))
        launch(kernel, stream, 3.0, host_x, dy, n)  # x read from the host's pages by the GPU
        check(driver.cuStreamSynchronize(stream))
        result = np.empty(n, dtype=np.float32)
        check(driver.cuMemcpyDtoH(result.ctypes.data, dy, 4 * n))
        out["mapped_read_ok"] = bool(np.allclose(result, 3.0 * x + y, rtol=1e-5, atol=1e-5))
        out["mapped_read_sum"] = float(result.sum(dtype=np.float64))
    out["host_alloc_flags"] = int(check(driver.cuMemHostGetFlags(host_y)))
    # [status, value] of page-locked memory's pointer attributes: a path that cannot answer one says which
    memory_type = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    err, value = driver.cuPointerGetAttribute(memory_type, host_x)
    out["pinned_memory_type"] = [int(err), int(value) if int(err) == 0 else None]
    host_pointer = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_HOST_POINTER
    err, value = driver.cuPointerGetAttribute(host_pointer, host_x + 64)
    out["pinned_host_pointer"] = [int(err), int(err) == 0 and int(value) == int(host_x) + 64]
    for pointer in (host_x, host_y):
        check(driver.cuMemFreeHost(pointer))
    out["free_twice"] = int(driver.cuMemFreeHost(host_x)[0]) != 0
    for pointer in (dx, dy):
        check(driver.cuMemFree(pointer))


def threads(out, primary, dev):
    found = {}

    def without_context():
        found["thread_current"] = int(check(driver.cuCtxGetCurrent()))
        found["thread_alloc_without_context"] = int(driver.cuMemAlloc(64)[0])  # CUDA_ERROR_INVALID_CONTEXT
        check(driver.cuCtxSetCurrent(primary))
        pointer = check(driver.cuMemAlloc(64))
        found["thread_alloc_with_context"] = True
        check(driver.cuMemFree(pointer))
    worker = threading.Thread(target=without_context)
    worker.start()
    worker.join()
    out.update(found)
    out["main_still_current"] = int(check(driver.cuCtxGetCurrent())) == int(primary)
    created = check(driver.cuCtxCreate(None, 0, dev))
    out["created_is_current"] = int(check(driver.cuCtxGetCurrent())) == int(created)
    out["popped_created"] = int(check(driver.cuCtxPopCurrent())) == int(created)
    out["primary_again"] = int(check(driver.cuCtxGetCurrent())) == int(primary)
    check(driver.cuCtxPushCurrent(created))
    check(driver.cuCtxDestroy(created))
    out["primary_after_destroy"] = int(check(driver.cuCtxGetCurrent())) == int(primary)


def proc_address_and_occupancy(out, kernel):
    pfn, status = check(driver.cuGetProcAddress(b"cuDriverGetVersion", 12000, 0))
    version = ctypes.c_int(0)
    err = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))(int(pfn))(ctypes.byref(version))
    out["proc_address_ok"] = err == 0 and version.value == check(driver.cuDriverGetVersion()) and int(status) == 0
    out["proc_address_unknown"] = int(driver.cuGetProcAddress(b"cuNoSuchFunction", 12000, 0)[0])
    out["potential"] = [int(v) for v in check(driver.cuOccupancyMaxPotentialBlockSize(kernel, None, 0, 0))]

    @ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_int)
    def shared_per_block(block):
        return 16 * block  # 16 bytes of dynamic shared memory per thread

    callback = driver.CUoccupancyB2DSize(ctypes.cast(shared_per_block, ctypes.c_void_p).value)
    out["potential_callback"] = [int(v) for v in check(driver.cuOccupancyMaxPotentialBlockSize(kernel, callback,
                                                                                               0, 768))]
    out["active_blocks"] = int(check(driver.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(kernel, 128, 0, 0)))
    out["dynamic_smem"] = int(check(driver.cuOccupancyAvailableDynamicSMemPerBlock(kernel, 4, 128)))


def launch_attributes_and_library(out, kernel, stream, major, minor):
    """cuLaunchKernelEx with COOPERATIVE and PRIORITY attributes; a library JIT-compiled from PTX with options."""
    n = 4096
    x = np.arange(n, dtype=np.float32)
    dx, dy = check(driver.cuMemAlloc(4 * n)), check(driver.cuMemAlloc(4 * n))
    check(driver.cuMemcpyHtoD(dx, x.ctypes.data, 4 * n))
    check(driver.cuMemsetD32(dy, 0, n))
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = n // 256, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = 256, 1, 1
    config.hStream = stream
    cooperative, priority = driver.CUlaunchAttribute(), driver.CUlaunchAttribute()
    cooperative.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
    cooperative.value.cooperative = 1
    priority.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PRIORITY
    priority.value.priority = 0
    config.attrs = [cooperative, priority]
    config.numAttrs = 2
    values = (np.array([4.0], dtype=np.float32), np.array([int(dx)], dtype=np.uint64),
              np.array([int(dy)], dtype=np.uint64), np.array([n], dtype=np.uint32))
    params = np.array([v.ctypes.data for v in values], dtype=np.uint64)
    check(driver.cuLaunchKernelEx(config, kernel, params.ctypes.data, 0))
    check(driver.cuStreamSynchronize(stream))
    result = np.empty(n, dtype=np.float32)
    check(driver.cuMemcpyDtoH(result.ctypes.data, dy, 4 * n))
    out["launch_attributes_ok"] = bool(np.allclose(result, 4.0 * x))
    out["launch_attributes_sum"] = float(result.sum(dtype=np.float64))
    for pointer in (dx, dy):
        check(driver.cuMemFree(pointer))

    prog = check(nvrtc.nvrtcCreateProgram(SAXPY, b"saxpy.cu", 0, [], []))
    check(nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture=compute_{major}{minor}".encode()]))
    ptx = b" " * check(nvrtc.nvrtcGetPTXSize(prog))
    check(nvrtc.nvrtcGetPTX(prog, ptx))
    jit = driver.CUjit_option
    library = check(driver.cuLibraryLoadData(ptx, [jit.CU_JIT_MAX_REGISTERS], [32], 1, None, None, 0))
    function = check(driver.cuKernelGetFunction(check(driver.cuLibraryGetKernel(library, b"saxpy"))))
    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS
    out["library_jit_registers_ok"] = 0 < check(driver.cuFuncGetAttribute(attribute, function)) <= 32
    check(driver.cuLibraryUnload(library))


def main():
    out = {}
    check(driver.cuInit(0))
    dev = check(driver.cuDeviceGet(0))
    attr = driver.CUdevice_attribute
    major = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    primary = check(driver.cuDevicePrimaryCtxRetain(dev))
    check(driver.cuCtxSetCurrent(primary))
    stream = check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))
    module, kernel = compile_kernel(major, minor)
    page_locked(out, kernel, stream)
    threads(out, primary, dev)
    proc_address_and_occupancy(out, kernel)
    launch_attributes_and_library(out, kernel, stream, major, minor)
    check(driver.cuStreamDestroy(stream))
    check(driver.cuModuleUnload(module))
    print("RESULT " + json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
