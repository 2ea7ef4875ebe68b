"""A forwarded program's exit: nothing Orion runs there may import or wait without a bound (issue 11).

A CuPy program under forwarding hung for 300 s at exit: CuPy puts `importlib.util.LazyLoader` modules (`cupyx`,
`cupy.testing`) in `sys.modules`, the capsule hook's exit handler read `__file__` of every module there, and that
read imported `cupyx` while the interpreter was shutting down. These programs run against a real oriond on a host
without a GPU (as tests/wire/test_cuda_no_gpu.py does) and put modules of their own there the way CuPy does; the
bound on each is the subprocess timeout, and a program that does not exit within it fails the test.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.wire import test_cuda_no_gpu
from tests.wire.test_cuda_no_gpu import CUDA_ERROR_NO_DEVICE, REPO, Oriond, _env, _libcuda_loadable

oriond = test_cuda_no_gpu.oriond  # the fixture: an oriond without GPU on one region, which must stop cleanly

pytestmark = pytest.mark.skipif(_libcuda_loadable(), reason="this host has a CUDA driver (tests/gpu covers it)")
EXIT_BOUND_S = 60.0  # a program that exits takes about a second; one that hangs at exit never ends
CUDA_ERROR_DEINITIALIZED = 4

# Puts `name` in sys.modules as CuPy does with cupyx: a module executed only when an attribute is first read.
LAZY = """
import importlib.util, sys

def lazy(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
"""


def run_to_exit(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `script` (after LAZY) in a fresh interpreter; fail the test if it has not exited after EXIT_BOUND_S."""
    try:
        return subprocess.run([sys.executable, "-c", LAZY + textwrap.dedent(script)], cwd=REPO, env=_env(**env),
                              capture_output=True, text=True, timeout=EXIT_BOUND_S)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        pytest.fail(f"the program did not exit within {EXIT_BOUND_S:.0f} s:\n{out[-2000:]}\n{err[-3000:]}")


def result_of(result: subprocess.CompletedProcess[str], tag: str = "RESULT") -> object:
    line = next((x for x in result.stdout.splitlines() if x.startswith(tag + " ")), None)
    assert line is not None, f"no {tag} (exit {result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return json.loads(line[len(tag) + 1:])


LAZY_MODULE_BLOCKS = """
    import json, os
    import guest_runtime.startup as orion
    orion.autoload()
    from cuda.bindings import driver
    lazy("orion_lazy_probe", os.environ["PROBE"])
    lazy("cuda.core._orion_lazy_probe", os.environ["PROBE"])  # a cuda.core name is no excuse either
    print("RESULT " + json.dumps({"init": int(driver.cuInit(0)[0])}), flush=True)
"""


def test_a_program_with_a_lazily_imported_module_exits(oriond: Oriond, tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import sys, threading\n"
                     "print(__name__, 'was imported', file=sys.stderr, flush=True)\n"
                     "threading.Event().wait()  # an import that never comes back, as cupyx's at exit\n")
    result = run_to_exit(LAZY_MODULE_BLOCKS, ORION_SHM=str(oriond.region), PROBE=str(probe))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result_of(result) == {"init": CUDA_ERROR_NO_DEVICE}
    assert "was imported" not in result.stderr, result.stderr[-3000:]
    oriond.wait_log("Session 1 exits.")


NOTHING_IMPORTED = """
    import atexit, json, os, sys
    seen = {}
    def after_orion():  # registered before activation, so it runs after every handler of Orion's
        print("IMPORTED " + json.dumps(sorted(set(sys.modules) - seen["before"])), flush=True)
    atexit.register(after_orion)
    os.environ["ORION_SHM"] = os.environ["REGION"]  # not at start-up: the .pth would activate before us
    import guest_runtime.startup as orion
    orion.autoload()
    lazy("orion_lazy_probe", os.environ["PROBE"])
    from cuda.bindings import driver, runtime
    from cuda.core import Device
    out = {"init": int(driver.cuInit(0)[0]), "runtime": int(runtime.cudaGetDeviceCount()[0])}
    try:
        Device()
    except Exception as exc:
        out["core"] = type(exc).__name__
    atexit.register(lambda: seen.update(before=set(sys.modules)))  # runs first: what exit started with
    print("RESULT " + json.dumps(out), flush=True)
"""


def test_orions_exit_handlers_import_nothing(oriond: Oriond, tmp_path: Path) -> None:
    """cuda.core and the runtime API in use, so that every handler has work to do; a lazily loaded module that
    imports another one when it runs."""
    probe = tmp_path / "probe.py"
    probe.write_text("import colorsys  # any import: it must not happen at exit\n")
    result = run_to_exit(NOTHING_IMPORTED, REGION=str(oriond.region), PROBE=str(probe))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result_of(result) == {"init": CUDA_ERROR_NO_DEVICE, "runtime": 100, "core": "CUDAError"}
    assert result_of(result, "IMPORTED") == []


LATE_CALL = """
    import atexit, json, os, sys, time
    def after_orion():  # registered before activation, so it runs after Orion has ended the session
        deadline = time.monotonic() + 15
        while "Session 1 exits." not in open(os.environ["AGENT_LOG"]).read():
            if time.monotonic() > deadline:
                print("LATE " + json.dumps("the host never ended the session"), flush=True)
                return
            time.sleep(0.05)
        from cuda.bindings import driver
        print("LATE " + json.dumps([int(driver.cuInit(0)[0]), int(driver.cuDeviceGetCount()[0])]), flush=True)
    atexit.register(after_orion)
    os.environ["ORION_SHM"] = os.environ["REGION"]  # not at start-up: the .pth would activate before us
    import guest_runtime.startup as orion
    orion.autoload()
    from cuda.bindings import driver
    print("RESULT " + json.dumps({"init": int(driver.cuInit(0)[0])}), flush=True)
"""


def test_a_driver_call_after_the_session_ended_at_exit_answers_deinitialized(oriond: Oriond) -> None:
    """An exit handler that runs after Orion's (registered before an explicit activation, or a lazily imported
    module's code, as cupyx's was) still calls the driver: it gets CUDA_ERROR_DEINITIALIZED at once, as from a
    torn-down driver, instead of waiting for ever on the channel the host has stopped serving."""
    result = run_to_exit(LATE_CALL, REGION=str(oriond.region), AGENT_LOG=str(oriond.log_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result_of(result) == {"init": CUDA_ERROR_NO_DEVICE}
    assert result_of(result, "LATE") == [CUDA_ERROR_DEINITIALIZED, CUDA_ERROR_DEINITIALIZED]
