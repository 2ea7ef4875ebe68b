"""The whole path on real hardware: a QEMU guest on the GPU machine runs the unmodified tests/gpu programs through
the ivshmem BAR of one Orion region, served by oriond on the host, and they give the native results.

The guest (tests/gpu/gpu_guest.py, TCG) shares the host's root filesystem read-only, so it runs the same Python and
cuda-bindings, but it has its own /dev: no /dev/nvidia*, so the host's driver library finds no GPU there, and the
only way to the GPU is the region. GPU machine only, with the bundle from tests/gpu/build-guest-bundle.sh carried
along (.gpu-guest); skipped elsewhere.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.gpu_guest import REPO, boot_script, bundle_dir, bundle_ready
from tests.gpu.test_forwarded_programs import FORWARD, HAS_GPU, PROGRAMS, Oriond, assert_same_results, run
from tests.gpu.test_native_frameworks import JAX_ENV, build_libraries, on_native_driver, run_on_driver
from tests.guest.vm import GuestResult

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU (device machine)"),
              pytest.mark.skipif(not bundle_ready(), reason="no guest bundle: run bash tests/gpu/build-guest-bundle.sh "
                                                            "and carry .gpu-guest to the GPU machine")]
NAMES = ["driver_program.py", "core_program.py", "stream_order_program.py", "runtime_program.py",
         "pinned_threads_program.py"]


@pytest.fixture
def oriond(tmp_path: Path) -> Iterator[Oriond]:
    agent = Oriond(tmp_path)
    yield agent
    agent.stop()


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory the guest sees (it has this machine's files, but its own /tmp)."""
    where = bundle_dir() / f"shared-{os.getpid()}"
    where.mkdir()
    yield where
    shutil.rmtree(where, ignore_errors=True)


def in_guest(oriond: Oriond, shared: Path, runs: list[dict[str, Any]]) -> tuple[GuestResult, dict[str, Any]]:
    """Boot the guest with `oriond`'s region and run `runs` there (tests/gpu/in_guest.py's job); the result, and
    each run's RESULT by name. The guest sees no GPU node and the driver library alone finds no device there."""
    job = shared / "job.json"
    job.write_text(json.dumps({"env": {"PYTHONPATH": str(REPO), "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH",
                                                                                                   "")},
                               "runs": runs}))
    result = boot_script(REPO / "tests/gpu/in_guest.py", [str(job)], regions=[(str(oriond.region), 256)],
                         timeout=540)
    print("\n".join(result.lines("GUEST-")), f"\nguest wall time {result.wall_s:.0f} s")
    assert result.rc is not None, result.serial[-4000:] + result.qemu_log[-2000:]
    assert result.line("GUEST-NVIDIA") == "GUEST-NVIDIA none"  # no GPU node in the guest
    assert result.line("GUEST-IVSHMEM") == "GUEST-IVSHMEM 1"  # only the region
    native_init = result.line("GUEST-NATIVE")
    assert native_init is not None and native_init != "GUEST-NATIVE 0", native_init  # the driver alone finds nothing
    results = {line.split(" ", 2)[1]: json.loads(line.split(" ", 2)[2]) for line in result.lines("GUEST-RESULT ")}
    assert result.rc == 0 and set(results) == {r["name"] for r in runs}, result.lines("GUEST-")
    assert "Creating session" in oriond.log.read_text()  # the calls went through the host's oriond
    return result, results


def test_a_guest_runs_the_programs_on_the_gpu_through_its_region_and_gets_the_native_results(
        oriond: Oriond, shared: Path) -> None:
    native = {name: run(PROGRAMS / name, None) for name in NAMES}
    _, forwarded = in_guest(oriond, shared, [{"name": name, "argv": ["-c", FORWARD, str(PROGRAMS / name)],
                                              "env": {"ORION_NATIVE": "0"}} for name in NAMES])
    for name in NAMES:
        assert forwarded[name] == native[name], name


def test_pytorch_trains_in_a_guest_on_the_native_driver_with_the_native_losses(oriond: Oriond, shared: Path) -> None:
    """The native guest driver as the guest's libcuda: a PyTorch matmul and the 20-step CNN training of issue 13,
    inside the guest, give what they give natively (losses to 1e-5 relative, as on the host)."""
    pytest.importorskip("torch")
    arguments, env = on_native_driver(build_libraries(shared))
    programs = ["torch_matmul_program.py", "torch_cnn_program.py"]
    native = {name: run_on_driver(PROGRAMS / name, None) for name in programs}
    result, forwarded = in_guest(oriond, shared, [{"name": name, "argv": [*arguments, str(PROGRAMS / name)],
                                                   "env": env} for name in programs])
    said = result.lines("GUEST-SAID ")
    assert len(said) == 2 and all(line.endswith("REAL_LIBCUDA False NVML False") for line in said), said
    matmul = forwarded["torch_matmul_program.py"]
    assert matmul == native["torch_matmul_program.py"] and matmul["count"] == 1
    cnn, cnn_native = forwarded["torch_cnn_program.py"], native["torch_cnn_program.py"]
    assert cnn_native["learned"] and len(cnn["losses"]) == 20
    assert all(math.isclose(f, n, rel_tol=1e-5) for f, n in zip(cnn["losses"], cnn_native["losses"], strict=True)), \
        (cnn["losses"], cnn_native["losses"])


def test_cupy_and_jax_in_a_guest_on_the_native_driver_give_the_native_results(oriond: Oriond, shared: Path) -> None:
    """CuPy (elementwise, cuBLAS, cuRAND) and JAX (a jitted matmul and its gradient, XLA's default allocator on the
    virtual-memory API) on the native guest driver, inside the guest."""
    pytest.importorskip("cupy")
    pytest.importorskip("jax")
    arguments, env = on_native_driver(build_libraries(shared))
    native = {"cupy_program.py": run_on_driver(PROGRAMS / "cupy_program.py", None),
              "jax_program.py": run_on_driver(PROGRAMS / "jax_program.py", None, **JAX_ENV)}
    runs = [{"name": "cupy_program.py", "argv": [*arguments, str(PROGRAMS / "cupy_program.py")], "env": env},
            {"name": "jax_program.py", "argv": [*arguments, str(PROGRAMS / "jax_program.py")],
             "env": {**env, **JAX_ENV}}]
    _, forwarded = in_guest(oriond, shared, runs)
    for name, expected in native.items():  # JAX's sums to a tolerance: XLA's autotuner may pick another GEMM
        assert_same_results(name, expected, forwarded[name])
