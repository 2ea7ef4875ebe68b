"""The JIT linker as the host serves it (host_agent/session/link_calls.py), against the fake driver: a link state is the
session's own handle, checked before the driver; hostile payloads are wire errors; cuLinkComplete's cubin comes back
whole, or, past the guest's buffer, as its size first and then from the cubin the driver holds. CPU only."""
from __future__ import annotations

import struct

from host_agent.handler import Session
from host_agent.session.executor import CudaExecutor
from ivshmem.cuda_status import INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED, SUCCESS
from ivshmem.driver_api import CALLS
from ivshmem.record import Record, Status
from tests.fake_driver import FakeDriver, fake_cubin

OPT_LEVEL, THREADS_PER_BLOCK, TARGET = 7, 1, 9
PTX, CUBIN = 1, 0


def _call(executor: CudaExecutor, name: str, payload: bytes) -> tuple[int, bytes]:
    reply = executor.handle(Record(1, CALLS[name].opcode, 0, len(payload), 0, 0, payload))
    return int(reply.status), bytes(reply.payload)  # type: ignore[arg-type]


def _session(fake: FakeDriver, number: int) -> CudaExecutor:
    fake.cuInit(0)
    executor = CudaExecutor(Session(number, f"/dev/shm/orion-link-{number}", 0, 1), driver=fake)
    assert _call(executor, "cuInit", CALLS["cuInit"].request.encode(0))[0] == SUCCESS
    status, reply = _call(executor, "cuDevicePrimaryCtxRetain", CALLS["cuDevicePrimaryCtxRetain"].request.encode(0))
    assert status == SUCCESS
    (context,) = CALLS["cuDevicePrimaryCtxRetain"].reply.decode(reply)
    assert _call(executor, "cuCtxSetCurrent", CALLS["cuCtxSetCurrent"].request.encode(context))[0] == SUCCESS
    return executor


def _create(executor: CudaExecutor, options: list[tuple[int, int]] | None = None) -> int:
    status, reply = _call(executor, "cuLinkCreate", CALLS["cuLinkCreate"].request.encode(options or []))
    assert status == SUCCESS
    return int(CALLS["cuLinkCreate"].reply.decode(reply)[0])


def _add(executor: CudaExecutor, state: int, kind: int, data: bytes, name: bytes = b"",
         options: list[tuple[int, int]] | None = None) -> int:
    return _call(executor, "cuLinkAddData", CALLS["cuLinkAddData"].request.encode(state, kind, options or [], name,
                                                                                   data))[0]


def _complete(executor: CudaExecutor, state: int, capacity: int) -> tuple[int, int, bytes]:
    status, reply = _call(executor, "cuLinkComplete", CALLS["cuLinkComplete"].request.encode(state, capacity))
    if status != SUCCESS:
        return status, 0, b""
    size, cubin = CALLS["cuLinkComplete"].reply.decode(reply)
    return status, size, bytes(cubin)


def _destroy(executor: CudaExecutor, state: int) -> int:
    return _call(executor, "cuLinkDestroy", CALLS["cuLinkDestroy"].request.encode(state))[0]


def test_inputs_link_into_the_cubin_the_driver_made_and_options_reach_it_as_the_wheel_takes_them() -> None:
    fake = FakeDriver()
    executor = _session(fake, 1)
    state = _create(executor, [(OPT_LEVEL, 3)])
    assert fake.calls[-1].args[1] == [fake.CUjit_option(OPT_LEVEL)]
    ptx = b".version 8.0\n.target sm_90\n\0"
    assert _add(executor, state, PTX, ptx, b"a.ptx", [(OPT_LEVEL, 2)]) == SUCCESS
    assert _add(executor, state, CUBIN, b"\x7fELF-ish") == SUCCESS
    expected = fake_cubin([(PTX, b"a.ptx", ptx), (CUBIN, b"", b"\x7fELF-ish")])
    assert _complete(executor, state, 1 << 20) == (SUCCESS, len(expected), expected)
    assert _complete(executor, state, 1 << 20)[0] == INVALID_VALUE  # the fake's: complete twice
    assert _destroy(executor, state) == SUCCESS
    destroys = sum(1 for c in fake.calls if c.name == "cuLinkDestroy")
    assert _destroy(executor, state) == INVALID_HANDLE  # the ledger's: the driver is not asked again
    assert sum(1 for c in fake.calls if c.name == "cuLinkDestroy") == destroys


def test_a_cubin_past_the_guests_buffer_comes_as_its_size_then_whole_without_linking_twice() -> None:
    fake = FakeDriver()
    executor = _session(fake, 2)
    state = _create(executor)
    data = bytes(range(256)) * 40
    assert _add(executor, state, CUBIN, data, b"big") == SUCCESS
    expected = fake_cubin([(CUBIN, b"big", data)])
    assert _complete(executor, state, 100) == (SUCCESS, len(expected), b"")
    assert _complete(executor, state, len(expected)) == (SUCCESS, len(expected), expected)
    assert sum(1 for c in fake.calls if c.name == "cuLinkComplete") == 1
    assert _destroy(executor, state) == SUCCESS


def test_another_sessions_link_state_is_refused_before_the_driver() -> None:
    fake = FakeDriver()
    owner, other = _session(fake, 3), _session(fake, 4)
    state = _create(owner)
    assert _add(owner, state, CUBIN, b"x") == SUCCESS
    before = len(fake.calls)
    assert _add(other, state, CUBIN, b"y") == INVALID_HANDLE
    assert _complete(other, state, 1 << 20)[0] == INVALID_HANDLE
    assert _destroy(other, state) == INVALID_HANDLE
    assert _add(other, 0xDEAD0, CUBIN, b"y") == INVALID_HANDLE
    assert len(fake.calls) == before  # nothing reached the driver
    assert _complete(owner, state, 1 << 20)[0] == SUCCESS


def test_options_and_inputs_the_host_cannot_take_and_malformed_payloads() -> None:
    fake = FakeDriver()
    executor = _session(fake, 5)
    refused = _call(executor, "cuLinkCreate", CALLS["cuLinkCreate"].request.encode([(THREADS_PER_BLOCK, 64)]))
    assert refused[0] == NOT_SUPPORTED  # not a scalar option the table carries
    assert _call(executor, "cuLinkCreate", CALLS["cuLinkCreate"].request.encode([(TARGET, 12345)]))[0] == INVALID_VALUE
    state = _create(executor)
    assert _add(executor, state, 6, b"x") == INVALID_VALUE  # CU_JIT_NUM_INPUT_TYPES: no input type
    assert _add(executor, state, CUBIN, b"x", b"a\0b") == INVALID_VALUE  # a name with a NUL in it
    for name, payload in [("cuLinkCreate", struct.pack("<I", 5)),  # five pairs announced, none sent
                          ("cuLinkAddData", b"\x01\x02"),
                          ("cuLinkAddData", struct.pack("<QiI", state, 0, 1)),
                          ("cuLinkComplete", struct.pack("<Q", state))]:
        assert _call(executor, name, payload)[0] == Status.MALFORMED, name
