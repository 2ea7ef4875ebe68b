"""What NCCL asks NVML at start (its nvmlwrap: every device's compute capability and every pair's P2P read and write
status, the PCI bus ID), and the other P2P indices, as this process's libnvidia-ml.so.1 answers: the machine's
natively, the native guest driver's forwarded. Each answer is [return code, value]."""
import ctypes
import json

nvml = ctypes.CDLL("libnvidia-ml.so.1")
out = {"init": nvml.nvmlInit_v2()}
count = ctypes.c_uint()
out["count"] = [nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)), count.value]
handles = []
for i in range(count.value):
    handle = ctypes.c_void_p()
    nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle))
    handles.append(handle)
for i, handle in enumerate(handles):
    major, minor = ctypes.c_int(-1), ctypes.c_int(-1)
    out[f"capability {i}"] = [nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major),
                                                                      ctypes.byref(minor)), major.value, minor.value]
    for j, other in enumerate(handles):
        for index in range(6):  # READ, WRITE, NVLINK, ATOMICS, PCI, UNKNOWN
            status = ctypes.c_int(-1)
            out[f"p2p {i} {j} {index}"] = [nvml.nvmlDeviceGetP2PStatus(handle, other, index, ctypes.byref(status)),
                                           status.value]
print("RESULT " + json.dumps(out))
