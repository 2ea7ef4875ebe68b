"""Payload codec shared by every transport (ivshmem rings now, TCP and RDMA streams later).

A payload is a fixed struct of scalars followed by the variable-length fields in declaration order, each
a u32 length (an item count for arrays) and its bytes. Decoding checks every length against the bytes
actually present, so a hostile payload can make a reader raise RecordError but never over-read.
"""
from __future__ import annotations

import struct
from typing import Any

from .errors import RecordError

SCALARS = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q", "i32": "i", "i64": "q", "f64": "d"}
VARIABLE = ("bytes", "str", "u64[]")
_LEN = struct.Struct("<I")


class Schema:
    """The shape of one payload, e.g. ``Schema("HELLO", ("protocol", "u32"), ("host", "str"))``."""

    def __init__(self, name: str, *fields: tuple[str, str]) -> None:
        for field, kind in fields:
            if kind not in SCALARS and kind not in VARIABLE:
                raise ValueError(f"{name}.{field}: unknown kind {kind!r}")
        self.name = name
        self.fields = fields
        self._order = [i for i, (_, k) in enumerate(fields) if k in SCALARS] + \
                      [i for i, (_, k) in enumerate(fields) if k in VARIABLE]
        self._fixed = struct.Struct("<" + "".join(SCALARS[k] for _, k in fields if k in SCALARS))
        self._variable = [k for _, k in fields if k in VARIABLE]

    def encode(self, *values: Any) -> bytes:
        if len(values) != len(self.fields):
            raise TypeError(f"{self.name} takes {len(self.fields)} values, got {len(values)}")
        ordered = [values[i] for i in self._order]
        nfixed = len(self._fixed.format) - 1
        try:
            parts = [self._fixed.pack(*ordered[:nfixed])]
        except struct.error as exc:
            raise RecordError(f"{self.name}: value out of range: {exc}") from None
        for kind, value in zip(self._variable, ordered[nfixed:], strict=True):
            try:
                if kind == "u64[]":
                    parts.append(_LEN.pack(len(value)))
                    parts.append(struct.pack(f"<{len(value)}Q", *value))
                    continue
                raw = value.encode() if kind == "str" else bytes(value)  # bytes() of a typed view: its bytes
            except (struct.error, UnicodeEncodeError, TypeError) as exc:
                raise RecordError(f"{self.name}: cannot encode a {kind} field: {exc}") from None
            parts.append(_LEN.pack(len(raw)))
            parts.append(raw)
        return b"".join(parts)

    def decode(self, payload: bytes | bytearray | memoryview) -> tuple[Any, ...]:
        view = memoryview(payload)
        size = self._fixed.size
        if len(view) < size:
            raise RecordError(f"{self.name}: payload of {len(view)} bytes is shorter than its {size} fixed bytes")
        out: list[Any] = list(self._fixed.unpack_from(view, 0))
        pos = size
        for kind in self._variable:
            if pos + 4 > len(view):
                raise RecordError(f"{self.name}: payload ends inside a length field at byte {pos}")
            (count,) = _LEN.unpack_from(view, pos)
            pos += 4
            width = count * 8 if kind == "u64[]" else count
            if pos + width > len(view):
                raise RecordError(f"{self.name}: a field of {width} bytes at byte {pos} runs past the "
                                  f"{len(view)}-byte payload")
            chunk = view[pos:pos + width]
            pos += width
            if kind == "bytes":
                out.append(bytes(chunk))
            elif kind == "str":
                try:
                    out.append(str(chunk, "utf-8"))
                except UnicodeDecodeError:
                    raise RecordError(f"{self.name}: a text field is not UTF-8") from None
            else:
                out.append(list(struct.unpack_from(f"<{count}Q", chunk)))
        if pos != len(view):
            raise RecordError(f"{self.name}: {len(view) - pos} unexpected bytes after the last field")
        result: list[Any] = [None] * len(out)
        for slot, value in zip(self._order, out, strict=True):
            result[slot] = value
        return tuple(result)
