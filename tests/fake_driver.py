"""A pure-Python stand-in for `cuda.bindings.driver`, for CI machines that have no GPU and no libcuda.

THIS IS A FAKE, NOT CUDA. It runs no kernel and knows nothing about GPUs beyond what is written here. It exists
because host_agent/session/executor.py touches CUDA only through the Python API of `cuda.bindings.driver`, which can be
injected (`CudaExecutor(session, options, driver=FakeDriver())`), so the whole forwarding path — guest trampoline
implementations, records, rings, staging, the executor's checks and conversions — can be exercised on a machine
without a GPU. A test that passes against the fake proves the plumbing, not that CUDA behaves this way; the GPU
tests (tests/gpu/) hold the real thing.

To keep it honest:

* Same call shapes as the wheel: every function returns a tuple `(CUresult, outputs...)`, outputs `None` on
  failure. Results are `CUresult` enum members (IntEnum) with the wheel's names and values; handles come back as
  handle objects (`CUcontext`, `CUdeviceptr`, ...) that only `int()` turns into numbers, as on the wheel, so an
  executor that forgot a conversion fails here too.
* Inputs are taken as the wheel takes them: an enum parameter accepts its enum member or a plain int (an unknown
  value raises ValueError, a member of another enum TypeError), a 64-bit memory-pool attribute value must be a
  `cuuint64_t` (a plain int raises AttributeError, as the 13.4 wheel does), handles and pointers may be ints or
  handle objects. What was passed is recorded as it was passed, so a test can tell an enum member from an int.
* Failures it models use CUDA's own codes: NOT_INITIALIZED before `cuInit`, INVALID_CONTEXT without a current
  context, INVALID_HANDLE for a handle it did not hand out, INVALID_VALUE for a device range outside an
  allocation or a zero grid, OUT_OF_MEMORY past a device's memory, INVALID_DEVICE, NOT_FOUND for an unknown
  symbol, ... (the uncommon ones were checked against an H200).
* Device memory is real: a dict of bytearrays keyed by fake device addresses (with a 2 MiB unmapped gap after
  every allocation, so an overrun never lands in a neighbour). Copies, memsets and module globals move real
  bytes; `cuMemcpyHtoD`/`cuMemcpyDtoH` accept a buffer-protocol object or an int host address, like the wheel.
* Answers are deterministic: handles are distinct increasing ints; attribute and query results are fixed
  functions of their inputs (see each method); nothing depends on time.
* Module images: PTX is parsed for real (`.entry` kernels with their `.param` layout — the offsets and sizes
  `cuFuncGetParamInfo` reports follow PTX's alignment rules — and `.global` variables, which become device
  memory). ELF cubins are recognised by their section headers (`.text.<kernel>` sections); their parameter
  layout is not decoded, so `cuFuncGetParamInfo` answers CUDA_ERROR_NOT_SUPPORTED for them rather than a made-up
  layout. A fatbin is accepted when it carries an ELF or PTX image; anything else is CUDA_ERROR_INVALID_IMAGE.
* Launches run nothing, but for one test kernel, ADD_KERNEL (`orion_fake_add_u32`: adds a value to 32-bit words
  through a pointer, device memory or registered host memory, in stream order; the stand-in for a kernel given
  page-locked memory): `cuLaunchKernel` checks the function, dimensions and stream, decodes `kernelParams`
  (by the layout) or `extra` (CU_LAUNCH_PARAM_BUFFER_POINTER/SIZE) and records the packed parameter bytes. Like
  the real driver (checked on an H200), it does not refuse an `extra` buffer whose size differs from the
  kernel's parameter size; the record says whether it matched.
* What the process holds on each GPU, as NVML would report it (`process_memory`, read by `FakeMeter`, the
  stand-in for host_agent/session/gpu_memory.py's NVML meter): `context_bytes` per live context (a primary one while
  retained), plus its allocations and module/library globals, byte for byte (no 2 MiB rounding).
* `cuMemHostRegister` needs a current context (CUDA_ERROR_INVALID_CONTEXT otherwise, as on an H200) and
  refuses overlapping registrations; it pins nothing.
* Asynchronous calls check their arguments at once and report those errors directly. Their effect follows CUDA's
  stream rules with the latest schedule CUDA allows: work on the legacy stream and on blocking streams happens at
  once; work queued on a non-blocking stream (CU_STREAM_NON_BLOCKING) happens only when something must wait for
  it — a synchronize of that stream, of the context or of an event recorded after it, cuStreamWaitEvent,
  cuMemFree, or an async copy to or from host memory on that same stream (pageable copies wait for the stream's
  earlier work, as the driver's do). The legacy stream does not wait for non-blocking streams, so code relying on
  an order CUDA does not promise fails here every time instead of now and then on a GPU.
* Stream capture and graphs: while a stream captures (cuStreamBeginCapture), the work queued on it — launches, async
  copies (to and from host memory too, the node reading or writing it when it runs; whether CUDA captures a copy of
  pageable memory was not checked) and memsets, stream memory operations, event records with CU_EVENT_RECORD_EXTERNAL
  and waits with CU_EVENT_WAIT_EXTERNAL, graph launches (one child-graph node), host functions (cuLaunchHostFunc: a
  host node) — is checked as usual, runs nothing and becomes the next node of the capture's graph, a single chain in
  call order; cuStreamIsCapturing answers ACTIVE, cuStreamGetCaptureInfo the capture's id (unique, counting from 1),
  graph and the node captured last. A plain event record on a capturing stream adds no node: the event becomes a
  captured event (cuEventQuery/cuEventSynchronize answer
  CUDA_ERROR_CAPTURED_EVENT). cuGraphLaunch queues each node's work on the launch stream in order, as if each
  call were made on that stream then, so the stream rules above apply to it (in an order that runs each
  node after its dependencies: a captured graph's chain, in call order). What ends or spoils a capture:
  synchronizing or querying the capturing stream, or synchronizing its context, answers
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900) and invalidates it (status INVALIDATED; work queued on it then
  answers 901 and cuStreamEndCapture answers CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (901), ending it); the legacy
  stream synchronized or queried while a blocking stream captures answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (906,
  cuda.h's meaning of it) and invalidates that capture; cuMemAlloc and cuMemFree follow
  cuThreadExchangeStreamCaptureMode's rule (the mode is per calling thread, GLOBAL at first): unless the
  thread's mode is RELAXED, they answer 900 while it has a non-RELAXED capture of its own or (mode GLOBAL) while
  any GLOBAL capture is under way, and invalidate those captures. A non-RELAXED capture must end on the thread
  that began it (CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD). Where CUDA's documentation names no code the fake
  follows hip-tests' expectations of CUDA (BeginCapture on the legacy stream: 900; on a capturing stream, and
  EndCapture on a stream not capturing: CUDA_ERROR_ILLEGAL_STATE, 401); these were not checked on a GPU. Not
  modelled: captures joined across streams by events (a wait on a captured event from another stream answers
  CUDA_ERROR_NOT_SUPPORTED), memory allocation and free nodes (cuMemAllocAsync/cuMemFreeAsync on a capturing
  stream: CUDA_ERROR_NOT_SUPPORTED), an argument error invalidating the capture (it is answered; the capture goes
  on), other calls CUDA counts unsafe during a capture (synchronous copies and memsets, cuMemAllocHost, module
  loads... behave as without a capture), the legacy stream's implicit dependency on a capturing blocking stream
  for anything but its synchronize and query, the parameters of a captured node but a host node's (it replays
  exactly what was captured: memory freed since is not noticed), and any cost or upload of a graph.
* Graphs built node by node (the cuGraphAdd*Node calls of kernel — ADD_KERNEL runs, any other kernel runs nothing
  —, memset, memcpy between device memory and host memory given by its address, empty, child-graph, event
  record/wait and host nodes; cuGraphAdd/RemoveDependencies with edge data; cuGraphGetNodes, GetRootNodes, GetEdges,
  NodeGetDependencies and NodeGetDependentNodes; the Kernel/Memset/Memcpy/HostNodeSetParams calls on a graph's node
  and on an executable graph's copy of it; cuGraphExecUpdate): nodes keep their parameters, checked when given (an
  unknown function or kernel, a memset's rows or a copy's device side outside one allocation, a dependency of
  another graph or named twice: CUDA_ERROR_INVALID_VALUE; an unknown event CUDA_ERROR_INVALID_HANDLE; a NULL
  context without a current one CUDA_ERROR_INVALID_CONTEXT) and resolved again when the node runs (memory freed
  since: that part does nothing, where a GPU would fault). A child graph node runs a clone of its child graph made
  when it was added (a moved one: the graph itself, below). cuGraphInstantiate runs the nodes in an order that
  respects every edge (a cycle: CUDA_ERROR_INVALID_VALUE) and keeps them as they are then; cuGraphExec*SetParams
  changes only the executable graph's copy, under cuda.h's rules for it (a memset's height, a 2D memset's
  dimensions, a copy that is not 1D or changes memory types: CUDA_ERROR_INVALID_VALUE). cuGraphExecUpdate pairs nodes by
  the order they were added and edges by the order they were added to each node, and either takes every paired node's
  parameters or answers CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE with the wheel's shape (no result information; the
  journal's note holds the CUgraphExecUpdateResult and the error nodes the fake found). Queries answer as the wheel does
  (lists of the length asked for, NULL entries past those written, and the count written; asked for 0, empty lists and
  the whole count), nodes in the order they were added and edges in the order they were added. Where cuda.h names no
  rule (an empty memset or copy, edge ports, a child graph with a cycle) the method says the fake's choice; none of this
  was checked on a GPU. cuGraphAddNode makes each of these node types from its CUgraphNodeParams member, with edge data,
  and conditional nodes (IF, WHILE, SWITCH): their body graphs are owned by the node (cloned with it, gone with it) and
  run, in launch order, as the handle's value at launch picks them: its default where cuGraphConditionalHandleCreate was
  given CU_GRAPH_COND_ASSIGN_DEFAULT, else 0, since no kernel of the fake sets a handle (a WHILE that would then run
  forever makes cuGraphInstantiate answer CUDA_ERROR_NOT_SUPPORTED). cuGraphConditionalHandleCreate and
  cuGraphDestroyNode are modelled by GraphFakeDriver only (it says why). A child graph moved into its node
  (OWNERSHIP_MOVE) is the graph itself, owned by the node (not destroyable, instantiable or usable by cuGraphExecUpdate
  on its own: CUDA_ERROR_INVALID_VALUE, as cuda.h restricts it), its nodes the same handles, so cuGraphExec*SetParams
  sets them through the parent's executable graph. A node's parameters come back as they were given
  (cuGraph*NodeGetParams, cuGraphNodeGetParams; a captured node's, but for a host node's and a batch memory-operation
  node's, are not modelled: CUDA_ERROR_NOT_SUPPORTED), kernel node attributes are kept as their bytes, captures may
  begin into a given graph after given dependencies and change their dependency set, and memory allocation and free
  nodes make and free graph allocations under cuda.h's rules (the fake's choices named at each method, from "graphs,
  their second part" on). Not modelled: external semaphore nodes, host nodes and batch memory-operation nodes through
  the generic calls (cuGraphAddNode, cuGraphNodeGetParams, cuGraphNodeSetParams), CUDA arrays
  (CUDA_ERROR_NOT_SUPPORTED), node priorities, and setting a conditional body's node through an executable graph
  (CUDA_ERROR_INVALID_VALUE here).
* Host functions (cuLaunchHostFunc) and host nodes (cuGraphAddHostNode, cuGraphHostNodeGet/SetParams,
  cuGraphExecHostNodeSetParams): the function, a C function's address (a CUhostFn or an int, as the wheel takes it),
  is really called, `HOST_FN(address)(userData)`, when its turn in stream order comes (the stream rules above: at
  once on a blocking stream, when waited for on a non-blocking one; a host node when its graph's launch reaches it,
  after its dependencies), on the thread of the call that runs it, where CUDA uses a thread of its own; the calls made
  are kept in `FakeDriver.host_calls`. NULL functions answer CUDA_ERROR_INVALID_VALUE. What was checked on an H200 and
  the fake's choices are named in their section ("host functions and graph host nodes").
* Batch memory operations (cuStreamBatchMemOp) and batch memory-operation nodes (cuGraphAddBatchMemOpNode,
  cuGraphBatchMemOpNodeGet/SetParams, cuGraphExecBatchMemOpNodeSetParams): the wheel's CUstreamBatchMemOpParams and
  CUDA_BATCH_MEM_OP_NODE_PARAMS are modelled over C memory of cuda.h's layout (getPtr(), `_ptr`), unions included, and
  as the wheel reads them: a CUDA_BATCH_MEM_OP_NODE_PARAMS's `paramArray` lists only operations set from Python, so
  the one cuGraphBatchMemOpNodeGetParams fills reads [] there, its operations at its pointer (getPtr() + 16, `count`
  structs of 48 bytes; `batch_ops_at` reads them). Waits and writes of 32 and 64 bits do what cuStreamWaitValue32 and
  cuStreamWriteValue32 do, in array order; barriers and flushes nothing observable; a batch captured is one
  BATCH_MEM_OP node that keeps its operations. The rules and the fake's choices are named in their section ("batch
  memory operations and batch memory-operation nodes"); none was checked on a GPU.
* Module enumeration and names (cuModuleGetFunctionCount, cuModuleEnumerateFunctions, cuLibraryGetKernelCount,
  cuLibraryEnumerateKernels, cuFuncGetName, cuKernelGetName), bus ids (cuDeviceGetPCIBusId, cuDeviceGetByPCIBusId),
  cuDeviceGetLuid and CUDA 13's atomic capabilities (cuDeviceGetHostAtomicCapabilities,
  cuDeviceGetP2PAtomicCapabilities): enumerated handles are those the by-name calls give, in the image's order; the
  wheel's return shapes and the fake's choices (a count rule, LUIDs NOT_SUPPORTED as on Linux, capabilities an H100
  plausibly has) are named in their section ("module enumeration and names; bus ids, LUIDs and atomic capabilities
  of devices"); none was checked on a GPU.

Every call is recorded in `FakeDriver.calls` and, when `journal` names a file, appended to it as one JSON line
(`{"pid", "name", "args", "result", ...}`) before the call returns: the executor runs in a forked session
worker, and the test process reads what the fake saw from that file (`read_journal`). Values are encoded by
`plain()`: ints and floats as themselves, enum members and handle objects as `[type name, int]`, buffers as
`{"len", "sha256"[, "hex"]}`.

The enum classes carry only the members the fake needs, with the wheel's values; the unit tests hold them to
the installed wheel.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import mmap
import os
import re
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, NamedTuple

from ivshmem.driver_api import LAUNCH_ATTRIBUTE, LaunchConfig

# --- enums (subsets of the wheel's, same names and values) --------------------------------------------------------

CUresult = IntEnum("CUresult", [  # type: ignore[misc]
    ("CUDA_SUCCESS", 0), ("CUDA_ERROR_INVALID_VALUE", 1), ("CUDA_ERROR_OUT_OF_MEMORY", 2),
    ("CUDA_ERROR_NOT_INITIALIZED", 3), ("CUDA_ERROR_DEINITIALIZED", 4), ("CUDA_ERROR_STUB_LIBRARY", 34),
    ("CUDA_ERROR_NO_DEVICE", 100), ("CUDA_ERROR_INVALID_DEVICE", 101), ("CUDA_ERROR_INVALID_IMAGE", 200),
    ("CUDA_ERROR_INVALID_CONTEXT", 201), ("CUDA_ERROR_CONTEXT_ALREADY_CURRENT", 202),
    ("CUDA_ERROR_NO_BINARY_FOR_GPU", 209), ("CUDA_ERROR_INVALID_PTX", 218), ("CUDA_ERROR_INVALID_SOURCE", 300),
    ("CUDA_ERROR_INVALID_HANDLE", 400), ("CUDA_ERROR_NOT_FOUND", 500), ("CUDA_ERROR_NOT_READY", 600),
    ("CUDA_ERROR_ILLEGAL_ADDRESS", 700), ("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", 701),
    ("CUDA_ERROR_LAUNCH_FAILED", 719), ("CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", 712),
    ("CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", 713), ("CUDA_ERROR_NOT_PERMITTED", 800),
    ("CUDA_ERROR_NOT_SUPPORTED", 801), ("CUDA_ERROR_UNSUPPORTED_LIMIT", 215), ("CUDA_ERROR_LAUNCH_TIMEOUT", 702),
    ("CUDA_ERROR_INVALID_CLUSTER_SIZE", 912), ("CUDA_ERROR_ILLEGAL_STATE", 401),
    ("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", 900), ("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", 901),
    ("CUDA_ERROR_STREAM_CAPTURE_MERGE", 902), ("CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", 903),
    ("CUDA_ERROR_STREAM_CAPTURE_UNJOINED", 904), ("CUDA_ERROR_STREAM_CAPTURE_ISOLATION", 905),
    ("CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", 906), ("CUDA_ERROR_CAPTURED_EVENT", 907),
    ("CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", 908), ("CUDA_ERROR_LOSSY_QUERY", 402),
    ("CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", 910), ("CUDA_ERROR_OPERATING_SYSTEM", 304),
    ("CUDA_ERROR_UNKNOWN", 999),
])
ERROR_STRINGS = {  # cuGetErrorString's texts (CUDA 13) for the codes above
    0: "no error", 1: "invalid argument", 2: "out of memory", 3: "initialization error",
    4: "driver shutting down", 34: "CUDA driver is a stub library", 100: "no CUDA-capable device is detected",
    101: "invalid device ordinal", 200: "device kernel image is invalid", 201: "invalid device context",
    202: "context already current", 209: "no kernel image is available for execution on the device",
    218: "a PTX JIT compilation failed", 300: "device kernel image is invalid", 400: "invalid resource handle",
    500: "named symbol not found", 600: "device not ready", 700: "an illegal memory access was encountered",
    701: "too many resources requested for launch", 719: "unspecified launch failure",
    712: "part or all of the requested memory range is already mapped",
    713: "pointer does not correspond to a registered memory region",
    800: "operation not permitted", 801: "operation not supported", 999: "unknown error",
    215: "limit is not supported on this architecture", 702: "the launch timed out and was terminated",
    912: "invalid cluster size",
    # stream capture (the CUDA 13 runtime's texts, libcudart.so.13: the driver's were not read on a GPU)
    401: "the operation cannot be performed in the present state",
    900: "operation not permitted when stream is capturing",
    901: "operation failed due to a previous error during capture",
    902: "operation would result in a merge of separate capture sequences",
    903: "capture was not ended in the same stream as it began", 904: "capturing stream has unjoined work",
    905: "dependency created on uncaptured work in another stream",
    906: "operation would make the legacy stream depend on a capturing blocking stream",
    907: "operation not permitted on an event last recorded in a capturing stream",
    908: "attempt to terminate a thread-local capture sequence from another thread",
    402: "attempted introspection would be semantically lossy",
    910: "the graph update was not performed because it included changes which violated constraints specific to "
         "instantiated graph update",
}
def _other_device_attributes(named: set[int]) -> list[tuple[str, int]]:
    """CUdevice_attribute members beyond the few named here: the installed wheel's (names and values), else
    1..161 under numbered names (a machine without cuda-bindings)."""
    try:
        from cuda.bindings import driver as wheel
    except ImportError:
        return [(f"CU_DEVICE_ATTRIBUTE_{n}", n) for n in range(1, 162) if n not in named]
    return [(m.name, int(m)) for m in wheel.CUdevice_attribute
            if int(m) not in named and m.name != "CU_DEVICE_ATTRIBUTE_MAX"]


CUdevice_attribute = IntEnum("CUdevice_attribute", [  # type: ignore[misc]
    ("CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK", 1), ("CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X", 2),
    ("CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X", 5), ("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK", 8),
    ("CU_DEVICE_ATTRIBUTE_WARP_SIZE", 10), ("CU_DEVICE_ATTRIBUTE_CLOCK_RATE", 13),
    ("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT", 16), ("CU_DEVICE_ATTRIBUTE_PCI_BUS_ID", 33),
    ("CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR", 39),
    ("CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING", 41), ("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR", 75),
    ("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR", 76), ("CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED", 115),
    ("CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID", 34), ("CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID", 50),
    # the rest of CUDA 13's attributes, which a CUDA runtime reads at start-up: the wheel's names where it is here
    *_other_device_attributes({1, 2, 5, 8, 10, 13, 16, 33, 34, 39, 41, 50, 75, 76, 115}),
])
CUmemPool_attribute = IntEnum("CUmemPool_attribute", [  # type: ignore[misc]
    ("CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES", 1), ("CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC", 2),
    ("CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES", 3), ("CU_MEMPOOL_ATTR_RELEASE_THRESHOLD", 4),
    ("CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT", 5), ("CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH", 6),
    ("CU_MEMPOOL_ATTR_USED_MEM_CURRENT", 7), ("CU_MEMPOOL_ATTR_USED_MEM_HIGH", 8),
    ("CU_MEMPOOL_ATTR_ALLOCATION_TYPE", 9), ("CU_MEMPOOL_ATTR_EXPORT_HANDLE_TYPES", 10),
    ("CU_MEMPOOL_ATTR_LOCATION_ID", 11), ("CU_MEMPOOL_ATTR_LOCATION_TYPE", 12),
    ("CU_MEMPOOL_ATTR_MAX_POOL_SIZE", 13), ("CU_MEMPOOL_ATTR_HW_DECOMPRESS_ENABLED", 14),
    ("CU_MEMPOOL_ATTR_LOCALITY_DOMAIN_ID", 15),
])
POOL_ATTRIBUTES_64 = frozenset({4, 5, 6, 7, 8, 13})  # cuuint64_t-valued (cuda.h); the others are int
CUfunction_attribute = IntEnum("CUfunction_attribute", [  # type: ignore[misc]
    ("CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK", 0), ("CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES", 1),
    ("CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES", 2), ("CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES", 3),
    ("CU_FUNC_ATTRIBUTE_NUM_REGS", 4), ("CU_FUNC_ATTRIBUTE_PTX_VERSION", 5),
    ("CU_FUNC_ATTRIBUTE_BINARY_VERSION", 6), ("CU_FUNC_ATTRIBUTE_CACHE_MODE_CA", 7),
    ("CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8),
    ("CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT", 9),
])
CUfunc_cache = IntEnum("CUfunc_cache", [  # type: ignore[misc]
    ("CU_FUNC_CACHE_PREFER_NONE", 0), ("CU_FUNC_CACHE_PREFER_SHARED", 1), ("CU_FUNC_CACHE_PREFER_L1", 2),
    ("CU_FUNC_CACHE_PREFER_EQUAL", 3),
])
CUstreamCaptureStatus = IntEnum("CUstreamCaptureStatus", [  # type: ignore[misc]
    ("CU_STREAM_CAPTURE_STATUS_NONE", 0), ("CU_STREAM_CAPTURE_STATUS_ACTIVE", 1),
    ("CU_STREAM_CAPTURE_STATUS_INVALIDATED", 2),
])
CUstreamCaptureMode = IntEnum("CUstreamCaptureMode", [  # type: ignore[misc]
    ("CU_STREAM_CAPTURE_MODE_GLOBAL", 0), ("CU_STREAM_CAPTURE_MODE_THREAD_LOCAL", 1),
    ("CU_STREAM_CAPTURE_MODE_RELAXED", 2),
])
CUgraphNodeType = IntEnum("CUgraphNodeType", [  # type: ignore[misc]
    ("CU_GRAPH_NODE_TYPE_KERNEL", 0), ("CU_GRAPH_NODE_TYPE_MEMCPY", 1), ("CU_GRAPH_NODE_TYPE_MEMSET", 2),
    ("CU_GRAPH_NODE_TYPE_HOST", 3), ("CU_GRAPH_NODE_TYPE_GRAPH", 4), ("CU_GRAPH_NODE_TYPE_EMPTY", 5),
    ("CU_GRAPH_NODE_TYPE_WAIT_EVENT", 6), ("CU_GRAPH_NODE_TYPE_EVENT_RECORD", 7),
    ("CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL", 8), ("CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT", 9),
    ("CU_GRAPH_NODE_TYPE_MEM_ALLOC", 10), ("CU_GRAPH_NODE_TYPE_MEM_FREE", 11),
    ("CU_GRAPH_NODE_TYPE_BATCH_MEM_OP", 12), ("CU_GRAPH_NODE_TYPE_CONDITIONAL", 13),
])
CUgraphDependencyType = IntEnum("CUgraphDependencyType", [  # type: ignore[misc]
    ("CU_GRAPH_DEPENDENCY_TYPE_DEFAULT", 0), ("CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC", 1),
])
CUmemorytype = IntEnum("CUmemorytype", [  # type: ignore[misc]
    ("CU_MEMORYTYPE_HOST", 1), ("CU_MEMORYTYPE_DEVICE", 2), ("CU_MEMORYTYPE_ARRAY", 3), ("CU_MEMORYTYPE_UNIFIED", 4),
])
CUgraphExecUpdateResult = IntEnum("CUgraphExecUpdateResult", [  # type: ignore[misc]
    ("CU_GRAPH_EXEC_UPDATE_SUCCESS", 0), ("CU_GRAPH_EXEC_UPDATE_ERROR", 1),
    ("CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED", 2), ("CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED", 3),
    ("CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED", 4), ("CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED", 5),
    ("CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED", 6), ("CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE", 7),
    ("CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED", 8),
])
CUgraphInstantiate_flags = IntEnum("CUgraphInstantiate_flags", [  # type: ignore[misc]
    ("CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH", 1), ("CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD", 2),
    ("CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH", 4), ("CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY", 8),
])
CUevent_record_flags = IntEnum("CUevent_record_flags", [  # type: ignore[misc]
    ("CU_EVENT_RECORD_DEFAULT", 0), ("CU_EVENT_RECORD_EXTERNAL", 1),
])
CUevent_wait_flags = IntEnum("CUevent_wait_flags", [  # type: ignore[misc]
    ("CU_EVENT_WAIT_DEFAULT", 0), ("CU_EVENT_WAIT_EXTERNAL", 1),
])
CUgraphConditionalNodeType = IntEnum("CUgraphConditionalNodeType", [  # type: ignore[misc]
    ("CU_GRAPH_COND_TYPE_IF", 0), ("CU_GRAPH_COND_TYPE_WHILE", 1), ("CU_GRAPH_COND_TYPE_SWITCH", 2),
])
CUgraphChildGraphNodeOwnership = IntEnum("CUgraphChildGraphNodeOwnership", [  # type: ignore[misc]
    ("CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE", 0), ("CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE", 1),
])
CUstreamBatchMemOpType = IntEnum("CUstreamBatchMemOpType", [  # type: ignore[misc]
    ("CU_STREAM_MEM_OP_WAIT_VALUE_32", 1), ("CU_STREAM_MEM_OP_WRITE_VALUE_32", 2),
    ("CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES", 3), ("CU_STREAM_MEM_OP_WAIT_VALUE_64", 4),
    ("CU_STREAM_MEM_OP_WRITE_VALUE_64", 5), ("CU_STREAM_MEM_OP_BARRIER", 6),
    ("CU_STREAM_MEM_OP_ATOMIC_REDUCTION", 8),  # the 13.x wheel's (not in CUDA 13.0's cuda.h): not modelled
])
CUstreamWaitValue_flags = IntEnum("CUstreamWaitValue_flags", [  # type: ignore[misc]
    ("CU_STREAM_WAIT_VALUE_GEQ", 0), ("CU_STREAM_WAIT_VALUE_EQ", 1), ("CU_STREAM_WAIT_VALUE_AND", 2),
    ("CU_STREAM_WAIT_VALUE_NOR", 3), ("CU_STREAM_WAIT_VALUE_FLUSH", 1 << 30),
])
CUstreamWriteValue_flags = IntEnum("CUstreamWriteValue_flags", [  # type: ignore[misc]
    ("CU_STREAM_WRITE_VALUE_DEFAULT", 0), ("CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER", 1),
])
CUstreamMemoryBarrier_flags = IntEnum("CUstreamMemoryBarrier_flags", [  # type: ignore[misc]
    ("CU_STREAM_MEMORY_BARRIER_TYPE_SYS", 0), ("CU_STREAM_MEMORY_BARRIER_TYPE_GPU", 1),
])
CUatomicOperation = IntEnum("CUatomicOperation", [  # type: ignore[misc]  # CUDA 13's; MAX counts them, no operation
    ("CU_ATOMIC_OPERATION_INTEGER_ADD", 0), ("CU_ATOMIC_OPERATION_INTEGER_MIN", 1),
    ("CU_ATOMIC_OPERATION_INTEGER_MAX", 2), ("CU_ATOMIC_OPERATION_INTEGER_INCREMENT", 3),
    ("CU_ATOMIC_OPERATION_INTEGER_DECREMENT", 4), ("CU_ATOMIC_OPERATION_AND", 5), ("CU_ATOMIC_OPERATION_OR", 6),
    ("CU_ATOMIC_OPERATION_XOR", 7), ("CU_ATOMIC_OPERATION_EXCHANGE", 8), ("CU_ATOMIC_OPERATION_CAS", 9),
    ("CU_ATOMIC_OPERATION_FLOAT_ADD", 10), ("CU_ATOMIC_OPERATION_FLOAT_MIN", 11),
    ("CU_ATOMIC_OPERATION_FLOAT_MAX", 12), ("CU_ATOMIC_OPERATION_MAX", 13),
])
CUatomicOperationCapability = IntEnum("CUatomicOperationCapability", [  # type: ignore[misc]  # bits of one answer
    ("CU_ATOMIC_CAPABILITY_SIGNED", 1), ("CU_ATOMIC_CAPABILITY_UNSIGNED", 2), ("CU_ATOMIC_CAPABILITY_REDUCTION", 4),
    ("CU_ATOMIC_CAPABILITY_SCALAR_32", 8), ("CU_ATOMIC_CAPABILITY_SCALAR_64", 16),
    ("CU_ATOMIC_CAPABILITY_SCALAR_128", 32), ("CU_ATOMIC_CAPABILITY_VECTOR_32x4", 64),
])
CUstreamAttrID = IntEnum("CUstreamAttrID", [  # type: ignore[misc]  # the wheel's: CUlaunchAttributeID's members
    ("CU_LAUNCH_ATTRIBUTE_IGNORE", 0), ("CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW", 1),
    ("CU_LAUNCH_ATTRIBUTE_COOPERATIVE", 2), ("CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY", 3),
    ("CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION", 4), ("CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE", 5),
    ("CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION", 6), ("CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT", 7),
    ("CU_LAUNCH_ATTRIBUTE_PRIORITY", 8), ("CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP", 9),
    ("CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN", 10), ("CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION", 11),
    ("CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT", 12), ("CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE", 13),
    ("CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT", 14),
    ("CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING", 16), ("CU_LAUNCH_ATTRIBUTE_PORTABLE_CLUSTER_SIZE_MODE", 17),
    ("CU_LAUNCH_ATTRIBUTE_SHARED_MEMORY_MODE", 18),
])
CU_GRAPH_COND_ASSIGN_DEFAULT = 1  # cuGraphConditionalHandleCreate's flag: the default value applied at each launch
CUkernelNodeAttrID = IntEnum("CUkernelNodeAttrID", [  # type: ignore[misc]  # the wheel's: CUlaunchAttributeID's members
    ("CU_LAUNCH_ATTRIBUTE_IGNORE", 0), ("CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW", 1),
    ("CU_LAUNCH_ATTRIBUTE_COOPERATIVE", 2), ("CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY", 3),
    ("CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION", 4), ("CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE", 5),
    ("CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION", 6), ("CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT", 7),
    ("CU_LAUNCH_ATTRIBUTE_PRIORITY", 8), ("CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP", 9),
    ("CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN", 10), ("CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION", 11),
    ("CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT", 12), ("CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE", 13),
    ("CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT", 14),
    ("CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING", 16), ("CU_LAUNCH_ATTRIBUTE_PORTABLE_CLUSTER_SIZE_MODE", 17),
    ("CU_LAUNCH_ATTRIBUTE_SHARED_MEMORY_MODE", 18),
])
# The attributes cuda.h (13.0) marks "valid for graph nodes": the others a kernel node refuses (INVALID_VALUE)
KERNEL_NODE_ATTRIBUTES = frozenset({1, 2, 4, 5, 8, 9, 10, 11, 13, 16})
CUgraphMem_attribute = IntEnum("CUgraphMem_attribute", [  # type: ignore[misc]
    ("CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT", 0), ("CU_GRAPH_MEM_ATTR_USED_MEM_HIGH", 1),
    ("CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT", 2), ("CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH", 3),
])
CUgraphInstantiateResult = IntEnum("CUgraphInstantiateResult", [  # type: ignore[misc]
    ("CUDA_GRAPH_INSTANTIATE_SUCCESS", 0), ("CUDA_GRAPH_INSTANTIATE_ERROR", 1),
    ("CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE", 2), ("CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED", 3),
    ("CUDA_GRAPH_INSTANTIATE_MULTIPLE_CTXS_NOT_SUPPORTED", 4), ("CUDA_GRAPH_INSTANTIATE_CONDITIONAL_HANDLE_UNUSED", 5),
])
CUpointer_attribute = IntEnum("CUpointer_attribute", [  # type: ignore[misc]
    ("CU_POINTER_ATTRIBUTE_CONTEXT", 1), ("CU_POINTER_ATTRIBUTE_MEMORY_TYPE", 2),
    ("CU_POINTER_ATTRIBUTE_DEVICE_POINTER", 3), ("CU_POINTER_ATTRIBUTE_HOST_POINTER", 4),
    ("CU_POINTER_ATTRIBUTE_P2P_TOKENS", 5), ("CU_POINTER_ATTRIBUTE_SYNC_MEMOPS", 6),
    ("CU_POINTER_ATTRIBUTE_BUFFER_ID", 7), ("CU_POINTER_ATTRIBUTE_IS_MANAGED", 8),
    ("CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL", 9), ("CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE", 10),
    ("CU_POINTER_ATTRIBUTE_RANGE_START_ADDR", 11), ("CU_POINTER_ATTRIBUTE_RANGE_SIZE", 12),
    ("CU_POINTER_ATTRIBUTE_MAPPED", 13), ("CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES", 14),
    ("CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE", 15), ("CU_POINTER_ATTRIBUTE_ACCESS_FLAGS", 16),
    ("CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE", 17), ("CU_POINTER_ATTRIBUTE_MAPPING_SIZE", 18),
    ("CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR", 19), ("CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID", 20),
    ("CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE", 21), ("CU_POINTER_ATTRIBUTE_LOCALITY_DOMAIN_ORDINAL", 22),
])
CUjit_option = IntEnum("CUjit_option", [  # type: ignore[misc]
    ("CU_JIT_MAX_REGISTERS", 0), ("CU_JIT_THREADS_PER_BLOCK", 1), ("CU_JIT_WALL_TIME", 2),
    ("CU_JIT_INFO_LOG_BUFFER", 3), ("CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES", 4), ("CU_JIT_ERROR_LOG_BUFFER", 5),
    ("CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES", 6), ("CU_JIT_OPTIMIZATION_LEVEL", 7), ("CU_JIT_TARGET_FROM_CUCONTEXT", 8),
    ("CU_JIT_TARGET", 9), ("CU_JIT_FALLBACK_STRATEGY", 10), ("CU_JIT_GENERATE_DEBUG_INFO", 11),
    ("CU_JIT_LOG_VERBOSE", 12), ("CU_JIT_GENERATE_LINE_INFO", 13), ("CU_JIT_CACHE_MODE", 14),
    ("CU_JIT_POSITION_INDEPENDENT_CODE", 30), ("CU_JIT_MIN_CTA_PER_SM", 31), ("CU_JIT_MAX_THREADS_PER_BLOCK", 32),
    ("CU_JIT_OVERRIDE_DIRECTIVE_VALUES", 33), ("CU_JIT_SPLIT_COMPILE", 34), ("CU_JIT_BINARY_LOADER_THREAD_COUNT", 35),
])
CUjit_target = IntEnum("CUjit_target", [  # type: ignore[misc]
    ("CU_TARGET_COMPUTE_75", 75), ("CU_TARGET_COMPUTE_80", 80), ("CU_TARGET_COMPUTE_86", 86),
    ("CU_TARGET_COMPUTE_89", 89), ("CU_TARGET_COMPUTE_90", 90), ("CU_TARGET_COMPUTE_100", 100),
])
CUjit_fallback = IntEnum("CUjit_fallback", [  # type: ignore[misc]
    ("CU_PREFER_PTX", 0), ("CU_PREFER_BINARY", 1),
])
CUjit_cacheMode = IntEnum("CUjit_cacheMode", [  # type: ignore[misc]
    ("CU_JIT_CACHE_OPTION_NONE", 0), ("CU_JIT_CACHE_OPTION_CG", 1), ("CU_JIT_CACHE_OPTION_CA", 2),
])
CUjitInputType = IntEnum("CUjitInputType", [  # type: ignore[misc]
    ("CU_JIT_INPUT_CUBIN", 0), ("CU_JIT_INPUT_PTX", 1), ("CU_JIT_INPUT_FATBINARY", 2), ("CU_JIT_INPUT_OBJECT", 3),
    ("CU_JIT_INPUT_LIBRARY", 4), ("CU_JIT_INPUT_NVVM", 5),
])
FAKE_CUBIN_MAGIC = b"ORION-FAKE-LINKED\0"  # the head of every cubin the fake linker makes (fake_cubin)


def fake_cubin(inputs: list[tuple[int, bytes, bytes]]) -> bytes:
    """The cubin FakeDriver.cuLinkComplete makes of (input type, name, data) inputs, in the order added: the magic,
    then each input as `<iII` (type, name length, data length), its name and its data. Not an ELF: no module loads
    it (cuModuleLoadData answers CUDA_ERROR_INVALID_IMAGE), tests only predict its bytes."""
    return FAKE_CUBIN_MAGIC + b"".join(struct.pack("<iII", kind, len(name), len(data)) + name + data
                                       for kind, name, data in inputs)


CUlimit = IntEnum("CUlimit", [  # type: ignore[misc]
    ("CU_LIMIT_STACK_SIZE", 0), ("CU_LIMIT_PRINTF_FIFO_SIZE", 1), ("CU_LIMIT_MALLOC_HEAP_SIZE", 2),
    ("CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH", 3), ("CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT", 4),
    ("CU_LIMIT_MAX_L2_FETCH_GRANULARITY", 5), ("CU_LIMIT_PERSISTING_L2_CACHE_SIZE", 6), ("CU_LIMIT_SHMEM_SIZE", 7),
    ("CU_LIMIT_CIG_ENABLED", 8), ("CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED", 9), ("CU_LIMIT_PER_BLOCK_MEMORY_SIZE", 10),
])
CUtensorMapDataType = IntEnum("CUtensorMapDataType", [  # type: ignore[misc]
    ("CU_TENSOR_MAP_DATA_TYPE_UINT8", 0), ("CU_TENSOR_MAP_DATA_TYPE_UINT16", 1), ("CU_TENSOR_MAP_DATA_TYPE_UINT32", 2),
    ("CU_TENSOR_MAP_DATA_TYPE_INT32", 3), ("CU_TENSOR_MAP_DATA_TYPE_UINT64", 4), ("CU_TENSOR_MAP_DATA_TYPE_INT64", 5),
    ("CU_TENSOR_MAP_DATA_TYPE_FLOAT16", 6), ("CU_TENSOR_MAP_DATA_TYPE_FLOAT32", 7),
    ("CU_TENSOR_MAP_DATA_TYPE_FLOAT64", 8), ("CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", 9),
    ("CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ", 10), ("CU_TENSOR_MAP_DATA_TYPE_TFLOAT32", 11),
    ("CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ", 12), ("CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B", 13),
    ("CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B", 14), ("CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B", 15),
])
CUtensorMapInterleave = IntEnum("CUtensorMapInterleave", [  # type: ignore[misc]
    ("CU_TENSOR_MAP_INTERLEAVE_NONE", 0), ("CU_TENSOR_MAP_INTERLEAVE_16B", 1), ("CU_TENSOR_MAP_INTERLEAVE_32B", 2),
])
CUtensorMapSwizzle = IntEnum("CUtensorMapSwizzle", [  # type: ignore[misc]
    ("CU_TENSOR_MAP_SWIZZLE_NONE", 0), ("CU_TENSOR_MAP_SWIZZLE_32B", 1), ("CU_TENSOR_MAP_SWIZZLE_64B", 2),
    ("CU_TENSOR_MAP_SWIZZLE_128B", 3),
])
CUtensorMapL2promotion = IntEnum("CUtensorMapL2promotion", [  # type: ignore[misc]
    ("CU_TENSOR_MAP_L2_PROMOTION_NONE", 0), ("CU_TENSOR_MAP_L2_PROMOTION_L2_64B", 1),
    ("CU_TENSOR_MAP_L2_PROMOTION_L2_128B", 2), ("CU_TENSOR_MAP_L2_PROMOTION_L2_256B", 3),
])
CUtensorMapFloatOOBfill = IntEnum("CUtensorMapFloatOOBfill", [  # type: ignore[misc]
    ("CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE", 0), ("CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA", 1),
])
CUtensorMapIm2ColWideMode = IntEnum("CUtensorMapIm2ColWideMode", [  # type: ignore[misc]
    ("CU_TENSOR_MAP_IM2COL_WIDE_MODE_W", 0), ("CU_TENSOR_MAP_IM2COL_WIDE_MODE_W128", 1),
])
CUtensorMapAllocClass = IntEnum("CUtensorMapAllocClass", [  # type: ignore[misc]
    ("CU_TENSOR_MAP_ALLOC_CLASS_AUTO", 0), ("CU_TENSOR_MAP_ALLOC_CLASS_SMALL", 1),
    ("CU_TENSOR_MAP_ALLOC_CLASS_LARGE", 2),
])
# Virtual memory management (cuMemCreate and friends).
CUmemAllocationType = IntEnum("CUmemAllocationType", [  # type: ignore[misc]
    ("CU_MEM_ALLOCATION_TYPE_INVALID", 0), ("CU_MEM_ALLOCATION_TYPE_PINNED", 1), ("CU_MEM_ALLOCATION_TYPE_MANAGED", 2),
])
CUmemLocationType = IntEnum("CUmemLocationType", [  # type: ignore[misc]
    ("CU_MEM_LOCATION_TYPE_INVALID", 0), ("CU_MEM_LOCATION_TYPE_DEVICE", 1), ("CU_MEM_LOCATION_TYPE_HOST", 2),
    ("CU_MEM_LOCATION_TYPE_HOST_NUMA", 3), ("CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT", 4),
])
CUmemAllocationHandleType = IntEnum("CUmemAllocationHandleType", [  # type: ignore[misc]
    ("CU_MEM_HANDLE_TYPE_NONE", 0), ("CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR", 1), ("CU_MEM_HANDLE_TYPE_WIN32", 2),
    ("CU_MEM_HANDLE_TYPE_WIN32_KMT", 4), ("CU_MEM_HANDLE_TYPE_FABRIC", 8),
])
CUmemAccess_flags = IntEnum("CUmemAccess_flags", [  # type: ignore[misc]
    ("CU_MEM_ACCESS_FLAGS_PROT_NONE", 0), ("CU_MEM_ACCESS_FLAGS_PROT_READ", 1),
    ("CU_MEM_ACCESS_FLAGS_PROT_READWRITE", 3),
])
CUmemAllocationGranularity_flags = IntEnum("CUmemAllocationGranularity_flags", [  # type: ignore[misc]
    ("CU_MEM_ALLOC_GRANULARITY_MINIMUM", 0), ("CU_MEM_ALLOC_GRANULARITY_RECOMMENDED", 1),
])
CUdevice_P2PAttribute = IntEnum("CUdevice_P2PAttribute", [  # type: ignore[misc]
    ("CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK", 1), ("CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED", 2),
    ("CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED", 3), ("CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED", 4),
])
VMM_GRANULARITY = 2 * 1024 * 1024  # minimum and recommended, as an H100 answers for device memory
PITCH_ALIGNMENT = 512  # the pitch cuMemAllocPitch gives rows (the fake's choice; a GPU's may differ)
ENUM_CLASSES: tuple[type[IntEnum], ...] = (CUresult, CUdevice_attribute, CUdevice_P2PAttribute, CUmemPool_attribute,
                                           CUfunction_attribute,
                                           CUfunc_cache, CUstreamCaptureStatus, CUpointer_attribute, CUjit_option,
                                           CUjit_target, CUjit_fallback, CUjit_cacheMode, CUlimit,
                                           CUtensorMapDataType, CUtensorMapInterleave, CUtensorMapSwizzle,
                                           CUtensorMapL2promotion, CUtensorMapFloatOOBfill, CUmemAllocationType,
                                           CUmemLocationType, CUmemAllocationHandleType, CUmemAccess_flags,
                                           CUmemAllocationGranularity_flags, CUstreamCaptureMode, CUgraphNodeType,
                                           CUgraphDependencyType, CUgraphInstantiate_flags, CUevent_record_flags,
                                           CUevent_wait_flags, CUmemorytype, CUgraphExecUpdateResult,
                                           CUgraphConditionalNodeType, CUgraphChildGraphNodeOwnership,
                                           CUkernelNodeAttrID, CUgraphMem_attribute, CUgraphInstantiateResult,
                                           CUstreamAttrID, CUstreamBatchMemOpType, CUstreamWaitValue_flags,
                                           CUstreamWriteValue_flags, CUstreamMemoryBarrier_flags, CUatomicOperation,
                                           CUatomicOperationCapability)
ADD_KERNEL = b"orion_fake_add_u32"  # the one kernel the fake runs (FakeDriver._add_kernel)
HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # CUhostFn's C type: how the fake calls a host function
# cuCtxGetLimit's answers in a new context, as an H100 gives them (SHMEM_SIZE and PER_BLOCK_MEMORY_SIZE are not
# modelled: CUDA_ERROR_UNSUPPORTED_LIMIT); cuCtxSetLimit's ceilings where the driver has one.
LIMIT_DEFAULTS = {0: 1024, 1: 1 * 1024 * 1024, 2: 8 * 1024 * 1024, 3: 2, 4: 2048, 5: 64, 6: 0, 8: 0, 9: 0}
LIMIT_CEILINGS = {3: 24, 5: 128, 6: 78643200, 8: 0, 9: 1}  # sync depth, fetch granularity, persisting L2, CIG
# Element sizes in bytes of the tensor-map data types (the packed 4- and 6-bit ones: 0, not whole bytes).
TENSOR_ELEMENT_BYTES = {0: 1, 1: 2, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 4, 11: 4, 12: 4,
                        13: 0, 14: 0, 15: 0}
CU_STREAM_WAIT_VALUE_FLUSH = 1 << 30
WAIT_HOST_POLL_S = 10.0  # how long a synchronize polls host memory for a write the wait needs (another process's)
# How the wheel takes each JIT option's value (utils.pxi _HelperCUjit_option): an int, or a member of an enum.
JIT_VALUE_ENUMS: dict[int, type[IntEnum]] = {9: CUjit_target, 10: CUjit_fallback, 14: CUjit_cacheMode}
CU_MEMORYTYPE_DEVICE = 2
CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE = 3

CU_LAUNCH_PARAM_END, CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2
CU_STREAM_NON_BLOCKING = 1
CU_EVENT_DISABLE_TIMING = 2
CU_EVENT_RECORD_EXTERNAL = CU_EVENT_WAIT_EXTERNAL = 1
STREAM_ID_BASE = 0x100  # cuStreamGetId: the legacy stream's id; created streams count on from it
DRIVER_VERSION = 13000
API_VERSION = 3020
MIB = 1 << 20
GUARD = 2 * MIB  # unmapped bytes after every allocation
CONTEXT_BYTES = 512 * MIB  # what a context costs its process on the GPU (about an H100's, as NVML reports it)
ALLOCATION_BASE = 0x7F10_0000_0000


# --- handle and value types -----------------------------------------------------------------------------------------

class _Handle:
    """An opaque handle: only int() gives its value, as with the wheel's handle classes."""

    __slots__ = ("_value",)

    def __init__(self, value: Any = 0) -> None:
        self._value = 0 if value is None else int(value)

    def __int__(self) -> int:
        return self._value

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and int(other) == self._value  # type: ignore[call-overload]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._value))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._value:#x}>"


class CUdevice(_Handle):
    def __repr__(self) -> str:
        return f"<CUdevice {self._value}>"


class CUdeviceptr(_Handle):
    pass


class CUcontext(_Handle):
    pass


class CUstream(_Handle):
    pass


class CUevent(_Handle):
    pass


class CUmodule(_Handle):
    pass


class CUfunction(_Handle):
    pass


class CUlibrary(_Handle):
    pass


class CUkernel(_Handle):
    pass


class CUmemoryPool(_Handle):
    pass


class CUmemGenericAllocationHandle(_Handle):
    pass


class CUgraph(_Handle):
    pass


class CUgraphExec(_Handle):
    pass


class CUgraphNode(_Handle):
    pass


class CUlinkState(_Handle):
    pass


class CUgraphConditionalHandle(_Handle):
    """The wheel's CUgraphConditionalHandle (a cuuint64_t in cuda.h, not a pointer)."""


class CUgraphEdgeData:
    """The wheel's CUgraphEdgeData: an edge's ports and dependency type (all 0 for a captured stream's edges)."""

    def __init__(self) -> None:
        self.from_port, self.to_port = 0, 0
        self.type: Any = CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_DEFAULT

    def __repr__(self) -> str:
        return f"CUgraphEdgeData(from_port={self.from_port}, to_port={self.to_port}, type={int(self.type)})"


class _Fields:
    """A wheel struct stand-in: plain attributes, shown by name (in the journal too)."""

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={plain(v)}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class CUDA_KERNEL_NODE_PARAMS(_Fields):  # noqa: N801 - the wheel's name
    """The wheel's CUDA_KERNEL_NODE_PARAMS (cuda.h's _v2: with `kern` and `ctx`); `kernelParams` and `extra` as the
    addresses of C arrays (a void ** and a CU_LAUNCH_PARAM_* list), the only form the fake reads, 0 for none."""

    def __init__(self) -> None:
        self.func: Any = 0
        self.gridDimX = self.gridDimY = self.gridDimZ = 0
        self.blockDimX = self.blockDimY = self.blockDimZ = 0
        self.sharedMemBytes = 0
        self.kernelParams: Any = 0
        self.extra: Any = 0
        self.kern: Any = 0
        self.ctx: Any = 0


class CUDA_MEMSET_NODE_PARAMS(_Fields):  # noqa: N801 - the wheel's name
    def __init__(self) -> None:
        self.dst: Any = 0
        self.pitch = self.value = self.elementSize = self.width = self.height = 0


class CUDA_MEMCPY3D(_Fields):  # noqa: N801 - the wheel's name
    """The wheel's CUDA_MEMCPY3D: host sides are addresses (ints), read and written through ctypes."""

    def __init__(self) -> None:
        for side in ("src", "dst"):
            for name in ("XInBytes", "Y", "Z", "LOD", "Host", "Device", "Array", "Pitch", "Height"):
                setattr(self, side + name, 0)
            setattr(self, side + "MemoryType", 0)
        self.WidthInBytes = self.Height = self.Depth = 0


class CUDA_MEMCPY2D(_Fields):  # noqa: N801 - the wheel's name
    """The wheel's CUDA_MEMCPY2D: a CUDA_MEMCPY3D without its third dimension."""

    def __init__(self) -> None:
        for side in ("src", "dst"):
            for name in ("XInBytes", "Y", "Host", "Device", "Array", "Pitch"):
                setattr(self, side + name, 0)
            setattr(self, side + "MemoryType", 0)
        self.WidthInBytes = self.Height = 0


class CUDA_MEMCPY3D_PEER(CUDA_MEMCPY3D):  # noqa: N801 - the wheel's name
    """The wheel's CUDA_MEMCPY3D_PEER: a CUDA_MEMCPY3D and each side's context."""

    def __init__(self) -> None:
        super().__init__()
        self.srcContext: Any = 0
        self.dstContext: Any = 0


class CUDA_MEMCPY_NODE_PARAMS(_Fields):  # noqa: N801 - the wheel's name
    def __init__(self) -> None:
        self.flags = 0
        self.copyCtx: Any = 0
        self.copyParams = CUDA_MEMCPY3D()


class CUDA_MEMSET_NODE_PARAMS_v2(CUDA_MEMSET_NODE_PARAMS):  # noqa: N801 - the wheel's name
    def __init__(self) -> None:
        super().__init__()
        self.ctx: Any = 0


class CUDA_CHILD_GRAPH_NODE_PARAMS(_Fields):  # noqa: N801 - the wheel's name
    def __init__(self) -> None:
        self.graph: Any = 0
        self.ownership: Any = CUgraphChildGraphNodeOwnership.CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE


class CUDA_EVENT_NODE_PARAMS(_Fields):  # noqa: N801 - the wheel's CUDA_EVENT_RECORD/WAIT_NODE_PARAMS (`event`)
    def __init__(self) -> None:
        self.event: Any = 0


class CUhostFn(_Handle):
    """The wheel's CUhostFn: the address of a C function `void fn(void *userData)` (only int() gives it)."""


class CUDA_HOST_NODE_PARAMS(_Fields):  # noqa: N801 - the wheel's name
    """A host node's function (a CUhostFn, or an int address as the wheel also takes) and `userData` (an int address,
    0 for NULL), as the wheel's getters answer them."""

    def __init__(self) -> None:
        self.fn: Any = CUhostFn(0)
        self.userData: Any = 0


class CUDA_CONDITIONAL_NODE_PARAMS(_Fields):  # noqa: N801 - the wheel's name
    """`phGraph_out`: the body graphs (a list of CUgraph) once cuGraphAddNode made them, as the wheel reads them."""

    def __init__(self) -> None:
        self.handle: Any = 0
        self.type: Any = CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_IF
        self.size = 0
        self.phGraph_out: Any = None
        self.ctx: Any = 0


class CUgraphNodeParams(_Fields):
    """The wheel's CUgraphNodeParams: the node's type and a member per type (those the fake models; the reserved
    fields cuda.h requires zero are not the wheel's attributes either)."""

    def __init__(self) -> None:
        self.type: Any = CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
        self.kernel = CUDA_KERNEL_NODE_PARAMS()
        self.memcpy = CUDA_MEMCPY_NODE_PARAMS()
        self.memset = CUDA_MEMSET_NODE_PARAMS_v2()
        self.graph = CUDA_CHILD_GRAPH_NODE_PARAMS()
        self.eventRecord = CUDA_EVENT_NODE_PARAMS()
        self.eventWait = CUDA_EVENT_NODE_PARAMS()
        self.conditional = CUDA_CONDITIONAL_NODE_PARAMS()
        self.alloc = CUDA_MEM_ALLOC_NODE_PARAMS()
        self.free = CUDA_MEM_FREE_NODE_PARAMS()
        self.host = CUDA_HOST_NODE_PARAMS()
        self.batchMemOp = CUDA_BATCH_MEM_OP_NODE_PARAMS()  # noqa: N815 - the wheel's name


class CUgraphExecUpdateResultInfo(_Fields):
    def __init__(self) -> None:
        self.result: Any = CUgraphExecUpdateResult.CU_GRAPH_EXEC_UPDATE_SUCCESS
        self.errorNode: Any = CUgraphNode(0)
        self.errorFromNode: Any = CUgraphNode(0)


class CUDA_GRAPH_INSTANTIATE_PARAMS(_Fields):  # noqa: N801 - the wheel's name
    """Its inputs (flags, upload stream) and the outputs the driver writes into it, failed or not."""

    def __init__(self) -> None:
        self.flags: Any = cuuint64_t(0)
        self.hUploadStream: Any = CUstream(0)
        self.hErrNode_out: Any = CUgraphNode(0)
        self.result_out: Any = CUgraphInstantiateResult.CUDA_GRAPH_INSTANTIATE_SUCCESS


class CUDA_MEM_ALLOC_NODE_PARAMS(_Fields):  # noqa: N801 - the wheel's name (and _v2's, CUgraphNodeParams.alloc)
    """A memory allocation node's pool properties, access descriptors (a list), size and, once made, address."""

    def __init__(self) -> None:
        self.poolProps = CUmemPoolProps()
        self.accessDescs: Any = []
        self.accessDescCount = 0
        self.bytesize = 0
        self.dptr: Any = CUdeviceptr(0)


class CUDA_MEM_FREE_NODE_PARAMS(_Fields):  # noqa: N801 - the wheel's name
    def __init__(self) -> None:
        self.dptr: Any = CUdeviceptr(0)


class CUkernelNodeAttrValue:
    """The wheel's CUkernelNodeAttrValue: CUlaunchAttributeValue's 64 bytes at getPtr() (its own, or a C union at
    `_ptr`)."""

    def __init__(self, _ptr: int = 0) -> None:
        self._buffer = None if _ptr else ctypes.create_string_buffer(64)
        self._ptr = int(_ptr) or ctypes.addressof(self._buffer)  # type: ignore[arg-type]

    def getPtr(self) -> int:  # noqa: N802 - the wheel's name
        return self._ptr

    def __repr__(self) -> str:  # the journal's picture: its bytes
        return f"<CUkernelNodeAttrValue {ctypes.string_at(self._ptr, 64).hex()}>"


class CUmemLocation:
    """The wheel's CUmemLocation: a location type and id (a device ordinal for a device)."""

    def __init__(self) -> None:
        self.type: Any = CUmemLocationType.CU_MEM_LOCATION_TYPE_INVALID
        self.id = 0

    def __repr__(self) -> str:
        return f"CUmemLocation(type={int(self.type)}, id={self.id})"


class _MemAllocFlags:
    """CUmemAllocationProp.allocFlags (an anonymous struct in the wheel)."""

    def __init__(self) -> None:
        self.compressionType, self.gpuDirectRDMACapable, self.usage = 0, 0, 0


class CUmemAllocationProp:
    """The wheel's CUmemAllocationProp: nested `location` and `allocFlags` set field by field."""

    def __init__(self) -> None:
        self.type: Any = CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_INVALID
        self.requestedHandleTypes: Any = CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE
        self.location = CUmemLocation()
        self.win32HandleMetaData = 0
        self.allocFlags = _MemAllocFlags()

    def __repr__(self) -> str:
        return (f"CUmemAllocationProp(type={int(self.type)}, requestedHandleTypes={int(self.requestedHandleTypes)}, "
                f"location={self.location!r})")


class CUmemAccessDesc:
    """The wheel's CUmemAccessDesc: a location and its access flags."""

    def __init__(self) -> None:
        self.location = CUmemLocation()
        self.flags: Any = CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE

    def __repr__(self) -> str:
        return f"CUmemAccessDesc(location={self.location!r}, flags={int(self.flags)})"


class CUmemPoolProps:
    """The wheel's CUmemPoolProps: the pool's allocation type, handle types, location and limits."""

    def __init__(self) -> None:
        self.allocType: Any = CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_INVALID
        self.handleTypes: Any = CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE
        self.location = CUmemLocation()
        self.win32SecurityAttributes = 0
        self.maxSize, self.usage, self.gpuDirectRDMACapable = 0, 0, 0

    def __repr__(self) -> str:
        return (f"CUmemPoolProps(allocType={int(self.allocType)}, handleTypes={int(self.handleTypes)}, "
                f"location={self.location!r}, maxSize={self.maxSize})")


class cuuint64_t:  # noqa: N801 - the wheel's name
    __slots__ = ("_value",)

    def __init__(self, value: int = 0) -> None:
        if not 0 <= int(value) < 1 << 64:
            raise OverflowError(f"{value} does not fit a cuuint64_t")
        self._value = int(value)

    def __int__(self) -> int:
        return self._value

    def __repr__(self) -> str:
        return f"<cuuint64_t {self._value}>"


class cuuint32_t:  # noqa: N801 - the wheel's name
    __slots__ = ("_value",)

    def __init__(self, value: int = 0) -> None:
        if not 0 <= int(value) < 1 << 32:
            raise OverflowError(f"{value} does not fit a cuuint32_t")
        self._value = int(value)

    def __int__(self) -> int:
        return self._value


BATCH_OP_SIZE = 48  # sizeof(CUstreamBatchMemOpParams): cuda.h's union, padded to six cuuint64_t
MAX_BATCH_OPS = 255  # cuStreamBatchMemOp's count "must be less than 256" (cuda.h 13.0's comment of the parameter)


def _c_field(offset: int, fmt: str, wrap: Callable[[int], Any] = int) -> Any:
    """A field of a C struct at `offset` (a struct format: "<i" an enum, "<I" unsigned int, "<Q" a 64-bit value or
    pointer), read as `wrap(the number)` and set from anything int() takes (None for a pointer or handle), as the
    wheel's setters take them (a value that does not fit: OverflowError)."""
    def get(self: _CStruct) -> Any:
        return wrap(struct.unpack_from(fmt, self._bytes(), offset)[0])

    bits = 8 * struct.calcsize(fmt)
    low, high = (-(1 << (bits - 1)), 1 << (bits - 1)) if fmt[-1].islower() else (0, 1 << bits)

    handle = wrap in (CUdeviceptr, CUcontext)  # a pointer or handle: None is NULL, as the wheel takes it

    def put(self: _CStruct, value: Any) -> None:
        number = 0 if value is None and handle else int(value)
        if not low <= number < high:  # checked first: struct.pack_into zeroes the field before it refuses
            raise OverflowError(f"can't convert {number} to the field's C type ({fmt})")
        struct.pack_into(fmt, self._bytes(), offset, number)
    return property(get, put)


def _c_member(cls: type[_CStruct], offset: int = 0) -> Any:
    """A struct member of a C struct or union: read, a view of the same bytes (as the wheel's members are); set, a
    copy of the given struct's bytes (only `cls`: TypeError)."""
    def get(self: _CStruct) -> Any:
        return cls(_ptr=self.getPtr() + offset, _owner=self)

    def put(self: _CStruct, value: Any) -> None:
        if not isinstance(value, cls):
            raise TypeError(f"expected {cls.__name__}, got {type(value).__name__}")
        ctypes.memmove(self.getPtr() + offset, value.getPtr(), cls.SIZE)
    return property(get, put)


class _CStruct:
    """A wheel struct over C memory, as the wheel's are: its own bytes (zeroed), or those at `_ptr` (another
    object's, which `_owner` keeps alive, or memory the caller holds); getPtr() gives their address."""

    SIZE = 0

    def __init__(self, _ptr: int = 0, _owner: Any = None) -> None:
        self._buffer = None if _ptr else ctypes.create_string_buffer(max(self.SIZE, 1))
        self._ptr = int(_ptr) or ctypes.addressof(self._buffer)  # type: ignore[arg-type]
        self._owner = _owner

    def getPtr(self) -> int:  # noqa: N802 - the wheel's name
        return self._ptr

    def _bytes(self) -> Any:
        return (ctypes.c_char * self.SIZE).from_address(self._ptr)


class CUstreamMemOpWaitValueParams_st(_CStruct):  # noqa: N801 - the wheel's name
    """cuda.h's waitValue member: operation, address, value (the low 32 bits of value64: a union), flags, alias."""

    SIZE = 40
    operation = _c_field(0, "<i", lambda v: CUstreamBatchMemOpType(v))  # ValueError for an unknown one, as the wheel
    address = _c_field(8, "<Q", CUdeviceptr)
    value = _c_field(16, "<I", lambda v: cuuint32_t(v))
    value64 = _c_field(16, "<Q", lambda v: cuuint64_t(v))
    flags = _c_field(24, "<I")
    alias = _c_field(32, "<Q", CUdeviceptr)


class CUstreamMemOpWriteValueParams_st(CUstreamMemOpWaitValueParams_st):  # noqa: N801 - the wheel's name
    """cuda.h's writeValue member: the same layout as waitValue's."""


class CUstreamMemOpFlushRemoteWritesParams_st(_CStruct):  # noqa: N801 - the wheel's name
    SIZE = 8
    operation = _c_field(0, "<i", lambda v: CUstreamBatchMemOpType(v))
    flags = _c_field(4, "<I")


class CUstreamMemOpMemoryBarrierParams_st(CUstreamMemOpFlushRemoteWritesParams_st):  # noqa: N801 - the wheel's name
    pass


class CUstreamBatchMemOpParams(_CStruct):
    """The wheel's CUstreamBatchMemOpParams: cuda.h's 48-byte union at getPtr() (its own, or the one at `_ptr`).
    `operation` is the tag every member starts with; `waitValue`, `writeValue`, `flushRemoteWrites` and
    `memoryBarrier` are views of the same bytes (set one from a struct of its type: its bytes are copied), so writing
    one member's field changes the others', as in C. Setting `operation` takes any int, as the wheel does; reading an
    operation CUstreamBatchMemOpType lacks raises ValueError (a fresh one's 0 too), as the wheel's getter does. Not
    modelled: the `atomicReduction` member and `pad`."""

    SIZE = BATCH_OP_SIZE
    operation = _c_field(0, "<i", lambda v: CUstreamBatchMemOpType(v))
    waitValue = _c_member(CUstreamMemOpWaitValueParams_st)
    writeValue = _c_member(CUstreamMemOpWriteValueParams_st)
    flushRemoteWrites = _c_member(CUstreamMemOpFlushRemoteWritesParams_st)
    memoryBarrier = _c_member(CUstreamMemOpMemoryBarrierParams_st)

    def __repr__(self) -> str:
        return f"CUstreamBatchMemOpParams({_batch_op(ctypes.string_at(self._ptr, BATCH_OP_SIZE)).plain()})"


class CUDA_BATCH_MEM_OP_NODE_PARAMS(_CStruct):  # noqa: N801 - the wheel's name
    """The wheel's CUDA_BATCH_MEM_OP_NODE_PARAMS: cuda.h's struct at getPtr() (ctx at 0, count at 8, the paramArray
    pointer at 16, flags at 24). As the wheel's: setting `paramArray` (a list or tuple of CUstreamBatchMemOpParams:
    TypeError for anything else, None included) copies the operations into an array the object owns and points the
    struct at it, but does not set `count`; reading it lists copies of the operations set that way, and none where
    the struct was filled in C (as cuGraphBatchMemOpNodeGetParams fills it: the wheel's getter lists only what was
    set from Python, so there `paramArray` reads []; the operations are the `count` structs of BATCH_OP_SIZE bytes
    at the pointer at getPtr() + 16, each readable as CUstreamBatchMemOpParams(_ptr=address))."""

    SIZE = 32
    ctx = _c_field(0, "<Q", CUcontext)
    count = _c_field(8, "<I")
    flags = _c_field(24, "<I")

    def __init__(self, _ptr: int = 0, _owner: Any = None) -> None:
        super().__init__(_ptr, _owner)
        self._array: Any = None  # the operations set from Python (an array this object owns)
        self._length = 0

    @property
    def _array_address(self) -> int:
        """The paramArray pointer in the C struct (not a wheel attribute: the fake's own reading of getPtr() + 16)."""
        value: int = struct.unpack_from("<Q", self._bytes(), 16)[0]
        return value

    @property
    def paramArray(self) -> list[CUstreamBatchMemOpParams]:  # noqa: N802 - the wheel's name
        address = self._array_address
        return [_batch_op_copy(address + BATCH_OP_SIZE * i) for i in range(self._length)] if address else []

    @paramArray.setter
    def paramArray(self, value: Any) -> None:  # noqa: N802 - the wheel's name
        length = len(value)  # TypeError for None and non-sequences, as the wheel's
        if not all(isinstance(v, CUstreamBatchMemOpParams) for v in value):
            raise TypeError("paramArray takes CUstreamBatchMemOpParams only")  # the wheel reads anything as one
        self._array = ctypes.create_string_buffer(
            b"".join(ctypes.string_at(v.getPtr(), BATCH_OP_SIZE) for v in value), max(BATCH_OP_SIZE * length, 1))
        self._length = length
        struct.pack_into("<Q", self._bytes(), 16, ctypes.addressof(self._array) if length else 0)

    def __repr__(self) -> str:
        return f"CUDA_BATCH_MEM_OP_NODE_PARAMS({json.dumps(plain(self))})"


@dataclass(frozen=True)
class _BatchOp:
    """One CUstreamBatchMemOpParams as the driver reads it: its operation, its member's address, value (32 or 64
    bits as the operation says) and flags, and its 48 bytes as given."""
    operation: int
    address: int
    value: int
    flags: int
    raw: bytes

    def plain(self) -> dict[str, int]:
        return {"operation": self.operation, "address": self.address, "value": self.value, "flags": self.flags}


def _batch_op(raw: bytes) -> _BatchOp:
    """The operation whose C struct is `raw`: a wait or write (32 bits: 1, 2; 64: 4, 5) by its value member; a
    flush (3) or barrier (6) by its flags (address and value 0); any other read as a 64-bit value operation."""
    operation = struct.unpack_from("<i", raw)[0]
    if operation in (3, 6):
        return _BatchOp(operation, 0, 0, struct.unpack_from("<I", raw, 4)[0], raw)
    address, value64, flags = struct.unpack_from("<QQI", raw, 8)
    return _BatchOp(operation, address, value64 & 0xFFFFFFFF if operation in (1, 2) else value64, flags, raw)


def _batch_op_copy(address: int) -> CUstreamBatchMemOpParams:
    """A CUstreamBatchMemOpParams of its own holding the 48 bytes at `address`."""
    op = CUstreamBatchMemOpParams()
    ctypes.memmove(op.getPtr(), address, BATCH_OP_SIZE)
    return op


def batch_ops_at(params: CUDA_BATCH_MEM_OP_NODE_PARAMS) -> list[CUstreamBatchMemOpParams]:
    """The `count` operations a CUDA_BATCH_MEM_OP_NODE_PARAMS points at, read as the driver reads them (for tests:
    what cuGraphBatchMemOpNodeGetParams hands back, whose `paramArray` attribute reads [] as the wheel's does)."""
    address = params._array_address
    return [_batch_op_copy(address + BATCH_OP_SIZE * i) for i in range(int(params.count))] if address else []


class CUtensorMap:
    """The wheel's 128-byte opaque descriptor (64-byte aligned in C): its bytes at getPtr()."""

    def __init__(self, data: bytes = bytes(128)) -> None:
        self._buffer = ctypes.create_string_buffer(bytes(data), 128)

    def getPtr(self) -> int:  # noqa: N802 - the wheel's name
        return ctypes.addressof(self._buffer)


class CUlaunchConfig:
    """The wheel's wrapper, only in the form the executor uses: over a C CUlaunchConfig at `_ptr`."""

    def __init__(self, _ptr: int = 0) -> None:
        if not _ptr:
            raise TypeError("the fake's CUlaunchConfig only wraps an existing struct (_ptr)")
        self._ptr = int(_ptr)

    def getPtr(self) -> int:  # noqa: N802 - the wheel's name
        return self._ptr


class CUstreamAttrValue:
    """The wheel's 64-byte union (CUlaunchAttributeValue's) at getPtr(): its own bytes, or a C union at `_ptr`."""

    def __init__(self, _ptr: int = 0, data: bytes = bytes(64)) -> None:
        self._buffer = None if _ptr else ctypes.create_string_buffer(bytes(data), 64)
        self._ptr = int(_ptr) or ctypes.addressof(self._buffer)  # type: ignore[arg-type]

    def getPtr(self) -> int:  # noqa: N802 - the wheel's name
        return self._ptr

    def __repr__(self) -> str:  # the journal's picture: its bytes
        return f"<CUstreamAttrValue {ctypes.string_at(self._ptr, 64).hex()}>"


class CUuuid:
    def __init__(self, data: bytes = bytes(16)) -> None:
        self.bytes = bytes(data)


HANDLE_CLASSES = (CUdevice, CUdeviceptr, CUcontext, CUstream, CUevent, CUmodule, CUfunction, CUlibrary, CUkernel,
                  CUmemoryPool, CUgraph, CUgraphExec, CUgraphNode)


# --- the journal ----------------------------------------------------------------------------------------------------

def plain(value: Any) -> Any:
    """A JSON-able picture of an argument or result (see the module docstring)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, IntEnum):
        return [type(value).__name__, int(value)]
    if isinstance(value, int | float | str):
        return value
    if isinstance(value, _Handle | cuuint64_t):
        return [type(value).__name__, int(value)]
    if isinstance(value, CUuuid):
        return ["CUuuid", value.bytes.hex()]
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        out: dict[str, Any] = {"len": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        if len(data) <= 256:
            out["hex"] = data.hex()
        return out
    if isinstance(value, CUstreamBatchMemOpParams):  # {operation, address, value, flags}
        return _batch_op(ctypes.string_at(value.getPtr(), BATCH_OP_SIZE)).plain()
    if isinstance(value, CUDA_BATCH_MEM_OP_NODE_PARAMS):  # its fields, and the operations the driver reads
        count, address = int(value.count), value._array_address
        own = value._array is not None and address == ctypes.addressof(value._array)
        readable = min(count, value._length) if own else count if count <= MAX_BATCH_OPS else 0
        ops = [_batch_op(ctypes.string_at(address + BATCH_OP_SIZE * i, BATCH_OP_SIZE)).plain()
               for i in range(readable if address else 0)]
        return {"ctx": int(value.ctx), "count": count, "flags": int(value.flags), "paramArray": ops}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return repr(value)


def read_journal(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every entry a FakeDriver appended to `path`, in order ([] if it does not exist yet)."""
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


class Call(NamedTuple):
    name: str
    args: tuple[Any, ...]
    result: tuple[Any, ...]


# --- module images --------------------------------------------------------------------------------------------------

PTX_SIZES = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "b32": 4, "u32": 4, "s32": 4,
             "f32": 4, "b64": 8, "u64": 8, "s64": 8, "f64": 8}
_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$][\w$]*)\s*\((.*?)\)", re.S)
_PARAM = re.compile(rb"\.param\s+(?:\.align\s+(\d+)\s+)?\.([a-z]+\d+)\s+[A-Za-z_$][\w$]*(?:\s*\[(\d+)\])?")
_GLOBAL = re.compile(rb"^\s*(?:\.visible\s+)?\.global\s+(?:\.align\s+(\d+)\s+)?\.([a-z]+\d+)\s+([A-Za-z_$][\w$]*)"
                     rb"(?:\s*\[(\d+)\])?", re.M)
FATBIN_MAGIC = 0xBA55ED50


@dataclass
class Image:
    kind: str
    kernels: dict[bytes, list[tuple[int, int]] | None]  # name -> (offset, size) per parameter; None: unknown
    globals: dict[bytes, int]  # name -> size in bytes


def _align(value: int, to: int) -> int:
    return (value + to - 1) // to * to


def parse_ptx(text: bytes) -> Image | None:
    if b".version" not in text or b".target" not in text:
        return None
    kernels: dict[bytes, list[tuple[int, int]] | None] = {}
    for match in _ENTRY.finditer(text):
        layout: list[tuple[int, int]] = []
        end = 0
        for align, ptype, count in _PARAM.findall(match.group(2)):
            size = PTX_SIZES.get(ptype.decode())
            if size is None:
                return None
            offset = _align(end, int(align) if align else size)
            layout.append((offset, size * (int(count) if count else 1)))
            end = offset + layout[-1][1]
        kernels[match.group(1)] = layout
    variables = {}
    for _align_s, vtype, name, count in _GLOBAL.findall(text):
        size = PTX_SIZES.get(vtype.decode())
        if size is None:
            return None
        variables[name] = size * (int(count) if count else 1)
    return Image("ptx", kernels, variables)


def parse_elf(data: bytes) -> Image | None:
    """A little-endian ELF64 whose `.text.<name>` sections name its kernels (parameter layouts unknown)."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if not shoff or shentsize < 64 or shstrndx >= shnum or shoff + shnum * shentsize > len(data):
        return None
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    str_offset, str_size = sections[shstrndx][4], sections[shstrndx][5]
    if str_offset + str_size > len(data):
        return None
    strings = data[str_offset:str_offset + str_size]
    kernels: dict[bytes, list[tuple[int, int]] | None] = {}
    for section in sections:
        name = strings[section[0]:].split(b"\0", 1)[0]
        if name.startswith(b".text.") and len(name) > len(b".text."):
            kernels[name[len(b".text."):]] = None
    return Image("cubin", kernels, {})


def parse_image(data: bytes) -> Image | None:
    if data[:4] == b"\x7fELF":
        return parse_elf(data)
    if len(data) >= 16 and struct.unpack_from("<I", data)[0] == FATBIN_MAGIC:
        header_size, fat_size = struct.unpack_from("<HQ", data, 6)
        body = data[header_size:header_size + fat_size]
        at = body.find(b"\x7fELF")
        if at >= 0:
            return parse_elf(body[at:])
        at = body.find(b".version")
        return parse_ptx(body[at:].split(b"\0", 1)[0]) if at >= 0 else None
    return parse_ptx(data.split(b"\0", 1)[0])


# --- the driver -----------------------------------------------------------------------------------------------------

@dataclass
class _Context:
    device: int
    flags: int
    ident: int
    primary: bool


@dataclass
class _Kernel:
    name: bytes
    layout: list[tuple[int, int]] | None
    owner: int  # module or library handle
    attributes: dict[tuple[int, int], int] = field(default_factory=dict)  # (attribute, device) -> value


def _result(code: int, outputs: int = 0) -> tuple[Any, ...]:
    return (CUresult(code),) + (None,) * outputs


def _recorded(method: Callable[..., tuple[Any, ...]]) -> Callable[..., tuple[Any, ...]]:
    @functools.wraps(method)
    def wrapper(self: FakeDriver, *args: Any) -> tuple[Any, ...]:
        self._note = {}
        result = method(self, *args)
        self._record(method.__name__, args, result)
        return result
    return wrapper



# CUdevice_attribute values as an H100 answers them (attribute number: value), for the attributes a CUDA runtime
# relies on; the rest answer 0 (FakeDriver.device_attribute).
H100_ATTRIBUTES = {
    1: 1024, 2: 1024, 3: 1024, 4: 64, 5: 0x7FFFFFFF, 6: 65535, 7: 65535, 8: 49152, 9: 65536, 10: 32,
    11: 2147483647, 12: 65536, 14: 512, 15: 1, 19: 1, 31: 1, 32: 1, 36: 2_619_000, 37: 5120, 38: 52_428_800,
    39: 2048, 40: 3, 41: 1, 75: 9, 76: 0, 78: 1, 79: 1, 80: 1, 81: 233_472, 82: 65536, 83: 1, 86: 2, 88: 1,
    95: 1, 97: 232_448, 102: 1, 106: 32, 111: 1024, 115: 1,
    # the stream memory operations (CAN_USE_STREAM_MEM_OPS_V1, CAN_USE_64_BIT_STREAM_MEM_OPS,
    # CAN_USE_STREAM_WAIT_VALUE_NOR), as the H200 (driver 580) answers them: the deprecated _V1 attribute reads 0 there,
    # though the operations work
    92: 0, 122: 1, 123: 1,
    # sharing with another process (HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, MEMPOOL_SUPPORTED_HANDLE_TYPES: POSIX
    # and FABRIC, IPC_EVENT_SUPPORTED, HANDLE_TYPE_FABRIC_SUPPORTED), as the H200 (driver 580) answered on 2026-11-28
    103: 1, 119: 9, 125: 1, 128: 1,
}

# cuDeviceGetHostAtomicCapabilities' and cuDeviceGetP2PAtomicCapabilities' answers: CUatomicOperation value -> bitmask
# of CUatomicOperationCapability. What an H100 or H200 plausibly answers, NOT read on a GPU
# (tests/gpu/programs/module_names_program.py reports the real ones). Host: none native, as over PCIe to an x86 host
# (where CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED reads 0). Between two GPUs (NVLink), sm_90's own: integer
# add, min, max and the bitwise operations signed and unsigned, 32 and 64 bits, as reductions too; increment and
# decrement unsigned 32-bit; exchange and CAS 32, 64 and 128 bits; float add 32 and 64 bits and float4, as reductions
# too; float min and max none.
_SIGNED, _UNSIGNED, _REDUCTION, _SCALAR_32, _SCALAR_64, _SCALAR_128, _VECTOR_32X4 = 1, 2, 4, 8, 16, 32, 64
_INTEGER_ATOMICS = _SIGNED | _UNSIGNED | _REDUCTION | _SCALAR_32 | _SCALAR_64
_SWAP_ATOMICS = _SIGNED | _UNSIGNED | _SCALAR_32 | _SCALAR_64 | _SCALAR_128
HOST_ATOMIC_CAPABILITIES = dict.fromkeys(range(13), 0)
P2P_ATOMIC_CAPABILITIES = {
    0: _INTEGER_ATOMICS, 1: _INTEGER_ATOMICS, 2: _INTEGER_ATOMICS, 3: _UNSIGNED | _REDUCTION | _SCALAR_32,
    4: _UNSIGNED | _REDUCTION | _SCALAR_32, 5: _INTEGER_ATOMICS, 6: _INTEGER_ATOMICS, 7: _INTEGER_ATOMICS,
    8: _SWAP_ATOMICS, 9: _SWAP_ATOMICS, 10: _REDUCTION | _SCALAR_32 | _SCALAR_64 | _VECTOR_32X4, 11: 0, 12: 0,
}
_BUS_ID = re.compile(rb"([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)(?:\.([0-9a-fA-F]+))?")  # domain:bus:device[.fn]
_SHORT_BUS_ID = re.compile(rb"([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)")  # bus:device.function


@dataclass
class _Physical:
    """Physical memory of cuMemCreate: its bytes (shared by every mapping of it), its device, whether released.
    Memory created exportable as a POSIX file descriptor lives in a memfd (`descriptor`), mapped: what another
    process imports from an export of it is the same bytes, as on a GPU."""
    data: Any  # a bytearray, or an mmap of `descriptor`
    device: int
    released: bool = False
    references: int = 1  # cuMemCreate's and each cuMemRetainAllocationHandle's, until released
    handle_types: int = 0  # requestedHandleTypes, and allocFlags (compression, RDMA, usage) as created
    flags: tuple[int, int, int] = (0, 0, 0)
    descriptor: int = -1
    imported: bool = False  # counted where it was created, not here


POSIX_FILE_DESCRIPTOR = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
EXPORT_NAME = "fake-cumem-device-"  # a memfd's name: the device its memory is on follows


def _exportable(size: int, device: int) -> tuple[Any, int]:
    """`size` bytes in a memfd of their own, mapped; and the memfd."""
    descriptor = os.memfd_create(f"{EXPORT_NAME}{device}", os.MFD_CLOEXEC)
    os.ftruncate(descriptor, size)
    return mmap.mmap(descriptor, size), descriptor


class _IpcHandle:
    """CUipcMemHandle and CUipcEventHandle as the wheel has them: 64 bytes reached through getPtr()."""

    def __init__(self) -> None:
        self._bytes = ctypes.create_string_buffer(64)

    def getPtr(self) -> int:  # noqa: N802 (the wheel's name)
        return ctypes.addressof(self._bytes)


class CUipcMemHandle(_IpcHandle):
    pass


class CUipcEventHandle(_IpcHandle):
    pass


IPC_MEMORY_HANDLE = struct.Struct("<8sIIQ")  # b"FAKEIPCM", the exporting pid, its memfd, the size
IPC_EVENT_HANDLE = struct.Struct("<8sIQ")  # b"FAKEIPCE", the exporting pid, the event
EVENT_INTERPROCESS_FLAGS = 0x6  # CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING, which cuIpcGetEventHandle needs


@dataclass
class _Mapping:
    size: int
    handle: int
    offset: int
    access: int = 0  # CUmemAccess_flags granted by cuMemSetAccess (0: none yet)
    granted: dict[int, int] = field(default_factory=dict)  # device -> its CUmemAccess_flags (cuMemGetAccess)


@dataclass
class _Capture:
    """A stream's capture sequence (cuStreamBeginCapture until cuStreamEndCapture)."""
    ident: int  # unique per capture (cuStreamGetCaptureInfo's id)
    graph: int  # the graph being built
    mode: int  # CUstreamCaptureMode it began with
    thread: int  # the thread that began it
    context: int
    blocking: bool  # of a blocking stream (the legacy stream depends on it)
    status: int = 1  # CU_STREAM_CAPTURE_STATUS_ACTIVE, or INVALIDATED (2)
    last: int = 0  # the node captured last (the next one's dependency; 0: none yet)
    # the next node's dependencies and their edge words where given (cuStreamBeginCaptureToGraph,
    # cuStreamUpdateCaptureDependencies) instead of `last`
    deps: list[tuple[int, int]] | None = None
    into: bool = False  # captures into the caller's graph (cuStreamBeginCaptureToGraph): never discarded


@dataclass(frozen=True)
class _GraphNode:
    """A node: its type and what running it does, given the stream a graph is launched on (queues its work on
    that stream under the stream rules, as the call it was captured from would have). A node added node by node
    also keeps its parameters (one of the _*Node records below; None for a captured node)."""
    kind: int  # CUgraphNodeType
    replay: Callable[[Any], object]
    params: Any = None


@dataclass
class _GraphExec:
    nodes: tuple[_GraphNode, ...]  # what it runs, in execution order (a topological order of the graph's nodes)
    flags: int
    stream: int | None = None  # the stream of its latest launch
    members: tuple[int, ...] = ()  # the graph's nodes when it was instantiated, in the order they were added
    order: tuple[int, ...] = ()  # indices into `members`, in execution order
    parts: list[_GraphNode] = field(default_factory=list)  # what each member runs now (cuGraphExec*SetParams)
    deps: tuple[tuple[tuple[int, int], ...], ...] = ()  # each member's dependencies: (member index, edge word)
    # a node of a child graph moved into one of its nodes (kept by identity: cuGraphExec*SetParams names it) ->
    # (the list of what that child graph's nodes run now, its index there)
    inner: dict[int, tuple[list[_GraphNode], int]] = field(default_factory=dict)
    graph: int = 0  # the graph it was instantiated from

    def refresh(self) -> None:
        self.nodes = tuple(self.parts[i] for i in self.order)


@dataclass(frozen=True)
class _KernelNode:
    """A kernel node's parameters: its function (or kernel), launch dimensions and packed parameter bytes."""
    handle: int  # the CUfunction, or the CUkernel where `func` was NULL
    context: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    packed: bytes
    name: bytes
    form: int = 1  # how the parameters were given: 0 none, 1 kernelParams, 2 extra (what GetParams answers in)
    by_kernel: bool = False  # `kern` given (and `func` NULL): `handle` is the CUkernel


@dataclass(frozen=True)
class _MemsetNode:
    dst: int
    pitch: int
    value: int
    element: int
    width: int  # elements
    height: int  # rows
    context: int


@dataclass(frozen=True)
class _CopySide:
    """One side of a memcpy node: host memory (an address read and written through ctypes) or device memory."""
    kind: int  # CU_MEMORYTYPE_HOST or _DEVICE (UNIFIED resolved by where the address lies)
    address: int
    x: int
    y: int
    z: int
    pitch: int
    rows: int  # the height of a slice
    given: int = 0  # the memory type the caller gave (UNIFIED, resolved in `kind`), 0: `kind`

    def row(self, y: int, z: int) -> int:
        return self.address + self.x + (self.y + y) * self.pitch + (self.z + z) * self.pitch * self.rows


@dataclass(frozen=True)
class _CopyNode:
    src: _CopySide
    dst: _CopySide
    width: int  # bytes
    height: int
    depth: int
    context: int


@dataclass(frozen=True)
class _ChildNode:
    graph: int  # the child graph's clone, or the child graph itself where it was moved in; the node owns it
    moved: bool = False  # CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE: the caller's graph, its nodes the caller's handles


@dataclass(frozen=True)
class _EventNode:
    event: int


@dataclass(frozen=True)
class _HostNode:
    """A host node's parameters: its function's address and its userData (0: NULL)."""
    fn: int
    user_data: int


@dataclass(frozen=True)
class _BatchNode:
    """A batch memory-operation node's parameters: its operations (as given, in order), context as given (0: NULL)
    and flags, and the context it runs in (`home`: the one given, or the current one when it was given)."""
    ops: tuple[_BatchOp, ...]
    context: int
    flags: int
    home: int = 0


@dataclass
class _Link:
    """A JIT link state (cuLinkCreate): its inputs (type, name, data) in order, and the cubin once complete (the
    state owns it: its address stays valid until cuLinkDestroy)."""
    inputs: list[tuple[int, bytes, bytes]]
    cubin: Any = None  # a ctypes buffer


@dataclass(frozen=True)
class _ConditionalHandle:
    """A conditional handle (cuGraphConditionalHandleCreate): its graph and context, its value at each launch."""
    graph: int
    context: int
    default: int
    flags: int

    @property
    def at_launch(self) -> int:
        """Its value when a graph starts: the default where CU_GRAPH_COND_ASSIGN_DEFAULT asks for it, else 0 (no
        kernel of the fake sets one: the fake's choice for a value CUDA leaves to the program)."""
        return self.default if self.flags & CU_GRAPH_COND_ASSIGN_DEFAULT else 0


@dataclass(frozen=True)
class _AllocNode:
    """A memory allocation node: its allocation (made with the node, gone with its graph: the fake's choice), the pool
    properties and access descriptors it was given."""
    dptr: int
    bytesize: int
    device: int
    pool: tuple[int, int, int, int, int, int, int]  # allocType, handleTypes, location type and id, maxSize, usage, RDMA
    access: tuple[tuple[int, int, int], ...]  # (location type, id, CUmemAccess_flags) each


@dataclass(frozen=True)
class _FreeNode:
    dptr: int


@dataclass(frozen=True)
class _ConditionalNode:
    handle: int
    kind: int  # CUgraphConditionalNodeType
    bodies: tuple[int, ...]  # its body graphs, which it owns
    context: int


class FakeDriver:
    """The subset of cuda.bindings.driver's API that host_agent/session/executor.py uses; see the module docstring."""

    CUresult = CUresult
    CUdevice_attribute = CUdevice_attribute
    CUdevice_P2PAttribute = CUdevice_P2PAttribute
    CUmemPool_attribute = CUmemPool_attribute
    CUfunction_attribute = CUfunction_attribute
    CUfunc_cache = CUfunc_cache
    CUstreamCaptureStatus = CUstreamCaptureStatus
    CUpointer_attribute = CUpointer_attribute
    CUjit_option, CUjit_target = CUjit_option, CUjit_target
    CUjit_fallback, CUjit_cacheMode = CUjit_fallback, CUjit_cacheMode
    CUjitInputType, CUlinkState = CUjitInputType, CUlinkState
    CUdevice, CUdeviceptr, CUcontext, CUstream, CUevent = CUdevice, CUdeviceptr, CUcontext, CUstream, CUevent
    CUmodule, CUfunction, CUlibrary, CUkernel, CUmemoryPool = CUmodule, CUfunction, CUlibrary, CUkernel, CUmemoryPool
    cuuint64_t, cuuint32_t, CUtensorMap = cuuint64_t, cuuint32_t, CUtensorMap
    CUlimit = CUlimit
    CUtensorMapDataType, CUtensorMapInterleave, CUtensorMapSwizzle = (CUtensorMapDataType, CUtensorMapInterleave,
                                                                      CUtensorMapSwizzle)
    CUtensorMapL2promotion, CUtensorMapFloatOOBfill = CUtensorMapL2promotion, CUtensorMapFloatOOBfill
    CUtensorMapIm2ColWideMode, CUtensorMapAllocClass = CUtensorMapIm2ColWideMode, CUtensorMapAllocClass
    CUuuid = CUuuid
    CUipcMemHandle, CUipcEventHandle = CUipcMemHandle, CUipcEventHandle
    CUlaunchConfig = CUlaunchConfig
    CUstreamAttrID, CUstreamAttrValue = CUstreamAttrID, CUstreamAttrValue
    CUmemAllocationType, CUmemLocationType, CUmemAllocationHandleType = (CUmemAllocationType, CUmemLocationType,
                                                                         CUmemAllocationHandleType)
    CUmemAccess_flags, CUmemAllocationGranularity_flags = CUmemAccess_flags, CUmemAllocationGranularity_flags
    CUmemGenericAllocationHandle, CUmemLocation = CUmemGenericAllocationHandle, CUmemLocation
    CUmemAllocationProp, CUmemAccessDesc, CUmemPoolProps = CUmemAllocationProp, CUmemAccessDesc, CUmemPoolProps
    CUstreamCaptureMode, CUgraphNodeType, CUgraphDependencyType = (CUstreamCaptureMode, CUgraphNodeType,
                                                                   CUgraphDependencyType)
    CUgraphInstantiate_flags, CUevent_record_flags, CUevent_wait_flags = (CUgraphInstantiate_flags,
                                                                          CUevent_record_flags, CUevent_wait_flags)
    CUgraph, CUgraphExec, CUgraphNode, CUgraphEdgeData = CUgraph, CUgraphExec, CUgraphNode, CUgraphEdgeData
    CUmemorytype, CUgraphExecUpdateResult = CUmemorytype, CUgraphExecUpdateResult
    CUDA_KERNEL_NODE_PARAMS, CUDA_MEMSET_NODE_PARAMS = CUDA_KERNEL_NODE_PARAMS, CUDA_MEMSET_NODE_PARAMS
    CUDA_MEMCPY3D, CUgraphExecUpdateResultInfo = CUDA_MEMCPY3D, CUgraphExecUpdateResultInfo
    CUDA_MEMCPY2D, CUDA_MEMCPY3D_PEER = CUDA_MEMCPY2D, CUDA_MEMCPY3D_PEER
    CUgraphNodeParams, CUgraphConditionalHandle = CUgraphNodeParams, CUgraphConditionalHandle
    CUgraphConditionalNodeType, CUgraphChildGraphNodeOwnership = (CUgraphConditionalNodeType,
                                                                  CUgraphChildGraphNodeOwnership)
    CUkernelNodeAttrID, CUkernelNodeAttrValue, CUgraphMem_attribute = (CUkernelNodeAttrID, CUkernelNodeAttrValue,
                                                                       CUgraphMem_attribute)
    CUgraphInstantiateResult, CUDA_GRAPH_INSTANTIATE_PARAMS = CUgraphInstantiateResult, CUDA_GRAPH_INSTANTIATE_PARAMS
    CUDA_MEM_ALLOC_NODE_PARAMS, CUDA_MEM_FREE_NODE_PARAMS = CUDA_MEM_ALLOC_NODE_PARAMS, CUDA_MEM_FREE_NODE_PARAMS
    CUhostFn, CUDA_HOST_NODE_PARAMS = CUhostFn, CUDA_HOST_NODE_PARAMS
    CUstreamBatchMemOpType, CUstreamBatchMemOpParams = CUstreamBatchMemOpType, CUstreamBatchMemOpParams
    CUDA_BATCH_MEM_OP_NODE_PARAMS = CUDA_BATCH_MEM_OP_NODE_PARAMS
    CUstreamMemOpWaitValueParams_st, CUstreamMemOpWriteValueParams_st = (CUstreamMemOpWaitValueParams_st,
                                                                         CUstreamMemOpWriteValueParams_st)
    CUstreamMemOpFlushRemoteWritesParams_st, CUstreamMemOpMemoryBarrierParams_st = (
        CUstreamMemOpFlushRemoteWritesParams_st, CUstreamMemOpMemoryBarrierParams_st)
    CUstreamWaitValue_flags, CUstreamWriteValue_flags = CUstreamWaitValue_flags, CUstreamWriteValue_flags
    CUstreamMemoryBarrier_flags = CUstreamMemoryBarrier_flags
    CUatomicOperation, CUatomicOperationCapability = CUatomicOperation, CUatomicOperationCapability

    def __init__(self, devices: int = 2, total_mem: tuple[int, ...] | None = None, journal: str | None = None,
                 initialized: bool = False, context_bytes: int = CONTEXT_BYTES,
                 lacks_attributes: tuple[int, ...] = (), reuse_handles: bool = False) -> None:
        """`devices` fake GPUs; device d has total_mem[d] bytes (default (16 + 8 d) GiB) and the name
        "Orion Fake GPU <d>". Each context holds `context_bytes` of its device (process_memory). Device
        attributes in `lacks_attributes` are refused as an older driver refuses one it does not know. With
        `reuse_handles`, an unloaded module's or library's handles (its own, its functions', its kernels') are
        given out again (the unloaded handle first, then its children in the order they were made), as the real
        driver reuses the memory behind them."""
        self.device_count = devices
        if lacks_attributes:  # this driver's enum lacks them, as an older wheel's does
            self.CUdevice_attribute = IntEnum(  # type: ignore[misc]
                "CUdevice_attribute", [(m.name, m.value) for m in CUdevice_attribute if m not in lacks_attributes])
        self.context_bytes = context_bytes
        self.total_mem = total_mem or tuple((16 + 8 * d) << 30 for d in range(devices))
        self.journal = journal
        self.calls: list[Call] = []
        self._note: dict[str, Any] = {}
        self.initialized = initialized
        self._next_handle = 0x1000
        self._freed: list[int] | None = [] if reuse_handles else None  # handles to give out again
        self._next_pointer = ALLOCATION_BASE
        self.memory: dict[int, bytearray] = {}  # base -> bytes (allocations and module globals)
        self.allocations: dict[int, int] = {}  # base -> device (cuMemAlloc*; globals are not in here)
        self.used = [0] * devices
        self.contexts: dict[int, _Context] = {}
        self.primary: dict[int, int] = {}  # device -> primary context handle
        self.primary_refs = [0] * devices
        self.primary_flags = [0] * devices
        self.stack: list[int] = []  # current-context stack (top is current)
        self.streams: dict[int, tuple[int, int, int]] = {}  # handle -> (context, flags, priority)
        self.events: dict[int, dict[str, int]] = {}  # handle -> {"flags", "recorded" (sequence, 0 = never)}
        self._clock = 0
        self.modules: dict[int, dict[bytes, int]] = {}  # handle -> name -> function handle
        self.module_globals: dict[int, dict[bytes, int]] = {}  # module/library -> name -> device pointer
        self.global_device: dict[int, int] = {}  # device pointer of a module/library global -> its device
        self.libraries: dict[int, dict[bytes, int]] = {}  # handle -> name -> kernel handle
        self.functions: dict[int, _Kernel] = {}
        self.kernels: dict[int, _Kernel] = {}
        self._kernel_functions: dict[tuple[int, int | None], tuple[int, _Kernel]] = {}  # cuKernelGetFunction's
        self.images: dict[int, Image] = {}  # module/library -> parsed image
        self.links: dict[int, _Link] = {}  # link state -> its inputs and, once complete, its cubin
        self.pools: dict[int, dict[int, int]] = {}  # handle -> attribute -> value
        self.default_pool: dict[int, int] = {}  # device -> pool
        self.current_pool: dict[int, int] = {}  # device -> pool set current (cuDeviceSetMemPool; else its default)
        self.pool_access: dict[int, dict[int, int]] = {}  # pool -> peer device -> CUmemAccess_flags granted
        self.launches: list[dict[str, Any]] = []
        self.registered: dict[int, int] = {}  # page-locked host ranges: address -> size
        # stream -> work not yet done: a non-blocking stream's, or any stream's held back by an unsatisfied
        # cuStreamWaitValue32 (an action answering False is that wait: it and what follows stay queued)
        self.pending: dict[int, list[Callable[[], bool | None]]] = {}
        self.limits: dict[int, dict[int, int]] = {}  # context -> limit -> value set with cuCtxSetLimit
        self.origin: dict[int, tuple[int, int]] = {}  # base -> (context it was made in, pool it came from or 0)
        self.reserved: dict[int, int] = {}  # virtual address ranges (cuMemAddressReserve): base -> size
        self.physical: dict[int, _Physical] = {}  # cuMemCreate's memory, until released and unmapped
        self.ipc_exported: dict[int, int] = {}  # allocation base -> the memfd its bytes moved to (cuIpcGetMemHandle)
        self.ipc_opened: dict[int, int] = {}  # base here -> the memfd of another process's allocation opened
        self.mappings: dict[int, _Mapping] = {}  # mapped address -> what it maps (cuMemMap)
        self.stream_ids: dict[int, int] = {}  # stream -> cuStreamGetId's answer
        self.stream_attributes: dict[int, dict[int, bytes]] = {}  # stream -> attribute ID -> value set (64 bytes)
        self.captures: dict[int, _Capture] = {}  # capturing stream -> its capture (active or invalidated)
        self._next_capture = 0
        self.capture_modes: dict[int, int] = {}  # thread ident -> its CUstreamCaptureMode (absent: GLOBAL)
        self.graphs: dict[int, list[int]] = {}  # graph -> its nodes, in the order they were captured or added
        self.graph_edges: dict[int, list[tuple[int, int, int]]] = {}  # graph -> (from, to, edge word), in order
        self.nodes: dict[int, _GraphNode] = {}
        self.node_graph: dict[int, int] = {}  # node -> its graph
        self.execs: dict[int, _GraphExec] = {}
        self.conditional_handles: dict[int, _ConditionalHandle] = {}  # cuGraphConditionalHandleCreate
        self.body_owner: dict[int, int] = {}  # a conditional node's body graph -> that node
        self.moved_owner: dict[int, int] = {}  # a child graph moved into a node (OWNERSHIP_MOVE) -> that node
        self.node_attributes: dict[int, dict[int, bytes]] = {}  # kernel node -> attribute -> its 64 bytes
        self.node_memory: dict[int, tuple[Any, ...]] = {}  # what a node's parameters asked back point at
        self.graph_frees: dict[int, int] = {}  # a graph allocation -> the graph of its free node
        self.graph_memory_high = [0] * devices  # CU_GRAPH_MEM_ATTR_USED/RESERVED_MEM_HIGH (one figure: below)
        self.host_calls: list[tuple[int, int]] = []  # host functions called, in order: (address, userData)

    # --- bookkeeping --------------------------------------------------------------------------------------------
    def _record(self, name: str, args: tuple[Any, ...], result: tuple[Any, ...]) -> None:
        self.calls.append(Call(name, args, result))
        if self.journal is None:
            return
        entry = {"pid": os.getpid(), "name": name, "args": plain(args), "result": plain(result), **self._note}
        with open(self.journal, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    def _handle(self) -> int:
        if self._freed:
            return self._freed.pop()
        self._next_handle += 0x10
        return self._next_handle

    def _current(self) -> int | None:
        return self.stack[-1] if self.stack else None

    def _context_error(self) -> int:
        """0 when initialized with a current context, else the CUDA error a context-bound call gets."""
        if not self.initialized:
            return CUresult.CUDA_ERROR_NOT_INITIALIZED
        if self._current() is None:
            return CUresult.CUDA_ERROR_INVALID_CONTEXT
        return 0

    def _device_of_current(self) -> int:
        current = self._current()
        assert current is not None
        return self.contexts[current].device

    def _device(self, dev: Any) -> int | None:
        value = int(dev) if dev is not None else -1
        return value if 0 <= value < self.device_count else None

    def _allocate(self, size: int, device: int, track: bool = True) -> int:
        base = self._next_pointer
        self._next_pointer += _align(max(size, 1), MIB) + GUARD
        self.memory[base] = bytearray(size)
        self.origin[base] = (self._current() or 0, 0)
        if track:
            self.allocations[base] = device
            self.used[device] += size
        return base

    def _span(self, pointer: Any, size: int) -> tuple[bytearray, int] | None:
        """The allocation holding [pointer, pointer + size) and the offset in it, or None."""
        address = int(pointer) if pointer is not None else 0
        for base, data in self.memory.items():
            if base <= address and address + max(size, 1) <= base + max(len(data), 1):
                return data, address - base
        return None

    def _nonblocking(self, stream: Any) -> bool:
        value = 0 if stream is None else int(stream)
        return value in self.streams and bool(self.streams[value][1] & CU_STREAM_NON_BLOCKING)

    def _enqueue(self, stream: Any, action: Callable[[], bool | None], kind: int = 0) -> int:
        """Run `action` now, or (non-blocking stream, or one held back by a wait) when something waits for that
        stream. An action answering False is a wait not yet satisfied: it stays queued, and so does later work.
        On a capturing stream it runs nothing: it becomes a node of type `kind` (CUgraphNodeType) that queues
        `action` on the stream the graph is launched on. 0, or the capture's error."""
        capture = self._capture_of(stream)
        if capture is not None:
            return self._capture_node(capture, kind, lambda on: self._enqueue(on, action, kind))
        key = int(stream or 0)
        if self._nonblocking(stream) or self.pending.get(key):
            self.pending.setdefault(key, []).append(action)
        elif action() is False:
            self.pending[key] = [action]
        return 0

    # --- stream capture (see the module docstring) ----------------------------------------------------------------
    def _capture_of(self, stream: Any) -> _Capture | None:
        """The capture of `stream` (active or invalidated), None when it is not capturing."""
        return self.captures.get(int(stream or 0))

    def _capture_node(self, capture: _Capture, kind: int, replay: Callable[[Any], object], params: Any = None) -> int:
        """Add a node to `capture`'s graph, after the one captured last (with `params`, where the fake models a
        captured node's parameters: a host node's); CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (nothing added) once the
        capture was invalidated."""
        if capture.status != CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            return CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        handle = self._handle()
        self.nodes[handle] = _GraphNode(kind, replay, params)
        self.node_graph[handle] = capture.graph
        self.graphs[capture.graph].append(handle)
        if capture.deps is not None:  # the dependencies given (cuStreamBeginCaptureToGraph, ...UpdateCapture...)
            self.graph_edges.setdefault(capture.graph, []).extend((d, handle, w) for d, w in capture.deps)
            capture.deps = None
        elif capture.last:  # a captured stream is one chain: an edge from the node captured before
            self.graph_edges.setdefault(capture.graph, []).append((capture.last, handle, 0))
        capture.last = handle
        return 0

    def _invalidate(self, captures: list[_Capture]) -> None:
        for capture in captures:
            capture.status = CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_INVALIDATED

    def _sync_capture_error(self, stream: Any) -> int:
        """What synchronizing or querying `stream` answers while captures are under way, invalidating them: a
        capturing stream, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; the legacy stream while a blocking stream of the
        current context captures (it would depend on it), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT; else 0."""
        capture = self._capture_of(stream)
        if capture is not None:
            self._invalidate([capture])
            return CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        if not stream:
            blocking = [c for c in self._active_captures(self._current()) if c.blocking]
            if blocking:
                self._invalidate(blocking)
                return CUresult.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
        return 0

    def _active_captures(self, context: int | None) -> list[_Capture]:
        return [c for c in self.captures.values()
                if c.context == context and c.status == CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE]

    def _unsafe_call_error(self) -> int:
        """cuMemAlloc/cuMemFree under cuThreadExchangeStreamCaptureMode's rules: prohibited for a thread whose
        mode is not RELAXED while it has a capture of its own that did not begin RELAXED, or (its mode GLOBAL)
        while any thread has a GLOBAL capture. Such a call answers CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
        invalidates the captures that prohibited it."""
        me = threading.get_ident()
        mode = self.capture_modes.get(me, CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
        if mode == CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED:
            return 0
        relaxed, global_ = (CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED,
                            CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
        hit = [c for c in self.captures.values() if c.status == CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
               and ((c.thread == me and c.mode != relaxed) or (mode == global_ and c.mode == global_))]
        self._invalidate(hit)
        return CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED if hit else 0

    def _drop_graph(self, graph: int) -> None:
        self.graph_edges.pop(graph, None)
        self.body_owner.pop(graph, None)
        self.moved_owner.pop(graph, None)
        for node in self.graphs.pop(graph, []):
            found = self.nodes.pop(node, None)
            self.node_graph.pop(node, None)
            if found is not None:
                self._drop_owned(found)

    def _drop_owned(self, node: _GraphNode) -> None:
        """The graphs a node owns go with it: a child graph node's clone or moved graph, a conditional node's
        bodies."""
        if isinstance(node.params, _ChildNode):
            self._drop_graph(node.params.graph)
        elif isinstance(node.params, _ConditionalNode):
            for body in node.params.bodies:
                self._drop_graph(body)
        elif isinstance(node.params, _AllocNode):  # a graph allocation goes with its graph (the fake's choice)
            self.memory.pop(node.params.dptr, None)
            self.origin.pop(node.params.dptr, None)
            self.graph_frees.pop(node.params.dptr, None)
        elif isinstance(node.params, _FreeNode):
            self.graph_frees.pop(node.params.dptr, None)

    def _run_queued(self, keys: list[int]) -> bool:
        """Run the queued work of `keys` in order, each up to a wait not yet satisfied; whether any ran."""
        ran = False
        for key in keys:
            work = self.pending.pop(key, [])
            for i, action in enumerate(work):
                if action() is False:
                    self.pending[key] = work[i:]
                    break
                ran = True
        return ran

    def _drain(self, stream: Any = None) -> int:
        """Complete the queued work of `stream` (None: of every stream). A wait holding a stream back first lets
        the other streams' queued work run (their writes may satisfy it); one on host memory is then polled, as
        another process (the guest) may write it; 0, or CUDA_ERROR_LAUNCH_TIMEOUT where a GPU would wait
        forever (the fake's stand-in for a hang: nothing can write the value any more, or WAIT_HOST_POLL_S ran
        out)."""
        keys = [int(stream)] if stream is not None else list(self.pending)
        deadline = None
        while True:
            self._run_queued(keys)
            held = [key for key in keys if self.pending.get(key)]
            if not held:
                return 0
            if self._run_queued([key for key in list(self.pending) if key not in held]):
                continue
            host = any(getattr(self.pending[key][0], "on_host", False) for key in held)
            if not host:
                return CUresult.CUDA_ERROR_LAUNCH_TIMEOUT
            deadline = deadline if deadline is not None else time.monotonic() + WAIT_HOST_POLL_S
            if time.monotonic() > deadline:
                return CUresult.CUDA_ERROR_LAUNCH_TIMEOUT
            time.sleep(0.0005)

    def _stream_ok(self, stream: Any) -> bool:
        value = 0 if stream is None else int(stream)
        return value in (0, 1, 2) or value in self.streams  # NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD

    @staticmethod
    def _enum(value: Any, cls: type[IntEnum], name: str) -> IntEnum:
        if isinstance(value, IntEnum) and not isinstance(value, cls):
            raise TypeError(f"Argument '{name}' has incorrect type (expected {cls.__name__}, got "
                            f"{type(value).__name__})")
        return cls(int(value))  # ValueError for a value the enum does not have

    @staticmethod
    def _host_read(source: Any, size: int) -> bytes | None:
        if isinstance(source, int):
            return ctypes.string_at(source, size) if size else b""
        view = memoryview(source).cast("B")
        return bytes(view[:size]) if len(view) >= size else None

    @staticmethod
    def _host_write(destination: Any, data: bytes | bytearray) -> bool:
        if isinstance(destination, int):
            ctypes.memmove(destination, bytes(data), len(data))
            return True
        view = memoryview(destination).cast("B")
        if len(view) < len(data):
            return False
        view[:len(data)] = data
        return True

    # --- initialisation, version, errors -----------------------------------------------------------------------
    @_recorded
    def cuInit(self, flags: int) -> tuple[Any, ...]:
        if int(flags) != 0:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        self.initialized = True
        return _result(0)

    @_recorded
    def cuDriverGetVersion(self) -> tuple[Any, ...]:
        return CUresult(0), DRIVER_VERSION

    @_recorded
    def cuGetErrorName(self, error: Any) -> tuple[Any, ...]:
        code = self._enum(error, CUresult, "error")
        return CUresult(0), code.name.encode()

    @_recorded
    def cuGetErrorString(self, error: Any) -> tuple[Any, ...]:
        code = self._enum(error, CUresult, "error")
        return CUresult(0), ERROR_STRINGS[int(code)].encode()

    # --- devices ------------------------------------------------------------------------------------------------
    @_recorded
    def cuDeviceGetCount(self) -> tuple[Any, ...]:
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        return CUresult(0), self.device_count

    @_recorded
    def cuDeviceGet(self, ordinal: int) -> tuple[Any, ...]:
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if self._device(ordinal) is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 1)
        return CUresult(0), CUdevice(ordinal)

    def device_name(self, device: int) -> bytes:
        return f"Orion Fake GPU {device} (tests/fake_driver.py, not CUDA)".encode()

    @_recorded
    def cuDeviceGetName(self, length: int, dev: Any) -> tuple[Any, ...]:
        device = self._device(dev)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if device is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 1)
        if length <= 0:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        buffer = bytearray(length)  # as the wheel: `length` bytes, the name NUL-terminated inside them
        name = self.device_name(device)[:length - 1]
        buffer[:len(name)] = name
        return CUresult(0), bytes(buffer)

    def device_uuid(self, device: int) -> bytes:
        return hashlib.sha256(self.device_name(device)).digest()[:16]

    @_recorded
    def cuDeviceGetUuid(self, dev: Any) -> tuple[Any, ...]:
        device = self._device(dev)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if device is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 1)
        return CUresult(0), CUuuid(self.device_uuid(device))

    def device_attribute(self, attribute: int, device: int) -> int:
        """Fixed values per attribute, an H100's where it has one (the CUDA runtime of PyTorch, CuPy and JAX reads
        them all at start-up); those that differ between real GPUs differ between fake devices; any other
        attribute of the enum answers 0, as the driver does for a feature the device lacks."""
        varying = {13: 1_980_000 - 1000 * device, 16: 132 - 2 * device, 33: 0x18 + device}
        return varying.get(attribute, H100_ATTRIBUTES.get(attribute, 0))

    @_recorded
    def cuDeviceGetAttribute(self, attrib: Any, dev: Any) -> tuple[Any, ...]:
        attribute = self._enum(attrib, self.CUdevice_attribute, "attrib")
        device = self._device(dev)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if device is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 1)
        return CUresult(0), self.device_attribute(int(attribute), device)

    @_recorded
    def cuDeviceTotalMem(self, dev: Any) -> tuple[Any, ...]:
        device = self._device(dev)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if device is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 1)
        return CUresult(0), self.total_mem[device]

    @_recorded
    def cuDeviceCanAccessPeer(self, dev: Any, peer: Any) -> tuple[Any, ...]:
        a, b = self._device(dev), self._device(peer)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if a is None or b is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 1)
        return CUresult(0), int(a != b)  # every pair of distinct fake devices is peer-capable

    @_recorded
    def cuDeviceGetP2PAttribute(self, attrib: Any, src: Any, dst: Any) -> tuple[Any, ...]:
        """Distinct fake devices are peers with native atomics and array access (rank 0); a device with itself is
        CUDA_ERROR_INVALID_DEVICE, as the driver answers."""
        a, b = self._device(src), self._device(dst)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if a is None or b is None or a == b:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 1)
        attribute = self._enum(attrib, CUdevice_P2PAttribute, "attrib")
        return CUresult(0), 0 if attribute == CUdevice_P2PAttribute.CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK else 1

    # --- contexts -----------------------------------------------------------------------------------------------
    def _new_context(self, device: int, flags: int, primary: bool) -> int:
        handle = self._handle()
        self.contexts[handle] = _Context(device, flags, len(self.contexts) + 1, primary)
        return handle

    @_recorded
    def cuDevicePrimaryCtxRetain(self, dev: Any) -> tuple[Any, ...]:
        device = self._device(dev)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if device is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 1)
        if device not in self.primary:
            self.primary[device] = self._new_context(device, self.primary_flags[device], True)
        self.primary_refs[device] += 1
        return CUresult(0), CUcontext(self.primary[device])

    @_recorded
    def cuDevicePrimaryCtxRelease(self, dev: Any) -> tuple[Any, ...]:
        device = self._device(dev)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        if device is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE)
        if self.primary_refs[device] == 0:
            return _result(CUresult.CUDA_ERROR_INVALID_CONTEXT)
        self.primary_refs[device] -= 1
        if self.primary_refs[device] == 0:  # the last release destroys it
            self._context_ended(self.primary[device])
        return _result(0)

    @_recorded
    def cuDevicePrimaryCtxReset(self, dev: Any) -> tuple[Any, ...]:
        device = self._device(dev)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        if device is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE)
        self.primary_flags[device] = 0
        if device in self.primary:  # "destroys all allocations" (it is not released: cuda.h)
            self._context_ended(self.primary[device])
        return _result(0)

    @_recorded
    def cuDevicePrimaryCtxGetState(self, dev: Any) -> tuple[Any, ...]:
        device = self._device(dev)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 2)
        if device is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 2)
        return CUresult(0), self.primary_flags[device], int(self.primary_refs[device] > 0)

    @_recorded
    def cuDevicePrimaryCtxSetFlags(self, dev: Any, flags: int) -> tuple[Any, ...]:
        device = self._device(dev)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        if device is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE)
        if int(flags) & ~0x1F:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        self.primary_flags[device] = int(flags)
        if device in self.primary:
            self.contexts[self.primary[device]].flags = int(flags)
        return _result(0)

    @_recorded
    def cuCtxCreate(self, params: Any, flags: int, dev: Any) -> tuple[Any, ...]:
        device = self._device(dev)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if params is not None:
            return _result(CUresult.CUDA_ERROR_NOT_SUPPORTED, 1)
        if device is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 1)
        handle = self._new_context(device, int(flags), False)
        self.stack.append(handle)  # a created context becomes current
        return CUresult(0), CUcontext(handle)

    def _known_context(self, ctx: Any) -> int | None:
        value = int(ctx) if ctx is not None else 0
        return value if value in self.contexts else None

    @_recorded
    def cuCtxDestroy(self, ctx: Any) -> tuple[Any, ...]:
        handle = self._known_context(ctx)
        if handle is None or self.contexts[handle].primary:
            return _result(CUresult.CUDA_ERROR_INVALID_CONTEXT)
        self._context_ended(handle)
        del self.contexts[handle]
        self.stack = [c for c in self.stack if c != handle]
        return _result(0)

    def _context_ended(self, handle: int) -> None:
        """The allocations made in a context that ended (destroyed; a primary one released for the last time or
        reset) are freed with it, as the driver frees them (a pool's stay with their pool)."""
        for base in [b for b, (context, pool) in self.origin.items() if context == handle and not pool
                     and b in self.allocations]:
            device = self.allocations.pop(base)
            self.used[device] -= len(self.memory.pop(base))
            del self.origin[base]
            if base in self.ipc_exported:
                os.close(self.ipc_exported.pop(base))

    @_recorded
    def cuCtxGetCurrent(self) -> tuple[Any, ...]:
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        return CUresult(0), CUcontext(self._current() or 0)

    @_recorded
    def cuCtxSetCurrent(self, ctx: Any) -> tuple[Any, ...]:
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        value = int(ctx) if ctx is not None else 0
        if value == 0:
            if self.stack:
                self.stack.pop()
            return _result(0)
        if value not in self.contexts:
            return _result(CUresult.CUDA_ERROR_INVALID_CONTEXT)
        if self.stack:
            self.stack[-1] = value
        else:
            self.stack.append(value)
        return _result(0)

    @_recorded
    def cuCtxPushCurrent(self, ctx: Any) -> tuple[Any, ...]:
        handle = self._known_context(ctx)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        if handle is None:
            return _result(CUresult.CUDA_ERROR_INVALID_CONTEXT)
        self.stack.append(handle)
        return _result(0)

    @_recorded
    def cuCtxPopCurrent(self) -> tuple[Any, ...]:
        if err := self._context_error():
            return _result(err, 1)
        return CUresult(0), CUcontext(self.stack.pop())

    @_recorded
    def cuCtxGetDevice(self) -> tuple[Any, ...]:
        if err := self._context_error():
            return _result(err, 1)
        return CUresult(0), CUdevice(self._device_of_current())

    @_recorded
    def cuCtxSynchronize(self) -> tuple[Any, ...]:
        if err := self._context_error():
            return _result(err)
        return _result(self._context_sync(self._current()))

    @_recorded
    def cuCtxSynchronize_v2(self, ctx: Any) -> tuple[Any, ...]:
        """cuCtxSynchronize of `ctx` (NULL: the current context)."""
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        handle = self._context_or_current(ctx)
        if handle is None:
            return _result(CUresult.CUDA_ERROR_INVALID_CONTEXT)
        return _result(self._context_sync(handle))

    def _context_sync(self, context: int | None) -> int:
        """A context synchronize: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED while any of its streams captures (those
        captures invalidated), else every stream's work is done."""
        active = self._active_captures(context)
        if active:
            self._invalidate(active)
            return CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        return self._drain()

    @_recorded
    def cuCtxGetStreamPriorityRange(self) -> tuple[Any, ...]:
        if err := self._context_error():
            return _result(err, 2)
        return CUresult(0), 0, -5  # least, greatest (as a Hopper GPU)

    @_recorded
    def cuCtxGetFlags(self) -> tuple[Any, ...]:
        if err := self._context_error():
            return _result(err, 1)
        return CUresult(0), self.contexts[self._current()].flags  # type: ignore[index]

    def _context_or_current(self, ctx: Any) -> int | None:
        value = int(ctx) if ctx is not None else 0
        if value == 0:
            return self._current()
        return value if value in self.contexts else None

    @_recorded
    def cuCtxGetApiVersion(self, ctx: Any) -> tuple[Any, ...]:
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if self._context_or_current(ctx) is None:
            return _result(CUresult.CUDA_ERROR_INVALID_CONTEXT, 1)
        return CUresult(0), API_VERSION

    @_recorded
    def cuCtxGetId(self, ctx: Any) -> tuple[Any, ...]:
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        handle = self._context_or_current(ctx)
        if handle is None:
            return _result(CUresult.CUDA_ERROR_INVALID_CONTEXT, 1)
        return CUresult(0), 0x1_0000_0000 + self.contexts[handle].ident  # above 32 bits: a u64 must carry it

    def process_memory(self, device: int) -> int:
        """The bytes this fake process holds on `device`, as NVML's used_gpu_memory would say: its live contexts
        (a primary one while retained), allocations and module/library globals there."""
        contexts = sum(1 for c in self.contexts.values()
                       if c.device == device and (not c.primary or self.primary_refs[device] > 0))
        globals_ = sum(len(self.memory[p]) for p, d in self.global_device.items() if d == device)
        return contexts * self.context_bytes + self.used[device] + globals_

    # --- memory -------------------------------------------------------------------------------------------------
    def _alloc_on_current(self, size: int) -> tuple[Any, ...]:
        if err := self._context_error():
            return _result(err, 1)
        device = self._device_of_current()
        if int(size) == 0:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        if self.used[device] + int(size) > self.total_mem[device]:
            return _result(CUresult.CUDA_ERROR_OUT_OF_MEMORY, 1)
        return CUresult(0), CUdeviceptr(self._allocate(int(size), device))

    def _free(self, pointer: Any) -> int:
        if err := self._context_error():
            return err
        base = int(pointer) if pointer is not None else 0
        if base not in self.allocations:
            return CUresult.CUDA_ERROR_INVALID_VALUE
        self._drain()  # cuMemFree waits for the work that may use the memory
        device = self.allocations.pop(base)
        size = len(self.memory.pop(base))
        self.used[device] -= size
        if base in self.ipc_exported:  # the memfd its bytes moved to at an export (cuIpcGetMemHandle)
            os.close(self.ipc_exported.pop(base))
        pool = self.origin.get(base, (0, 0))[1]
        if pool in self.pools:  # its pool's memory in use goes down (a destroyed pool is gone already)
            self.pools[pool][7] -= size
        return 0

    @_recorded
    def cuMemAlloc(self, size: int) -> tuple[Any, ...]:
        if not self._context_error() and (err := self._unsafe_call_error()):
            return _result(err, 1)
        return self._alloc_on_current(size)

    @_recorded
    def cuMemFree(self, dptr: Any) -> tuple[Any, ...]:
        if int(dptr) == 0 and not self._context_error():  # frees nothing, as the driver answers (H100, 2026-11-24)
            return _result(CUresult(0))
        if not self._context_error() and (err := self._unsafe_call_error()):
            return _result(err)
        return _result(self._free(dptr))

    @_recorded
    def cuMemGetInfo(self) -> tuple[Any, ...]:
        if err := self._context_error():
            return _result(err, 2)
        device = self._device_of_current()
        return CUresult(0), self.total_mem[device] - self.used[device], self.total_mem[device]

    @_recorded
    def cuMemGetAddressRange(self, dptr: Any) -> tuple[Any, ...]:
        if err := self._context_error():
            return _result(err, 2)
        address = int(dptr) if dptr is not None else 0
        for base, data in self.memory.items():
            if base <= address < base + len(data):
                return CUresult(0), CUdeviceptr(base), len(data)
        return _result(CUresult.CUDA_ERROR_NOT_FOUND, 2)

    def _htod(self, dst: Any, src: Any, size: int, stream: Any = 0) -> int:
        if err := self._context_error():
            return err
        span = self._span(dst, int(size))
        if span is None or not self._stream_ok(stream):
            return CUresult.CUDA_ERROR_INVALID_VALUE if span is None else CUresult.CUDA_ERROR_INVALID_HANDLE
        if stream and self._capture_of(stream) is not None:  # a memcpy node: it reads the host memory when run
            def copy_in() -> None:
                data = self._host_read(src, int(size))
                if data is not None:
                    span[0][span[1]:span[1] + len(data)] = data
            return self._enqueue(stream, copy_in, CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMCPY)
        if stream or self.pending.get(0):  # (the legacy stream has queued work only behind a wait)
            self._drain(stream or 0)  # a copy from pageable memory on a stream runs after that stream's earlier work
        data = self._host_read(src, int(size))  # read once that work is done (it may write the source)
        if data is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE
        buffer, offset = span
        buffer[offset:offset + len(data)] = data
        self._note = {"data": plain(data), "dst": int(dst)}
        return 0

    def _dtoh(self, dst: Any, src: Any, size: int, stream: Any = 0) -> int:
        if err := self._context_error():
            return err
        span = self._span(src, int(size))
        if span is None or not self._stream_ok(stream):
            return CUresult.CUDA_ERROR_INVALID_VALUE if span is None else CUresult.CUDA_ERROR_INVALID_HANDLE
        if stream and self._capture_of(stream) is not None:  # a memcpy node: it writes the host memory when run
            def copy_out() -> None:
                self._host_write(dst, bytes(span[0][span[1]:span[1] + int(size)]))
            return self._enqueue(stream, copy_out, CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMCPY)
        if stream or self.pending.get(0):
            self._drain(stream or 0)  # ... and a copy to pageable memory too, before the call returns
        buffer, offset = span
        data = bytes(buffer[offset:offset + int(size)])
        if not self._host_write(dst, data):
            return CUresult.CUDA_ERROR_INVALID_VALUE
        self._note = {"data": plain(data), "src": int(src)}
        return 0

    def _dtod(self, dst: Any, src: Any, size: int, stream: Any = 0) -> int:
        if err := self._context_error():
            return err
        source, target = self._span(src, int(size)), self._span(dst, int(size))
        if source is None or target is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE
        if not self._stream_ok(stream):
            return CUresult.CUDA_ERROR_INVALID_HANDLE
        def copy() -> None:
            data = bytes(source[0][source[1]:source[1] + int(size)])
            target[0][target[1]:target[1] + int(size)] = data
        return self._enqueue(stream, copy, CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMCPY)

    @_recorded
    def cuMemcpyHtoD(self, dstDevice: Any, srcHost: Any, ByteCount: int) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._htod(dstDevice, srcHost, ByteCount))

    @_recorded
    def cuMemcpyHtoDAsync(self, dstDevice: Any, srcHost: Any, ByteCount: int, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._htod(dstDevice, srcHost, ByteCount, hStream))

    @_recorded
    def cuMemcpyDtoH(self, dstHost: Any, srcDevice: Any, ByteCount: int) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._dtoh(dstHost, srcDevice, ByteCount))

    @_recorded
    def cuMemcpyDtoHAsync(self, dstHost: Any, srcDevice: Any, ByteCount: int, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._dtoh(dstHost, srcDevice, ByteCount, hStream))

    @_recorded
    def cuMemcpyDtoD(self, dstDevice: Any, srcDevice: Any, ByteCount: int) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._dtod(dstDevice, srcDevice, ByteCount))

    @_recorded
    def cuMemcpyDtoDAsync(self, dstDevice: Any, srcDevice: Any, ByteCount: int, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._dtod(dstDevice, srcDevice, ByteCount, hStream))

    # --- structured copies (cuMemcpy2D/3D) -------------------------------------------------------------------------
    def _structured_copy(self, params: Any, stream: Any = None, two_d: bool = False, peer: bool = False) -> int:
        """A CUDA_MEMCPY2D, CUDA_MEMCPY3D or CUDA_MEMCPY3D_PEER copy. Each side as a memcpy node's (`_copy_side`:
        device memory whose reach lies in one allocation, host memory read and written through its address, UNIFIED
        by where the address lies, arrays CUDA_ERROR_NOT_SUPPORTED, rows or slices that overlap -- a pitch below
        XInBytes + WidthInBytes with more than one row, a slice height below Y + Height with more than one slice --
        CUDA_ERROR_INVALID_VALUE); LODs 0 and pitches at most CU_DEVICE_ATTRIBUTE_MAX_PITCH, as cuda.h says
        (INVALID_VALUE); a peer copy's contexts the fake's (CUDA_ERROR_INVALID_CONTEXT, the fake's rule: cuda.h names
        no code). An empty extent copies nothing. Device to device, it is the stream's work; with a host side it runs
        after the stream's earlier work and before the call returns (pageable memory's rule, as cuMemcpyHtoDAsync's);
        on a capturing stream it becomes a memcpy node."""
        if err := self._context_error():
            return err
        if params is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE
        if not self._stream_ok(stream):
            return CUresult.CUDA_ERROR_INVALID_HANDLE
        if two_d:  # the same copy with an empty third dimension
            flat = CUDA_MEMCPY3D()
            for name, value in vars(params).items():
                setattr(flat, name, value)
            flat.Depth = 1
            params = flat
        if peer and any(self._known_context(context) is None for context in (params.srcContext, params.dstContext)):
            return CUresult.CUDA_ERROR_INVALID_CONTEXT
        limit = self.device_attribute(11, self._device_of_current())  # CU_DEVICE_ATTRIBUTE_MAX_PITCH
        for prefix in ("src", "dst"):
            if int(getattr(params, prefix + "LOD")) or int(getattr(params, prefix + "Pitch")) > limit:
                return CUresult.CUDA_ERROR_INVALID_VALUE
        extent = (int(params.WidthInBytes), int(params.Height), int(params.Depth))
        if not all(extent):
            return 0
        err, src = self._copy_side(params, "src", extent)
        if src is None:
            return err
        err, dst = self._copy_side(params, "dst", extent)
        if dst is None:
            return err
        width, host = extent[0], CUmemorytype.CU_MEMORYTYPE_HOST

        def copy() -> None:
            rows: list[tuple[int, int, bytes | None]] = []
            for z in range(extent[2]):
                for y in range(extent[1]):
                    if src.kind == host:
                        rows.append((y, z, ctypes.string_at(src.row(y, z), width)))
                    else:
                        span = self._span(src.row(y, z), width)
                        rows.append((y, z, None if span is None else bytes(span[0][span[1]:span[1] + width])))
            for y, z, data in rows:
                if data is None:  # freed since: nothing to copy (a GPU would fault)
                    continue
                if dst.kind == host:
                    ctypes.memmove(dst.row(y, z), data, width)
                elif (span := self._span(dst.row(y, z), width)) is not None:
                    span[0][span[1]:span[1] + width] = data
        self._note = {"extent": list(extent)}
        if stream and self._capture_of(stream) is not None:
            return self._enqueue(stream, copy, CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMCPY)
        if host in (src.kind, dst.kind):
            if stream or self.pending.get(0):
                self._drain(stream or 0)
            copy()
            return 0
        return self._enqueue(stream, copy, CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMCPY)

    @_recorded
    def cuMemcpy2D(self, pCopy: Any) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._structured_copy(pCopy, two_d=True))

    @_recorded
    def cuMemcpy2DUnaligned(self, pCopy: Any) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._structured_copy(pCopy, two_d=True))

    @_recorded
    def cuMemcpy2DAsync(self, pCopy: Any, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._structured_copy(pCopy, hStream, two_d=True))

    @_recorded
    def cuMemcpy3D(self, pCopy: Any) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._structured_copy(pCopy))

    @_recorded
    def cuMemcpy3DAsync(self, pCopy: Any, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._structured_copy(pCopy, hStream))

    @_recorded
    def cuMemcpy3DPeer(self, pCopy: Any) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._structured_copy(pCopy, peer=True))

    @_recorded
    def cuMemcpy3DPeerAsync(self, pCopy: Any, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._structured_copy(pCopy, hStream, peer=True))

    def _memset(self, pointer: Any, value: int, count: int, width: int, stream: Any = 0) -> int:
        if err := self._context_error():
            return err
        if int(pointer) % width:
            return CUresult.CUDA_ERROR_INVALID_VALUE  # D16/D32 need an aligned pointer
        span = self._span(pointer, int(count) * width)
        if span is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE
        if not self._stream_ok(stream):
            return CUresult.CUDA_ERROR_INVALID_HANDLE
        buffer, offset = span
        pattern = int(value).to_bytes(width, "little") * int(count)

        def fill() -> None:
            buffer[offset:offset + len(pattern)] = pattern
        return self._enqueue(stream, fill, CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMSET)

    @_recorded
    def cuMemsetD8(self, dstDevice: Any, uc: int, N: int) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._memset(dstDevice, uc, N, 1))

    @_recorded
    def cuMemsetD16(self, dstDevice: Any, us: int, N: int) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._memset(dstDevice, us, N, 2))

    @_recorded
    def cuMemsetD32(self, dstDevice: Any, ui: int, N: int) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._memset(dstDevice, ui, N, 4))

    @_recorded
    def cuMemsetD8Async(self, dstDevice: Any, uc: int, N: int, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._memset(dstDevice, uc, N, 1, hStream))

    @_recorded
    def cuMemsetD16Async(self, dstDevice: Any, us: int, N: int, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._memset(dstDevice, us, N, 2, hStream))

    @_recorded
    def cuMemsetD32Async(self, dstDevice: Any, ui: int, N: int, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._memset(dstDevice, ui, N, 4, hStream))

    # --- memory pools -------------------------------------------------------------------------------------------
    def _pool_of(self, device: int) -> int:
        if device not in self.default_pool:
            handle = self._handle()
            self.pools[handle] = {1: 1, 2: 1, 3: 1, 4: 0, 5: 0, 6: 0, 7: 0, 8: 0, 9: 1, 10: 0, 11: device, 12: 1,
                                  13: 0, 14: 0, 15: 0}
            self.default_pool[device] = handle
        return self.default_pool[device]

    @_recorded
    def cuDeviceGetMemPool(self, dev: Any) -> tuple[Any, ...]:
        device = self._device(dev)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if device is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 1)
        return CUresult(0), CUmemoryPool(self._current_pool(device))

    @_recorded
    def cuDeviceGetDefaultMemPool(self, dev: Any) -> tuple[Any, ...]:
        device = self._device(dev)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if device is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 1)
        return CUresult(0), CUmemoryPool(self._pool_of(device))

    def _pool_alloc(self, size: int, pool: int, stream: Any) -> tuple[Any, ...]:
        """On the pool's device (which may not be the stream's: cuMemAllocFromPoolAsync's note), within its
        CU_MEMPOOL_ATTR_MAX_POOL_SIZE when one was given (else CUDA_ERROR_OUT_OF_MEMORY)."""
        if not self._stream_ok(stream):
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 1)
        if self._capture_of(stream) is not None:  # a memory-allocation node: not modelled
            return _result(CUresult.CUDA_ERROR_NOT_SUPPORTED, 1)
        attributes, size = self.pools[pool], int(size)
        device = attributes[11]
        if size == 0:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        limit = attributes[13] or self.total_mem[device]
        if self.used[device] + size > self.total_mem[device] or attributes[7] + size > limit:
            return _result(CUresult.CUDA_ERROR_OUT_OF_MEMORY, 1)
        base = self._allocate(size, device)
        self.origin[base] = (self.origin[base][0], pool)
        attributes[7] += size
        attributes[8] = max(attributes[8], attributes[7])
        return CUresult(0), CUdeviceptr(base)

    @_recorded
    def cuMemAllocAsync(self, bytesize: int, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        if err := self._context_error():
            return _result(err, 1)
        return self._pool_alloc(bytesize, self._current_pool(self._device_of_current()), hStream)

    @_recorded
    def cuMemAllocFromPoolAsync(self, bytesize: int, pool: Any, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        if err := self._context_error():
            return _result(err, 1)
        if int(pool) not in self.pools:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        return self._pool_alloc(bytesize, int(pool), hStream)

    @_recorded
    def cuMemFreeAsync(self, dptr: Any, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        if not self._stream_ok(hStream):
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE)
        if self._capture_of(hStream) is not None:  # a memory-free node: not modelled
            return _result(CUresult.CUDA_ERROR_NOT_SUPPORTED)
        return _result(self._free(dptr))

    @_recorded
    def cuMemPoolGetAttribute(self, pool: Any, attr: Any) -> tuple[Any, ...]:
        attribute = int(self._enum(attr, CUmemPool_attribute, "attr"))
        if int(pool) not in self.pools:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        value = self.pools[int(pool)][attribute]
        return CUresult(0), (cuuint64_t(value) if attribute in POOL_ATTRIBUTES_64 else value)

    @_recorded
    def cuMemPoolSetAttribute(self, pool: Any, attr: Any, value: Any) -> tuple[Any, ...]:
        attribute = int(self._enum(attr, CUmemPool_attribute, "attr"))
        wide = attribute in POOL_ATTRIBUTES_64
        if wide and not isinstance(value, cuuint64_t):
            raise AttributeError(f"'{type(value).__name__}' object has no attribute 'getPtr'")  # the wheel's words
        if not wide and not isinstance(value, int):
            raise TypeError(f"CUmemPool_attribute {attribute} takes an int, not {type(value).__name__}")
        if int(pool) not in self.pools:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        number = int(value)
        if (attribute in (1, 2, 3) and number in (0, 1)) or attribute == 4:
            self.pools[int(pool)][attribute] = number
        elif attribute in (6, 8) and number == 0:  # the high watermarks may only be reset
            self.pools[int(pool)][attribute] = self.pools[int(pool)][attribute - 1]
        else:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        return _result(0)

    # Pools made by the program and CUDA 13's pools by location. Device memory only: a pool or location in host
    # memory, and managed pools, are not modelled (CUDA_ERROR_NOT_SUPPORTED). A pool's own device always has
    # READWRITE access: cuMemPoolSetAccess of anything less for it is CUDA_ERROR_INVALID_DEVICE, the whole request
    # checked before any of it applies (as cuda-python's maintainers measured on an L40, cuda-python issue 2807).
    # The reserved-memory attributes stay 0 (a pool keeps nothing beyond what is in use), so trimming frees nothing.
    def _current_pool(self, device: int) -> int:
        return self.current_pool.get(device) or self._pool_of(device)

    def _pool_location(self, location: Any, bad_device: int) -> int:
        """The device of a CUmemLocation given to a pool call, or its CUresult negated (-1 for INVALID_VALUE...)."""
        if not isinstance(location, CUmemLocation):
            raise TypeError(f"Argument 'location' has incorrect type (expected CUmemLocation, got "
                            f"{type(location).__name__})")
        kind = int(self._enum(location.type, CUmemLocationType, "type"))
        if kind != CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE:
            return -int(CUresult.CUDA_ERROR_NOT_SUPPORTED if kind else CUresult.CUDA_ERROR_INVALID_VALUE)
        device = self._device(location.id)
        return -int(bad_device) if device is None else device

    def _pool_type(self, kind: Any) -> int:
        """0 for CU_MEM_ALLOCATION_TYPE_PINNED, else the CUresult of another allocation type."""
        value = int(self._enum(kind, CUmemAllocationType, "type"))
        if value == CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_MANAGED:
            return CUresult.CUDA_ERROR_NOT_SUPPORTED
        return 0 if value == CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED else CUresult.CUDA_ERROR_INVALID_VALUE

    @_recorded
    def cuMemPoolCreate(self, poolProps: Any) -> tuple[Any, ...]:  # noqa: N803
        if not isinstance(poolProps, CUmemPoolProps):
            raise TypeError(f"Argument 'poolProps' has incorrect type (expected CUmemPoolProps, got "
                            f"{type(poolProps).__name__})")
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if err := self._pool_type(poolProps.allocType):
            return _result(err, 1)
        handle_types = int(self._enum(poolProps.handleTypes, CUmemAllocationHandleType, "handleTypes"))
        device = self._pool_location(poolProps.location, CUresult.CUDA_ERROR_INVALID_VALUE)
        if device < 0:
            return _result(-device, 1)
        handle = self._handle()
        self.pools[handle] = {1: 1, 2: 1, 3: 1, 4: 0, 5: 0, 6: 0, 7: 0, 8: 0, 9: 1, 10: handle_types, 11: device,
                              12: 1, 13: int(poolProps.maxSize), 14: 0, 15: 0}
        self.pool_access[handle] = {}
        return CUresult(0), CUmemoryPool(handle)

    @_recorded
    def cuMemPoolDestroy(self, pool: Any) -> tuple[Any, ...]:
        """Its allocations stay valid until freed (cuda.h); a device's default pool cannot be destroyed."""
        handle = int(pool or 0)
        if handle not in self.pools or handle in self.default_pool.values():
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        del self.pools[handle]
        self.pool_access.pop(handle, None)
        for device in [d for d, p in self.current_pool.items() if p == handle]:
            del self.current_pool[device]  # its device's default pool is current again
        return _result(0)

    @_recorded
    def cuMemPoolTrimTo(self, pool: Any, minBytesToKeep: int) -> tuple[Any, ...]:  # noqa: N803
        if int(pool or 0) not in self.pools:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        return _result(0)

    @_recorded
    def cuMemPoolSetAccess(self, pool: Any, map: Any, count: int) -> tuple[Any, ...]:  # noqa: A002 - the wheel's
        handle = int(pool or 0)
        descs = list(map or [])
        if handle not in self.pools or int(count) != len(descs):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        granted = {}
        for item in descs:
            if not isinstance(item, CUmemAccessDesc):
                raise TypeError(f"Argument 'map' has incorrect type (expected CUmemAccessDesc, got "
                                f"{type(item).__name__})")
            flags = int(self._enum(item.flags, CUmemAccess_flags, "flags"))
            device = self._pool_location(item.location, CUresult.CUDA_ERROR_INVALID_VALUE)
            if device < 0:
                return _result(-device)
            if device == self.pools[handle][11] and flags != CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
                return _result(CUresult.CUDA_ERROR_INVALID_DEVICE)
            granted[device] = flags
        self.pool_access[handle].update(granted)
        return _result(0)

    def _pool_access_of(self, pool: int, device: int) -> int:
        if pool in self.pools and device == self.pools[pool][11]:
            return CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        return self.pool_access.get(pool, {}).get(device, CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE)

    @_recorded
    def cuMemPoolGetAccess(self, memPool: Any, location: Any) -> tuple[Any, ...]:  # noqa: N803
        handle = int(memPool or 0)
        if handle not in self.pools:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        device = self._pool_location(location, CUresult.CUDA_ERROR_INVALID_VALUE)
        if device < 0:
            return _result(-device, 1)
        if handle not in self.pool_access:
            self.pool_access[handle] = {}  # a default pool: its own device only, until granted
        return CUresult(0), CUmemAccess_flags(self._pool_access_of(handle, device))

    def _pool_by_location(self, location: Any, typename: Any, bad_device: int) -> tuple[int, int]:
        if not self.initialized:
            return CUresult.CUDA_ERROR_NOT_INITIALIZED, -1
        if err := self._pool_type(typename):
            return err, -1
        device = self._pool_location(location, bad_device)
        return (-device, -1) if device < 0 else (0, device)

    @_recorded
    def cuMemGetDefaultMemPool(self, location: Any, typename: Any) -> tuple[Any, ...]:
        err, device = self._pool_by_location(location, typename, CUresult.CUDA_ERROR_INVALID_DEVICE)
        return _result(err, 1) if err else (CUresult(0), CUmemoryPool(self._pool_of(device)))

    @_recorded
    def cuMemGetMemPool(self, location: Any, typename: Any) -> tuple[Any, ...]:
        err, device = self._pool_by_location(location, typename, CUresult.CUDA_ERROR_INVALID_VALUE)
        return _result(err, 1) if err else (CUresult(0), CUmemoryPool(self._current_pool(device)))

    def _set_pool(self, device: int, pool: Any) -> int:
        """A pool located on `device` becomes its current pool; another is CUDA_ERROR_INVALID_VALUE (cuda.h)."""
        handle = int(pool or 0)
        if handle not in self.pools or self.pools[handle][11] != device:
            return CUresult.CUDA_ERROR_INVALID_VALUE
        self.current_pool[device] = handle
        return 0

    @_recorded
    def cuMemSetMemPool(self, location: Any, typename: Any, pool: Any) -> tuple[Any, ...]:
        err, device = self._pool_by_location(location, typename, CUresult.CUDA_ERROR_INVALID_VALUE)
        return _result(err or self._set_pool(device, pool))

    @_recorded
    def cuDeviceSetMemPool(self, dev: Any, pool: Any) -> tuple[Any, ...]:
        device = self._device(dev)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        return _result(CUresult.CUDA_ERROR_INVALID_VALUE if device is None else self._set_pool(device, pool))

    @_recorded
    def cuMemAllocPitch(self, WidthInBytes: int, Height: int, ElementSizeBytes: int) -> tuple[Any, ...]:  # noqa: N803
        """Rows of WidthInBytes rounded up to PITCH_ALIGNMENT (the fake's pitch); element sizes 4, 8 or 16."""
        if err := self._context_error():
            return _result(err, 2)
        width, height = int(WidthInBytes), int(Height)
        if int(ElementSizeBytes) not in (4, 8, 16) or not width or not height:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 2)
        pitch = _align(width, PITCH_ALIGNMENT)
        result = self._alloc_on_current(pitch * height)
        return result + (pitch,) if int(result[0]) == 0 else _result(int(result[0]), 2)

    # --- the virtual-memory queries -----------------------------------------------------------------------------
    @_recorded
    def cuMemGetAccess(self, location: Any, ptr: Any) -> tuple[Any, ...]:
        """A mapped range's access for the device (cuMemSetAccess's, else none), a pool allocation's (its pool's);
        any other address (cuMemAlloc's, not checked on a GPU: the fake's choice) is CUDA_ERROR_INVALID_VALUE."""
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        device = self._pool_location(location, CUresult.CUDA_ERROR_INVALID_DEVICE)
        if device < 0:
            return _result(-device, 1)
        address = int(ptr or 0)
        for start, mapping in self.mappings.items():
            if start <= address < start + mapping.size:
                return CUresult(0), mapping.granted.get(device, 0)
        base = next((b for b, data in self.memory.items() if b <= address < b + max(len(data), 1)), -1)
        pool = self.origin.get(base, (0, 0))[1] if base in self.allocations else 0
        if not pool:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        if pool not in self.pools:  # a destroyed pool's allocation: its own device only
            own = self.allocations[base] == device
            return CUresult(0), int(CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE) if own else 0
        return CUresult(0), int(self._pool_access_of(pool, device))

    @_recorded
    def cuMemRetainAllocationHandle(self, addr: Any) -> tuple[Any, ...]:
        """The handle that mapped `addr` (any address inside a mapping), with one more reference to release."""
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        address = int(addr or 0)
        mapping = next((m for base, m in self.mappings.items() if base <= address < base + m.size), None)
        if mapping is None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        physical = self.physical[mapping.handle]
        physical.references += 1
        physical.released = False
        return CUresult(0), CUmemGenericAllocationHandle(mapping.handle)

    @_recorded
    def cuMemGetAllocationPropertiesFromHandle(self, handle: Any) -> tuple[Any, ...]:
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        physical = self.physical.get(int(handle or 0))
        if physical is None or physical.released:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        prop = CUmemAllocationProp()
        prop.type = CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.requestedHandleTypes = CUmemAllocationHandleType(physical.handle_types)
        prop.location.type, prop.location.id = CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE, physical.device
        compression, rdma, usage = physical.flags
        prop.allocFlags.compressionType, prop.allocFlags.gpuDirectRDMACapable, prop.allocFlags.usage = (
            compression, rdma, usage)
        return CUresult(0), prop

    # --- page-locked host memory ------------------------------------------------------------------------------
    @_recorded
    def cuMemHostRegister(self, p: Any, bytesize: int, Flags: int) -> tuple[Any, ...]:  # noqa: N803
        if err := self._context_error():
            return _result(err)
        address, size = int(p or 0), int(bytesize)
        if not address or not size or int(Flags) & ~0xF:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        if any(base < address + size and address < base + length for base, length in self.registered.items()):
            return _result(CUresult.CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
        self.registered[address] = size
        return _result(0)

    @_recorded
    def cuMemHostUnregister(self, p: Any) -> tuple[Any, ...]:
        if err := self._context_error():
            return _result(err)
        if self.registered.pop(int(p or 0), None) is None:
            return _result(CUresult.CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
        return _result(0)

    @_recorded
    def cuMemHostGetDevicePointer(self, p: Any, Flags: int) -> tuple[Any, ...]:  # noqa: N803
        """Registered memory maps at its own address (a GPU that can use host pointers for registered memory)."""
        if err := self._context_error():
            return _result(err, 1)
        address = int(p or 0)
        if int(Flags) or not any(base <= address < base + size for base, size in self.registered.items()):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        return CUresult(0), CUdeviceptr(address)

    # --- streams and events -------------------------------------------------------------------------------------
    @_recorded
    def cuStreamCreate(self, Flags: int) -> tuple[Any, ...]:  # noqa: N803
        return self._stream_create(Flags, 0)

    @_recorded
    def cuStreamCreateWithPriority(self, flags: int, priority: int) -> tuple[Any, ...]:
        return self._stream_create(flags, priority)

    def _stream_create(self, flags: int, priority: int) -> tuple[Any, ...]:
        if err := self._context_error():
            return _result(err, 1)
        if int(flags) & ~CU_STREAM_NON_BLOCKING:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        handle = self._handle()
        self.streams[handle] = (self._current(), int(flags), min(max(int(priority), -5), 0))  # type: ignore[assignment]
        self.stream_ids[handle] = STREAM_ID_BASE + 1 + len(self.stream_ids)
        return CUresult(0), CUstream(handle)

    def _stream_error(self, stream: Any) -> int:
        if err := self._context_error():
            return err
        return 0 if self._stream_ok(stream) else CUresult.CUDA_ERROR_INVALID_HANDLE

    @_recorded
    def cuStreamDestroy(self, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        if int(hStream) not in self.streams:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE)
        capture = self.captures.pop(int(hStream), None)
        if capture is not None and not capture.into:  # its capture ends with it, the graph discarded (not checked
            self._drop_graph(capture.graph)            # on a GPU; a graph captured into stays the caller's)
        self._drain(hStream)  # its work still completes
        del self.streams[int(hStream)]
        return _result(0)

    @_recorded
    def cuStreamSynchronize(self, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        if err := self._stream_error(hStream):
            return _result(err)
        if err := self._sync_capture_error(hStream):
            return _result(err)
        # the legacy stream waits for the blocking streams: all run
        return _result(self._drain(hStream if hStream else None))

    @_recorded
    def cuStreamQuery(self, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        if err := self._stream_error(hStream):
            return _result(err)
        if err := self._sync_capture_error(hStream):
            return _result(err)
        return _result(CUresult.CUDA_ERROR_NOT_READY if self.pending.get(int(hStream or 0)) else 0)

    @_recorded
    def cuStreamWaitEvent(self, hStream: Any, hEvent: Any, Flags: int) -> tuple[Any, ...]:  # noqa: N803
        """On a capturing stream: an event captured by the same capture adds nothing (the capture is one
        sequence of nodes), CU_EVENT_WAIT_EXTERNAL adds a wait-event node, and any other event is
        CUDA_ERROR_STREAM_CAPTURE_ISOLATION (the capture invalidated), or _MERGE for another capture's event.
        Outside a capture, an event of a capture still under way would join the stream to it: not modelled
        (CUDA_ERROR_NOT_SUPPORTED)."""
        if err := self._stream_error(hStream):
            return _result(err)
        if int(hEvent) not in self.events:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE)
        if int(Flags) not in (0, 1):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        event = self.events[int(hEvent)]
        captured = event.get("capture", 0)
        capture = self._capture_of(hStream)
        if capture is not None:
            if capture.status != CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
                return _result(CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
            if int(Flags) & CU_EVENT_WAIT_EXTERNAL:
                return _result(self._capture_node(capture, CUgraphNodeType.CU_GRAPH_NODE_TYPE_WAIT_EVENT,
                                                  lambda on: self._drain(event["stream"] or None)))
            if captured == capture.ident:
                return _result(0)
            self._invalidate([capture])
            return _result(CUresult.CUDA_ERROR_STREAM_CAPTURE_MERGE if captured
                           else CUresult.CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
        if captured:
            under_way = any(c.ident == captured for c in self.captures.values())
            return _result(CUresult.CUDA_ERROR_NOT_SUPPORTED if under_way else CUresult.CUDA_ERROR_CAPTURED_EVENT)
        self._drain(event["stream"] or None)
        return _result(0)

    @_recorded
    def cuStreamIsCapturing(self, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        """The legacy stream while a blocking stream of the context captures: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
        (cuda.h), which invalidates nothing."""
        if err := self._stream_error(hStream):
            return _result(err, 1)
        if not hStream and any(c.blocking for c in self._active_captures(self._current())):
            return _result(CUresult.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, 1)
        capture = self._capture_of(hStream)
        status = capture.status if capture is not None else 0
        return CUresult(0), CUstreamCaptureStatus(status)

    @_recorded
    def cuStreamGetCaptureInfo(self, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        """(status, id, graph, dependencies, edge data, count), as the wheel returns them: the id, graph and
        dependencies (the node captured last, if any, with a default edge) only while the capture is active;
        otherwise zeros and empty lists, as the wheel's zeroed outputs read when the driver fills nothing."""
        if err := self._stream_error(hStream):
            return _result(err, 6)
        if not hStream and any(c.blocking for c in self._active_captures(self._current())):
            return _result(CUresult.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, 6)
        capture = self._capture_of(hStream)
        if capture is None or capture.status != CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            status = CUstreamCaptureStatus(capture.status if capture is not None else 0)
            return CUresult(0), status, cuuint64_t(0), CUgraph(0), [], [], 0
        current = self._capture_deps(capture)
        dependencies = [CUgraphNode(node) for node, _word in current]
        return (CUresult(0), CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE, cuuint64_t(capture.ident),
                CUgraph(capture.graph), dependencies, [self._edge_object(word) for _node, word in current],
                len(dependencies))

    @_recorded
    def cuStreamBeginCapture(self, hStream: Any, mode: Any) -> tuple[Any, ...]:  # noqa: N803
        """The legacy stream cannot capture (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), a capturing stream cannot
        begin again (CUDA_ERROR_ILLEGAL_STATE): as hip-tests' hipStreamBeginCapture negative cases expect of
        CUDA on NVIDIA (catch/unit/graph), not checked on a GPU here."""
        which = int(self._enum(mode, CUstreamCaptureMode, "mode"))
        if err := self._stream_error(hStream):
            return _result(err)
        if not hStream:
            return _result(CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
        if self._capture_of(hStream) is not None:
            return _result(CUresult.CUDA_ERROR_ILLEGAL_STATE)
        self._next_capture += 1
        graph = self._handle()
        self.graphs[graph] = []
        context = self.streams[int(hStream)][0]
        self.captures[int(hStream)] = _Capture(self._next_capture, graph, which, threading.get_ident(), context,
                                               not self._nonblocking(hStream))
        return _result(0)

    @_recorded
    def cuStreamEndCapture(self, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        """The captured graph, the caller's from now on. A stream not capturing (the legacy stream included)
        answers CUDA_ERROR_ILLEGAL_STATE (hip-tests' expectation of CUDA, not checked on a GPU here); an
        invalidated capture ends with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and no graph; one that did not begin
        RELAXED must end on the thread that began it (CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, still capturing)."""
        if err := self._stream_error(hStream):
            return _result(err, 1)
        capture = self._capture_of(hStream)
        if capture is None:
            return _result(CUresult.CUDA_ERROR_ILLEGAL_STATE, 1)
        if (capture.mode != CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
                and capture.thread != threading.get_ident()):
            return _result(CUresult.CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, 1)
        del self.captures[int(hStream)]
        if capture.status != CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            if not capture.into:  # a graph captured into stays the caller's, with what was captured
                self._drop_graph(capture.graph)
            return _result(CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, 1)
        return CUresult(0), CUgraph(capture.graph)

    @_recorded
    def cuThreadExchangeStreamCaptureMode(self, mode: Any) -> tuple[Any, ...]:
        """The calling thread's mode becomes `mode`; the answer is the one it had (GLOBAL at first)."""
        which = self._enum(mode, CUstreamCaptureMode, "mode")
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        me = threading.get_ident()
        previous = self.capture_modes.get(me, CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
        self.capture_modes[me] = int(which)
        return CUresult(0), CUstreamCaptureMode(previous)

    @_recorded
    def cuStreamGetFlags(self, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        if err := self._stream_error(hStream):
            return _result(err, 1)
        return CUresult(0), self.streams[int(hStream)][1] if hStream else 0

    @_recorded
    def cuStreamGetPriority(self, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        if err := self._stream_error(hStream):
            return _result(err, 1)
        return CUresult(0), self.streams[int(hStream)][2] if hStream else 0

    @_recorded
    def cuStreamGetId(self, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        """STREAM_ID_BASE for the legacy stream, then one more per stream created, in order."""
        if err := self._stream_error(hStream):
            return _result(err, 1)
        return CUresult(0), self.stream_ids[int(hStream)] if hStream else STREAM_ID_BASE

    @_recorded
    def cuStreamGetCtx(self, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        if err := self._stream_error(hStream):
            return _result(err, 1)
        stream = int(hStream) if hStream is not None else 0
        return CUresult(0), CUcontext(self.streams[stream][0] if stream else self._current())

    @_recorded
    def cuEventCreate(self, Flags: int) -> tuple[Any, ...]:  # noqa: N803
        if err := self._context_error():
            return _result(err, 1)
        if int(Flags) & ~0xF:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        handle = self._handle()
        # "capture": the capture that recorded it last (0: none), which makes it a captured event
        self.events[handle] = {"flags": int(Flags), "recorded": 0, "stream": 0, "capture": 0}
        return CUresult(0), CUevent(handle)

    def _event_record(self, event: Any, stream: Any, flags: int) -> int:
        """cuEventRecord(WithFlags). On a capturing stream a plain record adds no node: the event becomes a
        captured event (a point of that capture); CU_EVENT_RECORD_EXTERNAL adds an event-record node, which
        records the event on the launch stream when the graph runs. Outside a capture CU_EVENT_RECORD_EXTERNAL is
        refused (CUDA_ERROR_INVALID_VALUE: "invalid outside of stream capture", cuda.h; not checked on a GPU)."""
        if int(event) not in self.events:
            return CUresult.CUDA_ERROR_INVALID_HANDLE
        if err := self._stream_error(stream):
            return err
        if int(flags) not in (0, CU_EVENT_RECORD_EXTERNAL):
            return CUresult.CUDA_ERROR_INVALID_VALUE
        record = self.events[int(event)]
        capture = self._capture_of(stream)
        if capture is not None:
            if capture.status != CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
                return CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
            if int(flags) & CU_EVENT_RECORD_EXTERNAL:
                return self._capture_node(capture, CUgraphNodeType.CU_GRAPH_NODE_TYPE_EVENT_RECORD,
                                          lambda on: self._mark(record, on))
            record["capture"] = capture.ident
            return 0
        if int(flags) & CU_EVENT_RECORD_EXTERNAL:
            return CUresult.CUDA_ERROR_INVALID_VALUE
        self._mark(record, stream)
        return 0

    def _mark(self, record: dict[str, int], stream: Any) -> None:
        self._clock += 1
        record.update(recorded=self._clock, stream=int(stream or 0), capture=0)

    @_recorded
    def cuEventRecord(self, hEvent: Any, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        return _result(self._event_record(hEvent, hStream, 0))

    @_recorded
    def cuEventRecordWithFlags(self, hEvent: Any, hStream: Any, flags: int) -> tuple[Any, ...]:  # noqa: N803
        """Flags 0 (as cuEventRecord) or CU_EVENT_RECORD_EXTERNAL; any other: CUDA_ERROR_INVALID_VALUE."""
        return _result(self._event_record(hEvent, hStream, flags))

    @_recorded
    def cuEventSynchronize(self, hEvent: Any) -> tuple[Any, ...]:  # noqa: N803
        if int(hEvent) not in self.events:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE)
        if self.events[int(hEvent)].get("capture"):
            return _result(CUresult.CUDA_ERROR_CAPTURED_EVENT)
        return _result(self._drain(self.events[int(hEvent)]["stream"] or None))

    @_recorded
    def cuEventQuery(self, hEvent: Any) -> tuple[Any, ...]:  # noqa: N803
        if int(hEvent) not in self.events:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE)
        return _result(CUresult.CUDA_ERROR_CAPTURED_EVENT if self.events[int(hEvent)].get("capture") else 0)

    @_recorded
    def cuEventElapsedTime(self, hStart: Any, hEnd: Any) -> tuple[Any, ...]:  # noqa: N803
        """Half a millisecond per event recorded in between: exact in a float."""
        start, end = self.events.get(int(hStart)), self.events.get(int(hEnd))
        if start is None or end is None or (start["flags"] | end["flags"]) & CU_EVENT_DISABLE_TIMING:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 1)
        if not start["recorded"] or not end["recorded"]:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 1)
        return CUresult(0), (end["recorded"] - start["recorded"]) * 0.5

    @_recorded
    def cuEventDestroy(self, hEvent: Any) -> tuple[Any, ...]:  # noqa: N803
        if self.events.pop(int(hEvent), None) is None:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE)
        return _result(0)

    # --- graphs ---------------------------------------------------------------------------------------------------
    # Graphs made by stream capture (or empty ones from cuGraphCreate), their clones and executable instances. A
    # graph is its nodes in capture order (a captured stream is one chain of dependencies); an executable graph
    # holds the nodes as they were when it was instantiated. Unknown graphs, executable graphs and nodes answer
    # CUDA_ERROR_INVALID_VALUE, the error cuda.h documents for each of these calls.
    def _graph(self, graph: Any) -> list[int] | None:
        return self.graphs.get(int(graph or 0))

    def _capturing_graph(self, graph: int) -> bool:
        return any(c.graph == graph for c in self.captures.values())

    @_recorded
    def cuGraphCreate(self, flags: int) -> tuple[Any, ...]:
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if int(flags):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)  # "must be 0"
        handle = self._handle()
        self.graphs[handle] = []
        return CUresult(0), CUgraph(handle)

    @_recorded
    def cuGraphDestroy(self, hGraph: Any) -> tuple[Any, ...]:  # noqa: N803
        """A graph a capture is still building is not the caller's to destroy (cuStreamGetCaptureInfo:
        "operations other than destroy ... are permitted"), nor a conditional node's body graph (the node owns it),
        nor a child graph moved into its node (cuda.h: it "cannot be ... independently destroyed"; it goes when its
        node does): CUDA_ERROR_INVALID_VALUE here (the one error cuGraphDestroy documents), not checked on a GPU."""
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        if self._graph(hGraph) is None or self._capturing_graph(int(hGraph)) or self._held(int(hGraph)):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        self._drop_graph(int(hGraph))
        return _result(0)

    @_recorded
    def cuGraphClone(self, originalGraph: Any) -> tuple[Any, ...]:  # noqa: N803
        """A new graph with a new node for each of the original's, doing the same."""
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if self._graph(originalGraph) is None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        if self._memory_nodes(int(originalGraph)):  # cuda.h: such a graph "cannot be cloned" (the code: the fake's)
            return _result(CUresult.CUDA_ERROR_NOT_SUPPORTED, 1)
        return CUresult(0), CUgraph(self._clone_graph(int(originalGraph)))

    def _clone_graph(self, original: int) -> int:
        """A new graph with a new node for each of the original's, doing the same, and the same edges (a child
        graph node's child graph cloned too)."""
        handle = self._handle()
        self.graphs[handle] = []
        copies: dict[int, int] = {}
        for node in self.graphs[original]:
            copy = copies[node] = self._handle()
            found = self.nodes[node]
            if isinstance(found.params, _ChildNode):
                found = self._child_node(self._clone_graph(found.params.graph))
            elif isinstance(found.params, _ConditionalNode):  # its bodies cloned too, the clone's own
                made = found.params
                found = self._conditional_node(copy, _ConditionalNode(
                    made.handle, made.kind, tuple(self._clone_graph(b) for b in made.bodies), made.context))
            self.nodes[copy] = found
            self.node_graph[copy] = handle
            self.graphs[handle].append(copy)
        self.graph_edges[handle] = [(copies[a], copies[b], word) for a, b, word in self.graph_edges.get(original, [])]
        return handle

    @_recorded
    def cuGraphNodeGetType(self, hNode: Any) -> tuple[Any, ...]:  # noqa: N803
        node = self.nodes.get(int(hNode or 0))
        if node is None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        return CUresult(0), CUgraphNodeType(node.kind)

    @_recorded
    def cuGraphInstantiate(self, hGraph: Any, flags: int) -> tuple[Any, ...]:  # noqa: N803
        """Flags: CUgraphInstantiate_flags (DEVICE_LAUNCH with AUTO_FREE_ON_LAUNCH is refused, as cuda.h says);
        UPLOAD uploads nothing, as cuGraphUpload."""
        err, handle, _result_out = self._instantiate(hGraph, int(flags))
        return _result(err, 1) if err else (CUresult(0), CUgraphExec(handle))

    def _instantiate(self, graph: Any, value: int) -> tuple[int, int, int]:
        """(0 or the error, the executable graph, the CUgraphInstantiateResult cuGraphInstantiateWithParams says).
        A graph with memory nodes has one executable graph at a time (cuda.h; INVALID_VALUE, the fake's choice)."""
        if err := self._context_error():
            return err, 0, CUgraphInstantiateResult.CUDA_GRAPH_INSTANTIATE_ERROR
        nodes = self._graph(graph)
        invalid = CUresult.CUDA_ERROR_INVALID_VALUE, 0, CUgraphInstantiateResult.CUDA_GRAPH_INSTANTIATE_ERROR
        if nodes is None or value & ~0xF or value & 5 == 5:
            return invalid
        if int(graph) in self.moved_owner:  # cuda.h: a moved graph "cannot be independently instantiated"
            return invalid
        if self._memory_nodes(int(graph)) and any(e.graph == int(graph) for e in self.execs.values()):
            return invalid
        order = self._topological(int(graph))
        if order is None:  # a cycle (cuGraphAddDependencies does not look for one here; not checked on a GPU)
            return (CUresult.CUDA_ERROR_INVALID_VALUE, 0,
                    CUgraphInstantiateResult.CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE)
        if self._endless(int(graph)):  # a WHILE the fake would run forever: not modelled
            return CUresult.CUDA_ERROR_NOT_SUPPORTED, 0, CUgraphInstantiateResult.CUDA_GRAPH_INSTANTIATE_ERROR
        handle = self._handle()
        inner: dict[int, tuple[list[_GraphNode], int]] = {}
        parts = [self._frozen(n, inner) for n in nodes]
        self.execs[handle] = _GraphExec(tuple(parts[i] for i in order), value, members=tuple(nodes),
                                        order=tuple(order), parts=parts, deps=self._member_deps(int(graph)),
                                        inner=inner, graph=int(graph))
        return 0, handle, CUgraphInstantiateResult.CUDA_GRAPH_INSTANTIATE_SUCCESS

    @_recorded
    def cuGraphExecDestroy(self, hGraphExec: Any) -> tuple[Any, ...]:  # noqa: N803
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        if self.execs.pop(int(hGraphExec or 0), None) is None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        return _result(0)

    def _graph_exec_on(self, graph_exec: Any, stream: Any) -> tuple[int, _GraphExec | None]:
        if err := self._context_error():
            return err, None
        found = self.execs.get(int(graph_exec or 0))
        if found is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        if not self._stream_ok(stream):
            return CUresult.CUDA_ERROR_INVALID_HANDLE, None
        return 0, found

    @_recorded
    def cuGraphLaunch(self, hGraphExec: Any, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        """Each node's work queued on `hStream` in order, as if its call were made on that stream now (so under
        the stream rules: at once on a blocking stream, when waited for on a non-blocking one). A launch is
        ordered after the executable graph's previous one: launched on another stream, that one's queued work
        is completed first (an earlier schedule CUDA allows). On a capturing stream the launch is captured as one
        child-graph node."""
        err, found = self._graph_exec_on(hGraphExec, hStream)
        if found is None:
            return _result(err)
        nodes = found.nodes
        capture = self._capture_of(hStream)
        if capture is not None:
            return _result(self._capture_node(capture, CUgraphNodeType.CU_GRAPH_NODE_TYPE_GRAPH,
                                              lambda on: [node.replay(on) for node in nodes]))
        key = int(hStream or 0)
        if found.stream is not None and found.stream != key and self.pending.get(found.stream):
            self._drain(found.stream)
        found.stream = key
        for node in nodes:
            node.replay(hStream)
        return _result(0)

    @_recorded
    def cuGraphUpload(self, hGraphExec: Any, hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        """Checks its arguments; there is nothing to upload."""
        err, _found = self._graph_exec_on(hGraphExec, hStream)
        return _result(err)

    # --- graphs built node by node --------------------------------------------------------------------------------
    # cuGraphAdd*Node, dependencies, queries and parameter updates (see the module docstring). A node added here
    # keeps its parameters (_KernelNode, _MemsetNode, _CopyNode, _ChildNode, _EventNode) and replays them when its
    # executable graph runs; a graph's edges are kept in the order they were added (a capture's chain included), and
    # the queries answer in that order, and nodes in the order they were added. Where CUDA's documentation names no
    # rule the fake chose one, said at each method; none of it was checked on a GPU.
    NODE_KERNEL, NODE_MEMCPY, NODE_MEMSET = (CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL,
                                             CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMCPY,
                                             CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMSET)
    NODE_HOST = CUgraphNodeType.CU_GRAPH_NODE_TYPE_HOST
    NODE_BATCH_MEM_OP = CUgraphNodeType.CU_GRAPH_NODE_TYPE_BATCH_MEM_OP

    def _topological(self, graph: int) -> list[int] | None:
        """The indices of `graph`'s nodes in an order that runs every node after its dependencies (the earliest
        added first among those ready); None for a cycle."""
        nodes = self.graphs[graph]
        index = {node: i for i, node in enumerate(nodes)}
        incoming: list[set[int]] = [set() for _ in nodes]
        for a, b, _word in self.graph_edges.get(graph, []):
            incoming[index[b]].add(index[a])
        placed: list[int] = []
        done: set[int] = set()
        while len(placed) < len(nodes):
            ready = next((i for i in range(len(nodes)) if i not in done and incoming[i] <= done), None)
            if ready is None:
                return None
            placed.append(ready)
            done.add(ready)
        return placed

    def _ordered(self, graph: int) -> list[int]:
        order = self._topological(graph)
        nodes = self.graphs[graph]
        return [nodes[i] for i in order] if order is not None else list(nodes)

    def _member_deps(self, graph: int) -> tuple[tuple[tuple[int, int], ...], ...]:
        """Each node's dependencies, by index: (the dependency's index, the edge's word), in the order added."""
        nodes = self.graphs[graph]
        index = {node: i for i, node in enumerate(nodes)}
        edges = self.graph_edges.get(graph, [])
        return tuple(tuple((index[a], word) for a, b, word in edges if b == node) for node in nodes)

    def _frozen(self, node: int, inner: dict[int, tuple[list[_GraphNode], int]] | None = None) -> _GraphNode:
        """What `node` runs in an executable graph: itself, or for a child graph node, its child graph's nodes as
        they are now, for a conditional node its bodies' (an executable graph keeps what it was instantiated from).
        The nodes of a child graph moved into its node are entered in `inner` (_GraphExec.inner), whose lists the
        child graph node runs from, so that cuGraphExec*SetParams can change them."""
        found = self.nodes[node]
        if isinstance(found.params, _ConditionalNode):
            bodies = [[self._frozen(n) for n in self._ordered(body)] for body in found.params.bodies]
            return _GraphNode(found.kind, self._conditional_replay(found.params, bodies), found.params)
        if not isinstance(found.params, _ChildNode):
            return found
        child = found.params.graph
        if found.params.moved and inner is not None:
            members = self.graphs[child]
            parts = [self._frozen(n, inner) for n in members]
            inner.update((n, (parts, i)) for i, n in enumerate(members))
            order = self._topological(child) or range(len(members))
            return _GraphNode(found.kind, lambda on: [parts[i].replay(on) for i in order], found.params)
        frozen = [self._frozen(n) for n in self._ordered(child)]
        return _GraphNode(found.kind, lambda on: [part.replay(on) for part in frozen], found.params)

    def _conditional_replay(self, made: _ConditionalNode, bodies: list[list[_GraphNode]]) -> Callable[[Any], object]:
        """What a conditional node runs, given each body's nodes in order: with the handle's value at launch `v`
        (_ConditionalHandle.at_launch), IF runs body 0 if v, else body 1 if it has one; WHILE runs body 0 while v
        (never, since no kernel of the fake changes v: cuGraphInstantiate refuses a WHILE that would run); SWITCH
        runs body v if there is one."""
        def replay(on: Any) -> None:
            handle = self.conditional_handles.get(made.handle)
            value = handle.at_launch if handle is not None else 0
            kind = CUgraphConditionalNodeType(made.kind)
            if kind == CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_IF:
                chosen = 0 if value else 1
            elif kind == CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_SWITCH:
                chosen = value
            else:
                chosen = 0 if value else len(bodies)
            for part in bodies[chosen] if chosen < len(bodies) else []:
                part.replay(on)
        return replay

    def _conditional_node(self, node: int, made: _ConditionalNode) -> _GraphNode:
        """A conditional node `node` owning `made.bodies`, its bodies' nodes as they are when it runs."""
        for body in made.bodies:
            self.body_owner[body] = node

        def replay(on: Any) -> None:
            bodies = [[self._frozen(n) for n in self._ordered(body)] for body in made.bodies]
            self._conditional_replay(made, bodies)(on)
        return _GraphNode(CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL, replay, made)

    def _endless(self, graph: int) -> bool:
        """Whether `graph` (or a graph inside it) holds a WHILE node whose handle is nonzero at launch: no kernel of
        the fake clears it, so it would run forever."""
        for node in self.graphs.get(graph, []):
            made = self.nodes[node].params
            if isinstance(made, _ChildNode) and self._endless(made.graph):
                return True
            if isinstance(made, _ConditionalNode):
                handle = self.conditional_handles.get(made.handle)
                if made.kind == CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE and handle and handle.at_launch:
                    return True
                if any(self._endless(body) for body in made.bodies):
                    return True
        return False

    def _child_node(self, graph: int, moved: bool = False) -> _GraphNode:
        """A child graph node running `graph` (its own clone, or the graph moved into it), its nodes as they are when
        it runs."""
        return _GraphNode(CUgraphNodeType.CU_GRAPH_NODE_TYPE_GRAPH,
                          lambda on: [self._frozen(n).replay(on) for n in self._ordered(graph)],
                          _ChildNode(graph, moved))

    def _held(self, graph: int) -> bool:
        """Whether a node owns `graph` (a conditional node's body, a child graph moved into its node)."""
        return graph in self.body_owner or graph in self.moved_owner

    def _holders(self, graph: int) -> set[int]:
        """`graph` and every graph it is held in (as a body or a moved child graph), outward."""
        found: set[int] = set()
        while graph and graph not in found:
            found.add(graph)
            owner = self.body_owner.get(graph) or self.moved_owner.get(graph)
            graph = self.node_graph.get(owner, 0) if owner else 0
        return found

    @staticmethod
    def _node_list(value: Any, count: int, name: str) -> list[int] | None:
        """A list of CUgraphNode as the wheel takes one (TypeError for anything else, RuntimeError when shorter
        than `count`): its first `count` handles; None for None (NULL)."""
        if value is None:
            return None
        if not isinstance(value, list | tuple) or not all(isinstance(v, CUgraphNode) for v in value):
            raise TypeError(f"Argument '{name}' is not instance of type (expected tuple[cydriver.CUgraphNode,] or "
                            f"list[cydriver.CUgraphNode,]")
        if count > len(value):
            raise RuntimeError(f"List is too small: {len(value)} < {count}")
        return [int(v) for v in value[:count]]

    def _node_inputs(self, graph: Any, dependencies: Any, count: int) -> tuple[int, list[int]]:
        """(0 or the error, the dependencies) of a node to be added to `graph`: a known graph, each dependency one
        of its nodes, none twice (cuda.h: "may not have any duplicate entries")."""
        deps = self._node_list(dependencies, int(count), "dependencies")
        if not self.initialized:
            return CUresult.CUDA_ERROR_NOT_INITIALIZED, []
        key = int(graph or 0)
        if key not in self.graphs or (deps is None and int(count)):
            return CUresult.CUDA_ERROR_INVALID_VALUE, []
        deps = deps or []
        if len(set(deps)) != len(deps) or any(self.node_graph.get(d) != key for d in deps):
            return CUresult.CUDA_ERROR_INVALID_VALUE, []
        return 0, deps

    def _add_node(self, graph: Any, deps: list[int], node: _GraphNode, words: list[int] | None = None,
                  handle: int = 0) -> tuple[Any, ...]:
        """`node` added to `graph` after `deps` (edge data `words`: default edges where None), as `handle` if one
        was taken for it already."""
        handle = handle or self._handle()
        key = int(graph)
        self.nodes[handle] = node
        self.node_graph[handle] = key
        self.graphs[key].append(handle)
        self.graph_edges.setdefault(key, []).extend(
            (d, handle, w) for d, w in zip(deps, words if words is not None else [0] * len(deps), strict=True))
        return CUresult(0), CUgraphNode(handle)

    def _node_context(self, ctx: Any) -> int:
        """A node's context: a known one, or NULL with a current context (CUDA_ERROR_INVALID_CONTEXT otherwise)."""
        value = int(ctx or 0)
        if value:
            return 0 if value in self.contexts else CUresult.CUDA_ERROR_INVALID_CONTEXT
        return 0 if self._current() is not None else CUresult.CUDA_ERROR_INVALID_CONTEXT

    def _kernel_node(self, params: Any) -> tuple[int, _GraphNode | None]:
        """A CUDA_KERNEL_NODE_PARAMS as the driver takes it: `func` (a CUfunction, or a CUkernel as one), else
        `kern` in `ctx` (NULL: the current context); dimensions as a launch's; the parameters from `kernelParams`
        (by the kernel's layout) or `extra`, copied now, as cuda.h says. An unknown function or kernel is
        CUDA_ERROR_INVALID_VALUE, the one error cuGraphAddKernelNode documents. Running it adds for ADD_KERNEL
        (words resolved when it runs: an address with no memory behind it then changes nothing, where a GPU would
        fault) and does nothing for any other kernel."""
        if params is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        function, kernel, context = int(params.func or 0), int(params.kern or 0), int(params.ctx or 0)
        if function:
            found, handle, context = self.functions.get(function) or self.kernels.get(function), function, 0
        else:
            found, handle = self.kernels.get(kernel), kernel
            if err := self._node_context(context):
                return err, None
        if found is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        grid = (int(params.gridDimX), int(params.gridDimY), int(params.gridDimZ))
        block = (int(params.blockDimX), int(params.blockDimY), int(params.blockDimZ))
        shared = int(params.sharedMemBytes)
        if min(grid + block) <= 0 or block[0] * block[1] * block[2] > 1024 or shared > 228 * 1024:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        kernel_params, extra = int(params.kernelParams or 0), int(params.extra or 0)
        layout = found.layout
        if kernel_params and extra:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        if extra:
            error, decoded = self.decode_extra(extra)
            if error is not None or decoded is None:
                return error or CUresult.CUDA_ERROR_INVALID_VALUE, None
            packed = decoded
        elif kernel_params:
            if layout is None:
                return CUresult.CUDA_ERROR_NOT_SUPPORTED, None  # an ELF image: its layout is not known here
            pointers = (ctypes.c_void_p * max(len(layout), 1)).from_address(kernel_params)
            buffer = bytearray(max((o + s for o, s in layout), default=0))
            for (offset, size), pointer in zip(layout, pointers, strict=False):
                if not pointer:
                    return CUresult.CUDA_ERROR_INVALID_VALUE, None
                buffer[offset:offset + size] = ctypes.string_at(pointer, size)
            packed = bytes(buffer)
        elif layout:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None  # parameters, and none given
        else:
            packed = b""
        form = 2 if extra else 1 if kernel_params else 0
        made = _KernelNode(handle, context, grid, block, shared, packed, found.name, form, not function)
        if found.name == ADD_KERNEL:
            replay: Callable[[Any], object] = lambda on: self._add_kernel(made.packed, on)
        else:
            replay = lambda on: self._enqueue(on, lambda: None, self.NODE_KERNEL)
        return 0, _GraphNode(self.NODE_KERNEL, replay, made)

    def _memset_node(self, params: Any, context: int) -> tuple[int, _GraphNode | None]:
        """A CUDA_MEMSET_NODE_PARAMS: element size 1, 2 or 4, dst aligned to it, width and height not 0 (the fake
        refuses an empty memset), rows of `pitch` bytes (at least a row's) all in one allocation; the value is cut
        to the element's width, as cuMemsetD8/D16 take it."""
        if params is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        dst, pitch, value = int(params.dst or 0), int(params.pitch), int(params.value)
        element, width, height = int(params.elementSize), int(params.width), int(params.height)
        row = width * element
        if element not in (1, 2, 4) or not width or not height or dst % element or (height > 1 and pitch < row):
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        if self._span(dst, pitch * (height - 1) + row) is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        made = _MemsetNode(dst, pitch, value, element, width, height, context)
        pattern = (value & ((1 << 8 * element) - 1)).to_bytes(element, "little") * width

        def fill() -> None:
            for y in range(height):
                span = self._span(dst + y * pitch, row)
                if span is not None:  # freed since: nothing to write (a GPU would fault)
                    span[0][span[1]:span[1] + row] = pattern
        return 0, _GraphNode(self.NODE_MEMSET, lambda on: self._enqueue(on, fill, self.NODE_MEMSET), made)

    def _copy_side(self, params: Any, prefix: str, extent: tuple[int, int, int]) -> tuple[int, _CopySide | None]:
        width, height, depth = extent
        kind = int(getattr(params, prefix + "MemoryType") or 0)
        x, y, z = (int(getattr(params, prefix + name)) for name in ("XInBytes", "Y", "Z"))
        pitch, rows = int(getattr(params, prefix + "Pitch")), int(getattr(params, prefix + "Height"))
        if (height > 1 or depth > 1) and pitch < x + width or depth > 1 and rows < y + height:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None  # rows or slices that overlap
        offset = x + y * pitch + z * pitch * rows
        reach = (depth - 1) * pitch * rows + (height - 1) * pitch + width
        if kind == CUmemorytype.CU_MEMORYTYPE_ARRAY:
            return CUresult.CUDA_ERROR_NOT_SUPPORTED, None  # the fake has no arrays
        if kind == CUmemorytype.CU_MEMORYTYPE_HOST:
            address = int(getattr(params, prefix + "Host") or 0)
            return (0, _CopySide(kind, address, x, y, z, pitch, rows)) if address else (
                CUresult.CUDA_ERROR_INVALID_VALUE, None)
        address = int(getattr(params, prefix + "Device") or 0)
        start, given = address + offset, kind
        if kind == CUmemorytype.CU_MEMORYTYPE_UNIFIED:  # where the address lies: device memory, or registered
            if self._span(start, reach) is not None:
                kind = CUmemorytype.CU_MEMORYTYPE_DEVICE
            elif any(base <= start and start + reach <= base + size for base, size in self.registered.items()):
                return 0, _CopySide(CUmemorytype.CU_MEMORYTYPE_HOST, address, x, y, z, pitch, rows, given)
            else:
                return CUresult.CUDA_ERROR_INVALID_VALUE, None
        if kind != CUmemorytype.CU_MEMORYTYPE_DEVICE or self._span(start, reach) is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        return 0, _CopySide(kind, address, x, y, z, pitch, rows, given)

    def _memcpy_node(self, params: Any, context: int) -> tuple[int, _GraphNode | None]:
        """A CUDA_MEMCPY3D between device memory (each side's reach in one allocation) and host memory (read and
        written through its address when the node runs), with UNIFIED resolved by where the address lies; an empty
        extent is refused (the fake's choice: cuda.h refuses it for cuGraphExecMemcpyNodeSetParams), arrays are
        not modelled (CUDA_ERROR_NOT_SUPPORTED)."""
        if params is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        extent = (int(params.WidthInBytes), int(params.Height), int(params.Depth))
        if not all(extent):
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        err, src = self._copy_side(params, "src", extent)
        if src is None:
            return err, None
        err, dst = self._copy_side(params, "dst", extent)
        if dst is None:
            return err, None
        made = _CopyNode(src, dst, *extent, context)
        width = extent[0]

        def read(side: _CopySide, y: int, z: int) -> bytes | None:
            if side.kind == CUmemorytype.CU_MEMORYTYPE_HOST:
                return ctypes.string_at(side.row(y, z), width)
            span = self._span(side.row(y, z), width)
            return None if span is None else bytes(span[0][span[1]:span[1] + width])

        def write(side: _CopySide, y: int, z: int, data: bytes) -> None:
            if side.kind == CUmemorytype.CU_MEMORYTYPE_HOST:
                ctypes.memmove(side.row(y, z), data, width)
                return
            span = self._span(side.row(y, z), width)
            if span is not None:
                span[0][span[1]:span[1] + width] = data

        def copy() -> None:
            rows = [(y, z, read(src, y, z)) for z in range(extent[2]) for y in range(extent[1])]
            for y, z, data in rows:
                if data is not None:  # freed since: nothing to copy (a GPU would fault)
                    write(dst, y, z, data)
        return 0, _GraphNode(self.NODE_MEMCPY, lambda on: self._enqueue(on, copy, self.NODE_MEMCPY), made)

    def _event_node(self, kind: int, event: Any) -> tuple[int, _GraphNode | None]:
        """An event record node records the event on the launch stream when it runs, as a captured
        CU_EVENT_RECORD_EXTERNAL record does; a wait node waits for the event's stream, as a captured
        CU_EVENT_WAIT_EXTERNAL wait does. An unknown event: CUDA_ERROR_INVALID_HANDLE."""
        key = int(event or 0)
        if key not in self.events:
            return CUresult.CUDA_ERROR_INVALID_HANDLE, None
        if kind == CUgraphNodeType.CU_GRAPH_NODE_TYPE_EVENT_RECORD:
            replay: Callable[[Any], object] = (
                lambda on: self._mark(self.events[key], on) if key in self.events else None)
        else:
            replay = lambda on: self._drain(self.events[key]["stream"] or None) if key in self.events else None
        return 0, _GraphNode(kind, replay, _EventNode(key))

    @_recorded
    def cuGraphAddEmptyNode(self, hGraph: Any, dependencies: Any, numDependencies: int) -> tuple[Any, ...]:  # noqa: N803
        err, deps = self._node_inputs(hGraph, dependencies, numDependencies)
        if err:
            return _result(err, 1)
        return self._add_node(hGraph, deps, _GraphNode(CUgraphNodeType.CU_GRAPH_NODE_TYPE_EMPTY, lambda on: None))

    @_recorded
    def cuGraphAddChildGraphNode(self, hGraph: Any, dependencies: Any, numDependencies: int,  # noqa: N803
                                 childGraph: Any) -> tuple[Any, ...]:  # noqa: N803
        """The child graph is cloned into the node (cuda.h); the graph itself, or one with a cycle, cannot be a
        child (CUDA_ERROR_INVALID_VALUE: the fake's rule), nor a graph moved into another node (cuda.h: it "cannot be
        added as a child graph of a separate parent graph")."""
        err, deps = self._node_inputs(hGraph, dependencies, numDependencies)
        if err:
            return _result(err, 1)
        child = int(childGraph or 0)
        if child not in self.graphs or child == int(hGraph) or self._topological(child) is None or \
                child in self.moved_owner or self._memory_nodes(child):  # cuda.h: such a graph only moved in
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        return self._add_node(hGraph, deps, self._child_node(self._clone_graph(child)))

    @_recorded
    def cuGraphAddEventRecordNode(self, hGraph: Any, dependencies: Any, numDependencies: int,  # noqa: N803
                                  event: Any) -> tuple[Any, ...]:
        err, deps = self._node_inputs(hGraph, dependencies, numDependencies)
        if err:
            return _result(err, 1)
        err, node = self._event_node(CUgraphNodeType.CU_GRAPH_NODE_TYPE_EVENT_RECORD, event)
        return _result(err, 1) if node is None else self._add_node(hGraph, deps, node)

    @_recorded
    def cuGraphAddEventWaitNode(self, hGraph: Any, dependencies: Any, numDependencies: int,  # noqa: N803
                                event: Any) -> tuple[Any, ...]:
        err, deps = self._node_inputs(hGraph, dependencies, numDependencies)
        if err:
            return _result(err, 1)
        err, node = self._event_node(CUgraphNodeType.CU_GRAPH_NODE_TYPE_WAIT_EVENT, event)
        return _result(err, 1) if node is None else self._add_node(hGraph, deps, node)

    @_recorded
    def cuGraphAddKernelNode(self, hGraph: Any, dependencies: Any, numDependencies: int,  # noqa: N803
                             nodeParams: Any) -> tuple[Any, ...]:  # noqa: N803
        err, deps = self._node_inputs(hGraph, dependencies, numDependencies)
        if err:
            return _result(err, 1)
        err, node = self._kernel_node(nodeParams)
        if node is not None:
            self._note = {"kernel_node": {"params": node.params.packed.hex(), "kernel": node.params.name.decode()}}
        return _result(err, 1) if node is None else self._add_node(hGraph, deps, node)

    @_recorded
    def cuGraphAddMemsetNode(self, hGraph: Any, dependencies: Any, numDependencies: int,  # noqa: N803
                             memsetParams: Any, ctx: Any) -> tuple[Any, ...]:  # noqa: N803
        err, deps = self._node_inputs(hGraph, dependencies, numDependencies)
        if err or (err := self._node_context(ctx)):
            return _result(err, 1)
        err, node = self._memset_node(memsetParams, int(ctx or 0))
        return _result(err, 1) if node is None else self._add_node(hGraph, deps, node)

    @_recorded
    def cuGraphAddMemcpyNode(self, hGraph: Any, dependencies: Any, numDependencies: int,  # noqa: N803
                             copyParams: Any, ctx: Any) -> tuple[Any, ...]:  # noqa: N803
        err, deps = self._node_inputs(hGraph, dependencies, numDependencies)
        if err or (err := self._node_context(ctx)):
            return _result(err, 1)
        err, node = self._memcpy_node(copyParams, int(ctx or 0))
        return _result(err, 1) if node is None else self._add_node(hGraph, deps, node)

    @_recorded
    def cuGraphAddNode(self, hGraph: Any, dependencies: Any, dependencyData: Any, numDependencies: int,  # noqa: N803
                       nodeParams: Any) -> tuple[Any, ...]:  # noqa: N803
        """A node of `nodeParams.type` (a CUgraphNodeParams), as the per-type calls above make it from the type's
        member (a memset's or memcpy's context, a child graph cloned: CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE), or a
        conditional node (below), after `dependencies` with edge data `dependencyData` (None: default edges) under
        cuGraphAddDependencies's rules, all or nothing; memory allocation and free nodes as cuGraphAddMemAllocNode
        and cuGraphAddMemFreeNode make them, host and batch memory-operation nodes as cuGraphAddHostNode and
        cuGraphAddBatchMemOpNode do from `host` and `batchMemOp`. Not modelled (CUDA_ERROR_NOT_SUPPORTED): external
        semaphore nodes.

        A child graph moved into its node (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE): no clone, the graph itself, owned
        by the node from now on, its nodes the same handles. It runs its nodes as they are when it runs; an
        executable graph keeps their copies (_GraphExec.inner), which cuGraphExec*SetParams sets by the moved graph's
        node. cuda.h's restrictions on a moved graph answer CUDA_ERROR_INVALID_VALUE: cuGraphDestroy,
        cuGraphInstantiate, cuGraphExecUpdate of it, adding it to a parent again; it goes when its node or its
        parent does (_drop_owned).

        A conditional node (`nodeParams.conditional`): its handle one of cuGraphConditionalHandleCreate's, made for
        this graph or a graph this one is a body of (the fake's reading of "in this graph or one of its children"),
        and the context it was made in (NULL: the current one); IF with 1 or 2 bodies, WHILE with 1, SWITCH with any
        (cuda.h); else CUDA_ERROR_INVALID_VALUE. It makes `size` empty body graphs, owned by the node, and sets
        `phGraph_out` to them, as the wheel reads them. What running it does: _conditional_replay."""
        err, deps = self._node_inputs(hGraph, dependencies, numDependencies)
        if dependencyData is not None:
            if not isinstance(dependencyData, list | tuple) or not all(
                    isinstance(e, CUgraphEdgeData) for e in dependencyData):
                raise TypeError("Argument 'dependencyData' is not instance of type (expected "
                                "tuple[cydriver.CUgraphEdgeData,] or list[cydriver.CUgraphEdgeData,]")
            if int(numDependencies) > len(dependencyData):
                raise RuntimeError(f"List is too small: {len(dependencyData)} < {int(numDependencies)}")
        if err:
            return _result(err, 1)
        if nodeParams is None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        words = [self._edge_word(e) for e in dependencyData[:len(deps)]] if dependencyData is not None else None
        kind = CUgraphNodeType(int(nodeParams.type))
        types = CUgraphNodeType
        handle = 0
        node: _GraphNode | None
        if kind == types.CU_GRAPH_NODE_TYPE_KERNEL:
            err, node = self._kernel_node(nodeParams.kernel)
        elif kind == types.CU_GRAPH_NODE_TYPE_MEMSET:
            context = nodeParams.memset.ctx
            err = self._node_context(context)
            err, node = (err, None) if err else self._memset_node(nodeParams.memset, int(context or 0))
        elif kind == types.CU_GRAPH_NODE_TYPE_MEMCPY:
            context = nodeParams.memcpy.copyCtx
            err = CUresult.CUDA_ERROR_INVALID_VALUE if int(nodeParams.memcpy.flags) else self._node_context(context)
            err, node = (err, None) if err else self._memcpy_node(nodeParams.memcpy.copyParams, int(context or 0))
        elif kind == types.CU_GRAPH_NODE_TYPE_EMPTY:
            err, node = 0, _GraphNode(kind, lambda on: None)
        elif kind == types.CU_GRAPH_NODE_TYPE_GRAPH:
            handle = self._handle()
            err, node = self._child_node_of(int(hGraph), handle, nodeParams.graph)
        elif kind in (types.CU_GRAPH_NODE_TYPE_EVENT_RECORD, types.CU_GRAPH_NODE_TYPE_WAIT_EVENT):
            member = nodeParams.eventRecord if kind == types.CU_GRAPH_NODE_TYPE_EVENT_RECORD else nodeParams.eventWait
            err, node = self._event_node(kind, member.event)
        elif kind == types.CU_GRAPH_NODE_TYPE_CONDITIONAL:
            handle = self._handle()
            err, node = self._conditional_of(int(hGraph), handle, nodeParams.conditional)
        elif kind == types.CU_GRAPH_NODE_TYPE_MEM_ALLOC:
            err, node = self._mem_alloc_node(nodeParams.alloc)
        elif kind == types.CU_GRAPH_NODE_TYPE_MEM_FREE:
            err, node = self._mem_free_node(int(hGraph), nodeParams.free.dptr)
        elif kind == types.CU_GRAPH_NODE_TYPE_HOST:
            err, node = self._host_node(nodeParams.host)
        elif kind == types.CU_GRAPH_NODE_TYPE_BATCH_MEM_OP:
            err, node = self._batch_node(nodeParams.batchMemOp)
        else:
            err, node = CUresult.CUDA_ERROR_NOT_SUPPORTED, None
        if node is not None and words is not None and any(
                self._edge_refused(self.nodes[d].kind, kind, w) for d, w in zip(deps, words, strict=True)):
            err, node = CUresult.CUDA_ERROR_INVALID_VALUE, self._undo(node)
        if node is None:
            return _result(err, 1)
        if isinstance(node.params, _ConditionalNode):
            nodeParams.conditional.phGraph_out = [CUgraph(body) for body in node.params.bodies]
        return self._add_node(hGraph, deps, node, words, handle)

    def _child_node_of(self, graph: int, node: int, params: Any) -> tuple[int, _GraphNode | None]:
        """Child graph node `node` of `graph` from CUDA_CHILD_GRAPH_NODE_PARAMS: cuGraphAddChildGraphNode's for a
        cloned child; a moved one (OWNERSHIP_MOVE) is the graph itself, owned by the node from now on (see
        cuGraphAddNode). Either: a known graph without a cycle, not `graph`, not moved into a node already; a moved
        one also held by no node (a conditional node's body) and not a graph `graph` is held in (a cycle); else
        CUDA_ERROR_INVALID_VALUE (the fake's rules where cuda.h names none)."""
        ownership = int(params.ownership)
        child = int(params.graph or 0)
        if ownership not in (0, 1) or child not in self.graphs or child == graph or self._topological(child) is None \
                or child in self.moved_owner or (ownership and (self._held(child) or child in self._holders(graph))):
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        if ownership == CUgraphChildGraphNodeOwnership.CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE:
            self.moved_owner[child] = node
            return 0, self._child_node(child, moved=True)
        if self._memory_nodes(child):  # cuda.h: a graph with memory nodes is only moved into a child node
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        return 0, self._child_node(self._clone_graph(child))

    def _conditional_of(self, graph: int, node: int, params: Any) -> tuple[int, _GraphNode | None]:
        """Conditional node `node` of `graph` from CUDA_CONDITIONAL_NODE_PARAMS (see cuGraphAddNode)."""
        found = self.conditional_handles.get(int(params.handle or 0))
        size, context = int(params.size), int(params.ctx or 0)
        try:
            kind = CUgraphConditionalNodeType(int(params.type))
        except ValueError:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        if err := self._node_context(context):
            return err, None
        owners, at = [], graph
        while at:  # this graph, and each graph it is a body of
            owners.append(at)
            owner = self.body_owner.get(at)
            at = self.node_graph.get(owner, 0) if owner else 0
        sizes = {CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_IF: size in (1, 2),
                 CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE: size == 1,
                 CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_SWITCH: size >= 1}
        if found is None or found.graph not in owners or not sizes[kind] or \
                (context or self._current_handle()) != (found.context or self._current_handle()):
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        bodies = []
        for _ in range(size):
            body = self._handle()
            self.graphs[body] = []
            bodies.append(body)
        return 0, self._conditional_node(node, _ConditionalNode(int(params.handle), int(kind), tuple(bodies), context))

    def _undo(self, node: _GraphNode) -> None:
        """A node that will not be added after all: the graphs it made go again."""
        if isinstance(node.params, _ConditionalNode):
            for body in node.params.bodies:
                self.graphs.pop(body, None)
                self.body_owner.pop(body, None)
        elif isinstance(node.params, _ChildNode) and node.params.moved:  # the caller's graph again, as it was
            self.moved_owner.pop(node.params.graph, None)
        elif isinstance(node.params, _ChildNode):
            self._drop_graph(node.params.graph)
        elif isinstance(node.params, _AllocNode | _FreeNode):  # its allocation, or its claim to free one, goes
            self._drop_owned(node)

    def _current_handle(self) -> int:
        current = self._current()
        return int(current) if current is not None else 0

    # edges
    @staticmethod
    def _edge_word(edge: Any) -> int:
        return int(edge.from_port) | int(edge.to_port) << 8 | int(edge.type) << 16

    @staticmethod
    def _edge_refused(source: int, target: int, word: int) -> bool:
        """cuda.h's rules for an edge's data between nodes of types `source` and `target`: no to_port, a known type,
        a from_port (at most 2) only from a kernel node, a programmatic type only between kernel nodes."""
        kernel = CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
        from_port, to_port, kind = word & 0xFF, (word >> 8) & 0xFF, word >> 16
        return bool(to_port or kind not in (0, 1) or word >> 24 or (from_port and (source != kernel or from_port > 2))
                    or (kind and not (source == kernel and target == kernel)))

    @staticmethod
    def _edge_object(word: int) -> CUgraphEdgeData:
        edge = CUgraphEdgeData()
        edge.from_port, edge.to_port = word & 0xFF, (word >> 8) & 0xFF
        edge.type = CUgraphDependencyType((word >> 16) & 0xFF)
        return edge

    def _edges_given(self, graph: Any, sources: Any, targets: Any, data: Any,
                     count: int) -> tuple[int, list[tuple[int, int, int]]]:
        """(0 or the error, the edges) of cuGraphAddDependencies/RemoveDependencies: lists as the wheel takes them,
        every node one of the graph's; edge data NULL: default edges."""
        froms = self._node_list(sources, int(count), "from_")
        tos = self._node_list(targets, int(count), "to")
        if data is not None:
            if not isinstance(data, list | tuple) or not all(isinstance(e, CUgraphEdgeData) for e in data):
                raise TypeError("Argument 'edgeData' is not instance of type (expected tuple[cydriver.CUgraphEdgeData,]"
                                " or list[cydriver.CUgraphEdgeData,]")
            if int(count) > len(data):
                raise RuntimeError(f"List is too small: {len(data)} < {int(count)}")
        if not self.initialized:
            return CUresult.CUDA_ERROR_NOT_INITIALIZED, []
        key = int(graph or 0)
        if key not in self.graphs:
            return CUresult.CUDA_ERROR_INVALID_VALUE, []
        if not int(count):
            return 0, []
        if froms is None or tos is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE, []
        words = [self._edge_word(e) for e in data[:int(count)]] if data is not None else [0] * int(count)
        if any(self.node_graph.get(n) != key for n in froms + tos):
            return CUresult.CUDA_ERROR_INVALID_VALUE, []
        return 0, list(zip(froms, tos, words, strict=True))

    @_recorded
    def cuGraphAddDependencies(self, hGraph: Any, from_: Any, to: Any, edgeData: Any,  # noqa: N803
                               numDependencies: int) -> tuple[Any, ...]:  # noqa: N803
        """All or nothing: an edge that exists already (whatever its data), twice in the list, from a node to
        itself, with a to_port, an unknown type, or a port or programmatic type on anything but kernel nodes is
        CUDA_ERROR_INVALID_VALUE (cuda.h's rules for ports and types; a cycle is found only by cuGraphInstantiate)."""
        err, edges = self._edges_given(hGraph, from_, to, edgeData, numDependencies)
        if err:
            return _result(err)
        have = {(a, b) for a, b, _word in self.graph_edges.get(int(hGraph), [])}
        for a, b, word in edges:
            if a == b or (a, b) in have or self._edge_refused(self.nodes[a].kind, self.nodes[b].kind, word):
                return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
            have.add((a, b))
        self.graph_edges.setdefault(int(hGraph), []).extend(edges)
        return _result(0)

    @_recorded
    def cuGraphRemoveDependencies(self, hGraph: Any, from_: Any, to: Any, edgeData: Any,  # noqa: N803
                                  numDependencies: int) -> tuple[Any, ...]:  # noqa: N803
        """All or nothing: each edge must exist with exactly that data (CUDA_ERROR_INVALID_VALUE otherwise); a graph
        with memory nodes keeps its edges (cuda.h)."""
        err, edges = self._edges_given(hGraph, from_, to, edgeData, numDependencies)
        if err:
            return _result(err)
        if edges and self._memory_nodes(int(hGraph)):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        kept = list(self.graph_edges.get(int(hGraph), []))
        for edge in edges:
            if edge not in kept:
                return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
            kept.remove(edge)
        self.graph_edges[int(hGraph)] = kept
        return _result(0)

    # queries: the wheel's shapes (a list of `n` entries, NULL-padded past those written, and the count written;
    # n = 0: empty lists and the whole count)
    @staticmethod
    def _asked(count: Any) -> int:
        value = int(count)
        if value < 0:
            raise OverflowError("can't convert negative value to size_t")
        return value

    @staticmethod
    def _padded_nodes(items: list[int], asked: int) -> list[CUgraphNode]:
        got = items[:asked]
        return [CUgraphNode(n) for n in got] + [CUgraphNode(0) for _ in range(asked - len(got))] if asked else []

    def _padded_edges(self, words: list[int], asked: int) -> list[CUgraphEdgeData]:
        got = words[:asked]
        return [self._edge_object(w) for w in got] + [CUgraphEdgeData() for _ in range(asked - len(got))]

    def _graph_nodes(self, graph: Any, asked: Any, roots: bool) -> tuple[Any, ...]:
        n = self._asked(asked)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 2)
        key = int(graph or 0)
        if key not in self.graphs:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 2)
        nodes = self.graphs[key]
        if roots:
            targets = {b for _a, b, _w in self.graph_edges.get(key, [])}
            nodes = [node for node in nodes if node not in targets]
        return CUresult(0), self._padded_nodes(nodes, n), min(n, len(nodes)) if n else len(nodes)

    @_recorded
    def cuGraphGetNodes(self, hGraph: Any, numNodes: int = 0) -> tuple[Any, ...]:  # noqa: N803
        return self._graph_nodes(hGraph, numNodes, False)

    @_recorded
    def cuGraphGetRootNodes(self, hGraph: Any, numRootNodes: int = 0) -> tuple[Any, ...]:  # noqa: N803
        return self._graph_nodes(hGraph, numRootNodes, True)

    @_recorded
    def cuGraphGetEdges(self, hGraph: Any, numEdges: int = 0) -> tuple[Any, ...]:  # noqa: N803
        n = self._asked(numEdges)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 4)
        key = int(hGraph or 0)
        if key not in self.graphs:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 4)
        edges = self.graph_edges.get(key, [])
        if not n:
            return CUresult(0), [], [], [], len(edges)
        return (CUresult(0), self._padded_nodes([a for a, _b, _w in edges], n),
                self._padded_nodes([b for _a, b, _w in edges], n), self._padded_edges([w for _a, _b, w in edges], n),
                min(n, len(edges)))

    def _node_edges(self, node: Any, asked: Any, upstream: bool) -> tuple[Any, ...]:
        n = self._asked(asked)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 3)
        key = int(node or 0)
        if key not in self.nodes:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 3)
        edges = self.graph_edges.get(self.node_graph[key], [])
        found = [(a, w) for a, b, w in edges if b == key] if upstream else [(b, w) for a, b, w in edges if a == key]
        if not n:
            return CUresult(0), [], [], len(found)
        return (CUresult(0), self._padded_nodes([x for x, _w in found], n),
                self._padded_edges([w for _x, w in found], n), min(n, len(found)))

    @_recorded
    def cuGraphNodeGetDependencies(self, hNode: Any, numDependencies: int = 0) -> tuple[Any, ...]:  # noqa: N803
        return self._node_edges(hNode, numDependencies, True)

    @_recorded
    def cuGraphNodeGetDependentNodes(self, hNode: Any, numDependentNodes: int = 0) -> tuple[Any, ...]:  # noqa: N803
        return self._node_edges(hNode, numDependentNodes, False)

    # parameters of a graph's node (its executable graphs keep theirs)
    def _graph_node_of(self, node: Any, kind: int) -> _GraphNode | None:
        found = self.nodes.get(int(node or 0))
        return found if found is not None and found.kind == kind else None

    def _set_node(self, node: Any, kind: int, make: Callable[[int], tuple[int, _GraphNode | None]]) -> tuple[Any, ...]:
        """A graph node of type `kind` gets new parameters (`make(its context)`); another node, or an unknown one,
        is CUDA_ERROR_INVALID_VALUE."""
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        found = self._graph_node_of(node, kind)
        if found is None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        err, made = make(getattr(found.params, "context", 0))
        if made is None:
            return _result(err)
        self.nodes[int(node)] = made
        return _result(0)

    @_recorded
    def cuGraphKernelNodeSetParams(self, hNode: Any, nodeParams: Any) -> tuple[Any, ...]:  # noqa: N803
        return self._set_node(hNode, self.NODE_KERNEL, lambda _context: self._kernel_node(nodeParams))

    @_recorded
    def cuGraphMemsetNodeSetParams(self, hNode: Any, memsetParams: Any) -> tuple[Any, ...]:  # noqa: N803
        return self._set_node(hNode, self.NODE_MEMSET, lambda context: self._memset_node(memsetParams, context))

    @_recorded
    def cuGraphMemcpyNodeSetParams(self, hNode: Any, copyParams: Any) -> tuple[Any, ...]:  # noqa: N803
        return self._set_node(hNode, self.NODE_MEMCPY, lambda context: self._memcpy_node(copyParams, context))

    # parameters of a node in an executable graph (the graph's node keeps its own)
    def _set_exec_node(self, graph_exec: Any, node: Any, kind: int, made: tuple[int, _GraphNode | None],
                       allowed: Callable[[Any, Any], bool] = lambda old, new: True) -> tuple[Any, ...]:
        """The executable graph's copy of `node` (a node of the graph it was instantiated from, or of a child graph
        moved into one of its nodes, of type `kind`) runs `made` from its next launch; `allowed(old params, new
        params)` says whether the change may be made."""
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        found = self.execs.get(int(graph_exec or 0))
        key = int(node or 0)
        if found is None or key not in self.nodes:  # cuda.h: "must not have been removed"
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        if key in found.members:
            parts, index = found.parts, found.members.index(key)
        elif key in found.inner:  # a node of a child graph moved into one of the graph's nodes
            parts, index = found.inner[key]
        else:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        err, part = made
        if parts[index].kind != kind:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        if part is None:
            return _result(err)
        if not allowed(parts[index].params, part.params):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        parts[index] = part
        found.refresh()
        return _result(0)

    @staticmethod
    def _memset_change_allowed(old: Any, new: Any) -> bool:
        """cuda.h: a memset's height may not change, nor, for a 2D one, any dimension (value and address may)."""
        if not isinstance(old, _MemsetNode):
            return True
        if new.height != old.height:
            return False
        return old.height == 1 or (new.width, new.pitch, new.element) == (old.width, old.pitch, old.element)

    @staticmethod
    def _copy_change_allowed(old: Any, new: Any) -> bool:
        """cuda.h: the instantiation-time operands and the new ones must be 1-dimensional, the memory types kept."""
        one_d = new.height == 1 and new.depth == 1
        if not isinstance(old, _CopyNode):
            return one_d
        return one_d and old.height == 1 and old.depth == 1 and (old.src.kind, old.dst.kind) == (
            new.src.kind, new.dst.kind)

    @_recorded
    def cuGraphExecKernelNodeSetParams(self, hGraphExec: Any, hNode: Any, nodeParams: Any) -> tuple[Any, ...]:  # noqa: N803
        return self._set_exec_node(hGraphExec, hNode, self.NODE_KERNEL, self._kernel_node(nodeParams))

    @_recorded
    def cuGraphExecMemsetNodeSetParams(self, hGraphExec: Any, hNode: Any, memsetParams: Any,  # noqa: N803
                                       ctx: Any) -> tuple[Any, ...]:
        if self.initialized and (err := self._node_context(ctx)):
            return _result(err)
        return self._set_exec_node(hGraphExec, hNode, self.NODE_MEMSET, self._memset_node(memsetParams, int(ctx or 0)),
                                   self._memset_change_allowed)

    @_recorded
    def cuGraphExecMemcpyNodeSetParams(self, hGraphExec: Any, hNode: Any, copyParams: Any,  # noqa: N803
                                       ctx: Any) -> tuple[Any, ...]:
        if self.initialized and (err := self._node_context(ctx)):
            return _result(err)
        return self._set_exec_node(hGraphExec, hNode, self.NODE_MEMCPY, self._memcpy_node(copyParams, int(ctx or 0)),
                                   self._copy_change_allowed)

    def _update_refused(self, found: _GraphExec, graph: int) -> tuple[int, int, int]:
        """Why `graph` cannot update `found` (a CUgraphExecUpdateResult, the error node, the error's from node),
        or (CU_GRAPH_EXEC_UPDATE_SUCCESS, 0, 0). Nodes are paired by the order they were added; edges by the order
        they were added to each node. cuda.h's rules, as far as the fake's nodes have them: the node count
        (TOPOLOGY_CHANGED, no node), each node's dependencies (TOPOLOGY_CHANGED: the node, and for a mismatched
        one its dependency), node types (NODE_TYPE_CHANGED), a memset's dimensions under
        cuGraphExecMemsetNodeSetParams's rule and a memcpy's memory types (PARAMETERS_CHANGED), a child graph of
        another node count (TOPOLOGY_CHANGED, the child graph node)."""
        result = CUgraphExecUpdateResult
        nodes = self.graphs[graph]
        if len(nodes) != len(found.members):
            return result.CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, 0, 0
        theirs = self._member_deps(graph)
        for j, node in enumerate(nodes):
            if len(theirs[j]) != len(found.deps[j]):
                return result.CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, node, 0
            for mine, new in zip(found.deps[j], theirs[j], strict=True):
                if mine != new:
                    return result.CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, node, nodes[new[0]]
        for j, node in enumerate(nodes):
            old, new = found.parts[j], self.nodes[node]
            if old.kind != new.kind:
                return result.CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED, node, 0
            if new.kind == self.NODE_MEMSET and isinstance(new.params, _MemsetNode) and not \
                    self._memset_change_allowed(old.params, new.params):
                return result.CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED, node, 0
            if isinstance(old.params, _CopyNode) and isinstance(new.params, _CopyNode) and (
                    old.params.src.kind, old.params.dst.kind) != (new.params.src.kind, new.params.dst.kind):
                return result.CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED, node, 0
            if isinstance(old.params, _ChildNode) and isinstance(new.params, _ChildNode) and \
                    len(self.graphs.get(new.params.graph, [])) != len(self.graphs.get(old.params.graph, [])):
                return result.CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, node, 0
        return result.CU_GRAPH_EXEC_UPDATE_SUCCESS, 0, 0

    @_recorded
    def cuGraphExecUpdate(self, hGraphExec: Any, hGraph: Any) -> tuple[Any, ...]:  # noqa: N803
        """Every node of the executable graph takes its paired node's parameters from `hGraph` (a topologically
        identical graph), or nothing changes: CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, and, as the wheel returns it,
        no result information (the journal's note holds what the fake found: result, error node, from node)."""
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        found = self.execs.get(int(hGraphExec or 0))
        graph = int(hGraph or 0)
        if found is None or graph not in self.graphs or graph in self.moved_owner:  # cuda.h: a moved graph "cannot
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)  # be used as an argument to cuGraphExecUpdate"
        outcome, node, source = self._update_refused(found, graph)
        self._note = {"update": [int(outcome), node, source]}
        if outcome != CUgraphExecUpdateResult.CU_GRAPH_EXEC_UPDATE_SUCCESS:
            return _result(CUresult.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, 1)
        inner: dict[int, tuple[list[_GraphNode], int]] = {}
        found.parts = [self._frozen(n, inner) for n in self.graphs[graph]]
        found.inner = dict(zip(found.inner, inner.values(), strict=False))  # still named by the instantiated nodes
        found.refresh()
        info = CUgraphExecUpdateResultInfo()
        return CUresult(0), info

    # --- host functions and graph host nodes -----------------------------------------------------------------------
    # cuLaunchHostFunc and host nodes (see the module docstring). A host function is the address of a C function
    # `void fn(void *userData)` (a ctypes CFUNCTYPE(None, c_void_p) callback, say), given as a CUhostFn or an int, and
    # is called as HOST_FN(address)(userData) when the stream's earlier work has run: so under the stream rules, at
    # once on a blocking stream, when waited for on a non-blocking one, on the thread of the call that runs it (CUDA
    # calls it on a thread of its own). Each call is kept in `host_calls`. Checked on an H200 (driver 580.159.04, the
    # driver's own cuLaunchHostFunc, not cuda-bindings' wrapper of it: see tests/gpu/programs/host_node_program.py):
    # a NULL function is CUDA_ERROR_INVALID_VALUE for every call here (cuLaunchHostFunc on a capturing stream too,
    # the capture going on), as are NULL parameters, a node that is not a host node (GetParams, SetParams,
    # ExecHostNodeSetParams) and a node not in the executable graph's graph; a captured host node hands back the
    # function and userData given (the one captured node whose parameters the fake keeps); every replay calls the
    # function. The fake's choices: the arguments are checked in the order context, function, stream, and an
    # unknown stream is CUDA_ERROR_INVALID_HANDLE (the H200's driver crashed on a made-up one); the generic node
    # calls (cuGraphAddNode, cuGraphNodeGetParams) do not make or describe host nodes.
    @staticmethod
    def _host_fn_address(fn: Any) -> int:
        """A host function's address as the wheel takes one: a CUhostFn or an int (None: NULL); anything else is
        refused as the wheel refuses it (TypeError), a ctypes function object too (pass its address)."""
        if fn is None:
            return 0
        if isinstance(fn, CUhostFn | int):
            if int(fn) < 0:
                raise OverflowError("can't convert negative value to unsigned PY_LONG_LONG")
            return int(fn)
        raise TypeError("an integer is required")

    @staticmethod
    def _user_data(value: Any) -> int:
        """userData as an address: an int (None: NULL). The wheel also takes a buffer (its address); the fake does
        not (TypeError), so that the journal holds the number the driver was given."""
        if value is None:
            return 0
        if isinstance(value, int) and value >= 0:
            return value
        raise TypeError(f"the fake takes userData only as an int address or None, not {type(value).__name__}")

    def _call_host(self, fn: int, user_data: int) -> None:
        """Call host function `fn` with `user_data`, as the driver does when its turn in the stream comes."""
        self.host_calls.append((fn, user_data))
        HOST_FN(fn)(user_data or None)

    def _host_node(self, params: Any) -> tuple[int, _GraphNode | None]:
        """A host node of CUDA_HOST_NODE_PARAMS `params` (None: CUDA_ERROR_INVALID_VALUE, as is a NULL `fn`; not the
        fake's CUDA_HOST_NODE_PARAMS: TypeError, as the wheel's). Running it queues the call of `fn(userData)` on the
        launch stream, as cuLaunchHostFunc on that stream would."""
        if params is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        if not isinstance(params, CUDA_HOST_NODE_PARAMS):
            raise TypeError(f"Argument 'nodeParams' has incorrect type (expected CUDA_HOST_NODE_PARAMS, got "
                            f"{type(params).__name__})")
        fn, user_data = self._host_fn_address(params.fn), self._user_data(params.userData)
        if not fn:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        self._note = {"host_node": {"fn": fn, "userData": user_data}}
        return 0, _GraphNode(self.NODE_HOST,
                             lambda on: self._enqueue(on, lambda: self._call_host(fn, user_data), self.NODE_HOST),
                             _HostNode(fn, user_data))

    @_recorded
    def cuLaunchHostFunc(self, hStream: Any, fn: Any, userData: Any) -> tuple[Any, ...]:  # noqa: N803
        """`fn(userData)` queued on `hStream` (see above); on a capturing stream, a host node of the capture's graph.
        Errors: NOT_INITIALIZED, INVALID_CONTEXT (no current context), INVALID_VALUE (a NULL function),
        INVALID_HANDLE (an unknown stream), in that order; an invalidated capture's STREAM_CAPTURE_INVALIDATED.

        This is the driver's own entry point, not the wheel's wrapper of it: cuda-bindings' driver.cuLaunchHostFunc
        (13.3.1, measured on an H200) hands the driver a trampoline of its own and data it frees after the first
        call, so natively a NULL `fn` is accepted (and crashes when its turn comes), a captured node answers that
        trampoline and data to cuGraphHostNodeGetParams, and the graph's second replay crashes. The fake models none
        of that: code that must replay a captured host function calls the driver's entry (cuGetProcAddress)."""
        address, user_data = self._host_fn_address(fn), self._user_data(userData)
        if err := self._context_error():
            return _result(err)
        if not address:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        if not self._stream_ok(hStream):
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE)
        self._note = {"host_fn": {"fn": address, "userData": user_data}}
        capture = self._capture_of(hStream)
        if capture is not None:  # a host node that keeps its parameters (asked back, as on an H200)
            return _result(self._capture_node(
                capture, self.NODE_HOST,
                lambda on: self._enqueue(on, lambda: self._call_host(address, user_data), self.NODE_HOST),
                _HostNode(address, user_data)))
        return _result(self._enqueue(hStream, lambda: self._call_host(address, user_data), self.NODE_HOST))

    @_recorded
    def cuGraphAddHostNode(self, hGraph: Any, dependencies: Any, numDependencies: int,  # noqa: N803
                           nodeParams: Any) -> tuple[Any, ...]:  # noqa: N803
        err, deps = self._node_inputs(hGraph, dependencies, numDependencies)
        if err:
            return _result(err, 1)
        err, node = self._host_node(nodeParams)
        return _result(err, 1) if node is None else self._add_node(hGraph, deps, node)

    @_recorded
    def cuGraphHostNodeGetParams(self, hNode: Any) -> tuple[Any, ...]:  # noqa: N803
        """The function and userData the node was given last (cuGraphHostNodeSetParams included; a captured node's,
        those cuLaunchHostFunc was given); an unknown node or one of another type: CUDA_ERROR_INVALID_VALUE."""
        err, made = self._node_params_of(hNode, self.NODE_HOST)
        if err:
            return _result(err, 1)
        params = CUDA_HOST_NODE_PARAMS()
        params.fn, params.userData = CUhostFn(made.fn), made.user_data
        return CUresult(0), params

    @_recorded
    def cuGraphHostNodeSetParams(self, hNode: Any, nodeParams: Any) -> tuple[Any, ...]:  # noqa: N803
        """The graph's node gets new parameters (executable graphs made from it keep theirs); a node not a host node:
        CUDA_ERROR_INVALID_VALUE, as are parameters cuGraphAddHostNode refuses."""
        return self._set_node(hNode, self.NODE_HOST, lambda _context: self._host_node(nodeParams))

    @_recorded
    def cuGraphExecHostNodeSetParams(self, hGraphExec: Any, hNode: Any, nodeParams: Any) -> tuple[Any, ...]:  # noqa: N803
        """The executable graph's copy of `hNode` calls the new function and userData from its next launch; the
        graph's node keeps its own. A node not in the graph it was instantiated from (or a child graph moved into
        one of its nodes), or not a host node: CUDA_ERROR_INVALID_VALUE."""
        return self._set_exec_node(hGraphExec, hNode, self.NODE_HOST, self._host_node(nodeParams))

    # --- batch memory operations and batch memory-operation nodes ------------------------------------------------
    # cuStreamBatchMemOp and cuGraphAddBatchMemOpNode, cuGraphBatchMemOpNodeGet/SetParams and
    # cuGraphExecBatchMemOpNodeSetParams. Each operation is a CUstreamBatchMemOpParams (the driver reads its C bytes):
    # a wait or write of 32 or 64 bits does what cuStreamWaitValue32 and cuStreamWriteValue32 do (the same code, 64
    # bits wide for WAIT/WRITE_VALUE_64: a cyclic GEQ on int64_t), in array order, under the stream rules (a write
    # lands in stream order; a wait holds the stream's later work back until its condition holds); a barrier and a
    # flush of remote writes do nothing observable. What the driver refuses, CUDA_ERROR_INVALID_VALUE, all of a batch
    # or none of it: a count of 256 and more (cuda.h: "must be less than 256"; a count of 0 is a success that does
    # nothing, as on the H200, and the node calls refuse it: the fake's choice), flags
    # other than 0 (cuda.h: "must be 0"), a NULL array, an operation cuda.h lacks, a wait's or write's address not
    # aligned to its width or without memory behind its 4 or 8 bytes (the single calls' rule), a wait's condition
    # beyond GEQ, EQ, AND, NOR (| FLUSH), a write's flags beyond NO_MEMORY_BARRIER, a barrier's beyond SYS and GPU, a
    # flush's other than 0 (cuda.h). An atomic reduction (the 13.x wheel's CU_STREAM_MEM_OP_ATOMIC_REDUCTION, which
    # CUDA 13.0's cuda.h lacks) is not modelled: CUDA_ERROR_NOT_SUPPORTED. A flush is taken although
    # CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES answers 0, as cuStreamWaitValue32 takes CU_STREAM_WAIT_VALUE_FLUSH.
    # On a capturing stream a batch is one BATCH_MEM_OP node that keeps its operations (asked back as given). A node
    # keeps its operations' bytes as given, its context (NULL: the current one must exist) and flags (0, the fake's
    # choice: cuda.h names none), checked as cuStreamBatchMemOp checks a batch; running it resolves each address
    # again (memory freed since: that operation does nothing, where a GPU would fault). cuGraphExecBatchMemOpNodeSet-
    # Params holds to cuda.h's rule: only a wait's or write's address and value, and a wait's condition (not its FLUSH
    # bit), may change. None of this was checked on a GPU: tests/gpu/programs/batch_mem_op_program.py asks.
    def _batch_action(self, op: _BatchOp) -> Callable[[], bool | None]:
        """What `op` (checked) does when its turn in a stream comes, its word resolved now: no memory behind it any
        more (a node's, memory freed since it was made) or a barrier or flush, nothing."""
        if op.operation not in (1, 2, 4, 5):
            return lambda: None
        size = 4 if op.operation in (1, 2) else 8
        word = self._word(op.address, size)
        if word is None:
            return lambda: None
        if op.operation in (2, 5):
            return self._write_of(word, op.value)
        return self._wait_of(word, op.value, op.flags & ~CU_STREAM_WAIT_VALUE_FLUSH, 8 * size)

    def _batch_op_error(self, op: _BatchOp) -> int:
        """0 when the driver takes `op`, else its error (see above)."""
        if op.operation in (1, 2, 4, 5):
            size = 4 if op.operation in (1, 2) else 8
            if op.address % size or self._word(op.address, size) is None:
                return CUresult.CUDA_ERROR_INVALID_VALUE
            if op.operation in (1, 4):
                bad = not 0 <= op.flags & ~CU_STREAM_WAIT_VALUE_FLUSH <= 3
            else:
                bad = bool(op.flags & ~1)  # CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER is the only flag
            return CUresult.CUDA_ERROR_INVALID_VALUE if bad else 0
        if op.operation == CUstreamBatchMemOpType.CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
            return 0 if op.flags == 0 else CUresult.CUDA_ERROR_INVALID_VALUE
        if op.operation == CUstreamBatchMemOpType.CU_STREAM_MEM_OP_BARRIER:
            return 0 if op.flags in (0, 1) else CUresult.CUDA_ERROR_INVALID_VALUE
        if op.operation == CUstreamBatchMemOpType.CU_STREAM_MEM_OP_ATOMIC_REDUCTION:
            return CUresult.CUDA_ERROR_NOT_SUPPORTED
        return CUresult.CUDA_ERROR_INVALID_VALUE

    def _batch_ops(self, raws: list[bytes] | None, count: int, flags: int) -> tuple[int, tuple[_BatchOp, ...]]:
        """(0, the operations of `raws`, their C structs) or (the error, ()): see above."""
        if count == 0 and not flags:  # the H200 answers success, with nothing to do
            return 0, ()
        if raws is None or flags or not 0 < count <= MAX_BATCH_OPS:
            return CUresult.CUDA_ERROR_INVALID_VALUE, ()
        ops = tuple(_batch_op(raw) for raw in raws)
        for op in ops:
            if err := self._batch_op_error(op):
                return err, ()
        return 0, ops

    @staticmethod
    def _batch_list(value: Any, count: int) -> list[bytes] | None:
        """The C structs of the first `count` operations of a paramArray as the wheel takes one: a list or tuple of
        CUstreamBatchMemOpParams (TypeError for anything else, RuntimeError when shorter than `count`); None for
        None (NULL)."""
        if value is None:
            return None
        if not isinstance(value, list | tuple) or not all(isinstance(v, CUstreamBatchMemOpParams) for v in value):
            raise TypeError("Argument 'paramArray' is not instance of type (expected "
                            "tuple[cydriver.CUstreamBatchMemOpParams,] or list[cydriver.CUstreamBatchMemOpParams,]")
        if count > len(value):
            raise RuntimeError(f"List is too small: {len(value)} < {count}")
        return [ctypes.string_at(v.getPtr(), BATCH_OP_SIZE) for v in value[:count]]

    def _batch_replay(self, made: _BatchNode) -> Callable[[Any], object]:
        """What a batch node runs on the launch stream: each operation queued in order, as cuStreamBatchMemOp there
        would queue it (its address resolved at launch)."""
        return lambda on: [self._enqueue(on, self._batch_action(op), self.NODE_BATCH_MEM_OP) for op in made.ops]

    @_recorded
    def cuStreamBatchMemOp(self, stream: Any, count: int, paramArray: Any, flags: int) -> tuple[Any, ...]:  # noqa: N803
        """The operations queued on `stream` in array order (see above), or on a capturing stream one BATCH_MEM_OP
        node of the capture's graph (its context the capture's, its flags 0). Errors: the stream's (NOT_INITIALIZED,
        INVALID_CONTEXT, INVALID_HANDLE), then the batch's (INVALID_VALUE, NOT_SUPPORTED: above); an invalidated
        capture's STREAM_CAPTURE_INVALIDATED."""
        raws = self._batch_list(paramArray, int(count))
        if err := self._stream_error(stream):
            return _result(err)
        err, ops = self._batch_ops(raws, int(count), int(flags))
        if err:
            return _result(err)
        capture = self._capture_of(stream)
        if capture is not None:
            made = _BatchNode(ops, capture.context, 0, capture.context)
            return _result(self._capture_node(capture, self.NODE_BATCH_MEM_OP, self._batch_replay(made), made))
        for op in ops:
            self._enqueue(stream, self._batch_action(op))
        return _result(0)

    def _batch_node(self, params: Any) -> tuple[int, _GraphNode | None]:
        """A batch memory-operation node of CUDA_BATCH_MEM_OP_NODE_PARAMS `params` (None: CUDA_ERROR_INVALID_VALUE;
        not the fake's CUDA_BATCH_MEM_OP_NODE_PARAMS: TypeError, as the wheel's): `count` operations read at its
        paramArray pointer (more than were set from Python: CUDA_ERROR_INVALID_VALUE, the fake's choice where a driver
        would read past the array), its context (NULL: the current one; CUDA_ERROR_INVALID_CONTEXT without) and flags,
        checked as cuStreamBatchMemOp checks a batch (flags other than 0: the fake's choice)."""
        if params is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        if not isinstance(params, CUDA_BATCH_MEM_OP_NODE_PARAMS):
            raise TypeError(f"Argument 'nodeParams' has incorrect type (expected CUDA_BATCH_MEM_OP_NODE_PARAMS, got "
                            f"{type(params).__name__})")
        if err := self._node_context(params.ctx):
            return err, None
        count, address = int(params.count), params._array_address
        own = params._array is not None and address == ctypes.addressof(params._array)
        if not address or not 0 < count <= MAX_BATCH_OPS or (own and count > params._length):
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        raws = [ctypes.string_at(address + BATCH_OP_SIZE * i, BATCH_OP_SIZE) for i in range(count)]
        err, ops = self._batch_ops(raws, count, int(params.flags))
        if err:
            return err, None
        made = _BatchNode(ops, int(params.ctx), int(params.flags), int(params.ctx) or self._current() or 0)
        return 0, _GraphNode(self.NODE_BATCH_MEM_OP, self._batch_replay(made), made)

    @staticmethod
    def _batch_change_allowed(old: Any, new: Any) -> bool:
        """cuda.h's rule for cuGraphExecBatchMemOpNodeSetParams: the context (the one it runs in: NULL is the current
        one), flags, count and each operation's type stay; a wait's FLUSH bit, a write's flags and a barrier's or
        flush's stay (a wait's condition may change, and any wait's or write's address and value)."""
        if not isinstance(old, _BatchNode):  # a captured single operation's node: its parameters are not modelled
            return True
        if (old.home, old.flags, len(old.ops)) != (new.home, new.flags, len(new.ops)):
            return False
        for was, now in zip(old.ops, new.ops, strict=True):
            if was.operation != now.operation:
                return False
            kept = CU_STREAM_WAIT_VALUE_FLUSH if was.operation in (1, 4) else 0xFFFFFFFF
            if (was.flags ^ now.flags) & kept:
                return False
        return True

    def _batch_params_out(self, node: int, made: _BatchNode) -> Any:  # the wheel's CUDA_BATCH_MEM_OP_NODE_PARAMS
        """The node's parameters as the driver hands them back: context, count and flags as given, the pointer at
        getPtr() + 16 at the node's copy of its operations (the bytes given), which the node owns (`node_memory`:
        kept until its parameters are asked again after a change). As the wheel reads such a struct, `paramArray`
        is [] (see CUDA_BATCH_MEM_OP_NODE_PARAMS)."""
        kept = self.node_memory.get(node)
        if kept is None or kept[0] is not made:
            data = b"".join(op.raw for op in made.ops)
            kept = self.node_memory[node] = (made, ctypes.create_string_buffer(data, max(len(data), 1)))
        params = CUDA_BATCH_MEM_OP_NODE_PARAMS()
        params.ctx, params.count, params.flags = made.context, len(made.ops), made.flags
        struct.pack_into("<Q", params._bytes(), 16, ctypes.addressof(kept[1]))
        return params

    @_recorded
    def cuGraphAddBatchMemOpNode(self, hGraph: Any, dependencies: Any, numDependencies: int,  # noqa: N803
                                 nodeParams: Any) -> tuple[Any, ...]:  # noqa: N803
        err, deps = self._node_inputs(hGraph, dependencies, numDependencies)
        if err:
            return _result(err, 1)
        err, node = self._batch_node(nodeParams)
        return _result(err, 1) if node is None else self._add_node(hGraph, deps, node)

    @_recorded
    def cuGraphBatchMemOpNodeGetParams(self, hNode: Any) -> tuple[Any, ...]:  # noqa: N803
        """The context, count, flags and operations the node was given last (cuGraphBatchMemOpNodeSetParams
        included; a node captured from cuStreamBatchMemOp: its operations, the capture's context, flags 0; one
        captured from cuStreamWriteValue32 or cuStreamWaitValue32: not modelled, CUDA_ERROR_NOT_SUPPORTED); an unknown
        node or one of another type: CUDA_ERROR_INVALID_VALUE. The operations are read at the struct's pointer, not
        from `paramArray` (the wheel's reads [] there)."""
        err, made = self._node_params_of(hNode, self.NODE_BATCH_MEM_OP)
        return _result(err, 1) if err else (CUresult(0), self._batch_params_out(int(hNode), made))

    @_recorded
    def cuGraphBatchMemOpNodeSetParams(self, hNode: Any, nodeParams: Any) -> tuple[Any, ...]:  # noqa: N803
        """The graph's node gets new parameters (executable graphs made from it keep theirs); a node not a batch node:
        CUDA_ERROR_INVALID_VALUE, as are parameters cuGraphAddBatchMemOpNode refuses."""
        return self._set_node(hNode, self.NODE_BATCH_MEM_OP, lambda _context: self._batch_node(nodeParams))

    @_recorded
    def cuGraphExecBatchMemOpNodeSetParams(self, hGraphExec: Any, hNode: Any,  # noqa: N803
                                           nodeParams: Any) -> tuple[Any, ...]:  # noqa: N803
        """The executable graph's copy of `hNode` runs the new operations from its next launch, where cuda.h's rule
        allows the change (_batch_change_allowed; else CUDA_ERROR_INVALID_VALUE); the graph's node keeps its own."""
        return self._set_exec_node(hGraphExec, hNode, self.NODE_BATCH_MEM_OP, self._batch_node(nodeParams),
                                   self._batch_change_allowed)

    # --- graphs, their second part: parameters asked back, kernel node attributes, capture into a given graph,
    # instantiation with parameters, memory nodes and the graph memory attributes, the DOT description. A node added
    # here keeps what it was given, and hands it back as given (a memcpy side's memory type too: UNIFIED stays
    # UNIFIED); what a captured node was given is not modelled (CUDA_ERROR_NOT_SUPPORTED). Not checked on a GPU.
    def _memory_nodes(self, graph: int) -> bool:
        """Whether `graph` holds a memory allocation or free node (cuda.h's restrictions on such a graph)."""
        return any(isinstance(self.nodes[n].params, _AllocNode | _FreeNode) for n in self.graphs.get(graph, []))

    def _node_params_of(self, node: Any, kind: int) -> tuple[int, Any]:
        """(0, the parameters node `node` of type `kind` was given), or the error: an unknown node or one of another
        type CUDA_ERROR_INVALID_VALUE, a captured one CUDA_ERROR_NOT_SUPPORTED (its parameters are not modelled)."""
        if not self.initialized:
            return CUresult.CUDA_ERROR_NOT_INITIALIZED, None
        found = self.nodes.get(int(node or 0))
        if found is None or found.kind != kind:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        if found.params is None:
            return CUresult.CUDA_ERROR_NOT_SUPPORTED, None
        return 0, found.params

    def _kernel_params_out(self, node: int, made: _KernelNode) -> Any:  # the wheel's CUDA_KERNEL_NODE_PARAMS
        """A kernel node's parameters as the driver hands them back: `kernelParams` (or `extra`, whichever was set
        last, as cuda.h says) pointing at values the node owns, kept until it is asked again (`node_memory`)."""
        params = CUDA_KERNEL_NODE_PARAMS()
        params.func, params.kern = (0, made.handle) if made.by_kernel else (made.handle, 0)
        params.ctx = made.context
        params.gridDimX, params.gridDimY, params.gridDimZ = made.grid
        params.blockDimX, params.blockDimY, params.blockDimZ = made.block
        params.sharedMemBytes = made.shared
        found = self.functions.get(made.handle) or self.kernels.get(made.handle)
        layout = found.layout if found is not None else None
        values = ctypes.create_string_buffer(made.packed, max(len(made.packed), 1))
        if made.form == 2:
            size = ctypes.c_size_t(len(made.packed))
            extra = (ctypes.c_void_p * 5)(CU_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(values),
                                          CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size), CU_LAUNCH_PARAM_END)
            self.node_memory[node] = (values, size, extra)
            params.extra = ctypes.addressof(extra)
        elif made.form == 1 and layout:
            base = ctypes.addressof(values)
            pointers = (ctypes.c_void_p * len(layout))(*[base + offset for offset, _ in layout])
            self.node_memory[node] = (values, pointers)
            params.kernelParams = ctypes.addressof(pointers)
        return params

    @staticmethod
    def _memset_params_out(made: _MemsetNode) -> Any:  # the wheel's CUDA_MEMSET_NODE_PARAMS
        params = CUDA_MEMSET_NODE_PARAMS()
        params.dst, params.pitch, params.value = CUdeviceptr(made.dst), made.pitch, made.value
        params.elementSize, params.width, params.height = made.element, made.width, made.height
        return params

    @staticmethod
    def _copy_params_out(made: _CopyNode) -> Any:  # the wheel's CUDA_MEMCPY3D
        """The copy as it was given: each side's memory type, its address where that type puts it (UNIFIED's in
        the device field), offsets, pitch and height; LOD and arrays are not modelled (0)."""
        params = CUDA_MEMCPY3D()
        for prefix, side in (("src", made.src), ("dst", made.dst)):
            kind = side.given or side.kind
            setattr(params, prefix + "MemoryType", CUmemorytype(kind))
            setattr(params, prefix + ("Host" if kind == CUmemorytype.CU_MEMORYTYPE_HOST else "Device"),
                    side.address if kind == CUmemorytype.CU_MEMORYTYPE_HOST else CUdeviceptr(side.address))
            for name, value in (("XInBytes", side.x), ("Y", side.y), ("Z", side.z), ("Pitch", side.pitch),
                                ("Height", side.rows)):
                setattr(params, prefix + name, value)
        params.WidthInBytes, params.Height, params.Depth = made.width, made.height, made.depth
        return params

    @staticmethod
    def _alloc_params_out(made: _AllocNode) -> Any:  # the wheel's CUDA_MEM_ALLOC_NODE_PARAMS
        params = CUDA_MEM_ALLOC_NODE_PARAMS()
        props = params.poolProps
        kind, handles, location_kind, location, max_size, usage, rdma = made.pool
        props.allocType, props.handleTypes = CUmemAllocationType(kind), CUmemAllocationHandleType(handles)
        props.location.type, props.location.id = CUmemLocationType(location_kind), location
        props.maxSize, props.usage, props.gpuDirectRDMACapable = max_size, usage, rdma
        for location_kind, location, flags in made.access:
            desc = CUmemAccessDesc()
            desc.location.type, desc.location.id = CUmemLocationType(location_kind), location
            desc.flags = CUmemAccess_flags(flags)
            params.accessDescs.append(desc)
        params.accessDescCount, params.bytesize, params.dptr = len(made.access), made.bytesize, CUdeviceptr(made.dptr)
        return params

    @_recorded
    def cuGraphKernelNodeGetParams(self, hNode: Any) -> tuple[Any, ...]:  # noqa: N803
        err, made = self._node_params_of(hNode, self.NODE_KERNEL)
        return _result(err, 1) if err else (CUresult(0), self._kernel_params_out(int(hNode), made))

    @_recorded
    def cuGraphMemsetNodeGetParams(self, hNode: Any) -> tuple[Any, ...]:  # noqa: N803
        err, made = self._node_params_of(hNode, self.NODE_MEMSET)
        return _result(err, 1) if err else (CUresult(0), self._memset_params_out(made))

    @_recorded
    def cuGraphMemcpyNodeGetParams(self, hNode: Any) -> tuple[Any, ...]:  # noqa: N803
        err, made = self._node_params_of(hNode, self.NODE_MEMCPY)
        return _result(err, 1) if err else (CUresult(0), self._copy_params_out(made))

    @_recorded
    def cuGraphMemAllocNodeGetParams(self, hNode: Any) -> tuple[Any, ...]:  # noqa: N803
        err, made = self._node_params_of(hNode, CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEM_ALLOC)
        return _result(err, 1) if err else (CUresult(0), self._alloc_params_out(made))

    @_recorded
    def cuGraphNodeGetParams(self, hNode: Any) -> tuple[Any, ...]:  # noqa: N803
        """The node's type and its member of CUgraphNodeParams, as the type's own query gives it (a memset's and
        a memcpy's context too; a child graph node: its graph and ownership, CLONE unless moved in; a conditional
        node: its handle, type, size, context and body graphs). An empty node has none; a captured node's are not
        modelled (CUDA_ERROR_NOT_SUPPORTED), nor are node types the fake does not make."""
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        key = int(hNode or 0)
        found = self.nodes.get(key)
        if found is None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        params = CUgraphNodeParams()
        params.type = CUgraphNodeType(found.kind)
        made = found.params
        if found.kind == CUgraphNodeType.CU_GRAPH_NODE_TYPE_EMPTY:
            return CUresult(0), params
        if isinstance(made, _KernelNode):
            params.kernel = self._kernel_params_out(key, made)
        elif isinstance(made, _MemsetNode):
            memset = params.memset
            for name, value in vars(self._memset_params_out(made)).items():
                setattr(memset, name, value)
            memset.ctx = CUcontext(made.context)
        elif isinstance(made, _CopyNode):
            params.memcpy.copyParams, params.memcpy.copyCtx = self._copy_params_out(made), CUcontext(made.context)
        elif isinstance(made, _ChildNode):
            params.graph.graph = CUgraph(made.graph)
            params.graph.ownership = CUgraphChildGraphNodeOwnership(int(made.moved))
        elif isinstance(made, _EventNode):
            member = params.eventRecord if found.kind == CUgraphNodeType.CU_GRAPH_NODE_TYPE_EVENT_RECORD else \
                params.eventWait
            member.event = CUevent(made.event)
        elif isinstance(made, _ConditionalNode):
            condition = params.conditional
            condition.handle, condition.type = CUgraphConditionalHandle(made.handle), CUgraphConditionalNodeType(
                made.kind)
            condition.size, condition.ctx = len(made.bodies), CUcontext(made.context)
            condition.phGraph_out = [CUgraph(body) for body in made.bodies]
        elif isinstance(made, _AllocNode):
            params.alloc = self._alloc_params_out(made)
        elif isinstance(made, _FreeNode):
            params.free.dptr = CUdeviceptr(made.dptr)
        else:
            return _result(CUresult.CUDA_ERROR_NOT_SUPPORTED, 1)
        return CUresult(0), params

    # kernel node attributes
    def _attribute_node(self, node: Any, attr: Any) -> tuple[int, int]:
        """(0, the attribute's ID) for a kernel node and an attribute cuda.h marks valid for graph nodes
        (KERNEL_NODE_ATTRIBUTES; DEVICE_UPDATABLE_KERNEL_NODE is not modelled: NOT_SUPPORTED), else the error."""
        identifier = int(self._enum(attr, CUkernelNodeAttrID, "attr"))
        if not self.initialized:
            return CUresult.CUDA_ERROR_NOT_INITIALIZED, identifier
        found = self.nodes.get(int(node or 0))
        if found is None or found.kind != self.NODE_KERNEL or identifier not in KERNEL_NODE_ATTRIBUTES:
            return CUresult.CUDA_ERROR_INVALID_VALUE, identifier
        if identifier == CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE:
            return CUresult.CUDA_ERROR_NOT_SUPPORTED, identifier
        return 0, identifier

    @_recorded
    def cuGraphKernelNodeGetAttribute(self, hNode: Any, attr: Any) -> tuple[Any, ...]:  # noqa: N803
        """The value set last, all zero where none was (the fake's default: a GPU's may differ)."""
        err, identifier = self._attribute_node(hNode, attr)
        if err:
            return _result(err, 1)
        value = CUkernelNodeAttrValue()
        ctypes.memmove(value.getPtr(), self.node_attributes.get(int(hNode), {}).get(identifier, bytes(64)), 64)
        return CUresult(0), value

    @_recorded
    def cuGraphKernelNodeSetAttribute(self, hNode: Any, attr: Any, value: Any) -> tuple[Any, ...]:  # noqa: N803
        """Kept as its 64 bytes (not checked, and not applied to launches: the fake runs no scheduling)."""
        err, identifier = self._attribute_node(hNode, attr)
        if err:
            return _result(err)
        if value is None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        self.node_attributes.setdefault(int(hNode), {})[identifier] = ctypes.string_at(value.getPtr(), 64)
        return _result(0)

    # capture into a given graph
    def _capture_deps(self, capture: _Capture) -> list[tuple[int, int]]:
        """The nodes (and edge words) the next captured node will depend on."""
        if capture.deps is not None:
            return list(capture.deps)
        return [(capture.last, 0)] if capture.last else []

    def _given_deps(self, graph: int, dependencies: Any, data: Any, count: int) -> tuple[int, list[tuple[int, int]]]:
        """(0, (node, edge word) each) of nodes of `graph` given with optional edge data, or INVALID_VALUE (a node of
        another graph or named twice, edge data cuda.h refuses from that node)."""
        deps = self._node_list(dependencies, int(count), "dependencies")
        if data is not None:
            if not isinstance(data, list | tuple) or not all(isinstance(e, CUgraphEdgeData) for e in data):
                raise TypeError("Argument 'dependencyData' is not instance of type (expected "
                                "tuple[cydriver.CUgraphEdgeData,] or list[cydriver.CUgraphEdgeData,]")
            if int(count) > len(data):
                raise RuntimeError(f"List is too small: {len(data)} < {int(count)}")
        if deps is None and int(count):
            return CUresult.CUDA_ERROR_INVALID_VALUE, []
        deps = deps or []
        words = [self._edge_word(e) for e in data[:len(deps)]] if data is not None else [0] * len(deps)
        if len(set(deps)) != len(deps) or any(self.node_graph.get(d) != graph for d in deps) or any(
                self._edge_refused(self.nodes[d].kind, self.NODE_KERNEL, w) for d, w in zip(deps, words, strict=True)):
            return CUresult.CUDA_ERROR_INVALID_VALUE, []
        return 0, list(zip(deps, words, strict=True))

    @_recorded
    def cuStreamBeginCaptureToGraph(self, hStream: Any, hGraph: Any, dependencies: Any, dependencyData: Any,  # noqa: N803
                                    numDependencies: int, mode: Any) -> tuple[Any, ...]:  # noqa: N803
        """cuStreamBeginCapture's rules, into `hGraph` (the caller's, a body graph too), the first node captured after
        `dependencies` with their edge data (a target's type is not known yet: judged as a kernel node's edge); the
        graph captured into stays the caller's whatever the capture's end. An unknown graph, or one a capture is
        building already: CUDA_ERROR_INVALID_VALUE (the fake's choice for the second)."""
        which = int(self._enum(mode, CUstreamCaptureMode, "mode"))
        if err := self._stream_error(hStream):
            return _result(err)
        graph = int(hGraph or 0)
        if graph not in self.graphs or self._capturing_graph(graph):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        err, given = self._given_deps(graph, dependencies, dependencyData, numDependencies)
        if err:
            return _result(err)
        if not hStream:
            return _result(CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
        if self._capture_of(hStream) is not None:
            return _result(CUresult.CUDA_ERROR_ILLEGAL_STATE)
        self._next_capture += 1
        context = self.streams[int(hStream)][0]
        self.captures[int(hStream)] = _Capture(self._next_capture, graph, which, threading.get_ident(), context,
                                               not self._nonblocking(hStream), deps=given, into=True)
        return _result(0)

    @_recorded
    def cuStreamUpdateCaptureDependencies(self, hStream: Any, dependencies: Any, dependencyData: Any,  # noqa: N803
                                          numDependencies: int, flags: int) -> tuple[Any, ...]:  # noqa: N803
        """CU_STREAM_ADD_CAPTURE_DEPENDENCIES (0) adds to the set (a node already in it once), SET (1) replaces it;
        the nodes must be the capture graph's. Not capturing: CUDA_ERROR_ILLEGAL_STATE (cuda.h); an invalidated
        capture: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (the fake's choice)."""
        if err := self._stream_error(hStream):
            return _result(err)
        capture = self._capture_of(hStream)
        if capture is None:
            return _result(CUresult.CUDA_ERROR_ILLEGAL_STATE)
        if int(flags) not in (0, 1):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        err, given = self._given_deps(capture.graph, dependencies, dependencyData, numDependencies)
        if err:
            return _result(err)
        if capture.status != CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            return _result(CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
        if int(flags) == 1:
            capture.deps = given
        else:
            have = self._capture_deps(capture)
            capture.deps = have + [(d, w) for d, w in given if d not in {n for n, _w in have}]
        return _result(0)

    # instantiation with parameters
    @_recorded
    def cuGraphInstantiateWithParams(self, hGraph: Any, instantiateParams: Any) -> tuple[Any, ...]:  # noqa: N803
        """cuGraphInstantiate's, its flags from `instantiateParams`, which gets `result_out` and `hErrNode_out`
        (NULL: the fake names no node) whether it succeeds or not, as the driver writes the caller's struct; UPLOAD
        needs a known stream (CUDA_ERROR_INVALID_HANDLE) and uploads nothing."""
        if instantiateParams is None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        flags = int(instantiateParams.flags)
        if flags & CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD and self.initialized and \
                not self._stream_ok(instantiateParams.hUploadStream):
            err, handle, outcome = CUresult.CUDA_ERROR_INVALID_HANDLE, 0, 1  # CUDA_GRAPH_INSTANTIATE_ERROR
        else:
            err, handle, outcome = self._instantiate(hGraph, flags)
        instantiateParams.result_out = CUgraphInstantiateResult(outcome)
        instantiateParams.hErrNode_out = CUgraphNode(0)
        return _result(err, 1) if err else (CUresult(0), CUgraphExec(handle))

    # memory nodes
    def _access_descs(self, params: Any) -> tuple[int, tuple[tuple[int, int, int], ...]]:
        count = int(params.accessDescCount)
        descs = list(params.accessDescs or [])
        if count > self.device_count or count > len(descs):
            return CUresult.CUDA_ERROR_INVALID_VALUE, ()
        found = []
        for desc in descs[:count]:
            kind, device = int(desc.location.type), int(desc.location.id)
            if kind != CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE or self._device(device) is None or \
                    int(desc.flags) not in {int(m) for m in CUmemAccess_flags}:
                return CUresult.CUDA_ERROR_INVALID_VALUE, ()
            found.append((kind, device, int(desc.flags)))
        return 0, tuple(found)

    @_recorded
    def cuGraphAddMemAllocNode(self, hGraph: Any, dependencies: Any, numDependencies: int,  # noqa: N803
                               nodeParams: Any) -> tuple[Any, ...]:  # noqa: N803
        """An allocation of `bytesize` bytes (not 0) on the device its pool properties locate (type PINNED, no
        handle types, a device location: cuda.h; else CUDA_ERROR_INVALID_VALUE), made now and gone with its graph
        (the fake's choice: a GPU maps it at launch and keeps the address for the graph's life), its address written
        to `nodeParams.dptr`. Running the node changes nothing (its bytes stay from launch to launch: the fake's
        choice for memory CUDA leaves undefined). It counts in CU_GRAPH_MEM_ATTR_* from the node's making."""
        err, deps = self._node_inputs(hGraph, dependencies, numDependencies)
        if err:
            return _result(err, 1)
        err, node = self._mem_alloc_node(nodeParams)
        return _result(err, 1) if node is None else self._add_node(hGraph, deps, node)

    def _mem_alloc_node(self, params: Any) -> tuple[int, _GraphNode | None]:
        """cuGraphAddMemAllocNode's node of CUDA_MEM_ALLOC_NODE_PARAMS `params` (its allocation made, its address in
        `params.dptr`), or the error refusing it."""
        if params is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        props = params.poolProps
        device = self._device(int(props.location.id))
        size = int(params.bytesize)
        if int(props.allocType) != CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED or int(props.handleTypes) or \
                int(props.location.type) != CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE or device is None or \
                size <= 0:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        err, access = self._access_descs(params)
        if err:
            return err, None
        if self._graph_memory(device) + size > self.total_mem[device] - self.used[device]:
            return CUresult.CUDA_ERROR_OUT_OF_MEMORY, None
        base = self._allocate(size, device, track=False)
        pool = (int(props.allocType), int(props.handleTypes), int(props.location.type), device, int(props.maxSize),
                int(props.usage), int(getattr(props, "gpuDirectRDMACapable", 0)))
        made = _AllocNode(base, size, device, pool, access)
        params.dptr = CUdeviceptr(base)
        self.graph_memory_high[device] = max(self.graph_memory_high[device], self._graph_memory(device) + size)
        return 0, _GraphNode(CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEM_ALLOC, lambda on: None, made)

    def _graph_allocations(self) -> dict[int, _AllocNode]:
        return {n.params.dptr: n.params for n in self.nodes.values() if isinstance(n.params, _AllocNode)}

    def _graph_memory(self, device: int) -> int:
        return sum(made.bytesize for made in self._graph_allocations().values() if made.device == device)

    @_recorded
    def cuGraphAddMemFreeNode(self, hGraph: Any, dependencies: Any, numDependencies: int,  # noqa: N803
                              dptr: Any) -> tuple[Any, ...]:
        """Frees an allocation an allocation node made, once (in its own graph or in another: cuda.h); anything else
        is CUDA_ERROR_INVALID_VALUE. Running it changes nothing (the memory goes with its allocation node's graph)."""
        err, deps = self._node_inputs(hGraph, dependencies, numDependencies)
        if err:
            return _result(err, 1)
        err, node = self._mem_free_node(int(hGraph), dptr)
        return _result(err, 1) if node is None else self._add_node(hGraph, deps, node)

    def _mem_free_node(self, graph: int, dptr: Any) -> tuple[int, _GraphNode | None]:
        address = int(dptr or 0)
        if address not in self._graph_allocations() or address in self.graph_frees:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        self.graph_frees[address] = graph
        return 0, _GraphNode(CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEM_FREE, lambda on: None, _FreeNode(address))

    @_recorded
    def cuDeviceGetGraphMemAttribute(self, device: Any, attr: Any) -> tuple[Any, ...]:
        """USED and RESERVED alike (the fake reserves nothing apart): the bytes of the allocation nodes of graphs
        that exist on that device, and their high watermark since it was last reset."""
        which = int(self._enum(attr, CUgraphMem_attribute, "attr"))
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        ordinal = self._device(device)
        if ordinal is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 1)
        value = self._graph_memory(ordinal) if which in (0, 2) else self.graph_memory_high[ordinal]
        return CUresult(0), cuuint64_t(value)

    @_recorded
    def cuDeviceSetGraphMemAttribute(self, device: Any, attr: Any, value: Any) -> tuple[Any, ...]:
        """Only a high watermark, and only to 0 (cuda.h), which then starts again from what is in use now (the fake's
        reading); anything else: CUDA_ERROR_INVALID_VALUE. `value` a cuuint64_t, as the wheel takes it."""
        which = int(self._enum(attr, CUgraphMem_attribute, "attr"))
        if not isinstance(value, cuuint64_t):
            raise TypeError(f"Argument 'value' is not a cuuint64_t, but {type(value).__name__}")
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        ordinal = self._device(device)
        if ordinal is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE)
        if which not in (1, 3) or int(value):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        self.graph_memory_high[ordinal] = self._graph_memory(ordinal)
        return _result(0)

    # the DOT description
    @_recorded
    def cuGraphDebugDotPrint(self, hGraph: Any, path: Any, flags: int) -> tuple[Any, ...]:  # noqa: N803
        """A DOT graph of the nodes (by their order in the graph, with their types) and edges (with their data), and
        the flags (the fake's text: a GPU's names its handles and parameters), written to `path`; a file that cannot
        be written is CUDA_ERROR_OPERATING_SYSTEM (cuda.h)."""
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        graph = int(hGraph or 0)
        if graph not in self.graphs or path is None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        nodes = self.graphs[graph]
        index = {node: i for i, node in enumerate(nodes)}
        lines = [f"digraph orion_fake_graph {{  // flags {int(flags):#x}"]
        lines += [f'  n{i} [label="{i} {CUgraphNodeType(self.nodes[n].kind).name}"];' for i, n in enumerate(nodes)]
        lines += [f'  n{index[a]} -> n{index[b]} [label="{word:#x}"];'
                  for a, b, word in self.graph_edges.get(graph, [])]
        lines.append("}")
        try:
            with open(os.fsdecode(path), "w", encoding="ascii") as out:
                out.write("\n".join(lines) + "\n")
        except OSError:
            return _result(CUresult.CUDA_ERROR_OPERATING_SYSTEM)
        return _result(0)

    # --- modules, libraries, kernels ----------------------------------------------------------------------------
    def _load(self, image: Any) -> tuple[int, Image | None]:
        data = bytes(memoryview(image).cast("B")) if not isinstance(image, bytes) else image
        self._note = {"image": plain(data)}
        parsed = parse_image(data)
        return (0 if parsed is not None else CUresult.CUDA_ERROR_INVALID_IMAGE), parsed

    def _globals_for(self, owner: int, parsed: Image) -> None:
        device = self._device_of_current() if self._current() is not None else 0
        self.module_globals[owner] = {name: self._allocate(size, device, track=False)
                                      for name, size in parsed.globals.items()}
        self.global_device.update({pointer: device for pointer in self.module_globals[owner].values()})

    @_recorded
    def cuModuleLoadData(self, image: Any) -> tuple[Any, ...]:
        if err := self._context_error():
            return _result(err, 1)
        err, parsed = self._load(image)
        if parsed is None:
            return _result(err, 1)
        handle = self._handle()
        self.images[handle] = parsed
        self.modules[handle] = {}
        self._globals_for(handle, parsed)
        return CUresult(0), CUmodule(handle)

    @_recorded
    def cuModuleLoadDataEx(self, image: Any, numOptions: int, options: Any, optionValues: Any) -> tuple[Any, ...]:  # noqa: N803
        """cuModuleLoadData with JIT options, taken as the wheel takes them: `options` a list of CUjit_option,
        `optionValues` a list with an int per option, or the member of its enum for CU_JIT_TARGET,
        FALLBACK_STRATEGY and CACHE_MODE (a plain int raises AttributeError there, as the wheel's `.value` does).
        The fake compiles nothing: options are checked, recorded (as `jit_options`) and otherwise ignored."""
        seen = self._jit_options(numOptions, options, optionValues)
        if seen is None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        if err := self._context_error():
            return _result(err, 1)
        err, parsed = self._load(image)
        self._note["jit_options"] = seen
        if parsed is None:
            return _result(err, 1)
        handle = self._handle()
        self.images[handle] = parsed
        self.modules[handle] = {}
        self._globals_for(handle, parsed)
        return CUresult(0), CUmodule(handle)

    def _jit_options(self, count: int, options: Any, values: Any) -> list[list[Any]] | None:
        """[[option name, value], ...] for JIT options taken as the wheel takes them; None if the counts differ."""
        options, values = list(options or []), list(values or [])
        if int(count) != len(options) or len(options) != len(values):
            return None
        seen = []
        for option, value in zip(options, values, strict=True):
            key = self._enum(option, CUjit_option, "options")
            wanted = JIT_VALUE_ENUMS.get(int(key))
            if wanted is not None:
                if not isinstance(value, wanted):
                    raise AttributeError(f"'{type(value).__name__}' object has no attribute 'value'")
            elif not isinstance(value, int) or isinstance(value, IntEnum):
                raise TypeError(f"{key.name} takes an int, got {type(value).__name__}")
            seen.append([key.name, int(value)])
        return seen

    def _unload(self, handle: int, table: dict[int, dict[bytes, int]], handles: dict[int, _Kernel]) -> None:
        children = list(table.pop(handle).values())
        for child in children:
            handles.pop(child, None)
        if self._freed is not None:
            self._freed += [*reversed(children), handle]  # next given out: the handle, then its first child
        for pointer in self.module_globals.pop(handle, {}).values():
            self.memory.pop(pointer, None)
            self.global_device.pop(pointer, None)
        self.images.pop(handle, None)

    # --- the JIT linker: it links nothing; its cubin is fake_cubin() of the inputs, checked only as written here ---
    @_recorded
    def cuLinkCreate(self, numOptions: int, options: Any, optionValues: Any) -> tuple[Any, ...]:  # noqa: N803
        """Options taken as cuModuleLoadDataEx takes them (recorded as `jit_options`); a current context needed."""
        seen = self._jit_options(numOptions, options, optionValues)
        if seen is None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        if err := self._context_error():
            return _result(err, 1)
        self._note["jit_options"] = seen
        handle = self._handle()
        self.links[handle] = _Link([])
        return CUresult(0), CUlinkState(handle)

    @_recorded
    def cuLinkAddData(self, state: Any, typename: Any, data: Any, size: int, name: Any, numOptions: int,  # noqa: N803
                      options: Any, optionValues: Any) -> tuple[Any, ...]:
        """An input of `size` bytes read from `data` (an address or a buffer), kept in order. Unknown (or destroyed)
        state: INVALID_HANDLE; an empty input, options whose counts differ, or a state already complete:
        INVALID_VALUE (the last not checked on a GPU)."""
        link = self.links.get(int(state))
        if link is None:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE)
        kind = self._enum(typename, CUjitInputType, "typename")
        seen = self._jit_options(numOptions, options, optionValues)
        raw = self._host_read(data, int(size)) if int(size) else None
        if seen is None or raw is None or link.cubin is not None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        self._note["jit_options"] = seen
        link.inputs.append((int(kind), bytes(name or b""), raw))
        return _result(0)

    @_recorded
    def cuLinkComplete(self, state: Any) -> tuple[Any, ...]:
        """(CUresult, the cubin's address, its size): fake_cubin() of the inputs, owned by the state. Unknown state:
        INVALID_HANDLE; no inputs, or complete already: INVALID_VALUE (neither checked on a GPU)."""
        link = self.links.get(int(state))
        if link is None:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 2)
        if not link.inputs or link.cubin is not None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 2)
        made = fake_cubin(link.inputs)
        link.cubin = ctypes.create_string_buffer(made, len(made))
        return CUresult(0), ctypes.addressof(link.cubin), len(made)

    @_recorded
    def cuLinkDestroy(self, state: Any) -> tuple[Any, ...]:
        """The state and its cubin go; unknown (or destroyed) state: INVALID_HANDLE."""
        if self.links.pop(int(state), None) is None:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE)
        return _result(0)

    @_recorded
    def cuModuleUnload(self, hmod: Any) -> tuple[Any, ...]:
        if int(hmod) not in self.modules:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE)
        self._unload(int(hmod), self.modules, self.functions)
        return _result(0)

    def _by_name(self, owner: int, table: dict[int, dict[bytes, int]], handles: dict[int, _Kernel],
                 name: Any) -> tuple[int, int]:
        key = bytes(name)
        if owner not in table:
            return CUresult.CUDA_ERROR_INVALID_HANDLE, 0
        image = self.images[owner]
        if key not in image.kernels:
            return CUresult.CUDA_ERROR_NOT_FOUND, 0
        if key not in table[owner]:
            handle = self._handle()
            handles[handle] = _Kernel(key, image.kernels[key], owner)
            table[owner][key] = handle
        return 0, table[owner][key]

    def _global(self, owner: int, table: dict[int, Any], name: Any) -> tuple[Any, ...]:
        if owner not in table:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 2)
        pointer = self.module_globals.get(owner, {}).get(bytes(name))
        if pointer is None:
            return _result(CUresult.CUDA_ERROR_NOT_FOUND, 2)
        return CUresult(0), CUdeviceptr(pointer), len(self.memory[pointer])

    @_recorded
    def cuModuleGetFunction(self, hmod: Any, name: Any) -> tuple[Any, ...]:
        err, handle = self._by_name(int(hmod), self.modules, self.functions, name)
        return _result(err, 1) if err else (CUresult(0), CUfunction(handle))

    @_recorded
    def cuModuleGetGlobal(self, hmod: Any, name: Any) -> tuple[Any, ...]:
        return self._global(int(hmod), self.modules, name)

    @_recorded
    def cuLibraryLoadData(self, code: Any, jitOptions: Any, jitOptionsValues: Any, numJitOptions: int,  # noqa: N803
                          libraryOptions: Any, libraryOptionValues: Any, numLibraryOptions: int) -> tuple[Any, ...]:  # noqa: N803
        """JIT options as cuModuleLoadDataEx's (recorded as `jit_options`); no library options."""
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if numLibraryOptions or libraryOptions:
            return _result(CUresult.CUDA_ERROR_NOT_SUPPORTED, 1)  # the fake takes no library options
        seen = self._jit_options(numJitOptions, jitOptions, jitOptionsValues)
        if seen is None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        err, parsed = self._load(code)
        self._note["jit_options"] = seen
        if parsed is None:
            return _result(err, 1)
        handle = self._handle()
        self.images[handle] = parsed
        self.libraries[handle] = {}
        self._globals_for(handle, parsed)
        return CUresult(0), CUlibrary(handle)

    @_recorded
    def cuLibraryGetKernel(self, library: Any, name: Any) -> tuple[Any, ...]:
        err, handle = self._by_name(int(library), self.libraries, self.kernels, name)
        return _result(err, 1) if err else (CUresult(0), CUkernel(handle))

    @_recorded
    def cuLibraryGetGlobal(self, library: Any, name: Any) -> tuple[Any, ...]:
        return self._global(int(library), self.libraries, name)

    @_recorded
    def cuLibraryUnload(self, library: Any) -> tuple[Any, ...]:
        if int(library) not in self.libraries:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE)
        self._unload(int(library), self.libraries, self.kernels)
        return _result(0)

    @_recorded
    def cuKernelGetFunction(self, kernel: Any) -> tuple[Any, ...]:
        if err := self._context_error():
            return _result(err, 1)
        source = self.kernels.get(int(kernel))
        if source is None:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 1)
        # One function of the kernel per context, the same handle each time it is asked for (as the H200's driver
        # answers: a kernel of a library loaded again is another, and so is its function)
        key = (int(kernel), self._current())
        known = self._kernel_functions.get(key)
        if known is not None and known[1] is source and known[0] in self.functions:
            return CUresult(0), CUfunction(known[0])
        handle = self._handle()
        self.functions[handle] = _Kernel(source.name, source.layout, source.owner)
        self._kernel_functions[key] = (handle, source)
        return CUresult(0), CUfunction(handle)

    FUNCTION_ATTRIBUTES = {0: 1024, 1: 0, 2: 0, 3: 0, 4: 32, 5: 90, 6: 90, 7: 0, 8: 0, 9: -1}

    def _function_attribute(self, kernel: _Kernel, attribute: int, device: int) -> int:
        default = self.FUNCTION_ATTRIBUTES[attribute]
        if attribute == 4:  # registers: differs between kernels
            default += len(kernel.name) % 8
        return kernel.attributes.get((attribute, device), default)

    @_recorded
    def cuKernelGetAttribute(self, attrib: Any, kernel: Any, dev: Any) -> tuple[Any, ...]:
        attribute = int(self._enum(attrib, CUfunction_attribute, "attrib"))
        device = self._device(dev)
        source = self.kernels.get(int(kernel))
        if device is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 1)
        if source is None:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 1)
        return CUresult(0), self._function_attribute(source, attribute, device)

    @_recorded
    def cuKernelSetAttribute(self, attrib: Any, val: int, kernel: Any, dev: Any) -> tuple[Any, ...]:
        attribute = int(self._enum(attrib, CUfunction_attribute, "attrib"))
        device = self._device(dev)
        source = self.kernels.get(int(kernel))
        if device is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE)
        if source is None:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE)
        if attribute not in (8, 9):  # the settable ones
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        source.attributes[(attribute, device)] = int(val)
        return _result(0)

    @_recorded
    def cuKernelSetCacheConfig(self, kernel: Any, config: Any, dev: Any) -> tuple[Any, ...]:
        self._enum(config, CUfunc_cache, "config")
        if self._device(dev) is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE)
        return _result(0 if int(kernel) in self.kernels else CUresult.CUDA_ERROR_INVALID_HANDLE)

    @_recorded
    def cuFuncSetAttribute(self, hfunc: Any, attrib: Any, value: Any) -> tuple[Any, ...]:
        """The settable attributes (8, 9) of a function, on its context's device (0 here): what
        cuFuncGetAttribute then reads."""
        attribute = int(self._enum(attrib, CUfunction_attribute, "attrib"))
        function = self.functions.get(int(hfunc))
        if function is None:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE)
        if attribute not in (8, 9):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        function.attributes[(attribute, 0)] = int(value)
        return _result(0)

    @_recorded
    def cuFuncSetCacheConfig(self, hfunc: Any, config: Any) -> tuple[Any, ...]:
        self._enum(config, CUfunc_cache, "config")
        return _result(0 if int(hfunc) in self.functions else CUresult.CUDA_ERROR_INVALID_HANDLE)

    @_recorded
    def cuFuncGetAttribute(self, attrib: Any, hfunc: Any) -> tuple[Any, ...]:
        attribute = int(self._enum(attrib, CUfunction_attribute, "attrib"))
        function = self.functions.get(int(hfunc))
        if function is None:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 1)
        return CUresult(0), self._function_attribute(function, attribute, 0)

    def _param_info(self, kernel: _Kernel | None, index: int) -> tuple[Any, ...]:
        if kernel is None:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 2)
        if kernel.layout is None:
            return _result(CUresult.CUDA_ERROR_NOT_SUPPORTED, 2)  # an ELF image: the fake does not know
        if not 0 <= int(index) < len(kernel.layout):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 2)
        offset, size = kernel.layout[int(index)]
        return CUresult(0), offset, size

    @_recorded
    def cuFuncGetParamInfo(self, func: Any, paramIndex: int) -> tuple[Any, ...]:  # noqa: N803
        return self._param_info(self.functions.get(int(func)), paramIndex)

    @_recorded
    def cuKernelGetParamInfo(self, kernel: Any, paramIndex: int) -> tuple[Any, ...]:  # noqa: N803
        return self._param_info(self.kernels.get(int(kernel)), paramIndex)

    @_recorded
    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, func: Any, blockSize: int,  # noqa: N803
                                                    dynamicSMemSize: int) -> tuple[Any, ...]:  # noqa: N803
        if int(func) not in self.functions:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 1)
        if not 0 < int(blockSize) <= 1024 or int(dynamicSMemSize) > 228 * 1024:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        return CUresult(0), max(1, 2048 // int(blockSize)) - (1 if dynamicSMemSize else 0)

    @_recorded
    def cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(self, func: Any, blockSize: int,  # noqa: N803
                                                             dynamicSMemSize: int, flags: int) -> tuple[Any, ...]:  # noqa: N803
        if int(flags) & ~1:  # CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE is the only flag
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        return self.cuOccupancyMaxActiveBlocksPerMultiprocessor.__wrapped__(self, func, blockSize, dynamicSMemSize)

    @_recorded
    def cuOccupancyAvailableDynamicSMemPerBlock(self, func: Any, numBlocks: int, blockSize: int) -> tuple[Any, ...]:  # noqa: N803
        """228 KiB shared between the blocks, in whole KiB."""
        if int(func) not in self.functions:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 1)
        if int(numBlocks) <= 0 or not 0 < int(blockSize) <= 1024:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        return CUresult(0), 228 * 1024 // int(numBlocks) // 1024 * 1024

    def _potential_block_size(self, func: Any, callback: Any, dynamic: int, limit: int) -> tuple[Any, ...]:
        """Without a callback only. Over every multiple of 32 up to the limits, the block size with the most
        resident threads per SM (the largest such block on a tie); min grid = its blocks per SM × SM count."""
        if int(func) not in self.functions:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 2)
        if callback is not None:
            return _result(CUresult.CUDA_ERROR_NOT_SUPPORTED, 2)
        top = min(int(limit) or 1024, 1024)
        candidates = sorted({min(top, size) for size in range(32, -(-top // 32) * 32 + 1, 32)})
        blocks = {size: max(1, 2048 // size) - (1 if dynamic else 0) for size in candidates}
        best = max(candidates, key=lambda size: (size * blocks[size], size))
        return CUresult(0), blocks[best] * self.device_attribute(16, self._device_of_current()), best

    @_recorded
    def cuOccupancyMaxPotentialBlockSize(self, func: Any, blockSizeToDynamicSMemSize: Any,  # noqa: N803
                                         dynamicSMemSize: int, blockSizeLimit: int) -> tuple[Any, ...]:  # noqa: N803
        return self._potential_block_size(func, blockSizeToDynamicSMemSize, dynamicSMemSize, blockSizeLimit)

    @_recorded
    def cuOccupancyMaxPotentialBlockSizeWithFlags(self, func: Any, blockSizeToDynamicSMemSize: Any,  # noqa: N803
                                                  dynamicSMemSize: int, blockSizeLimit: int,  # noqa: N803
                                                  flags: int) -> tuple[Any, ...]:
        if int(flags) & ~1:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 2)
        return self._potential_block_size(func, blockSizeToDynamicSMemSize, dynamicSMemSize, blockSizeLimit)

    # --- module enumeration and names; bus ids, LUIDs and atomic capabilities of devices -------------------------
    # Return shapes are the wheel's (cuda-bindings 13.5, its wrappers driven over a stub libcuda): the counts are ints;
    # an enumeration is a list of exactly numFunctions (numKernels) handles, NULL handles past those the driver wrote,
    # and [] for 0, for which the wheel hands the driver a NULL array; a name is bytes without its NUL; a bus id is
    # `length` bytes, the id NUL-terminated in them, spaces after it (the wheel's buffer); cuDeviceGetByPCIBusId takes
    # bytes (a str raises TypeError, as the wheel's does); the atomic queries take a list or tuple of CUatomicOperation
    # members (a plain int raises TypeError, a count above its length RuntimeError, as the wheel's do) and answer a
    # list of `count` ints. Every output is None on failure. The fake's choices, none checked on a GPU
    # (tests/gpu/programs/module_names_program.py reports a GPU's answers):
    # * A module's functions and a library's kernels are its image's kernels (PTX `.entry`s, an ELF's `.text.<name>`
    #   sections), enumerated in the image's order; an enumerated handle is the one cuModuleGetFunction
    #   (cuLibraryGetKernel) gives for its name, before or after. numFunctions is a maximum (cuda.h: "a maximum number
    #   of numFunctions function handles"): fewer gives the first ones, more gives all and NULLs after; 0 is
    #   CUDA_ERROR_INVALID_VALUE (the wheel passes a NULL array then, and cuda.h's INVALID_VALUE is for NULL
    #   pointers). cuModuleEnumerateFunctions needs a current context (cuda.h lists INVALID_CONTEXT for it alone).
    # * cuFuncGetName / cuKernelGetName: a NULL handle is CUDA_ERROR_INVALID_VALUE (cuda.h); a handle the fake did not
    #   hand out (or one of an unloaded module) CUDA_ERROR_INVALID_HANDLE, as everywhere in the fake; cuda.h names no
    #   code for it. A function cuKernelGetFunction made is named as its kernel.
    # * A bus id is "%04x:%02x:%02x.0" of CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, _PCI_BUS_ID and _PCI_DEVICE_ID, as the
    #   H200's driver writes it (and guest_runtime/native/answered_in_guest.c), cut to length - 1 characters;
    #   length <= 0 is CUDA_ERROR_INVALID_VALUE. cuDeviceGetByPCIBusId reads "domain:bus:device[.function]" or
    #   "bus:device.function" (domain 0), hex in any case, as that C file does: an id naming no fake device is
    #   CUDA_ERROR_INVALID_DEVICE, text that is no bus id CUDA_ERROR_INVALID_VALUE.
    # * cuDeviceGetLuid answers CUDA_ERROR_NOT_SUPPORTED for a valid device: LUIDs are Windows' (WDDM); the H200's
    #   driver 580 on Linux answers so.
    # * The atomic capabilities are HOST_ATOMIC_CAPABILITIES and P2P_ATOMIC_CAPABILITIES (see there: plausible, not
    #   read). Order of checks: NOT_INITIALIZED, INVALID_DEVICE (an ordinal out of range, and for P2P the same device
    #   twice, as cuda.h says), then INVALID_VALUE (count 0, or CU_ATOMIC_OPERATION_MAX, which the enum has but names
    #   no operation).
    def _count(self, owner: Any, table: dict[int, dict[bytes, int]]) -> tuple[Any, ...]:
        key = int(owner or 0)
        if key not in table:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 1)
        return CUresult(0), len(self.images[key].kernels)

    def _enumerate(self, number: int, owner: Any, table: dict[int, dict[bytes, int]], handles: dict[int, _Kernel],
                   kind: type[_Handle]) -> tuple[Any, ...]:
        wanted = int(number)
        if wanted < 0:
            raise OverflowError("can't convert negative value to unsigned int")  # the wheel's, for its unsigned int
        key = int(owner or 0)
        if key not in table:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 1)
        if wanted == 0:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        found = []
        for name in list(self.images[key].kernels)[:wanted]:
            _err, handle = self._by_name(key, table, handles, name)
            found.append(kind(handle))
        return CUresult(0), found + [kind(0) for _ in range(wanted - len(found))]

    @staticmethod
    def _name(handle: Any, handles: dict[int, _Kernel]) -> tuple[Any, ...]:
        key = int(handle or 0)
        if key == 0:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        found = handles.get(key)
        if found is None:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 1)
        return CUresult(0), found.name

    @_recorded
    def cuModuleGetFunctionCount(self, mod: Any) -> tuple[Any, ...]:
        return self._count(mod, self.modules)

    @_recorded
    def cuLibraryGetKernelCount(self, lib: Any) -> tuple[Any, ...]:
        return self._count(lib, self.libraries)

    @_recorded
    def cuModuleEnumerateFunctions(self, numFunctions: int, mod: Any) -> tuple[Any, ...]:  # noqa: N803
        if err := self._context_error():
            return _result(err, 1)
        return self._enumerate(numFunctions, mod, self.modules, self.functions, CUfunction)

    @_recorded
    def cuLibraryEnumerateKernels(self, numKernels: int, lib: Any) -> tuple[Any, ...]:  # noqa: N803
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        return self._enumerate(numKernels, lib, self.libraries, self.kernels, CUkernel)

    @_recorded
    def cuFuncGetName(self, hfunc: Any) -> tuple[Any, ...]:
        return self._name(hfunc, self.functions)

    @_recorded
    def cuKernelGetName(self, hfunc: Any) -> tuple[Any, ...]:
        return self._name(hfunc, self.kernels)

    def pci_location(self, device: int) -> tuple[int, int, int]:
        """(domain, bus, device) of a fake device: its PCI_DOMAIN_ID, PCI_BUS_ID and PCI_DEVICE_ID attributes."""
        return self.device_attribute(50, device), self.device_attribute(33, device), self.device_attribute(34, device)

    @_recorded
    def cuDeviceGetPCIBusId(self, length: int, dev: Any) -> tuple[Any, ...]:
        device = self._device(dev)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if device is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 1)
        if int(length) <= 0:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        text = "{:04x}:{:02x}:{:02x}.0".format(*self.pci_location(device)).encode()[:int(length) - 1]
        return CUresult(0), text + b"\0" + b" " * (int(length) - len(text) - 1)

    @_recorded
    def cuDeviceGetByPCIBusId(self, pciBusId: Any) -> tuple[Any, ...]:  # noqa: N803
        if not isinstance(pciBusId, bytes | bytearray):
            raise TypeError(f"expected bytes, {type(pciBusId).__name__} found")  # the wheel's
        text = bytes(pciBusId).split(b"\0", 1)[0]
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        full, short = _BUS_ID.fullmatch(text), _SHORT_BUS_ID.fullmatch(text)
        if full is not None:
            wanted = (int(full.group(1), 16), int(full.group(2), 16), int(full.group(3), 16))
        elif short is not None:
            wanted = (0, int(short.group(1), 16), int(short.group(2), 16))
        else:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        for device in range(self.device_count):
            if self.pci_location(device) == wanted:
                return CUresult(0), CUdevice(device)
        return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 1)

    @_recorded
    def cuDeviceGetLuid(self, dev: Any) -> tuple[Any, ...]:
        """CUDA_ERROR_NOT_SUPPORTED, as a Linux driver is believed to answer (not verified); (CUresult, luid,
        deviceNodeMask) in the wheel's shape."""
        device = self._device(dev)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 2)
        if device is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 2)
        return _result(CUresult.CUDA_ERROR_NOT_SUPPORTED, 2)

    def _atomic_operations(self, operations: Any, count: int) -> list[int] | None:
        """The operations' values, checked as the wheel checks them (TypeError, RuntimeError); None for an
        operation that is none (CU_ATOMIC_OPERATION_MAX) or a count of 0."""
        if operations is not None and not isinstance(operations, list | tuple):
            raise TypeError("Argument 'operations' is not instance of type (expected tuple[cydriver.CUatomicOperation] "
                            "or list[cydriver.CUatomicOperation]")
        given = list(operations or [])
        if not all(isinstance(op, self.CUatomicOperation) for op in given):
            raise TypeError("Argument 'operations' is not instance of type (expected tuple[cydriver.CUatomicOperation] "
                            "or list[cydriver.CUatomicOperation]")
        if int(count) < 0:
            raise OverflowError("can't convert negative value to unsigned int")
        if len(given) < int(count):
            raise RuntimeError(f"List is too small: {len(given)} < {int(count)}")
        values = [int(op) for op in given[:int(count)]]
        if not values or any(value not in HOST_ATOMIC_CAPABILITIES for value in values):
            return None
        return values

    @_recorded
    def cuDeviceGetHostAtomicCapabilities(self, operations: Any, count: int, dev: Any) -> tuple[Any, ...]:
        values = self._atomic_operations(operations, count)
        device = self._device(dev)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if device is None:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 1)
        if values is None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        return CUresult(0), [HOST_ATOMIC_CAPABILITIES[value] for value in values]

    @_recorded
    def cuDeviceGetP2PAtomicCapabilities(self, operations: Any, count: int, srcDevice: Any,  # noqa: N803
                                         dstDevice: Any) -> tuple[Any, ...]:  # noqa: N803
        values = self._atomic_operations(operations, count)
        source, destination = self._device(srcDevice), self._device(dstDevice)
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if source is None or destination is None or source == destination:
            return _result(CUresult.CUDA_ERROR_INVALID_DEVICE, 1)
        if values is None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        return CUresult(0), [P2P_ATOMIC_CAPABILITIES[value] for value in values]

    # --- virtual memory management ------------------------------------------------------------------------------
    # Reserved ranges, physical memory (counted in `used`, so process_memory and a quota see it from cuMemCreate
    # until it is released and mapped nowhere) and mappings, which join `memory` once cuMemSetAccess grants access
    # (a copy before that fails, as an access fault would), as views of their physical memory's bytes, so two
    # mappings of one allocation share them. A copy must lie within one mapping here (the driver lets it span
    # adjacent ones). Errors are those cuda.h documents for each call: INVALID_VALUE for sizes and addresses off
    # the granularity, ranges outside a reservation or over a mapping, and handles never given out.
    def _vmm_access_location(self, location: Any) -> int:
        """0 for a CUmemLocation cuMemSetAccess takes (a device this driver has), else its CUresult (host
        locations are not modelled)."""
        kind = int(self._enum(location.type, CUmemLocationType, "type"))
        if kind != CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE:
            return CUresult.CUDA_ERROR_NOT_SUPPORTED
        return 0 if self._device(location.id) is not None else CUresult.CUDA_ERROR_INVALID_DEVICE

    def _vmm_prop(self, prop: Any) -> tuple[int, int]:
        """(CUresult, device) of a CUmemAllocationProp: pinned device memory of a device this driver has."""
        if not isinstance(prop, CUmemAllocationProp):
            raise TypeError(f"Argument 'prop' has incorrect type (expected CUmemAllocationProp, got "
                            f"{type(prop).__name__})")
        if int(self._enum(prop.type, CUmemAllocationType, "type")) != CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED:
            return CUresult.CUDA_ERROR_INVALID_VALUE, -1
        self._enum(prop.requestedHandleTypes, CUmemAllocationHandleType, "requestedHandleTypes")
        kind = int(self._enum(prop.location.type, CUmemLocationType, "type"))
        if kind != CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE:
            return CUresult.CUDA_ERROR_NOT_SUPPORTED, -1  # host-located memory: not modelled
        device = self._device(prop.location.id)
        return (CUresult.CUDA_ERROR_INVALID_DEVICE, -1) if device is None else (0, device)

    @staticmethod
    def _off_granularity(*values: int) -> bool:
        return any(int(v) % VMM_GRANULARITY for v in values)

    def _reservation_of(self, pointer: int, size: int) -> int | None:
        return next((b for b, n in self.reserved.items() if b <= pointer and pointer + size <= b + n), None)

    @_recorded
    def cuMemGetAllocationGranularity(self, prop: Any, option: Any) -> tuple[Any, ...]:
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        self._enum(option, CUmemAllocationGranularity_flags, "option")
        err, _device = self._vmm_prop(prop)
        if err == CUresult.CUDA_ERROR_NOT_SUPPORTED:  # host memory: the driver answers its granularity (H200)
            return CUresult(0), VMM_GRANULARITY
        if err:  # a device it does not have is an invalid property here (cuda.h lists no INVALID_DEVICE)
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE if err == CUresult.CUDA_ERROR_INVALID_DEVICE else err, 1)
        return CUresult(0), VMM_GRANULARITY

    @_recorded
    def cuMemAddressReserve(self, size: int, alignment: int, addr: Any, flags: int) -> tuple[Any, ...]:
        """At the hint when it is free and aligned, else at a fresh address (a hint is only a hint)."""
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        size, alignment, hint = int(size), int(alignment), int(addr or 0)
        if not size or int(flags) or self._off_granularity(size) or alignment & (alignment - 1):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        align = max(alignment, VMM_GRANULARITY)
        taken = list(self.reserved.items()) + [(b, max(len(d), 1) + GUARD) for b, d in self.memory.items()]
        if not (hint and hint % align == 0 and all(hint + size <= b or b + n <= hint for b, n in taken)):
            hint = _align(self._next_pointer, align)
            self._next_pointer = hint + size + GUARD
        self.reserved[hint] = size
        return CUresult(0), CUdeviceptr(hint)

    @_recorded
    def cuMemAddressFree(self, ptr: Any, size: int) -> tuple[Any, ...]:
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        base = int(ptr or 0)
        if self.reserved.get(base) != int(size) or any(base <= p < base + int(size) for p in self.mappings):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)  # not a whole reservation, or still mapped
        del self.reserved[base]
        return _result(0)

    @_recorded
    def cuMemCreate(self, size: int, prop: Any, flags: int) -> tuple[Any, ...]:
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        err, device = self._vmm_prop(prop)
        if err:
            return _result(err, 1)
        size = int(size)
        if not size or int(flags) or self._off_granularity(size):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        if self.used[device] + size > self.total_mem[device]:
            return _result(CUresult.CUDA_ERROR_OUT_OF_MEMORY, 1)
        handle = self._handle()
        alloc_flags = (int(prop.allocFlags.compressionType), int(prop.allocFlags.gpuDirectRDMACapable),
                       int(prop.allocFlags.usage))
        handle_types = int(prop.requestedHandleTypes)
        data, descriptor = _exportable(size, device) if handle_types & POSIX_FILE_DESCRIPTOR else (bytearray(size), -1)
        self.physical[handle] = _Physical(data, device, handle_types=handle_types, flags=alloc_flags,
                                          descriptor=descriptor)
        self.used[device] += size
        self._note = {"device": device}
        return CUresult(0), CUmemGenericAllocationHandle(handle)

    def _vmm_give_back(self, handle: int) -> None:
        """Physical memory goes once released and mapped nowhere (cuMemRelease's documentation)."""
        physical = self.physical.get(handle)
        if physical is not None and physical.released and all(m.handle != handle for m in self.mappings.values()):
            del self.physical[handle]
            if not physical.imported:
                self.used[physical.device] -= len(physical.data)
            if physical.descriptor >= 0:
                os.close(physical.descriptor)

    @_recorded
    def cuMemRelease(self, handle: Any) -> tuple[Any, ...]:
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        physical = self.physical.get(int(handle or 0))
        if physical is None or physical.released:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        physical.references -= 1  # a retained handle is released once more (cuMemRetainAllocationHandle)
        physical.released = physical.references == 0
        self._vmm_give_back(int(handle))
        return _result(0)

    @_recorded
    def cuMemExportToShareableHandle(self, handle: Any, handle_type: Any, flags: int) -> tuple[Any, ...]:
        """A new descriptor of the memory (the caller's to close), for memory created exportable as one."""
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        physical = self.physical.get(int(handle or 0))
        if (physical is None or physical.released or int(flags) or int(handle_type) != POSIX_FILE_DESCRIPTOR
                or physical.descriptor < 0):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        return CUresult(0), os.dup(physical.descriptor)

    @_recorded
    def cuMemImportFromShareableHandle(self, os_handle: Any, handle_type: Any) -> tuple[Any, ...]:
        """A handle of this process for the memory behind an exported descriptor (the same bytes); the descriptor
        stays the caller's. The memory counts where it was created."""
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        try:
            descriptor = int(os_handle)
            name = os.readlink(f"/proc/self/fd/{descriptor}")
            size = os.fstat(descriptor).st_size
        except (OSError, TypeError, ValueError):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        found = re.match(rf"/memfd:{EXPORT_NAME}(\d+) ", name)
        if int(handle_type) != POSIX_FILE_DESCRIPTOR or found is None or not size:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        kept = os.dup(descriptor)
        handle = self._handle()
        self.physical[handle] = _Physical(mmap.mmap(kept, size), int(found.group(1)),
                                          handle_types=POSIX_FILE_DESCRIPTOR, descriptor=kept, imported=True)
        return CUresult(0), CUmemGenericAllocationHandle(handle)

    @_recorded
    def cuIpcGetMemHandle(self, dptr: Any) -> tuple[Any, ...]:
        """A handle for an allocation of cuMemAlloc, by its base. Its bytes move into a memfd at the first export, so
        that another process opening the handle maps the same memory, as on a GPU."""
        if err := self._context_error():
            return _result(err, 1)
        base = int(dptr or 0)
        if base not in self.allocations:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        if base not in self.ipc_exported:
            data = self.memory[base]
            shared, descriptor = _exportable(len(data), self.allocations[base])
            shared[:len(data)] = data
            self.memory[base], self.ipc_exported[base] = shared, descriptor
        handle = CUipcMemHandle()
        ctypes.memmove(handle.getPtr(), IPC_MEMORY_HANDLE.pack(b"FAKEIPCM", os.getpid(), self.ipc_exported[base],
                                                               len(self.memory[base])), IPC_MEMORY_HANDLE.size)
        return CUresult(0), handle

    @_recorded
    def cuIpcOpenMemHandle(self, handle: Any, flags: int) -> tuple[Any, ...]:
        """Another process's exported allocation mapped here (its memfd reopened through /proc), at an address of
        this process's, counted where it was allocated. A handle of this process's own is the driver's
        CUDA_ERROR_INVALID_CONTEXT (the fake's choice: a GPU's answer is not modelled)."""
        if err := self._context_error():
            return _result(err, 1)
        raw = ctypes.string_at(handle.getPtr(), IPC_MEMORY_HANDLE.size)
        magic, pid, descriptor, size = IPC_MEMORY_HANDLE.unpack(raw)
        if magic != b"FAKEIPCM" or not size or int(flags) & ~1:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        if pid == os.getpid():
            return _result(CUresult.CUDA_ERROR_INVALID_CONTEXT, 1)
        try:
            opened = os.open(f"/proc/{pid}/fd/{descriptor}", os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        base = self._allocate(size, self._device_of_current(), track=False)
        self.memory[base], self.ipc_opened[base] = mmap.mmap(opened, size), opened
        return CUresult(0), CUdeviceptr(base)

    @_recorded
    def cuIpcCloseMemHandle(self, dptr: Any) -> tuple[Any, ...]:
        if err := self._context_error():
            return _result(err)
        base = int(dptr or 0)
        if base not in self.ipc_opened:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        self._drain()
        del self.memory[base]
        os.close(self.ipc_opened.pop(base))
        return _result(0)

    @_recorded
    def cuIpcGetEventHandle(self, event: Any) -> tuple[Any, ...]:
        if err := self._context_error():
            return _result(err, 1)
        known = self.events.get(int(event or 0))
        if known is None or known["flags"] & EVENT_INTERPROCESS_FLAGS != EVENT_INTERPROCESS_FLAGS:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        handle = CUipcEventHandle()
        ctypes.memmove(handle.getPtr(), IPC_EVENT_HANDLE.pack(b"FAKEIPCE", os.getpid(), int(event)),
                       IPC_EVENT_HANDLE.size)
        return CUresult(0), handle

    @_recorded
    def cuIpcOpenEventHandle(self, handle: Any) -> tuple[Any, ...]:
        """An event of this process standing for another's (the fake keeps no state across processes: it is
        complete, as an event nothing was recorded on is)."""
        if err := self._context_error():
            return _result(err, 1)
        magic, pid, _event = IPC_EVENT_HANDLE.unpack(ctypes.string_at(handle.getPtr(), IPC_EVENT_HANDLE.size))
        if magic != b"FAKEIPCE":
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        if pid == os.getpid():
            return _result(CUresult.CUDA_ERROR_INVALID_CONTEXT, 1)
        opened = self._handle()
        self.events[opened] = {"flags": EVENT_INTERPROCESS_FLAGS, "recorded": 0, "stream": 0, "capture": 0}
        return CUresult(0), CUevent(opened)

    @_recorded
    def cuMemMap(self, ptr: Any, size: int, offset: int, handle: Any, flags: int) -> tuple[Any, ...]:
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        pointer, size, offset = int(ptr or 0), int(size), int(offset)
        physical = self.physical.get(int(handle or 0))
        if (physical is None or physical.released or int(flags) or not size
                or self._off_granularity(pointer, size, offset) or offset + size > len(physical.data)
                or self._reservation_of(pointer, size) is None
                or any(pointer < p + m.size and p < pointer + size for p, m in self.mappings.items())):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        self.mappings[pointer] = _Mapping(size, int(handle), offset)
        return _result(0)

    @_recorded
    def cuMemUnmap(self, ptr: Any, size: int) -> tuple[Any, ...]:
        """Whole mappings only (a sub-range of one is refused, as cuda.h says)."""
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        pointer, size = int(ptr or 0), int(size)
        touched = [p for p, m in self.mappings.items() if pointer < p + m.size and p < pointer + size]
        if (not size or self._off_granularity(pointer, size) or self._reservation_of(pointer, size) is None
                or not touched or any(p < pointer or p + self.mappings[p].size > pointer + size for p in touched)):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        self._drain()  # the driver waits for work that may use the range
        for p in touched:
            mapping = self.mappings.pop(p)
            self.memory.pop(p, None)
            self.origin.pop(p, None)
            self._vmm_give_back(mapping.handle)
        return _result(0)

    @_recorded
    def cuMemSetAccess(self, ptr: Any, size: int, desc: Any, count: int) -> tuple[Any, ...]:
        """The range must be mapped all through; device locations only."""
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        pointer, size = int(ptr or 0), int(size)
        descs = list(desc or [])
        if not size or not descs or int(count) != len(descs):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        inside = sorted(p for p, m in self.mappings.items() if pointer < p + m.size and p < pointer + size)
        covered = pointer
        for p in inside:
            if p > covered:
                break
            covered = max(covered, p + self.mappings[p].size)
        if covered < pointer + size or any(p < pointer for p in inside):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)  # not fully mapped, or not from a mapping's start
        access = 0
        granted = {}
        for item in descs:
            if not isinstance(item, CUmemAccessDesc):
                raise TypeError(f"Argument 'desc' has incorrect type (expected CUmemAccessDesc, got "
                                f"{type(item).__name__})")
            flags = int(self._enum(item.flags, CUmemAccess_flags, "flags"))
            if err := self._vmm_access_location(item.location):
                return _result(err)
            access |= flags
            granted[int(item.location.id)] = flags
        for p in inside:
            mapping = self.mappings[p]
            mapping.access = access
            mapping.granted.update(granted)
            if access:  # now addressable: copies and memsets reach the physical bytes
                view = memoryview(self.physical[mapping.handle].data)[mapping.offset:mapping.offset + mapping.size]
                self.memory[p] = view  # type: ignore[assignment]  # a view aliases the physical bytes
                self.origin[p] = (0, 0)
            else:
                self.memory.pop(p, None)
        return _result(0)

    # --- pointer attributes ---------------------------------------------------------------------------------------
    @_recorded
    def cuPointerGetAttribute(self, attribute: Any, ptr: Any) -> tuple[Any, ...]:
        """Device memory only (allocations and module globals). Values: the context it was allocated in, its
        device, its range; BUFFER_ID/MEMORY_BLOCK_ID its base's position; booleans as CUDA answers for plain
        device memory (IS_LEGACY_CUDA_IPC_CAPABLE only outside pools); MEMPOOL_HANDLE the pool or NULL.
        HOST_POINTER of device memory and P2P_TOKENS answer CUDA_ERROR_INVALID_VALUE / NOT_SUPPORTED."""
        which = int(self._enum(attribute, CUpointer_attribute, "attribute"))
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        address = int(ptr) if ptr is not None else 0
        base = next((b for b, data in self.memory.items() if b <= address < b + max(len(data), 1)), None)
        if base is None or which == 4:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        if which == 5:
            return _result(CUresult.CUDA_ERROR_NOT_SUPPORTED, 1)
        context, pool = self.origin.get(base, (0, 0))
        # the memory's device (a pool's allocation lies on the pool's, whatever context made it), else its context's
        device = self.allocations[base] if base in self.allocations else (
            self.contexts[context].device if context in self.contexts else 0)
        size, ident = len(self.memory[base]), 1 + sorted(self.memory).index(base)
        values: dict[int, Any] = {
            1: CUcontext(context), 2: CU_MEMORYTYPE_DEVICE, 3: CUdeviceptr(address), 6: False, 7: ident, 8: False,
            9: device, 10: not pool, 11: CUdeviceptr(base), 12: size, 13: True, 14: 0, 15: 0,
            16: CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE, 17: CUmemoryPool(pool), 18: size, 19: CUdeviceptr(base),
            20: ident, 21: False, 22: 0,
        }
        return CUresult(0), values[which]

    # --- launches -----------------------------------------------------------------------------------------------
    @staticmethod
    def decode_extra(address: int) -> tuple[int | None, bytes | None]:
        """(error, packed parameters) from a CU_LAUNCH_PARAM_* list at `address`."""
        word = ctypes.sizeof(ctypes.c_void_p)
        buffer = size_address = None
        for index in range(64):
            key = ctypes.c_void_p.from_address(address + 2 * index * word).value or 0
            if key == CU_LAUNCH_PARAM_END:
                break
            value = ctypes.c_void_p.from_address(address + (2 * index + 1) * word).value or 0
            if key == CU_LAUNCH_PARAM_BUFFER_POINTER:
                buffer = value
            elif key == CU_LAUNCH_PARAM_BUFFER_SIZE:
                size_address = value
            else:
                return CUresult.CUDA_ERROR_INVALID_VALUE, None
        else:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        if buffer is None or size_address is None:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        size = ctypes.c_size_t.from_address(size_address).value
        return None, ctypes.string_at(buffer, size) if size else b""

    @_recorded
    def cuLaunchKernel(self, f: Any, gridDimX: int, gridDimY: int, gridDimZ: int, blockDimX: int,  # noqa: N803
                       blockDimY: int, blockDimZ: int, sharedMemBytes: int, hStream: Any,  # noqa: N803
                       kernelParams: Any, extra: Any) -> tuple[Any, ...]:  # noqa: N803
        return self._launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                            hStream, kernelParams, extra, False)

    @_recorded
    def cuLaunchKernelEx(self, config: Any, f: Any, kernelParams: Any, extra: Any) -> tuple[Any, ...]:  # noqa: N803
        """Reads the C CUlaunchConfig behind `config` (a CUlaunchConfig made with `_ptr`, as the wheel's C call
        does) and launches as cuLaunchKernel; the launch record lists the attributes as [id, first 16 value bytes
        in hex]. COOPERATIVE (2) with a non-zero value marks it cooperative."""
        c = LaunchConfig.from_address(config.getPtr())
        attributes = []
        if c.numAttrs:
            raw = ctypes.string_at(c.attrs, c.numAttrs * LAUNCH_ATTRIBUTE.size)
            attributes = [[identifier, value[:16].hex()] for identifier, value in LAUNCH_ATTRIBUTE.iter_unpack(raw)]
        cooperative = any(a[0] == 2 and int(a[1][:8], 16) for a in attributes)
        result = self._launch(f, c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY, c.blockDimZ,
                              c.sharedMemBytes, c.hStream, kernelParams, extra, cooperative)
        if "launch" in self._note:
            self._note["launch"]["attributes"] = attributes
        return result

    @_recorded
    def cuLaunchCooperativeKernel(self, f: Any, gridDimX: int, gridDimY: int, gridDimZ: int,  # noqa: N803
                                  blockDimX: int, blockDimY: int, blockDimZ: int, sharedMemBytes: int,  # noqa: N803
                                  hStream: Any, kernelParams: Any) -> tuple[Any, ...]:  # noqa: N803
        """As cuLaunchKernel with `kernelParams` only (no `extra` form exists); the launch record says
        cooperative. The co-residency limit (blocks <= occupancy x SMs) is not modelled."""
        kernel = self.functions.get(int(f)) or self.kernels.get(int(f))
        if kernel is not None and kernel.layout and kernelParams is None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        return self._launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                            hStream, kernelParams, None, True)

    def _launch(self, f: Any, gridDimX: int, gridDimY: int, gridDimZ: int, blockDimX: int,  # noqa: N803
                blockDimY: int, blockDimZ: int, sharedMemBytes: int, hStream: Any,  # noqa: N803
                kernelParams: Any, extra: Any, cooperative: bool) -> tuple[Any, ...]:  # noqa: N803
        if err := self._context_error():
            return _result(err)
        kernel = self.functions.get(int(f)) or self.kernels.get(int(f))
        if kernel is None:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE)
        if not self._stream_ok(hStream):
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE)
        grid, block = (int(gridDimX), int(gridDimY), int(gridDimZ)), (int(blockDimX), int(blockDimY), int(blockDimZ))
        if min(grid + block) <= 0 or block[0] * block[1] * block[2] > 1024 or int(sharedMemBytes) > 228 * 1024:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        if kernelParams is not None and extra is not None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        layout = kernel.layout
        expected = max((o + s for o, s in layout), default=0) if layout is not None else None  # packed size
        if extra is not None:
            err, packed = self.decode_extra(int(extra))
            if err is not None or packed is None:
                return _result(err or CUresult.CUDA_ERROR_INVALID_VALUE)
            source = "extra"
        elif kernelParams is not None:
            if not isinstance(kernelParams, int) or layout is None:
                raise TypeError("the fake takes kernelParams only as a void** address, for PTX kernels")
            pointers = (ctypes.c_void_p * max(len(layout), 1)).from_address(kernelParams) if layout else []
            buffer = bytearray(expected or 0)
            for (offset, size), pointer in zip(layout, pointers, strict=False):
                buffer[offset:offset + size] = ctypes.string_at(pointer, size)
            packed, source = bytes(buffer), "kernelParams"
        else:
            packed, source = b"", "none"
        capture = self._capture_of(hStream)
        if kernel.name == ADD_KERNEL:
            err = self._add_kernel(packed, hStream)
        else:  # runs nothing; captured, it is a kernel node all the same
            err = self._enqueue(hStream, lambda: None) if capture is not None else 0
        if err:
            return _result(err)
        launch = {"function": int(f), "kernel": kernel.name.decode(), "grid": list(grid), "block": list(block),
                  "shared": int(sharedMemBytes), "stream": int(hStream or 0), "params": packed.hex(),
                  "source": source, "size_matches": expected is None or len(packed) == expected,
                  "cooperative": cooperative}
        if capture is not None:
            launch["captured"] = capture.ident  # a kernel node of that capture's graph: it ran nothing yet
        self.launches.append(launch)
        self._note = {"launch": launch}
        return _result(0)

    def _add_kernel(self, params: bytes, stream: Any) -> int:
        """ADD_KERNEL(u32 *words, u32 count, u32 value): words[i] += value for i < count, in stream order, through
        device memory or registered host memory (unified addressing); an address with no memory behind it is
        CUDA_ERROR_ILLEGAL_ADDRESS, answered by the launch itself (a GPU's would surface at the next sync)."""
        if len(params) < 16:
            return CUresult.CUDA_ERROR_INVALID_VALUE
        words, count, value = struct.unpack_from("<QII", params)
        cells = [self._word(words + 4 * i) for i in range(count)]
        if any(cell is None for cell in cells):
            return CUresult.CUDA_ERROR_ILLEGAL_ADDRESS

        def run() -> None:
            for read, write, _ in cells:  # type: ignore[misc]
                write((read() + value) & 0xFFFFFFFF)
        return self._enqueue(stream, run, CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL)

    # --- context limits ----------------------------------------------------------------------------------------
    @_recorded
    def cuCtxGetLimit(self, limit: Any) -> tuple[Any, ...]:
        """LIMIT_DEFAULTS until set in the current context; an unmodelled limit: CUDA_ERROR_UNSUPPORTED_LIMIT."""
        if err := self._context_error():
            return _result(err, 1)
        which = int(self._enum(limit, CUlimit, "limit"))
        value = self.limits.get(self._current() or 0, {}).get(which, LIMIT_DEFAULTS.get(which))
        if value is None:
            return _result(CUresult.CUDA_ERROR_UNSUPPORTED_LIMIT, 1)
        return CUresult(0), value

    @_recorded
    def cuCtxSetLimit(self, limit: Any, value: int) -> tuple[Any, ...]:
        """Per context. Past its ceiling: the two L2 hints are clamped, as the driver documents; the rest are
        refused (CUDA_ERROR_INVALID_VALUE)."""
        if err := self._context_error():
            return _result(err)
        which = int(self._enum(limit, CUlimit, "limit"))
        if which not in LIMIT_DEFAULTS:
            return _result(CUresult.CUDA_ERROR_UNSUPPORTED_LIMIT)
        number = int(value)
        ceiling = LIMIT_CEILINGS.get(which)
        if ceiling is not None and number > ceiling:
            if which not in (5, 6):
                return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
            number = ceiling
        self.limits.setdefault(self._current() or 0, {})[which] = number
        return _result(0)

    # --- stream memory operations -------------------------------------------------------------------------------
    def _word(self, address: int, size: int = 4) -> tuple[Callable[[], int], Callable[[int], None], bool] | None:
        """Reader and writer of the 32-bit (`size` 4) or 64-bit (8) word at a device address (device memory, or
        registered host memory, which maps at its own address), and whether it is host memory; None where no
        memory is."""
        span = self._span(address, size)
        if span is not None:
            data, offset = span

            def write_device(value: int) -> None:
                data[offset:offset + size] = value.to_bytes(size, "little")
            return (lambda: int.from_bytes(data[offset:offset + size], "little")), write_device, False
        if any(base <= address and address + size <= base + length for base, length in self.registered.items()):
            cell = (ctypes.c_uint32 if size == 4 else ctypes.c_uint64).from_address(address)

            def write_host(value: int) -> None:
                cell.value = value
            return (lambda: cell.value), write_host, True
        return None

    @staticmethod
    def wait_satisfied(word: int, value: int, condition: int, bits: int = 32) -> bool:
        """CU_STREAM_WAIT_VALUE_GEQ (a cyclic comparison: (int32_t)(word - value) >= 0, int64_t for 64 `bits`), EQ,
        AND, NOR."""
        mask = (1 << bits) - 1
        if condition == 0:
            return (word - value) & mask < 1 << (bits - 1)
        if condition == 1:
            return word == value
        if condition == 2:
            return bool(word & value)
        return bool(~(word | value) & mask)

    @staticmethod
    def _write_of(word: tuple[Callable[[], int], Callable[[int], None], bool], value: int) -> Callable[[], None]:
        """A write of `value` to `word` (_word's accessors), for its turn in a stream."""
        return lambda: word[1](value)

    def _wait_of(self, word: tuple[Callable[[], int], Callable[[int], None], bool], value: int, condition: int,
                 bits: int = 32) -> Callable[[], bool]:
        """A wait until `word` satisfies `condition` against `value` (False while not: _enqueue's held-back wait);
        marked `on_host` for a word of host memory, which another process may write (_drain polls it)."""
        read = word[0]

        def wait() -> bool:
            return self.wait_satisfied(read(), value, condition, bits)
        wait.on_host = word[2]  # type: ignore[attr-defined]
        return wait

    def _value_op(self, stream: Any, addr: Any, value: Any) -> tuple[int, Any]:
        """(error, the word's accessors) for a stream memory operation's common checks."""
        if err := self._stream_error(stream):
            return err, None
        address = int(addr or 0)
        word = self._word(address) if address % 4 == 0 else None
        if word is None or not 0 <= int(value) < 1 << 32:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        return 0, word

    @_recorded
    def cuStreamWriteValue32(self, stream: Any, addr: Any, value: Any, flags: int) -> tuple[Any, ...]:
        """Writes `value` in stream order (device memory, or registered host memory by its device pointer)."""
        err, word = self._value_op(stream, addr, value)
        if err or int(flags) & ~1:  # CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER is the only flag
            return _result(err or CUresult.CUDA_ERROR_INVALID_VALUE)
        return _result(self._enqueue(stream, self._write_of(word, int(value)), self.NODE_BATCH_MEM_OP))

    @_recorded
    def cuStreamWaitValue32(self, stream: Any, addr: Any, value: Any, flags: int) -> tuple[Any, ...]:
        """Holds back the stream's later work until the word satisfies the condition (flags: GEQ 0, EQ 1, AND 2,
        NOR 3, optionally | FLUSH). A wait on host memory may be satisfied by another process: see `_drain`."""
        err, word = self._value_op(stream, addr, value)
        condition = int(flags) & ~CU_STREAM_WAIT_VALUE_FLUSH
        if err or not 0 <= condition <= 3:
            return _result(err or CUresult.CUDA_ERROR_INVALID_VALUE)
        return _result(self._enqueue(stream, self._wait_of(word, int(value), condition), self.NODE_BATCH_MEM_OP))

    # --- cluster occupancy and tensor maps -------------------------------------------------------------------------
    @_recorded
    def cuOccupancyMaxActiveClusters(self, func: Any, config: Any) -> tuple[Any, ...]:
        """From the C CUlaunchConfig behind `config`: its CLUSTER_DIMENSION attribute (4) is required (a fake
        kernel has no compiled cluster size: CUDA_ERROR_INVALID_CLUSTER_SIZE without it, and past 8 blocks, the
        portable limit); clusters = blocks per SM (as cuOccupancyMaxActiveBlocksPerMultiprocessor) x SMs / size."""
        if err := self._context_error():
            return _result(err, 1)
        if int(func) not in self.functions and int(func) not in self.kernels:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 1)
        c = LaunchConfig.from_address(config.getPtr())
        if not self._stream_ok(c.hStream):
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 1)
        threads = c.blockDimX * c.blockDimY * c.blockDimZ
        if not 0 < threads <= 1024 or min(c.blockDimX, c.blockDimY, c.blockDimZ) == 0 or c.sharedMemBytes > 228 * 1024:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        raw = ctypes.string_at(c.attrs, c.numAttrs * LAUNCH_ATTRIBUTE.size) if c.numAttrs else b""
        cluster = [struct.unpack_from("<3I", value) for identifier, value in LAUNCH_ATTRIBUTE.iter_unpack(raw)
                   if identifier == 4]
        size = cluster[-1][0] * cluster[-1][1] * cluster[-1][2] if cluster else 0
        if not 0 < size <= 8:
            return _result(CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE, 1)
        per_sm = max(1, 2048 // threads) - (1 if c.sharedMemBytes else 0)
        return CUresult(0), per_sm * self.device_attribute(16, self._device_of_current()) // size

    @_recorded
    def cuOccupancyMaxPotentialClusterSize(self, func: Any, config: Any) -> tuple[Any, ...]:
        """From the C CUlaunchConfig behind `config`, whose cluster dimensions are ignored (cuda.h): the portable
        maximum, 8 blocks, since a fake kernel has no compiled cluster size and allows no non-portable one; the
        function, stream and block are checked as cuOccupancyMaxActiveClusters checks them."""
        if err := self._context_error():
            return _result(err, 1)
        if int(func) not in self.functions and int(func) not in self.kernels:
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 1)
        c = LaunchConfig.from_address(config.getPtr())
        if not self._stream_ok(c.hStream):
            return _result(CUresult.CUDA_ERROR_INVALID_HANDLE, 1)
        threads = c.blockDimX * c.blockDimY * c.blockDimZ
        if not 0 < threads <= 1024 or min(c.blockDimX, c.blockDimY, c.blockDimZ) == 0 or c.sharedMemBytes > 228 * 1024:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        return CUresult(0), 8

    # --- stream attributes -----------------------------------------------------------------------------------------
    # The IDs cuda.h marks valid for streams, and each one's value before a set: none of these defaults was read on a
    # GPU (the fake's choice: no access policy window, CU_SYNC_POLICY_AUTO, domain map default 0 / remote 1, the
    # default domain, no NVLink-centric scheduling); PRIORITY (8) is the stream's own priority.
    STREAM_ATTRIBUTE_DEFAULTS = {1: bytes(64), 3: struct.pack("<i60x", 1), 9: struct.pack("<BB62x", 0, 1),
                                 10: bytes(64), 16: bytes(64)}
    STREAM_PRIORITY = 8

    def _stream_attribute_error(self, stream: Any, attr: Any) -> int:
        if err := self._stream_error(stream):
            return err
        identifier = int(self._enum(attr, CUstreamAttrID, "attr"))
        ok = identifier in self.STREAM_ATTRIBUTE_DEFAULTS or identifier == self.STREAM_PRIORITY
        return 0 if ok else CUresult.CUDA_ERROR_INVALID_VALUE

    @_recorded
    def cuStreamGetAttribute(self, hStream: Any, attr: Any) -> tuple[Any, ...]:  # noqa: N803
        """The value set last (cuStreamSetAttribute, cuStreamCopyAttributes), else its default (above). An ID not
        valid for streams is CUDA_ERROR_INVALID_VALUE."""
        if err := self._stream_attribute_error(hStream, attr):
            return _result(err, 1)
        key, identifier = int(hStream or 0), int(attr)
        if identifier == self.STREAM_PRIORITY:
            priority = self.streams[key][2] if key in self.streams else 0
            return CUresult(0), CUstreamAttrValue(data=struct.pack("<i60x", priority))
        value = self.stream_attributes.get(key, {}).get(identifier, self.STREAM_ATTRIBUTE_DEFAULTS[identifier])
        return CUresult(0), CUstreamAttrValue(data=value)

    @_recorded
    def cuStreamSetAttribute(self, hStream: Any, attr: Any, value: Any) -> tuple[Any, ...]:  # noqa: N803
        """Checks what cuda.h bounds (the fake's reading, not checked on a GPU): an access policy window's hit ratio
        in [0, 1] and its properties NORMAL, STREAMING or PERSISTING; a synchronization policy AUTO..BLOCKING_SYNC;
        a domain DEFAULT or REMOTE; NVLink-centric scheduling 0 or 1 (CUDA_ERROR_INVALID_VALUE otherwise). A
        priority is clamped to the context's range ([-5, 0]) and becomes the stream's (cuStreamGetPriority)."""
        if err := self._stream_attribute_error(hStream, attr):
            return _result(err)
        key, identifier = int(hStream or 0), int(attr)
        data = ctypes.string_at(value.getPtr(), 64)
        if identifier == self.STREAM_PRIORITY:
            priority = min(max(struct.unpack_from("<i", data)[0], -5), 0)
            if key in self.streams:
                context, flags, _ = self.streams[key]
                self.streams[key] = (context, flags, priority)
            return _result(0)
        if identifier == 1:
            _base, _size, ratio, hit, miss = struct.unpack_from("<QQfii", data)
            valid = 0.0 <= ratio <= 1.0 and 0 <= hit <= 2 and 0 <= miss <= 2
        else:
            number = struct.unpack_from("<i", data)[0]
            valid = identifier == 9 or number in {3: (1, 2, 3, 4), 10: (0, 1), 16: (0, 1)}[identifier]
        if not valid:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        self.stream_attributes.setdefault(key, {})[identifier] = data
        return _result(0)

    @_recorded
    def cuStreamCopyAttributes(self, dst: Any, src: Any) -> tuple[Any, ...]:
        """Every attribute of `src`, its priority too, becomes `dst`'s (the fake's reading: not checked on a GPU)."""
        for stream in (dst, src):
            if err := self._stream_error(stream):
                return _result(err)
        source, target = int(src or 0), int(dst or 0)
        self.stream_attributes[target] = dict(self.stream_attributes.get(source, {}))
        if target in self.streams:
            context, flags, _ = self.streams[target]
            self.streams[target] = (context, flags, self.streams[source][2] if source in self.streams else 0)
        return _result(0)

    @_recorded
    def cuTensorMapEncodeTiled(self, tensorDataType: Any, tensorRank: int, globalAddress: Any,  # noqa: N803
                               globalDim: Any, globalStrides: Any, boxDim: Any, elementStrides: Any,  # noqa: N803
                               interleave: Any, swizzle: Any, l2Promotion: Any, oobFill: Any) -> tuple[Any, ...]:  # noqa: N803
        """The driver's documented requirements (rank 1-5, 3-5 interleaved; a 16-byte aligned address, 32 with
        32-byte interleave; dims 1..2^32; strides multiples of 16 below 2^40; box 1..256 with an inner extent of
        whole 16 bytes; element strides 1..8); the map's 128 bytes pack the arguments (`tensor_map_bytes`).
        Lists of cuuint64_t/cuuint32_t, as the wheel takes them (plain ints raise TypeError)."""
        dtype = int(self._enum(tensorDataType, CUtensorMapDataType, "tensorDataType"))
        modes = [int(self._enum(v, cls, name)) for v, cls, name in (
            (interleave, CUtensorMapInterleave, "interleave"), (swizzle, CUtensorMapSwizzle, "swizzle"),
            (l2Promotion, CUtensorMapL2promotion, "l2Promotion"), (oobFill, CUtensorMapFloatOOBfill, "oobFill"))]
        lists = []
        for items, cls in ((globalDim, cuuint64_t), (globalStrides, cuuint64_t), (boxDim, cuuint32_t),
                           (elementStrides, cuuint32_t)):
            for item in items:
                if not isinstance(item, cls):
                    raise TypeError(f"Cannot convert {type(item).__name__} to cuda.bindings.driver.{cls.__name__}")
            lists.append([int(item) for item in items])
        dims, strides, box, steps = lists
        rank, address = int(tensorRank), int(globalAddress or 0)
        size = TENSOR_ELEMENT_BYTES[dtype] or 1
        problems = [
            not (3 if modes[0] else 1) <= rank <= 5, address % (32 if modes[0] == 2 else 16) != 0,
            (len(dims), len(strides), len(box), len(steps)) != (rank, rank - 1, rank, rank),
            any(not 1 <= d <= 1 << 32 for d in dims), any(s % 16 or s >= 1 << 40 for s in strides),
            any(not 1 <= b <= 256 for b in box), any(not 1 <= e <= 8 for e in steps),
            not modes[0] and bool(box) and box[0] * size % 16 != 0,
        ]
        if any(problems):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        return CUresult(0), CUtensorMap(tensor_map_bytes(dtype, rank, address, dims, strides, box, steps, modes))

    def _im2col_map(self, tensorDataType: Any, tensorRank: int, globalAddress: Any, globalDim: Any,  # noqa: N803
                    globalStrides: Any, elementStrides: Any, modes: tuple[Any, ...],  # noqa: N803
                    extra: tuple[Any, ...], corners_ok: bool) -> tuple[Any, ...]:
        """cuTensorMapEncodeIm2col and Im2colWide: a tiled map's rules with rank 3-5 and no box (`extra`, the
        im2col arguments, packed into the map's last bytes: `im2col_map_bytes`)."""
        dtype = int(self._enum(tensorDataType, CUtensorMapDataType, "tensorDataType"))
        values = [int(self._enum(v, cls, name)) for v, cls, name in zip(modes, (
            CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill),
            ("interleave", "swizzle", "l2Promotion", "oobFill"), strict=True)]
        lists = []
        for items, cls in ((globalDim, cuuint64_t), (globalStrides, cuuint64_t), (elementStrides, cuuint32_t)):
            for item in items:
                if not isinstance(item, cls):
                    raise TypeError(f"Cannot convert {type(item).__name__} to cuda.bindings.driver.{cls.__name__}")
            lists.append([int(item) for item in items])
        dims, strides, steps = lists
        rank, address = int(tensorRank), int(globalAddress or 0)
        problems = [
            not 3 <= rank <= 5, address % (32 if values[0] == 2 else 16) != 0, not corners_ok,
            (len(dims), len(strides), len(steps)) != (rank, rank - 1, rank),
            any(not 1 <= d <= 1 << 32 for d in dims), any(s % 16 or s >= 1 << 40 for s in strides),
            any(not 1 <= e <= 8 for e in steps),
        ]
        if any(problems):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        return CUresult(0), CUtensorMap(im2col_map_bytes(dtype, rank, address, dims, strides, steps, values, extra))

    @_recorded
    def cuTensorMapEncodeIm2col(self, tensorDataType: Any, tensorRank: int, globalAddress: Any,  # noqa: N803
                                globalDim: Any, globalStrides: Any, pixelBoxLowerCorner: Any,  # noqa: N803
                                pixelBoxUpperCorner: Any, channelsPerPixel: int, pixelsPerColumn: int,  # noqa: N803
                                elementStrides: Any, interleave: Any, swizzle: Any, l2Promotion: Any,  # noqa: N803
                                oobFill: Any) -> tuple[Any, ...]:  # noqa: N803
        """As cuTensorMapEncodeTiled's rules, rank 3-5, corners of rank - 2 ints (lists of int, as the wheel takes
        them), channels 1..256 and pixels 1..1024 (cuda.h)."""
        lower, upper = [int(v) for v in pixelBoxLowerCorner], [int(v) for v in pixelBoxUpperCorner]
        rank = int(tensorRank)
        ok = len(lower) == len(upper) == rank - 2 and 1 <= int(channelsPerPixel) <= 256 and \
            1 <= int(pixelsPerColumn) <= 1024
        return self._im2col_map(tensorDataType, tensorRank, globalAddress, globalDim, globalStrides, elementStrides,
                                (interleave, swizzle, l2Promotion, oobFill),
                                ("im2col", lower, upper, int(channelsPerPixel), int(pixelsPerColumn)), ok)

    @_recorded
    def cuTensorMapEncodeIm2colWide(self, tensorDataType: Any, tensorRank: int, globalAddress: Any,  # noqa: N803
                                    globalDim: Any, globalStrides: Any, pixelBoxLowerCornerWidth: int,  # noqa: N803
                                    pixelBoxUpperCornerWidth: int, channelsPerPixel: int,  # noqa: N803
                                    pixelsPerColumn: int, elementStrides: Any, interleave: Any,  # noqa: N803
                                    mode: Any, swizzle: Any, l2Promotion: Any, oobFill: Any) -> tuple[Any, ...]:  # noqa: N803
        """As cuTensorMapEncodeIm2col with the two corner widths and the wide mode."""
        wide = int(self._enum(mode, CUtensorMapIm2ColWideMode, "mode"))
        ok = 1 <= int(channelsPerPixel) <= 256 and 1 <= int(pixelsPerColumn) <= 1024
        return self._im2col_map(tensorDataType, tensorRank, globalAddress, globalDim, globalStrides, elementStrides,
                                (interleave, swizzle, l2Promotion, oobFill),
                                ("wide", int(pixelBoxLowerCornerWidth), int(pixelBoxUpperCornerWidth),
                                 int(channelsPerPixel), int(pixelsPerColumn), wide), ok)

    @_recorded
    def cuTensorMapReplaceAddress(self, tensorMap: Any, globalAddress: Any) -> tuple[Any, ...]:  # noqa: N803
        """The map's address (its first 8 bytes in the fake's encoding) rewritten in place; the address must keep
        the encoding's alignment (16 bytes, 32 with 32-byte interleave: the interleave at bytes 16-20)."""
        if not isinstance(tensorMap, CUtensorMap):
            raise TypeError(f"Argument 'tensorMap' has incorrect type (expected CUtensorMap, got "
                            f"{type(tensorMap).__name__})")
        address = int(globalAddress or 0)
        interleave = ctypes.c_int32.from_address(tensorMap.getPtr() + 16).value
        if address % (32 if interleave == 2 else 16):
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        ctypes.c_uint64.from_address(tensorMap.getPtr()).value = address
        return _result(0)

    @_recorded
    def cuTensorMapSetAllocationClass(self, tensorMap: Any, allocClass: Any) -> tuple[Any, ...]:  # noqa: N803
        """The class in effect (AUTO: SMALL, as the conservative policy picks for the fake) written into the map's
        spare word (bytes 32-36, above its kind byte) in place; the class in effect answered."""
        if not isinstance(tensorMap, CUtensorMap):
            raise TypeError(f"Argument 'tensorMap' has incorrect type (expected CUtensorMap, got "
                            f"{type(tensorMap).__name__})")
        requested = int(self._enum(allocClass, CUtensorMapAllocClass, "allocClass"))
        effective = CUtensorMapAllocClass(requested or 1)
        word = ctypes.c_int32.from_address(tensorMap.getPtr() + 32)
        word.value = (word.value & 0xFF) | int(effective) << 8
        return CUresult(0), effective

    @_recorded
    def cuGraphConditionalHandleCreate(self, hGraph: Any, ctx: Any, defaultLaunchValue: int,  # noqa: N803
                                       flags: int) -> tuple[Any, ...]:
        """A handle for conditional nodes of `hGraph` (or of its bodies) in `ctx` (NULL: the current context), its
        value at each launch `defaultLaunchValue` with CU_GRAPH_COND_ASSIGN_DEFAULT in `flags` (else 0: see
        _ConditionalHandle.at_launch). An unknown graph or flags other than 0 and ASSIGN_DEFAULT (cuda.h: "must be")
        are CUDA_ERROR_INVALID_VALUE, an unknown context CUDA_ERROR_INVALID_CONTEXT."""
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED, 1)
        if self._graph(hGraph) is None or int(flags) & ~CU_GRAPH_COND_ASSIGN_DEFAULT:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE, 1)
        if err := self._node_context(ctx):
            return _result(err, 1)
        handle = self._handle()
        self.conditional_handles[handle] = _ConditionalHandle(int(hGraph), int(ctx or 0), int(defaultLaunchValue),
                                                              int(flags))
        return CUresult(0), CUgraphConditionalHandle(handle)

    @_recorded
    def cuGraphDestroyNode(self, hNode: Any) -> tuple[Any, ...]:  # noqa: N803
        """The node leaves its graph with every edge to or from it, and the graphs it owns (a child graph's clone,
        a conditional node's bodies) go with it; executable graphs keep what they were instantiated from. An unknown
        node: CUDA_ERROR_INVALID_VALUE."""
        if not self.initialized:
            return _result(CUresult.CUDA_ERROR_NOT_INITIALIZED)
        key = int(hNode or 0)
        if key in self.node_graph and self._memory_nodes(self.node_graph[key]):  # cuda.h: its nodes stay
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        found = self.nodes.pop(key, None)
        if found is None:
            return _result(CUresult.CUDA_ERROR_INVALID_VALUE)
        graph = self.node_graph.pop(key)
        self.graphs[graph].remove(key)
        self.graph_edges[graph] = [e for e in self.graph_edges.get(graph, []) if key not in e[:2]]
        self._drop_owned(found)
        return _result(0)


def tensor_map_bytes(dtype: int, rank: int, address: int, dims: list[int], strides: list[int], box: list[int],
                     steps: list[int], modes: list[int]) -> bytes:
    """The fake's 128-byte tensor map: its arguments packed (a real one is opaque; tests compare these bytes)."""
    padded = [*dims, *[0] * (5 - len(dims))], [*strides, *[0] * (4 - len(strides))]
    return struct.pack("<QI6i5Q4Q5B5B", address, rank, dtype, *modes, 0, *padded[0], *padded[1],
                       *[b - 1 for b in box] + [0] * (5 - len(box)), *steps + [0] * (5 - len(steps))).ljust(128, b"\0")


def im2col_map_bytes(dtype: int, rank: int, address: int, dims: list[int], strides: list[int], steps: list[int],
                     modes: list[int], extra: tuple[Any, ...]) -> bytes:
    """The fake's 128-byte im2col map: a tiled map's packing with no box, its kind (1 im2col, 2 wide) in the spare
    word at bytes 32-36 and a digest of the im2col arguments (`extra`: corners, channels, pixels, mode) last."""
    tiled = bytearray(tensor_map_bytes(dtype, rank, address, dims, strides, [], steps, modes))
    struct.pack_into("<i", tiled, 32, 1 if extra[0] == "im2col" else 2)
    tiled[118:128] = hashlib.sha256(repr(extra).encode()).digest()[:10]
    return bytes(tiled)


# Names of every driver function the fake implements.
IMPLEMENTED = frozenset(name for name, value in vars(FakeDriver).items()
                        if name.startswith("cu") and name[2:3].isupper() and callable(value))


class FakeMeter:
    """host_agent.session.gpu_memory's NVML meter for a FakeDriver (CI has no NVML): `FakeDriver.process_memory`.

    Pass it as `ExecutorOptions(meter=FakeMeter)`: the executor calls it with the session's driver. Each query is
    journalled as a call named `nvml.held` (args [device], result [bytes]), so tests can see when the executor
    measures and when it does not."""

    def __init__(self, driver: FakeDriver) -> None:
        self.driver = driver

    def held(self, device: int) -> int | None:
        value = self.driver.process_memory(device)
        self.driver._note = {}
        self.driver._record("nvml.held", (device,), (value,))
        return value
