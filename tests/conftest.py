"""Shared fixtures: real region files in /dev/shm and a real host agent in its own process.

* `region_path`: a fresh 32 MiB file of zeros, /dev/shm/orion-test-<uuid> (so Region.open goes through
  posix_ipc, as on a host), removed afterwards.
* `server_factory`: starts tests/wire/serve_region.py (RegionServer + DiagnosticsHandler) as a separate
  process on a region and, at teardown, stops every server it started (SIGINT, then SIGKILL after a timeout)
  and asserts that nothing of it (supervisor or forked session workers) is left running.
* `served_region`: `region_path` served by one such server (heartbeat_timeout 2 s); yields the path.
* `library`: the native guest driver (`libcuda.so.1`), built once per test session for the modules that drive it
  through ctypes against a real agent (tests/wire, tests/differential); skipped where there is no C compiler
  (setup.sh installs gcc). test_native_driver.py keeps its own build, which fails instead: CPU CI must show that
  the library builds.

Every wait here is bounded.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from guest_runtime.native.build import build_driver, find_compiler
from ivshmem import layout
from tests.processes import stop_process

REGION_SIZE = 32 << 20
SERVE_SCRIPT = Path(__file__).resolve().parent / "wire" / "serve_region.py"
SERVING_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
LEFTOVER_TIMEOUT_S = 10.0
PR_SET_PDEATHSIG = 1


def _agent_words(path: str) -> tuple[int, int, int]:
    """(heartbeat, pid, state) read straight from the file, without mapping it."""
    with open(path, "rb") as f:
        raw = os.pread(f.fileno(), 16, layout.AGENT_HEARTBEAT)
    if len(raw) < 16:
        return 0, 0, layout.AGENT_NEVER
    beat, pid, state = struct.unpack("<QII", raw)
    return beat, pid, state


def _running_matching(*needles: str) -> list[int]:
    """Pids of live (not zombie) processes whose command line contains every needle."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path("/proc", entry, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        state = stat.rsplit(")", 1)[1].split()[0]
        if state not in ("Z", "X") and all(n in cmdline for n in needles):
            found.append(int(entry))
    return found


def _stop_with_parent() -> None:
    """In the child before exec: SIGTERM (a clean stop) if the test process dies without stopping us."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class ServerProcess:
    """One host agent (tests/wire/serve_region.py) serving `path`, run as a separate process."""

    def __init__(self, path: str, log_path: Path, heartbeat_timeout: float = 2.0, extra: tuple[str, ...] = ()) -> None:
        self.path = path
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(SERVE_SCRIPT), path, "--heartbeat-timeout", str(heartbeat_timeout), *extra],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, close_fds=True,
                start_new_session=True, preexec_fn=_stop_with_parent)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_serving(self, timeout: float = SERVING_TIMEOUT_S) -> None:
        """Until the region says SERVING under our pid and the heartbeat has moved (the scan loop runs)."""
        end = time.monotonic() + timeout
        first_beat = None
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"host agent exited with {self.proc.returncode} before serving:\n{self.log()}")
            beat, pid, state = _agent_words(self.path)
            if state == layout.AGENT_SERVING and pid == self.proc.pid:
                if first_beat is None:
                    first_beat = beat
                elif beat != first_beat:
                    return
            time.sleep(0.01)
        raise AssertionError(f"host agent did not serve {self.path} within {timeout} s:\n{self.log()}")

    def leftovers(self) -> list[int]:
        """Supervisor or session workers still running (workers are forks: same command line)."""
        return _running_matching(str(SERVE_SCRIPT.name), self.path)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGINT, then SIGKILL after `timeout`; returns the exit code."""
        return stop_process(self.proc, timeout)

    def kill(self) -> None:
        """SIGKILL the supervisor only (its workers must notice and exit by themselves)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(STOP_TIMEOUT_S)

def _stop_all(servers: list[ServerProcess]) -> list[str]:
    """Stop every server, then wait (bounded) until nothing of any of them runs; kill and report leftovers."""
    for server in reversed(servers):
        server.stop()
    end = time.monotonic() + LEFTOVER_TIMEOUT_S
    left: dict[int, ServerProcess] = {}
    while True:
        left = {pid: server for server in servers for pid in server.leftovers()}
        if not left or time.monotonic() > end:
            break
        time.sleep(0.05)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return [f"agent on {server.path}: process {pid} still running after stop:\n{server.log()}"
            for pid, server in left.items()]


@contextlib.contextmanager
def open_directory(parent: str, prefix: str = "orion-test-") -> Iterator[Path]:
    """A fresh directory of root's in `parent` that every user may pass through (0755), removed afterwards:
    pytest's tmp_path lies under a 0700 directory, which other users cannot enter and which seals every file in
    it (host_agent/region_file.sealed_directory)."""
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def open_shm_dir() -> Iterator[Path]:
    """A directory under /dev/shm that every user may enter (0755), as /dev/shm itself: the files' own modes
    decide who can open them. Out of oriond's way: it serves only /dev/shm/orionsock<N>."""
    with open_directory("/dev/shm") as directory:
        yield directory


@pytest.fixture
def region_path() -> Iterator[str]:
    """A fresh 32 MiB region file of zeros in /dev/shm, removed afterwards."""
    path = f"/dev/shm/orion-test-{uuid.uuid4().hex}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, REGION_SIZE)
    finally:
        os.close(fd)
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """`start(path, heartbeat_timeout=2.0, *flags)` runs a host agent on `path` (flags of serve_region.py) and waits
    until it serves."""
    servers: list[ServerProcess] = []

    def start(path: str, heartbeat_timeout: float = 2.0, *flags: str, wait: bool = True) -> ServerProcess:
        server = ServerProcess(path, tmp_path / f"agent-{len(servers)}.log", heartbeat_timeout, flags)
        servers.append(server)
        if wait:
            server.wait_serving()
        return server

    yield start
    problems = _stop_all(servers)
    assert not problems, "\n".join(problems)


@pytest.fixture
def served_region(region_path: str, server_factory: Callable[..., ServerProcess]) -> Iterator[str]:
    """`region_path`, served by a host agent in its own process (heartbeat_timeout 2 s)."""
    server_factory(region_path, heartbeat_timeout=2.0)
    yield region_path


@pytest.fixture(scope="session")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if find_compiler() is None:
        pytest.skip("no C compiler (setup.sh installs gcc)")
    return build_driver(tmp_path_factory.mktemp("native") / "libcuda.so.1")
