"""Single-producer/single-consumer rings and staging arenas over shared memory.

Only index arithmetic lives here: what goes in a slot is record.py's business, who waits and how is
wait.py's, where the words are is layout.py's (its offsets are bound once, when a ring is built, so the hot
path does the same arithmetic as with literals). One process writes each index:

| word            | offset in block (layout.py, the header's offsets table) | written by | read by  |
|-----------------|----------------------------------------------------------|------------|----------|
| head            | RING_HEAD, STAGING_HEAD (0)                              | consumer   | producer |
| tail            | RING_TAIL, STAGING_TAIL (64)                             | producer   | consumer |
| slots / chunks  | RING_SLOTS (128) / STAGING_CHUNKS (4096)                 | producer   | consumer |

A ring slot's record also carries its publish mark (record.SEQ_AT, `seq`), stored after the tail: the compiled
consumers (the native guest driver, the host's hot path) watch that word, in the line they read the record from,
instead of the tail's line, so a round trip moves one cache line each way where it moved two. The consumers here
read the tail and leave the mark alone; a producer's reset zeroes the marks with its tail, so a slot of an earlier
generation never reads as published.

Memory ordering: Python has no atomics or fences. Slot bytes are written with memoryview slice assignment
and indices with item assignment on a memoryview cast to 'I', which CPython performs as one aligned 4-byte
memcpy, i.e. one `mov`. x86-64 is TSO: stores are not reordered with older stores and loads not with older
loads, so "write slot, then store tail" on one side and "load tail, then read slot" on the other is enough.
Region.open refuses other architectures. Each side keeps a private copy of the index it owns (it is the
only writer), so the hot path loads one shared word per operation.
"""
from __future__ import annotations

from .errors import ChannelCorrupt
from .layout import RING_HEAD, RING_SLOTS, RING_TAIL, STAGING_CHUNKS, STAGING_HEAD, STAGING_TAIL
from .record import SEQ_AT, SEQ_INDEX, SEQ_MARK

U32 = 0xFFFFFFFF


class _Spsc:
    """Free-running u32 head/tail pair over `capacity` equally sized cells starting at `data`."""

    __slots__ = ("_words", "_head_i", "_tail_i", "data", "cell", "capacity", "mask", "name", "_head", "_tail")

    def __init__(self, words: memoryview, base: int, head: int, tail: int, data: int, cell: int, capacity: int,
                 name: str) -> None:
        self._words = words
        self._head_i = (base + head) >> 2
        self._tail_i = (base + tail) >> 2
        self.data = base + data
        self.cell = cell
        self.capacity = capacity
        self.mask = capacity - 1
        self.name = name
        self.resync()

    def resync(self) -> None:
        """Reload the private index copies from shared memory (after a reset or a reattach)."""
        self._head = self._words[self._head_i]
        self._tail = self._words[self._tail_i]

    def reset_owned(self, side: str) -> None:
        """Zero the index this side writes: 'producer' owns tail, 'consumer' owns head."""
        if side == "producer":
            self._words[self._tail_i] = 0
            self._tail = 0
        else:
            self._words[self._head_i] = 0
            self._head = 0

    def _fill(self, head: int, tail: int) -> int:
        fill = (tail - head) & U32
        if fill > self.capacity:
            raise ChannelCorrupt(f"{self.name}: head {head} and tail {tail} are {fill} apart, "
                                 f"more than its {self.capacity} cells; the peer broke the protocol")
        return fill

    # producer side
    def writable(self) -> int | None:
        """Offset of the next free cell, or None when full."""
        tail = self._tail
        if (tail - self._words[self._head_i]) & U32 >= self.capacity:
            self._fill(self._words[self._head_i], tail)  # raises if the peer wrote nonsense
            return None
        return self.data + (tail & self.mask) * self.cell

    def publish(self) -> None:
        self._tail = (self._tail + 1) & U32
        self._words[self._tail_i] = self._tail

    # consumer side
    def readable(self) -> int | None:
        """Offset of the oldest published cell, or None when empty."""
        head = self._head
        fill = (self._words[self._tail_i] - head) & U32
        if fill == 0:
            return None
        if fill > self.capacity:
            self._fill(head, self._words[self._tail_i])
        return self.data + (head & self.mask) * self.cell

    def release(self) -> None:
        self._head = (self._head + 1) & U32
        self._words[self._head_i] = self._head

    def snapshot(self) -> tuple[int, int]:
        """(head, tail) as currently in shared memory, for inspection."""
        return self._words[self._head_i], self._words[self._tail_i]


class Ring(_Spsc):
    """A ring of `entries` slots of `slot_size` bytes (one record each)."""

    __slots__ = ("_seq_i", "_seq_stride")

    def __init__(self, words: memoryview, base: int, entries: int, slot_size: int, name: str,
                 head: int = RING_HEAD, tail: int = RING_TAIL, slots: int = RING_SLOTS) -> None:
        super().__init__(words, base, head, tail, slots, slot_size, entries, name)
        self._seq_i = (self.data + SEQ_AT) >> 2  # slot 0's mark, in words; slot k's is slot_size/4 * k further
        self._seq_stride = slot_size >> 2

    def reset_owned(self, side: str) -> None:
        if side == "producer":  # the marks first: a consumer that sees the zeroed tail finds no old slot published
            words, first, stride = self._words, self._seq_i, self._seq_stride
            for k in range(self.capacity):
                words[first + k * stride] = 0
        super().reset_owned(side)

    def publish(self) -> None:
        """Store the tail, then the slot's mark: a consumer that sees the mark never finds a tail behind it."""
        slot = self._tail & self.mask
        self._tail = tail = (self._tail + 1) & U32
        self._words[self._tail_i] = tail
        self._words[self._seq_i + slot * self._seq_stride] = SEQ_MARK | (tail & SEQ_INDEX)  # publish_mark(tail)


class StagingArena(_Spsc):
    """A pipe of `count` chunks of `chunk_size` bytes for payloads larger than a slot."""

    def __init__(self, words: memoryview, base: int, chunk_size: int, count: int, name: str,
                 head: int = STAGING_HEAD, tail: int = STAGING_TAIL, chunks: int = STAGING_CHUNKS) -> None:
        super().__init__(words, base, head, tail, chunks, chunk_size, count, name)
