"""The session worker's compiled hot path on a real GPU: bound to cuda.bindings.cydriver's C functions, and the
programs that lean on it (launches, async copies on a stream, synchronise) give the native results.

GPU machine only (the device machine); skipped elsewhere, and where the hot path cannot be built (no compiler or
Python headers: then the worker serves everything in Python, which the other GPU tests cover).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from host_agent.session import hot_path
from tests.gpu.test_forwarded_programs import HAS_GPU, PROGRAMS, Oriond, run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU (device machine)"),
              pytest.mark.skipif(hot_path.load() is None, reason="the compiled hot path cannot be built here")]


@pytest.mark.parametrize("name", ["stream_order_program.py", "driver_program.py"])
def test_programs_served_by_the_compiled_path_give_the_native_results(name: str, tmp_path: Path) -> None:
    native = run(PROGRAMS / name, None)
    agent = Oriond(tmp_path)
    try:
        forwarded = run(PROGRAMS / name, agent)
        log = agent.log.read_text()
    finally:
        agent.stop()
    assert forwarded == native
    served = next((line for line in log.splitlines() if "compiled hot path serves" in line), "")
    for call in ("cuLaunchKernel", "cuCtxSynchronize", "cuStreamSynchronize", "cuMemcpyDtoHAsync", "cuMemcpyHtoD"):
        assert call in served, f"{call} is not on the compiled path:\n{log[-3000:]}"
