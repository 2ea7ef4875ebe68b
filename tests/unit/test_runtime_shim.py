"""The CUDA runtime shim (guest_runtime/runtime_shim.py) end to end, without a GPU.

Most tests call the shim's implementations directly, with the raw C arguments a cyruntime capsule trampoline would
pass (ints, None for NULL, addresses of ctypes cells), over the driver implementations of a real guest `Forwarder`
talking through a real region to a forked fake-driver host agent (the rig of tests/forwarding_rig.py, shared with
test_forwarding_roundtrip.py). The fake's journal shows which driver calls each runtime call became. The error
table, the attribute values, the runtime version and the cudaDeviceProp table are checked against the installed
wheel's enums in child interpreters (importing `cuda.bindings.driver`/`runtime` here would spoil every later hook
in this process). One child interpreter runs `cuda.bindings.runtime` itself through the real capsule hooks on
cydriver and cyruntime against the fake agent.
"""
from __future__ import annotations

import ctypes
import importlib.util
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from guest_runtime import runtime_shim
from guest_runtime.forward import Forwarder
from guest_runtime.runtime_shim import ERROR_TABLE, RuntimeShim, runtime_version
from host_agent.session.executor import ExecutorOptions
from ivshmem.channel import ClientChannel
from ivshmem.errors import WireError
from tests import forwarding_rig
from tests.fake_driver import DRIVER_VERSION, FakeDriver
from tests.forwarding_rig import GUEST_DEVICES, TEST_TIMEOUT_S, Guest, Rig

REPO = Path(__file__).resolve().parents[2]
bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures
CHILD_TIMEOUT_S = TEST_TIMEOUT_S - 10

# cudaError_t
SUCCESS, INVALID_VALUE, MEMORY_ALLOCATION, INVALID_MEMCPY_DIRECTION = 0, 1, 2, 21
NO_DEVICE, INVALID_DEVICE, NOT_SUPPORTED, UNKNOWN = 100, 101, 801, 999
# enum cudaMemcpyKind
H2H, H2D, D2H, D2D, DEFAULT = 0, 1, 2, 3, 4
MULTIPROCESSOR_COUNT = 16  # cudaDevAttrMultiProcessorCount == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
FOREIGN = 0x7E00_0000_1000  # a device address no session ever allocated
IMPLEMENTED = {"cudaFree", "cudaMalloc", "cudaMemcpy", "cudaSetDevice", "cudaGetDevice", "cudaGetDeviceCount",
               "cudaDeviceGetAttribute", "cudaDeviceSynchronize", "cudaDriverGetVersion", "cudaRuntimeGetVersion",
               "cudaGetLastError", "cudaPeekAtLastError", "cudaGetDeviceProperties"}
NON_STATUS = {"cudaGetErrorName", "cudaGetErrorString", "cudaCreateChannelDesc", "make_cudaExtent",
              "make_cudaPitchedPtr", "make_cudaPos"}

needs_wheel = pytest.mark.skipif(importlib.util.find_spec("cuda.bindings") is None,
                                 reason="cuda-python is not installed")


class Runtime:
    """One guest process's runtime: a RuntimeShim over its Forwarder's driver implementations."""

    def __init__(self, guest: Guest) -> None:
        self.guest = guest
        self.shim = RuntimeShim(guest.fn)
        self.fn = self.shim.implementations()

    def out(self, name: str, *inputs: Any, ctype: Any = ctypes.c_int) -> tuple[int, int]:
        """Call `name` with a fresh out-cell (filled with a sentinel) first, then `inputs`; (status, value)."""
        cell = ctype(0x5A5A5A5A)
        status = self.fn[name](ctypes.addressof(cell), *inputs)
        return status, cell.value

    def malloc(self, size: int) -> int:
        status, pointer = self.out("cudaMalloc", size, ctype=ctypes.c_uint64)
        assert status == SUCCESS, status
        return pointer

    def memcpy(self, dst: int | None, src: int | None, count: int, kind: int) -> int:
        return self.fn["cudaMemcpy"](dst, src, count, kind)


def connected(rig: Rig) -> Runtime:
    """A runtime whose guest has claimed its channel already (the session's own start-up calls are journalled
    before the test's mark)."""
    runtime = Runtime(rig.guest())
    assert runtime.guest.call("cuDriverGetVersion")[0] == SUCCESS  # the session's executor is up
    return runtime


def names(entries: list[dict[str, Any]]) -> list[str]:
    return [e["name"] for e in entries]


def number(value: Any) -> Any:
    """A journal value as a number: handle objects and enum members are [type, value]."""
    return value[1] if isinstance(value, list) else value


def run_child(script: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `script` in a fresh interpreter (cwd = the repository) and return the JSON of its last RESULT line."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, capture_output=True,
                            text=True, timeout=CHILD_TIMEOUT_S,
                            env={**os.environ, "PYTHONPATH": str(REPO), "ORION_NATIVE": "0", **(env or {})})
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    lines = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, result.stdout[-2000:] + result.stderr[-2000:]
    return json.loads(lines[-1][len("RESULT "):])


# --- initialisation and devices ---------------------------------------------------------------------------------------

def test_cudaFree_null_initialises_the_current_devices_primary_context_once(rig: Rig) -> None:  # noqa: N802
    rt = connected(rig)
    mark = rig.mark()
    assert rt.fn["cudaFree"](None) == SUCCESS
    seen = rig.entries(mark)
    # cuCtxGetCurrent is answered in the guest (per-thread stacks, guest_runtime/contexts.py): it never travels
    assert names(seen) == ["cuInit", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent"]
    retain, set_current = seen[1], seen[2]
    assert retain["args"] == [GUEST_DEVICES[0]]  # guest device 0, as the executor maps it
    context = number(retain["result"][1])
    assert [number(a) for a in set_current["args"]] == [context]
    assert rt.guest.ok("cuCtxGetCurrent") == context  # the driver side sees the primary context current

    mark = rig.mark()
    assert rt.fn["cudaFree"](None) == SUCCESS
    assert rt.fn["cudaFree"](0) == SUCCESS
    assert rig.entries(mark) == []  # initialised once


def test_cudaSetDevice_makes_the_devices_primary_context_current(rig: Rig) -> None:  # noqa: N802
    rt = connected(rig)
    assert rt.out("cudaGetDevice") == (SUCCESS, 0)
    mark = rig.mark()
    assert rt.fn["cudaSetDevice"](1) == SUCCESS
    seen = rig.entries(mark)
    assert names(seen) == ["cuInit", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent"]
    assert seen[1]["args"] == [GUEST_DEVICES[1]]
    context_1 = number(seen[1]["result"][1])
    assert rt.out("cudaGetDevice") == (SUCCESS, 1)
    assert rt.guest.ok("cuCtxGetDevice") == 1 and rt.guest.ok("cuCtxGetCurrent") == context_1

    assert rt.fn["cudaSetDevice"](0) == SUCCESS
    assert rt.guest.ok("cuCtxGetDevice") == 0
    mark = rig.mark()
    assert rt.fn["cudaSetDevice"](1) == SUCCESS  # retained once: only made current again
    assert names(rig.entries(mark)) == ["cuCtxSetCurrent"]
    assert rt.guest.ok("cuCtxGetCurrent") == context_1

    mark = rig.mark()
    pointer = rt.malloc(256)  # allocates in device 1's context: the runtime's calls need no more set-up
    assert names(rig.entries(mark)) == ["cuMemAlloc"] and pointer

    assert rt.fn["cudaSetDevice"](len(GUEST_DEVICES)) == INVALID_DEVICE  # refused by the host's device map
    assert rt.fn["cudaSetDevice"](-1) == INVALID_DEVICE
    assert rt.out("cudaGetDevice") == (SUCCESS, 1)  # unchanged by the failures
    assert rt.fn["cudaGetDevice"](None) == INVALID_VALUE


def test_a_context_the_program_made_current_is_the_runtimes(rig: Rig) -> None:
    """cudart uses the context current on the driver side, if any, instead of binding a primary context."""
    rt = connected(rig)
    context = rt.guest.setup(1)  # driver API: cuInit, retain device 1's primary context, make it current
    mark = rig.mark()
    assert rt.fn["cudaFree"](None) == SUCCESS
    assert names(rig.entries(mark)) == ["cuInit", "cuCtxGetDevice"]  # the current context is known in the guest
    assert rt.out("cudaGetDevice") == (SUCCESS, 1)
    assert rt.guest.ok("cuCtxGetCurrent") == context


def test_a_runtime_call_without_a_current_context_binds_the_primary_context_again(rig: Rig) -> None:
    rt = connected(rig)
    assert rt.fn["cudaFree"](None) == SUCCESS
    primary = rt.guest.ok("cuCtxGetCurrent")
    assert rt.guest.call("cuCtxSetCurrent", None)[0] == SUCCESS  # the program unbinds it through the driver API
    mark = rig.mark()
    pointer = rt.malloc(64)
    # The thread's (empty) context reaches the host before the call; cuCtxGetCurrent is answered in the guest
    seen = rig.entries(mark)
    assert names(seen) == ["cuCtxSetCurrent", "cuMemAlloc", "cuCtxSetCurrent", "cuMemAlloc"]
    assert number(seen[0]["args"][0]) == 0
    assert seen[1]["result"][0] == ["CUresult", 201]  # CUDA_ERROR_INVALID_CONTEXT, then retried
    assert pointer and rt.guest.ok("cuCtxGetCurrent") == primary


def test_device_count_attributes_and_versions(rig: Rig) -> None:
    rt = connected(rig)
    fake = FakeDriver(devices=forwarding_rig.FAKE_DEVICES)
    mark = rig.mark()
    assert rt.out("cudaGetDeviceCount") == (SUCCESS, len(GUEST_DEVICES))
    assert names(rig.entries(mark))[:1] == ["cuInit"]  # (the executor answers the count from its device map)
    for device, physical in enumerate(GUEST_DEVICES):
        expected = fake.device_attribute(MULTIPROCESSOR_COUNT, physical)
        assert rt.out("cudaDeviceGetAttribute", MULTIPROCESSOR_COUNT, device) == (SUCCESS, expected)
    assert rt.out("cudaDeviceGetAttribute", MULTIPROCESSOR_COUNT, len(GUEST_DEVICES))[0] == INVALID_DEVICE
    assert rt.out("cudaDeviceGetAttribute", 75, 0) == (SUCCESS, 9)  # cudaDevAttrComputeCapabilityMajor

    mark = rig.mark()
    for not_runtime in (0, 44, 102, 158, 1000):  # no cudaDeviceAttr has these values (158: cudaDevAttrMax)
        assert rt.out("cudaDeviceGetAttribute", not_runtime, 0) == (INVALID_VALUE, 0x5A5A5A5A)
    assert rt.fn["cudaDeviceGetAttribute"](None, MULTIPROCESSOR_COUNT, 0) == INVALID_VALUE
    assert rt.fn["cudaGetDeviceCount"](None) == INVALID_VALUE
    assert rig.entries(mark) == []  # refused in the guest

    assert rt.out("cudaDriverGetVersion") == (SUCCESS, DRIVER_VERSION)
    assert rt.out("cudaRuntimeGetVersion") == (SUCCESS, runtime_version())
    assert rt.fn["cudaDriverGetVersion"](None) == rt.fn["cudaRuntimeGetVersion"](None) == INVALID_VALUE


def test_without_an_agent_the_runtime_reports_no_device(capsys: pytest.CaptureFixture[str]) -> None:
    def unreachable() -> ClientChannel:
        raise WireError("no region here (test)")
    shim = RuntimeShim(Forwarder(unreachable).implementations())
    fn = shim.implementations()
    count = ctypes.c_int(7)
    assert fn["cudaGetDeviceCount"](ctypes.addressof(count)) == NO_DEVICE and count.value == 0
    assert fn["cudaFree"](None) == NO_DEVICE
    assert fn["cudaMalloc"](ctypes.addressof(ctypes.c_uint64()), 16) == NO_DEVICE
    version = ctypes.c_int(7)
    assert fn["cudaDriverGetVersion"](ctypes.addressof(version)) == SUCCESS and version.value == 0  # as cudart
    assert fn["cudaGetLastError"]() == NO_DEVICE
    assert "no GPU through Orion" in capsys.readouterr().err


# --- memory -----------------------------------------------------------------------------------------------------------

def test_malloc_memcpy_free_move_exact_bytes(rig: Rig) -> None:
    rt = connected(rig)
    size = 3 << 20  # several staging chunks
    data = bytes((i * 7 + 3) & 0xFF for i in range(size))
    source = ctypes.create_string_buffer(data, size)
    target = ctypes.create_string_buffer(b"\xee" * (size + 16), size + 16)

    mark = rig.mark()
    first, second = rt.malloc(size), rt.malloc(size)
    allocs = rig.entries(mark, "cuMemAlloc")
    assert [e["args"] for e in allocs] == [[size], [size]]
    assert [number(e["result"][1]) for e in allocs] == [first, second]

    mark = rig.mark()
    assert rt.memcpy(first, ctypes.addressof(source), size, H2D) == SUCCESS
    assert rt.memcpy(second, first, size, D2D) == SUCCESS
    assert rt.memcpy(ctypes.addressof(target), second, size, D2H) == SUCCESS
    assert target.raw[:size] == data and target.raw[size:] == b"\xee" * 16
    copies = [name for name in names(rig.entries(mark)) if name.startswith("cuMemcpy")]  # staged: in chunks
    assert [name for i, name in enumerate(copies) if i == 0 or copies[i - 1] != name] == [
        "cuMemcpyHtoD", "cuMemcpyDtoD", "cuMemcpyDtoH"]
    assert [number(a) for a in rig.entries(mark, "cuMemcpyDtoD")[0]["args"]] == [second, first, size]

    small = ctypes.create_string_buffer(b"runtime!", 8)  # an inline copy, at an offset inside the allocation
    assert rt.memcpy(second + 100, ctypes.addressof(small), 8, H2D) == SUCCESS
    back = ctypes.create_string_buffer(8)
    assert rt.memcpy(ctypes.addressof(back), second + 100, 8, D2H) == SUCCESS and back.raw == b"runtime!"
    copy = ctypes.create_string_buffer(8)
    assert rt.memcpy(ctypes.addressof(copy), ctypes.addressof(back), 8, H2H) == SUCCESS and copy.raw == b"runtime!"

    mark = rig.mark()
    assert rt.memcpy(first, ctypes.addressof(source), 0, H2D) == SUCCESS  # nothing to move
    assert rt.memcpy(None, ctypes.addressof(source), 8, H2D) == INVALID_VALUE
    assert rt.memcpy(FOREIGN, ctypes.addressof(source), 8, H2D) == INVALID_VALUE  # refused by the executor
    assert rt.memcpy(first, first + 8, size, D2D) == INVALID_VALUE  # runs past the end of the allocation
    assert names(rig.entries(mark)) == []  # none of them reached the driver

    mark = rig.mark()
    assert rt.fn["cudaFree"](first) == SUCCESS and rt.fn["cudaFree"](second) == SUCCESS
    assert [number(e["args"][0]) for e in rig.entries(mark, "cuMemFree")] == [first, second]
    assert rt.fn["cudaFree"](first) == INVALID_VALUE  # freed already
    assert rt.memcpy(ctypes.addressof(back), first, 8, D2H) == INVALID_VALUE


def test_malloc_of_zero_bytes_is_a_null_pointer_and_a_null_out_is_refused(rig: Rig) -> None:
    rt = connected(rig)
    mark = rig.mark()
    assert rt.out("cudaMalloc", 0, ctype=ctypes.c_uint64) == (SUCCESS, 0)
    assert "cuMemAlloc" not in names(rig.entries(mark))
    assert rt.fn["cudaMalloc"](None, 16) == INVALID_VALUE


def test_the_quota_surfaces_as_cudaErrorMemoryAllocation(start: Callable[..., Rig]) -> None:  # noqa: N802
    rig = start(ExecutorOptions(devices=GUEST_DEVICES, gmem_mib=1))
    rt = connected(rig)
    status, pointer = rt.out("cudaMalloc", 2 << 20, ctype=ctypes.c_uint64)
    assert status == MEMORY_ALLOCATION  # CUDA_ERROR_OUT_OF_MEMORY (2) -> cudaErrorMemoryAllocation (2)
    assert rig.entries(0, "cuMemAlloc") == []  # the executor refused it before the driver
    assert rt.fn["cudaGetLastError"]() == MEMORY_ALLOCATION


def test_memcpy_default_works_out_the_direction_and_a_bad_kind_is_refused(rig: Rig) -> None:
    rt = connected(rig)
    pointer = rt.malloc(64)
    source = ctypes.create_string_buffer(bytes(range(64)), 64)
    landing = ctypes.create_string_buffer(64)
    mark = rig.mark()
    assert rt.memcpy(pointer, ctypes.addressof(source), 64, DEFAULT) == SUCCESS  # host -> device
    assert rt.memcpy(ctypes.addressof(landing), pointer, 64, DEFAULT) == SUCCESS  # device -> host
    assert landing.raw == source.raw
    names = [e["name"] for e in rig.entries(mark) if e["name"].startswith("cuMemcpy")]
    assert names == ["cuMemcpyHtoD", "cuMemcpyDtoH"]
    mark = rig.mark()
    assert rt.memcpy(pointer, ctypes.addressof(source), 64, 7) == INVALID_MEMCPY_DIRECTION
    assert rig.entries(mark) == []


def test_device_synchronize_is_ctx_synchronize_and_reports_an_earlier_asynchronous_failure(rig: Rig) -> None:
    rt = connected(rig)
    mark = rig.mark()
    assert rt.fn["cudaDeviceSynchronize"]() == SUCCESS
    assert names(rig.entries(mark))[-1] == "cuCtxSynchronize"
    assert rt.guest.call("cuMemsetD8Async", FOREIGN, 0, 16, None)[0] == SUCCESS  # posted: fails on the host later
    assert rt.fn["cudaDeviceSynchronize"]() == INVALID_VALUE  # ... and surfaces at the next synchronising call
    assert rt.fn["cudaDeviceSynchronize"]() == SUCCESS  # once
    assert rt.fn["cudaPeekAtLastError"]() == INVALID_VALUE


# --- errors -----------------------------------------------------------------------------------------------------------

def _stub_driver(answer: Callable[[], int]) -> dict[str, Callable[..., int]]:
    """Driver implementations with a context current whose cuCtxSynchronize answers `answer()`."""
    def put(value: int, ctype: Any = ctypes.c_uint64) -> Callable[[int], int]:
        def call(address: int) -> int:
            ctype.from_address(address).value = value
            return 0
        return call
    return {"cuInit": lambda flags: 0, "cuCtxGetCurrent": put(0xC0), "cuCtxGetDevice": put(0, ctypes.c_int),
            "cuCtxSynchronize": answer}


def test_every_driver_error_becomes_the_runtime_error_of_the_table(caplog: pytest.LogCaptureFixture) -> None:
    codes: list[int] = []
    shim = RuntimeShim(_stub_driver(lambda: codes[-1]))
    for cu, _cu_name, rt, _rt_name in ERROR_TABLE:
        codes.append(cu)
        assert shim.cudaDeviceSynchronize() == rt, (cu, _cu_name)
    # the examples of the issue, by number
    table = {cu: rt for cu, _, rt, _ in ERROR_TABLE}
    assert (table[100], table[3], table[1], table[2], table[201], table[801]) == (100, 3, 1, 2, 201, 801)
    runtime_shim._SAID_UNKNOWN.discard(123456)
    with caplog.at_level(logging.WARNING, logger="guest_runtime.runtime_shim"):
        codes.append(123456)  # a CUresult this wheel does not have
        assert shim.cudaDeviceSynchronize() == UNKNOWN
        assert shim.cudaDeviceSynchronize() == UNKNOWN
    assert len([r for r in caplog.records if "CUresult 123456" in r.getMessage()]) == 1


@needs_wheel
def test_the_error_table_matches_the_wheels_enums() -> None:
    result = run_child("""
        import json
        from cuda.bindings import driver, runtime
        from guest_runtime.runtime_shim import ERROR_TABLE
        problems = []
        runtime_values = {int(m) for m in runtime.cudaError_t}
        for cu, cu_name, rt, rt_name in ERROR_TABLE:
            if int(getattr(driver.CUresult, cu_name, -1)) != cu:
                problems.append(f"CUresult.{cu_name} is not {cu}")
            if int(getattr(runtime.cudaError_t, rt_name, -1)) != rt:
                problems.append(f"cudaError_t.{rt_name} is not {rt}")
            if rt == 999 and cu != 999 and cu in runtime_values:
                problems.append(f"{cu_name} has a runtime counterpart")
        listed = {cu for cu, _, _, _ in ERROR_TABLE}
        problems += [f"{m.name} is not in the table" for m in driver.CUresult if int(m) not in listed]
        print("RESULT " + json.dumps(problems))
    """)
    assert result == []


# --- last error -------------------------------------------------------------------------------------------------------

def test_the_last_error_is_kept_per_thread_until_read(rig: Rig) -> None:
    rt = connected(rig)
    get, peek = rt.fn["cudaGetLastError"], rt.fn["cudaPeekAtLastError"]
    assert (peek(), get()) == (SUCCESS, SUCCESS)
    assert rt.fn["cudaSetDevice"](5) == INVALID_DEVICE
    assert rt.out("cudaGetDeviceCount") == (SUCCESS, 2)  # a later success does not clear it
    assert (peek(), peek()) == (INVALID_DEVICE, INVALID_DEVICE)

    seen: dict[str, int] = {}

    def other_thread() -> None:
        seen["before"] = peek()
        seen["own"] = rt.fn["cudaMalloc"](None, 8)
        seen["after"] = get()
    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join(TEST_TIMEOUT_S / 2)
    assert not thread.is_alive()
    assert seen == {"before": SUCCESS, "own": INVALID_VALUE, "after": INVALID_VALUE}

    assert rt.fn["cudaSetDevice"](-3) == INVALID_DEVICE  # the latest error wins
    assert rt.memcpy(None, None, 8, 7) == INVALID_MEMCPY_DIRECTION  # no such cudaMemcpyKind
    assert get() == INVALID_MEMCPY_DIRECTION and get() == SUCCESS and peek() == SUCCESS


def test_unimplemented_runtime_functions_answer_801_named_once(caplog: pytest.LogCaptureFixture) -> None:
    shim = RuntimeShim({})
    stream_create = shim.fallback("cudaStreamCreateOrionTest")
    blind = shim.fallback("cudaMalloc3DOrionTest")  # a struct-by-value signature: called with no arguments
    with caplog.at_level(logging.WARNING, logger="guest_runtime.capsule_hook"):
        assert stream_create(0x1000) == NOT_SUPPORTED and stream_create(0x1000) == NOT_SUPPORTED
        assert shim.cudaPeekAtLastError() == NOT_SUPPORTED  # recorded, as cudart records a failing call
        assert blind() == NOT_SUPPORTED
    said = [r.getMessage() for r in caplog.records]
    assert [m.split()[0] for m in said] == ["cudaStreamCreateOrionTest", "cudaMalloc3DOrionTest"]
    assert all("801" in m for m in said)
    assert shim.cudaGetLastError() == NOT_SUPPORTED and shim.cudaGetLastError() == SUCCESS


# --- against the wheel ------------------------------------------------------------------------------------------------

@needs_wheel
def test_runtime_attributes_are_the_driver_attributes_of_the_same_value() -> None:
    result = run_child("""
        import json
        from cuda.bindings import driver, runtime
        from guest_runtime.runtime_shim import is_runtime_attribute
        def norm(name, prefix):
            name = name[len(prefix):].replace("_", "").lower()
            return name.replace("maximum", "max").replace("alternate", "alt")
        driver_names = {int(m): norm(m.name, "CU_DEVICE_ATTRIBUTE_") for m in driver.CUdevice_attribute}
        runtime_values = {int(m) for m in runtime.cudaDeviceAttr} - {int(runtime.cudaDeviceAttr.cudaDevAttrMax)}
        renamed, missing = {}, []
        for m in runtime.cudaDeviceAttr:
            if m.name == "cudaDevAttrMax":
                continue
            if int(m) not in driver_names:
                missing.append(m.name)
            elif norm(m.name, "cudaDevAttr") != driver_names[int(m)]:
                renamed[m.name] = driver_names[int(m)]
        accepted = {v for v in range(-5, 1000) if is_runtime_attribute(v)}
        print("RESULT " + json.dumps({"missing": missing, "renamed": renamed,
                                      "max_refused": not is_runtime_attribute(runtime.cudaDeviceAttr.cudaDevAttrMax),
                                      "accepted_is_the_enum": accepted == runtime_values}))
    """)
    assert result["missing"] == []  # every cudaDeviceAttr value is a CUdevice_attribute value
    assert result["max_refused"]  # cudaDevAttrMax is the enum's end, not an attribute
    assert result["accepted_is_the_enum"]
    # the same attribute under another spelling; the Reserved ones are CUDA's own reservations of driver attributes.
    # Which spelling the driver enum shows first changes between wheels (13.5 shows the runtime's for the first five
    # below), so any attribute renamed must be one of these known pairs: never two different attributes.
    reserved = {k for k in result["renamed"] if k.startswith("cudaDevAttrReserved")}
    assert {k: v for k, v in result["renamed"].items() if k not in reserved}.items() <= {
        "cudaDevAttrMaxSharedMemoryPerBlock": "sharedmemoryperblock",
        "cudaDevAttrMaxRegistersPerBlock": "registersperblock",
        "cudaDevAttrMaxTexture2DLayeredWidth": "maxtexture2darraywidth",
        "cudaDevAttrMaxTexture2DLayeredHeight": "maxtexture2darrayheight",
        "cudaDevAttrMaxTexture2DLayeredLayers": "maxtexture2darraynumslices",
        "cudaDevAttrIsMultiGpuBoard": "multigpuboard",
        "cudaDevAttrHostRegisterReadOnlySupported": "readonlyhostregistersupported",
        "cudaDevAttrMemoryPoolSupportedHandleTypes": "mempoolsupportedhandletypes",
        "cudaDevAttrIpcEventSupport": "ipceventsupported",
        "cudaDevAttrOversizedSharedMemoryPerBlock": "maxoversizedsharedmemoryperblock",
        "cudaDevAttrCigStreamsSupported": "d3d12cigstreamssupported",
    }.items()


@needs_wheel
def test_the_runtime_version_is_the_wheels_cudart_version() -> None:
    result = run_child("""
        import json
        from guest_runtime.runtime_shim import runtime_version
        from cuda.bindings._version import __version_tuple__ as v
        ours = runtime_version()
        from cuda.bindings import runtime  # unhooked: its own cudart answers (no driver needed)
        err, real = runtime.cudaRuntimeGetVersion()
        print("RESULT " + json.dumps([ours, int(runtime.CUDART_VERSION), int(err), real,
                                      int(v[0]) * 1000 + int(v[1]) * 10]))
    """)
    ours, header, err, real, from_version = result
    assert err == SUCCESS and ours == header == real == from_version


@needs_wheel
def test_the_property_table_covers_the_wheels_cudaDeviceProp() -> None:  # noqa: N802
    result = run_child("""
        import json
        from cuda.bindings import runtime
        from guest_runtime import runtime_shim as s
        prop = runtime.cudaDeviceProp()
        fields = {a for a in dir(prop) if not a.startswith("_") and a != "getPtr"}
        covered = set(s.PROPERTY_ATTRIBUTES) | s.PROPERTY_FIELDS_OTHERWISE | s.PROPERTY_FIELDS_LEFT_ZERO
        problems = [f"{f} is not filled" for f in sorted(fields - covered)]
        problems += [f"{f} is not a field" for f in sorted(covered - fields)]
        for field, attrs in s.PROPERTY_ATTRIBUTES.items():
            problems += [f"{a} is not a cudaDeviceAttr" for a in attrs if not hasattr(runtime.cudaDeviceAttr, a)]
            value = getattr(prop, field, None)
            width = len(value) if isinstance(value, list) else 1
            if width != len(attrs):
                problems.append(f"{field} holds {width} values, the table gives {len(attrs)}")
        print("RESULT " + json.dumps(problems))
    """)
    assert result == []


# --- the real hook ----------------------------------------------------------------------------------------------------

HOOKED_PROGRAM = r"""
import ctypes, json, logging
logged = []
class Capture(logging.Handler):
    def emit(self, record):
        logged.append(record.getMessage())
logging.getLogger("guest_runtime").addHandler(Capture())

from guest_runtime import activate, capsule_hook
from guest_runtime.runtime_shim import RuntimeShim
forwarder = activate.activate()  # the driver hook ($ORION_SHM names the fake agent's region)
report = capsule_hook.installed("cuda.bindings.cyruntime")  # present once activate() installs it itself
if report is None:
    shim = RuntimeShim(forwarder.implementations())
    report = capsule_hook.install("cuda.bindings.cyruntime", shim.implementations(), shim.fallback)
from cuda.bindings import driver, runtime

out = {"implemented": list(report.implemented), "kept": list(report.kept),
       "replaced": report.replaced, "blind": list(report.blind_fallback)}
err, count = runtime.cudaGetDeviceCount()
out["count"] = [int(err), count]
out["free0"] = int(runtime.cudaFree(0)[0])
size = 1 << 20
data = bytes((i * 13 + 1) & 0xFF for i in range(size))
src, dst = ctypes.create_string_buffer(data, size), ctypes.create_string_buffer(size)
err, first = runtime.cudaMalloc(size)
err2, second = runtime.cudaMalloc(size)
kinds = runtime.cudaMemcpyKind
steps = [int(err), int(err2),
         int(runtime.cudaMemcpy(first, ctypes.addressof(src), size, kinds.cudaMemcpyHostToDevice)[0]),
         int(runtime.cudaMemcpy(second, first, size, kinds.cudaMemcpyDeviceToDevice)[0]),
         int(runtime.cudaMemcpy(ctypes.addressof(dst), second, size, kinds.cudaMemcpyDeviceToHost)[0])]
out["copy"] = steps + [dst.raw == data]
mixed = ctypes.create_string_buffer(16)  # the driver API reads the runtime's allocation: one session
out["driver_read"] = [int(driver.cuMemcpyDtoH(mixed, first, 16)[0]), mixed.raw == data[:16]]
out["free"] = [int(runtime.cudaFree(first)[0]), int(runtime.cudaFree(second)[0]), int(runtime.cudaFree(first)[0])]
out["last"] = [int(runtime.cudaGetLastError()[0]), int(runtime.cudaGetLastError()[0])]
name = runtime.cudaGetErrorName(runtime.cudaError_t.cudaErrorMemoryAllocation)
text = runtime.cudaGetErrorString(runtime.cudaError_t.cudaErrorInvalidValue)
out["error_texts"] = [int(name[0]), name[1].decode(), int(text[0]), text[1].decode()]
err, props = runtime.cudaGetDeviceProperties(0)
out["props"] = {"err": int(err), "name": props.name.decode(), "uuid": bytes(props.uuid.bytes).hex(),
                "totalGlobalMem": props.totalGlobalMem, "major": props.major, "minor": props.minor,
                "multiProcessorCount": props.multiProcessorCount, "maxThreadsDim": list(props.maxThreadsDim),
                "maxGridSize": list(props.maxGridSize), "warpSize": props.warpSize,
                "sharedMemPerBlock": props.sharedMemPerBlock, "pciBusID": props.pciBusID,
                "unifiedAddressing": props.unifiedAddressing, "memoryPoolsSupported": props.memoryPoolsSupported,
                "maxThreadsPerBlock": props.maxThreadsPerBlock, "l2CacheSize": props.l2CacheSize}
out["set1"] = [int(runtime.cudaSetDevice(1)[0])] + [int(x) for x in runtime.cudaGetDevice()]
err, value = runtime.cudaDeviceGetAttribute(runtime.cudaDeviceAttr.cudaDevAttrMultiProcessorCount, 1)
out["attribute"] = [int(err), value]
out["sync"] = int(runtime.cudaDeviceSynchronize()[0])
out["versions"] = [int(x) for x in runtime.cudaRuntimeGetVersion()] + [int(x) for x in runtime.cudaDriverGetVersion()]
out["unimplemented"] = [int(runtime.cudaStreamCreate()[0]), int(runtime.cudaStreamCreate()[0]),
                        int(runtime.cudaGetLastError()[0]),
                        int(runtime.cudaMalloc3D(runtime.make_cudaExtent(4, 4, 4))[0])]
out["extent"] = [runtime.make_cudaExtent(1, 2, 3).depth]
out["logged"] = logged
print("RESULT " + json.dumps(out), flush=True)
"""


@needs_wheel
def test_cuda_bindings_runtime_through_the_real_hooks_reaches_the_fake_agent(start: Callable[..., Rig]) -> None:
    rig = start(lacks_attributes=(3,))  # CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: a driver older than the runtime
    out = run_child(HOOKED_PROGRAM, env={"ORION_SHM": rig.path})
    assert set(out["implemented"]) == IMPLEMENTED
    assert set(out["kept"]) == NON_STATUS  # pure host-side helpers keep cudart's own code
    assert out["replaced"] == 344 - len(NON_STATUS)  # every status function: implemented or 801
    assert "cudaMalloc3D" in out["blind"]

    assert out["count"] == [SUCCESS, len(GUEST_DEVICES)]  # unhooked, this machine's cudart says 35 (no driver)
    assert out["free0"] == SUCCESS
    assert out["copy"] == [SUCCESS] * 5 + [True]
    assert out["driver_read"] == [SUCCESS, True]
    assert out["free"] == [SUCCESS, SUCCESS, INVALID_VALUE]
    assert out["last"] == [INVALID_VALUE, SUCCESS]
    assert out["error_texts"] == [SUCCESS, "cudaErrorMemoryAllocation", SUCCESS, "invalid argument"]

    fake, physical = FakeDriver(devices=forwarding_rig.FAKE_DEVICES), GUEST_DEVICES[0]
    total = rig.guest()
    total.ok("cuInit", 0)
    props = out["props"]
    assert props == {
        "err": SUCCESS, "name": fake.device_name(physical).decode(), "uuid": fake.device_uuid(physical).hex(),
        "totalGlobalMem": total.ok("cuDeviceTotalMem", 0),  # the vGPU's quota, as the executor reports it
        "major": 9, "minor": 0, "multiProcessorCount": fake.device_attribute(16, physical),
        "maxThreadsDim": [1024, 0, 64], "maxGridSize": [0x7FFFFFFF, 65535, 65535],  # Y: the attribute it lacks
        "warpSize": 32, "sharedMemPerBlock": 49152, "pciBusID": fake.device_attribute(33, physical),
        "unifiedAddressing": 1, "memoryPoolsSupported": 1, "maxThreadsPerBlock": 1024, "l2CacheSize": 52_428_800}
    said_unknown = [m for m in out["logged"] if "the driver does not know" in m]
    assert len(said_unknown) == 1 and "cudaDevAttrMaxBlockDimY" in said_unknown[0]

    assert out["set1"] == [SUCCESS, SUCCESS, 1]
    assert out["attribute"] == [SUCCESS, fake.device_attribute(16, GUEST_DEVICES[1])]
    assert out["sync"] == SUCCESS
    assert out["versions"] == [SUCCESS, runtime_version(), SUCCESS, DRIVER_VERSION]
    assert out["unimplemented"] == [NOT_SUPPORTED, NOT_SUPPORTED, NOT_SUPPORTED, NOT_SUPPORTED]
    assert out["extent"] == [3]
    assert len([m for m in out["logged"] if m.startswith("cudaStreamCreate ")]) == 1
    assert len([m for m in out["logged"] if m.startswith("cudaMalloc3D ")]) == 1

    retained = rig.entries(0, "cuDevicePrimaryCtxRetain")
    assert [e["args"] for e in retained][-2:] == [[GUEST_DEVICES[0]], [GUEST_DEVICES[1]]]
    assert rig.entries(0, "cuMemcpyDtoD")  # the device-to-device copy ran in the agent
