"""Stock PyTorch driving every device it sees from one process, as a program given several vGPUs does (Orion's
guide: ORION_VGPU=4 on two GPUs): work on each device, a peer copy and a cross-device event from each device to
the next (a ring), NCCL's all-reduce across all of them (torch.cuda.nccl, as DataParallel uses it), and what each
device reports, including the device the driver names for its primary context (cuCtxGetDevice) and its memory
total. Values only: tests/gpu/test_multi_gpu.py compares them with a native run
on the machine's own GPUs."""
import json

import torch
import torch.cuda.nccl as nccl
from cuda.bindings import driver

count = torch.cuda.device_count()
out = {"count": count, "names": [torch.cuda.get_device_name(i) for i in range(count)]}
out["peer_access"] = [[torch.cuda.can_device_access_peer(i, j) for j in range(count)] for i in range(count)]
a = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(1))
on = [a.to(f"cuda:{i}") for i in range(count)]
out["matmul_sums"] = [float((x @ x).double().abs().sum().cpu()) for x in on]
ring = [(i, (i + 1) % count) for i in range(count)]
out["peer_copies_equal"] = [bool(torch.equal(on[i].to(f"cuda:{j}").cpu(), a)) for i, j in ring]
events_equal = []
for i, j in ring:
    source, target = torch.cuda.Stream(device=i), torch.cuda.Stream(device=j)
    with torch.cuda.device(i), torch.cuda.stream(source):
        doubled = on[i] * 2
        done = torch.cuda.Event()
        done.record(source)
    with torch.cuda.device(j), torch.cuda.stream(target):
        target.wait_event(done)  # device j's stream waits for device i's work
        moved = doubled.to(f"cuda:{j}", non_blocking=True) + 1
    torch.cuda.synchronize(j)
    events_equal.append(bool(torch.equal(moved.cpu(), a * 2 + 1)))
out["cross_device_events_equal"] = events_equal
ramp = torch.arange(1 << 20, dtype=torch.float32)
summed = [ramp.to(f"cuda:{i}") * (i + 1) for i in range(count)]
nccl.all_reduce(summed)
out["nccl_all_reduce_equal"] = all(torch.equal(t.cpu(), ramp * (count * (count + 1) // 2)) for t in summed)
context_devices = []
for i in range(count):
    torch.cuda.set_device(i)
    torch.cuda.synchronize()  # the runtime has made device i's primary context current
    err, device = driver.cuCtxGetDevice()
    context_devices.append(int(device) if err == driver.CUresult.CUDA_SUCCESS else -1)
out["context_devices"] = context_devices
out["totals_mib"] = [torch.cuda.mem_get_info(i)[1] >> 20 for i in range(count)]
out["ok"] = all(out["peer_copies_equal"]) and all(events_equal) and out["nccl_all_reduce_equal"]
print("RESULT " + json.dumps(out))
