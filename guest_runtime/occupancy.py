"""Occupancy queries the guest answers itself from forwarded ones."""
from __future__ import annotations

import ctypes
from collections.abc import Callable

from ivshmem.cuda_status import SUCCESS


class PotentialBlockSize:
    """cuOccupancyMaxPotentialBlockSize with a block-size-to-shared-memory callback, which lives in the guest: the
    search cudaOccupancyMaxPotentialBlockSizeVariableSMemWithFlags (cuda_runtime.h) does, run here over forwarded
    occupancy queries, one per candidate block size."""

    CALLBACK = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_int)
    # CU_DEVICE_ATTRIBUTE_: MAX_THREADS_PER_MULTIPROCESSOR, WARP_SIZE, MAX_THREADS_PER_BLOCK, MULTIPROCESSOR_COUNT
    ATTRIBUTES = (39, 10, 1, 16)

    def __init__(self, impls: dict[str, Callable[..., int]]) -> None:
        self.impls = impls

    def _int(self, name: str, *args: int) -> tuple[int, int]:
        cell = ctypes.c_int(0)
        status = self.impls[name](ctypes.addressof(cell), *args)
        return status, cell.value

    def search(self, function: int, callback: int, limit: int, flags: int) -> tuple[int, int, int]:
        """(CUresult, min grid size, block size)."""
        status, device = self._int("cuCtxGetDevice")
        values = []
        for attribute in self.ATTRIBUTES:
            if status == SUCCESS:
                status, value = self._int("cuDeviceGetAttribute", attribute, device)
                values.append(value)
        if status == SUCCESS:
            status, function_limit = self._int("cuFuncGetAttribute", 0, function)  # MAX_THREADS_PER_BLOCK
        if status != SUCCESS:
            return status, 0, 0
        per_sm, granularity, device_limit, sm_count = values
        dynamic = self.CALLBACK(callback)
        block_limit = min(limit or device_limit, device_limit, function_limit)
        best_block = best_blocks = best_threads = 0
        candidate = -(-block_limit // granularity) * granularity
        while candidate > 0:
            block = min(block_limit, candidate)
            status, blocks = self._int("cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", function, block,
                                       dynamic(block), flags)
            if status != SUCCESS:
                return status, 0, 0
            if block * blocks > best_threads:
                best_block, best_blocks, best_threads = block, blocks, block * blocks
            if best_threads == per_sm:
                break
            candidate -= granularity
        return SUCCESS, best_blocks * sm_count, best_block
