"""What one peer of the relay listener may hold, and how fast it may start sessions (docs/security.md, "Limits
on one client"; docs/remote.md, "Security"). A peer is a source address: every relayed session of one relaying
oriond comes from its address, and a hostile one has one address too (or as many as it has addresses).

Without these, one peer filled the listener's 64 session slots with connections that never said a word (idle),
that said it one byte at a time (slowloris) or that beat forever, so that a legitimate relay got a session 1 time
in 28; it started up to 21 sessions a second, and each connection wrote ~380 bytes of log. Now:
- a connection in the handshake holds no session slot, only one of `handshakes` per peer (`all_handshakes` in all);
  the listener closes it at the handshake's deadline (relay_handshake.HANDSHAKE_S);
- a proven peer holds at most `sessions` of the listener's session slots, so one member, however hostile, leaves
  the others room;
- it starts at most `start_rate` sessions a second (bursts of `start_burst`, a region's own limits); a start over
  the rate waits up to `start_wait_s` for its turn, holding no slot, then is refused with the reason;
- what the listener logs of a peer's connections that came to nothing (closed in the handshake, refused) is its
  first `logged` lines, then one line a minute saying how many more (limits.LogLimiter). Proven sessions are
  logged as a region's are: their starts are bounded by the rate.

What does not belong here: the handshake itself (relay/handshake.py), sockets and processes (relay/listener.py).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..limits import LogLimiter, TokenBucket

log = logging.getLogger("host_agent.relay.listener")  # the listener's lines, under its name

QUIET_S = 60.0  # an address with nothing open is forgotten this long after it was last seen (its log limit too)


@dataclass(frozen=True)
class PeerLimits:
    handshakes: int = 8  # connections of one address in the handshake or waiting for a start, at once
    all_handshakes: int = 256  # the same, of every address together
    sessions: int = 32  # relayed sessions of one address at once (of the listener's MAX_SESSIONS, 64)
    start_rate: float = 8.0  # session starts per second per address, as per region (ServerOptions)
    start_burst: int = 16
    start_wait_s: float = 5.0  # how long a proven connection over the rate waits for its turn
    logged: int = 10  # lines per address about connections that came to nothing, then one a minute
    addresses: int = 4096  # addresses remembered at once; past it, a new one is turned away until some go quiet


class Peer:
    """One address's connections: in the handshake (`pending`), proven and waiting for a start (`waiting`),
    served (`sessions`); its start rate and its log limit."""

    __slots__ = ("address", "pending", "waiting", "sessions", "starts", "refusals", "seen")

    def __init__(self, address: str, limits: PeerLimits, now: float, clock: Callable[[], float]) -> None:
        self.address = address
        self.pending = self.waiting = self.sessions = 0
        self.starts = TokenBucket(limits.start_rate, limits.start_burst, clock)
        self.refusals = LogLimiter(log, first=limits.logged, every=QUIET_S, clock=clock)
        self.seen = now

    def connections(self) -> int:
        """Connections that hold no session slot: in the handshake or waiting for their start."""
        return self.pending + self.waiting

    def came_to_nothing(self, why: str) -> None:
        """Log (within the peer's limit) a connection of this peer closed without a session."""
        self.refusals.log(logging.WARNING, f"relay connections from {self.address} that came to nothing",
                          "relay connection from %s closed: %s", self.address, why)


class Peers:
    """Every address the listener has open connections of, or saw within QUIET_S."""

    def __init__(self, limits: PeerLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits, self._clock = limits, clock
        self._peers: dict[str, Peer] = {}
        self._pruned = 0.0
        self._overflow = LogLimiter(log, first=1, every=QUIET_S, clock=clock)

    def get(self, address: str) -> Peer | None:
        """`address`'s state (made if new); None when `addresses` are remembered already (it is turned away)."""
        now = self._clock()
        peer = self._peers.get(address)
        if peer is None:
            if len(self._peers) >= self.limits.addresses:
                self.prune(force=True)
            if len(self._peers) >= self.limits.addresses:
                self._overflow.log(logging.WARNING, "relay connections turned away",
                                   "relay connection from %s closed: connections from %d other addresses are open "
                                   "or recent", address, len(self._peers))
                return None
            peer = self._peers[address] = Peer(address, self.limits, now, self._clock)
        peer.seen = now
        return peer

    def prune(self, force: bool = False) -> None:
        """Forget addresses with nothing open, quiet for QUIET_S (at most once a second unless `force`)."""
        now = self._clock()
        if not force and now < self._pruned + 1.0:
            return
        self._pruned = now
        for address, peer in list(self._peers.items()):
            if not (peer.connections() or peer.sessions) and now - peer.seen > QUIET_S:
                del self._peers[address]
