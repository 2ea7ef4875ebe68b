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

from guest_runtime.startup import HOST_COMMANDS, HOST_PACKAGES, runs_host_side
from tests.processes import REPO, python_path


@pytest.mark.parametrize("argv,host", [
    (["python", "-m", "host_agent.daemon.oriond"], True),
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


def test_every_host_side_console_script_is_a_host_command() -> None:
    """The start-up hook's hand-written list is pyproject.toml's console scripts whose module is a host package's
    (orion-k8s-plugin was once missing: its DaemonSet sets ORION_CONTROLLER, which would have turned forwarding on
    inside the plugin)."""
    import tomllib
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    host_side = {name for name, target in scripts.items() if target.split(".")[0] in HOST_PACKAGES}
    assert set(HOST_COMMANDS) == host_side
    assert runs_host_side(["python", "/usr/local/bin/orion-k8s-plugin", "serve"])


def test_oriond_s_gpu_inventory_reader_reads_the_driver_not_a_forwarded_one() -> None:
    env = {**os.environ, "PYTHONPATH": python_path(), "ORION_SHM": "/nonexistent/orionsock0",
           "ORION_CONTROLLER": "127.0.0.1:9"}
    done = subprocess.run([sys.executable, "-m", "host_agent.session.gpu_inventory"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert "orion:" not in done.stderr, done.stderr  # forwarding's one-line messages
    assert "Orion" not in json.loads(done.stdout)["why"], done.stdout
