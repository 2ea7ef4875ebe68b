"""The compiled hot path (host_agent/session/hot_dispatch.c, hot_path.py) answers exactly as the Python path does.

One session is served in this process over a real region: a client Endpoint queues records on the request ring,
`session_loop.RecordLoop` (the worker's loop) answers them with a CudaExecutor over tests.fake_driver.FakeDriver,
and the replies are read back from the completion ring. The same corpus of records -- the hot calls well-formed,
and hostile (handles and pointers the session does not own, truncated and oversized payloads, another generation,
unknown flags, posted calls that fail) -- is served once by the Python path alone and once with the compiled path, whose
driver functions are C-callable stand-ins (ctypes callbacks) for the same fake's methods. Replies, what reached
the driver and the launches it saw must be identical, and the compiled path must have answered the hot part.
"""
from __future__ import annotations

import ctypes
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from host_agent.handler import Session
from host_agent.session import hot_path
from host_agent.session.executor import CudaExecutor
from host_agent.session_loop import RecordLoop, ServerOptions
from ivshmem.channel import Endpoint
from ivshmem.cuda_status import INVALID_CONTEXT, INVALID_HANDLE, INVALID_VALUE, SUCCESS
from ivshmem.driver_api import BY_OPCODE, PINNED_COPY, POOL_MAP_OPCODE, POOL_MAP_REQUEST, DriverCall
from ivshmem.layout import Geometry
from ivshmem.record import SEQ_AT, STATS_REPLY, Flag, Op, Status, publish_mark
from ivshmem.region import Region
from ivshmem.wait import WaitPolicy
from tests.fake_driver import CUlaunchConfig, FakeDriver
from tests.unit.test_forwarding_roundtrip import fatbin, minimal_elf

CALLS: dict[str, DriverCall] = {call.name: call for call in BY_OPCODE.values()}
GENERATION = 7
OPTIONS = ServerOptions()
U = ctypes.c_uint
P = ctypes.c_void_p
Q = ctypes.c_uint64

pytestmark = pytest.mark.skipif(hot_path.load() is None, reason="no C compiler or Python headers here")


def stand_ins(fake: FakeDriver) -> tuple[dict[str, int], list[Any]]:
    """C-callable stand-ins for the hot calls: ctypes callbacks into the fake, with the arguments as the Python
    path gives them (handles as ints, NULL as 0; a launch's `kernelParams` as None, `extra` as its address)."""
    def plain(method: Any, *types: Any) -> Any:
        return ctypes.CFUNCTYPE(ctypes.c_int, *types)(lambda *a: int(method(*[v or 0 for v in a])[0]))

    def launch(f: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int, stream: int | None,
               params: int | None, extra: int | None) -> int:
        return int(fake.cuLaunchKernel(f or 0, gx, gy, gz, bx, by, bz, shared, stream or 0, params, extra)[0])

    def launch_ex(config: int, f: int | None, params: int | None, extra: int | None) -> int:
        return int(fake.cuLaunchKernelEx(CUlaunchConfig(_ptr=config), f or 0, params, extra)[0])

    def is_capturing(stream: int | None, status: Any) -> int:
        err, capturing = fake.cuStreamIsCapturing(stream or 0)
        status[0] = int(capturing)
        return int(err)
    made = {
        "cuCtxSynchronize": plain(fake.cuCtxSynchronize),
        "cuStreamSynchronize": plain(fake.cuStreamSynchronize, P),
        "cuStreamQuery": plain(fake.cuStreamQuery, P),
        "cuEventQuery": plain(fake.cuEventQuery, P),
        "cuEventSynchronize": plain(fake.cuEventSynchronize, P),
        "cuCtxSetCurrent": plain(fake.cuCtxSetCurrent, P),
        "cuEventRecord": plain(fake.cuEventRecord, P, P),
        "cuEventRecordWithFlags": plain(fake.cuEventRecordWithFlags, P, P, U),
        "cuStreamWaitEvent": plain(fake.cuStreamWaitEvent, P, P, U),
        "cuMemsetD8Async": plain(fake.cuMemsetD8Async, Q, ctypes.c_ubyte, ctypes.c_size_t, P),
        "cuMemsetD16Async": plain(fake.cuMemsetD16Async, Q, ctypes.c_ushort, ctypes.c_size_t, P),
        "cuMemsetD32Async": plain(fake.cuMemsetD32Async, Q, U, ctypes.c_size_t, P),
        "cuMemcpyDtoDAsync": plain(fake.cuMemcpyDtoDAsync, Q, Q, ctypes.c_size_t, P),
        "cuLaunchKernel": ctypes.CFUNCTYPE(ctypes.c_int, P, U, U, U, U, U, U, U, P, P, P)(launch),
        "cuLaunchKernelEx": ctypes.CFUNCTYPE(ctypes.c_int, P, P, P, P)(launch_ex),
        "cuStreamWriteValue32": plain(fake.cuStreamWriteValue32, P, Q, U, U),
        "cuStreamWaitValue32": plain(fake.cuStreamWaitValue32, P, Q, U, U),
        "cuMemcpyHtoD": plain(fake.cuMemcpyHtoD, Q, P, ctypes.c_size_t),  # the host side as an address: the fake
        "cuMemcpyDtoH": plain(fake.cuMemcpyDtoH, P, Q, ctypes.c_size_t),  # reads and writes it there
        "cuMemcpyHtoDAsync": plain(fake.cuMemcpyHtoDAsync, Q, P, ctypes.c_size_t, P),
        "cuMemcpyDtoHAsync": plain(fake.cuMemcpyDtoHAsync, P, Q, ctypes.c_size_t, P),
        "cuStreamIsCapturing": ctypes.CFUNCTYPE(ctypes.c_int, P, ctypes.POINTER(ctypes.c_int))(is_capturing),
    }
    return {name: ctypes.cast(fn, ctypes.c_void_p).value or 0 for name, fn in made.items()}, list(made.values())


class Served:
    """One session over a fresh region: a client endpoint, the executor, and (with `compiled`) the hot path."""

    def __init__(self, compiled: bool, policy: WaitPolicy | None = None) -> None:
        self.path = f"/dev/shm/orion-hot-{uuid.uuid4().hex[:10]}"
        with open(self.path, "wb") as f:
            f.truncate(16 << 20)
        self.region = Region.open(self.path)
        self.region.format(Geometry.build(self.region.size, 1, name="hot"))
        self.client = Endpoint(self.region, 0, "client")
        self.host = Endpoint(self.region, 0, "host", policy or WaitPolicy())
        for side in (self.client, self.host):
            side.reset_owned()
            side.resync()
            side.generation = GENERATION
        self.fake = FakeDriver(devices=2)
        self.fake.cuInit(0)
        self.executor = CudaExecutor(Session(1, self.path, 0, GENERATION), driver=self.fake)
        self.executor.attach_channel(self.region, 0)  # its page-locked pool slice
        self.hot: hot_path.HotPath | None = None
        self._keep: list[Any] = []
        if compiled:
            functions, self._keep = stand_ins(self.fake)
            self.executor.hot_functions = functions  # type: ignore[attr-defined]
            self.hot = hot_path.attach(self.host, self.executor)
            assert self.hot is not None  # every hot call, NOP and the page-locked copies
            assert len(self.hot.calls) == len(hot_path.HOT_CALLS) + 1 + len(hot_path.PINNED_HOT)
        self.loop = RecordLoop(self.host, self.executor, self.executor.session, OPTIONS, self.hot)
        self.next_id = 0
        self.replies: list[tuple[int, int, int, bytes]] = []  # the corpus's, in order

    def send(self, opcode: int, payload: bytes = b"", flags: int = 0, generation: int | None = None) -> int:
        self.next_id += 1
        saved = self.client.generation
        self.client.generation = GENERATION if generation is None else generation
        self.client.send(self.next_id, opcode, flags, payload)
        self.client.generation = saved
        return self.next_id

    def request(self, name: str, *args: Any, posted: bool = False, payload: bytes | None = None) -> int:
        call = CALLS[name]
        body = payload if payload is not None else call.request.encode(*args)
        return self.send(call.opcode, bytes(body), Flag.NO_REPLY if posted else 0)

    def serve(self) -> list[tuple[int, int, int, bytes]]:
        """Answer what is queued; the replies as (call_id, flags, status, payload)."""
        self.loop.run(until_idle=True)
        replies = []
        while (record := self.client.receive(wait=False)) is not None:
            replies.append((record.call_id, record.flags, record.status, bytes(record.payload)))
        return replies

    def call(self, name: str, *args: Any) -> list[int]:
        """A setup call: must succeed; its outputs."""
        self.request(name, *args)
        ((_, _, status, payload),) = self.serve()
        assert status == SUCCESS, f"{name}: {status}"
        return list(CALLS[name].reply.decode(payload)) if payload else []

    def close(self) -> None:
        if self.hot is not None:
            self.hot.close()
        self.region.close()
        os.unlink(self.path)


@pytest.fixture
def make() -> Iterator[Any]:
    made: list[Served] = []

    def build(compiled: bool, policy: WaitPolicy | None = None) -> Served:
        made.append(Served(compiled, policy))
        return made[-1]
    yield build
    for served in made:
        served.close()


def setup_session(s: Served) -> dict[str, int]:
    """A context, a stream, an event, two allocations, a function launched once: what the corpus names."""
    (context,) = s.call("cuDevicePrimaryCtxRetain", 0)
    s.call("cuCtxSetCurrent", context)
    (stream,) = s.call("cuStreamCreate", 1)
    (event,) = s.call("cuEventCreate", 0)
    (a,) = s.call("cuMemAlloc", 256)
    (b,) = s.call("cuMemAlloc", 256)
    (module,) = s.call("cuModuleLoadData", fatbin(minimal_elf()))
    (function,) = s.call("cuModuleGetFunction", module, b"elfkernel")
    (reserved,) = s.call("cuMemAddressReserve", 1 << 21, 0, 0, 0)  # the ledger's own answer (SessionLedger.owns)
    pool = s.executor.pool
    assert pool is not None and pool.size
    s.send(POOL_MAP_OPCODE, POOL_MAP_REQUEST.encode(pool.own_address))
    ((_, _, status, _),) = s.serve()
    assert status == SUCCESS
    (pinned,) = s.call("cuMemAllocHost", 8192)
    return {"context": context, "stream": stream, "event": event, "a": a, "b": b, "function": function,
            "reserved": reserved, "pinned": pinned, "module": module}


def launch_payload(function: int, stream: int, params: bytes = b"\x01\x02\x03\x04", grid: int = 1) -> bytes:
    return CALLS["cuLaunchKernel"].request.fixed.pack(function, grid, 1, 1, 32, 1, 1, 0, stream) + params


def launch_ex_payload(function: int, stream: int, attributes: list[tuple[int, bytes]],
                      params: bytes = b"\x05\x06") -> bytes:
    return CALLS["cuLaunchKernelEx"].request.encode(function, 2, 1, 1, 32, 1, 1, 0, stream, attributes, params)


def corpus(s: Served, h: dict[str, int]) -> None:
    """Queue the hot calls, well-formed and hostile, in batches the ring holds; serve after each."""
    stream, event, a, b, f, ctx, p = (h["stream"], h["event"], h["a"], h["b"], h["function"], h["context"],
                                       h["pinned"])
    priority, completion = (8, (3).to_bytes(64, "little")), (12, event.to_bytes(8, "little") + bytes(56))
    bogus = 0xDEAD0000
    batches: list[list[tuple[Any, ...]]] = [[
        ("cuCtxSynchronize",), ("cuCtxSynchronize", "posted"),
        ("cuStreamQuery", stream), ("cuStreamQuery", 0), ("cuStreamQuery", bogus),
        ("cuStreamSynchronize", stream), ("cuStreamSynchronize", 0, "posted"), ("cuStreamSynchronize", bogus, "posted"),
        ("cuEventRecord", event, stream, "posted"), ("cuEventRecord", bogus, stream, "posted"),
        ("cuEventRecord", event, bogus), ("cuEventRecord", event, 0),
        ("cuEventRecordWithFlags", event, stream, 0, "posted"), ("cuEventRecordWithFlags", event, 0, 0),
        ("cuEventRecordWithFlags", event, stream, 1), ("cuEventRecordWithFlags", event, stream, 1, "posted"),
        ("cuEventRecordWithFlags", bogus, stream, 0), ("cuEventRecordWithFlags", event, bogus, 0, "posted"),
        ("cuEventQuery", event), ("cuEventQuery", bogus), ("cuEventSynchronize", event),
        ("cuStreamWaitEvent", stream, event, 0, "posted"), ("cuStreamWaitEvent", stream, event, 5, "posted"),
        ("cuStreamWaitEvent", stream, event, 5), ("cuStreamWaitEvent", bogus, event, 0, "posted"),
        ("cuCtxSetCurrent", ctx), ("cuCtxSetCurrent", 0), ("cuCtxSetCurrent", bogus), ("cuCtxSetCurrent", ctx),
    ], [
        ("cuMemsetD8Async", a, 7, 256, stream, "posted"), ("cuMemsetD8Async", a + 250, 7, 7, stream, "posted"),
        ("cuMemsetD8Async", a, 7, 0, 0), ("cuMemsetD8Async", bogus, 7, 1, 0),
        ("cuMemsetD16Async", a, 0xBEEF, 128, 0, "posted"), ("cuMemsetD16Async", a, 1, 129, 0),
        ("cuMemsetD32Async", a, 0xCAFEF00D, 64, stream), ("cuMemsetD32Async", a + 1, 1, 4, stream, "posted"),
        ("cuMemsetD32Async", a, 1, 1 << 62, stream), ("cuMemsetD32Async", a, 1, 4, bogus),
        ("cuMemcpyDtoDAsync", b, a, 256, stream, "posted"), ("cuMemcpyDtoDAsync", b, a, 257, stream),
        ("cuMemcpyDtoDAsync", b, bogus, 16, stream), ("cuMemcpyDtoDAsync", bogus, a, 16, 0, "posted"),
        ("cuMemcpyDtoDAsync", b + 128, a, 128, 0),
        ("cuStreamSynchronize", stream), ("cuCtxSynchronize",),
    ], [
        ("launch", f, stream, "posted"), ("launch", f, stream), ("launch", f, 0, "posted"),
        ("launch", bogus, stream), ("launch", f, bogus, "posted"), ("launch-grid0", f, stream, "posted"),
        ("raw", "cuLaunchKernel", launch_payload(f, stream)[:40]),
        ("raw", "cuStreamQuery", b"\0\0\0\0"), ("raw", "cuStreamQuery", (stream).to_bytes(8, "little") + bytes(8)),
        ("raw", "cuCtxSynchronize", b"\0"), ("raw-posted", "cuEventQuery", b"\1\2"),
        ("generation", "cuStreamQuery", stream), ("flags", "cuStreamQuery", stream),
        ("async-flag", "cuStreamQuery", stream), ("pinned", "cuMemsetD8Async", a, 1, 1, 0),
        ("nop",), ("nop-payload",), ("nop-posted",), ("cuCtxSynchronize",),
    ], [
        ("launch-ex", f, stream, [], "posted"), ("launch-ex", f, stream, [priority]),
        ("launch-ex", f, 0, [priority, completion], "posted"),
        ("launch-ex", f, stream, [(12, (0xDEAD0000).to_bytes(8, "little") + bytes(56))]),
        ("launch-ex", f, stream, [(99, bytes(64))]), ("launch-ex", bogus, stream, []),
        ("launch-ex", f, bogus, [], "posted"),
        ("raw", "cuLaunchKernelEx", launch_ex_payload(f, stream, [priority])[:100]),
        ("raw", "cuLaunchKernelEx", launch_ex_payload(f, stream, [])[:44] + (65).to_bytes(4, "little")),
        ("cuStreamWriteValue32", stream, a, 5, 0, "posted"), ("cuStreamWriteValue32", stream, a + 254, 5, 0),
        ("cuStreamWriteValue32", bogus, a, 1, 0), ("cuStreamWriteValue32", stream, a + 4, 1, 2),
        ("cuStreamWriteValue32", 0, h["reserved"], 9, 0), ("cuStreamWriteValue32", 0, h["reserved"] - 4, 9, 0),
        ("cuStreamWaitValue32", stream, a, 0, 0, "posted"), ("cuStreamWaitValue32", stream, bogus, 0, 0),
        ("cuStreamSynchronize", stream), ("cuCtxSynchronize",),
    ], [
        ("cuMemcpyHtoD", a, 4, b"\x11\x22\x33\x44"), ("cuMemcpyHtoD", a + 252, 4, b"\x55\x66\x77\x88"),
        ("cuMemcpyHtoD", a + 253, 4, b"abcd"), ("cuMemcpyHtoD", a, 8, b"abcd"), ("cuMemcpyHtoD", bogus, 4, b"abcd"),
        ("cuMemcpyHtoD", a, 0, b""), ("cuMemcpyHtoD", b, 400, bytes(range(200)) * 2),
        ("cuMemcpyHtoD", a + 16, 4, b"post", "posted"),
        ("cuMemcpyHtoDAsync", a + 8, 4, stream, b"wxyz"), ("cuMemcpyHtoDAsync", a + 8, 4, 0, b"WXYZ"),
        ("cuMemcpyHtoDAsync", a + 8, 4, bogus, b"nope"),
        ("cuMemcpyDtoH", a, 4), ("cuMemcpyDtoH", b, 256), ("cuMemcpyDtoH", a, 257), ("cuMemcpyDtoH", bogus, 4),
        ("cuMemcpyDtoH", a, 0), ("cuMemcpyDtoH", a, 4, "posted"),
        ("cuMemcpyDtoHAsync", a, 16, stream), ("cuMemcpyDtoHAsync", a, 16, 0), ("cuMemcpyDtoHAsync", a, 16, bogus),
        ("cuMemcpyDtoHAsync", b + 250, 16, stream),
        ("cuMemcpyHtoD", a + 20, 4, b"\x99\x98\x97\x96", "posted"), ("cuMemcpyHtoD", bogus, 4, b"lost", "posted"),
        ("cuMemcpyHtoDAsync", a + 24, 4, 0, b"pst0", "posted"),
        ("cuMemcpyHtoDAsync", a + 28, 4, stream, b"pst1", "posted"),
        ("cuMemcpyDtoH", a, 32), ("cuStreamSynchronize", stream),
    ], [  # page-locked: the pool memory named by its address (cuMemAllocHost's 8 KiB at `pinned`)
        ("pinned-write", 0, b"page-locked bytes, written here"),
        ("pinned", "cuMemcpyHtoD", a + 32, 31, p), ("pinned", "cuMemcpyHtoD", a, 256, p + 8192 - 256),
        ("pinned", "cuMemcpyHtoD", a, 256, p + 8192 - 255), ("pinned", "cuMemcpyHtoD", a, 257, p),
        ("pinned", "cuMemcpyHtoD", bogus, 4, p), ("pinned", "cuMemcpyHtoD", a, 0, p),
        ("pinned", "cuMemcpyHtoD", a, 4, p + 8192), ("pinned", "cuMemcpyHtoD", a, 4, bogus),
        ("pinned", "cuMemcpyDtoH", a, 256, p + 1024), ("pinned", "cuMemcpyDtoH", b, 16, p - 16),
        ("pinned", "cuMemcpyHtoDAsync", b, 64, stream, p, "posted"), ("pinned", "cuMemcpyHtoDAsync", b, 64, bogus, p),
        ("pinned", "cuMemcpyHtoDAsync", b, 64, 0, bogus, "posted"),
        ("pinned", "cuMemcpyDtoHAsync", b, 128, stream, p + 2048, "posted"),
        ("pinned", "cuMemcpyDtoHAsync", b, 128, 0, p + 4096),
        ("pinned", "cuMemcpyDtoHAsync", b, 128, stream, p + 8100), ("pinned-raw", "cuMemcpyDtoH", a, 256),
        ("cuStreamSynchronize", stream), ("cuCtxSynchronize",),
    ]]
    for batch in batches:
        for item in batch:
            name, *rest = item
            posted = bool(rest) and rest[-1] == "posted"
            args = [v for v in rest if v != "posted"]
            if name == "launch-ex":
                s.send(CALLS["cuLaunchKernelEx"].opcode, launch_ex_payload(*args), Flag.NO_REPLY if posted else 0)
            elif name == "launch":
                s.send(CALLS["cuLaunchKernel"].opcode, launch_payload(args[0], args[1]), Flag.NO_REPLY if posted else 0)
            elif name == "launch-grid0":
                s.send(CALLS["cuLaunchKernel"].opcode, launch_payload(args[0], args[1], grid=0), Flag.NO_REPLY)
            elif name in ("raw", "raw-posted"):
                s.send(CALLS[args[0]].opcode, args[1], Flag.NO_REPLY if name == "raw-posted" else 0)
            elif name == "generation":
                s.send(CALLS[args[0]].opcode, CALLS[args[0]].request.encode(*args[1:]), generation=GENERATION + 1)
            elif name == "flags":
                s.send(CALLS[args[0]].opcode, CALLS[args[0]].request.encode(*args[1:]), flags=1 << 5)
            elif name == "async-flag":
                s.send(CALLS[args[0]].opcode, CALLS[args[0]].request.encode(*args[1:]), flags=Flag.ASYNC_ERROR)
            elif name == "pinned" and CALLS[args[0]].pinned is None:  # a call without a pinned variant
                s.send(CALLS[args[0]].opcode | PINNED_COPY, CALLS[args[0]].request.encode(*args[1:]))
            elif name == "pinned":
                s.send(CALLS[args[0]].opcode | PINNED_COPY, CALLS[args[0]].pinned.encode(*args[1:]),  # type: ignore[union-attr]
                       Flag.NO_REPLY if posted else 0)
            elif name == "pinned-raw":  # its pinned request cut short
                s.send(CALLS[args[0]].opcode | PINNED_COPY, CALLS[args[0]].request.encode(*args[1:]))
            elif name == "pinned-write":
                host = s.executor.pool.host_address(p + args[0], len(args[1]))  # type: ignore[union-attr]
                ctypes.memmove(host, args[1], len(args[1]))
            elif name.startswith("nop"):
                s.send(Op.NOP, b"xyz" if name == "nop-payload" else b"", Flag.NO_REPLY if name == "nop-posted" else 0)
            else:
                s.request(name, *args, posted=posted)
        s.replies.extend(s.serve())


def driver_view(fake: FakeDriver) -> list[tuple[str, tuple[Any, ...], tuple[int, ...]]]:
    """What reached the driver, in order; a launch's `extra` (an address in either path) by its contents, a copy's
    host side (a buffer in Python, an address in C) and the page-locked pool's address left out: the bytes moved
    are in the replies and memory."""
    seen = []
    for call in fake.calls:
        if call.name.startswith(("cuMemcpyHtoD", "cuMemcpyDtoH")):
            call = call._replace(args=tuple("host" if i == (1 if call.name.startswith("cuMemcpyHtoD") else 0) else a
                                            for i, a in enumerate(call.args)))
        if call.name.startswith("cuMemHost"):  # the page-locked pool: where this run's region lies
            call = call._replace(args=("pool", *call.args[1:]))
        args = tuple(int(a) if isinstance(a, int) or hasattr(a, "__int__") else a for a in call.args)
        if call.name in ("cuLaunchKernel", "cuLaunchKernelEx"):
            args = args[:-1] + (FakeDriver.decode_extra(int(call.args[-1])) if call.args[-1] else None,)
        if call.name == "cuLaunchKernelEx":  # its configuration's contents are in the launch records
            args = ("config",) + args[1:]
        seen.append((call.name, args, tuple(int(r) for r in call.result[:1])))
    return seen


def run_corpus(s: Served) -> tuple[list[Any], Any, Any, int]:
    handles = setup_session(s)
    # the function's first launch: always the Python path's (it tells the quota); the corpus launches it again
    s.send(CALLS["cuLaunchKernel"].opcode, launch_payload(handles["function"], 0))
    assert s.serve()[0][2] == SUCCESS
    s.replies = []
    before = s.hot.served if s.hot is not None else 0
    corpus(s, handles)
    host = s.executor.pool.host_address(handles["pinned"], 8192)  # type: ignore[union-attr]
    memory = bytes(s.fake.memory[handles["a"]]) + bytes(s.fake.memory[handles["b"]]) + ctypes.string_at(host, 8192)
    return s.replies, driver_view(s.fake), (memory, s.fake.launches), (s.hot.served if s.hot else 0) - before


def test_the_compiled_path_answers_the_corpus_exactly_as_the_python_path(make: Any) -> None:
    python_replies, python_driver, python_state, _ = run_corpus(make(False))
    compiled = make(True)
    c_replies, c_driver, c_state, served_in_c = run_corpus(compiled)
    assert c_replies == python_replies
    assert c_driver == python_driver
    assert c_state == python_state
    # the corpus is hostile half the time; the well-formed, owned half must have been C's
    assert served_in_c >= 50, served_in_c
    counts = compiled.hot.counts()  # type: ignore[union-attr]
    for name in hot_path.PINNED_HOT:  # each page-locked copy too
        assert counts.get(CALLS[name].opcode + PINNED_COPY, (0,))[0] >= 1, name
    assert b"page-locked bytes, written here" in c_state[0]  # they moved the pool's bytes
    statuses = {status for _, _, status, _ in python_replies}
    assert {SUCCESS, INVALID_HANDLE, INVALID_VALUE, Status.MALFORMED} <= statuses  # the corpus reaches the refusals


def test_unowned_handles_and_pointers_never_reach_the_driver_through_the_compiled_path(make: Any) -> None:
    s = make(True)
    h = setup_session(s)
    served, calls = s.hot.served, len(s.fake.calls)
    s.request("cuStreamQuery", 0xBAD0)
    s.request("cuEventRecord", 0xBAD0, 0, posted=True)
    s.request("cuMemsetD8Async", h["a"] + 200, 1, 57, 0, posted=True)  # one byte past the allocation
    s.request("cuMemcpyDtoDAsync", h["a"], h["b"] + 0x10000, 4, 0)
    s.send(CALLS["cuLaunchKernel"].opcode, launch_payload(h["function"] + 0x10, 0))
    replies = s.serve()
    assert [r[2] for r in replies] == [INVALID_HANDLE, INVALID_HANDLE, INVALID_VALUE, INVALID_VALUE, INVALID_HANDLE]
    assert [r[1] for r in replies] == [0, Flag.ASYNC_ERROR, Flag.ASYNC_ERROR, 0, 0]
    assert s.hot.served == served  # every one answered by the Python path
    assert len(s.fake.calls) == calls  # and none reached the driver


def _hot(s: Served, name: str, h: dict[str, int]) -> tuple[int, int]:
    """One record of a hot call naming `name`'s handle or memory, served: (its status, how many records C served)."""
    served = s.hot.served  # type: ignore[union-attr]
    if name == "function":
        s.send(CALLS["cuLaunchKernel"].opcode, launch_payload(h["function"], h["stream"]))
    elif name == "memory":  # 16 bytes at 96 into the allocation: C remembers the allocation, not these bytes
        s.request("cuMemsetD8Async", h["a"] + 96, 1, 16, h["stream"])
    elif name == "pinned":
        call = CALLS["cuMemcpyDtoH"]
        s.send(call.opcode | PINNED_COPY, call.pinned.encode(h["b"], 16, h["pinned"] + 512))  # type: ignore[union-attr]
    else:
        s.request("cuStreamQuery" if name == "stream" else "cuEventQuery", h[name])
    ((_, _, status, _),) = s.serve()
    return status, s.hot.served - served  # type: ignore[union-attr]


@pytest.mark.parametrize(("name", "destroy", "owner", "refused"), [
    ("stream", "cuStreamDestroy", "stream", INVALID_HANDLE), ("event", "cuEventDestroy", "event", INVALID_HANDLE),
    ("function", "cuModuleUnload", "module", INVALID_HANDLE), ("memory", "cuMemFree", "a", INVALID_VALUE),
    ("pinned", "cuMemFreeHost", "pinned", INVALID_VALUE)])
def test_what_c_remembers_is_refused_once_it_is_gone(make: Any, name: str, destroy: str, owner: str,
                                                     refused: int) -> None:
    """hot_dispatch.c serves a handle or a range it has seen the ledger allow without asking the ledger again, while
    the ledger's epoch stands still; every removal moves it (session_ledger.WatchedSet, range_table.RangeTable). So a
    stream, an event, a launched function whose module was unloaded, an allocation or a page-locked allocation that
    C served twice a moment ago is refused by the Python path once gone, and never reaches the driver."""
    s = make(True)
    h = setup_session(s)
    _hot(s, "function", h)  # a function's first launch is Python's
    assert [_hot(s, name, h) for _ in range(2)] == [(SUCCESS, 1)] * 2
    s.call(destroy, h[owner])
    calls = len(s.fake.calls)
    status, by_c = _hot(s, name, h)
    assert (status, by_c) == (refused, 0)
    assert len(s.fake.calls) == calls


@pytest.mark.parametrize("name", ["stream", "memory", "pinned"])
def test_what_c_remembers_is_served_without_the_ledger_until_its_epoch_moves(make: Any, name: str) -> None:
    """The remembered answer is used: with the stream or the memory taken out of the ledger behind C's back (its
    epoch left as it was, as no removal through the ledger leaves it), C still serves it; once the epoch moves, C
    asks the ledger, and the Python path refuses it."""
    s = make(True)
    h = setup_session(s)
    assert _hot(s, name, h) == (SUCCESS, 1)
    ledger = s.executor.ledger
    if name == "stream":
        ledger.handles = {**ledger.handles, "CUstream": set()}  # not a removal the epoch sees
    else:
        table = ledger.allocations if name == "memory" else ledger.pool.allocations  # type: ignore[union-attr]
        dict.clear(table)  # nor is this (its sorted bases left behind, so C's search scans the empty dict)
    assert _hot(s, name, h) == (SUCCESS, 1)
    if name != "stream":
        table.bases.clear()  # the table whole again, for the Python path's search
    ledger.epoch[0] += 1
    assert _hot(s, name, h) == ((INVALID_HANDLE if name == "stream" else INVALID_VALUE), 0)


def test_attributed_launches_and_stream_memory_operations_are_served_in_c(make: Any) -> None:
    """JAX's steady state (docs/performance.md): cuLaunchKernelEx, and the cuStreamWriteValue32/WaitValue32 pair
    a guest's cuLaunchHostFunc is made of, on page-locked or reserved memory the ledger itself answers for."""
    s = make(True)
    h = setup_session(s)
    s.send(CALLS["cuLaunchKernel"].opcode, launch_payload(h["function"], 0))  # the first launch: Python's
    assert [r[2] for r in s.serve()] == [SUCCESS]
    served = s.hot.served
    event = h["event"].to_bytes(8, "little") + bytes(56)
    for attributes in ([(8, (3).to_bytes(64, "little"))], [(12, event)], []):
        s.send(CALLS["cuLaunchKernelEx"].opcode, launch_ex_payload(h["function"], h["stream"], attributes),
               Flag.NO_REPLY)
    s.request("cuStreamWriteValue32", h["stream"], h["a"], 5, 0, posted=True)
    s.request("cuStreamWaitValue32", h["stream"], h["a"], 5, 1, posted=True)  # EQ: met by the write before it
    s.request("cuStreamWriteValue32", 0, h["reserved"], 9, 0)  # reserved, unmapped: the driver refuses it
    s.request("cuStreamSynchronize", h["stream"])
    replies = s.serve()
    assert [r[2] for r in replies] == [INVALID_VALUE, SUCCESS]
    assert s.hot.served - served == 7
    assert [[a[0] for a in launch.get("attributes", [])] for launch in s.fake.launches[-3:]] == [[8], [12], []]
    assert s.fake.launches[-1]["params"] == "0506"
    # NCCL's shape: three attributes and a few KiB of arguments, inline in a default slot and so C's too
    nccl = bytes(range(256)) * 12
    attributes = [(8, (3).to_bytes(64, "little")), (12, event), (10, (1).to_bytes(64, "little"))]
    payload = launch_ex_payload(h["function"], h["stream"], attributes, nccl)
    assert len(payload) + 32 <= Geometry.build(s.region.size, 1).slot_size
    served = s.hot.served
    s.send(CALLS["cuLaunchKernelEx"].opcode, payload, Flag.NO_REPLY)
    s.request("cuStreamSynchronize", h["stream"])
    assert [r[2] for r in s.serve()] == [SUCCESS]
    assert s.hot.served - served == 2
    assert s.fake.launches[-1]["params"] == nccl.hex()


def test_a_freed_allocation_is_refused_at_once(make: Any) -> None:
    s = make(True)
    h = setup_session(s)
    s.request("cuMemsetD8Async", h["a"], 1, 16, 0)
    assert [r[2] for r in s.serve()] == [SUCCESS]
    served = s.hot.served
    s.call("cuMemFree", h["a"])  # the Python path changes the ledger; C reads it, not a copy
    s.request("cuMemsetD8Async", h["a"], 1, 16, 0)
    assert [r[2] for r in s.serve()] == [INVALID_VALUE]
    assert s.hot.served == served  # the free and the refused memset: both the Python path's


def test_posted_calls_reply_only_when_they_fail_with_an_async_error(make: Any) -> None:
    s = make(True)
    h = setup_session(s)
    served = s.hot.served
    first = s.request("cuStreamWaitEvent", h["stream"], h["event"], 0, posted=True)
    failed = s.request("cuStreamWaitEvent", h["stream"], h["event"], 5, posted=True)  # the driver refuses flags 5
    s.request("cuCtxSynchronize", posted=True)
    replies = s.serve()
    assert s.hot.served == served + 3  # all three C's, the failure included
    assert replies == [(failed, Flag.ASYNC_ERROR, INVALID_VALUE, b"")]
    assert first not in [r[0] for r in replies]


def test_posted_failures_are_reported_64_times_then_no_more(make: Any) -> None:
    s = make(True)
    h = setup_session(s)
    replies = []
    for _ in range(3):
        for _ in range(30):
            s.request("cuStreamWaitEvent", h["stream"], h["event"], 5, posted=True)
        replies += s.serve()
    assert len(replies) == 64 and all(r[1] == Flag.ASYNC_ERROR for r in replies)


def test_the_compiled_wait_hands_back_for_liveness_checks(make: Any) -> None:
    """With no record, serve() returns to Python within the policy's check interval (the worker then runs
    parent_alive), and the wait goes on where it was: it does not spin again."""
    s = make(True, WaitPolicy(spin_s=0.0, busy_spin_s=0.0, min_sleep=1e-4, max_sleep=1e-3, check_every_s=0.01))
    assert s.hot is not None
    codes = [s.hot.serve(True)[0] for _ in range(3)]
    assert codes == [s.hot.CHECK] * 3
    s.request("cuCtxSynchronize")  # no context was made: the driver's answer, from C
    assert s.serve() == [(1, 0, INVALID_CONTEXT, b"")] and s.hot.served == 1


def test_a_full_completion_ring_is_left_to_the_python_path_and_no_reply_is_overwritten(make: Any) -> None:
    """hot_dispatch.c reads the guest's completion head again only when its last reading says "full": a ring of
    replies the client has not taken stops it, and the replies already there stay as they were."""
    s = make(True)
    entries = s.region.geometry.ring_entries
    ids = [s.request("cuCtxSynchronize") for _ in range(entries)]
    assert s.hot is not None and s.hot.serve(False)[0] == s.hot.IDLE  # all answered: the completion ring is full
    one_more = s.request("cuCtxSynchronize")
    assert s.hot.serve(False)[0] == s.hot.PYTHON  # no room for its reply: left where it is
    completions = s.client.in_ring  # each reply published with the mark a compiled guest watches
    assert [s.region.u32[(completions.data + i * completions.cell + SEQ_AT) >> 2] for i in range(entries)] == \
        [publish_mark(i + 1) for i in range(entries)]
    assert [s.client.receive(wait=False).call_id for _ in range(entries)] == ids  # type: ignore[union-attr]
    assert s.serve() == [(one_more, 0, INVALID_CONTEXT, b"")]


def test_a_request_is_seen_by_its_mark_and_one_without_a_mark_by_its_tail(make: Any) -> None:
    """The compiled path watches each request slot's mark (the line it reads the record from) and reads the tail only
    when it does not wait (serve(False)) or once its spin is over, so a guest that published a record by its tail alone
    is served all the same."""
    s = make(True, WaitPolicy(spin_s=0.0, busy_spin_s=0.0, min_sleep=1e-4, max_sleep=1e-3, check_every_s=0.01))
    assert s.hot is not None
    requests = s.host.in_ring
    tail_word = requests._tail_i

    def slot_mark(index: int) -> int:
        return (requests.data + (index % requests.capacity) * requests.cell + SEQ_AT) >> 2
    s.request("cuCtxSynchronize")
    s.region.u32[tail_word] = 0  # published by its mark alone
    s.hot.serve(True)  # it then finds the tail behind its head, as from a broken guest, and leaves that to Python
    assert s.hot.served == 1 and s.host.in_ring.snapshot() == (1, 0)  # taken though the tail never said so
    s.region.u32[tail_word] = 1
    for block in (False, True):  # by the tail alone: at once without a wait, after the spin with one
        s.request("cuCtxSynchronize")
        s.region.u32[slot_mark(s.next_id - 1)] = 0
        s.hot.serve(block)
        assert s.hot.served == s.next_id, block
    assert [record.status for record in iter(lambda: s.client.receive(wait=False), None)] == [INVALID_CONTEXT] * 3


def test_a_slot_rewritten_while_it_is_served_changes_nothing_that_was_checked(make: Any) -> None:
    """The guest owns its request slots and may rewrite one while the compiled path serves it: the record is checked
    and used from one copy taken out of the slot. Here the guest's rewrite lands between the checks and the driver
    call (during the capture query of an async copy to the device): the copy's size, checked against the record's
    length, grows to 60,000 bytes and its bytes change. The driver must see the size and bytes that were checked."""
    s = make(True)
    h = setup_session(s)
    ring = s.client.out_ring
    slot = ring.data + (ring.snapshot()[1] & ring.mask) * ring.cell  # where the next request goes
    query = s.fake.cuStreamIsCapturing

    def guest_rewrites_its_slot(stream: int) -> Any:
        s.region.buf[slot + 32 + 8:slot + 32 + 16] = (60_000).to_bytes(8, "little")  # the copy's size
        s.region.buf[slot + 32 + 24:slot + 32 + 28] = b"EVIL"
        return query(stream)
    s.fake.cuStreamIsCapturing = guest_rewrites_its_slot  # type: ignore[method-assign]
    s.fake.calls.clear()
    s.request("cuMemcpyHtoDAsync", h["a"], 4, h["stream"], b"abcd", posted=True)
    s.request("cuMemcpyDtoH", h["a"], 4)
    assert s.serve() == [(s.next_id, 0, SUCCESS, b"abcd")]
    copy = next(c for c in s.fake.calls if c.name == "cuMemcpyHtoDAsync")
    assert copy.args[2] == 4 and s.hot is not None and s.hot.served >= 2


def test_a_ring_the_peer_broke_is_left_to_the_python_path(make: Any) -> None:
    from ivshmem.errors import ChannelCorrupt
    s = make(True)
    s.request("cuCtxSynchronize")
    s.region.u32[s.host.in_ring._tail_i] = 1000  # tail far beyond head: more records than slots
    with pytest.raises(ChannelCorrupt):
        s.serve()


def test_without_a_compiler_the_worker_serves_in_python_and_says_so_once(
        make: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))  # nothing built here yet
    hot_path.reset()
    try:
        with caplog.at_level(logging.WARNING, logger="host_agent.native_build"):
            s = make(False)
            assert hot_path.attach(s.host, s.executor) is None
            assert hot_path.attach(s.host, s.executor) is None
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "no C compiler" in lines[0] and "in Python" in lines[0]
        assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
        h = setup_session(s)  # and the session is served all the same
        s.request("cuStreamQuery", h["stream"])
        assert [r[2] for r in s.serve()] == [SUCCESS]
    finally:
        hot_path.reset()


def test_stats_count_each_opcodes_records_by_the_path_that_served_them(make: Any) -> None:
    """The wire's STATS (ORION_STATS): per opcode, the records the compiled path served and those Python answered
    since the session first asked, Python's time, and the compiled path's time with its driver's part (a session
    that never asks is not timed). A stream's first query is C's like the rest; an unknown handle is Python's (C
    leaves it), and so is every call C does not serve."""
    s = make(True)
    h = setup_session(s)
    s.request("cuStreamQuery", h["stream"])
    s.serve()

    def rows() -> dict[int, tuple[int, ...]]:
        return {op: tuple(columns) for op, *columns in STATS_REPLY.decode(_stats(s))[0]}
    query, count = CALLS["cuStreamQuery"].opcode, CALLS["cuDeviceGetCount"].opcode
    first = rows()  # counted so far, timed by neither path: counting and timing start now
    assert first[query][0] >= 1
    assert all(python == 0 == python_ns == compiled_ns == driver_ns
               for _compiled, python, python_ns, compiled_ns, driver_ns in first.values()), first
    for _ in range(3):
        s.request("cuStreamQuery", h["stream"])
    s.request("cuStreamQuery", 0xBAD)  # not the session's: Python refuses it
    s.request("cuDeviceGetCount")
    s.serve()
    after = rows()
    assert after[query][:2] == (3, 1)
    assert after[count][:2] == (0, 1)
    compiled, python, python_ns, compiled_ns, driver_ns = after[query]
    assert python_ns > 0
    assert 0 < driver_ns < compiled_ns  # the stand-in's time, within the record's
    assert after[count][3:] == (0, 0)  # no compiled record, no compiled time
    assert int(Op.STATS) not in after  # asking is not a record served


def _stats(s: Any) -> bytes:
    s.send(int(Op.STATS))
    ((_, _, status, payload),) = s.serve()
    assert status == SUCCESS
    return payload


def test_a_changed_table_entry_is_left_to_the_python_path(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """C decodes the layouts hot_path.HOT_CALLS names; an entry the table no longer declares so is not C's."""
    monkeypatch.setitem(hot_path.HOT_CALLS, "cuStreamQuery", hot_path.Hot("K_STREAM", "<I", ("CUstream",)))
    monkeypatch.setitem(hot_path.HOT_CALLS, "cuMemcpyDtoH", hot_path.Hot("K_DTOH", "<QQ", (("device", "u64"),)))
    served = make(False)
    functions, keep = stand_ins(served.fake)
    served.executor.hot_functions = functions  # type: ignore[attr-defined]
    hot = hot_path.attach(served.host, served.executor)
    assert hot is not None and "cuStreamSynchronize" in hot.calls and "cuMemcpyHtoD" in hot.calls
    assert "cuStreamQuery" not in hot.calls and "cuMemcpyDtoH" not in hot.calls
    hot.close()
    del keep


def test_the_worker_loop_runs_its_liveness_check_while_the_compiled_path_waits(make: Any) -> None:
    """The worker's check (parent_alive: a dead supervisor ends the worker) runs from the compiled wait's slow
    phase as from the Python wait's."""
    s = make(True, WaitPolicy(spin_s=0.0, busy_spin_s=0.0, min_sleep=1e-4, max_sleep=1e-3, check_every_s=0.01))
    checks = []

    class SupervisorGone(Exception):
        pass

    def check() -> None:
        checks.append(1)
        if len(checks) == 3:
            raise SupervisorGone
    s.host.check = check
    with pytest.raises(SupervisorGone):
        s.loop.run()  # blocks in C: only the check can end it
    assert len(checks) == 3


def test_with_the_real_driver_the_functions_are_cydrivers() -> None:
    """The addresses the hot path calls are those cuda.bindings.cydriver exports (its __pyx_capi__ capsules, the
    functions cuda-python's own wrappers call), one per hot call."""
    cydriver = pytest.importorskip("cuda.bindings.cydriver")
    from cuda.bindings import driver

    class Real:
        pass
    handler = Real()
    handler.driver = driver  # type: ignore[attr-defined]
    functions = hot_path.driver_functions(handler)
    assert set(functions) == hot_path.DRIVER_FUNCTIONS
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    for name, address in functions.items():
        capsule = cydriver.__pyx_capi__[name]
        assert get_name(capsule).startswith(b"CUresult (")  # a C function returning the driver's status
        assert address and address == get_pointer(capsule, get_name(capsule))
    assert len(set(functions.values())) == len(functions)


def test_no_code_is_loaded_from_a_cache_others_can_write(
        make: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The agent runs what it loads as itself: a cache directory another user could write is refused."""
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    cache.chmod(0o777)
    monkeypatch.setenv("ORION_CACHE_DIR", str(cache))
    hot_path.reset()
    try:
        with caplog.at_level(logging.WARNING, logger="host_agent.native_build"):
            s = make(False)
            assert hot_path.attach(s.host, s.executor) is None
        assert "writable by others" in caplog.text
        assert list(cache.iterdir()) == []  # nothing was built there either
    finally:
        hot_path.reset()


def test_small_copies_to_the_device_go_from_pageable_memory_and_async_ones_do_not_wait(make: Any) -> None:
    """A copy's bytes from the ring are copied into the worker's own pageable memory (the driver stages it before
    it returns, so the slot is free at once): an async copy is queued on its stream with no wait for the stream,
    except on a stream that may be capturing, which the Python path waits for and copies synchronously, as before."""
    for compiled in (False, True):
        s = make(compiled)
        h = setup_session(s)
        served = s.hot.served if s.hot else 0
        s.fake.calls.clear()
        s.request("cuMemcpyHtoDAsync", h["a"], 4, h["stream"], b"abcd", posted=True)
        s.request("cuMemcpyHtoD", h["a"] + 4, 4, b"efgh", posted=True)
        s.request("cuMemcpyDtoH", h["a"], 8)
        assert s.serve() == [(s.next_id, 0, SUCCESS, b"abcdefgh")]
        assert [c.name for c in s.fake.calls] == ["cuStreamIsCapturing", "cuMemcpyHtoDAsync", "cuMemcpyHtoD",
                                                  "cuMemcpyDtoH"]
        host_side = s.fake.calls[1].args[1]
        assert not isinstance(host_side, memoryview)  # not the ring slot: our own copy of its bytes
        assert (s.hot.served if s.hot else 0) - served == (3 if compiled else 0)
        s.call("cuStreamBeginCapture", h["stream"], 0)
        s.fake.calls.clear()
        s.request("cuMemcpyHtoDAsync", h["a"], 4, h["stream"], b"wxyz")
        replies = s.serve()
        assert [c.name for c in s.fake.calls][-2:] == ["cuStreamIsCapturing", "cuStreamSynchronize"]
        assert replies[0][2] != SUCCESS  # a capturing stream cannot be waited for: the driver's error, as before


def test_many_allocations_are_searched_with_the_python_paths_answers(make: Any) -> None:
    """The ledger's range tables are searched by their sorted bases (range_table.py; hot_dispatch.c owns_range), not
    scanned: with 200 allocations of varied sizes, some freed, a memset at each one's first and last byte, one byte
    past its end, straddling into the next, in a freed one's place and before them all is answered as the Python
    path answers it, and every owned one by C."""
    answers = []
    for compiled in (False, True):
        s = make(compiled)
        setup_session(s)
        bases = [s.call("cuMemAlloc", 256 * (1 + i % 7))[0] for i in range(200)]
        for base in bases[::9]:
            s.call("cuMemFree", base)
        sizes = dict(s.executor.ledger.allocations)
        probes = [(bases[0] - 1, 1)]
        for base in bases:
            size = sizes.get(base, 256)
            probes += [(base, 1), (base + size - 1, 1), (base + size, 1), (base + size - 2, 4), (base, size)]
        served = s.hot.served if s.hot is not None else 0
        replies = []
        for at in range(0, len(probes), 32):  # batches the request ring holds
            for pointer, count in probes[at:at + 32]:
                s.request("cuMemsetD8Async", pointer, 7, count, 0)
            replies += s.serve()
        answers.append([r[2] for r in replies])
        owned = sum(s.executor.ledger.owns(pointer, count) for pointer, count in probes)
        if s.hot is not None:
            assert s.hot.served - served == owned, (s.hot.served - served, owned)
        # and both as a scan of every live allocation answers
        assert answers[-1] == [SUCCESS if any(b <= p and p + n <= b + size for b, size in sizes.items())
                               else INVALID_VALUE for p, n in probes]
    assert answers[0] == answers[1]
    assert answers[0].count(SUCCESS) > 300 and answers[0].count(INVALID_VALUE) > 300, answers[0]
