"""One session's loop: read each record from the session's transport, answer it through the session's handler.

The same loop serves every session, whatever carries it: a region's ring in a region worker (daemon/region_server.py)
and a relay connection on the GPU host (relay/worker.py). It drives its transport (handler.RecordEndpoint) and its
accelerator (`CompiledServing`: the session executor's compiled hot path); neither calls back into it.

A region's session may be served elsewhere: a host that relays (docs/remote.md) gives the loop a `SessionRoute`, and
the loop answers the session's opening records (HELLO, AGENT_INFO, BIND and the wire's diagnostics) until the route
says where the rest goes. Then either the loop serves the rest, or the worker runs the `RelayedSession` the route
made instead of the loop. The route decides and connects; the loop reads, answers and sends, always.

What does not belong here: serving a region (channels, claims, workers: daemon/region_server.py), what a record means
(the handlers), and how a relay connection is made or carried (relay/).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

from ivshmem import layout
from ivshmem.channel import Endpoint
from ivshmem.driver_api import table_digest
from ivshmem.errors import RecordError
from ivshmem.record import (
    BIND_REQUEST,
    CUDA_OPCODE_BASE,
    HELLO_REQUEST,
    PROTOCOL,
    STATS_REPLY,
    Flag,
    Op,
    Record,
    Status,
)
from ivshmem.wait import DEFAULT_POLICY, WaitPolicy

from . import agent_metrics
from .errors import RefusedError
from .handler import Handler, RecordEndpoint, Reply, ReplyFailed, Session, refused
from .limits import LogLimiter

log = logging.getLogger(__name__)
MAX_ASYNC_ERRORS_REPORTED = 64
Hello = tuple[int, int, str, str]  # what a HELLO says of its client: protocol, pid, host name, call-table digest


class RelayedSession(Protocol):
    """A session carried to a GPU host (relay/relayed_session.py): what a region worker runs instead of the loop."""

    switch_interval_s: float  # the interpreter's switch interval its process wants (it runs nothing else)

    def run(self, first: Record | None = None, ended: Callable[[ReplyFailed], NoReturn] | None = None) -> None:
        """Carry the session until it ends, `first` (already read) first. `ended` is how the session ends when a
        reply was cut short (the worker ends its channel and exits); by default the ReplyFailed is raised."""


class SessionRoute(Protocol):
    """Where a region's sessions are served (relay/route.py's RelayRoute): asked by the loop during a session's
    opening. Every refusal is a RefusedError whose message is the one line the guest's user reads."""

    @property
    def fixed(self) -> str: ...  # every session goes to this GPU host ("": only those whose grant is elsewhere)

    def prepare(self) -> None:
        """Load what a relayed session runs, before the region's workers are forked (each then has it at once)."""

    def agent_info(self) -> bytes:
        """The AGENT_INFO answer of this host."""

    def target_of(self, allocation: str) -> tuple[str, int] | None:
        """The GPU host a session bringing `allocation` goes to, or None: this host."""

    def relay(self, target: tuple[str, int], hello: Hello, allocation: str, ring: Endpoint, handler: Handler,
              session: int) -> tuple[RelayedSession, bytes]:
        """Connect the session on `ring` to `target`: the relayed session and the GPU host's BIND answer."""

    def unreachable(self, why: str, ring: Endpoint, handler: Handler, session: int) -> RelayedSession:
        """A relayed session whose GPU host could not be reached: every CUDA call answers DEVICE_UNAVAILABLE."""


class CompiledServing(Protocol):
    """The session executor's compiled hot path (session/hot_path.HotPath), as the loop drives it: `serve` answers
    what it can and returns why it stopped (one of the codes below), with a posted call's failure to report."""

    CHECK: int
    IDLE: int
    POSTED_FAILED: int

    def serve(self, block: bool = True) -> tuple[int, int, int]: ...

    def counts(self) -> dict[int, tuple[int, int, int]]: ...  # by opcode: records served, their ns, ns in the driver

    def time_records(self) -> None: ...  # from now on, counts() times them

    @property
    def served(self) -> int: ...  # records it served so far


@dataclass
class ServerOptions:
    channels: int = layout.DEFAULT_CHANNELS
    heartbeat_timeout: float = 10.0  # guests: seconds without a client heartbeat before reclaiming
    scan_interval: float = 0.05
    policy: WaitPolicy = field(default_factory=lambda: DEFAULT_POLICY)
    # What one untrusted client can make the host do (docs/security.md):
    stall_timeout: float = 10.0  # a staged request whose next chunk does not come for this long ends the session
    max_assembled: int = 256 << 20  # largest staged request a worker assembles in memory (no sink): bigger -> -3
    region_session_rate: float = 8.0  # session starts per second, per region (a burst of region_session_burst)
    region_session_burst: int = 16
    channel_session_rate: float = 2.0  # the same per channel
    channel_session_burst: int = 4
    malformed_logged: int = 10  # malformed records logged one by one per session, then one line a minute
    relay: SessionRoute | None = None  # sessions may be relayed to a GPU host (relay/route.py); None: all served here


def answer_record(record: Record, generation: int, handler: Handler, session: Session) -> Reply:
    """The reply to one well-formed record; every failure becomes an error reply, never an exception."""
    if record.generation != generation:
        return Reply(Status.MALFORMED, f"record {record.call_id} belongs to generation {record.generation}, "
                                       f"not {generation}".encode())
    try:
        return handler.handle(record)
    except RecordError as exc:  # a payload the handler could not decode
        return Reply(exc.status, str(exc).encode())
    except Exception as exc:  # a handler bug must not end the session silently or crash the agent
        log.exception("session %d: handler failed on opcode %#x", session.number, record.opcode)
        return Reply(Status.HANDLER_FAILED, f"{type(exc).__name__}: {exc}".encode())


class RecordLoop:
    """Answers one session's records: the worker's loop, and its state (how many asynchronous errors were sent).

    With `hot`, the compiled hot path takes the records it serves straight from the transport and hands back the
    others, which this loop answers as it answers everything without it: the Python path is the reference. A
    posted record (NO_REPLY) gets no reply unless it failed; then an ASYNC_ERROR reply, the first
    MAX_ASYNC_ERRORS_REPORTED of the session's. The wire's STATS (ORION_STATS, docs/performance.md) is answered with
    the compiled path's counts and, from the session's first STATS on, what this loop answered, by opcode, with its
    time: a session that never asks pays nothing for it here."""

    def __init__(self, endpoint: RecordEndpoint, handler: Handler, session: Session, options: ServerOptions,
                 hot: CompiledServing | None = None) -> None:
        self.endpoint, self.handler, self.session, self.hot = endpoint, handler, session, hot
        self.malformed = LogLimiter(log, first=options.malformed_logged)
        self.async_errors = 0
        self.metrics = agent_metrics.enabled()  # oriond's /metrics: records counted by path (agent_metrics.py)
        self.compiled_counted = 0  # the hot path's records already counted there
        # opcode -> [records answered here, nanoseconds spent on them]; None until the client asks STATS
        self.answered: dict[int, list[int]] | None = None

    def run(self, until_idle: bool = False) -> None:
        """Answer records forever (with `until_idle`, until none is waiting: the tests). Raises ChannelCorrupt
        when the peer broke the ring protocol."""
        endpoint, handler, hot = self.endpoint, self.handler, self.hot
        sink_for = lambda _call, opcode, length: handler.sink_for(opcode, length)  # noqa: E731
        while True:
            if hot is not None:
                code, failed_id, failed_status = hot.serve(not until_idle)
                if self.metrics:
                    served = hot.served
                    agent_metrics.records("compiled", served - self.compiled_counted)
                    self.compiled_counted = served
                if code == hot.CHECK:  # the compiled wait's slow phase: the liveness checks the Python wait makes
                    if endpoint.check is not None:
                        endpoint.check()
                    continue
                if code == hot.IDLE:
                    return
            try:
                if hot is not None and code == hot.POSTED_FAILED:  # a posted call that failed, answered in C
                    self.send(failed_id, Flag.NO_REPLY, Reply(failed_status))
                    continue
                record = endpoint.receive(sink_for=sink_for, wait=not until_idle)
            except RecordError as exc:  # malformed header: answered, and the session goes on
                self.answer_malformed(exc)
                continue
            if record is None:  # receive() waits for a record unless until_idle: nothing is there
                if until_idle:
                    return
                continue
            self.answer(record)

    def answer(self, record: Record) -> Reply:
        """Answer one well-formed record read from the endpoint; the reply (sent, unless it was a posted call's
        success)."""
        if record.opcode == Op.STATS and record.generation == self.endpoint.generation:
            reply = Reply(Status.OK, self.stats())
            if self.answered is None:
                self.answered = {}  # counted from now on
                if self.hot is not None:
                    self.hot.time_records()
        elif self.answered is None:
            reply = answer_record(record, self.endpoint.generation, self.handler, self.session)
        else:
            started = time.perf_counter_ns()
            reply = answer_record(record, self.endpoint.generation, self.handler, self.session)
            counted = self.answered.get(record.opcode)
            if counted is None:
                counted = self.answered[record.opcode] = [0, 0]
            counted[0] += 1
            counted[1] += time.perf_counter_ns() - started
        self.send(record.call_id, record.flags, reply)
        if self.metrics:
            agent_metrics.records("python")
        return reply

    def stats(self) -> bytes:
        """STATS_REPLY: per opcode, the records the compiled path served, those answered here and their time, and the
        compiled path's time for its records and their time in the driver."""
        compiled = self.hot.counts() if self.hot is not None else {}
        answered = self.answered or {}
        opcodes = sorted(set(compiled) | set(answered))
        rows = []
        for op in opcodes:
            records, ns, driver_ns = compiled.get(op, (0, 0, 0))
            rows.append((op, records, *answered.get(op, (0, 0)), ns, driver_ns))
        return STATS_REPLY.encode(rows)

    def answer_malformed(self, exc: RecordError) -> None:
        """Answer a record whose header the endpoint refused; the session goes on."""
        self.malformed.log(logging.WARNING, "malformed records", "session %d: malformed record: %s",
                           self.session.number, exc)
        agent_metrics.refused("malformed")
        self.send(getattr(exc, "call_id", 0), getattr(exc, "flags", 0), Reply(exc.status, str(exc).encode()))

    def send(self, call_id: int, flags: int, reply: Reply) -> None:
        """Send `reply` to record `call_id` (a posted record's: only a failure, and only the session's first
        MAX_ASYNC_ERRORS_REPORTED)."""
        if flags & Flag.NO_REPLY:
            if reply.status == 0:
                return
            self.async_errors += 1
            if self.async_errors > MAX_ASYNC_ERRORS_REPORTED:  # a client failing forever gets its first 64
                if self.async_errors == MAX_ASYNC_ERRORS_REPORTED + 1:
                    log.warning("session %d: more than %d asynchronous errors; reporting no more",
                                self.session.number, MAX_ASYNC_ERRORS_REPORTED)
                return
        reply_flags = Flag.ASYNC_ERROR if flags & Flag.NO_REPLY else 0
        try:
            self.endpoint.send(call_id, 0, reply_flags, reply.payload, reply.status)
        except RecordError as exc:  # the handler produced a reply too large to send
            log.error("session %d: %s", self.session.number, exc)
            self.endpoint.send(call_id, 0, reply_flags, str(exc).encode(), Status.HANDLER_FAILED)

    # --- a relayable session's opening ---------------------------------------------------------------------------
    def open(self, route: SessionRoute) -> tuple[RelayedSession, Record | None] | None:
        """Answer the session's opening records until `route` says where the rest is served: the relayed session to
        run and the record it must carry first, or None (the rest is this loop's; every record read so far has
        been answered). The route decides by the first of: BIND naming a grant (its host), the first CUDA record
        (a fixed route's GPU host, else this host)."""
        endpoint, handler = self.endpoint, self.handler
        sink_for = None if route.fixed else (lambda _call, opcode, length: handler.sink_for(opcode, length))
        # What the relay says of the client: its HELLO's, or (a client that sent none, which this host serves too)
        # this agent's own protocol and call table, for which the relay vouches.
        hello: Hello = (PROTOCOL, 0, "", table_digest())
        while True:
            try:
                record = endpoint.receive(sink_for=sink_for)
            except RecordError as exc:
                self.answer_malformed(exc)
                continue
            if record is None:
                continue
            opcode = record.opcode
            if opcode == Op.HELLO:
                if self.answer(record).status == Status.OK:
                    hello = HELLO_REQUEST.decode(record.payload)
            elif opcode == Op.AGENT_INFO and not record.payload and record.generation == endpoint.generation:
                self.send(record.call_id, record.flags, Reply(Status.OK, route.agent_info()))
            elif opcode == Op.BIND:
                bound = self._bind(record, route, hello)
                if bound is True:
                    return None
                if bound is not False:
                    return bound, None
            elif opcode < CUDA_OPCODE_BASE or not route.fixed:
                self.answer(record)  # the wire's diagnostics, or this host's first CUDA call
                if opcode >= CUDA_OPCODE_BASE:
                    return None
            else:
                ring = self._ring()
                try:
                    target = route.target_of("")
                    if target is None:
                        raise RefusedError(f"the relay route {route.fixed[:80]!r} names no GPU host")
                    relayed, _ = route.relay(target, hello, "", ring, handler, self.session.number)
                except RefusedError as exc:
                    log.warning("session %d: %s; its calls answer CUDA_ERROR_DEVICE_UNAVAILABLE",
                                self.session.number, exc)
                    relayed = route.unreachable(str(exc), ring, handler, self.session.number)
                return relayed, record

    def _bind(self, record: Record, route: SessionRoute, hello: Hello) -> RelayedSession | bool:
        """BIND during the opening, answered: the relayed session when the grant is another host's (the answer is
        that host's BIND reply), True when it is this host's and taken up here, False when refused (the session
        stays in its opening, as after a refused local BIND)."""
        try:
            (allocation,) = BIND_REQUEST.decode(record.payload)
            target = route.target_of(allocation)
            if target is None:
                return self.answer(record).status == Status.OK
            relayed, bound = route.relay(target, hello, allocation, self._ring(), self.handler, self.session.number)
        except RecordError:
            self.answer(record)  # the handler's own refusal of a malformed BIND
            return False
        except RefusedError as exc:
            log.warning("session %d: %s", self.session.number, exc)
            self.send(record.call_id, record.flags, refused(str(exc)))
            return False
        self.send(record.call_id, record.flags, Reply(Status.OK, bound))
        return relayed

    def _ring(self) -> Endpoint:
        """Only a region's session is relayed: its transport is a ring, whose words a relay drives."""
        if not isinstance(self.endpoint, Endpoint):
            raise TypeError(f"session {self.session.number}: only a region's session is relayed, not one on "
                            f"{type(self.endpoint).__name__}")
        return self.endpoint
