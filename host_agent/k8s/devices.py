"""This node's vGPUs as kubelet's devices, and the board that ListAndWatch streams them from.

A device is one vGPU slot of one GPU of this host, as the controller's pool lists it (GPU index, slot): the
resource counts vGPUs, as Orion's does (``virtaitech.com/gpu: 4`` on a host of one GPU carved in four). Which
GPU a container's vGPUs land on is still the controller's choice when the program starts, so a device id is
only a token kubelet counts with; it stays the same across restarts of the plugin while the pool does.

Health: every device is Healthy while the controller answers and lists this host (its oriond heartbeats); when
the host leaves the pool (oriond stopped or its lease ran out) or the controller cannot be reached, the last
devices stay listed, Unhealthy, so kubelet stops placing pods here without forgetting the node's capacity.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..daemon.config import VGPU_RANGE
from ..errors import ConfigurationError

SLOTS_PER_GPU = VGPU_RANGE[1]  # vgpu_count's upper bound: keeps the devices' region indices apart

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class VirtualGpu:
    gpu: int  # the GPU's index on this host, as registered with the controller
    slot: int  # the vGPU's slot on that GPU

    @property
    def id(self) -> str:
        return f"vgpu-{self.gpu}-{self.slot}"

    @property
    def region_index(self) -> int:
        """The index of the region of a container whose first device this is: one per device, so no two live
        containers share one (kubelet gives a device to one container at a time)."""
        return self.gpu * SLOTS_PER_GPU + self.slot


class MalformedPool(ConfigurationError, ValueError):
    """The controller's pool answer is not of the documented shape."""


def node_vgpus(pool: Mapping[str, Any], host: str) -> list[VirtualGpu] | None:
    """The vGPUs of `host` in a ``GET /api/v1/pool`` answer, sorted; None when the host is not in the pool."""
    try:
        for entry in pool["hosts"]:
            if entry["host"] == host:
                return sorted(VirtualGpu(int(gpu["index"]), slot)
                              for gpu in entry["gpus"] for slot in range(int(gpu["vgpu_count"])))
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedPool(f"the controller's pool answer is malformed ({type(exc).__name__}: {exc})") from None
    return None


@dataclass(frozen=True)
class Snapshot:
    generation: int  # grows by one with every change
    devices: tuple[VirtualGpu, ...]
    healthy: bool
    why: str  # why the devices are unhealthy ("" when healthy)


class DeviceBoard:
    """The device list and its health, shared by the pool watch (which writes it) and the gRPC service (which
    reads it and waits for changes). Safe to use from any thread."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._now = Snapshot(0, (), False, "the controller has not been asked yet")

    def show(self, vgpus: Iterable[VirtualGpu] | None, why: str = "") -> bool:
        """Post what the controller said: this host's vGPUs (all healthy), or None with `why` they cannot be
        used now (the last list stays, unhealthy). True when that changed the board."""
        with self._changed:
            now = self._now
            devices = now.devices if vgpus is None else tuple(vgpus)
            healthy = vgpus is not None
            if (devices, healthy) == (now.devices, now.healthy) and (healthy or why == now.why):
                return False
            self._now = Snapshot(now.generation + 1, devices, healthy, "" if healthy else why)
            self._changed.notify_all()
        if healthy:
            log.info("%d vGPU(s) of this node are Healthy: %s", len(devices), _ids(devices))
        elif devices:
            log.warning("%d vGPU(s) of this node are Unhealthy: %s", len(devices), why)
        else:
            log.warning("no vGPU to advertise yet: %s", why)
        return True

    def snapshot(self) -> Snapshot:
        with self._changed:
            return self._now

    def wait_newer(self, generation: int, timeout_s: float) -> Snapshot:
        """The board once it is newer than `generation`, or as it is after `timeout_s`."""
        with self._changed:
            self._changed.wait_for(lambda: self._now.generation != generation, timeout_s)
            return self._now


def _ids(devices: Iterable[VirtualGpu]) -> str:
    names = [d.id for d in devices]
    return ", ".join(names) if len(names) <= 8 else f"{', '.join(names[:8])}, … ({len(names)} in all)"
