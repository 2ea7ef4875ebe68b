"""Files of any name in a served directory stop nothing (issue 27, item 1: "a file name kills oriond").

docs/security.md, *What each party can and cannot reach*: a local user can create files named like regions in
`shm_path_base` (`/dev/shm` is writable by every local user), and cannot crash or hang oriond or stop other
regions. A real `python -m host_agent.daemon.oriond` (tests/wire/oriond_rig.py) serves a directory made like /dev/shm
(sticky, writable by all) holding one region with a live session, held by a client in a process of its own.
Then `nobody` plants every odd name we could think of: Unicode digits that `str.isdigit` accepts and `int`
refuses (², ¹², ①) or turns into another number (Arabic-Indic, fullwidth), blanks and control characters,
signs, leading zeros, an empty suffix, indices past the bound, names of NAME_MAX bytes, bytes that are not
UTF-8; and valid names for files that are no region (empty, a FIFO, a link, a directory). Afterwards oriond
still runs, the held session still answers, new sessions start on the old region and on one made after the
planting (so oriond has passed over the directory with every name in it), `orion-shm list` lists the
regions' names only, and the guest runtime's `Region.discover()` (run where the directory is /dev/shm, in a
mount namespace of its own) finds the served region.

The second test holds the other half of the item: nothing about one entry escapes `Agent.refresh` as an
exception that ends oriond. oriond is left one free file descriptor (RLIMIT_NOFILE, set from outside as an
operator's low limit or a leak would), so it can list the directory but not start the supervisor of a new
region: it says so, keeps serving the old region's session, and serves the new one once descriptors are back.

Every wait is bounded; nothing asserts a duration.
"""
from __future__ import annotations

import os
import re
import resource
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from host_agent.daemon.agent import RETRY_MAX_S
from ivshmem.region import list_region_files
from tests.processes import REPO
from tests.wire.oriond_rig import (
    REGION_SIZE,
    WAIT_S,
    answers,
    die_with_parent,
    env,
    make_file,
    no_traceback,
    oriond_over,
    until,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants files as nobody: needs root to change uid")

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
CALL_BOUND_S = 30.0
RESERVE_BOUND_S = RETRY_MAX_S + 15.0  # a region that could not be started is looked at again within the back-off

_TEXT_NAMES = [
    "orionsock²", "orionsock¹²", "orionsock①", "orionsock٣", "orionsock۴", "orionsock७", "orionsock１",
    "orionsock𝟙", "orionsock\u0663\u0661",  # isdigit() yet int() refuses, or int() gives another number
    "orionsock 1", "orionsock1 ", " orionsock1", "orionsock\n1", "orionsock1\n", "orionsock\t1", "orionsock\r",
    "orionsock99999999999999999999", "orionsock10000", "orionsock4294967296",  # past the bound
    "orionsock-1", "orionsock+1", "orionsock01", "orionsock007", "orionsock00", "orionsock",
    "orionsock1_0", "orionsock0x1", "orionsock1.5", "orionsock1e3",
    "orionsock" + "9" * 246, "orionsock" + "²" * 123, "orionsock" + "0" * 246,  # 255 bytes: NAME_MAX
]
_NOT_UTF8 = [b"orionsock\xff", b"orionsock1\xff", b"orionsock\xb2", b"orionsock\xe2\x91", b"orionsock\xed\xa0\x80"]
ODD_NAMES = [name.encode() for name in _TEXT_NAMES] + _NOT_UTF8
# PLANT also gives valid names to files that are no region (empty, a FIFO, a link, a directory): orionsock3..6.

PLANT = textwrap.dedent("""
    import os, sys
    directory = os.fsencode(sys.argv[1])
    for name in sys.argv[2:]:
        path = os.path.join(directory, bytes.fromhex(name))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.ftruncate(fd, 1 << 20)
        os.close(fd)
    base = os.path.join(directory, b"orionsock")
    open(base + b"3", "wb").close()
    os.mkfifo(base + b"4")
    os.symlink(b"/etc/passwd", base + b"5")
    os.mkdir(base + b"6")
    print("PLANTED", len(os.listdir(directory)), "uid", os.getuid(), flush=True)
""")

# A client holding one session: it answers each line of its stdin with an ECHO through that same session.
HOLDER = textwrap.dedent("""
    import sys
    from ivshmem.channel import ClientChannel
    from ivshmem.record import Op
    from ivshmem.region import Region
    client = ClientChannel.claim(Region.open(sys.argv[1]), accept_timeout=10)
    print("READY", client.index, flush=True)
    for line in sys.stdin:
        print("ECHO", bytes(client.call(Op.ECHO, line.strip().encode()).payload).decode(), flush=True)
""")

# The guest runtime's discovery where the served directory is /dev/shm: then an ECHO on what it found.
DISCOVER = textwrap.dedent("""
    from ivshmem.channel import ClientChannel
    from ivshmem.record import Op
    from ivshmem.region import Region
    region = Region.discover()
    print("FOUND", region.where, flush=True)
    with ClientChannel.claim(region, accept_timeout=10) as client:
        print("ECHO", bytes(client.call(Op.ECHO, b"found").payload).decode(), flush=True)
""")


class Holder:
    """A client process holding one session of a region, asked to ECHO through it on demand."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], cwd=REPO, env=env(), text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     preexec_fn=die_with_parent(signal.SIGKILL))
        line = self._line()
        assert line.startswith("READY"), f"the holding client did not start its session: {line!r}{self._err()}"
        self.channel = int(line.split()[1])

    def _line(self) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], CALL_BOUND_S)
        return self.proc.stdout.readline().strip() if ready else "(nothing within the bound)"

    def _err(self) -> str:
        if self.proc.poll() is None:
            return ""
        assert self.proc.stderr is not None
        return "\n" + self.proc.stderr.read()[-3000:]

    def echo(self, word: str) -> str:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(word + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return f"(the holder is gone){self._err()}"
        return self._line() + self._err()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=CALL_BOUND_S)


def _plant_as_nobody(directory: Path) -> None:
    done = subprocess.run([*NOBODY, sys.executable, "-c", PLANT, str(directory), *(n.hex() for n in ODD_NAMES)],
                          cwd="/", env=env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "uid 65534" in done.stdout, done.stdout + done.stderr


def _orion_shm_list(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "host_agent.admin.shm_cli", "list", "-d", str(directory)], cwd=REPO,
                          env=env(), capture_output=True, text=True, timeout=60)


def _discover_in(directory: Path) -> subprocess.CompletedProcess[str]:
    """Region.discover() in a mount namespace whose /dev/shm is `directory` (a container's or guest's view)."""
    script = 'mount --bind "$SERVED" /dev/shm && exec "$PYTHON" -c "$PROGRAM"'
    run_env = {**env(), "SERVED": str(directory), "PYTHON": sys.executable, "PROGRAM": DISCOVER}
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], cwd=REPO,
                          env=run_env, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not os.path.exists("/usr/bin/setpriv") or not os.path.exists("/usr/bin/unshare"),
                    reason="needs util-linux setpriv and unshare")
def test_no_file_name_planted_by_a_local_user_stops_oriond_orion_shm_list_or_discovery(tmp_path: Path) -> None:
    """docs/security.md: a local user can create `orionsock<N>` files in /dev/shm, which oriond does not serve,
    and cannot crash oriond or stop other regions; oriond serves only `orionsock<N>`, N in 0..9999 written in
    ASCII digits without a leading zero, and passes over every other name."""
    with oriond_over({"orionsock7": (REGION_SIZE, 0o600)}, tmp_path / "oriond.log") as (agent, shm):
        shm.chmod(0o1777)  # as /dev/shm: any local user may add files, only their owner may remove them
        served = shm / "orionsock7"
        agent.wait_served(served)
        holder = Holder(served)
        try:
            assert holder.echo("before") == "ECHO before"
            _plant_as_nobody(shm)
            assert all(os.lstat(os.path.join(bytes(shm), n)).st_uid == 65534 for n in ODD_NAMES)

            later = make_file(shm / "orionsock8", REGION_SIZE)  # served only by a pass that saw every odd name
            agent.sighup()
            agent.wait_served(later)
            time.sleep(1.0)  # a few more passes over the directory (rescan every 0.2 s)
            assert agent.alive(), f"oriond ended with {agent.proc.returncode}\n{agent.tail()}"
            assert holder.echo("after") == "ECHO after", agent.tail()  # the same session, never interrupted
            answers(served, b"new session, old region")
            answers(later, b"new session, new region")

            assert list_region_files(str(shm)) == [str(shm / f"orionsock{n}") for n in (3, 4, 5, 6, 7, 8)]
            listed = _orion_shm_list(shm)
            assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stdout + listed.stderr
            assert [line.split()[0] for line in listed.stdout.splitlines()] == ["3", "4", "5", "6", "7", "8"], \
                listed.stdout
            found = _discover_in(shm)
            assert found.returncode == 0, found.stdout + found.stderr + agent.tail()
            assert found.stdout.split("\n")[:2] == ["FOUND /dev/shm/orionsock7", "ECHO found"], found.stdout

            lines = agent.lines("not region names")
            assert len(lines) == 1, lines  # said once (at most once a minute), not on every pass
            log_lines = agent.log().splitlines()  # every name escaped: none starts a line of its own
            assert all(re.match(r"\d{4}-\d\d-\d\d ", line) for line in log_lines), agent.tail()
            no_traceback(agent)
        finally:
            holder.close()


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_region_oriond_cannot_start_now_is_logged_and_skipped_and_every_other_session_goes_on(
        tmp_path: Path) -> None:
    """docs/security.md: no client of oriond (nor anything about one entry of its directory) can crash oriond
    or stop other regions: a region whose supervisor cannot be started is logged, tried again later, and every
    other region keeps serving throughout."""
    with oriond_over({"orionsock0": (REGION_SIZE, 0o600)}, tmp_path / "oriond.log") as (agent, shm):
        served = shm / "orionsock0"
        agent.wait_served(served)
        holder = Holder(served)
        limit = resource.prlimit(agent.pid, resource.RLIMIT_NOFILE)
        try:
            assert holder.echo("before") == "ECHO before"
            samples = []
            for _ in range(10):  # the fewest descriptors it holds between passes
                samples.append(_open_fds(agent.pid))
                time.sleep(0.05)
            # One spare descriptor: enough to list the directory and look at a file, not for a new supervisor's
            # pipe (two).
            resource.prlimit(agent.pid, resource.RLIMIT_NOFILE, (min(samples) + 1, limit[1]))
            try:
                blocked = make_file(shm / "orionsock1", REGION_SIZE)
                agent.sighup()
                until(lambda: agent.lines("orionsock1", "Too many open files") or not agent.alive(),
                      "oriond saying it cannot serve orionsock1 now", WAIT_S, agent.tail)
                time.sleep(1.0)  # more passes, each trying again after its back-off
                assert agent.alive(), f"oriond ended with {agent.proc.returncode}\n{agent.tail()}"
                assert holder.echo("meanwhile") == "ECHO meanwhile", agent.tail()
                assert len(agent.lines("orionsock1", "Too many open files")) <= 2, agent.tail()  # not every pass
            finally:
                if agent.alive():
                    resource.prlimit(agent.pid, resource.RLIMIT_NOFILE, limit)
            agent.wait_served(blocked, bound=RESERVE_BOUND_S)
            answers(blocked, b"served once it could be")
            assert holder.echo("after") == "ECHO after", agent.tail()
            no_traceback(agent)
        finally:
            holder.close()
