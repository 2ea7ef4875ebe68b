"""The GPU host's side of a relayed session (host_agent/relay/worker.py) over a real socket pair: RELAY_HELLO
judged by the handler's own HELLO and BIND (the CUDA executor over the fake driver), RELAY_ACCEPT, then
forwarded calls answered as on a region; refusals carry the reason; a silent connection is closed."""
from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from host_agent.handler import Session
from host_agent.relay.frames import (
    RELAY_ACCEPT,
    RELAY_ACCEPT_REPLY,
    ConnectionLost,
    FrameStream,
)
from host_agent.relay.worker import accept_relay, serve_relayed
from host_agent.session.executor import CudaExecutor
from host_agent.session_loop import ServerOptions
from ivshmem.driver_api import CALLS
from ivshmem.record import PROTOCOL, Status
from tests.fake_driver import FakeDriver
from tests.relay_peer import RelayPeer

SESSION = Session(7, "relay 127.0.0.1", 0, 11)


class Worker:
    """serve_relayed in a thread, as the worker process runs it; the test is the relay."""

    def __init__(self) -> None:
        self.relay_socket, worker_socket = socket.socketpair()
        self.relay = RelayPeer(FrameStream(self.relay_socket, stall_s=5), SESSION.generation)
        fake = FakeDriver(devices=2)
        fake.cuInit(0)  # as oriond's worker finds the driver (tests/unit/test_hot_dispatch.py does the same)
        self.executor = CudaExecutor(SESSION, driver=fake)
        self.made_for: list[Session] = []  # the sessions the handler factory was asked for
        self.code: list[int] = []
        self.thread = threading.Thread(target=lambda: self.code.append(
            serve_relayed(worker_socket, self._handler, SESSION, ServerOptions())), daemon=True)
        self.thread.start()
        self._worker_socket = worker_socket

    def _handler(self, session: Session) -> CudaExecutor:
        self.made_for.append(session)
        return self.executor

    def close(self) -> None:
        self.relay_socket.close()
        self.thread.join(10)
        self._worker_socket.close()


@pytest.fixture
def worker() -> Iterator[Worker]:
    w = Worker()
    yield w
    w.close()


def test_an_accepted_relay_is_served_as_a_session_on_a_region(worker: Worker) -> None:
    accepted = worker.relay.hello()
    assert accepted.opcode == RELAY_ACCEPT and accepted.status == 0
    session, transport, why, rdma, bound = RELAY_ACCEPT_REPLY.decode(accepted.payload)
    assert (session, transport, rdma, bound) == (SESSION.number, "tcp", b"", b"") and "no RDMA" in why
    assert worker.made_for == [SESSION._replace(transport="tcp")]  # the session knows its transport (BIND says it)
    assert worker.relay.call(2, "cuInit", 0).status == 0
    count = worker.relay.call(3, "cuDeviceGetCount")
    assert count.status == 0 and CALLS["cuDeviceGetCount"].reply.decode(count.payload) == (2,)
    assert worker.relay.call(4, "cuMemFree", 0xDEAD0000).status != 0  # not this session's: the same ledger refuses it
    worker.relay_socket.shutdown(socket.SHUT_RDWR)  # the relay goes: the session ends, the worker returns 0
    worker.thread.join(10)
    assert worker.code == [0]


@pytest.mark.parametrize(("hello", "reason"), [
    ({"protocol": PROTOCOL + 1}, "install the orion-guest of the same release"),
    ({"calls": "another-table"}, "table"),
    ({"allocation": "alloc-1"}, "controller"),  # this oriond has no controller: it cannot take up a grant
])
def test_a_relay_hello_the_session_would_refuse_is_refused_with_the_reason(worker: Worker, hello: dict[str, Any],
                                                                           reason: str) -> None:
    refused = worker.relay.hello(**hello)
    assert refused.opcode == RELAY_ACCEPT and refused.status == Status.REFUSED
    assert reason in bytes(refused.payload).decode()
    worker.thread.join(10)
    assert worker.code == [0]  # and the connection is closed: nothing more is served


def test_a_connection_that_begins_otherwise_or_says_nothing_is_closed() -> None:
    near, far = socket.socketpair()
    try:
        FrameStream(near).send(1, CALLS["cuInit"].opcode, CALLS["cuInit"].request.encode(0))
        executor = CudaExecutor(SESSION, driver=FakeDriver(devices=1))
        assert accept_relay(FrameStream(far), lambda session: executor, SESSION) is None
        answer = FrameStream(near).receive(timeout=5)
        assert answer is not None and answer.status == Status.REFUSED and b"RELAY_HELLO" in bytes(answer.payload)
        with pytest.raises(ConnectionLost, match="no RELAY_HELLO"):
            accept_relay(FrameStream(far), lambda session: executor, SESSION, hello_timeout_s=0.2)
    finally:
        near.close()
        far.close()
