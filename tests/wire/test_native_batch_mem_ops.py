"""Batch memory operations and batch memory-operation nodes (guest_runtime/native/batch_mem_ops.c;
host_agent/session/batch_mem_ops.py) against a real agent whose sessions run the executor over the fake driver
(tests/forwarding_rig.py), the native guest driver loaded with ctypes in a subprocess (test_native_callbacks's
helpers). Values written by the operations are read back from device memory and compared with what the program
asked for; what the guest refuses itself (an atomic reduction: 801; an operation cuda.h lacks, a NULL array) and what
the host refuses (an address outside the session's memory) are checked too. CPU only: tests/gpu/programs/
batch_mem_op_program.py runs the same families on the GPU, natively and forwarded."""
from __future__ import annotations

from pathlib import Path

from tests import forwarding_rig
from tests.forwarding_rig import Rig, local_only
from tests.wire.program_runs import forwarded_and_on_the_fake
from tests.wire.test_native_callbacks import run
from tests.wire.test_native_host_nodes import GRAPHS

SUCCESS, INVALID_VALUE, NOT_SUPPORTED = 0, 1, 801
NODE_TYPE_BATCH_MEM_OP = 12
bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures

BATCH = r"""
for name, args in {
    "cuStreamBatchMemOp": [P, c_uint, P, c_uint], "cuGraphAddBatchMemOpNode": [P, P, P, c_size_t, P],
    "cuGraphBatchMemOpNodeGetParams": [P, P], "cuGraphBatchMemOpNodeSetParams": [P, P],
    "cuGraphExecBatchMemOpNodeSetParams": [P, P, P], "cuMemcpyDtoH": [P, c_uint64, c_size_t],
}.items():
    getattr(lib, name).argtypes = args
class NodeParams(ctypes.Structure):
    _fields_ = [("ctx", c_void_p), ("count", c_uint), ("paramArray", c_void_p), ("flags", c_uint)]
def ops(*specs):  # (operation, address, value, flags, wide)
    array = (ctypes.c_ubyte * (48 * len(specs)))()
    for i, (operation, address, value, flags, wide) in enumerate(specs):
        struct.pack_into("<iIQ", array, 48 * i, operation, flags if operation in (3, 6) else 0, address)
        struct.pack_into("<Q" if wide else "<I", array, 48 * i + 16, value)
        if operation not in (3, 6):
            struct.pack_into("<I", array, 48 * i + 24, flags)
    return array
def read(address, size=8):
    buffer = ctypes.create_string_buffer(size)
    assert lib.cuMemcpyDtoH(buffer, address, size) == 0
    return int.from_bytes(buffer.raw, "little")
WAIT32, WRITE32, FLUSH, WAIT64, WRITE64, BARRIER, ATOMIC = 1, 2, 3, 4, 5, 6, 8
"""

STREAM = r"""
s = stream(1)
d = device(64)
batch = ops((WRITE32, d, 0x11111111, 0, False), (WRITE64, d + 8, 0x2222222233333333, 0, True),
            (WAIT32, d, 0x11111111, 0, False), (BARRIER, 0, 0, 1, False), (FLUSH, 0, 0, 0, False))
out["batch"] = lib.cuStreamBatchMemOp(s, 5, batch, 0)
assert lib.cuStreamSynchronize(s) == 0
out["written"] = [read(d, 4), read(d + 8)]
out["atomic"] = lib.cuStreamBatchMemOp(s, 1, ops((ATOMIC, d, 1, 0, True)), 0)
out["unknown"] = lib.cuStreamBatchMemOp(s, 1, ops((7, d, 1, 0, True)), 0)
out["null_array"] = lib.cuStreamBatchMemOp(s, 1, None, 0)
out["foreign"] = [lib.cuStreamBatchMemOp(s, 1, ops((WRITE32, 0x1000, 1, 0, False)), 0), lib.cuStreamSynchronize(s)]
"""

NODES = r"""
s = stream(1)
d = device(64)
graph = made("cuGraphCreate", 0)
first = ops((WRITE32, d + 16, 5, 0, False))
node = made("cuGraphAddBatchMemOpNode", graph, None, 0, byref(NodeParams(None, 1, ctypes.addressof(first), 0)))
out["types"] = node_types(graph)
exe = made("cuGraphInstantiate", graph, 0)
launch(exe, s)
out["launched"] = read(d + 16, 4)
got = NodeParams()
out["get"] = lib.cuGraphBatchMemOpNodeGetParams(node, byref(got))
item = ctypes.string_at(got.paramArray, 48)
out["got"] = [got.count, got.flags, got.ctx or 0, struct.unpack_from("<i", item)[0],
              struct.unpack_from("<Q", item, 8)[0] - d, struct.unpack_from("<I", item, 16)[0]]
second = ops((WRITE32, d + 16, 6, 0, False))
out["set"] = lib.cuGraphBatchMemOpNodeSetParams(node, byref(NodeParams(None, 1, ctypes.addressof(second), 0)))
launch(exe, s)
out["exec_keeps_its_own"] = read(d + 16, 4)
launch(made("cuGraphInstantiate", graph, 0), s)
out["fresh_exec"] = read(d + 16, 4)
third = ops((WRITE32, d + 16, 7, 0, False))
out["exec_set"] = lib.cuGraphExecBatchMemOpNodeSetParams(exe, node,
                                                          byref(NodeParams(None, 1, ctypes.addressof(third), 0)))
launch(exe, s)
out["after_exec_set"] = read(d + 16, 4)
generic = (ctypes.c_ubyte * 256)()
fourth = ops((WRITE32, d + 24, 8, 0, False))
struct.pack_into("<i", generic, 0, 12)  # CU_GRAPH_NODE_TYPE_BATCH_MEM_OP
struct.pack_into("<QIxxxxQI", generic, 16, 0, 1, ctypes.addressof(fourth), 0)
lone = c_void_p()
out["add_node"] = lib.cuGraphAddNode(byref(lone), graph, None, None, 0, generic)
launch(made("cuGraphInstantiate", graph, 0), s)
out["generic_wrote"] = read(d + 24, 4)
out["foreign_node"] = lib.cuGraphAddBatchMemOpNode(byref(lone), graph, None, 0, byref(
    NodeParams(None, 1, ctypes.addressof(ops((WRITE32, 0x1000, 1, 0, False))), 0)))
out["null_params"] = lib.cuGraphAddBatchMemOpNode(byref(lone), graph, None, 0, None)
cap = stream(1)
assert lib.cuStreamBeginCapture(cap, 0) == 0
out["captured"] = lib.cuStreamBatchMemOp(cap, 1, ops((WRITE32, d + 32, 9, 0, False)), 0)
captured = c_void_p()
out["end"] = lib.cuStreamEndCapture(cap, byref(captured))
out["before_replay"] = read(d + 32, 4)
out["captured_types"] = node_types(captured)
launch(made("cuGraphInstantiate", captured, 0), s)
out["replayed"] = read(d + 32, 4)
"""


def test_a_batch_of_operations_writes_and_waits_in_order_and_bad_ones_are_refused(library: Path, rig: Rig) -> None:
    out, stderr = run(library, rig, GRAPHS + BATCH + STREAM)
    assert out["batch"] == SUCCESS and out["written"] == [0x11111111, 0x2222222233333333]
    assert out["atomic"] == NOT_SUPPORTED and "CU_STREAM_MEM_OP_ATOMIC_REDUCTION" in stderr
    assert out["unknown"] == INVALID_VALUE and out["null_array"] == INVALID_VALUE
    assert out["foreign"] == [SUCCESS, INVALID_VALUE]  # posted: the host's refusal comes at the next synchronise
    assert len(rig.entries(name="cuStreamBatchMemOp")) == 1  # only the good batch reached the driver


def test_batch_memory_operation_nodes_are_built_asked_set_and_captured(library: Path, rig: Rig) -> None:
    out, _ = run(library, rig, GRAPHS + BATCH + NODES)
    assert out["types"] == [NODE_TYPE_BATCH_MEM_OP] and out["launched"] == 5
    assert out["get"] == SUCCESS and out["got"] == [1, 0, 0, 2, 16, 5]  # count, flags, ctx, write32 at +16 of 5
    assert out["set"] == SUCCESS and out["exec_keeps_its_own"] == 5 and out["fresh_exec"] == 6
    assert out["exec_set"] == SUCCESS and out["after_exec_set"] == 7
    assert out["add_node"] == SUCCESS and out["generic_wrote"] == 8
    assert out["foreign_node"] == INVALID_VALUE and out["null_params"] == INVALID_VALUE
    assert out["captured"] == SUCCESS and out["end"] == SUCCESS and out["before_replay"] == 0
    assert out["captured_types"] == [NODE_TYPE_BATCH_MEM_OP] and out["replayed"] == 9


@local_only("the program copies into page-locked memory with a graph memcpy node, which a relayed session refuses "
            "(docs/remote.md)")
def test_the_gpu_program_gives_through_the_native_driver_what_it_gives_on_the_fake(library: Path, rig: Rig) -> None:
    """tests/gpu/programs/batch_mem_op_program.py through the native driver against the rig's fake, and on the fake
    directly (`--fake`): the same values."""
    forwarded, on_the_fake = forwarded_and_on_the_fake("batch_mem_op_program.py", library, rig)
    assert forwarded["ok"] is True and forwarded == on_the_fake
