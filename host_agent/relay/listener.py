"""The GPU host's listener for relay connections (docs/remote.md): accepts on `bind_addr:listen_port`, proves each
peer a member of the cluster (relay/handshake.py), and gives each proven connection a worker process of its own
(relay_worker.serve_relayed), as a region supervisor gives each claimed channel one: tenants never share an
address space, and a crash or a hostile record ends one session.

Who gets in (docs/security.md, "Who may talk to whom: the cluster key"): only a peer that proves it holds the
cluster key, before anything else it sends is read; the handshakes of every connection run here, in one event loop
that never blocks on a peer, and a connection gets a session slot (a worker) only once proven. What a peer can
hold is bounded (relay/admission.py): its connections in the handshake, closed at the handshake's deadline; its
sessions, at most `max_sessions` in all; its session starts per second. Then every record goes through the same
checks as on a region. The listener itself never initialises CUDA (a worker does, after its fork), and dies with
its parent.

oriond binds the socket itself (`listen_socket`), with the key it loaded and its policy (`Admission`), so that a
port already taken or a key it cannot use is one line in its log at start-up and never a process failing in a
loop, and runs the listener in a process of its own (`ListenerProcess`), whose events (an allocation a relayed
session took up, each ended session) reach oriond as a region's do.
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
import selectors
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ivshmem.record import Status

from .. import agent_metrics, server_log
from ..handler import HandlerFactory, Session, notes_for, route_notes
from ..limits import LogLimiter
from ..session_loop import ServerOptions
from ..stop import StopRequest
from ..supervised import SupervisedProcess, die_with_parent
from .admission import Peer, PeerLimits, Peers
from .frames import RELAY_ACCEPT, ConnectionLost, FrameStream
from .handshake import GREETING, HANDSHAKE_S, VERDICT, HandshakeFailed, ServerHandshake
from .transport import TCP_ONLY, RdmaSettings
from .worker import serve_relayed

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

log = logging.getLogger(__name__)

ACCEPT_POLL_S = 0.5  # the loop's longest sleep: how soon a stop request is seen
WAITING_POLL_S = 0.05  # while proven connections wait for their turn to start
MAX_SESSIONS = 64
BACKLOG = 128
ACCEPTS_PER_PASS = 64  # then the loop serves the handshakes under way before it accepts more


@dataclass(frozen=True)
class Admission:
    """Who the listener lets in and how much: the cluster key a peer must prove it holds, whether a session must
    bring a controller allocation (a GPU host in a controller's pool serves only vGPUs the controller granted),
    and what one peer may hold (relay_admission.PeerLimits)."""

    key: bytes = field(repr=False)
    require_allocation: bool = False
    limits: PeerLimits = PeerLimits()


class ListeningSocket(socket.socket):
    """The listener's bound, listening socket with its Admission: what oriond hands the agent, which starts (and
    restarts) the listener's process with it."""

    admission: Admission


def listen_socket(bind_addr: str, port: int, admission: Admission) -> ListeningSocket:
    """A TCP socket listening on `bind_addr:port` (0: any free port) for peers `admission` lets in; OSError when
    the port cannot be had."""
    family = socket.AF_INET6 if ":" in bind_addr else socket.AF_INET
    sock = ListeningSocket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind_addr, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.admission = admission
    return sock


def _admission_of(sock: socket.socket) -> Admission:
    if not isinstance(sock, ListeningSocket):
        raise TypeError("the relay listener needs a ListeningSocket (listen_socket): its cluster key is what "
                        "admits a peer")
    return sock.admission


class _Connection:
    """A connection that holds no session slot: in the handshake (`handshake`), or proven (`member`) and waiting
    for its turn to start; `deadline` ends either state."""

    __slots__ = ("sock", "fd", "peer", "label", "handshake", "member", "deadline")

    def __init__(self, sock: socket.socket, peer: Peer, label: str, deadline: float) -> None:
        self.sock, self.fd, self.peer, self.label, self.deadline = sock, sock.fileno(), peer, label, deadline
        self.handshake = ServerHandshake()
        self.member = ""


class RelayListener:
    def __init__(self, sock: socket.socket, factory: HandlerFactory, options: ServerOptions | None = None,
                 stop: StopRequest | None = None, max_sessions: int = MAX_SESSIONS,
                 events: Connection | None = None, rdma: RdmaSettings = TCP_ONLY) -> None:
        """`sock` is a ListeningSocket (listen_socket); `events`, when given, gets ("ended", session, "") for each
        ended session, and its workers' note()s, as a region supervisor's pipe does; `rdma`: whether sessions may
        move to RDMA (relay/transport.py)."""
        self.admission = _admission_of(sock)
        self.factory, self.options, self.rdma = factory, options or ServerOptions(), rdma
        self._stop = stop or StopRequest()
        self.max_sessions = max_sessions
        self.limits = self.admission.limits
        self.peers = Peers(self.limits)
        self.workers: dict[int, tuple[int, str, Peer]] = {}  # pid -> (session, peer's address:port, peer)
        self._pending: dict[int, _Connection] = {}  # fd -> a connection in the handshake
        self._waiting: list[_Connection] = []  # proven, waiting for their turn to start, in order
        self._next_session = 0
        self._events = events
        self._accept_failed = LogLimiter(log, first=3)
        route_notes(events)
        self.sock = sock
        self.sock.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(sock, selectors.EVENT_READ, None)
        self.address = self.sock.getsockname()

    # --- the loop ----------------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        try:
            while not self._stop.is_set():
                self._reap()
                for key, _ in self._selector.select(self._timeout()):
                    pending: _Connection | None = key.data
                    if pending is None:
                        self._accept()
                    elif self._pending.get(pending.fd) is pending:  # not one closed earlier in this pass
                        self._advance(pending)
                now = time.monotonic()
                for pending in [p for p in self._pending.values() if now >= p.deadline]:
                    self._drop(pending, f"no handshake within {HANDSHAKE_S:g} s")
                self._start_waiting()
                self.peers.prune()
        finally:
            self._shutdown()

    def _timeout(self) -> float:
        if self._waiting:
            return WAITING_POLL_S
        first = min((p.deadline for p in self._pending.values()), default=time.monotonic() + ACCEPT_POLL_S)
        return max(0.0, min(ACCEPT_POLL_S, first - time.monotonic()))

    # --- the handshake -----------------------------------------------------------------------------------
    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_PASS):
            try:
                conn, peer = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # reset before it was accepted, or no descriptor left: the next one
                self._accept_failed.log(logging.WARNING, "failed accepts", "relay listener: accept failed: %s", exc)
                return
            self._greet(conn, peer[0], f"{peer[0]}:{peer[1]}")

    def _greet(self, conn: socket.socket, address: str, label: str) -> None:
        """A new connection: its greeting, unless its address holds all the handshakes it may already."""
        peer = self.peers.get(address)
        why = ""
        if peer is not None and peer.connections() >= self.limits.handshakes:
            why = f"{self.limits.handshakes} connections of it are in the handshake or waiting already"
        elif peer is not None and len(self._pending) + len(self._waiting) >= self.limits.all_handshakes:
            why = f"{self.limits.all_handshakes} connections are in the handshake or waiting already"
        if peer is None or why:
            conn.close()
            if peer is not None:
                peer.came_to_nothing(f"at once: {why}")
            return
        pending = _Connection(conn, peer, label, time.monotonic() + HANDSHAKE_S)
        try:
            conn.setblocking(False)
            sent = conn.send(pending.handshake.greeting())  # into an empty send buffer: whole
        except OSError:
            sent = 0
        if sent != GREETING.size:
            conn.close()
            return
        self._pending[pending.fd] = pending
        peer.pending += 1
        self._selector.register(conn, selectors.EVENT_READ, pending)

    def _advance(self, pending: _Connection) -> None:
        """Read what arrived of a claim; once whole, judge it and answer."""
        try:
            if not pending.handshake.feed(pending.sock):
                return
        except HandshakeFailed as exc:
            self._drop(pending, str(exc))
            return
        self._forget(pending)
        member, verdict = pending.handshake.judge(self.admission.key)
        try:
            sent = pending.sock.send(verdict)
        except OSError:
            sent = 0
        if member is None or sent != VERDICT.size:
            pending.sock.close()
            pending.peer.came_to_nothing("its proof of the cluster key is wrong: it is not a member of this "
                                         "cluster, or its key differs" if member is None else
                                         "it went away after the handshake")
            return
        pending.member = member
        pending.deadline = time.monotonic() + self.limits.start_wait_s
        if pending.peer.waiting or not self._start_now(pending):  # in turn behind its address's waiting ones
            self._waiting.append(pending)
            pending.peer.waiting += 1

    def _forget(self, pending: _Connection) -> None:
        self._selector.unregister(pending.fd)
        del self._pending[pending.fd]
        pending.peer.pending -= 1

    def _drop(self, pending: _Connection, why: str) -> None:
        self._forget(pending)
        pending.sock.close()
        pending.peer.came_to_nothing(why)

    # --- starting sessions -------------------------------------------------------------------------------
    def _refusal(self, peer: Peer) -> str:
        """Why a proven connection of `peer` can have no session now ("": it may, within its start rate)."""
        if len(self.workers) >= self.max_sessions:
            return f"this host serves {self.max_sessions} relayed sessions already; try another host"
        if peer.sessions >= self.limits.sessions:
            return (f"{peer.address} has {peer.sessions} relayed sessions here already, the most one relaying host "
                    "may have")
        return ""

    def _start_now(self, proven: _Connection) -> bool:
        """Start `proven`'s session or refuse it (True: done with it); False when it must wait for its turn."""
        why = self._refusal(proven.peer)
        if why:
            self._refuse(proven, why)
        elif proven.peer.starts.take():
            self._start(proven)
        elif time.monotonic() >= proven.deadline:
            self._refuse(proven, f"{proven.peer.address} starts relayed sessions faster than "
                                 f"{self.limits.start_rate:g} a second; try again")
        else:
            return False
        return True

    def _start_waiting(self) -> None:
        still = []
        for proven in self._waiting:
            if self._start_now(proven):
                proven.peer.waiting -= 1
            else:
                still.append(proven)
        self._waiting = still

    def _refuse(self, proven: _Connection, why: str) -> None:
        """Tell a proven relay why it gets no session (its RELAY_HELLO answered: call 0, REFUSED), then close."""
        proven.peer.came_to_nothing(f"refused: {why}")
        with proven.sock, contextlib.suppress(OSError, ConnectionLost):
            proven.sock.settimeout(1.0)
            FrameStream(proven.sock).send(0, RELAY_ACCEPT, why.encode(), status=Status.REFUSED)

    def _start(self, proven: _Connection) -> None:
        self._next_session += 1
        session = Session(self._next_session, f"relay {proven.label}", 0, random.randrange(1, 1 << 31),
                          relay_member=proven.member)
        try:
            pid = os.fork()
        except OSError as exc:
            self._refuse(proven, f"this host cannot start a session worker now ({exc.strerror or exc})")
            return
        if pid == 0:  # the worker: this connection only
            code = 1
            try:
                die_with_parent(signal.SIGKILL)
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                self._close_others(proven.sock)
                notes_for(session.number)
                server_log.session_log(session.number, "relay")  # beside server.log, as a region's session
                conn = proven.sock
                conn.settimeout(None)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # records are small; never delayed
                log.info("Creating session %d (relayed from %s, member %s)", session.number, proven.label,
                         proven.member)
                code = serve_relayed(conn, self.factory, session, self.options, self.rdma,
                                     self.admission.require_allocation)
            finally:
                os._exit(code)
        proven.sock.close()
        self.workers[pid] = (session.number, proven.label, proven.peer)
        proven.peer.sessions += 1

    def _close_others(self, mine: socket.socket) -> None:
        """In a worker: let go of the listener's socket and every other connection (their peers must see them
        closed when the listener closes them)."""
        self.sock.close()
        self._selector.close()
        for other in [*self._pending.values(), *self._waiting]:
            if other.sock is not mine:
                other.sock.close()

    def _reap(self, wait: bool = False) -> None:
        for pid in list(self.workers):
            try:
                done, status = os.waitpid(pid, 0 if wait else os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done:
                number, label, peer = self.workers.pop(pid)
                peer.sessions -= 1
                agent_metrics.process_ended(pid)  # its session no longer counts in orion_sessions
                log.info("relayed session %d from %s ended (exit %d)", number, label,
                         os.waitstatus_to_exitcode(status))
                if self._events is not None:
                    with contextlib.suppress(OSError):  # oriond is gone; nobody is left to act on it
                        self._events.send(("ended", number, ""))

    def _shutdown(self) -> None:
        self.sock.close()
        for pending in list(self._pending.values()):
            self._forget(pending)
            pending.sock.close()
        for proven in self._waiting:
            proven.sock.close()
        self._waiting = []
        self._selector.close()
        for pid in list(self.workers):
            _end(pid)
        self._reap(wait=True)


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
        _admission_of(sock)  # here, in oriond, rather than in a process that would be started again and again
        host, port = sock.getsockname()[:2]
        super().__init__(_listen, (sock, factory, options, rdma), f"orion-relay-listener-{port}")
        self.address = f"{host}:{port}"
