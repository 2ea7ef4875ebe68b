"""ivshmem.ring against a model queue: random interleavings of produce and consume, across the 2**32 wrap.

Producer and consumer are two separate Ring (or StagingArena) objects over the same bytearray, as the two
processes of a channel are: each keeps a private copy of the index it owns and reads the other's from memory.
"""
from __future__ import annotations

import struct
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from ivshmem.errors import ChannelCorrupt
from ivshmem.layout import RECORD_HEADER_SIZE as RECORD_HEADER
from ivshmem.record import SEQ_AT, publish_mark
from ivshmem.ring import U32, Ring, StagingArena

BASE = 256  # the block does not start at 0, as in a real region
MACHINE_SETTINGS = settings(max_examples=60, stateful_step_count=80, deadline=None, database=None,
                            suppress_health_check=[HealthCheck.too_slow])
NEAR_WRAP = st.one_of(st.just(0), st.integers(0xFFFFFFF0, 0xFFFFFFFF), st.integers(0, U32))


class _QueueMachine(RuleBasedStateMachine):
    """Shared rules; subclasses say how to build the structure and where its cells are."""

    data_offset = 128
    cell_choices: tuple[int, ...] = (64,)
    payload_at = 0  # where in a cell the test's bytes go (a ring's cell starts with a record header: its mark)

    def build(self, words: memoryview, capacity: int, cell: int) -> Ring | StagingArena:
        raise NotImplementedError

    @initialize(capacity=st.sampled_from([2, 4, 8, 64]), start=NEAR_WRAP, cell_index=st.integers(0, 10))
    def setup(self, capacity: int, start: int, cell_index: int) -> None:
        self.cell = self.cell_choices[cell_index % len(self.cell_choices)]
        self.capacity = capacity
        size = BASE + self.data_offset + capacity * self.cell + 64
        self.buf = bytearray(size)
        self.words = memoryview(self.buf).cast("I")
        self.producer = self.build(self.words, capacity, self.cell)
        self.consumer = self.build(self.words, capacity, self.cell)
        # indices started anywhere (near 2**32 in particular): write the words, then both sides resync
        struct.pack_into("<I", self.buf, BASE + 0, start)
        struct.pack_into("<I", self.buf, BASE + 64, start)
        self.producer.resync()
        self.consumer.resync()
        self.start = start
        self.model: deque[bytes] = deque()
        self.produced = 0
        self.counter = 0

    def _cell_at(self, index: int) -> int:
        return BASE + self.data_offset + (index & (self.capacity - 1)) * self.cell

    @rule(size=st.integers(0, 60))
    def produce(self, size: int) -> None:
        offset = self.producer.writable()
        if len(self.model) == self.capacity:
            assert offset is None, "full at capacity"
            return
        assert offset == self._cell_at(self.start + self.produced)
        self.counter += 1
        size = min(size, self.cell - self.payload_at - 2)
        payload = self.counter.to_bytes(4, "little") * (size // 4 + 1)
        payload = payload[:size]
        offset += self.payload_at
        self.buf[offset:offset + 2] = size.to_bytes(2, "little")
        self.buf[offset + 2:offset + 2 + size] = payload
        self.producer.publish()
        self.produced += 1
        self.model.append(payload)

    @rule()
    def consume(self) -> None:
        offset = self.consumer.readable()
        if not self.model:
            assert offset is None, "empty at zero"
            return
        assert offset is not None
        offset += self.payload_at
        size = int.from_bytes(self.buf[offset:offset + 2], "little")
        got = bytes(self.buf[offset + 2:offset + 2 + size])
        assert got == self.model.popleft(), "FIFO, no loss, no duplicate"
        self.consumer.release()

    @rule(n=st.integers(1, 70))
    def burst(self, n: int) -> None:
        for _ in range(n):
            self.produce(size=8)

    @rule(n=st.integers(1, 70))
    def drain(self, n: int) -> None:
        for _ in range(n):
            self.consume()

    @rule()
    def reattach(self) -> None:
        """A side that re-reads its indices from shared memory (resync) carries on where it was."""
        self.producer.resync()
        self.consumer.resync()

    @invariant()
    def indices_match_the_model(self) -> None:
        if not hasattr(self, "model"):
            return
        head, tail = struct.unpack_from("<I", self.buf, BASE)[0], struct.unpack_from("<I", self.buf, BASE + 64)[0]
        assert (head, tail) == self.producer.snapshot() == self.consumer.snapshot()
        assert (tail - head) & U32 == len(self.model)
        assert tail == (self.start + self.produced) & U32
        assert 0 <= head <= U32 and 0 <= tail <= U32
        assert bytes(self.buf[:BASE]) == bytes(BASE), "nothing written before the block"


class RingMachine(_QueueMachine):
    data_offset = 128
    cell_choices = (64, 128, 512)
    payload_at = RECORD_HEADER

    def build(self, words: memoryview, capacity: int, cell: int) -> Ring:
        return Ring(words, BASE, capacity, cell, "test ring")

    @invariant()
    def published_slots_carry_their_marks(self) -> None:
        """What the compiled consumers watch: each published, unconsumed slot's `seq` is the tail that covers it."""
        if not hasattr(self, "model"):
            return
        tail = (self.start + self.produced) & U32
        for back in range(1, len(self.model) + 1):
            index = (tail - back) & U32
            seq = struct.unpack_from("<I", self.buf, self._cell_at(index) + SEQ_AT)[0]
            assert seq == publish_mark((index + 1) & U32)


class StagingMachine(_QueueMachine):
    data_offset = 4096
    cell_choices = (64, 4096)

    def build(self, words: memoryview, capacity: int, cell: int) -> StagingArena:
        return StagingArena(words, BASE, cell, capacity, "test staging")


TestRingModel = RingMachine.TestCase
TestRingModel.settings = MACHINE_SETTINGS
TestStagingModel = StagingMachine.TestCase
TestStagingModel.settings = MACHINE_SETTINGS


def _pair(kind: str, capacity: int, start_head: int, start_tail: int) -> tuple[bytearray, Ring | StagingArena,
                                                                               Ring | StagingArena]:
    data = 128 if kind == "ring" else 4096
    buf = bytearray(BASE + data + capacity * 64 + 64)
    struct.pack_into("<I", buf, BASE, start_head)
    struct.pack_into("<I", buf, BASE + 64, start_tail)
    words = memoryview(buf).cast("I")
    make = (lambda: Ring(words, BASE, capacity, 64, "r")) if kind == "ring" else \
        (lambda: StagingArena(words, BASE, 64, capacity, "s"))
    return buf, make(), make()


@pytest.mark.parametrize("kind", ["ring", "staging"])
def test_wraps_cleanly_across_two_to_the_32(kind: str) -> None:
    capacity = 8
    buf, producer, consumer = _pair(kind, capacity, 0xFFFFFFFA, 0xFFFFFFFA)
    seen = []
    for i in range(40):
        for _ in range(3):
            offset = producer.writable()
            assert offset is not None
            buf[offset:offset + 4] = i.to_bytes(4, "little")
            producer.publish()
            i += 1000
        for _ in range(3):
            offset = consumer.readable()
            assert offset is not None
            seen.append(int.from_bytes(buf[offset:offset + 4], "little"))
            consumer.release()
        assert consumer.readable() is None
    assert seen == [i + k * 1000 for i in range(40) for k in range(3)]
    assert producer.snapshot() == ((0xFFFFFFFA + 120) & U32,) * 2  # the counters did wrap


@pytest.mark.parametrize("kind", ["ring", "staging"])
def test_full_and_empty_at_the_wrap(kind: str) -> None:
    capacity = 4
    buf, producer, consumer = _pair(kind, capacity, 0xFFFFFFFE, 0xFFFFFFFE)
    assert consumer.readable() is None
    for _ in range(capacity):
        assert producer.writable() is not None
        producer.publish()
    assert producer.writable() is None  # tail - head == capacity (mod 2**32): full
    assert producer.snapshot() == (0xFFFFFFFE, 2)
    consumer.release()
    assert producer.writable() is not None


@settings(max_examples=200, deadline=None, database=None)
@given(kind=st.sampled_from(["ring", "staging"]), capacity=st.sampled_from([2, 8, 64, 4096]),
       head=st.integers(0, U32), excess=st.integers(1, U32))
def test_impossible_indices_raise_channel_corrupt(kind: str, capacity: int, head: int, excess: int) -> None:
    """tail - head > capacity (mod 2**32), whichever side reads it: ChannelCorrupt, never an index."""
    fill = capacity + excess
    if fill > U32:
        fill = U32
    tail = (head + fill) & U32
    data = 128 if kind == "ring" else 4096
    buf = bytearray(BASE + data + 64 * 2 + 64)  # far too small for `capacity` cells: any indexing would show
    words = memoryview(buf).cast("I")
    struct.pack_into("<I", buf, BASE, head)
    struct.pack_into("<I", buf, BASE + 64, tail)
    before = bytes(buf)
    make = (lambda: Ring(words, BASE, capacity, 64, "peer")) if kind == "ring" else \
        (lambda: StagingArena(words, BASE, 64, capacity, "peer"))
    consumer = make()
    with pytest.raises(ChannelCorrupt, match="peer"):
        consumer.readable()
    producer = make()
    with pytest.raises(ChannelCorrupt, match="peer"):
        producer.writable()
    assert bytes(buf) == before


@pytest.mark.parametrize("kind", ["ring", "staging"])
def test_a_peer_index_that_jumps_mid_stream_is_caught(kind: str) -> None:
    buf, producer, consumer = _pair(kind, 8, 0xFFFFFFF0, 0xFFFFFFF0)
    for _ in range(3):
        producer.writable()
        producer.publish()
    # the producer's peer (the consumer) claims to have released more than was ever published
    struct.pack_into("<I", buf, BASE, (0xFFFFFFF0 + 5) & U32)
    with pytest.raises(ChannelCorrupt):
        producer.writable()
    # the consumer's peer (the producer) claims to have published 9 more than the consumer has read
    buf2, producer2, consumer2 = _pair(kind, 8, 0xFFFFFFF0, 0xFFFFFFF0)
    struct.pack_into("<I", buf2, BASE + 64, (0xFFFFFFF0 + 9) & U32)
    with pytest.raises(ChannelCorrupt):
        consumer2.readable()


def test_reset_owned_zeroes_only_the_own_index() -> None:
    buf, producer, consumer = _pair("ring", 8, 0xFFFFFFF0, 0xFFFFFFF3)
    producer.reset_owned("producer")
    assert struct.unpack_from("<II", buf, BASE)[0] == 0xFFFFFFF0  # head untouched
    assert struct.unpack_from("<I", buf, BASE + 64) == (0,)
    consumer.reset_owned("consumer")
    assert producer.snapshot() == (0, 0)
    consumer.resync()
    assert consumer.readable() is None


def test_a_producers_reset_zeroes_its_slots_marks() -> None:
    """A ring reset for a new session leaves no slot that reads as published to a consumer watching marks (a slot of
    the earlier session with index k carries the mark the new session's index k will)."""
    buf, producer, consumer = _pair("ring", 8, 0, 0)
    for _ in range(3):
        assert producer.writable() is not None
        producer.publish()
    marks = [struct.unpack_from("<I", buf, BASE + 128 + k * 64 + SEQ_AT)[0] for k in range(8)]
    assert marks == [publish_mark(1), publish_mark(2), publish_mark(3)] + [0] * 5
    buf[BASE + 128 + 7 * 64 + SEQ_AT] = 0x5A  # whatever an earlier session left
    producer.reset_owned("producer")
    assert all(struct.unpack_from("<I", buf, BASE + 128 + k * 64 + SEQ_AT)[0] == 0 for k in range(8))
    assert producer.snapshot()[1] == 0
