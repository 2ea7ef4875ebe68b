"""A long device-to-host reply whose copy fails after its success went out (the record and its status are published
before its bytes, which follow chunk by chunk as the GPU copies them): the bytes already sent cannot be taken back,
so the session ends (HostReason.REPLY_FAILED) and the client's call answers CUDA_ERROR_DEVICE_UNAVAILABLE, as every
later one; before, the client read the chunk that failed as whatever the staging arena held, with CUDA_SUCCESS.
On a local region and relayed (the GPU host's worker leaves the frame short, the relay cuts the reply short)."""
from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import pytest

from host_agent.session.grant_sharing import EXIT_GRANT_ENDED
from tests import forwarding_rig, relay_net
from tests.fake_driver import CUresult, FakeDriver
from tests.forwarding_rig import Rig

bounded, start = forwarding_rig.bounded, forwarding_rig.start  # the rig's fixtures

DEVICE_UNAVAILABLE, UNKNOWN = 46, 999
COPY = 4 << 20  # many staging chunks and relay pieces
FAILING_PIECE = 3  # the third device-to-host piece of a session fails (pieces: 64 KiB locally, 1 MiB relayed)


class FailsMidCopy(FakeDriver):
    """A GPU whose device-to-host copy fails in the middle of a long one (as after a fault elsewhere in the context)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pieces = 0

    def cuMemcpyDtoH(self, dstHost: Any, srcDevice: Any, ByteCount: int) -> tuple[Any, ...]:  # noqa: N802, N803
        self.pieces += 1
        if self.pieces == FAILING_PIECE:
            return (CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,)
        return super().cuMemcpyDtoH(dstHost, srcDevice, ByteCount)


@pytest.mark.parametrize("relayed", [False, True], ids=["local", "relayed"])
def test_a_copy_that_fails_mid_reply_ends_the_session_with_an_error(start: Callable[..., Rig], relayed: bool) -> None:
    if relayed and relay_net.why_not():
        pytest.skip(relay_net.why_not())
    g = start(relayed=relayed, fake_class=FailsMidCopy).guest()
    g.setup()
    device = g.alloc(COPY)
    assert g.htod(device, bytes(range(256)) * (COPY // 256)) == 0
    status, _data = g.dtoh(device, COPY)
    assert status == DEVICE_UNAVAILABLE  # never CUDA_SUCCESS with the failed piece's bytes
    assert g.sync() == DEVICE_UNAVAILABLE


class EndsAtSecondSwitch(FakeDriver):
    """A session worker that ends while a context switch waits: with EXIT_GRANT_ENDED (the process whose grant this
    session joined ended, grant_sharing.py) or killed (SIGKILL, as by the OOM killer)."""

    how = "grant"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.switches = 0

    def cuCtxSetCurrent(self, ctx: Any) -> tuple[Any, ...]:  # noqa: N802
        self.switches += 1
        if self.switches == 2:
            if self.how == "grant":
                os._exit(EXIT_GRANT_ENDED)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().cuCtxSetCurrent(ctx)


class KilledAtSecondSwitch(EndsAtSecondSwitch):
    how = "killed"


@pytest.mark.parametrize("relayed", [False, True], ids=["local", "relayed"])
@pytest.mark.parametrize("fake", [EndsAtSecondSwitch, KilledAtSecondSwitch], ids=["grant-ended", "killed"])
def test_a_session_ended_while_a_context_switch_waits_is_an_answer(
        start: Callable[..., Rig], relayed: bool, fake: type[FakeDriver], caplog: pytest.LogCaptureFixture) -> None:
    """cuCtxSetCurrent asks the host synchronously (forward.py, _make_current_on_host). A session the host ends under
    it is an answer, never a raise out of the driver (CI once saw the raise, tests/controller/test_guest_allocation.py):
    DEVICE_UNAVAILABLE where the host says the GPU is gone for this session (its grant ended; a relay lost its GPU
    host), otherwise UNKNOWN, as the native driver answers (cuda_client.c, not_carried); said in one line, with no
    traceback."""
    if relayed and relay_net.why_not():
        pytest.skip(relay_net.why_not())
    g = start(relayed=relayed, fake_class=fake).guest()
    ctx = g.setup()
    expected = DEVICE_UNAVAILABLE if relayed or fake is EndsAtSecondSwitch else UNKNOWN
    assert g.call("cuCtxSetCurrent", ctx)[0] == expected
    assert g.sync() == expected
    said = [r.getMessage() for r in caplog.records if r.name.startswith("guest_runtime") and r.levelname == "ERROR"]
    if relayed:  # the relay, not the session, saw its GPU host go: it answers every call so, as a status
        assert said == [], said
    else:
        assert len(said) == 1 and "the host ended this session" in said[0], said
