"""A session's device ranges of one kind (base -> size) that answer "which range holds this pointer" in O(log n).

Why: every copy, memset and stream-memory write a session makes is checked against its ranges (SessionLedger.owns,
and the compiled hot path's owns_memory in hot_dispatch.c, which binary-searches `bases` itself). A scan of every
range cost O(n) under the GIL per call: a program that holds a thousand allocations (numba's device arrays, a large
model's weights, each its own segment) paid microseconds to tens of microseconds on every small copy.

A table is a dict (base -> size), so what reads one as a dict (iteration, `in`, get) is unchanged; its mutations
keep `bases`, the sorted keys, in step, and those that would bypass it (update, setdefault, popitem, |=) are refused.
The live ranges of one table never overlap (the driver does not hand out one address twice), so the range that can
hold a pointer is the one with the greatest base at or below it. A table given the ledger's epoch advances it after
every change that can take a pointer out of it (a range deleted, or its size set again): the compiled hot path
remembers the ranges it found pointers in only while the epoch stands still (hot_dispatch.c).

Not here: what the ranges are (session_ledger.py) and what they cost (vgpu_quota.py).
"""
from __future__ import annotations

import bisect
from array import array
from typing import Any, NoReturn


class RangeTable(dict[int, int]):
    """base -> size, with the bases kept sorted for `holds`."""

    __slots__ = ("bases", "epoch")

    def __init__(self, epoch: array[int] | None = None) -> None:
        super().__init__()
        self.bases: list[int] = []  # sorted; read by hot_dispatch.c (owns_range)
        self.epoch = epoch  # advanced after a range goes or changes (SessionLedger.epoch), or None

    def _moved(self) -> None:
        if self.epoch is not None:
            self.epoch[0] += 1

    def __setitem__(self, base: int, size: int) -> None:
        changed = base in self
        if not changed:
            bisect.insort(self.bases, base)
        super().__setitem__(base, size)
        if changed:
            self._moved()

    def __delitem__(self, base: int) -> None:
        super().__delitem__(base)
        del self.bases[bisect.bisect_left(self.bases, base)]
        self._moved()

    def pop(self, base: int, *default: Any) -> Any:  # type: ignore[override]
        if base in self:
            size = self[base]
            del self[base]
            return size
        if default:
            return default[0]
        raise KeyError(base)

    def clear(self) -> None:
        super().clear()
        self.bases.clear()
        self._moved()

    def holder(self, pointer: int, size: int) -> int | None:
        """The base of the range [pointer, pointer + size) lies inside, or None."""
        at = bisect.bisect_right(self.bases, pointer) - 1
        if at < 0:
            return None
        base = self.bases[at]
        return base if pointer + size <= base + super().__getitem__(base) else None

    def holds(self, pointer: int, size: int) -> bool:
        """Whether [pointer, pointer + size) lies inside one range."""
        return self.holder(pointer, size) is not None

    def _refused(self, *_args: Any, **_kwargs: Any) -> NoReturn:
        raise TypeError("RangeTable keeps its sorted bases through item assignment, del and pop only")

    update = setdefault = popitem = __ior__ = _refused  # type: ignore[assignment]
