"""Module enumeration and names, and the device queries that carry arrays or bytes (guest_runtime/native/
module_queries.c, answered_in_guest.c's cuDeviceGetByPCIBusId; host_agent/session/module_queries.py) against a real
agent
whose sessions run the executor over the fake driver (tests/forwarding_rig.py), the native guest driver loaded with
ctypes in a subprocess (test_native_launch_calls's prelude: a context current, a PTX module of three kernels). What
the program saw is compared with the fake's own answers to the same questions; handles enumerated are usable (a
launch through one), and those of another session or none are refused before the driver. CPU only:
tests/gpu/programs/module_names_program.py runs the same calls on the GPU, natively and forwarded."""
from __future__ import annotations

from pathlib import Path

from tests import forwarding_rig
from tests.forwarding_rig import Rig
from tests.wire.program_runs import forwarded_and_on_the_fake
from tests.wire.test_native_callbacks import run

SUCCESS, INVALID_VALUE, INVALID_DEVICE, INVALID_HANDLE = 0, 1, 101, 400
bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures

QUERIES = r"""
for name, args in {
    "cuModuleEnumerateFunctions": [c_void_p, c_uint, c_void_p],
    "cuLibraryEnumerateKernels": [c_void_p, c_uint, c_void_p],
    "cuFuncGetName": [c_void_p, c_void_p], "cuKernelGetName": [c_void_p, c_void_p],
    "cuModuleGetFunctionCount": [c_void_p, c_void_p], "cuLibraryGetKernelCount": [c_void_p, c_void_p],
    "cuDeviceGetPCIBusId": [ctypes.c_char_p, c_int, c_int], "cuDeviceGetByPCIBusId": [c_void_p, ctypes.c_char_p],
}.items():
    getattr(lib, name).argtypes = args
status, module = load(PTX)
assert status == 0
count = c_uint()
assert lib.cuModuleGetFunctionCount(byref(count), module) == 0
functions = (c_void_p * count.value)()
out["enumerate"] = lib.cuModuleEnumerateFunctions(functions, count.value, module)
names = []
for handle in functions:
    name = ctypes.c_char_p()
    assert lib.cuFuncGetName(byref(name), handle) == 0
    again = ctypes.c_char_p()
    assert lib.cuFuncGetName(byref(again), handle) == 0
    names.append([name.value.decode(), ctypes.cast(name, c_void_p).value == ctypes.cast(again, c_void_p).value,
                  handle == function(module, name.value)])
out["names"] = sorted(names)
enumerated = dict((n[0], h) for n, h in zip(names, functions))
out["launch_enumerated"] = [launch(enumerated["noargs"]), lib.cuCtxSynchronize()]
out["null_array"] = lib.cuModuleEnumerateFunctions(None, 1, module)
out["null_name"] = lib.cuFuncGetName(None, functions[0])
out["unknown_function"] = lib.cuFuncGetName(byref(ctypes.c_char_p()), c_void_p(0xBAD0))
out["unknown_module"] = lib.cuModuleEnumerateFunctions(functions, 1, c_void_p(0xBAD0))
library = c_void_p()
holder = ctypes.create_string_buffer(PTX, len(PTX))
assert lib.cuLibraryLoadData(byref(library), holder, None, None, 0, None, None, 0) == 0
assert lib.cuLibraryGetKernelCount(byref(count), library) == 0
kernels = (c_void_p * count.value)()
out["kernels"] = lib.cuLibraryEnumerateKernels(kernels, count.value, library)
kernel_names = []
for handle in kernels:
    name = ctypes.c_char_p()
    assert lib.cuKernelGetName(byref(name), handle) == 0
    kernel_names.append(name.value.decode())
out["kernel_names"] = sorted(kernel_names)
bus = ctypes.create_string_buffer(32)
assert lib.cuDeviceGetPCIBusId(bus, 32, 0) == 0
out["bus_id"] = bus.value.decode()
device = c_int(-1)
forms = {"plain": bus.value, "upper": bus.value.upper(), "short": bus.value.split(b":", 1)[1],
         "no function": bus.value.rsplit(b".", 1)[0], "nobody": b"0000:ff:1f.0", "garbage": b"not a bus id"}
out["by_bus_id"] = {}
for key, text in forms.items():
    device.value = -1
    out["by_bus_id"][key] = [lib.cuDeviceGetByPCIBusId(byref(device), text), device.value]
"""


def test_enumerated_handles_are_the_named_ones_and_names_stay_put(library: Path, rig: Rig) -> None:
    out, _ = run(library, rig, QUERIES)
    assert out["enumerate"] == SUCCESS and out["kernels"] == SUCCESS
    assert out["names"] == [["mix", True, True], ["noargs", True, True], ["wide", True, True]]
    assert out["kernel_names"] == ["mix", "noargs", "wide"]
    assert out["launch_enumerated"] == [SUCCESS, SUCCESS]  # an enumerated handle is the session's
    assert out["null_array"] == INVALID_VALUE and out["null_name"] == INVALID_VALUE
    assert out["unknown_function"] == INVALID_HANDLE and out["unknown_module"] == INVALID_HANDLE
    by_bus_id = out["by_bus_id"]
    assert [by_bus_id[k] for k in ("plain", "upper", "short", "no function")] == [[SUCCESS, 0]] * 4, out["bus_id"]
    assert by_bus_id["nobody"][0] == INVALID_DEVICE and by_bus_id["garbage"][0] == INVALID_VALUE


def test_the_gpu_program_gives_through_the_native_driver_what_it_gives_on_the_fake(library: Path, rig: Rig) -> None:
    """tests/gpu/programs/module_names_program.py through the native driver against the rig's fake, and on the fake
    directly (`--fake`): the same values."""
    forwarded, on_the_fake = forwarded_and_on_the_fake("module_names_program.py", library, rig)
    del forwarded["bus_id"], on_the_fake["bus_id"]  # the rig's guest device 0 is another fake GPU than --fake's
    assert forwarded["ok"] is True and forwarded == on_the_fake
