"""The host's compiled modules (host_agent/native_build.py) build and load wherever a C compiler and Python's headers
are. Their own tests skip on a host without them (the worker then serves every record in Python, by design), so a
source that no longer compiles would otherwise show only as skipped tests: here it fails, with the compiler's first
line."""
from __future__ import annotations

import importlib.util
import os
import sysconfig
from pathlib import Path

import pytest

from host_agent.native_build import NativeModule, Unavailable
from host_agent.relay import compiled_pump
from host_agent.session import hot_path
from ivshmem.shared.compiler import find_compiler

pytestmark = pytest.mark.skipif(
    find_compiler() is None or not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")),
    reason="no C compiler or Python headers here: the compiled modules are optional")


@pytest.mark.parametrize("program", [hot_path.PROGRAM, compiled_pump.PROGRAM], ids=["hot_dispatch", "relay_pump"])
def test_each_compiled_module_builds_and_loads_here(program: NativeModule, tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)  # the trust check's: only its owner may write where compiled code is loaded from
    try:
        path = program.build(tmp_path)
    except Unavailable as exc:
        pytest.fail(f"{program.source.name} does not build: {exc}")
    spec = importlib.util.spec_from_file_location(program.name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
