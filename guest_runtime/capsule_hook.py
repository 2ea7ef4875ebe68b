"""Route every CUDA driver (or runtime) call of the unmodified cuda-python wheels into Python code.

`cuda.bindings.cydriver.__pyx_capi__` is a dict of PyCapsules, one per driver function, each named by its exact C
signature. Every consumer — `cuda.bindings.driver`, cuda.core (its Cython modules and its C++ resource handles),
numba-cuda through `cuda.bindings.driver` — copies its function pointers out of that dict when it is first imported
(Cython's `__Pyx_ImportFunction`: `PyCapsule_GetPointer(capsule, signature)`). `install` replaces the capsules with
capsules of the same name around ctypes `CFUNCTYPE` trampolines; done before any consumer is imported, every call
of those wheels lands in `implementations[name]` or, for what is not implemented, in `fallback(name)`.
`cuda.bindings.cyruntime.__pyx_capi__` works the same way for the runtime API.

Rules, all there so that C never sees a wrong answer:

* Activation must come before the first CUDA import: `install` raises `HookError` naming the consumer modules that
  already copied the old pointers. Hooking is per process and irreversible; a second `install` of the same module
  is a no-op that returns the first report.
* An exception inside an implementation or a fallback never reaches C (ctypes would print it and return garbage):
  it is logged once per function and the call returns CUDA_ERROR_UNKNOWN (999, also cudaErrorUnknown). A status
  function that returns something other than an int is treated the same way.
* A signature ctypes cannot express (a struct by value, see `ctypes_signature`) cannot get an implementation
  (`HookError`); when it returns a status and has no implementation it gets a trampoline that takes no arguments
  and calls the fallback with none — safe because on the platforms CUDA supports the caller owns the argument
  area — so it still answers CUDA_ERROR_NOT_SUPPORTED instead of reaching the real library.
* A function that returns something other than a status (`cudaGetErrorName`, `make_cudaExtent`, ...) keeps its
  original capsule unless it is implemented: these are pure host-side helpers, and a fallback's status code would
  be read as a pointer or a struct.

* After the interpreter has finalized, a trampoline must not run (it would take the GIL of a dead interpreter and
  crash). cuda.core's C++ layer does call the driver that late: its thread-local primary-context cache is released
  by C++ thread-local destructors inside `exit()`, through `cuda_core::p_cuDevicePrimaryCtxRelease`, a global it
  filled from the capsules. So at Python exit (an `atexit` handler, registered at the first `install`, hence run
  after those registered later) every such exported `cuda_core::p_cu*` global that still holds one of our
  trampolines is pointed at libc's `sched_yield` instead: a native function taking nothing and returning 0, i.e.
  CUDA_SUCCESS for a release nobody can observe any more (the host reclaims the session's resources). Trampolines
  are also never freed, so calls made while modules are torn down still find live code.
* Nothing at exit may import or wait: an import then can hang the interpreter for good (CuPy puts
  `importlib.util.LazyLoader` modules such as `cupyx` in `sys.modules`, and merely reading an attribute of one
  imports it). So that handler looks at `sys.modules` by name, reads only the `__dict__` of plain module objects
  (never an attribute of anything else), and uses only what `install` resolved: the no-op's address and the
  mangled names. Its one foreign call is dlopen(RTLD_NOLOAD) of a cuda.core library already loaded.

Trampoline arguments arrive as ctypes converts them: pointers and handles as int addresses (None for NULL),
enums and integers as int, floats as float. Each trampoline, its capsule and the capsule's name bytes stay alive in
a module-level registry for the life of the process.
"""
from __future__ import annotations

import atexit
import ctypes
import importlib
import logging
import os
import sys
import threading
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from guest_runtime.ctypes_signature import Signature, UnsupportedSignature, parse_signature
from ivshmem.cuda_status import NOT_SUPPORTED, UNKNOWN

__all__ = ["CONSUMER_MODULES", "CUDA_ERROR_NOT_SUPPORTED", "CUDA_ERROR_UNKNOWN", "HookError", "HookReport",
           "capsule_signature", "install", "installed", "not_supported"]

log = logging.getLogger(__name__)

CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_UNKNOWN = NOT_SUPPORTED, UNKNOWN  # cudaError_t: the same
STATUS_TYPES = frozenset({"CUresult", "cudaError_t", "enum cudaError"})

# Modules that copy capsule pointers at import: once one of them is loaded, replacing the capsules changes nothing
# for it.
CONSUMER_MODULES = ("cuda.bindings.driver", "cuda.bindings.runtime", "cuda.core", "cuda.core.experimental",
                    "numba.cuda")

Fallback = Callable[[str], Callable[..., Any]]


class HookError(RuntimeError):
    """The hook cannot be installed as asked (too late, unknown function, inexpressible signature)."""


@dataclass(frozen=True)
class HookReport:
    """What `install` did to one module's capsules (names sorted)."""

    module: str
    implemented: tuple[str, ...]  # served by `implementations`
    fallback: tuple[str, ...]  # served by `fallback(name)` with the parsed argument list
    blind_fallback: tuple[str, ...]  # unsupported signature returning a status: fallback called with no arguments
    kept: tuple[str, ...]  # original capsule left in place (non-status result, not implemented)
    unsupported: Mapping[str, str] = field(default_factory=dict)  # name -> why ctypes cannot express it
    already_installed: bool = False

    @property
    def replaced(self) -> int:
        return len(self.implemented) + len(self.fallback) + len(self.blind_fallback)


@dataclass
class _Installed:
    report: HookReport
    keepalive: list[Any]  # trampolines, name buffers, new and old capsules
    pointers: dict[str, int]  # function name -> trampoline address


_REGISTRY: dict[str, _Installed] = {}
_LOCK = threading.Lock()
_LOGGED_FAILURES: set[str] = set()
_REPORTED_UNSUPPORTED: set[str] = set()

_api = ctypes.pythonapi
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_void_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
_api.PyCapsule_New.restype = ctypes.py_object
_api.Py_IncRef.argtypes = [ctypes.py_object]
_api.Py_IncRef.restype = None


def capsule_signature(capsule: object) -> str:
    """The name of a PyCapsule, which for a Cython `__pyx_capi__` entry is the C signature."""
    name = _api.PyCapsule_GetName(capsule)
    if name is None:
        raise HookError(f"capsule {capsule!r} has no name")
    return bytes(name).decode("ascii")


def not_supported(name: str) -> Callable[..., int]:
    """Default fallback: answer CUDA_ERROR_NOT_SUPPORTED and say once, by name, that the function is not forwarded."""

    def call(*_args: Any) -> int:
        if name not in _REPORTED_UNSUPPORTED:
            _REPORTED_UNSUPPORTED.add(name)
            log.warning("%s is not forwarded by Orion: returning 801 (CUDA_ERROR_NOT_SUPPORTED, cudaErrorNotSupported)",
                        name)
        return CUDA_ERROR_NOT_SUPPORTED

    return call


def installed(module_name: str) -> HookReport | None:
    """The report of the hook on `module_name`, or None if it is not hooked in this process."""
    entry = _REGISTRY.get(module_name)
    return entry.report if entry else None


def trampoline_address(module_name: str, function: str) -> int | None:
    """The address of the trampoline that now serves `module_name`.`function` (what cuGetProcAddress hands out),
    or None if that module is not hooked or has no such function."""
    entry = _REGISTRY.get(module_name)
    return entry.pointers.get(function) if entry else None


def _loaded_consumers() -> list[str]:
    return [m for m in CONSUMER_MODULES if m in sys.modules]


def _guarded(name: str, target: Callable[..., Any], status: bool, restype: Any) -> Callable[..., Any]:
    """Wrap `target` so that nothing Python raises crosses into C."""
    error_result: Any = CUDA_ERROR_UNKNOWN if status else None if restype is None else 0

    def trampoline(*args: Any) -> Any:
        try:
            result = target(*args)
            if status:
                return int(result) if isinstance(result, int) else _bad_status(name, result)
            return result
        except BaseException:  # noqa: BLE001 - must not propagate into C
            if name not in _LOGGED_FAILURES:
                _LOGGED_FAILURES.add(name)
                log.exception("%s: the Python implementation raised; returning %r to the caller", name,
                              error_result)
            return error_result

    return trampoline


def _bad_status(name: str, result: object) -> int:
    raise TypeError(f"{name} returned {result!r}, not an int status")


def _cpp_globals_symbol(function: str) -> str:
    """Itanium mangling of `cuda_core::p_<function>`, the C++ global cuda.core fills from a capsule."""
    name = "p_" + function
    return f"_ZN9cuda_core{len(name)}{name}E"


@dataclass(frozen=True)
class _ExitPlan:
    """What `_disarm_cpp_pointers` needs, resolved at `install` time, when importing and loading are safe."""

    noop: int  # address of libc's sched_yield: takes nothing, returns 0
    symbols: dict[str, int]  # mangled cuda_core::p_<function> -> the trampoline that global may hold


_exit_plan: _ExitPlan | None = None


def _plan_exit() -> None:
    """Resolve, now, everything the exit handler will use (called at each `install`, under `_LOCK`)."""
    global _exit_plan
    noop = ctypes.cast(ctypes.CDLL(None).sched_yield, ctypes.c_void_p).value
    if noop is None:  # a real check, not an assert: `python -O` drops asserts
        raise HookError("libc's sched_yield has no address; cannot plan the exit handler")
    symbols = {_cpp_globals_symbol(name): pointer
               for entry in _REGISTRY.values() for name, pointer in entry.pointers.items()}
    _exit_plan = _ExitPlan(noop=noop, symbols=symbols)


def _disarm_cpp_pointers() -> int:
    """atexit: point cuda.core's C++ driver-pointer globals that hold our trampolines at a native no-op.

    Returns how many were rewritten. Absent symbols (another cuda.core version, no cuda.core) are skipped. Imports
    nothing and reads no attribute of a `sys.modules` entry that is not a plain module: a lazily loaded module
    (CuPy's `cupyx`) would be imported by that read, at exit.
    """
    plan = _exit_plan
    if plan is None:
        return 0
    rewritten = 0
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("cuda.core") or type(module) is not types.ModuleType:
            continue
        path = module.__dict__.get("__file__")
        if not (isinstance(path, str) and path.endswith(".so")):
            continue
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_NOLOAD)
        except OSError:
            continue
        for symbol, pointer in plan.symbols.items():
            try:
                slot = ctypes.c_void_p.in_dll(lib, symbol)
            except ValueError:
                continue
            if slot.value == pointer:
                slot.value = plan.noop
                rewritten += 1
    return rewritten


def _new_capsule(pointer: int, name_buffer: ctypes.Array[ctypes.c_char], signature: bytes) -> object:
    capsule = _api.PyCapsule_New(pointer, ctypes.addressof(name_buffer), None)
    sig_buffer = ctypes.create_string_buffer(signature)
    if _api.PyCapsule_GetPointer(capsule, ctypes.addressof(sig_buffer)) != pointer:
        raise HookError(f"capsule {signature!r} does not give back its pointer")
    return capsule


def install(module_name: str, implementations: Mapping[str, Callable[..., Any]],
            fallback: Fallback = not_supported) -> HookReport:
    """Replace every capsule of `<module_name>.__pyx_capi__` by one around a trampoline into Python.

    `implementations[name]` serves function `name` (called with the C arguments, must return an int status for a
    CUresult/cudaError_t function); every other status function is served by `fallback(name)`, created here once.
    Raises `HookError` if a consumer module is already imported, an implementation names no function of the
    module, or an implementation is given for a signature ctypes cannot express.
    """
    with _LOCK:
        entry = _REGISTRY.get(module_name)
        if entry is not None:
            return replace(entry.report, already_installed=True)
        loaded = _loaded_consumers()
        if loaded:
            raise HookError(f"cannot hook {module_name}: {', '.join(loaded)} already imported and holds the original "
                            "function pointers; activation must come before any CUDA import")
        capi: dict[str, object] = importlib.import_module(module_name).__pyx_capi__
        unknown = sorted(set(implementations) - set(capi))
        if unknown:
            raise HookError(f"{module_name} has no function {', '.join(unknown)}")

        new: dict[str, object] = {}
        pointers: dict[str, int] = {}
        keepalive: list[Any] = []
        implemented: list[str] = []
        fell_back: list[str] = []
        blind: list[str] = []
        kept: list[str] = []
        unsupported: dict[str, str] = {}
        for name, capsule in capi.items():
            signature = capsule_signature(capsule)
            sig: Signature | None
            try:
                sig = parse_signature(signature)
                status = sig.result_ctype in STATUS_TYPES
                restype, argtypes = sig.restype, sig.argtypes
            except UnsupportedSignature as exc:
                sig, unsupported[name] = None, exc.reason
                status = signature.split("(", 1)[0].strip() in STATUS_TYPES
                restype, argtypes = ctypes.c_int, ()
            impl = implementations.get(name)
            if impl is not None and sig is None:
                raise HookError(f"{module_name}.{name} cannot be implemented in Python: {unsupported[name]}")
            if impl is None and not status:
                kept.append(name)
                continue
            target = impl if impl is not None else fallback(name)
            (implemented if impl is not None else fell_back if sig is not None else blind).append(name)
            trampoline = ctypes.CFUNCTYPE(restype, *argtypes)(_guarded(name, target, status, restype))
            name_buffer = ctypes.create_string_buffer(signature.encode("ascii"))
            pointer = ctypes.cast(trampoline, ctypes.c_void_p).value
            if pointer is None:
                raise HookError(f"ctypes made no trampoline for {name}; {module_name} was left untouched")
            pointers[name] = pointer
            new[name] = _new_capsule(pointer, name_buffer, signature.encode("ascii"))
            keepalive += [trampoline, name_buffer, new[name], capsule]

        capi.update(new)  # all at once: a failure above leaves the module untouched
        report = HookReport(module=module_name, implemented=tuple(sorted(implemented)),
                            fallback=tuple(sorted(fell_back)), blind_fallback=tuple(sorted(blind)),
                            kept=tuple(sorted(kept)), unsupported=dict(sorted(unsupported.items())))
        _REGISTRY[module_name] = _Installed(report=report, keepalive=keepalive, pointers=pointers)
        _api.Py_IncRef(ctypes.py_object(keepalive))  # never freed, not even by module teardown at exit
        _plan_exit()
        if len(_REGISTRY) == 1:
            atexit.register(_disarm_cpp_pointers)
        log.debug("hooked %s: %d implemented, %d fallback, %d blind fallback, %d kept", module_name,
                  len(implemented), len(fell_back), len(blind), len(kept))
        return report
