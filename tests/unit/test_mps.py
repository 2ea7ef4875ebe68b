"""Session workers under NVIDIA MPS (host_agent/daemon/mps.py, `[server-mps] enable_mps`): oriond starts its own
control daemon, puts the variables that lead a CUDA process to it in its environment before any worker is forked,
and stops it at exit; where MPS cannot run, one line says why and sessions go on without it.

NVIDIA's `nvidia-cuda-mps-control` cannot run without a GPU, so a stand-in on PATH plays it: `-d` makes the control
pipe in CUDA_MPS_PIPE_DIRECTORY, commands come on stdin, and everything it is asked is written to a journal with the
variables it saw. The real daemon, with real session workers on a GPU, is tests/gpu/test_mps_gpu.py's.
"""
from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from host_agent.daemon import mps
from tests.processes import REPO, python_path, stop_process

STAND_IN = """#!/bin/sh
journal="$CUDA_MPS_LOG_DIRECTORY/journal"
if [ "$1" = "-d" ]; then
    echo "start percentage=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE pipe=$CUDA_MPS_PIPE_DIRECTORY" >> "$journal"
    if [ -n "$MPS_STAND_IN_FAILS" ]; then echo "$MPS_STAND_IN_FAILS" >&2; exit 1; fi
    : > "$CUDA_MPS_PIPE_DIRECTORY/control"
    exit 0
fi
read command
echo "$command" >> "$journal"
if [ "$command" = quit ]; then rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"; fi
exit 0
"""


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The stand-in first on PATH; os.environ as it was afterwards (start() sets the variables in it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / mps.CONTROL
    control.write_text(STAND_IN)
    control.chmod(control.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    for name in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path / "mps"


def journal(directory: Path) -> list[str]:
    path = directory / "log" / "journal"
    return path.read_text().splitlines() if path.exists() else []


def test_each_vgpu_gets_its_share_of_the_sms() -> None:
    assert [mps.active_thread_percentage(n) for n in (1, 2, 3, 4, 7, 100)] == [100, 50, 34, 25, 15, 1]


def test_oriond_starts_its_own_daemon_and_stops_it(stand_in: Path) -> None:
    daemon = mps.start(mps.MpsSettings(True, str(stand_in)), vgpu_count=4)
    assert daemon is not None and daemon.started
    assert journal(stand_in) == [f"start percentage=25 pipe={stand_in}/pipe", "get_server_list"]
    for name, value in daemon.environment.items():  # what every worker forked from here inherits
        assert os.environ[name] == value
    assert daemon.environment == {"CUDA_MPS_PIPE_DIRECTORY": f"{stand_in}/pipe", "CUDA_MPS_LOG_DIRECTORY":
                                  f"{stand_in}/log", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    assert stat.S_IMODE((stand_in / "pipe").stat().st_mode) == 0o700  # no other user's process reaches it
    daemon.stop()
    assert journal(stand_in)[-1] == "quit" and not (stand_in / "pipe" / "control").exists()


def test_a_daemon_already_answering_there_is_used_and_left_running(stand_in: Path) -> None:
    first = mps.start(mps.MpsSettings(True, str(stand_in)), vgpu_count=2)
    assert first is not None
    again = mps.start(mps.MpsSettings(True, str(stand_in)), vgpu_count=2)  # an oriond restarted
    assert again is not None and not again.started
    again.stop()
    starts = [line for line in journal(stand_in) if line.startswith("start")]
    assert starts == [f"start percentage=50 pipe={stand_in}/pipe"]
    assert "quit" not in journal(stand_in)
    first.stop()


@pytest.mark.parametrize("case", ["disabled", "no binary", "does not start", "no directory"])
def test_where_mps_cannot_run_one_line_says_why_and_nothing_is_set(
        case: str, stand_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    directory = str(stand_in)
    if case == "no binary":
        monkeypatch.setenv("PATH", "/nonexistent")
    elif case == "does not start":
        monkeypatch.setenv("MPS_STAND_IN_FAILS", "An instance of this daemon is already running")
    elif case == "no directory":
        (tmp_path / "a-file").write_text("")
        directory = str(tmp_path / "a-file" / "mps")
    with caplog.at_level(logging.INFO, logger="host_agent.daemon.mps"):
        assert mps.start(mps.MpsSettings(case != "disabled", directory), vgpu_count=4) is None
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    if case == "disabled":
        assert caplog.records == [] and journal(stand_in) == []
        return
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and "without MPS" in record.message
    assert {"no binary": "not on PATH", "does not start": "already running",
            "no directory": "mps_dir"}[case] in record.message


def test_oriond_with_enable_mps_runs_its_sessions_under_the_daemon_and_stops_it_at_exit(stand_in: Path,
                                                                                       tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    conf = tmp_path / "server.conf"
    conf.write_text(f'[server]\n    vgpu_count = 3\n[server-shm]\n    shm_path_base = "{shm}/"\n'
                    f"[server-mps]\n    enable_mps = true\n    mps_dir = {stand_in}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")} | {"PYTHONPATH": python_path()}
    log = tmp_path / "oriond.log"
    pid_file = tmp_path / "oriond.pid"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "host_agent.daemon.oriond", "--config", str(conf),
                                 "--pid-file", str(pid_file)], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert f"session workers share the GPU through the control daemon in {stand_in}/pipe (started), each " \
               "with 34% of the SMs" in log.read_text()
    finally:
        assert stop_process(proc) == 0, log.read_text()
    assert journal(stand_in) == [f"start percentage=34 pipe={stand_in}/pipe", "get_server_list", "quit"]


def test_a_daemon_for_processes_started_by_hand_leaves_this_environment_alone(stand_in: Path) -> None:
    """export=False (a benchmark's native processes under MPS): the caller passes the environment itself."""
    daemon = mps.start(mps.MpsSettings(True, str(stand_in)), vgpu_count=2, export=False)
    assert daemon is not None and daemon.environment["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    daemon.stop()
