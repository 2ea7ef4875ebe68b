"""A kernel's function in the current context and the occupancy queries, answered in the guest after the agent's first
answer (guest_runtime/native/function_answers.c), against a real agent whose sessions run the executor over the fake
driver (tests/forwarding_rig.py), locally or relayed.

cuKernelGetFunction gives one function per kernel and context, the same handle each time (measured on the H200: and
another after the library is unloaded and loaded again, though the kernel's handle is the same): so each (kernel,
context) is asked once, until an unload (an attribute set changes a function's attributes, not which function it
is). An occupancy answer is kept per function, context, block size, dynamic
shared memory and flags, and asked again after a set that may change it (a function attribute, a context limit).
Every answer is the agent's first one for the same question, and the number of records that reached the agent is
exactly the number of questions not asked before."""
from __future__ import annotations

from pathlib import Path

from tests import forwarding_rig
from tests.forwarding_rig import Rig
from tests.wire.test_native_callbacks import run

bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures
SUCCESS = 0

PROGRAM = r"""
lib.cuKernelGetFunction.argtypes = [c_void_p, c_void_p]
lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [c_void_p, c_void_p, c_int, c_size_t]
lib.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags.argtypes = [c_void_p, c_void_p, c_int, c_size_t, c_uint]
lib.cuFuncSetAttribute.argtypes = [c_void_p, c_int, c_int]
lib.cuCtxSetLimit.argtypes = [c_int, c_size_t]
lib.cuLibraryUnload.argtypes = [c_void_p]
def load_library():
    holder = ctypes.create_string_buffer(PTX, len(PTX))
    library, kernel = c_void_p(), c_void_p()
    assert lib.cuLibraryLoadData(byref(library), holder, None, None, 0, None, None, 0) == 0
    assert lib.cuLibraryGetKernel(byref(kernel), library, b"noargs") == 0
    return library, kernel
def function_of(kernel):
    f = c_void_p()
    return [lib.cuKernelGetFunction(byref(f), kernel), f.value]
library, kernel = load_library()
first, again = function_of(kernel), function_of(kernel)
other = c_void_p()
assert lib.cuDevicePrimaryCtxRetain(byref(other), 1) == 0 and lib.cuCtxSetCurrent(other) == 0
in_other, in_other_again = function_of(kernel), function_of(kernel)
assert lib.cuCtxSetCurrent(context) == 0
out["functions"] = [first, again, in_other, in_other_again, function_of(kernel)]
f = first[1]
def occupancy(block, smem=0, flags=None):
    blocks = c_int(-1)
    if flags is None:
        status = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(byref(blocks), f, block, smem)
    else:
        status = lib.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(byref(blocks), f, block, smem, flags)
    return [status, blocks.value]
out["occupancy"] = [occupancy(128), occupancy(128), occupancy(256), occupancy(128, 1024), occupancy(128, 0, 0),
                    occupancy(128, 0, 1), occupancy(4096)]
assert lib.cuFuncSetAttribute(f, 8, 1024) == 0  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
out["after_set"] = occupancy(128)
out["function_after_set"] = function_of(kernel)  # a set changes a function's attributes, not which function it is
assert lib.cuCtxSetLimit(0, 4096) == 0  # CU_LIMIT_STACK_SIZE
out["after_limit"] = [occupancy(128), occupancy(128)]
assert lib.cuLibraryUnload(library) == 0
library, kernel_again = load_library()
out["reloaded"] = [function_of(kernel_again), function_of(kernel_again)]
"""


def test_each_question_reaches_the_agent_once_until_what_may_change_its_answer(library: Path, rig: Rig) -> None:
    mark = rig.mark()
    out, _ = run(library, rig, PROGRAM)
    first, again, in_other, in_other_again, back = out["functions"]
    assert first[0] == SUCCESS and first == again == back
    assert in_other[0] == SUCCESS and in_other == in_other_again and in_other[1] != first[1]
    reloaded, reloaded_again = out["reloaded"]
    assert reloaded[0] == SUCCESS and reloaded == reloaded_again and reloaded[1] != first[1]
    assert out["function_after_set"] == first
    assert len(rig.entries(since=mark, name="cuKernelGetFunction")) == 3  # first, in the other context, reloaded
    # the fake's occupancy: 2048 // block, one less with dynamic shared memory; a block past 1024 is refused
    assert out["occupancy"] == [[SUCCESS, 16], [SUCCESS, 16], [SUCCESS, 8], [SUCCESS, 15], [SUCCESS, 16],
                                [SUCCESS, 16], [1, -1]]
    assert out["after_set"] == [SUCCESS, 16] and out["after_limit"] == [[SUCCESS, 16], [SUCCESS, 16]]
    plain = rig.entries(since=mark, name="cuOccupancyMaxActiveBlocksPerMultiprocessor")
    flagged = rig.entries(since=mark, name="cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags")
    # plain: 128, 256, (128, 1 KiB), 4096 (refused: never kept), after the set, after the limit; WithFlags(0) is
    # the plain question's answer; WithFlags(1) is its own
    assert (len(plain), len(flagged)) == (6, 1)
