"""The table of forwarded CUDA driver calls: the one contract both sides of every forwarded call follow.

Each entry declares, once, everything the guest (guest_runtime/forward.py) and the host
(host_agent/session/executor.py) must agree on:

* the driver function, its opcode (its position: the table is append-only) and its exact C signature, as the
  capsule in `cuda.bindings.cydriver.__pyx_capi__` spells it (tests/unit/test_driver_api.py holds every entry
  to the installed wheel);
* the role of every parameter: scalars and handles go `in`, pointers to them come `out`; any other role marks a
  call that one side or both write out by hand;
* the request and the reply payload, as `codec.Schema`s. For a generic call both are derived from the roles
  (the `in` values packed, the `out` values packed); a hand-written call declares them;
* whether it may be posted without waiting, its pinned-pool variant's request (the four host copies), and its
  effects: what it creates, frees or changes, which both sides track (`EFFECTS` says what each word means).

Each side serves hand-written calls through an explicit `Handlers` registry, checked against this table at
import and by the tests. `describe()` gives the table as data (`python -m ivshmem.driver_api json`) for the
generator of the native guest library and for docs/api-table.md (`markdown()`, which the generator completes), and
`table_digest()`, a digest of all of it, is compared at HELLO: a guest and an agent built from different tables
refuse each other in one line.

This module imports no CUDA: the guest, the host and the tests all read it.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import re
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

from . import api_classes, cuda_header
from .codec import Schema, field_kind
from .record import CUDA_OPCODE_BASE, STATS_REPLY

# Scalar C types and their struct codes. Handles are opaque pointers: they travel as their value.
_C_CODES = {
    "int": "i", "CUresult": "i", "unsigned int": "I", "unsigned char": "B", "unsigned short": "H",
    "size_t": "Q", "cuuint64_t": "Q", "unsigned PY_LONG_LONG": "Q", "PY_LONG_LONG": "q", "cuuint32_t": "I",
    "float": "f",
}
_HEADER = cuda_header.read()
# cuda.h's scalar typedefs (CUdevice, CUdeviceptr, CUtexObject...) by the C type they name.
SCALARS = {**_C_CODES, **{name: _C_CODES[ctype] for name, ctype in _HEADER.scalars.items()}}
ENUMS = set(_HEADER.enums)
# Handles a session is given and may name again, checked by the host against what it created: cuda.h's opaque
# handle types and the integer handle of physical memory.
HANDLES = set(_HEADER.handles) | {"CUmemGenericAllocationHandle"}
POINTER_HANDLES = frozenset(_HEADER.handles)  # handles that are C pointers (`typedef struct X_st *X`)
SCALARS.pop("CUmemGenericAllocationHandle")

# Roles the generic marshalling handles; anything else marks a hand-written call.
IN, OUT, INOUT = "in", "out", "inout"  # inout: a pointer to a scalar the call reads and writes
GENERIC_ROLES = {IN, OUT, INOUT}
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


# What a call does besides its reply, tracked by both sides (the guest for unified addressing and its caches,
# the host for what a session owns and its quota).
EFFECTS = {
    "initializes": "the driver is initialised for this process",
    "allocates": "its first output is device memory of its first input's size",
    "frees": "its first input is device memory that is given back",
    "destroys": "its first input, a handle, is no longer valid",
    "loads": "its output is a module or library whose code and globals now take GPU memory",
    "unloads": "what was taken from the module or library (functions, kernels, globals) goes with it",
    "child": "its outputs belong to its first input, a module or library, and go when it is unloaded",
    "makes_context": "it may create a context (a quota counts every one after the first)",
    "measures": "the process may hold more or less GPU memory outside its allocations afterwards",
    "may_end_context": "a context may have ended (destroyed; a primary one released for the last time, or reset), "
                       "and the driver freed the allocations made in it",
    "reserves": "its first output is a device address range of its first input's size, which the session may map",
    "unreserves": "its first input is the base of a reserved address range (of its second input's size), given back",
    "creates_physical": "its first output is physical GPU memory of its first input's size, counted until released",
    "releases_physical": "its first input, physical GPU memory, is given back once no range maps it",
    "allocates_pitched": "its first output is device memory of its second output (the pitch) times its second input "
                         "(the rows) bytes",
}


@dataclass(frozen=True)
class DriverCall:
    name: str
    opcode: int
    signature: str
    params: tuple[Param, ...]
    posted: bool  # returns only an error code and may be posted without waiting (errors surface later)
    request: Schema  # the request payload
    reply: Schema  # the reply payload on success (a failed call replies with its status and no payload)
    effects: frozenset[str]
    pinned: Schema | None  # the request of its pinned-pool variant (opcode + PINNED_COPY), if it has one
    # (parameter position, span) for each device-pointer input that reaches memory: how many bytes from it the
    # call touches (`span_bytes`); the host holds that range to the session's memory
    spans: tuple[tuple[int, str], ...] = ()

    @cached_property
    def generic(self) -> bool:
        """Marshalled from the table alone: every parameter a scalar, a handle or a pointer to one."""
        return all(p.role in GENERIC_ROLES for p in self.params)

    @cached_property
    def optional_outputs(self) -> frozenset[int]:
        """The `out` parameters cuda.h lets a caller leave NULL (cuMemGetAddressRange's base and size): both guest
        clients skip them, as the driver does, instead of answering CUDA_ERROR_INVALID_VALUE (cuda_header.py)."""
        return frozenset(i for i in _HEADER.optional.get(self.name, ())
                         if i < len(self.params) and self.params[i].role == OUT)

    @cached_property
    def answered_in_guest(self) -> bool:
        """The guest turns this call into others (cuMemcpy with unified addressing): its opcode never travels."""
        return any(p.role in GUEST_ROLES for p in self.params)

    @property
    def inputs(self) -> struct.Struct:
        """The request's packed scalars (all of a generic call's request): what hot paths pack directly."""
        return self.request.fixed

    @property
    def outputs(self) -> struct.Struct:
        return self.reply.fixed

    @cached_property
    def input_positions(self) -> tuple[int, ...]:
        """The C parameter position of each value in a generic call's request."""
        return tuple(i for i, p in enumerate(self.params) if p.role in (IN, INOUT))

    @cached_property
    def input_types(self) -> tuple[str, ...]:
        return tuple(self.params[i].base for i in self.input_positions)

    @cached_property
    def output_types(self) -> tuple[str, ...]:
        return tuple(p.base for p in self.params if p.role in (OUT, INOUT))

    def span(self, position: int, args: tuple[int, ...]) -> int:
        """Bytes the device pointer at C parameter `position` reaches, from a generic call's request values `args`
        (1 where the table declares none: the pointer itself must be the session's)."""
        for where, span in self.spans:
            if where == position:
                return span_bytes(span, dict(zip(self.input_positions, args, strict=True)))
        return 1

    def describe(self) -> dict[str, Any]:
        """The entry as data, for generators and docs."""
        return {
            "name": self.name, "opcode": self.opcode, "signature": self.signature,
            "params": [{"ctype": p.ctype, "role": p.role} for p in self.params],
            "optional_outputs": sorted(self.optional_outputs),
            "generic": self.generic, "answered_in_guest": self.answered_in_guest, "posted": self.posted,
            "request": self.request.describe(), "reply": self.reply.describe(),
            "pinned_request": self.pinned.describe() if self.pinned is not None else None,
            "effects": sorted(self.effects), "spans": [list(span) for span in self.spans],
        }


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
        params.append(Param(ctype, role, base if role in (OUT, INOUT) else ctype))
    return tuple(params)


def _schema(name: str, fields: str) -> Schema:
    """'device:u64 size:u64 data:tail' -> a Schema."""
    pairs = [field.split(":", 1) for field in fields.split()]
    return Schema(name, *[(field, kind) for field, kind in pairs])


def _role_schema(name: str, params: tuple[Param, ...], role: str) -> Schema:
    """A generic call's request (role "in": its `in` and `inout` parameters) or reply ("out": its `out` and
    `inout` ones), named by their position."""
    return Schema(name, *[(f"arg{i}", field_kind(p.code)) for i, p in enumerate(params) if p.role in (role, INOUT)])


def span_bytes(span: str, values: dict[int, int]) -> int:
    """A declared span (api_classes.GENERATED) evaluated over a call's request values by C parameter position:
    `N` bytes, `argN`, `argN*K`, or `2d:P,W,H,K` (pitch argP, argW elements of K bytes in argH rows)."""
    if span.startswith("2d:"):
        pitch, width, height, size = (int(x) for x in span[3:].split(","))
        rows = values[height]
        return 0 if rows == 0 else values[pitch] * (rows - 1) + values[width] * size
    if span.startswith("arg"):
        position, _star, factor = span[3:].partition("*")
        return values[int(position)] * int(factor or 1)
    return int(span)


def _entry(opcode: int, name: str, signature: str, roles: str | None = None, *, posted: bool = False,
           request: str | None = None, reply: str | None = None, effects: str = "",
           pinned: str | None = None, spans: dict[int, str] | None = None) -> DriverCall:
    params = _derive(name, signature, roles)
    generic = all(p.role in GENERIC_ROLES for p in params)
    if generic and (request is not None or reply is not None):
        raise ValueError(f"{name}: a generic call's payloads come from its roles; it declares none")
    unknown = set(effects.split()) - set(EFFECTS)
    if unknown:
        raise ValueError(f"{name}: unknown effects {sorted(unknown)}")
    return DriverCall(
        name, opcode, signature, params, posted,
        _role_schema(name, params, IN) if generic else _schema(name, request or ""),
        _role_schema(f"{name} reply", params, OUT) if generic else _schema(f"{name} reply", reply or ""),
        frozenset(effects.split()), _schema(f"{name} pinned", pinned) if pinned else None,
        tuple(sorted((spans or {}).items())))


LAUNCH = ("function:u64 grid_x:u32 grid_y:u32 grid_z:u32 block_x:u32 block_y:u32 block_z:u32 shared_bytes:u32 "
          "stream:u64")
# A CUlaunchAttribute as it travels: `i id, 4 pad, 64-byte value union`.
LAUNCH_ATTRIBUTE_KIND = "[i4x64s]"
JIT_OPTIONS_KIND = "[iQ]"  # (option, the integer in its optionValues slot): scalar JIT options only
# A CUmemAllocationProp as it travels: its type, requested handle types, location (type, id: a guest ordinal for a
# device) and allocation flags; win32HandleMetaData is Windows-only and never travels.
ALLOCATION_PROP = ("kind:i32 handle_types:i32 location_kind:i32 location:i32 compression:u8 rdma_capable:u8 "
                   "usage:u16")
# A CUmemLocation as it travels (a guest ordinal for a device), and a CUmemPoolProps: its allocation type, handle
# types, location, maximum size, usage and RDMA flag; win32SecurityAttributes is Windows-only and never travels, and
# the reserved bytes must be zero (the guest refuses others: a field this table does not carry).
MEM_LOCATION = "location_kind:i32 location:i32"
POOL_PROPS = f"kind:i32 handle_types:i32 {MEM_LOCATION} max_size:u64 usage:u16 rdma_capable:u8"

# A CUstreamBatchMemOpParams as it travels: operation, flags, address, value (cuStreamBatchMemOp, batch nodes).
BATCH_MEM_OP = "[iIQQ]"

# A CUDA_KERNEL_NODE_PARAMS as it travels: its function (or CUkernel), context and launch dimensions; the kernel's
# parameters follow as a launch's do (packed by their layout), `extra` never travels.
KERNEL_NODE = ("function:u64 kernel:u64 context:u64 grid_x:u32 grid_y:u32 grid_z:u32 block_x:u32 block_y:u32 "
               "block_z:u32 shared_bytes:u32")
# A CUDA_MEMSET_NODE_PARAMS: dst, pitch, value, elementSize, width (elements), height (rows).
MEMSET_NODE = "dst:u64 pitch:u64 value:u32 element_size:u32 width:u64 height:u64"
# A CUDA_MEMCPY3D without its arrays (array copies are not forwarded): each side's offsets, memory type, host or
# device address, pitch and height, then the extent. A host address must be the guest's page-locked pool memory.
MEMCPY_3D = ("src_x:u64 src_y:u64 src_z:u64 src_lod:u64 src_type:u32 src_host:u64 src_device:u64 src_pitch:u64 "
             "src_height:u64 dst_x:u64 dst_y:u64 dst_z:u64 dst_lod:u64 dst_type:u32 dst_host:u64 dst_device:u64 "
             "dst_pitch:u64 dst_height:u64 width:u64 height:u64 depth:u64")
# A structured copy (cuMemcpy2D/3D and their kin) as it travels: which side is the guest's pageable host memory,
# staged through the record (`staged`: 0 neither, 1 the source: its rows are the request's tail, 2 the destination:
# its rows come back as the reply), the bytes of those rows this record carries (`offset`, `length`, into the rows
# packed back to back: WidthInBytes each, row after row, slice after slice), then the copy as MEMCPY_3D (a 2D copy's
# third dimension empty: z and LOD 0, depth 1). A staged side's own fields but its LOD are the guest's alone.
STRUCTURED_COPY = f"staged:u32 offset:u64 length:u64 {MEMCPY_3D}"

# Append only: a call's opcode is its position, and both sides must agree (table_digest() is compared at HELLO).
_SPEC: list[tuple[Any, ...]] = [
    ("cuInit", "CUresult (unsigned int)", None, {"effects": "initializes"}),
    ("cuDriverGetVersion", "CUresult (int *)"),
    ("cuDeviceGet", "CUresult (CUdevice *, int)"),
    ("cuDeviceGetCount", "CUresult (int *)"),
    ("cuDeviceGetName", "CUresult (char *, int, CUdevice)", "name_out in in",
     {"request": "length:i32 device:i32", "reply": "name:tail"}),
    ("cuDeviceGetUuid", "CUresult (CUuuid *, CUdevice)", "uuid_out in",
     {"request": "device:i32", "reply": "uuid:tail"}),
    ("cuDeviceGetAttribute", "CUresult (int *, CUdevice_attribute, CUdevice)"),
    ("cuDeviceTotalMem", "CUresult (size_t *, CUdevice)"),
    ("cuDeviceCanAccessPeer", "CUresult (int *, CUdevice, CUdevice)"),
    ("cuGetErrorName", "CUresult (CUresult, char const **)", "in static_str_out",
     {"request": "error:i32", "reply": "text:tail"}),
    ("cuGetErrorString", "CUresult (CUresult, char const **)", "in static_str_out",
     {"request": "error:i32", "reply": "text:tail"}),
    ("cuDevicePrimaryCtxRetain", "CUresult (CUcontext *, CUdevice)", None, {"effects": "makes_context"}),
    ("cuDevicePrimaryCtxRelease", "CUresult (CUdevice)", None, {"effects": "may_end_context measures"}),
    ("cuDevicePrimaryCtxReset", "CUresult (CUdevice)", None, {"effects": "may_end_context measures"}),
    ("cuDevicePrimaryCtxGetState", "CUresult (CUdevice, unsigned int *, int *)"),
    ("cuDevicePrimaryCtxSetFlags", "CUresult (CUdevice, unsigned int)"),
    ("cuCtxCreate", "CUresult (CUcontext *, CUctxCreateParams *, unsigned int, CUdevice)", "out null in in",
     {"request": "flags:u32 device:i32", "reply": "context:u64", "effects": "makes_context"}),
    ("cuCtxDestroy", "CUresult (CUcontext)", None, {"effects": "destroys may_end_context measures"}),
    ("cuCtxGetCurrent", "CUresult (CUcontext *)", "thread_ctx"),
    ("cuCtxSetCurrent", "CUresult (CUcontext)"),
    ("cuCtxPushCurrent", "CUresult (CUcontext)", "thread_ctx"),
    ("cuCtxPopCurrent", "CUresult (CUcontext *)", "thread_ctx"),
    ("cuCtxGetDevice", "CUresult (CUdevice *)"),
    ("cuCtxSynchronize", "CUresult (void)"),
    ("cuCtxGetStreamPriorityRange", "CUresult (int *, int *)"),
    ("cuCtxGetFlags", "CUresult (unsigned int *)"),
    ("cuCtxGetApiVersion", "CUresult (CUcontext, unsigned int *)"),
    ("cuCtxGetId", "CUresult (CUcontext, unsigned PY_LONG_LONG *)"),
    ("cuMemAlloc", "CUresult (CUdeviceptr *, size_t)", None, {"effects": "allocates"}),
    ("cuMemFree", "CUresult (CUdeviceptr)", None, {"effects": "frees"}),
    ("cuMemGetInfo", "CUresult (size_t *, size_t *)"),
    ("cuMemGetAddressRange", "CUresult (CUdeviceptr *, size_t *, CUdeviceptr)"),
    ("cuMemcpyHtoD", "CUresult (CUdeviceptr, void const *, size_t)", "in host_in in",
     {"request": "device:u64 size:u64 data:tail", "pinned": "device:u64 size:u64 host:u64"}),
    ("cuMemcpyDtoH", "CUresult (void *, CUdeviceptr, size_t)", "host_out in in",
     {"request": "device:u64 size:u64", "reply": "data:tail", "pinned": "device:u64 size:u64 host:u64"}),
    ("cuMemcpyDtoD", "CUresult (CUdeviceptr, CUdeviceptr, size_t)", None, {"spans": {0: "arg2", 1: "arg2"}}),
    ("cuMemcpyHtoDAsync", "CUresult (CUdeviceptr, void const *, size_t, CUstream)", "in host_in in in",
     {"request": "device:u64 size:u64 stream:u64 data:tail", "pinned": "device:u64 size:u64 stream:u64 host:u64"}),
    ("cuMemcpyDtoHAsync", "CUresult (void *, CUdeviceptr, size_t, CUstream)", "host_out in in in",
     {"request": "device:u64 size:u64 stream:u64", "reply": "data:tail",
      "pinned": "device:u64 size:u64 stream:u64 host:u64"}),
    ("cuMemcpyDtoDAsync", "CUresult (CUdeviceptr, CUdeviceptr, size_t, CUstream)", None,
     {"posted": True, "spans": {0: "arg2", 1: "arg2"}}),
    ("cuMemsetD8", "CUresult (CUdeviceptr, unsigned char, size_t)", None, {"spans": {0: "arg2"}}),
    ("cuMemsetD16", "CUresult (CUdeviceptr, unsigned short, size_t)", None, {"spans": {0: "arg2*2"}}),
    ("cuMemsetD32", "CUresult (CUdeviceptr, unsigned int, size_t)", None, {"spans": {0: "arg2*4"}}),
    ("cuMemsetD8Async", "CUresult (CUdeviceptr, unsigned char, size_t, CUstream)", None,
     {"posted": True, "spans": {0: "arg2"}}),
    ("cuMemsetD16Async", "CUresult (CUdeviceptr, unsigned short, size_t, CUstream)", None,
     {"posted": True, "spans": {0: "arg2*2"}}),
    ("cuMemsetD32Async", "CUresult (CUdeviceptr, unsigned int, size_t, CUstream)", None,
     {"posted": True, "spans": {0: "arg2*4"}}),
    ("cuModuleLoadData", "CUresult (CUmodule *, void const *)", "out image",
     {"request": "image:tail", "reply": "module:u64", "effects": "loads"}),
    ("cuModuleGetFunction", "CUresult (CUfunction *, CUmodule, char const *)", "out in cstr",
     {"request": "module:u64 name:tail", "reply": "function:u64", "effects": "child measures"}),
    ("cuModuleGetGlobal", "CUresult (CUdeviceptr *, size_t *, CUmodule, char const *)", "out out in cstr",
     {"request": "module:u64 name:tail", "reply": "pointer:u64 size:u64", "effects": "child measures"}),
    ("cuModuleUnload", "CUresult (CUmodule)", None, {"effects": "destroys unloads measures"}),
    ("cuLibraryGetKernel", "CUresult (CUkernel *, CUlibrary, char const *)", "out in cstr",
     {"request": "library:u64 name:tail", "reply": "kernel:u64", "effects": "child measures"}),
    ("cuLibraryGetGlobal", "CUresult (CUdeviceptr *, size_t *, CUlibrary, char const *)", "out out in cstr",
     {"request": "library:u64 name:tail", "reply": "pointer:u64 size:u64", "effects": "child measures"}),
    ("cuLibraryUnload", "CUresult (CUlibrary)", None, {"effects": "destroys unloads measures"}),
    ("cuKernelGetFunction", "CUresult (CUfunction *, CUkernel)", None, {"effects": "measures"}),
    ("cuKernelGetAttribute", "CUresult (int *, CUfunction_attribute, CUkernel, CUdevice)"),
    ("cuKernelSetAttribute", "CUresult (CUfunction_attribute, int, CUkernel, CUdevice)"),
    ("cuKernelSetCacheConfig", "CUresult (CUkernel, CUfunc_cache, CUdevice)"),
    ("cuFuncGetAttribute", "CUresult (int *, CUfunction_attribute, CUfunction)"),
    ("cuFuncGetParamInfo", "CUresult (CUfunction, size_t, size_t *, size_t *)"),
    ("cuKernelGetParamInfo", "CUresult (CUkernel, size_t, size_t *, size_t *)"),
    ("cuOccupancyMaxActiveBlocksPerMultiprocessor", "CUresult (int *, CUfunction, int, size_t)"),
    ("cuLaunchKernel", "CUresult (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, "
     "unsigned int, unsigned int, unsigned int, CUstream, void **, void **)",
     "in in in in in in in in in kernel_params launch_extra",
     {"posted": True, "request": f"{LAUNCH} params:tail"}),
    ("cuStreamCreate", "CUresult (CUstream *, unsigned int)"),
    ("cuStreamCreateWithPriority", "CUresult (CUstream *, unsigned int, int)"),
    ("cuStreamDestroy", "CUresult (CUstream)", None, {"effects": "destroys"}),
    ("cuStreamSynchronize", "CUresult (CUstream)"),
    ("cuStreamQuery", "CUresult (CUstream)"),
    ("cuStreamWaitEvent", "CUresult (CUstream, CUevent, unsigned int)", None, {"posted": True}),
    ("cuStreamIsCapturing", "CUresult (CUstream, CUstreamCaptureStatus *)"),
    ("cuStreamGetCtx", "CUresult (CUstream, CUcontext *)"),
    ("cuEventCreate", "CUresult (CUevent *, unsigned int)"),
    ("cuEventRecord", "CUresult (CUevent, CUstream)", None, {"posted": True}),
    ("cuEventSynchronize", "CUresult (CUevent)"),
    ("cuEventQuery", "CUresult (CUevent)"),
    ("cuEventElapsedTime", "CUresult (float *, CUevent, CUevent)"),
    ("cuEventDestroy", "CUresult (CUevent)", None, {"effects": "destroys"}),
    ("cuDeviceGetMemPool", "CUresult (CUmemoryPool *, CUdevice)"),
    ("cuDeviceGetDefaultMemPool", "CUresult (CUmemoryPool *, CUdevice)"),
    ("cuMemAllocAsync", "CUresult (CUdeviceptr *, size_t, CUstream)", None, {"effects": "allocates"}),
    ("cuMemAllocFromPoolAsync", "CUresult (CUdeviceptr *, size_t, CUmemoryPool, CUstream)", None,
     {"effects": "allocates"}),
    ("cuMemFreeAsync", "CUresult (CUdeviceptr, CUstream)", None, {"effects": "frees"}),
    ("cuLibraryLoadData", "CUresult (CUlibrary *, void const *, CUjit_option *, void **, unsigned int, "
     "CUlibraryOption *, void **, unsigned int)", "out image options option_values in options option_values in",
     {"request": f"options:{JIT_OPTIONS_KIND} image:tail", "reply": "library:u64", "effects": "loads"}),
    ("cuLaunchKernelEx", "CUresult (CUlaunchConfig const *, CUfunction, void **, void **)",
     "launch_config in kernel_params launch_extra",
     {"posted": True, "request": f"{LAUNCH} attributes:{LAUNCH_ATTRIBUTE_KIND} params:tail"}),
    ("cuMemPoolGetAttribute", "CUresult (CUmemoryPool, CUmemPool_attribute, void *)", "in in pool_value_out",
     {"request": "pool:u64 attribute:i32", "reply": "value:u64"}),
    ("cuMemPoolSetAttribute", "CUresult (CUmemoryPool, CUmemPool_attribute, void *)", "in in pool_value_in",
     {"request": "pool:u64 attribute:i32 value:u64"}),
    # Unified addressing: the guest decides which way each copy goes and sends HtoD/DtoH/DtoD (never these).
    ("cuMemcpy", "CUresult (CUdeviceptr, CUdeviceptr, size_t)", "uva uva in"),
    ("cuMemcpyAsync", "CUresult (CUdeviceptr, CUdeviceptr, size_t, CUstream)", "uva uva in in"),
    ("cuPointerGetAttribute", "CUresult (void *, CUpointer_attribute, CUdeviceptr)", "pointer_value_out in in",
     {"request": "attribute:i32 pointer:u64", "reply": "value:u64 width:u32"}),
    ("cuLaunchCooperativeKernel", "CUresult (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, "
     "unsigned int, unsigned int, unsigned int, CUstream, void **)", "in in in in in in in in in kernel_params",
     {"posted": True, "request": f"{LAUNCH} params:tail"}),
    ("cuModuleLoadDataEx", "CUresult (CUmodule *, void const *, unsigned int, CUjit_option *, void **)",
     "out image in options option_values",
     {"request": f"options:{JIT_OPTIONS_KIND} image:tail", "reply": "module:u64", "effects": "loads"}),
    # Page-locked host memory: carved from this channel's slice of the region's pool (pinned_pool.py on both
    # sides); a pointer into it travels as its value and the host translates it.
    ("cuMemAllocHost", "CUresult (void **, size_t)", "pinned_out in",
     {"request": "size:u64", "reply": "pointer:u64"}),
    ("cuMemHostAlloc", "CUresult (void **, size_t, unsigned int)", "pinned_out in in",
     {"request": "size:u64 flags:u32", "reply": "pointer:u64"}),
    ("cuMemFreeHost", "CUresult (void *)", "pinned_in", {"request": "pointer:u64"}),
    ("cuMemHostGetDevicePointer", "CUresult (CUdeviceptr *, void *, unsigned int)", "out pinned_in in",
     {"request": "pointer:u64 flags:u32", "reply": "device_pointer:u64"}),
    ("cuMemHostGetFlags", "CUresult (unsigned int *, void *)", "out pinned_in",
     {"request": "pointer:u64", "reply": "flags:u32"}),
    ("cuGetProcAddress", "CUresult (char const *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *)",
     "symbol symbol in in symbol"),
    ("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", "CUresult (int *, CUfunction, int, size_t, unsigned int)"),
    ("cuOccupancyAvailableDynamicSMemPerBlock", "CUresult (size_t *, CUfunction, int, int)"),
    ("cuOccupancyMaxPotentialBlockSize", "CUresult (int *, int *, CUfunction, CUoccupancyB2DSize, size_t, int)",
     "out out in callback in in",
     {"request": "function:u64 dynamic_shared_bytes:u64 block_limit:i32", "reply": "min_grid:i32 block:i32"}),
    ("cuOccupancyMaxPotentialBlockSizeWithFlags",
     "CUresult (int *, int *, CUfunction, CUoccupancyB2DSize, size_t, int, unsigned int)",
     "out out in callback in in in",
     {"request": "function:u64 dynamic_shared_bytes:u64 block_limit:i32 flags:u32",
      "reply": "min_grid:i32 block:i32"}),
    # issue 13: what PyTorch's kernels set before their first launch (measured on the H100)
    ("cuFuncSetAttribute", "CUresult (CUfunction, CUfunction_attribute, int)"),
    ("cuFuncSetCacheConfig", "CUresult (CUfunction, CUfunc_cache)"),
    # issue 13: the rest of what PyTorch, CuPy and JAX call (docs/native-driver.md). cuBLAS sizes its cluster
    # launches with cuOccupancyMaxActiveClusters and encodes TMA descriptors on Hopper.
    ("cuOccupancyMaxActiveClusters", "CUresult (int *, CUfunction, CUlaunchConfig const *)",
     "out in launch_config", {"request": f"{LAUNCH} attributes:{LAUNCH_ATTRIBUTE_KIND}", "reply": "clusters:i32"}),
    ("cuTensorMapEncodeTiled", "CUresult (CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, "
     "cuuint64_t const *, cuuint64_t const *, cuuint32_t const *, cuuint32_t const *, CUtensorMapInterleave, "
     "CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill)",
     "tensor_map_out in in device_address dims strides box element_strides in in in in",
     {"request": "data_type:i32 rank:u32 address:u64 interleave:i32 swizzle:i32 l2_promotion:i32 oob_fill:i32 "
                 "dims:[Q] strides:[Q] box:[I] element_strides:[I]", "reply": "map:tail"}),
    # The rest of the tensor-map family (host_agent/session/launch_extras.py, guest_runtime/native/tensor_map.c): im2col
    # maps checked as tiled ones are; a replace or an allocation class travels as the map's 128 bytes, which the host
    # takes only if it encoded them for this session (docs/native-driver.md), and comes back as the new bytes.
    ("cuTensorMapEncodeIm2col", "CUresult (CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, "
     "cuuint64_t const *, cuuint64_t const *, int const *, int const *, cuuint32_t, cuuint32_t, cuuint32_t const *, "
     "CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill)",
     "tensor_map_out in in device_address dims strides corner corner in in element_strides in in in in",
     {"request": "data_type:i32 rank:u32 address:u64 interleave:i32 swizzle:i32 l2_promotion:i32 oob_fill:i32 "
                 "channels:u32 pixels:u32 dims:[Q] strides:[Q] lower:[i] upper:[i] element_strides:[I]",
      "reply": "map:tail"}),
    ("cuTensorMapEncodeIm2colWide", "CUresult (CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, "
     "cuuint64_t const *, cuuint64_t const *, int, int, cuuint32_t, cuuint32_t, cuuint32_t const *, "
     "CUtensorMapInterleave, CUtensorMapIm2ColWideMode, CUtensorMapSwizzle, CUtensorMapL2promotion, "
     "CUtensorMapFloatOOBfill)",
     "tensor_map_out in in device_address dims strides in in in in element_strides in in in in in",
     {"request": "data_type:i32 rank:u32 address:u64 interleave:i32 mode:i32 swizzle:i32 l2_promotion:i32 "
                 "oob_fill:i32 lower:i32 upper:i32 channels:u32 pixels:u32 dims:[Q] strides:[Q] "
                 "element_strides:[I]", "reply": "map:tail"}),
    ("cuTensorMapReplaceAddress", "CUresult (CUtensorMap *, void *)", "tensor_map_inout device_address",
     {"request": "address:u64 map:tail", "reply": "map:tail"}),
    ("cuTensorMapSetAllocationClass", "CUresult (CUtensorMap *, CUtensorMapAllocClass, CUtensorMapAllocClass *)",
     # (roles by hand: CUtensorMapAllocClass is the wheel's, newer than the inventory's cuda.h, so no enum of ours)
     "tensor_map_inout alloc_class alloc_class_out",
     {"request": "alloc_class:i32 map:tail", "reply": "effective:i32 map:tail"}),
    ("cuCtxGetLimit", "CUresult (size_t *, CUlimit)"),
    ("cuCtxSetLimit", "CUresult (CUlimit, size_t)", None, {"effects": "measures"}),
    # Stream memory operations; the guest also builds cuLaunchHostFunc from them (a host function runs in the
    # guest, in stream order: docs/native-driver.md).
    ("cuStreamWaitValue32", "CUresult (CUstream, CUdeviceptr, cuuint32_t, unsigned int)", None,
     {"posted": True, "spans": {1: "4"}}),
    ("cuStreamWriteValue32", "CUresult (CUstream, CUdeviceptr, cuuint32_t, unsigned int)", None,
     {"posted": True, "spans": {1: "4"}}),
    # Virtual memory management (JAX's allocator): reserved ranges, physical memory mapped into them.
    ("cuMemGetAllocationGranularity", "CUresult (size_t *, CUmemAllocationProp const *, "
     "CUmemAllocationGranularity_flags)", "out allocation_prop in",
     {"request": f"{ALLOCATION_PROP} option:i32", "reply": "granularity:u64"}),
    ("cuMemAddressReserve", "CUresult (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned PY_LONG_LONG)", None,
     {"effects": "reserves"}),
    ("cuMemAddressFree", "CUresult (CUdeviceptr, size_t)", None, {"effects": "unreserves"}),
    ("cuMemCreate", "CUresult (CUmemGenericAllocationHandle *, size_t, CUmemAllocationProp const *, "
     "unsigned PY_LONG_LONG)", "out in allocation_prop in",
     {"request": f"size:u64 flags:u64 {ALLOCATION_PROP}", "reply": "handle:u64", "effects": "creates_physical"}),
    ("cuMemRelease", "CUresult (CUmemGenericAllocationHandle)", None, {"effects": "destroys releases_physical"}),
    ("cuMemMap", "CUresult (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned PY_LONG_LONG)"),
    ("cuMemUnmap", "CUresult (CUdeviceptr, size_t)"),
    ("cuMemSetAccess", "CUresult (CUdeviceptr, size_t, CUmemAccessDesc const *, size_t)", "in in access_descs count",
     {"request": "pointer:u64 size:u64 descs:[iii]"}),
    # Stream capture (issue 28): the capture's status, id and graph, and the nodes its next node will depend on,
    # with their edges' data (CUgraphEdgeData's 8 bytes each, as a little-endian u64).
    ("cuStreamGetCaptureInfo", "CUresult (CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *, "
     "CUgraphNode const **, CUgraphEdgeData const **, size_t *)", "in out out out nodes_out edges_out out",
     {"request": "stream:u64", "reply": "status:i32 id:u64 graph:u64 nodes:[Q] edges:[Q]"}),
    # CUDA graphs built node by node (issue 28: XLA's command buffers). Node arrays travel as counted u64 lists,
    # edge data (CUgraphEdgeData's 8 bytes) as u64s; a query's `capacity` is the caller's array length (0: the
    # count only), its reply the driver's count and the entries it wrote.
    ("cuGraphGetNodes", "CUresult (CUgraph, CUgraphNode *, size_t *)", "in nodes_out count_inout",
     {"request": "graph:u64 capacity:u64", "reply": "count:u64 nodes:[Q]"}),
    ("cuGraphGetRootNodes", "CUresult (CUgraph, CUgraphNode *, size_t *)", "in nodes_out count_inout",
     {"request": "graph:u64 capacity:u64", "reply": "count:u64 nodes:[Q]"}),
    ("cuGraphGetEdges", "CUresult (CUgraph, CUgraphNode *, CUgraphNode *, CUgraphEdgeData *, size_t *)",
     "in nodes_out nodes_out edges_out count_inout",
     {"request": "graph:u64 capacity:u64", "reply": "count:u64 from:[Q] to:[Q] edges:[Q]"}),
    ("cuGraphNodeGetDependencies", "CUresult (CUgraphNode, CUgraphNode *, CUgraphEdgeData *, size_t *)",
     "in nodes_out edges_out count_inout",
     {"request": "node:u64 capacity:u64", "reply": "count:u64 nodes:[Q] edges:[Q]"}),
    ("cuGraphNodeGetDependentNodes", "CUresult (CUgraphNode, CUgraphNode *, CUgraphEdgeData *, size_t *)",
     "in nodes_out edges_out count_inout",
     {"request": "node:u64 capacity:u64", "reply": "count:u64 nodes:[Q] edges:[Q]"}),
    ("cuGraphAddEmptyNode", "CUresult (CUgraphNode *, CUgraph, CUgraphNode const *, size_t)", "out in nodes_in count",
     {"request": "graph:u64 deps:[Q]", "reply": "node:u64"}),
    ("cuGraphAddChildGraphNode", "CUresult (CUgraphNode *, CUgraph, CUgraphNode const *, size_t, CUgraph)",
     "out in nodes_in count in", {"request": "graph:u64 child:u64 deps:[Q]", "reply": "node:u64"}),
    ("cuGraphAddEventRecordNode", "CUresult (CUgraphNode *, CUgraph, CUgraphNode const *, size_t, CUevent)",
     "out in nodes_in count in", {"request": "graph:u64 event:u64 deps:[Q]", "reply": "node:u64"}),
    ("cuGraphAddEventWaitNode", "CUresult (CUgraphNode *, CUgraph, CUgraphNode const *, size_t, CUevent)",
     "out in nodes_in count in", {"request": "graph:u64 event:u64 deps:[Q]", "reply": "node:u64"}),
    ("cuGraphAddDependencies", "CUresult (CUgraph, CUgraphNode const *, CUgraphNode const *, "
     "CUgraphEdgeData const *, size_t)", "in nodes_in nodes_in edges_in count",
     {"request": "graph:u64 from:[Q] to:[Q] edges:[Q]"}),
    ("cuGraphRemoveDependencies", "CUresult (CUgraph, CUgraphNode const *, CUgraphNode const *, "
     "CUgraphEdgeData const *, size_t)", "in nodes_in nodes_in edges_in count",
     {"request": "graph:u64 from:[Q] to:[Q] edges:[Q]"}),
    ("cuGraphAddMemsetNode", "CUresult (CUgraphNode *, CUgraph, CUgraphNode const *, size_t, "
     "CUDA_MEMSET_NODE_PARAMS const *, CUcontext)", "out in nodes_in count memset_params in",
     {"request": f"graph:u64 context:u64 {MEMSET_NODE} deps:[Q]", "reply": "node:u64"}),
    ("cuGraphAddMemcpyNode", "CUresult (CUgraphNode *, CUgraph, CUgraphNode const *, size_t, "
     "CUDA_MEMCPY3D const *, CUcontext)", "out in nodes_in count copy_params in",
     {"request": f"graph:u64 context:u64 {MEMCPY_3D} deps:[Q]", "reply": "node:u64"}),
    ("cuGraphAddKernelNode", "CUresult (CUgraphNode *, CUgraph, CUgraphNode const *, size_t, "
     "CUDA_KERNEL_NODE_PARAMS const *)", "out in nodes_in count kernel_node_params",
     {"request": f"graph:u64 {KERNEL_NODE} deps:[Q] params:tail", "reply": "node:u64"}),
    ("cuGraphKernelNodeSetParams", "CUresult (CUgraphNode, CUDA_KERNEL_NODE_PARAMS const *)",
     "in kernel_node_params", {"request": f"node:u64 {KERNEL_NODE} params:tail"}),
    ("cuGraphExecKernelNodeSetParams", "CUresult (CUgraphExec, CUgraphNode, CUDA_KERNEL_NODE_PARAMS const *)",
     "in in kernel_node_params", {"request": f"exec:u64 node:u64 {KERNEL_NODE} params:tail"}),
    ("cuGraphMemsetNodeSetParams", "CUresult (CUgraphNode, CUDA_MEMSET_NODE_PARAMS const *)", "in memset_params",
     {"request": f"node:u64 {MEMSET_NODE}"}),
    ("cuGraphExecMemsetNodeSetParams", "CUresult (CUgraphExec, CUgraphNode, CUDA_MEMSET_NODE_PARAMS const *, "
     "CUcontext)", "in in memset_params in", {"request": f"exec:u64 node:u64 context:u64 {MEMSET_NODE}"}),
    ("cuGraphMemcpyNodeSetParams", "CUresult (CUgraphNode, CUDA_MEMCPY3D const *)", "in copy_params",
     {"request": f"node:u64 {MEMCPY_3D}"}),
    ("cuGraphExecMemcpyNodeSetParams", "CUresult (CUgraphExec, CUgraphNode, CUDA_MEMCPY3D const *, CUcontext)",
     "in in copy_params in", {"request": f"exec:u64 node:u64 context:u64 {MEMCPY_3D}"}),
    ("cuGraphExecUpdate", "CUresult (CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo *)", "in in update_info_out",
     {"request": "exec:u64 graph:u64", "reply": "result:i32 error_node:u64 error_from_node:u64"}),
    # cuGraphAddNode travels for the node types no other call makes (XLA's command buffers): a conditional node
    # (`handle`, `cond_type`, `size`, `context`: the driver makes its body graphs, whose handles come back) and a
    # child graph moved into its node (`type` CU_GRAPH_NODE_TYPE_GRAPH, `child`, `ownership` MOVE). The guest turns
    # every other node type into that type's own call above.
    ("cuGraphAddNode", "CUresult (CUgraphNode *, CUgraph, CUgraphNode const *, CUgraphEdgeData const *, size_t, "
     "CUgraphNodeParams *)", "out in nodes_in edges_in count node_params",
     {"request": "graph:u64 type:i32 handle:u64 cond_type:i32 size:u32 context:u64 child:u64 ownership:u32 "
                 "deps:[Q] edges:[Q]", "reply": "node:u64 graphs:[Q]"}),
    # Graph host nodes: the function is guest code, so it travels as `words`, the guest's address of the two u32 words
    # in its page-locked pool that stand for one (function, data) pair; the node the host makes calls oriond's
    # trampoline with them, which hands each run to the guest (host_agent/session/host_nodes.py).
    ("cuGraphAddHostNode", "CUresult (CUgraphNode *, CUgraph, CUgraphNode const *, size_t, "
     "CUDA_HOST_NODE_PARAMS const *)", "out in nodes_in count host_node_params",
     {"request": "graph:u64 words:u64 deps:[Q]", "reply": "node:u64"}),
    ("cuGraphHostNodeGetParams", "CUresult (CUgraphNode, CUDA_HOST_NODE_PARAMS *)", "in host_node_params_out",
     {"request": "node:u64", "reply": "words:u64"}),
    ("cuGraphHostNodeSetParams", "CUresult (CUgraphNode, CUDA_HOST_NODE_PARAMS const *)", "in host_node_params",
     {"request": "node:u64 words:u64"}),
    ("cuGraphExecHostNodeSetParams", "CUresult (CUgraphExec, CUgraphNode, CUDA_HOST_NODE_PARAMS const *)",
     "in in host_node_params", {"request": "exec:u64 node:u64 words:u64"}),
    # Batch memory operations and batch memory-operation nodes (host_agent/session/batch_mem_ops.py): each
    # CUstreamBatchMemOpParams as BATCH_MEM_OP travels (its operation, its flags, the address and value of a wait or
    # write: a 32-bit one's value zero-extended), a node's CUDA_BATCH_MEM_OP_NODE_PARAMS as its context, flags and ops.
    ("cuStreamBatchMemOp", "CUresult (CUstream, unsigned int, CUstreamBatchMemOpParams *, unsigned int)",
     "in count batch_mem_ops in", {"request": f"stream:u64 flags:u32 ops:{BATCH_MEM_OP}", "posted": True}),
    ("cuGraphAddBatchMemOpNode", "CUresult (CUgraphNode *, CUgraph, CUgraphNode const *, size_t, "
     "CUDA_BATCH_MEM_OP_NODE_PARAMS const *)", "out in nodes_in count batch_mem_op_node_params",
     {"request": f"graph:u64 context:u64 flags:u32 ops:{BATCH_MEM_OP} deps:[Q]", "reply": "node:u64"}),
    ("cuGraphBatchMemOpNodeGetParams", "CUresult (CUgraphNode, CUDA_BATCH_MEM_OP_NODE_PARAMS *)",
     "in batch_mem_op_node_params_out",
     {"request": "node:u64", "reply": f"context:u64 flags:u32 ops:{BATCH_MEM_OP}"}),
    ("cuGraphBatchMemOpNodeSetParams", "CUresult (CUgraphNode, CUDA_BATCH_MEM_OP_NODE_PARAMS const *)",
     "in batch_mem_op_node_params", {"request": f"node:u64 context:u64 flags:u32 ops:{BATCH_MEM_OP}"}),
    ("cuGraphExecBatchMemOpNodeSetParams", "CUresult (CUgraphExec, CUgraphNode, "
     "CUDA_BATCH_MEM_OP_NODE_PARAMS const *)", "in in batch_mem_op_node_params",
     {"request": f"exec:u64 node:u64 context:u64 flags:u32 ops:{BATCH_MEM_OP}"}),
    # Module enumeration and names (host_agent/session/module_queries.py): the handles enumerated become the session's,
    # as cuModuleGetFunction's and cuLibraryGetKernel's do; a name travels as its bytes (the guest keeps a copy per
    # handle, which the pointer it hands out names).
    ("cuModuleEnumerateFunctions", "CUresult (CUfunction *, unsigned int, CUmodule)", "handles_out count in",
     {"request": "module:u64 count:u32", "reply": "functions:[Q]"}),
    ("cuLibraryEnumerateKernels", "CUresult (CUkernel *, unsigned int, CUlibrary)", "handles_out count in",
     {"request": "library:u64 count:u32", "reply": "kernels:[Q]"}),
    ("cuFuncGetName", "CUresult (char const **, CUfunction)", "name_out in",
     {"request": "function:u64", "reply": "name:tail"}),
    ("cuKernelGetName", "CUresult (char const **, CUkernel)", "name_out in",
     {"request": "kernel:u64", "reply": "name:tail"}),
    # Device queries with arrays or bytes: a device is the guest's ordinal; CUDA 13's atomic capabilities, one
    # capability word per operation asked.
    ("cuDeviceGetLuid", "CUresult (char *, unsigned int *, CUdevice)", "luid_out out in",
     {"request": "device:i32", "reply": "mask:u32 luid:tail"}),
    ("cuDeviceGetHostAtomicCapabilities", "CUresult (unsigned int *, CUatomicOperation const *, unsigned int, "
     "CUdevice)", "capabilities_out operations count in",
     {"request": "device:i32 operations:[i]", "reply": "capabilities:[I]"}),
    ("cuDeviceGetP2PAtomicCapabilities", "CUresult (unsigned int *, CUatomicOperation const *, unsigned int, "
     "CUdevice, CUdevice)", "capabilities_out operations count in in",
     {"request": "source:i32 destination:i32 operations:[i]", "reply": "capabilities:[I]"}),
    # Memory pools made by the program, CUDA 13's pools by location, and the virtual-memory queries: their structs
    # field by field, each device location as the guest's ordinal (host_agent/session/mem_pool_calls.py).
    ("cuMemPoolCreate", "CUresult (CUmemoryPool *, CUmemPoolProps const *)", "out pool_props",
     {"request": POOL_PROPS, "reply": "pool:u64"}),
    ("cuMemPoolSetAccess", "CUresult (CUmemoryPool, CUmemAccessDesc const *, size_t)", "in access_descs count",
     {"request": "pool:u64 descs:[iii]"}),
    ("cuMemPoolGetAccess", "CUresult (CUmemAccess_flags *, CUmemoryPool, CUmemLocation *)", "out in location",
     {"request": f"pool:u64 {MEM_LOCATION}", "reply": "flags:i32"}),
    ("cuMemGetDefaultMemPool", "CUresult (CUmemoryPool *, CUmemLocation *, CUmemAllocationType)", "out location in",
     {"request": f"{MEM_LOCATION} kind:i32", "reply": "pool:u64"}),
    ("cuMemGetMemPool", "CUresult (CUmemoryPool *, CUmemLocation *, CUmemAllocationType)", "out location in",
     {"request": f"{MEM_LOCATION} kind:i32", "reply": "pool:u64"}),
    ("cuMemSetMemPool", "CUresult (CUmemLocation *, CUmemAllocationType, CUmemoryPool)", "location in in",
     {"request": f"{MEM_LOCATION} kind:i32 pool:u64"}),
    ("cuMemGetAccess", "CUresult (unsigned PY_LONG_LONG *, CUmemLocation const *, CUdeviceptr)", "out location in",
     {"request": f"{MEM_LOCATION} pointer:u64", "reply": "flags:u64"}),
    ("cuMemRetainAllocationHandle", "CUresult (CUmemGenericAllocationHandle *, void *)", "out device_address",
     {"request": "address:u64", "reply": "handle:u64"}),
    ("cuMemGetAllocationPropertiesFromHandle", "CUresult (CUmemAllocationProp *, CUmemGenericAllocationHandle)",
     "allocation_prop_out in", {"request": "handle:u64", "reply": ALLOCATION_PROP}),
    # Stream attributes: a CUstreamAttrValue is CUlaunchAttributeValue's 64-byte union, travelling as its bytes, for
    # the attribute IDs of STREAM_ATTRIBUTES_PLAIN only (host_agent/session/stream_extras.py); cluster sizing takes the
    # launch configuration as cuOccupancyMaxActiveClusters does.
    ("cuStreamGetAttribute", "CUresult (CUstream, CUstreamAttrID, CUstreamAttrValue *)", "in in attr_value_out",
     {"request": "stream:u64 attribute:i32", "reply": "value:tail"}),
    ("cuStreamSetAttribute", "CUresult (CUstream, CUstreamAttrID, CUstreamAttrValue const *)", "in in attr_value_in",
     {"request": "stream:u64 attribute:i32 value:tail"}),
    ("cuOccupancyMaxPotentialClusterSize", "CUresult (int *, CUfunction, CUlaunchConfig const *)",
     "out in launch_config", {"request": f"{LAUNCH} attributes:{LAUNCH_ATTRIBUTE_KIND}", "reply": "cluster_size:i32"}),
    # CUDA graphs, their second part (host_agent/session/graph_queries.py, guest_runtime/native/graph_queries.c): node
    # parameters asked back, kernel node attributes, capture into a given graph, instantiation with parameters, memory
    # nodes and the graph memory attributes, the DOT description. A kernel node's parameters come back packed by the
    # function's layout (`offsets`: each parameter's; `given`: 0 where the node holds none) with the graph the node
    # lies in; a memset or memcpy node's as their own field strings; cuGraphNodeGetParams answers the other node
    # types' fields (and a memset or memcpy node's context). An attribute's value is CUlaunchAttributeValue's 64
    # bytes (LAUNCH_ATTRIBUTES_PLAIN IDs only). A memory allocation node's pool properties travel as POOL_PROPS (a
    # guest ordinal), its access descriptors as cuMemSetAccess's; cuGraphDebugDotPrint's text comes back, and the
    # guest writes its own file.
    ("cuGraphKernelNodeGetParams", "CUresult (CUgraphNode, CUDA_KERNEL_NODE_PARAMS *)", "in kernel_node_params_out",
     {"request": "node:u64", "reply": f"{KERNEL_NODE} graph:u64 given:u32 offsets:[I] params:tail"}),
    ("cuGraphMemsetNodeGetParams", "CUresult (CUgraphNode, CUDA_MEMSET_NODE_PARAMS *)", "in memset_params_out",
     {"request": "node:u64", "reply": MEMSET_NODE}),
    ("cuGraphMemcpyNodeGetParams", "CUresult (CUgraphNode, CUDA_MEMCPY3D *)", "in copy_params_out",
     {"request": "node:u64", "reply": MEMCPY_3D}),
    ("cuGraphNodeGetParams", "CUresult (CUgraphNode, CUgraphNodeParams *)", "in node_params_out",
     {"request": "node:u64", "reply": "type:i32 context:u64 child:u64 ownership:u32 event:u64 handle:u64 "
                                      "cond_type:i32 size:u32 dptr:u64 graphs:[Q]"}),
    ("cuGraphKernelNodeGetAttribute", "CUresult (CUgraphNode, CUkernelNodeAttrID, CUkernelNodeAttrValue *)",
     "in in attr_value_out", {"request": "node:u64 attribute:i32", "reply": "value:tail"}),
    ("cuGraphKernelNodeSetAttribute", "CUresult (CUgraphNode, CUkernelNodeAttrID, CUkernelNodeAttrValue const *)",
     "in in attr_value_in", {"request": "node:u64 attribute:i32 value:tail"}),
    ("cuStreamBeginCaptureToGraph", "CUresult (CUstream, CUgraph, CUgraphNode const *, CUgraphEdgeData const *, "
     "size_t, CUstreamCaptureMode)", "in in nodes_in edges_in count in",
     {"request": "stream:u64 graph:u64 mode:i32 deps:[Q] edges:[Q]"}),
    ("cuStreamUpdateCaptureDependencies", "CUresult (CUstream, CUgraphNode *, CUgraphEdgeData const *, size_t, "
     "unsigned int)", "in nodes_in edges_in count in", {"request": "stream:u64 flags:u32 deps:[Q] edges:[Q]"}),
    ("cuGraphInstantiateWithParams", "CUresult (CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *)",
     "out in instantiate_params", {"request": "graph:u64 flags:u64 upload_stream:u64",
                                   "reply": "exec:u64 result:i32 error_node:u64", "effects": "measures"}),
    ("cuGraphAddMemAllocNode", "CUresult (CUgraphNode *, CUgraph, CUgraphNode const *, size_t, "
     "CUDA_MEM_ALLOC_NODE_PARAMS *)", "out in nodes_in count alloc_node_params",
     {"request": f"graph:u64 {POOL_PROPS} bytesize:u64 deps:[Q] access:[iii]", "reply": "node:u64 dptr:u64"}),
    ("cuGraphAddMemFreeNode", "CUresult (CUgraphNode *, CUgraph, CUgraphNode const *, size_t, CUdeviceptr)",
     "out in nodes_in count in", {"request": "graph:u64 dptr:u64 deps:[Q]", "reply": "node:u64"}),
    ("cuGraphMemAllocNodeGetParams", "CUresult (CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS *)",
     "in alloc_node_params_out",
     {"request": "node:u64", "reply": f"{POOL_PROPS} bytesize:u64 dptr:u64 graph:u64 access:[iii]"}),
    ("cuDeviceGetGraphMemAttribute", "CUresult (CUdevice, CUgraphMem_attribute, void *)", "in in graph_mem_value_out",
     {"request": "device:i32 attribute:i32", "reply": "value:u64"}),
    ("cuDeviceSetGraphMemAttribute", "CUresult (CUdevice, CUgraphMem_attribute, void *)", "in in graph_mem_value_in",
     {"request": "device:i32 attribute:i32 value:u64"}),
    ("cuGraphDebugDotPrint", "CUresult (CUgraph, char const *, unsigned int)", "in guest_path in",
     {"request": "graph:u64 flags:u32", "reply": "text:tail"}),
    # Structured copies (host_agent/session/structured_copies.py, guest_runtime/native/structured_copies.c):
    # STRUCTURED_COPY (a peer copy's contexts before it, an async copy's stream first); a staged source's rows follow as
    # the tail, a staged destination's come back as the reply.
    ("cuMemcpy2D", "CUresult (CUDA_MEMCPY2D const *)", "copy_2d",
     {"request": f"{STRUCTURED_COPY} data:tail", "reply": "data:tail"}),
    ("cuMemcpy2DUnaligned", "CUresult (CUDA_MEMCPY2D const *)", "copy_2d",
     {"request": f"{STRUCTURED_COPY} data:tail", "reply": "data:tail"}),
    ("cuMemcpy2DAsync", "CUresult (CUDA_MEMCPY2D const *, CUstream)", "copy_2d in",
     {"request": f"stream:u64 {STRUCTURED_COPY} data:tail", "reply": "data:tail"}),
    ("cuMemcpy3D", "CUresult (CUDA_MEMCPY3D const *)", "copy_params",
     {"request": f"{STRUCTURED_COPY} data:tail", "reply": "data:tail"}),
    ("cuMemcpy3DAsync", "CUresult (CUDA_MEMCPY3D const *, CUstream)", "copy_params in",
     {"request": f"stream:u64 {STRUCTURED_COPY} data:tail", "reply": "data:tail"}),
    ("cuMemcpy3DPeer", "CUresult (CUDA_MEMCPY3D_PEER const *)", "copy_peer",
     {"request": f"src_context:u64 dst_context:u64 {STRUCTURED_COPY} data:tail", "reply": "data:tail"}),
    ("cuMemcpy3DPeerAsync", "CUresult (CUDA_MEMCPY3D_PEER const *, CUstream)", "copy_peer in",
     {"request": f"stream:u64 src_context:u64 dst_context:u64 {STRUCTURED_COPY} data:tail", "reply": "data:tail"}),
    # The JIT linker (host_agent/session/link_calls.py, guest_runtime/native/link_calls.c): a link state is the
    # session's handle. JIT options travel as cuModuleLoadDataEx's (log and wall-time ones stay in the guest: empty
    # logs); an input travels as its bytes with its name (cuLinkAddFile is the guest's file read and sent so).
    # cuLinkComplete's `capacity` is the guest's buffer: the cubin comes back if it fits, else only its size, and the
    # guest asks again with that capacity (the host answers from the cubin its driver holds, without linking twice).
    ("cuLinkCreate", "CUresult (unsigned int, CUjit_option *, void **, CUlinkState *)",
     "count options option_values out", {"request": f"options:{JIT_OPTIONS_KIND}", "reply": "state:u64"}),
    ("cuLinkAddData", "CUresult (CUlinkState, CUjitInputType, void *, size_t, char const *, unsigned int, "
     "CUjit_option *, void **)", "in in link_data count cstr count options option_values",
     {"request": f"state:u64 input_type:i32 options:{JIT_OPTIONS_KIND} name:bytes data:tail"}),
    ("cuLinkComplete", "CUresult (CUlinkState, void **, size_t *)", "in cubin_out size_out",
     {"request": "state:u64 capacity:u64", "reply": "size:u64 cubin:tail"}),
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


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig as cuda.h lays it out."""

    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint)]


LAUNCH_ATTRIBUTES_PLAIN = frozenset({0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 14, 16, 17, 18})
LAUNCH_ATTRIBUTES_EVENT = frozenset({7, 12})  # PROGRAMMATIC_EVENT, LAUNCH_COMPLETION_EVENT
# cuStreamGetAttribute/cuStreamSetAttribute (CUstreamAttrID is CUlaunchAttributeID): the plain-valued IDs travel, and
# the host's driver answers for each (cuda.h marks ACCESS_POLICY_WINDOW, SYNCHRONIZATION_POLICY, PRIORITY,
# MEM_SYNC_DOMAIN_MAP, MEM_SYNC_DOMAIN and NVLINK_UTIL_CENTRIC_SCHEDULING valid for streams; it refuses the others).
# An event ID, DEVICE_UPDATABLE_KERNEL_NODE or an ID newer than this table answers CUDA_ERROR_NOT_SUPPORTED.
STREAM_ATTRIBUTES_PLAIN = LAUNCH_ATTRIBUTES_PLAIN


def attribute_mask(ids: frozenset[int]) -> int:
    """Launch attribute IDs as a bit mask (IDs below 64): how the C sides (the native driver's generated header,
    the host's compiled hot path) test membership in the sets above."""
    return sum(1 << i for i in ids if 0 <= i < 64)

# Opcodes of the forwarding layer that are not driver calls, far above any table position.
POOL_MAP_OPCODE = CUDA_OPCODE_BASE + 0x0F00  # map this channel's pinned-pool slice (POOL_MAP_REQUEST below)
# A relaying oriond's own call to the GPU host: the mirror of a relayed session's pool there (POOL_MIRROR_REQUEST
# below; host_agent/session/pool_mirror.py). Refused on any session that is not relayed.
POOL_MIRROR_OPCODE = CUDA_OPCODE_BASE + 0x0F01
POOL_MIRROR_MAP, POOL_MIRROR_WRITE, POOL_MIRROR_READ, POOL_MIRROR_UNMAP = 0, 1, 2, 3
# The native driver's cuLaunchHostFunc on a relayed session (guest_runtime/native/host_functions.c): posted to the
# relaying oriond, which serves it itself (host_agent/relay/relayed_session.py) and never sends it on.
HOST_FUNCTION_OPCODE = CUDA_OPCODE_BASE + 0x0F02
# The native driver's cuLaunchHostFunc while a stream capture may be under way: the function as a host node runs it
# (HOST_NODE_FUNCTION_REQUEST below; host_agent/session/host_nodes.py), so that a capture records a host node.
HOST_NODE_FUNCTION_OPCODE = CUDA_OPCODE_BASE + 0x0F03
# The native driver's NVML asking the GPU host's NVML what only it knows of the session's GPUs (NVML_QUERY_REQUEST
# below; host_agent/session/nvml_queries.py): NVLink state, capability and remote PCI, P2P status.
NVML_QUERY_OPCODE = CUDA_OPCODE_BASE + 0x0F04
NVML_NVLINK_STATE, NVML_NVLINK_REMOTE_PCI, NVML_NVLINK_CAPABILITY, NVML_P2P_STATUS, NVML_FIELD_VALUE = 0, 1, 2, 3, 4
# The nvmlDeviceGetFieldValues fields NVML_FIELD_VALUE answers: what a link is, never a counter of its traffic or
# errors (nvml.h's NVML_FI_DEV_NVLINK_LINK_COUNT, _NVLINK_GET_SPEED, _GET_STATE, _GET_VERSION, _C2C_LINK_COUNT,
# _C2C_LINK_GET_STATUS, _C2C_LINK_GET_MAX_BW). NCCL reads an NVLink's state this way on sm_90 and later.
NVML_LINK_FIELDS = frozenset({91, 164, 165, 166, 170, 171, 172})
# The native driver's cuMemExportToShareableHandle and cuMemImportFromShareableHandle (guest_runtime/native/
# shareable_handles.c; host_agent/session/shared_handles.py): cuMem physical memory shared between the sessions of
# one region, as NCCL's P2P transport shares it between the processes of one guest. EXPORT answers a token (the
# exporting worker's pid and a 128-bit secret) for the session's handle; IMPORT of a token answers a handle of the
# importing session for the same memory, where both sessions are one region's.
SHARE_EXPORT_OPCODE = CUDA_OPCODE_BASE + 0x0F05
SHARE_IMPORT_OPCODE = CUDA_OPCODE_BASE + 0x0F06
# The native driver's legacy IPC (cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcCloseMemHandle, cuIpcGetEventHandle,
# cuIpcOpenEventHandle), between the sessions of one region as SHARE_* are: the guest's 64-byte handle holds a token,
# and the opening worker gets the driver's handle from the exporting one. `kind` IPC_MEMORY or IPC_EVENT.
IPC_EXPORT_OPCODE = CUDA_OPCODE_BASE + 0x0F07
IPC_OPEN_OPCODE = CUDA_OPCODE_BASE + 0x0F08
IPC_CLOSE_OPCODE = CUDA_OPCODE_BASE + 0x0F09
IPC_MEMORY, IPC_EVENT = 0, 1
# The native driver's event pool (guest_runtime/native/event_pool.c): up to EVENTS_CREATE_MAX events made at once
# with one cuEventCreate's flags, in the current context, which the guest then hands out one per cuEventCreate
# without a round trip (a round trip waits behind the posted work before it; PyTorch's ProcessGroupNCCL makes two
# events per collective).
EVENTS_CREATE_OPCODE = CUDA_OPCODE_BASE + 0x0F0A
EVENTS_CREATE_MAX = 32
# The calls that make a stream of the program's own (its first parameter): both guest clients keep the streams they
# made, so that a small copy to the device on one may be posted (native/known_streams.c, forward.py's _htod).
STREAM_CREATES = frozenset({"cuStreamCreate", "cuStreamCreateWithPriority"})
# Added to a copy call's opcode: its host buffer lies in the pinned pool and travels as its address, not its bytes.
PINNED_COPY = 0x2000
# Answered from the host worker's pool bookkeeping (host_agent/session/pinned_pool.py), not by the driver function.
PINNED_POOL_CALLS = frozenset({"cuMemAllocHost", "cuMemHostAlloc", "cuMemFreeHost", "cuMemHostGetDevicePointer",
                               "cuMemHostGetFlags"})
PINNED_COPIES = frozenset({"cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync"})
# Added to a module or library load's opcode: the image travels as its SHA-256 and size (IMAGE_BY_DIGEST_REQUEST below),
# for the agent to load from its per-host cache (host_agent/session/image_cache.py) instead of receiving megabytes of
# fatbin again. An agent that does not hold it answers the wire status IMAGE_NOT_CACHED, and the guest then sends the
# usual request with the whole image, which the agent hashes itself and keeps (docs/wire-protocol.md).
IMAGE_BY_DIGEST = 0x4000
IMAGE_LOADS = frozenset({"cuModuleLoadData", "cuModuleLoadDataEx", "cuLibraryLoadData"})
IMAGE_NOT_CACHED = -16  # a wire status (negative, as ivshmem.record.Status's) of IMAGE_BY_DIGEST requests only
# Images smaller than this always travel whole (a few ring slots: a digest round trip would cost more than it
# saves) and are never kept; both sides hold to it.
IMAGE_BY_DIGEST_MIN = 64 * 1024

# The calls forwarded by construction (api_classes.GENERATED), in cuda.h's order after the hand table: their
# signatures are the inventory's, their payloads derived from their roles.
_SPEC += [(name, _HEADER.entry_points[name], options.get("roles"),
           {key: value for key, value in options.items() if key != "roles"})
          for name, options in sorted(api_classes.GENERATED.items())]

CALLS: dict[str, DriverCall] = {}
BY_OPCODE: dict[int, DriverCall] = {}
for _i, (_name, _sig, *_rest) in enumerate(_SPEC):
    _roles = _rest[0] if _rest else None
    _call = _entry(CUDA_OPCODE_BASE + _i, _name, _sig, _roles, **(_rest[1] if len(_rest) > 1 else {}))
    CALLS[_name] = BY_OPCODE[_call.opcode] = _call

LAUNCH_HEAD = CALLS["cuLaunchKernel"].request.fixed  # function, grid xyz, block xyz, shared bytes, stream
POOL_MAP_REQUEST = Schema("POOL_MAP", ("guest_address", "u64"))
POOL_MAP_REPLY = Schema("POOL_MAP reply", ("host_address", "u64"), ("size", "u64"))
# MAP: a mirror of the guest's `size` bytes at `address` (a page-locked allocation), answered with where it lies on
# the GPU host (POOL_MIRROR_REPLY: `address` itself where it could be mapped there); then, by that address, WRITE:
# `data` there; READ: `size` bytes from there, answered as the reply's payload; UNMAP: the mirror there is dropped.
POOL_MIRROR_REQUEST = Schema("POOL_MIRROR", ("op", "u32"), ("address", "u64"), ("size", "u64"), ("data", "tail"))
POOL_MIRROR_REPLY = Schema("POOL_MIRROR reply", ("address", "u64"))
# HOST_FUNCTION: when `stream`'s earlier work is done, the u32 at `reached` (page-locked) becomes `seq`; nothing
# later of the session runs until the u32 at `release` reaches `seq`.
HOST_FUNCTION_REQUEST = Schema("HOST_FUNCTION", ("stream", "u64"), ("reached", "u64"), ("release", "u64"),
                               ("seq", "u32"), ("reserved", "u32"))
# HOST_NODE_FUNCTION: cuLaunchHostFunc(stream, oriond's trampoline, the host's address of the guest's `words`).
HOST_NODE_FUNCTION_REQUEST = Schema("HOST_NODE_FUNCTION", ("stream", "u64"), ("words", "u64"))
# NVML_QUERY: `query` (NVML_NVLINK_STATE, _REMOTE_PCI: `link`; NVML_NVLINK_CAPABILITY: `link`, `which` the
# capability; NVML_P2P_STATUS: `link` the peer's guest ordinal, `which` the P2P index; NVML_FIELD_VALUE: `which` the
# field ID, one of NVML_LINK_FIELDS, `link` its scope ID) about guest device `device`. The reply carries NVML's own
# return code (`result`; a field's own), the answer (`value`; a field's 8 bytes, of NVML's `value_type`; a remote
# end's PCI fields), and as its tail always NVML_QUERY_BUS_IDS bytes: for NVML_NVLINK_REMOTE_PCI the bus ID (32
# bytes) and its legacy form (16), each NUL-terminated within its field, else zeros.
NVML_QUERY_BUS_IDS = 48
NVML_QUERY_REQUEST = Schema("NVML_QUERY", ("query", "u32"), ("device", "i32"), ("link", "u32"), ("which", "u32"))
NVML_QUERY_REPLY = Schema("NVML_QUERY reply", ("result", "i32"), ("value_type", "i32"), ("value", "u64"),
                          ("domain", "u32"), ("bus", "u32"), ("pci_device", "u32"), ("pci_device_id", "u32"),
                          ("pci_sub_system_id", "u32"), ("bus_ids", "tail"))
# SHARE_EXPORT: `handle` (the session's CUmemGenericAllocationHandle) exported as `handle_type` with `flags`;
# SHARE_IMPORT: the token (`pid`, `secret_a`, `secret_b`) imported as `handle_type`. Both reply with the token and
# the handle (an export's own handle; an import's new one).
SHARE_EXPORT_REQUEST = Schema("SHARE_EXPORT", ("handle", "u64"), ("flags", "u64"), ("handle_type", "i32"))
SHARE_IMPORT_REQUEST = Schema("SHARE_IMPORT", ("secret_a", "u64"), ("secret_b", "u64"), ("pid", "u32"),
                              ("handle_type", "i32"))
SHARE_REPLY = Schema("SHARE reply", ("handle", "u64"), ("secret_a", "u64"), ("secret_b", "u64"), ("pid", "u32"))
# IPC_EXPORT: `value` (a device pointer of the session's, or its CUevent) of `kind`; IPC_OPEN: the token as `kind`,
# with cuIpcOpenMemHandle's `flags`; both reply SHARE_REPLY (`handle`: the value exported, or the one opened).
# IPC_CLOSE: the device pointer an IPC_OPEN gave (no reply payload).
IPC_EXPORT_REQUEST = Schema("IPC_EXPORT", ("value", "u64"), ("kind", "u32"))
IPC_OPEN_REQUEST = Schema("IPC_OPEN", ("secret_a", "u64"), ("secret_b", "u64"), ("pid", "u32"), ("kind", "u32"),
                          ("flags", "u32"))
IPC_CLOSE_REQUEST = Schema("IPC_CLOSE", ("pointer", "u64"))
# EVENTS_CREATE: `count` (1..EVENTS_CREATE_MAX) cuEventCreate(`flags`) in a row, stopping at the first failure; the
# reply's tail is the events made (8 bytes each, at least one), or, when none could be, the failure's status.
EVENTS_CREATE_REQUEST = Schema("EVENTS_CREATE", ("flags", "u32"), ("count", "u32"))
EVENTS_CREATE_REPLY = Schema("EVENTS_CREATE reply", ("events", "tail"))
# The request of a load's IMAGE_BY_DIGEST variant: the image's size and SHA-256 (32 bytes), then the load's own
# request with an empty image (its JIT options, if any): the usual request is `request` + the image's bytes.
IMAGE_BY_DIGEST_REQUEST = Schema("IMAGE_BY_DIGEST", ("size", "u64"), ("digest", "bytes"), ("request", "tail"))


def describe() -> dict[str, Any]:
    """The whole contract as data: every call, and the forwarding layer's own opcodes."""
    return {
        "opcode_base": CUDA_OPCODE_BASE, "pinned_copy": PINNED_COPY,
        "pool_map": {"opcode": POOL_MAP_OPCODE, "request": POOL_MAP_REQUEST.describe(),
                     "reply": POOL_MAP_REPLY.describe()},
        "pool_mirror": {"opcode": POOL_MIRROR_OPCODE, "request": POOL_MIRROR_REQUEST.describe(),
                        "reply": POOL_MIRROR_REPLY.describe(),
                        "ops": {"map": POOL_MIRROR_MAP, "write": POOL_MIRROR_WRITE, "read": POOL_MIRROR_READ,
                                "unmap": POOL_MIRROR_UNMAP}},
        "host_function": {"opcode": HOST_FUNCTION_OPCODE, "request": HOST_FUNCTION_REQUEST.describe()},
        "host_node_function": {"opcode": HOST_NODE_FUNCTION_OPCODE, "request": HOST_NODE_FUNCTION_REQUEST.describe()},
        "nvml_query": {"opcode": NVML_QUERY_OPCODE, "request": NVML_QUERY_REQUEST.describe(),
                       "reply": NVML_QUERY_REPLY.describe(),
                       "queries": {"nvlink_state": NVML_NVLINK_STATE, "nvlink_remote_pci": NVML_NVLINK_REMOTE_PCI,
                                   "nvlink_capability": NVML_NVLINK_CAPABILITY, "p2p_status": NVML_P2P_STATUS,
                                   "field_value": NVML_FIELD_VALUE}},
        "share_export": {"opcode": SHARE_EXPORT_OPCODE, "request": SHARE_EXPORT_REQUEST.describe(),
                         "reply": SHARE_REPLY.describe()},
        "share_import": {"opcode": SHARE_IMPORT_OPCODE, "request": SHARE_IMPORT_REQUEST.describe(),
                         "reply": SHARE_REPLY.describe()},
        "ipc_export": {"opcode": IPC_EXPORT_OPCODE, "request": IPC_EXPORT_REQUEST.describe(),
                       "reply": SHARE_REPLY.describe(), "kinds": {"memory": IPC_MEMORY, "event": IPC_EVENT}},
        "ipc_open": {"opcode": IPC_OPEN_OPCODE, "request": IPC_OPEN_REQUEST.describe(),
                     "reply": SHARE_REPLY.describe()},
        "ipc_close": {"opcode": IPC_CLOSE_OPCODE, "request": IPC_CLOSE_REQUEST.describe()},
        "events_create": {"opcode": EVENTS_CREATE_OPCODE, "request": EVENTS_CREATE_REQUEST.describe(),
                          "reply": EVENTS_CREATE_REPLY.describe(), "max": EVENTS_CREATE_MAX},
        "image_by_digest": {"added": IMAGE_BY_DIGEST, "calls": sorted(IMAGE_LOADS), "not_cached": IMAGE_NOT_CACHED,
                            "min_size": IMAGE_BY_DIGEST_MIN, "request": IMAGE_BY_DIGEST_REQUEST.describe()},
        "stats_reply": STATS_REPLY.describe(),  # ORION_STATS' table: a guest reading another layout is refused
        "effects": EFFECTS, "calls": [call.describe() for call in CALLS.values()],
    }


@functools.cache
def table_digest() -> str:
    """A digest of the whole contract (compared at HELLO); computed when first asked, not at import."""
    return hashlib.sha256(json.dumps(describe(), sort_keys=True).encode()).hexdigest()[:16]

FORWARDED, GENERATED, ANSWERED, UNSUPPORTED, UNCLASSIFIED = (
    "forwarded", "forwarded by construction", "answered in the guest", "unsupported", "unclassified")


def classification() -> dict[str, tuple[str, str]]:
    """Every entry point of the inventory (ivshmem/cuda_h.txt) -> (its class, a detail): the hand table's calls
    (FORWARDED, or ANSWERED for those the guest turns into others), api_classes.GENERATED's (GENERATED),
    api_classes.GUEST's (ANSWERED, the C file) and api_classes.UNSUPPORTED's (the reason). UNCLASSIFIED marks a
    gap, which tests/unit/test_api_classes.py refuses."""
    classes = {}
    for name in _HEADER.entry_points:
        call = CALLS.get(name)
        if call is not None:
            if call.answered_in_guest:
                classes[name] = (ANSWERED, "from the table's other calls")
            else:
                classes[name] = (GENERATED if name in api_classes.GENERATED else FORWARDED,
                                 "generic" if call.generic else "hand-written")
        elif name in api_classes.GUEST:
            classes[name] = (ANSWERED, api_classes.GUEST[name])
        else:
            reason = api_classes.unsupported_reason(name)
            classes[name] = (UNSUPPORTED, reason) if reason else (UNCLASSIFIED, "")
    return classes


F = TypeVar("F", bound=Callable[..., Any])


class Handlers:
    """One side's explicit registry of the calls it writes out by hand: call name -> the function serving it.

    Registration checks the name against the table at import, so a handler can never serve a call that does
    not exist, and a call can never be served twice; tests/unit/test_driver_api.py checks that every call the
    table cannot marshal by itself has its handler on each side that sees it."""

    def __init__(self, side: str) -> None:
        self.side = side
        self.by_name: dict[str, Callable[..., Any]] = {}

    def serves(self, *names: str) -> Callable[[F], F]:
        def register(function: F) -> F:
            for name in names:
                if name not in CALLS:
                    raise KeyError(f"{self.side}: {function.__name__} serves {name}, which is not in the call table")
                if name in self.by_name:
                    raise ValueError(f"{self.side}: {name} is served by both {self.by_name[name].__name__} and "
                                     f"{function.__name__}")
                self.by_name[name] = function
            return function
        return register


def _fields_text(schema: Schema | None) -> str:
    if schema is None:
        return ""
    return ", ".join(f"`{kind} {name}`" for name, kind in schema.fields) or "—"


def markdown() -> str:
    """docs/api-table.md but its last section (where each hand-written call's C lives, which
    guest_runtime/native/gen_libcuda.py adds: `api_table_page`): the table as a page, generated so that it cannot
    drift from the code."""
    lines = [
        "# Forwarded CUDA driver calls",
        "",
        "Generated from `ivshmem/driver_api.py` (and, for its last section, the native driver's C files) by",
        "`python -m guest_runtime.native.gen_libcuda --api-table > docs/api-table.md`; tests/unit/test_driver_api.py",
        "fails when this page is stale. Do not edit it by hand.",
        "",
        f"Table digest `{table_digest()}` (compared at HELLO: docs/wire-protocol.md). {len(CALLS)} calls, "
        f"{sum(c.generic for c in CALLS.values())} of them generic (marshalled from the table alone), "
        f"{sum(c.answered_in_guest for c in CALLS.values())} answered in the guest. Where every other entry "
        "point of cuda.h stands, and why each unsupported one is, follows the table.",
        "",
        "Payload fields are in the order they travel within their kind: scalars packed first (little-endian, "
        "no padding), then variable fields in order (`bytes`/`str`: u32 length and bytes; `[fmt]`: u32 count and "
        "packed items; `tail`: the rest of the payload). A generic call's request is its `in` parameters "
        "(`argN` is the N-th C parameter) and its reply its `out` parameters. A failed call's reply carries its "
        "CUresult as the record status and no payload. A copy with a pinned variant also travels as opcode "
        f"+ {PINNED_COPY:#x} when its host buffer lies in the region's page-locked pool.",
        "",
        "| opcode | call | C signature | request | reply | posted | effects |",
        "|---|---|---|---|---|---|---|",
    ]
    for call in CALLS.values():
        if call.answered_in_guest:
            request, reply = "answered in the guest", ""
        else:
            request, reply = _fields_text(call.request), _fields_text(call.reply)
            if call.pinned is not None:
                request += f"; pinned: {_fields_text(call.pinned)}"
        lines.append(f"| {call.opcode:#x} | `{call.name}` | `{call.signature}` | {request} | {reply} | "
                     f"{'yes' if call.posted else ''} | {', '.join(sorted(call.effects))} |")
    lines += ["", f"Forwarding-layer opcode: POOL_MAP `{POOL_MAP_OPCODE:#x}`, request "
              f"{_fields_text(POOL_MAP_REQUEST)}, reply {_fields_text(POOL_MAP_REPLY)}.", "",
              f"Relay opcode: POOL_MIRROR `{POOL_MIRROR_OPCODE:#x}`, request {_fields_text(POOL_MIRROR_REQUEST)} "
              f"(op {POOL_MIRROR_MAP} map, answered {_fields_text(POOL_MIRROR_REPLY)}; {POOL_MIRROR_WRITE} write, "
              f"{POOL_MIRROR_READ} read, answered with the bytes; {POOL_MIRROR_UNMAP} unmap), relayed sessions only.",
              "",
              f"Relay opcode: HOST_FUNCTION `{HOST_FUNCTION_OPCODE:#x}`, request "
              f"{_fields_text(HOST_FUNCTION_REQUEST)}, posted by the native driver to a relaying oriond, which serves "
              "it (never sent on).", "",
              f"Forwarding-layer opcode: HOST_NODE_FUNCTION `{HOST_NODE_FUNCTION_OPCODE:#x}`, request "
              f"{_fields_text(HOST_NODE_FUNCTION_REQUEST)}: a host function on `stream` as a host node runs it, "
              "sent by the native driver while a stream capture may be under way (local sessions).", "",
              f"Forwarding-layer opcode: NVML_QUERY `{NVML_QUERY_OPCODE:#x}`, request "
              f"{_fields_text(NVML_QUERY_REQUEST)} (query {NVML_NVLINK_STATE} NVLink state, "
              f"{NVML_NVLINK_REMOTE_PCI} NVLink remote PCI, {NVML_NVLINK_CAPABILITY} NVLink capability, "
              f"{NVML_P2P_STATUS} P2P status, {NVML_FIELD_VALUE} a link field's value), reply "
              f"{_fields_text(NVML_QUERY_REPLY)}: the GPU host's NVML about the session's own GPUs.", "",
              f"Forwarding-layer opcodes: SHARE_EXPORT `{SHARE_EXPORT_OPCODE:#x}`, request "
              f"{_fields_text(SHARE_EXPORT_REQUEST)}, and SHARE_IMPORT `{SHARE_IMPORT_OPCODE:#x}`, request "
              f"{_fields_text(SHARE_IMPORT_REQUEST)}, both replying {_fields_text(SHARE_REPLY)}: cuMem physical "
              "memory shared between sessions of one region (local sessions).", "",
              f"Forwarding-layer opcodes: IPC_EXPORT `{IPC_EXPORT_OPCODE:#x}`, request "
              f"{_fields_text(IPC_EXPORT_REQUEST)}, and IPC_OPEN `{IPC_OPEN_OPCODE:#x}`, request "
              f"{_fields_text(IPC_OPEN_REQUEST)}, both replying {_fields_text(SHARE_REPLY)}; IPC_CLOSE "
              f"`{IPC_CLOSE_OPCODE:#x}`, request {_fields_text(IPC_CLOSE_REQUEST)}: legacy IPC of memory (kind "
              f"{IPC_MEMORY}) and events (kind {IPC_EVENT}) between sessions of one region (local sessions).", "",
              f"Forwarding-layer opcode: EVENTS_CREATE `{EVENTS_CREATE_OPCODE:#x}`, request "
              f"{_fields_text(EVENTS_CREATE_REQUEST)} (`count` 1 to {EVENTS_CREATE_MAX}), reply "
              f"{_fields_text(EVENTS_CREATE_REPLY)}: `count` cuEventCreate(`flags`) in the current context, stopping "
              "at the first failure; the events made, 8 bytes each, or the failure's status when none was.", "",
              f"Image by digest: {', '.join(f'`{name}`' for name in sorted(IMAGE_LOADS))} also travel as opcode "
              f"+ {IMAGE_BY_DIGEST:#x}, request {_fields_text(IMAGE_BY_DIGEST_REQUEST)} (`digest` the image's "
              "SHA-256, `request` the call's own request without the image), for images of at least "
              f"{IMAGE_BY_DIGEST_MIN} bytes; the reply is the call's, or wire status {IMAGE_NOT_CACHED} (image not "
              "cached: send the usual request).", "",
              "Effects: " + "; ".join(f"`{word}`: {meaning}" for word, meaning in EFFECTS.items()) + ".", ""]
    return "\n".join(lines + _coverage())


def _coverage() -> list[str]:
    """The page's second half: every entry point cuda.h declares, by class, and each unsupported one's reason."""
    classes = classification()
    counts = {kind: sum(1 for k, _ in classes.values() if k == kind)
              for kind in (FORWARDED, GENERATED, ANSWERED, UNSUPPORTED, UNCLASSIFIED)}
    lines = ["## Every entry point of cuda.h", "",
             f"The inventory (`ivshmem/cuda_h.txt`, from cuda.h and the cuda-bindings wheel) holds {len(classes)} "
             "entry points (API names; cuda.h's versioned and per-thread-stream names are aliases of them). "
             f"{counts[FORWARDED]} are forwarded by the table above as written there, {counts[GENERATED]} forwarded "
             "by construction (`ivshmem/api_classes.py` GENERATED: the table's generic entries from 0x"
             f"{CUDA_OPCODE_BASE + len(CALLS) - len(api_classes.GENERATED):x} on), {counts[ANSWERED]} answered in "
             f"the guest, {counts[UNSUPPORTED]} unsupported (CUDA_ERROR_NOT_SUPPORTED, named once in the guest's "
             f"log), for the reasons below" + (f"; {counts[UNCLASSIFIED]} unclassified." if counts[UNCLASSIFIED]
                                                else "."), "",
             "Answered in the guest outside the table (guest_runtime/native/): " + ", ".join(
                 f"`{name}` ({where})" for name, (kind, where) in classes.items()
                 if kind == ANSWERED and name not in CALLS) + ".", "",
             "| reason | entry points |", "|---|---|"]
    by_reason: dict[str, list[str]] = {}
    for name, (kind, reason) in classes.items():
        if kind == UNSUPPORTED:
            by_reason.setdefault(reason, []).append(name)
    for reason, names in by_reason.items():
        lines.append(f"| {reason} | {', '.join(f'`{n}`' for n in names)} |")
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["json"]:
        print(json.dumps(describe(), indent=1))
    elif args == ["markdown"]:
        print(markdown(), end="")
    else:
        print("usage: python -m ivshmem.driver_api json|markdown", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
