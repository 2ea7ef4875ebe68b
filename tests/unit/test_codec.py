"""ivshmem.codec.Schema: round trips over every kind, and hostile payloads only ever raise RecordError."""
from __future__ import annotations

import math
import struct

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ivshmem.codec import SCALARS, VARIABLE, Schema
from ivshmem.errors import RecordError
from ivshmem.record import DRAIN_REPLY, FILL_REQUEST, HELLO_REPLY, HELLO_REQUEST

SETTINGS = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
ARRAY = "[iQ]"  # a struct array: (i32, u64) items
KINDS = sorted(SCALARS) + [k for k in VARIABLE if k != "tail"] + [ARRAY]  # a tail may only end a schema: below

VALUES = {
    "u8": st.integers(0, 2**8 - 1),
    "u16": st.integers(0, 2**16 - 1),
    "u32": st.integers(0, 2**32 - 1),
    "u64": st.integers(0, 2**64 - 1),
    "i32": st.integers(-(2**31), 2**31 - 1),
    "i64": st.integers(-(2**63), 2**63 - 1),
    "f32": st.floats(width=32, allow_nan=False),
    "f64": st.floats(allow_nan=True, allow_infinity=True),
    "bytes": st.binary(max_size=300),
    "str": st.text(max_size=100),
    "u64[]": st.lists(st.integers(0, 2**64 - 1), max_size=40),
    ARRAY: st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), st.integers(0, 2**64 - 1)), max_size=20),
}


@st.composite
def schemas_and_values(draw: st.DrawFn) -> tuple[Schema, tuple]:
    kinds = draw(st.lists(st.sampled_from(KINDS), max_size=8))
    schema = Schema("T", *[(f"f{i}", kind) for i, kind in enumerate(kinds)])
    values = tuple(draw(VALUES[kind]) for kind in kinds)
    return schema, values


def same(kind: str, a: object, b: object) -> bool:
    if kind == "f64":  # NaN != NaN: compare bit patterns
        return struct.pack("<d", a) == struct.pack("<d", b)  # type: ignore[arg-type]
    return a == b


@SETTINGS
@given(schemas_and_values())
def test_round_trip(sv: tuple[Schema, tuple]) -> None:
    schema, values = sv
    encoded = schema.encode(*values)
    decoded = schema.decode(encoded)
    assert len(decoded) == len(values)
    for (_, kind), a, b in zip(schema.fields, values, decoded, strict=True):
        assert same(kind, a, b), (kind, a, b)
        if kind in ("bytes", "str", "u64[]", ARRAY):
            assert type(b) is type(a) or (kind in ("u64[]", ARRAY) and isinstance(b, list))
    assert schema.decode(memoryview(encoded)) == decoded or any(k == "f64" for _, k in schema.fields)


def test_layout_is_fixed_scalars_then_variable_fields_in_order() -> None:
    schema = Schema("X", ("name", "str"), ("a", "u8"), ("ids", "u64[]"), ("b", "i32"), ("blob", "bytes"))
    raw = schema.encode("hé", 7, [1, 2], -2, b"xyz")
    assert raw == (struct.pack("<Bi", 7, -2) + struct.pack("<I", 3) + "hé".encode() +
                   struct.pack("<I", 2) + struct.pack("<QQ", 1, 2) + struct.pack("<I", 3) + b"xyz")
    assert schema.decode(raw) == ("hé", 7, [1, 2], -2, b"xyz")


def test_wire_schemas_match_the_doc() -> None:
    assert HELLO_REQUEST.encode(2, 42, "h", "t") == struct.pack("<IIIs", 2, 42, 1, b"h") + struct.pack("<I", 1) + b"t"
    assert HELLO_REPLY.encode("agent", 9) == struct.pack("<QI", 9, 5) + b"agent"
    assert DRAIN_REPLY.encode(10, 0xDEADBEEF) == struct.pack("<QI", 10, 0xDEADBEEF)
    assert FILL_REQUEST.encode(1 << 33, 7) == struct.pack("<QI", 1 << 33, 7)


@SETTINGS
@given(schemas_and_values(), st.data())
def test_every_truncation_is_refused(sv: tuple[Schema, tuple], data: st.DataObject) -> None:
    schema, values = sv
    encoded = schema.encode(*values)
    assume(len(encoded) > 0)
    cut = data.draw(st.integers(0, len(encoded) - 1), label="cut")
    with pytest.raises(RecordError):
        schema.decode(encoded[:cut])


@SETTINGS
@given(schemas_and_values(), st.binary(min_size=1, max_size=40))
def test_trailing_bytes_are_refused(sv: tuple[Schema, tuple], extra: bytes) -> None:
    schema, values = sv
    with pytest.raises(RecordError, match="unexpected bytes"):
        schema.decode(schema.encode(*values) + extra)


@SETTINGS
@given(schemas_and_values(), st.data())
def test_a_length_running_past_the_end_is_refused(sv: tuple[Schema, tuple], data: st.DataObject) -> None:
    schema, values = sv
    kinds = [kind for _, kind in schema.fields if kind not in SCALARS]
    assume(kinds)
    encoded = bytearray(schema.encode(*values))
    # walk to the length word of the chosen variable field
    which = data.draw(st.integers(0, len(kinds) - 1), label="field")
    widths = {"u64[]": 8, ARRAY: 12}
    pos = schema.fixed.size
    for kind in kinds[:which]:
        (count,) = struct.unpack_from("<I", encoded, pos)
        pos += 4 + count * widths.get(kind, 1)
    width = widths.get(kinds[which], 1)
    remaining = len(encoded) - pos - 4
    lie = data.draw(st.integers(remaining // width + 1, 2**32 - 1), label="lie")
    struct.pack_into("<I", encoded, pos, lie)
    with pytest.raises(RecordError, match="runs past"):
        schema.decode(bytes(encoded))


@SETTINGS
@given(st.lists(st.sampled_from(KINDS), max_size=6), st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_record_error(kinds: list[str], raw: bytes) -> None:
    schema = Schema("T", *[(f"f{i}", kind) for i, kind in enumerate(kinds)])
    try:
        decoded = schema.decode(raw)
    except RecordError:
        return
    # accepted: then it is exactly the encoding of what it decoded to (no slack, no over-read)
    values = tuple(decoded)
    assert len(values) == len(kinds)
    reencoded = schema.encode(*values)
    assert reencoded == raw or any(k in ("f32", "f64") and math.isnan(v) for k, v in zip(kinds, values, strict=True))


@pytest.mark.parametrize("raw", [b"", b"\x01", b"\x01\x00\x00", b"\x05\x00\x00\x00abcd", b"\xff\xff\xff\xff"])
def test_short_and_lying_bytes_field(raw: bytes) -> None:
    with pytest.raises(RecordError):
        Schema("B", ("blob", "bytes")).decode(raw)


def test_huge_u64_array_count_is_refused_without_allocating() -> None:
    with pytest.raises(RecordError, match="runs past"):
        Schema("A", ("ids", "u64[]")).decode(struct.pack("<I", 0xFFFFFFFF) + bytes(16))


def test_text_that_is_not_utf8_is_refused() -> None:
    with pytest.raises(RecordError, match="UTF-8"):
        Schema("S", ("s", "str")).decode(struct.pack("<I", 2) + b"\xff\xfe")


def test_fixed_part_too_short() -> None:
    with pytest.raises(RecordError, match="shorter"):
        FILL_REQUEST.decode(bytes(11))
    with pytest.raises(RecordError, match="unexpected bytes"):
        FILL_REQUEST.decode(bytes(13))


@pytest.mark.parametrize("kind,value", [("u8", 256), ("u16", -1), ("u32", 2**32), ("i32", 2**31), ("u64", -1)])
def test_encode_refuses_out_of_range_scalars(kind: str, value: int) -> None:
    with pytest.raises(RecordError, match="out of range"):
        Schema("E", ("v", kind)).encode(value)


def test_encode_checks_the_number_of_values() -> None:
    with pytest.raises(TypeError):
        FILL_REQUEST.encode(1)


def test_unknown_kind_is_refused_at_definition() -> None:
    with pytest.raises(ValueError, match="unknown kind"):
        Schema("K", ("v", "u128"))


def test_encode_refuses_out_of_range_u64_array_items_like_scalars() -> None:
    schema = Schema("E", ("ids", "u64[]"))
    try:
        schema.encode([2**64])
    except RecordError:
        return
    except struct.error as exc:
        raise AssertionError(f"struct.error leaked out of Schema.encode: {exc}") from None
    raise AssertionError("an out-of-range u64[] item was encoded")


def test_a_tail_is_the_rest_of_the_payload_without_a_length() -> None:
    schema = Schema("T", ("dst", "u64"), ("options", ARRAY), ("data", "tail"))
    raw = schema.encode(5, [(1, 2)], b"payload")
    assert raw == struct.pack("<QI", 5, 1) + struct.pack("<iQ", 1, 2) + b"payload"
    dst, options, data = schema.decode(raw)
    assert (dst, options, bytes(data)) == (5, [(1, 2)], b"payload")
    assert isinstance(data, memoryview)  # a view of the payload: a large copy is not copied again
    assert bytes(schema.decode(raw + b"more")[2]) == b"payloadmore"  # everything after the fields is the tail
    with pytest.raises(RecordError, match="runs past"):
        schema.decode(raw[:13])  # cut inside the array


def test_a_struct_array_encodes_from_packed_items_too() -> None:
    schema = Schema("A", ("items", ARRAY))
    packed = struct.pack("<iQiQ", 1, 2, 3, 4)
    assert schema.encode(packed) == schema.encode([(1, 2), (3, 4)])
    with pytest.raises(RecordError, match="whole 12-byte items"):
        schema.encode(packed[:-1])


def test_a_tail_must_be_the_last_field() -> None:
    with pytest.raises(ValueError, match="last field"):
        Schema("T", ("data", "tail"), ("n", "u32"))
