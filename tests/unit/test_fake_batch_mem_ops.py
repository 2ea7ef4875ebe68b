"""The fake driver's batch memory operations and batch memory-operation nodes (tests/fake_driver.py), called directly as
the executor calls `cuda.bindings.driver`: cuStreamBatchMemOp's writes and waits of 32 and 64 bits in array order under
the stream rules (a wait holds the stream's later work back until another stream's write meets it), what it refuses,
a capture of it making one BATCH_MEM_OP node, nodes added, asked back, set on the graph and on an executable graph
(under cuda.h's rule for what may change), replayed in order, cloned and carried by child graphs, the journal's
picture of the operations, and the wheel-like types held to the installed wheel's layout and behaviour (the one that
matters most: a CUDA_BATCH_MEM_OP_NODE_PARAMS filled in C reads `paramArray` as []).
tests/gpu/programs/batch_mem_op_program.py runs over the fake too (its --fake mode). CPU only."""
from __future__ import annotations

import ctypes
import importlib.util
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fake_driver import (
    CUDA_BATCH_MEM_OP_NODE_PARAMS,
    CUgraphNodeType,
    CUresult,
    CUstreamBatchMemOpParams,
    CUstreamBatchMemOpType,
    FakeDriver,
    batch_ops_at,
    plain,
    read_journal,
)

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "tests" / "gpu" / "programs" / "batch_mem_op_program.py"
SUCCESS, INVALID_VALUE = CUresult.CUDA_SUCCESS, CUresult.CUDA_ERROR_INVALID_VALUE
BATCH, MEMSET, MEMCPY = (CUgraphNodeType.CU_GRAPH_NODE_TYPE_BATCH_MEM_OP, CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMSET,
                         CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMCPY)
WAIT32, WRITE32, FLUSH, WAIT64, WRITE64, BARRIER, ATOMIC = 1, 2, 3, 4, 5, 6, 8
GEQ, EQ, AND, NOR, WAIT_FLUSH = 0, 1, 2, 3, 1 << 30
NON_BLOCKING = 1
BYTES = 256


@pytest.fixture
def fake() -> FakeDriver:
    """A fake with one GPU, initialised, its primary context current."""
    driver = FakeDriver(devices=1)
    assert driver.cuInit(0)[0] == SUCCESS
    _, device = driver.cuDeviceGet(0)
    _, context = driver.cuDevicePrimaryCtxRetain(device)
    assert driver.cuCtxSetCurrent(context)[0] == SUCCESS
    return driver


@pytest.fixture
def memory(fake: FakeDriver) -> Iterator[int]:
    """The base address of BYTES of zeroed device memory."""
    pointer = _ok(fake.cuMemAlloc(BYTES))
    assert fake.cuMemsetD32(pointer, 0, BYTES // 4)[0] == SUCCESS
    yield int(pointer)
    fake.cuMemFree(pointer)


def _ok(result: tuple[Any, ...]) -> Any:
    assert result[0] == SUCCESS, result
    return result[1] if len(result) == 2 else result[1:]


def _op(kind: int, address: int = 0, value: int = 0, flags: int = 0) -> CUstreamBatchMemOpParams:
    """A CUstreamBatchMemOpParams as a program fills one: the tag, then its member's fields."""
    params = CUstreamBatchMemOpParams()
    params.operation = kind
    if kind in (BARRIER, FLUSH):
        member: Any = params.memoryBarrier if kind == BARRIER else params.flushRemoteWrites
    else:
        member = params.waitValue if kind in (WAIT32, WAIT64) else params.writeValue
        member.address = address
        if kind in (WAIT64, WRITE64):
            member.value64 = value
        else:
            member.value = value
    member.operation = kind
    member.flags = flags
    return params


def _node_params(ops: list[CUstreamBatchMemOpParams], ctx: Any = 0, count: int | None = None) -> Any:
    params = CUDA_BATCH_MEM_OP_NODE_PARAMS()
    params.ctx, params.paramArray, params.count = ctx, ops, len(ops) if count is None else count
    return params


def _read(fake: FakeDriver, address: int, size: int = 4) -> int:
    buffer = bytearray(size)
    assert fake.cuMemcpyDtoH(buffer, address, size)[0] == SUCCESS
    return int.from_bytes(buffer, "little")


def _types(fake: FakeDriver, graph: Any) -> list[int]:
    count = _ok(fake.cuGraphGetNodes(graph))[1]
    nodes = _ok(fake.cuGraphGetNodes(graph, count))[0]
    return [int(_ok(fake.cuGraphNodeGetType(node))) for node in nodes]


def _ops(params: Any, base: int) -> list[list[int]]:
    """[operation, address - base, value, flags] of each operation `params` points at."""
    return [[d["operation"], d["address"] - base if d["address"] else 0, d["value"], d["flags"]]
            for d in (plain(op) for op in batch_ops_at(params))]


# --- cuStreamBatchMemOp --------------------------------------------------------------------------------------------

def test_a_batch_writes_32_and_64_bits_and_a_met_wait_in_stream_order(fake: FakeDriver, memory: int) -> None:
    stream = _ok(fake.cuStreamCreate(NON_BLOCKING))
    batch = [_op(WRITE32, memory, 0xC0DE0001), _op(WRITE64, memory + 8, 0x1122334455667788),
             _op(WAIT32, memory, 0xC0DE0001, GEQ), _op(WRITE32, memory + 16, 0xC0DE0002), _op(BARRIER, flags=1),
             _op(FLUSH)]
    assert fake.cuStreamBatchMemOp(stream, len(batch), batch, 0) == (SUCCESS,)
    assert _read(fake, memory) == 0  # a non-blocking stream's work runs when something waits for it
    assert fake.cuStreamSynchronize(stream)[0] == SUCCESS
    assert [_read(fake, memory), _read(fake, memory + 8, 8), _read(fake, memory + 16)] == [
        0xC0DE0001, 0x1122334455667788, 0xC0DE0002]
    assert fake.cuStreamBatchMemOp(0, 1, [_op(WRITE32, memory + 20, 5)], 0) == (SUCCESS,)  # legacy: at once
    assert _read(fake, memory + 20) == 5
    assert fake.cuStreamBatchMemOp(0, 1, (_op(WRITE64, memory + 24, 1 << 63),), 0) == (SUCCESS,)  # a tuple too
    assert _read(fake, memory + 24, 8) == 1 << 63


def test_only_count_operations_are_read_and_a_shorter_list_is_the_wheels_error(fake: FakeDriver, memory: int) -> None:
    ops = [_op(WRITE32, memory, 1), _op(WRITE32, memory + 4, 2)]
    assert fake.cuStreamBatchMemOp(0, 1, ops, 0) == (SUCCESS,)
    assert [_read(fake, memory), _read(fake, memory + 4)] == [1, 0]
    with pytest.raises(RuntimeError, match="List is too small"):
        fake.cuStreamBatchMemOp(0, 3, ops, 0)
    with pytest.raises(TypeError):
        fake.cuStreamBatchMemOp(0, 1, [5], 0)
    with pytest.raises(TypeError):
        fake.cuStreamBatchMemOp(0, 1, ops[0], 0)


def test_a_wait_holds_back_a_later_copy_until_a_write_on_another_stream(fake: FakeDriver, memory: int) -> None:
    flag, source, target = memory, memory + 64, memory + 128
    assert fake.cuMemsetD32(source, 0xABCD, 4)[0] == SUCCESS
    waiting = _ok(fake.cuStreamCreate(0))  # blocking: its work runs at once, unless a wait holds it back
    writer = _ok(fake.cuStreamCreate(0))
    assert fake.cuStreamBatchMemOp(waiting, 1, [_op(WAIT32, flag, 7, EQ)], 0) == (SUCCESS,)
    assert fake.cuMemcpyDtoDAsync(target, source, 16, waiting)[0] == SUCCESS
    assert _read(fake, target) == 0  # held back by the wait
    assert fake.cuStreamSynchronize(waiting)[0] == CUresult.CUDA_ERROR_LAUNCH_TIMEOUT  # nothing can meet it yet
    assert _read(fake, target) == 0
    assert fake.cuStreamBatchMemOp(writer, 2, [_op(WRITE32, flag, 6), _op(WRITE32, flag, 7)], 0) == (SUCCESS,)
    assert fake.cuStreamSynchronize(waiting)[0] == SUCCESS
    assert _read(fake, target) == 0xABCD


def test_64_bit_waits_compare_64_bits_and_the_conditions_are_the_single_calls(fake: FakeDriver, memory: int) -> None:
    word = memory + 8
    assert fake.cuStreamBatchMemOp(0, 1, [_op(WRITE64, word, 0x1_0000_0005)], 0) == (SUCCESS,)
    met = [(WAIT64, 0x1_0000_0005, EQ), (WAIT64, 0x1_0000_0000, GEQ), (WAIT64, 0x1_0000_0000, AND),
           (WAIT64, 0xFFFF_FFFE_FFFF_FFF8, NOR), (WAIT64, 0xFFFF_FFFF_FFFF_FFFF, GEQ),  # cyclic: -1 <= the word
           (WAIT64, 0x1_0000_0005, EQ | WAIT_FLUSH)]
    stream = _ok(fake.cuStreamCreate(0))
    for kind, value, condition in met:
        assert fake.cuStreamBatchMemOp(stream, 1, [_op(kind, word, value, condition)], 0) == (SUCCESS,)
        assert fake.cuStreamQuery(stream)[0] == SUCCESS, (hex(value), condition)
    assert fake.cuStreamBatchMemOp(stream, 1, [_op(WAIT64, word, 5, EQ)], 0) == (SUCCESS,)  # only the low half
    assert fake.cuStreamQuery(stream)[0] == CUresult.CUDA_ERROR_NOT_READY
    assert FakeDriver.wait_satisfied(5, 0xFFFF_FFFF, GEQ) and not FakeDriver.wait_satisfied(5, 0xFFFF_FFFF, GEQ, 64)


def test_what_cu_stream_batch_mem_op_refuses(fake: FakeDriver, memory: int) -> None:
    stream = _ok(fake.cuStreamCreate(0))
    good = _op(WRITE32, memory, 1)
    refused = {
        "count 256": (256, [_op(BARRIER)] * 256, 0), "flags": (1, [good], 1),
        "NULL array": (1, None, 0), "unknown operation": (1, [_op(7, memory, 1)], 0),
        "unaligned 32": (1, [_op(WRITE32, memory + 2, 1)], 0), "unaligned 64": (1, [_op(WAIT64, memory + 4, 1)], 0),
        "past the allocation": (1, [_op(WRITE64, memory + BYTES - 4, 1)], 0),
        "no memory": (1, [_op(WRITE32, 0x1000, 1)], 0), "wait condition": (1, [_op(WAIT32, memory, 1, 4)], 0),
        "write flags": (1, [_op(WRITE32, memory, 1, 2)], 0), "barrier flags": (1, [_op(BARRIER, flags=2)], 0),
        "flush flags": (1, [_op(FLUSH, flags=1)], 0),
        "all or nothing": (2, [good, _op(WRITE32, 0x1000, 1)], 0),
    }
    for name, (count, ops, flags) in refused.items():
        assert fake.cuStreamBatchMemOp(stream, count, ops, flags) == (INVALID_VALUE,), name
    assert fake.cuStreamBatchMemOp(stream, 1, [_op(ATOMIC, memory, 1)], 0) == (CUresult.CUDA_ERROR_NOT_SUPPORTED,)
    assert _read(fake, memory) == 0  # none of them wrote
    assert fake.cuStreamBatchMemOp(stream, 0, [], 0) == (SUCCESS,)  # nothing to do (the H200 answers so)
    assert fake.cuStreamBatchMemOp(stream, 255, [_op(BARRIER)] * 254 + [good], 0) == (SUCCESS,)  # cuda.h: < 256
    assert _read(fake, memory) == 1
    assert fake.cuStreamBatchMemOp(fake.CUstream(0xBAD0), 1, [good], 0) == (CUresult.CUDA_ERROR_INVALID_HANDLE,)
    lone = FakeDriver(devices=1)
    assert lone.cuStreamBatchMemOp(0, 1, [good], 0) == (CUresult.CUDA_ERROR_NOT_INITIALIZED,)
    lone.cuInit(0)
    assert lone.cuStreamBatchMemOp(0, 1, [good], 0) == (CUresult.CUDA_ERROR_INVALID_CONTEXT,)


def test_registered_host_memory_is_written_and_waited_on_by_its_device_address(fake: FakeDriver) -> None:
    cells = (ctypes.c_uint64 * 4)()
    address = ctypes.addressof(cells)
    assert fake.cuMemHostRegister(address, ctypes.sizeof(cells), 0)[0] == SUCCESS
    assert fake.cuStreamBatchMemOp(0, 2, [_op(WRITE64, address, 1 << 40), _op(WRITE32, address + 8, 9)], 0) == (
        SUCCESS,)
    assert [cells[0], cells[1]] == [1 << 40, 9]
    assert fake.cuStreamBatchMemOp(0, 1, [_op(WAIT64, address, 1 << 40, EQ)], 0) == (SUCCESS,)
    assert fake.cuStreamQuery(0)[0] == SUCCESS
    assert fake.cuMemHostUnregister(address)[0] == SUCCESS


# --- capture ---------------------------------------------------------------------------------------------------------

def test_a_captured_batch_is_one_node_that_keeps_its_operations_and_writes_on_every_replay(
        fake: FakeDriver, memory: int) -> None:
    stream = _ok(fake.cuStreamCreate(NON_BLOCKING))
    assert fake.cuStreamBeginCapture(stream, fake.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)[0] == SUCCESS
    assert fake.cuMemsetD32Async(memory + 64, 3, 4, stream)[0] == SUCCESS
    ops = [_op(WRITE32, memory, 0xA1), _op(WRITE64, memory + 8, 0xB2 << 32), _op(WAIT32, memory + 64, 3, EQ)]
    assert fake.cuStreamBatchMemOp(stream, 1, [_op(WRITE32, 0x1000, 1)], 0) == (INVALID_VALUE,)  # the capture goes on
    assert fake.cuStreamBatchMemOp(stream, len(ops), ops, 0) == (SUCCESS,)
    graph = _ok(fake.cuStreamEndCapture(stream))
    assert _types(fake, graph) == [MEMSET, BATCH]
    assert _read(fake, memory) == 0  # captured work runs only when the graph does
    node = _ok(fake.cuGraphGetNodes(graph, 2))[0][1]
    asked = _ok(fake.cuGraphBatchMemOpNodeGetParams(node))
    assert (asked.count, asked.flags, asked.paramArray) == (3, 0, [])
    assert _ops(asked, memory) == [[WRITE32, 0, 0xA1, 0], [WRITE64, 8, 0xB2 << 32, 0], [WAIT32, 64, 3, EQ]]
    graph_exec = _ok(fake.cuGraphInstantiate(graph, 0))
    for _ in range(2):
        assert fake.cuMemsetD32(memory, 0, 4)[0] == SUCCESS
        assert fake.cuGraphLaunch(graph_exec, stream)[0] == SUCCESS
        assert fake.cuStreamSynchronize(stream)[0] == SUCCESS
        assert [_read(fake, memory), _read(fake, memory + 8, 8)] == [0xA1, 0xB2 << 32]  # written again


def test_a_capture_invalidated_takes_no_batch_node(fake: FakeDriver, memory: int) -> None:
    stream = _ok(fake.cuStreamCreate(NON_BLOCKING))
    fake.cuStreamBeginCapture(stream, fake.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
    assert fake.cuStreamSynchronize(stream)[0] == CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    assert fake.cuStreamBatchMemOp(stream, 1, [_op(WRITE32, memory, 1)], 0) == (
        CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,)
    assert fake.cuStreamEndCapture(stream)[0] == CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
    assert _read(fake, memory) == 0


# --- nodes -----------------------------------------------------------------------------------------------------------

def test_add_get_set_and_exec_set_round_trip(fake: FakeDriver, memory: int) -> None:
    ctx = _ok(fake.cuCtxGetCurrent())
    graph = _ok(fake.cuGraphCreate(0))
    node = _ok(fake.cuGraphAddBatchMemOpNode(graph, None, 0, _node_params([_op(WRITE32, memory, 1)], ctx)))
    assert _types(fake, graph) == [BATCH]
    asked = _ok(fake.cuGraphBatchMemOpNodeGetParams(node))
    assert isinstance(asked, CUDA_BATCH_MEM_OP_NODE_PARAMS)
    assert (int(asked.ctx), asked.count, asked.flags, asked.paramArray) == (int(ctx), 1, 0, [])  # the wheel's []
    assert _ops(asked, memory) == [[WRITE32, 0, 1, 0]]
    assert struct.unpack_from("<QI4xQI", ctypes.string_at(asked.getPtr(), 28))[:2] == (int(ctx), 1)  # cuda.h's layout
    first_exec = _ok(fake.cuGraphInstantiate(graph, 0))

    assert fake.cuGraphBatchMemOpNodeSetParams(node, _node_params([_op(WRITE32, memory, 2)])) == (SUCCESS,)
    asked_again = _ok(fake.cuGraphBatchMemOpNodeGetParams(node))
    assert (int(asked_again.ctx), _ops(asked_again, memory)) == (0, [[WRITE32, 0, 2, 0]])  # NULL, as given
    second_exec = _ok(fake.cuGraphInstantiate(graph, 0))
    seen = []
    for graph_exec in (second_exec, first_exec):
        assert fake.cuGraphLaunch(graph_exec, 0)[0] == SUCCESS
        seen.append(_read(fake, memory))
    assert seen == [2, 1]  # an executable graph keeps what it was made from

    changed = _node_params([_op(WRITE32, memory + 4, 3)])  # address and value may change
    assert fake.cuGraphExecBatchMemOpNodeSetParams(first_exec, node, changed) == (SUCCESS,)
    assert fake.cuGraphLaunch(first_exec, 0)[0] == SUCCESS
    assert [_read(fake, memory), _read(fake, memory + 4)] == [1, 3]  # the first launch above left 1 at +0
    assert _ops(_ok(fake.cuGraphBatchMemOpNodeGetParams(node)), memory) == [[WRITE32, 0, 2, 0]]  # the graph's own


def test_exec_set_params_holds_to_cuda_h_rule(fake: FakeDriver, memory: int) -> None:
    graph = _ok(fake.cuGraphCreate(0))
    ops = [_op(WAIT32, memory + 32, 0, GEQ), _op(WRITE32, memory, 1), _op(BARRIER)]
    node = _ok(fake.cuGraphAddBatchMemOpNode(graph, None, 0, _node_params(ops)))
    graph_exec = _ok(fake.cuGraphInstantiate(graph, 0))
    refused = {
        "count": [_op(WAIT32, memory + 32, 0), _op(WRITE32, memory, 1)],
        "operation": [_op(WAIT32, memory + 32, 0), _op(WRITE64, memory, 1), _op(BARRIER)],
        "wait FLUSH bit": [_op(WAIT32, memory + 32, 0, GEQ | WAIT_FLUSH), _op(WRITE32, memory, 1), _op(BARRIER)],
        "write flags": [_op(WAIT32, memory + 32, 0), _op(WRITE32, memory, 1, 1), _op(BARRIER)],
        "barrier flags": [_op(WAIT32, memory + 32, 0), _op(WRITE32, memory, 1), _op(BARRIER, flags=1)],
    }
    for name, changed in refused.items():
        assert fake.cuGraphExecBatchMemOpNodeSetParams(graph_exec, node, _node_params(changed)) == (
            INVALID_VALUE,), name
    other = _ok(fake.cuCtxCreate(None, 0, _ok(fake.cuDeviceGet(0))))  # another context: refused
    assert fake.cuCtxPopCurrent()[0] == SUCCESS
    assert fake.cuGraphExecBatchMemOpNodeSetParams(graph_exec, node, _node_params(ops, other)) == (INVALID_VALUE,)
    ctx = _ok(fake.cuCtxGetCurrent())  # the current one given, where NULL was: the same context
    assert fake.cuGraphExecBatchMemOpNodeSetParams(graph_exec, node, _node_params(ops, ctx)) == (SUCCESS,)
    allowed = [_op(WAIT32, memory + 36, 5, NOR), _op(WRITE32, memory + 4, 9), _op(BARRIER)]  # condition may change
    assert fake.cuGraphExecBatchMemOpNodeSetParams(graph_exec, node, _node_params(allowed)) == (SUCCESS,)
    assert fake.cuGraphLaunch(graph_exec, 0)[0] == SUCCESS
    assert [_read(fake, memory), _read(fake, memory + 4)] == [0, 9]


def test_batch_node_parameters_are_refused_as_the_driver_refuses_them(fake: FakeDriver, memory: int) -> None:
    graph = _ok(fake.cuGraphCreate(0))
    good = _op(WRITE32, memory, 1)
    refused = {
        "NULL": None, "no operations": _node_params([]), "count past the array": _node_params([good], count=2),
        "no memory": _node_params([_op(WRITE32, 0x1000, 1)]), "flags": _node_params([good]),
        "unknown operation": _node_params([_op(7, memory, 1)]),
    }
    refused["flags"].flags = 1
    for name, params in refused.items():
        assert fake.cuGraphAddBatchMemOpNode(graph, None, 0, params) == (INVALID_VALUE, None), name
    unset = CUDA_BATCH_MEM_OP_NODE_PARAMS()
    unset.count = 1  # a count and no array: NULL
    assert fake.cuGraphAddBatchMemOpNode(graph, None, 0, unset) == (INVALID_VALUE, None)
    assert fake.cuGraphAddBatchMemOpNode(graph, None, 0, _node_params([good], ctx=0xBAD0)) == (
        CUresult.CUDA_ERROR_INVALID_CONTEXT, None)
    with pytest.raises(TypeError):
        fake.cuGraphAddBatchMemOpNode(graph, None, 0, 5)  # the wheel takes only its CUDA_BATCH_MEM_OP_NODE_PARAMS
    assert _types(fake, graph) == []

    node = _ok(fake.cuGraphAddBatchMemOpNode(graph, None, 0, _node_params([good])))
    memset_params = fake.CUDA_MEMSET_NODE_PARAMS()
    memset_params.dst, memset_params.value, memset_params.elementSize, memset_params.width, memset_params.height = (
        memory, 0, 4, 1, 1)
    memset = _ok(fake.cuGraphAddMemsetNode(graph, None, 0, memset_params, 0))
    for other in (memset, fake.CUgraphNode(0xBAD0)):
        assert fake.cuGraphBatchMemOpNodeGetParams(other) == (INVALID_VALUE, None)
        assert fake.cuGraphBatchMemOpNodeSetParams(other, _node_params([good])) == (INVALID_VALUE,)
    assert fake.cuGraphBatchMemOpNodeSetParams(node, _node_params([_op(WRITE32, 0x1000, 1)])) == (INVALID_VALUE,)
    assert _ops(_ok(fake.cuGraphBatchMemOpNodeGetParams(node)), memory) == [[WRITE32, 0, 1, 0]]  # unchanged
    graph_exec = _ok(fake.cuGraphInstantiate(graph, 0))
    elsewhere = _ok(fake.cuGraphCreate(0))
    foreign = _ok(fake.cuGraphAddBatchMemOpNode(elsewhere, None, 0, _node_params([good])))
    assert fake.cuGraphExecBatchMemOpNodeSetParams(graph_exec, foreign, _node_params([good])) == (INVALID_VALUE,)
    assert fake.cuGraphExecBatchMemOpNodeSetParams(graph_exec, memset, _node_params([good])) == (INVALID_VALUE,)
    assert fake.cuGraphExecBatchMemOpNodeSetParams(fake.CUgraphExec(0xBAD0), node, _node_params([good])) == (
        INVALID_VALUE,)


def test_replay_runs_operations_in_array_order_and_nodes_after_their_dependencies(
        fake: FakeDriver, memory: int) -> None:
    graph = _ok(fake.cuGraphCreate(0))
    later = _ok(fake.cuGraphAddBatchMemOpNode(graph, None, 0, _node_params([_op(WRITE32, memory, 30)])))
    first = _ok(fake.cuGraphAddBatchMemOpNode(graph, None, 0, _node_params(
        [_op(WRITE32, memory, 10), _op(WRITE32, memory, 20), _op(WRITE32, memory + 4, 1)])))
    assert fake.cuGraphAddDependencies(graph, [first], [later], None, 1)[0] == SUCCESS  # added last, runs first
    assert fake.cuGraphLaunch(_ok(fake.cuGraphInstantiate(graph, 0)), 0)[0] == SUCCESS
    assert [_read(fake, memory), _read(fake, memory + 4)] == [30, 1]

    # a node's wait holds back its launch stream's later work until another stream's write meets it
    flag, out = memory + 64, memory + 68
    waits = _ok(fake.cuGraphCreate(0))
    _ok(fake.cuGraphAddBatchMemOpNode(waits, None, 0, _node_params([_op(WAIT32, flag, 1, EQ), _op(WRITE32, out, 9)])))
    stream = _ok(fake.cuStreamCreate(NON_BLOCKING))
    assert fake.cuGraphLaunch(_ok(fake.cuGraphInstantiate(waits, 0)), stream)[0] == SUCCESS
    assert fake.cuStreamSynchronize(stream)[0] == CUresult.CUDA_ERROR_LAUNCH_TIMEOUT
    assert _read(fake, out) == 0
    assert fake.cuStreamBatchMemOp(0, 1, [_op(WRITE32, flag, 1)], 0) == (SUCCESS,)
    assert fake.cuStreamSynchronize(stream)[0] == SUCCESS
    assert _read(fake, out) == 9


def test_clones_child_graphs_and_exec_update_carry_batch_nodes(fake: FakeDriver, memory: int) -> None:
    graph = _ok(fake.cuGraphCreate(0))
    _ok(fake.cuGraphAddBatchMemOpNode(graph, None, 0, _node_params([_op(WRITE32, memory, 1)])))
    clone = _ok(fake.cuGraphClone(graph))
    assert _types(fake, clone) == [BATCH]
    clone_node = _ok(fake.cuGraphGetNodes(clone, 1))[0][0]
    assert fake.cuGraphBatchMemOpNodeSetParams(clone_node, _node_params([_op(WRITE32, memory, 2)])) == (SUCCESS,)
    parent = _ok(fake.cuGraphCreate(0))
    _ok(fake.cuGraphAddChildGraphNode(parent, None, 0, graph))
    seen = []
    for made in (clone, parent):
        assert fake.cuGraphLaunch(_ok(fake.cuGraphInstantiate(made, 0)), 0)[0] == SUCCESS
        seen.append(_read(fake, memory))
    assert seen == [2, 1]  # the clone's node is its own
    graph_exec = _ok(fake.cuGraphInstantiate(graph, 0))
    assert fake.cuGraphExecUpdate(graph_exec, clone)[0] == SUCCESS  # the same shape: the clone's parameters
    assert fake.cuGraphLaunch(graph_exec, 0)[0] == SUCCESS
    assert _read(fake, memory) == 2


def test_a_node_whose_memory_was_freed_does_nothing_when_it_runs(fake: FakeDriver) -> None:
    gone = _ok(fake.cuMemAlloc(64))
    graph = _ok(fake.cuGraphCreate(0))
    _ok(fake.cuGraphAddBatchMemOpNode(graph, None, 0, _node_params([_op(WRITE32, int(gone), 1),
                                                                   _op(WAIT32, int(gone) + 4, 1, EQ)])))
    graph_exec = _ok(fake.cuGraphInstantiate(graph, 0))
    assert fake.cuMemFree(gone)[0] == SUCCESS
    assert fake.cuGraphLaunch(graph_exec, 0)[0] == SUCCESS  # where a GPU would fault
    assert fake.cuStreamSynchronize(0)[0] == SUCCESS


# --- the journal and the types ---------------------------------------------------------------------------------------

def test_the_journal_holds_the_operations_as_dicts(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    fake = FakeDriver(devices=1, journal=str(journal))
    fake.cuInit(0)
    _, context = fake.cuDevicePrimaryCtxRetain(_ok(fake.cuDeviceGet(0)))
    fake.cuCtxSetCurrent(context)
    memory = int(_ok(fake.cuMemAlloc(64)))
    fake.cuStreamBatchMemOp(0, 2, [_op(WRITE64, memory + 8, 1 << 40), _op(BARRIER, flags=1)], 0)
    graph = _ok(fake.cuGraphCreate(0))
    node = _ok(fake.cuGraphAddBatchMemOpNode(graph, None, 0, _node_params([_op(WAIT32, memory, 3, EQ)])))
    fake.cuGraphBatchMemOpNodeGetParams(node)
    entries = {entry["name"]: entry for entry in read_journal(journal)}
    assert entries["cuStreamBatchMemOp"]["args"] == [0, 2, [
        {"operation": WRITE64, "address": memory + 8, "value": 1 << 40, "flags": 0},
        {"operation": BARRIER, "address": 0, "value": 0, "flags": 1}], 0]
    wait = {"operation": WAIT32, "address": memory, "value": 3, "flags": EQ}
    assert entries["cuGraphAddBatchMemOpNode"]["args"][3] == {"ctx": 0, "count": 1, "flags": 0, "paramArray": [wait]}
    assert entries["cuGraphBatchMemOpNodeGetParams"]["result"][1]["paramArray"] == [wait]
    assert json.loads(json.dumps(entries)) == entries


def test_the_types_are_unions_over_c_memory_as_the_wheels_are() -> None:
    op = CUstreamBatchMemOpParams()
    with pytest.raises(ValueError):
        op.operation  # noqa: B018 - 0 is no CUstreamBatchMemOpType, as the wheel's getter says
    op.operation = CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_64
    assert op.writeValue.operation == op.waitValue.operation == CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_64
    op.writeValue.value64 = 0x1_0000_0007
    assert (int(op.writeValue.value), int(op.waitValue.value64)) == (7, 0x1_0000_0007)  # value is value64's low half
    op.writeValue.address = 0x1000
    assert int(op.waitValue.address) == 0x1000 and isinstance(op.waitValue.address, FakeDriver.CUdeviceptr)
    assert ctypes.string_at(op.getPtr(), 24) == struct.pack("<i4xQQ", 5, 0x1000, 0x1_0000_0007)
    assert int(CUstreamBatchMemOpParams(_ptr=op.getPtr()).writeValue.value64) == 0x1_0000_0007  # a view
    other = CUstreamBatchMemOpParams()
    other.writeValue = op.writeValue  # a copy of the member's bytes
    op.writeValue.value = 1
    assert int(other.writeValue.value) == 7
    op.operation = 99  # taken, as the wheel takes it; read back, refused
    with pytest.raises(ValueError):
        op.operation  # noqa: B018
    for bad in (-1, 1 << 32):
        with pytest.raises(OverflowError):
            op.writeValue.value = bad
    with pytest.raises(OverflowError):
        op.writeValue.flags = -1

    params = CUDA_BATCH_MEM_OP_NODE_PARAMS()
    params.paramArray = [op, other]
    assert params.count == 0  # setting paramArray does not set count, as the wheel's
    op.writeValue.value = 2
    listed = params.paramArray
    assert [int(item.writeValue.value) for item in listed] == [1, 7]  # copied when set
    listed[0].writeValue.value = 3
    assert int(params.paramArray[0].writeValue.value) == 1  # each read lists copies
    for not_a_list in (None, op):
        with pytest.raises(TypeError):
            params.paramArray = not_a_list


def test_the_types_match_the_installed_wheel() -> None:
    """The same operations filled through the wheel's types and the fake's give the same C bytes, and a
    CUDA_BATCH_MEM_OP_NODE_PARAMS filled in C (as the driver fills cuGraphBatchMemOpNodeGetParams') reads paramArray
    as [] in both."""
    wheel = pytest.importorskip("cuda.bindings.driver")
    for driver in (wheel, FakeDriver):
        assert {m.name: int(m) for m in FakeDriver.CUstreamBatchMemOpType}.items() <= {
            m.name: int(m) for m in driver.CUstreamBatchMemOpType}.items()

    def filled(driver: Any) -> list[bytes]:
        made = []
        for kind, address, value, flags in ((WRITE32, 0x1000, 7, 1), (WAIT64, 0x2008, 1 << 40, NOR | WAIT_FLUSH),
                                            (BARRIER, 0, 0, 1), (FLUSH, 0, 0, 0)):
            op = driver.CUstreamBatchMemOpParams()
            op.operation = kind
            if kind in (BARRIER, FLUSH):
                member = op.memoryBarrier if kind == BARRIER else op.flushRemoteWrites
            else:
                member = op.waitValue if kind == WAIT64 else op.writeValue
                member.address = address
                if kind == WAIT64:
                    member.value64 = value
                else:
                    member.value = value
            member.operation, member.flags = kind, flags
            made.append(ctypes.string_at(op.getPtr(), 48))
        return made

    assert filled(wheel) == filled(FakeDriver)
    ops = (ctypes.c_char * 96).from_buffer_copy(b"".join(filled(FakeDriver)[:2]))
    for driver in (wheel, FakeDriver):
        params = driver.CUDA_BATCH_MEM_OP_NODE_PARAMS()
        ctypes.memmove(params.getPtr(), struct.pack("<QI4xQI", 0, 2, ctypes.addressof(ops), 0), 28)
        assert (int(params.count), list(params.paramArray)) == (2, [])
        first = driver.CUstreamBatchMemOpParams(_ptr=ctypes.addressof(ops))
        assert (int(first.operation), int(first.writeValue.address), int(first.writeValue.value)) == (
            WRITE32, 0x1000, 7)
        params.paramArray = [first]
        assert int(params.count) == 2 and len(params.paramArray) == 1


# --- the GPU program, over the fake --------------------------------------------------------------------------------

def test_the_gpu_program_runs_over_the_fake() -> None:
    """tests/gpu/programs/batch_mem_op_program.py's logic over the fake (its --fake mode, in this process): `ok`, and
    the values the fake's rules give (not yet compared with a GPU's)."""
    spec = importlib.util.spec_from_file_location("batch_mem_op_program", PROGRAM)  # a program, not a module
    assert spec is not None and spec.loader is not None
    program = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)
    got = json.loads(json.dumps(program.run(FakeDriver(devices=1), probe_limits=True)))
    at_node = [WRITE32, program.AT_NODE, 0, 0]

    def asked(value: int, count: int = 1, ops: list[list[int]] | None = None) -> dict[str, Any]:
        return {"error": 0, "count": count, "flags": 0, "ctx_is_ours": True, "param_array_attribute": 0,
                "ops": ops or [[*at_node[:2], value, 0]]}

    assert got == {
        "ok": True,
        "attributes": {"CAN_USE_STREAM_MEM_OPS_V1": 0, "CAN_USE_64_BIT_STREAM_MEM_OPS": 1,
                       "CAN_USE_STREAM_WAIT_VALUE_NOR": 1, "CAN_FLUSH_REMOTE_WRITES": 0},
        "stream_words": [program.FIRST, program.WIDE, program.READY, program.AFTER],
        "graph": {"nodes": 2, "types": [int(BATCH), int(MEMCPY)], "sorted_types": [int(MEMCPY), int(BATCH)],
                  "edges": 1},
        "launches": [program.ADDED] * 2,
        "get_params": asked(program.ADDED), "get_params_after_set": asked(program.SET_ON_GRAPH),
        "set_launches": [program.SET_ON_GRAPH, program.ADDED, program.SET_ON_EXEC, program.SET_ON_GRAPH],
        "get_params_after_exec_set": asked(program.SET_ON_GRAPH),
        "before_replay": [0, 0],
        "captured_graph": {"nodes": 1, "types": [int(BATCH)], "sorted_types": [int(BATCH)], "edges": 0},
        "captured_get_params": asked(0, 2, [[WRITE32, program.AT_CAPTURED, program.CAPTURED, 0],
                                            [WRITE64, program.AT_CAPTURED_WIDE, program.CAPTURED_WIDE, 0]]),
        "replayed": [program.CAPTURED, program.CAPTURED_WIDE],
        "limits": {"count_0": [0, 0], "count_255": [0, 0], "count_256": [1, 0], "flags_1": [1, 0]},
    }
