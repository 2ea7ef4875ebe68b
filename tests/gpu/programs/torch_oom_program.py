"""Stock PyTorch past a vGPU's quota: an allocation larger than the quota raises PyTorch's own
torch.cuda.OutOfMemoryError (its message built with NVML, which must resolve every name it asks for), and the
program goes on computing. Natively (no quota) the same allocation succeeds; the test compares what it must."""
import json

import torch

x = torch.ones(1024, 1024, device="cuda")
try:
    big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # 1 GiB: past a small quota
    outcome = "allocated"
    del big
except torch.cuda.OutOfMemoryError as exc:
    outcome = type(exc).__name__ + (": CUDA out of memory" if "CUDA out of memory" in str(exc) else ": " + str(exc))
total = float((x * 2).sum())  # the program goes on after its own out-of-memory error
print("RESULT " + json.dumps({"outcome": outcome, "total": total, "ok": True}))
