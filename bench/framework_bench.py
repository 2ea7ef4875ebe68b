#!/usr/bin/env python3
"""Frameworks natively and through the native guest driver (issue 13), in one run on the GPU machine: PyTorch
per-op latency (a tiny in-place add, synchronised every 100 ops) and a training step of a small CNN, a CuPy
elementwise loop and a JAX jitted loop. Each is timed inside its own process after a warm-up, natively and with
the native driver as its libcuda talking to a real oriond on the same machine; prints microseconds per item
and the ratio to native (no thresholds: docs/performance.md records the results). Each workload's result after its
timed runs (a digest of its data; the training step's last loss) is compared with the native run's (bench/verify.py):
exactly, except the loss (cuDNN's backward may sum in another order: within 1e-3 relative); a ratio is printed only
for a result that agrees, otherwise a WRONG RESULT line, and the exit status is 1.

Run: python3 bench/framework_bench.py   (from the repository root; needs gcc, a GPU, torch/cupy/jax)
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.verify import Checks  # noqa: E402
from bench.workload_process import Forwarded, forwarding, run, why  # noqa: E402

WORKLOADS = {
    "torch_op": ("torch", r"""
import torch, time
x = torch.arange(1024, dtype=torch.float32, device="cuda")
def run(n):
    for i in range(n):
        x.add_(1)
        if i % 100 == 99: torch.cuda.synchronize()
    torch.cuda.synchronize()
def result():
    return digest(x.cpu().numpy())
"""),
    "torch_step": ("torch", r"""
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                      nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(256, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
images, labels = torch.randn(64, 1, 28, 28).cuda(), torch.randint(0, 10, (64,)).cuda()
losses = []
def run(n):
    for _ in range(n):
        opt.zero_grad(); loss = nn.functional.cross_entropy(model(images), labels); loss.backward(); opt.step()
    losses[:] = [loss]
    torch.cuda.synchronize()
def result():
    return float(losses[0].item())
"""),
    "cupy_loop": ("cupy", r"""
import cupy as cp
x = cp.arange(1 << 16, dtype=cp.float32) / (1 << 16)
def run(n):
    for _ in range(n):
        cp.multiply(x, 1.0001, out=x); cp.add(x, 1, out=x)
    cp.cuda.Device().synchronize()
def result():
    return digest(x.get())
"""),
    "jax_loop": ("jax", r"""
import jax, jax.numpy as jnp
import numpy as np
step = jax.jit(lambda v: jnp.tanh(v) * 1.0001 + 1)
x = jnp.arange(1 << 16, dtype=jnp.float32) / (1 << 16)
def run(n):
    global x
    for _ in range(n):
        x = step(x)
    x.block_until_ready()
def result():
    return digest(np.asarray(x))
"""),
}
ITEMS = {"torch_op": 2000, "torch_step": 50, "cupy_loop": 1000, "jax_loop": 1000}
# The workloads' results are compared exactly (the same kernels on the same GPU give the same bits), except the
# training step's loss: cuDNN's convolution backward may sum in a different order from run to run.
REL_TOL = {"torch_step": 1e-3}
PRELUDE = "from bench.verify import digest\n"
TIMER = r"""
import time, json
run(max(1, ITEMS // 10))
best = None
for _ in range(3):
    t = time.perf_counter(); run(ITEMS); dt = (time.perf_counter() - t) / ITEMS * 1e6
    best = dt if best is None else min(best, dt)
print("RESULT " + json.dumps({"us": best, "result": result()}))
"""


def measure(name: str, forwarded: Forwarded | None) -> tuple[float, object]:
    """Microseconds per item of workload `name`, natively (`forwarded` None) or forwarded, and its result after the
    timed runs (a digest of its data, or the training step's last loss)."""
    _module, body = WORKLOADS[name]
    # (JAX's default allocator would take the GPU otherwise; forwarded, the driver's NVML answers device counts:
    # CUDA_VISIBLE_DEVICES="" would hide them)
    measured = run(name, PRELUDE + body + f"ITEMS = {ITEMS[name]}\n" + TIMER, forwarded, 600,
                   {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    return float(measured["us"]), measured["result"]


def main() -> int:
    checks = Checks()
    with forwarding() as forwarded_to:
        print(f"{'workload':<12} {'native us':>10} {'forwarded us':>13} {'ratio':>7}")
        for name, (module, _body) in WORKLOADS.items():
            if importlib.util.find_spec(module) is None:
                print(f"{name:<12} skipped: {module} is not installed")
                continue
            try:
                (native, expected), (forwarded, got) = measure(name, None), measure(name, forwarded_to)
            except RuntimeError as exc:
                print(f"{name:<12} FAILED: {why(exc)}")
                continue
            ratio = checks.ratio(name, forwarded, native, expected, got, rel_tol=REL_TOL.get(name))
            print(f"{name:<12} {native:10.1f} {forwarded:13.1f} {ratio:>7}{'x' if ratio != 'WRONG' else ''}")
    return checks.exit_status()


if __name__ == "__main__":
    sys.exit(main())
