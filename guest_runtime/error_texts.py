"""The texts cuGetErrorName and cuGetErrorString hand out, kept for the life of the process.

The driver answers a pointer to a static string, which a program may keep and read at any later time, so
every text the guest hands out lives in a buffer held here until the process exits; each is asked of the host
once per (call, code). Without an agent to ask, the wheel's own enum name still says what happened.
"""
from __future__ import annotations

import ctypes


class ErrorTexts:
    """(call name, CUresult) -> its NUL-terminated text, never freed."""

    def __init__(self) -> None:
        self._texts: dict[tuple[str, int], ctypes.Array[ctypes.c_char]] = {}

    def address(self, key: tuple[str, int]) -> int | None:
        """Where the text of `key` lies, if it was kept."""
        text = self._texts.get(key)
        return None if text is None else ctypes.addressof(text)

    def keep(self, key: tuple[str, int], text: bytes) -> int:
        """Keep `text` for `key` for good; where it lies."""
        self._texts[key] = buffer = ctypes.create_string_buffer(text)
        return ctypes.addressof(buffer)


def local_error_name(code: int) -> bytes | None:
    """The CUresult's enum name from the installed wheel (None: not one it knows)."""
    try:
        from cuda.bindings import driver  # already imported: we are called from it
        return driver.CUresult(code).name.encode()
    except (ImportError, ValueError):
        return None
