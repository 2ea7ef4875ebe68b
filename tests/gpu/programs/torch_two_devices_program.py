"""Stock PyTorch driving two GPUs from one process: work on each device, a peer copy, an event recorded on one
device's stream and waited for on the other's, and what each device reports. Values only (tests/gpu/test_multi_gpu.py
compares them with a native run); the peer copy's bandwidth is bench/ material, not a result."""
import json

import torch

out = {"count": torch.cuda.device_count()}
out["names"] = [torch.cuda.get_device_name(i) for i in range(out["count"])]
out["peer_access"] = [[torch.cuda.can_device_access_peer(i, j) for j in range(out["count"]) if j != i]
                      for i in range(out["count"])]
a = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(1))
x0, x1 = a.to("cuda:0"), a.to("cuda:1")
out["matmul_sums"] = [float((x @ x).double().abs().sum().cpu()) for x in (x0, x1)]
out["peer_copy_equal"] = bool(torch.equal(x0.to("cuda:1").cpu(), a))  # device 0 to device 1, no host between
s0, s1 = torch.cuda.Stream(device=0), torch.cuda.Stream(device=1)
with torch.cuda.stream(s0):
    doubled = x0 * 2
    done = torch.cuda.Event()
    done.record(s0)
with torch.cuda.device(1), torch.cuda.stream(s1):
    s1.wait_event(done)  # device 1's stream waits for device 0's work
    moved = doubled.to("cuda:1", non_blocking=True) + 1
torch.cuda.synchronize(1)
out["cross_device_event_equal"] = bool(torch.equal(moved.cpu(), a * 2 + 1))
out["totals_mib"] = [torch.cuda.mem_get_info(i)[1] >> 20 for i in range(out["count"])]
out["ok"] = out["peer_copy_equal"] and out["cross_device_event_equal"]
print("RESULT " + json.dumps(out))
