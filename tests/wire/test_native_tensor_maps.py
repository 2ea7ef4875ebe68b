"""The native guest driver's tensor-map family past the tiled map (guest_runtime/native/tensor_map.c,
host_agent/session/launch_extras.py): im2col and wide im2col maps encoded on the host and checked as tiled ones are, and
cuTensorMapReplaceAddress / cuTensorMapSetAllocationClass, which the host serves only for descriptors it encoded for
the session (`KnownTensorMaps`) and only towards memory of the session. Through the C library against a real agent
over the fake driver (tests/forwarding_rig.py); CPU only."""
from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

from host_agent.session.launch_extras import KnownTensorMaps, TensorMapFacts
from tests.fake_driver import (
    CUtensorMapDataType,
    CUtensorMapIm2ColWideMode,
    FakeDriver,
    cuuint32_t,
    cuuint64_t,
    tensor_map_bytes,
)
from tests.forwarding_rig import Rig, bounded, local_only, native_child_env, rig, start  # noqa: F401 (fixtures)
from tests.wire.test_native_stream_extras import INVALID_VALUE, SUCCESS, run

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "tests" / "gpu" / "programs" / "tensor_map_program.py"

BODY = r"""
P = c_void_p
lib.cuTensorMapEncodeTiled.argtypes = [P, c_int, c_uint, c_uint64, P, P, P, P, c_int, c_int, c_int, c_int]
lib.cuTensorMapEncodeIm2col.argtypes = [P, c_int, c_uint, c_uint64, P, P, P, P, c_uint, c_uint, P,
                                        c_int, c_int, c_int, c_int]
lib.cuTensorMapEncodeIm2colWide.argtypes = [P, c_int, c_uint, c_uint64, P, P, c_int, c_int, c_uint, c_uint, P,
                                            c_int, c_int, c_int, c_int, c_int]
lib.cuTensorMapReplaceAddress.argtypes = [P, c_uint64]
lib.cuTensorMapSetAllocationClass.argtypes = [P, c_int, P]
big, second, small = device(1 << 20), device(1 << 20), device(256)
out["addresses"] = [big, second, small]
holder = ctypes.create_string_buffer(128 * 4 + 64)
maps = [(addressof(holder) + 63) // 64 * 64 + 128 * i for i in range(4)]
def u64s(v): return (ctypes.c_uint64 * max(len(v), 1))(*v)
def u32s(v): return (c_uint * max(len(v), 1))(*v)
def i32s(v): return (c_int * max(len(v), 1))(*v)
def now(i): return ctypes.string_at(maps[i], 128).hex()
DIMS, STRIDES, STEPS = [16, 8, 8, 2], [64, 512, 4096], [1, 1, 1, 1]   # NHWC floats: 8 KiB from the base
def tiled(i, address):
    status = lib.cuTensorMapEncodeTiled(maps[i], 7, 2, address, u64s([64, 32]), u64s([256]), u32s([16, 8]),
                                        u32s([1, 1]), 0, 0, 0, 0)
    return [status, now(i)]
def im2col(i, address, dims=DIMS, rank=4, lower=(-1, -1), upper=(1, 1)):
    status = lib.cuTensorMapEncodeIm2col(maps[i], 7, rank, address, u64s(dims), u64s(STRIDES), i32s(lower),
                                         i32s(upper), 16, 32, u32s(STEPS), 0, 0, 0, 0)
    return [status, now(i)]
out["tiled"] = tiled(0, big)
out["im2col"] = im2col(1, big)
out["wide"] = [lib.cuTensorMapEncodeIm2colWide(maps[2], 7, 4, big, u64s(DIMS), u64s(STRIDES), -1, 1, 16, 32,
                                                u32s(STEPS), 0, 1, 0, 0, 0), now(2)]
out["im2col_outside"] = im2col(3, 0x7E0000001000)[0]
out["im2col_past_the_end"] = im2col(3, small)[0]          # 8 KiB do not fit 256 bytes
out["im2col_rank_2"] = im2col(3, big, dims=[16, 8], rank=2)[0]
out["im2col_driver_refuses"] = lib.cuTensorMapEncodeIm2col(maps[3], 7, 4, big, u64s(DIMS), u64s(STRIDES),
                                                           i32s([-1, -1]), i32s([1, 1]), 0, 32, u32s(STEPS),
                                                           0, 0, 0, 0)  # 0 channels per pixel
# Replace: onto a second allocation of the session, then again from the replaced map.
out["replace_tiled"] = [lib.cuTensorMapReplaceAddress(maps[0], second), now(0)]
out["direct_tiled"] = tiled(3, second)
out["replace_back"] = [lib.cuTensorMapReplaceAddress(maps[0], big), now(0)]
out["replace_im2col"] = [lib.cuTensorMapReplaceAddress(maps[1], second + 4096), now(1)]   # 8 KiB fit there
before = now(1)
out["replace_too_small"] = [lib.cuTensorMapReplaceAddress(maps[1], small), now(1) == before]
out["replace_past_end"] = lib.cuTensorMapReplaceAddress(maps[1], second + (1 << 20) - 4096)
out["replace_outside"] = lib.cuTensorMapReplaceAddress(maps[1], 0x7E0000001000)
made_up = bytes(range(128))
ctypes.memmove(maps[3], made_up, 128)
out["replace_made_up"] = [lib.cuTensorMapReplaceAddress(maps[3], second), now(3) == made_up.hex()]
ctypes.memmove(maps[3], bytes.fromhex(out["direct_tiled"][1]), 128)
ctypes.c_uint64.from_address(maps[3]).value = small   # the guest points a known map at other memory itself
out["replace_edited"] = lib.cuTensorMapReplaceAddress(maps[3], second)
out["replace_misaligned_map"] = lib.cuTensorMapReplaceAddress(maps[0] + 8, second)
out["replace_driver_refuses"] = lib.cuTensorMapReplaceAddress(maps[0], second + 8)  # not 16-byte aligned
# Allocation class.
effective = c_int(7)
out["class_auto"] = [lib.cuTensorMapSetAllocationClass(maps[0], 0, byref(effective)), effective.value, now(0)]
out["replace_after_class"] = lib.cuTensorMapReplaceAddress(maps[0], second)
effective.value = 7
out["class_large"] = [lib.cuTensorMapSetAllocationClass(maps[0], 2, byref(effective)), effective.value]
out["large_replace_near_end"] = lib.cuTensorMapReplaceAddress(maps[0], second + (1 << 20) - 64 * 1024)
out["large_replace_room"] = lib.cuTensorMapReplaceAddress(maps[0], second + (1 << 20) - 128 * 1024)
out["small_near_end"] = [lib.cuTensorMapReplaceAddress(maps[1], second + (1 << 20) - 64 * 1024), now(1)]
effective.value = 7
before = now(1)
out["class_large_no_room"] = [lib.cuTensorMapSetAllocationClass(maps[1], 2, byref(effective)), effective.value,
                              now(1) == before]
effective.value = 7
ctypes.memmove(maps[3], made_up, 128)
out["class_made_up"] = [lib.cuTensorMapSetAllocationClass(maps[3], 1, byref(effective)), effective.value]
out["class_unknown_value"] = lib.cuTensorMapSetAllocationClass(maps[0], 9, None)
out["class_no_out"] = lib.cuTensorMapSetAllocationClass(maps[0], 1, None)
"""


def fake_map(call: str, *args: object) -> bytes:
    err, tensor_map = getattr(FakeDriver(), call)(*args)
    assert int(err) == SUCCESS
    return ctypes.string_at(tensor_map.getPtr(), 128)


DIMS, STRIDES, STEPS = [16, 8, 8, 2], [64, 512, 4096], [1, 1, 1, 1]


def test_im2col_replace_and_allocation_class(library: Path, rig: Rig) -> None:  # noqa: F811
    out = run(library, rig, BODY)
    big, second, small = out["addresses"]
    u64, u32 = (lambda v: [cuuint64_t(x) for x in v]), (lambda v: [cuuint32_t(x) for x in v])
    fp32 = CUtensorMapDataType(7)
    assert out["tiled"][0] == SUCCESS
    assert out["im2col"] == [SUCCESS, fake_map("cuTensorMapEncodeIm2col", fp32, 4, big, u64(DIMS), u64(STRIDES),
                                               [-1, -1], [1, 1], 16, 32, u32(STEPS), 0, 0, 0, 0).hex()]
    assert out["wide"] == [SUCCESS, fake_map("cuTensorMapEncodeIm2colWide", fp32, 4, big, u64(DIMS), u64(STRIDES),
                                             -1, 1, 16, 32, u32(STEPS), 0, CUtensorMapIm2ColWideMode(1), 0, 0,
                                             0).hex()]
    assert out["im2col_outside"] == out["im2col_past_the_end"] == out["im2col_rank_2"] == INVALID_VALUE
    assert out["im2col_driver_refuses"] == INVALID_VALUE
    # A replace is the encoding at the new address, and its result can be replaced again.
    assert out["replace_tiled"] == [SUCCESS, out["direct_tiled"][1]]
    assert out["replace_back"] == [SUCCESS, out["tiled"][1]]
    assert out["replace_tiled"][1] == tensor_map_bytes(7, 2, second, [64, 32], [256], [16, 8], [1, 1],
                                                       [0, 0, 0, 0]).hex()
    assert out["replace_im2col"] == [SUCCESS, fake_map("cuTensorMapEncodeIm2col", fp32, 4, second + 4096, u64(DIMS),
                                                       u64(STRIDES), [-1, -1], [1, 1], 16, 32, u32(STEPS),
                                                       0, 0, 0, 0).hex()]
    # Hostile: refused before the driver, the caller's map untouched.
    assert out["replace_too_small"] == [INVALID_VALUE, True]
    assert out["replace_past_end"] == out["replace_outside"] == INVALID_VALUE
    assert out["replace_made_up"] == [INVALID_VALUE, True]
    assert out["replace_edited"] == out["replace_misaligned_map"] == INVALID_VALUE
    assert out["replace_driver_refuses"] == INVALID_VALUE
    replaced = [e["args"] for e in rig.entries(name="cuTensorMapReplaceAddress")]
    # tiled, back, im2col, the unaligned one the driver refused; after the class change; the two with room
    assert len(replaced) == 7
    # Allocation class: AUTO is SMALL on the fake, the new bytes remembered (a replace of them works).
    status, effective, after = out["class_auto"]
    assert (status, effective) == (SUCCESS, 1) and after != out["tiled"][1]
    assert out["replace_after_class"] == SUCCESS
    # LARGE: the fake's device names no minimum size (0), so the 128 KiB window: the map's reach from then on.
    assert out["class_large"] == [SUCCESS, 2]
    assert out["large_replace_near_end"] == INVALID_VALUE and out["large_replace_room"] == SUCCESS
    assert out["small_near_end"][0] == SUCCESS  # an im2col map of 8 KiB, SMALL: 64 KiB before the end suffice
    assert out["class_large_no_room"] == [INVALID_VALUE, 1, True]
    assert out["class_made_up"] == [INVALID_VALUE, 1]
    assert out["class_unknown_value"] == INVALID_VALUE and out["class_no_out"] == SUCCESS
    # AUTO, LARGE, LARGE without room (refused after the driver, on the host's copy), SMALL
    assert len(rig.entries(name="cuTensorMapSetAllocationClass")) == 4


def test_known_tensor_maps_forget_the_least_recently_used() -> None:
    known = KnownTensorMaps(limit=3)
    facts = [TensorMapFacts(0x1000 * i, 64, 64) for i in range(5)]
    for i in range(3):
        known.remember(bytes([i]) * 128, facts[i])
    assert known.facts(bytes([0]) * 128) == facts[0]  # now the most recently used
    known.remember(bytes([3]) * 128, facts[3])
    assert known.facts(bytes([1]) * 128) is None  # the least recently used went
    assert known.facts(bytes([0]) * 128) == facts[0] and len(known) == 3


def test_the_gpu_program_runs_through_the_native_driver_on_the_fake(library: Path, rig: Rig) -> None:  # noqa: F811
    """tests/gpu/programs/tensor_map_program.py, unmodified, on the native driver: the fake's results (on a GPU
    they are compared with a native run instead)."""
    done = subprocess.run([sys.executable, str(PROGRAM)], env=native_child_env(library, rig.path),
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    assert json.loads(line[len("RESULT "):]) == {
        "tiled": [SUCCESS, SUCCESS, True], "im2col": [SUCCESS, SUCCESS, True], "wide": [SUCCESS, SUCCESS, True],
        "class_small": [SUCCESS, 1], "replace_after_class": SUCCESS,
    }
