"""Module enumeration and names, and the device queries that carry arrays or bytes, as the host serves them: a mixin
of executor.CudaExecutor, registered on the host's HOST handlers (call_registry.py).

* cuModuleEnumerateFunctions / cuLibraryEnumerateKernels: the module or library must be the session's (else
  INVALID_HANDLE, as cuModuleGetFunction answers); every handle the driver gives becomes the session's and its owner's
  child, exactly as cuModuleGetFunction's or cuLibraryGetKernel's would (so an unload forgets them). More than
  MAX_ITEMS asked is a malformed request (the guest asks for at most its array's length).
* cuFuncGetName / cuKernelGetName: the function or kernel must be the session's (INVALID_HANDLE; NULL:
  INVALID_VALUE, as cuda.h documents); the name travels as its bytes.
* cuDeviceGetLuid, cuDeviceGetHostAtomicCapabilities, cuDeviceGetP2PAtomicCapabilities: each device is the guest's
  ordinal, mapped to the session's physical GPU (another ordinal answers INVALID_DEVICE, before the driver); an
  operation the driver's CUatomicOperation lacks answers INVALID_VALUE.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ivshmem.cuda_status import INVALID_DEVICE, INVALID_HANDLE, INVALID_VALUE, SUCCESS
from ivshmem.driver_api import CALLS, DriverCall
from ivshmem.record import Status

from ..handler import Reply
from .call_registry import HOST
from .vmm_calls import CU_MEM_LOCATION_TYPE_DEVICE

if TYPE_CHECKING:
    from .session_ledger import SessionLedger

MAX_ITEMS = 1 << 16  # guest_runtime/native/module_queries.c MAX_ITEMS
_CHILD_OF = {"cuModuleEnumerateFunctions": ("CUmodule", CALLS["cuModuleGetFunction"]),
             "cuLibraryEnumerateKernels": ("CUlibrary", CALLS["cuLibraryGetKernel"])}
_NAMED = {"cuFuncGetName": "CUfunction", "cuKernelGetName": "CUkernel"}


class ModuleQueryCalls:
    """See the module docstring."""

    if TYPE_CHECKING:  # CudaExecutor's, which this mixes into
        driver: Any
        ledger: SessionLedger

        def _location(self, kind: int, ordinal: int, bad_ordinal: int) -> int | Reply: ...  # vmm_calls.py

    def _too_many(self, call: DriverCall, count: int) -> Reply | None:
        if count <= MAX_ITEMS:
            return None
        return Reply(Status.MALFORMED, f"{call.name}: {count} items, more than {MAX_ITEMS}".encode())

    def _physical(self, ordinal: int) -> int | None:
        """The session's physical GPU of guest ordinal `ordinal` (vmm_calls' mapping of a device location)."""
        found = self._location(CU_MEM_LOCATION_TYPE_DEVICE, ordinal, INVALID_DEVICE)
        return None if isinstance(found, Reply) else found

    @HOST.serves("cuModuleEnumerateFunctions", "cuLibraryEnumerateKernels")
    def _enumerate(self, call: DriverCall, payload: bytes) -> Reply:
        owner, count = call.request.decode(payload)
        kind, by_name = _CHILD_OF[call.name]
        if (refused := self._too_many(call, count)) is not None:
            return refused
        if owner not in self.ledger.handles[kind]:
            return Reply(INVALID_HANDLE)
        err, handles = getattr(self.driver, call.name)(count, owner)
        if int(err) != SUCCESS:
            return Reply(int(err))
        made = [int(handle) for handle in list(handles or ())[:count]]
        for handle in made:  # the session's, children of their module or library, as if asked for by name
            if handle:  # (past the count the driver leaves NULLs: the wheel hands back the whole array)
                self.ledger.record(by_name, (owner,), [handle])
        return Reply(SUCCESS, call.reply.encode([(handle,) for handle in made]))

    @HOST.serves("cuFuncGetName", "cuKernelGetName")
    def _name(self, call: DriverCall, payload: bytes) -> Reply:
        (handle,) = call.request.decode(payload)
        if handle not in self.ledger.handles[_NAMED[call.name]]:
            return Reply(INVALID_HANDLE if handle else INVALID_VALUE)  # (NULL: as cuda.h documents)
        err, name = getattr(self.driver, call.name)(handle)
        if int(err) != SUCCESS:
            return Reply(int(err))
        text = name if isinstance(name, bytes) else str(name).encode()
        return Reply(SUCCESS, call.reply.encode(text.split(b"\0", 1)[0]))

    @HOST.serves("cuDeviceGetLuid")
    def _luid(self, call: DriverCall, payload: bytes) -> Reply:
        (ordinal,) = call.request.decode(payload)
        device = self._physical(ordinal)
        if device is None:
            return Reply(INVALID_DEVICE)
        err, luid, mask = self.driver.cuDeviceGetLuid(device)
        if int(err) != SUCCESS:
            return Reply(int(err))
        return Reply(SUCCESS, call.reply.encode(int(mask), bytes(luid)[:8].ljust(8, b"\0")))

    @HOST.serves("cuDeviceGetHostAtomicCapabilities", "cuDeviceGetP2PAtomicCapabilities")
    def _atomic_capabilities(self, call: DriverCall, payload: bytes) -> Reply:
        *ordinals, operations = call.request.decode(payload)
        if (refused := self._too_many(call, len(operations))) is not None:
            return refused
        devices = [self._physical(ordinal) for ordinal in ordinals]
        if None in devices:
            return Reply(INVALID_DEVICE)
        try:
            asked = [self.driver.CUatomicOperation(operation) for (operation,) in operations]
        except ValueError:  # an operation the driver's enum lacks: as the driver answers it
            return Reply(INVALID_VALUE)
        err, capabilities = getattr(self.driver, call.name)(asked, len(asked), *devices)
        if int(err) != SUCCESS:
            return Reply(int(err))
        return Reply(SUCCESS, call.reply.encode([(int(c),) for c in list(capabilities or ())[:len(asked)]]))
