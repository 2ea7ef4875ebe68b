"""One differential program in a child process on the native guest driver, speaking to a rig's agent: the JSON it
printed last, and its stderr. Shared by the graph and capture differential tests (one way to start the child)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.forwarding_rig import Rig, native_child_env

REPO = Path(__file__).resolve().parents[2]
NATIVE_TIMEOUT_S = 50  # a hang guard: each program takes a few seconds


def run_native(rig: Rig, library: Path, module: str, *args: str, script: str | None = None) -> tuple[Any, str]:
    """`python -m module LIBRARY args...` (or `-c script LIBRARY args...`) under the native driver, on `rig`'s region:
    (the JSON of its last line of output, its stderr); a failed child fails the test with its stderr."""
    command = ["-c", script, str(library)] if script else ["-m", module, str(library)]
    done = subprocess.run([sys.executable, *command, *args], cwd=REPO, env=native_child_env(library, rig.path),
                          capture_output=True, text=True, timeout=NATIVE_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr
