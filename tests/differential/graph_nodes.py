"""CUDA graphs built node by node, as XLA's command buffers and PyTorch's CUDA graphs build them: one fixed program
whose transcript must be the same on the fake driver called directly and through the native `libcuda.so.1`, on a
local region and relayed (tests/differential/test_graph_nodes.py; the capsule path answers
CUDA_ERROR_NOT_SUPPORTED for these calls: guest_runtime/forward.py NATIVE_ONLY).

The program builds a graph with every node-adding call of the call table: a memset node (1D and 2D), kernel nodes
of `orion_fake_add_u32` (the kernel the fake driver runs: tests/fake_driver.py ADD_KERNEL; ADD_PTX compiles it on a
GPU) with their parameters from `kernelParams` and from an `extra` buffer, an empty node joining two branches,
device-to-device memcpy nodes (1D, and 2D with offsets and pitches), a child graph node (a graph with a kernel node
of its own), event record and wait nodes and, with `pinned`, memcpy nodes from and to page-locked memory around a
kernel node. It adds and removes an edge, queries nodes, root nodes, edges and each node's dependencies and
dependents (with arrays larger and smaller than the answer, and without arrays: the count only), instantiates the
graph, launches it twice and reads the memory back; then sets parameters on the graph's nodes (kernel, memset,
memcpy) and on the executable graph's copies of them, relaunches (the executable graph's changes only), updates the
executable graph from the graph (cuGraphExecUpdate: the graph's changes now), relaunches; an update from a graph of
another topology fails (and the executable graph runs as before). A second graph holds a programmatic edge (edge
data of its own): queries without an edge-data array answer CUDA_ERROR_LOSSY_QUERY. Last, what the driver refuses:
a memset or memcpy node reaching past an allocation, a kernel node of an unknown function, an unknown graph or
dependency, NULL outputs, an existing edge added again.

Handles are never compared between paths (each driver gives its own): a node is shown as its index among the nodes
the program made (-1 for NULL), a node type as cuGraphNodeGetType's number, memory as its words.

A second program (AddNodeProgram, tests/differential/test_graph_add_node.py) builds its graph with cuGraphAddNode alone,
as XLA's command buffers do: a node of every type the generic call is served for (memset, kernel, empty, memcpy, a
cloned child graph, event record and wait), one of them after an edge with data of its own (programmatic), conditional
nodes (IF with one body and with two, WHILE, SWITCH with three bodies) whose bodies it fills with cuGraphAddNode too,
each handle's value given by cuGraphConditionalHandleCreate's default (applied at each launch), and a child graph with a
kernel node moved into its node (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE, as XLA adds one); it launches the graph, sets
kernel and memset parameters with cuGraphNodeSetParams and cuGraphExecNodeSetParams, the moved graph's kernel node
through the parent's executable graph (cuGraphExecKernelNodeSetParams) and in the moved graph itself, relaunches,
instantiates again, and shows what is refused: reserved fields, node types not forwarded (801), memory nodes of zeroed
parameters (graph_queries.py has them made), a graph moved into itself or into a graph it holds, a moved graph moved,
cloned, destroyed, instantiated or updated from on its own, bad conditional parameters, an unknown handle, an edge the
driver refuses (the graph keeps no node); the moved graph goes with its parent.

Run in a process of its own with a C driver library (the native guest driver, ORION_SHM set; or the real libcuda
on a GPU):

    python -m tests.differential.graph_nodes LIBRARY [pinned] [add-node]

prints one JSON object: {"transcript": [...]} (AddNodeProgram's with `add-node`). The library's functions are looked
up as a program built against CUDA 13's cuda.h names them (cuGraphAddKernelNode_v2, cuGraphGetEdges_v2,
cuGraphExecUpdate_v2, cuGraphAddNode_v2, cuGraphInstantiateWithFlags...).
"""
from __future__ import annotations

import ctypes
import json
import struct
import sys
from typing import Any

from tests.differential import capture_graphs
from tests.differential.corpus import NON_BLOCKING, SUCCESS, Table, ctypes_table
from tests.differential.pool_kernels import ADD_PTX

WORDS = capture_graphs.WORDS  # the u32 words of each device buffer the program uses and shows (read_words)
NULL_NODE = -1
U32, U64, I32, SZ = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int, ctypes.c_size_t
P, UI = ctypes.c_void_p, ctypes.c_uint
CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE = 1, 2
CU_LAUNCH_PARAM_END, CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2
PROGRAMMATIC = 1  # CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC, and CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC
BAD_HANDLE = 0xBAD0


# --- cuda.h's structs (CUDA 13) ----------------------------------------------------------------------------------

class KernelNodeParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS (cuda.h's _v2: with kern and ctx)."""
    _fields_ = [("func", U64), ("gridDimX", UI), ("gridDimY", UI), ("gridDimZ", UI), ("blockDimX", UI),
                ("blockDimY", UI), ("blockDimZ", UI), ("sharedMemBytes", UI), ("kernelParams", P), ("extra", P),
                ("kern", U64), ("ctx", U64)]


class MemsetNodeParams(ctypes.Structure):
    """CUDA_MEMSET_NODE_PARAMS."""
    _fields_ = [("dst", U64), ("pitch", SZ), ("value", UI), ("elementSize", UI), ("width", SZ), ("height", SZ)]


def _side(prefix: str) -> list[tuple[str, Any]]:
    return [(prefix + "XInBytes", SZ), (prefix + "Y", SZ), (prefix + "Z", SZ), (prefix + "LOD", SZ),
            (prefix + "MemoryType", I32), (prefix + "Host", P), (prefix + "Device", U64), (prefix + "Array", P),
            ("reserved" + ("0" if prefix == "src" else "1"), P), (prefix + "Pitch", SZ), (prefix + "Height", SZ)]


class Memcpy3D(ctypes.Structure):
    """CUDA_MEMCPY3D."""
    _fields_ = [*_side("src"), *_side("dst"), ("WidthInBytes", SZ), ("Height", SZ), ("Depth", SZ)]


class EdgeData(ctypes.Structure):
    """CUgraphEdgeData: 8 bytes."""
    _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte),
                ("reserved", ctypes.c_ubyte * 5)]


class UpdateResultInfo(ctypes.Structure):
    """CUgraphExecUpdateResultInfo."""
    _fields_ = [("result", I32), ("errorNode", U64), ("errorFromNode", U64)]


class MemcpyNodeParams(ctypes.Structure):
    """CUDA_MEMCPY_NODE_PARAMS."""
    _fields_ = [("flags", I32), ("reserved", I32), ("copyCtx", U64), ("copyParams", Memcpy3D)]


class MemsetNodeParamsV2(ctypes.Structure):
    """CUDA_MEMSET_NODE_PARAMS_v2: CUDA_MEMSET_NODE_PARAMS and its context."""
    _fields_ = [*MemsetNodeParams._fields_, ("ctx", U64)]


class ChildGraphNodeParams(ctypes.Structure):
    """CUDA_CHILD_GRAPH_NODE_PARAMS."""
    _fields_ = [("graph", U64), ("ownership", I32)]


class EventNodeParams(ctypes.Structure):
    """CUDA_EVENT_RECORD_NODE_PARAMS and CUDA_EVENT_WAIT_NODE_PARAMS."""
    _fields_ = [("event", U64)]


class ConditionalNodeParams(ctypes.Structure):
    """CUDA_CONDITIONAL_NODE_PARAMS."""
    _fields_ = [("handle", U64), ("type", I32), ("size", UI), ("phGraph_out", P), ("ctx", U64)]


class MemPoolProps(ctypes.Structure):
    """CUmemPoolProps (CUDA 13: its first reserved byte gpuDirectRDMACapable)."""
    _fields_ = [("allocType", I32), ("handleTypes", I32), ("locationType", I32), ("locationId", I32),
                ("win32SecurityAttributes", P), ("maxSize", SZ), ("usage", ctypes.c_ushort),
                ("gpuDirectRDMACapable", ctypes.c_ubyte), ("reserved", ctypes.c_ubyte * 53)]


class MemAccessDesc(ctypes.Structure):
    """CUmemAccessDesc: a location (type, id) and its flags."""
    _fields_ = [("locationType", I32), ("locationId", I32), ("flags", I32)]


class MemAllocNodeParams(ctypes.Structure):
    """CUDA_MEM_ALLOC_NODE_PARAMS (and _v2, CUgraphNodeParams' `alloc`)."""
    _fields_ = [("poolProps", MemPoolProps), ("accessDescs", P), ("accessDescCount", SZ), ("bytesize", SZ),
                ("dptr", U64)]


class _NodeUnion(ctypes.Union):
    _fields_ = [("reserved1", ctypes.c_longlong * 29), ("kernel", KernelNodeParams), ("memcpy", MemcpyNodeParams),
                ("memset", MemsetNodeParamsV2), ("graph", ChildGraphNodeParams), ("eventWait", EventNodeParams),
                ("eventRecord", EventNodeParams), ("conditional", ConditionalNodeParams), ("alloc", MemAllocNodeParams),
                ("free", U64)]


class NodeParams(ctypes.Structure):
    """CUgraphNodeParams (CUDA 13.0): the type, three reserved ints, the union of per-type structs, a reserved one."""
    _anonymous_ = ("u",)
    _fields_ = [("type", I32), ("reserved0", I32 * 3), ("u", _NodeUnion), ("reserved2", ctypes.c_longlong)]


assert ctypes.sizeof(KernelNodeParams) == 72 and ctypes.sizeof(MemsetNodeParams) == 40
assert ctypes.sizeof(Memcpy3D) == 200 and ctypes.sizeof(EdgeData) == 8 and ctypes.sizeof(UpdateResultInfo) == 24
assert ctypes.sizeof(NodeParams) == 256 and NodeParams.u.offset == 16 and ctypes.sizeof(MemcpyNodeParams) == 216
assert ctypes.sizeof(MemsetNodeParamsV2) == 48 and ctypes.sizeof(ConditionalNodeParams) == 32
assert ctypes.sizeof(MemPoolProps) == 88 and ctypes.sizeof(MemAllocNodeParams) == 120
assert ctypes.sizeof(MemAccessDesc) == 12

# CUgraphNodeType, CUgraphConditionalNodeType, CUgraphChildGraphNodeOwnership, cuGraphConditionalHandleCreate's flag
KERNEL, MEMCPY, MEMSET, HOST, GRAPH, EMPTY, WAIT_EVENT, EVENT_RECORD = range(8)
EXT_SEMAS_SIGNAL, EXT_SEMAS_WAIT, MEM_ALLOC, MEM_FREE, BATCH_MEM_OP, CONDITIONAL = range(8, 14)
COND_IF, COND_WHILE, COND_SWITCH = 0, 1, 2
OWNERSHIP_CLONE, OWNERSHIP_MOVE = 0, 1
ASSIGN_DEFAULT = 1

# What the program calls besides capture_graphs' table (name -> ctypes argument types).
PROTOTYPES: dict[str, list[Any]] = {
    "cuGraphCreate": [P, UI], "cuEventRecord": [U64, U64], "cuEventSynchronize": [U64],
    "cuGraphAddEmptyNode": [P, U64, P, SZ], "cuGraphAddChildGraphNode": [P, U64, P, SZ, U64],
    "cuGraphAddEventRecordNode": [P, U64, P, SZ, U64], "cuGraphAddEventWaitNode": [P, U64, P, SZ, U64],
    "cuGraphAddMemsetNode": [P, U64, P, SZ, P, U64], "cuGraphAddMemcpyNode": [P, U64, P, SZ, P, U64],
    "cuGraphAddKernelNode": [P, U64, P, SZ, P],
    "cuGraphAddDependencies": [U64, P, P, P, SZ], "cuGraphRemoveDependencies": [U64, P, P, P, SZ],
    "cuGraphGetNodes": [U64, P, P], "cuGraphGetRootNodes": [U64, P, P], "cuGraphGetEdges": [U64, P, P, P, P],
    "cuGraphNodeGetDependencies": [U64, P, P, P], "cuGraphNodeGetDependentNodes": [U64, P, P, P],
    "cuGraphKernelNodeSetParams": [U64, P], "cuGraphExecKernelNodeSetParams": [U64, U64, P],
    "cuGraphMemsetNodeSetParams": [U64, P], "cuGraphExecMemsetNodeSetParams": [U64, U64, P, U64],
    "cuGraphMemcpyNodeSetParams": [U64, P], "cuGraphExecMemcpyNodeSetParams": [U64, U64, P, U64],
    "cuGraphExecUpdate": [U64, U64, P],
    "cuGraphAddNode": [P, U64, P, P, SZ, P], "cuGraphNodeSetParams": [U64, P],
    "cuGraphExecNodeSetParams": [U64, U64, P],
    "cuGraphConditionalHandleCreate": [P, U64, U64, UI, UI], "cuGraphDestroyNode": [U64],
}


def library_table(library: ctypes.CDLL) -> Table:
    """Every function the program calls, from a C driver library, by cuda.h's names."""
    table = capture_graphs.library_table(library)
    table.update(ctypes_table(library, PROTOTYPES))
    return table


def _nodes(*handles: int) -> Any:
    return (U64 * max(len(handles), 1))(*handles)


class GraphNodeProgram:
    """Runs the program against a C-ABI driver `table` with capture_graphs' functions and PROTOTYPES above."""

    def __init__(self, table: Table, pinned: bool = True) -> None:
        self.t, self.pinned = table, pinned
        self.image = ctypes.create_string_buffer(ADD_PTX, len(ADD_PTX))
        self.out: list[list[Any]] = []
        self.made: list[int] = []  # every node the program made, in order: a node is shown as its index here
        self.names: dict[str, int] = {}  # node name -> its handle
        self._keep: list[Any] = []  # what kernel node parameters point at, alive for the program's length

    # --- helpers --------------------------------------------------------------------------------------------------
    def note(self, step: str, statuses: list[Any], values: Any = None) -> None:
        self.out.append([step, [int(s) for s in statuses], values])

    def _out(self, name: str, *args: Any, cell: Any = None) -> int:
        cell = cell if cell is not None else U64()
        status = self.t[name](ctypes.addressof(cell), *args)
        if status != SUCCESS:
            raise RuntimeError(f"graph program: {name} answered {status}")
        return int(cell.value)

    def _index(self, handle: int) -> Any:
        if not handle:
            return NULL_NODE
        return self.made.index(handle) if handle in self.made else "unknown"

    def _read(self, pointer: int) -> list[Any]:
        return capture_graphs.read_words(self.t, pointer)

    def _memory(self) -> dict[str, list[Any]]:
        found = {name: self._read(pointer) for name, pointer in self.buffers.items()}
        if self.pinned:
            found["pinned_out"] = list(self.pinned_out)
        return found

    def _ref(self, struct_: Any) -> int:
        """The address of a struct the program passes, kept alive for the program's length."""
        self._keep.append(struct_)
        return ctypes.addressof(struct_)

    def _node(self, name: str, status: int, cell: Any) -> int:
        """A node-adding call's status; the node, if made, named and counted."""
        if status == SUCCESS:
            self.made.append(int(cell.value))
            self.names[name] = int(cell.value)
        return status

    def _deps(self, *names: str) -> tuple[Any, int]:
        array = _nodes(*[self.names[n] for n in names])
        self._keep.append(array)
        return (ctypes.addressof(array) if names else None), len(names)

    def _add_params(self, words: int, value: int, blocks: int = 1) -> KernelNodeParams:
        """A kernel node of orion_fake_add_u32(words, WORDS, value), its parameters from kernelParams."""
        cells = (U64(words), U32(WORDS), U32(value))
        pointers = (ctypes.c_void_p * 3)(*[ctypes.addressof(c) for c in cells])
        self._keep += [cells, pointers]
        params = KernelNodeParams(func=self.function, gridDimX=blocks, gridDimY=1, gridDimZ=1, blockDimX=WORDS,
                                  blockDimY=1, blockDimZ=1)
        params.kernelParams = ctypes.addressof(pointers)
        return params

    def _add_params_extra(self, words: int, value: int) -> KernelNodeParams:
        """The same kernel node, its parameters packed by the program into an `extra` buffer."""
        buffer = ctypes.create_string_buffer(struct.pack("<QII", words, WORDS, value), 16)
        size = SZ(16)
        extra = (ctypes.c_void_p * 5)(CU_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(buffer),
                                      CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size), CU_LAUNCH_PARAM_END)
        self._keep += [buffer, size, extra]
        params = KernelNodeParams(func=self.function, gridDimX=1, gridDimY=1, gridDimZ=1, blockDimX=WORDS,
                                  blockDimY=1, blockDimZ=1)
        params.extra = ctypes.addressof(extra)
        return params

    @staticmethod
    def _memset(dst: int, value: int, width: int = WORDS, height: int = 1, pitch: int = 0) -> MemsetNodeParams:
        return MemsetNodeParams(dst=dst, pitch=pitch, value=value, elementSize=4, width=width, height=height)

    @staticmethod
    def _copy(dst: int, src: int, size: int = 4 * WORDS, dst_type: int = CU_MEMORYTYPE_DEVICE,
              src_type: int = CU_MEMORYTYPE_DEVICE) -> Memcpy3D:
        """A 1D copy of `size` bytes (a host side by its address)."""
        copy = Memcpy3D(srcMemoryType=src_type, dstMemoryType=dst_type, WidthInBytes=size, Height=1, Depth=1)
        if src_type == CU_MEMORYTYPE_HOST:
            copy.srcHost = src
        else:
            copy.srcDevice = src
        if dst_type == CU_MEMORYTYPE_HOST:
            copy.dstHost = dst
        else:
            copy.dstDevice = dst
        return copy

    def _add(self, name: str, call: str, deps: tuple[str, ...], *args: Any) -> int:
        cell = U64()
        pointer, count = self._deps(*deps)
        return self._node(name, self.t[call](ctypes.addressof(cell), self.graph, pointer, count, *args), cell)

    def _list(self, name: str, handle: int, room: int | None, with_edges: bool = False) -> list[Any]:
        """A node query (cuGraphGetNodes/GetRootNodes, cuGraphNodeGetDependencies/DependentNodes) with an array of
        `room` entries (None: no array, the count only): [status, count, the entries, their edge data]."""
        count = SZ(room or 0)
        nodes = (U64 * max(room or 0, 1))(*[0x5A5A] * max(room or 0, 1))
        edges = (U64 * max(room or 0, 1))(*[0x5A5A] * max(room or 0, 1))
        array = ctypes.addressof(nodes) if room is not None else None
        args: list[Any] = [handle, array]
        if name.startswith("cuGraphNode"):
            args.append(ctypes.addressof(edges) if with_edges and room is not None else None)
        status = int(self.t[name](*args, ctypes.addressof(count)))
        entries = [self._index(n) for n in nodes[:room or 0]] if status == SUCCESS else []
        if len(entries) > 64:  # a large array: the entries written, then whether all the rest were set to NULL
            entries = [*entries[:count.value], all(e == NULL_NODE for e in entries[count.value:])]
        data = list(edges[:count.value]) if status == SUCCESS and with_edges and room is not None else None
        return [status, count.value if status == SUCCESS else None, entries, data]

    def _edges(self, graph: int, room: int | None, with_data: bool = True) -> list[Any]:
        """cuGraphGetEdges with arrays of `room` entries (None: the count only): [status, count, from, to, data]."""
        count = SZ(room or 0)
        size = max(room or 0, 1)
        sources, targets, data = (U64 * size)(), (U64 * size)(), (U64 * size)(*[0x5A5A] * size)
        args = [ctypes.addressof(a) if room is not None else None for a in (sources, targets)]
        args.append(ctypes.addressof(data) if room is not None and with_data else None)
        status = int(self.t["cuGraphGetEdges"](graph, *args, ctypes.addressof(count)))
        if status != SUCCESS:
            return [status]
        n = room or 0
        return [status, count.value, [self._index(s) for s in sources[:n]], [self._index(s) for s in targets[:n]],
                list(data[:count.value]) if with_data and room is not None else None]

    def _edge_call(self, name: str, graph: int, sources: list[str], targets: list[str],
                   words: list[int] | None) -> int:
        froms, tos = _nodes(*[self.names[n] for n in sources]), _nodes(*[self.names[n] for n in targets])
        data = (EdgeData * max(len(sources), 1))()
        for i, word in enumerate(words or []):
            data[i].from_port, data[i].to_port, data[i].type = word & 0xFF, (word >> 8) & 0xFF, (word >> 16) & 0xFF
        return int(self.t[name](graph, ctypes.addressof(froms), ctypes.addressof(tos),
                                ctypes.addressof(data) if words is not None else None, len(sources)))

    def _types(self) -> list[Any]:
        kinds = []
        for node in self.made:
            cell = I32(-1)
            status = self.t["cuGraphNodeGetType"](node, ctypes.addressof(cell))
            kinds.append(cell.value if status == SUCCESS else f"status {status}")
        return kinds

    def _launch(self, graph_exec: int, times: int) -> list[int]:
        return [*[self.t["cuGraphLaunch"](graph_exec, self.stream) for _ in range(times)],
                self.t["cuStreamSynchronize"](self.stream)]

    # --- the program ----------------------------------------------------------------------------------------------
    def _set_up(self, names: tuple[str, ...]) -> tuple[int, int]:
        """The context, the ADD kernel, a non-blocking stream and the buffers `names` (the first holding 0..WORDS-1,
        the rest zero), noted as the first step; two events: one for the program, one recorded outside any graph."""
        t = self.t
        device = I32()
        t["cuInit"](0)
        t["cuDeviceGet"](ctypes.addressof(device), 0)
        self.context = context = self._out("cuDevicePrimaryCtxRetain", device.value)
        t["cuCtxSetCurrent"](context)
        module = self._out("cuModuleLoadData", ctypes.addressof(self.image))
        self.function = self._out("cuModuleGetFunction", module, b"orion_fake_add_u32")
        self.stream = self._out("cuStreamCreate", NON_BLOCKING)
        event, outside = self._out("cuEventCreate", 0), self._out("cuEventCreate", 0)
        self.buffers = {name: self._out("cuMemAlloc", 4 * WORDS) for name in names}
        b = self.buffers
        initial = (U32 * WORDS)(*range(WORDS))
        self.note("initial memory", [t["cuMemcpyHtoD"](b[names[0]], ctypes.addressof(initial), 4 * WORDS),
                                     *[t["cuMemsetD32"](b[n], 0, WORDS) for n in names[1:]], t["cuCtxSynchronize"](),
                                     t["cuEventRecord"](outside, 0)])
        return event, outside

    def run(self) -> list[list[Any]]:
        t = self.t
        event, outside = self._set_up(("words", "marks", "copy", "spare", "grid", "grid2", "staged"))
        context, b = self.context, self.buffers
        if self.pinned:
            pinned_in, pinned_out = self._out("cuMemAllocHost", 4 * WORDS), self._out("cuMemAllocHost", 4 * WORDS)
            self.pinned_in = (U32 * WORDS).from_address(pinned_in)
            self.pinned_out = (U32 * WORDS).from_address(pinned_out)
            for i in range(WORDS):
                self.pinned_in[i], self.pinned_out[i] = 1000 + i, 0

        # the graph, node by node
        self.graph = graph = self._out("cuGraphCreate", 0)
        child = self._out("cuGraphCreate", 0)
        child_cell = U64()
        child_status = t["cuGraphAddKernelNode"](ctypes.addressof(child_cell), child, None, 0,
                                                 self._ref(self._add_params(b["spare"], 1)))
        self.note("a child graph with a kernel node (spare += 1)", [child_status])
        block = Memcpy3D(srcMemoryType=CU_MEMORYTYPE_DEVICE, srcDevice=b["words"], srcXInBytes=4, srcY=1,
                         srcPitch=16, srcHeight=4, dstMemoryType=CU_MEMORYTYPE_DEVICE, dstDevice=b["grid"], dstY=2,
                         dstPitch=16, dstHeight=4, WidthInBytes=8, Height=2, Depth=1)
        added = [
            self._add("memset", "cuGraphAddMemsetNode", (), self._ref(self._memset(b["marks"], 7)), context),
            self._add("marks += 3", "cuGraphAddKernelNode", ("memset",),
                      self._ref(self._add_params(b["marks"], 3))),
            self._add("words += 5 (extra)", "cuGraphAddKernelNode", (),
                      self._ref(self._add_params_extra(b["words"], 5))),
            self._add("join", "cuGraphAddEmptyNode", ("marks += 3", "words += 5 (extra)")),
            self._add("copy = words", "cuGraphAddMemcpyNode", ("join",),
                      self._ref(self._copy(b["copy"], b["words"])), context),
            self._add("child", "cuGraphAddChildGraphNode", ("copy = words",), child),
            self._add("record", "cuGraphAddEventRecordNode", ("child",), event),
            self._add("wait", "cuGraphAddEventWaitNode", (), outside),
            self._add("2D copy", "cuGraphAddMemcpyNode", ("copy = words",), self._ref(block), 0),
            self._add("2D memset", "cuGraphAddMemsetNode", (),
                      self._ref(self._memset(b["grid2"], 0x55, width=2, height=3, pitch=16)), context),
        ]
        if self.pinned:
            added += [
                self._add("staged = pinned_in", "cuGraphAddMemcpyNode", ("wait",),
                          self._ref(self._copy(b["staged"], ctypes.addressof(self.pinned_in),
                                                  src_type=CU_MEMORYTYPE_HOST)), context),
                self._add("staged += 1", "cuGraphAddKernelNode", ("staged = pinned_in",),
                          self._ref(self._add_params(b["staged"], 1))),
                self._add("pinned_out = staged", "cuGraphAddMemcpyNode", ("staged += 1",),
                          self._ref(self._copy(ctypes.addressof(self.pinned_out), b["staged"],
                                                  dst_type=CU_MEMORYTYPE_HOST)), context),
            ]
        self.note("nodes added", added, list(self.names))
        self.note("node types", [], self._types())

        # edges
        before = self._edges(graph, None)
        add = self._edge_call("cuGraphAddDependencies", graph, ["wait"], ["memset"], None)
        with_it = self._edges(graph, 32)
        again = self._edge_call("cuGraphAddDependencies", graph, ["memset"], ["marks += 3"], None)
        removed = self._edge_call("cuGraphRemoveDependencies", graph, ["wait"], ["memset"], [0])
        self.note("an edge added (wait -> memset), an existing one refused, the first removed",
                  [add, again, removed], [before, with_it, self._edges(graph, None)])

        # queries
        count = len(self.made)
        self.note("nodes: the count, an array as large, larger (NULL after), smaller, much larger", [], [
            self._list("cuGraphGetNodes", graph, None), self._list("cuGraphGetNodes", graph, count),
            self._list("cuGraphGetNodes", graph, count + 3), self._list("cuGraphGetNodes", graph, 2),
            self._list("cuGraphGetNodes", graph, 5000)])  # larger than a query asks for at once
        self.note("root nodes", [], [self._list("cuGraphGetRootNodes", graph, None),
                                     self._list("cuGraphGetRootNodes", graph, 8)])
        self.note("edges: with data, without (all default: no loss), fewer than there are", [], [
            self._edges(graph, 20), self._edges(graph, 20, with_data=False), self._edges(graph, 3)])
        join, memset = self.names["join"], self.names["memset"]
        self.note("dependencies of the join, dependents of the memset", [], [
            self._list("cuGraphNodeGetDependencies", join, None),
            self._list("cuGraphNodeGetDependencies", join, 4, with_edges=True),
            self._list("cuGraphNodeGetDependencies", join, 4),
            self._list("cuGraphNodeGetDependentNodes", memset, 1, with_edges=True),
            self._list("cuGraphNodeGetDependentNodes", self.names["record"], 2)])

        # instantiate, launch twice
        graph_exec = self._out("cuGraphInstantiate", graph, 0)
        self.note("instantiated, launched twice", self._launch(graph_exec, 2), self._memory())
        self.note("the event its node recorded", [t["cuEventSynchronize"](event), t["cuEventQuery"](event)])

        # parameters: on the graph's nodes (not yet in the executable graph) and on the executable graph's copies
        n = self.names
        self.note("parameters set on the graph's nodes and on the executable graph's", [
            t["cuGraphKernelNodeSetParams"](n["words += 5 (extra)"], self._ref(self._add_params(b["words"], 100))),
            t["cuGraphExecKernelNodeSetParams"](graph_exec, n["marks += 3"],
                                                self._ref(self._add_params(b["marks"], 1000))),
            t["cuGraphMemsetNodeSetParams"](memset, self._ref(self._memset(b["marks"], 9))),
            t["cuGraphExecMemsetNodeSetParams"](graph_exec, memset, self._ref(self._memset(b["marks"], 11)),
                                                context),
            t["cuGraphMemcpyNodeSetParams"](n["copy = words"], self._ref(self._copy(b["copy"], b["marks"]))),
            t["cuGraphExecMemcpyNodeSetParams"](graph_exec, n["copy = words"],
                                                self._ref(self._copy(b["copy"], b["spare"])), context)])
        if self.pinned:
            for i in range(WORDS):
                self.pinned_in[i] = 2000 + i  # the next launch must read these
        self.note("relaunched: the executable graph's changes only", self._launch(graph_exec, 1), self._memory())

        info = UpdateResultInfo(result=-1, errorNode=BAD_HANDLE, errorFromNode=BAD_HANDLE)
        updated = int(t["cuGraphExecUpdate"](graph_exec, graph, ctypes.addressof(info)))
        self.note("cuGraphExecUpdate from the graph: the graph's changes", [updated],
                  [info.result, self._index(info.errorNode), self._index(info.errorFromNode)])
        self.note("relaunched after the update", self._launch(graph_exec, 1), self._memory())
        other = self._out("cuGraphClone", graph)
        extra_cell = U64()
        grown = t["cuGraphAddEmptyNode"](ctypes.addressof(extra_cell), other, None, 0)
        failed = int(t["cuGraphExecUpdate"](graph_exec, other, ctypes.addressof(info)))
        self.note("cuGraphExecUpdate from a graph of another topology fails; the executable graph runs as before",
                  [grown, failed, *self._launch(graph_exec, 1)], self._memory())

        # edges with data of their own
        second = self._out("cuGraphCreate", 0)
        saved, self.graph = self.graph, second
        first_kernel = self._add("k1", "cuGraphAddKernelNode", (), self._ref(self._add_params(b["spare"], 0)))
        second_kernel = self._add("k2", "cuGraphAddKernelNode", (), self._ref(self._add_params(b["spare"], 0)))
        self.graph = saved
        word = PROGRAMMATIC | PROGRAMMATIC << 16  # from_port PROGRAMMATIC, type PROGRAMMATIC
        self.note("a programmatic edge: queries without an edge-data array are lossy", [
            first_kernel, second_kernel, self._edge_call("cuGraphAddDependencies", second, ["k1"], ["k2"], [word])], [
            self._edges(second, 2, with_data=False), self._edges(second, 2), self._edges(second, None),
            self._list("cuGraphNodeGetDependencies", n["k2"], 1),
            self._list("cuGraphNodeGetDependencies", n["k2"], 1, with_edges=True),
            self._list("cuGraphNodeGetDependencies", n["k2"], None)])
        self.note("removing it needs its data", [
            self._edge_call("cuGraphRemoveDependencies", second, ["k1"], ["k2"], None),
            self._edge_call("cuGraphRemoveDependencies", second, ["k1"], ["k2"], [word])], self._edges(second, None))

        # what is refused
        cell, one = U64(BAD_HANDLE), SZ(1)
        past = b["words"] + 4 * WORDS - 4
        unknown = KernelNodeParams(func=BAD_HANDLE, gridDimX=1, gridDimY=1, gridDimZ=1, blockDimX=1, blockDimY=1,
                                   blockDimZ=1)
        stranger = _nodes(BAD_HANDLE)
        self.note("refused: a memset past its allocation, a 2D one whose rows reach past it, a copy past it, a kernel "
                  "node of an unknown function, an unknown graph, an unknown dependency", [
                      t["cuGraphAddMemsetNode"](ctypes.addressof(cell), graph, None, 0,
                                                self._ref(self._memset(past, 1, width=2)), context),
                      t["cuGraphAddMemsetNode"](ctypes.addressof(cell), graph, None, 0,
                                                self._ref(self._memset(b["words"], 1, 1, 2, 4 * WORDS)), context),
                      t["cuGraphAddMemcpyNode"](ctypes.addressof(cell), graph, None, 0,
                                                self._ref(self._copy(b["copy"], b["words"], 8 * WORDS)), context),
                      t["cuGraphAddKernelNode"](ctypes.addressof(cell), graph, None, 0, self._ref(unknown)),
                      t["cuGraphAddEmptyNode"](ctypes.addressof(cell), BAD_HANDLE, None, 0),
                      t["cuGraphAddEmptyNode"](ctypes.addressof(cell), graph, ctypes.addressof(stranger), 1)],
                  [cell.value == BAD_HANDLE])
        self.note("refused: NULL outputs and arrays", [
            t["cuGraphGetNodes"](graph, None, None), t["cuGraphAddEmptyNode"](None, graph, None, 0),
            t["cuGraphAddEmptyNode"](ctypes.addressof(cell), graph, None, 1),
            t["cuGraphGetEdges"](graph, None, None, ctypes.addressof(cell), ctypes.addressof(one)),
            t["cuGraphExecUpdate"](graph_exec, graph, None)])

        self.note("destroy everything", [
            t["cuGraphExecDestroy"](graph_exec), t["cuGraphDestroy"](graph), t["cuGraphDestroy"](child),
            t["cuGraphDestroy"](other), t["cuGraphDestroy"](second), t["cuEventDestroy"](event),
            t["cuEventDestroy"](outside), t["cuStreamDestroy"](self.stream),
            *[t["cuMemFree"](pointer) for pointer in self.buffers.values()]])
        return self.out


class AddNodeProgram(GraphNodeProgram):
    """The graph of cuGraphAddNode (the module docstring), against the same kind of table."""

    def _params(self, kind: int, **members: Any) -> NodeParams:
        """A CUgraphNodeParams of type `kind`, zeroed (as cuda.h asks), with the union members given."""
        params = NodeParams(type=kind)
        for name, value in members.items():
            setattr(params, name, value)
        self._keep.append(params)
        return params

    def _kernel(self, words: int, value: int) -> NodeParams:
        return self._params(KERNEL, kernel=self._add_params(words, value))

    def _fill(self, dst: int, value: int) -> NodeParams:
        memset = MemsetNodeParamsV2(dst=dst, value=value, elementSize=4, width=WORDS, height=1, ctx=self.context)
        return self._params(MEMSET, memset=memset)

    def _move(self, child: int) -> NodeParams:
        """A child graph node of `child` moved in (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE)."""
        return self._params(GRAPH, graph=ChildGraphNodeParams(graph=child, ownership=OWNERSHIP_MOVE))

    def _conditional(self, handle: int, kind: int, size: int) -> NodeParams:
        return self._params(CONDITIONAL, conditional=ConditionalNodeParams(handle=handle, type=kind, size=size,
                                                                            ctx=self.context))

    def _add_node(self, name: str, graph: int, params: NodeParams, deps: tuple[str, ...] = (),
                  edges: list[int] | None = None) -> int:
        """cuGraphAddNode of `params` into `graph` after `deps`, with edge data `edges` (words; None: NULL)."""
        cell = U64(BAD_HANDLE)
        pointer, count = self._deps(*deps)
        data = None
        if edges is not None:
            array = (EdgeData * max(len(edges), 1))()
            for i, word in enumerate(edges):
                array[i].from_port, array[i].to_port, array[i].type = word & 0xFF, (word >> 8) & 0xFF, word >> 16
            self._keep.append(array)
            data = ctypes.addressof(array)
        status = int(self.t["cuGraphAddNode"](ctypes.addressof(cell), graph, pointer, data, count,
                                              ctypes.addressof(params)))
        return self._node(name, status, cell)

    def _handle(self, default: int) -> int:
        return self._out("cuGraphConditionalHandleCreate", self.graph, self.context, default, ASSIGN_DEFAULT)

    def _bodies(self, params: NodeParams) -> list[int]:
        """A conditional node's body graphs, from the array its phGraph_out points at."""
        given = params.conditional
        return list((U64 * given.size).from_address(given.phGraph_out)) if given.phGraph_out else []

    def _count(self, graph: int) -> int:
        count = SZ(0)
        status = self.t["cuGraphGetNodes"](graph, None, ctypes.addressof(count))
        return count.value if status == SUCCESS else -status

    def run(self) -> list[list[Any]]:
        t = self.t
        event, outside = self._set_up(("words", "marks", "copy", "spare", "if", "while", "switch", "else", "moved"))
        self.pinned = False
        context, b = self.context, self.buffers

        self.graph = graph = self._out("cuGraphCreate", 0)
        child, moved = self._out("cuGraphCreate", 0), self._out("cuGraphCreate", 0)
        self.note("child graphs built with cuGraphAddNode (spare += 1; the one to be moved: moved += 1)",
                  [self._add_node("child's kernel", child, self._kernel(b["spare"], 1)),
                   self._add_node("moved's kernel", moved, self._kernel(b["moved"], 1))])
        handles = {"if": self._handle(1), "while": self._handle(0), "switch": self._handle(2), "else": self._handle(0)}
        programmatic = PROGRAMMATIC | PROGRAMMATIC << 16
        copy = MemcpyNodeParams(copyCtx=context, copyParams=self._copy(b["copy"], b["words"]))
        conditionals = {"if": self._conditional(handles["if"], COND_IF, 1),
                        "while": self._conditional(handles["while"], COND_WHILE, 1),
                        "switch": self._conditional(handles["switch"], COND_SWITCH, 3),
                        "else": self._conditional(handles["else"], COND_IF, 2)}
        added = [
            self._add_node("memset", graph, self._fill(b["marks"], 7)),
            self._add_node("marks += 3", graph, self._kernel(b["marks"], 3), ("memset",), [0]),
            self._add_node("words += 5", graph, self._kernel(b["words"], 5)),
            self._add_node("words += 1 (programmatic)", graph, self._kernel(b["words"], 1), ("words += 5",),
                           [programmatic]),
            self._add_node("join", graph, self._params(EMPTY), ("marks += 3", "words += 1 (programmatic)")),
            self._add_node("copy = words", graph, self._params(MEMCPY, memcpy=copy), ("join",)),
            self._add_node("child", graph, self._params(GRAPH, graph=ChildGraphNodeParams(graph=child)),
                           ("copy = words",)),
            self._add_node("record", graph, self._params(EVENT_RECORD, eventRecord=EventNodeParams(event=event)),
                           ("child",)),
            self._add_node("wait", graph, self._params(WAIT_EVENT, eventWait=EventNodeParams(event=outside))),
            *[self._add_node(name, graph, params, ("copy = words",)) for name, params in conditionals.items()],
            self._add_node("moved child", graph, self._move(moved), ("copy = words",)),
        ]
        bodies = {name: self._bodies(params) for name, params in conditionals.items()}
        body_nodes = [
            self._add_node("if: if += 1", bodies["if"][0], self._kernel(b["if"], 1)),
            self._add_node("while: while += 100", bodies["while"][0], self._kernel(b["while"], 100)),
            *[self._add_node(f"switch {i}: switch += {10 ** i}", bodies["switch"][i],
                             self._kernel(b["switch"], 10 ** i)) for i in range(3)],
            self._add_node("else 0: else += 1", bodies["else"][0], self._kernel(b["else"], 1)),
            self._add_node("else 1: else = 42", bodies["else"][1], self._fill(b["else"], 42)),
        ]
        self.note("nodes added with cuGraphAddNode, then the conditional nodes' bodies", added + body_nodes,
                  list(self.names))
        every_body = [body for found in bodies.values() for body in found]
        self.note("node types; each conditional node's bodies: distinct new graphs, their node counts", [],
                  [self._types(), {name: len(found) for name, found in bodies.items()},
                   len(set(every_body)) == len(every_body) and not {graph, child, moved} & set(every_body),
                   [self._count(body) for body in every_body]])
        self.note("edges (the programmatic one with its data), dependencies of the join", [], [
            self._edges(graph, 16), self._list("cuGraphNodeGetDependencies", self.names["join"], 2, with_edges=True)])

        graph_exec = self._out("cuGraphInstantiate", graph, 0)
        self.note("instantiated, launched twice", self._launch(graph_exec, 2), self._memory())

        n = self.names
        self.note("parameters set with cuGraphNodeSetParams (the graph's) and cuGraphExecNodeSetParams", [
            t["cuGraphNodeSetParams"](n["words += 5"], ctypes.addressof(self._kernel(b["words"], 100))),
            t["cuGraphNodeSetParams"](n["memset"], ctypes.addressof(self._fill(b["marks"], 9))),
            t["cuGraphExecNodeSetParams"](graph_exec, n["marks += 3"],
                                          ctypes.addressof(self._kernel(b["marks"], 1000))),
            t["cuGraphExecNodeSetParams"](graph_exec, n["memset"], ctypes.addressof(self._fill(b["marks"], 11))),
            t["cuGraphExecNodeSetParams"](graph_exec, n["join"], ctypes.addressof(self._params(EMPTY))),
            t["cuGraphNodeSetParams"](n["join"], ctypes.addressof(self._params(EMPTY))),
            t["cuGraphNodeSetParams"](n["join"], ctypes.addressof(self._kernel(b["words"], 1))),  # not a kernel node
            t["cuGraphExecNodeSetParams"](graph_exec, n["memset"], ctypes.addressof(self._kernel(b["marks"], 1))),
            # the moved child graph's node, through the parent's executable graph and in the graph itself; a cloned
            # child graph's node is not the executable graph's
            t["cuGraphExecKernelNodeSetParams"](graph_exec, n["moved's kernel"],
                                                self._ref(self._add_params(b["moved"], 1000))),
            t["cuGraphNodeSetParams"](n["moved's kernel"], ctypes.addressof(self._kernel(b["moved"], 100))),
            t["cuGraphExecNodeSetParams"](graph_exec, n["child's kernel"],
                                          ctypes.addressof(self._kernel(b["spare"], 1000)))])
        self.note("relaunched: the executable graph's changes only", self._launch(graph_exec, 1), self._memory())
        second = self._out("cuGraphInstantiate", graph, 0)
        self.note("instantiated again: the graph's changes", self._launch(second, 1), self._memory())

        # what is refused
        nodes_before = self._count(graph)
        reserved = [self._params(EMPTY) for _ in range(2)]
        reserved[0].reserved0[1] = 1
        reserved[1].reserved2 = 1
        flagged = self._params(MEMCPY, memcpy=MemcpyNodeParams(flags=1, copyCtx=context,
                                                               copyParams=self._copy(b["copy"], b["words"])))
        self.note("refused: reserved fields set, a memcpy node's flags, an unknown type", [
            *[self._add_node("refused", graph, params) for params in (*reserved, flagged, self._params(99))],
            t["cuGraphNodeSetParams"](n["join"], ctypes.addressof(reserved[0])),
            t["cuGraphExecNodeSetParams"](graph_exec, n["join"], ctypes.addressof(reserved[1]))])
        self.note("refused: host and batch memory-operation nodes of zeroed parameters (no function, no operations); "
                  "not forwarded: external semaphore nodes, setting a conditional node's parameters", [
                      *[self._add_node("refused", graph, self._params(kind)) for kind in (
                          HOST, EXT_SEMAS_SIGNAL, EXT_SEMAS_WAIT, BATCH_MEM_OP)],
                      t["cuGraphNodeSetParams"](n["memset"], ctypes.addressof(self._params(HOST))),
                      t["cuGraphExecNodeSetParams"](graph_exec, n["if"], ctypes.addressof(conditionals["if"]))])
        self.note("refused: memory allocation and free nodes of zeroed parameters (no device, no allocation)", [
            self._add_node("refused", graph, self._params(kind)) for kind in (MEM_ALLOC, MEM_FREE)])
        other_ownership = self._params(GRAPH, graph=ChildGraphNodeParams(graph=child, ownership=2))
        self.note("refused: a graph moved into itself or into a graph it holds, a moved graph moved or cloned again, "
                  "an ownership cuda.h does not have; the moved graph destroyed, instantiated or updated from alone", [
                      self._add_node("refused", graph, self._move(graph)),
                      self._add_node("refused", moved, self._move(graph)),
                      self._add_node("refused", graph, self._move(moved)),
                      self._add_node("refused", graph, self._params(GRAPH, graph=ChildGraphNodeParams(graph=moved))),
                      self._add_node("refused", graph, other_ownership),
                      t["cuGraphDestroy"](moved), t["cuGraphInstantiate"](ctypes.addressof(U64()), moved, 0),
                      t["cuGraphExecUpdate"](graph_exec, moved, ctypes.addressof(UpdateResultInfo()))],
                  [nodes_before, self._count(graph), self._count(moved)])
        self.note("refused: conditional nodes with no body, a WHILE with two, an unknown type, an unknown handle", [
            self._add_node("refused", graph, self._conditional(handles["if"], COND_IF, 0)),
            self._add_node("refused", graph, self._conditional(handles["while"], COND_WHILE, 2)),
            self._add_node("refused", graph, self._conditional(handles["if"], 7, 1)),
            self._add_node("refused", graph, self._conditional(BAD_HANDLE, COND_IF, 1))])
        self.note("refused: an edge the driver refuses (a to_port) leaves no node behind; NULL node or parameters", [
            self._add_node("refused", graph, self._kernel(b["spare"], 1), ("words += 5",), [1 << 8]),
            self._add_node("refused", graph, self._conditional(handles["if"], COND_IF, 1), ("words += 5",), [1 << 8]),
            t["cuGraphAddNode"](None, graph, None, None, 0, ctypes.addressof(self._params(EMPTY))),
            t["cuGraphAddNode"](ctypes.addressof(U64()), graph, None, None, 0, None)],
                  [nodes_before, self._count(graph)])

        self.note("a conditional node destroyed, then everything", [
            t["cuGraphDestroyNode"](n["while"]), self._count(graph), t["cuGraphExecDestroy"](graph_exec),
            t["cuGraphExecDestroy"](second), t["cuGraphDestroy"](graph), t["cuGraphDestroy"](moved),
            t["cuGraphDestroy"](child),
            t["cuEventDestroy"](event), t["cuEventDestroy"](outside), t["cuStreamDestroy"](self.stream),
            *[t["cuMemFree"](pointer) for pointer in self.buffers.values()]])
        return self.out


# --- the reference: the fake driver called as C calls a driver ---------------------------------------------------

def fake_table(driver: Any) -> Table:
    """The program's functions over a FakeDriver called directly, as C calls a driver: structs read from the C
    memory the program passes, outputs written through its pointers, and the checks a C driver makes of NULL
    pointers (INVALID_VALUE) and of edges without an edge-data array (CUDA_ERROR_LOSSY_QUERY) made here, as cuda.h
    documents them, since the wheel's Python calls have no NULL pointers to check."""
    from tests.fake_driver import CUgraphEdgeData, CUgraphNode

    table = capture_graphs.fake_table(driver)
    invalid, lossy = 1, 402

    def node_list(address: int | None, count: int) -> list[Any] | None:
        return [CUgraphNode(v) for v in (U64 * count).from_address(address)] if address and count else None

    def kernel(address: int) -> Any:
        given = KernelNodeParams.from_address(address)
        params = driver.CUDA_KERNEL_NODE_PARAMS()
        for name, _kind in KernelNodeParams._fields_:
            setattr(params, name, getattr(given, name) or 0)
        return params

    def memset(address: int) -> Any:
        given = MemsetNodeParams.from_address(address)
        params = driver.CUDA_MEMSET_NODE_PARAMS()
        for name, _kind in MemsetNodeParams._fields_:
            setattr(params, name, getattr(given, name))
        return params

    def copy(address: int) -> Any:
        given = Memcpy3D.from_address(address)
        params = driver.CUDA_MEMCPY3D()
        for name, _kind in Memcpy3D._fields_:
            if not name.startswith("reserved"):
                setattr(params, name, getattr(given, name) or 0)
        return params

    def adding(name: str, convert: Any = None) -> Any:
        """A node-adding call: (out, graph, deps, count, *rest), a struct pointer among `rest` converted."""
        def call(out: int | None, graph: int, deps: int | None, count: int, *rest: Any) -> int:
            if not out or (count and not deps):
                return invalid
            args = list(rest)
            if convert is not None:
                if not args[0]:
                    return invalid
                args[0] = convert(args[0])
            status, *values = getattr(driver, name)(graph, node_list(deps, count), count, *args)
            if int(status) == SUCCESS:
                U64.from_address(out).value = int(values[0])
            return int(status)
        return call

    def edges(name: str) -> Any:
        def call(graph: int, sources: int | None, targets: int | None, data: int | None, count: int) -> int:
            if count and (not sources or not targets):
                return invalid
            words = (U64 * count).from_address(data) if data and count else None
            objects = None
            if words is not None:
                objects = []
                for word in words:
                    edge = CUgraphEdgeData()
                    edge.from_port, edge.to_port = word & 0xFF, (word >> 8) & 0xFF
                    edge.type = driver.CUgraphDependencyType((word >> 16) & 0xFF)
                    objects.append(edge)
            return int(getattr(driver, name)(graph, node_list(sources, count), node_list(targets, count), objects,
                                             count)[0])
        return call

    def word(edge: Any) -> int:
        return int(edge.from_port) | int(edge.to_port) << 8 | int(edge.type) << 16

    def listing(name: str, with_edges: bool) -> Any:
        """cuGraphGetNodes/GetRootNodes (no edge data), cuGraphNodeGetDependencies/DependentNodes."""
        def call(handle: int, nodes: int | None, *rest: Any) -> int:
            data, count = rest if with_edges else (None, rest[0])
            if not count or (data and not nodes):
                return invalid
            room = ctypes.c_size_t.from_address(count).value if nodes else 0
            status, *values = getattr(driver, name)(handle, room)
            if int(status) != SUCCESS:
                return int(status)
            found, *edge_lists, written = values
            if room and with_edges and not data and any(word(e) for e in edge_lists[0][:written]):
                return lossy
            for i, node in enumerate(found):
                U64.from_address(nodes + 8 * i).value = int(node)  # type: ignore[operator]
            if data:
                for i, edge in enumerate(edge_lists[0][:written]):
                    U64.from_address(data + 8 * i).value = word(edge)
            ctypes.c_size_t.from_address(count).value = written
            return SUCCESS
        return call

    def get_edges(graph: int, sources: int | None, targets: int | None, data: int | None, count: int | None) -> int:
        if not count or (not sources) != (not targets) or (data and not sources):
            return invalid
        room = ctypes.c_size_t.from_address(count).value if sources else 0
        status, froms, tos, found, written = driver.cuGraphGetEdges(graph, room)
        if int(status) != SUCCESS:
            return int(status)
        if room and not data and any(word(e) for e in found[:written]):
            return lossy
        for i in range(room):
            U64.from_address(sources + 8 * i).value = int(froms[i])  # type: ignore[operator]
            U64.from_address(targets + 8 * i).value = int(tos[i])  # type: ignore[operator]
        for i, edge in enumerate(found[:written] if data else []):
            U64.from_address(data + 8 * i).value = word(edge)  # type: ignore[operator]
        ctypes.c_size_t.from_address(count).value = written
        return SUCCESS

    def setting(name: str, convert: Any, handles: int) -> Any:
        """A parameter-setting call: `handles` handles, the struct pointer, then any further argument."""
        def call(*args: Any) -> int:
            if not args[handles]:
                return invalid
            given = [*args[:handles], convert(args[handles]), *args[handles + 1:]]
            return int(getattr(driver, name)(*given)[0])
        return call

    def update(graph_exec: int, graph: int, info: int | None) -> int:
        if not info:
            return invalid
        status, found = driver.cuGraphExecUpdate(graph_exec, graph)
        if int(status) == SUCCESS:
            UpdateResultInfo.from_address(info).result = int(found.result)
            UpdateResultInfo.from_address(info).errorNode = int(found.errorNode)
            UpdateResultInfo.from_address(info).errorFromNode = int(found.errorFromNode)
        return int(status)

    def create(out: int, flags: int) -> int:
        status, graph = driver.cuGraphCreate(flags)
        if int(status) == SUCCESS:
            U64.from_address(out).value = int(graph)
        return int(status)

    # The generic node calls. cuGraphAddNode is the fake's own (a CUgraphNodeParams of the wheel's shape built from the
    # C struct), its body graphs written to an array kept here for phGraph_out; the fake has no generic setters (the
    # native driver answers them in the guest), so those call the type's own setter, as the native driver does.
    def node_params(address: int | None) -> Any:
        """The wheel's CUgraphNodeParams of a C CUgraphNodeParams, or the status C refuses it with (NULL, reserved
        fields set, a type cuda.h does not have)."""
        given = NodeParams.from_address(address) if address else None
        if given is None or any(given.reserved0) or given.reserved2 or not 0 <= given.type <= CONDITIONAL:
            return invalid
        if given.type == MEMCPY and given.memcpy.reserved:
            return invalid
        params = driver.CUgraphNodeParams()
        params.type = driver.CUgraphNodeType(given.type)
        params.kernel = kernel(ctypes.addressof(given.kernel))
        for name, _kind in MemsetNodeParamsV2._fields_:
            setattr(params.memset, name, getattr(given.memset, name))
        params.memcpy.flags, params.memcpy.copyCtx = given.memcpy.flags, given.memcpy.copyCtx
        params.memcpy.copyParams = copy(ctypes.addressof(given.memcpy.copyParams))
        params.graph.graph, params.graph.ownership = given.graph.graph, given.graph.ownership
        params.eventRecord.event, params.eventWait.event = given.eventRecord.event, given.eventWait.event
        condition = params.conditional
        condition.handle, condition.type = given.conditional.handle, given.conditional.type
        condition.size, condition.ctx = given.conditional.size, given.conditional.ctx
        if given.type == MEM_ALLOC:
            params.alloc = alloc_params(ctypes.addressof(given.alloc))
        params.free.dptr = given.free
        union = address + NodeParams.u.offset  # a host node's (fn, userData), a batch node's struct: C's own layout
        params.host.fn, params.host.userData = struct.unpack_from("<QQ", ctypes.string_at(union, 16))
        params.batchMemOp = driver.CUDA_BATCH_MEM_OP_NODE_PARAMS(_ptr=union)
        return params

    def alloc_params(address: int) -> Any:
        """The wheel's CUDA_MEM_ALLOC_NODE_PARAMS of a C one."""
        given = MemAllocNodeParams.from_address(address)
        params = driver.CUDA_MEM_ALLOC_NODE_PARAMS()
        props, pool = params.poolProps, given.poolProps
        props.allocType, props.handleTypes = pool.allocType, pool.handleTypes
        props.location.type, props.location.id = pool.locationType, pool.locationId
        props.maxSize, props.usage, props.gpuDirectRDMACapable = pool.maxSize, pool.usage, pool.gpuDirectRDMACapable
        descs = (MemAccessDesc * given.accessDescCount).from_address(given.accessDescs) \
            if given.accessDescCount and given.accessDescs else []
        for desc in descs:
            made = driver.CUmemAccessDesc()
            made.location.type, made.location.id, made.flags = desc.locationType, desc.locationId, desc.flags
            params.accessDescs.append(made)
        params.accessDescCount, params.bytesize = given.accessDescCount, given.bytesize
        return params

    bodies_kept: list[Any] = []

    def add_node(out: int | None, graph: int, deps: int | None, data: int | None, count: int,
                 address: int | None) -> int:
        if not out or (count and not deps):
            return invalid
        params = node_params(address)
        if isinstance(params, int):
            return params
        objects = None
        if data and count:
            objects = []
            for value in (U64 * count).from_address(data):
                edge = CUgraphEdgeData()
                edge.from_port, edge.to_port = value & 0xFF, (value >> 8) & 0xFF
                edge.type = driver.CUgraphDependencyType((value >> 16) & 0xFF)
                objects.append(edge)
        status, node = driver.cuGraphAddNode(graph, node_list(deps, count), objects, count, params)
        if int(status) == SUCCESS:
            U64.from_address(out).value = int(node)
            if params.conditional.phGraph_out is not None:
                bodies = [int(body) for body in params.conditional.phGraph_out]
                bodies_kept.append((U64 * len(bodies))(*bodies))
                NodeParams.from_address(address).conditional.phGraph_out = ctypes.addressof(bodies_kept[-1])
            if params.type == MEM_ALLOC and address:  # cuda.h: the allocation's address comes back in the struct
                NodeParams.from_address(address).alloc.dptr = int(params.alloc.dptr)
        return int(status)

    not_supported = 801

    def set_params(graph_exec: int | None, node: int, address: int | None) -> int:
        """cuGraphNodeSetParams (graph_exec None) and cuGraphExecNodeSetParams by the type's own setter."""
        params = node_params(address)
        if isinstance(params, int):
            return params
        given = NodeParams.from_address(address)
        kind, prefix = given.type, ("cuGraph" if graph_exec is None else "cuGraphExec")
        handles = [node] if graph_exec is None else [graph_exec, node]
        if kind == KERNEL:
            return int(getattr(driver, prefix + "KernelNodeSetParams")(*handles, params.kernel)[0])
        if kind == MEMSET:
            memset_params = memset(ctypes.addressof(given.memset))
            context = [] if graph_exec is None else [given.memset.ctx]
            return int(getattr(driver, prefix + "MemsetNodeSetParams")(*handles, memset_params, *context)[0])
        if kind == MEMCPY:
            context = [] if graph_exec is None else [given.memcpy.copyCtx]
            return int(getattr(driver, prefix + "MemcpyNodeSetParams")(*handles, params.memcpy.copyParams,
                                                                        *context)[0])
        if kind == EMPTY:
            status, found = driver.cuGraphNodeGetType(node)
            return int(status) if int(status) != SUCCESS else SUCCESS if int(found) == EMPTY else invalid
        if kind == HOST:
            return int(getattr(driver, prefix + "HostNodeSetParams")(*handles, params.host)[0])
        if kind == BATCH_MEM_OP:
            return int(getattr(driver, prefix + "BatchMemOpNodeSetParams")(*handles, params.batchMemOp)[0])
        return not_supported  # the types the native driver does not set (the test names them)

    def handle_create(out: int, graph: int, context: int, default: int, flags: int) -> int:
        status, handle = driver.cuGraphConditionalHandleCreate(graph, context, default, flags)
        if int(status) == SUCCESS:
            U64.from_address(out).value = int(handle)
        return int(status)

    table.update({
        "cuGraphCreate": create,
        "cuEventRecord": lambda *args: int(driver.cuEventRecord(*args)[0]),
        "cuEventSynchronize": lambda *args: int(driver.cuEventSynchronize(*args)[0]),
        "cuGraphAddEmptyNode": adding("cuGraphAddEmptyNode"),
        "cuGraphAddChildGraphNode": adding("cuGraphAddChildGraphNode"),
        "cuGraphAddEventRecordNode": adding("cuGraphAddEventRecordNode"),
        "cuGraphAddEventWaitNode": adding("cuGraphAddEventWaitNode"),
        "cuGraphAddMemsetNode": adding("cuGraphAddMemsetNode", memset),
        "cuGraphAddMemcpyNode": adding("cuGraphAddMemcpyNode", copy),
        "cuGraphAddKernelNode": adding("cuGraphAddKernelNode", kernel),
        "cuGraphAddDependencies": edges("cuGraphAddDependencies"),
        "cuGraphRemoveDependencies": edges("cuGraphRemoveDependencies"),
        "cuGraphGetNodes": listing("cuGraphGetNodes", False),
        "cuGraphGetRootNodes": listing("cuGraphGetRootNodes", False),
        "cuGraphGetEdges": get_edges,
        "cuGraphNodeGetDependencies": listing("cuGraphNodeGetDependencies", True),
        "cuGraphNodeGetDependentNodes": listing("cuGraphNodeGetDependentNodes", True),
        "cuGraphKernelNodeSetParams": setting("cuGraphKernelNodeSetParams", kernel, 1),
        "cuGraphExecKernelNodeSetParams": setting("cuGraphExecKernelNodeSetParams", kernel, 2),
        "cuGraphMemsetNodeSetParams": setting("cuGraphMemsetNodeSetParams", memset, 1),
        "cuGraphExecMemsetNodeSetParams": setting("cuGraphExecMemsetNodeSetParams", memset, 2),
        "cuGraphMemcpyNodeSetParams": setting("cuGraphMemcpyNodeSetParams", copy, 1),
        "cuGraphExecMemcpyNodeSetParams": setting("cuGraphExecMemcpyNodeSetParams", copy, 2),
        "cuGraphExecUpdate": update,
        "cuGraphAddNode": add_node,
        "cuGraphNodeSetParams": lambda node, address: set_params(None, node, address),
        "cuGraphExecNodeSetParams": set_params,
        "cuGraphConditionalHandleCreate": handle_create,
        "cuGraphDestroyNode": lambda node: int(driver.cuGraphDestroyNode(node)[0]),
    })
    table["_kept_bodies"] = bodies_kept  # type: ignore[assignment]
    table["_alloc_params"] = alloc_params  # type: ignore[assignment]  # for graph_queries.fake_table
    return table


def main(argv: list[str]) -> int:
    table = library_table(ctypes.CDLL(argv[0], mode=ctypes.RTLD_GLOBAL))
    program = AddNodeProgram if "add-node" in argv[1:] else GraphNodeProgram
    transcript = program(table, pinned="pinned" in argv[1:]).run()
    print(json.dumps({"transcript": transcript}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
