"""The compiled hot path serving a relayed session from its TCP relay connection (hot_dispatch.c's socket mode,
attached by relay_worker.serve_relayed): a relay listener in a child process whose workers run a CudaExecutor over
tests.fake_driver.FakeDriver with C-callable stand-ins for the hot calls' driver functions (each writes its name to
a log first, so the test sees which calls C made), and the test as the relay (tests/relay_peer.RelayPeer). What C
serves and what it leaves to Python are told apart by the log; Python's refusals and asynchronous errors come back
as from a ring."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from host_agent.session import hot_path
from ivshmem.cuda_status import INVALID_HANDLE, INVALID_VALUE, SUCCESS
from ivshmem.driver_api import CALLS
from ivshmem.record import Flag
from tests.forwarding_rig import bounded, logged_hot_executor  # noqa: F401 (bounded: a fixture)
from tests.relay_peer import RelayPeer, start_listener

pytestmark = pytest.mark.skipif(hot_path.load() is None, reason="no C compiler or Python headers here")


def test_hot_records_of_a_relayed_session_are_served_in_c_and_the_rest_by_python(tmp_path: Path) -> None:
    log = tmp_path / "hot-calls.log"
    log.touch()
    listener, port = start_listener(lambda session: logged_hot_executor(session, str(log)))
    peer = RelayPeer.dial("127.0.0.1", port)  # proven with the tests' cluster key
    sock = peer.frames.sock
    try:
        assert peer.hello().status == SUCCESS

        def call(call_id: int, name: str, *args: Any) -> tuple[int, list[Any]]:
            reply = peer.call(call_id, name, *args)
            outputs = list(CALLS[name].reply.decode(reply.payload)) if reply.ok and reply.payload else []
            return reply.status, outputs
        status, (context,) = call(2, "cuDevicePrimaryCtxRetain", 0)
        assert status == SUCCESS
        assert call(3, "cuCtxSetCurrent", context)[0] == SUCCESS
        stream = call(4, "cuStreamCreate", 1)[1][0]
        event = call(5, "cuEventCreate", 0)[1][0]
        assert call(6, "cuStreamQuery", stream)[0] == SUCCESS
        assert call(7, "cuStreamQuery", 0xBAD0)[0] == INVALID_HANDLE  # Python's refusal: no driver call
        wait_event = CALLS["cuStreamWaitEvent"]
        peer.frames.send(8, wait_event.opcode, wait_event.request.encode(stream, event, 5), flags=Flag.NO_REPLY,
                         generation=peer.generation)  # posted, and failing in the driver: an asynchronous error
        failed = peer.answer(8)
        assert failed.flags & Flag.ASYNC_ERROR and failed.status == INVALID_VALUE
        assert call(9, "cuCtxSynchronize")[0] == SUCCESS
        time.sleep(1.5)  # BEATs cross both ways while the worker waits in C; the session lives on
        assert call(10, "cuStreamQuery", stream)[0] == SUCCESS
        made = log.read_text().split()
        assert made.count("cuStreamQuery") == 2 and "cuCtxSynchronize" in made and "cuStreamWaitEvent" in made
    finally:
        sock.close()
        listener.terminate()
        listener.join(10)
