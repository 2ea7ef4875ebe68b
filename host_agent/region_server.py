"""Serving one Orion region: a supervisor loop plus one worker process per client session.

The supervisor formats the region if it holds no valid header, beats the agent heartbeat, answers claims,
and ends sessions whose client released the channel or died (lock gone, or heartbeat lost for guests).
Each session runs in its own worker process, so one tenant's crash or hostile records end that session
only. What a worker does with records is the handler's business (diagnostics.py now, the CUDA executor
later); this module never looks inside a payload.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import NamedTuple, Protocol

from ivshmem import layout, liveness
from ivshmem.channel import Ctrl, HostChannel, HostReason, HostStatus, Sink, Streamed
from ivshmem.errors import ChannelCorrupt, RecordError, RegionFormatError, WireError
from ivshmem.record import Flag, Record, Status
from ivshmem.region import Region
from ivshmem.wait import DEFAULT_POLICY, WaitPolicy

from .stop import StopRequest

log = logging.getLogger(__name__)
_MP = multiprocessing.get_context("fork")
MAX_ASYNC_ERRORS_REPORTED = 64


class Reply(NamedTuple):
    status: int = 0
    payload: bytes | bytearray | Streamed = b""


class Session(NamedTuple):
    number: int
    region: str
    channel: int
    generation: int


class Handler(Protocol):
    """What a worker calls for each request of its session."""

    def sink_for(self, opcode: int, length: int) -> Sink | None: ...

    def handle(self, record: Record) -> Reply: ...


HandlerFactory = Callable[[Session], Handler]
SessionEnd = Callable[[Session, list[str]], None]
_notes: Connection | None = None  # in a worker process: the pipe note() writes to


def note(text: str) -> None:
    """From a worker: tell the supervisor something it must act on when this session ends, however it ends
    (the worker may be killed). The executor notes the allocation it took up, so that oriond gives it back."""
    if _notes is not None:
        _notes.send(text)


@dataclass
class ServerOptions:
    channels: int = layout.DEFAULT_CHANNELS
    heartbeat_timeout: float = 10.0  # guests: seconds without a client heartbeat before reclaiming
    scan_interval: float = 0.05
    policy: WaitPolicy = field(default_factory=lambda: DEFAULT_POLICY)


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


def serve_session(region_path: str, session: Session, factory: HandlerFactory, policy: WaitPolicy) -> int:
    """Body of a worker process: serve one session until the supervisor ends it. Returns an exit code."""
    parent = os.getppid()

    def parent_alive() -> None:
        if os.getppid() != parent:
            os._exit(0)  # the supervisor is gone; nobody will read our replies
    region = Region.open(region_path)
    channel = HostChannel(region, session.channel)
    endpoint = channel.endpoint(policy, parent_alive)
    handler = factory(session)
    attach = getattr(handler, "attach_channel", None)
    if attach is not None:  # a handler that wants the worker's own mapping (the executor pins its channel)
        attach(region, session.channel)
    sink_for = lambda _call, opcode, length: handler.sink_for(opcode, length)  # noqa: E731
    async_errors = 0
    try:
        while True:
            try:
                record = endpoint.receive(sink_for=sink_for)
                assert record is not None
                reply = _answer(record, endpoint.generation, handler, session)
                call_id, flags = record.call_id, record.flags
            except RecordError as exc:  # malformed header: answered, and the session goes on
                log.warning("session %d: malformed record: %s", session.number, exc)
                reply = Reply(exc.status, str(exc).encode())
                call_id, flags = getattr(exc, "call_id", 0), getattr(exc, "flags", 0)
            if flags & Flag.NO_REPLY:
                if reply.status == 0:
                    continue
                async_errors += 1
                if async_errors > MAX_ASYNC_ERRORS_REPORTED:  # a client failing forever gets its first 64
                    if async_errors == MAX_ASYNC_ERRORS_REPORTED + 1:
                        log.warning("session %d: more than %d asynchronous errors; reporting no more",
                                    session.number, MAX_ASYNC_ERRORS_REPORTED)
                    continue
            reply_flags = Flag.ASYNC_ERROR if flags & Flag.NO_REPLY else 0
            try:
                endpoint.send(call_id, 0, reply_flags, reply.payload, reply.status)
            except RecordError as exc:  # the handler produced a reply too large to send
                log.error("session %d: %s", session.number, exc)
                endpoint.send(call_id, 0, reply_flags, str(exc).encode(), Status.HANDLER_FAILED)
    except ChannelCorrupt as exc:  # the peer broke the ring protocol: this session cannot go on
        log.error("session %d: %s", session.number, exc)
        channel.end(HostStatus.FAILED, HostReason.PROTOCOL_VIOLATION)
        return 3


def _worker_main(region_path: str, session: Session, factory: HandlerFactory, policy: WaitPolicy,
                 notes: Connection) -> None:
    global _notes
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the supervisor, which ends us
    _notes = notes
    os._exit(serve_session(region_path, session, factory, policy))


class RegionServer:
    """Serves every channel of one region until `stop()`."""

    def __init__(self, path: str, factory: HandlerFactory, options: ServerOptions | None = None,
                 stop: StopRequest | None = None, on_end: SessionEnd | None = None) -> None:
        """``on_end(session, notes)`` runs in the supervisor after a session ended, with what its worker
        noted (note()); it must not block for long: every channel of the region waits for it."""
        self.path = path
        self.factory = factory
        self.on_end = on_end
        self.options = options or ServerOptions()
        self.region = Region.open(path)
        self._stop = stop or StopRequest()
        self._workers: dict[int, tuple[Session, multiprocessing.process.BaseProcess, Connection]] = {}
        self._beats: dict[int, tuple[int, float]] = {}
        self._sessions = 0
        self._prepare()
        self.channels = [HostChannel(self.region, i) for i in range(self.region.geometry.channel_count)]

    def _prepare(self) -> None:
        """Format a blank or invalid region; fail the sessions a previous agent left behind."""
        try:
            geometry = self.region.geometry
        except RegionFormatError as exc:
            log.info("formatting %s (%s)", self.path, exc)
            name = os.path.basename(self.path)
            self.region.format(layout.Geometry.build(self.region.size, self.options.channels, name=name))
            geometry = self.region.geometry
        for index in range(geometry.channel_count):
            channel = HostChannel(self.region, index)
            if channel.pending_claim() is None and channel.ctrl[Ctrl.HOST_STATUS] == HostStatus.SERVING:
                channel.end(HostStatus.FAILED, HostReason.AGENT_RESTARTED)
        self.region.set_agent(pid=os.getpid(), state=layout.AGENT_SERVING, beat=True)

    # --- the loop ----------------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        try:
            while not self._stop.is_set():
                self.scan()
                self._stop.wait(self.options.scan_interval)
        finally:
            self.shutdown()

    def stop(self) -> None:
        self._stop.set()

    def scan(self) -> None:
        """One supervision pass over every channel."""
        self.region.set_agent(beat=True)
        for channel in self.channels:
            try:
                generation = channel.pending_claim()
                if generation is not None:
                    self._end(channel, HostStatus.IDLE, HostReason.NONE)
                    self._start(channel, generation)
                elif channel.index in self._workers:
                    self._supervise(channel)
            except Exception:  # one channel's failure must not stop the others being served
                log.exception("%s channel %d: could not serve it", self.path, channel.index)
                self._end(channel, HostStatus.FAILED, HostReason.WORKER_DIED)
                channel.end(HostStatus.FAILED, HostReason.WORKER_DIED)

    def _start(self, channel: HostChannel, generation: int) -> None:
        self._sessions += 1
        session = Session(self._sessions, self.path, channel.index, generation)
        channel.accept(generation)
        notes, worker_notes = _MP.Pipe(duplex=False)
        worker = _MP.Process(target=_worker_main, name=f"orion-session-{session.number}",
                             args=(self.path, session, self.factory, self.options.policy, worker_notes), daemon=True)
        worker.start()
        worker_notes.close()
        channel.ctrl[Ctrl.HOST_WORKER] = worker.pid or 0
        self._workers[channel.index] = (session, worker, notes)
        self._beats[channel.index] = (channel.ctrl[Ctrl.CLIENT_HEARTBEAT], time.monotonic())
        log.info("Creating session %d", session.number)
        log.info("Using SHM %s for acceleration.", os.path.basename(self.path))

    def _supervise(self, channel: HostChannel) -> None:
        session, worker, _ = self._workers[channel.index]
        if not worker.is_alive():
            log.warning("session %d: worker exited with code %s", session.number, worker.exitcode)
            reason = HostReason.PROTOCOL_VIOLATION if worker.exitcode == 3 else HostReason.WORKER_DIED
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
        entry = self._workers.pop(channel.index, None)
        if entry is None:
            return
        session, worker, notes = entry
        if worker.is_alive():
            worker.kill()
        worker.join(5)
        channel.end(status, reason)
        if reason not in (HostReason.CLIENT_RELEASED, HostReason.NONE):
            log.info("session %d ended: %s", session.number, reason.name.lower().replace("_", " "))
        log.info("Session %d exits.", session.number)
        noted = _drain(notes)
        if self.on_end is not None:
            try:
                self.on_end(session, noted)
            except Exception:  # the agent's follow-up must not stop the region being served
                log.exception("session %d: ending it failed", session.number)

    def shutdown(self) -> None:
        """End every session, mark the region stopped and unmap it."""
        for channel in self.channels:
            if channel.ctrl[Ctrl.CLIENT_ACTIVE]:
                self._end(channel, HostStatus.FAILED, HostReason.AGENT_STOPPED)
            else:
                self._end(channel, HostStatus.IDLE, HostReason.CLIENT_RELEASED)
        self.region.set_agent(state=layout.AGENT_STOPPED)
        self.region.close()


def _drain(notes: Connection) -> list[str]:
    """Everything a finished worker noted (the pipe stays readable after the writer died)."""
    noted: list[str] = []
    try:
        while notes.poll():
            noted.append(notes.recv())
    except (EOFError, OSError):
        pass
    finally:
        notes.close()
    return noted


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
