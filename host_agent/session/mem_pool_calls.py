"""Memory pools made by the program, CUDA 13's pools by location, pitched allocations and the virtual-memory API's
queries, as the host serves them: a mixin of executor.CudaExecutor, registered on the host's HOST and POLICY handlers
(call_registry.py).

Written out by hand, because their structs name a device by the guest's own ordinal (which becomes the session's
physical GPU here, as vmm_calls.py does) or name memory the ledger must map to what the session holds:
cuMemPoolCreate (a CUmemPoolProps: driver_api.POOL_PROPS), cuMemPoolSetAccess, cuMemPoolGetAccess,
cuMemGetDefaultMemPool, cuMemGetMemPool, cuMemSetMemPool, cuMemGetAccess, cuMemRetainAllocationHandle and
cuMemGetAllocationPropertiesFromHandle. Policies of generic calls: cuMemPoolDestroy, cuMemAllocPitch, cuMemRelease
(a retained handle) and cuMemAllocFromPoolAsync (counted on the pool's GPU).

What is checked before the driver sees a request:

* a pool must be one the session was given (cuMemPoolCreate, cuDeviceGet*MemPool, cuMemGet*MemPool, a pointer's
  MEMPOOL_HANDLE), else CUDA_ERROR_INVALID_VALUE, what each of these calls documents for one it does not know; so
  another session's pool, or a made-up one, never reaches the driver. (The generic pool calls that came before them,
  cuMemAllocFromPoolAsync, cuMemPoolTrimTo, cuDeviceSetMemPool, answer INVALID_HANDLE: session_ledger.check.)
  A pool the session made is destroyed with its worker at the session's end, as everything it holds;
* a device location must be one of the session's ordinals: else CUDA_ERROR_INVALID_DEVICE where the call documents
  it (cuMemGetDefaultMemPool, cuMemGetAccess), INVALID_VALUE elsewhere. Locations in host memory (HOST, HOST_NUMA,
  HOST_NUMA_CURRENT) and a GPU's locality domains answer CUDA_ERROR_NOT_SUPPORTED: a pool of the agent's host memory
  is not the guest's memory, and a locality domain's id is not translated;
* managed pools (CU_MEM_ALLOCATION_TYPE_MANAGED) answer NOT_SUPPORTED, as managed memory does (api_classes), and any
  type but PINNED INVALID_VALUE; a pool whose handle types are other than NONE answers NOT_SUPPORTED: its memory
  could be exported as a file descriptor or fabric handle of the worker process, a host object the guest cannot use
  and must not be handed (cuMemPoolExport* and cuMemPoolImport* are not forwarded);
* cuMemGetAccess: the pointer lies in the session's memory; cuMemRetainAllocationHandle: the address lies in one of
  the session's cuMemMap mappings (else INVALID_VALUE, the driver's answer for an address not mapped);
  cuMemGetAllocationPropertiesFromHandle: the handle is one the session created and has not released.

What the ledger keeps besides: cuMemRetainAllocationHandle answers the handle that mapped the memory (cuda.h
guarantees it is that one: any other answer is released again and CUDA_ERROR_UNKNOWN), so the guest gets back its own
handle; the reference it adds is counted (`Reservations.retained`) and the guest's next cuMemRelease of that handle
gives back that reference (the driver's release, the handle stays the session's) before one gives back the handle.
A retain of memory whose handle was released while still mapped makes the handle the session's again, to release
again. Quota: a pitched allocation counts pitch x rows; the driver chooses the pitch, so the check before it counts
width x rows and one after it, with the allocation in the ledger, undoes it (cuMemFree) if the pitch took it past
the quota. A pool's allocations count on the pool's GPU, which cuMemAllocFromPoolAsync may place on another device
than the current context's (asked of the driver, CU_MEMPOOL_ATTR_LOCATION_ID, only for a session whose vGPUs span
several GPUs under a quota). Their memory is the session's as any allocation's (the ledger's `allocates` effect):
copies, memsets and kernels reach it, and cuMemFreeAsync gives it back.
"""
from __future__ import annotations

import ctypes
from typing import Any

from ivshmem.cuda_status import (
    INVALID_DEVICE,
    INVALID_VALUE,
    NOT_SUPPORTED,
    OUT_OF_MEMORY,
    SUCCESS,
    UNKNOWN,
)
from ivshmem.driver_api import CALLS, DriverCall

from ..handler import Reply
from .call_registry import HOST, POLICY
from .session_ledger import CHECKED, SessionLedger
from .vgpu_contexts import VgpuContexts
from .vgpu_quota import VgpuQuota
from .vmm_calls import CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE, HOST_LOCATIONS, MAX_ACCESS_DESCS

CU_MEM_ALLOCATION_TYPE_MANAGED = 2
CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN = 6
CU_MEMPOOL_ATTR_LOCATION_ID = 11
HANDLE_TYPE_NONE = 0
REQUESTED_HANDLE_TYPES_AT = 4  # offsetof(CUmemAllocationProp, requestedHandleTypes)
FREE = CALLS["cuMemFree"]
PHYSICAL = "CUmemGenericAllocationHandle"


class MemPoolCalls:
    """Pools made by the program and by location, their access; pitched allocations; the VMM queries."""

    # CudaExecutor's, set in its __init__
    driver: Any
    ledger: SessionLedger
    quota: VgpuQuota
    contexts: VgpuContexts

    # --- what a request names -----------------------------------------------------------------------------------
    def _memory_location(self, kind: int, ordinal: int, bad_ordinal: int) -> Any:
        """The wheel's CUmemLocation naming the physical GPU of a location the guest sent, or the Reply refusing it
        (`bad_ordinal` for an ordinal that is not the session's)."""
        if kind in HOST_LOCATIONS or kind == CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN:
            return Reply(NOT_SUPPORTED)
        if kind != CU_MEM_LOCATION_TYPE_DEVICE:
            return Reply(INVALID_VALUE)
        devices = self.ledger.devices
        if not 0 <= ordinal < len(devices):
            return Reply(bad_ordinal)
        location = self.driver.CUmemLocation()
        location.type = self.driver.CUmemLocationType(kind)
        location.id = devices[ordinal]
        return location

    @staticmethod
    def _pool_type(kind: int) -> Reply | None:
        """Only device memory pools: managed ones are not forwarded (managed memory is not)."""
        if kind == CU_MEM_ALLOCATION_TYPE_MANAGED:
            return Reply(NOT_SUPPORTED)
        return None if kind == CU_MEM_ALLOCATION_TYPE_PINNED else Reply(INVALID_VALUE)

    def _pool_known(self, pool: int) -> bool:
        return pool in self.ledger.handles["CUmemoryPool"]

    def _lacks(self, call: DriverCall, *names: str) -> bool:
        """Whether the installed cuda-bindings lacks the call (or a type it needs): CUDA_ERROR_NOT_SUPPORTED then, as
        an older driver answers (and as the generic calls do)."""
        return any(not hasattr(self.driver, name) for name in (call.name, *names))

    # --- pools made by the program --------------------------------------------------------------------------------
    @HOST.serves("cuMemPoolCreate")
    def _pool_create(self, call: DriverCall, payload: bytes) -> Reply:
        kind, handle_types, location_kind, ordinal, max_size, usage, rdma_capable = call.request.decode(payload)
        if self._lacks(call, "CUmemPoolProps"):
            return Reply(NOT_SUPPORTED)
        refused = self._pool_type(kind)
        if refused is not None:
            return refused
        if handle_types != HANDLE_TYPE_NONE:  # exportable memory: a host object (module docstring)
            return Reply(NOT_SUPPORTED)
        location = self._memory_location(location_kind, ordinal, INVALID_VALUE)
        if isinstance(location, Reply):
            return location
        driver = self.driver
        props = driver.CUmemPoolProps()
        props.allocType = driver.CUmemAllocationType(kind)
        props.handleTypes = driver.CUmemAllocationHandleType(HANDLE_TYPE_NONE)
        props.location = location
        props.maxSize = max_size  # the rest go as they came: the driver judges them
        props.usage = usage
        if hasattr(props, "gpuDirectRDMACapable"):  # a newer cuda.h's field (cuda-bindings 13.3 lacks it)
            props.gpuDirectRDMACapable = rdma_capable
        elif rdma_capable:  # asked for, and this host's bindings cannot carry it: not dropped silently
            return Reply(NOT_SUPPORTED)
        err, pool = driver.cuMemPoolCreate(props)
        if int(err) != SUCCESS:
            return Reply(int(err))
        self.ledger.record(call, (), [int(pool)])
        return Reply(SUCCESS, call.reply.encode(int(pool)))

    @POLICY.serves("cuMemPoolDestroy")
    def _pool_destroy(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        """Only a pool of the session's (a default pool the driver itself refuses); the generic call does the rest."""
        return None if self._pool_known(args[0]) else Reply(INVALID_VALUE)

    @HOST.serves("cuMemPoolSetAccess")
    def _pool_set_access(self, call: DriverCall, payload: bytes) -> Reply:
        """Access to a pool of the session's, for the session's devices only."""
        pool, descs = call.request.decode(payload)
        if self._lacks(call):
            return Reply(NOT_SUPPORTED)
        if not self._pool_known(pool) or len(descs) > MAX_ACCESS_DESCS:
            return Reply(INVALID_VALUE)
        driver = self.driver
        wanted = []
        for kind, ordinal, flags in descs:
            location = self._memory_location(kind, ordinal, INVALID_VALUE)  # cuda.h documents INVALID_VALUE only
            if isinstance(location, Reply):
                return location
            desc = driver.CUmemAccessDesc()
            desc.location = location
            try:
                desc.flags = driver.CUmemAccess_flags(flags)
            except ValueError:
                return Reply(INVALID_VALUE)
            wanted.append(desc)
        (err,) = driver.cuMemPoolSetAccess(pool, wanted, len(wanted))
        return Reply(int(err))

    @HOST.serves("cuMemPoolGetAccess")
    def _pool_get_access(self, call: DriverCall, payload: bytes) -> Reply:
        pool, kind, ordinal = call.request.decode(payload)
        if self._lacks(call):
            return Reply(NOT_SUPPORTED)
        if not self._pool_known(pool):
            return Reply(INVALID_VALUE)
        location = self._memory_location(kind, ordinal, INVALID_VALUE)
        if isinstance(location, Reply):
            return location
        err, flags = self.driver.cuMemPoolGetAccess(pool, location)
        if int(err) != SUCCESS:
            return Reply(int(err))
        return Reply(SUCCESS, call.reply.encode(int(flags)))

    # --- pools by location (CUDA 13) ------------------------------------------------------------------------------
    @HOST.serves("cuMemGetDefaultMemPool", "cuMemGetMemPool")
    def _pool_of_location(self, call: DriverCall, payload: bytes) -> Reply:
        """A device's default or current pool of pinned memory, as cuDeviceGetDefaultMemPool and cuDeviceGetMemPool
        answer (the pool becomes the session's)."""
        location_kind, ordinal, kind = call.request.decode(payload)
        if self._lacks(call):
            return Reply(NOT_SUPPORTED)
        refused = self._pool_type(kind)
        if refused is not None:
            return refused
        bad_ordinal = INVALID_DEVICE if call.name == "cuMemGetDefaultMemPool" else INVALID_VALUE  # as documented
        location = self._memory_location(location_kind, ordinal, bad_ordinal)
        if isinstance(location, Reply):
            return location
        err, pool = getattr(self.driver, call.name)(location, self.driver.CUmemAllocationType(kind))
        if int(err) != SUCCESS:
            return Reply(int(err))
        self.ledger.record(call, (), [int(pool)])
        return Reply(SUCCESS, call.reply.encode(int(pool)))

    @HOST.serves("cuMemSetMemPool")
    def _set_pool_of_location(self, call: DriverCall, payload: bytes) -> Reply:
        location_kind, ordinal, kind, pool = call.request.decode(payload)
        if self._lacks(call):
            return Reply(NOT_SUPPORTED)
        if not self._pool_known(pool):
            return Reply(INVALID_VALUE)
        refused = self._pool_type(kind)
        if refused is not None:
            return refused
        location = self._memory_location(location_kind, ordinal, INVALID_VALUE)
        if isinstance(location, Reply):
            return location
        (err,) = self.driver.cuMemSetMemPool(location, self.driver.CUmemAllocationType(kind), pool)
        return Reply(int(err))

    @POLICY.serves("cuMemAllocFromPoolAsync")
    def _alloc_from_pool(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        """Counted on the pool's GPU where the session spans several under a quota; else the generic call."""
        size, pool, stream = args
        vgpu = self._pool_vgpu(pool)
        if vgpu is None:
            return None
        for position, ctype, value in zip(call.input_positions, call.input_types, args, strict=True):
            problem = self.ledger.check(call, position, ctype, value, args) if ctype in CHECKED else None
            if problem is not None:
                return Reply(problem)
        if not self.quota.allocation_fits(size, vgpu):
            return Reply(OUT_OF_MEMORY)
        err, pointer = self.driver.cuMemAllocFromPoolAsync(size, pool, stream)
        if int(err) != SUCCESS:
            return Reply(int(err))
        self.ledger.record(call, args, [int(pointer)], placed=vgpu)
        return Reply(SUCCESS, call.outputs.pack(int(pointer)))

    def _pool_vgpu(self, pool: int) -> int | None:
        """The vGPU a pool of the session's counts on, where it matters: a session of several vGPUs, under a quota
        (None otherwise, and for a pool the session does not have: the generic call refuses it). A pool is a GPU's,
        not a context's: of two vGPUs of one GPU, the current context's, else the first."""
        if self.quota.limits is None or len(self.ledger.devices) < 2 or not self._pool_known(pool):
            return None
        try:
            which = self.driver.CUmemPool_attribute(CU_MEMPOOL_ATTR_LOCATION_ID)
        except ValueError:
            return None
        err, value = self.driver.cuMemPoolGetAttribute(pool, which)
        vgpu = self.contexts.vgpu(int(value)) if int(err) == SUCCESS else -1
        return vgpu if vgpu >= 0 else None

    # --- pitched allocations --------------------------------------------------------------------------------------
    @POLICY.serves("cuMemAllocPitch")
    def _alloc_pitch(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        """pitch x rows bytes, counted against the quota (module docstring)."""
        width, height, _element = args
        if self._lacks(call):
            return Reply(NOT_SUPPORTED)
        if not self.quota.allocation_fits(width * height):
            return Reply(OUT_OF_MEMORY)
        err, pointer, pitch = self.driver.cuMemAllocPitch(*args)
        if int(err) != SUCCESS:
            return Reply(int(err))
        pointer, pitch = int(pointer), int(pitch)
        self.ledger.record(call, args, [pointer, pitch])
        if not self.quota.allocation_fits(0):  # the driver's pitch took it past the quota: undone
            self.driver.cuMemFree(pointer)
            self.ledger.record(FREE, (pointer,), [])
            return Reply(OUT_OF_MEMORY)
        return Reply(SUCCESS, call.outputs.pack(pointer, pitch))

    # --- the virtual-memory queries -------------------------------------------------------------------------------
    @HOST.serves("cuMemGetAccess")
    def _mem_get_access(self, call: DriverCall, payload: bytes) -> Reply:
        kind, ordinal, pointer = call.request.decode(payload)
        if self._lacks(call):
            return Reply(NOT_SUPPORTED)
        if not self.ledger.owns(pointer, 1):
            return Reply(INVALID_VALUE)
        location = self._memory_location(kind, ordinal, INVALID_DEVICE)
        if isinstance(location, Reply):
            return location
        err, flags = self.driver.cuMemGetAccess(location, pointer)
        if int(err) != SUCCESS:
            return Reply(int(err))
        return Reply(SUCCESS, call.reply.encode(int(flags)))

    @HOST.serves("cuMemRetainAllocationHandle")
    def _retain_handle(self, call: DriverCall, payload: bytes) -> Reply:
        """The session's own handle of the memory mapped at an address of its mappings, one reference more."""
        (address,) = call.request.decode(payload)
        if self._lacks(call):
            return Reply(NOT_SUPPORTED)
        vmm = self.ledger.vmm
        handle = next((h for base, (size, h) in vmm.mappings.items() if base <= address < base + size), None)
        if handle is None:
            return Reply(INVALID_VALUE)
        err, got = self.driver.cuMemRetainAllocationHandle(address)
        if int(err) != SUCCESS:
            return Reply(int(err))
        if int(got) != handle:  # not the handle that mapped it, which cuda.h guarantees: not handed out
            self.driver.cuMemRelease(got)
            return Reply(UNKNOWN)
        handles = self.ledger.handles[PHYSICAL]
        if handle in handles:
            vmm.retained[handle] = vmm.retained.get(handle, 0) + 1
        else:  # released while mapped: the session holds it again, to release once more
            handles.add(handle)
            vmm.released.discard(handle)
        return Reply(SUCCESS, call.reply.encode(handle))

    @POLICY.serves("cuMemRelease")
    def _release_retained(self, call: DriverCall, args: tuple[int, ...]) -> Reply | None:
        """A handle with references a retain added gives one of those back; the handle stays the session's."""
        (handle,) = args
        vmm = self.ledger.vmm
        if not vmm.retained.get(handle) or handle not in self.ledger.handles[PHYSICAL]:
            return None  # the generic call: the session's own reference, recorded from the table's effects
        (err,) = self.driver.cuMemRelease(handle)
        if int(err) == SUCCESS:
            vmm.retained[handle] -= 1
            if not vmm.retained[handle]:
                del vmm.retained[handle]
        return Reply(int(err))

    @HOST.serves("cuMemGetAllocationPropertiesFromHandle")
    def _allocation_properties(self, call: DriverCall, payload: bytes) -> Reply:
        """driver_api.ALLOCATION_PROP of the session's physical memory, its location as the guest's ordinal."""
        (handle,) = call.request.decode(payload)
        if self._lacks(call):
            return Reply(NOT_SUPPORTED)
        if handle not in self.ledger.handles[PHYSICAL]:
            return Reply(INVALID_VALUE)
        err, prop = self.driver.cuMemGetAllocationPropertiesFromHandle(handle)
        if int(err) != SUCCESS:
            return Reply(int(err))
        location_kind, location = int(prop.location.type), int(prop.location.id)
        if location_kind == CU_MEM_LOCATION_TYPE_DEVICE:
            location = self.contexts.vgpu(location)
        flags = prop.allocFlags
        return Reply(SUCCESS, call.reply.encode(
            int(prop.type), _handle_types(prop), location_kind, location, int(flags.compressionType),
            int(flags.gpuDirectRDMACapable), int(flags.usage)))


def _handle_types(prop: Any) -> int:
    """requestedHandleTypes, also a combination of flags (XLA asks for 9) that the wheel's enum cannot hold."""
    try:
        return int(prop.requestedHandleTypes)
    except ValueError:
        return ctypes.c_int.from_address(int(prop.getPtr()) + REQUESTED_HANDLE_TYPES_AT).value

