"""An ordinary cuda.bindings program (nothing Orion in it): stream callbacks (cuStreamAddCallback) and host functions
(cuLaunchHostFunc, and cuLaunchHostFunc_v2 in both sync modes where the driver has it) queued between async copies,
recording the order they ran in, the status each callback was given and the values the copies before them left in
page-locked memory (and a callback's write carried by the copies after it); stream attributes set and read back
(cuStreamSetAttribute, cuStreamGetAttribute, cuStreamCopyAttributes); and the largest cluster two NVRTC kernels can
be launched with (cuOccupancyMaxPotentialClusterSize), one of them compiled with a required cluster size. Prints one
JSON line of results, so the same program can be run natively and forwarded and the two outputs compared."""
import ctypes
import json
import sys

from cuda.bindings import driver, nvrtc

KERNELS = rb"""
extern "C" __global__ void scale(float *x, float a, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
extern "C" __global__ void __cluster_dims__(2, 1, 1) paired(float *x, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
"""
N = 256  # words of page-locked memory the stream's copies fill
MARK_A, MARK_B = 0xC0DE0001, 0xC0DE0002
CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)  # CUstreamCallback
HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # CUhostFn


def check(result):
    err, *rest = result
    if int(err) != 0:
        raise SystemExit(f"CUDA error {err!r}")
    return rest[0] if len(rest) == 1 else tuple(rest) if rest else None


def ptx_of(major, minor):
    prog = check(nvrtc.nvrtcCreateProgram(KERNELS, b"kernels.cu", 0, [], []))
    opts = [f"--gpu-architecture=compute_{major}{minor}".encode()]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if int(err) != 0:
        size = check(nvrtc.nvrtcGetProgramLogSize(prog))
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise SystemExit(log.decode())
    ptx = b" " * check(nvrtc.nvrtcGetPTXSize(prog))
    check(nvrtc.nvrtcGetPTX(prog, ptx))
    return ptx


def callbacks(out, version):
    """Callbacks and host functions between copies on a non-blocking stream and on the NULL stream."""
    host = check(driver.cuMemAllocHost(4 * N))
    words = (ctypes.c_uint32 * N).from_address(int(host))
    memory = check(driver.cuMemAlloc(8 * N))
    stream = check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING.value))
    order = []

    def on_callback(hstream, status, data):  # what the copies before it left; a word the copies after it carry
        order.append(["callback", data, status, words[0], words[1], (hstream or 0) == int(stream)])
        words[2] = 1000 + data

    def on_host(data):
        order.append(["host", data, words[0]])
        words[3] = 2000 + data

    kept = [CALLBACK(on_callback), HOST_FN(on_host)]
    callback = driver.CUstreamCallback(ctypes.cast(kept[0], ctypes.c_void_p).value)
    host_fn = driver.CUhostFn(ctypes.cast(kept[1], ctypes.c_void_p).value)
    v2 = version >= 13020  # cuLaunchHostFunc_v2 came with CUDA 13.2

    check(driver.cuMemsetD32Async(memory, MARK_A, N, stream))
    check(driver.cuMemcpyDtoHAsync(host, memory, 4 * N, stream))
    check(driver.cuStreamAddCallback(stream, callback, 1, 0))  # sees MARK_A; writes words[2] = 1001
    check(driver.cuMemcpyHtoDAsync(int(memory) + 4 * N, int(host) + 8, 4, stream))  # carries 1001
    check(driver.cuLaunchHostFunc(stream, host_fn, 2))
    check(driver.cuMemsetD32Async(memory, MARK_B, 2, stream))
    check(driver.cuMemcpyDtoHAsync(host, memory, 8, stream))
    if v2:
        modes = driver.CUhostTaskSyncMode
        check(driver.cuLaunchHostFunc_v2(stream, host_fn, 3, modes.CU_HOST_TASK_BLOCKING.value))
        check(driver.cuLaunchHostFunc_v2(stream, host_fn, 4, modes.CU_HOST_TASK_SPINWAIT.value))
    check(driver.cuStreamAddCallback(stream, callback, 5, 0))  # sees MARK_B
    check(driver.cuMemcpyDtoHAsync(int(host) + 16, int(memory) + 4 * N, 4, stream))  # the 1001 carried back
    check(driver.cuStreamSynchronize(stream))
    out["carried"] = words[4]
    out["last_host_write"] = words[3]
    check(driver.cuStreamAddCallback(driver.CUstream(0), callback, 6, 0))  # the NULL stream
    check(driver.cuCtxSynchronize())
    out["order"] = list(order)  # (a callback the driver took with flags 1 would run after this)
    out["bad_flags"] = int(driver.cuStreamAddCallback(stream, callback, 7, 1)[0])
    out["v2"] = v2
    check(driver.cuStreamDestroy(stream))
    check(driver.cuMemFree(memory))
    check(driver.cuMemFreeHost(host))


def attributes(out):
    """Each attribute cuda.h marks valid for streams, as created, then set and read back, then copied."""
    ids, memory = driver.CUstreamAttrID, check(driver.cuMemAlloc(1 << 16))
    least, greatest = check(driver.cuCtxGetStreamPriorityRange())
    stream = check(driver.cuStreamCreateWithPriority(driver.CUstream_flags.CU_STREAM_NON_BLOCKING.value, greatest))
    other = check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING.value))

    def read(s):
        # the policy as its raw int: a fresh stream's is 0xFFFFFFFF natively (measured on the H200), which
        # cuda-bindings' enum getter refuses
        value = check(driver.cuStreamGetAttribute(s, ids.CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY))
        policy = ctypes.c_uint32.from_address(int(value.getPtr())).value
        domain = check(driver.cuStreamGetAttribute(s, ids.CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN)).memSyncDomain
        mapped = check(driver.cuStreamGetAttribute(s, ids.CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP)).memSyncDomainMap
        window = check(driver.cuStreamGetAttribute(s, ids.CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW)).accessPolicyWindow
        priority = check(driver.cuStreamGetAttribute(s, ids.CU_LAUNCH_ATTRIBUTE_PRIORITY)).priority
        return {"policy": int(policy), "domain": int(domain), "map": [mapped.default_, mapped.remote],
                "window": [int(window.base_ptr) == int(memory), int(window.num_bytes), round(window.hitRatio, 3),
                           int(window.hitProp), int(window.missProp)],
                "priority": priority, "stream_priority": check(driver.cuStreamGetPriority(s))}

    out["created"] = read(stream)
    value = driver.CUstreamAttrValue()
    value.syncPolicy = driver.CUsynchronizationPolicy.CU_SYNC_POLICY_BLOCKING_SYNC
    check(driver.cuStreamSetAttribute(stream, ids.CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, value))
    value = driver.CUstreamAttrValue()
    value.memSyncDomain = driver.CUlaunchMemSyncDomain.CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE
    check(driver.cuStreamSetAttribute(stream, ids.CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, value))
    value = driver.CUstreamAttrValue()
    value.accessPolicyWindow.base_ptr = int(memory)
    value.accessPolicyWindow.num_bytes = 4096
    value.accessPolicyWindow.hitRatio = 0.5
    value.accessPolicyWindow.hitProp = driver.CUaccessProperty.CU_ACCESS_PROPERTY_PERSISTING
    value.accessPolicyWindow.missProp = driver.CUaccessProperty.CU_ACCESS_PROPERTY_STREAMING
    check(driver.cuStreamSetAttribute(stream, ids.CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, value))
    value = driver.CUstreamAttrValue()
    value.priority = least
    out["set_priority"] = int(driver.cuStreamSetAttribute(stream, ids.CU_LAUNCH_ATTRIBUTE_PRIORITY, value)[0])
    out["set"] = read(stream)
    out["copied_status"] = int(driver.cuStreamCopyAttributes(other, stream)[0])
    out["copied"] = read(other)
    out["not_a_streams"] = int(driver.cuStreamGetAttribute(stream, ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE)[0])
    check(driver.cuStreamDestroy(other))
    check(driver.cuStreamDestroy(stream))
    check(driver.cuMemFree(memory))


def clusters(out, major, minor):
    """The largest cluster of a kernel without a required size (portable, then non-portable sizes allowed) and of
    one compiled with __cluster_dims__(2, 1, 1); and the active clusters of that size."""
    if major < 9:
        out["clusters"] = "no thread block clusters before compute capability 9.0"
        return
    module = check(driver.cuModuleLoadData(ptx_of(major, minor)))
    scale, paired = (check(driver.cuModuleGetFunction(module, name)) for name in (b"scale", b"paired"))
    stream = check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING.value))
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = 64, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = 128, 1, 1
    config.sharedMemBytes, config.hStream, config.numAttrs, config.attrs = 0, stream, 0, []
    out["portable"] = check(driver.cuOccupancyMaxPotentialClusterSize(scale, config))
    out["required"] = check(driver.cuOccupancyMaxPotentialClusterSize(paired, config))
    allowed = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
    out["allow_non_portable"] = int(driver.cuFuncSetAttribute(scale, allowed, 1)[0])
    out["non_portable"] = check(driver.cuOccupancyMaxPotentialClusterSize(scale, config))
    attribute = driver.CUlaunchAttribute()
    attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attribute.value.clusterDim.x, attribute.value.clusterDim.y, attribute.value.clusterDim.z = out["portable"], 1, 1
    config.numAttrs, config.attrs = 1, [attribute]
    out["ignores_cluster_dims"] = check(driver.cuOccupancyMaxPotentialClusterSize(scale, config))
    err, active = driver.cuOccupancyMaxActiveClusters(scale, config)
    out["active_clusters"] = [int(err), active if int(err) == 0 else None]
    check(driver.cuStreamDestroy(stream))
    check(driver.cuModuleUnload(module))


def main():
    out: dict[str, object] = {}
    check(driver.cuInit(0))
    version = check(driver.cuDriverGetVersion())
    dev = check(driver.cuDeviceGet(0))
    attr = driver.CUdevice_attribute
    major = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = check(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    ctx = check(driver.cuDevicePrimaryCtxRetain(dev))
    check(driver.cuCtxSetCurrent(ctx))
    callbacks(out, version)
    attributes(out)
    clusters(out, major, minor)
    check(driver.cuDevicePrimaryCtxRelease(dev))
    print("RESULT " + json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
