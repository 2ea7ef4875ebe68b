"""The relaying end of a remote session (docs/remote.md): its ring's records go to the GPU host's oriond over a
relay connection, and the answers come back to the ring.

Records are forwarded in ring order as they arrive, posted ones without waiting for anything, and each answer is
written to the completion ring when it comes, by a second thread: so a program's async launches stay pipelined,
with no round trip per launch. The relay neither decodes nor judges a CUDA record (the GPU host's worker does,
with the same ledger as a local session); it answers itself only what the ring refuses (a malformed record,
as the worker's loop does) and every call once the GPU host is gone: CUDA_ERROR_DEVICE_UNAVAILABLE, for the calls
still waiting and for every later one, within the relay connection's silence bound (StreamEndpoint: 5 s).
"""
from __future__ import annotations

import logging
import threading

from ivshmem.channel import Endpoint
from ivshmem.errors import RecordError
from ivshmem.record import Flag, Record

from .relay_frames import ConnectionLost
from .relay_pool import Forward, PoolRelay
from .stream_endpoint import StreamEndpoint

log = logging.getLogger(__name__)

DEVICE_UNAVAILABLE = 46  # CUDA_ERROR_DEVICE_UNAVAILABLE: a session whose GPU host is gone
MAX_ASYNC_ERRORS_REPORTED = 64  # as the worker's loop (region_server.RecordLoop)
# Two threads share the GIL in a relaying worker: the ring thread spins while it waits, the answers thread wakes on
# the socket. At CPython's default switch interval (5 ms) a woken answers thread can wait that long for the GIL;
# measured on the H100, every synchronous relayed call then took 1.3 ms. The worker process runs one session and
# nothing else, so it hands over far more often (region_server.serve_session sets it there, never in-process).
SWITCH_INTERVAL_S = 20e-6


class Relay:
    """One relayed session: `ring` is the host side of its channel, `remote` its relay connection."""

    def __init__(self, ring: Endpoint, remote: StreamEndpoint | None, session: int, lost: str | None = None,
                 pool: PoolRelay | None = None) -> None:
        """`remote` None: the GPU host could not be reached at all (`lost` says why), and every call of the
        session answers CUDA_ERROR_DEVICE_UNAVAILABLE. `pool`: the session's page-locked pool (relay_pool.py)."""
        self.ring, self.remote, self.session, self.pool = ring, remote, session, pool
        self.lost: str | None = lost if remote is not None else lost or "no relay connection"
        self._pending: dict[int, int] = {}  # call id sent and still waiting for its answer -> the guest's flags
        self._lock = threading.Lock()  # the completion ring has two writers: answers and the relay's own
        self._async_errors = 0
        self._answers = threading.Thread(target=self._carry_answers, name=f"relay-{session}", daemon=True)

    def run(self, first: Record | None = None) -> None:
        """Forward the ring's records, `first` (already read) first, until the ring ends the session (its errors
        end it, as a worker's)."""
        if self.remote is not None:
            self._answers.start()
        record = first
        while True:
            if record is None:
                try:
                    record = self.ring.receive()
                except RecordError as exc:  # answered here, as the worker's loop answers it; the session goes on
                    self._answer(getattr(exc, "call_id", 0), getattr(exc, "flags", 0), exc.status,
                                 str(exc).encode())
                    continue
                if record is None:
                    continue
            self._forward(record)
            record = None

    def _forward(self, record: Record) -> None:
        opcode, flags, payload = record.opcode, record.flags & Flag.NO_REPLY, record.payload
        if self.pool is not None:
            own = self.pool.answer(record)
            if own is None:
                plain = self.pool.rewrite(record)
                if isinstance(plain, Forward):
                    opcode, flags, payload = plain
                else:
                    own = plain
            if own is not None:
                self._answer(record.call_id, record.flags, own.status, bytes(own.payload))  # type: ignore[arg-type]
                return
        with self._lock:
            lost = self.lost
            if lost is None and not flags & Flag.NO_REPLY:
                self._pending[record.call_id] = record.flags
        if lost is not None or self.remote is None:
            self._answer(record.call_id, record.flags, DEVICE_UNAVAILABLE, b"")
            return
        try:
            self.remote.send(record.call_id, opcode, flags, payload)
        except ConnectionLost as exc:
            self._lose(str(exc))

    def _carry_answers(self) -> None:
        if self.remote is None:
            return
        try:
            while True:
                answer = self.remote.receive()
                if answer is None:
                    continue
                with self._lock:
                    guest_flags = self._pending.pop(answer.call_id, 0)
                if self.pool is not None and self.pool.land(answer.call_id, answer.status, answer.payload):
                    self._answer(answer.call_id, guest_flags, answer.status, b"")  # the bytes are in the pool
                    continue
                with self._lock:
                    self.ring.send(answer.call_id, 0, answer.flags & Flag.ASYNC_ERROR, answer.payload, answer.status)
        except (ConnectionLost, RecordError) as exc:
            self._lose(str(exc))

    def _lose(self, why: str) -> None:
        """The GPU host is gone: every call still waiting answers DEVICE_UNAVAILABLE now, every later one at once."""
        with self._lock:
            if self.lost is not None:
                return
            self.lost = why
            waiting, self._pending = sorted(self._pending.items()), {}
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
