"""torch.distributed with the NCCL backend, as a data-parallel job starts it: WORLD processes (ranks), each on its own
device, all-reduce and broadcast checked by value. `python nccl_ranks_program.py WORLD` starts the ranks (each with
the interpreter and loader this one was started with) and prints rank 0's RESULT."""
import json
import os
import sys

if len(sys.argv) == 2:
    world = int(sys.argv[1])
    prefix = sys.orig_argv[:len(sys.orig_argv) - len(sys.argv)]  # the interpreter, and a loader's -c if any
    from tests.gpu.programs.rank_launcher import free_port, run_ranks
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    sys.exit(run_ranks([[*prefix, sys.argv[0], str(world), str(rank)] for rank in range(world)], 240, env))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

world, rank = int(sys.argv[1]), int(sys.argv[2])
device = torch.device("cuda", rank % torch.cuda.device_count())
torch.cuda.set_device(device)
dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
values = torch.arange(1 << 20, device=device, dtype=torch.float32) * (rank + 1)
dist.all_reduce(values)
expected = torch.arange(1 << 20, dtype=torch.float32) * sum(range(1, world + 1))
root = torch.full((4096,), 7.0 if rank == 0 else 0.0, device=device)
dist.broadcast(root, src=0)
out = {"world": world, "all_reduce_equal": bool(torch.equal(values.cpu(), expected)),
       "broadcast_equal": bool(torch.equal(root.cpu(), torch.full((4096,), 7.0)))}
dist.destroy_process_group()
if rank == 0:
    out["ok"] = out["all_reduce_equal"] and out["broadcast_equal"]
    print("RESULT " + json.dumps(out))
