"""The fake driver's host functions and graph host nodes (tests/fake_driver.py), called directly as the executor calls
`cuda.bindings.driver`: cuLaunchHostFunc runs a real C function (a ctypes callback) in stream order, a graph's host
nodes run in dependency order on every launch, their parameters come back as set and their setters change what runs
(on the graph's node or on an executable graph's copy), a capture of cuLaunchHostFunc makes a host node, and
clones, child graphs and cuGraphExecUpdate carry host nodes. tests/gpu/programs/host_node_program.py gives over the
fake what it gave natively on an H200. CPU only."""
from __future__ import annotations

import ctypes
import importlib.util
import json
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fake_driver import (
    HOST_FN,
    CUgraphNodeType,
    CUhostFn,
    CUresult,
    FakeDriver,
    read_journal,
)

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "tests" / "gpu" / "programs" / "host_node_program.py"
SUCCESS, INVALID_VALUE, INVALID_HANDLE = CUresult.CUDA_SUCCESS, CUresult.CUDA_ERROR_INVALID_VALUE, \
    CUresult.CUDA_ERROR_INVALID_HANDLE
HOST, MEMSET = CUgraphNodeType.CU_GRAPH_NODE_TYPE_HOST, CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMSET
NON_BLOCKING = 1
WORDS = 16
# What tests/gpu/programs/host_node_program.py printed natively on an H200 (driver 580.159.04, cuda-bindings 13.3.1).
NATIVE_H200: dict[str, Any] = {
    "add_null_function": 1, "calls_while_capturing": 0, "captured_calls": [212, 212],
    "captured_graph": {"edges": 2, "nodes": 3, "sorted_types": [2, 2, 3], "types": [2, 3, 2]},
    "captured_memory": 3235775250, "get_params": [True, 161], "get_params_after_exec_set": [True, 178],
    "get_params_after_set": [True, 178], "get_params_of_a_memset_node": 1, "ok": True,
    "ordered_calls": [[161, 3235775233, 3235775233]] * 3, "ordered_carried": [1001, 1002, 1003],
    "ordered_graph": {"edges": 3, "nodes": 4, "sorted_types": [1, 1, 2, 3], "types": [2, 1, 3, 1]},
    "params_calls": [178, 161, 195], "params_carried": [1004, 1005, 1006], "params_saw_the_memset": [True] * 3,
    "probe_graph": {"edges": 0, "nodes": 1, "sorted_types": [2], "types": [2]}, "set_params_of_a_memset_node": 1,
}


class HostFunction:
    """A real C host function, `void fn(void *userData)` made with ctypes: each call appends its userData to `calls`
    and what `look()` answered then to `seen`. The test holds it (and so its callback) for its whole run."""

    def __init__(self, look: Callable[[], Any] = lambda: None) -> None:
        self.calls: list[int] = []
        self.seen: list[Any] = []
        self._look = look
        self.function = HOST_FN(self._called)
        self.address: int = ctypes.cast(self.function, ctypes.c_void_p).value or 0

    def _called(self, data: int | None) -> None:
        self.calls.append(data or 0)
        self.seen.append(self._look())


@pytest.fixture
def fake() -> FakeDriver:
    """A fake with one GPU, initialised, its primary context current."""
    driver = FakeDriver(devices=1)
    assert driver.cuInit(0)[0] == SUCCESS
    _, device = driver.cuDeviceGet(0)
    _, context = driver.cuDevicePrimaryCtxRetain(device)
    assert driver.cuCtxSetCurrent(context)[0] == SUCCESS
    return driver


def _ok(result: tuple[Any, ...]) -> Any:
    assert result[0] == SUCCESS, result
    return result[1] if len(result) == 2 else result[1:]


def _word(fake: FakeDriver, pointer: Any) -> int:
    """The first u32 of device memory at the start of an allocation, as the fake holds it now."""
    value: int = struct.unpack_from("<I", fake.memory[int(pointer)])[0]
    return value


def _params(fake: FakeDriver, fn: Any, user_data: int) -> Any:
    params = fake.CUDA_HOST_NODE_PARAMS()
    params.fn, params.userData = fn, user_data
    return params


def _memset_params(fake: FakeDriver, dst: Any, value: int) -> Any:
    params = fake.CUDA_MEMSET_NODE_PARAMS()
    params.dst, params.pitch, params.value, params.elementSize, params.width, params.height = dst, 0, value, 4, WORDS, 1
    return params


def _types(fake: FakeDriver, graph: Any) -> list[int]:
    count = _ok(fake.cuGraphGetNodes(graph))[1]
    nodes = _ok(fake.cuGraphGetNodes(graph, count))[0]
    return [int(_ok(fake.cuGraphNodeGetType(node))) for node in nodes]


@pytest.fixture
def memory(fake: FakeDriver) -> Iterator[tuple[Any, Any]]:
    """Two allocations of WORDS u32 each, zeroed."""
    made = [_ok(fake.cuMemAlloc(4 * WORDS)) for _ in range(2)]
    for pointer in made:
        assert fake.cuMemsetD32(pointer, 0, WORDS)[0] == SUCCESS
    yield made[0], made[1]
    for pointer in made:
        fake.cuMemFree(pointer)


# --- cuLaunchHostFunc ------------------------------------------------------------------------------------------------

def test_a_host_function_runs_in_stream_order_after_the_streams_earlier_copy_and_memset(
        fake: FakeDriver, memory: tuple[Any, Any]) -> None:
    source, target = memory
    host = HostFunction(lambda: _word(fake, target))
    stream = _ok(fake.cuStreamCreate(NON_BLOCKING))
    assert fake.cuMemsetD32Async(source, 5, WORDS, stream)[0] == SUCCESS
    assert fake.cuMemcpyDtoDAsync(target, source, 4 * WORDS, stream)[0] == SUCCESS
    assert fake.cuLaunchHostFunc(stream, CUhostFn(host.address), 1)[0] == SUCCESS  # a CUhostFn ...
    assert fake.cuMemsetD32Async(target, 9, WORDS, stream)[0] == SUCCESS
    assert fake.cuLaunchHostFunc(stream, host.address, 2)[0] == SUCCESS  # ... or a plain int address
    assert host.calls == []  # a non-blocking stream's work runs when something waits for it
    assert fake.cuStreamSynchronize(stream)[0] == SUCCESS
    assert host.calls == [1, 2] and host.seen == [5, 9]
    assert fake.host_calls == [(host.address, 1), (host.address, 2)]


def test_on_the_legacy_stream_and_a_blocking_stream_a_host_function_runs_at_once(fake: FakeDriver) -> None:
    host = HostFunction()
    blocking = _ok(fake.cuStreamCreate(0))
    assert fake.cuLaunchHostFunc(0, host.address, 3)[0] == SUCCESS
    assert host.calls == [3]
    assert fake.cuLaunchHostFunc(blocking, host.address, None)[0] == SUCCESS  # userData NULL
    assert host.calls == [3, 0]


def test_cu_launch_host_func_refuses_as_the_driver_does() -> None:
    host = HostFunction()
    fake = FakeDriver(devices=1)
    assert fake.cuLaunchHostFunc(0, host.address, 1)[0] == CUresult.CUDA_ERROR_NOT_INITIALIZED
    fake.cuInit(0)
    assert fake.cuLaunchHostFunc(0, host.address, 1)[0] == CUresult.CUDA_ERROR_INVALID_CONTEXT
    _, context = fake.cuDevicePrimaryCtxRetain(_ok(fake.cuDeviceGet(0)))
    fake.cuCtxSetCurrent(context)
    for null in (CUhostFn(0), 0, None):
        assert fake.cuLaunchHostFunc(0, null, 1)[0] == INVALID_VALUE
    assert fake.cuLaunchHostFunc(0xBAD0, host.address, 1)[0] == INVALID_HANDLE
    assert fake.cuLaunchHostFunc(0xBAD0, None, 1)[0] == INVALID_VALUE  # the function is checked before the stream
    with pytest.raises(TypeError):
        fake.cuLaunchHostFunc(0, host.function, 1)  # the wheel takes an address, not a ctypes function
    with pytest.raises(TypeError):
        fake.cuLaunchHostFunc(0, host.address, "data")
    assert host.calls == [] and fake.host_calls == []


def test_the_journal_holds_function_and_user_data_as_numbers(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    fake = FakeDriver(devices=1, journal=str(journal))
    fake.cuInit(0)
    _, context = fake.cuDevicePrimaryCtxRetain(_ok(fake.cuDeviceGet(0)))
    fake.cuCtxSetCurrent(context)
    host = HostFunction()
    fake.cuLaunchHostFunc(0, CUhostFn(host.address), 7)
    graph = _ok(fake.cuGraphCreate(0))
    fake.cuGraphAddHostNode(graph, None, 0, _params(fake, CUhostFn(host.address), 8))
    entries = {entry["name"]: entry for entry in read_journal(journal)}
    assert entries["cuLaunchHostFunc"]["host_fn"] == {"fn": host.address, "userData": 7}
    assert entries["cuLaunchHostFunc"]["args"][1:] == [["CUhostFn", host.address], 7]
    assert entries["cuGraphAddHostNode"]["host_node"] == {"fn": host.address, "userData": 8}
    assert json.loads(json.dumps(entries)) == entries


# --- host nodes ----------------------------------------------------------------------------------------------------

def test_two_host_nodes_run_in_dependency_order_on_every_launch(fake: FakeDriver) -> None:
    host = HostFunction()
    graph = _ok(fake.cuGraphCreate(0))
    second = _ok(fake.cuGraphAddHostNode(graph, None, 0, _params(fake, CUhostFn(host.address), 2)))
    first = _ok(fake.cuGraphAddHostNode(graph, None, 0, _params(fake, host.address, 1)))
    assert fake.cuGraphAddDependencies(graph, [first], [second], None, 1)[0] == SUCCESS  # added last, runs first
    assert _types(fake, graph) == [HOST, HOST]
    graph_exec = _ok(fake.cuGraphInstantiate(graph, 0))
    stream = _ok(fake.cuStreamCreate(NON_BLOCKING))
    for _ in range(2):
        assert fake.cuGraphLaunch(graph_exec, stream)[0] == SUCCESS
    assert host.calls == []
    assert fake.cuStreamSynchronize(stream)[0] == SUCCESS
    assert host.calls == [1, 2, 1, 2]


def test_get_params_gives_back_what_was_set(fake: FakeDriver, memory: tuple[Any, Any]) -> None:
    host, other = HostFunction(), HostFunction()
    graph = _ok(fake.cuGraphCreate(0))
    node = _ok(fake.cuGraphAddHostNode(graph, None, 0, _params(fake, CUhostFn(host.address), 0xA1)))
    asked = _ok(fake.cuGraphHostNodeGetParams(node))
    assert isinstance(asked, fake.CUDA_HOST_NODE_PARAMS) and isinstance(asked.fn, CUhostFn)
    assert (int(asked.fn), asked.userData) == (host.address, 0xA1)
    assert fake.cuGraphHostNodeSetParams(node, _params(fake, other.address, 0xB2))[0] == SUCCESS
    asked = _ok(fake.cuGraphHostNodeGetParams(node))
    assert (int(asked.fn), asked.userData) == (other.address, 0xB2)
    assert fake.cuGraphHostNodeSetParams(node, asked)[0] == SUCCESS  # what comes back is valid parameters
    memset = _ok(fake.cuGraphAddMemsetNode(graph, None, 0, _memset_params(fake, memory[0], 1), 0))
    for not_host in (memset, fake.CUgraphNode(0xBAD0)):
        assert fake.cuGraphHostNodeGetParams(not_host) == (INVALID_VALUE, None)
        assert fake.cuGraphHostNodeSetParams(not_host, _params(fake, host.address, 1))[0] == INVALID_VALUE
    assert host.calls == other.calls == []


def test_host_node_parameters_are_refused_as_the_driver_refuses_them(fake: FakeDriver) -> None:
    host = HostFunction()
    graph = _ok(fake.cuGraphCreate(0))
    for null in (CUhostFn(0), 0, None):
        assert fake.cuGraphAddHostNode(graph, None, 0, _params(fake, null, 1)) == (INVALID_VALUE, None)
    assert fake.cuGraphAddHostNode(graph, None, 0, None) == (INVALID_VALUE, None)
    with pytest.raises(TypeError):
        fake.cuGraphAddHostNode(graph, None, 0, 5)  # the wheel takes only its CUDA_HOST_NODE_PARAMS
    assert _types(fake, graph) == []
    node = _ok(fake.cuGraphAddHostNode(graph, None, 0, _params(fake, host.address, 1)))
    assert fake.cuGraphHostNodeSetParams(node, _params(fake, 0, 2))[0] == INVALID_VALUE
    assert _ok(fake.cuGraphHostNodeGetParams(node)).userData == 1  # unchanged


def test_set_params_and_exec_set_params_change_what_runs(fake: FakeDriver, memory: tuple[Any, Any]) -> None:
    host, other = HostFunction(), HostFunction()
    graph = _ok(fake.cuGraphCreate(0))
    node = _ok(fake.cuGraphAddHostNode(graph, None, 0, _params(fake, host.address, 1)))
    first_exec = _ok(fake.cuGraphInstantiate(graph, 0))
    assert fake.cuGraphHostNodeSetParams(node, _params(fake, host.address, 2))[0] == SUCCESS
    second_exec = _ok(fake.cuGraphInstantiate(graph, 0))
    assert fake.cuGraphLaunch(second_exec, 0)[0] == SUCCESS  # the graph's node as set
    assert fake.cuGraphLaunch(first_exec, 0)[0] == SUCCESS  # an executable graph keeps what it was made from
    assert host.calls == [2, 1]
    assert fake.cuGraphExecHostNodeSetParams(first_exec, node, _params(fake, other.address, 3))[0] == SUCCESS
    assert fake.cuGraphLaunch(first_exec, 0)[0] == SUCCESS
    assert fake.cuGraphLaunch(second_exec, 0)[0] == SUCCESS
    assert (host.calls, other.calls) == ([2, 1, 2], [3])
    asked = _ok(fake.cuGraphHostNodeGetParams(node))
    assert (int(asked.fn), asked.userData) == (host.address, 2)  # the graph's node keeps its own

    elsewhere = _ok(fake.cuGraphCreate(0))
    foreign = _ok(fake.cuGraphAddHostNode(elsewhere, None, 0, _params(fake, host.address, 4)))
    memset = _ok(fake.cuGraphAddMemsetNode(graph, None, 0, _memset_params(fake, memory[0], 1), 0))
    assert fake.cuGraphExecHostNodeSetParams(first_exec, foreign, _params(fake, host.address, 5))[0] == INVALID_VALUE
    assert fake.cuGraphExecHostNodeSetParams(first_exec, memset, _params(fake, host.address, 5))[0] == INVALID_VALUE
    third_exec = _ok(fake.cuGraphInstantiate(graph, 0))
    assert fake.cuGraphExecHostNodeSetParams(third_exec, memset, _params(fake, host.address, 5))[0] == INVALID_VALUE
    assert fake.cuGraphExecHostNodeSetParams(first_exec, node, _params(fake, 0, 6))[0] == INVALID_VALUE
    assert fake.cuGraphExecHostNodeSetParams(fake.CUgraphExec(0xBAD0), node,
                                             _params(fake, host.address, 7))[0] == INVALID_VALUE
    assert fake.cuGraphLaunch(first_exec, 0)[0] == SUCCESS
    assert other.calls == [3, 3]  # none of the refused changes took


def test_a_captured_host_function_is_a_host_node_that_every_replay_calls(
        fake: FakeDriver, memory: tuple[Any, Any]) -> None:
    words = memory[0]
    host = HostFunction(lambda: _word(fake, words))
    stream = _ok(fake.cuStreamCreate(NON_BLOCKING))
    assert fake.cuStreamBeginCapture(stream, fake.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)[0] == SUCCESS
    assert fake.cuMemsetD32Async(words, 5, WORDS, stream)[0] == SUCCESS
    assert fake.cuLaunchHostFunc(stream, None, 7)[0] == INVALID_VALUE  # refused, the capture goes on
    assert fake.cuLaunchHostFunc(stream, CUhostFn(host.address), 7)[0] == SUCCESS
    assert fake.cuMemsetD32Async(words, 9, WORDS, stream)[0] == SUCCESS
    graph = _ok(fake.cuStreamEndCapture(stream))
    assert host.calls == [] and _word(fake, words) == 0  # captured work runs only when the graph does
    assert _types(fake, graph) == [MEMSET, HOST, MEMSET]
    host_node = _ok(fake.cuGraphGetNodes(graph, 3))[0][1]
    asked = _ok(fake.cuGraphHostNodeGetParams(host_node))  # as an H200 answers for a captured host node
    assert (int(asked.fn), asked.userData) == (host.address, 7)
    graph_exec = _ok(fake.cuGraphInstantiate(graph, 0))
    for _ in range(2):
        assert fake.cuGraphLaunch(graph_exec, stream)[0] == SUCCESS
        assert fake.cuStreamSynchronize(stream)[0] == SUCCESS
    assert host.calls == [7, 7] and host.seen == [5, 5]  # after the first memset, before the second
    assert _word(fake, words) == 9


def test_a_capture_invalidated_takes_no_host_node(fake: FakeDriver) -> None:
    host = HostFunction()
    stream = _ok(fake.cuStreamCreate(NON_BLOCKING))
    fake.cuStreamBeginCapture(stream, fake.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
    assert fake.cuStreamSynchronize(stream)[0] == CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED  # invalidates it
    assert fake.cuLaunchHostFunc(stream, host.address, 1)[0] == CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
    assert fake.cuStreamEndCapture(stream)[0] == CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
    assert host.calls == []


def test_clones_child_graphs_and_exec_update_carry_host_nodes(fake: FakeDriver) -> None:
    host = HostFunction()
    graph = _ok(fake.cuGraphCreate(0))
    first = _ok(fake.cuGraphAddHostNode(graph, None, 0, _params(fake, host.address, 1)))
    _ok(fake.cuGraphAddHostNode(graph, [first], 1, _params(fake, host.address, 2)))
    clone = _ok(fake.cuGraphClone(graph))
    assert _types(fake, clone) == [HOST, HOST]
    clone_first = _ok(fake.cuGraphGetNodes(clone, 2))[0][0]
    assert _ok(fake.cuGraphHostNodeGetParams(clone_first)).userData == 1
    assert fake.cuGraphHostNodeSetParams(clone_first, _params(fake, host.address, 10))[0] == SUCCESS
    assert _ok(fake.cuGraphHostNodeGetParams(first)).userData == 1  # the original's node is its own
    parent = _ok(fake.cuGraphCreate(0))
    _ok(fake.cuGraphAddChildGraphNode(parent, None, 0, graph))
    for made in (clone, parent):
        assert fake.cuGraphLaunch(_ok(fake.cuGraphInstantiate(made, 0)), 0)[0] == SUCCESS
    assert host.calls == [10, 2, 1, 2]

    graph_exec = _ok(fake.cuGraphInstantiate(graph, 0))
    assert fake.cuGraphExecUpdate(graph_exec, clone)[0] == SUCCESS  # the same shape: the clone's parameters
    assert fake.cuGraphLaunch(graph_exec, 0)[0] == SUCCESS
    assert host.calls[4:] == [10, 2]


# --- the GPU program, over the fake --------------------------------------------------------------------------------

def test_the_gpu_program_gives_over_the_fake_what_it_gave_on_an_h200() -> None:
    """tests/gpu/programs/host_node_program.py's logic over the fake (its --fake mode, in this process): the values
    an H200 gave natively, the fake's rules for host functions included."""
    spec = importlib.util.spec_from_file_location("host_node_program", PROGRAM)  # a program, not a module
    assert spec is not None and spec.loader is not None
    program = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)
    got = json.loads(json.dumps(program.run(FakeDriver(devices=1))))
    assert got == NATIVE_H200
