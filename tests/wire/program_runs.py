"""A GPU program of tests/gpu/programs run twice on the CPU: through the native guest driver against a rig's fake
driver, and on the fake directly in its own process (`--fake`, which the host-node, batch-memory-operation and
module-name programs take). Their CPU tests compare the two RESULTs value by value, as tests/gpu compares a native
run with a forwarded one."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.forwarding_rig import Rig, native_child_env

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = REPO / "tests" / "gpu" / "programs"


def forwarded_and_on_the_fake(name: str, library: Path, rig: Rig) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the RESULT through the native driver and the rig, the RESULT of `--fake`) of program `name`."""
    results = []
    program = str(PROGRAMS / name)
    for arguments, env in (([program], native_child_env(library, rig.path)), ([program, "--fake"], None)):
        done = subprocess.run([sys.executable, *arguments], env=env, capture_output=True, text=True, timeout=120,
                              cwd=REPO)
        assert done.returncode == 0, done.stderr[-3000:]
        results.append(json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:]))
    return results[0], results[1]
