"""A relayed session's end of its connection, as a ring Endpoint to the worker's loop (docs/remote.md).

On the GPU host a relayed session is served by the same loop (region_server.RecordLoop) and the same handler
(the CUDA executor) as a session on a region; only its records come from a relay connection (relay_frames.py)
instead of a ring. This adapter gives the loop what it uses of a ring Endpoint: `receive`, `send`, the
session's `generation` and a liveness `check`.

Liveness: a thread sends BEAT every `beat_s`, and a peer heard from for `dead_s` (any record counts, a BEAT
included) is gone: `receive` raises ConnectionLost, which ends the session as a vanished client ends one on a
region. A reply produced piece by piece (Streamed: FILL, a device-to-host copy) is produced into one buffer in
steps of CHUNK, then sent as one frame (a stream has no staging arena).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ivshmem.channel import Payload, Sink, Streamed
from ivshmem.record import Record

from .relay_frames import BEAT, ConnectionLost, FrameStream

CHUNK = 1 << 20  # a multiple of every producer's block (FILL's pattern repeats every 4 KiB)


class StreamEndpoint:
    def __init__(self, frames: FrameStream, generation: int, beat_s: float = 1.0, dead_s: float = 5.0,
                 check: Callable[[], None] | None = None) -> None:
        self.frames, self.generation, self.check = frames, generation, check
        self.beat_s, self.dead_s = beat_s, dead_s
        self._heard = time.monotonic()
        self._stop = threading.Event()
        self._beater = threading.Thread(target=self._beat, name="relay-beat", daemon=True)
        self._beater.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.beat_s):
            try:
                self.frames.send(0, BEAT)
            except ConnectionLost:
                return  # the reader sees the end of the stream, or the silence

    def receive(self, sink: Sink | None = None, wait: bool = True,
                sink_for: Callable[[int, int, int], Sink | None] | None = None) -> Record | None:
        """The next record other than a BEAT (its payload always whole: `sink` and `sink_for` are not needed on a
        stream), or None when `wait` is false and none is there. ConnectionLost when the peer is gone."""
        while True:
            record = self.frames.receive(timeout=min(self.beat_s, self.dead_s) if wait else 0)
            now = time.monotonic()
            if record is None:
                if now - self._heard > self.dead_s:
                    raise ConnectionLost(f"the relay peer has been silent for {self.dead_s:g} s")
                if self.check is not None:
                    self.check()
                if not wait:
                    return None
                continue
            self._heard = now
            if record.opcode != BEAT:
                return record

    def send(self, call_id: int, opcode: int, flags: int = 0, payload: Payload = b"", status: int = 0) -> None:
        if isinstance(payload, Streamed):
            produced = bytearray(payload.length)
            view = memoryview(produced)
            for start in range(0, payload.length, CHUNK):
                payload.fill(view[start:start + CHUNK])
            payload = produced
        self.frames.send(call_id, opcode, payload, flags=flags, status=status, generation=self.generation)

    def close(self) -> None:
        self._stop.set()
        self._beater.join(self.beat_s + 1)
