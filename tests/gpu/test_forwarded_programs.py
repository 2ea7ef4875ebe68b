"""Unmodified CUDA Python programs, run natively and forwarded through a real oriond, give the same results.

GPU machine only (the device machine); skipped elsewhere. The forwarded run is the same program file,
started with forwarding activated; oriond runs as its own process serving a fresh region.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.controller.rig import free_port
from tests.processes import stop_process

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).parent / "programs"
HAS_GPU = os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU (device machine)")]
FORWARD = ("import sys, runpy, guest_runtime.activate as orion; orion.activate(); "
           "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


class Oriond:
    def __init__(self, workdir: Path, *flags: str, listen_port: int = 0, relay_to: str = "") -> None:
        """Serves a 256 MiB region in a fresh directory of /dev/shm (tmpfs: its pages can be page-locked, as the
        pinned pool needs; a disk-backed file's may not be). `listen_port`: where it takes relayed sessions (0: a
        free one); `relay_to`: relay every session to that HOST:PORT (docs/remote.md)."""
        self.shm_dir = Path(tempfile.mkdtemp(prefix="orion-gpu-test-", dir="/dev/shm"))
        self.region = self.shm_dir / "orionsock7"
        with open(self.region, "wb") as f:
            f.truncate(256 << 20)
        self.listen_port = listen_port or free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        conf = workdir / "server.conf"
        conf.write_text(f'[server]\n    vgpu_count = 1\n    listen_port = {self.listen_port}\n'
                        f'[server-shm]\n    shm_path_base = "{self.shm_dir}/"\n'
                        + (f"[server-relay]\n    remote_addr = {relay_to}\n" if relay_to else ""))
        self.log = workdir / "oriond.log"
        with open(self.log, "wb") as log:
            command = [sys.executable, "-m", "host_agent.oriond", "--config", str(conf),
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


def run(program: Path | str, forwarded: Oriond | None, timeout: float = 300) -> dict:
    args = [str(program)] if isinstance(program, Path) else ["-c", program]
    if forwarded is not None:
        command = [sys.executable, "-c", FORWARD, *args] if isinstance(program, Path) else \
            [sys.executable, "-c", "import guest_runtime.activate as orion; orion.activate()\n" + program]
        # The client sees no GPU of its own: a result can only have come through oriond, never by accident
        # from the local driver (which is what a silently inactive hook would use on this machine).
        env = _env(ORION_SHM=str(forwarded.region), CUDA_VISIBLE_DEVICES="")
    else:
        command, env = [sys.executable, *args], _env()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    line = next((text for text in result.stdout.splitlines() if text.startswith("RESULT ")), None)
    assert result.returncode == 0 and line, f"{'forwarded' if forwarded else 'native'} run failed:\n" \
                                            f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize("name", ["driver_program.py", "core_program.py", "numba_program.py",
                                  "stream_order_program.py", "runtime_program.py", "pinned_threads_program.py"])
def test_program_gives_the_same_results_forwarded(name: str, oriond: Oriond) -> None:
    native = run(PROGRAMS / name, None)
    forwarded = run(PROGRAMS / name, oriond)
    assert forwarded == native
    assert all(v for k, v in native.items() if k.endswith("_ok") or k == "ok"), native
    if name == "stream_order_program.py":
        assert native == {"dtoh_after_kernel": 42, "htod_after_kernel": 99}
    if name == "pinned_threads_program.py":  # a thread starts with no context, as natively
        assert (native["thread_current"], native["thread_alloc_without_context"]) == (0, 201)
        assert native["device_pointer_is_host_pointer"] and native["free_twice"]


@pytest.mark.parametrize("name", ["driver_program.py", "core_program.py", "stream_order_program.py",
                                  "runtime_program.py"])
def test_program_gives_the_same_results_relayed(name: str, relayed: Oriond) -> None:
    """The same programs, their sessions relayed to another oriond over TCP (the GPU host's)."""
    assert run(PROGRAMS / name, relayed) == run(PROGRAMS / name, None)


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
