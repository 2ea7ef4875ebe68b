/* structured_copies.c: cuMemcpy2D, cuMemcpy2DUnaligned, cuMemcpy2DAsync, cuMemcpy3D, cuMemcpy3DAsync, cuMemcpy3DPeer
 * and cuMemcpy3DPeerAsync (what PyTorch's and CuPy's cudaMemcpy2D(Async) become). A copy travels as
 * driver_api.STRUCTURED_COPY: a 2D one as a CUDA_MEMCPY3D whose third dimension is empty, a peer one with its two
 * contexts, an async one with its stream (the host: host_agent/session/structured_copies.py).
 *
 * Each side is, to the host, one of:
 * - device memory: CU_MEMORYTYPE_DEVICE, UNIFIED at an address of this process's device ranges (device_ranges.c,
 *   as copy_calls.c's unified addressing decides), or a memory type cuda.h does not have (the driver answers it). It
 *   travels as the program described it; the host holds its whole pitched extent to the session's memory;
 * - page-locked pool memory: HOST, or UNIFIED, whose whole extent lies in this channel's pool slice
 *   (pinned_pool.c). It travels as its address, which the host maps, as copy_calls.c's pinned copies do;
 * - the program's pageable memory: any other HOST or UNIFIED side. It is staged: its rows, packed back to back
 *   (WidthInBytes each, row after row, slice after slice), are the request's tail (a source: sent from where they
 *   lie, or gathered into one buffer first where they are more than PIECES pieces) or come back as the reply (a
 *   destination: straight into the program's memory where the part's rows are contiguous there, else into a buffer
 *   scattered into them). The host copies them with a buffer of its own, so this side's geometry never leaves the
 *   guest and is held here to cuda.h's rules: a non-NULL address, XInBytes + WidthInBytes <= pitch where there is
 *   more than one row, Y + Height <= height where there is more than one slice, a pitch at most
 *   CU_DEVICE_ATTRIBUTE_MAX_PITCH of the current context's device (else CUDA_ERROR_INVALID_VALUE; no current context:
 *   cuCtxGetDevice's answer). A copy of more rows than PART_BYTES is several records of PART_BYTES, each carrying its
 *   part of the rows and the whole copy (the host checks the whole copy at every record, so a refused copy is
 *   refused at the first, before anything moved).
 * A CUDA array side answers CUDA_ERROR_NOT_SUPPORTED, named once, before anything is sent (arrays are not forwarded:
 * ivshmem/api_classes.py). Two pageable sides are a host-to-host copy, done here, row by row, after the same checks
 * and LOD 0. A staged source, and both sides of a host-to-host copy, are read when the copy is made, so the copy
 * first waits for its stream where earlier work may still touch them (orion_before_host_read: a host function of
 * this process, or the GPU in pool memory a relayed session stages), as the driver reads them after that work.
 *
 * When: a synchronous copy waits for its answer. An async one is posted where nothing comes back (device and pool
 * sides, or a staged source: its bytes are taken when the call returns) and waits where rows come back (a staged
 * destination: the program's memory is written when the call returns, as cuMemcpyDtoHAsync to pageable memory does).
 *
 * A session whose host does not map the pool (a relayed one: docs/remote.md) answers CUDA_ERROR_NOT_SUPPORTED for a
 * pool side, before copying anything; the copy is then sent again with that side staged, and so are later ones.
 * Until a pool side has once been taken, a copy naming one waits for its answer (an async one too), so that this
 * can still happen.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "copy_structs.h"

struct CUDA_MEMCPY2D_st { /* cuda.h's CUDA_MEMCPY2D_v2 */
    size_t srcXInBytes, srcY;
    int srcMemoryType; /* CUmemorytype */
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray; /* CUarray */
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
};

struct CUDA_MEMCPY3D_PEER_st { /* cuda.h's CUDA_MEMCPY3D_PEER_v1 */
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    CUcontext srcContext;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    CUcontext dstContext;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
};

_Static_assert(sizeof(CUDA_MEMCPY2D) == 128 && offsetof(CUDA_MEMCPY2D, srcHost) == 24 &&
               offsetof(CUDA_MEMCPY2D, srcPitch) == 48 && offsetof(CUDA_MEMCPY2D, dstXInBytes) == 56 &&
               offsetof(CUDA_MEMCPY2D, dstHost) == 80 && offsetof(CUDA_MEMCPY2D, WidthInBytes) == 112,
               "CUDA_MEMCPY2D as cuda.h lays it out");
_Static_assert(sizeof(CUDA_MEMCPY3D_PEER) == 200 && offsetof(CUDA_MEMCPY3D_PEER, srcContext) == 64 &&
               offsetof(CUDA_MEMCPY3D_PEER, srcPitch) == 72 && offsetof(CUDA_MEMCPY3D_PEER, dstContext) == 152 &&
               offsetof(CUDA_MEMCPY3D_PEER, WidthInBytes) == 176, "CUDA_MEMCPY3D_PEER as cuda.h lays it out");

enum {
    PART_BYTES = 64 << 20, /* rows per record: host_agent/session/structured_copies.py MAX_STAGED_PART */
    PIECES = 64,           /* a staged source's pieces sent from where they lie; more are gathered first */
    MEMORYTYPE_HOST = 1, MEMORYTYPE_ARRAY = 3, MEMORYTYPE_UNIFIED = 4, /* CUmemorytype */
    STAGED_NONE = 0, STAGED_SOURCE = 1, STAGED_DESTINATION = 2,       /* STRUCTURED_COPY's `staged` */
    ATTRIBUTE_MAX_PITCH = 11, /* CU_DEVICE_ATTRIBUTE_MAX_PITCH */
    SIDE_DEVICE = 0, SIDE_POOL = 1, SIDE_PAGEABLE = 2,
};

/* Where each call's request has its fields (orion_layouts.h); NO_FIELD where it has no such field. */
#define NO_FIELD SIZE_MAX
struct layout { uint32_t opcode; size_t size, staged, offset, length, copy, stream, src_context, dst_context; };
#define FIELDS(call) ORION_OP_##call, ORION_REQ_##call##_SIZE, ORION_REQ_##call##_staged, ORION_REQ_##call##_offset, \
                     ORION_REQ_##call##_length, ORION_REQ_##call##_MEMCPY_3D
static const struct layout COPY_2D = { FIELDS(cuMemcpy2D), NO_FIELD, NO_FIELD, NO_FIELD };
static const struct layout COPY_2D_UNALIGNED = { FIELDS(cuMemcpy2DUnaligned), NO_FIELD, NO_FIELD, NO_FIELD };
static const struct layout COPY_2D_ASYNC = { FIELDS(cuMemcpy2DAsync), ORION_REQ_cuMemcpy2DAsync_stream, NO_FIELD,
                                             NO_FIELD };
static const struct layout COPY_3D = { FIELDS(cuMemcpy3D), NO_FIELD, NO_FIELD, NO_FIELD };
static const struct layout COPY_3D_ASYNC = { FIELDS(cuMemcpy3DAsync), ORION_REQ_cuMemcpy3DAsync_stream, NO_FIELD,
                                             NO_FIELD };
static const struct layout COPY_PEER = { FIELDS(cuMemcpy3DPeer), NO_FIELD, ORION_REQ_cuMemcpy3DPeer_src_context,
                                         ORION_REQ_cuMemcpy3DPeer_dst_context };
static const struct layout COPY_PEER_ASYNC = { FIELDS(cuMemcpy3DPeerAsync), ORION_REQ_cuMemcpy3DPeerAsync_stream,
                                               ORION_REQ_cuMemcpy3DPeerAsync_src_context,
                                               ORION_REQ_cuMemcpy3DPeerAsync_dst_context };
#define HEAD_BYTES ORION_REQ_cuMemcpy3DPeerAsync_SIZE /* the longest fixed part */
_Static_assert(ORION_REQ_cuMemcpy2D_SIZE <= HEAD_BYTES && ORION_REQ_cuMemcpy2DUnaligned_SIZE <= HEAD_BYTES &&
               ORION_REQ_cuMemcpy2DAsync_SIZE <= HEAD_BYTES && ORION_REQ_cuMemcpy3D_SIZE <= HEAD_BYTES &&
               ORION_REQ_cuMemcpy3DAsync_SIZE <= HEAD_BYTES && ORION_REQ_cuMemcpy3DPeer_SIZE <= HEAD_BYTES,
               "every structured copy's fixed part fits the head");
_Static_assert(ORION_REP_cuMemcpy3D_SIZE == 0, "a staged destination's rows are the whole reply");

/* A copy as every entry point hands it on: cuda.h's CUDA_MEMCPY3D (a 2D copy's with an empty third dimension), a
 * peer copy's contexts, an async copy's stream. */
struct copy {
    const struct layout *layout;
    CUDA_MEMCPY3D c;
    uint64_t contexts[2];
    const CUstream *stream;
};

/* One side: its memory type, its address (the host pointer of a HOST side, else the device pointer), its offsets,
 * LOD, pitch and slice height. */
struct side { int type; uint64_t address; size_t x, y, z, lod, pitch, height; };

static struct side side_of(const CUDA_MEMCPY3D *c, int destination) {
    if (destination)
        return (struct side){ c->dstMemoryType, c->dstMemoryType == MEMORYTYPE_HOST ? (uint64_t)(uintptr_t)c->dstHost
                                                                                   : (uint64_t)c->dstDevice,
                              c->dstXInBytes, c->dstY, c->dstZ, c->dstLOD, c->dstPitch, c->dstHeight };
    return (struct side){ c->srcMemoryType, c->srcMemoryType == MEMORYTYPE_HOST ? (uint64_t)(uintptr_t)c->srcHost
                                                                               : (uint64_t)c->srcDevice,
                          c->srcXInBytes, c->srcY, c->srcZ, c->srcLOD, c->srcPitch, c->srcHeight };
}

/* Where a side's first byte lies from its address (cuda.h: (Z * height + Y) * pitch + XInBytes) and how far from
 * there its last row ends: 0 when either overflows. */
static int side_span(const struct side *s, size_t width, size_t height, size_t depth, uint64_t *start,
                     uint64_t *reach) {
    uint64_t rows, at;
    if (__builtin_mul_overflow((uint64_t)s->z, (uint64_t)s->height, &rows) || __builtin_add_overflow(rows, s->y, &rows)
        || __builtin_mul_overflow(rows, (uint64_t)s->pitch, &at) || __builtin_add_overflow(at, s->x, start))
        return 0;
    *reach = 0;
    if (!width || !height || !depth) return 1;
    if (__builtin_mul_overflow((uint64_t)(depth - 1), (uint64_t)s->height, &rows)
        || __builtin_add_overflow(rows, (uint64_t)(height - 1), &rows)
        || __builtin_mul_overflow(rows, (uint64_t)s->pitch, &at) || __builtin_add_overflow(at, width, reach))
        return 0;
    return 1;
}

/* Which of the three kinds a side is (above); pool memory only while `pool` (the host maps the pool). */
static int side_kind(const struct side *s, size_t width, size_t height, size_t depth, int pool) {
    if (s->type != MEMORYTYPE_HOST && s->type != MEMORYTYPE_UNIFIED) return SIDE_DEVICE;
    uint64_t start = 0, reach = 0, first = 0;
    int spans = side_span(s, width, height, depth, &start, &reach)
                && !__builtin_add_overflow(s->address, start, &first);
    if (s->type == MEMORYTYPE_UNIFIED && orion_range_contains(spans ? first : s->address)) return SIDE_DEVICE;
    if (pool && spans && orion_pool_contains(first, reach)) return SIDE_POOL;
    return SIDE_PAGEABLE;
}

/* cuda.h's rules for a pageable side, which the host never sees (above); on success *base is its first row. */
static int pageable_side(const struct side *s, size_t width, size_t height, size_t depth, size_t max_pitch,
                         uint64_t *base) {
    size_t need;
    uint64_t start, reach, end;
    if (!s->address) return CUDA_ERROR_INVALID_VALUE;
    if ((height > 1 || depth > 1) && (__builtin_add_overflow(s->x, width, &need) || s->pitch < need))
        return CUDA_ERROR_INVALID_VALUE;
    if (depth > 1 && (__builtin_add_overflow(s->y, height, &need) || s->height < need)) return CUDA_ERROR_INVALID_VALUE;
    if (s->pitch > max_pitch) return CUDA_ERROR_INVALID_VALUE;
    if (!side_span(s, width, height, depth, &start, &reach) || __builtin_add_overflow(s->address, start, base)
        || __builtin_add_overflow(*base, reach, &end))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* CU_DEVICE_ATTRIBUTE_MAX_PITCH of the current context's device (answered in the guest once known). */
static int max_pitch(size_t *limit) {
    CUdevice device;
    int status = cuCtxGetDevice(&device);
    if (status != CUDA_SUCCESS) return status;
    int value = 0;
    status = cuDeviceGetAttribute(&value, ATTRIBUTE_MAX_PITCH, device);
    if (status != CUDA_SUCCESS) return status;
    *limit = value > 0 ? (size_t)value : 0;
    return CUDA_SUCCESS;
}

/* --- a pageable side's rows ----------------------------------------------------------------------------------- */

/* A pageable side whose first row is at `base`, and the copy's extent. */
struct rows { const struct side *side; uint64_t base; size_t width, height, depth; };

/* Called for each contiguous run of the rows' bytes, in packed order; nonzero stops the walk (and is returned). */
typedef int (*run_fn)(void *state, uint8_t *at, size_t len);

/* The packed bytes [offset, offset + length) of `r`, where they lie in the program's memory, run by run. */
static int each_run(const struct rows *r, uint64_t offset, uint64_t length, run_fn fn, void *state) {
    const struct side *s = r->side;
    if (!length) return 0;
    if (r->height * r->depth == 1 || (s->pitch == r->width && (r->depth == 1 || s->height == r->height)))
        return fn(state, (uint8_t *)(uintptr_t)(r->base + offset), length); /* laid out as packed */
    for (uint64_t at = offset, end = offset + length; at < end;) {
        uint64_t row = at / r->width, column = at % r->width, n = r->width - column;
        if (n > end - at) n = end - at;
        uint64_t slice = row / r->height, in_slice = row % r->height;
        int stop = fn(state, (uint8_t *)(uintptr_t)(r->base + (slice * s->height + in_slice) * s->pitch + column), n);
        if (stop) return stop;
        at += n;
    }
    return 0;
}

/* Runs as request pieces after the head (pieces[0]): adjacent runs merged, at most `cap` pieces in all. */
struct pieces { struct orion_piece *piece; int count, cap; };

static int add_piece(void *state, uint8_t *at, size_t len) {
    struct pieces *p = state;
    struct orion_piece *last = &p->piece[p->count - 1];
    if (p->count > 1 && (const uint8_t *)last->data + last->len == at) {
        last->len += len;
        return 0;
    }
    if (p->count == p->cap) return 1;
    p->piece[p->count++] = (struct orion_piece){ at, len };
    return 0;
}

static int gather(void *state, uint8_t *at, size_t len) {
    uint8_t **cursor = state;
    memcpy(*cursor, at, len);
    *cursor += len;
    return 0;
}

static int scatter(void *state, uint8_t *at, size_t len) {
    uint8_t **cursor = state;
    memcpy(at, *cursor, len);
    *cursor += len;
    return 0;
}

/* --- records -------------------------------------------------------------------------------------------------- */

static size_t head_of(uint8_t head[HEAD_BYTES], const struct copy *cp, int staged, uint64_t offset, uint64_t length) {
    const struct layout *l = cp->layout;
    memset(head, 0, HEAD_BYTES);
    if (l->stream != NO_FIELD) orion_put_u64(head + l->stream, (uint64_t)(uintptr_t)*cp->stream);
    if (l->src_context != NO_FIELD) orion_put_u64(head + l->src_context, cp->contexts[0]);
    if (l->dst_context != NO_FIELD) orion_put_u64(head + l->dst_context, cp->contexts[1]);
    orion_put_u32(head + l->staged, (uint32_t)staged);
    orion_put_u64(head + l->offset, offset);
    orion_put_u64(head + l->length, length);
    orion_put_copy(head + l->copy, &cp->c);
    return l->size;
}

/* No staged side: the copy as described, posted when it is async (unless `wait`). */
static int send_copy(const struct copy *cp, int wait) {
    uint8_t head[HEAD_BYTES];
    size_t len = head_of(head, cp, STAGED_NONE, 0, 0);
    if (cp->stream && !wait) return orion_thread_post(cp->layout->opcode, head, len);
    return orion_thread_forward(cp->layout->opcode, head, len, NULL, 0, 0);
}

/* One part of a staged source: its rows from where they lie (or gathered), posted when `post`. */
static int send_rows(const struct copy *cp, const struct rows *r, uint64_t offset, uint64_t length, int post) {
    uint8_t head[HEAD_BYTES];
    struct orion_piece piece[PIECES + 1];
    piece[0] = (struct orion_piece){ head, head_of(head, cp, STAGED_SOURCE, offset, length) };
    struct pieces pieces = { piece, 1, PIECES + 1 };
    uint8_t *gathered = NULL;
    if (each_run(r, offset, length, add_piece, &pieces)) { /* many small runs: one buffer instead */
        gathered = malloc(length);
        if (!gathered) return CUDA_ERROR_OUT_OF_MEMORY;
        uint8_t *cursor = gathered;
        each_run(r, offset, length, gather, &cursor);
        piece[1] = (struct orion_piece){ gathered, length };
        pieces.count = 2;
    }
    int status = post ? orion_thread_postv(cp->layout->opcode, piece, pieces.count)
                      : orion_thread_forwardv(cp->layout->opcode, piece, pieces.count, NULL, 0, NULL, 0, NULL, 0);
    free(gathered);
    return status;
}

/* One part of a staged destination: its rows straight into the program's memory where they are contiguous there,
 * else through a buffer. */
static int receive_rows(const struct copy *cp, const struct rows *r, uint64_t offset, uint64_t length) {
    uint8_t head[HEAD_BYTES];
    struct orion_piece piece[2] = { { head, head_of(head, cp, STAGED_DESTINATION, offset, length) } };
    struct pieces one = { piece, 1, 2 };
    uint8_t *buffer = NULL, *into = NULL;
    if (length && !each_run(r, offset, length, add_piece, &one)) {
        into = (uint8_t *)piece[1].data;
    } else if (length) {
        into = buffer = malloc(length);
        if (!buffer) return CUDA_ERROR_OUT_OF_MEMORY;
    }
    size_t got = 0;
    int status = orion_thread_forwardv(cp->layout->opcode, piece, 1, NULL, 0, into, length, &got, 0);
    if (status == CUDA_SUCCESS && got != length) status = CUDA_ERROR_UNKNOWN; /* not the part asked for */
    if (status == CUDA_SUCCESS && buffer) {
        uint8_t *cursor = buffer;
        each_run(r, offset, length, scatter, &cursor);
    }
    free(buffer);
    return status;
}

/* Whether a side read here when the copy is made (a staged source, a host-to-host copy's sides) lies in page-locked
 * memory, which a relayed session stages: the copy then waits for the GPU first (orion_before_host_read). */
static int in_pool(const struct copy *cp, const struct side *s) {
    const CUDA_MEMCPY3D *c = &cp->c;
    uint64_t start = 0, reach = 0;
    return side_span(s, c->WidthInBytes, c->Height, c->Depth, &start, &reach)
           && orion_pool_contains(s->address + start, reach);
}

/* A copy with one pageable side (`staged`: which): part after part of its rows. */
static int staged_copy(const struct copy *cp, int staged, const struct side *s, int wait) {
    const CUDA_MEMCPY3D *c = &cp->c;
    struct rows r = { s, 0, c->WidthInBytes, c->Height, c->Depth };
    size_t limit;
    int status = max_pitch(&limit);
    if (status == CUDA_SUCCESS) status = pageable_side(s, r.width, r.height, r.depth, limit, &r.base);
    uint64_t total;
    if (status == CUDA_SUCCESS && (__builtin_mul_overflow((uint64_t)r.width, (uint64_t)r.height, &total)
                                   || __builtin_mul_overflow(total, (uint64_t)r.depth, &total)))
        status = CUDA_ERROR_INVALID_VALUE;
    if (status == CUDA_SUCCESS && staged == STAGED_SOURCE) status = orion_before_host_read(cp->stream, in_pool(cp, s));
    if (status != CUDA_SUCCESS) return status;
    int post = cp->stream && staged == STAGED_SOURCE && !wait;
    uint64_t offset = 0;
    do {
        uint64_t length = total - offset < PART_BYTES ? total - offset : PART_BYTES;
        status = staged == STAGED_SOURCE ? send_rows(cp, &r, offset, length, post)
                                         : receive_rows(cp, &r, offset, length);
        offset += length;
    } while (status == CUDA_SUCCESS && offset < total);
    return status;
}

/* Two pageable sides: row by row, here. */
static int host_to_host(const struct copy *cp, const struct side *src, const struct side *dst) {
    const CUDA_MEMCPY3D *c = &cp->c;
    size_t width = c->WidthInBytes, height = c->Height, depth = c->Depth, limit;
    uint64_t from, to;
    int status = max_pitch(&limit);
    if (status != CUDA_SUCCESS) return status;
    if (src->lod || dst->lod) return CUDA_ERROR_INVALID_VALUE; /* cuda.h: must be 0 */
    if ((status = pageable_side(src, width, height, depth, limit, &from)) != CUDA_SUCCESS) return status;
    if ((status = pageable_side(dst, width, height, depth, limit, &to)) != CUDA_SUCCESS) return status;
    status = orion_before_host_read(cp->stream, in_pool(cp, src) || in_pool(cp, dst));
    if (status != CUDA_SUCCESS) return status;
    for (size_t k = 0; k < depth && width; k++)
        for (size_t j = 0; j < height; j++)
            memmove((void *)(uintptr_t)(to + (k * dst->height + j) * dst->pitch),
                    (const void *)(uintptr_t)(from + (k * src->height + j) * src->pitch), width);
    return CUDA_SUCCESS;
}

static int route(const struct copy *cp, const struct side *src, const struct side *dst, int src_kind, int dst_kind,
                 int wait) {
    if (src_kind == SIDE_PAGEABLE && dst_kind == SIDE_PAGEABLE) return host_to_host(cp, src, dst);
    if (src_kind == SIDE_PAGEABLE) return staged_copy(cp, STAGED_SOURCE, src, wait);
    if (dst_kind == SIDE_PAGEABLE) return staged_copy(cp, STAGED_DESTINATION, dst, wait);
    return send_copy(cp, wait);
}

/* Whether the host maps this channel's pool: 0 not known yet, 1 it took a pool side, -1 it refused one. */
static int pool_sides;

static int structured(const struct copy *cp) {
    const CUDA_MEMCPY3D *c = &cp->c;
    if (c->srcMemoryType == MEMORYTYPE_ARRAY || c->dstMemoryType == MEMORYTYPE_ARRAY)
        return orion_not_forwarded("a cuMemcpy2D/cuMemcpy3D copy with a CUDA array operand");
    struct side src = side_of(c, 0), dst = side_of(c, 1);
    int pool = __atomic_load_n(&pool_sides, __ATOMIC_ACQUIRE);
    int src_kind = side_kind(&src, c->WidthInBytes, c->Height, c->Depth, pool >= 0);
    int dst_kind = side_kind(&dst, c->WidthInBytes, c->Height, c->Depth, pool >= 0);
    int trial = pool == 0 && (src_kind == SIDE_POOL || dst_kind == SIDE_POOL); /* the first pool side: wait */
    int status = route(cp, &src, &dst, src_kind, dst_kind, trial);
    if (!trial) return status;
    if (status == CUDA_SUCCESS) {
        __atomic_store_n(&pool_sides, 1, __ATOMIC_RELEASE);
    } else if (status == CUDA_ERROR_NOT_SUPPORTED) { /* refused before anything moved: stage it */
        status = route(cp, &src, &dst, src_kind == SIDE_POOL ? SIDE_PAGEABLE : src_kind,
                       dst_kind == SIDE_POOL ? SIDE_PAGEABLE : dst_kind, 0);
        if (status != CUDA_ERROR_NOT_SUPPORTED) __atomic_store_n(&pool_sides, -1, __ATOMIC_RELEASE);
    }
    return status;
}

/* --- the entry points ----------------------------------------------------------------------------------------- */

static int copy_2d(const struct layout *layout, const CUDA_MEMCPY2D *p, const CUstream *stream) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    struct copy cp = { .layout = layout, .stream = stream };
    CUDA_MEMCPY3D *c = &cp.c;
    c->srcXInBytes = p->srcXInBytes, c->srcY = p->srcY, c->srcMemoryType = p->srcMemoryType;
    c->srcHost = p->srcHost, c->srcDevice = p->srcDevice, c->srcArray = p->srcArray, c->srcPitch = p->srcPitch;
    c->dstXInBytes = p->dstXInBytes, c->dstY = p->dstY, c->dstMemoryType = p->dstMemoryType;
    c->dstHost = p->dstHost, c->dstDevice = p->dstDevice, c->dstArray = p->dstArray, c->dstPitch = p->dstPitch;
    c->WidthInBytes = p->WidthInBytes, c->Height = p->Height, c->Depth = 1;
    return structured(&cp);
}

static int copy_3d(const struct layout *layout, const CUDA_MEMCPY3D *p, const CUstream *stream) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    struct copy cp = { .layout = layout, .c = *p, .stream = stream };
    return structured(&cp);
}

static int copy_peer(const struct layout *layout, const CUDA_MEMCPY3D_PEER *p, const CUstream *stream) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    struct copy cp = { .layout = layout, .stream = stream,
                       .contexts = { (uint64_t)(uintptr_t)p->srcContext, (uint64_t)(uintptr_t)p->dstContext } };
    CUDA_MEMCPY3D *c = &cp.c;
    c->srcXInBytes = p->srcXInBytes, c->srcY = p->srcY, c->srcZ = p->srcZ, c->srcLOD = p->srcLOD;
    c->srcMemoryType = p->srcMemoryType, c->srcHost = p->srcHost, c->srcDevice = p->srcDevice;
    c->srcArray = p->srcArray, c->srcPitch = p->srcPitch, c->srcHeight = p->srcHeight;
    c->dstXInBytes = p->dstXInBytes, c->dstY = p->dstY, c->dstZ = p->dstZ, c->dstLOD = p->dstLOD;
    c->dstMemoryType = p->dstMemoryType, c->dstHost = p->dstHost, c->dstDevice = p->dstDevice;
    c->dstArray = p->dstArray, c->dstPitch = p->dstPitch, c->dstHeight = p->dstHeight;
    c->WidthInBytes = p->WidthInBytes, c->Height = p->Height, c->Depth = p->Depth;
    return structured(&cp);
}

CUresult cuMemcpy2D(CUDA_MEMCPY2D const *pCopy) {
    ORION_ENTRY("cuMemcpy2D");
    return copy_2d(&COPY_2D, pCopy, NULL);
}

CUresult cuMemcpy2DUnaligned(CUDA_MEMCPY2D const *pCopy) {
    ORION_ENTRY("cuMemcpy2DUnaligned");
    return copy_2d(&COPY_2D_UNALIGNED, pCopy, NULL);
}

CUresult cuMemcpy2DAsync(CUDA_MEMCPY2D const *pCopy, CUstream hStream) {
    ORION_ENTRY("cuMemcpy2DAsync");
    return copy_2d(&COPY_2D_ASYNC, pCopy, &hStream);
}

CUresult cuMemcpy3D(CUDA_MEMCPY3D const *pCopy) {
    ORION_ENTRY("cuMemcpy3D");
    return copy_3d(&COPY_3D, pCopy, NULL);
}

CUresult cuMemcpy3DAsync(CUDA_MEMCPY3D const *pCopy, CUstream hStream) {
    ORION_ENTRY("cuMemcpy3DAsync");
    return copy_3d(&COPY_3D_ASYNC, pCopy, &hStream);
}

CUresult cuMemcpy3DPeer(CUDA_MEMCPY3D_PEER const *pCopy) {
    ORION_ENTRY("cuMemcpy3DPeer");
    return copy_peer(&COPY_PEER, pCopy, NULL);
}

CUresult cuMemcpy3DPeerAsync(CUDA_MEMCPY3D_PEER const *pCopy, CUstream hStream) {
    ORION_ENTRY("cuMemcpy3DPeerAsync");
    return copy_peer(&COPY_PEER_ASYNC, pCopy, &hStream);
}
