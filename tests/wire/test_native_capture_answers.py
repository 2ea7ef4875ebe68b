"""cuStreamIsCapturing and cuStreamGetCaptureInfo answered in the guest (guest_runtime/native/capture_state.c) against
a real agent whose sessions run the executor over the fake driver (tests/forwarding_rig.py), locally or relayed.

While no capture may be under way in the process, the status of a default stream or of one the process made (and has
not destroyed) is NONE without a record to the agent;
once a capture begins, every query is the agent's again (the legacy stream's answer while a blocking stream captures
is the driver's error, which only the agent can give), and after the capture ends the guest answers again. A capture
whose end failed and left it running (an end asked of a stream that is not capturing) keeps the queries the agent's.
A posted call's failure is still reported by the next query, answered here or not. Every status is the one the fake
driver itself gives for the same sequence (its docstrings say whose semantics those are).

A thread's capture interaction mode is exchanged without a record while no capture may run; during one, each
thread's calls reach the agent (one thread there) with that thread's mode, so a relaxed thread may allocate during a
global capture and a thread left in the global mode may not, as the driver's rules have it. The guest also keeps
which thread began each capture: a thread-local capture holds only its own thread, and only that thread may end it."""
from __future__ import annotations

from pathlib import Path

from tests import forwarding_rig
from tests.forwarding_rig import Rig
from tests.wire.test_native_callbacks import run

bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures
SUCCESS, INVALID_VALUE, INVALID_HANDLE, ILLEGAL_STATE, CAPTURE_IMPLICIT = 0, 1, 400, 401, 906
CAPTURE_UNSUPPORTED, CAPTURE_INVALIDATED, CAPTURE_WRONG_THREAD = 900, 901, 908
NONE, ACTIVE, INVALIDATED = 0, 1, 2

QUERIES = r"""
lib.cuStreamIsCapturing.argtypes = [c_void_p, c_void_p]
lib.cuStreamBeginCapture_v2.argtypes = [c_void_p, c_int]
lib.cuStreamEndCapture.argtypes = [c_void_p, c_void_p]
def capturing(s):
    status = c_int(-1)
    return [lib.cuStreamIsCapturing(s, byref(status)), status.value]
out["idle"] = [capturing(s) for s in (None, 1, 2)]
out["null_status"] = lib.cuStreamIsCapturing(None, None)
side = stream(0)  # blocking
out["begin"] = lib.cuStreamBeginCapture_v2(side, 0)  # global mode
out["during"] = [capturing(None), capturing(side)]
graph = c_void_p()
out["end"] = lib.cuStreamEndCapture(side, byref(graph))
out["after"] = capturing(None)
out["begin_again"] = lib.cuStreamBeginCapture_v2(side, 0)
other = stream(1)
out["end_other"] = [lib.cuStreamEndCapture(other, byref(graph)), capturing(side), capturing(None)]
out["end_at_last"] = lib.cuStreamEndCapture(side, byref(graph))
out["after_all"] = capturing(None)
"""

FAILED_POST = r"""
lib.cuStreamIsCapturing.argtypes = [c_void_p, c_void_p]
lib.cuMemsetD32Async.argtypes = [ctypes.c_uint64, c_uint, c_size_t, c_void_p]
status = c_int(-1)
assert lib.cuStreamIsCapturing(None, byref(status)) == 0 and status.value == 0
assert lib.cuMemsetD32Async(0xDEAD0000, 7, 4, None) == 0  # posted: its failure comes back later
seen = []
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    got = lib.cuStreamIsCapturing(None, byref(status))
    if got != 0:
        seen.append(got)
        break
    time.sleep(0.01)
seen.append(lib.cuStreamIsCapturing(None, byref(status)))  # reported once
out["seen"] = seen
"""


def test_default_streams_are_answered_here_until_a_capture_may_run(library: Path, rig: Rig) -> None:
    mark = rig.mark()
    out, _ = run(library, rig, QUERIES)
    assert out["idle"] == [[SUCCESS, NONE]] * 3
    assert out["null_status"] == INVALID_VALUE
    assert out["begin"] == SUCCESS
    assert out["during"] == [[CAPTURE_IMPLICIT, -1], [SUCCESS, ACTIVE]]  # the fake's answers, through the agent
    assert out["end"] == SUCCESS and out["after"] == [SUCCESS, NONE]
    assert out["begin_again"] == SUCCESS
    assert out["end_other"] == [ILLEGAL_STATE, [SUCCESS, ACTIVE], [CAPTURE_IMPLICIT, -1]]  # a failed end: still one
    assert out["end_at_last"] == SUCCESS and out["after_all"] == [SUCCESS, NONE]
    asked = [e for e in rig.entries(since=mark, name="cuStreamIsCapturing")]
    assert len(asked) == 4  # during the captures only: the default streams' other answers never left the guest


CAPTURE_INFO = r"""
lib.cuStreamIsCapturing.argtypes = [c_void_p, c_void_p]
lib.cuStreamGetCaptureInfo.argtypes = [c_void_p] + [c_void_p] * 6
lib.cuStreamBeginCapture_v2.argtypes = [c_void_p, c_int]
lib.cuStreamEndCapture.argtypes = [c_void_p, c_void_p]
lib.cuStreamDestroy_v2.argtypes = [c_void_p]
def info(s):
    status, ident, graph, nodes, edges, count = c_int(-1), ctypes.c_uint64(7), c_void_p(7), c_void_p(7), c_void_p(7), \
        c_size_t(7)
    rc = lib.cuStreamGetCaptureInfo(s, byref(status), byref(ident), byref(graph), byref(nodes), byref(edges),
                                    byref(count))
    return [rc, status.value, ident.value, graph.value, nodes.value, edges.value, count.value]
def capturing(s):
    status = c_int(-1)
    return [lib.cuStreamIsCapturing(s, byref(status)), status.value]
mine, side, gone = stream(1), stream(1), stream(1)
assert lib.cuStreamDestroy_v2(gone) == 0
out["idle"] = [info(None), info(2), info(mine), capturing(mine)]
out["gone"] = [info(gone)[0], capturing(gone)[0]]
out["begin"] = lib.cuStreamBeginCapture_v2(side, 2)  # relaxed: other streams may be asked of
out["during"] = [info(mine), info(side)[1]]
graph = c_void_p()
out["end"] = lib.cuStreamEndCapture(side, byref(graph))
out["after"] = info(mine)
"""


def test_a_stream_of_the_process_and_capture_info_are_answered_here(library: Path, rig: Rig) -> None:
    """cuStreamGetCaptureInfo (NCCL asks it before each collective) and cuStreamIsCapturing of a stream the process
    made: NONE with no record while no capture may run, every output what the agent's answer for a stream that is not
    capturing holds (asked while another stream captures); a destroyed stream's query is the agent's
    (INVALID_HANDLE: the agent's own check)."""
    mark = rig.mark()
    out, _ = run(library, rig, CAPTURE_INFO)
    none = [SUCCESS, NONE, 0, None, None, None, 0]
    assert out["idle"] == [none, none, none, [SUCCESS, NONE]], out
    assert out["gone"] == [INVALID_HANDLE, INVALID_HANDLE], out
    assert out["begin"] == SUCCESS
    assert out["during"] == [none, ACTIVE], out  # the agent's answer for `mine`: the same as the guest's
    assert out["end"] == SUCCESS and out["after"] == none
    asked = rig.entries(since=mark, name="cuStreamGetCaptureInfo") + rig.entries(since=mark, name="cuStreamIsCapturing")
    assert len(asked) == 2, asked  # the two during the capture (the destroyed stream's the agent refused itself)


def test_a_failed_posted_call_is_reported_by_a_query_answered_here(library: Path, rig: Rig) -> None:
    out, _ = run(library, rig, "import time\n" + FAILED_POST)
    assert out["seen"] == [INVALID_VALUE, SUCCESS]  # the memset's own error (not the session's memory), once


CAPTURE_MODES = r"""
lib.cuThreadExchangeStreamCaptureMode.argtypes = [c_void_p]
lib.cuStreamBeginCapture_v2.argtypes = [c_void_p, c_int]
lib.cuStreamIsCapturing.argtypes = [c_void_p, c_void_p]
def exchange(mode):
    cell = c_int(mode)
    return [lib.cuThreadExchangeStreamCaptureMode(byref(cell)), cell.value]
def allocate():
    pointer = c_uint64()
    return lib.cuMemAlloc(byref(pointer), 4096)
out["idle"] = [exchange(2), exchange(0), exchange(2)]  # RELAXED, GLOBAL, RELAXED: each answers the one before
out["not_a_mode"] = exchange(7)
side = stream(1)
out["begin"] = lib.cuStreamBeginCapture_v2(side, 0)  # a global capture, begun by this (relaxed) thread
out["relaxed_alloc"] = allocate()
def other():
    assert lib.cuCtxSetCurrent(context) == 0
    out["global_alloc"] = allocate()  # a thread in the default mode: prohibited, and the capture invalidated
worker = threading.Thread(target=other)
worker.start()
worker.join()
status = c_int(-1)
out["capture_after"] = [lib.cuStreamIsCapturing(side, byref(status)), status.value]
out["relaxed_alloc_again"] = allocate()
graph = c_void_p()
out["end"] = lib.cuStreamEndCapture(side, byref(graph))
out["after"] = exchange(0)
"""


def test_a_threads_capture_mode_is_kept_here_and_is_the_agents_during_a_capture(library: Path, rig: Rig) -> None:
    mark = rig.mark()
    out, _ = run(library, rig, CAPTURE_MODES)
    assert out["idle"] == [[SUCCESS, 0], [SUCCESS, 2], [SUCCESS, 0]]
    assert out["not_a_mode"][0] == INVALID_VALUE  # the driver's answer
    assert out["begin"] == SUCCESS
    assert out["relaxed_alloc"] == SUCCESS  # this thread is relaxed: the agent's thread was made so first
    assert out["global_alloc"] == CAPTURE_UNSUPPORTED
    assert out["capture_after"] == [SUCCESS, INVALIDATED] and out["relaxed_alloc_again"] == SUCCESS
    assert out["end"] == CAPTURE_INVALIDATED and out["after"] == [SUCCESS, 2]
    # the agent's thread was told a mode only during the capture, before a call of a thread whose mode differed:
    # the relaxed one's first call, the other thread's, the relaxed one's again (idle exchanges never left)
    exchanged = [e["args"][0][1] for e in rig.entries(since=mark, name="cuThreadExchangeStreamCaptureMode")]
    assert exchanged == [2, 0, 2]


CAPTURE_OWNERS = r"""
lib.cuStreamBeginCapture_v2.argtypes = [c_void_p, c_int]
lib.cuStreamIsCapturing.argtypes = [c_void_p, c_void_p]
def allocate():
    pointer = c_uint64()
    return lib.cuMemAlloc(byref(pointer), 4096)
def capturing(s):
    status = c_int(-1)
    return [lib.cuStreamIsCapturing(s, byref(status)), status.value]
def end(s):
    graph = c_void_p()
    return lib.cuStreamEndCapture(s, byref(graph))
def elsewhere(*steps):
    seen = []
    def other():
        assert lib.cuCtxSetCurrent(context) == 0
        seen.extend(step() for step in steps)
    worker = threading.Thread(target=other)
    worker.start()
    worker.join()
    return seen
side = stream(1)
out["begin"] = lib.cuStreamBeginCapture_v2(side, 1)  # THREAD_LOCAL, begun by this thread (mode GLOBAL)
out["other_thread"] = elsewhere(allocate, lambda: end(side))  # not this capture's thread
out["still"] = capturing(side)
out["this_thread_alloc"] = allocate()  # its own capture, not relaxed: prohibited, and the capture invalidated
out["end"] = end(side)
"""


def test_a_capture_stays_with_the_guest_thread_that_began_it(library: Path, rig: Rig) -> None:
    """The agent's one thread began every capture, so the guest keeps which thread began each (capture_state.c): a
    thread-local capture prohibits only its own thread's allocations, and only its own thread may end it, as the
    driver rules for threads of one process."""
    out, _ = run(library, rig, CAPTURE_OWNERS)
    assert out["begin"] == SUCCESS
    assert out["other_thread"] == [SUCCESS, CAPTURE_WRONG_THREAD]  # allowed; and not the capture's thread to end
    assert out["still"] == [SUCCESS, ACTIVE]
    assert out["this_thread_alloc"] == CAPTURE_UNSUPPORTED
    assert out["end"] == CAPTURE_INVALIDATED
