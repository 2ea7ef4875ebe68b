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

/* Page-locked memory's attributes that the guest knows, as the driver answers them for page-locked host memory:
 * CONTEXT and DEVICE_ORDINAL the allocation's or registration's (its context's device), MEMORY_TYPE
 * CU_MEMORYTYPE_HOST, HOST_POINTER the address itself, RANGE_START_ADDR / RANGE_SIZE the allocation or
 * registration, IS_MANAGED 0. Answered in the guest for the pool's allocations too, so that a relayed session (whose
 * GPU host never maps the pool) answers as a local one does. 0 for any other attribute: the caller decides. */
static int known_attribute(void *data, int attribute, uint64_t pointer, const struct orion_host_range *range) {
    enum { CONTEXT = 1, MEMORY_TYPE, HOST_POINTER = 4, IS_MANAGED = 8, DEVICE_ORDINAL, RANGE_START_ADDR = 11,
           RANGE_SIZE, CU_MEMORYTYPE_HOST = 1 };
    uint32_t narrow;
    uint64_t wide;
    switch (attribute) {
    case MEMORY_TYPE: narrow = CU_MEMORYTYPE_HOST; break;
    case IS_MANAGED: narrow = 0; break;
    case DEVICE_ORDINAL:
        if (range->device < 0) return 0;
        narrow = (uint32_t)range->device;
        break;
    case CONTEXT:
        if (!range->context) return 0;
        wide = range->context;
        break;
    case HOST_POINTER: wide = pointer; break;
    case RANGE_START_ADDR: wide = range->base; break;
    case RANGE_SIZE: wide = range->size; break;
    default: return 0;
    }
    if (attribute == MEMORY_TYPE || attribute == IS_MANAGED || attribute == DEVICE_ORDINAL) memcpy(data, &narrow, 4);
    else memcpy(data, &wide, 8);
    return 1;
}

/* The host answers the value and its width; `width` bytes of it go to `data`. Memory outside the pool that the
 * guest answers for as page-locked (page_locked_calls.c) has no device pointer: DEVICE_POINTER is
 * CUDA_ERROR_INVALID_VALUE, which cuda.h documents for memory the GPU cannot reach, and so is every attribute the
 * guest does not know (buffer id, IPC and mapping properties...), the driver's answer for a pointer it does not know;
 * cuPointerGetAttributes reads both as zero. The pool's other attributes are the host's to answer. */
int cuPointerGetAttribute(void *data, int attribute, CUdeviceptr pointer) {
    ORION_ENTRY("cuPointerGetAttribute");
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    struct orion_host_range range;
    if (orion_host_range_find(pointer, &range))
        return known_attribute(data, attribute, pointer, &range) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (orion_pool_range_find(pointer, &range) && known_attribute(data, attribute, pointer, &range))
        return CUDA_SUCCESS;
    uint8_t req[ORION_REQ_cuPointerGetAttribute_SIZE], rep[ORION_REP_cuPointerGetAttribute_SIZE];
    orion_put_i32(req + ORION_REQ_cuPointerGetAttribute_attribute, attribute);
    orion_put_u64(req + ORION_REQ_cuPointerGetAttribute_pointer, pointer);
    int status = orion_thread_forward(ORION_OP_cuPointerGetAttribute, req, sizeof req, rep, sizeof rep, 0);
    if (status != CUDA_SUCCESS) return status;
    uint32_t width = orion_get_u32(rep + ORION_REP_cuPointerGetAttribute_width);
    if (width != 4 && width != 8) return CUDA_ERROR_UNKNOWN;
    memcpy(data, rep + ORION_REP_cuPointerGetAttribute_value, width); /* little-endian: the value's low `width` bytes */
    return CUDA_SUCCESS;
}

int cuMemPoolGetAttribute(CUmemoryPool pool, int attribute, void *value) {
    ORION_ENTRY("cuMemPoolGetAttribute");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[ORION_REQ_cuMemPoolGetAttribute_SIZE], rep[ORION_REP_cuMemPoolGetAttribute_SIZE];
    orion_put_u64(req + ORION_REQ_cuMemPoolGetAttribute_pool, (uint64_t)(uintptr_t)pool);
    orion_put_i32(req + ORION_REQ_cuMemPoolGetAttribute_attribute, attribute);
    int status = orion_thread_forward(ORION_OP_cuMemPoolGetAttribute, req, sizeof req, rep, sizeof rep, 0);
    if (status != CUDA_SUCCESS) return status;
    uint64_t number = orion_get_u64(rep + ORION_REP_cuMemPoolGetAttribute_value);
    if (pool_attribute_is_64(attribute)) {
        memcpy(value, &number, 8);
    } else {
        int narrow = (int)(int64_t)number;
        memcpy(value, &narrow, sizeof narrow);
    }
    return CUDA_SUCCESS;
}

int cuMemPoolSetAttribute(CUmemoryPool pool, int attribute, void *value) {
    ORION_ENTRY("cuMemPoolSetAttribute");
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    uint64_t number;
    if (pool_attribute_is_64(attribute)) {
        memcpy(&number, value, 8);
    } else {
        int narrow;
        memcpy(&narrow, value, sizeof narrow);
        number = (uint64_t)(int64_t)narrow; /* an int's two's complement, as forward.py masks it */
    }
    uint8_t req[ORION_REQ_cuMemPoolSetAttribute_SIZE];
    orion_put_u64(req + ORION_REQ_cuMemPoolSetAttribute_pool, (uint64_t)(uintptr_t)pool);
    orion_put_i32(req + ORION_REQ_cuMemPoolSetAttribute_attribute, attribute);
    orion_put_u64(req + ORION_REQ_cuMemPoolSetAttribute_value, number);
    return orion_thread_forward(ORION_OP_cuMemPoolSetAttribute, req, sizeof req, NULL, 0, 0);
}
