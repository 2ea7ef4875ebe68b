"""The guest's view of its channel's slice of the region's page-locked pool (host_agent/session/pinned_pool.py).

cuMemAllocHost and cuMemHostAlloc hand out memory from this slice: the host allocates (its bookkeeping cannot be
corrupted from here) and both sides see the same pages, so copies from and to it need no staging and a kernel
can read it. At the first allocation the guest tells the host where it sees the slice (POOL_MAP); the host maps
its pages at that same address if it can, else answers with its own address, which the guest then tries in its
own process. Only if both are taken do the two sides use different addresses (see HostPool).
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from ivshmem import fixed_map
from ivshmem.channel import ClientChannel
from ivshmem.cuda_status import SUCCESS

log = logging.getLogger(__name__)

# Send POOL_MAP with a proposed address; returns (CUresult, host address, slice size).
MapCall = Callable[[int], tuple[int, int, int]]


class GuestPool:
    def __init__(self) -> None:
        self.base = 0  # the address this process's pointers into the slice are relative to (0: not set up)
        self.size = 0

    def contains(self, pointer: int, size: int) -> bool:
        """Whether [pointer, pointer+size) lies in the slice: such a copy travels as an address, not as bytes."""
        return self.base != 0 and self.base <= pointer and pointer + max(size, 1) <= self.base + self.size

    def setup(self, channel: ClientChannel, map_call: MapCall) -> int:
        """Agree on the slice's address with the host (once); a CUresult."""
        if self.base:
            return SUCCESS
        region = channel.region
        offset, size = region.geometry.pool_slice(channel.index)
        if not size:
            return 2  # CUDA_ERROR_OUT_OF_MEMORY: this region has no pool
        ours = region.address(offset)
        status, host, _ = map_call(ours)
        if status != SUCCESS:
            return status
        base = ours
        if host != ours:
            if fixed_map.map_at(region.fd, offset, size, host):  # the host's address is free here: use it
                status, again, _ = map_call(host)
                if status == SUCCESS and again == host:
                    base = host
                else:
                    fixed_map.unmap(host, size)
                    status, _, _ = map_call(ours)
                    if status != SUCCESS:
                        return status
            if base != host:
                log.warning("orion: page-locked memory is at %#x here and %#x on the host; pass kernels the "
                            "pointer cuMemHostGetDevicePointer gives, not the host pointer", ours, host)
        self.base, self.size = base, size
        return SUCCESS
