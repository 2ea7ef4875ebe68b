"""A real `python -m host_agent.daemon.oriond` over a directory of region files, and the probes tests need around it.

Shared by tests/wire/test_region_faults.py and tests/wire/test_hostile.py. oriond runs as its own process
(its own session, stopped with SIGINT, killed if the test process dies) with a server.conf whose
shm_path_base is a fresh directory in /dev/shm (tmpfs: a truncated region gives the real SIGBUS semantics).
No GPU is needed: the CUDA executor answers the wire opcodes (HELLO, ECHO, NOP) by itself.

What the test process reads of oriond never maps a region it might truncate: agent words are read with
pread, processes from /proc (no psutil). Round trips run in the test process on a thread joined with a
deadline, so a hang is a failure with a message, never a stuck test. Every wait here is bounded.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from host_agent import supervised
from ivshmem import layout
from ivshmem.channel import ClientChannel
from ivshmem.record import Op
from ivshmem.region import Region
from tests.processes import REPO, python_path, stop_process

MIB = 1 << 20
REGION_SIZE = 32 * MIB
START_TIMEOUT_S = 30.0  # oriond's start, including its first pass over the directory
WAIT_S = 30.0  # any other state the tests wait for; a bound on waiting, never a measured time
CALL_BOUND_S = 20.0  # a round trip (claim, ECHO, release): the client's own timeouts are 2 s and 5 s
RESCAN_S = 0.2
T = TypeVar("T")


def env() -> dict[str, str]:
    """This environment without any Orion variable (oriond must not forward its own calls), this checkout first."""
    out = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    out["PYTHONPATH"] = python_path()
    out["PYTHONUNBUFFERED"] = "1"
    return out


def die_with_parent(signum: int = signal.SIGTERM) -> Callable[[], None]:
    """A preexec_fn: the child gets `signum` when the test process dies without stopping it (oriond's own
    supervised.die_with_parent, which its workers use)."""
    return functools.partial(supervised.die_with_parent, signum)


def until(probe: Callable[[], T], what: str, bound: float = WAIT_S, detail: Callable[[], str] = lambda: "") -> T:
    """Poll `probe` until it returns something true; AssertionError naming `what` after `bound` seconds."""
    deadline = time.monotonic() + bound
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {bound:g} s\n{detail()}")
        time.sleep(0.02)


def bounded(call: Callable[[], T], bound: float = CALL_BOUND_S) -> T | BaseException | str:
    """What `call` returned or raised, or the string "hung" if it had not ended after `bound` seconds (its
    daemon thread is then left behind: the test fails on the "hung" anyway)."""
    box: list[T | BaseException | str] = ["hung"]

    def run() -> None:
        try:
            box[0] = call()
        except BaseException as exc:  # the outcome under test
            box[0] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound)
    return box[0]


# --- files -------------------------------------------------------------------------------------------------
def make_file(path: Path, size: int = REGION_SIZE, mode: int = 0o600, content: bytes | None = None) -> Path:
    """A file of `size` zeros (sparse, as QEMU or truncate makes it), or of `content`, with exactly `mode`."""
    with open(path, "wb") as f:
        if content is not None:
            f.write(content)
        else:
            f.truncate(size)
    os.chmod(path, mode)  # not subject to the umask
    return path


def digest(path: Path) -> str:
    """sha256 of the file's bytes (of a link's target: pass the target)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            h.update(block)
    return h.hexdigest()


def all_zero(path: Path) -> bool:
    with open(path, "rb") as f:
        return all(not any(block) for block in iter(lambda: f.read(MIB), b""))


def agent_words(path: Path) -> tuple[int, int, int]:
    """(heartbeat, pid, state) of the agent serving `path`, read with pread (never mapped: the file may be
    truncated under the test); zeros for a file too short to hold them."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return 0, 0, layout.AGENT_NEVER
    try:
        raw = os.pread(fd, 16, layout.AGENT_HEARTBEAT)
    finally:
        os.close(fd)
    if len(raw) < 16:
        return 0, 0, layout.AGENT_NEVER
    beat, pid, state = struct.unpack("<QII", raw)
    return beat, pid, state


# --- processes ---------------------------------------------------------------------------------------------
def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name, or None if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def children(pid: int) -> list[int]:
    """Live (not zombie) children of `pid`, found by scanning /proc for ppid == pid."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is not None and fields[0] not in ("Z", "X") and int(fields[1]) == pid:
            found.append(int(entry))
    return sorted(found)


def descendants(pid: int) -> list[int]:
    out, todo = [], children(pid)
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(children(child))
    return sorted(out)


def rss_kib(pid: int) -> int:
    """VmRSS of `pid` in KiB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def maps_file(pid: int, path: Path) -> bool:
    """Whether `pid` has `path` mapped (a region's supervisor does; oriond's main process never does)."""
    try:
        return any(line.endswith(" " + str(path)) for line in Path(f"/proc/{pid}/maps").read_text().splitlines())
    except OSError:
        return False


# --- oriond ------------------------------------------------------------------------------------------------
class Oriond:
    """`python -m host_agent.daemon.oriond --config <dir>/server.conf --pid-file ... --rescan-interval 0.2` serving
    every orionsock<N> of `directory`; its log (every process of its tree writes there) at `log_path`."""

    def __init__(self, directory: Path, log_path: Path, rescan_s: float = RESCAN_S, sections: str = "") -> None:
        self.directory = directory
        self.log_path = log_path
        self.conf = directory / "server.conf"
        self.conf.write_text(f'[server]\n    vgpu_count = 1\n[server-shm]\n    shm_path_base = "{directory}/"\n'
                             f"[server-log]\n    log_dir = {log_path.parent}/log\n"  # server.log, session logs
                             + sections)
        self.pid_file = directory / "oriond.pid"
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "host_agent.daemon.oriond", "--config", str(self.conf), "--pid-file",
                 str(self.pid_file), "--rescan-interval", str(rescan_s)], cwd=REPO, env=env(),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=die_with_parent())
        until(lambda: self.pid_file.exists() or self.proc.poll() is not None, "oriond's pid file",
              START_TIMEOUT_S, self.log)
        assert self.alive(), f"oriond exited with {self.proc.returncode}:\n{self.log()}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def lines(self, *needles: str) -> list[str]:
        """Log lines that contain every needle."""
        return [line for line in self.log().splitlines() if all(n in line for n in needles)]

    def tail(self) -> str:
        return "oriond's log, last 6000 characters:\n" + self.log()[-6000:]

    def sighup(self) -> None:
        """Wake it as the libvirt hook does: SIGHUP to the pid its pid file names."""
        os.kill(int(self.pid_file.read_text().split()[0]), signal.SIGHUP)

    def served(self, path: Path) -> bool:
        """Whether `path` shows this oriond serving it (its supervisor writes oriond's pid on every pass)."""
        _beat, pid, state = agent_words(path)
        return state == layout.AGENT_SERVING and pid == self.pid and self.supervisor_of(path) is not None

    def wait_served(self, *paths: Path, bound: float = START_TIMEOUT_S) -> None:
        for path in paths:
            until(lambda p=path: self.served(p), f"oriond serving {path}", bound, self.tail)  # type: ignore[misc]

    def supervisor_of(self, path: Path) -> int | None:
        """The pid of the child of oriond that maps `path`: that region's supervisor (multiprocessing names it
        only inside its Process object, not on its command line)."""
        return next((pid for pid in children(self.pid) if maps_file(pid, path)), None)

    def workers(self) -> list[int]:
        """Session workers: children of its children."""
        return [pid for sup in children(self.pid) for pid in descendants(sup)]

    def wait_no_workers(self, bound: float = WAIT_S) -> None:
        until(lambda: not self.workers(), "every session worker gone", bound,
              lambda: f"left: {self.workers()}\n{self.tail()}")

    def rss(self) -> tuple[int, int]:
        """(oriond's own VmRSS, the VmRSS summed over its whole process tree), in KiB."""
        tree = [self.pid, *descendants(self.pid)]
        return rss_kib(self.pid), sum(rss_kib(pid) for pid in tree)

    def stop(self) -> int | None:
        return stop_process(self.proc)


@contextlib.contextmanager
def oriond_over(regions: dict[str, tuple[int, int]], log_path: Path,
                sections: str = "") -> Iterator[tuple[Oriond, Path]]:
    """A directory in /dev/shm holding `regions` (name -> (size, mode), zero files) and an oriond serving it;
    yields (oriond, directory). Afterwards oriond is stopped (it must exit 0 and leave no process behind) and
    the directory removed."""
    directory = Path(tempfile.mkdtemp(prefix="orion-test-", dir="/dev/shm"))
    directory.chmod(0o755)  # others may enter, as in /dev/shm: mkdtemp's 0700 would seal every file in it
    agent = None
    try:
        for name, (size, mode) in regions.items():
            make_file(directory / name, size, mode)
        agent = Oriond(directory, log_path, sections=sections)
        yield agent, directory
        tree = [agent.pid, *descendants(agent.pid)]
        code = agent.stop()
        assert code == 0, f"oriond exited with {code}\n{agent.tail()}"
        until(lambda: not [pid for pid in tree if running(pid)], "oriond's processes gone after its stop", WAIT_S)
    finally:
        if agent is not None and agent.alive():
            agent.proc.kill()
            agent.proc.wait(WAIT_S)
        shutil.rmtree(directory, ignore_errors=True)


def round_trip(path: Path, payload: bytes = b"x", accept_timeout: float = 10.0) -> bytes:
    """Claim a channel of `path` in this process, ECHO `payload`, release; the echoed bytes. A claim the
    agent defers (its session-start limit) is answered within `accept_timeout`."""
    with Region.open(path) as region, ClientChannel.claim(region, accept_timeout=accept_timeout) as client:
        reply = client.call(Op.ECHO, payload)
        assert reply.ok, f"ECHO on {path} answered status {reply.status}"
        return bytes(reply.payload)


def answers(path: Path, payload: bytes = b"probe") -> None:
    """Assert that a fresh client's ECHO round trip on `path` comes back, within a bound."""
    outcome = bounded(lambda: round_trip(path, payload))
    assert outcome == payload, f"a fresh client's ECHO on {path}: {outcome!r}"


def no_traceback(agent: Oriond) -> None:
    assert "Traceback" not in agent.log(), f"a traceback in oriond's log\n{agent.tail()}"
