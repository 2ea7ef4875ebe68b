"""The capsule hook routes the driver and runtime calls of the unmodified cuda-python wheels into Python.

Hooking is per process and irreversible, and it must come before any CUDA consumer is imported, so every scenario
that imports `cuda.bindings.driver`/`runtime`/cuda.core or installs the hook runs in a fresh interpreter
(`python -c`, cwd = the repository). These tests need the cuda-python wheels but no GPU: on a GPU-less machine the
unhooked `cuInit(0)` raises (DynamicLibNotFoundError), which is how the hooked scenarios prove the hook acted.
"""
from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from guest_runtime.ctypes_signature import (
    TypeTable,
    UnsupportedSignature,
    normalize_type,
    parse_signature,
    split_signature,
)

pytest.importorskip("cuda.bindings", reason="cuda-python is not installed")

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 180

# Signatures ctypes cannot express in cuda-bindings 13.4.x: a struct passed (or returned) by value.
EXPECTED_UNSUPPORTED = {
    "cuda.bindings.cydriver": {
        "cuEGLStreamProducerPresentFrame", "cuIpcOpenEventHandle", "cuIpcOpenMemHandle", "cuMemAdvise",
        "cuMemPrefetchAsync",
    },
    "cuda.bindings.cyruntime": {
        "cudaCreateChannelDesc", "cudaEGLStreamProducerPresentFrame", "cudaIpcOpenEventHandle",
        "cudaIpcOpenMemHandle", "cudaMalloc3D", "cudaMalloc3DArray", "cudaMallocMipmappedArray", "cudaMemAdvise",
        "cudaMemPrefetchAsync", "cudaMemset3D", "cudaMemset3DAsync", "make_cudaExtent", "make_cudaPitchedPtr",
        "make_cudaPos",
    },
}

# Shared by the hooked scenarios: helpers to write through out-pointers and to capture the hook's log.
PRELUDE = """
import ctypes, json, logging, sys
from guest_runtime import capsule_hook as hook

records = []
class _Capture(logging.Handler):
    def emit(self, record):
        records.append((record.levelname, record.getMessage()))
logging.getLogger("guest_runtime").addHandler(_Capture())
logging.getLogger("guest_runtime").setLevel(logging.DEBUG)

def put(address, value, ctype=ctypes.c_int):
    ctypes.cast(address, ctypes.POINTER(ctype))[0] = value
    return 0
"""


def run_python(script: str, *, setup: str = "") -> subprocess.CompletedProcess[str]:
    """Run PRELUDE, then `setup`, then the dedented `script` in a fresh interpreter."""
    code = PRELUDE + setup + textwrap.dedent(script)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=TIMEOUT_S)


def last_json(result: subprocess.CompletedProcess[str]) -> dict:
    assert result.returncode == 0, f"rc={result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return json.loads(result.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- parsing, in process

def test_parse_a_plain_driver_signature() -> None:
    sig = parse_signature("CUresult (CUdeviceptr, void const *, size_t)")
    assert sig.restype is ctypes.c_int
    assert sig.argtypes == (ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t)
    assert sig.arg_ctypes == ("CUdeviceptr", "void const *", "size_t")
    assert sig.result_ctype == "CUresult"


@pytest.mark.parametrize(("spelling", "normal", "ctype"), [
    ("unsigned int", "unsigned int", ctypes.c_uint),
    ("cuuint32_t", "cuuint32_t", ctypes.c_uint),
    ("unsigned PY_LONG_LONG", "unsigned long long", ctypes.c_uint64),
    ("cuuint64_t", "cuuint64_t", ctypes.c_uint64),
    ("unsigned char", "unsigned char", ctypes.c_ubyte),
    ("unsigned short", "unsigned short", ctypes.c_ushort),
    ("float", "float", ctypes.c_float),
    ("CUdevice", "CUdevice", ctypes.c_int),
    ("CUdevice_attribute", "CUdevice_attribute", ctypes.c_int),
    ("enum cudaMemcpyKind", "enum cudaMemcpyKind", ctypes.c_int),
    ("CUcontext", "CUcontext", ctypes.c_void_p),
    ("CUstream", "CUstream", ctypes.c_void_p),
    ("cudaStream_t", "cudaStream_t", ctypes.c_void_p),
    ("CUhostFn", "CUhostFn", ctypes.c_void_p),
    ("CUcontext *", "CUcontext *", ctypes.c_void_p),
    ("char const **", "char const **", ctypes.c_void_p),
    ("struct cudaExtent *", "struct cudaExtent *", ctypes.c_void_p),
    ("__pyx_t_4cuda_8bindings_8cydriver_GLuint", "GLuint", ctypes.c_uint),
    ("__pyx_t_4cuda_8bindings_9cyruntime_cudaStreamAttrID", "cudaStreamAttrID", ctypes.c_int),
])
def test_argument_types(spelling: str, normal: str, ctype: object) -> None:
    sig = parse_signature(f"CUresult (int, {spelling})")
    assert sig.arg_ctypes == ("int", normal)
    assert sig.argtypes == (ctypes.c_int, ctype)


def test_void_and_empty_argument_lists() -> None:
    assert parse_signature("CUresult (void)").argtypes == ()
    assert parse_signature("CUresult ()").argtypes == ()
    assert split_signature("char const *(cudaError_t)") == ("char const *", ["cudaError_t"])
    sig = parse_signature("char const *(cudaError_t)")
    assert (sig.restype, sig.argtypes, sig.result_ctype) == (ctypes.c_void_p, (ctypes.c_int,), "char const *")


@pytest.mark.parametrize("signature", [
    "cudaError_t (struct cudaExtent)",  # a struct by value
    "CUresult (CUmemLocation, int)",  # a typedef'd struct by value
    "struct cudaPos (size_t, size_t, size_t)",  # a struct returned by value
    "CUresult (NoSuchType)",  # unknown: never guess
    "CUresult (int",
])
def test_unsupported_signatures_raise(signature: str) -> None:
    with pytest.raises(UnsupportedSignature):
        parse_signature(signature)


def test_type_table_from_pxd_text() -> None:
    table = TypeTable.from_pxd_text(["""
cdef extern from 'x.h':
    ctypedef enum Color_enum:
        RED
    ctypedef Color_enum Color 'Color'
    ctypedef struct Thing_st:
        pass
    ctypedef Thing_st* Thing 'Thing'
    ctypedef Thing_st ThingValue
    ctypedef unsigned long long Handle_v1 'Handle_v1'
    ctypedef Handle_v1 Handle 'Handle'
    ctypedef void (*Callback 'Callback')(
        void* data)
ctypedef void *EGLImageKHR
"""])
    assert table.resolve("Color") == ("enum", ctypes.c_int)
    assert table.resolve("Thing") == ("pointer", ctypes.c_void_p)
    assert table.resolve("ThingValue") == ("struct", None)
    assert table.resolve("Handle") == ("scalar", ctypes.c_uint64)
    assert table.resolve("Callback") == ("pointer", ctypes.c_void_p)
    assert table.resolve("EGLImageKHR") == ("pointer", ctypes.c_void_p)
    with pytest.raises(KeyError):
        table.resolve("Unknown")


def test_normalize_type() -> None:
    assert normalize_type("char  const**") == "char const **"
    assert normalize_type("__pyx_t_4cuda_8bindings_8cydriver_CUeglFrame *") == "CUeglFrame *"


# ------------------------------------------------------------------------------------------- the wheel's capsules

def test_every_capsule_of_the_wheel_parses_except_structs_by_value() -> None:
    """(a) Every capsule of cydriver and cyruntime parses, with as many ctypes arguments as the signature has."""
    result = run_python("""
        import importlib
        from guest_runtime.ctypes_signature import parse_signature, UnsupportedSignature
        out = {}
        for module in ("cuda.bindings.cydriver", "cuda.bindings.cyruntime"):
            rows = out[module] = {}
            for name, capsule in importlib.import_module(module).__pyx_capi__.items():
                signature = hook.capsule_signature(capsule)
                try:
                    rows[name] = [signature, len(parse_signature(signature).argtypes)]
                except UnsupportedSignature as exc:
                    rows[name] = [signature, exc.reason]
        assert "cuda.bindings.driver" not in sys.modules
        print(json.dumps(out))
    """)
    out = last_json(result)
    for module, rows in out.items():
        assert len(rows) > (300 if module.endswith("cyruntime") else 500)
        unsupported = {name for name, (_, n) in rows.items() if isinstance(n, str)}
        assert unsupported == EXPECTED_UNSUPPORTED[module], [rows[n] for n in unsupported]
        assert all("by value" in rows[n][1] for n in unsupported)
        for name, (signature, nargs) in rows.items():
            if name in unsupported:
                continue
            inner = signature[signature.rindex("(") + 1:-1].strip()
            expected = 0 if inner in ("", "void") else inner.count(",") + 1
            assert nargs == expected, (name, signature)


def test_enum_classification_agrees_with_the_bindings() -> None:
    """Every named argument type classified as enum is an enum class of driver/runtime, and no other is."""
    result = run_python("""
        from cuda.bindings import cydriver, cyruntime, driver, runtime
        from guest_runtime.ctypes_signature import classify, parse_signature, UnsupportedSignature
        def is_enum(cls):  # IntEnum, or the FastEnum (int subclass with __members__) of cuda-bindings 13.x
            return isinstance(cls, type) and issubclass(cls, int) and hasattr(cls, "__members__")
        kinds = {}
        for module in (cydriver, cyruntime):
            for capsule in module.__pyx_capi__.values():
                try:
                    sig = parse_signature(hook.capsule_signature(capsule))
                except UnsupportedSignature:
                    continue
                for spelling in sig.arg_ctypes + (sig.result_ctype,):
                    if "*" not in spelling:
                        kinds[spelling] = classify(spelling)[0]
        checked, mismatched = 0, []
        for spelling, kind in sorted(kinds.items()):
            name = spelling.removeprefix("enum ")
            cls = getattr(driver, name, None) or getattr(runtime, name, None)
            if cls is None:
                assert kind == "scalar", spelling
                continue
            checked += 1
            if is_enum(cls) != (kind == "enum"):
                mismatched.append([spelling, kind, repr(cls)])
        print(json.dumps({"checked": checked, "mismatched": mismatched,
                          "enums": sum(k == "enum" for k in kinds.values())}))
    """)
    out = last_json(result)
    assert out["mismatched"] == []
    assert out["checked"] > 100 and out["enums"] > 50


# ---------------------------------------------------------------------------------------------- hooked behaviour

def test_without_the_hook_cuInit_raises_on_a_gpu_less_machine() -> None:
    """(b, control) The unhooked wheel cannot even load libcuda here: cuInit(0) raises instead of returning."""
    result = run_python("""
        from cuda.bindings import driver
        try:
            print(json.dumps({"returned": repr(driver.cuInit(0))}))
        except RuntimeError as exc:
            print(json.dumps({"raised": type(exc).__name__}))
    """)
    out = last_json(result)
    if "returned" in out:
        pytest.skip(f"a CUDA driver is present here: cuInit returned {out['returned']}")
    assert out == {"raised": "DynamicLibNotFoundError"}


def test_cuInit_is_routed_into_python() -> None:
    """(b) An implementation of cuInit sees the flags and its status comes back through cuda.bindings.driver."""
    result = run_python("""
        seen = []
        report = hook.install("cuda.bindings.cydriver", {"cuInit": lambda flags: seen.append(flags) or 100})
        from cuda.bindings import driver
        (err,) = driver.cuInit(0)
        print(json.dumps({"err": err.name, "seen": seen, "implemented": report.implemented,
                          "replaced": report.replaced, "kept": report.kept}))
    """)
    out = last_json(result)
    assert out["err"] == "CUDA_ERROR_NO_DEVICE"
    assert out["seen"] == [0]
    assert out["implemented"] == ["cuInit"]
    assert out["replaced"] > 500 and out["kept"] == []


def test_out_pointer_arguments() -> None:
    """(c) Implementations write results through the pointers the bindings pass."""
    result = run_python("""
        hook.install("cuda.bindings.cydriver", {
            "cuDeviceGetCount": lambda count: put(count, 3),
            "cuDriverGetVersion": lambda version: put(version, 13040),
        })
        from cuda.bindings import driver
        err, n = driver.cuDeviceGetCount()
        err2, v = driver.cuDriverGetVersion()
        print(json.dumps({"count": [err.name, n], "version": [err2.name, v]}))
    """)
    out = last_json(result)
    assert out == {"count": ["CUDA_SUCCESS", 3], "version": ["CUDA_SUCCESS", 13040]}


def test_unimplemented_function_answers_not_supported_and_says_so_once() -> None:
    """(d) The default fallback: CUDA_ERROR_NOT_SUPPORTED on every call, one warning naming the function."""
    result = run_python("""
        report = hook.install("cuda.bindings.cydriver", {})
        from cuda.bindings import driver
        first = driver.cuDeviceGetName(64, driver.CUdevice(0))[0]
        second = driver.cuDeviceGetName(64, driver.CUdevice(0))[0]
        warnings = [m for level, m in records if level == "WARNING" and "cuDeviceGetName" in m]
        print(json.dumps({"errs": [first.name, second.name], "warnings": warnings,
                          "in_fallback": "cuDeviceGetName" in report.fallback}))
    """)
    out = last_json(result)
    assert out["errs"] == ["CUDA_ERROR_NOT_SUPPORTED", "CUDA_ERROR_NOT_SUPPORTED"]
    assert len(out["warnings"]) == 1 and "not forwarded" in out["warnings"][0]
    assert out["in_fallback"]


def test_a_raising_implementation_gives_cuda_error_unknown() -> None:
    """(e) An exception never crosses into C: CUDA_ERROR_UNKNOWN, logged once, the process goes on."""
    result = run_python("""
        def broken(count):
            raise ValueError("boom")
        def no_status(flags):
            return None  # not an int status: treated as a failure too
        hook.install("cuda.bindings.cydriver", {"cuDeviceGetCount": broken, "cuInit": no_status})
        from cuda.bindings import driver
        errs = [driver.cuDeviceGetCount()[0].name, driver.cuDeviceGetCount()[0].name, driver.cuInit(0)[0].name]
        errors = [m for level, m in records if level == "ERROR"]
        print(json.dumps({"errs": errs, "errors": errors}))
    """)
    out = last_json(result)
    assert out["errs"] == ["CUDA_ERROR_UNKNOWN"] * 3
    assert len(out["errors"]) == 2  # once for cuDeviceGetCount, once for cuInit
    assert "Exception ignored" not in result.stderr  # what ctypes prints when a callback lets an exception out


def test_installing_after_a_consumer_import_is_refused() -> None:
    """(f) Too late once cuda.bindings.driver holds the original pointers."""
    result = run_python("""
        import cuda.bindings.driver
        try:
            hook.install("cuda.bindings.cydriver", {})
            print(json.dumps({"error": None}))
        except hook.HookError as exc:
            print(json.dumps({"error": str(exc)}))
    """)
    error = last_json(result)["error"]
    assert error is not None and "cuda.bindings.driver" in error and "before any CUDA import" in error


def test_install_is_idempotent_and_checks_names() -> None:
    result = run_python("""
        first = hook.install("cuda.bindings.cydriver", {"cuInit": lambda flags: 0})
        import cuda.bindings.cydriver as cyd
        before = dict(cyd.__pyx_capi__)
        second = hook.install("cuda.bindings.cydriver", {"cuInit": lambda flags: 1})
        same = all(cyd.__pyx_capi__[k] is v for k, v in before.items())
        try:
            hook.install("cuda.bindings.cyruntime", {"cudaNoSuch": lambda: 0})
            error = None
        except hook.HookError as exc:
            error = str(exc)
        runtime_hooked = hook.installed("cuda.bindings.cyruntime") is not None
        from cuda.bindings import driver
        print(json.dumps({"again": [first.already_installed, second.already_installed], "same": same,
                          "cuInit": driver.cuInit(0)[0].name, "error": error, "runtime_hooked": runtime_hooked,
                          "blind": first.blind_fallback, "mem_advise": driver.cuMemAdvise(0, 0,
                              driver.CUmem_advise.CU_MEM_ADVISE_SET_READ_MOSTLY, driver.CUmemLocation())[0].name}))
    """)
    out = last_json(result)
    assert out["again"] == [False, True]
    assert out["same"]
    assert out["cuInit"] == "CUDA_SUCCESS"  # the first install's implementation stays
    assert "cudaNoSuch" in out["error"] and not out["runtime_hooked"]  # a typo is an error, not a silent no-op
    # A struct-by-value signature without implementation still answers NOT_SUPPORTED, through a no-argument trampoline.
    assert sorted(out["blind"]) == sorted(EXPECTED_UNSUPPORTED["cuda.bindings.cydriver"])
    assert out["mem_advise"] == "CUDA_ERROR_NOT_SUPPORTED"


def test_an_implementation_for_a_struct_by_value_signature_is_refused() -> None:
    result = run_python("""
        try:
            hook.install("cuda.bindings.cydriver", {"cuMemAdvise": lambda *a: 0})
            print(json.dumps({"error": None}))
        except hook.HookError as exc:
            print(json.dumps({"error": str(exc)}))
    """)
    error = last_json(result)["error"]
    assert error is not None and "cuMemAdvise" in error and "by value" in error


CORE_IMPLEMENTATIONS = """
calls = []
NAMES = {}
def traced(name, answer):
    def call(*args):
        calls.append(name)
        return answer(*args) if callable(answer) else answer
    return call
def error_name(code, out):
    calls.append("cuGetErrorName")
    known = {100: b"CUDA_ERROR_NO_DEVICE"}
    text = NAMES.setdefault(code, ctypes.create_string_buffer(known.get(code, b"CUDA_ERROR_%d" % code)))
    return put(out, ctypes.addressof(text), ctypes.c_void_p)
def fallback(name):
    answer = hook.not_supported(name)
    return traced(name, answer)
"""


def test_cuda_core_device_gives_a_clean_cuda_error() -> None:
    """(g) cuda.core imports on top of the hook; Device() turns our status into its own CUDAError."""
    result = run_python(setup=CORE_IMPLEMENTATIONS, script="""
        hook.install("cuda.bindings.cydriver", {
            "cuInit": traced("cuInit", 100),
            "cuDeviceGetCount": traced("cuDeviceGetCount", lambda p: put(p, 1)),
            "cuDriverGetVersion": traced("cuDriverGetVersion", lambda p: put(p, 13040)),
            "cuGetErrorName": error_name,
        }, fallback)
        from cuda.core import Device
        try:
            Device()
            print(json.dumps({"raised": None, "calls": calls}))
        except Exception as exc:
            print(json.dumps({"raised": [type(exc).__module__, type(exc).__name__, str(exc)], "calls": calls}))
    """)
    out = last_json(result)
    module, name, message = out["raised"]
    assert (module, name) == ("cuda.core._utils.cuda_utils", "CUDAError")
    assert message.startswith("CUDA_ERROR_NO_DEVICE")
    assert out["calls"] == ["cuInit", "cuGetErrorName"]


def test_cuda_core_device_and_set_current_then_a_clean_exit() -> None:
    """(g) What cuda.core 1.2 calls for Device() and set_current(), and a process that ends with rc 0.

    cuda.core's C++ layer caches the retained primary context per thread and releases it from a C++ thread-local
    destructor inside exit(), after Python has finalized; the hook's atexit guard keeps that call out of Python.
    """
    result = run_python(setup=CORE_IMPLEMENTATIONS, script="""
        hook.install("cuda.bindings.cydriver", {
            "cuInit": traced("cuInit", 0),
            "cuDeviceGetCount": traced("cuDeviceGetCount", lambda p: put(p, 1)),
            "cuDriverGetVersion": traced("cuDriverGetVersion", lambda p: put(p, 13040)),
            "cuGetErrorName": error_name,
            "cuCtxGetDevice": traced("cuCtxGetDevice", 201),  # CUDA_ERROR_INVALID_CONTEXT: nothing current yet
            "cuCtxGetCurrent": traced("cuCtxGetCurrent", lambda p: put(p, None, ctypes.c_void_p)),
            "cuDevicePrimaryCtxRetain": traced("cuDevicePrimaryCtxRetain",
                                               lambda out, dev: put(out, 0x1234, ctypes.c_void_p)),
            "cuDevicePrimaryCtxRelease": traced("cuDevicePrimaryCtxRelease", 0),
            "cuCtxSetCurrent": traced("cuCtxSetCurrent", 0),
        }, fallback)
        from cuda.core import Device
        device = Device()
        at_device = list(calls)
        calls.clear()
        device.set_current()
        print(json.dumps({"device_id": device.device_id, "Device()": at_device, "set_current()": calls}))
    """)
    out = last_json(result)  # also asserts rc == 0: no crash at exit
    assert out["device_id"] == 0
    assert out["Device()"] == ["cuInit", "cuDriverGetVersion", "cuCtxGetDevice", "cuCtxGetCurrent",
                               "cuDeviceGetCount"]
    assert out["set_current()"] == ["cuDevicePrimaryCtxRetain", "cuCtxSetCurrent"]


def test_runtime_calls_are_routed_too() -> None:
    """(h) cyruntime: cudaGetDeviceCount answered in Python; pure helpers (cudaGetErrorName) keep their original."""
    result = run_python("""
        report = hook.install("cuda.bindings.cyruntime", {"cudaGetDeviceCount": lambda count: put(count, 7)})
        from cuda.bindings import runtime
        err, n = runtime.cudaGetDeviceCount()
        name = runtime.cudaGetErrorName(runtime.cudaError_t.cudaErrorMemoryAllocation)[1].decode()
        print(json.dumps({"count": [err.name, n], "name": name, "kept": report.kept,
                          "unsupported": sorted(report.unsupported)}))
    """)
    out = last_json(result)
    assert out["count"] == ["cudaSuccess", 7]
    assert out["name"] == "cudaErrorMemoryAllocation"
    assert set(out["kept"]) >= {"cudaGetErrorName", "cudaGetErrorString", "make_cudaExtent"}
    assert set(out["unsupported"]) == EXPECTED_UNSUPPORTED["cuda.bindings.cyruntime"]
