"""Relay frames (host_agent/relay/frames.py): records over a real connected socket pair, well-formed and hostile;
every wait bounded."""
from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from host_agent.relay.frames import (
    BEAT,
    RELAY_ACCEPT_REPLY,
    RELAY_HELLO,
    RELAY_HELLO_REQUEST,
    ConnectionLost,
    FrameStream,
)
from ivshmem.errors import RecordError
from ivshmem.record import HEADER, Flag, Status


@pytest.fixture
def pair() -> Iterator[tuple[FrameStream, FrameStream, socket.socket]]:
    a, b = socket.socketpair()
    yield FrameStream(a, max_payload=1 << 22, stall_s=0.5), FrameStream(b, max_payload=1 << 22, stall_s=0.5), a
    a.close()
    b.close()


def test_records_cross_whole_with_their_header_fields(pair: tuple[FrameStream, FrameStream, socket.socket]) -> None:
    near, far, _ = pair
    big = bytes(range(256)) * 4096  # 1 MiB: more than a socket buffer, so written and read in pieces
    sent = [(1, 0x155, b"\x01\x02", 0, 0), (2, 0x150, b"", Flag.NO_REPLY, 0), (3, 0x160, big, 0, 0),
            (4, 0x151, b"why", 0, int(Status.REFUSED))]
    writer = threading.Thread(target=lambda: [near.send(c, o, p, flags=f, status=s, generation=7)
                                              for c, o, p, f, s in sent])
    writer.start()
    got = [far.receive(timeout=5) for _ in sent]
    writer.join(5)
    assert [(r.call_id, r.opcode, bytes(r.payload), r.flags, r.status, r.generation) for r in got if r] == \
        [(c, o, p, f, s, 7) for c, o, p, f, s in sent]


def test_nothing_sent_is_none_within_the_timeout(pair: tuple[FrameStream, FrameStream, socket.socket]) -> None:
    _, far, _ = pair
    assert far.receive(timeout=0.1) is None


@pytest.mark.parametrize(("header", "status"), [
    (HEADER.pack(1, 0x150, 1 << 7, 0, 0, 0, 0), Status.MALFORMED),  # an unknown flag
    (HEADER.pack(1, 0x10000, 0, 0, 0, 0, 0), Status.UNKNOWN_OPCODE),
    (HEADER.pack(1, 0x150, 0, (1 << 22) + 1, 0, 0, 0), Status.TOO_LARGE),  # refused before any payload is read
])
def test_a_header_the_ring_would_refuse_is_refused_here(pair: tuple[FrameStream, FrameStream, socket.socket],
                                                        header: bytes, status: Status) -> None:
    _, far, raw = pair
    raw.sendall(header)
    with pytest.raises(RecordError) as caught:
        far.receive(timeout=5)
    assert caught.value.status == status


def test_a_staged_flag_is_refused_both_ways(pair: tuple[FrameStream, FrameStream, socket.socket]) -> None:
    near, far, raw = pair
    with pytest.raises(RecordError):
        near.send(1, 0x150, b"x", flags=Flag.STAGED)
    raw.sendall(HEADER.pack(1, 0x150, Flag.STAGED, 1, 0, 0, 0) + b"x")
    with pytest.raises(RecordError):
        far.receive(timeout=5)


@pytest.mark.parametrize("cut", [0, 10, HEADER.size + 3])
def test_an_end_of_stream_is_connection_lost(pair: tuple[FrameStream, FrameStream, socket.socket], cut: int) -> None:
    _, far, raw = pair
    raw.sendall((HEADER.pack(1, 0x150, 0, 8, 0, 0, 0) + b"12345678")[:cut])
    raw.shutdown(socket.SHUT_WR)
    with pytest.raises(ConnectionLost, match="mid-frame" if cut else "closed the connection$"):
        far.receive(timeout=5)


def test_a_peer_that_stops_mid_frame_is_given_up_after_the_stall_bound(
        pair: tuple[FrameStream, FrameStream, socket.socket]) -> None:
    _, far, raw = pair
    raw.sendall(HEADER.pack(1, 0x150, 0, 100, 0, 0, 0) + b"only ten b")
    with pytest.raises(ConnectionLost, match=r"stopped mid-frame \(10 of 100 bytes in 0.5 s\)"):  # the stall
        far.receive(timeout=5)  # bound ended it, not the receive timeout


def test_the_relay_handshake_schemas_round_trip(pair: tuple[FrameStream, FrameStream, socket.socket]) -> None:
    near, far, _ = pair
    hello = RELAY_HELLO_REQUEST.encode(2, 4242, "guest-1", "digest", "alloc-9", b"")
    near.send(1, RELAY_HELLO, hello)
    near.send(2, BEAT)
    record = far.receive(timeout=5)
    assert record is not None and record.opcode == RELAY_HELLO
    assert RELAY_HELLO_REQUEST.decode(record.payload) == (2, 4242, "guest-1", "digest", "alloc-9", b"")
    beat = far.receive(timeout=5)
    assert beat is not None and (beat.opcode, beat.length) == (BEAT, 0)
    accept = RELAY_ACCEPT_REPLY.encode(17, "tcp", "no RDMA device on this host", b"", b"\x01")
    assert RELAY_ACCEPT_REPLY.decode(accept) == (17, "tcp", "no RDMA device on this host", b"", b"\x01")
