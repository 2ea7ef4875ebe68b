#!/usr/bin/env python3
"""CUDA forwarding benchmark: the same cuda.bindings measurements natively and forwarded, as ratios.

Runs itself three times as a child process: plain, forwarded through the Python capsule path, and forwarded
through the native guest driver (libcuda.so.1, built here), both against an oriond it starts on a fresh region;
prints each forwarded/native ratio for: launch+sync round trip, async launch issue cost,
4-byte copies, pageable and page-locked (cuMemAllocHost: in the forwarded run, the region's pool) bulk copies
(1-256 MiB) both ways, and a small end-to-end workload. GPU machine only.

Run: python3 bench/cuda_bench.py   (from the repository root)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EMPTY = rb'extern "C" __global__ void empty() {}'
SCALE = rb"""extern "C" __global__ void scale(float *d, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) d[i] = d[i] * 1.0001f + 1.0f; }"""
MIB = 1 << 20


def measure() -> dict:
    import numpy as np
    from cuda.bindings import driver, nvrtc

    def ok(result):
        assert int(result[0]) == 0, result
        return result[1] if len(result) == 2 else result[1:]

    def cubin(source: bytes, arch: str) -> bytes:
        prog = ok(nvrtc.nvrtcCreateProgram(source, b"k.cu", 0, [], []))
        opts = [f"--gpu-architecture=sm_{arch}".encode()]
        assert int(nvrtc.nvrtcCompileProgram(prog, 1, opts)[0]) == 0
        data = b" " * ok(nvrtc.nvrtcGetCUBINSize(prog))
        nvrtc.nvrtcGetCUBIN(prog, data)
        return data

    ok((*driver.cuInit(0), None))
    dev = ok(driver.cuDeviceGet(0))
    ok((*driver.cuCtxSetCurrent(ok(driver.cuDevicePrimaryCtxRetain(dev))), None))
    attr = driver.CUdevice_attribute
    major = ok(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = ok(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    arch = f"{major}{minor}"
    empty = ok(driver.cuModuleGetFunction(ok(driver.cuModuleLoadData(cubin(EMPTY, arch))), b"empty"))
    scale = ok(driver.cuModuleGetFunction(ok(driver.cuModuleLoadData(cubin(SCALE, arch))), b"scale"))
    stream = ok(driver.cuStreamCreate(0))
    out: dict[str, float] = {}

    def per_op(fn, n: int, repeats: int = 3) -> float:
        fn()
        best = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            best.append((time.perf_counter() - start) / n)
        return sorted(best)[len(best) // 2] * 1e6

    def launch_sync():
        driver.cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, stream, 0, 0)
        driver.cuStreamSynchronize(stream)
    out["launch+sync us"] = per_op(launch_sync, 2000)

    def launches():
        for _ in range(1000):
            driver.cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, stream, 0, 0)
        driver.cuStreamSynchronize(stream)
    out["async launch us"] = per_op(launches, 3) / 1000

    small = np.zeros(1, dtype=np.float32)
    d_small = ok(driver.cuMemAlloc(4))
    out["4-byte HtoD us"] = per_op(lambda: driver.cuMemcpyHtoD(d_small, small.ctypes.data, 4), 2000)
    out["4-byte DtoH us"] = per_op(lambda: driver.cuMemcpyDtoH(small.ctypes.data, d_small, 4), 2000)

    for size_mib in (1, 16, 64, 256):
        size = size_mib * MIB
        host = np.ones(size // 4, dtype=np.float32)
        dptr = ok(driver.cuMemAlloc(size))
        n = max(2, 512 // size_mib)
        address = host.ctypes.data
        htod = lambda d=dptr, h=address, s=size: driver.cuMemcpyHtoD(d, h, s)  # noqa: E731
        dtoh = lambda d=dptr, h=address, s=size: driver.cuMemcpyDtoH(h, d, s)  # noqa: E731
        out[f"HtoD {size_mib} MiB GB/s"] = size / per_op(htod, n) / 1e3
        out[f"DtoH {size_mib} MiB GB/s"] = size / per_op(dtoh, n) / 1e3
        pinned = ok(driver.cuMemAllocHost(size))
        htod = lambda d=dptr, h=pinned, s=size: driver.cuMemcpyHtoD(d, h, s)  # noqa: E731
        dtoh = lambda d=dptr, h=pinned, s=size: driver.cuMemcpyDtoH(h, d, s)  # noqa: E731
        out[f"pinned HtoD {size_mib} MiB GB/s"] = size / per_op(htod, n) / 1e3
        out[f"pinned DtoH {size_mib} MiB GB/s"] = size / per_op(dtoh, n) / 1e3
        driver.cuMemFreeHost(pinned)
        driver.cuMemFree(dptr)

    n = 1 << 20  # workload: copy in, 20 kernels, copy out, 30 times
    data = np.ones(n, dtype=np.float32)
    d_data = ok(driver.cuMemAlloc(data.nbytes))
    count = np.array([n], dtype=np.uint32)
    pointer = np.array([int(d_data)], dtype=np.uint64)
    params = np.array([pointer.ctypes.data, count.ctypes.data], dtype=np.uint64)

    def workload():
        driver.cuMemcpyHtoD(d_data, data.ctypes.data, data.nbytes)
        for _ in range(20):
            driver.cuLaunchKernel(scale, n // 256, 1, 1, 256, 1, 1, 0, stream, params.ctypes.data, 0)
        driver.cuMemcpyDtoHAsync(data.ctypes.data, d_data, data.nbytes, stream)
        driver.cuStreamSynchronize(stream)
    out["workload ms"] = per_op(workload, 30) / 1e3
    return out


# How each run reaches the GPU: the real driver, the Python capsule path, or the native guest driver loaded as
# its libcuda (as guest_runtime/startup.py loads it: the path is argv[1] of the child).
PRELUDES = {
    "native": "",
    "capsule": "import guest_runtime.activate as orion; orion.activate()\n",
    "native-lib": "import sys; from guest_runtime.startup import load_native; load_native(sys.argv[1])\n",
}


def child(mode: str, region: str | None, library: str = "") -> dict:
    code = PRELUDES[mode] + "import json, bench.cuda_bench as b; print('RESULT ' + json.dumps(b.measure()))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
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
    return json.loads(line[7:])


def main() -> int:
    sys.path.insert(0, str(REPO))
    from guest_runtime.native.build import build_driver
    from host_agent.shm_admin import create

    with tempfile.TemporaryDirectory(dir="/dev/shm") as work:  # tmpfs: the pool's pages can be page-locked
        library = str(build_driver(Path(work) / "native" / "libcuda.so.1"))
        region = create(0, 2048, work, channels=2).path  # a 256 MiB page-locked buffer fits a channel's slice
        conf = os.path.join(work, "server.conf")
        Path(conf).write_text(f'[server]\n    vgpu_count = 1\n[server-shm]\n    shm_path_base = "{work}/"\n')
        command = [sys.executable, "-m", "host_agent.oriond", "--config", conf,
                   "--pid-file", os.path.join(work, "oriond.pid")]
        agent = subprocess.Popen(command, cwd=REPO,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(2)
            native = child("native", None)
            capsule = child("capsule", region)
            native_lib = child("native-lib", region, library)
        finally:
            agent.send_signal(signal.SIGINT)
            agent.wait(20)
    print(f"# CUDA forwarding benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs")
    print(f"{'measure':<26} {'native':>10} {'capsule':>10} {'native-lib':>10} {'capsule/n':>10} {'nlib/n':>10}")
    for key, value in native.items():
        print(f"{key:<26} {value:10.2f} {capsule[key]:10.2f} {native_lib[key]:10.2f} {capsule[key] / value:10.2f} "
              f"{native_lib[key] / value:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
