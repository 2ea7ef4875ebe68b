"""EVENTS_CREATE, the native driver's event pool's one round trip (host_agent/session/executor.py): the events it makes
are the session's, as cuEventCreate records would make them; a failure to make the first is the driver's own answer;
what a hostile or mistaken guest sends (a count out of range, a short payload, flags the driver refuses, no
context) is refused before any event is made, and never a handler failure. CPU only (the fake driver)."""
from __future__ import annotations

import struct

from host_agent.handler import Reply, Session
from host_agent.session.executor import CudaExecutor
from ivshmem.cuda_status import INVALID_CONTEXT, INVALID_VALUE, SUCCESS
from ivshmem.driver_api import CALLS, EVENTS_CREATE_MAX, EVENTS_CREATE_OPCODE, EVENTS_CREATE_REQUEST
from ivshmem.record import Record, Status
from tests.fake_driver import FakeDriver


def _executor(context: bool = True) -> tuple[CudaExecutor, FakeDriver]:
    fake = FakeDriver()
    fake.cuInit(0)
    executor = CudaExecutor(Session(9, "/dev/shm/orion-events-create", 0, 1), driver=fake)
    for name, args in [("cuInit", (0,))] + ([("cuCtxCreate", (0, 0))] if context else []):
        payload = CALLS[name].request.encode(*args)
        assert executor.handle(Record(1, CALLS[name].opcode, 0, len(payload), 0, 0, payload)).status == SUCCESS
    return executor, fake


def _create(executor: CudaExecutor, payload: bytes) -> Reply:
    return executor.handle(Record(1, EVENTS_CREATE_OPCODE, 0, len(payload), 0, 0, payload))


def test_the_events_made_are_the_sessions_fresh_events() -> None:
    executor, fake = _executor()
    reply = _create(executor, EVENTS_CREATE_REQUEST.encode(2, EVENTS_CREATE_MAX))
    assert reply.status == SUCCESS and len(reply.payload) == 8 * EVENTS_CREATE_MAX
    events = struct.unpack(f"<{EVENTS_CREATE_MAX}Q", bytes(reply.payload))  # type: ignore[arg-type]
    assert len(set(events)) == EVENTS_CREATE_MAX
    assert set(events) <= executor.ledger.handles["CUevent"]  # each may be named by the session's later calls
    assert all(fake.events[e] == {"flags": 2, "recorded": 0, "stream": 0, "capture": 0} for e in events)


def test_what_the_driver_or_the_record_refuses_makes_nothing() -> None:
    executor, fake = _executor()
    assert _create(executor, EVENTS_CREATE_REQUEST.encode(0x10, 4)).status == INVALID_VALUE  # the driver's flags check
    for count in (0, EVENTS_CREATE_MAX + 1, 1 << 31):
        assert _create(executor, EVENTS_CREATE_REQUEST.encode(0, count)).status == Status.MALFORMED
    assert _create(executor, b"\0\0\0").status == Status.MALFORMED
    assert not fake.events
    without, none_made = _executor(context=False)
    assert _create(without, EVENTS_CREATE_REQUEST.encode(0, 4)).status == INVALID_CONTEXT
    assert not none_made.events
