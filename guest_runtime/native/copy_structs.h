/* copy_structs.h: cuda.h's CUDA_MEMCPY3D, completed byte for byte, and how it travels (driver_api.MEMCPY_3D): what
 * graph_calls.c (memcpy nodes) and structured_copies.c (cuMemcpy2D/3D) share. Private to guest_runtime/native/.
 *
 * The generated orion_calls.h declares the struct incomplete; this completes its tag (the asserts hold it to
 * cuda.h's CUDA 13 layout), and put_copy writes it where a request embeds MEMCPY_3D (ORION_REQ_<call>_MEMCPY_3D),
 * every field at its generated place (ORION_MEMCPY_3D_src/dst, ORION_MEMCPY_3D_SIDE_*).
 */
#ifndef ORION_COPY_STRUCTS_H
#define ORION_COPY_STRUCTS_H

#include <stddef.h>
#include <stdint.h>

#include "orion_guest.h"

struct CUDA_MEMCPY3D_st {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType; /* CUmemorytype */
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray; /* CUarray */
    void *reserved0;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    void *reserved1;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
};

_Static_assert(sizeof(CUDA_MEMCPY3D) == 200 && offsetof(CUDA_MEMCPY3D, srcHost) == 40 &&
               offsetof(CUDA_MEMCPY3D, srcPitch) == 72 && offsetof(CUDA_MEMCPY3D, dstXInBytes) == 88 &&
               offsetof(CUDA_MEMCPY3D, dstHost) == 128 && offsetof(CUDA_MEMCPY3D, WidthInBytes) == 176,
               "CUDA_MEMCPY3D as cuda.h lays it out");

/* One copy side at `p` (ORION_MEMCPY_3D_src or _dst from where the request has MEMCPY_3D). */
static inline void orion_put_copy_side(uint8_t *p, size_t x, size_t y, size_t z, size_t lod, int type,
                                       const void *host, CUdeviceptr device, size_t pitch, size_t height) {
    orion_put_u64(p + ORION_MEMCPY_3D_SIDE_x, x);
    orion_put_u64(p + ORION_MEMCPY_3D_SIDE_y, y);
    orion_put_u64(p + ORION_MEMCPY_3D_SIDE_z, z);
    orion_put_u64(p + ORION_MEMCPY_3D_SIDE_lod, lod);
    orion_put_u32(p + ORION_MEMCPY_3D_SIDE_type, (uint32_t)type);
    orion_put_u64(p + ORION_MEMCPY_3D_SIDE_host, (uint64_t)(uintptr_t)host);
    orion_put_u64(p + ORION_MEMCPY_3D_SIDE_device, device);
    orion_put_u64(p + ORION_MEMCPY_3D_SIDE_pitch, pitch);
    orion_put_u64(p + ORION_MEMCPY_3D_SIDE_height, height);
}

/* The whole copy at `p`, where the request has MEMCPY_3D (ORION_MEMCPY_3D_SIZE bytes). */
static inline void orion_put_copy(uint8_t *p, const CUDA_MEMCPY3D *c) {
    orion_put_copy_side(p + ORION_MEMCPY_3D_src, c->srcXInBytes, c->srcY, c->srcZ, c->srcLOD, c->srcMemoryType,
                        c->srcHost, c->srcDevice, c->srcPitch, c->srcHeight);
    orion_put_copy_side(p + ORION_MEMCPY_3D_dst, c->dstXInBytes, c->dstY, c->dstZ, c->dstLOD, c->dstMemoryType,
                        c->dstHost, c->dstDevice, c->dstPitch, c->dstHeight);
    orion_put_u64(p + ORION_MEMCPY_3D_width, c->WidthInBytes);
    orion_put_u64(p + ORION_MEMCPY_3D_height, c->Height);
    orion_put_u64(p + ORION_MEMCPY_3D_depth, c->Depth);
}

#endif
