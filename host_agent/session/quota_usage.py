"""What a session has used of its vGPU memory quota, per physical GPU.

Counted against the quota is what the session's worker process really holds on the GPU, less the unavoidable
cost of its first context there:

    counted = ledger + beyond,   beyond = max(0, held − baseline − ledger) at the last measurement

* `held`: the process's bytes on the GPU (gpu_memory.py: NVML); `baseline`: `held` right after the session's
  first context on that GPU was made, before anything else;
* `ledger`: the bytes of the session's live cuMemAlloc* allocations, kept exactly at every allocation and free,
  so the hot path (an allocation's check) needs no measurement;
* `beyond`: everything else the process holds — module and library globals, extra contexts, lazily loaded
  code, local memory, allocation rounding — measured only when something may have changed it (the session's
  ledger marks those calls from their effects; the account then measures at its next use).

Without a meter (no NVML) `beyond` stays 0: allocations alone are counted, as before this module existed.
This module keeps the numbers; deciding what to refuse and undoing calls is vgpu_quota.py's business.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from .gpu_memory import MemoryMeter

log = logging.getLogger(__name__)


@dataclass
class _Gpu:
    baseline: int | None = None  # held right after the session's first context here; None: not measured
    ledger: int = 0  # bytes of live cuMemAlloc* allocations
    beyond: int = 0  # bytes held beyond baseline + ledger at the last measurement
    stale: bool = False  # something may have changed `beyond` since


class UsageAccount:
    """The counted bytes of one session on each physical GPU it uses."""

    def __init__(self, open_meter: Callable[[], MemoryMeter | None], session: int) -> None:
        """`open_meter` is called once, at the first context (in the worker process, never before fork)."""
        self._open_meter: Callable[[], MemoryMeter | None] | None = open_meter
        self._meter: MemoryMeter | None = None
        self._session = session
        self._gpus: dict[int, _Gpu] = {}

    def _gpu(self, device: int) -> _Gpu:
        return self._gpus.setdefault(device, _Gpu())

    def measured_devices(self) -> list[int]:
        """The GPUs whose usage is measured: those where the session has made its first context."""
        if self._meter is None:
            return []
        return [d for d, gpu in self._gpus.items() if gpu.baseline is not None]

    # --- the ledger: exact, no measurement ------------------------------------------------------------------
    def allocated(self, device: int, size: int) -> None:
        self._gpu(device).ledger += size

    def freed(self, device: int, size: int) -> None:
        self._gpu(device).ledger -= size

    # --- measurements ---------------------------------------------------------------------------------------
    def held(self, device: int) -> int | None:
        """The process's bytes on `device` now (None without a meter, or when it cannot tell)."""
        return None if self._meter is None else self._meter.held(device)

    def context_made(self, device: int) -> None:
        """After a context was made on `device`: the first one's cost is the baseline, never counted."""
        if self._open_meter is not None:  # the first context of the session, on any GPU
            opener, self._open_meter = self._open_meter, None
            self._meter = opener()
            if self._meter is None:
                log.info("session %d: the vGPU quota counts cuMemAlloc* allocations only (no NVML in this worker)",
                         self._session)
        gpu = self._gpu(device)
        if self._meter is None or gpu.baseline is not None:
            return
        held = self._meter.held(device)
        if not held:  # NVML does not list this process (another PID namespace), or cannot say
            log.warning("session %d: NVML does not report this process's memory on GPU %d; the vGPU quota counts "
                        "cuMemAlloc* allocations only", self._session, device)
            self._meter = None
            return
        gpu.baseline = held
        log.debug("session %d: its first context on GPU %d holds %d bytes (not counted)", self._session, device, held)

    def note(self, device: int, held: int | None) -> None:
        """Take a measurement of `device` made by the caller (None: it could not be made; nothing changes)."""
        gpu = self._gpu(device)
        if gpu.baseline is None:
            return
        if held is not None:  # a failed measurement keeps the last one (and is not retried at every use)
            gpu.beyond = max(0, held - gpu.baseline - gpu.ledger)
        gpu.stale = False

    def refresh(self, device: int) -> int:
        """Measure `device` now; its counted bytes."""
        if device in self.measured_devices():
            self.note(device, self.held(device))
        return self.counted(device)

    def may_have_changed(self) -> None:
        """After a call that may change what the process holds outside the ledger: measure at the next use."""
        for gpu in self._gpus.values():
            gpu.stale = gpu.baseline is not None

    def counted(self, device: int) -> int:
        """The bytes counted against the quota on `device` (measured first if something may have changed)."""
        gpu = self._gpu(device)
        if gpu.stale and self._meter is not None:
            self.note(device, self._meter.held(device))
        return gpu.ledger + gpu.beyond
