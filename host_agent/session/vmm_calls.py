"""The virtual-memory calls (JAX's allocator, PyTorch's expandable segments) as the host serves them: a mixin of
executor.CudaExecutor, registered on the host's HOST and POLICY handlers (call_registry.py).

Three are written out by hand because their structs name a device by the guest's own ordinal (which becomes the
session's physical GPU here): cuMemGetAllocationGranularity, cuMemCreate and cuMemSetAccess. Two generic ones,
cuMemMap and cuMemUnmap, get a policy: the generic ownership check (the pointer lies in the session's memory)
is not enough for them, since their whole range must lie inside one of the session's reservations, and the
ledger must know which range maps which physical memory (for the quota: session_ledger.Reservations). The rest
(cuMemAddressReserve, cuMemAddressFree, cuMemRelease) are generic, checked and recorded from their table effects.

What is not forwarded: memory located on the host (CU_MEM_LOCATION_TYPE_HOST*: the guest's host memory is not
the agent's; CUDA_ERROR_NOT_SUPPORTED; only its granularity is answered, as the driver's, so that a program
probing for host allocations, as NCCL does at start, meets the refusal where it expects one: at cuMemCreate), and
the export or import of shareable handles (cuMemExportToShareableHandle and its kin are not in the call table: 801
in the guest), since a file descriptor or fabric handle of the agent's worker process means nothing in the guest
and would hand the tenant a way into the host process's memory. The handle types a program requests (XLA asks for
POSIX file descriptors, and fabric handles, at start) are passed to the driver as they came, which judges them;
nothing can be exported with them.
"""
from __future__ import annotations

import ctypes
from typing import Any

from ivshmem.cuda_status import INVALID_DEVICE, INVALID_VALUE, NOT_SUPPORTED, OUT_OF_MEMORY, SUCCESS
from ivshmem.driver_api import DriverCall

from ..handler import Reply
from .call_registry import HOST, POLICY
from .session_ledger import SessionLedger
from .vgpu_quota import VgpuQuota

CU_MEM_ALLOCATION_TYPE_PINNED = 1
REQUESTED_HANDLE_TYPES_AT = 4  # offsetof(CUmemAllocationProp, requestedHandleTypes)
CU_MEM_LOCATION_TYPE_DEVICE = 1
# CU_MEM_LOCATION_TYPE_HOST, _HOST_NUMA, _HOST_NUMA_CURRENT: valid for the driver, memory of the agent's host.
HOST_LOCATIONS = frozenset({2, 3, 4})
MAX_ACCESS_DESCS = 64  # a program names each device once; more is not a request a driver would get


class VirtualMemoryCalls:
    """cuMemGetAllocationGranularity, cuMemCreate, cuMemSetAccess; the policies of cuMemMap and cuMemUnmap."""

    # CudaExecutor's, set in its __init__
    driver: Any
    ledger: SessionLedger
    quota: VgpuQuota

    def _location(self, kind: int, ordinal: int, bad_ordinal: int, host: bool = False) -> int | Reply:
        """The physical GPU of a CUmemLocation the guest sent, or the Reply refusing it: a device of another
        numbering than the session's answers `bad_ordinal` (INVALID_DEVICE where the driver documents it). A host
        location is refused (NOT_SUPPORTED) unless `host`; then its NUMA node goes to the driver as it came."""
        if kind in HOST_LOCATIONS:
            return ordinal if host else Reply(NOT_SUPPORTED)
        if kind != CU_MEM_LOCATION_TYPE_DEVICE:
            return Reply(INVALID_VALUE)
        devices = self.ledger.devices
        return devices[ordinal] if 0 <= ordinal < len(devices) else Reply(bad_ordinal)

    def _allocation_prop(self, fields: tuple[int, ...], bad_ordinal: int,
                         host: bool = False) -> tuple[int, Any] | Reply:
        """A CUmemAllocationProp as it travelled (driver_api.ALLOCATION_PROP) -> (its physical GPU, the wheel's
        struct naming that GPU), or the Reply refusing it (a host location too, unless `host`)."""
        kind, handle_types, location_kind, location, compression, rdma_capable, usage = fields
        if kind != CU_MEM_ALLOCATION_TYPE_PINNED:
            return Reply(INVALID_VALUE)
        device = self._location(location_kind, location, bad_ordinal, host)
        if isinstance(device, Reply):
            return device
        driver = self.driver
        prop = driver.CUmemAllocationProp()
        prop.type = driver.CUmemAllocationType(kind)
        try:
            prop.requestedHandleTypes = driver.CUmemAllocationHandleType(handle_types)
        except ValueError:  # a combination of flags (XLA asks for 9), which the wheel's enum cannot hold
            if handle_types < 0 or not hasattr(prop, "getPtr"):
                return Reply(INVALID_VALUE)
            ctypes.c_int.from_address(int(prop.getPtr()) + REQUESTED_HANDLE_TYPES_AT).value = handle_types
        prop.location.type = driver.CUmemLocationType(location_kind)
        prop.location.id = device
        # compression and usage go as they came: the driver judges them (an H100 answers for compressible memory)
        prop.allocFlags.compressionType = compression
        prop.allocFlags.gpuDirectRDMACapable = rdma_capable
        prop.allocFlags.usage = usage
        return device, prop

    @HOST.serves("cuMemGetAllocationGranularity")
    def _allocation_granularity(self, call: DriverCall, payload: bytes) -> Reply:
        *fields, option = call.request.decode(payload)
        # cuMemGetAllocationGranularity documents no INVALID_DEVICE: an unknown device is an invalid property.
        # A host location's granularity is the driver's answer (NCCL asks before it tries a host cuMemCreate).
        made = self._allocation_prop(tuple(fields), INVALID_VALUE, host=True)
        if isinstance(made, Reply):
            return made
        try:
            which = self.driver.CUmemAllocationGranularity_flags(option)
        except ValueError:
            return Reply(INVALID_VALUE)
        err, granularity = self.driver.cuMemGetAllocationGranularity(made[1], which)
        if int(err) != SUCCESS:
            return Reply(int(err))
        return Reply(SUCCESS, call.reply.encode(int(granularity)))

    @HOST.serves("cuMemCreate")
    def _mem_create(self, call: DriverCall, payload: bytes) -> Reply:
        """Physical memory on one of the session's GPUs, counted against its vGPU quota as cuMemAlloc is (past
        it: CUDA_ERROR_OUT_OF_MEMORY, as a full GPU answers) until released and unmapped."""
        size, flags, *fields = call.request.decode(payload)
        made = self._allocation_prop(tuple(fields), INVALID_DEVICE)
        if isinstance(made, Reply):
            return made
        vgpu = fields[3]  # the guest ordinal _allocation_prop found to be one of the session's devices
        if not self.quota.allocation_fits(size, vgpu):
            return Reply(OUT_OF_MEMORY)
        err, handle = self.driver.cuMemCreate(size, made[1], flags)
        if int(err) != SUCCESS:
            return Reply(int(err))
        self.ledger.record(call, (size, flags), [int(handle)], placed=vgpu)
        return Reply(SUCCESS, call.reply.encode(int(handle)))

    @HOST.serves("cuMemSetAccess")
    def _mem_set_access(self, call: DriverCall, payload: bytes) -> Reply:
        """Access to a range of the session's reservations, for the session's devices only."""
        pointer, size, descs = call.request.decode(payload)
        if len(descs) > MAX_ACCESS_DESCS or not self.ledger.vmm.reservation_holds(pointer, size):
            return Reply(INVALID_VALUE)
        driver = self.driver
        wanted = []
        for kind, ordinal, flags in descs:
            device = self._location(kind, ordinal, INVALID_DEVICE)
            if isinstance(device, Reply):
                return device
            desc = driver.CUmemAccessDesc()
            desc.location.type = driver.CUmemLocationType(kind)
            desc.location.id = device
            try:
                desc.flags = driver.CUmemAccess_flags(flags)
            except ValueError:
                return Reply(INVALID_VALUE)
            wanted.append(desc)
        (err,) = driver.cuMemSetAccess(pointer, size, wanted, len(wanted))
        return Reply(int(err))

    # --- policies of generic calls -----------------------------------------------------------------------------
    @POLICY.serves("cuMemMap")
    def _mem_map(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        """Only into the session's reservations, only its own physical memory; the mapping is remembered."""
        pointer, size, offset, handle, flags = args
        vmm = self.ledger.vmm
        if not vmm.reservation_holds(pointer, size) or handle not in self.ledger.handles[
                "CUmemGenericAllocationHandle"]:
            return Reply(INVALID_VALUE)  # what cuMemMap documents for a range or handle it does not know
        (err,) = self.driver.cuMemMap(pointer, size, offset, handle, flags)
        if int(err) == SUCCESS:
            vmm.mapped(pointer, size, handle)
        return Reply(int(err))

    @POLICY.serves("cuMemUnmap")
    def _mem_unmap(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        """Only inside the session's reservations (never the driver's own mappings behind cuMemAlloc or the
        page-locked pool); released physical memory mapped nowhere any more leaves the quota."""
        pointer, size = args
        vmm = self.ledger.vmm
        if not vmm.reservation_holds(pointer, size):
            return Reply(INVALID_VALUE)
        (err,) = self.driver.cuMemUnmap(pointer, size)
        if int(err) == SUCCESS:
            vmm.unmapped(pointer, size)
        return Reply(int(err))
