"""The host agent's main loop: serve every Orion region of this host with the CUDA executor.

Regions are the `orionsock<N>` files in server.conf's shm_path_base (made by `orion-shm create`, by QEMU
for a libvirt guest, or by the libvirt hook). New ones are picked up while running, removed ones dropped.
All regions are supervised from this one thread, so that session workers are forked from a process with
no other threads (forking a threaded process can copy a held lock into the child).
"""
from __future__ import annotations

import logging
import os
import time

from ivshmem.errors import WireError
from ivshmem.region import list_region_files

from .config import ServerConfig
from .executor import ExecutorOptions, executor_factory
from .region_server import RegionServer, ServerOptions
from .stop import StopRequest

log = logging.getLogger(__name__)
RESCAN_S = 1.0


class Agent:
    def __init__(self, config: ServerConfig, executor: ExecutorOptions, regions: list[str] | None = None,
                 options: ServerOptions | None = None, stop: StopRequest | None = None) -> None:
        self.config = config
        self.factory = executor_factory(executor)
        self.fixed = regions  # serve exactly these, or (None) every region file of shm_path_base
        self.options = options or ServerOptions()
        self.stop = stop or StopRequest()
        self.servers: dict[str, RegionServer] = {}
        self._failed: set[str] = set()

    def _wanted(self) -> list[str]:
        if self.fixed is not None:
            return self.fixed
        return list_region_files(self.config.shm.path_base.rstrip("/") or "/")

    def refresh(self) -> None:
        """Start serving new region files; let go of removed ones."""
        wanted = self._wanted()
        for path in wanted:
            if path in self.servers or path in self._failed:
                continue
            try:
                self.servers[path] = RegionServer(path, self.factory, self.options, self.stop)
                log.info("Using SHM %s: %d channels", os.path.basename(path),
                         self.servers[path].region.geometry.channel_count)
            except WireError as exc:
                log.error("cannot serve %s: %s", path, exc)
                self._failed.add(path)
        for path in list(self.servers):
            if path not in wanted or not os.path.exists(path):
                log.info("%s is gone; its sessions end", path)
                self.servers.pop(path).shutdown()

    def run(self) -> None:
        log.info("Orion Server (oriond) serving SHM regions of %s", self.config.shm.path_base)
        next_refresh = 0.0
        try:
            while not self.stop.is_set():
                now = time.monotonic()
                if now >= next_refresh:
                    self.refresh()
                    next_refresh = now + RESCAN_S
                for server in self.servers.values():
                    server.scan()
                self.stop.wait(self.options.scan_interval)
        finally:
            for server in self.servers.values():
                server.shutdown()
            log.info("Orion Server stopped")
