"""Orion's variables in a host command's environment never turn forwarding on inside it.

setup.sh's environment has orion-guest's .pth (so that `ORION_* python app.py` forwards, as the README says);
oriond reads ORION_CONTROLLER itself (server.conf's override). Forwarding inside oriond would send its own
CUDA calls to itself, and its GPU inventory would be empty.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from guest_runtime.startup import runs_host_side
from tests.processes import REPO, python_path


@pytest.mark.parametrize("argv,host", [
    (["python", "-m", "host_agent.oriond"], True),
    (["python", "/srv/.venv/bin/oriond", "--config", "x"], True),
    (["python", "-X", "dev", "-m", "controller", "start"], True),
    (["python", "/usr/local/bin/orion-shm", "list"], True),
    (["python", "app.py"], False),
    (["python", "-u", "/home/me/train.py", "--epochs", "3"], False),
    (["python", "-c", "import cuda"], False),
    (["python", "-m", "pytest"], False),
    (["python"], False),
])
def test_host_side_commands_are_recognised(argv: list[str], host: bool) -> None:
    assert runs_host_side(argv) is host


def test_oriond_s_gpu_inventory_reader_reads_the_driver_not_a_forwarded_one() -> None:
    env = {**os.environ, "PYTHONPATH": python_path(), "ORION_SHM": "/nonexistent/orionsock0",
           "ORION_CONTROLLER": "127.0.0.1:9"}
    done = subprocess.run([sys.executable, "-m", "host_agent.gpu_inventory"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert "orion:" not in done.stderr, done.stderr  # forwarding's one-line messages
    assert "Orion" not in json.loads(done.stdout)["why"], done.stdout
