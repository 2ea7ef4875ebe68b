"""Page-locked host memory from the region's pool, per-thread context stacks, concurrent threads, occupancy,
cuGetProcAddress and launch attributes.

Through the forwarding rig (tests/forwarding_rig.py): real Forwarders, rings and executors, over the fake driver.
What the fake saw (its journal) shows that a copy with pool memory reached the driver as an address in the shared
pages — no bytes staged — and that each thread's calls ran under that thread's context.
"""
from __future__ import annotations

import ctypes
import mmap
import struct
import threading
from typing import Any

from guest_runtime.occupancy import PotentialBlockSize
from host_agent.session.pinned_pool import HostPool
from ivshmem import fixed_map
from ivshmem.driver_api import (
    CALLS,
    LAUNCH_ATTRIBUTE,
    LAUNCH_HEAD,
    PINNED_COPY,
    POOL_MIRROR_MAP,
    POOL_MIRROR_OPCODE,
    POOL_MIRROR_REQUEST,
    LaunchConfig,
)
from ivshmem.layout import Geometry
from ivshmem.record import Status
from ivshmem.region import Region
from tests import forwarding_rig
from tests.fake_driver import FakeDriver
from tests.forwarding_rig import Guest, Rig, local_only
from tests.unit.test_forwarding_roundtrip import kernel_ptx

SUCCESS, INVALID_VALUE, OUT_OF_MEMORY, INVALID_CONTEXT, NOT_FOUND = 0, 1, 2, 201, 500
CU_MEMHOSTALLOC_DEVICEMAP = 2
bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures


def number(value: Any) -> int:
    return int(value[1]) if isinstance(value, list) else int(value or 0)


def host_alloc(g: Guest, size: int, flags: int | None = None) -> tuple[int, int]:
    cell = ctypes.c_uint64(0)
    if flags is None:
        return g.fn["cuMemAllocHost"](ctypes.addressof(cell), size), cell.value
    return g.fn["cuMemHostAlloc"](ctypes.addressof(cell), size, flags), cell.value


def slice_of(g: Guest) -> tuple[int, int]:
    """(address, size) of this guest's channel's pool slice as its pointers see it (its own mapping of the
    region, or a second one at the host's address if that is where the two agreed)."""
    channel = g.channel
    offset, size = channel.geometry.pool_slice(channel.index)
    base = g.forwarder._pool.base
    assert base and g.forwarder._pool.size == size, "no page-locked allocation was made yet"
    channel.region.buf[offset:offset + 8] = b"sentinel"  # whichever mapping: the very same pages
    assert ctypes.string_at(base, 8) == b"sentinel"
    return base, size


# --- page-locked memory ------------------------------------------------------------------------------------------

@local_only("pool memory has no device pointer on the GPU host")
def test_page_locked_memory_is_carved_from_the_channels_pool_slice(rig: Rig) -> None:
    g = rig.guest()
    g.setup()
    offset, size = g.channel.geometry.pool_slice(g.channel.index)
    g.channel.region.buf[offset:offset + size] = b"\xa5" * size  # an earlier session's data
    status, pointer = host_alloc(g, 10_000)
    assert status == SUCCESS
    assert bytes(g.channel.region.buf[offset:offset + size]) == bytes(size)  # cleared for this session
    base, size = slice_of(g)
    assert base <= pointer < base + size and pointer % mmap.PAGESIZE == 0
    status, second = host_alloc(g, 100, CU_MEMHOSTALLOC_DEVICEMAP)
    assert status == SUCCESS and second >= pointer + 12288  # page-granular, no overlap
    assert g.ok("cuMemHostGetFlags", second) == CU_MEMHOSTALLOC_DEVICEMAP
    assert g.ok("cuMemHostGetDevicePointer", pointer, 0) == pointer  # same address here, on the host, on the GPU
    registered = rig.entries(0, "cuMemHostRegister")
    assert len(registered) == 1 and number(registered[0]["args"][0]) == base  # the host mapped it where we see it
    assert g.call("cuMemHostGetDevicePointer", pointer + 20_000, 0)[0] == INVALID_VALUE  # past the allocation
    assert g.call("cuMemHostGetDevicePointer", pointer, 1)[0] == INVALID_VALUE  # flags must be 0
    assert g.call("cuMemFreeHost", pointer)[0] == SUCCESS
    assert g.call("cuMemFreeHost", pointer)[0] == INVALID_VALUE  # freed twice
    assert g.call("cuMemFreeHost", second + 8)[0] == INVALID_VALUE  # not the start of an allocation
    assert g.call("cuMemHostGetFlags", pointer)[0] == INVALID_VALUE  # freed memory is no longer ours


@local_only("pool bytes travel to the GPU host")
def test_copies_with_page_locked_memory_move_no_bytes_through_the_ring(rig: Rig) -> None:
    g = rig.guest()
    g.setup()
    device = g.alloc(1 << 20)
    _, pinned = host_alloc(g, 1 << 20)
    payload = bytes(range(256)) * 4096
    ctypes.memmove(pinned, payload, len(payload))
    mark = rig.mark()
    assert g.fn["cuMemcpyHtoD"](device, pinned, len(payload)) == SUCCESS
    assert g.dtoh(device, len(payload))[1] == payload  # (a pageable copy back, for comparison)
    [htod] = rig.entries(mark, "cuMemcpyHtoD")
    assert htod["args"][1] == pinned  # the driver read the shared pages at the guest's own address

    ctypes.memset(pinned, 0, len(payload))
    stream = g.ok("cuStreamCreate", 1)
    mark = rig.mark()
    assert g.fn["cuMemcpyDtoHAsync"](pinned + 4096, device, 4096, stream) == SUCCESS  # posted
    assert g.call("cuStreamSynchronize", stream)[0] == SUCCESS
    assert ctypes.string_at(pinned + 4096, 4096) == payload[:4096]
    assert ctypes.string_at(pinned, 4096) == bytes(4096)
    [dtoh] = rig.entries(mark, "cuMemcpyDtoHAsync")
    assert dtoh["args"][0] == pinned + 4096

    # cuMemcpy with unified addressing takes the same path, whatever the size: the host reads the pool in stream
    # order (earlier work may still write those pages), and the call returns once it has
    for size in (1 << 20, 16):
        mark = rig.mark()
        assert g.fn["cuMemcpy"](device + 8, pinned + 4096, size - 4096 if size > 4096 else size) == SUCCESS
        assert [e["args"][1] for e in rig.entries(mark, "cuMemcpyHtoD")] == [pinned + 4096]
    ctypes.memset(pinned + 4096, 0xEE, 16)
    assert g.dtoh(device + 8, 16)[1] == payload[:16]


def test_a_posted_page_locked_copy_reports_its_error_at_the_next_synchronising_call(rig: Rig) -> None:
    g = rig.guest()
    g.setup()
    device = g.alloc(4096)
    _, pinned = host_alloc(g, 8192)
    stream = g.ok("cuStreamCreate", 0)
    assert g.fn["cuMemcpyHtoDAsync"](device, pinned, 8192, stream) == SUCCESS  # too long for `device`: posted
    assert g.sync() == INVALID_VALUE
    assert g.fn["cuMemcpyHtoD"](device, pinned + 4096, 8192) == INVALID_VALUE  # past the pinned allocation
    assert g.sync() == SUCCESS


def test_the_host_refuses_pool_addresses_that_are_not_the_sessions_allocations(rig: Rig) -> None:
    owner, thief = rig.guest(), rig.guest()
    owner.setup()
    thief.setup()
    device = thief.alloc(4096)
    _, secret = host_alloc(owner, 4096)
    _, mine = host_alloc(thief, 4096)
    call = CALLS["cuMemcpyHtoD"]
    mark = rig.mark()
    for pointer in (secret, mine + 4096, mine - 4096, 0):  # another session's, past ours, before ours, NULL
        reply = thief.channel.call(call.opcode + PINNED_COPY, struct.pack("<QQQ", device, 64, pointer))
        assert reply.status == INVALID_VALUE, hex(pointer)
    assert rig.entries(mark, "cuMemcpyHtoD") == []


def test_the_pool_slice_runs_out_with_out_of_memory_and_recovers_after_a_free(rig: Rig) -> None:
    g = rig.guest()
    g.setup()
    assert g.call("cuMemFreeHost", host_alloc(g, 1)[1])[0] == SUCCESS
    _, size = slice_of(g)
    status, whole = host_alloc(g, size)
    assert status == SUCCESS
    assert host_alloc(g, 1)[0] == OUT_OF_MEMORY
    assert g.call("cuMemFreeHost", whole)[0] == SUCCESS
    assert host_alloc(g, size // 2)[0] == SUCCESS
    assert host_alloc(g, size)[0] == OUT_OF_MEMORY


def test_host_pool_maps_at_the_guests_address_or_translates(region_path: str) -> None:
    """HostPool on its own: a free proposed address is mapped there; a taken one falls back to the worker's own
    mapping and guest pointers are translated by offset (only cuMemHostGetDevicePointer is kernel-usable)."""
    with Region.open(region_path) as region:
        region.format(Geometry.build(region.size))
        pool = HostPool(region, 1)
        driver = FakeDriver(devices=1)
        driver.cuInit(0)
        driver.cuCtxSetCurrent(driver.cuDevicePrimaryCtxRetain(0)[1])
        taken = region.address(0)  # certainly mapped in this process
        assert pool.map(taken) == (SUCCESS, pool.own_address)
        status, pointer = pool.allocate(100, 0, driver)
        assert status == SUCCESS and pointer == taken
        assert pool.host_address(pointer + 50, 50) == pool.own_address + 50
        assert pool.host_address(pointer + 50, 51) is None  # past the 100 bytes
        assert pool.device_pointer(pointer) == pool.own_address  # the fake maps registered memory 1:1
        assert pool.map(taken + 4096) == (INVALID_VALUE, pool.own_address)  # no moving once pages are out
        pool.close(driver)

        probe = mmap.mmap(-1, pool.size + mmap.PAGESIZE)  # find a free range, then free it
        free = ctypes.addressof(ctypes.c_char.from_buffer(probe))
        probe.close()
        again = HostPool(region, 1)
        assert again.map(free) == (SUCCESS, free) and again.fixed_mapping
        ctypes.memmove(free, b"shared", 6)  # the fixed mapping and the worker's mapping are the same pages
        assert ctypes.string_at(again.own_address, 6) == b"shared"
        again.close(driver)
        assert not fixed_map.map_at(region.fd, 0, mmap.PAGESIZE, region.address(0))  # NOREPLACE: taken stays taken


# --- per-thread contexts -----------------------------------------------------------------------------------------

def in_thread(function: Any) -> Any:
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(function()))
    thread.start()
    thread.join(30)
    assert box, "the thread failed"
    return box[0]


def test_each_thread_has_its_own_context_stack(rig: Rig) -> None:
    g = rig.guest()
    primary = g.setup()
    assert g.ok("cuCtxGetCurrent") == primary
    assert in_thread(lambda: g.ok("cuCtxGetCurrent")) == 0  # a new thread has no current context
    assert in_thread(lambda: g.call("cuMemAlloc", 64)[0]) == INVALID_CONTEXT  # ...as the host is told
    assert g.call("cuMemAlloc", 64)[0] == SUCCESS  # and the first thread's context is back for its calls

    cell = ctypes.c_uint64(0)
    empty_params = ctypes.create_string_buffer(24)  # CUctxCreateParams with nothing in it: as no params
    assert g.fn["cuCtxCreate"](ctypes.addressof(cell), ctypes.addressof(empty_params), 0, 1) == SUCCESS
    created = cell.value
    affinity = ctypes.create_string_buffer(struct.pack("<QiiQ", ctypes.addressof(empty_params), 1, 0, 0))
    assert g.fn["cuCtxCreate"](ctypes.addressof(ctypes.c_uint64()), ctypes.addressof(affinity), 0, 1) == 801
    assert g.ok("cuCtxGetCurrent") == created and g.ok("cuCtxGetDevice") == 1  # pushed: current
    assert g.ok("cuCtxPopCurrent") == created
    assert g.ok("cuCtxGetCurrent") == primary and g.ok("cuCtxGetDevice") == 0
    assert g.call("cuCtxPushCurrent", created)[0] == SUCCESS and g.ok("cuCtxGetDevice") == 1
    assert g.call("cuCtxDestroy", created)[0] == SUCCESS  # current: popped too
    assert g.ok("cuCtxGetCurrent") == primary
    assert g.call("cuCtxPushCurrent", created)[0] == INVALID_CONTEXT  # gone: the host refuses it
    assert g.ok("cuCtxGetCurrent") == primary

    def pop_everything() -> list[int]:
        return [g.call("cuCtxPopCurrent")[0], g.call("cuCtxSetCurrent", 0)[0]]
    assert in_thread(pop_everything) == [INVALID_CONTEXT, SUCCESS]  # an empty stack: nothing to pop


def test_threads_calling_at_once_each_get_their_own_answers(rig: Rig) -> None:
    """Without the forwarder's lock these threads would interleave records on one ring."""
    g = rig.guest()
    g.setup()
    g.ok("cuDevicePrimaryCtxRetain", 1)
    problems: list[str] = []

    def worker(n: int) -> None:
        device = n % 2
        ctx = g.ok("cuDevicePrimaryCtxRetain", device)
        assert g.call("cuCtxSetCurrent", ctx)[0] == SUCCESS
        pointer = g.alloc(4096)
        for round_ in range(40):
            data = bytes([n, round_]) * 2048
            if g.htod(pointer, data) != SUCCESS or g.dtoh(pointer, 4096)[1] != data:
                problems.append(f"thread {n} round {round_}: wrong bytes")
                return
            if g.ok("cuCtxGetDevice") != device:
                problems.append(f"thread {n} round {round_}: ran on the other thread's device")
                return
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(50)
    assert not any(t.is_alive() for t in threads) and not problems, problems


# --- cuGetProcAddress and occupancy ------------------------------------------------------------------------------

def test_get_proc_address_without_the_hook_finds_nothing(rig: Rig) -> None:
    """Found symbols are tested with the hook installed (tests/wire/test_cuda_no_gpu.py) and on a GPU."""
    g = rig.guest()
    pfn, status = ctypes.c_void_p(1), ctypes.c_int(7)
    name = ctypes.create_string_buffer(b"cuInit")
    assert g.fn["cuGetProcAddress"](ctypes.addressof(name), ctypes.addressof(pfn), 13000, 0,
                                    ctypes.addressof(status)) == SUCCESS  # as the driver: the status says it
    assert pfn.value is None and status.value == 1  # CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
    assert g.fn["cuGetProcAddress"](ctypes.addressof(name), ctypes.addressof(pfn), 13000, 0, None) == NOT_FOUND


def test_potential_block_size_with_a_callback_is_searched_in_the_guest_like_the_driver_does(rig: Rig) -> None:
    g = rig.guest()
    g.setup()
    status, module = g.load_module(kernel_ptx() + b"\0")
    assert status == SUCCESS
    function = g.by_name("cuModuleGetFunction", module, b"mix")[1][0]
    asked: list[int] = []

    @PotentialBlockSize.CALLBACK
    def shared_memory(block: int) -> int:
        asked.append(block)
        return 1024  # constant, so the driver's own search (no callback, 1024 bytes) must agree

    results = []
    for callback, dynamic in ((None, 1024), (ctypes.cast(shared_memory, ctypes.c_void_p).value, 0)):
        grid, block = ctypes.c_int(-1), ctypes.c_int(-1)
        assert g.fn["cuOccupancyMaxPotentialBlockSize"](ctypes.addressof(grid), ctypes.addressof(block), function,
                                                        callback, dynamic, 0) == SUCCESS
        results.append((grid.value, block.value))
    assert results[0] == results[1] and results[0][1] > 0, results
    assert asked and all(size % 32 == 0 for size in asked) and asked == sorted(asked, reverse=True)


# --- cuLaunchKernelEx launch attributes ---------------------------------------------------------------------------

def launch_ex(g: Guest, function: int, attributes: list[tuple[int, bytes]], stream: int = 0) -> int:
    raw = b"".join(LAUNCH_ATTRIBUTE.pack(identifier, value.ljust(64, b"\0")) for identifier, value in attributes)
    array = ctypes.create_string_buffer(raw, max(len(raw), 1))
    config = LaunchConfig(4, 1, 1, 64, 1, 1, 0, stream, ctypes.addressof(array) if attributes else None,
                          len(attributes))
    values = [ctypes.create_string_buffer(16) for _ in range(7)]  # kernel_ptx's `mix`: 7 parameters, none > 16 B
    params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    return g.fn["cuLaunchKernelEx"](ctypes.addressof(config), function, ctypes.addressof(params), None)


def test_launch_attributes_reach_the_driver_and_events_in_them_are_checked(rig: Rig) -> None:
    owner, g = rig.guest(), rig.guest()
    owner.setup()
    foreign_event = owner.ok("cuEventCreate", 0)
    g.setup()
    status, module = g.load_module(kernel_ptx() + b"\0")
    function = g.by_name("cuModuleGetFunction", module, b"mix")[1][0]
    event = g.ok("cuEventCreate", 0)
    cooperative, cluster = (2, struct.pack("<i", 1)), (4, struct.pack("<III", 2, 1, 1))
    mark = rig.mark()
    assert launch_ex(g, function, [cooperative, cluster, (7, struct.pack("<Qii", event, 0, 1))]) == SUCCESS
    assert g.sync() == SUCCESS
    [launch] = rig.entries(mark, "cuLaunchKernelEx")
    record = launch["launch"]
    assert record["cooperative"] and record["grid"] == [4, 1, 1]
    assert [a[0] for a in record["attributes"]] == [2, 4, 7]
    assert record["attributes"][1][1] == struct.pack("<III", 2, 1, 1).hex() + "00" * 4

    mark = rig.mark()
    assert launch_ex(g, function, [(12, struct.pack("<Qi", foreign_event, 0))]) == SUCCESS  # posted
    assert g.sync() == 400  # CUDA_ERROR_INVALID_HANDLE: another session's event
    assert launch_ex(g, function, [(13, b"")]) == 801  # DEVICE_UPDATABLE_KERNEL_NODE: a pointer out, refused
    assert launch_ex(g, function, []) == SUCCESS  # no attributes: a plain cuLaunchKernel on the host
    assert g.sync() == SUCCESS
    assert [e["name"] for e in rig.entries(mark) if e["name"].startswith("cuLaunch")] == ["cuLaunchKernel"]

    head = LAUNCH_HEAD.pack(function, 1, 1, 1, 1, 1, 1, 0, 0)
    reply = g.channel.call(CALLS["cuLaunchKernelEx"].opcode, head + struct.pack("<I", 3) + bytes(72))
    assert reply.status == Status.MALFORMED  # claims three attributes, carries one


@local_only("a relayed session is the one POOL_MIRROR serves")
def test_a_local_session_cannot_ask_for_a_pool_mirror(rig: Rig) -> None:
    """POOL_MIRROR is a relaying oriond's call (host_agent/session/pool_mirror.py): from a region's client it is an
    unknown
    opcode, so a guest cannot make its worker map or pin memory through it (docs/security.md)."""
    g = rig.guest()
    g.setup()
    mark = rig.mark()
    request = POOL_MIRROR_REQUEST.encode(POOL_MIRROR_MAP, 0x7000_0000_0000, mmap.PAGESIZE, b"")
    assert g.channel.call(POOL_MIRROR_OPCODE, request).status == Status.UNKNOWN_OPCODE
    assert not rig.entries(mark, "cuMemHostRegister")
