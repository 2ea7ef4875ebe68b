"""A grant shared with the processes its holder starts (host_agent/session/grant_sharing.py): what the holding worker
gives, to whom, and what a joining worker sees when the holder ends; the grant's usage table (grant_usage.py); and
GRANT_SHARE and
GRANT_JOIN at a session that has no grant to give (the end-to-end runs are tests/controller/test_guest_allocation.py).
"""
from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
import threading
from collections.abc import Iterator

import pytest

from host_agent.session import grant_sharing
from host_agent.session.grant_sharing import decode, encode, join, share
from host_agent.session.grant_usage import UsageBoard
from host_agent.session.vgpu_grant import Grant
from ivshmem.record import GRANT_JOIN_REQUEST, Op, Status
from tests import forwarding_rig
from tests.forwarding_rig import Rig

bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures
GRANT = Grant("a1b2", (0, 0, 1), (1000, 1000, 2000), slots=(0, 1, 0))
REGION = "/dev/shm/orionsock3"
SECRET = bytes(range(16))


def _hold(grant: Grant, region: str, tokens: multiprocessing.connection.Connection) -> None:
    token, board = share(grant, region, SECRET)
    board.publish(0, 123)  # what the holder counts on vGPU 0
    tokens.send(token)
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
    grant, secret, board = join(token, REGION, ended.set)
    assert (grant, secret, board.row) == (GRANT, SECRET, 1)
    assert (board.others(0), board.others(1)) == (123, 0)  # the holder's count, through the table it handed over
    board.publish(0, 7)
    assert board.others(0) == 123
    again = join(token, REGION, lambda: None)[2]  # a second joined session: the next row, and both counts
    assert (again.row, again.others(0)) == (2, 130)
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


def test_a_grants_usage_table_sums_the_other_sessions_and_forgets_an_ended_one() -> None:
    holder = UsageBoard.create(3)
    row = holder.give_row({0})
    assert row == 1
    joined = UsageBoard(os.dup(holder.descriptor), 3, row)
    holder.publish(2, 5 << 20)
    joined.publish(2, 1 << 20)
    joined.publish(9, 1)  # no such vGPU: nothing
    assert (holder.others(2), joined.others(2), joined.others(0), joined.others(-1)) == (1 << 20, 5 << 20, 0, 0)
    assert holder.give_row({0, 1}) == 2 and holder.give_row(set(range(257))) is None
    holder.clear_row(row)  # its session ended
    assert holder.others(2) == 0
    assert holder.give_row({0}) == 1


def test_a_check_on_a_grants_table_holds_off_another_sessions() -> None:
    """While one worker is inside `locked()`, another process cannot take the table's lock (asked without waiting)."""
    board = UsageBoard.create(1)
    locked, release = multiprocessing.get_context("fork").Event(), multiprocessing.get_context("fork").Event()

    def hold() -> None:
        with UsageBoard(os.dup(board.descriptor), 1, 1).locked():
            locked.set()
            release.wait(10)
    other = multiprocessing.get_context("fork").Process(target=hold, daemon=True)
    other.start()
    try:
        assert locked.wait(10)
        with pytest.raises(OSError):  # EAGAIN/EACCES: held by the other session
            fcntl.lockf(board.descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        release.set()
        other.join(10)
    with board.locked():  # free again once the other session's check is done
        pass


def test_a_table_of_another_size_is_refused() -> None:
    board = UsageBoard.create(2)
    for vgpus, row in ((3, 1), (0, 1), (2, 257)):
        with pytest.raises(ValueError):
            UsageBoard(os.dup(board.descriptor), vgpus, row)


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
