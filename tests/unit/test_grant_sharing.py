"""A grant shared with the processes its holder starts (host_agent/session/grant_sharing.py): what the holding worker
gives, to whom, and what a joining worker sees when the holder ends; the claim of a vGPU; and GRANT_SHARE and
GRANT_JOIN at a session that has no grant to give (the end-to-end runs are tests/controller/test_guest_allocation.py).
"""
from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import threading
from collections.abc import Iterator

import pytest

from host_agent.session import grant_sharing
from host_agent.session.grant_sharing import VgpuClaims, decode, encode, join, share
from host_agent.session.vgpu_grant import Grant
from ivshmem.record import GRANT_JOIN_REQUEST, Op, Status
from tests import forwarding_rig
from tests.forwarding_rig import Rig

bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures
GRANT = Grant("a1b2", (0, 0, 1), (1000, 1000, 2000), slots=(0, 1, 0))
REGION = "/dev/shm/orionsock3"
SECRET = bytes(range(16))


def _hold(grant: Grant, region: str, tokens: multiprocessing.connection.Connection) -> None:
    tokens.send(share(grant, region, SECRET))
    signal.pause()  # until the test ends it


@pytest.fixture
def holder() -> Iterator[tuple[str, multiprocessing.Process]]:
    """Another process holding GRANT for a session of REGION, and its token."""
    receiving, sending = multiprocessing.get_context("fork").Pipe(duplex=False)
    process = multiprocessing.get_context("fork").Process(target=_hold, args=(GRANT, REGION, sending), daemon=True)
    process.start()
    assert receiving.poll(10)
    yield receiving.recv(), process
    process.kill()
    process.join(10)


def test_a_worker_of_the_holders_region_gets_the_grant_and_learns_when_the_holder_ends(
        holder: tuple[str, multiprocessing.Process]) -> None:
    token, process = holder
    ended = threading.Event()
    assert join(token, REGION, ended.set) == (GRANT, SECRET)
    assert not ended.wait(0.2)
    process.kill()
    assert ended.wait(10)  # the holder's end is the joined session's


@pytest.mark.parametrize("change", ["region", "secret", "pid", "shape"])
def test_anything_but_the_holders_token_for_its_region_gets_nothing(
        holder: tuple[str, multiprocessing.Process], change: str) -> None:
    token, _ = holder
    pid, secret = token.split("-")
    asked = {"region": (token, "/dev/shm/orionsock4"), "secret": (f"{pid}-{'0' * 32}", REGION),
             "pid": (f"{os.getpid()}-{secret}", REGION), "shape": (token + "0", REGION)}[change]
    with pytest.raises(ValueError) as refused:
        join(*asked, lambda: None)
    assert {"region": "does not share it", "secret": "does not share it", "pid": "is gone",
            "shape": "is not a grant token"}[change] in str(refused.value)


def test_a_grant_of_another_shape_is_refused() -> None:
    for data in (b"", b"[]", b'{"allocation": "x"}', b'{"allocation": "x", "devices": [0], "memory_mib": [], '
                 b'"slots": [0]}', b'{"allocation": "x", "devices": ["a"], "memory_mib": [1], "slots": [0]}'):
        with pytest.raises(ValueError):
            decode(data)
    assert decode(encode(GRANT)) == GRANT


def test_a_vgpu_of_a_grant_is_one_sessions_at_a_time() -> None:
    first, second, unbound, other = VgpuClaims(), VgpuClaims(), VgpuClaims(), VgpuClaims()
    first.key = second.key = os.urandom(16)
    other.key = os.urandom(16)  # another grant's
    assert first.claim(0) and first.claim(0)  # held: claimed again as often as it likes
    assert not second.claim(0) and second.claim(1)
    assert other.claim(0) and other.claim(1)
    assert unbound.claim(0) and unbound.claim(0)  # no grant: nothing to claim
    del first  # its worker ended: the vGPU is free again
    gc.collect()
    assert second.claim(0)


def test_a_session_without_a_grant_shares_nothing_and_a_bad_token_joins_nothing(rig: Rig) -> None:
    channel = rig.guest().channel
    shared = channel.call(Op.GRANT_SHARE)
    assert shared.status == Status.REFUSED and b"took up no controller grant" in bytes(shared.payload)
    assert channel.call(Op.GRANT_SHARE, b"x").status == Status.MALFORMED
    for token in ("", "12-zz", "1-" + "0" * 32, "x" * 5000):
        joined = channel.call(Op.GRANT_JOIN, GRANT_JOIN_REQUEST.encode(token))
        assert joined.status == Status.REFUSED, token
        assert b"cannot join the vGPUs of the process that shared them" in bytes(joined.payload)
        assert b"\n" not in bytes(joined.payload)


def test_a_join_after_the_sessions_first_context_is_refused(rig: Rig) -> None:
    g = rig.guest()
    g.setup(0)
    joined = g.channel.call(Op.GRANT_JOIN, GRANT_JOIN_REQUEST.encode("1-" + "0" * 32))
    assert joined.status == Status.REFUSED and b"before the session's first context" in bytes(joined.payload)


def test_the_token_names_the_holding_worker_and_a_secret() -> None:
    assert grant_sharing.TOKEN.match(f"{os.getpid()}-{'ab' * 16}")
    assert not grant_sharing.TOKEN.match(f"0-{'ab' * 16}") and not grant_sharing.TOKEN.match("1-AB" + "0" * 30)
