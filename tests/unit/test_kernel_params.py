"""guest_runtime.kernel_params: packing cuLaunchKernel's `void **kernelParams` and reading its `extra` form.

The arguments live in real ctypes objects and `kernelParams` is a real `void *[]`, as a C caller or cuda.core
builds it. Layouts follow CUDA's ABI (each parameter at its natural alignment, a float4-like struct at 16), as
cuFuncGetParamInfo reports them.
"""
from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence

import pytest

from guest_runtime.kernel_params import (
    CU_LAUNCH_PARAM_BUFFER_POINTER,
    CU_LAUNCH_PARAM_BUFFER_SIZE,
    CU_LAUNCH_PARAM_END,
    MAX_EXTRA_ENTRIES,
    MAX_PARAM_BYTES,
    check_layout,
    pack_checked,
    params_from_extra,
)


class Float4(ctypes.Structure):
    _fields_ = [("x", ctypes.c_float), ("y", ctypes.c_float), ("z", ctypes.c_float), ("w", ctypes.c_float)]


class Pair(ctypes.Structure):  # 16 bytes: double + long long
    _fields_ = [("a", ctypes.c_double), ("b", ctypes.c_longlong)]


def pack_params(kernel_params_address: int, layout: Sequence[tuple[int, int]]) -> bytes:
    """What forward.py does per launch: the layout checked (once per function there), then packed."""
    return pack_checked(kernel_params_address, layout, check_layout(layout))


def kernel_params(values: Sequence[ctypes._CData]) -> ctypes.Array[ctypes.c_void_p]:
    """The `void *kernelParams[]` a caller builds: one pointer per argument value."""
    return (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])


def test_mixed_arguments_are_packed_at_their_offsets() -> None:
    # kernel(int n, double scale, char flag, float4 v, float *out, short s, Pair p, unsigned char last)
    values: list[ctypes._CData] = [
        ctypes.c_int(-7), ctypes.c_double(2.5), ctypes.c_char(b"Z"), Float4(1.0, 2.0, 3.0, 4.0),
        ctypes.c_void_p(0x7F00DEADBEEF), ctypes.c_short(-2), Pair(-0.5, 1 << 40), ctypes.c_ubyte(0xAB)]
    layout = [(0, 4), (8, 8), (16, 1), (32, 16), (48, 8), (56, 2), (64, 16), (80, 1)]
    expected = bytearray(81)
    struct.pack_into("<i", expected, 0, -7)
    struct.pack_into("<d", expected, 8, 2.5)
    expected[16:17] = b"Z"
    struct.pack_into("<4f", expected, 32, 1.0, 2.0, 3.0, 4.0)
    struct.pack_into("<Q", expected, 48, 0x7F00DEADBEEF)
    struct.pack_into("<h", expected, 56, -2)
    struct.pack_into("<dq", expected, 64, -0.5, 1 << 40)
    expected[80] = 0xAB
    array = kernel_params(values)
    packed = pack_params(ctypes.addressof(array), layout)
    assert packed == bytes(expected)
    assert check_layout(layout) == len(packed) == 81


def test_pointers_ints_and_floats() -> None:
    # kernel(float *a, const float *b, int n, float alpha)
    a, b = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64)
    values = [ctypes.c_void_p(ctypes.addressof(a)), ctypes.c_void_p(ctypes.addressof(b)), ctypes.c_int(1000),
              ctypes.c_float(0.25)]
    array = kernel_params(values)
    packed = pack_params(ctypes.addressof(array), [(0, 8), (8, 8), (16, 4), (20, 4)])
    assert packed == struct.pack("<QQif", ctypes.addressof(a), ctypes.addressof(b), 1000, 0.25)


def test_padding_is_zero_and_values_are_copied_not_referenced() -> None:
    garbage = ctypes.create_string_buffer(b"\xff" * 32)  # a value bigger than its parameter: only `size` is read
    values = [ctypes.c_char(b"a"), garbage]
    array = kernel_params(values)
    packed = pack_params(ctypes.addressof(array), [(0, 1), (8, 4)])
    assert packed == b"a" + bytes(7) + b"\xff" * 4
    garbage.raw = bytes(32)
    assert packed[8:] == b"\xff" * 4


def test_layout_order_is_parameter_order_not_offset_order() -> None:
    values = [ctypes.c_int(1), ctypes.c_int(2)]
    array = kernel_params(values)
    assert pack_params(ctypes.addressof(array), [(4, 4), (0, 4)]) == struct.pack("<ii", 2, 1)


def test_no_parameters() -> None:
    assert pack_params(0, []) == b""
    assert check_layout([]) == 0


def test_the_largest_legal_buffer() -> None:
    big = ctypes.create_string_buffer(bytes(range(256)) * 128)  # 32 KiB
    array = kernel_params([big])
    packed = pack_params(ctypes.addressof(array), [(0, MAX_PARAM_BYTES)])
    assert packed == big.raw[:MAX_PARAM_BYTES]


@pytest.mark.parametrize("layout", [
    [(0, 8), (4, 4)],  # overlap
    [(0, 4), (0, 4)],  # same offset twice
    [(16, 16), (0, 17)],  # overlap, out of order
    [(0, 0)],  # empty parameter
    [(-8, 4)],
    [(0, -1)],
    [(0, MAX_PARAM_BYTES + 1)],
    [(MAX_PARAM_BYTES, 4)],
    [(0, 1 << 40)],
])
def test_bad_layouts_raise(layout: list[tuple[int, int]]) -> None:
    values = [ctypes.create_string_buffer(64) for _ in layout]
    array = kernel_params(values)
    with pytest.raises(ValueError):
        check_layout(layout)
    with pytest.raises(ValueError):
        pack_params(ctypes.addressof(array), layout)  # forward.py never packs a layout check_layout refused


def test_null_pointers_raise() -> None:
    with pytest.raises(ValueError, match="NULL"):
        pack_params(0, [(0, 4)])
    first = ctypes.c_int(1)
    array = (ctypes.c_void_p * 2)(ctypes.addressof(first), None)
    with pytest.raises(ValueError, match=r"kernelParams\[1\] is NULL"):
        pack_params(ctypes.addressof(array), [(0, 4), (4, 4)])


# --- extra ----------------------------------------------------------------------------------------------------

def extra(*words: int | None) -> ctypes.Array[ctypes.c_void_p]:
    return (ctypes.c_void_p * len(words))(*words)


def test_extra_buffer() -> None:
    buffer = ctypes.create_string_buffer(struct.pack("<QQif", 1, 2, 3, 4.0))
    size = ctypes.c_size_t(24)
    for words in ((CU_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(buffer),
                   CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size), CU_LAUNCH_PARAM_END),
                  (CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size),
                   CU_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(buffer), CU_LAUNCH_PARAM_END)):
        array = extra(*words)
        assert params_from_extra(ctypes.addressof(array)) == buffer.raw[:24]


def test_extra_without_a_buffer() -> None:
    assert params_from_extra(0) is None
    array = extra(CU_LAUNCH_PARAM_END)
    assert params_from_extra(ctypes.addressof(array)) is None
    zero = ctypes.c_size_t(0)  # a zero size needs no pointer
    array = extra(CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(zero), CU_LAUNCH_PARAM_END)
    assert params_from_extra(ctypes.addressof(array)) == b""


def test_bad_extra_raises() -> None:
    buffer = ctypes.create_string_buffer(64)
    size = ctypes.c_size_t(16)
    absurd = ctypes.c_size_t(1 << 40)
    cases = [
        extra(CU_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(buffer), CU_LAUNCH_PARAM_END),  # no size
        extra(CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size), CU_LAUNCH_PARAM_END),  # no pointer
        extra(CU_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(buffer), CU_LAUNCH_PARAM_BUFFER_SIZE,
              ctypes.addressof(absurd), CU_LAUNCH_PARAM_END),
        extra(7, 0, CU_LAUNCH_PARAM_END),  # unknown key
        extra(*[CU_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(size)] * (MAX_EXTRA_ENTRIES + 1)),  # no END
    ]
    for array in cases:
        with pytest.raises(ValueError):
            params_from_extra(ctypes.addressof(array))
