/* copy_calls.c: cuMemcpyHtoD, cuMemcpyDtoH, their Async forms, and cuMemcpy / cuMemcpyAsync with unified
 * addressing, as guest_runtime/forward.py writes them.
 *
 * A copy's request is its device range (and stream) packed as the table's fixed part, then the program's bytes as
 * the tail, sent where they lie (a second piece, never copied first); a copy to the host gets the reply's tail
 * written straight into the program's buffer. When the host side lies in this channel's page-locked pool slice
 * (pinned_pool.c), the copy is the table's pinned variant (opcode + 0x2000) naming the pool address instead: no
 * bytes travel, and an async one is posted to run in stream order on the host, as natively.
 *
 * Any other host memory, page-locked in the program's eyes or not (a fallback allocation when the pool had no room,
 * a cuMemHostRegister'ed range: page_locked_calls.c), is pageable here: its bytes travel, and an async copy waits
 * for its reply, so a copy to the host has written the program's buffer when it returns (and a later synchronize
 * finds nothing of it outstanding), and a copy from it has taken the bytes. But a small copy to the device, async
 * on a default stream or synchronous, that the driver would take returns once its bytes are in the channel
 * (posted_as_the_driver_would), instead of waiting for the host's answer: the driver's pageable copy returns once
 * it staged the bytes, and this process's later work reaches the GPU through the same channel, after it. A copy
 * from the pool never travels so, whatever its size: earlier work of the stream may still write those pages (a
 * kernel, a copy into them), and the driver reads them after it, so the host reads them in stream order. A
 * synchronous copy from pageable memory, whose bytes the driver reads after syncing the stream, waits for the legacy
 * stream first while a host function or callback of this process may still run (one queued before it may write
 * them). A pageable copy larger than one request may carry (ORION_MAX_PAYLOAD each way) travels as consecutive
 * requests of at most PAGEABLE_PIECE bytes, in order, each awaited: the driver takes a copy of any size. One that
 * fails part of the way answers the error, as the driver's would, with the pieces before it copied.
 */
#include <string.h>

#include "orion_guest.h"


int cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t size);                        /* generated */
int cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t size, CUstream stream); /* generated */
int cuStreamSynchronize(CUstream stream);                                               /* generated */

/* The four copies share two layouts, cuMemcpyHtoD's and (async) cuMemcpyHtoDAsync's, whose device and size lie
 * alike: htod() and dtoh() pack them all. */
#define SAME_COPY(a, b) (ORION_REQ_##a##_device == ORION_REQ_##b##_device \
                         && ORION_REQ_##a##_size == ORION_REQ_##b##_size \
                         && ORION_REQ_##a##_SIZE == ORION_REQ_##b##_SIZE \
                         && ORION_PINNED_##a##_host == ORION_PINNED_##b##_host \
                         && ORION_PINNED_##a##_SIZE == ORION_PINNED_##b##_SIZE)
_Static_assert(SAME_COPY(cuMemcpyDtoH, cuMemcpyHtoD) && SAME_COPY(cuMemcpyDtoHAsync, cuMemcpyHtoDAsync)
               && ORION_REQ_cuMemcpyHtoD_device == ORION_REQ_cuMemcpyHtoDAsync_device
               && ORION_REQ_cuMemcpyHtoD_size == ORION_REQ_cuMemcpyHtoDAsync_size
               && ORION_PINNED_cuMemcpyHtoD_SIZE <= ORION_PINNED_cuMemcpyHtoDAsync_SIZE, "one packing for four copies");
#define HEAD_BYTES ORION_PINNED_cuMemcpyHtoDAsync_SIZE /* the longest: an async copy's pinned request */
#define PAGEABLE_PIECE (ORION_MAX_PAYLOAD / 2)      /* the most one pageable copy request carries: well within */

/* The fixed part: (device, size) and the stream of an async copy; its length. */
static size_t head_of(uint8_t head[HEAD_BYTES], uint64_t device, size_t size, const CUstream *stream) {
    orion_put_u64(head + ORION_REQ_cuMemcpyHtoD_device, device);
    orion_put_u64(head + ORION_REQ_cuMemcpyHtoD_size, size);
    if (!stream) return ORION_REQ_cuMemcpyHtoD_SIZE;
    orion_put_u64(head + ORION_REQ_cuMemcpyHtoDAsync_stream, (uint64_t)(uintptr_t)*stream);
    return ORION_REQ_cuMemcpyHtoDAsync_SIZE;
}

/* The pinned request (the fixed part, then the pool address): awaited, or posted for an async copy. */
static int pinned_copy(uint32_t opcode, uint8_t head[HEAD_BYTES], const void *host, int is_async) {
    if (is_async) {
        orion_put_u64(head + ORION_PINNED_cuMemcpyHtoDAsync_host, (uint64_t)(uintptr_t)host);
        return orion_thread_post(opcode + ORION_PINNED_COPY, head, ORION_PINNED_cuMemcpyHtoDAsync_SIZE);
    }
    orion_put_u64(head + ORION_PINNED_cuMemcpyHtoD_host, (uint64_t)(uintptr_t)host);
    return orion_thread_forward(opcode + ORION_PINNED_COPY, head, ORION_PINNED_cuMemcpyHtoD_SIZE, NULL, 0, 0);
}

static int htod(uint32_t opcode, CUdeviceptr dst, const void *src, size_t size, const CUstream *stream);
static int dtoh(uint32_t opcode, void *dst, CUdeviceptr src, size_t size, const CUstream *stream);

/* A pageable copy too large for one request: PAGEABLE_PIECE bytes at a time, in order, each awaited. */
static int in_pieces(int to_device, uint32_t opcode, CUdeviceptr device, uint8_t *host, size_t size,
                     const CUstream *stream) {
    for (size_t done = 0; done < size; done += PAGEABLE_PIECE) {
        size_t piece = size - done < PAGEABLE_PIECE ? size - done : PAGEABLE_PIECE;
        int status = to_device ? htod(opcode, device + done, host + done, piece, stream)
                               : dtoh(opcode, host + done, device + done, piece, stream);
        if (status != CUDA_SUCCESS) return status;
    }
    return CUDA_SUCCESS;
}

/* Whether a copy to the device may return once its bytes are taken, as the driver's pageable one does (it returns
 * once its staging holds them, before the DMA): posted, when nothing the driver checks before returning can fail. Its
 * bytes are in the ring or its staging chunks when the post returns, however large. Into memory this process
 * allocated (not a reserved range nor a graph's allocation: device memory only while mapped or live), synchronous,
 * on a default stream (always a valid handle) or on a stream this process created in the current context and has not
 * destroyed (known_handles.c), with a context current and no stream capture possibly under way in the process (which
 * a copy on the legacy stream would break, synchronously), and the GPU not known to be gone (orion_device_unavailable: a relay that lost its GPU host answers
 * each copy itself). Anything else waits for the host's answer, as before. A failure found later on the host (the
 * GPU's) comes back as an earlier posted call's error at the next call, as the driver reports an asynchronous one. */
static int posted_as_the_driver_would(CUdeviceptr dst, size_t size, const CUstream *stream) {
    uint64_t handle = stream ? (uint64_t)(uintptr_t)*stream : 0;
    return size && orion_is_initialized()
           && (handle <= 2 || orion_known(ORION_KNOWN_STREAMS, handle))
           && orion_current_context() != NULL && !orion_captures_may_run() && !orion_device_unavailable()
           && orion_range_allocated(dst, size);
}

int orion_before_host_read(const CUstream *stream, int pool) {
    if (!pool && (stream || !orion_host_functions_may_run())) return CUDA_SUCCESS;
    return cuStreamSynchronize(stream ? *stream : NULL);
}

static int htod(uint32_t opcode, CUdeviceptr dst, const void *src, size_t size, const CUstream *stream) {
    if (size && !src) return CUDA_ERROR_INVALID_VALUE;
    uint8_t head[HEAD_BYTES];
    size_t len = head_of(head, dst, size, stream);
    /* the host reads the shared pages, in stream order: after the stream's earlier work, which may write them */
    if (orion_pool_contains((uint64_t)(uintptr_t)src, size)) return pinned_copy(opcode, head, src, stream != NULL);
    if (size) {
        int status = orion_before_host_read(stream, 0);
        if (status != CUDA_SUCCESS) return status;
    }
    int posted = posted_as_the_driver_would(dst, size, stream);
    if (size > PAGEABLE_PIECE) return in_pieces(1, opcode, dst, (uint8_t *)(uintptr_t)src, size, stream);
    struct orion_piece pieces[2] = { { head, len }, { src, size } };
    if (posted) {
        int pending = orion_pending_async_error();
        return pending != CUDA_SUCCESS ? pending : orion_thread_postv(opcode, pieces, size ? 2 : 1);
    }
    return orion_thread_forwardv(opcode, pieces, size ? 2 : 1, NULL, 0, NULL, 0, NULL, 0);
}

static int dtoh(uint32_t opcode, void *dst, CUdeviceptr src, size_t size, const CUstream *stream) {
    if (size && !dst) return CUDA_ERROR_INVALID_VALUE;
    uint8_t head[HEAD_BYTES];
    size_t len = head_of(head, src, size, stream);
    if (orion_pool_contains((uint64_t)(uintptr_t)dst, size)) /* the host writes the shared pages */
        return pinned_copy(opcode, head, dst, stream != NULL);
    if (size > PAGEABLE_PIECE) return in_pieces(0, opcode, src, dst, size, stream);
    struct orion_piece piece = { head, len };
    size_t got;
    return orion_thread_forwardv(opcode, &piece, 1, NULL, 0, size ? dst : NULL, size, &got, 0);
}

int cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t size) {
    ORION_ENTRY("cuMemcpyHtoD");
    return htod(ORION_OP_cuMemcpyHtoD, dst, src, size, NULL);
}

int cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t size, CUstream stream) {
    ORION_ENTRY("cuMemcpyHtoDAsync");
    return htod(ORION_OP_cuMemcpyHtoDAsync, dst, src, size, &stream);
}

int cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t size) {
    ORION_ENTRY("cuMemcpyDtoH");
    return dtoh(ORION_OP_cuMemcpyDtoH, dst, src, size, NULL);
}

int cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t size, CUstream stream) {
    ORION_ENTRY("cuMemcpyDtoHAsync");
    return dtoh(ORION_OP_cuMemcpyDtoHAsync, dst, src, size, &stream);
}

/* Unified addressing: the direction from where each pointer lies (device_ranges.c). */
static int uva_copy(CUdeviceptr dst, CUdeviceptr src, size_t size, const CUstream *stream) {
    if (!size) return CUDA_SUCCESS;
    int to_device = orion_range_contains(dst), from_device = orion_range_contains(src);
    if (to_device && from_device)
        return stream ? cuMemcpyDtoDAsync(dst, src, size, *stream) : cuMemcpyDtoD(dst, src, size);
    if (to_device)
        return stream ? htod(ORION_OP_cuMemcpyHtoDAsync, dst, (const void *)(uintptr_t)src, size, stream)
                      : htod(ORION_OP_cuMemcpyHtoD, dst, (const void *)(uintptr_t)src, size, NULL);
    if (from_device)
        return stream ? dtoh(ORION_OP_cuMemcpyDtoHAsync, (void *)(uintptr_t)dst, src, size, stream)
                      : dtoh(ORION_OP_cuMemcpyDtoH, (void *)(uintptr_t)dst, src, size, NULL);
    if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, size); /* host to host: nothing for the GPU */
    return CUDA_SUCCESS;
}

int cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t size) {
    ORION_ENTRY("cuMemcpy");
    return uva_copy(dst, src, size, NULL);
}

int cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t size, CUstream stream) {
    ORION_ENTRY("cuMemcpyAsync");
    return uva_copy(dst, src, size, &stream);
}
