"""An ordinary cuda.bindings.runtime program: device count and properties, malloc, memcpy both ways, free."""
import json

import numpy as np
from cuda.bindings import runtime


def ok(result):
    assert int(result[0]) == 0, result
    return result[1] if len(result) == 2 else result[1:]


count = ok(runtime.cudaGetDeviceCount())
ok((*runtime.cudaSetDevice(0), None))
props = ok(runtime.cudaGetDeviceProperties(0))
sms = ok(runtime.cudaDeviceGetAttribute(runtime.cudaDeviceAttr.cudaDevAttrMultiProcessorCount, 0))
host = np.arange(1 << 18, dtype=np.float32)
device = ok(runtime.cudaMalloc(host.nbytes))
kind = runtime.cudaMemcpyKind
ok((*runtime.cudaMemcpy(device, host.ctypes.data, host.nbytes, kind.cudaMemcpyHostToDevice), None))
back = np.zeros_like(host)
ok((*runtime.cudaMemcpy(back.ctypes.data, device, back.nbytes, kind.cudaMemcpyDeviceToHost), None))
ok((*runtime.cudaFree(device), None))
ok((*runtime.cudaDeviceSynchronize(), None))
print("RESULT " + json.dumps({"count": count, "name": props.name.split(b"\0")[0].decode(), "sms": sms,
                              "props_sms": props.multiProcessorCount, "major": props.major,
                              "total": props.totalGlobalMem, "copy_ok": bool(np.array_equal(back, host)),
                              "copy_sum": float(back.sum(dtype=np.float64))},
                             sort_keys=True))
