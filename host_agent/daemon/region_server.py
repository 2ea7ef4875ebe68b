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
import logging
import multiprocessing
import os
import signal
import sys
import time
from multiprocessing.connection import Connection

from ivshmem import layout, liveness
from ivshmem.channel import Ctrl, HostChannel, HostReason, HostStatus
from ivshmem.errors import ChannelCorrupt, RegionError, WireError
from ivshmem.region import Region

from .. import agent_metrics, region_file, server_log
from ..handler import HandlerFactory, ReplyFailed, Session, notes_for, route_notes
from ..limits import LogLimiter, TokenBucket
from ..session import hot_path
from ..session.grant_sharing import EXIT_GRANT_ENDED  # a joined session's worker, once its grant's holder ended
from ..session_loop import RecordLoop, ServerOptions
from ..stop import StopRequest
from ..supervised import die_with_parent

log = logging.getLogger(__name__)
_MP = multiprocessing.get_context("fork")
EXIT_PROTOCOL_VIOLATION = 3
EXIT_REGION_FAILED = 4
# A worker that ended its channel in the middle of a reply (handler.ReplyFailed) exits with its reason's code...
EXIT_MID_REPLY = {HostReason.GPU_HOST_LOST: 5, HostReason.REPLY_FAILED: 6}
# ... and the supervisor, ending the channel again when the worker is gone, says the same reason.
EXIT_REASONS = {EXIT_PROTOCOL_VIOLATION: HostReason.PROTOCOL_VIOLATION, EXIT_GRANT_ENDED: HostReason.GRANT_ENDED,
                **{code: reason for reason, code in EXIT_MID_REPLY.items()}}


class RegionRefused(RegionError):
    """region_file.py's rules forbid serving (or formatting) this file; the message says why and what to do."""


class RegionShrunk(RegionError):
    """The region's file became smaller than its mapping while served (truncated by whoever can write it)."""


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
        relayed = loop.open(options.relay) if options.relay is not None else None
        if relayed is not None:
            relay, first = relayed
            sys.setswitchinterval(relay.switch_interval_s)  # this process: one session's relay and nothing else
            relay.run(first, lambda failed: os._exit(_end_mid_reply(channel, session, failed)))
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
    server_log.session_log(session.number, os.path.basename(region_path))  # beside server.log, as Orion kept
    agent_metrics.session_started(region_path, session.transport)
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
        if self.options.relay is not None:
            self.options.relay.prepare()  # the same for what a relayed session's worker runs
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
        if worker.pid is not None:
            agent_metrics.process_ended(worker.pid)
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
    """`python -m host_agent.daemon.region_server PATH`: serve one region with the diagnostics handler only
    (no GPU). oriond replaces this with the CUDA executor."""
    import argparse

    from ..diagnostics import DiagnosticsHandler

    parser = argparse.ArgumentParser(prog="python -m host_agent.daemon.region_server", description=main.__doc__)
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
