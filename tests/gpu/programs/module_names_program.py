"""An ordinary cuda.bindings program (nothing Orion in it): what a module and a library say about their kernels, and
how a device names itself. A hand-written PTX image with three kernels is loaded as a module (cuModuleLoadData) and as
a library (cuLibraryLoadData); their counts (cuModuleGetFunctionCount, cuLibraryGetKernelCount), the names of the
handles they enumerate (cuModuleEnumerateFunctions + cuFuncGetName, cuLibraryEnumerateKernels + cuKernelGetName),
sorted and in the order enumerated, and whether each enumerated handle is the one cuModuleGetFunction /
cuLibraryGetKernel then gives for its name are reported, with the result codes and the number of handles written when
asked for 0, 1 and count + 2 of them, and the result codes of the name calls for a NULL handle. Then device 0: its bus
id (cuDeviceGetPCIBusId) and whether cuDeviceGetByPCIBusId maps it back to ordinal 0, as given, upper-cased and in the
short form without the domain ("bus:device.function"), each as [result code, ordinal]; cuDeviceGetLuid's result code
(and its node mask where it succeeds); CUDA 13's atomic capabilities to the host for every CUatomicOperation but
CU_ATOMIC_OPERATION_MAX (one call, [result code, capability ints]), the result codes for MAX alone and for a count of
0, and the peer capabilities for the pair (0, 0) ([result code, capability ints or None]). Prints one JSON line of
results (`RESULT {...}`) that a native run and a forwarded run must agree on: values, never handles or addresses.

    python module_names_program.py          the installed cuda.bindings (a GPU, or Orion's native driver)
    python module_names_program.py --fake   the same logic over tests/fake_driver.FakeDriver, in this process

Without a CUDA driver it exits with a one-line message (status 1), not a traceback.
"""
import json
import os
import sys

KERNELS = [b"names_first", b"names_second", b"names_third"]
# Three kernels with different parameter lists, for sm_90 (the driver compiles it; the fake parses it).
PTX = b"""\
.version 8.0
.target sm_90
.address_size 64
.visible .entry names_first(.param .u64 names_first_0)
{
ret;
}
.visible .entry names_second(.param .u32 names_second_0, .param .f64 names_second_1)
{
ret;
}
.visible .entry names_third()
{
ret;
}
"""


def check(result):
    err, *rest = result
    if int(err) != 0:
        raise SystemExit(f"CUDA error {err!r}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def names_of(driver, count, enumerate_, get_name, by_name, owner):
    """Enumerate `count` handles of `owner`: their names in the order enumerated, and whether each is the handle the
    by-name call gives for its name."""
    handles = check(enumerate_(count, owner))
    names = [bytes(check(get_name(handle))) for handle in handles]
    same = [int(check(by_name(owner, name))) == int(handle) for name, handle in zip(names, handles, strict=True)]
    return [name.decode() for name in names], same


def probes(enumerate_, count, owner):
    """For asking for 0, 1 and count + 2 handles: [result code, how many non-NULL handles came back (None on
    failure)]."""
    out: dict[str, list[int | None]] = {}
    for key, asked in (("0", 0), ("1", 1), ("count+2", count + 2)):
        err, handles = enumerate_(asked, owner)
        out[key] = [int(err), None if handles is None else sum(1 for handle in handles if int(handle))]
    return out


def short_bus_id(bus_id):
    """"domain:bus:device.function" without its domain."""
    return bus_id.split(":", 1)[1] if bus_id.count(":") == 2 else bus_id


def by_bus_id(driver, text):
    err, device = driver.cuDeviceGetByPCIBusId(text.encode())
    return [int(err), None if int(err) else int(device)]


def run(driver):
    out: dict[str, object] = {}
    check(driver.cuInit(0))
    dev = check(driver.cuDeviceGet(0))
    ctx = check(driver.cuDevicePrimaryCtxRetain(dev))
    check(driver.cuCtxSetCurrent(ctx))
    expected = sorted(name.decode() for name in KERNELS)

    # (a) a module: its count, its functions enumerated and named, each the handle its name gives
    module = check(driver.cuModuleLoadData(PTX + b"\0"))
    count = int(check(driver.cuModuleGetFunctionCount(module)))
    out["function_count"] = count
    names, same = names_of(driver, count, driver.cuModuleEnumerateFunctions, driver.cuFuncGetName,
                           driver.cuModuleGetFunction, module)
    out["function_names"], out["function_names_in_order"], out["functions_match"] = sorted(names), names, same
    out["enumerate_functions"] = probes(driver.cuModuleEnumerateFunctions, count, module)

    # (b) a library: the same for its kernels
    library = check(driver.cuLibraryLoadData(PTX + b"\0", [], [], 0, [], [], 0))
    count = int(check(driver.cuLibraryGetKernelCount(library)))
    out["kernel_count"] = count
    names, same = names_of(driver, count, driver.cuLibraryEnumerateKernels, driver.cuKernelGetName,
                           driver.cuLibraryGetKernel, library)
    out["kernel_names"], out["kernel_names_in_order"], out["kernels_match"] = sorted(names), names, same
    out["enumerate_kernels"] = probes(driver.cuLibraryEnumerateKernels, count, library)
    out["name_of_null"] = [int(driver.cuFuncGetName(driver.CUfunction(0))[0]),
                           int(driver.cuKernelGetName(driver.CUkernel(0))[0])]

    # (c) device 0's bus id, and back
    raw = check(driver.cuDeviceGetPCIBusId(64, dev))
    bus_id = bytes(raw).split(b"\0", 1)[0].decode()
    out["bus_id"] = bus_id
    out["by_bus_id"] = by_bus_id(driver, bus_id)
    out["by_bus_id_upper"] = by_bus_id(driver, bus_id.upper())
    out["by_bus_id_short"] = by_bus_id(driver, short_bus_id(bus_id))

    # (d) LUID and atomic capabilities
    err, _luid, mask = driver.cuDeviceGetLuid(dev)
    out["luid"] = [int(err), None if int(err) else int(mask)]
    operations = [op for op in driver.CUatomicOperation if op.name != "CU_ATOMIC_OPERATION_MAX"]
    out["atomic_operations"] = [int(op) for op in operations]
    err, capabilities = driver.cuDeviceGetHostAtomicCapabilities(operations, len(operations), dev)
    out["host_atomics"] = [int(err), None if capabilities is None else [int(c) for c in capabilities]]
    top = driver.CUatomicOperation.CU_ATOMIC_OPERATION_MAX
    out["host_atomic_max"] = int(driver.cuDeviceGetHostAtomicCapabilities([top], 1, dev)[0])
    out["host_atomic_count_0"] = int(driver.cuDeviceGetHostAtomicCapabilities(operations, 0, dev)[0])
    err, capabilities = driver.cuDeviceGetP2PAtomicCapabilities(operations, len(operations), dev, dev)
    out["p2p_atomics_0_0"] = [int(err), None if capabilities is None else [int(c) for c in capabilities]]

    out["ok"] = (out["function_count"] == out["kernel_count"] == len(KERNELS)
                 and out["function_names"] == out["kernel_names"] == expected
                 and out["functions_match"] == out["kernels_match"] == [True] * len(KERNELS)
                 and out["by_bus_id"] == [0, 0])

    check(driver.cuLibraryUnload(library))
    check(driver.cuModuleUnload(module))
    check(driver.cuDevicePrimaryCtxRelease(dev))
    return out


def fake_driver():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
    from tests.fake_driver import FakeDriver
    return FakeDriver(devices=1)


def cuda_driver():
    """cuda.bindings.driver, once it found a CUDA driver: without one, a one-line exit instead of a traceback."""
    from cuda.bindings import driver
    try:
        driver.cuInit(0)
    except RuntimeError as exc:  # no libcuda (cuda.pathfinder's DynamicLibNotFoundError)
        raise SystemExit(f"module_names_program: no CUDA driver here ({exc})") from None
    return driver


def main(argv):
    driver = fake_driver() if "--fake" in argv else cuda_driver()
    print("RESULT " + json.dumps(run(driver), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
