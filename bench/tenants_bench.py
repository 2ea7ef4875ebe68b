#!/usr/bin/env python3
"""Several tenants on one GPU (issue 30): K = 1, 2, 4 processes each training a ResNet-18 (batch 64, random data),
natively and through the native guest driver against one oriond (a session each), in one run on the GPU machine.

Each process warms up, says it is ready, and starts its timed steps when all K are ready, so the K runs overlap.
Printed per K: the aggregate images per second of the K native processes and of the K forwarded ones, their ratio,
and the spread (fastest over slowest process) of each: how evenly the GPU was shared. Every process's last loss is
checked against the native run's first (the same seed and data everywhere: within 1e-3 relative, cuDNN's backward
may sum in another order); a wrong one prints WRONG RESULT and no ratio, and the exit status is 1.

`--mps` adds, per K, K native processes under an MPS control daemon and K forwarded tenants against an oriond whose
session workers run under MPS (host_agent/daemon/mps.py), both with the GPU carved into K vGPUs (each process 100/K %
of the SMs): the forwarded aggregate over the native one under the same MPS share, its losses checked against
theirs (cuDNN and cuBLAS choose their kernels by the SMs a process may use, so a loss under MPS is compared with one
under MPS), and each MPS aggregate over one native process alone, which is what MPS is for. `--batch` sets the
tenants' batch (default 64; a small one leaves the GPU idle between a tenant's kernels, where MPS pays).

Run: python3 bench/tenants_bench.py [--tenants 1 2 4] [--steps N] [--batch B] [--mps]   (from the repository
root; needs gcc, a GPU, torch and torchvision)
"""
from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.verify import Checks  # noqa: E402
from bench.workload_process import Forwarded, command, forwarding, result_of, why  # noqa: E402

TENANT = r"""
import json, sys, time, torch, torchvision
torch.manual_seed(0)
model = torchvision.models.resnet18(weights=None).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
images, labels = torch.randn(BATCH, 3, 224, 224, device="cuda"), torch.randint(0, 1000, (BATCH,), device="cuda")
def step():
    opt.zero_grad(); loss = torch.nn.functional.cross_entropy(model(images), labels); loss.backward(); opt.step()
    return loss
for _ in range(5): step()
torch.cuda.synchronize()
print("READY", flush=True)
sys.stdin.readline()  # GO: every tenant is ready
t = time.perf_counter()
for _ in range(STEPS): loss = step()
torch.cuda.synchronize()
print("RESULT " + json.dumps({"rate": STEPS * BATCH / (time.perf_counter() - t), "loss": float(loss.item())}))
"""


def tenants(k: int, steps: int, batch: int, forwarded: Forwarded | None,
            extra: dict[str, str] | None = None) -> list[dict[str, float]]:
    """Each of `k` processes' images per second and last loss, their timed steps run together (`extra`: more
    environment)."""
    argv, env = command(f"STEPS, BATCH = {steps}, {batch}\n" + TENANT, forwarded)
    env |= extra or {}
    procs = [subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(k)]
    try:
        for p in procs:
            line = p.stdout.readline() if p.stdout else ""
            if line.strip() != "READY":
                why = p.stderr.read()[-1500:] if p.stderr else ""
                raise RuntimeError(f"a tenant did not start: {line.strip()} {why}")
        for p in procs:
            if p.stdin:
                p.stdin.write("GO\n")
                p.stdin.flush()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=900)
            result = result_of(out)
            if p.returncode != 0 or result is None:
                raise RuntimeError(f"a tenant failed: {err[-1500:]}")
            results.append(result)
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


@contextlib.contextmanager
def native_under_mps(k: int) -> Iterator[dict[str, str]]:
    """An MPS control daemon of its own for K native processes, as oriond starts one for its session workers (each
    process 100/K % of the SMs): the environment that leads a process to it."""
    from host_agent.daemon import mps

    with tempfile.TemporaryDirectory() as tmp:
        daemon = mps.start(mps.MpsSettings(True, tmp), k, export=False)
        if daemon is None:
            raise RuntimeError("MPS cannot run here (the line above says why)")
        try:
            yield daemon.environment
        finally:
            daemon.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, nargs="*", default=[1, 2, 4], help="the K to run (default 1 2 4)")
    parser.add_argument("--steps", type=int, default=40, help="timed training steps per tenant (default 40)")
    parser.add_argument("--batch", type=int, default=64, help="each tenant's batch (default 64)")
    parser.add_argument("--mps", action="store_true", help="also K forwarded tenants under MPS, K vGPUs")
    args = parser.parse_args()
    checks = Checks()
    alone = 0.0  # one native process's images per second: what MPS is measured against
    with forwarding() as forwarded_to:
        print(f"{'K':>2} {'':>4} {'native img/s':>13} {'forwarded img/s':>16} {'ratio':>7} {'native spread':>14} "
              f"{'forwarded spread':>17} {'/ one native alone':>19}")
        for k in args.tenants:
            try:
                native = tenants(k, args.steps, args.batch, None)
                runs = [("", native, tenants(k, args.steps, args.batch, forwarded_to))]
                if args.mps:
                    with native_under_mps(k) as environment:
                        native_mps = tenants(k, args.steps, args.batch, None, environment)
                    with forwarding(vgpu_count=k, mps=True) as under_mps:
                        runs.append(("MPS", native_mps, tenants(k, args.steps, args.batch, under_mps)))
            except RuntimeError as exc:
                print(f"{k:>2} FAILED: {why(exc)}")
                continue
            alone = sum(r["rate"] for r in native) if k == 1 else alone
            for label, baseline, forwarded in runs:
                expected = baseline[0]["loss"]
                total_native = sum(r["rate"] for r in baseline)
                ratio: str = "WRONG"
                total_forwarded = sum(r["rate"] for r in forwarded)
                for i, r in enumerate(forwarded):  # every tenant's loss, the first decides the ratio cell
                    cell = checks.ratio(f"K={k} {label} tenant {i}", total_forwarded, total_native, expected,
                                        r["loss"], rel_tol=1e-3)
                    ratio = cell if i == 0 or cell == "WRONG" else ratio
                spread = [max(r["rate"] for r in rs) / min(r["rate"] for r in rs) for rs in (baseline, forwarded)]
                mark = "x" if ratio != "WRONG" else " "
                over_one = (f"{total_native / alone:5.2f}x {total_forwarded / alone:5.2f}x" if alone and
                            ratio != "WRONG" else f"{'-':>13}")
                print(f"{k:>2} {label:>4} {total_native:13.1f} {total_forwarded:16.1f} {ratio:>6}{mark} "
                      f"{spread[0]:14.3f} {spread[1]:17.3f} {over_one}")
    return checks.exit_status()


if __name__ == "__main__":
    sys.exit(main())
