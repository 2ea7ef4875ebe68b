"""A real oriond woken by the real qemu hook: SIGHUP (through the pid file) makes it serve a new region at once.

oriond runs with `--rescan-interval 3600`, so after its first scan (proved by a first region being served)
only the SIGHUP can make it look at the directory again within the test's bounded waits: the region the hook
creates is served because the hook woke the agent, with no timing threshold in the assertions. release
removes the region and wakes it again (the agent lets go); a region removed and made again under the same
name is served anew. No GPU needed: nothing here opens a session.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ivshmem import layout
from ivshmem.region import Region
from tests.processes import stop_process

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 30.0  # a bound on waiting, far below the agent's 3600 s rescan interval; never a measured time
DOMAIN = """<domain type='qemu'><name>{name}</name><devices>
<shmem name='orionsock{index}'><model type='ivshmem-plain'/><size unit='M'>32</size></shmem>
</devices></domain>"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def _stop_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _agent(path: Path) -> tuple[int, int]:
    """(pid, state) the region's header shows for its agent."""
    with Region.open(path) as region:
        _beat, pid, state = region.agent_words()
    return pid, state


def _until(condition: object, what: str, log: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} within {WAIT_S} s; oriond's log:\n{log.read_text()[-4000:]}"
        time.sleep(0.02)


class Host:
    def __init__(self, tmp: Path) -> None:
        self.shm = tmp / "shm"
        self.shm.mkdir()
        self.conf = tmp / "server.conf"
        self.conf.write_text(f'[server-shm]\n    shm_path_base = "{self.shm}/"\n')
        self.pid_file = tmp / "run" / "oriond.pid"
        self.log = tmp / "oriond.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start_agent(self) -> None:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "host_agent.daemon.oriond", "--config", str(self.conf), "--pid-file",
                 str(self.pid_file), "--rescan-interval", "3600"], cwd=REPO, env=_env(), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_stop_with_parent)

    def hook(self, operation: str, index: int) -> subprocess.CompletedProcess[str]:
        env = _env(ORION_SERVER_CONF=str(self.conf), ORION_PID_FILE=str(self.pid_file))
        return subprocess.run([sys.executable, "-m", "libvirt_hooks.qemu_hook", "g1", operation, "-", "-"],
                              input=DOMAIN.format(name="g1", index=index), capture_output=True, text=True,
                              cwd=REPO, env=env, timeout=60)

    def serving(self, index: int) -> bool:
        path = self.shm / f"orionsock{index}"
        assert self.proc is not None
        return path.exists() and _agent(path) == (self.proc.pid, layout.AGENT_SERVING)

    def stop(self) -> int | None:
        return None if self.proc is None else stop_process(self.proc)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    host = Host(tmp_path)
    yield host
    code = host.stop()
    assert code in (None, 0), f"oriond exited with {code}:\n{host.log.read_text()[-4000:]}"
    assert not host.pid_file.exists(), "oriond left its pid file behind"


def test_the_hook_wakes_oriond_which_serves_the_new_region_at_once(host: Host) -> None:
    first = host.hook("prepare", 9301)
    assert first.returncode == 0 and "host agent is not running" in first.stderr, first.stderr
    host.start_agent()
    assert host.proc is not None
    _until(lambda: host.serving(9301), "oriond did not serve the region present at its start", host.log)
    _until(lambda: host.pid_file.exists() and host.pid_file.read_text().strip() == str(host.proc.pid),  # type: ignore[union-attr]
           "oriond did not write its pid file", host.log)

    second = host.hook("prepare", 9302)  # after the first scan: only the SIGHUP can make oriond see it
    assert second.returncode == 0, second.stderr
    assert f"told oriond (pid {host.proc.pid})" in second.stderr
    _until(lambda: host.serving(9302), "oriond did not serve the new region after the hook's SIGHUP", host.log)

    released = host.hook("release", 9302)
    assert released.returncode == 0, released.stderr
    assert not (host.shm / "orionsock9302").exists()
    _until(lambda: "orionsock9302 is gone" in host.log.read_text(), "oriond did not let go of the region",
           host.log)

    again = host.hook("prepare", 9302)  # the same name, a new file: served anew, not the old mapping
    assert again.returncode == 0, again.stderr
    _until(lambda: host.serving(9302), "oriond did not serve the re-created region", host.log)
    assert host.proc.poll() is None


def test_a_plain_sighup_makes_oriond_rescan_and_does_not_stop_it(host: Host) -> None:
    host.hook("prepare", 9303)
    host.start_agent()
    assert host.proc is not None
    _until(lambda: host.serving(9303), "oriond did not serve the region present at its start", host.log)
    path = host.shm / "orionsock9304"
    with open(path, "wb") as f:  # a blank file, as QEMU makes one: the agent formats it
        f.truncate(32 << 20)
    os.kill(host.proc.pid, signal.SIGHUP)
    _until(lambda: host.serving(9304), "oriond did not serve the blank region after SIGHUP", host.log)
    assert host.proc.poll() is None
