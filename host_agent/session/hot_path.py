"""The session worker's compiled hot path: builds and loads hot_dispatch.c, and binds it to one session.

    python -m host_agent.session.hot_path      build it now (setup.sh does), print where it is

A forwarded call's host side was ~4 µs of Python (docs/performance.md: receive, the generic dispatch, send)
around a driver call of about a microsecond. `HotPath` serves the records that dominate a CUDA program's steady
state — launches (with launch attributes too), async memsets and device copies, small copies to and from the
host and every copy to or from the guest's page-locked pool memory, stream/event record (with flags too, as NCCL
records one per collective), wait, query and synchronise, the stream memory operations a guest's host functions are
made of, the context switch a multi-threaded guest posts, and the wire NOP — in C, calling cuda.bindings.cydriver's C
functions directly; everything else, and every record C is not sure of, is answered by the Python path
(session_loop.RecordLoop, executor.py), which stays the reference: C never refuses a record itself, so every
error a guest can provoke is the Python path's (hot_dispatch.c says how).

The module is built and loaded by native_build.py (compiled on first use into a cache directory, and reused);
without a compiler or Python's headers, or when ORION_HOT_PATH=0, the worker serves everything in Python and says
so in one log line. A relayed session's socket is served through the transport's declared interface
(handler.StreamTransport), never by reaching into the relay's classes.
"""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from ivshmem.channel import Endpoint
from ivshmem.driver_api import (
    BY_OPCODE,
    LAUNCH_ATTRIBUTES_EVENT,
    LAUNCH_ATTRIBUTES_PLAIN,
    PINNED_COPY,
    DriverCall,
    attribute_mask,
)
from ivshmem.record import Op

from .. import native_build
from ..diagnostics import DiagnosticsHandler
from ..handler import StreamTransport
from ..native_build import NativeModule, ring_shape

SOURCE = Path(__file__).resolve().with_name("hot_dispatch.c")
MODULE = "_orion_hot_dispatch"

class Hot(NamedTuple):
    """How hot_dispatch.c serves one call: its kind there, the request it decodes (the fixed struct, and the input
    types of a generic call or the request's fields of a hand-written one), and the driver function it calls
    when that is not the call's own (an async copy runs as a stream synchronise, then the synchronous copy, as
    executor._start_copy does)."""

    kind: str
    layout: str
    shape: tuple[Any, ...]
    function: str = ""


_COPY = (("device", "u64"), ("size", "u64"))
_LAUNCH = (("function", "u64"), ("grid_x", "u32"), ("grid_y", "u32"), ("grid_z", "u32"), ("block_x", "u32"),
           ("block_y", "u32"), ("block_z", "u32"), ("shared_bytes", "u32"), ("stream", "u64"))
# A call is served in C only while the table still declares exactly this (checked when a session starts), so a
# changed entry falls back to the Python path.
HOT_CALLS: dict[str, Hot] = {
    "cuCtxSynchronize": Hot("K_VOID", "<", ()),
    "cuStreamSynchronize": Hot("K_STREAM", "<Q", ("CUstream",)),
    "cuStreamQuery": Hot("K_STREAM", "<Q", ("CUstream",)),
    "cuEventQuery": Hot("K_EVENT", "<Q", ("CUevent",)),
    "cuEventSynchronize": Hot("K_EVENT", "<Q", ("CUevent",)),
    "cuCtxSetCurrent": Hot("K_CONTEXT", "<Q", ("CUcontext",)),
    "cuEventRecord": Hot("K_EVENT_STREAM", "<QQ", ("CUevent", "CUstream")),
    "cuEventRecordWithFlags": Hot("K_EVENT_STREAM_FLAGS", "<QQI", ("CUevent", "CUstream", "unsigned int")),
    "cuStreamWaitEvent": Hot("K_STREAM_EVENT_FLAGS", "<QQI", ("CUstream", "CUevent", "unsigned int")),
    "cuMemsetD8Async": Hot("K_MEMSET8", "<QBQQ", ("CUdeviceptr", "unsigned char", "size_t", "CUstream")),
    "cuMemsetD16Async": Hot("K_MEMSET16", "<QHQQ", ("CUdeviceptr", "unsigned short", "size_t", "CUstream")),
    "cuMemsetD32Async": Hot("K_MEMSET32", "<QIQQ", ("CUdeviceptr", "unsigned int", "size_t", "CUstream")),
    "cuMemcpyDtoDAsync": Hot("K_DTOD", "<QQQQ", ("CUdeviceptr", "CUdeviceptr", "size_t", "CUstream")),
    "cuLaunchKernel": Hot("K_LAUNCH", "<QIIIIIIIQ", (*_LAUNCH, ("params", "tail"))),
    "cuLaunchKernelEx": Hot("K_LAUNCH_EX", "<QIIIIIIIQ", (*_LAUNCH, ("attributes", "[i4x64s]"), ("params", "tail"))),
    "cuStreamWriteValue32": Hot("K_STREAM_VALUE", "<QQII", ("CUstream", "CUdeviceptr", "cuuint32_t", "unsigned int")),
    "cuStreamWaitValue32": Hot("K_STREAM_VALUE", "<QQII", ("CUstream", "CUdeviceptr", "cuuint32_t", "unsigned int")),
    "cuMemcpyHtoD": Hot("K_HTOD", "<QQ", (*_COPY, ("data", "tail"))),
    "cuMemcpyHtoDAsync": Hot("K_HTOD_ASYNC", "<QQQ", (*_COPY, ("stream", "u64"), ("data", "tail"))),
    "cuMemcpyDtoH": Hot("K_DTOH", "<QQ", _COPY),
    "cuMemcpyDtoHAsync": Hot("K_DTOH_ASYNC", "<QQQ", (*_COPY, ("stream", "u64")), "cuMemcpyDtoH"),
}
# Hand-written in executor.py and mirrored in C: the qualified name of the handler C stands in for.
MIRRORED = {"cuLaunchKernel": "CudaExecutor._launch", "cuLaunchKernelEx": "CudaExecutor._launch",
            "cuMemcpyHtoD": "CudaExecutor._htod",
            "cuMemcpyHtoDAsync": "CudaExecutor._htod", "cuMemcpyDtoH": "CudaExecutor._dtoh",
            "cuMemcpyDtoHAsync": "CudaExecutor._dtoh"}
# The copies whose host side is the guest's page-locked pool memory (opcode + PINNED_COPY; executor._pinned_copy):
# their kind, and the pinned request C decodes.
PINNED_HOT: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "cuMemcpyHtoD": ("K_PINNED_HTOD", (*_COPY, ("host", "u64"))),
    "cuMemcpyDtoH": ("K_PINNED_DTOH", (*_COPY, ("host", "u64"))),
    "cuMemcpyHtoDAsync": ("K_PINNED_HTOD_ASYNC", (*_COPY, ("stream", "u64"), ("host", "u64"))),
    "cuMemcpyDtoHAsync": ("K_PINNED_DTOH_ASYNC", (*_COPY, ("stream", "u64"), ("host", "u64"))),
}
DRIVER_FUNCTIONS = frozenset(HOT_CALLS) | {"cuStreamSynchronize", "cuStreamIsCapturing"}  # what C may call

PROGRAM = NativeModule(SOURCE, MODULE, "compiled hot path", "session workers serve every record in Python")
Unavailable = native_build.Unavailable
build, load, reset = PROGRAM.build, PROGRAM.load, PROGRAM.reset


# --- the driver's C functions -------------------------------------------------------------------------------------
def _capsule_pointer(capsule: object) -> int:
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return int(get_pointer(capsule, get_name(capsule)) or 0)


def driver_functions(handler: Any) -> dict[str, int]:
    """name -> address of the C function the hot path calls for it: cuda.bindings.cydriver's (the functions
    cuda-python's wrappers call, without the wrappers) when the handler runs the real driver; a handler with a
    stand-in driver (the tests) names its own C-callable stand-ins in `hot_functions`."""
    given = getattr(handler, "hot_functions", None)
    if given is not None:
        return dict(given)
    driver = getattr(handler, "driver", None)
    if driver is None or getattr(driver, "__name__", "") != "cuda.bindings.driver":
        return {}
    try:
        from cuda.bindings import cydriver
    except ImportError:
        return {}
    capi = getattr(cydriver, "__pyx_capi__", {})
    return {name: _capsule_pointer(capi[name]) for name in DRIVER_FUNCTIONS if name in capi}


def _servable(call: DriverCall, executor_module: Any) -> bool:
    """Whether C still decodes and checks `call` exactly as the Python path does (else it stays Python's)."""
    hot = HOT_CALLS[call.name]
    if call.inputs.format != hot.layout or call.effects or call.output_types:
        return False
    if call.name in executor_module.POLICY.by_name:
        return False
    written = executor_module.HOST.by_name.get(call.name)
    if written is None:
        return call.name not in MIRRORED and call.input_types == hot.shape
    return getattr(written, "__qualname__", "") == MIRRORED.get(call.name) and call.request.fields == hot.shape


class HotPath:
    """One session's compiled dispatcher, bound to its transport, handler and ledger."""

    def __init__(self, module: ModuleType, endpoint: Endpoint | StreamTransport, handler: Any) -> None:
        """`endpoint` is a ring's, or a relayed session's stream whose socket compiled code may serve
        (StreamTransport.compiled_socket: a TCP relay connection); another stream (RDMA) is Unavailable."""
        policy = endpoint.policy
        timing = (policy.spin_s, policy.busy_spin_s, policy.min_sleep, policy.max_sleep, policy.check_every_s)
        self.ring: Endpoint | None = endpoint if isinstance(endpoint, Endpoint) else None
        self.stream: StreamTransport | None = None
        if isinstance(endpoint, Endpoint):
            self.dispatcher = module.Dispatcher(endpoint.buf, ring_shape(endpoint.in_ring),
                                                ring_shape(endpoint.out_ring), endpoint.generation, timing)
        else:
            carried = endpoint.compiled_socket()
            if carried is None:
                raise Unavailable("the relay connection is not a TCP stream")
            self.stream = endpoint
            self.dispatcher = module.Dispatcher(None, None, None, endpoint.generation, timing)
            self.dispatcher.set_socket(*carried)
        self.PYTHON, self.CHECK, self.POSTED_FAILED, self.IDLE = (module.PYTHON, module.CHECK, module.POSTED_FAILED,
                                                                  module.IDLE)
        self.calls: list[str] = []
        if isinstance(handler, DiagnosticsHandler):  # NOP: answered OK, whatever it carries (DiagnosticsHandler._nop)
            self.dispatcher.set_call(int(Op.NOP), module.K_NOP, 0)
            self.calls.append("NOP")
        ledger = getattr(handler, "ledger", None)
        functions = driver_functions(handler) if ledger is not None else {}
        if functions:
            from . import executor
            by_name = {call.name: call for call in BY_OPCODE.values()}
            for name, hot in HOT_CALLS.items():
                call, address = by_name.get(name), functions.get(hot.function or name, 0)
                if call is None or not address or not _servable(call, executor):
                    continue
                self.dispatcher.set_call(call.opcode, getattr(module, hot.kind), address)
                self.calls.append(name)
            for name, (kind, shape) in PINNED_HOT.items():
                call, address = by_name.get(name), functions.get(name, 0)
                if call is None or not address or call.pinned is None or tuple(call.pinned.fields) != shape:
                    continue
                self.dispatcher.set_call(call.opcode + PINNED_COPY, getattr(module, kind), address)
                self.calls.append(f"{name} (page-locked)")
            self.dispatcher.set_ledger(ledger)
            self.dispatcher.set_launch_attributes(attribute_mask(LAUNCH_ATTRIBUTES_PLAIN),
                                                  attribute_mask(LAUNCH_ATTRIBUTES_EVENT))
            self.dispatcher.set_copies(functions.get("cuStreamSynchronize", 0), functions.get("cuStreamIsCapturing", 0))

    @property
    def served(self) -> int:
        """Records answered in C so far."""
        return int(self.dispatcher.served)

    def counts(self) -> dict[int, tuple[int, int, int]]:
        """By opcode, the records answered in C (since time_records(), once called), their nanoseconds here and those
        in the driver's function (the wire's STATS)."""
        return dict(self.dispatcher.counts())

    def time_records(self) -> None:
        """Count and time each record from now on: three clock reads a record (the session's first STATS asks it)."""
        self.dispatcher.set_timing()

    def serve(self, block: bool = True) -> tuple[int, int, int]:
        """Serve hot records until Python must act; (code, call_id, status) as hot_dispatch.c's serve(). The
        Python endpoint's private ring indices are reloaded afterwards (C moved the shared ones)."""
        result: tuple[int, int, int] = self.dispatcher.serve(block)
        if self.stream is not None:
            self.stream.heard(self.dispatcher.heard)
        elif self.ring is not None:
            self.ring.in_ring.resync()
            self.ring.out_ring.resync()
        return result

    def close(self) -> None:
        self.dispatcher.close()


def attach(endpoint: Endpoint | StreamTransport, handler: Any) -> HotPath | None:
    """The compiled hot path for a session served over `endpoint` (a ring's, or a relayed session's over TCP) by
    `handler`, or None (Python serves all)."""
    module = load()
    if module is None:
        return None
    try:
        hot = HotPath(module, endpoint, handler)
    except Unavailable:
        return None
    if not hot.calls:
        hot.close()
        return None
    return hot


if __name__ == "__main__":
    sys.exit(PROGRAM.main())
