/* page_locked_calls.c: cuMemAllocHost, cuMemHostAlloc, cuMemFreeHost, cuMemHostGetDevicePointer and
 * cuMemHostGetFlags over this channel's slice of the region's page-locked pool (pinned_pool.c), with the request
 * and reply schemas the call table declares, as guest_runtime/forward.py writes them: the host allocates in the
 * slice, the guest only agrees the slice's address once (POOL_MAP) and passes pointers.
 *
 * Page-locked memory is never refused for want of room: when the slice cannot serve an allocation (the region has
 * no pool, or the host answers OUT_OF_MEMORY for it) the allocation comes from ordinary guest pages instead, said
 * once on stderr. And cuMemHostRegister / cuMemHostUnregister (outside the call table) are answered here: a
 * registered range of whole pages is moved into the pool where it can be (moved_ranges.c), so the GPU reaches it and
 * it has the pool pages' device pointer; any other is only recorded. Both kinds of range, and fallback allocations,
 * are kept in one registry (owned: a fallback allocation this file frees; registered: the program's memory, only
 * forgotten, or given back by moved_ranges.c). Copies to and from them are pageable copies (copy_calls.c: they are
 * not in the pool's address range, so their bytes travel, staged, and an async copy to the host is complete when it
 * returns); an unmoved range has no device pointer (cuMemHostGetDevicePointer answers CUDA_ERROR_NOT_SUPPORTED,
 * said once); cuPointerGetAttribute answers for them in the guest (query_calls.c, orion_host_range_find).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "orion_guest.h"

#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713

enum {
    HOST_ALLOC_FLAGS = 0x7,     /* CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP | WRITECOMBINED (host_agent/session/pinned_pool.py) */
    REGISTER_FLAGS = 0xF,       /* CU_MEMHOSTREGISTER_PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY */
    REGISTER_IOMEMORY = 0x4,    /* CU_MEMHOSTREGISTER_IOMEMORY: a device's I/O memory, which no GPU here can reach */
};

/* --- the registry: guest memory answered for as page-locked (sorted by base, never overlapping) --------------- */

/* Two registries of the same shape: `outside`, guest memory answered for as page-locked (fallback allocations and
 * registered ranges), and `pooled`, this process's allocations in the pool's slice, kept only so that their pointer
 * attributes (the context, the allocation's range) are answered in the guest, on every path a session takes. */
struct registry {
    pthread_rwlock_t lock;
    struct orion_host_range *ranges;
    size_t count, cap;
    atomic_size_t listed; /* `count`, read without the lock: an empty registry costs a lookup one load */
};
static struct registry outside = { .lock = PTHREAD_RWLOCK_INITIALIZER };
static struct registry pooled = { .lock = PTHREAD_RWLOCK_INITIALIZER };

/* Under the lock: the index of the first range whose base is above `pointer` (count when none is). */
static size_t above(const struct registry *r, uint64_t pointer) {
    size_t low = 0, high = r->count;
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        if (r->ranges[middle].base <= pointer) low = middle + 1;
        else high = middle;
    }
    return low;
}

/* Under the lock: the index of the range holding `pointer`, or count. */
static size_t holding(const struct registry *r, uint64_t pointer) {
    size_t i = above(r, pointer);
    return i && pointer - r->ranges[i - 1].base < r->ranges[i - 1].size ? i - 1 : r->count;
}

/* Add a range ([base, base+size) must not wrap): CUDA_SUCCESS, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED where it
 * overlaps one listed, or CUDA_ERROR_OUT_OF_MEMORY. The range's context and device are the calling thread's. */
static int range_add(struct registry *r, struct orion_host_range range) {
    range.context = (uint64_t)(uintptr_t)orion_current_context();
    CUdevice device = 0;
    range.device = cuCtxGetDevice(&device) == CUDA_SUCCESS ? device : -1;
    int status = CUDA_SUCCESS;
    pthread_rwlock_wrlock(&r->lock);
    size_t i = above(r, range.base);
    if ((i && r->ranges[i - 1].base + r->ranges[i - 1].size > range.base) ||
        (i < r->count && r->ranges[i].base < range.base + range.size)) {
        status = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    } else if (r->count == r->cap) {
        size_t more = r->cap ? r->cap * 2 : 16;
        struct orion_host_range *grown = realloc(r->ranges, more * sizeof *grown);
        if (grown) {
            r->ranges = grown;
            r->cap = more;
        } else {
            status = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (status == CUDA_SUCCESS) {
        for (size_t j = r->count; j > i; j--) r->ranges[j] = r->ranges[j - 1];
        r->ranges[i] = range;
        atomic_store(&r->listed, ++r->count);
    }
    pthread_rwlock_unlock(&r->lock);
    return status;
}

/* A range outside the pool: refused where it overlaps the pool slice (page-locked already), else range_add. */
static int outside_add(struct orion_host_range range) {
    if (orion_pool_overlaps(range.base, range.size)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    return range_add(&outside, range);
}

/* Take out the range starting exactly at `base` whose kind is `owned`: 1 and the range, or 0 with *other saying
 * whether some other range holds `base` (one of the other kind, or one that starts below it). */
static int range_take(struct registry *r, uint64_t base, int owned, struct orion_host_range *taken, int *other) {
    int done = 0;
    *other = 0;
    if (!atomic_load(&r->listed)) return 0;
    pthread_rwlock_wrlock(&r->lock);
    size_t i = holding(r, base);
    if (i < r->count) {
        if (r->ranges[i].base == base && r->ranges[i].owned == owned) {
            *taken = r->ranges[i];
            for (size_t j = i + 1; j < r->count; j++) r->ranges[j - 1] = r->ranges[j];
            atomic_store(&r->listed, --r->count);
            done = 1;
        } else {
            *other = 1;
        }
    }
    pthread_rwlock_unlock(&r->lock);
    return done;
}

static int range_find(struct registry *r, uint64_t pointer, struct orion_host_range *range) {
    if (!atomic_load(&r->listed)) return 0;
    pthread_rwlock_rdlock(&r->lock);
    size_t i = holding(r, pointer);
    int found = i < r->count;
    if (found) *range = r->ranges[i];
    pthread_rwlock_unlock(&r->lock);
    return found;
}

int orion_host_range_find(uint64_t pointer, struct orion_host_range *range) {
    return range_find(&outside, pointer, range);
}

int orion_pool_range_find(uint64_t pointer, struct orion_host_range *range) {
    return range_find(&pooled, pointer, range);
}

/* The GPU cannot reach ordinary guest memory: no device pointer. Said once. */
static int no_device_pointer(void) {
    static atomic_flag said = ATOMIC_FLAG_INIT;
    if (!atomic_flag_test_and_set(&said))
        fprintf(stderr, "orion: cuMemHostGetDevicePointer of memory outside this channel's page-locked pool "
                "(a fallback allocation or cuMemHostRegister'ed memory): the GPU cannot reach ordinary guest memory, "
                "so it has no device pointer; returning 801 (CUDA_ERROR_NOT_SUPPORTED)\n");
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* --- allocation: the pool, else ordinary guest pages ------------------------------------------------------------ */

/* The pool could not serve `size` bytes: say once what happens instead and what to do. */
static void pool_fallback(size_t size) {
    static atomic_flag said = ATOMIC_FLAG_INIT;
    if (atomic_flag_test_and_set(&said)) return;
    uint64_t share = orion_pool_size();
    char why[96];
    if (share)
        snprintf(why, sizeof why, "this channel's share of the region's pool is %llu MiB",
                 (unsigned long long)(share >> 20));
    else
        snprintf(why, sizeof why, "this channel has no share of a page-locked pool");
    fprintf(stderr, "orion: no room for %zu page-locked bytes (%s): page-locked allocations that do not fit are "
            "served from ordinary guest memory, and copies to and from them are staged and slower; create the "
            "region larger (orion-shm create -s MiB) or with fewer channels\n", size, why);
}

static size_t page_size(void) {
    long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? (size_t)page : 4096;
}

/* `size` bytes of fresh (zeroed), page-aligned guest memory, listed as owned with `flags`: a CUresult. */
static int guest_alloc(void **pp, size_t size, unsigned int flags) {
    if (!orion_is_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!orion_current_context()) return CUDA_ERROR_INVALID_CONTEXT; /* as the pool's allocation needs one */
    if (!size || flags & ~(unsigned)HOST_ALLOC_FLAGS) return CUDA_ERROR_INVALID_VALUE;
    size_t page = page_size();
    if (size > SIZE_MAX - page) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t rounded = (size + page - 1) / page * page;
    void *pages = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pages == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    struct orion_host_range range = { .base = (uint64_t)(uintptr_t)pages, .size = size, .flags = flags, .owned = 1 };
    int status = outside_add(range);
    if (status != CUDA_SUCCESS) {
        munmap(pages, rounded);
        return status == CUDA_ERROR_OUT_OF_MEMORY ? status : CUDA_ERROR_UNKNOWN; /* fresh pages overlap nothing */
    }
    pool_fallback(size);
    *pp = pages;
    return CUDA_SUCCESS;
}

_Static_assert(ORION_REP_cuMemHostAlloc_SIZE == ORION_REP_cuMemAllocHost_SIZE &&
               ORION_REP_cuMemHostAlloc_pointer == ORION_REP_cuMemAllocHost_pointer, "one reply for both allocations");

/* An allocation in this channel's slice of the pool (cuMemAllocHost's or cuMemHostAlloc's request), the host's
 * answer: a CUresult. */
static int pool_alloc(uint32_t opcode, void **pp, const uint8_t *req, size_t len) {
    int status = orion_pool_ready();
    if (status == CUDA_SUCCESS) {
        uint8_t rep[ORION_REP_cuMemAllocHost_SIZE];
        status = orion_thread_forward(opcode, req, len, rep, sizeof rep, 0);
        if (status == CUDA_SUCCESS) *pp = (void *)(uintptr_t)orion_get_u64(rep + ORION_REP_cuMemAllocHost_pointer);
    }
    return status;
}

int orion_pool_alloc(void **pp, size_t size) {
    uint8_t req[ORION_REQ_cuMemAllocHost_SIZE];
    orion_put_u64(req + ORION_REQ_cuMemAllocHost_size, size);
    return pool_alloc(ORION_OP_cuMemAllocHost, pp, req, sizeof req);
}

static int host_alloc(uint32_t opcode, void **pp, size_t size, unsigned int flags, const uint8_t *req, size_t len) {
    if (!pp) return CUDA_ERROR_INVALID_VALUE;
    int status = pool_alloc(opcode, pp, req, len);
    /* OUT_OF_MEMORY: the slice is full, or this region has no pool; NOT_SUPPORTED: the agent keeps no pool for this
     * session. Any other failure (no channel, no context, bad arguments) is the answer. */
    if (status == CUDA_ERROR_OUT_OF_MEMORY || status == CUDA_ERROR_NOT_SUPPORTED) return guest_alloc(pp, size, flags);
    if (status == CUDA_SUCCESS) { /* listed for its pointer attributes; a listing that fails only costs those */
        struct orion_host_range range = { .base = (uint64_t)(uintptr_t)*pp, .size = size, .flags = flags, .owned = 2 };
        (void)range_add(&pooled, range);
    }
    return status;
}

int cuMemAllocHost(void **pp, size_t size) {
    ORION_ENTRY("cuMemAllocHost");
    uint8_t req[ORION_REQ_cuMemAllocHost_SIZE];
    orion_put_u64(req + ORION_REQ_cuMemAllocHost_size, size);
    return host_alloc(ORION_OP_cuMemAllocHost, pp, size, 0, req, sizeof req);
}

int cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
    ORION_ENTRY("cuMemHostAlloc");
    uint8_t req[ORION_REQ_cuMemHostAlloc_SIZE];
    orion_put_u64(req + ORION_REQ_cuMemHostAlloc_size, size);
    orion_put_u32(req + ORION_REQ_cuMemHostAlloc_flags, flags);
    return host_alloc(ORION_OP_cuMemHostAlloc, pp, size, flags, req, sizeof req);
}

int cuMemFreeHost(void *pointer) {
    ORION_ENTRY("cuMemFreeHost");
    struct orion_host_range range;
    int other;
    /* a fallback allocation: never forwarded */
    if (range_take(&outside, (uint64_t)(uintptr_t)pointer, 1, &range, &other)) {
        size_t page = page_size();
        munmap(pointer, (size_t)(range.size + page - 1) / page * page);
        return CUDA_SUCCESS;
    }
    if (other) return CUDA_ERROR_INVALID_VALUE; /* registered memory, or inside a fallback allocation */
    uint8_t req[ORION_REQ_cuMemFreeHost_SIZE];
    orion_put_u64(req + ORION_REQ_cuMemFreeHost_pointer, (uint64_t)(uintptr_t)pointer);
    int status = orion_thread_forward(ORION_OP_cuMemFreeHost, req, sizeof req, NULL, 0, 0);
    if (status == CUDA_SUCCESS) (void)range_take(&pooled, (uint64_t)(uintptr_t)pointer, 2, &range, &other);
    return status;
}

int cuMemHostGetDevicePointer(unsigned long long *pdptr, void *pointer, unsigned int flags) {
    ORION_ENTRY("cuMemHostGetDevicePointer");
    if (!pdptr) return CUDA_ERROR_INVALID_VALUE;
    struct orion_host_range range;
    uint64_t asked = (uint64_t)(uintptr_t)pointer;
    if (orion_host_range_find(asked, &range)) {
        if (flags) return CUDA_ERROR_INVALID_VALUE;
        if (!range.pool) return no_device_pointer();
        asked = range.pool + (asked - range.base); /* moved into the pool: its pages' device pointer */
    }
    uint8_t req[ORION_REQ_cuMemHostGetDevicePointer_SIZE], rep[ORION_REP_cuMemHostGetDevicePointer_SIZE];
    orion_put_u64(req + ORION_REQ_cuMemHostGetDevicePointer_pointer, asked);
    orion_put_u32(req + ORION_REQ_cuMemHostGetDevicePointer_flags, flags);
    int status = orion_thread_forward(ORION_OP_cuMemHostGetDevicePointer, req, sizeof req, rep, sizeof rep, 0);
    if (status == CUDA_SUCCESS) *pdptr = orion_get_u64(rep + ORION_REP_cuMemHostGetDevicePointer_device_pointer);
    return status;
}

int cuMemHostGetFlags(unsigned int *pflags, void *pointer) {
    ORION_ENTRY("cuMemHostGetFlags");
    if (!pflags) return CUDA_ERROR_INVALID_VALUE;
    struct orion_host_range range;
    if (orion_host_range_find((uint64_t)(uintptr_t)pointer, &range)) {
        *pflags = range.flags; /* as given at the allocation or registration */
        return CUDA_SUCCESS;
    }
    uint8_t req[ORION_REQ_cuMemHostGetFlags_SIZE], rep[ORION_REP_cuMemHostGetFlags_SIZE];
    orion_put_u64(req + ORION_REQ_cuMemHostGetFlags_pointer, (uint64_t)(uintptr_t)pointer);
    int status = orion_thread_forward(ORION_OP_cuMemHostGetFlags, req, sizeof req, rep, sizeof rep, 0);
    if (status == CUDA_SUCCESS) *pflags = orion_get_u32(rep + ORION_REP_cuMemHostGetFlags_flags);
    return status;
}

/* --- registration: moved into the pool where it can be, else recorded in the guest ------------------------------- */

/* cuda.h's cuMemHostRegister (the name cuMemHostRegister_v2 too: build.py's aliases). The range is moved into the
 * pool where it can be, else only recorded; either way the program sees the driver's answers (an overlap is
 * CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, the flags come back from cuMemHostGetFlags, pointer attributes say
 * host memory). Needs a current context, as the driver does. */
CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags) {
    ORION_ENTRY("cuMemHostRegister");
    if (!orion_is_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!orion_current_context()) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t base = (uint64_t)(uintptr_t)p;
    if (!p || !bytesize || Flags & ~(unsigned)REGISTER_FLAGS || bytesize > UINT64_MAX - base)
        return CUDA_ERROR_INVALID_VALUE;
    if (Flags & REGISTER_IOMEMORY) return orion_not_forwarded("cuMemHostRegister with CU_MEMHOSTREGISTER_IOMEMORY");
    struct orion_host_range range = { .base = base, .size = bytesize, .flags = Flags, .owned = 0 };
    int status = outside_add(range); /* listed first: an overlap is refused before anything moves */
    if (status != CUDA_SUCCESS) return status;
    int saved = errno; /* a move that cannot be made leaves the program's errno as it was */
    uint64_t pool = 0;
    if (orion_move_into_pool(base, bytesize, Flags, &pool)) {
        pthread_rwlock_wrlock(&outside.lock);
        size_t i = holding(&outside, base);
        if (i < outside.count) outside.ranges[i].pool = pool; /* listed above: its pool pages, for its device pointer */
        pthread_rwlock_unlock(&outside.lock);
    }
    errno = saved;
    return CUDA_SUCCESS;
}

/* Forget a registration made at exactly `p`; its memory stays the program's (a moved range's bytes moved back). */
CUresult cuMemHostUnregister(void *p) {
    ORION_ENTRY("cuMemHostUnregister");
    if (!orion_is_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!orion_current_context()) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t base = (uint64_t)(uintptr_t)p;
    struct orion_host_range range;
    int other;
    if (range_take(&outside, base, 0, &range, &other)) return range.pool ? orion_move_back(base) : CUDA_SUCCESS;
    /* memory that cuMemHostAlloc gave is not "not registered" to the driver: it answers INVALID_VALUE (as reported
     * against driver 590.48) */
    if (orion_pool_contains(base, 1)) return CUDA_ERROR_INVALID_VALUE;
    if (other && orion_host_range_find(base, &range) && range.owned && range.base == base)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}
