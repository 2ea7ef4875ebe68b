"""An ordinary numba-cuda program: a @cuda.jit kernel on device arrays."""
import json

import numpy as np
from numba import cuda


@cuda.jit
def add_one(values):
    i = cuda.grid(1)
    if i < values.size:
        values[i] += 1.0


n = 1 << 16
host = np.arange(n, dtype=np.float64)
device = cuda.to_device(host)
add_one[(n + 255) // 256, 256](device)
out = device.copy_to_host()
print("RESULT " + json.dumps({"ok": bool(np.array_equal(out, host + 1)), "sum": float(out.sum())}, sort_keys=True))
