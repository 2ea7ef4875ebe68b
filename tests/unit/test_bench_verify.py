"""bench/verify.py, the benchmarks' result check (issue 26, "never a wrong answer"): a ratio is given only when the
measured run's result is the baseline's; a different one is said in a WRONG RESULT line, gives no ratio, and turns
the benchmark's exit status to 1. And the pattern copy benchmarks move cannot let a wrong copy look right.

No benchmark runs here, and nothing is timed.
"""
from __future__ import annotations

import pytest

from bench.verify import PERIOD, Checks, agree, digest, first_wrong, pattern


def test_an_equal_digest_gives_the_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    checks = Checks()
    same = digest(b"the bytes the native run read back")
    assert checks.ratio("HtoD 64 MiB GB/s", 3.0, 4.0, same, same) == "0.75"
    assert checks.wrong == []
    assert "WRONG" not in capsys.readouterr().out
    assert checks.exit_status() == 0


def test_a_different_digest_gives_no_ratio_and_a_failing_exit(capsys: pytest.CaptureFixture[str]) -> None:
    checks = Checks()
    native, forwarded = digest(b"\x04\x03\x02\x01"), digest(bytes(4))  # zeros with CUDA_SUCCESS
    cell = checks.ratio("pinned 4-byte DtoH us", 9.0, 3.0, native, forwarded, against="native")
    assert cell == "WRONG"  # not a number: no ratio
    said = capsys.readouterr().out
    assert said.startswith("WRONG RESULT: pinned 4-byte DtoH us differs from native")
    assert forwarded in said and native in said and said.rstrip().endswith("no ratio")
    assert "3.00" not in said
    assert checks.wrong == ["pinned 4-byte DtoH us"]
    assert checks.exit_status() == 1
    assert checks.exit_status(2) == 2  # a benchmark's own failure stays what it was
    assert "pinned 4-byte DtoH us" in capsys.readouterr().err


def test_a_missing_result_is_never_right() -> None:
    checks = Checks()
    assert not checks.same("workload ms", digest(b"x"), None)
    assert not agree(None, None)
    assert checks.exit_status() == 1


def test_a_tolerance_only_where_it_is_asked_for() -> None:
    assert not agree(2.302585, 2.302586)  # exact by default
    assert agree(2.302585, 2.302586, rel_tol=1e-3)
    assert not agree(2.302585, 2.4, rel_tol=1e-3)
    assert not agree("a1b2", "a1b3", rel_tol=1e-3)  # digests are compared exactly whatever the tolerance


def test_first_wrong_is_what_a_run_of_calls_got() -> None:
    assert first_wrong(["ok", "ok", "ok"], "ok") == "ok"
    assert first_wrong(["ok", "zeros", "other", "ok"], "ok") == "zeros"  # a later right answer hides nothing
    assert first_wrong([], "ok") is None


def test_the_pattern_cannot_pass_for_no_copy_or_a_misplaced_chunk() -> None:
    data = pattern(4 << 20)
    assert data == pattern(4 << 20) and pattern(1 << 20) == data[:1 << 20]  # the same in every process
    assert pattern(1 << 20, seed=2) != data[:1 << 20]
    assert any(data) and all(any(pattern(4, seed)) for seed in range(64))  # never all zeros
    for chunk in (4096, 128 << 10, 512 << 10):  # staging chunk sizes: no chunk holds another's bytes
        pieces = [data[at:at + chunk] for at in range(0, len(data), chunk)]
        assert len(set(pieces)) == len(pieces)
    assert data[:64] == data[PERIOD:PERIOD + 64]  # (its period, a prime: no power of two divides it)
