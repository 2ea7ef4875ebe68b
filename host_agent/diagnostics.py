"""The wire-control opcodes every session answers: HELLO, ECHO, NOP, DRAIN and FILL.

They let a client (and `orion-guest probe`, the tests and the benchmark) check a region end to end without
a GPU: DRAIN consumes a staged payload chunk by chunk as a host-to-device copy would, FILL produces one
straight into the staging chunks as a device-to-host copy would.
"""
from __future__ import annotations

import zlib

from ivshmem.channel import Sink, Streamed
from ivshmem.errors import RecordError
from ivshmem.record import (
    DRAIN_REPLY,
    FILL_REQUEST,
    HELLO_REPLY,
    HELLO_REQUEST,
    PROTOCOL,
    Flag,
    Op,
    Record,
    Status,
    fill_pattern,
)

from .handler import Reply, Session, refused

AGENT_NAME = "orion-vgpu host agent"
_DRAIN = int(Op.DRAIN)
__all__ = ["DiagnosticsHandler", "fill_pattern"]


class DiagnosticsHandler:
    # The digest of the forwarded-call table this handler serves (driver_api.table_digest()); "" for the wire
    # alone. A client whose HELLO names another table is refused (CudaExecutor sets it).
    call_table = ""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._drained = (0, 0)
        self._serve = {int(Op.ECHO): self._echo, int(Op.NOP): self._nop, int(Op.DRAIN): self._drain,
                       int(Op.FILL): self._fill, int(Op.HELLO): self._hello}

    def sink_for(self, opcode: int, length: int) -> Sink | None:
        if opcode != _DRAIN:
            return None
        self._drained = (0, 0)

        def drain(chunk: memoryview) -> None:
            total, crc = self._drained
            self._drained = (total + len(chunk), zlib.crc32(chunk, crc))
        return drain

    def handle(self, record: Record) -> Reply:
        serve = self._serve.get(record.opcode)
        if serve is None:
            return Reply(Status.UNKNOWN_OPCODE, f"opcode {record.opcode:#x} is not served by this agent".encode())
        return serve(record)

    def _echo(self, record: Record) -> Reply:
        return Reply(0, record.payload)

    def _nop(self, record: Record) -> Reply:
        return _OK

    def _drain(self, record: Record) -> Reply:
        """The length and CRC-32 of what was drained: counted by the sink as it went (a staged payload, its record
        then empty), else of the payload itself (inline, or staged but read whole: a relaying oriond's opening
        reads a session's records whole, since it may have to forward them)."""
        if record.payload or not record.flags & Flag.STAGED:
            self._drained = (len(record.payload), zlib.crc32(record.payload))
        total, crc = self._drained
        return Reply(0, DRAIN_REPLY.encode(total, crc))

    def _fill(self, record: Record) -> Reply:
        length, seed = FILL_REQUEST.decode(record.payload)
        if length > 1 << 30:
            raise RecordError(f"FILL of {length} bytes exceeds 1 GiB", Status.TOO_LARGE)
        return Reply(0, _streamed_pattern(length, seed))

    def _hello(self, record: Record) -> Reply:
        """Refuse, in one line that says what to do, a client of another wire protocol or call table."""
        protocol = int.from_bytes(bytes(record.payload[:4]), "little")  # read first: older HELLOs differ after it
        if protocol != PROTOCOL:
            return refused(f"the client speaks wire protocol {protocol}, this agent {PROTOCOL}: install the "
                           f"orion-guest of the same release as oriond")
        _protocol, _pid, _host, calls = HELLO_REQUEST.decode(record.payload)
        if calls and calls != self.call_table:
            mine = f"table {self.call_table}" if self.call_table else "none (it runs the wire alone)"
            return refused(f"the client forwards CUDA calls by call table {calls[:32]!r}; this agent serves "
                           f"{mine}: install the orion-guest of the same release as oriond")
        return Reply(0, HELLO_REPLY.encode(AGENT_NAME, self.session.number))


_OK = Reply(0)


def _streamed_pattern(length: int, seed: int) -> Streamed:
    """FILL's reply, produced straight into the staging chunks: one copy per chunk."""
    cache: dict[int, bytes] = {}

    def fill(chunk: memoryview) -> None:
        size = len(chunk)
        if size not in cache:
            cache[size] = fill_pattern(seed, size)
        chunk[:] = cache[size]
    return Streamed(length, fill)
