"""The differential corpus: seeded call sequences of copies and memsets, run against any C-ABI driver table, whose
transcripts (every status, and the bytes of every buffer at each check) must be equal on every path.

Why: a wrong value reported as success is the worst defect this product can have, and a test that checks exit
codes, or copies only sizes that happen to work, cannot see one (a relayed 4-byte page-locked copy once returned
zeros with CUDA_SUCCESS). So one corpus runs against the fake driver directly (the reference: `fake_table`) and
through every path the project has (tests/differential/test_differential.py: the capsule path and the native
`libcuda.so.1`, each on a local region and relayed over TCP; tests/guest/rdma_guest.py: relayed over RDMA;
tests/gpu/test_differential_gpu.py: the real driver as the reference), and the transcripts are compared value
for value (docs/testing.md).

What a sequence holds: sizes from 1 byte to several staging chunks and past the relay's 1 MiB pieces, pageable and
page-locked host memory, synchronous copies and copies posted on a blocking and a non-blocking stream, every copy
direction (HtoD, DtoH, DtoD) and memsets, plus synchronous copies past an allocation's end, which must fail alike
and change nothing. A sequence never races: before an operation touches a buffer that another stream's posted work
still uses (or the host reads or writes it), it synchronises, so every transcript has one right answer.

What does not belong here: kernels (the fake runs none: tests/gpu compares the programs' values on the GPU), and
asynchronous error timing (a posted call's error surfaces at the next synchronising call by design, so error
cases are synchronous calls only).
"""
from __future__ import annotations

import ctypes
import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Sizes that sit on every boundary of the paths: one byte; under, at and over a ring slot's inline payload (512-byte
# slots: 480 bytes inline) and 1 KiB; under, at and over a staging chunk (64 KiB in a 32 MiB region) and several
# chunks; the relay's 1 MiB pieces and past them.
SIZES = (1, 2, 3, 4, 7, 8, 16, 64, 255, 256, 479, 480, 481, 512, 1000, 1023, 1024, 1025, 4096, 65535, 65536,
         65537, 3 * 65536 + 5, 1 << 20, (1 << 20) + 3, 5 << 19)
DEVICE_BYTES = 3 << 20  # each device buffer
PAGEABLE_BYTES = 3 << 20  # each pageable host buffer
PINNED_BYTES = 3 << 19  # the page-locked buffer (inside one channel's share of the region's pool)
DEVICE_BUFFERS, PAGEABLE_BUFFERS = 3, 2
NON_BLOCKING = 1  # CU_STREAM_NON_BLOCKING
STREAMS = ("legacy", "blocking", "non-blocking")
SUCCESS = 0

# The C prototypes the corpus calls: name -> ctypes argument types (pointers to host memory or to out cells are
# c_void_p, device pointers and handles c_uint64).
P, U64, SZ = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t
PROTOTYPES: dict[str, list[Any]] = {
    "cuInit": [ctypes.c_uint], "cuDeviceGet": [P, ctypes.c_int], "cuDevicePrimaryCtxRetain": [P, ctypes.c_int],
    "cuCtxSetCurrent": [U64], "cuCtxSynchronize": [], "cuStreamCreate": [P, ctypes.c_uint],
    "cuStreamSynchronize": [U64], "cuStreamDestroy": [U64], "cuMemAlloc": [P, SZ], "cuMemFree": [U64],
    "cuMemAllocHost": [P, SZ], "cuMemFreeHost": [P],
    "cuMemcpyHtoD": [U64, P, SZ], "cuMemcpyDtoH": [P, U64, SZ], "cuMemcpyDtoD": [U64, U64, SZ],
    "cuMemcpyHtoDAsync": [U64, P, SZ, U64], "cuMemcpyDtoHAsync": [P, U64, SZ, U64],
    "cuMemcpyDtoDAsync": [U64, U64, SZ, U64],
    "cuMemsetD8": [U64, ctypes.c_ubyte, SZ], "cuMemsetD32": [U64, ctypes.c_uint, SZ],
    "cuMemsetD8Async": [U64, ctypes.c_ubyte, SZ, U64], "cuMemsetD32Async": [U64, ctypes.c_uint, SZ, U64],
}
Table = dict[str, Callable[..., int]]
ALIASES = Path(__file__).resolve().parents[2] / "guest_runtime" / "native" / "driver_aliases.txt"


def cuda_h_names() -> dict[str, str]:
    """name -> name_v2 for every name cuda.h's macros give a _v2 entry point (driver_aliases.txt): what a program
    built against cuda.h calls. The real libcuda exports the unversioned names too, as the entry points of CUDA
    before 3.2 (32-bit pointers and sizes), so a C library is always called by these."""
    pairs = [line.split() for line in ALIASES.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return {name: alias for alias, name in pairs if alias == name + "_v2"}


def ctypes_table(library: ctypes.CDLL, more: dict[str, list[Any]] | None = None) -> Table:
    """The corpus's functions of a C driver library (the real libcuda, or the native `libcuda.so.1`), looked up by
    cuda.h's names, with their prototypes set (and those of `more`)."""
    table: Table = {}
    versioned = cuda_h_names()
    for name, argtypes in {**PROTOTYPES, **(more or {})}.items():
        function = getattr(library, versioned.get(name, name))
        function.argtypes, function.restype = argtypes, ctypes.c_int
        table[name] = function
    return table


# --- the operations ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Host:
    """A host buffer: ("pageable", i) or ("pinned", 0)."""
    kind: str
    index: int


@dataclass(frozen=True)
class Op:
    """One step. `kind`: fill (the host writes a pattern), htod, dtoh, dtod, memset8, memset32, sync, check.
    Offsets and sizes are bytes; `stream` is one of STREAMS or None (a synchronous call)."""
    kind: str
    size: int = 0
    device: int = 0
    device_offset: int = 0
    host: Host | None = None
    host_offset: int = 0
    source: int = 0  # dtod: the source device buffer
    source_offset: int = 0
    stream: str | None = None
    value: int = 0  # fill's seed, memset's value
    fails: bool = False  # a synchronous copy past an allocation's end: must fail, alike everywhere


def _host_bytes(host: Host) -> int:
    return PINNED_BYTES if host.kind == "pinned" else PAGEABLE_BYTES


@dataclass
class _Busy:
    """What posted work may still touch, per stream (the generator synchronises before a conflicting step)."""
    streams: dict[str, set[Any]] = field(default_factory=dict)

    def conflict(self, stream: str | None, *things: Any) -> bool:
        return any(s != stream and set(things) & touched for s, touched in self.streams.items())

    def note(self, stream: str | None, *things: Any) -> None:
        if stream is not None:
            self.streams.setdefault(stream, set()).update(things)


def sequence(seed: int, steps: int = 48) -> list[Op]:
    """A seeded sequence of `steps` operations (plus the synchronisations that keep it race-free and a check at
    every tenth step and at the end)."""
    rng = random.Random(seed)
    ops: list[Op] = []
    busy = _Busy()

    def settle(stream: str | None, *things: Any) -> None:
        if busy.conflict(stream, *things):
            ops.append(Op("sync", stream=rng.choice([None, *busy.streams])))
            if ops[-1].stream is None:
                busy.streams.clear()
            else:
                busy.streams.pop(ops[-1].stream, None)
                settle(stream, *things)  # another stream may still hold it

    def host_choice(size: int) -> Host:
        if size <= PINNED_BYTES and rng.random() < 0.5:
            return Host("pinned", 0)
        return Host("pageable", rng.randrange(PAGEABLE_BUFFERS))

    def place(size: int, total: int) -> int:
        return rng.choice([0, total - size, rng.randrange(total - size + 1)])

    for step in range(steps):
        kind = rng.choice(["fill", "htod", "htod", "dtoh", "dtoh", "dtod", "memset8", "memset32", "fails"])
        size = rng.choice(SIZES)
        stream = rng.choice([None, None, *STREAMS])
        device = rng.randrange(DEVICE_BUFFERS)
        if kind == "fill":
            host = Host("pageable", rng.randrange(PAGEABLE_BUFFERS)) if rng.random() < 0.6 else Host("pinned", 0)
            size = min(size, _host_bytes(host))
            offset = place(size, _host_bytes(host))
            settle(None, host)
            ops.append(Op("fill", size, host=host, host_offset=offset, value=rng.randrange(1 << 16)))
        elif kind in ("htod", "dtoh"):
            host = host_choice(size)
            op = Op(kind, size, device, place(size, DEVICE_BYTES), host, place(size, _host_bytes(host)),
                    stream=stream)
            settle(stream, host, device)
            ops.append(op)
            busy.note(stream, host, device)
        elif kind == "dtod":
            source = rng.choice([d for d in range(DEVICE_BUFFERS) if d != device])
            op = Op(kind, size, device, place(size, DEVICE_BYTES), source=source,
                    source_offset=place(size, DEVICE_BYTES), stream=stream)
            settle(stream, device, source)
            ops.append(op)
            busy.note(stream, device, source)
        elif kind in ("memset8", "memset32"):
            size = max(4, size - size % 4) if kind == "memset32" else size
            offset = place(size, DEVICE_BYTES)
            offset -= offset % 4 if kind == "memset32" else 0
            settle(stream, device)
            ops.append(Op(kind, size, device, offset, stream=stream, value=rng.randrange(1 << 32)))
            busy.note(stream, device)
        else:  # a synchronous copy that runs past the device buffer's end
            host = host_choice(size)
            direction = rng.choice(["htod", "dtoh"])
            settle(None, host, device)
            ops.append(Op(direction, size, device, DEVICE_BYTES - size + rng.choice([1, 7, size]), host, 0,
                          fails=True))
        if step % 10 == 9:
            ops.append(Op("check"))
            busy.streams.clear()
    ops.append(Op("check"))
    return ops


def pattern(size: int, seed: int) -> bytes:
    """`size` bytes drawn from `seed`: no period, so a piece moved by any distance (a staging chunk or a relay
    piece delivered to the wrong place) shows, and never all zeros."""
    return random.Random(seed).randbytes(size)


# --- running a sequence against a driver table ------------------------------------------------------------------

class Runner:
    """Runs sequences against one C-ABI driver `table` (one context, three streams, the buffers above), writing a
    transcript: one entry per step, [step, kind, status] and at a check the SHA-256 of every buffer's bytes."""

    def __init__(self, table: Table) -> None:
        self.t = table
        cell, device = ctypes.c_uint64(), ctypes.c_int()
        self._call("cuInit", 0)
        self._call("cuDeviceGet", ctypes.addressof(device), 0)
        self._call("cuDevicePrimaryCtxRetain", ctypes.addressof(cell), device.value)
        self._call("cuCtxSetCurrent", cell.value)
        self.streams = {"legacy": 0}
        for name, flags in (("blocking", 0), ("non-blocking", NON_BLOCKING)):
            self._call("cuStreamCreate", ctypes.addressof(cell), flags)
            self.streams[name] = cell.value
        self.device: list[int] = []
        for _ in range(DEVICE_BUFFERS):
            self._call("cuMemAlloc", ctypes.addressof(cell), DEVICE_BYTES)
            self.device.append(cell.value)
        self.pageable = [ctypes.create_string_buffer(PAGEABLE_BYTES) for _ in range(PAGEABLE_BUFFERS)]
        self._call("cuMemAllocHost", ctypes.addressof(cell), PINNED_BYTES)
        self.pinned = cell.value
        self._readback = ctypes.create_string_buffer(DEVICE_BYTES)
        self.reset()

    def _call(self, name: str, *args: int) -> None:
        status = self.t[name](*args)
        if status != SUCCESS:
            raise RuntimeError(f"setting up the corpus: {name} answered {status}")

    def reset(self) -> None:
        """Every buffer to a known state (device buffers zeroed, host buffers filled with their own pattern)."""
        for index, buffer in enumerate(self.pageable):
            ctypes.memmove(buffer, pattern(PAGEABLE_BYTES, 1000 + index), PAGEABLE_BYTES)
        ctypes.memmove(self.pinned, pattern(PINNED_BYTES, 2000), PINNED_BYTES)
        for pointer in self.device:
            self._call("cuMemsetD8", pointer, 0, DEVICE_BYTES)
        self._call("cuCtxSynchronize")

    def host(self, host: Host) -> int:
        return self.pinned if host.kind == "pinned" else ctypes.addressof(self.pageable[host.index])

    def run(self, ops: list[Op]) -> list[list[Any]]:
        self.reset()
        return [self.step(index, op) for index, op in enumerate(ops)]

    def step(self, index: int, op: Op) -> list[Any]:
        t, kind = self.t, op.kind
        stream = None if op.stream is None else self.streams[op.stream]
        async_ = "" if stream is None else "Async"
        tail = () if stream is None else (stream,)
        device = self.device[op.device] + op.device_offset
        status: int | str
        if kind == "fill":
            ctypes.memmove(self.host(op.host) + op.host_offset, pattern(op.size, op.value), op.size)  # type: ignore[arg-type]
            status = SUCCESS
        elif kind == "htod":
            status = t["cuMemcpyHtoD" + async_](device, self.host(op.host) + op.host_offset, op.size, *tail)  # type: ignore[arg-type]
        elif kind == "dtoh":
            status = t["cuMemcpyDtoH" + async_](self.host(op.host) + op.host_offset, device, op.size, *tail)  # type: ignore[arg-type]
        elif kind == "dtod":
            status = t["cuMemcpyDtoD" + async_](device, self.device[op.source] + op.source_offset, op.size, *tail)
        elif kind == "memset8":
            status = t["cuMemsetD8" + async_](device, op.value & 0xFF, op.size, *tail)
        elif kind == "memset32":
            status = t["cuMemsetD32" + async_](device, op.value, op.size // 4, *tail)
        elif kind == "sync":
            status = t["cuCtxSynchronize"]() if stream is None else t["cuStreamSynchronize"](stream)
        else:
            return [index, kind, t["cuCtxSynchronize"](), self.digests()]
        if op.fails:
            status = "failed" if status != SUCCESS else "succeeded past the end"
        return [index, kind, status]

    def digests(self) -> dict[str, str]:
        """The SHA-256 of every buffer (device ones read back with a synchronous pageable copy)."""
        found = {f"pageable{i}": _sha(ctypes.addressof(b), PAGEABLE_BYTES) for i, b in enumerate(self.pageable)}
        found["pinned"] = _sha(self.pinned, PINNED_BYTES)
        for index, pointer in enumerate(self.device):
            status = self.t["cuMemcpyDtoH"](ctypes.addressof(self._readback), pointer, DEVICE_BYTES)
            found[f"device{index}"] = _sha(ctypes.addressof(self._readback), DEVICE_BYTES) if status == SUCCESS \
                else f"read back failed: {status}"
        return found


def _sha(address: int, size: int) -> str:
    return hashlib.sha256(ctypes.string_at(address, size)).hexdigest()


def first_difference(reference: list[list[Any]], other: list[list[Any]], ops: list[Op]) -> str:
    """'' when the transcripts agree, else the first step where they differ, with the operation."""
    for want, got in zip(reference, other, strict=False):
        if want == got:
            continue
        if want[1] == "check" and got[1] == "check" and want[2] == got[2]:  # name the buffers that differ
            buffers = sorted(k for k in want[3] if want[3][k] != got[3].get(k))
            last = [f"{i}: {op}" for i, op in enumerate(ops[:want[0]]) if op.kind != "check"][-12:]
            return f"step {want[0]} (check): {', '.join(buffers)} differ; the steps before it:\n  " + "\n  ".join(last)
        return f"step {want[0]} {ops[want[0]]}: reference {want[2:]}, this path {got[2:]}"
    if len(reference) != len(other):
        return f"{len(reference)} steps in the reference, {len(other)} here"
    return ""


def compare(seeds: Sequence[int], wanted: Sequence[list[list[Any]]], got: Sequence[list[list[Any]]]) -> str:
    """'' when each seed's transcript in `got` is its transcript in `wanted`, else one entry per seed that differs
    (its first difference), for an assertion's message."""
    report = []
    for seed, want, have in zip(seeds, wanted, got, strict=True):
        why = first_difference(want, have, sequence(seed))
        if why:
            report.append(f"seed {seed}: {why}")
    return "\n".join(report)


# --- the reference: the fake driver called directly -------------------------------------------------------------

def fake_table(driver: Any) -> Table:
    """The corpus's functions over a FakeDriver (tests/fake_driver.py) called directly, as C would call a driver:
    outputs written through the out-pointers, page-locked memory as plain host memory (the fake has none)."""
    kept: list[Any] = []

    def out(address: int, value: Any) -> None:
        ctypes.c_uint64.from_address(address).value = int(value)

    def with_out(name: str) -> Callable[..., int]:
        def call(address: int, *args: int) -> int:
            status, *values = getattr(driver, name)(*args)
            if status == SUCCESS:
                out(address, values[0])
            return int(status)
        return call

    def alloc_host(address: int, size: int) -> int:
        kept.append(ctypes.create_string_buffer(size))
        out(address, ctypes.addressof(kept[-1]))
        return SUCCESS

    def device_get(address: int, ordinal: int) -> int:
        status, device = driver.cuDeviceGet(ordinal)
        if status == SUCCESS:
            ctypes.c_int.from_address(address).value = int(device)
        return int(status)

    def plain(name: str) -> Callable[..., int]:
        return lambda *args: int(getattr(driver, name)(*args)[0])

    table = {name: plain(name) for name in PROTOTYPES}
    table.update({"cuDeviceGet": device_get, "cuDevicePrimaryCtxRetain": with_out("cuDevicePrimaryCtxRetain"),
                  "cuStreamCreate": with_out("cuStreamCreate"), "cuMemAlloc": with_out("cuMemAlloc"),
                  "cuMemAllocHost": alloc_host, "cuMemFreeHost": lambda address: SUCCESS})
    table["_kept"] = kept  # type: ignore[assignment]
    return table
