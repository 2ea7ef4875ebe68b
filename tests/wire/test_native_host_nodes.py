"""Graph host nodes and host functions captured into graphs (guest_runtime/native/host_functions.c, graph_calls.c;
host_agent/session/host_nodes.py) against a real agent whose sessions run the executor over the fake driver
(tests/forwarding_rig.py), the native guest driver loaded with ctypes in a subprocess (test_native_callbacks's
helpers). What the program's functions saw is compared with what CUDA specifies (one call per run of a node, in the
graph's order, with the node's own data); what the driver was handed (the trampoline, the host's address of the
token's words) is read in the fake's journal. A hostile request (words outside the session's page-locked memory, a
stream not the session's, a short payload) is refused before the driver. CPU only: tests/gpu/programs/
host_node_program.py runs the same families on the GPU, natively and forwarded."""
from __future__ import annotations

import ctypes
import re
from pathlib import Path
from typing import Any

import pytest

from ivshmem.driver_api import CALLS, HOST_NODE_FUNCTION_OPCODE, HOST_NODE_FUNCTION_REQUEST
from ivshmem.record import Status
from tests import forwarding_rig
from tests.forwarding_rig import Rig, local_only
from tests.wire.program_runs import forwarded_and_on_the_fake
from tests.wire.test_native_callbacks import run

SUCCESS, INVALID_VALUE, INVALID_HANDLE, NOT_SUPPORTED = 0, 1, 400, 801
CAPTURE_UNSUPPORTED, CAPTURE_INVALIDATED = 900, 901
NODE_TYPE_HOST = 3
bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures

GRAPHS = r"""
class HostParams(ctypes.Structure):
    _fields_ = [("fn", c_void_p), ("userData", c_void_p)]
for name, args in {
    "cuGraphCreate": [P, c_uint], "cuGraphAddHostNode": [P, P, P, c_size_t, P], "cuGraphInstantiate": [P, P, c_uint64],
    "cuGraphLaunch": [P, P], "cuGraphHostNodeGetParams": [P, P], "cuGraphHostNodeSetParams": [P, P],
    "cuGraphExecHostNodeSetParams": [P, P, P], "cuGraphNodeGetType": [P, P], "cuGraphGetNodes": [P, P, P],
    "cuGraphAddNode": [P, P, P, P, c_size_t, P], "cuGraphAddEmptyNode": [P, P, P, c_size_t],
    "cuGraphExecDestroy": [P], "cuGraphDestroy": [P],
}.items():
    getattr(lib, name).argtypes = args
calls = []
def on_host(data):
    calls.append(data or 0)
fn = HOSTFN(on_host)
fn_address = ctypes.cast(fn, c_void_p).value
def params(data, function=fn_address):
    return HostParams(function, data)
def made(call, *args):
    handle = c_void_p()
    status = getattr(lib, call)(byref(handle), *args)
    assert status == 0, (call, status)
    return handle.value
def launch(exe, s, times=1):
    for _ in range(times):
        assert lib.cuGraphLaunch(exe, s) == 0
    assert lib.cuStreamSynchronize(s) == 0
    ran = list(calls)
    calls.clear()
    return ran
def node_types(graph):
    count = c_size_t(0)
    assert lib.cuGraphGetNodes(graph, None, byref(count)) == 0
    nodes = (c_void_p * count.value)()
    assert lib.cuGraphGetNodes(graph, nodes, byref(count)) == 0
    kinds = []
    for node in nodes:
        kind = c_int(-1)
        assert lib.cuGraphNodeGetType(node, byref(kind)) == 0
        kinds.append(kind.value)
    return kinds
"""

NODES = r"""
s = stream(1)
out["fn"] = fn_address
graph = made("cuGraphCreate", 0)
first = made("cuGraphAddHostNode", graph, None, 0, byref(params(1)))
second = made("cuGraphAddHostNode", graph, byref(c_void_p(first)), 1, byref(params(2)))
out["types"] = node_types(graph)
exe = made("cuGraphInstantiate", graph, 0)
out["three_launches"] = launch(exe, s, 3)
got = HostParams()
out["get"] = lib.cuGraphHostNodeGetParams(second, byref(got))
out["got"] = [got.fn == fn_address, got.userData]
out["exec_set"] = lib.cuGraphExecHostNodeSetParams(exe, first, byref(params(10)))
out["after_exec_set"] = launch(exe, s)
out["node_set"] = lib.cuGraphHostNodeSetParams(first, byref(params(20)))
out["exec_keeps_its_own"] = launch(exe, s)
fresh = made("cuGraphInstantiate", graph, 0)
out["fresh_exec"] = launch(fresh, s)
generic = (ctypes.c_ubyte * 256)()
struct.pack_into("<i", generic, 0, 3)  # CU_GRAPH_NODE_TYPE_HOST
struct.pack_into("<QQ", generic, 16, fn_address, 30)
lone = c_void_p()
out["add_node"] = lib.cuGraphAddNode(byref(lone), graph, None, None, 0, generic)
third = made("cuGraphInstantiate", graph, 0)
out["with_generic"] = sorted(launch(third, s))
out["null_fn"] = lib.cuGraphAddHostNode(byref(lone), graph, None, 0, byref(HostParams(None, 5)))
out["null_params"] = lib.cuGraphAddHostNode(byref(lone), graph, None, 0, None)
out["null_get"] = lib.cuGraphHostNodeGetParams(first, None)
empty = made("cuGraphAddEmptyNode", graph, None, 0)
out["get_of_empty"] = lib.cuGraphHostNodeGetParams(empty, byref(got))
out["still_no_calls"] = list(calls)
"""

CAPTURE = r"""
s, other = stream(1), stream(1)
page = pinned(4096)
memory = device(64)
assert lib.cuStreamBeginCapture(s, 0) == 0  # CU_STREAM_CAPTURE_MODE_GLOBAL
assert lib.cuMemsetD32Async(memory, 7, 1, s) == 0
out["captured_function"] = lib.cuLaunchHostFunc(s, fn, 40)
# while the capture is under way, a host function on a stream that is not capturing still runs, in its order
seen = []
def after_copy(data):
    seen.append(word(page).value)
kept = HOSTFN(after_copy)
assert lib.cuMemsetD32Async(memory + 4, 0xFEED, 1, other) == 0
assert lib.cuMemcpyDtoHAsync(page, memory + 4, 4, other) == 0
out["uncaptured_function"] = lib.cuLaunchHostFunc(other, kept, 0)
assert lib.cuStreamSynchronize(other) == 0
out["uncaptured_saw"] = list(seen)
out["runs_before_end"] = list(calls)
captured = c_void_p()
out["end"] = lib.cuStreamEndCapture(s, byref(captured))
out["captured_types"] = node_types(captured)
exe = made("cuGraphInstantiate", captured, 0)
out["replays"] = launch(exe, s, 2)
"""


@local_only("a relayed session's GPU host cannot reach the guest's words: host nodes answer NOT_SUPPORTED there")
def test_host_nodes_run_the_guests_function_once_a_run_in_graph_order(library: Path, rig: Rig) -> None:
    mark = rig.mark()
    out, _ = run(library, rig, GRAPHS + NODES)
    assert out["types"] == [NODE_TYPE_HOST, NODE_TYPE_HOST]
    assert out["three_launches"] == [1, 2] * 3
    assert out["get"] == SUCCESS and out["got"] == [True, 2]
    assert out["exec_set"] == SUCCESS and out["after_exec_set"] == [10, 2]
    assert out["node_set"] == SUCCESS and out["exec_keeps_its_own"] == [10, 2]  # an exec keeps what it was given
    assert out["fresh_exec"] == [20, 2]
    assert out["add_node"] == SUCCESS and out["with_generic"] == [2, 20, 30]
    assert [out[k] for k in ("null_fn", "null_params", "null_get")] == [INVALID_VALUE] * 3
    assert out["get_of_empty"] == INVALID_VALUE  # the driver's answer for a node that is not a host node
    assert out["still_no_calls"] == []
    # the driver was handed the trampoline and the host's address of each pair's words, never the guest's function
    handed = [_host_params(entry) for entry in rig.entries(mark, "cuGraphAddHostNode")]
    assert len(handed) == 3 and len({fn for fn, _ in handed}) == 1 and out["fn"] not in {fn for fn, _ in handed}
    assert len({data for _, data in handed}) == 3  # one token per (function, data) pair


@local_only("a relayed session's GPU host cannot reach the guest's words: host nodes answer NOT_SUPPORTED there")
def test_a_host_function_captured_is_a_host_node_that_runs_at_each_replay(library: Path, rig: Rig) -> None:
    out, _ = run(library, rig, GRAPHS + CAPTURE)
    assert out["captured_function"] == SUCCESS and out["runs_before_end"] == []  # captured, not run
    assert out["uncaptured_function"] == SUCCESS and out["uncaptured_saw"] == [0xFEED]  # in its stream's order
    assert out["end"] == SUCCESS
    assert NODE_TYPE_HOST in out["captured_types"]
    assert out["replays"] == [40, 40]


RELAYED_CASE = r"""
s = stream(1)
graph = made("cuGraphCreate", 0)
node = c_void_p()
out["add"] = lib.cuGraphAddHostNode(byref(node), graph, None, 0, byref(params(1)))
assert lib.cuStreamBeginCapture(s, 0) == 0
out["captured_function"] = lib.cuLaunchHostFunc(s, fn, 2)
captured = c_void_p()
out["end"] = lib.cuStreamEndCapture(s, byref(captured))
out["calls"] = list(calls)
"""


@local_only("a relayed session's GPU host cannot reach the guest's words: host nodes answer NOT_SUPPORTED there")
def test_the_gpu_program_gives_through_the_native_driver_what_it_gives_on_the_fake(library: Path, rig: Rig) -> None:
    """tests/gpu/programs/host_node_program.py (cuda-python, the program the GPU compares natively and forwarded)
    through the native driver against the rig's fake, and on the fake directly in its own process (`--fake`): the
    same values."""
    forwarded, on_the_fake = forwarded_and_on_the_fake("host_node_program.py", library, rig)
    assert forwarded["ok"] is True and forwarded == on_the_fake


@pytest.mark.skipif(not forwarding_rig.RELAYED, reason="what a relayed session answers instead")
def test_a_relayed_session_answers_host_nodes_not_supported_and_refuses_a_captured_function(
        library: Path, rig: Rig) -> None:
    out, stderr = run(library, rig, GRAPHS + RELAYED_CASE)
    assert out["add"] == NOT_SUPPORTED and "a graph host node on a relayed session" in stderr
    assert out["captured_function"] == CAPTURE_UNSUPPORTED and out["end"] == CAPTURE_INVALIDATED
    assert out["calls"] == []


@local_only("the request goes to the local session's executor")
def test_words_outside_the_sessions_page_locked_memory_are_refused_before_the_driver(rig: Rig) -> None:
    g = rig.guest()
    g.setup()
    graph = g.ok("cuGraphCreate", 0)
    stream = g.ok("cuStreamCreate", 1)
    pinned = ctypes_alloc_host(g, 4096)
    add = CALLS["cuGraphAddHostNode"]
    mark = rig.mark()
    for words, expected in ((0x1000, INVALID_VALUE), (pinned + 4096 - 4, INVALID_VALUE), (pinned + 2, INVALID_VALUE),
                            (pinned + 8, SUCCESS)):
        record = g.channel.call(add.opcode, add.request.encode(graph, words, []))
        assert record.status == expected, hex(words)
    assert len(rig.entries(mark, "cuGraphAddHostNode")) == 1  # only the good one reached the driver
    function = HOST_NODE_FUNCTION_REQUEST
    assert g.channel.call(HOST_NODE_FUNCTION_OPCODE, function.encode(0xDEAD000, pinned)).status == INVALID_HANDLE
    assert g.channel.call(HOST_NODE_FUNCTION_OPCODE, function.encode(stream, 0x1000)).status == INVALID_VALUE
    assert g.channel.call(HOST_NODE_FUNCTION_OPCODE, b"\0" * 12).status == Status.MALFORMED
    assert not rig.entries(mark, "cuLaunchHostFunc")


def ctypes_alloc_host(g: Any, size: int) -> int:
    cell = ctypes.c_uint64()
    assert g.fn["cuMemAllocHost"](ctypes.addressof(cell), size) == SUCCESS
    return cell.value


def _host_params(entry: dict[str, Any]) -> tuple[int, int]:
    """(fn, userData) of the CUDA_HOST_NODE_PARAMS a journal entry shows (its repr, as the fake records structs)."""
    found = re.search(r"fn=\['CUhostFn', (\d+)\], userData=(\d+)", entry["args"][-1])
    assert found is not None, entry
    return int(found[1]), int(found[2])

