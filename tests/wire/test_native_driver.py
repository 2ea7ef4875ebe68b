"""The native guest driver's first form (issue 13): `libcuda.so.1` generated from the call table, built with the
system compiler, loaded with ctypes, talking to a real agent (tests/forwarding_rig.py: a RegionServer whose
sessions run the CUDA executor over the fake driver). CPU only: no GPU, no real libcuda."""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from guest_runtime.native import gen_libcuda
from guest_runtime.native.build import build_driver, find_compiler
from ivshmem import api_classes, cuda_header
from ivshmem.driver_api import CALLS
from tests.forwarding_rig import Rig, bounded, native_child_env, rig, start  # noqa: F401 (fixtures)

NATIVE = Path(gen_libcuda.__file__).resolve().parent
REPO = NATIVE.parents[1]
CUDA_H = next((p for p in (Path("/usr/local/cuda/include"), *sorted(Path("/usr/local").glob("cuda-*/include")))
               if (p / "cuda.h").exists()), None)


def _compiler() -> list[str]:
    compiler = find_compiler()
    if compiler is None:
        pytest.skip("no C compiler (setup.sh installs gcc)")
    return compiler


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _compiler()
    return build_driver(tmp_path_factory.mktemp("native") / "libcuda.so.1")


@pytest.mark.parametrize("set_by_user", [None, "0"])
def test_nccls_shm_transport_is_off_once_the_driver_is_loaded_unless_the_user_set_it(library: Path,
                                                                                     set_by_user: str | None) -> None:
    """NCCL's SHM transport cannot work between forwarded processes (nccl_transport.c): loading the driver turns it
    off, before NCCL could read its environment, and keeps what the user set."""
    env = {k: v for k, v in os.environ.items() if k != "NCCL_SHM_DISABLE"}
    if set_by_user is not None:
        env["NCCL_SHM_DISABLE"] = set_by_user
    read = ("import ctypes, sys; ctypes.CDLL(sys.argv[1]); libc = ctypes.CDLL(None); "
            "libc.getenv.restype = ctypes.c_char_p; print(libc.getenv(b'NCCL_SHM_DISABLE').decode())")
    done = subprocess.run([sys.executable, "-c", read, str(library)], env=env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (set_by_user or "1")


def test_every_table_call_is_exported_and_found_through_get_proc_address(library: Path) -> None:
    lib = ctypes.CDLL(str(library))
    lookup = lib.cuGetProcAddress_v2
    lookup.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_ulonglong,
                       ctypes.POINTER(ctypes.c_int)]
    found, status = ctypes.c_void_p(), ctypes.c_int(-1)
    for name in CALLS:
        assert lookup(name.encode(), ctypes.byref(found), 13000, 0, ctypes.byref(status)) == 0, name
        assert status.value == 0 and found.value, name
        symbol = "cuGetProcAddress_v2" if name == "cuGetProcAddress" else name
        assert found.value == ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value, name
    # every name the wheel declares is found, a macro's name (cuGraphInstantiateWithFlags, which the CUDA 13
    # runtime asks for by name) as the entry point it names
    for name in gen_libcuda.driver_symbols():
        assert lookup(name.encode(), ctypes.byref(found), 13000, 0, ctypes.byref(status)) == 0, name
        assert status.value == 0 and found.value, name
    assert found.value is not None
    lookup(b"cuGraphInstantiateWithFlags", ctypes.byref(found), 13000, 0, ctypes.byref(status))
    assert found.value == ctypes.cast(lib.cuGraphInstantiate, ctypes.c_void_p).value
    assert lookup(b"cuNoSuchThing", ctypes.byref(found), 13000, 0, ctypes.byref(status)) == 0
    assert status.value == 1 and not found.value  # CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, as the driver answers
    assert lookup(b"cuNoSuchThing", ctypes.byref(found), 13000, 0, None) == 500  # CUDA_ERROR_NOT_FOUND
    # The CUDA runtime's start-up lookup of the empty name: success and no entry point, as the H100's driver answers
    assert lookup(b"", ctypes.byref(found), 0, 0, None) == 0 and not found.value


# What cuBLASLt (PyTorch's and CuPy's) and XLA looked up with dlsym on the H100 under their versioned names; without
# them cuBLASLt said "Driver API initialization failed" and XLA's cuMemGetInfo stub answered
# CUDA_ERROR_SHARED_OBJECT_INIT_FAILED.
DLSYM_BY_VERSIONED_NAME = {
    "cuCtxPopCurrent_v2", "cuCtxPushCurrent_v2", "cuDeviceTotalMem_v2", "cuEventDestroy_v2", "cuEventElapsedTime_v2",
    "cuLinkAddData_v2", "cuLinkAddFile_v2", "cuLinkCreate_v2", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemGetInfo_v2",
    "cuMemcpy2DAsync_v2", "cuMemcpyDtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoH_v2", "cuMemcpyHtoDAsync_v2",
    "cuMemcpyHtoD_v2", "cuMemsetD8_v2", "cuModuleGetGlobal_v2", "cuStreamBeginCapture_v2", "cuStreamDestroy_v2"}


def test_cuda_hs_versioned_names_are_exported_as_the_same_entry_points(library: Path) -> None:
    lib = ctypes.CDLL(str(library))

    def address(symbol: str) -> int | None:
        return ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value

    aliases = gen_libcuda.abi_aliases()
    assert {alias for alias, _ in aliases} >= DLSYM_BY_VERSIONED_NAME
    for alias, name in aliases:
        assert address(alias) == address(name), alias
    # A name with its own ABI keeps its own entry point (cuStreamGetCaptureInfo_v2: no edge data)
    assert address("cuStreamGetCaptureInfo_v3") == address("cuStreamGetCaptureInfo") != \
        address("cuStreamGetCaptureInfo_v2")
    assert address("cuGetProcAddress_v2") != address("cuGetProcAddress")  # the legacy ABI keeps its own


@pytest.mark.skipif(CUDA_H is None, reason="no cuda.h (the CUDA toolkit's headers) on this machine")
def test_driver_aliases_txt_has_every_versioned_name_of_cuda_h(tmp_path: Path) -> None:
    assert CUDA_H is not None
    kept = NATIVE / "driver_aliases.txt"
    fresh = tmp_path / "driver_aliases.txt"
    fresh.write_text(kept.read_text())
    gen_libcuda.write_aliases(CUDA_H / "cuda.h", fresh)
    assert fresh.read_text() == kept.read_text(), "regenerate: python -m guest_runtime.native.gen_libcuda --aliases"


@pytest.mark.skipif(CUDA_H is None, reason="no cuda.h (the CUDA toolkit's headers) on this machine")
def test_every_entry_point_has_cuda_hs_signature(tmp_path: Path) -> None:
    check = tmp_path / "check.c"
    check.write_text(gen_libcuda.type_check(cuda_header.parse((CUDA_H / "cuda.h").read_text()).entry_points))
    done = subprocess.run([*_compiler(), "-std=c11", "-fsyntax-only", f"-I{CUDA_H}", str(check)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[:2000]


CLIENT = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
out = {}
version, count, attr, name = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.create_string_buffer(64)
out["cuInit"] = lib.cuInit(0)
out["cuDriverGetVersion"] = [lib.cuDriverGetVersion(ctypes.byref(version)), version.value]
out["cuDeviceGetCount"] = [lib.cuDeviceGetCount(ctypes.byref(count)), count.value]
out["null_output"] = lib.cuDeviceGetCount(None)
out["cuDeviceGetAttribute"] = [lib.cuDeviceGetAttribute(ctypes.byref(attr), 16, 0), attr.value]
ctx, pointer = ctypes.c_void_p(), ctypes.c_uint64()
out["retain"] = lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
out["set_current"] = lib.cuCtxSetCurrent(ctx)
out["alloc"] = [lib.cuMemAlloc(ctypes.byref(pointer), ctypes.c_size_t(1 << 20)), pointer.value != 0]
out["memset_posted"] = lib.cuMemsetD8Async(ctypes.c_uint64(pointer.value), 7, ctypes.c_size_t(1 << 20), None)
out["synchronize"] = lib.cuCtxSynchronize()
out["free"] = lib.cuMemFree(ctypes.c_uint64(pointer.value))
out["foreign_free"] = lib.cuMemFree(ctypes.c_uint64(0xdead0000))
out["free_null"] = lib.cuMemFree(ctypes.c_uint64(0))
out["not_yet"] = lib.cuMemAllocManaged(None, 0, 1)  # unsupported: 801, named once
print("RESULT " + json.dumps(out))
"""


def _run(library: Path, environ: dict[str, str]) -> tuple[dict[str, object], str]:
    env = native_child_env(library, environ["ORION_SHM"])
    done = subprocess.run([sys.executable, "-c", CLIENT, str(library)], env=env, capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), done.stderr


def test_generic_calls_reach_a_real_agent(library: Path, rig: Rig) -> None:  # noqa: F811
    result, err = _run(library, {"ORION_SHM": rig.path})
    assert result["cuInit"] == 0
    assert result["cuDriverGetVersion"][0] == 0 and result["cuDriverGetVersion"][1] > 0  # type: ignore[index]
    assert result["cuDeviceGetCount"] == [0, 2]  # the rig's two guest devices
    assert result["null_output"] == 1  # CUDA_ERROR_INVALID_VALUE, never a write through NULL
    assert result["cuDeviceGetAttribute"][0] == 0  # type: ignore[index]
    assert result["retain"] == 0 and result["set_current"] == 0
    assert result["alloc"] == [0, True] and result["memset_posted"] == 0 and result["synchronize"] == 0
    assert result["free"] == 0
    assert result["foreign_free"] == 1  # not this session's memory: the host's ledger refuses it
    assert result["free_null"] == 0  # frees nothing and succeeds, as the driver answers (cuBLAS relies on it)
    assert result["not_yet"] == 801 and err.count("cuMemAllocManaged is not forwarded") == 1
    names = [e["name"] for e in rig.entries()]
    assert {"cuInit", "cuMemAlloc", "cuMemsetD8Async", "cuMemFree"} <= set(names)  # they reached the driver


def test_without_an_agent_cuinit_is_no_device_in_one_line(library: Path, tmp_path: Path) -> None:
    """(Without ORION_SHM the library would look for the machine's own region, as Region.discover does.)"""
    absent = tmp_path / "orionsock9"
    result, err = _run(library, {"ORION_SHM": str(absent)})
    assert result["cuInit"] == 100 and result["cuDeviceGetCount"][0] == 3  # type: ignore[index]
    assert err.count(f"orion: no GPU through Orion: {absent} does not exist") == 1


def test_every_hand_written_call_has_its_c_definition(library: Path) -> None:
    """The generator emits each table call weak; a call the generator cannot write (a hand-written one) must be
    replaced by a C definition of its own, or it would answer 801 at run time: the C twin of the Python GUEST
    registry's coverage check. Read from the library's dynamic symbols (W weak, T defined)."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm (binutils comes with gcc)")
    listed = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True)
    binding = {line.split()[2]: line.split()[1] for line in listed.stdout.splitlines() if len(line.split()) == 3}
    table = json.loads(subprocess.run([sys.executable, "-m", "ivshmem.driver_api", "json"], capture_output=True,
                                      text=True, check=True, cwd=REPO).stdout)["calls"]
    hand_written = [c["name"] for c in table if (c["answered_in_guest"] or not c["generic"])]
    missing = [name for name in hand_written if binding.get(name) != "T"]
    assert not missing, f"hand-written calls without a C definition (still the generated 801 stub): {missing}"
    assert binding["cuGetExportTable"] == binding["cuModuleGetLoadingMode"] == "T"
    assert binding["cuMemAllocManaged"] == "W"  # outside the table, not forwarded: the generated stub
    # what docs/api-table.md says is answered in the guest outside the table is what the C defines there
    names = {c["name"] for c in table}
    outside = {name for name, kind in binding.items() if kind == "T" and name in cuda_header.read().entry_points
               and name not in names}
    assert outside == set(api_classes.GUEST)
