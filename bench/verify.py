"""Result checks shared by the benchmarks (issue 26, "never a wrong answer"). Not a benchmark.

A benchmark that times a copy or a workload also says what it got: a digest of the bytes a copy delivered, or the
values a workload computed. `Checks` compares that with what the native (or baseline) run of the same measure got,
and gives the ratio only when they agree; otherwise it prints `WRONG RESULT: <measure> differs from <baseline>
(...); no ratio`, and the benchmark's exit status (`Checks.exit_status`) is 1. A speed of a wrong answer is not a
speed. `pattern` is the source data copy benchmarks move: never all zeros, and not periodic at any power-of-two
chunk size, so neither a copy that moved nothing nor one that moved the wrong chunk can look right.

What does not belong here: timing, tables, or anything that knows a particular benchmark; each benchmark decides
what its result is and where its ratios go.
"""
from __future__ import annotations

import hashlib
import math
import random
import sys
from collections.abc import Iterable
from typing import Any

# pattern()'s period: a prime, so two chunks of a power-of-two size at different offsets (fewer than PERIOD
# chunks apart) never hold the same bytes: a chunk delivered to the wrong place shows.
PERIOD = 65521


def pattern(length: int, seed: int = 1) -> bytes:
    """`length` bytes drawn from `seed` (the same in every process: a native and a forwarded run compare them),
    never all zeros; pattern(n, s)[:m] == pattern(m, s)."""
    block = random.Random(seed).randbytes(PERIOD)
    return (block * (length // PERIOD + 1))[:length]


def digest(data: Any) -> str:
    """A short name for some bytes (anything with the buffer protocol): the first 16 hex digits of their SHA-256."""
    return hashlib.sha256(data).hexdigest()[:16]


def agree(expected: object, got: object, rel_tol: float | None = None) -> bool:
    """Whether `got` is `expected`: equal, or for two numbers with `rel_tol`, within that relative tolerance (only
    where floating-point nondeterminism needs one). A missing result (None) never agrees."""
    if got is None or expected is None:
        return False
    if rel_tol is not None and isinstance(got, int | float) and isinstance(expected, int | float):
        return math.isclose(got, expected, rel_tol=rel_tol)
    return got == expected


def first_wrong(results: Iterable[object], expected: object) -> object:
    """The first of `results` (what each of many timed calls got) that is not `expected`, else the last one; None
    for none. What a run of calls got, for `Checks.same`."""
    last = None
    for last in results:
        if last != expected:
            return last
    return last


class Checks:
    """The result checks of one benchmark run: each measure's result against its baseline's, the wrong ones kept
    for the exit status."""

    def __init__(self) -> None:
        self.wrong: list[str] = []

    def same(self, measure: str, expected: object, got: object, against: str = "native",
             rel_tol: float | None = None) -> bool:
        """Whether `measure`'s result `got` agrees with `expected`, the result of `against` (the native run, the
        baseline, the known pattern); if not, says so in one line and counts it."""
        if agree(expected, got, rel_tol):
            return True
        self.wrong.append(measure)
        print(f"WRONG RESULT: {measure} differs from {against} (got {got!r}, {against} {expected!r}); no ratio",
              flush=True)
        return False

    def ratio(self, measure: str, numerator: float, denominator: float, expected: object, got: object,
              against: str = "native", rel_tol: float | None = None, form: str = "{:.2f}") -> str:
        """`numerator / denominator` formatted with `form` when `got` agrees with `expected` (see `same`);
        "WRONG" otherwise, the reason printed on a line of its own."""
        if not self.same(measure, expected, got, against, rel_tol):
            return "WRONG"
        return form.format(numerator / denominator)

    def exit_status(self, status: int = 0) -> int:
        """`status`, or 1 (after one line naming them) when any result was wrong."""
        if not self.wrong:
            return status
        print(f"{len(self.wrong)} wrong result(s), no ratio printed for: {'; '.join(self.wrong)}", file=sys.stderr)
        return status or 1
