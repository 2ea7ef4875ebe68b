"""The native guest driver's hand-written module, library, launch and occupancy calls (guest_runtime/native/
module_calls.c, module_image.c, param_layouts.c, launch_calls.c, occupancy_calls.c) against a real agent: the
driver built with the system compiler, loaded with ctypes in a subprocess whose ORION_SHM names the rig's region
(tests/forwarding_rig.py: a RegionServer whose sessions run the CUDA executor over the fake driver). What reached
the "driver" is read from the fake's journal: the image bytes, the JIT options, the packed parameter bytes of each
launch. CPU only."""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.forwarding_rig import Rig, bounded, native_child_env, rig, start  # noqa: F401 (fixtures)
from tests.unit.test_forwarding_roundtrip import fatbin, minimal_elf

REPO = Path(__file__).resolve().parents[2]
SUCCESS, INVALID_VALUE, NOT_INITIALIZED, INVALID_IMAGE, NOT_FOUND, NOT_SUPPORTED = 0, 1, 3, 200, 500, 801

# Small enough for one ring slot (480 bytes): the fake parses `.entry` parameters and `.global`s for real.
PTX = b"""\
.version 8.0
.target sm_90
.address_size 64
.global .align 4 .b8 counter[16];
.visible .entry mix(.param .u64 mix_0, .param .s32 mix_1, .param .u8 mix_2, .param .f64 mix_3,
    .param .align 8 .b8 mix_4[12])
{
ret;
}
.visible .entry noargs()
{
ret;
}
.visible .entry wide(.param .u32 wide_0, .param .align 8 .b8 wide_1[3000])
{
ret;
}
"""
# What cuFuncGetParamInfo answers for `mix` (PTX alignment): (offset, size) per parameter; bytes 13-15 are padding.
MIX_LAYOUT = [(0, 8), (8, 4), (12, 1), (16, 8), (24, 12)]
MIX_VALUES = [struct.pack("<Q", 0x7F10_0000_1000), struct.pack("<i", -7), b"\x5a", struct.pack("<d", 0.125),
              bytes(range(1, 13))]


def packed(values: list[bytes] = MIX_VALUES) -> bytes:
    buffer = bytearray(max(o + s for o, s in MIX_LAYOUT))
    for (offset, size), value in zip(MIX_LAYOUT, values, strict=True):
        buffer[offset:offset + size] = value
    return bytes(buffer)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# Run in the subprocess: the library, a context, and helpers; each test appends its body, which fills `out`.
PRELUDE = r"""
import ctypes, json, mmap, struct, sys, threading
from ctypes import byref, c_int, c_uint, c_size_t, c_uint64, c_void_p, c_double, c_uint8, addressof
lib = ctypes.CDLL(sys.argv[1])
PTX = bytes.fromhex(sys.argv[2])
out = {}
U = c_uint
lib.cuModuleGetFunction.argtypes = [c_void_p, c_void_p, ctypes.c_char_p]
lib.cuModuleGetGlobal.argtypes = [c_void_p, c_void_p, c_void_p, ctypes.c_char_p]
lib.cuLibraryGetKernel.argtypes = [c_void_p, c_void_p, ctypes.c_char_p]
lib.cuLibraryGetGlobal.argtypes = [c_void_p, c_void_p, c_void_p, ctypes.c_char_p]
lib.cuModuleLoadData.argtypes = [c_void_p, c_void_p]
lib.cuModuleLoadDataEx.argtypes = [c_void_p, c_void_p, c_uint, c_void_p, c_void_p]
lib.cuLibraryLoadData.argtypes = [c_void_p, c_void_p, c_void_p, c_void_p, c_uint, c_void_p, c_void_p, c_uint]
lib.cuLaunchKernel.argtypes = [c_void_p, U, U, U, U, U, U, U, c_void_p, c_void_p, c_void_p]
lib.cuLaunchCooperativeKernel.argtypes = [c_void_p, U, U, U, U, U, U, U, c_void_p, c_void_p]
lib.cuLaunchKernelEx.argtypes = [c_void_p, c_void_p, c_void_p, c_void_p]
CALLBACK = ctypes.CFUNCTYPE(c_size_t, c_int)
for name in ("cuOccupancyMaxPotentialBlockSize", "cuOccupancyMaxPotentialBlockSizeWithFlags"):
    getattr(lib, name).argtypes = [c_void_p, c_void_p, c_void_p, c_void_p, c_size_t, c_int] + (
        [c_uint] if name.endswith("Flags") else [])

class Config(ctypes.Structure):  # cuda.h's CUlaunchConfig
    _fields_ = [("gridDimX", c_uint), ("gridDimY", c_uint), ("gridDimZ", c_uint), ("blockDimX", c_uint),
                ("blockDimY", c_uint), ("blockDimZ", c_uint), ("sharedMemBytes", c_uint), ("hStream", c_void_p),
                ("attrs", c_void_p), ("numAttrs", c_uint)]

def load(image):
    holder = ctypes.create_string_buffer(image, len(image))
    module = c_void_p()
    return lib.cuModuleLoadData(byref(module), holder), module.value

def function(module, name):
    handle = c_void_p()
    assert lib.cuModuleGetFunction(byref(handle), module, name) == 0, name
    return handle.value

def launch(f, params=None, extra=None, grid=(1, 1, 1), block=(32, 1, 1), shared=0, stream=None):
    return lib.cuLaunchKernel(f, *grid, *block, shared, stream, params, extra)

class Mix:  # kernelParams for `mix`: u64, s32, u8, f64, .b8[12]
    def __init__(self):
        self.values = [c_uint64(0x7F1000001000), c_int(-7), c_uint8(0x5A), c_double(0.125),
                       (c_uint8 * 12)(*range(1, 13))]
        self.params = (c_void_p * 5)(*[addressof(v) for v in self.values])

assert lib.cuInit(0) == 0
context = c_void_p()
assert lib.cuDevicePrimaryCtxRetain(byref(context), 0) == 0
assert lib.cuCtxSetCurrent(context) == 0
"""
EPILOGUE = r"""
print("RESULT " + json.dumps(out))
"""


def run(library: Path, rig: Rig, body: str) -> tuple[dict[str, Any], str]:  # noqa: F811
    """The body after PRELUDE in a fresh process speaking to the rig's agent: its `out`, and its stderr."""
    env = native_child_env(library, rig.path)
    done = subprocess.run([sys.executable, "-c", PRELUDE + body + EPILOGUE, str(library), PTX.hex()], env=env,
                          capture_output=True, text=True, timeout=50, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), done.stderr


def launches(rig: Rig, name: str = "cuLaunchKernel") -> list[dict[str, Any]]:  # noqa: F811
    return [e["launch"] for e in rig.entries(name=name) if "launch" in e]


def handle(value: Any) -> int:
    """A journal value as a number: handle objects and enum members are [type, value]."""
    return value[1] if isinstance(value, list) else value


def test_module_function_global_and_a_launch_packed_by_the_functions_layout(library: Path, rig: Rig) -> None:  # noqa: F811
    body = r"""
status, module = load(PTX + b"\0" + b"\x01garbage after the NUL" * 8)
out["load"] = status
mix = function(module, b"mix")
out["mix"] = mix
cell = c_void_p(0x5A5A)
out["nosuch"] = [lib.cuModuleGetFunction(byref(cell), module, b"nosuch"), cell.value]
out["null_out"] = lib.cuModuleGetFunction(None, module, b"mix")
out["null_name"] = lib.cuModuleGetFunction(byref(cell), module, None)
pointer, size = c_uint64(), c_size_t()
out["global"] = [lib.cuModuleGetGlobal(byref(pointer), byref(size), module, b"counter"), size.value]
out["global_null_outputs"] = lib.cuModuleGetGlobal(None, None, module, b"counter")
args = Mix()
out["first"] = launch(mix, args.params, grid=(4, 2, 1), block=(128, 1, 1), shared=256)
args.values[1].value = 99
out["second"] = launch(mix, args.params)
holes = (c_void_p * 5)(*args.params)
holes[3] = None
out["null_entry"] = launch(mix, holes)
noargs = function(module, b"noargs")
out["noargs"] = launch(noargs)
out["noargs_empty_array"] = launch(noargs, (c_void_p * 1)())
out["sync"] = lib.cuCtxSynchronize()
"""
    out, _ = run(library, rig, body)
    assert out["load"] == SUCCESS and out["sync"] == SUCCESS
    (loaded,) = rig.entries(name="cuModuleLoadData")
    assert loaded["image"]["len"] == len(PTX) + 1 and loaded["image"]["sha256"] == sha(PTX + b"\0")
    assert out["nosuch"] == [NOT_FOUND, 0x5A5A]  # the output untouched on failure
    assert out["null_out"] == INVALID_VALUE and out["null_name"] == INVALID_VALUE
    looked_up = [e["args"][1]["hex"] for e in rig.entries(name="cuModuleGetFunction")]
    assert looked_up == [b"mix".hex(), b"nosuch".hex(), b"noargs".hex()]  # NUL-free names; NULLs never sent
    assert out["global"] == [SUCCESS, 16] and out["global_null_outputs"] == SUCCESS

    infos = rig.entries(name="cuFuncGetParamInfo")
    mix_infos = [e for e in infos if e["args"][0] == out["mix"]]
    assert [e["args"][1] for e in mix_infos] == [0, 1, 2, 3, 4, 5], "asked once per function, up to the end"
    assert [(e["result"][1], e["result"][2]) for e in mix_infos[:-1]] == MIX_LAYOUT
    assert handle(mix_infos[-1]["result"][0]) == INVALID_VALUE  # past the last parameter
    assert out["first"] == out["second"] == SUCCESS and out["null_entry"] == INVALID_VALUE

    first, second, *rest = launches(rig)
    assert (first["function"], first["grid"], first["block"], first["shared"]) == (out["mix"], [4, 2, 1],
                                                                                   [128, 1, 1], 256)
    assert bytes.fromhex(first["params"]) == packed()  # every value at its offset, the padding zero
    assert bytes.fromhex(second["params"]) == packed([MIX_VALUES[0], struct.pack("<i", 99), *MIX_VALUES[2:]])
    assert out["noargs"] == out["noargs_empty_array"] == SUCCESS
    assert [(r["kernel"], r["params"]) for r in rest] == [("noargs", ""), ("noargs", "")]  # a NULL entry: not sent
    assert len([e for e in infos if e["args"][0] != out["mix"]]) == 1  # noargs: asked once, with its array


def test_forgotten_layouts_are_asked_again_and_wide_or_unknown_functions(library: Path, rig: Rig) -> None:  # noqa: F811
    """orion_param_layouts_forget (what an unload must call) makes the next launch ask again; parameters past the
    stack buffer (3008 bytes, a staged record) are packed whole; a function the host does not know answers the
    layout query's error at the launch, and nothing is launched."""
    body = r"""
status, module = load(PTX + b"\0")
mix, wide = function(module, b"mix"), function(module, b"wide")
args = Mix()
out["before"] = launch(mix, args.params)
lib.orion_param_layouts_forget()
out["after"] = launch(mix, args.params)
number, blob = c_uint(0xA1B2C3D4), (c_uint8 * 3000)(*[i % 251 for i in range(3000)])
out["wide"] = launch(wide, (c_void_p * 2)(addressof(number), addressof(blob)))
out["unknown"] = launch(0xBAD0, args.params)
out["sync"] = lib.cuCtxSynchronize()
"""
    out, _ = run(library, rig, body)
    assert out["before"] == out["after"] == out["wide"] == out["sync"] == SUCCESS
    infos = [e["args"] for e in rig.entries(name="cuFuncGetParamInfo")]
    mix = infos[0][0]
    assert [i for f, i in infos if f == mix] == [0, 1, 2, 3, 4, 5] * 2, "asked again after the layouts were forgotten"
    assert out["unknown"] == 400  # CUDA_ERROR_INVALID_HANDLE, from the host's answer to the layout query
    first, second, wide = launches(rig)
    assert bytes.fromhex(first["params"]) == bytes.fromhex(second["params"]) == packed()
    assert wide["kernel"] == "wide"
    assert bytes.fromhex(wide["params"]) == struct.pack("<I", 0xA1B2C3D4) + bytes(4) + bytes(i % 251 for i in
                                                                                             range(3000))


def test_a_launch_with_extra_sends_the_buffer_it_names(library: Path, rig: Rig) -> None:  # noqa: F811
    body = r"""
status, module = load(PTX + b"\0")
mix = function(module, b"mix")
buffer = ctypes.create_string_buffer(bytes(range(36)), 36)
size = c_size_t(36)
out["extra"] = launch(mix, extra=(c_void_p * 5)(1, addressof(buffer), 2, addressof(size), 0))
short = c_size_t(20)
out["short"] = launch(mix, extra=(c_void_p * 5)(2, addressof(short), 1, addressof(buffer), 0))
out["empty_list"] = launch(mix, extra=(c_void_p * 1)(0))
out["unknown_key"] = launch(mix, extra=(c_void_p * 3)(7, 0, 0))
out["no_end"] = launch(mix, extra=(c_void_p * 128)(*([1, addressof(buffer)] * 64)))
out["size_without_buffer"] = launch(mix, extra=(c_void_p * 3)(2, addressof(size), 0))
out["buffer_without_size"] = launch(mix, extra=(c_void_p * 3)(1, addressof(buffer), 0))
huge = c_size_t(40000)
out["past_the_limit"] = launch(mix, extra=(c_void_p * 5)(1, addressof(buffer), 2, addressof(huge), 0))
out["sync"] = lib.cuCtxSynchronize()
"""
    out, _ = run(library, rig, body)
    assert out["extra"] == out["short"] == out["empty_list"] == out["sync"] == SUCCESS
    for refused in ("unknown_key", "no_end", "size_without_buffer", "buffer_without_size", "past_the_limit"):
        assert out[refused] == INVALID_VALUE, refused
    sent = [bytes.fromhex(r["params"]) for r in launches(rig)]
    assert sent == [bytes(range(36)), bytes(range(20)), b""]  # the size the program says is the size sent
    assert not rig.entries(name="cuFuncGetParamInfo"), "an extra buffer needs no layout"


def test_launch_kernel_ex_sends_its_attributes_and_cooperative_launches_arrive(library: Path, rig: Rig) -> None:  # noqa: F811
    body = r"""
status, module = load(PTX + b"\0")
mix = function(module, b"mix")
args = Mix()
raw = struct.pack("<i4x64s", 2, struct.pack("<I", 1)) + struct.pack("<i4x64s", 8, struct.pack("<i", 3))
attributes = ctypes.create_string_buffer(raw, len(raw))
config = Config(3, 2, 1, 64, 2, 1, 128, None, addressof(attributes), 2)
out["ex"] = lib.cuLaunchKernelEx(byref(config), mix, args.params, None)
plain = Config(5, 1, 1, 32, 1, 1, 0, None, None, 0)
out["ex_plain"] = lib.cuLaunchKernelEx(byref(plain), mix, args.params, None)
updatable = ctypes.create_string_buffer(struct.pack("<i4x64s", 13, b""), 72)
out["ex_updatable"] = lib.cuLaunchKernelEx(byref(Config(1, 1, 1, 32, 1, 1, 0, None, addressof(updatable), 1)), mix,
                                           args.params, None)
out["ex_null_config"] = lib.cuLaunchKernelEx(None, mix, None, None)
out["ex_null_attrs"] = lib.cuLaunchKernelEx(byref(Config(1, 1, 1, 32, 1, 1, 0, None, None, 1)), mix, None, None)
out["cooperative"] = lib.cuLaunchCooperativeKernel(mix, 2, 1, 1, 32, 1, 1, 0, None, args.params)
out["sync"] = lib.cuCtxSynchronize()
"""
    out, err = run(library, rig, body)
    assert out["ex"] == out["ex_plain"] == out["cooperative"] == out["sync"] == SUCCESS
    assert out["ex_updatable"] == NOT_SUPPORTED and err.count("cuLaunchKernelEx with a launch attribute") == 1
    assert out["ex_null_config"] == INVALID_VALUE and out["ex_null_attrs"] == INVALID_VALUE
    (with_attributes,) = launches(rig, "cuLaunchKernelEx")
    (plain,) = launches(rig)  # without attributes the host launches with cuLaunchKernel
    assert (with_attributes["grid"], with_attributes["block"], with_attributes["shared"]) == ([3, 2, 1], [64, 2, 1],
                                                                                              128)
    assert with_attributes["attributes"] == [[2, struct.pack("<I", 1).ljust(16, b"\0").hex()],
                                             [8, struct.pack("<i", 3).ljust(16, b"\0").hex()]]
    assert with_attributes["cooperative"] and bytes.fromhex(with_attributes["params"]) == packed()
    assert (plain["grid"], bytes.fromhex(plain["params"])) == ([5, 1, 1], packed())  # no attributes: a plain launch
    (cooperative,) = launches(rig, "cuLaunchCooperativeKernel")
    assert cooperative["cooperative"] and bytes.fromhex(cooperative["params"]) == packed()


def test_a_library_its_kernel_and_global_and_a_launch_of_the_kernel(library: Path, rig: Rig) -> None:  # noqa: F811
    body = r"""
image = ctypes.create_string_buffer(PTX)
handle = c_void_p()
options, values = (c_int * 1)(0), (c_void_p * 1)(40)  # CU_JIT_MAX_REGISTERS
preserved, one = (c_int * 1)(1), (c_void_p * 1)(1)  # CU_LIBRARY_BINARY_IS_PRESERVED: stays in the guest
out["load"] = lib.cuLibraryLoadData(byref(handle), image, options, values, 1, preserved, one, 1)
kernel = c_void_p()
out["kernel"] = [lib.cuLibraryGetKernel(byref(kernel), handle, b"mix"), kernel.value]
pointer, size = c_uint64(), c_size_t()
out["global"] = [lib.cuLibraryGetGlobal(byref(pointer), byref(size), handle, b"counter"), size.value]
out["global_size_only"] = [lib.cuLibraryGetGlobal(None, byref(size), handle, b"counter"), size.value]
out["no_kernel"] = lib.cuLibraryGetKernel(byref(kernel), handle, b"nosuch")
args = Mix()
out["launch"] = launch(out["kernel"][1], args.params)
out["again"] = launch(out["kernel"][1], args.params)
tables = (c_int * 1)(0)  # CU_LIBRARY_HOST_UNIVERSAL_FUNCTION_AND_DATA_TABLE: names host memory
out["host_tables"] = lib.cuLibraryLoadData(byref(handle), image, None, None, 0, tables, one, 1)
out["null_library"] = lib.cuLibraryLoadData(None, image, None, None, 0, None, None, 0)
out["null_options"] = lib.cuLibraryLoadData(byref(handle), image, None, None, 1, None, None, 0)
out["sync"] = lib.cuCtxSynchronize()
"""
    out, err = run(library, rig, body)
    assert out["load"] == SUCCESS and out["kernel"][0] == SUCCESS and out["sync"] == SUCCESS
    (loaded,) = rig.entries(name="cuLibraryLoadData")
    assert loaded["image"]["sha256"] == sha(PTX + b"\0")
    assert loaded["jit_options"] == [["CU_JIT_MAX_REGISTERS", 40]] and loaded["args"][-3:] == [None, None, 0]
    assert out["global"] == [SUCCESS, 16] and out["global_size_only"] == [SUCCESS, 16]
    assert out["no_kernel"] == NOT_FOUND
    assert out["launch"] == out["again"] == SUCCESS
    infos = rig.entries(name="cuKernelGetParamInfo")
    assert [e["args"] for e in infos] == [[out["kernel"][1], i] for i in range(6)], "a kernel's layout, once"
    assert not rig.entries(name="cuFuncGetParamInfo")
    assert [(r["function"], bytes.fromhex(r["params"])) for r in launches(rig)] == [(out["kernel"][1], packed())] * 2
    assert out["host_tables"] == NOT_SUPPORTED and "cuLibraryLoadData with a library option" in err
    assert out["null_library"] == INVALID_VALUE and out["null_options"] == INVALID_VALUE
    assert len(rig.entries(name="cuLibraryLoadData")) == 1  # the refused loads never left the guest


def test_jit_options_travel_and_log_options_are_answered_in_the_guest(library: Path, rig: Rig) -> None:  # noqa: F811
    body = r"""
image = ctypes.create_string_buffer(PTX)
log = ctypes.create_string_buffer(b"x" * 64, 64)
module = c_void_p()
# MAX_REGISTERS 40, INFO_LOG_BUFFER, INFO_LOG_SIZE 64, WALL_TIME, GENERATE_DEBUG_INFO 1
options = (c_int * 5)(0, 3, 4, 2, 11)
values = (c_void_p * 5)(40, addressof(log), 64, 0x1234, 1)
out["load"] = lib.cuModuleLoadDataEx(byref(module), image, 5, options, values)
out["after"] = [log.raw[:2].hex(), values[2] or 0, values[3] or 0]
out["none"] = lib.cuModuleLoadDataEx(byref(module), image, 0, None, None)
unsupported = (c_int * 1)(1)  # CU_JIT_THREADS_PER_BLOCK: an in-out option, not forwarded
out["unsupported"] = lib.cuModuleLoadDataEx(byref(module), image, 1, unsupported, values)
out["null_values"] = lib.cuModuleLoadDataEx(byref(module), image, 1, options, None)
out["null_module"] = lib.cuModuleLoadDataEx(None, image, 0, None, None)
"""
    out, err = run(library, rig, body)
    assert out["load"] == SUCCESS and out["none"] == SUCCESS
    assert out["after"] == ["0078", 0, 0]  # an empty log, its size 0, no wall time
    first, second = rig.entries(name="cuModuleLoadDataEx") + rig.entries(name="cuModuleLoadData")
    assert first["jit_options"] == [["CU_JIT_MAX_REGISTERS", 40], ["CU_JIT_GENERATE_DEBUG_INFO", 1]]
    assert first["image"]["sha256"] == second["image"]["sha256"] == sha(PTX + b"\0")  # no options: a plain load
    assert out["unsupported"] == NOT_SUPPORTED and "cuModuleLoadDataEx with a JIT option" in err
    assert out["null_values"] == INVALID_VALUE and out["null_module"] == INVALID_VALUE


def test_each_image_shape_ships_exactly_the_image(library: Path, rig: Rig) -> None:  # noqa: F811
    """An ELF's length comes from its headers, a fatbin's from its header, a wrapper ships the fatbin it points at:
    the bytes after an image are never sent. orion_image_size measures the same."""
    elf, fat = minimal_elf(), fatbin(PTX + b"\0")
    body = rf"""
ELF, FAT = bytes.fromhex("{elf.hex()}"), bytes.fromhex("{fat.hex()}")
out["elf"] = load(ELF + b"\xff" * 512)[0]
fat = ctypes.create_string_buffer(FAT + b"\xee" * 64, len(FAT) + 64)
module = c_void_p()
out["fatbin"] = lib.cuModuleLoadData(byref(module), fat)
wrapper = ctypes.create_string_buffer(struct.pack("<iiQQ", 0x466243B1, 1, addressof(fat), 0), 24)
out["wrapper"] = lib.cuModuleLoadData(byref(module), wrapper)
lib.orion_image_size.restype = c_size_t
lib.orion_image_size.argtypes = [c_void_p]
elf_buffer = ctypes.create_string_buffer(ELF + b"\xff" * 512)
out["sizes"] = [lib.orion_image_size(elf_buffer), lib.orion_image_size(fat), lib.orion_image_size(wrapper),
                lib.orion_image_size(ctypes.create_string_buffer(PTX + b"\0junk"))]
out["module"] = [lib.orion_module_load_image(byref(module), fat), module.value is not None]
"""
    out, _ = run(library, rig, body)
    assert out["elf"] == out["fatbin"] == out["wrapper"] == SUCCESS
    shipped = [e["image"] for e in rig.entries(name="cuModuleLoadData")]
    assert shipped[0] == {"len": len(elf), "sha256": sha(elf)}
    assert [(s["len"], s["sha256"]) for s in shipped[1:]] == [(len(fat), sha(fat))] * 3
    assert out["sizes"] == [len(elf), len(fat), 0, len(PTX) + 1]  # a wrapper is no image: locate follows it
    assert out["module"] == [SUCCESS, True]


def test_a_bad_image_is_refused_in_the_guest_without_reading_past_it(library: Path, rig: Rig) -> None:  # noqa: F811
    """Garbage, PTX without .version, and images whose headers claim bytes past the end of readable memory (a
    PROT_NONE page right after them) answer CUDA_ERROR_INVALID_IMAGE; the process survives and nothing is sent."""
    body = r"""
page = mmap.PAGESIZE
area = mmap.mmap(-1, 2 * page)
base = addressof(ctypes.c_char.from_buffer(area))
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [c_void_p, c_size_t, c_int]
assert libc.mprotect(base + page, page, 0) == 0  # PROT_NONE: reading it would kill the process

def at_the_end(data):
    ctypes.memmove(base + page - len(data), data, len(data))
    module = c_void_p()
    return lib.cuModuleLoadData(byref(module), base + page - len(data))

fat_header = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 4096)
out["truncated_fatbin"] = at_the_end(fat_header + b"\0" * 48)
out["fatbin_header_cut"] = at_the_end(fat_header[:10])
out["ptx_without_nul"] = at_the_end(b".version 8.0\n.target sm_90\n" + b"/" * 200)
elf = bytearray(64)
elf[:8] = b"\x7fELF" + bytes([2, 1, 1, 0])
struct.pack_into("<HHIQQQIHHHHHH", elf, 16, 2, 190, 1, 0, 0, 4096, 0, 64, 0, 0, 64, 3, 1)
out["elf_tables_past_the_end"] = at_the_end(bytes(elf))
out["garbage"] = load(b"\x01\x02\x03 not an image\0")[0]
out["no_version"] = load(b".target sm_90\n.entry k() { ret; }\0")[0]
out["absurd_fatbin"] = load(struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 1 << 40) + b"\0" * 64)[0]
out["wrapper_of_nothing"] = load(struct.pack("<iiQQ", 0x466243B1, 1, 0, 0))[0]
out["unmapped"] = lib.cuModuleLoadData(byref(c_void_p()), base + page)
out["null_image"] = lib.cuModuleLoadData(byref(c_void_p()), None)
out["null_module"] = lib.cuModuleLoadData(None, base)
out["library_garbage"] = lib.cuLibraryLoadData(byref(c_void_p()), ctypes.create_string_buffer(b"\x7f\x01\x02"), None,
                                               None, 0, None, None, 0)
lib.orion_image_size.restype = c_size_t
lib.orion_image_size.argtypes = [c_void_p]
out["size_of_truncated"] = lib.orion_image_size(base + page - 64)
"""
    out, err = run(library, rig, body)
    for name in ("truncated_fatbin", "fatbin_header_cut", "ptx_without_nul", "elf_tables_past_the_end", "garbage",
                 "no_version", "absurd_fatbin", "wrapper_of_nothing", "unmapped", "library_garbage"):
        assert out[name] == INVALID_IMAGE, name
    assert out["null_image"] == INVALID_VALUE and out["null_module"] == INVALID_VALUE
    assert out["size_of_truncated"] == 0
    assert "not a module image CUDA would load" in err
    assert not rig.entries(name="cuModuleLoadData") and not rig.entries(name="cuLibraryLoadData")


# Measured by both module_image.py's locate() and module_image.c's orion_image_locate, in one process, at the same
# addresses: each image followed by garbage, and ending right before a PROT_NONE page (a read one byte too far
# faults); real NVRTC images where NVRTC is installed, tests/unit/test_module_image.py's synthetic and corrupt
# ones, and a few hundred seeded mutations of a cubin's headers.
SAME_AS_PYTHON = r"""
import ctypes, json, mmap, random, struct, sys
from ctypes import byref, c_int, c_size_t, c_void_p
from guest_runtime.module_image import ImageError, locate
from tests.unit import test_module_image as t

lib = ctypes.CDLL(sys.argv[1])

class Span(ctypes.Structure):
    _fields_ = [("kind", c_int), ("start", c_void_p), ("size", c_size_t)]

lib.orion_image_locate.argtypes = [c_void_p, ctypes.POINTER(Span), ctypes.c_char_p, c_size_t]
lib.orion_image_size.argtypes = [c_void_p]
lib.orion_image_size.restype = c_size_t
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = c_void_p
libc.mmap.argtypes = [c_void_p, c_size_t, c_int, c_int, c_int, ctypes.c_long]
libc.mprotect.argtypes = [c_void_p, c_size_t, c_int]
PAGE = mmap.PAGESIZE
keep = []

def guarded(data):
    size = ((len(data) + PAGE - 1) // PAGE + 1) * PAGE
    base = libc.mmap(None, size, 3, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert libc.mprotect(base + size - PAGE, PAGE, 0) == 0
    ctypes.memmove(base + size - PAGE - len(data), data, len(data))
    return base + size - PAGE - len(data)

def followed(data):
    buffer = t.with_garbage(data)
    keep.append(buffer)
    return ctypes.addressof(buffer)

def both(address):
    try:
        span = locate(address)
        python = [span.address, span.length]
    except ImageError:
        python = None
    span, why = Span(), ctypes.create_string_buffer(256)
    native = [span.start, span.size] if lib.orion_image_locate(address, byref(span), why, 256) == 0 else None
    return python, native

images = []
try:
    for name in t.COMPILES:
        images += list(t.compiled(name))
    ptx, cubin = t.compiled("small-sm90")
except BaseException:  # no NVRTC here: pytest.skip's exception outside pytest
    ptx, cubin = None, None
real = len(images)
for is64 in (True, False):
    for big in (False, True):
        for extended in (False, True):
            for tail in (False, True):
                images.append(t.elf(is64, big, extended, tail))
base_elf = cubin or t.elf()
fatbin = t.handmade_fatbin([(2, base_elf)] + ([(1, ptx)] if ptx else []))
images += [fatbin, fatbin[:-1], fatbin[:10], base_elf[:-1], base_elf[:40], b"\0", b"\0\0\0\0\0",
           bytes(range(256)) * 4, b"hello world\0", b".version 8.0\n\x01\x02\0", b".version 8.0\n.target sm_90\n" * 10,
           b"// no code\n.version 8.0\n.target sm_90\n\0more", b".ver.version 8.0\0", b".versio\0"]
shoff, = struct.unpack_from("<Q", base_elf, 40)
for offset, fmt, value in ((40, "<Q", 1 << 40), (32, "<Q", 2 << 30), (60, "<H", 0xFFFF), (58, "<H", 1), (52, "<H", 0),
                           (4, "B", 3), (40, "<Q", len(base_elf) + 65536), (shoff + 64 + 32, "<Q", 1 << 33)):
    images.append(t._patched(base_elf, offset, fmt, value))
for offset, fmt, value in ((8, "<Q", 2 << 30), (8, "<Q", 0), (6, "<H", 0), (6, "<H", 60000),
                           (8, "<Q", len(fatbin) * 4)):
    images.append(t._patched(fatbin, offset, fmt, value))
rng = random.Random(13)
for _ in range(300):
    mutated = bytearray(base_elf)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(64) if rng.random() < 0.6 else rng.randrange(shoff, min(len(mutated), shoff + 4 * 64))
        mutated[at] = rng.randrange(256)
    images.append(bytes(mutated))

mismatches, measured = [], 0
for index, data in enumerate(images):
    for address in ((guarded(data), followed(data)) if data else (guarded(data),)):
        python, native = both(address)
        measured += python is not None
        if python != native:
            mismatches.append([index, python, native])
        size = lib.orion_image_size(address)
        if (python is not None and python[0] == address and size != python[1]) or (python is None and size):
            mismatches.append([index, "orion_image_size", python, size])
fat = followed(fatbin)
for wrapper in (t.wrapper_for(fat), t.wrapper_for(fat, version=7), t.wrapper_for(0), t.wrapper_for(fat + 1)):
    python, native = both(ctypes.addressof(wrapper))
    measured += python is not None
    if python != native:
        mismatches.append(["wrapper", python, native])
print("RESULT " + json.dumps({"cases": len(images), "real": real, "measured": measured, "mismatches": mismatches}))
"""


def test_images_are_measured_exactly_as_module_image_py_measures_them(library: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    done = subprocess.run([sys.executable, "-c", SAME_AS_PYTHON, str(library)], env=env, capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["mismatches"] == [], result["mismatches"][:10]
    assert result["cases"] > 300 and result["measured"] > 40, result  # both agree on good images, not only bad


def test_potential_block_size_with_a_callback_is_searched_in_the_guest(library: Path, rig: Rig) -> None:  # noqa: F811
    """With a callback the guest searches over forwarded occupancy queries; a constant callback must agree with
    the host's own answer for that many dynamic shared bytes."""
    body = r"""
status, module = load(PTX + b"\0")
mix = function(module, b"mix")
asked = []

@CALLBACK
def shared_memory(block):
    asked.append(block)
    return 1024

results = []
pointer = ctypes.cast(shared_memory, c_void_p)
for callback, dynamic in ((None, 1024), (pointer, 0)):
    grid, block = c_int(-1), c_int(-1)
    status = lib.cuOccupancyMaxPotentialBlockSize(byref(grid), byref(block), mix, callback, dynamic, 0)
    results.append([status, grid.value, block.value])
grid, block = c_int(-1), c_int(-1)
status = lib.cuOccupancyMaxPotentialBlockSizeWithFlags(byref(grid), byref(block), mix, pointer, 0, 256, 0)
results.append([status, grid.value, block.value])
out["results"], out["asked"] = results, asked
out["null_output"] = lib.cuOccupancyMaxPotentialBlockSize(None, byref(block), mix, None, 0, 0)
"""
    out, _ = run(library, rig, body)
    host, searched, limited = out["results"]
    assert host[0] == SUCCESS and host[2] > 0 and searched == host
    assert limited[0] == SUCCESS and 0 < limited[2] <= 256
    asked = out["asked"]
    assert asked and all(size % 32 == 0 for size in asked)
    assert rig.entries(name="cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags")  # the search's queries
    assert len(rig.entries(name="cuOccupancyMaxPotentialBlockSize")) == 1  # only the call without a callback
    assert out["null_output"] == INVALID_VALUE


def test_launches_from_threads_share_one_layout_and_each_sends_its_own_values(library: Path, rig: Rig) -> None:  # noqa: F811
    body = r"""
status, module = load(PTX + b"\0")
mix = function(module, b"mix")
results = []

def worker(number):
    assert lib.cuCtxSetCurrent(context) == 0  # a context is current per thread
    args = Mix()
    args.values[1].value = number
    results.extend(launch(mix, args.params) for _ in range(10))

threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
out["results"], out["sync"] = results, lib.cuCtxSynchronize()
"""
    out, _ = run(library, rig, body)
    assert out["results"] == [SUCCESS] * 40 and out["sync"] == SUCCESS
    sent = sorted(bytes.fromhex(r["params"]) for r in launches(rig))
    expected = sorted(packed([MIX_VALUES[0], struct.pack("<i", n), *MIX_VALUES[2:]]) for n in range(4) for _ in
                      range(10))
    assert sent == expected


def test_an_image_larger_than_a_ring_slot_is_sent_whole(library: Path, rig: Rig) -> None:  # noqa: F811
    big = PTX + b"".join(b"// padding line %06d\n" % i for i in range(5000))
    body = r"""
out["load"] = load(PTX + b"".join(b"// padding line %06d\n" % i for i in range(5000)) + b"\0")[0]
"""
    out, _ = run(library, rig, body)
    assert out["load"] == SUCCESS
    (loaded,) = rig.entries(name="cuModuleLoadData")
    assert loaded["image"] == {"len": len(big) + 1, "sha256": sha(big + b"\0")}


def test_without_an_agent_a_load_is_not_initialized(library: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    code = ("import ctypes, sys\nlib = ctypes.CDLL(sys.argv[1])\nimage = ctypes.create_string_buffer(bytes.fromhex("
            "sys.argv[2]))\nm = ctypes.c_void_p()\nprint('RESULT', lib.cuModuleLoadData(ctypes.byref(m), image), "
            "lib.cuLaunchKernel(None, 1, 1, 1, 1, 1, 1, 0, None, None, None))\n")
    done = subprocess.run([sys.executable, "-c", code, str(library), PTX.hex()], env=env, capture_output=True,
                          text=True, timeout=50, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert f"RESULT {NOT_INITIALIZED} {NOT_INITIALIZED}" in done.stdout


def test_a_c_helper_loads_through_ctypes_only(library: Path) -> None:
    """orion_image_size and orion_module_load_image are exported for the library's other parts."""
    lib = ctypes.CDLL(str(library))
    assert lib.orion_image_size and lib.orion_module_load_image and lib.orion_param_layouts_forget
