"""Kernel arguments, packed into the one buffer the host launches with.

`cuLaunchKernel(..., void **kernelParams, void **extra)` hands the guest pointers into its own memory, which mean
nothing on the host. Two forms exist:

* `kernelParams`: an array of N pointers, each at one argument's value. Their sizes are not in the call: the
  host answers `cuFuncGetParamInfo(func, i)` -> (offset, size) for each parameter, and `pack_checked` copies each
  value to its offset in a zeroed buffer (the padding between parameters stays zero).
* `extra`: a list of pointer-sized (key, value) pairs ending with CU_LAUNCH_PARAM_END (0):
  CU_LAUNCH_PARAM_BUFFER_POINTER (1) -> the already packed buffer, CU_LAUNCH_PARAM_BUFFER_SIZE (2) -> a pointer
  to a size_t holding its size. `params_from_extra` returns that buffer's bytes.

Either way the host gets one byte string it can turn back into a kernelParams array of its own. Pure ctypes:
no CUDA call is made here.
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence

MAX_PARAM_BYTES = 32764
"""The driver's limit for one launch's parameters (CUDA 12.1+ on Volta and later; 4 KiB before)."""
MAX_EXTRA_ENTRIES = 64
"""An `extra` list longer than this (without END) is not a list: stop rather than walk memory."""

CU_LAUNCH_PARAM_END = 0
CU_LAUNCH_PARAM_BUFFER_POINTER = 1
CU_LAUNCH_PARAM_BUFFER_SIZE = 2


def check_layout(layout: Sequence[tuple[int, int]]) -> int:
    """Validate the (offset, size) per parameter; return the packed size, max(offset + size).

    ValueError for a negative offset, a size <= 0, overlapping parameters or a total past MAX_PARAM_BYTES: such a
    layout is a bug or a lying host, and packing it would hand the kernel wrong arguments."""
    total = 0
    previous: tuple[int, int] | None = None
    for offset, size in sorted(layout):
        if offset < 0 or size <= 0:
            raise ValueError(f"parameter at offset {offset} with size {size} is invalid")
        if offset + size > MAX_PARAM_BYTES:
            raise ValueError(f"parameter at offset {offset} with size {size} ends past {MAX_PARAM_BYTES} bytes")
        if previous is not None and offset < previous[0] + previous[1]:
            raise ValueError(f"parameter at offset {offset} overlaps the one at {previous[0]} (size {previous[1]})")
        previous = (offset, size)
        total = max(total, offset + size)
    return total


def pack_checked(kernel_params_address: int, layout: Sequence[tuple[int, int]], total: int) -> bytes:
    """Pack the values `kernelParams[i]` points at into one buffer of `total` bytes, value i at layout[i]'s offset.

    `layout` is in parameter order (what cuFuncGetParamInfo reports for index 0, 1, ...) and already validated:
    `total` is check_layout(layout), computed once per function, not per launch. A kernel without parameters
    packs to b"" and may have kernelParams NULL."""
    if not layout:
        return b""
    if not kernel_params_address:
        raise ValueError(f"kernelParams is NULL for a kernel with {len(layout)} parameters")
    pointers = (ctypes.c_void_p * len(layout)).from_address(kernel_params_address)
    buffer = bytearray(total)
    string_at = ctypes.string_at
    for index, (value, (offset, size)) in enumerate(zip(pointers, layout, strict=True)):
        if not value:
            raise ValueError(f"kernelParams[{index}] is NULL")
        buffer[offset:offset + size] = string_at(value, size)
    return bytes(buffer)


def params_from_extra(extra_address: int) -> bytes | None:
    """The packed parameter buffer an `extra` array carries, or None when `extra` is NULL or names no buffer.

    ValueError for an unknown key, a buffer without its size (or a size without its buffer), a size past
    MAX_PARAM_BYTES, or no CU_LAUNCH_PARAM_END within MAX_EXTRA_ENTRIES pairs: never a guessed buffer."""
    if not extra_address:
        return None
    word = ctypes.sizeof(ctypes.c_void_p)
    buffer: int | None = None
    size_address: int | None = None
    for index in range(MAX_EXTRA_ENTRIES):
        key = ctypes.c_void_p.from_address(extra_address + 2 * index * word).value or 0
        if key == CU_LAUNCH_PARAM_END:
            break
        value = ctypes.c_void_p.from_address(extra_address + (2 * index + 1) * word).value or 0
        if key == CU_LAUNCH_PARAM_BUFFER_POINTER:
            buffer = value
        elif key == CU_LAUNCH_PARAM_BUFFER_SIZE:
            size_address = value
        else:
            raise ValueError(f"extra[{2 * index}] holds unknown key {key:#x}")
    else:
        raise ValueError(f"extra has no CU_LAUNCH_PARAM_END within {MAX_EXTRA_ENTRIES} pairs")
    if buffer is None and size_address is None:
        return None
    if not size_address:
        raise ValueError("extra names a parameter buffer without CU_LAUNCH_PARAM_BUFFER_SIZE")
    size = ctypes.c_size_t.from_address(size_address).value
    if size > MAX_PARAM_BYTES:
        raise ValueError(f"extra's parameter buffer claims {size} bytes, past {MAX_PARAM_BYTES}")
    if size == 0:
        return b""
    if not buffer:
        raise ValueError(f"extra gives a buffer size of {size} without CU_LAUNCH_PARAM_BUFFER_POINTER")
    return ctypes.string_at(buffer, size)
