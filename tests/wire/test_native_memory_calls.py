"""The native guest driver's hand-written memory, context and query calls (guest_runtime/native/context_calls.c,
copy_calls.c, page_locked_calls.c, query_calls.c, error_texts.c and the guest state they keep).

Each test builds `libcuda.so.1`, loads it with ctypes in a subprocess whose ORION_SHM names the rig's region
(tests/forwarding_rig.py: a real agent whose sessions run the executor over the fake driver) and runs one scenario
of C-ABI calls; what the program saw is compared with what the fake driver held (its journal: the bytes a copy
moved, the pointer a page-locked copy named, the contexts allocations were made in). CPU only.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from guest_runtime.native import gen_libcuda
from ivshmem.channel import MAX_PAYLOAD
from ivshmem.driver_api import PINNED_COPY, POOL_MAP_OPCODE
from ivshmem.layout import DEFAULT_SLOT_SIZE, RECORD_HEADER_SIZE
from tests import forwarding_rig
from tests.fake_driver import ERROR_STRINGS, FakeDriver
from tests.forwarding_rig import GUEST_DEVICES, Rig, local_only, native_child_env

bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures

NATIVE = Path(gen_libcuda.__file__).resolve().parent
REPO = NATIVE.parents[1]
INLINE = DEFAULT_SLOT_SIZE - RECORD_HEADER_SIZE  # the largest payload one ring slot carries


PRELUDE = r"""
import ctypes, hashlib, json, sys, threading
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_void_p
lib = ctypes.CDLL(sys.argv[1])
P = c_void_p
for name, args in {
    "cuInit": [c_uint], "cuDeviceGet": [POINTER(c_int), c_int], "cuCtxCreate": [POINTER(c_uint64), P, c_uint, c_int],
    "cuCtxDestroy": [c_uint64], "cuCtxGetCurrent": [P], "cuCtxSetCurrent": [c_uint64], "cuCtxPushCurrent": [c_uint64],
    "cuCtxPopCurrent": [P], "cuMemAlloc": [POINTER(c_uint64), c_size_t], "cuMemFree": [c_uint64],
    "cuMemcpyHtoD": [c_uint64, P, c_size_t], "cuMemcpyDtoH": [P, c_uint64, c_size_t],
    "cuMemcpyHtoDAsync": [c_uint64, P, c_size_t, P], "cuMemcpyDtoHAsync": [P, c_uint64, c_size_t, P],
    "cuMemcpy": [c_uint64, c_uint64, c_size_t], "cuMemcpyAsync": [c_uint64, c_uint64, c_size_t, P],
    "cuCtxSynchronize": [], "cuDeviceGetName": [P, c_int, c_int], "cuDeviceGetUuid": [P, c_int],
    "cuGetErrorName": [c_int, P], "cuGetErrorString": [c_int, P], "cuMemAllocHost": [P, c_size_t],
    "cuMemHostAlloc": [P, c_size_t, c_uint], "cuMemFreeHost": [P], "cuMemHostGetDevicePointer": [P, P, c_uint],
    "cuMemHostGetFlags": [P, P], "cuPointerGetAttribute": [P, c_int, c_uint64],
    "cuDeviceGetMemPool": [POINTER(c_uint64), c_int], "cuMemPoolGetAttribute": [c_uint64, c_int, P],
    "cuMemPoolSetAttribute": [c_uint64, c_int, P],
}.items():
    getattr(lib, name).argtypes = args
out = {}
def sha(data): return hashlib.sha256(bytes(data)).hexdigest()
def pattern(size, seed): return bytes((i * 7 + seed) & 0xFF for i in range(size))
def setup():
    dev, ctx = c_int(-1), c_uint64()
    assert lib.cuInit(0) == 0 and lib.cuDeviceGet(byref(dev), 0) == 0
    assert lib.cuCtxCreate(byref(ctx), None, 0, dev) == 0
    return ctx.value
def alloc(size):
    pointer = c_uint64()
    assert lib.cuMemAlloc(byref(pointer), size) == 0
    return pointer.value
def current():
    ctx = c_uint64(0x5A5A)
    status = lib.cuCtxGetCurrent(ctx_p(ctx))
    return [status, ctx.value]
def ctx_p(cell): return ctypes.cast(byref(cell), P)
def big_pattern(size):  # random bytes, each MiB stamped with its number: no two MiB alike
    import random
    block = random.Random(5).randbytes(1 << 20)
    return b"".join(i.to_bytes(8, "little") + block[8:] for i in range(-(-size >> 20)))[:size]
"""

SCENARIOS = {
    "copies": r"""
size = int(sys.argv[3])
setup()
device = alloc(size)
data = pattern(size, 3)
source = ctypes.create_string_buffer(data, size)
target = ctypes.create_string_buffer(b"\xee" * (size + 16), size + 16)
out["device"] = device
out["htod"] = lib.cuMemcpyHtoD(device, source, size)
out["dtoh"] = lib.cuMemcpyDtoH(target, device, size)
out["same"] = target.raw[:size] == data
out["guard"] = target.raw[size:] == b"\xee" * 16
out["sha"] = sha(data)
ctypes.memset(target, 0, size)
out["htod_async"] = lib.cuMemcpyHtoDAsync(device, ctypes.create_string_buffer(data[::-1], size), size, None)
out["dtoh_async"] = lib.cuMemcpyDtoHAsync(target, device, size, None)
out["same_async"] = target.raw[:size] == data[::-1]
""",
    "huge_copy": r"""
size = int(sys.argv[3])
setup()
device = alloc(size)
data = big_pattern(size)
source = ctypes.create_string_buffer(data, size)
target = ctypes.create_string_buffer(size)
out["device"] = device
out["htod"] = lib.cuMemcpyHtoD(device, source, size)
del source
out["dtoh"] = lib.cuMemcpyDtoHAsync(target, device, size, None)
out["same"] = target.raw == data
""",
    "null_outputs": r"""
setup()
pointer = alloc(4096)
lib.cuMemGetAddressRange.argtypes = [P, P, c_uint64]
lib.cuCtxGetStreamPriorityRange.argtypes = [P, P]
lib.cuMemGetInfo.argtypes = [P, P]
base, size, least, greatest, total = c_uint64(), c_size_t(), c_int(7), c_int(7), c_size_t()
out["range_both"] = [lib.cuMemGetAddressRange(byref(base), byref(size), pointer + 100), base.value, size.value]
size.value = 0
out["range_size_only"] = [lib.cuMemGetAddressRange(None, byref(size), pointer + 100), size.value]
base.value = 0
out["range_base_only"] = [lib.cuMemGetAddressRange(byref(base), None, pointer + 100), base.value]
out["range_neither"] = lib.cuMemGetAddressRange(None, None, pointer + 100)
out["priorities_both"] = [lib.cuCtxGetStreamPriorityRange(byref(least), byref(greatest)), least.value,
                          greatest.value]
least.value, greatest.value = 7, 7
out["priorities_greatest_only"] = [lib.cuCtxGetStreamPriorityRange(None, byref(greatest)), greatest.value]
out["priorities_least_only"] = [lib.cuCtxGetStreamPriorityRange(byref(least), None), least.value]
out["info_without_free"] = lib.cuMemGetInfo(None, byref(total))  # not optional in cuda.h
""",
    "uva": r"""
setup()
a, b = alloc(4096), alloc(4096)
data = pattern(1000, 11)
source = ctypes.create_string_buffer(data, 1000)
target = ctypes.create_string_buffer(1000)
host = ctypes.create_string_buffer(1000)
addr = ctypes.addressof
out["a"], out["b"] = a, b
out["htod"] = lib.cuMemcpy(a + 8, addr(source), 400)           # host -> device
out["dtod"] = lib.cuMemcpy(b, a + 8, 400)                       # device -> device
out["dtoh"] = lib.cuMemcpy(addr(target), b, 400)                # device -> host
out["same"] = target.raw[:400] == data[:400]
out["htoh"] = lib.cuMemcpy(addr(host), addr(source), 1000)      # host -> host: no round trip
out["same_htoh"] = host.raw == data
out["htod_async"] = lib.cuMemcpyAsync(a, addr(source) + 500, 8, None)
out["dtod_async"] = lib.cuMemcpyAsync(b + 100, a, 8, None)
out["sync"] = lib.cuCtxSynchronize()
out["dtoh_async"] = lib.cuMemcpyAsync(addr(target), b + 100, 8, None)
out["same_async"] = target.raw[:8] == data[500:508]
out["zero"] = lib.cuMemcpy(0, 0, 0)
out["null_host"] = lib.cuMemcpy(0, addr(source), 8)
out["null_htod"] = lib.cuMemcpyHtoD(a, None, 8)
out["null_dtoh"] = lib.cuMemcpyDtoH(None, a, 8)
out["freed"] = lib.cuMemFree(b)
""",
    "contexts": r"""
out["before_init"] = current()
main_ctx = setup()
out["main_ctx"] = main_ctx
out["main_current"] = current()
out["null_get"] = lib.cuCtxGetCurrent(None)
out["null_push"] = lib.cuCtxPushCurrent(0)
main_alloc = alloc(256)
seen = {}
def worker():
    seen["start"] = current()
    ctx = c_uint64()
    seen["create"] = lib.cuCtxCreate(byref(ctx), None, 0, 0)
    seen["ctx"] = ctx.value
    seen["after_create"] = current()
    seen["alloc"] = alloc(256)
    seen["push"] = lib.cuCtxPushCurrent(main_ctx)
    seen["pushed"] = current()
    seen["alloc_pushed"] = alloc(256)
    popped = c_uint64()
    seen["pop"] = [lib.cuCtxPopCurrent(ctx_p(popped)), popped.value]
    seen["after_pop"] = current()
    seen["alloc_after_pop"] = alloc(256)
    seen["set_null"] = lib.cuCtxSetCurrent(0)
    seen["after_set_null"] = current()
    seen["pop_empty"] = lib.cuCtxPopCurrent(None)
thread = threading.Thread(target=worker)
thread.start()
thread.join()
out["thread"] = seen
out["main_after"] = current()
out["alloc_after"] = alloc(256)
ctx_attr = c_uint64()
contexts = {}
for key, pointer in (("main", main_alloc), ("thread", seen["alloc"]), ("pushed", seen["alloc_pushed"]),
                     ("after_pop", seen["alloc_after_pop"]), ("after", out["alloc_after"])):
    status = lib.cuPointerGetAttribute(ctx_p(ctx_attr), 1, pointer)  # CU_POINTER_ATTRIBUTE_CONTEXT
    contexts[key] = [status, ctx_attr.value]
out["contexts"] = contexts
out["set_thread_ctx"] = lib.cuCtxSetCurrent(seen["ctx"])
out["set_current"] = current()
out["destroy"] = lib.cuCtxDestroy(seen["ctx"])
out["after_destroy"] = current()  # the destroyed context was the top: popped
out["set_bogus"] = lib.cuCtxSetCurrent(0xdead0000)
out["after_bogus"] = current()
print("MARK", flush=True)
sys.stdin.readline()  # the test reads the journal's length here
for _ in range(100):
    current()
print("RESULT " + json.dumps(out), flush=True)
sys.stdin.readline()
""",
    "queries": r"""
name = ctypes.create_string_buffer(b"\xee" * 80, 80)
text = c_char_p()
out["error_name_before_init"] = [lib.cuGetErrorName(1, byref(text)), text.value.decode()]
setup()
out["name"] = [lib.cuDeviceGetName(name, 64, 0), name.value.decode(), name.raw[64:] == b"\xee" * 16]
short = ctypes.create_string_buffer(b"\xee" * 16, 16)
out["short"] = [lib.cuDeviceGetName(short, 10, 0), short.raw[:10].hex(), short.raw[10:] == b"\xee" * 6]
out["name_null"] = lib.cuDeviceGetName(None, 64, 0)
out["name_zero"] = lib.cuDeviceGetName(name, 0, 0)
out["name_bad_device"] = lib.cuDeviceGetName(name, 64, 7)
uuid = ctypes.create_string_buffer(16)
out["uuid"] = [lib.cuDeviceGetUuid(uuid, 1), uuid.raw.hex()]
out["uuid_null"] = lib.cuDeviceGetUuid(None, 0)
texts = {}
for which in ("cuGetErrorName", "cuGetErrorString"):
    for code in (0, 1, 2, 201, 999):
        first, again = c_char_p(), c_void_p()
        status = getattr(lib, which)(code, byref(first))
        getattr(lib, which)(code, byref(again))
        texts[f"{which}/{code}"] = [status, first.value.decode(), ctypes.cast(first, c_void_p).value == again.value]
    texts[f"{which}/null"] = getattr(lib, which)(1, None)
    texts[f"{which}/unknown"] = getattr(lib, which)(12345, byref(text))
out["texts"] = texts
device = alloc(4096)
out["device"] = device
value = ctypes.create_string_buffer(b"\xee" * 16, 16)
out["memory_type"] = [lib.cuPointerGetAttribute(value, 2, device + 100), value.raw.hex()]
ctypes.memset(value, 0xee, 16)
out["range_start"] = [lib.cuPointerGetAttribute(value, 11, device + 100), value.raw.hex()]
out["range_size"] = [lib.cuPointerGetAttribute(value, 12, device + 100), value.raw.hex()]
out["attribute_null"] = lib.cuPointerGetAttribute(None, 11, device)
out["attribute_not_device"] = lib.cuPointerGetAttribute(value, 11, 0x1000)
pool = c_uint64()
out["pool"] = lib.cuDeviceGetMemPool(byref(pool), 0)
wide, narrow = c_uint64(1 << 40), c_int(0)
out["set_wide"] = lib.cuMemPoolSetAttribute(pool.value, 4, byref(wide))   # RELEASE_THRESHOLD: cuuint64_t
out["set_narrow"] = lib.cuMemPoolSetAttribute(pool.value, 1, byref(narrow))  # REUSE_FOLLOW_EVENT_DEPENDENCIES: int
cell = ctypes.create_string_buffer(b"\xee" * 16, 16)
out["get_wide"] = [lib.cuMemPoolGetAttribute(pool.value, 4, cell), cell.raw.hex()]
ctypes.memset(cell, 0xee, 16)
out["get_narrow"] = [lib.cuMemPoolGetAttribute(pool.value, 1, cell), cell.raw.hex()]
out["pool_null"] = [lib.cuMemPoolGetAttribute(pool.value, 1, None), lib.cuMemPoolSetAttribute(pool.value, 1, None)]
out["pool_handle"] = pool.value
""",
    "page_locked": r"""
setup()
out["null"] = [lib.cuMemAllocHost(None, 4096), lib.cuMemHostAlloc(None, 4096, 0)]
first, second = c_void_p(), c_void_p()
out["alloc_host"] = lib.cuMemAllocHost(byref(first), 1 << 20)
out["host_alloc"] = lib.cuMemHostAlloc(byref(second), 8192, 2)  # CU_MEMHOSTALLOC_DEVICEMAP
out["first"], out["second"] = first.value, second.value
flags, dptr = c_uint(0x5A5A), c_uint64()
out["flags"] = [lib.cuMemHostGetFlags(byref(flags), second), flags.value]
out["flags_null"] = lib.cuMemHostGetFlags(None, second)
out["device_pointer"] = [lib.cuMemHostGetDevicePointer(byref(dptr), first, 0), dptr.value]
out["device_pointer_null"] = lib.cuMemHostGetDevicePointer(None, first, 0)
size = 1 << 20
data = pattern(size, 5)
ctypes.memmove(first, data, size)
device = alloc(size)
out["device"] = device
out["htod"] = lib.cuMemcpyHtoD(device, first, size)  # the host reads the shared pages
back = ctypes.create_string_buffer(256)
out["dtoh_pageable"] = lib.cuMemcpyDtoH(back, device + size - 256, 256)  # (a small pageable copy, to compare)
out["same"] = back.raw == data[-256:]
out["dtoh_async"] = lib.cuMemcpyDtoHAsync(second.value + 4096, device + 64, 4096, None)  # posted
out["sync"] = lib.cuCtxSynchronize()
out["same_async"] = ctypes.string_at(second.value + 4096, 4096) == data[64:64 + 4096]
out["uva"] = lib.cuMemcpy(device + 8, second.value + 4096, 16)
out["free"] = lib.cuMemFreeHost(first)
out["free_again"] = lib.cuMemFreeHost(first)
""",
}


def _run(library: Path, rig: Rig, scenario: str, *extra: str) -> dict[str, Any]:
    env = native_child_env(library, rig.path)
    script = PRELUDE + SCENARIOS[scenario] + 'print("RESULT " + json.dumps(out))\n'
    done = subprocess.run([sys.executable, "-c", script, str(library), scenario, *extra],
                          env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])  # type: ignore[no-any-return]


def _run_marked(library: Path, rig: Rig, scenario: str) -> tuple[dict[str, Any], int, int]:
    """Run a scenario that stops twice: returns its result and the journal's length at its MARK and at its end."""
    env = native_child_env(library, rig.path)
    script = PRELUDE + SCENARIOS[scenario] + "\n"
    with subprocess.Popen([sys.executable, "-c", script, str(library), scenario], env=env, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO) as child:
        assert child.stdin is not None and child.stdout is not None
        lines = iter(child.stdout.readline, "")
        assert next((line for line in lines if line.startswith("MARK")), None), child.stderr and child.stderr.read()
        at_mark = rig.mark()
        child.stdin.write("\n")
        child.stdin.flush()
        result = next((line for line in lines if line.startswith("RESULT ")), "")
        assert result, child.stderr and child.stderr.read()
        at_end = rig.mark()
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(60)
        assert child.returncode == 0, child.stderr.read() if child.stderr else ""
    return json.loads(result[len("RESULT "):]), at_mark, at_end


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _pattern(size: int, seed: int) -> bytes:
    return bytes((i * 7 + seed) & 0xFF for i in range(size))


def _number(value: Any) -> int:
    return int(value[1]) if isinstance(value, list) else int(value or 0)


def test_the_forwarding_layers_own_opcodes_written_in_c_are_the_wires() -> None:
    """The table calls' opcodes are generated (orion_calls.h); the forwarding layer's two are written by hand."""
    text = (NATIVE / "orion_guest.h").read_text()
    assert f"ORION_OP_POOL_MAP = {POOL_MAP_OPCODE:#x}" in text and f"ORION_PINNED_COPY = {PINNED_COPY:#x}" in text


def _tiles(entries: list[dict[str, Any]], key: str, base: int, data: bytes) -> bool:
    """Whether the copies in `entries` (the executor may split one into chunks) moved exactly `data` at `base`:
    their ranges tile it and each chunk's bytes are the matching part of `data`."""
    position = 0
    for entry in sorted(entries, key=lambda e: int(e[key])):
        offset, moved = int(entry[key]) - base, entry["data"]
        if offset != position or moved["sha256"] != _sha(data[offset:offset + moved["len"]]):
            return False
        position += moved["len"]
    return position == len(data)


@pytest.mark.parametrize("size", [4, 100 << 10, 3 << 20])
def test_copies_to_and_from_the_device_move_the_programs_bytes(library: Path, rig: Rig, size: int) -> None:
    """4 bytes travel inline; 100 KiB and 3 MiB, beyond a ring slot (INLINE bytes), through the staging arenas."""
    assert (size <= INLINE) == (size == 4)  # one size inline, two staged
    result = _run(library, rig, "copies", str(size))
    assert result["htod"] == 0 and result["dtoh"] == 0
    assert result["same"] and result["guard"]  # the bytes came back, nothing written past the buffer
    assert result["htod_async"] == 0 and result["dtoh_async"] == 0 and result["same_async"]
    data, device = _pattern(size, 3), result["device"]
    entries = rig.entries(0)
    names = [e["name"] for e in entries]

    def after(start: int, name: str) -> int:  # the first copy of `name` or its Async form from `start` on
        return next(i for i in range(start, len(names)) if names[i].startswith(name))
    first_dtoh = after(0, "cuMemcpyDtoH")
    second_htod = after(first_dtoh, "cuMemcpyHtoD")
    second_dtoh = after(second_htod, "cuMemcpyDtoH")

    def copies(begin: int, end: int, name: str) -> list[dict[str, Any]]:
        return [e for e in entries[begin:end] if e["name"].startswith(name)]
    # what the fake's memory got, and what it gave back: the program's bytes, then the reversed ones (async)
    assert _tiles(copies(0, first_dtoh, "cuMemcpyHtoD"), "dst", device, data)
    assert _tiles(copies(first_dtoh, second_htod, "cuMemcpyDtoH"), "src", device, data)
    assert _tiles(copies(second_htod, second_dtoh, "cuMemcpyHtoD"), "dst", device, data[::-1])
    assert _tiles(copies(second_dtoh, len(entries), "cuMemcpyDtoH"), "src", device, data[::-1])


def test_a_pageable_copy_larger_than_one_request_travels_in_pieces(library: Path, rig: Rig) -> None:
    """The driver copies any size; one request carries at most MAX_PAYLOAD (1 GiB), so a larger pageable copy goes as
    consecutive requests (copy_calls.c, PAGEABLE_PIECE) whose bytes tile the device range in order."""
    size = MAX_PAYLOAD + 3 * 4096 + 5
    result = _run(library, rig, "huge_copy", str(size))
    assert result["htod"] == 0 and result["dtoh"] == 0 and result["same"]
    scope: dict[str, Any] = {}
    exec(PRELUDE[PRELUDE.index("def big_pattern"):], scope)  # the child's pattern, made here too
    data, device = scope["big_pattern"](size), result["device"]
    entries = rig.entries(0)
    htod = [e for e in entries if e["name"].startswith("cuMemcpyHtoD")]
    dtoh = [e for e in entries if e["name"].startswith("cuMemcpyDtoH")]
    assert _tiles(htod, "dst", device, data) and _tiles(dtoh, "src", device, data)


def test_outputs_cuda_h_lets_a_caller_leave_null_are_answered_as_the_driver_does(library: Path, rig: Rig) -> None:
    """cuda.h: "Both parameters pbase and psize are optional" (cuMemGetAddressRange, which NCCL calls with a NULL
    base when it frees its buffers), "A NULL may be passed in for *leastPriority or *greatestPriority". The generated
    calls and the hand-written ones skip such an output (ivshmem/cuda_header.py finds them in cuda.h's text); an
    output cuda.h does not call optional is still CUDA_ERROR_INVALID_VALUE."""
    result = _run(library, rig, "null_outputs")
    status, base, size = result["range_both"]
    assert status == 0 and size == 4096
    assert result["range_size_only"] == [0, size] and result["range_base_only"] == [0, base]
    assert result["range_neither"] == 0
    status, least, greatest = result["priorities_both"]
    assert status == 0 and (least, greatest) != (7, 7)
    assert result["priorities_greatest_only"] == [0, greatest] and result["priorities_least_only"] == [0, least]
    assert result["info_without_free"] == 1


def test_cumemcpy_takes_its_direction_from_the_device_ranges(library: Path, rig: Rig) -> None:
    result = _run(library, rig, "uva")
    data = _pattern(1000, 11)
    assert [result[k] for k in ("htod", "dtod", "dtoh", "htoh")] == [0, 0, 0, 0]
    assert result["same"] and result["same_htoh"]
    a, b = result["a"], result["b"]
    htod = rig.entries(0, "cuMemcpyHtoD")[:1]
    assert [(e["dst"], e["data"]["sha256"]) for e in htod] == [(a + 8, _sha(data[:400]))]
    dtod = rig.entries(0, "cuMemcpyDtoD")
    assert [[_number(x) for x in e["args"]] for e in dtod] == [[b, a + 8, 400]]
    dtoh = rig.entries(0, "cuMemcpyDtoH")[:1]
    assert [(e["src"], e["data"]["sha256"]) for e in dtoh] == [(b, _sha(data[:400]))]
    assert result["htod_async"] == 0 and result["dtod_async"] == 0 and result["sync"] == 0
    assert result["dtoh_async"] == 0 and result["same_async"]
    copies = [e for e in rig.entries(0) if e["name"].startswith("cuMemcpy")]
    assert [e["dst"] for e in copies if e["name"].startswith("cuMemcpyHtoD")][1:] == [a]
    assert [e["data"]["sha256"] for e in copies if e["name"].startswith("cuMemcpyHtoD")][1:] == [_sha(data[500:508])]
    assert [_number(e["args"][0]) for e in rig.entries(0, "cuMemcpyDtoDAsync")] == [b + 100]
    assert [e["src"] for e in copies if e["name"].startswith("cuMemcpyDtoH")][1:] == [b + 100]
    assert result["zero"] == 0  # nothing to copy
    assert result["null_host"] == 1 and result["null_htod"] == 1 and result["null_dtoh"] == 1
    assert result["freed"] == 0


def test_context_stacks_are_per_thread_and_current_costs_no_round_trip(library: Path, rig: Rig) -> None:
    result, at_mark, at_end = _run_marked(library, rig, "contexts")
    main_ctx, seen = result["main_ctx"], result["thread"]
    thread_ctx = seen["ctx"]
    assert result["before_init"][0] == 3  # CUDA_ERROR_NOT_INITIALIZED
    assert result["main_current"] == [0, main_ctx] and main_ctx
    assert result["null_get"] == 1 and result["null_push"] == 1
    assert seen["start"] == [0, 0]  # a new thread has no current context
    assert seen["create"] == 0 and seen["after_create"] == [0, thread_ctx] and thread_ctx not in (0, main_ctx)
    assert seen["push"] == 0 and seen["pushed"] == [0, main_ctx]
    assert seen["pop"] == [0, main_ctx] and seen["after_pop"] == [0, thread_ctx]
    assert seen["set_null"] == 0 and seen["after_set_null"] == [0, 0]
    assert seen["pop_empty"] == 201  # CUDA_ERROR_INVALID_CONTEXT
    assert result["main_after"] == [0, main_ctx]  # the other thread's changes are its own
    # each allocation was made in the context its thread had current, as the host (the fake) saw it
    assert result["contexts"] == {"main": [0, main_ctx], "thread": [0, thread_ctx], "pushed": [0, main_ctx],
                                  "after_pop": [0, thread_ctx], "after": [0, main_ctx]}
    assert result["set_thread_ctx"] == 0 and result["set_current"] == [0, thread_ctx]
    assert result["destroy"] == 0 and result["after_destroy"] == [0, 0]
    [destroyed] = rig.entries(0, "cuCtxDestroy")
    assert _number(destroyed["args"][0]) == thread_ctx
    assert result["set_bogus"] != 0 and result["after_bogus"] == [0, 0]  # the host refused it: nothing changed
    assert at_end == at_mark  # 100 cuCtxGetCurrent: not one call reached the driver


def test_device_name_uuid_error_texts_and_attributes(library: Path, rig: Rig) -> None:
    result = _run(library, rig, "queries")
    fake = FakeDriver(devices=3)
    name = fake.device_name(GUEST_DEVICES[0])
    assert result["name"] == [0, name[:63].decode(), True]
    assert result["short"] == [0, (name[:9] + b"\0").hex(), True]  # truncated, NUL-terminated, nothing past it
    assert result["name_null"] == 1 and result["name_zero"] == 1 and result["name_bad_device"] == 101
    assert result["uuid"] == [0, fake.device_uuid(GUEST_DEVICES[1]).hex()] and result["uuid_null"] == 1
    assert result["error_name_before_init"] == [0, "CUDA_ERROR_INVALID_VALUE"]
    texts = result["texts"]
    names = {0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
             201: "CUDA_ERROR_INVALID_CONTEXT", 999: "CUDA_ERROR_UNKNOWN"}
    for code, text in names.items():
        assert texts[f"cuGetErrorName/{code}"] == [0, text, True]  # the same static pointer both times
        assert texts[f"cuGetErrorString/{code}"] == [0, ERROR_STRINGS[code], True]
    assert texts["cuGetErrorName/null"] == 1 and texts["cuGetErrorString/null"] == 1
    assert texts["cuGetErrorName/unknown"] == 1 and texts["cuGetErrorString/unknown"] == 1
    asked = [e["args"] for e in rig.entries(0, "cuGetErrorString")]
    assert sorted(_number(a[0]) for a in asked) == sorted(names)  # each text asked of the host once
    device = result["device"]
    assert result["memory_type"] == [0, (2).to_bytes(4, "little").hex() + "ee" * 12]  # 4 bytes: DEVICE
    assert result["range_start"] == [0, device.to_bytes(8, "little").hex() + "ee" * 8]
    assert result["range_size"] == [0, (4096).to_bytes(8, "little").hex() + "ee" * 8]
    assert result["attribute_null"] == 1 and result["attribute_not_device"] == 1
    assert result["pool"] == 0 and result["set_wide"] == 0 and result["set_narrow"] == 0
    assert result["get_wide"] == [0, (1 << 40).to_bytes(8, "little").hex() + "ee" * 8]
    assert result["get_narrow"] == [0, (0).to_bytes(4, "little").hex() + "ee" * 12]
    assert result["pool_null"] == [1, 1]
    sets = rig.entries(0, "cuMemPoolSetAttribute")
    pool = result["pool_handle"]
    assert [e["args"] for e in sets] == [[pool, ["CUmemPool_attribute", 4], ["cuuint64_t", 1 << 40]],
                                         [pool, ["CUmemPool_attribute", 1], 0]]


@local_only("the pool is not registered on the GPU host and its bytes travel")
def test_page_locked_memory_and_pinned_copies(library: Path, rig: Rig) -> None:
    result = _run(library, rig, "page_locked")
    assert result["null"] == [1, 1]
    assert result["alloc_host"] == 0 and result["host_alloc"] == 0
    first, second = result["first"], result["second"]
    [registered] = rig.entries(0, "cuMemHostRegister")  # the host mapped the slice where the guest sees it
    base = _number(registered["args"][0])
    assert base <= first < second and first % 4096 == 0
    assert result["flags"] == [0, 2] and result["flags_null"] == 1
    assert result["device_pointer"] == [0, first] and result["device_pointer_null"] == 1
    assert result["htod"] == 0 and result["dtoh_pageable"] == 0 and result["same"]
    [htod, uva] = rig.entries(0, "cuMemcpyHtoD")
    assert htod["args"] == [result["device"], first, 1 << 20]  # the driver read the shared pages: an address
    [dtoh] = rig.entries(0, "cuMemcpyDtoH")  # the pageable copy back, for comparison: bytes
    assert dtoh["data"]["sha256"] == _sha(_pattern(1 << 20, 5)[-256:])
    assert result["dtoh_async"] == 0 and result["sync"] == 0 and result["same_async"]
    [dtoh_async] = rig.entries(0, "cuMemcpyDtoHAsync")
    assert dtoh_async["args"][0] == second + 4096  # posted as the pinned variant: an address, no bytes
    # cuMemcpy: a synchronous copy of 16 bytes from the pool reads the shared pages in stream order too (copy_calls.c)
    assert result["uva"] == 0 and uva["args"][0::2] == [result["device"] + 8, 16]
    assert _number(uva["args"][1]) == second + 4096
    assert result["free"] == 0 and result["free_again"] == 1
