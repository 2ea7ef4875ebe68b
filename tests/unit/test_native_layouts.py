"""The native guest driver's hand-written C against the call table, read as text (no compiler needed):

* orion_layouts.h (gen_libcuda.generate_layouts) places every field where the codec packs it;
* the hand-written C takes payload offsets and sizes from it, never literal ones (a scan for the spellings that
  used to be there: `orion_put_u64(req + 8, ...)`, `uint8_t req[12]`);
* each hand-written call of the table has exactly one C definition, and docs/api-table.md's index of them is
  gen_libcuda's (tests/unit/test_driver_api.py holds the page to `api_table_page()`).
"""
from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from guest_runtime.native.gen_libcuda import (
    EMBEDDED,
    FORWARDING_LAYER,
    HAND_WRITTEN,
    OUTSIDE,
    c_definitions,
    generate_layouts,
    hand_written,
    hand_written_problems,
)
from ivshmem.codec import SCALARS, Schema
from ivshmem.driver_api import CALLS, LAUNCH_ATTRIBUTE

NATIVE = Path(__file__).resolve().parents[2] / "guest_runtime" / "native"
# Bytes that are no call-table payload: the wire's own records (the region header, record cells and HELLO:
# orion_wire.c, after ivshmem/layout.py and record.py; the agent's AGENT_INFO and BIND: vgpu_lease.c), and SHA-256's
# own padding (sha256.c).
NOT_CALL_PAYLOADS = frozenset({"orion_wire.c", "vgpu_lease.c", "sha256.c"})
# The names the C gives a request's or reply's bytes (`raw` is a copy of a cuda.h struct: cuda.h's layout, not ours).
BUFFER = r"(?:req|rep|request|reply|head|prefix|p|payload|fixed|tail|buffer|items|at|listed)"
LITERAL_OFFSET = re.compile(rf"orion_(?:put|get)_(?:u8|u16|u32|i32|u64|f32)\(\s*{BUFFER}\s*\+\s*[0-9]")
LITERAL_SIZE = re.compile(rf"uint8_t\s+{BUFFER}\s*\[\s*[0-9]")


def _defines() -> dict[str, int]:
    return {name: int(value) for name, value in re.findall(r"^#define (ORION_\w+) (\d+)$", generate_layouts(), re.M)}


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
                 "*x = orion_get_u64(rep + 4);", "uint8_t head[16 + KERNEL_NODE_BYTES + 4];"):
        assert LITERAL_OFFSET.search(line) or LITERAL_SIZE.search(line), line
    for line in ("orion_put_u64(req + ORION_REQ_cuMemCreate_size, size);", "uint8_t raw[24];",
                 "uint8_t req[ORION_REQ_cuCtxCreate_SIZE], rep[ORION_REP_cuCtxCreate_SIZE];"):
        assert not (LITERAL_OFFSET.search(line) or LITERAL_SIZE.search(line)), line


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


@pytest.mark.parametrize("name", ["orion_guest.h"])
def test_the_hand_written_c_includes_the_generated_layouts(name: str) -> None:
    assert '#include "orion_layouts.h"' in (NATIVE / name).read_text()
