"""A ctypes view of the native wire client (orion_wire.h), for tests and benchmarks on the host.

Programs do not use this: the native library is meant to be loaded by C code (the future libcuda.so.1). It
exists so Python can drive the C client against a real served region and compare it with ClientChannel.
"""
from __future__ import annotations

import ctypes
import os

ERRORS = {-1: "ARG", -2: "REGION", -3: "PEER_GONE", -4: "NO_CHANNEL", -5: "TOO_LARGE", -6: "PROTOCOL",
          -7: "REFUSED", -8: "CLOSED", -9: "SYSTEM"}
ERRLEN = 1024


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

    def call(self, opcode: int, payload: bytes = b"") -> tuple[int, bytes]:
        """(status, reply payload)."""
        self._check(self.lib.orion_call(self.handle, opcode, payload, len(payload), ctypes.byref(self._status),
                                        self._reply, len(self._reply), ctypes.byref(self._length)))
        return self._status.value, self._reply.raw[:self._length.value]

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
