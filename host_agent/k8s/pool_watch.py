"""Keeps the device board in step with the controller: asks for this host's part of the pool every few seconds.

The controller offers no watch to its clients, and one small GET per node every POLL_S is nothing next to the
heartbeats oriond already sends; a change reaches kubelet within one period. Every request has a timeout, and
any failure (the controller or etcd down, a malformed answer) marks the devices Unhealthy with the reason,
never ends the plugin; the board logs each change of state once.
"""
from __future__ import annotations

import threading

from ivshmem.shared.controller_client import ControllerClient, ControllerClientError

from .devices import DeviceBoard, MalformedPool, node_vgpus

POLL_S = 2.0
REQUEST_TIMEOUT_S = 3.0
CONFIGURED_BY = "orion-k8s-plugin's -controller (else ORION_CONTROLLER or server.conf's controller_addr)"


class PoolWatch:
    def __init__(self, controller: str, host: str, board: DeviceBoard, poll_s: float = POLL_S) -> None:
        self.controller, self.host, self.board, self.poll_s = controller, host, board, poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orion-pool-watch", daemon=True)

    def start(self) -> PoolWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(REQUEST_TIMEOUT_S + 1.0)

    def poll(self) -> None:
        """Ask once and post the answer on the board."""
        try:
            with ControllerClient(self.controller, REQUEST_TIMEOUT_S, configured_by=CONFIGURED_BY) as client:
                vgpus = node_vgpus(client.pool(self.host), self.host)
        except ControllerClientError as exc:
            self.board.show(None, exc.reason if exc.status == 0 else
                            f"Orion Controller {self.controller} answered HTTP {exc.status}: {exc.reason}")
            return
        except MalformedPool as exc:
            self.board.show(None, f"Orion Controller {self.controller}: {exc}")
            return
        if vgpus is None:
            self.board.show(None, f"host {self.host} is not in the pool of Orion Controller {self.controller} "
                                  "(its oriond is stopped, or has not heartbeated within the host lease)")
        else:
            self.board.show(vgpus)

    def _run(self) -> None:
        while True:
            self.poll()
            if self._stop.wait(self.poll_s):
                return
