"""Stock CuPy: an elementwise kernel, a cuBLAS matmul and cuRAND numbers, each checked against NumPy (the FFT is
cupy_fft_program.py)."""
import json

import cupy as cp
import numpy as np

x = np.arange(1 << 16, dtype=np.float32)
elementwise = cp.asnumpy(cp.sin(cp.asarray(x)) * 2 + 1)
a = np.random.default_rng(0).standard_normal((256, 128)).astype(np.float32)
b = np.random.default_rng(1).standard_normal((128, 64)).astype(np.float32)
product = cp.asnumpy(cp.asarray(a) @ cp.asarray(b))
cp.random.seed(7)
uniform = cp.asnumpy(cp.random.random(1 << 14, dtype=cp.float32))
print("RESULT " + json.dumps({
    "elementwise_ok": bool(np.allclose(elementwise, np.sin(x) * 2 + 1, atol=1e-5)),
    "elementwise_sum": float(elementwise.sum(dtype=np.float64)),
    "matmul_ok": bool(np.allclose(product, a @ b, atol=1e-3)),
    "matmul_abs_sum": float(np.abs(product).sum(dtype=np.float64)),
    "random_sum": round(float(uniform.sum()), 2), "random_ok": bool(uniform.min() >= 0 and uniform.max() < 1),
}))
