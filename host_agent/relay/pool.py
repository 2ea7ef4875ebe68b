"""A relayed session's page-locked pool (docs/remote.md, "What cannot be relayed byte for byte").

A guest's cuMemAllocHost memory is its channel's slice of the region's pool, on the relaying host; the GPU host
cannot DMA into it. So the relay keeps the pool's bookkeeping itself and answers the pool's calls as a local
worker does (the same HostPool and pinned_pool.answer_bookkeeping, never registered with a driver), and turns
copies to and from pool memory into the plain copies the GPU host serves for any guest memory:
- a pinned HtoD sends the pool's bytes as a plain cuMemcpyHtoD(Async) request;
- a pinned DtoH asks for the bytes with a plain cuMemcpyDtoH(Async) request, which is answered (even when the
  guest posted it) and whose answer the relay writes into the pool before the session's next answer is delivered:
  the GPU host answers in order, so a later cuStreamSynchronize returns only after the bytes are in place.
A device pointer of pool memory is its own address, as natively under unified addressing (cuMemHostGetDevicePointer
and the DEVICE_POINTER attribute answer it): a kernel given it reaches the allocation's mirror on the GPU host
(relay/mirror.py), and a copy naming it as device memory the relay serves on the pool (relay/uva.py). The GPU
host knows nothing of pool memory, so the relay answers cuPointerGetAttribute of a pool pointer itself: what is
certain of page-locked host memory (its memory type is host, its host and device pointers are itself, it is not
managed), and CUDA_ERROR_NOT_SUPPORTED, named once, for what only the driver that mapped it could say (its
context, buffer id...).
"""
from __future__ import annotations

import ctypes
import logging
from typing import NamedTuple

from ivshmem.cuda_status import INVALID_VALUE, NOT_SUPPORTED, SUCCESS
from ivshmem.driver_api import BY_OPCODE, CALLS, PINNED_COPY, POINTER_ATTRIBUTE_WIDTHS
from ivshmem.errors import RecordError
from ivshmem.record import Flag, Record, Status

from ..handler import Reply
from ..session.pinned_pool import BOOKKEEPING_OPCODES, HostPool, answer_bookkeeping

log = logging.getLogger(__name__)

DEVICE_POINTER = CALLS["cuMemHostGetDevicePointer"].opcode
POINTER_ATTRIBUTE = CALLS["cuPointerGetAttribute"].opcode
MEMORYTYPE_HOST = 1  # CU_MEMORYTYPE_HOST
# CUpointer_attribute -> what it is for page-locked host memory at `pointer` (a function of the pointer)
POOL_POINTER_ANSWERS = {2: lambda pointer: MEMORYTYPE_HOST, 3: lambda pointer: pointer, 4: lambda pointer: pointer,
                        8: lambda pointer: 0}
RELAY_MAY_ANSWER = frozenset({DEVICE_POINTER, POINTER_ATTRIBUTE})  # records `answer` may answer itself: never pumped


class Forward(NamedTuple):
    """What the relay sends instead of a pinned copy: the plain call's opcode, flags and payload, the payload's
    tail (a pinned HtoD's bytes, where they lie in the pool: sent from there, never copied first) following it."""
    opcode: int
    flags: int
    payload: bytes
    tail: memoryview | None = None


class PoolRelay:
    def __init__(self, pool: HostPool | None, session: int) -> None:
        self.pool, self.session = pool, session
        self.landing: dict[int, tuple[int, int]] = {}  # call id of a DtoH in flight -> (host address, size)
        self._said_attributes: set[int] = set()
        self._said_outside = False

    def answer(self, record: Record) -> Reply | None:
        """The relay's own answer to one of the pool's calls; None for every other record."""
        opcode = record.opcode
        if opcode in BOOKKEEPING_OPCODES:
            try:
                return Reply(*answer_bookkeeping(self.pool, opcode, record.payload, None))
            except RecordError as exc:
                return Reply(Status.MALFORMED, str(exc).encode())
        if opcode == DEVICE_POINTER:
            call = BY_OPCODE[DEVICE_POINTER]
            try:
                pointer, flags = call.request.decode(record.payload)
            except RecordError as exc:
                return Reply(Status.MALFORMED, str(exc).encode())
            if flags or self.pool is None or self.pool.host_address(pointer, 1) is None:
                return Reply(INVALID_VALUE)
            return Reply(SUCCESS, call.reply.encode(pointer))  # its own address, as natively under UVA
        if opcode == POINTER_ATTRIBUTE:
            return self._pointer_attribute(record)
        return None

    def _pointer_attribute(self, record: Record) -> Reply | None:
        """cuPointerGetAttribute of pool memory (see the module's text); None for any other pointer."""
        call = CALLS["cuPointerGetAttribute"]
        try:
            attribute, pointer = call.request.decode(record.payload)
        except RecordError as exc:
            return Reply(Status.MALFORMED, str(exc).encode())
        if self.pool is None or self.pool.host_address(pointer, 1) is None:
            return None  # the GPU host's to answer
        answer = POOL_POINTER_ANSWERS.get(attribute)
        width = POINTER_ATTRIBUTE_WIDTHS.get(attribute)
        if answer is None or width is None:
            if attribute not in self._said_attributes:
                self._said_attributes.add(attribute)
                log.info("session %d: cuPointerGetAttribute %d of page-locked memory answers "
                         "CUDA_ERROR_NOT_SUPPORTED: the GPU host does not map a relayed session's page-locked "
                         "memory", self.session, attribute)
            return Reply(NOT_SUPPORTED)
        return Reply(SUCCESS, call.reply.encode(answer(pointer), width))

    def rewrite(self, record: Record) -> Forward | Reply | None:
        """A pinned copy as the plain copy to send (a DtoH's landing place is kept until its answer), or the
        error Reply that refuses it; None for every other record."""
        if not record.opcode & PINNED_COPY:
            return None
        call = BY_OPCODE.get(record.opcode & ~PINNED_COPY)
        if call is None or call.pinned is None:
            return None  # not a copy: the GPU host refuses the opcode in its own words
        try:
            device, size, *rest = call.pinned.decode(record.payload)
        except RecordError as exc:
            return Reply(Status.MALFORMED, str(exc).encode())
        *stream, pointer = rest
        host = None if self.pool is None else self.pool.host_address(pointer, size)
        if host is None:
            if not self._said_outside:
                self._said_outside = True
                pool = self.pool
                log.info("session %d: a page-locked %s of %d bytes at %#x lies in no page-locked allocation (pool at "
                         "%#x, allocations %s): CUDA_ERROR_INVALID_VALUE", self.session, call.name, size, pointer,
                         pool.guest_base if pool else 0, sorted(pool.allocations.items())[:8] if pool else [])
            return Reply(INVALID_VALUE)
        if call.name.startswith("cuMemcpyHtoD"):
            return Forward(call.opcode, record.flags & Flag.NO_REPLY, call.request.fixed.pack(device, size, *stream),
                           pool_view(host, size))
        self.landing[record.call_id] = (host, size)
        return Forward(call.opcode, 0, call.request.encode(device, size, *stream))  # always answered: it has bytes

    def read_from(self, record: Record) -> int | None:
        """The page-locked address a pinned copy to the device reads its bytes from (None: no such copy, or one
        that does not decode, which `rewrite` refuses)."""
        call = BY_OPCODE.get(record.opcode & ~PINNED_COPY) if record.opcode & PINNED_COPY else None
        if call is None or call.pinned is None or not call.name.startswith("cuMemcpyHtoD"):
            return None
        try:
            *_, pointer = call.pinned.decode(record.payload)
        except RecordError:
            return None
        return int(pointer)

    def landing_for(self, call_id: int, status: int, length: int) -> memoryview | None:
        """Where a DtoH answer's bytes go in the pool: the view to read them into, empty when they do not land (a
        failure, or a length other than the copy's); None when `call_id` was no pinned DtoH."""
        target = self.landing.pop(call_id, None)
        if target is None:
            return None
        host, size = target
        return pool_view(host, size if status == SUCCESS and length == size else 0)


def pool_view(host: int, size: int) -> memoryview:
    """The pool's `size` bytes at address `host`, as a writable view."""
    return memoryview((ctypes.c_char * size).from_address(host)).cast("B") if size else memoryview(b"")
