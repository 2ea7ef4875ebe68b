"""Turning forwarding on: `activate()` explicitly, or automatically from the `.pth` hook (startup.py) when
Orion's environment is present (ORION_VGPU, ORION_CONTROLLER or ORION_SHM).

It must run before anything imports cuda.bindings.driver, cuda.core or numba.cuda: those copy the driver's
function pointers when first imported (docs/cuda-forwarding.md). Nothing connects to the host agent here;
the first CUDA call does, and that is also when vGPUs are requested from the Orion Controller, as Orion's
client does "when the app initialises CUDA" (allocation.py; only if a controller is configured and ORION_VGPU
is set), on the host serving the channel, and taken up by the session there. A refused or failed request makes
cuInit answer CUDA_ERROR_NO_DEVICE with one line on stderr.

At exit one handler, registered by `activate()` so that it runs after the program's own handlers and those of
libraries imported later (atexit is last in, first out), ends the session and then gives the vGPUs back. It
imports nothing, takes no lock another thread may hold and waits only with a bound (allocation.EXIT_TIMEOUT_S):
an import at exit once hung a CuPy program for 300 s (capsule_hook.py).
"""
from __future__ import annotations

import atexit
import importlib
import logging
import os
import sys
from collections.abc import Callable, Mapping

from ivshmem.channel import ClientChannel
from ivshmem.driver_api import CALLS, table_digest
from ivshmem.errors import WireError
from ivshmem.record import AGENT_INFO_REPLY, BIND_REQUEST, GRANT_JOIN_REQUEST, GRANT_SHARE_REPLY, Op, Status
from ivshmem.region import Region

from . import allocation, call_stats, capsule_hook
from .client_config import ClientConfigError
from .forward import Forwarder
from .runtime_shim import RuntimeShim

log = logging.getLogger(__name__)
_forwarder: Forwarder | None = None
_without_allocation = False  # a controller was asked and gave nothing: Orion's exit line says so


class NoAllocation(WireError):
    """The controller gave this process no vGPUs (unreachable, refused, or bad ORION_* settings); a WireError
    so that the Forwarder treats it as any unreachable agent: one line on stderr, CUDA_ERROR_NO_DEVICE."""


def _at_exit() -> None:
    """End the session (a clean release the host sees at once), then release the vGPUs with Orion's exit line."""
    if _forwarder is not None:
        _forwarder.close()
    if _without_allocation:
        allocation.say_exit_without_allocation()
    allocation.release_at_exit()


def take_up_vgpus(channel: ClientChannel) -> allocation.Allocation | None:
    """Ask the configured controller for ORION_VGPU vGPUs of ORION_GMEM MiB on the host serving ``channel``, and
    bind them to this session (wire opcodes AGENT_INFO, then BIND). None when no controller is configured or
    ORION_VGPU is unset: then nothing changes, the session gets the agent's default devices and quota.

    A grant is shared with the processes this one starts (host_agent/session/grant_sharing.py): after BIND the
    session's token goes into ORION_GRANT (GRANT_SHARE), and with ORION_GRANT set this session joins that grant
    (GRANT_JOIN) instead; a refused join is said once, and the controller asked as without it."""
    global _without_allocation
    token = os.environ.get("ORION_GRANT", "")
    try:
        if token and allocation.wanted_request() is not None:
            joined = channel.call(Op.GRANT_JOIN, GRANT_JOIN_REQUEST.encode(token))
            if joined.ok:
                return None
            reason = ("the host agent predates sharing" if joined.status == Status.UNKNOWN_OPCODE
                      else bytes(joined.payload).decode(errors="replace"))
            print(f"orion: did not join the vGPUs of the process that shared them ({reason}); asking the Orion "
                  f"Controller for this process's own", file=sys.stderr)
        alloc = allocation.acquire_configured(lambda: _agent_host(channel))
        if alloc is None:
            return None
        reply = channel.call(Op.BIND, BIND_REQUEST.encode(alloc.id))
        if not reply.ok:
            allocation.abandon()
            raise allocation.AllocationError(f"host {alloc.host} did not take up allocation {alloc.id}: "
                                             f"{bytes(reply.payload).decode(errors='replace')}")
        shared = channel.call(Op.GRANT_SHARE)
        if shared.ok:  # (a relayed session, an agent that predates sharing: nothing is shared)
            os.environ["ORION_GRANT"] = GRANT_SHARE_REPLY.decode(shared.payload)[0]
        return alloc
    except (ClientConfigError, allocation.AllocationError) as exc:
        _without_allocation = True
        raise NoAllocation(str(exc)) from None


def _agent_host(channel: ClientChannel) -> str:
    """The name, in the controller's pool, of the host whose oriond serves this channel."""
    reply = channel.call(Op.AGENT_INFO)
    host, _controller = AGENT_INFO_REPLY.decode(reply.payload) if reply.ok else ("", "")
    return allocation.serving_host(host, channel.region.where, reply.status != Status.UNKNOWN_OPCODE)


def _connect() -> ClientChannel:
    region = Region.discover()  # $ORION_SHM, an ivshmem PCI device, or /dev/shm/orionsock<N>
    channel = ClientChannel.claim(region)
    if call_stats.ENABLED:
        call_stats.watch(channel)
    try:
        channel.hello(table_digest())  # an agent built from another call table refuses here, in one line
        take_up_vgpus(channel)
    except BaseException:
        channel.close()
        raise
    return channel


def same_signature(implementations: Mapping[str, Callable[..., int]],
                   wheel: Mapping[str, str]) -> dict[str, Callable[..., int]]:
    """The implementations whose C signature in the installed cuda-bindings (`wheel`: name -> signature) is the
    one the call table forwards. Another wheel's version of a function (other parameters) would hand it
    arguments it misreads, so that function is left to the fallback (CUDA_ERROR_NOT_SUPPORTED), said once. A
    function an older wheel lacks (cuda-bindings 13.3 has no cuTensorMapSetAllocationClass) no program can call
    through it: nothing to hook."""
    kept = {}
    for name, implementation in implementations.items():
        theirs = wheel.get(name)
        if theirs is None:
            continue
        if theirs != CALLS[name].signature:
            log.warning("orion: %s is %s in this cuda-bindings, but Orion forwards %s: not forwarded (install "
                        "orion-guest[cuda], the cuda-bindings it was built for)", name, theirs,
                        CALLS[name].signature)
            continue
        kept[name] = implementation
    return kept


def activate() -> Forwarder:
    """Route every CUDA driver call of this process to the host agent, and the runtime API (cuda.bindings.runtime)
    through a shim built on those calls. Idempotent."""
    global _forwarder
    if _forwarder is None:
        forwarder = Forwarder(_connect)
        driver = forwarder.implementations()
        if call_stats.ENABLED:  # ORION_STATS: each driver function counted (call_stats.py)
            driver = {name: call_stats.counted(name, function) for name, function in driver.items()}
        wheel = importlib.import_module("cuda.bindings.cydriver").__pyx_capi__
        capsule_hook.install("cuda.bindings.cydriver",
                             same_signature(driver, {n: capsule_hook.capsule_signature(c) for n, c in wheel.items()}))
        _forwarder = forwarder
        atexit.register(_at_exit)  # after the hook's own handler, so it runs before that one
        if call_stats.ENABLED:
            atexit.register(call_stats.report)  # after _at_exit, so it runs first: the session still open
        shim = RuntimeShim(driver)  # cyruntime's statically linked cudart would bypass the driver hook
        try:
            capsule_hook.install("cuda.bindings.cyruntime", shim.implementations(), shim.fallback)
        except (capsule_hook.HookError, ImportError) as exc:  # the driver API still works: say what does not
            log.warning("orion: the CUDA runtime API (cuda.bindings.runtime) is not forwarded: %s", exc)
    return _forwarder
