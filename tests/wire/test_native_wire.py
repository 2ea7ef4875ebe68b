"""The native wire client (guest_runtime/native/orion_wire.c) against a real host agent over a real region.

The library is built into a temporary directory with the system C compiler (skipped, with the reason, only
where there is none: setup.sh installs gcc, so CI runs these), loaded with ctypes and driven against
tests/wire/serve_region.py. Every wait is bounded: each native call runs in a daemon thread joined with a
timeout, so a client that hangs fails the test instead of stalling the suite.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from guest_runtime.native.build import build_library, find_compiler
from guest_runtime.native.ctypes_client import ERRORS, NativeChannel, NativeWireError, Piece, load
from ivshmem import layout
from ivshmem.channel import ClientChannel, Ctrl, HostChannel, HostReason, HostStatus
from ivshmem.layout import Geometry
from ivshmem.record import DRAIN_REPLY, FILL_REQUEST, SEQ_AT, STATS_REPLY, Op, Status, fill_pattern, publish_mark
from ivshmem.region import Region

T = TypeVar("T")
BOUND_S = 30.0
REPO = Path(__file__).resolve().parents[2]


class Background:
    """fn() running in a daemon thread from now on; result() waits for it, bounded."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.box: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.box["value"] = fn()
        except BaseException as exc:  # handed to the test thread
            self.box["error"] = exc

    def result(self, timeout: float = BOUND_S) -> Any:
        """fn's value (or its exception, raised here); fails the test if fn has not returned within `timeout`."""
        self.thread.join(timeout)
        if self.thread.is_alive():
            pytest.fail(f"the native client did not return within {timeout} s")
        if "error" in self.box:
            raise self.box.pop("error")
        return self.box["value"]


def bounded(fn: Callable[[], T], timeout: float = BOUND_S) -> T:
    """fn() in a daemon thread; fails the test if it has not returned within `timeout`."""
    return Background(fn).result(timeout)  # type: ignore[no-any-return]


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def noted_worker(observer: Region, index: int) -> int:
    """The pid of the worker serving channel `index`, which the supervisor notes just after it accepted the claim:
    a client may hear its HELLO answered first (on a loaded machine, by some milliseconds)."""
    ctrl = HostChannel(observer, index).ctrl
    wait_until(lambda: ctrl[Ctrl.HOST_WORKER] > 0, 10, "the supervisor to note the session's worker")
    return int(ctrl[Ctrl.HOST_WORKER])


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    if find_compiler() is None:
        pytest.skip("no C compiler (cc/gcc/$CC) to build the native wire client; setup.sh installs gcc")
    return load(build_library(tmp_path_factory.mktemp("native") / "liborion_wire.so"))


@pytest.fixture
def native(lib: ctypes.CDLL, served_region: str) -> Iterator[NativeChannel]:
    channel = bounded(lambda: NativeChannel(lib, served_region))
    yield channel
    channel.close()


def open_error(lib: ctypes.CDLL, path: str, **kwargs: float) -> NativeWireError:
    with pytest.raises(NativeWireError) as caught:
        bounded(lambda: NativeChannel(lib, path, **kwargs))
    return caught.value


# --- talking ---------------------------------------------------------------------------------------------------
def test_hello_then_echo_round_trips_of_random_sizes(native: NativeChannel) -> None:
    session = bounded(lambda: native.hello(""))
    assert session > 0
    rng = random.Random(13)
    sizes = [0, 1, native.capacity - 1, native.capacity] + [rng.randrange(native.capacity + 1) for _ in range(300)]
    for size in sizes:
        payload = rng.randbytes(size)
        assert bounded(lambda data=payload: native.call(Op.ECHO, data)) == (0, payload)  # type: ignore[misc]


def test_hello_naming_another_call_table_is_refused_in_one_line(native: NativeChannel) -> None:
    with pytest.raises(NativeWireError) as caught:
        bounded(lambda: native.hello("not-the-served-table"))
    assert caught.value.code == "REFUSED" and "refused this client" in str(caught.value)


def test_posted_nops_then_a_call_and_a_failed_post_kept_as_an_async_error(native: NativeChannel,
                                                                         served_region: str) -> None:
    entries = Region.open(served_region)
    try:
        ring_entries = entries.geometry.ring_entries
    finally:
        entries.close()
    for _ in range(3 * ring_entries):  # more than the ring holds: the client waits for room, bounded
        bounded(lambda: native.post(Op.NOP))
    bad = bounded(lambda: native.post(0x7777))  # not served: the agent answers with an async error
    assert bad == 3 * ring_entries + 1  # call ids count 1, 2, ... per channel
    assert bounded(lambda: native.call(Op.ECHO, b"after")) == (0, b"after")
    # kept by call id; the successful NOPs produced no completion at all
    assert [(call_id, status) for call_id, _, status in native.async_errors()] == [(bad, Status.UNKNOWN_OPCODE)]


def test_a_full_request_ring_holds_the_next_post_until_the_agent_takes_one(native: NativeChannel,
                                                                           served_region: str) -> None:
    """The client reads the host's request-ring head again only when its last reading says "full" (orion_wire.c,
    spsc_writable of a marked ring). With the agent's worker stopped, a ring's worth of posts fits; the next one
    waits, overwriting nothing, and once the worker goes on every post reaches it (its count of ECHOs, STATS)."""
    def echoes_served() -> int:
        status, reply = bounded(lambda: native.call(Op.STATS))
        assert status == 0
        return sum(python for opcode, _compiled, python, *_times in STATS_REPLY.decode(reply)[0] if opcode == Op.ECHO)
    before = echoes_served()  # the agent counts what its Python answers from the first STATS on
    with Region.open(served_region) as observer:
        entries = observer.geometry.ring_entries
        worker = noted_worker(observer, native.index)
    os.kill(worker, signal.SIGSTOP)
    try:
        for i in range(entries):
            bounded(lambda: native.post(Op.ECHO, i.to_bytes(4, "little")))  # noqa: B023
        one_more = Background(lambda: native.post(Op.ECHO, b"one more"))
        one_more.thread.join(0.5)
        assert one_more.thread.is_alive(), "a post went into a full ring"
    finally:
        os.kill(worker, signal.SIGCONT)
    one_more.result()
    assert echoes_served() - before == entries + 1


def test_two_native_clients_get_two_channels(lib: ctypes.CDLL, served_region: str) -> None:
    with bounded(lambda: NativeChannel(lib, served_region)) as one, \
            bounded(lambda: NativeChannel(lib, served_region)) as two:
        assert one.index != two.index
        assert bounded(lambda: one.call(Op.ECHO, b"one")) == (0, b"one")
        assert bounded(lambda: two.call(Op.ECHO, b"two")) == (0, b"two")


def test_a_native_and_a_python_client_share_the_region(native: NativeChannel, served_region: str) -> None:
    with Region.open(served_region) as region, bounded(lambda: ClientChannel.claim(region)) as python:
        assert python.index != native.index
        assert bounded(lambda: python.call(Op.ECHO, b"py")).payload == b"py"
        assert bounded(lambda: native.call(Op.ECHO, b"c")) == (0, b"c")


def test_close_releases_the_channel_and_the_next_claim_has_a_higher_generation(lib: ctypes.CDLL,
                                                                              served_region: str) -> None:
    channel = bounded(lambda: NativeChannel(lib, served_region))
    index, generation = channel.index, channel.generation
    bounded(channel.hello)
    channel.close()
    with Region.open(served_region) as observer:
        ctrl = HostChannel(observer, index).ctrl
        wait_until(lambda: ctrl[Ctrl.HOST_STATUS] == HostStatus.IDLE, 15, "the host to see the channel released")
        assert ctrl[Ctrl.HOST_REASON] == HostReason.CLIENT_RELEASED
        assert ctrl[Ctrl.CLIENT_ACTIVE] == 0
    with bounded(lambda: NativeChannel(lib, served_region)) as again:
        assert again.index == index and again.generation == generation + 1
        assert bounded(lambda: again.call(Op.ECHO, b"z")) == (0, b"z")


# --- staged records (payloads beyond a slot, through the staging arenas) -------------------------------------
MIB = 1 << 20
DRAIN_REPLY_SIZE = 12  # u64 length, u32 crc32


def geometry_of(path: str) -> Geometry:
    with Region.open(path) as region:
        return region.geometry


def pattern(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def echo_split(native: NativeChannel, payload: bytes, head_cap: int) -> bytes:
    """ECHO `payload` with its reply split: `head_cap` bytes into one buffer, the rest into another."""
    head, tail = bytearray(head_cap), bytearray(len(payload) - head_cap)
    assert bounded(lambda: native.callv(Op.ECHO, [payload], head, tail)) == (0, len(payload))
    return bytes(head + tail)


def test_staged_echo_is_byte_exact_around_every_boundary(native: NativeChannel, served_region: str) -> None:
    g = geometry_of(served_region)
    cap, chunk, arena = native.capacity, g.chunk_size, g.chunk_size * g.chunk_count
    sizes = [cap - 1, cap, cap + 1, chunk - 1, chunk, chunk + 1, 3 * chunk + 7, arena, arena + 1, 2 * arena + 5]
    for size in sizes:
        payload = pattern(size, size)
        for head_cap in (size, size // 3, 0):  # all in head; split mid-chunk; all in the tail
            assert echo_split(native, payload, head_cap) == payload, f"ECHO of {size} bytes, head {head_cap}"


def test_a_64_mib_echo_is_byte_exact(native: NativeChannel) -> None:
    payload = pattern(64 * MIB, 64)
    head = bytearray(64 * MIB)
    assert bounded(lambda: native.callv(Op.ECHO, [payload], head)) == (0, len(payload))
    assert head == payload


def test_drain_of_a_staged_request_in_three_pieces(native: NativeChannel, served_region: str) -> None:
    g = geometry_of(served_region)
    pieces: list[bytes | bytearray | memoryview] = [
        pattern(100, 1), bytearray(pattern(3 * g.chunk_size + 7, 2)), memoryview(bytearray(pattern(333, 3)))]
    whole = b"".join(bytes(piece) for piece in pieces)  # piece boundaries fall mid-chunk
    reply = bytearray(64)
    status, length = bounded(lambda: native.callv(Op.DRAIN, pieces, reply))
    assert (status, length) == (0, DRAIN_REPLY_SIZE)
    assert DRAIN_REPLY.decode(bytes(reply[:length])) == (len(whole), zlib.crc32(whole))
    empty_ends: list[bytes | bytearray | memoryview] = [b"", whole, b""]  # empty pieces take no room
    assert bounded(lambda: native.callv(Op.DRAIN, empty_ends, reply)) == (0, DRAIN_REPLY_SIZE)
    assert DRAIN_REPLY.decode(bytes(reply[:DRAIN_REPLY_SIZE])) == (len(whole), zlib.crc32(whole))


def test_fill_streams_its_pattern_into_head_and_tail(native: NativeChannel, served_region: str) -> None:
    g = geometry_of(served_region)
    arena = g.chunk_size * g.chunk_count
    cases = [(10, 1, 4), (native.capacity + 1, 2, 0), (5 * g.chunk_size + 17, 3, 12345),
             (arena + 1, 4, g.chunk_size), (3 * arena, 5, arena + 9)]
    for length, seed, head_cap in cases:  # a FILL reply is always staged, even a short one
        head, tail = bytearray(head_cap), bytearray(length - head_cap)
        request = FILL_REQUEST.encode(length, seed)
        assert bounded(lambda: native.callv(Op.FILL, [request], head, tail)) == (0, length)  # noqa: B023
        assert bytes(head + tail) == fill_pattern(seed, length), f"FILL {length} seed {seed} head {head_cap}"


def test_a_reply_beyond_the_buffers_is_too_large_and_the_channel_goes_on(native: NativeChannel,
                                                                        served_region: str) -> None:
    g = geometry_of(served_region)
    length = 3 * g.chunk_size * g.chunk_count + 5  # more than the arena holds: the host needs it drained
    head, tail = bytearray(1000), bytearray(2000)
    with pytest.raises(NativeWireError) as caught:
        bounded(lambda: native.callv(Op.FILL, [FILL_REQUEST.encode(length, 3)], head, tail))
    assert caught.value.code == "TOO_LARGE" and f"{length} bytes" in str(caught.value)
    expected = fill_pattern(3, 3000)
    assert head == expected[:1000] and tail == expected[1000:]  # what fits is delivered
    assert bounded(lambda: native.call(Op.ECHO, b"next")) == (0, b"next")
    payload = pattern(2 * g.chunk_size + 1, 5)
    assert echo_split(native, payload, 17) == payload  # the chunk stream is still in step
    with pytest.raises(NativeWireError) as inline:  # an inline reply beyond the buffer: the same
        bounded(lambda: native.callv(Op.ECHO, [bytes(100)], bytearray(10)))
    assert inline.value.code == "TOO_LARGE"
    assert bounded(lambda: native.call(Op.ECHO, b"again")) == (0, b"again")


def test_posted_staged_records_then_a_call(native: NativeChannel, served_region: str) -> None:
    g = geometry_of(served_region)
    big = pattern(2 * g.chunk_size * g.chunk_count + 3, 11)
    posted = [bounded(lambda: native.postv(Op.DRAIN, [big[:100], big[100:]])) for _ in range(3)]
    bad = bounded(lambda: native.postv(0x7777, [big]))  # not served: an async error once its chunks are taken
    assert bad == posted[-1] + 1
    payload = pattern(g.chunk_size + 1, 12)
    assert echo_split(native, payload, 7) == payload
    reply = bytearray(64)
    assert bounded(lambda: native.callv(Op.DRAIN, [big], reply)) == (0, DRAIN_REPLY_SIZE)
    assert DRAIN_REPLY.decode(bytes(reply[:DRAIN_REPLY_SIZE])) == (len(big), zlib.crc32(big))
    assert [(call_id, status) for call_id, _, status in native.async_errors()] == [(bad, Status.UNKNOWN_OPCODE)]


def test_a_request_beyond_one_gib_is_refused_before_anything_is_sent(native: NativeChannel) -> None:
    huge = mmap.mmap(-1, (1 << 30) + 1)  # reserved, never touched: the refusal reads none of it
    with pytest.raises(NativeWireError) as caught:
        bounded(lambda: native.callv(Op.DRAIN, [huge]))
    assert caught.value.code == "TOO_LARGE" and "record limit" in str(caught.value)
    small = ctypes.create_string_buffer(8)
    wrapping = (Piece * 2)(Piece(ctypes.addressof(small), (1 << 64) - 1), Piece(ctypes.addressof(small), 2))
    rc = bounded(lambda: native.lib.orion_postv(native.handle, Op.DRAIN, wrapping, 2))  # lengths that wrap size_t
    assert ERRORS[rc] == "TOO_LARGE"
    assert ERRORS[bounded(lambda: native.lib.orion_postv(native.handle, Op.DRAIN, None, 2))] == "ARG"
    assert ERRORS[bounded(lambda: native.lib.orion_postv(native.handle, Op.DRAIN, wrapping, -1))] == "ARG"
    assert bounded(lambda: native.call(Op.ECHO, b"fine")) == (0, b"fine")
    del caught
    huge.close()


def test_agent_killed_in_the_middle_of_a_staged_transfer(lib: ctypes.CDLL, region_path: str,
                                                         server_factory: Callable[..., Any]) -> None:
    server = server_factory(region_path)
    g = geometry_of(region_path)
    block = pattern(64 * MIB, 7)
    total_chunks = 16 * len(block) // g.chunk_size
    with bounded(lambda: NativeChannel(lib, region_path, agent_timeout=1.0)) as channel, \
            Region.open(region_path) as observer:
        bounded(channel.hello)
        worker = noted_worker(observer, channel.index)
        chunks_sent = (g.channel_base(channel.index) + g.off_req_staging + layout.STAGING_TAIL) >> 2
        transfer = Background(lambda: channel.callv(Op.DRAIN, [block] * 16, bytearray(64)))  # 1 GiB, one buffer
        wait_until(lambda: observer.u32[chunks_sent] > 0, 10, "the staged request's first chunk")
        os.kill(worker, signal.SIGSTOP)  # the worker freezes mid-transfer ...
        assert 0 < observer.u32[chunks_sent] < total_chunks
        server.kill()  # ... and the whole agent dies
        os.kill(worker, signal.SIGKILL)
        with pytest.raises(NativeWireError) as caught:
            transfer.result()
        assert caught.value.code == "PEER_GONE", caught.value
        with pytest.raises(NativeWireError):  # the channel stays broken
            bounded(lambda: channel.call(Op.NOP))
    wait_until(lambda: not server.leftovers(), 10, "the dead agent's workers exiting")


def forge_staging(served_region: str, index: int, block: str, word: int, ahead: int) -> None:
    """Move one index of channel `index`'s staging arena `block` (off_req_staging / off_cpl_staging) `ahead` past
    the other one, as a broken host would. Only while the host is idle."""
    with Region.open(served_region) as region:
        g = region.geometry
        arena = g.channel_base(index) + getattr(g, block)
        other = layout.STAGING_TAIL if word == layout.STAGING_HEAD else layout.STAGING_HEAD
        region.u32[(arena + word) >> 2] = (region.u32[(arena + other) >> 2] + ahead) & 0xFFFFFFFF


def staged_completion(native: NativeChannel, length: int) -> bytes:
    return struct.pack("<QIIIIiI", 99, 0, 2, length, native.generation, 0, 0)  # flag STAGED


def test_a_staged_completion_declaring_more_than_the_limit_is_malformed(native: NativeChannel,
                                                                         served_region: str) -> None:
    assert bounded(lambda: native.call(Op.ECHO, b"a")) == (0, b"a")
    forge_completion(served_region, native.index, staged_completion(native, (1 << 30) + 1), 1, marked=True)
    assert bounded(native.async_errors) == []  # takes what arrived: the forged record, refused unread
    with pytest.raises(NativeWireError) as caught:
        bounded(lambda: native.call(Op.NOP))
    assert caught.value.code == "PROTOCOL" and "malformed" in str(caught.value)


@pytest.mark.parametrize("ahead", [100000, -1])
def test_impossible_completion_arena_counters_are_an_error(native: NativeChannel, served_region: str,
                                                           ahead: int) -> None:
    assert bounded(lambda: native.call(Op.ECHO, b"a")) == (0, b"a")
    forge_staging(served_region, native.index, "off_cpl_staging", layout.STAGING_TAIL, ahead)
    forge_completion(served_region, native.index, staged_completion(native, 3 * native.capacity), 1, marked=True)
    assert bounded(native.async_errors) == []  # the forged record's chunks: impossible counters, nothing read
    with pytest.raises(NativeWireError) as caught:
        bounded(lambda: native.call(Op.NOP))
    assert caught.value.code == "PROTOCOL" and "broke the protocol" in str(caught.value)


def test_impossible_request_arena_counters_are_an_error(native: NativeChannel, served_region: str) -> None:
    assert bounded(lambda: native.call(Op.ECHO, b"a")) == (0, b"a")
    forge_staging(served_region, native.index, "off_req_staging", layout.STAGING_HEAD, 5)  # head past our tail
    with pytest.raises(NativeWireError) as caught:
        bounded(lambda: native.call(Op.ECHO, bytes(native.capacity + 1)))
    assert caught.value.code == "PROTOCOL" and "request staging arena" in str(caught.value)


# --- a peer that breaks the protocol ------------------------------------------------------------------------
def forge_completion(served_region: str, index: int, slot: bytes | None, tail_ahead: int, marked: bool = False) -> None:
    """Write what a broken host would into channel `index`'s completion ring: optionally a slot at the tail (with its
    publish mark when `marked`: then the client sees it even where it does not wait), then the tail moved
    `tail_ahead` past the head. Only while no call is outstanding (the host is idle)."""
    with Region.open(served_region) as region:
        g = region.geometry
        ring = g.channel_base(index) + g.off_cpl_ring
        head = region.u32[(ring + layout.RING_HEAD) >> 2]
        if slot is not None:
            cell = ring + layout.RING_SLOTS + (head % g.ring_entries) * g.slot_size
            region.buf[cell:cell + len(slot)] = slot
        region.u32[(ring + layout.RING_TAIL) >> 2] = (head + tail_ahead) & 0xFFFFFFFF
        if slot is not None and marked:
            region.u32[(cell + SEQ_AT) >> 2] = publish_mark(head + 1)


@contextlib.contextmanager
def frozen_worker(native: NativeChannel, served_region: str) -> Iterator[None]:
    """The agent's worker for `native`'s session stopped (SIGSTOP) meanwhile: it answers nothing, overwrites
    nothing, so what a test forged in the completion ring is what the client finds."""
    with Region.open(served_region) as observer:
        worker = noted_worker(observer, native.index)
    os.kill(worker, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(worker, signal.SIGCONT)


def test_a_malformed_completion_breaks_the_channel_with_an_error(native: NativeChannel, served_region: str) -> None:
    """Published by the tail alone, as a broken host might: the client, which watches each slot's mark, finds it once
    its wait sleeps, and refuses it."""
    assert bounded(lambda: native.call(Op.ECHO, b"a")) == (0, b"a")
    forged = struct.pack("<QIIIIiI", 99, 0, 0x80, 0, native.generation, 0, 0)  # an unknown flag
    with frozen_worker(native, served_region):
        forge_completion(served_region, native.index, forged, 1)
        with pytest.raises(NativeWireError) as caught:
            bounded(lambda: native.call(Op.ECHO, b"b"))
    assert caught.value.code == "PROTOCOL" and "malformed" in str(caught.value)
    with pytest.raises(NativeWireError) as again:  # broken for good: close it and open another
        bounded(lambda: native.call(Op.NOP))
    assert again.value.code == "PROTOCOL"


def test_impossible_completion_indices_are_an_error(native: NativeChannel, served_region: str) -> None:
    assert bounded(lambda: native.call(Op.NOP)) == (0, b"")
    with frozen_worker(native, served_region):
        forge_completion(served_region, native.index, None, 100000)
        with pytest.raises(NativeWireError) as caught:
            bounded(lambda: native.call(Op.NOP))
    assert caught.value.code == "PROTOCOL" and "broke the protocol" in str(caught.value)


def test_each_request_carries_its_publish_mark(lib: ctypes.CDLL, served_region: str) -> None:
    """What the host's compiled path watches: every request slot the client published carries the tail that covers
    it (record.publish_mark), and the same channel claimed again starts with no slot marked (a slot of the earlier
    session would otherwise read as the new session's record of the same index)."""
    def marks(index: int) -> list[int]:
        with Region.open(served_region) as region:
            g = region.geometry
            ring = g.channel_base(index) + g.off_req_ring
            return [region.u32[(ring + layout.RING_SLOTS + k * g.slot_size + SEQ_AT) >> 2] for k in range(8)]
    with bounded(lambda: NativeChannel(lib, served_region)) as first:
        for i in range(8):
            assert bounded(lambda: first.call(Op.ECHO, bytes([i]))) == (0, bytes([i]))  # noqa: B023
        index = first.index
        assert marks(index) == [publish_mark(k + 1) for k in range(8)]
    with bounded(lambda: NativeChannel(lib, served_region)) as second:
        assert second.index == index
        assert marks(index) == [0] * 8
        assert bounded(lambda: second.call(Op.ECHO, b"x")) == (0, b"x")
        assert marks(index) == [publish_mark(1)] + [0] * 7


def test_an_agent_that_refuses_the_hello_record_is_named_older(native: NativeChannel, served_region: str) -> None:
    """An oriond of wire protocol 2 answers a protocol-3 HELLO with -1 (MALFORMED): to it the slot's publish mark is
    a reserved word that is not 0. Written here as that agent writes it (its worker frozen meanwhile); the client's
    refusal says which side to update."""
    call_id = int(native.lib.orion_last_call_id(native.handle)) + 1  # the HELLO's
    with Region.open(served_region) as region:
        g = region.geometry
        ring = g.channel_base(native.index) + g.off_cpl_ring
        head = region.u32[(ring + layout.RING_HEAD) >> 2]
        cell = ring + layout.RING_SLOTS + (head % g.ring_entries) * g.slot_size
        why = f"record {call_id}: unknown flags 0x0 or reserved word 0x80000001".encode()
        with frozen_worker(native, served_region):
            hello = Background(native.hello)
            region.buf[cell:cell + 32 + len(why)] = struct.pack("<QIIIIiI", call_id, 0, 0, len(why),
                                                                native.generation, Status.MALFORMED, 0) + why
            region.u32[(ring + layout.RING_TAIL) >> 2] = head + 1
            region.u32[(cell + SEQ_AT) >> 2] = publish_mark(head + 1)
            with pytest.raises(NativeWireError) as caught:
                hello.result()
    assert caught.value.code == "REFUSED"
    assert "older than wire protocol 3; install the oriond of the same release as orion-guest" in str(caught.value)


def test_a_completion_is_taken_by_its_mark_before_its_tail(native: NativeChannel, served_region: str) -> None:
    """The client takes a reply its host published by the slot's mark alone (record.publish_mark), the tail not yet
    stored: the mark it watches is the one every host producer writes. A slot whose mark is another lap's, or zero
    (a reset ring), is not taken."""
    assert bounded(lambda: native.call(Op.ECHO, b"a")) == (0, b"a")
    call_id = int(native.lib.orion_last_call_id(native.handle)) + 1  # the id of the call below
    with Region.open(served_region) as region:
        g = region.geometry
        ring = g.channel_base(native.index) + g.off_cpl_ring
        head = region.u32[(ring + layout.RING_HEAD) >> 2]
        cell = ring + layout.RING_SLOTS + (head % g.ring_entries) * g.slot_size
        with frozen_worker(native, served_region):
            reply = Background(lambda: native.call(Op.ECHO, b"b"))
            for stale in (0, publish_mark(head + 1 - g.ring_entries), publish_mark(head)):
                region.buf[cell:cell + 34] = struct.pack("<QIIIIiI", call_id, 0, 0, 2,
                                                         native.generation, 0, stale) + b"ok"
                reply.thread.join(0.3)
                assert reply.thread.is_alive(), f"a reply taken by the mark {stale:#x}"
            region.u32[(cell + SEQ_AT) >> 2] = publish_mark(head + 1)  # the tail stays where it was
            assert reply.result() == (0, b"ok")
            assert region.u32[(ring + layout.RING_TAIL) >> 2] == head  # taken by the mark alone
            region.u32[(ring + layout.RING_TAIL) >> 2] = head + 1  # as the host would have (it is frozen)
        # the worker answers the forged call's request after all: the client drops that reply as one it never
        # waits for, and goes on
        assert bounded(lambda: native.call(Op.ECHO, b"c")) == (0, b"c")


# --- regions it must refuse, in one line, without crashing ----------------------------------------------------
def test_paths_that_are_not_regions(lib: ctypes.CDLL, tmp_path: Path) -> None:
    missing = open_error(lib, str(tmp_path / "absent"))
    assert missing.code == "REGION" and "does not exist" in str(missing)
    assert "cannot open" in str(open_error(lib, str(tmp_path)))  # a directory
    (tmp_path / "target").write_bytes(bytes(1 << 20))
    os.symlink(tmp_path / "target", tmp_path / "link")
    assert "symbolic link" in str(open_error(lib, str(tmp_path / "link")))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "not a regular file" in str(open_error(lib, str(fifo)))
    foreign = tmp_path / "foreign"
    foreign.write_bytes(random.Random(1).randbytes(1 << 20))
    assert "not an Orion region" in str(open_error(lib, str(foreign)))
    (tmp_path / "small").write_bytes(b"ORIONSHM" + bytes(100))
    assert "too small" in str(open_error(lib, str(tmp_path / "small")))


def test_a_pci_address_names_an_ivshmem_bar_and_says_when_there_is_none(lib: ctypes.CDLL) -> None:
    """Not an absolute path: the PCI address of an ivshmem device, whose BAR2 a QEMU guest maps from sysfs (the
    TCG guest of tests/guest maps a real one: bench/kvm_bench.py). Here there is no such device."""
    absent = open_error(lib, "0000:00:1f.7")
    assert absent.code == "REGION" and "no ivshmem PCI device at 0000:00:1f.7" in str(absent)
    assert "neither a region file" in str(open_error(lib, "../etc/passwd"))


def test_damaged_headers_are_refused_with_their_field(lib: ctypes.CDLL, served_region: str, tmp_path: Path) -> None:
    good = Path(served_region).read_bytes()

    def variant(name: str, edit: Callable[[bytearray], None]) -> str:
        raw = bytearray(good)
        edit(raw)
        path = tmp_path / name
        path.write_bytes(raw)
        return str(open_error(lib, str(path)))
    assert "checksum mismatch" in variant("crc", lambda raw: raw.__setitem__(40, raw[40] ^ 1))
    assert "version" in variant("version", lambda raw: raw.__setitem__(8, 9))
    assert "no header yet" in variant("zeros", lambda raw: raw.__setitem__(slice(0, 4096), bytes(4096)))

    def resealed_ring_entries(raw: bytearray) -> None:
        fields = layout.unpack_header(bytes(raw[:layout.CRC_SPAN]), "copy", len(raw))
        bad = Geometry(**{**fields.__dict__, "ring_entries": 3})
        raw[:layout.CRC_SPAN] = layout.pack_header(bad)
    assert "ring_entries 3" in variant("entries", resealed_ring_entries)
    truncated = tmp_path / "truncated"
    truncated.write_bytes(good[:1 << 20])  # a valid header that says 32 MiB over a 1 MiB file
    assert "are mapped" in str(open_error(lib, str(truncated)))


def test_an_unserved_region_says_to_start_oriond(lib: ctypes.CDLL, region_path: str) -> None:
    assert "start the host agent" in str(open_error(lib, region_path))
    with Region.open(region_path) as region:
        region.format(Geometry.build(region.size, name="never-served"))
    error = open_error(lib, region_path)
    assert error.code == "PEER_GONE" and "start oriond" in str(error)


# --- the agent goes away ------------------------------------------------------------------------------------
def test_agent_killed_is_an_error_within_the_bound(lib: ctypes.CDLL, region_path: str,
                                                   server_factory: Callable[..., Any]) -> None:
    server = server_factory(region_path)
    with bounded(lambda: NativeChannel(lib, region_path, agent_timeout=1.0)) as channel:
        bounded(channel.hello)
        server.kill()  # SIGKILL the supervisor; its worker notices and goes, nobody answers any more

        def call_until_gone() -> NativeWireError:
            end = time.monotonic() + 20
            while time.monotonic() < end:
                try:
                    channel.call(Op.ECHO, b"x")
                except NativeWireError as exc:
                    return exc
            raise AssertionError("calls kept succeeding after the agent was killed")
        error = bounded(call_until_gone)
        assert error.code == "PEER_GONE", error
        with pytest.raises(NativeWireError):  # the channel stays broken
            bounded(lambda: channel.call(Op.NOP))
    wait_until(lambda: not server.leftovers(), 10, "the dead agent's workers exiting")
    assert open_error(lib, region_path, accept_timeout=0.5).code == "PEER_GONE"


def test_agent_stopped_cleanly_is_an_error_naming_it(lib: ctypes.CDLL, region_path: str,
                                                     server_factory: Callable[..., Any]) -> None:
    server = server_factory(region_path)
    with bounded(lambda: NativeChannel(lib, region_path, agent_timeout=1.0)) as channel:
        assert server.stop() == 0
        with pytest.raises(NativeWireError) as caught:
            bounded(lambda: channel.call(Op.ECHO, b"x"))
        assert caught.value.code == "PEER_GONE" and "stopped" in str(caught.value)
    assert "it stopped" in str(open_error(lib, region_path))


def test_the_build_says_in_one_line_when_there_is_no_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from guest_runtime.native import build
    monkeypatch.setenv("CC", "orion-no-such-compiler")
    assert build.find_compiler() is None
    assert build.main([str(tmp_path / "lib.so")]) == 1
    assert not (tmp_path / "lib.so").exists()
    assert shutil.which("orion-no-such-compiler") is None


def test_the_sources_compile_without_a_warning(tmp_path: Path) -> None:
    from guest_runtime.native import build
    compiler = build.find_compiler()
    if compiler is None:
        pytest.skip("no C compiler (cc/gcc/$CC) to build the native wire client; setup.sh installs gcc")
    build.write_region_header(tmp_path)  # the generated orion_region.h the sources include
    done = subprocess.run([*compiler, *build.CFLAGS, "-Werror", f"-I{tmp_path}", "-o", str(tmp_path / "lib.so"),
                           *build.wire_sources(), *build.LIBS],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


# --- a second copying core (copy_helper.c) ----------------------------------------------------------------------
TWO_CORES = r"""
import ctypes, json, os, random, sys, warnings, zlib
from guest_runtime.native.ctypes_client import NativeChannel, load
from ivshmem.record import DRAIN_REPLY, FILL_REQUEST, Op, fill_pattern
lib_path, region, chunk, arena, split = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
lib = load(lib_path)
lib.orion_copy_helper_halves.restype = ctypes.c_uint64
native = NativeChannel(lib, region)
def pattern(size, seed): return random.Random(seed).randbytes(size)
checked = 0
for size in (native.capacity + 1, split - 1, split, 2 * split, chunk - 1, chunk, chunk + 1, chunk + split + 3,
             5 * chunk + 77, 2 * arena + 5):
    payload = pattern(size, size)
    for head_cap in sorted({size, size // 3, min(size, chunk // 2), min(size, chunk // 2 + 1), 0}):
        head, tail = bytearray(head_cap), bytearray(size - head_cap)  # the two halves' copies straddle head and tail
        assert native.callv(Op.ECHO, [payload], head, tail) == (0, size), size
        assert head + tail == payload, f"ECHO of {size} bytes, head {head_cap}"
        checked += 1
pieces = [pattern(100, 1), pattern(chunk // 2 - 37, 2), pattern(13, 3), pattern(3 * chunk + 7, 4), b"", pattern(9, 5)]
whole, reply = b"".join(pieces), bytearray(64)  # piece boundaries inside each chunk's two halves
assert native.callv(Op.DRAIN, pieces, reply)[0] == 0
assert DRAIN_REPLY.decode(bytes(reply[:12])) == (len(whole), zlib.crc32(whole)), "DRAIN in pieces"
length = 3 * arena + 11
head, tail = bytearray(chunk + 5), bytearray(length - chunk - 5)
assert native.callv(Op.FILL, [FILL_REQUEST.encode(length, 9)], head, tail) == (0, length)
assert head + tail == fill_pattern(9, length), "FILL"
names = {open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")}
reader, writer = os.pipe()
warnings.simplefilter("ignore", DeprecationWarning)  # fork() with the helper thread running: the point here
child = os.fork()
if child == 0:  # a fork child has no helper thread (its parent's is not in it): it starts its own
    os.close(reader)
    with NativeChannel(lib, region) as mine:
        payload = pattern(5 * chunk + 77, 7)
        head = bytearray(len(payload))
        ok = mine.callv(Op.ECHO, [payload], head) == (0, len(payload)) and head == payload
    os.write(writer, json.dumps([ok, lib.orion_copy_helper_halves()]).encode())
    os._exit(0)
os.close(writer)
forked = json.loads(os.read(reader, 1000))
assert os.waitpid(child, 0)[1] == 0
print(json.dumps({"checked": checked, "helper": "orion-copy" in names, "halves": lib.orion_copy_helper_halves(),
                  "forked": forked}))
"""


@pytest.mark.parametrize("threads", ["1", "2"])
def test_staged_copies_split_over_two_cores_are_byte_exact(lib: ctypes.CDLL, region_path: str, threads: str,
                                                            server_factory: Callable[..., Any]) -> None:
    """ORION_COPY_THREADS=2 (the default with 4 CPUs or more): each staging chunk of a large copy is filled or
    emptied by two cores, half each (copy_helper.c), and published or released once both are done. Every byte
    arrives in its place through chunks, halves, pieces and reply buffers whose boundaries all differ, in a fork
    child too (which starts its own helper); =1 copies on one core and starts no helper thread."""
    chunk = 256 << 10
    with Region.open(region_path) as region:
        region.format(Geometry.build(region.size, 2, chunk_size=chunk))
    server_factory(region_path)
    arena = chunk * layout.DEFAULT_CHUNK_COUNT
    split = 128 << 10  # copy_helper.h's ORION_COPY_SPLIT_MIN
    assert f"#define ORION_COPY_SPLIT_MIN ({split >> 10}u << 10)" in Path(
        REPO, "guest_runtime/native/copy_helper.h").read_text()
    done = subprocess.run([sys.executable, "-c", TWO_CORES, lib._name, region_path, str(chunk), str(arena), str(split)],
                          cwd=REPO, env={**os.environ, "ORION_COPY_THREADS": threads}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert seen["checked"] >= 40 and seen["helper"] == (threads == "2"), seen
    assert (seen["halves"] > 0) == (threads == "2"), seen  # the helper did copy halves (some: this may be 2 cores)
    assert seen["forked"][0] is True and seen["forked"][1] <= 10, seen  # its own count: 5 chunks each way at most
    assert done.stderr == "", done.stderr
