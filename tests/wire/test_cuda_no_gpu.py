"""A real oriond on a host without a GPU, and unmodified cuda-python programs forwarded to it.

No fake anywhere: `python -m host_agent.daemon.oriond` runs as its own process on a region file `orionsock<N>` in a
temporary directory (its server.conf points shm_path_base there); each guest is a fresh interpreter that calls
`guest_runtime.startup.autoload()` (what the orion_guest.pth hook does) before any CUDA import, with ORION_SHM
naming the region. This host has no libcuda, so the agent's sessions answer as CUDA does after a failed cuInit,
and the programs must see CUDA errors — never a crash, a hang or a Python exception from a trampoline.

Skipped where libcuda can be loaded (a GPU machine): there the agent would run real calls (tests/gpu covers it).
Every wait is bounded: subprocess timeouts, and deadlines on the agent's start, log and stop.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ivshmem import layout
from ivshmem.region import Region
from tests.processes import stop_process

REPO = Path(__file__).resolve().parents[2]
REGION_SIZE = 32 << 20
START_TIMEOUT_S = 30.0
GUEST_TIMEOUT_S = 90.0
LOG_TIMEOUT_S = 15.0
CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NO_DEVICE, CUDA_ERROR_NOT_SUPPORTED = 3, 100, 801


def _libcuda_loadable() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


pytest.importorskip("cuda.bindings", reason="cuda-python is not installed")
pytestmark = pytest.mark.skipif(_libcuda_loadable(), reason="this host has a CUDA driver (tests/gpu covers it)")


def _env(**extra: str) -> dict[str, str]:
    """This environment without any Orion variable, the repository importable, the capsule path pinned (the one
    these tests are about: the native driver's are tests/wire/test_native_*), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")} | {"ORION_NATIVE": "0"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _stop_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _agent_words(path: Path) -> tuple[int, int, int]:
    with open(path, "rb") as f:
        raw = os.pread(f.fileno(), 16, layout.AGENT_HEARTBEAT)
    return struct.unpack("<QII", raw) if len(raw) == 16 else (0, 0, 0)


class Oriond:
    """`python -m host_agent.daemon.oriond --config <workdir>/server.conf`, serving <workdir>/orionsock<index>."""

    def __init__(self, workdir: Path, index: int) -> None:
        self.name = f"orionsock{index}"
        self.region = workdir / self.name
        with open(self.region, "wb") as f:
            f.truncate(REGION_SIZE)
        conf = workdir / "server.conf"
        conf.write_text(f'[server]\n    vgpu_count = 1\n[server-shm]\n    shm_path_base = "{workdir}/"\n')
        self.log_path = workdir / "oriond.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "host_agent.daemon.oriond", "--config", str(conf),
                 "--pid-file", str(workdir / "oriond.pid")], cwd=REPO, env=_env(),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_stop_with_parent)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            _beat, pid, state = _agent_words(self.region)
            if state == layout.AGENT_SERVING and pid == self.proc.pid:
                return
            assert self.proc.poll() is None, f"oriond exited with {self.proc.returncode}:\n{self.log()}"
            assert time.monotonic() < deadline, f"oriond did not serve {self.region} in time:\n{self.log()}"
            time.sleep(0.02)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str) -> str:
        deadline = time.monotonic() + LOG_TIMEOUT_S
        while text not in self.log():
            assert time.monotonic() < deadline, f"oriond's log never said {text!r}:\n{self.log()}"
            time.sleep(0.05)
        return self.log()

    def stop(self) -> int | None:
        return stop_process(self.proc)


@pytest.fixture
def oriond(tmp_path: Path) -> Iterator[Oriond]:
    agent = Oriond(tmp_path, 5)
    yield agent
    code = agent.stop()
    assert code == 0, f"oriond exited with {code}:\n{agent.log()}"
    assert "Orion Server stopped" in agent.log()


def run_guest(script: str, **env: str) -> tuple[dict, subprocess.CompletedProcess[str]]:
    """Run `script` in a fresh interpreter; it prints one line `RESULT <json>`."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, env=_env(**env),
                            capture_output=True, text=True, timeout=GUEST_TIMEOUT_S)
    line = next((x for x in result.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, f"no result (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return json.loads(line[len("RESULT "):]), result


FORWARDED = """
    import json
    import guest_runtime.startup as orion
    orion.autoload()  # what the .pth hook does at start-up: before any CUDA import
    from guest_runtime import capsule_hook
    from cuda.bindings import driver
    out = {"hooked": capsule_hook.installed("cuda.bindings.cydriver") is not None}
    out["init"] = int(driver.cuInit(0)[0])
    err, count = driver.cuDeviceGetCount()
    out["count"] = [int(err), count]
    err, name = driver.cuGetErrorName(driver.CUresult.CUDA_ERROR_NO_DEVICE)
    out["name"] = [int(err), name.decode() if name is not None else None]
    import ctypes
    err, pfn, found = driver.cuGetProcAddress(b"cuInit", 13000, 0)  # a trampoline: calling it is forwarded too
    out["proc"] = [int(err), int(found), ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint)(int(pfn))(0)]
    out["unsupported"] = [int(driver.cuMemAllocManaged(16, 1)[0]) for _ in range(2)]
    from cuda.core import Device
    try:
        Device()
        out["core"] = None
    except BaseException as exc:
        out["core"] = [type(exc).__name__, type(exc).__module__, str(exc)]
    print("RESULT " + json.dumps(out), flush=True)
"""


def test_unmodified_programs_get_cuda_errors_from_an_agent_without_gpu(oriond: Oriond) -> None:
    out, result = run_guest(FORWARDED, ORION_SHM=str(oriond.region))
    assert result.returncode == 0, f"the program crashed or failed at exit:\n{result.stderr[-5000:]}"
    assert out["hooked"] is True
    assert out["init"] == CUDA_ERROR_NO_DEVICE
    assert out["count"] == [CUDA_ERROR_NOT_INITIALIZED, None]
    assert out["name"] == [0, "CUDA_ERROR_NO_DEVICE"]
    assert out["proc"] == [0, 0, CUDA_ERROR_NO_DEVICE]  # found (CU_GET_PROC_ADDRESS_SUCCESS), and it forwards
    assert out["unsupported"] == [CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED]
    assert result.stderr.count("cuMemAllocManaged") == 1, result.stderr  # said once, by name
    kind, module, message = out["core"]
    assert (kind, module.split(".")[:2]) == ("CUDAError", ["cuda", "core"]), out["core"]
    assert "CUDA_ERROR_NO_DEVICE" in message
    assert "DynamicLibNotFound" not in result.stderr + message
    log = oriond.wait_log("Session 1 exits.")
    assert f"Using SHM {oriond.name} for acceleration." in log
    assert "every session answers CUDA_ERROR_NO_DEVICE" in log


NO_AGENT = """
    import json
    import guest_runtime.startup as orion
    orion.autoload()
    from cuda.bindings import driver
    out = {"init": int(driver.cuInit(0)[0]), "count": int(driver.cuDeviceGetCount()[0])}
    out["again"] = int(driver.cuInit(0)[0])
    print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.parametrize("agent_state", [layout.AGENT_NEVER, layout.AGENT_STOPPED], ids=["never-served", "stopped"])
def test_a_formatted_region_without_agent_answers_no_device_and_says_why(tmp_path: Path, agent_state: int) -> None:
    path = tmp_path / "orionsock6"
    with open(path, "wb") as f:
        f.truncate(REGION_SIZE)
    region = Region.open(path)
    try:
        region.format(layout.Geometry.build(REGION_SIZE, name=path.name))
        region.set_agent(state=agent_state)
    finally:
        region.close()
    out, result = run_guest(NO_AGENT, ORION_SHM=str(path))
    assert result.returncode == 0, result.stderr[-5000:]
    assert out == {"init": CUDA_ERROR_NO_DEVICE, "count": CUDA_ERROR_NOT_INITIALIZED, "again": CUDA_ERROR_NO_DEVICE}
    assert "oriond" in result.stderr, result.stderr
    assert result.stderr.count("no GPU through Orion") == 1, result.stderr  # explained once


WITHOUT_ORION = """
    import json
    import guest_runtime.startup as orion
    orion.autoload()
    from guest_runtime import capsule_hook
    from cuda.bindings import driver
    out = {"hooked": capsule_hook.installed("cuda.bindings.cydriver") is not None}
    try:
        out["init"] = repr(driver.cuInit(0))
    except RuntimeError as exc:
        out["init"] = ["RuntimeError", type(exc).__name__]
    print("RESULT " + json.dumps(out), flush=True)
"""


def test_without_orions_environment_nothing_is_hooked() -> None:
    """The hook is active only under Orion's environment: without it cuda-python fails as it does on any
    machine without a driver (DynamicLibNotFoundError, a RuntimeError), not with a forwarded answer."""
    out, result = run_guest(WITHOUT_ORION)
    assert result.returncode == 0, result.stderr[-5000:]
    assert out == {"hooked": False, "init": ["RuntimeError", "DynamicLibNotFoundError"]}
    assert "orion:" not in result.stderr and "Orion" not in result.stderr, result.stderr
