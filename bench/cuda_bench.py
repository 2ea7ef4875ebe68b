#!/usr/bin/env python3
"""CUDA forwarding benchmark: the same cuda.bindings measurements natively and forwarded, as ratios.

Runs itself three times as a child process: plain, forwarded through the Python capsule path, and forwarded
through the native guest driver (libcuda.so.1, built here), both against an oriond it starts on a fresh region;
prints each forwarded/native ratio for: launch+sync round trip, async launch issue cost, 4-byte and bulk (1-256 MiB)
copies both ways, each from pageable and from page-locked memory (cuMemAllocHost: in the forwarded run, the
region's pool), and a small end-to-end workload. GPU machine only.

Every call's status is checked (a failed row prints its status, never a speed), and so is every result
(bench/verify.py): each copy row's bytes, read back after the timed copies, must be its source's (native) and the
native run's (forwarded); the workload's data after its last run must be the native run's, bit for bit. A ratio
is printed only for a right result; otherwise a WRONG RESULT line, and the exit status is 1. The launch rows run
an empty kernel: no data.

Run: python3 bench/cuda_bench.py [--stats]   (from the repository root; --stats: then the launch+sync row once more
under ORION_STATS, and where its time went: in the program, on the agent, in the driver)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.verify import Checks  # noqa: E402

EMPTY = rb'extern "C" __global__ void empty() {}'
SCALE = rb"""extern "C" __global__ void scale(float *d, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) d[i] = d[i] * 1.0001f + 1.0f; }"""
MIB = 1 << 20


SIZES_MIB = (1, 16, 64, 256)
SMALL = bytes.fromhex("04030201")  # what the 4-byte copies write and read back


class Refused(Exception):
    """A call of the row answered a status other than CUDA_SUCCESS."""


def measure(sizes_mib: tuple[int, ...] = SIZES_MIB, launch_sync_only: bool = False) -> dict[str, dict[str, Any]]:
    """The rows (bulk copies at `sizes_mib`), each call's status checked, and what each row that moves data
    delivered: {"rows": {measure: us, GB/s or ms, or the failed status as a string}, "results": {measure: [the
    digest of what it must deliver (None: only the native run can tell), the digest of what it delivered]}}.

    A copy row's source is its own pattern (bench/verify.py; one per size and kind of host memory, never zeros),
    the device memory is cleared before its writes and the host buffer before its reads, so its result, the host
    buffer after the timed reads, holds the timed writes' bytes brought back; the two rows of a copy share it. The
    workload's result is its data after the last run (a deterministic kernel: the same bits as native). The launch
    rows run an empty kernel: no data, nothing to check."""
    import ctypes

    import numpy as np
    from cuda.bindings import driver, nvrtc

    from bench.verify import digest, pattern

    def ok(result: tuple) -> Any:  # type: ignore[type-arg]
        if int(result[0]) != 0:
            raise Refused(f"refused ({int(result[0])})")
        return result[1] if len(result) == 2 else result[1:] if len(result) > 2 else None

    def cubin(source: bytes, arch: str) -> bytes:
        prog = ok(nvrtc.nvrtcCreateProgram(source, b"k.cu", 0, [], []))
        ok(nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture=sm_{arch}".encode()]))
        data = b" " * ok(nvrtc.nvrtcGetCUBINSize(prog))
        ok(nvrtc.nvrtcGetCUBIN(prog, data))
        return data

    ok(driver.cuInit(0))
    dev = ok(driver.cuDeviceGet(0))
    ok(driver.cuCtxSetCurrent(ok(driver.cuDevicePrimaryCtxRetain(dev))))
    attr = driver.CUdevice_attribute
    arch = "".join(str(ok(driver.cuDeviceGetAttribute(a, dev))) for a in (
        attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
    empty = ok(driver.cuModuleGetFunction(ok(driver.cuModuleLoadData(cubin(EMPTY, arch))), b"empty"))
    scale = ok(driver.cuModuleGetFunction(ok(driver.cuModuleLoadData(cubin(SCALE, arch))), b"scale"))
    stream = ok(driver.cuStreamCreate(0))
    out: dict[str, float | str] = {}
    results: dict[str, list[str | None]] = {}

    def row(key: str, fn: Callable[[], object], n: int, per: float = 1.0, bytes_: int = 0) -> bool:
        """The median of 3 timings of n calls of fn after one (us per call / per, or GB/s with bytes_), or the
        failed status; whether it ran."""
        try:
            fn()
            times = []
            for _ in range(3):
                start = time.perf_counter()
                for _ in range(n):
                    fn()
                times.append((time.perf_counter() - start) / n)
            seconds = sorted(times)[1]
            out[key] = bytes_ / seconds / 1e9 if bytes_ else seconds * 1e6 / per
            return True
        except Refused as exc:
            out[key] = str(exc)
            return False

    row("launch+sync us", lambda: (ok(driver.cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, stream, 0, 0)),
                                   ok(driver.cuStreamSynchronize(stream))), 2000)
    if launch_sync_only:  # --stats: the one row whose calls the table is to split
        return {"rows": out, "results": results}

    def launches() -> None:
        for _ in range(1000):
            ok(driver.cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, stream, 0, 0))
        ok(driver.cuStreamSynchronize(stream))
    row("async launch us", launches, 3, per=1000)

    def copies(kind: str, what: str, source: bytes, dptr: int, n: int) -> None:
        """The write row and the read row of `source` between host memory of `kind` ("" pageable, "pinned "
        cuMemAllocHost's) and `dptr` (GB/s, or us per call for a small copy), and their result."""
        size = len(source)
        keys = (f"{kind}{what.format('HtoD')}", f"{kind}{what.format('DtoH')}")
        if not kind:
            host = np.empty(size, dtype=np.uint8)
            timed_copies(keys, source, host, host.ctypes.data, dptr, n)
            return
        try:
            address = int(ok(driver.cuMemAllocHost(size)))
        except Refused as exc:
            out[keys[0]] = out[keys[1]] = str(exc)
            return
        host = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(address))
        timed_copies(keys, source, host, address, dptr, n)
        del host  # (a view of the page-locked buffer, freed next)
        ok(driver.cuMemFreeHost(address))

    def timed_copies(keys: tuple[str, str], source: bytes, host: Any, address: int, dptr: int, n: int) -> None:
        size = len(source)
        rate = size if size >= MIB else 0
        host[:] = np.frombuffer(source, dtype=np.uint8)
        try:
            ok(driver.cuMemsetD8(dptr, 0, size))  # no earlier bytes there can pass for this copy's
        except Refused as exc:
            out[keys[0]] = out[keys[1]] = f"cuMemsetD8 {exc}"
            return
        wrote = row(keys[0], lambda: ok(driver.cuMemcpyHtoD(dptr, address, size)), n, bytes_=rate)
        host[:] = 0  # the reads must write every byte
        read = row(keys[1], lambda: ok(driver.cuMemcpyDtoH(address, dptr, size)), n, bytes_=rate)
        if wrote and read:
            results[keys[0]] = results[keys[1]] = [digest(source), digest(host)]

    d_small = ok(driver.cuMemAlloc(4))
    for kind in ("", "pinned "):  # a small page-locked copy too: relayed, one once read zeros (issue 26)
        copies(kind, "4-byte {} us", SMALL, int(d_small), 2000)
    for size_mib in sizes_mib:
        size = size_mib * MIB
        dptr = ok(driver.cuMemAlloc(size))
        for index, kind in enumerate(("", "pinned ")):  # each size and kind its own bytes
            copies(kind, f"{{}} {size_mib} MiB GB/s", pattern(size, seed=2 * size_mib + index), int(dptr),
                   max(2, 512 // size_mib))
        ok(driver.cuMemFree(dptr))

    n = 1 << 20  # workload: copy in, 20 kernels, copy out, 30 times (the data not uniform: misplaced bytes show)
    data = (np.arange(n, dtype=np.float32) / n + 1).astype(np.float32)
    d_data = ok(driver.cuMemAlloc(data.nbytes))
    count = np.array([n], dtype=np.uint32)
    pointer = np.array([int(d_data)], dtype=np.uint64)
    params = np.array([pointer.ctypes.data, count.ctypes.data], dtype=np.uint64)

    def workload() -> None:
        ok(driver.cuMemcpyHtoD(d_data, data.ctypes.data, data.nbytes))
        for _ in range(20):
            ok(driver.cuLaunchKernel(scale, n // 256, 1, 1, 256, 1, 1, 0, stream, params.ctypes.data, 0))
        ok(driver.cuMemcpyDtoHAsync(data.ctypes.data, d_data, data.nbytes, stream))
        ok(driver.cuStreamSynchronize(stream))
    if row("workload ms", workload, 30, per=1000):
        results["workload ms"] = [None, digest(data)]
    return {"rows": out, "results": results}


# How each run reaches the GPU: the real driver, the Python capsule path, or the native guest driver loaded as
# its libcuda (as guest_runtime/startup.py loads it: the path is argv[1] of the child).
PRELUDES = {
    "native": "",
    "capsule": "import guest_runtime.activate as orion; orion.activate()\n",
    "native-lib": "import sys; from guest_runtime.startup import load_native; load_native(sys.argv[1])\n",
}


def child(mode: str, region: str | None, library: str = "", sizes_mib: tuple[int, ...] = SIZES_MIB,
          stats: str | None = None) -> dict[str, Any]:
    """measure() in a child process, on the machine's driver (region None) or forwarded through `region`, on the
    capsule path or (`library`) the native guest driver; with `stats`, only its launch+sync row, its ORION_STATS
    table written there."""
    code = PRELUDES[mode] + ("import json, bench.cuda_bench as b; "
                             f"print('RESULT ' + json.dumps(b.measure({tuple(sizes_mib)!r}, {stats is not None})))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    if stats is not None:
        env["ORION_STATS"] = stats
    if region:
        env["ORION_SHM"] = region
        env["CUDA_VISIBLE_DEVICES"] = ""  # a forwarded run has no GPU of its own
        # the path under measurement, whatever the start-up hook would choose by itself
        env |= {"ORION_NATIVE": "1", "ORION_NATIVE_LIB": library} if library else {"ORION_NATIVE": "0"}
    result = subprocess.run([sys.executable, "-c", code, library], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=900)
    line = next((x for x in result.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{mode} run failed:\n{result.stderr[-4000:]}")
    return dict(json.loads(line[7:]))


def right_results(checks: Checks, key: str, runs: dict[str, dict[str, Any]]) -> dict[str, bool]:
    """Per run (measure()'s output, by column name, "native" first), whether its result of row `key` is right:
    the native run's must be what the row must deliver where that is known, the others' the native run's. A
    row that moves no data is right everywhere."""
    native = runs["native"]["results"].get(key)
    if native is None:
        return {name: True for name in runs}
    want, native_got = native
    right = {"native": want is None or checks.same(f"{key}, native run", want, native_got, "its source")}
    for name, run in runs.items():
        if name != "native":
            got = run["results"].get(key, [None, None])[1]
            right[name] = checks.same(f"{key}, {name}", native_got, got, "native") and right["native"]
    return right


def launch_sync_breakdown(table: str, pair_us: float) -> None:
    """Where a forwarded launch+sync pair's time went, from the native-lib run's ORION_STATS table: the program's
    two calls, the agent's compiled time for their records and the driver's part of it."""
    cells = {}
    for line in table.splitlines():
        name = line.split(" ", 1)[0]
        if name in ("cuLaunchKernel", "cuStreamSynchronize") and "|" in line:
            left, right = line.split("|")
            cells[name] = left.split()[1:] + right.split()
    if len(cells) != 2 or any(cells[name][7] == "-" for name in cells):
        print(f"launch+sync breakdown: the table has no timed compiled rows for both calls:\n{table}")
        return
    launch, sync = (cells[name] for name in ("cuLaunchKernel", "cuStreamSynchronize"))
    program = float(launch[5]) + float(sync[5])  # mean us in the program (its launch posted, its sync waited)
    agent = float(launch[7]) + float(sync[7])  # the compiled path's mean us for their records
    driver = float(launch[8]) + float(sync[8])  # of which in the driver's functions
    print(f"\n# launch+sync, native-lib under ORION_STATS ({pair_us:.2f} us a pair in that run), mean us a pair:")
    print(f"{'':<26} {'launch':>10} {'sync':>10} {'pair':>10}")
    print(f"{'in the program':<26} {float(launch[5]):10.2f} {float(sync[5]):10.2f} {program:10.2f}")
    print(f"{'on the agent (compiled)':<26} {float(launch[7]):10.2f} {float(sync[7]):10.2f} {agent:10.2f}")
    print(f"{'  of which in the driver':<26} {float(launch[8]):10.2f} {float(sync[8]):10.2f} {driver:10.2f}")
    print(f"the agent outside the driver (checks, the GIL, the reply): {agent - driver:.2f} us; outside the agent "
          f"(the launch's post, the wire both ways, the agent seeing each record): {program - agent:.2f} us")


def main() -> int:
    from guest_runtime.native.build import build_driver
    from host_agent.shm_admin import create

    with tempfile.TemporaryDirectory(dir="/dev/shm") as work:  # tmpfs: the pool's pages can be page-locked
        library = str(build_driver(Path(work) / "native" / "libcuda.so.1"))
        region = create(0, 2048, work, channels=2).path  # a 256 MiB page-locked buffer fits a channel's slice
        conf = os.path.join(work, "server.conf")
        Path(conf).write_text(f'[server]\n    vgpu_count = 1\n[server-shm]\n    shm_path_base = "{work}/"\n')
        command = [sys.executable, "-m", "host_agent.daemon.oriond", "--config", conf,
                   "--pid-file", os.path.join(work, "oriond.pid")]
        agent = subprocess.Popen(command, cwd=REPO,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(2)
            native = child("native", None)
            capsule = child("capsule", region)
            native_lib = child("native-lib", region, library)
            breakdown: tuple[str, float] | None = None
            if "--stats" in sys.argv[1:]:
                table = Path(work) / "stats.txt"
                pair = child("native-lib", region, library, stats=str(table))["rows"]["launch+sync us"]
                breakdown = (table.read_text(), pair)
        finally:
            agent.send_signal(signal.SIGINT)
            agent.wait(20)
    print(f"# CUDA forwarding benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs")
    print(f"{'measure':<26} {'native':>10} {'capsule':>10} {'native-lib':>10} {'capsule/n':>10} {'nlib/n':>10}")
    checks = Checks()
    runs = {"native": native, "capsule": capsule, "native-lib": native_lib}
    for key, value in native["rows"].items():
        cells = [run["rows"][key] for run in runs.values()]
        if any(isinstance(cell, str) for cell in cells):
            print(f"{key:<26} " + " ".join(f"{cell!s:>10}" for cell in cells) + "  (a failed status: no speed)")
            continue
        right = right_results(checks, key, runs)
        ratios = " ".join(f"{cell / value:10.2f}" if right[name] else f"{'WRONG':>10}"
                          for name, cell in zip(runs, cells, strict=True) if name != "native")
        print(f"{key:<26} " + " ".join(f"{cell:10.2f}" for cell in cells) + f" {ratios}")
    if breakdown is not None:
        launch_sync_breakdown(*breakdown)
    return checks.exit_status()


if __name__ == "__main__":
    sys.exit(main())
