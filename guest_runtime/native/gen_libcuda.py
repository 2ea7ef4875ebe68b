"""Generate the entry points of the native guest driver (`libcuda.so.1`) from the one call table.

    python -m guest_runtime.native.gen_libcuda OUT.c            the entry points
    python -m guest_runtime.native.gen_libcuda --check OUT.c    a file that compiles only if cuda.h agrees
    python -m guest_runtime.native.gen_libcuda --api-table      docs/api-table.md, on stdout
    python -m guest_runtime.native.gen_libcuda --symbols        refresh driver_symbols.txt and nvml_symbols.txt
    python -m guest_runtime.native.gen_libcuda --aliases CUDA_H refresh driver_aliases.txt from cuda.h
    python -m guest_runtime.native.gen_libcuda --inventory CUDA_H  refresh ivshmem/cuda_h.txt (cuda_header.py)

The table (ivshmem/driver_api.py, as `describe()` gives it) stays the definition of every forwarded call: this
writes orion_calls.h (cuda.h's types, every call's opcode and prototype), orion_layouts.h (where every field of
every payload lies, from the table's Schemas: `ORION_REQ_<call>_<field>`, `ORION_REP_...`, their `_SIZE`, and the
structs requests embed; the hand-written C and the generated calls take every offset and size from it) and, for
each generic call, the whole C entry point (NULL checks of its outputs, the request packed in schema
order, one record through cuda_client.c's `orion_forward`, the reply unpacked into the outputs; a posted call
sent without waiting), and for every other call of the table a weak stub that answers
CUDA_ERROR_NOT_SUPPORTED and names itself once, which the hand-written C definition replaces (docs/native-driver.md).
It also writes `cuGetProcAddress`'s name table and the table digest HELLO sends, and docs/api-table.md's index of
which C file holds each hand-written call (`--api-table`, from the definitions in this directory's C files).
Standard library and ivshmem only.
"""
from __future__ import annotations

import re
import struct
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

from ivshmem import channel, cuda_header, layout, liveness, record
from ivshmem.api_classes import GUEST
from ivshmem.codec import LENGTH, Schema, members
from ivshmem.driver_api import (
    ALLOCATION_PROP,
    CALLS,
    ENUMS,
    EVENTS_CREATE_MAX,
    EVENTS_CREATE_REPLY,
    EVENTS_CREATE_REQUEST,
    HOST_FUNCTION_REQUEST,
    HOST_NODE_FUNCTION_REQUEST,
    IMAGE_BY_DIGEST_REQUEST,
    IPC_CLOSE_REQUEST,
    IPC_EXPORT_REQUEST,
    IPC_OPEN_REQUEST,
    KERNEL_NODE,
    LAUNCH,
    LAUNCH_ATTRIBUTE_KIND,
    LAUNCH_ATTRIBUTES_EVENT,
    LAUNCH_ATTRIBUTES_PLAIN,
    MEMCPY_3D,
    MEMSET_NODE,
    NVML_LINK_FIELDS,
    NVML_QUERY_BUS_IDS,
    NVML_QUERY_REPLY,
    NVML_QUERY_REQUEST,
    POINTER_ATTRIBUTE_WIDTHS,
    POINTER_HANDLES,
    POOL_MAP_REPLY,
    POOL_MAP_REQUEST,
    POOL_MIRROR_REPLY,
    POOL_MIRROR_REQUEST,
    SCALARS,
    SHARE_EXPORT_REQUEST,
    SHARE_IMPORT_REQUEST,
    SHARE_REPLY,
    STREAM_ATTRIBUTES_PLAIN,
    STREAM_CREATES,
    attribute_mask,
    describe,
    markdown,
    split_signature,
    table_digest,
)

# The C type each table parameter type is declared as (cuda.h's own types, in ABI terms), and the wire codes'
# C types. Handles are opaque pointers; enums are ints.
PREAMBLE = """\
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef int CUdevice_attribute, CUpointer_attribute, CUmemPool_attribute, CUfunction_attribute, CUfunc_cache,
    CUstreamCaptureStatus, CUjit_option, CUlibraryOption, CUdriverProcAddressQueryResult;
typedef struct CUuuid_st CUuuid;
typedef struct CUctxCreateParams_st CUctxCreateParams;
typedef struct CUlaunchConfig_st CUlaunchConfig;
typedef size_t (*CUoccupancyB2DSize)(int);
typedef unsigned int cuuint32_t;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef int CUlimit, CUmemAllocationGranularity_flags, CUtensorMapDataType, CUtensorMapInterleave,
    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill;
typedef int CUtensorMapAllocClass; /* the wheel's enum, newer than the inventory's cuda.h (13.0) */
typedef struct CUmemLocation_st { int type; int id; } CUmemLocation;
typedef struct CUmemAllocationProp_st {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct CUmemAccessDesc_st { CUmemLocation location; int flags; } CUmemAccessDesc;
typedef struct CUtensorMap_st { _Alignas(64) cuuint64_t opaque[16]; } CUtensorMap;
typedef void (*CUhostFn)(void *userData);
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphEdgeData_st CUgraphEdgeData;
"""
HANDLES = POINTER_HANDLES
WIRE_C = {"i32": "int32_t", "u32": "uint32_t", "u64": "uint64_t", "u8": "uint8_t", "u16": "uint16_t",
          "f32": "float"}
# Written in cuda_client.c, under their ABI symbol: the name table maps the API name to it.
IN_CLIENT = {"cuGetProcAddress": "cuGetProcAddress_v2"}
# The guest hook a generated destroy of these handles calls (graph_calls.c).
GRAPH_DESTROYED = {"CUgraphNode": "orion_graph_node_destroyed", "CUgraph": "orion_graph_destroyed"}
# The guest hook told of these calls' status, failed or not (function_answers.c: kept occupancy answers depend on
# them).
STATUS_HOOKS = {name: "orion_occupancy_changed" for name in ("cuCtxSetCacheConfig", "cuCtxSetSharedMemConfig",
                                                             "cuCtxSetLimit")}
C_WORDS = frozenset({"void", "char", "int", "long", "short", "unsigned", "float", "double", "size_t"})


def c_type(ctype: str) -> str:
    """The table's spelling of a C type as C: `unsigned PY_LONG_LONG` is Cython's `unsigned long long`."""
    return ctype.replace("unsigned PY_LONG_LONG", "unsigned long long").replace("char const", "const char")


def _prototype(call: dict[str, Any]) -> tuple[str, list[str]]:
    _restype, params = split_signature(call["signature"])
    names = [f"arg{i}" for i in range(len(params))]
    args = ", ".join(f"{c_type(t)} {n}" for t, n in zip(params, names, strict=True)) or "void"
    return f"CUresult {call['name']}({args})", names


def _effect_hooks(call: dict[str, Any], names: list[str]) -> list[str]:
    """The statements a generic call's table effects run after success (hooks of orion_guest.h and
    param_layouts.h): the device ranges unified addressing reads (allocates, reserves: the first output and the
    first input's size; frees, unreserves: the first input), forgotten parameter layouts (unloads: the handles
    may name other functions later), cuInit's success, as forward.py's `_generic` keeps them, a destroyed
    graph's or node's conditional bodies (graph_calls.c), and streams made and destroyed (known_handles.c)."""
    after: list[str] = []
    effects = call["effects"]
    if "initializes" in effects:
        after.append("    orion_initialized();")
        after.append("    orion_stats_initialized();")  # call_stats.c: the agent's account begins (ORION_STATS)
    if "allocates" in effects:
        after.append(f"    orion_range_add((uint64_t)*{names[0]}, (uint64_t){names[1]});")
    if "reserves" in effects:  # device memory once mapped: listed, but not as allocated (device_ranges.c)
        after.append(f"    orion_range_reserve((uint64_t)*{names[0]}, (uint64_t){names[1]});")
    if "allocates_pitched" in effects:  # cuMemAllocPitch: pitch x rows (its first two outputs, its second input)
        outs = [i for i, p in enumerate(call["params"]) if p["role"] == "out"]
        rows = [i for i, p in enumerate(call["params"]) if p["role"] == "in"][1]
        after.append(f"    orion_range_add((uint64_t)*{names[outs[0]]}, (uint64_t)*{names[outs[1]]} * "
                     f"(uint64_t){names[rows]});")
    if "unloads" in effects:
        after.append("    orion_param_layouts_forget();")
        after.append("    orion_function_answers_forget();")
    if "frees" in effects or "unreserves" in effects:
        after.append(f"    orion_range_remove((uint64_t){names[0]});")
    destroyed = GRAPH_DESTROYED.get(call["params"][0]["ctype"]) if "destroys" in effects else None
    if destroyed:  # graph_calls.c keeps conditional nodes' body arrays until their node or graph goes
        after.append(f"    {destroyed}({names[0]});")
    if call["name"] in STREAM_CREATES:  # known_handles.c: a copy on a stream of the process's own may be posted
        after.append(f"    orion_known_made(ORION_KNOWN_STREAMS, (uint64_t)(uintptr_t)*{names[0]});")
    if "destroys" in effects and call["params"][0]["ctype"] == "CUstream":
        after.append(f"    (void)orion_known_destroyed(ORION_KNOWN_STREAMS, (uint64_t)(uintptr_t){names[0]});")
    return after


def _generic(call: dict[str, Any]) -> str:
    """A generic call: `in` parameters packed in order, `out` parameters filled from the reply. Weak, so that a
    hand-written C definition of the same name replaces it (a call whose guest state needs more than its
    effects, such as cuCtxSetCurrent and cuCtxDestroy: context_calls.c)."""
    proto, names = _prototype(call)
    params = call["params"]
    after = _effect_hooks(call, names)
    lines = [f"__attribute__((weak)) {proto} {{", f'    ORION_ENTRY("{call["name"]}");']
    optional = set(call["optional_outputs"])  # cuda.h: "may be NULL" (cuMemGetAddressRange's pbase and psize)
    outs = [(i, p) for i, p in enumerate(params) if p["role"] in ("out", "inout")]
    for i, _p in outs:
        if i not in optional:
            lines.append(f"    if (!{names[i]}) return CUDA_ERROR_INVALID_VALUE;")
    # offsets and sizes from orion_layouts.h (generate_layouts), as the hand-written C takes them
    req_layout, rep_layout = f"ORION_REQ_{call['name']}", f"ORION_REP_{call['name']}"
    req_size = f"{req_layout}_SIZE" if call["request"] else "0"
    rep_size = f"{rep_layout}_SIZE" if call["reply"] else "0"
    if call["request"]:
        lines.append(f"    uint8_t req[{req_size}];")
    for field in call["request"]:
        index = int(field["name"][3:])
        ctype, kind = params[index]["ctype"], field["kind"]
        source = names[index]
        if params[index]["role"] == "inout":  # read through the pointer: its value goes, the reply's comes back
            ctype, source = ctype[:-1].strip(), f"*{names[index]}"
        value = f"(uint64_t)(uintptr_t){source}" if ctype in HANDLES else f"({WIRE_C[kind]}){source}"
        lines.append(f"    orion_put_{kind}(req + {req_layout}_{field['name']}, {value});")
    flags = "ORION_CALL_INIT" if "initializes" in call["effects"] else "0"
    req = "req" if call["request"] else "NULL"
    if call["posted"]:
        lines.append(f"    return orion_thread_post(ORION_OP_{call['name']}, {req}, {req_size});")
        lines.append("}")
        return "\n".join(lines)
    if call["reply"]:
        lines.append(f"    uint8_t rep[{rep_size}];")
    rep = "rep" if call["reply"] else "NULL"
    lines.append(f"    CUresult status = orion_thread_forward(ORION_OP_{call['name']}, {req}, {req_size}, {rep}, "
                 f"{rep_size}, {flags});")
    if call["name"] in STATUS_HOOKS:
        lines.append(f"    {STATUS_HOOKS[call['name']]}(status);")
    lines.append("    if (status != CUDA_SUCCESS) return status;")
    for field in call["reply"]:
        index = int(field["name"][3:])
        base = c_type(params[index]["ctype"][:-1].strip())
        kind = field["kind"]
        got = f"orion_get_{kind}(rep + {rep_layout}_{field['name']})"
        value = f"({base})(uintptr_t){got}" if base in HANDLES else f"({base}){got}"
        guard = f"if ({names[index]}) " if index in optional else ""
        lines.append(f"    {guard}*{names[index]} = {value};")
    lines += after
    lines.append("    return CUDA_SUCCESS;")
    lines.append("}")
    return "\n".join(lines)


def _not_yet(call: dict[str, Any]) -> str:
    """A weak stub answering 801 (named once): a hand-written C definition of the same name replaces it at link
    time, so hand-written calls land one by one and the generated table still names every call."""
    proto, names = _prototype(call)
    unused = "".join(f" (void){n};" for n in names)
    return (f"__attribute__((weak)) {proto} {{\n    ORION_ENTRY(\"{call['name']}\");{unused}\n"
            f"    return orion_not_forwarded(\"{call['name']}\");\n}}")


def generate() -> str:
    table = describe()
    calls = table["calls"]
    parts = [
        "/* Generated by guest_runtime/native/gen_libcuda.py from ivshmem/driver_api.py: do not edit. */",
        '#include "orion_guest.h"',
        '#include "param_layouts.h"',
        "",
        f'const char orion_table_digest[] = "{table_digest()}";',
        "",
    ]
    for call in calls:
        if call["name"] in IN_CLIENT:
            continue
        if call["answered_in_guest"] or not call["generic"]:
            parts.append(_not_yet(call))
        else:
            parts.append(_generic(call))
        parts.append("")
    widths = POINTER_ATTRIBUTE_WIDTHS
    parts.append(f"const unsigned orion_pointer_attributes = {max(widths) + 1};")
    parts.append("const unsigned char orion_pointer_attribute_width[] = {"
                 + ", ".join(str(widths.get(a, 0)) for a in range(max(widths) + 1)) + "};")
    aliased = {alias for alias, _name in abi_aliases()}
    table_names = {call["name"] for call in calls}
    others = [name for name in driver_symbols() if name not in table_names and name not in aliased]
    parts += [_outside_table(name) for name in others]
    parts += [_nvml_stub(name) for name in nvml_names() if name not in NVML_NOT_STUBBED]
    parts.append("")
    parts.append("const struct orion_entry orion_entries[] = {")
    parts += [f'    {{"{call["name"]}", (void *){IN_CLIENT.get(call["name"], call["name"])}}},' for call in calls]
    parts += [f'    {{"{name}", (void *){name}}},' for name in others]
    # names the wheel declares that are another entry point's (cuGraphInstantiateWithFlags): the runtime asks
    # cuGetProcAddress for them by name too
    symbols = set(driver_symbols())
    parts += [f'    {{"{alias}", (void *){target}}},' for alias, target in abi_aliases() if alias in symbols]
    parts.append("    {NULL, NULL}\n};")
    parts.append("const struct orion_opcode_name orion_opcode_names[] = {")  # call_stats.c names the agent's rows
    parts += [f'    {{ORION_OP_{call["name"]}, "{call["name"]}"}},' for call in calls]
    parts += [f'    {{ORION_WIRE_OP_{op.name}, "{op.name}"}},' for op in record.Op]  # the wire's own records
    parts.append("    {0, NULL}\n};")
    return "\n".join(parts) + "\n"


def _type_declarations() -> list[str]:
    """C typedefs, in ABI terms, of the cuda.h types the table's signatures use that PREAMBLE does not spell out:
    opaque handles as struct pointers, enums as int, scalar typedefs as their C type, structs (always passed by
    pointer) as incomplete types (type_check holds every signature to cuda.h itself)."""
    used = set()
    for call in describe()["calls"]:
        for ctype in split_signature(call["signature"])[1]:
            used.add(re.sub(r"\b(const)\b|\*", " ", c_type(ctype)).split()[-1])
    declared = set(re.findall(r"\b(\w+)\s*[;,]", PREAMBLE)) | set(re.findall(r"\(\*(\w+)\)", PREAMBLE))
    scalar_c = {"i": "int", "I": "unsigned int", "Q": "unsigned long long", "q": "long long", "B": "unsigned char",
                "H": "unsigned short", "f": "float"}
    lines = []
    for name in sorted(used - declared):
        if name in POINTER_HANDLES:
            lines.append(f"typedef struct {name}_st *{name};")
        elif name in ENUMS:
            lines.append(f"typedef int {name};")
        elif name in SCALARS and name not in scalar_c.values() and name != "size_t":
            lines.append(f"typedef {scalar_c[SCALARS[name]]} {name};")
        elif name not in SCALARS and name not in C_WORDS:  # a struct, passed by pointer: incomplete
            lines.append(f"typedef struct {name}_st {name};")  # (the C file that reads it completes the tag)
    return lines


def generate_header() -> str:
    """orion_calls.h, which every C file of the library includes (through orion_guest.h): cuda.h's types in ABI
    terms, the opcode of every table call (ORION_OP_<name>; ORION_POSTED_<name> for a posted one) and every table
    call's prototype, so a hand-written definition that differs from the table does not compile."""
    calls = describe()["calls"]
    parts = ["/* Generated by guest_runtime/native/gen_libcuda.py from ivshmem/driver_api.py: do not edit. */",
             "#ifndef ORION_CALLS_H", "#define ORION_CALLS_H", "", "#include <stddef.h>", "#include <stdint.h>",
             "", PREAMBLE, *_type_declarations(), "", "enum {"]
    parts += [f"    ORION_OP_{call['name']} = {call['opcode']:#x}," for call in calls]
    parts.append("};")
    parts += [f"#define ORION_POSTED_{call['name']} 1" for call in calls if call["posted"]]
    # driver_api.LAUNCH_ATTRIBUTES_PLAIN and _EVENT, one bit per attribute ID: the kinds a launch forwards
    forwarded = attribute_mask(LAUNCH_ATTRIBUTES_PLAIN | LAUNCH_ATTRIBUTES_EVENT)
    parts.append(f"#define ORION_LAUNCH_ATTRIBUTES_FORWARDED {forwarded:#x}ULL")
    # driver_api.STREAM_ATTRIBUTES_PLAIN: the stream attribute IDs cuStreamGet/SetAttribute forward
    parts.append(f"#define ORION_STREAM_ATTRIBUTES_FORWARDED {attribute_mask(STREAM_ATTRIBUTES_PLAIN):#x}ULL")
    # driver_api.LAUNCH_ATTRIBUTES_PLAIN: the kernel node attribute IDs cuGraphKernelNodeGet/SetAttribute forward
    parts.append(f"#define ORION_KERNEL_NODE_ATTRIBUTES_FORWARDED {attribute_mask(LAUNCH_ATTRIBUTES_PLAIN):#x}ULL")
    parts.append("")
    parts += [_prototype(call)[0] + ";" for call in calls if call["name"] not in IN_CLIENT]
    parts.append("int cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);")
    parts.append("\n#endif")
    return "\n".join(parts) + "\n"


# The field strings of driver_api that requests embed (a cuda.h struct as it travels): orion_layouts.h gives each
# one's fields from its own start, and where each request that embeds it has it.
EMBEDDED = {"LAUNCH": LAUNCH, "KERNEL_NODE": KERNEL_NODE, "MEMSET_NODE": MEMSET_NODE, "MEMCPY_3D": MEMCPY_3D,
            "ALLOCATION_PROP": ALLOCATION_PROP}
# The forwarding layer's own payloads (driver_api), under ORION_<name>_REQ_ / _REP_.
FORWARDING_LAYER: dict[str, tuple[Schema, Schema | None]] = {
    "POOL_MAP": (POOL_MAP_REQUEST, POOL_MAP_REPLY), "POOL_MIRROR": (POOL_MIRROR_REQUEST, POOL_MIRROR_REPLY),
    "HOST_FUNCTION": (HOST_FUNCTION_REQUEST, None), "HOST_NODE_FUNCTION": (HOST_NODE_FUNCTION_REQUEST, None),
    "IMAGE_BY_DIGEST": (IMAGE_BY_DIGEST_REQUEST, None), "NVML_QUERY": (NVML_QUERY_REQUEST, NVML_QUERY_REPLY),
    "SHARE_EXPORT": (SHARE_EXPORT_REQUEST, SHARE_REPLY), "SHARE_IMPORT": (SHARE_IMPORT_REQUEST, SHARE_REPLY),
    "IPC_EXPORT": (IPC_EXPORT_REQUEST, SHARE_REPLY), "IPC_OPEN": (IPC_OPEN_REQUEST, SHARE_REPLY),
    "IPC_CLOSE": (IPC_CLOSE_REQUEST, None), "EVENTS_CREATE": (EVENTS_CREATE_REQUEST, EVENTS_CREATE_REPLY)}


def _fields_schema(name: str, fields: str) -> Schema:
    """A driver_api field string ('dst:u64 pitch:u64 ...') as the codec's Schema."""
    return Schema(name, *[(field, kind) for field, kind in (pair.split(":", 1) for pair in fields.split())])


def _item_members(item: struct.Struct) -> list[int]:
    """The offset of each member of a packed array item ('<i4x64s': the id at 0, the value at 8), pad bytes
    skipped, from the item's own format (codec.members)."""
    return [offset for offset, _size in members(item)]


def _schema_layout(prefix: str, schema: Schema) -> list[str]:
    """`#define`s of where each field of `schema` lies (codec.Schema.offsets: every scalar, and the first variable
    field, which begins right after the fixed part), `<prefix>_SIZE` the fixed part's size, and for an array field
    its item's size (`_ITEM`) and, for an item of several members, each member's offset (`_ITEM_<k>`)."""
    lines = [f"#define {prefix}_{field} {offset}" for field, offset in schema.offsets().items()]
    for field, _kind in schema.fields:
        item = schema.item(field)
        if item is None:
            continue
        lines.append(f"#define {prefix}_{field}_ITEM {item.size}")
        members = _item_members(item)
        if len(members) > 1:
            lines += [f"#define {prefix}_{field}_ITEM_{k} {offset}" for k, offset in enumerate(members)]
    lines.append(f"#define {prefix}_SIZE {schema.fixed.size}")
    return lines


def _embedded(prefix: str, schema: Schema) -> list[str]:
    """`<prefix>_<STRUCT>`: where an embedded field string (EMBEDDED) begins in `schema`, checked to lie there whole,
    its fields at their own offsets from that start."""
    lines = []
    fields, offsets = list(schema.fields), schema.offsets()
    for name, text in EMBEDDED.items():
        part = _fields_schema(name, text)
        run = list(part.fields)
        starts = [i for i in range(len(fields) - len(run) + 1) if fields[i:i + len(run)] == run]
        if not starts:
            continue
        start = offsets[run[0][0]]
        for field, offset in part.offsets().items():
            if offsets[field] - start != offset:
                raise ValueError(f"{schema.name}: {name}.{field} is not at {offset} from {name}'s start")
        lines.append(f"#define {prefix}_{name} {start}")
    return lines


def _copy_side() -> tuple[Schema, dict[str, int]]:
    """MEMCPY_3D's copy side (`src_`/`dst_` fields without their prefix) and where each side begins, checked to be
    the same layout on both sides."""
    copy = _fields_schema("MEMCPY_3D", MEMCPY_3D)
    sides: dict[str, int] = {}
    side = None
    offsets = copy.offsets()
    for prefix in ("src", "dst"):
        fields = [(field[len(prefix) + 1:], kind) for field, kind in copy.fields if field.startswith(prefix + "_")]
        schema = Schema("MEMCPY_3D side", *fields)
        sides[prefix] = offsets[f"{prefix}_{fields[0][0]}"]
        for field, offset in schema.offsets().items():
            if offsets[f"{prefix}_{field}"] - sides[prefix] != offset:
                raise ValueError(f"MEMCPY_3D: {prefix}_{field} is not at {offset} from its side's start")
        if side is not None and side.fields != schema.fields:
            raise ValueError("MEMCPY_3D: its two copy sides differ")
        side = schema
    if side is None:
        raise ValueError("MEMCPY_3D has no copy side")
    return side, sides


def generate_layouts() -> str:
    """orion_layouts.h (through orion_guest.h): where every field of every payload lies, from the table's Schemas
    (codec.Schema.offsets, the offsets `encode` packs at), so the hand-written C never spells an offset or a size:
    `ORION_REQ_<call>_<field>`, `ORION_REP_<call>_<field>`, `ORION_PINNED_<call>_<field>` (a pinned copy's request)
    and each one's `_SIZE` (its fixed part); a generic call's fields are `argN` (its N-th C parameter). Also the
    field strings requests embed (ORION_LAUNCH_*, ORION_KERNEL_NODE_*, ORION_MEMSET_NODE_*, ORION_MEMCPY_3D_* and
    its side ORION_MEMCPY_3D_SIDE_*, ORION_ALLOCATION_PROP_*) and where a request has one (`ORION_REQ_<call>_LAUNCH`),
    the forwarding layer's payloads (ORION_POOL_MAP_REQ_*, ...) and a launch attribute's size. It includes
    orion_region.h (generate_region), which has the codec's u32 length before a variable field (ORION_LENGTH_BYTES)."""
    parts = ["/* Generated by guest_runtime/native/gen_libcuda.py from ivshmem/driver_api.py: do not edit. */",
             "/* Where each field of a payload lies (codec.Schema: scalars packed first, little-endian, no padding;",
             " * the first variable field right after them, its u32 length or count first; a tail is the rest). */",
             "#ifndef ORION_LAYOUTS_H", "#define ORION_LAYOUTS_H", "",
             '#include "orion_region.h" /* ORION_LENGTH_BYTES: the u32 length before a variable field */', "",
             "/* driver_api.LAUNCH_ATTRIBUTE_KIND: a CUlaunchAttribute as it travels (id, pad, 64-byte value) */"]
    attribute = Schema("LAUNCH_ATTRIBUTE", ("attributes", LAUNCH_ATTRIBUTE_KIND)).item("attributes")
    if attribute is None:
        raise ValueError(f"LAUNCH_ATTRIBUTE_KIND {LAUNCH_ATTRIBUTE_KIND!r} is not an array kind")
    parts.append(f"#define ORION_LAUNCH_ATTRIBUTE_SIZE {attribute.size}")
    parts += [f"#define ORION_LAUNCH_ATTRIBUTE_{name} {offset}"
              for name, offset in zip(("id", "value"), _item_members(attribute), strict=True)]
    parts.append("")
    parts.append("/* driver_api's field strings that requests embed, from their own start */")
    for name, text in EMBEDDED.items():
        parts += _schema_layout(f"ORION_{name}", _fields_schema(name, text))
        if name == "MEMCPY_3D":  # each copy side, and its fields from the side's start
            side, sides = _copy_side()
            parts += [f"#define ORION_MEMCPY_3D_{prefix} {offset}" for prefix, offset in sides.items()]
            parts += _schema_layout("ORION_MEMCPY_3D_SIDE", side)
    parts.append("")
    parts.append("/* the forwarding layer's own payloads */")
    for name, (request, reply) in FORWARDING_LAYER.items():
        parts += _schema_layout(f"ORION_{name}_REQ", request)
        if reply is not None:
            parts += _schema_layout(f"ORION_{name}_REP", reply)
    queries = describe()["nvml_query"]["queries"]
    parts += [f"#define ORION_NVML_QUERY_{name.upper()} {value}" for name, value in queries.items()]
    parts.append(f"#define ORION_NVML_QUERY_BUS_IDS {NVML_QUERY_BUS_IDS}")
    parts += [f"#define ORION_IPC_{name.upper()} {value}" for name, value in describe()["ipc_export"]["kinds"].items()]
    parts.append(f"#define ORION_EVENTS_CREATE_MAX {EVENTS_CREATE_MAX}")
    fields = " || ".join(f"(id) == {field}" for field in sorted(NVML_LINK_FIELDS))
    parts.append(f"#define ORION_NVML_LINK_FIELD(id) ({fields}) /* driver_api.NVML_LINK_FIELDS */")
    parts.append("")
    parts.append("/* every call of the table with a payload */")
    for call in CALLS.values():
        payloads = [("REQ", call.request), ("REP", call.reply), ("PINNED", call.pinned)]
        lines = []
        for kind, schema in payloads:
            if schema is not None and schema.fields:
                lines += _schema_layout(f"ORION_{kind}_{call.name}", schema)
                lines += _embedded(f"ORION_{kind}_{call.name}", schema)
        if lines:
            parts += [f"/* {call.name} */", *lines]
    parts.append("\n#endif")
    return "\n".join(parts) + "\n"


# The wire-control payloads of record.py (under ORION_<name>_REQ_ / _REP_), which the C wire client packs itself.
WIRE_CONTROL: dict[str, tuple[Schema | None, Schema | None]] = {
    "HELLO": (record.HELLO_REQUEST, record.HELLO_REPLY), "AGENT_INFO": (None, record.AGENT_INFO_REPLY),
    "BIND": (record.BIND_REQUEST, record.BIND_REPLY), "DRAIN": (None, record.DRAIN_REPLY),
    "FILL": (record.FILL_REQUEST, None), "STATS": (None, record.STATS_REPLY),
    "GRANT_SHARE": (None, record.GRANT_SHARE_REPLY), "GRANT_JOIN": (record.GRANT_JOIN_REQUEST, record.BIND_REPLY)}
# layout.py's constants, as ORION_REGION_<name>; its ranges as _MIN and _MAX; the offsets of the words of a block
# (BLOCK_WORD: ORION_REGION_AGENT_<word> in the header's page, ORION_RING_<word> and ORION_STAGING_<word> in a block).
REGION_CONSTANTS = ("VERSION", "HEADER_SIZE", "PAGE", "CACHE_LINE", "CRC_SPAN", "CRC_OFFSET", "NAME_SIZE",
                    "FEATURE_STAGED", "FEATURE_ASYNC_ERRORS", "FEATURE_HOST_HEARTBEAT", "FEATURES", "AGENT_NEVER",
                    "AGENT_SERVING", "AGENT_STOPPED", "MAX_CHANNELS", "MAX_CHUNK_SIZE")
REGION_RANGES = ("RING_ENTRIES_RANGE", "SLOT_SIZE_RANGE", "CHUNK_COUNT_RANGE")
REGION_WORDS = {"ORION_REGION": ("AGENT_HEARTBEAT", "AGENT_PID", "AGENT_STATE"),
                "ORION": ("RING_HEAD", "RING_TAIL", "RING_SLOTS", "STAGING_HEAD", "STAGING_TAIL", "STAGING_CHUNKS")}


def _c_value(value: int | bytes) -> str:
    """A Python constant as C: a string literal for bytes (ASCII), a parenthesised negative number."""
    if isinstance(value, bytes):
        return '"' + value.decode("ascii") + '"'
    return f"({value})" if value < 0 else str(value)


def _struct_layout(prefix: str, layout_struct: struct.Struct, names: tuple[str, ...]) -> list[str]:
    """`#define <prefix>_<name> <offset>` for each value of a struct, named in order by `names`
    (codec.members: the offsets its own format packs at)."""
    places = members(layout_struct)
    if len(places) != len(names):
        raise ValueError(f"{prefix}: {len(names)} names for the {len(places)} values of {layout_struct.format!r}")
    return [f"#define {prefix}_{name} {offset}" for name, (offset, _size) in zip(names, places, strict=True)]


def generate_region() -> str:
    """orion_region.h (orion_wire.c, vgpu_lease.c; orion_layouts.h includes it): the wire's own layout from
    ivshmem's definitions, so the C wire client spells no offset of the region, its records or its control words.
    Offsets are named after their field in lower case, constants in upper case: the region header's fields
    (layout.HEADER and HEADER_FIELDS: ORION_REGION_HEADER_<field>) and constants (ORION_REGION_<name>:
    ORION_REGION_MAGIC, _VERSION, _HEADER_SIZE, _PAGE, _CRC_SPAN, _CRC_OFFSET, the feature bits, the agent states,
    the limits a header must respect, its ranges as _MIN/_MAX), the agent's words (ORION_REGION_AGENT_heartbeat,
    _pid, _state), the ring and staging blocks' words (ORION_RING_head, _tail, _slots; ORION_STAGING_head, _tail,
    _chunks), a channel's control words (channel.Ctrl: ORION_CONTROL_<word>) and their values (ORION_HOST_STATUS_*,
    ORION_HOST_REASON_*, ORION_LIVENESS_*_MODE), the record cell (record.HEADER and HEADER_FIELDS:
    ORION_RECORD_<field>, ORION_RECORD_SIZE), the wire's opcodes, flags, statuses and limits (ORION_WIRE_*), the
    codec's u32 length before a variable field (ORION_LENGTH_BYTES) and the wire-control payloads' fixed places
    (WIRE_CONTROL: ORION_HELLO_REQ_<field>..., as orion_layouts.h gives the table's; a str field's length prefix
    is the first variable field's place, its bytes follow)."""
    header_names = dict(zip(layout.HEADER_FIELDS, members(layout.HEADER), strict=True))
    if header_names["header_crc"] != (layout.CRC_OFFSET, 4) or header_names["name"][1] != layout.NAME_SIZE:
        raise ValueError("layout.CRC_OFFSET or NAME_SIZE disagrees with layout.HEADER")
    if record.HEADER.size != layout.RECORD_HEADER_SIZE:
        raise ValueError("layout.RECORD_HEADER_SIZE disagrees with record.HEADER")
    parts = ["/* Generated by guest_runtime/native/gen_libcuda.py from ivshmem/layout.py, record.py, channel.py, "
             "liveness.py and codec.py: do not edit. */",
             "/* The wire's own layout (docs/wire-protocol.md): offsets in lower case (after their field),",
             " * constants in upper case. All integers little-endian. */",
             "#ifndef ORION_REGION_H", "#define ORION_REGION_H", "",
             "/* codec.LENGTH: the u32 length (bytes) or item count (arrays) before a variable field */",
             f"#define ORION_LENGTH_BYTES {LENGTH.size}", "",
             "/* layout.py: the region header, from the region's first byte (HEADER, HEADER_FIELDS); its constants",
             " * (ORION_REGION_HEADER_SIZE: layout.HEADER_SIZE, the header's whole page, not where its fields end) */",
             f"#define ORION_REGION_MAGIC {_c_value(layout.MAGIC)}"]
    parts += [f"#define ORION_REGION_{name} {_c_value(getattr(layout, name))}" for name in REGION_CONSTANTS]
    for name in REGION_RANGES:
        low, high = getattr(layout, name)
        stem = name.removesuffix("_RANGE")
        parts += [f"#define ORION_REGION_{stem}_MIN {low}", f"#define ORION_REGION_{stem}_MAX {high}"]
    parts += _struct_layout("ORION_REGION_HEADER", layout.HEADER, layout.HEADER_FIELDS)
    for prefix, words in REGION_WORDS.items():
        parts.append(f"/* layout.{', '.join(words)} */")
        for word in words:
            block, _, field = word.partition("_")
            parts.append(f"#define {prefix}_{block}_{field.lower()} {getattr(layout, word)}")
    parts.append("")
    parts.append("/* channel.py: a channel's control words, from its control block's start (Ctrl), and their values */")
    parts += [f"#define ORION_CONTROL_{word.name.lower()} {word.value}" for word in channel.Ctrl]
    parts += [f"#define ORION_HOST_STATUS_{status.name} {status.value}" for status in channel.HostStatus]
    parts += [f"#define ORION_HOST_REASON_{reason.name} {reason.value}" for reason in channel.HostReason]
    parts += [f"#define ORION_LIVENESS_{name} {getattr(liveness, name)}" for name in ("LOCK_MODE", "HEARTBEAT_MODE")]
    parts.append("")
    parts.append("/* record.py: a record cell (HEADER, HEADER_FIELDS), then its inline payload; the wire's values */")
    parts += _struct_layout("ORION_RECORD", record.HEADER, record.HEADER_FIELDS)
    parts.append(f"#define ORION_RECORD_SIZE {record.HEADER.size}")
    parts.append(f"#define ORION_WIRE_PROTOCOL {record.PROTOCOL}")
    parts.append(f"#define ORION_WIRE_MAX_OPCODE {record.MAX_OPCODE}")
    parts.append(f"#define ORION_WIRE_SEQ_MARK {record.SEQ_MARK}")
    parts.append(f"#define ORION_WIRE_SEQ_INDEX {record.SEQ_INDEX}")
    parts.append(f'#define ORION_WIRE_OLDER_AGENT "{channel.OLDER_AGENT}"')
    parts.append(f"#define ORION_WIRE_MAX_PAYLOAD {channel.MAX_PAYLOAD}")
    parts += [f"#define ORION_WIRE_FLAG_{name} {getattr(record.Flag, name)}"
              for name in vars(record.Flag) if not name.startswith("_")]
    parts.append(f"#define ORION_WIRE_KNOWN_FLAGS {record.KNOWN_FLAGS}")
    parts += [f"#define ORION_WIRE_OP_{op.name} {op.value}" for op in record.Op]
    parts.append(f"#define ORION_WIRE_STATS_RELAYED {record.STATS_RELAYED}")
    parts += [f"#define ORION_WIRE_STATUS_{status.name} {_c_value(status.value)}" for status in record.Status]
    parts.append("")
    parts.append("/* record.py: the wire-control payloads' fixed places (codec.Schema.offsets) */")
    for name, (request, reply) in WIRE_CONTROL.items():
        if request is not None:
            parts += _schema_layout(f"ORION_{name}_REQ", request)
        if reply is not None:
            parts += _schema_layout(f"ORION_{name}_REP", reply)
    parts.append("\n#endif")
    return "\n".join(parts) + "\n"


# A hand-written entry point in guest_runtime/native/*.c: `CUresult cuXxx(` or `int cuXxx(` at a line's start, a
# definition where a body follows its parameters (not a declaration's `;`). The generated entry points are written
# beside the built library, never here.
_DEFINITION = re.compile(r"^(?:CUresult|int) (cu\w+)\(([^()]|\([^()]*\))*\)\s*\{", re.MULTILINE)
HAND_WRITTEN, WRITTEN_OUT, OUTSIDE = "hand-written table calls", "generic calls written out", "outside the table"


def c_definitions(directory: Path | None = None) -> dict[str, list[str]]:
    """Every entry point the hand-written C of `directory` (this one) defines: name -> the files defining it."""
    found: dict[str, list[str]] = {}
    for path in sorted((directory or Path(__file__).parent).glob("*.c")):
        for match in _DEFINITION.finditer(path.read_text(encoding="utf-8")):
            found.setdefault(match[1], []).append(path.name)
    return found


def hand_written(definitions: dict[str, list[str]] | None = None) -> dict[str, tuple[str, list[str]]]:
    """Each entry point the library's C writes by hand -> (its kind, the files defining it): the table's calls the
    generator does not write (HAND_WRITTEN: every non-generic call, those answered in the guest too), the generic
    calls a C definition replaces (WRITTEN_OUT: guest-side state beyond the table's effects) and the entry points
    answered in the guest outside the table (OUTSIDE: api_classes.GUEST)."""
    found = c_definitions() if definitions is None else definitions
    index: dict[str, tuple[str, list[str]]] = {}
    for name, call in CALLS.items():
        files = found.get(IN_CLIENT.get(name, name), [])
        if not call.generic:
            index[name] = (HAND_WRITTEN, files)
        elif files:
            index[name] = (WRITTEN_OUT, files)
    for name in GUEST:
        index[name] = (OUTSIDE, found.get(name, []))
    return index


def hand_written_problems(definitions: dict[str, list[str]] | None = None) -> list[str]:
    """What keeps hand_written() from being an index: a hand-written call with no C definition or with one in two
    files, and an entry point answered in the guest defined elsewhere than api_classes.GUEST says."""
    problems = []
    for name, (kind, files) in hand_written(definitions).items():
        if not files and kind != WRITTEN_OUT:
            problems.append(f"{name} ({kind}): no C definition in guest_runtime/native/*.c")
        elif len(files) > 1:
            problems.append(f"{name} ({kind}): defined in {len(files)} files: {', '.join(files)}")
        elif kind == OUTSIDE and files != [GUEST[name]]:
            problems.append(f"{name}: api_classes.GUEST names {GUEST[name]}, the C defines it in {files[0]}")
    return problems


def where_hand_written() -> list[str]:
    """docs/api-table.md's last section: which C file holds each hand-written call, grouped by file."""
    by_file: dict[str, dict[str, list[str]]] = {}
    for name, (kind, files) in hand_written().items():
        for file in files:
            by_file.setdefault(file, {}).setdefault(kind, []).append(name)
    kinds = (HAND_WRITTEN, WRITTEN_OUT, OUTSIDE)
    lines = ["## Where each hand-written call lives", "",
             "Generated by `guest_runtime/native/gen_libcuda.py` from the definitions in `guest_runtime/native/*.c` "
             "(`CUresult cuXxx(` or `int cuXxx(` at a line's start): each call of the table the generator does not "
             "write, each generic call a C definition replaces (the generated one is weak: the guest keeps state "
             "beyond the table's effects), and each entry point answered in the guest outside the table "
             "(`ivshmem/api_classes.py` GUEST). tests/unit/test_native_layouts.py fails when one has no definition, "
             "or one in two files.", "",
             f"| C file | {' | '.join(kinds)} |", "|---|---|---|---|"]
    for file in sorted(by_file):
        cells = [", ".join(f"`{name}`" for name in by_file[file].get(kind, [])) for kind in kinds]
        lines.append(f"| `{file}` | {' | '.join(cells)} |")
    return [*lines, ""]


def api_table_page() -> str:
    """docs/api-table.md: the table's page (driver_api.markdown) and where each hand-written call lives."""
    return markdown() + "\n".join(where_hand_written())


def driver_symbols() -> list[str]:
    """Every driver entry point the CUDA 13 headers declare (driver_symbols.txt, from cuda-bindings' capsules):
    the CUDA runtime resolves 346-361 of them at start-up and refuses to start if one is missing."""
    text = (Path(__file__).with_name("driver_symbols.txt")).read_text()
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def nvml_symbols() -> list[str]:
    """Every NVML entry point the headers declare (nvml_symbols.txt, from cuda-bindings' capsules): PyTorch resolves
    some of them with dlsym and fails where one is missing (nvmlDeviceGetNvLinkRemoteDeviceType, in its
    out-of-memory message)."""
    text = (Path(__file__).with_name("nvml_symbols.txt")).read_text()
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def nvml_names() -> list[str]:
    """nvml_symbols() and, for each versioned name (`X_v3`), its earlier versions and unversioned name (`X`, `X_v2`):
    nvml.h's macros map the plain name to the newest, but the library exports every version, and PyTorch looks up
    the plain `nvmlDeviceGetComputeRunningProcesses` with dlsym (a stub ignores its arguments, whichever ABI)."""
    names = set(nvml_symbols())
    for name in list(names):
        base, sep, version = name.rpartition("_v")
        if sep and version.isascii() and version.isdigit():
            names.add(base)
            names.update(f"{base}_v{n}" for n in range(2, int(version)))
    return sorted(names)


NVML_NOT_STUBBED = frozenset({"nvmlErrorString"})  # not an nvmlReturn_t: nvml.c defines it, always


def _nvml_stub(name: str) -> str:
    """An NVML entry point nvml.c does not answer: a weak symbol answering NVML_ERROR_NOT_SUPPORTED (named once), as
    NVML does for a feature a device lacks; nvml.c's definition of the same name replaces it."""
    return f"__attribute__((weak)) int {name}(void) {{ return orion_nvml_not_supported(\"{name}\"); }}"


def _outside_table(name: str) -> str:
    """An entry point the table does not forward: a weak symbol answering 801 (named once). A C definition of
    the same name (cuGetExportTable in export_tables.c) replaces it; arguments are ignored, which the x86-64
    calling convention allows (the caller owns its arguments)."""
    return (f"__attribute__((weak)) CUresult {name}(void) {{\n    ORION_ENTRY(\"{name}\");\n"
            f"    return orion_not_forwarded(\"{name}\");\n}}")


def abi_aliases() -> list[tuple[str, str]]:
    """(exported name, entry point) for each name cuda.h's macros give an entry point (driver_aliases.txt):
    cuMemAlloc_v2, cuMemcpyHtoD_v2_ptds, cuGraphInstantiateWithFlags... The real libcuda exports them, and a
    caller that links with -lcuda or looks names up with dlsym asks for them: cuBLASLt refuses to start ("Driver
    API initialization failed") and XLA's stubs answer CUDA_ERROR_SHARED_OBJECT_INIT_FAILED without them.
    Every entry point here has the ABI of its versioned name (type_check holds the table to cuda.h's macros), so
    each versioned name is the same function; a name that exists in its own right (driver_symbols) keeps it,
    unless the inventory gives it the entry point's ABI (or none of its own: a macro's name only).
    A per-thread-default-stream name (_ptds, _ptsz) is the legacy-stream one: its stream 0 is the legacy
    default stream, which orders at least as strictly (docs/native-driver.md)."""
    text = (Path(__file__).with_name("driver_aliases.txt")).read_text()
    pairs = [tuple(line.split()) for line in text.splitlines() if line.strip() and not line.startswith("#")]
    table = {call["name"] for call in describe()["calls"]}
    own = set(driver_symbols()) | table
    defined = table | set(GUEST)  # entry points with a definition of their own (generated, or hand-written C)
    entries = cuda_header.read().entry_points
    aliases = []
    for alias, name in pairs:
        target = IN_CLIENT.get(name, name)
        if name not in own or alias == target or alias in defined:
            continue
        # a name the wheel also declares keeps its own (an 801 stub) unless its ABI is the entry point's: cuda.h's
        # `#define cuGraphInstantiate cuGraphInstantiateWithFlags` makes the latter the forwarded call's symbol
        if alias in own and entries.get(alias, entries.get(name)) != entries.get(name):
            continue
        aliases.append((alias, target))
    return aliases


# cuda.h: `#define cuMemAlloc cuMemAlloc_v2`, `#define cuMemcpyHtoD __CUDA_API_PTDS(cuMemcpyHtoD_v2)`
_CUDA_H_ALIAS = re.compile(r"^\s*#\s*define\s+(cu\w+)\s+(?:__CUDA_API_(PTDS|PTSZ)\((cu\w+)\)|(cu\w+))\s*$")


def write_aliases(cuda_h: Path, path: Path) -> int:
    """Regenerate driver_aliases.txt from a CUDA toolkit's cuda.h (a superset is kept: names only grow)."""
    pairs = {tuple(line.split()) for line in path.read_text().splitlines() if line.strip()
             and not line.startswith("#")}
    for line in cuda_h.read_text().splitlines():
        match = _CUDA_H_ALIAS.match(line)
        if match:
            name, stream, versioned = match[1], match[2], match[3] or match[4]
            if versioned != name:
                pairs.add((versioned, name))
            if stream:
                pairs.add((f"{versioned}_{stream.lower()}", name))
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    path.write_text("\n".join([*header, *(f"{a} {n}" for a, n in sorted(pairs))]) + "\n")
    return 0


def write_symbols(path: Path) -> int:
    """Regenerate driver_symbols.txt and nvml_symbols.txt from the installed cuda-bindings (supersets are kept: names
    only grow)."""
    from cuda import bindings
    from cuda.bindings import cydriver, cynvml

    names = set(driver_symbols()) | {k for k in cydriver.__pyx_capi__ if k.startswith("cu")}
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    header[0] = (f"# The CUDA driver entry points cuda.bindings {bindings.__version__} declares (cydriver capsules): "
                 "the names cuGetProcAddress")
    path.write_text("\n".join([*header, *sorted(names)]) + "\n")
    nvml = path.with_name("nvml_symbols.txt")
    names = set(nvml_symbols()) | {k for k in cynvml.__pyx_capi__ if k.startswith("nvml")}
    header = [line for line in nvml.read_text().splitlines() if line.startswith("#")]
    header[0] = (f"# The NVML entry points cuda.bindings {bindings.__version__} declares (cynvml capsules): every one "
                 "is exported by the")
    nvml.write_text("\n".join([*header, *sorted(names)]) + "\n")
    return 0


def wheel_signatures() -> dict[str, str]:
    """Every driver entry point the installed cuda-bindings wheel declares, with its capsule's signature."""
    from cuda.bindings import cydriver

    from guest_runtime.capsule_hook import capsule_signature

    return {name: capsule_signature(capsule) for name, capsule in cydriver.__pyx_capi__.items()
            if name.startswith("cu")}


def write_inventory(cuda_h: Path) -> int:
    """Regenerate ivshmem/cuda_h.txt from a toolkit's cuda.h and the installed wheel (names only grow)."""
    header = cuda_header.parse(cuda_h.read_text())
    earlier = cuda_header.read() if cuda_header.INVENTORY.exists() else \
        cuda_header.Inventory({}, frozenset(), frozenset(), {})
    cuda_header.write(cuda_header.merged(header, earlier, wheel_signatures()), source=str(cuda_h))
    return 0


def type_check(declared: Collection[str] | None = None) -> str:
    """A C file that compiles only if every table call's signature is the one cuda.h declares (the same
    function, under cuda.h's versioned names): the CPU-CI check that no entry point is mis-typed. `declared`: the
    entry points the cuda.h at hand declares (a call only a newer header or the wheel has is left out)."""
    parts = ["/* Generated by gen_libcuda.py --check: compiles only where cuda.h agrees with the call table. */",
             "#include <cuda.h>", ""]
    for call in describe()["calls"]:
        if declared is not None and call["name"] not in declared:
            continue
        _restype, params = split_signature(call["signature"])
        name = call["name"]
        parts.append(f"typedef CUresult orion_t_{name}({', '.join(c_type(t) for t in params) or 'void'});")
        parts.append(f'_Static_assert(__builtin_types_compatible_p(__typeof__({name}), orion_t_{name}), '
                     f'"{name}: the call table and cuda.h disagree");')
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--api-table"]:
        print(api_table_page(), end="")
        return 0
    if args == ["--symbols"]:
        return write_symbols(Path(__file__).with_name("driver_symbols.txt"))
    if len(args) == 2 and args[0] == "--inventory":
        return write_inventory(Path(args[1]))
    if len(args) == 2 and args[0] == "--aliases":
        return write_aliases(Path(args[1]), Path(__file__).with_name("driver_aliases.txt"))
    check = args[:1] == ["--check"]
    if check:
        args = args[1:]
    if len(args) != 1:
        print("usage: python -m guest_runtime.native.gen_libcuda [--check] OUT.c", file=sys.stderr)
        return 2
    with open(args[0], "w") as out:
        out.write(type_check() if check else generate())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
