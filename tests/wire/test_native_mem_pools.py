"""The native guest driver's memory-pool calls and virtual-memory queries (guest_runtime/native/mem_pool_calls.c and the
generated cuMemPoolDestroy and cuMemAllocPitch) against a real agent whose sessions run the executor over the fake
driver (tests/forwarding_rig.py; host_agent/session/mem_pool_calls.py serves them): a pool of the program's own moves
the
program's bytes and is counted on its own GPU, pools by location agree with the device calls, a pitched allocation is
the session's memory pitch x rows, a retained handle is the guest's own and owes one more release, and what a hostile
or mistaken guest sends (another session's pool, made-up handles, other devices, host memory, shareable handles)
gets the CUDA error the driver documents, refused by the host before it reaches the driver. Last, the GPU program
tests/gpu/programs/mem_pool_program.py runs through the native driver on the fake. CPU only.

The rig maps guest devices (0, 1) to the fake's physical devices (2, 0), so the journal shows every ordinal the host
translated.
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from guest_runtime.native import gen_libcuda
from host_agent.session.executor import ExecutorOptions
from ivshmem.driver_api import CALLS
from ivshmem.record import Op, Status
from tests import forwarding_rig
from tests.fake_driver import PITCH_ALIGNMENT
from tests.forwarding_rig import GUEST_DEVICES, Rig, native_child_env

bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures

REPO = Path(gen_libcuda.__file__).resolve().parents[2]
PROGRAM = REPO / "tests" / "gpu" / "programs" / "mem_pool_program.py"
MIB = 1 << 20
SUCCESS, INVALID_VALUE, OUT_OF_MEMORY, INVALID_DEVICE, INVALID_HANDLE, NOT_SUPPORTED = 0, 1, 2, 101, 400, 801
READ, READWRITE = 1, 3
# The calls of this family, and those that take a pool: none of them may reach the driver for a refused request.
POOL_CALLS = ("cuMemPoolCreate", "cuMemPoolDestroy", "cuMemPoolSetAccess", "cuMemPoolGetAccess",
              "cuMemGetDefaultMemPool", "cuMemGetMemPool", "cuMemSetMemPool", "cuMemGetAccess",
              "cuMemRetainAllocationHandle", "cuMemGetAllocationPropertiesFromHandle", "cuMemAllocFromPoolAsync",
              "cuMemPoolGetAttribute", "cuMemPoolTrimTo", "cuMemAllocPitch", "cuMemRelease")

PRELUDE = r"""
import ctypes, json, sys
from ctypes import POINTER, Structure, byref, c_int, c_size_t, c_ubyte, c_uint, c_uint64, c_ushort, c_void_p
lib = ctypes.CDLL(sys.argv[1])
P = c_void_p
MIB = 1 << 20

class Location(Structure):
    _fields_ = [("type", c_int), ("id", c_int)]

class AllocFlags(Structure):
    _fields_ = [("compressionType", c_ubyte), ("gpuDirectRDMACapable", c_ubyte), ("usage", c_ushort),
                ("reserved", c_ubyte * 4)]

class Prop(Structure):  # CUmemAllocationProp, as cuda.h lays it out
    _fields_ = [("type", c_int), ("requestedHandleTypes", c_int), ("location", Location),
                ("win32HandleMetaData", c_void_p), ("allocFlags", AllocFlags)]

class Access(Structure):  # CUmemAccessDesc
    _fields_ = [("location", Location), ("flags", c_int)]

class PoolProps(Structure):  # CUmemPoolProps (88 bytes)
    _fields_ = [("allocType", c_int), ("handleTypes", c_int), ("location", Location),
                ("win32SecurityAttributes", c_void_p), ("maxSize", c_size_t), ("usage", c_ushort),
                ("gpuDirectRDMACapable", c_ubyte), ("reserved", c_ubyte * 53)]
assert ctypes.sizeof(PoolProps) == 88

U64 = POINTER(c_uint64)
for name, args in {
    "cuInit": [c_uint], "cuCtxCreate": [U64, P, c_uint, c_int], "cuStreamCreate": [U64, c_uint],
    "cuStreamSynchronize": [c_uint64], "cuMemAlloc": [U64, c_size_t], "cuMemFree": [c_uint64],
    "cuMemcpy": [c_uint64, c_uint64, c_size_t], "cuMemcpyHtoD": [c_uint64, P, c_size_t],
    "cuMemcpyDtoH": [P, c_uint64, c_size_t], "cuMemcpyHtoDAsync": [c_uint64, P, c_size_t, c_uint64],
    "cuMemcpyDtoHAsync": [P, c_uint64, c_size_t, c_uint64], "cuMemsetD8": [c_uint64, c_ubyte, c_size_t],
    "cuPointerGetAttribute": [P, c_int, c_uint64], "cuDeviceGetDefaultMemPool": [U64, c_int],
    "cuDeviceGetMemPool": [U64, c_int], "cuMemAllocAsync": [U64, c_size_t, c_uint64],
    "cuMemAllocFromPoolAsync": [U64, c_size_t, c_uint64, c_uint64], "cuMemFreeAsync": [c_uint64, c_uint64],
    "cuMemPoolGetAttribute": [c_uint64, c_int, P], "cuMemPoolTrimTo": [c_uint64, c_size_t],
    "cuMemPoolCreate": [U64, P], "cuMemPoolDestroy": [c_uint64], "cuMemPoolSetAccess": [c_uint64, P, c_size_t],
    "cuMemPoolGetAccess": [POINTER(c_int), c_uint64, P], "cuMemGetDefaultMemPool": [U64, P, c_int],
    "cuMemGetMemPool": [U64, P, c_int], "cuMemSetMemPool": [P, c_int, c_uint64],
    "cuMemGetAccess": [U64, P, c_uint64], "cuMemRetainAllocationHandle": [U64, P],
    "cuMemGetAllocationPropertiesFromHandle": [P, c_uint64], "cuMemAllocPitch": [U64, U64, c_size_t, c_size_t, c_uint],
    "cuMemAddressReserve": [U64, c_size_t, c_size_t, c_uint64, c_uint64], "cuMemAddressFree": [c_uint64, c_size_t],
    "cuMemCreate": [U64, c_size_t, P, c_uint64], "cuMemRelease": [c_uint64],
    "cuMemMap": [c_uint64, c_size_t, c_size_t, c_uint64, c_uint64], "cuMemUnmap": [c_uint64, c_size_t],
    "cuMemSetAccess": [c_uint64, c_size_t, P, c_size_t],
}.items():
    getattr(lib, name).argtypes = args
out = {}
def pattern(size, seed): return bytes((i * 7 + seed) & 0xFF for i in range(size))
def setup(device=0):
    ctx = c_uint64()
    assert lib.cuInit(0) == 0 and lib.cuCtxCreate(byref(ctx), None, 0, device) == 0
def stream():
    s = c_uint64()
    assert lib.cuStreamCreate(byref(s), 1) == 0  # CU_STREAM_NON_BLOCKING
    return s.value
def loc(device=0, kind=1):
    where = Location()
    where.type, where.id = kind, device
    return where
def access(device=0, flags=3, kind=1):
    a = Access()
    a.location, a.flags = loc(device, kind), flags
    return a
def pool_create(device=0, kind=1, location_type=1, handle_types=0, max_size=0, reserved=0):
    props = PoolProps()
    props.allocType, props.handleTypes, props.maxSize = kind, handle_types, max_size
    props.location = loc(device, location_type)
    props.reserved[7] = reserved
    pool = c_uint64()
    status = lib.cuMemPoolCreate(byref(pool), byref(props))
    return status, pool.value
def get_access(pool, device=0):
    flags = c_int(-1)
    status = lib.cuMemPoolGetAccess(byref(flags), pool, byref(loc(device)))
    return [status, flags.value]
def by_location(name, device=0, kind=1, location_type=1):
    pool = c_uint64()
    status = getattr(lib, name)(byref(pool), byref(loc(device, location_type)), kind)
    return [status, pool.value]
def device_pool(name, device=0):
    pool = c_uint64()
    assert getattr(lib, name)(byref(pool), device) == 0
    return pool.value
def alloc_from(pool, size, s):
    pointer = c_uint64()
    status = lib.cuMemAllocFromPoolAsync(byref(pointer), size, pool, s)
    return status, pointer.value
def attribute(pool, which, wide=True):
    value = c_uint64(0) if wide else c_int(-1)
    status = lib.cuMemPoolGetAttribute(pool, which, byref(value))
    return [status, value.value]
def pointer_attribute(pointer, which, wide=True):
    value = c_uint64(0) if wide else c_int(-1)
    status = lib.cuPointerGetAttribute(byref(value), which, pointer)
    return [status, value.value]
def mem_access(pointer, device=0):
    flags = c_uint64(99)
    status = lib.cuMemGetAccess(byref(flags), byref(loc(device)), pointer)
    return [status, flags.value]
def retain(address):
    handle = c_uint64()
    status = lib.cuMemRetainAllocationHandle(byref(handle), c_void_p(address))
    return [status, handle.value]
def properties(handle):
    p = Prop()
    p.win32HandleMetaData = 12345
    status = lib.cuMemGetAllocationPropertiesFromHandle(byref(p), handle)
    return [status, p.type, p.requestedHandleTypes, p.location.type, p.location.id, p.win32HandleMetaData or 0]
def pitched(width, rows, element=4):
    pointer, pitch = c_uint64(), c_uint64()
    status = lib.cuMemAllocPitch(byref(pointer), byref(pitch), width, rows, element)
    return status, pointer.value, pitch.value
def alloc(size):
    pointer = c_uint64()
    status = lib.cuMemAlloc(byref(pointer), size)
    return status, pointer.value
def reserve(size):
    base = c_uint64()
    assert lib.cuMemAddressReserve(byref(base), size, 0, 0, 0) == 0
    return base.value
def create(size, device=0):
    prop = Prop()
    prop.type, prop.location = 1, loc(device)
    handle = c_uint64()
    status = lib.cuMemCreate(byref(handle), size, byref(prop), 0)
    return status, handle.value
def read(pointer, size):
    target = ctypes.create_string_buffer(size)
    status = lib.cuMemcpyDtoH(target, pointer, size)
    return status, target.raw
"""

SCENARIOS = {
    # A pool of the program's own: its access, a stream-ordered allocation used and freed, its attributes; pools by
    # location; destroyed; a pool with a maximum size; a pool on the other device.
    "pools": r"""
setup()
s = stream()
out["create"], pool = pool_create(0)
out["pool"] = pool
out["set_access"] = lib.cuMemPoolSetAccess(pool, (Access * 2)(access(0), access(1)), 2)
out["get_access"] = [get_access(pool, 0), get_access(pool, 1)]
out["set_own_read"] = lib.cuMemPoolSetAccess(pool, (Access * 1)(access(0, flags=1)), 1)  # the driver refuses it
size = 300000
out["alloc"], pointer = alloc_from(pool, size, s)
data = pattern(size, 3)
source, target = ctypes.create_string_buffer(data, size), ctypes.create_string_buffer(size)
out["htod"] = lib.cuMemcpyHtoDAsync(pointer, source, size, s)
out["dtoh"] = lib.cuMemcpyDtoHAsync(target, pointer, size, s)
out["sync"] = lib.cuStreamSynchronize(s)
out["same"] = target.raw == data
out["memset"] = lib.cuMemsetD8(pointer + 10, 0x5A, 6)
words = ctypes.create_string_buffer(b"unified!", 8)
out["uva_in"] = lib.cuMemcpy(pointer + 100, ctypes.addressof(words), 8)   # unified addressing: pool memory is device
status, head = read(pointer, 120)
out["read"] = [status, head[8:18].hex(), head[100:108].decode()]
out["used"] = attribute(pool, 7)
out["location"] = [attribute(pool, 12, wide=False), attribute(pool, 11, wide=False)]  # the guest's ordinal
out["mempool_handle"] = pointer_attribute(pointer, 17)
out["free"] = lib.cuMemFreeAsync(pointer, s)
out["sync_free"] = lib.cuStreamSynchronize(s)
out["used_after"] = attribute(pool, 7)
out["trim"] = lib.cuMemPoolTrimTo(pool, 0)
default = device_pool("cuDeviceGetDefaultMemPool", 0)
out["default"] = by_location("cuMemGetDefaultMemPool") == [0, default]
out["current"] = by_location("cuMemGetMemPool") == [0, default]
out["set_current"] = lib.cuMemSetMemPool(byref(loc(0)), 1, pool)
out["current_now"] = [by_location("cuMemGetMemPool") == [0, pool], device_pool("cuDeviceGetMemPool", 0) == pool]
status, from_current = alloc(0)
p2 = c_uint64()
out["alloc_async"] = lib.cuMemAllocAsync(byref(p2), 4096, s)
out["async_pool"] = pointer_attribute(p2.value, 17) == [0, pool]
out["free_async"] = lib.cuMemFreeAsync(p2.value, s)
out["set_default"] = lib.cuMemSetMemPool(byref(loc(0)), 1, default)
out["destroy"] = lib.cuMemPoolDestroy(pool)
out["destroy_again"] = lib.cuMemPoolDestroy(pool)         # no longer the session's: refused before the driver
out["destroy_default"] = lib.cuMemPoolDestroy(default)    # the driver's own refusal
out["small"], small = pool_create(0, max_size=MIB)
out["small_over"] = alloc_from(small, 2 * MIB, s)[0]
out["small_fits"], inside = alloc_from(small, MIB // 2, s)
out["small_destroy_in_use"] = lib.cuMemPoolDestroy(small)   # its allocation stays valid until freed
out["small_still_there"] = lib.cuMemsetD8(inside, 1, 16)
out["small_free"] = lib.cuMemFreeAsync(inside, s)
out["other"], other = pool_create(1)
out["other_alloc"], on_other = alloc_from(other, 4096, s)
out["other_ordinal"] = pointer_attribute(on_other, 9, wide=False)
out["other_location"] = attribute(other, 11, wide=False)
out["other_free"] = lib.cuMemFreeAsync(on_other, s)
out["other_destroy"] = lib.cuMemPoolDestroy(other)
out["end_sync"] = lib.cuStreamSynchronize(s)
""",
    # The owner of a pool: it waits while another session tries its pool, then uses it still.
    "owner": r"""
setup()
s = stream()
status, pool = pool_create(0)
assert status == 0
print("POOL", pool, flush=True)
sys.stdin.readline()
out["alloc"], pointer = alloc_from(pool, 4096, s)
out["memset"] = lib.cuMemsetD8(pointer, 0x42, 4096)
out["read"] = read(pointer, 4)[1].hex()
out["free"] = lib.cuMemFreeAsync(pointer, s)
out["sync"] = lib.cuStreamSynchronize(s)
out["destroy"] = lib.cuMemPoolDestroy(pool)
""",
    # What a hostile or mistaken guest may send: each refused with the driver's documented error, none reaching it.
    "hostile": r"""
setup()
s = stream()
foreign = int(sys.argv[3])
out["destroy_foreign"] = lib.cuMemPoolDestroy(foreign)
out["set_access_foreign"] = lib.cuMemPoolSetAccess(foreign, (Access * 1)(access(0)), 1)
out["get_access_foreign"] = get_access(foreign)[0]
out["set_current_foreign"] = lib.cuMemSetMemPool(byref(loc(0)), 1, foreign)
out["alloc_foreign"] = alloc_from(foreign, 4096, s)[0]
out["attribute_foreign"] = attribute(foreign, 7)[0]
out["trim_foreign"] = lib.cuMemPoolTrimTo(foreign, 0)
out["destroy_made_up"] = lib.cuMemPoolDestroy(0xDEAD000)
out["get_access_made_up"] = get_access(0xDEAD000)[0]
out["create_other_device"] = pool_create(5)[0]
out["create_negative_device"] = pool_create(-1)[0]
out["create_host"] = pool_create(0, location_type=2)[0]
out["create_host_numa"] = pool_create(0, location_type=3)[0]
out["create_locality_domain"] = pool_create(0, location_type=6)[0]
out["create_invalid_location"] = pool_create(0, location_type=0)[0]
out["create_managed"] = pool_create(0, kind=2)[0]
out["create_not_pinned"] = pool_create(0, kind=0)[0]
out["create_shareable"] = pool_create(0, handle_types=1)[0]
out["create_fabric"] = pool_create(0, handle_types=8)[0]
out["create_reserved"] = pool_create(0, reserved=1)[0]
out["create_null"] = lib.cuMemPoolCreate(None, byref(PoolProps()))
out["create_null_props"] = lib.cuMemPoolCreate(byref(c_uint64()), None)
out["default_other_device"] = by_location("cuMemGetDefaultMemPool", device=7)[0]
out["current_other_device"] = by_location("cuMemGetMemPool", device=7)[0]
out["default_host"] = by_location("cuMemGetDefaultMemPool", location_type=2)[0]
out["default_managed"] = by_location("cuMemGetDefaultMemPool", kind=2)[0]
out["current_managed"] = by_location("cuMemGetMemPool", kind=2)[0]
out["default_not_pinned"] = by_location("cuMemGetDefaultMemPool", kind=0)[0]
default = device_pool("cuDeviceGetDefaultMemPool", 0)
out["set_current_other_device"] = lib.cuMemSetMemPool(byref(loc(9)), 1, default)
out["set_access_other_device"] = lib.cuMemPoolSetAccess(default, (Access * 1)(access(9)), 1)
out["set_access_host"] = lib.cuMemPoolSetAccess(default, (Access * 1)(access(0, kind=2)), 1)
out["set_access_bad_flags"] = lib.cuMemPoolSetAccess(default, (Access * 1)(access(1, flags=2)), 1)
out["set_access_null"] = lib.cuMemPoolSetAccess(default, None, 1)
out["get_access_null"] = lib.cuMemPoolGetAccess(None, default, byref(loc(0)))
status, plain = alloc(4096)
out["mem_access_unowned"] = mem_access(0x7F00DEAD0000)[0]
out["mem_access_other_device"] = mem_access(plain, device=9)[0]
out["mem_access_null"] = lib.cuMemGetAccess(None, byref(loc(0)), plain)
out["retain_plain"] = retain(plain)[0]
base = reserve(4 * MIB)
out["retain_unmapped"] = retain(base)[0]
out["retain_null"] = lib.cuMemRetainAllocationHandle(None, c_void_p(base))
out["properties_made_up"] = properties(0xDEAD000)[0]
out["properties_null"] = lib.cuMemGetAllocationPropertiesFromHandle(None, 0xDEAD000)
out["pitch_null"] = lib.cuMemAllocPitch(None, byref(c_uint64()), 16, 16, 4)
""",
    # The virtual-memory queries: a mapped range's access per device, its allocation's properties, a handle retained
    # from an address (the guest's own) and released once more, also after its handle was released while mapped.
    "vmm": r"""
setup()
G = 2 * MIB
base = reserve(4 * G)
out["create"], handle = create(G, device=1)
out["handle"] = handle
out["map"] = lib.cuMemMap(base, G, 0, handle, 0)
out["set_access"] = lib.cuMemSetAccess(base, G, (Access * 2)(access(0, flags=3), access(1, flags=1)), 2)
out["access"] = [mem_access(base, 0), mem_access(base + 100, 1), mem_access(base + G, 0)]
out["properties"] = properties(handle)
out["retain"] = retain(base + 4096)
data = pattern(8192, 9)
out["htod"] = lib.cuMemcpyHtoD(base, data, 8192)
out["release_retained"] = lib.cuMemRelease(handle)
out["properties_after_one"] = properties(handle)[0]
out["release_created"] = lib.cuMemRelease(handle)
out["properties_released"] = properties(handle)[0]   # released: no longer the session's, though still mapped
status, back = read(base, 8192)
out["still_mapped"] = [status, back == data]
out["retain_again"] = retain(base)                    # the session holds it again
out["properties_again"] = properties(handle)[0]
out["release_again"] = lib.cuMemRelease(handle)
out["release_extra"] = lib.cuMemRelease(handle)
out["unmap"] = lib.cuMemUnmap(base, G)
out["retain_unmapped"] = retain(base)[0]
out["free"] = lib.cuMemAddressFree(base, 4 * G)
""",
    # A 16 MiB vGPU: a retained handle's memory stays counted until every reference is released and it is unmapped.
    "vmm_quota": r"""
setup()
base = reserve(16 * MIB)
out["create"], handle = create(8 * MIB)
out["map"] = lib.cuMemMap(base, 8 * MIB, 0, handle, 0)
out["retain"] = retain(base)[0]
out["release_retained"] = lib.cuMemRelease(handle)
out["release_created"] = lib.cuMemRelease(handle)
out["still_counted"] = create(10 * MIB)[0]
out["unmap"] = lib.cuMemUnmap(base, 8 * MIB)
out["after_unmap"], other = create(10 * MIB)
out["release_other"] = lib.cuMemRelease(other)
out["free"] = lib.cuMemAddressFree(base, 16 * MIB)
""",
    # A pitched allocation is pitch x rows of the session's memory, counted against a 16 MiB vGPU.
    "pitch": r"""
setup()
out["alloc"], pointer, pitch = pitched(1000, 10)
out["pitch"] = pitch
row = pattern(1000, 5)
out["htod_last_row"] = lib.cuMemcpyHtoD(pointer + 9 * pitch, row, 1000)
out["dtoh_last_row"] = read(pointer + 9 * pitch, 1000) == (0, row)
source, target = ctypes.create_string_buffer(row, 1000), ctypes.create_string_buffer(1000)
out["uva_in"] = lib.cuMemcpy(pointer + 5 * pitch, ctypes.addressof(source), 1000)   # device memory to the guest too
out["uva_out"] = lib.cuMemcpy(ctypes.addressof(target), pointer + 5 * pitch, 1000)
out["uva_same"] = target.raw == row
out["read_last_bytes"] = read(pointer + 10 * pitch - 16, 16)[0]
out["read_past_end"] = read(pointer + 10 * pitch, 16)[0]
out["range_size"] = pointer_attribute(pointer, 12)
out["free"] = lib.cuMemFree(pointer)
out["bad_element"] = pitched(1000, 10, element=3)[0]
out["over_before"] = pitched(8 * MIB, 3)[0]            # width x rows already past the quota: never sent
out["over_after"] = pitched(513, 16385)[0]             # the driver's pitch takes it past: undone
out["exactly"], full, full_pitch = pitched(513, 16384)
out["full_pitch"] = full_pitch
out["alloc_over"] = alloc(MIB)[0]
out["free_full"] = lib.cuMemFree(full)
out["alloc_after"] = alloc(MIB)[0]
""",
    # Two 16 MiB vGPUs on two GPUs: a pool on the other device counts there, not on the current context's GPU.
    "cross_gpu": r"""
setup(0)
s = stream()
status, pool = pool_create(1)
assert status == 0
out["from_pool"], on_pool = alloc_from(pool, 12 * MIB, s)
out["plain_here"] = alloc(12 * MIB)[0]
out["pool_over"] = alloc_from(pool, 8 * MIB, s)[0]
out["default_over"] = lib.cuMemAllocAsync(byref(c_uint64()), 8 * MIB, s)
out["ordinal"] = pointer_attribute(on_pool, 9, wide=False)
out["free"] = lib.cuMemFreeAsync(on_pool, s)
out["sync"] = lib.cuStreamSynchronize(s)
out["pool_again"] = alloc_from(pool, 8 * MIB, s)[0]
""",
}


def _script(scenario: str) -> str:
    return PRELUDE + SCENARIOS[scenario] + 'print("RESULT " + json.dumps(out), flush=True)\n'


def _result(stdout: str) -> dict[str, Any]:
    line = next(line for line in stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])  # type: ignore[no-any-return]


def _run(library: Path, rig: Rig, scenario: str, *extra: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", _script(scenario), str(library), scenario, *extra],
                          env=native_child_env(library, rig.path), capture_output=True, text=True, timeout=60,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return _result(done.stdout)


def _names(rig: Rig, name: str, since: int = 0) -> list[dict[str, Any]]:
    return rig.entries(since, name=name)


def _number(value: Any) -> int:
    return int(value[1]) if isinstance(value, list) else int(value or 0)


def test_a_pool_of_the_programs_own_moves_its_bytes_and_answers_as_the_driver(library: Path, rig: Rig) -> None:
    out = _run(library, rig, "pools")
    assert [out[k] for k in ("create", "set_access", "alloc", "htod", "dtoh", "sync", "memset", "uva_in")] == \
        [SUCCESS] * 8
    assert out["get_access"] == [[SUCCESS, READWRITE], [SUCCESS, READWRITE]]
    assert out["set_own_read"] == INVALID_DEVICE  # the driver's: a pool's own device keeps READWRITE
    assert out["same"]
    status, hexed, text = out["read"]
    assert status == SUCCESS and text == "unified!" and bytes.fromhex(hexed)[2:8] == b"\x5a" * 6
    assert out["used"] == [SUCCESS, 300000] and out["used_after"] == [SUCCESS, 0]
    assert out["location"] == [[SUCCESS, 1], [SUCCESS, 0]]  # CU_MEM_LOCATION_TYPE_DEVICE, the guest's ordinal 0
    assert out["mempool_handle"] == [SUCCESS, out["pool"]]
    assert [out["free"], out["sync_free"], out["trim"]] == [SUCCESS] * 3
    assert out["default"] and out["current"] and out["set_current"] == SUCCESS and out["current_now"] == [True, True]
    assert out["alloc_async"] == SUCCESS and out["async_pool"] and out["free_async"] == SUCCESS
    assert [out["set_default"], out["destroy"]] == [SUCCESS, SUCCESS]
    assert out["destroy_again"] == INVALID_VALUE and out["destroy_default"] == INVALID_VALUE
    assert [out["small"], out["small_over"], out["small_fits"]] == [SUCCESS, OUT_OF_MEMORY, SUCCESS]
    assert [out["small_destroy_in_use"], out["small_still_there"], out["small_free"]] == [SUCCESS] * 3
    assert [out["other"], out["other_alloc"], out["other_free"], out["other_destroy"], out["end_sync"]] == \
        [SUCCESS] * 5
    assert out["other_ordinal"] == [SUCCESS, 1] and out["other_location"] == [SUCCESS, 1]
    # every location the host built names the session's physical GPU of the guest's ordinal
    created = _names(rig, "cuMemPoolCreate")
    assert [("location=CUmemLocation(type=1, id=2)" in c["args"][0], c["args"][0].count("maxSize=1048576"))
            for c in created] == [(True, 0), (True, 1), (False, 0)]
    assert "location=CUmemLocation(type=1, id=0)" in created[2]["args"][0]
    granted = _names(rig, "cuMemPoolSetAccess")[0]
    assert granted["args"][1] == ["CUmemAccessDesc(location=CUmemLocation(type=1, id=2), flags=3)",
                                  "CUmemAccessDesc(location=CUmemLocation(type=1, id=0), flags=3)"]
    # the destroy of a pool no longer the session's never reached the driver; the default pool's did (it refused)
    destroyed = [_number(e["args"][0]) for e in _names(rig, "cuMemPoolDestroy")]
    assert destroyed.count(out["pool"]) == 1 and len(destroyed) == 4
    # the pool's allocation was made on its own GPU: the other pool's on physical 0
    allocated = _names(rig, "cuMemAllocFromPoolAsync")
    assert [_number(e["args"][1]) for e in allocated][0] == out["pool"]


def test_another_sessions_pool_and_made_up_handles_never_reach_the_driver(library: Path, rig: Rig) -> None:
    env = native_child_env(library, rig.path)
    with subprocess.Popen([sys.executable, "-c", _script("owner"), str(library), "owner"], env=env,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=REPO) as owner:
        assert owner.stdin is not None and owner.stdout is not None
        line = owner.stdout.readline()
        assert line.startswith("POOL "), owner.stderr and owner.stderr.read()
        foreign = int(line.split()[1])
        mark = rig.mark()
        out = _run(library, rig, "hostile", str(foreign))
        seen = rig.entries(mark)
        owner.stdin.write("\n")
        owner.stdin.flush()
        rest, errors = owner.communicate(timeout=60)
        assert owner.returncode == 0, errors[-3000:]
    refused_by_host = {
        "destroy_foreign": INVALID_VALUE, "set_access_foreign": INVALID_VALUE, "get_access_foreign": INVALID_VALUE,
        "set_current_foreign": INVALID_VALUE, "destroy_made_up": INVALID_VALUE, "get_access_made_up": INVALID_VALUE,
        # the pool calls forwarded before this family answer INVALID_HANDLE for a pool the session lacks
        "alloc_foreign": INVALID_HANDLE, "attribute_foreign": INVALID_HANDLE, "trim_foreign": INVALID_HANDLE,
        "create_other_device": INVALID_VALUE, "create_negative_device": INVALID_VALUE,
        "create_host": NOT_SUPPORTED, "create_host_numa": NOT_SUPPORTED, "create_locality_domain": NOT_SUPPORTED,
        "create_invalid_location": INVALID_VALUE, "create_managed": NOT_SUPPORTED, "create_not_pinned": INVALID_VALUE,
        "create_shareable": NOT_SUPPORTED, "create_fabric": NOT_SUPPORTED,
        "default_other_device": INVALID_DEVICE, "current_other_device": INVALID_VALUE,
        "default_host": NOT_SUPPORTED, "default_managed": NOT_SUPPORTED, "current_managed": NOT_SUPPORTED,
        "default_not_pinned": INVALID_VALUE, "set_current_other_device": INVALID_VALUE,
        "set_access_other_device": INVALID_VALUE, "set_access_host": NOT_SUPPORTED,
        "set_access_bad_flags": INVALID_VALUE, "mem_access_unowned": INVALID_VALUE,
        "mem_access_other_device": INVALID_DEVICE, "retain_plain": INVALID_VALUE, "retain_unmapped": INVALID_VALUE,
        "properties_made_up": INVALID_VALUE,
    }
    assert {k: out[k] for k in refused_by_host} == refused_by_host
    answered_in_guest = {"create_reserved": NOT_SUPPORTED, "create_null": INVALID_VALUE,
                         "create_null_props": INVALID_VALUE, "set_access_null": INVALID_VALUE,
                         "get_access_null": INVALID_VALUE, "mem_access_null": INVALID_VALUE,
                         "retain_null": INVALID_VALUE, "properties_null": INVALID_VALUE, "pitch_null": INVALID_VALUE}
    assert {k: out[k] for k in answered_in_guest} == answered_in_guest
    # the hostile session's requests never reached the driver (only its set-up did), and the owner's pool still works
    assert not [e["name"] for e in seen if e["name"] in POOL_CALLS]
    owner_out = _result(rest)
    assert [owner_out[k] for k in ("alloc", "memset", "free", "sync", "destroy")] == [SUCCESS] * 5
    assert owner_out["read"] == "42424242"


def test_vmm_queries_answer_the_guests_own_handle_and_ordinals(library: Path, rig: Rig) -> None:
    out = _run(library, rig, "vmm")
    assert [out["create"], out["map"], out["set_access"], out["htod"]] == [SUCCESS] * 4
    # per device as granted; an unmapped part of the reservation is the driver's to refuse (it is the session's)
    assert out["access"] == [[SUCCESS, READWRITE], [SUCCESS, READ], [INVALID_VALUE, 99]]
    # [status, type, handle types, location type, the guest's ordinal, win32HandleMetaData cleared]
    assert out["properties"] == [SUCCESS, 1, 0, 1, 1, 0]
    assert out["retain"] == [SUCCESS, out["handle"]]
    assert [out["release_retained"], out["properties_after_one"], out["release_created"]] == [SUCCESS] * 3
    assert out["properties_released"] == INVALID_VALUE and out["still_mapped"] == [SUCCESS, True]
    assert out["retain_again"] == [SUCCESS, out["handle"]] and out["properties_again"] == SUCCESS
    assert out["release_again"] == SUCCESS and out["release_extra"] == INVALID_VALUE
    assert [out["unmap"], out["retain_unmapped"], out["free"]] == [SUCCESS, INVALID_VALUE, SUCCESS]
    # the driver saw: the queries with the session's physical GPUs, two retains and three releases
    queried = [e["args"][0] for e in _names(rig, "cuMemGetAccess")]
    assert queried == ["CUmemLocation(type=1, id=2)", "CUmemLocation(type=1, id=0)", "CUmemLocation(type=1, id=2)"]
    assert len(_names(rig, "cuMemRetainAllocationHandle")) == 2 and len(_names(rig, "cuMemRelease")) == 3
    assert len(_names(rig, "cuMemGetAllocationPropertiesFromHandle")) == 3


def test_a_retained_handles_memory_counts_until_every_reference_is_released_and_unmapped(
        library: Path, start: Any) -> None:
    rig = start(ExecutorOptions(devices=GUEST_DEVICES, gmem_mib=16))
    out = _run(library, rig, "vmm_quota")
    assert [out["create"], out["map"], out["retain"], out["release_retained"], out["release_created"]] == \
        [SUCCESS] * 5
    assert out["still_counted"] == OUT_OF_MEMORY
    assert [out["unmap"], out["after_unmap"], out["release_other"], out["free"]] == [SUCCESS] * 4


def test_a_pitched_allocation_is_pitch_times_rows_of_the_sessions_memory(library: Path, start: Any) -> None:
    rig = start(ExecutorOptions(devices=GUEST_DEVICES, gmem_mib=16))
    out = _run(library, rig, "pitch")
    assert out["alloc"] == SUCCESS and out["pitch"] == 2 * PITCH_ALIGNMENT  # 1000 bytes rounded up
    assert out["htod_last_row"] == SUCCESS and out["dtoh_last_row"]
    assert [out["uva_in"], out["uva_out"]] == [SUCCESS, SUCCESS] and out["uva_same"]
    assert out["read_last_bytes"] == SUCCESS and out["read_past_end"] == INVALID_VALUE
    assert out["range_size"] == [SUCCESS, 10 * 1024] and out["free"] == SUCCESS
    assert out["bad_element"] == INVALID_VALUE  # the driver's
    assert out["over_before"] == OUT_OF_MEMORY and out["over_after"] == OUT_OF_MEMORY
    assert [out["exactly"], out["full_pitch"]] == [SUCCESS, 1024]
    assert out["alloc_over"] == OUT_OF_MEMORY and [out["free_full"], out["alloc_after"]] == [SUCCESS, SUCCESS]
    # the one past the quota before the driver never reached it; the one the pitch took past was freed again
    sizes = [e["args"][:2] for e in _names(rig, "cuMemAllocPitch")]
    assert sizes == [[1000, 10], [1000, 10], [513, 16385], [513, 16384]]
    over = _names(rig, "cuMemAllocPitch")[2]["result"][1]
    assert _number(over) in [_number(e["args"][0]) for e in _names(rig, "cuMemFree")]


def test_a_pools_allocations_count_on_the_pools_gpu(library: Path, start: Any) -> None:
    rig = start(ExecutorOptions(devices=GUEST_DEVICES, gmem_mib=16))
    out = _run(library, rig, "cross_gpu")
    assert [out["from_pool"], out["plain_here"]] == [SUCCESS, SUCCESS]  # 12 MiB on each GPU
    assert out["pool_over"] == OUT_OF_MEMORY and out["default_over"] == OUT_OF_MEMORY
    assert out["ordinal"] == [SUCCESS, 1]
    assert [out["free"], out["sync"], out["pool_again"]] == [SUCCESS] * 3
    allocated = _names(rig, "cuMemAllocFromPoolAsync")
    assert [e["args"][0] for e in allocated] == [12 * MIB, 8 * MIB]  # the refused one never reached the driver


def test_malformed_pool_and_query_records_are_wire_errors_and_the_session_goes_on(rig: Rig) -> None:
    """Raw records of each hand-written call of this family, a byte short, eight bytes long, or with more access
    descriptors counted than sent: Status.MALFORMED, never the driver, never a traceback; the session keeps serving."""
    g = rig.guest()
    g.setup(0)
    channel = g.channel
    valid = {
        "cuMemPoolCreate": (1, 0, 1, 0, 0, 0, 0), "cuMemPoolSetAccess": (5, [(1, 0, 3)]),
        "cuMemPoolGetAccess": (5, 1, 0), "cuMemGetDefaultMemPool": (1, 0, 1), "cuMemGetMemPool": (1, 0, 1),
        "cuMemSetMemPool": (1, 0, 1, 5), "cuMemGetAccess": (1, 0, 1 << 40), "cuMemRetainAllocationHandle": (1 << 40,),
        "cuMemGetAllocationPropertiesFromHandle": (5,),
    }
    mark = rig.mark()
    for name, values in valid.items():
        call = CALLS[name]
        payload = call.request.encode(*values)
        bad = [payload[:-1], payload + bytes(8)]
        if name == "cuMemPoolSetAccess":  # two descriptors counted, one sent
            bad.append(payload[:8] + struct.pack("<I", 2) + payload[12:])
        for raw in bad:
            reply = channel.call(call.opcode, raw)
            assert reply.status == Status.MALFORMED, (name, len(raw), reply.status)
    assert not [e for e in rig.entries(mark) if e["name"] in POOL_CALLS], "a malformed record reached the driver"
    assert channel.call(Op.ECHO, b"still here").payload == b"still here"
    assert g.call("cuDriverGetVersion")[0] == SUCCESS


def test_the_gpu_program_runs_through_the_native_driver_on_the_fake(library: Path, rig: Rig) -> None:
    """tests/gpu/programs/mem_pool_program.py, unmodified, as cuda-python runs it on the native driver: its results
    are the fake driver's (on a GPU they are compared with a native run instead)."""
    done = subprocess.run([sys.executable, str(PROGRAM)], env=native_child_env(library, rig.path),
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    out = _result(done.stdout)
    n = 1 << 20
    values = (np.arange(n, dtype=np.uint64) * 2654435761 % 1000003).astype(np.uint32)
    values[1000:1024] = 7
    row = (np.arange(250, dtype=np.uint32) + 1) * 11
    assert out == {
        "pools_supported": 1, "pool_access": [READWRITE, READWRITE], "pool_threshold": 8 * MIB,
        "pool_max_size": 64 * MIB, "pool_copy_ok": True,
        "pool_copy_sum": int(values.sum(dtype=np.uint64)), "pool_used": True, "pool_handle_ok": True,
        "pool_dtod": [int(v) for v in values[996:1012]] + list(range(100, 116)),
        "pool_used_after_free": 0, "pool_reserved_after_trim": 0,
        "default_pool_ok": True, "current_is_default": True, "current_is_pool": [True, True],
        "async_from_pool": True, "async_sum": 0xABCD * (MIB // 4), "current_is_default_again": True,
        "destroy_default": INVALID_VALUE,
        "pitch_ok": True, "pitch_last_row_ok": True, "pitch_rows_sum": sum(int((row + r).sum()) for r in range(8)),
        "vmm_access": READWRITE, "vmm_prop": [1, 0, 1, 0], "retained_same": True,
        "vmm_sum_after_release": int((np.arange(4096, dtype=np.uint64) * 3).sum()),
    }
