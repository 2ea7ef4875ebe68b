"""The GPU inventory oriond registers is read in a child process, so oriond itself never initialises CUDA.

Why it matters: oriond forks a worker per session, and CUDA does not survive a fork; a parent that had
called cuInit leaves every worker's cuInit failing with CUDA_ERROR_NOT_INITIALIZED (seen on the H100 before
this was fixed: with a controller configured, no session could use the GPU).
"""
from __future__ import annotations

import json
import subprocess
import sys

from tests.processes import REPO, python_path

READ_AND_REPORT = ("import json, sys; from host_agent.session import gpu_inventory; gpus, why = gpu_inventory.read(); "
                   "print(json.dumps({'cuda_loaded': 'cuda.bindings.driver' in sys.modules, 'gpus': len(gpus), "
                   "'why': why}))")


def test_reading_the_inventory_leaves_this_process_free_of_cuda() -> None:
    done = subprocess.run([sys.executable, "-c", READ_AND_REPORT], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env={"PYTHONPATH": python_path(), "PATH": "/usr/bin:/bin"}, check=True)
    seen = json.loads(done.stdout)
    assert seen["cuda_loaded"] is False
    assert seen["gpus"] > 0 or seen["why"]  # a host without a GPU says why there is nothing to register
