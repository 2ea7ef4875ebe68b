"""Kernels given page-locked memory on a relayed session: the relay's half of the mirror (docs/remote.md, "Kernels
given page-locked memory"; the GPU host's half is host_agent/session/pool_mirror.py).

Natively a cuMemAllocHost pointer is a device pointer too, and programs hand it to kernels (XLA's autotuner spins a
kernel on a page-locked flag that the CPU later sets). On a relayed session those pages are the relaying host's
pool, out of the GPU's reach, so each allocation a launch names in its parameters gets a mirror on the GPU host, at
the same address where the GPU host's worker has it free (else elsewhere, and the launch parameters that name the
allocation are rewritten to the mirror's address: `translate`), and the relay keeps the two coherent at the
points where a program can tell:
- before a launch and before any call that waits for the GPU (`WAITS`), the bytes the guest's CPU changed since
  the two last agreed are written to the mirror (`changes`): a kernel sees what the CPU wrote before it was
  launched, and a kernel spinning on a flag sees the CPU's release before the guest waits for it;
- after a call that waits for the GPU, the mirror is read back and the bytes the GPU changed are written to the
  pool (`merge`): what a kernel wrote is in the guest's memory when its synchronisation returns.
Both directions move only the bytes that side changed since the last agreement (a snapshot of each mirrored
allocation is kept here), so the CPU and the GPU writing different bytes of one allocation between two
agreements both keep their writes, as natively; where both wrote the same byte the GPU's write wins, one of the
orders the native interleaving allows.

What it cannot give: coherence *while* a kernel runs. A kernel that waits for a CPU write sees it at the guest's
next launch or wait, not at once (XLA's delay kernel spins on a page-locked flag until the timer's stop event is
waited for, which brings the CPU's release to it: its measurement is right). Pointers to page-locked memory stored
inside device memory or structures (reached only where the mirror could take the guest's address) and graphs'
kernel nodes are not scanned (docs/remote.md). What does not belong here: sending and
receiving (relay/relayed_session.py does, with its own calls to the GPU host).
"""
from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterator

from ivshmem.driver_api import BY_OPCODE, CALLS
from ivshmem.errors import RecordError
from ivshmem.layout import PAGE
from ivshmem.record import Record

from ..session.pinned_pool import HostPool

LAUNCHES = frozenset(CALLS[name].opcode for name in ("cuLaunchKernel", "cuLaunchKernelEx",
                                                      "cuLaunchCooperativeKernel"))
# Stream memory operations: refused on page-locked memory (relayed_session.py, _refuse_memory_operation); the batch
# ones (their operations a list: driver_api.BATCH_MEM_OP) when any operation names it.
MEMORY_OPERATIONS = frozenset(CALLS[name].opcode for name in ("cuStreamWaitValue32", "cuStreamWriteValue32"))
BATCH_OPERATIONS = frozenset(CALLS[name].opcode for name in ("cuStreamBatchMemOp", "cuGraphAddBatchMemOpNode",
                                                              "cuGraphBatchMemOpNodeSetParams",
                                                              "cuGraphExecBatchMemOpNodeSetParams"))
# Calls after whose answer the guest may look at what the GPU wrote.
WAITS = frozenset(CALLS[name].opcode for name in ("cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize",
                                                   "cuStreamQuery", "cuEventQuery"))
_U64 = struct.Struct("<Q")
_COMPARE_STEP = 4096  # equal blocks are skipped whole; a block that differs is compared byte by byte


def runs(old: bytes | bytearray | memoryview, new: bytes | bytearray | memoryview) -> Iterator[tuple[int, int]]:
    """The [start, end) runs of bytes where `new` differs from `old` (equal lengths)."""
    start = -1
    for block in range(0, len(new), _COMPARE_STEP):
        end = min(block + _COMPARE_STEP, len(new))
        if old[block:end] == new[block:end]:
            if start >= 0:
                yield start, block
                start = -1
            continue
        for i in range(block, end):
            if old[i] != new[i]:
                if start < 0:
                    start = i
            elif start >= 0:
                yield start, i
                start = -1
    if start >= 0:
        yield start, len(new)


class MirrorRelay:
    """The mirrored allocations of one relayed session's pool, and what both sides last agreed they hold."""

    def __init__(self, pool: HostPool) -> None:
        self.pool = pool
        self.agreed: dict[int, bytearray] = {}  # pool offset of a mirrored allocation -> the bytes both sides hold
        self.where: dict[int, int] = {}  # pool offset of a mirrored allocation -> its mirror's address on the GPU host
        self.unavailable = False  # the GPU host could not mirror: launches go as they are (their fault: an error)

    @property
    def active(self) -> bool:
        return bool(self.agreed)

    def scan(self, record: Record) -> list[tuple[int, int]]:
        """(offset in the launch's payload, pool offset of its allocation) of every parameter word that names pool
        memory: every 4-byte aligned 64-bit word (parameters are naturally aligned, and the parameter block starts
        4-byte aligned). Done once per launch; `unmirrored` and `translate` take its answer."""
        pool = self.pool
        if not pool.allocations or not pool.guest_base:
            return []
        try:
            params = bytes(BY_OPCODE[record.opcode].request.decode(record.payload)[-1])
        except (RecordError, KeyError):
            return []  # malformed: the GPU host refuses it as it is
        start, found = len(record.payload) - len(params), []
        low, high = pool.guest_base, pool.guest_base + pool.size
        for at in range(0, len(params) - 7, 4):
            (word,) = _U64.unpack_from(params, at)
            if low <= word < high:
                offset = pool.allocation_of(word)
                if offset is not None:
                    found.append((start + at, offset))
        return found

    def names_pool(self, record: Record) -> bool:
        """Whether a stream memory operation's address (the u64 after its stream), or any of a batch's, lies in the
        pool. A batch that does not decode is the GPU host's to refuse."""
        pool = self.pool
        if not pool.guest_base:
            return False
        if record.opcode in BATCH_OPERATIONS:
            request = BY_OPCODE[record.opcode].request
            try:
                fields = dict(zip((name for name, _ in request.fields), request.decode(record.payload), strict=True))
            except RecordError:
                return False
            addresses = [address for _operation, _flags, address, _value in fields["ops"]]
        elif len(record.payload) >= 16:
            addresses = [_U64.unpack_from(record.payload, 8)[0]]
        else:
            return False
        return any(pool.guest_base <= address < pool.guest_base + pool.size for address in addresses)

    def unmirrored(self, named: list[tuple[int, int]]) -> list[int]:
        """Pool offsets of the allocations a launch names (`scan`) that are not mirrored yet."""
        return list(dict.fromkeys(offset for _, offset in named if offset not in self.agreed))

    def elsewhere(self, named: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Of a launch's words that name pool memory (`scan`), those whose allocation's mirror lies elsewhere than
        the guest's address: `translate` rewrites them."""
        return [(at, offset) for at, offset in named
                if offset in self.where and self.where[offset] != self.pool.guest_base + offset]

    def translate(self, payload: bytes | bytearray, named: list[tuple[int, int]]) -> bytes | None:
        """The launch's payload with each parameter that names a mirror placed elsewhere pointing at the mirror;
        None when nothing needs it."""
        moves = [(at, self.where[offset] - self.pool.guest_base - offset) for at, offset in self.elsewhere(named)]
        if not moves:
            return None
        moved = bytearray(payload)
        for at, delta in moves:
            (word,) = _U64.unpack_from(moved, at)
            _U64.pack_into(moved, at, (word + delta) & 0xFFFFFFFFFFFFFFFF)
        return bytes(moved)

    def extent(self, offset: int) -> tuple[int, int]:
        """(guest address, page-rounded size) of the allocation at pool `offset`: what the GPU host maps."""
        size = self.pool.allocations[offset]
        return self.pool.guest_base + offset, -(-size // PAGE) * PAGE

    def adopt(self, offset: int, where: int) -> None:
        """Mirrored from now on, at `where` on the GPU host; nothing agreed yet, so the first `changes` sends all."""
        self.agreed[offset] = bytearray(self.extent(offset)[1])
        self.where[offset] = where

    def _view(self, offset: int) -> memoryview:
        """The pool's bytes of a mirrored allocation, as the relay maps them."""
        size = len(self.agreed[offset])
        return memoryview((ctypes.c_char * size).from_address(self.pool.host_base + offset)).cast("B")

    def forget_freed(self) -> list[int]:
        """Allocations freed by the guest are mirrored no more (a new one at the same place starts afresh): the
        GPU host addresses of their mirrors, to unmap there."""
        gone: list[int] = []
        for offset in list(self.agreed):
            found = self.pool.allocations.get(offset)
            if found is None or -(-found // PAGE) * PAGE != len(self.agreed[offset]):
                del self.agreed[offset]
                gone.append(self.where.pop(offset))
        return gone

    def changes(self, first: set[int] | None = None) -> list[tuple[int, bytes]]:
        """(mirror address, bytes) of every run the guest's CPU changed since the last agreement (all of a newly
        adopted allocation: `first`), now agreed."""
        out: list[tuple[int, bytes]] = []
        for offset, agreed in self.agreed.items():
            now = self._view(offset)
            if first is not None and offset in first:
                spans: list[tuple[int, int]] | Iterator[tuple[int, int]] = [(0, len(agreed))]
            else:
                spans = list(runs(agreed, now))
            for start, end in spans:
                piece = bytes(now[start:end])
                agreed[start:end] = piece
                out.append((self.where[offset] + start, piece))
        return out

    def merge(self, offset: int, mirror: bytes) -> None:
        """The mirror's bytes of one allocation, read after a wait: what the GPU changed goes to the pool."""
        agreed = self.agreed.get(offset)
        if agreed is None or len(mirror) != len(agreed):
            return
        now = self._view(offset)
        for start, end in list(runs(agreed, mirror)):
            now[start:end] = mirror[start:end]
            agreed[start:end] = mirror[start:end]

