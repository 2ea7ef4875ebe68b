/* tensor_map.c: the tensor-map family for the native guest driver (cuTensorMapEncodeTiled, Im2col, Im2colWide,
 * ReplaceAddress, SetAllocationClass). A TMA descriptor is 128 opaque bytes that only the driver can write, so the
 * host encodes it (host_agent/session/launch_extras.py, which checks the global memory it describes is the session's) and
 * the guest copies them into the caller's CUtensorMap; kernels then receive it by value as a launch parameter, as
 * natively. A replace or an allocation class sends the map's bytes, which the host takes only if it encoded them
 * for this session, and copies the new bytes back. */
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

/* An `[i]` field (the im2col corners). */
#define IM2COL(field) ORION_REQ_cuTensorMapEncodeIm2col_##field
_Static_assert(IM2COL(lower_ITEM) == REQ(box_ITEM) && IM2COL(upper_ITEM) == REQ(box_ITEM)
               && IM2COL(dims_ITEM) == REQ(dims_ITEM) && IM2COL(strides_ITEM) == REQ(dims_ITEM)
               && IM2COL(element_strides_ITEM) == REQ(box_ITEM) && IM2COL(dims) == IM2COL(SIZE),
               "the im2col arrays are the tiled ones' kinds, right after the fixed part");
static size_t put_i32s(uint8_t *at, const int *items, unsigned count) {
    orion_put_u32(at, count);
    for (unsigned i = 0; i < count; i++) orion_put_i32(at + ORION_LENGTH_BYTES + IM2COL(lower_ITEM) * i, items[i]);
    return ORION_LENGTH_BYTES + IM2COL(lower_ITEM) * (size_t)count;
}

CUresult cuTensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType data_type, cuuint32_t rank, void *address,
                                const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                                const cuuint32_t *element_strides, CUtensorMapInterleave interleave,
                                CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2_promotion,
                                CUtensorMapFloatOOBfill oob_fill) {
    ORION_ENTRY("cuTensorMapEncodeTiled");
    /* The driver's own argument checks that need no GPU: rank 1-5, the arrays there. Not the map's alignment: the
     * H200's driver takes cuda-python's CUtensorMap, which lies 32 bytes past a 64-byte boundary (the host encodes
     * into its own aligned copy, and the bytes are copied out). */
    if (!map || rank < 1 || rank > MAX_RANK) return CUDA_ERROR_INVALID_VALUE;
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

CUresult cuTensorMapEncodeIm2col(CUtensorMap *map, CUtensorMapDataType data_type, cuuint32_t rank, void *address,
                                 const cuuint64_t *dims, const cuuint64_t *strides, const int *lower,
                                 const int *upper, cuuint32_t channels, cuuint32_t pixels,
                                 const cuuint32_t *element_strides, CUtensorMapInterleave interleave,
                                 CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2_promotion,
                                 CUtensorMapFloatOOBfill oob_fill) {
    ORION_ENTRY("cuTensorMapEncodeIm2col");
    /* cuda.h: rank 3-5, the corners rank - 2 ints each. */
    if (!map || rank < 3 || rank > MAX_RANK) return CUDA_ERROR_INVALID_VALUE;
    if (!dims || !strides || !lower || !upper || !element_strides) return CUDA_ERROR_INVALID_VALUE;
    uint8_t request[IM2COL(SIZE) + 5 * ORION_LENGTH_BYTES
                    + MAX_RANK * (2 * IM2COL(dims_ITEM) + 2 * IM2COL(lower_ITEM) + IM2COL(element_strides_ITEM))];
    uint8_t reply[MAP_BYTES];
    orion_put_i32(request + IM2COL(data_type), data_type);
    orion_put_u32(request + IM2COL(rank), rank);
    orion_put_u64(request + IM2COL(address), (uint64_t)(uintptr_t)address);
    orion_put_i32(request + IM2COL(interleave), interleave);
    orion_put_i32(request + IM2COL(swizzle), swizzle);
    orion_put_i32(request + IM2COL(l2_promotion), l2_promotion);
    orion_put_i32(request + IM2COL(oob_fill), oob_fill);
    orion_put_u32(request + IM2COL(channels), channels);
    orion_put_u32(request + IM2COL(pixels), pixels);
    size_t len = IM2COL(dims);
    len += put_u64s(request + len, dims, rank);
    len += put_u64s(request + len, strides, rank - 1);
    len += put_i32s(request + len, lower, rank - 2);
    len += put_i32s(request + len, upper, rank - 2);
    len += put_u32s(request + len, element_strides, rank);
    int status = orion_thread_forward(ORION_OP_cuTensorMapEncodeIm2col, request, len, reply, sizeof reply, 0);
    if (status == CUDA_SUCCESS) memcpy(map, reply, MAP_BYTES);
    return status;
}

#define WIDE(field) ORION_REQ_cuTensorMapEncodeIm2colWide_##field
_Static_assert(WIDE(dims_ITEM) == REQ(dims_ITEM) && WIDE(strides_ITEM) == REQ(dims_ITEM)
               && WIDE(element_strides_ITEM) == REQ(box_ITEM) && WIDE(dims) == WIDE(SIZE),
               "the wide im2col arrays are the tiled ones' kinds, right after the fixed part");

CUresult cuTensorMapEncodeIm2colWide(CUtensorMap *map, CUtensorMapDataType data_type, cuuint32_t rank,
                                     void *address, const cuuint64_t *dims, const cuuint64_t *strides, int lower,
                                     int upper, cuuint32_t channels, cuuint32_t pixels,
                                     const cuuint32_t *element_strides, CUtensorMapInterleave interleave,
                                     CUtensorMapIm2ColWideMode mode, CUtensorMapSwizzle swizzle,
                                     CUtensorMapL2promotion l2_promotion, CUtensorMapFloatOOBfill oob_fill) {
    ORION_ENTRY("cuTensorMapEncodeIm2colWide");
    if (!map || rank < 3 || rank > MAX_RANK) return CUDA_ERROR_INVALID_VALUE;
    if (!dims || !strides || !element_strides) return CUDA_ERROR_INVALID_VALUE;
    uint8_t request[WIDE(SIZE) + 3 * ORION_LENGTH_BYTES + MAX_RANK * (2 * WIDE(dims_ITEM) + WIDE(element_strides_ITEM))];
    uint8_t reply[MAP_BYTES];
    orion_put_i32(request + WIDE(data_type), data_type);
    orion_put_u32(request + WIDE(rank), rank);
    orion_put_u64(request + WIDE(address), (uint64_t)(uintptr_t)address);
    orion_put_i32(request + WIDE(interleave), interleave);
    orion_put_i32(request + WIDE(mode), mode);
    orion_put_i32(request + WIDE(swizzle), swizzle);
    orion_put_i32(request + WIDE(l2_promotion), l2_promotion);
    orion_put_i32(request + WIDE(oob_fill), oob_fill);
    orion_put_i32(request + WIDE(lower), lower);
    orion_put_i32(request + WIDE(upper), upper);
    orion_put_u32(request + WIDE(channels), channels);
    orion_put_u32(request + WIDE(pixels), pixels);
    size_t len = WIDE(dims);
    len += put_u64s(request + len, dims, rank);
    len += put_u64s(request + len, strides, rank - 1);
    len += put_u32s(request + len, element_strides, rank);
    int status = orion_thread_forward(ORION_OP_cuTensorMapEncodeIm2colWide, request, len, reply, sizeof reply, 0);
    if (status == CUDA_SUCCESS) memcpy(map, reply, MAP_BYTES);
    return status;
}

#define REPLACE(field) ORION_REQ_cuTensorMapReplaceAddress_##field
#define ALLOC_CLASS_SMALL 1 /* CU_TENSOR_MAP_ALLOC_CLASS_SMALL */
#define ALLOC_CLASS(field) ORION_REQ_cuTensorMapSetAllocationClass_##field
#define ALLOC_CLASS_REP(field) ORION_REP_cuTensorMapSetAllocationClass_##field
_Static_assert(REPLACE(map) == REPLACE(SIZE) && ALLOC_CLASS(map) == ALLOC_CLASS(SIZE)
               && ALLOC_CLASS_REP(map) == ALLOC_CLASS_REP(SIZE) && ORION_REP_cuTensorMapReplaceAddress_map == 0,
               "the map's bytes are each payload's tail");

/* The host accepts only a map it encoded for this session (INVALID_VALUE otherwise: a descriptor built or edited in
 * the guest cannot be checked), and only a new address from which the map's tensor lies in the session's memory. */
CUresult cuTensorMapReplaceAddress(CUtensorMap *map, void *address) {
    ORION_ENTRY("cuTensorMapReplaceAddress");
    if (!map) return CUDA_ERROR_INVALID_VALUE;
    uint8_t request[REPLACE(SIZE) + MAP_BYTES], reply[MAP_BYTES];
    orion_put_u64(request + REPLACE(address), (uint64_t)(uintptr_t)address);
    memcpy(request + REPLACE(map), map, MAP_BYTES);
    int status = orion_thread_forward(ORION_OP_cuTensorMapReplaceAddress, request, sizeof request, reply,
                                      sizeof reply, 0);
    if (status == CUDA_SUCCESS) memcpy(map, reply, MAP_BYTES);
    return status;
}

/* cuda.h: `*out_class`, where given, is SMALL before validation and stays SMALL on failure; the map is not modified
 * on failure. */
CUresult cuTensorMapSetAllocationClass(CUtensorMap *map, CUtensorMapAllocClass alloc_class,
                                       CUtensorMapAllocClass *out_class) {
    ORION_ENTRY("cuTensorMapSetAllocationClass");
    if (out_class) *out_class = ALLOC_CLASS_SMALL;
    if (!map) return CUDA_ERROR_INVALID_VALUE;
    uint8_t request[ALLOC_CLASS(SIZE) + MAP_BYTES], reply[ALLOC_CLASS_REP(SIZE) + MAP_BYTES];
    orion_put_i32(request + ALLOC_CLASS(alloc_class), alloc_class);
    memcpy(request + ALLOC_CLASS(map), map, MAP_BYTES);
    int status = orion_thread_forward(ORION_OP_cuTensorMapSetAllocationClass, request, sizeof request, reply,
                                      sizeof reply, 0);
    if (status != CUDA_SUCCESS) return status;
    memcpy(map, reply + ALLOC_CLASS_REP(map), MAP_BYTES);
    if (out_class) *out_class = (CUtensorMapAllocClass)orion_get_i32(reply + ALLOC_CLASS_REP(effective));
    return status;
}
