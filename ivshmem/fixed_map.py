"""Mapping part of a region at a chosen virtual address, so the guest and the host see it at the same one.

Page-locked memory handed to a CUDA program is carved from the region; with unified addressing its pointer is
also its device pointer, and programs pass it to kernels as such. That only holds across the VM or container
boundary if the host worker maps those pages at the very address the guest process uses. Python's mmap cannot
choose the address, so libc's mmap is called with MAP_FIXED_NOREPLACE (Linux 4.17+), which fails rather than
replacing whatever already lives there; on older kernels the flag is only a hint, so the result is checked.
"""
from __future__ import annotations

import ctypes
import mmap
import os

MAP_FIXED_NOREPLACE = 0x100000
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FAILED = ctypes.c_void_p(-1).value


def map_at(fd: int, offset: int, length: int, address: int) -> bool:
    """Map `length` bytes of `fd` from `offset` at exactly `address`, shared and writable; False if that range is
    taken (or the kernel put the mapping elsewhere, which is then undone)."""
    if address % mmap.PAGESIZE or offset % mmap.PAGESIZE or length <= 0:
        raise ValueError(f"map_at needs page-aligned address and offset, not {address:#x}+{offset:#x}")
    got = _libc.mmap(address, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | MAP_FIXED_NOREPLACE,
                     fd, offset)
    if got in (None, MAP_FAILED):
        return False
    if got != address:  # a kernel without MAP_FIXED_NOREPLACE took it as a hint
        _libc.munmap(got, length)
        return False
    return True


def map_anywhere(fd: int, length: int) -> int:
    """Map `length` bytes of `fd` shared and writable wherever the kernel chooses; its address, or 0."""
    got = _libc.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    return 0 if got in (None, MAP_FAILED) else int(got)


def unmap(address: int, length: int) -> None:
    if _libc.munmap(address, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"munmap({address:#x}, {length}): {os.strerror(err)}")
