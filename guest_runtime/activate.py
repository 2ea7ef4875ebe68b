"""Turning forwarding on: `activate()` explicitly, or automatically from the `.pth` hook when Orion's
environment is present (ORION_VGPU, ORION_CONTROLLER or ORION_SHM).

It must run before anything imports cuda.bindings.driver, cuda.core or numba.cuda: those copy the driver's
function pointers when first imported (docs/cuda-forwarding.md). Nothing connects to the host agent here;
the first CUDA call does.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from ivshmem.channel import ClientChannel
from ivshmem.region import Region

from . import capsule_hook
from .forward import Forwarder
from .runtime_shim import RuntimeShim

log = logging.getLogger(__name__)
TRIGGERS = ("ORION_VGPU", "ORION_CONTROLLER", "ORION_SHM")
_forwarder: Forwarder | None = None


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether Orion's environment asks for forwarding in this process."""
    return any(environ.get(name) for name in TRIGGERS)


def _connect() -> ClientChannel:
    region = Region.discover()  # $ORION_SHM, an ivshmem PCI device, or /dev/shm/orionsock<N>
    return ClientChannel.claim(region)


def activate() -> Forwarder:
    """Route every CUDA driver call of this process to the host agent, and the runtime API (cuda.bindings.runtime)
    through a shim built on those calls. Idempotent."""
    global _forwarder
    if _forwarder is None:
        forwarder = Forwarder(_connect)
        driver = forwarder.implementations()
        capsule_hook.install("cuda.bindings.cydriver", driver)
        _forwarder = forwarder
        shim = RuntimeShim(driver)  # cyruntime's statically linked cudart would bypass the driver hook
        try:
            capsule_hook.install("cuda.bindings.cyruntime", shim.implementations(), shim.fallback)
        except (capsule_hook.HookError, ImportError) as exc:  # the driver API still works: say what does not
            log.warning("orion: the CUDA runtime API (cuda.bindings.runtime) is not forwarded: %s", exc)
    return _forwarder


def autoload() -> None:
    """Called from orion_guest.pth at interpreter start-up: cheap unless Orion's environment is set."""
    if not wanted():
        return
    try:
        activate()
    except Exception as exc:  # never break the interpreter's start-up
        import sys
        print(f"orion: CUDA forwarding is not active: {exc}", file=sys.stderr)
