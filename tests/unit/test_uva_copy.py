"""cuMemcpy/cuMemcpyAsync with unified addressing: the guest picks the direction from the device ranges its own
calls produced, sends the matching HtoD/DtoH/DtoD record, and keeps host-to-host copies to itself. Runs against
the forwarding rig (a real region and session worker, the executor over tests/fake_driver.py: CI has no GPU)."""
from __future__ import annotations

import ctypes

from ivshmem.driver_api import CALLS
from tests import forwarding_rig
from tests.forwarding_rig import Rig

bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures
SUCCESS = 0


def test_each_direction_becomes_the_matching_copy(rig: Rig) -> None:
    g = rig.guest()
    g.setup()
    copy = g.fn["cuMemcpy"]
    first, second = g.alloc(4096), g.alloc(4096)
    source = ctypes.create_string_buffer(bytes(range(256)) * 4, 1024)
    mark = rig.mark()
    assert copy(first + 100, ctypes.addressof(source), 1024) == SUCCESS  # host -> device (inside the allocation)
    assert copy(second, first + 100, 1024) == SUCCESS  # device -> device
    landing = ctypes.create_string_buffer(1024)
    assert copy(ctypes.addressof(landing), second, 1024) == SUCCESS  # device -> host
    assert landing.raw == source.raw
    names = [e["name"] for e in rig.entries(mark) if e["name"].startswith("cuMemcpy")]
    assert names == ["cuMemcpyHtoD", "cuMemcpyDtoD", "cuMemcpyDtoH"]


def test_host_to_host_stays_in_the_guest_and_async_keeps_its_stream(rig: Rig) -> None:
    g = rig.guest()
    g.setup()
    stream = g.ok("cuStreamCreate", 0)
    pointer = g.alloc(64)
    a = ctypes.create_string_buffer(b"x" * 64, 64)
    b = ctypes.create_string_buffer(64)
    mark = rig.mark()
    assert g.fn["cuMemcpy"](ctypes.addressof(b), ctypes.addressof(a), 64) == SUCCESS
    assert b.raw == a.raw and not rig.entries(mark)  # nothing travelled
    assert g.fn["cuMemcpyAsync"](pointer, ctypes.addressof(a), 64, stream) == SUCCESS  # posted: a stream of its own
    assert g.call("cuStreamSynchronize", stream)[0] == SUCCESS
    # queued on its stream from the worker's own pageable copy of the bytes (executor._htod): in stream order
    (seen,) = rig.entries(mark, "cuMemcpyHtoDAsync")
    assert seen["args"][0] == pointer and seen["args"][2:] == [64, stream]


def test_freed_memory_is_host_memory_again_and_the_opcode_never_travels(rig: Rig) -> None:
    g = rig.guest()
    g.setup()
    pointer = g.alloc(64)
    assert g.call("cuMemFree", pointer)[0] == SUCCESS
    assert not g.forwarder._device_memory.contains(pointer)  # noqa: SLF001 - the classification itself is under test
    # a hostile or confused client sending cuMemcpy's opcode gets NOT_SUPPORTED: only the guest resolves it
    assert g.channel.call(CALLS["cuMemcpy"].opcode, bytes(24)).status == 801
