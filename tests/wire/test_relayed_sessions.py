"""Relayed sessions (docs/remote.md), across two network namespaces joined by a veth pair (tests/relay_net.py): a
guest on a region whose supervisor relays every session to a relay listener in the other namespace, whose workers
run the executor over the fake driver. What only a relay does is tested here: the page-locked pool kept on the
relaying side, and the faults (the link drops, either end dies, the GPU host cannot be reached, a partition heals
too late). The forwarded-call suite itself runs relayed in tests/wire/test_relayed_suite.py.

The bound every fault test holds to is the relay connection's: beats every 1 s, a peer silent for 5 s is gone
(stream_endpoint.StreamEndpoint), so a guest's call never waits much longer than that for its error. Nothing here
measures time against a threshold: a missing answer is a test timeout (forwarding_rig.bounded), and what the
guest gets is CUDA_ERROR_DEVICE_UNAVAILABLE.
"""
from __future__ import annotations

import ctypes
import os
import signal
import struct
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from host_agent.relay import compiled_pump
from host_agent.session import pool_mirror
from ivshmem import fixed_map
from ivshmem.channel import Ctrl
from tests import forwarding_rig, relay_net
from tests.controller.rig import wait_until
from tests.differential.pool_kernels import PoolKernelProgram
from tests.differential.test_differential import pool_kernels_reference
from tests.fake_driver import FakeDriver
from tests.forwarding_rig import Guest, Rig
from tests.unit.test_more_calls import _attribute
from tests.unit.test_pinned_and_contexts import host_alloc

SUCCESS, INVALID_VALUE, NOT_SUPPORTED, DEVICE_UNAVAILABLE = 0, 1, 801, 46
bounded, start = forwarding_rig.bounded, forwarding_rig.start  # the rig's fixtures

pytestmark = pytest.mark.skipif(bool(relay_net.why_not()), reason=relay_net.why_not() or "")


@pytest.fixture
def relayed(start: Callable[..., Rig]) -> Rig:
    return start(relayed=True)


def _gpu_worker(rig: Rig, mark: int = 0) -> int:
    """The pid of the GPU host's worker that served the session (the fake driver notes the caller's pid)."""
    pids = {e["pid"] for e in rig.entries(mark)}
    assert len(pids) == 1, pids
    return int(pids.pop())


def _relaying_worker(g: Guest) -> int:
    """The pid of the relaying side's worker of `g`'s session (read after the session is up: the supervisor notes
    it just after accepting the claim)."""
    ctrl = g.channel.ctrl
    wait_until("the supervisor to note the session's worker", lambda: ctrl[Ctrl.HOST_WORKER] > 0)
    return int(ctrl[Ctrl.HOST_WORKER])


def _wait_gone(pid: int, what: str) -> None:
    wait_until(f"{what} (pid {pid}) to end", lambda: forwarding_rig._gone(pid))


def test_a_relayed_session_runs_on_the_other_host_and_leaves_nothing_here(relayed: Rig) -> None:
    g = relayed.guest()
    g.setup()
    device = g.alloc(4096)
    assert g.htod(device, b"relayed" * 100) == SUCCESS
    assert g.dtoh(device, 700) == (SUCCESS, b"relayed" * 100)
    worker = _gpu_worker(relayed)
    assert worker != _relaying_worker(g)  # the driver ran in the GPU host's worker, not in the relaying one
    g.close()
    _wait_gone(worker, "the GPU host's session")  # the guest released: the relay closed, the session ended there


def test_page_locked_memory_stays_on_the_relaying_host_and_its_bytes_travel(relayed: Rig) -> None:
    g = relayed.guest()
    g.setup()
    device = g.alloc(1 << 20)
    status, pinned = host_alloc(g, 1 << 20)
    assert status == SUCCESS and pinned
    assert g.ok("cuMemHostGetFlags", pinned) == 0
    payload = bytes(range(256)) * 4096
    ctypes.memmove(pinned, payload, len(payload))
    mark = relayed.mark()
    assert g.fn["cuMemcpyHtoD"](device, pinned, len(payload)) == SUCCESS
    [htod] = relayed.entries(mark, "cuMemcpyHtoD")
    assert htod["args"][1]["len"] == len(payload)  # the bytes, not an address, reached the GPU host's driver
    assert g.dtoh(device, len(payload))[1] == payload

    ctypes.memset(pinned, 0, len(payload))
    stream = g.ok("cuStreamCreate", 1)
    assert g.fn["cuMemcpyDtoHAsync"](pinned + 4096, device, 4096, stream) == SUCCESS  # posted by the guest
    assert g.call("cuStreamSynchronize", stream)[0] == SUCCESS
    assert ctypes.string_at(pinned + 4096, 4096) == payload[:4096]  # landed before the sync answered
    assert ctypes.string_at(pinned, 4096) == bytes(4096)
    # its device pointer is itself, as natively under unified addressing (a kernel reaches its mirror on the GPU
    # host: tests/differential/pool_kernels.py); only of an allocation, with flags 0
    assert g.call("cuMemHostGetDevicePointer", pinned + 8, 0) == (SUCCESS, [pinned + 8])
    assert g.call("cuMemHostGetDevicePointer", pinned, 1)[0] == INVALID_VALUE
    assert g.call("cuMemHostGetDevicePointer", pinned + (2 << 20), 0)[0] == INVALID_VALUE
    # its pointer attributes, answered by the relay (the GPU host knows nothing of it): what is certain of
    # page-locked host memory (PyTorch and XLA ask its memory type), NOT_SUPPORTED for what only a mapping says
    assert _attribute(g, 2, pinned + 8) == (SUCCESS, struct.pack("<I", 1) + b"\xee" * 12)  # MEMORY_TYPE: host
    assert _attribute(g, 4, pinned + 8) == (SUCCESS, struct.pack("<Q", pinned + 8) + b"\xee" * 8)  # HOST_POINTER
    assert _attribute(g, 3, pinned + 8) == (SUCCESS, struct.pack("<Q", pinned + 8) + b"\xee" * 8)  # DEVICE_POINTER
    assert _attribute(g, 8, pinned) == (SUCCESS, bytes(4) + b"\xee" * 12)  # IS_MANAGED: no
    assert _attribute(g, 1, pinned)[0] == NOT_SUPPORTED  # CONTEXT
    assert _attribute(g, 2, device)[1][:4] == struct.pack("<I", 2)  # device memory: still the GPU host's answer
    # a stream memory operation on it would need its words coherent while the stream waits: refused (posted, so at
    # the next synchronisation), never a wait that does not end; the session goes on
    assert g.fn["cuStreamWriteValue32"](stream, pinned, 1, 0) in (SUCCESS, NOT_SUPPORTED)
    assert g.call("cuStreamSynchronize", stream)[0] == NOT_SUPPORTED
    assert g.call("cuStreamSynchronize", stream)[0] == SUCCESS
    # past the allocation: a copy that names the pool is refused (a small synchronous one travels with its bytes,
    # read from the program's memory as the driver reads pageable memory: not the pool's business)
    assert g.fn["cuMemcpyHtoD"](device, pinned + (2 << 20), 128 << 10) == INVALID_VALUE
    assert g.call("cuMemFreeHost", pinned)[0] == SUCCESS
    assert g.call("cuMemFreeHost", pinned)[0] == INVALID_VALUE


def test_a_synchronous_page_locked_read_lands_in_the_pool_byte_for_byte(relayed: Rig) -> None:
    """A synchronous cuMemcpyDtoH into page-locked memory of at most a completion slot is sent by the relaying side's
    compiled pump as a plain DtoH, its answer's bytes written into the pool there (relay_pump.c, LANDS_IN_POOL); a
    larger one and a posted one are the relay's Python path's, as before. Every byte lands where the copy says and
    nowhere else; a copy the GPU host refuses lands nothing."""
    g = relayed.guest()
    g.setup()
    device = g.alloc(64 << 10)
    source = bytes((i * 7 + 3) & 0xFF for i in range(64 << 10))
    assert g.htod(device, source) == SUCCESS
    status, pinned = host_alloc(g, 64 << 10)
    assert status == SUCCESS and pinned
    slot = g.channel.endpoint.in_ring.cell  # a completion slot: its record header (32 bytes), then the payload
    for size in (1, 4, 100, slot - 33, slot - 32, slot - 31, slot, 3 * slot + 5, 60 << 10):
        for offset in (0, 1, 4096 - size % 4096):
            if offset + size > (64 << 10):
                continue
            ctypes.memset(pinned, 0xEE, 64 << 10)
            assert g.fn["cuMemcpyDtoH"](pinned + offset, device + offset, size) == SUCCESS, (size, offset)
            after = ctypes.string_at(pinned, 64 << 10)
            assert after[offset:offset + size] == source[offset:offset + size], (size, offset)
            assert after[:offset] + after[offset + size:] == b"\xee" * (len(after) - size), (size, offset)
    ctypes.memset(pinned, 0xEE, 64)
    assert g.fn["cuMemcpyDtoH"](pinned, device + (64 << 10), 4) == INVALID_VALUE  # past the device allocation
    assert ctypes.string_at(pinned, 64) == b"\xee" * 64
    assert g.fn["cuMemcpyDtoH"](pinned + 8, device + 8, 4) == SUCCESS  # and the session goes on
    assert ctypes.string_at(pinned + 8, 4) == source[8:12]


def test_a_copy_from_page_locked_memory_takes_what_an_earlier_copy_wrote_there(relayed: Rig) -> None:
    """A copy into page-locked memory, posted in stream order, then a copy from it to the device: natively the second
    reads the pages after the first wrote them. Relayed, the first's bytes land in the pool when its answer comes
    back, so the relay waits for every landing in flight before it reads the pool for the second (never the bytes
    the pages held before), whether the copy is synchronous, async, or served in pieces."""
    g = relayed.guest()
    g.setup()
    device = g.alloc(3 << 20)
    status, pinned = host_alloc(g, 2 << 20)
    assert status == SUCCESS and pinned
    stream = g.call("cuStreamCreate", 0)[1][0]  # blocking: the legacy stream waits for it
    for round_, size in enumerate((4, 60 << 10, 2 << 20)):
        source = bytes((i * 13 + round_) & 0xFF for i in range(size))
        assert g.htod(device, source) == SUCCESS
        ctypes.memset(pinned, 0xEE, size)
        assert g.fn["cuMemcpyDtoHAsync"](pinned, device, size, stream) == SUCCESS  # posted
        if round_ == 1:
            assert g.fn["cuMemcpyHtoDAsync"](device + (1 << 20), pinned, size, stream) == SUCCESS
        else:
            assert g.fn["cuMemcpyHtoD"](device + (1 << 20), pinned, size) == SUCCESS
        status, back = g.dtoh(device + (1 << 20), size)
        assert status == SUCCESS and back == source, (size, back[:8])


def _relayed_guest(rig: Rig) -> tuple[Guest, int, int]:
    g = rig.guest()
    g.setup()
    device = g.alloc(4096)
    return g, device, _gpu_worker(rig)


def test_the_link_drops_calls_fail_within_the_bound_and_both_ends_let_go(relayed: Rig) -> None:
    g, device, worker = _relayed_guest(relayed)
    try:
        relay_net.link(False)
        assert g.sync() == DEVICE_UNAVAILABLE  # waited for, then answered by the relay once the peer fell silent
        assert g.htod(device, b"x") == DEVICE_UNAVAILABLE  # and every later call at once
        _wait_gone(worker, "the GPU host's session")  # it heard nothing either: it ended the session (memory freed)
    finally:
        relay_net.link(True)


def test_a_partition_that_heals_too_late_leaves_the_session_gone_and_a_new_one_works(relayed: Rig) -> None:
    g, device, worker = _relayed_guest(relayed)
    relay_net.link(False)
    try:
        _wait_gone(worker, "the GPU host's session")
    finally:
        relay_net.link(True)
    assert g.sync() == DEVICE_UNAVAILABLE  # no resumption
    g.close()
    fresh = relayed.guest()
    fresh.setup()
    assert fresh.htod(fresh.alloc(64), b"again") == SUCCESS


def test_the_gpu_hosts_worker_dies_and_calls_fail_at_once(relayed: Rig) -> None:
    g, device, worker = _relayed_guest(relayed)
    os.kill(worker, signal.SIGKILL)
    assert g.sync() == DEVICE_UNAVAILABLE  # the connection was reset: no need to wait for the silence bound
    assert g.dtoh(device, 16)[0] == DEVICE_UNAVAILABLE


def test_the_relaying_worker_dies_and_the_gpu_host_ends_the_session(relayed: Rig) -> None:
    g, device, worker = _relayed_guest(relayed)
    os.kill(_relaying_worker(g), signal.SIGKILL)  # the relaying side of this session
    _wait_gone(worker, "the GPU host's session")


def test_a_gpu_host_that_cannot_be_reached_fails_the_sessions_calls(start: Callable[..., Rig]) -> None:
    rig = start(relayed=True, relay_to=f"{relay_net.GPU_IP}:1")  # nothing listens there
    g = rig.guest()
    assert g.call("cuInit", 0)[0] == DEVICE_UNAVAILABLE
    assert g.call("cuDeviceGetCount")[0] == DEVICE_UNAVAILABLE


@pytest.mark.parametrize("relay", ["compiled pump", "python threads"])
def test_page_locked_memory_serves_as_device_memory_as_natively(start: Callable[..., Rig], relay: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Unified addressing: page-locked memory is device memory too, so a copy or memset may name it as its device
    side (XLA's autotuner copies from it). Relayed, the GPU host cannot address it, so the relay serves those calls
    on the pool (host_agent/relay/uva.py): the bytes are the pool's, in stream order after earlier copies into it.
    Both ways a relay runs: the compiled pump, and Python's two threads (RDMA, or no compiler)."""
    if relay == "python threads":
        monkeypatch.setattr(compiled_pump.PROGRAM, "_loaded", None)  # no compiled pump in this process or its forks
    g = start(relayed=True).guest()
    g.setup()
    device = g.alloc(1 << 16)
    status, pinned = host_alloc(g, 1 << 16)
    assert status == SUCCESS
    pattern = bytes((i * 7 + 3) & 0xFF for i in range(4096))
    ctypes.memmove(pinned, pattern, len(pattern))
    assert g.dtoh(pinned, 4096) == (SUCCESS, pattern)  # DtoH from page-locked memory as the device side
    stream = g.ok("cuStreamCreate", 1)
    assert g.dtoh(pinned + 1, 300, stream) == (SUCCESS, pattern[1:301])
    assert g.htod(pinned + 8192, b"written as device memory") == SUCCESS
    assert ctypes.string_at(pinned + 8192, 24) == b"written as device memory"
    assert g.call("cuMemsetD32", pinned + 12288, 0xDEADBEEF, 4)[0] == SUCCESS
    assert ctypes.string_at(pinned + 12288, 16) == struct.pack("<I", 0xDEADBEEF) * 4
    assert g.call("cuMemcpyDtoD", device, pinned, 4096)[0] == SUCCESS  # pool -> the GPU host's memory
    assert g.dtoh(device, 4096) == (SUCCESS, pattern)
    assert g.fn["cuMemcpyDtoDAsync"](pinned + 16384, device + 7, 100, stream) == SUCCESS  # lands in the pool
    assert g.call("cuStreamSynchronize", stream)[0] == SUCCESS
    assert ctypes.string_at(pinned + 16384, 100) == pattern[7:107]
    # a copy into the pool still on its way is in place before a later call reads the pool as device memory
    assert g.htod(device, b"\x11" * 4096) == SUCCESS
    assert g.fn["cuMemcpyDtoHAsync"](pinned + 20480, device, 4096, stream) == SUCCESS  # posted, lands later
    assert g.dtoh(pinned + 20480, 4096, stream) == (SUCCESS, b"\x11" * 4096)
    assert g.fn["cuMemcpyDtoH"](pinned + 24576, pinned, 64) == SUCCESS  # page-locked on both sides
    assert ctypes.string_at(pinned + 24576, 64) == pattern[:64]
    assert g.dtoh(pinned + (1 << 16) - 8, 16)[0] == INVALID_VALUE  # past the allocation: the GPU host refuses it


class _AllocatesWhereTold(FakeDriver):
    """A GPU host's driver whose next device allocation lies at the address written in `place_at` (a file), if any:
    memory of the GPU host's own where the guest has page-locked memory."""

    place_at = ""

    def _allocate(self, size: int, device: int, track: bool = True) -> int:
        try:
            wanted = int(Path(self.place_at).read_text())
        except (OSError, ValueError):
            return super()._allocate(size, device, track)
        os.unlink(self.place_at)
        following, self._next_pointer = self._next_pointer, wanted
        try:
            return super()._allocate(size, device, track)
        finally:
            self._next_pointer = following


def _mirrors_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU host's worker (forked after this) cannot map a mirror at the guest's address, as when its driver's
    reservations cover it: the mirror goes elsewhere and the relay rewrites the launches that name it."""
    monkeypatch.setattr(pool_mirror, "fixed_map", SimpleNamespace(
        map_at=lambda *args: False, map_anywhere=fixed_map.map_anywhere, unmap=fixed_map.unmap))


def test_a_kernel_given_page_locked_memory_mirrored_elsewhere_sees_and_leaves_the_fake_drivers_bytes(
        start: Callable[..., Rig], monkeypatch: pytest.MonkeyPatch) -> None:
    """With every mirror placed elsewhere on the GPU host, each launch naming page-locked memory is rewritten to
    the mirror (relay/mirror.py's translate), and tests/differential/pool_kernels.py's every step is the fake
    driver's own."""
    _mirrors_elsewhere(monkeypatch)
    g = start(relayed=True).guest()
    assert PoolKernelProgram(g.fn, uva_copies=False).run() == pool_kernels_reference()


def test_a_launch_naming_memory_both_hosts_claim_answers_invalid_value(
        start: Callable[..., Rig], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The address the relay would rewrite to a mirror placed elsewhere is also device memory of the GPU host's own
    session (its driver may allocate there, the mirror not being there): which memory the program meant is
    unknowable, so the relay asks before every such rewrite, and the launch answers CUDA_ERROR_INVALID_VALUE, as a
    copy naming such an address does; no kernel runs on either memory."""
    _mirrors_elsewhere(monkeypatch)
    monkeypatch.setattr(_AllocatesWhereTold, "place_at", str(tmp_path / "place-at"))
    g = start(relayed=True, fake_class=_AllocatesWhereTold).guest()
    g.setup()
    status, pinned = host_alloc(g, 4096)
    assert status == SUCCESS
    (tmp_path / "place-at").write_text(str(pinned))
    assert g.alloc(4096) == pinned  # the GPU host's memory, at the guest's page-locked address
    ctypes.memmove(pinned, bytes(range(16)), 16)
    program = PoolKernelProgram(g.fn)
    module = program._out("cuModuleLoadData", ctypes.addressof(program.image))
    program.function = program._out("cuModuleGetFunction", module, b"orion_fake_add_u32")
    statuses = [program._add(pinned, 4, 5, 0), g.fn["cuCtxSynchronize"]()]
    assert INVALID_VALUE in statuses, statuses
    assert ctypes.string_at(pinned, 16) == bytes(range(16))  # the page-locked bytes as the CPU left them
