"""The GPU programs' rank launcher (tests/gpu/programs/rank_launcher.py): a failed rank ends the job at once with its
status, as torchrun does, instead of leaving the other ranks waiting for it in NCCL's setup."""
from __future__ import annotations

import socket
import sys
from pathlib import Path

from tests.gpu.programs.rank_launcher import free_port, run_ranks

WAITS = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_every_rank_succeeding_is_success() -> None:
    assert run_ranks([[sys.executable, "-c", "pass"]] * 3, 60) == 0


def test_a_failed_rank_ends_the_waiting_ones_with_its_status(tmp_path: Path) -> None:
    pid = tmp_path / "pid"
    waits = f"import os, pathlib, time\npathlib.Path('{pid}.new').write_text(str(os.getpid()))\n" \
            f"os.replace('{pid}.new', '{pid}')\ntime.sleep(600)"
    fails = f"import os, time\nwhile not os.path.exists('{pid}'): time.sleep(0.01)\nraise SystemExit(3)"
    assert run_ranks([[sys.executable, "-c", waits], [sys.executable, "-c", fails]], 600) == 3
    assert not Path(f"/proc/{pid.read_text()}").exists()  # the waiting rank was ended, not left behind


def test_a_rank_killed_by_a_signal_is_a_failure() -> None:
    crash = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
    assert run_ranks([[sys.executable, "-c", "pass"], crash], 60) == 128 + 11


def test_ranks_past_the_timeout_are_ended() -> None:
    assert run_ranks([WAITS], 0.5) == 124


def test_the_port_is_free_to_listen_on() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", free_port()))
