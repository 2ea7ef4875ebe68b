"""The native guest driver's host functions, stream memory operations, cluster occupancy, tensor maps, context
limits and capture info (guest_runtime/native/host_functions.c, occupancy_calls.c, tensor_map.c,
answered_in_guest.c; host_agent/session/launch_extras.py) against a real agent whose sessions run the executor over the
fake driver (tests/forwarding_rig.py). The driver is built with the system compiler and loaded with ctypes in a
subprocess (test_native_launch_calls.PRELUDE: a primary context current, the PTX module's helpers). CPU only."""
from __future__ import annotations

import ctypes
import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import relay_net
from tests.fake_driver import CUtensorMapDataType, FakeDriver, cuuint32_t, cuuint64_t, tensor_map_bytes
from tests.forwarding_rig import Rig, bounded, local_only, native_child_env, rig, start  # noqa: F401 (fixtures)
from tests.wire.test_native_launch_calls import EPILOGUE, PRELUDE, PTX

REPO = Path(__file__).resolve().parents[2]
SUCCESS, INVALID_VALUE, INVALID_HANDLE, NOT_PERMITTED, NOT_SUPPORTED, INVALID_CLUSTER_SIZE = 0, 1, 400, 800, 801, 912

EXTRAS = r"""
from ctypes import POINTER, c_uint32
P = c_void_p
HOSTFN = ctypes.CFUNCTYPE(None, c_void_p)
for name, args in {
    "cuLaunchHostFunc": [P, P, P], "cuStreamCreate": [P, c_uint], "cuStreamDestroy": [P],
    "cuStreamSynchronize": [P], "cuCtxSynchronize": [], "cuMemAllocHost": [P, c_size_t],
    "cuMemAlloc": [P, c_size_t], "cuMemsetD32Async": [c_uint64, c_uint, c_size_t, P],
    "cuMemcpyDtoHAsync": [P, c_uint64, c_size_t, P], "cuMemcpyHtoDAsync": [c_uint64, P, c_size_t, P],
    "cuMemHostGetDevicePointer": [P, P, c_uint],
    "cuStreamWriteValue32": [P, c_uint64, c_uint32, c_uint], "cuStreamWaitValue32": [P, c_uint64, c_uint32, c_uint],
    "cuOccupancyMaxActiveClusters": [P, P, P], "cuCtxGetLimit": [P, c_int], "cuCtxSetLimit": [c_int, c_size_t],
    "cuStreamGetCaptureInfo": [P, P, P, P, P, P, P], "cuGetProcAddress_v2": [ctypes.c_char_p, P, c_int, c_uint64, P],
}.items():
    getattr(lib, name).argtypes = args
lib.cuTensorMapEncodeTiled.argtypes = [P, c_int, c_uint, c_uint64, P, P, P, P, c_int, c_int, c_int, c_int]

def stream(flags):
    handle = c_void_p()
    assert lib.cuStreamCreate(byref(handle), flags) == 0
    return handle.value

def pinned(size):
    pointer = c_void_p()
    assert lib.cuMemAllocHost(byref(pointer), size) == 0
    return pointer.value

def device(size):
    pointer = c_uint64()
    assert lib.cuMemAlloc(byref(pointer), size) == 0
    return pointer.value

def word(address):
    return c_uint32.from_address(address)
"""


def launch_program(library: Path, rig: Rig, body: str, epilogue: str = EPILOGUE) -> subprocess.CompletedProcess[str]:  # noqa: F811
    env = native_child_env(library, rig.path)
    return subprocess.run([sys.executable, "-c", PRELUDE + EXTRAS + body + epilogue, str(library), PTX.hex()],
                          env=env, capture_output=True, text=True, timeout=60, cwd=REPO)


def run(library: Path, rig: Rig, body: str) -> dict[str, Any]:  # noqa: F811
    done = launch_program(library, rig, body)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


# Per stream: a memset and a copy into page-locked memory, the function, copies after it.
STREAM_ORDER = r"""
streams = [stream(1), stream(1), stream(0), None]
page = pinned(4096 * len(streams))
memory = device(16 * len(streams))
seen = []
def make(index):
    def fn(data):
        cell = word(page + 4096 * index)
        seen.append([index, data, cell.value])
        cell.value = 1000 + index
    return HOSTFN(fn)
functions = [make(i) for i in range(len(streams))]
out["launched"] = []
for i, s in enumerate(streams):
    dev, host = memory + 16 * i, page + 4096 * i
    assert lib.cuMemsetD32Async(dev, 0xC0DE0000 + i, 1, s) == 0
    assert lib.cuMemcpyDtoHAsync(host, dev, 4, s) == 0
    out["launched"].append(lib.cuLaunchHostFunc(s, functions[i], 77 + i))
    assert lib.cuMemcpyHtoDAsync(dev + 4, host, 4, s) == 0
    assert lib.cuMemcpyDtoHAsync(host + 8, dev + 4, 4, s) == 0
out["sync"] = lib.cuCtxSynchronize()
out["seen"] = sorted(seen)
out["after"] = [word(page + 4096 * i + 8).value for i in range(len(streams))]
"""


@local_only("host functions need pool words the GPU can reach")
def test_host_functions_run_in_stream_order_on_each_kind_of_stream(library: Path, rig: Rig) -> None:  # noqa: F811
    """Per stream: a memset and a copy into page-locked memory before the function (it must see the value), the
    function writes a new value, and a copy back to the device and out again after it (it must carry the function's
    value: the stream waited for the function to return). Two non-blocking streams, a blocking one, the NULL one."""
    body = STREAM_ORDER
    out = run(library, rig, body)
    assert out["launched"] == [SUCCESS] * 4 and out["sync"] == SUCCESS
    assert out["seen"] == [[i, 77 + i, 0xC0DE0000 + i] for i in range(4)]  # the work before each had run
    assert out["after"] == [1000 + i for i in range(4)]  # the work after each waited for it
    probe, *writes = rig.entries(name="cuStreamWriteValue32")  # the first: whether the GPU reaches the words at all
    assert probe["args"][0] == 0 and probe["args"][2:] == [0, 0]
    waits = rig.entries(name="cuStreamWaitValue32")
    assert len(writes) == len(waits) == 4 and all(e["result"] == [["CUresult", 0]] for e in [probe, *writes, *waits])
    assert all(e["args"][3] == 0 for e in waits)  # GEQ


@local_only("host functions need pool words the GPU can reach")
def test_many_functions_in_order_and_none_queued_from_inside_another(library: Path, rig: Rig) -> None:  # noqa: F811
    """300 functions on one stream run in order; one queued from inside a function is refused with
    CUDA_ERROR_NOT_PERMITTED (CUDA forbids API calls there) instead of deadlocking against the synchronize."""
    body = r"""
s = stream(1)
order, inner = [], []
def note(data):
    order.append(data)
    if data == 5:
        inner.append(lib.cuLaunchHostFunc(s, first, 1000))
first = HOSTFN(note)
out["launched"] = [lib.cuLaunchHostFunc(s, first, i) for i in range(1, 301)]
out["sync"] = lib.cuStreamSynchronize(s)
out["sync_again"] = lib.cuStreamSynchronize(s)
out["order"], out["inner"] = order, inner
"""
    out = run(library, rig, body)
    assert set(out["launched"]) == {SUCCESS} and out["sync"] == out["sync_again"] == SUCCESS
    assert out["order"] == list(range(1, 301)) and out["inner"] == [NOT_PERMITTED]


@local_only("host functions need pool words the GPU can reach")
def test_a_function_on_a_stream_the_session_does_not_own_fails_later_and_never_runs(library: Path, rig: Rig) -> None:  # noqa: F811
    body = r"""
ran = []
fn = HOSTFN(lambda data: ran.append(data))
out["launched"] = lib.cuLaunchHostFunc(0xBAD0, fn, 1)  # posted: nothing to answer yet
out["sync"] = lib.cuCtxSynchronize()                   # the write's INVALID_HANDLE surfaces here
out["later"] = [lib.cuCtxSynchronize() for _ in range(3)]  # the wait's own INVALID_HANDLE, then none
out["ran"] = ran
out["null_fn"] = lib.cuLaunchHostFunc(None, None, None)
"""
    out = run(library, rig, body)
    assert out["launched"] == SUCCESS and out["sync"] == INVALID_HANDLE
    assert out["later"] == [INVALID_HANDLE, SUCCESS, SUCCESS]
    assert out["ran"] == [] and out["null_fn"] == INVALID_VALUE


@local_only("host functions need pool words the GPU can reach")
def test_exit_with_functions_pending_does_not_hang(library: Path, rig: Rig) -> None:  # noqa: F811
    """One function blocks forever inside; another's stream waits on device memory nobody writes, so it is never
    reached; the program returns from main without synchronising. It must exit, and the agent must serve the next
    program."""
    body = r"""
import threading
blocked = threading.Event()
def block_forever(data):
    blocked.set()
    threading.Event().wait()
stuck = HOSTFN(block_forever)
never = HOSTFN(lambda data: print("NEVER", flush=True))
s, t = stream(0), stream(1)
gate = device(16)
assert lib.cuLaunchHostFunc(s, stuck, None) == 0  # a blocking stream: reached at once
assert blocked.wait(30)
assert lib.cuStreamWaitValue32(t, gate, 1, 1) == 0  # EQ 1: never
assert lib.cuLaunchHostFunc(t, never, None) == 0
print("EXITING", flush=True)
"""
    done = launch_program(library, rig, body, epilogue="")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "EXITING" in done.stdout and "NEVER" not in done.stdout
    assert run(library, rig, "out['limit'] = lib.cuCtxSynchronize()\n") == {"limit": SUCCESS}


@local_only("stream memory operations on pool words need their device pointers")
def test_stream_wait_and_write_value_between_streams_and_from_the_host(library: Path, rig: Rig) -> None:  # noqa: F811
    """A wait on one stream holds its later work back until another stream's write (device memory) or the program's
    own store into page-locked memory satisfies it."""
    body = r"""
a, b = stream(1), stream(1)
flag = device(64)
page = pinned(4096)
flag_host = c_uint64()
assert lib.cuMemHostGetDevicePointer(byref(flag_host), c_void_p(page), 0) == 0
out["wait"] = lib.cuStreamWaitValue32(a, flag, 5, 0)          # GEQ 5
assert lib.cuMemsetD32Async(flag + 8, 0xAB, 1, a) == 0        # held back until then
out["write"] = lib.cuStreamWriteValue32(b, flag, 7, 0)        # satisfies it
out["sync_a"] = lib.cuStreamSynchronize(a)
result = c_uint32()
assert lib.cuMemcpyDtoHAsync(byref(result), flag + 8, 4, a) == 0
out["after"] = result.value
ran = []
fn = HOSTFN(lambda data: ran.append(word(page + 64).value))
out["wait_host"] = lib.cuStreamWaitValue32(a, flag_host.value, 0x10, 2)  # AND 0x10, on page-locked memory
assert lib.cuStreamWriteValue32(a, flag_host.value + 64, 99, 0) == 0
assert lib.cuLaunchHostFunc(a, fn, None) == 0
def store():
    word(page).value = 0x30                                    # the program's own store satisfies it
threading.Timer(0.2, store).start()
out["sync_host"] = lib.cuStreamSynchronize(a)
out["ran"] = ran
out["bad_flags"] = lib.cuStreamWaitValue32(a, flag, 1, 7)
out["sync_bad"] = lib.cuCtxSynchronize()
out["foreign"] = lib.cuStreamWriteValue32(a, 0x7E0000001000, 1, 0)
out["sync_foreign"] = lib.cuCtxSynchronize()
"""
    out = run(library, rig, body)
    assert out["wait"] == out["write"] == out["sync_a"] == SUCCESS and out["after"] == 0xAB
    assert out["wait_host"] == out["sync_host"] == SUCCESS and out["ran"] == [99]
    assert out["bad_flags"] == SUCCESS and out["sync_bad"] == INVALID_VALUE  # posted: surfaces at the next sync
    assert out["foreign"] == SUCCESS and out["sync_foreign"] == INVALID_VALUE  # not the session's memory


def test_cluster_occupancy_with_and_without_attributes_and_a_foreign_function(library: Path, rig: Rig) -> None:  # noqa: F811
    body = r"""
status, module = load(PTX + b"\0")
mix = function(module, b"mix")
def clusters(f, dims, shared=0, s=None, extra=b""):
    raw = (struct.pack("<i4x64s", 4, struct.pack("<3I", *dims)) if dims else b"") + extra
    attributes = ctypes.create_string_buffer(raw, max(len(raw), 1))
    config = Config(16, 1, 1, 128, 1, 1, shared, s, addressof(attributes) if raw else None, len(raw) // 72)
    count = c_int(-1)
    return [lib.cuOccupancyMaxActiveClusters(byref(count), f, byref(config)), count.value]
out["two"] = clusters(mix, (2, 1, 1))
out["four_shared"] = clusters(mix, (2, 2, 1), shared=1024, s=stream(1))
out["none"] = clusters(mix, None)
out["policy"] = clusters(mix, (2, 1, 1), extra=struct.pack("<i4x64s", 5, struct.pack("<i", 1)))
out["updatable"] = clusters(mix, (2, 1, 1), extra=struct.pack("<i4x64s", 13, b""))
out["foreign"] = clusters(0xF00D0, (2, 1, 1))
out["foreign_stream"] = clusters(mix, (2, 1, 1), s=0xBAD0)
out["foreign_event"] = clusters(mix, (2, 1, 1), extra=struct.pack("<i4x64s", 12, struct.pack("<Q", 0xBAD0)))
out["null"] = lib.cuOccupancyMaxActiveClusters(None, mix, None)
sms = c_int()
assert lib.cuDeviceGetAttribute(byref(sms), 16, 0) == 0  # MULTIPROCESSOR_COUNT of the context's device
out["sms"] = sms.value
"""
    out = run(library, rig, body)
    sms = out["sms"]
    assert out["two"] == [SUCCESS, (2048 // 128) * sms // 2]
    assert out["four_shared"] == [SUCCESS, (2048 // 128 - 1) * sms // 4]
    assert out["policy"] == out["two"]
    assert out["none"][0] == INVALID_CLUSTER_SIZE and out["updatable"][0] == NOT_SUPPORTED
    assert out["foreign"][0] == out["foreign_stream"][0] == out["foreign_event"][0] == INVALID_HANDLE
    assert out["null"] == INVALID_VALUE
    foreign = [e for e in rig.entries(name="cuOccupancyMaxActiveClusters")
               if (e["args"][0][1] if isinstance(e["args"][0], list) else e["args"][0]) == 0xF00D0]
    assert not foreign  # refused on the host, never reached the driver


def test_tensor_map_encoding_and_its_checks(library: Path, rig: Rig) -> None:  # noqa: F811
    body = r"""
memory = device(1 << 20)
out["memory"] = memory
class Map(ctypes.Structure):
    _fields_ = [("opaque", ctypes.c_uint64 * 16)]
    _pack_ = 1
holder = ctypes.create_string_buffer(128 + 64)
aligned = (addressof(holder) + 63) // 64 * 64
def encode(rank, address, dims, strides, box, steps, at=None, dtype=7):
    arrays = [(ctypes.c_uint64 * max(len(dims), 1))(*dims), (ctypes.c_uint64 * max(len(strides), 1))(*strides),
              (c_uint * max(len(box), 1))(*box), (c_uint * max(len(steps), 1))(*steps)]
    ctypes.memset(aligned, 0xEE, 128)
    status = lib.cuTensorMapEncodeTiled(at or aligned, dtype, rank, address, *[addressof(a) for a in arrays],
                                        0, 0, 0, 0)
    return [status, ctypes.string_at(aligned, 128).hex()]
out["two_d"] = encode(2, memory, [64, 32], [256], [16, 8], [1, 1])
out["rank_0"] = encode(0, memory, [], [], [], [])[0]
out["rank_6"] = encode(6, memory, [2] * 6, [256] * 5, [4] * 6, [1] * 6)[0]
out["misaligned_map"] = encode(2, memory, [64, 32], [256], [16, 8], [1, 1], at=aligned + 8)[0]
out["outside"] = encode(2, 0x7E0000001000, [64, 32], [256], [16, 8], [1, 1])[0]
out["past_the_end"] = encode(2, memory, [64, 8192], [256], [16, 8], [1, 1])[0]
out["driver_refuses"] = encode(2, memory, [64, 32], [100], [16, 8], [1, 1])[0]  # a stride not a multiple of 16
"""
    out = run(library, rig, body)
    status, encoded = out["two_d"]
    assert status == SUCCESS
    driver = FakeDriver()
    err, expected = driver.cuTensorMapEncodeTiled(
        CUtensorMapDataType(7), 2, out["memory"], [cuuint64_t(64), cuuint64_t(32)], [cuuint64_t(256)],
        [cuuint32_t(16), cuuint32_t(8)], [cuuint32_t(1), cuuint32_t(1)], 0, 0, 0, 0)
    assert int(err) == SUCCESS
    assert bytes.fromhex(encoded) == tensor_map_bytes(7, 2, out["memory"], [64, 32], [256], [16, 8], [1, 1],
                                                      [0, 0, 0, 0])
    assert bytes.fromhex(encoded) == ctypes.string_at(expected.getPtr(), 128)
    assert out["rank_0"] == out["rank_6"] == INVALID_VALUE
    # a map anywhere: the H200's driver takes cuda-python's, 32 bytes past a 64-byte boundary (the host encodes into
    # an aligned copy of its own)
    assert out["misaligned_map"] == SUCCESS
    assert out["outside"] == out["past_the_end"] == out["driver_refuses"] == INVALID_VALUE
    calls = rig.entries(name="cuTensorMapEncodeTiled")
    assert len(calls) == 3  # the good one, the one at a misaligned map and the one the driver refused


def test_context_limits_get_and_set(library: Path, rig: Rig) -> None:  # noqa: F811
    body = r"""
def get(limit):
    value = c_size_t(12345)
    return [lib.cuCtxGetLimit(byref(value), limit), value.value]
out["defaults"] = [get(limit) for limit in range(7)]
out["set_stack"] = lib.cuCtxSetLimit(0, 4096)
out["set_heap"] = lib.cuCtxSetLimit(2, 64 << 20)
out["set_depth_too_deep"] = lib.cuCtxSetLimit(3, 100)
out["after"] = [get(0), get(2), get(3)]
out["unknown"] = get(99)[0]
out["null"] = lib.cuCtxGetLimit(None, 0)
"""
    out = run(library, rig, body)
    assert out["defaults"] == [[SUCCESS, v] for v in (1024, 1 << 20, 8 << 20, 2, 2048, 64, 0)]
    assert out["set_stack"] == out["set_heap"] == SUCCESS and out["set_depth_too_deep"] == INVALID_VALUE
    assert out["after"] == [[SUCCESS, 4096], [SUCCESS, 64 << 20], [SUCCESS, 2]]
    assert out["unknown"] == INVALID_VALUE and out["null"] == INVALID_VALUE


def test_capture_info_says_not_capturing_and_resolves_by_version(library: Path, rig: Rig) -> None:  # noqa: F811
    body = r"""
s = stream(1)
status, ident, graph, deps, edges, count = c_int(7), c_uint64(7), c_void_p(7), c_void_p(7), c_void_p(7), c_size_t(7)
out["v3"] = lib.cuStreamGetCaptureInfo(s, byref(status), byref(ident), byref(graph), byref(deps), byref(edges),
                                       byref(count))
out["values"] = [status.value, ident.value, graph.value, deps.value, edges.value, count.value]
out["nulls"] = lib.cuStreamGetCaptureInfo(s, byref(status), None, None, None, None, None)
out["no_status"] = lib.cuStreamGetCaptureInfo(s, None, None, None, None, None, None)
out["foreign"] = lib.cuStreamGetCaptureInfo(0xBAD0, byref(status), None, None, None, None, None)
def resolve(name, version):
    pointer, found = c_void_p(), c_int(-1)
    assert lib.cuGetProcAddress_v2(name, byref(pointer), version, 0, byref(found)) == 0
    return pointer.value
own = lambda name: ctypes.cast(getattr(lib, name), c_void_p).value
out["by_version"] = [resolve(b"cuStreamGetCaptureInfo", 13000) == own("cuStreamGetCaptureInfo"),
                     resolve(b"cuStreamGetCaptureInfo", 12020) == own("cuStreamGetCaptureInfo_v2"),
                     resolve(b"cuStreamGetCaptureInfo", 11000) not in (own("cuStreamGetCaptureInfo"),
                                                                      own("cuStreamGetCaptureInfo_v2"), None),
                     resolve(b"cuLaunchHostFunc", 13000) == own("cuLaunchHostFunc"),
                     resolve(b"cuStreamWaitValue32", 12000) == own("cuStreamWaitValue32")]
v1 = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_void_p)(resolve(b"cuStreamGetCaptureInfo", 11000))
ident.value = 9
out["v1"] = [v1(s, byref(status), byref(ident)), ident.value]
"""
    out = run(library, rig, body)
    assert out["v3"] == SUCCESS and out["values"] == [0, 0, None, None, None, 0]  # (a NULL c_void_p is None)
    assert out["nulls"] == SUCCESS and out["no_status"] == INVALID_VALUE and out["foreign"] == INVALID_HANDLE
    assert out["by_version"] == [True] * 5 and out["v1"] == [SUCCESS, 0]


def test_the_fakes_wait_value_conditions() -> None:
    """GEQ is cyclic ((int32_t)(word - value) >= 0), EQ exact, AND any common bit, NOR any bit clear in both."""
    satisfied = FakeDriver.wait_satisfied
    assert satisfied(5, 5, 0) and satisfied(6, 5, 0) and not satisfied(4, 5, 0)
    assert satisfied(2, 0xFFFFFFFE, 0) and not satisfied(0xFFFFFFFE, 2, 0)  # across the wrap
    assert satisfied(7, 7, 1) and not satisfied(8, 7, 1)
    assert satisfied(0x12, 0x10, 2) and not satisfied(0x0F, 0x10, 2)
    assert not satisfied(0xFFFF0000, 0x0000FFFF, 3) and satisfied(0xFFFF0000, 0x00007FFF, 3)


def test_the_fakes_stream_order_with_waits_and_writes() -> None:
    """A wait on a blocking stream holds later work back until a write on another stream satisfies it; a wait
    nothing can satisfy answers CUDA_ERROR_LAUNCH_TIMEOUT at a synchronize instead of hanging."""
    fake = FakeDriver(initialized=True)
    _, dev = fake.cuDeviceGet(0)
    _, ctx = fake.cuDevicePrimaryCtxRetain(dev)
    fake.cuCtxSetCurrent(ctx)
    _, blocking = fake.cuStreamCreate(0)
    _, other = fake.cuStreamCreate(1)
    _, memory = fake.cuMemAlloc(64)
    base = int(memory)
    assert int(fake.cuStreamWaitValue32(blocking, base, 3, 1)[0]) == SUCCESS  # EQ 3
    assert int(fake.cuMemsetD32Async(base + 8, 0x55, 1, blocking)[0]) == SUCCESS
    assert fake.memory[base][8:12] == bytes(4)  # held back
    assert int(fake.cuStreamWriteValue32(other, base, 3, 0)[0]) == SUCCESS
    assert int(fake.cuStreamSynchronize(blocking)[0]) == SUCCESS
    assert fake.memory[base][8:12] == struct.pack("<I", 0x55)
    assert int(fake.cuStreamWaitValue32(blocking, base, 4, 1)[0]) == SUCCESS
    assert int(fake.cuStreamSynchronize(blocking)[0]) == 702  # nothing will ever write 4
    assert int(fake.cuStreamWaitValue32(blocking, base + 2, 4, 0)[0]) == INVALID_VALUE  # not 4-byte aligned
    assert int(fake.cuStreamWriteValue32(blocking, base, 4, 2)[0]) == INVALID_VALUE  # no such flag


def test_host_functions_run_in_stream_order_on_a_relayed_session(library: Path, start: Any) -> None:  # noqa: F811
    """On a relayed session the GPU host cannot reach page-locked words (docs/remote.md): cuLaunchHostFunc asks once,
    finds out, and sends each function as HOST_FUNCTION, which the relay serves (the stream synchronised, the
    reached word written, the session held until the function returned). The same program as on a local region,
    the same values: the work before each function is seen by it, the work after it carries its write."""
    if relay_net.why_not():
        pytest.skip(relay_net.why_not())
    relayed = start(relayed=True)
    out = run(library, relayed, STREAM_ORDER)
    assert out["launched"] == [SUCCESS] * 4 and out["sync"] == SUCCESS
    assert out["seen"] == [[i, 77 + i, 0xC0DE0000 + i] for i in range(4)]
    assert out["after"] == [1000 + i for i in range(4)]
    assert not relayed.entries(name="cuStreamWaitValue32")  # nothing of the pair reached the GPU host
