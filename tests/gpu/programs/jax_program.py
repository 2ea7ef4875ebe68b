"""Stock JAX: a jitted matmul and its gradient on the GPU, checked against NumPy."""
import json

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_default_matmul_precision", "highest")  # float32 products, comparable with NumPy's
a = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
b = np.random.default_rng(1).standard_normal((256, 256)).astype(np.float32)
matmul = jax.jit(lambda x, y: x @ y)
product = np.asarray(matmul(jnp.asarray(a), jnp.asarray(b)))
grad = np.asarray(jax.jit(jax.grad(lambda x: jnp.sum(jnp.tanh(x @ b))))(jnp.asarray(a)))
expected_grad = (1 - np.tanh(a @ b) ** 2) @ b.T
print("RESULT " + json.dumps({
    "platform": jax.devices()[0].platform, "devices": len(jax.devices()),
    "matmul_ok": bool(np.allclose(product, a @ b, atol=1e-2)),
    "grad_ok": bool(np.allclose(grad, expected_grad, atol=1e-2)),
    # values, not only flags (compared to a tolerance: tests/gpu/test_forwarded_programs.py, CLOSE)
    "matmul_abs_sum": float(np.abs(product).sum(dtype=np.float64)),
    "grad_abs_sum": float(np.abs(grad).sum(dtype=np.float64)),
}))
