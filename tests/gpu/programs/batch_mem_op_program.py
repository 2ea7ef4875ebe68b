"""An ordinary cuda.bindings program (nothing Orion in it): batch memory operations (cuStreamBatchMemOp) and batch
memory-operation graph nodes. A batch of a 32-bit write, a 64-bit write, a 32-bit wait (GEQ, on a word set before,
so it does not block) and a 32-bit write after it runs on a stream, and the words are copied back. A graph built node
by node writes a value with a batch node (cuGraphAddBatchMemOpNode) and copies the word into page-locked host memory
(cuMemAllocHost) with a memcpy node after it; each launch is preceded by clearing the word, so each launch shows its
own write. The node's parameters are asked back (cuGraphBatchMemOpNodeGetParams), set on the graph's node
(cuGraphBatchMemOpNodeSetParams: what a new instantiation writes, while the executable graph made before keeps its
own) and on an executable graph's copy (cuGraphExecBatchMemOpNodeSetParams: the graph's node keeps its own). A stream
capture of cuStreamBatchMemOp makes a graph of one batch node, whose replay writes. The device attributes that say
whether stream memory operations are supported are reported, as are every graph's node count and node types (ints).
Prints one JSON line of results (`RESULT {...}`) that a native run and a forwarded run must agree on: values, never
handles or addresses (an operation's address is reported as its offset from the allocation).

Reading the parameters back: cuda-bindings' CUDA_BATCH_MEM_OP_NODE_PARAMS.paramArray lists only the operations set
on that object from Python, so on the struct cuGraphBatchMemOpNodeGetParams fills it reads [] (reported as
`param_array_attribute`); the operations are read where C puts them, at the struct's paramArray pointer (getPtr() +
16: `count` CUstreamBatchMemOpParams of 48 bytes each, each read as CUstreamBatchMemOpParams(_ptr=address)).

    python batch_mem_op_program.py           the installed cuda.bindings (a GPU, or Orion's native driver)
    python batch_mem_op_program.py --fake    the same logic over tests/fake_driver.FakeDriver, in this process
    python batch_mem_op_program.py --limits  also probe the count limit (0, 255 and 256 barriers) and flags 1, each
                                             answer with the next synchronize's (`limits`; not part of `ok`)

Without a CUDA driver it exits with a one-line message (status 1), not a traceback.
"""
import ctypes
import json
import os
import struct
import sys

WORDS = 64
BYTES = 4 * WORDS
OP_SIZE = 48  # sizeof(CUstreamBatchMemOpParams) (cuda.h: a union padded to six cuuint64_t)
WAIT_32, WRITE_32, FLUSH, WAIT_64, WRITE_64, BARRIER = 1, 2, 3, 4, 5, 6  # CUstreamBatchMemOpType
GEQ = 0  # CU_STREAM_WAIT_VALUE_GEQ
# the stream batch: offsets in the allocation and values
FIRST, WIDE, READY, AFTER = 0xC0DE0401, 0x1122334455667788, 0xC0DE0402, 0xC0DE0403
AT_FIRST, AT_WIDE, AT_READY, AT_AFTER = 0, 8, 24, 28
# the graph's batch node writes a u32 at AT_NODE: as added, as set on the graph's node, as set on the first exec
AT_NODE, ADDED, SET_ON_GRAPH, SET_ON_EXEC = 32, 0xC0DE0411, 0xC0DE0412, 0xC0DE0413
# the captured batch: a u32 and a u64
AT_CAPTURED, AT_CAPTURED_WIDE, CAPTURED, CAPTURED_WIDE = 48, 56, 0xC0DE0421, 0x0123456789ABCDEF
ATTRIBUTES = {"CAN_USE_STREAM_MEM_OPS_V1": 92, "CAN_USE_64_BIT_STREAM_MEM_OPS": 122,
              "CAN_USE_STREAM_WAIT_VALUE_NOR": 123, "CAN_FLUSH_REMOTE_WRITES": 98}


def check(result):
    err, *rest = result
    if int(err) != 0:
        raise SystemExit(f"CUDA error {err!r}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def page_locked(driver, size, keep):
    """The address of `size` bytes of page-locked host memory (cuMemAllocHost), and how to free it. The fake driver
    has no cuMemAllocHost (page-locked memory is the guest runtime's business, not the host driver's): there, a
    ctypes buffer registered with cuMemHostRegister."""
    if hasattr(driver, "cuMemAllocHost"):
        address = int(check(driver.cuMemAllocHost(size)))
        return address, lambda: check(driver.cuMemFreeHost(address))
    buffer = ctypes.create_string_buffer(size)
    keep.append(buffer)
    address = ctypes.addressof(buffer)
    check(driver.cuMemHostRegister(address, size, 0))
    return address, lambda: check(driver.cuMemHostUnregister(address))


def attribute(driver, name, number):
    """A CUdevice_attribute by its name (a driver whose enum lacks the name: by its number)."""
    found = getattr(driver.CUdevice_attribute, "CU_DEVICE_ATTRIBUTE_" + name, None)
    return found if found is not None else driver.CUdevice_attribute(number)


def op(driver, kind, address=0, value=0, flags=0):
    """A CUstreamBatchMemOpParams of operation `kind`: the union's tag and its member (waitValue, writeValue,
    memoryBarrier or flushRemoteWrites, whose own `operation` is the same field) filled in."""
    params = driver.CUstreamBatchMemOpParams()
    params.operation = driver.CUstreamBatchMemOpType(kind)
    if kind in (WAIT_32, WAIT_64, WRITE_32, WRITE_64):
        member = params.waitValue if kind in (WAIT_32, WAIT_64) else params.writeValue
        member.address = address
        if kind in (WAIT_32, WRITE_32):
            member.value = value
        else:
            member.value64 = value
    else:
        member = params.memoryBarrier if kind == BARRIER else params.flushRemoteWrites
    member.operation = driver.CUstreamBatchMemOpType(kind)
    member.flags = flags
    return params


def node_params(driver, ctx, ops):
    """A CUDA_BATCH_MEM_OP_NODE_PARAMS of `ops` (a list): cuda-bindings copies them into an array the object owns,
    and setting paramArray does not set count."""
    params = driver.CUDA_BATCH_MEM_OP_NODE_PARAMS()
    params.ctx, params.paramArray, params.count, params.flags = ctx, ops, len(ops), 0
    return params


def ops_of(driver, params, base):
    """The operations a CUDA_BATCH_MEM_OP_NODE_PARAMS filled by the driver points at, each [operation, its
    address's offset from `base`, value, flags] (a barrier or flush: [operation, None, None, flags]), read at the C
    struct (paramArray pointer at getPtr() + 16), not from cuda-bindings' paramArray attribute."""
    array = struct.unpack_from("<Q", ctypes.string_at(params.getPtr() + 16, 8))[0]
    found = []
    for i in range(int(params.count) if array else 0):
        item = driver.CUstreamBatchMemOpParams(_ptr=array + OP_SIZE * i)
        kind = int(item.operation)
        if kind in (WAIT_32, WAIT_64, WRITE_32, WRITE_64):
            member = item.waitValue if kind in (WAIT_32, WAIT_64) else item.writeValue
            value = int(member.value) if kind in (WAIT_32, WRITE_32) else int(member.value64)
            found.append([kind, int(member.address) - base, value, int(member.flags)])
        else:
            member = item.memoryBarrier if kind == BARRIER else item.flushRemoteWrites
            found.append([kind, None, None, int(member.flags)])
    return found


def asked(driver, node, base, ctx):
    """What cuGraphBatchMemOpNodeGetParams answers for `node`: its code, and on success the count, flags, whether
    the context is `ctx`, what cuda-bindings' paramArray attribute lists (its length) and the operations."""
    err, params = driver.cuGraphBatchMemOpNodeGetParams(node)
    if int(err) != 0:
        return {"error": int(err)}
    return {"error": 0, "count": int(params.count), "flags": int(params.flags),
            "ctx_is_ours": int(params.ctx or 0) == int(ctx), "param_array_attribute": len(params.paramArray or []),
            "ops": ops_of(driver, params, base)}


def copy_params(driver, src_device, dst_host, size):
    """A 1-D CUDA_MEMCPY3D of `size` bytes from device memory to host memory (an address)."""
    params = driver.CUDA_MEMCPY3D()
    kinds = driver.CUmemorytype
    params.srcMemoryType, params.srcDevice = kinds.CU_MEMORYTYPE_DEVICE, src_device
    params.dstMemoryType, params.dstHost = kinds.CU_MEMORYTYPE_HOST, dst_host
    params.WidthInBytes, params.Height, params.Depth = size, 1, 1
    return params


def shape(driver, graph):
    """A graph's node count, its nodes' types (ints, in cuGraphGetNodes' order, and sorted) and its edge count."""
    count = check(driver.cuGraphGetNodes(graph))[1]
    nodes = check(driver.cuGraphGetNodes(graph, count))[0] if count else []
    types = [int(check(driver.cuGraphNodeGetType(node))) for node in nodes[:count]]
    edges = check(driver.cuGraphGetEdges(graph))[3]
    return {"nodes": count, "types": types, "sorted_types": sorted(types), "edges": edges}


def nodes_of(driver, graph):
    count = check(driver.cuGraphGetNodes(graph))[1]
    return list(check(driver.cuGraphGetNodes(graph, count))[0][:count]) if count else []


def limits(driver, stream, keep):
    """Each probe's answer and the next synchronize's: 0, 255 and 256 barriers, one barrier with flags 1 (cuda.h:
    count "must be less than 256", flags "must be 0")."""
    barriers = [op(driver, BARRIER, flags=1) for _ in range(256)]  # CU_STREAM_MEMORY_BARRIER_TYPE_GPU
    keep.append(barriers)
    found = {}
    for name, count, ops, flags in (("count_0", 0, [], 0), ("count_255", 255, barriers[:255], 0),
                                    ("count_256", 256, barriers, 0), ("flags_1", 1, barriers[:1], 1)):
        (err,) = driver.cuStreamBatchMemOp(stream, count, ops, flags)
        (synced,) = driver.cuStreamSynchronize(stream)
        found[name] = [int(err), int(synced)]
    return found


def run(driver, probe_limits=False):
    out: dict = {}
    keep: list[object] = []  # what must outlive the run: every parameter object, a buffer
    check(driver.cuInit(0))
    dev = check(driver.cuDeviceGet(0))
    ctx = check(driver.cuDevicePrimaryCtxRetain(dev))
    check(driver.cuCtxSetCurrent(ctx))
    out["attributes"] = {name: int(check(driver.cuDeviceGetAttribute(attribute(driver, name, number), dev)))
                         for name, number in ATTRIBUTES.items()}
    stream = check(driver.cuStreamCreate(1))  # non-blocking
    memory = check(driver.cuMemAlloc(BYTES))
    base = int(memory)
    check(driver.cuMemsetD32(memory, 0, WORDS))
    host, free_host = page_locked(driver, BYTES, keep)
    words = (ctypes.c_uint32 * WORDS).from_address(host)

    def read(offset, size=4):
        cell = (ctypes.c_uint32 if size == 4 else ctypes.c_uint64)()
        check(driver.cuMemcpyDtoH(ctypes.addressof(cell), base + offset, size))
        return cell.value

    # (a) one batch on a stream: write32, write64, a wait32 GEQ on a word set before (it does not block), write32
    check(driver.cuMemsetD32(base + AT_READY, READY, 1))
    batch = [op(driver, WRITE_32, base + AT_FIRST, FIRST), op(driver, WRITE_64, base + AT_WIDE, WIDE),
             op(driver, WAIT_32, base + AT_READY, READY, GEQ), op(driver, WRITE_32, base + AT_AFTER, AFTER)]
    keep.append(batch)
    check(driver.cuStreamBatchMemOp(stream, len(batch), batch, 0))
    check(driver.cuStreamSynchronize(stream))
    out["stream_words"] = [read(AT_FIRST), read(AT_WIDE, 8), read(AT_READY), read(AT_AFTER)]

    # (b) a batch node writing ADDED, then a copy of its word into page-locked memory; launched twice
    seen = []

    def launch(graph_exec):
        """One launch, waited for: the device word and the page-locked words cleared first, so that what is seen
        is this launch's write, carried by this launch's copy."""
        ctypes.memset(host, 0, 16)
        check(driver.cuMemsetD32(base + AT_NODE, 0, 4))
        check(driver.cuGraphLaunch(graph_exec, stream))
        check(driver.cuStreamSynchronize(stream))
        seen.append(words[0])

    graph = check(driver.cuGraphCreate(0))
    added = node_params(driver, ctx, [op(driver, WRITE_32, base + AT_NODE, ADDED)])
    keep.append(added)
    node = check(driver.cuGraphAddBatchMemOpNode(graph, None, 0, added))
    check(driver.cuGraphAddMemcpyNode(graph, [node], 1, copy_params(driver, base + AT_NODE, host, 16), ctx))
    out["graph"] = shape(driver, graph)
    first_exec = check(driver.cuGraphInstantiate(graph, 0))
    for _ in range(2):
        launch(first_exec)
    out["launches"] = seen[:]

    # (c) the node's parameters asked back, set on the graph's node, set on an executable graph's copy
    out["get_params"] = asked(driver, node, base, ctx)
    on_graph = node_params(driver, ctx, [op(driver, WRITE_32, base + AT_NODE, SET_ON_GRAPH)])
    keep.append(on_graph)
    check(driver.cuGraphBatchMemOpNodeSetParams(node, on_graph))
    out["get_params_after_set"] = asked(driver, node, base, ctx)
    second_exec = check(driver.cuGraphInstantiate(graph, 0))
    before = len(seen)
    launch(second_exec)  # the new instantiation: SET_ON_GRAPH
    launch(first_exec)  # the executable graph made before the set keeps its own: ADDED
    on_exec = node_params(driver, ctx, [op(driver, WRITE_32, base + AT_NODE, SET_ON_EXEC)])
    keep.append(on_exec)
    check(driver.cuGraphExecBatchMemOpNodeSetParams(first_exec, node, on_exec))
    launch(first_exec)  # SET_ON_EXEC
    launch(second_exec)  # SET_ON_GRAPH still
    out["set_launches"] = seen[before:]
    out["get_params_after_exec_set"] = asked(driver, node, base, ctx)  # the graph's node keeps SET_ON_GRAPH

    # (d) a capture of cuStreamBatchMemOp: one batch node, written only when the graph runs
    capture_stream = check(driver.cuStreamCreate(1))
    check(driver.cuStreamBeginCapture(capture_stream, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
    captured_ops = [op(driver, WRITE_32, base + AT_CAPTURED, CAPTURED),
                    op(driver, WRITE_64, base + AT_CAPTURED_WIDE, CAPTURED_WIDE)]
    keep.append(captured_ops)
    check(driver.cuStreamBatchMemOp(capture_stream, len(captured_ops), captured_ops, 0))
    captured = check(driver.cuStreamEndCapture(capture_stream))
    out["before_replay"] = [read(AT_CAPTURED), read(AT_CAPTURED_WIDE, 8)]
    out["captured_graph"] = shape(driver, captured)
    captured_nodes = nodes_of(driver, captured)
    out["captured_get_params"] = asked(driver, captured_nodes[0], base, ctx) if captured_nodes else None
    captured_exec = check(driver.cuGraphInstantiate(captured, 0))
    check(driver.cuGraphLaunch(captured_exec, capture_stream))
    check(driver.cuStreamSynchronize(capture_stream))
    out["replayed"] = [read(AT_CAPTURED), read(AT_CAPTURED_WIDE, 8)]

    if probe_limits:
        out["limits"] = limits(driver, stream, keep)

    batch_type = int(driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_BATCH_MEM_OP)
    memcpy_type = int(driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMCPY)

    def written(which, value):
        """Whether GetParams answered one write32 of `value` at AT_NODE, with flags 0 and our context."""
        expected = {"error": 0, "count": 1, "flags": 0, "ctx_is_ours": True, "ops": [[WRITE_32, AT_NODE, value, 0]]}
        return all(which.get(key) == want for key, want in expected.items())

    out["ok"] = (out["attributes"]["CAN_USE_64_BIT_STREAM_MEM_OPS"] == 1  # (the deprecated _V1 reads 0 on an H200)
                 and out["stream_words"] == [FIRST, WIDE, READY, AFTER]
                 and out["graph"]["types"] == [batch_type, memcpy_type] and out["graph"]["edges"] == 1
                 and out["launches"] == [ADDED, ADDED]
                 and written(out["get_params"], ADDED) and written(out["get_params_after_set"], SET_ON_GRAPH)
                 and out["set_launches"] == [SET_ON_GRAPH, ADDED, SET_ON_EXEC, SET_ON_GRAPH]
                 and written(out["get_params_after_exec_set"], SET_ON_GRAPH)
                 and out["before_replay"] == [0, 0] and out["captured_graph"]["types"] == [batch_type]
                 and out["replayed"] == [CAPTURED, CAPTURED_WIDE])

    for made in (first_exec, second_exec, captured_exec):
        check(driver.cuGraphExecDestroy(made))
    for made in (graph, captured):
        check(driver.cuGraphDestroy(made))
    for made in (stream, capture_stream):
        check(driver.cuStreamDestroy(made))
    check(driver.cuMemFree(memory))
    free_host()
    check(driver.cuDevicePrimaryCtxRelease(dev))
    keep.clear()  # the parameter objects lived until their graphs were gone
    return out


def fake_driver():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
    from tests.fake_driver import FakeDriver
    return FakeDriver(devices=1)


def cuda_driver():
    """cuda.bindings.driver, once it found a CUDA driver: without one, a one-line exit instead of a traceback."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise SystemExit(f"batch_mem_op_program: cuda-bindings is not installed ({exc})") from None
    try:
        driver.cuInit(0)
    except RuntimeError as exc:  # no libcuda (cuda.pathfinder's DynamicLibNotFoundError)
        raise SystemExit(f"batch_mem_op_program: no CUDA driver here ({exc})") from None
    return driver


def main(argv):
    driver = fake_driver() if "--fake" in argv else cuda_driver()
    print("RESULT " + json.dumps(run(driver, probe_limits="--limits" in argv), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
