"""A live oriond against region files that go bad under it, or were never good (issue 11).

A real `python -m host_agent.daemon.oriond` (tests/wire/oriond_rig.py) serves a fresh directory in /dev/shm (tmpfs:
truncating a mapped file gives real SIGBUS semantics) holding good regions and, per case, a bad one: a served
region truncated under a client, a region whose supervisor is killed with SIGBUS, and files oriond must refuse
(too small, foreign bytes, a link, a FIFO, a file every local user may write) or serve with a warning. Each
case checks that oriond still runs, that another region answers a fresh client's round trip, that the log
names the bad file in one line with no traceback anywhere, and what the case itself is about.

Runs in CI with the other tests/wire tests (no marker: it needs only processes and /dev/shm). Every wait is
bounded; nothing asserts a duration.
"""
from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from host_agent.daemon.agent import RETRY_MAX_S
from ivshmem.channel import ClientChannel
from ivshmem.errors import PeerGone
from ivshmem.record import Op
from ivshmem.region import Region
from tests.processes import REPO
from tests.wire.oriond_rig import (
    MIB,
    REGION_SIZE,
    WAIT_S,
    Oriond,
    all_zero,
    answers,
    bounded,
    die_with_parent,
    digest,
    env,
    make_file,
    no_traceback,
    oriond_over,
    until,
)

RESERVE_BOUND_S = RETRY_MAX_S + 15.0  # a failed region is looked at again within the longest back-off
CLIENT_BOUND_S = 30.0

# A client holding a session on a region the test will truncate: it runs in a process of its own, because a
# truncated mapping is SIGBUS for whoever touches it, and that must not be the test process.
HOLDER = textwrap.dedent("""
    import sys, time
    from ivshmem.channel import ClientChannel
    from ivshmem.errors import ChannelError
    from ivshmem.record import Op
    from ivshmem.region import Region
    client = ClientChannel.claim(Region.open(sys.argv[1]), accept_timeout=10)
    assert client.call(Op.ECHO, b"held").payload == b"held"
    print("READY", flush=True)
    try:
        while True:
            client.call(Op.ECHO, b"x")
            time.sleep(0.01)
    except ChannelError as exc:
        print(f"GONE {type(exc).__name__}: {exc}", flush=True)
""")


def _naming(agent: Oriond, path: Path, *needles: str) -> list[str]:
    """Log lines that name `path` (not orionsock10 for orionsock1) and contain every needle."""
    pattern = re.compile(re.escape(str(path)) + r"(?![0-9])")
    return [line for line in agent.lines(*needles) if pattern.search(line)]


def _wait_naming(agent: Oriond, path: Path, *needles: str) -> list[str]:
    return until(lambda: _naming(agent, path, *needles), f"a log line naming {path} with {needles!r}",
                 WAIT_S, agent.tail)


def _holder(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], cwd=REPO, env=env(), text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=die_with_parent(signal.SIGKILL))
    assert proc.stdout is not None
    deadline = time.monotonic() + CLIENT_BOUND_S
    line = ""
    while not line and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
    if line.strip() != "READY":
        proc.kill()
        _out, err = proc.communicate(timeout=CLIENT_BOUND_S)
        pytest.fail(f"the holding client did not start its session (got {line!r}):\n{err[-3000:]}")
    return proc


@pytest.fixture
def tmp_shm() -> Iterator[Path]:
    """A scratch directory in /dev/shm outside the served one (for a link's target)."""
    directory = Path(tempfile.mkdtemp(prefix="orion-test-outside-", dir="/dev/shm"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_a_region_truncated_under_a_client_ends_its_sessions_only_and_is_served_again_once_restored(
        tmp_path: Path) -> None:
    regions = {"orionsock0": (REGION_SIZE, 0o600), "orionsock1": (REGION_SIZE, 0o640),
               "orionsock2": (REGION_SIZE, 0o600)}
    with oriond_over(regions, tmp_path / "oriond.log") as (agent, shm):
        bad, other, third = shm / "orionsock0", shm / "orionsock1", shm / "orionsock2"
        agent.wait_served(bad, other, third)
        holder = _holder(bad)
        try:
            os.truncate(bad, 0)
            try:
                out, err = holder.communicate(timeout=CLIENT_BOUND_S)
            except subprocess.TimeoutExpired:
                holder.kill()
                out, err = holder.communicate(timeout=CLIENT_BOUND_S)
                pytest.fail(f"the client of the truncated region did not end within {CLIENT_BOUND_S} s:\n{out}{err}")
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait(CLIENT_BOUND_S)
        # SIGBUS if it touched the vanished pages first, PeerGone if its worker's end reached it first.
        assert holder.returncode == -signal.SIGBUS or "GONE PeerGone" in out, (holder.returncode, out, err[-3000:])

        gone = _wait_naming(agent, bad, "no longer served")
        assert len(gone) == 1 and "its sessions ended" in gone[0], gone
        assert agent.alive(), agent.tail()
        assert agent.supervisor_of(bad) is None
        answers(other)
        answers(third)

        # Looked at again after its back-off: a file of 0 bytes is no region, refused in one line.
        refused = until(lambda: _naming(agent, bad, "not serving"), "the emptied file refused", RESERVE_BOUND_S,
                        agent.tail)
        assert len(refused) == 1 and "too small" in refused[0], refused
        os.truncate(bad, REGION_SIZE)  # restored: a file of zeros again, which oriond formats and serves
        agent.wait_served(bad, bound=RESERVE_BOUND_S)
        answers(bad)
        answers(other)
        assert len(_naming(agent, bad, "no longer served")) == 1, agent.tail()
        assert agent.alive()
        no_traceback(agent)


def test_a_supervisor_killed_with_sigbus_ends_that_regions_sessions_only_and_the_region_is_served_again(
        tmp_path: Path) -> None:
    regions = {"orionsock0": (REGION_SIZE, 0o600), "orionsock1": (REGION_SIZE, 0o600),
               "orionsock2": (REGION_SIZE, 0o640)}
    with oriond_over(regions, tmp_path / "oriond.log") as (agent, shm):
        victim, others = shm / "orionsock0", [shm / "orionsock1", shm / "orionsock2"]
        agent.wait_served(victim, *others)
        supervisor = agent.supervisor_of(victim)
        assert supervisor is not None and supervisor not in {agent.supervisor_of(p) for p in others}
        with Region.open(victim) as region_a, Region.open(others[0]) as region_b, \
                ClientChannel.claim(region_a, accept_timeout=10) as on_victim, \
                ClientChannel.claim(region_b, accept_timeout=10) as on_other:
            assert on_victim.call(Op.ECHO, b"a").payload == b"a"
            assert on_other.call(Op.ECHO, b"b").payload == b"b"
            os.kill(supervisor, signal.SIGBUS)

            gone = _wait_naming(agent, victim, "no longer served")
            assert len(gone) == 1 and "SIGBUS" in gone[0], gone
            outcome = bounded(lambda: on_victim.call(Op.ECHO, b"a"))
            assert isinstance(outcome, PeerGone), f"the victim region's client got {outcome!r}, not PeerGone"
            spared = bounded(lambda: on_other.call(Op.ECHO, b"b").payload)
            assert spared == b"b", f"a session on another region got {spared!r} after the SIGBUS"
            assert agent.alive(), agent.tail()
            for path in others:
                answers(path)

            until(lambda: agent.supervisor_of(victim) not in (None, supervisor),
                  "a new supervisor for the SIGBUS-killed region", RESERVE_BOUND_S, agent.tail)
            agent.wait_served(victim, bound=RESERVE_BOUND_S)
            answers(victim)
        assert len(_naming(agent, victim, "no longer served")) == 1, agent.tail()
        no_traceback(agent)


def test_files_that_are_not_sane_regions_are_refused_once_and_left_unchanged(tmp_path: Path, tmp_shm: Path) -> None:
    regions = {"orionsock0": (REGION_SIZE, 0o600), "orionsock1": (REGION_SIZE, 0o640)}
    with oriond_over(regions, tmp_path / "oriond.log") as (agent, shm):
        good = [shm / "orionsock0", shm / "orionsock1"]
        agent.wait_served(*good)

        tiny = make_file(shm / "orionsock2", 4096)
        small = make_file(shm / "orionsock3", MIB)
        smallest = make_file(shm / "orionsock4", 3 * MIB)  # the smallest size that lays out 8 channels
        foreign = make_file(shm / "orionsock5", content=os.urandom(4 * MIB))
        foreign_digest = digest(foreign)
        target = make_file(tmp_shm / "not-a-region", REGION_SIZE)  # zeros: what oriond would format
        target_digest = digest(target)
        link = shm / "orionsock6"
        link.symlink_to(target)
        fifo = shm / "orionsock7"
        os.mkfifo(fifo, 0o600)
        writable = make_file(shm / "orionsock8", REGION_SIZE, 0o666)
        readable = make_file(shm / "orionsock9", REGION_SIZE, 0o644)
        agent.sighup()

        refused = {tiny: "cannot be formatted", small: "cannot be formatted", foreign: "not an Orion region",
                   link: "symbolic link", fifo: "not a regular file", writable: "writable by every local user"}
        for path, why in refused.items():
            _wait_naming(agent, path, "not serving", why)
        agent.wait_served(smallest, readable)
        warned = _naming(agent, readable, "readable by every local user")
        assert len(warned) == 1 and "WARNING" in warned[0], warned

        # Three more passes over the directory, each proved by a new region it serves (woken by SIGHUP, as the
        # libvirt hook does); none of them may log a refusal again.
        for number in (20, 21, 22):
            fresh = make_file(shm / f"orionsock{number}", 16 * MIB)
            agent.sighup()
            agent.wait_served(fresh)
        assert agent.alive(), agent.tail()
        for path, why in refused.items():
            lines = _naming(agent, path, "not serving")
            assert len(lines) == 1 and why in lines[0] and "ERROR" in lines[0], (path.name, lines)
        assert len(_naming(agent, readable, "readable by every local user")) == 1, agent.tail()

        for path in (*good, smallest, readable, shm / "orionsock20"):
            answers(path)
        assert all_zero(tiny) and all_zero(small), "a file too small to lay out was written to"
        assert digest(foreign) == foreign_digest, "a file of foreign bytes was written to"
        assert link.is_symlink() and digest(target) == target_digest, "the link's target was written to"
        assert all_zero(writable), "a region every local user may write was formatted"
        for path in (tiny, small, foreign, link, fifo, writable):
            assert agent.supervisor_of(path) is None, f"{path.name} is mapped by one of oriond's processes"

        os.chmod(writable, 0o600)  # given to its one tenant: a new state of the file, looked at afresh
        agent.sighup()
        agent.wait_served(writable)
        answers(writable)
        assert agent.alive()
        no_traceback(agent)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file another user's and to mark it")
def test_a_region_planted_by_a_local_user_is_refused_and_one_root_made_for_them_is_served(tmp_path: Path) -> None:
    """/dev/shm is everyone's: an orionsock<N> of a local user's own making must not get them GPU sessions. One
    made by root for that user (orion-shm create --owner, which marks it) is served."""
    with oriond_over({"orionsock0": (REGION_SIZE, 0o600)}, tmp_path / "oriond.log") as (agent, shm):
        agent.wait_served(shm / "orionsock0")
        planted = make_file(shm / "orionsock1", REGION_SIZE, 0o600)
        os.chown(planted, 4242, 4242)  # what uid 4242 gets by creating the file itself
        made = subprocess.run([sys.executable, "-m", "host_agent.admin.shm_cli", "create", "-i", "2", "-s", "16", "-d",
                               str(shm), "--owner", "4242"], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert made.returncode == 0 and made.stderr == "", made.stderr
        agent.sighup()
        (line,) = _wait_naming(agent, planted, "not serving")
        assert "belongs to uid 4242, and root did not make it for that user" in line, line
        agent.wait_served(shm / "orionsock2")
        answers(shm / "orionsock2")
        assert all_zero(planted) and agent.supervisor_of(planted) is None
        no_traceback(agent)
