"""The native guest driver's event pool (guest_runtime/native/event_pool.c) against a real agent whose sessions run the
executor over the fake driver (tests/forwarding_rig.py), local and relayed: cuEventCreate hands out events made ahead
(EVENTS_CREATE) without a round trip, and cuEventDestroy of the process's own event is posted, while every answer the
program sees stays the driver's: each event is fresh (never recorded: queries and elapsed times answer as for a new
one), timing works, a destroyed event is gone, flags the pool does not take and a refused create are the driver's
answers, and a destroyed context's pooled events are never handed out. The count of round trips is read from the
program's own ORION_STATS table. CPU only; on a GPU, PyTorch's ProcessGroupNCCL makes these calls
(bench/allreduce_bench.py --across processes).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests import forwarding_rig
from tests.forwarding_rig import Rig, native_child_env
from tests.wire.test_native_mem_pools import PRELUDE, REPO

bounded, start, rig = forwarding_rig.bounded, forwarding_rig.start, forwarding_rig.rig  # the rig's fixtures
SUCCESS, INVALID_VALUE, INVALID_HANDLE = 0, 1, 400
MADE = 40  # events made in a row: the pool's refills make 2, 4, 8, 16 and 32 of them

EVENTS = r"""
import threading
from ctypes import c_float
for name, args in {"cuEventCreate": [P, c_uint], "cuEventRecord": [c_void_p, c_uint64], "cuEventQuery": [c_void_p],
                   "cuEventSynchronize": [c_void_p], "cuEventElapsedTime": [P, c_void_p, c_void_p],
                   "cuEventDestroy_v2": [c_void_p], "cuCtxGetCurrent": [U64], "cuCtxSetCurrent": [c_uint64],
                   "cuCtxDestroy_v2": [c_uint64], "cuDevicePrimaryCtxRetain": [U64, c_int],
                   "cuDevicePrimaryCtxReset_v2": [c_int]}.items():
    getattr(lib, name).argtypes = args
def event(flags):
    e = c_void_p()
    status = lib.cuEventCreate(byref(e), flags)
    return status, e.value or 0
def elapsed(a, b):
    ms = c_float(-1)
    return [lib.cuEventElapsedTime(byref(ms), a, b), ms.value]
setup()
s = stream()
made = [event(flags) for flags in [0, 2, 1, 3] * (MADE // 4)]
out["created"] = sorted({status for status, _ in made})
handles = [e for _, e in made]
out["distinct"] = len(set(handles)) == len(handles) and 0 not in handles
first, second = handles[0], handles[4]  # flags 0: timing events, never recorded
out["fresh_query"] = lib.cuEventQuery(first)
out["fresh_sync"] = lib.cuEventSynchronize(first)
out["fresh_elapsed"] = elapsed(first, second)[0]
out["records"] = [lib.cuEventRecord(first, s), lib.cuEventRecord(second, s), lib.cuEventSynchronize(second)]
out["elapsed"] = elapsed(first, second)
out["no_timing"] = elapsed(handles[1], handles[1])[0]  # CU_EVENT_DISABLE_TIMING
out["destroyed"] = sorted({lib.cuEventDestroy_v2(e) for e in handles})
out["destroy_again"] = lib.cuEventDestroy_v2(first)
out["query_destroyed"] = lib.cuEventQuery(second)
out["bad_flags"] = event(0x10)[0]
status, interprocess = event(0x6)  # CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING: made on the host each time
out["interprocess"] = [status, lib.cuEventDestroy_v2(interprocess)]
out["null"] = lib.cuEventCreate(None, 0)
errors = []
def churn():
    lib.cuCtxSetCurrent(context)
    for _ in range(150):
        status, e = event(2)
        if status or lib.cuEventRecord(e, s) or lib.cuEventSynchronize(e) or lib.cuEventDestroy_v2(e):
            errors.append(status)
ctx = c_uint64()
assert lib.cuCtxGetCurrent(byref(ctx)) == 0
context = ctx.value
threads = [threading.Thread(target=churn) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
out["threads"] = errors
out["ctx_destroy"] = lib.cuCtxDestroy_v2(context)
primary = c_uint64()
assert lib.cuDevicePrimaryCtxRetain(byref(primary), 0) == 0 and lib.cuCtxSetCurrent(primary.value) == 0
out["primary_event"] = event(0)[0]  # its pool now holds one more, made ahead
print("MARK", flush=True)
sys.stdin.readline()  # the test notes the journal here
out["reset"] = lib.cuDevicePrimaryCtxReset_v2(0)  # the context, and every event of it, is gone
again = c_uint64()
assert lib.cuDevicePrimaryCtxRetain(byref(again), 0) == 0 and lib.cuCtxSetCurrent(again.value) == 0
out["same_context_handle"] = again.value == primary.value  # the case a stale pool would be wrong in
status, after = event(0)
out["after_reset"] = [status, lib.cuEventRecord(after, 0), lib.cuEventSynchronize(after)]
"""


def _run(library: Path, rig: Rig, stats: Path) -> tuple[dict[str, Any], int]:
    """The program's results, and the journal's length when it reached MARK (before its context was destroyed)."""
    script = PRELUDE + f"MADE = {MADE}\n" + EVENTS + '\nprint("RESULT " + json.dumps(out))\n'
    env = native_child_env(library, rig.path) | {"ORION_STATS": str(stats)}
    with subprocess.Popen([sys.executable, "-c", script, str(library)], env=env, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO) as child:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "MARK\n", child.stderr.read() if child.stderr else ""
        mark = rig.mark()
        stdout, stderr = child.communicate("go\n", timeout=60)
    assert child.returncode == 0, stderr[-3000:]
    return json.loads(next(line for line in stdout.splitlines() if line.startswith("RESULT "))[len("RESULT "):]), mark


def _served(stats: Path, call: str) -> dict[str, int]:
    """ORION_STATS's line for `call`: its count, and how many were answered in the guest, posted, round trips."""
    for line in stats.read_text().splitlines():
        words = line.split()
        if words and words[0] == call:
            return dict(zip(("calls", "guest", "posted", "round_trips"), map(int, words[1:5]), strict=True))
    raise AssertionError(f"no {call} in {stats.read_text()}")


def test_events_are_handed_out_ahead_and_answer_as_fresh_ones(library: Path, rig: Rig, tmp_path: Path) -> None:
    out, mark = _run(library, rig, tmp_path / "stats")
    assert out == {
        "created": [SUCCESS], "distinct": True,
        "fresh_query": SUCCESS, "fresh_sync": SUCCESS, "fresh_elapsed": INVALID_HANDLE,  # never recorded
        "records": [SUCCESS] * 3, "elapsed": [SUCCESS, 0.5],  # the fake: half a millisecond per record between
        "no_timing": INVALID_HANDLE, "destroyed": [SUCCESS],
        "destroy_again": INVALID_HANDLE, "query_destroyed": INVALID_HANDLE,
        "bad_flags": INVALID_VALUE, "interprocess": [SUCCESS, SUCCESS], "null": INVALID_VALUE,
        "threads": [], "ctx_destroy": SUCCESS, "primary_event": SUCCESS, "reset": SUCCESS,
        "same_context_handle": True, "after_reset": [SUCCESS] * 3,
    }, out
    create, destroy = _served(tmp_path / "stats", "cuEventCreate"), _served(tmp_path / "stats", "cuEventDestroy")
    assert create["calls"] == MADE + 3 + 4 * 150 + 2  # the row, refused flags, interprocess, NULL, threads, primary
    # a refill per pool now and then (a batch grows to 32) and the two the pool does not take, not one per event
    assert create["guest"] >= 0.9 * create["calls"], create
    assert destroy["posted"] == MADE + 4 * 150 + 1 and destroy["round_trips"] == 1, destroy  # all but the second
    # the reset context's pool was forgotten: its next event was made anew, not one made ahead for the old context
    assert rig.entries(since=mark, name="cuEventCreate"), "an event of the reset context was handed out"
