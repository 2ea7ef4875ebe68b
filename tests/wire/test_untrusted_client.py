"""What one client, or anyone who can write the region, can and cannot make a host agent and its other clients do.

Against a real host agent process (tests/wire/serve_region.py): overwritten control and agent words end the
affected client's waits with an error instead of a hang and do not block new claims; a stalled supervisor does not
fail busy sessions (clients judge their own worker's heartbeat); a staged request is bounded in size and may not
stall. Every wait is bounded: a call that could hang runs on a thread joined with a deadline.
"""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest

from ivshmem import layout
from ivshmem.channel import ClientChannel, Ctrl, HostReason, HostStatus, Streamed
from ivshmem.errors import ChannelError, PeerGone
from ivshmem.record import Op, Status
from ivshmem.region import Region
from tests.conftest import ServerProcess
from tests.wire.oriond_rig import bounded, until


def test_a_cleared_client_active_word_ends_the_clients_next_call_with_an_error(served_region: str) -> None:
    with Region.open(served_region) as region, ClientChannel.claim(region) as client:
        assert client.call(Op.ECHO, b"before").payload == b"before"
        client.ctrl[Ctrl.CLIENT_ACTIVE] = 0  # a stray write by anyone who can write the file
        until(lambda: client.ctrl[Ctrl.HOST_STATUS] != HostStatus.SERVING, "the host never saw the release")
        outcome = bounded(lambda: client.call(Op.ECHO, b"after"))
        assert isinstance(outcome, PeerGone) and "released" in str(outcome), outcome


@pytest.mark.parametrize("word,value", [(Ctrl.HOST_GEN, 0x7777), (Ctrl.HOST_STATUS, 0), (Ctrl.HOST_STATUS, 99),
                                        (Ctrl.CLIENT_GEN, 0x5555), (Ctrl.HOST_HEARTBEAT, 0)])
def test_any_overwritten_control_word_never_leaves_a_call_hanging(served_region: str, word: Ctrl, value: int) -> None:
    with Region.open(served_region) as region, ClientChannel.claim(region) as client:
        client.ctrl[word] = value
        for _ in range(3):
            time.sleep(0.3)  # the supervisor's passes and the client's slow-path checks both run
            outcome = bounded(lambda: client.call(Op.ECHO, b"x"))
            assert outcome != "hung", f"a call hung after {word.name} = {value:#x}"
            if isinstance(outcome, Exception):
                assert isinstance(outcome, ChannelError), repr(outcome)
                break
        with ClientChannel.claim(region) as other:  # the region serves others on
            assert other.call(Op.ECHO, b"y").payload == b"y"


def test_an_overwritten_agent_state_does_not_block_new_claims(served_region: str) -> None:
    with Region.open(served_region) as region:
        region.set_agent(state=layout.AGENT_STOPPED, pid=1)
        with ClientChannel.claim(region) as client:
            assert client.call(Op.ECHO, b"x").payload == b"x"
        _beat, pid, state = region.agent_words()
        assert (state, pid != 1) == (layout.AGENT_SERVING, True), "the supervisor did not rewrite its words"


def test_a_stalled_supervisor_does_not_fail_a_busy_session(
        region_path: str, server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(region_path)
    with Region.open(region_path) as region, ClientChannel.claim(region) as client:
        until(lambda: client.ctrl[Ctrl.HOST_WORKER] > 0, "the host never started the session's worker")
        os.kill(server.pid, signal.SIGSTOP)  # the supervisor only: the session's worker goes on
        try:
            end = time.monotonic() + 7.0  # longer than the client's 5 s agent timeout
            calls = 0
            while time.monotonic() < end:
                outcome = bounded(lambda: client.call(Op.ECHO, b"busy"))
                assert getattr(outcome, "payload", None) == b"busy", outcome
                calls += 1
                time.sleep(0.2)  # idle between calls: waits go through the slow path and its checks
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert calls > 10


def test_a_session_whose_worker_died_with_the_agent_ends_in_an_error(
        region_path: str, server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(region_path)
    with Region.open(region_path) as region, ClientChannel.claim(region) as client:
        until(lambda: client.ctrl[Ctrl.HOST_WORKER] > 0, "the host never named the session's worker")
        worker = client.ctrl[Ctrl.HOST_WORKER]
        os.kill(server.pid, signal.SIGSTOP)  # nobody will mark the session failed...
        try:
            os.kill(worker, signal.SIGKILL)  # ...and nobody serves it any more
            outcome = bounded(lambda: client.call(Op.ECHO, b"x"))
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert isinstance(outcome, PeerGone) and "no heartbeat" in str(outcome), outcome


def test_a_staged_request_that_stalls_ends_its_session(
        region_path: str, server_factory: Callable[..., ServerProcess]) -> None:
    server_factory(region_path, 2.0, "--stall-timeout", "1")
    with Region.open(region_path) as region:
        client = ClientChannel.claim(region)
        sent = []

        def two_chunks_then_nothing(chunk: memoryview) -> None:
            if len(sent) == 2:
                raise InterruptedError("the client stops sending")
            chunk[:] = b"\1" * len(chunk)
            sent.append(len(chunk))
        with pytest.raises(InterruptedError):
            client.endpoint.send(1, Op.ECHO, 0, Streamed(100 << 20, two_chunks_then_nothing))
        until(lambda: client.ctrl[Ctrl.HOST_STATUS] == HostStatus.FAILED,
                    "the host kept waiting for the rest of the payload")
        assert client.ctrl[Ctrl.HOST_REASON] == HostReason.PROTOCOL_VIOLATION
        client.close()
        with ClientChannel.claim(region) as again:  # the region serves on
            assert again.call(Op.ECHO, b"x").payload == b"x"


def test_a_staged_request_over_the_assembly_limit_is_refused_and_the_session_goes_on(
        region_path: str, server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(region_path, 2.0, "--max-assembled", str(1 << 20))
    with Region.open(region_path) as region, ClientChannel.claim(region) as client:
        big = client.call(Op.ECHO, bytes(2 << 20))
        assert big.status == Status.TOO_LARGE and b"limit" in bytes(big.payload), big
        assert client.call(Op.ECHO, bytes(1 << 20)).payload == bytes(1 << 20)  # at the limit: assembled
    assert "Traceback" not in server.log()
