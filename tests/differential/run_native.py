"""Runs corpus sequences through a C driver library (the native `libcuda.so.1`) in this process and prints their
transcripts as one JSON list: `python -m tests.differential.run_native LIBRARY SEED [SEED ...]`, with ORION_SHM
(or the GPU machine's guest's PCI region) in the environment as any program of the library's would have it."""
from __future__ import annotations

import ctypes
import json
import sys

from tests.differential.corpus import Runner, ctypes_table, sequence


def main(argv: list[str]) -> int:
    library, seeds = argv[0], [int(s) for s in argv[1:]]
    runner = Runner(ctypes_table(ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)))
    print(json.dumps([runner.run(sequence(seed)) for seed in seeds]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
