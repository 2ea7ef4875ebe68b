"""How a benchmark runs one workload in a process of its own, natively or on the native guest driver against an
oriond: its command line and environment, shared by bench/framework_bench.py, inference_bench.py and
tenants_bench.py. What the workload does, and how it is timed and checked, is each benchmark's own."""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# First in a forwarded workload's code: the native guest driver (the argument after the code) loaded before anything
# opens the CUDA driver, as the start-up hook loads it.
LOAD = "import sys; from guest_runtime.startup import load_native; load_native(sys.argv[1])\n"


def command(code: str, forwarded: tuple[Path, Path] | None) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a process running `code`: natively (`forwarded` None), or on the native
    guest driver `forwarded[1]` talking to the oriond whose region is `forwarded[0]`. None of the caller's Orion
    variables are passed on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")} | {"PYTHONPATH": str(REPO)}
    if forwarded is None:
        return [sys.executable, "-c", code], env
    region, library = forwarded
    return [sys.executable, "-c", LOAD + code, str(library)], env | {
        "ORION_SHM": str(region), "ORION_NATIVE": "1", "ORION_NATIVE_LIB": str(library)}
