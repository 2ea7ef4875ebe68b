"""Each vGPU its own primary context, where two vGPUs of one session are one physical GPU.

CUDA gives every device one primary context and names the device of every context. The controller may give one
process several vGPUs of one GPU (Orion's guide: `ORION_VGPU=4` on two GPUs), which the guest sees as several
devices, so it must see as many primary contexts, each naming its own device. The first vGPU of a GPU keeps the
GPU's real primary context; every later vGPU of that GPU gets a context of its own (cuCtxCreate), a stand-in that
this module retains, releases, resets and flags as the driver does a primary context: made at the first retain
without becoming current, destroyed at the last release or at a reset (which, as the driver's, keeps its references:
the next retain makes it again), its flags kept until a reset.

Every context the session makes for a vGPU (a primary, cuCtxCreate on that vGPU) is remembered with it, so a device
the driver names for a context (cuCtxGetDevice, a stream's or a pointer's device) is told back as the vGPU of that
context, and memory is counted against the quota of the vGPU whose context made it (vgpu_quota.py). A session whose
vGPUs are all different GPUs needs none of this: `shared` is False, no stand-in exists and every answer is the
driver's.

Two vGPUs of one GPU are peers that can reach each other's memory, as two GPUs joined by NVLink are: measured on an
H200, a kernel of one context reads memory another context of its process made on the same GPU, without any peer
access enabled (the driver refuses to enable it between contexts of one GPU: CUDA_ERROR_PEER_ACCESS_UNSUPPORTED).
So each peer query of such a pair answers what a GPU with peer access answers (cuDeviceCanAccessPeer 1), and
enabling and disabling peer access between their contexts is kept here and answered as the driver answers it for two
GPUs (SUCCESS, then CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED; disabling what is not enabled
CUDA_ERROR_PEER_ACCESS_NOT_ENABLED). NCCL then moves data between them as between two GPUs.

Every device has its own PCI address and UUID, which NCCL (it refuses two ranks on one device) and NVML tell devices
apart by. A vGPU's slot on its GPU decides them: slot 0 reports its GPU's own; slot k its GPU's bus and device
number in PCI domain (the GPU's domain + k·0x100), the next free one where that is taken, every GPU of the host and
every slot counted (GPUs of a virtual machine may share bus 0, so another device number could be a neighbour's), and
its GPU's UUID with the last byte changed by k. The slot is the controller's (the vGPU's place in its carving of the
GPU), so two sessions given two vGPUs of one GPU (two ranks of a job, each with ORION_VGPU=1) report two addresses;
a session without a grant numbers its vGPUs of a GPU in guest order.

Not here: what memory a vGPU counts (vgpu_quota.py), which handles the session owns (session_ledger.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ivshmem.cuda_status import (
    INVALID_CONTEXT,
    INVALID_VALUE,
    OUT_OF_MEMORY,
    PEER_ACCESS_ALREADY_ENABLED,
    PEER_ACCESS_NOT_ENABLED,
    SUCCESS,
)
from ivshmem.driver_api import DriverCall

from .. import agent_metrics
from ..handler import Reply
from .call_registry import POLICY

if TYPE_CHECKING:
    from .session_ledger import SessionLedger
    from .vgpu_quota import VgpuQuota

CU_CTX_FLAGS_MASK = 0xFF  # cuda.h: scheduling, map-host, local-memory, coredump and sync-memops flags
PCI_BUS_ID, PCI_DEVICE_ID, PCI_DOMAIN_ID = 33, 34, 50  # CUdevice_attribute
MAX_SLOTS = 100  # vGPUs of one GPU at most (controller/payloads.py MAX_VGPU_COUNT)
P2P_PERFORMANCE_RANK = 1  # CUdevice_P2PAttribute: the rank is 0 (the best); the other three are 1 (supported)
P2P_ATTRIBUTES = frozenset({1, 2, 3, 4})


@dataclass
class _StandIn:
    """The primary context of a vGPU that is not the first of its GPU."""
    context: int = 0  # 0: inactive
    references: int = 0
    flags: int = 0


class VgpuContexts:
    """Which vGPU each of the session's contexts is for, and the stand-in primary contexts."""

    def __init__(self, driver: Any, devices: tuple[int, ...]) -> None:
        self.driver = driver
        self.assign(devices)

    def assign(self, devices: tuple[int, ...], slots: tuple[int, ...] = ()) -> None:
        """The session's vGPUs (the physical GPU of each guest ordinal) and their slots on their GPUs (the
        controller's; () without a grant: their order among the session's vGPUs of that GPU); before any context
        (BIND's rule)."""
        self.devices = devices
        self.slots = slots if len(slots) == len(devices) else tuple(devices[:o].count(d) for o, d in enumerate(devices))
        self.shared = len(set(devices)) < len(devices)
        self._stand_ins = {o: _StandIn() for o, d in enumerate(devices) if devices.index(d) != o}
        self._vgpu_of: dict[int, int] = {}  # context -> guest ordinal (only while `shared`)
        self._slot_domains: dict[tuple[int, int], int] | None = None  # (GPU, slot) -> its PCI domain, once asked
        self._peers: set[tuple[int, int]] = set()  # (context, peer context) with peer access enabled, one GPU's

    def pci_domain(self, ordinal: int) -> int | None:
        """The PCI domain a vGPU reports (None: its GPU's own, for slot 0; module docstring)."""
        slot = self.slots[ordinal]
        if not slot:
            return None
        if self._slot_domains is None:  # every GPU's every slot, in one order: each session finds the same
            gpus = [self._address(d) for d in range(self._count())]
            taken, domains = set(gpus), {}
            for gpu, (domain, bus, number) in enumerate(gpus):
                for each in range(1, MAX_SLOTS):
                    candidate = (domain + each * 0x100) & 0xFFFF
                    while (candidate, bus, number) in taken:
                        candidate = (candidate + 1) & 0xFFFF
                    taken.add((candidate, bus, number))
                    domains[gpu, each] = candidate
            self._slot_domains = domains
        return self._slot_domains.get((self.devices[ordinal], slot))

    def uuid(self, ordinal: int, gpu_uuid: bytes) -> bytes:
        """The UUID a vGPU reports: its GPU's, the last byte changed by its slot (slot 0: unchanged)."""
        slot = self.slots[ordinal] & 0xFF
        return gpu_uuid[:-1] + bytes([gpu_uuid[-1] ^ slot]) if slot and gpu_uuid else gpu_uuid

    def _count(self) -> int:
        err, count = self.driver.cuDeviceGetCount()
        return int(count) if int(err) == SUCCESS else 0

    def _address(self, physical: int) -> tuple[int, int, int]:
        """(domain, bus, device) of a GPU of the host."""
        values = []
        for attribute in (PCI_DOMAIN_ID, PCI_BUS_ID, PCI_DEVICE_ID):
            err, value = self.driver.cuDeviceGetAttribute(self.driver.CUdevice_attribute(attribute), physical)
            values.append(int(value) if int(err) == SUCCESS else -1)
        return values[0], values[1], values[2]

    def one_gpu(self, ordinal: int, peer: int | None) -> bool:
        """Whether two different vGPUs (valid guest ordinals; None: not one of the session's) are one GPU."""
        return self.shared and peer is not None and ordinal != peer and self.devices[ordinal] == self.devices[peer]

    def of(self, context: int) -> int | None:
        """The vGPU a context of the session was made for (None: not known)."""
        return self._vgpu_of.get(context)

    def stand_in(self, ordinal: int) -> bool:
        """Whether a (valid) guest ordinal's primary context is a stand-in, not the GPU's own."""
        return ordinal in self._stand_ins

    def made(self, context: int, ordinal: int) -> None:
        """A context was made for vGPU `ordinal` (cuCtxCreate, or the GPU's own primary context retained)."""
        if self.shared and context:
            self._vgpu_of[context] = ordinal
            self._forget_peers(context)  # a handle seen before names a new context now

    def enable_peer(self, context: int, peer: int, flags: int) -> int:
        """cuCtxEnablePeerAccess from `context` to `peer`, contexts of two vGPUs of one GPU."""
        if flags:
            return INVALID_VALUE  # the driver's answer: no flag is defined
        if (context, peer) in self._peers:
            return PEER_ACCESS_ALREADY_ENABLED
        self._peers.add((context, peer))
        return SUCCESS

    def disable_peer(self, context: int, peer: int) -> int:
        """cuCtxDisablePeerAccess from `context` to `peer`, contexts of two vGPUs of one GPU."""
        if (context, peer) not in self._peers:
            return PEER_ACCESS_NOT_ENABLED
        self._peers.discard((context, peer))
        return SUCCESS

    def _forget_peers(self, context: int) -> None:
        self._peers = {pair for pair in self._peers if context not in pair}

    # --- the guest's ordinal of a device the driver names ---------------------------------------------------
    def vgpu(self, physical: int, context: int | None = None) -> int:
        """The guest ordinal of a physical GPU the driver named for `context` (None: the current one): the vGPU
        that context was made for, else the first vGPU of that GPU (-1: not one of the session's GPUs)."""
        if physical not in self.devices:
            return -1
        if self.shared:
            ordinal = self._vgpu_of.get(self.current_context() if context is None else context)
            if ordinal is not None and self.devices[ordinal] == physical:
                return ordinal
        return self.devices.index(physical)

    def current_vgpu(self) -> int:
        """The vGPU of the current context (-1: no current context, or not one of the session's GPUs)."""
        if len(self.devices) == 1:
            return 0
        err, device = self.driver.cuCtxGetDevice()
        return self.vgpu(int(device)) if int(err) == SUCCESS else -1

    def current_context(self) -> int:
        """The host thread's current context (0: none), which is the calling guest thread's."""
        err, context = self.driver.cuCtxGetCurrent()
        return int(context) if int(err) == SUCCESS else 0

    # --- stand-in primary contexts (cuDevicePrimaryCtx* of a vGPU that is not its GPU's first) ---------------
    def retain(self, ordinal: int) -> tuple[int, int]:
        """(status, context): made at the first retain with the flags set so far; the current context stays."""
        stand_in = self._stand_ins[ordinal]
        if not stand_in.context:
            err, context = self.driver.cuCtxCreate(None, stand_in.flags, self.devices[ordinal])
            if int(err) != SUCCESS:
                return int(err), 0
            self.driver.cuCtxPopCurrent()  # cuCtxCreate pushed it; a retain changes no thread's context
            stand_in.context = int(context)
            self._vgpu_of[stand_in.context] = ordinal
        stand_in.references += 1
        return SUCCESS, stand_in.context

    def release(self, ordinal: int) -> tuple[int, int]:
        """(status, the context destroyed by this release or 0): the last release destroys it, as the driver's."""
        stand_in = self._stand_ins[ordinal]
        if not stand_in.references:
            return INVALID_CONTEXT, 0
        stand_in.references -= 1
        return SUCCESS, self._destroy(stand_in) if not stand_in.references else 0

    def reset(self, ordinal: int) -> int:
        """The context destroyed (0: none was made); the flags go back to 0. Its references stay: cuda.h's reset
        "does not release" the primary context, and a later release by whoever retained it is "safe". The next
        retain makes a context again, with a new handle (the driver's keeps its handle: not given here)."""
        stand_in = self._stand_ins[ordinal]
        stand_in.flags = 0
        return self._destroy(stand_in)

    def set_flags(self, ordinal: int, flags: int) -> int:
        """The flags of the next context made; an active one takes them now (the driver allows it since 11.0)."""
        if flags & ~CU_CTX_FLAGS_MASK:
            return INVALID_VALUE
        stand_in = self._stand_ins[ordinal]
        if stand_in.context and hasattr(self.driver, "cuCtxSetFlags"):
            (err,) = self.driver.cuCtxPushCurrent(stand_in.context)
            if int(err) != SUCCESS:
                return int(err)
            (err,) = self.driver.cuCtxSetFlags(flags)
            self.driver.cuCtxPopCurrent()
            if int(err) != SUCCESS:
                return int(err)
        stand_in.flags = flags
        return SUCCESS

    def state(self, ordinal: int) -> tuple[int, int]:
        """cuDevicePrimaryCtxGetState: (flags, active): active while retained, a reset notwithstanding."""
        stand_in = self._stand_ins[ordinal]
        return stand_in.flags, int(stand_in.references > 0)

    def _destroy(self, stand_in: _StandIn) -> int:
        context, stand_in.context = stand_in.context, 0
        if context:
            self._vgpu_of.pop(context, None)
            self._forget_peers(context)
            self.driver.cuCtxDestroy(context)
        return context


class VgpuContextCalls:
    """The policies of the primary-context calls (a stand-in's are answered here, every other vGPU's by the driver
    on the generic path) and of the peer-access calls (two vGPUs of one GPU are peers). A CudaExecutor mixin."""

    # CudaExecutor's, set in its __init__
    contexts: VgpuContexts
    ledger: SessionLedger
    quota: VgpuQuota
    _record: Callable[[DriverCall, tuple[int, ...], list[Any]], None]
    forget_freed_allocations: Callable[[], None]

    def _stand_in(self, ordinal: int) -> bool:
        return 0 <= ordinal < len(self.ledger.devices) and self.contexts.stand_in(ordinal)

    @POLICY.serves("cuDevicePrimaryCtxRetain")
    def _primary_retain(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        """A stand-in is made at its first retain; past the vGPU's quota it is undone (OUT_OF_MEMORY), as the
        generic path undoes a primary context's."""
        (ordinal,) = args
        if not self._stand_in(ordinal):
            return None
        before = self.quota.usage_before()
        err, context = self.contexts.retain(ordinal)
        if err != SUCCESS:
            return Reply(err)
        if self.quota.past_quota(before, ordinal, lambda: self._primary_gone(ordinal, *self.contexts.release(ordinal))):
            agent_metrics.refused("quota")
            return Reply(OUT_OF_MEMORY)
        self._record(call, args, [context])
        return Reply(SUCCESS, call.outputs.pack(context))

    @POLICY.serves("cuDevicePrimaryCtxRelease")
    def _primary_release(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        (ordinal,) = args
        if not self._stand_in(ordinal):
            return None
        err, gone = self.contexts.release(ordinal)
        self._primary_gone(ordinal, err, gone)
        if err == SUCCESS:
            self._record(call, args, [])
        return Reply(err)

    @POLICY.serves("cuDevicePrimaryCtxReset")
    def _primary_reset(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        (ordinal,) = args
        if not self._stand_in(ordinal):
            return None
        self._primary_gone(ordinal, SUCCESS, self.contexts.reset(ordinal))
        self._record(call, args, [])
        return Reply(SUCCESS)

    @POLICY.serves("cuDevicePrimaryCtxSetFlags")
    def _primary_set_flags(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        ordinal, flags = args
        return Reply(self.contexts.set_flags(ordinal, flags)) if self._stand_in(ordinal) else None

    @POLICY.serves("cuDevicePrimaryCtxGetState")
    def _primary_state(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        (ordinal,) = args
        if not self._stand_in(ordinal):
            return None
        return Reply(SUCCESS, call.outputs.pack(*self.contexts.state(ordinal)))

    def _primary_gone(self, ordinal: int, err: int, context: int) -> None:
        """A stand-in was destroyed: its handle names nothing of the session's any more, and the allocations made
        in it are gone."""
        if err == SUCCESS and context:
            self.ledger.handles["CUcontext"].discard(context)
            self.forget_freed_allocations()

    # --- peer access between two vGPUs of one GPU ----------------------------------------------------------
    @POLICY.serves("cuDeviceCanAccessPeer")
    def _can_access_peer(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        device, peer = args
        return Reply(SUCCESS, call.outputs.pack(1)) if self._one_gpu(device, peer) else None

    @POLICY.serves("cuDeviceGetP2PAttribute")
    def _p2p_attribute(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        attribute, device, peer = args
        if attribute not in P2P_ATTRIBUTES or not self._one_gpu(device, peer):
            return None
        return Reply(SUCCESS, call.outputs.pack(0 if attribute == P2P_PERFORMANCE_RANK else 1))

    @POLICY.serves("cuCtxEnablePeerAccess")
    def _enable_peer_access(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        pair = self._peer_pair(args[0])
        return None if pair is None else Reply(self.contexts.enable_peer(*pair, args[1]))

    @POLICY.serves("cuCtxDisablePeerAccess")
    def _disable_peer_access(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        pair = self._peer_pair(args[0])
        return None if pair is None else Reply(self.contexts.disable_peer(*pair))

    def _peer_pair(self, peer: int) -> tuple[int, int] | None:
        """(the current context, `peer`) where both are contexts of the session's vGPUs of one GPU, else None."""
        contexts = self.contexts
        if not contexts.shared or peer not in self.ledger.handles["CUcontext"]:
            return None
        current = contexts.current_context()
        mine, theirs = contexts.of(current), contexts.of(peer)
        return (current, peer) if mine is not None and contexts.one_gpu(mine, theirs) else None

    def _one_gpu(self, device: int, peer: int) -> bool:
        count = len(self.ledger.devices)
        return 0 <= device < count and 0 <= peer < count and self.contexts.one_gpu(device, peer)
