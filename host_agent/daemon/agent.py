"""The host agent's main loop: serve every Orion region of this host with the CUDA executor.

Regions are the `orionsock<N>` files in server.conf's shm_path_base (made by `orion-shm create`, by QEMU
for a libvirt guest, or by the libvirt hook). New ones are picked up while running, removed ones dropped.
Each served region has a supervisor process of its own (region_process.py): a region whose file is
truncated, corrupted or otherwise broken ends its own sessions and nothing else. This process never maps a
region; it only looks at files through region_file.py, which says whether a file may be served or formatted,
and it logs each refusal once per state of the file, so a hostile file cannot fill the log either.

With a listening socket (oriond binds listen_port), the relay listener runs in a process of its own too
(relay/listener.py): sessions relayed here from other hosts. Its ended sessions give their allocations back as a
region's do; if it ends by itself it is started again on the next rescan, on the same socket.

Besides the periodic rescan, `request_refresh()` (oriond calls it on SIGHUP, which the libvirt hook sends
after creating or removing a region) makes the next pass rescan at once. It only sets a plain attribute, so
a signal handler may call it (see stop.py for why a handler must not take locks or set an Event).
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import replace

from ivshmem.layout import REGION_INDEX_RANGE
from ivshmem.region import scan_region_files

from .. import agent_metrics, region_file
from ..handler import HandlerFactory
from ..relay.listener import ListenerProcess
from ..relay.transport import RdmaSettings
from ..session.executor import ExecutorOptions, executor_factory
from ..session_loop import ServerOptions
from ..stop import StopRequest
from ..supervised import SupervisedProcess
from .config import ServerConfig
from .region_process import RegionProcess, describe_exit

log = logging.getLogger(__name__)
RESCAN_S = 1.0
RETRY_MIN_S, RETRY_MAX_S = 1.0, 30.0  # a region whose supervisor failed is looked at again after this back-off
STEADY_S = 60.0  # a supervisor that ran this long resets the back-off
IGNORED_LOG_S, IGNORED_SHOWN = 60.0, 8  # files not named like a region: one line a minute at most, a few names


class _Fault:
    """A region that is not served right now: why (logged once per state of its file) and when to look again."""

    __slots__ = ("reason", "identity", "retry_at", "backoff")

    def __init__(self) -> None:
        self.reason = ""
        self.identity: region_file.Identity | None = None
        self.retry_at = 0.0
        self.backoff = 0.0


class Agent:
    def __init__(self, config: ServerConfig, executor: ExecutorOptions, regions: list[str] | None = None,
                 options: ServerOptions | None = None, stop: StopRequest | None = None,
                 rescan_s: float = RESCAN_S, release: Callable[[str], None] | None = None,
                 factory: HandlerFactory | None = None, listen: socket.socket | None = None) -> None:
        """``release(allocation_id)`` gives back a controller allocation whose session ended (it must not
        block: the region loop calls it); None when oriond is not linked to a controller. `factory` replaces
        the CUDA executor (tests, diagnostics). `listen`: the relay listener's socket, or None (no listener)."""
        self.config = config
        self.release = release
        self.factory = factory or executor_factory(executor)
        self.fixed = regions  # serve exactly these, or (None) every region file of shm_path_base
        # Whose files of shm_path_base are served without root's tenant mark; files named with --region, any.
        self.owners = region_file.served_owners(config.shm) if regions is None else None
        self.options = options or ServerOptions()
        self.stop = stop or StopRequest()
        self.regions: dict[str, RegionProcess] = {}
        self._started: dict[str, float] = {}
        self._faults: dict[str, _Fault] = {}
        self.rescan_s = rescan_s
        self._refresh_requested = False
        self.listen = listen
        self.listener: ListenerProcess | None = None
        self._ignored: frozenset[str] = frozenset()  # names not of a region, already logged (IGNORED_LOG_S)
        self._ignored_logged_at = -IGNORED_LOG_S
        self._unlisted = ""  # why the directory could not be listed, as last logged

    def _start_listener(self) -> None:
        """The relay listener's process; its sessions are never relayed on (no route: no relay loops)."""
        if self.listen is not None and self.listener is None:
            rdma = RdmaSettings(self.config.enable_rdma, self.config.ibverbs_device)
            self.listener = ListenerProcess(self.listen, self.factory, replace(self.options, relay=None), rdma)

    def request_refresh(self) -> None:
        """Rescan the region directory on the next pass (signal-safe: one attribute store, no lock)."""
        self._refresh_requested = True

    def _wanted(self) -> list[str]:
        """The region files to serve. A directory that cannot be read now keeps the ones served (each is still
        checked by _still): a failed listing is no sign that every region is gone."""
        if self.fixed is not None:
            return self.fixed
        directory = self.config.shm.path_base.rstrip("/") or "/"
        try:
            found = scan_region_files(directory)
        except OSError as exc:
            if self._unlisted != str(exc):
                log.error("cannot list %s (%s); the regions served stay served", directory, exc.strerror or exc)
                self._unlisted = str(exc)
            return list(self.regions)
        self._unlisted = ""
        self._log_ignored(directory, frozenset(found.ignored))
        return found.paths

    def _log_ignored(self, directory: str, names: frozenset[str]) -> None:
        """One line for names of no region that were not there at the last such line, at most once a minute (a
        local user can make any number), names escaped (one may hold a newline). Only names still there are
        remembered, so memory is bounded by the directory."""
        self._ignored &= names
        new = names - self._ignored
        if not new or time.monotonic() < self._ignored_logged_at + IGNORED_LOG_S:
            return
        shown = ", ".join(ascii(name[:40]) for name in sorted(new)[:IGNORED_SHOWN])
        log.warning("%s: %d file(s) named like a region are not region names and are not served (a region is "
                    "orionsock<N>, N in %d..%d in ASCII digits without a leading zero): %s%s", directory, len(new),
                    *REGION_INDEX_RANGE, shown, " …" if len(new) > IGNORED_SHOWN else "")
        self._ignored = names
        self._ignored_logged_at = time.monotonic()

    def refresh(self) -> None:
        """Let go of removed (or removed and re-created) region files, then start serving new, sane ones.

        Whatever goes wrong with one file (its supervisor cannot be started: no memory, no file descriptor, no
        process left; a bug) is logged and that file looked at again after a back-off; it never ends oriond,
        whose other regions keep serving."""
        wanted = self._wanted()
        for path, region in list(self.regions.items()):
            if path not in wanted or not _still(path, region.identity):
                log.info("%s is gone; its sessions end", path)
                self._guarded(path, self._retire, path, True)
        for path in set(self._faults) - set(wanted):
            del self._faults[path]  # a removed file starts afresh if it comes back
        now = time.monotonic()
        for path in wanted:
            fault = self._faults.get(path)
            if path in self.regions or (fault is not None and now < fault.retry_at):
                continue
            self._guarded(path, self._try_serve, path, now)

    def _guarded(self, path: str, step: Callable[..., None], *args: object) -> None:
        """`step(*args)` for one file; an exception is that file's fault (logged once per reason, retried after
        the back-off), never oriond's end."""
        try:
            step(*args)
        except Exception as exc:  # any error of one file must not stop every other region
            fault = self._faults.setdefault(path, _Fault())
            fault.backoff = min(max(2 * fault.backoff, RETRY_MIN_S), RETRY_MAX_S)
            fault.retry_at = time.monotonic() + fault.backoff
            reason = f"{type(exc).__name__}: {exc}"
            if reason != fault.reason:
                log.error("cannot serve %s now (%s); oriond tries again in %g s, every other region serves on",
                          path, reason, fault.backoff, exc_info=not isinstance(exc, OSError))
                fault.reason = reason

    def _try_serve(self, path: str, now: float) -> None:
        verdict = region_file.examine(path, self.options.channels, self.owners)
        fault = self._faults.get(path)
        if verdict.action == region_file.REFUSE:
            fault = self._faults.setdefault(path, _Fault())
            if (verdict.reason, verdict.identity) != (fault.reason, fault.identity):
                log.error("not serving %s", verdict.reason)  # once per reason and state of the file
                fault.reason, fault.identity = verdict.reason, verdict.identity
            return
        if verdict.identity is None:  # examine() always has one for SERVE and FORMAT
            return
        if verdict.warning and (fault is None or fault.identity != verdict.identity):
            log.warning("%s", verdict.warning)
        if fault is not None:
            fault.identity = verdict.identity
        self.regions[path] = RegionProcess(path, verdict.identity, self.factory, self.options)
        self._started[path] = now

    def scan(self) -> None:
        """Act on ended sessions and on supervisors (and the listener) that ended by themselves."""
        for path, region in list(self.regions.items()):
            for _session, notes in region.ended_sessions():
                self._release(notes)
            code = region.exitcode()
            if code is not None:
                self._failed(path, code)
        if self.listener is not None:
            for _session, notes in self.listener.ended_sessions():
                self._release(notes)
            code = self.listener.exitcode()
            if code is not None:
                log.error("the relay listener ended (%s); its relayed sessions ended. It is started again",
                          describe_exit(code))
                self._let_go(self.listener, stop=False)
                self.listener = None

    def _failed(self, path: str, code: int) -> None:
        agent_metrics.region_fault()
        """A supervisor ended without being asked: its sessions are over; look at the region again later."""
        ran = time.monotonic() - self._started.get(path, 0.0)
        self._retire(path, stop=False)
        fault = self._faults.setdefault(path, _Fault())
        fault.backoff = RETRY_MIN_S if ran >= STEADY_S else min(max(2 * fault.backoff, RETRY_MIN_S), RETRY_MAX_S)
        fault.retry_at = time.monotonic() + fault.backoff
        fault.reason = ""
        log.error("%s: no longer served (%s); its sessions ended. oriond looks at it again in %g s and serves it "
                  "once it is a sane region", path, describe_exit(code), fault.backoff)

    def _retire(self, path: str, stop: bool) -> None:
        self._let_go(self.regions.pop(path), stop)

    def _let_go(self, process: SupervisedProcess, stop: bool) -> None:
        """Stop `process` (or, it ended: only) give back what its sessions held."""
        if stop:
            process.stop()
        for _session, notes in process.ended_sessions():
            self._release(notes)
        self._release(process.orphaned_notes())
        process.close()

    def _release(self, notes: list[str]) -> None:
        """A session that took up a controller allocation (executor BIND) hands it back as it ends."""
        for text in notes:
            kind, _, value = text.partition(" ")
            if kind == "allocation" and self.release is not None:
                self.release(value)

    def run(self) -> None:
        log.info("Orion Server (oriond) serving SHM regions of %s", self.config.shm.path_base)
        next_refresh = 0.0
        try:
            while not self.stop.is_set():
                now = time.monotonic()
                if now >= next_refresh or self._refresh_requested:
                    self._refresh_requested = False  # cleared first: a request arriving during refresh() stays
                    self.refresh()
                    self._start_listener()
                    next_refresh = now + self.rescan_s
                self.scan()
                self.stop.wait(self.options.scan_interval)
        finally:
            self.shutdown()
            log.info("Orion Server stopped")

    def shutdown(self) -> None:
        """Stop every supervisor at once, then wait for them (each ends its own sessions)."""
        processes: list[SupervisedProcess] = [*self.regions.values(), *([self.listener] if self.listener else [])]
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
        for path in list(self.regions):
            self._retire(path, stop=True)
        if self.listener is not None:
            self._let_go(self.listener, stop=True)
            self.listener = None


def _still(path: str, identity: region_file.Identity) -> bool:
    """Whether `path` still names the file that is served (the hook may remove and re-create it)."""
    try:
        return region_file.Identity.of(os.stat(path, follow_symlinks=False)).same_file(identity)
    except OSError:
        return False
