"""The GPU host's relay listener (host_agent/relay/listener.py) in its own process on a real TCP port of this
machine: a worker process per connection (the CUDA executor over the fake driver), sessions independent of each
other, a bounded number of them, and a hostile or vanished peer costing only its own session."""
from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Iterator
from multiprocessing.process import BaseProcess
from typing import Any

import pytest

from host_agent.handler import Session
from host_agent.relay.frames import (
    RELAY_ACCEPT,
    RELAY_ACCEPT_REPLY,
    RELAY_HELLO,
)
from host_agent.session.executor import CudaExecutor
from ivshmem.driver_api import CALLS
from ivshmem.record import Status
from tests.fake_driver import FakeDriver
from tests.relay_peer import RelayPeer, start_listener


def _fake_executor(session: Session) -> CudaExecutor:
    driver = FakeDriver(devices=2)
    driver.cuInit(0)
    return CudaExecutor(session, driver=driver)


@pytest.fixture
def listener() -> Iterator[Callable[..., int]]:
    started: list[BaseProcess] = []

    def start(max_sessions: int = 8) -> int:
        process, port = start_listener(_fake_executor, max_sessions=max_sessions)
        started.append(process)
        return port
    yield start
    for proc in started:
        proc.terminate()
        proc.join(10)


class Relay(RelayPeer):
    """A relay's end of one connection to the listener, as the relaying oriond will hold it (proven with the
    tests' cluster key)."""

    def __init__(self, port: int) -> None:
        super().__init__(RelayPeer.dial("127.0.0.1", port).frames)
        self.sock = self.frames.sock

    def close(self) -> None:
        self.sock.close()


def _session(accepted: Any) -> int:
    assert accepted.opcode == RELAY_ACCEPT and accepted.status == 0, bytes(accepted.payload)
    return int(RELAY_ACCEPT_REPLY.decode(accepted.payload)[0])


def test_each_connection_is_a_session_of_its_own(listener: Callable[..., int]) -> None:
    port = listener()
    a, b = Relay(port), Relay(port)
    try:
        assert _session(a.hello()) != _session(b.hello())
        for relay in (a, b):
            assert relay.call(2, "cuInit", 0).status == 0
            assert CALLS["cuDeviceGetCount"].reply.decode(relay.call(3, "cuDeviceGetCount").payload) == (2,)
        a.close()  # one session ends; the other goes on
        assert CALLS["cuDeviceGetCount"].reply.decode(b.call(4, "cuDeviceGetCount").payload) == (2,)
    finally:
        a.close()
        b.close()


def test_sessions_beyond_the_bound_are_refused_with_the_reason_until_one_ends(listener: Callable[..., int]) -> None:
    port = listener(max_sessions=1)
    first = Relay(port)
    try:
        _session(first.hello())
        second = Relay(port)
        refused = second.answer(0)
        assert refused.status == Status.REFUSED and b"relayed sessions already" in bytes(refused.payload)
        second.close()
        first.close()
        deadline = time.monotonic() + 10
        while True:  # the listener reaps the ended worker within its accept poll
            third = Relay(port)
            answer = third.hello()
            third.close()
            if answer.status == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert answer.status == 0, bytes(answer.payload)
    finally:
        first.close()


def test_a_hostile_peer_costs_only_its_own_session(listener: Callable[..., int]) -> None:
    port = listener()
    junk = RelayPeer.dial("127.0.0.1", port).frames.sock  # a member of the cluster, sending junk after its proof
    junk.sendall(struct.pack("<QIIIIiI", 1, RELAY_HELLO, 1 << 9, 0, 0, 0, 0) + os.urandom(64))  # an unknown flag
    try:
        closed = junk.recv(1) == b""  # its worker closed the connection: no RELAY_HELLO, nothing served
    except ConnectionResetError:  # closed with our junk unread: a reset
        closed = True
    assert closed
    junk.close()
    victim = Relay(port)
    try:
        _session(victim.hello())
        assert victim.call(2, "cuInit", 0).status == 0  # the listener and other sessions go on
    finally:
        victim.close()
