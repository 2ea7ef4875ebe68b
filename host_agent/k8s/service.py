"""The DevicePlugin gRPC service kubelet calls: the device list as it changes, and each container's set-up.

Allocate gives a container everything Orion's guest runtime needs, so that a pod spec holds nothing but the
resource limit and ORION_GMEM: its own region bind-mounted at /dev/shm/orionsock<N> (container_regions.py),
``ORION_SHM`` naming it, ``ORION_VGPU`` the number of devices kubelet gave it, ``ORION_CONTROLLER`` where to
ask for them. The program's vGPUs are then granted on this host (the region's oriond names it in AGENT_INFO),
with the pod's ORION_GMEM, when it initialises CUDA. A request kubelet should never send (unknown or repeated
device ids, more devices than the node has) is refused with INVALID_ARGUMENT, and one for devices that are
Unhealthy with UNAVAILABLE, each with one line that says why; nothing is made for a refused request.
GetPreferredAllocation is the generated servicer's (UNIMPLEMENTED): the options say it is not offered.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

import grpc

from ..errors import RefusedError
from ..shm_admin import ShmError
from .api import HEALTHY, UNHEALTHY, pb, rpc
from .container_regions import ContainerRegions
from .devices import DeviceBoard, Snapshot, VirtualGpu

log = logging.getLogger(__name__)
CONTAINER_REGION_DIR = "/dev/shm"  # where a container finds its region (ORION_SHM says so too)
WATCH_TICK_S = 1.0  # how often an idle ListAndWatch stream looks whether kubelet went away


class Refused(RefusedError):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def list_response(snapshot: Snapshot) -> Any:
    health = HEALTHY if snapshot.healthy else UNHEALTHY
    return pb.ListAndWatchResponse(devices=[pb.Device(ID=d.id, health=health) for d in snapshot.devices])


class DevicePluginService(rpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, board: DeviceBoard, regions: ContainerRegions, controller: str,
                 stopping: Any = None) -> None:
        """`stopping`: anything with ``is_set()`` (a threading.Event); open streams end once it is set."""
        self.board, self.regions, self.controller, self.stopping = board, regions, controller, stopping

    def GetDevicePluginOptions(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)

    def ListAndWatch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        """The whole list at once, then again after every change, until kubelet hangs up or the plugin stops."""
        now = self.board.snapshot()
        log.info("kubelet is watching the device list (%d device(s))", len(now.devices))
        yield list_response(now)
        while context.is_active() and not (self.stopping is not None and self.stopping.is_set()):
            newer = self.board.wait_newer(now.generation, WATCH_TICK_S)
            if newer.generation != now.generation:
                now = newer
                yield list_response(now)

    def Allocate(self, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            wanted = [self._devices(list(c.devices_ids)) for c in request.container_requests]
            if not wanted:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "the request names no container")
            _no_device_twice(wanted)
            return pb.AllocateResponse(container_responses=[self._set_up(devices) for devices in wanted])
        except Refused as exc:
            log.warning("Allocate refused (%s): %s", exc.code.name, exc)
            _abort(context, exc)

    def PreStartContainer(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.PreStartContainerResponse()

    def _devices(self, ids: Sequence[str]) -> list[VirtualGpu]:
        """The devices of one container's request, checked against the board."""
        now = self.board.snapshot()
        known = {d.id: d for d in now.devices}
        if not ids:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "a container request names no device")
        if len(ids) > len(known):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"a container asks for {len(ids)} devices; this node "
                                                            f"has {len(known)} vGPU(s)")
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                          f"unknown device id(s) {', '.join(map(repr, unknown[:8]))}; this node's are "
                          f"{', '.join(sorted(known)[:8]) or 'none'}{' …' if len(known) > 8 else ''}")
        if not now.healthy:
            raise Refused(grpc.StatusCode.UNAVAILABLE, f"this node's vGPUs are Unhealthy: {now.why}")
        return sorted(known[i] for i in ids)

    def _set_up(self, devices: list[VirtualGpu]) -> Any:
        index = devices[0].region_index
        try:
            host_path = self.regions.give(index)
        except ShmError as exc:
            raise Refused(grpc.StatusCode.INTERNAL, f"could not make the container's region: {exc}") from None
        inside = os.path.join(CONTAINER_REGION_DIR, os.path.basename(host_path))
        log.info("Allocate: %s -> region %s (in the container %s), ORION_VGPU=%d", ", ".join(d.id for d in devices),
                 host_path, inside, len(devices))
        return pb.ContainerAllocateResponse(
            envs={"ORION_SHM": inside, "ORION_VGPU": str(len(devices)), "ORION_CONTROLLER": self.controller},
            mounts=[pb.Mount(container_path=inside, host_path=host_path, read_only=False)])


def _no_device_twice(wanted: list[list[VirtualGpu]]) -> None:
    seen: set[str] = set()
    for devices in wanted:
        for device in devices:
            if device.id in seen:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"device {device.id} is named twice in one request")
            seen.add(device.id)


def _abort(context: grpc.ServicerContext, refusal: Refused) -> NoReturn:
    context.abort(refusal.code, str(refusal))
    raise AssertionError("context.abort returned")  # it raises; this tells the type checker so
