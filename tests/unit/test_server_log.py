"""oriond's logging as [server-log] configures it (host_agent/server_log.py, issue 31): the system log
<log_dir>/server.log at file_log_level, one log per session beside it, the screen at log_level, the time when
log_with_time says so; a directory it cannot write is one warning and the screen. Each case configures a fresh
Python process (logging is process-wide); the last one runs a real oriond and a session on it."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.processes import REPO, python_path
from tests.wire.oriond_rig import oriond_over, round_trip

CHILD = r"""
import json, logging, sys
from host_agent.server_log import LogSettings, configure, session_log
configure(LogSettings(**json.loads(sys.argv[1])))
logging.info("an info line")
logging.warning("a warning line")
print("SESSION", session_log(7, "orionsock2"))
logging.getLogger("host_agent.x").info("a session's line")
"""


def run(**settings: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, json.dumps(settings)], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env={"PYTHONPATH": python_path(), "PATH": "/usr/bin:/bin"})


def test_the_file_and_the_screen_each_at_their_level(tmp_path: Path) -> None:
    done = run(directory=str(tmp_path), level="WARNING", file_level="INFO")
    server = (tmp_path / "server.log").read_text()
    assert "[INFO] an info line" in server and "[WARNING] a warning line" in server
    assert "a warning line" in done.stderr and "an info line" not in done.stderr  # the screen's level
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ \[INFO\] an info line", server)  # log_with_time = 1
    (session,) = (tmp_path / "session").iterdir()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d-\d\d-\d\d-\d\d-orionsock2-7\.log", session.name)
    assert f"SESSION {session}" in done.stdout
    assert "a session's line" in session.read_text() and "a session's line" in server


def test_without_time_without_screen_and_without_file(tmp_path: Path) -> None:
    done = run(directory=str(tmp_path), with_time=False, to_screen=False)
    assert (tmp_path / "server.log").read_text().startswith("[INFO] an info line")
    assert done.stderr == ""
    done = run(directory=str(tmp_path / "none"), to_file=False)
    assert not (tmp_path / "none").exists() and "SESSION None" in done.stdout and "an info line" in done.stderr


def test_a_directory_it_cannot_write_is_one_warning_and_the_screen(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    done = run(directory=str(tmp_path / "a-file" / "log"), to_screen=False)
    warnings = [line for line in done.stderr.splitlines() if "cannot write" in line]
    assert len(warnings) == 1 and "log_dir" in warnings[0], done.stderr
    assert "an info line" in done.stderr and "Traceback" not in done.stderr  # on the screen instead


def test_oriond_logs_to_server_log_and_each_session_to_its_own(tmp_path: Path) -> None:
    log_path = tmp_path / "oriond.out"
    with oriond_over({"orionsock3": (16 << 20, 0o600)}, log_path) as (agent, _directory):
        agent.wait_served(_directory / "orionsock3")
        assert round_trip(_directory / "orionsock3", b"hello") == b"hello"
        agent.wait_no_workers()
    logs = tmp_path / "log"
    server = (logs / "server.log").read_text()
    assert "Using SHM orionsock3 for acceleration." in server  # Orion's line, in Orion's system log
    sessions = list((logs / "session").iterdir())
    assert len(sessions) == 1 and sessions[0].read_text(), sessions
    assert "Using SHM orionsock3" in log_path.read_text()  # and on the screen (stderr), the key left out
