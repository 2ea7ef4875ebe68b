#!/usr/bin/env python3
"""Per-call cost of a synchronous driver call three ways, in one run on the GPU machine: natively, forwarded
through the Python capsule path, and forwarded through the generated native libcuda.so.1 (issue 13). Prints
microseconds and the ratios to native.

Run: python3 bench/native_driver_bench.py   (from the repository root; needs gcc and a GPU)
The calls timed: cuCtxSynchronize (an empty stream: a pure round trip to the driver, forwarded by both paths) and
the hot queries the native library answers in the guest after the first time (docs/native-driver.md "Queries
answered in the guest"): cuDeviceGetAttribute, cuCtxGetDevice, cuDevicePrimaryCtxGetState, cuFuncGetAttribute (of
a kernel JIT-compiled from PTX), cuCtxSetCurrent of the current context, cuCtxGetFlags and cuDeviceTotalMem. The
capsule path forwards every one of them; its column is what each costs as a round trip.
The answers are checked (bench/verify.py): what the first and the last timed call of each answered (status and
values) forwarded must be what the native run's first call answered (an answer kept in the guest must stay right);
a ratio is printed only then, otherwise a WRONG RESULT line, and the exit status is 1.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.verify import Checks, first_wrong  # noqa: E402
from guest_runtime.native.build import build_driver, find_compiler  # noqa: E402

MEASURE = r"""
import ctypes, json, sys, time
if sys.argv[1] == "native-lib":
    ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL)
elif sys.argv[1] == "capsule":
    import guest_runtime.activate as orion; orion.activate()
from cuda.bindings import driver as cu
cu.cuInit(0)
err, dev = cu.cuDeviceGet(0)
err, ctx = cu.cuDevicePrimaryCtxRetain(dev)
cu.cuCtxSetCurrent(ctx)
attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
PTX = b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry noop()\n{\nret;\n}\n\0"
err, module = cu.cuModuleLoadData(PTX)
assert int(err) == 0, err
err, function = cu.cuModuleGetFunction(module, b"noop")
regs = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS
def answer(result):
    return [int(value) for value in (result if isinstance(result, tuple) else (result,))]
def timed(fn, n=20000):
    first = fn()
    for _ in range(999): fn()
    samples = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n): last = fn()
        samples.append((time.perf_counter() - t) / n * 1e6)
    return sorted(samples)[2], answer(first), answer(last)  # us, and the first and last call's answers
print("RESULT " + json.dumps({"sync": timed(cu.cuCtxSynchronize),
                              "attribute": timed(lambda: cu.cuDeviceGetAttribute(attr, dev)),
                              "ctx_device": timed(cu.cuCtxGetDevice),
                              "primary_state": timed(lambda: cu.cuDevicePrimaryCtxGetState(dev)),
                              "func_attribute": timed(lambda: cu.cuFuncGetAttribute(regs, function)),
                              "set_current": timed(lambda: cu.cuCtxSetCurrent(ctx)),
                              "ctx_flags": timed(cu.cuCtxGetFlags),
                              "total_mem": timed(lambda: cu.cuDeviceTotalMem(dev))}))
"""


CALLS = (("sync", "cuCtxSynchronize"), ("attribute", "cuDeviceGetAttribute"), ("ctx_device", "cuCtxGetDevice"),
         ("primary_state", "cuDevicePrimaryCtxGetState"), ("func_attribute", "cuFuncGetAttribute"),
         ("set_current", "cuCtxSetCurrent"), ("ctx_flags", "cuCtxGetFlags"), ("total_mem", "cuDeviceTotalMem"))


def run(kind: str, *args: str, **env: str) -> dict[str, tuple[float, list[int], list[int]]]:
    """Per call: its microseconds, and what its first and its last timed call answered (status and values)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")} | env
    environ["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", MEASURE, kind, *args], capture_output=True, text=True,
                          timeout=600, env=environ, cwd=REPO, check=True)
    return {key: (us, first, last) for key, (us, first, last) in
            json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:]).items()}


def main() -> int:
    compiler = find_compiler()
    if compiler is None:
        print("native_driver_bench: no C compiler (install gcc)", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="orion-native-bench-"))
    shm = Path(tempfile.mkdtemp(prefix="orion-native-bench-", dir="/dev/shm"))
    lib = build_driver(work / "libcuda.so.1")
    region = shm / "orionsock7"
    with open(region, "wb") as f:
        f.truncate(256 << 20)
    conf = work / "server.conf"
    conf.write_text(f'[server]\n    vgpu_count = 1\n[server-shm]\n    shm_path_base = "{shm}/"\n')
    log = work / "oriond.log"
    with open(log, "wb") as out:
        oriond = subprocess.Popen([sys.executable, "-m", "host_agent.daemon.oriond", "--config", str(conf),
                                   "--pid-file",
                                   str(shm / "oriond.pid")], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 30
        while b"Using SHM orionsock7" not in log.read_bytes():
            if oriond.poll() is not None or time.monotonic() > deadline:
                print(log.read_text(), file=sys.stderr)
                return 1
            time.sleep(0.1)
        native = run("native")
        capsule = run("capsule", ORION_SHM=str(region), ORION_NATIVE="0")
        # ORION_NATIVE=1 and the library's path: the start-up hook loads the build under measurement (not the
        # checkout's, nor the capsule path) before the measurement loads it again (guest_runtime/startup.py)
        library = run("native-lib", str(lib), ORION_SHM=str(region), ORION_NATIVE="1", ORION_NATIVE_LIB=str(lib))
    finally:
        oriond.terminate()
        oriond.wait(30)
    print(f"# native driver benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs; median of 5 x 20000")
    print(f"{'call':26} {'native us':>10} {'capsule us':>11} {'native lib us':>14} {'capsule/nat':>12} {'lib/nat':>8}")
    checks = Checks()
    for key, name in CALLS:
        n, c, lb = native[key][0], capsule[key][0], library[key][0]
        expected = native[key][1]
        ratios = [checks.ratio(f"{name}, {path}", run[key][0], n, expected, first_wrong(run[key][1:], expected))
                  for path, run in (("capsule path", capsule), ("native library", library))]
        print(f"{name:26} {n:10.2f} {c:11.2f} {lb:14.2f} {ratios[0]:>12} {ratios[1]:>8}")
    return checks.exit_status()


if __name__ == "__main__":
    raise SystemExit(main())
