"""How a side waits for its peer: spin briefly, then sleep with exponential back-off.

A busy ring is answered within microseconds because the waiter is still spinning; an idle one costs at most
one wake-up per `max_sleep` (1 ms by default), well under 5 % of a core. A side whose last wait was short
(the peer is active, with a little think time between records) spins for `busy_spin_s` instead, so a
program that calls every few hundred microseconds is not answered a sleep late; once a wait outlasts that,
the side is idle again and goes back to the short spin. `check` is called from the sleeping
phase only, so liveness checks (peer heartbeats, locks) never slow the hot path.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class WaitPolicy:
    spin_s: float = 200e-6
    busy_spin_s: float = 2e-3  # how long a side that was just busy keeps spinning (see Waiter)
    min_sleep: float = 20e-6
    max_sleep: float = 1e-3
    check_every_s: float = 0.1

    def wait_for(self, probe: Callable[[], T | None], check: Callable[[], None] | None = None,
                 timeout: float | None = None, what: str = "the peer", spin_s: float | None = None) -> T:
        """Call `probe` until it returns something other than None; raise TimeoutError after `timeout`."""
        value = probe()
        if value is not None:
            return value
        now = time.monotonic
        start = now()
        spin_until = start + (self.spin_s if spin_s is None else spin_s)
        while now() < spin_until:
            value = probe()
            if value is not None:
                return value
        sleep = self.min_sleep
        next_check = start
        while True:
            value = probe()
            if value is not None:
                return value
            t = now()
            if t >= next_check:
                if check is not None:
                    check()
                if timeout is not None and t - start > timeout:
                    raise TimeoutError(f"no answer from {what} within {timeout:g} s")
                next_check = t + self.check_every_s
            time.sleep(sleep)
            sleep = min(sleep * 2, self.max_sleep)


DEFAULT_POLICY = WaitPolicy()
