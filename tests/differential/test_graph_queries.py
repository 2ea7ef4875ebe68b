"""CUDA graphs, their second part (node parameters asked back, kernel node attributes, capture into a given graph,
instantiation with parameters, memory nodes, graph memory attributes, the DOT description), through the native
`libcuda.so.1`: tests/differential/graph_queries.py's program on a region served locally by a real agent over the
fake driver and relayed across two network namespaces, each transcript compared value for value with the fake
driver's own, called directly.

First the fake is held to what cuda.h documents; then the paths; then what the guest answers by itself (attributes not
forwarded, kernel parameters after an `extra`, the memory it keeps for asked-back parameters, a failed instantiation's
result, the older ABIs); then the host's checks, on the executor directly with two sessions over one fake driver:
another session's nodes, graphs, streams and memory refused before the driver sees them, a bogus attribute ID, a graph
allocation's range the session's only while its graph lives, and its bytes counted against the vGPU quota.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from host_agent.handler import Session
from host_agent.session.executor import CudaExecutor, ExecutorOptions
from ivshmem.driver_api import CALLS
from ivshmem.record import Status
from tests import forwarding_rig
from tests.differential.graph_nodes import WORDS
from tests.differential.graph_queries import GraphQueryProgram, fake_table
from tests.differential.native_child import NATIVE_TIMEOUT_S, REPO, run_native
from tests.differential.pool_kernels import ADD_PTX
from tests.differential.test_graph_nodes import SessionDriver, _first_difference, _step
from tests.fake_driver import FakeDriver, FakeMeter
from tests.forwarding_rig import Rig, native_child_env

bounded, start = forwarding_rig.bounded, forwarding_rig.start  # the rig's fixtures

INVALID_VALUE, OUT_OF_MEMORY, INVALID_DEVICE, INVALID_HANDLE, NOT_SUPPORTED = 1, 2, 101, 400, 801
ILLEGAL_STATE, OPERATING_SYSTEM = 401, 304
PRIORITY, EVENT_ATTRIBUTE, DEVICE_UPDATABLE = 8, 7, 13
# the calls this family added, every one of which reaches the driver by its own name
FAMILY = {"cuGraphKernelNodeGetParams", "cuGraphMemsetNodeGetParams", "cuGraphMemcpyNodeGetParams",
          "cuGraphNodeGetParams", "cuGraphKernelNodeGetAttribute", "cuGraphKernelNodeSetAttribute",
          "cuStreamBeginCaptureToGraph", "cuStreamUpdateCaptureDependencies", "cuGraphInstantiateWithParams",
          "cuGraphAddMemAllocNode", "cuGraphAddMemFreeNode", "cuGraphMemAllocNodeGetParams",
          "cuDeviceGetGraphMemAttribute", "cuDeviceSetGraphMemAttribute", "cuGraphDebugDotPrint"}


@functools.cache
def reference(pinned: bool = True) -> list[list[Any]]:
    """The fake driver's own transcript (deterministic: computed once per test process)."""
    return GraphQueryProgram(fake_table(FakeDriver(devices=1)), pinned=pinned).run()


def _native(rig: Rig, library: Path, *args: str, script: str | None = None) -> tuple[Any, str]:
    return run_native(rig, library, "tests.differential.graph_queries", *args, script=script)


# --- the reference: the fake driver holds to what cuda.h documents -----------------------------------------------

def test_the_fake_answers_the_second_part_of_the_graph_calls_as_cuda_documents() -> None:
    out = reference()
    initial = list(range(WORDS))
    added = _step(out, "nodes added")
    assert added[1] == [0] * 16 + [1]  # and the allocation node's address is a new one
    kernels = _step(out, "kernel nodes' parameters asked back")[2]
    assert kernels == [[0, [True, 0, 0, [1, 1, 1], [WORDS, 1, 1], 0, ["words+0", WORDS, 5], False]],
                       [0, [True, 0, 0, [1, 1, 1], [WORDS, 1, 1], 0, ["alloc+0", WORDS, 1], False]]]
    copies = {name: fields for name, _status, fields in _step(out, "memcpy nodes' parameters asked back")[2]}
    assert copies["copy = words (unified)"][0][:3] == [4, None, "words+0"]  # UNIFIED as given, not as resolved
    assert copies["staged = pinned_in"][0][:3] == [1, "pinned_in+0", None]
    assert copies["2D copy"][0] == [2, None, "words+0", 4, 1, 0, 0, 16, 4, None]
    assert _step(out, "the allocation node's parameters asked back")[2] == [[1, 0, 1, 0, 0, 0, 0], [[1, 0, 3]],
                                                                            4 * WORDS, "alloc+0"]
    every = _step(out, "every node's parameters by cuGraphNodeGetParams")[2]
    assert every["if"] == [0, 13, [True, 0, 1, True, True]] and every["free"] == [0, 11, "alloc+0"]
    assert every["child"] == [0, 4, [True, 0]] and every["record"] == [0, 7, True] and every["wait"] == [0, 6, True]
    assert every["memset"][2][-1] and every["copy = words (unified)"][2][1]  # their context
    assert _step(out, "refused: a kernel node's parameters")[1] == [INVALID_VALUE] * 5
    attributes = _step(out, "kernel node attributes")[2]
    assert attributes == [[0], [0, "0100000000000000"], [0, "0" * 16], [0, "0" * 16], [INVALID_VALUE, None],
                          [INVALID_VALUE], [NOT_SUPPORTED, None], [INVALID_VALUE, None]]
    launched = _step(out, "instantiated with parameters")
    assert launched[1] == [0, 0, -1, 0, 0, 0] and launched[2][0] == [INVALID_VALUE, True]
    memory = launched[2][1]
    assert memory["words"] == [i + 10 for i in initial] and memory["spare"] == [4] * WORDS  # 3 + 1 in the allocation
    assert _step(out, "graph memory attributes while")[2] == [4 * WORDS] * 4
    assert _step(out, "high marks reset")[1] == [0, 0, INVALID_VALUE, INVALID_VALUE, INVALID_DEVICE, INVALID_VALUE]
    assert _step(out, "the graph allocation is the program's")[1:] == [[0, 0, 0, INVALID_VALUE],
                                                                       [7] * (WORDS - 4) + [9] * 4]
    refused = _step(out, "refused: instantiating a cycle")
    assert refused[1] == [INVALID_VALUE, 1, INVALID_HANDLE, 1, NOT_SUPPORTED] + [INVALID_VALUE] * 6
    assert refused[2] == [True, 16]  # nothing added
    by_node = _step(out, "memory nodes added with cuGraphAddNode")
    assert by_node[1:] == [[0, 0, 1, 0], [[0, 10, [[1, 0, 1, 0, 0, 0, 0], [[1, 0, 3]], 4 * WORDS, "added+0"]],
                                          [0, 11, "added+0"]]]
    captured = _step(out, "captured into a graph")
    assert captured[1] == [0, 0, 0, 0, 0, INVALID_VALUE, 0, 0, ILLEGAL_STATE, 0, 0, -1, 0, 0]
    assert captured[2][:7] == [[1, ["captured"]], [1, ["captured", "root"]], [1, ["root"]], True, 4, 4,
                               NOT_SUPPORTED]  # a captured node's parameters: not modelled by the fake
    assert captured[2][7]["marks"] == [20] * WORDS and captured[2][7]["spare"] == [22] * WORDS
    dot = _step(out, "the DOT description")
    assert dot[1] == [0, OPERATING_SYSTEM, INVALID_VALUE, INVALID_VALUE] and dot[2].startswith("digraph")
    gone = _step(out, "destroyed: the graph allocation")
    assert gone[1] == [0] * 6 + [INVALID_VALUE] * 2 and gone[2][0] == 0


# --- the paths -------------------------------------------------------------------------------------------------------
# Relayed sessions run the program without its page-locked memcpy nodes (test_graph_nodes.py's xfail says why).

def test_the_native_driver_answers_the_second_part_as_the_fake_does(served: Rig, library: Path) -> None:
    pinned = not served.relayed
    got, _err = _native(served, library, *(["pinned"] if pinned else []))
    want = reference(pinned)
    assert got["transcript"] == want, _first_difference(want, got["transcript"])
    reached = {e["name"] for e in served.entries()}
    assert reached >= FAMILY, sorted(FAMILY - reached)  # each call forwarded, none answered in the guest instead


# --- what the guest answers by itself --------------------------------------------------------------------------------

GUEST_SIDE = r"""
import ctypes, json, struct, sys
from tests.differential.graph_nodes import KernelNodeParams, WORDS
from tests.differential.graph_queries import InstantiateParams, library_table
from tests.differential.pool_kernels import ADD_PTX
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
t = library_table(lib)
kept = lib.orion_graph_kept
kept.restype = ctypes.c_size_t
lib.orion_graph_versioned_entry.restype = ctypes.c_void_p
lib.orion_graph_versioned_entry.argtypes = [ctypes.c_char_p, ctypes.c_int]
U64, U32, P, SZ = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t
cell, device = U64(), ctypes.c_int()
t["cuInit"](0); t["cuDeviceGet"](ctypes.addressof(device), 0)
t["cuDevicePrimaryCtxRetain"](ctypes.addressof(cell), device.value); t["cuCtxSetCurrent"](cell.value)
image = ctypes.create_string_buffer(ADD_PTX)
t["cuModuleLoadData"](ctypes.addressof(cell), ctypes.addressof(image))
t["cuModuleGetFunction"](ctypes.addressof(cell), cell.value, b"orion_fake_add_u32"); function = cell.value
t["cuMemAlloc"](ctypes.addressof(cell), 4 * WORDS); words = cell.value
def graph():
    t["cuGraphCreate"](ctypes.addressof(cell), 0)
    return cell.value
def kernel_node(into, value):
    cells = (U64(words), U32(WORDS), U32(value))
    pointers = (P * 3)(*[ctypes.addressof(c) for c in cells])
    params = KernelNodeParams(func=function, gridDimX=1, gridDimY=1, gridDimZ=1, blockDimX=WORDS, blockDimY=1,
                              blockDimZ=1, kernelParams=ctypes.addressof(pointers))
    node = U64()
    assert t["cuGraphAddKernelNode"](ctypes.addressof(node), into, None, 0, ctypes.addressof(params)) == 0
    return node.value, params, (cells, pointers)
def asked(node):
    params = KernelNodeParams()
    status = t["cuGraphKernelNodeGetParams"](node, ctypes.addressof(params))
    third = ctypes.c_void_p.from_address(params.kernelParams + 16).value if status == 0 else None
    value = U32.from_address(third).value if third else None
    return status, params.kernelParams, value
out = {"none kept": kept()}
first = graph()
node, params, alive = kernel_node(first, 5)
s1, p1, v1 = asked(node)
s2, p2, v2 = asked(node)
out["asked twice: the same memory"] = [s1, s2, p1 == p2, v1, v2, kept()]
alive[0][2].value = 9
assert t["cuGraphKernelNodeSetParams"](node, ctypes.addressof(params)) == 0
s3, p3, v3 = asked(node)
out["set, asked again: the new value"] = [s3, v3, kept()]
older = ctypes.CFUNCTYPE(ctypes.c_int, U64, P)(lib.orion_graph_versioned_entry(b"cuGraphKernelNodeGetParams", 11080))
v1_params = (ctypes.c_char * 56)()
out["the CUDA 11 ABI"] = [older(node, ctypes.addressof(v1_params)),
                          struct.unpack_from("<Q", v1_params, 0)[0] == function,
                          lib.orion_graph_versioned_entry(b"cuGraphKernelNodeGetParams", 12000) is None,
                          bool(lib.orion_graph_versioned_entry(b"cuStreamUpdateCaptureDependencies", 12020))]
out["node destroyed"] = [t["cuGraphDestroyNode"](node), kept()]
node, params, alive = kernel_node(first, 5)
asked(node)
out["graph destroyed"] = [kept(), t["cuGraphDestroy"](first), kept()]
value = (ctypes.c_ubyte * 64)()
second = graph()
node, params, alive = kernel_node(second, 5)
out["attributes not forwarded"] = [t["cuGraphKernelNodeGetAttribute"](node, attribute, ctypes.addressof(value))
                                   for attribute in (""" + f"{EVENT_ATTRIBUTE}, {DEVICE_UPDATABLE}, 12, 99, -1" + r""")]
out["set too"] = t["cuGraphKernelNodeSetAttribute"](node, 99, ctypes.addressof(value))
t["cuGraphAddDependencies"](second, ctypes.addressof(U64(node)), ctypes.addressof(U64(node)), None, 1)
instantiate = InstantiateParams(result_out=-1, hErrNode_out=0xBAD0)
out["a failed instantiation"] = [t["cuGraphInstantiateWithParams"](ctypes.addressof(cell), second, None),
                                 t["cuGraphInstantiateWithParams"](None, second, ctypes.addressof(instantiate))]
extra_buffer = ctypes.create_string_buffer(struct.pack("<QII", words, WORDS, 1), 16)
size = SZ(16)
extra = (P * 5)(1, ctypes.addressof(extra_buffer), 2, ctypes.addressof(size), 0)
third = graph()
node, params, alive = kernel_node(third, 5)
before = asked(node)[0]
launched = t["cuLaunchKernel"](function, 1, 1, 1, WORDS, 1, 1, 0, 0, None, ctypes.addressof(extra))
out["after a launch given extra"] = [before, launched, asked(node)[0], asked(node)[0]]
print(json.dumps(out))
"""


def test_the_guest_keeps_asked_back_parameters_and_refuses_what_it_cannot_answer(local: Rig, library: Path) -> None:
    mark = local.mark()
    got, err = _native(local, library, script=GUEST_SIDE)
    assert got == {"none kept": 0,
                   "asked twice: the same memory": [0, 0, True, 5, 5, 1],
                   "set, asked again: the new value": [0, 9, 1],  # the old memory went with the set
                   "the CUDA 11 ABI": [0, True, True, True],
                   "node destroyed": [0, 0],
                   "graph destroyed": [1, 0, 0],
                   "attributes not forwarded": [NOT_SUPPORTED] * 5,
                   "set too": NOT_SUPPORTED,
                   "a failed instantiation": [INVALID_VALUE, INVALID_VALUE],
                   "after a launch given extra": [0, 0, NOT_SUPPORTED, NOT_SUPPORTED]}
    assert err.count("graph kernel node attribute") == 1 and err.count("given `extra`") == 1  # each said once
    assert not local.entries(mark, "cuGraphKernelNodeGetAttribute")  # the refused ones never left the guest
    assert not local.entries(mark, "cuGraphKernelNodeSetAttribute")


FAILED_INSTANTIATION = r"""
import ctypes, json, sys
from tests.differential.graph_queries import InstantiateParams, library_table
t = library_table(ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL))
U64 = ctypes.c_uint64
cell, device = U64(), ctypes.c_int()
t["cuInit"](0); t["cuDeviceGet"](ctypes.addressof(device), 0)
t["cuDevicePrimaryCtxRetain"](ctypes.addressof(cell), device.value); t["cuCtxSetCurrent"](cell.value)
t["cuGraphCreate"](ctypes.addressof(cell), 0); graph = cell.value
a, b = U64(), U64()
t["cuGraphAddEmptyNode"](ctypes.addressof(a), graph, None, 0)
t["cuGraphAddEmptyNode"](ctypes.addressof(b), graph, ctypes.addressof(a), 1)
t["cuGraphAddDependencies"](graph, ctypes.addressof(b), ctypes.addressof(a), None, 1)
params = InstantiateParams(result_out=-1, hErrNode_out=0xBAD0)
status = t["cuGraphInstantiateWithParams"](ctypes.addressof(cell), graph, ctypes.addressof(params))
print(json.dumps([status, params.result_out, params.hErrNode_out]))
"""


def test_a_failed_instantiation_says_so_without_a_reason_the_reply_cannot_carry(local: Rig, library: Path) -> None:
    got, _err = _native(local, library, script=FAILED_INSTANTIATION)
    assert got == [INVALID_VALUE, 1, 0]  # CUDA_GRAPH_INSTANTIATE_ERROR, no error node (the fake said 2: a cycle)


# --- the executor's checks, directly: two sessions over one fake driver ------------------------------------------

Sessions = tuple[FakeDriver, SessionDriver, SessionDriver, dict[str, int]]


def _kernel(function: int, words: int) -> list[Any]:
    return [function, 0, 0, 1, 1, 1, WORDS, 1, 1, 0]


@pytest.fixture
def sessions() -> Sessions:
    driver = FakeDriver(devices=1)
    driver.cuInit(0)
    a, b = SessionDriver(driver, 1), SessionDriver(driver, 2)
    made: dict[str, int] = {}
    for name, session in (("a", a), ("b", b)):
        (context,) = session.ok("cuDevicePrimaryCtxRetain", 0)
        session.ok("cuCtxSetCurrent", context)
        (made[f"{name}.words"],) = session.ok("cuMemAlloc", 4 * WORDS)
        (module,) = session.ok("cuModuleLoadData", ADD_PTX)
        (made[f"{name}.function"],) = session.ok("cuModuleGetFunction", module, b"orion_fake_add_u32")
        (made[f"{name}.graph"],) = session.ok("cuGraphCreate", 0)
        (made[f"{name}.stream"],) = session.ok("cuStreamCreate", 1)
        (made[f"{name}.kernel"],) = session.ok("cuGraphAddKernelNode", made[f"{name}.graph"],
                                               *_kernel(made[f"{name}.function"], made[f"{name}.words"]), [],
                                               struct.pack("<QII", made[f"{name}.words"], WORDS, 1))
    return driver, a, b, made


def _alloc(graph: int, size: int = 4 * WORDS, device: int = 0, access: list[Any] | None = None) -> tuple[Any, ...]:
    """cuGraphAddMemAllocNode's request fields: graph, POOL_PROPS (pinned, on `device`), bytes, deps, access."""
    return ("cuGraphAddMemAllocNode", graph, 1, 0, 1, device, 0, 0, 0, size, [],
            [(1, device, 3)] if access is None else access)


def _saw(driver: FakeDriver, since: int) -> list[str]:
    return [c.name for c in driver.calls[since:] if c.name in FAMILY or c.name.startswith("cuGraph")]


def test_another_sessions_nodes_graphs_and_streams_are_refused_before_the_driver(sessions: Sessions) -> None:
    driver, a, b, made = sessions
    node, graph = made["a.kernel"], made["a.graph"]
    since = len(driver.calls)
    value = bytes(64)
    refused = {
        "kernel parameters": b.status("cuGraphKernelNodeGetParams", node),
        "memset parameters": b.status("cuGraphMemsetNodeGetParams", node),
        "memcpy parameters": b.status("cuGraphMemcpyNodeGetParams", node),
        "node parameters": b.status("cuGraphNodeGetParams", node),
        "allocation parameters": b.status("cuGraphMemAllocNodeGetParams", node),
        "attribute read": b.status("cuGraphKernelNodeGetAttribute", node, PRIORITY),
        "attribute set": b.status("cuGraphKernelNodeSetAttribute", node, PRIORITY, value),
        "capture into its graph": b.status("cuStreamBeginCaptureToGraph", made["b.stream"], graph, 0, [], []),
        "capture after its node": b.status("cuStreamBeginCaptureToGraph", made["b.stream"], made["b.graph"], 0,
                                           [(node,)], []),
        "capture on its stream": b.status("cuStreamBeginCaptureToGraph", made["a.stream"], made["b.graph"], 0, [], []),
        "dependencies of its node": b.status("cuStreamUpdateCaptureDependencies", made["b.stream"], 0, [(node,)], []),
        "instantiate its graph": b.status("cuGraphInstantiateWithParams", graph, 0, 0),
        "upload on its stream": b.status("cuGraphInstantiateWithParams", made["b.graph"], 2, made["a.stream"]),
        "an allocation node in its graph": b.status(*_alloc(graph)),
        "a free node of its memory": b.status("cuGraphAddMemFreeNode", made["b.graph"], made["a.words"], []),
        "its graph's description": b.status("cuGraphDebugDotPrint", graph, 0),
        "an allocation on a device it does not have": b.status(*_alloc(made["b.graph"], device=3)),
        "access from a device it does not have": b.status(*_alloc(made["b.graph"], access=[(1, 3, 3)])),
        "graph memory of a device it does not have": b.status("cuDeviceGetGraphMemAttribute", 3, 0),
    }
    assert refused == {name: INVALID_HANDLE if "stream" in name and "capture" not in name or name ==
                       "capture on its stream" else INVALID_DEVICE if name.startswith("graph memory") else
                       INVALID_VALUE for name in refused}
    assert _saw(driver, since) == []  # the driver saw none of them


def test_attributes_other_than_the_plain_ones_are_refused_before_the_driver(sessions: Sessions) -> None:
    driver, a, _b, made = sessions
    node = made["a.kernel"]
    since = len(driver.calls)
    for attribute in (EVENT_ATTRIBUTE, 12, DEVICE_UPDATABLE, 99, 0x7FFFFFFF, -3):
        assert a.status("cuGraphKernelNodeGetAttribute", node, attribute) == NOT_SUPPORTED
        assert a.status("cuGraphKernelNodeSetAttribute", node, attribute, bytes(64)) == NOT_SUPPORTED
    assert a.status("cuGraphKernelNodeSetAttribute", node, PRIORITY, bytes(63)) == Status.MALFORMED
    assert _saw(driver, since) == []
    assert a.status("cuGraphKernelNodeSetAttribute", node, PRIORITY, struct.pack("<i60x", 2)) == 0
    (value,) = a.ok("cuGraphKernelNodeGetAttribute", node, PRIORITY)
    assert value[:4] == struct.pack("<i", 2)


def test_a_graph_allocation_is_the_sessions_memory_only_while_its_graph_lives(sessions: Sessions) -> None:
    driver, a, b, made = sessions
    (graph,) = a.ok("cuGraphCreate", 0)
    node, dptr = a.ok(*_alloc(graph))
    data = struct.pack(f"<{WORDS}I", *range(WORDS))
    assert a.status("cuMemcpyHtoD", dptr, len(data), data) == 0
    assert a.status("cuMemsetD32", dptr, 1, WORDS) == 0 and a.status("cuMemsetD32", dptr + 4, 1, WORDS) == \
        INVALID_VALUE  # past its end
    assert b.status("cuMemsetD32", dptr, 1, WORDS) == INVALID_VALUE  # never another session's
    assert a.status("cuMemFree", dptr) == INVALID_VALUE  # not one of its cuMemAlloc allocations
    (free,) = a.ok("cuGraphAddMemFreeNode", graph, dptr, [(node,)])
    assert b.status("cuGraphAddMemFreeNode", made["b.graph"], dptr, []) == INVALID_VALUE
    assert a.ok("cuGraphNodeGetParams", free)[0] == 11  # CU_GRAPH_NODE_TYPE_MEM_FREE (its dptr: the reply's)
    assert a.status("cuGraphDestroy", graph) == 0
    since = len(driver.calls)
    assert a.status("cuMemcpyHtoD", dptr, len(data), data) == INVALID_VALUE  # its graph is gone: so is the range
    assert a.status("cuMemsetD32", dptr, 1, WORDS) == INVALID_VALUE
    assert a.status("cuMemsetD32Async", dptr, 1, WORDS, 0) == INVALID_VALUE
    assert [c.name for c in driver.calls[since:]] == []
    # a graph moved into a parent takes its allocations with the parent
    (parent,) = a.ok("cuGraphCreate", 0)
    (child,) = a.ok("cuGraphCreate", 0)
    _node, inner = a.ok(*_alloc(child))
    a.ok("cuGraphAddNode", parent, 4, 0, 0, 0, 0, child, 1, [], [])
    assert a.status("cuMemsetD32", inner, 1, WORDS) == 0
    assert a.status("cuGraphDestroy", parent) == 0
    assert a.status("cuMemsetD32", inner, 1, WORDS) == INVALID_VALUE


def test_graph_allocations_count_against_the_vgpu_quota(tmp_path: Path) -> None:
    driver = FakeDriver(devices=1, context_bytes=0)
    driver.cuInit(0)
    quota_mib = 64
    executor = CudaExecutor(Session(7, "graph-quota", 0, 1), ExecutorOptions(gmem_mib=quota_mib, meter=FakeMeter),
                            driver=driver)
    session = SessionDriver.__new__(SessionDriver)
    session.executor, session.next_id = executor, 0
    (context,) = session.ok("cuDevicePrimaryCtxRetain", 0)
    session.ok("cuCtxSetCurrent", context)
    (graph,) = session.ok("cuGraphCreate", 0)
    since = len(driver.calls)
    assert session.status(*_alloc(graph, size=(quota_mib + 1) << 20)) == OUT_OF_MEMORY  # past the quota
    assert "cuGraphAddMemAllocNode" not in [c.name for c in driver.calls[since:]]
    _node, _dptr = session.ok(*_alloc(graph, size=48 << 20))
    assert session.status("cuMemAlloc", 32 << 20) == OUT_OF_MEMORY  # the graph's 48 MiB count
    assert session.status("cuGraphDestroy", graph) == 0
    assert session.ok("cuMemAlloc", 32 << 20)  # given back with the graph


def test_malformed_requests_of_the_family_are_refused(sessions: Sessions) -> None:
    driver, a, _b, made = sessions
    since = len(driver.calls)
    node = made["a.kernel"]
    assert a.status("cuStreamBeginCaptureToGraph", made["a.stream"], made["a.graph"], 0, [(node,)],
                    [(0,), (0,)]) == Status.MALFORMED  # edges that do not pair with the dependencies
    assert a.status(*_alloc(made["a.graph"], access=[(1, 0, 3)] * 65)) == Status.MALFORMED
    assert a.reply("cuGraphNodeGetParams", payload=b"\0" * 7).status == Status.MALFORMED
    assert a.status("cuStreamBeginCaptureToGraph", made["a.stream"], made["a.graph"], 0, [(node,)],
                    [(1 << 40,)]) == INVALID_VALUE  # reserved edge bytes
    assert _saw(driver, since) == []
    assert CALLS["cuGraphKernelNodeGetParams"].reply.fields[-2:] == (("offsets", "[I]"), ("params", "tail"))


# --- the GPU program, on the fake directly and through the native driver --------------------------------------------

PROGRAM = REPO / "tests" / "gpu" / "programs" / "graph_family_program.py"


def _program_result(stdout: str) -> Any:
    line = next(line for line in stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_the_gpu_program_runs_through_the_native_driver_as_on_the_fake(served: Rig, library: Path) -> None:
    """tests/gpu/programs/graph_family_program.py, unmodified, as cuda-python runs it on the native driver: its results
    are its own over the fake driver in this process (on a GPU they are compared with a native run instead)."""
    spec = importlib.util.spec_from_file_location("graph_family_program", PROGRAM)  # a program, not a module
    assert spec is not None and spec.loader is not None
    program = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)
    want = json.loads(json.dumps(program.run(FakeDriver(devices=1))))
    words = program.WORDS
    assert want["memory"]["c"] == [5] * words and want["captured_memory"] == {"a": 20, "b": 21, "c": 22}
    assert want["kernel_params"] == [True, [1, words], "a", words, 4, True] and want["priority"] == 1
    done = subprocess.run([sys.executable, str(PROGRAM)], env=native_child_env(library, served.path),
                          capture_output=True, text=True, timeout=NATIVE_TIMEOUT_S, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _program_result(done.stdout) == want


def test_access_descriptors_are_read_from_the_drivers_array_not_the_wheels_list() -> None:
    """cuda-bindings' accessDescs getter answers only a list Python set (measured: [] over a struct the driver filled),
    so the host reads the array the C struct points at (graph_queries.access_descs)."""
    import ctypes

    driver = pytest.importorskip("cuda.bindings.driver")
    from host_agent.session.graph_queries import access_descs

    struct_bytes = ctypes.create_string_buffer(120)
    descs = (ctypes.c_int * 6)(1, 0, 3, 1, 1, 1)
    ctypes.c_uint64.from_address(ctypes.addressof(struct_bytes) + 88).value = ctypes.addressof(descs)
    ctypes.c_uint64.from_address(ctypes.addressof(struct_bytes) + 96).value = 2
    params = driver.CUDA_MEM_ALLOC_NODE_PARAMS(_ptr=ctypes.addressof(struct_bytes))
    assert list(params.accessDescs) == []  # what the wheel's getter says
    assert access_descs(params) == [(1, 0, 3), (1, 1, 1)]
    ctypes.c_uint64.from_address(ctypes.addressof(struct_bytes) + 96).value = 65
    assert access_descs(params) is None
