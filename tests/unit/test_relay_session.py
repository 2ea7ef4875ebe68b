"""A session relayed end to end in one process: a client on a real region's channel, the relay
(host_agent/relay/relayed_session.py) on the host side of that channel, a socket pair as the network, and on the far
end the worker's own loop with a real handler (the wire diagnostics) behind a StreamEndpoint, as the GPU host
runs it. Payloads larger than a slot cross the staging arenas on the relay's side and one frame on the wire.
When the far end goes, every waiting and later call answers CUDA_ERROR_DEVICE_UNAVAILABLE within the bound."""
from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest

from host_agent.diagnostics import DiagnosticsHandler
from host_agent.handler import Session
from host_agent.relay import compiled_pump
from host_agent.relay.frames import FrameStream
from host_agent.relay.pool import PoolRelay
from host_agent.relay.relayed_session import DEVICE_UNAVAILABLE, Relay
from host_agent.relay.stream_endpoint import StreamEndpoint
from host_agent.session_loop import RecordLoop, ServerOptions
from ivshmem.channel import Endpoint
from ivshmem.driver_api import CALLS, PINNED_COPY
from ivshmem.layout import Geometry
from ivshmem.record import (
    DRAIN_REPLY,
    FILL_REQUEST,
    HEADER,
    SEQ_AT,
    Flag,
    Op,
    Record,
    Status,
    fill_pattern,
    publish_mark,
)
from ivshmem.region import Region
from tests.forwarding_rig import bounded  # noqa: F401 (fixture)

RING_GENERATION, REMOTE_GENERATION = 5, 9


def ring_pair(name: str) -> tuple[str, Region, Endpoint, Endpoint]:
    """A fresh one-channel 16 MiB region in /dev/shm (remove it afterwards) and its client and host endpoints, reset
    to RING_GENERATION."""
    path = f"/dev/shm/orion-{name}-{uuid.uuid4().hex[:10]}"
    with open(path, "wb") as f:
        f.truncate(16 << 20)
    region = Region.open(path)
    region.format(Geometry.build(region.size, 1, name=name))
    client, host = Endpoint(region, 0, "client"), Endpoint(region, 0, "host")
    for side in (client, host):
        side.reset_owned()
        side.resync()
        side.generation = RING_GENERATION
    return path, region, client, host


class Relayed:
    def __init__(self, dead_s: float = 5.0, mode: str = "pump", beat_s: float = 0.1) -> None:
        """`mode`: "pump" (the relay's compiled pump, where it builds) or "threads" (its Python threads, the path
        an RDMA connection takes); `beat_s`: both ends' heartbeat."""
        self.mode = mode
        self.path, self.region, self.client, host = ring_pair("relay")
        here, there = socket.socketpair()
        self.sockets = (here, there)
        self.gpu_side = StreamEndpoint(FrameStream(there), REMOTE_GENERATION, beat_s=beat_s,
                                       dead_s=dead_s)
        session = Session(1, "relayed", 0, REMOTE_GENERATION)
        loop = RecordLoop(self.gpu_side, DiagnosticsHandler(session), session, ServerOptions())  # type: ignore[arg-type]
        self.gpu_thread = threading.Thread(target=self._quietly, args=(loop.run,), daemon=True)
        self.gpu_thread.start()
        self.relay_side = StreamEndpoint(FrameStream(here), REMOTE_GENERATION, beat_s=beat_s,
                                         dead_s=dead_s)
        self.relay = Relay(host, self.relay_side, 1)
        if mode != "pump":
            self.relay._start_pump = lambda: None  # type: ignore[method-assign]
        threading.Thread(target=self._quietly, args=(self.relay.run,), daemon=True).start()
        self.next_id = 0

    @staticmethod
    def _quietly(run: Callable[[], None]) -> None:
        with contextlib.suppress(Exception):  # a thread of the test rig ends with its session
            run()

    def call(self, opcode: int, payload: bytes = b"", flags: int = 0) -> int:
        self.next_id += 1
        self.client.send(self.next_id, opcode, flags, payload)
        return self.next_id

    def reply(self, call_id: int) -> Record:
        record = self.client.receive()
        assert record is not None and record.call_id == call_id, record
        return record

    def close(self) -> None:
        self.relay_side.close()
        self.gpu_side.close()
        for s in self.sockets:
            s.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + 10
        while self.relay.lost is None and time.monotonic() < deadline:  # the relay lets go of the ring (its pump)
            time.sleep(0.01)
        for s in self.sockets:
            s.close()
        self.region.close()
        os.unlink(self.path)


@pytest.fixture(params=["pump", "threads"])
def relayed(request: pytest.FixtureRequest) -> Iterator[Relayed]:
    r = Relayed(mode=request.param)
    yield r
    r.close()


def test_payloads_beyond_what_one_side_assembles_cross_in_pieces_both_ways(relayed: Relayed) -> None:
    """A request and a reply larger than the worker's 256 MiB assembling bound (region_server.max_assembled): the
    relay streams them between the ring's staging arena and the socket, and the far end's sink and producer take
    and give them in pieces, so nobody holds them whole and nothing refuses them."""
    length = (300 << 20) + 4096 * 3
    big = fill_pattern(7, length)
    assert DRAIN_REPLY.decode(relayed.reply(relayed.call(Op.DRAIN, big)).payload) == (length, zlib.crc32(big))
    reply = relayed.reply(relayed.call(Op.FILL, FILL_REQUEST.encode(length, 7)))
    assert reply.status == Status.OK and len(reply.payload) == length and zlib.crc32(reply.payload) == zlib.crc32(big)


def test_records_are_answered_through_the_relay_as_by_a_local_worker(relayed: Relayed) -> None:
    big = bytes(range(256)) * (3 << 12)  # 3 MiB: staged on the ring, one frame on the wire
    assert bytes(relayed.reply(relayed.call(Op.ECHO, b"hello")).payload) == b"hello"
    assert bytes(relayed.reply(relayed.call(Op.ECHO, big)).payload) == big
    assert DRAIN_REPLY.decode(relayed.reply(relayed.call(Op.DRAIN, big)).payload) == (len(big), zlib.crc32(big))
    length = (5 << 20) + 4096
    assert bytes(relayed.reply(relayed.call(Op.FILL, FILL_REQUEST.encode(length, 3))).payload) == \
        fill_pattern(3, length)
    for _ in range(100):  # posted and fine: no answer, and nothing waits for them
        relayed.call(Op.NOP, flags=Flag.NO_REPLY)
    unknown = relayed.reply(relayed.call(0x7777))
    assert unknown.status == Status.UNKNOWN_OPCODE and b"not served" in bytes(unknown.payload)
    posted_unknown = relayed.call(0x7777, flags=Flag.NO_REPLY)  # fails: an asynchronous error comes back
    failed = relayed.reply(posted_unknown)
    assert failed.flags & Flag.ASYNC_ERROR and failed.status == Status.UNKNOWN_OPCODE
    if relayed.mode == "pump" and compiled_pump.PROGRAM.load() is not None:  # the pump carried the small records
        assert relayed.relay._pump is not None and relayed.relay._pump.pumped >= 100


@pytest.mark.skipif(compiled_pump.PROGRAM.load() is None, reason="the compiled pump does not build here")
def test_after_python_served_a_record_the_pump_waits_afresh() -> None:
    """A record Python serves (a staged request, and its answer too long for the pump) hands the pump's loop to
    Python and back. The pump's next wait must begin then, spinning first: it once went on with the wait it was in
    before the hand-over, already past its spin, so it slept up to 1 ms before it saw the guest's next record (a
    relayed page-locked 4-byte DtoH, whose answer is Python's, took 1.2 ms on the GPU machine instead of 66 us)."""
    r = Relayed(beat_s=30.0)  # no beats: a frame taken by the pump would begin a new wait on its own
    try:
        assert bytes(r.reply(r.call(Op.ECHO, b"warm-up")).payload) == b"warm-up"
        time.sleep(0.05)  # the pump waits for the ring
        sent = time.monotonic()
        big = bytes(range(256)) * (3 << 12)  # staged on the ring: Python forwards it and takes its answer
        assert bytes(r.reply(r.call(Op.ECHO, big)).payload) == big
        assert r.relay._pump is not None
        since = r.relay._pump.waiting_since
        assert since is None or since >= sent, (since, sent)  # None: between a hand-over and its next wait
    finally:
        r.close()


@pytest.mark.skipif(compiled_pump.PROGRAM.load() is None, reason="the compiled pump does not build here")
def test_the_pumps_answers_carry_the_marks_a_compiled_guest_watches() -> None:
    """Each answer the pump writes into the completion ring carries its slot's publish mark (record.publish_mark),
    which the native guest driver waits on rather than the tail."""
    r = Relayed()
    try:
        ids = [r.call(Op.NOP) for _ in range(8)]
        assert [r.reply(call_id).status for call_id in ids] == [Status.OK] * 8
        assert r.relay._pump is not None and r.relay._pump.pumped >= 16  # each NOP there and back by the pump
        ring = r.client.in_ring
        assert [r.region.u32[(ring.data + i * ring.cell + SEQ_AT) >> 2] for i in range(8)] == \
            [publish_mark(i + 1) for i in range(8)]
    finally:
        r.close()


def test_when_the_gpu_host_goes_every_call_answers_device_unavailable_within_the_bound(bounded: None) -> None:  # noqa: F811
    """(`bounded`: a TimeoutError, never a hang, if the relay failed to answer.)"""
    r = Relayed(dead_s=0.5)
    try:
        assert bytes(r.reply(r.call(Op.ECHO, b"up")).payload) == b"up"
        r.gpu_side.close()  # the GPU host's beats stop, and then the host itself
        r.sockets[1].shutdown(socket.SHUT_RDWR)
        answer = r.reply(r.call(Op.ECHO, b"down"))
        assert answer.status == DEVICE_UNAVAILABLE
        assert r.reply(r.call(Op.ECHO, b"later")).status == DEVICE_UNAVAILABLE  # at once from now on
        posted = r.reply(r.call(Op.NOP, flags=Flag.NO_REPLY))
        assert posted.flags & Flag.ASYNC_ERROR and posted.status == DEVICE_UNAVAILABLE
        assert r.relay.lost is not None
    finally:
        r.close()


def test_an_answer_python_reads_for_a_page_locked_read_the_pump_sent_still_lands_in_the_pool() -> None:
    """The pump sends a synchronous page-locked DtoH itself and lands its answer's bytes in the pool (relay_pump.c,
    LANDS_IN_POOL); when Python reads that answer instead (the completion ring was full, or the relay was asking the
    GPU host something of its own), the landing the pump kept goes with the flags it hands back (Relay._taken), so
    Python's delivery lands the bytes too, never as a reply payload the guest would not read."""
    relay = Relay.__new__(Relay)  # only what _taken reads
    relay.pool = PoolRelay(None, 1)
    taken = {7: (0, 0x7F00_0000_1000, 4), 8: (1, 0, 0)}
    relay._pump = SimpleNamespace(take=taken.pop)
    assert relay._taken(7) == 0 and relay.pool.landing == {7: (0x7F00_0000_1000, 4)}
    assert relay._taken(8) == 1 and 8 not in relay.pool.landing  # a plain call: no landing
    relay._pump = SimpleNamespace(take=lambda call_id: None)
    assert relay._taken(9) is None


def test_the_pumps_page_locked_copies_read_the_call_tables_layouts() -> None:
    """relay_pump.c reads a page-locked cuMemcpy{HtoD,DtoH}[Async] as its plain request's fixed part then the pool
    pointer, which it drops: the sizes it and compiled_pump.py spell are the call table's, both directions alike."""
    for name, size in (("cuMemcpyHtoD", compiled_pump.PINNED_SIZE), ("cuMemcpyDtoH", compiled_pump.PINNED_SIZE),
                       ("cuMemcpyHtoDAsync", compiled_pump.PINNED_ASYNC_SIZE),
                       ("cuMemcpyDtoHAsync", compiled_pump.PINNED_ASYNC_SIZE)):
        call = CALLS[name]
        assert call.pinned is not None and call.pinned.fixed.size == size
        assert call.pinned.fixed.format == call.request.fixed.format + "Q"  # the pointer, after the plain fixed part
    source = compiled_pump.PROGRAM.source.read_text()
    assert f"#define PINNED_SIZE {compiled_pump.PINNED_SIZE}\n" in source
    assert f"#define PINNED_ASYNC_SIZE {compiled_pump.PINNED_ASYNC_SIZE}\n" in source
    codes = f"LANDS_IN_POOL = {compiled_pump.LANDS_IN_POOL}, SENT_FROM_POOL = {compiled_pump.SENT_FROM_POOL}"
    assert f"enum {{ {codes} }};" in source


class DirectPump:
    """The compiled pump on a fresh ring and one end of a socket pair, driven by the test itself: `client` is the
    guest's side of the ring, `there` the GPU host's end of the connection."""

    def __init__(self) -> None:
        self.path, self.region, self.client, self.host = ring_pair("pump")
        self.here, self.there = socket.socketpair()
        self.pump = compiled_pump.start(self.host, FrameStream(self.here), REMOTE_GENERATION)

    def forward(self, codes: dict[int, int]) -> None:
        """The pump's forwarding table: `codes` (opcode -> code), every other opcode Python's."""
        table = bytearray(0x10000)
        for opcode, code in codes.items():
            table[opcode] = code
        self.pump.set_forward(bytes(table))

    def left_to_python(self, call_id: int, opcode: int, payload: bytes, flags: int = 0) -> None:
        """Send a record the pump must hand back: it stays at the ring's head, untaken (then dropped here)."""
        self.client.send(call_id, opcode, flags, payload)
        assert self.pump.pump() == compiled_pump.PUMP_RING
        self.host.in_ring.resync()
        head = self.host.in_ring.readable()
        assert head is not None and struct.unpack_from("<Q", self.region.buf, head)[0] == call_id
        self.host.in_ring.release()

    def close(self) -> None:
        self.here.close()
        self.there.close()
        self.region.close()
        os.unlink(self.path)


@pytest.fixture
def direct() -> Iterator[DirectPump]:
    if compiled_pump.PROGRAM.load() is None:
        pytest.skip("the compiled pump does not build here")
    pump = DirectPump()
    yield pump
    pump.close()


def test_the_pump_lands_a_page_locked_read_from_what_it_checked(direct: DirectPump) -> None:
    """The pump's page-locked DtoH (LANDS_IN_POOL), driven directly: the record is checked and sent from the pump's
    copy of its slot, so a guest that rewrites the slot meanwhile (here from inside the pool's answer, which the pump
    asks between its checks and its send) changes nothing that was sent; the answer's bytes land where the pool said,
    in the pool's own mapping (the relay maps it at the guest's address, apart from the region), the guest hears its
    status alone; a landing place outside that mapping, the region's other pages included, is refused (the record
    left to Python)."""
    pump, client, region = direct.pump, direct.client, direct.region
    pinned = CALLS["cuMemcpyDtoH"].opcode | PINNED_COPY
    direct.forward({pinned: compiled_pump.LANDS_IN_POOL})
    pool = ctypes.create_string_buffer(2 * 4096)  # the pool's mapping: not the region's
    mapped_at = ctypes.addressof(pool)
    landing = mapped_at + 4096
    slot = client.out_ring.writable()  # where the record goes: its payload follows its 32-byte header
    assert slot is not None

    def host_address(pointer: int, size: int) -> int | None:
        region.buf[slot + 32:slot + 48] = struct.pack("<QQ", 0xBAD0, 999)  # the guest rewrites device and size
        return {0x5000: landing, 0x6000: 1 << 62, 0x7000: region.address(0), 0x8000: landing + 4093}.get(pointer)
    pump.set_landing(host_address, PINNED_COPY, mapped_at, ctypes.sizeof(pool))
    client.send(41, pinned, 0, struct.pack("<QQQ", 0xD000, 4, 0x5000))
    codes: list[int] = []
    done = threading.Event()

    def serve() -> None:  # as Relay._run_pump: a liveness check goes back to the pump
        while not done.is_set():
            code = pump.pump()
            if code != compiled_pump.PUMP_CHECK:
                codes.append(code)
                return
    worker = threading.Thread(target=serve, daemon=True)
    worker.start()
    frame = direct.there.recv(48, socket.MSG_WAITALL)
    call_id, opcode, flags, length, _gen, _status, _seq = HEADER.unpack(frame[:32])
    assert (call_id, opcode, flags, length) == (41, CALLS["cuMemcpyDtoH"].opcode, 0, 16)
    assert struct.unpack("<QQ", frame[32:48]) == (0xD000, 4)  # what was checked, not what the slot says now
    direct.there.sendall(HEADER.pack(41, 0, 0, 4, REMOTE_GENERATION, 0, 0) + b"\x11\x22\x33\x44")
    reply = client.receive()
    assert reply is not None and (reply.call_id, reply.status, len(reply.payload)) == (41, 0, 0)
    assert pool.raw == bytes(4096) + b"\x11\x22\x33\x44" + bytes(4092)
    done.set()
    worker.join(5)
    assert not worker.is_alive() and codes == []  # nothing of it was Python's
    for call_id, pointer in ((42, 0x6000), (43, 0x7000), (44, 0x8000)):  # outside, the region, 1 B past the end
        direct.left_to_python(call_id, pinned, struct.pack("<QQQ", 0xD000, 4, pointer))


def test_the_pump_lands_a_posted_page_locked_read_and_leaves_its_failure_to_python(direct: DirectPump) -> None:
    """A posted page-locked cuMemcpyDtoHAsync (LANDS_IN_POOL) goes out as the plain one, always answered: its bytes
    land in the pool and the guest hears nothing of its success, as it posted it; an answer that says the copy
    failed is left in the socket for Python, which reports it as the call's asynchronous error (Relay._deliver),
    and the call's landing goes with it (take); the posted synchronous DtoH is Python's."""
    pump, client, there = direct.pump, direct.client, direct.there
    posted, sync = (CALLS[name].opcode | PINNED_COPY for name in ("cuMemcpyDtoHAsync", "cuMemcpyDtoH"))
    direct.forward({posted: compiled_pump.LANDS_IN_POOL, sync: compiled_pump.LANDS_IN_POOL})
    pool = ctypes.create_string_buffer(4096)
    mapped_at = ctypes.addressof(pool)
    pump.set_landing(lambda pointer, size: {0x5000: mapped_at + 8}.get(pointer), PINNED_COPY, mapped_at, 4096)
    plain = CALLS["cuMemcpyDtoHAsync"].opcode
    for call_id, status in ((51, 0), (52, 700)):
        client.send(call_id, posted, Flag.NO_REPLY, struct.pack("<QQQQ", 0xD000, 4, 0x77, 0x5000))
        assert pump.pump() == compiled_pump.PUMP_CHECK
        frame = there.recv(32 + 24, socket.MSG_WAITALL)
        assert HEADER.unpack(frame[:32])[:4] == (call_id, plain, 0, 24)  # answered, whatever the guest posted
        assert struct.unpack("<QQQ", frame[32:]) == (0xD000, 4, 0x77)
        assert pump.landing  # on its way: a copy from the pool waits for it (Relay._landing)
        there.sendall(HEADER.pack(call_id, 0, 0, 4 if status == 0 else 0, REMOTE_GENERATION, status, 0)
                      + (b"\x11\x22\x33\x44" if status == 0 else b""))
        code = pump.pump()
        if status == 0:
            assert code == compiled_pump.PUMP_CHECK and pool.raw[8:12] == b"\x11\x22\x33\x44" and not pump.landing
            assert client.in_ring.readable() is None  # nothing said to the guest
        else:
            assert code == compiled_pump.PUMP_SOCKET  # Python's: the answer left in the socket, the landing handed over
            assert pump.take(call_id) == (Flag.NO_REPLY, mapped_at + 8, 4)
    direct.left_to_python(53, sync, struct.pack("<QQQ", 0xD000, 4, 0x5000), Flag.NO_REPLY)


def test_the_pump_sends_a_small_page_locked_write_with_the_pools_bytes_unless_a_read_is_landing(
        direct: DirectPump) -> None:
    """The pump's page-locked HtoD (SENT_FROM_POOL), driven directly: a synchronous and a posted one go out as the
    plain cuMemcpyHtoD(Async), their fixed part as checked (the guest rewrites its slot meanwhile) and then the bytes
    the pool holds at the pointer, in its own mapping; the synchronous one is answered by the pump. Left to Python
    (the record untaken at the ring's head): while a copy into the pool is in flight (the copy must read what it
    lands: Relay._pool_written), a pointer outside the pool's mapping, a copy larger than a completion slot."""
    pump, client, region, there = direct.pump, direct.client, direct.region, direct.there
    sync, posted = (CALLS[name].opcode | PINNED_COPY for name in ("cuMemcpyHtoD", "cuMemcpyHtoDAsync"))
    direct.forward({sync: compiled_pump.SENT_FROM_POOL, posted: compiled_pump.SENT_FROM_POOL})
    pool = ctypes.create_string_buffer(bytes(range(256)) * 32)  # the pool's mapping (8 KiB): not the region's
    mapped_at = ctypes.addressof(pool)
    slot = client.out_ring.writable()
    assert slot is not None

    def host_address(pointer: int, size: int) -> int | None:
        region.buf[slot + 32:slot + 48] = struct.pack("<QQ", 0xBAD0, 999)  # the guest rewrites device and size
        return {0x5000: mapped_at + 16, 0x7000: region.address(0), 0x9000: mapped_at}.get(pointer)
    pump.set_landing(host_address, PINNED_COPY, mapped_at, ctypes.sizeof(pool) - 1)

    def pumped(call_id: int, opcode: int, payload: bytes, flags: int = 0) -> bytes:
        """Send the record, let the pump serve it, and give back the frame it wrote."""
        client.send(call_id, opcode, flags, payload)
        assert pump.pump() in (compiled_pump.PUMP_CHECK, compiled_pump.PUMP_SOCKET)  # nothing was Python's
        header = there.recv(32, socket.MSG_WAITALL)
        length = HEADER.unpack(header)[3]
        return header + there.recv(length, socket.MSG_WAITALL)

    frame = pumped(41, sync, struct.pack("<QQQ", 0xD000, 5, 0x5000))
    assert HEADER.unpack(frame[:32])[:4] == (41, CALLS["cuMemcpyHtoD"].opcode, 0, 16 + 5)
    assert frame[32:] == struct.pack("<QQ", 0xD000, 5) + bytes(range(16, 21))
    there.sendall(HEADER.pack(41, 0, 0, 0, REMOTE_GENERATION, 0, 0))
    assert pump.pump() in (compiled_pump.PUMP_CHECK, compiled_pump.PUMP_RING)
    reply = client.receive()
    assert reply is not None and (reply.call_id, reply.status, reply.payload) == (41, 0, b"")
    frame = pumped(42, posted, struct.pack("<QQQQ", 0xD000, 3, 0x51, 0x5000), Flag.NO_REPLY)
    assert HEADER.unpack(frame[:32])[:4] == (42, CALLS["cuMemcpyHtoDAsync"].opcode, Flag.NO_REPLY, 24 + 3)
    assert frame[32:] == struct.pack("<QQQ", 0xD000, 3, 0x51) + bytes(range(16, 19))
    pump.expect(43, 0, True)  # a page-locked DtoH of Python's, its bytes not yet landed
    direct.left_to_python(44, sync, struct.pack("<QQQ", 0xD000, 5, 0x5000))
    assert pump.take(43) is not None
    direct.left_to_python(45, sync, struct.pack("<QQQ", 0xD000, 5, 0x7000))  # the region's pages
    direct.left_to_python(46, sync, struct.pack("<QQQ", 0xD000, 8192, 0x9000))  # 1 B past the mapping told
    direct.left_to_python(47, sync, struct.pack("<QQQ", 0xD000, direct.host.out_ring.cell, 0x9000))  # > a slot
    frame = pumped(48, sync, struct.pack("<QQQ", 0xD000, 1, 0x9000))  # and each is served again afterwards
    assert frame[32:] == struct.pack("<QQ", 0xD000, 1) + b"\x00"


def test_while_memory_is_mirrored_the_pump_forwards_a_launch_only_if_the_cpu_changed_no_mirrored_byte(
        direct: DirectPump) -> None:
    """set_mirrored, driven directly: a launch naming no pool memory (forward code 4) is the pump's while each
    mirrored allocation's bytes in the pool are what both sides last agreed; Python's once the CPU changed one, or
    while a copy into the pool is on its way (its bytes must reach the mirror first: Relay._push). A mirrored range
    outside the pool's mapping is refused."""
    pump = direct.pump
    launch = CALLS["cuLaunchKernel"].opcode
    direct.forward({launch: 4})
    pool = ctypes.create_string_buffer(b"\x05" * 8192)
    mapped_at = ctypes.addressof(pool)
    pump.set_pool(0x7000_0000, 8192)
    pump.set_landing(lambda pointer, size: None, PINNED_COPY, mapped_at, 8192)
    agreed = bytearray(b"\x05" * 4096)
    with pytest.raises(ValueError, match="outside"):
        pump.set_mirrored([(mapped_at + 4097, agreed)])
    pump.set_mirrored([(mapped_at + 4096, agreed)])
    payload = struct.pack("<QIIIIIIIQ", 0xF00, 1, 1, 1, 1, 1, 1, 0, 0) + struct.pack("<QQ", 0xD000, 7)

    def forwarded(call_id: int) -> None:
        direct.client.send(call_id, launch, Flag.NO_REPLY, payload)
        assert pump.pump() == compiled_pump.PUMP_CHECK  # nothing was Python's
        frame = direct.there.recv(32 + len(payload), socket.MSG_WAITALL)
        assert HEADER.unpack(frame[:32])[:4] == (call_id, launch, Flag.NO_REPLY, len(payload))

    forwarded(1)
    ctypes.memset(mapped_at + 4096 + 100, 6, 1)  # the CPU writes a mirrored byte
    direct.left_to_python(2, launch, payload, Flag.NO_REPLY)
    agreed[100] = 6  # as Relay._push leaves it: agreed again
    forwarded(3)
    pump.expect(4, 0, True)  # a page-locked DtoH of Python's on its way
    direct.left_to_python(5, launch, payload, Flag.NO_REPLY)
    pump.take(4)
    ctypes.memset(mapped_at + 100, 9, 1)  # pool bytes that are not mirrored
    forwarded(6)
    pump.set_mirrored([])
    ctypes.memset(mapped_at + 4096 + 100, 7, 1)
    forwarded(7)
