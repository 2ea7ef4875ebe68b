"""What a session has used of its vGPU memory quotas, per vGPU.

Counted against a vGPU's quota is what the session's worker process really holds for it on its GPU, less the
unavoidable cost of the vGPU's first context:

    counted(v) = ledger(v) + beyond(v),   the GPU's beyond = max(0, held − baseline − its vGPUs' ledgers)

* `held`: the process's bytes on a physical GPU (gpu_memory.py: NVML); `baseline`: `held` right after the
  session's first context on that GPU was made, before anything else, grown by the cost of each later vGPU's first
  context there (vgpu_contexts.py: two vGPUs of one GPU have a context each);
* `ledger(v)`: the bytes of the session's live allocations made for vGPU v, kept exactly at every allocation and
  free, so the hot path (an allocation's check) needs no measurement;
* `beyond`: everything else the process holds on the GPU — module and library globals, extra contexts, lazily
  loaded code, local memory, allocation rounding — measured only when something may have changed it (the
  session's ledger marks those calls from their effects; the account then measures at its next use). NVML counts
  a process per GPU, not per context, so a change is laid on the vGPU whose context is current when it is
  measured (the one whose calls made it), and a shrink is taken from that vGPU first.

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
    """One physical GPU of the session."""
    baseline: int | None = None  # held right after the session's first context here; None: not measured
    stale: bool = False  # something may have changed what is held beyond the ledgers since the last measurement


@dataclass
class _Vgpu:
    ledger: int = 0  # bytes of live allocations made for it
    beyond: int = 0  # its part of what its GPU held beyond baseline + ledgers at the last measurement
    has_context: bool = False  # its first context was made (its cost is in its GPU's baseline)


class UsageAccount:
    """The counted bytes of one session's vGPUs."""

    def __init__(self, open_meter: Callable[[], MemoryMeter | None], session: int, devices: tuple[int, ...],
                 current: Callable[[], int]) -> None:
        """`open_meter` is called once, at the first context (in the worker process, never before fork);
        `devices` is the physical GPU of each vGPU; `current` answers the current context's vGPU (-1: none)."""
        self._open_meter: Callable[[], MemoryMeter | None] | None = open_meter
        self._meter: MemoryMeter | None = None
        self._session = session
        self._current = current
        self._gpus: dict[int, _Gpu] = {}
        self.assign(devices)

    def assign(self, devices: tuple[int, ...]) -> None:
        """The session's vGPUs changed (a BIND, before anything was counted)."""
        self.devices = devices
        self._vgpus = [_Vgpu() for _ in devices]

    def _gpu(self, device: int) -> _Gpu:
        return self._gpus.setdefault(device, _Gpu())

    def _on(self, device: int) -> list[_Vgpu]:
        return [v for d, v in zip(self.devices, self._vgpus, strict=True) if d == device]

    def measured_devices(self) -> list[int]:
        """The GPUs whose usage is measured: those where the session has made its first context."""
        if self._meter is None:
            return []
        return [d for d, gpu in self._gpus.items() if gpu.baseline is not None]

    # --- the ledger: exact, no measurement ------------------------------------------------------------------
    def allocated(self, vgpu: int, size: int) -> None:
        if 0 <= vgpu < len(self._vgpus):
            self._vgpus[vgpu].ledger += size

    def freed(self, vgpu: int, size: int) -> None:
        if 0 <= vgpu < len(self._vgpus):
            self._vgpus[vgpu].ledger -= size

    # --- measurements ---------------------------------------------------------------------------------------
    def held(self, device: int) -> int | None:
        """The process's bytes on physical GPU `device` now (None without a meter, or when it cannot tell)."""
        return None if self._meter is None else self._meter.held(device)

    def context_made(self, vgpu: int, held_before: int | None) -> None:
        """After a context was made for `vgpu`: the first one's cost on its GPU is the baseline, never counted, and
        so is what the first context of each later vGPU of that GPU added (`held_before`: held before it)."""
        if self._open_meter is not None:  # the first context of the session, on any GPU
            opener, self._open_meter = self._open_meter, None
            self._meter = opener()
            if self._meter is None:
                log.info("session %d: the vGPU quota counts cuMemAlloc* allocations only (no NVML in this worker)",
                         self._session)
        if not 0 <= vgpu < len(self._vgpus) or self._vgpus[vgpu].has_context:
            return
        self._vgpus[vgpu].has_context = True
        device = self.devices[vgpu]
        gpu = self._gpu(device)
        if self._meter is None:
            return
        held = self._meter.held(device)
        if gpu.baseline is not None:  # a later vGPU's own context on a GPU already measured
            if held and held_before is not None:
                gpu.baseline += max(0, held - held_before)
            return
        if not held:  # NVML does not list this process (another PID namespace), or cannot say
            log.warning("session %d: NVML does not report this process's memory on GPU %d; the vGPU quota counts "
                        "cuMemAlloc* allocations only", self._session, device)
            self._meter = None
            return
        gpu.baseline = held
        log.debug("session %d: its first context on GPU %d holds %d bytes (not counted)", self._session, device, held)

    def note(self, device: int, held: int | None, on: int | None = None) -> int | None:
        """Take a measurement of physical GPU `device` made by the caller (None: it could not be made; nothing
        changes). A change is laid on vGPU `on` (None: the current context's, where that is on `device`, else the
        GPU's first vGPU of the session); that vGPU, or None when nothing was measured."""
        gpu = self._gpu(device)
        if gpu.baseline is None:
            return None
        gpu.stale = False
        if held is None:  # a failed measurement keeps the last one (and is not retried at every use)
            return None
        current = self._current() if on is None else on
        if not (0 <= current < len(self._vgpus) and self.devices[current] == device):
            current = self.devices.index(device)
        vgpus = self._on(device)
        beyond = max(0, held - gpu.baseline - sum(v.ledger for v in vgpus))
        change = beyond - sum(v.beyond for v in vgpus)
        first = self._vgpus[current]
        if change >= 0:
            first.beyond += change
            return current
        for vgpu in [first] + [v for v in vgpus if v is not first]:  # a shrink: that vGPU's part first
            taken = min(vgpu.beyond, -change)
            vgpu.beyond -= taken
            change += taken
        return current

    def refresh(self, vgpu: int) -> int:
        """Measure the GPU of `vgpu` now; its counted bytes."""
        device = self.devices[vgpu]
        if device in self.measured_devices():
            self.note(device, self.held(device))
        return self.counted(vgpu)

    def contexts_ended(self) -> None:
        """After contexts may have ended: a GPU where the process now holds nothing (no context left there) is
        counted afresh, its next context a first one (the baseline); elsewhere it is measured at the next use."""
        for device in self.measured_devices():
            if self.held(device) == 0:
                self._gpus[device] = _Gpu()
                for vgpu in self._on(device):
                    vgpu.beyond, vgpu.has_context = 0, False
        self.may_have_changed()

    def may_have_changed(self) -> None:
        """After a call that may change what the process holds outside the ledger: measure at the next use."""
        for gpu in self._gpus.values():
            gpu.stale = gpu.baseline is not None

    def counted(self, vgpu: int) -> int:
        """The bytes counted against `vgpu`'s quota (its GPU measured first if something may have changed)."""
        if not 0 <= vgpu < len(self._vgpus):
            return 0
        device = self.devices[vgpu]
        gpu = self._gpu(device)
        if gpu.stale and self._meter is not None:
            self.note(device, self._meter.held(device))
        return self.known(vgpu)

    def known(self, vgpu: int) -> int:
        """`counted` as of the last measurement (none is made)."""
        if not 0 <= vgpu < len(self._vgpus):
            return 0
        return self._vgpus[vgpu].ledger + self._vgpus[vgpu].beyond
