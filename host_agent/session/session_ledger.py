"""The ownership ledger of one client session: what it created on the GPU, and so the only things it may name.

A session's CUDA executor (executor.py) runs a tenant's calls in a process of its own, but the driver would
still accept any handle or device pointer that process holds, including ones a hostile client guessed. So
every handle, device ordinal and device pointer a request carries is checked here before it reaches the
driver, and what fails answers the CUDA error the driver gives for a handle it never gave out. What a call
created or gave back is recorded after it succeeded, from the call table's effects (`EFFECTS` in
ivshmem/driver_api.py), never from the call's name: a new call with declared effects needs no code here.

Kept here: the session's handles, its allocations and module/library globals, what each module or library
gave out (it goes when unloaded), where each allocation was placed, which guest ordinal is which physical
GPU, the per-function facts that go with a module (launched once, parameter layouts), and its virtual memory
(cuMemAddressReserve's ranges, cuMemCreate's physical memory and the mappings between them: `Reservations`).
Not kept here: decoding requests and calling the driver (executor.py), and what memory costs: the vGPU
quota (vgpu_quota.py) decides that, and is told of each allocation, free and possible change through `Usage`.
"""
from __future__ import annotations

from array import array
from collections.abc import Iterable, Set
from typing import Any, Protocol, Self

from ivshmem.cuda_status import INVALID_CONTEXT, INVALID_DEVICE, INVALID_HANDLE, INVALID_VALUE, SUCCESS
from ivshmem.driver_api import HANDLES, DriverCall

from .pinned_pool import HostPool
from .range_table import RangeTable

# Handles a guest may pass as 0 (NULL) meaning "the default": the legacy stream, no current context.
NULL_ALLOWED = frozenset({"CUstream", "CUcontext"})
# The streams every context has without creating them: NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD (cuda.h's
# special handles, which the driver takes anywhere a stream goes: the session's worker passes them on as given)
DEFAULT_STREAMS = frozenset({0, 1, 2})
CHECKED = HANDLES | {"CUdevice", "CUdeviceptr"}  # input types checked against what the session owns
# Handles whose calls answer CUDA_ERROR_INVALID_VALUE, not INVALID_HANDLE, for one the driver never gave out
# (cuMemRelease/cuMemMap; every cuGraph* call, as cuda.h documents)
VALUE_HANDLES = frozenset({"CUmemGenericAllocationHandle", "CUgraph", "CUgraphExec", "CUgraphNode"})


class Usage(Protocol):
    """What the ledger tells whoever counts the session's GPU memory (vgpu_quota.VgpuQuota)."""

    def allocated(self, size: int, vgpu: int | None = None) -> int:
        """An allocation of `size` bytes was made for `vgpu`, a guest ordinal (None: the current context's); the
        vGPU it counts on (-1: not told)."""
        ...

    def freed(self, vgpu: int, size: int) -> None:
        """An allocation of `size` bytes for `vgpu` was given back."""
        ...

    def may_have_changed(self) -> None:
        """The process may hold more or less GPU memory outside its allocations."""
        ...


class WatchedSet(set[int]):
    """A set of the ledger's whose every removal advances `epoch` (after it, never before): the compiled hot path
    serves a handle it has seen the ledger allow without asking the ledger again while the epoch stands still
    (hot_dispatch.c, "remembered"), so nothing may leave the set without moving it. Additions need not: what was
    allowed stays allowed. Every method by which a set loses members is overridden here."""

    __slots__ = ("epoch",)

    def __init__(self, epoch: array[int], values: Iterable[int] = ()) -> None:
        super().__init__(values)
        self.epoch = epoch

    def _moved(self) -> None:
        self.epoch[0] += 1

    def discard(self, value: object) -> None:
        super().discard(value)
        self._moved()

    def remove(self, value: int) -> None:
        super().remove(value)
        self._moved()

    def pop(self) -> int:
        value = super().pop()
        self._moved()
        return value

    def clear(self) -> None:
        super().clear()
        self._moved()

    def difference_update(self, *others: Iterable[Any]) -> None:
        super().difference_update(*others)
        self._moved()

    def intersection_update(self, *others: Iterable[Any]) -> None:
        super().intersection_update(*others)
        self._moved()

    def symmetric_difference_update(self, other: Iterable[int]) -> None:
        super().symmetric_difference_update(other)
        self._moved()

    def __isub__(self, other: Set[object]) -> Self:
        self.difference_update(other)
        return self

    def __iand__(self, other: Set[object]) -> Self:
        self.intersection_update(other)
        return self

    def __ixor__(self, other: Set[int]) -> Self:  # type: ignore[override,misc]
        self.symmetric_difference_update(other)
        return self


class SessionLedger:
    """What one session created: the only handles and device memory it may name."""

    def __init__(self, devices: tuple[int, ...], usage: Usage) -> None:
        self.devices = devices  # the physical GPU of each guest ordinal
        # advanced by every removal from `handles` and `launched` (WatchedSet) and from the range tables (RangeTable:
        # allocations, globals, reserved ranges, the page-locked pool's allocations): one unsigned 64-bit word the
        # compiled hot path reads without the GIL
        self.epoch = array("Q", [0])
        self.handles: dict[str, set[int]] = {name: WatchedSet(self.epoch) for name in HANDLES}
        self.allocations = RangeTable(self.epoch)  # base -> size (cuMemAlloc*)
        self.globals = RangeTable(self.epoch)  # base -> size (module/library globals)
        self.children: dict[int, list[tuple[str, int]]] = {}  # module/library -> what it gave
        self.placed: dict[int, int] = {}  # base -> the vGPU it counts on (cuMemAlloc*)
        self.pool: HostPool | None = None  # the session's page-locked pool slice, once its channel is attached
        self.launched: set[int] = WatchedSet(self.epoch)  # functions/kernels launched once (a first launch may load
        # code)
        self.param_layouts: dict[int, list[tuple[int, int]]] = {}  # function/kernel -> (offset, size) per param
        self.vmm = Reservations(usage, self.epoch)  # reserved ranges, physical memory, mappings (cuMemAddressReserve)
        # base -> size of each graph memory allocation node's range while its graph lives (graph_queries.py)
        self.graph_memory: dict[int, int] = {}
        # base -> size of memory another session of the region shared by legacy IPC, open here (shared_handles.py):
        # the session's to name until cuIpcCloseMemHandle, counted against the exporter's quota only
        self.imported: dict[int, int] = {}
        self._usage = usage

    @property
    def empty(self) -> bool:
        """Nothing created yet (a BIND must come before anything is)."""
        return not any(self.handles.values()) and not self.allocations and not self.vmm.reserved

    # --- the checks a request must pass ---------------------------------------------------------------------
    def check(self, call: DriverCall, position: int, ctype: str, value: int, args: tuple[int, ...]) -> int | None:
        """A CUDA error code if `value`, the input of type `ctype` at C parameter `position` of a call whose request
        values are `args`, names something this session does not own."""
        if ctype in HANDLES:
            if (value == 0 and ctype in NULL_ALLOWED) or (ctype == "CUstream" and value in DEFAULT_STREAMS):
                return None
            if value not in self.handles[ctype] and not (ctype == "CUfunction" and value in self.handles["CUkernel"]):
                if ctype in VALUE_HANDLES:  # whose calls document INVALID_VALUE for one they do not know
                    return INVALID_VALUE
                return INVALID_CONTEXT if ctype == "CUcontext" else INVALID_HANDLE  # (a CUkernel is a CUfunction)
        elif ctype == "CUdevice":
            if not 0 <= value < len(self.devices):
                return INVALID_DEVICE
        elif ctype == "CUdeviceptr":
            if "frees" in call.effects:  # freeing 0 frees nothing and succeeds, as the driver answers (cuBLAS does)
                return None if value == 0 or value in self.allocations else INVALID_VALUE
            if "reserves" in call.effects:  # an address hint, not memory: the driver never reserves over a range
                return None                 # in use, and allocators pass one to grow a range contiguously
            if "unreserves" in call.effects:  # only a whole reservation of the session, base and size
                return None if self.vmm.reserved.get(value) == args[1] else INVALID_VALUE
            if not self.owns(value, max(call.span(position, args), 1)):
                return INVALID_VALUE
        return None

    def stream_known(self, stream: int | None) -> bool:
        """Whether a call may name `stream`: one of the session's, or a default stream (DEFAULT_STREAMS); None (a
        call with no stream) too."""
        return stream is None or stream in DEFAULT_STREAMS or stream in self.handles["CUstream"]

    def ranges(self) -> tuple[dict[int, int], ...]:
        """The session's device ranges as base -> size tables: allocations, module globals, reserved virtual
        ranges (whatever is mapped there is its own physical memory; an unmapped part the driver refuses), each a
        RangeTable (searched, not scanned), then graph memory allocation nodes' ranges and memory opened by legacy
        IPC (few; scanned). The compiled hot path reads these same tables (hot_dispatch.c)."""
        return self.allocations, self.globals, self.vmm.reserved, self.graph_memory, self.imported

    def owns(self, pointer: int, size: int) -> bool:
        """Whether a device range lies in this session's memory: one of its ranges, or the device mapping of its
        page-locked host allocations."""
        for table in self.ranges():
            if isinstance(table, RangeTable):
                if table.holds(pointer, size):
                    return True
            elif any(base <= pointer and pointer + size <= base + length for base, length in table.items()):
                return True
        return self.pool is not None and self.pool.owns_device(pointer, size)

    def launchable(self, function: int, stream: int) -> int:
        """SUCCESS if the session may launch `function` (a CUkernel where a CUfunction is expected too) on
        `stream`, else INVALID_HANDLE. A function's first launch may load its code (lazy loading) or grow the
        context's local memory, so the quota is told; later launches cost one set lookup."""
        handles = self.handles
        if function not in handles["CUfunction"] and function not in handles["CUkernel"]:
            return INVALID_HANDLE
        if not self.stream_known(stream):
            return INVALID_HANDLE
        if function not in self.launched:
            self.launched.add(function)
            self._usage.may_have_changed()
        return SUCCESS

    # --- effects, after a call succeeded --------------------------------------------------------------------
    def record(self, call: DriverCall, args: tuple[int, ...], outs: list[Any], placed: int | None = None) -> None:
        """Remember what the call created or destroyed (its effects), so later calls can be checked. `placed`:
        the vGPU of the memory it made, where the call names it (cuMemCreate's location)."""
        handles = self.handles
        for ctype, value in zip(call.output_types, outs, strict=True):
            if ctype in HANDLES and value:
                handles[ctype].add(value)
        effects = call.effects
        if not effects:
            return
        if "destroys" in effects:
            handles[call.input_types[0]].discard(args[0])
            if "unloads" in effects:
                self.param_layouts.clear()  # their functions' handles may be reused
                self.launched.clear()
            for kind, value in self.children.pop(args[0], ()):  # an unloaded module's functions and globals
                if kind == "global":
                    self.globals.pop(value, None)
                else:
                    handles[kind].discard(value)
        elif "allocates" in effects:  # `placed`: a pool's vGPU, where it is not the current context's
            self.allocations[outs[0]] = args[0]
            self.placed[outs[0]] = self._usage.allocated(args[0], placed)
        elif "allocates_pitched" in effects:  # cuMemAllocPitch: (pointer, pitch) out, its rows the second input
            size = outs[1] * args[1]
            self.allocations[outs[0]] = size
            self.placed[outs[0]] = self._usage.allocated(size, placed)
        elif "frees" in effects and args[0]:
            self.forget_allocation(args[0])
        elif "child" in effects:  # (handle) or (global's base, its size), of the module or library args[0]
            if call.output_types[0] == "CUdeviceptr":
                self.globals[outs[0]] = outs[1]
                child = ("global", outs[0])
            else:
                child = (call.output_types[0], outs[0])
            self.children.setdefault(args[0], []).append(child)
        if "measures" in effects:
            self._usage.may_have_changed()
        if effects & VMM_EFFECTS:
            self.vmm.record(effects, args, outs, placed)

    def forget_allocation(self, base: int) -> None:
        """The allocation at `base` is gone (freed, or with the context it was made in): given back to the quota."""
        size = self.allocations.pop(base, 0)
        self._usage.freed(self.placed.pop(base, -1), size)


VMM_EFFECTS = frozenset({"reserves", "unreserves", "creates_physical", "releases_physical"})


class Reservations:
    """A session's virtual memory (cuMemAddressReserve, cuMemCreate, cuMemMap): the address ranges it reserved,
    the physical memory it created and which ranges map which physical memory.

    Physical memory counts against the quota from cuMemCreate until it is both released (cuMemRelease) and mapped
    nowhere: the driver frees it only then (cuMemRelease's documentation), so a release while still mapped must not
    hand its bytes back to the quota, or a guest could map far more than its quota by releasing as it goes.
    Reserved ranges cost no GPU memory and are not counted."""

    def __init__(self, usage: Usage, epoch: array[int] | None = None) -> None:
        self.reserved = RangeTable(epoch)  # base -> size (cuMemAddressReserve)
        self.physical: dict[int, tuple[int, int]] = {}  # handle -> (size, its vGPU) until given back
        self.released: set[int] = set()  # handles released (cuMemRelease) while still mapped
        self.mappings: dict[int, tuple[int, int]] = {}  # mapped address -> (size, handle) (cuMemMap)
        self.retained: dict[int, int] = {}  # handle -> references cuMemRetainAllocationHandle added, not released
        self._usage = usage

    def reservation_holds(self, pointer: int, size: int) -> bool:
        """Whether [pointer, pointer + size) lies inside one of the session's reserved ranges (size > 0)."""
        return size > 0 and self.reserved.holds(pointer, size)

    def record(self, effects: frozenset[str], args: tuple[int, ...], outs: list[Any], placed: int | None) -> None:
        """The table's virtual-memory effects of a call that succeeded (EFFECTS in ivshmem/driver_api.py)."""
        if "reserves" in effects:
            self.reserved[outs[0]] = args[0]
        elif "unreserves" in effects:
            size = self.reserved.pop(args[0], 0)
            self.unmapped(args[0], size)  # nothing can stay mapped in a range that is gone
        elif "creates_physical" in effects:
            self.physical[outs[0]] = (args[0], self._usage.allocated(args[0], placed))
        if "releases_physical" in effects:
            self.released.add(args[0])
            self._give_back_unmapped(args[0])

    def mapped(self, pointer: int, size: int, handle: int) -> None:
        """cuMemMap succeeded: [pointer, pointer + size) maps `handle`'s memory."""
        self.mappings[pointer] = (size, handle)

    def unmapped(self, pointer: int, size: int) -> None:
        """cuMemUnmap (or cuMemAddressFree) succeeded over [pointer, pointer + size): the mappings inside are gone,
        and released physical memory mapped nowhere else any more is given back to the quota."""
        end = pointer + size
        gone = [base for base, (length, _h) in self.mappings.items() if pointer <= base and base + length <= end]
        handles = {self.mappings.pop(base)[1] for base in gone}
        for handle in handles:
            self._give_back_unmapped(handle)

    def _give_back_unmapped(self, handle: int) -> None:
        if handle in self.released and not any(h == handle for _s, h in self.mappings.values()):
            self.released.discard(handle)
            if handle in self.physical:
                size, vgpu = self.physical.pop(handle)
                self._usage.freed(vgpu, size)
