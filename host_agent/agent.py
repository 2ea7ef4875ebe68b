"""The host agent's main loop: serve every Orion region of this host with the CUDA executor.

Regions are the `orionsock<N>` files in server.conf's shm_path_base (made by `orion-shm create`, by QEMU
for a libvirt guest, or by the libvirt hook). New ones are picked up while running, removed ones dropped.
All regions are supervised from this one thread, so that session workers are forked from a process with
no other threads (forking a threaded process can copy a held lock into the child).

Besides the periodic rescan, `request_refresh()` (oriond calls it on SIGHUP, which the libvirt hook sends
after creating or removing a region) makes the next pass rescan at once. It only sets a plain attribute, so
a signal handler may call it (see stop.py for why a handler must not take locks or set an Event).
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from ivshmem.errors import WireError
from ivshmem.region import list_region_files

from .config import ServerConfig
from .executor import ExecutorOptions, executor_factory
from .region_server import RegionServer, ServerOptions, Session
from .stop import StopRequest

log = logging.getLogger(__name__)
RESCAN_S = 1.0


def _same_file(server: RegionServer, path: str) -> bool:
    """Whether `path` still names the file `server` has mapped (the hook may remove and re-create it)."""
    try:
        there, mine = os.stat(path), os.fstat(server.region.fd)
    except OSError:
        return False
    return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)


class Agent:
    def __init__(self, config: ServerConfig, executor: ExecutorOptions, regions: list[str] | None = None,
                 options: ServerOptions | None = None, stop: StopRequest | None = None,
                 rescan_s: float = RESCAN_S, release: Callable[[str], None] | None = None) -> None:
        """``release(allocation_id)`` gives back a controller allocation whose session ended (it must not
        block: the region loop calls it); None when oriond is not linked to a controller."""
        self.config = config
        self.release = release
        self.factory = executor_factory(executor)
        self.fixed = regions  # serve exactly these, or (None) every region file of shm_path_base
        self.options = options or ServerOptions()
        self.stop = stop or StopRequest()
        self.servers: dict[str, RegionServer] = {}
        self._failed: set[str] = set()
        self.rescan_s = rescan_s
        self._refresh_requested = False

    def request_refresh(self) -> None:
        """Rescan the region directory on the next pass (signal-safe: one attribute store, no lock)."""
        self._refresh_requested = True

    def _wanted(self) -> list[str]:
        if self.fixed is not None:
            return self.fixed
        return list_region_files(self.config.shm.path_base.rstrip("/") or "/")

    def refresh(self) -> None:
        """Let go of removed (or removed and re-created) region files, then start serving new ones."""
        wanted = self._wanted()
        for path in list(self.servers):
            if path not in wanted or not _same_file(self.servers[path], path):
                log.info("%s is gone; its sessions end", path)
                self.servers.pop(path).shutdown()
        self._failed &= set(wanted)  # a failed file that was removed gets another try if it comes back
        for path in wanted:
            if path in self.servers or path in self._failed:
                continue
            try:
                self.servers[path] = RegionServer(path, self.factory, self.options, self.stop, self._session_ended)
                log.info("Using SHM %s: %d channels", os.path.basename(path),
                         self.servers[path].region.geometry.channel_count)
            except WireError as exc:
                log.error("cannot serve %s: %s", path, exc)
                self._failed.add(path)

    def _session_ended(self, session: Session, notes: list[str]) -> None:
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
                    next_refresh = now + self.rescan_s
                for server in self.servers.values():
                    server.scan()
                self.stop.wait(self.options.scan_interval)
        finally:
            for server in self.servers.values():
                server.shutdown()
            log.info("Orion Server stopped")
