"""The plugin's socket and its registration with kubelet, kept up across kubelet's restarts.

Kubelet's protocol: the plugin serves DevicePlugin on a socket in the device-plugin directory, then calls
Registration.Register on kubelet.sock there; kubelet dials the plugin back and opens ListAndWatch. When
kubelet restarts it deletes every socket in that directory (ours too) and creates kubelet.sock anew, and a
plugin must serve and register again. Every WATCH_S this loop looks at both files: our socket gone, or a
kubelet.sock that is not the one we registered with, means "serve again, then register". A registration that
fails (kubelet not up yet, or refusing) is retried with a growing pause, logged once per reason; nothing here
ends the plugin but a stop request.
"""
from __future__ import annotations

import logging
import os
import time
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc

from ..stop import StopRequest
from .api import ENDPOINT, KUBELET_SOCKET, RESOURCE_NAME, VERSION, pb, rpc

log = logging.getLogger(__name__)
WATCH_S = 1.0
REGISTER_TIMEOUT_S = 5.0
RETRY_MAX_S = 10.0
STOP_GRACE_S = 1.0


@dataclass(frozen=True)
class Endpoint:
    directory: str  # kubelet's device-plugin directory
    name: str = ENDPOINT  # our socket's name in it

    @property
    def socket(self) -> str:
        return os.path.join(self.directory, self.name)

    @property
    def kubelet(self) -> str:
        return os.path.join(self.directory, KUBELET_SOCKET)


def _identity(path: str) -> tuple[int, int, int] | None:
    """What tells a socket file from the one that was there before (kubelet's new socket has a new inode)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


class PluginServer:
    def __init__(self, endpoint: Endpoint, servicer: Any, stop: StopRequest) -> None:
        self.endpoint, self.servicer, self.stop = endpoint, servicer, stop
        self._server: grpc.Server | None = None
        self._served: tuple[int, int, int] | None = None  # our socket's identity while we serve it
        self._registered_with: tuple[int, int, int] | None = None  # the kubelet.sock we registered with
        self._retry_at = 0.0
        self._pause = WATCH_S
        self._last_problem = ""

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.step()
                self.stop.wait(WATCH_S)
        finally:
            self._stop_serving()

    def step(self) -> None:
        """One look: serve again if our socket is gone; register if kubelet.sock is new."""
        if self._served is None or _identity(self.endpoint.socket) != self._served:
            if self._served is not None:
                log.info("%s was removed (kubelet restarted?); serving it again", self.endpoint.socket)
            self._serve()
            self._registered_with = None
        kubelet = _identity(self.endpoint.kubelet)
        if self._served is not None and kubelet is not None and kubelet != self._registered_with:
            self._register(kubelet)
        elif kubelet is None and self._registered_with is not None:
            log.warning("%s is gone: kubelet stopped; registering again once it is back", self.endpoint.kubelet)
            self._registered_with = None

    def _serve(self) -> None:
        self._stop_serving()
        path = self.endpoint.socket
        if not os.path.isdir(self.endpoint.directory):
            self._problem(f"{self.endpoint.directory} does not exist (is kubelet installed, and its device-plugin "
                          "directory mounted into this container?); waiting for it")
            return
        try:
            os.unlink(path)  # a socket left by an earlier run
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._problem(f"cannot remove the old socket {path}: {exc.strerror}")
            return
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="orion-plugin-rpc"))
        rpc.add_DevicePluginServicer_to_server(self.servicer, server)
        try:
            if server.add_insecure_port(f"unix:{path}") == 0:
                raise RuntimeError("grpc could not bind it")
            server.start()
            os.chmod(path, 0o600)  # kubelet (root) alone may call Allocate, whatever the umask
        except (RuntimeError, OSError) as exc:
            server.stop(None)
            self._problem(f"cannot serve {path}: {exc}")
            return
        self._server, self._served = server, _identity(path)
        log.info("serving the device-plugin API %s on %s", VERSION, path)

    def _stop_serving(self) -> None:
        if self._server is not None:
            self._server.stop(STOP_GRACE_S).wait(STOP_GRACE_S + 1.0)
            self._server, self._served = None, None

    def _register(self, kubelet: tuple[int, int, int]) -> None:
        if time.monotonic() < self._retry_at:
            return
        request = pb.RegisterRequest(version=VERSION, endpoint=self.endpoint.name,
                                     resource_name=RESOURCE_NAME, options=pb.DevicePluginOptions())
        try:
            with grpc.insecure_channel(f"unix:{self.endpoint.kubelet}") as channel:
                rpc.RegistrationStub(channel).Register(request, timeout=REGISTER_TIMEOUT_S)
        except grpc.RpcError as exc:
            self._retry_at = time.monotonic() + self._pause
            self._pause = min(2 * self._pause, RETRY_MAX_S)
            self._problem(f"kubelet refused or did not answer the registration of {RESOURCE_NAME} "
                          f"({exc.code().name}: {exc.details()}); trying again")
            return
        self._registered_with, self._pause, self._last_problem = kubelet, WATCH_S, ""
        log.info("registered %s with kubelet (%s, endpoint %s)", RESOURCE_NAME, self.endpoint.kubelet,
                 self.endpoint.name)

    def _problem(self, message: str) -> None:
        if message != self._last_problem:
            log.warning("%s", message)
            self._last_problem = message
