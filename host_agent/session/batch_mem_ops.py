"""Batch memory operations (cuStreamBatchMemOp) and batch memory-operation nodes as the host serves them: a mixin of
executor.CudaExecutor, registered on the host's HOST handlers (call_registry.py).

Each operation travels as driver_api.BATCH_MEM_OP (operation, flags, address, value) and becomes the wheel's
CUstreamBatchMemOpParams: a wait or write of 32 or 64 bits must reach only the session's memory (its 4 or 8 bytes in
one of its device ranges, or the device mapping of its page-locked pool: SessionLedger.owns, the rule a single
cuStreamWriteValue32 is held to), a barrier or a flush of remote writes carries its flags only; another operation
(the guest sends none: it answers an atomic reduction with 801 itself) answers INVALID_VALUE, before the driver. A
node's context must be NULL or the session's (INVALID_CONTEXT), its graph, node and executable graph the session's
(INVALID_VALUE, as the other cuGraph* calls answer). More than MAX_OPERATIONS operations is a malformed request.

cuGraphBatchMemOpNodeGetParams answers what the driver holds, operation by operation, in the same form (read from the
driver's array itself: `_driver_array` says why).
"""
from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ivshmem.cuda_status import INVALID_HANDLE, INVALID_VALUE, SUCCESS
from ivshmem.driver_api import DriverCall
from ivshmem.record import Status

from ..handler import Reply
from .call_registry import HOST

if TYPE_CHECKING:
    from .session_ledger import SessionLedger

MAX_OPERATIONS = 1 << 16  # guest_runtime/native: orion_graph_too_many's bound, which the guest holds to
WAIT_32, WRITE_32, FLUSH_REMOTE_WRITES, WAIT_64, WRITE_64, BARRIER = 1, 2, 3, 4, 5, 6  # CUstreamBatchMemOpType
WIDTHS = {WAIT_32: 4, WRITE_32: 4, WAIT_64: 8, WRITE_64: 8}
PARAM_ARRAY_AT, OPERATION_BYTES = 16, 48  # cuda.h: CUDA_BATCH_MEM_OP_NODE_PARAMS.paramArray, CUstreamBatchMemOpParams
Operation = tuple[int, int, int, int]  # (operation, flags, address, value) as BATCH_MEM_OP carries it


class BatchMemOpCalls:
    """cuStreamBatchMemOp and the batch memory-operation node calls (see the module docstring)."""

    if TYPE_CHECKING:  # CudaExecutor's and GraphCalls', which this mixes into
        driver: Any
        ledger: SessionLedger

        def _owned(self, kind: str, handle: int) -> bool: ...
        def _context_refused(self, context: int) -> int | None: ...
        def _dependencies(self, call: DriverCall, nodes: Sequence[tuple[int]]) -> list[Any] | Reply: ...
        def _made(self, call: DriverCall, err: Any, node: Any, graph: int = 0) -> Reply: ...
        def _exec_node_refused(self, graph_exec: int, node: int) -> Reply | None: ...

    def _operations(self, call: DriverCall, items: Sequence[Operation]) -> list[Any] | Reply:
        """The wheel's CUstreamBatchMemOpParams of each item, or the Reply refusing them."""
        if len(items) > MAX_OPERATIONS:
            return Reply(Status.MALFORMED, f"{call.name}: {len(items)} operations, more than "
                                           f"{MAX_OPERATIONS}".encode())
        made = []
        for operation, flags, address, value in items:
            op = self.driver.CUstreamBatchMemOpParams()
            op.operation = operation
            if operation in WIDTHS:
                if not self.ledger.owns(address, WIDTHS[operation]):
                    return Reply(INVALID_VALUE)
                member = op.waitValue if operation in (WAIT_32, WAIT_64) else op.writeValue
                member.operation, member.address, member.flags = operation, address, flags
                if WIDTHS[operation] == 4:
                    member.value = value & 0xFFFFFFFF
                else:
                    member.value64 = value
            elif operation in (BARRIER, FLUSH_REMOTE_WRITES):
                member = op.memoryBarrier if operation == BARRIER else op.flushRemoteWrites
                member.operation, member.flags = operation, flags
            else:
                return Reply(INVALID_VALUE)
            made.append(op)
        return made

    def _node_params(self, call: DriverCall, context: int, flags: int,
                     items: Sequence[Operation]) -> Any:
        """The wheel's CUDA_BATCH_MEM_OP_NODE_PARAMS, or the Reply refusing them."""
        if (refused := self._context_refused(context)) is not None:
            return Reply(refused)
        ops = self._operations(call, items)
        if isinstance(ops, Reply):
            return ops
        params = self.driver.CUDA_BATCH_MEM_OP_NODE_PARAMS()
        params.ctx, params.count, params.paramArray, params.flags = context, len(ops), ops, flags
        return params

    @HOST.serves("cuStreamBatchMemOp")
    def _stream_batch_mem_op(self, call: DriverCall, payload: bytes) -> Reply:
        stream, flags, items = call.request.decode(payload)
        if not self.ledger.stream_known(stream):
            return Reply(INVALID_HANDLE)
        ops = self._operations(call, items)
        if isinstance(ops, Reply):
            return ops
        (err,) = self.driver.cuStreamBatchMemOp(stream, len(ops), ops, flags)
        return Reply(int(err))

    @HOST.serves("cuGraphAddBatchMemOpNode")
    def _add_batch_mem_op_node(self, call: DriverCall, payload: bytes) -> Reply:
        graph, context, flags, items, deps = call.request.decode(payload)
        if not self._owned("CUgraph", graph):
            return Reply(INVALID_VALUE)
        nodes = self._dependencies(call, deps)
        if isinstance(nodes, Reply):
            return nodes
        params = self._node_params(call, context, flags, items)
        if isinstance(params, Reply):
            return params
        err, node = self.driver.cuGraphAddBatchMemOpNode(graph, nodes or None, len(nodes), params)
        return self._made(call, err, node, graph)

    @HOST.serves("cuGraphBatchMemOpNodeGetParams")
    def _batch_mem_op_node_get(self, call: DriverCall, payload: bytes) -> Reply:
        (node,) = call.request.decode(payload)
        if not self._owned("CUgraphNode", node):
            return Reply(INVALID_VALUE)
        err, params = self.driver.cuGraphBatchMemOpNodeGetParams(node)
        if int(err) != SUCCESS:
            return Reply(int(err))
        items = [_item(op) for op in self._driver_array(params)]
        return Reply(SUCCESS, call.reply.encode(int(params.ctx or 0), int(params.flags), items))

    def _driver_array(self, params: Any) -> list[Any]:
        """The operations of a CUDA_BATCH_MEM_OP_NODE_PARAMS the driver filled, read from its C struct: the wheel's
        `paramArray` lists only operations assigned to it from Python (cuda-bindings 13.5 reads [] here)."""
        count = min(int(params.count), MAX_OPERATIONS)
        (base,) = struct.unpack_from("<Q", ctypes.string_at(params.getPtr() + PARAM_ARRAY_AT, 8))
        if not base:
            return []
        return [self.driver.CUstreamBatchMemOpParams(_ptr=base + OPERATION_BYTES * i) for i in range(count)]

    @HOST.serves("cuGraphBatchMemOpNodeSetParams")
    def _batch_mem_op_node_set(self, call: DriverCall, payload: bytes) -> Reply:
        node, context, flags, items = call.request.decode(payload)
        if not self._owned("CUgraphNode", node):
            return Reply(INVALID_VALUE)
        params = self._node_params(call, context, flags, items)
        if isinstance(params, Reply):
            return params
        (err,) = self.driver.cuGraphBatchMemOpNodeSetParams(node, params)
        return Reply(int(err))

    @HOST.serves("cuGraphExecBatchMemOpNodeSetParams")
    def _exec_batch_mem_op_node_set(self, call: DriverCall, payload: bytes) -> Reply:
        graph_exec, node, context, flags, items = call.request.decode(payload)
        if (refused := self._exec_node_refused(graph_exec, node)) is not None:
            return refused
        params = self._node_params(call, context, flags, items)
        if isinstance(params, Reply):
            return params
        (err,) = self.driver.cuGraphExecBatchMemOpNodeSetParams(graph_exec, node, params)
        return Reply(int(err))


def _item(op: Any) -> Operation:
    """One of the driver's CUstreamBatchMemOpParams as BATCH_MEM_OP carries it."""
    operation = int(op.operation)
    if operation in WIDTHS:
        member = op.waitValue if operation in (WAIT_32, WAIT_64) else op.writeValue
        value = int(member.value) if WIDTHS[operation] == 4 else int(member.value64)
        return operation, int(member.flags), int(member.address), value
    member = op.memoryBarrier if operation == BARRIER else op.flushRemoteWrites
    return operation, int(getattr(member, "flags", 0)), 0, 0
