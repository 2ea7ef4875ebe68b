"""The virtual-memory calls written out by hand on the host (JAX's allocator): cuMemCreate,
cuMemGetAllocationGranularity and cuMemSetAccess, whose structs carry a device ordinal the guest names by its own
numbering. A mixin of executor.CudaExecutor, registered on its HOST handlers."""
from __future__ import annotations


class VirtualMemoryCalls:
    """cuMemCreate, cuMemGetAllocationGranularity, cuMemSetAccess (being written: issue 13)."""
