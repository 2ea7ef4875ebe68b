"""Page-locked memory the native guest driver never refuses, and cuMemHostRegister/cuMemHostUnregister answered in
the guest (guest_runtime/native/page_locked_calls.c, query_calls.c's cuPointerGetAttribute).

When this channel's slice of the region's pool cannot serve cuMemAllocHost/cuMemHostAlloc, the allocation comes
from ordinary guest pages (said once on stderr); registered ranges are only recorded, but for whole pages, which are
moved into the pool (the last test). Copies with any of them are pageable (their bytes travel), the GPU cannot reach
the unmoved ones (no device pointer), and their pointer attributes say host memory. Each test builds
`libcuda.so.1`, loads it with ctypes in a subprocess whose ORION_SHM names the rig's region (tests/forwarding_rig.py:
a real agent over the fake driver) and compares the values the program saw. CPU only.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from guest_runtime.native import gen_libcuda
from ivshmem.region import Region
from tests import forwarding_rig
from tests.forwarding_rig import Rig, native_child_env

bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures

REPO = Path(gen_libcuda.__file__).resolve().parents[2]
BIG = 16 << 20  # PyTorch's pin_memory() of 16 MiB: more than any channel's slice of the tests' 32 MiB region
FALLBACK_NOTICE = "served from ordinary guest memory"
DEVICE_POINTER_NOTICE = "the GPU cannot reach ordinary guest memory"
HOST_MEMORY_ALREADY_REGISTERED, HOST_MEMORY_NOT_REGISTERED = 712, 713
INVALID_VALUE, NOT_INITIALIZED, INVALID_CONTEXT, NOT_SUPPORTED = 1, 3, 201, 801

PRELUDE = r"""
import ctypes, hashlib, json, sys, threading
from ctypes import POINTER, byref, c_int, c_size_t, c_uint, c_uint64, c_void_p
lib = ctypes.CDLL(sys.argv[1])
P = c_void_p
for name, args in {
    "cuInit": [c_uint], "cuDeviceGet": [POINTER(c_int), c_int], "cuCtxCreate": [POINTER(c_uint64), P, c_uint, c_int],
    "cuMemAlloc": [POINTER(c_uint64), c_size_t], "cuMemFree": [c_uint64],
    "cuMemcpyHtoD": [c_uint64, P, c_size_t], "cuMemcpyDtoH": [P, c_uint64, c_size_t],
    "cuMemcpyHtoDAsync": [c_uint64, P, c_size_t, P], "cuMemcpyDtoHAsync": [P, c_uint64, c_size_t, P],
    "cuMemcpy": [c_uint64, c_uint64, c_size_t], "cuCtxSynchronize": [], "cuMemAllocHost": [P, c_size_t],
    "cuMemHostAlloc": [P, c_size_t, c_uint], "cuMemFreeHost": [P], "cuMemHostGetDevicePointer": [P, P, c_uint],
    "cuMemHostGetFlags": [P, P], "cuPointerGetAttribute": [P, c_int, c_uint64],
    "cuPointerGetAttributes": [c_uint, P, P, c_uint64], "cuMemHostRegister": [P, c_size_t, c_uint],
    "cuMemHostUnregister": [P], "cuCtxSetCurrent": [c_uint64],
}.items():
    getattr(lib, name).argtypes = args
BIG = int(sys.argv[3])
out = {}
def pattern(size, seed): return bytes((i * 7 + seed + i // 251) & 0xFF for i in range(size))
def setup():
    dev, ctx = c_int(-1), c_uint64()
    assert lib.cuInit(0) == 0 and lib.cuDeviceGet(byref(dev), 0) == 0
    assert lib.cuCtxCreate(byref(ctx), None, 0, dev) == 0
    return ctx.value
def alloc(size):
    pointer = c_uint64()
    assert lib.cuMemAlloc(byref(pointer), size) == 0
    return pointer.value
def host_alloc(size, flags=None):
    cell = c_void_p()
    status = lib.cuMemAllocHost(byref(cell), size) if flags is None else lib.cuMemHostAlloc(byref(cell), size, flags)
    return status, cell.value or 0
def mapping_of(address):
    # what /proc/self/maps says holds `address`: its path ("" anonymous), or None where nothing is mapped
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if low <= address < high:
                return fields[5].strip() if len(fields) > 5 else ""
    return None
def attribute(which, pointer, width=8):
    cell = ctypes.create_string_buffer(b"\xee" * 16, 16)
    status = lib.cuPointerGetAttribute(cell, which, pointer)
    value = int.from_bytes(cell.raw[:width], "little") if status == 0 else None
    return [status, value, cell.raw[width:] == b"\xee" * (16 - width)]
def flags_of(pointer):
    cell = c_uint(0x5A5A)
    return [lib.cuMemHostGetFlags(byref(cell), pointer), cell.value]
def device_pointer(pointer, flags=0):
    cell = c_uint64(0x5A5A)
    return [lib.cuMemHostGetDevicePointer(byref(cell), pointer, flags), cell.value]
def at(pointer, size): return ctypes.string_at(pointer, size)
"""

SCENARIOS = {
    # An allocation past the slice, and the pool still serving what fits; copies through fallback memory.
    "fallback": r"""
setup()
status, big = host_alloc(BIG)
out["alloc_host"], out["big"] = status, big
out["big_mapping"] = mapping_of(big)
out["zeroed"] = at(big, BIG) == bytes(BIG)
status, other = host_alloc(BIG + 100, 1)  # CU_MEMHOSTALLOC_PORTABLE, not a whole number of pages
out["host_alloc"], out["other"] = status, other
out["other_zeroed"] = at(other, BIG + 100) == bytes(BIG + 100)
status, small = host_alloc(8192)
out["small"], out["small_mapping"] = [status, small], mapping_of(small)  # what fits still comes from the pool
data = pattern(BIG, 9)
ctypes.memmove(big, data, BIG)
out["writable"] = at(big, BIG) == data
device = alloc(BIG + 4096)
out["device"] = device
plain = ctypes.create_string_buffer(BIG)
out["htod"] = lib.cuMemcpyHtoD(device, big, BIG)
out["dtoh_plain"] = lib.cuMemcpyDtoH(plain, device, BIG)
out["same_htod"] = plain.raw == data
out["dtoh"] = lib.cuMemcpyDtoH(other + 100, device, BIG)
out["same_dtoh"] = at(other + 100, BIG) == data and at(other, 100) == bytes(100)
backwards = data[::-1]
ctypes.memmove(other, backwards, BIG)
ctypes.memset(big, 0, BIG)
out["htod_async"] = lib.cuMemcpyHtoDAsync(device + 4096, other, BIG, None)
out["dtoh_async"] = lib.cuMemcpyDtoHAsync(big, device + 4096, BIG, None)
out["same_async_at_return"] = at(big, BIG) == backwards  # a staged async copy to the host is done when it returns
out["sync"] = lib.cuCtxSynchronize()
out["same_async"] = at(big, BIG) == backwards
ctypes.memset(plain, 0, 64)
out["uva_htod"] = lib.cuMemcpy(device, other + 1000, 64)
out["uva_dtoh"] = lib.cuMemcpy(big + 8, device, 64)
out["same_uva"] = at(big + 8, 64) == backwards[1000:1064] and at(big, 8) == backwards[:8]
out["free_inside"] = lib.cuMemFreeHost(big + 4096)
out["free"] = lib.cuMemFreeHost(big)
out["mapped_after_free"] = mapping_of(big)
out["free_again"] = lib.cuMemFreeHost(big)
out["free_other"] = lib.cuMemFreeHost(other)
out["free_small"] = lib.cuMemFreeHost(small)
status, third = host_alloc(BIG)  # the notice stays said
out["third"] = [status, lib.cuMemFreeHost(third)]
""",
    # Flags, device pointers and pointer attributes of fallback memory.
    "answers": r"""
out["context"] = setup()
status, mapped = host_alloc(BIG, 3)  # PORTABLE | DEVICEMAP
status2, plain = host_alloc(BIG)
out["alloc"] = [status, status2]
out["mapped"], out["plain"] = mapped, plain
status, pooled = host_alloc(4096, 2)
out["pooled"] = [status, mapping_of(pooled)]
out["pooled_pointer"] = pooled
out["pooled_device_pointer"] = attribute(3, pooled + 100)  # the host's to answer: it mapped the pool
out["flags"] = flags_of(mapped)
out["flags_inside"] = flags_of(mapped + BIG - 1)
out["flags_plain"] = flags_of(plain)
out["flags_pooled"] = flags_of(pooled)
out["flags_null"] = lib.cuMemHostGetFlags(None, mapped)
out["device_pointer"] = device_pointer(mapped)
out["device_pointer_again"] = device_pointer(plain + 4096)
out["device_pointer_flags"] = device_pointer(mapped, 1)
out["device_pointer_pooled"] = device_pointer(pooled)
inside = mapped + 12345
out["memory_type"] = attribute(2, inside, 4)
out["host_pointer"] = attribute(4, inside)
out["range_start"] = attribute(11, inside)
out["range_size"] = attribute(12, inside)
out["is_managed"] = attribute(8, inside, 4)
out["context_attribute"] = attribute(1, inside)
out["ordinal"] = attribute(9, inside, 4)
# the pool's allocation: what the guest knows of it answered in the guest (a relayed GPU host never maps the pool)
out["pooled_attributes"] = [attribute(1, pooled + 100), attribute(2, pooled + 100, 4), attribute(9, pooled, 4),
                            attribute(11, pooled + 100), attribute(12, pooled + 100), attribute(4, pooled + 100)]
others = {}
for which in (3, 5, 6, 7, 10, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 999):
    others[which] = attribute(which, inside)[0]
out["others"] = others
out["attribute_null"] = lib.cuPointerGetAttribute(None, 2, inside)
out["past_end"] = attribute(2, max(mapped, plain) + BIG, 4)[0]  # (the two may be neighbours)
out["before_start"] = attribute(2, min(mapped, plain) - 1, 4)[0]
# cuPointerGetAttributes (what the CUDA runtime's cudaPointerGetAttributes is made of): no device pointer reads 0
kinds = (c_int * 4)(2, 3, 4, 1)
cells = [c_uint(0x5A5A), c_uint64(0x5A5A), c_uint64(0x5A5A), c_uint64(0x5A5A)]
slots = (c_void_p * 4)(*[ctypes.addressof(c) for c in cells])
out["attributes"] = [lib.cuPointerGetAttributes(4, kinds, slots, inside), [c.value for c in cells]]
out["free"] = [lib.cuMemFreeHost(mapped), lib.cuMemFreeHost(plain), lib.cuMemFreeHost(pooled)]
out["memory_type_freed"] = attribute(2, inside, 4)[0]
out["flags_freed"] = flags_of(mapped)[0]
""",
    # cuMemHostRegister / cuMemHostUnregister: errors, answers, copies through a registered range.
    "register": r"""
SIZE = (1 << 20) + 123
holder = ctypes.create_string_buffer(SIZE + 3 * 4096)
base = ctypes.addressof(holder) + 4096 + 3  # not page-aligned: the driver takes any range
out["before_init"] = lib.cuMemHostRegister(base, SIZE, 0)
setup()
out["register"] = lib.cuMemHostRegister(base, SIZE, 0)
out["again"] = lib.cuMemHostRegister(base, SIZE, 0)
out["inside"] = lib.cuMemHostRegister(base + 4096, 16, 0)
out["over_start"] = lib.cuMemHostRegister(base - 10, 20, 0)
out["over_end"] = lib.cuMemHostRegister(base + SIZE - 1, 16, 0)
out["around"] = lib.cuMemHostRegister(base - 1, SIZE + 2, 0)
out["adjacent"] = [lib.cuMemHostRegister(base + SIZE, 16, 0), lib.cuMemHostUnregister(base + SIZE)]
out["adjacent_below"] = [lib.cuMemHostRegister(base - 16, 16, 0), lib.cuMemHostUnregister(base - 16)]
out["null"] = lib.cuMemHostRegister(None, SIZE, 0)
out["zero"] = lib.cuMemHostRegister(base - 4000, 0, 0)
out["bad_flags"] = lib.cuMemHostRegister(base - 4000, 16, 0x100)
out["flags"] = flags_of(base + 10)
out["device_pointer"] = device_pointer(base)
out["memory_type"] = attribute(2, base + 7, 4)
out["host_pointer"] = attribute(4, base + 7)
out["range"] = [attribute(11, base + SIZE - 1), attribute(12, base + SIZE - 1)]
out["device_pointer_attribute"] = attribute(3, base + 7)[0]
mapped_holder = ctypes.create_string_buffer(SIZE)
mapped = ctypes.addressof(mapped_holder)
out["register_mapped"] = lib.cuMemHostRegister(mapped, SIZE, 3)  # PORTABLE | DEVICEMAP
out["flags_mapped"] = flags_of(mapped)
out["device_pointer_mapped"] = device_pointer(mapped + 100)
data = pattern(SIZE, 21)
ctypes.memmove(base, data, SIZE)
device = alloc(2 * SIZE)
out["device"], out["base"], out["mapped"] = device, base, mapped
plain = ctypes.create_string_buffer(SIZE)
out["htod"] = lib.cuMemcpyHtoD(device, base, SIZE)
out["dtoh_plain"] = lib.cuMemcpyDtoH(plain, device, SIZE)
out["same_htod"] = plain.raw == data
out["dtoh"] = lib.cuMemcpyDtoH(mapped, device, SIZE)
out["same_dtoh"] = at(mapped, SIZE) == data
backwards = data[::-1]
ctypes.memmove(mapped, backwards, SIZE)
out["htod_async"] = lib.cuMemcpyHtoDAsync(device + SIZE, mapped, SIZE, None)
out["dtoh_async"] = lib.cuMemcpyDtoHAsync(base, device + SIZE, SIZE, None)
out["same_async_at_return"] = at(base, SIZE) == backwards
out["sync"] = lib.cuCtxSynchronize()
out["same_async"] = at(base, SIZE) == backwards
out["free_host"] = lib.cuMemFreeHost(base)  # not the driver's to free
out["intact"] = at(base, SIZE) == backwards
out["unregister_inside"] = lib.cuMemHostUnregister(base + 1)
out["unregister"] = lib.cuMemHostUnregister(base)
out["unregister_again"] = lib.cuMemHostUnregister(base)
out["unregister_unknown"] = lib.cuMemHostUnregister(ctypes.addressof(plain))
out["after"] = [at(base, SIZE) == backwards, attribute(2, base, 4)[0], flags_of(base)[0]]
out["register_again"] = [lib.cuMemHostRegister(base, SIZE, 1), flags_of(base), lib.cuMemHostUnregister(base)]
status, fallback = host_alloc(BIG)
out["fallback"] = [status, lib.cuMemHostRegister(fallback + 4096, 4096, 0), lib.cuMemHostUnregister(fallback),
                   lib.cuMemFreeHost(fallback)]
status, pooled = host_alloc(4096)
out["pooled"] = [status, lib.cuMemHostRegister(pooled, 4096, 0), lib.cuMemHostUnregister(pooled),
                 lib.cuMemFreeHost(pooled)]
seen = {}
def no_context():
    seen["register"] = lib.cuMemHostRegister(mapped, 16, 0)
    seen["unregister"] = lib.cuMemHostUnregister(mapped)
thread = threading.Thread(target=no_context)
thread.start()
thread.join()
out["no_context"] = seen
out["unregister_mapped"] = lib.cuMemHostUnregister(mapped)
""",
    # Whole pages registered: moved into the pool, so the GPU reaches the program's bytes; given back at unregister.
    "moved": r"""
import mmap, os, subprocess, tempfile, time
for name, args in {"cuStreamWriteValue32": [P, c_uint64, c_uint, c_uint], "cuStreamSynchronize": [P]}.items():
    getattr(lib, name).argtypes = args
setup()
PAGES = 3 * 4096
def address_of(view): return ctypes.addressof(ctypes.c_char.from_buffer(view))
def gpu_writes(pointer, offset, value):  # the GPU writes a word through the device pointer, in stream order
    status, device = device_pointer(pointer)
    if status != 0:
        return [status]
    return [lib.cuStreamWriteValue32(None, device + offset, value, 0), lib.cuStreamSynchronize(None),
            ctypes.c_uint32.from_address(pointer + offset).value == value]
private = mmap.mmap(-1, PAGES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
base = address_of(private)
out["private_before"] = mapping_of(base)
private[:] = pattern(PAGES, 5)
out["private_register"] = lib.cuMemHostRegister(base, PAGES, 1)
out["private_mapping"] = mapping_of(base)  # the region's pages now
out["private_kept"] = at(base, PAGES) == pattern(PAGES, 5)
out["private_gpu_write"] = gpu_writes(base, 4100, 0xABCDEF01)
out["private_flags"] = flags_of(base + 5)
device = alloc(PAGES)
out["private_copies"] = [lib.cuMemcpyHtoD(device, base, PAGES), lib.cuMemcpyDtoH(base + 8192, device, 4096),
                         at(base + 8192, 4096) == at(base, 4096)]
expected = at(base, PAGES)
out["private_unregister"] = lib.cuMemHostUnregister(base)
out["private_after"] = [at(base, PAGES) == expected, mapping_of(base), device_pointer(base)[0]]
private[0:4] = b"mine"  # still the program's, writable
out["private_writable"] = at(base, 4) == b"mine"

path = tempfile.mktemp(dir="/dev/shm", prefix="orion-moved-")
with open(path, "wb") as f:
    f.write(pattern(PAGES + 4, 9))  # as NCCL's segments: 4 bytes past whole pages (its reference count)
fd = os.open(path, os.O_RDWR)
shared = mmap.mmap(fd, PAGES + 4, mmap.MAP_SHARED)
base = address_of(shared)
out["shared_register"] = lib.cuMemHostRegister(base, PAGES + 4, 3)  # PORTABLE | DEVICEMAP, as NCCL asks
out["shared_moved"] = mapping_of(base) != path
out["shared_gpu_write"] = gpu_writes(base, 8, 0x12345678) + gpu_writes(base, PAGES, 0x0BADCAFE)  # and its tail
out["shared_unregister"] = lib.cuMemHostUnregister(base)
out["shared_in_file"] = [os.pread(fd, 4, 8) == (0x12345678).to_bytes(4, "little"),  # the bytes went back to the file
                         os.pread(fd, 4, PAGES) == (0x0BADCAFE).to_bytes(4, "little")]
out["shared_mapping_after"] = mapping_of(base) == path
shared[100:104] = b"file"
out["shared_is_the_file_again"] = os.pread(fd, 4, 100) == b"file"

other = subprocess.Popen([sys.executable, "-c", "import mmap, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
                          "m = mmap.mmap(fd, 4096); print('mapped', flush=True); time.sleep(60)", path],
                         stdout=subprocess.PIPE, text=True)
assert other.stdout.readline().strip() == "mapped"
out["another_mapper"] = [lib.cuMemHostRegister(base, PAGES, 0), mapping_of(base) == path, device_pointer(base)[0],
                         lib.cuMemHostUnregister(base)]
other.kill(); other.wait()
read_only = mmap.mmap(-1, PAGES)
out["read_only"] = [lib.cuMemHostRegister(address_of(read_only), PAGES, 8), device_pointer(address_of(read_only))[0],
                    lib.cuMemHostUnregister(address_of(read_only))]
part = mmap.mmap(-1, PAGES)
out["partial_pages"] = [lib.cuMemHostRegister(address_of(part) + 16, 4096, 0),
                        device_pointer(address_of(part) + 16)[0], lib.cuMemHostUnregister(address_of(part) + 16)]
# NCCL's pattern in one process: the creator maps and registers; its peer maps the same file, writes through the
# file (the reference count), registers; both see one set of bytes until the last registration ends.
shared.close(); os.close(fd); os.unlink(path)
path = tempfile.mktemp(dir="/dev/shm", prefix="orion-moved-")
with open(path, "wb") as f:
    f.write(bytes(PAGES + 4))
fd = os.open(path, os.O_RDWR)
creator = mmap.mmap(fd, PAGES + 4, mmap.MAP_SHARED)
peer = mmap.mmap(fd, PAGES + 4, mmap.MAP_SHARED)  # mapped before the creator registers: another mapping here
first = address_of(creator)
out["both_mapped_first"] = [lib.cuMemHostRegister(first, PAGES + 4, 3), device_pointer(first)[0],
                            lib.cuMemHostUnregister(first)]  # not alone: left where it is
peer.close()
out["creator_register"] = lib.cuMemHostRegister(first, PAGES + 4, 3)
creator[0:4] = b"made"  # the creator's write, into the pool pages
peer = mmap.mmap(fd, PAGES + 4, mmap.MAP_SHARED)
second = address_of(peer)
peer[PAGES:PAGES + 4] = b"peer"  # the peer's, through the file, before it registers
out["peer_register"] = lib.cuMemHostRegister(second, PAGES + 4, 3)
out["one_set_of_bytes"] = [creator[PAGES:PAGES + 4] == b"peer", peer[0:4] == b"made",
                           gpu_writes(second, 64, 0x5EED) + [creator[64:68] == (0x5EED).to_bytes(4, "little")]]
out["creator_unregister"] = lib.cuMemHostUnregister(first)
creator[200:204] = b"late"  # still one set of bytes while the peer's registration lasts
out["still_shared"] = peer[200:204] == b"late"
out["peer_unregister"] = lib.cuMemHostUnregister(second)
out["file_after"] = [os.pread(fd, 4, 0) == b"made", os.pread(fd, 4, PAGES) == b"peer", os.pread(fd, 4, 200) == b"late",
                     mapping_of(first) == path, mapping_of(second) == path, os.fstat(fd).st_size == PAGES + 4]
creator.close(); peer.close(); os.close(fd); os.unlink(path)
exit_path = tempfile.mktemp(dir="/dev/shm", prefix="orion-moved-")  # registered, never unregistered: at exit, the
with open(exit_path, "wb") as f:                                     # bytes go to the file (the child checks it)
    f.write(bytes(PAGES))
exit_fd = os.open(exit_path, os.O_RDWR)
left = mmap.mmap(exit_fd, PAGES, mmap.MAP_SHARED)
out["exit_path"] = exit_path
out["left_registered"] = [lib.cuMemHostRegister(address_of(left), PAGES, 0), mapping_of(address_of(left)) != exit_path]
left[0:4] = b"kept"
anonymous = mmap.mmap(-1, PAGES)  # shared and anonymous (what a fork would share): moved, and given back to itself
base = address_of(anonymous)
before = mapping_of(base)
out["anonymous"] = [lib.cuMemHostRegister(base, PAGES, 0), mapping_of(base) != before, gpu_writes(base, 0, 7),
                    lib.cuMemHostUnregister(base), mapping_of(base) == before,
                    anonymous[0:4] == (7).to_bytes(4, "little")]
""",
    # Many threads allocating, registering and freeing at once: one registry, never confused.
    "threads": r"""
ctx = setup()
ROUNDS, THREADS = 12, 6
failures = []
def work(seed):
    if lib.cuCtxSetCurrent(ctx) != 0:
        failures.append((seed, "set current"))
        return
    own = ctypes.create_string_buffer(8192)
    for round in range(ROUNDS):
        status, pointer = host_alloc(BIG // 4 + seed * 4096 + round, seed % 2 * 2)
        if status != 0:
            failures.append((seed, round, "alloc", status))
            continue
        ctypes.memset(pointer, seed, 64)
        checks = [flags_of(pointer + 10) == [0, seed % 2 * 2], attribute(11, pointer + 100)[1] == pointer,
                  attribute(12, pointer)[1] == BIG // 4 + seed * 4096 + round, at(pointer, 64) == bytes([seed]) * 64,
                  lib.cuMemHostRegister(own, 8192, 0) == 0,
                  attribute(11, ctypes.addressof(own) + 5)[1] == ctypes.addressof(own),
                  lib.cuMemHostUnregister(own) == 0, lib.cuMemFreeHost(pointer) == 0]
        if not all(checks):
            failures.append((seed, round, checks))
threads = [threading.Thread(target=work, args=(seed,)) for seed in range(1, THREADS + 1)]
for thread in threads: thread.start()
for thread in threads: thread.join()
out["failures"] = failures[:5]
out["left"] = attribute(2, 0x1000, 4)[0]
""",
}


def _run(library: Path, rig: Rig, scenario: str) -> tuple[dict[str, Any], str]:
    """The scenario's result and its stderr."""
    env = native_child_env(library, rig.path)
    script = PRELUDE + SCENARIOS[scenario] + 'print("RESULT " + json.dumps(out))\n'
    done = subprocess.run([sys.executable, "-c", script, str(library), scenario, str(BIG)],
                          env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), done.stderr


def _pattern(size: int, seed: int) -> bytes:
    return bytes((i * 7 + seed + i // 251) & 0xFF for i in range(size))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _slice_size(rig: Rig) -> int:
    region = Region.open(rig.path)
    try:
        return region.geometry.pool_slice(0)[1]
    finally:
        region.close()


def _moved(rig: Rig, since: int, prefix: str, key: str, base: int, data: bytes) -> int:
    """Where in the journal the copies after `since` whose names start with `prefix` (the executor may split one
    copy into chunks, in order, and stages an async one through the plain call) finished moving exactly `data` to
    or from `base`, as bytes (a pageable copy, not a pinned one naming a host address); -1 if they did not."""
    position = 0
    entries = rig.entries(0)
    for index in range(since, len(entries)):
        entry = entries[index]
        if not entry["name"].startswith(prefix) or int(entry.get(key) or -1) != base + position:
            continue
        moved = entry.get("data")
        if not moved or moved["sha256"] != _sha(data[position:position + moved["len"]]):
            return -1
        position += moved["len"]
        if position == len(data):
            return index + 1
    return -1


def _lines(stderr: str, text: str) -> list[str]:
    return [line for line in stderr.splitlines() if text in line]


def test_an_allocation_past_the_slice_comes_from_guest_memory_and_copies_through_it(library: Path, rig: Rig) -> None:
    assert _slice_size(rig) < BIG  # so the pool cannot serve it
    result, stderr = _run(library, rig, "fallback")
    big, other = result["big"], result["other"]
    assert result["alloc_host"] == 0 and result["host_alloc"] == 0 and big and other
    assert big % 4096 == 0 and other % 4096 == 0
    assert result["big_mapping"] == "" and result["zeroed"] and result["other_zeroed"]  # fresh anonymous pages
    status, small = result["small"]
    assert status == 0 and result["small_mapping"] == rig.path  # the pool still serves what fits
    assert result["writable"]
    # the values, both ways, sync and async; an async copy into fallback memory is complete when it returns
    assert result["htod"] == 0 and result["dtoh_plain"] == 0 and result["same_htod"]
    assert result["dtoh"] == 0 and result["same_dtoh"]
    assert result["htod_async"] == 0 and result["dtoh_async"] == 0 and result["same_async_at_return"]
    assert result["sync"] == 0 and result["same_async"]
    assert result["uva_htod"] == 0 and result["uva_dtoh"] == 0 and result["same_uva"]
    # the fake driver got the program's bytes (pageable copies), never a fallback address to read or write
    data, device = _pattern(BIG, 9), result["device"]
    after = _moved(rig, 0, "cuMemcpyHtoD", "dst", device, data)
    assert after > 0 and _moved(rig, after, "cuMemcpyHtoD", "dst", device + 4096, data[::-1]) > after
    host_ranges = [(big, BIG), (other, BIG + 100)]
    named = [int(a) for e in rig.entries(0) if e["name"].startswith("cuMemcpy") for a in e["args"][:2]
             if isinstance(a, int)]
    assert not [a for a in named for base, size in host_ranges if base <= a < base + size]
    # freed locally: unmapped, then unknown (the host's pool never held it)
    assert result["free_inside"] == INVALID_VALUE
    assert result["free"] == 0 and result["mapped_after_free"] is None and result["free_again"] == INVALID_VALUE
    assert result["free_other"] == 0 and result["free_small"] == 0 and result["third"] == [0, 0]
    # said once, in one line: what happened, that copies are staged and slower, what to do
    [notice] = _lines(stderr, FALLBACK_NOTICE)
    assert f"no room for {BIG} page-locked bytes" in notice and f"{_slice_size(rig) >> 20} MiB" in notice
    assert "staged and slower" in notice and "orion-shm create -s MiB" in notice and "fewer channels" in notice


def test_fallback_memory_answers_flags_no_device_pointer_and_host_attributes(library: Path, rig: Rig) -> None:
    result, stderr = _run(library, rig, "answers")
    mapped = result["mapped"]
    assert result["alloc"] == [0, 0] and result["pooled"] == [0, rig.path]
    assert result["flags"] == [0, 3] and result["flags_inside"] == [0, 3] and result["flags_plain"] == [0, 0]
    assert result["flags_pooled"] == [0, 2] and result["flags_null"] == INVALID_VALUE  # the pool's: forwarded
    assert result["device_pointer"] == [NOT_SUPPORTED, 0x5A5A] and result["device_pointer_again"] == [NOT_SUPPORTED,
                                                                                                      0x5A5A]
    assert result["device_pointer_flags"][0] == INVALID_VALUE
    assert result["device_pointer_pooled"][0] == 0  # the pool's pages are the GPU's to reach
    [notice] = _lines(stderr, DEVICE_POINTER_NOTICE)
    assert "cuMemHostGetDevicePointer" in notice and "801" in notice
    inside = mapped + 12345
    assert result["memory_type"] == [0, 1, True]  # CU_MEMORYTYPE_HOST, 4 bytes
    assert result["host_pointer"] == [0, inside, True]
    assert result["range_start"] == [0, mapped, True] and result["range_size"] == [0, BIG, True]
    assert result["is_managed"] == [0, 0, True]
    assert set(result["others"].values()) == {INVALID_VALUE}  # the device pointer among them (cuda.h's answer)
    context, pooled = result["context"], result["pooled_pointer"]
    assert result["context_attribute"] == [0, context, True] and result["ordinal"] == [0, 0, True]
    # the pool's allocation (4096 bytes at `pooled`): its context, type, device and range, without a round trip
    assert result["pooled_attributes"] == [[0, context, True], [0, 1, True], [0, 0, True], [0, pooled, True],
                                           [0, 4096, True], [0, pooled + 100, True]]
    asked = [e["args"] for e in rig.entries(0, "cuPointerGetAttribute")]
    # only the device pointer went out: locally the host's driver answered it; a relay answers it itself
    assert asked == ([] if rig.relayed else [[["CUpointer_attribute", 3], asked[0][1]]]), asked
    assert result["attribute_null"] == INVALID_VALUE
    assert result["past_end"] == INVALID_VALUE and result["before_start"] == INVALID_VALUE  # forwarded: unknown
    # cuPointerGetAttributes: host memory, no device pointer (0), the pointer itself, its context
    assert result["attributes"] == [0, [1, 0, inside, context]]
    assert result["free"] == [0, 0, 0]
    assert result["memory_type_freed"] == INVALID_VALUE and result["flags_freed"] == INVALID_VALUE


def test_register_and_unregister_are_answered_in_the_guest(library: Path, rig: Rig) -> None:
    result, stderr = _run(library, rig, "register")
    base, mapped, size = result["base"], result["mapped"], (1 << 20) + 123
    assert result["before_init"] == NOT_INITIALIZED
    assert result["register"] == 0
    for key in ("again", "inside", "over_start", "over_end", "around"):
        assert result[key] == HOST_MEMORY_ALREADY_REGISTERED, key
    assert result["adjacent"] == [0, 0] and result["adjacent_below"] == [0, 0]
    assert result["null"] == INVALID_VALUE and result["zero"] == INVALID_VALUE and result["bad_flags"] == INVALID_VALUE
    assert result["flags"] == [0, 0] and result["device_pointer"] == [NOT_SUPPORTED, 0x5A5A]
    assert result["memory_type"] == [0, 1, True] and result["host_pointer"] == [0, base + 7, True]
    assert result["range"] == [[0, base, True], [0, size, True]]
    assert result["device_pointer_attribute"] == INVALID_VALUE
    assert result["register_mapped"] == 0 and result["flags_mapped"] == [0, 3]
    assert result["device_pointer_mapped"] == [NOT_SUPPORTED, 0x5A5A]
    assert len(_lines(stderr, DEVICE_POINTER_NOTICE)) == 1
    # copies through registered memory: the values, and the bytes travelled (staged, as pageable memory)
    assert result["htod"] == 0 and result["dtoh_plain"] == 0 and result["same_htod"]
    assert result["dtoh"] == 0 and result["same_dtoh"]
    assert result["htod_async"] == 0 and result["dtoh_async"] == 0 and result["same_async_at_return"]
    assert result["sync"] == 0 and result["same_async"]
    data, device = _pattern(size, 21), result["device"]
    after = _moved(rig, 0, "cuMemcpyHtoD", "dst", device, data)
    assert after > 0 and _moved(rig, after, "cuMemcpyHtoD", "dst", device + size, data[::-1]) > after
    # the driver never saw the program's ranges (its one registration is the pool's slice, if any)
    assert not [e for e in rig.entries(0, "cuMemHostRegister") if int(e["args"][0] or 0) in (base, mapped)]
    assert result["free_host"] == INVALID_VALUE and result["intact"]
    assert result["unregister_inside"] == HOST_MEMORY_NOT_REGISTERED
    assert result["unregister"] == 0 and result["unregister_again"] == HOST_MEMORY_NOT_REGISTERED
    assert result["unregister_unknown"] == HOST_MEMORY_NOT_REGISTERED
    assert result["after"] == [True, INVALID_VALUE, INVALID_VALUE]  # forgotten, not freed
    assert result["register_again"] == [0, [0, 1], 0]
    # memory that is page-locked already cannot be registered, nor unregistered (the driver's INVALID_VALUE)
    assert result["fallback"] == [0, HOST_MEMORY_ALREADY_REGISTERED, INVALID_VALUE, 0]
    assert result["pooled"] == [0, HOST_MEMORY_ALREADY_REGISTERED, INVALID_VALUE, 0]
    assert result["no_context"] == {"register": INVALID_CONTEXT, "unregister": INVALID_CONTEXT}
    assert result["unregister_mapped"] == 0


def test_threads_share_one_registry(library: Path, rig: Rig) -> None:
    result, stderr = _run(library, rig, "threads")
    assert result["failures"] == []
    assert result["left"] == INVALID_VALUE
    assert len(_lines(stderr, FALLBACK_NOTICE)) == 1


@forwarding_rig.local_only("the GPU's write into page-locked memory is a stream memory operation, which a relayed "
                            "session answers CUDA_ERROR_NOT_SUPPORTED on the pool (docs/remote.md)")
def test_whole_pages_registered_are_moved_into_the_pool_and_given_back(library: Path, rig: Rig) -> None:
    """cuMemHostRegister of whole pages (NCCL page-locks its POSIX shared memory so, and hands the GPU the device
    pointer): the range's bytes move to pool pages mapped over it, so a GPU write through its device pointer is in
    the program's memory (the fake driver's stream write, served on the host); cuMemHostUnregister gives them back,
    a private range as private pages, a shared mapping (a file's, or anonymous) into its file, mapped again. NCCL's
    pattern in one process (a second mapping of the file, written through the file, then registered) shares the
    pool pages, the file's write merged in; one still registered at exit has its bytes written back. Not moved, as
    before (no device pointer: CUDA_ERROR_NOT_SUPPORTED): a file another process maps, or this one twice at the
    first registration, a READ_ONLY registration, partial pages."""
    out, _stderr = _run(library, rig, "moved")
    assert out["private_register"] == 0 and out["private_kept"], out
    assert out["private_mapping"] != "", out  # the region file's pages, not anonymous ones
    assert out["private_gpu_write"] == [0, 0, True], out
    assert out["private_flags"] == [0, 1] and out["private_copies"] == [0, 0, True], out
    assert out["private_unregister"] == 0 and out["private_after"][:2] == [True, out["private_before"]], out
    assert out["private_after"][2] != 0 and out["private_writable"], out  # no device pointer once given back
    assert out["shared_register"] == 0 and out["shared_moved"] and out["shared_gpu_write"] == [0, 0, True] * 2, out
    assert out["shared_unregister"] == 0 and out["shared_in_file"] == [True, True], out
    assert out["shared_mapping_after"] and out["shared_is_the_file_again"], out
    assert out["another_mapper"] == [0, True, NOT_SUPPORTED, 0], out
    assert out["anonymous"] == [0, True, [0, 0, True], 0, True, True], out
    assert out["both_mapped_first"] == [0, NOT_SUPPORTED, 0], out
    assert out["creator_register"] == 0 and out["peer_register"] == 0, out
    assert out["one_set_of_bytes"] == [True, True, [0, 0, True, True]], out
    assert out["creator_unregister"] == 0 and out["still_shared"] and out["peer_unregister"] == 0, out
    assert out["file_after"] == [True] * 6, out
    assert out["left_registered"] == [0, True], out
    with open(out["exit_path"], "rb") as f:  # the child exited with it still registered: its bytes reached the file
        kept = f.read(4)
    Path(out["exit_path"]).unlink()
    assert kept == b"kept"
    assert out["read_only"] == [0, NOT_SUPPORTED, 0] and out["partial_pages"] == [0, NOT_SUPPORTED, 0], out
