"""The table of forwarded CUDA driver calls: one entry drives the guest trampoline and the host dispatch.

Each entry names a driver function, its opcode, its exact C signature (as the capsule in
`cuda.bindings.cydriver.__pyx_capi__` spells it; tests/unit/test_driver_api.py holds the table to the
installed wheel) and the role of every parameter. Most calls need nothing more: scalars and handles go in,
pointers to scalars come out, and the wire carries them as one packed struct each way. The few calls that
move buffers, strings, images or kernel arguments name a role the generic code does not handle, and both
sides implement them by hand (guest_runtime/forward.py, host_agent/executor.py).

This module imports no CUDA: the guest, the host and the tests all read it.
"""
from __future__ import annotations

import ctypes
import hashlib
import re
import struct
from dataclasses import dataclass
from functools import cached_property

from .record import CUDA_OPCODE_BASE

# Scalar C types and their struct codes. Handles are opaque pointers: they travel as their value.
SCALARS = {
    "int": "i", "CUresult": "i", "CUdevice": "i",
    "unsigned int": "I", "unsigned char": "B", "unsigned short": "H",
    "size_t": "Q", "CUdeviceptr": "Q", "cuuint64_t": "Q", "unsigned PY_LONG_LONG": "Q",
    "float": "f",
}
ENUMS = {"CUdevice_attribute", "CUpointer_attribute", "CUmemPool_attribute", "CUfunction_attribute",
         "CUfunc_cache", "CUstreamCaptureStatus", "CUjit_option", "CUlibraryOption"}
HANDLES = {"CUcontext", "CUstream", "CUevent", "CUmodule", "CUfunction", "CUlibrary", "CUkernel", "CUmemoryPool"}

# Roles the generic marshalling handles; anything else marks a hand-written call.
IN, OUT = "in", "out"
GENERIC_ROLES = {IN, OUT}
# Roles whose call the guest answers itself: "uva" (a pointer that may be host or device memory; the guest sends
# HtoD/DtoH/DtoD instead), "symbol" (cuGetProcAddress: a trampoline of this process) and "thread_ctx" (the calling
# thread's context stack, which the guest keeps: guest_runtime/contexts.py).
GUEST_ROLES = {"uva", "symbol", "thread_ctx"}


def wire_code(ctype: str) -> str:
    """The struct code a value of C type `ctype` travels as."""
    if ctype in SCALARS:
        return SCALARS[ctype]
    if ctype in ENUMS:
        return "i"
    if ctype in HANDLES:
        return "Q"
    raise KeyError(ctype)


def split_signature(signature: str) -> tuple[str, list[str]]:
    """'CUresult (CUdevice *, int)' -> ('CUresult', ['CUdevice *', 'int'])."""
    match = re.fullmatch(r"\s*(.+?)\s*\((.*)\)\s*", signature)
    if not match:
        raise ValueError(f"not a C function signature: {signature!r}")
    restype, args = match.groups()
    params = [a.strip() for a in args.split(",")] if args.strip() not in ("", "void") else []
    return restype, params


@dataclass(frozen=True)
class Param:
    ctype: str  # as in the signature, e.g. "CUdevice *"
    role: str  # "in", "out", or a hand-written role such as "host_in", "cstr", "image"
    base: str  # the pointed-to type for "out", else ctype

    @property
    def code(self) -> str:
        return wire_code(self.base)


@dataclass(frozen=True)
class DriverCall:
    name: str
    opcode: int
    signature: str
    params: tuple[Param, ...]
    posted: bool  # returns only an error code and may be posted without waiting (errors surface later)

    @cached_property
    def generic(self) -> bool:
        return all(p.role in GENERIC_ROLES for p in self.params)

    @cached_property
    def answered_in_guest(self) -> bool:
        """The guest turns this call into others (cuMemcpy with unified addressing): its opcode never travels."""
        return any(p.role in GUEST_ROLES for p in self.params)

    @cached_property
    def inputs(self) -> struct.Struct:
        """The request payload of a generic call: its `in` parameters, packed (computed once)."""
        return struct.Struct("<" + "".join(p.code for p in self.params if p.role == IN))

    @cached_property
    def outputs(self) -> struct.Struct:
        return struct.Struct("<" + "".join(p.code for p in self.params if p.role == OUT))

    @cached_property
    def input_types(self) -> tuple[str, ...]:
        return tuple(p.ctype for p in self.params if p.role == IN)

    @cached_property
    def output_types(self) -> tuple[str, ...]:
        return tuple(p.base for p in self.params if p.role == OUT)


def _derive(name: str, signature: str, roles: str | None) -> tuple[Param, ...]:
    _restype, ctypes_ = split_signature(signature)
    explicit = roles.split() if roles else [None] * len(ctypes_)
    if len(explicit) != len(ctypes_):
        raise ValueError(f"{name}: {len(explicit)} roles for {len(ctypes_)} parameters")
    params = []
    for ctype, role in zip(ctypes_, explicit, strict=True):
        base = ctype[:-1].strip() if ctype.endswith("*") and ctype.count("*") == 1 else ctype
        if role is None:  # derive: a scalar or handle goes in, a pointer to one comes out
            if ctype in SCALARS or ctype in ENUMS or ctype in HANDLES:
                role = IN
            elif base != ctype and (base in SCALARS or base in ENUMS or base in HANDLES):
                role = OUT
            else:
                raise ValueError(f"{name}: parameter {ctype!r} needs an explicit role")
        params.append(Param(ctype, role, base if role == OUT else ctype))
    return tuple(params)


# name, signature, explicit roles (None: derived), posted.
# Append only: a call's opcode is its position, and both sides must agree (TABLE_DIGEST is checked at HELLO).
_SPEC: list[tuple[str, str, str | None, bool]] = [
    ("cuInit", "CUresult (unsigned int)", None, False),
    ("cuDriverGetVersion", "CUresult (int *)", None, False),
    ("cuDeviceGet", "CUresult (CUdevice *, int)", None, False),
    ("cuDeviceGetCount", "CUresult (int *)", None, False),
    ("cuDeviceGetName", "CUresult (char *, int, CUdevice)", "name_out in in", False),
    ("cuDeviceGetUuid", "CUresult (CUuuid *, CUdevice)", "uuid_out in", False),
    ("cuDeviceGetAttribute", "CUresult (int *, CUdevice_attribute, CUdevice)", None, False),
    ("cuDeviceTotalMem", "CUresult (size_t *, CUdevice)", None, False),
    ("cuDeviceCanAccessPeer", "CUresult (int *, CUdevice, CUdevice)", None, False),
    ("cuGetErrorName", "CUresult (CUresult, char const **)", "in static_str_out", False),
    ("cuGetErrorString", "CUresult (CUresult, char const **)", "in static_str_out", False),
    ("cuDevicePrimaryCtxRetain", "CUresult (CUcontext *, CUdevice)", None, False),
    ("cuDevicePrimaryCtxRelease", "CUresult (CUdevice)", None, False),
    ("cuDevicePrimaryCtxReset", "CUresult (CUdevice)", None, False),
    ("cuDevicePrimaryCtxGetState", "CUresult (CUdevice, unsigned int *, int *)", None, False),
    ("cuDevicePrimaryCtxSetFlags", "CUresult (CUdevice, unsigned int)", None, False),
    ("cuCtxCreate", "CUresult (CUcontext *, CUctxCreateParams *, unsigned int, CUdevice)",
     "out null in in", False),
    ("cuCtxDestroy", "CUresult (CUcontext)", None, False),
    ("cuCtxGetCurrent", "CUresult (CUcontext *)", "thread_ctx", False),
    ("cuCtxSetCurrent", "CUresult (CUcontext)", None, False),
    ("cuCtxPushCurrent", "CUresult (CUcontext)", "thread_ctx", False),
    ("cuCtxPopCurrent", "CUresult (CUcontext *)", "thread_ctx", False),
    ("cuCtxGetDevice", "CUresult (CUdevice *)", None, False),
    ("cuCtxSynchronize", "CUresult (void)", None, False),
    ("cuCtxGetStreamPriorityRange", "CUresult (int *, int *)", None, False),
    ("cuCtxGetFlags", "CUresult (unsigned int *)", None, False),
    ("cuCtxGetApiVersion", "CUresult (CUcontext, unsigned int *)", None, False),
    ("cuCtxGetId", "CUresult (CUcontext, unsigned PY_LONG_LONG *)", None, False),
    ("cuMemAlloc", "CUresult (CUdeviceptr *, size_t)", None, False),
    ("cuMemFree", "CUresult (CUdeviceptr)", None, False),
    ("cuMemGetInfo", "CUresult (size_t *, size_t *)", None, False),
    ("cuMemGetAddressRange", "CUresult (CUdeviceptr *, size_t *, CUdeviceptr)", None, False),
    ("cuMemcpyHtoD", "CUresult (CUdeviceptr, void const *, size_t)", "in host_in in", False),
    ("cuMemcpyDtoH", "CUresult (void *, CUdeviceptr, size_t)", "host_out in in", False),
    ("cuMemcpyDtoD", "CUresult (CUdeviceptr, CUdeviceptr, size_t)", None, False),
    ("cuMemcpyHtoDAsync", "CUresult (CUdeviceptr, void const *, size_t, CUstream)", "in host_in in in", False),
    ("cuMemcpyDtoHAsync", "CUresult (void *, CUdeviceptr, size_t, CUstream)", "host_out in in in", False),
    ("cuMemcpyDtoDAsync", "CUresult (CUdeviceptr, CUdeviceptr, size_t, CUstream)", None, True),
    ("cuMemsetD8", "CUresult (CUdeviceptr, unsigned char, size_t)", None, False),
    ("cuMemsetD16", "CUresult (CUdeviceptr, unsigned short, size_t)", None, False),
    ("cuMemsetD32", "CUresult (CUdeviceptr, unsigned int, size_t)", None, False),
    ("cuMemsetD8Async", "CUresult (CUdeviceptr, unsigned char, size_t, CUstream)", None, True),
    ("cuMemsetD16Async", "CUresult (CUdeviceptr, unsigned short, size_t, CUstream)", None, True),
    ("cuMemsetD32Async", "CUresult (CUdeviceptr, unsigned int, size_t, CUstream)", None, True),
    ("cuModuleLoadData", "CUresult (CUmodule *, void const *)", "out image", False),
    ("cuModuleGetFunction", "CUresult (CUfunction *, CUmodule, char const *)", "out in cstr", False),
    ("cuModuleGetGlobal", "CUresult (CUdeviceptr *, size_t *, CUmodule, char const *)", "out out in cstr", False),
    ("cuModuleUnload", "CUresult (CUmodule)", None, False),
    ("cuLibraryGetKernel", "CUresult (CUkernel *, CUlibrary, char const *)", "out in cstr", False),
    ("cuLibraryGetGlobal", "CUresult (CUdeviceptr *, size_t *, CUlibrary, char const *)", "out out in cstr", False),
    ("cuLibraryUnload", "CUresult (CUlibrary)", None, False),
    ("cuKernelGetFunction", "CUresult (CUfunction *, CUkernel)", None, False),
    ("cuKernelGetAttribute", "CUresult (int *, CUfunction_attribute, CUkernel, CUdevice)", None, False),
    ("cuKernelSetAttribute", "CUresult (CUfunction_attribute, int, CUkernel, CUdevice)", None, False),
    ("cuKernelSetCacheConfig", "CUresult (CUkernel, CUfunc_cache, CUdevice)", None, False),
    ("cuFuncGetAttribute", "CUresult (int *, CUfunction_attribute, CUfunction)", None, False),
    ("cuFuncGetParamInfo", "CUresult (CUfunction, size_t, size_t *, size_t *)", None, False),
    ("cuKernelGetParamInfo", "CUresult (CUkernel, size_t, size_t *, size_t *)", None, False),
    ("cuOccupancyMaxActiveBlocksPerMultiprocessor", "CUresult (int *, CUfunction, int, size_t)", None, False),
    ("cuLaunchKernel", "CUresult (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, "
     "unsigned int, unsigned int, unsigned int, CUstream, void **, void **)",
     "in in in in in in in in in kernel_params launch_extra", True),
    ("cuStreamCreate", "CUresult (CUstream *, unsigned int)", None, False),
    ("cuStreamCreateWithPriority", "CUresult (CUstream *, unsigned int, int)", None, False),
    ("cuStreamDestroy", "CUresult (CUstream)", None, False),
    ("cuStreamSynchronize", "CUresult (CUstream)", None, False),
    ("cuStreamQuery", "CUresult (CUstream)", None, False),
    ("cuStreamWaitEvent", "CUresult (CUstream, CUevent, unsigned int)", None, True),
    ("cuStreamIsCapturing", "CUresult (CUstream, CUstreamCaptureStatus *)", None, False),
    ("cuStreamGetCtx", "CUresult (CUstream, CUcontext *)", None, False),
    ("cuEventCreate", "CUresult (CUevent *, unsigned int)", None, False),
    ("cuEventRecord", "CUresult (CUevent, CUstream)", None, True),
    ("cuEventSynchronize", "CUresult (CUevent)", None, False),
    ("cuEventQuery", "CUresult (CUevent)", None, False),
    ("cuEventElapsedTime", "CUresult (float *, CUevent, CUevent)", None, False),
    ("cuEventDestroy", "CUresult (CUevent)", None, False),
    ("cuDeviceGetMemPool", "CUresult (CUmemoryPool *, CUdevice)", None, False),
    ("cuDeviceGetDefaultMemPool", "CUresult (CUmemoryPool *, CUdevice)", None, False),
    ("cuMemAllocAsync", "CUresult (CUdeviceptr *, size_t, CUstream)", None, False),
    ("cuMemAllocFromPoolAsync", "CUresult (CUdeviceptr *, size_t, CUmemoryPool, CUstream)", None, False),
    ("cuMemFreeAsync", "CUresult (CUdeviceptr, CUstream)", None, False),
    ("cuLibraryLoadData", "CUresult (CUlibrary *, void const *, CUjit_option *, void **, unsigned int, "
     "CUlibraryOption *, void **, unsigned int)", "out image options option_values in options option_values in",
     False),
    ("cuLaunchKernelEx", "CUresult (CUlaunchConfig const *, CUfunction, void **, void **)",
     "launch_config in kernel_params launch_extra", True),
    ("cuMemPoolGetAttribute", "CUresult (CUmemoryPool, CUmemPool_attribute, void *)", "in in pool_value_out", False),
    ("cuMemPoolSetAttribute", "CUresult (CUmemoryPool, CUmemPool_attribute, void *)", "in in pool_value_in", False),
    # Unified addressing: the guest decides which way each copy goes and sends HtoD/DtoH/DtoD (never these).
    ("cuMemcpy", "CUresult (CUdeviceptr, CUdeviceptr, size_t)", "uva uva in", False),
    ("cuMemcpyAsync", "CUresult (CUdeviceptr, CUdeviceptr, size_t, CUstream)", "uva uva in in", False),
    ("cuPointerGetAttribute", "CUresult (void *, CUpointer_attribute, CUdeviceptr)", "pointer_value_out in in", False),
    ("cuLaunchCooperativeKernel", "CUresult (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, "
     "unsigned int, unsigned int, unsigned int, CUstream, void **)", "in in in in in in in in in kernel_params", True),
    ("cuModuleLoadDataEx", "CUresult (CUmodule *, void const *, unsigned int, CUjit_option *, void **)",
     "out image in options option_values", False),
    # Page-locked host memory: carved from this channel's slice of the region's pool (pinned_pool.py on both
    # sides); a pointer into it travels as its value and the host translates it.
    ("cuMemAllocHost", "CUresult (void **, size_t)", "pinned_out in", False),
    ("cuMemHostAlloc", "CUresult (void **, size_t, unsigned int)", "pinned_out in in", False),
    ("cuMemFreeHost", "CUresult (void *)", "pinned_in", False),
    ("cuMemHostGetDevicePointer", "CUresult (CUdeviceptr *, void *, unsigned int)", "out pinned_in in", False),
    ("cuMemHostGetFlags", "CUresult (unsigned int *, void *)", "out pinned_in", False),
    ("cuGetProcAddress", "CUresult (char const *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *)",
     "symbol symbol in in symbol", False),
    ("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", "CUresult (int *, CUfunction, int, size_t, unsigned int)",
     None, False),
    ("cuOccupancyAvailableDynamicSMemPerBlock", "CUresult (size_t *, CUfunction, int, int)", None, False),
    ("cuOccupancyMaxPotentialBlockSize", "CUresult (int *, int *, CUfunction, CUoccupancyB2DSize, size_t, int)",
     "out out in callback in in", False),
    ("cuOccupancyMaxPotentialBlockSizeWithFlags",
     "CUresult (int *, int *, CUfunction, CUoccupancyB2DSize, size_t, int, unsigned int)",
     "out out in callback in in in", False),
]
# CUmemPool_attribute values whose value is a cuuint64_t (the others are int): thresholds and byte counts.
POOL_ATTRIBUTES_64 = frozenset({4, 5, 6, 7, 8, 13})

# CUpointer_attribute value -> bytes cuPointerGetAttribute writes to `data` (the C type cuda.h documents, as the
# wheel's _HelperCUpointer_attribute holds it: handles, pointers, size_t and unsigned long long 8; unsigned int,
# int and bool-as-int 4). CU_POINTER_ATTRIBUTE_P2P_TOKENS (5) fills a struct: not forwarded (NOT_SUPPORTED).
POINTER_ATTRIBUTE_WIDTHS: dict[int, int] = {
    1: 8,  # CONTEXT (CUcontext)
    2: 4,  # MEMORY_TYPE (unsigned int)
    3: 8,  # DEVICE_POINTER (CUdeviceptr)
    4: 8,  # HOST_POINTER (void *)
    6: 4,  # SYNC_MEMOPS (bool as int)
    7: 8,  # BUFFER_ID (unsigned long long)
    8: 4,  # IS_MANAGED (bool as int)
    9: 4,  # DEVICE_ORDINAL (int)
    10: 4,  # IS_LEGACY_CUDA_IPC_CAPABLE (bool as int)
    11: 8,  # RANGE_START_ADDR (CUdeviceptr)
    12: 8,  # RANGE_SIZE (size_t)
    13: 4,  # MAPPED (bool as int)
    14: 8,  # ALLOWED_HANDLE_TYPES (unsigned long long)
    15: 4,  # IS_GPU_DIRECT_RDMA_CAPABLE (unsigned int)
    16: 4,  # ACCESS_FLAGS (unsigned int)
    17: 8,  # MEMPOOL_HANDLE (CUmemoryPool)
    18: 8,  # MAPPING_SIZE (size_t)
    19: 8,  # MAPPING_BASE_ADDR (CUdeviceptr)
    20: 8,  # MEMORY_BLOCK_ID (unsigned long long)
    21: 4,  # IS_HW_DECOMPRESS_CAPABLE (bool as int)
    22: 4,  # LOCALITY_DOMAIN_ORDINAL (int)
}
POINTER_P2P_TOKENS = 5
POINTER_CONTEXT, POINTER_HOST_POINTER, POINTER_DEVICE_ORDINAL, POINTER_MEMPOOL_HANDLE = 1, 4, 9, 17

# cuModuleLoadDataEx JIT options. Scalar ones travel as (option, value) pairs, the value being the integer stored
# in the optionValues slot; each maps to what the wheel takes it as: "I" (unsigned int), "i" (int) or the name of
# its enum (CUjit_target, CUjit_fallback, CUjit_cacheMode).
JIT_SCALAR_OPTIONS: dict[int, str] = {
    0: "I",  # CU_JIT_MAX_REGISTERS
    7: "I",  # CU_JIT_OPTIMIZATION_LEVEL
    8: "I",  # CU_JIT_TARGET_FROM_CUCONTEXT (no value)
    9: "CUjit_target",  # CU_JIT_TARGET
    10: "CUjit_fallback",  # CU_JIT_FALLBACK_STRATEGY
    11: "i",  # CU_JIT_GENERATE_DEBUG_INFO
    13: "i",  # CU_JIT_GENERATE_LINE_INFO
    14: "CUjit_cacheMode",  # CU_JIT_CACHE_MODE
    30: "i",  # CU_JIT_POSITION_INDEPENDENT_CODE
    31: "I",  # CU_JIT_MIN_CTA_PER_SM
    32: "i",  # CU_JIT_MAX_THREADS_PER_BLOCK
    33: "i",  # CU_JIT_OVERRIDE_DIRECTIVE_VALUES
    34: "I",  # CU_JIT_SPLIT_COMPILE
    35: "I",  # CU_JIT_BINARY_LOADER_THREAD_COUNT
}
# Options about the guest's own memory (logs, wall time): answered in the guest (an empty log), never sent.
JIT_WALL_TIME, JIT_INFO_LOG_BUFFER, JIT_INFO_LOG_SIZE, JIT_ERROR_LOG_BUFFER, JIT_ERROR_LOG_SIZE = 2, 3, 4, 5, 6
JIT_LOG_VERBOSE = 12
JIT_GUEST_OPTIONS = frozenset({JIT_WALL_TIME, JIT_INFO_LOG_BUFFER, JIT_INFO_LOG_SIZE, JIT_ERROR_LOG_BUFFER,
                               JIT_ERROR_LOG_SIZE, JIT_LOG_VERBOSE})

# cuLaunchKernelEx launch attributes (CUlaunchAttribute: `i id, 4 pad, 64-byte value union`) that travel as their
# bytes: plain values (flags, dimensions, priorities, a cache hint's address range), and those naming an event in the
# first 8 bytes of the value, which the host checks against the session's events. DEVICE_UPDATABLE_KERNEL_NODE (13)
# writes a graph node through a pointer: not forwarded.
LAUNCH_ATTRIBUTE = struct.Struct("<i4x64s")
# A launch record starts with: function, grid xyz, block xyz, shared memory bytes, stream.
LAUNCH_HEAD = struct.Struct("<QIIIIIIIQ")


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig as cuda.h lays it out."""

    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint)]


LAUNCH_ATTRIBUTES_PLAIN = frozenset({0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 14, 16, 17, 18})
LAUNCH_ATTRIBUTES_EVENT = frozenset({7, 12})  # PROGRAMMATIC_EVENT, LAUNCH_COMPLETION_EVENT

# Opcodes of the forwarding layer that are not driver calls, far above any table position.
POOL_MAP_OPCODE = CUDA_OPCODE_BASE + 0x0F00  # map this channel's pinned-pool slice: `Q proposed guest address`
# Added to a copy call's opcode: its host buffer lies in the pinned pool and travels as its address, not its bytes.
PINNED_COPY = 0x2000
# Answered from the host worker's pool bookkeeping (host_agent/pinned_pool.py), not by the driver function.
PINNED_POOL_CALLS = frozenset({"cuMemAllocHost", "cuMemHostAlloc", "cuMemFreeHost", "cuMemHostGetDevicePointer",
                               "cuMemHostGetFlags"})
PINNED_COPIES = frozenset({"cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync"})

CALLS: dict[str, DriverCall] = {}
BY_OPCODE: dict[int, DriverCall] = {}
for _i, (_name, _sig, _roles, _posted) in enumerate(_SPEC):
    _call = DriverCall(_name, CUDA_OPCODE_BASE + _i, _sig, _derive(_name, _sig, _roles), _posted)
    CALLS[_name] = BY_OPCODE[_call.opcode] = _call

TABLE_DIGEST = hashlib.sha256("\n".join(f"{c.opcode} {c.name} {c.signature}" for c in CALLS.values())
                              .encode()).hexdigest()[:16]
