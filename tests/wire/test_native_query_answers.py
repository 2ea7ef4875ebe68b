"""The hot queries the native guest driver answers from guest-side state (guest_runtime/native/device_answers.c,
context_answers.c, function_answers.c; docs/native-driver.md "Queries answered in the guest").

Each test loads the built `libcuda.so.1` with ctypes in a subprocess whose ORION_SHM names the rig's region
(tests/forwarding_rig.py: a real agent whose sessions run the executor over the fake driver). Two records prove
that a repeated query does not travel: the fake's journal (every call that reached the "driver") and the
library's own record counter (`orion_last_call_id` of the process's channel: every record sent, posted ones
included, and calls the host's vGPU policy answers without the driver). The first answer must equal the host's
(the journal's result); the ones after it must cost no record; the calls that change an answer must make the
next query ask again. CPU only.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests import forwarding_rig
from tests.fake_driver import FakeDriver
from tests.forwarding_rig import GUEST_DEVICES, Rig, native_child_env
from tests.wire.test_native_launch_calls import PTX

bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures

REPO = Path(__file__).resolve().parents[2]
SUCCESS, INVALID_VALUE, INVALID_DEVICE, INVALID_CONTEXT, INVALID_HANDLE = 0, 1, 101, 201, 400
MAX_THREADS_PER_BLOCK, MULTIPROCESSOR_COUNT, PCI_BUS_ID = 1, 16, 33  # CUdevice_attribute
NUM_REGS, MAX_DYNAMIC_SHARED_SIZE_BYTES = 4, 8  # CUfunction_attribute
UNKNOWN_ATTRIBUTE = 75  # COMPUTE_CAPABILITY_MAJOR, refused by a fake built with lacks_attributes=(75,)


# Run in the subprocess: the library, cuInit, and helpers; each test appends its body, which fills `out`.
PRELUDE = r"""
import ctypes, json, sys, threading
from ctypes import byref, c_int, c_uint, c_uint64, c_size_t, c_void_p, c_char_p
lib = ctypes.CDLL(sys.argv[1])
PTX = bytes.fromhex(sys.argv[2])
out = {}
U64 = c_uint64
for name, args in {
    "cuCtxCreate": [c_void_p, c_void_p, c_uint, c_int], "cuCtxDestroy": [U64], "cuCtxSetCurrent": [U64],
    "cuCtxPushCurrent": [U64], "cuCtxGetApiVersion": [U64, c_void_p], "cuCtxGetId": [U64, c_void_p],
    "cuModuleLoadData": [c_void_p, c_void_p], "cuModuleUnload": [U64], "cuModuleGetFunction": [c_void_p, U64, c_char_p],
    "cuLibraryLoadData": [c_void_p, c_void_p, c_void_p, c_void_p, c_uint, c_void_p, c_void_p, c_uint],
    "cuLibraryGetKernel": [c_void_p, U64, c_char_p], "cuLibraryUnload": [U64],
    "cuFuncGetAttribute": [c_void_p, c_int, U64], "cuFuncSetAttribute": [U64, c_int, c_int],
    "cuFuncSetCacheConfig": [U64, c_int], "cuKernelGetAttribute": [c_void_p, c_int, U64, c_int],
    "cuKernelSetAttribute": [c_int, c_int, U64, c_int], "cuKernelSetCacheConfig": [U64, c_int, c_int],
    "cuDeviceGetName": [c_void_p, c_int, c_int], "orion_context_gone": [U64],
}.items():
    getattr(lib, name).argtypes = args
lib.orion_process_channel.restype = c_void_p
lib.orion_last_call_id.restype = c_uint64
lib.orion_last_call_id.argtypes = [c_void_p]

def sent():
    # records this process has sent so far (posted ones included)
    return lib.orion_last_call_id(lib.orion_process_channel())

def int_out(call, *args):
    value = c_int(-12345)
    return [call(byref(value), *args), value.value]

def retain(device):
    ctx = c_uint64()
    assert lib.cuDevicePrimaryCtxRetain(byref(ctx), device) == 0
    return ctx.value

def current_device():
    return int_out(lib.cuCtxGetDevice)

assert lib.cuInit(0) == 0
"""
EPILOGUE = r"""
print("RESULT " + json.dumps(out))
"""


def run(library: Path, rig: Rig, body: str) -> dict[str, Any]:
    """The body after PRELUDE in a fresh process speaking to the rig's agent: its `out`."""
    env = native_child_env(library, rig.path)
    done = subprocess.run([sys.executable, "-c", PRELUDE + body + EPILOGUE, str(library), PTX.hex()], env=env,
                          capture_output=True, text=True, timeout=50, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line[len("RESULT "):])
    return result


def results(rig: Rig, name: str) -> list[list[Any]]:
    """Each journaled call of `name`: its arguments and result, handles and enum members as plain numbers."""
    def plain(value: Any) -> Any:
        return value[1] if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) else value
    return [[[plain(a) for a in e["args"]], [plain(r) for r in e["result"]]] for e in rig.entries(name=name)]


def test_device_answers_are_the_hosts_and_asked_once(library: Path, rig: Rig) -> None:  # noqa: F811
    body = r"""
out["version"] = [int_out(lib.cuDriverGetVersion) for _ in range(3)]
out["count"] = int_out(lib.cuDeviceGetCount)
out["get"] = [int_out(lib.cuDeviceGet, o) for o in (0, 1, 7)]
ATTRIBUTES = (MULTIPROCESSOR_COUNT, PCI_BUS_ID)
out["attributes"] = [int_out(lib.cuDeviceGetAttribute, a, d) for d in (0, 1) for a in ATTRIBUTES]
out["bad_device"] = int_out(lib.cuDeviceGetAttribute, MULTIPROCESSOR_COUNT, 5)
total = c_size_t()
out["total"] = [lib.cuDeviceTotalMem(byref(total), 1), total.value]
out["peer"] = int_out(lib.cuDeviceCanAccessPeer, 0, 1)
name = ctypes.create_string_buffer(b"\xee" * 64, 64)
out["name"] = [lib.cuDeviceGetName(name, 64, 0), name.value.decode()]
short = ctypes.create_string_buffer(b"\xee" * 12, 12)
out["short"] = [lib.cuDeviceGetName(short, 6, 0), short.raw.hex()]
uuid = ctypes.create_string_buffer(16)
out["uuid"] = [lib.cuDeviceGetUuid(uuid, 1), uuid.raw.hex()]
before = sent()
for _ in range(50):  # every answer again: none of them may send a record
    again = [int_out(lib.cuDriverGetVersion), int_out(lib.cuDeviceGetCount)]
    again += [int_out(lib.cuDeviceGet, o) for o in (0, 1, 7)]
    again += [int_out(lib.cuDeviceGetAttribute, a, d) for d in (0, 1) for a in ATTRIBUTES]
    again.append(int_out(lib.cuDeviceGetAttribute, MULTIPROCESSOR_COUNT, 5))
    again.append([lib.cuDeviceTotalMem(byref(total), 1), total.value])
    again.append(int_out(lib.cuDeviceCanAccessPeer, 0, 1))
    again.append([lib.cuDeviceGetName(name, 64, 0), name.value.decode()])
    again.append([lib.cuDeviceGetUuid(uuid, 1), uuid.raw.hex()])
out["sent"] = sent() - before
out["again"] = again
out["null"] = [lib.cuDeviceGetAttribute(None, 1, 0), lib.cuDeviceGetCount(None), lib.cuDeviceGetName(name, 0, 0)]
""".replace("MULTIPROCESSOR_COUNT", str(MULTIPROCESSOR_COUNT)).replace("PCI_BUS_ID", str(PCI_BUS_ID))
    out = run(library, rig, body)
    fake = FakeDriver(devices=3)
    physical = GUEST_DEVICES
    assert out["version"][0][0] == SUCCESS and len(set(map(tuple, out["version"]))) == 1
    [[_, version]] = results(rig, "cuDriverGetVersion")  # asked once; the answer is the host's
    assert out["version"][0][1] == version[1]
    assert out["count"] == [SUCCESS, len(GUEST_DEVICES)]  # the session's vGPUs (a policy answer: no driver call)
    assert out["get"] == [[SUCCESS, 0], [SUCCESS, 1], [INVALID_DEVICE, -12345]]
    expected = [[SUCCESS, fake.device_attribute(a, physical[d])] for d in (0, 1)
                for a in (MULTIPROCESSOR_COUNT, PCI_BUS_ID)]
    assert out["attributes"] == expected and expected[0] != expected[2]  # the devices differ, each its own
    asked = results(rig, "cuDeviceGetAttribute")
    assert len(asked) == 4 and [r[1] for _, r in asked] == [v for _, v in expected]
    assert out["bad_device"] == [INVALID_DEVICE, -12345]  # the host's answer (no driver call), kept
    assert out["total"] == [SUCCESS, fake.total_mem[physical[1]]]
    assert out["peer"] == [SUCCESS, 1]
    device_name = fake.device_name(physical[0])
    assert out["name"] == [SUCCESS, device_name[:63].decode()]
    assert out["short"] == [SUCCESS, (device_name[:5] + b"\0").hex() + "ee" * 6]  # cut to its length, nothing past
    assert out["uuid"] == [SUCCESS, fake.device_uuid(physical[1]).hex()]
    assert len(results(rig, "cuDeviceGetName")) == len(results(rig, "cuDeviceGetUuid")) == 1
    assert len(results(rig, "cuDeviceTotalMem")) == len(results(rig, "cuDeviceCanAccessPeer")) == 1
    assert out["sent"] == 0, "a repeated device query sent a record"
    first = [out["version"][0], out["count"], *out["get"], *out["attributes"], out["bad_device"], out["total"],
             out["peer"], out["name"], out["uuid"]]
    assert out["again"] == first
    assert out["null"] == [INVALID_VALUE, INVALID_VALUE, INVALID_VALUE]


def test_an_attribute_the_hosts_driver_does_not_know_is_refused_once(library: Path, start: Callable[..., Rig]) -> None:  # noqa: F811
    """INVALID_VALUE for an attribute the driver lacks is a fact of the session's driver: kept, not asked again."""
    agent = start(lacks_attributes=(UNKNOWN_ATTRIBUTE,))
    body = rf"""
before = sent()
out["unknown"] = [int_out(lib.cuDeviceGetAttribute, {UNKNOWN_ATTRIBUTE}, 0) for _ in range(5)]
out["sent"] = sent() - before
out["known"] = int_out(lib.cuDeviceGetAttribute, {MAX_THREADS_PER_BLOCK}, 0)
"""
    out = run(library, agent, body)
    assert out["unknown"] == [[INVALID_VALUE, -12345]] * 5
    assert out["sent"] == 1  # the first one only
    assert out["known"] == [SUCCESS, 1024]


def test_current_context_changes_send_nothing_for_known_contexts(library: Path, rig: Rig) -> None:  # noqa: F811
    body = r"""
primary = retain(0)
other = c_uint64()
assert lib.cuCtxCreate(byref(other), None, 0, 1) == 0
other = other.value
before = sent()
current = c_uint64()
statuses = set()
for _ in range(100):
    statuses.add(lib.cuCtxSetCurrent(primary))
    statuses.add(lib.cuCtxGetCurrent(byref(current)))
    statuses.add(lib.cuCtxSetCurrent(other))
    statuses.add(lib.cuCtxSetCurrent(primary))
out["set_get"] = [sorted(statuses), current.value == primary]
out["sent"] = sent() - before
out["sync"] = lib.cuCtxSynchronize()  # the host's current context follows the thread's before this one
lib.cuCtxSetCurrent(other)
out["sync_other"] = lib.cuCtxSynchronize()
out["bogus"] = lib.cuCtxSetCurrent(0xBAD0)  # never made here: the host checks it, and refuses it
out["destroy"] = lib.cuCtxDestroy(other)
out["destroyed"] = lib.cuCtxSetCurrent(other)  # gone: checked again, refused
before = sent()
out["push_known"] = [lib.cuCtxPushCurrent(primary), sent() - before]
"""
    out = run(library, rig, body)
    assert out["set_get"] == [[SUCCESS], True]
    assert out["sent"] == 0, "cuCtxSetCurrent/cuCtxGetCurrent of known contexts sent records"
    assert out["sync"] == out["sync_other"] == SUCCESS
    primary, other = (r[1][1] for r in results(rig, "cuDevicePrimaryCtxRetain") + results(rig, "cuCtxCreate"))
    syncs = [e["name"] for e in rig.entries() if e["name"] in ("cuCtxSetCurrent", "cuCtxSynchronize")]
    set_to = [args[0] for args, _ in results(rig, "cuCtxSetCurrent")]
    # one posted set before each synchronize (cuCtxCreate left `other` current on the host), then the two checks
    assert syncs[:4] == ["cuCtxSetCurrent", "cuCtxSynchronize", "cuCtxSetCurrent", "cuCtxSynchronize"]
    assert set_to[:2] == [primary, other]
    # a context not made here is checked by the host (the session ledger refuses it), and so is a destroyed one
    assert out["bogus"] == INVALID_CONTEXT and out["destroy"] == SUCCESS and out["destroyed"] == INVALID_CONTEXT
    assert out["push_known"] == [SUCCESS, 0]


def test_context_device_across_contexts_on_two_devices_and_threads(library: Path, rig: Rig) -> None:  # noqa: F811
    body = r"""
out["no_context"] = current_device()
zero, one = retain(0), retain(1)
made = c_uint64()
assert lib.cuCtxCreate(byref(made), None, 0, 1) == 0
made = made.value
contexts = {"zero": zero, "one": one, "made": made}
before = sent()
seen = {}
def worker(name):
    lib.cuCtxSetCurrent(contexts[name])
    seen[name] = [current_device() for _ in range(200)]
threads = [threading.Thread(target=worker, args=(n,)) for n in contexts]
for t in threads: t.start()
for t in threads: t.join()
out["seen"] = {name: sorted(set(map(tuple, answers))) for name, answers in seen.items()}
out["sent"] = sent() - before
# the host's own answer for each, asked by forgetting what the guest knew
asked = {}
for name, ctx in contexts.items():
    lib.cuCtxSetCurrent(ctx)
    lib.orion_context_gone(ctx)
    asked[name] = current_device()
out["asked"] = asked
"""
    out = run(library, rig, body)
    assert out["no_context"] == [INVALID_CONTEXT, -12345]
    assert out["seen"] == {"zero": [[SUCCESS, 0]], "one": [[SUCCESS, 1]], "made": [[SUCCESS, 1]]}
    assert out["sent"] == 0, "cuCtxGetDevice (or a known cuCtxSetCurrent) sent a record"
    assert out["asked"] == {"zero": [SUCCESS, 0], "one": [SUCCESS, 1], "made": [SUCCESS, 1]}
    assert len(results(rig, "cuCtxGetDevice")) == 3  # only the three asked after forgetting


def test_context_flags_priorities_version_and_id_are_kept_per_context(library: Path, rig: Rig) -> None:  # noqa: F811
    body = r"""
primary = retain(0)
lib.cuCtxSetCurrent(primary)
made = c_uint64()
assert lib.cuCtxCreate(byref(made), None, 4, 1) == 0  # CU_CTX_SCHED_BLOCKING_SYNC, current now
made = made.value
def answers():
    flags, least, greatest, version, ident = c_uint(), c_int(), c_int(), c_uint(), c_uint64()
    return [lib.cuCtxGetFlags(byref(flags)), flags.value,
            lib.cuCtxGetStreamPriorityRange(byref(least), byref(greatest)), least.value, greatest.value,
            lib.cuCtxGetApiVersion(0, byref(version)), version.value, lib.cuCtxGetId(0, byref(ident)), ident.value]
first = {"made": answers()}
lib.cuCtxSetCurrent(primary)
first["primary"] = answers()
ident = c_uint64()
first["named"] = [lib.cuCtxGetId(made, byref(ident)), ident.value]
before = sent()
again = {}
for _ in range(20):
    lib.cuCtxSetCurrent(made)
    again["made"] = answers()
    lib.cuCtxSetCurrent(primary)
    again["primary"] = answers()
    again["named"] = [lib.cuCtxGetId(made, byref(ident)), ident.value]
out["sent"] = sent() - before
out["first"], out["again"] = first, again
lib.cuCtxDestroy(made)
out["destroyed_id"] = lib.cuCtxGetId(made, byref(ident))  # forgotten: the host answers for a gone context
"""
    out = run(library, rig, body)
    first = out["first"]
    assert first["made"][:2] == [SUCCESS, 4] and first["primary"][:2] == [SUCCESS, 0]
    assert first["made"][2:5] == [SUCCESS, 0, -5]
    assert first["made"][7] == first["primary"][7] == SUCCESS and first["made"][8] != first["primary"][8]
    assert first["named"] == [SUCCESS, first["made"][8]]
    assert out["again"] == first and out["sent"] == 0
    for name in ("cuCtxGetFlags", "cuCtxGetStreamPriorityRange", "cuCtxGetApiVersion"):
        assert len(results(rig, name)) == 2, name  # once per context
    ids = [r[1] for _, r in results(rig, "cuCtxGetId")]
    assert sorted(ids) == sorted([first["made"][8], first["primary"][8]]) and len(ids) == 2
    assert out["destroyed_id"] == INVALID_CONTEXT


def test_primary_context_state_follows_retain_release_reset_and_set_flags(library: Path, rig: Rig) -> None:  # noqa: F811
    body = r"""
def state(device=0):
    flags, active = c_uint(99), c_int(99)
    return [lib.cuDevicePrimaryCtxGetState(device, byref(flags), byref(active)), flags.value, active.value]
def repeated(label, device=0):
    before = sent()
    answers = [state(device) for _ in range(10)]
    out[label] = [answers[0], len(set(map(tuple, answers))), sent() - before]
repeated("initial")
ctx = c_uint64()
out["retain"] = [lib.cuDevicePrimaryCtxRetain(byref(ctx), 0), lib.cuDevicePrimaryCtxRetain(byref(ctx), 0)]
repeated("retained")
out["release"] = lib.cuDevicePrimaryCtxRelease(0)
repeated("released_once")
out["release_again"] = lib.cuDevicePrimaryCtxRelease(0)
repeated("released")
out["set_flags"] = lib.cuDevicePrimaryCtxSetFlags(0, 4)
repeated("flagged")
out["retain_flagged"] = lib.cuDevicePrimaryCtxRetain(byref(ctx), 0)
repeated("retained_flagged")
flags = c_uint()
lib.cuCtxSetCurrent(ctx.value)
out["ctx_flags"] = [lib.cuCtxGetFlags(byref(flags)), flags.value]
out["reset"] = lib.cuDevicePrimaryCtxReset(0)
repeated("after_reset")
out["ctx_flags_after_reset"] = [lib.cuCtxGetFlags(byref(flags)), flags.value]
out["release_none"] = [lib.cuDevicePrimaryCtxRelease(0), lib.cuDevicePrimaryCtxRelease(0)]
repeated("end")
repeated("other_device", 1)
out["bad_device"] = [state(9), state(9)]
"""
    out = run(library, rig, body)
    # each label: (the answer, how many different answers in 10 asks, records sent for them)
    assert out["initial"] == [[SUCCESS, 0, 0], 1, 1]
    assert out["retain"] == [SUCCESS, SUCCESS]
    assert out["retained"] == [[SUCCESS, 0, 1], 1, 1]
    assert out["release"] == SUCCESS and out["released_once"] == [[SUCCESS, 0, 1], 1, 1]  # one retain left
    assert out["release_again"] == SUCCESS and out["released"] == [[SUCCESS, 0, 0], 1, 1]
    assert out["set_flags"] == SUCCESS and out["flagged"] == [[SUCCESS, 4, 0], 1, 1]
    assert out["retain_flagged"] == SUCCESS and out["retained_flagged"] == [[SUCCESS, 4, 1], 1, 1]
    assert out["ctx_flags"] == [SUCCESS, 4]
    assert out["reset"] == SUCCESS and out["after_reset"] == [[SUCCESS, 0, 1], 1, 1]
    flags_asked = [r[1] for _, r in results(rig, "cuCtxGetFlags")]
    assert flags_asked == [4, out["ctx_flags_after_reset"][1]]  # forgotten with the reset: asked again
    assert out["release_none"] == [SUCCESS, INVALID_CONTEXT]
    assert out["end"] == [[SUCCESS, 0, 0], 1, 1]
    assert out["other_device"] == [[SUCCESS, 0, 0], 1, 1]
    assert out["bad_device"] == [[INVALID_DEVICE, 99, 99]] * 2  # an error: not kept, the host answers each
    # every answer the guest gave first after a change is the driver's own answer at that moment
    labels = ("initial", "retained", "released_once", "released", "flagged", "retained_flagged", "after_reset", "end")
    device0 = [r for args, r in results(rig, "cuDevicePrimaryCtxGetState") if args[0] == GUEST_DEVICES[0]]
    assert device0 == [out[label][0] for label in labels]


def test_function_attributes_kept_until_a_set_or_an_unload(library: Path, start: Callable[..., Rig]) -> None:  # noqa: F811
    agent = start(reuse_handles=True)
    body = rf"""
primary = retain(0)
lib.cuCtxSetCurrent(primary)
def load(image):
    holder = ctypes.create_string_buffer(image, len(image))
    module = c_uint64()
    assert lib.cuModuleLoadData(byref(module), holder) == 0
    return module.value
def function(module, name):
    handle = c_uint64()
    assert lib.cuModuleGetFunction(byref(handle), module, name) == 0
    return handle.value
module = load(PTX + b"\0")
mix = function(module, b"mix")
out["regs"] = int_out(lib.cuFuncGetAttribute, {NUM_REGS}, mix)
before = sent()
out["regs_again"] = [int_out(lib.cuFuncGetAttribute, {NUM_REGS}, mix) for _ in range(20)]
out["sent"] = sent() - before
out["shared_before"] = int_out(lib.cuFuncGetAttribute, {MAX_DYNAMIC_SHARED_SIZE_BYTES}, mix)
out["set"] = lib.cuFuncSetAttribute(mix, {MAX_DYNAMIC_SHARED_SIZE_BYTES}, 65536)
out["shared_after"] = [int_out(lib.cuFuncGetAttribute, {MAX_DYNAMIC_SHARED_SIZE_BYTES}, mix) for _ in range(3)]
out["cache_config"] = lib.cuFuncSetCacheConfig(mix, 1)
out["shared_after_config"] = int_out(lib.cuFuncGetAttribute, {MAX_DYNAMIC_SHARED_SIZE_BYTES}, mix)
out["unload"] = lib.cuModuleUnload(module)
second = load(PTX + b"\0")
noargs = function(second, b"noargs")
out["reused"] = [second == module, noargs == mix]
out["new_regs"] = int_out(lib.cuFuncGetAttribute, {NUM_REGS}, noargs)
out["new_shared"] = int_out(lib.cuFuncGetAttribute, {MAX_DYNAMIC_SHARED_SIZE_BYTES}, noargs)
before = sent()
out["bad"] = [int_out(lib.cuFuncGetAttribute, {NUM_REGS}, 0xBAD0) for _ in range(2)]
out["bad_sent"] = sent() - before
"""
    out = run(library, agent, body)
    fake = FakeDriver()
    mix_regs = fake.FUNCTION_ATTRIBUTES[NUM_REGS] + len(b"mix") % 8
    noargs_regs = fake.FUNCTION_ATTRIBUTES[NUM_REGS] + len(b"noargs") % 8
    assert out["regs"] == [SUCCESS, mix_regs] and out["regs_again"] == [[SUCCESS, mix_regs]] * 20
    assert out["sent"] == 0
    assert out["shared_before"] == [SUCCESS, 0] and out["set"] == SUCCESS
    assert out["shared_after"] == [[SUCCESS, 65536]] * 3  # the set forgot the old answer; the new one is kept
    assert out["cache_config"] == SUCCESS and out["shared_after_config"] == [SUCCESS, 65536]
    assert out["unload"] == SUCCESS and out["reused"] == [True, True], "the fake must give the handles out again"
    assert out["new_regs"] == [SUCCESS, noargs_regs] and noargs_regs != mix_regs  # the new function's, not mix's
    assert out["new_shared"] == [SUCCESS, 0]
    assert out["bad"] == [[INVALID_HANDLE, -12345]] * 2 and out["bad_sent"] == 2  # errors are not kept
    asked = [r[1] for _, r in results(agent, "cuFuncGetAttribute")]
    # NUM_REGS of mix once; MAX_DYNAMIC_SHARED before the set, after it, after the cache config; the new function's
    assert asked == [mix_regs, 0, 65536, 65536, noargs_regs, 0]


def test_kernel_attributes_kept_per_device_until_a_set(library: Path, rig: Rig) -> None:  # noqa: F811
    body = rf"""
image = ctypes.create_string_buffer(PTX)
library = c_uint64()
assert lib.cuLibraryLoadData(byref(library), image, None, None, 0, None, None, 0) == 0
kernel = c_uint64()
assert lib.cuLibraryGetKernel(byref(kernel), library.value, b"wide") == 0
kernel = kernel.value
out["first"] = [int_out(lib.cuKernelGetAttribute, {MAX_DYNAMIC_SHARED_SIZE_BYTES}, kernel, d) for d in (0, 1)]
before = sent()
out["again"] = [int_out(lib.cuKernelGetAttribute, {MAX_DYNAMIC_SHARED_SIZE_BYTES}, kernel, d) for d in (0, 1, 0, 1)]
out["sent"] = sent() - before
out["set"] = lib.cuKernelSetAttribute({MAX_DYNAMIC_SHARED_SIZE_BYTES}, 1000, kernel, 1)
out["after"] = [int_out(lib.cuKernelGetAttribute, {MAX_DYNAMIC_SHARED_SIZE_BYTES}, kernel, d) for d in (0, 1, 1)]
out["config"] = lib.cuKernelSetCacheConfig(kernel, 2, 0)
out["after_config"] = int_out(lib.cuKernelGetAttribute, {MAX_DYNAMIC_SHARED_SIZE_BYTES}, kernel, 1)
out["unload"] = lib.cuLibraryUnload(library.value)
before = sent()
out["after_unload"] = int_out(lib.cuKernelGetAttribute, {MAX_DYNAMIC_SHARED_SIZE_BYTES}, kernel, 1)
out["unload_sent"] = sent() - before
"""
    out = run(library, rig, body)
    assert out["first"] == [[SUCCESS, 0], [SUCCESS, 0]]
    assert out["again"] == [[SUCCESS, 0]] * 4 and out["sent"] == 0
    assert out["set"] == SUCCESS and out["after"] == [[SUCCESS, 0], [SUCCESS, 1000], [SUCCESS, 1000]]
    assert out["config"] == SUCCESS and out["after_config"] == [SUCCESS, 1000]
    # after the unload the kernel is asked about again, and the session's ledger refuses the handle
    assert out["unload"] == SUCCESS and out["after_unload"] == [INVALID_HANDLE, -12345] and out["unload_sent"] == 1
    devices = [args[2] for args, _ in results(rig, "cuKernelGetAttribute")]
    # both devices once, both again after the set, device 1 after the cache config
    assert devices == [GUEST_DEVICES[0], GUEST_DEVICES[1], GUEST_DEVICES[0], GUEST_DEVICES[1], GUEST_DEVICES[1]]
