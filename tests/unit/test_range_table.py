"""host_agent/session/range_table.py: a dict of device ranges whose sorted bases stay in step with it, so that
`holds` answers what a scan of every range answers."""
from __future__ import annotations

import random

import pytest

from host_agent.session.pinned_pool import HostPool
from host_agent.session.range_table import RangeTable
from ivshmem.layout import PAGE, Geometry
from ivshmem.region import Region


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


def test_the_page_locked_pools_allocations_are_found_and_placed_as_by_a_scan(region_path: str) -> None:
    """HostPool keeps its allocations in a RangeTable (pinned_pool.py): every lookup a page-locked copy makes
    (host_address, owns_device, flags, allocation_of) answers what a scan of its allocations answers, and first fit
    places each new allocation where a scan in address order would, through random allocations and frees."""
    rng = random.Random(31)
    with Region.open(region_path) as region:
        region.format(Geometry.build(region.size))
        pool = HostPool(region, 1)
        assert pool.map(pool.own_address)[0] == 0
        live: dict[int, tuple[int, int]] = {}  # guest pointer -> (size, flags)
        for _ in range(600):
            if live and rng.random() < 0.4:
                pointer = rng.choice(sorted(live))
                assert pool.free(pointer) == 0
                del live[pointer]
                assert pool.free(pointer) != 0  # twice: refused
                continue
            size, flags = rng.choice([1, 100, PAGE, PAGE + 1, 3 * PAGE, 40_000]), rng.randrange(0, 8)
            expected = first_fit(live, pool.guest_base, size, pool.size)
            status, pointer = pool.allocate(size, flags, None)
            assert (status == 0) == (expected is not None) and (expected is None or pointer == expected)
            if status == 0:
                live[pointer] = (size, flags)
            probe = rng.randrange(pool.guest_base - PAGE, pool.guest_base + pool.size)
            width = rng.choice([1, 8, PAGE])
            holder = next((p for p, (n, _) in live.items() if p <= probe and probe + width <= p + n), None)
            assert pool.host_address(probe, width) == (None if holder is None else
                                                        pool.host_base + probe - pool.guest_base)
            assert pool.flags(probe) == next((f for p, (n, f) in live.items() if p <= probe < p + n), None)
        assert pool.allocations.bases == sorted(p - pool.guest_base for p in live)


def first_fit(live: dict[int, tuple[int, int]], base: int, size: int, capacity: int) -> int | None:
    """The pool's rule, by a scan: the lowest page-aligned gap that holds `size` rounded up to pages."""
    rounded, start = -(-size // PAGE) * PAGE, 0
    for pointer in sorted(live):
        if pointer - base - start >= rounded:
            break
        start = pointer - base + -(-live[pointer][0] // PAGE) * PAGE
    return None if start + rounded > capacity else base + start
