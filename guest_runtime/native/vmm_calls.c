/* vmm_calls.c: the virtual-memory calls whose structs the call table cannot marshal by itself (JAX's allocator):
 * cuMemGetAllocationGranularity and cuMemCreate (a CUmemAllocationProp: ivshmem/driver_api.py's ALLOCATION_PROP)
 * and cuMemSetAccess (an array of CUmemAccessDesc: `[iii]`). Their device locations travel as this guest's own
 * ordinals; the host maps them to the session's GPUs and checks everything (host_agent/vmm_calls.py). The rest of
 * the VMM calls are generated (cuMemAddressReserve and cuMemAddressFree also keep the reserved ranges in
 * device_ranges.c, so unified-addressing copies treat them as device memory).
 */
#include "orion_guest.h"

/* The packed CUmemAccessDesc is exactly `[iii]`: location type, location id, flags. */
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc is three ints");

enum { PROP_BYTES = 20 }; /* kind, handle types, location type, location id (i32 each), compression, rdma (u8), usage */

/* A CUmemAllocationProp as it travels; win32HandleMetaData is Windows-only and stays here. */
static void put_prop(uint8_t *p, const CUmemAllocationProp *prop) {
    orion_put_i32(p, prop->type);
    orion_put_i32(p + 4, prop->requestedHandleTypes);
    orion_put_i32(p + 8, prop->location.type);
    orion_put_i32(p + 12, prop->location.id);
    orion_put_u8(p + 16, prop->allocFlags.compressionType);
    orion_put_u8(p + 17, prop->allocFlags.gpuDirectRDMACapable);
    orion_put_u16(p + 18, prop->allocFlags.usage);
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, CUmemAllocationProp const *prop,
                                       CUmemAllocationGranularity_flags option) {
    if (!granularity || !prop) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[PROP_BYTES + 4], rep[8];
    put_prop(req, prop);
    orion_put_i32(req + PROP_BYTES, option);
    int status = orion_thread_forward(ORION_OP_cuMemGetAllocationGranularity, req, sizeof req, rep, sizeof rep, 0);
    if (status == CUDA_SUCCESS) *granularity = (size_t)orion_get_u64(rep);
    return status;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, CUmemAllocationProp const *prop,
                     unsigned long long flags) {
    if (!handle || !prop) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[16 + PROP_BYTES], rep[8];
    orion_put_u64(req, size);
    orion_put_u64(req + 8, flags);
    put_prop(req + 16, prop);
    int status = orion_thread_forward(ORION_OP_cuMemCreate, req, sizeof req, rep, sizeof rep, 0);
    if (status == CUDA_SUCCESS) *handle = (CUmemGenericAllocationHandle)orion_get_u64(rep);
    return status;
}

/* The descriptors travel as they lie in the caller's array (little-endian ints, no padding). */
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, CUmemAccessDesc const *desc, size_t count) {
    if (count && !desc) return CUDA_ERROR_INVALID_VALUE;
    if (count > UINT32_MAX / sizeof *desc) return CUDA_ERROR_INVALID_VALUE; /* more than a request can count */
    uint8_t head[20];
    orion_put_u64(head, ptr);
    orion_put_u64(head + 8, size);
    orion_put_u32(head + 16, (uint32_t)count);
    struct orion_piece req[2] = { { head, sizeof head }, { desc, count * sizeof *desc } };
    return orion_thread_forwardv(ORION_OP_cuMemSetAccess, req, 2, NULL, 0, NULL, 0, NULL, 0);
}
