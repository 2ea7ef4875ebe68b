"""The conformance matrix's programs (issue 28): what people ordinarily run, one case per run, chosen by
$CONFORMANCE_CASE. Each prints `RESULT {json}`: the values the case computed (losses, sums, token ids), which the
matrix (tests/gpu/test_conformance.py) compares between the native run and every forwarded path, and `ok` flags
that hold natively (a result checked against a CPU reference where one is cheap)."""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

CASES: dict[str, Callable[[], dict[str, Any]]] = {}


def case(function: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    CASES[function.__name__] = function
    return function


def _mlp_losses(dtype: Any | None, scaler: bool = False, steps: int = 6) -> list[float]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    grad_scaler = torch.amp.GradScaler("cuda", enabled=scaler)
    x, y = torch.randn(128, 64, device="cuda"), torch.randint(0, 10, (128,), device="cuda")
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        grad_scaler.scale(loss).backward()
        grad_scaler.step(optimizer)
        grad_scaler.update()
        losses.append(round(float(loss), 6))
    return losses


@case
def torch_fp32() -> dict[str, Any]:
    losses = _mlp_losses(None)
    return {"losses": losses, "ok": losses[-1] < losses[0]}


@case
def torch_fp16_autocast() -> dict[str, Any]:
    import torch

    losses = _mlp_losses(torch.float16, scaler=True)
    return {"losses": losses, "ok": losses[-1] < losses[0]}


@case
def torch_bf16_autocast() -> dict[str, Any]:
    import torch

    losses = _mlp_losses(torch.bfloat16)
    return {"losses": losses, "ok": losses[-1] < losses[0]}


@case
def torch_sdpa() -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    out = {}
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = (torch.randn(2, 8, 128, 64, device="cuda", dtype=dtype) for _ in range(3))
        got = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        want = torch.softmax((q.float() @ k.float().transpose(-1, -2) / 8).masked_fill(
            torch.ones(128, 128, device="cuda").triu(1).bool(), float("-inf")), -1) @ v.float()
        out[str(dtype)] = round(float(got.float().sum()), 2)
        out[f"{dtype}_ok"] = float((got.float() - want).abs().max()) < 0.05
    return out


@case
def torch_events_streams() -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    a = torch.randn(1024, 1024, device="cuda")
    side = torch.cuda.Stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        start.record()
        b = a @ a
        end.record()
    torch.cuda.current_stream().wait_stream(side)
    c = b.sum(1)
    marker = torch.cuda.Event()
    marker.record()
    marker.synchronize()
    torch.cuda.synchronize()
    return {"sum": round(float(c.sum()), 1), "elapsed_ok": start.elapsed_time(end) > 0, "query": marker.query(),
            "ok": True}


@case
def torch_pinned_dataloader() -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    host = torch.arange(4 << 20, dtype=torch.float32).pin_memory()  # 16 MiB page-locked
    device = host.cuda(non_blocking=True)
    torch.cuda.synchronize()
    data = TensorDataset(torch.randn(512, 32), torch.arange(512))
    total = torch.zeros((), device="cuda")
    seen = 0
    for x, index in DataLoader(data, batch_size=64, num_workers=2, pin_memory=True):
        assert x.is_pinned()
        total += x.cuda(non_blocking=True).sum()
        seen += int(index.numel())
    return {"pinned": host.is_pinned(), "copied": float(device[-1]), "total": round(float(total), 2),
            "seen": seen, "ok": float(device[-1]) == float((4 << 20) - 1)}


@case
def torch_cuda_graph() -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).cuda()
    static_in = torch.randn(32, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = model(static_in)
    sums = []
    for i in range(3):
        static_in.copy_(torch.full((32, 256), 0.01 * (i + 1), device="cuda"))
        graph.replay()
        sums.append(round(float(static_out.sum()), 6))
    eager = model(static_in)
    return {"replays": sums, "ok": torch.allclose(eager, static_out)}


@case
def torch_compile_default() -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    f = torch.compile(lambda x, y: torch.sin(x) * y + torch.cos(y).sum(0))
    x, y = torch.randn(512, 64, device="cuda"), torch.randn(512, 64, device="cuda")
    got = f(x, y)
    want = torch.sin(x) * y + torch.cos(y).sum(0)
    return {"sum": round(float(got.sum()), 2), "ok": torch.allclose(got, want, atol=1e-4)}


@case
def torch_compile_reduce_overhead() -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4)).cuda()
    compiled = torch.compile(model, mode="reduce-overhead")
    sums = []
    for i in range(4):
        x = torch.full((16, 64), 0.1 * (i + 1), device="cuda")
        sums.append(round(float(compiled(x).sum()), 6))
    return {"sums": sums, "ok": abs(sums[-1] - float(model(x).sum())) < 1e-3}


@case
def torch_compile_reduce_overhead_training() -> dict[str, Any]:
    """CUDA graphs of the forward and the backward (torch.compile's cudagraph trees): the backward is captured on
    autograd's own thread while the forward's thread holds the capture mode it began with, which is what the guest's
    per-thread capture owners are for (guest_runtime/capture_owners.py)."""
    import math

    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model, mode="reduce-overhead")
    losses = []
    for i in range(6):
        x = torch.full((16, 64), 0.1 * (i + 1), device="cuda")
        optimizer.zero_grad(set_to_none=True)
        loss = compiled(x).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(round(float(loss), 6))
    return {"losses": losses, "ok": all(math.isfinite(value) for value in losses)}


@case
def transformers_gpt2() -> dict[str, Any]:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=128)
    model = GPT2LMHeadModel(config).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 1000, (4, 32), device="cuda")
    losses = []
    for _ in range(4):
        optimizer.zero_grad()
        loss = model(tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        losses.append(round(float(loss), 6))
    model.eval()
    generated = model.generate(tokens[:1, :8], max_new_tokens=8, do_sample=False, pad_token_id=0)
    return {"losses": losses, "generated": generated[0].tolist(), "ok": losses[-1] < losses[0]}


@case
def torchvision_resnet18() -> dict[str, Any]:
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(16, 3, 64, 64, device="cuda"), torch.randint(0, 10, (16,), device="cuda")
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(round(float(loss), 6))
    return {"losses": losses, "ok": True}


@case
def jax_default() -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    # sums of magnitudes: x is symmetric about 0, so a plain sum of the gradient cancels to rounding noise, which
    # XLA's reductions (atomics) give differently from run to run natively too (measured: -0.094, -0.008, 0.0)
    x = jnp.linspace(-1.0, 1.0, 128 * 128).reshape(128, 128)
    f = jax.jit(lambda a: jnp.tanh(a @ a.T) + 1.0)
    grad = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(x)
    batched = jax.vmap(lambda v: jnp.dot(v, v))(x)
    total, _ = jax.lax.scan(lambda c, v: (c + jnp.sum(jnp.abs(v) * 2.0), c), 0.0, x)
    y = x
    for _ in range(4):  # a loop XLA may turn into a command buffer (a CUDA graph)
        y = f(y) / 100.0
    return {"jit": round(float(f(x).sum()), 3), "grad": round(float(jnp.abs(grad).sum()), 3),
            "vmap": round(float(batched.sum()), 3), "scan": round(float(total), 3), "loop": round(float(y.sum()), 4),
            "device": jax.devices()[0].platform, "ok": jax.devices()[0].platform == "gpu"}


@case
def cupy_libraries() -> dict[str, Any]:
    import cupy as cp
    import cupyx.scipy.sparse as sparse

    a = cp.arange(1 << 16, dtype=cp.float32)
    out: dict[str, Any] = {"elementwise": float((cp.sin(a) * 2 + 1).sum()), "reduction": float(a.max() - a.min())}
    m = cp.arange(64 * 64, dtype=cp.float64).reshape(64, 64) / 4096
    out["cublas"] = round(float((m @ m.T).sum()), 6)
    out["curand"] = round(float(cp.random.RandomState(7).standard_normal(4096).sum()), 6)
    s = sparse.random(256, 256, density=0.05, format="csr", dtype=cp.float64, random_state=3)
    out["cusparse"] = round(float((s @ cp.ones(256)).sum()), 6)
    kernel = cp.RawKernel(r'''extern "C" __global__ void twice(const float *x, float *y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 2.0f * x[i]; }''', "twice")
    y = cp.empty_like(a)
    kernel(((a.size + 255) // 256,), (256,), (a, y, cp.int32(a.size)))
    out["rawkernel"] = float(y.sum())
    out["ok"] = bool(cp.allclose(y, 2 * a))
    return out


@case
def cupy_cusolver() -> dict[str, Any]:
    import cupy as cp

    m = cp.arange(64 * 64, dtype=cp.float64).reshape(64, 64) / 4096
    x = cp.linalg.solve(m @ m.T + cp.eye(64), cp.ones(64))
    return {"solve": round(float(x.sum()), 6), "ok": bool(cp.allclose((m @ m.T + cp.eye(64)) @ x, 1.0))}


@case
def cupy_fft() -> dict[str, Any]:
    import cupy as cp

    a = cp.arange(1024, dtype=cp.complex64)
    got = cp.fft.fft(a)
    return {"sum": [round(float(got.sum().real), 3), round(float(got.sum().imag), 3)],
            "ok": bool(cp.allclose(got, cp.asarray(__import__("numpy").fft.fft(a.get())), atol=1e-2))}


@case
def triton_kernel() -> dict[str, Any]:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):  # noqa: N803 (Triton's convention)
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask),
                 mask=mask)

    torch.manual_seed(0)
    x, y = torch.randn(100_000, device="cuda"), torch.randn(100_000, device="cuda")
    out = torch.empty_like(x)
    add[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
    return {"sum": round(float(out.sum()), 3), "ok": torch.allclose(out, x + y)}


@case
def cuda_core_cluster() -> dict[str, Any]:
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

    device = Device()
    device.set_current()
    source = r'''extern "C" __global__ void __cluster_dims__(2, 1, 1) ranks(unsigned *out) {
        unsigned rank; asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
        out[blockIdx.x * blockDim.x + threadIdx.x] = rank * 1000u + blockIdx.x; }'''
    arch = "".join(str(v) for v in device.compute_capability)
    module = Program(source, "c++", ProgramOptions(arch=f"sm_{arch}")).compile("cubin")
    kernel = module.get_kernel("ranks")
    stream = device.create_stream()
    buffer = device.allocate(4 * 4 * 32, stream=stream)
    launch(stream, LaunchConfig(grid=4, block=32), kernel, buffer)
    import numpy as np

    host = np.empty(4 * 32, dtype=np.uint32)
    from cuda.bindings import driver

    stream.sync()
    (err,) = driver.cuMemcpyDtoH(host.ctypes.data, int(buffer.handle), host.nbytes)
    values = sorted(set(int(v) for v in host))
    return {"values": values, "ok": int(err) == 0 and values == [0, 2, 1001, 1003]}


@case
def numba_kernels() -> dict[str, Any]:
    import numpy as np

    if not hasattr(np, "row_stack"):  # numba-cuda 0.30.4 calls it; numpy 2.5 dropped it (TESTBED.md)
        return {"skipped": f"numba-cuda needs numpy < 2.5 (this is {np.__version__}): set ORION_NUMBA_NUMPY to a "
                           "folder holding one (tests/gpu/test_conformance.py)"}
    from numba import cuda, float32

    @cuda.jit
    def saxpy(a, x, y, out):  # type: ignore[no-untyped-def]
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i] + y[i]

    @cuda.jit
    def block_sums(x, total):  # type: ignore[no-untyped-def]
        shared = cuda.shared.array(256, dtype=float32)
        i = cuda.grid(1)
        shared[cuda.threadIdx.x] = x[i] if i < x.size else 0.0
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            s = float32(0.0)
            for k in range(256):
                s += shared[k]
            cuda.atomic.add(total, 0, s)

    x = np.arange(100_000, dtype=np.float32) / 1000
    y = np.ones_like(x)
    stream = cuda.stream()
    d_x, d_y = cuda.to_device(x, stream=stream), cuda.to_device(y, stream=stream)
    d_out = cuda.device_array_like(x, stream=stream)
    blocks = (x.size + 255) // 256
    saxpy[blocks, 256, stream](np.float32(2.0), d_x, d_y, d_out)
    total = cuda.to_device(np.zeros(1, dtype=np.float32), stream=stream)
    block_sums[blocks, 256, stream](d_out, total)
    pinned = cuda.pinned_array(x.shape, dtype=np.float32)
    d_out.copy_to_host(pinned, stream=stream)
    stream.synchronize()
    reduced = cuda.reduce(lambda a, b: a + b)(d_x)
    return {"saxpy": round(float(pinned.sum()), 1), "block_sums": round(float(total.copy_to_host()[0]), 1),
            "reduce": round(float(reduced), 1), "ok": bool(np.allclose(pinned, 2 * x + y))}


if __name__ == "__main__":
    print("RESULT " + json.dumps(CASES[os.environ["CONFORMANCE_CASE"]]()))
