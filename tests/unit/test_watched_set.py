"""session_ledger.WatchedSet: the ledger's handle sets and its `launched` set, whose every removal advances the
ledger's epoch, after the removal (the compiled hot path forgets what it remembered of them when the epoch moves:
hot_dispatch.c). An addition leaves the epoch as it was."""
from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import pytest

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
