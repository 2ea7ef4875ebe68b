"""A guest process for the grant-sharing tests (host_agent/session/grant_sharing.py), driven line by line.

``python tests/controller/sharing_guest.py [--native LIBCUDA]``, with the ORION_* environment the test gives it.
Each line on stdin is a command, answered by one JSON line on stdout:

- ``init``: cuInit's CUresult, the device count, device 0's compute mode and the ORION_GRANT this process holds
  (the C library's environment: the native driver sets it with setenv);
- ``retain D``: device D's primary context retained and made current: both CUresults, then cuCtxGetDevice and
  cuMemGetInfo (free, total), or nulls;
- ``alloc M``: cuMemAlloc of M MiB in the current context: its CUresult;
- ``pitch M E``: cuMemAllocPitch of M rows of 1 MiB with elements of E bytes in the current context: its CUresult
  (E other than 4, 8 or 16 is the driver's INVALID_VALUE, after the quota's check let the bytes through);
- ``spawn``: this script started as a child that inherits this process's environment as a program's children do,
  which runs ``init`` and ``retain 0`` and prints both; the answer is its two lines.

End of file ends it normally (atexit runs)."""
from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from guest_runtime.activate import activate  # noqa: E402
from tests.controller.allocating_guest import native  # noqa: E402

COMPUTE_MODE = 20
MIB = 1 << 20


def grant() -> str:
    """ORION_GRANT as the C library sees it (os.environ is a copy made at start)."""
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    value = libc.getenv(b"ORION_GRANT")
    return value.decode() if value else ""


def answer(fn: dict[str, Any], command: list[str]) -> Any:
    if command[0] == "init":
        result = fn["cuInit"](0)
        count, mode = ctypes.c_int(-1), ctypes.c_int(-1)
        if result == 0:
            fn["cuDeviceGetCount"](ctypes.addressof(count))
            fn["cuDeviceGetAttribute"](ctypes.addressof(mode), COMPUTE_MODE, 0)
        return {"cuInit": result, "count": count.value, "compute_mode": mode.value, "grant": grant()}
    if command[0] == "retain":
        ctx, device, free, total = ctypes.c_uint64(), ctypes.c_int(-1), ctypes.c_uint64(), ctypes.c_uint64()
        retained = fn["cuDevicePrimaryCtxRetain"](ctypes.addressof(ctx), int(command[1]))
        current = fn["cuCtxSetCurrent"](ctx.value) if retained == 0 else None
        if current != 0:
            return [retained, current, None, None]
        fn["cuCtxGetDevice"](ctypes.addressof(device))
        info = fn["cuMemGetInfo"](ctypes.addressof(free), ctypes.addressof(total))
        return [retained, current, device.value, [free.value, total.value] if info == 0 else info]
    if command[0] == "alloc":
        pointer = ctypes.c_uint64()
        return fn["cuMemAlloc"](ctypes.addressof(pointer), int(command[1]) << 20)
    if command[0] == "pitch":
        pointer, pitch = ctypes.c_uint64(), ctypes.c_uint64()
        return fn["cuMemAllocPitch"](ctypes.addressof(pointer), ctypes.addressof(pitch), MIB, int(command[1]),
                                     int(command[2]))
    if command[0] == "spawn":
        child = subprocess.run([sys.executable, *sys.orig_argv[1:]], input="init\nretain 0\n", capture_output=True,
                               text=True, timeout=60)  # the environment as the C library holds it: inherited
        return {"lines": [json.loads(line) for line in child.stdout.splitlines()], "stderr": child.stderr,
                "returncode": child.returncode}
    raise ValueError(f"unknown command {command}")


def main() -> int:
    fn = native(sys.argv[2]) if sys.argv[1:2] == ["--native"] else activate().implementations()
    for line in sys.stdin:
        print(json.dumps(answer(fn, line.split())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
