"""The relaying end of a remote session (docs/remote.md): its ring's records go to the GPU host's oriond over a
relay connection, and the answers come back to the ring.

Records are forwarded in ring order as they arrive, posted ones without waiting for anything, and each answer is
written to the completion ring when it comes, by a second thread: so a program's async launches stay pipelined,
with no round trip per launch. The relay neither decodes nor judges a CUDA record (the GPU host's worker does,
with the same ledger as a local session); it answers itself only what the ring refuses (a malformed record,
as the worker's loop does) and every call once the GPU host is gone: CUDA_ERROR_DEVICE_UNAVAILABLE, for the calls
still waiting and for every later one, within the relay connection's silence bound (StreamEndpoint: 5 s).

The one answer the relay cannot give is to a call whose reply was cut short: a long reply's record is published to
the completion ring before its bytes (which follow chunk by chunk as they arrive), so when the GPU host is lost
midway the record can be neither finished (its bytes would be wrong under the GPU host's status) nor taken back.
Then the relay ends the session (run's `ended`: the worker ends its channel with HostReason.GPU_HOST_LOST and exits),
and the guest's wait for the next chunk sees it and answers CUDA_ERROR_DEVICE_UNAVAILABLE, as every later call.
An answer the relay was not waiting for (a call id it never sent, a record that is no answer) is the GPU host
breaking the protocol, and loses it as a death does.

Large payloads are never held whole: a staged request is written to the connection chunk by chunk as it comes
off the ring's staging arena, and a long answer is read from the connection straight into the completion ring's
staging chunks (or, for a pinned DtoH, into the pool), so a copy of any size the ring carries (up to MAX_PAYLOAD)
is relayed and the guest, the connection and the GPU host work at the same time, on TCP and on RDMA alike.
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from ivshmem.channel import Endpoint, HostReason, Sink, Streamed
from ivshmem.cuda_status import DEVICE_UNAVAILABLE, INVALID_VALUE, NOT_SUPPORTED, SUCCESS
from ivshmem.driver_api import (
    CALLS,
    HOST_FUNCTION_OPCODE,
    HOST_FUNCTION_REQUEST,
    PINNED_COPY,
    POOL_MAP_OPCODE,
    POOL_MIRROR_MAP,
    POOL_MIRROR_OPCODE,
    POOL_MIRROR_READ,
    POOL_MIRROR_REPLY,
    POOL_MIRROR_REQUEST,
    POOL_MIRROR_UNMAP,
    POOL_MIRROR_WRITE,
)
from ivshmem.errors import RecordError
from ivshmem.record import HEADER, STATS_RELAYED, STATS_REPLY, Flag, Op, Record, Status

from ..handler import Reply, ReplyFailed
from ..session.pinned_pool import BOOKKEEPING_OPCODES
from . import compiled_pump, uva
from .frames import ConnectionLost, FrameWriter
from .mirror import BATCH_OPERATIONS, LAUNCHES, MEMORY_OPERATIONS, WAITS, MirrorRelay
from .pool import RELAY_MAY_ANSWER, Forward, PoolRelay
from .stream_endpoint import CHUNK, StreamEndpoint

log = logging.getLogger(__name__)
NAMES_POOL = MEMORY_OPERATIONS | BATCH_OPERATIONS  # refused where an address lies in the pool (mirror.names_pool)

CONTEXT_SYNCHRONIZE = CALLS["cuCtxSynchronize"].opcode
PINNED_DTOHS = {CALLS[name].opcode | PINNED_COPY for name in ("cuMemcpyDtoH", "cuMemcpyDtoHAsync")}  # LANDS_IN_POOL
PINNED_HTODS = {CALLS[name].opcode | PINNED_COPY for name in ("cuMemcpyHtoD", "cuMemcpyHtoDAsync")}  # SENT_FROM_POOL
STREAM_SYNCHRONIZE, DRIVER_VERSION = CALLS["cuStreamSynchronize"], CALLS["cuDriverGetVersion"]
# A host function's wait for the guest to run it: polls of the release word from 20 us, doubling to 1 ms; a call of
# the relay's own to the GPU host every second meanwhile, so that each end hears the other.
HOST_FUNCTION_FIRST_PAUSE_S, HOST_FUNCTION_MAX_PAUSE_S, HOST_FUNCTION_BEAT_S = 20e-6, 1e-3, 1.0
OWN_CALL_IDS = 1 << 63  # the relay's own calls to the GPU host count from here: a guest's never get so far
MAX_ASYNC_ERRORS_REPORTED = 64  # as the worker's loop (session_loop.RecordLoop)
# Two threads share the GIL in a relaying worker: the ring thread spins while it waits, the answers thread wakes on
# the socket. At CPython's default switch interval (5 ms) a woken answers thread can wait that long for the GIL;
# measured on the H100, every synchronous relayed call then took 1.3 ms. The worker process runs one session and
# nothing else, so it hands over far more often (its worker sets it there: switch_interval_s; never in-process).
SWITCH_INTERVAL_S = 20e-6
# While page-locked memory is mirrored, the compiled pump forwards a launch that names no pool memory itself when the
# CPU changed none of the mirrored bytes, which it compares before each launch: at most this many (relay/mirror.py).
MIRROR_COMPARED_BYTES = 1 << 20


def _raise(failed: ReplyFailed) -> NoReturn:
    raise failed


class Relay:
    """One relayed session: `ring` is the host side of its channel, `remote` its relay connection."""

    switch_interval_s = SWITCH_INTERVAL_S  # session_loop.RelayedSession: what its worker process sets

    def __init__(self, ring: Endpoint, remote: StreamEndpoint | None, session: int, lost: str | None = None,
                 pool: PoolRelay | None = None) -> None:
        """`remote` None: the GPU host could not be reached at all (`lost` says why), and every call of the
        session answers CUDA_ERROR_DEVICE_UNAVAILABLE. `pool`: the session's page-locked pool (relay/pool.py)."""
        self.ring, self.remote, self.session, self.pool = ring, remote, session, pool
        self.lost: str | None = lost if remote is not None else lost or "no relay connection"
        self._pending: dict[int, int] = {}  # call id sent and still waiting for its answer -> the guest's flags
        self._lock = threading.Lock()  # the completion ring has two writers: answers and the relay's own
        self._async_errors = 0
        self._answers = threading.Thread(target=self._carry_answers, name=f"relay-{session}", daemon=True)
        self._staged: _StagedForward | None = None  # the staged request being forwarded as it comes off the ring
        self._pump: Any = None  # the compiled pump (compiled_pump.start), while it runs the session
        self._own_ids = itertools.count(OWN_CALL_IDS)  # the relay's own calls (_ask)
        self._own: dict[int, queue.Queue[Record]] = {}  # those the answers thread hands over
        # kernels given page-locked memory: its mirror on the GPU host (relay/mirror.py)
        self.mirror = MirrorRelay(pool.pool) if pool is not None and pool.pool is not None else None
        self._table = self._pumped = b""  # the pump's forwarding table, and it while nothing is mirrored (_start_pump)
        self._said_memory_operation = False
        # opcode -> [ring records this side served in Python, nanoseconds]; None until the guest asks STATS (_stats)
        self._answered: dict[int, list[int]] | None = None
        # What ends the session when a reply was cut short, from whichever thread found it (run's `ended`)
        self._cut_short: Callable[[ReplyFailed], NoReturn] = _raise

    def run(self, first: Record | None = None, ended: Callable[[ReplyFailed], NoReturn] | None = None) -> None:
        """Forward the ring's records, `first` (already read) first, until the ring ends the session (its errors
        end it, as a worker's): through the compiled pump where it can be had, else with the answers thread.
        `ended`: how the session ends when a reply was cut short (a worker ends its channel and exits); by default
        the ReplyFailed is raised."""
        if ended is not None:
            self._cut_short = ended
        self._pump = self._start_pump()
        if self._pump is None and self.remote is not None:
            self.remote.spin = False  # two threads share the GIL here: the answers thread sleeps on the connection
            self._answers.start()
        if first is not None:
            self._forward(first)
        if self._pump is not None and self.remote is not None:
            self._run_pump(self._pump, self.remote)
        while True:
            self._forward_next()

    def _start_pump(self) -> Any:
        """The compiled pump for this session's ring and FrameStream, told which opcodes it forwards as they are
        (all but the pool's, which the relay answers or rewrites); None where it cannot be had."""
        remote = self.remote
        if remote is None or self.lost is not None:
            return None
        pump = compiled_pump.start(self.ring, remote.frames, remote.generation)
        if pump is None:  # RDMA, or no compiled pump here: the Python path
            return None
        table = bytearray(b"\x01" * 0x10000)
        table[HOST_FUNCTION_OPCODE] = 0  # the relay's own to serve
        table[Op.STATS] = 0  # (_stats)
        if self.pool is not None:
            for opcode in range(0x10000):
                if opcode & PINNED_COPY or opcode in BOOKKEEPING_OPCODES or opcode in RELAY_MAY_ANSWER \
                        or opcode in BATCH_OPERATIONS:  # (a batch's addresses: Python's to read)
                    table[opcode] = 0
            for opcode, how in uva.DEVICE_SIDES.items():  # Python's when a device side is pool memory
                table[opcode] = how
            for opcode in LAUNCHES | MEMORY_OPERATIONS:  # Python's when a parameter names pool memory
                table[opcode] = 4
            for opcode in PINNED_DTOHS:  # a slot at most: landing in C (pool.py)
                table[opcode] = compiled_pump.LANDS_IN_POOL
            for opcode in PINNED_HTODS:  # a slot at most, while nothing lands in the pool (_pool_written)
                table[opcode] = compiled_pump.SENT_FROM_POOL
        self._table = self._pumped = bytes(table)  # (_pumped: the table while nothing is mirrored)
        pump.set_forward(self._table)
        return pump

    def _mirrors_changed(self, mirror: MirrorRelay) -> None:
        """What is mirrored changed (an allocation adopted or forgotten). While anything is, every wait is the
        relay's (the GPU's writes are pulled after it), and every page-locked copy: landings the mirror's barrier
        must see (_push), bytes a kernel may have written (_pool_written). A launch the pump still forwards while
        the CPU has changed no mirrored byte (it compares them with what both sides last agreed: at most
        MIRROR_COMPARED_BYTES, beyond which every launch is the relay's too)."""
        if self._pump is None:
            return
        mirrored = [(mirror.pool.host_base + offset, agreed) for offset, agreed in mirror.agreed.items()]
        compared = sum(len(agreed) for _, agreed in mirrored) <= MIRROR_COMPARED_BYTES
        self._pump.set_mirrored(mirrored if compared else [])
        table = bytearray(self._table)
        for opcode in WAITS | PINNED_DTOHS | PINNED_HTODS:
            table[opcode] = 0 if mirrored else self._pumped[opcode]
        for opcode in LAUNCHES:
            table[opcode] = self._pumped[opcode] if compared else 0
        self._table = bytes(table)
        self._pump.set_forward(self._table)

    def _run_pump(self, pump: Any, remote: StreamEndpoint) -> None:
        """Serve the session through `pump` until the GPU host is lost; what it hands back is done here."""
        ring = self.ring
        while self.lost is None:
            code = pump.pump()
            ring.in_ring.resync()  # the pump moved the indices the ring endpoint keeps copies of
            ring.out_ring.resync()
            try:
                if code == compiled_pump.PUMP_RING:
                    self._forward_next()
                elif code == compiled_pump.PUMP_SOCKET:
                    answer = remote.next(wait=False)
                    if answer is not None:
                        self._deliver(remote, answer, self._taken(answer.call_id))  # None: not waited for
                elif code == compiled_pump.PUMP_CHECK:
                    remote.heard(pump.heard)
                    remote.check()
                    if ring.check is not None:
                        ring.check()
                else:
                    self._lose(f"sending to the relay peer failed: {pump.lost}")
            except (ConnectionLost, RecordError) as exc:
                self._lose(str(exc))
        pump.close()

    def _forward_next(self) -> None:
        """Read the ring's next record and forward it (a staged one while it is read), counted once the guest
        asked STATS."""
        if self._answered is None:
            self._forward_one()
            return
        started = time.perf_counter_ns()
        opcode = self._forward_one()
        if opcode is not None and opcode != Op.STATS:
            counted = self._answered.setdefault(opcode, [0, 0])
            counted[0] += 1
            counted[1] += time.perf_counter_ns() - started

    def _forward_one(self) -> int | None:
        """_forward_next's work: the opcode of the record forwarded (None: none, one the ring refused)."""
        ring = self.ring
        offset = ring.in_ring.readable()
        if offset is None:
            offset = ring._wait(ring.in_ring.readable, f"a record on the {ring.in_ring.name}")
        flags = HEADER.unpack_from(ring.buf, offset)[2]  # a staged record's, needed before its payload is read
        try:
            record = ring.receive(sink_for=lambda call_id, opcode, length: self._stream(call_id, opcode, flags,
                                                                                          length))
        except RecordError as exc:  # answered here, as the worker's loop answers it; the session goes on
            self._answer(getattr(exc, "call_id", 0), getattr(exc, "flags", 0), exc.status, str(exc).encode())
            return None
        finally:
            staged, self._staged = self._staged, None
            if staged is not None:
                staged.finish(self)
        if staged is not None:
            return staged.opcode
        if record is not None:
            self._forward(record)
            return record.opcode
        return None

    def _stream(self, call_id: int, opcode: int, flags: int, length: int) -> Sink | None:
        """The sink a staged request's chunks go to: the relay connection, as they come (None: a record the relay
        reads whole, one of the pool's)."""
        if self.pool is not None and (opcode in BOOKKEEPING_OPCODES or opcode & PINNED_COPY):
            return None
        self._staged = _StagedForward(self, call_id, opcode, flags, length)
        return self._staged.sink

    def _forward(self, record: Record) -> None:
        opcode, flags, payload = record.opcode, record.flags & Flag.NO_REPLY, record.payload
        if opcode == HOST_FUNCTION_OPCODE:
            self._host_function(record)
            return
        if opcode == Op.STATS and self._stats(record):
            return
        tail = None
        mirror = self.mirror
        if mirror is not None and not opcode & PINNED_COPY:
            if opcode in NAMES_POOL and mirror.names_pool(record):
                self._refuse_memory_operation(record)
                return
            if opcode in LAUNCHES:
                rewritten = self._before_launch(mirror, record)
                if isinstance(rewritten, Reply):
                    self._answer(record.call_id, record.flags, rewritten.status, b"")
                    return
                payload = rewritten or payload
            elif opcode in WAITS and mirror.active:
                self._wait_mirrored(mirror, record)
                return
        if self.pool is not None and opcode & PINNED_COPY:
            source = self.pool.read_from(record)
            if source is not None:
                self._pool_written([source])
        if self.pool is not None:
            own = self.pool.answer(record)
            if own is None:
                plain = self._on_pool(record)
                if plain is None:
                    plain = self.pool.rewrite(record)
                if isinstance(plain, Forward):
                    opcode, flags, payload, tail = plain
                else:
                    own = plain
            elif record.opcode == POOL_MAP_OPCODE and own.status == SUCCESS and self._pump is not None \
                    and self.pool is not None and self.pool.pool is not None:
                pool = self.pool.pool
                self._pump.set_pool(pool.guest_base, pool.size)
                # (its pages mapped at the guest's address: another mapping than the region's)
                self._pump.set_landing(pool.host_address, PINNED_COPY, pool.host_base, pool.size)
            if own is not None:
                self._answer(record.call_id, record.flags, own.status, bytes(own.payload))  # type: ignore[arg-type]
                return
        if not self._expect(record.call_id, record.flags):
            return
        try:
            if tail is None:
                self.remote.send(record.call_id, opcode, flags, payload)  # type: ignore[union-attr]
            else:
                self._send_pieces(record.call_id, opcode, flags, payload, tail)
        except ConnectionLost as exc:
            self._lose(str(exc))

    def _on_pool(self, record: Record) -> Reply | Forward | None:
        """A copy or memset whose device side is page-locked memory (uva.py): the guest's answer when it is
        done here (or refused), the plain copy to send instead, or None when the GPU host serves it as it is."""
        pool = None if self.pool is None else self.pool.pool
        if pool is None or not pool.allocations:
            return None
        plan = uva.plan_for(pool, record)
        if not isinstance(plan, uva.Plan):
            return plan
        self._pool_written(plan.probes)
        for pointer in plan.probes:
            status = self._probe(pointer)
            if status == SUCCESS:  # the GPU host's own memory too: whose bytes the program meant is unknowable
                log.warning("session %d: address %#x is page-locked memory here and device memory on the GPU host; "
                            "its copy answers CUDA_ERROR_INVALID_VALUE", self.session, pointer)
                return Reply(INVALID_VALUE)
            if status == DEVICE_UNAVAILABLE:
                return Reply(DEVICE_UNAVAILABLE)
        if plan.forward is not None:
            if plan.landing is not None:
                self.pool.landing[record.call_id] = plan.landing  # type: ignore[union-attr]
            return plan.forward
        return plan.run()  # type: ignore[misc]

    # --- kernels given page-locked memory (relay/mirror.py) --------------------------------------------------
    def _before_launch(self, mirror: MirrorRelay, record: Record) -> bytes | Reply | None:
        """Mirror on the GPU host what the launch names of the pool, and bring every mirror up to the pool; the
        launch's payload rewritten where a mirror lies elsewhere than the guest's pointer (None: as it is), or the
        Reply that refuses it (_ambiguous)."""
        forgotten = mirror.forget_freed()
        for where in forgotten:
            self._mirror_call(POOL_MIRROR_UNMAP, where, 0)
        named = mirror.scan(record)
        adopted: set[int] = set()
        for offset in [] if mirror.unavailable else mirror.unmirrored(named):
            address, size = mirror.extent(offset)
            answer = self._ask(POOL_MIRROR_OPCODE, POOL_MIRROR_REQUEST.encode(POOL_MIRROR_MAP, address, size, b""))
            if answer is None:
                return None  # the GPU host is gone: the launch answers that
            if answer.status == SUCCESS:
                mirror.adopt(offset, POOL_MIRROR_REPLY.decode(answer.payload)[0])
                adopted.add(offset)
                log.info("session %d: a launch (function %#x) names page-locked memory %#x+%#x (parameter bytes %s): "
                         "mirrored on the GPU host at %#x; waits go through the relay's Python from now",
                         self.session, int.from_bytes(bytes(record.payload[:8]), "little"), address, size,
                         [at for at, named_offset in named if named_offset == offset], mirror.where[offset])
            else:
                mirror.unavailable = True
                log.warning("session %d: the GPU host cannot mirror page-locked memory %#x+%#x (CUresult %d): "
                            "kernels given it fail there", self.session, address, size, answer.status)
        if mirror.active:
            self._push(mirror, adopted)
        if adopted or forgotten:
            self._mirrors_changed(mirror)  # (after the push: what is agreed now)
        refused = self._ambiguous(record, mirror.elsewhere(named))
        return refused or mirror.translate(record.payload, named)

    def _ambiguous(self, record: Record, moved: list[tuple[int, int]]) -> Reply | None:
        """A word the launch would have rewritten to a mirror placed elsewhere is asked of the GPU host first (at
        every launch: the GPU host may allocate there at any time, since its own mapping took the address): where it
        is the GPU host's own memory too, whose bytes the program meant is unknowable, and the launch answers
        CUDA_ERROR_INVALID_VALUE, as a copy naming such an address does (relay/uva.py), never a kernel given the
        wrong memory. None: the rewrite may go ahead."""
        for pointer in sorted({int.from_bytes(bytes(record.payload[at:at + 8]), "little") for at, _ in moved}):
            status = self._probe(pointer)
            if status == DEVICE_UNAVAILABLE:
                return Reply(DEVICE_UNAVAILABLE)
            if status == SUCCESS:
                log.warning("session %d: launch parameter %#x is page-locked memory here, mirrored elsewhere on the "
                            "GPU host, and the GPU host's own memory there: the launch answers "
                            "CUDA_ERROR_INVALID_VALUE", self.session, pointer)
                return Reply(INVALID_VALUE)
        return None

    def _refuse_memory_operation(self, record: Record) -> None:
        """A stream memory operation on page-locked memory: its words would have to follow the other side's writes
        while the stream waits, which a mirror coherent at launches and waits cannot give: CUDA_ERROR_NOT_SUPPORTED,
        named once, never a wait that does not end. (The native driver's first cuLaunchHostFunc asks with one, and
        then sends its functions as HOST_FUNCTION: _host_function.)"""
        if not self._said_memory_operation:
            self._said_memory_operation = True
            log.info("session %d: stream memory operations on page-locked memory answer CUDA_ERROR_NOT_SUPPORTED on "
                     "a relayed session (host functions are served by the relay instead)", self.session)
        self._answer(record.call_id, record.flags, NOT_SUPPORTED, b"")

    def _await_landings(self) -> None:
        """Every copy into the pool on its way has landed: one of Python's (pool.landing) or a page-locked DtoH the
        pump sent. A call of the relay's own, answered after them, where any is."""
        if (self.pool is not None and self.pool.landing) or (self._pump is not None and self._pump.landing):
            self._ask(Op.NOP, b"")

    def _push(self, mirror: MirrorRelay, adopted: set[int] | None = None) -> None:
        """Write what the guest's CPU changed in mirrored memory to the mirror, after every copy into the pool
        that is on its way has landed."""
        self._await_landings()
        for address, data in mirror.changes(adopted):
            self._mirror_call(POOL_MIRROR_WRITE, address, len(data), data)

    def _pull(self, mirror: MirrorRelay) -> None:
        """Bring what the GPU wrote in the mirror into the pool."""
        for offset, agreed in list(mirror.agreed.items()):
            answer = self._ask(POOL_MIRROR_OPCODE, POOL_MIRROR_REQUEST.encode(POOL_MIRROR_READ, mirror.where[offset],
                                                                              len(agreed), b""))
            if answer is not None and answer.status == SUCCESS:
                mirror.merge(offset, bytes(answer.payload))

    def _wait_mirrored(self, mirror: MirrorRelay, record: Record) -> None:
        """A call that waits for the GPU while memory is mirrored: the mirror brought up to the pool first (a
        kernel may spin on what the CPU wrote), the call made as the relay's own, the GPU's writes pulled into the
        pool, and only then the guest answered."""
        self._push(mirror)
        answer = self._ask(record.opcode, bytes(record.payload))
        if answer is None:
            self._answer(record.call_id, record.flags, DEVICE_UNAVAILABLE, b"")
            return
        self._pull(mirror)
        self._answer(record.call_id, record.flags, answer.status, bytes(answer.payload))

    def _pool_written(self, pointers: Iterable[int]) -> None:
        """Before a copy reads page-locked memory at `pointers`: what was written there before it, in stream order,
        is in the pool. A kernel's writes to a mirrored allocation (the mirror settled), and every copy into the pool
        on its way (landed; the settling's push waits for them too)."""
        mirror = self.mirror
        if mirror is not None and mirror.active and any(
                mirror.pool.allocation_of(pointer) in mirror.agreed for pointer in pointers):
            self._settle_mirror(mirror)
        else:
            self._await_landings()

    def _settle_mirror(self, mirror: MirrorRelay) -> None:
        """Every kernel done and its writes in the pool (a copy is about to use mirrored memory as device memory)."""
        self._push(mirror)
        self._ask(CONTEXT_SYNCHRONIZE, b"")
        self._pull(mirror)

    def _mirror_call(self, op: int, address: int, size: int, data: bytes = b"") -> int:
        answer = self._ask(POOL_MIRROR_OPCODE, POOL_MIRROR_REQUEST.encode(op, address, size, data))
        return DEVICE_UNAVAILABLE if answer is None else answer.status

    # --- host functions on a relayed session (relay/mirror.py's module text; docs/remote.md) -------------------
    def _host_function(self, record: Record) -> None:
        """HOST_FUNCTION, the native driver's cuLaunchHostFunc on a relayed session: when the stream's earlier work
        is done (a synchronisation of it, the relay's own call), the slot's `reached` word in the pool gets `seq`,
        so that the guest's watcher runs the function; the relay forwards nothing more until the function has
        returned (its `release` word reaches `seq`), so no later work of the session, on that stream or any
        other, starts before it, as CUDA requires of that stream's."""
        try:
            stream, reached, release, seq, _ = HOST_FUNCTION_REQUEST.decode(record.payload)
        except RecordError as exc:
            self._answer(record.call_id, record.flags, Status.MALFORMED, str(exc).encode())
            return
        pool = None if self.pool is None else self.pool.pool
        words = None if pool is None else (pool.host_address(reached, 4), pool.host_address(release, 4))
        if words is None or None in words:
            self._answer(record.call_id, record.flags, INVALID_VALUE, b"")
            return
        answer = self._ask(STREAM_SYNCHRONIZE.opcode, STREAM_SYNCHRONIZE.request.encode(stream))
        if answer is None or answer.status != SUCCESS:
            self._answer(record.call_id, record.flags, DEVICE_UNAVAILABLE if answer is None else answer.status, b"")
            return
        ctypes.c_uint32.from_address(words[0]).value = seq  # type: ignore[arg-type]
        released = ctypes.c_uint32.from_address(words[1])  # type: ignore[arg-type]
        pause, beat = HOST_FUNCTION_FIRST_PAUSE_S, time.monotonic() + HOST_FUNCTION_BEAT_S
        while (released.value - seq) & 0xFFFFFFFF >= 0x80000000:  # not yet: cyclically below seq
            if self.ring.check is not None:
                self.ring.check()  # the guest gone ends the session (and this wait)
            if time.monotonic() > beat:  # the GPU host hears from this end, and this end from it
                if self._ask(DRIVER_VERSION.opcode, b"") is None:
                    return
                beat = time.monotonic() + HOST_FUNCTION_BEAT_S
            time.sleep(pause)
            pause = min(pause * 2, HOST_FUNCTION_MAX_PAUSE_S)

    def _stats(self, record: Record) -> bool:
        """The wire's STATS (ORION_STATS): this side counts from the first on, the pump's records and Python's. A
        posted one goes on to the GPU host, which counts from then on too (False: forward it). A waited-for one is
        answered here (True): the GPU host's rows, then this side's, each opcode with STATS_RELAYED set."""
        if self._answered is None:
            self._answered = {}
        pumped = self._pump.count() if self._pump is not None else {}
        if record.flags & Flag.NO_REPLY:
            return False
        answer = self._ask(Op.STATS, b"")
        if answer is None or answer.status != Status.OK:
            status = DEVICE_UNAVAILABLE if answer is None else answer.status
            self._answer(record.call_id, record.flags, status, b"" if answer is None else bytes(answer.payload))
            return True
        try:
            (rows,) = STATS_REPLY.decode(answer.payload)
        except RecordError as exc:
            self._answer(record.call_id, record.flags, Status.MALFORMED, str(exc).encode())
            return True
        python = self._answered
        rows += [(opcode | STATS_RELAYED, pumped.get(opcode, 0), *python.get(opcode, (0, 0)), 0, 0)
                 for opcode in sorted(set(pumped) | set(python))]
        self._answer(record.call_id, record.flags, Status.OK, STATS_REPLY.encode(rows))
        return True

    def _probe(self, pointer: int) -> int:
        """The GPU host's status for a pointer attribute of `pointer` (SUCCESS: its own memory), asked after every
        earlier call of the session; DEVICE_UNAVAILABLE when the GPU host is gone."""
        answer = self._ask(uva.PROBE.opcode, uva.PROBE.request.encode(uva.MEMORY_TYPE, pointer))
        return DEVICE_UNAVAILABLE if answer is None else answer.status

    def _ask(self, opcode: int, payload: bytes) -> Record | None:
        """A call of the relay's own to the GPU host (a call id no guest uses) and its answer, every answer before
        it delivered meanwhile; None when the GPU host is (or becomes) gone."""
        call_id = next(self._own_ids)
        remote = self.remote
        box: queue.Queue[Record] = queue.Queue(1)
        with self._lock:
            if self.lost is not None or remote is None:
                return None
            if self._pump is None:
                self._own[call_id] = box  # the answers thread hands it over
        try:
            remote.send(call_id, opcode, 0, payload)
            if self._pump is None:
                while self.lost is None:
                    with contextlib.suppress(queue.Empty):
                        return box.get(timeout=remote.beat_s)
                return None
            while True:  # this thread reads the connection while the pump waits
                answer = remote.next()
                if answer is None:
                    continue
                if answer.call_id == call_id:
                    return self._whole(remote, answer)
                self._deliver(remote, answer, self._taken(answer.call_id))
        except (ConnectionLost, RecordError) as exc:
            self._lose(str(exc))
            return None
        finally:
            self._own.pop(call_id, None)

    @staticmethod
    def _whole(remote: StreamEndpoint, answer: Record) -> Record:
        payload = bytearray(answer.length)
        remote.frames.read_payload(memoryview(payload))
        return answer._replace(payload=payload)

    def _taken(self, call_id: int) -> int | None:
        """The guest's flags of a call the pump waited for, forgotten there, its answer Python's to deliver (None:
        nobody waits for it). A page-locked DtoH the pump sent itself lands its bytes where the pump would have
        (pool.landing), so an answer Python reads for it (a full completion ring, one read while the relay asks the
        GPU host something of its own) lands as well."""
        taken = self._pump.take(call_id)
        if taken is None:
            return None
        flags, land_at, land_size = taken
        if land_size and self.pool is not None:
            self.pool.landing[call_id] = (land_at, land_size)
        return int(flags)

    def _expect(self, call_id: int, flags: int) -> bool:
        """Note a record about to be sent as waiting for its answer; False (and the record answered
        DEVICE_UNAVAILABLE) when the GPU host is gone. A pinned DtoH is always answered (its bytes come back in the
        answer), posted by the guest or not: it waits too, with the guest's flags, so that its bytes land in the
        pool and the guest hears only what it asked for (a posted one: nothing, or its error)."""
        with self._lock:
            lost = self.lost
            landing = self.pool is not None and call_id in self.pool.landing
            if lost is None and (landing or not flags & Flag.NO_REPLY):
                if self._pump is None:
                    self._pending[call_id] = flags
                else:  # the pump keeps them; a pinned DtoH's answer it leaves to Python (its bytes go to the pool)
                    self._pump.expect(call_id, flags, landing)
        if lost is not None or self.remote is None:
            self._answer(call_id, flags, DEVICE_UNAVAILABLE, b"")
            return False
        return True

    def _send_pieces(self, call_id: int, opcode: int, flags: int, head: bytes | bytearray, tail: memoryview) -> None:
        remote = self.remote
        if remote is None:
            return
        writer = remote.frames.open_frame(call_id, opcode, len(head) + len(tail), flags, 0, remote.generation)
        try:
            writer.write(head)
            writer.write(tail)
        finally:
            writer.close()

    def _carry_answers(self) -> None:
        if self.remote is None:
            return
        remote = self.remote
        try:
            while True:
                answer = remote.next()
                if answer is None:
                    continue
                with self._lock:
                    guest_flags = self._pending.pop(answer.call_id, None)
                    box = self._own.pop(answer.call_id, None)
                if box is not None:  # the answer to a call of the relay's own (_ask)
                    box.put(self._whole(remote, answer))
                    continue
                self._deliver(remote, answer, guest_flags)
        except (ConnectionLost, RecordError) as exc:
            self._lose(str(exc))

    def _deliver(self, remote: StreamEndpoint, answer: Record, guest_flags: int | None) -> None:
        """Write one answer to the completion ring (a pinned DtoH's bytes into the pool first); its payload is still
        on the connection and is read straight to where it goes. `guest_flags`: the flags the guest sent the call
        with, None for a call nobody waits for (only a posted call's asynchronous error may answer one). The
        connection lost while the payload is read: the call answers DEVICE_UNAVAILABLE (and ConnectionLost goes on
        to the caller, which loses the GPU host), or, once a long answer's record is out, the session ends."""
        if answer.opcode != 0 or (guest_flags is None and not answer.flags & Flag.ASYNC_ERROR):
            raise RecordError(f"the GPU host sent record {answer.call_id} (opcode {answer.opcode:#x}), which answers "
                              "no call of this session")
        flags = Flag.NO_REPLY if guest_flags is None else guest_flags  # (an asynchronous error's call was posted)
        landing = None if self.pool is None else self.pool.landing_for(answer.call_id, answer.status, answer.length)
        try:
            if landing is not None:  # the bytes are the pool's
                self._read_into(remote, landing, answer.length)
                self._answer(answer.call_id, flags, answer.status, b"")
                return
            if answer.length <= self.ring.capacity:
                payload = self._whole(remote, answer).payload
                with self._lock:
                    self.ring.send(answer.call_id, 0, answer.flags & Flag.ASYNC_ERROR, payload, answer.status)
                return
        except (ConnectionLost, RecordError):
            self._answer(answer.call_id, flags, DEVICE_UNAVAILABLE, b"")
            raise
        try:  # read from the connection into the ring's staging chunks, the record published first
            with self._lock:
                self.ring.send(answer.call_id, 0, answer.flags & Flag.ASYNC_ERROR,
                               Streamed(answer.length, remote.frames.read_payload), answer.status)
        except (ConnectionLost, RecordError) as exc:
            self._cut_short(ReplyFailed(f"the GPU host was lost in the middle of the {answer.length}-byte answer to "
                                       f"call {answer.call_id} ({exc})", HostReason.GPU_HOST_LOST))

    @staticmethod
    def _read_into(remote: StreamEndpoint, landing: memoryview, length: int) -> None:
        """Read an answer's `length` payload bytes into `landing` (all of it, or none when it is empty)."""
        if len(landing):
            remote.frames.read_payload(landing)
            return
        scratch = memoryview(bytearray(min(length, CHUNK)))
        for start in range(0, length, CHUNK):
            remote.frames.read_payload(scratch[:min(CHUNK, length - start)])

    def _lose(self, why: str) -> None:
        """The GPU host is gone: every call still waiting answers DEVICE_UNAVAILABLE now, every later one at once."""
        with self._lock:
            if self.lost is not None:
                return
            self.lost = why
            waiting, self._pending = sorted(self._pending.items()), {}
            if self._pump is not None:
                waiting = sorted(self._pump.take_pending())
        log.warning("session %d: the GPU host is gone (%s); its calls answer CUDA_ERROR_DEVICE_UNAVAILABLE",
                    self.session, why)
        for call_id, flags in waiting:
            self._answer(call_id, flags, DEVICE_UNAVAILABLE, b"")

    def _answer(self, call_id: int, flags: int, status: int, payload: bytes | bytearray) -> None:
        """The relay's own answer to a record: a reply, or for a posted record one of the session's first
        MAX_ASYNC_ERRORS_REPORTED asynchronous errors."""
        if flags & Flag.NO_REPLY:
            if status == 0:
                return  # a posted call that succeeded: nothing to say
            self._async_errors += 1
            if self._async_errors > MAX_ASYNC_ERRORS_REPORTED:
                return
        with self._lock:
            self.ring.send(call_id, 0, Flag.ASYNC_ERROR if flags & Flag.NO_REPLY else 0, payload, status)


class _StagedForward:
    """A staged request forwarded while the ring reads it: its frame is written chunk by chunk (the connection lost
    midway: the rest of the chunks are read and dropped, so the ring stays in step)."""

    def __init__(self, relay: Relay, call_id: int, opcode: int, flags: int, length: int) -> None:
        self.opcode, self.length = opcode, length
        self.writer: FrameWriter | None = None
        self.lost: str | None = None
        self.sent = 0
        remote = relay.remote
        if not relay._expect(call_id, flags):
            return  # answered already: the chunks are dropped
        try:
            if remote is not None:
                self.writer = remote.frames.open_frame(call_id, opcode, length, flags & Flag.NO_REPLY, 0,
                                                       remote.generation)
        except ConnectionLost as exc:
            self.lost = str(exc)

    def sink(self, chunk: memoryview) -> None:
        if self.writer is not None and self.lost is None:
            try:
                self.writer.write(chunk)
            except ConnectionLost as exc:
                self.lost = str(exc)
        self.sent += len(chunk)

    def finish(self, relay: Relay) -> None:
        """The ring is done with the record (whole, or it failed midway): end the frame."""
        if self.writer is not None:
            self.writer.close()  # short (the ring failed midway): the connection is closed with it
        if self.lost is not None or (self.writer is not None and self.sent != self.length):
            relay._lose(self.lost or "a staged request stopped midway")
