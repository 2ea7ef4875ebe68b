"""ivshmem/driver_api.py, the one contract of every forwarded call: held to the installed cuda-bindings wheel, to
both sides' handler registries, to the bytes that travel, and to docs/api-table.md."""
from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cuda.bindings import cydriver, driver

from guest_runtime.capsule_hook import capsule_signature
from guest_runtime.forward import GUEST, NATIVE_ONLY
from host_agent.session.executor import HOST, POLICY
from ivshmem.codec import SCALARS
from ivshmem.driver_api import (
    BY_OPCODE,
    CALLS,
    EFFECTS,
    ENUMS,
    HANDLES,
    IN,
    INOUT,
    OUT,
    PINNED_COPY,
    Handlers,
    describe,
    markdown,
    table_digest,
)
from ivshmem.record import CUDA_OPCODE_BASE

REPO = Path(__file__).resolve().parents[2]
SAMPLE = {"u8": 7, "u16": 7, "u32": 7, "u64": 7, "i32": -7, "i64": -7, "f32": 0.5, "f64": 0.5, "bytes": b"ab",
          "str": "ab", "u64[]": [1, 2], "tail": b"tail bytes", "[iQ]": [(1, 2)], "[i4x64s]": [(3, b"v" * 64)],
          "[Q]": [(1,), (2,)], "[I]": [(3,)], "[i]": [(-3,)], "[iii]": [(1, 0, 3)],
          "[iIQQ]": [(2, 1, 0x1000, 1 << 40)]}


def test_every_signature_is_the_installed_wheels() -> None:
    capi = cydriver.__pyx_capi__
    missing = [name for name in CALLS if name not in capi]
    assert not missing, f"not in cuda.bindings.cydriver: {missing}"
    wrong = {name: (call.signature, capsule_signature(capi[name])) for name, call in CALLS.items()
             if capsule_signature(capi[name]) != call.signature}
    assert not wrong, wrong


def test_every_enum_and_handle_type_is_the_wheels() -> None:
    used = {p.base for call in CALLS.values() for p in call.params}
    for name in used & (ENUMS | HANDLES):
        assert hasattr(driver, name), name


def test_opcodes_are_positions_and_unique() -> None:
    assert [call.opcode for call in CALLS.values()] == [CUDA_OPCODE_BASE + i for i in range(len(CALLS))]
    assert len(BY_OPCODE) == len(CALLS)


def test_a_generic_calls_payloads_are_its_in_and_out_parameters_packed() -> None:
    for call in CALLS.values():
        if not call.generic:
            continue
        ins = "".join(p.code for p in call.params if p.role in (IN, INOUT))  # a read-and-written pointer: both
        outs = "".join(p.code for p in call.params if p.role in (OUT, INOUT))
        assert call.request.scalars_only and call.request.fixed.format == "<" + ins, call.name
        assert call.reply.scalars_only and call.reply.fixed.format == "<" + outs, call.name


@pytest.mark.parametrize("name", [n for n, c in CALLS.items() if not c.generic and not c.answered_in_guest])
def test_a_hand_written_calls_declared_payloads_round_trip(name: str) -> None:
    call = CALLS[name]
    for schema in (call.request, call.reply, call.pinned):
        if schema is None:
            continue
        values = tuple(SAMPLE[kind] for _, kind in schema.fields)
        decoded = schema.decode(schema.encode(*values))
        assert [bytes(v) if isinstance(v, memoryview) else v for v in decoded] == list(values), schema.name


def test_the_bytes_on_the_wire_are_the_ones_both_sides_always_sent() -> None:
    """The declarations replaced hand-typed formats on both sides; these pin that the bytes did not move."""
    assert CALLS["cuMemHostAlloc"].request.encode(4096, 1) == struct.pack("<QI", 4096, 1)
    assert CALLS["cuPointerGetAttribute"].request.encode(2, 0xABC) == struct.pack("<iQ", 2, 0xABC)
    assert CALLS["cuPointerGetAttribute"].reply.encode(5, 4) == struct.pack("<QI", 5, 4)
    assert CALLS["cuMemPoolSetAttribute"].request.encode(9, 4, 1 << 40) == struct.pack("<QiQ", 9, 4, 1 << 40)
    assert CALLS["cuMemcpyHtoDAsync"].request.encode(1, 3, 2, b"abc") == struct.pack("<QQQ", 1, 3, 2) + b"abc"
    assert CALLS["cuMemcpyDtoH"].pinned.encode(1, 8, 0x7000) == struct.pack("<QQQ", 1, 8, 0x7000)  # type: ignore[union-attr]
    assert CALLS["cuModuleGetGlobal"].request.encode(5, b"name") == struct.pack("<Q", 5) + b"name"
    assert CALLS["cuModuleLoadDataEx"].request.encode([(0, 32)], b"IMG") == \
        struct.pack("<I", 1) + struct.pack("<iQ", 0, 32) + b"IMG"
    head = (1, 2, 3, 4, 5, 6, 7, 8, 9)
    attribute = struct.pack("<i4x64s", 7, bytes(64))
    assert CALLS["cuLaunchKernelEx"].request.encode(*head, attribute, b"P") == \
        struct.pack("<QIIIIIIIQ", *head) + struct.pack("<I", 1) + attribute + b"P"
    assert CALLS["cuOccupancyMaxPotentialBlockSizeWithFlags"].request.encode(1, 2, 3, 4) == \
        struct.pack("<QQiI", 1, 2, 3, 4)


def test_each_side_serves_what_the_table_cannot_marshal_and_nothing_else() -> None:
    hand_written = {name for name, call in CALLS.items() if not call.generic}
    travelling = {name for name, call in CALLS.items() if not call.answered_in_guest}
    guest = set(GUEST.by_name) | NATIVE_ONLY  # the capsule path answers 801 for the native-only ones
    assert not set(GUEST.by_name) & NATIVE_ONLY
    assert hand_written <= guest, sorted(hand_written - guest)
    assert hand_written & travelling <= set(HOST.by_name), sorted(hand_written & travelling - set(HOST.by_name))
    assert set(HOST.by_name) <= travelling  # the host never writes out a call it can never receive
    assert set(HOST.by_name) <= guest  # what the host decodes by hand, the guest encodes by hand
    assert all(CALLS[name].generic for name in POLICY.by_name)  # policies decide generic calls only
    for name in set(HOST.by_name) - hand_written:  # generic on the table, written out on the host: none
        pytest.fail(f"{name} is generic but the host writes it out")


def test_a_registry_refuses_unknown_and_doubly_served_calls() -> None:
    side = Handlers("test")
    with pytest.raises(KeyError, match="cuNoSuchCall, which is not in the call table"):
        side.serves("cuNoSuchCall")(lambda: None)
    side.serves("cuInit")(lambda: None)
    with pytest.raises(ValueError, match="cuInit is served by both"):
        side.serves("cuInit")(lambda: None)


def test_effects_are_declared_where_both_sides_rely_on_them() -> None:
    by_effect: dict[str, set[str]] = {word: set() for word in EFFECTS}
    for call in CALLS.values():
        for word in call.effects:
            by_effect[word].add(call.name)
    assert by_effect["allocates"] == {"cuMemAlloc", "cuMemAllocAsync", "cuMemAllocFromPoolAsync"}
    assert by_effect["frees"] == {"cuMemFree", "cuMemFreeAsync"}
    assert by_effect["unloads"] == {"cuModuleUnload", "cuLibraryUnload"}
    for name in by_effect["destroys"]:  # the handle it destroys is its first parameter
        assert CALLS[name].params[0].ctype in HANDLES, name
    for name in by_effect["allocates"]:
        assert CALLS[name].output_types[0] == "CUdeviceptr" and CALLS[name].input_types[0] == "size_t", name


def test_the_pinned_variants_are_the_four_host_copies() -> None:
    assert {name for name, call in CALLS.items() if call.pinned is not None} == {
        "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync"}
    assert all(call.opcode + PINNED_COPY not in BY_OPCODE for call in CALLS.values())


def test_the_table_is_machine_readable() -> None:
    out = subprocess.run([sys.executable, "-m", "ivshmem.driver_api", "json"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    table: dict[str, Any] = json.loads(out)
    assert [c["name"] for c in table["calls"]] == list(CALLS)
    launch = next(c for c in table["calls"] if c["name"] == "cuLaunchKernel")
    assert launch["posted"] and launch["request"][-1] == {"name": "params", "kind": "tail"}
    kinds = {f["kind"] for c in table["calls"] for f in c["request"] + c["reply"]}
    assert kinds <= set(SAMPLE), kinds  # a generator needs to know every kind it meets
    assert table == json.loads(json.dumps(describe()))


def test_the_digest_covers_the_whole_contract() -> None:
    digest = table_digest()
    assert len(digest) == 16 and int(digest, 16) >= 0
    assert f"`{digest}`" in markdown()


def test_docs_api_table_is_generated_from_the_table() -> None:
    """The table's page and, last, where each hand-written call's C lives (gen_libcuda scans the C files)."""
    from guest_runtime.native.gen_libcuda import api_table_page
    page = (REPO / "docs" / "api-table.md").read_text()
    assert page == api_table_page(), ("docs/api-table.md is stale: run `.venv/bin/python -m "
                                      "guest_runtime.native.gen_libcuda --api-table > docs/api-table.md`")


def test_codec_kinds_cover_the_scalar_codes_of_the_table() -> None:
    codes = {p.code for call in CALLS.values() for p in call.params if p.role in (IN, OUT)}
    assert codes <= set(SCALARS.values())


def test_the_native_drivers_forwarding_layer_opcodes_are_the_tables() -> None:
    """guest_runtime/native/orion_guest.h spells the forwarding layer's own opcodes by hand: each must be the value
    both hosts decode (driver_api's <NAME>_OPCODE), every one of driver_api's must be spelled, and so must the
    pinned-copy bit."""
    from ivshmem import driver_api
    header = (REPO / "guest_runtime" / "native" / "orion_guest.h").read_text()
    spelled = {name: int(value, 0) for name, value in re.findall(r"ORION_OP_([A-Z_]+) = (0x[0-9A-Fa-f]+)", header)}
    tables = {name[:-len("_OPCODE")]: value for name, value in vars(driver_api).items()
              if name.endswith("_OPCODE") and isinstance(value, int)
              and name != "POOL_MIRROR_OPCODE"}  # a relaying oriond's own, never a guest's
    assert spelled == tables
    assert int(re.search(r"ORION_PINNED_COPY = (0x[0-9A-Fa-f]+)", header).group(1), 0) == driver_api.PINNED_COPY
