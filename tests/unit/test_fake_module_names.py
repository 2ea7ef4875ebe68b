"""The fake driver's module enumeration and names, device bus ids, LUIDs and atomic capabilities (tests/fake_driver.py),
called directly as the executor calls `cuda.bindings.driver`: the counts, an enumeration's handles (the ones the
by-name calls give, before or after, in the image's order, NULLs past the end, the fake's rule for 0), their names as
bytes, what the name calls refuse, a bus id in the wheel's buffer and read back in its three forms, LUIDs refused as on
Linux, and the atomic capability queries with the wheel's argument checks. tests/gpu/programs/module_names_program.py
runs over the fake too (its --fake mode). CPU only."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fake_driver import (
    HOST_ATOMIC_CAPABILITIES,
    P2P_ATOMIC_CAPABILITIES,
    CUatomicOperation,
    CUatomicOperationCapability,
    CUdevice,
    CUfunction,
    CUkernel,
    CUresult,
    FakeDriver,
    read_journal,
)
from tests.unit.test_forwarding_roundtrip import minimal_elf

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "tests" / "gpu" / "programs" / "module_names_program.py"
SUCCESS, INVALID_VALUE, INVALID_HANDLE, INVALID_DEVICE, INVALID_CONTEXT, NOT_INITIALIZED, NOT_SUPPORTED = (
    CUresult.CUDA_SUCCESS, CUresult.CUDA_ERROR_INVALID_VALUE, CUresult.CUDA_ERROR_INVALID_HANDLE,
    CUresult.CUDA_ERROR_INVALID_DEVICE, CUresult.CUDA_ERROR_INVALID_CONTEXT, CUresult.CUDA_ERROR_NOT_INITIALIZED,
    CUresult.CUDA_ERROR_NOT_SUPPORTED)
# Three kernels, in this order in the image (the fake enumerates in the image's order).
PTX = b"""\
.version 8.0
.target sm_90
.address_size 64
.visible .entry zeta(.param .u64 zeta_0)
{
ret;
}
.visible .entry alpha()
{
ret;
}
.visible .entry mid(.param .u32 mid_0, .param .f64 mid_1)
{
ret;
}
"""
NAMES = [b"zeta", b"alpha", b"mid"]
OPERATIONS = [op for op in CUatomicOperation if op != CUatomicOperation.CU_ATOMIC_OPERATION_MAX]


@pytest.fixture
def fake() -> FakeDriver:
    """A fake with three GPUs, initialised, device 0's primary context current."""
    driver = FakeDriver(devices=3)
    assert driver.cuInit(0)[0] == SUCCESS
    _, context = driver.cuDevicePrimaryCtxRetain(_ok(driver.cuDeviceGet(0)))
    assert driver.cuCtxSetCurrent(context)[0] == SUCCESS
    return driver


def _ok(result: tuple[Any, ...]) -> Any:
    assert result[0] == SUCCESS, result
    return result[1] if len(result) == 2 else result[1:]


def _module(fake: FakeDriver, image: bytes = PTX + b"\0") -> Any:
    return _ok(fake.cuModuleLoadData(image))


def _library(fake: FakeDriver, image: bytes = PTX + b"\0") -> Any:
    return _ok(fake.cuLibraryLoadData(image, [], [], 0, [], [], 0))


# --- modules and libraries -------------------------------------------------------------------------------------------

def test_a_modules_functions_are_counted_enumerated_in_image_order_and_named(fake: FakeDriver) -> None:
    module = _module(fake)
    assert fake.cuModuleGetFunctionCount(module) == (SUCCESS, 3)
    functions = _ok(fake.cuModuleEnumerateFunctions(3, module))
    assert [type(f) for f in functions] == [CUfunction] * 3 and len({int(f) for f in functions}) == 3
    assert [_ok(fake.cuFuncGetName(f)) for f in functions] == NAMES  # bytes, as the wheel's
    assert [_ok(fake.cuModuleGetFunction(module, name)) for name in NAMES] == functions  # the same handles, after


def test_an_enumeration_gives_the_handles_the_by_name_calls_gave_before(fake: FakeDriver) -> None:
    module, library = _module(fake), _library(fake)
    before = _ok(fake.cuModuleGetFunction(module, b"mid"))
    kernel = _ok(fake.cuLibraryGetKernel(library, b"alpha"))
    assert _ok(fake.cuModuleEnumerateFunctions(3, module))[2] == before
    assert _ok(fake.cuLibraryEnumerateKernels(3, library))[1] == kernel
    assert _ok(fake.cuModuleEnumerateFunctions(3, module)) == _ok(fake.cuModuleEnumerateFunctions(3, module))


def test_a_librarys_kernels_are_counted_enumerated_and_named(fake: FakeDriver) -> None:
    library = _library(fake)
    assert fake.cuLibraryGetKernelCount(library) == (SUCCESS, 3)
    kernels = _ok(fake.cuLibraryEnumerateKernels(3, library))
    assert [type(k) for k in kernels] == [CUkernel] * 3
    assert [_ok(fake.cuKernelGetName(k)) for k in kernels] == NAMES
    assert [_ok(fake.cuLibraryGetKernel(library, name)) for name in NAMES] == kernels
    function = _ok(fake.cuKernelGetFunction(kernels[2]))  # a function of a kernel is named as the kernel
    assert fake.cuFuncGetName(function) == (SUCCESS, b"mid")


def test_the_count_is_a_maximum_fewer_give_the_first_more_give_nulls_after_and_0_is_refused(fake: FakeDriver) -> None:
    module, library = _module(fake), _library(fake)
    every = _ok(fake.cuModuleEnumerateFunctions(3, module))
    assert fake.cuModuleEnumerateFunctions(1, module) == (SUCCESS, every[:1])
    assert fake.cuModuleEnumerateFunctions(5, module) == (SUCCESS, every + [CUfunction(0), CUfunction(0)])
    assert fake.cuModuleEnumerateFunctions(0, module) == (INVALID_VALUE, None)  # the wheel hands the driver NULL
    kernels = _ok(fake.cuLibraryEnumerateKernels(4, library))
    assert kernels[3] == CUkernel(0) and all(int(k) for k in kernels[:3])
    assert fake.cuLibraryEnumerateKernels(0, library) == (INVALID_VALUE, None)
    with pytest.raises(OverflowError):  # the wheel's unsigned int
        fake.cuModuleEnumerateFunctions(-1, module)


def test_what_the_counts_and_enumerations_refuse(fake: FakeDriver) -> None:
    module, library = _module(fake), _library(fake)
    assert fake.cuModuleGetFunctionCount(library) == (INVALID_HANDLE, None)  # a library is no module
    assert fake.cuLibraryGetKernelCount(module) == (INVALID_HANDLE, None)
    assert fake.cuModuleEnumerateFunctions(3, 0xBAD0) == (INVALID_HANDLE, None)
    assert fake.cuLibraryEnumerateKernels(3, None) == (INVALID_HANDLE, None)
    _ok(fake.cuCtxPopCurrent())  # cuda.h lists INVALID_CONTEXT for the module's enumeration, not the library's
    assert fake.cuModuleEnumerateFunctions(3, module) == (INVALID_CONTEXT, None)
    assert len(_ok(fake.cuLibraryEnumerateKernels(3, library))) == 3
    assert FakeDriver(devices=1).cuModuleEnumerateFunctions(3, module) == (NOT_INITIALIZED, None)


def test_what_the_name_calls_refuse(fake: FakeDriver) -> None:
    module, library = _module(fake), _library(fake)
    (function,) = _ok(fake.cuModuleEnumerateFunctions(1, module))
    (kernel,) = _ok(fake.cuLibraryEnumerateKernels(1, library))
    assert fake.cuFuncGetName(CUfunction(0)) == (INVALID_VALUE, None)  # NULL: cuda.h's code
    assert fake.cuKernelGetName(None) == (INVALID_VALUE, None)
    assert fake.cuFuncGetName(int(kernel)) == (INVALID_HANDLE, None)  # a kernel is no function
    assert fake.cuKernelGetName(int(function)) == (INVALID_HANDLE, None)
    assert fake.cuModuleUnload(module)[0] == SUCCESS
    assert fake.cuFuncGetName(function) == (INVALID_HANDLE, None)  # gone with its module
    assert fake.cuLibraryUnload(library)[0] == SUCCESS
    assert fake.cuKernelGetName(kernel) == (INVALID_HANDLE, None)


def test_an_elf_images_kernels_enumerate_too(fake: FakeDriver) -> None:
    module = _module(fake, minimal_elf(b"from_elf"))
    assert fake.cuModuleGetFunctionCount(module) == (SUCCESS, 1)
    (function,) = _ok(fake.cuModuleEnumerateFunctions(1, module))
    assert fake.cuFuncGetName(function) == (SUCCESS, b"from_elf")


def test_the_journal_holds_enumerations_and_names(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    fake = FakeDriver(devices=1, journal=str(journal))
    fake.cuInit(0)
    _, context = fake.cuDevicePrimaryCtxRetain(_ok(fake.cuDeviceGet(0)))
    fake.cuCtxSetCurrent(context)
    module = _module(fake)
    functions = _ok(fake.cuModuleEnumerateFunctions(4, module))
    fake.cuFuncGetName(functions[0])
    fake.cuDeviceGetHostAtomicCapabilities(OPERATIONS[:2], 2, 0)
    entries = {entry["name"]: entry for entry in read_journal(journal)}
    assert entries["cuModuleEnumerateFunctions"]["result"] == [
        ["CUresult", 0], [["CUfunction", int(f)] for f in functions]]
    assert entries["cuFuncGetName"]["result"][1]["hex"] == b"zeta".hex()
    assert entries["cuDeviceGetHostAtomicCapabilities"]["args"] == [
        [["CUatomicOperation", 0], ["CUatomicOperation", 1]], 2, 0]
    assert json.loads(json.dumps(entries)) == entries


# --- bus ids and LUIDs -----------------------------------------------------------------------------------------------

def test_a_bus_id_fills_the_wheels_buffer(fake: FakeDriver) -> None:
    assert fake.cuDeviceGetPCIBusId(20, 0) == (SUCCESS, b"0000:18:00.0\0       ")  # NUL, then the wheel's spaces
    assert fake.cuDeviceGetPCIBusId(17, CUdevice(2)) == (SUCCESS, b"0000:1a:00.0\0    ")
    assert fake.cuDeviceGetPCIBusId(13, 1) == (SUCCESS, b"0000:19:00.0\0")  # length 13: all of it, and its NUL
    assert fake.cuDeviceGetPCIBusId(0, 0) == (INVALID_VALUE, None)
    assert fake.cuDeviceGetPCIBusId(20, 3) == (INVALID_DEVICE, None)


def test_a_bus_id_maps_back_in_its_three_forms_and_any_case(fake: FakeDriver) -> None:
    for text, device in ((b"00000000:18:00.0", 0), (b"00000000:1A:00.0", 2), (b"0000:1a:00.0", 2),
                         (b"1a:00.0", 2), (b"19:00.0", 1), (b"00000000:19:00", 1), (bytearray(b"18:00.0\0junk"), 0)):
        assert fake.cuDeviceGetByPCIBusId(text) == (SUCCESS, CUdevice(device)), text
    assert fake.cuDeviceGetByPCIBusId(b"00000000:ee:00.0") == (INVALID_DEVICE, None)  # no such device
    assert fake.cuDeviceGetByPCIBusId(b"00000000:18:01.0") == (INVALID_DEVICE, None)
    for text in (b"", b"18", b"gpu0", b"00000000:18:00.0x"):
        assert fake.cuDeviceGetByPCIBusId(text) == (INVALID_VALUE, None), text
    with pytest.raises(TypeError):  # the wheel takes bytes
        fake.cuDeviceGetByPCIBusId("00000000:18:00.0")


def test_a_luid_is_not_supported_as_on_linux(fake: FakeDriver) -> None:
    assert fake.cuDeviceGetLuid(0) == (NOT_SUPPORTED, None, None)  # the wheel's shape: (CUresult, luid, mask)
    assert fake.cuDeviceGetLuid(CUdevice(7)) == (INVALID_DEVICE, None, None)
    assert FakeDriver(devices=1).cuDeviceGetLuid(0) == (NOT_INITIALIZED, None, None)


# --- atomic capabilities ---------------------------------------------------------------------------------------------

def test_host_and_peer_atomic_capabilities(fake: FakeDriver) -> None:
    assert fake.cuDeviceGetHostAtomicCapabilities(OPERATIONS, len(OPERATIONS), 0) == (SUCCESS, [0] * 13)
    assert fake.cuDeviceGetP2PAtomicCapabilities(OPERATIONS, len(OPERATIONS), 0, CUdevice(1)) == (
        SUCCESS, [P2P_ATOMIC_CAPABILITIES[int(op)] for op in OPERATIONS])
    cas = CUatomicOperation.CU_ATOMIC_OPERATION_CAS
    bits = CUatomicOperationCapability
    assert _ok(fake.cuDeviceGetP2PAtomicCapabilities((cas,), 1, 2, 1)) == [
        bits.CU_ATOMIC_CAPABILITY_SIGNED | bits.CU_ATOMIC_CAPABILITY_UNSIGNED | bits.CU_ATOMIC_CAPABILITY_SCALAR_32
        | bits.CU_ATOMIC_CAPABILITY_SCALAR_64 | bits.CU_ATOMIC_CAPABILITY_SCALAR_128]
    assert fake.cuDeviceGetHostAtomicCapabilities(OPERATIONS, 2, 0) == (SUCCESS, [0, 0])  # the first `count`
    assert set(HOST_ATOMIC_CAPABILITIES) == set(P2P_ATOMIC_CAPABILITIES) == {int(op) for op in OPERATIONS}


def test_what_the_atomic_queries_refuse(fake: FakeDriver) -> None:
    top = CUatomicOperation.CU_ATOMIC_OPERATION_MAX
    assert fake.cuDeviceGetHostAtomicCapabilities([top], 1, 0) == (INVALID_VALUE, None)  # in the enum, no operation
    assert fake.cuDeviceGetHostAtomicCapabilities(OPERATIONS, 0, 0) == (INVALID_VALUE, None)  # cuda.h: count 0
    assert fake.cuDeviceGetHostAtomicCapabilities(None, 0, 0) == (INVALID_VALUE, None)
    assert fake.cuDeviceGetHostAtomicCapabilities(OPERATIONS, 1, 3) == (INVALID_DEVICE, None)
    assert fake.cuDeviceGetP2PAtomicCapabilities(OPERATIONS, 1, 0, 0) == (INVALID_DEVICE, None)  # cuda.h: same device
    assert fake.cuDeviceGetP2PAtomicCapabilities(OPERATIONS, 1, 0, 5) == (INVALID_DEVICE, None)
    assert fake.cuDeviceGetP2PAtomicCapabilities([top], 1, 0, 1) == (INVALID_VALUE, None)
    assert FakeDriver(devices=1).cuDeviceGetHostAtomicCapabilities(OPERATIONS, 1, 0) == (NOT_INITIALIZED, None)
    with pytest.raises(TypeError):  # the wheel takes CUatomicOperation members only
        fake.cuDeviceGetHostAtomicCapabilities([0], 1, 0)
    with pytest.raises(TypeError):
        fake.cuDeviceGetP2PAtomicCapabilities(CUatomicOperation.CU_ATOMIC_OPERATION_AND, 1, 0, 1)
    with pytest.raises(RuntimeError, match="List is too small"):  # the wheel's, for a count above the list's length
        fake.cuDeviceGetHostAtomicCapabilities(OPERATIONS[:1], 3, 0)


def test_the_atomic_enums_are_the_wheels() -> None:
    wheel = pytest.importorskip("cuda.bindings.driver")
    for ours in (CUatomicOperation, CUatomicOperationCapability):
        theirs = getattr(wheel, ours.__name__)
        assert {m.name: int(m) for m in ours} == {m.name: int(m) for m in theirs}


# --- the GPU program, over the fake --------------------------------------------------------------------------------

# What tests/gpu/programs/module_names_program.py gives over the fake: the fake's rules, not yet compared with a GPU's.
FAKE_RESULT: dict[str, Any] = {
    "ok": True,
    "function_count": 3, "kernel_count": 3,
    "function_names": ["names_first", "names_second", "names_third"],
    "kernel_names": ["names_first", "names_second", "names_third"],
    "function_names_in_order": ["names_first", "names_second", "names_third"],
    "kernel_names_in_order": ["names_first", "names_second", "names_third"],
    "functions_match": [True] * 3, "kernels_match": [True] * 3,
    "enumerate_functions": {"0": [1, None], "1": [0, 1], "count+2": [0, 3]},
    "enumerate_kernels": {"0": [1, None], "1": [0, 1], "count+2": [0, 3]},
    "name_of_null": [1, 1],
    "bus_id": "0000:18:00.0", "by_bus_id": [0, 0], "by_bus_id_upper": [0, 0], "by_bus_id_short": [0, 0],
    "luid": [801, None],
    "atomic_operations": list(range(13)), "host_atomics": [0, [0] * 13], "host_atomic_max": 1,
    "host_atomic_count_0": 1, "p2p_atomics_0_0": [101, None],
}


def test_the_gpu_program_runs_over_the_fake() -> None:
    """tests/gpu/programs/module_names_program.py's logic over the fake, in this process."""
    spec = importlib.util.spec_from_file_location("module_names_program", PROGRAM)  # a program, not a module
    assert spec is not None and spec.loader is not None
    program = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)
    assert json.loads(json.dumps(program.run(FakeDriver(devices=1)))) == FAKE_RESULT


def test_the_gpu_program_with_fake_prints_its_result_line() -> None:
    """`python module_names_program.py --fake`, as a program: one RESULT line, the same values."""
    done = subprocess.run([sys.executable, str(PROGRAM), "--fake"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert json.loads(line[len("RESULT "):]) == FAKE_RESULT
