"""The device attributes that say what a device can share with another process answer what the session can share
(host_agent/session/executor.py, `_device_attribute`), so a program that asks before it shares (CUDA's samples, NCCL
choosing its handle type) takes another path rather than meeting NOT_SUPPORTED, or waiting for a handle that never
comes, later. No session can export a memory pool or fabric memory: those attributes answer 0 everywhere. A local
session exports cuMem memory as a POSIX descriptor and events by IPC (docs/multi-gpu.md): the GPU's own answers; a
relayed one cannot: 0. Every other attribute, and a device the session lacks, is the driver's answer. CPU only (the
fake driver answers these as the H200 did)."""
from __future__ import annotations

import pytest

from host_agent.handler import Session
from host_agent.session.executor import CudaExecutor
from ivshmem.cuda_status import INVALID_DEVICE, SUCCESS
from ivshmem.driver_api import CALLS
from ivshmem.record import Record
from tests.fake_driver import H100_ATTRIBUTES, FakeDriver

POSIX_FD, MEMPOOL_HANDLE_TYPES, IPC_EVENT, FABRIC, VMM = 103, 119, 125, 128, 102


def _attribute(region: str, attribute: int, device: int = 0) -> tuple[int, int | None]:
    fake = FakeDriver()
    fake.cuInit(0)
    executor = CudaExecutor(Session(3, region, 0, 1), driver=fake)
    call = CALLS["cuDeviceGetAttribute"]
    payload = call.request.encode(attribute, device)
    reply = executor.handle(Record(1, call.opcode, 0, len(payload), 0, 0, payload))
    value = call.outputs.unpack(bytes(reply.payload))[0] if reply.status == SUCCESS else None  # type: ignore[arg-type]
    return int(reply.status), value


@pytest.mark.parametrize(("region", "expected"), [
    ("/dev/shm/orion-sharing", {POSIX_FD: 1, MEMPOOL_HANDLE_TYPES: 0, IPC_EVENT: 1, FABRIC: 0, VMM: 1}),
    ("relay 10.0.0.7:9960", {POSIX_FD: 0, MEMPOOL_HANDLE_TYPES: 0, IPC_EVENT: 0, FABRIC: 0, VMM: 1}),
])
def test_a_session_reports_the_sharing_it_can_do(region: str, expected: dict[int, int]) -> None:
    assert all(H100_ATTRIBUTES[a] for a in expected)  # the GPU says yes to each: an answer of 0 is the session's
    assert {a: _attribute(region, a) for a in expected} == {a: (SUCCESS, v) for a, v in expected.items()}


def test_a_device_the_session_lacks_is_the_drivers_answer() -> None:
    assert _attribute("relay 10.0.0.7:9960", POSIX_FD, device=7) == (INVALID_DEVICE, None)
