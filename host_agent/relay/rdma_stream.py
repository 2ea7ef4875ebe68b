"""Records over an RDMA reliable connection (pyverbs): a relay connection's transport when both hosts have an RDMA
device (docs/remote.md, docs/wire-protocol.md "RDMA transport").

A relay connection always begins on TCP. RELAY_HELLO carries the relay's RDMA offer and RELAY_ACCEPT the GPU
host's (RDMA_OFFER: how to reach its queue pair and where the peer may write). When both offered, each side moves
its RC queue pair to RTS and the records go over RDMA from then on. The TCP connection stays open and silent:
either end's death (its kernel closes the socket) is seen at once, as on TCP.

A record is framed exactly as on TCP (relay_frames: the 32-byte header, then the payload) and cut into pieces of
at most the peer's `piece` bytes. Piece n goes by RDMA WRITE WITH IMMEDIATE into slot n mod `slots` of the peer's
registered inbox; the immediate is the piece's length, and its completion on the peer's receive queue (an RC queue
pair completes in order) says the bytes are there. So a small record costs one operation and a bulk payload moves
by RDMA WRITE straight into registered memory, `slots` pieces in flight. Flow control is by credit: the receiver
RDMA-WRITEs its count of consumed pieces into the sender's credit word (inline, every quarter of its slots), and a
sender never has more than `slots` pieces unconsumed. A sender waiting for credit has `slots` pieces out, so the
receiver, consuming them, always reaches its next report: no idle-time report is needed.

Every wait is bounded as on TCP: a begun frame arrives whole within `stall_s`, a sender waits at most `stall_s`
for credit, and a work completion in error (the peer's queue pair gone, its retries exhausted) is ConnectionLost.
"""
from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import random
import select
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ivshmem.channel import MAX_PAYLOAD
from ivshmem.codec import Schema
from ivshmem.errors import RecordError
from ivshmem.record import HEADER, Flag, Record, check_header

from ..errors import UnavailableError
from .frames import STALL_S, ConnectionLost, FrameWriter

# Where the peer writes and how to reach its queue pair (docs/wire-protocol.md, "RDMA transport").
RDMA_OFFER = Schema("RDMA_OFFER", ("gid", "bytes"), ("qpn", "u32"), ("psn", "u32"), ("mtu", "u32"),
                    ("inbox", "u64"), ("inbox_rkey", "u32"), ("credit", "u64"), ("credit_rkey", "u32"),
                    ("slots", "u32"), ("piece", "u32"))
SLOTS = 32
PIECE = 256 << 10  # 8 MiB of inbox: enough pieces in flight to keep a link busy, one copy-out per piece
MIN_PIECE, MAX_PIECE, MAX_SLOTS, MAX_INBOX = 4096, 4 << 20, 256, 64 << 20  # bounds on what a peer may ask for
SEND_DEPTH = 2 * MAX_SLOTS + 16  # send work requests outstanding at most: pieces, plus credit writes
SIGNAL_EVERY = 16  # one send in this many asks for a completion (which completes those before it too)
SPIN_S = 100e-6  # a waiting side polls its queue this long before it starts to sleep
NAP_MAX_S = 1e-3  # and then sleeps at most this long between polls (on the TCP socket: its end wakes us)
SYSFS = Path("/sys/class/infiniband")


class RdmaUnavailable(UnavailableError):
    """This host cannot carry the connection over RDMA; the message says why (one line, for the log)."""


@dataclass(frozen=True)
class RdmaPort:
    device: str
    port: int
    gid_index: int
    gid: bytes


def gid_of(address: str) -> bytes:
    """The RoCE GID of an IP address: an IPv6 address itself, an IPv4 one mapped (::ffff:a.b.c.d)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv4Address):
        ip = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)
    return ip.packed


def device_names(sysfs: Path = SYSFS) -> list[str]:
    """The RDMA devices the kernel has (none without RDMA in the kernel)."""
    return sorted(p.name for p in sysfs.iterdir()) if sysfs.is_dir() else []


def find_port(address: str, device: str = "", sysfs: Path = SYSFS) -> RdmaPort:
    """The RDMA device port that carries `address` (this host's end of the relay's TCP connection): a port with
    a GID for it, RoCE v2 preferred. `device` (ibverbs_device) limits the search to that device. RdmaUnavailable
    with the reason when there is none: no device at all, the named one missing, or none on that address."""
    names = device_names(sysfs)
    if not names:
        raise RdmaUnavailable("this host has no RDMA device")
    if device and device not in names:
        raise RdmaUnavailable(f"ibverbs_device {device} is not an RDMA device here (there are: {', '.join(names)})")
    wanted = gid_of(address)
    found: list[tuple[bool, RdmaPort]] = []
    for name in [device] if device else names:
        for port_dir in sorted((sysfs / name / "ports").glob("*")):
            for gid_file in (port_dir / "gids").glob("*"):
                with contextlib.suppress(OSError, ValueError):
                    if bytes.fromhex(gid_file.read_text().strip().replace(":", "")) != wanted:
                        continue
                    kind = (port_dir / "gid_attrs" / "types" / gid_file.name).read_text().strip()
                    found.append((kind != "RoCE v2", RdmaPort(name, int(port_dir.name), int(gid_file.name), wanted)))
    if not found:
        where = f"ibverbs_device {device}" if device else f"any of {', '.join(names)}"
        raise RdmaUnavailable(f"{where} has no address {address} (the relay connection's own address here); "
                              "RDMA needs the relay connection on the RDMA device's network")
    return min(found, key=lambda f: (f[0], f[1].gid_index))[1]


def _completion_channel(ctx: Any) -> tuple[Any, int | None]:
    """A completion channel and its file descriptor, so that a waiting reader can sleep in select() until a piece
    arrives instead of polling. pyverbs does not expose the descriptor: it is the one the channel's creation
    opened, the kernel's "[infinibandevent]" inode. None (the reader then polls with naps) if it cannot be told."""
    from pyverbs.cq import CompChannel

    def event_fds() -> set[int]:
        found = set()
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[infinibandevent]":
                    found.add(int(name))
        return found

    before = event_fds()
    channel = CompChannel(ctx)
    new = event_fds() - before
    return channel, new.pop() if len(new) == 1 else None


def check_offer(payload: bytes | bytearray) -> dict[str, Any]:
    """A peer's RDMA_OFFER, decoded and held to the bounds this end will stage for (its outbox is slots x piece);
    RdmaUnavailable with the reason otherwise."""
    try:
        fields = dict(zip(("gid", "qpn", "psn", "mtu", "inbox", "inbox_rkey", "credit", "credit_rkey", "slots",
                           "piece"), RDMA_OFFER.decode(payload), strict=True))
    except RecordError as exc:
        raise RdmaUnavailable(f"the peer's RDMA offer is malformed: {exc}") from None
    if (len(fields["gid"]) != 16 or not 2 <= fields["slots"] <= MAX_SLOTS
            or not MIN_PIECE <= fields["piece"] <= MAX_PIECE or fields["slots"] * fields["piece"] > MAX_INBOX
            or not 1 <= fields["mtu"] <= 5):
        raise RdmaUnavailable("the peer's RDMA offer is out of bounds (gid, slots, piece size or MTU)")
    return fields


class RdmaLink:
    """One end's verbs resources for one relay connection: its RC queue pair, its inbox (where the peer writes),
    its credit word (where the peer says how much it has consumed) and, once connected, its outbox (where a piece
    is staged for the peer's inbox)."""

    def __init__(self, port: RdmaPort, slots: int = SLOTS, piece: int = PIECE) -> None:
        try:
            from pyverbs import enums
            from pyverbs.cq import CQ
            from pyverbs.device import Context
            from pyverbs.mr import MR
            from pyverbs.pd import PD
            from pyverbs.pyverbs_error import PyverbsError
            from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
            from pyverbs.wr import SGE, RecvWR
        except ImportError as exc:
            raise RdmaUnavailable(f"pyverbs cannot be imported ({exc}); install python3-pyverbs") from None
        self.e, self._sge, self._recv_wr = enums, SGE, RecvWR
        self.port, self.slots, self.piece = port, slots, piece
        self.psn = random.randrange(1 << 24)
        try:
            self.ctx = Context(name=port.device)
            try:
                pd = PD(self.ctx)
                self.channel, self.event_fd = _completion_channel(self.ctx)
                self.send_cq, self.recv_cq = CQ(self.ctx, SEND_DEPTH), CQ(self.ctx, slots, None, self.channel, 0)
                self.qp = QP(pd, QPInitAttr(qp_type=enums.IBV_QPT_RC, scq=self.send_cq, rcq=self.recv_cq,
                                            cap=QPCap(max_send_wr=SEND_DEPTH, max_recv_wr=slots, max_send_sge=1,
                                                      max_recv_sge=1, max_inline_data=8)))
                remote = enums.IBV_ACCESS_LOCAL_WRITE | enums.IBV_ACCESS_REMOTE_WRITE
                self.inbox = MR(pd, slots * piece, remote)
                self.credit = MR(pd, 8, remote)
                self.credit.write(bytes(8), 8)
                self.credit_out = MR(pd, 8, enums.IBV_ACCESS_LOCAL_WRITE)
                self._pd, self._mr = pd, MR
                self.outbox: Any = None  # registered at connect, sized by the peer's offer
                self.mtu = int(self.ctx.query_port(port.port).active_mtu)
                attr = QPAttr()
                attr.qp_access_flags, attr.pkey_index, attr.port_num = remote, 0, port.port
                self.qp.to_init(attr)
                for slot in range(slots):
                    self.repost(slot)
            except BaseException:
                self.ctx.close()
                raise
        except PyverbsError as exc:
            raise RdmaUnavailable(f"RDMA device {port.device} could not be set up: {exc}") from None

    def offer(self) -> bytes:
        return RDMA_OFFER.encode(self.port.gid, self.qp.qp_num, self.psn, self.mtu, self.inbox.buf, self.inbox.rkey,
                                 self.credit.buf, self.credit.rkey, self.slots, self.piece)

    def repost(self, slot: int) -> None:
        """Give the receive queue back the entry a piece's completion used (the immediate needs one each)."""
        self.qp.post_recv(self._recv_wr(wr_id=slot, num_sge=1, sg=[self._sge(self.credit.buf, 0, self.credit.lkey)]))

    def connect(self, peer_offer: bytes | bytearray) -> dict[str, Any]:
        """Move the queue pair to RTS towards the peer's offer; the peer's offer, decoded and checked."""
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.pyverbs_error import PyverbsError
        from pyverbs.qp import QPAttr
        fields = check_offer(peer_offer)
        try:
            self.outbox = self._mr(self._pd, fields["slots"] * fields["piece"], self.e.IBV_ACCESS_LOCAL_WRITE)
            attr = QPAttr()
            attr.qp_access_flags = self.e.IBV_ACCESS_LOCAL_WRITE | self.e.IBV_ACCESS_REMOTE_WRITE
            attr.pkey_index, attr.port_num = 0, self.port.port
            gid = GID(":".join(fields["gid"][i:i + 2].hex() for i in range(0, 16, 2)))  # pyverbs: 8 groups
            attr.ah_attr = AHAttr(port_num=self.port.port, is_global=1, dlid=0,
                                  gr=GlobalRoute(dgid=gid, sgid_index=self.port.gid_index, hop_limit=64))
            attr.path_mtu = min(self.mtu, fields["mtu"])
            attr.dest_qp_num, attr.rq_psn = fields["qpn"], fields["psn"]
            attr.max_dest_rd_atomic, attr.min_rnr_timer = 1, 12
            self.qp.to_rtr(attr)
            attr.sq_psn, attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic = self.psn, 14, 7, 7, 1
            self.qp.to_rts(attr)
        except PyverbsError as exc:
            raise RdmaUnavailable(f"the RDMA queue pair could not be connected: {exc}") from None
        return fields

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ctx.close()  # every resource made on it goes with it


def _memory(mr: Any, size: int) -> memoryview:
    """A registered buffer as a writable memoryview: pieces are copied in and out of it directly (pyverbs' MR.read
    and MR.write go through a bytes object each time)."""
    return memoryview((ctypes.c_char * size).from_address(mr.buf)).cast("B")


class RdmaStream:
    """A relay connection's records over a connected RdmaLink, with relay_frames.FrameStream's interface (`send`,
    `open_frame`, `receive`, `begin` + `read_payload`, `close`): one reader, any number of writers, one frame
    written at a time. A frame's pieces are staged straight into the outbox as it is written and read straight out
    of the inbox into where it goes, so a large payload is never held whole on either end."""

    def __init__(self, link: RdmaLink, peer: dict[str, Any], sock: socket.socket, max_payload: int = MAX_PAYLOAD,
                 stall_s: float = STALL_S) -> None:
        from pyverbs.wr import SGE, SendWR
        if link.outbox is None:
            raise RdmaUnavailable("the RDMA link is not connected")
        self.link, self.sock, self.max_payload, self.stall_s = link, sock, max_payload, stall_s
        self._sge, self._send_wr = SGE, SendWR
        self._peer_slots, self._peer_piece = peer["slots"], peer["piece"]
        self._peer_inbox, self._peer_rkey = peer["inbox"], peer["inbox_rkey"]
        self._peer_credit, self._peer_credit_rkey = peer["credit"], peer["credit_rkey"]
        self._inbox = _memory(link.inbox, link.slots * link.piece)
        self._outbox = _memory(link.outbox, self._peer_slots * self._peer_piece)
        self._sent = 0  # pieces written to the peer
        self._filling = -1  # the outbox slot a frame's bytes are being staged in (-1: none)
        self._filled = 0  # bytes staged in it
        self._received = 0  # pieces of the peer's taken out of our inbox
        self._reported = 0  # the last count of those written to the peer's credit word
        self._bytes_sent = self._bytes_received = 0  # in pieces written and taken (moved)
        self._current = memoryview(b"")  # what is left unread of the inbox piece being read
        self._left = 0  # payload bytes of the frame begun not read yet
        self._unarrived = 0  # of those, the bytes no piece has brought yet
        self._unsignaled = 0  # send work requests posted since the last one that asks for a completion
        self._signaled = 0  # work requests that ask for a completion and have not given it yet
        self._writing = threading.Lock()  # one frame's pieces at a time
        self._posting = threading.Lock()  # the send queue: pieces and credit writes
        self._lost: str | None = None

    # --- sending -------------------------------------------------------------------------------------------------

    def send(self, call_id: int, opcode: int, payload: bytes | bytearray | memoryview = b"", flags: int = 0,
             status: int = 0, generation: int = 0) -> None:
        """One record, whole (a small one is a single RDMA WRITE WITH IMMEDIATE)."""
        writer = self.open_frame(call_id, opcode, len(payload), flags, status, generation)
        try:
            writer.write(payload)
        finally:
            writer.close()

    def open_frame(self, call_id: int, opcode: int, length: int, flags: int = 0, status: int = 0,
                   generation: int = 0) -> FrameWriter:
        """A frame whose `length` payload bytes are written piece by piece (FrameWriter.write), the connection held
        for it until FrameWriter.close; each full piece leaves as soon as it is staged."""
        if flags & Flag.STAGED:
            raise RecordError("a stream record is never staged")
        self._writing.acquire()
        writer = FrameWriter(self, length)
        writer.write(HEADER.pack(call_id, opcode, flags, length, generation, status, 0), header=True)
        return writer

    def write_piece(self, data: bytes | bytearray | memoryview) -> None:
        """Copy a frame's next bytes into outbox slots, writing each to the peer as it fills."""
        view = memoryview(data).cast("B") if len(data) else memoryview(b"")
        piece = self._peer_piece
        while len(view):
            if self._filling < 0:
                self._claim()
            at = self._filling * piece + self._filled
            n = min(piece - self._filled, len(view))
            self._outbox[at:at + n] = view[:n]
            self._filled += n
            view = view[n:]
            if self._filled == piece:
                self._flush()

    def end_frame(self, left: int) -> None:
        """A frame ends (FrameWriter.close): its last piece leaves. One left `left` bytes short cannot be completed:
        the connection ends (its TCP socket shut down, so the peer sees it at once)."""
        try:
            if left:
                self._lose(f"a frame was left {left} bytes short")
                with contextlib.suppress(OSError):
                    self.sock.shutdown(socket.SHUT_RDWR)
            else:
                self._flush()
        finally:
            self._filling = -1
            self._writing.release()

    def compiled_socket(self) -> None:
        """Compiled code never writes an RDMA connection: its frames go through the queue pair, here."""
        return None

    def moved(self) -> tuple[int, int]:
        """(bytes written to the peer's inbox, bytes taken out of ours) so far: every piece goes through here."""
        return self._bytes_sent, self._bytes_received

    def _claim(self) -> None:
        """The next outbox slot, once the peer has consumed the piece last written from it (its credit says so)."""
        since = time.monotonic()
        while self._sent - self._peer_consumed() >= self._peer_slots:
            self._reap()
            self._nap(since, since + self.stall_s, "the relay peer took no data")
        self._filling, self._filled = self._sent % self._peer_slots, 0

    def _flush(self) -> None:
        """Write the slot being filled to the same slot of the peer's inbox, its length as the immediate."""
        if self._filling < 0:
            return
        at, length = self._filling * self._peer_piece, self._filled
        outbox = self.link.outbox
        wr = self._send_wr(wr_id=1, opcode=self.link.e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1,
                           sg=[self._sge(outbox.buf + at, length, outbox.lkey)], imm_data=length)
        wr.set_wr_rdma(self._peer_rkey, self._peer_inbox + at)
        self._filling = -1
        self._post(wr)
        self._sent += 1
        self._bytes_sent += length

    def _peer_consumed(self) -> int:
        return int.from_bytes(self.link.credit.read(8, 0), "little")

    def _post(self, wr: Any, flags: int = 0) -> None:
        """Post a send work request. Only one in SIGNAL_EVERY asks for a completion: a completion takes the send
        queue's entries of those before it too, and a failed one always completes (in error)."""
        from pyverbs.pyverbs_error import PyverbsError
        deadline = time.monotonic() + self.stall_s
        with self._posting:
            self._reap_locked()
            signal = self._unsignaled == SIGNAL_EVERY - 1
            while signal and self._signaled >= SEND_DEPTH // SIGNAL_EVERY - 1:
                if not self._reap_locked() and time.monotonic() > deadline:
                    raise ConnectionLost(f"the RDMA send queue did not drain in {self.stall_s:g} s")
            wr.send_flags = flags | (self.link.e.IBV_SEND_SIGNALED if signal else 0)
            try:
                self.link.qp.post_send(wr)
            except PyverbsError as exc:
                raise self._lose(f"posting to the RDMA queue pair failed: {exc}") from None
            self._unsignaled = 0 if signal else self._unsignaled + 1
            self._signaled += signal

    def _reap(self) -> None:
        with self._posting:
            self._reap_locked()

    def _reap_locked(self) -> int:
        """Take the send queue's completions; an error in one is the end of the connection."""
        if self._lost is not None:
            raise ConnectionLost(self._lost)
        count, completions = self.link.send_cq.poll(num_entries=16)
        for wc in completions[:count]:
            if wc.status != self.link.e.IBV_WC_SUCCESS:
                raise self._lose(f"an RDMA write failed (work completion status {wc.status}: the peer is gone "
                                 "or unreachable)")
        self._signaled -= count
        return count

    def _report(self) -> None:
        """Write our count of consumed pieces into the peer's credit word."""
        if self._reported == self._received:
            return
        self._reported = self._received
        self.link.credit_out.write(self._received.to_bytes(8, "little"), 8)
        wr = self._send_wr(wr_id=2, opcode=self.link.e.IBV_WR_RDMA_WRITE, num_sge=1,
                           sg=[self._sge(self.link.credit_out.buf, 8, self.link.credit_out.lkey)])
        wr.set_wr_rdma(self._peer_credit_rkey, self._peer_credit)
        self._post(wr, self.link.e.IBV_SEND_INLINE)

    # --- receiving -----------------------------------------------------------------------------------------------

    def receive(self, timeout: float | None = None) -> Record | None:
        """The next record, or None when none began within `timeout` seconds (None: wait as long as it takes).
        RecordError for a header the ring would refuse; ConnectionLost for a peer that is gone or stalls."""
        head = self.begin(timeout)
        if head is None:
            return None
        payload = bytearray(head.length)
        self.read_payload(memoryview(payload))
        return head._replace(payload=payload)

    def begin(self, timeout: float | None = None) -> Record | None:
        """The next record's header (its payload empty), or None as `receive`; its `length` payload bytes must then
        be read, in order, with `read_payload` before anything else is read."""
        if self._left:
            raise RecordError(f"the frame begun has {self._left} payload bytes left to read")
        if not self._take(None if timeout is None else time.monotonic() + timeout):
            return None
        first = self._current
        if len(first) < HEADER.size:
            raise RecordError(f"an RDMA piece of {len(first)} bytes cannot begin a record")
        fields = HEADER.unpack_from(first)
        check_header(fields, self.max_payload, self.max_payload)
        call_id, opcode, flags, length, generation, status, _reserved = fields
        if flags & Flag.STAGED:
            raise RecordError(f"record {call_id}: a stream record is never staged")
        if len(first) - HEADER.size > length:
            raise RecordError(f"record {call_id}: its first piece is longer than the record")
        self._current = first[HEADER.size:]
        self._left, self._unarrived = length, length - len(self._current)
        if not len(self._current):
            self._release()
        return Record(call_id, opcode, flags, length, generation, status, b"")

    def read_payload(self, view: memoryview) -> None:
        """Fill `view` with the next bytes of the frame begun (at most what is left of it), within `stall_s`."""
        if len(view) > self._left:
            raise RecordError(f"reading {len(view)} bytes of a frame with {self._left} left")
        deadline, got = time.monotonic() + self.stall_s, 0
        while got < len(view):
            if not len(self._current):
                if not self._take(deadline):
                    raise ConnectionLost(f"the relay peer stopped mid-record ({len(view) - got} bytes missing "
                                         f"after {self.stall_s:g} s)")
                if len(self._current) > self._unarrived:
                    raise RecordError("a piece runs past its record's end")
                self._unarrived -= len(self._current)
            n = min(len(self._current), len(view) - got)
            view[got:got + n] = self._current[:n]
            self._current = self._current[n:]
            got += n
            if not len(self._current):
                self._release()
        self._left -= len(view)

    def _take(self, deadline: float | None) -> bool:
        """Wait for the next piece (False at `deadline`) and make it the one being read (`_current`)."""
        since, armed, link = time.monotonic(), False, self.link
        while True:
            count, completions = link.recv_cq.poll(num_entries=1)
            if count:
                break
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            if link.event_fd is None or now - since < SPIN_S:
                self._nap(since, deadline, "")
            elif not armed:  # ask for an event, then poll once more: a piece may have come in between
                link.recv_cq.req_notify()
                armed = True
            elif self._sleep(link.event_fd, None if deadline is None else deadline - now):
                link.channel.get_cq_event(link.recv_cq)
                link.recv_cq.ack_events(1)
                armed = False
        wc = completions[0]
        if wc.status != self.link.e.IBV_WC_SUCCESS:
            raise self._lose(f"an RDMA receive failed (work completion status {wc.status})")
        length = wc.imm_data  # pyverbs hands the immediate through as it was given
        if not 0 < length <= self.link.piece:
            raise self._lose(f"the relay peer announced a piece of {length} bytes (at most {self.link.piece})")
        at = self._received % self.link.slots * self.link.piece
        self._current = self._inbox[at:at + length]
        self._bytes_received += length
        return True

    def _release(self) -> None:
        """The piece read is done with: its receive entry goes back, and the peer hears of it every quarter inbox."""
        self.link.repost(self._received % self.link.slots)
        self._received += 1
        if self._received - self._reported >= max(1, self.link.slots // 4):
            self._report()

    def _nap(self, since: float, deadline: float | None, stalled: str) -> None:
        """One step of a wait that began at `since`: spin for SPIN_S, then sleep on the TCP socket, a quarter of
        the time waited so far (at most NAP_MAX_S); its end, or any byte on it (nothing is sent there once RDMA
        carries the records), is the end of the connection. `stalled`: the ConnectionLost message when the
        deadline passes (empty: the caller handles its deadline)."""
        now = time.monotonic()
        if deadline is not None and now >= deadline and stalled:
            raise ConnectionLost(f"{stalled} for {self.stall_s:g} s")
        nap = 0.0 if now - since < SPIN_S else min(NAP_MAX_S, (now - since) / 4)
        if deadline is not None:
            nap = max(0.0, min(nap, deadline - now))
        self._sleep(None, nap)

    def _sleep(self, event_fd: int | None, timeout: float | None) -> bool:
        """Sleep until `event_fd` (a completion channel) is readable (True) or `timeout` passes (False). The TCP
        socket's end, or any byte on it (nothing is sent there once RDMA carries the records), is the end of the
        connection."""
        try:
            watched: list[int] = [self.sock.fileno()] if event_fd is None else [self.sock.fileno(), event_fd]
            readable, _, _ = select.select(watched, [], [], timeout)
            if watched[0] in readable:
                data = self.sock.recv(64, socket.MSG_DONTWAIT)
                raise self._lose("the relay peer closed the connection" if not data else
                                 "the relay peer wrote on the TCP connection after RDMA took over")
        except BlockingIOError:
            pass
        except (OSError, ValueError) as exc:
            raise self._lose(f"the relay connection failed: {exc}") from None
        return event_fd in readable

    def _lose(self, why: str) -> ConnectionLost:
        self._lost = self._lost or why
        return ConnectionLost(why)

    def close(self) -> None:
        self.link.close()
        with contextlib.suppress(OSError):
            self.sock.close()

