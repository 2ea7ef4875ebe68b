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

/* The host answers the value and its width; `width` bytes of it go to `data`. */
int cuPointerGetAttribute(void *data, int attribute, CUdeviceptr pointer) {
    if (!data) return CUDA_ERROR_INVALID_VALUE;
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
