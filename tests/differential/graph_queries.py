"""CUDA graphs, their second part: one fixed program whose transcript must be the same on the fake driver called
directly and through the native `libcuda.so.1`, on a local region and relayed
(tests/differential/test_graph_queries.py).

The program builds a graph node by node (graph_nodes.py's calls) with a memset node, kernel nodes of
`orion_fake_add_u32` (the kernel the fake runs; ADD_PTX on a GPU), memcpy nodes (1D, 2D with offsets and pitches, a
UNIFIED side; with `pinned`, from page-locked memory as HOST and as UNIFIED), an empty node, a cloned child graph,
event record and wait nodes, a conditional node, and a memory allocation node whose memory a memset node fills, a
kernel node adds to and a memcpy node copies out before a free node frees it. Then it asks every node's parameters
back (cuGraphKernelNodeGetParams with the values read through kernelParams, cuGraphMemsetNodeGetParams,
cuGraphMemcpyNodeGetParams, cuGraphMemAllocNodeGetParams, cuGraphNodeGetParams of every node), sets and reads kernel
node attributes (a priority; one never set; IDs the driver refuses for a kernel node; DEVICE_UPDATABLE_KERNEL_NODE,
which is not forwarded), instantiates with cuGraphInstantiateWithParams (uploading on a stream), launches and reads the
memory back, reads the graph memory attributes, copies into the graph allocation from outside the graph, and shows
what is refused: a second instantiation of a graph with memory nodes, a cycle, an upload stream not the caller's,
cloning, removing a node or an edge of such a graph, free nodes of memory no allocation node made, allocation nodes
without a device or a size, high watermarks set to anything but 0. A second graph is captured into from a stream
after a node of its own (cuStreamBeginCaptureToGraph), its dependency set changed during the capture
(cuStreamUpdateCaptureDependencies: added to, then replaced), and run. cuGraphDebugDotPrint writes the first graph's
description (the text compared) and refuses a path it cannot write. Last the graphs are destroyed, and the graph
allocation's memory is no longer the program's: a copy into it fails.

Handles are never compared between paths: a node is shown as its name, an address as the buffer it lies in and its
offset, a handle as whether it is the one expected.

Run in a process of its own with a C driver library (the native guest driver, ORION_SHM set; or the real libcuda on
a GPU):

    python -m tests.differential.graph_queries LIBRARY [pinned]

prints one JSON object: {"transcript": [...]}. Functions are looked up as a program built against CUDA 13's cuda.h
names them (cuGraphKernelNodeGetParams_v2, cuStreamUpdateCaptureDependencies_v2, ...).
"""
from __future__ import annotations

import ctypes
import json
import os
import struct
import sys
import tempfile
from typing import Any

from tests.differential import graph_nodes
from tests.differential.corpus import SUCCESS, Table, ctypes_table
from tests.differential.graph_nodes import (
    BAD_HANDLE,
    CONDITIONAL,
    CU_MEMORYTYPE_DEVICE,
    CU_MEMORYTYPE_HOST,
    MEM_ALLOC,
    MEM_FREE,
    U32,
    U64,
    WORDS,
    KernelNodeParams,
    MemAccessDesc,
    MemAllocNodeParams,
    Memcpy3D,
    MemsetNodeParams,
    NodeParams,
)

P, UI, I32, SZ = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_size_t
CU_MEMORYTYPE_UNIFIED = 4
PRIORITY, COOPERATIVE, SYNCHRONIZATION_POLICY, STREAM_SERIALIZATION, DEVICE_UPDATABLE = 8, 2, 3, 6, 13
USED_MEM_CURRENT, USED_MEM_HIGH, RESERVED_MEM_CURRENT, RESERVED_MEM_HIGH = range(4)
INSTANTIATE_FLAG_UPLOAD = 2
ADD_CAPTURE_DEPENDENCIES, SET_CAPTURE_DEPENDENCIES = 0, 1
GLOBAL = 0  # CUstreamCaptureMode
ALLOCATION_PINNED, LOCATION_DEVICE, ACCESS_READWRITE = 1, 1, 3
DOT_VERBOSE = 1


class InstantiateParams(ctypes.Structure):
    """CUDA_GRAPH_INSTANTIATE_PARAMS."""
    _fields_ = [("flags", U64), ("hUploadStream", U64), ("hErrNode_out", U64), ("result_out", I32)]


assert ctypes.sizeof(InstantiateParams) == 32

PROTOTYPES: dict[str, list[Any]] = {
    "cuGraphKernelNodeGetParams": [U64, P], "cuGraphMemsetNodeGetParams": [U64, P],
    "cuGraphMemcpyNodeGetParams": [U64, P], "cuGraphNodeGetParams": [U64, P],
    "cuGraphKernelNodeGetAttribute": [U64, I32, P], "cuGraphKernelNodeSetAttribute": [U64, I32, P],
    "cuStreamBeginCaptureToGraph": [U64, U64, P, P, SZ, I32], "cuStreamUpdateCaptureDependencies": [U64, P, P, SZ, UI],
    "cuGraphInstantiateWithParams": [P, U64, P], "cuGraphAddMemAllocNode": [P, U64, P, SZ, P],
    "cuGraphAddMemFreeNode": [P, U64, P, SZ, U64], "cuGraphMemAllocNodeGetParams": [U64, P],
    "cuDeviceGetGraphMemAttribute": [I32, I32, P], "cuDeviceSetGraphMemAttribute": [I32, I32, P],
    "cuGraphDebugDotPrint": [U64, ctypes.c_char_p, UI], "cuMemsetD32Async": [U64, UI, SZ, U64],
}


def library_table(library: ctypes.CDLL) -> Table:
    """Every function the program calls, from a C driver library, by cuda.h's names."""
    table = graph_nodes.library_table(library)
    table.update(ctypes_table(library, PROTOTYPES))
    return table


class GraphQueryProgram(graph_nodes.GraphNodeProgram):
    """The program of the module docstring, against a table of graph_nodes' functions and PROTOTYPES above."""

    # --- helpers --------------------------------------------------------------------------------------------------
    def _where(self, address: int) -> Any:
        """An address as the buffer it lies in and the offset there ("alloc+8"), None for NULL."""
        if not address:
            return None
        for name, (base, size) in self.places.items():
            if base <= address < base + size:
                return f"{name}+{address - base}"
        return "elsewhere"

    def _copy_fields(self, copy: Memcpy3D) -> list[Any]:
        sides = []
        for side in ("src", "dst"):
            kind = getattr(copy, side + "MemoryType")
            sides.append([kind, self._where(getattr(copy, side + "Host") or 0),
                          self._where(getattr(copy, side + "Device")),
                          *[getattr(copy, side + name) for name in ("XInBytes", "Y", "Z", "LOD", "Pitch", "Height")],
                          getattr(copy, side + "Array")])
        return [*sides, copy.WidthInBytes, copy.Height, copy.Depth]

    def _kernel_fields(self, params: KernelNodeParams) -> list[Any]:
        """A kernel node's parameters asked back: its function, dimensions and the values its kernelParams point at
        (orion_fake_add_u32's: a pointer, a count, a value), or its extra list's presence."""
        values = None
        if params.kernelParams:
            pointers = (ctypes.c_void_p * 3).from_address(params.kernelParams)
            values = [self._where(U64.from_address(pointers[0] or 0).value),
                      U32.from_address(pointers[1] or 0).value, U32.from_address(pointers[2] or 0).value]
        return [params.func == self.function, params.kern, params.ctx, [params.gridDimX, params.gridDimY,
                params.gridDimZ], [params.blockDimX, params.blockDimY, params.blockDimZ], params.sharedMemBytes,
                values, bool(params.extra)]

    def _memset_fields(self, params: MemsetNodeParams) -> list[Any]:
        return [self._where(params.dst), params.pitch, params.value, params.elementSize, params.width, params.height]

    def _alloc_fields(self, params: MemAllocNodeParams) -> list[Any]:
        props = params.poolProps
        descs = (MemAccessDesc * params.accessDescCount).from_address(params.accessDescs) \
            if params.accessDescCount and params.accessDescs else []
        return [[props.allocType, props.handleTypes, props.locationType, props.locationId, props.maxSize,
                 props.usage, props.gpuDirectRDMACapable], [[d.locationType, d.locationId, d.flags] for d in descs],
                params.bytesize, self._where(params.dptr)]

    def _node_params(self, name: str) -> list[Any]:
        """cuGraphNodeGetParams of node `name`: [status, type, what its member says]."""
        params = NodeParams()
        status = int(self.t["cuGraphNodeGetParams"](self.names[name], ctypes.addressof(params)))
        if status != SUCCESS:
            return [status]
        kind: int = params.type
        shown: Any = None
        if kind == graph_nodes.KERNEL:
            shown = self._kernel_fields(params.kernel)
        elif kind == graph_nodes.MEMSET:
            shown = [*self._memset_fields(MemsetNodeParams.from_buffer_copy(params.memset)),
                     params.memset.ctx == self.context]
        elif kind == graph_nodes.MEMCPY:
            shown = [self._copy_fields(params.memcpy.copyParams), params.memcpy.copyCtx == self.context,
                     params.memcpy.flags]
        elif kind == graph_nodes.GRAPH:
            shown = [params.graph.graph != 0, params.graph.ownership]
        elif kind in (graph_nodes.EVENT_RECORD, graph_nodes.WAIT_EVENT):
            member = params.eventRecord if kind == graph_nodes.EVENT_RECORD else params.eventWait
            shown = member.event in (self.event, self.outside)
        elif kind == CONDITIONAL:
            given = params.conditional
            bodies = list((U64 * given.size).from_address(given.phGraph_out)) if given.phGraph_out else None
            shown = [given.handle == self.handle, given.type, given.size, given.ctx == self.context,
                     bodies == self.bodies]
        elif kind == MEM_ALLOC:
            shown = self._alloc_fields(MemAllocNodeParams.from_buffer_copy(params, NodeParams.u.offset))
        elif kind == MEM_FREE:
            shown = self._where(U64.from_buffer_copy(params, NodeParams.u.offset).value)
        return [status, kind, shown]

    def _attribute(self, node: str, attribute: int, value: int | None = None) -> list[Any]:
        """cuGraphKernelNodeSetAttribute (an int value) or GetAttribute: [status, the value's first 8 bytes]."""
        cell = (ctypes.c_ubyte * 64)()
        if value is not None:
            struct.pack_into("<i", cell, 0, value)
            return [int(self.t["cuGraphKernelNodeSetAttribute"](self.names[node], attribute, ctypes.addressof(cell)))]
        status = int(self.t["cuGraphKernelNodeGetAttribute"](self.names[node], attribute, ctypes.addressof(cell)))
        return [status, bytes(cell[:8]).hex() if status == SUCCESS else None]

    def _instantiate(self, graph: int, flags: int = 0, stream: int = 0) -> tuple[int, list[Any]]:
        """cuGraphInstantiateWithParams: (the executable graph or 0, [status, result, error node]); on failure only
        whether the result says so (a driver may name the reason: the call table carries no result on failure)."""
        params = InstantiateParams(flags=flags, hUploadStream=stream, hErrNode_out=BAD_HANDLE, result_out=-1)
        cell = U64()
        status = int(self.t["cuGraphInstantiateWithParams"](ctypes.addressof(cell), graph, ctypes.addressof(params)))
        if status == SUCCESS:
            return cell.value, [status, params.result_out, self._index(params.hErrNode_out)]
        return 0, [status, params.result_out > 0]

    def _alloc_params(self, size: int, device: int = 0, access: bool = True) -> MemAllocNodeParams:
        params = MemAllocNodeParams(bytesize=size)
        props = params.poolProps
        props.allocType, props.locationType, props.locationId = ALLOCATION_PINNED, LOCATION_DEVICE, device
        if access:
            descs = (MemAccessDesc * 1)(MemAccessDesc(LOCATION_DEVICE, device, ACCESS_READWRITE))
            self._keep.append(descs)
            params.accessDescs, params.accessDescCount = ctypes.addressof(descs), 1
        self._keep.append(params)
        return params

    def _graph_memory(self) -> list[Any]:
        values = []
        for attribute in (USED_MEM_CURRENT, USED_MEM_HIGH, RESERVED_MEM_CURRENT, RESERVED_MEM_HIGH):
            cell = U64(BAD_HANDLE)
            status = int(self.t["cuDeviceGetGraphMemAttribute"](0, attribute, ctypes.addressof(cell)))
            values.append(cell.value if status == SUCCESS else f"status {status}")
        return values

    # --- the program ----------------------------------------------------------------------------------------------
    def run(self) -> list[list[Any]]:
        t = self.t
        self.event, self.outside = self._set_up(("words", "marks", "copy", "spare", "grid", "staged"))
        event, outside, context, b = self.event, self.outside, self.context, self.buffers
        self.places = {name: (pointer, 4 * WORDS) for name, pointer in b.items()}
        if self.pinned:
            pinned_in = self._out("cuMemAllocHost", 4 * WORDS)
            self.pinned_in = (U32 * WORDS).from_address(pinned_in)
            for i in range(WORDS):
                self.pinned_in[i] = 1000 + i
            self.places["pinned_in"] = (pinned_in, 4 * WORDS)

        # the graph
        self.graph = graph = self._out("cuGraphCreate", 0)
        child = self._out("cuGraphCreate", 0)
        child_cell = U64()
        self.note("a child graph with a kernel node", [t["cuGraphAddKernelNode"](
            ctypes.addressof(child_cell), child, None, 0, self._ref(self._add_params(b["spare"], 1)))])
        alloc = self._alloc_params(4 * WORDS)
        alloc_cell = U64()
        alloc_status = self._node("alloc", t["cuGraphAddMemAllocNode"](ctypes.addressof(alloc_cell), graph, None, 0,
                                                                      ctypes.addressof(alloc)), alloc_cell)
        self.places["alloc"] = (alloc.dptr, 4 * WORDS)
        block = Memcpy3D(srcMemoryType=CU_MEMORYTYPE_DEVICE, srcDevice=b["words"], srcXInBytes=4, srcY=1,
                         srcPitch=16, srcHeight=4, dstMemoryType=CU_MEMORYTYPE_DEVICE, dstDevice=b["grid"], dstY=2,
                         dstPitch=16, dstHeight=4, WidthInBytes=8, Height=2, Depth=1)
        unified = self._copy(b["copy"], b["words"], src_type=CU_MEMORYTYPE_UNIFIED)
        unified.srcDevice = b["words"]
        self.handle = self._out("cuGraphConditionalHandleCreate", graph, context, 1, graph_nodes.ASSIGN_DEFAULT)
        conditional = NodeParams(type=CONDITIONAL)
        conditional.conditional = graph_nodes.ConditionalNodeParams(handle=self.handle, type=graph_nodes.COND_IF,
                                                                    size=1, ctx=context)
        self._keep.append(conditional)
        added = [
            alloc_status,
            self._add("memset", "cuGraphAddMemsetNode", (), self._ref(self._memset(b["marks"], 7)), context),
            self._add("words += 5", "cuGraphAddKernelNode", ("memset",), self._ref(self._add_params(b["words"], 5))),
            self._add("copy = words (unified)", "cuGraphAddMemcpyNode", ("words += 5",), self._ref(unified), context),
            self._add("2D copy", "cuGraphAddMemcpyNode", ("words += 5",), self._ref(block), 0),
            self._add("join", "cuGraphAddEmptyNode", ("copy = words (unified)", "2D copy")),
            self._add("child", "cuGraphAddChildGraphNode", ("join",), child),
            self._add("record", "cuGraphAddEventRecordNode", ("child",), event),
            self._add("wait", "cuGraphAddEventWaitNode", (), outside),
            self._add("alloc = 3", "cuGraphAddMemsetNode", ("alloc",),
                      self._ref(self._memset(alloc.dptr, 3)), context),
            self._add("alloc += 1", "cuGraphAddKernelNode", ("alloc = 3",),
                      self._ref(self._add_params(alloc.dptr, 1, blocks=1))),
            self._add("spare = alloc", "cuGraphAddMemcpyNode", ("alloc += 1",),
                      self._ref(self._copy(b["spare"], alloc.dptr)), context),
            self._add("free", "cuGraphAddMemFreeNode", ("spare = alloc",), alloc.dptr),
        ]
        node = U64()
        pointer, count = self._deps("join")
        added.append(self._node("if", int(t["cuGraphAddNode"](ctypes.addressof(node), graph, pointer, None, count,
                                                             ctypes.addressof(conditional))), node))
        self.bodies = list((U64 * 1).from_address(conditional.conditional.phGraph_out)) if added[-1] == 0 else []
        if self.pinned:
            from_pinned = self._copy(b["staged"], self.places["pinned_in"][0], src_type=CU_MEMORYTYPE_HOST)
            pinned_unified = self._copy(b["staged"], 0, 4 * (WORDS // 2), src_type=CU_MEMORYTYPE_UNIFIED)
            pinned_unified.srcDevice = self.places["pinned_in"][0] + 4 * (WORDS // 2)
            added += [self._add("staged = pinned_in", "cuGraphAddMemcpyNode", ("wait",), self._ref(from_pinned),
                                context),
                      self._add("staged = pinned_in (unified)", "cuGraphAddMemcpyNode", ("staged = pinned_in",),
                                self._ref(pinned_unified), context)]
        self.note("nodes added, the allocation node's address a new one", [*added, alloc.dptr != 0],
                  [list(self.names), self._types()])

        # parameters asked back
        n = self.names
        kernels = []
        for name in ("words += 5", "alloc += 1"):
            params = KernelNodeParams()
            status = int(t["cuGraphKernelNodeGetParams"](n[name], ctypes.addressof(params)))
            kernels.append([status, self._kernel_fields(params) if status == SUCCESS else None])
        self.note("kernel nodes' parameters asked back (the values read through kernelParams)", [], kernels)
        memsets = []
        for name in ("memset", "alloc = 3"):
            memset = MemsetNodeParams()
            status = int(t["cuGraphMemsetNodeGetParams"](n[name], ctypes.addressof(memset)))
            memsets.append([status, self._memset_fields(memset) if status == SUCCESS else None])
        self.note("memset nodes' parameters asked back", [], memsets)
        copies = []
        for name in [name for name in n if "copy" in name or "=" in name and "pinned" in name] + ["spare = alloc"]:
            copy = Memcpy3D()
            status = int(t["cuGraphMemcpyNodeGetParams"](n[name], ctypes.addressof(copy)))
            copies.append([name, status, self._copy_fields(copy) if status == SUCCESS else None])
        self.note("memcpy nodes' parameters asked back (each side as it was given)", [], copies)
        asked = MemAllocNodeParams()
        status = int(t["cuGraphMemAllocNodeGetParams"](n["alloc"], ctypes.addressof(asked)))
        self.note("the allocation node's parameters asked back", [status],
                  self._alloc_fields(asked) if status == SUCCESS else None)
        self.note("every node's parameters by cuGraphNodeGetParams", [], {name: self._node_params(name) for name in n})
        wrong = KernelNodeParams()
        self.note("refused: a kernel node's parameters of a memset node, an unknown node; NULL parameters", [
            t["cuGraphKernelNodeGetParams"](n["memset"], ctypes.addressof(wrong)),
            t["cuGraphMemsetNodeGetParams"](BAD_HANDLE, ctypes.addressof(MemsetNodeParams())),
            t["cuGraphNodeGetParams"](BAD_HANDLE, ctypes.addressof(NodeParams())),
            t["cuGraphMemAllocNodeGetParams"](n["free"], ctypes.addressof(MemAllocNodeParams())),
            t["cuGraphKernelNodeGetParams"](n["words += 5"], None)])

        # kernel node attributes
        self.note("kernel node attributes: a priority set and read back, one never set, IDs the driver refuses for a "
                  "kernel node (SYNCHRONIZATION_POLICY, PROGRAMMATIC_STREAM_SERIALIZATION), DEVICE_UPDATABLE (not "
                  "forwarded), a memset node's", [], [
                      self._attribute("words += 5", PRIORITY, 1), self._attribute("words += 5", PRIORITY),
                      self._attribute("words += 5", COOPERATIVE), self._attribute("alloc += 1", PRIORITY),
                      self._attribute("words += 5", SYNCHRONIZATION_POLICY),
                      self._attribute("words += 5", STREAM_SERIALIZATION, 1),
                      self._attribute("words += 5", DEVICE_UPDATABLE), self._attribute("memset", PRIORITY)])

        # instantiated with parameters, uploaded, launched
        graph_exec, shown = self._instantiate(graph, INSTANTIATE_FLAG_UPLOAD, self.stream)
        again = self._instantiate(graph)[1]
        self.note("instantiated with parameters (uploaded on the stream), launched twice; a second executable graph "
                  "of a graph with memory nodes refused", [*shown, *self._launch(graph_exec, 2)],
                  [again, self._memory()])
        self.note("graph memory attributes while the graph exists (used, its high mark, reserved, its high mark)", [],
                  self._graph_memory())
        high, five = U64(0), U64(5)
        self.note("high marks reset (to 0 only), the used figure not; a device that is not one", [
            t["cuDeviceSetGraphMemAttribute"](0, USED_MEM_HIGH, ctypes.addressof(high)),
            t["cuDeviceSetGraphMemAttribute"](0, RESERVED_MEM_HIGH, ctypes.addressof(high)),
            t["cuDeviceSetGraphMemAttribute"](0, USED_MEM_HIGH, ctypes.addressof(five)),
            t["cuDeviceSetGraphMemAttribute"](0, USED_MEM_CURRENT, ctypes.addressof(high)),
            t["cuDeviceGetGraphMemAttribute"](7, USED_MEM_CURRENT, ctypes.addressof(high)),
            t["cuDeviceGetGraphMemAttribute"](0, USED_MEM_CURRENT, None)], self._graph_memory())
        into = (U32 * WORDS)(*[7] * WORDS)
        self.note("the graph allocation is the program's device memory while its graph lives: written (a copy, a "
                  "memset on a stream), read; not a cuMemAlloc allocation to cuMemFree", [
                      t["cuMemcpyHtoD"](alloc.dptr, ctypes.addressof(into), 4 * WORDS),
                      t["cuMemsetD32Async"](alloc.dptr + 4 * (WORDS - 4), 9, 4, self.stream),
                      t["cuStreamSynchronize"](self.stream), t["cuMemFree"](alloc.dptr)],
                  self._read(alloc.dptr))

        # refused around memory nodes
        cycle = self._out("cuGraphCreate", 0)
        saved, self.graph = self.graph, cycle
        self._add("c1", "cuGraphAddEmptyNode", ())
        self._add("c2", "cuGraphAddEmptyNode", ("c1",))
        self.graph = saved
        self._edge_call("cuGraphAddDependencies", cycle, ["c2"], ["c1"], None)
        other = self._alloc_params(4 * WORDS, device=5)
        empty = self._alloc_params(0)
        refused_cell = U64(BAD_HANDLE)
        self.note("refused: instantiating a cycle, uploading on a stream not the program's; cloning a graph with "
                  "memory nodes, removing its nodes or edges; free nodes of memory no allocation node made, or freed "
                  "already; allocation nodes on no device, of no size", [
                      *self._instantiate(cycle)[1], *self._instantiate(saved, INSTANTIATE_FLAG_UPLOAD,
                                                                      BAD_HANDLE)[1],
                      t["cuGraphClone"](ctypes.addressof(refused_cell), graph),
                      t["cuGraphDestroyNode"](n["join"]),
                      self._edge_call("cuGraphRemoveDependencies", graph, ["memset"], ["words += 5"], None),
                      t["cuGraphAddMemFreeNode"](ctypes.addressof(refused_cell), graph, None, 0, b["words"]),
                      t["cuGraphAddMemFreeNode"](ctypes.addressof(refused_cell), graph, None, 0, alloc.dptr),
                      t["cuGraphAddMemAllocNode"](ctypes.addressof(refused_cell), graph, None, 0,
                                                  ctypes.addressof(other)),
                      t["cuGraphAddMemAllocNode"](ctypes.addressof(refused_cell), graph, None, 0,
                                                  ctypes.addressof(empty))],
                  [refused_cell.value == BAD_HANDLE, self._count(graph)])

        # memory nodes made by cuGraphAddNode (the allocation's address back in the caller's struct)
        third = self._out("cuGraphCreate", 0)
        made_alloc = NodeParams(type=MEM_ALLOC)
        made_alloc.alloc = self._alloc_params(4 * WORDS)
        self._keep.append(made_alloc)
        saved, self.graph = self.graph, third
        by_node = [self._node("added alloc", int(t["cuGraphAddNode"](ctypes.addressof(node), third, None, None, 0,
                                                                     ctypes.addressof(made_alloc))), node)]
        self.places["added"] = (made_alloc.alloc.dptr, 4 * WORDS)
        made_free = NodeParams(type=MEM_FREE)
        made_free.free = made_alloc.alloc.dptr
        self._keep.append(made_free)
        pointer, count = self._deps("added alloc")
        by_node.append(self._node("added free", int(t["cuGraphAddNode"](ctypes.addressof(node), third, pointer, None,
                                                                        count, ctypes.addressof(made_free))), node))
        self.graph = saved
        asked_back = [self._node_params("added alloc"), self._node_params("added free")]
        self.note("memory nodes added with cuGraphAddNode: the address back in the caller's struct", [
            *by_node, made_alloc.alloc.dptr != 0, t["cuGraphDestroy"](third)], asked_back)

        # capture into a given graph, its dependencies changed
        second = self._out("cuGraphCreate", 0)
        saved, self.graph = self.graph, second
        self._add("root", "cuGraphAddEmptyNode", ())
        self.graph = saved
        root_array, _ = self._deps("root")
        stream = self.stream
        steps = [t["cuStreamBeginCaptureToGraph"](stream, second, root_array, None, 1, GLOBAL),
                 t["cuMemsetD32Async"](b["marks"], 20, WORDS, stream)]
        info = self._capture_deps(stream)
        steps += [t["cuStreamUpdateCaptureDependencies"](stream, root_array, None, 1, ADD_CAPTURE_DEPENDENCIES)]
        info_added = self._capture_deps(stream)
        steps += [t["cuMemsetD32Async"](b["copy"], 21, WORDS, stream),
                  t["cuStreamUpdateCaptureDependencies"](stream, root_array, None, 1, SET_CAPTURE_DEPENDENCIES)]
        info_set = self._capture_deps(stream)
        stranger = graph_nodes._nodes(n["memset"])
        self._keep.append(stranger)
        steps += [t["cuStreamUpdateCaptureDependencies"](stream, ctypes.addressof(stranger), None, 1,
                                                         ADD_CAPTURE_DEPENDENCIES),
                  t["cuMemsetD32Async"](b["spare"], 22, WORDS, stream)]
        ended = U64()
        steps.append(t["cuStreamEndCapture"](stream, ctypes.addressof(ended)))
        steps.append(t["cuStreamUpdateCaptureDependencies"](stream, root_array, None, 1, ADD_CAPTURE_DEPENDENCIES))
        edge_count = SZ(0)
        t["cuGraphGetEdges"](second, None, None, None, ctypes.addressof(edge_count))
        captured_exec, shown = self._instantiate(second)
        memset_params = MemsetNodeParams()
        captured_nodes = (U64 * 4)()
        nodes_count = SZ(4)
        t["cuGraphGetNodes"](second, ctypes.addressof(captured_nodes), ctypes.addressof(nodes_count))
        self.note("captured into a graph after its own node, the dependency set added to, then replaced; a node of "
                  "another graph refused; not capturing: refused; the same graph ends the capture", [
                      *steps, *shown, *self._launch(captured_exec, 1)],
                  [info, info_added, info_set, ended.value == second, edge_count.value, nodes_count.value,
                   int(t["cuGraphMemsetNodeGetParams"](captured_nodes[1], ctypes.addressof(memset_params))),
                   self._memory()])

        # the DOT description
        where = tempfile.mkdtemp(prefix="orion-dot-test-")
        path = os.path.join(where, "graph.dot")
        status = int(t["cuGraphDebugDotPrint"](second, path.encode(), DOT_VERBOSE))
        text = None
        if status == SUCCESS:
            with open(path, encoding="ascii") as written:
                text = written.read()
        self.note("the DOT description written to the program's path; a path it cannot write; NULL", [
            status, int(t["cuGraphDebugDotPrint"](second, os.path.join(where, "no", "such.dot").encode(), 0)),
            int(t["cuGraphDebugDotPrint"](second, None, 0)),
            int(t["cuGraphDebugDotPrint"](BAD_HANDLE, path.encode(), 0))], text)
        os.remove(path) if status == SUCCESS else None
        os.rmdir(where)

        # everything destroyed: the graph allocation is no longer the program's
        self.note("destroyed: the graph allocation's range is not the program's memory any more", [
            t["cuGraphExecDestroy"](graph_exec), t["cuGraphExecDestroy"](captured_exec), t["cuGraphDestroy"](graph),
            t["cuGraphDestroy"](second), t["cuGraphDestroy"](child), t["cuGraphDestroy"](cycle),
            t["cuMemcpyHtoD"](alloc.dptr, ctypes.addressof(into), 4 * WORDS),
            t["cuMemsetD32"](alloc.dptr, 1, WORDS)], self._graph_memory())
        self.note("the rest destroyed", [t["cuEventDestroy"](event), t["cuEventDestroy"](outside),
                                         t["cuStreamDestroy"](self.stream),
                                         *[t["cuMemFree"](pointer) for pointer in b.values()]])
        return self.out

    def _memory(self) -> dict[str, list[Any]]:
        return {name: self._read(pointer) for name, pointer in self.buffers.items()}

    def _capture_deps(self, stream: int) -> list[Any]:
        """The capture's dependency set, as node names (cuStreamGetCaptureInfo)."""
        status, ident, graph, nodes, edges, count = I32(), U64(), U64(), P(), P(), SZ()
        result = int(self.t["cuStreamGetCaptureInfo"](stream, ctypes.addressof(status), ctypes.addressof(ident),
                                                      ctypes.addressof(graph), ctypes.addressof(nodes),
                                                      ctypes.addressof(edges), ctypes.addressof(count)))
        if result != SUCCESS:
            return [result]
        found = list((U64 * count.value).from_address(nodes.value)) if count.value and nodes.value else []
        names = {handle: name for name, handle in self.names.items()}
        return [status.value, sorted(names.get(node, "captured") for node in found)]

    def _count(self, graph: int) -> int:
        count = SZ(0)
        status = self.t["cuGraphGetNodes"](graph, None, ctypes.addressof(count))
        return count.value if status == SUCCESS else -status


# --- the reference: the fake driver called as C calls a driver ---------------------------------------------------

def fake_table(driver: Any) -> Table:
    """graph_nodes.fake_table and the calls above over a FakeDriver called directly, as C calls a driver: structs
    read from and written to the C memory the program passes, NULL pointers refused (INVALID_VALUE) as a C driver
    refuses them."""
    from tests.fake_driver import CUgraphEdgeData, CUgraphNode

    table = graph_nodes.fake_table(driver)
    invalid = 1
    kept: list[Any] = []  # arrays the wheel's answers are copied into, for the program's pointers

    def node_list(address: int | None, count: int) -> list[Any] | None:
        return [CUgraphNode(v) for v in (U64 * count).from_address(address)] if address and count else None

    def edge_list(address: int | None, count: int) -> list[Any] | None:
        if not address or not count:
            return None
        found = []
        for word in (U64 * count).from_address(address):
            edge = CUgraphEdgeData()
            edge.from_port, edge.to_port = word & 0xFF, (word >> 8) & 0xFF
            edge.type = driver.CUgraphDependencyType((word >> 16) & 0xFF)
            found.append(edge)
        return found

    def put_kernel(params: Any, address: int) -> None:
        out = KernelNodeParams.from_address(address)
        for name, *_kind in KernelNodeParams._fields_:
            setattr(out, name, int(getattr(params, name) or 0))

    def put_memset(params: Any, out: Any) -> None:
        for name, *_kind in MemsetNodeParams._fields_:
            setattr(out, name, int(getattr(params, name) or 0))

    def put_copy(params: Any, out: Any) -> None:
        for name, *_kind in Memcpy3D._fields_:
            if not name.startswith("reserved"):
                setattr(out, name, int(getattr(params, name) or 0))

    def put_alloc(params: Any, out: MemAllocNodeParams) -> None:
        props, given = out.poolProps, params.poolProps
        props.allocType, props.handleTypes = int(given.allocType), int(given.handleTypes)
        props.locationType, props.locationId = int(given.location.type), int(given.location.id)
        props.maxSize, props.usage = int(given.maxSize), int(given.usage)
        props.gpuDirectRDMACapable = int(given.gpuDirectRDMACapable)
        descs = params.accessDescs[:int(params.accessDescCount)]
        array = (MemAccessDesc * max(len(descs), 1))(*[
            MemAccessDesc(int(d.location.type), int(d.location.id), int(d.flags)) for d in descs])
        kept.append(array)
        out.accessDescs = ctypes.addressof(array) if descs else None
        out.accessDescCount, out.bytesize, out.dptr = len(descs), int(params.bytesize), int(params.dptr)

    def getting(name: str, put: Any, struct_type: Any) -> Any:
        def call(node: int, address: int | None) -> int:
            if not address:
                return invalid
            status, *values = getattr(driver, name)(node)
            if int(status) == SUCCESS:
                put(values[0], struct_type.from_address(address))
            return int(status)
        return call

    def kernel_get(node: int, address: int | None) -> int:
        if not address:
            return invalid
        status, params = driver.cuGraphKernelNodeGetParams(node)
        if int(status) == SUCCESS:
            put_kernel(params, address)
        return int(status)

    def node_get(node: int, address: int | None) -> int:
        if not address:
            return invalid
        status, params = driver.cuGraphNodeGetParams(node)
        if int(status) != SUCCESS:
            return int(status)
        out = NodeParams.from_address(address)
        ctypes.memset(address, 0, ctypes.sizeof(NodeParams))
        out.type = int(params.type)
        kind = out.type
        if kind == graph_nodes.KERNEL:
            put_kernel(params.kernel, ctypes.addressof(out.kernel))
        elif kind == graph_nodes.MEMSET:
            put_memset(params.memset, out.memset)
            out.memset.ctx = int(params.memset.ctx or 0)
        elif kind == graph_nodes.MEMCPY:
            put_copy(params.memcpy.copyParams, out.memcpy.copyParams)
            out.memcpy.copyCtx, out.memcpy.flags = int(params.memcpy.copyCtx or 0), int(params.memcpy.flags)
        elif kind == graph_nodes.GRAPH:
            out.graph.graph, out.graph.ownership = int(params.graph.graph or 0), int(params.graph.ownership)
        elif kind == graph_nodes.EVENT_RECORD:
            out.eventRecord.event = int(params.eventRecord.event or 0)
        elif kind == graph_nodes.WAIT_EVENT:
            out.eventWait.event = int(params.eventWait.event or 0)
        elif kind == CONDITIONAL:
            given = params.conditional
            bodies = (U64 * max(int(given.size), 1))(*[int(g) for g in given.phGraph_out or []])
            kept.append(bodies)
            out.conditional.handle, out.conditional.type = int(given.handle or 0), int(given.type)
            out.conditional.size, out.conditional.ctx = int(given.size), int(given.ctx or 0)
            out.conditional.phGraph_out = ctypes.addressof(bodies)
        elif kind == MEM_ALLOC:
            put_alloc(params.alloc, MemAllocNodeParams.from_address(address + NodeParams.u.offset))
        elif kind == MEM_FREE:
            U64.from_address(address + NodeParams.u.offset).value = int(params.free.dptr or 0)
        return SUCCESS

    def attribute_get(node: int, attribute: int, address: int | None) -> int:
        if not address:
            return invalid
        status, value = driver.cuGraphKernelNodeGetAttribute(node, attribute)
        if int(status) == SUCCESS:
            ctypes.memmove(address, value.getPtr(), 64)
        return int(status)

    def attribute_set(node: int, attribute: int, address: int | None) -> int:
        if not address:
            return invalid
        return int(driver.cuGraphKernelNodeSetAttribute(node, attribute, driver.CUkernelNodeAttrValue(_ptr=address))[0])

    def begin_capture(stream: int, graph: int, deps: int | None, edges: int | None, count: int, mode: int) -> int:
        if count and not deps:
            return invalid
        return int(driver.cuStreamBeginCaptureToGraph(stream, graph, node_list(deps, count), edge_list(edges, count),
                                                      count, mode)[0])

    def update_capture(stream: int, deps: int | None, edges: int | None, count: int, flags: int) -> int:
        if count and not deps:
            return invalid
        return int(driver.cuStreamUpdateCaptureDependencies(stream, node_list(deps, count), edge_list(edges, count),
                                                            count, flags)[0])

    def instantiate(out: int | None, graph: int, address: int | None) -> int:
        if not out or not address:
            return invalid
        given = InstantiateParams.from_address(address)
        params = driver.CUDA_GRAPH_INSTANTIATE_PARAMS()
        params.flags, params.hUploadStream = driver.cuuint64_t(given.flags), given.hUploadStream
        status, graph_exec = driver.cuGraphInstantiateWithParams(graph, params)
        given.result_out, given.hErrNode_out = int(params.result_out), int(params.hErrNode_out or 0)
        if int(status) == SUCCESS:
            U64.from_address(out).value = int(graph_exec)
        return int(status)

    alloc_params: Any = table["_alloc_params"]

    def add_alloc(out: int | None, graph: int, deps: int | None, count: int, address: int | None) -> int:
        if not out or not address or (count and not deps):
            return invalid
        params = alloc_params(address)
        status, node = driver.cuGraphAddMemAllocNode(graph, node_list(deps, count), count, params)
        if int(status) == SUCCESS:
            U64.from_address(out).value = int(node)
            MemAllocNodeParams.from_address(address).dptr = int(params.dptr)
        return int(status)

    def add_free(out: int | None, graph: int, deps: int | None, count: int, dptr: int) -> int:
        if not out or (count and not deps):
            return invalid
        status, node = driver.cuGraphAddMemFreeNode(graph, node_list(deps, count), count, dptr)
        if int(status) == SUCCESS:
            U64.from_address(out).value = int(node)
        return int(status)

    def graph_mem_get(device: int, attribute: int, address: int | None) -> int:
        if not address:
            return invalid
        status, value = driver.cuDeviceGetGraphMemAttribute(device, attribute)
        if int(status) == SUCCESS:
            U64.from_address(address).value = int(value)
        return int(status)

    def graph_mem_set(device: int, attribute: int, address: int | None) -> int:
        if not address:
            return invalid
        return int(driver.cuDeviceSetGraphMemAttribute(device, attribute,
                                                       driver.cuuint64_t(U64.from_address(address).value))[0])

    def dot_print(graph: int, path: bytes | None, flags: int) -> int:
        return invalid if path is None else int(driver.cuGraphDebugDotPrint(graph, path, flags)[0])

    table.update({
        "cuGraphKernelNodeGetParams": kernel_get,
        "cuGraphMemsetNodeGetParams": getting("cuGraphMemsetNodeGetParams", put_memset, MemsetNodeParams),
        "cuGraphMemcpyNodeGetParams": getting("cuGraphMemcpyNodeGetParams", put_copy, Memcpy3D),
        "cuGraphMemAllocNodeGetParams": getting("cuGraphMemAllocNodeGetParams", put_alloc, MemAllocNodeParams),
        "cuGraphNodeGetParams": node_get,
        "cuGraphKernelNodeGetAttribute": attribute_get, "cuGraphKernelNodeSetAttribute": attribute_set,
        "cuStreamBeginCaptureToGraph": begin_capture, "cuStreamUpdateCaptureDependencies": update_capture,
        "cuGraphInstantiateWithParams": instantiate, "cuGraphAddMemAllocNode": add_alloc,
        "cuGraphAddMemFreeNode": add_free, "cuDeviceGetGraphMemAttribute": graph_mem_get,
        "cuDeviceSetGraphMemAttribute": graph_mem_set, "cuGraphDebugDotPrint": dot_print,
        "cuMemsetD32Async": lambda *args: int(driver.cuMemsetD32Async(*args)[0]),
    })
    table["_kept_queries"] = kept  # type: ignore[assignment]
    return table


def main(argv: list[str]) -> int:
    table = library_table(ctypes.CDLL(argv[0], mode=ctypes.RTLD_GLOBAL))
    print(json.dumps({"transcript": GraphQueryProgram(table, pinned="pinned" in argv[1:]).run()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
