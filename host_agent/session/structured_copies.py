"""Structured copies (cuMemcpy2D, cuMemcpy2DUnaligned, cuMemcpy2DAsync, cuMemcpy3D, cuMemcpy3DAsync, cuMemcpy3DPeer,
cuMemcpy3DPeerAsync: what PyTorch's and CuPy's cudaMemcpy2D(Async) become) as the host serves them: a mixin of
executor.CudaExecutor, registered on the host's HOST handlers (call_registry.py).

A request is driver_api.STRUCTURED_COPY: which side, if any, is the guest's pageable memory staged through the
record, the part of that side's rows (packed back to back: WidthInBytes each, row after row, slice after slice) the
record carries or asks for, and the copy as MEMCPY_3D. Every record is checked whole before the driver sees it:

* its other sides as a graph memcpy node's are (graph_calls.GraphCalls._copy_side, the one implementation): device
  memory over the whole pitched extent, from its offsets, pitch and height, in the session's memory (else
  CUDA_ERROR_INVALID_VALUE); host memory in the session's page-locked pool, translated to the host's mapping of it
  (other guest memory: CUDA_ERROR_NOT_SUPPORTED, which the guest answers by staging it); CU_MEMORYTYPE_UNIFIED by where
  the address lies; arrays CUDA_ERROR_NOT_SUPPORTED (the guest never sends one);
* a staged side is a buffer of the host's own holding exactly the record's rows, so nothing the guest says about
  that side reaches memory here: its geometry is the guest's, which held it to cuda.h's rules
  (guest_runtime/native/structured_copies.c), and only its LOD travels on to the driver;
* a stream must be the session's (CUDA_ERROR_INVALID_HANDLE), a peer copy's contexts NULL or the session's
  (CUDA_ERROR_INVALID_CONTEXT);
* a 2D call's third dimension must be empty (z and LOD 0, depth 1), since the 2D struct the driver gets has none and
  the checks above would have covered other memory than the driver copies; that, a staged part outside the copy's
  rows or longer than MAX_STAGED_PART, a tail that is not the part, or a part with no staged side, is a malformed
  request (Status.MALFORMED), never a traceback.

How it runs:

* no staged side: the driver's own call (the async ones with their stream), the copy as the guest described it;
* a staged side, the whole copy in one record: the driver's call once, the staged side the host's buffer of the
  packed rows (pitch WidthInBytes, height Height, from 0): every check of the other side is the driver's own;
* a copy larger than one record: each record carries a part, copied as at most five boxes (the rest of a row, rows
  of a slice, whole slices, the rows and the piece of a row that end the part), one driver call each, the other
  side at the box's offsets. A box does not show the driver the whole copy, so each such record first holds the
  other side to cuda.h's rules for the whole copy (pitch >= XInBytes + WidthInBytes where there is more than one row;
  slice height >= Y + Height where there is more than one slice; else CUDA_ERROR_INVALID_VALUE): a copy the driver
  would refuse is refused at its first record, before a byte moved;
* an async copy with a staged side first synchronises its stream, as the executor's pageable copies do
  (executor._start_copy): the host's buffer is pageable memory, which the driver has taken (to the device) or
  written (from it) when its call returns, so the buffer may go; on a capturing stream the synchronise is refused
  (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, the capture invalidated), so no graph node ever reads a buffer that is gone.
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ivshmem.cuda_status import INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED, SUCCESS
from ivshmem.driver_api import DriverCall
from ivshmem.record import Status

from ..handler import Reply
from .call_registry import HOST
from .graph_calls import CU_MEMORYTYPE_HOST

if TYPE_CHECKING:
    from .session_ledger import SessionLedger

# The most bytes of rows one record carries or asks for: the buffer a record costs here. The guest's parts are this
# size (guest_runtime/native/structured_copies.c PART_BYTES; tests/wire/test_native_structured_copies.py holds them
# equal); a record is far below the wire's 1 GiB, and a larger copy is several records.
MAX_STAGED_PART = 64 << 20
NO_SIDE, SOURCE, DESTINATION = 0, 1, 2  # STRUCTURED_COPY's `staged`
SIDE_FIELDS = ("x", "y", "z", "lod", "type", "host", "device", "pitch", "height")  # a MEMCPY_3D side, in order
STRUCTURED_CALLS = ("cuMemcpy2D", "cuMemcpy2DUnaligned", "cuMemcpy2DAsync", "cuMemcpy3D", "cuMemcpy3DAsync",
                    "cuMemcpy3DPeer", "cuMemcpy3DPeerAsync")

Side = tuple[int, ...]  # SIDE_FIELDS' values
Box = tuple[int, int, int, int, int, int]  # the column, row and slice of its first byte; its width, rows, slices
_EMPTY = ctypes.create_string_buffer(1)  # the staged buffer of a copy with no bytes: the driver gets a real address


def boxes(extent: tuple[int, int, int], offset: int, length: int) -> list[Box]:
    """The bytes [offset, offset + length) of a copy's rows packed back to back, as rectangles the driver copies in
    one call each, in order: the rest of a row, rows of one slice, whole slices, and again rows and a row's piece."""
    width, height, _depth = extent
    made: list[Box] = []
    position, end = offset, offset + length
    while position < end:
        row, column = divmod(position, width)
        slice_, row = divmod(row, height)
        left = end - position
        if column or left < width:  # a piece of one row
            box = (column, row, slice_, min(width - column, left), 1, 1)
        elif row or left < width * height:  # whole rows of one slice
            box = (0, row, slice_, width, min(height - row, left // width), 1)
        else:  # whole slices
            box = (0, 0, slice_, width, height, left // (width * height))
        made.append(box)
        position += box[3] * box[4] * box[5]
    return made


def _geometry_refused(side: Side, extent: tuple[int, int, int]) -> bool:
    """cuda.h's rules for one side of the whole copy (cuMemcpy3D: "srcPitch must be greater than or equal to
    WidthInBytes + srcXInBytes ... srcHeight must be greater than or equal to Height + srcY"): a pitch where there is
    more than one row, a slice height where there is more than one slice."""
    x, y, _z, _lod, _kind, _host, _device, pitch, rows = side
    width, height, depth = extent
    return ((height > 1 or depth > 1) and pitch < x + width) or (depth > 1 and rows < y + height)


class StructuredCopies:
    """cuMemcpy2D/3D and their async, unaligned and peer forms: checked whole, run by the driver, a pageable guest
    side staged through the host's own buffer."""

    if TYPE_CHECKING:  # CudaExecutor's, and GraphCalls' (which it also mixes in)
        driver: Any
        ledger: SessionLedger

        def _copy_side(self, kind: int, host: int, device: int, x: int, y: int, z: int, pitch: int, rows: int,
                       extent: tuple[int, int, int]) -> tuple[int, int, int, int]: ...

        def _context_refused(self, context: int) -> int | None: ...

    @HOST.serves(*STRUCTURED_CALLS)
    def _structured_copy(self, call: DriverCall, payload: bytes) -> Reply:
        payload = bytes(payload)  # (the same object when it is one: its address is the staged source's)
        values = dict(zip((name for name, _kind in call.request.fields), call.request.decode(payload), strict=True))
        staged, offset, length, data = values["staged"], values["offset"], values["length"], values["data"]
        sides: list[Side] = [tuple(values[f"{prefix}_{field}"] for field in SIDE_FIELDS) for prefix in ("src", "dst")]
        extent = (values["width"], values["height"], values["depth"])
        total = extent[0] * extent[1] * extent[2]
        stream: int | None = values.get("stream")
        contexts = (values.get("src_context", 0), values.get("dst_context", 0))
        problem = _malformed(call, staged, offset, length, len(data), total, sides, extent)
        if problem:
            return Reply(Status.MALFORMED, f"{call.name}: {problem}".encode())
        if not self.ledger.stream_known(stream):
            return Reply(INVALID_HANDLE)
        for context in contexts:
            if context and (refused := self._context_refused(context)) is not None:
                return Reply(refused)
        function = getattr(self.driver, call.name, None)
        if function is None:  # a cuda-bindings without it (or the fake driver): as an older driver
            return Reply(NOT_SUPPORTED)
        for index, side in enumerate(sides):
            if index + 1 == staged:
                continue
            x, y, z, lod, kind, host, device, pitch, rows = side
            err, kind, host, device = self._copy_side(kind, host, device, x, y, z, pitch, rows, extent)
            if err != SUCCESS:
                return Reply(err)
            sides[index] = (x, y, z, lod, kind, host, device, pitch, rows)

        def run(copy: Any) -> int:
            (err,) = function(copy, stream) if stream is not None else function(copy)
            return int(err)

        if staged == NO_SIDE:
            return Reply(run(self._copy_struct(call, sides, contexts, extent)))
        if stream is not None:  # in stream order, and never captured (see the module docstring)
            (err,) = self.driver.cuStreamSynchronize(stream)
            if int(err) != SUCCESS:
                return Reply(int(err))
        other = sides[2 - staged]
        if (offset, length) != (0, total) and _geometry_refused(other, extent):
            return Reply(INVALID_VALUE)
        rows_out = bytearray(length) if staged == DESTINATION else None
        held: Any = None  # what keeps the staged buffer's address valid while the driver copies
        if rows_out is not None and length:
            held = (ctypes.c_char * length).from_buffer(rows_out)
            base = ctypes.addressof(held)
        elif staged == SOURCE and length:
            held = payload
            base = ctypes.cast(ctypes.c_char_p(payload), ctypes.c_void_p).value or 0
            base += len(payload) - length  # the tail: the part's rows
        else:
            base = ctypes.addressof(_EMPTY)
        parts = [(0, 0, 0, *extent)] if (offset, length) == (0, total) else boxes(extent, offset, length)
        staged_lod, position = sides[staged - 1][3], offset
        x, y, z, lod, kind, host, device, pitch, slice_rows = other
        for column, row, slice_, width, height, depth in parts:
            count = width * height * depth
            if position + count > offset + length:  # never past the host's own buffer
                return Reply(Status.MALFORMED, f"{call.name}: a box past its part".encode())
            moved: Side = (x + column, y + row, z + slice_, lod, kind, host, device, pitch, slice_rows)
            # the staged side: the box's rows where they lie in the buffer, packed (one row: its own width)
            packed: Side = (0, 0, 0, staged_lod, CU_MEMORYTYPE_HOST, base + position - offset, 0,
                            extent[0] if height > 1 or depth > 1 else width, extent[1])
            box_sides = [packed, moved] if staged == SOURCE else [moved, packed]
            err = run(self._copy_struct(call, box_sides, contexts, (width, height, depth)))
            if err != SUCCESS:
                return Reply(err)
            position += count
        del held
        return Reply(SUCCESS, rows_out if rows_out is not None else b"")

    def _copy_struct(self, call: DriverCall, sides: Sequence[Side], contexts: tuple[int, int],
                     extent: tuple[int, int, int]) -> Any:
        """The wheel's CUDA_MEMCPY2D, CUDA_MEMCPY3D or CUDA_MEMCPY3D_PEER (for `call`) of two checked sides."""
        driver = self.driver
        two_d, peer = call.name.startswith("cuMemcpy2D"), "Peer" in call.name
        copy = (driver.CUDA_MEMCPY2D if two_d else driver.CUDA_MEMCPY3D_PEER if peer else driver.CUDA_MEMCPY3D)()
        for prefix, side, context in zip(("src", "dst"), sides, contexts, strict=True):
            x, y, z, lod, kind, host, device, pitch, rows = side
            setattr(copy, f"{prefix}XInBytes", x)
            setattr(copy, f"{prefix}Y", y)
            setattr(copy, f"{prefix}MemoryType", driver.CUmemorytype(kind))
            setattr(copy, f"{prefix}Host", host)
            setattr(copy, f"{prefix}Device", device)
            setattr(copy, f"{prefix}Pitch", pitch)
            if not two_d:
                setattr(copy, f"{prefix}Z", z)
                setattr(copy, f"{prefix}LOD", lod)
                setattr(copy, f"{prefix}Height", rows)
            if peer:
                setattr(copy, f"{prefix}Context", context)
        copy.WidthInBytes, copy.Height = extent[0], extent[1]
        if not two_d:
            copy.Depth = extent[2]
        return copy


def _malformed(call: DriverCall, staged: int, offset: int, length: int, carried: int, total: int,
               sides: Sequence[Side], extent: tuple[int, int, int]) -> str:
    """Why a request is not one the guest makes ("" when it is)."""
    if call.name.startswith("cuMemcpy2D") and (extent[2] != 1 or any(side[2] or side[3] for side in sides)):
        return "a 2D copy with a third dimension"
    if staged not in (NO_SIDE, SOURCE, DESTINATION):
        return f"staged side {staged}"
    if staged == NO_SIDE:
        return "" if (offset, length, carried) == (0, 0, 0) else "rows of a copy with no staged side"
    if length > MAX_STAGED_PART or offset + length > total or (total and not length):
        return f"part of {length} bytes at {offset} of a {total}-byte copy"
    if carried != (length if staged == SOURCE else 0):
        return f"{carried} bytes carried for a part of {length}"
    return ""
