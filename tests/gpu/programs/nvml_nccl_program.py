"""What NCCL asks NVML at start (its nvmlwrap: every device's compute capability and every pair's P2P read and write
status, the PCI bus ID), the other P2P indices, and what its topology reads (each NVLink's state, also as the field
value sm_90 and later read, and its far end), as this process's libnvidia-ml.so.1 answers: the machine's natively,
the native guest driver's forwarded. Each answer is [return code, value]."""
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
    for link in range(18):  # NCCL's topology: each NVLink's state and the bus ID at its far end
        state, pci = ctypes.c_int(-1), (ctypes.c_char * 68)()
        rc = nvml.nvmlDeviceGetNvLinkState(handle, link, ctypes.byref(state))
        remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo_v2(handle, link, pci)
        out[f"nvlink {i} {link}"] = [rc, state.value, remote, bytes(pci[36:68]).split(b"\0")[0].decode()]
        fields = (ctypes.c_byte * 80)()  # sm_90's way (NCCL): NVML_FI_DEV_NVLINK_GET_STATE, _LINK_COUNT; no timestamps
        for k, field in enumerate((165, 91)):
            ctypes.c_uint.from_buffer(fields, 40 * k).value, ctypes.c_uint.from_buffer(fields, 40 * k + 4).value = \
                field, link
        rc = nvml.nvmlDeviceGetFieldValues(handle, 2, fields)
        out[f"fields {i} {link}"] = [rc] + [[ctypes.c_int.from_buffer(fields, 40 * k + o).value for o in (28, 24, 32)]
                                            for k in range(2)]
print("RESULT " + json.dumps(out))
