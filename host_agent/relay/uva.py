"""Page-locked memory used as device memory on a relayed session (unified addressing; docs/remote.md, "What cannot
be relayed byte for byte").

Natively, cuMemHostAlloc memory is device memory too: its address may be the device side of a copy or a memset
(XLA's autotuner copies from such a buffer). On a relayed session that memory is the relaying host's pool, which
the GPU host cannot address, so the relay serves those calls itself (`plan_for` says how, relay/relayed_session.py runs
it):
- a copy or memset whose device side is pool memory is done here, on the pool: a DtoH answers the pool's bytes,
  an HtoD or a memset writes them, a page-locked copy between two pool buffers moves them;
- a DtoD with one side in the pool becomes the plain copy the GPU host serves: a DtoH whose answer lands in the
  pool, or an HtoD of the pool's bytes.
Before any of them the relay asks the GPU host whether each such address is memory of its own
(cuPointerGetAttribute): that answer comes after every earlier answer of the session (the GPU host answers in
order), so earlier copies into the pool have landed first; and an address both sides would claim (two processes'
unified addressing: a device allocation of the GPU host's worker where the guest's pool lies) answers
CUDA_ERROR_INVALID_VALUE instead of either one's bytes.

What does not belong here: kernels given pool memory (the GPU host cannot reach it; they fail there), and staged
requests (an HtoD of more than a ring slot into pool memory reaches the GPU host, which refuses it: an error, not a
wrong value).
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import NamedTuple

from ivshmem.cuda_status import INVALID_VALUE, SUCCESS
from ivshmem.driver_api import BY_OPCODE, CALLS, PINNED_COPY
from ivshmem.errors import RecordError
from ivshmem.record import Flag, Record, Status

from ..handler import Reply
from ..session.pinned_pool import HostPool
from .pool import Forward, pool_view

# Calls whose device side may be pool memory -> how the compiled pump finds it in a request: 2, the u64 at the
# payload's start; 3, the u64s at offsets 0 and 8 (a DtoD's destination and source). The pump forwards such a
# record itself only when no such pointer lies in the pool (hot_dispatch.c, forward_record).
DEVICE_SIDES = {CALLS[name].opcode: 3 if name.startswith("cuMemcpyDtoD") else 2 for name in (
    "cuMemcpyDtoH", "cuMemcpyDtoHAsync", "cuMemcpyHtoD", "cuMemcpyHtoDAsync", "cuMemcpyDtoD", "cuMemcpyDtoDAsync",
    "cuMemsetD8", "cuMemsetD16", "cuMemsetD32", "cuMemsetD8Async", "cuMemsetD16Async", "cuMemsetD32Async")}
MEMSET_WIDTHS = {CALLS[f"cuMemsetD{bits}{form}"].opcode: bits // 8 for bits in (8, 16, 32) for form in ("", "Async")}
PROBE = CALLS["cuPointerGetAttribute"]
MEMORY_TYPE = 2  # CU_POINTER_ATTRIBUTE_MEMORY_TYPE: any attribute the GPU host answers only for its own memory


class Plan(NamedTuple):
    """How the relay serves one call on the pool: after `probes` (pool addresses the GPU host must not own), either
    `run` (the work done here; the guest's answer) or `forward` (the plain copy sent instead, its answer landing at
    `landing`, (host address, size), when it is a DtoH)."""
    probes: tuple[int, ...]
    run: Callable[[], Reply] | None = None
    forward: Forward | None = None
    landing: tuple[int, int] | None = None


def plan_for(pool: HostPool, record: Record) -> Plan | Reply | None:
    """The Plan for a copy or memset whose device side lies in one of `pool`'s allocations, the Reply refusing a
    malformed one, or None (the GPU host's to serve, as it is)."""
    pinned = bool(record.opcode & PINNED_COPY)
    opcode = record.opcode & ~PINNED_COPY
    if opcode not in DEVICE_SIDES:
        return None
    call = BY_OPCODE[opcode]
    try:
        fields = (call.pinned if pinned else call.request).decode(record.payload)  # type: ignore[union-attr]
    except (RecordError, AttributeError) as exc:
        return Reply(Status.MALFORMED, str(exc).encode())
    if opcode in MEMSET_WIDTHS:
        return _memset(pool, fields, MEMSET_WIDTHS[opcode])
    if DEVICE_SIDES[opcode] == 3:
        return _dtod(pool, call.name, record.flags, fields)
    device, size, *rest = fields
    source = pool.host_address(device, size)
    if source is None:
        return None
    if pinned:  # both sides in the pool: the host side is the pinned pointer
        other = pool.host_address(rest[-1], size)
        if other is None:
            return Reply(INVALID_VALUE)
        target, origin = (other, source) if call.name.startswith("cuMemcpyDtoH") else (source, other)
        return Plan((device,), run=lambda: _moved(target, origin, size))
    if call.name.startswith("cuMemcpyDtoH"):
        return Plan((device,), run=lambda: Reply(SUCCESS, bytes(pool_view(source, size))))
    data = rest[-1]
    if len(data) != size:
        return Reply(Status.MALFORMED, f"{call.name}: {len(data)} bytes for a copy of {size}".encode())
    return Plan((device,), run=lambda: _written(source, data))


def _dtod(pool: HostPool, name: str, flags: int, fields: tuple[int, ...]) -> Plan | None:
    destination, source, size, *stream = fields
    into, out_of = pool.host_address(destination, size), pool.host_address(source, size)
    if into is None and out_of is None:
        return None
    suffix = "Async" if stream else ""
    if into is not None and out_of is not None:
        return Plan((destination, source), run=lambda: _moved(into, out_of, size))
    if into is not None:  # the GPU host's bytes, landing in the pool (always answered: it carries them)
        dtoh = CALLS["cuMemcpyDtoH" + suffix]
        return Plan((destination,), forward=Forward(dtoh.opcode, 0, dtoh.request.encode(source, size, *stream)),
                    landing=(into, size))
    htod = CALLS["cuMemcpyHtoD" + suffix]  # the pool's bytes, sent from where they lie
    return Plan((source,), forward=Forward(htod.opcode, flags & Flag.NO_REPLY,
                                           htod.request.fixed.pack(destination, size, *stream),
                                           pool_view(out_of, size)))  # type: ignore[arg-type]


def _memset(pool: HostPool, fields: tuple[int, ...], width: int) -> Plan | None:
    destination, value, count, *_stream = fields
    target = pool.host_address(destination, count * width)
    if target is None:
        return None
    return Plan((destination,), run=lambda: _written(target, value.to_bytes(width, "little") * count))


def _moved(target: int, source: int, size: int) -> Reply:
    ctypes.memmove(target, source, size)
    return Reply(SUCCESS)


def _written(target: int, data: bytes | bytearray | memoryview) -> Reply:
    pool_view(target, len(data))[:] = data
    return Reply(SUCCESS)
