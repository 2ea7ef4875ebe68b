"""Byte layout of an Orion region: the header, the offsets table and the channel geometry.

docs/wire-protocol.md is the prose version of this module; tests/unit/test_layout.py pins every offset.
This module only computes and checks numbers: it maps nothing and knows nothing of processes.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from .errors import RegionFormatError, RegionNotFormatted

MAGIC = b"ORIONSHM"
VERSION = 1
PAGE = 4096
HEADER_SIZE = PAGE
CACHE_LINE = 64
MIB = 1 << 20

FEATURE_STAGED = 1 << 0
FEATURE_ASYNC_ERRORS = 1 << 1
FEATURE_HOST_HEARTBEAT = 1 << 2  # a session's worker beats its channel's host_heartbeat word (channel.py)
FEATURES = FEATURE_STAGED | FEATURE_ASYNC_ERRORS | FEATURE_HOST_HEARTBEAT

# Header: everything the CRC covers lives in the first 256 bytes. HEADER_FIELDS names HEADER's values in order
# (docs/wire-protocol.md's table; pack_header takes the Geometry's by these names, and gen_libcuda.py gives the C
# client each one's offset from them).
HEADER = struct.Struct("<8sIIQQIIIIIIQQQQIIIIIIIII4x32s")
HEADER_FIELDS = ("magic", "version", "header_size", "features", "region_size", "channel_count", "ring_entries",
                 "slot_size", "chunk_size", "chunk_count", "header_crc", "channel_offset", "channel_stride",
                 "pool_offset", "pool_size", "off_ctrl", "off_req_ring", "off_cpl_ring", "off_req_staging",
                 "off_cpl_staging", "off_ring_head", "off_ring_tail", "off_ring_slots", "off_staging_chunks", "name")
NAME_SIZE = 32
CRC_SPAN = 256
CRC_OFFSET = 52
# Agent words: own cache line, outside the CRC, rewritten while serving.
AGENT_HEARTBEAT = 1024  # u64
AGENT_PID = 1032  # u32
AGENT_STATE = 1036  # u32
AGENT_NEVER, AGENT_SERVING, AGENT_STOPPED = 0, 1, 2

# Inside a ring block and a staging block (the offsets table repeats these so readers need not assume them).
RING_HEAD, RING_TAIL, RING_SLOTS = 0, CACHE_LINE, 2 * CACHE_LINE
STAGING_HEAD, STAGING_TAIL, STAGING_CHUNKS = 0, CACHE_LINE, PAGE

# Limits a header must respect; they bound what a hostile or corrupt header can make a reader do.
MAX_CHANNELS = 256
RING_ENTRIES_RANGE = (2, 4096)
SLOT_SIZE_RANGE = (64, 65536)
CHUNK_COUNT_RANGE = (2, 1024)
MAX_CHUNK_SIZE = 64 * MIB
RECORD_HEADER_SIZE = 32

# Which regions exist: files orionsock<0..9999>, 16 MiB to 1 TiB and a power of two (QEMU maps the whole region
# as PCI BAR 2). Orion's own limits; the host's region creator and the domain XML builder both refuse the rest.
REGION_INDEX_RANGE = (0, 9999)
REGION_SIZE_RANGE_MIB = (16, 1024 * 1024)


def region_index_allowed(index: int) -> bool:
    """Whether `index` names a region Orion makes (orion-shm's range; the domain XML builder's too)."""
    return REGION_INDEX_RANGE[0] <= index <= REGION_INDEX_RANGE[1]


def region_size_allowed(size_mib: int) -> bool:
    """Whether a region of `size_mib` MiB can be made and attached: Orion's range, and a power of two."""
    return REGION_SIZE_RANGE_MIB[0] <= size_mib <= REGION_SIZE_RANGE_MIB[1] and not size_mib & (size_mib - 1)

DEFAULT_CHANNELS = 8
DEFAULT_RING_ENTRIES = 64
# A slot holds what a launch carries inline, and the compiled hot path serves only inline records: NCCL's launches
# (cuLaunchKernelEx with its attributes and a few KiB of arguments) were staged with 512-byte slots and served in
# Python, an all-reduce of 1 MiB across two H200s then 0.49x native; 4096 bytes serve them compiled (1.3x native).
# 8 channels x 2 rings x 64 slots: 4 MiB of a region. A small region with many channels gets smaller slots (down to
# MIN_DEFAULT_SLOT_SIZE), so that the rings keep within a quarter of it.
DEFAULT_SLOT_SIZE = 4096
MIN_DEFAULT_SLOT_SIZE = 512
DEFAULT_CHUNK_COUNT = 8
MAX_DEFAULT_CHUNK = 1 * MIB
MIN_CHUNK = 16 * 1024


def _align(value: int, to: int = PAGE) -> int:
    return (value + to - 1) // to * to


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass(frozen=True)
class Geometry:
    """Where everything is in a region; the decoded header minus magic, version and CRC."""

    region_size: int
    channel_count: int
    ring_entries: int
    slot_size: int
    chunk_size: int
    chunk_count: int
    channel_offset: int
    channel_stride: int
    pool_offset: int
    pool_size: int
    off_ctrl: int
    off_req_ring: int
    off_cpl_ring: int
    off_req_staging: int
    off_cpl_staging: int
    off_ring_head: int = RING_HEAD
    off_ring_tail: int = RING_TAIL
    off_ring_slots: int = RING_SLOTS
    off_staging_chunks: int = STAGING_CHUNKS
    features: int = FEATURES
    name: str = ""

    @property
    def inline_capacity(self) -> int:
        """Largest payload that travels inside a ring slot."""
        return self.slot_size - RECORD_HEADER_SIZE

    def channel_base(self, index: int) -> int:
        if not 0 <= index < self.channel_count:
            raise IndexError(f"channel {index} outside 0..{self.channel_count - 1}")
        return self.channel_offset + index * self.channel_stride

    def pool_slice(self, index: int) -> tuple[int, int]:
        """(offset, size) of channel `index`'s share of the page-locked pool: equal, page-aligned slices, so each
        session carves its page-locked allocations from its own pages with no allocator shared between sessions."""
        size = self.pool_size // self.channel_count // PAGE * PAGE
        self.channel_base(index)  # IndexError for a channel the region does not have
        return self.pool_offset + index * size, size

    @staticmethod
    def ring_bytes(entries: int, slot_size: int) -> int:
        return _align(RING_SLOTS + entries * slot_size)

    @staticmethod
    def staging_bytes(chunk_size: int, chunk_count: int) -> int:
        return STAGING_CHUNKS + chunk_size * chunk_count

    @classmethod
    def build(cls, region_size: int, channels: int = DEFAULT_CHANNELS, ring_entries: int = DEFAULT_RING_ENTRIES,
              slot_size: int | None = None, chunk_size: int | None = None,
              chunk_count: int = DEFAULT_CHUNK_COUNT, name: str = "") -> Geometry:
        """Lay out a region: the channels first, the page-locked pool after them.

        Without an explicit slot size the largest power of two up to DEFAULT_SLOT_SIZE whose rings keep within a
        quarter of the region is used (at least MIN_DEFAULT_SLOT_SIZE: 128 MiB and 8 channels: 4096 bytes; 16 MiB:
        2048). Without an explicit chunk size the largest power of two up to 1 MiB that keeps the channels within
        half the region is used (128 MiB and 8 channels: 256 KiB chunks; 16 MiB: 16 KiB), but never below
        16 KiB, so many channels in a small region may take more than half of it.
        """
        if not 1 <= channels <= MAX_CHANNELS:
            raise ValueError(f"channel count must be in [1, {MAX_CHANNELS}], not {channels}")
        if slot_size is None:
            slot_size = DEFAULT_SLOT_SIZE
            while slot_size > MIN_DEFAULT_SLOT_SIZE and 2 * cls.ring_bytes(ring_entries, slot_size) * channels > \
                    region_size // 4:
                slot_size //= 2
        rings = 2 * cls.ring_bytes(ring_entries, slot_size)
        if chunk_size is None:
            budget = (region_size - HEADER_SIZE) // 2 // channels - PAGE - rings - 2 * STAGING_CHUNKS
            chunk_size = MAX_DEFAULT_CHUNK
            while chunk_size > MIN_CHUNK and 2 * chunk_size * chunk_count > budget:
                chunk_size //= 2
        staging = cls.staging_bytes(chunk_size, chunk_count)
        off_req_ring = PAGE
        off_cpl_ring = off_req_ring + cls.ring_bytes(ring_entries, slot_size)
        off_req_staging = off_cpl_ring + cls.ring_bytes(ring_entries, slot_size)
        off_cpl_staging = off_req_staging + staging
        stride = _align(off_cpl_staging + staging)
        pool_offset = HEADER_SIZE + channels * stride
        if pool_offset > region_size:
            raise ValueError(
                f"{channels} channels need {pool_offset // MIB + 1} MiB but the region has {region_size // MIB} MiB; "
                "use fewer channels or a larger region")
        geometry = cls(region_size=region_size, channel_count=channels, ring_entries=ring_entries,
                       slot_size=slot_size, chunk_size=chunk_size, chunk_count=chunk_count,
                       channel_offset=HEADER_SIZE, channel_stride=stride, pool_offset=pool_offset,
                       pool_size=region_size - pool_offset, off_ctrl=0, off_req_ring=off_req_ring,
                       off_cpl_ring=off_cpl_ring, off_req_staging=off_req_staging, off_cpl_staging=off_cpl_staging,
                       name=name)
        geometry.check("new region")
        return geometry

    def check(self, where: str, mapped_size: int | None = None) -> None:
        """Refuse any geometry that would make a reader touch memory outside its own blocks."""
        def bad(what: str) -> RegionFormatError:
            return RegionFormatError(f"{where}: {what}; recreate the region with 'orion-shm create' "
                                     "or restart the host agent to reformat it")
        if mapped_size is not None and self.region_size > mapped_size:
            raise bad(f"header says the region is {self.region_size} bytes but only {mapped_size} are mapped")
        if not 1 <= self.channel_count <= MAX_CHANNELS:
            raise bad(f"channel_count {self.channel_count} outside [1, {MAX_CHANNELS}]")
        lo, hi = RING_ENTRIES_RANGE
        if not (_pow2(self.ring_entries) and lo <= self.ring_entries <= hi):
            raise bad(f"ring_entries {self.ring_entries} is not a power of two in [{lo}, {hi}]")
        lo, hi = SLOT_SIZE_RANGE
        if not (_pow2(self.slot_size) and lo <= self.slot_size <= hi):
            raise bad(f"slot_size {self.slot_size} is not a power of two in [{lo}, {hi}]")
        lo, hi = CHUNK_COUNT_RANGE
        if not (_pow2(self.chunk_count) and lo <= self.chunk_count <= hi):
            raise bad(f"chunk_count {self.chunk_count} is not a power of two in [{lo}, {hi}]")
        if self.chunk_size <= 0 or self.chunk_size % PAGE or self.chunk_size > MAX_CHUNK_SIZE:
            raise bad(f"chunk_size {self.chunk_size} is not a multiple of {PAGE} up to {MAX_CHUNK_SIZE}")
        if (self.off_ring_head, self.off_ring_tail, self.off_ring_slots, self.off_staging_chunks) != (
                RING_HEAD, RING_TAIL, RING_SLOTS, STAGING_CHUNKS):
            raise bad(f"offsets table (off_ring_head {self.off_ring_head}, off_ring_tail {self.off_ring_tail}, "
                      f"off_ring_slots {self.off_ring_slots}, off_staging_chunks {self.off_staging_chunks}) differs "
                      f"from protocol version 1 ({RING_HEAD}, {RING_TAIL}, {RING_SLOTS}, {STAGING_CHUNKS})")
        if self.channel_offset < HEADER_SIZE or self.channel_offset % PAGE or self.channel_stride % PAGE:
            raise bad(f"channel_offset {self.channel_offset} or channel_stride {self.channel_stride} is not "
                      f"page-aligned after the {HEADER_SIZE}-byte header")
        blocks = sorted([
            (self.off_ctrl, PAGE, "control block"),
            (self.off_req_ring, self.ring_bytes(self.ring_entries, self.slot_size), "request ring"),
            (self.off_cpl_ring, self.ring_bytes(self.ring_entries, self.slot_size), "completion ring"),
            (self.off_req_staging, self.staging_bytes(self.chunk_size, self.chunk_count), "request staging"),
            (self.off_cpl_staging, self.staging_bytes(self.chunk_size, self.chunk_count), "completion staging"),
        ])
        end = 0
        for start, size, name in blocks:
            if start < end or start % CACHE_LINE:
                raise bad(f"{name} at {start} overlaps the block before it or is misaligned")
            end = start + size
        if end > self.channel_stride:
            raise bad(f"channel blocks end at {end}, beyond channel_stride {self.channel_stride}")
        channels_end = self.channel_offset + self.channel_count * self.channel_stride
        if channels_end > self.region_size:
            raise bad(f"{self.channel_count} channels end at {channels_end}, beyond region_size {self.region_size}")
        if self.pool_size and (self.pool_offset < channels_end or self.pool_offset % PAGE
                               or self.pool_offset + self.pool_size > self.region_size):
            raise bad(f"pool_offset {self.pool_offset} / pool_size {self.pool_size} overlaps the channels "
                      f"(which end at {channels_end}) or leaves the region")


def pack_header(g: Geometry) -> bytes:
    """The first CRC_SPAN bytes of a formatted region, CRC included."""
    fixed = {"magic": MAGIC, "version": VERSION, "header_size": HEADER_SIZE, "header_crc": 0,
             "name": g.name.encode()[:NAME_SIZE]}  # every other field is the Geometry's of that name
    raw = bytearray(CRC_SPAN)
    HEADER.pack_into(raw, 0, *(fixed[f] if f in fixed else getattr(g, f) for f in HEADER_FIELDS))
    struct.pack_into("<I", raw, CRC_OFFSET, zlib.crc32(raw))
    return bytes(raw)


def unpack_header(raw: bytes, where: str, mapped_size: int) -> Geometry:
    """Decode and validate a header; every refusal names `where` and the offending field."""
    if len(raw) < CRC_SPAN or mapped_size < HEADER_SIZE:
        raise RegionFormatError(f"{where}: {mapped_size} bytes is too small to be an Orion region "
                                f"(at least {HEADER_SIZE} bytes of header); create one with 'orion-shm create'")
    (magic, version, header_size, features, region_size, channels, entries, slot, chunk, chunks, crc,
     ch_off, stride, pool_off, pool_size, o_ctrl, o_req, o_cpl, o_reqst, o_cplst, o_head, o_tail, o_slots,
     o_chunks, name) = HEADER.unpack_from(raw, 0)
    if magic != MAGIC:
        if not any(raw[:CRC_SPAN]):
            raise RegionNotFormatted(f"{where}: the region holds no header yet (all zeros); start the host agent "
                                     "(oriond) on this host, it formats the region when it starts serving")
        raise RegionFormatError(f"{where}: not an Orion region (magic {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise RegionFormatError(f"{where}: region protocol version {version}, this software speaks {VERSION}; "
                                "use the same Orion release on both sides")
    if header_size != HEADER_SIZE:
        raise RegionFormatError(f"{where}: header_size {header_size}, expected {HEADER_SIZE}")
    check = bytearray(raw[:CRC_SPAN])
    struct.pack_into("<I", check, CRC_OFFSET, 0)
    if zlib.crc32(check) != crc:
        raise RegionFormatError(f"{where}: header checksum mismatch (the header was overwritten); restart the "
                                "host agent to reformat the region")
    geometry = Geometry(region_size=region_size, channel_count=channels, ring_entries=entries, slot_size=slot,
                        chunk_size=chunk, chunk_count=chunks, channel_offset=ch_off, channel_stride=stride,
                        pool_offset=pool_off, pool_size=pool_size, off_ctrl=o_ctrl, off_req_ring=o_req,
                        off_cpl_ring=o_cpl, off_req_staging=o_reqst, off_cpl_staging=o_cplst, off_ring_head=o_head,
                        off_ring_tail=o_tail, off_ring_slots=o_slots, off_staging_chunks=o_chunks, features=features,
                        name=name.rstrip(b"\0").decode("utf-8", "replace"))
    geometry.check(where, mapped_size)
    return geometry
