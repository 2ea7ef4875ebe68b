"""The relay's end of a relay connection, for the relay tests (host_agent/relay_*.py): records sent as a relaying
oriond sends them, answers read with the GPU host's BEATs skipped."""
from __future__ import annotations

import os
from typing import Any

from host_agent.relay_frames import BEAT, RELAY_HELLO, RELAY_HELLO_REQUEST, FrameStream
from ivshmem.driver_api import CALLS, table_digest
from ivshmem.record import PROTOCOL, Record


class RelayPeer:
    def __init__(self, frames: FrameStream, generation: int = 0) -> None:
        self.frames = frames
        self.generation = generation  # the GPU host's session's, once an answer has said it

    def hello(self, protocol: int = PROTOCOL, calls: str | None = None, allocation: str = "") -> Record:
        """RELAY_HELLO with this process as the client; its answer (RELAY_ACCEPT, or a refusal from whoever
        refused: the worker answers call 1, a full listener call 0)."""
        self.frames.send(1, RELAY_HELLO, RELAY_HELLO_REQUEST.encode(
            protocol, os.getpid(), "guest", table_digest() if calls is None else calls, allocation, b""))
        return self.answer(None)

    def answer(self, call_id: int | None) -> Record:
        """The next record that is not a BEAT; it must answer `call_id` (None: any)."""
        while True:
            record = self.frames.receive(timeout=10)
            assert record is not None, "no answer within 10 s"
            if record.opcode != BEAT:
                assert call_id is None or record.call_id == call_id, record
                self.generation = record.generation
                return record

    def call(self, call_id: int, name: str, *args: Any) -> Record:
        """A forwarded CUDA call and its answer."""
        call = CALLS[name]
        self.frames.send(call_id, call.opcode, call.request.encode(*args), generation=self.generation)
        return self.answer(call_id)
