"""An ordinary cuda.bindings program (nothing Orion in it): host functions in CUDA graphs. A graph built node by node
runs a host node (cuGraphAddHostNode, a ctypes callback) after a memset node and a copy of its memory into page-locked
host memory (cuMemAllocHost), and before a copy back of a word the callback wrote: launched three times, the callback
runs three times, each time seeing the memset's value already copied, and the copy after it carries its write. The
host node's parameters are asked back (cuGraphHostNodeGetParams), set on the graph's node (cuGraphHostNodeSetParams:
what a new instantiation calls, while the executable graph made before keeps its own) and on an executable graph's
copy (cuGraphExecHostNodeSetParams: the graph's node keeps its own). A stream capture of cuLaunchHostFunc between two
memsets makes a graph with a host node, whose two replays call the function twice. Every graph's node count and node
types (cuGraphGetNodes, cuGraphNodeGetType, as ints) are reported. Prints one JSON line of results (`RESULT {...}`)
that a native run and a forwarded run must agree on: values, never handles or addresses (a function's address is
reported only as whether it is the one given).

    python host_node_program.py          the installed cuda.bindings (a GPU, or Orion's native driver)
    python host_node_program.py --fake   the same logic over tests/fake_driver.FakeDriver, in this process

Without a CUDA driver it exits with a one-line message (status 1), not a traceback.
"""
import ctypes
import json
import os
import sys

WORDS = 64
BYTES = 4 * WORDS
MARK = 0xC0DE0301  # the memset node's value, which the host node must see copied into page-locked memory
FIRST, SECOND = 0xC0DE0311, 0xC0DE0312  # the captured memsets' values, around the captured host function
ORDERED, SET_ON_GRAPH, SET_ON_EXEC, CAPTURED = 0xA1, 0xB2, 0xC3, 0xD4  # userData values (the function sees them)
CARRY = 1000  # the host node writes CARRY + its call count for the copy after it
LAUNCHES = 3
HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # CUhostFn: void fn(void *userData)


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


def launch_host_func(driver, stream, function, user_data):
    """cuLaunchHostFunc(stream, function, user_data) as a C program calls it: through the driver's own entry point
    (cuGetProcAddress, CUDA 12.0's ABI; asked for CUDA 13.2's, "cuLaunchHostFunc" is cuLaunchHostFunc_v2, which takes a
    sync mode too). Not cuda-bindings' driver.cuLaunchHostFunc: that hands the driver a trampoline of its own whose
    data it frees after the first call, so a graph captured from it crashes on its second replay (measured: a
    segfault on the H200, cuda-bindings 13.3.1, driver 580.159.04; NVIDIA/cuda-python#790 is the runtime's twin). The
    fake driver has neither cuGetProcAddress nor that trampoline: its own cuLaunchHostFunc there."""
    if not hasattr(driver, "cuGetProcAddress"):
        check(driver.cuLaunchHostFunc(stream, driver.CUhostFn(function), user_data))
        return
    entry, status = check(driver.cuGetProcAddress(b"cuLaunchHostFunc", 12000, 0))
    if not int(entry or 0) or int(status) != 0:
        raise SystemExit(f"cuGetProcAddress(cuLaunchHostFunc) answered {int(entry or 0):#x}, status {status!r}")
    call = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(int(entry))
    err = call(int(stream), function, user_data)
    if err != 0:
        raise SystemExit(f"CUDA error {err} (cuLaunchHostFunc)")


def host_params(driver, function, user_data):
    params = driver.CUDA_HOST_NODE_PARAMS()
    params.fn = driver.CUhostFn(function)
    params.userData = user_data
    return params


def memset_params(driver, dst, value):
    params = driver.CUDA_MEMSET_NODE_PARAMS()
    params.dst, params.pitch, params.value, params.elementSize, params.width, params.height = dst, 0, value, 4, WORDS, 1
    return params


def copy_params(driver, *, src_device=None, src_host=None, dst_device=None, dst_host=None, size=BYTES):
    """A 1-D CUDA_MEMCPY3D of `size` bytes between device memory and host memory (an address)."""
    params = driver.CUDA_MEMCPY3D()
    kinds = driver.CUmemorytype
    if src_device is not None:
        params.srcMemoryType, params.srcDevice = kinds.CU_MEMORYTYPE_DEVICE, src_device
    else:
        params.srcMemoryType, params.srcHost = kinds.CU_MEMORYTYPE_HOST, src_host
    if dst_device is not None:
        params.dstMemoryType, params.dstDevice = kinds.CU_MEMORYTYPE_DEVICE, dst_device
    else:
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


def run(driver):
    out = {}
    keep: list[object] = []  # what must outlive the run: the callback, a buffer
    check(driver.cuInit(0))
    dev = check(driver.cuDeviceGet(0))
    ctx = check(driver.cuDevicePrimaryCtxRetain(dev))
    check(driver.cuCtxSetCurrent(ctx))
    stream = check(driver.cuStreamCreate(1))  # non-blocking
    memory, carried, scratch = (check(driver.cuMemAlloc(BYTES)) for _ in range(3))
    for pointer in (memory, carried, scratch):
        check(driver.cuMemsetD32(pointer, 0, WORDS))
    host, free_host = page_locked(driver, 2 * BYTES, keep)
    words = (ctypes.c_uint32 * (2 * WORDS)).from_address(host)
    calls = []  # [userData, the first and last word the copy before the host node left] per call, in order

    def on_host(data):  # runs on a thread of the driver's: no CUDA calls here
        calls.append([data or 0, words[0], words[WORDS - 1]])
        words[WORDS] = CARRY + len(calls)  # what the copy after the host node carries to `carried`

    kept = HOST_FN(on_host)
    keep.append(kept)
    function = ctypes.cast(kept, ctypes.c_void_p).value
    carried_seen = []

    def launch(graph_exec):
        """One launch, waited for: the page-locked words cleared first, so that a call sees this launch's copy."""
        ctypes.memset(host, 0, BYTES)
        check(driver.cuGraphLaunch(graph_exec, stream))
        check(driver.cuStreamSynchronize(stream))
        cell = ctypes.c_uint32()
        check(driver.cuMemcpyDtoH(ctypes.addressof(cell), carried, 4))
        carried_seen.append(cell.value)

    # (a) memset -> copy into page-locked memory -> host node -> copy of the word it wrote, launched three times
    graph = check(driver.cuGraphCreate(0))
    memset = check(driver.cuGraphAddMemsetNode(graph, None, 0, memset_params(driver, memory, MARK), ctx))
    copy_out = check(driver.cuGraphAddMemcpyNode(graph, [memset], 1,
                                                 copy_params(driver, src_device=memory, dst_host=host), ctx))
    node = check(driver.cuGraphAddHostNode(graph, [copy_out], 1, host_params(driver, function, ORDERED)))
    check(driver.cuGraphAddMemcpyNode(graph, [node], 1, copy_params(driver, src_host=host + BYTES,
                                                                     dst_device=carried, size=4), ctx))
    out["ordered_graph"] = shape(driver, graph)
    first_exec = check(driver.cuGraphInstantiate(graph, 0))
    for _ in range(LAUNCHES):
        launch(first_exec)
    out["ordered_calls"] = calls[:]
    out["ordered_carried"] = carried_seen[:]

    # (b) the host node's parameters: asked back, set on the graph's node, set on an executable graph's copy
    def params_of(which):
        asked = check(driver.cuGraphHostNodeGetParams(which))
        return [int(asked.fn) == function, int(asked.userData or 0)]

    out["get_params"] = params_of(node)
    check(driver.cuGraphHostNodeSetParams(node, host_params(driver, function, SET_ON_GRAPH)))
    out["get_params_after_set"] = params_of(node)
    second_exec = check(driver.cuGraphInstantiate(graph, 0))
    before = len(calls)
    launch(second_exec)  # the new instantiation: SET_ON_GRAPH
    launch(first_exec)  # the executable graph made before the set keeps its own: ORDERED
    check(driver.cuGraphExecHostNodeSetParams(first_exec, node, host_params(driver, function, SET_ON_EXEC)))
    launch(first_exec)  # SET_ON_EXEC
    out["params_calls"] = [data for data, _first, _last in calls[before:]]
    out["params_saw_the_memset"] = [[first, last] == [MARK, MARK] for _data, first, last in calls[before:]]
    out["get_params_after_exec_set"] = params_of(node)  # the graph's node keeps SET_ON_GRAPH
    out["params_carried"] = carried_seen[LAUNCHES:]

    # refusals, on a graph of their own: a node that is not a host node, a NULL function
    probe = check(driver.cuGraphCreate(0))
    not_host = check(driver.cuGraphAddMemsetNode(probe, None, 0, memset_params(driver, scratch, 1), ctx))
    out["get_params_of_a_memset_node"] = int(driver.cuGraphHostNodeGetParams(not_host)[0])
    out["set_params_of_a_memset_node"] = int(driver.cuGraphHostNodeSetParams(
        not_host, host_params(driver, function, 1))[0])
    out["add_null_function"] = int(driver.cuGraphAddHostNode(probe, None, 0, host_params(driver, 0, 1))[0])
    out["probe_graph"] = shape(driver, probe)

    # (c) a capture of cuLaunchHostFunc between two memsets, replayed twice
    before = len(calls)
    capture_stream = check(driver.cuStreamCreate(1))
    check(driver.cuStreamBeginCapture(capture_stream, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
    check(driver.cuMemsetD32Async(scratch, FIRST, WORDS, capture_stream))
    launch_host_func(driver, capture_stream, function, CAPTURED)
    check(driver.cuMemsetD32Async(scratch, SECOND, WORDS, capture_stream))
    captured = check(driver.cuStreamEndCapture(capture_stream))
    out["calls_while_capturing"] = len(calls) - before  # a captured function runs only when its graph does
    out["captured_graph"] = shape(driver, captured)
    captured_exec = check(driver.cuGraphInstantiate(captured, 0))
    for _ in range(2):
        check(driver.cuGraphLaunch(captured_exec, capture_stream))
        check(driver.cuStreamSynchronize(capture_stream))
    out["captured_calls"] = [data for data, _first, _last in calls[before:]]
    cell = ctypes.c_uint32()
    check(driver.cuMemcpyDtoH(ctypes.addressof(cell), scratch, 4))
    out["captured_memory"] = cell.value

    host_type = int(driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_HOST)
    out["ok"] = (out["ordered_calls"] == [[ORDERED, MARK, MARK]] * LAUNCHES
                 and out["ordered_carried"] == [CARRY + i for i in range(1, LAUNCHES + 1)]
                 and out["get_params"] == [True, ORDERED] and out["get_params_after_set"] == [True, SET_ON_GRAPH]
                 and out["params_calls"] == [SET_ON_GRAPH, ORDERED, SET_ON_EXEC]
                 and all(out["params_saw_the_memset"])
                 and out["get_params_after_exec_set"] == [True, SET_ON_GRAPH]
                 and out["ordered_graph"]["types"].count(host_type) == 1
                 and out["calls_while_capturing"] == 0 and out["captured_calls"] == [CAPTURED] * 2
                 and host_type in out["captured_graph"]["types"] and out["captured_memory"] == SECOND)

    for made in (first_exec, second_exec, captured_exec):
        check(driver.cuGraphExecDestroy(made))
    for made in (graph, probe, captured):
        check(driver.cuGraphDestroy(made))
    for made in (stream, capture_stream):
        check(driver.cuStreamDestroy(made))
    for pointer in (memory, carried, scratch):
        check(driver.cuMemFree(pointer))
    free_host()
    check(driver.cuDevicePrimaryCtxRelease(dev))
    return out


def fake_driver():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
    from tests.fake_driver import FakeDriver
    return FakeDriver(devices=1)


def cuda_driver():
    """cuda.bindings.driver, once it found a CUDA driver: without one, a one-line exit instead of a traceback."""
    from cuda.bindings import driver
    try:
        driver.cuInit(0)
    except RuntimeError as exc:  # no libcuda (cuda.pathfinder's DynamicLibNotFoundError)
        raise SystemExit(f"host_node_program: no CUDA driver here ({exc})") from None
    return driver


def main(argv):
    driver = fake_driver() if "--fake" in argv else cuda_driver()
    print("RESULT " + json.dumps(run(driver), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
