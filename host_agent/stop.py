"""A stop request that a signal handler may set.

`threading.Event.set()` must not be called from a signal handler: the handler runs in the main thread,
and if that thread was interrupted inside `Event.wait()` while holding the Event's (non-reentrant) lock,
`set()` waits for that lock forever. A plain attribute needs no lock; the loops poll it between passes
(every scan interval, 50 ms by default).
"""
from __future__ import annotations

import signal
import time


class StopRequest:
    def __init__(self) -> None:
        self._requested = False

    def set(self) -> None:
        self._requested = True

    def is_set(self) -> bool:
        return self._requested

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` unless a stop was requested; a signal cuts the sleep short."""
        if not self._requested:
            time.sleep(timeout)
        return self._requested

    def on_signals(self, *signums: int) -> StopRequest:
        """Request a stop on each of `signums` (SIGINT and SIGTERM by default)."""
        for signum in signums or (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: self.set())
        return self
