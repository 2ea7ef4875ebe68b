/* page_locked_calls.c: cuMemAllocHost, cuMemHostAlloc, cuMemFreeHost, cuMemHostGetDevicePointer and
 * cuMemHostGetFlags over this channel's slice of the region's page-locked pool (pinned_pool.c), with the request
 * and reply schemas the call table declares, as guest_runtime/forward.py writes them: the host allocates in the
 * slice, the guest only agrees the slice's address once (POOL_MAP) and passes pointers.
 */
#include <stdatomic.h>
#include <stdio.h>

#include "orion_guest.h"

/* No room for `size` page-locked bytes: say once why and what to do. */
static void pool_exhausted(size_t size) {
    static atomic_flag said = ATOMIC_FLAG_INIT;
    if (atomic_flag_test_and_set(&said)) return;
    fprintf(stderr, "orion: no room for %zu page-locked bytes: this channel's share of the region's pool is %llu MiB; "
            "create the region larger (orion-shm create -s MiB) or with fewer channels\n", size,
            (unsigned long long)(orion_pool_size() >> 20));
}

static int host_alloc(uint32_t opcode, void **pp, size_t size, const uint8_t *req, size_t len) {
    if (!pp) return CUDA_ERROR_INVALID_VALUE;
    int status = orion_pool_ready();
    if (status == CUDA_SUCCESS) {
        uint8_t rep[8];
        status = orion_thread_forward(opcode, req, len, rep, sizeof rep, 0);
        if (status == CUDA_SUCCESS) *pp = (void *)(uintptr_t)orion_get_u64(rep);
    }
    if (status == CUDA_ERROR_OUT_OF_MEMORY) pool_exhausted(size);
    return status;
}

int cuMemAllocHost(void **pp, size_t size) {
    uint8_t req[8];
    orion_put_u64(req, size);
    return host_alloc(ORION_OP_cuMemAllocHost, pp, size, req, sizeof req);
}

int cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
    uint8_t req[12];
    orion_put_u64(req, size);
    orion_put_u32(req + 8, flags);
    return host_alloc(ORION_OP_cuMemHostAlloc, pp, size, req, sizeof req);
}

int cuMemFreeHost(void *pointer) {
    uint8_t req[8];
    orion_put_u64(req, (uint64_t)(uintptr_t)pointer);
    return orion_thread_forward(ORION_OP_cuMemFreeHost, req, sizeof req, NULL, 0, 0);
}

int cuMemHostGetDevicePointer(unsigned long long *pdptr, void *pointer, unsigned int flags) {
    if (!pdptr) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[12], rep[8];
    orion_put_u64(req, (uint64_t)(uintptr_t)pointer);
    orion_put_u32(req + 8, flags);
    int status = orion_thread_forward(ORION_OP_cuMemHostGetDevicePointer, req, sizeof req, rep, sizeof rep, 0);
    if (status == CUDA_SUCCESS) *pdptr = orion_get_u64(rep);
    return status;
}

int cuMemHostGetFlags(unsigned int *pflags, void *pointer) {
    if (!pflags) return CUDA_ERROR_INVALID_VALUE;
    uint8_t req[8], rep[4];
    orion_put_u64(req, (uint64_t)(uintptr_t)pointer);
    int status = orion_thread_forward(ORION_OP_cuMemHostGetFlags, req, sizeof req, rep, sizeof rep, 0);
    if (status == CUDA_SUCCESS) *pflags = orion_get_u32(rep);
    return status;
}
