"""A ctypes view of the native wire client (orion_wire.h), for tests and benchmarks on the host.

Programs do not use this: the wire client is part of libcuda.so.1, the native guest driver, which C code loads. It
exists so Python can drive the C client against a real served region and compare it with ClientChannel.
"""
from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Sequence

ERRORS = {-1: "ARG", -2: "REGION", -3: "PEER_GONE", -4: "NO_CHANNEL", -5: "TOO_LARGE", -6: "PROTOCOL",
          -7: "REFUSED", -8: "CLOSED", -9: "SYSTEM"}
ERRLEN = 1024
# What a request piece or a reply buffer may be: bytes are read in place, the others must be writable buffers
# (bytearray, a writable memoryview, an mmap) or ctypes arrays; none is copied.
Buffer = bytes | bytearray | memoryview | mmap.mmap | ctypes.Array  # type: ignore[type-arg]


class Piece(ctypes.Structure):
    """struct orion_piece: one piece of a request payload, where it lies."""

    _fields_ = [("data", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _address(buffer: Buffer) -> tuple[int, int, object]:
    """(address, length, the object that keeps the memory alive) of `buffer`, without copying it."""
    if isinstance(buffer, bytes):
        pointer = ctypes.c_char_p(buffer)  # points into the bytes object itself
        return ctypes.cast(pointer, ctypes.c_void_p).value or 0, len(buffer), pointer
    if isinstance(buffer, ctypes.Array):
        return ctypes.addressof(buffer), ctypes.sizeof(buffer), buffer
    view = memoryview(buffer).cast("B")
    if view.readonly:
        raise TypeError("a read-only buffer other than bytes cannot be passed without a copy; pass bytes")
    array = (ctypes.c_char * len(view)).from_buffer(view)
    return ctypes.addressof(array), len(view), array


class NativeWireError(Exception):
    """A non-zero return of the C client; `code` is its ORION_E_* name, the message its error text."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = ERRORS.get(code, str(code))


def load(path: str | os.PathLike[str]) -> ctypes.CDLL:
    """Load the built library and declare the signatures of orion_wire.h."""
    lib = ctypes.CDLL(os.fspath(path))
    p, c_char_p, size_t = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
    lib.orion_open_ex.argtypes = [c_char_p, ctypes.c_double, ctypes.c_double, ctypes.POINTER(p), c_char_p, size_t]
    lib.orion_open_ex.restype = ctypes.c_int
    lib.orion_hello.argtypes = [p, c_char_p, ctypes.POINTER(ctypes.c_uint64)]
    lib.orion_hello.restype = ctypes.c_int
    lib.orion_call.argtypes = [p, ctypes.c_uint32, p, size_t, ctypes.POINTER(ctypes.c_int32), p, size_t,
                               ctypes.POINTER(size_t)]
    lib.orion_call.restype = ctypes.c_int
    lib.orion_post.argtypes = [p, ctypes.c_uint32, p, size_t]
    lib.orion_post.restype = ctypes.c_int
    lib.orion_callv.argtypes = [p, ctypes.c_uint32, ctypes.POINTER(Piece), ctypes.c_int,
                                ctypes.POINTER(ctypes.c_int32), p, size_t, p, size_t, ctypes.POINTER(size_t)]
    lib.orion_callv.restype = ctypes.c_int
    lib.orion_postv.argtypes = [p, ctypes.c_uint32, ctypes.POINTER(Piece), ctypes.c_int]
    lib.orion_postv.restype = ctypes.c_int
    lib.orion_take_async_error.argtypes = [p, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32),
                                           ctypes.POINTER(ctypes.c_int32)]
    lib.orion_take_async_error.restype = ctypes.c_int
    lib.orion_last_call_id.argtypes = [p]
    lib.orion_last_call_id.restype = ctypes.c_uint64
    lib.orion_close.argtypes = [p]
    lib.orion_close.restype = None
    lib.orion_error.argtypes = [p]
    lib.orion_error.restype = c_char_p
    lib.orion_channel_index.argtypes = [p]
    lib.orion_channel_index.restype = ctypes.c_int
    lib.orion_generation.argtypes = [p]
    lib.orion_generation.restype = ctypes.c_uint32
    lib.orion_inline_capacity.argtypes = [p]
    lib.orion_inline_capacity.restype = size_t
    return lib


class NativeChannel:
    """One channel claimed through the C client; close() (or the context manager) releases it."""

    def __init__(self, lib: ctypes.CDLL, path: str, accept_timeout: float = 2.0, agent_timeout: float = 5.0) -> None:
        self.lib = lib
        handle = ctypes.c_void_p()
        err = ctypes.create_string_buffer(ERRLEN)
        rc = lib.orion_open_ex(os.fsencode(path), accept_timeout, agent_timeout, ctypes.byref(handle), err, ERRLEN)
        if rc:
            raise NativeWireError(rc, err.value.decode(errors="replace"))
        self.handle: int | None = handle.value
        self.index = lib.orion_channel_index(self.handle)
        self.generation = lib.orion_generation(self.handle)
        self.capacity = lib.orion_inline_capacity(self.handle)
        self._reply = ctypes.create_string_buffer(max(self.capacity, 1))
        self._status = ctypes.c_int32()
        self._length = ctypes.c_size_t()

    def _check(self, rc: int) -> None:
        if rc:
            raise NativeWireError(rc, self.lib.orion_error(self.handle).decode(errors="replace"))

    def hello(self, calls: str = "") -> int:
        session = ctypes.c_uint64()
        self._check(self.lib.orion_hello(self.handle, calls.encode(), ctypes.byref(session)))
        return session.value

    def call(self, opcode: int, payload: bytes = b"", reply_cap: int | None = None) -> tuple[int, bytes]:
        """(status, reply payload); the reply may be up to `reply_cap` bytes (default: the inline capacity)."""
        reply = self._reply
        if reply_cap is not None and reply_cap > len(reply):
            reply = ctypes.create_string_buffer(reply_cap)
        self._check(self.lib.orion_call(self.handle, opcode, payload, len(payload), ctypes.byref(self._status),
                                        reply, len(reply), ctypes.byref(self._length)))
        return self._status.value, reply.raw[:self._length.value]

    def callv(self, opcode: int, pieces: Sequence[Buffer] = (), head: Buffer | None = None,
              tail: Buffer | None = None) -> tuple[int, int]:
        """orion_callv: the request in `pieces`, the reply written into `head` then `tail` where they lie;
        returns (status, the reply's length)."""
        parts, keep = self._pieces(pieces)
        head_at, head_len, keep_head = _address(head) if head is not None else (0, 0, None)
        tail_at, tail_len, keep_tail = _address(tail) if tail is not None else (0, 0, None)
        rc = self.lib.orion_callv(self.handle, opcode, parts, len(pieces), ctypes.byref(self._status),
                                  head_at or None, head_len, tail_at or None, tail_len, ctypes.byref(self._length))
        del keep, keep_head, keep_tail  # the memory had to live until the call returned
        self._check(rc)
        return self._status.value, self._length.value

    def postv(self, opcode: int, pieces: Sequence[Buffer] = ()) -> int:
        """orion_postv; returns the post's call id."""
        parts, keep = self._pieces(pieces)
        rc = self.lib.orion_postv(self.handle, opcode, parts, len(pieces))
        del keep
        self._check(rc)
        return int(self.lib.orion_last_call_id(self.handle))

    @staticmethod
    def _pieces(pieces: Sequence[Buffer]) -> tuple[ctypes.Array[Piece], list[object]]:
        parts = (Piece * max(len(pieces), 1))()
        keep = []
        for i, piece in enumerate(pieces):
            at, length, alive = _address(piece)
            parts[i] = Piece(at, length)
            keep.append(alive)
        return parts, keep

    def post(self, opcode: int, payload: bytes = b"") -> int:
        """The post's call id (what an async error about it will carry)."""
        self._check(self.lib.orion_post(self.handle, opcode, payload, len(payload)))
        return int(self.lib.orion_last_call_id(self.handle))

    def async_errors(self) -> list[tuple[int, int, int]]:
        """(call_id, opcode, status) of every async error received so far."""
        out = []
        call_id, opcode, status = ctypes.c_uint64(), ctypes.c_uint32(), ctypes.c_int32()
        while self.lib.orion_take_async_error(self.handle, ctypes.byref(call_id), ctypes.byref(opcode),
                                              ctypes.byref(status)):
            out.append((call_id.value, opcode.value, status.value))
        return out

    def close(self) -> None:
        if self.handle is not None:
            self.lib.orion_close(self.handle)
            self.handle = None

    def __enter__(self) -> NativeChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
