"""Helpers for tests that start real processes (oriond, region servers)."""
from __future__ import annotations

import signal
import subprocess


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
