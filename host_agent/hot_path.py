"""The session worker's compiled hot path: builds and loads hot_dispatch.c, and binds it to one session.

    python -m host_agent.hot_path      build it now (setup.sh does), print where it is

A forwarded call's host side was ~4 µs of Python (docs/performance.md: receive, the generic dispatch, send)
around a driver call of about a microsecond. `HotPath` serves the records that dominate a CUDA program's steady
state — launches (with launch attributes too), async memsets and device copies, stream/event record, wait,
query and synchronise, the stream memory operations a guest's host functions are made of, the context switch a
multi-threaded guest posts, and the wire NOP — in C, calling cuda.bindings.cydriver's C
functions directly; everything else, and every record C is not sure of, is answered by the Python path
(region_server.RecordLoop, executor.py), which stays the reference: C never refuses a record itself, so every
error a guest can provoke is the Python path's (hot_dispatch.c says how).

The same module carries the relaying host's pump (`relay_pump`: a relayed session's records between its ring and
its TCP relay connection, relay_session.py) and the connection's write lock it shares with Python's writers
(`write_lock`).

The module is compiled with the system C compiler on first use into a cache directory (a file named after the
source's hash and the interpreter) and reused; without a compiler or Python's headers, or when
ORION_HOT_PATH=0, the worker serves everything in Python and says so in one log line.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from ivshmem.channel import Endpoint
from ivshmem.driver_api import (
    BY_OPCODE,
    LAUNCH_ATTRIBUTES_EVENT,
    LAUNCH_ATTRIBUTES_PLAIN,
    DriverCall,
    attribute_mask,
)
from ivshmem.record import Op
from ivshmem.shared.compiler import CFLAGS, find_compiler

from .errors import UnavailableError

log = logging.getLogger(__name__)

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
    "cuMemcpyHtoDAsync": Hot("K_HTOD_ASYNC", "<QQQ", (*_COPY, ("stream", "u64"), ("data", "tail")), "cuMemcpyHtoD"),
    "cuMemcpyDtoH": Hot("K_DTOH", "<QQ", _COPY),
    "cuMemcpyDtoHAsync": Hot("K_DTOH_ASYNC", "<QQQ", (*_COPY, ("stream", "u64")), "cuMemcpyDtoH"),
}
# Hand-written in executor.py and mirrored in C: the qualified name of the handler C stands in for.
MIRRORED = {"cuLaunchKernel": "CudaExecutor._launch", "cuLaunchKernelEx": "CudaExecutor._launch",
            "cuMemcpyHtoD": "CudaExecutor._htod",
            "cuMemcpyHtoDAsync": "CudaExecutor._htod", "cuMemcpyDtoH": "CudaExecutor._dtoh",
            "cuMemcpyDtoHAsync": "CudaExecutor._dtoh"}
DRIVER_FUNCTIONS = frozenset(HOT_CALLS) | {"cuStreamSynchronize"}  # what C may call

_loaded: ModuleType | None | bool = False  # False: not tried yet in this process
PUMP_RING, PUMP_SOCKET, PUMP_CHECK, PUMP_LOST = 0, 1, 2, 3  # why Pump.pump() returned (hot_dispatch.c)


class Unavailable(UnavailableError):
    """The compiled hot path cannot be had here; the message says why, in one line."""


def cache_dir() -> Path:
    """Where the built module is kept: $ORION_CACHE_DIR, else $XDG_CACHE_HOME/orion, else ~/.cache/orion."""
    configured = os.environ.get("ORION_CACHE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "orion"


def build(directory: Path | None = None) -> Path:
    """The compiled module's path, compiling it first unless this source was built for this interpreter already.
    Raises Unavailable with one line."""
    source = SOURCE.read_bytes()
    include = sysconfig.get_paths()["include"]
    tag = hashlib.sha256(source + sys.version.encode() + include.encode()).hexdigest()[:16]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    target = (directory or cache_dir()) / f"{MODULE}-{tag}{suffix}"
    if target.exists():
        _trusted(target.parent)
        _trusted(target)
        return target
    compiler = find_compiler()
    if compiler is None:
        raise Unavailable("no C compiler (set CC, or install gcc)")
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise Unavailable(f"no Python headers in {include} (install python3-dev)")
    try:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise Unavailable(f"cannot create {target.parent}: {exc.strerror}") from None
    _trusted(target.parent)
    # Built beside its final name and renamed: workers of other sessions may build or load it at the same time.
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{MODULE}-", suffix=suffix)
    os.close(fd)
    try:
        done = subprocess.run([*compiler, *CFLAGS, f"-I{include}", "-o", partial, str(SOURCE)],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["(no message)"])[0]
            raise Unavailable(f"{compiler[0]} failed on {SOURCE.name}: {first}")
        os.replace(partial, target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"could not compile {SOURCE.name}: {exc}") from None
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def _trusted(path: Path) -> None:
    """Refuse code another user could have put there: the agent runs what it loads from the cache as itself."""
    info = path.stat()
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise Unavailable(f"{path} is owned by uid {info.st_uid} or writable by others; the agent loads no code "
                          "from it (set ORION_CACHE_DIR to a directory only this user can write)")


def load() -> ModuleType | None:
    """The compiled module, built on first use; None (and one log line per process) where it cannot be had."""
    global _loaded
    if _loaded is not False:
        return _loaded or None  # type: ignore[return-value]
    _loaded = None
    if os.environ.get("ORION_HOT_PATH", "1") == "0":
        log.info("compiled hot path off (ORION_HOT_PATH=0): session workers serve every record in Python")
        return None
    try:
        path = build()
        spec = importlib.util.spec_from_file_location(MODULE, path)
        if spec is None or spec.loader is None:
            raise Unavailable(f"{path} is not a loadable module")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (Unavailable, ImportError) as exc:
        log.warning("compiled hot path unavailable (%s): session workers serve every record in Python", exc)
        return None
    _loaded = module
    return module


def reset() -> None:
    """Forget what load() found (tests that simulate a host without a compiler)."""
    global _loaded
    _loaded = False


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
    """One session's compiled dispatcher, bound to its endpoint (rings), handler and ledger."""

    def __init__(self, module: ModuleType, endpoint: Endpoint, handler: Any) -> None:
        """`endpoint` is a ring's, or a relayed session's StreamEndpoint over a FrameStream (its relay connection
        written under the compiled WriteLock: `relayed_frames`)."""
        self.endpoint = endpoint
        policy = endpoint.policy
        timing = (policy.spin_s, policy.busy_spin_s, policy.min_sleep, policy.max_sleep, policy.check_every_s)
        frames = relayed_frames(endpoint, module)
        self.relayed = frames is not None
        if frames is None:
            self.dispatcher = module.Dispatcher(endpoint.buf, _ring(endpoint.in_ring), _ring(endpoint.out_ring),
                                                endpoint.generation, timing)
        else:
            self.dispatcher = module.Dispatcher(None, None, None, endpoint.generation, timing)
            self.dispatcher.set_socket(frames.sock.fileno(), frames._writing)
        self.PYTHON, self.CHECK, self.POSTED_FAILED, self.IDLE = (module.PYTHON, module.CHECK, module.POSTED_FAILED,
                                                                  module.IDLE)
        self.calls: list[str] = []
        from .diagnostics import DiagnosticsHandler
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
            self.dispatcher.set_ledger(ledger)
            self.dispatcher.set_launch_attributes(attribute_mask(LAUNCH_ATTRIBUTES_PLAIN),
                                                  attribute_mask(LAUNCH_ATTRIBUTES_EVENT))
            self.dispatcher.set_copies(handler, functions.get("cuStreamSynchronize", 0))

    @property
    def served(self) -> int:
        """Records answered in C so far."""
        return int(self.dispatcher.served)

    def serve(self, block: bool = True) -> tuple[int, int, int]:
        """Serve hot records until Python must act; (code, call_id, status) as hot_dispatch.c's serve(). The
        Python endpoint's private ring indices are reloaded afterwards (C moved the shared ones)."""
        result: tuple[int, int, int] = self.dispatcher.serve(block)
        if self.relayed:
            self.endpoint.heard(self.dispatcher.heard)  # type: ignore[attr-defined]
        else:
            self.endpoint.in_ring.resync()
            self.endpoint.out_ring.resync()
        return result

    def close(self) -> None:
        self.dispatcher.close()


def relayed_frames(endpoint: Any, module: ModuleType) -> Any:
    """The FrameStream of a relayed session's endpoint whose connection C may serve (a TCP socket written under the
    compiled WriteLock); None for a ring's endpoint. Another transport (RDMA) has no such stream: Unavailable."""
    frames = getattr(endpoint, "frames", None)
    if frames is None:
        return None
    if isinstance(getattr(frames, "_writing", None), module.WriteLock):
        return frames
    raise Unavailable("the relay connection is not a TCP FrameStream")


def _ring(ring: Any) -> tuple[int, int, int, int, int]:
    """(head word, tail word, first slot, slot size, slots) of a ring, as byte offsets in the region."""
    return ring._head_i * 4, ring._tail_i * 4, ring.data, ring.cell, ring.capacity


def write_lock() -> Any:
    """A relay connection's write lock: the compiled one, which the relay's pump takes too, where it can be had."""
    module = load()
    return module.WriteLock() if module is not None else threading.Lock()


def relay_pump(ring: Endpoint, fd: int, lock: Any, remote_generation: int) -> Any:
    """The compiled pump between a relayed session's ring and its relay connection (socket `fd`, written under
    `lock`), or None where it cannot be had (relay_session.py then runs its Python threads)."""
    module = load()
    if module is None or not isinstance(lock, module.WriteLock):
        return None
    policy = ring.policy
    return module.Pump(ring.buf, _ring(ring.in_ring), _ring(ring.out_ring), (ring.generation, remote_generation), fd,
                       lock, (policy.spin_s, policy.busy_spin_s, policy.min_sleep, policy.max_sleep,
                              policy.check_every_s))


def attach(endpoint: Endpoint, handler: Any) -> HotPath | None:
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


def main() -> int:
    try:
        print(build())
    except Unavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
