"""An ordinary cuda.core program: compile with NVRTC through cuda.core's Program, launch, read back."""
import json

import numpy as np
from cuda.bindings import driver
from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

CODE = r"""
extern "C" __global__ void scale(float *data, float factor, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] *= factor;
}
"""

dev = Device()
dev.set_current()
stream = dev.create_stream()
arch = "".join(str(v) for v in dev.compute_capability)
kernel = Program(CODE, code_type="c++", options=ProgramOptions(arch=f"sm_{arch}")).compile("cubin").get_kernel("scale")
n = 1 << 16
host = np.arange(n, dtype=np.float32)
buf = dev.allocate(host.nbytes, stream=stream)
stream.sync()
(err,) = driver.cuMemcpyHtoD(int(buf.handle), host.ctypes.data, host.nbytes)
assert int(err) == 0, err
launch(stream, LaunchConfig(grid=(n + 127) // 128, block=128), kernel, buf, np.float32(3.0), np.uint32(n))
stream.sync()
out = np.empty_like(host)
(err,) = driver.cuMemcpyDtoH(out.ctypes.data, int(buf.handle), out.nbytes)
assert int(err) == 0, err
buf.close(stream)
stream.sync()
print("RESULT " + json.dumps({"ok": bool(np.array_equal(out, host * 3)), "sum": float(out.sum()),
                              "device": dev.name}, sort_keys=True))
