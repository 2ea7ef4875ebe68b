"""The whole path on real hardware: a QEMU guest on the GPU machine runs the unmodified tests/gpu programs through
the ivshmem BAR of one Orion region, served by oriond on the host, and they give the native results.

The guest (tests/gpu/gpu_guest.py, TCG) shares the host's root filesystem read-only, so it runs the same Python and
cuda-bindings, but it has its own /dev: no /dev/nvidia*, so the host's driver library finds no GPU there, and the
only way to the GPU is the region. GPU machine only, with the bundle from tests/gpu/build-guest-bundle.sh carried
along (.gpu-guest); skipped elsewhere.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gpu.gpu_guest import REPO, boot_script, bundle_dir, bundle_ready
from tests.gpu.test_forwarded_programs import HAS_GPU, PROGRAMS, Oriond, run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU (device machine)"),
              pytest.mark.skipif(not bundle_ready(), reason="no guest bundle: run bash tests/gpu/build-guest-bundle.sh "
                                                            "and carry .gpu-guest to the GPU machine")]
NAMES = ["driver_program.py", "core_program.py", "stream_order_program.py", "runtime_program.py"]
NO_DEVICE = 100  # CUDA_ERROR_NO_DEVICE


@pytest.fixture
def oriond(tmp_path: Path) -> Iterator[Oriond]:
    agent = Oriond(tmp_path)
    yield agent
    agent.stop()


def test_a_guest_runs_the_programs_on_the_gpu_through_its_region_and_gets_the_native_results(
        oriond: Oriond, tmp_path: Path) -> None:
    native = {name: run(PROGRAMS / name, None) for name in NAMES}
    job = bundle_dir() / f"job-{os.getpid()}.json"  # the guest sees this machine's files, but not its /tmp
    job.write_text(json.dumps({"programs": [str(PROGRAMS / name) for name in NAMES],
                               "env": {"PYTHONPATH": str(REPO), "ORION_NATIVE": "0",
                                       "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", "")}}))
    try:
        result = boot_script(REPO / "tests/gpu/in_guest.py", [str(job)], regions=[(str(oriond.region), 256)],
                             timeout=540)
    finally:
        job.unlink()
    (tmp_path / "serial.log").write_text(result.serial)
    print("\n".join(result.lines("GUEST-")), f"\nguest wall time {result.wall_s:.0f} s")
    assert result.rc is not None, result.serial[-4000:] + result.qemu_log[-2000:]
    assert result.line("GUEST-NVIDIA") == "GUEST-NVIDIA none"  # no GPU node in the guest
    assert result.line("GUEST-IVSHMEM") == "GUEST-IVSHMEM 1"  # only the region
    native_init = result.line("GUEST-NATIVE")
    assert native_init is not None and native_init != "GUEST-NATIVE 0", native_init  # the driver alone finds nothing
    forwarded = {line.split(" ", 2)[1]: json.loads(line.split(" ", 2)[2]) for line in result.lines("GUEST-RESULT ")}
    assert result.rc == 0 and set(forwarded) == set(NAMES), result.lines("GUEST-")
    for name in NAMES:
        assert forwarded[name] == native[name], name
    assert "Creating session" in oriond.log.read_text()  # the calls went through the host's oriond
