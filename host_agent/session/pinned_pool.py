"""A session's page-locked host memory: its channel's slice of the region's pool, as the host worker sees it.

cuMemAllocHost/cuMemHostAlloc in the guest return memory carved from this slice, so the host can copy to and
from it, and kernels can read it through its device mapping, with no staging: the pages are the guest's and
the host's at once, and cuMemHostRegister page-locks them for the GPU.

Addresses. The guest's pointers are what its program holds, so the host tries to map the slice at the very
address the guest uses (POOL_MAP, fixed_map.map_at). Then guest pointer == host address, and on GPUs that can
use registered host pointers directly (every UVA system CUDA 12+ supports) == device pointer too: a program
may hand the pointer to a kernel as it would natively. If the address is taken in the host worker, the guest
tries the host's address in its own process instead; if both fail, pointers are translated by offset and only
cuMemHostGetDevicePointer gives a kernel-usable pointer (the CUDA contract without unified addressing).

The allocator lives here, in the host worker, never in shared memory: a guest can corrupt its own bytes but
not the bookkeeping that decides which host addresses a copy may touch.
"""
from __future__ import annotations

import ctypes
import logging
from array import array
from typing import Any

from ivshmem import fixed_map
from ivshmem.cuda_status import INVALID_VALUE, NOT_SUPPORTED, OUT_OF_MEMORY, SUCCESS
from ivshmem.driver_api import CALLS, POOL_MAP_OPCODE, POOL_MAP_REPLY, POOL_MAP_REQUEST
from ivshmem.layout import PAGE
from ivshmem.region import Region

from .range_table import RangeTable

log = logging.getLogger(__name__)

CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_DEVICEMAP = 1, 2
CU_MEMHOSTALLOC_FLAGS = 0x7  # PORTABLE | DEVICEMAP | WRITECOMBINED: what cuMemHostAlloc accepts
_BOOKKEEPING = {CALLS[name].opcode: CALLS[name] for name in ("cuMemAllocHost", "cuMemHostAlloc", "cuMemFreeHost",
                                                              "cuMemHostGetFlags")}
BOOKKEEPING_OPCODES = frozenset({POOL_MAP_OPCODE, *_BOOKKEEPING})


class HostPool:
    def __init__(self, region: Region, index: int, epoch: array[int] | None = None) -> None:
        self.region = region
        self.offset, self.size = region.geometry.pool_slice(index)
        self.own_address = region.address(self.offset) if self.size else 0  # the worker's mapping of the slice
        self.host_base = 0  # where the pages guest pointers name are mapped in this process (0: not mapped)
        self.guest_base = 0  # the address the guest's pointers are relative to
        self.fixed_mapping = False  # host_base is a second mapping made at the guest's address
        self.device_base = 0  # device pointer of host_base once registered
        # offset in the slice -> size, searched by sorted offsets (range_table.py): every page-locked copy looks
        # its pointer up here, and so does hot_dispatch.c (pinned_host)
        self.allocations = RangeTable(epoch)  # `epoch`: the session ledger's (a freed allocation advances it)
        self._flags: dict[int, int] = {}  # offset in the slice -> cuMemHostAlloc's flags

    def map(self, proposed: int) -> tuple[int, int]:
        """POOL_MAP: the guest's slice is at `proposed`. Returns (CUresult, host address of the slice): equal to
        `proposed` when the host now maps it there too. Not once pages are allocated (they are registered)."""
        if not self.size:
            return OUT_OF_MEMORY, 0
        if self.allocations or self.device_base:
            return (SUCCESS, self.host_base) if proposed == self.guest_base else (INVALID_VALUE, self.host_base)
        if proposed % PAGE:
            return INVALID_VALUE, 0
        if not self.guest_base:  # a new session: nothing of an earlier session's page-locked data stays readable
            ctypes.memset(self.own_address, 0, self.size)
        self._drop_fixed()
        if proposed == self.own_address:
            self.host_base = proposed
        elif proposed and fixed_map.map_at(self.region.fd, self.offset, self.size, proposed):
            self.host_base, self.fixed_mapping = proposed, True
        else:
            self.host_base = self.own_address
        self.guest_base = proposed
        return SUCCESS, self.host_base

    def _drop_fixed(self) -> None:
        if self.fixed_mapping:
            fixed_map.unmap(self.host_base, self.size)
            self.fixed_mapping = False

    def register(self, driver: Any) -> int:
        """Page-lock the slice for the GPU (needs a current context: done at the first allocation)."""
        if self.device_base:
            return SUCCESS
        (err,) = driver.cuMemHostRegister(self.host_base, self.size,
                                          CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP)
        if int(err) != SUCCESS:
            return int(err)
        err, device = driver.cuMemHostGetDevicePointer(self.host_base, 0)
        if int(err) != SUCCESS:
            driver.cuMemHostUnregister(self.host_base)
            return int(err)
        self.device_base = int(device)
        if self.device_base != self.guest_base:
            log.info("pinned pool: guest %#x, host %#x, device %#x: kernels need cuMemHostGetDevicePointer",
                     self.guest_base, self.host_base, self.device_base)
        return SUCCESS

    def allocate(self, size: int, flags: int, driver: Any) -> tuple[int, int]:
        """(CUresult, guest pointer) of `size` page-aligned bytes (first fit). `driver` None: the pages are not
        registered with any GPU (a relayed session's pool, relay/pool.py)."""
        if not self.host_base:
            return INVALID_VALUE, 0  # the guest skipped POOL_MAP
        if size <= 0:
            return INVALID_VALUE, 0
        rounded = -(-size // PAGE) * PAGE
        start = 0
        for offset in self.allocations.bases:  # in address order
            if offset - start >= rounded:
                break
            start = offset + -(-self.allocations[offset] // PAGE) * PAGE
        if start + rounded > self.size:
            return OUT_OF_MEMORY, 0
        err = self.register(driver) if driver is not None else SUCCESS
        if err != SUCCESS:
            return err, 0
        self.allocations[start] = size
        self._flags[start] = flags
        return SUCCESS, self.guest_base + start

    def free(self, pointer: int) -> int:
        if self.allocations.pop(pointer - self.guest_base, None) is None:
            return INVALID_VALUE
        del self._flags[pointer - self.guest_base]
        return SUCCESS

    def _allocation(self, pointer: int, size: int, base: int) -> tuple[int, int, int] | None:
        """(offset of its allocation, size, flags) if [pointer, pointer+size) lies in one allocation, counted
        from `base` (the guest or the device view)."""
        if not base:
            return None
        offset = pointer - base
        start = self.allocations.holder(offset, size)
        return None if start is None else (start, self.allocations[start], self._flags[start])

    def allocation_of(self, pointer: int) -> int | None:
        """The offset in the slice of the allocation guest pointer `pointer` lies in."""
        found = self._allocation(pointer, 1, self.guest_base)
        return None if found is None else found[0]

    def host_address(self, pointer: int, size: int) -> int | None:
        """The host address behind guest pointer `pointer` if `size` bytes from it lie in one allocation."""
        if self._allocation(pointer, max(size, 1), self.guest_base) is None:
            return None
        return self.host_base + pointer - self.guest_base

    def guest_address(self, host: int) -> int | None:
        """The guest pointer behind this process's address `host` in the slice (host_address's inverse)."""
        if not self.host_base or not self.host_base <= host < self.host_base + self.size:
            return None
        return self.guest_base + host - self.host_base

    def device_pointer(self, pointer: int) -> int | None:
        return None if self.host_address(pointer, 1) is None else self.device_base + pointer - self.guest_base

    def flags(self, pointer: int) -> int | None:
        found = self._allocation(pointer, 1, self.guest_base)
        return None if found is None else found[2]

    def owns_device(self, pointer: int, size: int) -> bool:
        """Whether a device range lies in one allocation's device mapping (a kernel or copy may use it)."""
        return self._allocation(pointer, max(size, 1), self.device_base) is not None

    def close(self, driver: Any) -> None:
        if self.device_base and driver is not None:
            driver.cuMemHostUnregister(self.host_base)
        self.device_base = 0
        self._drop_fixed()


def answer_bookkeeping(pool: HostPool | None, opcode: int, payload: bytes | bytearray | memoryview,
                       driver: Any) -> tuple[int, bytes]:
    """(CUresult, reply payload) of POOL_MAP or a call the pool's bookkeeping answers alone (cuMemAllocHost,
    cuMemHostAlloc, cuMemFreeHost, cuMemHostGetFlags; `opcode` in BOOKKEEPING_OPCODES): a local session's worker
    and a relay (host_agent/relay/pool.py, `driver` None: the pages are registered with no GPU) answer them alike.
    RecordError for a malformed request."""
    if opcode == POOL_MAP_OPCODE:
        (proposed,) = POOL_MAP_REQUEST.decode(payload)
        if pool is None:
            return NOT_SUPPORTED, b""
        err, host = pool.map(proposed)
        return err, POOL_MAP_REPLY.encode(host, pool.size)
    call = _BOOKKEEPING[opcode]
    if call.name == "cuMemFreeHost":
        (pointer,) = call.request.decode(payload)
        return (INVALID_VALUE if pool is None else pool.free(pointer)), b""
    if call.name == "cuMemHostGetFlags":
        (pointer,) = call.request.decode(payload)
        flags = None if pool is None else pool.flags(pointer)
        return (INVALID_VALUE, b"") if flags is None else (SUCCESS, call.reply.encode(flags))
    size, *flags_given = call.request.decode(payload)  # cuMemAllocHost, cuMemHostAlloc: a pointer in the guest's view
    if flags_given and flags_given[0] & ~CU_MEMHOSTALLOC_FLAGS:
        return INVALID_VALUE, b""
    if pool is None:
        return NOT_SUPPORTED, b""
    err, pointer = pool.allocate(size, flags_given[0] if flags_given else 0, driver)
    return err, call.reply.encode(pointer) if err == SUCCESS else b""
