"""One process, NCCL across its devices: torch.cuda.nccl's all-reduce and broadcast (what DataParallel uses) and JAX's
psum over every local device (pmap). Checked by value."""
import json
import os

out = {}
import torch  # noqa: E402
import torch.cuda.nccl as nccl  # noqa: E402

ramp = torch.arange(1 << 20, dtype=torch.float32)
tensors = [ramp.to(f"cuda:{d}") * (d + 1) for d in range(2)]
nccl.all_reduce(tensors)
out["torch_all_reduce_equal"] = all(torch.equal(t.cpu(), ramp * 3) for t in tensors)
pair = [torch.full((4096,), 7.0, device="cuda:0"), torch.zeros(4096, device="cuda:1")]
nccl.broadcast(pair, root=0)
out["torch_broadcast_equal"] = bool(torch.equal(pair[1].cpu(), torch.full((4096,), 7.0)))
if os.environ.get("WITH_JAX", "1") == "1":
    import jax  # noqa: E402
    import jax.numpy as jnp  # noqa: E402
    n = jax.local_device_count()
    rows = jnp.arange(n * 1024, dtype=jnp.float32).reshape(n, 1024)
    summed = jax.pmap(lambda row: jax.lax.psum(row, "i"), axis_name="i")(rows)
    out["jax_devices"] = n
    out["jax_psum_equal"] = bool((summed == rows.sum(axis=0)).all())
out["ok"] = all(v for k, v in out.items() if k.endswith("_equal"))
print("RESULT " + json.dumps(out))
