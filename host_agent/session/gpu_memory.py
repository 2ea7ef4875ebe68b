"""How many bytes this process holds on a physical GPU, as the driver's NVML sees it.

A session's vGPU quota must count everything its worker process really holds on the GPU — module globals,
extra contexts, lazily loaded code, local memory — not only what cuMemAlloc* returned. Each session has its
own worker process, so the process's own line in NVML's list of compute processes is exactly that session's
usage. This module answers that one question; what counts against a quota is the executor's business.

NVML is initialised lazily, inside the session worker that asks, never in oriond's serving process before it
forks (the same caution as for CUDA: docs/architecture.md). Where NVML cannot answer — no libnvidia-ml (CI
machines), a MIG instance, a PID namespace in which NVML does not list this process — ``open_nvml`` and
``NvmlMeter.held`` say so (None), the caller logs it once and falls back to counting allocations only.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)

NOT_AVAILABLE = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE for an unsigned long long


class MemoryMeter(Protocol):
    """Bytes the calling process holds on one physical GPU (a CUDA ordinal); None when it cannot tell."""

    def held(self, device: int) -> int | None: ...


MeterFactory = Callable[[Any], "MemoryMeter | None"]  # from the session's (initialised) driver; None: no meter


def uuid_text(raw: bytes) -> str:
    """NVML's spelling of a CUDA device UUID: ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


class NvmlHandles:
    """NVML's handle of a physical GPU (a CUDA ordinal), found by its CUDA UUID (NVML's device order may differ from
    CUDA's, so never by index), kept once found. Shared by the meter here and NVML_QUERY (nvml_queries.py)."""

    def __init__(self, nvml: Any, driver: Any) -> None:
        self._nvml, self._driver = nvml, driver
        self._handles: dict[int, Any] = {}

    def handle(self, device: int) -> Any:
        """LookupError when the driver cannot name the GPU; the NVML error when NVML does not know it."""
        if device not in self._handles:
            err, uuid = self._driver.cuDeviceGetUuid(device)
            if int(err) != 0:
                raise LookupError(f"cuDeviceGetUuid({device}) failed with {err}")
            self._handles[device] = self._nvml.device_get_handle_by_uuid(uuid_text(bytes(uuid.bytes)[:16]))
        return self._handles[device]


class NvmlMeter:
    """NVML's `used_gpu_memory` of this process on a GPU."""

    def __init__(self, nvml: Any, driver: Any) -> None:
        self._nvml = nvml
        self._handles = NvmlHandles(nvml, driver)

    def held(self, device: int) -> int | None:
        """This process's bytes on `device`: 0 while it has no context there, None if NVML cannot say."""
        try:
            processes = self._nvml.device_get_compute_running_processes_v3(self._handles.handle(device))
        except (self._nvml.NvmlError, LookupError) as exc:
            log.debug("NVML cannot list the processes of GPU %d: %s", device, exc)
            return None
        pid = os.getpid()
        for process in processes:
            if int(process.pid) == pid:
                used = int(process.used_gpu_memory)
                return None if used == NOT_AVAILABLE else used
        return 0


def init_nvml() -> Any:
    """cuda.bindings.nvml, initialised; None (and the reason logged) where NVML is unavailable. Call it in the
    session worker that uses it, after fork: never in oriond's serving process."""
    try:
        from cuda.bindings import nvml
        nvml.init_v2()
    except Exception as exc:  # no cuda.bindings.nvml, no libnvidia-ml (DynamicLibNotFoundError), NvmlError
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log.info("NVML is not available (%s)", reason)
        return None
    return nvml


def open_nvml(driver: Any) -> NvmlMeter | None:
    """An NvmlMeter for this process (init_nvml); None where NVML is unavailable."""
    nvml = init_nvml()
    return None if nvml is None else NvmlMeter(nvml, driver)
