"""Runs corpus sequences (tests/differential/corpus.py) in this process through one driver and prints one JSON
object: the transcripts, one per seed, every libcuda file mapped into the process at the end (so a caller can
tell which driver answered), and how many staging-chunk halves the native guest driver's copy helper copied
(guest_runtime/native/copy_helper.c; None for a driver without one).

    python -m tests.differential.run_corpus driver LIBRARY SEED [SEED ...]
    python -m tests.differential.run_corpus capsule SEED [SEED ...]

A SEED of `pool-kernels` runs tests/differential/pool_kernels.py's program instead (`pool-kernels-no-uva`: without
its copy from page-locked memory as device memory, which the fake driver does not serve).

`driver`: a C driver library -- the real libcuda (GPU machine: the reference) or the native guest driver, with
ORION_SHM (or a guest's PCI region) in the environment as any program of it would have. `capsule`: the capsule
path, guest_runtime.activate's Forwarder (the one a cuda-python program gets), on the region ORION_SHM names.
"""
from __future__ import annotations

import ctypes
import json
import sys
from typing import Any

from tests.differential import pool_kernels
from tests.differential.corpus import Runner, Table, ctypes_table, sequence


def table(mode: str, argv: list[str]) -> tuple[Table, list[str]]:
    """The driver table for `mode`, and the arguments left (the seeds)."""
    if mode == "driver":
        return ctypes_table(ctypes.CDLL(argv[0], mode=ctypes.RTLD_GLOBAL), pool_kernels.PROTOTYPES), argv[1:]
    if mode == "capsule":
        import guest_runtime.activate as orion

        return orion.activate().implementations(), argv
    raise SystemExit(f"unknown mode {mode!r}: driver or capsule")


def copy_halves(argv: list[str]) -> int | None:
    """The native guest driver's count of halves its copy helper ran (the same library, already loaded)."""
    counter = getattr(ctypes.CDLL(argv[1]), "orion_copy_helper_halves", None) if argv[0] == "driver" else None
    if counter is None:
        return None
    counter.restype = ctypes.c_uint64
    return int(counter())


def main(argv: list[str]) -> int:
    driver, seeds = table(argv[0], argv[1:])
    transcripts: list[Any] = []
    runner = None
    for seed in seeds:
        if seed.startswith("pool-kernels"):
            transcripts.append(pool_kernels.PoolKernelProgram(driver, uva_copies=seed == "pool-kernels").run())
            continue
        runner = runner or Runner(driver)
        transcripts.append(runner.run(sequence(int(seed))))
    with open("/proc/self/maps") as maps:
        mapped = sorted({line.split()[-1] for line in maps if "/libcuda.so" in line})
    print(json.dumps({"transcripts": transcripts, "libcuda": mapped, "copy_halves": copy_halves(argv)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
