"""A call cuda-bindings has and the host's driver lacks (an entry point newer than the driver: cuda-bindings raises
RuntimeError 'Function "X" not found', measured on the H200 with driver 580 for cuGraphNodeGetParams) answers
CUDA_ERROR_NOT_SUPPORTED, as an older driver would, named once in the log: never a handler failure (a wire error the
guest reads as CUDA_ERROR_UNKNOWN). Generic and hand-written calls alike. CPU only (the fake driver)."""
from __future__ import annotations

import logging
from typing import Any

import pytest

from host_agent.handler import Session
from host_agent.session.executor import CudaExecutor
from ivshmem.cuda_status import NOT_SUPPORTED
from ivshmem.driver_api import CALLS
from ivshmem.record import Record
from tests.fake_driver import FakeDriver


def _missing(name: str) -> Any:
    def call(*_args: Any) -> Any:
        raise RuntimeError(f'Function "{name}" not found')
    return call


def _request(executor: CudaExecutor, name: str, payload: bytes) -> int:
    reply = executor.handle(Record(1, CALLS[name].opcode, 0, len(payload), 0, 0, payload))
    return int(reply.status)


@pytest.mark.parametrize("name", ["cuGraphCreate", "cuGraphNodeGetParams"])  # generic, hand-written
def test_an_entry_point_the_hosts_driver_lacks_answers_not_supported_named_once(
        name: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeDriver()
    fake.cuInit(0)
    executor = CudaExecutor(Session(7, "/dev/shm/orion-missing-entry", 0, 1), driver=fake)
    assert _request(executor, "cuInit", CALLS["cuInit"].request.encode(0)) == 0
    assert _request(executor, "cuDevicePrimaryCtxRetain", CALLS["cuDevicePrimaryCtxRetain"].request.encode(0)) == 0
    monkeypatch.setattr(fake, name, _missing(name))
    if name == "cuGraphCreate":
        payload = CALLS[name].request.encode(0)
    else:  # a node of the session's own graph, so the host gets as far as the driver
        graph = fake.cuGraphCreate(0)[1]
        node = fake.cuGraphAddEmptyNode(graph, None, 0)[1]
        executor.ledger.handles["CUgraphNode"].add(int(node))
        payload = CALLS[name].request.encode(int(node))
    with caplog.at_level(logging.INFO, logger="host_agent.session.executor"):
        assert [_request(executor, name, payload) for _ in range(2)] == [NOT_SUPPORTED, NOT_SUPPORTED]
    said = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(said) == 1 and "no such entry point" in said[0], said


def test_a_pool_attribute_the_hosts_bindings_cannot_carry_answers_not_supported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """cuda-bindings 13.3's value helper refuses some pool attributes in Python (TypeError: MAX_POOL_SIZE, the
    location attributes; measured on the H200) before any driver call: 801, not a handler failure."""
    fake = FakeDriver()
    fake.cuInit(0)
    executor = CudaExecutor(Session(8, "/dev/shm/orion-missing-attribute", 0, 1), driver=fake)
    assert _request(executor, "cuInit", CALLS["cuInit"].request.encode(0)) == 0
    assert _request(executor, "cuDevicePrimaryCtxRetain", CALLS["cuDevicePrimaryCtxRetain"].request.encode(0)) == 0
    pool = int(fake.cuDeviceGetDefaultMemPool(0)[1])
    executor.ledger.handles["CUmemoryPool"].add(pool)

    def refused(*_args: Any) -> Any:
        raise TypeError("Unsupported attribute: CU_MEMPOOL_ATTR_MAX_POOL_SIZE")
    monkeypatch.setattr(fake, "cuMemPoolGetAttribute", refused)
    monkeypatch.setattr(fake, "cuMemPoolSetAttribute", refused)
    get, put = CALLS["cuMemPoolGetAttribute"], CALLS["cuMemPoolSetAttribute"]
    assert _request(executor, get.name, get.request.encode(pool, 8)) == NOT_SUPPORTED
    assert _request(executor, put.name, put.request.encode(pool, 8, 1 << 20)) == NOT_SUPPORTED
