"""How long is a module image? The guest must know before it can ship one.

`cuModuleLoadData(CUmodule *, const void *image)` and `cuLibraryLoadData(..., const void *code, ...)` get a bare
address: the driver finds the image's extent from its own bytes, and so must we, to copy exactly that many bytes
to the host. Four forms reach these calls:

* ELF cubin (``\\x7fELF``): the extent is the furthest end of the ELF header, the program header table, the
  section header table and every section or segment with bytes in the file. The section header table is *not*
  always last: NVRTC's and nvcc's cubins put the program header table after it.
* fatbin (``0xBA55ED50``): a 16-byte header ``u32 magic, u16 version, u16 header_size, u64 fat_size``; the image
  is ``header_size + fat_size`` bytes.
* fatbin wrapper (``0x466243B1``, `__fatBinC_Wrapper_t` of fatbinary_section.h): ``int magic, int version,
  const void *data, void *filename_or_fatbins``, what nvcc's host stubs register; the image is the fatbin at
  ``data``, and that fatbin is what gets shipped.
* PTX: NUL-terminated text; the image includes the NUL (the host needs a C string again). Anything without a
  binary magic is taken for PTX, so it must look like it: no control bytes, and a `.version` directive.

Nothing here reads unbounded memory. On Linux the readable extent at the address comes from /proc/self/maps, so
a garbage pointer or header becomes an `ImageError` rather than a segfault; elsewhere PTX is scanned page by page
(never touching a page past the one holding the NUL) and ELF/fatbin tables are trusted up to `MAX_IMAGE`.
"""
from __future__ import annotations

import ctypes
import mmap
import struct
from collections.abc import Callable
from typing import Literal, NamedTuple

Kind = Literal["cubin", "fatbin", "ptx", "fatbin-wrapper"]

MAX_IMAGE = 2 << 30
"""No image claims more than 2 GiB: a larger claim is a corrupt header, not a module."""
MAX_PTX = 512 << 20
"""PTX scanning stops here without a NUL."""
MAX_ELF_ENTRIES = 1 << 20
"""More program or section headers than this is a corrupt header."""

ELF_MAGIC = b"\x7fELF"
FATBIN_MAGIC = 0xBA55ED50
FATBIN_HEADER = struct.Struct("<IHHQ")
WRAPPER_MAGIC = 0x466243B1
_POINTER_SIZE = ctypes.sizeof(ctypes.c_void_p)
_WRAPPER_HEAD = struct.Struct("=iI")  # int magic, int version; then const void *data at offset 8

_SHT_NULL = 0
_SHT_NOBITS = 8
_PN_XNUM = 0xFFFF
_PAGE = mmap.PAGESIZE
_PTX_CHUNK = 1 << 20
# Bytes that never occur in PTX text; one of them means the address does not hold PTX.
_NOT_TEXT = bytes([*range(1, 9), *range(14, 32), 127])


class ImageError(ValueError):
    """The bytes at the address are no module image we can measure (unknown magic, corrupt or absurd header,
    unterminated text, or an extent that runs past readable memory)."""


class ImageSpan(NamedTuple):
    """Where the bytes to ship lie: for a fatbin wrapper, the fatbin it points to."""

    kind: Kind  # what was at the address given: "fatbin-wrapper" for a wrapper
    address: int  # start of the bytes to ship
    length: int


Reader = Callable[[int, int], bytes]
"""read(offset, count) -> exactly `count` bytes at `offset` from the image start, or ImageError."""
Peeker = Callable[[int, int], bytes]
"""peek(offset, count) -> at most `count` bytes at `offset`, fewer where reading further might not be safe."""


def _kind(magic: bytes) -> Kind:
    if magic == ELF_MAGIC:
        return "cubin"
    if len(magic) == 4:
        value = int.from_bytes(magic, "little")
        if value == FATBIN_MAGIC:
            return "fatbin"
        if value == WRAPPER_MAGIC:
            return "fatbin-wrapper"
    return "ptx"


def _fatbin_length(read: Reader) -> int:
    magic, _version, header_size, fat_size = FATBIN_HEADER.unpack(read(0, FATBIN_HEADER.size))
    if magic != FATBIN_MAGIC:
        raise ImageError(f"not a fatbin: magic {magic:#x}")
    if header_size < FATBIN_HEADER.size or header_size > _PAGE:
        raise ImageError(f"fatbin header size {header_size} is absurd")
    total = header_size + fat_size
    if fat_size == 0 or total > MAX_IMAGE:
        raise ImageError(f"fatbin claims {fat_size} bytes of entries")
    read(total - 1, 1)  # the whole extent must be there
    return total


def _check_end(end: int, what: str) -> int:
    if end > MAX_IMAGE:
        raise ImageError(f"ELF {what} ends at {end}, past {MAX_IMAGE}")
    return end


def _elf_length(read: Reader) -> int:
    ident = read(0, 16)
    if ident[:4] != ELF_MAGIC:
        raise ImageError("not an ELF image")
    if ident[4] not in (1, 2) or ident[5] not in (1, 2):
        raise ImageError(f"ELF class {ident[4]} / data encoding {ident[5]} unknown")
    is64 = ident[4] == 2
    order = "<" if ident[5] == 1 else ">"
    if is64:
        header = struct.Struct(order + "HHIQQQIHHHHHH")
        section = struct.Struct(order + "IIQQQQIIQQ")  # name type flags addr offset size link info align entsize
        segment = struct.Struct(order + "IIQQQQQQ")  # type flags offset vaddr paddr filesz memsz align
    else:
        header = struct.Struct(order + "HHIIIIIHHHHHH")
        section = struct.Struct(order + "IIIIIIIIII")
        segment = struct.Struct(order + "IIIIIIII")
    (_type, _machine, _version, _entry, phoff, shoff, _flags, ehsize, phentsize, phnum, shentsize, shnum,
     _shstrndx) = header.unpack(read(16, header.size))
    if ehsize < 16 + header.size or ehsize > _PAGE:
        raise ImageError(f"ELF header size {ehsize} is absurd")
    end = ehsize

    first_section: tuple[int, ...] | None = None
    if shoff:
        if shentsize < section.size or shentsize > _PAGE:
            raise ImageError(f"ELF section header size {shentsize} is absurd")
        _check_end(shoff + shentsize, "section header table")
        first_section = section.unpack(read(shoff, section.size))
        if shnum == 0:  # extended numbering: the count lives in section 0's sh_size
            shnum = first_section[5]
        if phnum == _PN_XNUM:  # and the program header count in its sh_info
            phnum = first_section[7]
    if shnum > MAX_ELF_ENTRIES or phnum > MAX_ELF_ENTRIES:
        raise ImageError(f"ELF claims {shnum} sections and {phnum} segments")

    if phnum:
        if phentsize < segment.size or phentsize > _PAGE:
            raise ImageError(f"ELF program header size {phentsize} is absurd")
        table_end = _check_end(phoff + phnum * phentsize, "program header table")
        table = read(phoff, table_end - phoff)
        end = max(end, table_end)
        for i in range(phnum):
            fields = segment.unpack_from(table, i * phentsize)
            offset, filesz = (fields[2], fields[5]) if is64 else (fields[1], fields[4])
            if filesz:
                end = max(end, _check_end(offset + filesz, f"segment {i}"))
    if shoff and shnum:
        table_end = _check_end(shoff + shnum * shentsize, "section header table")
        table = read(shoff, table_end - shoff)
        end = max(end, table_end)
        for i in range(shnum):
            fields = section.unpack_from(table, i * shentsize)
            sh_type, offset, size = fields[1], fields[4], fields[5]
            if sh_type not in (_SHT_NULL, _SHT_NOBITS) and size:
                end = max(end, _check_end(offset + size, f"section {i}"))
    read(end - 1, 1)  # the whole extent must be there
    return end


def _ptx_length(peek: Peeker, limit: int) -> int:
    """Scan for the NUL chunk by chunk; `peek` decides how far it is safe to read."""
    offset = 0
    seen_version = False
    tail = b""
    while offset < limit:
        chunk = peek(offset, min(_PTX_CHUNK, limit - offset))
        if not chunk:
            break
        nul = chunk.find(b"\0")
        text = chunk if nul < 0 else chunk[:nul]
        if len(text.translate(None, _NOT_TEXT)) != len(text):
            raise ImageError(f"not PTX: binary bytes within the first {offset + len(chunk)} bytes")
        seen_version = seen_version or b".version" in tail + text
        tail = text[-8:]
        if nul >= 0:
            if offset + nul >= limit:
                break
            if not seen_version:
                raise ImageError("not PTX: text without a .version directive")
            return offset + nul + 1
        offset += len(chunk)
    raise ImageError(f"PTX text has no NUL within the first {min(offset, limit)} readable bytes (cap {limit})")


def _measure(kind: Kind, read: Reader, peek: Peeker, ptx_limit: int) -> int:
    if kind == "cubin":
        return _elf_length(read)
    if kind == "fatbin":
        return _fatbin_length(read)
    if kind == "ptx":
        return _ptx_length(peek, ptx_limit)
    raise ImageError("a fatbin wrapper points at its image: measure it from its address (locate)")


# --- bytes-level core (tests, and anything that already holds the bytes) -------------------------------------

def _bytes_reader(data: bytes) -> Reader:
    def read(offset: int, count: int) -> bytes:
        if offset < 0 or offset + count > len(data):
            raise ImageError(f"image is truncated: needs bytes up to {offset + count}, has {len(data)}")
        return data[offset:offset + count]
    return read


def classify_of(data: bytes) -> Kind:
    """The kind of image at the start of `data` ("ptx" for anything without a binary magic)."""
    return _kind(bytes(data[:4]))


def image_length_of(data: bytes) -> int:
    """Length of the image at the start of `data` (trailing bytes after it are ignored)."""
    data = bytes(data)
    if not data:
        raise ImageError("empty image")
    return _measure(classify_of(data), _bytes_reader(data),
                    lambda offset, count: data[offset:offset + count], min(len(data), MAX_PTX))


# --- memory ------------------------------------------------------------------------------------------------

def _readable_extent(address: int) -> int | None:
    """Bytes readable from `address` on (contiguous readable mappings), or None where /proc/self/maps is absent.
    Raises ImageError for NULL or an address in no readable mapping."""
    if not address:
        raise ImageError("image address is NULL")
    try:
        with open("/proc/self/maps", "rb") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return None
    end: int | None = None
    for line in lines:
        fields = line.split(None, 2)
        if len(fields) < 2:
            continue
        start_s, _, stop_s = fields[0].partition(b"-")
        start, stop = int(start_s, 16), int(stop_s, 16)
        readable = fields[1][:1] == b"r"
        if end is None:
            if start > address:
                break
            if address < stop:
                if not readable:
                    break
                end = stop
        elif start == end and readable:
            end = stop
        else:
            break
    if end is None:
        raise ImageError(f"address {address:#x} is not in readable memory")
    return end - address


def _memory_readers(address: int) -> tuple[Reader, Peeker, int]:
    """(read, peek, ptx_limit) for the image at `address`, bounded by what is readable there."""
    extent = _readable_extent(address)
    bound = MAX_IMAGE if extent is None else extent

    def read(offset: int, count: int) -> bytes:
        if offset < 0 or offset + count > bound:
            raise ImageError(f"image at {address:#x} would extend to byte {offset + count}, past readable memory")
        return ctypes.string_at(address + offset, count)

    def peek(offset: int, count: int) -> bytes:
        if extent is not None:  # known readable
            return ctypes.string_at(address + offset, max(0, min(count, extent - offset)))
        page_end = (address + offset) // _PAGE * _PAGE + _PAGE  # unknown: never past the current page
        return ctypes.string_at(address + offset, min(count, page_end - (address + offset)))

    return read, peek, min(bound, MAX_PTX)


def _magic(peek: Peeker) -> bytes:
    """Up to 4 leading bytes, stopping at a NUL: a short PTX string at the end of readable memory must not fault
    (with no extent known, peek stops at the page end, so this takes at most two reads)."""
    magic = b""
    while len(magic) < 4:
        chunk = peek(len(magic), 4 - len(magic))
        if not chunk:
            break
        magic += chunk
        if b"\0" in chunk:
            break
    return magic


def classify(address: int) -> Kind:
    """The kind of image at `address` ("ptx" for anything without a binary magic; `locate` checks it)."""
    _, peek, _ = _memory_readers(address)
    return _kind(_magic(peek))


def locate(address: int) -> ImageSpan:
    """Where the image handed to cuModuleLoadData/cuLibraryLoadData lies and how long it is."""
    read, peek, ptx_limit = _memory_readers(address)
    kind = _kind(_magic(peek))
    if kind != "fatbin-wrapper":
        return ImageSpan(kind, address, _measure(kind, read, peek, ptx_limit))
    _magic_word, version = _WRAPPER_HEAD.unpack(read(0, _WRAPPER_HEAD.size))
    start = ctypes.c_void_p.from_buffer_copy(read(8, _POINTER_SIZE)).value or 0
    if version not in (1, 2) or not start:
        raise ImageError(f"fatbin wrapper at {address:#x}: version {version}, data {start:#x}")
    read, peek, _ = _memory_readers(start)
    if _kind(_magic(peek)) != "fatbin":
        raise ImageError(f"fatbin wrapper at {address:#x} points at no fatbin ({start:#x})")
    return ImageSpan(kind, start, _fatbin_length(read))


def read_image(address: int) -> bytes:
    """The bytes to ship for the image handed over at `address` (a wrapper's fatbin for a wrapper)."""
    span = locate(address)
    return ctypes.string_at(span.address, span.length)
