"""A vGPU quota counts what the session's worker really holds on the GPU, checked against NVML on a real GPU.

GPU machine only (the device machine); skipped elsewhere. tests/gpu/programs/quota_program.py runs natively (no
quota: a 64 MiB module global and 50 extra contexts all fit, and NVML shows what they cost) and forwarded through
a real `oriond --gmem 16` (the module and the first extra context that do not fit are refused with
CUDA_ERROR_OUT_OF_MEMORY, an allocation within the quota still succeeds), and NVML shows that the session worker
holds no more than its first context and its quota.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.gpu.test_forwarded_programs import HAS_GPU, PROGRAMS, Oriond, run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU (device machine)")]

MIB = 1 << 20
QUOTA_MIB = 16
OUT_OF_MEMORY = 2
ROUNDING = 2 * MIB  # the driver's allocation granularity


def _held(result: dict, pid: int | str) -> int:
    """What NVML said process `pid` held at the end of the program."""
    table = result["nvml_at_end"]
    assert isinstance(table, dict), f"NVML could not list the GPU's processes: {table}"
    assert str(pid) in table, f"NVML does not list process {pid}: {table}"
    return int(table[str(pid)])


def test_module_globals_and_extra_contexts_count_against_the_quota(tmp_path: Path) -> None:
    program = PROGRAMS / "quota_program.py"
    native = run(program, None)
    agent = Oriond(tmp_path, "--gmem", str(QUOTA_MIB))
    try:
        forwarded = run(program, agent)
        log = agent.log.read_text()
    finally:
        agent.stop()
    sys.stderr.write("quota numbers: " + json.dumps({"native": native, "forwarded": forwarded}) + "\n")

    # Natively everything fits, and NVML sees what a quota must count.
    pid = str(native["pid"])
    context = int(native["nvml_after_context"][pid])  # what the first context costs: never counted
    assert native["big_module"] == 0 and native["extra_contexts"] == 50 and native["alloc_8_mib"] == 0
    assert int(native["nvml_after_module"][pid]) - context >= 64 * MIB
    per_context = (int(native["nvml_with_contexts"][pid]) - context) / 50
    assert per_context > 0

    # Forwarded under a 16 MiB quota: refused as by a full GPU, and an allocation within the quota still works.
    quota = QUOTA_MIB * MIB
    assert forwarded["total"] == quota
    assert forwarded["big_module"] == OUT_OF_MEMORY
    assert forwarded["context_error"] == OUT_OF_MEMORY
    assert forwarded["extra_contexts"] * per_context <= quota
    assert forwarded["alloc_8_mib"] == 0 and forwarded["alloc_16_mib_more"] == OUT_OF_MEMORY
    free, total = forwarded["info"]
    assert total == quota and 0 < free <= quota - 8 * MIB

    # NVML: the session's worker holds its first context, its 8 MiB and nothing of what was refused.
    workers = re.findall(r"CUDA executor in pid (\d+)", log)
    assert workers, log[-3000:]
    held = _held(forwarded, workers[-1])
    counted = quota - free  # what the executor counts against the quota
    sys.stderr.write(f"worker holds {held / MIB:.1f} MiB; native first context {context / MIB:.1f} MiB; counted "
                     f"{counted / MIB:.1f} MiB; an extra context costs {per_context / MIB:.1f} MiB; NVML query "
                     f"(init, per query) us: native {native['nvml_query_us']}, forwarded "
                     f"{forwarded['nvml_query_us']}\n")
    assert held - context < 64 * MIB  # the refused module's global is not held
    assert abs(held - context - counted) <= ROUNDING  # the worker's first context costs what a native one does


def test_memory_freed_with_a_reset_or_released_context_leaves_the_quota(tmp_path: Path) -> None:
    """cudaDeviceReset and a primary context's last release free what was allocated in it: natively the program
    can allocate as much again, and under a 16 MiB quota so can the forwarded one (12 MiB three times)."""
    program = PROGRAMS / "reset_quota_program.py"
    native = run(program, None)
    assert {k: v for k, v in native.items() if k != "free_mib"} == {
        "first_12_mib": 0, "reset": 0, "after_reset_12_mib": 0, "last_release": 0, "new_context_12_mib": 0}
    agent = Oriond(tmp_path, "--gmem", str(QUOTA_MIB))
    try:
        forwarded = run(program, agent)
    finally:
        agent.stop()
    assert {**forwarded, "free_mib": None} == {**native, "free_mib": None}
    assert forwarded["free_mib"] <= QUOTA_MIB - 12
