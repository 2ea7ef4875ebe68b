"""CUDA graphs built node by node (XLA's command buffers, PyTorch's CUDA graphs) as the host serves them: a mixin of
executor.CudaExecutor, registered on the host's HOST handlers (call_registry.py).

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

cuGraphAddNode travels for a conditional node and a child graph moved into its node only (the guest turns every other
node type into that type's own call). A request of another node type cuda.h has, a cloned child graph
(OWNERSHIP_CLONE: cuGraphAddChildGraphNode's) or fields of the other kind set (in cuda.h's struct they are one union)
is not one the guest makes: MALFORMED; a node type or ownership cuda.h does not have answers INVALID_VALUE, as the
driver does. Either node's graph and dependencies are checked as above, its edge data as cuGraphAddDependencies's.
A conditional node's context is checked as above, its body-graph count must be 1..MAX_CONDITIONAL_BODIES and its
conditional handle one this session created (else INVALID_VALUE, before the driver). A CUgraphConditionalHandle is
a cuuint64_t, not a handle type, so the ledger's generic recording never sees one: cuGraphConditionalHandleCreate
(forwarded by construction) is served here as a POLICY that makes the generic call's checks (its graph the
session's, its context NULL or the session's), calls the driver and keeps the handle it gives (`_conditional_handles`;
kept for the session's life, as the ledger keeps a destroyed graph's nodes). The new node and its body graphs
(`phGraph_out`, read only once the driver succeeded: the wheel reads `size` entries from it) become the session's, so
the guest may build the bodies with the calls above.

A moved child graph (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE, as XLA adds one) must be the session's and neither the
parent nor a graph the parent is held in (a cycle): else INVALID_VALUE, before the driver. The driver takes the graph
itself, no clone, so it and its nodes stay the session's: cuda.h lets the caller go on using a moved graph except to
instantiate or destroy it on its own, add it to another parent, pass it to cuGraphExecUpdate or add memory allocation
or free nodes to it, and XLA sets its nodes through the parent's executable graph. Those refusals are the driver's
to make (a cuGraphDestroy of it reaches the driver, which answers as for a graph it will not destroy: cuGraphDestroy
documents CUDA_ERROR_INVALID_VALUE). What the ledger adds (`_held_graphs`): which node and graph hold each moved graph
and each conditional body; cuGraphDestroy and cuGraphDestroyNode (forwarded by construction) are served here as a
POLICY that calls the driver and, once it destroyed a graph or node, drops the graphs it held (and those held in
them) from the session, so that no later call hands the driver a graph it already freed: they answer INVALID_VALUE
before the driver, as for any graph the session does not have. Their nodes stay in the ledger, as a destroyed graph's
nodes do.

graph_queries.py (GraphQueries, which GraphCalls extends) serves the rest of the family and keeps, with these calls,
which graph each node the session made or listed lies in (for a kernel node's parameters asked back), what each memcpy
node was given where the driver was handed something else (a translated host side, a resolved UNIFIED side), and the
graph memory allocations: a destroyed graph or node, and the graphs it held, take theirs with them (`_nodes_gone`).
"""
from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ivshmem.cuda_status import INVALID_CONTEXT, INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED, SUCCESS
from ivshmem.driver_api import DriverCall
from ivshmem.record import Status

from ..handler import Reply
from .call_registry import HOST, POLICY
from .graph_queries import GraphQueries

if TYPE_CHECKING:
    from .pinned_pool import HostPool
    from .session_ledger import SessionLedger

MAX_DEPENDENCIES = 1 << 16  # edges or dependencies one request may name: more is not a request a program makes
DIRECT_QUERY = 1024  # a query's capacity up to which it is asked at once; above it the count is asked first
MAX_PARAM_BYTES = 32764  # the driver's limit for one kernel's parameters
MAX_CONDITIONAL_BODIES = 64  # body graphs of one conditional node (cuda.h: 1 for WHILE, 1 or 2 for IF, any for SWITCH)
NODE_GRAPH, NODE_CONDITIONAL, NODE_TYPES = 4, 13, 14  # CUgraphNodeType: a child graph node, a conditional node, count
OWNERSHIP_CLONE, OWNERSHIP_MOVE = 0, 1  # CUgraphChildGraphNodeOwnership
CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_ARRAY, CU_MEMORYTYPE_UNIFIED = 1, 2, 3, 4


class GraphCalls(GraphQueries):
    """The hand-written cuGraph* calls of the call table: node-by-node construction, queries, parameter updates (the
    rest, and what both keep of each node: graph_queries.GraphQueries)."""

    if TYPE_CHECKING:  # CudaExecutor's, which this mixes into
        driver: Any
        ledger: SessionLedger
        pool: HostPool | None

        def _param_layout(self, function: int) -> tuple[int, list[tuple[int, int]]]: ...

    _made_conditional_handles: set[int]  # made at the first cuGraphConditionalHandleCreate (_conditional_handles)
    _graphs_held: dict[int, tuple[int, int]]  # made when first needed (_held_graphs)

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

    def _made(self, call: DriverCall, err: Any, node: Any, graph: int = 0) -> Reply:
        """A node-adding call's reply: the new node (in `graph`), the session's from now on."""
        if int(err) != SUCCESS:
            return Reply(int(err))
        handle = int(node)
        self.ledger.handles["CUgraphNode"].add(handle)
        self._nodes_gone(node=handle)  # a handle given out again: nothing kept for an earlier node of it stays
        self._node_graphs()[handle] = graph
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
        return self._made(call, err, node, graph)

    @HOST.serves("cuGraphAddChildGraphNode")
    def _add_child_graph_node(self, call: DriverCall, payload: bytes) -> Reply:
        graph, child, deps = call.request.decode(payload)
        if not self._owned("CUgraph", graph) or not self._owned("CUgraph", child):
            return Reply(INVALID_VALUE)
        nodes = self._dependencies(call, deps)
        if isinstance(nodes, Reply):
            return nodes
        err, node = self.driver.cuGraphAddChildGraphNode(graph, nodes or None, len(nodes), child)
        return self._made(call, err, node, graph)

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
        return self._made(call, err, node, graph)

    @HOST.serves("cuGraphAddMemsetNode", "cuGraphAddMemcpyNode")
    def _add_memset_or_memcpy_node(self, call: DriverCall, payload: bytes) -> Reply:
        graph, context, *fields, deps = call.request.decode(payload)
        if not self._owned("CUgraph", graph):
            return Reply(INVALID_VALUE)
        nodes = self._dependencies(call, deps)
        if isinstance(nodes, Reply):
            return nodes
        if (refused := self._context_refused(context)) is not None:
            return Reply(refused)
        err, params = self._copy_or_set_params(call.name, fields)
        if err != SUCCESS:
            return Reply(err)
        err, node = getattr(self.driver, call.name)(graph, nodes or None, len(nodes), params, context)
        reply = self._made(call, err, node, graph)
        if reply.status == SUCCESS and "Memcpy" in call.name:
            self._copy_set(int(node), fields, params)
        return reply

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
        return self._made(call, err, node, graph)

    # --- conditional nodes ---------------------------------------------------------------------------------------
    def _conditional_handles(self) -> set[int]:
        """The CUgraphConditionalHandles this session's cuGraphConditionalHandleCreate calls were given."""
        handles: set[int] | None = getattr(self, "_made_conditional_handles", None)
        if handles is None:
            handles = self._made_conditional_handles = set()
        return handles

    @POLICY.serves("cuGraphConditionalHandleCreate")
    def _conditional_handle_create(self, call: DriverCall, args: tuple[int, ...]) -> Reply:
        """The generic call, made here so that the handle it gives is kept (see the module docstring): a driver
        without it answers NOT_SUPPORTED, as the generic path does, before any input is looked at."""
        function = getattr(self.driver, call.name, None)
        if function is None:
            return Reply(NOT_SUPPORTED)
        graph, context, default, flags = args
        if not self._owned("CUgraph", graph):
            return Reply(INVALID_VALUE)
        if (refused := self._context_refused(context)) is not None:
            return Reply(refused)
        err, handle = function(graph, context, default, flags)
        if int(err) != SUCCESS:
            return Reply(int(err))
        value = int(handle)
        self._conditional_handles().add(value)
        return Reply(SUCCESS, call.outputs.pack(value))

    @HOST.serves("cuGraphAddNode")
    def _add_node(self, call: DriverCall, payload: bytes) -> Reply:
        """A conditional node or a child graph moved into its node (see the module docstring): the new node and a
        conditional node's body graphs (none for a moved child graph)."""
        graph, kind, handle, condition, size, context, child, ownership, deps, words = call.request.decode(payload)
        if len(words) not in (0, len(deps)):
            return Reply(Status.MALFORMED, f"{call.name}: {len(deps)} dependencies and {len(words)} edges do not "
                                           f"pair up".encode())
        if not 0 <= kind < NODE_TYPES or (kind == NODE_GRAPH and ownership not in (OWNERSHIP_CLONE, OWNERSHIP_MOVE)):
            return Reply(INVALID_VALUE)  # a node type or ownership cuda.h does not have: what the driver answers
        if kind == NODE_CONDITIONAL and not (child or ownership):
            return self._add_conditional_node(call, graph, handle, condition, size, context, deps, words)
        if kind == NODE_GRAPH and ownership == OWNERSHIP_MOVE and not (handle or condition or size or context):
            return self._add_moved_child_node(call, graph, child, deps, words)
        return Reply(Status.MALFORMED, f"{call.name} carries a conditional node or a moved child graph only, not node "
                                       f"type {kind} with ownership {ownership} or with another type's fields "
                                       f"set".encode())

    def _node_refused(self, call: DriverCall, graph: int, deps: Sequence[tuple[int]],
                      words: Sequence[tuple[int]]) -> tuple[list[Any], list[Any]] | Reply:
        """cuGraphAddNode's graph, dependencies and edge data checked: (the wheel's dependencies, edges) or the Reply
        refusing them."""
        if not self._owned("CUgraph", graph):
            return Reply(INVALID_VALUE)
        nodes = self._dependencies(call, deps)
        if isinstance(nodes, Reply):
            return nodes
        edges = [self._edge_data(word) for (word,) in words]
        if any(edge is None for edge in edges):
            return Reply(INVALID_VALUE)  # cuda.h: its reserved bytes must be zero
        return nodes, edges

    def _add_conditional_node(self, call: DriverCall, graph: int, handle: int, kind: int, size: int, context: int,
                              deps: Sequence[tuple[int]], words: Sequence[tuple[int]]) -> Reply:
        """A conditional node: the new node and its body graphs."""
        checked = self._node_refused(call, graph, deps, words)
        if isinstance(checked, Reply):
            return checked
        nodes, edges = checked
        if (refused := self._context_refused(context)) is not None:
            return Reply(refused)
        if handle not in self._conditional_handles() or not 1 <= size <= MAX_CONDITIONAL_BODIES:
            return Reply(INVALID_VALUE)
        driver = self.driver
        try:
            condition = driver.CUgraphConditionalNodeType(kind)
        except ValueError:
            return Reply(INVALID_VALUE)
        params = driver.CUgraphNodeParams()
        params.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
        conditional = params.conditional
        conditional.handle, conditional.type, conditional.size, conditional.ctx = handle, condition, size, context
        err, node = driver.cuGraphAddNode(graph, nodes or None, edges or None, len(nodes), params)
        if int(err) != SUCCESS:
            return Reply(int(err))
        bodies = [int(body) for body in params.conditional.phGraph_out]  # `size` graphs, once the driver made them
        made = int(node)
        self.ledger.handles["CUgraphNode"].add(made)
        self._node_graphs()[made] = graph
        self.ledger.handles["CUgraph"].update(bodies)
        held = self._held_graphs()
        for body in bodies:
            held[body] = (graph, made)
        return Reply(SUCCESS, call.reply.encode(made, struct.pack(f"<{len(bodies)}Q", *bodies)))

    def _add_moved_child_node(self, call: DriverCall, graph: int, child: int, deps: Sequence[tuple[int]],
                              words: Sequence[tuple[int]]) -> Reply:
        """A child graph moved into its node: the graph itself, the session's still (its nodes too), now held by
        the node (see the module docstring)."""
        checked = self._node_refused(call, graph, deps, words)
        if isinstance(checked, Reply):
            return checked
        nodes, edges = checked
        if not self._owned("CUgraph", child) or child in self._holders(graph):
            return Reply(INVALID_VALUE)  # not the session's, or the graph itself or one it is held in: a cycle
        driver = self.driver
        params = driver.CUgraphNodeParams()
        params.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_GRAPH
        params.graph.graph = driver.CUgraph(child)
        params.graph.ownership = driver.CUgraphChildGraphNodeOwnership.CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE
        err, node = driver.cuGraphAddNode(graph, nodes or None, edges or None, len(nodes), params)
        if int(err) != SUCCESS:
            return Reply(int(err))
        made = int(node)
        self.ledger.handles["CUgraphNode"].add(made)
        self._node_graphs()[made] = graph
        self._held_graphs()[child] = (graph, made)
        return Reply(SUCCESS, call.reply.encode(made, b""))

    # --- graphs held by a node: a moved child graph, a conditional node's bodies --------------------------------
    def _held_graphs(self) -> dict[int, tuple[int, int]]:
        """Graph -> (the graph, the node) holding it: child graphs moved into a node, conditional nodes' bodies."""
        held: dict[int, tuple[int, int]] | None = getattr(self, "_graphs_held", None)
        if held is None:
            held = self._graphs_held = {}
        return held

    def _holders(self, graph: int) -> set[int]:
        """`graph` and every graph it is held in, up to one held by no node."""
        held, found = self._held_graphs(), {graph}
        while graph in held and (graph := held[graph][0]) not in found:
            found.add(graph)
        return found

    def _forget_held(self, gone: Callable[[tuple[int, int]], bool]) -> None:
        """The graphs held by what was destroyed (`gone(holder)`), and those held in them, leave the session: the
        driver destroyed them with their holder, so their handles would name freed memory."""
        held, graphs = self._held_graphs(), self.ledger.handles["CUgraph"]
        going = [graph for graph, holder in held.items() if gone(holder)]
        while going:
            graph = going.pop()
            held.pop(graph, None)
            graphs.discard(graph)
            self._nodes_gone(graph=graph)
            going += [inner for inner, (outer, _node) in held.items() if outer == graph]

    @POLICY.serves("cuGraphDestroy", "cuGraphDestroyNode")
    def _destroyed(self, call: DriverCall, args: tuple[int, ...]) -> Reply:
        """The generic call, made here so that the graphs the destroyed graph or node held go from the ledger with
        it. The driver judges a graph held by a node (cuda.h: a moved child graph "cannot be ... independently
        destroyed"; cuGraphDestroy documents CUDA_ERROR_INVALID_VALUE): while its holder lives it is the session's
        and reaches the driver; once its holder is gone it is unknown here (INVALID_VALUE, before the driver)."""
        function = getattr(self.driver, call.name, None)
        if function is None:
            return Reply(NOT_SUPPORTED)
        (handle,) = args
        kind = call.input_types[0]
        if not self._owned(kind, handle):
            return Reply(INVALID_VALUE)  # session_ledger.VALUE_HANDLES: every cuGraph* call's answer
        (err,) = function(handle)
        if int(err) != SUCCESS:
            return Reply(int(err))
        self.ledger.record(call, args, [])
        if kind == "CUgraph":
            self._held_graphs().pop(handle, None)
            self._nodes_gone(graph=handle)
            self._forget_held(lambda holder: holder[0] == handle)
        else:
            self._nodes_gone(node=handle)
            self._forget_held(lambda holder: holder[1] == handle)
        return Reply(SUCCESS)

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

    def _listed(self, call: DriverCall, result: tuple[Any, ...], node_lists: int, graph: int = 0) -> Reply:
        """A query's reply: the driver's count, then its first `node_lists` lists as node handles (the session's
        from now on, of `graph` where it is known) and any further list as edge data, each cut to the entries the
        driver says it wrote."""
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
                if graph:
                    self._node_graphs().update((value, graph) for value in values if value)
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
        return self._listed(call, result, 2 if call.name == "cuGraphGetEdges" else 1, graph)

    @HOST.serves("cuGraphNodeGetDependencies", "cuGraphNodeGetDependentNodes")
    def _node_query(self, call: DriverCall, payload: bytes) -> Reply:
        node, capacity = call.request.decode(payload)
        if not self._owned("CUgraphNode", node):
            return Reply(INVALID_VALUE)
        return self._listed(call, self._query(getattr(self.driver, call.name), node, capacity), 1,
                            self._node_graphs().get(node, 0))

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
        """A memset or memcpy node's parameters (for the call `name`, which adds or sets one), checked."""
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
        if int(err) == SUCCESS and "Memcpy" in call.name:
            self._copy_set(node, fields, params)
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
