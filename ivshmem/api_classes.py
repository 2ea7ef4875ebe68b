"""Where every CUDA driver entry point stands: the annotations a header cannot give.

cuda.h (ivshmem/cuda_h.txt, through cuda_header.py) lists every entry point; each is exactly one of

* **forwarded by hand**: an entry of the hand table (driver_api._SPEC), with the payloads it declares;
* **forwarded by construction** (`GENERATED` below): every parameter a scalar, an enum, a handle or a pointer to
  one, so the generic marshalling carries it. An entry here says only what the types cannot: that the call may
  be posted, its effects (driver_api.EFFECTS), a pointer that is read as well as written (`inout`), and how many
  bytes of device memory each device-pointer input reaches (`spans`, checked against the session's memory);
* **answered in the guest** (`GUEST`): the native guest driver answers it from what it already holds, or builds
  it from forwarded calls, in the C file named;
* **unsupported** (`UNSUPPORTED`): it answers CUDA_ERROR_NOT_SUPPORTED (801), named once in the guest's log, for
  the reason written beside it.

tests/unit/test_api_classes.py holds this file to the inventory: no entry point unclassified or classified twice,
and every `GENERATED` call marshallable. docs/api-table.md shows the counts and each reason. What does not belong
here: payload layouts of hand-written calls (driver_api.py) and anything about how a call is served.
"""
from __future__ import annotations

import re
from typing import Any

POSTED = {"posted": True}

# name -> the _SPEC-style options of a call forwarded by construction (posted, effects, roles, spans).
# A span is `argN` (that many bytes), `argN*K`, or `2d:P,W,H,K` (a pitched 2-D range: pitch P, W elements of K
# bytes, H rows), and is given per device-pointer input by its position.
GENERATED: dict[str, dict[str, Any]] = {
    # Events and streams, stream capture
    "cuEventRecordWithFlags": POSTED,
    "cuStreamGetFlags": {}, "cuStreamGetPriority": {}, "cuStreamGetId": {}, "cuStreamGetDevice": {},
    "cuStreamGetCtx_v2": {}, "cuStreamCopyAttributes": {},
    "cuStreamBeginCapture": {}, "cuStreamEndCapture": {},
    "cuThreadExchangeStreamCaptureMode": {"roles": "inout"},
    "cuStreamWaitValue64": {"posted": True, "spans": {1: "8"}},
    "cuStreamWriteValue64": {"posted": True, "spans": {1: "8"}},
    # CUDA graphs: the graph and its executable instance, nodes' types and enablement, launch
    "cuGraphCreate": {}, "cuGraphDestroy": {"effects": "destroys"}, "cuGraphClone": {},
    "cuGraphInstantiate": {"effects": "measures"}, "cuGraphExecDestroy": {"effects": "destroys measures"},
    "cuGraphLaunch": POSTED, "cuGraphUpload": POSTED, "cuGraphExecGetFlags": {},
    "cuGraphDestroyNode": {"effects": "destroys"}, "cuGraphNodeGetType": {}, "cuGraphNodeFindInClone": {},
    "cuGraphNodeGetEnabled": {}, "cuGraphNodeSetEnabled": {}, "cuGraphChildGraphNodeGetGraph": {},
    "cuGraphEventRecordNodeGetEvent": {}, "cuGraphEventRecordNodeSetEvent": {},
    "cuGraphEventWaitNodeGetEvent": {}, "cuGraphEventWaitNodeSetEvent": {},
    "cuGraphExecChildGraphNodeSetParams": {}, "cuGraphExecEventRecordNodeSetEvent": {},
    "cuGraphExecEventWaitNodeSetEvent": {}, "cuGraphKernelNodeCopyAttributes": {},
    "cuGraphMemFreeNodeGetParams": {}, "cuGraphConditionalHandleCreate": {}, "cuDeviceGraphMemTrim": {},
    "cuGraphGetId": {}, "cuGraphExecGetId": {}, "cuGraphNodeGetContainingGraph": {}, "cuGraphNodeGetLocalId": {},
    "cuGraphNodeGetToolsId": {},
    # Contexts
    "cuCtxGetDevice_v2": {}, "cuCtxSynchronize_v2": {}, "cuCtxRecordEvent": {}, "cuCtxWaitEvent": {},
    "cuCtxGetCacheConfig": {}, "cuCtxSetCacheConfig": {}, "cuCtxGetSharedMemConfig": {},
    "cuCtxSetSharedMemConfig": {}, "cuCtxResetPersistingL2Cache": {}, "cuCtxSetFlags": {},
    "cuCtxEnablePeerAccess": {}, "cuCtxDisablePeerAccess": {},
    # Devices
    "cuDeviceComputeCapability": {}, "cuDeviceGetP2PAttribute": {}, "cuDeviceGetExecAffinitySupport": {},
    "cuDeviceSetMemPool": {}, "cuDeviceGetTexture1DLinearMaxWidth": {},
    # Memory: peer copies, pitched memsets, the default pool's trim
    "cuMemcpyPeer": {"spans": {0: "arg4", 2: "arg4"}},
    "cuMemcpyPeerAsync": {"posted": True, "spans": {0: "arg4", 2: "arg4"}},
    "cuMemsetD2D8": {"spans": {0: "2d:1,3,4,1"}}, "cuMemsetD2D16": {"spans": {0: "2d:1,3,4,2"}},
    "cuMemsetD2D32": {"spans": {0: "2d:1,3,4,4"}},
    "cuMemsetD2D8Async": {"posted": True, "spans": {0: "2d:1,3,4,1"}},
    "cuMemsetD2D16Async": {"posted": True, "spans": {0: "2d:1,3,4,2"}},
    "cuMemsetD2D32Async": {"posted": True, "spans": {0: "2d:1,3,4,4"}},
    "cuMemPoolTrimTo": {"effects": "measures"},
    # Memory pools made by the program (cuMemPoolCreate is hand-written), pitched allocations
    "cuMemPoolDestroy": {"effects": "destroys measures"}, "cuMemAllocPitch": {"effects": "allocates_pitched"},
    # Modules, libraries, functions and kernels
    "cuFuncGetModule": {}, "cuFuncIsLoaded": {}, "cuFuncLoad": {"effects": "measures"},
    "cuFuncGetParamCount": {}, "cuKernelGetLibrary": {}, "cuKernelGetParamCount": {},
    "cuLibraryGetKernelCount": {}, "cuLibraryGetModule": {}, "cuModuleGetFunctionCount": {},
    "cuLinkDestroy": {"effects": "destroys"},  # the guest frees the cubin it kept first (link_calls.c)
    # Miscellaneous
    "cuFlushGPUDirectRDMAWrites": {}, "cuProfilerStart": {}, "cuProfilerStop": {},
}

# name -> the native guest driver's C file that answers it (guest_runtime/native/): a strong definition there,
# outside the table.
GUEST: dict[str, str] = {
    "cuGetExportTable": "export_tables.c",
    "cuLaunchHostFunc": "host_functions.c",
    # on the same host-function queue: a stream callback (given the stream's status), a host function's sync mode
    "cuStreamAddCallback": "host_functions.c", "cuLaunchHostFunc_v2": "host_functions.c",
    "cuDeviceGetPCIBusId": "answered_in_guest.c", "cuDeviceGetByPCIBusId": "answered_in_guest.c",
    "cuModuleGetLoadingMode": "answered_in_guest.c",
    "cuPointerGetAttributes": "answered_in_guest.c",
    "cuStreamGetCaptureInfo_v2": "answered_in_guest.c",  # cuStreamGetCaptureInfo's, without edge data
    # the guest reads the file and loads its bytes as cuModuleLoadData/cuLibraryLoadData would
    "cuModuleLoad": "module_calls.c", "cuModuleLoadFatBinary": "module_calls.c",
    "cuLibraryLoadFromFile": "module_calls.c",
    "cuLinkAddFile": "link_calls.c",  # the guest reads the file and sends its bytes as cuLinkAddData
    # the generic node-parameter setters, turned into the node type's own setter (graph_calls.c)
    "cuGraphNodeSetParams": "graph_calls.c", "cuGraphExecNodeSetParams": "graph_calls.c",
    # guest memory registered with the GPU: copies from and to it are staged, as from pageable memory
    "cuMemHostRegister": "page_locked_calls.c", "cuMemHostUnregister": "page_locked_calls.c",
    # cuMem memory shared between the processes of one guest as a file descriptor of the guest's own (a memfd naming
    # the GPU host's export), which the program may pass on as NCCL does
    "cuMemExportToShareableHandle": "shareable_handles.c", "cuMemImportFromShareableHandle": "shareable_handles.c",
    # legacy IPC the same way: the 64-byte handle holds the GPU host's token
    "cuIpcGetMemHandle": "shareable_handles.c", "cuIpcOpenMemHandle": "shareable_handles.c",
    "cuIpcCloseMemHandle": "shareable_handles.c", "cuIpcGetEventHandle": "shareable_handles.c",
    "cuIpcOpenEventHandle": "shareable_handles.c",
}

def _not_yet(what: str) -> str:
    return f"not yet forwarded ({what} need a payload declared by hand: the generic marshalling cannot carry them)"
# (pattern matched from the name's start, reason), first match wins.
UNSUPPORTED: list[tuple[str, str]] = [
    (r"cuGL|cuGraphicsGL|cuEGL|cuGraphicsEGL|cuEventCreateFromEGLSync|cuVDPAU|cuGraphicsVDPAU|cuGraphics",
     "graphics interop (OpenGL, EGL, VDPAU): a guest has no display server on the GPU host"),
    (r"cuTexRef|cuSurfRef|cuModuleGetTexRef|cuModuleGetSurfRef|cuParamSet|cuFuncSetBlockShape|cuFuncSetSharedSize"
     r"|cuLaunch$|cuLaunchGrid|cuCtxAttach|cuCtxDetach|cuDeviceGetProperties|cuProfilerInitialize"
     r"|cuFuncSetSharedMemConfig",
     "deprecated: texture and surface references and the pre-CUDA-4 launch API are gone from the CUDA 12 runtime"),
    (r"cuArray|cuMipmappedArray|cuMemcpyAtoA|cuMemcpyAtoD|cuMemcpyDtoA|cuMemcpyAtoH|cuMemcpyHtoA"
     r"|cuTexObject|cuSurfObject|cuMemMapArrayAsync",
     "CUDA arrays, texture and surface objects: " + _not_yet("array and resource descriptors")),
    (r"cuMemcpyBatchAsync|cuMemcpy3DBatchAsync|cuMemcpyWithAttributesAsync|cuMemcpy3DWithAttributesAsync"
     r"|cuFabricCpyBatchAsync",
     "batched copies and copies with attributes (single cuMemcpy2D/cuMemcpy3D copies are forwarded): "
     + _not_yet("arrays of copy descriptors with their copy attributes")),
    (r"cuGraphAddExternalSemaphores\w+Node|cuGraphExternalSemaphores\w+Node[GS]etParams"
     r"|cuGraphExecExternalSemaphores\w+NodeSetParams",
     "graph external semaphore nodes: their semaphores are OS objects of the GPU host imported with "
     "cuImportExternalSemaphore, which is not forwarded"),
    (r"cuGraphAddNode_v3|cuGraphNodeSetParams_v2",
     "CUDA 13.1's ABIs of the generic node calls, whose kernel nodes answer CUDA_ERROR_INVALID_CONTEXT where `ctx` "
     "is not the context of `func` (the CUDA 13.0 calls a host driver may have do not check): not yet forwarded "
     "(CUDA 13.0's cuGraphAddNode and cuGraphNodeSetParams are)"),
    (r"cuStreamBeginRecaptureToGraph",
     "recapture into a graph calls the guest's CUgraphRecaptureCallback from the GPU host's driver: not forwarded"),
    (r"cuGraphRetainUserObject|cuGraphReleaseUserObject|cuUserObject",
     "user objects run a destructor callback of the guest's on the GPU host: not forwarded"),
    (r"cuStreamBeginCaptureToCig|cuStreamEndCaptureToCig|cuStreamGetDevResource",
     "capture into a CUDA-in-graphics (CIG) graph and a stream's device resources: their objects are a graphics "
     "context's and a green context's, which are not forwarded either"),
    (r"cuGreenCtx|cuCtxFromGreenCtx|cuDevResource|cuDevSmResourceSplit|cuCtxGetDevResource|cuDeviceGetDevResource"
     r"|cuStreamGetGreenCtx",
     "green contexts and device resources partition the GPU's SMs, which a vGPU shares and does not own"),
    (r"cuCtxCreate_v|cuCtxGetExecAffinity",
     "contexts with execution affinity or creation parameters (SM limits) partition a GPU a vGPU does not own"),
    (r"cuMemPoolExport|cuMemPoolImport"
     r"|cuMemGetHandleForAddressRange|cuImportExternal|cuDestroyExternal|cuExternalMemory"
     r"|cuSignalExternalSemaphores|cuWaitExternalSemaphores|cuDeviceGetNvSciSyncAttributes",
     "sharing memory between processes or APIs hands out an OS handle of the GPU host, which the guest cannot use"),
    (r"cuMemAllocManaged|cuStreamAttachMemAsync|cuMemAdvise|cuMemPrefetch|cuMemRangeGetAttribute"
     r"|cuMemDiscard|cuLibraryGetManaged",
     "managed memory must be reachable by the guest's CPU at the GPU's addresses: the GPU host's pages are not"),
    (r"cuMulticast|cuLogicalEndpoint|cuDeviceGetClique|cuDeviceGetFabricClusterUuid",
     "multicast and fabric objects need the GPU host's NVLink fabric, which a vGPU is not given"),
    (r"cuCheckpoint|cuCoredump",
     "checkpointing and core dumps act on the process that holds the GPU, which is the GPU host's worker"),
    (r"cuLogs", "the driver's log belongs to the GPU host's worker process, not to the guest program"),
    (r"cuDeviceRegisterAsyncNotification|cuDeviceUnregisterAsyncNotification",
     "asynchronous notifications call back into the guest from the GPU host: not forwarded"),
    (r"cuMemGetLocationInfo|cuMemBatchDecompressAsync|cuPointerSetAttribute",
     "memory location queries, batched decompression, pointer attributes set by the program: "
     + _not_yet("their structures")),
    (r"cuLibraryGetUnifiedFunction",
     "a library's unified function is a host function pointer in the GPU host's process: nothing a guest can call"),
    (r"cuLaunchCooperativeKernelMultiDevice",
     "deprecated as of CUDA 11.3 (cuda.h): multi-device cooperative launches; a kernel on each of several GPUs of "
     "one host, which a vGPU session is not given together"),
]
_UNSUPPORTED = [(re.compile(pattern), reason) for pattern, reason in UNSUPPORTED]


def unsupported_reason(name: str) -> str | None:
    """Why `name` answers CUDA_ERROR_NOT_SUPPORTED, or None if it is not classified unsupported."""
    for pattern, reason in _UNSUPPORTED:
        if pattern.match(name):
            return reason
    return None
