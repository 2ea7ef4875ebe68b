#!/usr/bin/env python3
"""The session's memory check against how many allocations it holds, on any machine. Not a test.

Every copy, memset and stream-memory write a session makes is checked against the session's device ranges
(SessionLedger.owns, and the compiled hot path's owns_memory in host_agent/session/hot_dispatch.c). The ranges used to
be scanned, O(n) in the allocations the program holds, under the GIL; now allocations, globals and reserved ranges
are RangeTables (host_agent/session/range_table.py) searched by their sorted bases. This times one posted 4-byte
cuMemsetD8Async served by the compiled path (a client Endpoint in Python queues 32, the hot path serves them) with
N live allocations, the probe in the middle one, both ways in one run: the tables as plain dicts (the scan, the
baseline) and as RangeTables. Then the same for one posted page-locked 4-byte cuMemcpyHtoDAsync from the middle one
of N page-locked allocations (HostPool.allocations, which hot_dispatch.c's pinned_host searches, or a plain dict
it scans). The driver is tests.fake_driver.FakeDriver with its memset and async copy replaced by null ones, so the
figures are the check's and the wire's, not a driver's.

The result is checked before a ratio prints: every memset of both runs must be served in C and answered SUCCESS
(no asynchronous error came back), and a memset one byte past the allocations' end must be refused by both
(INVALID_VALUE), or a WRONG RESULT line, no ratio, exit status 1; for the page-locked copies, every one served in C
and none answered with an error, and one from past the allocations refused by both.

Run: `.venv/bin/python bench/ledger_bench.py [--allocations 10 1000 5000] [--page-locked 10 1000 2500]`.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ivshmem.cuda_status import INVALID_VALUE, SUCCESS  # noqa: E402
from ivshmem.driver_api import CALLS, PINNED_COPY  # noqa: E402
from ivshmem.record import Flag  # noqa: E402
from tests.fake_driver import CUresult, FakeDriver  # noqa: E402
from tests.unit.test_hot_dispatch import Served, setup_session  # noqa: E402

BATCH, BATCHES, ROUNDS, SIZE = 32, 20, 5, 256


def null_call(self: FakeDriver, *args: object) -> tuple[object, ...]:
    return (CUresult.CUDA_SUCCESS,)


def best_of_rounds(s: Served, send: Callable[[], None]) -> tuple[float, str]:
    """(µs per posted record sent by `send`, the best of ROUNDS; "" or what was wrong)."""
    assert s.hot is not None
    served, best = s.hot.served, float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter()
        for _ in range(BATCHES):
            for _ in range(BATCH):
                send()
            if s.serve():
                return 0.0, "a posted record came back with an asynchronous error"
        best = min(best, (time.perf_counter() - started) / (BATCH * BATCHES) * 1e6)
    if s.hot.served - served != ROUNDS * BATCHES * BATCH:
        return 0.0, f"{ROUNDS * BATCHES * BATCH - (s.hot.served - served)} records were not served in C"
    return best, ""


def timed(allocations: int, scanned: bool) -> tuple[float, str]:
    """(µs per posted memset with `allocations` device allocations, the best of ROUNDS; "" or what was wrong)."""
    s = Served(True)
    try:
        setup_session(s)
        bases = [s.call("cuMemAlloc", SIZE)[0] for _ in range(allocations)]
        if scanned:  # the tables as they were: plain dicts, which both paths scan
            s.executor.ledger.allocations = dict(s.executor.ledger.allocations)  # type: ignore[assignment]
        probe = bases[allocations // 2]
        best, wrong = best_of_rounds(s, lambda: s.request("cuMemsetD8Async", probe, 7, 4, 0, posted=True))
        if wrong:
            return 0.0, wrong
        s.request("cuMemsetD8Async", max(bases) + SIZE, 7, 4, 0)  # past every allocation
        s.request("cuMemsetD8Async", probe + SIZE - 4, 7, 4, 0)  # its last 4 bytes
        statuses = [reply[2] for reply in s.serve()]
        if statuses != [INVALID_VALUE, SUCCESS]:
            return 0.0, f"past the end / the last bytes answered {statuses}, not [{INVALID_VALUE}, {SUCCESS}]"
        return best, ""
    finally:
        s.close()


def timed_page_locked(allocations: int, scanned: bool) -> tuple[float, str]:
    """(µs per posted page-locked 4-byte copy with `allocations` page-locked allocations; "" or what was wrong)."""
    s = Served(True)
    try:
        h = setup_session(s)
        pinned = [s.call("cuMemAllocHost", 4096)[0] for _ in range(allocations)]
        pool = s.executor.pool
        assert pool is not None
        copy = CALLS["cuMemcpyHtoDAsync"]
        assert copy.pinned is not None
        s.send(copy.opcode | PINNED_COPY, bytes(copy.pinned.encode(h["a"], 4, 0, max(pinned) + 4096)))
        statuses = [reply[2] for reply in s.serve()]  # (before the baseline's dict, which only C can read)
        if statuses != [INVALID_VALUE]:
            return 0.0, f"a copy from past the allocations answered {statuses}, not [{INVALID_VALUE}]"
        if scanned:  # the pool's allocations as a plain dict, which the compiled path scans
            pool.allocations = dict(pool.allocations)  # type: ignore[assignment]
        request = bytes(copy.pinned.encode(h["a"], 4, 0, pinned[allocations // 2]))
        return best_of_rounds(s, lambda: s.send(copy.opcode | PINNED_COPY, request, Flag.NO_REPLY))
    finally:
        s.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allocations", type=int, nargs="+", default=[10, 1000, 5000])
    parser.add_argument("--page-locked", type=int, nargs="+", default=[10, 1000, 2500])
    args = parser.parse_args(argv)
    FakeDriver.cuMemsetD8Async = null_call  # type: ignore[method-assign]
    FakeDriver.cuMemcpyHtoDAsync = null_call  # type: ignore[method-assign]
    print(f"{platform.node()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    wrong = False
    for what, counts, run in (("device allocations, posted 4-byte memset", args.allocations, timed),
                              ("page-locked allocations, posted 4-byte copy", args.page_locked, timed_page_locked)):
        print(f"{what}:\n{'allocations':>11} | {'scanned µs':>10} | {'searched µs':>11} | searched/scanned")
        for n in counts:
            scanned, why_scanned = run(n, True)
            searched, why_searched = run(n, False)
            if why_scanned or why_searched:
                print(f"WRONG RESULT: {n} allocations: {why_scanned or why_searched}; no ratio")
                wrong = True
                continue
            print(f"{n:>11} | {scanned:>10.2f} | {searched:>11.2f} | {searched / scanned:.2f}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
