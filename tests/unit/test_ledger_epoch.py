"""The session ledger's epoch: every removal from its handle sets and `launched` (session_ledger.WatchedSet) and from
its range tables and the page-locked pool's (range_table.RangeTable) advances it, after the removal; the compiled
hot path forgets what it remembered of them when it moves (hot_dispatch.c). An addition leaves it as it was."""
from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import pytest

from host_agent.session.range_table import RangeTable
from host_agent.session.session_ledger import SessionLedger, WatchedSet
from ivshmem.driver_api import HANDLES
from tests.unit.test_vmm_ledger import Usage


def _isub(s: Any) -> None:
    s -= {1}


def _iand(s: Any) -> None:
    s &= {2, 3}


def _ixor(s: Any) -> None:
    s ^= {1, 9}


REMOVALS: dict[str, Callable[[Any], object]] = {
    "discard": lambda s: s.discard(1), "remove": lambda s: s.remove(1), "pop": lambda s: s.pop(),
    "clear": lambda s: s.clear(), "difference_update": lambda s: s.difference_update({1}),
    "intersection_update": lambda s: s.intersection_update({2, 3}),
    "symmetric_difference_update": lambda s: s.symmetric_difference_update({1, 9}),
    "-=": _isub, "&=": _iand, "^=": _ixor,
}


@pytest.mark.parametrize("how", sorted(REMOVALS))
def test_every_removal_advances_the_epoch_and_the_set_is_still_watched(how: str) -> None:
    epoch = array("Q", [5])
    watched = WatchedSet(epoch, {1, 2, 3})
    REMOVALS[how](watched)
    assert epoch[0] == 6
    assert isinstance(watched, WatchedSet)  # an in-place operator keeps it the watched set
    watched.discard(2)
    assert epoch[0] == 7


def test_an_addition_leaves_the_epoch_as_it_was() -> None:
    epoch = array("Q", [0])
    watched = WatchedSet(epoch)
    watched.add(4)
    watched |= {5}
    watched.update({6})
    assert epoch[0] == 0 and watched == {4, 5, 6}


def test_the_ledgers_handle_sets_and_launched_share_its_epoch() -> None:
    ledger = SessionLedger((0,), Usage())
    sets = [*ledger.handles.values(), ledger.launched]
    assert set(ledger.handles) == set(HANDLES)
    assert all(isinstance(s, WatchedSet) and s.epoch is ledger.epoch for s in sets)
    ledger.handles["CUstream"].add(7)
    ledger.handles["CUstream"].discard(7)
    assert ledger.epoch[0] == 1


TABLE_CHANGES: dict[str, Callable[[RangeTable], object]] = {
    "del": lambda t: t.__delitem__(0x1000), "pop": lambda t: t.pop(0x1000), "clear": lambda t: t.clear(),
    "a size set again": lambda t: t.__setitem__(0x1000, 16),
}


@pytest.mark.parametrize("how", sorted(TABLE_CHANGES))
def test_a_range_that_goes_or_changes_advances_the_epoch_and_a_new_one_does_not(how: str) -> None:
    epoch = array("Q", [0])
    table = RangeTable(epoch)
    table[0x1000] = 256
    table[0x4000] = 64
    assert epoch[0] == 0
    TABLE_CHANGES[how](table)
    assert epoch[0] == 1
    assert table.bases == sorted(table)


def test_the_ledgers_range_tables_share_its_epoch() -> None:
    ledger = SessionLedger((0,), Usage())
    for table in (ledger.allocations, ledger.globals, ledger.vmm.reserved):
        assert table.epoch is ledger.epoch
    ledger.allocations[0x10000] = 4096
    ledger.forget_allocation(0x10000)
    assert ledger.epoch[0] == 1
