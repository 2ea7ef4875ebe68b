"""Unmodified CUDA Python programs, run natively and forwarded through a real oriond, give the same results.

GPU machine only (the device machine); skipped elsewhere. The forwarded run is the same program file, started with
forwarding activated (the capsule path here; tests/gpu/test_native_frameworks.py runs the programs on the native
guest driver), its session served by an oriond running as its own process on a fresh region, either locally or
relayed over TCP loopback to a second oriond that holds the GPU (docs/remote.md).

Every program is compared on both paths, by its values: each program's RESULT carries numbers (sums of what it
computed on the GPU, the values it read back) besides its ok flags, and `assert_same_results` wants each one as
natively (exactly, or to the tolerance CLOSE gives), so a path that answers CUDA_SUCCESS with zeros fails. A relayed
PyTorch run once trained on zeros and exited 0 (issue 26); only a comparison of values can see that. Each program's
native run happens once per test session (`native`) and serves every path that is compared with it.

What does not belong here: timings (bench/), and programs/quota_program.py, whose native and forwarded results
differ by design (tests/gpu/test_gpu_quota.py compares them).
"""
from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster_key import key_file
from tests.controller.rig import free_port
from tests.processes import stop_process

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).parent / "programs"
HAS_GPU = os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU (device machine)")]
FORWARD = ("import sys, runpy, guest_runtime.activate as orion; orion.activate(); "
           "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
PATHS = ("local", "relayed")  # where a forwarded run's session is served: the `oriond` or the `relayed` fixture
NATIVE_TIMEOUT_S = 300

# The module a program needs besides cuda-python (the GPU machine has them all: skipped where one is missing).
NEEDS = {"numba_program.py": "numba", "torch_matmul_program.py": "torch", "torch_cnn_program.py": "torch",
         "cupy_program.py": "cupy", "cupy_fft_program.py": "cupy", "jax_program.py": "jax"}
# A program that fails natively on the GPU machine, whatever Orion does: (what its native stderr then says, why).
# Skipped there, on every path; any other native failure fails the test.
BROKEN_NATIVELY = {"numba_program.py": ("row_stack", "numba-cuda 0.30.4 calls np.row_stack, which numpy 2.5 removed: "
                                                     "a numba kernel fails natively on the GPU machine (TESTBED.md)")}
# Results compared to a relative tolerance instead of exactly: (tolerance, keys). The CNN's losses: the same kernels
# on the same GPU, the tolerance only allows for another reduction order (not seen). JAX: XLA's autotuner times GEMM
# algorithms at start and may pick another one run to run, which moves the last bits.
CLOSE: dict[str, tuple[float, tuple[str, ...]]] = {
    "torch_cnn_program.py": (1e-5, ("losses",)),
    "jax_program.py": (1e-4, ("matmul_abs_sum", "grad_abs_sum")),
}
# What a program's native result must show besides its ok flags, so that agreeing with it means the right values.
NATIVE_SHOWS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "stream_order_program.py": lambda r: r == {"dtoh_after_kernel": 42, "htod_after_kernel": 99},
    # page-locked memory has a device pointer and pointer attributes; a thread starts with no context
    "pinned_threads_program.py": lambda r: r["device_pointer_status"] == 0 and r["device_pointer_is_host_pointer"]
    and r["pinned_memory_type"][0] == 0 and r["pinned_host_pointer"] == [0, True] and r["free_twice"]
    and (r["thread_current"], r["thread_alloc_without_context"]) == (0, 201),
    "torch_matmul_program.py": lambda r: r["max_error"] < 1e-3 and r["count"] == 1,
    "torch_cnn_program.py": lambda r: r["learned"] and len(r["losses"]) == 20,
    "jax_program.py": lambda r: r["platform"] == "gpu",
}


class Oriond:
    def __init__(self, workdir: Path, *flags: str, listen_port: int = 0, relay_to: str = "", vgpu_count: int = 1,
                 sections: str = "", region_mib: int = 256) -> None:
        """Serves a region of `region_mib` MiB in a fresh directory of /dev/shm (tmpfs: its pages can be
        page-locked, as the pinned pool needs; a disk-backed file's may not be). `listen_port`: where it takes
        relayed sessions (0: a free one); `relay_to`: relay every session to that HOST:PORT (docs/remote.md);
        `sections`: more of server.conf (e.g. [server-mps])."""
        self.shm_dir = Path(tempfile.mkdtemp(prefix="orion-gpu-test-", dir="/dev/shm"))
        self.region = self.shm_dir / "orionsock7"
        with open(self.region, "wb") as f:
            f.truncate(region_mib << 20)
        self.listen_port = listen_port or free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        conf = workdir / "server.conf"
        conf.write_text(f'[server]\n    vgpu_count = {vgpu_count}\n    listen_port = {self.listen_port}\n'
                        f'[server-shm]\n    shm_path_base = "{self.shm_dir}/"\n'
                        f"[server-log]\n    log_dir = {workdir}/log\n"
                        f"[cluster]\n    key_file = {key_file()}\n"  # both orionds hold the tests' cluster key
                        + (f"[server-relay]\n    remote_addr = {relay_to}\n" if relay_to else "") + sections)
        self.log = workdir / "oriond.log"
        with open(self.log, "wb") as log:
            command = [sys.executable, "-m", "host_agent.daemon.oriond", "--config", str(conf),
                       "--pid-file", str(self.shm_dir / "oriond.pid"), *flags]
            self.proc = subprocess.Popen(command,
                                         cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while b"Using SHM orionsock7" not in self.log.read_bytes():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.1)

    def stop(self) -> None:
        stop_process(self.proc)
        shutil.rmtree(self.shm_dir, ignore_errors=True)


def _env(**extra: str) -> dict[str, str]:
    """The repository importable, the capsule path pinned (these programs' forwarded runs are about it; the native
    driver's tests pass ORION_NATIVE=1 and their build), plus `extra`."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), ORION_NATIVE="0")
    env.update(extra)
    return env


@pytest.fixture
def oriond(tmp_path: Path) -> Iterator[Oriond]:
    agent = Oriond(tmp_path)
    yield agent
    agent.stop()
    sys.stderr.write(agent.log.read_text()[-3000:])


@pytest.fixture
def relayed(tmp_path: Path) -> Iterator[Oriond]:
    """A relaying oriond whose sessions all go over TCP loopback to a GPU oriond on this host (docs/remote.md)."""
    gpu = Oriond(tmp_path / "gpu-host")
    relay = Oriond(tmp_path / "relay-host", relay_to=f"127.0.0.1:{gpu.listen_port}")
    yield relay
    for agent in (relay, gpu):
        agent.stop()
        sys.stderr.write(agent.log.read_text()[-3000:])
    assert "relayed to 127.0.0.1" in relay.log.read_text() and "relayed over tcp" in gpu.log.read_text()


@functools.cache
def _run_natively(program: str, extra: tuple[tuple[str, str], ...]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, program], cwd=REPO, env=_env(**dict(extra)), capture_output=True,
                          text=True, timeout=NATIVE_TIMEOUT_S)


def native(program: Path, **extra: str) -> dict[str, Any]:
    """The program's RESULT natively (this machine's GPU and driver, no Orion; `extra`: more environment), run once
    per test session for each environment and shared by every comparison with it. Skipped where the program
    needs a module this machine lacks, or is known to fail natively here (BROKEN_NATIVELY)."""
    name = program.name
    if name in NEEDS and importlib.util.find_spec(NEEDS[name]) is None:
        pytest.skip(f"{NEEDS[name]} is not installed here (the GPU machine has it)")
    done = _run_natively(str(program), tuple(sorted(extra.items())))
    known = BROKEN_NATIVELY.get(name)
    if done.returncode != 0 and known is not None and known[0] in done.stderr:
        pytest.skip(known[1])
    return _result(done, f"{name} native")


def _result(done: subprocess.CompletedProcess[str], what: str) -> dict[str, Any]:
    line = next((text for text in done.stdout.splitlines() if text.startswith("RESULT ")), None)
    assert done.returncode == 0 and line, f"{what} run failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    result: dict[str, Any] = json.loads(line[len("RESULT "):])
    return result


def run(program: Path | str, forwarded: Oriond | None, timeout: float = 300) -> dict[str, Any]:
    """A program file or source's RESULT, forwarded on the capsule path through `forwarded`, or natively (a file's
    native run is `native`'s, shared)."""
    if forwarded is None and isinstance(program, Path):
        return native(program)
    args = [str(program)] if isinstance(program, Path) else ["-c", program]
    if forwarded is not None:
        command = [sys.executable, "-c", FORWARD, *args] if isinstance(program, Path) else \
            [sys.executable, "-c", "import guest_runtime.activate as orion; orion.activate()\n" + program]
        # The client sees no GPU of its own: a result can only have come through oriond, never by accident
        # from the local driver (which is what a silently inactive hook would use on this machine).
        env = _env(ORION_SHM=str(forwarded.region), CUDA_VISIBLE_DEVICES="")
    else:
        command, env = [sys.executable, *args], _env()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    return _result(done, "forwarded" if forwarded else "native")


def served(request: pytest.FixtureRequest, path: str) -> Oriond:
    """The oriond a forwarded run on `path` uses: `local`, the `oriond` fixture (it serves the GPU itself), or
    `relayed`, the `relayed` fixture. Asked for after the native run, so that a test skipped there starts none
    (the relayed fixture's teardown wants a relayed session). Its module must import both fixtures."""
    agent: Oriond = request.getfixturevalue("oriond" if path == "local" else "relayed")
    return agent


def assert_same_results(name: str, native_result: dict[str, Any], forwarded: dict[str, Any]) -> None:
    """The native result is right (every ok flag true, and what NATIVE_SHOWS wants of the program), and `forwarded`
    holds the same values: exactly, or those CLOSE names to its tolerance, on every path (relayed sessions too:
    page-locked memory handed to a kernel reaches its mirror on the GPU host, docs/remote.md)."""
    assert all(v for k, v in native_result.items() if k == "ok" or k.endswith("_ok")), native_result
    assert NATIVE_SHOWS.get(name, lambda _r: True)(native_result), native_result
    tolerance, close = CLOSE.get(name, (0.0, ()))
    assert {k: v for k, v in forwarded.items() if k not in close} == \
        {k: v for k, v in native_result.items() if k not in close}, (forwarded, native_result)
    for key in close:
        want, got = native_result[key], forwarded[key]
        want, got = (want, got) if isinstance(want, list) else ([want], [got])
        assert isinstance(got, list) and len(got) == len(want) and all(
            math.isclose(g, w, rel_tol=tolerance) for g, w in zip(got, want, strict=True)), (key, got, want)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["driver_program.py", "core_program.py", "numba_program.py",
                                  "stream_order_program.py", "runtime_program.py", "pinned_threads_program.py"])
def test_program_gives_the_native_results_forwarded(name: str, path: str, request: pytest.FixtureRequest) -> None:
    """Each cuda-python program on the capsule path, its session served locally or relayed: the native values."""
    expected = native(PROGRAMS / name)
    assert_same_results(name, expected, run(PROGRAMS / name, served(request, path)))


QUOTA = textwrap.dedent("""
    import json
    from cuda.bindings import driver
    driver.cuInit(0)
    err, dev = driver.cuDeviceGet(0)
    err, ctx = driver.cuDevicePrimaryCtxRetain(dev); driver.cuCtxSetCurrent(ctx)
    out = {"total": driver.cuDeviceTotalMem(dev)[1], "info_total": driver.cuMemGetInfo()[2]}
    err, small = driver.cuMemAlloc(512 << 20); out["small"] = int(err)
    err, big = driver.cuMemAlloc(600 << 20); out["over"] = int(err)
    driver.cuMemFree(small)
    err, again = driver.cuMemAlloc(600 << 20); out["after_free"] = int(err)
    print("RESULT " + json.dumps(out))
""")


def test_quota_limits_allocations_and_is_what_the_device_reports(tmp_path: Path) -> None:
    agent = Oriond(tmp_path, "--gmem", "1024")
    try:
        result = run(QUOTA, agent)
    finally:
        agent.stop()
    assert result == {"total": 1 << 30, "info_total": 1 << 30, "small": 0, "over": 2, "after_free": 0}


OWNER = textwrap.dedent("""
    import sys, time
    from cuda.bindings import driver
    driver.cuInit(0); dev = driver.cuDeviceGet(0)[1]
    driver.cuCtxSetCurrent(driver.cuDevicePrimaryCtxRetain(dev)[1])
    err, ptr = driver.cuMemAlloc(1 << 20)
    driver.cuMemsetD8(ptr, 0x5A, 1 << 20)
    print("PTR", int(ptr), flush=True)
    time.sleep(120)
""")
THIEF = textwrap.dedent("""
    import json, sys, numpy as np
    from cuda.bindings import driver
    driver.cuInit(0); dev = driver.cuDeviceGet(0)[1]
    driver.cuCtxSetCurrent(driver.cuDevicePrimaryCtxRetain(dev)[1])
    out = np.zeros(4096, dtype=np.uint8)
    (err,) = driver.cuMemcpyDtoH(out.ctypes.data, int(sys.argv[-1]), out.nbytes)
    print("RESULT " + json.dumps({"err": int(err), "leaked": int(out.sum())}))
""")


def _native_free_mib() -> int:
    probe = ("from cuda.bindings import driver; driver.cuInit(0); d = driver.cuDeviceGet(0)[1]; "
             "driver.cuCtxSetCurrent(driver.cuDevicePrimaryCtxRetain(d)[1]); print(driver.cuMemGetInfo()[1] >> 20)")
    return int(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)


def test_another_sessions_pointer_gives_an_error_and_a_killed_clients_memory_comes_back(oriond: Oriond) -> None:
    baseline = _native_free_mib()
    owner = subprocess.Popen([sys.executable, "-c", "import guest_runtime.activate as o; o.activate()\n" + OWNER],
                             cwd=REPO, env=_env(ORION_SHM=str(oriond.region), CUDA_VISIBLE_DEVICES=""),
                             stdout=subprocess.PIPE, text=True)
    try:
        line = owner.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("PTR"), line
        pointer = line.split()[1]
        stolen = run(THIEF.replace("sys.argv[-1]", pointer), oriond)
        assert stolen == {"err": 1, "leaked": 0}  # CUDA_ERROR_INVALID_VALUE, and not one byte of the data
        assert _native_free_mib() < baseline  # the owner's session holds its memory (and a context)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    deadline = time.monotonic() + 20
    while _native_free_mib() < baseline - 64 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _native_free_mib() >= baseline - 64, "the killed client's GPU memory was not returned"


def test_the_kvm_guest_program_runs_its_kernel_forwarded(oriond: Oriond) -> None:
    """tests/guest/cuda_program.py is what the libvirt guest runs (demo, end-to-end test): on a GPU host its
    PTX kernel must run forwarded and give what it gives natively."""
    program = REPO / "tests" / "guest" / "cuda_program.py"
    lines = []
    for forwarded in (None, oriond):
        command = [sys.executable, "-c", FORWARD, str(program)] if forwarded else [sys.executable, str(program)]
        env = _env(ORION_SHM=str(oriond.region), CUDA_VISIBLE_DEVICES="") if forwarded else _env()
        result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
        lines.append(next(x for x in result.stdout.splitlines() if x.startswith("CUDA-PROGRAM")))
    native, forwarded_line = lines
    assert " kernel=ok " in native and native.startswith("CUDA-PROGRAM init=CUDA_SUCCESS(0) devices="), native
    assert forwarded_line.split(" devices=")[1].split()[1:] == native.split(" devices=")[1].split()[1:], lines
