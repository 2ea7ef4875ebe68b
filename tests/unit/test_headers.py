"""Malformed region headers are refused on open, with an error that names the file.

Each case writes bytes into a real /dev/shm file (so Region.open goes through posix_ipc) and opens it the way
a client or the agent does: `Region.open(path).geometry`.
"""
from __future__ import annotations

import os
import random
import struct
import zlib

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ivshmem import layout
from ivshmem.errors import RegionFormatError, RegionNotFormatted
from ivshmem.layout import Geometry
from ivshmem.region import Region

MIB = 1 << 20
SIZE = 32 * MIB


def write_at(path: str, offset: int, data: bytes | bytearray) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        assert os.pwrite(fd, data, offset) == len(data)
    finally:
        os.close(fd)


def resize(path: str, size: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def with_crc(raw: bytes | bytearray) -> bytes:
    """`raw` (256 bytes) with header_crc recomputed, so validation gets past the checksum."""
    out = bytearray(raw)
    struct.pack_into("<I", out, layout.CRC_OFFSET, 0)
    struct.pack_into("<I", out, layout.CRC_OFFSET, zlib.crc32(out))
    return bytes(out)


def valid_header(size: int = SIZE, **kw: int) -> bytearray:
    return bytearray(layout.pack_header(Geometry.build(size, name="test", **kw)))


def open_geometry(path: str) -> Geometry:
    with Region.open(path) as region:
        return region.geometry


def refused(path: str, exc: type[Exception] = RegionFormatError) -> str:
    """Open `path`, expect `exc` (and not the 'not formatted' subclass unless asked); return the message."""
    with pytest.raises(exc) as info:
        open_geometry(path)
    if exc is RegionFormatError:
        assert not isinstance(info.value, RegionNotFormatted), info.value
    message = str(info.value)
    assert path in message, f"the message does not name the file: {message}"
    return message


def test_a_valid_header_is_accepted(region_path: str) -> None:
    write_at(region_path, 0, valid_header())
    g = open_geometry(region_path)
    assert g == Geometry.build(SIZE, name="test")


def test_all_zero_region_reads_as_not_formatted(region_path: str) -> None:
    message = refused(region_path, RegionNotFormatted)
    assert "oriond" in message


def test_wrong_magic(region_path: str) -> None:
    raw = valid_header()
    raw[0:8] = b"ORIONSHN"
    write_at(region_path, 0, with_crc(raw))
    assert "not an Orion region" in refused(region_path)


@pytest.mark.parametrize("version", [0, 2, 0xFFFFFFFF])
def test_wrong_version(region_path: str, version: int) -> None:
    raw = valid_header()
    struct.pack_into("<I", raw, 8, version)
    write_at(region_path, 0, with_crc(raw))
    assert f"version {version}" in refused(region_path)


def test_wrong_header_size(region_path: str) -> None:
    raw = valid_header()
    struct.pack_into("<I", raw, 12, 8192)
    write_at(region_path, 0, with_crc(raw))
    assert "header_size" in refused(region_path)


@pytest.mark.parametrize("offset", [16, 32, 60, 130, 255])
def test_bad_crc(region_path: str, offset: int) -> None:
    raw = valid_header()
    raw[offset] ^= 0x40
    write_at(region_path, 0, raw)  # CRC not recomputed
    assert "checksum" in refused(region_path)


def test_crc_field_itself_corrupted(region_path: str) -> None:
    raw = valid_header()
    raw[layout.CRC_OFFSET] ^= 1
    write_at(region_path, 0, raw)
    assert "checksum" in refused(region_path)


def test_bytes_past_the_crc_span_do_not_matter(region_path: str) -> None:
    write_at(region_path, 0, valid_header())
    write_at(region_path, layout.CRC_SPAN, os.urandom(layout.HEADER_SIZE - layout.CRC_SPAN))
    assert open_geometry(region_path).channel_count == layout.DEFAULT_CHANNELS


def test_header_region_size_larger_than_the_file(region_path: str) -> None:
    write_at(region_path, 0, valid_header(64 * MIB))
    assert "mapped" in refused(region_path)


def test_file_shrunk_under_a_valid_header(region_path: str) -> None:
    write_at(region_path, 0, valid_header())
    resize(region_path, 16 * MIB)
    assert "mapped" in refused(region_path)


def test_file_of_exactly_one_header_page(region_path: str) -> None:
    write_at(region_path, 0, valid_header())
    resize(region_path, layout.HEADER_SIZE)
    assert "mapped" in refused(region_path)


@pytest.mark.parametrize("size", [0, 1, 255, 256, 4095])
def test_file_smaller_than_a_header(region_path: str, size: int) -> None:
    resize(region_path, 0)
    resize(region_path, size)
    if size:
        write_at(region_path, 0, b"ORIONSHM"[:size])
    assert "too small" in refused(region_path)


def test_file_of_random_bytes(region_path: str) -> None:
    rng = random.Random(1234)
    write_at(region_path, 0, rng.randbytes(1 * MIB))
    assert "not an Orion region" in refused(region_path)


def _field(raw: bytearray, offset: int, fmt: str, value: int) -> bytes:
    struct.pack_into(fmt, raw, offset, value)
    return with_crc(raw)


G = Geometry.build(SIZE, name="test")
# (doc offset, format, value, a word the message must contain)
BAD_FIELDS = {
    "channels 0": (32, "<I", 0, "channel_count"),
    "channels 257": (32, "<I", 257, "channel_count"),
    "channels past region end": (32, "<I", 64, "beyond region_size"),
    "ring_entries 48": (36, "<I", 48, "ring_entries"),
    "ring_entries 1": (36, "<I", 1, "ring_entries"),
    "ring_entries 8192": (36, "<I", 8192, "ring_entries"),
    "slot_size 100": (40, "<I", 100, "slot_size"),
    "slot_size 32": (40, "<I", 32, "slot_size"),
    "slot_size 131072": (40, "<I", 131072, "slot_size"),
    "chunk_size 5000": (44, "<I", 5000, "chunk_size"),
    "chunk_size 0": (44, "<I", 0, "chunk_size"),
    "chunk_count 3": (48, "<I", 3, "chunk_count"),
    "chunk_count 0": (48, "<I", 0, "chunk_count"),
    "chunk_count 4096": (48, "<I", 4096, "chunk_count"),
    "channel_offset inside header": (56, "<Q", 0, "page-aligned"),
    "channel_offset past end": (56, "<Q", SIZE, "beyond region_size"),
    "channel_stride too small": (64, "<Q", 4096, "beyond channel_stride"),
    "channel_stride huge": (64, "<Q", 1 << 60, "beyond region_size"),
    "pool over channels": (72, "<Q", 4096, "pool"),
    "pool past end": (80, "<Q", SIZE, "pool"),
    "req ring overlaps ctrl": (92, "<I", 0, "overlaps"),
    "cpl ring overlaps req ring": (96, "<I", G.off_req_ring, "overlaps"),
    "req staging misaligned": (100, "<I", G.off_req_staging + 1, "misaligned"),
    "cpl staging ends past stride": (104, "<I", G.channel_stride - 4096, "beyond channel_stride"),
    "cpl staging beyond stride": (104, "<I", 1 << 31, "beyond channel_stride"),
    "ring tail offset": (112, "<I", 128, "off_ring_tail 128"),
    "staging chunks offset": (120, "<I", 64, "off_staging_chunks 64"),
}


@pytest.mark.parametrize("case", BAD_FIELDS, ids=list(BAD_FIELDS))
def test_geometry_field_out_of_range(region_path: str, case: str) -> None:
    offset, fmt, value, word = BAD_FIELDS[case]
    write_at(region_path, 0, _field(valid_header(), offset, fmt, value))
    assert word in refused(region_path)


# --- arbitrary headers ----------------------------------------------------------------------------------------
_FIELD_SLOTS = [(off, fmt) for off, fmt in [(16, "<Q"), (24, "<Q"), (32, "<I"), (36, "<I"), (40, "<I"),
                                             (44, "<I"), (48, "<I"), (56, "<Q"), (64, "<Q"), (72, "<Q"),
                                             (80, "<Q"), (88, "<I"), (92, "<I"), (96, "<I"), (100, "<I"),
                                             (104, "<I"), (108, "<I"), (112, "<I"), (116, "<I"), (120, "<I")]]


def _interesting(fmt: str) -> st.SearchStrategy[int]:
    top = (1 << (64 if fmt == "<Q" else 32)) - 1
    small = st.sampled_from([0, 1, 2, 3, 63, 64, 65, 128, 4095, 4096, 4097, 8192, 65536, 1 << 20, SIZE - 4096,
                             SIZE, SIZE + 4096, 1 << 31, top])
    return st.one_of(small, st.integers(0, top), st.integers(0, 1 << 26).map(lambda v: v * 64)).map(lambda v: v & top)


@st.composite
def mutated_headers(draw: st.DrawFn) -> bytes:
    """A valid header with some geometry fields overwritten (most get past magic/version/CRC)."""
    raw = valid_header(channels=draw(st.sampled_from([1, 2, 8])))
    for off, fmt in draw(st.lists(st.sampled_from(_FIELD_SLOTS), min_size=1, max_size=6)):
        struct.pack_into(fmt, raw, off, draw(_interesting(fmt)))
    if draw(st.booleans()):
        raw[128:160] = draw(st.binary(min_size=32, max_size=32))  # name: any bytes, not necessarily UTF-8
    return with_crc(raw)


@st.composite
def arbitrary_headers(draw: st.DrawFn) -> bytes:
    raw = bytearray(draw(st.binary(min_size=256, max_size=256)))
    if draw(st.booleans()):  # keep the preamble so the geometry checks are reached
        raw[0:16] = layout.MAGIC + struct.pack("<II", layout.VERSION, layout.HEADER_SIZE)
    return with_crc(raw)


def _assert_inside(g: Geometry, mapped: int) -> None:
    assert g.region_size <= mapped
    ring = Geometry.ring_bytes(g.ring_entries, g.slot_size)
    staging = Geometry.staging_bytes(g.chunk_size, g.chunk_count)
    blocks = [(0, layout.HEADER_SIZE)]
    for k in range(g.channel_count):
        base = g.channel_base(k)
        blocks += [(base + g.off_ctrl, layout.PAGE), (base + g.off_req_ring, ring), (base + g.off_cpl_ring, ring),
                   (base + g.off_req_staging, staging), (base + g.off_cpl_staging, staging)]
    if g.pool_size:
        blocks.append((g.pool_offset, g.pool_size))
    end = 0
    for start, length in sorted(blocks):
        assert start >= end, "blocks overlap"
        assert start % 4 == 0
        end = start + length
    assert end <= g.region_size


def test_arbitrary_header_bytes_raise_only_region_format_error(region_path: str) -> None:
    accepted = refused_count = 0

    @settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(raw=st.one_of(mutated_headers(), arbitrary_headers()))
    @example(raw=with_crc(valid_header()))
    def check(raw: bytes) -> None:
        nonlocal accepted, refused_count
        write_at(region_path, 0, raw)
        try:
            g = open_geometry(region_path)
        except RegionFormatError as exc:
            assert region_path in str(exc)
            refused_count += 1
            return
        accepted += 1
        _assert_inside(g, SIZE)

    check()
    assert refused_count > 0 and accepted > 0  # both branches were exercised
