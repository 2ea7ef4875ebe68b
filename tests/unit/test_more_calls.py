"""cuPointerGetAttribute, cuLaunchCooperativeKernel and cuModuleLoadDataEx end to end over the forwarding rig.

Guest Forwarder -> real region -> CudaExecutor -> FakeDriver (tests/forwarding_rig.py); the fake's journal says
what reached the "driver". Refusals are checked to reach nothing.
"""
from __future__ import annotations

import ctypes
import logging
import struct
from typing import Any

import pytest

from ivshmem.driver_api import (
    CALLS,
    JIT_SCALAR_OPTIONS,
    POINTER_ATTRIBUTE_WIDTHS,
    POINTER_P2P_TOKENS,
)
from ivshmem.record import CUDA_OPCODE_BASE, Status
from tests import forwarding_rig
from tests.forwarding_rig import GUEST_DEVICES, Guest, Rig
from tests.unit.test_forwarding_roundtrip import Env, _mix_arguments, kernel_ptx

bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures

SUCCESS, INVALID_VALUE, INVALID_IMAGE, INVALID_HANDLE, NOT_SUPPORTED = 0, 1, 200, 400, 801
FOREIGN = 0x7E00_0000_1000
NEW_CALLS = ("cuPointerGetAttribute", "cuLaunchCooperativeKernel", "cuModuleLoadDataEx")
GUARD = b"\xee" * 8


def plain_number(value: Any) -> int:
    return int(value[1]) if isinstance(value, list) else int(value)


# --- the table ------------------------------------------------------------------------------------------------------

def test_the_three_calls_are_appended_with_the_wheels_signatures() -> None:
    # appended after the first 85 calls, so their opcodes never moved (the table is append-only)
    assert [c.name for c in CALLS.values()][85:88] == list(NEW_CALLS)
    assert [CALLS[n].opcode for n in NEW_CALLS] == [CUDA_OPCODE_BASE + 85 + i for i in range(3)]
    assert CALLS["cuLaunchCooperativeKernel"].posted
    cydriver = pytest.importorskip("cuda.bindings.cydriver", reason="cuda-python is not installed")
    from guest_runtime.capsule_hook import capsule_signature
    for name in NEW_CALLS:
        assert capsule_signature(cydriver.__pyx_capi__[name]) == CALLS[name].signature, name


def test_the_pointer_attribute_widths_cover_the_wheels_enum() -> None:
    driver = pytest.importorskip("cuda.bindings.driver", reason="cuda-python is not installed")
    values = {int(m) for m in driver.CUpointer_attribute}
    assert set(POINTER_ATTRIBUTE_WIDTHS) | {POINTER_P2P_TOKENS} == values
    assert set(POINTER_ATTRIBUTE_WIDTHS.values()) == {4, 8}
    names = {int(m): m.name for m in driver.CUjit_option}
    assert all(o in names for o in JIT_SCALAR_OPTIONS)


# --- cuPointerGetAttribute ------------------------------------------------------------------------------------------

def _attribute(g: Guest, attribute: int, pointer: int) -> tuple[int, bytes]:
    """(status, the bytes written to a 16-byte buffer of 0xEE: width bytes then untouched guard)."""
    cell = ctypes.create_string_buffer(b"\xee" * 16, 16)
    status = g.fn["cuPointerGetAttribute"](ctypes.addressof(cell), attribute, pointer)
    return status, cell.raw


def test_every_pointer_attribute_comes_back_at_its_width(rig: Rig) -> None:
    g = rig.guest()
    ctx = g.setup(0)
    pointer = g.alloc(4096)
    problems = []
    for attribute, width in POINTER_ATTRIBUTE_WIDTHS.items():
        mark = rig.mark()
        status, raw = _attribute(g, attribute, pointer + 16)
        seen = rig.entries(mark, "cuPointerGetAttribute")
        assert len(seen) == 1, attribute
        assert seen[0]["args"] == [["CUpointer_attribute", attribute], pointer + 16]
        if seen[0]["result"][0] != ["CUresult", SUCCESS]:
            assert status == seen[0]["result"][0][1] and raw == b"\xee" * 16, attribute
            continue
        value = plain_number(seen[0]["result"][1])
        if attribute == 9:  # DEVICE_ORDINAL: the guest's ordinal
            value = GUEST_DEVICES.index(value)
        want = (value & (1 << 64) - 1).to_bytes(8, "little")[:width]
        if status != SUCCESS or raw != want + b"\xee" * (16 - width):
            problems.append(f"{attribute}: status {status}, wrote {raw.hex()}, want {want.hex()}")
    assert not problems, "\n".join(problems)
    assert _attribute(g, 1, pointer)[1][:8] == struct.pack("<Q", ctx)  # CONTEXT
    assert _attribute(g, 3, pointer + 5)[1][:8] == struct.pack("<Q", pointer + 5)  # DEVICE_POINTER
    assert _attribute(g, 11, pointer + 5)[1][:8] == struct.pack("<Q", pointer)  # RANGE_START_ADDR
    assert _attribute(g, 12, pointer + 5)[1][:8] == struct.pack("<Q", 4096)  # RANGE_SIZE
    assert _attribute(g, 2, pointer)[1][:4] == struct.pack("<I", 2)  # MEMORY_TYPE: device
    assert _attribute(g, 4, pointer)[0] == INVALID_VALUE  # HOST_POINTER of device memory: the driver's answer


def test_device_ordinal_is_the_guests(rig: Rig) -> None:
    g = rig.guest()
    env = Env(g)
    assert _attribute(g, 9, env.ptr) == (SUCCESS, struct.pack("<i", 0) + b"\xee" * 12)
    ctx1 = env.new_context()  # guest device 1 = physical 0
    g.ok("cuCtxSetCurrent", ctx1)
    other = g.alloc(256)
    mark = rig.mark()
    assert _attribute(g, 9, other) == (SUCCESS, struct.pack("<i", 1) + b"\xee" * 12)
    assert rig.entries(mark, "cuPointerGetAttribute")[0]["result"][1] == GUEST_DEVICES[1]
    assert _attribute(g, 1, other)[1][:8] == struct.pack("<Q", ctx1)


def test_a_pool_the_session_learns_from_its_pointer_is_its_own(rig: Rig) -> None:
    g = rig.guest()
    g.setup(0)
    stream = g.ok("cuStreamCreate", 0)
    pointer = g.ok("cuMemAllocAsync", 1024, stream)
    status, raw = _attribute(g, 17, pointer)  # MEMPOOL_HANDLE
    pool = struct.unpack_from("<Q", raw)[0]
    assert status == SUCCESS and pool and raw[8:] == GUARD
    value = ctypes.c_uint64()
    assert g.fn["cuMemPoolGetAttribute"](pool, 7, ctypes.addressof(value)) == SUCCESS  # USED_MEM_CURRENT
    assert value.value == 1024
    plain = g.alloc(64)
    assert _attribute(g, 17, plain) == (SUCCESS, bytes(8) + GUARD)  # not from a pool: NULL
    assert _attribute(g, 10, plain)[1][:4] == struct.pack("<i", 1)  # IPC capable outside pools
    assert _attribute(g, 10, pointer)[1][:4] == struct.pack("<i", 0)


def test_pointer_attribute_refusals_reach_nothing(rig: Rig) -> None:
    g, other = rig.guest(), rig.guest()
    g.setup(0)
    other.setup(0)
    mine = g.alloc(256)
    other.alloc(256)
    theirs = other.alloc(256)  # each session's fake counts from the same base: skip the address `mine` has
    assert theirs != mine
    mark = rig.mark()
    assert g.fn["cuPointerGetAttribute"](None, 2, mine) == INVALID_VALUE  # NULL data
    assert _attribute(g, 2, theirs) == (INVALID_VALUE, b"\xee" * 16)  # another session's memory
    assert _attribute(g, 2, FOREIGN) == (INVALID_VALUE, b"\xee" * 16)
    assert _attribute(g, 2, mine + 256) == (INVALID_VALUE, b"\xee" * 16)  # one past its end
    assert _attribute(g, 2, 0) == (INVALID_VALUE, b"\xee" * 16)
    assert _attribute(g, 99, mine) == (INVALID_VALUE, b"\xee" * 16)  # no such attribute
    assert _attribute(g, 0, mine) == (INVALID_VALUE, b"\xee" * 16)
    assert _attribute(g, POINTER_P2P_TOKENS, mine) == (NOT_SUPPORTED, b"\xee" * 16)  # a struct
    assert not rig.entries(mark), "a refused cuPointerGetAttribute reached the driver"
    assert _attribute(other, 2, theirs)[0] == SUCCESS  # its owner may ask
    # A raw record of the wrong shape is malformed, not a crash.
    assert g.channel.call(CALLS["cuPointerGetAttribute"].opcode, b"\x02\x00\x00").status == Status.MALFORMED


# --- cuLaunchCooperativeKernel ----------------------------------------------------------------------------------------

def _coop(g: Guest, function: int, params: int | None, stream: int = 0, grid: tuple[int, int, int] = (2, 1, 1),
          block: tuple[int, int, int] = (64, 1, 1), shared: int = 0) -> int:
    return g.fn["cuLaunchCooperativeKernel"](function, *grid, *block, shared, stream, params)


def test_cooperative_launch_packs_params_at_the_drivers_offsets(rig: Rig) -> None:
    g = rig.guest()
    env = Env(g)
    values, params = _mix_arguments()
    mark = rig.mark()
    assert _coop(g, env.function, ctypes.addressof(params), env.stream, (3, 2, 1), (128, 1, 1), 512) == SUCCESS
    assert g.sync() == SUCCESS
    infos = rig.entries(mark, "cuFuncGetParamInfo")
    # The guest asks once (to pack) and the host once (to rebuild kernelParams): n parameters + the end each.
    assert [e["args"] for e in infos] == [[env.function, i] for i in range(len(values) + 1)] * 2
    layout = [(e["result"][1], e["result"][2]) for e in infos[:len(values)]]
    expected = bytearray(max(o + s for o, s in layout))
    for (offset, size), value in zip(layout, values, strict=True):
        expected[offset:offset + size] = bytes(value)[:size]
    (launch,) = rig.entries(mark, "cuLaunchCooperativeKernel")
    assert launch["launch"]["params"] == expected.hex()
    assert launch["launch"]["source"] == "kernelParams" and launch["launch"]["cooperative"]
    assert launch["launch"]["size_matches"]
    assert (launch["launch"]["grid"], launch["launch"]["block"], launch["launch"]["shared"],
            launch["launch"]["stream"]) == ([3, 2, 1], [128, 1, 1], 512, env.stream)
    assert not rig.entries(mark, "cuLaunchKernel")
    mark = rig.mark()  # the second launch asks nobody for the layout again
    assert _coop(g, env.function, ctypes.addressof(params)) == SUCCESS
    assert g.sync() == SUCCESS
    assert not rig.entries(mark, "cuFuncGetParamInfo")
    assert rig.entries(mark, "cuLaunchCooperativeKernel")[0]["launch"]["params"] == expected.hex()


def test_cooperative_launch_of_a_library_kernel_and_of_one_without_params(rig: Rig) -> None:
    g = rig.guest()
    env = Env(g)
    values, params = _mix_arguments()
    mark = rig.mark()
    assert _coop(g, env.kernel, ctypes.addressof(params)) == SUCCESS
    assert g.sync() == SUCCESS
    assert len(rig.entries(mark, "cuKernelGetParamInfo")) == 2 * (len(values) + 1)
    (launch,) = rig.entries(mark, "cuLaunchCooperativeKernel")
    assert launch["launch"]["kernel"] == "mix" and launch["launch"]["size_matches"]
    status, (noargs,) = g.by_name("cuModuleGetFunction", env.module, b"noargs")
    assert status == SUCCESS
    mark = rig.mark()
    assert _coop(g, noargs, None) == SUCCESS
    assert g.sync() == SUCCESS
    (launch,) = rig.entries(mark, "cuLaunchCooperativeKernel")
    assert launch["args"][-1] is None and launch["launch"]["params"] == ""


def test_cooperative_launch_refusals(rig: Rig) -> None:
    owner, g = rig.guest(), rig.guest()
    theirs = Env(owner)  # made first: the thief's own handles below come later in its own fake's count
    g.setup()
    _values, params = _mix_arguments()
    mark = rig.mark()
    assert _coop(g, theirs.function, ctypes.addressof(params)) == SUCCESS  # posted: the error comes next
    assert g.sync() == INVALID_HANDLE
    assert _coop(g, theirs.kernel, ctypes.addressof(params)) == SUCCESS
    assert g.sync() == INVALID_HANDLE
    seen = {e["name"] for e in rig.entries(mark)}
    assert seen <= {"cuCtxSynchronize"}, seen  # not even a parameter-layout query for a foreign function
    g2 = rig.guest()  # a fresh guest: g's Forwarder cached the (refused, empty) layout of the foreign handles
    env = Env(g2)
    foreign_stream = [owner.ok("cuStreamCreate", 0) for _ in range(40)][-1]  # past every handle g2's fake made
    mark = rig.mark()
    g = g2
    assert _coop(g, env.function, ctypes.addressof(params), stream=foreign_stream) == SUCCESS
    assert g.sync() == INVALID_HANDLE
    assert _coop(g, env.function, None) == SUCCESS  # NULL kernelParams for a kernel with parameters:
    assert g.sync() == INVALID_VALUE  # nothing packed, which the host refuses against the layout
    assert not rig.entries(mark, "cuLaunchCooperativeKernel")
    # A record whose packed parameters do not fit the function's layout is refused before the launch.
    head = struct.pack("<QIIIIIIIQ", env.function, 1, 1, 1, 32, 1, 1, 0, 0)
    mark = rig.mark()
    assert g.channel.call(CALLS["cuLaunchCooperativeKernel"].opcode, head + bytes(8)).status == INVALID_VALUE
    assert g.channel.call(CALLS["cuLaunchCooperativeKernel"].opcode, head[:-1]).status == Status.MALFORMED
    assert not rig.entries(mark, "cuLaunchCooperativeKernel")
    assert g.sync() == SUCCESS


def test_a_zero_grid_cooperative_launch_fails_at_the_next_sync(rig: Rig) -> None:
    g = rig.guest()
    env = Env(g)
    _values, params = _mix_arguments()
    mark = rig.mark()
    assert _coop(g, env.function, ctypes.addressof(params), grid=(0, 1, 1)) == SUCCESS
    assert g.sync() == INVALID_VALUE
    (seen,) = rig.entries(mark, "cuLaunchCooperativeKernel")
    assert seen["result"] == [["CUresult", INVALID_VALUE]]


# --- cuModuleLoadDataEx -----------------------------------------------------------------------------------------------

def _load_ex(g: Guest, image: bytes, options: list[tuple[int, int]]) -> tuple[int, int, Any]:
    """(status, module, the optionValues array after the call)."""
    holder = ctypes.create_string_buffer(image, len(image))
    cell = ctypes.c_uint64(0x5A5A)
    keys = (ctypes.c_int * max(len(options), 1))(*[o for o, _ in options])
    values = (ctypes.c_uint64 * max(len(options), 1))(*[v for _, v in options])
    status = g.fn["cuModuleLoadDataEx"](ctypes.addressof(cell), ctypes.addressof(holder), len(options),
                                        ctypes.addressof(keys) if options else None,
                                        ctypes.addressof(values) if options else None)
    return status, cell.value, values


def test_load_data_ex_without_options_is_load_data(rig: Rig) -> None:
    g = rig.guest()
    g.setup(0)
    image = kernel_ptx() + b"\0"
    mark = rig.mark()
    status, module, _ = _load_ex(g, image, [])
    assert status == SUCCESS
    (seen,) = rig.entries(mark, "cuModuleLoadData")
    assert seen["image"]["len"] == len(image) and plain_number(seen["result"][1]) == module
    assert not rig.entries(mark, "cuModuleLoadDataEx")
    assert g.by_name("cuModuleGetFunction", module, b"mix")[0] == SUCCESS  # the module is the session's


def test_load_data_ex_forwards_scalar_options_and_answers_logs_in_the_guest(rig: Rig) -> None:
    g = rig.guest()
    g.setup(0)
    info = ctypes.create_string_buffer(b"x" * 64, 64)
    error = ctypes.create_string_buffer(b"y" * 32, 32)
    options = [(0, 32), (3, ctypes.addressof(info)), (4, 64), (9, 90), (7, 3), (5, ctypes.addressof(error)),
               (6, 32), (2, 0xDEADBEEF), (12, 1), (14, 1), (13, 1), (10, 1), (32, 256)]
    mark = rig.mark()
    status, module, values = _load_ex(g, kernel_ptx() + b"\0", options)
    assert status == SUCCESS
    (seen,) = rig.entries(mark, "cuModuleLoadDataEx")
    assert seen["jit_options"] == [["CU_JIT_MAX_REGISTERS", 32], ["CU_JIT_TARGET", 90],
                                   ["CU_JIT_OPTIMIZATION_LEVEL", 3], ["CU_JIT_CACHE_MODE", 1],
                                   ["CU_JIT_GENERATE_LINE_INFO", 1], ["CU_JIT_FALLBACK_STRATEGY", 1],
                                   ["CU_JIT_MAX_THREADS_PER_BLOCK", 256]]
    assert seen["args"][1] == 7
    assert seen["args"][3][1] == ["CUjit_target", 90]  # the wheel's enum where it wants one
    assert plain_number(seen["result"][1]) == module
    assert info.raw == b"\0" + b"x" * 63 and error.raw == b"\0" + b"y" * 31  # an empty log, nothing more
    assert (values[2], values[6], values[7]) == (0, 0, 0)  # log sizes 0, wall time 0.0
    assert values[3] == 90 and values[0] == 32  # scalar slots are left as they were
    assert g.by_name("cuModuleGetFunction", module, b"mix")[0] == SUCCESS


def test_load_data_ex_refusals(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    g = rig.guest()
    g.setup(0)
    image = kernel_ptx() + b"\0"
    mark = rig.mark()
    with caplog.at_level(logging.WARNING, logger="guest_runtime.forward"):
        for _ in range(2):
            status, module, _v = _load_ex(g, image, [(0, 32), (17, 0)])  # CU_JIT_GLOBAL_SYMBOL_NAMES
            assert (status, module) == (NOT_SUPPORTED, 0x5A5A)
        assert _load_ex(g, image, [(1, 128)])[0] == NOT_SUPPORTED  # THREADS_PER_BLOCK writes back: not yet
    named = [r.getMessage() for r in caplog.records if "cuModuleLoadDataEx" in r.getMessage()]
    assert len(named) == 2 and "17" in named[0] and "1" in named[1], named
    holder = ctypes.create_string_buffer(image)
    assert g.fn["cuModuleLoadDataEx"](None, ctypes.addressof(holder), 0, None, None) == INVALID_VALUE
    cell = ctypes.c_uint64()
    assert g.fn["cuModuleLoadDataEx"](ctypes.addressof(cell), ctypes.addressof(holder), 1, None, None) \
        == INVALID_VALUE
    assert _load_ex(g, b"\x01\x02\x03 not an image\0", [(0, 32)])[0] == INVALID_IMAGE
    assert not rig.entries(mark), "a refused cuModuleLoadDataEx reached the driver"
    # Raw records: an option the guest would never send, an enum value the wheel lacks, a short option list.
    opcode = CALLS["cuModuleLoadDataEx"].opcode
    assert g.channel.call(opcode, struct.pack("<IiQ", 1, 3, 0x1000) + image).status == NOT_SUPPORTED
    assert g.channel.call(opcode, struct.pack("<IiQ", 1, 9, 12345) + image).status == INVALID_VALUE
    assert g.channel.call(opcode, struct.pack("<I", 5) + bytes(12)).status == Status.MALFORMED
    assert not rig.entries(mark)
    reply = g.channel.call(opcode, struct.pack("<IiQ", 1, 0, 16) + image)
    assert reply.status == SUCCESS
    assert rig.entries(mark, "cuModuleLoadDataEx")[0]["jit_options"] == [["CU_JIT_MAX_REGISTERS", 16]]


def test_a_refused_parameter_layout_is_not_remembered(rig: Rig) -> None:
    """Launching a function this session does not own: the host refuses the layout query, the launch fails
    at the next sync, and nothing is cached under that handle number (it may name one of ours later)."""
    g = rig.guest()
    Env(g)
    _values, params = _mix_arguments()
    function = 0x7E00_0000_2000
    status = g.fn["cuLaunchKernel"](function, 1, 1, 1, 1, 1, 1, 0, 0, ctypes.addressof(params), None)
    assert status == 0  # posted: the refusal surfaces at the next synchronising call
    assert g.sync() != 0
    assert function not in g.forwarder._param_layouts  # noqa: SLF001 - the cache itself is what is under test
