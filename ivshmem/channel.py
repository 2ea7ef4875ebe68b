"""Channels: the per-process conversation inside a region, from either side.

`Endpoint` moves records over one channel's rings and staging arenas (both sides use it, mirrored).
`ClientChannel` claims a channel, talks, and releases it; `HostChannel` is what the host agent sees of a
channel: the control words it watches and the endpoint its worker serves. The life cycle (claim, accept,
serve, release, reclaim) is described in docs/wire-protocol.md; each control word has exactly one writer.
"""
from __future__ import annotations

import itertools
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from enum import IntEnum
from typing import Any, NamedTuple

from . import layout, liveness
from .errors import ChannelCorrupt, ChannelError, DeviceLost, NoFreeChannel, PeerGone, RecordError
from .record import (
    HEADER,
    HELLO_REPLY,
    HELLO_REQUEST,
    KNOWN_FLAGS,
    MAX_OPCODE,
    PROTOCOL,
    Flag,
    Op,
    Record,
    Status,
    check_header,
)
from .region import Region
from .ring import Ring, StagingArena
from .wait import DEFAULT_POLICY, WaitPolicy

MAX_PAYLOAD = 1 << 30
ASSEMBLE_STEP = 16 << 20  # a payload assembled in memory grows by at most this much ahead of what arrived
_pack, _unpack = HEADER.pack_into, HEADER.unpack_from
OLDER_AGENT = (" (the agent could not read this client's HELLO record: it is older than wire protocol 3; install the "
               "oriond of the same release as orion-guest)")


def _record(fields: tuple) -> Record:  # type: ignore[type-arg]
    return tuple.__new__(Record, fields)
Sink = Callable[[memoryview], None]
Fill = Callable[[memoryview], None]


class Ctrl(IntEnum):
    """Byte offsets of the control words inside a channel's control block."""

    CLIENT_GEN = 0
    CLIENT_ACTIVE = 4
    CLIENT_PID = 8
    LIVENESS = 12
    CLIENT_HEARTBEAT = 16  # u64
    HOST_GEN = 64
    HOST_STATUS = 68
    HOST_REASON = 72
    HOST_WORKER = 76
    HOST_HEARTBEAT = 80  # u64, written by the session's worker (FEATURE_HOST_HEARTBEAT)


_U64_WORDS = (Ctrl.CLIENT_HEARTBEAT, Ctrl.HOST_HEARTBEAT)


class HostStatus(IntEnum):
    IDLE = 0
    SERVING = 1
    FAILED = 2
    RECLAIMED = 3


class HostReason(IntEnum):
    NONE = 0
    CLIENT_RELEASED = 1
    CLIENT_DIED = 2
    HEARTBEAT_LOST = 3
    WORKER_DIED = 4
    AGENT_RESTARTED = 5
    PROTOCOL_VIOLATION = 6
    AGENT_STOPPED = 7
    GPU_HOST_LOST = 8  # a relaying host's worker lost the GPU host in the middle of a reply (relay/relayed_session.py)
    REPLY_FAILED = 9  # the GPU failed in the middle of a reply whose success had gone out (handler.ReplyFailed)
    GRANT_ENDED = 10  # the process whose vGPUs this session joined ended (host_agent/session/grant_sharing.py)


REASON_TEXT: dict[int, str] = {
    HostReason.CLIENT_DIED: "the host saw this client's lock go away",
    HostReason.HEARTBEAT_LOST: "the host stopped seeing this client's heartbeat",
    HostReason.WORKER_DIED: "the host worker serving this session died",
    HostReason.AGENT_RESTARTED: "the host agent restarted and lost this session",
    HostReason.PROTOCOL_VIOLATION: "the host saw a broken ring protocol on this channel",
    HostReason.AGENT_STOPPED: "the host agent stopped",
    HostReason.GPU_HOST_LOST: "the GPU host serving this relayed session is gone, in the middle of a reply",
    HostReason.REPLY_FAILED: "the GPU failed in the middle of a reply",
    HostReason.GRANT_ENDED: "the process whose vGPUs this one shared ended, and its vGPUs with it",
}
# a client answers 46 (DeviceLost)
DEVICE_LOST_REASONS = (HostReason.GPU_HOST_LOST, HostReason.REPLY_FAILED, HostReason.GRANT_ENDED)


class Control:
    """Named access to one channel's control words."""

    __slots__ = ("_u32", "_u64", "_base")

    def __init__(self, region: Region, base: int) -> None:
        self._u32, self._u64, self._base = region.u32, region.u64, base

    def __getitem__(self, word: Ctrl) -> int:
        if word in _U64_WORDS:
            return self._u64[(self._base + word) >> 3]
        return self._u32[(self._base + word) >> 2]

    def __setitem__(self, word: Ctrl, value: int) -> None:
        if word in _U64_WORDS:
            self._u64[(self._base + word) >> 3] = value & 0xFFFFFFFFFFFFFFFF
        else:
            self._u32[(self._base + word) >> 2] = value & 0xFFFFFFFF


class Streamed(NamedTuple):
    """A payload produced piece by piece straight into the staging chunks (no intermediate buffer)."""

    length: int
    fill: Fill  # called with each chunk's writable view, in order


Payload = bytes | bytearray | memoryview | Streamed


class BufferCursor:
    """Walks a buffer in step with a staged payload's chunks: `sink` copies chunks into it (a reply landing in
    a caller's buffer), `fill` copies it into chunks (a request sent from one)."""

    __slots__ = ("view", "position")

    def __init__(self, buffer: bytes | bytearray | memoryview) -> None:
        self.view = memoryview(buffer).cast("B")
        self.position = 0

    def sink(self, chunk: memoryview) -> None:
        end = self.position + len(chunk)
        self.view[self.position:end] = chunk
        self.position = end

    def fill(self, chunk: memoryview) -> None:
        end = self.position + len(chunk)
        chunk[:] = self.view[self.position:end]
        self.position = end


class Endpoint:
    """Sends on one ring/arena pair and receives on the other; `side` is 'client' or 'host'."""

    def __init__(self, region: Region, index: int, side: str, policy: WaitPolicy = DEFAULT_POLICY,
                 check: Callable[[], None] | None = None, prefault: bool = True) -> None:
        g = region.geometry
        base = g.channel_base(index)
        if prefault:  # a process that only resets indices (the supervisor) need not map the whole channel
            region.prefault(base, g.channel_stride)
        name = f"{region.where} channel {index}"
        req = Ring(region.u32, base + g.off_req_ring, g.ring_entries, g.slot_size, f"{name} request ring")
        cpl = Ring(region.u32, base + g.off_cpl_ring, g.ring_entries, g.slot_size, f"{name} completion ring")
        req_st = StagingArena(region.u32, base + g.off_req_staging, g.chunk_size, g.chunk_count,
                              f"{name} request staging")
        cpl_st = StagingArena(region.u32, base + g.off_cpl_staging, g.chunk_size, g.chunk_count,
                              f"{name} completion staging")
        if side == "client":
            self.out_ring, self.out_staging, self.in_ring, self.in_staging = req, req_st, cpl, cpl_st
        else:
            self.out_ring, self.out_staging, self.in_ring, self.in_staging = cpl, cpl_st, req, req_st
        self.buf = region.buf
        self.capacity = g.inline_capacity
        self.policy = policy
        self.check = check
        self.generation = 0
        self.name = name
        self.on_full: Callable[[], None] | None = None  # run while waiting for room (a client drains replies)
        # Limits on what the peer sends; the host sets them for its untrusted client (region_server.py):
        self.stall_timeout: float | None = None  # seconds a staged payload may wait for its next chunk
        self.max_assembled = MAX_PAYLOAD  # largest staged payload assembled in memory (with no sink)
        self._busy = False  # the last wait was short: the peer is active, spin longer before sleeping

    def reset_owned(self) -> None:
        """Zero the four indices this side writes (it is the producer of two and consumer of two)."""
        self.out_ring.reset_owned("producer")
        self.out_staging.reset_owned("producer")
        self.in_ring.reset_owned("consumer")
        self.in_staging.reset_owned("consumer")

    def resync(self) -> None:
        for part in (self.out_ring, self.out_staging, self.in_ring, self.in_staging):
            part.resync()

    def _wait(self, probe: Callable[[], int | None], what: str, timeout: float | None = None) -> int:
        policy = self.policy
        start = time.monotonic()
        offset = policy.wait_for(probe, self.check, what=what, timeout=timeout,
                                 spin_s=policy.busy_spin_s if self._busy else policy.spin_s)
        self._busy = time.monotonic() - start < policy.busy_spin_s
        return offset

    def _wait_for_room(self, probe: Callable[[], int | None], what: str) -> int:
        """Wait for a free slot or chunk, running `on_full` meanwhile (only the sending side may drain)."""
        on_full = self.on_full
        if on_full is None:
            return self._wait(probe, what)

        def probe_or_drain() -> int | None:
            offset = probe()
            if offset is None:
                on_full()
                offset = probe()
            return offset
        return self._wait(probe_or_drain, what)

    # --- sending -----------------------------------------------------------------------------------------
    def send(self, call_id: int, opcode: int, flags: int = 0, payload: Payload = b"", status: int = 0) -> None:
        """Publish one record; payloads larger than a slot are streamed through the staging arena."""
        if payload.__class__ is memoryview and payload.format != "B":  # type: ignore[union-attr]
            payload = payload.cast("B")  # type: ignore[union-attr]
        if payload.__class__ is not Streamed:
            length = len(payload)  # type: ignore[arg-type]
            if length <= self.capacity:  # the hot path: one slot, no staging
                ring = self.out_ring
                offset = ring.writable()
                if offset is None:
                    offset = self._wait_for_room(ring.writable, f"room in the {ring.name}")
                _pack(self.buf, offset, call_id, opcode, flags, length, self.generation, status, 0)
                if length:
                    self.buf[offset + 32:offset + 32 + length] = payload  # type: ignore[assignment]
                ring.publish()
                return
        self._send_staged(call_id, opcode, flags, payload, status)

    def _send_staged(self, call_id: int, opcode: int, flags: int, payload: Payload, status: int) -> None:
        ring = self.out_ring
        offset = ring.writable()
        if offset is None:
            offset = self._wait_for_room(ring.writable, f"room in the {ring.name}")
        if isinstance(payload, Streamed):
            length, fill = payload
            if length > MAX_PAYLOAD:
                raise RecordError(f"a payload of {length} bytes exceeds the {MAX_PAYLOAD}-byte record limit; "
                                  "split it", Status.TOO_LARGE)
        else:
            cursor = BufferCursor(payload)
            length, fill = len(cursor.view), cursor.fill
            if length > MAX_PAYLOAD:
                raise RecordError(f"a payload of {length} bytes exceeds the {MAX_PAYLOAD}-byte record limit; "
                                  "split it", Status.TOO_LARGE)
        _pack(self.buf, offset, call_id, opcode, flags | Flag.STAGED, length, self.generation, status, 0)
        ring.publish()  # the consumer may start on the chunks while we fill them
        self._stream_out(length, fill)

    def _stream_out(self, length: int, fill: Fill) -> None:
        arena, buf, size = self.out_staging, self.buf, self.out_staging.cell
        for start in range(0, length, size):
            offset = arena.writable()
            if offset is None:
                offset = self._wait_for_room(arena.writable, f"a free chunk in the {arena.name}")
            fill(buf[offset:offset + min(size, length - start)])
            arena.publish()

    # --- receiving ---------------------------------------------------------------------------------------
    def receive(self, sink: Sink | None = None, wait: bool = True,
                sink_for: Callable[[int, int, int], Sink | None] | None = None) -> Record | None:
        """The next record, or None if `wait` is false and none is there.

        A staged payload is handed to `sink` (or to what `sink_for(call_id, opcode, length)` returns) chunk
        by chunk when there is one (the record's payload is then empty), otherwise it is assembled into bytes. A
        malformed record raises RecordError after its slot and chunks were consumed, so the stream stays in
        step.
        """
        ring = self.in_ring
        offset = ring.readable()
        if offset is None:
            if not wait:
                return None
            offset = self._wait(ring.readable, f"a record on the {ring.name}")
        fields = _unpack(self.buf, offset)
        call_id, opcode, flags, length, generation, status, _seq = fields  # the mark: compiled consumers' hint
        if flags & ~KNOWN_FLAGS or opcode > MAX_OPCODE or length > self.capacity:
            try:
                check_header(fields, self.capacity, MAX_PAYLOAD)
            except RecordError as exc:
                ring.release()
                if flags & Flag.STAGED and length <= MAX_PAYLOAD:
                    self._stream_in(length, lambda chunk: None)  # keep the chunk stream in step
                exc.call_id, exc.flags = call_id, flags  # type: ignore[attr-defined]
                raise
        if not flags & Flag.STAGED:
            payload = bytes(self.buf[offset + 32:offset + 32 + length]) if length else b""
            ring.release()
            return _record((call_id, opcode, flags, length, generation, status, payload))
        ring.release()
        if sink is None and sink_for is not None:
            sink = sink_for(call_id, opcode, length)
        if sink is not None:
            self._stream_in(length, sink)
            return _record((call_id, opcode, flags, length, generation, status, b""))
        if length > self.max_assembled:
            self._stream_in(length, lambda chunk: None)  # keep the chunk stream in step, keep nothing
            too_large = RecordError(f"a staged payload of {length} bytes exceeds the {self.max_assembled}-byte "
                                    f"limit of opcode {opcode:#x}", Status.TOO_LARGE)
            too_large.call_id, too_large.flags = call_id, flags  # type: ignore[attr-defined]
            raise too_large
        assembler = _Assembler(length)
        self._stream_in(length, assembler.sink)
        return _record((call_id, opcode, flags, length, generation, status, assembler.out))  # no second copy

    def _stream_in(self, length: int, sink: Sink) -> None:
        """Hand the `length` bytes of a staged payload to `sink`, chunk by chunk. With a stall timeout, a peer
        that declared a payload and stops sending it ends the conversation (ChannelCorrupt) instead of holding
        this side forever."""
        arena, buf, size = self.in_staging, self.buf, self.in_staging.cell
        for start in range(0, length, size):
            offset = arena.readable()
            if offset is None:
                try:
                    offset = self._wait(arena.readable, f"the next chunk on the {arena.name}", self.stall_timeout)
                except TimeoutError:
                    raise ChannelCorrupt(f"{arena.name}: a staged payload of {length} bytes stalled after {start} "
                                         f"bytes (no chunk for {self.stall_timeout:g} s)") from None
            sink(buf[offset:offset + min(size, length - start)])
            arena.release()


class _Assembler:
    """Collects a staged payload into one bytearray that grows with what has arrived (doubling from 16 MiB,
    capped at the declared length), so a peer that declares a large payload and sends little makes this side
    hold little: never more than twice what arrived, or 16 MiB."""

    __slots__ = ("out", "length", "position")

    def __init__(self, length: int) -> None:
        self.out = bytearray(min(length, ASSEMBLE_STEP))
        self.length = length
        self.position = 0

    def sink(self, chunk: memoryview) -> None:
        end = self.position + len(chunk)
        if end > len(self.out):
            grow = max(end, min(2 * len(self.out), self.length)) - len(self.out)
            self.out += bytes(grow)
        self.out[self.position:end] = chunk
        self.position = end


class ClientChannel:
    """A channel claimed by this process. Use as a context manager, or call close()."""

    def __init__(self, region: Region, index: int, lock_fd: int, accept_timeout: float = 2.0,
                 agent_timeout: float = 5.0, policy: WaitPolicy = DEFAULT_POLICY) -> None:
        """Use `claim()`; `lock_fd` is an open file description already holding this channel's lock."""
        self.region = region
        self.index = index
        self.geometry = region.geometry
        self.ctrl = Control(region, self.geometry.channel_base(index))
        self.lock_fd = lock_fd
        self.endpoint = Endpoint(region, index, "client", policy, check=self._check_host)
        self.endpoint.on_full = self._drain
        self.agent_timeout = agent_timeout
        self.inbox: deque[Record] = deque()
        self.async_errors: list[Record] = []
        self._ids = itertools.count(1)
        self._heartbeat: liveness.Heartbeat | None = None
        self._agent_seen = (region.agent_words()[0], time.monotonic())
        self._worker_beats = bool(self.geometry.features & layout.FEATURE_HOST_HEARTBEAT)
        self._worker_seen = (0, 0.0)
        self._closed = False
        self._accept(accept_timeout)

    @classmethod
    def claim(cls, region: Region, **kwargs: Any) -> ClientChannel:
        """Claim the first channel no live process holds; raises ChannelError with what to do."""
        g = region.geometry
        state = _agent_state(region)
        if state != layout.AGENT_SERVING:
            raise PeerGone(f"{region.where}: no host agent is serving this region "
                           f"({'it stopped' if state == layout.AGENT_STOPPED else 'it was never served'}); "
                           "start oriond on the host")
        # A lock never conflicts with its own open file description: each claim gets its own, so two
        # claims in one process (two threads, say) take two channels.
        lock_fd = os.open(f"/proc/self/fd/{region.lock_fd}", os.O_RDWR)
        for index in range(g.channel_count):
            if liveness.try_lock(lock_fd, g.channel_base(index)):
                try:
                    return cls(region, index, lock_fd=lock_fd, **kwargs)
                except BaseException:
                    os.close(lock_fd)  # closing the description drops its lock
                    raise
        os.close(lock_fd)
        raise NoFreeChannel(f"{region.where}: all {g.channel_count} channels are in use by live processes; "
                            "end one, or create the region with more channels")

    def _accept(self, timeout: float) -> None:
        ctrl = self.ctrl
        self.endpoint.reset_owned()
        ctrl[Ctrl.CLIENT_PID] = os.getpid()
        mode = liveness.HEARTBEAT_MODE if self.region.kind == "pci" else liveness.LOCK_MODE
        ctrl[Ctrl.LIVENESS] = mode
        ctrl[Ctrl.CLIENT_HEARTBEAT] = 0
        ctrl[Ctrl.CLIENT_ACTIVE] = 1
        generation = (ctrl[Ctrl.CLIENT_GEN] + 1) & 0xFFFFFFFF or 1
        ctrl[Ctrl.CLIENT_GEN] = generation  # published last: the host acts on it
        self.endpoint.generation = generation
        if mode == liveness.HEARTBEAT_MODE:
            self._heartbeat = liveness.Heartbeat(self._beat)

        def accepted() -> bool | None:
            if ctrl[Ctrl.HOST_GEN] == generation and ctrl[Ctrl.HOST_STATUS] != HostStatus.IDLE:
                return True
            return None
        try:
            self.endpoint.policy.wait_for(accepted, timeout=timeout, what="the host agent")
            self._worker_seen = (ctrl[Ctrl.HOST_HEARTBEAT], time.monotonic())
            self._check_host()
        except (TimeoutError, ChannelError) as exc:
            self._stop_heartbeat()
            ctrl[Ctrl.CLIENT_ACTIVE] = 0
            raise PeerGone(f"{self.region.where} channel {self.index}: the host agent did not accept the "
                           f"channel ({exc}); check that oriond is running and serves this region") from None
        self.endpoint.resync()

    def _beat(self) -> None:
        self.ctrl[Ctrl.CLIENT_HEARTBEAT] = self.ctrl[Ctrl.CLIENT_HEARTBEAT] + 1

    def _check_host(self) -> None:
        """Raise PeerGone unless this session is still served; called only from slow waits, so every wait of a
        client ends in an error within `agent_timeout` once nobody serves it.

        The session is served while the host says so for our generation and whoever serves it shows signs of
        life: the session's own worker (its heartbeat word, FEATURE_HOST_HEARTBEAT) — not the region's
        supervisor, which may be busy with other channels while the worker serves us — or, on a region without
        that feature, the agent's heartbeat.
        """
        ctrl, where = self.ctrl, f"{self.region.where} channel {self.index}"
        status, host_gen = ctrl[Ctrl.HOST_STATUS], ctrl[Ctrl.HOST_GEN]
        if host_gen != self.endpoint.generation:
            raise PeerGone(f"{where}: the host serves this channel for generation {host_gen}, not ours "
                           f"({self.endpoint.generation}): its control words were overwritten; restart this program")
        if status in (HostStatus.FAILED, HostStatus.RECLAIMED):
            reason = REASON_TEXT.get(ctrl[Ctrl.HOST_REASON], f"reason {ctrl[Ctrl.HOST_REASON]}")
            gone = DeviceLost if ctrl[Ctrl.HOST_REASON] in DEVICE_LOST_REASONS else PeerGone
            raise gone(f"{where}: the host ended this session ({reason})")
        if status != HostStatus.SERVING:
            raise PeerGone(f"{where}: the host ended this session (it saw the channel released: its control "
                           "words were overwritten); restart this program")
        now = time.monotonic()
        if self._worker_beats:
            beat, (seen, since) = ctrl[Ctrl.HOST_HEARTBEAT], self._worker_seen
            if beat != seen:
                self._worker_seen = (beat, now)
            elif now - since > self.agent_timeout:
                raise PeerGone(f"{where}: the host worker serving this session has shown no heartbeat for "
                               f"{self.agent_timeout:g} s; is oriond still running?")
            return
        beat, _pid, state = self.region.agent_words()
        if state == layout.AGENT_STOPPED:
            raise PeerGone(f"{where}: the host agent stopped; restart oriond and this program")
        if beat != self._agent_seen[0]:
            self._agent_seen = (beat, now)
        elif now - self._agent_seen[1] > self.agent_timeout:
            raise PeerGone(f"{where}: the host agent has shown no heartbeat for {self.agent_timeout:g} s; "
                           "is oriond still running?")

    def _drain(self) -> None:
        """Move waiting completions into the inbox, so a full request ring can never deadlock the host."""
        while True:
            record = self.endpoint.receive(wait=False)
            if record is None:
                return
            self._file(record)

    def _file(self, record: Record) -> Record | None:
        if record.generation != self.endpoint.generation:
            return None  # left over from an earlier owner of this channel: never delivered
        if record.flags & Flag.ASYNC_ERROR:
            self.async_errors.append(record)
            return None
        return record

    # --- the API -----------------------------------------------------------------------------------------
    def _next_id(self) -> int:
        if self._closed:
            raise ChannelError(f"{self.region.where} channel {self.index}: this channel was released; claim "
                               "another")
        return next(self._ids)

    def submit(self, opcode: int, payload: Payload = b"") -> int:
        """Send a request that wants a reply, without waiting for it; returns its call id."""
        call_id = self._next_id()
        self.endpoint.send(call_id, opcode, 0, payload)
        return call_id

    def post(self, opcode: int, payload: Payload = b"") -> int:
        """Send a request that wants no reply (errors come back later as async errors)."""
        call_id = self._next_id()
        self.endpoint.send(call_id, opcode, Flag.NO_REPLY, payload)
        return call_id

    def next_reply(self, sink: Sink | None = None, wait: bool = True) -> Record | None:
        """The oldest reply not yet taken (replies come in request order); a staged one goes to `sink`."""
        if self.inbox:
            return self.inbox.popleft()
        while True:
            record = self.endpoint.receive(sink, wait)
            if record is None:
                return None
            record = self._file(record)
            if record is not None:
                return record

    def call(self, opcode: int, payload: Payload = b"", sink: Sink | None = None) -> Record:
        """Send a request and wait for its reply; replies to earlier `submit`s stay in the inbox."""
        call_id = self.submit(opcode, payload)
        for queued in self.inbox:  # drained while we waited for room to send
            if queued.call_id == call_id:
                self.inbox.remove(queued)
                return queued
        sink_for = None
        if sink is not None:
            sink_for = lambda cid, _op, _n: sink if cid == call_id else None  # noqa: E731
        while True:
            received = self.endpoint.receive(None, True, sink_for)
            record = self._file(received) if received is not None else None
            if record is None:
                continue
            if record.call_id == call_id:
                return record
            self.inbox.append(record)

    def hello(self, calls: str = "") -> tuple[str, int]:
        """Introduce this client: the wire protocol, and `calls`, the digest of the forwarded-call table it
        speaks ("" for the wire alone). An agent that speaks another protocol or serves another table refuses,
        and its one-line reason becomes this ChannelError's."""
        reply = self.call(Op.HELLO, HELLO_REQUEST.encode(PROTOCOL, os.getpid(), socket.gethostname(), calls))
        if not reply.ok:
            reason = bytes(reply.payload[:300]).decode(errors="replace") or f"status {reply.status}"
            if reply.status == Status.MALFORMED:  # an agent of protocol 2 refuses a slot's publish mark
                reason += OLDER_AGENT
            raise ChannelError(f"{self.region.where}: the host agent refused this client: {reason}")
        agent, session = HELLO_REPLY.decode(reply.payload)
        return agent, session

    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_heartbeat()
        self.ctrl[Ctrl.CLIENT_ACTIVE] = 0
        os.close(self.lock_fd)  # drops the lock

    def __enter__(self) -> ClientChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _agent_state(region: Region, settle_s: float = 0.3) -> int:
    """The agent's state word, trusting a live agent over a stray write: the supervisor rewrites the word on
    every pass, so a region whose word says otherwise while its heartbeat still moves is served."""
    beat, _pid, state = region.agent_words()
    deadline = time.monotonic() + settle_s
    while state != layout.AGENT_SERVING and time.monotonic() < deadline:
        time.sleep(0.02)
        now_beat, _pid, state = region.agent_words()
        if now_beat != beat:
            return layout.AGENT_SERVING
    return state


class HostChannel:
    """The host's view of one channel: its control words, and an endpoint for the worker serving it."""

    def __init__(self, region: Region, index: int) -> None:
        self.region = region
        self.index = index
        self.base = region.geometry.channel_base(index)
        self.ctrl = Control(region, self.base)

    def pending_claim(self) -> int | None:
        """The generation a client claimed and the host has not answered yet, if any."""
        generation = self.ctrl[Ctrl.CLIENT_GEN]
        if generation != self.ctrl[Ctrl.HOST_GEN] and self.ctrl[Ctrl.CLIENT_ACTIVE]:
            return generation
        return None

    def accept(self, generation: int, worker_pid: int = 0) -> None:
        """Zero the host-owned indices and tell the client the channel is served for `generation`."""
        Endpoint(self.region, self.index, "host", prefault=False).reset_owned()
        self.ctrl[Ctrl.HOST_HEARTBEAT] = 0
        self.ctrl[Ctrl.HOST_WORKER] = worker_pid
        self.ctrl[Ctrl.HOST_REASON] = HostReason.NONE
        self.ctrl[Ctrl.HOST_STATUS] = HostStatus.SERVING
        self.ctrl[Ctrl.HOST_GEN] = generation

    def beat(self) -> None:
        """The serving worker's sign of life (FEATURE_HOST_HEARTBEAT); it alone writes the word."""
        self.ctrl[Ctrl.HOST_HEARTBEAT] = self.ctrl[Ctrl.HOST_HEARTBEAT] + 1

    def end(self, status: HostStatus, reason: HostReason) -> None:
        self.ctrl[Ctrl.HOST_WORKER] = 0
        self.ctrl[Ctrl.HOST_REASON] = reason
        self.ctrl[Ctrl.HOST_STATUS] = status

    def client_alive(self, last_beat: tuple[int, float], heartbeat_timeout: float) -> tuple[bool, tuple[int, float]]:
        """(alive, new last_beat): lock mode asks the kernel, heartbeat mode watches the counter."""
        if not self.ctrl[Ctrl.CLIENT_ACTIVE]:
            return False, last_beat
        if self.ctrl[Ctrl.LIVENESS] == liveness.LOCK_MODE:
            return liveness.is_locked(self.region.fd, self.base), last_beat
        beat, now = self.ctrl[Ctrl.CLIENT_HEARTBEAT], time.monotonic()
        if beat != last_beat[0]:
            return True, (beat, now)
        return now - last_beat[1] <= heartbeat_timeout, last_beat

    def endpoint(self, policy: WaitPolicy = DEFAULT_POLICY, check: Callable[[], None] | None = None) -> Endpoint:
        endpoint = Endpoint(self.region, self.index, "host", policy, check)
        endpoint.generation = self.ctrl[Ctrl.HOST_GEN]
        return endpoint

    def describe(self) -> dict[str, int | str]:
        """Control words and ring positions, for `orion-shm inspect`."""
        g = self.region.geometry
        words: dict[str, int | str] = {w.name.lower(): self.ctrl[w] for w in Ctrl}
        status = self.ctrl[Ctrl.HOST_STATUS]
        known = {s.value: s.name.lower() for s in HostStatus}
        words["host_status"] = known.get(status, str(status))
        req = Ring(self.region.u32, self.base + g.off_req_ring, g.ring_entries, g.slot_size, "req")
        cpl = Ring(self.region.u32, self.base + g.off_cpl_ring, g.ring_entries, g.slot_size, "cpl")
        for key, ring in (("requests_pending", req), ("replies_pending", cpl)):
            head, tail = ring.snapshot()
            words[key] = (tail - head) & 0xFFFFFFFF
        return words

