#!/usr/bin/env python3
"""NCCL all-reduce over the GPUs of a machine (issue 32), natively and through the native guest driver, in one run
on a machine with two GPUs, sizes 1 KiB to 256 MiB, one float32 tensor per device; bus bandwidth as nccl-tests
defines it for all-reduce (size / time x 2(n-1)/n). Two ways a program does it:
- `--across devices` (default): one process drives every device, torch.cuda.nccl.all_reduce (what DataParallel uses);
- `--across processes`: one process (rank) per device, torch.distributed's all_reduce with the nccl backend (what
  DistributedDataParallel uses); each rank is its own session, and NCCL's P2P transport shares their device memory
  through exported cuMem handles (docs/multi-gpu.md). Rank 0 reports, and the slowest rank's time counts.

Device or rank d holds d+1 everywhere, so a right all-reduce leaves n(n+1)/2 in every element; every size's sum on
every device is reported, and the forwarded run's sums are compared with the native run's before any ratio prints
(bench/verify.py).
Each size: three untimed all-reduces, then 50 timed between two synchronizes (nccl-tests' way), so the loop's fixed
costs (its synchronize, the ranks' skew after the barrier) stay small next to its work at every size.
The forwarded session's region is 2 GiB: NCCL page-locks two ~9 MiB POSIX shared-memory segments per process, which
the native driver moves into the region's page-locked pool (docs/multi-gpu.md), so the pool must hold them.

Run: python3 bench/allreduce_bench.py [--rounds N] [--across devices|processes]   (repository root; two GPUs, torch)
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
    reps = 50
    for _ in range(3): nccl.all_reduce(tensors)
    for d in range(n): torch.cuda.synchronize(d)
    t = time.perf_counter()
    for _ in range(reps): nccl.all_reduce(tensors)
    for d in range(n): torch.cuda.synchronize(d)
    took = (time.perf_counter() - t) / reps
    out["busbw"][size] = size / took * 2 * (n - 1) / n / 1e9
print("RESULT " + json.dumps(out))
"""
# One rank per device: started from the command line this process was (interpreter, loader, code), with --rank.
RANKS = r"""
import json, os, sys, time
if "--rank" not in sys.argv:
    import torch
    n = torch.cuda.device_count()
    from tests.gpu.programs.rank_launcher import free_port, run_ranks
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD": str(n)}
    sys.exit(run_ranks([[*sys.orig_argv, "--rank", str(r)] for r in range(n)], 500, env))
import torch, torch.distributed as dist
rank, n = int(sys.argv[sys.argv.index("--rank") + 1]), int(os.environ["WORLD"])
device = torch.device("cuda", rank)
torch.cuda.set_device(device)
dist.init_process_group("nccl", rank=rank, world_size=n, device_id=device)
out = {"devices": n, "busbw": {}, "sums": {}}
for size in SIZES:
    tensor = torch.full((size // 4,), float(rank + 1), device=device)
    dist.all_reduce(tensor)
    sums = [None] * n
    dist.all_gather_object(sums, float(tensor.double().sum().item()))
    out["sums"][size] = sums
    reps = 50
    for _ in range(3): dist.all_reduce(tensor)
    torch.cuda.synchronize(); dist.barrier()
    t = time.perf_counter()
    for _ in range(reps): dist.all_reduce(tensor)
    torch.cuda.synchronize()
    took = [None] * n
    dist.all_gather_object(took, (time.perf_counter() - t) / reps)
    out["busbw"][size] = size / max(took) * 2 * (n - 1) / n / 1e9
dist.destroy_process_group()
if rank == 0:
    print("RESULT " + json.dumps(out))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="alternating native/forwarded pairs (default 1)")
    parser.add_argument("--across", choices=["devices", "processes"], default="devices",
                        help="one process driving every device, or one process per device (default devices)")
    args = parser.parse_args()
    checks = Checks()
    code = f"SIZES = {SIZES!r}\n" + (WORKLOAD if args.across == "devices" else RANKS)
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
