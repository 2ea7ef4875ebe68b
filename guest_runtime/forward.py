"""The guest half of CUDA forwarding: driver calls made by unmodified CUDA wheels become records.

`Forwarder.implementations()` returns one Python function per call of ivshmem.driver_api, taking the raw
C arguments the capsule trampoline receives (ints; None for NULL pointers) and returning a CUresult. Calls
whose parameters are all scalars, handles or pointers to them are marshalled straight from the table; the
others are written out here, registered in `GUEST` by name, and encode and decode exactly the request and
reply the table declares for them (host_agent/session/executor.py serves the same declarations). What a call
allocates, frees or unloads comes from the table's effects too.

The session state the guest keeps lives apart, so that this module is marshalling: the calling threads'
context stacks (contexts.py), the page-locked pool (pinned_pool.py), the device memory this process got
(device_ranges.py), the kernel-parameter layouts it learned (param_layouts.py) and the error texts it handed
out (error_texts.py).

The channel is claimed at the first call, not at import, so a program that never touches CUDA never needs
the host agent. If the agent cannot be reached, cuInit answers CUDA_ERROR_NO_DEVICE and says why once.
`close()` ends the session at exit; every call after it answers CUDA_ERROR_DEINITIALIZED at once.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import struct
import sys
import threading
from collections.abc import Callable
from typing import Any

from ivshmem.channel import MAX_PAYLOAD, BufferCursor, ClientChannel, Streamed
from ivshmem.cuda_status import (
    DEINITIALIZED,
    DEVICE_UNAVAILABLE,
    INVALID_CONTEXT,
    INVALID_IMAGE,
    INVALID_VALUE,
    LOSSY_QUERY,
    NO_DEVICE,
    NOT_FOUND,
    NOT_INITIALIZED,
    NOT_SUPPORTED,
    OUT_OF_MEMORY,
    SUCCESS,
    UNKNOWN,
)
from ivshmem.driver_api import (
    CALLS,
    IMAGE_BY_DIGEST,
    IMAGE_BY_DIGEST_MIN,
    IMAGE_BY_DIGEST_REQUEST,
    IMAGE_NOT_CACHED,
    INOUT,
    JIT_ERROR_LOG_BUFFER,
    JIT_ERROR_LOG_SIZE,
    JIT_GUEST_OPTIONS,
    JIT_INFO_LOG_BUFFER,
    JIT_INFO_LOG_SIZE,
    JIT_SCALAR_OPTIONS,
    JIT_WALL_TIME,
    LAUNCH_ATTRIBUTE,
    LAUNCH_ATTRIBUTES_EVENT,
    LAUNCH_ATTRIBUTES_PLAIN,
    OUT,
    PINNED_COPY,
    POOL_ATTRIBUTES_64,
    POOL_MAP_OPCODE,
    POOL_MAP_REPLY,
    POOL_MAP_REQUEST,
    STREAM_CREATES,
    DriverCall,
    Handlers,
    LaunchConfig,
)
from ivshmem.errors import DeviceLost, WireError
from ivshmem.record import Record

from . import capture_owners
from .capture_owners import CaptureOwners
from .contexts import UNKNOWN as UNKNOWN_CONTEXT
from .contexts import ContextStacks
from .device_ranges import DeviceRanges
from .error_texts import ErrorTexts, local_error_name
from .kernel_params import pack_checked, params_from_extra
from .module_image import ImageError, locate
from .occupancy import PotentialBlockSize
from .param_layouts import ParamLayouts
from .pinned_pool import GuestPool

log = logging.getLogger(__name__)

GUEST = Handlers("guest")  # the calls written out below, by name
# Hand-written calls that only the native driver (libcuda.so.1) writes out. What needs them (cuBLAS's cluster
# launches and TMA descriptors, JAX's virtual-memory allocator) loads its own CUDA runtime, which only the native
# driver forwards; through the capsule they answer CUDA_ERROR_NOT_SUPPORTED, named once (docs/native-driver.md).
NATIVE_ONLY = frozenset({"cuOccupancyMaxActiveClusters", "cuTensorMapEncodeTiled", "cuMemGetAllocationGranularity",
                         "cuTensorMapEncodeIm2col", "cuTensorMapEncodeIm2colWide", "cuTensorMapReplaceAddress",
                         "cuTensorMapSetAllocationClass",
                         "cuMemCreate", "cuMemSetAccess",
                         "cuMemPoolCreate", "cuMemPoolSetAccess", "cuMemPoolGetAccess", "cuMemGetDefaultMemPool",
                         "cuMemGetMemPool", "cuMemSetMemPool", "cuMemGetAccess", "cuMemRetainAllocationHandle",
                         "cuMemGetAllocationPropertiesFromHandle",
                         "cuStreamGetAttribute", "cuStreamSetAttribute", "cuOccupancyMaxPotentialClusterSize",
                         "cuStreamBeginCaptureToGraph", "cuStreamUpdateCaptureDependencies",
                         "cuDeviceGetGraphMemAttribute", "cuDeviceSetGraphMemAttribute",
                         "cuMemcpy2D", "cuMemcpy2DUnaligned", "cuMemcpy2DAsync", "cuMemcpy3D", "cuMemcpy3DAsync",
                         "cuMemcpy3DPeer", "cuMemcpy3DPeerAsync",
                         "cuLinkCreate", "cuLinkAddData", "cuLinkComplete", "cuStreamBatchMemOp",
                         "cuModuleEnumerateFunctions", "cuLibraryEnumerateKernels", "cuFuncGetName", "cuKernelGetName",
                         "cuDeviceGetLuid", "cuDeviceGetHostAtomicCapabilities", "cuDeviceGetP2PAtomicCapabilities",
                         *(name for name in CALLS if name.startswith("cuGraph") and not CALLS[name].generic)})
SET_CURRENT = CALLS["cuCtxSetCurrent"]
EXCHANGE_CAPTURE_MODE = CALLS["cuThreadExchangeStreamCaptureMode"]
CAPTURE_WRONG_THREAD = 908  # CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
LIBRARY_BINARY_IS_PRESERVED = 1  # CUlibraryOption
FORWARDED_LAUNCH_ATTRIBUTES = LAUNCH_ATTRIBUTES_PLAIN | LAUNCH_ATTRIBUTES_EVENT
CTYPES: dict[str, Any] = {"i": ctypes.c_int, "I": ctypes.c_uint, "Q": ctypes.c_uint64, "f": ctypes.c_float,
          "B": ctypes.c_ubyte, "H": ctypes.c_ushort}


PAGEABLE_PIECE = MAX_PAYLOAD // 2  # the most one pageable copy request carries (native/copy_calls.c's too)


def _in_pieces(copy: Callable[[int, int], int], size: int) -> int:
    """A pageable copy too large for one request: PAGEABLE_PIECE bytes at a time, in order, each awaited; the first
    error is the answer (the pieces before it copied), as the driver copies any size."""
    for at in range(0, size, PAGEABLE_PIECE):
        status = copy(at, min(PAGEABLE_PIECE, size - at))
        if status != SUCCESS:
            return status
    return SUCCESS


def _taken_async_error(channel: ClientChannel) -> int:
    """The oldest posted call's failure that came back, taken (said once): its CUresult."""
    status = channel.async_errors.pop(0).status
    return status if status > 0 else UNKNOWN


def _view(address: int, size: int) -> memoryview:
    """The guest memory at `address` as a writable byte view (no copy)."""
    return memoryview((ctypes.c_char * size).from_address(address)).cast("B")


class Forwarder:
    def __init__(self, connect: Callable[[], ClientChannel]) -> None:
        self._connect = connect
        self._channel: ClientChannel | None = None
        self._unreachable: str | None = None
        self._closed = False  # close() ran: the program is exiting
        self._error_texts = ErrorTexts()  # cuGetErrorName/String's, valid for the life of the process
        self._device_memory = DeviceRanges()  # what cuMemcpy with unified addressing treats as device memory
        self._param_layouts = ParamLayouts(self._call, self.channel)  # kernel parameters, asked once per function
        self._layout = self._param_layouts.layout  # bound once: every launch with kernelParams asks it
        self._impls: dict[str, Callable[..., int]] = {}
        self._named: set[str] = set()  # what was refused as not forwarded, logged once each
        self._lock = threading.RLock()  # one channel per process: one call on it at a time, whichever thread
        self._contexts = ContextStacks()
        self._initialized = False  # cuInit succeeded
        self._captures = CaptureOwners()  # begun and not ended (true while any may run: every copy waits, _htod)
        self._unavailable = False  # a call answered CUDA_ERROR_DEVICE_UNAVAILABLE: every copy waits (_htod)
        # The streams this process created and has not destroyed, and the context of each (native/known_handles.c):
        # a small copy to the device on one of them, in its context, is posted as on a default stream (_htod).
        self._streams: dict[int, int] = {}
        self._pool = GuestPool()
        # Digests of module images the agent was seen to hold, and how often a noted one was answered "not cached"
        # (the agent dropped it): after IMAGE_DROPS_TO_STOP such answers, images travel whole without asking.
        self._images_held: set[bytes] = set()
        self._image_drops = 0
        self._said_lost = False  # the channel's end was logged (_not_carried)

    # --- the channel ---------------------------------------------------------------------------------------
    def channel(self) -> ClientChannel | None:
        if self._channel is None and self._unreachable is None and not self._closed:
            try:
                self._channel = self._connect()
            except WireError as exc:
                self._unreachable = str(exc)
                print(f"orion: no GPU through Orion: {exc}", file=sys.stderr)
        return self._channel

    def close(self) -> None:
        """End the session (activate.py calls this at exit): release the channel, a clean end the host sees at
        once, and answer every later call CUDA_ERROR_DEINITIALIZED, as a torn-down driver does. A call on the
        released channel would wait for ever: the host has ended the session and still beats.

        Takes no lock: another thread may be inside a call, holding `_lock`, and nothing bounds that call."""
        self._closed = True
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def _no_channel(self, call: DriverCall) -> int:
        if self._closed:
            return DEINITIALIZED
        return NO_DEVICE if call.name == "cuInit" else NOT_INITIALIZED

    def _pending_async_error(self) -> int:
        """An earlier posted call's failure that came back, taken, or SUCCESS: a call answered without a round trip
        reports it first, as a forwarded answer would (native: orion_pending_async_error)."""
        channel = self.channel()
        return _taken_async_error(channel) if channel is not None and channel.async_errors else SUCCESS

    def _sync_context(self, channel: ClientChannel) -> None:
        """Make the calling thread's current context the host's before its call goes out (contexts.py), and, while a
        capture may run, its capture interaction mode (_exchange_capture_mode)."""
        wanted = self._contexts.current()
        if wanted != self._contexts.host_current:
            channel.post(SET_CURRENT.opcode, SET_CURRENT.inputs.pack(wanted))
            self._contexts.host_current = wanted
        if self._captures:  # the host thread's mode: the driver's rule for this thread (capture_owners.py)
            mode = self._captures.presented()
            if mode != self._captures.host_mode:
                channel.post(EXCHANGE_CAPTURE_MODE.opcode, EXCHANGE_CAPTURE_MODE.inputs.pack(mode))
                self._captures.host_mode = mode

    def _call(self, call: DriverCall, payload: bytes | memoryview | Streamed, sink: Any = None,
              fold: bool = True, opcode: int | None = None) -> tuple[int, Record | None]:
        """Send one call and wait. `fold`: report a pending asynchronous error as this call's result, as CUDA
        does at a synchronising call; internal queries (parameter layouts, error texts) leave it pending.
        `opcode`: a forwarding-layer variant of `call` (a pinned copy, POOL_MAP)."""
        channel = self.channel()
        if channel is None:
            return self._no_channel(call), None
        try:
            self._sync_context(channel)
            reply = channel.call(call.opcode if opcode is None else opcode, payload, sink=sink)
        except WireError as exc:
            return self._not_carried(exc), None
        status = reply.status
        if status == IMAGE_NOT_CACHED and opcode is not None and opcode & IMAGE_BY_DIGEST:
            return status, None  # a load by digest the agent cannot serve: _load_image sends the image whole
        if status < 0:
            log.error("orion: the host refused %s (wire status %d): %s", call.name, status,
                      bytes(reply.payload[:200]).decode(errors="replace"))
            return UNKNOWN, None
        if status == DEVICE_UNAVAILABLE:
            self._unavailable = True  # a relay that lost its GPU host: no copy is posted any more (_htod)
        if fold and status == SUCCESS and channel.async_errors:  # an earlier posted call failed: report it now
            return _taken_async_error(channel), None
        return status, reply

    def _post(self, call: DriverCall, payload: bytes | Streamed, opcode: int | None = None) -> int:
        channel = self.channel()
        if channel is None:
            return self._no_channel(call)
        try:
            self._sync_context(channel)
            channel.post(call.opcode if opcode is None else opcode, payload)
        except WireError as exc:
            return self._not_carried(exc)
        return SUCCESS

    def _not_carried(self, exc: WireError) -> int:
        """A call the channel could not carry, said once, as the native driver's not_carried (cuda_client.c): a
        session whose host ended it in the middle of a reply (errors.DeviceLost: a relay lost the GPU host, the GPU
        failed a copy whose success had gone out, the grant it joined ended) answers, for this and every later call,
        what a relay answers for a lost GPU host, CUDA_ERROR_DEVICE_UNAVAILABLE; any other end of the channel (its
        worker died, the agent went away) CUDA_ERROR_UNKNOWN. Never a raise: the capsule trampoline would answer
        UNKNOWN with a traceback, and a caller of the table (a test) would see the exception."""
        if not self._said_lost:
            self._said_lost = True
            log.error("orion: %s", exc)
        if isinstance(exc, DeviceLost):
            self._unavailable = True
            return DEVICE_UNAVAILABLE
        return UNKNOWN

    # --- the table ------------------------------------------------------------------------------------------
    def implementations(self) -> dict[str, Callable[..., int]]:
        impls = self._impls
        for call in CALLS.values():
            if call.name in NATIVE_ONLY:
                impls[call.name] = lambda *_args, name=call.name: self._not_forwarded(name)
                continue
            written = GUEST.by_name.get(call.name)
            impls[call.name] = self._serialised(written(self, call) if written is not None else self._generic(call))
        return dict(impls)

    def _serialised(self, implementation: Callable[..., int]) -> Callable[..., int]:
        """One call at a time on the channel: cuda-python releases the GIL around driver calls, so two threads
        could otherwise interleave records on a single-producer ring."""
        lock = self._lock

        def call(*args: Any) -> int:
            with lock:
                return implementation(*args)
        return call

    def _generic(self, call: DriverCall) -> Callable[..., int]:
        ins = call.input_positions
        inout = {i: CTYPES[p.code] for i, p in enumerate(call.params) if p.role == INOUT}  # read through the pointer
        outs = [(i, CTYPES[p.code]) for i, p in enumerate(call.params) if p.role in (OUT, INOUT)]
        pack, unpack = call.inputs.pack, call.outputs.unpack

        def request(args: tuple[Any, ...]) -> bytes:
            return pack(*[inout[i].from_address(args[i]).value if i in inout else args[i] or 0 for i in ins])

        if call.posted:
            return lambda *args: self._post(call, request(args))

        initializes = "initializes" in call.effects
        forgets = "unloads" in call.effects  # its functions' handles may be reused
        allocates = "allocates" in call.effects  # (CUdeviceptr *out, size_t size, ...)
        frees = "frees" in call.effects
        pitched = "allocates_pitched" in call.effects  # (CUdeviceptr *out, size_t *pitch, width, rows, ...)
        rows = call.input_positions[1] if pitched else 0
        device_memory = self._device_memory
        optional = call.optional_outputs  # cuda.h lets a caller leave these NULL
        makes_stream = call.name in STREAM_CREATES
        ends_stream = "destroys" in call.effects and call.params[0].base == "CUstream"
        ends_streams = call.name in ("cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxReset")  # its streams may go

        def forward(*args: Any) -> int:
            if any(not args[i] for i, _ in outs if i not in optional):
                return INVALID_VALUE  # a NULL output pointer, as the driver would say
            status, reply = self._call(call, request(args))
            if status == SUCCESS and outs and reply is not None:
                for (i, ctype), value in zip(outs, unpack(reply.payload), strict=True):
                    if args[i]:  # (an output cuda.h lets be NULL is skipped)
                        ctype.from_address(args[i]).value = value
            if status == SUCCESS:
                if initializes:
                    self._initialized = True
                elif forgets:
                    self._param_layouts.forget()
                elif allocates:
                    device_memory.add(ctypes.c_uint64.from_address(args[0]).value, args[1])
                elif pitched:
                    device_memory.add(ctypes.c_uint64.from_address(args[0]).value,
                                      ctypes.c_uint64.from_address(args[1]).value * args[rows])
                elif frees:
                    device_memory.discard(args[0] or 0)
                elif makes_stream:
                    self._streams[ctypes.c_uint64.from_address(args[0]).value] = self._contexts.current()
                elif ends_stream:
                    self._streams.pop(args[0] or 0, None)
            if ends_streams:
                self._streams.clear()
            return status
        return forward

    # --- hand-written calls ----------------------------------------------------------------------------------
    @GUEST.serves("cuDeviceGetName")
    def _device_get_name(self, call: DriverCall) -> Callable[..., int]:
        def forward(name: int | None, length: int, dev: int) -> int:
            if not name or length <= 0:
                return INVALID_VALUE
            status, reply = self._call(call, call.request.encode(length, dev))
            if status == SUCCESS and reply is not None:
                (text,) = call.reply.decode(reply.payload)
                text = bytes(text)[:length - 1] + b"\0"
                ctypes.memmove(name, text, len(text))
            return status
        return forward

    @GUEST.serves("cuDeviceGetUuid")
    def _device_get_uuid(self, call: DriverCall) -> Callable[..., int]:
        def forward(uuid: int | None, dev: int) -> int:
            if not uuid:
                return INVALID_VALUE
            status, reply = self._call(call, call.request.encode(dev))
            if status == SUCCESS and reply is not None:
                (raw,) = call.reply.decode(reply.payload)
                if len(raw) != 16:
                    return UNKNOWN
                ctypes.memmove(uuid, bytes(raw), 16)
            return status
        return forward

    @GUEST.serves("cuGetErrorName", "cuGetErrorString")
    def _static_text(self, call: DriverCall) -> Callable[..., int]:
        """cuGetErrorName/String: a string that must stay valid for the life of the process."""
        def forward(code: int, out: int | None) -> int:
            if not out:
                return INVALID_VALUE
            key = (call.name, code)
            address = self._error_texts.address(key)
            if address is None:
                status, reply = (self._call(call, call.request.encode(code), fold=False)
                                 if self.channel() is not None else (NOT_INITIALIZED, None))
                local = local_error_name(code)  # no agent to ask: the enum's name still says what happened
                text = bytes(call.reply.decode(reply.payload)[0]) if status == SUCCESS and reply is not None else local
                if text is None:
                    return INVALID_VALUE
                address = self._error_texts.keep(key, text)
            ctypes.c_void_p.from_address(out).value = address
            return SUCCESS
        return forward

    @GUEST.serves("cuThreadExchangeStreamCaptureMode")
    def _exchange_capture_mode(self, call: DriverCall) -> Callable[..., int]:
        """Each thread's capture interaction mode is kept in the guest (capture_owners.py), and the host thread is
        given the mode that makes the driver's rule the calling thread's before each call while a capture may run
        (_sync_context). Before cuInit, or for a value that is not a mode, the driver answers."""
        asked = self._generic(call)

        def forward(mode: int | None) -> int:
            if not mode:
                return INVALID_VALUE
            cell = ctypes.c_int.from_address(mode)
            if not self._initialized or not capture_owners.GLOBAL <= cell.value <= capture_owners.RELAXED:
                return asked(mode)
            pending = self._pending_async_error()
            if pending == SUCCESS:
                cell.value = self._captures.exchange(cell.value)
            return pending
        return forward

    @GUEST.serves("cuStreamBeginCapture")
    def _begin_capture(self, call: DriverCall) -> Callable[..., int]:
        asked = self._generic(call)

        def forward(stream: int | None, mode: int) -> int:
            status = asked(stream, mode)
            if status == SUCCESS:
                self._captures.began(stream or 0, mode)
            return status
        return forward

    @GUEST.serves("cuStreamEndCapture")
    def _end_capture(self, call: DriverCall) -> Callable[..., int]:
        """A capture another thread began, not RELAXED, is that thread's to end (capture_owners.py): answered here,
        since the host thread began them all."""
        asked = self._generic(call)

        def forward(stream: int | None, graph: int | None) -> int:
            if graph and self._captures.begun_elsewhere(stream or 0):
                pending = self._pending_async_error()
                return pending if pending != SUCCESS else CAPTURE_WRONG_THREAD
            status = asked(stream, graph)
            self._captures.ended(stream or 0, status)
            return status
        return forward

    @GUEST.serves("cuStreamGetCaptureInfo")
    def _capture_info(self, call: DriverCall) -> Callable[..., int]:
        """The capture's status, id and graph, and the arrays of its dependencies and their edges' data, as
        native/answered_in_guest.c answers them: the arrays are this thread's and stay valid until its next call
        here, as the driver's stay valid until the next call on the stream. Edges with data of their own and no
        `edges` to write it to: the driver's CUDA_ERROR_LOSSY_QUERY."""
        kept = threading.local()

        def forward(stream: int | None, status: int | None, ident: int | None, graph: int | None,
                    dependencies: int | None, edges: int | None, count: int | None) -> int:
            if not status:
                return INVALID_VALUE
            answer, reply = self._call(call, call.request.encode(stream or 0))
            if answer != SUCCESS or reply is None:
                return answer
            state, number, made, items, edge_items = call.reply.decode(reply.payload)  # [Q]: 1-tuples
            nodes, data = [node for (node,) in items], [edge for (edge,) in edge_items]
            if data and len(data) != len(nodes):
                return NOT_SUPPORTED  # a reply that does not read as one: the native twin's answer too
            data = data or [0] * len(nodes)  # no data: default edges
            if not edges and any(data):
                return LOSSY_QUERY
            kept.nodes = (ctypes.c_uint64 * max(len(nodes), 1))(*nodes)
            kept.edges = (ctypes.c_uint64 * max(len(data), 1))(*data)
            ctypes.c_int32.from_address(status).value = state
            for address, value in ((ident, number), (graph, made)):
                if address:
                    ctypes.c_uint64.from_address(address).value = value
            for address, array in ((dependencies, kept.nodes), (edges, kept.edges)):
                if address:
                    ctypes.c_void_p.from_address(address).value = ctypes.addressof(array) if nodes else None
            if count:
                ctypes.c_size_t.from_address(count).value = len(nodes)
            return SUCCESS
        return forward

    @GUEST.serves("cuCtxCreate")
    def _ctx_create(self, call: DriverCall) -> Callable[..., int]:
        def forward(pctx: int | None, params: int | None, flags: int, dev: int) -> int:
            if not pctx:
                return INVALID_VALUE
            # CUctxCreateParams {CUexecAffinityParam *, int count, CUctxCigParam *}: an empty one is no params
            if params and any(struct.unpack("<QiiQ", ctypes.string_at(params, 24))[i] for i in (0, 1, 3)):
                return self._not_forwarded("cuCtxCreate with execution-affinity or CIG parameters")
            status, reply = self._call(call, call.request.encode(flags, dev))
            if status == SUCCESS and reply is not None:
                (ctx,) = call.reply.decode(reply.payload)
                ctypes.c_uint64.from_address(pctx).value = ctx
                self._contexts.push(ctx)  # the new context is current to the calling thread, on the host too
                self._contexts.host_current = ctx
            return status
        return forward

    # Context stacks are per thread and kept here (contexts.py); the host is told a context only to check that
    # the session may use it, and before calls (_sync_context).
    @GUEST.serves("cuCtxDestroy")
    def _ctx_destroy(self, call: DriverCall) -> Callable[..., int]:
        def forward(ctx: int | None) -> int:
            status, _ = self._call(call, call.inputs.pack(ctx or 0))
            if status == SUCCESS:
                self._contexts.destroyed(ctx or 0)
                self._streams.clear()  # its streams went with it
            return status
        return forward

    @GUEST.serves("cuCtxGetCurrent")
    def _ctx_get_current(self, call: DriverCall) -> Callable[..., int]:
        def forward(pctx: int | None) -> int:
            if not self._initialized:
                return NOT_INITIALIZED
            if not pctx:
                return INVALID_VALUE
            ctypes.c_uint64.from_address(pctx).value = self._contexts.current()
            return SUCCESS
        return forward

    def _make_current_on_host(self, ctx: int) -> int:
        """Check `ctx` is the session's by making it the host's current context (synchronously)."""
        channel = self.channel()
        if channel is None or not self._initialized:
            return NOT_INITIALIZED
        try:
            reply = channel.call(SET_CURRENT.opcode, SET_CURRENT.inputs.pack(ctx))
        except WireError as exc:  # the host ended the session while this call waited: an answer, not a raise
            return self._not_carried(exc)
        if reply.status == SUCCESS:
            self._contexts.host_current = ctx
        else:
            self._contexts.host_current = UNKNOWN_CONTEXT
        return reply.status if reply.status >= 0 else UNKNOWN

    @GUEST.serves("cuCtxSetCurrent")
    def _ctx_set_current(self, call: DriverCall) -> Callable[..., int]:
        def forward(ctx: int | None) -> int:
            status = self._make_current_on_host(ctx) if ctx else (SUCCESS if self._initialized else NOT_INITIALIZED)
            if status == SUCCESS:
                self._contexts.set_current(ctx or 0)
            return status
        return forward

    @GUEST.serves("cuCtxPushCurrent")
    def _ctx_push_current(self, call: DriverCall) -> Callable[..., int]:
        def forward(ctx: int | None) -> int:
            if not ctx:
                return INVALID_VALUE
            status = self._make_current_on_host(ctx)
            if status == SUCCESS:
                self._contexts.push(ctx)
            return status
        return forward

    @GUEST.serves("cuCtxPopCurrent")
    def _ctx_pop_current(self, call: DriverCall) -> Callable[..., int]:
        def forward(pctx: int | None) -> int:
            if not self._initialized:
                return NOT_INITIALIZED
            popped = self._contexts.pop()
            if popped is None:
                return INVALID_CONTEXT
            if pctx:
                ctypes.c_uint64.from_address(pctx).value = popped
            return SUCCESS
        return forward

    # --- page-locked host memory (pinned_pool.py) ------------------------------------------------------------
    def _pool_ready(self, call: DriverCall) -> int:
        channel = self.channel()
        if channel is None:
            return NOT_INITIALIZED

        def map_call(address: int) -> tuple[int, int, int]:
            status, reply = self._call(call, POOL_MAP_REQUEST.encode(address), fold=False, opcode=POOL_MAP_OPCODE)
            if reply is None:
                return (status or UNKNOWN), 0, 0
            return (status, *POOL_MAP_REPLY.decode(reply.payload))
        return self._pool.setup(channel, map_call)

    @GUEST.serves("cuMemAllocHost", "cuMemHostAlloc")
    def _host_alloc(self, call: DriverCall) -> Callable[..., int]:
        with_flags = call.name == "cuMemHostAlloc"

        def forward(pp: int | None, size: int, flags: int = 0) -> int:
            if not pp:
                return INVALID_VALUE
            status = self._pool_ready(call)
            if status == SUCCESS:
                payload = call.request.encode(size, flags) if with_flags else call.request.encode(size)
                status, reply = self._call(call, payload)
                if status == SUCCESS and reply is not None:
                    ctypes.c_uint64.from_address(pp).value = call.reply.decode(reply.payload)[0]
            if status == OUT_OF_MEMORY:
                self._pool_exhausted(size)
            return status
        return forward

    def _pool_exhausted(self, size: int) -> None:
        what = f"page-locked pool: {size} bytes"
        if what not in self._named:
            self._named.add(what)
            log.warning("orion: no room for %d page-locked bytes: this channel's share of the region's pool is "
                        "%d MiB; create the region larger (orion-shm create -s MiB) or with fewer channels",
                        size, self._pool.size >> 20)

    @GUEST.serves("cuMemFreeHost")
    def _host_free(self, call: DriverCall) -> Callable[..., int]:
        def forward(pointer: int | None) -> int:
            return self._call(call, call.request.encode(pointer or 0))[0]
        return forward

    @GUEST.serves("cuMemHostGetDevicePointer")
    def _host_device_pointer(self, call: DriverCall) -> Callable[..., int]:
        def forward(pdptr: int | None, pointer: int | None, flags: int) -> int:
            if not pdptr:
                return INVALID_VALUE
            status, reply = self._call(call, call.request.encode(pointer or 0, flags))
            if status == SUCCESS and reply is not None:
                ctypes.c_uint64.from_address(pdptr).value = call.reply.decode(reply.payload)[0]
            return status
        return forward

    @GUEST.serves("cuMemHostGetFlags")
    def _host_flags(self, call: DriverCall) -> Callable[..., int]:
        def forward(pflags: int | None, pointer: int | None) -> int:
            if not pflags:
                return INVALID_VALUE
            status, reply = self._call(call, call.request.encode(pointer or 0))
            if status == SUCCESS and reply is not None:
                ctypes.c_uint.from_address(pflags).value = call.reply.decode(reply.payload)[0]
            return status
        return forward

    # A copy's request is its device range (and stream) in the table's fixed part, then the data as its tail,
    # streamed from the program's buffer; the pinned variant names the host buffer's pool address instead.
    @GUEST.serves("cuMemcpyHtoD", "cuMemcpyHtoDAsync")
    def _htod(self, call: DriverCall) -> Callable[..., int]:
        is_async = call.name.endswith("Async")
        prefix_of, pinned = call.request.fixed.pack, call.pinned

        def forward(dst: int, src: int | None, size: int, stream: int | None = None) -> int:
            if size and not src:
                return INVALID_VALUE
            fields = (dst, size, stream or 0) if is_async else (dst, size)
            # the host reads the shared pages, in stream order: after the stream's earlier work, which may write them
            if pinned is not None and self._pool.contains(src or 0, size):
                return self._pinned_copy(call, pinned.encode(*fields, src))
            posted = self._posted_as_the_driver_would(dst, size, stream if is_async else None)
            if size > PAGEABLE_PIECE:
                return _in_pieces(lambda at, n: forward(dst + at, (src or 0) + at, n, stream), size)
            data = _view(src or 0, size) if size else memoryview(b"")
            payload = _Prefixed(prefix_of(*fields), data).payload()
            if posted:
                pending = self._pending_async_error()
                return self._post(call, payload) if pending == SUCCESS else pending
            status, _ = self._call(call, payload)
            return status
        return forward

    def _posted_as_the_driver_would(self, dst: int, size: int, stream: int | None) -> bool:
        """native/copy_calls.c's rule: a copy to the device returns once its bytes are taken, as the driver's
        pageable copy does, when nothing the driver checks first can fail: synchronous, on a default stream
        or on one this process created in the current context and has not destroyed, into memory this process
        allocated, initialised, a context current, no capture possibly under way, and the GPU not known to be gone
        (a relay that lost its GPU host answers the copy itself)."""
        current = self._contexts.current()
        return (size > 0 and self._initialized and bool(current)
                and (stream is None or stream <= 2 or self._streams.get(stream) == current)
                and not self._captures and not self._unavailable and self._device_memory.holds(dst, size))

    @GUEST.serves("cuMemcpyDtoH", "cuMemcpyDtoHAsync")
    def _dtoh(self, call: DriverCall) -> Callable[..., int]:
        is_async = call.name.endswith("Async")
        request, pinned = call.request, call.pinned

        def forward(dst: int | None, src: int, size: int, stream: int | None = None) -> int:
            if size and not dst:
                return INVALID_VALUE
            fields = (src, size, stream or 0) if is_async else (src, size)
            if pinned is not None and self._pool.contains(dst or 0, size):  # the host writes the shared pages
                return self._pinned_copy(call, pinned.encode(*fields, dst))
            if size > PAGEABLE_PIECE:
                return _in_pieces(lambda at, n: forward((dst or 0) + at, src + at, n, stream), size)
            payload = request.fixed.pack(*fields)
            cursor = BufferCursor(_view(dst or 0, size)) if size else None
            status, reply = self._call(call, payload, sink=cursor.sink if cursor else None)
            if status == SUCCESS and reply is not None and reply.payload and cursor is not None:
                cursor.view[:len(reply.payload)] = reply.payload  # a small copy came back inline: its tail
            return status
        return forward

    def _pinned_copy(self, call: DriverCall, payload: bytes) -> int:
        """An async copy with page-locked memory is posted (it runs in stream order on the host, as natively);
        a synchronous one waits for the host's copy to end."""
        if call.name.endswith("Async"):
            return self._post(call, payload, opcode=call.opcode + PINNED_COPY)
        return self._call(call, payload, opcode=call.opcode + PINNED_COPY)[0]

    @GUEST.serves("cuModuleLoadData")
    def _module_load(self, call: DriverCall) -> Callable[..., int]:
        def forward(pmodule: int | None, image: int | None) -> int:
            if not pmodule or not image:
                return INVALID_VALUE
            return self._load_image(call, pmodule, image)
        return forward

    def _load_image(self, call: DriverCall, out: int, address: int, *head: object) -> int:
        """Ship the module image at `address` (its length derived from the image) as the request's tail, after
        the fields `head` (JIT options) if the request has any, and store the new handle in `out`."""
        image = _image_view(address)
        if image is None:
            return INVALID_IMAGE
        prefix = call.request.encode_head(*head) if head else b""
        status, reply, digest = IMAGE_NOT_CACHED, None, b""
        if len(image) >= IMAGE_BY_DIGEST_MIN and self._image_drops < IMAGE_DROPS_TO_STOP:
            # The agent keeps every image sent whole (under the digest it computes): ask for it by digest first.
            digest = hashlib.sha256(image).digest()
            status, reply = self._call(call, IMAGE_BY_DIGEST_REQUEST.encode(len(image), digest, prefix),
                                       opcode=call.opcode + IMAGE_BY_DIGEST)
            if status != IMAGE_NOT_CACHED:
                self._images_held.add(digest)
            elif digest in self._images_held:
                self._images_held.discard(digest)
                self._image_drops += 1
        if status == IMAGE_NOT_CACHED:
            status, reply = self._call(call, _Prefixed(prefix, image).payload() if prefix else image)
            if digest and status == SUCCESS:
                self._images_held.add(digest)
        if status == SUCCESS and reply is not None:
            ctypes.c_uint64.from_address(out).value = call.reply.decode(reply.payload)[0]
        return status

    @GUEST.serves("cuLibraryLoadData")
    def _library_load(self, call: DriverCall) -> Callable[..., int]:
        """JIT options as cuModuleLoadDataEx's. Of the library options, CU_LIBRARY_BINARY_IS_PRESERVED (1) is a
        promise about the guest's copy of the image, which the host never sees: dropped; the other names host
        function tables: not forwarded."""
        def forward(plib: int | None, code: int | None, jit_options: int | None, jit_values: int | None,
                    njit: int, library_options: int | None, _lv: Any, nlib: int) -> int:
            if not plib or not code or (njit and (not jit_options or not jit_values)) or (nlib and not library_options):
                return INVALID_VALUE
            for option in (ctypes.c_int * nlib).from_address(library_options) if nlib and library_options else ():
                if option != LIBRARY_BINARY_IS_PRESERVED:
                    return self._not_forwarded(f"cuLibraryLoadData library option {option}")
            return self._load_with_jit_options(call, plib, code, njit, jit_options, jit_values)
        return forward

    @GUEST.serves("cuModuleGetFunction", "cuModuleGetGlobal", "cuLibraryGetKernel", "cuLibraryGetGlobal")
    def _by_name(self, call: DriverCall) -> Callable[..., int]:
        """cuModuleGetFunction/GetGlobal, cuLibraryGetKernel/GetGlobal: outputs first, then owner and name."""
        n_out = sum(1 for p in call.params if p.role == OUT)
        ctypes_out = [CTYPES[p.code] for p in call.params if p.role == OUT]

        def forward(*args: Any) -> int:
            outs, owner, name = args[:n_out], args[n_out], args[n_out + 1]
            if not name or (n_out == 1 and not outs[0]):
                return INVALID_VALUE
            status, reply = self._call(call, call.request.encode(owner or 0, ctypes.string_at(name)))
            if status == SUCCESS and reply is not None:
                values = call.reply.decode(reply.payload)
                for pointer, ctype, value in zip(outs, ctypes_out, values, strict=True):
                    if pointer:
                        ctype.from_address(pointer).value = value
                if call.name == "cuLibraryGetKernel":
                    self._param_layouts.kernel_made(values[0])
                elif call.name.endswith("GetGlobal"):
                    self._device_memory.add(values[0], values[1])
            return status
        return forward

    def _not_forwarded(self, what: str) -> int:
        """CUDA_ERROR_NOT_SUPPORTED for something the table does not forward, named once."""
        if what not in self._named:
            self._named.add(what)
            log.warning("orion: %s is not forwarded yet", what)
        return NOT_SUPPORTED

    @GUEST.serves("cuModuleLoadDataEx")
    def _module_load_ex(self, call: DriverCall) -> Callable[..., int]:
        """Scalar JIT options travel as (option, value) pairs; log and wall-time options name guest memory, so
        the guest answers them itself after the call (an empty log, size 0, no time) and the host never sees
        them (the request: JIT options, then the image)."""
        def forward(pmodule: int | None, image: int | None, count: int, options: int | None,
                    values: int | None) -> int:
            if not pmodule or not image or (count and (not options or not values)):
                return INVALID_VALUE
            return self._load_with_jit_options(call, pmodule, image, count, options, values)
        return forward

    def _load_with_jit_options(self, call: DriverCall, out: int, image: int, count: int, options: int | None,
                               values: int | None) -> int:
        keys = list((ctypes.c_int * count).from_address(options)) if count and options else []
        slots = (ctypes.c_uint64 * count).from_address(values) if count and values else None
        pairs: list[tuple[int, int]] = []
        guest: dict[int, int] = {}  # guest-memory option -> its slot index
        for index, option in enumerate(keys):
            if option in JIT_SCALAR_OPTIONS:
                pairs.append((option, slots[index] if slots is not None else 0))
            elif option in JIT_GUEST_OPTIONS:
                guest[option] = index
            else:
                return self._not_forwarded(f"{call.name} JIT option {_jit_option_name(option)}")
        status = self._load_image(call, out, image, pairs)
        if slots is not None:
            _empty_logs(slots, guest)
        return status

    @GUEST.serves("cuPointerGetAttribute")
    def _pointer_attribute(self, call: DriverCall) -> Callable[..., int]:
        """The host answers the value and its width; `width` bytes of the value go to `data`."""
        def forward(data: int | None, attribute: int, pointer: int | None) -> int:
            if not data:
                return INVALID_VALUE
            status, reply = self._call(call, call.request.encode(attribute, pointer or 0))
            if status == SUCCESS and reply is not None:
                value, width = call.reply.decode(reply.payload)
                if width not in (4, 8):
                    return UNKNOWN
                ctypes.memmove(data, value.to_bytes(8, "little")[:width], width)
            return status
        return forward

    @GUEST.serves("cuMemPoolGetAttribute")
    def _pool_get_attribute(self, call: DriverCall) -> Callable[..., int]:
        def forward(pool: int | None, attribute: int, value: int | None) -> int:
            if not value:
                return INVALID_VALUE
            status, reply = self._call(call, call.request.encode(pool or 0, attribute))
            if status == SUCCESS and reply is not None:
                (number,) = call.reply.decode(reply.payload)
                ctype = ctypes.c_uint64 if attribute in POOL_ATTRIBUTES_64 else ctypes.c_int
                ctype.from_address(value).value = number
            return status
        return forward

    @GUEST.serves("cuMemPoolSetAttribute")
    def _pool_set_attribute(self, call: DriverCall) -> Callable[..., int]:
        def forward(pool: int | None, attribute: int, value: int | None) -> int:
            if not value:
                return INVALID_VALUE
            ctype = ctypes.c_uint64 if attribute in POOL_ATTRIBUTES_64 else ctypes.c_int
            number = ctype.from_address(value).value & 0xFFFFFFFFFFFFFFFF
            status, _ = self._call(call, call.request.encode(pool or 0, attribute, number))
            return status
        return forward

    @GUEST.serves("cuMemcpy", "cuMemcpyAsync")
    def _uva_copy(self, call: DriverCall) -> Callable[..., int]:
        """cuMemcpy(Async) with unified addressing: pick the direction from where each pointer lies."""
        is_async = call.name.endswith("Async")
        is_device = self._device_memory.contains
        suffix = "Async" if is_async else ""
        names = {(True, False): "cuMemcpyHtoD" + suffix, (False, True): "cuMemcpyDtoH" + suffix,
                 (True, True): "cuMemcpyDtoD" + suffix}

        def forward(dst: int | None, src: int | None, size: int, stream: int | None = None) -> int:
            dst, src = dst or 0, src or 0
            if not size:
                return SUCCESS
            on_device = (is_device(dst), is_device(src))
            if on_device == (False, False):
                if not dst or not src:
                    return INVALID_VALUE
                ctypes.memmove(dst, src, size)  # host to host: nothing for the GPU to do
                return SUCCESS
            target = self._impls[names[on_device]]
            return target(dst, src, size, stream) if is_async else target(dst, src, size)
        return forward

    def _launch_payload(self, call: DriverCall, function: int, head: tuple[int, ...], params: int | None,
                        extra: int | None, attributes: bytes | None = None) -> bytes | None:
        """The launch's request: its configuration, cuLaunchKernelEx's attributes (as the 72-byte
        CUlaunchAttributes they are in the program's memory), then the packed parameters as the tail."""
        if params:
            known = self._layout(function)
            if known is None:
                return None
            packed = pack_checked(params, *known)
        elif extra:
            packed = params_from_extra(extra) or b""
        else:
            packed = b""
        if attributes is None:  # the hot path: the fixed part, then the tail
            return call.request.fixed.pack(function, *head) + packed
        return call.request.encode_head(function, *head, attributes) + packed

    @GUEST.serves("cuLaunchKernel", "cuLaunchCooperativeKernel")
    def _launch(self, call: DriverCall) -> Callable[..., int]:
        """cuLaunchCooperativeKernel (no `extra`) is posted as cuLaunchKernel is, with the same payload; the host
        rebuilds a kernelParams array."""
        def forward(f: int | None, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shmem: int,
                    stream: int | None, params: int | None, extra: int | None = None) -> int:
            try:
                payload = self._launch_payload(call, f or 0, (gx, gy, gz, bx, by, bz, shmem, stream or 0), params,
                                               extra)
            except ValueError as exc:  # NULL or malformed kernelParams/extra: what the driver would refuse too
                log.warning("orion: %s: %s", call.name, exc)
                return INVALID_VALUE
            return NOT_INITIALIZED if payload is None else self._post(call, payload)
        return forward

    @GUEST.serves("cuGetProcAddress")
    def _get_proc_address(self, call: DriverCall) -> Callable[..., int]:
        """The trampoline that serves the symbol in this process, so a function found this way is forwarded too.
        A symbol the capsules do not have: NULL and CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND with CUDA_SUCCESS, as the
        driver answers (H200, driver 580); without a status pointer to say so, CUDA_ERROR_NOT_FOUND."""
        from . import capsule_hook

        def forward(symbol: int | None, pfn: int | None, version: int, flags: int, status_out: int | None) -> int:
            if not symbol or not pfn:
                return INVALID_VALUE
            address = capsule_hook.trampoline_address("cuda.bindings.cydriver", ctypes.string_at(symbol).decode())
            ctypes.c_void_p.from_address(pfn).value = address or None
            if status_out:  # CU_GET_PROC_ADDRESS_SUCCESS 0, _SYMBOL_NOT_FOUND 1
                ctypes.c_int.from_address(status_out).value = 0 if address else 1
            return SUCCESS if address or status_out else NOT_FOUND
        return forward

    @GUEST.serves("cuOccupancyMaxPotentialBlockSize", "cuOccupancyMaxPotentialBlockSizeWithFlags")
    def _potential_block_size(self, call: DriverCall) -> Callable[..., int]:
        with_flags = call.name.endswith("WithFlags")

        def forward(min_grid: int | None, block: int | None, function: int | None, callback: int | None,
                    dynamic: int, limit: int, flags: int = 0) -> int:
            if not min_grid or not block:
                return INVALID_VALUE
            if callback:
                status, grid_size, block_size = PotentialBlockSize(self._impls).search(function or 0, callback,
                                                                                        limit, flags)
            else:
                fields = (function or 0, dynamic, limit) + ((flags,) if with_flags else ())
                status, reply = self._call(call, call.request.encode(*fields))
                grid_size, block_size = call.reply.decode(reply.payload) if status == SUCCESS and reply else (0, 0)
            if status == SUCCESS:
                ctypes.c_int.from_address(min_grid).value = grid_size
                ctypes.c_int.from_address(block).value = block_size
            return status
        return forward

    @GUEST.serves("cuLaunchKernelEx")
    def _launch_ex(self, call: DriverCall) -> Callable[..., int]:
        def forward(config: int | None, f: int | None, params: int | None, extra: int | None) -> int:
            if not config:
                return INVALID_VALUE
            c = LaunchConfig.from_address(config)
            if c.numAttrs and not c.attrs:
                return INVALID_VALUE
            attributes = ctypes.string_at(c.attrs, c.numAttrs * LAUNCH_ATTRIBUTE.size) if c.numAttrs else b""
            for identifier, _value in LAUNCH_ATTRIBUTE.iter_unpack(attributes):
                if identifier not in FORWARDED_LAUNCH_ATTRIBUTES:
                    name = _launch_attribute_name(identifier)
                    return self._not_forwarded(f"cuLaunchKernelEx launch attribute {name}")
            head = (c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY, c.blockDimZ, c.sharedMemBytes,
                    c.hStream or 0)
            try:
                payload = self._launch_payload(call, f or 0, head, params, extra, attributes)
            except ValueError as exc:
                log.warning("orion: cuLaunchKernelEx: %s", exc)
                return INVALID_VALUE
            return NOT_INITIALIZED if payload is None else self._post(call, payload)
        return forward


IMAGE_DROPS_TO_STOP = 2  # noted digests answered "not cached": the agent is not keeping images (cache off or full)


def _image_view(address: int) -> memoryview | None:
    """The module image at `address` (cubin, fatbin, PTX, or the fatbin a wrapper points at), or None."""
    try:
        span = locate(address)
    except ImageError as exc:
        log.warning("orion: not a module image CUDA would load: %s", exc)
        return None
    return _view(span.address, span.length)


class _Prefixed:
    """A small prefix then a caller's buffer, sent without first gluing them into one copy."""

    def __init__(self, prefix: bytes, data: memoryview) -> None:
        self.prefix, self.data = prefix, data

    def payload(self) -> bytes | Streamed:
        total = len(self.prefix) + len(self.data)
        if total <= 480:
            return self.prefix + bytes(self.data)
        position = -len(self.prefix)

        def fill(chunk: memoryview) -> None:
            nonlocal position
            start = 0
            if position < 0:
                chunk[:len(self.prefix)] = self.prefix
                start, position = len(self.prefix), 0
            end = position + len(chunk) - start
            chunk[start:] = self.data[position:end]
            position = end
        return Streamed(total, fill)


def _empty_logs(slots: ctypes.Array[ctypes.c_uint64], guest: dict[int, int]) -> None:
    """After cuModuleLoadDataEx: the guest's log buffers hold an empty NUL-terminated log, their sizes 0 and
    CU_JIT_WALL_TIME 0.0 ms (a float in its slot: all zero bits)."""
    for buffer, size in ((JIT_INFO_LOG_BUFFER, JIT_INFO_LOG_SIZE), (JIT_ERROR_LOG_BUFFER, JIT_ERROR_LOG_SIZE)):
        if buffer in guest and size in guest:
            address, capacity = slots[guest[buffer]], slots[guest[size]] & 0xFFFFFFFF
            if address and capacity:
                ctypes.c_char.from_address(address).value = b"\0"
        if size in guest:
            slots[guest[size]] = 0
    if JIT_WALL_TIME in guest:
        slots[guest[JIT_WALL_TIME]] = 0


def _launch_attribute_name(identifier: int) -> str:
    try:
        from cuda.bindings import driver  # already imported: we are called from it
        return f"{driver.CUlaunchAttributeID(identifier).name} ({identifier})"
    except (ImportError, ValueError):
        return str(identifier)


def _jit_option_name(option: int) -> str:
    try:
        from cuda.bindings import driver  # already imported: we are called from it
        return f"{driver.CUjit_option(option).name} ({option})"
    except (ImportError, ValueError):
        return str(option)
