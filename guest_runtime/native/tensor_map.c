/* tensor_map.c: cuTensorMapEncodeTiled for the native guest driver. A TMA descriptor is 128 opaque bytes that only
 * the driver can write, so the host encodes it (host_agent/launch_extras.py, which checks the global memory it
 * describes is the session's) and the guest copies them into the caller's CUtensorMap; kernels then receive it by
 * value as a launch parameter, as natively. */
#include <string.h>

#include "orion_guest.h"

#define MAX_RANK 5
#define MAP_BYTES 128
#define FIXED 32 /* i32 data type, u32 rank, u64 address, i32 interleave, swizzle, L2 promotion, OOB fill */

_Static_assert(sizeof(CUtensorMap) == MAP_BYTES && _Alignof(CUtensorMap) == 64, "CUtensorMap as cuda.h has it");

/* A `[Q]` or `[I]` field: u32 count, then the items little-endian. Returns the bytes written. */
static size_t put_u64s(uint8_t *at, const cuuint64_t *items, unsigned count) {
    orion_put_u32(at, count);
    for (unsigned i = 0; i < count; i++) orion_put_u64(at + 4 + 8 * i, items[i]);
    return 4 + 8 * (size_t)count;
}

static size_t put_u32s(uint8_t *at, const cuuint32_t *items, unsigned count) {
    orion_put_u32(at, count);
    for (unsigned i = 0; i < count; i++) orion_put_u32(at + 4 + 4 * i, items[i]);
    return 4 + 4 * (size_t)count;
}

CUresult cuTensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType data_type, cuuint32_t rank, void *address,
                                const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                                const cuuint32_t *element_strides, CUtensorMapInterleave interleave,
                                CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2_promotion,
                                CUtensorMapFloatOOBfill oob_fill) {
    /* The driver's own argument checks that need no GPU: the map 64-byte aligned, rank 1-5, the arrays there. */
    if (!map || (uintptr_t)map % 64 || rank < 1 || rank > MAX_RANK) return CUDA_ERROR_INVALID_VALUE;
    if (!dims || !box || !element_strides || (rank > 1 && !strides)) return CUDA_ERROR_INVALID_VALUE;
    uint8_t request[FIXED + 4 * 4 + MAX_RANK * 8 * 2 + MAX_RANK * 4 * 2], reply[MAP_BYTES];
    orion_put_i32(request, data_type);
    orion_put_u32(request + 4, rank);
    orion_put_u64(request + 8, (uint64_t)(uintptr_t)address);
    orion_put_i32(request + 16, interleave);
    orion_put_i32(request + 20, swizzle);
    orion_put_i32(request + 24, l2_promotion);
    orion_put_i32(request + 28, oob_fill);
    size_t len = FIXED;
    len += put_u64s(request + len, dims, rank);
    len += put_u64s(request + len, strides, rank - 1);
    len += put_u32s(request + len, box, rank);
    len += put_u32s(request + len, element_strides, rank);
    int status = orion_thread_forward(ORION_OP_cuTensorMapEncodeTiled, request, len, reply, sizeof reply, 0);
    if (status == CUDA_SUCCESS) memcpy(map, reply, MAP_BYTES);
    return status;
}
