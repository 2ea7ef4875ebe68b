"""The native guest driver's virtual-memory calls (guest_runtime/native/vmm_calls.c and the generated ones) against a
real agent whose sessions run the executor over the fake driver (tests/forwarding_rig.py): JAX's allocator sequence
moves the program's bytes through a mapped range, and what a hostile or mistaken guest sends gets the CUDA error
the driver documents, refused by the host before it reaches the driver. CPU only.

The rig maps guest devices (0, 1) to the fake's physical devices (2, 0), so the journal shows every ordinal the
host translated.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from guest_runtime.native import gen_libcuda
from host_agent.session.executor import ExecutorOptions
from tests import forwarding_rig
from tests.fake_driver import VMM_GRANULARITY
from tests.forwarding_rig import GUEST_DEVICES, Rig, native_child_env

bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures

REPO = Path(gen_libcuda.__file__).resolve().parents[2]
MIB = 1 << 20
SUCCESS, INVALID_VALUE, OUT_OF_MEMORY, INVALID_DEVICE, NOT_SUPPORTED = 0, 1, 2, 101, 801


PRELUDE = r"""
import ctypes, hashlib, json, sys
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

for name, args in {
    "cuInit": [c_uint], "cuCtxCreate": [POINTER(c_uint64), P, c_uint, c_int],
    "cuMemAlloc": [POINTER(c_uint64), c_size_t], "cuMemFree": [c_uint64],
    "cuMemcpy": [c_uint64, c_uint64, c_size_t], "cuMemcpyDtoH": [P, c_uint64, c_size_t],
    "cuMemsetD8": [c_uint64, c_ubyte, c_size_t], "cuPointerGetAttribute": [P, c_int, c_uint64],
    "cuMemGetAllocationGranularity": [POINTER(c_size_t), P, c_int],
    "cuMemAddressReserve": [POINTER(c_uint64), c_size_t, c_size_t, c_uint64, c_uint64],
    "cuMemAddressFree": [c_uint64, c_size_t], "cuMemCreate": [POINTER(c_uint64), c_size_t, P, c_uint64],
    "cuMemRelease": [c_uint64], "cuMemMap": [c_uint64, c_size_t, c_size_t, c_uint64, c_uint64],
    "cuMemUnmap": [c_uint64, c_size_t], "cuMemSetAccess": [c_uint64, c_size_t, P, c_size_t],
}.items():
    getattr(lib, name).argtypes = args
out = {}
def sha(data): return hashlib.sha256(bytes(data)).hexdigest()
def pattern(size, seed): return bytes((i * 7 + seed) & 0xFF for i in range(size))
def setup(device=0):
    ctx = c_uint64()
    assert lib.cuInit(0) == 0 and lib.cuCtxCreate(byref(ctx), None, 0, device) == 0
def prop(device=0, kind=1, location_type=1, handle_types=0):
    p = Prop()
    p.type, p.requestedHandleTypes = kind, handle_types
    p.location.type, p.location.id = location_type, device
    return p
def access(device=0, flags=3, location_type=1):
    a = Access()
    a.location.type, a.location.id, a.flags = location_type, device, flags
    return a
def reserve(size, hint=0):
    base = c_uint64()
    status = lib.cuMemAddressReserve(byref(base), size, 0, hint, 0)
    return status, base.value
def create(size, p=None):
    handle = c_uint64()
    status = lib.cuMemCreate(byref(handle), size, byref(p or prop()), 0)
    return status, handle.value
def alloc(size):
    pointer = c_uint64()
    assert lib.cuMemAlloc(byref(pointer), size) == 0
    return pointer.value
"""

SCENARIOS = {
    # XLA's allocator: granularity, reserve, create, map, set access, use, unmap, release, free.
    "allocator": r"""
setup()
granularity = c_size_t()
out["minimum"] = [lib.cuMemGetAllocationGranularity(byref(granularity), byref(prop()), 0), granularity.value]
out["recommended"] = [lib.cuMemGetAllocationGranularity(byref(granularity), byref(prop()), 1), granularity.value]
out["reserve"], base = reserve(8 * MIB)
out["base"] = base
out["create"], handle = create(4 * MIB)
out["handle"] = handle
at = base + 2 * MIB
out["map"] = lib.cuMemMap(at, 4 * MIB, 0, handle, 0)
descs = (Access * 1)(access())
out["access"] = lib.cuMemSetAccess(at, 4 * MIB, descs, 1)
size = 100000
data = pattern(size, 5)
source = ctypes.create_string_buffer(data, size)
target = ctypes.create_string_buffer(size)
out["htod"] = lib.cuMemcpy(at + 4096, ctypes.addressof(source), size)       # unified addressing: to the device
out["dtoh"] = lib.cuMemcpy(ctypes.addressof(target), at + 4096, size)       # ... and back
out["same"] = target.raw == data
out["memset"] = lib.cuMemsetD8(at, 0xAB, 16)
small = ctypes.create_string_buffer(16)
out["memset_read"] = [lib.cuMemcpyDtoH(small, at, 16), small.raw.hex()]
memory_type = c_uint(0)
out["memory_type"] = [lib.cuPointerGetAttribute(byref(memory_type), 2, at + 8), memory_type.value]
out["unmap"] = lib.cuMemUnmap(at, 4 * MIB)
out["read_unmapped"] = lib.cuMemcpyDtoH(small, at, 16)       # still reserved: the driver's answer, no mapping
out["release"] = lib.cuMemRelease(handle)
out["free"] = lib.cuMemAddressFree(base, 8 * MIB)
out["free_again"] = lib.cuMemAddressFree(base, 8 * MIB)
out["release_again"] = lib.cuMemRelease(handle)
""",
    # What a hostile or mistaken guest may send: every one refused with the driver's documented error.
    "hostile": r"""
setup()
status, base = reserve(8 * MIB)
assert status == 0
status, handle = create(2 * MIB)
assert status == 0
plain = alloc(4 * MIB)  # cuMemAlloc memory: the session's, but no reservation
out["map_unknown_handle"] = lib.cuMemMap(base, 2 * MIB, 0, 0xDEAD000, 0)
out["map_outside"] = lib.cuMemMap(plain, 2 * MIB, 0, handle, 0)
out["map_past_end"] = lib.cuMemMap(base + 6 * MIB, 4 * MIB, 0, handle, 0)
out["map_elsewhere"] = lib.cuMemMap(0x100000000, 2 * MIB, 0, handle, 0)
out["unmap_plain"] = lib.cuMemUnmap(plain, 2 * MIB)
out["free_wrong_size"] = lib.cuMemAddressFree(base, 4 * MIB)
out["free_inside"] = lib.cuMemAddressFree(base + 2 * MIB, 6 * MIB)
out["free_plain"] = lib.cuMemAddressFree(plain, 4 * MIB)
out["free_never"] = lib.cuMemAddressFree(0x7F00DEAD0000, 2 * MIB)
out["release_unknown"] = lib.cuMemRelease(0xDEAD000)
out["create_other_device"] = create(2 * MIB, prop(device=5))[0]
out["create_negative_device"] = create(2 * MIB, prop(device=-1))[0]
out["granularity_other_device"] = lib.cuMemGetAllocationGranularity(byref(c_size_t()), byref(prop(device=5)), 0)
out["create_shareable"] = create(2 * MIB, prop(handle_types=1))[0]
out["create_host"] = create(2 * MIB, prop(location_type=2))[0]
granularity = c_size_t()  # NCCL's probe for host allocations: the granularity of HOST_NUMA, then a create
out["granularity_host_numa"] = [lib.cuMemGetAllocationGranularity(byref(granularity), byref(prop(location_type=3)), 0),
                                granularity.value]
out["create_host_numa"] = create(2 * MIB, prop(location_type=3))[0]
out["create_not_pinned"] = create(2 * MIB, prop(kind=0))[0]
out["create_null"] = lib.cuMemCreate(None, 2 * MIB, byref(prop()), 0)
out["create_null_prop"] = lib.cuMemCreate(byref(c_uint64()), 2 * MIB, None, 0)
out["granularity_null"] = lib.cuMemGetAllocationGranularity(None, byref(prop()), 0)
out["map"] = lib.cuMemMap(base, 2 * MIB, 0, handle, 0)
out["access_other_device"] = lib.cuMemSetAccess(base, 2 * MIB, (Access * 1)(access(device=7)), 1)
out["access_plain"] = lib.cuMemSetAccess(plain, 2 * MIB, (Access * 1)(access()), 1)
out["access_bad_flags"] = lib.cuMemSetAccess(base, 2 * MIB, (Access * 1)(access(flags=2)), 1)
out["access_null"] = lib.cuMemSetAccess(base, 2 * MIB, None, 1)
out["access_second_device"] = lib.cuMemSetAccess(base, 2 * MIB, (Access * 2)(access(0), access(1)), 2)
out["map_over_mapping"] = lib.cuMemMap(base, 2 * MIB, 0, handle, 0)
out["unmap"] = lib.cuMemUnmap(base, 2 * MIB)
out["release"] = lib.cuMemRelease(handle)
out["map_released"] = lib.cuMemMap(base, 2 * MIB, 0, handle, 0)
out["free"] = lib.cuMemAddressFree(base, 8 * MIB)
""",
    # A 16 MiB vGPU: physical memory counts from cuMemCreate until released and mapped nowhere.
    "quota": r"""
setup()
status, base = reserve(64 * MIB)       # address space is not counted
out["reserve"] = status
out["first"], first = create(8 * MIB)
out["too_much"] = create(10 * MIB)[0]
out["fits"], second = create(8 * MIB)
out["none_left"] = create(2 * MIB)[0]
out["release_second"] = lib.cuMemRelease(second)
out["map_first"] = lib.cuMemMap(base, 8 * MIB, 0, first, 0)
out["release_first_mapped"] = lib.cuMemRelease(first)
out["still_counted"] = create(10 * MIB)[0]   # the first is still mapped: the driver still holds it
out["unmap_first"] = lib.cuMemUnmap(base, 8 * MIB)
out["after_unmap"], third = create(16 * MIB)
out["plain_alloc_over"] = lib.cuMemAlloc(byref(c_uint64()), MIB)  # cuMemCreate's memory counts for cuMemAlloc too
out["other_vgpu"], fourth = create(16 * MIB, prop(device=1))  # counted on the GPU it names, not the current one
out["other_vgpu_full"] = create(2 * MIB, prop(device=1))[0]
out["release_fourth"] = lib.cuMemRelease(fourth)
out["release_third"] = lib.cuMemRelease(third)
out["free"] = lib.cuMemAddressFree(base, 64 * MIB)
""",
}


def _run(library: Path, rig: Rig, scenario: str) -> dict[str, Any]:
    env = native_child_env(library, rig.path)
    script = PRELUDE + SCENARIOS[scenario] + 'print("RESULT " + json.dumps(out))\n'
    done = subprocess.run([sys.executable, "-c", script, str(library), scenario],
                          env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])  # type: ignore[no-any-return]


def _names(rig: Rig, name: str) -> list[dict[str, Any]]:
    return rig.entries(name=name)


def test_jax_allocator_sequence_moves_the_programs_bytes(library: Path, rig: Rig) -> None:
    out = _run(library, rig, "allocator")
    assert out["minimum"] == out["recommended"] == [SUCCESS, VMM_GRANULARITY]
    assert [out[k] for k in ("reserve", "create", "map", "access", "htod", "dtoh")] == [SUCCESS] * 6
    assert out["same"], "the bytes read back through the mapping are not the ones written"
    assert out["memset"] == SUCCESS and out["memset_read"] == [SUCCESS, "ab" * 16]
    assert out["memory_type"] == [SUCCESS, 2]  # CU_MEMORYTYPE_DEVICE: the host owns VMM pointers as device memory
    assert out["unmap"] == SUCCESS and out["read_unmapped"] == INVALID_VALUE  # the driver's: nothing mapped there
    assert [out["release"], out["free"]] == [SUCCESS, SUCCESS]
    assert out["free_again"] == INVALID_VALUE and out["release_again"] == INVALID_VALUE
    # the guest's ordinal 0 became the session's physical GPU 2 in every struct the host built
    (created,) = _names(rig, "cuMemCreate")
    assert created["device"] == GUEST_DEVICES[0] and "location=CUmemLocation(type=1, id=2)" in created["args"][1]
    (granted,) = _names(rig, "cuMemSetAccess")
    assert "CUmemAccessDesc(location=CUmemLocation(type=1, id=2), flags=3)" in granted["args"][2][0]
    # unified addressing sent the copies as HtoD/DtoH into the mapped range: the fake saw the program's bytes
    start = out["base"] + 2 * MIB + 4096
    chunks = [e for e in _names(rig, "cuMemcpyHtoD") if start <= e.get("dst", 0) < start + 100000]
    assert [e["dst"] - start for e in chunks] == [sum(c["data"]["len"] for c in chunks[:i]) for i in range(len(chunks))]
    assert sum(c["data"]["len"] for c in chunks) == 100000  # staged in chunks, contiguous, all of it
    mapped = _names(rig, "cuMemMap")
    assert [e["args"][0] for e in mapped] == [out["base"] + 2 * MIB] and mapped[0]["args"][3] == out["handle"]


def test_hostile_virtual_memory_requests_get_the_drivers_errors(library: Path, rig: Rig) -> None:
    out = _run(library, rig, "hostile")
    refused_by_host = {
        "map_unknown_handle": INVALID_VALUE, "map_outside": INVALID_VALUE, "map_past_end": INVALID_VALUE,
        "map_elsewhere": INVALID_VALUE, "unmap_plain": INVALID_VALUE, "free_wrong_size": INVALID_VALUE,
        "free_inside": INVALID_VALUE, "free_plain": INVALID_VALUE, "free_never": INVALID_VALUE,
        "release_unknown": INVALID_VALUE, "create_other_device": INVALID_DEVICE,
        "create_negative_device": INVALID_DEVICE, "granularity_other_device": INVALID_VALUE,
        "create_host": NOT_SUPPORTED, "create_host_numa": NOT_SUPPORTED, "create_not_pinned": INVALID_VALUE,
        "access_other_device": INVALID_DEVICE, "access_plain": INVALID_VALUE, "access_bad_flags": INVALID_VALUE,
        "map_released": INVALID_VALUE,
    }
    assert {k: out[k] for k in refused_by_host} == refused_by_host
    assert [out["create_null"], out["create_null_prop"], out["granularity_null"], out["access_null"]] == \
        [INVALID_VALUE] * 4  # answered in the guest
    # the one good mapping, granted to both of the session's devices, then refused a second time by the driver
    assert [out["map"], out["access_second_device"]] == [SUCCESS, SUCCESS]
    assert out["map_over_mapping"] == INVALID_VALUE
    assert [out["unmap"], out["release"], out["free"]] == [SUCCESS] * 3
    # none of the refused requests reached the driver: it saw only the good calls (and the one the driver refused)
    assert len(_names(rig, "cuMemMap")) == 2
    assert len(_names(rig, "cuMemUnmap")) == 1 and len(_names(rig, "cuMemRelease")) == 1
    assert len(_names(rig, "cuMemAddressFree")) == 1
    # requested handle types reach the driver, which judges them (XLA asks for POSIX fds): only the good create and
    # the shareable one got there; nothing can be exported with it (the export calls are not forwarded)
    assert out["create_shareable"] == SUCCESS
    assert ["requestedHandleTypes=1" in repr(c) for c in _names(rig, "cuMemCreate")] == [False, True]
    # only a host location's granularity reaches the driver, which answers it (NCCL then meets NOT_SUPPORTED at the
    # create and falls back to its /dev/shm host memory, as in a container without NUMA support)
    assert out["granularity_host_numa"] == [SUCCESS, VMM_GRANULARITY]
    assert len(_names(rig, "cuMemGetAllocationGranularity")) == 1
    (granted,) = _names(rig, "cuMemSetAccess")
    assert granted["args"][2] == ["CUmemAccessDesc(location=CUmemLocation(type=1, id=2), flags=3)",
                                  "CUmemAccessDesc(location=CUmemLocation(type=1, id=0), flags=3)"]


def test_physical_memory_counts_against_the_vgpu_quota_until_released_and_unmapped(
        library: Path, start: Any) -> None:
    rig = start(ExecutorOptions(devices=GUEST_DEVICES, gmem_mib=16))
    out = _run(library, rig, "quota")
    assert [out["reserve"], out["first"], out["fits"]] == [SUCCESS] * 3
    assert out["too_much"] == OUT_OF_MEMORY and out["none_left"] == OUT_OF_MEMORY
    assert [out["release_second"], out["map_first"], out["release_first_mapped"]] == [SUCCESS] * 3
    assert out["still_counted"] == OUT_OF_MEMORY
    assert [out["unmap_first"], out["after_unmap"]] == [SUCCESS, SUCCESS]
    assert out["plain_alloc_over"] == OUT_OF_MEMORY
    assert out["other_vgpu"] == SUCCESS and out["other_vgpu_full"] == OUT_OF_MEMORY  # each vGPU its own quota
    assert [out["release_fourth"], out["release_third"], out["free"]] == [SUCCESS] * 3
    created = _names(rig, "cuMemCreate")
    assert [(e["args"][0], e["device"]) for e in created] == \
        [(8 * MIB, 2), (8 * MIB, 2), (16 * MIB, 2), (16 * MIB, 0)]  # the refused ones never reached the driver
