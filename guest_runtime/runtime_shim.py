"""The CUDA runtime API (`cuda.bindings.cyruntime`) built on the forwarded driver calls.

`cuda.bindings.runtime` does not call the driver through `cuda.bindings.cydriver`'s capsules: cyruntime carries
its own statically linked cudart, which opens libcuda itself. Hooking only the driver therefore leaves every
runtime-API program unforwarded (on a GPU-less guest `cudaGetDeviceCount` answers cudaErrorInsufficientDriver).
This module supplies Python implementations for cyruntime's capsules (installed with `capsule_hook.install(
"cuda.bindings.cyruntime", ...)`), each written on top of the *driver* implementations the Forwarder provides,
called with raw C arguments exactly as a trampoline would call them (ints, None for NULL, ctypes cells for
out-pointers). The static cudart is then never initialised: every runtime function that returns a status is
answered here or by the fallback.

What cudart does and the shim copies:

* Lazy initialisation: the first call that needs a context runs `cuInit(0)` and, if the program has not made a
  context current through the driver API (then the runtime uses that one, as cudart does), retains the primary
  context of the current device and makes it current. `cudaFree(NULL)` is the usual way to force this.
  `cudaSetDevice` retains the device's primary context and makes it current at once (cudart ≥ 12 does).
  Primary contexts are retained once per device and kept for the life of the process (the host reclaims them).
  If a call finds no context current (the program popped or destroyed it through the driver API), the shim binds
  the current device's primary context again and retries once.
* The current device is per process here, not per thread as in cudart: a process has one channel and the host
  runs its calls on one thread with one current context, so a per-thread device could not be honoured.
  `cudaGetDevice` answers it without asking the driver: before the runtime's first context-needing call it is
  0 (or the last `cudaSetDevice`) even if the program made another device's context current through the
  driver API; that call adopts the context and its device.
* The last error is per thread, as in cudart: every failing runtime call (the fallback's 801 included) records
  its status; `cudaGetLastError` returns and clears it, `cudaPeekAtLastError` returns it. Threads are told apart
  by `threading.get_ident()` (pthread_self), which stays the same across the trampolines' calls even on threads
  Python did not create (a `threading.local` would be reset between two calls on such a thread).
* CUresult codes become cudaError_t codes through `ERROR_TABLE`, checked by the tests against the wheel's enums.
  In cuda-bindings 13.4 every pair has the same number under different names (CUDA_ERROR_INVALID_CONTEXT 201 is
  cudaErrorDeviceUninitialized 201); the three CUresults without a runtime counterpart (47, 202, 916) and any
  code the table does not know become cudaErrorUnknown, said once.
* `cudaDriverGetVersion` answers 0 with cudaSuccess when no driver is reachable, as cudart documents.
* `cudaRuntimeGetVersion` answers the wheel's CUDART_VERSION without loading cudart (`runtime_version`).

`cudaMemcpy` with cudaMemcpyDefault is the forwarded `cuMemcpy`, which tells host from device pointers.

Limits, each answered with an error rather than a guess: `cudaDeviceGetAttribute` refuses
(cudaErrorInvalidValue, as cudart) a value that is not a cudaDeviceAttr of this wheel, since the driver would
answer a different question for it. Every runtime function not implemented here answers cudaErrorNotSupported
(801) and is named once in the log: through `fallback`, which also records it as the last error, or through
capsule_hook's default fallback. Functions that return something
other than a status (`cudaGetErrorName`, `cudaGetErrorString`, `make_cudaExtent`, ...) keep the static cudart's
code: they are pure host-side lookups and need no driver.

`cudaGetDeviceProperties` fills the wheel's own `cuda.bindings.runtime.cudaDeviceProp` through its setters and
copies its `sizeof` bytes (layout as the wheel was compiled) to the caller, so no offset is written here. It
imports `cuda.bindings.runtime` at its first call: that is safe once the hook is installed (the import copies the
hooked capsules), and it is only ever called through the hook. An attribute the driver does not know (an older
host driver, or the test fake) is left 0 and named once in the log; any other failure fails the call.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ivshmem import cuda_status as cu

from . import capsule_hook

__all__ = ["ERROR_TABLE", "PROPERTY_ATTRIBUTES", "PROPERTY_FIELDS_LEFT_ZERO",
           "RuntimeShim", "is_runtime_attribute", "runtime_attributes", "runtime_error",
           "runtime_implementations", "runtime_version"]

log = logging.getLogger(__name__)

Driver = Mapping[str, Callable[..., int]]

# cudaError_t values answered here directly: the same numbers as their CUresult (ERROR_TABLE below pins that),
# but for cudaErrorInvalidMemcpyDirection, which the driver API has no counterpart for.
SUCCESS, INVALID_VALUE, INVALID_DEVICE = cu.SUCCESS, cu.INVALID_VALUE, cu.INVALID_DEVICE
NOT_SUPPORTED, UNKNOWN = cu.NOT_SUPPORTED, cu.UNKNOWN
INVALID_MEMCPY_DIRECTION = 21
# CUresult values the shim looks at.
CU_SUCCESS, CU_INVALID_VALUE, CU_INVALID_CONTEXT = cu.SUCCESS, cu.INVALID_VALUE, cu.INVALID_CONTEXT
# enum cudaMemcpyKind
HOST_TO_HOST, HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE, MEMCPY_DEFAULT = 0, 1, 2, 3, 4

# CUresult value, CUresult name, cudaError_t value, cudaError_t name: every CUresult of cuda-bindings 13.4 and the
# runtime error cudart reports for it (the tests hold each name to its value in the wheel's enums).
ERROR_TABLE: tuple[tuple[int, str, int, str], ...] = (
    (0, "CUDA_SUCCESS", 0, "cudaSuccess"),
    (1, "CUDA_ERROR_INVALID_VALUE", 1, "cudaErrorInvalidValue"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY", 2, "cudaErrorMemoryAllocation"),
    (3, "CUDA_ERROR_NOT_INITIALIZED", 3, "cudaErrorInitializationError"),
    (4, "CUDA_ERROR_DEINITIALIZED", 4, "cudaErrorCudartUnloading"),
    (5, "CUDA_ERROR_PROFILER_DISABLED", 5, "cudaErrorProfilerDisabled"),
    (6, "CUDA_ERROR_PROFILER_NOT_INITIALIZED", 6, "cudaErrorProfilerNotInitialized"),
    (7, "CUDA_ERROR_PROFILER_ALREADY_STARTED", 7, "cudaErrorProfilerAlreadyStarted"),
    (8, "CUDA_ERROR_PROFILER_ALREADY_STOPPED", 8, "cudaErrorProfilerAlreadyStopped"),
    (34, "CUDA_ERROR_STUB_LIBRARY", 34, "cudaErrorStubLibrary"),
    (36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER", 36, "cudaErrorCallRequiresNewerDriver"),
    (46, "CUDA_ERROR_DEVICE_UNAVAILABLE", 46, "cudaErrorDevicesUnavailable"),
    (47, "CUDA_ERROR_MULTICAST_RESOURCE_FULL", 999, "cudaErrorUnknown"),  # no runtime counterpart
    (100, "CUDA_ERROR_NO_DEVICE", 100, "cudaErrorNoDevice"),
    (101, "CUDA_ERROR_INVALID_DEVICE", 101, "cudaErrorInvalidDevice"),
    (102, "CUDA_ERROR_DEVICE_NOT_LICENSED", 102, "cudaErrorDeviceNotLicensed"),
    (200, "CUDA_ERROR_INVALID_IMAGE", 200, "cudaErrorInvalidKernelImage"),
    (201, "CUDA_ERROR_INVALID_CONTEXT", 201, "cudaErrorDeviceUninitialized"),
    (202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", 999, "cudaErrorUnknown"),  # no runtime counterpart (deprecated)
    (205, "CUDA_ERROR_MAP_FAILED", 205, "cudaErrorMapBufferObjectFailed"),
    (206, "CUDA_ERROR_UNMAP_FAILED", 206, "cudaErrorUnmapBufferObjectFailed"),
    (207, "CUDA_ERROR_ARRAY_IS_MAPPED", 207, "cudaErrorArrayIsMapped"),
    (208, "CUDA_ERROR_ALREADY_MAPPED", 208, "cudaErrorAlreadyMapped"),
    (209, "CUDA_ERROR_NO_BINARY_FOR_GPU", 209, "cudaErrorNoKernelImageForDevice"),
    (210, "CUDA_ERROR_ALREADY_ACQUIRED", 210, "cudaErrorAlreadyAcquired"),
    (211, "CUDA_ERROR_NOT_MAPPED", 211, "cudaErrorNotMapped"),
    (212, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY", 212, "cudaErrorNotMappedAsArray"),
    (213, "CUDA_ERROR_NOT_MAPPED_AS_POINTER", 213, "cudaErrorNotMappedAsPointer"),
    (214, "CUDA_ERROR_ECC_UNCORRECTABLE", 214, "cudaErrorECCUncorrectable"),
    (215, "CUDA_ERROR_UNSUPPORTED_LIMIT", 215, "cudaErrorUnsupportedLimit"),
    (216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE", 216, "cudaErrorDeviceAlreadyInUse"),
    (217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", 217, "cudaErrorPeerAccessUnsupported"),
    (218, "CUDA_ERROR_INVALID_PTX", 218, "cudaErrorInvalidPtx"),
    (219, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT", 219, "cudaErrorInvalidGraphicsContext"),
    (220, "CUDA_ERROR_NVLINK_UNCORRECTABLE", 220, "cudaErrorNvlinkUncorrectable"),
    (221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", 221, "cudaErrorJitCompilerNotFound"),
    (222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", 222, "cudaErrorUnsupportedPtxVersion"),
    (223, "CUDA_ERROR_JIT_COMPILATION_DISABLED", 223, "cudaErrorJitCompilationDisabled"),
    (224, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY", 224, "cudaErrorUnsupportedExecAffinity"),
    (225, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC", 225, "cudaErrorUnsupportedDevSideSync"),
    (226, "CUDA_ERROR_CONTAINED", 226, "cudaErrorContained"),
    (227, "CUDA_ERROR_INSUFFICIENT_LOADER_VERSION", 227, "cudaErrorInsufficientLoaderVersion"),
    (300, "CUDA_ERROR_INVALID_SOURCE", 300, "cudaErrorInvalidSource"),
    (301, "CUDA_ERROR_FILE_NOT_FOUND", 301, "cudaErrorFileNotFound"),
    (302, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND", 302, "cudaErrorSharedObjectSymbolNotFound"),
    (303, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED", 303, "cudaErrorSharedObjectInitFailed"),
    (304, "CUDA_ERROR_OPERATING_SYSTEM", 304, "cudaErrorOperatingSystem"),
    (400, "CUDA_ERROR_INVALID_HANDLE", 400, "cudaErrorInvalidResourceHandle"),
    (401, "CUDA_ERROR_ILLEGAL_STATE", 401, "cudaErrorIllegalState"),
    (402, "CUDA_ERROR_LOSSY_QUERY", 402, "cudaErrorLossyQuery"),
    (500, "CUDA_ERROR_NOT_FOUND", 500, "cudaErrorSymbolNotFound"),
    (600, "CUDA_ERROR_NOT_READY", 600, "cudaErrorNotReady"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS", 700, "cudaErrorIllegalAddress"),
    (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", 701, "cudaErrorLaunchOutOfResources"),
    (702, "CUDA_ERROR_LAUNCH_TIMEOUT", 702, "cudaErrorLaunchTimeout"),
    (703, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING", 703, "cudaErrorLaunchIncompatibleTexturing"),
    (704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", 704, "cudaErrorPeerAccessAlreadyEnabled"),
    (705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", 705, "cudaErrorPeerAccessNotEnabled"),
    (708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", 708, "cudaErrorSetOnActiveProcess"),
    (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", 709, "cudaErrorContextIsDestroyed"),
    (710, "CUDA_ERROR_ASSERT", 710, "cudaErrorAssert"),
    (711, "CUDA_ERROR_TOO_MANY_PEERS", 711, "cudaErrorTooManyPeers"),
    (712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", 712, "cudaErrorHostMemoryAlreadyRegistered"),
    (713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", 713, "cudaErrorHostMemoryNotRegistered"),
    (714, "CUDA_ERROR_HARDWARE_STACK_ERROR", 714, "cudaErrorHardwareStackError"),
    (715, "CUDA_ERROR_ILLEGAL_INSTRUCTION", 715, "cudaErrorIllegalInstruction"),
    (716, "CUDA_ERROR_MISALIGNED_ADDRESS", 716, "cudaErrorMisalignedAddress"),
    (717, "CUDA_ERROR_INVALID_ADDRESS_SPACE", 717, "cudaErrorInvalidAddressSpace"),
    (718, "CUDA_ERROR_INVALID_PC", 718, "cudaErrorInvalidPc"),
    (719, "CUDA_ERROR_LAUNCH_FAILED", 719, "cudaErrorLaunchFailure"),
    (720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", 720, "cudaErrorCooperativeLaunchTooLarge"),
    (721, "CUDA_ERROR_TENSOR_MEMORY_LEAK", 721, "cudaErrorTensorMemoryLeak"),
    (800, "CUDA_ERROR_NOT_PERMITTED", 800, "cudaErrorNotPermitted"),
    (801, "CUDA_ERROR_NOT_SUPPORTED", 801, "cudaErrorNotSupported"),
    (802, "CUDA_ERROR_SYSTEM_NOT_READY", 802, "cudaErrorSystemNotReady"),
    (803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", 803, "cudaErrorSystemDriverMismatch"),
    (804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", 804, "cudaErrorCompatNotSupportedOnDevice"),
    (805, "CUDA_ERROR_MPS_CONNECTION_FAILED", 805, "cudaErrorMpsConnectionFailed"),
    (806, "CUDA_ERROR_MPS_RPC_FAILURE", 806, "cudaErrorMpsRpcFailure"),
    (807, "CUDA_ERROR_MPS_SERVER_NOT_READY", 807, "cudaErrorMpsServerNotReady"),
    (808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED", 808, "cudaErrorMpsMaxClientsReached"),
    (809, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED", 809, "cudaErrorMpsMaxConnectionsReached"),
    (810, "CUDA_ERROR_MPS_CLIENT_TERMINATED", 810, "cudaErrorMpsClientTerminated"),
    (811, "CUDA_ERROR_CDP_NOT_SUPPORTED", 811, "cudaErrorCdpNotSupported"),
    (812, "CUDA_ERROR_CDP_VERSION_MISMATCH", 812, "cudaErrorCdpVersionMismatch"),
    (900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", 900, "cudaErrorStreamCaptureUnsupported"),
    (901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", 901, "cudaErrorStreamCaptureInvalidated"),
    (902, "CUDA_ERROR_STREAM_CAPTURE_MERGE", 902, "cudaErrorStreamCaptureMerge"),
    (903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", 903, "cudaErrorStreamCaptureUnmatched"),
    (904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", 904, "cudaErrorStreamCaptureUnjoined"),
    (905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION", 905, "cudaErrorStreamCaptureIsolation"),
    (906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", 906, "cudaErrorStreamCaptureImplicit"),
    (907, "CUDA_ERROR_CAPTURED_EVENT", 907, "cudaErrorCapturedEvent"),
    (908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD", 908, "cudaErrorStreamCaptureWrongThread"),
    (909, "CUDA_ERROR_TIMEOUT", 909, "cudaErrorTimeout"),
    (910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", 910, "cudaErrorGraphExecUpdateFailure"),
    (911, "CUDA_ERROR_EXTERNAL_DEVICE", 911, "cudaErrorExternalDevice"),
    (912, "CUDA_ERROR_INVALID_CLUSTER_SIZE", 912, "cudaErrorInvalidClusterSize"),
    (913, "CUDA_ERROR_FUNCTION_NOT_LOADED", 913, "cudaErrorFunctionNotLoaded"),
    (914, "CUDA_ERROR_INVALID_RESOURCE_TYPE", 914, "cudaErrorInvalidResourceType"),
    (915, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION", 915, "cudaErrorInvalidResourceConfiguration"),
    (916, "CUDA_ERROR_KEY_ROTATION", 999, "cudaErrorUnknown"),  # no runtime counterpart
    (917, "CUDA_ERROR_STREAM_DETACHED", 917, "cudaErrorStreamDetached"),
    (918, "CUDA_ERROR_GRAPH_RECAPTURE_FAILURE", 918, "cudaErrorGraphRecaptureFailure"),
    (919, "CUDA_ERROR_FABRIC_NOT_READY", 919, "cudaErrorFabricNotReady"),
    (999, "CUDA_ERROR_UNKNOWN", 999, "cudaErrorUnknown"),
)
_TO_RUNTIME: dict[int, int] = {cu: rt for cu, _, rt, _ in ERROR_TABLE}
_CU_NAMES: dict[int, str] = {cu: name for cu, name, _, _ in ERROR_TABLE}
_SAID_UNKNOWN: set[int] = set()


# cudaDeviceProp field -> the cudaDeviceAttr name(s) it is read from (an int[n] field: n names, in order). The
# fields not listed come from cuDeviceGetName, cuDeviceGetUuid and cuDeviceTotalMem, or stay 0
# (PROPERTY_FIELDS_LEFT_ZERO: the LUID is a Windows (WDDM) identifier, 0 on Linux as cudart leaves it).
PROPERTY_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "sharedMemPerBlock": ("cudaDevAttrMaxSharedMemoryPerBlock",),
    "regsPerBlock": ("cudaDevAttrMaxRegistersPerBlock",),
    "warpSize": ("cudaDevAttrWarpSize",),
    "memPitch": ("cudaDevAttrMaxPitch",),
    "maxThreadsPerBlock": ("cudaDevAttrMaxThreadsPerBlock",),
    "maxThreadsDim": ("cudaDevAttrMaxBlockDimX", "cudaDevAttrMaxBlockDimY", "cudaDevAttrMaxBlockDimZ"),
    "maxGridSize": ("cudaDevAttrMaxGridDimX", "cudaDevAttrMaxGridDimY", "cudaDevAttrMaxGridDimZ"),
    "totalConstMem": ("cudaDevAttrTotalConstantMemory",),
    "major": ("cudaDevAttrComputeCapabilityMajor",),
    "minor": ("cudaDevAttrComputeCapabilityMinor",),
    "textureAlignment": ("cudaDevAttrTextureAlignment",),
    "texturePitchAlignment": ("cudaDevAttrTexturePitchAlignment",),
    "multiProcessorCount": ("cudaDevAttrMultiProcessorCount",),
    "integrated": ("cudaDevAttrIntegrated",),
    "canMapHostMemory": ("cudaDevAttrCanMapHostMemory",),
    "maxTexture1D": ("cudaDevAttrMaxTexture1DWidth",),
    "maxTexture1DMipmap": ("cudaDevAttrMaxTexture1DMipmappedWidth",),
    "maxTexture2D": ("cudaDevAttrMaxTexture2DWidth", "cudaDevAttrMaxTexture2DHeight"),
    "maxTexture2DMipmap": ("cudaDevAttrMaxTexture2DMipmappedWidth", "cudaDevAttrMaxTexture2DMipmappedHeight"),
    "maxTexture2DLinear": ("cudaDevAttrMaxTexture2DLinearWidth", "cudaDevAttrMaxTexture2DLinearHeight",
                           "cudaDevAttrMaxTexture2DLinearPitch"),
    "maxTexture2DGather": ("cudaDevAttrMaxTexture2DGatherWidth", "cudaDevAttrMaxTexture2DGatherHeight"),
    "maxTexture3D": ("cudaDevAttrMaxTexture3DWidth", "cudaDevAttrMaxTexture3DHeight", "cudaDevAttrMaxTexture3DDepth"),
    "maxTexture3DAlt": ("cudaDevAttrMaxTexture3DWidthAlt", "cudaDevAttrMaxTexture3DHeightAlt",
                        "cudaDevAttrMaxTexture3DDepthAlt"),
    "maxTextureCubemap": ("cudaDevAttrMaxTextureCubemapWidth",),
    "maxTexture1DLayered": ("cudaDevAttrMaxTexture1DLayeredWidth", "cudaDevAttrMaxTexture1DLayeredLayers"),
    "maxTexture2DLayered": ("cudaDevAttrMaxTexture2DLayeredWidth", "cudaDevAttrMaxTexture2DLayeredHeight",
                            "cudaDevAttrMaxTexture2DLayeredLayers"),
    "maxTextureCubemapLayered": ("cudaDevAttrMaxTextureCubemapLayeredWidth",
                                 "cudaDevAttrMaxTextureCubemapLayeredLayers"),
    "maxSurface1D": ("cudaDevAttrMaxSurface1DWidth",),
    "maxSurface2D": ("cudaDevAttrMaxSurface2DWidth", "cudaDevAttrMaxSurface2DHeight"),
    "maxSurface3D": ("cudaDevAttrMaxSurface3DWidth", "cudaDevAttrMaxSurface3DHeight", "cudaDevAttrMaxSurface3DDepth"),
    "maxSurface1DLayered": ("cudaDevAttrMaxSurface1DLayeredWidth", "cudaDevAttrMaxSurface1DLayeredLayers"),
    "maxSurface2DLayered": ("cudaDevAttrMaxSurface2DLayeredWidth", "cudaDevAttrMaxSurface2DLayeredHeight",
                            "cudaDevAttrMaxSurface2DLayeredLayers"),
    "maxSurfaceCubemap": ("cudaDevAttrMaxSurfaceCubemapWidth",),
    "maxSurfaceCubemapLayered": ("cudaDevAttrMaxSurfaceCubemapLayeredWidth",
                                 "cudaDevAttrMaxSurfaceCubemapLayeredLayers"),
    "surfaceAlignment": ("cudaDevAttrSurfaceAlignment",),
    "concurrentKernels": ("cudaDevAttrConcurrentKernels",),
    "ECCEnabled": ("cudaDevAttrEccEnabled",),
    "pciBusID": ("cudaDevAttrPciBusId",),
    "pciDeviceID": ("cudaDevAttrPciDeviceId",),
    "pciDomainID": ("cudaDevAttrPciDomainId",),
    "tccDriver": ("cudaDevAttrTccDriver",),
    "asyncEngineCount": ("cudaDevAttrAsyncEngineCount",),
    "unifiedAddressing": ("cudaDevAttrUnifiedAddressing",),
    "memoryBusWidth": ("cudaDevAttrGlobalMemoryBusWidth",),
    "l2CacheSize": ("cudaDevAttrL2CacheSize",),
    "persistingL2CacheMaxSize": ("cudaDevAttrMaxPersistingL2CacheSize",),
    "maxThreadsPerMultiProcessor": ("cudaDevAttrMaxThreadsPerMultiProcessor",),
    "streamPrioritiesSupported": ("cudaDevAttrStreamPrioritiesSupported",),
    "globalL1CacheSupported": ("cudaDevAttrGlobalL1CacheSupported",),
    "localL1CacheSupported": ("cudaDevAttrLocalL1CacheSupported",),
    "sharedMemPerMultiprocessor": ("cudaDevAttrMaxSharedMemoryPerMultiprocessor",),
    "regsPerMultiprocessor": ("cudaDevAttrMaxRegistersPerMultiprocessor",),
    "managedMemory": ("cudaDevAttrManagedMemory",),
    "isMultiGpuBoard": ("cudaDevAttrIsMultiGpuBoard",),
    "multiGpuBoardGroupID": ("cudaDevAttrMultiGpuBoardGroupID",),
    "hostNativeAtomicSupported": ("cudaDevAttrHostNativeAtomicSupported",),
    "pageableMemoryAccess": ("cudaDevAttrPageableMemoryAccess",),
    "concurrentManagedAccess": ("cudaDevAttrConcurrentManagedAccess",),
    "computePreemptionSupported": ("cudaDevAttrComputePreemptionSupported",),
    "canUseHostPointerForRegisteredMem": ("cudaDevAttrCanUseHostPointerForRegisteredMem",),
    "cooperativeLaunch": ("cudaDevAttrCooperativeLaunch",),
    "sharedMemPerBlockOptin": ("cudaDevAttrMaxSharedMemoryPerBlockOptin",),
    "pageableMemoryAccessUsesHostPageTables": ("cudaDevAttrPageableMemoryAccessUsesHostPageTables",),
    "directManagedMemAccessFromHost": ("cudaDevAttrDirectManagedMemAccessFromHost",),
    "maxBlocksPerMultiProcessor": ("cudaDevAttrMaxBlocksPerMultiprocessor",),
    "accessPolicyMaxWindowSize": ("cudaDevAttrMaxAccessPolicyWindowSize",),
    "reservedSharedMemPerBlock": ("cudaDevAttrReservedSharedMemoryPerBlock",),
    "hostRegisterSupported": ("cudaDevAttrHostRegisterSupported",),
    "sparseCudaArraySupported": ("cudaDevAttrSparseCudaArraySupported",),
    "hostRegisterReadOnlySupported": ("cudaDevAttrHostRegisterReadOnlySupported",),
    "timelineSemaphoreInteropSupported": ("cudaDevAttrTimelineSemaphoreInteropSupported",),
    "memoryPoolsSupported": ("cudaDevAttrMemoryPoolsSupported",),
    "gpuDirectRDMASupported": ("cudaDevAttrGPUDirectRDMASupported",),
    "gpuDirectRDMAFlushWritesOptions": ("cudaDevAttrGPUDirectRDMAFlushWritesOptions",),
    "gpuDirectRDMAWritesOrdering": ("cudaDevAttrGPUDirectRDMAWritesOrdering",),
    "memoryPoolSupportedHandleTypes": ("cudaDevAttrMemoryPoolSupportedHandleTypes",),
    "deferredMappingCudaArraySupported": ("cudaDevAttrDeferredMappingCudaArraySupported",),
    "ipcEventSupported": ("cudaDevAttrIpcEventSupport",),
    "clusterLaunch": ("cudaDevAttrClusterLaunch",),
    "unifiedFunctionPointers": ("cudaDevAttrReserved129",),  # CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS
    "deviceNumaConfig": ("cudaDevAttrNumaConfig",),
    "deviceNumaId": ("cudaDevAttrNumaId",),
    "mpsEnabled": ("cudaDevAttrMpsEnabled",),
    "hostNumaId": ("cudaDevAttrHostNumaId",),
    "gpuPciDeviceID": ("cudaDevAttrGpuPciDeviceId",),
    "gpuPciSubsystemID": ("cudaDevAttrGpuPciSubsystemId",),
    "hostNumaMultinodeIpcSupported": ("cudaDevAttrHostNumaMultinodeIpcSupported",),
}
PROPERTY_FIELDS_OTHERWISE = frozenset({"name", "uuid", "totalGlobalMem"})
PROPERTY_FIELDS_LEFT_ZERO = frozenset({"luid", "luidDeviceNodeMask"})
NAME_LENGTH = 256  # char name[256]
_SAID: set[str] = set()


def runtime_error(status: int) -> int:
    """The cudaError_t cudart reports for a CUresult (cudaErrorUnknown, said once, for one it does not know)."""
    mapped = _TO_RUNTIME.get(status)
    if mapped is None or (mapped == UNKNOWN and status != UNKNOWN):
        if status not in _SAID_UNKNOWN:
            _SAID_UNKNOWN.add(status)
            log.warning("orion: the driver answered %s, which has no CUDA runtime counterpart: "
                        "reporting cudaErrorUnknown", _CU_NAMES.get(status, f"CUresult {status}"))
        return UNKNOWN
    return mapped


@functools.cache
def runtime_attributes() -> frozenset[int]:
    """The cudaDeviceAttr values of the installed wheel, cudaDevAttrMax excluded: each newer wheel adds some
    (13.4 ends at 158, 13.5 at 161), so they are read from it, not written here. Every one is the
    CUdevice_attribute of the same value (the tests check it against the wheel), so a runtime attribute is
    passed to the driver unchanged. Imported at the first query, after the hook is installed (see above)."""
    from cuda.bindings import runtime
    return frozenset(int(m) for m in runtime.cudaDeviceAttr if m.name != "cudaDevAttrMax")


def is_runtime_attribute(attribute: int) -> bool:
    """Whether `attribute` is a cudaDeviceAttr value of the installed wheel (cudaDevAttrMax excluded)."""
    return attribute in runtime_attributes()


@functools.lru_cache(maxsize=1)
def runtime_version() -> int:
    """CUDART_VERSION of the installed cuda-bindings wheel, found without loading its cudart.

    The wheel's cyruntime.pxd declares CUDART_VERSION without its value, but cydriver.pxd, generated from the same
    toolkit's headers, spells `CUDA_VERSION = 13040`, and a toolkit's cuda_runtime_api.h CUDART_VERSION equals its
    cuda.h CUDA_VERSION. Without the .pxd: the bindings' own version, major.minor -> major * 1000 + minor * 10
    (cuda-bindings 13.4.x is built from CUDA 13.4). The tests compare both with `runtime.CUDART_VERSION` and the
    real `cudaRuntimeGetVersion` of an unhooked process.
    """
    spec = importlib.util.find_spec("cuda.bindings.cydriver")
    if spec is not None and spec.origin is not None:
        pxd = Path(spec.origin).parent / "cydriver.pxd"
        if pxd.is_file():
            found = re.search(r"^cdef enum: CUDA_VERSION = (\d+)\s*$", pxd.read_text(encoding="utf-8"), re.M)
            if found:
                return int(found.group(1))
    from cuda.bindings._version import __version_tuple__ as version  # no CUDA library is loaded by this
    return int(version[0]) * 1000 + int(version[1]) * 10


def _say_once(key: str, message: str, *args: Any) -> None:
    if key not in _SAID:
        _SAID.add(key)
        log.warning(message, *args)


class RuntimeShim:
    """One process's CUDA runtime state over one set of driver implementations (see the module docstring)."""

    def __init__(self, driver: Driver) -> None:
        self._driver = driver
        self._lock = threading.RLock()
        self._device = 0  # the current device (per process; cudart's is per thread)
        self._bound = False  # a context is current for the runtime's calls
        self._initialized = False  # cuInit succeeded
        self._primary: dict[int, int] = {}  # device -> its retained primary context
        self._errors: dict[int, int] = {}  # thread ident -> last error (absent: cudaSuccess)
        self._properties: dict[int, bytes] = {}  # device -> its filled cudaDeviceProp

    # --- what the hook installs -------------------------------------------------------------------------------------
    def implementations(self) -> dict[str, Callable[..., int]]:
        """One function per implemented cyruntime function, taking the raw C arguments, returning a cudaError_t."""
        recorded: dict[str, Callable[..., int]] = {
            "cudaFree": self.cudaFree, "cudaMalloc": self.cudaMalloc, "cudaMemcpy": self.cudaMemcpy,
            "cudaSetDevice": self.cudaSetDevice, "cudaGetDevice": self.cudaGetDevice,
            "cudaGetDeviceCount": self.cudaGetDeviceCount, "cudaDeviceGetAttribute": self.cudaDeviceGetAttribute,
            "cudaDeviceSynchronize": self.cudaDeviceSynchronize, "cudaDriverGetVersion": self.cudaDriverGetVersion,
            "cudaRuntimeGetVersion": self.cudaRuntimeGetVersion,
            "cudaGetDeviceProperties": self.cudaGetDeviceProperties,
        }
        impls = {name: self._recording(function) for name, function in recorded.items()}
        impls["cudaGetLastError"] = self.cudaGetLastError  # these two report the last error, never set it
        impls["cudaPeekAtLastError"] = self.cudaPeekAtLastError
        return impls

    def fallback(self, name: str) -> Callable[..., int]:
        """For `capsule_hook.install(..., fallback=)`: cudaErrorNotSupported, the name said once, recorded as the
        last error. Called with the C arguments, or with none for a signature ctypes cannot express."""
        return self._recording(capsule_hook.not_supported(name))

    def _recording(self, function: Callable[..., int]) -> Callable[..., int]:
        def call(*args: Any) -> int:
            try:
                status = function(*args)
            except BaseException:
                self._errors[threading.get_ident()] = UNKNOWN  # what the trampoline will answer
                raise
            if status != SUCCESS:
                self._errors[threading.get_ident()] = status
            return status
        return call

    # --- driver calls -----------------------------------------------------------------------------------------------
    def _cu(self, name: str, *args: Any) -> int:
        return int(self._driver[name](*args))

    def _init(self) -> int:
        if self._initialized:
            return SUCCESS
        status = self._cu("cuInit", 0)
        self._initialized = status == CU_SUCCESS
        return runtime_error(status)

    def _make_primary_current(self, device: int) -> int:
        """Retain `device`'s primary context (once per process) and make it current; it becomes the current device."""
        context = self._primary.get(device)
        if context is None:
            cell = ctypes.c_uint64()
            status = self._cu("cuDevicePrimaryCtxRetain", ctypes.addressof(cell), device)
            if status != CU_SUCCESS:
                return runtime_error(status)
            context = self._primary[device] = cell.value
        status = self._cu("cuCtxSetCurrent", context)
        if status != CU_SUCCESS:
            return runtime_error(status)
        self._device, self._bound = device, True
        return SUCCESS

    def _current_context(self) -> tuple[int, int]:
        cell = ctypes.c_uint64()
        status = self._cu("cuCtxGetCurrent", ctypes.addressof(cell))
        return status, cell.value

    def _ensure_context(self) -> int:
        """cudart's lazy initialisation: cuInit, then the context current on the driver side if the program made
        one current, else the current device's primary context."""
        with self._lock:
            if self._bound:
                return SUCCESS
            error = self._init()
            if error != SUCCESS:
                return error
            status, context = self._current_context()
            if status != CU_SUCCESS:
                return runtime_error(status)
            if context:  # made current through the driver API: the runtime uses it, and its device is current
                device = ctypes.c_int()
                if self._cu("cuCtxGetDevice", ctypes.addressof(device)) == CU_SUCCESS:
                    self._device = device.value
                self._bound = True
                return SUCCESS
            return self._make_primary_current(self._device)

    def _in_context(self, name: str, *args: Any) -> int:
        """Call driver function `name` with a context current; rebind and retry once if none is current any more."""
        error = self._ensure_context()
        if error != SUCCESS:
            return error
        status = self._cu(name, *args)
        if status == CU_INVALID_CONTEXT:
            current_status, context = self._current_context()
            if current_status == CU_SUCCESS and not context:  # popped or destroyed through the driver API
                with self._lock:
                    self._bound = False
                error = self._ensure_context()
                if error != SUCCESS:
                    return error
                status = self._cu(name, *args)
        return runtime_error(status)

    # --- the runtime functions (raw C arguments: ints, None for NULL) ----------------------------------------------
    def cudaFree(self, pointer: int | None) -> int:  # noqa: N802 - the C name
        if not pointer:
            return self._ensure_context()  # cudaFree(0): the idiom that initialises the runtime
        return self._in_context("cuMemFree", pointer)

    def cudaMalloc(self, out: int | None, size: int) -> int:  # noqa: N802
        if not out:
            return INVALID_VALUE
        if size == 0:  # cudart: success and a NULL pointer (cuMemAlloc would refuse 0 bytes)
            error = self._ensure_context()
            if error == SUCCESS:
                ctypes.c_void_p.from_address(out).value = None
            return error
        return self._in_context("cuMemAlloc", out, size)

    def cudaMemcpy(self, dst: int | None, src: int | None, count: int, kind: int) -> int:  # noqa: N802
        if kind not in (HOST_TO_HOST, HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE, MEMCPY_DEFAULT):
            return INVALID_MEMCPY_DIRECTION
        error = self._ensure_context()
        if error != SUCCESS or count == 0:
            return error
        if not dst or not src:
            return INVALID_VALUE
        if kind == HOST_TO_HOST:
            ctypes.memmove(dst, src, count)
            return SUCCESS
        name = {HOST_TO_DEVICE: "cuMemcpyHtoD", DEVICE_TO_HOST: "cuMemcpyDtoH", DEVICE_TO_DEVICE: "cuMemcpyDtoD",
                MEMCPY_DEFAULT: "cuMemcpy"}[kind]  # the forwarded cuMemcpy tells the directions apart itself
        return self._in_context(name, dst, src, count)

    def cudaSetDevice(self, device: int) -> int:  # noqa: N802
        if device < 0:
            return INVALID_DEVICE
        with self._lock:
            error = self._init()
            return error if error != SUCCESS else self._make_primary_current(device)

    def cudaGetDevice(self, out: int | None) -> int:  # noqa: N802
        if not out:
            return INVALID_VALUE
        ctypes.c_int.from_address(out).value = self._device
        return SUCCESS

    def cudaGetDeviceCount(self, out: int | None) -> int:  # noqa: N802
        if not out:
            return INVALID_VALUE
        error = self._init()
        if error == SUCCESS:
            error = runtime_error(self._cu("cuDeviceGetCount", out))
        if error != SUCCESS:
            ctypes.c_int.from_address(out).value = 0
        return error

    def cudaDeviceGetAttribute(self, out: int | None, attribute: int, device: int) -> int:  # noqa: N802
        if not out or not is_runtime_attribute(attribute):
            return INVALID_VALUE
        error = self._init()
        return error if error != SUCCESS else runtime_error(self._cu("cuDeviceGetAttribute", out, attribute, device))

    def cudaDeviceSynchronize(self) -> int:  # noqa: N802
        return self._in_context("cuCtxSynchronize")

    def cudaDriverGetVersion(self, out: int | None) -> int:  # noqa: N802
        if not out:
            return INVALID_VALUE
        if self._cu("cuDriverGetVersion", out) != CU_SUCCESS:
            ctypes.c_int.from_address(out).value = 0  # cudart: 0 and cudaSuccess when there is no driver
        return SUCCESS

    def cudaRuntimeGetVersion(self, out: int | None) -> int:  # noqa: N802
        if not out:
            return INVALID_VALUE
        ctypes.c_int.from_address(out).value = runtime_version()
        return SUCCESS

    def cudaGetLastError(self) -> int:  # noqa: N802
        return self._errors.pop(threading.get_ident(), SUCCESS)

    def cudaPeekAtLastError(self) -> int:  # noqa: N802
        return self._errors.get(threading.get_ident(), SUCCESS)

    def cudaGetDeviceProperties(self, out: int | None, device: int) -> int:  # noqa: N802
        if not out:
            return INVALID_VALUE
        error = self._init()
        if error != SUCCESS:
            return error
        with self._lock:
            filled = self._properties.get(device)
            if filled is None:
                error, filled = self._fill_properties(device)
                if error != SUCCESS or filled is None:
                    return error
                self._properties[device] = filled  # what it holds does not change for the life of the device
        ctypes.memmove(out, filled, len(filled))
        return SUCCESS

    def _fill_properties(self, device: int) -> tuple[int, bytes | None]:
        try:
            from cuda.bindings import runtime
        except ImportError as exc:
            _say_once("cudaDeviceProp", "orion: cudaGetDeviceProperties: %s: returning cudaErrorNotSupported", exc)
            return NOT_SUPPORTED, None
        prop = runtime.cudaDeviceProp()
        base, size = prop.getPtr(), runtime.sizeof(runtime.cudaDeviceProp)

        name = ctypes.create_string_buffer(NAME_LENGTH)
        status = self._cu("cuDeviceGetName", ctypes.addressof(name), NAME_LENGTH, device)
        if status != CU_SUCCESS:
            return runtime_error(status), None
        uuid = (ctypes.c_ubyte * 16)()
        status = self._cu("cuDeviceGetUuid", ctypes.addressof(uuid), device)
        if status != CU_SUCCESS:
            return runtime_error(status), None
        total = ctypes.c_size_t()
        status = self._cu("cuDeviceTotalMem", ctypes.addressof(total), device)
        if status != CU_SUCCESS:
            return runtime_error(status), None
        uuid_at = prop.uuid.getPtr()
        if not base <= uuid_at <= base + size - 16:
            _say_once("cudaDeviceProp.uuid", "orion: cudaGetDeviceProperties: this wheel's cudaDeviceProp.uuid is "
                      "not inside the struct: returning cudaErrorNotSupported")
            return NOT_SUPPORTED, None
        try:
            prop.name = name.raw
        except (IndexError, ValueError, TypeError) as exc:  # a name field of another size: do not guess
            _say_once("cudaDeviceProp.name", "orion: cudaGetDeviceProperties: cannot set the name (%s): returning "
                      "cudaErrorNotSupported", exc)
            return NOT_SUPPORTED, None
        ctypes.memmove(uuid_at, uuid, 16)
        prop.totalGlobalMem = total.value

        unknown: list[str] = []
        cell = ctypes.c_int()
        for field, attribute_names in PROPERTY_ATTRIBUTES.items():
            values = []
            for attribute_name in attribute_names:
                attribute = getattr(runtime.cudaDeviceAttr, attribute_name, None)
                status = (self._cu("cuDeviceGetAttribute", ctypes.addressof(cell), int(attribute), device)
                          if attribute is not None else CU_INVALID_VALUE)
                if status == CU_INVALID_VALUE:  # an attribute the driver (or this wheel) does not know: left 0
                    unknown.append(attribute_name)
                    cell.value = 0
                elif status != CU_SUCCESS:
                    return runtime_error(status), None
                values.append(cell.value)
            value: Any = values if len(values) > 1 else values[0]
            try:
                setattr(prop, field, value)
            except OverflowError:  # an unsigned field: the int's bits, as C's assignment gives them
                setattr(prop, field, [v & 0xFFFFFFFF for v in values] if len(values) > 1 else value & 0xFFFFFFFF)
            except AttributeError:
                unknown.append(field)
        if unknown:
            _say_once("cudaDeviceProp.unknown", "orion: cudaGetDeviceProperties: the driver does not know %s: "
                      "those fields are left 0", ", ".join(unknown))
        return SUCCESS, ctypes.string_at(base, size)


def runtime_implementations(driver: Driver) -> dict[str, Callable[..., int]]:
    """Runtime functions over the driver implementations `driver` (`Forwarder.implementations()`), for
    `capsule_hook.install("cuda.bindings.cyruntime", ...)`. Use `RuntimeShim(driver)` directly to also get the
    fallback that records unimplemented calls as the last error."""
    return RuntimeShim(driver).implementations()
