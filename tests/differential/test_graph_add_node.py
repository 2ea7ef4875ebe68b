"""cuGraphAddNode and the generic node-parameter setters (what XLA's command buffers use), through the native
`libcuda.so.1`: tests/differential/graph_nodes.py's AddNodeProgram on a region served locally by a real agent over the
fake driver and relayed across two network namespaces, each transcript compared value for value with the fake
driver's own, called directly (its cuGraphAddNode is the fake's own; the generic setters, which the native driver
answers in the guest, call the type's own setter there too).

First the fake is held to what cuda.h documents; then the paths;
then what the guest answers by itself (node types not forwarded, the conditional nodes' body arrays it keeps); then the
host's checks, on the executor directly with two sessions over one fake driver: a conditional node naming another
session's graph, dependency, context or conditional handle, or a handle the session never made, and a child graph
moved into the parent itself, into a graph it holds or from or into another session's graph, are refused before the
driver sees them; a moved graph stays the session's while its parent lives and leaves the session with it.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from host_agent.session.graph_calls import MAX_CONDITIONAL_BODIES
from ivshmem.driver_api import CALLS
from ivshmem.record import Status
from tests import forwarding_rig
from tests.differential.graph_nodes import WORDS, AddNodeProgram, fake_table
from tests.differential.native_child import run_native
from tests.differential.test_graph_nodes import SessionDriver, _first_difference, _step
from tests.fake_driver import FakeDriver
from tests.forwarding_rig import Rig

bounded, start = forwarding_rig.bounded, forwarding_rig.start  # the rig's fixtures

INVALID_VALUE, INVALID_CONTEXT, NOT_SUPPORTED = 1, 201, 801
IF, WHILE, SWITCH = 0, 1, 2
KERNEL_NODE, GRAPH_NODE, CONDITIONAL_NODE = 0, 4, 13  # CUgraphNodeType
CLONE, MOVE = 0, 1  # CUgraphChildGraphNodeOwnership
ASSIGN_DEFAULT = 1
# every call by which a node reaches the driver (the table's node-adding calls, hand-written or generic)
NODE_CALLS = {name for name in CALLS if name.startswith("cuGraphAdd") and name.endswith("Node")}


@functools.cache
def reference() -> list[list[Any]]:
    """The fake driver's own transcript (deterministic: computed once per test process)."""
    return AddNodeProgram(fake_table(FakeDriver(devices=1)), pinned=False).run()


def _native(rig: Rig, library: Path, *args: str, script: str | None = None) -> tuple[Any, str]:
    return run_native(rig, library, "tests.differential.graph_nodes", *args, script=script)


# --- the reference: the fake driver holds to what cuda.h documents -----------------------------------------------

def test_the_fake_builds_graphs_of_cugraphaddnode_as_cuda_documents() -> None:
    out = reference()
    initial = list(range(WORDS))
    assert _step(out, "child graphs built")[1] == [0, 0]
    added = _step(out, "nodes added with cuGraphAddNode")
    assert added[1] == [0] * 21 and len(added[2]) == 23  # and the child graphs' kernel nodes, made before
    kinds, bodies, distinct, counts = _step(out, "node types;")[2]
    assert kinds[2:16] == [2, 0, 0, 0, 5, 1, 4, 7, 6, 13, 13, 13, 13, 4]  # memset, kernels, empty, memcpy, child...
    assert bodies == {"if": 1, "while": 1, "switch": 3, "else": 2} and distinct and counts == [1] * 7
    edges, join = _step(out, "edges (the programmatic one")[2]
    assert edges[1] == 12 and edges[4][1] == 1 | 1 << 16 and set(edges[4]) == {0, 1 | 1 << 16}  # one edge with data
    assert join == [0, 2, [3, 5], [0, 0]]
    twice = _step(out, "instantiated, launched twice")
    assert twice[1] == [0, 0, 0]
    assert twice[2] == {"words": [i + 12 for i in initial], "marks": [10] * WORDS, "copy": [i + 12 for i in initial],
                        "spare": [2] * WORDS, "if": [2] * WORDS,  # IF of 1: its body, every launch
                        "while": [0] * WORDS,  # WHILE of 0: never
                        "switch": [200] * WORDS,  # SWITCH of 2: body 2 (+100), not bodies 0 and 1
                        "else": [42] * WORDS,  # IF of 0 with two bodies: body 1 (the memset), not body 0
                        "moved": [2] * WORDS}  # the moved child graph, run through its parent
    # the moved graph's kernel node set through the parent's executable graph and in the moved graph; a cloned child
    # graph's node is not the executable graph's
    assert _step(out, "parameters set")[1] == [0, 0, 0, 0, 0, 0, INVALID_VALUE, INVALID_VALUE, 0, 0, INVALID_VALUE]
    mine = _step(out, "relaunched: the executable graph's changes only")[2]
    assert mine["marks"] == [1011] * WORDS and mine["words"] == [i + 18 for i in initial]  # not the graph's +100
    assert mine["moved"] == [1002] * WORDS and mine["spare"] == [3] * WORDS  # +1000, not the moved graph's +100
    theirs = _step(out, "instantiated again")[2]
    assert theirs["marks"] == [12] * WORDS and theirs["words"] == [i + 119 for i in initial]
    assert theirs["moved"] == [1102] * WORDS  # the moved graph's own node: +100
    assert _step(out, "refused: reserved fields")[1] == [INVALID_VALUE] * 6
    # host and batch nodes are forwarded now: zeroed ones are refused as the driver refuses them (a NULL function, no
    # operations), setting a memset node with host parameters too; the rest not forwarded (a moved child graph is)
    assert _step(out, "refused: host and batch")[1] == [INVALID_VALUE, NOT_SUPPORTED, NOT_SUPPORTED, INVALID_VALUE,
                                                        INVALID_VALUE, NOT_SUPPORTED]
    assert _step(out, "refused: memory allocation and free nodes")[1] == [INVALID_VALUE] * 2  # memory nodes are too
    moves = _step(out, "refused: a graph moved into itself")
    assert moves[1] == [INVALID_VALUE] * 8 and moves[2] == [14, 14, 1]  # no node left behind; the moved graph whole
    assert _step(out, "refused: conditional nodes")[1] == [INVALID_VALUE] * 4
    edge = _step(out, "refused: an edge the driver refuses")
    assert edge[1] == [INVALID_VALUE] * 4 and edge[2] == [14, 14]  # no node left behind
    destroyed = _step(out, "a conditional node destroyed")[1]
    assert destroyed[:2] == [0, 13] and destroyed[4:7] == [0, INVALID_VALUE, 0]  # the moved graph went with its parent


def test_the_fakes_conditional_calls_have_the_wheels_shapes() -> None:
    d = FakeDriver(devices=1)
    d.cuInit(0)
    _, context = d.cuDevicePrimaryCtxRetain(0)
    d.cuCtxSetCurrent(context)
    _, graph = d.cuGraphCreate(0)
    err, handle = d.cuGraphConditionalHandleCreate(graph, context, 1, ASSIGN_DEFAULT)
    assert err == 0 and type(handle).__name__ == "CUgraphConditionalHandle"
    assert d.cuGraphConditionalHandleCreate(graph, context, 1, 2) == (INVALID_VALUE, None)  # flags: 0 or DEFAULT
    params = d.CUgraphNodeParams()
    params.type = d.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    params.conditional.handle, params.conditional.size = handle, 2
    params.conditional.type = d.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_IF
    err, node = d.cuGraphAddNode(graph, None, None, 0, params)
    assert err == 0 and type(node).__name__ == "CUgraphNode" and len(params.conditional.phGraph_out) == 2
    assert all(type(g).__name__ == "CUgraph" for g in params.conditional.phGraph_out)
    body = params.conditional.phGraph_out[0]
    assert d.cuGraphDestroy(body) == (INVALID_VALUE,)  # the node owns it
    assert d.cuGraphDestroyNode(node) == (0,) and int(body) not in d.graphs  # its bodies go with it


class OlderDriver(FakeDriver):
    """The fake as a cuda-bindings without cuGraphConditionalHandleCreate (the executor looks it up by name)."""

    cuGraphConditionalHandleCreate = None


# --- the paths -------------------------------------------------------------------------------------------------------

def test_the_native_driver_builds_graphs_with_cugraphaddnode_as_the_fake_does(served: Rig, library: Path) -> None:
    got, _err = _native(served, library, "add-node")
    want = reference()
    assert got["transcript"] == want, _first_difference(want, got["transcript"])


# What the guest answers by itself: node types not forwarded answer 801, each named once on stderr, and nothing reaches
# the driver; an ownership cuda.h does not have answers INVALID_VALUE; host and batch nodes of zeroed parameters
# (forwarded types) are refused before anything is sent, or by the host, as the driver refuses them. A child graph
# moved into its node is forwarded (no 801, nothing said): the first move reaches the driver and succeeds, the second
# the driver refuses.
NOT_FORWARDED = r"""
import ctypes, json, sys
from tests.differential.graph_nodes import (BATCH_MEM_OP, EMPTY, EXT_SEMAS_SIGNAL, EXT_SEMAS_WAIT, GRAPH, HOST,
                                            MEM_ALLOC, OWNERSHIP_MOVE, ChildGraphNodeParams, NodeParams, library_table)
t = library_table(ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL))
U64 = ctypes.c_uint64
cell, device = U64(), ctypes.c_int()
t["cuInit"](0); t["cuDeviceGet"](ctypes.addressof(device), 0)
t["cuDevicePrimaryCtxRetain"](ctypes.addressof(cell), device.value); t["cuCtxSetCurrent"](cell.value)
t["cuGraphCreate"](ctypes.addressof(cell), 0); graph = cell.value
t["cuGraphCreate"](ctypes.addressof(cell), 0); child = cell.value
empty = NodeParams(type=EMPTY)
t["cuGraphAddNode"](ctypes.addressof(cell), graph, None, None, 0, ctypes.addressof(empty)); node = cell.value
t["cuGraphInstantiate"](ctypes.addressof(cell), graph, 0); graph_exec = cell.value
def add(params):
    return t["cuGraphAddNode"](ctypes.addressof(U64()), graph, None, None, 0, ctypes.addressof(params))
moved = NodeParams(type=GRAPH)
moved.graph = ChildGraphNodeParams(graph=child, ownership=OWNERSHIP_MOVE)
other = NodeParams(type=GRAPH)
other.graph = ChildGraphNodeParams(graph=child, ownership=2)
host, alloc = NodeParams(type=HOST), NodeParams(type=MEM_ALLOC)
print(json.dumps({
    "added": [add(NodeParams(type=kind)) for kind in (HOST, HOST, EXT_SEMAS_SIGNAL, EXT_SEMAS_WAIT, BATCH_MEM_OP)],
    "moved": [add(other), add(moved), add(moved)],
    "set": [t["cuGraphNodeSetParams"](node, ctypes.addressof(host)),
            t["cuGraphExecNodeSetParams"](graph_exec, node, ctypes.addressof(host)),
            t["cuGraphNodeSetParams"](node, ctypes.addressof(alloc)),
            t["cuGraphExecNodeSetParams"](graph_exec, node, ctypes.addressof(alloc))]}))
"""


def test_node_types_not_forwarded_answer_801_in_the_guest_named_once(local: Rig, library: Path) -> None:
    mark = local.mark()
    got, err = _native(local, library, script=NOT_FORWARDED)
    # (host and batch memory-operation nodes are forwarded: zeroed ones are refused, a NULL function, no operations)
    assert got == {"added": [INVALID_VALUE, INVALID_VALUE, NOT_SUPPORTED, NOT_SUPPORTED, INVALID_VALUE],
                   "moved": [INVALID_VALUE, 0, INVALID_VALUE],
                   "set": [INVALID_VALUE, INVALID_VALUE, NOT_SUPPORTED, NOT_SUPPORTED]}
    assert "a graph host node" not in err and "OWNERSHIP_MOVE" not in err
    for name in ("EXT_SEMAS_SIGNAL", "EXT_SEMAS_WAIT"):
        assert err.count(f"CU_GRAPH_NODE_TYPE_{name})") == 1, name
    assert err.count("of a memory allocation or free node") == 1  # setting one: memory nodes are added (elsewhere)
    reached = [(e["name"], e["result"][0]) for e in local.entries(mark) if e["name"] in NODE_CALLS]
    assert reached == [("cuGraphAddEmptyNode", ["CUresult", 0]),  # the one empty node; nothing of the refused ones
                       ("cuGraphAddBatchMemOpNode", ["CUresult", INVALID_VALUE]),  # no operations: the driver's no
                       ("cuGraphAddNode", ["CUresult", 0]), ("cuGraphAddNode", ["CUresult", INVALID_VALUE])]


# The conditional nodes' body arrays (phGraph_out) the library keeps: valid while their node lives, freed when it, its
# graph or a graph it is nested in is destroyed; a caller built against CUDA 12.2 (cudaTypedefs.h's
# PFN_cuGraphAddNode_v12020: no edge data) gets that ABI from cuGetProcAddress; more bodies than the host takes are
# refused before anything is sent.
BODIES = r"""
import ctypes, json, sys
from tests.differential.graph_nodes import (CONDITIONAL, EMPTY, ConditionalNodeParams, NodeParams, library_table)
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
t = library_table(lib)
kept = lib.orion_graph_conditionals_kept
kept.restype = ctypes.c_size_t
lib.orion_graph_versioned_entry.restype = ctypes.c_void_p
lib.orion_graph_versioned_entry.argtypes = [ctypes.c_char_p, ctypes.c_int]
U64, P, SZ = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t
cell, device = U64(), ctypes.c_int()
t["cuInit"](0); t["cuDeviceGet"](ctypes.addressof(device), 0)
t["cuDevicePrimaryCtxRetain"](ctypes.addressof(cell), device.value); context = cell.value
t["cuCtxSetCurrent"](context)
def graph():
    t["cuGraphCreate"](ctypes.addressof(cell), 0)
    return cell.value
def conditional(into, kind=0, size=1, add=None):
    t["cuGraphConditionalHandleCreate"](ctypes.addressof(cell), into, context, 1, 1)
    params = NodeParams(type=CONDITIONAL)
    params.conditional = ConditionalNodeParams(handle=cell.value, type=kind, size=size, ctx=context)
    node = U64()
    if add is None:
        status = t["cuGraphAddNode"](ctypes.addressof(node), into, None, None, 0, ctypes.addressof(params))
    else:
        status = add(ctypes.addressof(node), into, None, 0, ctypes.addressof(params))
    bodies = list((U64 * size).from_address(params.conditional.phGraph_out)) if status == 0 else []
    return status, node.value, bodies, params.conditional.phGraph_out
def nodes(of):
    count = SZ(0)
    return t["cuGraphGetNodes"](of, None, ctypes.addressof(count)), count.value
out = {"none": kept()}
outer = graph()
status, node, (body,), array = conditional(outer)
status2, inner, inner_bodies, _ = conditional(body, 2, 3)  # a SWITCH nested in the IF's body
out["made"] = [status, status2, kept(), nodes(body), [nodes(b) for b in inner_bodies], array is not None]
out["node destroyed"] = [t["cuGraphDestroyNode"](node), kept(), nodes(outer)]
status, node, bodies, _ = conditional(outer)
conditional(bodies[0])
out["graph destroyed"] = [kept(), t["cuGraphDestroy"](outer), kept()]
older = ctypes.CFUNCTYPE(ctypes.c_int, P, U64, P, SZ, P)(lib.orion_graph_versioned_entry(b"cuGraphAddNode", 12020))
mine = graph()
status, first, _, _ = conditional(mine, add=older)
empty, after = NodeParams(type=EMPTY), U64()
deps = (U64 * 1)(first)
out["older ABI"] = [status, older(ctypes.addressof(after), mine, ctypes.addressof(deps), 1, ctypes.addressof(empty)),
                    kept(), nodes(mine), lib.orion_graph_versioned_entry(b"cuGraphAddNode", 12030) is None]
too_many = conditional(mine, 2, """ + str(MAX_CONDITIONAL_BODIES + 1) + r""")
out["too many bodies"] = [too_many[0], kept(), nodes(mine)]
print(json.dumps(out))
"""


def test_conditional_body_arrays_live_as_long_as_their_nodes(local: Rig, library: Path) -> None:
    mark = local.mark()
    got, _err = _native(local, library, script=BODIES)
    assert got == {"none": 0,
                   "made": [0, 0, 2, [0, 1], [[0, 0]] * 3, True],
                   "node destroyed": [0, 0, [0, 0]],  # the nested one's array went with its outer node's
                   "graph destroyed": [2, 0, 0],
                   "older ABI": [0, 0, 1, [0, 2], True],
                   "too many bodies": [INVALID_VALUE, 1, [0, 2]]}
    added = local.entries(mark, "cuGraphAddNode")
    assert len(added) == 5 and all(e["result"][0] == ["CUresult", 0] for e in added)  # the 6th never left the guest


# --- the executor's checks, directly: two sessions over one fake driver ------------------------------------------

Sessions = tuple[FakeDriver, SessionDriver, SessionDriver, dict[str, int]]


@pytest.fixture
def sessions() -> Sessions:
    driver = FakeDriver(devices=1)
    driver.cuInit(0)
    a, b = SessionDriver(driver, 1), SessionDriver(driver, 2)
    made: dict[str, int] = {}
    for name, session in (("a", a), ("b", b)):
        (context,) = session.ok("cuDevicePrimaryCtxRetain", 0)
        session.ok("cuCtxSetCurrent", context)
        (made[f"{name}.graph"],) = session.ok("cuGraphCreate", 0)
        (made[f"{name}.handle"],) = session.ok("cuGraphConditionalHandleCreate", made[f"{name}.graph"], 0, 1,
                                                ASSIGN_DEFAULT)
        (made[f"{name}.node"],) = session.ok("cuGraphAddEmptyNode", made[f"{name}.graph"], [])
        made[f"{name}.primary"] = context
    (made["a.context"],) = a.ok("cuCtxCreate", 0, 0)  # a context of its own
    a.ok("cuCtxSetCurrent", made["a.primary"])
    return driver, a, b, made


def _saw(driver: FakeDriver, since: int, name: str) -> int:
    return sum(call.name == name for call in driver.calls[since:])


def _conditional(graph: int, handle: int, kind: int, size: int, context: int, deps: list[Any],
                 edges: list[Any]) -> tuple[Any, ...]:
    """cuGraphAddNode's request fields for a conditional node (no child graph)."""
    return "cuGraphAddNode", graph, CONDITIONAL_NODE, handle, kind, size, context, 0, 0, deps, edges


def _moved(graph: int, child: int, deps: list[Any] | None = None, edges: list[Any] | None = None,
           ownership: int = MOVE, kind: int = GRAPH_NODE, handle: int = 0) -> tuple[Any, ...]:
    """cuGraphAddNode's request fields for a child graph moved into its node (no conditional node's fields)."""
    return "cuGraphAddNode", graph, kind, handle, 0, 0, 0, child, ownership, deps or [], edges or []


def test_a_conditional_node_is_refused_before_the_driver_unless_all_it_names_is_the_sessions(
        sessions: Sessions) -> None:
    driver, a, b, made = sessions
    mine, handle, node = made["b.graph"], made["b.handle"], made["b.node"]
    _, stray = driver.cuGraphConditionalHandleCreate(mine, 0, 1, 0)  # a real handle, but not made by the session
    since = len(driver.calls)
    refused = {
        "another session's graph": b.status(*_conditional(made["a.graph"], handle, IF, 1, 0, [], [])),
        "another session's handle": b.status(*_conditional(mine, made["a.handle"], IF, 1, 0, [], [])),
        "a handle the session never made": b.status(*_conditional(mine, int(stray), IF, 1, 0, [], [])),
        "an unknown handle": b.status(*_conditional(mine, 0xBAD0, IF, 1, 0, [], [])),
        "another session's dependency": b.status(*_conditional(mine, handle, IF, 1, 0, [(made["a.node"],)], [])),
        "another session's context": b.status(*_conditional(mine, handle, IF, 1, made["a.context"], [], [])),
        "no body": b.status(*_conditional(mine, handle, IF, 0, 0, [], [])),
        "more bodies than the host takes": b.status(*_conditional(mine, handle, SWITCH, MAX_CONDITIONAL_BODIES + 1,
                                                                  0, [], [])),
        "an unknown type": b.status(*_conditional(mine, handle, 7, 1, 0, [], [])),
        "edge data with reserved bytes": b.status(*_conditional(mine, handle, IF, 1, 0, [(node,)], [(1 << 40,)])),
        "edges that do not pair with the dependencies": b.status(*_conditional(mine, handle, IF, 1, 0, [(node,)],
                                                                               [(0,), (0,)])),
    }
    assert refused == {name: Status.MALFORMED if name.startswith("edges that") else
                       INVALID_CONTEXT if name.endswith("context") else INVALID_VALUE for name in refused}
    assert _saw(driver, since, "cuGraphAddNode") == 0
    made_node, bodies = b.ok(*_conditional(mine, handle, WHILE, 1, 0, [(node,)], [(0,)]))
    assert _saw(driver, since, "cuGraphAddNode") == 1 and len(bodies) == 1
    (body,) = bodies[0]
    assert b.status("cuGraphAddEmptyNode", body, []) == 0  # the body graph is the session's now
    assert a.status("cuGraphAddEmptyNode", body, []) == INVALID_VALUE  # and not the other one's
    assert b.status("cuGraphNodeGetDependencies", made_node, 1) == 0
    assert a.status("cuGraphNodeGetDependencies", made_node, 1) == INVALID_VALUE


def test_conditional_handles_are_the_sessions_own(sessions: Sessions) -> None:
    driver, a, b, made = sessions
    since = len(driver.calls)
    assert b.status("cuGraphConditionalHandleCreate", made["a.graph"], 0, 1, 0) == INVALID_VALUE
    assert b.status("cuGraphConditionalHandleCreate", made["b.graph"], made["a.context"], 1, 0) == INVALID_CONTEXT
    assert _saw(driver, since, "cuGraphConditionalHandleCreate") == 0
    (handle,) = b.ok("cuGraphConditionalHandleCreate", made["b.graph"], 0, 0, 0)
    assert b.status(*_conditional(made["b.graph"], handle, IF, 2, 0, [], [])) == 0
    assert a.status(*_conditional(made["a.graph"], handle, IF, 1, 0, [], [])) == INVALID_VALUE
    # a driver without conditional handles (an older cuda-bindings): NOT_SUPPORTED, whatever the inputs, as the
    # generic path answers
    plain = OlderDriver(devices=1)
    plain.cuInit(0)
    old = SessionDriver(plain, 3)
    assert old.status("cuGraphConditionalHandleCreate", 0, 0, 0, 0) == NOT_SUPPORTED
    assert old.status("cuGraphConditionalHandleCreate", 0xBAD0, 0, 0, 0) == NOT_SUPPORTED


def test_a_moved_child_graph_is_refused_before_the_driver_unless_all_it_names_is_the_sessions(
        sessions: Sessions) -> None:
    driver, a, b, made = sessions
    mine, handle, node = made["b.graph"], made["b.handle"], made["b.node"]
    (child,) = b.ok("cuGraphCreate", 0)
    (inner,) = b.ok("cuGraphAddEmptyNode", child, [])
    since = len(driver.calls)
    refused = {
        "the parent itself": b.status(*_moved(mine, mine)),
        "another session's graph moved": b.status(*_moved(mine, made["a.graph"])),
        "into another session's graph": b.status(*_moved(made["a.graph"], child)),
        "an unknown graph": b.status(*_moved(mine, 0xBAD0)),
        "another session's dependency": b.status(*_moved(mine, child, [(made["a.node"],)])),
        "edge data with reserved bytes": b.status(*_moved(mine, child, [(node,)], [(1 << 40,)])),
        "an ownership cuda.h does not have": b.status(*_moved(mine, child, ownership=2)),
        "a node type cuda.h does not have": b.status(*_moved(mine, child, kind=99)),
        # not what the guest sends: a cloned child graph (cuGraphAddChildGraphNode's), another node type, or fields
        # of the other kind of node set (one union in cuda.h's struct)
        "malformed: a cloned child graph": b.status(*_moved(mine, child, ownership=CLONE)),
        "malformed: a kernel node": b.status(*_moved(mine, child, kind=KERNEL_NODE)),
        "malformed: a conditional handle with a moved graph": b.status(*_moved(mine, child, handle=handle)),
        "malformed: a moved graph with a conditional node": b.status(
            "cuGraphAddNode", mine, CONDITIONAL_NODE, handle, IF, 1, 0, child, MOVE, [], []),
        "malformed: edges that do not pair with the dependencies": b.status(*_moved(mine, child, [(node,)],
                                                                                    [(0,), (0,)])),
    }
    assert refused == {name: Status.MALFORMED if name.startswith("malformed") else INVALID_VALUE for name in refused}
    assert _saw(driver, since, "cuGraphAddNode") == 0
    made_node, graphs = b.ok(*_moved(mine, child, [(node,)], [(0,)]))
    assert graphs == [] and _saw(driver, since, "cuGraphAddNode") == 1
    # the moved graph and its nodes stay the session's (and not the other one's)
    assert b.status("cuGraphAddEmptyNode", child, []) == 0 and b.status("cuGraphNodeGetType", inner) == 0
    assert a.status("cuGraphAddEmptyNode", child, []) == INVALID_VALUE
    assert a.status("cuGraphNodeGetDependencies", made_node, 1) == INVALID_VALUE
    # a cycle: the parent moved into the graph it now holds, refused before the driver
    assert b.status(*_moved(child, mine)) == INVALID_VALUE and _saw(driver, since, "cuGraphAddNode") == 1
    # the driver judges the moved graph destroyed on its own (cuda.h: it cannot be); it is still the session's
    since = len(driver.calls)
    assert b.status("cuGraphDestroy", child) == INVALID_VALUE and _saw(driver, since, "cuGraphDestroy") == 1
    assert b.status("cuGraphAddEmptyNode", child, []) == 0
    # a graph moved into the moved graph; the parent destroyed takes both: they leave the session with it, so a
    # later call never hands the driver a graph it freed
    (grandchild,) = b.ok("cuGraphCreate", 0)
    b.ok(*_moved(child, grandchild))
    assert b.status("cuGraphDestroy", mine) == 0
    since = len(driver.calls)
    assert b.status("cuGraphDestroy", child) == INVALID_VALUE and b.status("cuGraphDestroy", grandchild) == \
        INVALID_VALUE
    assert b.status("cuGraphAddEmptyNode", child, []) == INVALID_VALUE and _saw(driver, since, "cuGraphDestroy") == 0
    assert driver.calls[since:] == []
    # a moved graph's node destroyed takes it too
    (parent,) = b.ok("cuGraphCreate", 0)
    (held,) = b.ok("cuGraphCreate", 0)
    holder, _ = b.ok(*_moved(parent, held))
    assert b.status("cuGraphDestroyNode", holder) == 0
    since = len(driver.calls)
    assert b.status("cuGraphDestroy", held) == INVALID_VALUE and driver.calls[since:] == []
    assert b.status("cuGraphDestroy", parent) == 0
