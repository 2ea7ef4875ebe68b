"""Both guest clients driven through one program against a host that records every request record raw: the rig of
tests/unit/test_guest_clients_agree.py.

The host is a real `RegionServer` (host_agent/daemon/region_server.py) in a forked child, as tests/forwarding_rig.py
runs
one, whose session handler (`Recorder`) appends every request record -- opcode, flags, payload -- to a file of its
session and answers it as the call table declares: SUCCESS with a reply of the table's reply schema whose values are
derived from the request's own bytes (`answer`), so two clients that send the same request get the same reply
whatever came before it, and the clients' handles are the same numbers. HELLO is answered as the agent answers it;
a load by image digest with "not cached" (the image then travels whole); a parameter-layout query from `LAYOUTS`.

The clients run `program()`: one list of steps, each a few driver calls through an `Api`, which is either the
native library's entry points (`NativeApi`: ctypes, in a child process, `python -m tests.guest_clients native
LIBRARY`, ORION_SHM naming the region) or the capsule path's `Forwarder.implementations()` (`CapsuleApi`, in the
calling process, connected as guest_runtime/activate.py connects it). Before each step a client sends a marker
record (ECHO, `orion-agree:<client>:<index>`) straight on its channel, outside any driver call, and after the last
one an `end` marker, so the host's file splits into the records each step sent (`read_captures`). Each step also
returns what the program saw (statuses, the bytes written to its outputs), compared too.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import multiprocessing
import os
import signal
import struct
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from host_agent.daemon.region_server import RegionServer
from host_agent.diagnostics import DiagnosticsHandler
from host_agent.handler import Reply, Session
from host_agent.session_loop import ServerOptions
from host_agent.stop import StopRequest
from ivshmem import layout
from ivshmem.driver_api import (
    BY_OPCODE,
    CALLS,
    HANDLES,
    IMAGE_BY_DIGEST,
    IMAGE_NOT_CACHED,
    IN,
    INOUT,
    OUT,
    PINNED_COPY,
    POINTER_ATTRIBUTE_WIDTHS,
    POINTER_HANDLES,
    POOL_MAP_OPCODE,
    POOL_MAP_REPLY,
    POOL_MAP_REQUEST,
    DriverCall,
    LaunchConfig,
    table_digest,
    wire_code,
)
from ivshmem.record import Flag, Op, Record

MARK = int(Op.ECHO)  # the marker record: answered with an empty payload
MARK_PREFIX = b"orion-agree:"
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
SUCCESS, INVALID_VALUE, NOT_SUPPORTED = 0, 1, 801
RECORD_HEAD = struct.Struct("<IIQ")  # opcode, flags, payload length; then the payload (the recorder's files)

# Handles the host gives out by name, and the parameter layouts it answers for them (cuFuncGetParamInfo /
# cuKernelGetParamInfo: (offset, size) per parameter, then CUDA_ERROR_INVALID_VALUE past the last one).
F_NOARGS, F_MIX, F_WIDE, K_MIX = 0x6F00_0000_1000, 0x6F00_0000_2000, 0x6F00_0000_3000, 0x6F00_0000_4000
G_COUNTER = 0x7F20_0000_0000
MIX_LAYOUT = [(0, 8), (8, 4), (12, 1), (16, 8), (24, 12)]  # u64, s32, u8, f64, .b8[12] (bytes 13-15 padding)
LAYOUTS: dict[int, list[tuple[int, int]]] = {F_NOARGS: [], F_MIX: MIX_LAYOUT, F_WIDE: [(0, 4), (8, 3000)],
                                             K_MIX: MIX_LAYOUT}
FUNCTIONS = {b"noargs": F_NOARGS, b"mix": F_MIX, b"wide": F_WIDE}
KERNELS = {b"kmix": K_MIX}
DEVICE_NAME = b"Orion agreement GPU"


# --- the host ------------------------------------------------------------------------------------------------------

def _hash(opcode: int, payload: bytes, index: int) -> int:
    return zlib.crc32(payload, (opcode << 8) ^ index)


def value_of(kind: str, opcode: int, payload: bytes, index: int) -> Any:
    """Reply field `index` of kind `kind`: a function of the request alone."""
    h = _hash(opcode, payload, index)
    if kind == "u64":
        return 0x6600_0000_0000 | (h << 4)  # a non-zero, aligned handle or device address
    if kind in ("i32", "u32"):
        return 1 + h % 997
    if kind == "u8":
        return 1 + h % 200
    if kind == "u16":
        return 1 + h % 60000
    if kind == "f32":
        return (h % 1000) / 8
    if kind in ("i64", "f64"):
        return 1 + h % 9973
    if kind == "str":
        return ""
    if kind in ("bytes", "tail"):
        return b""
    return []  # a counted array


def answer(opcode: int, flags: int, payload: bytes) -> Reply:
    """The recording host's reply to one CUDA request (see the module docstring)."""
    if opcode & IMAGE_BY_DIGEST and opcode & ~IMAGE_BY_DIGEST in BY_OPCODE:
        return Reply(IMAGE_NOT_CACHED)  # the client then sends the image whole
    if opcode & PINNED_COPY and opcode & ~PINNED_COPY in BY_OPCODE:
        return Reply(SUCCESS)  # a copy with page-locked memory: no bytes either way
    call = BY_OPCODE.get(opcode)
    if call is None:
        return Reply(NOT_SUPPORTED)
    if flags & Flag.NO_REPLY:
        return Reply(SUCCESS)
    name = call.name
    if name in ("cuFuncGetParamInfo", "cuKernelGetParamInfo"):
        function, index = call.inputs.unpack(payload)
        if function in LAYOUTS:
            known = LAYOUTS[function]
            return Reply(SUCCESS, call.outputs.pack(*known[index])) if index < len(known) else Reply(INVALID_VALUE)
    special = _SPECIAL.get(name)
    if special is not None:
        return Reply(SUCCESS, special(call, payload))
    values = [value_of(kind, opcode, payload, i) for i, (_field, kind) in enumerate(call.reply.fields)]
    return Reply(SUCCESS, call.reply.encode(*values))


def _copy_to_host(call: DriverCall, payload: bytes) -> bytes:
    size = call.request.decode(payload)[1]
    block = hashlib.sha256(payload).digest()
    return (block * (size // len(block) + 1))[:size]


def _by_name(table: dict[bytes, int]) -> Callable[[DriverCall, bytes], bytes]:
    def reply(call: DriverCall, payload: bytes) -> bytes:
        _owner, name = call.request.decode(payload)
        return call.reply.encode(table.get(bytes(name).rstrip(b"\0"), value_of("u64", call.opcode, payload, 0)))
    return reply


def _global(call: DriverCall, payload: bytes) -> bytes:
    _owner, name = call.request.decode(payload)
    if bytes(name).rstrip(b"\0") == b"counter":
        return call.reply.encode(G_COUNTER, 16)
    return call.reply.encode(value_of("u64", call.opcode, payload, 0), 64)


def _pointer_attribute(call: DriverCall, payload: bytes) -> bytes:
    attribute, _pointer = call.request.decode(payload)
    width = POINTER_ATTRIBUTE_WIDTHS.get(attribute, 8)
    return call.reply.encode(value_of("u64", call.opcode, payload, 0) & ((1 << (8 * width)) - 1), width)


_SPECIAL: dict[str, Callable[[DriverCall, bytes], bytes]] = {
    "cuDeviceGetName": lambda call, payload: DEVICE_NAME,
    "cuDeviceGetUuid": lambda call, payload: hashlib.sha256(payload).digest()[:16],
    "cuGetErrorName": lambda call, payload: b"CUDA_ERROR_%d" % call.request.decode(payload)[0],
    "cuGetErrorString": lambda call, payload: b"error text %d" % call.request.decode(payload)[0],
    "cuMemcpyDtoH": _copy_to_host,
    "cuMemcpyDtoHAsync": _copy_to_host,
    "cuModuleGetFunction": _by_name(FUNCTIONS),
    "cuLibraryGetKernel": _by_name(KERNELS),
    "cuModuleGetGlobal": _global,
    "cuLibraryGetGlobal": _global,
    "cuPointerGetAttribute": _pointer_attribute,
}


PAGE = 4096
DEVICE_VIEW = 0x7E00_0000_0000  # where cuMemHostGetDevicePointer says the GPU sees the pool slice


class Recorder:
    """A session's handler: records each request raw (`RECORD_HEAD` then the payload) in `<log_dir>/session-<n>`,
    then answers it. HELLO is the agent's own answer (DiagnosticsHandler, serving this table). The page-locked pool's
    bookkeeping is answered as the agent's is (host_agent/session/pinned_pool.py), at the address the guest proposed:
    memory
    handed out from the start of the slice, page by page, and what a reply says of it relative to the slice (so both
    clients, whose slices lie at different addresses, are told the same)."""

    def __init__(self, session: Session, log_dir: str) -> None:
        self.hello = DiagnosticsHandler(session)
        self.hello.call_table = table_digest()
        self.log = open(os.path.join(log_dir, f"session-{session.number}"), "ab")  # noqa: SIM115 (the worker's life)
        self.pool_base = self.pool_size = self.pool_used = 0
        self.pool_flags: dict[int, int] = {}

    def attach_channel(self, region: Any, index: int) -> None:
        self.pool_size = region.geometry.pool_slice(index)[1]

    def pool(self, opcode: int, payload: bytes) -> Reply | None:
        """POOL_MAP and the pool's bookkeeping calls; None for any other record."""
        if opcode == POOL_MAP_OPCODE:
            (self.pool_base,) = POOL_MAP_REQUEST.decode(payload)
            return Reply(SUCCESS, POOL_MAP_REPLY.encode(self.pool_base, self.pool_size))
        call = BY_OPCODE.get(opcode)
        name = call.name if call is not None else ""
        if call is None or name not in ("cuMemAllocHost", "cuMemHostAlloc", "cuMemFreeHost", "cuMemHostGetFlags",
                                        "cuMemHostGetDevicePointer"):
            return None
        values = call.request.decode(payload)
        if name in ("cuMemAllocHost", "cuMemHostAlloc"):
            offset = self.pool_used
            self.pool_used += -(-max(values[0], 1) // PAGE) * PAGE
            self.pool_flags[offset] = values[1] if len(values) > 1 else 0
            return Reply(SUCCESS, call.reply.encode(self.pool_base + offset))
        offset = values[0] - self.pool_base
        if name == "cuMemHostGetFlags":
            return Reply(SUCCESS, call.reply.encode(self.pool_flags.get(offset, 0)))
        if name == "cuMemHostGetDevicePointer":
            return Reply(SUCCESS, call.reply.encode(DEVICE_VIEW + offset))
        return Reply(SUCCESS)  # cuMemFreeHost

    def sink_for(self, opcode: int, length: int) -> None:
        return None  # staged requests are assembled whole: they are recorded whole

    def handle(self, record: Record) -> Reply:
        payload = bytes(record.payload)
        self.log.write(RECORD_HEAD.pack(record.opcode, record.flags, len(payload)) + payload)
        self.log.flush()  # before the reply: a client that has its reply finds its request on file
        if record.opcode == Op.HELLO:
            return self.hello.handle(record)
        if record.opcode == MARK:
            return Reply(SUCCESS)
        return self.pool(record.opcode, payload) or answer(record.opcode, record.flags, payload)


def _serve(path: str, log_dir: str) -> None:
    """Child process body: serve `path` with Recorder sessions until SIGTERM."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: never outlive the tests
    stop = StopRequest().on_signals()
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    RegionServer(path, lambda session: Recorder(session, log_dir),
                 ServerOptions(heartbeat_timeout=5.0, scan_interval=0.01), stop).serve_forever()


class RecordingHost:
    """The recording host serving the region file `path` (32 MiB of zeros, or formatted), in a forked child."""

    def __init__(self, path: str, log_dir: Path) -> None:
        self.path, self.log_dir = path, log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.process = multiprocessing.get_context("fork").Process(target=_serve, args=(path, str(log_dir)),
                                                                   name="recording-oriond")
        self.process.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with open(path, "rb") as f:
                raw = os.pread(f.fileno(), 16, layout.AGENT_HEARTBEAT)
            _beat, pid, state = struct.unpack("<QII", raw)
            if state == layout.AGENT_SERVING and pid == self.process.pid:
                return
            if not self.process.is_alive():
                raise AssertionError(f"the recording host exited with {self.process.exitcode}")
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError("the recording host did not serve the region in time")
            time.sleep(0.005)

    def stop(self) -> None:
        if self.process.is_alive():
            os.kill(self.process.pid, signal.SIGTERM)  # type: ignore[arg-type]
        self.process.join(STOP_TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(STOP_TIMEOUT_S)


class Rec(NamedTuple):
    """One request record as the host read it."""
    opcode: int
    flags: int
    payload: bytes


@dataclass
class Capture:
    """One client's session: the records before its first marker (HELLO), then the records of each step."""
    preamble: list[Rec] = field(default_factory=list)
    steps: list[list[Rec]] = field(default_factory=list)
    ended: bool = False


def read_captures(log_dir: Path) -> dict[str, Capture]:
    """Each session file of `log_dir`, split at its markers, by the client its markers name."""
    captures: dict[str, Capture] = {}
    for path in sorted(log_dir.glob("session-*")):
        data = path.read_bytes()
        capture, client, position = Capture(), None, 0
        current = capture.preamble
        while position < len(data):
            opcode, flags, length = RECORD_HEAD.unpack_from(data, position)
            position += RECORD_HEAD.size
            payload = data[position:position + length]
            position += length
            if opcode == MARK and payload.startswith(MARK_PREFIX):
                who, _, what = payload[len(MARK_PREFIX):].decode().partition(":")
                client = who
                if what == "end":
                    capture.ended = True
                    current = []  # the end marker's: anything here came after the program
                    capture.steps.append(current)
                else:
                    assert int(what) == len(capture.steps), f"{path}: marker {what} out of order"
                    current = []
                    capture.steps.append(current)
                continue
            current.append(Rec(opcode, flags, payload))
        if client is not None:
            captures[client] = capture
    return captures


# --- the program both clients run ---------------------------------------------------------------------------------

class Api(Protocol):
    client: str

    def __call__(self, name: str, *args: Any) -> int: ...

    def mark(self, text: bytes) -> None: ...


Run = Callable[[Api, dict[str, Any]], Any]


@dataclass(frozen=True)
class Step:
    label: str
    kind: str  # "generic": a generic call with generated arguments; "hand": hand-written calls; "native": below
    run: Run
    call: str = ""  # the table call it is about
    # Steps only the native library runs (calls the capsule path answers CUDA_ERROR_NOT_SUPPORTED: forward.py
    # NATIVE_ONLY): the records they must send, encoded in Python with the table's own codec (the reference).
    reference: Callable[[], list[Rec]] | None = None


HANDLE_TYPES = sorted(HANDLES)
CTYPE_OF = {"i": ctypes.c_int, "I": ctypes.c_uint, "Q": ctypes.c_uint64, "q": ctypes.c_int64, "B": ctypes.c_ubyte,
            "H": ctypes.c_ushort, "f": ctypes.c_float}
SENTINEL = 0xA5


def in_value(ctype: str, position: int, extreme: bool = False) -> Any:
    """The argument a generic call gets for a parameter of C type `ctype` at `position`: from its type, and distinct
    per position, so two parameters of one type swapped on the wire are seen. `extreme`: values at the ends of the
    type's range (all-ones handles and sizes, negative ints and ordinals), where a cast or a sign goes wrong."""
    code = "Q" if ctype in HANDLES or ctype == "CUdeviceptr" else wire_code(ctype)
    if extreme:
        return {"i": -1 - position, "I": 0xFFFF_FFFF - position, "Q": 0xFFFF_FFFF_FFFF_FFFF - 0x100 * position,
                "q": -(1 << 63) + position, "B": 0xFF - position, "H": 0xFFFF - position, "f": -0.25 - position}[code]
    if ctype in HANDLES:
        return 0x4000_0000 + 0x10000 * HANDLE_TYPES.index(ctype) + 0x100 * (position + 1)
    if ctype == "CUdeviceptr":
        return 0x7F00_0000_0000 + 0x1000 * (position + 1)
    if ctype == "CUdevice":
        return position % 2  # ordinals 1 and 0: guest devices that exist
    if code == "i":
        return 2 + position  # enums and ints
    return {"I": 0x30 + position, "Q": 0x10000 + 0x111 * (position + 1), "q": -(5 + position), "B": 0xA0 + position,
            "H": 0xB0B0 + position, "f": 0.5 + position}[code]


TYPICAL, EXTREME, NULL_OUTPUTS = "", " (extreme values)", " (NULL outputs)"  # a generic step's variants: label suffix


def generic_run(call: DriverCall, variant: str) -> Run:
    """One generic call: each `in` parameter's value from its type, each `out` (and `inout`) a cell of 8 sentinel
    bytes (`inout`: holding a value from its type), or NULL (NULL_OUTPUTS). What the program sees: the status and
    the cells."""
    def run(api: Api, state: dict[str, Any]) -> Any:
        args: list[Any] = []
        cells = []
        for position, param in enumerate(call.params):
            if param.role == IN:
                args.append(in_value(param.ctype, position, variant == EXTREME))
            elif variant == NULL_OUTPUTS:
                args.append(None)
            else:
                cell = (ctypes.c_ubyte * 8)(*[SENTINEL] * 8)
                if param.role == INOUT:
                    struct.pack_into("<" + param.code, cell, 0, in_value(param.base, position, variant == EXTREME))
                cells.append(cell)
                args.append(ctypes.addressof(cell))
        status = api(call.name, *args)
        return [status, [bytes(cell).hex() for cell in cells]]
    return run


def generic_steps() -> Iterator[Step]:
    """Every generic call of the table in table order (cuInit first) with typical values, then every one again with
    extreme values, then each with outputs again with NULL outputs."""
    generic = [call for call in CALLS.values() if call.generic]
    for variant in (TYPICAL, EXTREME, NULL_OUTPUTS):
        for call in generic:
            if variant != NULL_OUTPUTS or any(p.role in (OUT, INOUT) for p in call.params):
                yield Step(call.name + variant, "generic", generic_run(call, variant), call.name)


def _u64_out(api: Api, name: str, *args: Any) -> tuple[int, int]:
    """A call whose first parameter is an 8-byte output: (status, value)."""
    cell = ctypes.c_uint64(0xA5A5A5A5A5A5A5A5)
    return api(name, ctypes.addressof(cell), *args), cell.value


def _hand(label: str, call: str) -> Callable[[Run], Step]:
    def register(run: Run) -> Step:
        step = Step(label, "hand", run, call)
        HAND_STEPS.append(step)
        return step
    return register


HAND_STEPS: list[Step] = []
PTX = (b".version 8.0\n.target sm_90\n.address_size 64\n.global .align 4 .b8 counter[16];\n"
       b".visible .entry mix(.param .u64 a, .param .s32 b, .param .u8 c, .param .f64 d, .param .align 8 .b8 e[12])\n"
       b"{\nret;\n}\n")
LARGE_PTX = PTX + b"// " + b"x" * (70 * 1024) + b"\n"  # past IMAGE_BY_DIGEST_MIN: asked by digest first
COPY_SIZES = (0, 1, 100, 440, 456, 457, 4096, 70_000, (1 << 20) + 3)
MIX_VALUES = [struct.pack("<Q", 0x7F10_0000_1000), struct.pack("<i", -7), b"\x5a", struct.pack("<d", 0.125),
              bytes(range(1, 13))]
LAUNCH_DIMS = (3, 2, 1, 64, 2, 1, 256)  # grid x y z, block x y z, shared bytes


# Contexts: the guest's stacks, and which of their changes the host hears of.
@_hand("cuCtxCreate", "cuCtxCreate")
def _ctx_create(api: Api, state: dict[str, Any]) -> Any:
    status, state["created"] = _u64_out(api, "cuCtxCreate", None, 4, 0)
    return [status, state["created"]]


@_hand("cuCtxGetCurrent", "cuCtxGetCurrent")
def _ctx_get_current(api: Api, state: dict[str, Any]) -> Any:
    return list(_u64_out(api, "cuCtxGetCurrent"))


@_hand("cuCtxSynchronize after cuCtxCreate", "cuCtxSynchronize")
def _sync_after_create(api: Api, state: dict[str, Any]) -> Any:
    return api("cuCtxSynchronize")


@_hand("cuCtxPushCurrent of a context the session has not named", "cuCtxPushCurrent")
def _push_unknown(api: Api, state: dict[str, Any]) -> Any:
    return api("cuCtxPushCurrent", 0x4242_0000)


@_hand("cuCtxPushCurrent of the context made by cuCtxCreate", "cuCtxPushCurrent")
def _push_made(api: Api, state: dict[str, Any]) -> Any:
    return api("cuCtxPushCurrent", state["created"])


@_hand("cuCtxPopCurrent twice", "cuCtxPopCurrent")
def _pop_twice(api: Api, state: dict[str, Any]) -> Any:
    return [_u64_out(api, "cuCtxPopCurrent"), _u64_out(api, "cuCtxPopCurrent")]


@_hand("cuCtxSynchronize after the pops", "cuCtxSynchronize")
def _sync_after_pops(api: Api, state: dict[str, Any]) -> Any:
    return [api("cuCtxSynchronize"), api("cuStreamSynchronize", 0x1234_5600)]


@_hand("cuCtxSetCurrent(NULL), then a call", "cuCtxSetCurrent")
def _set_null(api: Api, state: dict[str, Any]) -> Any:
    return [api("cuCtxSetCurrent", None), api("cuCtxSynchronize")]


@_hand("cuCtxSetCurrent of the context made by cuCtxCreate", "cuCtxSetCurrent")
def _set_made(api: Api, state: dict[str, Any]) -> Any:
    return api("cuCtxSetCurrent", state["created"])


@_hand("cuCtxSynchronize after cuCtxSetCurrent", "cuCtxSynchronize")
def _sync_after_set(api: Api, state: dict[str, Any]) -> Any:
    return api("cuCtxSynchronize")


# Devices and error texts.
def _name(api: Api, length: int, device: int) -> Any:
    buffer = ctypes.create_string_buffer(b"\xee" * (length + 8), length + 8)
    return [api("cuDeviceGetName", ctypes.addressof(buffer), length, device), buffer.raw.hex()]


@_hand("cuDeviceGetName 256 bytes", "cuDeviceGetName")
def _name_256(api: Api, state: dict[str, Any]) -> Any:
    return _name(api, 256, 0)


@_hand("cuDeviceGetName 5 bytes, asked again", "cuDeviceGetName")
def _name_5(api: Api, state: dict[str, Any]) -> Any:
    return _name(api, 5, 0)


@_hand("cuDeviceGetName 40 bytes of ordinal 70", "cuDeviceGetName")
def _name_70(api: Api, state: dict[str, Any]) -> Any:
    return _name(api, 40, 70)


@_hand("cuDeviceGetUuid", "cuDeviceGetUuid")
def _uuid(api: Api, state: dict[str, Any]) -> Any:
    buffer = (ctypes.c_ubyte * 24)(*[SENTINEL] * 24)
    return [api("cuDeviceGetUuid", ctypes.addressof(buffer), 1), bytes(buffer).hex()]


@_hand("cuGetErrorName and cuGetErrorString", "cuGetErrorName")
def _error_texts(api: Api, state: dict[str, Any]) -> Any:
    seen = []
    for name, code in (("cuGetErrorName", 700), ("cuGetErrorString", 700), ("cuGetErrorName", 700)):
        out = ctypes.c_void_p()
        status = api(name, code, ctypes.addressof(out))
        seen.append([status, ctypes.string_at(out.value).decode() if status == SUCCESS and out.value else None])
    return seen


# Copies: the program's bytes as the tail, a copy to the host written from the reply.
@_hand("cuMemAlloc for the copies", "cuMemAlloc")
def _alloc(api: Api, state: dict[str, Any]) -> Any:
    status, state["device"] = _u64_out(api, "cuMemAlloc", 4 << 20)
    return [status, state["device"]]


def _pattern(size: int, seed: int) -> bytes:
    block = hashlib.sha256(b"%d:%d" % (size, seed)).digest()
    return (block * (size // 32 + 1))[:size]


def _htod(size: int, stream: int | None) -> Run:
    def run(api: Api, state: dict[str, Any]) -> Any:
        source = ctypes.create_string_buffer(_pattern(size, 1), max(size, 1))
        target = state["device"] + 16
        if stream is None:
            return api("cuMemcpyHtoD", target, ctypes.addressof(source), size)
        return api("cuMemcpyHtoDAsync", target, ctypes.addressof(source), size, stream)
    return run


def _dtoh(size: int, stream: int | None) -> Run:
    def run(api: Api, state: dict[str, Any]) -> Any:
        target = ctypes.create_string_buffer(b"\xee" * (size + 16), size + 16)
        source = state["device"] + 32
        if stream is None:
            status = api("cuMemcpyDtoH", ctypes.addressof(target), source, size)
        else:
            status = api("cuMemcpyDtoHAsync", ctypes.addressof(target), source, size, stream)
        return [status, hashlib.sha256(target.raw).hexdigest()]
    return run


for _size in COPY_SIZES:
    HAND_STEPS.append(Step(f"cuMemcpyHtoD {_size} bytes", "hand", _htod(_size, None), "cuMemcpyHtoD"))
    HAND_STEPS.append(Step(f"cuMemcpyDtoH {_size} bytes", "hand", _dtoh(_size, None), "cuMemcpyDtoH"))
for _size in (0, 24, 70_000):
    HAND_STEPS.append(Step(f"cuMemcpyHtoDAsync {_size} bytes", "hand", _htod(_size, 0x5150_0000),
                           "cuMemcpyHtoDAsync"))
    HAND_STEPS.append(Step(f"cuMemcpyDtoHAsync {_size} bytes", "hand", _dtoh(_size, 0x5150_0000),
                           "cuMemcpyDtoHAsync"))


OWN_STREAM_COPY = "cuMemcpyHtoDAsync on a stream of the program's own, then once it is destroyed"


@_hand(OWN_STREAM_COPY, "cuMemcpyHtoDAsync")
def _own_stream_copy(api: Api, state: dict[str, Any]) -> Any:
    """A small copy on a stream this process made is posted, as on a default stream; once the stream is destroyed
    the same copy waits for the host's answer (tests/unit/test_guest_clients_agree.py checks both)."""
    made, stream = _u64_out(api, "cuStreamCreate", 0)
    source = ctypes.create_string_buffer(_pattern(24, 3), 24)
    posted = api("cuMemcpyHtoDAsync", state["device"] + 64, ctypes.addressof(source), 24, stream)
    destroyed = api("cuStreamDestroy", stream)
    after = api("cuMemcpyHtoDAsync", state["device"] + 64, ctypes.addressof(source), 24, stream)
    return [made, posted, destroyed, after]


@_hand("cuMemcpyHtoD from NULL", "cuMemcpyHtoD")
def _htod_null(api: Api, state: dict[str, Any]) -> Any:
    return [api("cuMemcpyHtoD", state["device"], None, 4), api("cuMemcpyDtoH", None, state["device"], 4)]


@_hand("cuMemcpy and cuMemcpyAsync by unified addressing", "cuMemcpy")
def _uva(api: Api, state: dict[str, Any]) -> Any:
    device = state["device"]
    host = ctypes.create_string_buffer(_pattern(300, 2), 300)
    other = ctypes.create_string_buffer(b"\xee" * 300, 300)
    seen = [api("cuMemcpy", device + 64, ctypes.addressof(host), 100),  # HtoD
            api("cuMemcpy", ctypes.addressof(other), device + 8, 64),  # DtoH
            api("cuMemcpy", device + 1024, device, 256),  # DtoD
            api("cuMemcpyAsync", device, ctypes.addressof(host), 32, 0x5150_0000),  # HtoDAsync
            api("cuMemcpy", ctypes.addressof(other), ctypes.addressof(host), 50),  # host to host: no record
            api("cuMemcpy", device, device, 0)]  # nothing to copy
    return [seen, hashlib.sha256(other.raw).hexdigest()]


# Modules and libraries: the image as the tail (by digest first past 64 KiB), JIT options before it.
def _load(image: bytes) -> Run:
    def run(api: Api, state: dict[str, Any]) -> Any:
        holder = ctypes.create_string_buffer(image, len(image))
        status, state["module"] = _u64_out(api, "cuModuleLoadData", ctypes.addressof(holder))
        return [status, state["module"]]
    return run


def _images() -> list[tuple[str, bytes]]:
    from tests.unit.test_forwarding_roundtrip import fatbin, minimal_elf
    return [("PTX", PTX + b"\0"), ("a fatbin", fatbin(minimal_elf())), ("an ELF", minimal_elf(b"mix")),
            ("70 KiB of PTX (by digest first)", LARGE_PTX + b"\0")]


for _what, _image in _images():
    HAND_STEPS.append(Step(f"cuModuleLoadData {_what}", "hand", _load(_image), "cuModuleLoadData"))


@_hand("cuModuleLoadDataEx with scalar, log and wall-time JIT options", "cuModuleLoadDataEx")
def _load_ex(api: Api, state: dict[str, Any]) -> Any:
    image = ctypes.create_string_buffer(PTX + b"\0", len(PTX) + 1)
    log = ctypes.create_string_buffer(b"\xee" * 64, 64)
    options = (ctypes.c_int * 5)(0, 3, 4, 7, 2)  # MAX_REGISTERS, INFO_LOG_BUFFER, its size, OPT_LEVEL, WALL_TIME
    values = (ctypes.c_uint64 * 5)(32, ctypes.addressof(log), 64, 3, 0xFFFF)
    status, module = _u64_out(api, "cuModuleLoadDataEx", ctypes.addressof(image), 5, ctypes.addressof(options),
                              ctypes.addressof(values))
    return [status, module, [values[i] for i in (0, 2, 3, 4)], log.raw[:4].hex()]


@_hand("cuLibraryLoadData with JIT and library options", "cuLibraryLoadData")
def _library_load(api: Api, state: dict[str, Any]) -> Any:
    image = ctypes.create_string_buffer(PTX + b"\0", len(PTX) + 1)
    options = (ctypes.c_int * 2)(0, 7)
    values = (ctypes.c_uint64 * 2)(64, 2)
    library_options = (ctypes.c_int * 1)(1)  # CU_LIBRARY_BINARY_IS_PRESERVED: dropped, a promise about our copy
    library_values = (ctypes.c_uint64 * 1)(1)
    status, state["library"] = _u64_out(api, "cuLibraryLoadData", ctypes.addressof(image), ctypes.addressof(options),
                                        ctypes.addressof(values), 2, ctypes.addressof(library_options),
                                        ctypes.addressof(library_values), 1)
    return [status, state["library"]]


@_hand("cuModuleGetFunction and cuModuleGetGlobal", "cuModuleGetFunction")
def _get_function(api: Api, state: dict[str, Any]) -> Any:
    seen: list[Any] = []
    for name in (b"mix", b"noargs", b"somewhere_else"):
        text = ctypes.create_string_buffer(name)
        seen.append(_u64_out(api, "cuModuleGetFunction", state["module"], ctypes.addressof(text)))
    pointer, size = ctypes.c_uint64(0xA5), ctypes.c_uint64(0xA5)
    text = ctypes.create_string_buffer(b"counter")
    seen.append([api("cuModuleGetGlobal", ctypes.addressof(pointer), ctypes.addressof(size), state["module"],
                     ctypes.addressof(text)), pointer.value, size.value])
    seen.append(api("cuModuleGetGlobal", None, ctypes.addressof(size), state["module"], ctypes.addressof(text)))
    return seen


@_hand("cuLibraryGetKernel and cuLibraryGetGlobal", "cuLibraryGetKernel")
def _get_kernel(api: Api, state: dict[str, Any]) -> Any:
    text = ctypes.create_string_buffer(b"kmix")
    seen: list[Any] = [_u64_out(api, "cuLibraryGetKernel", state["library"], ctypes.addressof(text))]
    pointer, size = ctypes.c_uint64(0xA5), ctypes.c_uint64(0xA5)
    text = ctypes.create_string_buffer(b"counter")
    seen.append([api("cuLibraryGetGlobal", ctypes.addressof(pointer), ctypes.addressof(size), state["library"],
                     ctypes.addressof(text)), pointer.value, size.value])
    return seen


@_hand("cuMemcpyHtoD into a module's global by unified addressing", "cuMemcpy")
def _uva_global(api: Api, state: dict[str, Any]) -> Any:
    host = ctypes.create_string_buffer(b"0123456789abcdef", 16)
    return api("cuMemcpy", G_COUNTER + 4, ctypes.addressof(host), 8)


# Launches: configuration, attributes, then the parameters packed by the layout the host gives (asked once).
class _Mix:
    def __init__(self) -> None:
        self.values: list[Any] = [ctypes.c_uint64(0x7F10_0000_1000), ctypes.c_int(-7), ctypes.c_uint8(0x5A),
                                  ctypes.c_double(0.125), (ctypes.c_uint8 * 12)(*range(1, 13))]
        self.params = (ctypes.c_void_p * 5)(*[ctypes.addressof(v) for v in self.values])


def _launch(function: int, params: Any, extra: Any = None, name: str = "cuLaunchKernel",
            stream: int = 0x5150_0000) -> Run:
    def run(api: Api, state: dict[str, Any]) -> Any:
        holder = params() if callable(params) else params
        address = ctypes.addressof(holder.params) if holder is not None else None
        more = [] if name == "cuLaunchCooperativeKernel" else [extra(state) if extra else None]
        return api(name, function, *LAUNCH_DIMS, stream, address, *more)
    return run


def _extra(state: dict[str, Any]) -> int:
    packed = bytearray(28)
    for (offset, width), value in zip(MIX_LAYOUT, MIX_VALUES, strict=True):
        packed[offset:offset + width] = value
    buffer = ctypes.create_string_buffer(bytes(packed), len(packed))
    size = ctypes.c_size_t(len(packed))
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(buffer), 2, ctypes.addressof(size), 0)
    state["keep"] = (buffer, size, extra)  # alive until the launch has read them
    return ctypes.addressof(extra)


class _Wide:
    def __init__(self) -> None:
        self.values = [ctypes.c_uint32(0xC0FFEE), ctypes.create_string_buffer(_pattern(3000, 3), 3000)]
        self.params = (ctypes.c_void_p * 2)(*[ctypes.addressof(v) for v in self.values])


class _NoArgs:
    def __init__(self) -> None:
        self.params = (ctypes.c_void_p * 1)(None)


for _label, _run in [
        ("cuLaunchKernel without kernelParams", _launch(F_NOARGS, None)),
        ("cuLaunchKernel of a function without parameters", _launch(F_NOARGS, _NoArgs)),
        ("cuLaunchKernel of mix (its layout asked)", _launch(F_MIX, _Mix)),
        ("cuLaunchKernel of mix again (its layout kept)", _launch(F_MIX, _Mix, stream=0)),
        ("cuLaunchKernel of mix by an extra buffer", _launch(F_MIX, None, _extra)),
        ("cuLaunchKernel of wide (3004 parameter bytes)", _launch(F_WIDE, _Wide)),
        ("cuLaunchCooperativeKernel of mix", _launch(F_MIX, _Mix, name="cuLaunchCooperativeKernel")),
        ("cuLaunchKernel of the kernel kmix (a CUkernel's layout)", _launch(K_MIX, _Mix))]:
    HAND_STEPS.append(Step(_label, "hand", _run, "cuLaunchCooperativeKernel" if "Cooperative" in _label
                           else "cuLaunchKernel"))


def _launch_ex(attributes: list[tuple[int, bytes]]) -> Run:
    def run(api: Api, state: dict[str, Any]) -> Any:
        raw = b"".join(struct.pack("<i4x64s", identifier, value) for identifier, value in attributes)
        holder = ctypes.create_string_buffer(raw, max(len(raw), 1))
        config = LaunchConfig(*LAUNCH_DIMS, 0x5150_0000, ctypes.addressof(holder) if attributes else None,
                              len(attributes))
        mix = _Mix()
        return api("cuLaunchKernelEx", ctypes.addressof(config), F_MIX, ctypes.addressof(mix.params), None)
    return run


HAND_STEPS.append(Step("cuLaunchKernelEx without attributes", "hand", _launch_ex([]), "cuLaunchKernelEx"))
HAND_STEPS.append(Step("cuLaunchKernelEx with a priority and a completion event", "hand",
                       _launch_ex([(8, struct.pack("<i", 3)), (12, struct.pack("<QI", 0x4343_0000, 1))]),
                       "cuLaunchKernelEx"))


@_hand("cuModuleUnload forgets the layouts: cuLaunchKernel of mix asks again", "cuLaunchKernel")
def _unload_then_launch(api: Api, state: dict[str, Any]) -> Any:
    return [api("cuModuleUnload", state["module"]), _launch(F_MIX, _Mix)(api, state)]


@_hand("cuOccupancyMaxPotentialBlockSize without a callback", "cuOccupancyMaxPotentialBlockSize")
def _potential(api: Api, state: dict[str, Any]) -> Any:
    grid, block = ctypes.c_int(-1), ctypes.c_int(-1)
    seen = [api("cuOccupancyMaxPotentialBlockSize", ctypes.addressof(grid), ctypes.addressof(block), F_MIX, None,
                128, 512), grid.value, block.value]
    seen += [api("cuOccupancyMaxPotentialBlockSizeWithFlags", ctypes.addressof(grid), ctypes.addressof(block), F_MIX,
                 None, 64, 0, 1), grid.value, block.value]
    return seen


# Page-locked memory from the pool: a copy names it by its address (the pinned variant), no bytes travel.
@_hand("cuMemAllocHost and cuMemHostAlloc (the pool mapped first)", "cuMemAllocHost")
def _host_alloc(api: Api, state: dict[str, Any]) -> Any:
    first, state["pinned"] = _u64_out(api, "cuMemAllocHost", 10_000)
    second, state["pinned_too"] = _u64_out(api, "cuMemHostAlloc", 100, 0x3)  # PORTABLE | DEVICEMAP
    return [first, second, state["pinned_too"] - state["pinned"]]  # the addresses differ by process, not their gap


@_hand("cuMemHostGetDevicePointer and cuMemHostGetFlags", "cuMemHostGetDevicePointer")
def _host_queries(api: Api, state: dict[str, Any]) -> Any:
    flags = ctypes.c_uint(0xA5A5)
    return [_u64_out(api, "cuMemHostGetDevicePointer", state["pinned"] + 64, 0),
            api("cuMemHostGetFlags", ctypes.addressof(flags), state["pinned_too"]), flags.value]


def _pinned_copies(api: Api, state: dict[str, Any]) -> Any:
    pinned, device = state["pinned"], state["device"]
    ctypes.memmove(pinned, _pattern(4096, 4), 4096)
    return [api("cuMemcpyHtoD", device, pinned + 8, 4000),
            api("cuMemcpyHtoDAsync", device + 4096, pinned, 10_000, 0x5150_0000),
            api("cuMemcpyDtoH", pinned + 100, device, 64),
            api("cuMemcpyDtoHAsync", pinned, device + 8, 9000, 0x5150_0000),
            api("cuMemcpy", device + 512, pinned + 4, 16),  # unified addressing: the pinned HtoD
            api("cuMemcpyAsync", pinned + 32, device, 16, 0),
            api("cuMemcpyHtoD", device, pinned + 9990, 20)]  # reaching past the allocation, still in the slice


HAND_STEPS.append(Step("copies with page-locked memory", "hand", _pinned_copies, "cuMemcpyHtoD"))


@_hand("cuMemFreeHost", "cuMemFreeHost")
def _host_free(api: Api, state: dict[str, Any]) -> Any:
    return [api("cuMemFreeHost", state["pinned_too"]), api("cuMemFreeHost", state["pinned"])]


# What both answer without a record: arguments the driver would refuse, options and attributes not forwarded.
@_hand("calls refused in the guest", "cuDeviceGetName")
def _refused(api: Api, state: dict[str, Any]) -> Any:
    name = ctypes.create_string_buffer(8)
    image = ctypes.create_string_buffer(PTX + b"\0", len(PTX) + 1)
    module = ctypes.c_uint64()
    options = (ctypes.c_int * 1)(1)  # CU_JIT_THREADS_PER_BLOCK: an in-out option, not forwarded
    values = (ctypes.c_uint64 * 1)(128)
    library_options = (ctypes.c_int * 1)(0)  # CU_LIBRARY_HOST_UNIVERSAL_FUNCTION_AND_DATA_TABLE
    params = (ctypes.c_uint64 * 3)(0, 1, 0)  # a CUctxCreateParams naming execution-affinity parameters
    mix = _Mix()
    mix.params[2] = None
    bad_extra = (ctypes.c_void_p * 3)(7, None, 0)  # an unknown key
    holder = ctypes.create_string_buffer(struct.pack("<i4x64s", 13, b""), 72)  # DEVICE_UPDATABLE_KERNEL_NODE
    config = LaunchConfig(*LAUNCH_DIMS, None, ctypes.addressof(holder), 1)
    return [api("cuDeviceGetName", ctypes.addressof(name), 0, 0),
            api("cuDeviceGetName", None, 8, 0),
            api("cuModuleLoadDataEx", ctypes.addressof(module), ctypes.addressof(image), 1, ctypes.addressof(options),
                ctypes.addressof(values)),
            api("cuModuleLoadDataEx", ctypes.addressof(module), ctypes.addressof(image), 1, None, None),
            api("cuLibraryLoadData", ctypes.addressof(module), ctypes.addressof(image), None, None, 0,
                ctypes.addressof(library_options), None, 1),
            api("cuModuleLoadData", None, ctypes.addressof(image)),
            api("cuCtxCreate", ctypes.addressof(module), ctypes.addressof(params), 0, 0),
            api("cuLaunchKernel", F_MIX, *LAUNCH_DIMS, None, ctypes.addressof(mix.params), None),
            api("cuLaunchKernel", F_MIX, *LAUNCH_DIMS, None, None, ctypes.addressof(bad_extra)),
            api("cuLaunchKernelEx", ctypes.addressof(config), F_MIX, ctypes.addressof(_Mix().params), None),
            api("cuLaunchKernelEx", None, F_MIX, None, None),
            api("cuMemPoolGetAttribute", 0x4747_0000, 1, None)]


# Queries whose value is 4 or 8 bytes by attribute.
@_hand("cuPointerGetAttribute of every forwarded attribute", "cuPointerGetAttribute")
def _pointer_attributes(api: Api, state: dict[str, Any]) -> Any:
    seen: list[Any] = []
    for attribute in [0, *sorted(POINTER_ATTRIBUTE_WIDTHS), 5, 99]:
        data = (ctypes.c_ubyte * 8)(*[SENTINEL] * 8)
        seen.append([attribute, api("cuPointerGetAttribute", ctypes.addressof(data), attribute,
                                    state["device"] + attribute), bytes(data).hex()])
    seen.append(api("cuPointerGetAttribute", None, 1, state["device"]))
    return seen


@_hand("cuMemPoolGetAttribute of int and cuuint64_t attributes", "cuMemPoolGetAttribute")
def _pool_get(api: Api, state: dict[str, Any]) -> Any:
    seen = []
    for attribute in (1, 2, 3, 4, 5, 8, 13):
        value = (ctypes.c_ubyte * 8)(*[SENTINEL] * 8)
        seen.append([attribute, api("cuMemPoolGetAttribute", 0x4747_0000, attribute, ctypes.addressof(value)),
                     bytes(value).hex()])
    return seen


@_hand("cuMemPoolSetAttribute of int and cuuint64_t attributes", "cuMemPoolSetAttribute")
def _pool_set(api: Api, state: dict[str, Any]) -> Any:
    seen = []
    for attribute, value in ((1, ctypes.c_int(-3)), (2, ctypes.c_int(7)), (4, ctypes.c_uint64(1 << 40)),
                             (13, ctypes.c_uint64(0xFFFF_FFFF_FFFF_FFF0))):
        seen.append(api("cuMemPoolSetAttribute", 0x4747_0000, attribute, ctypes.addressof(value)))
    seen.append(api("cuMemPoolSetAttribute", 0x4747_0000, 1, None))
    return seen


def _init(api: Api, state: dict[str, Any]) -> Any:
    return api("cuInit", 0)


def _unknown_context(api: Api, state: dict[str, Any]) -> Any:
    return api("cuCtxSetCurrent", 0x4848_0000)


SHARED_BYTES = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_int)(lambda block: 8 * block + 64)


def _search(api: Api, state: dict[str, Any]) -> Any:
    grid, block = ctypes.c_int(-1), ctypes.c_int(-1)
    callback = ctypes.cast(SHARED_BYTES, ctypes.c_void_p).value
    return [api("cuOccupancyMaxPotentialBlockSizeWithFlags", ctypes.addressof(grid), ctypes.addressof(block), F_MIX,
                callback, 0, 300, 1), grid.value, block.value]


# Graph nodes: only the native library forwards them (forward.py NATIVE_ONLY); each is held to the request the table's
# codec encodes from the same arguments.
F_NODE, K_NODE, GRAPH, CONTEXT = 0x6F00_0000_5000, 0x6F00_0000_6000, 0x4949_0000, 0x4A4A_0000
NODE_LAYOUT = [(0, 8), (8, 4)]
LAYOUTS[F_NODE] = NODE_LAYOUT
DEPENDENCIES = (0x4B4B_0100, 0x4B4B_0200, 0x4B4B_0300)
NODE_DIMS = (4, 3, 2, 128, 1, 1, 512)


class KernelNodeParams(ctypes.Structure):
    """cuda.h's CUDA_KERNEL_NODE_PARAMS (_v2)."""
    _fields_ = [("func", ctypes.c_void_p), ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint),
                ("blockDimZ", ctypes.c_uint), ("sharedMemBytes", ctypes.c_uint), ("kernelParams", ctypes.c_void_p),
                ("extra", ctypes.c_void_p), ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


class MemsetNodeParams(ctypes.Structure):
    """cuda.h's CUDA_MEMSET_NODE_PARAMS."""
    _fields_ = [("dst", ctypes.c_uint64), ("pitch", ctypes.c_size_t), ("value", ctypes.c_uint),
                ("elementSize", ctypes.c_uint), ("width", ctypes.c_size_t), ("height", ctypes.c_size_t)]


def _nodes(values: tuple[int, ...] | list[int]) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)


NODE_VALUES = (struct.pack("<Q", 0x7F30_0000_0040), struct.pack("<i", -9))
NODE_PACKED = NODE_VALUES[0] + NODE_VALUES[1]


def _kernel_node(by_extra: bool) -> Run:
    def run(api: Api, state: dict[str, Any]) -> Any:
        held = [ctypes.create_string_buffer(value, len(value)) for value in NODE_VALUES]
        params = (ctypes.c_void_p * 2)(*[ctypes.addressof(v) for v in held])
        packed = ctypes.create_string_buffer(NODE_PACKED, len(NODE_PACKED))
        size = ctypes.c_size_t(len(NODE_PACKED))
        extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(packed), 2, ctypes.addressof(size), 0)
        node = KernelNodeParams(None if by_extra else F_NODE, *NODE_DIMS,
                                None if by_extra else ctypes.addressof(params),
                                ctypes.addressof(extra) if by_extra else None, K_NODE if by_extra else None, CONTEXT)
        deps = (ctypes.c_uint64 * 3)(*DEPENDENCIES)
        count = 0 if by_extra else 3
        status, made = _u64_out(api, "cuGraphAddKernelNode", GRAPH, ctypes.addressof(deps), count,
                                ctypes.addressof(node))
        return {"statuses": [status], "nodes": [made]}
    return run


def _kernel_node_reference(by_extra: bool) -> list[Rec]:
    call, query = CALLS["cuGraphAddKernelNode"], CALLS["cuFuncGetParamInfo"]
    head = (0, K_NODE) if by_extra else (F_NODE, 0)
    deps = b"" if by_extra else _nodes(DEPENDENCIES)
    add = Rec(call.opcode, 0, call.request.encode(GRAPH, *head, CONTEXT, *NODE_DIMS, deps, NODE_PACKED))
    if by_extra:
        return [add]
    return [*(Rec(query.opcode, 0, query.inputs.pack(F_NODE, i)) for i in range(len(NODE_LAYOUT) + 1)), add]


def _memset_node(api: Api, state: dict[str, Any]) -> Any:
    params = MemsetNodeParams(0x7F30_0000_1000, 4096, 0xDEADBEEF, 4, 1000, 7)
    deps = (ctypes.c_uint64 * 2)(*DEPENDENCIES[:2])
    status, made = _u64_out(api, "cuGraphAddMemsetNode", GRAPH, ctypes.addressof(deps), 2, ctypes.addressof(params),
                            CONTEXT)
    return {"statuses": [status], "nodes": [made]}


def _memset_node_reference() -> list[Rec]:
    call = CALLS["cuGraphAddMemsetNode"]
    return [Rec(call.opcode, 0, call.request.encode(GRAPH, CONTEXT, 0x7F30_0000_1000, 4096, 0xDEADBEEF, 4, 1000, 7,
                                                    _nodes(DEPENDENCIES[:2])))]


def _other_nodes(api: Api, state: dict[str, Any]) -> Any:
    deps = (ctypes.c_uint64 * 3)(*DEPENDENCIES)
    edges = (ctypes.c_uint64 * 2)(0x0102_0304, 0)
    made = [_u64_out(api, "cuGraphAddEmptyNode", GRAPH, ctypes.addressof(deps), 3),
            _u64_out(api, "cuGraphAddEventRecordNode", GRAPH, None, 0, 0x4C4C_0000),
            _u64_out(api, "cuGraphAddEventWaitNode", GRAPH, ctypes.addressof(deps), 1, 0x4C4C_0000),
            _u64_out(api, "cuGraphAddChildGraphNode", GRAPH, ctypes.addressof(deps), 2, 0x4D4D_0000)]
    statuses = [status for status, _node in made]
    statuses.append(api("cuGraphAddDependencies", GRAPH, ctypes.addressof(deps), ctypes.addressof(deps) + 8, None, 2))
    statuses.append(api("cuGraphRemoveDependencies", GRAPH, ctypes.addressof(deps), ctypes.addressof(deps) + 8,
                        ctypes.addressof(edges), 2))
    return {"statuses": statuses, "nodes": [node for _status, node in made]}


def _other_nodes_reference() -> list[Rec]:
    def rec(name: str, *values: Any) -> Rec:
        return Rec(CALLS[name].opcode, 0, CALLS[name].request.encode(*values))
    d = DEPENDENCIES
    return [rec("cuGraphAddEmptyNode", GRAPH, _nodes(d)),
            rec("cuGraphAddEventRecordNode", GRAPH, 0x4C4C_0000, b""),
            rec("cuGraphAddEventWaitNode", GRAPH, 0x4C4C_0000, _nodes(d[:1])),
            rec("cuGraphAddChildGraphNode", GRAPH, 0x4D4D_0000, _nodes(d[:2])),
            rec("cuGraphAddDependencies", GRAPH, _nodes(d[:2]), _nodes(d[1:]), b""),
            rec("cuGraphRemoveDependencies", GRAPH, _nodes(d[:2]), _nodes(d[1:]), _nodes([0x0102_0304, 0]))]


# The graph family's second part (graph_queries.c): a memory allocation node (its pool properties and access
# descriptors) and a free node; a capture into a graph (dependencies and edge data) and its dependencies replaced; a
# kernel node attribute set; an instantiation with parameters.
STREAM = 0x4E4E_0000
POOL = (1, 0, 1, 2, 1 << 30, 0x0102, 1)  # allocation type, handle types, location type and id, max size, usage, RDMA
ACCESS = (1, 2, 3, 1, 0, 1)  # two CUmemAccessDesc: location type, id, flags each
FREED = 0x7F30_0000_2000


class MemAllocNodeParams(ctypes.Structure):
    """cuda.h's CUDA_MEM_ALLOC_NODE_PARAMS (its CUmemPoolProps inline, the first reserved byte gpuDirectRDMACapable)."""
    _fields_ = [("allocType", ctypes.c_int), ("handleTypes", ctypes.c_int), ("locationType", ctypes.c_int),
                ("locationId", ctypes.c_int), ("win32", ctypes.c_void_p), ("maxSize", ctypes.c_size_t),
                ("usage", ctypes.c_ushort), ("rdma", ctypes.c_ubyte), ("reserved", ctypes.c_ubyte * 53),
                ("accessDescs", ctypes.c_void_p), ("accessDescCount", ctypes.c_size_t),
                ("bytesize", ctypes.c_size_t), ("dptr", ctypes.c_uint64)]


def _table_rec(name: str, *values: Any) -> Rec:
    return Rec(CALLS[name].opcode, 0, CALLS[name].request.encode(*values))


def _memory_nodes(api: Api, state: dict[str, Any]) -> Any:
    access = (ctypes.c_int * len(ACCESS))(*ACCESS)
    params = MemAllocNodeParams(*POOL[:4], None, *POOL[4:], accessDescs=ctypes.addressof(access), accessDescCount=2,
                                bytesize=4096)
    deps = (ctypes.c_uint64 * 2)(*DEPENDENCIES[:2])
    status, alloc = _u64_out(api, "cuGraphAddMemAllocNode", GRAPH, ctypes.addressof(deps), 2, ctypes.addressof(params))
    freed, free = _u64_out(api, "cuGraphAddMemFreeNode", GRAPH, ctypes.addressof(deps), 1, FREED)
    return {"statuses": [status, freed], "nodes": [alloc, free, params.dptr]}


def _memory_nodes_reference() -> list[Rec]:
    return [_table_rec("cuGraphAddMemAllocNode", GRAPH, *POOL, 4096, _nodes(DEPENDENCIES[:2]),
                       struct.pack(f"<{len(ACCESS)}i", *ACCESS)),
            _table_rec("cuGraphAddMemFreeNode", GRAPH, FREED, _nodes(DEPENDENCIES[:1]))]


class InstantiateParams(ctypes.Structure):
    """cuda.h's CUDA_GRAPH_INSTANTIATE_PARAMS."""
    _fields_ = [("flags", ctypes.c_uint64), ("hUploadStream", ctypes.c_uint64), ("hErrNode_out", ctypes.c_uint64),
                ("result_out", ctypes.c_int)]


def _captures(api: Api, state: dict[str, Any]) -> Any:
    deps = (ctypes.c_uint64 * 3)(*DEPENDENCIES)
    edges = (ctypes.c_uint64 * 3)(0, 0x0001_0001, 0)
    value = (ctypes.c_ubyte * 64)(*range(64))
    params = InstantiateParams(flags=2, hUploadStream=STREAM)
    statuses = [api("cuStreamBeginCaptureToGraph", STREAM, GRAPH, ctypes.addressof(deps), ctypes.addressof(edges), 3,
                    1),
                api("cuStreamUpdateCaptureDependencies", STREAM, ctypes.addressof(deps), None, 2, 1),
                api("cuGraphKernelNodeSetAttribute", DEPENDENCIES[0], 8, ctypes.addressof(value))]
    status, made = _u64_out(api, "cuGraphInstantiateWithParams", GRAPH, ctypes.addressof(params))
    return {"statuses": [*statuses, status], "nodes": [made]}


def _captures_reference() -> list[Rec]:
    return [_table_rec("cuStreamBeginCaptureToGraph", STREAM, GRAPH, 1, _nodes(DEPENDENCIES),
                       _nodes([0, 0x0001_0001, 0])),
            _table_rec("cuStreamUpdateCaptureDependencies", STREAM, 1, _nodes(DEPENDENCIES[:2]), b""),
            _table_rec("cuGraphKernelNodeSetAttribute", DEPENDENCIES[0], 8, bytes(range(64))),
            _table_rec("cuGraphInstantiateWithParams", GRAPH, 2, STREAM)]


NATIVE_STEPS = [
    Step("cuGraphAddKernelNode by kernelParams", "native", _kernel_node(False), "cuGraphAddKernelNode",
         lambda: _kernel_node_reference(False)),
    Step("cuGraphAddKernelNode of a CUkernel by an extra buffer", "native", _kernel_node(True), "cuGraphAddKernelNode",
         lambda: _kernel_node_reference(True)),
    Step("cuGraphAddMemsetNode", "native", _memset_node, "cuGraphAddMemsetNode", _memset_node_reference),
    Step("cuGraphAddEmptyNode, event and child-graph nodes, edges", "native", _other_nodes, "cuGraphAddEmptyNode",
         _other_nodes_reference),
    Step("cuGraphAddMemAllocNode and cuGraphAddMemFreeNode", "native", _memory_nodes, "cuGraphAddMemAllocNode",
         _memory_nodes_reference),
    Step("capture into a graph, its dependencies, a kernel node attribute, an instantiation with parameters",
         "native", _captures, "cuStreamBeginCaptureToGraph", _captures_reference),
]


def program() -> list[Step]:
    """cuInit, the hand-written scenarios, a context neither client made current (so that the sweep's context
    queries travel), then the generic sweeps."""
    return [Step("cuInit(0) before the scenarios", "hand", _init, "cuInit"), *HAND_STEPS,
            Step("cuCtxSetCurrent of a context the session has not named", "hand", _unknown_context,
                 "cuCtxSetCurrent"),
            Step("cuOccupancyMaxPotentialBlockSize with a callback (its search, in the guest)", "hand", _search,
                 "cuOccupancyMaxPotentialBlockSize"),
            *generic_steps()]


def run_program(api: Api, steps: list[Step]) -> list[Any]:
    """Run `steps`, a marker before each and an end marker after the last; what the program saw, per step."""
    state: dict[str, Any] = {}
    seen = []
    for index, step in enumerate(steps):
        api.mark(MARK_PREFIX + f"{api.client}:{index}".encode())
        seen.append(step.run(api, state))
    api.mark(MARK_PREFIX + f"{api.client}:end".encode())
    return seen


# --- the two clients ----------------------------------------------------------------------------------------------

def argtypes(call: DriverCall) -> list[Any]:
    """The ctypes argument types of a table call's C entry point."""
    types: list[Any] = []
    for param in call.params:
        ctype = param.ctype
        if ctype.endswith("*") or ctype in POINTER_HANDLES:
            types.append(ctypes.c_void_p)
            continue
        try:
            types.append(CTYPE_OF[wire_code(ctype)])
        except KeyError:  # a function pointer (CUoccupancyB2DSize)
            types.append(ctypes.c_void_p)
    return types


class NativeApi:
    """The native library's entry points (ctypes); markers through its own channel (`orion_forward`)."""
    client = "native"

    def __init__(self, library: str) -> None:
        self.lib = ctypes.CDLL(library)
        for call in CALLS.values():
            function = getattr(self.lib, call.name)
            function.argtypes, function.restype = argtypes(call), ctypes.c_int
        self.lib.orion_forward.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                           ctypes.c_size_t, ctypes.c_int]

    def __call__(self, name: str, *args: Any) -> int:
        return int(getattr(self.lib, name)(*args))

    def mark(self, text: bytes) -> None:
        buffer = ctypes.create_string_buffer(text, len(text))
        status = self.lib.orion_forward(MARK, buffer, len(text), None, 0, 2)  # ORION_CALL_NO_FOLD
        assert status == SUCCESS, f"marker {text!r}: {status}"


class CapsuleApi:
    """The capsule path: Forwarder.implementations(), connected as guest_runtime/activate.py connects (HELLO with
    the table digest) to the region $ORION_SHM names; markers straight on its channel."""
    client = "capsule"

    def __init__(self, around_channel: Callable[[Any], Any] | None = None) -> None:
        from guest_runtime import activate
        from guest_runtime.forward import Forwarder

        def connect() -> Any:
            channel = activate._connect()
            return around_channel(channel) if around_channel is not None else channel
        self.forwarder = Forwarder(connect)
        self.fn = self.forwarder.implementations()

    def __call__(self, name: str, *args: Any) -> int:
        return int(self.fn[name](*args))

    def mark(self, text: bytes) -> None:
        channel = self.forwarder.channel()
        assert channel is not None, "the capsule path could not connect"
        reply = channel.call(MARK, text)
        assert reply.status == SUCCESS, f"marker {text!r}: {reply.status}"

    def close(self) -> None:
        channel = self.forwarder.channel()
        self.forwarder.close()
        if channel is not None:
            with contextlib.suppress(BufferError):  # views of the page-locked pool may still be held
                channel.region.close()


def main(argv: list[str]) -> int:
    """`native LIBRARY`: run the program through the native library; print what it saw as one JSON line."""
    if len(argv) != 2 or argv[0] != "native":
        print("usage: python -m tests.guest_clients native LIBRARY", file=sys.stderr)
        return 2
    seen = run_program(NativeApi(argv[1]), program() + NATIVE_STEPS)
    print("SEEN " + json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
