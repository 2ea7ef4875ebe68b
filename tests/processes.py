"""Helpers for tests that start real processes (oriond, region servers)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def python_path() -> str:
    """PYTHONPATH for a child that imports this checkout: the repo first, then what the tests run with (the
    device machine adds the wheels it was given there)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def stop_process(proc: subprocess.Popen, timeout: float = 20.0) -> int | None:  # type: ignore[type-arg]
    """SIGINT (a clean stop, as Ctrl-C), then SIGKILL after `timeout`; returns the exit code. Never hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    return proc.returncode


def free_port() -> int:
    """A TCP port on the loopback that nobody listens on now (the kernel's choice, not a guess)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
