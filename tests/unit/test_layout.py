"""docs/wire-protocol.md, pinned: every documented offset and constant, hard-coded here from the doc's tables
and compared with what the code actually writes. If the code or the page changes, one of these fails.
"""
from __future__ import annotations

import dataclasses
import struct
import zlib

import pytest

from ivshmem import layout, liveness, record
from ivshmem.channel import Control, Ctrl, HostReason, HostStatus
from ivshmem.errors import RegionFormatError
from ivshmem.layout import Geometry
from ivshmem.record import CUDA_OPCODE_BASE, HEADER, MAX_OPCODE, Flag, Op, Status
from ivshmem.region import Region
from ivshmem.ring import Ring, StagingArena

MIB = 1 << 20
GIB = 1 << 30

# (offset, struct format, Geometry attribute) — the header table of docs/wire-protocol.md.
DOC_GEOMETRY_FIELDS = [
    (16, "<Q", "features"),
    (24, "<Q", "region_size"),
    (32, "<I", "channel_count"),
    (36, "<I", "ring_entries"),
    (40, "<I", "slot_size"),
    (44, "<I", "chunk_size"),
    (48, "<I", "chunk_count"),
    (56, "<Q", "channel_offset"),
    (64, "<Q", "channel_stride"),
    (72, "<Q", "pool_offset"),
    (80, "<Q", "pool_size"),
    (88, "<I", "off_ctrl"),
    (92, "<I", "off_req_ring"),
    (96, "<I", "off_cpl_ring"),
    (100, "<I", "off_req_staging"),
    (104, "<I", "off_cpl_staging"),
    (108, "<I", "off_ring_head"),
    (112, "<I", "off_ring_tail"),
    (116, "<I", "off_ring_slots"),
    (120, "<I", "off_staging_chunks"),
]


def distinctive_geometry() -> Geometry:
    """Every field a different value, so two swapped fields cannot go unnoticed (not a valid layout)."""
    values = {name: 1000 + 17 * i for i, (_, _, name) in enumerate(DOC_GEOMETRY_FIELDS)}
    values["region_size"] = 0x1122334455667788
    values["pool_size"] = 0x0102030405060708
    return Geometry(name="pinned", **values)


@pytest.mark.parametrize("geometry", [distinctive_geometry(), Geometry.build(128 * MIB, name="orionsock0")],
                         ids=["distinctive", "built-128MiB"])
def test_header_fields_sit_at_documented_offsets(geometry: Geometry) -> None:
    raw = layout.pack_header(geometry)
    assert len(raw) == 256
    assert raw[0:8] == b"ORIONSHM"
    assert struct.unpack_from("<I", raw, 8) == (1,)  # version
    assert struct.unpack_from("<I", raw, 12) == (4096,)  # header_size
    for offset, fmt, name in DOC_GEOMETRY_FIELDS:
        assert struct.unpack_from(fmt, raw, offset) == (getattr(geometry, name),), name
    assert raw[128:160] == geometry.name.encode().ljust(32, b"\0")  # name: NUL-padded UTF-8
    assert raw[124:128] == bytes(4) and raw[160:] == bytes(96)  # nothing else is written
    # header_crc at 52: CRC-32 of bytes 0..255 with the field zeroed
    zeroed = bytearray(raw)
    zeroed[52:56] = bytes(4)
    assert struct.unpack_from("<I", raw, 52) == (zlib.crc32(zeroed),)


def test_header_constants_match_the_doc() -> None:
    assert layout.MAGIC == b"ORIONSHM"
    assert layout.VERSION == 1
    assert layout.HEADER_SIZE == 4096
    assert layout.CRC_SPAN == 256 and layout.CRC_OFFSET == 52
    assert layout.FEATURE_STAGED == 1 and layout.FEATURE_ASYNC_ERRORS == 2 and layout.FEATURE_HOST_HEARTBEAT == 4
    assert (layout.AGENT_HEARTBEAT, layout.AGENT_PID, layout.AGENT_STATE) == (1024, 1032, 1036)
    assert layout.AGENT_HEARTBEAT % 64 == 0  # own cache line
    assert (layout.AGENT_NEVER, layout.AGENT_SERVING, layout.AGENT_STOPPED) == (0, 1, 2)
    assert layout.MAX_CHANNELS == 256
    assert layout.RING_ENTRIES_RANGE == (2, 4096)
    assert layout.SLOT_SIZE_RANGE == (64, 65536)
    assert layout.CHUNK_COUNT_RANGE == (2, 1024)
    assert layout.RECORD_HEADER_SIZE == 32


def test_header_round_trips_through_unpack() -> None:
    g = Geometry.build(128 * MIB, channels=5, ring_entries=128, slot_size=1024, name="orionsock3")
    assert layout.unpack_header(layout.pack_header(g), "here", 128 * MIB) == g
    long_name = Geometry.build(128 * MIB, name="région-" + "x" * 40)
    assert layout.unpack_header(layout.pack_header(long_name), "here", 128 * MIB).name == \
        long_name.name.encode()[:32].decode()  # cut to 32 bytes


def test_agent_words_sit_at_documented_offsets_outside_the_crc(region_path: str) -> None:
    with Region.open(region_path) as region:
        region.format(Geometry.build(region.size, name="pinned"))
        before = bytes(region.buf[:256])
        region.set_agent(pid=0x01020304, state=layout.AGENT_SERVING)
        for _ in range(3):
            region.set_agent(beat=True)
        raw = bytes(region.buf[:4096])
        assert struct.unpack_from("<Q", raw, 1024) == (3,)
        assert struct.unpack_from("<I", raw, 1032) == (0x01020304,)
        assert struct.unpack_from("<I", raw, 1036) == (1,)
        assert raw[:256] == before  # the agent words never touch the CRC span
        assert region.agent_words() == (3, 0x01020304, 1)
    with Region.open(region_path) as again:  # still valid: the agent words are outside the CRC
        assert again.geometry.name == "pinned"


def test_control_words_sit_at_documented_offsets(region_path: str) -> None:
    doc = {"CLIENT_GEN": (0, 4), "CLIENT_ACTIVE": (4, 4), "CLIENT_PID": (8, 4), "LIVENESS": (12, 4),
           "CLIENT_HEARTBEAT": (16, 8), "HOST_GEN": (64, 4), "HOST_STATUS": (68, 4), "HOST_REASON": (72, 4),
           "HOST_WORKER": (76, 4), "HOST_HEARTBEAT": (80, 8)}
    assert {w.name: int(w) for w in Ctrl} == {name: off for name, (off, _) in doc.items()}
    with Region.open(region_path) as region:
        g = Geometry.build(region.size)
        region.format(g)
        base = g.channel_base(3)
        ctrl = Control(region, base)
        for i, word in enumerate(Ctrl):
            value = 0x0A0B0C0D0E0F1011 + i if doc[word.name][1] == 8 else 0x51525354 + i
            ctrl[word] = value
            offset, size = doc[word.name]
            assert int.from_bytes(region.buf[base + offset:base + offset + size], "little") == value, word.name
            assert ctrl[word] == value
        assert not any(region.buf[base + 88:base + 4096])  # nothing else in the control block was written
    assert [int(s) for s in HostStatus] == [0, 1, 2, 3]
    assert (HostStatus.IDLE, HostStatus.SERVING, HostStatus.FAILED, HostStatus.RECLAIMED) == (0, 1, 2, 3)
    assert HostReason.NONE == 0 and len(set(HostReason)) == len(HostReason)
    assert (liveness.LOCK_MODE, liveness.HEARTBEAT_MODE) == (1, 2)
    assert liveness.HEARTBEAT_PERIOD_S == 0.5


def test_ring_words_and_slots_sit_at_documented_offsets() -> None:
    entries, slot, base = 8, 64, 4096
    buf = bytearray(base + 128 + entries * slot + 64)
    words = memoryview(buf).cast("I")
    producer = Ring(words, base, entries, slot, "req")
    consumer = Ring(words, base, entries, slot, "req")
    for i in range(entries + 3):
        offset = producer.writable()
        assert offset == base + 128 + (i % entries) * slot  # slots at 128, index & (entries - 1)
        producer.publish()
        assert struct.unpack_from("<I", buf, base + 64) == (i + 1,)  # tail at 64, free-running
        assert consumer.readable() == offset
        consumer.release()
        assert struct.unpack_from("<I", buf, base + 0) == (i + 1,)  # head at 0
    assert (layout.RING_HEAD, layout.RING_TAIL, layout.RING_SLOTS) == (0, 64, 128)
    assert bytes(buf[:base]) == bytes(base) and bytes(buf[-64:]) == bytes(64)  # nothing outside the block


def test_staging_words_and_chunks_sit_at_documented_offsets() -> None:
    count, chunk, base = 4, 4096, 8192
    buf = bytearray(base + 4096 + count * chunk)
    words = memoryview(buf).cast("I")
    producer = StagingArena(words, base, chunk, count, "st")
    consumer = StagingArena(words, base, chunk, count, "st")
    for i in range(count * 2 + 1):
        offset = producer.writable()
        assert offset == base + 4096 + (i % count) * chunk
        producer.publish()
        assert struct.unpack_from("<I", buf, base + 64) == (i + 1,)
        assert consumer.readable() == offset
        consumer.release()
        assert struct.unpack_from("<I", buf, base) == (i + 1,)
    assert (layout.STAGING_HEAD, layout.STAGING_TAIL, layout.STAGING_CHUNKS) == (0, 64, 4096)


def test_record_header_fields_sit_at_documented_offsets() -> None:
    assert HEADER.size == 32
    raw = HEADER.pack(0x0102030405060708, 0x11121314, 0x21222324, 0x31323334, 0x41424344, -5, 0x51525354)
    assert struct.unpack_from("<Q", raw, 0) == (0x0102030405060708,)  # call_id
    assert struct.unpack_from("<I", raw, 8) == (0x11121314,)  # opcode
    assert struct.unpack_from("<I", raw, 12) == (0x21222324,)  # flags
    assert struct.unpack_from("<I", raw, 16) == (0x31323334,)  # length
    assert struct.unpack_from("<I", raw, 20) == (0x41424344,)  # generation
    assert struct.unpack_from("<i", raw, 24) == (-5,)  # status (signed)
    assert struct.unpack_from("<I", raw, 28) == (0x51525354,)  # seq (a ring slot's publish mark)
    assert record.SEQ_AT == 28 and record.publish_mark(1) == 0x80000001 and record.publish_mark(0) == 0x80000000
    assert (Flag.NO_REPLY, Flag.STAGED, Flag.ASYNC_ERROR) == (1, 2, 4)
    assert [(s.name, int(s)) for s in Status] == [("OK", 0), ("MALFORMED", -1), ("UNKNOWN_OPCODE", -2),
                                                   ("TOO_LARGE", -3), ("HANDLER_FAILED", -4),
                                                   ("PROTOCOL_VIOLATION", -5), ("REFUSED", -6)]
    assert [(o.name, int(o)) for o in Op] == [("HELLO", 1), ("ECHO", 2), ("NOP", 3), ("DRAIN", 4), ("FILL", 5),
                                              ("AGENT_INFO", 6), ("BIND", 7), ("STATS", 8),
                                              ("GRANT_SHARE", 9), ("GRANT_JOIN", 10)]
    assert CUDA_OPCODE_BASE == 0x100 and MAX_OPCODE == 0xFFFF


def test_default_channel_layout_matches_the_doc() -> None:
    g = Geometry.build(128 * MIB)
    assert g.off_ctrl == 0
    assert g.off_req_ring == 4096
    assert g.off_req_ring < g.off_cpl_ring < g.off_req_staging < g.off_cpl_staging < g.channel_stride
    assert g.channel_offset == 4096
    assert (g.off_ring_head, g.off_ring_tail, g.off_ring_slots, g.off_staging_chunks) == (0, 64, 128, 4096)
    assert g.inline_capacity == g.slot_size - 32
    # "a 128 MiB region gets 256 KiB chunks and a 16 MiB one 32 KiB chunks"
    assert g.chunk_size == 256 * 1024
    assert Geometry.build(16 * MIB).chunk_size == 32 * 1024
    # slots that hold an NCCL launch (a few KiB), smaller where the rings would take more than a quarter of the region
    assert g.slot_size == 4096
    assert Geometry.build(16 * MIB).slot_size == 2048 and Geometry.build(16 * MIB, 32).slot_size == 512
    assert g.features == layout.FEATURE_STAGED | layout.FEATURE_ASYNC_ERRORS | layout.FEATURE_HOST_HEARTBEAT


def _blocks(g: Geometry) -> list[tuple[int, int, str]]:
    """Every byte range of the region the layout assigns: header, each channel's five blocks, the pool."""
    ring = Geometry.ring_bytes(g.ring_entries, g.slot_size)
    staging = Geometry.staging_bytes(g.chunk_size, g.chunk_count)
    out = [(0, layout.HEADER_SIZE, "header")]
    for k in range(g.channel_count):
        base = g.channel_base(k)
        out += [(base + g.off_ctrl, layout.PAGE, f"ch{k} control"), (base + g.off_req_ring, ring, f"ch{k} req ring"),
                (base + g.off_cpl_ring, ring, f"ch{k} cpl ring"),
                (base + g.off_req_staging, staging, f"ch{k} req staging"),
                (base + g.off_cpl_staging, staging, f"ch{k} cpl staging")]
    if g.pool_size:
        out.append((g.pool_offset, g.pool_size, "pool"))
    return out


@pytest.mark.parametrize("size", [16 * MIB, 128 * MIB, 1 * GIB], ids=["16MiB", "128MiB", "1GiB"])
@pytest.mark.parametrize("channels", [1, 8, 32])
def test_built_geometry_blocks_are_disjoint_aligned_and_inside(size: int, channels: int) -> None:
    g = Geometry.build(size, channels)
    g.check("built", size)
    blocks = sorted(_blocks(g))
    end = 0
    for start, length, name in blocks:
        assert start >= end, f"{name} overlaps the block before it"
        assert start % layout.PAGE == 0, f"{name} at {start} is not page-aligned"
        assert length > 0
        end = start + length
    assert end <= size
    channels_end = g.channel_offset + g.channel_count * g.channel_stride
    assert g.channel_offset % layout.PAGE == 0 and g.channel_stride % layout.PAGE == 0
    assert g.pool_offset == channels_end  # the pool comes right after the channels
    assert g.pool_offset + g.pool_size == size
    assert g.chunk_size % layout.PAGE == 0 and layout.MIN_CHUNK <= g.chunk_size <= layout.MAX_DEFAULT_CHUNK
    # The default chunk is the largest power of two (up to 1 MiB) keeping the channels within half the region;
    # only the 16 KiB floor may push them past half (e.g. 32 channels in 16 MiB).
    if g.chunk_size > layout.MIN_CHUNK:
        assert channels_end - g.channel_offset <= size // 2
    if g.chunk_size < layout.MAX_DEFAULT_CHUNK:
        try:
            doubled = Geometry.build(size, channels, chunk_size=2 * g.chunk_size)
        except ValueError:
            pass  # does not fit at all
        else:
            assert doubled.pool_offset - doubled.channel_offset > size // 2


def test_build_refuses_impossible_requests() -> None:
    for channels in (0, 257):
        with pytest.raises(ValueError, match="channel count"):
            Geometry.build(128 * MIB, channels)
    with pytest.raises(ValueError, match="fewer channels or a larger region"):
        Geometry.build(16 * MIB, 256)


GOOD = Geometry.build(32 * MIB, name="good")
_CH_END = GOOD.channel_offset + GOOD.channel_count * GOOD.channel_stride
BAD_GEOMETRIES = {
    "no channels": (dict(channel_count=0), "channel_count"),
    "too many channels": (dict(channel_count=257), "channel_count"),
    "ring entries not power of two": (dict(ring_entries=48), "ring_entries"),
    "ring entries 1": (dict(ring_entries=1), "ring_entries"),
    "ring entries 8192": (dict(ring_entries=8192), "ring_entries"),
    "slot size not power of two": (dict(slot_size=96), "slot_size"),
    "slot size 32": (dict(slot_size=32), "slot_size"),
    "slot size 128 KiB": (dict(slot_size=131072), "slot_size"),
    "chunk count not power of two": (dict(chunk_count=6), "chunk_count"),
    "chunk count 1": (dict(chunk_count=1), "chunk_count"),
    "chunk count 2048": (dict(chunk_count=2048), "chunk_count"),
    "chunk size not page multiple": (dict(chunk_size=65536 + 512), "chunk_size"),
    "chunk size 0": (dict(chunk_size=0), "chunk_size"),
    "chunk size 128 MiB": (dict(chunk_size=128 * MIB), "chunk_size"),
    "ring head moved": (dict(off_ring_head=4), "off_ring_head 4"),
    "ring slots moved": (dict(off_ring_slots=256), "off_ring_slots 256"),
    "staging chunks moved": (dict(off_staging_chunks=8192), "off_staging_chunks 8192"),
    "channels inside the header": (dict(channel_offset=0), "page-aligned"),
    "channels misaligned": (dict(channel_offset=4096 + 64), "page-aligned"),
    "stride misaligned": (dict(channel_stride=GOOD.channel_stride + 64), "page-aligned"),
    "rings overlap": (dict(off_cpl_ring=GOOD.off_req_ring), "overlaps"),
    "staging overlaps ring": (dict(off_req_staging=GOOD.off_cpl_ring + 64), "overlaps"),
    "block misaligned": (dict(off_cpl_staging=GOOD.off_cpl_staging + 4), "misaligned"),
    "blocks past stride": (dict(channel_stride=GOOD.channel_stride - 4096), "beyond channel_stride"),
    "channels past region": (dict(channel_count=100), "beyond region_size"),
    "pool over channels": (dict(pool_offset=_CH_END - 4096), "pool"),
    "pool misaligned": (dict(pool_offset=_CH_END + 8, pool_size=4096), "pool"),
    "pool past region": (dict(pool_size=GOOD.pool_size + 4096), "pool"),
}


def test_good_geometry_passes_check() -> None:
    GOOD.check("here", 32 * MIB)
    GOOD.check("here")


@pytest.mark.parametrize("case", BAD_GEOMETRIES, ids=list(BAD_GEOMETRIES))
def test_check_refuses_bad_geometry(case: str) -> None:
    changes, expected = BAD_GEOMETRIES[case]
    bad = dataclasses.replace(GOOD, **changes)
    with pytest.raises(RegionFormatError) as info:
        bad.check("/dev/shm/orionsock9", 32 * MIB)
    message = str(info.value)
    assert "/dev/shm/orionsock9" in message
    assert expected in message


def test_check_refuses_a_region_larger_than_the_mapping() -> None:
    with pytest.raises(RegionFormatError, match="only 16777216 are mapped"):
        GOOD.check("/dev/shm/orionsock9", 16 * MIB)
