"""What a session worker and the handler of its records share: `Session`, `Reply`, the `Handler` protocol, and
`note()`, by which a handler tells oriond what it must act on when the session ends.

session_loop.py reads each record off a session's transport (RecordEndpoint, StreamTransport: the transports are
declared here) and calls a handler for it; diagnostics.py and session/executor.py are handlers. Both sides import
this module and neither imports the other, so they form no import cycle. Nothing here serves a region or looks
inside a payload.
"""
from __future__ import annotations

from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, NamedTuple, Protocol

from ivshmem.channel import HostReason, Payload, Sink, Streamed
from ivshmem.record import Record, Status
from ivshmem.wait import WaitPolicy

from .errors import HostAgentError

_events: Connection | None = None  # where note() goes (oriond's region process); inherited by forked workers
_session_number = 0  # in a worker process: its session


class Reply(NamedTuple):
    status: int = 0
    payload: bytes | bytearray | Streamed = b""


class ReplyFailed(HostAgentError):
    """A streamed reply's producer failed after the reply's record (and its status) went out: the bytes already
    sent cannot be taken back, nor the rest made right. The worker ends the session with `reason` (REPLY_FAILED: the
    GPU's copy failed; GPU_HOST_LOST: a relay lost the GPU host) rather than let the client read wrong bytes as a
    success; the client's call fails, CUDA_ERROR_DEVICE_UNAVAILABLE."""

    def __init__(self, why: str, reason: HostReason = HostReason.REPLY_FAILED) -> None:
        super().__init__(why)
        self.reason = reason


def refused(why: str) -> Reply:
    """A well-formed request the agent will not carry out, and why (Status.REFUSED)."""
    return Reply(Status.REFUSED, why.encode())


class Session(NamedTuple):
    number: int
    region: str
    channel: int
    generation: int
    transport: str = ""  # a relayed session's: "tcp" or "rdma" (relay_worker.accept_relay); a region's: ""
    relay_member: str = ""  # a relayed session's: the cluster member (node name) that proved itself in the handshake


class Handler(Protocol):
    """What a worker calls for each request of its session."""

    def sink_for(self, opcode: int, length: int) -> Sink | None: ...

    def handle(self, record: Record) -> Reply: ...


HandlerFactory = Callable[[Session], Handler]


class RecordEndpoint(Protocol):
    """A session's transport as its worker's loop (session_loop.RecordLoop) drives it: a region's ring
    (ivshmem.channel.Endpoint) or a relay connection (relay/stream_endpoint.StreamEndpoint), which both are. The loop
    receives each record, answers it through `send` in the session's `generation`, and runs `check` (the liveness
    checks, where the transport has them) when the compiled path's wait asks for them."""

    @property
    def generation(self) -> int: ...

    @property
    def check(self) -> Callable[[], None] | None: ...

    def receive(self, sink: Sink | None = None, wait: bool = True,
                sink_for: Callable[[int, int, int], Sink | None] | None = None) -> Record | None: ...

    def send(self, call_id: int, opcode: int, flags: int = 0, payload: Payload = b"", status: int = 0) -> None: ...


class StreamTransport(RecordEndpoint, Protocol):
    """A session transport that is a relay connection (relay/stream_endpoint.StreamEndpoint), as the compiled hot
    path (session/hot_path.py) serves it: the socket and write lock it may read and write itself, and the report of
    when it last heard the peer (the transport's liveness counts what C read)."""

    @property
    def policy(self) -> WaitPolicy: ...

    def compiled_socket(self) -> tuple[int, Any] | None:
        """(socket fd, write lock: an object whose `address` is its pthread mutex) where compiled code may serve
        this connection; None where it may not (RDMA)."""

    def heard(self, when: float) -> None:
        """The peer was heard from at `when` (time.monotonic()) by compiled code."""


def route_notes(events: Connection | None) -> None:
    """In a supervisor, before it forks workers: where their note()s go (None: nowhere)."""
    global _events
    _events = events


def notes_for(session_number: int) -> None:
    """In a worker: the session its note()s are about."""
    global _session_number
    _session_number = session_number


def note(text: str) -> None:
    """From a worker: tell oriond something it must act on when this session ends, however it ends (the worker
    may be killed, and so may its supervisor). The executor notes the allocation it took up, so that oriond gives
    it back. Sent at once on the region's event pipe (a small write on a pipe is atomic), never held here."""
    if _events is not None:
        _events.send(("note", _session_number, text))
