"""Every wait of a relayed session is bounded however the GPU host dies or misbehaves, in the middle of any frame
(docs/remote.md, "Faults, and their bounds"; issue 26).

The GPU host here is a real relay listener over the fake driver (tests/relay_peer.py) in its own network
namespace, whose session worker has one fault planted in its relay connection (`Fault`, installed by the handler
factory, so in the worker process only): at a chosen phase of one copy -- before its answer, after the answer's
header, in the middle of its payload, in the middle of a host-to-device request or after it -- the worker dies
(SIGKILL, as a killed host's process), freezes (SIGSTOP: a hung host, beats and all), writes junk where the
answer should be, or answers a call nobody asked. The guest, through the capsule path and through the native
`libcuda.so.1`, must get CUDA_ERROR_DEVICE_UNAVAILABLE for that call within the documented bound, and for its next
call at once: never a hang (before issue 26's fix a death in the middle of a long answer hung the guest for ever),
never a success. A copy to the device is posted once its bytes are taken, as the driver's pageable copy returns once
they are staged (docs/cuda-forwarding.md): it may answer SUCCESS, and then its error is the next call's, within the
bound, as the driver reports an asynchronous error.

The bound asserted is the documented one (5 s of silence, which the relay checks every second) plus
SCHEDULING_SLACK_S for a loaded 2-core machine: it tells a bounded wait from a hang, and says nothing of speed.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from host_agent.relay.frames import FrameStream
from host_agent.session.executor import CudaExecutor, ExecutorOptions
from host_agent.session_loop import ServerOptions
from ivshmem.driver_api import CALLS
from ivshmem.record import HEADER
from tests import forwarding_rig, relay_net
from tests.fake_driver import FakeDriver
from tests.forwarding_rig import GUEST_DEVICES, Rig, native_child_env
from tests.relay_peer import start_listener

bounded, start = forwarding_rig.bounded, forwarding_rig.start  # the rig's fixtures
pytestmark = pytest.mark.skipif(bool(relay_net.why_not()), reason=relay_net.why_not() or "")

SUCCESS, DEVICE_UNAVAILABLE = 0, 46
DOCUMENTED_BOUND_S = 5.0 + 1.0  # the relay's silence bound, checked every second
SCHEDULING_SLACK_S = 4.0
REPO = Path(__file__).resolve().parents[2]
LARGE, SMALL, PINNED = (2 << 20) + 4321, 77, (1 << 20) + 4321  # sizes no other frame of the session has
HTOD = CALLS["cuMemcpyHtoD"].opcode
JUNK = bytes(range(7, 255, 3)) * 2


class Fault(NamedTuple):
    """What the GPU host's worker does, and when. `copy`: dtoh (LARGE, streamed into the completion ring), small
    (SMALL, inline), pinned (PINNED into page-locked memory, posted, then a synchronize) or htod (LARGE). `phase`:
    before (the answer is due), header (its header is out), middle (half its payload is out), request-middle
    (half the request was read), request-end (all of it was read). `act`: die, freeze, junk, unasked."""
    copy: str
    phase: str
    act: str

    @property
    def size(self) -> int:
        return {"small": SMALL, "pinned": PINNED}.get(self.copy, LARGE)


def _act(fault: Fault, stream: FrameStream, note: str) -> None:
    if fault.act == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault.act == "freeze":
        Path(note).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
    if fault.act == "junk":
        stream.sock.sendall(JUNK)
        time.sleep(600)  # holding the connection (and its write lock): only the junk is said
    if fault.act == "unasked":  # a well-formed answer to a call id this session never used, then on as usual
        stream.sock.sendall(HEADER.pack(987_654_321, 0, 0, 8, 0, 0, 0) + b"unasked!")


def install(fault: Fault, note: str) -> None:
    """Plant `fault` in this process's FrameStream (the GPU host's worker: its answers and its reads)."""
    state = {"frame": False, "out": 0, "request": False, "in": 0, "length": 0}
    open_frame, write, send, begin, read = (FrameStream.open_frame, FrameStream.write_piece, FrameStream.send,
                                            FrameStream.begin, FrameStream.read_payload)

    def patched_open_frame(self: FrameStream, call_id: int, opcode: int, length: int, *args: Any) -> Any:
        if length == fault.size and fault.copy in ("dtoh", "pinned"):
            if fault.phase == "before":
                _act(fault, self, note)
            state.update(frame=True, out=-HEADER.size)  # the header is written first
        return open_frame(self, call_id, opcode, length, *args)

    def patched_write(self: FrameStream, data: Any) -> None:
        if state["frame"]:
            after = state["out"] + len(data)
            middle = fault.size // 2
            if fault.phase == "middle" and state["out"] < middle <= after:
                write(self, memoryview(data)[:middle - state["out"]])
                _act(fault, self, note)
            state["out"] = after
            write(self, data)
            if fault.phase == "header" and state["out"] == 0:
                _act(fault, self, note)
            return
        write(self, data)

    def patched_send(self: FrameStream, call_id: int, opcode: int, payload: Any = b"", *args: Any,
                     **kwargs: Any) -> None:
        if fault.copy == "small" and len(payload) == SMALL and opcode == 0:
            if fault.phase == "before":
                _act(fault, self, note)
            self.sock.sendall(HEADER.pack(call_id, 0, 0, SMALL, kwargs.get("generation", 0), 0, 0) + payload[:10])
            _act(fault, self, note)
        send(self, call_id, opcode, payload, *args, **kwargs)

    def patched_begin(self: FrameStream, timeout: float | None = None) -> Any:
        record = begin(self, timeout)
        if record is not None and fault.copy == "htod" and record.opcode == HTOD and record.length > LARGE:
            state.update(request=True, length=record.length)
        return record

    def patched_read(self: FrameStream, view: memoryview) -> None:
        read(self, view)
        if state["request"]:
            state["in"] += len(view)
            if (fault.phase == "request-middle" and state["in"] >= LARGE // 2) or state["in"] == state["length"]:
                _act(fault, self, note)

    FrameStream.open_frame = patched_open_frame  # type: ignore[method-assign]
    FrameStream.write_piece = patched_write  # type: ignore[method-assign]
    FrameStream.send = patched_send  # type: ignore[method-assign]
    FrameStream.begin = patched_begin  # type: ignore[method-assign]
    FrameStream.read_payload = patched_read  # type: ignore[method-assign]


FAULTS = [Fault("dtoh", phase, act) for phase, act in (
    ("before", "die"), ("header", "die"), ("middle", "die"), ("middle", "freeze"), ("before", "junk"),
    ("before", "unasked"), ("before", "freeze"))] + [
    Fault("small", "before", "die"), Fault("small", "middle", "die"),
    Fault("pinned", "middle", "die"), Fault("pinned", "header", "freeze"),
    Fault("htod", "request-middle", "die"), Fault("htod", "request-end", "die"),
    Fault("htod", "request-middle", "freeze")]


@pytest.fixture
def faulty(start: Callable[..., Rig], tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    """A rig whose sessions are relayed to a GPU host with `request.param` planted in its session worker."""
    fault: Fault = request.param
    note = str(tmp_path / "frozen.pid")

    def factory(session: Any) -> CudaExecutor:
        os.environ["ORION_HOT_PATH"] = "0"  # every answer through the FrameStream the fault is planted in
        install(fault, note)
        driver = FakeDriver(devices=3)
        driver.cuInit(0)
        return CudaExecutor(session, ExecutorOptions(devices=GUEST_DEVICES), driver=driver)
    relay_net.ensure()
    listener, port = start_listener(factory, relay_net.GPU_IP, relay_net.GPU_NS,
                                    options=ServerOptions(heartbeat_timeout=5.0))
    try:
        yield start(relayed=True, relay_to=f"{relay_net.GPU_IP}:{port}")
    finally:
        if os.path.exists(note):  # a frozen worker takes no SIGTERM: it goes with SIGKILL
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(Path(note).read_text()), signal.SIGKILL)
        listener.terminate()
        listener.join(10)


def _capsule_run(rig: Rig, fault: Fault) -> dict[str, Any]:
    g = rig.guest()
    g.setup()
    device = g.alloc(3 << 20)
    host = ctypes.create_string_buffer(LARGE)
    fn = g.fn
    if fault.copy == "pinned":
        cell = ctypes.c_uint64()
        assert fn["cuMemAllocHost"](ctypes.addressof(cell), PINNED) == 0
    started = time.monotonic()
    if fault.copy == "htod":
        status = fn["cuMemcpyHtoD"](device, ctypes.addressof(host), LARGE)
    elif fault.copy == "pinned":
        status = fn["cuMemcpyDtoHAsync"](cell.value, device, PINNED, 0) or fn["cuStreamSynchronize"](0)
    else:
        status = fn["cuMemcpyDtoH"](ctypes.addressof(host), device, fault.size)
    elapsed = time.monotonic() - started
    following = fn["cuCtxSynchronize"]()
    return {"status": status, "elapsed": elapsed, "next": following, "through_next": time.monotonic() - started}


NATIVE = r"""
import ctypes, json, sys, time
from ctypes import byref, c_int, c_uint64, c_void_p, c_size_t
lib = ctypes.CDLL(sys.argv[1])
copy, size, large = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for name, args in {"cuMemcpyHtoD": [c_uint64, c_void_p, c_size_t], "cuMemcpyDtoH": [c_void_p, c_uint64, c_size_t],
                   "cuMemcpyDtoHAsync": [c_void_p, c_uint64, c_size_t, c_void_p], "cuStreamSynchronize": [c_void_p],
                   "cuMemAlloc": [c_void_p, c_size_t], "cuMemAllocHost": [c_void_p, c_size_t],
                   "cuCtxSetCurrent": [c_uint64], "cuDevicePrimaryCtxRetain": [c_void_p, c_int]}.items():
    getattr(lib, name).argtypes = args
ctx, device, pinned = c_uint64(), c_uint64(), c_uint64()
assert lib.cuInit(0) == 0 and lib.cuDevicePrimaryCtxRetain(byref(ctx), 0) == 0 and lib.cuCtxSetCurrent(ctx) == 0
assert lib.cuMemAlloc(byref(device), 3 << 20) == 0
host = ctypes.create_string_buffer(large)
if copy == "pinned":
    assert lib.cuMemAllocHost(byref(pinned), size) == 0
started = time.monotonic()
if copy == "htod":
    status = lib.cuMemcpyHtoD(device, host, size)
elif copy == "pinned":
    status = lib.cuMemcpyDtoHAsync(pinned.value, device, size, None) or lib.cuStreamSynchronize(None)
else:
    status = lib.cuMemcpyDtoH(host, device, size)
elapsed = time.monotonic() - started
following = lib.cuCtxSynchronize()
print(json.dumps({"status": status, "elapsed": elapsed, "next": following, "through_next": time.monotonic() - started}))
"""


def _native_run(rig: Rig, fault: Fault, library: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", NATIVE, str(library), fault.copy, str(fault.size), str(LARGE)],
                          cwd=REPO, env=native_child_env(library, rig.path), capture_output=True, text=True,
                          timeout=forwarding_rig.TEST_TIMEOUT_S - 10)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _judge(seen: dict[str, Any], fault: Fault) -> None:
    posted = fault.copy == "htod" and seen["status"] == SUCCESS  # its error is the next call's
    assert seen["status"] == DEVICE_UNAVAILABLE or posted, seen
    assert seen["through_next" if posted else "elapsed"] < DOCUMENTED_BOUND_S + SCHEDULING_SLACK_S, seen
    assert seen["next"] == DEVICE_UNAVAILABLE, seen


@pytest.mark.parametrize("faulty", FAULTS, indirect=True, ids=lambda f: "-".join(f))
def test_the_capsule_path_gets_its_error_within_the_bound(faulty: Rig, request: pytest.FixtureRequest) -> None:
    fault = request.node.callspec.params["faulty"]
    _judge(_capsule_run(faulty, fault), fault)


@pytest.mark.parametrize("faulty", FAULTS, indirect=True, ids=lambda f: "-".join(f))
def test_the_native_driver_gets_its_error_within_the_bound(faulty: Rig, library: Path,
                                                           request: pytest.FixtureRequest) -> None:
    fault = request.node.callspec.params["faulty"]
    _judge(_native_run(faulty, fault, library), fault)
