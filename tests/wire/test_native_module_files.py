"""The native guest driver's loads from a file of the guest (guest_runtime/native/module_calls.c: cuModuleLoad,
cuLibraryLoadFromFile) and cuModuleLoadFatBinary, against a real agent with the fake driver (tests/forwarding_rig.py;
the fake parses PTX's `.entry` kernels and `.global`s for real). The guest reads the file and loads its bytes as
cuModuleLoadData does, so what reaches the "driver" (the fake's journal: the image's length and SHA-256) is the
same load either way. CPU only."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.forwarding_rig import Rig, native_child_env, rig, start  # noqa: F401 (fixtures)
from tests.unit.test_forwarding_roundtrip import fatbin, minimal_elf

REPO = Path(__file__).resolve().parents[2]
SUCCESS, INVALID_VALUE, NOT_INITIALIZED, INVALID_IMAGE = 0, 1, 3, 200
FILE_NOT_FOUND, NOT_FOUND, NOT_SUPPORTED = 301, 500, 801

# As a file: no NUL (the guest adds one, as cuModuleLoadData's PTX string ends).
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
"""
MIX_LAYOUT = [[0, 8], [8, 4], [12, 1], [16, 8], [24, 12]]  # cuFuncGetParamInfo's (offset, size) per parameter

PRELUDE = r"""
import ctypes, json, os, struct, sys, threading
from ctypes import byref, c_int, c_size_t, c_uint, c_uint64, c_void_p, c_char_p
lib = ctypes.CDLL(sys.argv[1])
PTX = bytes.fromhex(sys.argv[2])
out = {}
lib.cuModuleLoad.argtypes = [c_void_p, c_char_p]
lib.cuModuleLoadData.argtypes = [c_void_p, c_void_p]
lib.cuModuleLoadFatBinary.argtypes = [c_void_p, c_void_p]
lib.cuLibraryLoadFromFile.argtypes = [c_void_p, c_char_p, c_void_p, c_void_p, c_uint, c_void_p, c_void_p, c_uint]
lib.cuModuleGetFunction.argtypes = [c_void_p, c_void_p, c_char_p]
lib.cuModuleGetGlobal.argtypes = [c_void_p, c_void_p, c_void_p, c_char_p]
lib.cuLibraryGetKernel.argtypes = [c_void_p, c_void_p, c_char_p]
lib.cuLibraryGetGlobal.argtypes = [c_void_p, c_void_p, c_void_p, c_char_p]
lib.cuFuncGetParamInfo.argtypes = [c_void_p, c_size_t, c_void_p, c_void_p]
lib.cuMemcpyHtoD.argtypes = [c_uint64, c_void_p, c_size_t]
lib.cuMemcpyDtoH.argtypes = [c_void_p, c_uint64, c_size_t]

def from_file(path):
    module = c_void_p(0x5A5A)
    status = lib.cuModuleLoad(byref(module), path.encode() if isinstance(path, str) else path)
    return status, module.value

def from_memory(image):
    holder = ctypes.create_string_buffer(image, len(image))
    module = c_void_p()
    return lib.cuModuleLoadData(byref(module), holder), module.value

def layout(function):  # cuFuncGetParamInfo up to the first refusal
    found = []
    for index in range(16):
        offset, size = c_size_t(), c_size_t()
        if lib.cuFuncGetParamInfo(function, index, byref(offset), byref(size)) != 0:
            return found
        found.append([offset.value, size.value])
    return found

def function(module, name):
    handle = c_void_p()
    status = lib.cuModuleGetFunction(byref(handle), module, name)
    return status, handle.value

def global_bytes(module, name):
    pointer, size = c_uint64(), c_size_t()
    status = lib.cuModuleGetGlobal(byref(pointer), byref(size), module, name)
    if status:
        return [status]
    data = ctypes.create_string_buffer(size.value)
    return [status, size.value, lib.cuMemcpyDtoH(data, pointer.value, size.value), data.raw.hex(), pointer.value]

if os.environ.get("INIT", "1") == "1":
    assert lib.cuInit(0) == 0
    context = c_void_p()
    assert lib.cuDevicePrimaryCtxRetain(byref(context), 0) == 0
    assert lib.cuCtxSetCurrent(context) == 0
"""
EPILOGUE = r"""
print("RESULT " + json.dumps(out))
"""


def run(library: Path, rig: Rig, body: str, *args: str, init: bool = True) -> tuple[dict[str, Any], str]:  # noqa: F811
    """The body after PRELUDE in a fresh process speaking to the rig's agent (argv[3:] are `args`): its `out` and
    its stderr."""
    env = native_child_env(library, rig.path) | {"INIT": "1" if init else "0"}
    done = subprocess.run([sys.executable, "-c", PRELUDE + body + EPILOGUE, str(library), PTX.hex(), *args], env=env,
                          capture_output=True, text=True, timeout=50, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), done.stderr


def shipped(rig: Rig, name: str = "cuModuleLoadData") -> list[tuple[int, str]]:  # noqa: F811
    """The images the driver got for `name` (a file's load arrives as the memory load): (length, SHA-256)."""
    return [(e["image"]["len"], e["image"]["sha256"]) for e in rig.entries(name=name) if "image" in e]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_ptx_file_loads_as_its_bytes_loaded_from_memory_do(library: Path, rig: Rig, tmp_path: Path) -> None:  # noqa: F811
    """cuModuleLoad of a PTX file (no NUL in it) sends the driver exactly what cuModuleLoadData sends for its bytes
    with their NUL, and the module's kernels, parameter layouts and globals are the same; its global is device
    memory the program can write and read back."""
    path = tmp_path / "kernels.ptx"
    path.write_bytes(PTX)
    body = r"""
path = sys.argv[3]
out["file"], by_file = from_file(path)
out["memory"], by_memory = from_memory(PTX + b"\0")
out["functions"] = [function(m, b"mix")[0] for m in (by_file, by_memory)]
out["layouts"] = [layout(function(m, b"mix")[1]) for m in (by_file, by_memory)]
out["noargs"] = [layout(function(m, b"noargs")[1]) for m in (by_file, by_memory)]
out["nosuch"] = function(by_file, b"nosuch")[0]
out["globals"] = [global_bytes(m, b"counter")[:4] for m in (by_file, by_memory)]
pointer = global_bytes(by_file, b"counter")[4]
written = bytes(range(0x40, 0x50))
out["write"] = lib.cuMemcpyHtoD(pointer, written, 16)
out["read_back"] = global_bytes(by_file, b"counter")[3] == written.hex()
out["distinct"] = by_file != by_memory and by_file is not None
"""
    out, _ = run(library, rig, body, str(path))
    assert out["file"] == out["memory"] == SUCCESS and out["distinct"]
    assert shipped(rig) == [(len(PTX) + 1, sha(PTX + b"\0"))] * 2  # the file's bytes and a NUL, as from memory
    assert out["functions"] == [SUCCESS, SUCCESS] and out["nosuch"] == NOT_FOUND
    assert out["layouts"] == [MIX_LAYOUT, MIX_LAYOUT] and out["noargs"] == [[], []]
    assert out["globals"] == [[SUCCESS, 16, SUCCESS, "00" * 16]] * 2
    assert out["write"] == SUCCESS and out["read_back"]


def test_each_image_shape_from_a_file_ships_exactly_the_image(library: Path, rig: Rig, tmp_path: Path) -> None:  # noqa: F811
    """A cubin's extent comes from its headers and a fatbin's from its header, as from memory: bytes after the image
    in the file are never sent. A file read through a pipe (no size to ask first; larger than the first buffer, and
    than IMAGE_BY_DIGEST_MIN) arrives whole."""
    elf, fat = minimal_elf(b"mix"), fatbin(PTX + b"\0")
    big = PTX + b"".join(b"// padding line %06d\n" % i for i in range(8000))  # ~190 KiB
    (tmp_path / "kernel.cubin").write_bytes(elf + b"\xff" * 300)
    (tmp_path / "kernel.fatbin").write_bytes(fat + b"\xee" * 40)
    (tmp_path / "big.ptx").write_bytes(big)
    body = r"""
base = sys.argv[3]
out["cubin"] = from_file(base + "/kernel.cubin")[0]
out["fatbin"], module = from_file(base + "/kernel.fatbin")
out["fatbin_kernel"] = function(module, b"mix")[0]
with open(base + "/big.ptx", "rb") as f:
    big = f.read()
read, write = os.pipe()

def feed():
    try:
        os.write(write, big)
    except OSError:  # the load stopped reading: the read end closed below
        pass
    os.close(write)

feeder = threading.Thread(target=feed)
feeder.start()
out["pipe"] = from_file("/proc/self/fd/%d" % read)[0]
os.close(read)
feeder.join()
out["regular_big"] = from_file(base + "/big.ptx")[0]
"""
    out, _ = run(library, rig, body, str(tmp_path))
    assert out["cubin"] == out["fatbin"] == out["fatbin_kernel"] == out["pipe"] == out["regular_big"] == SUCCESS
    assert shipped(rig) == [(len(elf), sha(elf)), (len(fat), sha(fat))] + [(len(big) + 1, sha(big + b"\0"))] * 2


def test_files_that_are_not_images_are_refused_as_their_bytes_are(library: Path, rig: Rig, tmp_path: Path) -> None:  # noqa: F811
    """Garbage and an empty file answer what cuModuleLoadData answers for those bytes (INVALID_IMAGE). A file whose
    headers claim more than it holds is refused without shipping the memory after the buffer, and a file holding a
    fatbin wrapper (a pointer: here to a fatbin the process holds, which a load from memory would follow) without
    following it. Nothing reaches the driver."""
    elf, wrapped = minimal_elf(), fatbin(PTX + b"\0")
    files = {"garbage": b"\x01\x02\x03 not an image", "empty": b"", "no_version": b".target sm_90\n",
             "truncated_elf": elf[:-8], "truncated_fatbin": wrapped[:-5]}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    body = rf"""
base = sys.argv[3]
for name in json.loads(sys.argv[4]):
    out[name] = from_file(base + "/" + name)
fat = ctypes.create_string_buffer(bytes.fromhex("{wrapped.hex()}"))
wrapper = struct.pack("<iiQQ", 0x466243B1, 1, ctypes.addressof(fat), 0)
with open(base + "/wrapper", "wb") as f:
    f.write(wrapper)
out["wrapper"] = from_file(base + "/wrapper")
out["memory_garbage"] = from_memory(b"\x01\x02\x03 not an image\0")[0]
"""
    out, err = run(library, rig, body, str(tmp_path), json.dumps(list(files)))
    for name in [*files, "wrapper"]:
        assert out[name] == [INVALID_IMAGE, 0x5A5A], name  # the output untouched
    assert out["memory_garbage"] == INVALID_IMAGE
    assert "truncated_elf is truncated: its image claims 320 bytes, the file has 312" in err, err
    assert "truncated_fatbin is truncated" in err and "holds a fatbin wrapper (a pointer)" in err, err
    assert not rig.entries(name="cuModuleLoadData")


def test_a_missing_file_and_null_arguments(library: Path, rig: Rig, tmp_path: Path) -> None:  # noqa: F811
    """A file that cannot be opened or read is CUDA_ERROR_FILE_NOT_FOUND (a directory opens but does not read);
    NULL arguments CUDA_ERROR_INVALID_VALUE. Nothing is sent."""
    body = r"""
base = sys.argv[3]
out["missing"] = from_file(base + "/no-such-file.cubin")
out["directory"] = from_file(base)[0]
out["empty_name"] = from_file("")[0]
out["null_module"] = lib.cuModuleLoad(None, (base + "/x").encode())
out["null_name"] = lib.cuModuleLoad(byref(c_void_p()), None)
library = c_void_p()
out["library_missing"] = lib.cuLibraryLoadFromFile(byref(library), (base + "/nothing").encode(), None, None, 0, None,
                                                   None, 0)
out["library_null"] = lib.cuLibraryLoadFromFile(None, (base + "/nothing").encode(), None, None, 0, None, None, 0)
out["library_null_name"] = lib.cuLibraryLoadFromFile(byref(library), None, None, None, 0, None, None, 0)
out["library_null_options"] = lib.cuLibraryLoadFromFile(byref(library), (base + "/nothing").encode(), None, None, 1,
                                                        None, None, 0)
out["fatbinary_null"] = [lib.cuModuleLoadFatBinary(None, ctypes.create_string_buffer(PTX)),
                         lib.cuModuleLoadFatBinary(byref(c_void_p()), None)]
out["proc_address"] = []  # what the runtime looks up is these definitions, not the generated 801 stubs
for name in ("cuModuleLoad", "cuModuleLoadFatBinary", "cuLibraryLoadFromFile"):
    entry = c_void_p()
    lib.cuGetProcAddress_v2(name.encode(), byref(entry), 13000, ctypes.c_uint64(0), byref(c_int()))
    out["proc_address"].append(entry.value == ctypes.cast(getattr(lib, name), c_void_p).value)
"""
    out, _ = run(library, rig, body, str(tmp_path))
    assert out["missing"] == [FILE_NOT_FOUND, 0x5A5A]
    assert out["directory"] == out["empty_name"] == out["library_missing"] == FILE_NOT_FOUND
    assert out["null_module"] == out["null_name"] == INVALID_VALUE
    assert out["library_null"] == out["library_null_name"] == out["library_null_options"] == INVALID_VALUE
    assert out["fatbinary_null"] == [INVALID_VALUE, INVALID_VALUE]
    assert out["proc_address"] == [True, True, True]
    assert not rig.entries(name="cuModuleLoadData") and not rig.entries(name="cuLibraryLoadData")


def test_before_cuinit_a_file_load_is_not_initialized(library: Path, rig: Rig, tmp_path: Path) -> None:  # noqa: F811
    """As every call before cuInit: the file is not even looked for."""
    path = tmp_path / "kernels.ptx"
    path.write_bytes(PTX)
    body = r"""
out["module"] = from_file(sys.argv[3])[0]
out["missing"] = from_file(sys.argv[3] + ".missing")[0]
out["library"] = lib.cuLibraryLoadFromFile(byref(c_void_p()), sys.argv[3].encode(), None, None, 0, None, None, 0)
"""
    out, _ = run(library, rig, body, str(path), init=False)
    assert out == {"module": NOT_INITIALIZED, "missing": NOT_INITIALIZED, "library": NOT_INITIALIZED}


def test_a_library_from_a_file_its_kernel_and_global(library: Path, rig: Rig, tmp_path: Path) -> None:  # noqa: F811
    """cuLibraryLoadFromFile sends what cuLibraryLoadData sends for the file's bytes, with the same JIT options;
    CU_LIBRARY_BINARY_IS_PRESERVED is invalid with a file (cuda.h), a host table option is cuLibraryLoadData's
    refusal (801)."""
    path = tmp_path / "library.ptx"
    path.write_bytes(PTX)
    body = r"""
name = sys.argv[3].encode()
handle = c_void_p()
options, values = (c_int * 1)(0), (c_void_p * 1)(40)  # CU_JIT_MAX_REGISTERS
out["load"] = lib.cuLibraryLoadFromFile(byref(handle), name, options, values, 1, None, None, 0)
kernel = c_void_p()
out["kernel"] = [lib.cuLibraryGetKernel(byref(kernel), handle, b"mix"), kernel.value is not None]
out["no_kernel"] = lib.cuLibraryGetKernel(byref(kernel), handle, b"nosuch")
pointer, size = c_uint64(), c_size_t()
out["global"] = [lib.cuLibraryGetGlobal(byref(pointer), byref(size), handle, b"counter"), size.value]
memory = c_void_p()
image = ctypes.create_string_buffer(PTX)
out["from_memory"] = lib.cuLibraryLoadData(byref(memory), image, options, values, 1, None, None, 0)
one = (c_void_p * 1)(1)
preserved = (c_int * 1)(1)
out["preserved"] = lib.cuLibraryLoadFromFile(byref(handle), name, None, None, 0, preserved, one, 1)
tables = (c_int * 1)(0)
out["host_tables"] = lib.cuLibraryLoadFromFile(byref(handle), name, None, None, 0, tables, one, 1)
"""
    out, err = run(library, rig, body, str(path))
    assert out["load"] == out["from_memory"] == SUCCESS
    assert out["kernel"] == [SUCCESS, True] and out["no_kernel"] == NOT_FOUND
    assert out["global"] == [SUCCESS, 16]
    loads = rig.entries(name="cuLibraryLoadData")
    assert [(e["image"]["len"], e["image"]["sha256"]) for e in loads] == [(len(PTX) + 1, sha(PTX + b"\0"))] * 2
    assert [e["jit_options"] for e in loads] == [[["CU_JIT_MAX_REGISTERS", 40]]] * 2
    assert out["preserved"] == INVALID_VALUE
    assert out["host_tables"] == NOT_SUPPORTED and "cuLibraryLoadData with a library option" in err


def test_load_fat_binary_is_a_load_of_that_image(library: Path, rig: Rig) -> None:  # noqa: F811
    """cuModuleLoadFatBinary takes the fatbin (or a wrapper of it) at a pointer, as cuModuleLoadData does."""
    fat = fatbin(PTX + b"\0")
    body = rf"""
FAT = bytes.fromhex("{fat.hex()}")
image = ctypes.create_string_buffer(FAT + b"\xee" * 32, len(FAT) + 32)
module = c_void_p()
out["load"] = lib.cuModuleLoadFatBinary(byref(module), image)
out["function"] = function(module.value, b"mix")[0]
out["layout"] = layout(function(module.value, b"mix")[1])
wrapper = ctypes.create_string_buffer(struct.pack("<iiQQ", 0x466243B1, 1, ctypes.addressof(image), 0), 24)
out["wrapper"] = lib.cuModuleLoadFatBinary(byref(module), wrapper)
out["garbage"] = lib.cuModuleLoadFatBinary(byref(module), ctypes.create_string_buffer(b"\x01\x02 garbage"))
"""
    out, _ = run(library, rig, body)
    assert out["load"] == out["function"] == out["wrapper"] == SUCCESS
    assert out["layout"] == MIX_LAYOUT
    assert out["garbage"] == INVALID_IMAGE
    assert shipped(rig) == [(len(fat), sha(fat))] * 2
