"""Serving one Orion region: a supervisor loop plus one worker process per client session.

The supervisor formats the region if it holds only zeros or a damaged Orion header (region_file.py decides;
it never writes into a file holding anything else), beats the agent heartbeat, answers claims, and ends
sessions whose client released the channel or died (lock gone, or heartbeat lost for guests). Each session
runs in its own worker process, so one tenant's crash or hostile records end that session only; the worker
beats its channel's host heartbeat, which is what the client watches. The client is not trusted: session
starts are rate-limited per channel and per region, a staged payload is bounded and may not stall, and
malformed records are logged a few at a time (limits.py). What a worker does with records is the handler's
business (handler.py's protocol: diagnostics.py, or the CUDA executor); this module never looks inside a
payload.

A supervisor maps its region, so if the file is truncated under it, it dies of SIGBUS; oriond therefore runs
each region's supervisor in a process of its own (region_process.py) and this module never assumes it is
oriond's main process.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from ivshmem import layout, liveness
from ivshmem.channel import Ctrl, HostChannel, HostReason, HostStatus
from ivshmem.errors import ChannelCorrupt, RecordError, RegionError, WireError
from ivshmem.record import Flag, Record, Status
from ivshmem.region import Region
from ivshmem.wait import DEFAULT_POLICY, WaitPolicy

from . import hot_path, region_file
from .handler import Handler, HandlerFactory, RecordEndpoint, Reply, ReplyFailed, Session, notes_for, route_notes
from .limits import LogLimiter, TokenBucket
from .relay_route import RelayRoute, open_session
from .relay_session import SWITCH_INTERVAL_S
from .stop import StopRequest

log = logging.getLogger(__name__)
_MP = multiprocessing.get_context("fork")
MAX_ASYNC_ERRORS_REPORTED = 64
PR_SET_PDEATHSIG = 1
EXIT_PROTOCOL_VIOLATION = 3
EXIT_REGION_FAILED = 4
# A worker that ended its channel in the middle of a reply (handler.ReplyFailed) exits with its reason's code...
EXIT_MID_REPLY = {HostReason.GPU_HOST_LOST: 5, HostReason.REPLY_FAILED: 6}
# ... and the supervisor, ending the channel again when the worker is gone, says the same reason.
EXIT_REASONS = {EXIT_PROTOCOL_VIOLATION: HostReason.PROTOCOL_VIOLATION,
                **{code: reason for reason, code in EXIT_MID_REPLY.items()}}


class RegionRefused(RegionError):
    """region_file.py's rules forbid serving (or formatting) this file; the message says why and what to do."""


class RegionShrunk(RegionError):
    """The region's file became smaller than its mapping while served (truncated by whoever can write it)."""


def die_with_parent(signum: int) -> None:
    """Have the kernel send `signum` to this process when the process that forked it ends, however it ends."""
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum)
    if os.getppid() != parent:  # it ended before the request was in place
        os.kill(os.getpid(), signum)


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
    relay: RelayRoute | None = None  # sessions may be relayed to a GPU host (relay_route.py); None: all served here


def _answer(record: Record, generation: int, handler: Handler, session: Session) -> Reply:
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

    With `hot`, the compiled hot path (hot_path.py) takes the records it serves straight from the ring and hands
    back the others, which this loop answers as it answers everything without it: the Python path is the
    reference. A posted record (NO_REPLY) gets no reply unless it failed; then an ASYNC_ERROR reply, the first
    MAX_ASYNC_ERRORS_REPORTED of the session's."""

    def __init__(self, endpoint: RecordEndpoint, handler: Handler, session: Session, options: ServerOptions,
                 hot: hot_path.HotPath | None = None) -> None:
        self.endpoint, self.handler, self.session, self.hot = endpoint, handler, session, hot
        self.malformed = LogLimiter(log, first=options.malformed_logged)
        self.async_errors = 0

    def run(self, until_idle: bool = False) -> None:
        """Answer records forever (with `until_idle`, until none is waiting: the tests). Raises ChannelCorrupt
        when the peer broke the ring protocol."""
        endpoint, handler, hot = self.endpoint, self.handler, self.hot
        sink_for = lambda _call, opcode, length: handler.sink_for(opcode, length)  # noqa: E731
        while True:
            if hot is not None:
                code, failed_id, failed_status = hot.serve(not until_idle)
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
        success). A relayable session's opening records (relay_route.py) are answered through this too."""
        reply = _answer(record, self.endpoint.generation, self.handler, self.session)
        self.send(record.call_id, record.flags, reply)
        return reply

    def answer_malformed(self, exc: RecordError) -> None:
        """Answer a record whose header the endpoint refused; the session goes on."""
        self.malformed.log(logging.WARNING, "malformed records", "session %d: malformed record: %s",
                           self.session.number, exc)
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


def serve_session(region_path: str, session: Session, factory: HandlerFactory, options: ServerOptions) -> int:
    """Body of a worker process: serve one session until the supervisor ends it. Returns an exit code."""
    parent = os.getppid()

    def parent_alive() -> None:
        if os.getppid() != parent:
            os._exit(0)  # the supervisor is gone; nobody will read our replies
    region = Region.open(region_path)
    channel = HostChannel(region, session.channel)
    # The client judges the session by this beat, not by the supervisor's (which may be busy elsewhere).
    liveness.Heartbeat(channel.beat)
    endpoint = channel.endpoint(options.policy, parent_alive)
    endpoint.stall_timeout = options.stall_timeout
    endpoint.max_assembled = options.max_assembled
    handler = factory(session)
    attach = getattr(handler, "attach_channel", None)
    if attach is not None:  # a handler that wants the worker's own mapping (the executor pins its channel)
        attach(region, session.channel)
    loop = RecordLoop(endpoint, handler, session, options)
    try:
        if options.relay is not None:
            relayed = open_session(loop, options.relay)
            if relayed is not None:
                relay, first = relayed
                relay.cut_short = lambda failed: os._exit(_end_mid_reply(channel, session, failed))  # type: ignore[method-assign]
                sys.setswitchinterval(SWITCH_INTERVAL_S)  # this process: one session's relay and nothing else
                relay.run(first)
                return 0  # not reached: only an exception ends the relay
        loop.hot = hot_path.attach(endpoint, handler)  # the compiled hot records, if this host can build it
        if loop.hot is not None:
            log.info("session %d: compiled hot path serves %s", session.number, ", ".join(loop.hot.calls))
        loop.run()
        return 0  # not reached: only an exception ends the loop
    except ReplyFailed as exc:  # the client would read wrong bytes as a success: the session ends instead
        return _end_mid_reply(channel, session, exc)
    except ChannelCorrupt as exc:  # the peer broke the ring protocol: this session cannot go on
        if channel.ctrl[Ctrl.CLIENT_GEN] != session.generation or not channel.ctrl[Ctrl.CLIENT_ACTIVE]:
            return 0  # not a violation: the client released and re-claimed (reset its indices) before we ended
        log.error("session %d: %s", session.number, exc)
        channel.end(HostStatus.FAILED, HostReason.PROTOCOL_VIOLATION)
        return EXIT_PROTOCOL_VIOLATION


def _end_mid_reply(channel: HostChannel, session: Session, failed: ReplyFailed) -> int:
    """A reply failed after its record went out (handler.ReplyFailed: the executor's copy, or a relay's GPU host
    lost): end the channel, saying why. The worker's exit code."""
    log.error("session %d: %s: the session ends", session.number, failed)
    channel.end(HostStatus.FAILED, failed.reason)
    return EXIT_MID_REPLY[failed.reason]


def _worker_main(region_path: str, session: Session, factory: HandlerFactory, options: ServerOptions) -> None:
    die_with_parent(signal.SIGKILL)  # a supervisor that dies (SIGBUS on a truncated region) takes us along
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the supervisor, which ends us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    notes_for(session.number)
    try:
        code = serve_session(region_path, session, factory, options)
    except WireError as exc:  # the region became unusable under us (its header overwritten): this session ends
        log.error("session %d: %s", session.number, exc)
        code = EXIT_REGION_FAILED
    os._exit(code)


class RegionServer:
    """Serves every channel of one region until `stop()`."""

    def __init__(self, path: str, factory: HandlerFactory, options: ServerOptions | None = None,
                 stop: StopRequest | None = None, events: Connection | None = None, agent_pid: int = 0) -> None:
        """With `events` (oriond's region process), what workers note() and each ended session go there, as
        ("note", session, text) and ("ended", session, ""). `agent_pid` is the pid the region shows for its
        agent (oriond's, whose region process this is); by default this process's."""
        self.path = path
        self.factory = factory
        self.options = options or ServerOptions()
        self._stop = stop or StopRequest()
        self._events = events
        route_notes(events)
        verdict = region_file.examine(path, self.options.channels)
        if verdict.action == region_file.REFUSE:
            raise RegionRefused(verdict.reason)
        self.region = Region.open(path)
        mapped = region_file.Identity.of(os.fstat(self.region.fd))
        if verdict.identity is None or not mapped.same_file(verdict.identity):
            self.region.close()
            raise RegionRefused(f"{path} was replaced while oriond examined it; it is looked at again")
        self._workers: dict[int, tuple[Session, multiprocessing.process.BaseProcess]] = {}
        self._beats: dict[int, tuple[int, float]] = {}
        self._sessions = 0
        self._pid = agent_pid or os.getpid()
        o = self.options
        self._region_starts = TokenBucket(o.region_session_rate, o.region_session_burst)
        self._channel_starts: dict[int, TokenBucket] = {}
        self._deferred = LogLimiter(log, first=1, every=10.0)
        self._prepare(verdict)
        hot_path.load()  # built (once, cached) and loaded here, so every forked worker has it at once
        self.channels = [HostChannel(self.region, i) for i in range(self.region.geometry.channel_count)]

    def _prepare(self, verdict: region_file.Verdict) -> None:
        """Format a region of zeros or with a damaged Orion header; fail the sessions a previous agent left."""
        if verdict.action == region_file.FORMAT:
            log.info("formatting %s (%s)", self.path, verdict.reason)
            name = os.path.basename(self.path)
            self.region.format(layout.Geometry.build(self.region.size, self.options.channels, name=name))
        geometry = self.region.geometry
        for index in range(geometry.channel_count):
            channel = HostChannel(self.region, index)
            if channel.pending_claim() is None and channel.ctrl[Ctrl.HOST_STATUS] == HostStatus.SERVING:
                channel.end(HostStatus.FAILED, HostReason.AGENT_RESTARTED)
        self.region.set_agent(pid=self._pid, state=layout.AGENT_SERVING, beat=True)

    # --- the loop ----------------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        try:
            while not self._stop.is_set():
                self.scan()
                self._stop.wait(self.options.scan_interval)
        except RegionShrunk:
            self.abandon()
            raise
        self.shutdown()

    def stop(self) -> None:
        self._stop.set()

    def scan(self) -> None:
        """One supervision pass over every channel. Raises RegionShrunk, before touching the mapping, when the
        file became smaller than it (touching it then would be SIGBUS)."""
        size = os.fstat(self.region.fd).st_size
        if size < self.region.size:
            raise RegionShrunk(f"{self.path} was truncated to {size} bytes while served ({self.region.size} mapped)")
        # Rewritten on every pass: a client that overwrites these words cannot make the region look unserved.
        self.region.set_agent(pid=self._pid, state=layout.AGENT_SERVING, beat=True)
        for channel in self.channels:
            try:
                generation = channel.pending_claim()
                if generation is not None:
                    if self._may_start(channel.index):
                        self._end(channel, HostStatus.IDLE, HostReason.NONE)
                        self._start(channel, generation)
                elif channel.index in self._workers:
                    self._supervise(channel)
            except Exception:  # one channel's failure must not stop the others being served
                log.exception("%s channel %d: could not serve it", self.path, channel.index)
                self._end(channel, HostStatus.FAILED, HostReason.WORKER_DIED)
                channel.end(HostStatus.FAILED, HostReason.WORKER_DIED)

    def _may_start(self, index: int) -> bool:
        """Whether a claim may get its session now; a claim over the limits waits for a later pass (its client
        waits for the answer, up to its accept timeout), so a client re-claiming in a loop forks a bounded
        number of workers."""
        o = self.options
        bucket = self._channel_starts.get(index)
        if bucket is None:
            bucket = self._channel_starts[index] = TokenBucket(o.channel_session_rate, o.channel_session_burst)
        if bucket.ready() and self._region_starts.ready():
            return bucket.take() and self._region_starts.take()
        self._deferred.log(logging.WARNING, "deferred session starts",
                           "%s: session starts deferred on channel %d (more than %g per second per channel or %g per "
                           "region): a client is claiming channels in a loop", self.path, index,
                           o.channel_session_rate, o.region_session_rate)
        return False

    def _start(self, channel: HostChannel, generation: int) -> None:
        self._sessions += 1
        session = Session(self._sessions, self.path, channel.index, generation)
        channel.accept(generation)
        worker = _MP.Process(target=_worker_main, name=f"orion-session-{session.number}",
                             args=(self.path, session, self.factory, self.options), daemon=True)
        worker.start()
        channel.ctrl[Ctrl.HOST_WORKER] = worker.pid or 0
        self._workers[channel.index] = (session, worker)
        self._beats[channel.index] = (channel.ctrl[Ctrl.CLIENT_HEARTBEAT], time.monotonic())
        log.info("Creating session %d", session.number)
        log.info("Using SHM %s for acceleration.", os.path.basename(self.path))

    def _supervise(self, channel: HostChannel) -> None:
        session, worker = self._workers[channel.index]
        if not worker.is_alive():
            log.warning("session %d: worker exited with code %s", session.number, worker.exitcode)
            reason = EXIT_REASONS.get(worker.exitcode or 0, HostReason.WORKER_DIED)
            self._end(channel, HostStatus.FAILED, reason)
            return
        alive, self._beats[channel.index] = channel.client_alive(self._beats[channel.index],
                                                                 self.options.heartbeat_timeout)
        if alive:
            return
        if not channel.ctrl[Ctrl.CLIENT_ACTIVE]:  # a clean release
            self._end(channel, HostStatus.IDLE, HostReason.CLIENT_RELEASED)
        elif channel.ctrl[Ctrl.LIVENESS] == liveness.LOCK_MODE:
            self._end(channel, HostStatus.RECLAIMED, HostReason.CLIENT_DIED)
        else:
            self._end(channel, HostStatus.RECLAIMED, HostReason.HEARTBEAT_LOST)

    def _end(self, channel: HostChannel, status: HostStatus, reason: HostReason) -> None:
        session = self._reap(channel.index)
        if session is None:
            return
        channel.end(status, reason)
        if reason not in (HostReason.CLIENT_RELEASED, HostReason.NONE):
            log.info("session %d ended: %s", session.number, reason.name.lower().replace("_", " "))
        log.info("Session %d exits.", session.number)

    def _reap(self, index: int) -> Session | None:
        """Stop the worker of channel `index`, if any, and tell oriond its session ended."""
        entry = self._workers.pop(index, None)
        if entry is None:
            return None
        session, worker = entry
        if worker.is_alive():
            worker.kill()
        worker.join(5)
        if self._events is not None:
            with contextlib.suppress(OSError):  # oriond is gone; nobody is left to act on it
                self._events.send(("ended", session.number, ""))
        return session

    def shutdown(self) -> None:
        """End every session, mark the region stopped and unmap it."""
        for channel in self.channels:
            if channel.ctrl[Ctrl.CLIENT_ACTIVE]:
                self._end(channel, HostStatus.FAILED, HostReason.AGENT_STOPPED)
            else:
                self._end(channel, HostStatus.IDLE, HostReason.CLIENT_RELEASED)
        self.region.set_agent(state=layout.AGENT_STOPPED)
        self.region.close()

    def abandon(self) -> None:
        """End every session without touching the region (it shrank: its pages may be gone)."""
        ended = [self._reap(index) for index in list(self._workers)]
        for session in ended:
            if session is not None:
                log.info("session %d ended: its region shrank", session.number)
        self.channels = []


def serve(path: str, factory: HandlerFactory, options: ServerOptions | None = None) -> None:
    """Serve `path` in this process until SIGINT or SIGTERM."""
    stop = StopRequest().on_signals()  # before the region says "serving", so no signal is lost
    server = RegionServer(path, factory, options, stop)
    log.info("serving %s (%d channels)", path, server.region.geometry.channel_count)
    server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    """`python -m host_agent.region_server PATH`: serve one region with the diagnostics handler only
    (no GPU). oriond replaces this with the CUDA executor."""
    import argparse

    from .diagnostics import DiagnosticsHandler

    parser = argparse.ArgumentParser(prog="python -m host_agent.region_server", description=main.__doc__)
    parser.add_argument("path", help="region file, e.g. /dev/shm/orionsock0")
    parser.add_argument("--channels", type=int, default=layout.DEFAULT_CHANNELS,
                        help="channels when the region must be formatted (default %(default)s)")
    parser.add_argument("--heartbeat-timeout", type=float, default=10.0,
                        help="seconds without a guest client heartbeat before its session is reclaimed")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(levelname)s] %(message)s")
    try:
        serve(args.path, DiagnosticsHandler, ServerOptions(channels=args.channels,
                                                           heartbeat_timeout=args.heartbeat_timeout))
    except WireError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
