"""One region's supervisor in a process of its own, and oriond's handle on it.

Why a process per region: a supervisor maps its region, and whoever can write the file (its QEMU, its
container, any local user for a file in /dev/shm they own) can truncate it; the next touch of a vanished page
is SIGBUS, which Python cannot catch. In a process of its own that ends this region's sessions and nothing
else: oriond (which never maps a region) sees the exit, logs why, releases the sessions' controller
allocations, and serves the region again once region_file.py finds it sane.

The supervisor's workers die with it (PR_SET_PDEATHSIG), and the supervisor dies with oriond (SIGTERM, so it
still ends its sessions cleanly). What workers note() (the allocation a session took up) and each ended
session come to oriond on one pipe per region, so nothing a session holds is lost if its supervisor dies.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
from multiprocessing.connection import Connection

from ivshmem.errors import WireError

from ..region_file import Identity
from ..stop import StopRequest
from ..supervised import SupervisedProcess, die_with_parent
from .region_server import HandlerFactory, RegionRefused, RegionServer, RegionShrunk, ServerOptions

log = logging.getLogger(__name__)
_MP = multiprocessing.get_context("fork")
EXIT_REFUSED, EXIT_SHRUNK, EXIT_UNUSABLE = 4, 5, 6


def _supervise(path: str, factory: HandlerFactory, options: ServerOptions, events: Connection) -> None:
    """Body of a region process: serve `path` until SIGTERM/SIGINT or until the region fails."""
    oriond = os.getppid()
    die_with_parent(signal.SIGTERM)
    stop = StopRequest().on_signals()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # oriond's own wake-up signal; not ours
    name = os.path.basename(path)
    try:
        server = RegionServer(path, factory, options, stop, events, agent_pid=oriond)
        log.info("Using SHM %s: %d channels", name, server.region.geometry.channel_count)
        server.serve_forever()
    except RegionRefused as exc:
        log.error("%s", exc)
        os._exit(EXIT_REFUSED)
    except RegionShrunk as exc:
        log.error("%s; its sessions ended, and oriond serves it again once it is a sane region", exc)
        os._exit(EXIT_SHRUNK)
    except WireError as exc:
        log.error("cannot serve %s: %s", path, exc)
        os._exit(EXIT_UNUSABLE)
    os._exit(0)


class RegionProcess(SupervisedProcess):
    """oriond's side of one region's supervisor process."""

    def __init__(self, path: str, identity: Identity, factory: HandlerFactory, options: ServerOptions) -> None:
        self.path = path
        self.identity = identity
        super().__init__(_supervise, (path, factory, options), f"orion-region-{os.path.basename(path)}")


def describe_exit(code: int) -> str:
    """Why a supervisor ended, for the log."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        if -code == signal.SIGBUS:
            return f"{name}: its file was truncated, or its memory became unreadable, while served"
        return f"killed by {name}"
    return {EXIT_REFUSED: "refused (see the line above)", EXIT_SHRUNK: "its file shrank while served",
            EXIT_UNUSABLE: "it could not be served (see the line above)"}.get(code, f"exit status {code}")
