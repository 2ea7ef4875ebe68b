"""The NVML the native guest driver answers (guest_runtime/native/nvml.c) from a real agent's devices (the fake
driver's two guest devices, tests/forwarding_rig.py): loaded as startup.py loads the driver, a dlopen of
"libnvidia-ml.so.1" gets it, and its answers agree with the CUDA queries they come from. That JAX starts with it
and without the machine's NVML is tested on the GPU machine (tests/gpu/test_native_frameworks.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.forwarding_rig import GUEST_DEVICES, Rig, native_child_env, rig, start  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import ctypes, json, sys
from guest_runtime.startup import load_native
load_native(sys.argv[1])
nvml = ctypes.CDLL("libnvidia-ml.so.1")  # the loader's answer: the alias of the driver loaded above
cuda = ctypes.CDLL(sys.argv[1])
out = {"same_function": ctypes.cast(nvml.nvmlInit_v2, ctypes.c_void_p).value
                        == ctypes.cast(cuda.nvmlInit_v2, ctypes.c_void_p).value}
count, handle, other, index = ctypes.c_uint(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint()
out["before_init"] = nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
out["init"] = nvml.nvmlInit_v2()
if out["init"] == 0:
    out["count"] = [nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)), count.value]
    out["past_the_end"] = nvml.nvmlDeviceGetHandleByIndex_v2(count.value, ctypes.byref(handle))
    devices = []
    for i in range(count.value):
        assert nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) == 0
        name, uuid, cuda_name = (ctypes.create_string_buffer(96) for _ in range(3))
        raw, bus = ctypes.create_string_buffer(16), ctypes.create_string_buffer(32)
        cuda.cuDeviceGetName(cuda_name, 96, i); cuda.cuDeviceGetUuid(raw, i); cuda.cuDeviceGetPCIBusId(bus, 32, i)
        d = {"index": [nvml.nvmlDeviceGetIndex(handle, ctypes.byref(index)), index.value],
             "name": [nvml.nvmlDeviceGetName(handle, name, 96), name.value.decode() == cuda_name.value.decode()],
             "uuid": [nvml.nvmlDeviceGetUUID(handle, uuid, 96), uuid.value.decode()],
             "cuda_uuid": raw.raw.hex(), "short_buffer": nvml.nvmlDeviceGetUUID(handle, uuid, 8)}
        d["by_bus"] = []
        for form in (bus.value.upper(), b"0000" + bus.value, bus.value.split(b":", 1)[1]):  # 4 or 8 digits, or none
            d["by_bus"] += [nvml.nvmlDeviceGetHandleByPciBusId_v2(form, ctypes.byref(other)),
                            other.value == handle.value]
        d["by_uuid"] = [nvml.nvmlDeviceGetHandleByUUID(uuid.value, ctypes.byref(other)), other.value == handle.value]
        current, pending = ctypes.c_uint(7), ctypes.c_uint(7)
        d["mig"] = [nvml.nvmlDeviceGetMigMode(handle, ctypes.byref(current), ctypes.byref(pending)), current.value,
                    pending.value]
        fields = (ctypes.c_byte * 80)()  # two nvmlFieldValue_t; each value's status at offset 28
        d["fields"] = [nvml.nvmlDeviceGetFieldValues(handle, 2, fields), ctypes.c_int.from_buffer(fields, 28).value,
                       ctypes.c_int.from_buffer(fields, 68).value]
        d["pcie"] = nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle, ctypes.byref(index))
        major, minor, cuda_major, cuda_minor = (ctypes.c_int(-1) for _ in range(4))
        cuda.cuDeviceGetAttribute(ctypes.byref(cuda_major), 75, i)
        cuda.cuDeviceGetAttribute(ctypes.byref(cuda_minor), 76, i)
        d["capability"] = [nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)),
                           major.value, minor.value, cuda_major.value, cuda_minor.value]
        d["p2p"] = []  # (peer, index): [rc, status], and the driver's peer access
        for j in range(count.value):
            assert nvml.nvmlDeviceGetHandleByIndex_v2(j, ctypes.byref(other)) == 0
            can = ctypes.c_int(-1)
            cuda.cuDeviceCanAccessPeer(ctypes.byref(can), i, j)
            for caps in range(6):
                status = ctypes.c_int(-1)
                d["p2p"].append([j, caps, nvml.nvmlDeviceGetP2PStatus(handle, other, caps, ctypes.byref(status)),
                                 status.value, can.value])
        d["p2p_bad_index"] = nvml.nvmlDeviceGetP2PStatus(handle, handle, 9, ctypes.byref(index))
        devices.append(d)
    out["devices"] = devices
    out["foreign_handle"] = nvml.nvmlDeviceGetIndex(ctypes.c_void_p(0x1000), ctypes.byref(index))
    out["unknown_bus"] = nvml.nvmlDeviceGetHandleByPciBusId_v2(b"0000:ee:00.0", ctypes.byref(other))
    version, cuda_version = ctypes.c_int(), ctypes.c_int()
    cuda.cuDriverGetVersion(ctypes.byref(cuda_version))
    out["cuda_version"] = [nvml.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(version)),
                           version.value == cuda_version.value > 0]
    nvml.nvmlErrorString.restype = ctypes.c_char_p
    out["error_string"] = nvml.nvmlErrorString(3).decode()
    out["shutdown"] = [nvml.nvmlShutdown(), nvml.nvmlShutdown()]
print("RESULT " + json.dumps(out))
"""


def _child(library: Path, region: str) -> dict:
    env = native_child_env(library, region)
    done = subprocess.run([sys.executable, "-c", CHILD, str(library)], env=env, capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(t for t in done.stdout.splitlines() if t.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_nvml_answers_from_the_sessions_devices(library: Path, rig: Rig) -> None:  # noqa: F811
    out = _child(library, rig.path)
    assert out["same_function"]  # one library: NVML and the driver share the process's channel
    assert out["before_init"] == 1  # NVML_ERROR_UNINITIALIZED
    assert out["init"] == 0
    assert out["count"] == [0, len(GUEST_DEVICES)] and out["past_the_end"] == 2  # INVALID_ARGUMENT
    for i, d in enumerate(out["devices"]):
        assert d["index"] == [0, i] and d["name"] == [0, True]
        raw = d["cuda_uuid"]
        assert d["uuid"] == [0, f"GPU-{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"]
        assert d["short_buffer"] == 7  # NVML_ERROR_INSUFFICIENT_SIZE
        assert d["by_bus"] == [0, True] * 3 and d["by_uuid"] == [0, True]
        assert d["mig"] == [0, 0, 0]  # MIG disabled, current and pending
        assert d["fields"] == [0, 3, 3] and d["pcie"] == 3  # a vGPU's link and fields: NOT_SUPPORTED
        rc, major, minor, cuda_major, cuda_minor = d["capability"]
        assert rc == 0 and (major, minor) == (cuda_major, cuda_minor) and major > 0, d["capability"]
        for peer, caps, rc, status, can in d["p2p"]:
            if peer == i:  # itself: as NVML answers (OK, but NOT_SUPPORTED for PCI)
                assert [rc, status] == [0, 5 if caps == 4 else 0], d["p2p"]
            elif caps in (0, 1, 3):  # READ, WRITE, ATOMICS: the driver's peer access
                assert [rc, status] == [0, 0 if can == 1 else 5], d["p2p"]
            else:  # NVLink, PCI, UNKNOWN: the driver cannot say; the call says so (NVML_ERROR_NOT_SUPPORTED)
                assert [rc, status] == [3, -1], d["p2p"]
        assert d["p2p_bad_index"] == 2
    assert len({d["uuid"][1] for d in out["devices"]}) == len(GUEST_DEVICES)
    assert out["foreign_handle"] == 2 and out["unknown_bus"] == 6  # INVALID_ARGUMENT, NOT_FOUND
    assert out["cuda_version"] == [0, True] and out["error_string"] == "Not Supported"
    assert out["shutdown"] == [0, 1]  # the second has no nvmlInit left to match


def test_without_an_agent_nvml_says_the_driver_is_not_loaded(library: Path, tmp_path: Path) -> None:
    out = _child(library, str(tmp_path / "orionsock9"))
    assert out["init"] == 9  # NVML_ERROR_DRIVER_NOT_LOADED, as on a machine without a GPU driver


EVERY_NAME = r"""
import ctypes, json, sys
from guest_runtime.startup import load_native
load_native(sys.argv[1])
nvml = ctypes.CDLL("libnvidia-ml.so.1")
names = json.loads(sys.argv[2])
missing = [n for n in names if not hasattr(nvml, n)]
link_type = ctypes.c_int(-1)
remote = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(None, 0, ctypes.byref(link_type))
print("RESULT " + json.dumps({"missing": missing, "remote": remote, "untouched": link_type.value}))
"""


def test_every_nvml_name_of_the_headers_resolves_and_an_unanswered_one_is_not_supported(library: Path) -> None:
    """issue 28: PyTorch's out-of-memory path resolved nvmlDeviceGetNvLinkRemoteDeviceType with dlsym and failed
    with `undefined symbol` where the native driver did not export it. Every NVML entry point cuda-bindings
    declares (nvml_symbols.txt) resolves; one nvml.c does not answer is NVML_ERROR_NOT_SUPPORTED (3), its output
    untouched, and says so once on stderr. The plain names of versioned ones too (PyTorch's
    nvmlDeviceGetComputeRunningProcesses, measured on the H200)."""
    from guest_runtime.native.gen_libcuda import nvml_names
    names = nvml_names()  # and every version of a versioned one: PyTorch asks for the plain names
    assert {"nvmlDeviceGetNvLinkRemoteDeviceType", "nvmlDeviceGetComputeRunningProcesses"} <= set(names)
    done = subprocess.run([sys.executable, "-c", EVERY_NAME, str(library), json.dumps(names)], cwd=REPO,
                          env=native_child_env(library, "/nonexistent/orionsock9"), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    assert json.loads(line[len("RESULT "):]) == {"missing": [], "remote": 3, "untouched": -1}
    assert done.stderr.count("nvmlDeviceGetNvLinkRemoteDeviceType is not answered by Orion's NVML") == 1


def test_nvml_symbols_are_cuda_bindings_own() -> None:
    """nvml_symbols.txt holds every NVML name of the installed cuda-bindings (regenerate: gen_libcuda --symbols)."""
    from cuda.bindings import cynvml

    from guest_runtime.native.gen_libcuda import nvml_symbols
    assert {k for k in cynvml.__pyx_capi__ if k.startswith("nvml")} <= set(nvml_symbols())


PROCESSES = r"""
import ctypes, json, os, sys
from guest_runtime.startup import load_native
load_native(sys.argv[1])
nvml = ctypes.CDLL("libnvidia-ml.so.1")
cuda = ctypes.CDLL(sys.argv[1])
assert nvml.nvmlInit_v2() == 0
handle, count = ctypes.c_void_p(), ctypes.c_uint(8)
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == 0
infos = (ctypes.c_ubyte * (24 * 8))()
out = {"no_context": [nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), infos), count.value]}
context = ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0
assert cuda.cuCtxSetCurrent(context) == 0
pointer, free, total = ctypes.c_uint64(), ctypes.c_size_t(), ctypes.c_size_t()
assert cuda.cuMemAlloc_v2(ctypes.byref(pointer), 8 << 20) == 0
assert cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v3"):
    count.value = 8
    status = getattr(nvml, name)(handle, ctypes.byref(count), infos)
    pid, used = ctypes.c_uint.from_buffer(infos, 0).value, ctypes.c_ulonglong.from_buffer(infos, 8).value
    out[name] = [status, count.value, pid == os.getpid(), used == total.value - free.value > 0]
count.value = 0
out["short"] = [nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), None), count.value]
print("RESULT " + json.dumps(out))
"""


def test_nvml_lists_this_process_on_its_vgpu_with_what_it_uses(library: Path, rig: Rig) -> None:  # noqa: F811
    """PyTorch's out-of-memory message asks nvmlDeviceGetComputeRunningProcesses and asserts success (measured on the
    H200): on a vGPU the process itself, when its context is on that device, with what cuMemGetInfo says it uses
    (the quota's count), in both struct layouts; none without a context; INSUFFICIENT_SIZE for no room."""
    done = subprocess.run([sys.executable, "-c", PROCESSES, str(library)], cwd=REPO,
                          env=native_child_env(library, rig.path), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
    assert out == {"no_context": [0, 0], "nvmlDeviceGetComputeRunningProcesses": [0, 1, True, True],
                   "nvmlDeviceGetComputeRunningProcesses_v3": [0, 1, True, True], "short": [7, 1]}


NVLINK = r"""
import ctypes, json, sys
from guest_runtime.startup import load_native
load_native(sys.argv[1])
nvml = ctypes.CDLL("libnvidia-ml.so.1")
cuda = ctypes.CDLL(sys.argv[1])
assert nvml.nvmlInit_v2() == 0
class PciInfo(ctypes.Structure):
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]
handles = []
for i in range(2):
    handle = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) == 0
    handles.append(handle)
out = {"bus": []}
for i in range(2):
    bus = ctypes.create_string_buffer(32)
    cuda.cuDeviceGetPCIBusId(bus, 32, i)
    out["bus"].append(bus.value.decode())
for i, handle in enumerate(handles):
    for link in range(3):
        state, cap, pci, plain = ctypes.c_int(-1), ctypes.c_uint(7), PciInfo(), PciInfo()
        out[f"{i} {link}"] = [nvml.nvmlDeviceGetNvLinkState(handle, link, ctypes.byref(state)), state.value,
                              nvml.nvmlDeviceGetNvLinkCapability(handle, link, 0, ctypes.byref(cap)), cap.value,
                              nvml.nvmlDeviceGetNvLinkRemotePciInfo_v2(handle, link, ctypes.byref(pci)),
                              pci.busId.decode(), pci.busIdLegacy.decode(), [pci.domain, pci.bus, pci.device],
                              nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link, ctypes.byref(plain)),
                              plain.busId.decode()]
        fields = (ctypes.c_byte * 120)()  # three nvmlFieldValue_t: the link's state, the link count, a counter
        for k, field in enumerate((165, 91, 161)):  # NVML_FI_DEV_NVLINK_GET_STATE, _LINK_COUNT, _ERROR_DL_REPLAY
            ctypes.c_uint.from_buffer(fields, 40 * k).value = field
            ctypes.c_uint.from_buffer(fields, 40 * k + 4).value = link
            ctypes.c_int.from_buffer(fields, 40 * k + 24).value = -1
        rc = nvml.nvmlDeviceGetFieldValues(handle, 3, fields)
        out[f"fields {i} {link}"] = [rc] + [[ctypes.c_int.from_buffer(fields, 40 * k + 28).value,
                                             ctypes.c_int.from_buffer(fields, 40 * k + 24).value,
                                             ctypes.c_uint.from_buffer(fields, 40 * k + 32).value,
                                             ctypes.c_longlong.from_buffer(fields, 40 * k + 8).value > 0]
                                            for k in range(3)]
    status = ctypes.c_int(-1)
    out[f"p2p nvlink {i}"] = [nvml.nvmlDeviceGetP2PStatus(handle, handles[1 - i], 2, ctypes.byref(status)),
                              status.value]
print("RESULT " + json.dumps(out))
"""


def test_nvlink_is_the_gpu_hosts_nvml_about_the_sessions_gpus(library: Path, start: Callable[..., Rig]) -> None:  # noqa: F811
    """NVML_QUERY end to end (nvml.c, the executor, host_agent/session/nvml_queries.py over tests/fake_nvml.py's
    NVLinks): guest 0 is the fake's GPU 2, whose link 0 leads to GPU 0 (guest 1) and link 1 to GPU 1 (no vGPU of the
    session); link 2 is none (NVML_ERROR_NOT_SUPPORTED, as NVML answers it). The far end's bus ID is the one the
    session's own driver reports for that vGPU, so NCCL's topology joins them."""
    from host_agent.session.executor import ExecutorOptions
    from tests.fake_nvml import open_fake_nvml

    served = start(ExecutorOptions(devices=GUEST_DEVICES, nvml=open_fake_nvml))
    env = native_child_env(library, served.path)
    done = subprocess.run([sys.executable, "-c", NVLINK, str(library)], env=env, capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(next(t for t in done.stdout.splitlines() if t.startswith("RESULT "))[len("RESULT "):])

    def same_bus(a: str, b: str) -> bool:
        return [int(x, 16) for x in a.replace(".", ":").split(":")] == \
               [int(x, 16) for x in b.replace(".", ":").split(":")]

    for i, (link, far_guest) in {0: (0, 1), 1: (1, 0)}.items():  # the link of each that leads to the other vGPU
        state, active, cap_rc, cap, rc, bus_id, legacy, _fields, plain_rc, plain_bus = out[f"{i} {link}"]
        assert [state, active, cap_rc, cap, rc, plain_rc] == [0, 1, 0, 1, 0, 0], out
        assert same_bus(bus_id, out["bus"][far_guest]) and same_bus(legacy, out["bus"][far_guest]), out
        assert plain_bus == bus_id
    for i in range(2):
        assert out[f"{i} 2"][:1] == [3] and out[f"{i} 2"][2] == 3 and out[f"{i} 2"][4] == 3, out  # no link 2
        assert out[f"p2p nvlink {i}"] == [0, 0], out
        # field values (NCCL's NVLink state on sm_90): [return, type, value, timestamped]; the link count the fake's
        # (2 links per GPU); a traffic or error counter NOT_SUPPORTED, untouched but for its time
        count, counter = [0, 1, 2, True], [3, -1, 0, True]
        for link in (0, 1):
            assert out[f"fields {i} {link}"] == [0, [0, 1, 1, True], count, counter], out
        assert out[f"fields {i} 2"] == [0, [3, -1, 0, True], count, counter], out
