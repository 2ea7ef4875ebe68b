"""Payload codec shared by every transport (ivshmem rings now, TCP and RDMA streams later).

A payload is a fixed struct of scalars followed by the variable-length fields in declaration order:
`bytes`, `str` and `u64[]` as a u32 length (an item count for arrays) and their bytes; a struct array
`[fmt]` (e.g. `[iQ]`) as a u32 item count and the packed items; and at most one `tail`, the last field,
which is the rest of the payload with no length (a copy's data, a module image, a kernel's parameters:
what a sender may stream straight from its source and a receiver take straight into its destination).
Decoding checks every length against the bytes actually present, so a hostile payload can make a reader
raise RecordError but never over-read.

The fixed part is a compiled `struct.Struct` (`Schema.fixed`): hot paths pack and unpack it directly.
"""
from __future__ import annotations

import re
import struct
from typing import Any

from .errors import RecordError

SCALARS = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q", "i32": "i", "i64": "q", "f32": "f", "f64": "d"}
VARIABLE = ("bytes", "str", "u64[]", "tail")
_ARRAY = re.compile(r"\[([bBhHiIqQfdx0-9s]+)\]")  # a struct array: its item's struct codes
LENGTH = struct.Struct("<I")  # the u32 length (`bytes`, `str`) or item count (arrays) before a variable field
_LEN = LENGTH


def _is_variable(kind: str) -> bool:
    return kind in VARIABLE or _ARRAY.fullmatch(kind) is not None


class Schema:
    """The shape of one payload, e.g. ``Schema("HELLO", ("protocol", "u32"), ("host", "str"))``."""

    def __init__(self, name: str, *fields: tuple[str, str]) -> None:
        for position, (field, kind) in enumerate(fields):
            if kind not in SCALARS and not _is_variable(kind):
                raise ValueError(f"{name}.{field}: unknown kind {kind!r}")
            if kind == "tail" and position != len(fields) - 1:
                raise ValueError(f"{name}.{field}: a tail must be the last field")
        self.name = name
        self.fields = fields
        self._order = [i for i, (_, k) in enumerate(fields) if k in SCALARS] + \
                      [i for i, (_, k) in enumerate(fields) if k not in SCALARS]
        self.fixed = struct.Struct("<" + "".join(SCALARS[k] for _, k in fields if k in SCALARS))
        self._nfixed = sum(1 for _, k in fields if k in SCALARS)
        self._variable = [k for _, k in fields if k not in SCALARS]
        self._items = {k: struct.Struct("<" + m.group(1)) for k in self._variable if (m := _ARRAY.fullmatch(k))}
        self.scalars_only = not self._variable
        self.has_tail = bool(fields) and fields[-1][1] == "tail"
        # Most payloads are scalars, or scalars then a tail: those encode and decode with the compiled struct
        # alone (a generic pass costs microseconds, which a forwarded call's round trip notices).
        if self.scalars_only:
            self.encode, self.decode = self._encode_scalars, self._decode_scalars  # type: ignore[method-assign]
        elif self._variable == ["tail"]:
            self.encode, self.decode = self._encode_tailed, self._decode_tailed  # type: ignore[method-assign]

    def _encode_scalars(self, *values: Any) -> bytes:
        try:
            return self.fixed.pack(*values)
        except struct.error:
            return self._encode_all(*values)  # the same error as the general path says

    def _decode_scalars(self, payload: bytes | bytearray | memoryview) -> tuple[Any, ...]:
        if len(payload) != self.fixed.size:
            return self._decode_all(payload)  # raises the general path's RecordError
        return self.fixed.unpack(payload)

    def _encode_tailed(self, *values: Any) -> bytes:
        try:
            return b"".join((self.fixed.pack(*values[:-1]), values[-1]))  # the tail copied once, not twice
        except (struct.error, TypeError, IndexError):
            return self._encode_all(*values)

    def _decode_tailed(self, payload: bytes | bytearray | memoryview) -> tuple[Any, ...]:
        size = self.fixed.size
        if len(payload) < size:
            return self._decode_all(payload)
        view = memoryview(payload)
        return (*self.fixed.unpack_from(view, 0), view[size:])

    def encode(self, *values: Any) -> bytes:
        return self._encode_all(*values)

    def _encode_all(self, *values: Any) -> bytes:
        if len(values) != len(self.fields):
            raise TypeError(f"{self.name} takes {len(self.fields)} values, got {len(values)}")
        ordered = [values[i] for i in self._order]
        try:
            parts = [self.fixed.pack(*ordered[:self._nfixed])]
        except struct.error as exc:
            raise RecordError(f"{self.name}: value out of range: {exc}") from None
        for kind, value in zip(self._variable, ordered[self._nfixed:], strict=True):
            try:
                parts.extend(self._encode_variable(kind, value))
            except (struct.error, UnicodeEncodeError, TypeError, ValueError) as exc:
                raise RecordError(f"{self.name}: cannot encode a {kind} field: {exc}") from None
        return b"".join(parts)

    def _encode_variable(self, kind: str, value: Any) -> list[bytes]:
        if kind == "tail":
            return [bytes(value)]
        if kind == "u64[]":
            return [_LEN.pack(len(value)), struct.pack(f"<{len(value)}Q", *value)]
        item = self._items.get(kind)
        if item is not None:  # items as tuples, or already packed as bytes
            if isinstance(value, bytes | bytearray | memoryview):
                raw = bytes(value)
                if len(raw) % item.size:
                    raise ValueError(f"{len(raw)} bytes are not whole {item.size}-byte items")
                return [_LEN.pack(len(raw) // item.size), raw]
            return [_LEN.pack(len(value)), b"".join(item.pack(*v) for v in value)]
        raw = value.encode() if kind == "str" else bytes(value)  # bytes() of a typed view: its bytes
        return [_LEN.pack(len(raw)), raw]

    def encode_head(self, *values: Any) -> bytes:
        """Every field but the tail, encoded: what precedes a tail its sender streams from where it lies."""
        if not self.has_tail:
            raise TypeError(f"{self.name} has no tail")
        return self._encode_all(*values, b"")

    def decode(self, payload: bytes | bytearray | memoryview) -> tuple[Any, ...]:
        """The field values in declaration order. A `tail` is a view of `payload` (no copy)."""
        return self._decode_all(payload)

    def _decode_all(self, payload: bytes | bytearray | memoryview) -> tuple[Any, ...]:
        view = memoryview(payload)
        size = self.fixed.size
        if len(view) < size:
            raise RecordError(f"{self.name}: payload of {len(view)} bytes is shorter than its {size} fixed bytes")
        out: list[Any] = list(self.fixed.unpack_from(view, 0))
        pos = size
        for kind in self._variable:
            if kind == "tail":
                out.append(view[pos:])
                pos = len(view)
                continue
            if pos + 4 > len(view):
                raise RecordError(f"{self.name}: payload ends inside a length field at byte {pos}")
            (count,) = _LEN.unpack_from(view, pos)
            pos += 4
            item = self._items.get(kind)
            width = count * (8 if kind == "u64[]" else item.size if item is not None else 1)
            if pos + width > len(view):
                raise RecordError(f"{self.name}: a field of {width} bytes at byte {pos} runs past the "
                                  f"{len(view)}-byte payload")
            out.append(self._decode_variable(kind, item, count, view[pos:pos + width]))
            pos += width
        if pos != len(view):
            raise RecordError(f"{self.name}: {len(view) - pos} unexpected bytes after the last field")
        result: list[Any] = [None] * len(out)
        for slot, value in zip(self._order, out, strict=True):
            result[slot] = value
        return tuple(result)

    def _decode_variable(self, kind: str, item: struct.Struct | None, count: int, chunk: memoryview) -> Any:
        if kind == "bytes":
            return bytes(chunk)
        if kind == "str":
            try:
                return str(chunk, "utf-8")
            except UnicodeDecodeError:
                raise RecordError(f"{self.name}: a text field is not UTF-8") from None
        if item is not None:
            return list(item.iter_unpack(chunk))
        return list(struct.unpack_from(f"<{count}Q", chunk))

    def offsets(self) -> dict[str, int]:
        """Where each field whose place is fixed begins in an encoded payload: every scalar, at its offset in `fixed`
        (the scalars packed in declaration order, no padding), and the first variable field, which begins where
        `fixed` ends (its u32 length or count; a tail's first byte). A later variable field's place depends on
        the values before it. Read from `fixed`'s own format, so it cannot disagree with what `encode` writes."""
        codes = self.fixed.format[1:]
        offsets: dict[str, int] = {}
        scalar = 0
        for field, kind in self.fields:
            if kind in SCALARS:
                offsets[field] = struct.calcsize("<" + codes[:scalar])
                scalar += 1
        variable = [field for field, kind in self.fields if kind not in SCALARS]
        if variable:
            offsets[variable[0]] = self.fixed.size
        return offsets

    def item(self, field: str) -> struct.Struct | None:
        """The packed item of an array field (`[fmt]`, `u64[]`), else None."""
        kind = dict(self.fields)[field]
        return struct.Struct("<Q") if kind == "u64[]" else self._items.get(kind)

    def describe(self) -> list[dict[str, str]]:
        """The fields as data (name, kind), for generators and docs."""
        return [{"name": field, "kind": kind} for field, kind in self.fields]


_MEMBER = re.compile(r"(\d*)([xcbB?hHiIlLqQnNefdspP])")


def members(layout: struct.Struct) -> list[tuple[int, int]]:
    """(offset, size) of each value `layout` packs, in order, read from its own format: pad bytes (`x`) skipped, a
    string (`8s`) one value, a repeated code (`3I`) one value each. For the generators that give C a struct's places
    (gen_libcuda.py), so they name offsets rather than spell them."""
    fmt = layout.format.replace(" ", "")
    order, body = (fmt[0], fmt[1:]) if fmt[:1] in "@=<>!" else ("@", fmt)
    if "".join(m[0] for m in _MEMBER.finditer(body)) != body:
        raise ValueError(f"{layout.format!r}: not a format members() reads")
    found: list[tuple[int, int]] = []
    before = order
    for count, code in _MEMBER.findall(body):
        repeat = 1 if code in "sp" else int(count or 1)
        one = (count if code in "sp" else "") + code
        for _ in range(repeat):
            if code != "x":
                size = struct.calcsize(order + one)
                found.append((struct.calcsize(before + one) - size, size))
            before += one
    return found


def field_kind(code: str) -> str:
    """The schema kind of a struct code ('i' -> 'i32')."""
    for kind, scalar in SCALARS.items():
        if scalar == code:
            return kind
    raise KeyError(code)

