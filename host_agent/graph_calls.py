"""CUDA graphs built node by node (XLA's command buffers, PyTorch's CUDA graphs) as the host serves them: a mixin of
executor.CudaExecutor, registered on the host's HOST handlers (call_handlers.py).

Each call decodes exactly the request driver_api declares for it, holds every handle and device range it names to
the session's ledger before the driver sees it, builds the wheel's struct and calls the driver:

* graphs, executable graphs and nodes must be the session's (an unknown one answers CUDA_ERROR_INVALID_VALUE, as
  session_ledger.VALUE_HANDLES says of every cuGraph* call); events the session's (INVALID_HANDLE, as the generic
  event calls answer); a node's context NULL or the session's (INVALID_CONTEXT);
* a kernel node's function, or its CUkernel where the function is NULL, must be launchable by the session (else
  INVALID_VALUE, the one error cuGraphAddKernelNode documents), and its packed parameters (the request's tail, packed
  by the guest at the offsets of the function's layout, as a launch's are) are rebuilt into `kernelParams` from the
  same layout cuLaunchCooperativeKernel uses (executor._param_layout): a tail of another size is INVALID_VALUE;
* a memset node's rows (pitch * (height - 1) + width * element size from dst) must lie in the session's memory; a
  memcpy node's device side likewise, from its offsets, pitch, height and the extent; a host side must lie in the
  session's page-locked pool and is translated to the host's mapping of it (memory the host cannot see: NOT_SUPPORTED);
  CU_MEMORYTYPE_UNIFIED is resolved by where the address lies (pool: host, the session's memory: device); array
  operands are not forwarded (NOT_SUPPORTED). Anything refused answers before the driver is called;
* dependency lists longer than MAX_DEPENDENCIES are a malformed request (Status.MALFORMED), as are lists whose
  lengths disagree.

Nodes and graphs the driver hands back (a new node, the nodes of a query, cuGraphExecUpdate's error nodes) become
the session's, as if a call had made them. A query's `capacity` is the caller's array length (0: the count only):
the reply carries the driver's count and at most `capacity` entries, as the C call fills the caller's array; a large
capacity is first bounded by the count, so the host never allocates what the guest merely claims to have.

cuGraphExecUpdate's result information travels only when the update succeeds: on CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE
the wheel returns none (its resultInfo output is None on failure) and a failed reply carries no payload.
"""
from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ivshmem.cuda_status import INVALID_CONTEXT, INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED, SUCCESS
from ivshmem.driver_api import DriverCall
from ivshmem.record import Status

from .call_handlers import HOST
from .handler import Reply

if TYPE_CHECKING:
    from .pinned_pool import HostPool
    from .session_ledger import SessionLedger

MAX_DEPENDENCIES = 1 << 16  # edges or dependencies one request may name: more is not a request a program makes
DIRECT_QUERY = 1024  # a query's capacity up to which it is asked at once; above it the count is asked first
MAX_PARAM_BYTES = 32764  # the driver's limit for one kernel's parameters
CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_ARRAY, CU_MEMORYTYPE_UNIFIED = 1, 2, 3, 4


class GraphCalls:
    """The hand-written cuGraph* calls of the call table: node-by-node construction, queries, parameter updates."""

    if TYPE_CHECKING:  # CudaExecutor's, which this mixes into
        driver: Any
        ledger: SessionLedger
        pool: HostPool | None

        def _param_layout(self, function: int) -> tuple[int, list[tuple[int, int]]]: ...

    # --- what every call checks ---------------------------------------------------------------------------------
    def _owned(self, kind: str, handle: int) -> bool:
        return handle in self.ledger.handles[kind]

    def _context_refused(self, context: int) -> int | None:
        """A node's context: NULL (the current one) or one of the session's."""
        return None if not context or self._owned("CUcontext", context) else INVALID_CONTEXT

    def _dependencies(self, call: DriverCall, nodes: Sequence[tuple[int]]) -> list[Any] | Reply:
        """The wheel's CUgraphNode list of a request's dependencies (None-able: [] for none), or the Reply refusing
        them: too many (MALFORMED), or a node that is not the session's (INVALID_VALUE)."""
        if len(nodes) > MAX_DEPENDENCIES:
            return Reply(Status.MALFORMED, f"{call.name}: {len(nodes)} dependencies, more than "
                                           f"{MAX_DEPENDENCIES}".encode())
        handles = self.ledger.handles["CUgraphNode"]
        if any(node not in handles for (node,) in nodes):
            return Reply(INVALID_VALUE)
        return [self.driver.CUgraphNode(node) for (node,) in nodes]

    def _made(self, call: DriverCall, err: Any, node: Any) -> Reply:
        """A node-adding call's reply: the new node, the session's from now on."""
        if int(err) != SUCCESS:
            return Reply(int(err))
        handle = int(node)
        self.ledger.handles["CUgraphNode"].add(handle)
        return Reply(SUCCESS, call.reply.encode(handle))

    # --- node parameter structs ---------------------------------------------------------------------------------
    def _kernel_node(self, fields: Sequence[int], packed: bytes | memoryview) -> tuple[int, tuple[Any, Any] | None]:
        """driver_api.KERNEL_NODE's fields (function, kernel, context, grid xyz, block xyz, shared bytes) and the
        packed parameters -> (SUCCESS, (the wheel's CUDA_KERNEL_NODE_PARAMS, what must stay alive while the driver
        copies the parameters)) or (the error refusing them, None)."""
        function, kernel, context, *dims = fields
        ledger = self.ledger
        target = function or kernel  # cuda.h: `kern` is referenced only where `func` is NULL
        if not target or ledger.launchable(target, 0) != SUCCESS:
            return INVALID_VALUE, None  # the one error cuGraphAddKernelNode documents for its parameters
        if not function and kernel not in ledger.handles["CUkernel"]:
            return INVALID_VALUE, None
        if not function and (refused := self._context_refused(context)) is not None:
            return refused, None  # `ctx` is ignored where `func` is set, and then never passed
        err, layout = self._param_layout(target)
        if err != SUCCESS:
            return err, None
        if len(packed) > MAX_PARAM_BYTES or len(packed) != max((o + s for o, s in layout), default=0):
            return INVALID_VALUE, None  # not packed for this function's parameters
        buffer = ctypes.create_string_buffer(bytes(packed), max(len(packed), 1))
        base = ctypes.addressof(buffer)
        pointers = (ctypes.c_void_p * max(len(layout), 1))(*[base + offset for offset, _ in layout])
        params = self.driver.CUDA_KERNEL_NODE_PARAMS()
        params.func = function
        params.kern = 0 if function else kernel
        params.ctx = 0 if function else context
        (params.gridDimX, params.gridDimY, params.gridDimZ, params.blockDimX, params.blockDimY, params.blockDimZ,
         params.sharedMemBytes) = dims
        params.kernelParams = ctypes.addressof(pointers) if layout else 0
        params.extra = 0
        return SUCCESS, (params, (buffer, pointers))

    def _memset_node(self, fields: Sequence[int]) -> tuple[int, Any]:
        """driver_api.MEMSET_NODE's fields -> (SUCCESS, the wheel's CUDA_MEMSET_NODE_PARAMS), or (INVALID_VALUE,
        None) where its rows reach outside the session's memory."""
        dst, pitch, value, element_size, width, height = fields
        reach = pitch * (height - 1) + width * element_size if height and width else 0
        if not self.ledger.owns(dst, max(reach, 1)):
            return INVALID_VALUE, None
        params = self.driver.CUDA_MEMSET_NODE_PARAMS()
        params.dst, params.pitch, params.value = dst, pitch, value
        params.elementSize, params.width, params.height = element_size, width, height
        return SUCCESS, params

    def _pool_base(self, base: int, offset: int, reach: int) -> int | None:
        """The host's address of a guest pointer `base` whose bytes [base + offset, + reach) lie in one of the
        session's page-locked allocations; None where they do not."""
        if self.pool is None:
            return None
        host = self.pool.host_address(base + offset, max(reach, 1))
        return None if host is None else host - offset

    def _copy_side(self, kind: int, host: int, device: int, x: int, y: int, z: int, pitch: int, rows: int,
                   extent: tuple[int, int, int]) -> tuple[int, int, int, int]:
        """One side of a CUDA_MEMCPY3D -> (SUCCESS or the error refusing it, memory type, host pointer, device
        pointer), the host pointer translated to the host's mapping of the guest's page-locked pool."""
        width, height, depth = extent
        offset = x + y * pitch + z * pitch * rows
        reach = (depth - 1) * pitch * rows + (height - 1) * pitch + width if width and height and depth else 0
        if kind == CU_MEMORYTYPE_ARRAY:
            return NOT_SUPPORTED, kind, 0, 0  # arrays are not forwarded (and the request carries none)
        if kind == CU_MEMORYTYPE_HOST:
            translated = self._pool_base(host, offset, reach)
            if translated is None:
                return NOT_SUPPORTED, kind, 0, 0  # guest memory the host cannot see
            return SUCCESS, kind, translated, 0
        if kind == CU_MEMORYTYPE_UNIFIED:  # the address is in srcDevice (cuda.h): resolved by where it lies
            translated = self._pool_base(device, offset, reach)
            if translated is not None:
                return SUCCESS, CU_MEMORYTYPE_HOST, translated, 0
            kind = CU_MEMORYTYPE_DEVICE
        if kind == CU_MEMORYTYPE_DEVICE:
            if not self.ledger.owns(device + offset, max(reach, 1)):
                return INVALID_VALUE, kind, 0, 0
            return SUCCESS, kind, 0, device
        return INVALID_VALUE, kind, 0, 0  # no such memory type

    def _memcpy_node(self, fields: Sequence[int]) -> tuple[int, Any]:
        """driver_api.MEMCPY_3D's fields -> (SUCCESS, the wheel's CUDA_MEMCPY3D), or (the error refusing it, None)."""
        src, dst, extent = fields[0:9], fields[9:18], (fields[18], fields[19], fields[20])
        made = []
        for x, y, z, _lod, kind, host, device, pitch, rows in (src, dst):
            err, *side = self._copy_side(kind, host, device, x, y, z, pitch, rows, extent)
            if err != SUCCESS:
                return err, None
            made.append(side)
        driver = self.driver
        try:
            types = [driver.CUmemorytype(kind) for kind, _h, _d in made]
        except ValueError:
            return INVALID_VALUE, None
        copy = driver.CUDA_MEMCPY3D()
        copy.srcXInBytes, copy.srcY, copy.srcZ, copy.srcLOD = src[0:4]
        copy.srcMemoryType, copy.srcHost, copy.srcDevice = types[0], made[0][1], made[0][2]
        copy.srcPitch, copy.srcHeight = src[7], src[8]
        copy.dstXInBytes, copy.dstY, copy.dstZ, copy.dstLOD = dst[0:4]
        copy.dstMemoryType, copy.dstHost, copy.dstDevice = types[1], made[1][1], made[1][2]
        copy.dstPitch, copy.dstHeight = dst[7], dst[8]
        copy.WidthInBytes, copy.Height, copy.Depth = extent
        return SUCCESS, copy

    # --- nodes added -------------------------------------------------------------------------------------------
    @HOST.serves("cuGraphAddEmptyNode")
    def _add_empty_node(self, call: DriverCall, payload: bytes) -> Reply:
        graph, deps = call.request.decode(payload)
        if not self._owned("CUgraph", graph):
            return Reply(INVALID_VALUE)
        nodes = self._dependencies(call, deps)
        if isinstance(nodes, Reply):
            return nodes
        err, node = self.driver.cuGraphAddEmptyNode(graph, nodes or None, len(nodes))
        return self._made(call, err, node)

    @HOST.serves("cuGraphAddChildGraphNode")
    def _add_child_graph_node(self, call: DriverCall, payload: bytes) -> Reply:
        graph, child, deps = call.request.decode(payload)
        if not self._owned("CUgraph", graph) or not self._owned("CUgraph", child):
            return Reply(INVALID_VALUE)
        nodes = self._dependencies(call, deps)
        if isinstance(nodes, Reply):
            return nodes
        err, node = self.driver.cuGraphAddChildGraphNode(graph, nodes or None, len(nodes), child)
        return self._made(call, err, node)

    @HOST.serves("cuGraphAddEventRecordNode", "cuGraphAddEventWaitNode")
    def _add_event_node(self, call: DriverCall, payload: bytes) -> Reply:
        graph, event, deps = call.request.decode(payload)
        if not self._owned("CUgraph", graph):
            return Reply(INVALID_VALUE)
        if not self._owned("CUevent", event):
            return Reply(INVALID_HANDLE)
        nodes = self._dependencies(call, deps)
        if isinstance(nodes, Reply):
            return nodes
        err, node = getattr(self.driver, call.name)(graph, nodes or None, len(nodes), event)
        return self._made(call, err, node)

    @HOST.serves("cuGraphAddMemsetNode")
    def _add_memset_node(self, call: DriverCall, payload: bytes) -> Reply:
        graph, context, *fields, deps = call.request.decode(payload)
        if not self._owned("CUgraph", graph):
            return Reply(INVALID_VALUE)
        nodes = self._dependencies(call, deps)
        if isinstance(nodes, Reply):
            return nodes
        if (refused := self._context_refused(context)) is not None:
            return Reply(refused)
        err, params = self._memset_node(fields)
        if err != SUCCESS:
            return Reply(err)
        err, node = self.driver.cuGraphAddMemsetNode(graph, nodes or None, len(nodes), params, context)
        return self._made(call, err, node)

    @HOST.serves("cuGraphAddMemcpyNode")
    def _add_memcpy_node(self, call: DriverCall, payload: bytes) -> Reply:
        graph, context, *fields, deps = call.request.decode(payload)
        if not self._owned("CUgraph", graph):
            return Reply(INVALID_VALUE)
        nodes = self._dependencies(call, deps)
        if isinstance(nodes, Reply):
            return nodes
        if (refused := self._context_refused(context)) is not None:
            return Reply(refused)
        err, params = self._memcpy_node(fields)
        if err != SUCCESS:
            return Reply(err)
        err, node = self.driver.cuGraphAddMemcpyNode(graph, nodes or None, len(nodes), params, context)
        return self._made(call, err, node)

    @HOST.serves("cuGraphAddKernelNode")
    def _add_kernel_node(self, call: DriverCall, payload: bytes) -> Reply:
        graph, *fields, deps, packed = call.request.decode(payload)
        if not self._owned("CUgraph", graph):
            return Reply(INVALID_VALUE)
        nodes = self._dependencies(call, deps)
        if isinstance(nodes, Reply):
            return nodes
        err, made = self._kernel_node(fields, packed)
        if made is None:
            return Reply(err)
        err, node = self.driver.cuGraphAddKernelNode(graph, nodes or None, len(nodes), made[0])
        del made  # kept alive until the driver has copied the parameters (it does before returning)
        return self._made(call, err, node)

    # --- edges ---------------------------------------------------------------------------------------------------
    @HOST.serves("cuGraphAddDependencies", "cuGraphRemoveDependencies")
    def _dependencies_changed(self, call: DriverCall, payload: bytes) -> Reply:
        """Edges from[i] -> to[i], with edge data edges[i] (none: default edges) as CUgraphEdgeData's 8 bytes."""
        graph, sources, targets, words = call.request.decode(payload)
        if len(sources) != len(targets) or len(words) not in (0, len(sources)):
            return Reply(Status.MALFORMED, f"{call.name}: {len(sources)} sources, {len(targets)} targets and "
                                           f"{len(words)} edges do not pair up".encode())
        if not self._owned("CUgraph", graph):
            return Reply(INVALID_VALUE)
        froms, tos = self._dependencies(call, sources), self._dependencies(call, targets)
        if isinstance(froms, Reply):
            return froms
        if isinstance(tos, Reply):
            return tos
        edges = [self._edge_data(word) for (word,) in words]
        if any(edge is None for edge in edges):
            return Reply(INVALID_VALUE)  # cuda.h: its reserved bytes must be zero
        (err,) = getattr(self.driver, call.name)(graph, froms or None, tos or None, edges or None, len(froms))
        return Reply(int(err))

    def _edge_data(self, word: int) -> Any:
        """A CUgraphEdgeData (from_port, to_port, type, 5 reserved bytes) from the little-endian u64 of its bytes;
        None where a reserved byte is set."""
        if word >> 24:
            return None
        edge = self.driver.CUgraphEdgeData()
        edge.from_port, edge.to_port, edge.type = word & 0xFF, (word >> 8) & 0xFF, (word >> 16) & 0xFF
        return edge

    # --- queries -------------------------------------------------------------------------------------------------
    def _query(self, function: Callable[..., tuple[Any, ...]], handle: int, capacity: int) -> tuple[Any, ...]:
        """The wheel's answer (err, lists..., count) to `function(handle, n)` for a caller whose arrays hold
        `capacity` entries: asked with the capacity, or, for a large one, with the count asked first (so no list
        the guest merely claims to have room for is ever allocated here)."""
        if capacity > DIRECT_QUERY:
            counted = function(handle, 0)
            if int(counted[0]) != SUCCESS:
                return counted
            capacity = min(capacity, int(counted[-1]))
            if not capacity:
                return counted
        return function(handle, capacity)

    def _listed(self, call: DriverCall, result: tuple[Any, ...], node_lists: int) -> Reply:
        """A query's reply: the driver's count, then its first `node_lists` lists as node handles (the session's
        from now on) and any further list as edge data, each cut to the entries the driver says it wrote."""
        err, *lists, count = result
        if int(err) != SUCCESS:
            return Reply(int(err))
        count = int(count)
        packed: list[bytes] = []
        for index, items in enumerate(lists):
            kept = list(items or ())[:count]
            if index < node_lists:
                values = [int(node) if node is not None else 0 for node in kept]
                self.ledger.handles["CUgraphNode"].update(value for value in values if value)
            else:
                values = [_edge_word(edge) for edge in kept]
            packed.append(struct.pack(f"<{len(values)}Q", *values))
        return Reply(SUCCESS, call.reply.encode(count, *packed))

    @HOST.serves("cuGraphGetNodes", "cuGraphGetRootNodes", "cuGraphGetEdges")
    def _graph_query(self, call: DriverCall, payload: bytes) -> Reply:
        graph, capacity = call.request.decode(payload)
        if not self._owned("CUgraph", graph):
            return Reply(INVALID_VALUE)
        result = self._query(getattr(self.driver, call.name), graph, capacity)
        return self._listed(call, result, 2 if call.name == "cuGraphGetEdges" else 1)

    @HOST.serves("cuGraphNodeGetDependencies", "cuGraphNodeGetDependentNodes")
    def _node_query(self, call: DriverCall, payload: bytes) -> Reply:
        node, capacity = call.request.decode(payload)
        if not self._owned("CUgraphNode", node):
            return Reply(INVALID_VALUE)
        return self._listed(call, self._query(getattr(self.driver, call.name), node, capacity), 1)

    # --- parameters set ------------------------------------------------------------------------------------------
    def _exec_node_refused(self, graph_exec: int, node: int) -> Reply | None:
        if not self._owned("CUgraphExec", graph_exec) or not self._owned("CUgraphNode", node):
            return Reply(INVALID_VALUE)
        return None

    @HOST.serves("cuGraphKernelNodeSetParams")
    def _kernel_node_set(self, call: DriverCall, payload: bytes) -> Reply:
        node, *fields, packed = call.request.decode(payload)
        if not self._owned("CUgraphNode", node):
            return Reply(INVALID_VALUE)
        err, made = self._kernel_node(fields, packed)
        if made is None:
            return Reply(err)
        (err,) = self.driver.cuGraphKernelNodeSetParams(node, made[0])
        return Reply(int(err))

    @HOST.serves("cuGraphExecKernelNodeSetParams")
    def _exec_kernel_node_set(self, call: DriverCall, payload: bytes) -> Reply:
        graph_exec, node, *fields, packed = call.request.decode(payload)
        if (refused := self._exec_node_refused(graph_exec, node)) is not None:
            return refused
        err, made = self._kernel_node(fields, packed)
        if made is None:
            return Reply(err)
        (err,) = self.driver.cuGraphExecKernelNodeSetParams(graph_exec, node, made[0])
        return Reply(int(err))

    def _copy_or_set_params(self, name: str, fields: list[Any]) -> tuple[int, Any]:
        """A memset or memcpy node's parameters (for the call `name`), checked as when the node was added."""
        return self._memset_node(fields) if "Memset" in name else self._memcpy_node(fields)

    @HOST.serves("cuGraphMemsetNodeSetParams", "cuGraphMemcpyNodeSetParams")
    def _node_params_set(self, call: DriverCall, payload: bytes) -> Reply:
        node, *fields = call.request.decode(payload)
        if not self._owned("CUgraphNode", node):
            return Reply(INVALID_VALUE)
        err, params = self._copy_or_set_params(call.name, fields)
        if err != SUCCESS:
            return Reply(err)
        (err,) = getattr(self.driver, call.name)(node, params)
        return Reply(int(err))

    @HOST.serves("cuGraphExecMemsetNodeSetParams", "cuGraphExecMemcpyNodeSetParams")
    def _exec_node_params_set(self, call: DriverCall, payload: bytes) -> Reply:
        graph_exec, node, context, *fields = call.request.decode(payload)
        if (refused := self._exec_node_refused(graph_exec, node)) is not None:
            return refused
        if (bad_context := self._context_refused(context)) is not None:
            return Reply(bad_context)
        err, params = self._copy_or_set_params(call.name, fields)
        if err != SUCCESS:
            return Reply(err)
        (err,) = getattr(self.driver, call.name)(graph_exec, node, params, context)
        return Reply(int(err))

    @HOST.serves("cuGraphExecUpdate")
    def _exec_update(self, call: DriverCall, payload: bytes) -> Reply:
        """The update's result and error nodes, on success only (see the module docstring)."""
        graph_exec, graph = call.request.decode(payload)
        if not self._owned("CUgraphExec", graph_exec) or not self._owned("CUgraph", graph):
            return Reply(INVALID_VALUE)
        err, info = self.driver.cuGraphExecUpdate(graph_exec, graph)
        if int(err) != SUCCESS:
            return Reply(int(err))
        nodes = [int(n) if n is not None else 0 for n in (info.errorNode, info.errorFromNode)]
        self.ledger.handles["CUgraphNode"].update(node for node in nodes if node)  # nodes of the session's graph
        return Reply(SUCCESS, call.reply.encode(int(info.result), *nodes))


def _edge_word(edge: Any) -> int:
    """A CUgraphEdgeData (from_port, to_port, type, 5 reserved bytes) as the u64 its 8 bytes make, little-endian."""
    return int(edge.from_port) | int(edge.to_port) << 8 | int(edge.type) << 16
