"""The session ledger's virtual-memory effects (host_agent/session/session_ledger.py: SessionLedger and Reservations),
driven by the call table's effects as the executor drives them: what a session reserved, created and mapped is the
only virtual memory it may name, and physical memory counts against its quota until released and mapped nowhere."""
from __future__ import annotations

from host_agent.session.session_ledger import SessionLedger
from ivshmem.cuda_status import INVALID_HANDLE, INVALID_VALUE
from ivshmem.driver_api import CALLS

MIB = 1 << 20
BASE = 0x7F20_0000_0000
HANDLE = 0x1234


class Usage:
    """Records what the ledger tells the quota."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, int]] = []

    def allocated(self, size: int, device: int | None = None) -> int:
        self.events.append(("allocated", -1 if device is None else device, size))
        return 7 if device is None else device

    def freed(self, device: int, size: int) -> None:
        self.events.append(("freed", device, size))

    def may_have_changed(self) -> None:
        self.events.append(("changed", 0, 0))


def ledger() -> tuple[SessionLedger, Usage]:
    usage = Usage()
    return SessionLedger((2, 0), usage), usage


def reserve(book: SessionLedger, size: int = 8 * MIB, base: int = BASE) -> None:
    call = CALLS["cuMemAddressReserve"]
    args = (size, 0, 0, 0)
    assert book.check(call, 3, "CUdeviceptr", 0, args) is None
    book.record(call, args, [base])


def create(book: SessionLedger, size: int = 4 * MIB, handle: int = HANDLE, device: int = 2) -> None:
    book.record(CALLS["cuMemCreate"], (size, 0), [handle], placed=device)


def release(book: SessionLedger, handle: int = HANDLE) -> None:
    call = CALLS["cuMemRelease"]
    assert book.check(call, 0, "CUmemGenericAllocationHandle", handle, (handle,)) is None
    book.record(call, (handle,), [])


def test_a_reserved_range_is_the_sessions_memory_until_freed_whole() -> None:
    book, usage = ledger()
    assert book.empty
    reserve(book)
    assert not book.empty  # a BIND must come before it
    assert book.owns(BASE, 8 * MIB) and book.owns(BASE + 4 * MIB, 16)
    assert not book.owns(BASE + 8 * MIB - 1, 2) and not book.owns(BASE - 1, 1)
    assert usage.events == []  # address space costs no GPU memory
    free = CALLS["cuMemAddressFree"]
    assert book.check(free, 0, "CUdeviceptr", BASE, (BASE, 4 * MIB)) == INVALID_VALUE  # not the whole reservation
    assert book.check(free, 0, "CUdeviceptr", BASE + 2 * MIB, (BASE + 2 * MIB, 6 * MIB)) == INVALID_VALUE
    assert book.check(free, 0, "CUdeviceptr", 0x1000, (0x1000, 8 * MIB)) == INVALID_VALUE  # never reserved
    assert book.check(free, 0, "CUdeviceptr", BASE, (BASE, 8 * MIB)) is None
    book.record(free, (BASE, 8 * MIB), [])
    assert not book.owns(BASE, 1) and book.vmm.reserved == {}
    assert book.check(free, 0, "CUdeviceptr", BASE, (BASE, 8 * MIB)) == INVALID_VALUE  # twice: gone


def test_the_reservation_hint_is_not_checked_as_memory() -> None:
    """cuMemAddressReserve's fourth parameter is only where the guest would like the range: not owned memory."""
    book, _usage = ledger()
    call = CALLS["cuMemAddressReserve"]
    assert book.check(call, 3, "CUdeviceptr", 0x7F99_0000_0000, (MIB, 0, 0x7F99_0000_0000, 0)) is None
    # ... while any other call naming that address is refused
    assert book.check(CALLS["cuMemcpyDtoD"], 0, "CUdeviceptr", 0x7F99_0000_0000, (0x7F99_0000_0000, 0, 8)) == \
        INVALID_VALUE


def test_physical_memory_counts_on_the_gpu_it_was_created_on_until_released() -> None:
    book, usage = ledger()
    create(book, 4 * MIB, HANDLE, device=0)
    assert HANDLE in book.handles["CUmemGenericAllocationHandle"]
    assert usage.events == [("allocated", 0, 4 * MIB)]
    release(book)
    assert usage.events[-1] == ("freed", 0, 4 * MIB)
    assert HANDLE not in book.handles["CUmemGenericAllocationHandle"] and book.vmm.physical == {}


def test_released_memory_still_mapped_stays_counted_until_unmapped() -> None:
    """The driver frees it only when no range maps it: giving it back at cuMemRelease would let a guest map past
    its quota by releasing as it goes."""
    book, usage = ledger()
    reserve(book)
    create(book, 4 * MIB, HANDLE, device=2)
    book.vmm.mapped(BASE, 2 * MIB, HANDLE)
    book.vmm.mapped(BASE + 2 * MIB, 2 * MIB, HANDLE)  # one allocation, mapped twice
    release(book)
    assert [e for e in usage.events if e[0] == "freed"] == []
    book.vmm.unmapped(BASE, 2 * MIB)
    assert [e for e in usage.events if e[0] == "freed"] == []  # still mapped at the second range
    book.vmm.unmapped(BASE + 2 * MIB, 2 * MIB)
    assert usage.events[-1] == ("freed", 2, 4 * MIB)
    assert book.vmm.physical == {} and book.vmm.mappings == {}


def test_freeing_a_reservation_drops_its_mappings() -> None:
    book, usage = ledger()
    reserve(book)
    create(book, 2 * MIB)
    book.vmm.mapped(BASE + 2 * MIB, 2 * MIB, HANDLE)
    release(book)
    book.record(CALLS["cuMemAddressFree"], (BASE, 8 * MIB), [])
    assert book.vmm.mappings == {} and usage.events[-1] == ("freed", 2, 2 * MIB)


def test_a_handle_the_session_never_created_is_invalid_value() -> None:
    """cuMemRelease and cuMemMap document CUDA_ERROR_INVALID_VALUE for a handle they do not know."""
    book, _usage = ledger()
    create(book)
    for call, position in (("cuMemRelease", 0), ("cuMemMap", 3)):
        handle_type = "CUmemGenericAllocationHandle"
        assert book.check(CALLS[call], position, handle_type, HANDLE + 16, ()) == INVALID_VALUE
        assert book.check(CALLS[call], position, handle_type, 0, ()) == INVALID_VALUE
    assert book.check(CALLS["cuStreamDestroy"], 0, "CUstream", 99, (99,)) == INVALID_HANDLE  # others unchanged
    release(book)
    assert book.check(CALLS["cuMemRelease"], 0, "CUmemGenericAllocationHandle", HANDLE, (HANDLE,)) == INVALID_VALUE


def test_a_range_must_lie_inside_one_reservation() -> None:
    book, _usage = ledger()
    reserve(book, 4 * MIB, BASE)
    reserve(book, 4 * MIB, BASE + 4 * MIB)  # adjacent, but another reservation
    holds = book.vmm.reservation_holds
    assert holds(BASE, 4 * MIB) and holds(BASE + 2 * MIB, 2 * MIB) and holds(BASE + 4 * MIB, 4 * MIB)
    assert not holds(BASE + 2 * MIB, 4 * MIB)  # across the two
    assert not holds(BASE, 0)
    assert not holds(BASE - 2 * MIB, 4 * MIB) and not holds(0, 1)
