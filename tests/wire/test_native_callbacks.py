"""The native guest driver's stream callbacks, sync-mode host functions, stream attributes and cluster sizing
(guest_runtime/native/host_functions.c, stream_attributes.c, occupancy_calls.c; host_agent/session/stream_extras.py)
against a
real agent whose sessions run the executor over the fake driver (tests/forwarding_rig.py). The driver is built with
the system compiler and loaded with ctypes in a subprocess (test_native_launch_calls.PRELUDE: a primary context
current, the PTX module's helpers); values are compared with the fake driver's own answers to the same calls, and
tests/gpu/programs/callbacks_program.py runs here through cuda-python against the fake too. CPU only."""
from __future__ import annotations

import ctypes
import json
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import relay_net
from tests.fake_driver import CUstreamAttrValue, FakeDriver, LaunchConfig
from tests.forwarding_rig import Rig, bounded, local_only, native_child_env, rig, start  # noqa: F401 (fixtures)
from tests.wire.test_native_launch_calls import EPILOGUE, PRELUDE, PTX

REPO = Path(__file__).resolve().parents[2]
SUCCESS, INVALID_VALUE, INVALID_HANDLE, NOT_READY, NOT_PERMITTED, NOT_SUPPORTED = 0, 1, 400, 600, 800, 801
LAUNCH_TIMEOUT, CAPTURE_UNSUPPORTED, CAPTURE_INVALIDATED = 702, 900, 901
PROGRAM = REPO / "tests" / "gpu" / "programs" / "callbacks_program.py"

EXTRAS = r"""
from ctypes import c_uint32
P = c_void_p
HOSTFN = ctypes.CFUNCTYPE(None, c_void_p)
CALLBACK = ctypes.CFUNCTYPE(None, c_void_p, c_int, c_void_p)
for name, args in {
    "cuLaunchHostFunc": [P, P, P], "cuLaunchHostFunc_v2": [P, P, P, c_uint], "cuStreamAddCallback": [P, P, P, c_uint],
    "cuStreamCreate": [P, c_uint], "cuStreamCreateWithPriority": [P, c_uint, c_int], "cuStreamDestroy": [P],
    "cuStreamSynchronize": [P], "cuCtxSynchronize": [], "cuMemAllocHost": [P, c_size_t], "cuMemAlloc": [P, c_size_t],
    "cuMemsetD32Async": [c_uint64, c_uint, c_size_t, P], "cuMemcpyDtoHAsync": [P, c_uint64, c_size_t, P],
    "cuMemcpyHtoDAsync": [c_uint64, P, c_size_t, P], "cuStreamWaitValue32": [P, c_uint64, c_uint32, c_uint],
    "cuStreamBeginCapture": [P, c_int], "cuStreamEndCapture": [P, P], "cuStreamGetAttribute": [P, c_int, P],
    "cuStreamSetAttribute": [P, c_int, P], "cuStreamCopyAttributes": [P, P], "cuStreamGetPriority": [P, P],
    "cuOccupancyMaxPotentialClusterSize": [P, P, P], "cuGetProcAddress_v2": [ctypes.c_char_p, P, c_int, c_uint64, P],
}.items():
    getattr(lib, name).argtypes = args

def stream(flags, priority=None):
    handle = c_void_p()
    if priority is None:
        assert lib.cuStreamCreate(byref(handle), flags) == 0
    else:
        assert lib.cuStreamCreateWithPriority(byref(handle), flags, priority) == 0
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

def settle(done, seconds=10):
    import time
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
"""


def launch_program(library: Path, rig: Rig, body: str) -> subprocess.CompletedProcess[str]:  # noqa: F811
    env = native_child_env(library, rig.path)
    return subprocess.run([sys.executable, "-c", PRELUDE + EXTRAS + body + EPILOGUE, str(library), PTX.hex()],
                          env=env, capture_output=True, text=True, timeout=60, cwd=REPO)


def run(library: Path, rig: Rig, body: str) -> tuple[dict[str, Any], str]:  # noqa: F811
    """The body's `out`, and its stderr."""
    done = launch_program(library, rig, body)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), done.stderr


def either_path(start: Callable[..., Rig], relayed: bool) -> Rig:  # noqa: F811
    if relayed and relay_net.why_not():
        pytest.skip(relay_net.why_not())
    return start(relayed=relayed)


# Per stream: a memset and a copy into page-locked memory, then a callback, a host function of each kind, a callback,
# with copies between and after them. Each records what it saw; each callback writes a word the copies after it carry
# back to the device and out again.
STREAM_ORDER = r"""
streams = [stream(1), stream(0), None]  # non-blocking, blocking, the NULL stream
page = pinned(4096 * len(streams))
memory = device(64 * len(streams))
seen = {i: [] for i in range(len(streams))}
def on_callback(index):
    def callback(handle, status, data):
        cell = page + 4096 * index
        seen[index].append(["callback", data, status, handle or 0, word(cell).value])
        word(cell + 4).value = 1000 + data
    return CALLBACK(callback)
def on_host(index):
    def host(data):
        seen[index].append(["host", data, word(page + 4096 * index).value])
    return HOSTFN(host)
kept = [(on_callback(i), on_host(i)) for i in range(len(streams))]
out["queued"] = []
for i, s in enumerate(streams):
    dev, cell = memory + 64 * i, page + 4096 * i
    callback, host = kept[i]
    assert lib.cuMemsetD32Async(dev, 0xC0DE0000 + i, 1, s) == 0
    assert lib.cuMemcpyDtoHAsync(cell, dev, 4, s) == 0
    out["queued"].append(lib.cuStreamAddCallback(s, callback, 10 * i + 1, 0))   # sees 0xC0DE000i
    assert lib.cuMemcpyHtoDAsync(dev + 8, cell + 4, 4, s) == 0                  # carries 1000 + 10i + 1
    out["queued"].append(lib.cuLaunchHostFunc(s, host, 10 * i + 2))
    assert lib.cuMemsetD32Async(dev, 0xBEEF0000 + i, 1, s) == 0
    assert lib.cuMemcpyDtoHAsync(cell, dev, 4, s) == 0
    out["queued"].append(lib.cuLaunchHostFunc_v2(s, host, 10 * i + 3, 0))        # CU_HOST_TASK_BLOCKING
    out["queued"].append(lib.cuLaunchHostFunc_v2(s, host, 10 * i + 4, 1))        # CU_HOST_TASK_SPINWAIT
    out["queued"].append(lib.cuStreamAddCallback(s, callback, 10 * i + 5, 0))   # sees 0xBEEF000i
    assert lib.cuMemcpyDtoHAsync(cell + 8, dev + 8, 4, s) == 0                  # the first callback's word
legacy = []
on_legacy = CALLBACK(lambda handle, status, data: legacy.append([handle, status, data]))
out["queued"].append(lib.cuStreamAddCallback(1, on_legacy, 99, 0))  # CU_STREAM_LEGACY: given back as it came
out["sync"] = lib.cuCtxSynchronize()
out["legacy"] = legacy
out["seen"] = [seen[i] for i in range(len(streams))]
out["carried"] = [word(page + 4096 * i + 8).value for i in range(len(streams))]
out["streams"] = [s or 0 for s in streams]
"""


@pytest.mark.parametrize("relayed", [False, True], ids=["local", "relayed"])
def test_callbacks_and_host_functions_run_in_stream_order_seeing_the_copies_before_them(
        library: Path, start: Callable[..., Rig], relayed: bool) -> None:  # noqa: F811
    """On a non-blocking, a blocking and the NULL stream: a callback sees the copy before it (and gets its stream as
    the caller named it, CU_STREAM_LEGACY too, and CUDA_SUCCESS), host functions of cuLaunchHostFunc and
    cuLaunchHostFunc_v2 (both sync modes) run between them in queue order, and the copies after a callback carry what
    it wrote. Locally and relayed (the relay serves each as HOST_FUNCTION)."""
    served = either_path(start, relayed)
    out, _ = run(library, served, STREAM_ORDER)
    assert out["queued"] == [SUCCESS] * 16 and out["sync"] == SUCCESS
    assert out["legacy"] == [[1, SUCCESS, 99]]
    for i, (seen, handle) in enumerate(zip(out["seen"], out["streams"], strict=True)):
        assert seen == [["callback", 10 * i + 1, SUCCESS, handle, 0xC0DE0000 + i],
                        ["host", 10 * i + 2, 0xC0DE0000 + i],
                        ["host", 10 * i + 3, 0xBEEF0000 + i],
                        ["host", 10 * i + 4, 0xBEEF0000 + i],
                        ["callback", 10 * i + 5, SUCCESS, handle, 0xBEEF0000 + i]], i
    assert out["carried"] == [1000 + 10 * i + 1 for i in range(3)]
    assert len(served.entries(name="cuStreamQuery")) == 7  # each callback's stream asked first


@local_only("the stream's side of each call is counted on the GPU host's journal")
def test_a_callback_asks_its_stream_first_and_refuses_what_the_driver_refuses(library: Path, rig: Rig) -> None:  # noqa: F811
    """flags other than 0, a NULL callback or function, a stream the session does not own (answered at once, never
    reaching the driver as a write), a capturing stream (the capture's error, and the capture invalidated), a sync
    mode this library does not know (801, named once), and a callback queued from inside a callback."""
    body = r"""
s = stream(1)
ran = []
inner = []
def note(handle, status, data):
    ran.append(data)
    if data == 3:
        inner.append(lib.cuStreamAddCallback(s, kept, 99, 0))
kept = CALLBACK(note)
host = HOSTFN(lambda data: ran.append(data))
out["flags"] = lib.cuStreamAddCallback(s, kept, 1, 1)
out["null_callback"] = lib.cuStreamAddCallback(s, None, 1, 0)
out["null_function"] = lib.cuLaunchHostFunc_v2(s, None, 1, 0)
out["foreign"] = lib.cuStreamAddCallback(0xBAD0, kept, 2, 0)
out["mode"] = [lib.cuLaunchHostFunc_v2(s, host, 2, 7), lib.cuLaunchHostFunc_v2(s, host, 2, 2)]
out["from_inside"] = lib.cuStreamAddCallback(s, kept, 3, 0)
out["sync"] = lib.cuStreamSynchronize(s)
settle(lambda: inner)
out["inner"] = inner
c = stream(1)
out["begin"] = lib.cuStreamBeginCapture(c, 0)
out["capturing"] = lib.cuStreamAddCallback(c, kept, 4, 0)
graph = c_void_p()
out["end"] = lib.cuStreamEndCapture(c, byref(graph))
out["after"] = lib.cuCtxSynchronize()
out["ran"] = ran
"""
    mark = rig.mark()
    out, stderr = run(library, rig, body)
    assert out["flags"] == out["null_callback"] == out["null_function"] == INVALID_VALUE
    assert out["foreign"] == INVALID_HANDLE
    assert out["mode"] == [NOT_SUPPORTED] * 2
    assert stderr.count("cuLaunchHostFunc_v2 with a sync mode other than") == 1
    assert out["from_inside"] == out["sync"] == SUCCESS and out["inner"] == [NOT_PERMITTED]
    assert out["begin"] == SUCCESS and out["capturing"] == CAPTURE_UNSUPPORTED
    assert out["end"] == CAPTURE_INVALIDATED and out["after"] == SUCCESS
    assert out["ran"] == [3]  # only the one queued on a stream it could run on
    writes = [e for e in rig.entries(since=mark, name="cuStreamWriteValue32") if e["args"][0] != 0]
    assert len(writes) == 1  # the one callback queued (the probe's write is on the NULL stream)
    foreign = [e for e in rig.entries(since=mark) if 0xBAD0 in [a[1] if isinstance(a, list) else a
                                                                 for a in e["args"]]]
    assert not foreign  # refused on the host, before the driver


@local_only("the fake's stand-in for a failed stream is a wait on device memory that nothing writes")
def test_a_failed_stream_passes_its_error_to_callbacks_and_drops_host_functions(library: Path, rig: Rig) -> None:  # noqa: F811
    """A stream whose work can never complete: the fake answers CUDA_ERROR_LAUNCH_TIMEOUT at its synchronize (its
    stand-in for a hang, an error that ends the process's CUDA on a GPU). Every callback queued behind it is then
    called with that error, the host function between them is never called (cuda.h), and later ones are refused with
    the error, as every later call of the driver answers it."""
    body = r"""
s = stream(0)
gate = device(16)
calls = []
kept = CALLBACK(lambda handle, status, data: calls.append([data, status, handle]))
host = HOSTFN(lambda data: calls.append(["host", data]))
assert lib.cuStreamWaitValue32(s, gate, 1, 1) == 0   # EQ 1: nothing writes it
out["queued"] = [lib.cuStreamAddCallback(s, kept, 1, 0), lib.cuLaunchHostFunc(s, host, 2),
                 lib.cuLaunchHostFunc_v2(s, host, 3, 1), lib.cuStreamAddCallback(s, kept, 4, 0)]
out["sync"] = lib.cuStreamSynchronize(s)
settle(lambda: len(calls) >= 2)
out["calls"] = calls
out["later"] = [lib.cuStreamAddCallback(s, kept, 5, 0), lib.cuLaunchHostFunc(s, host, 6),
                lib.cuLaunchHostFunc_v2(s, host, 7, 0)]
out["stream"] = s
"""
    out, _ = run(library, rig, body)
    assert out["queued"] == [SUCCESS] * 4 and out["sync"] == LAUNCH_TIMEOUT
    assert out["calls"] == [[1, LAUNCH_TIMEOUT, out["stream"]], [4, LAUNCH_TIMEOUT, out["stream"]]]
    assert out["later"] == [LAUNCH_TIMEOUT] * 3


def test_cuGetProcAddress_gives_the_sync_mode_abi_from_cuda_13_2(library: Path, rig: Rig) -> None:  # noqa: F811, N802
    body = r"""
def resolve(name, version):
    pointer, found = c_void_p(), c_int(-1)
    assert lib.cuGetProcAddress_v2(name, byref(pointer), version, 0, byref(found)) == 0
    return pointer.value
own = lambda name: ctypes.cast(getattr(lib, name), c_void_p).value
out["resolved"] = [resolve(b"cuLaunchHostFunc", 13020) == own("cuLaunchHostFunc_v2"),
                   resolve(b"cuLaunchHostFunc", 13000) == own("cuLaunchHostFunc"),
                   resolve(b"cuLaunchHostFunc", 10000) == own("cuLaunchHostFunc"),
                   resolve(b"cuStreamAddCallback", 5000) == own("cuStreamAddCallback"),
                   resolve(b"cuStreamGetAttribute", 11000) == own("cuStreamGetAttribute"),
                   resolve(b"cuOccupancyMaxPotentialClusterSize", 11070) == own("cuOccupancyMaxPotentialClusterSize"),
                   own("cuStreamAddCallback_ptsz") == own("cuStreamAddCallback"),
                   own("cuStreamGetAttribute_ptsz") == own("cuStreamGetAttribute")]
"""
    out, _ = run(library, rig, body)
    assert out["resolved"] == [True] * 8


# The stream-attribute steps, each (call, stream name, attribute ID, value): run through the native library, then on
# the fake driver directly; every status and every value's 64 bytes must be equal.
WINDOW = struct.pack("<QQfii", 0x7F10_0000_0000, 4096, 0.5, 2, 1).ljust(64, b"\0")  # base, bytes, hit ratio, props
ATTRIBUTE_STEPS: list[tuple[str, str, int, bytes]] = [
    *[("get", "high", attribute, b"") for attribute in (1, 3, 8, 9, 10, 16)],
    ("get", "null", 3, b""), ("get", "null", 8, b""),
    ("set", "high", 3, struct.pack("<i", 4).ljust(64, b"\0")), ("get", "high", 3, b""),
    ("set", "high", 10, struct.pack("<i", 1).ljust(64, b"\0")), ("get", "high", 10, b""),
    ("set", "high", 9, struct.pack("<BB", 2, 3).ljust(64, b"\0")), ("get", "high", 9, b""),
    ("set", "high", 1, WINDOW), ("get", "high", 1, b""),
    ("set", "high", 8, struct.pack("<i", -1).ljust(64, b"\0")), ("get", "high", 8, b""),
    ("set", "high", 16, struct.pack("<i", 1).ljust(64, b"\0")), ("get", "high", 16, b""),
    ("set", "high", 3, struct.pack("<i", 9).ljust(64, b"\0")),  # no such policy: the driver's INVALID_VALUE
    ("set", "high", 1, struct.pack("<QQfii", 0, 4096, 1.5, 0, 0).ljust(64, b"\0")),  # a hit ratio past 1
    ("get", "high", 2, b""), ("set", "high", 4, bytes(64)),  # plain IDs that are no stream's: the driver refuses
    ("copy", "low", 0, b""), *[("get", "low", attribute, b"") for attribute in (1, 3, 8, 9, 10)],
    ("set", "null", 3, struct.pack("<i", 2).ljust(64, b"\0")), ("get", "null", 3, b""),
]


def _fake_attribute_steps() -> list[list[Any]]:
    fake = FakeDriver(initialized=True)
    _, dev = fake.cuDeviceGet(0)
    _, ctx = fake.cuDevicePrimaryCtxRetain(dev)
    fake.cuCtxSetCurrent(ctx)
    streams = {"high": fake.cuStreamCreateWithPriority(1, -3)[1], "low": fake.cuStreamCreate(1)[1], "null": None}
    answers: list[list[Any]] = []
    for call, name, attribute, value in ATTRIBUTE_STEPS:
        s = streams[name]
        if call == "get":
            err, got = fake.cuStreamGetAttribute(s, attribute)
            answers.append([int(err), ctypes.string_at(got.getPtr(), 64).hex() if got is not None else None])
        elif call == "set":
            answers.append([int(fake.cuStreamSetAttribute(s, attribute, CUstreamAttrValue(data=value))[0]), None])
        else:
            answers.append([int(fake.cuStreamCopyAttributes(s, streams["high"])[0]), None])
    return answers


def test_stream_attributes_round_trip_as_the_fake_driver_answers_them(library: Path, rig: Rig) -> None:  # noqa: F811
    """Every stream-valid attribute read as created, set and read back, refused where the driver refuses a value or
    an ID, copied to another stream and read there, on a created and the NULL stream: every status and every value's
    64 bytes as the fake driver gives them called directly. And what does not travel: an unknown ID, an event's ID,
    DEVICE_UPDATABLE_KERNEL_NODE (801, named once, never sent), a NULL value (INVALID_VALUE), a stream the session
    does not own (INVALID_HANDLE, refused on the host)."""
    steps = json.dumps([[call, name, attribute, value.hex()] for call, name, attribute, value in ATTRIBUTE_STEPS])
    body = rf"""
streams = {{"high": stream(1, -3), "low": stream(1), "null": None}}
answers = []
for call, name, attribute, value in json.loads({steps!r}):
    s = streams[name]
    union = ctypes.create_string_buffer(bytes.fromhex(value) or b"\xee" * 64, 64)
    if call == "get":
        status = lib.cuStreamGetAttribute(s, attribute, union)
        answers.append([status, union.raw.hex() if status == 0 else None])
    elif call == "set":
        answers.append([lib.cuStreamSetAttribute(s, attribute, union), None])
    else:
        answers.append([lib.cuStreamCopyAttributes(s, streams["high"]), None])
out["answers"] = answers
union = ctypes.create_string_buffer(64)
out["refused"] = [lib.cuStreamGetAttribute(streams["high"], attribute, union) for attribute in (99, 7, 12, 13, -1)]
out["refused_set"] = [lib.cuStreamSetAttribute(streams["high"], attribute, union) for attribute in (99, 7, 13)]
out["null_value"] = [lib.cuStreamGetAttribute(streams["high"], 3, None), lib.cuStreamSetAttribute(None, 3, None)]
out["foreign"] = [lib.cuStreamGetAttribute(0xBAD0, 3, union), lib.cuStreamSetAttribute(0xBAD0, 3, union)]
priority = c_int(99)
assert lib.cuStreamGetPriority(streams["high"], byref(priority)) == 0
out["priority"] = priority.value
"""
    mark = rig.mark()
    out, stderr = run(library, rig, body)
    assert out["answers"] == _fake_attribute_steps()
    assert out["refused"] == [NOT_SUPPORTED] * 5 and out["refused_set"] == [NOT_SUPPORTED] * 3
    assert stderr.count("cuStreamGetAttribute/cuStreamSetAttribute with an attribute other than") == 1
    assert out["null_value"] == [INVALID_VALUE] * 2 and out["foreign"] == [INVALID_HANDLE] * 2
    assert out["priority"] == -1  # set through the attribute: the stream's own priority
    reached = [*rig.entries(since=mark, name="cuStreamGetAttribute"),
               *rig.entries(since=mark, name="cuStreamSetAttribute")]
    assert len(reached) == len([s for s in ATTRIBUTE_STEPS if s[0] != "copy"])  # nothing refused reached the driver
    windows = [e["args"][2] for e in rig.entries(since=mark, name="cuStreamSetAttribute")
               if e["args"][1] == ["CUstreamAttrID", 1]]
    assert windows[0] == f"<CUstreamAttrValue {WINDOW.hex()}>"  # the union the driver got, byte for byte


def test_the_host_refuses_a_stream_attribute_value_of_the_wrong_size_and_ids_that_do_not_travel(rig: Rig) -> None:  # noqa: F811
    """What a hostile guest may send past its own library: a value that is not 64 bytes is a wire error (MALFORMED),
    an ID outside the plain ones CUDA_ERROR_NOT_SUPPORTED, a foreign stream INVALID_HANDLE; none reaches the
    driver."""
    from ivshmem.driver_api import CALLS
    from ivshmem.record import Status
    guest = rig.guest()
    guest.setup()
    mark = rig.mark()
    set_call, get_call = CALLS["cuStreamSetAttribute"], CALLS["cuStreamGetAttribute"]
    channel = guest.channel
    answers = []
    for opcode, payload in ((set_call.opcode, set_call.request.encode(0, 3, bytes(63))),
                            (set_call.opcode, set_call.request.encode(0, 3, bytes(65))),
                            (set_call.opcode, set_call.request.encode(0, 7, bytes(64))),
                            (get_call.opcode, get_call.request.encode(0, 13)),
                            (get_call.opcode, get_call.request.encode(0xBAD0, 3)),
                            (get_call.opcode, b"\x00" * 5)):
        answers.append(channel.call(opcode, payload).status)
    assert answers == [Status.MALFORMED, Status.MALFORMED, NOT_SUPPORTED, NOT_SUPPORTED, INVALID_HANDLE,
                       Status.MALFORMED]
    assert not rig.entries(since=mark, name="cuStreamSetAttribute") + rig.entries(since=mark,
                                                                                  name="cuStreamGetAttribute")
    guest.close()


def test_potential_cluster_size_as_the_fake_driver_answers_it(library: Path, rig: Rig) -> None:  # noqa: F811
    body = r"""
status, module = load(PTX + b"\0")
mix = function(module, b"mix")
def size(f, extra=b"", block=128, s=None, shared=0, config=True, out_cell=True):
    raw = extra
    attributes = ctypes.create_string_buffer(raw, max(len(raw), 1))
    c = Config(16, 1, 1, block, 1, 1, shared, s, addressof(attributes) if raw else None, len(raw) // 72)
    cell = c_int(-1)
    return [lib.cuOccupancyMaxPotentialClusterSize(byref(cell) if out_cell else None, f, byref(c) if config else None),
            cell.value]
cluster = struct.pack("<i4x64s", 4, struct.pack("<3I", 4, 1, 1))
out["plain"] = size(mix)
out["cluster_dims_ignored"] = size(mix, cluster)
out["with_stream"] = size(mix, s=stream(1), shared=1024)
out["no_threads"] = size(mix, block=0)
out["updatable"] = size(mix, struct.pack("<i4x64s", 13, b""))
out["updatable_again"] = size(mix, struct.pack("<i4x64s", 13, b""))
out["foreign"] = size(0xF00D0)
out["foreign_stream"] = size(mix, s=0xBAD0)
out["foreign_event"] = size(mix, struct.pack("<i4x64s", 12, struct.pack("<Q", 0xBAD0)))
out["null_out"] = size(mix, out_cell=False)[0]
out["null_config"] = size(mix, config=False)[0]
out["function"] = mix
"""
    mark = rig.mark()
    out, stderr = run(library, rig, body)
    fake = FakeDriver(initialized=True)
    _, dev = fake.cuDeviceGet(0)
    _, ctx = fake.cuDevicePrimaryCtxRetain(dev)
    fake.cuCtxSetCurrent(ctx)
    _, module = fake.cuModuleLoadData(PTX + b"\0")
    _, function = fake.cuModuleGetFunction(module, b"mix")
    config = LaunchConfig(16, 1, 1, 128, 1, 1, 0, None, None, 0)
    err, expected = fake.cuOccupancyMaxPotentialClusterSize(function, fake.CUlaunchConfig(ctypes.addressof(config)))
    assert int(err) == SUCCESS
    assert out["plain"] == out["cluster_dims_ignored"] == out["with_stream"] == [SUCCESS, expected]
    assert out["no_threads"][0] == INVALID_VALUE
    assert out["updatable"][0] == out["updatable_again"][0] == NOT_SUPPORTED
    assert stderr.count("cuOccupancyMaxPotentialClusterSize with a launch attribute") == 1
    assert out["foreign"][0] == out["foreign_stream"][0] == out["foreign_event"][0] == INVALID_HANDLE
    assert out["null_out"] == out["null_config"] == INVALID_VALUE
    reached = rig.entries(since=mark, name="cuOccupancyMaxPotentialClusterSize")
    assert len(reached) == 4  # the three answered and the one the fake refused; nothing refused by Orion


def test_the_gpu_program_runs_on_the_fake_driver(library: Path, rig: Rig) -> None:  # noqa: F811
    """tests/gpu/programs/callbacks_program.py through cuda-python and the native driver against the fake (the same
    program the GPU compares natively and forwarded): its logic holds here, with the fake's answers. The fake's
    driver version is 13.0, so the program skips cuLaunchHostFunc_v2 (covered above); a fake kernel has no required
    cluster size and allows no non-portable one (the driver refuses that attribute: INVALID_VALUE)."""
    try:
        from cuda.bindings import nvrtc
        if int(nvrtc.nvrtcVersion()[0]) != 0:
            pytest.skip("NVRTC does not answer")
    except (ImportError, RuntimeError, OSError):
        pytest.skip("no NVRTC (the program compiles its kernels with it)")
    done = subprocess.run([sys.executable, str(PROGRAM)], env=native_child_env(library, rig.path),
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    a, b = 0xC0DE0001, 0xC0DE0002
    assert out["order"] == [["callback", 1, 0, a, a, True], ["host", 2, a], ["callback", 5, 0, b, b, True],
                            ["callback", 6, 0, b, b, False]]
    assert out["carried"] == 1001 and out["last_host_write"] == 2002 and out["bad_flags"] == INVALID_VALUE
    assert out["v2"] is False
    assert out["created"] == {"policy": 1, "domain": 0, "map": [0, 1], "window": [False, 0, 0.0, 0, 0],
                              "priority": -5, "stream_priority": -5}
    assert out["set"] == {"policy": 4, "domain": 1, "map": [0, 1], "window": [True, 4096, 0.5, 2, 1],
                          "priority": 0, "stream_priority": 0}
    assert out["copied"] == out["set"] and out["set_priority"] == out["copied_status"] == SUCCESS
    assert out["not_a_streams"] == INVALID_VALUE
    assert out["portable"] == out["required"] == out["non_portable"] == out["ignores_cluster_dims"] == 8
    assert out["allow_non_portable"] == INVALID_VALUE and out["active_clusters"][0] == SUCCESS


# cuda.h's special stream handles, which every context has without creating them: copies (staged and page-locked),
# memsets (the compiled hot path's) and synchronisation name them as the driver takes them. A made-up handle stays
# refused before the driver.
DEFAULT_STREAMS = r"""
data = bytes(range(256)) * 16
memory, page = device(4096), pinned(4096)
ctypes.memmove(page, data, 4096)
source = ctypes.create_string_buffer(data, 4096)
out["htod"] = [lib.cuMemcpyHtoDAsync(memory, source, 2048, 1),
               lib.cuMemcpyHtoDAsync(memory + 2048, page + 2048, 2048, 2)]
out["memset"] = lib.cuMemsetD32Async(memory + 1024, 0x01020304, 16, 2)
out["sync"] = [lib.cuStreamSynchronize(1), lib.cuStreamSynchronize(2)]
back = ctypes.create_string_buffer(4096)
out["dtoh"] = lib.cuMemcpyDtoHAsync(back, memory, 4096, 1)
out["sync_again"] = lib.cuStreamSynchronize(1)
expected = bytearray(data)
expected[1024:1088] = bytes([4, 3, 2, 1]) * 16
out["same"] = back.raw == bytes(expected)
out["made_up"] = [lib.cuStreamSynchronize(12345), lib.cuMemsetD32Async(memory, 0, 1, 12345)]
"""


@pytest.mark.parametrize("relayed", [False, True], ids=["local", "relayed"])
def test_the_legacy_and_per_thread_streams_need_no_creating(library: Path, start: Callable[..., Rig],  # noqa: F811
                                                           relayed: bool) -> None:
    result, _ = run(library, either_path(start, relayed), DEFAULT_STREAMS)
    assert result["htod"] == [SUCCESS, SUCCESS] and result["memset"] == SUCCESS
    assert result["sync"] == [SUCCESS, SUCCESS] and result["dtoh"] == SUCCESS and result["sync_again"] == SUCCESS
    assert result["same"]
    assert result["made_up"][0] == INVALID_HANDLE  # the posted memset's failure surfaces later, as the driver's does


# A host function is two stream memory operations, which a capture would take as two nodes that run the function at
# most once however often the graph is launched: while a capture is under way its stream is asked first, and a
# capturing stream refuses it (the capture invalidated), never a graph that is wrong. No capture: no question.
CAPTURED = r"""
s = stream(1)
ran = []
fn = HOSTFN(lambda data: ran.append(data))
out["before"] = [lib.cuLaunchHostFunc(s, fn, 1), lib.cuStreamSynchronize(s)]
out["begin"] = lib.cuStreamBeginCapture(s, 0)  # CU_STREAM_CAPTURE_MODE_GLOBAL
out["during"] = lib.cuLaunchHostFunc(s, fn, 2)
graph = c_void_p()
out["end"] = lib.cuStreamEndCapture(s, byref(graph))
out["after"] = [lib.cuLaunchHostFunc(s, fn, 3), lib.cuStreamSynchronize(s)]
out["ran"] = ran
"""


@local_only("a relayed session refuses it: tests/wire/test_native_host_nodes.py")
def test_a_host_function_on_a_capturing_stream_is_captured_and_outside_a_capture_asks_nothing(
        library: Path, rig: Rig) -> None:  # noqa: F811
    """While a capture is under way the function goes as a host node runs it (HOST_NODE_FUNCTION: the host's
    cuLaunchHostFunc with its trampoline, which the capture records); before and after, nothing but the posted pair.
    Its runs at replays: tests/wire/test_native_host_nodes.py."""
    out, _ = run(library, rig, CAPTURED)
    assert out["before"] == [SUCCESS, SUCCESS] and out["begin"] == SUCCESS
    assert out["during"] == SUCCESS and out["end"] == SUCCESS
    assert out["after"] == [SUCCESS, SUCCESS] and out["ran"] == [1, 3]  # the captured one runs only when replayed
    assert len(rig.entries(name="cuLaunchHostFunc")) == 1 and not rig.entries(name="cuStreamQuery")


# A synchronous copy from pageable memory: the driver syncs the stream before it reads the program's bytes (cuda.h's
# "API synchronization behavior"), so a host function queued before it, on the legacy stream or on a blocking stream
# the legacy stream waits for, has written them by then.
WRITTEN_FIRST = r"""
import time
lib.cuMemcpyHtoD.argtypes = [c_uint64, c_void_p, c_size_t]
lib.cuMemcpyDtoH.argtypes = [c_void_p, c_uint64, c_size_t]
out["copies"] = []
for name, s in (("legacy", None), ("blocking", stream(0))):
    data = ctypes.create_string_buffer(b"old!" * 4, 16)
    def slow(_data, data=data):
        time.sleep(0.2)  # long after the copy was asked for
        ctypes.memmove(data, b"new!" * 4, 16)
    fn = HOSTFN(slow)
    memory = device(16)
    queued = lib.cuLaunchHostFunc(s, fn, None)
    copied = lib.cuMemcpyHtoD(memory, data, 16)
    back = ctypes.create_string_buffer(16)
    out["copies"].append([name, queued, copied, lib.cuMemcpyDtoH(back, memory, 16), back.raw.decode()])
    assert lib.cuCtxSynchronize() == 0
"""


@pytest.mark.parametrize("relayed", [False, True], ids=["local", "relayed"])
def test_a_synchronous_copy_takes_what_a_host_function_before_it_wrote(library: Path, start: Callable[..., Rig],  # noqa: F811
                                                                        relayed: bool) -> None:  # noqa: F811
    """The copy reads the program's bytes once the host function queued before it has run, never the ones the buffer
    held when the copy was asked for (copy_calls.c: a synchronous copy to the device waits for the legacy stream
    first while a host function of the process may be pending)."""
    out, _ = run(library, either_path(start, relayed), WRITTEN_FIRST)
    assert out["copies"] == [[name, SUCCESS, SUCCESS, SUCCESS, "new!" * 4] for name in ("legacy", "blocking")]
