"""guest_runtime.module_image: the length of a module image, derived from its bytes as cuModuleLoadData must.

The images are real: PTX and cubins compiled here by NVRTC (no GPU needed), fatbins built by nvFatbin from them
and, independently, by hand from the documented 16-byte header. Where nvcc is on PATH, its -cubin/-fatbin
output and the `__fatBinC_Wrapper_t` of a real nvcc-built shared object are checked too. Each image is measured
as bytes, in memory followed by garbage, and in memory ending right before an inaccessible page (so a read one
byte too far would fault). Synthetic ELF files cover what the toolchain does not emit (ELF32, big-endian,
extended section numbering); corrupt headers must raise ImageError, never read wild memory.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import struct
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from guest_runtime import module_image
from guest_runtime.module_image import (
    FATBIN_MAGIC,
    MAX_IMAGE,
    WRAPPER_MAGIC,
    ImageError,
    classify,
    classify_of,
    image_length_of,
    locate,
    read_image,
)

PAGE = mmap.PAGESIZE
PROT_NONE = 0
NVRTC_HINT = 'install it with: pip install "cuda-toolkit[nvrtc,nvfatbin]==13.*"'

SMALL_KERNEL = rb"""
extern "C" __global__ void add(float *a, const float *b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += b[i];
}
"""

# Constant, global and shared memory: the cubin gets SHT_NOBITS sections whose (offset + size) lie past the end
# of the file, so they must not count.
BIG_KERNEL = rb"""
__constant__ float coeffs[256] = {1.0f, 2.0f, 3.0f};
__device__ float scratch[4096];
struct Pair { double x; long long y; };
__device__ float poly(float x) { float r = 0; for (int k = 0; k < 256; ++k) r = r * x + coeffs[k]; return r; }
extern "C" __global__ void big(float *out, const float *in, Pair p, int n) {
    __shared__ float tile[1024];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? in[i] : 0.0f;
    __syncthreads();
    float acc = 0;
    #pragma unroll 32
    for (int k = 0; k < 1024; ++k) acc += sinf(tile[(threadIdx.x + k) & 1023]) * poly(acc);
    scratch[i & 4095] = acc;
    if (i < n) out[i] = acc + (float)p.x + (float)p.y;
}
extern "C" __global__ void second(int *x) { atomicAdd(x, 1); }
"""

COMPILES = {
    "small-sm90": (SMALL_KERNEL, ["--gpu-architecture=sm_90"]),
    "small-sm80": (SMALL_KERNEL, ["--gpu-architecture=sm_80"]),
    "big-sm90": (BIG_KERNEL, ["--gpu-architecture=sm_90"]),
    "big-sm80-debug": (BIG_KERNEL, ["--gpu-architecture=sm_80", "-G"]),
    "big-sm75-lineinfo": (BIG_KERNEL, ["--gpu-architecture=sm_75", "-lineinfo"]),
}


# --- building images ----------------------------------------------------------------------------------------

def _nvrtc():  # type: ignore[no-untyped-def]
    try:
        from cuda.bindings import nvrtc

        nvrtc.nvrtcVersion()
    except Exception as exc:  # ImportError, or cuda.pathfinder's DynamicLibNotFoundError (a RuntimeError)
        pytest.skip(f"NVRTC unavailable ({type(exc).__name__}: {str(exc).splitlines()[0]}); {NVRTC_HINT}")
    return nvrtc


def _compile(source: bytes, options: list[str]) -> tuple[bytes, bytes]:
    """(ptx, cubin) as NVRTC returns them; the PTX includes its NUL."""
    nvrtc = _nvrtc()
    err, prog = nvrtc.nvrtcCreateProgram(source, b"kernel.cu", 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    try:
        opts = [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            pytest.fail(f"NVRTC failed ({err}): {log.decode(errors='replace')}")
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * size
        nvrtc.nvrtcGetPTX(prog, ptx)
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * size
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        return ptx, cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


_CACHE: dict[str, tuple[bytes, bytes]] = {}


def compiled(name: str) -> tuple[bytes, bytes]:
    if name not in _CACHE:
        _CACHE[name] = _compile(*COMPILES[name])
    return _CACHE[name]


def handmade_fatbin(entries: list[tuple[int, bytes]]) -> bytes:
    """A fatbin from the documented layout: header u32 magic, u16 version, u16 header size, u64 size of what
    follows; then per entry u16 kind (1 PTX, 2 ELF), u16 version, u32 entry header size, u64 payload size, ...
    (the rest of the 64-byte entry header is left zero: only the sizes matter for the length)."""
    body = b"".join(struct.pack("<HHIQ", kind, 0x0101, 64, len(payload)).ljust(64, b"\0") + payload
                    for kind, payload in entries)
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def nvfatbin_fatbin(parts: list[tuple[str, bytes, str]]) -> bytes:
    """A fatbin built by nvFatbin (kind "cubin" or "ptx", image, arch)."""
    try:
        from cuda.bindings import nvfatbin

        handle = nvfatbin.create([], 0)
    except Exception as exc:
        pytest.skip(f"nvFatbin unavailable ({type(exc).__name__}); {NVRTC_HINT}")
    try:
        for kind, image, arch in parts:
            if kind == "cubin":
                nvfatbin.add_cubin(handle, image, len(image), arch, "k")
            else:
                nvfatbin.add_ptx(handle, image, len(image), arch, "k", "")
        out = bytearray(nvfatbin.size(handle))
        nvfatbin.get(handle, out)
        return bytes(out)
    finally:
        nvfatbin.destroy(handle)


def elf(is64: bool = True, big_endian: bool = False, extended: bool = False,
        tail_sections: bool = False) -> bytes:
    """A minimal ELF: header, a 100-byte PROGBITS section, a NOBITS section claiming 1 MiB past the end, and
    the section header table (after the data, or before it with `tail_sections`, so the data ends the file)."""
    o = ">" if big_endian else "<"
    eh = 64 if is64 else 52
    she = 64 if is64 else 40
    data = bytes(range(100))
    nsec = 3

    def section(sh_type: int, offset: int, size: int, info: int = 0) -> bytes:
        if is64:
            return struct.pack(o + "IIQQQQIIQQ", 0, sh_type, 0, 0, offset, size, 0, info, 1, 0)
        return struct.pack(o + "IIIIIIIIII", 0, sh_type, 0, 0, offset, size, 0, info, 1, 0)

    if tail_sections:
        shoff, data_off = eh, eh + nsec * she
    else:
        data_off, shoff = eh, eh + len(data)
    end = max(shoff + nsec * she, data_off + len(data))
    table = (section(0, 0, nsec if extended else 0) + section(1, data_off, len(data))
             + section(8, end + 100, 1 << 20))
    shnum = 0 if extended else nsec
    ident = b"\x7fELF" + bytes([2 if is64 else 1, 2 if big_endian else 1, 1]) + bytes(9)
    if is64:
        header = ident + struct.pack(o + "HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 0, eh, 56, 0, she, shnum, 0)
    else:
        header = ident + struct.pack(o + "HHIIIIIHHHHHH", 2, 190, 1, 0, 0, shoff, 0, eh, 32, 0, she, shnum, 0)
    image = bytearray(end)
    image[:eh] = header
    image[data_off:data_off + len(data)] = data
    image[shoff:shoff + len(table)] = table
    return bytes(image)


# --- memory helpers -----------------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


@pytest.fixture
def guarded() -> Iterator[Callable[[bytes], int]]:
    """place(data) -> address of `data`, copied so that its last byte is the last readable one: the next page
    is PROT_NONE, so reading one byte past the image faults."""
    maps: list[tuple[int, int]] = []

    def place(data: bytes) -> int:
        pages = (len(data) + PAGE - 1) // PAGE + 1
        size = pages * PAGE
        base = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                          -1, 0)
        assert base not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        maps.append((base, size))
        assert _libc.mprotect(base + size - PAGE, PAGE, PROT_NONE) == 0
        address = base + size - PAGE - len(data)
        ctypes.memmove(address, data, len(data))
        return address

    yield place
    for base, size in maps:
        _libc.munmap(base, size)


def with_garbage(data: bytes) -> ctypes.Array[ctypes.c_char]:
    """`data` followed by 64 KiB of non-zero garbage, in a ctypes buffer (keep it alive while using its address)."""
    garbage = (bytes(range(1, 256)) * 300)[:65536]
    return ctypes.create_string_buffer(data + garbage, len(data) + len(garbage))


def all_images() -> list[tuple[str, str, bytes]]:
    """(name, kind, exact bytes) of every real image."""
    out: list[tuple[str, str, bytes]] = []
    for name in COMPILES:
        ptx, cubin = compiled(name)
        out += [(f"{name}.ptx", "ptx", ptx), (f"{name}.cubin", "cubin", cubin)]
    s90 = compiled("small-sm90")
    b80 = compiled("big-sm80-debug")
    out.append(("handmade.fatbin", "fatbin", handmade_fatbin([(2, s90[1]), (2, b80[1]), (1, s90[0])])))
    return out


IMAGE_NAMES = [f"{n}.{k}" for n in COMPILES for k in ("ptx", "cubin")] + ["handmade.fatbin"]


@pytest.fixture(params=IMAGE_NAMES)
def image(request: pytest.FixtureRequest) -> tuple[str, bytes]:
    for name, kind, data in all_images():
        if name == request.param:
            return kind, data
    raise AssertionError(request.param)


# --- real images ----------------------------------------------------------------------------------------------

def test_nvrtc_outputs_are_what_the_loader_expects() -> None:
    ptx, cubin = compiled("small-sm90")
    assert ptx.endswith(b"\0") and ptx.count(b"\0") == 1  # nvrtcGetPTXSize counts the NUL
    assert b".version" in ptx
    assert cubin[:4] == b"\x7fELF"  # nvrtcGetCUBIN: a bare ELF, not a fatbin


def test_length_of_bytes(image: tuple[str, bytes]) -> None:
    kind, data = image
    assert classify_of(data) == kind
    assert image_length_of(data) == len(data)
    assert image_length_of(data + b"\x01garbage\xff" * 1000) == len(data)


def test_length_in_memory_followed_by_garbage(image: tuple[str, bytes]) -> None:
    kind, data = image
    buffer = with_garbage(data)
    address = ctypes.addressof(buffer)
    assert classify(address) == kind
    assert locate(address).length == len(data)
    assert locate(address) == (kind, address, len(data))
    assert read_image(address) == data


def test_length_in_memory_ending_at_an_inaccessible_page(image: tuple[str, bytes], guarded: Callable[[bytes], int],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    kind, data = image
    address = guarded(data)
    assert locate(address).length == len(data)
    # Without /proc/self/maps the PTX scan goes page by page and must still stop at the NUL.
    monkeypatch.setattr(module_image, "_readable_extent", lambda address: None)
    assert classify(address) == kind
    assert locate(address).length == len(data)


def test_cubin_extent_is_not_just_the_section_header_table() -> None:
    """What NVRTC emits today: program headers after the section headers, NOBITS sections 'past' the end."""
    for name in COMPILES:
        cubin = compiled(name)[1]
        phoff, shoff = struct.unpack_from("<QQ", cubin, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", cubin, 54)
        ends = {"sections": shoff + shnum * shentsize, "segments": phoff + phnum * phentsize}
        assert max(ends.values()) == len(cubin) == image_length_of(cubin), (name, ends)


def test_nvfatbin_fatbins() -> None:
    s90_ptx, s90 = compiled("small-sm90")
    _, s80 = compiled("small-sm80")
    b90_ptx, b90 = compiled("big-sm90")
    for parts in ([("cubin", s90, "90")],
                  [("cubin", s90, "90"), ("cubin", s80, "80"), ("ptx", s90_ptx, "90")],
                  [("cubin", b90, "90"), ("ptx", b90_ptx, "90")]):
        fatbin = nvfatbin_fatbin(parts)
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", fatbin)
        assert (magic, header_size + fat_size) == (FATBIN_MAGIC, len(fatbin))
        assert classify_of(fatbin) == "fatbin"
        assert image_length_of(fatbin + b"\xff" * 100) == len(fatbin)
        buffer = with_garbage(fatbin)
        assert locate(ctypes.addressof(buffer)).length == len(fatbin)


def wrapper_for(fatbin_address: int, version: int = 1) -> ctypes.Array[ctypes.c_char]:
    """A `__fatBinC_Wrapper_t {int magic; int version; const void *data; void *filename_or_fatbins;}`."""
    raw = struct.pack("@iiPP", WRAPPER_MAGIC, version, fatbin_address, 0)
    return ctypes.create_string_buffer(raw, len(raw))


def test_fatbin_wrapper_is_read_through_its_pointer() -> None:
    _, cubin = compiled("small-sm90")
    fatbin = handmade_fatbin([(2, cubin)])
    buffer = with_garbage(fatbin)
    for version in (1, 2):
        wrapper = wrapper_for(ctypes.addressof(buffer), version)
        address = ctypes.addressof(wrapper)
        assert classify(address) == "fatbin-wrapper"
        assert locate(address) == ("fatbin-wrapper", ctypes.addressof(buffer), len(fatbin))
        assert read_image(address) == fatbin
    with pytest.raises(ImageError, match="wrapper"):
        image_length_of(bytes(wrapper_for(ctypes.addressof(buffer))))


# --- nvcc, where installed ------------------------------------------------------------------------------------

def _nvcc() -> str:
    nvcc = shutil.which("nvcc") or next((str(p) for p in sorted(Path("/usr/local").glob("cuda*/bin/nvcc"))), None)
    if not nvcc or not shutil.which("g++"):
        pytest.skip("nvcc (and a host compiler) not installed: its fatbin and wrapper are not checked")
    return nvcc


@pytest.fixture(scope="module")
def nvcc_outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    nvcc = _nvcc()
    work = tmp_path_factory.mktemp("nvcc")
    source = work / "k.cu"
    source.write_bytes(BIG_KERNEL + b'extern "C" int marker(void) { return 42; }\n')
    gencode = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=[sm_90,compute_90]"]
    for args in (["-fatbin", *gencode, "-o", "k.fatbin"], ["-cubin", "-arch=sm_90", "-o", "k.cubin"],
                 ["-shared", "-Xcompiler", "-fPIC", *gencode, "-o", "k.so"]):
        subprocess.run([nvcc, *args, "k.cu"], cwd=work, check=True, capture_output=True, timeout=300)
    return work


def test_nvcc_fatbin_and_cubin(nvcc_outputs: Path) -> None:
    for name, kind in (("k.fatbin", "fatbin"), ("k.cubin", "cubin")):
        data = (nvcc_outputs / name).read_bytes()
        assert classify_of(data) == kind
        assert image_length_of(data) == len(data)


def _section(path: Path, wanted: bytes) -> tuple[int, int]:
    """(address relative to the load base, size) of a section of a 64-bit little-endian ELF file."""
    data = path.read_bytes()
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 58)
    sections = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = sections[shstrndx][4]
    for name, _type, _flags, addr, _offset, size in sections:
        if data[names + name:].split(b"\0", 1)[0] == wanted:
            return addr, size
    raise AssertionError(f"{path} has no {wanted!r} section")


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def test_nvcc_wrappers_in_a_loaded_library(nvcc_outputs: Path) -> None:
    """The wrappers nvcc's host stubs register (.nvFatBinSegment), read from a really loaded .so, lead to the
    fatbins of .nv_fatbin: together they tile that section, and ours is byte for byte what nvcc -fatbin gives."""
    path = nvcc_outputs / "k.so"
    try:
        library = ctypes.CDLL(str(path))
    except OSError as exc:
        pytest.skip(f"cannot load the nvcc-built library: {exc}")
    info = _DlInfo()
    assert _libc.dladdr(ctypes.cast(library.marker, ctypes.c_void_p), ctypes.byref(info))
    base = info.dli_fbase or 0
    segment, segment_size = _section(path, b".nvFatBinSegment")
    fatbins, fatbins_size = _section(path, b".nv_fatbin")
    wrapper_size = 8 + 2 * ctypes.sizeof(ctypes.c_void_p)
    spans = []
    for wrapper in range(base + segment, base + segment + segment_size, wrapper_size):
        assert classify(wrapper) == "fatbin-wrapper"
        spans.append(locate(wrapper))
    position = base + fatbins
    for span in sorted(spans, key=lambda span: span.address):
        assert span.address == position
        position = (span.address + span.length + 7) // 8 * 8
    assert position == base + fatbins + fatbins_size
    assert (nvcc_outputs / "k.fatbin").read_bytes() in [ctypes.string_at(s.address, s.length) for s in spans]


# --- synthetic ELF --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("is64", [True, False])
@pytest.mark.parametrize("big_endian", [False, True])
@pytest.mark.parametrize("extended", [False, True])
@pytest.mark.parametrize("tail_sections", [False, True])
def test_synthetic_elf(is64: bool, big_endian: bool, extended: bool, tail_sections: bool) -> None:
    data = elf(is64, big_endian, extended, tail_sections)
    assert image_length_of(data + b"\xee" * 4096) == len(data)


# --- malformed images -----------------------------------------------------------------------------------------

def _patched(data: bytes, offset: int, fmt: str, *values: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, *values)
    return bytes(out)


def test_truncated_images_raise() -> None:
    ptx, cubin = compiled("small-sm90")
    fatbin = handmade_fatbin([(2, cubin)])
    for data in (cubin[:-1], cubin[:40], fatbin[:-1], fatbin[:10], ptx[:-1]):
        with pytest.raises(ImageError):
            image_length_of(data)


def test_corrupt_headers_raise() -> None:
    _, cubin = compiled("small-sm90")
    fatbin = handmade_fatbin([(2, cubin)])
    bad = [
        _patched(cubin, 40, "<Q", 1 << 40),  # e_shoff far away
        _patched(cubin, 32, "<Q", MAX_IMAGE),  # e_phoff at 2 GiB
        _patched(cubin, 60, "<H", 0xFFFF),  # e_shnum: 65535 entries past the end
        _patched(cubin, 58, "<H", 1),  # e_shentsize smaller than a section header
        _patched(cubin, 52, "<H", 0),  # e_ehsize
        _patched(cubin, 4, "B", 3),  # EI_CLASS
        _patched(fatbin, 8, "<Q", MAX_IMAGE),  # fat size > 2 GiB
        _patched(fatbin, 8, "<Q", 0),
        _patched(fatbin, 6, "<H", 0),  # header size
        _patched(fatbin, 6, "<H", 60000),
    ]
    # a section claiming bytes far past the file
    shoff, = struct.unpack_from("<Q", cubin, 40)
    bad.append(_patched(cubin, shoff + 64 + 32, "<Q", 1 << 33))  # section 1's sh_size
    for data in bad:
        with pytest.raises(ImageError):
            image_length_of(data + bytes(8192))


def test_unrecognizable_images_raise() -> None:
    for data in (b"", b"\0", b"\0\0\0\0\0", bytes(range(256)) * 4, b"hello world\0",
                 b".version 8.0\n\x01\x02\0", b".version 8.0\n.target sm_90\n" * 10):
        with pytest.raises(ImageError):
            image_length_of(data)
    text = b"// no code\n.version 8.0\n.target sm_90\n\0"
    assert image_length_of(text + b"more") == len(text)


def test_bad_addresses_raise(guarded: Callable[[bytes], int]) -> None:
    with pytest.raises(ImageError, match="NULL"):
        locate(0)
    address = guarded(b"x")
    with pytest.raises(ImageError, match="readable"):
        locate(address + 1)  # the PROT_NONE page


def test_wild_headers_in_memory_raise_instead_of_faulting(guarded: Callable[[bytes], int]) -> None:
    _, cubin = compiled("small-sm90")
    # Section table claimed 64 KiB further on: within 2 GiB, but past the readable memory.
    with pytest.raises(ImageError, match="readable"):
        locate(guarded(_patched(cubin, 40, "<Q", len(cubin) + 65536)))
    fatbin = handmade_fatbin([(2, cubin)])
    with pytest.raises(ImageError, match="readable"):
        locate(guarded(_patched(fatbin, 8, "<Q", len(fatbin) * 4)))
    # Text without a NUL up to the inaccessible page: with or without /proc/self/maps, no fault.
    text = guarded(b".version 8.0\n" + b"x" * (3 * PAGE))
    with pytest.raises(ImageError, match="NUL"):
        locate(text)


def test_text_without_nul_stops_at_the_page_when_maps_are_unknown(guarded: Callable[[bytes], int],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module_image, "_readable_extent", lambda address: None)
    # Binary bytes on the first page stop the scan before it reaches the guard page.
    address = guarded(b".version 8.0\n" + b"x" * PAGE + b"\x01" + b"y" * (PAGE - 14))
    with pytest.raises(ImageError, match="binary"):
        locate(address)


def test_bad_wrappers_raise() -> None:
    _, cubin = compiled("small-sm90")
    buffer = with_garbage(handmade_fatbin([(2, cubin)]))
    for wrapper in (wrapper_for(0), wrapper_for(ctypes.addressof(buffer), version=7),
                    wrapper_for(ctypes.addressof(buffer) + 1)):
        with pytest.raises(ImageError):
            locate(ctypes.addressof(wrapper))
