"""The compiled hot path inside a real session worker (region_server.serve_session in its own process).

The host is a RegionServer in a forked child whose sessions run a CudaExecutor over tests.fake_driver.FakeDriver,
with C-callable stand-ins (ctypes callbacks) for the hot calls' driver functions; each stand-in writes its name to
a log first, so the test sees which calls the compiled path made. The client is a plain ClientChannel.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from host_agent.daemon.region_server import RegionServer
from host_agent.session import hot_path
from host_agent.session.executor import CudaExecutor
from host_agent.session_loop import ServerOptions
from host_agent.stop import StopRequest
from ivshmem import layout
from ivshmem.channel import ClientChannel, Ctrl
from ivshmem.cuda_status import INVALID_HANDLE, INVALID_VALUE, SUCCESS
from ivshmem.driver_api import BY_OPCODE
from ivshmem.record import Flag
from ivshmem.region import Region
from tests.forwarding_rig import bounded, logged_hot_executor  # noqa: F401 (bounded: a fixture)

CALLS = {call.name: call for call in BY_OPCODE.values()}
_MP = multiprocessing.get_context("fork")

pytestmark = pytest.mark.skipif(hot_path.load() is None, reason="no C compiler or Python headers here")


def _serve(path: str, log: str) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: never outlive the test
    stop = StopRequest().on_signals()
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    signal.setitimer(signal.ITIMER_REAL, 0)

    def factory(session: Any) -> CudaExecutor:
        return logged_hot_executor(session, log)
    RegionServer(path, factory, ServerOptions(heartbeat_timeout=5.0, scan_interval=0.01), stop).serve_forever()


@pytest.fixture
def served(region_path: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    log = tmp_path / "hot-calls.log"
    log.touch()
    server = _MP.Process(target=_serve, args=(region_path, str(log)))
    server.start()
    deadline = time.monotonic() + 10
    region = Region.open(region_path)
    try:
        while region.agent_words()[2] != layout.AGENT_SERVING or region.geometry is None:
            assert time.monotonic() < deadline, "the agent did not start"
            time.sleep(0.02)
    finally:
        region.close()
    yield region_path, log
    if server.pid:
        os.kill(server.pid, signal.SIGTERM)
    server.join(10)


def call(channel: ClientChannel, name: str, *args: Any) -> tuple[int, list[Any]]:
    reply = channel.call(CALLS[name].opcode, CALLS[name].request.encode(*args))
    outputs = list(CALLS[name].reply.decode(reply.payload)) if reply.ok and reply.payload else []
    return reply.status, outputs


def test_hot_calls_are_served_in_c_by_the_worker_and_the_rest_by_python(served: tuple[str, Path]) -> None:
    path, log = served
    region = Region.open(path)
    try:
        with ClientChannel.claim(region) as channel:
            channel.hello()
            status, (context,) = call(channel, "cuDevicePrimaryCtxRetain", 0)
            assert status == SUCCESS
            assert call(channel, "cuCtxSetCurrent", context)[0] == SUCCESS
            status, (stream,) = call(channel, "cuStreamCreate", 1)
            status, (event,) = call(channel, "cuEventCreate", 0)
            assert call(channel, "cuStreamQuery", stream)[0] == SUCCESS
            assert call(channel, "cuStreamQuery", 0xBAD0)[0] == INVALID_HANDLE  # Python's refusal: no driver call
            posted = channel.post(CALLS["cuStreamWaitEvent"].opcode,
                                  CALLS["cuStreamWaitEvent"].request.encode(stream, event, 5))
            assert call(channel, "cuCtxSynchronize")[0] == SUCCESS
            errors = [(r.call_id, r.status, r.flags) for r in channel.async_errors]
            assert errors == [(posted, INVALID_VALUE, Flag.ASYNC_ERROR)]
            # the worker's heartbeat thread runs while the worker waits in C (the GIL is released there)
            beat = channel.ctrl[Ctrl.HOST_HEARTBEAT]
            time.sleep(1.2)
            assert channel.ctrl[Ctrl.HOST_HEARTBEAT] >= beat + 2
            assert call(channel, "cuStreamQuery", stream)[0] == SUCCESS
    finally:
        region.close()
    made = log.read_text().split()
    assert made == ["cuCtxSetCurrent", "cuStreamQuery", "cuStreamWaitEvent", "cuCtxSynchronize", "cuStreamQuery"]
