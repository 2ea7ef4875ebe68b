"""The forwarding test rig: a fake-driver host agent in a forked child and guest Forwarders talking to it.

Shared by tests/unit/test_forwarding_roundtrip.py (driver calls) and tests/unit/test_runtime_shim.py (runtime
calls built on them); moved here unchanged from the former. The host half is a real `RegionServer` in a forked
child process whose sessions run `host_agent.session.executor.CudaExecutor` with `tests/fake_driver.FakeDriver`
instead of
cuda.bindings.driver; the guest half is `guest_runtime.forward.Forwarder(...).implementations()`, called directly
with the raw C arguments a capsule trampoline would pass. The fake appends every call it sees to a JSON-lines
journal (`Rig.entries`), which is how tests check what reached the "driver".

With ORION_TEST_RELAYED=netns every session of every rig is relayed (docs/remote.md): the region's supervisor, in
one network namespace (tests/relay_net.py), relays each session across a veth pair to a relay listener in
another, whose workers run the executor over the fake driver; the same tests then check the relayed path (the
README's test command runs them both ways: tests/wire/test_relayed_suite.py).

A test module uses the fixtures by importing them: `bounded` (autouse: every test, waits included, is bounded by
TEST_TIMEOUT_S through SIGALRM), `start` (make a Rig with options) and `rig` (the default Rig). The default
executor maps guest devices (0, 1) to the fake's physical devices (2, 0) (GUEST_DEVICES), so every CUdevice
conversion is visible in the journal.
"""
from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from guest_runtime.forward import Forwarder
from host_agent.daemon.region_server import RegionServer
from host_agent.relay.route import RelayRoute
from host_agent.session.executor import CudaExecutor, ExecutorOptions
from host_agent.session_loop import ServerOptions
from host_agent.stop import StopRequest
from ivshmem import layout
from ivshmem.channel import ClientChannel, Ctrl
from ivshmem.driver_api import CALLS, INOUT, OUT
from ivshmem.region import Region
from tests import relay_net
from tests.cluster_key import key_file
from tests.fake_driver import FakeDriver, read_journal
from tests.relay_peer import start_listener

__all__ = ["CODES", "FAKE_DEVICES", "GUEST_DEVICES", "RELAYED", "SENTINELS", "START_TIMEOUT_S", "STOP_TIMEOUT_S",
           "TEST_TIMEOUT_S", "Guest", "Rig", "bounded", "local_only", "logged_hot_executor", "rig", "start"]

TEST_TIMEOUT_S = 60  # every test, waits included, is bounded by this (SIGALRM)
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0

SUCCESS = 0
FAKE_DEVICES = 3
GUEST_DEVICES = (2, 0)  # guest ordinal -> physical ordinal of the fake
CODES = {"i": ctypes.c_int, "I": ctypes.c_uint, "Q": ctypes.c_uint64, "f": ctypes.c_float, "B": ctypes.c_ubyte,
         "H": ctypes.c_ushort}
SENTINELS = {"i": 0x5A5A5A5A, "I": 0x5A5A5A5A, "Q": 0x5A5A5A5A5A5A5A5A, "f": -1.25, "B": 0x5A, "H": 0x5A5A}


@pytest.fixture(autouse=True)
def bounded() -> Iterator[None]:
    """Fail (TimeoutError) rather than hang: a guest waiting on a reply that never comes is interrupted."""
    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"test still running after {TEST_TIMEOUT_S} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --- the host: a RegionServer with the fake driver, in a forked child ---------------------------------------------

def native_child_env(library: str | os.PathLike[str], region: str) -> dict[str, str]:
    """The environment of a child process that drives the native driver under test at `region`: none of Orion's
    variables but these, and that build pinned as the one the start-up hook loads (ORION_NATIVE=1,
    ORION_NATIVE_LIB), so the process holds exactly one driver whatever the checkout has built."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ORION_")} | {
        "ORION_SHM": region, "ORION_NATIVE": "1", "ORION_NATIVE_LIB": str(library)}


RELAYED_ENV = "ORION_TEST_RELAYED"
RELAYED = os.environ.get(RELAYED_ENV) == "netns"


def local_only(why: str) -> pytest.MarkDecorator:
    """Mark a test of what only a session served on its own host does: skipped when RELAYED, saying why (the relayed
    behaviour has its own test in tests/wire/test_relayed_sessions.py)."""
    return pytest.mark.skipif(RELAYED, reason=f"relayed sessions differ here: {why}")


def logged_hot_executor(session: Any, log: str) -> CudaExecutor:
    """A CudaExecutor over a one-GPU FakeDriver whose compiled hot path calls logging stand-ins (their names
    appended to the file `log`, one a line): a test then sees which calls C made and which Python made."""
    fake = FakeDriver(devices=1)
    fake.cuInit(0)
    executor = CudaExecutor(session, driver=fake)
    keep = []
    pointer, uint = ctypes.c_void_p, ctypes.c_uint

    def stand_in(name: str, *types: Any) -> int:
        method = getattr(fake, name)

        def call(*args: Any) -> int:
            with open(log, "a") as f:
                f.write(name + "\n")
            return int(method(*[a or 0 for a in args])[0])
        keep.append(ctypes.CFUNCTYPE(ctypes.c_int, *types)(call))
        return ctypes.cast(keep[-1], ctypes.c_void_p).value or 0
    executor.hot_functions = {  # type: ignore[attr-defined]
        "cuCtxSynchronize": stand_in("cuCtxSynchronize"), "cuStreamQuery": stand_in("cuStreamQuery", pointer),
        "cuStreamWaitEvent": stand_in("cuStreamWaitEvent", pointer, pointer, uint),
        "cuCtxSetCurrent": stand_in("cuCtxSetCurrent", pointer)}
    executor._keep = keep  # type: ignore[attr-defined]
    return executor


def _serve(path: str, journal: str, options: ExecutorOptions, fake: dict[str, Any], relayed: bool,
           relay_to: str, fake_class: type[FakeDriver]) -> None:
    """Child process body: serve `path` until SIGTERM, each session an executor over a fresh `fake_class` (`relayed`:
    relayed to one in another network namespace, or to `relay_to` when given)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: never outlive the tests
    stop = StopRequest().on_signals()  # never threading.Event in a signal handler (host_agent/stop.py)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    signal.setitimer(signal.ITIMER_REAL, 0)

    def factory(session: Any) -> CudaExecutor:
        driver = fake_class(journal=journal, **fake)
        driver.cuInit(0)  # as executor._load_driver does before any session uses the real driver
        return CudaExecutor(session, options, driver=driver)
    server = ServerOptions(heartbeat_timeout=5.0, scan_interval=0.01)
    if relayed:
        server.relay = RelayRoute(fixed=relay_to or _gpu_host(factory), key_file=key_file())  # the tests' key
        relay_net.enter(relay_net.RELAY_NS)
        # The relaying side's own handler answers HELLO and keeps the pool; it never runs a CUDA call.
        factory = lambda session: CudaExecutor(session, options, driver=FakeDriver(**fake))  # noqa: E731
    RegionServer(path, factory, server, stop).serve_forever()


def _gpu_host(factory: Callable[[Any], CudaExecutor]) -> str:
    """Start the GPU host's relay listener in its network namespace (it ends with this process); its HOST:PORT."""
    _process, port = start_listener(factory, relay_net.GPU_IP, relay_net.GPU_NS,
                                    options=ServerOptions(heartbeat_timeout=5.0))
    return f"{relay_net.GPU_IP}:{port}"


def _agent_words(path: str) -> tuple[int, int, int]:
    with open(path, "rb") as f:
        raw = os.pread(f.fileno(), 16, layout.AGENT_HEARTBEAT)
    return struct.unpack("<QII", raw) if len(raw) == 16 else (0, 0, 0)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


class Guest:
    """One guest process's view: a Forwarder (its own session) and helpers to call its implementations."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.channels: list[ClientChannel] = []
        self.forwarder = Forwarder(self._connect)
        self.fn = self.forwarder.implementations()
        self.worker = 0

    def _connect(self) -> ClientChannel:
        region = Region.open(self.path)
        try:
            channel = ClientChannel.claim(region)
        except BaseException:
            region.close()
            raise
        self.channels.append(channel)
        self.worker = channel.ctrl[Ctrl.HOST_WORKER]
        return channel

    @property
    def channel(self) -> ClientChannel:
        channel = self.forwarder.channel()
        assert channel is not None, "the guest could not claim a channel"
        return channel

    def call(self, name: str, *inputs: Any) -> tuple[int, list[Any]]:
        """A generic call: `inputs` in parameter order; out-pointers (pre-filled with a sentinel) are added here."""
        args: list[Any] = []
        cells: list[Any] = []
        given = iter(inputs)
        for param in CALLS[name].params:
            if param.role in (OUT, INOUT) or (param.role == "thread_ctx" and param.ctype.endswith("*")):
                code = param.code if param.role in (OUT, INOUT) else "Q"  # cuCtxGetCurrent/PopCurrent: a CUcontext
                cell = CODES[code](next(given) if param.role == INOUT else SENTINELS[code])
                cells.append(cell)
                args.append(ctypes.addressof(cell))
            else:
                args.append(next(given))
        assert next(given, None) is None, f"too many inputs for {name}"
        status = self.fn[name](*args)
        return status, [cell.value for cell in cells]

    def ok(self, name: str, *inputs: Any) -> Any:
        status, outs = self.call(name, *inputs)
        assert status == SUCCESS, f"{name}{inputs} returned {status}"
        return outs[0] if len(outs) == 1 else outs

    def sync(self) -> int:
        return self.call("cuCtxSynchronize")[0]

    def setup(self, device: int = 0) -> int:
        """cuInit, retain the device's primary context and make it current; returns the context."""
        self.ok("cuInit", 0)
        ctx = self.ok("cuDevicePrimaryCtxRetain", device)
        self.ok("cuCtxSetCurrent", ctx)
        return ctx

    def alloc(self, size: int) -> int:
        return self.ok("cuMemAlloc", size)

    def htod(self, pointer: int, data: bytes, stream: int | None = None) -> int:
        source = ctypes.create_string_buffer(data, len(data))
        if stream is None:
            return self.fn["cuMemcpyHtoD"](pointer, ctypes.addressof(source), len(data))
        return self.fn["cuMemcpyHtoDAsync"](pointer, ctypes.addressof(source), len(data), stream)

    def dtoh(self, pointer: int, size: int, stream: int | None = None, guard: int = 16) -> tuple[int, bytes]:
        """(status, bytes); asserts the `guard` bytes after the buffer were not touched."""
        target = ctypes.create_string_buffer(b"\xee" * (size + guard), size + guard)
        if stream is None:
            status = self.fn["cuMemcpyDtoH"](ctypes.addressof(target), pointer, size)
        else:
            status = self.fn["cuMemcpyDtoHAsync"](ctypes.addressof(target), pointer, size, stream)
        assert target.raw[size:] == b"\xee" * guard, "cuMemcpyDtoH wrote past the end of the host buffer"
        return status, target.raw[:size]

    def load_module(self, image: bytes) -> tuple[int, int]:
        holder = ctypes.create_string_buffer(image, len(image))
        cell = ctypes.c_uint64(SENTINELS["Q"])
        status = self.fn["cuModuleLoadData"](ctypes.addressof(cell), ctypes.addressof(holder))
        return status, cell.value

    def by_name(self, name: str, owner: int, symbol: bytes) -> tuple[int, list[int]]:
        outs = [ctypes.c_uint64(SENTINELS["Q"]) for p in CALLS[name].params if p.role == OUT]
        text = ctypes.create_string_buffer(symbol)
        status = self.fn[name](*[ctypes.addressof(c) for c in outs], owner, ctypes.addressof(text))
        return status, [c.value for c in outs]

    def close(self) -> None:
        """Release every channel this guest claimed (once: a test may close before the rig does)."""
        channels, self.channels = self.channels, []
        for channel in channels:
            channel.close()
            with contextlib.suppress(BufferError):
                channel.region.close()


class Rig:
    """A fake-driver host agent serving one region, and the guests (sessions) talking to it."""

    def __init__(self, path: str, journal: Path, options: ExecutorOptions, fake: dict[str, Any],
                 relayed: bool = RELAYED, relay_to: str = "", fake_class: type[FakeDriver] = FakeDriver) -> None:
        self.path, self.journal, self.options, self.relayed = path, journal, options, relayed
        self.guests: list[Guest] = []
        if relayed:
            relay_net.ensure()
        self.process = multiprocessing.get_context("fork").Process(
            target=_serve, args=(path, str(journal), options, fake, relayed, relay_to, fake_class),
            name="fake-oriond")
        self.process.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            _beat, pid, state = _agent_words(path)
            if state == layout.AGENT_SERVING and pid == self.process.pid:
                break
            assert self.process.is_alive(), f"the fake agent exited with {self.process.exitcode}"
            assert time.monotonic() < deadline, "the fake agent did not serve the region in time"
            time.sleep(0.005)

    def guest(self) -> Guest:
        guest = Guest(self.path)
        self.guests.append(guest)
        return guest

    def entries(self, since: int = 0, name: str | None = None) -> list[dict[str, Any]]:
        found = read_journal(self.journal)[since:]
        return [e for e in found if name is None or e["name"] == name]

    def mark(self) -> int:
        return len(read_journal(self.journal))

    def stop(self) -> None:
        workers = [g.worker for g in self.guests if g.worker]
        for guest in self.guests:
            guest.close()
        if self.process.is_alive():
            os.kill(self.process.pid, signal.SIGTERM)  # type: ignore[arg-type]
        self.process.join(STOP_TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(STOP_TIMEOUT_S)
            raise AssertionError("the fake agent did not stop on SIGTERM")
        assert self.process.exitcode == 0, f"the fake agent exited with {self.process.exitcode}"
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while not all(_gone(pid) for pid in workers):
            assert time.monotonic() < deadline, f"session workers {workers} outlived the agent"
            time.sleep(0.01)


@pytest.fixture
def start(region_path: str, tmp_path: Path) -> Iterator[Callable[..., Rig]]:
    rigs: list[Rig] = []

    def make(options: ExecutorOptions | None = None, devices: int = FAKE_DEVICES, relayed: bool = RELAYED,
             relay_to: str = "", fake_class: type[FakeDriver] = FakeDriver, **fake: Any) -> Rig:
        """`relayed`: sessions relayed across tests/relay_net.py's namespaces, to a GPU host started here or to
        `relay_to` (HOST:PORT, none started). `fake_class`: the driver of the sessions (a FakeDriver with a fault
        planted)."""
        assert not rigs, "one agent per region"
        rig = Rig(region_path, tmp_path / "journal.jsonl",
                  options if options is not None else ExecutorOptions(devices=GUEST_DEVICES),
                  {"devices": devices, **fake}, relayed, relay_to, fake_class)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.stop()


@pytest.fixture
def rig(start: Callable[..., Rig]) -> Rig:
    return start()
