"""What every session of one shared grant counts on each of its vGPUs, seen by all of them (grant_sharing.py).

The processes that share a grant (Orion's guide: a launcher and the ranks it starts) may each make contexts and
allocate on any of its vGPUs, as processes do on a GPU natively: PyTorch's ranks, for one, each retain device 0's
primary context at start whatever device they then train on. A vGPU's quota is the grant's, not a session's, so
what the sessions count on one vGPU together must stay within it. Each session counts its own bytes
(quota_usage.py) and publishes them here; each check adds what the others published.

The board is a small shared table (a memfd) that the holding worker makes when it first shares its grant and hands,
with the grant, to each worker that joins (SCM_RIGHTS): one row per session, one 8-byte count per vGPU. The holder
gives each joined session a free row, and clears it when that session's connection ends (its worker ended, however),
so a dead session's bytes are never counted. Cell 0 holds the rows ever given (readers stop there).

A check and the reservation it makes happen under a POSIX lock on the table, so two sessions allocating at once
cannot both pass with the last of a vGPU's room. The table holds numbers only: a worker that scribbles on it can
only make its own grant's checks wrong, and every writer is a worker of the same grant and user.
Not here: what is counted (quota_usage.py), the decisions (vgpu_quota.py), the hand-over (grant_sharing.py).
"""
from __future__ import annotations

import fcntl
import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager

from ivshmem.layout import MAX_CHANNELS

ROWS = 1 + MAX_CHANNELS  # the holder, and a session joined from each channel of its region at once
CELL = 8


def table_bytes(vgpus: int) -> int:
    return (1 + ROWS * vgpus) * CELL


class UsageBoard:
    """One session's view of its grant's table: its own row, and the sum of the others'."""

    def __init__(self, descriptor: int, vgpus: int, row: int) -> None:
        """Map the table `descriptor` (this object's to close) of a grant of `vgpus` vGPUs, as row `row`."""
        if not 0 < vgpus <= 4096 or not 0 <= row < ROWS:
            os.close(descriptor)
            raise ValueError(f"not a usage table: {vgpus} vGPUs, row {row}")
        self.descriptor, self.vgpus, self.row = descriptor, vgpus, row
        size = table_bytes(vgpus)
        try:
            if os.fstat(descriptor).st_size != size:
                raise ValueError("not a usage table: its size is not its grant's")
            self._map = mmap.mmap(descriptor, size)
        except (OSError, ValueError):
            os.close(descriptor)
            raise
        self._cells = memoryview(self._map).cast("q")

    @classmethod
    def create(cls, vgpus: int) -> UsageBoard:
        """The holder's table for a grant of `vgpus` vGPUs, itself in row 0."""
        descriptor = os.memfd_create("orion-grant-usage", os.MFD_CLOEXEC)
        os.ftruncate(descriptor, table_bytes(vgpus))
        board = cls(descriptor, vgpus, 0)
        board._cells[0] = 1
        return board

    def _cell(self, row: int, vgpu: int) -> int:
        """The index of `row`'s count for `vgpu` (the rows follow cell 0, one cell per vGPU each)."""
        return 1 + row * self.vgpus + vgpu

    # --- every session ------------------------------------------------------------------------------------
    def publish(self, vgpu: int, counted: int) -> None:
        if 0 <= vgpu < self.vgpus:
            self._cells[self._cell(self.row, vgpu)] = counted

    def others(self, vgpu: int) -> int:
        """What the grant's other sessions counted on `vgpu` at their last publication."""
        if not 0 <= vgpu < self.vgpus:
            return 0
        rows = min(max(self._cells[0], 0), ROWS)
        return sum(max(self._cells[self._cell(r, vgpu)], 0) for r in range(rows) if r != self.row)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """The grant's sessions one at a time (a check and its reservation)."""
        fcntl.lockf(self.descriptor, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(self.descriptor, fcntl.LOCK_UN)

    # --- the holder -----------------------------------------------------------------------------------------
    def give_row(self, taken: set[int]) -> int | None:
        """A free row for a joining session (None: the table is full); `taken` are the rows given and not yet
        cleared (the holder's, row 0, always)."""
        free = next((r for r in range(1, ROWS) if r not in taken), None)
        if free is not None:
            self.clear_row(free)
            self._cells[0] = max(self._cells[0], free + 1)
        return free

    def clear_row(self, row: int) -> None:
        """A joined session ended: it counts nothing any more. (Not under the lock: this only makes room, and a
        POSIX lock is the process's, so taking it here, on the holder's thread for that session, would release the
        one its executor may hold.)"""
        for vgpu in range(self.vgpus):
            self._cells[self._cell(row, vgpu)] = 0
