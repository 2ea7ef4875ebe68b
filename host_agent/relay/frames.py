"""Records over a byte stream: the framing a relay connection carries (docs/remote.md, docs/wire-protocol.md).

A relayed session's records travel between two oriond processes exactly as they travel on a ring: the same
32-byte header (ivshmem.record.HEADER: call id, opcode, flags, length, generation, status) followed by `length`
payload bytes. On a stream there are no slots and no staging arena, so a payload is always contiguous and the
STAGED flag never appears. The relay's own control records use opcodes of their own (RELAY_HELLO,
RELAY_ACCEPT, BEAT), below the CUDA opcodes and outside the ring's control opcodes, so neither side can
mistake one for a ring record.

Every read and every write is bounded: `receive` waits at most its timeout for a frame to begin, a frame that has
begun must arrive whole within `stall_s` (a peer that sends half a frame and stops holds nothing for longer), and a
write that makes no progress for `stall_s` (a peer that stops reading: the socket's SO_SNDTIMEO, which the compiled
writers obey too) ends the connection. A header the
ring would refuse (unknown flags, a reserved word, an opcode out of range, a length beyond the limit) is a
RecordError before any payload is read; an end of stream, whole or mid-frame, is ConnectionLost.

A large frame need not be held whole on either side (docs/wire-protocol.md, "Relay frames"): `open_frame` writes a
frame's header, then its payload piece by piece as it is produced (a staged copy as its chunks come off the ring,
a device-to-host reply as the GPU copies it), and `begin` + `read_payload` read a frame's header, then its payload
into wherever it goes (the completion ring's staging chunks, a copy's sink). On the wire it is the same frame; the
two ends overlap the socket with the work on either side, and no copy is limited by what one buffer may hold.
Each piece `read_payload` reads has its own `stall_s` bound, so a frame of 1 GiB on a slow link is not given up.

What a peer declares is bounded before memory is taken for it (docs/wire-protocol.md, "Relay frames"): nothing is
read before the cluster-key handshake (relay/handshake.py) but its fixed-size messages; then a frame's length is
at most the record limit (MAX_PAYLOAD, 1 GiB, as on a ring), `receive` takes memory as the bytes arrive (never
more than twice what arrived, or 16 MiB, as a ring's assembled payload) within the limit its caller gives, and
`payload_bound` says how much of a request the GPU host's worker holds in memory, per opcode.
"""
from __future__ import annotations

import contextlib
import ctypes
import select
import socket
import struct
import time
from typing import Protocol

from ivshmem.channel import ASSEMBLE_STEP, MAX_PAYLOAD
from ivshmem.codec import Schema
from ivshmem.errors import RecordError, WireError
from ivshmem.record import HEADER, Flag, Op, Record, Status, check_header

# The relay's control opcodes (docs/wire-protocol.md, "Relay frames").
RELAY_HELLO = 0x80
RELAY_ACCEPT = 0x81
BEAT = 0x82

# RELAY_HELLO: the relay's protocol, the forwarded-call table's digest, whose session it relays (for logs), the
# allocation it brings (or ""), and its RDMA offer (empty: TCP only). RELAY_ACCEPT: the GPU host's session, the
# transport it chose and why, its RDMA answer, and its BIND reply to the allocation (empty without one), which the
# relay gives the guest as the answer to its own BIND.
RELAY_HELLO_REQUEST = Schema("RELAY_HELLO", ("protocol", "u32"), ("pid", "u32"), ("client_host", "str"),
                             ("calls", "str"), ("allocation", "str"), ("rdma", "bytes"))
RELAY_ACCEPT_REPLY = Schema("RELAY_ACCEPT", ("session", "u64"), ("transport", "str"), ("why", "str"),
                            ("rdma", "bytes"), ("bound", "bytes"))

# What the GPU host's worker holds in memory of one request it has no sink for (a sink, as a host-to-device copy's,
# takes any length up to MAX_PAYLOAD a piece at a time): RELAY_HELLO and RELAY_ACCEPT carry a few names, a digest and
# an RDMA offer (under 1 KiB); ECHO is a diagnostic (orion-guest probe echoes two staging chunks and a little more,
# at most ~2 MiB); anything else what a ring assembles for a request without a sink (ServerOptions.max_assembled,
# 256 MiB: a relayed session carries exactly what its guest's ring carries).
CONTROL_MAX = 64 << 10
ECHO_MAX = 16 << 20


def payload_bound(opcode: int, max_assembled: int) -> int:
    """The most bytes of an `opcode` request a worker assembles in memory (`max_assembled`: the ring's bound)."""
    if opcode in (RELAY_HELLO, RELAY_ACCEPT, BEAT):
        return CONTROL_MAX
    if opcode == Op.ECHO:
        return min(ECHO_MAX, max_assembled)
    return max_assembled


class FrameLock:
    """A relay connection's write lock: one frame at a time, whoever writes it. A pthread mutex, so that Python's
    writers (a session's replies, the heartbeat thread) and compiled code (the relay's pump, relay_pump.c; the GPU
    host's hot path, session/hot_dispatch.c, given it by StreamTransport.compiled_socket) take the same lock: Python
    through ctypes, which releases the GIL while it waits; C by its `address`."""

    SIZE = 64  # bytes kept for the mutex: more than pthread_mutex_t takes on Linux (40 on x86-64, 48 on arm64)

    def __init__(self) -> None:
        self._mutex = (ctypes.c_uint64 * (self.SIZE // 8))()
        self.address = ctypes.addressof(self._mutex)
        if _mutex_init(self.address, None) != 0:
            raise OSError("pthread_mutex_init failed")

    def acquire(self) -> bool:
        _mutex_lock(self.address)
        return True

    def release(self) -> None:
        _mutex_unlock(self.address)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


_libc = ctypes.CDLL(None)  # glibc: the pthread functions are libc's own (ctypes releases the GIL around each call)
_mutex_init, _mutex_lock, _mutex_unlock = _libc.pthread_mutex_init, _libc.pthread_mutex_lock, _libc.pthread_mutex_unlock
_mutex_init.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
_mutex_lock.argtypes = _mutex_unlock.argtypes = [ctypes.c_void_p]


class RecordStream(Protocol):
    """A relay connection's records, whatever carries them (FrameStream over TCP, rdma_stream.RdmaStream over RDMA):
    one reader, any number of writers, one frame written at a time. What a session's end of it (stream_endpoint.py),
    the relay (relayed_session.py) and a frame written piece by piece (FrameWriter) use."""

    sock: socket.socket  # the TCP connection it was set up on (RDMA: its control channel)
    max_payload: int
    stall_s: float

    def send(self, call_id: int, opcode: int, payload: bytes | bytearray | memoryview = b"", flags: int = 0,
             status: int = 0, generation: int = 0) -> None: ...

    def open_frame(self, call_id: int, opcode: int, length: int, flags: int = 0, status: int = 0,
                   generation: int = 0) -> FrameWriter: ...

    def receive(self, timeout: float | None = None) -> Record | None: ...

    def begin(self, timeout: float | None = None) -> Record | None: ...

    def read_payload(self, view: memoryview) -> None: ...

    def close(self) -> None: ...

    def compiled_socket(self) -> tuple[int, FrameLock] | None:
        """(socket, write lock) where compiled code may read and write this connection's frames itself (TCP); None
        where it may not (RDMA)."""

    def moved(self) -> tuple[int, int]:
        """(bytes sent, bytes received) on this connection so far, whoever moved them (oriond's /metrics)."""

    def write_piece(self, data: bytes | bytearray | memoryview) -> None:
        """The next bytes of the frame open_frame began (FrameWriter.write)."""

    def end_frame(self, left: int) -> None:
        """The frame open_frame began ends, `left` bytes short of its length (FrameWriter.close); the stream is
        released for the next writer."""


STALL_S = 5.0  # a begun frame's next bytes, or a write's progress: the relay's silence bound (StreamEndpoint.dead_s)
RECV_MAX = 1 << 20  # one recv takes at most this: a huge one holds the socket while later segments queue behind it


# Where struct tcp_info (linux/tcp.h, append-only) keeps tcpi_bytes_acked and tcpi_bytes_received, two u64s.
_TCP_INFO_BYTES = range(120, 136)


class ConnectionLost(WireError):
    """The peer closed the stream, reset it, or stopped in the middle of a frame."""


class FrameStream:
    """One connected stream socket carrying records both ways: one reader, any number of writers (a session's
    replies and its heartbeat thread), each record written whole under a lock (its
    FrameLock, which the relay's pump and the GPU host's hot path take for their writes too)."""

    def __init__(self, sock: socket.socket, max_payload: int = MAX_PAYLOAD, stall_s: float = STALL_S) -> None:
        self.sock = sock
        self.max_payload = max_payload
        self.stall_s = stall_s
        whole = int(stall_s)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", whole, int((stall_s - whole) * 1e6)))
        self._header = bytearray(HEADER.size)
        self._writing = FrameLock()  # compiled writers (the relay's pump, the hot path) take it too
        self._left = 0  # payload bytes of the frame begun (begin) and not read yet
        self._deadline = 0.0

    def close(self) -> None:
        """Close the connection (the peer's reads end with ConnectionLost)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def send(self, call_id: int, opcode: int, payload: bytes | bytearray | memoryview = b"", flags: int = 0,
             status: int = 0, generation: int = 0) -> None:
        """One record, header and payload in one gathered write (the payload is not copied first)."""
        if flags & Flag.STAGED:
            raise RecordError("a stream record is never staged")
        header = HEADER.pack(call_id, opcode, flags, len(payload), generation, status, 0)
        try:
            with self._writing:
                sent = self.sock.sendmsg([header, payload])
                if sent < HEADER.size + len(payload):  # a short gathered write: the rest, in order
                    self.sock.sendall(memoryview(header + bytes(payload))[sent:])
        except OSError as exc:
            raise ConnectionLost(f"sending to the relay peer failed: {exc}") from None

    def open_frame(self, call_id: int, opcode: int, length: int, flags: int = 0, status: int = 0,
                   generation: int = 0) -> FrameWriter:
        """A frame whose `length` payload bytes are written piece by piece (FrameWriter.write), the stream held for
        it until FrameWriter.close; the header leaves now."""
        if flags & Flag.STAGED:
            raise RecordError("a stream record is never staged")
        self._writing.acquire()
        writer = FrameWriter(self, length)
        writer.write(HEADER.pack(call_id, opcode, flags, length, generation, status, 0), header=True)
        return writer

    def receive(self, timeout: float | None = None, limit: int | None = None) -> Record | None:
        """The next record, or None when none began within `timeout` seconds (None: wait as long as it takes).
        RecordError for a header the ring would refuse, or a payload longer than `limit` (TOO_LARGE: the frame is
        then unread and the stream unusable); ConnectionLost for an end of stream or a stalled frame. Memory is
        taken as the payload arrives, so a peer that declares much and sends little makes this end hold little."""
        head = self.begin(timeout)
        if head is None:
            return None
        if limit is not None and head.length > limit:
            raise RecordError(f"a frame of opcode {head.opcode:#x} declares {head.length} bytes: more than the "
                              f"{limit} it may carry", Status.TOO_LARGE)
        payload = bytearray(min(head.length, ASSEMBLE_STEP))
        got = 0
        while got < head.length:
            if got == len(payload):  # all that was taken has arrived: take up to as much again
                payload += bytes(min(len(payload), head.length - len(payload)))
            with memoryview(payload) as view, view[got:] as rest:
                self._fill(rest, self._deadline, first=False)
            got = len(payload)
        self._left = 0
        return head._replace(payload=payload)

    def begin(self, timeout: float | None = None) -> Record | None:
        """The next record's header (its payload empty), or None as `receive`; its `length` payload bytes must then
        be read, in order, with `read_payload` before anything else is read."""
        if self._left:
            raise RecordError(f"the frame begun has {self._left} payload bytes left to read")
        try:
            ready, _, _ = select.select([self.sock], [], [], timeout)
        except (OSError, ValueError) as exc:
            raise ConnectionLost(f"the relay connection is unusable: {exc}") from None
        if not ready:
            return None
        self._deadline = time.monotonic() + self.stall_s
        self._fill(memoryview(self._header), self._deadline, first=True)
        fields = HEADER.unpack(self._header)
        check_header(fields, self.max_payload, self.max_payload)
        call_id, opcode, flags, length, generation, status, _reserved = fields
        if flags & Flag.STAGED:
            raise RecordError(f"record {call_id}: a stream record is never staged")
        self._left = length
        return Record(call_id, opcode, flags, length, generation, status, b"")

    def read_payload(self, view: memoryview) -> None:
        """Fill `view` with the next bytes of the frame begun (at most what is left of it), within `stall_s`."""
        if len(view) > self._left:
            raise RecordError(f"reading {len(view)} bytes of a frame with {self._left} left")
        self._fill(view, time.monotonic() + self.stall_s, first=False)
        self._left -= len(view)

    def compiled_socket(self) -> tuple[int, FrameLock]:
        return self.sock.fileno(), self._writing

    def moved(self) -> tuple[int, int]:
        """(bytes sent and acknowledged by the peer, bytes received) on this connection so far, by the kernel's count
        (TCP_INFO's tcpi_bytes_acked and tcpi_bytes_received, Linux 4.2 on), so that what compiled writers and
        readers move is counted too; (0, 0) where the socket is not TCP or the kernel does not say."""
        try:
            info = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES.stop)
        except OSError:
            return 0, 0
        if len(info) < _TCP_INFO_BYTES.stop:
            return 0, 0
        acked, received = struct.unpack_from("=QQ", info, _TCP_INFO_BYTES.start)
        return acked, received

    def write_piece(self, data: bytes | bytearray | memoryview) -> None:
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise ConnectionLost(f"sending to the relay peer failed: {exc}") from None

    def end_frame(self, left: int) -> None:
        """A frame written piece by piece ends (FrameWriter.close); `left` bytes short: the connection ends."""
        try:
            if left:
                self.close()
        finally:
            self._writing.release()

    def _fill(self, view: memoryview, deadline: float, first: bool) -> None:
        got = 0
        while got < len(view):
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConnectionLost(f"the relay peer stopped mid-frame ({got} of {len(view)} bytes in "
                                     f"{self.stall_s:g} s)")
            try:
                target = view[got:got + RECV_MAX]
                try:  # what is there already (a large payload's bytes, mostly) without a select first
                    n = self.sock.recv_into(target, 0, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    ready, _, _ = select.select([self.sock], [], [], left)
                    n = self.sock.recv_into(target) if ready else -1
            except (OSError, ValueError) as exc:  # ValueError: the socket was closed under us
                raise ConnectionLost(f"the relay connection failed: {exc}") from None
            if n == 0:
                where = "" if first and got == 0 else f" mid-frame ({got} of {len(view)} bytes)"
                raise ConnectionLost(f"the relay peer closed the connection{where}")
            if n > 0:
                got += n


class FrameWriter:
    """One frame being written piece by piece (FrameStream.open_frame, RdmaStream.open_frame); `close` ends it. A
    frame left short (the producer failed midway) cannot be completed: the connection is ended, and the peer sees
    it lost."""

    def __init__(self, frames: RecordStream, length: int) -> None:
        self.frames, self.left = frames, length
        self._open = True

    def write(self, data: bytes | bytearray | memoryview, header: bool = False) -> None:
        if not header:
            if len(data) > self.left:
                self.close()
                raise RecordError(f"{len(data)} bytes written to a frame with {self.left} left")
            self.left -= len(data)
        try:
            self.frames.write_piece(data)
        except ConnectionLost:
            self.close()
            raise

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        self.frames.end_frame(self.left)
