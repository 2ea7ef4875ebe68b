"""The GPU host's listener for relay connections (docs/remote.md): accepts on `bind_addr:listen_port` and gives
each connection a worker process of its own (relay_worker.serve_relayed), as a region supervisor gives each
claimed channel one: tenants never share an address space, and a crash or a hostile record ends one session.

What a peer can make it do is bounded: at most `max_sessions` relayed sessions at once (a connection beyond
that is refused with the reason and closed), a connection that sends no RELAY_HELLO is closed after
relay_worker.HELLO_TIMEOUT_S, and every record then goes through the same checks as on a region. The listener
itself never initialises CUDA (a worker does, after its fork), and dies with its parent.

oriond binds the socket itself (`listen_socket`), so that a port already taken is one line in its log at start-up
and never a process failing in a loop, and runs the listener in a process of its own (`ListenerProcess`), whose
events (an allocation a relayed session took up, each ended session) reach oriond as a region's do.
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
from typing import TYPE_CHECKING

from ivshmem.record import Status

from .handler import HandlerFactory, Session, notes_for, route_notes
from .region_process import SupervisedProcess
from .region_server import ServerOptions, die_with_parent
from .relay_frames import RELAY_ACCEPT, FrameStream
from .relay_transport import TCP_ONLY, RdmaSettings
from .relay_worker import serve_relayed
from .stop import StopRequest

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

log = logging.getLogger(__name__)

ACCEPT_POLL_S = 0.5
MAX_SESSIONS = 64


def listen_socket(bind_addr: str, port: int) -> socket.socket:
    """A TCP socket listening on `bind_addr:port` (0: any free port); OSError when it cannot be had."""
    family = socket.AF_INET6 if ":" in bind_addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind_addr, port))
        sock.listen(16)
    except OSError:
        sock.close()
        raise
    return sock


class RelayListener:
    def __init__(self, sock: socket.socket, factory: HandlerFactory, options: ServerOptions | None = None,
                 stop: StopRequest | None = None, max_sessions: int = MAX_SESSIONS,
                 events: Connection | None = None, rdma: RdmaSettings = TCP_ONLY) -> None:
        """`sock` is listening (listen_socket); `events`, when given, gets ("ended", session, "") for each ended
        session, and its workers' note()s, as a region supervisor's pipe does; `rdma`: whether sessions may move
        to RDMA (relay_transport.py)."""
        self.factory, self.options, self.rdma = factory, options or ServerOptions(), rdma
        self._stop = stop or StopRequest()
        self.max_sessions = max_sessions
        self.workers: dict[int, tuple[int, str]] = {}  # pid -> (session, peer)
        self._next_session = 0
        self._events = events
        route_notes(events)
        self.sock = sock
        self.sock.settimeout(ACCEPT_POLL_S)
        self.address = self.sock.getsockname()

    def serve_forever(self) -> None:
        try:
            while not self._stop.is_set():
                self._reap()
                try:
                    conn, peer = self.sock.accept()
                except TimeoutError:
                    continue
                except OSError as exc:  # a connection reset before it was accepted: the next one
                    log.warning("relay listener: accept failed: %s", exc)
                    continue
                self._start(conn, f"{peer[0]}:{peer[1]}")
        finally:
            self.sock.close()
            for pid in list(self.workers):
                _end(pid)
            self._reap(wait=True)

    def _start(self, conn: socket.socket, peer: str) -> None:
        if len(self.workers) >= self.max_sessions:
            log.warning("relay listener: refusing %s: %d relayed sessions already", peer, self.max_sessions)
            with conn:
                conn.settimeout(1.0)
                reason = f"this host serves {self.max_sessions} relayed sessions already; try another host"
                with contextlib.suppress(OSError):
                    FrameStream(conn).send(0, RELAY_ACCEPT, reason.encode(), status=Status.REFUSED)
            return
        self._next_session += 1
        session = Session(self._next_session, f"relay {peer}", 0, random.randrange(1, 1 << 31))
        pid = os.fork()
        if pid == 0:  # the worker: this connection only
            code = 1
            try:
                die_with_parent(signal.SIGKILL)
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                self.sock.close()
                notes_for(session.number)
                conn.settimeout(None)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # records are small; never delayed
                log.info("Creating session %d (relayed from %s)", session.number, peer)
                code = serve_relayed(conn, self.factory, session, self.options, self.rdma)
            finally:
                os._exit(code)
        conn.close()
        self.workers[pid] = (session.number, peer)

    def _reap(self, wait: bool = False) -> None:
        for pid in list(self.workers):
            try:
                done, status = os.waitpid(pid, 0 if wait else os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done:
                number, peer = self.workers.pop(pid)
                log.info("relayed session %d from %s ended (exit %d)", number, peer,
                         os.waitstatus_to_exitcode(status))
                if self._events is not None:
                    with contextlib.suppress(OSError):  # oriond is gone; nobody is left to act on it
                        self._events.send(("ended", number, ""))


def _end(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def _listen(sock: socket.socket, factory: HandlerFactory, options: ServerOptions, rdma: RdmaSettings,
            events: Connection) -> None:
    """Body of the listener process: accept relay connections until SIGTERM (or oriond's end)."""
    die_with_parent(signal.SIGTERM)
    stop = StopRequest().on_signals()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # oriond's own wake-up signal; not ours
    RelayListener(sock, factory, options, stop, events=events, rdma=rdma).serve_forever()
    os._exit(0)


class ListenerProcess(SupervisedProcess):
    """oriond's side of the relay listener's process: ended sessions and their notes, as a region's."""

    def __init__(self, sock: socket.socket, factory: HandlerFactory, options: ServerOptions,
                 rdma: RdmaSettings = TCP_ONLY) -> None:
        host, port = sock.getsockname()[:2]
        super().__init__(_listen, (sock, factory, options, rdma), f"orion-relay-listener-{port}")
        self.address = f"{host}:{port}"
