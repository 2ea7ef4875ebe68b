"""A relayed session's end of its connection, as a ring Endpoint to the worker's loop (docs/remote.md).

On the GPU host a relayed session is served by the same loop (session_loop.RecordLoop) and the same handler
(the CUDA executor) as a session on a region; only its records come from a relay connection (a frame stream:
frames.FrameStream on TCP, rdma_stream.RdmaStream on RDMA: a frames.RecordStream) instead of a ring. This adapter
is the session transport the loop drives (handler.RecordEndpoint: `receive`, `send`, the session's `generation` and a
liveness `check`) and the compiled hot path serves (handler.StreamTransport: `compiled_socket`, `heard`).

Liveness: a thread sends BEAT every `beat_s`, and a peer heard from for `dead_s` (any record counts, a BEAT
included) is gone: `receive` (and `check`, which the compiled hot path's wait calls) raises ConnectionLost, which
ends the session as a vanished client ends one on a region.

What the connection carries is counted for oriond's /metrics (agent_metrics.relay_bytes, where it keeps metrics):
the beat thread adds what moved since its last count each beat, and `close` the rest.

Large payloads travel in pieces, as through a ring's staging arena: a request the handler has a sink for (a
host-to-device copy) is read into it CHUNK by CHUNK, and a reply produced piece by piece (Streamed: a
device-to-host copy, FILL) is sent as it is produced, through two buffers and a helper thread, so the connection
and the GPU work overlap and no copy is held whole.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from ivshmem.channel import Payload, Sink, Streamed
from ivshmem.record import Flag, Record
from ivshmem.wait import DEFAULT_POLICY

from .. import agent_metrics
from .frames import BEAT, ConnectionLost, FrameLock, FrameStream, RecordStream

CHUNK = 1 << 20  # a multiple of every producer's block (FILL's pattern repeats every 4 KiB)
LEAD = 4096  # the first piece of a payload in pieces is at least this (a request's fixed part is in it whole)
SINK_ABOVE = 64 << 10  # a request longer than this goes to the handler's sink, when it has one


class StreamEndpoint:
    """A relayed session's transport on its relay connection (handler.StreamTransport)."""

    def __init__(self, frames: RecordStream, generation: int, beat_s: float = 1.0, dead_s: float = 5.0,
                 check: Callable[[], None] | None = None, spin: bool = True) -> None:
        """`spin`: on a FrameStream, a waiting `receive` polls the connection briefly before it sleeps on it (a
        worker serving one session has the CPU to spare; a busy session's next record is read without a wake-up).
        An RdmaStream spins on its completion queue itself."""
        self.frames, self.generation, self.user_check = frames, generation, check
        self.beat_s, self.dead_s = beat_s, dead_s
        self.policy, self._busy = DEFAULT_POLICY, False
        self.spin = spin and isinstance(frames, FrameStream)
        self._heard = time.monotonic()
        self._buffers: tuple[memoryview, memoryview] | None = None  # for payloads in pieces (_pieces)
        self._helper: ThreadPoolExecutor | None = None
        self._stop = threading.Event()
        self.transport = "tcp" if isinstance(frames, FrameStream) else "rdma"
        self._counted = (0, 0) if agent_metrics.enabled() else None  # bytes (sent, received) counted so far
        self._beater = threading.Thread(target=self._beat, name="relay-beat", daemon=True)
        self._beater.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.beat_s):
            self._count_bytes()
            try:
                self.frames.send(0, BEAT)
            except ConnectionLost:
                return  # the reader sees the end of the stream, or the silence

    def _count_bytes(self) -> None:
        """Add what the connection moved since the last count to oriond's /metrics (where it keeps metrics)."""
        if self._counted is None:
            return
        moved = self.frames.moved()
        agent_metrics.relay_bytes(self.transport, moved[0] - self._counted[0], moved[1] - self._counted[1])
        self._counted = moved

    def compiled_socket(self) -> tuple[int, FrameLock] | None:
        """handler.StreamTransport: the connection's socket and write lock where compiled code may serve it."""
        return self.frames.compiled_socket()

    def heard(self, when: float) -> None:
        """The peer was heard from at `when` (time.monotonic()) by a reader other than `receive` (compiled code)."""
        self._heard = max(self._heard, when)

    def check(self) -> None:
        """ConnectionLost when the peer has been silent for `dead_s`; then the owner's own check, if any."""
        if time.monotonic() - self._heard > self.dead_s:
            raise ConnectionLost(f"the relay peer has been silent for {self.dead_s:g} s")
        if self.user_check is not None:
            self.user_check()

    def next(self, wait: bool = True) -> Record | None:
        """The header of the next record other than a BEAT (payload empty), or None when `wait` is false and none
        is there: its `length` bytes are then the caller's to read, with frames.read_payload. ConnectionLost when
        the peer is gone."""
        timeout = min(self.beat_s, self.dead_s) if wait else 0
        started = time.monotonic()
        while True:
            record = self._poll() if wait and self.spin else None
            if record is None:
                record = self.frames.begin(timeout=timeout)
            if record is None:
                self.check()
                if not wait:
                    return None
                continue
            self._heard = time.monotonic()
            self._busy = self._heard - started < self.policy.busy_spin_s
            if record.opcode != BEAT:
                return record
            if record.length:
                self._read(record.length, lambda piece: None)

    def receive(self, sink: Sink | None = None, wait: bool = True,
                sink_for: Callable[[int, int, int], Sink | None] | None = None) -> Record | None:
        """The next record other than a BEAT, or None when `wait` is false and none is there. A long payload goes to
        `sink` (or what `sink_for(call_id, opcode, length)` gives) in pieces, as from a ring's staging arena (the
        record's payload is then empty and its flags say STAGED); otherwise it is whole. ConnectionLost when the
        peer is gone."""
        record = self.next(wait)
        if record is None:
            return None
        if record.length > SINK_ABOVE:
            target = sink or (sink_for(record.call_id, record.opcode, record.length) if sink_for else None)
            if target is not None:
                self._read(record.length, target)
                return record._replace(flags=record.flags | Flag.STAGED)  # as a ring says a payload went to a sink
        payload = bytearray(record.length)
        self.frames.read_payload(memoryview(payload))
        return record._replace(payload=payload)

    def _poll(self) -> Record | None:
        """A record that arrives while spinning (the ring's wait policy: spin_s, busy_spin_s after a short wait),
        so a busy session's next record is taken without a sleep and a wake-up on the socket."""
        spin = self.policy.busy_spin_s if self._busy else self.policy.spin_s
        receive = self.frames.begin
        deadline = time.monotonic() + spin
        while time.monotonic() < deadline:
            record = receive(timeout=0)
            if record is not None:
                return record
        return None

    def _pieces(self, length: int, first: int, produce: Callable[[memoryview], None],
                consume: Callable[[memoryview], None], aside: str) -> None:
        """Move `length` bytes in pieces (`first` bytes, then CHUNKs) through two buffers, `produce` filling one
        while `consume` takes the other, in order, so the socket and the GPU work overlap. The helper thread runs the
        socket's side (`aside`: "consume" when sending, "produce" when reading): the driver's side stays on this
        thread, whose CUDA context is current. The first failure is raised once the piece in flight is done."""
        if self._buffers is None or self._helper is None:
            self._buffers = (memoryview(bytearray(CHUNK + LEAD)), memoryview(bytearray(CHUNK + LEAD)))
            self._helper = ThreadPoolExecutor(1, thread_name_prefix="relay-pieces")
        helper, buffers = self._helper, self._buffers
        sizes = [first, *(min(CHUNK, length - at) for at in range(first, length, CHUNK))] if length else []
        pieces = [buffers[i % 2][:size] for i, size in enumerate(sizes)]
        in_flight: Future[None] | None = None
        try:
            if aside == "consume":
                for piece in pieces:
                    produce(piece)  # the other buffer's consume may still run: this one's finished two pieces ago
                    if in_flight is not None:
                        in_flight.result()
                    in_flight = helper.submit(consume, piece)
            else:
                for i, piece in enumerate(pieces):
                    if i == 0:
                        helper.submit(produce, piece).result()
                    elif in_flight is not None:
                        in_flight.result()
                    in_flight = helper.submit(produce, pieces[i + 1]) if i + 1 < len(pieces) else None
                    consume(piece)
        finally:
            if in_flight is not None:
                in_flight.result()

    def _read(self, length: int, sink: Sink) -> None:
        """Read `length` payload bytes into `sink`: the first piece what is over whole CHUNKs (at least LEAD bytes,
        so a request's fixed part is whole in it), then whole CHUNKs, so a copy's data goes in aligned pieces."""
        first = length % CHUNK
        if first < LEAD:
            first = min(length, first + CHUNK)
        self._pieces(length, first, self.frames.read_payload, sink, aside="produce")

    def send(self, call_id: int, opcode: int, flags: int = 0, payload: Payload = b"", status: int = 0) -> None:
        if not isinstance(payload, Streamed):
            self.frames.send(call_id, opcode, payload, flags=flags, status=status, generation=self.generation)
            return
        writer = self.frames.open_frame(call_id, opcode, payload.length, flags, status, self.generation)
        try:
            self._pieces(payload.length, min(CHUNK, payload.length), payload.fill, writer.write, aside="consume")
        finally:
            writer.close()

    def close(self) -> None:
        self._stop.set()
        self._beater.join(self.beat_s + 1)
        self._count_bytes()
        if self._helper is not None:
            self._helper.shutdown(wait=True)
