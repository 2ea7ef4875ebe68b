/* vmm_calls.c: the virtual-memory calls whose structs the call table cannot marshal by itself (JAX's allocator):
 * cuMemGetAllocationGranularity and cuMemCreate (a CUmemAllocationProp: ivshmem/driver_api.py's ALLOCATION_PROP)
 * and cuMemSetAccess (an array of CUmemAccessDesc: `[iii]`). Their device locations travel as this guest's own
 * ordinals; the host maps them to the session's GPUs and checks everything (host_agent/session/vmm_calls.py). The rest of
 * the VMM calls are generated (cuMemAddressReserve and cuMemAddressFree also keep the reserved ranges in
 * device_ranges.c, so unified-addressing copies treat them as device memory).
 */
#include "orion_guest.h"

/* The packed CUmemAccessDesc is exactly `[iii]`: location type, location id, flags. */
_Static_assert(sizeof(CUmemAccessDesc) == ORION_REQ_cuMemSetAccess_descs_ITEM, "CUmemAccessDesc is three ints");

/* A CUmemAllocationProp as it travels (ORION_ALLOCATION_PROP_SIZE bytes); win32HandleMetaData is Windows-only and
 * stays here. */
static void put_prop(uint8_t *p, const CUmemAllocationProp *prop) {
    orion_put_i32(p + ORION_ALLOCATION_PROP_kind, prop->type);
    orion_put_i32(p + ORION_ALLOCATION_PROP_handle_types, prop->requestedHandleTypes);
    orion_put_i32(p + ORION_ALLOCATION_PROP_location_kind, prop->location.type);
    orion_put_i32(p + ORION_ALLOCATION_PROP_location, prop->location.id);
    orion_put_u8(p + ORION_ALLOCATION_PROP_compression, prop->allocFlags.compressionType);
    orion_put_u8(p + ORION_ALLOCATION_PROP_rdma_capable, prop->allocFlags.gpuDirectRDMACapable);
    orion_put_u16(p + ORION_ALLOCATION_PROP_usage, prop->allocFlags.usage);
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, CUmemAllocationProp const *prop,
                                       CUmemAllocationGranularity_flags option) {
    ORION_ENTRY("cuMemGetAllocationGranularity");
    if (!granularity || !prop) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuMemGetAllocationGranularity_SIZE], rep[ORION_REP_cuMemGetAllocationGranularity_SIZE];
    put_prop(req + ORION_REQ_cuMemGetAllocationGranularity_ALLOCATION_PROP, prop);
    orion_put_i32(req + ORION_REQ_cuMemGetAllocationGranularity_option, option);
    int status = orion_thread_forward(ORION_OP_cuMemGetAllocationGranularity, req, sizeof req, rep, sizeof rep, 0);
    if (status == CUDA_SUCCESS)
        *granularity = (size_t)orion_get_u64(rep + ORION_REP_cuMemGetAllocationGranularity_granularity);
    return status;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, CUmemAllocationProp const *prop,
                     unsigned long long flags) {
    ORION_ENTRY("cuMemCreate");
    if (!handle || !prop) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuMemCreate_SIZE], rep[ORION_REP_cuMemCreate_SIZE];
    orion_put_u64(req + ORION_REQ_cuMemCreate_size, size);
    orion_put_u64(req + ORION_REQ_cuMemCreate_flags, flags);
    put_prop(req + ORION_REQ_cuMemCreate_ALLOCATION_PROP, prop);
    int status = orion_thread_forward(ORION_OP_cuMemCreate, req, sizeof req, rep, sizeof rep, 0);
    if (status == CUDA_SUCCESS)
        *handle = (CUmemGenericAllocationHandle)orion_get_u64(rep + ORION_REP_cuMemCreate_handle);
    return status;
}

/* The descriptors travel as they lie in the caller's array (little-endian ints, no padding). */
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, CUmemAccessDesc const *desc, size_t count) {
    ORION_ENTRY("cuMemSetAccess");
    if (count && !desc) return CUDA_ERROR_INVALID_VALUE;
    if (count > UINT32_MAX / sizeof *desc) return CUDA_ERROR_INVALID_VALUE; /* more than a request can count */
    uint8_t head[ORION_REQ_cuMemSetAccess_SIZE + ORION_LENGTH_BYTES]; /* then the descriptors, where they lie */
    orion_put_u64(head + ORION_REQ_cuMemSetAccess_pointer, ptr);
    orion_put_u64(head + ORION_REQ_cuMemSetAccess_size, size);
    orion_put_u32(head + ORION_REQ_cuMemSetAccess_descs, (uint32_t)count);
    struct orion_piece req[2] = { { head, sizeof head }, { desc, count * sizeof *desc } };
    return orion_thread_forwardv(ORION_OP_cuMemSetAccess, req, 2, NULL, 0, NULL, 0, NULL, 0);
}
