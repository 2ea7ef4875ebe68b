"""Rate limits the host agent puts on what one client can make it do: start sessions, fill the log.

A client (a guest, a container, a local user) is not trusted. Without these, re-claiming a channel in a loop
forks a worker per claim (1,132 forks in 20 s measured), and a stream of malformed records writes a warning
each (32 MB of log for 400k records). Both limits are per session or per channel, so one noisy client does
not silence or slow the others.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable


def one_line(text: str, limit: int = 300) -> str:
    """Text a client chose, made fit for the log: control characters escaped (no line of its own making),
    cut at `limit` characters."""
    text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class TokenBucket:
    """`rate` events per second on average, `burst` at once; `take()` says whether one may happen now."""

    __slots__ = ("rate", "burst", "_tokens", "_at", "_clock")

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = float(burst)
        self._tokens = float(burst)
        self._clock = clock
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def ready(self) -> bool:
        """Whether `take()` would succeed now (takes nothing)."""
        self._refill()
        return self._tokens >= 1.0

    def take(self) -> bool:
        self._refill()
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class LogLimiter:
    """Logs the first `first` events of a kind as they come, then at most one summary line per `every`
    seconds saying how many more there were."""

    __slots__ = ("logger", "first", "every", "_count", "_quiet", "_next", "_clock")

    def __init__(self, logger: logging.Logger, first: int = 10, every: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.first = first
        self.every = every
        self._count = 0
        self._quiet = 0  # events not logged since the last line
        self._next = 0.0
        self._clock = clock

    def log(self, level: int, what: str, message: str, *args: object) -> None:
        """Log `message % args`, or count it; `what` names the kind in the summary ("malformed records")."""
        self._count += 1
        if self._count <= self.first:
            self.logger.log(level, message, *args)
            if self._count == self.first:
                self.logger.log(level, "(further %s are counted, one line every %g s)", what, self.every)
                self._next = self._clock() + self.every
            return
        self._quiet += 1
        now = self._clock()
        if now >= self._next:
            self.logger.log(level, "%d more %s (%d in all); the last: " + message, self._quiet, what, self._count,
                            *args)
            self._quiet = 0
            self._next = now + self.every
