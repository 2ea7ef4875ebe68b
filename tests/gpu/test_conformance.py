"""The conformance matrix (issue 28): ordinary framework programs that no one here wrote the driver calls of, each
run natively and through the native guest driver on every path a session takes (served locally, relayed over TCP),
their values compared. docs/conformance.md reports the counts; an exception is a strict xfail with its reason.

Values: numbers agree to 1e-3 relative (the same kernels on the same GPU; cuBLAS may split a reduction differently
only if it chose another algorithm, which would itself be a difference worth seeing; TOLERANCE names the cases
whose native runs differ more among themselves), everything else exactly.
"""
from __future__ import annotations

import importlib.util
import math
import os
from typing import Any

import pytest

from tests.gpu.test_forwarded_programs import HAS_GPU, PATHS, PROGRAMS, REPO, native, oriond, relayed, served  # noqa: F401
from tests.gpu.test_native_frameworks import JAX_ENV, GuestLibraries, library, run_on_driver  # noqa: F401

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU (device machine)")]

PROGRAM = PROGRAMS / "conformance_program.py"
# numba-cuda 0.30.4 needs numpy < 2.5, which the GPU machine lacks (TESTBED.md): ORION_NUMBA_NUMPY names a folder
# holding one, put first on the numba case's path (the repository stays importable after it)
NUMBA_ENV = {"PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("ORION_NUMBA_NUMPY", ""), str(REPO),
                                                       os.environ.get("PYTHONPATH", "")) if p)}
# case -> the modules it needs (skipped where one is missing) and the environment it runs with
CASES: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "torch_fp32": (("torch",), {}),
    "torch_fp16_autocast": (("torch",), {}),
    "torch_bf16_autocast": (("torch",), {}),
    "torch_sdpa": (("torch",), {}),
    "torch_events_streams": (("torch",), {}),
    "torch_pinned_dataloader": (("torch",), {}),
    "torch_cuda_graph": (("torch",), {}),
    "torch_compile_default": (("torch", "triton"), {}),
    "torch_compile_reduce_overhead": (("torch", "triton"), {}),
    "torch_compile_reduce_overhead_training": (("torch", "triton"), {}),
    "transformers_gpt2": (("torch", "transformers"), {}),
    "torchvision_resnet18": (("torch", "torchvision"), {}),
    "jax_default": (("jax",), JAX_ENV),
    "cupy_libraries": (("cupy",), {}),
    "cupy_cusolver": (("cupy",), {}),
    "cupy_fft": (("cupy",), {}),
    "triton_kernel": (("torch", "triton"), {}),
    "cuda_core_cluster": (("cuda.core",), {}),
    "numba_kernels": (("numba",), NUMBA_ENV),
}
# case, or case-path, -> why it does not pass forwarded (a strict xfail: it starts failing the day it passes)
GAPS: dict[str, str] = {
    "cupy_cusolver": "cuBLAS (under cuSOLVER) calls entries 51 and 39 of the driver-private export table 21318c60, "
                     "which keep per-context objects of its own that the guest cannot build (measured on the H200; "
                     "docs/conformance.md)",
    "cupy_fft": "cuFFT plans through export table 6e163fbe entry 7, whose driver-side module object the guest cannot "
                "build (docs/native-driver.md, Status)",
}


# case -> the relative tolerance of its numbers, where 1e-3 is not what the native driver itself holds to: cuDNN's
# convolution backward may sum in another order from run to run (bench/framework_bench.py says the same)
TOLERANCE = {"torchvision_resnet18": 1e-2}


def assert_same_values(native_result: dict[str, Any], forwarded: dict[str, Any], where: str = "",
                       tolerance: float = 1e-3) -> None:
    """Every `ok` flag true natively; the forwarded run holds the same keys and values (numbers to `tolerance`)."""
    assert all(v for k, v in native_result.items() if k == "ok" or k.endswith("_ok")), native_result
    assert sorted(forwarded) == sorted(native_result), (forwarded, native_result)

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, float) or isinstance(b, float):
            return isinstance(a, int | float) and isinstance(b, int | float) and \
                math.isclose(a, b, rel_tol=tolerance, abs_tol=1e-6)
        if isinstance(a, list):
            return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
        return bool(a == b)
    differ = {k: (forwarded[k], native_result[k]) for k in native_result if not same(forwarded[k], native_result[k])}
    assert not differ, f"{where}: forwarded, native: {differ}"


def _case(name: str, path: str) -> object:
    gap = GAPS.get(f"{name}-{path}", GAPS.get(name))
    marks = [pytest.mark.xfail(strict=True, reason=gap)] if gap else []
    return pytest.param(name, path, marks=marks, id=f"{name}-{path}")


@pytest.mark.parametrize(("name", "path"), [_case(name, path) for name in CASES for path in PATHS])
def test_a_conformance_case_gives_the_native_values_forwarded(
        name: str, path: str, request: pytest.FixtureRequest, library: GuestLibraries) -> None:  # noqa: F811
    needs, env = CASES[name]
    missing = [m for m in needs if importlib.util.find_spec(m.split(".")[0]) is None]
    if missing:
        pytest.skip(f"{missing} not installed here (the GPU machine has them)")
    extra = {"CONFORMANCE_CASE": name, **env}
    expected = native(PROGRAM, **extra)
    if "skipped" in expected:
        pytest.skip(expected["skipped"])
    forwarded = run_on_driver(PROGRAM, (served(request, path), library), **extra)
    assert_same_values(expected, forwarded, f"{name} {path}", TOLERANCE.get(name, 1e-3))
