"""Kubelet's side of the device-plugin API, over the real gRPC wire, for the orion-k8s-plugin tests.

No kubelet can run on our machines, so this plays the part the plugin talks to, the way kubelet's device
manager does: it serves Registration on <dir>/kubelet.sock and records each RegisterRequest (refusing, as
kubelet does, a version it does not speak); after a registration it dials the plugin's endpoint in the same
directory and keeps a ListAndWatch stream open, keeping every list it receives; it calls Allocate as it
admits a container. ``restart()`` does what a restarting kubelet does to the directory: every socket in it
is deleted (the plugin's too) and kubelet.sock is made anew. ``Plugin`` runs orion-k8s-plugin as its own process.
"""
from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from host_agent.k8s.api import KUBELET_SOCKET, VERSION, pb, rpc
from tests.controller.rig import REPO
from tests.processes import python_path, stop_process


class _Registration(rpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet

    def Register(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.version != VERSION:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Unsupported version {request.version!r}")
        self.kubelet.registered(request)
        return pb.Empty()


class Kubelet:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.registrations: list[Any] = []
        self.lists: queue.Queue[list[tuple[str, str]]] = queue.Queue()  # every ListAndWatch answer, in order
        self._server: grpc.Server | None = None
        self._channel: grpc.Channel | None = None
        self._lock = threading.Lock()

    @property
    def socket(self) -> str:
        return os.path.join(self.directory, KUBELET_SOCKET)

    def start(self) -> Kubelet:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        rpc.add_RegistrationServicer_to_server(_Registration(self), server)
        assert server.add_insecure_port(f"unix:{self.socket}") != 0, f"cannot serve {self.socket}"
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._server is not None:
            self._server.stop(None).wait(5)
            self._server = None

    def restart(self) -> None:
        """As kubelet restarting: stop, delete every socket in the directory, serve a new kubelet.sock."""
        self.stop()
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if not os.path.isdir(path):
                os.unlink(path)
        self.start()

    def registered(self, request: Any) -> None:
        """After Register: dial the plugin and watch its devices, on a thread (kubelet answers Register first)."""
        with self._lock:
            self.registrations.append(request)
        threading.Thread(target=self._watch, args=(request.endpoint,), daemon=True).start()

    def _watch(self, endpoint: str) -> None:
        channel = grpc.insecure_channel(f"unix:{os.path.join(self.directory, endpoint)}")
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = channel
        try:
            for answer in rpc.DevicePluginStub(channel).ListAndWatch(pb.Empty()):
                self.lists.put([(d.ID, d.health) for d in answer.devices])
        except (grpc.RpcError, ValueError):  # the plugin or this kubelet went away; a channel closed under it
            pass

    def plugin(self) -> Any:
        """A DevicePlugin stub on the endpoint of the last registration."""
        assert self.registrations, "no plugin registered"
        path = os.path.join(self.directory, self.registrations[-1].endpoint)
        return rpc.DevicePluginStub(grpc.insecure_channel(f"unix:{path}"))

    def allocate(self, *containers: list[str]) -> Any:
        """Allocate for one container per list of device ids, as kubelet asks when it admits a pod."""
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)
                                                         for ids in containers])
        return self.plugin().Allocate(request, timeout=10)

    def next_list(self, predicate: Any, timeout: float = 20.0) -> list[tuple[str, str]]:
        """The first device list from now on for which `predicate(list)` holds; fails after `timeout`."""
        deadline = time.monotonic() + timeout
        seen = []
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no such device list within {timeout} s; lists seen: {seen[-5:]}"
            try:
                devices = self.lists.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            seen.append(devices)
            if predicate(devices):
                return devices


class Plugin:
    """``orion-k8s-plugin`` as its own process, reading the node's server.conf as it would in its DaemonSet."""

    def __init__(self, log_path: Path, *args: str) -> None:
        self.log_path, self.args = log_path, list(args)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Plugin:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
        env["PYTHONPATH"] = python_path()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "host_agent.k8s.cli", *self.args], cwd=REPO,
                                         env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        return None if self.proc is None else stop_process(self.proc, 15)
