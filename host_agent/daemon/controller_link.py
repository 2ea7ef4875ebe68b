"""oriond's link to the Orion Controller: register this host's GPUs, then heartbeat so they stay in the pool.

It runs in a process of its own (LinkProcess), on threads there, so that a slow or absent controller never
holds up the region loop (which serves guests whether or not a controller exists), and so that oriond's main
process has no thread: it forks a process per region, and a fork copies any lock another thread holds at
that moment (an import lock taken by an HTTP request's idna import once hung every session of a region).
The controller keeps a host under a lease: the link heartbeats
every third of the TTL the controller answers, so one lost heartbeat does not drop the host. When the
controller is unreachable it logs one warning, retries with a capped exponential backoff, and logs once
more when it is back; a heartbeat answered 404 (the lease ran out, e.g. after a controller-side outage)
re-registers. A registration the controller refuses (400: a bad host name or GPU) is logged as an error and
the link gives up: retrying the same request cannot succeed, and oriond keeps serving. On stop it
unregisters, so the pool loses the host at once rather than after the lease.

The host is named, and reached, by server.conf's bind_addr (Orion's oriond too names itself by its IP in
``/heartbeat/<ip>``); the data port is listen_port and the vGPUs per GPU are vgpu_count.

Registration, heartbeats, unregistering and giving back a session's grant are member-only calls
(docs/security.md): the link signs them as the member named like the host, with the cluster key (``Member``).
Without a usable key file oriond logs one line and does not register at all (``start``): the controller would
refuse every request, and a host it cannot prove is not one the pool should list.
"""
from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import queue
import signal
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from controller.cluster_key import ClusterKeyError, load_key, sign_request
from ivshmem.shared.controller_client import ControllerClient, ControllerClientError

from ..session.gpu_inventory import GpuInfo
from ..stop import StopRequest
from ..supervised import die_with_parent

log = logging.getLogger(__name__)
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 5.0
REQUEST_TIMEOUT_S = 5.0
STOP_JOIN_S = 2 * REQUEST_TIMEOUT_S + 1.0


@dataclass(frozen=True)
class Member:
    """This node as a member of the cluster: ``member(method, path, body)`` signs a request to the controller
    (ivshmem.shared.controller_client.MemberSigner) with the cluster key. The key never shows in a repr."""

    member: str
    key: bytes = field(repr=False)

    def __call__(self, method: str, path: str, body: bytes) -> str:
        return sign_request(self.key, self.member, method, path, body)


def load_member(key_file: str | Path, member: str) -> Member:
    """``member`` with the key of ``key_file``; ClusterKeyError (one line saying how to fix the file) otherwise."""
    return Member(member, load_key(Path(key_file)))


class ControllerLink:
    def __init__(self, address: str, host: str, port: int, vgpu_count: int, gpus: list[GpuInfo],
                 member: Member | None = None) -> None:
        """``member``: how the link signs (oriond: the host's name and the cluster key); None sends unsigned
        requests, which a controller of this release refuses (its tests only)."""
        self.address = address
        self.host = host
        self.port = port
        self.vgpu_count = vgpu_count
        self.gpus = gpus
        self.member = member
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="controller-link", daemon=True)
        self._client = ControllerClient(address, timeout_s=REQUEST_TIMEOUT_S, signer=member)
        self.registered = False
        self._releases: queue.Queue[str | None] = queue.Queue()
        self._releaser = threading.Thread(target=self._release_loop, name="allocation-release", daemon=True)

    def start(self) -> ControllerLink:
        self._thread.start()
        self._releaser.start()
        return self

    def stop(self) -> None:
        """End the heartbeats and unregister (bounded: each request has a timeout, the join too)."""
        self._stop.set()
        self._releases.put(None)
        self._thread.join(STOP_JOIN_S)
        self._releaser.join(STOP_JOIN_S)

    def release_later(self, allocation: str) -> None:
        """Give back the allocation of a session that ended ("ID", or "ID SESSION" naming the session that held
        it, as the session's note says). Never blocks: the region loop calls it."""
        self._releases.put(allocation)

    def _release_loop(self) -> None:
        """Release allocations in order, retrying while the controller is unreachable: this host's heartbeats
        keep a confirmed allocation alive, so one that is never released would never come back to the pool
        (until oriond stops and its heartbeats with it). Each release is signed as this host: the controller
        lets a member give back only the grants bound to its own sessions (and, when it is named, that
        session's)."""
        client = ControllerClient(self.address, timeout_s=REQUEST_TIMEOUT_S, signer=self.member)
        backoff = BACKOFF_FIRST_S
        try:
            while (said := self._releases.get()) is not None:
                allocation, _, session = said.partition(" ")
                while True:
                    try:
                        client.release(allocation, session)
                        log.info("Release resource with allocation ID %s", allocation)
                    except ControllerClientError as exc:
                        if exc.status == 0 or exc.status >= 500:
                            log.warning("could not release allocation %s (%s); retrying", allocation, exc.reason)
                            if self._stop.wait(backoff):
                                return
                            backoff = min(BACKOFF_MAX_S, backoff * 2)
                            continue
                        if exc.status == 404:
                            log.debug("allocation %s was already given back (%s)", allocation, exc.reason)
                        else:  # 401/403/409: not this host's session's to give back, as the controller sees it
                            log.warning("Orion Controller %s refused to release allocation %s: %s", self.address,
                                        allocation, exc.reason)
                    backoff = BACKOFF_FIRST_S
                    break
        finally:
            client.close()

    def _register(self) -> float:
        """Register and learn the lease's TTL; the interval until the next heartbeat."""
        self._client.register_host(self.host, [g.as_json() for g in self.gpus], port=self.port,
                                   vgpu_count=self.vgpu_count, address=self.host)
        ttl = self._client.heartbeat(self.host)
        log.info("Successfully connect to Orion Controller.")  # sic: Orion's own words; scripts grep them
        log.info("Report Orion compatible resource to %s", self.address)
        for g in self.gpus:
            log.info("%s (ID: %s) is reported to Orion Controller.", g.name, g.uuid)
        self.registered = True
        return max(0.2, ttl / 3)

    def _run(self) -> None:
        backoff = BACKOFF_FIRST_S
        warned = False
        wait = 0.0
        log.info("Connecting to Orion Controller %s", self.address)
        while not self._stop.wait(wait):
            try:
                if not self.registered:
                    wait = self._register()
                else:
                    wait = max(0.2, self._client.heartbeat(self.host) / 3)
                if warned:
                    log.info("Orion Controller %s answers again", self.address)
                warned, backoff = False, BACKOFF_FIRST_S
            except ControllerClientError as exc:
                if exc.status == 404 and self.registered:
                    log.warning("Orion Controller %s no longer knows this host (%s); registering again",
                                self.address, exc.reason)
                    self.registered, wait = False, 0.0
                elif exc.status == 0 or exc.status >= 500:
                    if not warned:
                        log.warning("%s; retrying every %s s at most while oriond keeps serving", exc.reason,
                                    BACKOFF_MAX_S)
                        warned = True
                    wait, backoff = backoff, min(BACKOFF_MAX_S, backoff * 2)
                else:
                    log.error("Orion Controller %s refused this host: %s; GPUs are not in its pool (fix server.conf "
                              "and restart oriond)", self.address, exc.reason)
                    self._client.close()
                    return
        self._unregister()

    def _unregister(self) -> None:
        if self.registered:
            try:
                self._client.unregister_host(self.host)
                log.info("Unregister Orion Server from Orion Controller")
            except ControllerClientError as exc:
                log.warning("could not unregister from Orion Controller %s (%s); the host leaves the pool when "
                            "its lease runs out", self.address, exc.reason)
        self._client.close()


class LinkProcess:
    """A ControllerLink run in a child process; oriond's side of it (release_later, stop, member)."""

    def __init__(self, link: ControllerLink) -> None:
        self.member = link.member
        reader, self._writer = multiprocessing.Pipe(duplex=False)
        self._process = multiprocessing.get_context("fork").Process(
            target=_serve_link, args=(link, reader, self._writer), name="orion-controller-link")
        self._process.start()
        reader.close()

    def release_later(self, allocation: str) -> None:
        """Give back the allocation of a session that ended. Never blocks for long: one small pipe write."""
        with contextlib.suppress(OSError):
            self._writer.send(allocation)

    def stop(self) -> None:
        """Unregister and end the link (bounded: STOP_JOIN_S, then it is killed)."""
        with contextlib.suppress(OSError):
            self._writer.send(None)
        self._process.join(STOP_JOIN_S + 1.0)
        if self._process.exitcode is None:
            self._process.kill()
            self._process.join(STOP_JOIN_S)
        self._writer.close()


def _serve_link(link: ControllerLink, reader: Connection, writer: Connection) -> None:
    """Body of the link process: the link's threads, fed the allocations oriond releases, until oriond says
    stop, closes the pipe or dies (SIGTERM then, so the host still unregisters)."""
    writer.close()
    die_with_parent(signal.SIGTERM)
    stop = StopRequest().on_signals()
    link.start()
    try:
        while not stop.is_set():
            if not reader.poll(0.2):
                continue
            allocation = reader.recv()
            if allocation is None:
                break
            link.release_later(allocation)
    except (EOFError, OSError):
        pass
    link.stop()
    os._exit(0)


def start(address: str, host: str, port: int, vgpu_count: int, key_file: str | Path) -> LinkProcess | None:
    """Load the cluster key, read this host's GPUs and start the link, signing as member ``host``; None (after
    one log line) when the key cannot be used or there is nothing to register. The link's ``member`` is the
    signer the session workers confirm grants with (vgpu_grant.sign_as)."""
    from ..session.gpu_inventory import InventoryError, read

    try:
        member = load_member(key_file, host)
    except ClusterKeyError as exc:
        log.error("%s: not registering with Orion Controller %s (it accepts only members of the cluster); this "
                  "host's GPUs stay out of its pool and its sessions take up no vGPUs, while oriond keeps serving "
                  "its regions", exc, address)
        return None
    try:
        gpus, why = read()
    except InventoryError as exc:
        log.error("%s; not registering with Orion Controller %s", exc, address)
        return None
    if not gpus:
        log.warning("%s: no GPU to register with Orion Controller %s", why, address)
        return None
    try:
        return LinkProcess(ControllerLink(address, host, port, vgpu_count, gpus, member))
    except ValueError as exc:  # a malformed controller address
        log.error("%s; not registering with the Orion Controller", exc)
        return None
