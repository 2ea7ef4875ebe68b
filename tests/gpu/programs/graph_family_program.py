"""An ordinary cuda.bindings program (nothing Orion in it) using the CUDA graph calls of Orion's graph family, second
part: a graph built node by node with a memory allocation node (its memory set, added to and copied out before a
free node), every node's parameters asked back (the kernel node's values read through the kernelParams the driver
hands back), a kernel node attribute (a priority) set and read back, cuGraphInstantiateWithParams with an upload,
launches, the graph memory attributes, a capture into a given graph after a node of its own whose dependency set is
changed during the capture, and cuGraphDebugDotPrint. Prints one JSON line of results (`RESULT {...}`) that a native
run and a forwarded run (the native guest driver) must agree on: values, never handles or addresses.

    python graph_family_program.py          the installed cuda.bindings (a GPU, or Orion's native driver)
    python graph_family_program.py --fake   the same logic over tests/fake_driver.FakeDriver, in this process

The kernel is PTX (JIT-compiled by the driver): `orion_fake_add_u32(words, count, value)` adds `value` to `count` u32
words, the kernel the fake driver also runs.
"""
import ctypes
import json
import os
import sys
import tempfile

ADD_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry orion_fake_add_u32(.param .u64 words, .param .u32 count, .param .u32 value)
{
    .reg .pred %p;
    .reg .b32 %r<6>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [words];
    ld.param.u32 %r1, [count];
    ld.param.u32 %r2, [value];
    mov.u32 %r3, %tid.x;
    setp.ge.u32 %p, %r3, %r1;
    @%p bra DONE;
    mul.wide.u32 %rd2, %r3, 4;
    add.s64 %rd3, %rd1, %rd2;
    ld.volatile.u32 %r4, [%rd3];
    add.u32 %r5, %r4, %r2;
    st.volatile.u32 [%rd3], %r5;
DONE:
    ret;
}
\0"""
WORDS = 64
BYTES = 4 * WORDS
PRIORITY, COOPERATIVE = 8, 2  # CUlaunchAttributeID


def check(result):
    err, *rest = result
    if int(err) != 0:
        raise SystemExit(f"CUDA error {err!r}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def generic_params(driver, nodes, free, where):
    """cuGraphNodeGetParams (CUDA 13.1's): absent from driver 580 (CUDA 13.0, measured on the H200: cuda-bindings
    finds no such function natively, and the native guest driver's host answers 801), so "absent" either way."""
    try:
        result = driver.cuGraphNodeGetParams(free)
    except RuntimeError:  # natively: the driver has no such entry point
        return "absent"
    if int(result[0]) == 801:  # forwarded: the host's driver has none
        return "absent"
    return {"types": {name: int(check(driver.cuGraphNodeGetParams(node)).type) for name, node in nodes.items()},
            "free": where(check(result).free.dptr)}


def read(driver, pointer):
    cells = (ctypes.c_uint32 * WORDS)()
    check(driver.cuMemcpyDtoH(ctypes.addressof(cells), pointer, BYTES))
    return list(cells)


def kernel_params(driver, function, words, value, keep):
    """CUDA_KERNEL_NODE_PARAMS of orion_fake_add_u32(words, WORDS, value), its kernelParams a C array of pointers."""
    cells = (ctypes.c_uint64(int(words)), ctypes.c_uint32(WORDS), ctypes.c_uint32(value))
    pointers = (ctypes.c_void_p * 3)(*[ctypes.addressof(c) for c in cells])
    keep.append((cells, pointers))
    params = driver.CUDA_KERNEL_NODE_PARAMS()
    params.func = function
    params.gridDimX = params.gridDimY = params.gridDimZ = 1
    params.blockDimX, params.blockDimY, params.blockDimZ = WORDS, 1, 1
    params.sharedMemBytes = 0
    params.kernelParams = ctypes.addressof(pointers)
    return params


def memset_params(driver, dst, value):
    params = driver.CUDA_MEMSET_NODE_PARAMS()
    params.dst, params.pitch, params.value, params.elementSize, params.width, params.height = dst, 0, value, 4, WORDS, 1
    return params


def copy_params(driver, dst, src):
    params = driver.CUDA_MEMCPY3D()
    device = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
    params.srcMemoryType, params.srcDevice = device, src
    params.dstMemoryType, params.dstDevice = device, dst
    params.WidthInBytes, params.Height, params.Depth = BYTES, 1, 1
    return params


def access_descs(params):
    """An allocation node's access descriptors as (location type, id, flags): read from the array the driver's
    struct points at (cuda-bindings' accessDescs getter answers only what Python set), or the fake's list."""
    if not hasattr(params, "getPtr"):
        given = params.accessDescs[:params.accessDescCount]
        return [[int(d.location.type), d.location.id, int(d.flags)] for d in given]
    base = int(params.getPtr())
    array, count = ctypes.c_uint64.from_address(base + 88).value, ctypes.c_uint64.from_address(base + 96).value
    return [list((ctypes.c_int * 3).from_address(array + 12 * i)) for i in range(count)] if array else []


def run(driver):
    out = {}
    keep = []
    check(driver.cuInit(0))
    dev = check(driver.cuDeviceGet(0))
    ctx = check(driver.cuDevicePrimaryCtxRetain(dev))
    check(driver.cuCtxSetCurrent(ctx))
    module = check(driver.cuModuleLoadData(ADD_PTX))
    function = check(driver.cuModuleGetFunction(module, b"orion_fake_add_u32"))
    stream = check(driver.cuStreamCreate(1))  # non-blocking
    buffers = {name: check(driver.cuMemAlloc(BYTES)) for name in ("a", "b", "c")}
    for pointer in buffers.values():
        check(driver.cuMemsetD32(pointer, 0, WORDS))
    places = {int(pointer): name for name, pointer in buffers.items()}

    def where(address):
        return places.get(int(address), "elsewhere")

    # a graph with a memory allocation node
    graph = check(driver.cuGraphCreate(0))
    memset = check(driver.cuGraphAddMemsetNode(graph, None, 0, memset_params(driver, buffers["a"], 1), ctx))
    add = check(driver.cuGraphAddKernelNode(graph, [memset], 1, kernel_params(driver, function, buffers["a"], 4,
                                                                                keep)))
    copy = check(driver.cuGraphAddMemcpyNode(graph, [add], 1, copy_params(driver, buffers["b"], buffers["a"]), ctx))
    alloc_params = driver.CUDA_MEM_ALLOC_NODE_PARAMS()
    props = alloc_params.poolProps
    props.allocType = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = 0
    desc = driver.CUmemAccessDesc()
    desc.location.type, desc.location.id = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE, 0
    desc.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    alloc_params.accessDescs, alloc_params.accessDescCount, alloc_params.bytesize = [desc], 1, BYTES
    alloc = check(driver.cuGraphAddMemAllocNode(graph, None, 0, alloc_params))
    dptr = int(alloc_params.dptr)
    places[dptr] = "alloc"
    fill = check(driver.cuGraphAddMemsetNode(graph, [alloc], 1, memset_params(driver, dptr, 2), ctx))
    bump = check(driver.cuGraphAddKernelNode(graph, [fill], 1, kernel_params(driver, function, dptr, 3, keep)))
    out_copy = check(driver.cuGraphAddMemcpyNode(graph, [bump], 1, copy_params(driver, buffers["c"], dptr), ctx))
    free = check(driver.cuGraphAddMemFreeNode(graph, [out_copy], 1, dptr))
    nodes = {"memset": memset, "add": add, "copy": copy, "alloc": alloc, "fill": fill, "bump": bump,
             "out_copy": out_copy, "free": free}

    # parameters asked back
    asked = check(driver.cuGraphKernelNodeGetParams(add))
    pointers = (ctypes.c_void_p * 3).from_address(int(asked.kernelParams))
    out["kernel_params"] = [int(asked.func) == int(function), [asked.gridDimX, asked.blockDimX],
                            where(ctypes.c_uint64.from_address(pointers[0]).value),
                            ctypes.c_uint32.from_address(pointers[1]).value,
                            ctypes.c_uint32.from_address(pointers[2]).value, int(asked.extra or 0) == 0]
    set_back = check(driver.cuGraphKernelNodeGetParams(bump))
    check(driver.cuGraphKernelNodeSetParams(bump, set_back))  # the values asked back are valid parameters
    filled = check(driver.cuGraphMemsetNodeGetParams(fill))
    out["memset_params"] = [where(filled.dst), filled.value, filled.elementSize, filled.width, filled.height]
    copied = check(driver.cuGraphMemcpyNodeGetParams(out_copy))
    out["memcpy_params"] = [int(copied.srcMemoryType), where(copied.srcDevice), int(copied.dstMemoryType),
                            where(copied.dstDevice), copied.WidthInBytes, copied.Height, copied.Depth]
    allocated = check(driver.cuGraphMemAllocNodeGetParams(alloc))
    out["alloc_params"] = [int(allocated.poolProps.allocType), int(allocated.poolProps.location.type),
                           allocated.poolProps.location.id, allocated.bytesize, int(allocated.dptr) == dptr,
                           access_descs(allocated)]
    out["generic_params"] = generic_params(driver, nodes, free, where)

    # a kernel node attribute
    value = driver.CUkernelNodeAttrValue()
    ctypes.c_int.from_address(int(value.getPtr())).value = 1
    check(driver.cuGraphKernelNodeSetAttribute(add, driver.CUkernelNodeAttrID(PRIORITY), value))
    read_back = check(driver.cuGraphKernelNodeGetAttribute(add, driver.CUkernelNodeAttrID(PRIORITY)))
    out["priority"] = ctypes.c_int.from_address(int(read_back.getPtr())).value
    never = check(driver.cuGraphKernelNodeGetAttribute(add, driver.CUkernelNodeAttrID(COOPERATIVE)))
    out["cooperative"] = ctypes.c_int.from_address(int(never.getPtr())).value

    # instantiated with parameters, uploaded, launched twice
    params = driver.CUDA_GRAPH_INSTANTIATE_PARAMS()
    params.flags = int(driver.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)
    params.hUploadStream = stream
    graph_exec = check(driver.cuGraphInstantiateWithParams(graph, params))
    out["instantiate_result"] = [int(params.result_out), int(params.hErrNode_out or 0) == 0]
    for _ in range(2):
        check(driver.cuGraphLaunch(graph_exec, stream))
    check(driver.cuStreamSynchronize(stream))
    out["memory"] = {name: read(driver, pointer) for name, pointer in buffers.items()}
    mem = driver.CUgraphMem_attribute
    used = int(check(driver.cuDeviceGetGraphMemAttribute(dev, mem.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)))
    reserved = int(check(driver.cuDeviceGetGraphMemAttribute(dev, mem.CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)))
    out["graph_memory_high_covers_the_allocation"] = [used >= BYTES, reserved >= BYTES]
    check(driver.cuDeviceSetGraphMemAttribute(dev, mem.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, driver.cuuint64_t(0)))

    # a capture into a given graph, after a node of its own, its dependency set changed during the capture
    second = check(driver.cuGraphCreate(0))
    root = check(driver.cuGraphAddEmptyNode(second, None, 0))
    global_mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
    check(driver.cuStreamBeginCaptureToGraph(stream, second, [root], None, 1, global_mode))
    check(driver.cuMemsetD32Async(buffers["a"], 20, WORDS, stream))
    check(driver.cuStreamUpdateCaptureDependencies(stream, [root], None, 1, 0))  # ADD: {memset, root}
    check(driver.cuMemsetD32Async(buffers["b"], 21, WORDS, stream))
    check(driver.cuStreamUpdateCaptureDependencies(stream, [root], None, 1, 1))  # SET: {root}
    check(driver.cuMemsetD32Async(buffers["c"], 22, WORDS, stream))
    ended = check(driver.cuStreamEndCapture(stream))
    out["captured_into_the_same_graph"] = int(ended) == int(second)
    out["captured_nodes"] = check(driver.cuGraphGetNodes(second))[1]
    out["captured_edges"] = check(driver.cuGraphGetEdges(second))[3]
    second_exec = check(driver.cuGraphInstantiate(second, 0))
    check(driver.cuGraphLaunch(second_exec, stream))
    check(driver.cuStreamSynchronize(stream))
    out["captured_memory"] = {name: read(driver, pointer)[0] for name, pointer in buffers.items()}

    # the DOT description, written where this program says
    where_dot = tempfile.mkdtemp(prefix="graph-family-")
    path = os.path.join(where_dot, "graph.dot")
    check(driver.cuGraphDebugDotPrint(second, path.encode(), 1))
    with open(path, encoding="utf-8", errors="replace") as text:
        out["dot_is_a_digraph"] = text.read().lstrip().startswith("digraph")
    os.remove(path)
    os.rmdir(where_dot)

    for made in (graph_exec, second_exec):
        check(driver.cuGraphExecDestroy(made))
    for made in (graph, second):
        check(driver.cuGraphDestroy(made))
    check(driver.cuStreamDestroy(stream))
    for pointer in buffers.values():
        check(driver.cuMemFree(pointer))
    check(driver.cuModuleUnload(module))
    check(driver.cuDevicePrimaryCtxRelease(dev))
    return out


def main(argv):
    if "--fake" in argv:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
        from tests.fake_driver import FakeDriver
        driver = FakeDriver(devices=1)
    else:
        from cuda.bindings import driver
    print("RESULT " + json.dumps(run(driver), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
