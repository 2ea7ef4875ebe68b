#!/usr/bin/env python3
"""Data-parallel training across processes (issue 32), natively and through the native guest driver, in one run on a
machine with two GPUs: tests/gpu/programs/ddp_resnet_program.py (DistributedDataParallel ResNet-50, NCCL, one rank
per GPU, random data) and the median step time of each, alternating native and forwarded rounds.

Each round's losses and whether the ranks ended with the same parameters are compared with the native run's
(bench/verify.py) before the ratio prints: a forwarded step time is only reported for a run that trained as the native
one did. Aim: forwarded step time <= 1.05x native. The region is 2 GiB, as NCCL's shared segments need
(docs/multi-gpu.md).

Run: python3 bench/ddp_bench.py [--rounds N] [--steps N] [--batch N]   (from the repository root; two GPUs, torch)
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.verify import Checks  # noqa: E402
from bench.workload_process import forwarding, run, why  # noqa: E402

PROGRAM = REPO / "tests" / "gpu" / "programs" / "ddp_resnet_program.py"
REGION_MIB = 2048


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="alternating native/forwarded pairs (default 2)")
    parser.add_argument("--steps", type=int, default=12, help="training steps per run (default 12)")
    parser.add_argument("--batch", type=int, default=32, help="images per rank and step (default 32)")
    args = parser.parse_args()
    code = PROGRAM.read_text()
    env = {"DDP_STEPS": str(args.steps), "DDP_BATCH": str(args.batch), "DDP_WORLD": "2"}
    checks, ratios = Checks(), []
    with forwarding(region_mib=REGION_MIB) as forwarded:
        print(f"{'round':>5} {'native ms/step':>15} {'forwarded ms/step':>18} {'forwarded/native time':>22}")
        for round_ in range(args.rounds):
            try:
                native = run("ddp", code, None, 900, env)
                here = run("ddp", code, forwarded, 900, env)
            except RuntimeError as exc:
                print(f"FAILED: {why(exc)}")
                return 1
            trained = [native["losses"], native["same_parameters"]]
            ratio = checks.ratio(f"DDP step, round {round_ + 1}", here["step_ms"], native["step_ms"], trained,
                                 [here["losses"], here["same_parameters"]], form="{:.3f}")
            if ratio != "WRONG":
                ratios.append(here["step_ms"] / native["step_ms"])
            print(f"{round_ + 1:>5} {native['step_ms']:15.1f} {here['step_ms']:18.1f} {ratio:>21}x")
    if ratios:
        print(f"median forwarded/native step time: {statistics.median(ratios):.3f}x (aim <= 1.05x)")
    return checks.exit_status()


if __name__ == "__main__":
    sys.exit(main())
