"""orion_guest.pth runs in every Python process of an environment with orion-guest installed: without Orion's
environment it must cost nothing beyond its own tiny module (it once imported the whole forwarding layer,
~0.1 s, into every interpreter); with it, forwarding is on before the program's first line."""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from guest_runtime.activate import same_signature
from guest_runtime.native.build import build_driver, find_compiler
from guest_runtime.startup import native_library
from ivshmem.driver_api import CALLS

LOADED = ("import sys; print(' '.join(sorted(m for m in sys.modules "
          "if m.split('.')[0] in ('guest_runtime', 'ivshmem', 'cuda'))))")


def _modules(**extra: str) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")} | extra
    out = subprocess.run([sys.executable, "-c", LOADED], env=env, capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return set(out.split())


def test_without_orions_environment_start_up_imports_only_the_hook() -> None:
    assert _modules() == {"guest_runtime", "guest_runtime.startup"}  # the .pth ran, and did nothing more


def test_with_orions_environment_forwarding_is_on_at_start_up() -> None:
    loaded = _modules(ORION_SHM="/nonexistent/orionsock0", ORION_NATIVE="0")  # nothing connects yet
    assert {"guest_runtime.activate", "guest_runtime.forward", "ivshmem.driver_api"} <= loaded


@pytest.fixture(scope="module")
def native_driver(tmp_path_factory: pytest.TempPathFactory) -> str:
    if find_compiler() is None:
        pytest.skip("no C compiler (setup.sh installs gcc)")
    return str(build_driver(tmp_path_factory.mktemp("native") / "libcuda.so.1"))


OPENS_LIBCUDA = ("import ctypes, sys; lib, alias = ctypes.CDLL('libcuda.so.1'), ctypes.CDLL('libcuda.so'); "
                 "print(hasattr(lib, 'orion_integrity_digest'), "
                 "ctypes.cast(alias.cuInit, ctypes.c_void_p).value == ctypes.cast(lib.cuInit, ctypes.c_void_p).value, "
                 "' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('guest_runtime', 'ivshmem'))))")


def test_with_the_native_driver_installed_every_dlopen_of_libcuda_gets_it(native_driver: str) -> None:
    """What a framework's CUDA runtime does (dlopen by SONAME, or of "libcuda.so" as cuBLAS does) gets the native
    driver the hook loaded, the same one by both names, and no Python forwarding layer is imported (one path per
    process); this machine has no other libcuda."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    env |= {"ORION_SHM": "/nonexistent/orionsock0", "ORION_NATIVE": "1", "ORION_NATIVE_LIB": native_driver}
    done = subprocess.run([sys.executable, "-c", OPENS_LIBCUDA], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "guest_runtime", "guest_runtime.startup"]  # one driver


def test_which_path_a_process_takes(native_driver: str, tmp_path: object) -> None:
    chosen = {"ORION_NATIVE": "1", "ORION_NATIVE_LIB": native_driver}
    assert native_library(chosen) == (native_driver, f"native driver {native_driver}")
    assert native_library({"ORION_NATIVE_LIB": native_driver})[0] == native_driver  # the default where built
    assert native_library(chosen | {"ORION_NATIVE": "0"})[0] is None  # the capsule path asked for
    assert native_library(chosen | {"ORION_VGPU": "1"})[0] == native_driver  # its lease helper asks the controller
    path, why = native_library(chosen | {"ORION_NATIVE_LIB": "/nonexistent/libcuda.so.1"})
    assert path is None and "no native driver at /nonexistent/libcuda.so.1" in why


def test_a_process_without_the_native_driver_says_so_once_unless_it_asked_for_the_capsule_path() -> None:
    """An orion-guest installed where no compiler was (pip hides the build hook's line) has no native driver: the
    program is told, in one line at start, that frameworks need it and how to get it."""
    script = "import guest_runtime.startup as s; s.autoload(); print('STARTED')"
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    base |= {"ORION_SHM": "/nonexistent/orionsock0", "ORION_NATIVE_LIB": "/nonexistent/libcuda.so.1"}
    for extra, told in (({}, True), ({"ORION_NATIVE": "0"}, False)):
        done = subprocess.run([sys.executable, "-c", script], env=base | extra, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0 and "STARTED" in done.stdout, done.stderr
        lines = [line for line in done.stderr.splitlines() if "no native driver at" in line]
        assert len(lines) == (1 if told else 0), done.stderr
        if told:
            assert "make wheels" in lines[0] and "PyTorch" in lines[0]


def test_a_function_whose_wheel_signature_differs_is_left_to_the_fallback(caplog: pytest.LogCaptureFixture) -> None:
    """Another cuda-bindings' cuCtxCreate (say, 12.x's three parameters) would be handed arguments the table's
    implementation misreads: it is not forwarded, and the log says why and what to install."""
    impls = {"cuCtxCreate": lambda *a: 0, "cuInit": lambda *a: 0, "cuMemAlloc": lambda *a: 0}
    wheel = {"cuCtxCreate": "CUresult (CUcontext *, unsigned int, CUdevice)", "cuInit": CALLS["cuInit"].signature}
    with caplog.at_level(logging.WARNING):
        kept = same_signature(impls, wheel)
    assert set(kept) == {"cuInit"}  # cuMemAlloc: this wheel lacks it, so nothing can call it (nothing to hook)
    assert "cuCtxCreate is CUresult (CUcontext *, unsigned int, CUdevice) in this cuda-bindings" in caplog.text
    assert "orion-guest[cuda]" in caplog.text
