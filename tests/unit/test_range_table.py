"""host_agent/session/range_table.py: a dict of device ranges whose sorted bases stay in step with it, so that
`holds` answers what a scan of every range answers."""
from __future__ import annotations

import random

import pytest

from host_agent.session.range_table import RangeTable


def scan(table: dict[int, int], pointer: int, size: int) -> bool:
    return any(base <= pointer and pointer + size <= base + length for base, length in table.items())


def test_random_insertions_and_removals_keep_the_bases_sorted_and_holds_equal_to_a_scan() -> None:
    rng = random.Random(30)
    table, reference = RangeTable(), {}
    for step in range(3000):
        base = rng.randrange(0, 1 << 20, 256)  # disjoint slots of 256 bytes: ranges that never overlap
        if rng.random() < 0.6:
            table[base] = reference[base] = rng.randrange(1, 257)
        elif rng.random() < 0.5:
            assert table.pop(base, None) == reference.pop(base, None)
        elif base in reference:
            del table[base], reference[base]
        if step % 1000 == 999:
            table.clear(), reference.clear()
        assert table.bases == sorted(reference) and table == reference
        pointer = rng.randrange(0, (1 << 20) + 512)
        size = rng.choice([0, 1, 4, 100, 256])
        assert table.holds(pointer, size) == scan(reference, pointer, size), (pointer, size)


def test_mutations_that_would_bypass_the_bases_are_refused() -> None:
    table = RangeTable()
    table[0x1000] = 16
    for mutate in (lambda: table.update({1: 2}), lambda: table.setdefault(3, 4), table.popitem,
                   lambda: table.__ior__({5: 6})):
        with pytest.raises(TypeError, match="sorted bases"):
            mutate()
    assert table == {0x1000: 16} and table.bases == [0x1000]
    with pytest.raises(KeyError):
        table.pop(0x2000)
    assert table.holds(0x1000, 16) and not table.holds(0x1000, 17) and not table.holds(0xFFF, 1)
