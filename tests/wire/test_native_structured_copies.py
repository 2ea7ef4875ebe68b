"""Structured copies (cuMemcpy2D, cuMemcpy2DUnaligned, cuMemcpy2DAsync, cuMemcpy3D, cuMemcpy3DAsync, cuMemcpy3DPeer,
cuMemcpy3DPeerAsync) through the native `libcuda.so.1` (guest_runtime/native/structured_copies.c) and the host's
host_agent/session/structured_copies.py, over the fake driver. CPU only.

Each copy runs in a child process (ctypes, ORION_SHM naming the rig's region: tests/forwarding_rig.py) on memory
filled with a known pattern; every byte of the destination afterwards is compared with a numpy reference of the copy
(strided views of the same patterns), so a byte out of place, a row too many or a guard byte touched fails. Every
direction (host to device, device to host, device to device, host to host), pitched sub-rectangles with offsets, 3D
with depth and slice heights, async copies, unified addressing, page-locked pool memory, peer copies, and copies
larger than one record (split into parts, rows gathered and scattered). Then what is refused, and where: a device
range outside the session's memory never reaches the driver (its journal); a device pitch below the width is the
driver's own error; a pageable side's geometry is refused in the guest. The executor is also driven directly:
malformed requests, another session's memory, the part decomposition. Last, the GPU program
tests/gpu/programs/structured_copy_program.py runs on the fake driver directly and through the native library, and
the two agree.
"""
from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import random
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guest_runtime.native import gen_libcuda
from host_agent.handler import Reply, Session
from host_agent.session.executor import CudaExecutor
from host_agent.session.structured_copies import MAX_STAGED_PART, boxes
from ivshmem.driver_api import CALLS
from ivshmem.record import Record, Status
from tests import forwarding_rig, relay_net
from tests.fake_driver import FakeDriver
from tests.forwarding_rig import Rig, native_child_env

bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures

NATIVE = Path(gen_libcuda.__file__).resolve().parent
REPO = NATIVE.parents[1]
PROGRAM = REPO / "tests" / "gpu" / "programs" / "structured_copy_program.py"
SUCCESS, INVALID_VALUE, INVALID_CONTEXT, INVALID_HANDLE, NOT_SUPPORTED = 0, 1, 201, 400, 801
HOST, DEVICE, ARRAY, UNIFIED = 1, 2, 3, 4  # CUmemorytype
SMALL = 1 << 16  # destinations up to this size come back whole (a failure shows the bytes), larger as a digest


def pattern(size: int, seed: int) -> np.ndarray:
    """`size` pseudo-random bytes (no period a pitch could line up with: a row copied one row off differs)."""
    return np.random.default_rng(seed).integers(0, 256, size=size, dtype=np.uint8)


# --- the child: the copies through the native library -------------------------------------------------------------

CHILD = r"""
import base64, ctypes, hashlib, json, sys
from ctypes import POINTER, byref, c_int, c_size_t, c_uint, c_uint64, c_void_p
import numpy as np
lib = ctypes.CDLL(sys.argv[1])
P = c_void_p
def side(prefix, peer=False, three=True):
    fields = [(prefix + "XInBytes", c_size_t), (prefix + "Y", c_size_t)]
    if three:
        fields += [(prefix + "Z", c_size_t), (prefix + "LOD", c_size_t)]
    fields += [(prefix + "MemoryType", c_int), (prefix + "Host", P), (prefix + "Device", c_uint64),
               (prefix + "Array", P)]
    if three:
        fields.append((prefix + ("Context" if peer else "reserved"), P))
    fields.append((prefix + "Pitch", c_size_t))
    if three:
        fields.append((prefix + "Height", c_size_t))
    return fields
class MEMCPY2D(ctypes.Structure):
    _fields_ = side("src", three=False) + side("dst", three=False) + [("WidthInBytes", c_size_t), ("Height", c_size_t)]
class MEMCPY3D(ctypes.Structure):
    _fields_ = side("src") + side("dst") + [("WidthInBytes", c_size_t), ("Height", c_size_t), ("Depth", c_size_t)]
class MEMCPY3D_PEER(ctypes.Structure):
    _fields_ = (side("src", peer=True) + side("dst", peer=True)
                + [("WidthInBytes", c_size_t), ("Height", c_size_t), ("Depth", c_size_t)])
assert (ctypes.sizeof(MEMCPY2D), ctypes.sizeof(MEMCPY3D), ctypes.sizeof(MEMCPY3D_PEER)) == (128, 200, 200)
STRUCTS = {"cuMemcpy2D": MEMCPY2D, "cuMemcpy2DUnaligned": MEMCPY2D, "cuMemcpy2DAsync": MEMCPY2D,
           "cuMemcpy3D": MEMCPY3D, "cuMemcpy3DAsync": MEMCPY3D, "cuMemcpy3DPeer": MEMCPY3D_PEER,
           "cuMemcpy3DPeerAsync": MEMCPY3D_PEER}
for name in STRUCTS:
    getattr(lib, name).argtypes = [P, P] if name.endswith("Async") else [P]
for name, args in {"cuInit": [c_uint], "cuDeviceGet": [POINTER(c_int), c_int],
                   "cuCtxCreate": [POINTER(c_uint64), P, c_uint, c_int], "cuMemAlloc": [POINTER(c_uint64), c_size_t],
                   "cuMemFree": [c_uint64], "cuMemcpyHtoD": [c_uint64, P, c_size_t],
                   "cuMemcpyDtoH": [P, c_uint64, c_size_t], "cuMemAllocHost": [P, c_size_t], "cuMemFreeHost": [P],
                   "cuStreamCreate": [P, c_uint], "cuStreamSynchronize": [P], "cuCtxSynchronize": []}.items():
    getattr(lib, name).argtypes = args
MEMORY = {"host": 1, "pool": 1, "device": 2, "unified_host": 4, "unified_device": 4, "unified_pool": 4, "array": 3}
def pattern(size, seed):
    return np.random.default_rng(seed).integers(0, 256, size=size, dtype=np.uint8)
keep = []
context = c_uint64()
def setup():
    dev = c_int(-1)
    assert lib.cuInit(0) == 0 and lib.cuDeviceGet(byref(dev), 0) == 0
    assert lib.cuCtxCreate(byref(context), None, 0, dev) == 0
def place(kind, size, seed):
    data = pattern(size, seed)
    if kind in ("host", "unified_host"):
        buffer = ctypes.create_string_buffer(data.tobytes(), size)
        keep.append(buffer)
        return ctypes.addressof(buffer)
    if kind in ("pool", "unified_pool"):
        pointer = c_void_p()
        assert lib.cuMemAllocHost(byref(pointer), size) == 0
        ctypes.memmove(pointer.value, data.ctypes.data, size)
        return pointer.value
    if kind == "array":
        return 0x1234
    pointer = c_uint64()
    assert lib.cuMemAlloc(byref(pointer), size) == 0
    assert lib.cuMemcpyHtoD(pointer.value, data.ctypes.data, size) == 0
    return pointer.value
def read(kind, address, size):
    if kind in ("device", "unified_device"):
        buffer = ctypes.create_string_buffer(size)
        assert lib.cuMemcpyDtoH(buffer, address, size) == 0
        return buffer.raw
    return ctypes.string_at(address, size)
def fill(copy, prefix, spec, address, three):
    setattr(copy, prefix + "XInBytes", spec["x"])
    setattr(copy, prefix + "Y", spec["y"])
    setattr(copy, prefix + "MemoryType", spec.get("type", MEMORY[spec["mem"]]))
    if MEMORY[spec["mem"]] == 1:
        setattr(copy, prefix + "Host", address)
    elif MEMORY[spec["mem"]] == 3:
        setattr(copy, prefix + "Array", address)
    else:
        setattr(copy, prefix + "Device", address)
    setattr(copy, prefix + "Pitch", spec["pitch"])
    if three:
        setattr(copy, prefix + "Z", spec.get("z", 0))
        setattr(copy, prefix + "LOD", spec.get("lod", 0))
        setattr(copy, prefix + "Height", spec.get("height", 0))
def copy(case, src_address, dst_address, stream=None):
    name = case["call"]
    struct = STRUCTS[name]()
    three = not name.startswith("cuMemcpy2D")
    fill(struct, "src", case["src"], src_address, three)
    fill(struct, "dst", case["dst"], dst_address, three)
    width, height, depth = case["extent"]
    struct.WidthInBytes, struct.Height = width, height
    if three:
        struct.Depth = depth
    if "Peer" in name:
        struct.srcContext = struct.dstContext = case.get("context", context.value)
    function = getattr(lib, name)
    argument = None if case.get("null") else byref(struct)
    return function(argument, stream) if name.endswith("Async") else function(argument)
def run_case(case, stream):
    src, dst = case["src"], case["dst"]
    src_address = place(src["mem"], src["size"], case["seed"])
    dst_address = place(dst["mem"], dst["size"], case["seed"] + 1)
    status = copy(case, src_address, dst_address, stream if case.get("stream") else None)
    synced = lib.cuStreamSynchronize(stream) if case["call"].endswith("Async") else 0
    after = read(dst["mem"], dst_address, dst["size"])
    before_src = read(src["mem"], src_address, src["size"])
    got = {"status": status, "synced": synced, "sha": hashlib.sha256(after).hexdigest(),
           "src_sha": hashlib.sha256(before_src).hexdigest()}
    if len(after) <= %(small)d:
        got["dst"] = base64.b64encode(after).decode()
    return got
"""  # noqa: E501

CASES_SCRIPT = CHILD % {"small": SMALL} + r"""
setup()
stream = c_void_p()
assert lib.cuStreamCreate(byref(stream), 0) == 0
cases = json.loads(open(sys.argv[2]).read())
print("RESULT " + json.dumps([run_case(case, stream) for case in cases]))
"""


def _run(library: Path, rig: Rig, script: str, *extra: str, timeout: int = 120) -> Any:
    done = subprocess.run([sys.executable, "-c", script, str(library), *extra], env=native_child_env(library, rig.path),
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


# --- the reference ------------------------------------------------------------------------------------------------

def _side(mem: str, x: int, y: int, pitch: int, height: int = 0, z: int = 0, **more: Any) -> dict[str, Any]:
    return {"mem": mem, "x": x, "y": y, "z": z, "pitch": pitch, "height": height, **more}


def _size(side: dict[str, Any], extent: tuple[int, int, int]) -> int:
    """The bytes a side's buffer needs for the copy's rows, and a guard of 64 after them."""
    width, height, depth = extent
    rows = (side["z"] + depth - 1) * side["height"] + side["y"] + height - 1 if depth > 1 or side["z"] else \
        side["y"] + height - 1
    return rows * side["pitch"] + side["x"] + width + 64


def _case(call: str, src: dict[str, Any], dst: dict[str, Any], extent: tuple[int, int, int], seed: int,
          **more: Any) -> dict[str, Any]:
    src, dst = dict(src), dict(dst)
    src.setdefault("size", _size(src, extent))
    dst.setdefault("size", _size(dst, extent))
    return {"call": call, "src": src, "dst": dst, "extent": list(extent), "seed": seed, **more}


def _rows(buffer: np.ndarray, side: dict[str, Any], extent: tuple[int, int, int]) -> np.ndarray:
    """The copy's rows of `side` in `buffer`, as a (depth, height, width) strided view (cuda.h's addressing)."""
    width, height, depth = extent
    start = side["x"] + (side["z"] * side["height"] + side["y"]) * side["pitch"]
    return np.lib.stride_tricks.as_strided(buffer[start:], shape=(depth, height, width),
                                           strides=(side["height"] * side["pitch"], side["pitch"], 1))


def expected(case: dict[str, Any]) -> bytes:
    """The destination's bytes after the copy: its pattern with the source's rows written over its own."""
    extent = tuple(case["extent"])
    source = pattern(case["src"]["size"], case["seed"])
    target = pattern(case["dst"]["size"], case["seed"] + 1).copy()
    if all(extent):
        _rows(target, case["dst"], extent)[...] = _rows(source, case["src"], extent)  # type: ignore[arg-type]
    return target.tobytes()


def _check(cases: list[dict[str, Any]], results: list[dict[str, Any]]) -> None:
    assert len(results) == len(cases)
    for case, got in zip(cases, results, strict=True):
        label = f"{case['call']} {case['src']['mem']}->{case['dst']['mem']} {case['extent']}"
        assert (got["status"], got["synced"]) == (case.get("status", SUCCESS), SUCCESS), label
        want = expected(case) if got["status"] == SUCCESS else pattern(case["dst"]["size"], case["seed"] + 1).tobytes()
        if "dst" in got and got["sha"] != hashlib.sha256(want).hexdigest():
            have = base64.b64decode(got["dst"])
            first = next(i for i, (a, b) in enumerate(zip(have, want, strict=True)) if a != b)
            pytest.fail(f"{label}: byte {first} is {have[first]}, the reference's {want[first]}")
        assert got["sha"] == hashlib.sha256(want).hexdigest(), label
        assert got["src_sha"] == hashlib.sha256(pattern(case["src"]["size"], case["seed"]).tobytes()).hexdigest(), \
            f"{label}: the source changed"


def _cases_file(tmp_path: Path, cases: list[dict[str, Any]]) -> str:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    return str(path)


# --- every direction, pitched sub-rectangles with offsets, 3D, async ----------------------------------------------

DIRECTIONS = [
    # 2D: host to device, device to host (scattered into pitched host rows), device to device, host to host
    _case("cuMemcpy2D", _side("host", 3, 2, 100), _side("device", 5, 1, 128), (37, 9, 1), 1),
    _case("cuMemcpy2D", _side("device", 8, 3, 96), _side("host", 2, 4, 70), (50, 11, 1), 2),
    _case("cuMemcpy2D", _side("device", 0, 0, 64), _side("device", 16, 2, 80), (48, 7, 1), 3),
    _case("cuMemcpy2D", _side("host", 1, 1, 40), _side("host", 0, 3, 33), (30, 5, 1), 4),
    _case("cuMemcpy2DUnaligned", _side("device", 1, 1, 65), _side("device", 3, 0, 67), (61, 4, 1), 5),
    # contiguous host rows (sent and received where they lie), one row with no pitch at all
    _case("cuMemcpy2D", _side("host", 0, 0, 24), _side("device", 4, 2, 40), (24, 6, 1), 6),
    _case("cuMemcpy2D", _side("device", 4, 2, 40), _side("host", 0, 0, 24), (24, 6, 1), 7),
    _case("cuMemcpy2D", _side("host", 5, 0, 0), _side("device", 9, 3, 64), (40, 1, 1), 8),
    # 3D with offsets in every dimension and slice heights larger than the copy's
    _case("cuMemcpy3D", _side("host", 1, 2, 50, 12, 1), _side("device", 4, 3, 64, 10, 2), (40, 6, 3), 9),
    _case("cuMemcpy3D", _side("device", 0, 1, 64, 8, 1), _side("host", 3, 0, 48, 9, 0), (45, 7, 4), 10),
    _case("cuMemcpy3D", _side("device", 2, 2, 32, 6, 0), _side("device", 0, 1, 40, 7, 1), (30, 4, 2), 11),
    _case("cuMemcpy3D", _side("host", 0, 0, 20, 3), _side("host", 2, 1, 25, 5, 1), (18, 3, 3), 12),
    # 3D whose host side is laid out as packed (pitch = width, height = Height): one run
    _case("cuMemcpy3D", _side("host", 0, 0, 33, 5), _side("device", 7, 1, 48, 9, 1), (33, 5, 3), 13),
    # async: posted where nothing comes back, waited for where rows do
    _case("cuMemcpy2DAsync", _side("host", 3, 1, 90), _side("device", 2, 2, 96), (80, 9, 1), 14, stream=True),
    _case("cuMemcpy2DAsync", _side("device", 2, 2, 96), _side("host", 1, 0, 85), (80, 9, 1), 15, stream=True),
    _case("cuMemcpy3DAsync", _side("device", 0, 0, 64, 4), _side("device", 8, 1, 72, 6, 1), (50, 3, 2), 16,
          stream=True),
    _case("cuMemcpy3DAsync", _side("host", 4, 0, 60, 5, 1), _side("device", 0, 2, 64, 7), (44, 4, 3), 17),
    # unified addressing: the direction from where each address lies
    _case("cuMemcpy2D", _side("unified_host", 1, 0, 50), _side("unified_device", 0, 1, 64), (45, 5, 1), 18),
    _case("cuMemcpy3D", _side("unified_device", 0, 1, 64, 4), _side("unified_host", 6, 0, 70, 6), (50, 3, 2), 19),
    _case("cuMemcpy2D", _side("unified_device", 0, 0, 40), _side("unified_device", 8, 0, 56), (32, 6, 1), 20),
    # peer copies (this session's context on both sides)
    _case("cuMemcpy3DPeer", _side("device", 0, 0, 64, 4), _side("host", 5, 2, 70, 8, 1), (50, 3, 2), 21),
    _case("cuMemcpy3DPeerAsync", _side("host", 2, 1, 60), _side("device", 4, 0, 64), (40, 5, 1), 22, stream=True),
    _case("cuMemcpy3DPeer", _side("device", 1, 1, 48, 3), _side("device", 0, 0, 48, 3), (40, 2, 2), 23),
    # nothing to copy: succeeds and changes nothing
    _case("cuMemcpy2D", _side("host", 0, 0, 16), _side("device", 0, 0, 16), (0, 4, 1), 24),
    _case("cuMemcpy3D", _side("device", 0, 0, 16, 2), _side("host", 0, 0, 16, 2), (8, 2, 0), 25),
]


def test_every_direction_copies_the_rows_the_reference_copies(library: Path, rig: Rig, tmp_path: Path) -> None:
    _check(DIRECTIONS, _run(library, rig, CASES_SCRIPT, _cases_file(tmp_path, DIRECTIONS)))
    copies = [entry for entry in rig.entries() if entry["name"].startswith(("cuMemcpy2D", "cuMemcpy3D"))]
    assert copies, "the driver ran the copies"
    host_to_host = [entry for entry in copies if entry.get("extent") == [30, 5, 1] or entry.get("extent") == [18, 3, 3]]
    assert not host_to_host, "a copy between two pageable guest buffers is done in the guest"


POOL = [
    # page-locked pool memory travels as its address (no rows staged), in each direction
    _case("cuMemcpy2D", _side("pool", 3, 2, 100), _side("device", 5, 1, 128), (37, 9, 1), 31),
    _case("cuMemcpy3DAsync", _side("device", 0, 1, 64, 8, 1), _side("pool", 3, 0, 48, 9), (45, 7, 2), 32,
          stream=True),
    _case("cuMemcpy2D", _side("pool", 0, 0, 40), _side("pool", 4, 1, 48), (36, 5, 1), 33),
    _case("cuMemcpy3D", _side("unified_pool", 1, 0, 30, 3), _side("device", 0, 0, 32, 4), (29, 3, 2), 34),
    # a pool side and a pageable one: the pageable side staged, the pool side by address
    _case("cuMemcpy2D", _side("host", 2, 1, 50), _side("pool", 0, 2, 64), (45, 6, 1), 35),
    _case("cuMemcpy2DAsync", _side("pool", 0, 2, 64), _side("host", 2, 1, 50), (45, 6, 1), 36, stream=True),
]


def test_page_locked_pool_sides(library: Path, rig: Rig, tmp_path: Path) -> None:
    _check(POOL, _run(library, rig, CASES_SCRIPT, _cases_file(tmp_path, POOL)))


# --- larger than one record: parts, rows gathered and scattered ---------------------------------------------------

def test_copies_larger_than_a_record_are_split_into_parts(library: Path, rig: Rig, tmp_path: Path) -> None:
    width, rows = 4097, 17000  # 69.6 MB of rows: two parts, the second beginning inside a row
    assert width * rows > MAX_STAGED_PART
    cases = [
        _case("cuMemcpy2D", _side("host", 7, 3, 6000), _side("device", 11, 5, 8192), (width, rows, 1), 41),
        _case("cuMemcpy2D", _side("device", 11, 5, 8192), _side("host", 1, 2, 5000), (width, rows, 1), 42),
        _case("cuMemcpy2DAsync", _side("host", 0, 0, width), _side("device", 0, 0, 4352), (width, rows, 1), 43,
              stream=True),
        _case("cuMemcpy3D", _side("device", 5, 2, 4096, 120, 1), _side("host", 3, 1, 3100, 110, 0),
              (3001, 100, 230), 44),
    ]
    _check(cases, _run(library, rig, CASES_SCRIPT, _cases_file(tmp_path, cases), timeout=300))
    parts = [entry for entry in rig.entries() if entry["name"].startswith(("cuMemcpy2D", "cuMemcpy3D"))]
    assert len(parts) > len(cases), "each copy larger than a record is several driver calls"


# --- refused, and where -------------------------------------------------------------------------------------------

REFUSALS = CHILD % {"small": SMALL} + r"""
out = {}
lib.cuInit(0)
no_context = {"call": "cuMemcpy2D", "src": {"mem": "host", "x": 0, "y": 0, "pitch": 16}, "extent": [16, 2, 1],
              "dst": {"mem": "device", "x": 0, "y": 0, "pitch": 16}}
host = ctypes.create_string_buffer(1 << 16)
out["no context"] = copy(no_context, ctypes.addressof(host), 0x10000)
setup()
device = c_uint64()
assert lib.cuMemAlloc(byref(device), 4096) == 0
freed = c_uint64()
assert lib.cuMemAlloc(byref(freed), 4096) == 0 and lib.cuMemFree(freed.value) == 0
h = ctypes.addressof(host)
def side(mem, pitch, **more):
    return {"mem": mem, "x": more.pop("x", 0), "y": more.pop("y", 0), "pitch": pitch, **more}
def attempt(label, call, src, dst, extent, src_address=None, dst_address=None, **more):
    case = {"call": call, "src": src, "dst": dst, "extent": extent, **more}
    where = {"host": h, "device": device.value, "array": 0x1234}
    out[label] = copy(case, where[src["mem"]] if src_address is None else src_address,
                      where[dst["mem"]] if dst_address is None else dst_address)
# a device range past the allocation (its rows reach 6400 bytes of 4096), each direction: never the driver's
attempt("outside dtod", "cuMemcpy3D", side("device", 64, height=100), side("device", 64, height=100), [64, 100, 1])
attempt("outside htod", "cuMemcpy3D", side("host", 64), side("device", 64, y=60), [64, 10, 1])
attempt("outside dtoh", "cuMemcpy3D", side("device", 64, y=63), side("host", 64), [64, 2, 1])
attempt("outside slices", "cuMemcpy3D", side("device", 64, height=16), side("host", 64, height=16), [64, 16, 5])
attempt("freed", "cuMemcpy3D", {"mem": "device", "x": 0, "y": 0, "pitch": 64}, side("host", 64), [64, 2, 1],
        src_address=freed.value)
attempt("past the end", "cuMemcpy3D", side("device", 64), side("host", 64), [64, 2, 1],
        src_address=device.value + 4096 - 64)
# a device pitch below the width: the driver's own error
attempt("device pitch", "cuMemcpy2D", side("device", 16), side("device", 64), [32, 4, 1])
# a pageable side's geometry, refused in the guest before anything is sent
attempt("host pitch", "cuMemcpy2DUnaligned", side("host", 16), side("device", 64), [32, 4, 1])
attempt("host x past pitch", "cuMemcpy2DUnaligned", side("host", 40, x=10), side("device", 64), [32, 4, 1])
attempt("host slice height", "cuMemcpy3DAsync", side("host", 64, height=3, y=1), side("device", 64, height=8),
        [32, 3, 2])
attempt("host pitch too large", "cuMemcpy3DAsync", side("host", 1 << 32), side("device", 64), [32, 1, 1])
attempt("host null", "cuMemcpy3DAsync", side("host", 64), side("device", 64), [32, 2, 1], src_address=0)
hh = ctypes.create_string_buffer(256)
attempt("host to host lod", "cuMemcpy3DAsync", side("host", 64, lod=1), side("host", 64), [32, 2, 1],
        dst_address=ctypes.addressof(hh))
attempt("null copy", "cuMemcpy3D", side("host", 64), side("device", 64), [32, 2, 1], null=True)
attempt("array", "cuMemcpy3D", side("array", 64), side("device", 64), [32, 2, 1])
attempt("array again", "cuMemcpy2D", side("device", 64), side("array", 64), [32, 2, 1])
print("RESULT " + json.dumps(out))
"""


def test_what_is_refused_and_where(library: Path, rig: Rig) -> None:
    done = subprocess.run([sys.executable, "-c", REFUSALS, str(library)], env=native_child_env(library, rig.path),
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
    assert out.pop("no context") == INVALID_CONTEXT
    outside = ("outside dtod", "outside htod", "outside dtoh", "outside slices", "freed", "past the end")
    assert {label: out[label] for label in outside} == dict.fromkeys(outside, INVALID_VALUE)
    assert out["device pitch"] == INVALID_VALUE
    guest = ("host pitch", "host x past pitch", "host slice height", "host pitch too large", "host null",
             "host to host lod", "null copy")
    assert {label: out[label] for label in guest} == dict.fromkeys(guest, INVALID_VALUE)
    assert out["array"] == out["array again"] == NOT_SUPPORTED
    journal = rig.entries()
    names = [entry["name"] for entry in journal]
    assert "cuMemcpy3D" not in names, "a range outside the session's memory never reaches the driver"
    assert "cuMemcpy2DUnaligned" not in names and "cuMemcpy3DAsync" not in names, "refused in the guest"
    refused = [entry for entry in journal if entry["name"] == "cuMemcpy2D"]
    assert len(refused) == 1 and refused[0]["result"] == [["CUresult", INVALID_VALUE]], "the driver's own refusal"
    assert done.stderr.count("CUDA array") == 1, "an array operand is named once"


BAD_STREAM = CHILD % {"small": SMALL} + r"""
setup()
device = c_uint64()
assert lib.cuMemAlloc(byref(device), 4096) == 0
case = {"call": "cuMemcpy3DAsync", "src": {"mem": "device", "x": 0, "y": 0, "pitch": 64},
        "dst": {"mem": "device", "x": 0, "y": 0, "pitch": 64, "z": 0}, "extent": [32, 2, 1]}
out = {"posted": copy(case, device.value, device.value + 2048, c_void_p(0xBAD0))}
out["sync"] = lib.cuCtxSynchronize()
out["after"] = lib.cuCtxSynchronize()
print("RESULT " + json.dumps(out))
"""


def test_an_async_copy_on_a_stream_not_the_sessions_fails_at_the_next_synchronise(library: Path, rig: Rig) -> None:
    out = _run(library, rig, BAD_STREAM)
    assert out == {"posted": SUCCESS, "sync": INVALID_HANDLE, "after": SUCCESS}
    assert not [entry for entry in rig.entries() if entry["name"] == "cuMemcpy3DAsync"], "never the driver's"


# --- the executor, driven directly -------------------------------------------------------------------------------

class Executor:
    """One session's executor over a shared FakeDriver, with the call table's payloads."""

    def __init__(self, driver: FakeDriver, number: int) -> None:
        self.executor = CudaExecutor(Session(number, f"structured-{number}", 0, 1), driver=driver)
        self.next_id = 0

    def reply(self, name: str, payload: bytes) -> Reply:
        self.next_id += 1
        return self.executor.handle(Record(self.next_id, CALLS[name].opcode, 0, len(payload), 1, 0, payload))

    def ok(self, name: str, *fields: Any) -> list[Any]:
        reply = self.reply(name, CALLS[name].request.encode(*fields))
        assert reply.status == SUCCESS, (name, reply)
        payload = bytes(reply.payload)  # type: ignore[arg-type]
        return list(CALLS[name].reply.decode(payload)) if payload else []


def _copy_fields(src: tuple[int, ...], dst: tuple[int, ...], extent: tuple[int, int, int]) -> list[int]:
    """STRUCTURED_COPY's MEMCPY_3D fields: each side (x, y, z, lod, type, host, device, pitch, height), the extent."""
    return [*src, *dst, *extent]


def _request(name: str, staged: int, offset: int, length: int, fields: list[int], data: bytes = b"",
             stream: int | None = None, contexts: tuple[int, int] | None = None) -> bytes:
    head: list[int] = [] if stream is None else [stream]
    head += list(contexts) if contexts is not None else []
    return CALLS[name].request.encode(*head, staged, offset, length, *fields, data)


@pytest.fixture
def sessions(tmp_path: Path) -> tuple[FakeDriver, Executor, Executor, dict[str, int], Path]:
    journal = tmp_path / "journal.jsonl"
    driver = FakeDriver(devices=1, journal=str(journal))
    driver.cuInit(0)
    a, b = Executor(driver, 1), Executor(driver, 2)
    made: dict[str, int] = {}
    for name, session in (("a", a), ("b", b)):
        (context,) = session.ok("cuDevicePrimaryCtxRetain", 0)
        session.ok("cuCtxSetCurrent", context)
        (made[name],) = session.ok("cuMemAlloc", 1 << 16)
    journal.write_text("")
    return driver, a, b, made, journal


def _driver_calls(journal: Path) -> list[str]:
    return [json.loads(line)["name"] for line in journal.read_text().splitlines()]


def test_the_executor_refuses_another_sessions_memory_before_the_driver(sessions: Any) -> None:
    _driver, a, _b, made, journal = sessions
    rows = (0, 0, 0, 0, DEVICE, 0, made["b"], 64, 0)  # session b's memory
    mine = (0, 0, 0, 0, DEVICE, 0, made["a"], 64, 0)
    staged = (0, 0, 0, 0, HOST, 0, 0, 0, 0)
    for name, payload in [
        ("cuMemcpy3D", _request("cuMemcpy3D", 0, 0, 0, _copy_fields(rows, mine, (64, 4, 1)))),
        ("cuMemcpy2D", _request("cuMemcpy2D", 0, 0, 0, _copy_fields(mine, rows, (64, 4, 1)))),
        ("cuMemcpy3D", _request("cuMemcpy3D", 2, 0, 256, _copy_fields(rows, staged, (64, 4, 1)))),
        ("cuMemcpy2DAsync", _request("cuMemcpy2DAsync", 1, 0, 256, _copy_fields(staged, rows, (64, 4, 1)),
                                     bytes(256), stream=0)),
        # a range that begins in the session's memory and ends in the next allocation
        ("cuMemcpy3D", _request("cuMemcpy3D", 0, 0, 0, _copy_fields(mine, mine, (64, 1025, 1)))),
    ]:
        assert a.reply(name, payload).status == INVALID_VALUE, name
    assert _driver_calls(journal) == [], "nothing reached the driver"


def test_the_executor_answers_malformed_requests_not_tracebacks(sessions: Any) -> None:
    _driver, a, _b, made, journal = sessions
    mine = (0, 0, 0, 0, DEVICE, 0, made["a"], 64, 0)
    staged = (0, 0, 0, 0, HOST, 0, 0, 0, 0)
    extent = (64, 4, 1)
    for label, name, payload in [
        ("short", "cuMemcpy3D", b"\x01" * 9),
        ("empty", "cuMemcpy2DAsync", b""),
        ("2D with depth", "cuMemcpy2D", _request("cuMemcpy2D", 0, 0, 0, _copy_fields(mine, mine, (64, 4, 2)))),
        ("2D with a z", "cuMemcpy2D", _request("cuMemcpy2D", 0, 0, 0,
                                               _copy_fields((0, 0, 1, 0, DEVICE, 0, made["a"], 64, 0), mine, extent))),
        ("2D with a LOD", "cuMemcpy2D", _request("cuMemcpy2D", 0, 0, 0,
                                                 _copy_fields(mine, (0, 0, 0, 1, DEVICE, 0, made["a"], 64, 0),
                                                              extent))),
        ("unknown staged", "cuMemcpy3D", _request("cuMemcpy3D", 3, 0, 0, _copy_fields(mine, mine, extent))),
        ("rows with no staged side", "cuMemcpy3D", _request("cuMemcpy3D", 0, 0, 4, _copy_fields(mine, mine, extent),
                                                            bytes(4))),
        ("part past the rows", "cuMemcpy3D", _request("cuMemcpy3D", 1, 200, 100, _copy_fields(staged, mine, extent),
                                                      bytes(100))),
        ("tail not the part", "cuMemcpy3D", _request("cuMemcpy3D", 1, 0, 256, _copy_fields(staged, mine, extent),
                                                     bytes(255))),
        ("rows sent to a destination", "cuMemcpy3D", _request("cuMemcpy3D", 2, 0, 256,
                                                              _copy_fields(mine, staged, extent), bytes(256))),
        ("a part beyond a record", "cuMemcpy3D", _request("cuMemcpy3D", 2, 0, MAX_STAGED_PART + 1,
                                                          _copy_fields(mine, staged, (1 << 20, 1 << 20, 1)))),
        ("a huge part", "cuMemcpy3D", _request("cuMemcpy3D", 2, 0, 1 << 60,
                                               _copy_fields(mine, staged, (1 << 30, 1 << 30, 1 << 4)))),
        ("an empty part of rows", "cuMemcpy3D", _request("cuMemcpy3D", 2, 0, 0, _copy_fields(mine, staged, extent))),
    ]:
        reply = a.reply(name, payload)
        assert reply.status == Status.MALFORMED, (label, reply)
    assert _driver_calls(journal) == []


def test_a_part_of_a_copy_the_driver_would_refuse_is_refused_whole(sessions: Any) -> None:
    """A record carrying a part of a larger copy shows the driver only its boxes: the whole copy's geometry is held to
    cuda.h's rules first (here the device pitch is below XInBytes + WidthInBytes), before any byte moves."""
    _driver, a, _b, made, journal = sessions
    narrow = (8, 0, 0, 0, DEVICE, 0, made["a"], 64, 0)  # x 8 + width 60 > pitch 64
    staged = (0, 0, 0, 0, HOST, 0, 0, 0, 0)
    whole = _copy_fields(staged, narrow, (60, 8, 1))
    assert a.reply("cuMemcpy3D", _request("cuMemcpy3D", 1, 120, 120, whole, bytes(120))).status == INVALID_VALUE
    assert _driver_calls(journal) == []
    assert a.reply("cuMemcpy3D", _request("cuMemcpy3D", 1, 0, 480, whole, bytes(480))).status == INVALID_VALUE
    assert _driver_calls(journal) == ["cuMemcpy3D"], "a whole copy in one record: the driver's own refusal"


def test_a_part_copies_exactly_its_rows(sessions: Any) -> None:
    """Parts of a staged copy, in any order, land where the whole copy puts them (the reference: numpy)."""
    driver, a, _b, made, _journal = sessions
    extent, pitch, rows = (37, 5, 3), 48, 6
    device = (3, 1, 0, 0, DEVICE, 0, made["a"], pitch, rows)
    staged = (0, 0, 0, 0, HOST, 0, 0, 0, 0)
    total = extent[0] * extent[1] * extent[2]
    data = pattern(total, 7).tobytes()
    cuts = [0, 1, 36, 37, 80, 185, 186, 400, 555]
    for start, end in zip(cuts, cuts[1:], strict=False):  # a part at each kind of boundary
        payload = _request("cuMemcpy3D", 1, start, end - start, _copy_fields(staged, device, extent), data[start:end])
        assert a.reply("cuMemcpy3D", payload).status == SUCCESS
    size = (rows * (extent[2] - 1) + 1 + extent[1] - 1) * pitch + 3 + extent[0] + 64
    span = driver._span(made["a"], size)
    assert span is not None
    got = np.frombuffer(bytes(span[0][span[1]:span[1] + size]), dtype=np.uint8)
    want = np.zeros(size, dtype=np.uint8)
    side = {"x": 3, "y": 1, "z": 0, "pitch": pitch, "height": rows}
    _rows(want, side, extent)[...] = np.frombuffer(data, dtype=np.uint8).reshape(extent[2], extent[1], extent[0])
    assert got.tobytes() == want.tobytes()
    back = a.reply("cuMemcpy3D", _request("cuMemcpy3D", 2, 40, 300, _copy_fields(device, staged, extent)))
    assert back.status == SUCCESS and bytes(back.payload) == data[40:340]  # type: ignore[arg-type]


def test_a_capturing_stream_captures_device_copies_and_refuses_staged_ones(sessions: Any) -> None:
    """A staged copy's rows are in a buffer of the host's that is gone when the call returns, so it never becomes a
    graph node: it synchronises its stream first, which a capture refuses (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and
    which invalidates the capture, as the executor's pageable copies do. A copy between device memories is captured."""
    _driver, a, _b, made, _journal = sessions
    (stream,) = a.ok("cuStreamCreate", 0)
    mine = (0, 0, 0, 0, DEVICE, 0, made["a"], 64, 0)
    other = (0, 8, 0, 0, DEVICE, 0, made["a"], 64, 0)
    staged = (0, 0, 0, 0, HOST, 0, 0, 0, 0)
    a.ok("cuStreamBeginCapture", stream, 0)
    device = _request("cuMemcpy3DAsync", 0, 0, 0, _copy_fields(mine, other, (64, 4, 1)), stream=stream)
    assert a.reply("cuMemcpy3DAsync", device).status == SUCCESS
    (graph,) = a.ok("cuStreamEndCapture", stream)
    assert a.ok("cuGraphGetNodes", graph, 0)[0] == 1, "the device copy is the graph's node"
    a.ok("cuStreamBeginCapture", stream, 0)
    rows = _request("cuMemcpy2DAsync", 1, 0, 256, _copy_fields(staged, mine, (64, 4, 1)), bytes(256), stream=stream)
    assert a.reply("cuMemcpy2DAsync", rows).status == 900  # CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    assert a.reply("cuStreamEndCapture", CALLS["cuStreamEndCapture"].request.encode(stream)).status == 901


@pytest.mark.parametrize("seed", range(6))
def test_boxes_tile_a_part_exactly(seed: int) -> None:
    """The host's decomposition (what bounds every driver call to the host's own buffer): boxes in order, each a
    rectangle inside the copy, together exactly the part's bytes."""
    chance = random.Random(seed)
    for _ in range(300):
        extent = (chance.randint(1, 9), chance.randint(1, 5), chance.randint(1, 4))
        total = extent[0] * extent[1] * extent[2]
        offset = chance.randint(0, total - 1)
        length = chance.randint(1, total - offset)
        covered: list[int] = []
        for column, row, slice_, width, height, depth in boxes(extent, offset, length):
            assert column + width <= extent[0] and row + height <= extent[1] and slice_ + depth <= extent[2]
            assert (height == depth == 1) or column == 0 and width == extent[0]
            assert depth == 1 or (row == 0 and height == extent[1])
            covered += [((slice_ + k) * extent[1] + row + j) * extent[0] + column + i
                        for k in range(depth) for j in range(height) for i in range(width)]
        assert covered == list(range(offset, offset + length)), (extent, offset, length)
        assert len(boxes(extent, offset, length)) <= 5


def test_the_guests_part_is_the_hosts_limit() -> None:
    text = (NATIVE / "structured_copies.c").read_text()
    match = re.search(r"PART_BYTES = (\d+) << (\d+)", text)
    assert match and int(match.group(1)) << int(match.group(2)) == MAX_STAGED_PART


# --- the GPU program, on the fake driver directly and through the native library ---------------------------------

def _program() -> Any:
    spec = importlib.util.spec_from_file_location("structured_copy_program", PROGRAM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_program_agrees_on_the_fake_driver_and_through_the_native_library(library: Path, rig: Rig) -> None:
    direct = _program().run(FakeDriver(devices=1))
    done = subprocess.run([sys.executable, str(PROGRAM)], env=native_child_env(library, rig.path),
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-4000:]
    forwarded = json.loads(next(line for line in done.stdout.splitlines()
                                if line.startswith("RESULT "))[len("RESULT "):])
    assert forwarded == direct
    refused = direct["statuses"].pop("device pitch below the width")
    assert refused == INVALID_VALUE and set(direct["statuses"].values()) == {SUCCESS}
    assert all(direct["same"].values()), direct["same"]


WRITTEN_BEFORE_SCRIPT = CHILD % {"small": SMALL} + r"""
import time
lib.cuMemcpyDtoHAsync.argtypes = [P, c_uint64, c_size_t, P]
lib.cuLaunchHostFunc.argtypes = [P, P, P]
setup()
stream = c_void_p()
assert lib.cuStreamCreate(byref(stream), 0) == 0  # blocking: the legacy stream waits for it
rows = {"src": {"mem": "host", "x": 0, "y": 0, "pitch": 64}, "dst": {"mem": "device", "x": 0, "y": 0, "pitch": 64},
        "extent": [64, 4, 1], "call": "cuMemcpy2D"}
out = {}
# a copy into page-locked memory, then a 2D copy from it (relayed, the pool side is staged: read in the guest)
out["landed"], out["pool"] = [], []
for seed in (7, 17):  # (the first pool side waits for the host's word on it; the second is staged at once)
    source = place("device", 256, seed)
    pinned = place("pool", 256, seed + 1)
    target = place("device", 256, seed + 2)
    out["landed"].append(lib.cuMemcpyDtoHAsync(pinned, source, 256, stream))
    out["pool"].append([copy(rows, pinned, target), read("device", target, 256) == read("device", source, 256)])
# a host function writes pageable rows, then a 2D copy from them
HOSTFN = ctypes.CFUNCTYPE(None, c_void_p)
data = ctypes.create_string_buffer(b"\x01" * 256, 256)
def slow(_data):
    time.sleep(0.2)
    ctypes.memmove(data, b"\x02" * 256, 256)
fn = HOSTFN(slow)
out["queued"] = lib.cuLaunchHostFunc(None, fn, None)
out["pageable"] = [copy(rows, ctypes.addressof(data), target), read("device", target, 256) == b"\x02" * 256]
assert lib.cuCtxSynchronize() == 0
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("relayed", [False, True], ids=["local", "relayed"])
def test_a_copy_reads_what_work_queued_before_it_wrote(library: Path, start: Callable[..., Rig],
                                                       relayed: bool) -> None:
    """A synchronous 2D copy reads its source after the work queued before it, as the driver does: an async copy
    into page-locked memory (relayed, where that side is staged and read in the guest, the copy waits for the stream
    first) and a host function writing pageable rows (structured_copies.c, `settle`)."""
    if relayed and relay_net.why_not():
        pytest.skip(relay_net.why_not())
    out = _run(library, start(relayed=relayed), WRITTEN_BEFORE_SCRIPT)
    assert out == {"landed": [0, 0], "pool": [[0, True], [0, True]], "queued": 0, "pageable": [0, True]}
