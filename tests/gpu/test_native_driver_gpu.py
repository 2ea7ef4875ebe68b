"""The generated native driver (`libcuda.so.1`, issue 13) on the GPU machine: a cuda-python program whose process
loads it (by absolute path, RTLD_GLOBAL, before importing cuda.bindings) runs its driver calls on the real GPU
through a real oriond, and never maps the real libcuda. Only the generic calls are forwarded natively so far."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from guest_runtime.native.build import build_driver, find_compiler
from tests.gpu.test_forwarded_programs import HAS_GPU, REPO, Oriond, oriond  # noqa: F401 (fixture)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU (device machine)")]

PROGRAM = r"""
import ctypes, json, os, sys
if len(sys.argv) > 1:
    ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)  # before cuda.bindings opens "libcuda.so.1"
from cuda.bindings import driver as cu
out = {}
out["init"] = int(cu.cuInit(0)[0])
err, count = cu.cuDeviceGetCount(); out["count"] = [int(err), count]
err, dev = cu.cuDeviceGet(0)
err, sms = cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)
out["sms"] = [int(err), sms]
err, ctx = cu.cuDevicePrimaryCtxRetain(dev); out["retain"] = int(err)
out["set_current"] = int(cu.cuCtxSetCurrent(ctx)[0])
err, ptr = cu.cuMemAlloc(1 << 20); out["alloc"] = int(err)
out["memset"] = int(cu.cuMemsetD32(ptr, 0x01020304, (1 << 20) // 4)[0])
out["sync"] = int(cu.cuCtxSynchronize()[0])
out["free"] = int(cu.cuMemFree(ptr)[0])
out["real_libcuda_mapped"] = any("libcuda" in l and (len(sys.argv) < 2 or sys.argv[1] not in l)
                                 for l in open("/proc/self/maps"))
print("RESULT " + json.dumps(out))
"""


def _run(*args: str, **env: str) -> dict[str, object]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORION_")}
    done = subprocess.run([sys.executable, "-c", PROGRAM, *args], capture_output=True, text=True, timeout=120,
                          env=base | env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])


def test_a_cuda_python_program_runs_through_the_native_driver(oriond: Oriond, tmp_path: Path) -> None:  # noqa: F811
    assert find_compiler() is not None, "the GPU machine has gcc"
    lib = build_driver(tmp_path / "libcuda.so.1")
    native = _run()
    forwarded = _run(str(lib), ORION_SHM=str(oriond.region), ORION_NATIVE="1", ORION_NATIVE_LIB=str(lib))
    assert native["real_libcuda_mapped"] is True and forwarded["real_libcuda_mapped"] is False
    for key in ("init", "count", "sms", "retain", "set_current", "alloc", "memset", "sync", "free"):
        assert forwarded[key] == native[key], (key, forwarded, native)
