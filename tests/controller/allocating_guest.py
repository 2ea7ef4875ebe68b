"""A guest process for the allocation tests: its first CUDA calls, through the real Forwarder, under the ORION_*
environment the test gives it. Prints one JSON line: ``cuInit``'s CUresult, the allocation id and host (or
null), and, when cuInit succeeded, the device count, each device's total memory, what cuMemAlloc answers for
one byte more than device 0's memory and for 1 MiB, and cuMemGetInfo after that; then, for each device, the
handle of its primary context, and with that context current, cuCtxGetDevice and cuMemGetInfo, and its PCI address
(domain, bus, device) and UUID. Then it waits
for a line on stdin (or EOF) and exits normally, so atexit runs.

``python tests/controller/allocating_guest.py [--native LIBCUDA]`` — run with ORION_CONTROLLER / ORION_VGPU /
ORION_GMEM set; with --native, through the native guest driver instead.
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from guest_runtime import allocation  # noqa: E402
from guest_runtime.activate import activate  # noqa: E402


def devices(fn: dict[str, Any]) -> dict[str, Any]:
    count, total, ctx, pointer = ctypes.c_int(), ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
    free = ctypes.c_uint64()
    assert fn["cuDeviceGetCount"](ctypes.addressof(count)) == 0
    totals = []
    for device in range(count.value):
        assert fn["cuDeviceTotalMem"](ctypes.addressof(total), device) == 0
        totals.append(total.value)
    assert fn["cuDevicePrimaryCtxRetain"](ctypes.addressof(ctx), 0) == 0
    assert fn["cuCtxSetCurrent"](ctx.value) == 0
    too_much = fn["cuMemAlloc"](ctypes.addressof(pointer), totals[0] + 1)
    one_mib = fn["cuMemAlloc"](ctypes.addressof(pointer), 1 << 20)
    assert fn["cuMemGetInfo"](ctypes.addressof(free), ctypes.addressof(total)) == 0
    seen = {"count": count.value, "total": totals, "alloc_too_much": too_much, "alloc_1mib": one_mib,
            "mem_info": [free.value, total.value]}
    contexts = []
    for device in range(count.value):
        named = ctypes.c_int(-1)
        assert fn["cuDevicePrimaryCtxRetain"](ctypes.addressof(ctx), device) == 0
        assert fn["cuCtxSetCurrent"](ctx.value) == 0
        assert fn["cuCtxGetDevice"](ctypes.addressof(named)) == 0
        assert fn["cuMemGetInfo"](ctypes.addressof(free), ctypes.addressof(total)) == 0
        contexts.append([ctx.value, named.value, free.value, total.value])
    addresses, uuids = [], []
    for device in range(count.value):
        values = []
        for attribute in (50, 33, 34):  # CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, _BUS_ID, _DEVICE_ID
            value = ctypes.c_int(-1)
            assert fn["cuDeviceGetAttribute"](ctypes.addressof(value), attribute, device) == 0
            values.append(value.value)
        addresses.append(values)
        uuid = ctypes.create_string_buffer(16)
        assert fn["cuDeviceGetUuid"](ctypes.addressof(uuid), device) == 0
        uuids.append(uuid.raw.hex())
    return {**seen, "contexts": contexts, "addresses": addresses, "uuids": uuids}


def native(library: str) -> dict[str, Any]:
    """The native guest driver's entry points, loaded as the start-up hook loads it (every argument a 64-bit
    word: addresses, handles, sizes and ordinals alike)."""
    from guest_runtime.startup import load_native
    load_native(library)
    lib = ctypes.CDLL(library)

    def words(function: Any) -> Any:
        return lambda *args: function(*(ctypes.c_uint64(a) for a in args))
    return {name: words(getattr(lib, name)) for name in ("cuInit", "cuDeviceGetCount", "cuDeviceTotalMem",
                                                          "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent", "cuMemAlloc",
                                                          "cuMemGetInfo", "cuCtxGetDevice", "cuDeviceGetAttribute",
                                                          "cuDeviceGetUuid", "cuMemAllocPitch")}


def helper_holds(fd: int) -> list[int]:
    """Pids of this process's children (the native driver's lease helper) that hold what `fd` is open on."""
    target = os.readlink(f"/proc/self/fd/{fd}")
    holders = []
    for pid in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split():
        try:
            held = {os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        if target in held:
            holders.append(int(pid))
    return holders


def main() -> int:
    native_run = sys.argv[1:2] == ["--native"]
    fn = native(sys.argv[2]) if native_run else activate().implementations()
    # A descriptor the program leaves inheritable (as C programs do by default): the lease helper the native
    # driver starts must not keep it open, or whoever waits for its end of file would wait for this process's.
    _, leaky = os.pipe()
    os.set_inheritable(leaky, True)
    result = fn["cuInit"](0)
    alloc = allocation.current()  # (on the native driver its lease helper holds it: None here)
    seen: dict[str, Any] = {"cuInit": result, "id": alloc.id if alloc else None, "host": alloc.host if alloc else None}
    if result == 0:
        seen.update(devices(fn))
    if native_run:
        seen["helper_holds_inherited_fd"] = helper_holds(leaky)
    print(json.dumps(seen), flush=True)
    sys.stdin.readline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
