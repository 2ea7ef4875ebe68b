"""Every opcode the executor answers, sent with a payload of the wrong size, gets an error status with a one-line
reason — never HANDLER_FAILED (−4), which is what an exception escaping a handler becomes, with a traceback in
oriond's log.

Through the forwarding rig (tests/forwarding_rig.py): raw records on a real channel to a real executor over the
fake driver, after the session made a context, a stream, memory and a module, so that the checks behind the
size checks are reached too.
"""
from __future__ import annotations

import struct

import pytest

from ivshmem.driver_api import CALLS, PINNED_COPIES, PINNED_COPY, POOL_MAP_OPCODE
from ivshmem.record import Op, Status
from tests import forwarding_rig
from tests.forwarding_rig import Rig
from tests.unit.test_forwarding_roundtrip import kernel_ptx

bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures

SUCCESS = 0
SIZES = (0, 7, 9, 16)


class Session:
    """A guest session that made a context, a stream, memory, a module and its function: handles that pass the
    executor's ownership checks, so that a payload's size is what is tested."""

    def __init__(self, rig: Rig) -> None:
        self.g = g = rig.guest()
        self.context = g.setup()
        self.stream = g.ok("cuStreamCreate", 0)
        self.pointer = g.alloc(4096)
        status, self.module = g.load_module(kernel_ptx() + b"\0")
        assert status == SUCCESS
        status, (self.function,) = g.by_name("cuModuleGetFunction", self.module, b"mix")
        assert status == SUCCESS
        self.channel = g.channel

    def payloads(self) -> list[bytes]:
        """Zeros and 0xff bytes of each size; each owned handle followed by 1 or 8 bytes, or cut to 7."""
        out = [bytes([fill]) * size for size in SIZES for fill in (0x00, 0xFF)]
        for value in (self.context, self.stream, self.pointer, self.module, self.function):
            packed = struct.pack("<Q", value)
            out += [packed[:7], packed + b"\xff", packed + bytes(8)]
        return out


@pytest.mark.parametrize("size", SIZES)
def test_pool_map_with_a_payload_that_is_not_8_bytes_is_malformed(rig: Rig, size: int,
                                                                   capfd: pytest.CaptureFixture[str]) -> None:
    session = Session(rig)
    reply = session.channel.call(POOL_MAP_OPCODE, bytes(range(size)))
    assert reply.status == Status.MALFORMED
    reason = bytes(reply.payload).decode()
    assert reason.startswith("POOL_MAP: ") and "\n" not in reason  # what the declared schema says is wrong
    assert (f"payload of {size} bytes is shorter than its 8 fixed bytes" in reason if size < 8
            else f"{size - 8} unexpected bytes" in reason)
    assert session.g.call("cuDriverGetVersion")[0] == SUCCESS  # the session goes on
    assert "Traceback" not in capfd.readouterr().err


def test_agent_info_and_bind_of_the_wrong_shape_are_malformed(rig: Rig) -> None:
    channel = Session(rig).channel
    assert channel.call(Op.AGENT_INFO, b"").status == SUCCESS
    for size in SIZES[1:]:
        assert channel.call(Op.AGENT_INFO, bytes(size)).status == Status.MALFORMED
        assert channel.call(Op.BIND, bytes(size)).status in (Status.MALFORMED, Status.REFUSED)
    assert channel.call(Op.BIND, b"").status == Status.MALFORMED


def test_no_opcode_fails_in_its_handler_on_a_payload_of_the_wrong_size(rig: Rig) -> None:
    """Session.payloads() to every wire opcode, every forwarded call (pinned variants too) and POOL_MAP: each
    answer is a status, none is HANDLER_FAILED."""
    session = Session(rig)
    channel = session.channel
    opcodes = [int(op) for op in Op] + [POOL_MAP_OPCODE]
    opcodes += [call.opcode for call in CALLS.values() if not call.answered_in_guest]
    opcodes += [CALLS[name].opcode | PINNED_COPY for name in PINNED_COPIES]
    failed = []
    for opcode in opcodes:
        for payload in session.payloads():
            reply = channel.call(opcode, payload)
            if reply.status == Status.HANDLER_FAILED:
                failed.append((hex(opcode), payload.hex(), bytes(reply.payload).decode(errors="replace")))
    assert not failed, failed
    assert channel.call(Op.ECHO, b"still here").payload == b"still here"
