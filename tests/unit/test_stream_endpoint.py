"""A session served over a relay connection (host_agent/relay/stream_endpoint.py): the worker's own loop
(session_loop.RecordLoop) and a real handler (the wire diagnostics) answer records that arrive on a real
socket instead of a ring, replies produced piece by piece included; beats keep it alive, silence ends it."""
from __future__ import annotations

import socket
import threading
import zlib
from collections.abc import Iterator

import pytest

from host_agent.diagnostics import DiagnosticsHandler
from host_agent.handler import Session
from host_agent.relay.frames import BEAT, ConnectionLost, FrameStream
from host_agent.relay.stream_endpoint import StreamEndpoint
from host_agent.session_loop import RecordLoop, ServerOptions
from ivshmem.record import DRAIN_REPLY, FILL_REQUEST, Flag, Op, Record, Status, fill_pattern
from tests.relay_peer import RelayPeer

GENERATION = 3


class Served:
    """The GPU host's side in a thread; the test plays the relay on the other end of the socket pair."""

    def __init__(self, dead_s: float = 5.0) -> None:
        self.near, far = socket.socketpair()
        self.relay = FrameStream(self.near, stall_s=5)
        self.endpoint = StreamEndpoint(FrameStream(far, stall_s=5), GENERATION, beat_s=0.1, dead_s=dead_s)
        session = Session(1, "relay", 0, GENERATION)
        self.loop = RecordLoop(self.endpoint, DiagnosticsHandler(session), session, ServerOptions())  # type: ignore[arg-type]
        self.ended: list[BaseException] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        self._far = far

    def _serve(self) -> None:
        try:
            self.loop.run()
        except BaseException as exc:  # noqa: BLE001 - what ended the session is what the test checks
            self.ended.append(exc)

    def reply(self, call_id: int) -> Record:
        """The next record that is not a BEAT; it must answer `call_id`, in the session's generation."""
        record = RelayPeer(self.relay).answer(call_id)
        assert record.generation == GENERATION
        return record

    def close(self) -> None:
        self.endpoint.close()
        self.near.close()
        self._far.close()


@pytest.fixture
def served() -> Iterator[Served]:
    s = Served()
    yield s
    s.close()


def test_diagnostic_records_are_answered_over_the_connection(served: Served) -> None:
    relay = served.relay
    big = bytes(range(256)) * (3 << 12)  # 3 MiB
    relay.send(1, Op.ECHO, b"hello", generation=GENERATION)
    assert bytes(served.reply(1).payload) == b"hello"
    relay.send(2, Op.ECHO, big, generation=GENERATION)
    assert bytes(served.reply(2).payload) == big
    relay.send(3, Op.DRAIN, big, generation=GENERATION)
    assert DRAIN_REPLY.decode(served.reply(3).payload) == (len(big), zlib.crc32(big))
    length = (5 << 20) + 4096  # a Streamed reply across several production steps
    relay.send(4, Op.FILL, FILL_REQUEST.encode(length, 9), generation=GENERATION)
    assert bytes(served.reply(4).payload) == fill_pattern(9, length)
    relay.send(5, Op.NOP, flags=Flag.NO_REPLY, generation=GENERATION)  # posted and fine: no reply at all
    relay.send(6, 0x7777, generation=GENERATION)
    assert served.reply(6).status == Status.UNKNOWN_OPCODE
    relay.send(7, Op.ECHO, b"x", generation=GENERATION + 1)  # another generation: refused, the session goes on
    assert served.reply(7).status == Status.MALFORMED
    relay.send(8, Op.ECHO, b"still here", generation=GENERATION)
    assert bytes(served.reply(8).payload) == b"still here"


def test_the_worker_beats_and_a_closed_connection_ends_the_session(served: Served) -> None:
    beat = served.relay.receive(timeout=5)
    assert beat is not None and beat.opcode == BEAT
    served.near.close()
    served.thread.join(10)
    assert not served.thread.is_alive() and isinstance(served.ended[0], ConnectionLost)


def test_a_silent_peer_ends_the_session_within_the_bound() -> None:
    s = Served(dead_s=0.5)
    try:
        s.thread.join(10)  # the relay side never sends anything, not even a beat
        assert not s.thread.is_alive() and isinstance(s.ended[0], ConnectionLost)
        assert "silent for 0.5 s" in str(s.ended[0])  # the silence bound ended it, not an end of stream
    finally:
        s.close()
