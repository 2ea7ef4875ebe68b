/* query_calls.c: cuPointerGetAttribute, cuMemPoolGetAttribute and cuMemPoolSetAttribute: calls whose output is
 * not a fixed scalar (a value of 4 or 8 bytes by attribute), with the request and reply schemas the call table
 * declares, as guest_runtime/forward.py writes them. (A device's name and UUID: device_answers.c, kept.)
 */
#include <string.h>

#include "orion_guest.h"


/* ivshmem/driver_api.py POOL_ATTRIBUTES_64: the pool attributes whose value is a cuuint64_t (the others: int). */
static int pool_attribute_is_64(int attribute) {
    return attribute == 4 || attribute == 5 || attribute == 6 || attribute == 7 || attribute == 8 || attribute == 13;
}

/* An address in a fallback allocation or a registered range (page_locked_calls.c), answered in the guest, where the
 * host knows nothing of it. Only what is true of that memory is answered, as the driver answers for page-locked host
 * memory: MEMORY_TYPE is CU_MEMORYTYPE_HOST, HOST_POINTER the address itself, RANGE_START_ADDR / RANGE_SIZE the
 * allocation or registration, IS_MANAGED 0. DEVICE_POINTER is CUDA_ERROR_INVALID_VALUE, which cuda.h documents for
 * memory with no device pointer (the GPU cannot reach it); every other attribute (context, device ordinal, buffer
 * id, IPC and mapping properties...) is CUDA_ERROR_INVALID_VALUE, the driver's answer for a pointer it does not
 * know; cuPointerGetAttributes reads both as zero. */
static int host_range_attribute(void *data, int attribute, uint64_t pointer, const struct orion_host_range *range) {
    enum { CONTEXT = 1, MEMORY_TYPE, DEVICE_POINTER, HOST_POINTER, IS_MANAGED = 8, RANGE_START_ADDR = 11,
           RANGE_SIZE = 12, CU_MEMORYTYPE_HOST = 1 };
    uint32_t narrow;
    uint64_t wide;
    switch (attribute) {
    case MEMORY_TYPE: narrow = CU_MEMORYTYPE_HOST; break;
    case IS_MANAGED: narrow = 0; break;
    case HOST_POINTER: wide = pointer; break;
    case RANGE_START_ADDR: wide = range->base; break;
    case RANGE_SIZE: wide = range->size; break;
    default: return CUDA_ERROR_INVALID_VALUE; /* DEVICE_POINTER, CONTEXT and the rest */
    }
    if (attribute == MEMORY_TYPE || attribute == IS_MANAGED) memcpy(data, &narrow, 4);
    else memcpy(data, &wide, 8);
    return CUDA_SUCCESS;
}

/* The host answers the value and its width; `width` bytes of it go to `data`. */
int cuPointerGetAttribute(void *data, int attribute, CUdeviceptr pointer) {
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    struct orion_host_range range;
    if (orion_host_range_find(pointer, &range)) return host_range_attribute(data, attribute, pointer, &range);
    uint8_t req[12], rep[12];
    orion_put_i32(req, attribute);
    orion_put_u64(req + 4, pointer);
    int status = orion_thread_forward(ORION_OP_cuPointerGetAttribute, req, sizeof req, rep, sizeof rep, 0);
    if (status != CUDA_SUCCESS) return status;
    uint32_t width = orion_get_u32(rep + 8);
    if (width != 4 && width != 8) return CUDA_ERROR_UNKNOWN;
    memcpy(data, rep, width); /* little-endian: the value's low `width` bytes */
    return CUDA_SUCCESS;
}

int cuMemPoolGetAttribute(CUmemoryPool pool, int attribute, void *value) {
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[12], rep[8];
    orion_put_u64(req, (uint64_t)(uintptr_t)pool);
    orion_put_i32(req + 8, attribute);
    int status = orion_thread_forward(ORION_OP_cuMemPoolGetAttribute, req, sizeof req, rep, sizeof rep, 0);
    if (status != CUDA_SUCCESS) return status;
    uint64_t number = orion_get_u64(rep);
    if (pool_attribute_is_64(attribute)) {
        memcpy(value, &number, 8);
    } else {
        int narrow = (int)(int64_t)number;
        memcpy(value, &narrow, sizeof narrow);
    }
    return CUDA_SUCCESS;
}

int cuMemPoolSetAttribute(CUmemoryPool pool, int attribute, void *value) {
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    uint64_t number;
    if (pool_attribute_is_64(attribute)) {
        memcpy(&number, value, 8);
    } else {
        int narrow;
        memcpy(&narrow, value, sizeof narrow);
        number = (uint64_t)(int64_t)narrow; /* an int's two's complement, as forward.py masks it */
    }
    uint8_t req[20];
    orion_put_u64(req, (uint64_t)(uintptr_t)pool);
    orion_put_i32(req + 8, attribute);
    orion_put_u64(req + 12, number);
    return orion_thread_forward(ORION_OP_cuMemPoolSetAttribute, req, sizeof req, NULL, 0, 0);
}
