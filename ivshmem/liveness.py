"""Knowing whether the other side of a channel is still there.

Clients claim a channel with an open-file-description (OFD) byte-range lock: the kernel drops it when the
process dies, however it dies, and another process on the same kernel can test it (F_OFD_GETLK). That
gives the host agent exact, immediate liveness for host and container clients. A guest's locks live in the
guest kernel, out of the host's sight, so a guest client also runs a heartbeat thread.
"""
from __future__ import annotations

import fcntl
import os
import struct
import threading
from collections.abc import Callable

# struct flock on x86-64: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid (+ padding).
_FLOCK = struct.Struct("<hh4xqqi4x")

LOCK_MODE, HEARTBEAT_MODE = 1, 2
HEARTBEAT_PERIOD_S = 0.5


def try_lock(fd: int, offset: int) -> bool:
    """Take an exclusive OFD lock on byte `offset` of `fd` without blocking; False if someone holds it."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0))
        return True
    except OSError as exc:
        if exc.errno in (11, 13):  # EAGAIN, EACCES: held by another open file description
            return False
        raise


def is_locked(fd: int, offset: int) -> bool:
    """True if some open file description other than `fd`'s holds a lock on byte `offset`."""
    raw = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0))
    return _FLOCK.unpack(raw)[0] != fcntl.F_UNLCK


class Heartbeat:
    """A daemon thread that calls `beat` every `period` seconds until stopped."""

    def __init__(self, beat: Callable[[], None], period: float = HEARTBEAT_PERIOD_S) -> None:
        self._beat = beat
        self._period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orion-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            self._beat()

    def stop(self, timeout: float = 1.0) -> None:
        """Bounded: it may run at interpreter exit (a guest client's close)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
