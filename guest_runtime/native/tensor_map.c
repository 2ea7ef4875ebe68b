/* tensor_map.c: cuTensorMapEncodeTiled for the native guest driver. A TMA descriptor is 128 opaque bytes that only
 * the driver can write, so the host encodes it (host_agent/launch_extras.py, which checks the global memory it
 * describes is the session's) and the guest copies them into the caller's CUtensorMap; kernels then receive it by
 * value as a launch parameter, as natively. */
#include <string.h>

#include "orion_guest.h"

#define MAX_RANK 5
#define MAP_BYTES 128
#define REQ(field) ORION_REQ_cuTensorMapEncodeTiled_##field /* data type, rank, address, ...; then the four arrays */
/* The request at its longest: the fixed part, then four counted arrays of MAX_RANK items at most. */
#define REQUEST_BYTES (REQ(SIZE) + 4 * ORION_LENGTH_BYTES \
                       + MAX_RANK * (REQ(dims_ITEM) + REQ(strides_ITEM) + REQ(box_ITEM) + REQ(element_strides_ITEM)))
_Static_assert(REQ(strides_ITEM) == REQ(dims_ITEM) && REQ(element_strides_ITEM) == REQ(box_ITEM)
               && REQ(dims) == REQ(SIZE), "`[Q]` and `[I]` arrays, right after the fixed part");

_Static_assert(sizeof(CUtensorMap) == MAP_BYTES && _Alignof(CUtensorMap) == 64, "CUtensorMap as cuda.h has it");

/* A `[Q]` or `[I]` field: u32 count, then the items little-endian. Returns the bytes written. */
static size_t put_u64s(uint8_t *at, const cuuint64_t *items, unsigned count) {
    orion_put_u32(at, count);
    for (unsigned i = 0; i < count; i++) orion_put_u64(at + ORION_LENGTH_BYTES + REQ(dims_ITEM) * i, items[i]);
    return ORION_LENGTH_BYTES + REQ(dims_ITEM) * (size_t)count;
}

static size_t put_u32s(uint8_t *at, const cuuint32_t *items, unsigned count) {
    orion_put_u32(at, count);
    for (unsigned i = 0; i < count; i++) orion_put_u32(at + ORION_LENGTH_BYTES + REQ(box_ITEM) * i, items[i]);
    return ORION_LENGTH_BYTES + REQ(box_ITEM) * (size_t)count;
}

CUresult cuTensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType data_type, cuuint32_t rank, void *address,
                                const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                                const cuuint32_t *element_strides, CUtensorMapInterleave interleave,
                                CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2_promotion,
                                CUtensorMapFloatOOBfill oob_fill) {
    /* The driver's own argument checks that need no GPU: the map 64-byte aligned, rank 1-5, the arrays there. */
    if (!map || (uintptr_t)map % 64 || rank < 1 || rank > MAX_RANK) return CUDA_ERROR_INVALID_VALUE;
    if (!dims || !box || !element_strides || (rank > 1 && !strides)) return CUDA_ERROR_INVALID_VALUE;
    uint8_t request[REQUEST_BYTES], reply[MAP_BYTES]; /* the reply: the descriptor's bytes, the whole tail */
    orion_put_i32(request + REQ(data_type), data_type);
    orion_put_u32(request + REQ(rank), rank);
    orion_put_u64(request + REQ(address), (uint64_t)(uintptr_t)address);
    orion_put_i32(request + REQ(interleave), interleave);
    orion_put_i32(request + REQ(swizzle), swizzle);
    orion_put_i32(request + REQ(l2_promotion), l2_promotion);
    orion_put_i32(request + REQ(oob_fill), oob_fill);
    size_t len = REQ(dims);
    len += put_u64s(request + len, dims, rank);
    len += put_u64s(request + len, strides, rank - 1);
    len += put_u32s(request + len, box, rank);
    len += put_u32s(request + len, element_strides, rank);
    int status = orion_thread_forward(ORION_OP_cuTensorMapEncodeTiled, request, len, reply, sizeof reply, 0);
    if (status == CUDA_SUCCESS) memcpy(map, reply, MAP_BYTES);
    return status;
}
