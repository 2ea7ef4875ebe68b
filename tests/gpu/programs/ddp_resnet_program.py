"""Data-parallel training as Orion's PyTorch guide runs it (issue 32): torchvision's ResNet-50 under
DistributedDataParallel with the NCCL backend, one process (rank) per device, random data, a few SGD steps.

`python ddp_resnet_program.py` starts DDP_WORLD ranks (default 2; each with the interpreter, loader and arguments this
one was started with, so the ranks run on the same driver), rank r on device r modulo the devices it sees, with the
DDP_BACKEND process group (default nccl; gloo gives a native baseline where NCCL refuses two ranks on one GPU), and
prints rank 0's RESULT: its losses (deterministic kernels, so a forwarded run's equal a native run's), whether every
rank holds the same parameters after the last step, and the median step time past the first two (`step_ms`, for
bench/ddp_bench.py; not a value to compare). With DDP_LAUNCH=guide the launcher first counts the devices
(torch.cuda.device_count(), as the main.py of Orion's guide does) and starts one rank per device; the ranks inherit
its environment as torch.multiprocessing's do (ORION_GRANT included: they join its vGPUs)."""
import json
import os
import statistics
import sys
import time

WORLD = int(os.environ.get("DDP_WORLD", "2"))
STEPS = int(os.environ.get("DDP_STEPS", "8"))
BATCH = int(os.environ.get("DDP_BATCH", "32"))
BACKEND = os.environ.get("DDP_BACKEND", "nccl")

if "--rank" not in sys.argv:
    from tests.gpu.programs.rank_launcher import free_port, run_ranks
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    if os.environ.get("DDP_LAUNCH") == "guide":
        import torch
        WORLD = torch.cuda.device_count()
        os.environ["DDP_WORLD"] = str(WORLD)
    # no env=: the ranks inherit the C library's environment, as multiprocessing's spawned processes do
    sys.exit(run_ranks([[*sys.orig_argv, "--rank", str(rank)] for rank in range(WORLD)], 900))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torchvision  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

rank = int(sys.argv[sys.argv.index("--rank") + 1])
torch.backends.cudnn.benchmark = False
torch.backends.cudnn.deterministic = True
device = torch.device("cuda", rank % torch.cuda.device_count())
torch.cuda.set_device(device)
dist.init_process_group(BACKEND, rank=rank, world_size=WORLD, **({"device_id": device} if BACKEND == "nccl" else {}))
torch.manual_seed(0)  # every rank starts from the same weights, as DDP's first broadcast makes sure anyway
model = torchvision.models.resnet50().to(device)
ddp = DistributedDataParallel(model, device_ids=[device.index])
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard of data
images = torch.randn(BATCH, 3, 224, 224, generator=generator).to(device)
labels = torch.randint(0, 1000, (BATCH,), generator=generator).to(device)
losses, times = [], []
for _ in range(STEPS):
    torch.cuda.synchronize()
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(ddp(images), labels)
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - start)
    losses.append(loss.item())
checksum = sum(parameter.double().sum().item() for parameter in model.parameters())
checksums = [None] * WORLD
dist.all_gather_object(checksums, checksum)
dist.destroy_process_group()
if rank == 0:
    print("RESULT " + json.dumps({"world": WORLD, "losses": losses, "same_parameters": len(set(checksums)) == 1,
                                  "step_ms": statistics.median(times[2:]) * 1e3 if STEPS > 2 else None}))
