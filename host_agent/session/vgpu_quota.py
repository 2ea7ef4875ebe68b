"""The vGPU memory quota of one session: what its vGPUs report, and whether what it asks for fits.

A quota is per vGPU (guest device). Two vGPUs of a session may share a physical GPU; each has a context of its
own there (vgpu_contexts.py), and memory counts against the quota of the vGPU whose context made it (a pool's,
a graph's or cuMemCreate's memory: the vGPU it names). What counts is what the worker process really holds beyond
each vGPU's first context (quota_usage.py keeps those numbers): allocations exactly, the rest measured with NVML
when it may have changed.

The processes that share a grant (grant_sharing.py) may use one vGPU together; then its quota bounds what their
sessions count on it together: each publishes its own count in the grant's usage table (grant_usage.py), and each
decision adds the others'.

This module makes the decisions on those numbers: what cuMemGetInfo and cuDeviceTotalMem report, whether an
allocation fits (past the quota it fails as on a full GPU, CUDA_ERROR_OUT_OF_MEMORY), and whether a context,
module or library that was just made pushed a GPU past the quota, in which case it is undone. It logs Orion's
line for a refusal, `session N: memory M MB exceeds <vgpu i, pgpu p> quota`. It answers numbers and yes or
no; requests, replies and which handles a session owns are the executor's (executor.py) and the ledger's
(session_ledger.py), which tells it of every allocation and free (`session_ledger.Usage`).
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from ivshmem.cuda_status import SUCCESS

from .. import agent_metrics
from .gpu_memory import MemoryMeter, MeterFactory, open_nvml
from .grant_usage import UsageBoard
from .quota_usage import UsageAccount

log = logging.getLogger(__name__)


def initial_limits(driver: Any, devices: tuple[int, ...], gmem_mib: int | None,
                   vgpu_count: int) -> tuple[int, ...] | None:
    """Bytes per guest device before any BIND, or None: no quota. `gmem_mib` gives each vGPU that much; without
    it a vGPU's quota is its device's memory / `vgpu_count` (Orion), and a whole GPU has none."""
    if gmem_mib is not None:
        return (gmem_mib << 20,) * len(devices)
    if not devices or vgpu_count <= 1:
        return None
    limits = []
    for device in devices:
        err, total = driver.cuDeviceTotalMem(device)
        if int(err) != SUCCESS:
            return None
        limits.append(int(total) // vgpu_count)
    return tuple(limits)


class VgpuQuota:
    """One session's vGPUs (the physical GPU and the quota of each) and the usage counted against them."""

    def __init__(self, driver: Any, session: int, devices: tuple[int, ...], limits: tuple[int, ...] | None,
                 current_vgpu: Callable[[], int], meter: MeterFactory | None = None) -> None:
        """`current_vgpu` answers the current context's vGPU (-1: none; vgpu_contexts.py); `meter` measures the
        worker's GPU memory (gpu_memory.py), None: NVML."""
        self.driver = driver
        self.session = session
        self.devices = devices  # the physical GPU of each vGPU, in guest order
        self.limits = limits  # bytes per vGPU, or None: no quota
        self.current_vgpu = current_vgpu
        self._meter = meter
        self.account = UsageAccount(self._open_meter, session, devices, current_vgpu)  # what counts against it
        self.board: UsageBoard | None = None  # the grant's usage table, where its processes share it
        self._reserved: int | None = None  # the vGPU whose published count holds an allocation not yet made
        self.metrics = agent_metrics.enabled()  # oriond's /metrics keeps the session's memory (agent_metrics.py)

    def assign(self, devices: tuple[int, ...], limits: tuple[int, ...] | None) -> None:
        """The session's vGPUs changed (it took up a controller allocation)."""
        self.devices, self.limits = devices, limits
        self.account.assign(devices)

    def share(self, board: UsageBoard) -> None:
        """The session's grant is shared (it holds it, or joined it): its vGPUs' quotas bound what every session of
        the grant counts on them, `board` holding their counts."""
        self.board = board
        for vgpu in range(len(self.devices)):
            self._own(vgpu)

    def _own(self, vgpu: int, extra: int = 0, measure: bool = True) -> int:
        """What this session counts on `vgpu` (with `extra` bytes it is about to allocate), published for the
        grant's other sessions."""
        counted = (self.account.counted(vgpu) if measure else self.account.known(vgpu)) + extra
        if self.board is not None:
            self.board.publish(vgpu, counted)
        return counted

    def _others(self, vgpu: int) -> int:
        """What the grant's other sessions count on `vgpu` (0 where the grant is not shared)."""
        return 0 if self.board is None else self.board.others(vgpu)

    def _one_at_a_time(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if self.board is None else self.board.locked()

    def _open_meter(self) -> MemoryMeter | None:
        """The session's GPU memory meter, opened at its first context (in the worker): none without a quota."""
        if self.limits is None:
            return None
        return (self._meter or open_nvml)(self.driver)

    def vgpu_limit(self, vgpu: int) -> int | None:
        """A vGPU's quota; None without quotas or for no vGPU (-1: no current context; the driver then answers
        for itself, e.g. CUDA_ERROR_INVALID_CONTEXT)."""
        if self.limits is None or not 0 <= vgpu < len(self.limits):
            return None
        return self.limits[vgpu]

    # --- what the vGPUs report ------------------------------------------------------------------------------
    def memory_info(self) -> tuple[int, int, int] | None:
        """cuMemGetInfo under the quota: (status, free, total) of the current context's GPU; None: the driver
        answers for itself."""
        vgpu = self.current_vgpu() if self.limits is not None else -1
        limit = self.vgpu_limit(vgpu)
        if limit is None:
            return None
        err, free, _total = self.driver.cuMemGetInfo()
        if int(err) != SUCCESS:
            return int(err), 0, 0
        return SUCCESS, min(int(free), max(limit - self._own(vgpu) - self._others(vgpu), 0)), limit

    def total_memory(self, ordinal: int) -> tuple[int, int] | None:
        """cuDeviceTotalMem of a vGPU (a valid guest ordinal): (status, bytes); None: the driver answers."""
        if self.limits is None:
            return None
        err, total = self.driver.cuDeviceTotalMem(self.devices[ordinal])
        if int(err) != SUCCESS:
            return int(err), 0
        return SUCCESS, min(int(total), self.limits[ordinal])

    # --- decisions ------------------------------------------------------------------------------------------
    def allocation_fits(self, size: int, vgpu: int | None = None) -> bool:
        """Whether an allocation of `size` bytes stays within the quota of `vgpu` (None: the current context's;
        cuMemCreate names its device itself).

        The ledger keeps this exact without a measurement; only an allocation that would be refused measures
        again first, since what the process holds beyond it may have shrunk (a pool trimmed, say). Where the grant
        is shared, the check and the publication of the bytes it lets through happen while the grant's other
        sessions wait (their allocations cannot both take the last of the room)."""
        if self.limits is None:
            return True
        if vgpu is None:
            vgpu = self.current_vgpu()
        limit = self.vgpu_limit(vgpu)
        if limit is None:
            return True
        with self._one_at_a_time():
            others = self._others(vgpu)
            counted = self.account.counted(vgpu) + others + size
            if counted > limit:
                counted = self.account.refresh(vgpu) + others + size
            if counted <= limit:
                self._reserve(vgpu, size)
                return True
        self._log_exceeded(vgpu, counted)
        return False

    def _reserve(self, vgpu: int, size: int) -> None:
        """Where the grant is shared: `size` bytes the check let through are published at once, so the other
        sessions' checks see them before the allocation is made; the allocation's own count replaces them
        (allocated), or settle() takes them back."""
        if self.board is not None:
            self._own(vgpu, size)
            self._reserved = vgpu

    def settle(self) -> None:
        """After every call served in Python: a reservation the call did not turn into an allocation (the driver
        refused it, or a check after the quota's did) is taken back, so the grant's other sessions do not see less
        room than there is."""
        if self._reserved is not None:
            vgpu, self._reserved = self._reserved, None
            self._own(vgpu, measure=False)

    def usage_before(self) -> dict[int, int | None]:
        """Before a call that may make the process hold more GPU memory outside the ledger (a context, a
        module, a library): what it holds on each measured physical GPU now ({} when nothing is measured)."""
        return {device: self.account.held(device) for device in self.account.measured_devices()}

    def past_quota(self, before: dict[int, int | None], made_context_for: int | None,
                   undo: Callable[[], object]) -> bool:
        """After such a call succeeded: whether it pushed a vGPU past its quota; if so it has been undone (a full
        GPU would have failed it with CUDA_ERROR_OUT_OF_MEMORY). `made_context_for`: the vGPU the call made a
        context for, if it did.

        Each vGPU's first context is its baseline, never counted."""
        if self.limits is None:
            return False
        account = self.account
        if made_context_for is not None:
            account.context_made(made_context_for, before.get(self.devices[made_context_for]))
        for device, held_before in before.items():
            held = account.held(device)
            vgpu = account.note(device, held, made_context_for)  # a context's cost is its vGPU's, current or not
            if vgpu is None or held is None or held_before is None or held <= held_before:
                continue
            counted = self._own(vgpu) + self._others(vgpu)
            if counted <= self.limits[vgpu]:
                continue
            self._log_exceeded(vgpu, counted)
            undo()
            account.may_have_changed()
            self._own(vgpu)
            return True
        return False

    def _log_exceeded(self, vgpu: int, counted: int) -> None:
        log.info("session %d: memory %d MB exceeds <vgpu %d, pgpu %d> quota", self.session, counted >> 20,
                 vgpu, self.devices[vgpu])  # Orion's words

    # --- what the ledger tells it (session_ledger.Usage) ----------------------------------------------------
    def allocated(self, size: int, vgpu: int | None = None) -> int:
        if vgpu is None:  # only a quota, or oriond's /metrics, needs to know
            vgpu = self.current_vgpu() if self.limits is not None or self.metrics else -1
        self.account.allocated(vgpu, size)
        self._published(vgpu)
        return vgpu

    def freed(self, vgpu: int, size: int) -> None:
        self.account.freed(vgpu, size)
        self._published(vgpu)

    def _published(self, vgpu: int) -> None:
        """After an allocation or free: the session's count of `vgpu` published (no measurement; a reservation
        replaced) and reported."""
        if self.board is not None:
            self._reserved = None
            self._own(vgpu, measure=False)
        self._report(vgpu)

    def _report(self, vgpu: int) -> None:
        """oriond's /metrics: the session's memory on the vGPU's GPU now, and its quota there (of all its vGPUs
        there)."""
        if self.metrics and 0 <= vgpu < len(self.devices):
            device = self.devices[vgpu]
            on = [v for v, d in enumerate(self.devices) if d == device]
            limit = None if self.limits is None else sum(self.limits[v] for v in on)
            agent_metrics.session_memory(self.session, device, sum(self.account.counted(v) for v in on), limit)

    def may_have_changed(self) -> None:
        self.account.may_have_changed()

    def contexts_ended(self) -> None:
        """After a context may have ended (its allocations given back already: the ledger's)."""
        self.account.contexts_ended()
