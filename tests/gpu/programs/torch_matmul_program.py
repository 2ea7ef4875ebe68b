"""Stock PyTorch: a matmul on the GPU (cuBLAS), copied back; the result's checksum and a few values."""
import json

import torch

torch.manual_seed(0)
a = torch.randn(512, 256)
b = torch.randn(256, 384)
c = (a.cuda() @ b.cuda()).cpu()
expected = a.double() @ b.double()
print("RESULT " + json.dumps({
    "available": torch.cuda.is_available(), "count": torch.cuda.device_count(),
    "name": torch.cuda.get_device_name(0), "shape": list(c.shape),
    "max_error": float((c.double() - expected).abs().max()), "corner": [round(float(v), 3) for v in c[0, :4]],
}))
