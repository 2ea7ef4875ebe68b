"""The GPU host's mirror of a relayed session's page-locked memory (docs/remote.md, "Kernels given page-locked
memory"), the GPU host half of host_agent/relay/mirror.py.

A relayed guest's cuMemAllocHost memory is the relaying host's pool; natively its pointer is a device pointer too
(unified addressing), and programs hand it to kernels: XLA's autotuner spins a kernel on a page-locked flag. A
kernel on the GPU host can only reach host memory of the GPU host, so the relay asks for a mirror of each such
allocation here: fresh pages, registered with the driver, mapped at the very address the guest uses where this
worker has nothing there (MAP_FIXED_NOREPLACE: nothing of this worker's is ever replaced), so that the guest's
pointer is a valid device pointer here even where a kernel finds it in memory; elsewhere when that address is
taken (the driver's own reservations, say), and then the relay rewrites the launch parameters that name it. The
relay keeps the two copies coherent (writes before a kernel may read, reads after a synchronisation); here there
is nothing but the pages, written and read as the relay asks.

What a relaying peer can make this do is bounded: page-aligned ranges only, at most MAX_MIRROR_BYTES mapped per
session, reads and writes only inside a mapped range.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from typing import Any

from ivshmem import fixed_map
from ivshmem.cuda_status import INVALID_VALUE, OUT_OF_MEMORY, SUCCESS
from ivshmem.driver_api import (
    POOL_MIRROR_MAP,
    POOL_MIRROR_READ,
    POOL_MIRROR_REPLY,
    POOL_MIRROR_REQUEST,
    POOL_MIRROR_UNMAP,
    POOL_MIRROR_WRITE,
)
from ivshmem.layout import PAGE

from .pinned_pool import CU_MEMHOSTREGISTER_DEVICEMAP, CU_MEMHOSTREGISTER_PORTABLE

log = logging.getLogger(__name__)

MAX_MIRROR_BYTES = 256 << 20  # per session: what one relayed guest may make the GPU host pin for its kernels


class PoolMirror:
    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.ranges: dict[int, int] = {}  # address -> size of each mapped, registered range

    def answer(self, payload: bytes) -> tuple[int, bytes]:
        """(CUresult, reply payload) of one POOL_MIRROR request; RecordError for a malformed one."""
        op, address, size, data = POOL_MIRROR_REQUEST.decode(payload)
        if op == POOL_MIRROR_MAP:
            err, where = self.map(address, size)
            return err, POOL_MIRROR_REPLY.encode(where) if err == SUCCESS else b""
        if op == POOL_MIRROR_WRITE:
            if not self._inside(address, len(data)):
                return INVALID_VALUE, b""
            ctypes.memmove(address, bytes(data), len(data))
            return SUCCESS, b""
        if op == POOL_MIRROR_UNMAP:
            return self.unmap(address), b""
        if op == POOL_MIRROR_READ:
            if not self._inside(address, size):
                return INVALID_VALUE, b""
            return SUCCESS, ctypes.string_at(address, size)
        return INVALID_VALUE, b""

    def map(self, address: int, size: int) -> tuple[int, int]:
        """(CUresult, where the mirror of the guest's [address, address+size) lies here)."""
        if size <= 0 or address % PAGE or size % PAGE or address + size > 1 << 64:
            return INVALID_VALUE, 0
        if self._inside(address, size):  # mapped there before (and this worker's: nothing else is there)
            return SUCCESS, address
        if sum(self.ranges.values()) + size > MAX_MIRROR_BYTES:
            return OUT_OF_MEMORY, 0
        fd = os.memfd_create("orion-pool-mirror")
        try:
            os.ftruncate(fd, size)
            where = address if fixed_map.map_at(fd, 0, size, address) else fixed_map.map_anywhere(fd, size)
        finally:
            os.close(fd)  # the mapping keeps the pages
        if not where:
            return OUT_OF_MEMORY, 0
        (err,) = self.driver.cuMemHostRegister(where, size, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP)
        if int(err) != SUCCESS:
            fixed_map.unmap(where, size)
            return int(err), 0
        self.ranges[where] = size
        return SUCCESS, where

    def unmap(self, where: int) -> int:
        """The mirror at `where` is no longer needed (the guest freed its allocation)."""
        size = self.ranges.pop(where, None)
        if size is None:
            return INVALID_VALUE
        with contextlib.suppress(Exception):
            self.driver.cuMemHostUnregister(where)
        fixed_map.unmap(where, size)
        return SUCCESS

    def _inside(self, address: int, size: int) -> bool:
        return any(start <= address and address + size <= start + length for start, length in self.ranges.items())
