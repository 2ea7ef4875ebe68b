/* mem_pool_calls.c: memory pools made by the program (cuMemPoolCreate and its access), CUDA 13's pools by location
 * (cuMemGetDefaultMemPool, cuMemGetMemPool, cuMemSetMemPool) and the virtual-memory queries (cuMemGetAccess,
 * cuMemRetainAllocationHandle, cuMemGetAllocationPropertiesFromHandle): calls whose structs the call table cannot
 * marshal by itself (ivshmem/driver_api.py's POOL_PROPS, MEM_LOCATION, ALLOCATION_PROP and `[iii]` access
 * descriptors). Their device locations travel as this guest's own ordinals; the host maps them to the session's GPUs
 * and checks every pool, handle and address against what the session holds (host_agent/session/mem_pool_calls.py).
 * cuMemPoolDestroy and cuMemAllocPitch are generated (a pitched allocation's pitch x rows join the device ranges:
 * effect allocates_pitched).
 */
#include <string.h>

#include "orion_guest.h"

/* cuda.h's CUmemPoolProps, which orion_calls.h only names (CUDA 13: gpuDirectRDMACapable was a reserved byte
 * before, zero either way). */
struct CUmemPoolProps_st {
    int allocType;
    int handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes; /* Windows only: read by no Linux driver, never sent */
    size_t maxSize;
    unsigned short usage;
    unsigned char gpuDirectRDMACapable;
    unsigned char reserved[53];
};
_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps is cuda.h's 88 bytes");
/* The packed CUmemAccessDesc is exactly `[iii]`: location type, location id, flags. */
_Static_assert(sizeof(CUmemAccessDesc) == ORION_REQ_cuMemPoolSetAccess_descs_ITEM, "CUmemAccessDesc is three ints");

static int all_zero(const unsigned char *bytes, size_t size) {
    for (size_t i = 0; i < size; i++)
        if (bytes[i]) return 0;
    return 1;
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    ORION_ENTRY("cuMemPoolCreate");
    if (!pool || !props) return CUDA_ERROR_INVALID_VALUE;
    /* cuda.h requires the reserved bytes zero: others are fields of a later cuda.h, which the table does not carry */
    if (!all_zero(props->reserved, sizeof props->reserved))
        return orion_not_forwarded("cuMemPoolCreate with CUmemPoolProps fields the call table does not carry");
    uint8_t req[ORION_REQ_cuMemPoolCreate_SIZE], rep[ORION_REP_cuMemPoolCreate_SIZE];
    orion_put_i32(req + ORION_REQ_cuMemPoolCreate_kind, props->allocType);
    orion_put_i32(req + ORION_REQ_cuMemPoolCreate_handle_types, props->handleTypes);
    orion_put_i32(req + ORION_REQ_cuMemPoolCreate_location_kind, props->location.type);
    orion_put_i32(req + ORION_REQ_cuMemPoolCreate_location, props->location.id);
    orion_put_u64(req + ORION_REQ_cuMemPoolCreate_max_size, props->maxSize);
    orion_put_u16(req + ORION_REQ_cuMemPoolCreate_usage, props->usage);
    orion_put_u8(req + ORION_REQ_cuMemPoolCreate_rdma_capable, props->gpuDirectRDMACapable);
    int status = orion_thread_forward(ORION_OP_cuMemPoolCreate, req, sizeof req, rep, sizeof rep, 0);
    if (status == CUDA_SUCCESS) *pool = (CUmemoryPool)(uintptr_t)orion_get_u64(rep + ORION_REP_cuMemPoolCreate_pool);
    return status;
}

/* The descriptors travel as they lie in the caller's array (little-endian ints, no padding), as cuMemSetAccess's. */
CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count) {
    ORION_ENTRY("cuMemPoolSetAccess");
    if (count && !map) return CUDA_ERROR_INVALID_VALUE;
    if (count > UINT32_MAX / sizeof *map) return CUDA_ERROR_INVALID_VALUE; /* more than a request can count */
    uint8_t head[ORION_REQ_cuMemPoolSetAccess_SIZE + ORION_LENGTH_BYTES]; /* then the descriptors, where they lie */
    orion_put_u64(head + ORION_REQ_cuMemPoolSetAccess_pool, (uint64_t)(uintptr_t)pool);
    orion_put_u32(head + ORION_REQ_cuMemPoolSetAccess_descs, (uint32_t)count);
    struct orion_piece req[2] = { { head, sizeof head }, { map, count * sizeof *map } };
    return orion_thread_forwardv(ORION_OP_cuMemPoolSetAccess, req, 2, NULL, 0, NULL, 0, NULL, 0);
}

CUresult cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool pool, CUmemLocation *location) {
    ORION_ENTRY("cuMemPoolGetAccess");
    if (!flags || !location) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuMemPoolGetAccess_SIZE], rep[ORION_REP_cuMemPoolGetAccess_SIZE];
    orion_put_u64(req + ORION_REQ_cuMemPoolGetAccess_pool, (uint64_t)(uintptr_t)pool);
    orion_put_i32(req + ORION_REQ_cuMemPoolGetAccess_location_kind, location->type);
    orion_put_i32(req + ORION_REQ_cuMemPoolGetAccess_location, location->id);
    int status = orion_thread_forward(ORION_OP_cuMemPoolGetAccess, req, sizeof req, rep, sizeof rep, 0);
    if (status == CUDA_SUCCESS) *flags = (CUmemAccess_flags)orion_get_i32(rep + ORION_REP_cuMemPoolGetAccess_flags);
    return status;
}

/* cuMemGetDefaultMemPool and cuMemGetMemPool take the location as an input only (their CUmemLocation * is not
 * written). */
CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool, CUmemLocation *location, CUmemAllocationType type) {
    ORION_ENTRY("cuMemGetDefaultMemPool");
    if (!pool || !location) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuMemGetDefaultMemPool_SIZE], rep[ORION_REP_cuMemGetDefaultMemPool_SIZE];
    orion_put_i32(req + ORION_REQ_cuMemGetDefaultMemPool_location_kind, location->type);
    orion_put_i32(req + ORION_REQ_cuMemGetDefaultMemPool_location, location->id);
    orion_put_i32(req + ORION_REQ_cuMemGetDefaultMemPool_kind, type);
    int status = orion_thread_forward(ORION_OP_cuMemGetDefaultMemPool, req, sizeof req, rep, sizeof rep, 0);
    if (status == CUDA_SUCCESS)
        *pool = (CUmemoryPool)(uintptr_t)orion_get_u64(rep + ORION_REP_cuMemGetDefaultMemPool_pool);
    return status;
}

CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *location, CUmemAllocationType type) {
    ORION_ENTRY("cuMemGetMemPool");
    if (!pool || !location) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuMemGetMemPool_SIZE], rep[ORION_REP_cuMemGetMemPool_SIZE];
    orion_put_i32(req + ORION_REQ_cuMemGetMemPool_location_kind, location->type);
    orion_put_i32(req + ORION_REQ_cuMemGetMemPool_location, location->id);
    orion_put_i32(req + ORION_REQ_cuMemGetMemPool_kind, type);
    int status = orion_thread_forward(ORION_OP_cuMemGetMemPool, req, sizeof req, rep, sizeof rep, 0);
    if (status == CUDA_SUCCESS) *pool = (CUmemoryPool)(uintptr_t)orion_get_u64(rep + ORION_REP_cuMemGetMemPool_pool);
    return status;
}

CUresult cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type, CUmemoryPool pool) {
    ORION_ENTRY("cuMemSetMemPool");
    if (!location) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuMemSetMemPool_SIZE];
    orion_put_i32(req + ORION_REQ_cuMemSetMemPool_location_kind, location->type);
    orion_put_i32(req + ORION_REQ_cuMemSetMemPool_location, location->id);
    orion_put_i32(req + ORION_REQ_cuMemSetMemPool_kind, type);
    orion_put_u64(req + ORION_REQ_cuMemSetMemPool_pool, (uint64_t)(uintptr_t)pool);
    return orion_thread_forward(ORION_OP_cuMemSetMemPool, req, sizeof req, NULL, 0, 0);
}

CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr) {
    ORION_ENTRY("cuMemGetAccess");
    if (!flags || !location) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuMemGetAccess_SIZE], rep[ORION_REP_cuMemGetAccess_SIZE];
    orion_put_i32(req + ORION_REQ_cuMemGetAccess_location_kind, location->type);
    orion_put_i32(req + ORION_REQ_cuMemGetAccess_location, location->id);
    orion_put_u64(req + ORION_REQ_cuMemGetAccess_pointer, ptr);
    int status = orion_thread_forward(ORION_OP_cuMemGetAccess, req, sizeof req, rep, sizeof rep, 0);
    if (status == CUDA_SUCCESS) *flags = orion_get_u64(rep + ORION_REP_cuMemGetAccess_flags);
    return status;
}

/* The handle the guest already has (the one that mapped the memory): one more cuMemRelease of it is owed. */
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    ORION_ENTRY("cuMemRetainAllocationHandle");
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuMemRetainAllocationHandle_SIZE], rep[ORION_REP_cuMemRetainAllocationHandle_SIZE];
    orion_put_u64(req + ORION_REQ_cuMemRetainAllocationHandle_address, (uint64_t)(uintptr_t)addr);
    int status = orion_thread_forward(ORION_OP_cuMemRetainAllocationHandle, req, sizeof req, rep, sizeof rep, 0);
    if (status == CUDA_SUCCESS) *handle = orion_get_u64(rep + ORION_REP_cuMemRetainAllocationHandle_handle);
    return status;
}

/* The struct as cuMemCreate's takes it, its location the guest's ordinal; win32HandleMetaData NULL (Linux). */
CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle) {
    ORION_ENTRY("cuMemGetAllocationPropertiesFromHandle");
    if (!prop) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuMemGetAllocationPropertiesFromHandle_SIZE];
    uint8_t rep[ORION_REP_cuMemGetAllocationPropertiesFromHandle_SIZE];
    orion_put_u64(req + ORION_REQ_cuMemGetAllocationPropertiesFromHandle_handle, handle);
    int status = orion_thread_forward(ORION_OP_cuMemGetAllocationPropertiesFromHandle, req, sizeof req, rep,
                                      sizeof rep, 0);
    if (status != CUDA_SUCCESS) return status;
    const uint8_t *p = rep + ORION_REP_cuMemGetAllocationPropertiesFromHandle_ALLOCATION_PROP;
    memset(prop, 0, sizeof *prop);
    prop->type = orion_get_i32(p + ORION_ALLOCATION_PROP_kind);
    prop->requestedHandleTypes = orion_get_i32(p + ORION_ALLOCATION_PROP_handle_types);
    prop->location.type = orion_get_i32(p + ORION_ALLOCATION_PROP_location_kind);
    prop->location.id = orion_get_i32(p + ORION_ALLOCATION_PROP_location);
    prop->allocFlags.compressionType = orion_get_u8(p + ORION_ALLOCATION_PROP_compression);
    prop->allocFlags.gpuDirectRDMACapable = orion_get_u8(p + ORION_ALLOCATION_PROP_rdma_capable);
    prop->allocFlags.usage = orion_get_u16(p + ORION_ALLOCATION_PROP_usage);
    return CUDA_SUCCESS;
}
