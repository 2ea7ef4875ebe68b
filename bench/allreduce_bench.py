#!/usr/bin/env python3
"""NCCL all-reduce across the GPUs of one process (issue 32), natively and through the native guest driver, in one run
on a machine with two GPUs: torch.cuda.nccl.all_reduce (what DataParallel uses) over one float32 tensor on each
device, sizes 1 KiB to 256 MiB; bus bandwidth as nccl-tests defines it for all-reduce (size / time x 2(n-1)/n).

Each process checks every size's result on every device (device d holds d+1 everywhere; the sum is n(n+1)/2) and
reports the sums; the forwarded run's are compared with the native run's before any ratio prints (bench/verify.py).
The forwarded session's region is 2 GiB: NCCL page-locks two ~9 MiB POSIX shared-memory segments per process, which
the native driver moves into the region's page-locked pool (docs/multi-gpu.md), so the pool must hold them.

Run: python3 bench/allreduce_bench.py [--rounds N]   (from the repository root; needs two GPUs and torch)
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

SIZES = [1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28]
REGION_MIB = 2048
WORKLOAD = r"""
import json, time, torch
import torch.cuda.nccl as nccl
n = torch.cuda.device_count()
out = {"devices": n, "busbw": {}, "sums": {}}
for size in SIZES:
    tensors = [torch.full((size // 4,), float(d + 1), device=f"cuda:{d}") for d in range(n)]
    nccl.all_reduce(tensors)
    for d in range(n): torch.cuda.synchronize(d)
    out["sums"][size] = [float(t.double().sum().item()) for t in tensors]
    reps = 50 if size <= (1 << 22) else 10
    for _ in range(3): nccl.all_reduce(tensors)
    for d in range(n): torch.cuda.synchronize(d)
    t = time.perf_counter()
    for _ in range(reps): nccl.all_reduce(tensors)
    for d in range(n): torch.cuda.synchronize(d)
    took = (time.perf_counter() - t) / reps
    out["busbw"][size] = size / took * 2 * (n - 1) / n / 1e9
print("RESULT " + json.dumps(out))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="alternating native/forwarded pairs (default 1)")
    args = parser.parse_args()
    checks = Checks()
    code = f"SIZES = {SIZES!r}\n" + WORKLOAD
    ratios: dict[int, list[float]] = {size: [] for size in SIZES}
    with forwarding(region_mib=REGION_MIB) as forwarded:
        print(f"{'size':>10} {'native GB/s':>12} {'forwarded GB/s':>15} {'forwarded/native':>17}")
        for round_ in range(args.rounds):
            try:
                native, here = run("allreduce", code, None, 600), run("allreduce", code, forwarded, 600)
            except RuntimeError as exc:
                print(f"FAILED: {why(exc)}")
                return 1
            for size in SIZES:
                key = str(size)
                ratio = checks.ratio(f"all-reduce {size} B", here["busbw"][key], native["busbw"][key],
                                     native["sums"][key], here["sums"][key])
                if ratio != "WRONG":
                    ratios[size].append(here["busbw"][key] / native["busbw"][key])
                label = f"{size >> 10} KiB" if size < 1 << 20 else f"{size >> 20} MiB"
                print(f"{label:>10} {native['busbw'][key]:12.2f} {here['busbw'][key]:15.2f} {ratio:>16}x"
                      + (f"  (round {round_ + 1})" if args.rounds > 1 else ""))
        if args.rounds > 1:
            for size in SIZES:
                if ratios[size]:
                    print(f"{size:>10} median {statistics.median(ratios[size]):.2f}x")
    return checks.exit_status()


if __name__ == "__main__":
    sys.exit(main())
