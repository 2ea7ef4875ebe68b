"""tests/gpu/programs/multi_device_vmm_program.py (issue 32: memory of one device mapped for two with the
virtual-memory API), unmodified, as cuda-python runs it on the native driver, against a real agent whose sessions run
the executor over the fake driver (tests/forwarding_rig.py: guest devices 0 and 1 are the fake's 2 and 0). Its
results are the fake's: each device reads the other's bytes through the one physical allocation, the access flags
are those set, every status is success. On two GPUs tests/gpu/test_multi_gpu.py compares them with a native run.
CPU only."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests import forwarding_rig
from tests.forwarding_rig import Rig, native_child_env
from tests.wire.test_native_mem_pools import REPO

bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures
PROGRAM = REPO / "tests" / "gpu" / "programs" / "multi_device_vmm_program.py"
READWRITE, NONE = 3, 0


def test_memory_of_one_device_is_mapped_for_both(library: Path, rig: Rig) -> None:
    done = subprocess.run([sys.executable, str(PROGRAM)], env=native_child_env(library, rig.path),
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
    failed = {name: status for name, status in out.pop("status").items() if status}
    assert failed == {}
    assert out == {"count": 2, "peer": 1, "access": {"shared": [READWRITE, READWRITE], "alone": [READWRITE, NONE]},
                   "device1_read": True, "device0_read": True, "ok": True}, out
