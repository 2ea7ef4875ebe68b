"""The native guest driver's hand-written C against the call table, read as text (no compiler needed):

* orion_layouts.h (gen_libcuda.generate_layouts) places every field where the codec packs it, and orion_region.h
  (generate_region) every offset and constant of the wire itself where ivshmem has it: the region header, the agent's
  words, ring and staging blocks, control words, record cells, opcodes, flags, statuses and wire-control payloads;
* the hand-written C takes payload, region, record and control offsets and sizes from them, never literal ones (a
  scan for the spellings that used to be there: `orion_put_u64(req + 8, ...)`, `uint8_t req[12]`, `rd32(h + 8)`,
  `rd64(ch->map + 72)`, `memcpy(cell + 8, ...)`), and the wire client defines none of the wire's constants itself
  (`#define RING_TAIL 64u`, `enum { CLIENT_GEN = 0, ... }`);
* each hand-written call of the table has exactly one C definition, and docs/api-table.md's index of them is
  gen_libcuda's (tests/unit/test_driver_api.py holds the page to `api_table_page()`).
"""
from __future__ import annotations

import re
import struct
import zlib
from pathlib import Path

import pytest

from guest_runtime.native.gen_libcuda import (
    EMBEDDED,
    FORWARDING_LAYER,
    HAND_WRITTEN,
    OUTSIDE,
    REGION_CONSTANTS,
    REGION_RANGES,
    REGION_WORDS,
    WIRE_CONTROL,
    c_definitions,
    generate_layouts,
    generate_region,
    hand_written,
    hand_written_problems,
)
from ivshmem import channel, layout, liveness, record
from ivshmem.codec import LENGTH, SCALARS, Schema, members
from ivshmem.driver_api import CALLS, LAUNCH_ATTRIBUTE

NATIVE = Path(__file__).resolve().parents[2] / "guest_runtime" / "native"
# Bytes that are none of ours: SHA-256's own padding (sha256.c). The wire's own records (the region header, record
# cells, control words, HELLO: orion_wire.c; AGENT_INFO and BIND: vgpu_lease.c) take their places from orion_region.h.
NOT_CALL_PAYLOADS = frozenset({"sha256.c"})
# The names the C gives a request's or reply's bytes (`raw` is a copy of a cuda.h struct: cuda.h's layout, not ours),
# and the wire client's names for the region (`h`, `map`: its header), a record cell, a control block (`ctrl`, `c`)
# and a channel's or a ring's block (`base`); a field of a struct may name one (`ch->map + 72`).
BUFFER = r"(?:req|rep|request|reply|head|prefix|p|payload|fixed|tail|buffer|items|at|listed|h|map|cell|ctrl|c|base)"
PLACE = rf"(?:\w+->)?{BUFFER}\s*\+\s*[0-9]"
# The C's accessors: the payload packers, the wire client's plain (rd32, rd64) and atomic (load32...) ones, and a copy
# to or from a place (either of memcpy's or memcmp's first two arguments).
ACCESS = r"(?:orion_(?:put|get)_(?:u8|u16|u32|i32|u64|f32)|rd(?:32|64)|load(?:32|64)|store(?:32|64))"
LITERAL_OFFSET = re.compile(rf"{ACCESS}\(\s*{PLACE}|mem(?:cpy|set|cmp)\((?:[^,()]*,\s*)?{PLACE}")
LITERAL_SIZE = re.compile(rf"uint8_t\s+{BUFFER}\s*\[\s*[0-9]")
# The C files that speak the wire itself (orion_region.h's names, never constants of their own).
WIRE_C = ("orion_wire.c", "vgpu_lease.c")


def _defines() -> dict[str, int]:
    """Every integer orion_layouts.h and orion_region.h define (negative ones are parenthesised)."""
    text = generate_layouts() + generate_region()
    return {name: int(value) for name, value in re.findall(r"^#define (ORION_\w+) \(?(-?\d+)\)?$", text, re.M)}


def _sample(schema: Schema) -> tuple[list[object], dict[str, object]]:
    """Values for every field of `schema`, each scalar distinct and filling its width (so a field read at the wrong
    offset or width reads something else), the variable ones empty."""
    values: list[object] = []
    scalars: dict[str, object] = {}
    for position, (field, kind) in enumerate(schema.fields):
        if kind not in SCALARS:
            values.append(b"" if kind in ("tail", "bytes") else "" if kind == "str" else [])
            continue
        code = SCALARS[kind]
        if code == "f":
            value: object = float(position) + 0.5
        else:
            size = struct.calcsize(code)
            value = int.from_bytes(bytes(((position + 1) * 16 + i) & 0x7F for i in range(size)), "little")
        values.append(value)
        scalars[field] = value
    return values, scalars


def _check(prefix: str, schema: Schema, defines: dict[str, int]) -> None:
    values, scalars = _sample(schema)
    payload = schema.encode(*values)
    assert defines[f"{prefix}_SIZE"] == schema.fixed.size, prefix
    kinds = dict(schema.fields)
    for field, value in scalars.items():
        got = struct.unpack_from("<" + SCALARS[kinds[field]], payload, defines[f"{prefix}_{field}"])[0]
        assert got == value, f"{prefix}_{field}: not where the codec packs {field}"
    variable = [field for field, kind in schema.fields if kind not in SCALARS]
    if variable:  # the first variable field begins right after the fixed part
        assert defines[f"{prefix}_{variable[0]}"] == schema.fixed.size
        assert not any(f"{prefix}_{field}" in defines for field in variable[1:]), "a later one has no fixed place"


def test_the_generated_layouts_place_every_field_where_the_codec_packs_it() -> None:
    defines = _defines()
    checked = 0
    for call in CALLS.values():
        for kind, schema in (("REQ", call.request), ("REP", call.reply), ("PINNED", call.pinned)):
            if schema is not None and schema.fields:
                _check(f"ORION_{kind}_{call.name}", schema, defines)
                checked += 1
            elif schema is not None:
                assert f"ORION_{kind}_{call.name}_SIZE" not in defines
    assert checked > len(CALLS)  # requests, replies and the pinned variants
    for name, (request, reply) in FORWARDING_LAYER.items():
        _check(f"ORION_{name}_REQ", request, defines)
        if reply is not None:
            _check(f"ORION_{name}_REP", reply, defines)
    assert defines["ORION_LAUNCH_ATTRIBUTE_SIZE"] == LAUNCH_ATTRIBUTE.size == 72
    assert defines["ORION_LENGTH_BYTES"] == 4


def test_an_embedded_struct_lies_whole_where_its_request_names_it() -> None:
    """`ORION_REQ_<call>_<STRUCT>` + `ORION_<STRUCT>_<field>` is `ORION_REQ_<call>_<field>`, for every request that
    embeds one of driver_api's field strings; MEMCPY_3D's two sides share ORION_MEMCPY_3D_SIDE_*."""
    defines = _defines()
    embedding = 0
    for call in CALLS.values():
        for struct_name, text in EMBEDDED.items():
            start = defines.get(f"ORION_REQ_{call.name}_{struct_name}")
            if start is None:
                assert text not in " ".join(f"{f}:{k}" for f, k in call.request.fields), (call.name, struct_name)
                continue
            embedding += 1
            for pair in text.split():
                field = pair.split(":")[0]
                assert start + defines[f"ORION_{struct_name}_{field}"] == defines[f"ORION_REQ_{call.name}_{field}"]
    assert embedding >= 14  # launches, kernel, memset and memcpy nodes, VMM props
    for side in ("src", "dst"):
        for field in ("x", "y", "z", "lod", "type", "host", "device", "pitch", "height"):
            assert (defines[f"ORION_MEMCPY_3D_{side}"] + defines[f"ORION_MEMCPY_3D_SIDE_{field}"]
                    == defines[f"ORION_MEMCPY_3D_{side}_{field}"])


def test_an_array_fields_items_are_the_codecs() -> None:
    defines = _defines()
    assert defines["ORION_REQ_cuModuleLoadDataEx_options_ITEM"] == 12  # [iQ]: option, value
    assert (defines["ORION_REQ_cuModuleLoadDataEx_options_ITEM_0"],
            defines["ORION_REQ_cuModuleLoadDataEx_options_ITEM_1"]) == (0, 4)
    assert defines["ORION_REQ_cuLaunchKernelEx_attributes_ITEM"] == 72
    assert defines["ORION_REQ_cuLaunchKernelEx_attributes_ITEM_1"] == defines["ORION_LAUNCH_ATTRIBUTE_value"] == 8
    assert defines["ORION_REQ_cuMemSetAccess_descs_ITEM"] == 12 and defines["ORION_REP_cuGraphGetEdges_to_ITEM"] == 8


def _region() -> tuple[dict[str, int], dict[str, str]]:
    """orion_region.h's integers and its strings."""
    text = generate_region()
    numbers = {name: int(value) for name, value in re.findall(r"^#define (ORION_\w+) \(?(-?\d+)\)?$", text, re.M)}
    strings = dict(re.findall(r'^#define (ORION_\w+) "([^"]*)"$', text, re.M))
    assert len(numbers) + len(strings) == len(re.findall(r"^#define ", text, re.M)) - 1  # and its include guard
    return numbers, strings


def _distinct(layout_struct: struct.Struct) -> tuple[bytes, list[int]]:
    """A packed `layout_struct` whose every integer value fills its width and differs from the others (so a value read
    at another field's offset reads something else), and the values."""
    values = []
    for position, (_offset, size) in enumerate(members(layout_struct)):
        values.append(int.from_bytes(bytes(((position + 1) * 16 + i) & 0x7F for i in range(size)), "little"))
    raw = bytearray(layout_struct.size)
    for value, (offset, size) in zip(values, members(layout_struct), strict=True):
        raw[offset:offset + size] = value.to_bytes(size, "little")
    return bytes(raw), values


def test_the_generated_region_places_every_header_field_where_layout_packs_it() -> None:
    """ORION_REGION_HEADER_<field>, read back from a header layout.pack_header wrote from a geometry whose every field
    differs (and from the doc's offsets, tests/unit/test_layout.py's), for each field of layout.HEADER_FIELDS."""
    numbers, strings = _region()
    geometry = layout.Geometry(name="regionname", **{field: 1000 + 17 * i for i, field in enumerate(
        ("region_size", "channel_count", "ring_entries", "slot_size", "chunk_size", "chunk_count", "channel_offset",
         "channel_stride", "pool_offset", "pool_size", "off_ctrl", "off_req_ring", "off_cpl_ring", "off_req_staging",
         "off_cpl_staging", "off_ring_head", "off_ring_tail", "off_ring_slots", "off_staging_chunks", "features"))})
    raw = layout.pack_header(geometry)
    sizes = dict(zip(layout.HEADER_FIELDS, (size for _offset, size in members(layout.HEADER)), strict=True))
    assert {f"ORION_REGION_HEADER_{field}" for field in layout.HEADER_FIELDS} <= set(numbers)

    def at(field: str) -> bytes:
        offset = numbers[f"ORION_REGION_HEADER_{field}"]
        return raw[offset:offset + sizes[field]]

    assert at("magic") == layout.MAGIC == strings["ORION_REGION_MAGIC"].encode()
    assert int.from_bytes(at("version"), "little") == layout.VERSION == numbers["ORION_REGION_VERSION"]
    assert int.from_bytes(at("header_size"), "little") == layout.HEADER_SIZE == numbers["ORION_REGION_HEADER_SIZE"]
    zeroed = bytearray(raw)
    zeroed[layout.CRC_OFFSET:layout.CRC_OFFSET + 4] = bytes(4)
    assert int.from_bytes(at("header_crc"), "little") == zlib.crc32(zeroed)
    assert numbers["ORION_REGION_HEADER_header_crc"] == numbers["ORION_REGION_CRC_OFFSET"] == layout.CRC_OFFSET
    assert at("name") == b"regionname".ljust(layout.NAME_SIZE, b"\0")
    for field in layout.HEADER_FIELDS:
        if field not in ("magic", "version", "header_size", "header_crc", "name"):
            assert int.from_bytes(at(field), "little") == getattr(geometry, field), field
    assert (numbers["ORION_REGION_HEADER_version"], numbers["ORION_REGION_HEADER_header_size"],
            numbers["ORION_REGION_HEADER_pool_offset"], numbers["ORION_REGION_HEADER_off_staging_chunks"],
            numbers["ORION_REGION_HEADER_name"]) == (8, 12, 72, 120, 128)  # docs/wire-protocol.md's table


def test_every_generated_region_constant_is_ivshmems() -> None:
    """Each name of orion_region.h equals the Python definition it is generated from, and none goes unchecked."""
    numbers, strings = _region()
    want: dict[str, int] = {"ORION_LENGTH_BYTES": LENGTH.size}
    want |= {f"ORION_REGION_{name}": getattr(layout, name) for name in REGION_CONSTANTS}
    for name in REGION_RANGES:
        stem = name.removesuffix("_RANGE")
        want[f"ORION_REGION_{stem}_MIN"], want[f"ORION_REGION_{stem}_MAX"] = getattr(layout, name)
    want |= {f"ORION_REGION_HEADER_{field}": offset
             for field, (offset, _size) in zip(layout.HEADER_FIELDS, members(layout.HEADER), strict=True)}
    want |= {"ORION_REGION_AGENT_heartbeat": layout.AGENT_HEARTBEAT, "ORION_REGION_AGENT_pid": layout.AGENT_PID,
             "ORION_REGION_AGENT_state": layout.AGENT_STATE}
    want |= {"ORION_RING_head": layout.RING_HEAD, "ORION_RING_tail": layout.RING_TAIL,
             "ORION_RING_slots": layout.RING_SLOTS, "ORION_STAGING_head": layout.STAGING_HEAD,
             "ORION_STAGING_tail": layout.STAGING_TAIL, "ORION_STAGING_chunks": layout.STAGING_CHUNKS}
    assert sum(len(words) for words in REGION_WORDS.values()) == 9
    want |= {f"ORION_CONTROL_{word.name.lower()}": word.value for word in channel.Ctrl}
    want |= {f"ORION_HOST_STATUS_{status.name}": status.value for status in channel.HostStatus}
    want |= {f"ORION_HOST_REASON_{reason.name}": reason.value for reason in channel.HostReason}
    want |= {"ORION_LIVENESS_LOCK_MODE": liveness.LOCK_MODE, "ORION_LIVENESS_HEARTBEAT_MODE": liveness.HEARTBEAT_MODE}
    want |= {f"ORION_RECORD_{field}": offset
             for field, (offset, _size) in zip(record.HEADER_FIELDS, members(record.HEADER), strict=True)}
    want["ORION_RECORD_SIZE"] = record.HEADER.size
    want |= {"ORION_WIRE_PROTOCOL": record.PROTOCOL, "ORION_WIRE_MAX_OPCODE": record.MAX_OPCODE,
             "ORION_WIRE_MAX_PAYLOAD": channel.MAX_PAYLOAD, "ORION_WIRE_KNOWN_FLAGS": record.KNOWN_FLAGS,
             "ORION_WIRE_FLAG_NO_REPLY": record.Flag.NO_REPLY, "ORION_WIRE_FLAG_STAGED": record.Flag.STAGED,
             "ORION_WIRE_FLAG_ASYNC_ERROR": record.Flag.ASYNC_ERROR, "ORION_WIRE_SEQ_MARK": record.SEQ_MARK,
             "ORION_WIRE_SEQ_INDEX": record.SEQ_INDEX, "ORION_WIRE_STATS_RELAYED": record.STATS_RELAYED}
    want |= {f"ORION_WIRE_OP_{op.name}": op.value for op in record.Op}
    want |= {f"ORION_WIRE_STATUS_{status.name}": status.value for status in record.Status}
    schemas = 0
    for name, pair in WIRE_CONTROL.items():
        for kind, schema in zip(("REQ", "REP"), pair, strict=True):
            if schema is None:
                continue
            _check(f"ORION_{name}_{kind}", schema, numbers)  # where the codec packs each field
            want |= {f"ORION_{name}_{kind}_{field}": offset for field, offset in schema.offsets().items()}
            want[f"ORION_{name}_{kind}_SIZE"] = schema.fixed.size
            for field, _kind in schema.fields:  # an array's item (STATS reply's): its size and its members
                item = schema.item(field)
                if item is not None:
                    want[f"ORION_{name}_{kind}_{field}_ITEM"] = item.size
                    want |= {f"ORION_{name}_{kind}_{field}_ITEM_{k}": offset
                             for k, (offset, _size) in enumerate(members(item))}
            schemas += 1
    assert schemas == 11 and WIRE_CONTROL["HELLO"] == (record.HELLO_REQUEST, record.HELLO_REPLY)
    assert numbers == want
    assert strings == {"ORION_REGION_MAGIC": layout.MAGIC.decode(), "ORION_WIRE_OLDER_AGENT": channel.OLDER_AGENT}
    # the ones orion_wire.c and vgpu_lease.c use, as docs/wire-protocol.md has them
    assert (numbers["ORION_CONTROL_client_heartbeat"], numbers["ORION_CONTROL_host_heartbeat"],
            numbers["ORION_RECORD_status"], numbers["ORION_RECORD_SIZE"]) == (16, 80, 24, 32)
    assert (numbers["ORION_HELLO_REQ_hostname"], numbers["ORION_HELLO_REP_agent"], numbers["ORION_BIND_REQ_allocation"],
            numbers["ORION_AGENT_INFO_REP_host"], numbers["ORION_GRANT_JOIN_REQ_token"],
            numbers["ORION_GRANT_SHARE_REP_token"]) == (8, 8, 0, 0, 0, 0)


def test_the_record_cell_fields_lie_where_record_header_packs_them() -> None:
    numbers, _strings = _region()
    raw, values = _distinct(record.HEADER)
    unpacked = record.HEADER.unpack(raw)
    for field, value, (_offset, size) in zip(record.HEADER_FIELDS, values, members(record.HEADER), strict=True):
        offset = numbers[f"ORION_RECORD_{field}"]
        assert int.from_bytes(raw[offset:offset + size], "little") == value
        assert unpacked[record.HEADER_FIELDS.index(field)] & ((1 << 8 * size) - 1) == value, field
    assert layout.RECORD_HEADER_SIZE == record.HEADER.size == numbers["ORION_RECORD_SIZE"]


def _hand_written_c() -> list[Path]:
    return [path for path in sorted([*NATIVE.glob("*.c"), *NATIVE.glob("*.h")])
            if path.name not in NOT_CALL_PAYLOADS]


def test_no_literal_payload_offset_in_the_hand_written_c() -> None:
    """Offsets and sizes of request and reply payloads come from orion_layouts.h."""
    found = []
    for path in _hand_written_c():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if LITERAL_OFFSET.search(line) or LITERAL_SIZE.search(line):
                found.append(f"{path.name}:{number}: {line.strip()}")
    assert not found, "literal payload offsets (use orion_layouts.h's names):\n" + "\n".join(found)


def test_the_scan_sees_the_spellings_it_refuses() -> None:
    for line in ("orion_put_u64(req + 8, size);", "orion_put_u32(p + 16, m->value);", "uint8_t req[12], rep[8];",
                 "*x = orion_get_u64(rep + 4);", "uint8_t head[16 + KERNEL_NODE_BYTES + 4];",
                 # the wire client's, before orion_region.h
                 "if (rd32(h + 8) != VERSION) {", "g->features = rd64(h + 16); g->region_size = rd64(h + 24);",
                 "uint64_t pool_offset = rd64(ch->map + 72), pool_size = rd64(ch->map + 80);",
                 "r->generation = rd32(cell + 20); memcpy(&r->status, cell + 24, 4);",
                 "memcpy(cell + 8, words, sizeof words);", "store32(c + 16, 0);", "load64(ch->ctrl + 80)",
                 "n = (uint32_t)hl; memcpy(req + 8, &n, 4); memcpy(req + 12, host, hl);",
                 "memcpy(host, reply + 4, len);", "uint8_t request[4 + 256], reply[512];"):
        assert LITERAL_OFFSET.search(line) or LITERAL_SIZE.search(line), line
    for line in ("orion_put_u64(req + ORION_REQ_cuMemCreate_size, size);", "uint8_t raw[24];",
                 "uint8_t req[ORION_REQ_cuCtxCreate_SIZE], rep[ORION_REP_cuCtxCreate_SIZE];",
                 "g->features = rd64(H(features));", "uint64_t size = rd64(ch->map + ORION_REGION_HEADER_pool_size);",
                 "memcpy(&r->status, cell + ORION_RECORD_status, sizeof r->status);", "memcpy(req + HOSTNAME, &n, 4);",
                 "store32(base + g.o_req + ORION_RING_tail, 0);", "uint8_t copy[ORION_REGION_CRC_SPAN];"):
        assert not (LITERAL_OFFSET.search(line) or LITERAL_SIZE.search(line)), line


# `#define NAME 123` or `NAME = 123` (an enumerator): a constant the C defines with a number of its own.
_OWN_CONSTANT = re.compile(r"^\s*#\s*define\s+(\w+)\s+\(?-?[0-9]|[{,]\s*(\w+)\s*=\s*-?[0-9]", re.M)


def _spelled_wire_constants(text: str) -> list[str]:
    """The constants `text` defines with a number of its own whose name is the end of one of orion_region.h's (any
    case): the wire's, spelled again (`#define RING_TAIL 64u`, `enum { CLIENT_GEN = 0, ... }`, `OP_BIND = 7`)."""
    generated = [name.lower() for name in re.findall(r"^#define (ORION_\w+) ", generate_region(), re.M)]
    found = []
    for match in _OWN_CONSTANT.finditer(text):
        name = (match[1] or match[2]).lower()
        if any(full.endswith("_" + name) for full in generated):
            found.append(match[1] or match[2])
    return found


def test_the_wire_client_spells_none_of_the_wires_constants() -> None:
    """orion_wire.c and vgpu_lease.c take the wire's constants from orion_region.h; what they still define with a
    number of their own is theirs (timings, buffer capacities, the size of the async-error queue)."""
    for name in WIRE_C:
        assert _spelled_wire_constants((NATIVE / name).read_text(encoding="utf-8")) == [], name
    before = ("#define HEADER_SIZE 4096u\n#define RING_TAIL 64u\n#define MAX_OPCODE 0xFFFFu\n"
              "enum { CLIENT_GEN = 0, CLIENT_ACTIVE = 4, LIVENESS = 12,\n HOST_HEARTBEAT = 80 };\n"
              "enum { OP_AGENT_INFO = 6, STATUS_UNKNOWN_OPCODE = -2, HELPER_ANSWER_S = 60 };\n"
              "#define ASYNC_KEEP 256u\nenum { HOSTNAME = ORION_HELLO_REQ_hostname };\n")
    assert _spelled_wire_constants(before) == ["HEADER_SIZE", "RING_TAIL", "MAX_OPCODE", "CLIENT_GEN", "CLIENT_ACTIVE",
                                               "LIVENESS", "HOST_HEARTBEAT", "OP_AGENT_INFO", "STATUS_UNKNOWN_OPCODE"]


def test_every_entry_point_begins_with_its_account() -> None:
    """ORION_STATS counts every call a program makes (call_stats.h): each entry point the C defines begins with
    ORION_ENTRY and its own name, as the generator writes each generated one."""
    definition = re.compile(r"^(?:CUresult|int) (cu\w+)\(([^()]|\([^()]*\))*\)\s*\{\n(.*)", re.MULTILINE)
    found, bad = 0, []
    for path in sorted(NATIVE.glob("*.c")):
        for match in definition.finditer(path.read_text(encoding="utf-8")):
            found += 1
            if match[3].strip() != f'ORION_ENTRY("{match[1]}");':
                bad.append(f"{path.name}: {match[1]} begins with {match[3].strip()[:60]!r}")
    assert found > 150 and not bad, bad


def test_every_hand_written_call_has_exactly_one_c_definition() -> None:
    """Each call of the table the generator does not write, and each entry point answered in the guest outside it,
    is defined in one C file (the one api_classes.GUEST names, for those): what docs/api-table.md indexes."""
    assert hand_written_problems() == []
    index = hand_written()
    assert {name for name, (kind, _files) in index.items() if kind == HAND_WRITTEN} == \
        {name for name, call in CALLS.items() if not call.generic}
    assert index["cuLaunchKernelEx"][1] == ["launch_calls.c"]
    assert index["cuGetProcAddress"][1] == ["cuda_client.c"]  # defined as its ABI symbol, cuGetProcAddress_v2
    assert index["cuMemHostRegister"] == (OUTSIDE, ["page_locked_calls.c"])


def test_the_index_refuses_a_missing_or_doubled_definition(tmp_path: Path) -> None:
    (tmp_path / "a.c").write_text("CUresult cuLaunchKernelEx(const CUlaunchConfig *config,\n"
                                  "                          CUfunction f, void **params, void **extra) {\n}\n"
                                  "int cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t size); /* a prototype */\n"
                                  "CUresult cuCtxSetCurrent(CUcontext ctx) { return 0; }\n")
    (tmp_path / "b.c").write_text("int cuCtxSetCurrent(CUcontext ctx)\n{\n    return 0;\n}\n"
                                  "CUresult cuGetExportTable(const void **table, const CUuuid *id) { return 0; }\n")
    found = c_definitions(tmp_path)
    assert found == {"cuLaunchKernelEx": ["a.c"], "cuCtxSetCurrent": ["a.c", "b.c"], "cuGetExportTable": ["b.c"]}
    problems = "\n".join(hand_written_problems(found))
    assert "cuLaunchKernel (hand-written table calls): no C definition" in problems
    assert "cuLaunchKernelEx" not in problems.replace("cuLaunchKernelEx with", "")
    assert "cuCtxSetCurrent (generic calls written out): defined in 2 files: a.c, b.c" in problems
    assert "cuGetExportTable: api_classes.GUEST names export_tables.c, the C defines it in b.c" in problems


@pytest.mark.parametrize(("name", "header"), [("orion_guest.h", "orion_layouts.h"), ("orion_wire.c", "orion_region.h"),
                                              ("vgpu_lease.c", "orion_region.h")])
def test_the_hand_written_c_includes_the_generated_layouts(name: str, header: str) -> None:
    assert f'#include "{header}"' in (NATIVE / name).read_text()


def test_the_payload_layouts_include_the_region_layout() -> None:
    """orion_layouts.h has ORION_LENGTH_BYTES from orion_region.h, which the wire client includes alone."""
    assert '#include "orion_region.h"' in generate_layouts()
    assert "#define ORION_LENGTH_BYTES" not in generate_layouts()


def test_a_record_holds_the_cell_headers_fields_but_the_reserved_word() -> None:
    """record.Record and record.HEADER_FIELDS name the same fields in the same order (the generated ORION_RECORD_*
    names come from HEADER_FIELDS; the Python side reads cells into Record)."""
    from ivshmem import record

    assert record.Record._fields == (*record.HEADER_FIELDS[:-1], "payload")
