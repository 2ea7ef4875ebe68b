"""The GPU host's side of one relayed session (docs/remote.md): judge the relay's RELAY_HELLO, answer it, then
serve the session's records with the worker's own loop and handler.

RELAY_HELLO asks the handler exactly what a session on a region is asked: RELAY_HELLO's protocol and
call-table digest go through the handler's HELLO (so an agent of another release or table refuses in the same
one line), and an allocation the relay brings goes through its BIND (confirmed with this oriond's own controller,
granted to this host, before any context; refused with the reason otherwise). Then the session is the handler's
like any other: same ledger, same quotas, same device mapping. It ends when the connection does (the relay closed
it, or fell silent for the bound): the worker process exits, and the driver frees what the session held.

The relay has proved itself a member of the cluster before its connection gets a worker (relay/listener.py); the
session carries the node it proved to be (Session.relay_member), so that its BIND binds the grant to that node. On
a GPU host in a controller's pool (`require_allocation`) a RELAY_HELLO without an allocation is refused: every
vGPU such a host serves is one the controller granted, so none is used outside the pool's count. What the relay
makes the worker hold is what it sent, within per-opcode bounds (`_Bounded`, relay_frames.payload_bound).
"""
from __future__ import annotations

import logging
import socket
from typing import NamedTuple

from ivshmem.channel import Sink, Streamed, _Assembler
from ivshmem.errors import RecordError
from ivshmem.record import BIND_REQUEST, HELLO_REQUEST, Flag, Op, Record, Status

from .. import agent_metrics
from ..handler import Handler, HandlerFactory, Reply, ReplyFailed, Session
from ..session import hot_path
from ..session_loop import RecordLoop, ServerOptions
from . import transport
from .frames import (
    CONTROL_MAX,
    RELAY_ACCEPT,
    RELAY_ACCEPT_REPLY,
    RELAY_HELLO,
    RELAY_HELLO_REQUEST,
    ConnectionLost,
    FrameStream,
    payload_bound,
)
from .rdma_stream import RdmaStream, RdmaUnavailable
from .stream_endpoint import StreamEndpoint
from .transport import TCP_ONLY, RdmaSettings

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0  # a proven connection that sends no RELAY_HELLO is closed after this
RELAYED_SESSIONS = "relayed"  # their `region` in oriond's orion_sessions (agent_metrics.py)


def _ask(handler: Handler, opcode: int, payload: bytes, generation: int) -> tuple[int, bytes]:
    """(status, payload) of the handler's answer to a wire-control record (HELLO, BIND: never a Streamed one)."""
    reply = handler.handle(Record(0, opcode, 0, len(payload), generation, 0, payload))
    return reply.status, b"" if isinstance(reply.payload, Streamed) else bytes(reply.payload)


def accept_relay(frames: FrameStream, factory: HandlerFactory, session: Session, rdma: RdmaSettings = TCP_ONLY,
                 hello_timeout_s: float = HELLO_TIMEOUT_S,
                 require_allocation: bool = False) -> tuple[FrameStream | RdmaStream, Handler] | None:
    """Judge the connection's first record, RELAY_HELLO, and answer it: RELAY_ACCEPT, the transport that carries the
    session's records from now on (RDMA when both ends can, else `frames`) and the session's handler; or a refusal
    with the reason (None). ConnectionLost when nothing came within `hello_timeout_s`.

    The transport is settled before the handler is made (`factory`, given the session with its transport), so the
    session, and the controller's record of it through BIND's confirm, says which one carries it. A relay refused
    by the handler holds its RDMA resources only until the refusal is sent; one whose first record is not a
    well-formed RELAY_HELLO gets none."""
    record = frames.receive(timeout=hello_timeout_s, limit=CONTROL_MAX)
    if record is None:
        raise ConnectionLost(f"no RELAY_HELLO within {hello_timeout_s:g} s")
    hello = _hello(record)
    if isinstance(hello, _Hello) and require_allocation and not hello.allocation:
        hello = (Status.REFUSED, b"this GPU host serves only vGPUs its Orion Controller granted: a relayed session "
                                 b"must bring the allocation the controller gave for this host (ORION_VGPU); "
                                 b"[server-relay] remote_addr without one is not served here")
    if not isinstance(hello, _Hello):
        _refuse(frames, record, session, *hello)
        return None
    link, why = transport.prepare(frames.sock, rdma) if hello.rdma else (None, "the relay offered no RDMA")
    stream: FrameStream | RdmaStream = frames
    if link is not None:
        try:
            stream = transport.connect(link, hello.rdma, frames.sock)
        except RdmaUnavailable as exc:
            link, why = None, str(exc)
    handler = factory(session._replace(transport="rdma" if link else "tcp"))
    status, answer = _judge(hello, handler, session)
    if status != Status.OK:
        if link is not None:
            link.close()
        _refuse(frames, record, session, status, answer)
        return None
    payload = RELAY_ACCEPT_REPLY.encode(session.number, "rdma" if link else "tcp", why,
                                        link.offer() if link else b"", answer)
    try:
        frames.send(record.call_id, RELAY_ACCEPT, payload, generation=session.generation)
    except ConnectionLost:
        if link is not None:
            link.close()
        raise
    if link is not None:
        log.info("RDMA ibverbs using device: %s.", link.port.device)
        log.info("Client supports RDMA mode, then server runs in RDMA mode.")
        log.info("session %d: relayed over rdma (%s)", session.number, transport.describe(link))
    else:
        log.info("Client supports TCP mode, then server also falls back to TCP mode.")
        log.info("session %d: relayed over tcp (%s)", session.number, why)
    return stream, handler


class _Hello(NamedTuple):
    protocol: int
    pid: int
    client_host: str
    calls: str
    allocation: str
    rdma: bytes


def _hello(record: Record) -> _Hello | tuple[int, bytes]:
    """The connection's first record as a RELAY_HELLO, or (the refusing status, the reason)."""
    if record.opcode != RELAY_HELLO:
        return Status.REFUSED, f"a relay connection begins with RELAY_HELLO, not opcode {record.opcode:#x}".encode()
    try:
        return _Hello(*RELAY_HELLO_REQUEST.decode(record.payload))
    except RecordError as exc:
        return Status.MALFORMED, str(exc).encode()


def _judge(hello: _Hello, handler: Handler, session: Session) -> tuple[int, bytes]:
    """RELAY_HELLO judged by the session's handler, as a region's session is: (OK, its BIND reply to the allocation
    the relay brings, empty without one), or (the refusing status, the reason)."""
    status, said = _ask(handler, Op.HELLO, HELLO_REQUEST.encode(hello.protocol, hello.pid, hello.client_host,
                                                              hello.calls), session.generation)
    if status != Status.OK:
        return status, said
    if not hello.allocation:
        return Status.OK, b""
    return _ask(handler, Op.BIND, BIND_REQUEST.encode(hello.allocation), session.generation)


def _refuse(frames: FrameStream, record: Record, session: Session, status: int, reason: bytes) -> None:
    frames.send(record.call_id, RELAY_ACCEPT, reason, status=status, generation=session.generation)
    log.warning("session %d: relay refused: %s", session.number, reason.decode(errors="replace"))


class _Bounded:
    """The session's handler as the worker's loop sees it on a relay connection. A request payload the handler has no
    sink for is read into memory that grows as its bytes arrive (the ring's own assembler), up to its opcode's bound
    (relay_frames.payload_bound); a longer one is read and dropped and the call answered TOO_LARGE, the session going
    on, as a ring does. So the worker holds what the relay sent, within those bounds, never what a header declares.
    (StreamEndpoint asks for a sink only above its SINK_ABOVE, 64 KiB: a shorter payload is read whole.)"""

    def __init__(self, handler: Handler, max_assembled: int) -> None:
        self.handler, self.max_assembled = handler, max_assembled
        self._assembled: _Assembler | None = None
        self._too_large = ""

    def sink_for(self, opcode: int, length: int) -> Sink | None:
        sink = self.handler.sink_for(opcode, length)
        if sink is not None:
            return sink
        bound = payload_bound(opcode, self.max_assembled)
        if length > bound:
            self._too_large = f"a payload of {length} bytes exceeds the {bound}-byte limit of opcode {opcode:#x}"
            return lambda chunk: None
        self._assembled = _Assembler(length)
        return self._assembled.sink

    def handle(self, record: Record) -> Reply:
        if record.flags & Flag.STAGED and not record.payload:  # went to a sink: ours, if one was made
            assembled, too_large = self._assembled, self._too_large
            self._assembled, self._too_large = None, ""
            if too_large:
                return Reply(Status.TOO_LARGE, too_large.encode())
            if assembled is not None:
                record = record._replace(payload=assembled.out)
        return self.handler.handle(record)


def serve_relayed(sock: socket.socket, factory: HandlerFactory, session: Session, options: ServerOptions,
                  rdma: RdmaSettings = TCP_ONLY, require_allocation: bool = False) -> int:
    """Body of a relayed session's worker, on a connection whose relay has proved itself: RELAY_HELLO, then records
    until the connection ends. Exit code 0."""
    try:
        accepted = accept_relay(FrameStream(sock), factory, session, rdma, require_allocation=require_allocation)
        if accepted is None:
            return 0
        frames, handler = accepted
    except (ConnectionLost, RecordError) as exc:
        log.warning("session %d: relay connection dropped before RELAY_HELLO was answered: %s", session.number, exc)
        return 0
    endpoint = StreamEndpoint(frames, session.generation)
    agent_metrics.session_started(RELAYED_SESSIONS, endpoint.transport)
    loop = RecordLoop(endpoint, _Bounded(handler, options.max_assembled), session, options)
    loop.hot = hot_path.attach(endpoint, handler)  # on TCP, the compiled hot records
    try:
        loop.run()
    except ConnectionLost as exc:
        log.info("session %d ended: %s", session.number, exc)
    except ReplyFailed as exc:  # its frame was left short, which ended the connection: the relay ends the session
        log.error("session %d: %s: the session ends", session.number, exc)
    finally:
        endpoint.close()
    return 0
