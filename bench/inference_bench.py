#!/usr/bin/env python3
"""Latency-bound work natively and through the native guest driver (issue 30), in one run on the GPU machine:
batch-1 inference of ResNet-18 and ResNet-50 (torchvision, random weights, p50 latency of one image), token-by-token
decoding with a KV cache of a GPT-2-small-shaped model (`transformers.GPT2Config()`, random weights, tokens per
second), and one ResNet-18 or ResNet-50 training process alone (batch 64, images per second). Each is timed inside its
own process after a warm-up, natively and with the native driver as its libcuda talking to a real oriond on the same
machine.

Every result is checked against the native run's before a ratio prints (bench/verify.py): the logits' digest of
the inference models within 1e-3 relative (cuDNN may pick another algorithm in another process), the decoded tokens
exactly, the training's last loss within 1e-3 relative. A result that differs prints WRONG RESULT and no ratio, and
the exit status is 1.

With --rounds N, each workload is measured N times, native and forwarded alternately (one pair per round), each
round's ratio printed and then their median: native figures of these workloads swing by tens of percent between
runs on the GPU machine, and alternating keeps a slow spell from landing on one side only.

With --relayed, each workload also runs relayed: through a second oriond that relays the session over TCP loopback to
the first (docs/remote.md), its figure over the local forwarded one's printed as relayed/local, its result checked
against native too.

With --stats, each forwarded workload (and relayed one) runs once more under ORION_STATS and its table's summary and
costliest calls are printed (docs/performance.md, "Where the time goes"): where the forwarded time goes, call by call;
relayed, also the records the relaying host's Python served rather than its compiled pump.

Run: python3 bench/inference_bench.py [--rounds N] [--relayed] [--stats] [--only NAME ...]   (from the repository
root; needs gcc, a GPU, torch, torchvision and transformers)
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.verify import Checks  # noqa: E402
from bench.workload_process import Forwarded, forwarding, run, why  # noqa: E402

_RESNET = r"""
import torch, torchvision
torch.manual_seed(0)
model = torchvision.models.{name}(weights=None).cuda().eval()
image = torch.randn(1, 3, 224, 224, device="cuda")
out = []
def item():
    with torch.no_grad():
        out[:] = [model(image)]
    torch.cuda.synchronize()
def result():
    return float(out[0].double().abs().sum().item())
"""
_TRAIN = r"""
import torch, torchvision
torch.manual_seed(0)
model = torchvision.models.{name}(weights=None).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
images, labels = torch.randn(64, 3, 224, 224, device="cuda"), torch.randint(0, 1000, (64,), device="cuda")
losses = []
def run(n):  # n images: n // 64 steps
    for _ in range(max(1, n // 64)):
        opt.zero_grad(); loss = torch.nn.functional.cross_entropy(model(images), labels); loss.backward(); opt.step()
    losses[:] = [loss]
    torch.cuda.synchronize()
def result():
    return float(losses[0].item())
"""
WORKLOADS = {
    "resnet18_b1": ("torchvision", _RESNET.replace("{name}", "resnet18"), "latency"),
    "resnet50_b1": ("torchvision", _RESNET.replace("{name}", "resnet50"), "latency"),
    "gpt2_decode": ("transformers", r"""
import torch, transformers
torch.manual_seed(0)
model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).cuda().eval()
prompt = torch.randint(0, 50257, (1, 16), device="cuda")
tokens = []
def run(n):  # n tokens decoded one by one, each step feeding back the KV cache
    with torch.no_grad():
        past, ids, new = None, prompt, []
        for _ in range(n):
            step = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = step.past_key_values
            ids = step.logits[:, -1:].argmax(-1)
            new.append(ids)
        tokens[:] = torch.cat(new, 1)[0].tolist()
    torch.cuda.synchronize()
def result():
    return tokens
""", "throughput"),
    "resnet18_train": ("torchvision", _TRAIN.replace("{name}", "resnet18"), "throughput"),
    "resnet50_train": ("torchvision", _TRAIN.replace("{name}", "resnet50"), "throughput"),
}
ITEMS = {"resnet18_b1": 200, "resnet50_b1": 100, "gpt2_decode": 64, "resnet18_train": 640, "resnet50_train": 320}
UNITS = {"latency": "p50 ms", "throughput": "items/s"}
# gpt2_decode: its tokens exactly
REL_TOL = {"resnet18_b1": 1e-3, "resnet50_b1": 1e-3, "resnet18_train": 1e-3, "resnet50_train": 1e-3}
TIMERS = {
    # latency: each item timed alone, the median of ITEMS after a warm-up; throughput: items per second, best of 3
    "latency": r"""
import time, json, statistics
for _ in range(10): item()
times = []
for _ in range(ITEMS):
    t = time.perf_counter(); item(); times.append(time.perf_counter() - t)
print("RESULT " + json.dumps({"value": statistics.median(times) * 1e3, "result": result()}))
""",
    "throughput": r"""
import time, json
run(max(1, ITEMS // 4))
best = None
for _ in range(3):
    t = time.perf_counter(); run(ITEMS); rate = ITEMS / (time.perf_counter() - t)
    best = rate if best is None else max(best, rate)
print("RESULT " + json.dumps({"value": best, "result": result()}))
""",
}
STATS_ROWS = 8


def measure(name: str, forwarded: Forwarded | None, stats: Path | None = None) -> tuple[float, object]:
    """The workload's figure (p50 ms of one item, or items per second), natively (`forwarded` None) or forwarded,
    and its result after the timed runs. With `stats`, the forwarded process writes its ORION_STATS table there."""
    _module, body, kind = WORKLOADS[name]
    measured = run(name, body + f"ITEMS = {ITEMS[name]}\n" + TIMERS[kind], forwarded, 900,
                   {"ORION_STATS": str(stats)} if stats is not None else None)
    return float(measured["value"]), measured["result"]


def show_stats(path: Path) -> None:
    """The table's summary line and its costliest calls (the table is sorted by total time), and of a relayed
    session's rows those the relaying host's Python served (the rest its compiled pump forwarded)."""
    lines = path.read_text().splitlines()
    for line in lines[:2 + STATS_ROWS]:
        print(f"    {line}")
    relayed = [line for line in lines if line.startswith("(relayed ")]
    by_python = [line for line in relayed if line.split("|")[1].split()[3] != "0"]  # compiled, its us, driver us,
    # python, python us
    if relayed:
        print(f"    {len(relayed)} relayed rows, the relaying host's Python served {len(by_python)}:")
    for line in by_python:
        print(f"    {line}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stats", action="store_true", help="also run each forwarded workload under ORION_STATS")
    parser.add_argument("--only", nargs="*", choices=sorted(WORKLOADS), help="these workloads only")
    parser.add_argument("--rounds", type=int, default=1, help="alternating native/forwarded pairs (default 1)")
    parser.add_argument("--relayed", action="store_true", help="also relayed over TCP loopback, against local")
    args = parser.parse_args()
    checks = Checks()
    with contextlib.ExitStack() as stack:
        forwarded_to = stack.enter_context(forwarding())
        relayed_to = stack.enter_context(forwarding(relayed=True)) if args.relayed else None
        tables = stack.enter_context(tempfile.TemporaryDirectory())
        print(f"{'workload':<16} {'unit':>8} {'native':>10} {'forwarded':>10} {'forwarded/native':>17}"
              + (f" {'relayed':>10} {'relayed/local':>14}" if relayed_to else ""))
        for name, (module, _body, kind) in WORKLOADS.items():
            if args.only and name not in args.only:
                continue
            if importlib.util.find_spec(module) is None:
                print(f"{name:<16} skipped: {module} is not installed")
                continue
            right: list[float] = []
            expected: object = None
            for round_ in range(args.rounds):
                try:
                    (native, expected), (forwarded, got) = measure(name, None), measure(name, forwarded_to)
                except RuntimeError as exc:
                    print(f"{name:<16} FAILED: {why(exc)}")
                    break
                # time ratios (latency: forwarded / native) and rate ratios (throughput: forwarded / native)
                ratio = checks.ratio(name, forwarded, native, expected, got, rel_tol=REL_TOL.get(name))
                right += [forwarded / native] if ratio != "WRONG" else []
                label = name if args.rounds == 1 else f"{name} {round_ + 1}"
                relayed_cells = ""
                if relayed_to is not None:
                    try:
                        relayed, relayed_got = measure(name, relayed_to)
                    except RuntimeError as exc:
                        relayed_cells = f" relayed FAILED: {why(exc)}"
                    else:
                        over_local = checks.ratio(f"{name} relayed", relayed, forwarded, expected, relayed_got,
                                                  rel_tol=REL_TOL.get(name))
                        relayed_cells = f" {relayed:10.2f} {over_local:>13}{'x' if over_local != 'WRONG' else ''}"
                print(f"{label:<16} {UNITS[kind]:>8} {native:10.2f} {forwarded:10.2f} {ratio:>16}"
                      f"{'x' if ratio != 'WRONG' else ' '}{relayed_cells}")
            if args.rounds > 1 and right:
                print(f"{name + ' median':<16} {UNITS[kind]:>8} {'':>10} {'':>10} {statistics.median(right):16.2f}x "
                      f"({len(right)} right rounds)")
            if args.stats and expected is not None:  # its table only from a run whose result is the native one's
                table = Path(tables) / f"{name}.stats"
                for label, to in (("", forwarded_to), (", relayed", relayed_to)):
                    if to is None:
                        continue
                    _, got = measure(name, to, stats=table)
                    print(f"  {name}{label}, under ORION_STATS:")
                    if checks.same(f"{name}{label} under ORION_STATS", expected, got, rel_tol=REL_TOL.get(name)):
                        show_stats(table)
    return checks.exit_status()


if __name__ == "__main__":
    sys.exit(main())
