"""The GPU machine's guest (tests/gpu/build-guest-bundle.sh, tests/gpu/gpu_guest.py), built and booted here, where
there is no GPU, so that a broken bundle shows up in CI and not first on the GPU machine.

It is the same guest the GPU test boots: this machine's root filesystem read-only over 9p, its own /dev. A real
oriond serves one region. The guest must have no GPU node and exactly one ivshmem device. A program's cuInit,
forwarded through the BAR, must come back from that oriond: CUDA_ERROR_NO_DEVICE, because no GPU is here.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.gpu.gpu_guest import REPO, boot_script, bundle_dir
from tests.gpu.test_forwarded_programs import Oriond

pytestmark = [pytest.mark.guest,
              pytest.mark.skipif(shutil.which("apt-get") is None, reason="the bundle is built from Debian packages"),
              pytest.mark.skipif(os.geteuid() != 0, reason="the bundle's build runs as root")]
CUINIT = ("import guest_runtime.activate as orion; orion.activate(); from cuda.bindings import driver; "
          "print('CUINIT', int(driver.cuInit(0)[0]))")
NO_DEVICE = 100


@pytest.fixture(scope="module")
def bundle() -> None:
    done = subprocess.run(["bash", "tests/gpu/build-guest-bundle.sh"], cwd=REPO, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def test_the_bundles_guest_sees_no_gpu_and_reaches_oriond_through_its_region(bundle: None, tmp_path: Path) -> None:
    agent = Oriond(tmp_path)
    shared = bundle_dir() / f"shared-{os.getpid()}"  # the guest sees this machine's files, not its /tmp
    shared.mkdir()
    try:
        (shared / "job.json").write_text(json.dumps({
            "env": {"PYTHONPATH": str(REPO)},
            "runs": [{"name": "cuinit", "raw": True, "env": {"ORION_NATIVE": "0"}, "argv": ["-c", CUINIT]}]}))
        result = boot_script(REPO / "tests/gpu/in_guest.py", [str(shared / "job.json")],
                             regions=[(str(agent.region), 256)], timeout=400)
        log = agent.log.read_text()
    finally:
        agent.stop()
        shutil.rmtree(shared, ignore_errors=True)
    assert result.rc == 0, result.serial[-4000:] + result.qemu_log[-2000:]
    assert result.line("GUEST-NVIDIA") == "GUEST-NVIDIA none"
    assert result.line("GUEST-IVSHMEM") == "GUEST-IVSHMEM 1"
    assert f"GUEST-SAID cuinit CUINIT {NO_DEVICE}" in result.lines("GUEST-SAID"), result.lines("GUEST-")
    assert "Creating session" in log, log  # the answer came from this oriond, through the BAR
