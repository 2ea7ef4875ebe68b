"""The 32-byte record header, its flags, wire statuses and the wire-control opcodes.

A record is the unit every transport carries: this header, then `length` payload bytes (inline in a ring
slot, or streamed through a staging arena when it does not fit). CUDA opcodes are numbered from
CUDA_OPCODE_BASE and defined by the CUDA forwarding layer, not here.
"""
from __future__ import annotations

import random
import struct
from enum import IntEnum
from typing import NamedTuple

from .codec import Schema
from .errors import RecordError

HEADER = struct.Struct("<QIIIIiI")
HEADER_FIELDS = ("call_id", "opcode", "flags", "length", "generation", "status", "seq")  # HEADER's, in order
assert HEADER.size == 32
SEQ_AT = 28  # the `seq` word's offset in a record

PROTOCOL = 3  # 2: HELLO names the call table the client forwards with; 3: ring slots carry their publish mark (seq)
# A ring slot's `seq` once its producer has published it: the tail value that covers it, with the top bit set, so
# that a zeroed word (a reset ring, a slot being written) never reads as published. Written after the tail, so a
# consumer that sees the mark sees the tail too (docs/wire-protocol.md, "Ring"). 0 in records on a socket.
SEQ_MARK = 0x80000000
SEQ_INDEX = 0x7FFFFFFF


def publish_mark(tail: int) -> int:
    """The `seq` a slot carries once `tail` (the index after it) publishes it."""
    return SEQ_MARK | (tail & SEQ_INDEX)
CUDA_OPCODE_BASE = 0x100
MAX_OPCODE = 0xFFFF


class Flag:
    """Record flags. Plain ints, not an IntFlag: enum arithmetic costs a microsecond on the hot path."""

    NO_REPLY = 1 << 0
    STAGED = 1 << 1
    ASYNC_ERROR = 1 << 2


KNOWN_FLAGS = Flag.NO_REPLY | Flag.STAGED | Flag.ASYNC_ERROR


class Status(IntEnum):
    """Wire-level statuses are negative; CUDA results (CUresult) are >= 0."""

    OK = 0
    MALFORMED = -1
    UNKNOWN_OPCODE = -2
    TOO_LARGE = -3
    HANDLER_FAILED = -4
    PROTOCOL_VIOLATION = -5
    REFUSED = -6  # a well-formed request the agent will not carry out; the payload says why


class Op(IntEnum):
    HELLO = 1
    ECHO = 2
    NOP = 3
    DRAIN = 4
    FILL = 5
    AGENT_INFO = 6
    BIND = 7
    STATS = 8
    GRANT_SHARE = 9
    GRANT_JOIN = 10


# `calls`: the digest of the forwarded-call table the client speaks (driver_api.table_digest()), "" for a client
# that uses the wire alone (orion-guest probe): an agent serving another table refuses it in one line.
HELLO_REQUEST = Schema("HELLO", ("protocol", "u32"), ("pid", "u32"), ("hostname", "str"), ("calls", "str"))
HELLO_REPLY = Schema("HELLO reply", ("agent", "str"), ("session", "u64"))
AGENT_INFO_REPLY = Schema("AGENT_INFO reply", ("host", "str"), ("controller", "str"))
RELAYING_AGENT = "*"  # AGENT_INFO's host of an oriond with no GPU of its own that relays its sessions (docs/remote.md)
BIND_REQUEST = Schema("BIND", ("allocation", "str"))
BIND_REPLY = Schema("BIND reply", ("vgpus", "u32"), ("memory_mib", "u32"))
# GRANT_SHARE: the token with which the processes this one starts join its grant (ORION_GRANT); GRANT_JOIN sends it,
# and is answered as BIND is (host_agent/session/grant_sharing.py).
GRANT_SHARE_REPLY = Schema("GRANT_SHARE reply", ("token", "str"))
GRANT_JOIN_REQUEST = Schema("GRANT_JOIN", ("token", "str"))
DRAIN_REPLY = Schema("DRAIN reply", ("length", "u64"), ("crc32", "u32"))
# STATS (ORION_STATS): per opcode, the session's records the agent served with its compiled hot path, those it served
# in Python, Python's time for them in nanoseconds, the compiled path's time for its records and the part of it in the
# driver's function (both timed from the session's first STATS on; docs/wire-protocol.md).
# A relaying host adds its own rows after the GPU host's: the guest's opcode with STATS_RELAYED set, the records its
# compiled pump forwarded, those its Python forwarded or answered, Python's time, and two zeros (host_agent/relay).
STATS_REPLY = Schema("STATS reply", ("calls", "[IQQQQQ]"))
STATS_RELAYED = 1 << 31
FILL_REQUEST = Schema("FILL", ("length", "u64"), ("seed", "u32"))
PATTERN_BLOCK = 4096


def fill_pattern(seed: int, length: int) -> bytes:
    """The bytes a FILL reply carries: a 4 KiB block drawn from `seed`, repeated (so any chunk of a
    multiple of 4 KiB starts at a block boundary and can be produced by one copy)."""
    block = random.Random(seed).randbytes(PATTERN_BLOCK)
    return (block * (length // PATTERN_BLOCK + 1))[:length]


class Record(NamedTuple):
    call_id: int
    opcode: int
    flags: int
    length: int
    generation: int
    status: int
    payload: bytes | bytearray = b""  # a bytearray when it was assembled from staging chunks

    @property
    def ok(self) -> bool:
        return self.status == 0


def check_header(fields: tuple[int, ...], capacity: int, max_length: int) -> None:
    """Raise RecordError (with the wire status a reply should carry) if unpacked header fields are invalid."""
    call_id, opcode, flags, length, _generation, _status, _seq = fields  # seq: only a compiled consumer's hint
    if flags & ~KNOWN_FLAGS:
        raise RecordError(f"record {call_id}: unknown flags {flags:#x}")
    if opcode > MAX_OPCODE:
        raise RecordError(f"record {call_id}: opcode {opcode:#x} beyond {MAX_OPCODE:#x}", Status.UNKNOWN_OPCODE)
    if length > max_length:
        raise RecordError(f"record {call_id}: payload of {length} bytes exceeds the {max_length}-byte limit",
                          Status.TOO_LARGE)
    if not flags & Flag.STAGED and length > capacity:
        raise RecordError(f"record {call_id}: inline payload of {length} bytes exceeds the {capacity}-byte slot")
