"""NVML_QUERY, the GPU host's side (host_agent/session/nvml_queries.py): a session asks about its own GPUs only, by
guest ordinal, and gets the host NVML's answer, or NVML's own error; nothing else reaches NVML. Over the fake driver
and tests/fake_nvml.py's stand-in (links between the fake's GPUs)."""
from __future__ import annotations

from typing import Any

import pytest

from host_agent.session.nvml_queries import NvmlQueries
from ivshmem.driver_api import (
    NVML_FIELD_VALUE,
    NVML_NVLINK_CAPABILITY,
    NVML_NVLINK_REMOTE_PCI,
    NVML_NVLINK_STATE,
    NVML_P2P_STATUS,
    NVML_QUERY_BUS_IDS,
    NVML_QUERY_REPLY,
    NVML_QUERY_REQUEST,
)
from ivshmem.record import Status
from tests.fake_driver import FakeDriver
from tests.fake_nvml import FakeNvml

DEVICES = (2, 0)  # the session's guest ordinals 0 and 1 are the fake's GPUs 2 and 0
SUCCESS, INVALID_ARGUMENT, NOT_SUPPORTED = 0, 2, 3


@pytest.fixture
def driver() -> FakeDriver:
    fake = FakeDriver(devices=3)
    fake.cuInit(0)
    return fake


def ask(queries: NvmlQueries, query: int, device: int, link: int = 0, which: int = 0) -> tuple[Any, ...]:
    reply = queries.answer(NVML_QUERY_REQUEST.encode(query, device, link, which))
    assert reply.status == 0 and len(reply.payload) == NVML_QUERY_REPLY.fixed.size + NVML_QUERY_BUS_IDS
    return NVML_QUERY_REPLY.decode(reply.payload)


def answer(queries: NvmlQueries, query: int, device: int, link: int = 0, which: int = 0) -> tuple[int, int]:
    """NVML's return code and the value."""
    result, _type, value, *_pci = ask(queries, query, device, link, which)
    return result, value


def test_nvlink_answers_are_the_host_nvmls_about_the_physical_gpu(driver: FakeDriver) -> None:
    nvml = FakeNvml(driver)
    queries = NvmlQueries(driver, lambda: DEVICES, lambda _driver: nvml)
    assert answer(queries, NVML_NVLINK_STATE, 0, 1) == (SUCCESS, 1)
    assert nvml.asked[-1] == (2, 1)  # guest 0 is GPU 2
    result, _type, _value, domain, bus, device, device_id, _sub, tail = ask(queries, NVML_NVLINK_REMOTE_PCI, 1, 0)
    ids = bytes(tail)
    far = driver.pci_location(1)  # GPU 0's link 0 leads to GPU 1
    assert (result, domain, bus, device, device_id) == (SUCCESS, *far, 0x233510DE)
    assert ids[:32].rstrip(b"\0").decode() == f"{far[0]:08x}:{far[1]:02x}:{far[2]:02x}.0"
    assert ids[32:].rstrip(b"\0").decode() == f"{far[0]:04x}:{far[1]:02x}:{far[2]:02x}.0"
    assert answer(queries, NVML_NVLINK_CAPABILITY, 0, 0, 2) == (SUCCESS, 1)
    assert answer(queries, NVML_P2P_STATUS, 0, 1, 2) == (SUCCESS, 0)  # NVLink index between guest 0 and 1
    assert answer(queries, NVML_P2P_STATUS, 0, 1, 4) == (SUCCESS, 5)
    assert ask(queries, NVML_NVLINK_STATE, 0, 2)[0] == NOT_SUPPORTED  # NVML's own error, as it gave it


def test_link_field_values_are_the_host_nvmls_and_counters_never_reach_it(driver: FakeDriver) -> None:
    """NVML_FIELD_VALUE: a field that says what a link is comes with NVML's own return code, type and 8 bytes; a
    traffic or error counter (which would tell one tenant of a GPU about another's work) is NOT_SUPPORTED without
    asking NVML."""
    nvml = FakeNvml(driver)
    queries = NvmlQueries(driver, lambda: DEVICES, lambda _driver: nvml)
    assert ask(queries, NVML_FIELD_VALUE, 0, 1, 165)[:3] == (SUCCESS, 1, 1)  # NVLINK_GET_STATE of link 1: active
    assert nvml.asked[-1] == ("field", 2, 165, 1)  # guest 0 is GPU 2; the link is the field's scope
    assert ask(queries, NVML_FIELD_VALUE, 1, 0, 91)[:3] == (SUCCESS, 1, 2)  # NVLINK_LINK_COUNT
    assert ask(queries, NVML_FIELD_VALUE, 0, 2, 165)[0] == NOT_SUPPORTED  # NVML's own answer for that field
    asked = len(nvml.asked)
    for counter in (161, 138, 0, 1 << 31):  # DL_REPLAY errors, NVLink throughput, none, garbage
        assert ask(queries, NVML_FIELD_VALUE, 0, 0, counter)[0] == NOT_SUPPORTED, counter
    assert len(nvml.asked) == asked


def test_only_the_sessions_gpus_and_nvmls_bounds(driver: FakeDriver) -> None:
    nvml = FakeNvml(driver)
    queries = NvmlQueries(driver, lambda: DEVICES, lambda _driver: nvml)
    for query, device, link, which in [(NVML_NVLINK_STATE, 2, 0, 0), (NVML_NVLINK_STATE, -1, 0, 0),
                                       (NVML_NVLINK_STATE, 0, 18, 0), (NVML_NVLINK_CAPABILITY, 0, 0, 6),
                                       (NVML_P2P_STATUS, 0, 2, 0), (NVML_P2P_STATUS, 0, 1, 6), (9, 0, 0, 0),
                                       (NVML_FIELD_VALUE, 2, 0, 165), (NVML_FIELD_VALUE, 0, 18, 165)]:
        assert ask(queries, query, device, link, which)[0] == INVALID_ARGUMENT, (query, device, link, which)
    assert nvml.asked == []  # none of them reached NVML
    malformed = queries.answer(b"\x00" * 5)
    assert malformed.status == Status.MALFORMED


def test_without_nvml_every_query_is_not_supported(driver: FakeDriver) -> None:
    opened: list[object] = []
    queries = NvmlQueries(driver, lambda: DEVICES, lambda d: opened.append(d))  # returns None: no NVML here
    assert ask(queries, NVML_NVLINK_STATE, 0)[0] == NOT_SUPPORTED
    assert ask(queries, NVML_P2P_STATUS, 0, 1, 2)[0] == NOT_SUPPORTED
    assert opened == [driver]  # tried once, in the worker that asked
