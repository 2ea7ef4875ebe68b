"""Channels end to end: real client processes against a real host agent (tests/wire/serve_region.py) over a
real /dev/shm region, with real SIGKILLs.

Client processes are this file run as a script (`python test_channels.py --client REGION`): each reads JSON
commands on stdin and answers one JSON line per command on stdout, so a test can claim, exchange records,
hold a channel while the test kills the process, etc. Some tests use the test process itself as the client
(hostile records are written straight into its request ring). Every wait is bounded: the parent reads child
answers with a timeout, and every blocking library call in the test process runs under a SIGALRM deadline.
"""
from __future__ import annotations

import contextlib
import json
import mmap
import os
import random
import select
import signal
import struct
import subprocess
import sys
import time
import zlib
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from host_agent.diagnostics import AGENT_NAME, fill_pattern
from ivshmem import layout, liveness
from ivshmem.channel import ClientChannel, Ctrl, HostChannel, HostReason, HostStatus
from ivshmem.errors import NoFreeChannel, PeerGone, RegionNotFormatted
from ivshmem.layout import Geometry
from ivshmem.record import DRAIN_REPLY, FILL_REQUEST, HEADER, HELLO_REQUEST, PROTOCOL, Flag, Op, Record, Status
from ivshmem.region import Region

MIB = 1 << 20
U32 = 0xFFFFFFFF
T = TypeVar("T")


# =============================================================================================================
# Client process side (runs in the child: `python test_channels.py --client REGION`)
# =============================================================================================================
def open_as_guest(path: str, lock_path: str) -> Region:
    """The region as a QEMU guest sees it (Region.open_pci): kind 'pci', locks on a separate lock file, so
    the client runs its heartbeat thread and the host watches the heartbeat instead of the lock."""
    fd = os.open(path, os.O_RDWR)
    size = os.fstat(fd).st_size
    mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    return Region(where=f"simulated ivshmem BAR over {path}", kind="pci", fd=fd, size=size, mm=mm,
                  lock_path=lock_path, lock_fd=lock_fd)


class ClientProcess:
    """The command interpreter of a client process."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.region: Region | None = None
        self.ch: ClientChannel | None = None
        self.tag = b"pid%d" % os.getpid()

    def emit(self, obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    def run(self) -> None:
        while True:
            line = sys.stdin.readline()
            if not line:  # the test is gone or done with us
                break
            cmd = json.loads(line)
            op = cmd.pop("op")
            try:
                result = {"ok": True, **getattr(self, "cmd_" + op)(**cmd)}
            except Exception as exc:  # reported to the test, which decides
                result = {"ok": False, "error": type(exc).__name__, "message": str(exc)}
            self.emit(result)
        if self.ch is not None:
            self.ch.close()

    @property
    def channel(self) -> ClientChannel:
        assert self.ch is not None, "claim first"
        return self.ch

    def cmd_claim(self, kind: str = "file", lock_path: str | None = None, **timeouts: float) -> dict[str, Any]:
        if kind == "file":
            self.region = Region.open(self.path)
        else:
            assert lock_path
            self.region = open_as_guest(self.path, lock_path)
        self.ch = ClientChannel.claim(self.region, **timeouts)
        return {"index": self.ch.index, "generation": self.ch.endpoint.generation, "pid": os.getpid()}

    def cmd_echo(self, count: int, staged: int = 0, staged_size: int = 0) -> dict[str, Any]:
        """`count` inline and `staged` staged ECHOs, each payload tagged with our pid; check every reply."""
        ch, bad = self.channel, []
        rng = random.Random(os.getpid())
        for i in range(count):
            payload = self.tag + b":%d:" % i + bytes(i % 200)
            reply = ch.call(Op.ECHO, payload)
            if reply.status or reply.payload != payload:
                bad.append(repr(reply)[:200])
        for i in range(staged):
            head = self.tag + b":staged:%d:" % i
            payload = head + rng.randbytes(staged_size - 2 * len(head)) + head
            reply = ch.call(Op.ECHO, payload)
            if reply.status or reply.payload != payload:
                bad.append(repr(reply._replace(payload=reply.payload[:64]))[:200])
        return {"replies": count + staged, "nbad": len(bad), "bad": bad[:5], "async_errors": len(ch.async_errors),
                "leftover": ch.next_reply(wait=False) is not None, "inbox": len(ch.inbox)}

    def cmd_submit(self, count: int) -> dict[str, Any]:
        """Submit ECHOs and never read their replies (they stay in flight)."""
        ids = [self.channel.submit(Op.ECHO, self.tag + b":unanswered:%d" % i) for i in range(count)]
        return {"first": ids[0], "last": ids[-1]}

    def cmd_pipeline(self, n: int, window: int) -> dict[str, Any]:
        """`n` ECHOs, each carrying its sequence number, at most `window` in flight; every reply is checked
        against the exact next expected one (so loss, duplication and reordering all show)."""
        ch = self.channel
        submit, next_reply, pack, echo = ch.submit, ch.next_reply, struct.Struct("<Q").pack, int(Op.ECHO)
        first = -1
        sent = got = 0
        errors: list[str] = []
        start = time.perf_counter()
        while got < n:
            while sent < n and sent - got < window:
                call_id = submit(echo, pack(sent))
                if first < 0:
                    first = call_id
                sent += 1
            reply = next_reply(None, False)
            if reply is None:
                if sent < n and sent - got < window:
                    continue
                reply = next_reply()
                assert reply is not None
            if reply.call_id != first + got or reply.status != 0 or reply.payload != pack(got):
                errors.append(f"reply #{got}: call_id {reply.call_id} (want {first + got}), status {reply.status}, "
                              f"payload {reply.payload[:16]!r} (want {pack(got)!r})")
                if len(errors) >= 5:
                    break
            got += 1
        seconds = time.perf_counter() - start
        sentinel = submit(echo, b"sentinel")
        after = next_reply()
        assert after is not None
        return {"received": got, "errors": errors, "seconds": seconds, "rate": got / seconds,
                "sentinel_next": after.call_id == sentinel and after.payload == b"sentinel",
                "async_errors": len(ch.async_errors), "inbox": len(ch.inbox)}

    def cmd_call_until_gone(self) -> dict[str, Any]:
        """ECHO in a loop (always waiting on a reply) until the channel raises; the error is the result."""
        ch = self.channel
        n = 0
        while True:
            payload = b"%d" % n
            reply = ch.call(Op.ECHO, payload)
            assert reply.payload == payload
            n += 1
            if n == 1:
                self.emit({"event": "running"})

    def cmd_release(self) -> dict[str, Any]:
        self.channel.close()
        self.ch = None
        return {}


# =============================================================================================================
# Test side
# =============================================================================================================
pytestmark = pytest.mark.functional


class Hung(AssertionError):
    """A blocking call did not return within its deadline."""


class NoReply(AssertionError):
    """No completion arrived within the bounded wait."""


@contextlib.contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Raise Hung in the test process if the block is still running after `seconds` (nests: restores the
    enclosing deadline afterwards)."""
    def on_alarm(signum: int, frame: object) -> None:
        raise Hung(f"{what}: still blocked after {seconds:g} s")
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    old_delay, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay:
            signal.setitimer(signal.ITIMER_REAL, max(old_delay - (time.monotonic() - started), 0.001))


@pytest.fixture(autouse=True)
def _hang_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    with deadline(150, request.node.name):
        yield


def wait_until(probe: Callable[[], T], timeout: float, what: str, interval: float = 0.01) -> T:
    end = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not seen within {timeout:g} s")
        time.sleep(interval)


def call(ch: ClientChannel, opcode: int, payload: bytes | memoryview = b"", timeout: float = 20) -> Record:
    with deadline(timeout, f"call {opcode:#x}"):
        return ch.call(opcode, payload)


def reply_within(ch: ClientChannel, timeout: float = 10) -> Record:
    end = time.monotonic() + timeout
    with deadline(timeout + 10, "receiving a reply"):
        while time.monotonic() < end:
            reply = ch.next_reply(wait=False)
            if reply is not None:
                return reply
            time.sleep(0.001)
    raise NoReply(f"no completion within {timeout:g} s")


@contextlib.contextmanager
def claimed(path: str, **kwargs: float) -> Iterator[ClientChannel]:
    """A channel claimed by the test process, over its own Region (its own open file description)."""
    with deadline(30, "claim"):
        region = Region.open(path)
        try:
            ch = ClientChannel.claim(region, **kwargs)
        except BaseException:
            region.close()
            raise
    try:
        yield ch
    finally:
        ch.close()
        region.close()


@pytest.fixture
def observer(served_region: str) -> Iterator[Region]:
    """A separate mapping of the served region, to read control words the way `orion-shm inspect` does."""
    region = Region.open(served_region)
    yield region
    region.close()


def host_view(region: Region, index: int) -> HostChannel:
    return HostChannel(region, index)


def host_state(region: Region, index: int) -> tuple[int, int]:
    ctrl = HostChannel(region, index).ctrl
    return ctrl[Ctrl.HOST_STATUS], ctrl[Ctrl.HOST_REASON]


def wait_host_state(region: Region, index: int, status: HostStatus, timeout: float = 15) -> int:
    """Wait until the channel's host_status is `status`; returns host_reason."""
    wait_until(lambda: host_state(region, index)[0] == status, timeout,
               f"channel {index} host_status {status.name} (now {host_state(region, index)})")
    return host_state(region, index)[1]


class Client:
    """A client process (this file run with --client), driven over stdin/stdout JSON lines."""

    def __init__(self, path: str, log_dir: Path, name: str) -> None:
        self.name = name
        self.err_path = log_dir / f"client-{name}.stderr"
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--client", path],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, bufsize=0,
                                         close_fds=True)
        self._buf = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")[-4000:]

    def send(self, op: str, **args: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"op": op, **args}) + "\n").encode())

    def read(self, timeout: float = 30) -> dict[str, Any]:
        assert self.proc.stdout is not None
        end = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"client {self.name}: no answer within {timeout:g} s\n{self.stderr()}")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    raise AssertionError(f"client {self.name} exited ({self.proc.poll()}) without answering\n"
                                         f"{self.stderr()}")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def request(self, op: str, timeout: float = 30, **args: Any) -> dict[str, Any]:
        self.send(op, **args)
        return self.read(timeout)

    def ok(self, op: str, timeout: float = 30, **args: Any) -> dict[str, Any]:
        result = self.request(op, timeout, **args)
        assert result["ok"], f"client {self.name}: {op} failed: {result}\n{self.stderr()}"
        return result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(10)
        except (subprocess.TimeoutExpired, BrokenPipeError):
            self.kill()
        finally:
            if self.proc.stdout:
                self.proc.stdout.close()


@pytest.fixture
def clients(tmp_path: Path) -> Iterator[Callable[[str, str], Client]]:
    started: list[Client] = []

    def start(path: str, name: str) -> Client:
        client = Client(path, tmp_path, name)
        started.append(client)
        return client

    yield start
    for client in started:
        client.close()
    assert all(c.proc.poll() is not None for c in started), "a client process is still running"


def raw_request(ch: ClientChannel, call_id: int, opcode: int = Op.ECHO, flags: int = 0, payload: bytes = b"",
                length: int | None = None, generation: int | None = None, status: int = 0) -> None:
    """Write one record straight into the channel's request ring (and its payload into the slot, or through
    the staging arena when STAGED), bypassing every check the client library makes."""
    ep, buf = ch.endpoint, ch.region.buf
    ring = ep.out_ring
    offset = wait_until(ring.writable, 10, "room in the request ring")
    HEADER.pack_into(buf, offset, call_id, opcode, flags, len(payload) if length is None else length,
                     ep.generation if generation is None else generation, status, 0)
    if not flags & Flag.STAGED:
        buf[offset + 32:offset + 32 + len(payload)] = payload
    ring.publish()
    if flags & Flag.STAGED:
        arena = ep.out_staging
        for start in range(0, len(payload), arena.cell):
            chunk = payload[start:start + arena.cell]
            offset = wait_until(arena.writable, 10, "a free request chunk")
            buf[offset:offset + len(chunk)] = chunk
            arena.publish()


# --- basic opcodes -----------------------------------------------------------------------------------------
def test_hello_and_echo_inline_and_staged(served_region: str) -> None:
    rng = random.Random(7)
    with claimed(served_region) as ch:
        with deadline(20, "hello"):
            agent, session = ch.hello()
        assert agent == AGENT_NAME and session >= 1
        g = ch.geometry
        cap, chunk = g.inline_capacity, g.chunk_size
        big = 3 * MIB + 12345
        assert big > 2 * chunk * g.chunk_count  # the staged payload goes round the arena several times
        for size in [0, 1, cap - 1, cap, cap + 1, chunk - 1, chunk, chunk + 1, big]:
            payload = rng.randbytes(size)
            reply = call(ch, Op.ECHO, payload)
            assert reply.ok and reply.length == size and reply.generation == ch.endpoint.generation
            assert reply.payload == payload, f"ECHO of {size} bytes came back different"
        view = memoryview(bytearray(rng.randbytes(2 * chunk + 3)))
        assert call(ch, Op.ECHO, view).payload == bytes(view)
        assert ch.next_reply(wait=False) is None and not ch.async_errors


def test_fill_drain_and_handler_errors(served_region: str) -> None:
    rng = random.Random(11)
    with claimed(served_region) as ch:
        cap = ch.geometry.inline_capacity
        for length, seed in [(0, 1), (100, 2), (cap + 1, 3), (5 * MIB + 7, 0xFFFFFFFF)]:
            reply = call(ch, Op.FILL, FILL_REQUEST.encode(length, seed))
            assert reply.ok
            assert reply.payload == fill_pattern(seed, length), f"FILL {length} seed {seed}"
        for size in [1, cap, cap + 1, 3 * MIB]:
            data = rng.randbytes(size)
            reply = call(ch, Op.DRAIN, data)
            assert reply.ok
            assert DRAIN_REPLY.decode(reply.payload) == (size, zlib.crc32(data)), f"DRAIN of {size} bytes"
        # handler-level refusals: an error completion, and the session goes on
        assert call(ch, Op.FILL, FILL_REQUEST.encode((1 << 30) + 1, 0)).status == Status.TOO_LARGE
        assert call(ch, Op.FILL, b"\x01\x02").status == Status.MALFORMED
        other = call(ch, Op.HELLO, HELLO_REQUEST.encode(PROTOCOL + 1, 1, "h", ""))
        assert other.status == Status.REFUSED and b"wire protocol" in bytes(other.payload)
        assert call(ch, Op.HELLO, HELLO_REQUEST.encode(PROTOCOL, 1, "h", "")[:-1]).status == Status.MALFORMED
        table = call(ch, Op.HELLO, HELLO_REQUEST.encode(PROTOCOL, 1, "h", "0123456789abcdef"))
        assert table.status == Status.REFUSED and b"runs the wire alone" in bytes(table.payload)  # no CUDA here
        unknown = call(ch, 0x00FE, b"?")
        assert unknown.status == Status.UNKNOWN_OPCODE and unknown.payload
        assert call(ch, Op.ECHO, b"still serving").payload == b"still serving"


def test_drain_of_nothing_after_a_staged_drain(served_region: str) -> None:
    with claimed(served_region) as ch:
        data = os.urandom(3 * MIB)
        assert DRAIN_REPLY.decode(call(ch, Op.DRAIN, data).payload) == (len(data), zlib.crc32(data))
        assert DRAIN_REPLY.decode(call(ch, Op.DRAIN, b"").payload) == (0, zlib.crc32(b""))


def test_failed_no_reply_post_surfaces_as_async_error(served_region: str) -> None:
    with claimed(served_region) as ch:
        nop = ch.post(Op.NOP)
        bad = ch.post(0x00FE)
        bad_staged = ch.post(0x4242, os.urandom(3 * ch.geometry.chunk_size))
        assert len({nop, bad, bad_staged}) == 3
        reply = call(ch, Op.ECHO, b"sync")
        assert reply.payload == b"sync" and reply.ok
        assert [(r.call_id, r.status) for r in ch.async_errors] == [(bad, Status.UNKNOWN_OPCODE),
                                                                   (bad_staged, Status.UNKNOWN_OPCODE)]
        assert all(r.flags & Flag.ASYNC_ERROR for r in ch.async_errors)
        assert ch.next_reply(wait=False) is None  # the successful NOP produced no completion at all


# --- volume and concurrency --------------------------------------------------------------------------------
def test_million_records_between_two_processes(served_region: str, clients: Callable[[str, str], Client],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    n = 1_000_000
    client = clients(served_region, "pipeline")
    client.ok("claim")
    result = client.ok("pipeline", timeout=120, n=n, window=48)
    assert result["errors"] == []
    assert result["received"] == n
    assert result["sentinel_next"], "a stray reply arrived after the last expected one"
    assert result["async_errors"] == 0 and result["inbox"] == 0
    with capsys.disabled():
        print(f"\n[wire] {n:,} pipelined ECHO records in {result['seconds']:.2f} s: "
              f"{result['rate']:,.0f} records/s", flush=True)


def test_four_clients_at_once_each_see_only_their_own_records(served_region: str,
                                                              clients: Callable[[str, str], Client]) -> None:
    procs = [clients(served_region, f"c{i}") for i in range(4)]
    for c in procs:
        c.send("claim")
    claims = [c.read(30) for c in procs]
    assert all(r["ok"] for r in claims), claims
    assert len({r["index"] for r in claims}) == 4, f"two processes got the same channel: {claims}"
    assert len({r["pid"] for r in claims}) == 4
    for c in procs:  # all four hold their channel; now they all talk at once
        c.send("echo", count=2000, staged=3, staged_size=150_000)
    for c, result in zip(procs, [c.read(120) for c in procs], strict=True):
        assert result["ok"], result
        assert result["nbad"] == 0, f"client {c.name} got foreign or wrong replies: {result['bad']}"
        assert result["replies"] == 2003 and not result["leftover"] and result["async_errors"] == 0


# --- client death and reclaim ----------------------------------------------------------------------------
def test_killed_client_is_reclaimed_and_nothing_of_it_reaches_the_next_owner(
        served_region: str, observer: Region, clients: Callable[[str, str], Client]) -> None:
    dead = clients(served_region, "doomed")
    first = dead.ok("claim")
    dead.ok("submit", count=100)
    index = first["index"]
    wait_until(lambda: host_view(observer, index).describe()["replies_pending"], 10,
               "completions waiting, unread, in the doomed client's ring")
    dead.kill()
    reason = wait_host_state(observer, index, HostStatus.RECLAIMED)
    assert reason == HostReason.CLIENT_DIED
    words = host_view(observer, index).describe()
    assert words["host_status"] == "reclaimed" and words["host_worker"] == 0
    assert words["replies_pending"] > 0  # the dead client's completions are still there, unread

    heir = clients(served_region, "heir")
    second = heir.ok("claim")
    assert second["index"] == index
    assert second["generation"] > first["generation"]
    assert host_state(observer, index) == (HostStatus.SERVING, HostReason.NONE)
    result = heir.ok("echo", count=300, staged=2, staged_size=200_000)
    assert result["nbad"] == 0, f"the new owner received something not its own: {result['bad']}"
    assert not result["leftover"] and result["async_errors"] == 0 and result["inbox"] == 0


def test_client_never_delivers_a_completion_of_another_generation(region_path: str,
                                                                  clients: Callable[[str, str], Client]) -> None:
    """The second line of defence behind the index resets: a completion stamped with an earlier generation
    (what a session the agent failed to stop in time could still write) is dropped by the client, even when
    its call id is the one the client waits for. The test process plays the agent with the real HostChannel
    API, since a correct agent never writes such a record."""
    with Region.open(region_path) as host:
        host.format(Geometry.build(host.size, 1, name="hand-served"))
        host.set_agent(pid=os.getpid(), state=layout.AGENT_SERVING, beat=True)
        try:
            channel = HostChannel(host, 0)
            client = clients(region_path, "client")
            client.send("claim")
            generation = wait_until(channel.pending_claim, 10, "the client's claim")
            channel.accept(generation)
            assert client.read(10)["ok"]
            endpoint = channel.endpoint()
            assert endpoint.generation == generation
            client.send("echo", count=1)
            request = wait_until(lambda: endpoint.receive(wait=False), 10, "the client's request")
            endpoint.generation = (generation - 1) & U32
            endpoint.send(request.call_id, 0, 0, b"stale reply")
            endpoint.send(request.call_id, 0, Flag.ASYNC_ERROR, b"stale error", Status.HANDLER_FAILED)
            endpoint.generation = generation
            endpoint.send(request.call_id, 0, 0, request.payload)
            result = client.read(10)
            assert result["ok"] and result["nbad"] == 0, f"a stale completion was delivered: {result}"
            assert result["async_errors"] == 0 and not result["leftover"]
        finally:
            host.set_agent(state=layout.AGENT_STOPPED)


def test_clean_release_then_reclaim_with_a_higher_generation(served_region: str, observer: Region) -> None:
    with claimed(served_region) as ch:
        index, generation = ch.index, ch.endpoint.generation
        with deadline(20, "hello"):
            _, session = ch.hello()
    reason = wait_host_state(observer, index, HostStatus.IDLE)
    assert reason == HostReason.CLIENT_RELEASED
    with claimed(served_region) as again:
        assert again.index == index and again.endpoint.generation == generation + 1
        with deadline(20, "hello"):
            _, session2 = again.hello()
        assert session2 > session


def test_guest_client_killed_is_reclaimed_as_heartbeat_lost(served_region: str, observer: Region, tmp_path: Path,
                                                            clients: Callable[[str, str], Client]) -> None:
    guest = clients(served_region, "guest")
    claim = guest.ok("claim", kind="pci", lock_path=str(tmp_path / "orion-lock-guest"))
    index = claim["index"]
    ctrl = host_view(observer, index).ctrl
    assert ctrl[Ctrl.LIVENESS] == liveness.HEARTBEAT_MODE
    wait_until(lambda: ctrl[Ctrl.CLIENT_HEARTBEAT] > 0, 10, "the guest's heartbeat")
    assert guest.ok("echo", count=20)["nbad"] == 0
    guest.kill()
    reason = wait_host_state(observer, index, HostStatus.RECLAIMED, timeout=20)
    assert reason == HostReason.HEARTBEAT_LOST
    assert ctrl[Ctrl.CLIENT_ACTIVE] == 1  # it never released: the heartbeat is all the host had


def test_idle_guest_client_with_a_heartbeat_is_not_reclaimed(served_region: str, observer: Region,
                                                             tmp_path: Path,
                                                             clients: Callable[[str, str], Client]) -> None:
    guest = clients(served_region, "guest")
    claim = guest.ok("claim", kind="pci", lock_path=str(tmp_path / "orion-lock-guest"))
    index, generation = claim["index"], claim["generation"]
    ctrl = host_view(observer, index).ctrl
    beats = ctrl[Ctrl.CLIENT_HEARTBEAT]
    end = time.monotonic() + 4.0  # twice the agent's heartbeat_timeout, without a single record
    while time.monotonic() < end:
        assert (ctrl[Ctrl.HOST_GEN], ctrl[Ctrl.HOST_STATUS]) == (generation, HostStatus.SERVING), \
            f"an idle but live guest lost its channel: {host_view(observer, index).describe()}"
        time.sleep(0.05)
    assert ctrl[Ctrl.CLIENT_HEARTBEAT] > beats
    result = guest.ok("echo", count=10)
    assert result["nbad"] == 0


# --- hostile records ------------------------------------------------------------------------------------------
HOSTILE = {
    "unknown flag": (dict(flags=1 << 3), Status.MALFORMED),
    "high unknown flag": (dict(flags=1 << 31), Status.MALFORMED),
    "inline length past the slot": (dict(length=-1), Status.MALFORMED),  # -1: inline capacity + 1
    "inline length of 4 GiB": (dict(length=U32), Status.TOO_LARGE),
    "opcode past 0xffff": (dict(opcode=0x10000), Status.UNKNOWN_OPCODE),
    "opcode 2**32-1": (dict(opcode=U32), Status.UNKNOWN_OPCODE),
    "unserved opcode": (dict(opcode=0xBEEF), Status.UNKNOWN_OPCODE),
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_hostile_record_gets_an_error_completion_and_the_session_goes_on(served_region: str, observer: Region,
                                                                        case: str) -> None:
    fields, expected = HOSTILE[case]
    with claimed(served_region) as ch:
        if fields.get("length") == -1:
            fields = {**fields, "length": ch.geometry.inline_capacity + 1}
        assert call(ch, Op.ECHO, b"before").payload == b"before"
        raw_request(ch, 900_001, **fields)
        reply = reply_within(ch)
        assert (reply.call_id, reply.status, reply.flags) == (900_001, expected, 0), reply
        assert reply.generation == ch.endpoint.generation
        assert host_state(observer, ch.index) == (HostStatus.SERVING, HostReason.NONE)
        assert call(ch, Op.ECHO, b"after").payload == b"after"
        big = os.urandom(ch.geometry.chunk_size * 3 + 5)
        assert call(ch, Op.ECHO, big).payload == big


def test_hostile_no_reply_record_reports_an_async_error(served_region: str) -> None:
    with claimed(served_region) as ch:
        raw_request(ch, 900_002, flags=Flag.NO_REPLY | 1 << 4)
        assert call(ch, Op.ECHO, b"sync").payload == b"sync"
        assert [(r.call_id, r.status) for r in ch.async_errors] == [(900_002, Status.MALFORMED)]


def test_malformed_staged_record_keeps_the_chunk_stream_in_step(served_region: str) -> None:
    with claimed(served_region) as ch:
        junk = os.urandom(ch.geometry.chunk_size * 2 + 100)
        raw_request(ch, 900_003, flags=Flag.STAGED | 1 << 6, payload=junk)  # malformed, its chunks follow
        reply = reply_within(ch)
        assert (reply.call_id, reply.status) == (900_003, Status.MALFORMED)
        big = os.urandom(ch.geometry.chunk_size * 3 + 17)
        assert call(ch, Op.ECHO, big).payload == big  # the host skipped exactly the junk chunks


def test_wrong_generation_record_gets_an_error_completion_with_its_call_id(served_region: str) -> None:
    with claimed(served_region) as ch:
        raw_request(ch, 900_004, generation=ch.endpoint.generation + 1)
        reply = reply_within(ch)
        assert reply.status == Status.MALFORMED
        assert reply.call_id == 900_004, f"error completion for call 900004 carries call_id {reply.call_id}"
        raw_request(ch, 900_005, flags=Flag.NO_REPLY, generation=ch.endpoint.generation + 1)
        assert call(ch, Op.ECHO, b"sync").payload == b"sync"
        assert [(r.call_id, r.status) for r in ch.async_errors] == [(900_005, Status.MALFORMED)]


def test_staged_record_over_the_limit_gets_too_large(served_region: str) -> None:
    with claimed(served_region) as ch:
        raw_request(ch, 900_006, flags=Flag.STAGED, length=0x80000000)  # 2 GiB declared, no chunk follows
        reply = reply_within(ch, timeout=3)
        assert (reply.call_id, reply.status) == (900_006, Status.TOO_LARGE)
        assert call(ch, Op.ECHO, b"after", timeout=3).payload == b"after"


@pytest.mark.parametrize("ring", ["request tail", "completion head"])
def test_impossible_ring_indices_end_that_session_only(region_path: str, server_factory: Callable[..., Any],
                                                       ring: str) -> None:
    server = server_factory(region_path)
    with Region.open(region_path) as obs, claimed(region_path) as victim, claimed(region_path) as bystander:
        assert victim.index != bystander.index
        assert call(victim, Op.ECHO, b"v").payload == b"v"
        g = obs.geometry
        base = g.channel_base(victim.index)
        if ring == "request tail":  # the consumer (host) reads tail - head > entries
            block = base + g.off_req_ring
            head = obs.u32[(block + g.off_ring_head) >> 2]
            obs.u32[(block + g.off_ring_tail) >> 2] = (head + g.ring_entries + 1) & U32
        else:  # the producer (host) reads a head past its tail
            block = base + g.off_cpl_ring
            tail = obs.u32[(block + g.off_ring_tail) >> 2]
            obs.u32[(block + g.off_ring_head) >> 2] = (tail + 3) & U32
            raw_request(victim, 77, payload=b"provoke a completion")
        reason = wait_host_state(obs, victim.index, HostStatus.FAILED)
        assert reason == HostReason.PROTOCOL_VIOLATION
        with pytest.raises(PeerGone, match="broken ring protocol"):
            call(victim, Op.ECHO, b"v")
        assert server.alive()
        assert host_state(obs, bystander.index) == (HostStatus.SERVING, HostReason.NONE)
        assert call(bystander, Op.ECHO, b"b").payload == b"b"
        with claimed(region_path) as newcomer:
            assert call(newcomer, Op.ECHO, b"n").payload == b"n"
    assert server.alive()


def test_killed_worker_ends_that_session_only(served_region: str, observer: Region) -> None:
    with claimed(served_region) as ch, claimed(served_region) as other:
        assert call(ch, Op.ECHO, b"x").payload == b"x"
        ctrl = host_view(observer, ch.index).ctrl
        worker = wait_until(lambda: ctrl[Ctrl.HOST_WORKER], 10, "the session's worker pid")
        assert worker != os.getpid()
        os.kill(worker, signal.SIGKILL)
        assert wait_host_state(observer, ch.index, HostStatus.FAILED) == HostReason.WORKER_DIED
        with pytest.raises(PeerGone, match="worker"):
            call(ch, Op.ECHO, b"x")
        assert call(other, Op.ECHO, b"y").payload == b"y"
        index, generation = ch.index, ch.endpoint.generation
    with claimed(served_region) as again:
        assert again.index == index and again.endpoint.generation > generation
        assert call(again, Op.ECHO, b"z").payload == b"z"


# --- the agent goes away -------------------------------------------------------------------------------------
def test_claim_without_an_agent_says_to_start_oriond(region_path: str) -> None:
    with deadline(10, "claim on an unserved region"), Region.open(region_path) as region:
        with pytest.raises(RegionNotFormatted, match="oriond"):
            ClientChannel.claim(region)
        region.format(Geometry.build(region.size, name="never-served"))
        with pytest.raises(PeerGone, match="start oriond"):
            ClientChannel.claim(region)


def test_agent_killed_while_a_client_waits(region_path: str, server_factory: Callable[..., Any],
                                           clients: Callable[[str, str], Client]) -> None:
    server = server_factory(region_path)
    client = clients(region_path, "waiter")
    client.ok("claim", agent_timeout=1.0)
    client.send("call_until_gone")
    assert client.read(30) == {"event": "running"}
    server.kill()  # SIGKILL the supervisor; its workers must notice and go too
    result = client.read(30)
    assert not result["ok"] and result["error"] == "PeerGone", result
    assert "heartbeat" in result["message"]
    wait_until(lambda: not server.leftovers(), 10, "the dead agent's workers exiting")
    # the region still says SERVING, but nobody answers: a new claim is refused, not hung
    with deadline(10, "claim on a dead agent"), Region.open(region_path) as region:
        assert region.agent_words()[2] == layout.AGENT_SERVING
        with pytest.raises(PeerGone, match="oriond"):
            ClientChannel.claim(region, accept_timeout=0.5)


def test_agent_stopped_cleanly_while_a_client_waits(region_path: str, server_factory: Callable[..., Any],
                                                    clients: Callable[[str, str], Client]) -> None:
    server = server_factory(region_path)
    client = clients(region_path, "waiter")
    index = client.ok("claim", agent_timeout=1.0)["index"]
    client.send("call_until_gone")
    assert client.read(30) == {"event": "running"}
    assert server.stop() == 0
    result = client.read(30)
    assert not result["ok"] and result["error"] == "PeerGone", result
    assert "stopped" in result["message"]
    with deadline(10, "claim on a stopped agent"), Region.open(region_path) as region:
        assert region.agent_words()[2] == layout.AGENT_STOPPED
        assert host_state(region, index) == (HostStatus.FAILED, HostReason.AGENT_STOPPED)
        with pytest.raises(PeerGone, match="it stopped"):
            ClientChannel.claim(region)


def test_restarted_agent_fails_the_sessions_it_did_not_start(region_path: str, server_factory: Callable[..., Any],
                                                             clients: Callable[[str, str], Client]) -> None:
    first = server_factory(region_path)
    client = clients(region_path, "survivor")
    claim = client.ok("claim")
    assert client.ok("echo", count=5)["nbad"] == 0
    first.kill()
    wait_until(lambda: not first.leftovers(), 10, "the killed agent's workers exiting")
    server_factory(region_path)
    with Region.open(region_path) as region:
        assert host_state(region, claim["index"]) == (HostStatus.FAILED, HostReason.AGENT_RESTARTED)
    result = client.request("echo", count=1)
    assert not result["ok"] and result["error"] == "PeerGone" and "restarted" in result["message"], result
    client.ok("release")
    again = client.ok("claim")
    assert again["index"] == claim["index"] and again["generation"] > claim["generation"]
    assert client.ok("echo", count=5)["nbad"] == 0


# --- channel allocation --------------------------------------------------------------------------------------
def test_all_channels_busy(region_path: str, server_factory: Callable[..., Any],
                           clients: Callable[[str, str], Client]) -> None:
    with Region.open(region_path) as region:
        region.format(Geometry.build(region.size, 2, name="two-channels"))
    server_factory(region_path)
    holders = [clients(region_path, f"holder{i}") for i in range(2)]
    indices = [h.ok("claim")["index"] for h in holders]
    assert sorted(indices) == [0, 1]
    with deadline(10, "third claim"), Region.open(region_path) as region:
        assert region.geometry.channel_count == 2  # the agent kept the existing valid header
        with pytest.raises(NoFreeChannel, match="all 2 channels"):
            ClientChannel.claim(region)
    holders[1].ok("release")
    with claimed(region_path) as ch:
        assert ch.index == indices[1]
        assert call(ch, Op.ECHO, b"free again").payload == b"free again"


def test_two_claims_in_one_process_get_two_channels(served_region: str) -> None:
    with deadline(20, "claims"), Region.open(served_region) as region:
        first = ClientChannel.claim(region)
        try:
            second = ClientChannel.claim(region)
            try:
                assert first.index != second.index, f"both claims got channel {first.index}"
            finally:
                second.close()
        finally:
            first.close()


# --- client library ------------------------------------------------------------------------------------------
def test_call_after_an_unanswered_submit(served_region: str) -> None:
    with claimed(served_region) as ch:
        earlier = ch.submit(Op.ECHO, b"first")
        reply = call(ch, Op.ECHO, b"second", timeout=3)
        assert reply.payload == b"second"
        pending = ch.next_reply(wait=False)
        assert pending is not None and (pending.call_id, pending.payload) == (earlier, b"first")


def test_echo_of_a_typed_memoryview(served_region: str) -> None:
    with claimed(served_region) as ch:
        words = memoryview(array("I", range(10)))
        assert call(ch, Op.ECHO, words).payload == words.tobytes()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        ClientProcess(sys.argv[2]).run()
    else:
        sys.exit(f"usage: {sys.argv[0]} --client REGION")
