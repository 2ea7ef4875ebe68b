"""The device memory this process was given, so that cuMemcpy with unified addressing knows where a pointer lies.

Natively the driver tells a device pointer from a host one; forwarded, a device pointer is only a number the
host handed this process. cuMemcpy and cuMemcpyAsync (forward.py) pick HtoD, DtoH or DtoD from where each
pointer lies, so the guest remembers every range a cuMemAlloc* or a module or library global gave it, and
forgets an allocation when it is freed. Whether the session may use a pointer is the host's check, not this
module's: a pointer not listed here is treated as host memory.
"""
from __future__ import annotations


class DeviceRanges:
    """Base -> size of each device range this process got."""

    def __init__(self) -> None:
        self._ranges: dict[int, int] = {}

    def add(self, base: int, size: int) -> None:
        """An allocation or a global of `size` bytes at `base`."""
        self._ranges[base] = size

    def discard(self, base: int) -> None:
        """The allocation at `base` was freed (nothing if it was never listed)."""
        self._ranges.pop(base, None)

    def contains(self, pointer: int) -> bool:
        """Whether `pointer` lies in device memory this process allocated or a module global it looked up."""
        return any(base <= pointer < base + size for base, size in self._ranges.items())

    def holds(self, pointer: int, size: int) -> bool:
        """Whether all `size` bytes from `pointer` lie in one such range (a copy there cannot miss it)."""
        return any(base <= pointer and pointer + size <= base + length for base, length in self._ranges.items())
