"""tests/wire fixtures. `library`: the native guest driver (`libcuda.so.1`), built once per test session for the
modules that drive it through ctypes against a real agent; skipped where there is no C compiler (setup.sh installs
gcc). test_native_driver.py keeps its own build, which fails instead: CPU CI must show that the library builds."""
from __future__ import annotations

from pathlib import Path

import pytest

from guest_runtime.native.build import build_driver, find_compiler


@pytest.fixture(scope="session")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if find_compiler() is None:
        pytest.skip("no C compiler (setup.sh installs gcc)")
    return build_driver(tmp_path_factory.mktemp("native") / "libcuda.so.1")
