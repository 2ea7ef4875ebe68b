"""vGPUs for this process from the Orion Controller: request, keep alive, release at exit.

Orion's client asks the controller for ``ORION_VGPU`` vGPUs of ``ORION_GMEM`` MiB when the application
initialises CUDA and gives them back when it exits, with Orion's stderr lines (``[INFO] Using Orion resource
…``, ``Client exits with allocation ID …``). This module does the same through the controller's JSON API
(docs/controller.md) with the one controller client (controller_client.py, standard library only), on a fresh
connection per request: requests are rare (one per keep-alive period).

* The lease is kept alive by a daemon thread (every TTL/3, the controller's rule), with its own connection,
  so a process that dies for any reason stops the keep-alives and the controller reclaims the vGPUs when
  the lease runs out.
* Release at exit is :func:`release_at_exit`, called by activate.py's one exit handler; it prints Orion's exit
  line, ``<date time> [INFO] Client exits with allocation ID <id>``, on stderr. Nothing may block at exit, so
  that release waits at most EXIT_TIMEOUT_S per socket operation, goes to the address that answered the grant
  (no resolver wait, which no socket timeout bounds) and takes no lock; if the controller does not confirm it
  in time, one line says so, and the host agent or the lease gives the vGPUs back.
* Every request has a timeout; a failure is an :class:`AllocationError` with one line that says what to check.

Where the vGPUs are: the forwarding channel is a region one host's oriond serves (ORION_SHM, an ivshmem device,
/dev/shm), so the request names that host and the session then takes the grant up there (activate.py, wire
opcodes AGENT_INFO and BIND). An oriond without GPUs of its own answers AGENT_INFO with the host "*": the request
then names no host, and that oriond relays the session to wherever the grant is (docs/remote.md).
"""
from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from ivshmem.record import RELAYING_AGENT
from ivshmem.shared.controller_client import Answer, ControllerClient, ControllerClientError, quote
from ivshmem.shared.ini import whole_number

from .client_config import controller_setting

REQUEST_TIMEOUT_S = 5.0
EXIT_TIMEOUT_S = 2.0  # the release at exit: a program's end waits no longer than this per socket operation


class AllocationError(Exception):
    """No vGPUs for this process; the message is one line for the user."""


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


CONFIGURED_BY = "ORION_CONTROLLER / controller_addr in client.conf"


def _request(address: str, method: str, path: str, body: Any = None, timeout_s: float = REQUEST_TIMEOUT_S,
             via: str = "") -> Answer:
    """One request to the controller at ``address`` (connecting to ``via`` instead when given: an ``ip:port``
    that answered before) on a fresh connection; AllocationError, one line, when nothing answered."""
    try:
        with ControllerClient(address, timeout_s, via=via, configured_by=CONFIGURED_BY) as client:
            return client.request(method, path, body)
    except ControllerClientError as exc:
        raise AllocationError(exc.reason) from None
    except ValueError as exc:  # a malformed address
        raise AllocationError(str(exc)) from None


def _positive(environ: Mapping[str, str], name: str) -> int | None:
    """ASCII digits only, as Orion's C client reads them (ini.whole_number): ``int`` would take '١' or '1_0'."""
    text = environ.get(name, "").strip()
    if not text:
        return None
    value = whole_number(text) or 0
    if value < 1:
        raise AllocationError(f"{name}={text!r} is not a positive whole number"
                              + (" of MiB" if name == "ORION_GMEM" else " of vGPUs"))
    return value


def wanted_request(environ: Mapping[str, str] = os.environ) -> tuple[int, int | None] | None:
    """(vGPUs, MiB per vGPU or None for the controller's default) from ORION_VGPU / ORION_GMEM, or None
    when ORION_VGPU is not set (no request: Orion gives ORION_VGPU no default)."""
    vgpus = _positive(environ, "ORION_VGPU")
    memory = _positive(environ, "ORION_GMEM")
    return None if vgpus is None else (vgpus, memory)


@dataclass
class Allocation:
    """vGPUs granted to this process; ``keep_alive()`` starts the lease thread, ``release()`` ends it."""

    controller: str
    id: str
    host: str
    address: str
    port: int
    vgpus: list[dict[str, Any]]
    ttl_s: int
    group: str = field(default_factory=lambda: str(uuid.uuid4()))
    lost: str | None = None  # why the lease was lost, if it was
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _released: bool = field(default=False, repr=False)
    _release_to: str = field(default="", repr=False)  # ip:port of the controller that granted it

    @classmethod
    def request(cls, controller: str, vgpus: int, memory_mib: int | None, client: str = "",
                host: str = "") -> Allocation:
        body: dict[str, Any] = {"vgpus": vgpus, "client": client or f"guest pid {os.getpid()}"}
        if memory_mib is not None:
            body["memory_mib"] = memory_mib
        if host:
            body["host"] = host
        granted = _request(controller, "POST", "/api/v1/allocations", body)
        answer = granted.json()
        if granted.status != 201:
            raise AllocationError(f"Fail to get resource from controller {controller}: {granted.reason()}")
        try:
            return cls(controller, str(answer["id"]), str(answer["host"]), str(answer["address"]),
                       int(answer["port"]), list(answer["vgpus"]), int(answer["ttl_s"]),
                       _release_to=granted.peer)
        except (KeyError, TypeError, ValueError):
            raise AllocationError(f"the controller at {controller} gave a malformed answer: {answer!r:.200}") from None

    def resources(self) -> str:
        """Orion's ``ip:port/pgpu/vgpu[,…]`` spelling of the grant."""
        return ",".join(f"{self.address}:{self.port}/{v.get('gpu')}/{v.get('vgpu')}" for v in self.vgpus)

    def keep_alive(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._keep, name="orion-lease", daemon=True)
            self._thread.start()

    def _keep(self) -> None:
        period = max(0.5, self.ttl_s / 3)
        while not self._stop.wait(period):
            try:
                kept = _request(self.controller, "POST", f"/api/v1/allocations/{quote(self.id)}/keepalive")
            except AllocationError as exc:  # a hiccup: try again next period; the lease covers three of them
                print(f"orion: keep-alive of allocation {self.id} failed: {exc}", file=sys.stderr)
                continue
            if kept.status == 404:
                self.lost = kept.json().get("reason") or "the controller no longer knows it"
                print(f"orion: allocation {self.id} was lost ({self.lost}); its vGPUs may be given to others",
                      file=sys.stderr)
                return

    def release(self, out: TextIO | None = None, announce: bool = True,
                timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        """Stop the keep-alives, give the vGPUs back and print Orion's exit line (unless not ``announce``).
        Waits at most ``timeout_s`` per socket operation. Idempotent; never raises."""
        if self._released:
            return
        self._released = True
        self._stop.set()
        out = out or sys.stderr
        if self.lost is None:
            why = ""
            try:
                done = _request(self.controller, "DELETE", f"/api/v1/allocations/{quote(self.id)}",
                                timeout_s=timeout_s, via=self._release_to)
                if done.status not in (200, 404):
                    why = done.reason()
            except AllocationError as exc:
                why = str(exc)
            if why:
                print(f"orion: the release of allocation {self.id} was not confirmed ({why}); its vGPUs come "
                      f"back when the host agent ends the session or the lease expires", file=out, flush=True)
        if announce:
            print(f"{stamp()} [INFO] Client exits with allocation ID {self.id}", file=out, flush=True)


_lock = threading.Lock()
_current: Allocation | None = None


def current() -> Allocation | None:
    """This process's allocation, if it got one."""
    return _current


def acquire(controller: str, vgpus: int, memory_mib: int | None, host: str = "") -> Allocation:
    """Request once per process (on ``host`` if named) and keep it alive (:func:`release_at_exit` ends it); a
    second call returns the same grant."""
    global _current
    with _lock:
        if _current is None:
            alloc = Allocation.request(controller, vgpus, memory_mib, host=host)
            alloc.keep_alive()
            print(f"{stamp()} [INFO] Using Orion resource ({alloc.group}) {alloc.id} : {alloc.resources()}",
                  file=sys.stderr, flush=True)
            _current = alloc
        return _current


def serving_host(host: str, where: str, knows_agent_info: bool = True) -> str:
    """The controller's name for the host whose oriond serves the region at `where`, from its AGENT_INFO answer
    (`host`; `knows_agent_info` False: the agent did not know the opcode); AllocationError when it has none.
    "" (any host) when that oriond only relays: the grant may be on any GPU host, and it relays the session
    there (docs/remote.md)."""
    if host == RELAYING_AGENT:
        return ""
    if not knows_agent_info:
        raise AllocationError(f"the host agent serving {where} predates vGPU allocation; update oriond there")
    if not host:
        raise AllocationError(f"the host agent serving {where} is not linked to an Orion Controller, so it cannot "
                              f"take up vGPUs: set controller_addr in its server.conf, or unset ORION_VGPU to use it "
                              f"without an allocation")
    return host


def acquire_configured(host_of: Callable[[], str]) -> Allocation | None:
    """ORION_VGPU vGPUs of ORION_GMEM MiB from the configured controller, on the host `host_of()` names (asked
    only then); None when no controller is configured or ORION_VGPU is unset (nothing changes: the session gets
    the agent's default devices and quota). AllocationError or ClientConfigError, one line, otherwise."""
    setting = controller_setting()
    wanted = wanted_request() if setting is not None else None
    if setting is None or wanted is None:
        return None
    return acquire(setting.address, *wanted, host=host_of())


def say_exit_without_allocation() -> None:
    """Orion's exit line for a process that asked for vGPUs and got none."""
    print(f"{stamp()} [INFO] Client exits without allocation ID.", file=sys.stderr, flush=True)


def release_at_exit() -> None:
    """Give this process's grant back, if it has one, with Orion's exit line: bounded (EXIT_TIMEOUT_S) and without
    ``_lock``, which a thread still inside :func:`acquire` may hold."""
    alloc = _current
    if alloc is not None:
        alloc.release(timeout_s=EXIT_TIMEOUT_S)


def abandon() -> None:
    """Give this process's grant back now, without Orion's exit line: it was never taken up (BIND refused)."""
    global _current
    with _lock:
        if _current is not None:
            _current.release(announce=False)
            _current = None
