"""The mirror of a relayed session's page-locked memory, each half on its own (docs/remote.md, "Kernels given
page-locked memory"): the GPU host's PoolMirror (host_agent/session/pool_mirror.py) and the relay's MirrorRelay
(host_agent/relay/mirror.py). End to end, relayed, the program of tests/differential/pool_kernels.py checks them
(tests/differential/test_differential.py, and on the GPU tests/gpu/test_differential_gpu.py)."""
from __future__ import annotations

import ctypes
import mmap
import struct

from host_agent.relay.mirror import MirrorRelay, runs
from host_agent.session.pinned_pool import HostPool
from host_agent.session.pool_mirror import MAX_MIRROR_BYTES, PoolMirror
from ivshmem.cuda_status import INVALID_VALUE, OUT_OF_MEMORY, SUCCESS
from ivshmem.driver_api import (
    CALLS,
    POOL_MIRROR_MAP,
    POOL_MIRROR_READ,
    POOL_MIRROR_REPLY,
    POOL_MIRROR_REQUEST,
    POOL_MIRROR_UNMAP,
    POOL_MIRROR_WRITE,
)
from ivshmem.layout import Geometry
from ivshmem.record import Record
from ivshmem.region import Region
from tests.fake_driver import FakeDriver

PAGE = mmap.PAGESIZE


def _driver() -> FakeDriver:
    driver = FakeDriver(devices=1)
    driver.cuInit(0)
    driver.cuCtxSetCurrent(driver.cuDevicePrimaryCtxRetain(0)[1])
    return driver


def _free_range(size: int) -> int:
    probe = mmap.mmap(-1, size)
    address = ctypes.addressof(ctypes.c_char.from_buffer(probe))
    probe.close()
    return address


def _ask(mirror: PoolMirror, op: int, address: int, size: int = 0, data: bytes = b"") -> tuple[int, bytes]:
    return mirror.answer(POOL_MIRROR_REQUEST.encode(op, address, size, data))


def test_a_mirror_lies_at_the_guests_address_where_it_is_free_and_elsewhere_where_it_is_taken() -> None:
    driver = _driver()
    mirror = PoolMirror(driver)
    free = _free_range(2 * PAGE)
    status, reply = _ask(mirror, POOL_MIRROR_MAP, free, 2 * PAGE)
    assert status == SUCCESS and POOL_MIRROR_REPLY.decode(reply) == (free,)
    assert driver.registered[free] == 2 * PAGE  # registered: a kernel reaches it at the guest's pointer
    taken = ctypes.create_string_buffer(3 * PAGE)
    address = (ctypes.addressof(taken) + PAGE - 1) // PAGE * PAGE  # certainly mapped in this process
    status, reply = _ask(mirror, POOL_MIRROR_MAP, address, PAGE)
    (where,) = POOL_MIRROR_REPLY.decode(reply)
    assert status == SUCCESS and where != address and driver.registered[where] == PAGE
    assert _ask(mirror, POOL_MIRROR_WRITE, where + 8, 0, b"mirrored") == (SUCCESS, b"")
    assert _ask(mirror, POOL_MIRROR_READ, where + 8, 8) == (SUCCESS, b"mirrored")
    assert ctypes.string_at(address, 8) != b"mirrored"  # nothing of this process's own memory was touched
    assert _ask(mirror, POOL_MIRROR_UNMAP, where) == (SUCCESS, b"")
    assert where not in driver.registered
    assert _ask(mirror, POOL_MIRROR_UNMAP, free)[0] == SUCCESS


def test_a_relaying_peer_reaches_nothing_but_its_mirrors() -> None:
    """What a relaying oriond can make the GPU host do with POOL_MIRROR is bounded (docs/security.md)."""
    mirror = PoolMirror(_driver())
    free = _free_range(PAGE)
    assert _ask(mirror, POOL_MIRROR_MAP, free + 1, PAGE)[0] == INVALID_VALUE  # not page-aligned
    assert _ask(mirror, POOL_MIRROR_MAP, free, PAGE + 1)[0] == INVALID_VALUE
    assert _ask(mirror, POOL_MIRROR_MAP, free, MAX_MIRROR_BYTES + PAGE)[0] == OUT_OF_MEMORY
    status, reply = _ask(mirror, POOL_MIRROR_MAP, free, PAGE)
    (where,) = POOL_MIRROR_REPLY.decode(reply)
    assert _ask(mirror, POOL_MIRROR_READ, where + PAGE - 4, 8)[0] == INVALID_VALUE  # past its end
    assert _ask(mirror, POOL_MIRROR_WRITE, where - 8, 0, b"x" * 16)[0] == INVALID_VALUE
    own = ctypes.create_string_buffer(b"secret", 8)
    assert _ask(mirror, POOL_MIRROR_READ, ctypes.addressof(own), 6)[0] == INVALID_VALUE  # this process's memory
    assert _ask(mirror, 9, where)[0] == INVALID_VALUE


def test_runs_are_exactly_the_bytes_that_differ() -> None:
    old = bytearray(3 * 4096)
    new = bytearray(old)
    new[5] = new[6] = 1
    new[4095:4097] = b"\x02\x02"
    new[-1] = 3
    assert list(runs(old, new)) == [(5, 7), (4095, 4097), (3 * 4096 - 1, 3 * 4096)]
    assert list(runs(old, old)) == []


def test_the_relay_keeps_both_sides_writes_and_points_launches_at_a_mirror_placed_elsewhere(region_path: str) -> None:
    with Region.open(region_path) as region:
        region.format(Geometry.build(region.size))
        pool = HostPool(region, 1)
        assert pool.map(pool.own_address)[0] == SUCCESS
        status, pointer = pool.allocate(2 * PAGE, 0, None)
        assert status == SUCCESS
        relay = MirrorRelay(pool)
        launch = CALLS["cuLaunchKernel"]
        params = struct.pack("<QII", pointer + 16, 4, 7)
        payload = launch.request.encode(1, 1, 1, 1, 4, 1, 1, 0, 0, params)
        record = Record(1, launch.opcode, 0, len(payload), 0, 0, payload)
        offset = pool.allocation_of(pointer)
        named = relay.scan(record)
        assert named == [(len(payload) - 16, offset)] and relay.unmirrored(named) == [offset]
        elsewhere = 0x7000_0000_0000
        relay.adopt(offset, elsewhere)
        assert relay.unmirrored(named) == []
        moved = relay.translate(payload, named)
        assert moved is not None and struct.unpack_from("<Q", moved, len(moved) - 16)[0] == elsewhere + 16
        memory = (ctypes.c_uint8 * (2 * PAGE)).from_address(pointer)
        memory[0] = 9
        first = relay.changes({offset})
        assert [(address, len(data)) for address, data in first] == [(elsewhere, 2 * PAGE)]
        memory[1] = 5  # the CPU writes byte 1 ...
        mirror = bytearray(first[0][1])
        mirror[100] = 42  # ... and a kernel byte 100
        relay.merge(offset, bytes(mirror))
        assert (memory[0], memory[1], memory[100]) == (9, 5, 42)  # both writes stay
        assert relay.changes() == [(elsewhere + 1, b"\x05")]  # only the CPU's write goes to the mirror
        assert pool.free(pointer) == SUCCESS
        assert relay.forget_freed() == [elsewhere] and not relay.active
