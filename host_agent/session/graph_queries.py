"""CUDA graphs, their second part, as the host serves them: node parameters asked back, kernel node attributes,
capture into a given graph, instantiation with parameters, memory allocation and free nodes, the graph memory
attributes and the DOT description. A mixin of executor.CudaExecutor (through graph_calls.GraphCalls, which it
backs), registered on the host's HOST handlers (call_registry.py). Each call decodes exactly the request driver_api
declares for it and holds every handle and device range it names to the session's ledger before the driver sees it
(an unknown graph or node answers CUDA_ERROR_INVALID_VALUE, a stream or event INVALID_HANDLE, as graph_calls.py's).

What comes back is what the host's driver holds, in the guest's terms:

* a kernel node's parameters: the values its `kernelParams` (or `extra`) point at, read by the function's layout
  (executor._param_layout) and packed, with each parameter's offset, so the guest hands back memory of its own; a
  value array the driver answers that does not match the layout answers CUDA_ERROR_NOT_SUPPORTED (the values cannot
  be given exactly). Handles an answer names are not made the session's (an event, a context or a function it named
  may have been destroyed or unloaded since: naming it again would reach freed memory), but for the CUfunction a
  driver may answer for a node of one of the session's live CUkernels, and a cloned child graph (the node's own);
* a memcpy node's copy as the guest gave it where the driver still holds what the host set for it (`_copies_given`:
  a page-locked host side the host translated, a UNIFIED side it resolved); else (a captured copy, a node set since
  by no call of this session) the driver's copy with a host side translated back to the guest's page-locked pool
  address, and NOT_SUPPORTED where it lies outside the pool (the agent's own staging memory of a captured pageable
  copy: nothing the guest could use);
* a memory allocation node's location and access descriptors as the guest's device ordinals;
* cuGraphNodeGetParams: the fields of the node types the guest does not ask with their own call (child graph,
  events, conditional, free node) and a memset's or memcpy's context; host, external semaphore and batch
  memory-operation nodes (which only a capture of the guest's host functions makes here) answer NOT_SUPPORTED; an
  allocation node's access descriptors are read from the array the driver's struct points at (`access_descs`);
* a kernel node's graph (`_node_graphs`: known for the nodes the session's calls made or listed, 0 otherwise), so
  the guest can free what it keeps for the node with the graph.

Kernel node attributes travel as CUlaunchAttributeValue's 64 bytes for driver_api.LAUNCH_ATTRIBUTES_PLAIN IDs only
(the ones a launch forwards); any other ID answers NOT_SUPPORTED before the driver (DEVICE_UPDATABLE_KERNEL_NODE hands
out a device-side node handle; the event ones name events). cuGraphInstantiateWithParams' result and error node travel
on success only (a failed reply carries no payload: the guest reports CUDA_GRAPH_INSTANTIATE_ERROR); its upload
stream must be the session's.

Graph memory. A memory allocation node's address range (dptr, bytesize) is the session's memory (the ledger's
`graph_memory` table: copies, memsets, kernel parameters and pointer attributes may name it, the compiled hot path
reads it too) from the node's making until its graph is destroyed, or a graph holding it (a child graph moved into a
node, a conditional body), or the node itself: then the range leaves the session, so no later call reaches an
address the driver may have given to something else. Its bytes count against the vGPU quota of the device its pool
properties locate, from the node's making until then (past the quota: CUDA_ERROR_OUT_OF_MEMORY before the driver, as
cuMemAlloc's), and the quota measures again afterwards (the graph memory pool may keep the physical memory until
cuDeviceGraphMemTrim). An allocation not freed in its graph stays the driver's to free natively; here it leaves the
session with its graph, and cuMemFree/cuMemFreeAsync of it answer INVALID_VALUE (not one of the session's
cuMemAlloc allocations). A free node must name the session's memory; the driver judges whether an allocation node
made it.

cuGraphDebugDotPrint runs into a file in a private temporary directory of the worker, whose text (at most
MAX_DOT_BYTES) goes back for the guest to write to its own path: the GPU host's file system is never named by the
guest. The text is the host driver's: addresses in it are the host's.
"""
from __future__ import annotations

import ctypes
import os
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ivshmem.cuda_status import INVALID_DEVICE, INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED, OUT_OF_MEMORY, SUCCESS
from ivshmem.driver_api import LAUNCH_ATTRIBUTES_PLAIN, DriverCall
from ivshmem.record import Status

from ..handler import Reply
from .call_registry import HOST

if TYPE_CHECKING:
    from .pinned_pool import HostPool
    from .session_ledger import SessionLedger
    from .vgpu_contexts import VgpuContexts
    from .vgpu_quota import VgpuQuota

MAX_ACCESS_DESCS = 64  # access descriptors of one allocation node: a program names each device once
ACCESS_DESCS_AT = 88  # offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, accessDescs) (cuda.h; the pool properties before it)
ACCESS_DESC_BYTES = 12  # sizeof(CUmemAccessDesc)
MAX_DOT_BYTES = 64 << 20  # a DOT description sent back; a longer one answers NOT_SUPPORTED
MAX_EXTRA_PAIRS = 64  # an `extra` list the driver hands back is read no further
MAX_PARAM_BYTES = 32764  # the driver's limit for one kernel's parameters (graph_calls.MAX_PARAM_BYTES)
CUDA_ERROR_OPERATING_SYSTEM = 304  # what cuGraphDebugDotPrint documents for a file it cannot write
ATTRIBUTE_BYTES = 64  # CUlaunchAttributeValue
CU_LAUNCH_PARAM_END, CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2
CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_ARRAY, CU_MEMORYTYPE_UNIFIED = 1, 2, 3, 4
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_GRAPH_INSTANTIATE_ERROR = 1
# CUgraphNodeType
NODE_KERNEL, NODE_MEMCPY, NODE_MEMSET, NODE_HOST, NODE_GRAPH, NODE_EMPTY, NODE_WAIT_EVENT, NODE_EVENT_RECORD = range(8)
NODE_MEM_ALLOC, NODE_MEM_FREE, NODE_CONDITIONAL = 10, 11, 13
# the types whose fields cuGraphNodeGetParams carries (the guest asks the others with their own call)
NODE_FIELDS_CARRIED = frozenset({NODE_KERNEL, NODE_MEMCPY, NODE_MEMSET, NODE_GRAPH, NODE_EMPTY, NODE_WAIT_EVENT,
                                 NODE_EVENT_RECORD, NODE_MEM_ALLOC, NODE_MEM_FREE, NODE_CONDITIONAL})
CopyFields = tuple[int, ...]  # driver_api.MEMCPY_3D's 21 values


class GraphQueries:
    """The second part of the cuGraph* calls (see the module docstring) and the bookkeeping graph_calls.GraphCalls
    shares with it: which graph each node lies in, what each memcpy node was given, the graph memory ranges."""

    if TYPE_CHECKING:  # CudaExecutor's and GraphCalls', which this mixes into
        driver: Any
        ledger: SessionLedger
        pool: HostPool | None
        quota: VgpuQuota
        contexts: VgpuContexts

        def _param_layout(self, function: int) -> tuple[int, list[tuple[int, int]]]: ...
        def _location(self, kind: int, ordinal: int, bad_ordinal: int) -> int | Reply: ...
        def _owned(self, kind: str, handle: int) -> bool: ...
        def _dependencies(self, call: DriverCall, nodes: Sequence[tuple[int]]) -> list[Any] | Reply: ...
        def _edge_data(self, word: int) -> Any: ...
        def _made(self, call: DriverCall, err: Any, node: Any, graph: int = 0) -> Reply: ...

    _graph_of_node: dict[int, int]  # made when first needed (_node_graphs)
    _copies_given: dict[int, tuple[CopyFields, CopyFields]]  # node -> (the guest's fields, the driver's as set)
    _graph_allocations: dict[int, tuple[int, int, int, int]]  # dptr -> (graph, node, its vGPU, bytes)

    # --- bookkeeping graph_calls.py shares --------------------------------------------------------------------
    def _node_graphs(self) -> dict[int, int]:
        """Node -> the graph it lies in, for the nodes the session's calls made or listed."""
        found: dict[int, int] | None = getattr(self, "_graph_of_node", None)
        if found is None:
            found = self._graph_of_node = {}
        return found

    def _copies(self) -> dict[int, tuple[CopyFields, CopyFields]]:
        found: dict[int, tuple[CopyFields, CopyFields]] | None = getattr(self, "_copies_given", None)
        if found is None:
            found = self._copies_given = {}
        return found

    def _allocations(self) -> dict[int, tuple[int, int, int, int]]:
        found: dict[int, tuple[int, int, int, int]] | None = getattr(self, "_graph_allocations", None)
        if found is None:
            found = self._graph_allocations = {}
        return found

    def _copy_set(self, node: int, given: Sequence[int], copy: Any) -> None:
        """Memcpy node `node` was given `given` (MEMCPY_3D's fields) and the driver `copy`: kept where they differ
        (a host side translated, a UNIFIED side resolved), so the copy comes back as the guest gave it."""
        copies = self._copies()
        sent = _copy_fields(copy)
        if sent is None or tuple(given) == sent:
            copies.pop(node, None)
        else:
            copies[node] = (tuple(given), sent)

    def _nodes_gone(self, graph: int = 0, node: int = 0) -> None:
        """A graph (every node in it) or a node was destroyed: what was kept for them goes, and a graph memory
        allocation of theirs leaves the session (its bytes leave the quota's ledger; the quota measures again)."""
        graphs, copies = self._node_graphs(), self._copies()
        gone = [n for n, g in graphs.items() if g == graph] if graph else [node]
        for each in gone:
            graphs.pop(each, None)
            copies.pop(each, None)
        allocations = self._allocations()
        for dptr, (owner, made, vgpu, size) in list(allocations.items()):
            if (graph and owner == graph) or (node and made == node):
                del allocations[dptr]
                self.ledger.graph_memory.pop(dptr, None)
                self.quota.freed(vgpu, size)
                self.quota.may_have_changed()

    # --- node parameters asked back -----------------------------------------------------------------------------
    def _graph_node(self, call: DriverCall, payload: bytes) -> int | Reply:
        (node,) = call.request.decode(payload)
        return node if self._owned("CUgraphNode", node) else Reply(INVALID_VALUE)

    def _adopt(self, kind: str, handle: int) -> None:
        """A handle the driver named in the session's own node: the session's from now on."""
        if handle:
            self.ledger.handles[kind].add(handle)

    @HOST.serves("cuGraphKernelNodeGetParams")
    def _kernel_node_get(self, call: DriverCall, payload: bytes) -> Reply:
        node = self._graph_node(call, payload)
        if isinstance(node, Reply):
            return node
        err, params = self.driver.cuGraphKernelNodeGetParams(node)
        if int(err) != SUCCESS:
            return Reply(int(err))
        function, kernel, context = (int(params.func or 0), int(params.kern or 0), int(params.ctx or 0))
        kernel_params, extra = int(params.kernelParams or 0), int(params.extra or 0)
        offsets: list[tuple[int]] = []
        packed = b""
        if kernel_params or extra:
            if not function and not kernel:
                return Reply(NOT_SUPPORTED)
            err, layout = self._param_layout(function or kernel)
            if err != SUCCESS:
                return Reply(err)
            found = _read_params(kernel_params, layout) if kernel_params else _read_extra(extra)
            if found is None or len(found) != max((o + s for o, s in layout), default=0):
                return Reply(NOT_SUPPORTED)  # values the layout does not place: not to be given as if it did
            offsets, packed = [(offset,) for offset, _size in layout], found
        if kernel in self.ledger.handles["CUkernel"]:  # the CUfunction a driver answers for a node of a CUkernel
            self._adopt("CUfunction", function)         # (while that kernel's library is loaded)
        dims = (params.gridDimX, params.gridDimY, params.gridDimZ, params.blockDimX, params.blockDimY,
                params.blockDimZ, params.sharedMemBytes)
        return Reply(SUCCESS, call.reply.encode(function, kernel, context, *(int(d) for d in dims),
                                                self._node_graphs().get(node, 0), int(bool(kernel_params or extra)),
                                                offsets, packed))

    @HOST.serves("cuGraphMemsetNodeGetParams")
    def _memset_node_get(self, call: DriverCall, payload: bytes) -> Reply:
        node = self._graph_node(call, payload)
        if isinstance(node, Reply):
            return node
        err, params = self.driver.cuGraphMemsetNodeGetParams(node)
        if int(err) != SUCCESS:
            return Reply(int(err))
        return Reply(SUCCESS, call.reply.encode(int(params.dst or 0), int(params.pitch), int(params.value),
                                                int(params.elementSize), int(params.width), int(params.height)))

    @HOST.serves("cuGraphMemcpyNodeGetParams")
    def _memcpy_node_get(self, call: DriverCall, payload: bytes) -> Reply:
        node = self._graph_node(call, payload)
        if isinstance(node, Reply):
            return node
        err, copy = self.driver.cuGraphMemcpyNodeGetParams(node)
        if int(err) != SUCCESS:
            return Reply(int(err))
        held = _copy_fields(copy)
        if held is None:
            return Reply(NOT_SUPPORTED)
        kept = self._copies().get(node)
        fields = kept[0] if kept is not None and kept[1] == held else self._guest_copy(held)
        return Reply(NOT_SUPPORTED) if fields is None else Reply(SUCCESS, call.reply.encode(*fields))

    def _guest_copy(self, fields: CopyFields) -> CopyFields | None:
        """The driver's copy in the guest's terms: a host side at its guest address in the page-locked pool (None
        where it lies outside: the agent's own memory), an array side not at all (None)."""
        extent = fields[18:21]
        out = list(fields)
        for start in (0, 9):
            x, y, z, _lod, kind, host, _device, pitch, rows = fields[start:start + 9]
            if kind == CU_MEMORYTYPE_ARRAY:
                return None
            if kind == CU_MEMORYTYPE_HOST:
                guest = self._guest_host_address(host, x + y * pitch + z * pitch * rows, _reach(pitch, rows, extent))
                if guest is None:
                    return None
                out[start + 5] = guest
        return tuple(out)

    def _guest_host_address(self, host: int, offset: int, reach: int) -> int | None:
        """The guest's pool address of host address `host` whose bytes [host + offset, + reach) lie in one of the
        session's page-locked allocations (graph_calls._pool_base, reversed)."""
        pool = self.pool
        if pool is None or not pool.host_base:
            return None
        guest = host + offset - pool.host_base + pool.guest_base
        return guest - offset if pool.host_address(guest, max(reach, 1)) == host + offset else None

    @HOST.serves("cuGraphNodeGetParams")
    def _node_get(self, call: DriverCall, payload: bytes) -> Reply:
        """The node's type and, for the types the guest does not ask with their own call, its fields (module
        docstring); the handles they name become the session's (its own node's)."""
        node = self._graph_node(call, payload)
        if isinstance(node, Reply):
            return node
        err, params = self.driver.cuGraphNodeGetParams(node)
        if int(err) != SUCCESS:
            return Reply(int(err))
        kind = int(params.type)
        if kind not in NODE_FIELDS_CARRIED:
            return Reply(NOT_SUPPORTED)
        context = child = ownership = event = handle = condition = size = dptr = 0
        graphs: list[int] = []
        if kind == NODE_MEMSET:
            context = int(params.memset.ctx or 0)
        elif kind == NODE_MEMCPY:
            context = int(params.memcpy.copyCtx or 0)
        elif kind == NODE_GRAPH:
            child, ownership = int(params.graph.graph or 0), int(params.graph.ownership)
        elif kind in (NODE_EVENT_RECORD, NODE_WAIT_EVENT):
            event = int((params.eventRecord if kind == NODE_EVENT_RECORD else params.eventWait).event or 0)
        elif kind == NODE_CONDITIONAL:
            conditional = params.conditional
            handle, condition = int(conditional.handle or 0), int(conditional.type)
            size, context = int(conditional.size), int(conditional.ctx or 0)
            graphs = [int(body) for body in list(conditional.phGraph_out or [])[:size]]
        elif kind == NODE_MEM_FREE:
            dptr = int(params.free.dptr or 0)
        self._adopt("CUgraph", child)  # a cloned child graph: the node's, which the session may name
        for body in graphs:
            self._adopt("CUgraph", body)
        return Reply(SUCCESS, call.reply.encode(kind, context, child, ownership, event, handle, condition, size, dptr,
                                                [(body,) for body in graphs]))

    # --- kernel node attributes -----------------------------------------------------------------------------------
    def _attribute(self, node: int, attribute: int) -> Any:
        """The wheel's CUkernelNodeAttrID of a plain attribute of the session's node, or the Reply refusing it."""
        if not self._owned("CUgraphNode", node):
            return Reply(INVALID_VALUE)
        if attribute not in LAUNCH_ATTRIBUTES_PLAIN:
            return Reply(NOT_SUPPORTED)  # event IDs, DEVICE_UPDATABLE_KERNEL_NODE, IDs newer than the table
        try:
            return self.driver.CUkernelNodeAttrID(attribute)
        except ValueError:
            return Reply(NOT_SUPPORTED)  # newer than the host's cuda-bindings: as a driver without it

    @HOST.serves("cuGraphKernelNodeGetAttribute")
    def _kernel_attribute_get(self, call: DriverCall, payload: bytes) -> Reply:
        node, attribute = call.request.decode(payload)
        which = self._attribute(node, attribute)
        if isinstance(which, Reply):
            return which
        err, value = self.driver.cuGraphKernelNodeGetAttribute(node, which)
        if int(err) != SUCCESS:
            return Reply(int(err))
        return Reply(SUCCESS, call.reply.encode(ctypes.string_at(int(value.getPtr()), ATTRIBUTE_BYTES)))

    @HOST.serves("cuGraphKernelNodeSetAttribute")
    def _kernel_attribute_set(self, call: DriverCall, payload: bytes) -> Reply:
        node, attribute, value = call.request.decode(payload)
        if len(value) != ATTRIBUTE_BYTES:
            return Reply(Status.MALFORMED, f"{call.name}: a {len(value)}-byte value, not "
                                           f"{ATTRIBUTE_BYTES}".encode())
        which = self._attribute(node, attribute)
        if isinstance(which, Reply):
            return which
        buffer = ctypes.create_string_buffer(bytes(value), ATTRIBUTE_BYTES)
        (err,) = self.driver.cuGraphKernelNodeSetAttribute(
            node, which, self.driver.CUkernelNodeAttrValue(_ptr=ctypes.addressof(buffer)))
        del buffer  # kept alive until the driver has read the value
        return Reply(int(err))

    # --- capture into a given graph -------------------------------------------------------------------------------
    def _capture_dependencies(self, call: DriverCall, stream: int, deps: Sequence[tuple[int]],
                              words: Sequence[tuple[int]]) -> tuple[list[Any], list[Any]] | Reply:
        """A capture's stream, dependencies and edge data checked: (the wheel's nodes, edges) or the Reply."""
        if len(words) not in (0, len(deps)):
            return Reply(Status.MALFORMED, f"{call.name}: {len(deps)} dependencies and {len(words)} edges do not "
                                           f"pair up".encode())
        if stream and not self._owned("CUstream", stream):
            return Reply(INVALID_HANDLE)
        nodes = self._dependencies(call, deps)
        if isinstance(nodes, Reply):
            return nodes
        edges = [self._edge_data(word) for (word,) in words]
        if any(edge is None for edge in edges):
            return Reply(INVALID_VALUE)  # cuda.h: its reserved bytes must be zero
        return nodes, edges

    @HOST.serves("cuStreamBeginCaptureToGraph")
    def _begin_capture_to_graph(self, call: DriverCall, payload: bytes) -> Reply:
        stream, graph, mode, deps, words = call.request.decode(payload)
        checked = self._capture_dependencies(call, stream, deps, words)
        if isinstance(checked, Reply):
            return checked
        if not self._owned("CUgraph", graph):
            return Reply(INVALID_VALUE)
        nodes, edges = checked
        try:
            capture_mode = self.driver.CUstreamCaptureMode(mode)
        except ValueError:
            return Reply(INVALID_VALUE)
        (err,) = self.driver.cuStreamBeginCaptureToGraph(stream, graph, nodes or None, edges or None, len(nodes),
                                                         capture_mode)
        return Reply(int(err))

    @HOST.serves("cuStreamUpdateCaptureDependencies")
    def _update_capture_dependencies(self, call: DriverCall, payload: bytes) -> Reply:
        stream, flags, deps, words = call.request.decode(payload)
        checked = self._capture_dependencies(call, stream, deps, words)
        if isinstance(checked, Reply):
            return checked
        nodes, edges = checked
        (err,) = self.driver.cuStreamUpdateCaptureDependencies(stream, nodes or None, edges or None, len(nodes),
                                                               flags)
        return Reply(int(err))

    # --- instantiation with parameters ----------------------------------------------------------------------------
    @HOST.serves("cuGraphInstantiateWithParams")
    def _instantiate_with_params(self, call: DriverCall, payload: bytes) -> Reply:
        graph, flags, upload = call.request.decode(payload)
        if not self._owned("CUgraph", graph):
            return Reply(INVALID_VALUE)
        if upload and not self._owned("CUstream", upload):
            return Reply(INVALID_HANDLE)
        params = self.driver.CUDA_GRAPH_INSTANTIATE_PARAMS()
        params.flags, params.hUploadStream = flags, upload
        err, graph_exec = self.driver.cuGraphInstantiateWithParams(graph, params)
        if int(err) != SUCCESS:
            return Reply(int(err))
        made, error_node = int(graph_exec), int(params.hErrNode_out or 0)
        self.ledger.record(call, (graph,), [made])  # the executable graph, and the quota measures (its effect)
        self._adopt("CUgraphNode", error_node)
        return Reply(SUCCESS, call.reply.encode(made, int(params.result_out), error_node))

    # --- memory allocation and free nodes ----------------------------------------------------------------------------
    def _access_descs(self, access: Sequence[tuple[int, int, int]]) -> list[Any] | Reply:
        """CUmemAccessDesc's as the wheel takes them, each device a guest ordinal made the session's GPU."""
        driver, descs = self.driver, []
        for kind, ordinal, flags in access:
            device = self._location(kind, ordinal, INVALID_VALUE)  # cuda.h documents no INVALID_DEVICE here
            if isinstance(device, Reply):
                return device
            desc = driver.CUmemAccessDesc()
            try:
                desc.location.type = driver.CUmemLocationType(kind)
                desc.flags = driver.CUmemAccess_flags(flags)
            except ValueError:
                return Reply(INVALID_VALUE)
            desc.location.id = device
            descs.append(desc)
        return descs

    @HOST.serves("cuGraphAddMemAllocNode")
    def _add_mem_alloc_node(self, call: DriverCall, payload: bytes) -> Reply:
        """A graph allocation on one of the session's GPUs, counted against its quota (module docstring)."""
        (graph, kind, handle_types, location_kind, location, max_size, usage, rdma, size, deps,
         access) = call.request.decode(payload)
        if len(access) > MAX_ACCESS_DESCS:
            return Reply(Status.MALFORMED, f"{call.name}: {len(access)} access descriptors, more than "
                                           f"{MAX_ACCESS_DESCS}".encode())
        if not self._owned("CUgraph", graph):
            return Reply(INVALID_VALUE)
        nodes = self._dependencies(call, deps)
        if isinstance(nodes, Reply):
            return nodes
        device = self._location(location_kind, location, INVALID_VALUE)
        if isinstance(device, Reply):
            return device
        descs = self._access_descs(access)
        if isinstance(descs, Reply):
            return descs
        driver = self.driver
        params = driver.CUDA_MEM_ALLOC_NODE_PARAMS()
        props = params.poolProps
        try:
            props.allocType = driver.CUmemAllocationType(kind)
            props.handleTypes = driver.CUmemAllocationHandleType(handle_types)
            props.location.type = driver.CUmemLocationType(location_kind)
        except ValueError:
            return Reply(INVALID_VALUE)
        props.location.id = device
        props.maxSize, props.usage = max_size, usage
        if rdma and not hasattr(props, "gpuDirectRDMACapable"):  # a newer cuda.h's field (cuda-bindings 13.3 lacks it)
            return Reply(NOT_SUPPORTED)
        if rdma:
            props.gpuDirectRDMACapable = rdma
        params.accessDescs, params.accessDescCount, params.bytesize = descs, len(descs), size
        if not self.quota.allocation_fits(size, location):
            return Reply(OUT_OF_MEMORY)  # past the vGPU's quota: as a full GPU would
        err, node = driver.cuGraphAddMemAllocNode(graph, nodes or None, len(nodes), params)
        if int(err) != SUCCESS:
            return Reply(int(err))
        made, dptr = int(node), int(params.dptr)
        self.ledger.handles["CUgraphNode"].add(made)
        self._node_graphs()[made] = graph
        self._allocations()[dptr] = (graph, made, location, size)
        self.ledger.graph_memory[dptr] = size
        self.quota.allocated(size, location)
        return Reply(SUCCESS, call.reply.encode(made, dptr))

    @HOST.serves("cuGraphAddMemFreeNode")
    def _add_mem_free_node(self, call: DriverCall, payload: bytes) -> Reply:
        graph, dptr, deps = call.request.decode(payload)
        if not self._owned("CUgraph", graph):
            return Reply(INVALID_VALUE)
        nodes = self._dependencies(call, deps)
        if isinstance(nodes, Reply):
            return nodes
        if not self.ledger.owns(dptr, 1):
            return Reply(INVALID_VALUE)  # not the session's memory (whether an allocation node made it: the driver's)
        err, node = self.driver.cuGraphAddMemFreeNode(graph, nodes or None, len(nodes), dptr)
        return self._made(call, err, node, graph)

    @HOST.serves("cuGraphMemAllocNodeGetParams")
    def _mem_alloc_node_get(self, call: DriverCall, payload: bytes) -> Reply:
        node = self._graph_node(call, payload)
        if isinstance(node, Reply):
            return node
        err, params = self.driver.cuGraphMemAllocNodeGetParams(node)
        if int(err) != SUCCESS:
            return Reply(int(err))
        props = params.poolProps
        location = self._guest_location(int(props.location.type), int(props.location.id))
        descs = access_descs(params)
        if descs is None:
            return Reply(NOT_SUPPORTED)  # more than a program names: not what the session's node was given
        access = [(kind, self._guest_location(kind, device), flags) for kind, device, flags in descs]
        if location is None or any(ordinal is None for _kind, ordinal, _flags in access):
            return Reply(NOT_SUPPORTED)  # a device that is not one of the session's: no ordinal to give
        return Reply(SUCCESS, call.reply.encode(
            int(props.allocType), int(props.handleTypes), int(props.location.type), location, int(props.maxSize),
            int(props.usage), int(getattr(props, "gpuDirectRDMACapable", 0)), int(params.bytesize),
            int(params.dptr or 0), self._node_graphs().get(node, 0), access))

    def _guest_location(self, kind: int, device: int) -> int | None:
        """A CUmemLocation's id in the guest's terms: a device as the guest's ordinal (None: not the session's)."""
        if kind != CU_MEM_LOCATION_TYPE_DEVICE:
            return device
        ordinal = self.contexts.vgpu(device)
        return ordinal if ordinal >= 0 else None

    # --- graph memory attributes ----------------------------------------------------------------------------------
    def _graph_mem_attribute(self, device: int, attribute: int) -> tuple[int, Any] | Reply:
        if not 0 <= device < len(self.ledger.devices):
            return Reply(INVALID_DEVICE)
        try:
            return self.ledger.devices[device], self.driver.CUgraphMem_attribute(attribute)
        except ValueError:
            return Reply(INVALID_VALUE)

    @HOST.serves("cuDeviceGetGraphMemAttribute")
    def _graph_mem_attribute_get(self, call: DriverCall, payload: bytes) -> Reply:
        checked = self._graph_mem_attribute(*call.request.decode(payload))
        if isinstance(checked, Reply):
            return checked
        err, value = self.driver.cuDeviceGetGraphMemAttribute(*checked)
        if int(err) != SUCCESS:
            return Reply(int(err))
        return Reply(SUCCESS, call.reply.encode(int(value)))

    @HOST.serves("cuDeviceSetGraphMemAttribute")
    def _graph_mem_attribute_set(self, call: DriverCall, payload: bytes) -> Reply:
        device, attribute, value = call.request.decode(payload)
        checked = self._graph_mem_attribute(device, attribute)
        if isinstance(checked, Reply):
            return checked
        (err,) = self.driver.cuDeviceSetGraphMemAttribute(*checked, self.driver.cuuint64_t(value))
        return Reply(int(err))

    # --- the DOT description ----------------------------------------------------------------------------------------
    @HOST.serves("cuGraphDebugDotPrint")
    def _dot_print(self, call: DriverCall, payload: bytes) -> Reply:
        """The driver's DOT text, written into a private temporary file and read back (module docstring)."""
        graph, flags = call.request.decode(payload)
        if not self._owned("CUgraph", graph):
            return Reply(INVALID_VALUE)
        with tempfile.TemporaryDirectory(prefix="orion-dot-") as where:
            path = os.path.join(where, "graph.dot")
            (err,) = self.driver.cuGraphDebugDotPrint(graph, path.encode(), flags)
            if int(err) != SUCCESS:
                return Reply(int(err))
            try:
                if os.path.getsize(path) > MAX_DOT_BYTES:
                    return Reply(NOT_SUPPORTED)
                with open(path, "rb") as text:
                    return Reply(SUCCESS, call.reply.encode(text.read(MAX_DOT_BYTES)))
            except OSError:
                return Reply(CUDA_ERROR_OPERATING_SYSTEM)


def access_descs(params: Any) -> list[tuple[int, int, int]] | None:
    """A CUDA_MEM_ALLOC_NODE_PARAMS' access descriptors as (location type, id, flags), read from the array its C
    struct points at: cuda-bindings' `accessDescs` getter answers only a list set from Python, not the driver's (a
    stand-in without a C struct, the fake, answers its list). None for more than MAX_ACCESS_DESCS."""
    count = int(params.accessDescCount)
    if count > MAX_ACCESS_DESCS:
        return None
    if not hasattr(params, "getPtr"):
        return [(int(d.location.type), int(d.location.id), int(d.flags)) for d in list(params.accessDescs)[:count]]
    base = int(params.getPtr())
    array = ctypes.c_uint64.from_address(base + ACCESS_DESCS_AT).value
    if count and not array:
        return None
    found = [(ctypes.c_int * 3).from_address(array + ACCESS_DESC_BYTES * i) for i in range(count)]
    return [(int(kind), int(device), int(flags)) for kind, device, flags in found]


def _copy_fields(copy: Any) -> CopyFields | None:
    """A wheel CUDA_MEMCPY3D as driver_api.MEMCPY_3D's 21 values (None where a memory type is none cuda.h has)."""
    values: list[int] = []
    try:
        for side in ("src", "dst"):
            values += [int(getattr(copy, side + name) or 0) for name in ("XInBytes", "Y", "Z", "LOD")]
            values += [int(getattr(copy, side + "MemoryType")), int(getattr(copy, side + "Host") or 0),
                       int(getattr(copy, side + "Device") or 0), int(getattr(copy, side + "Pitch")),
                       int(getattr(copy, side + "Height"))]
    except ValueError:
        return None
    return (*values, int(copy.WidthInBytes), int(copy.Height), int(copy.Depth))


def _reach(pitch: int, rows: int, extent: Sequence[int]) -> int:
    """The bytes a copy side's extent reaches from its first byte (graph_calls._copy_side's reach)."""
    width, height, depth = extent
    return (depth - 1) * pitch * rows + (height - 1) * pitch + width if width and height and depth else 0


def _read_params(address: int, layout: list[tuple[int, int]]) -> bytes | None:
    """The values a driver's `kernelParams` array points at, packed at the layout's offsets (None: a NULL entry)."""
    buffer = bytearray(max((offset + size for offset, size in layout), default=0))
    if not layout:
        return bytes(buffer)
    pointers = (ctypes.c_void_p * len(layout)).from_address(address)
    for (offset, size), pointer in zip(layout, pointers, strict=True):
        if not pointer:
            return None
        buffer[offset:offset + size] = ctypes.string_at(pointer, size)
    return bytes(buffer)


def _read_extra(address: int) -> bytes | None:
    """The packed buffer a driver's `extra` list (CU_LAUNCH_PARAM_BUFFER_POINTER/SIZE, END) names (None: not one)."""
    word = ctypes.sizeof(ctypes.c_void_p)
    buffer = size_at = None
    for index in range(MAX_EXTRA_PAIRS):
        key = ctypes.c_void_p.from_address(address + 2 * index * word).value or 0
        if key == CU_LAUNCH_PARAM_END:
            break
        value = ctypes.c_void_p.from_address(address + (2 * index + 1) * word).value or 0
        if key == CU_LAUNCH_PARAM_BUFFER_POINTER:
            buffer = value
        elif key == CU_LAUNCH_PARAM_BUFFER_SIZE:
            size_at = value
        else:
            return None
    else:
        return None
    if not buffer or not size_at:
        return None
    size = ctypes.c_size_t.from_address(size_at).value
    return ctypes.string_at(buffer, size) if size <= MAX_PARAM_BYTES else None
