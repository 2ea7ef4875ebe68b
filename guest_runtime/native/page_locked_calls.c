/* page_locked_calls.c: cuMemAllocHost, cuMemHostAlloc, cuMemFreeHost, cuMemHostGetDevicePointer and
 * cuMemHostGetFlags over this channel's slice of the region's page-locked pool (pinned_pool.c), with the request
 * and reply schemas the call table declares, as guest_runtime/forward.py writes them: the host allocates in the
 * slice, the guest only agrees the slice's address once (POOL_MAP) and passes pointers.
 *
 * Page-locked memory is never refused for want of room: when the slice cannot serve an allocation (the region has
 * no pool, or the host answers OUT_OF_MEMORY for it) the allocation comes from ordinary guest pages instead, said
 * once on stderr. And cuMemHostRegister / cuMemHostUnregister (outside the call table) are answered here: the
 * guest's own memory cannot be page-locked for a GPU on another machine, so registering only records the range.
 * Both kinds of range are kept in one registry (owned: a fallback allocation this file frees; registered: the
 * program's memory, only forgotten). Copies to and from them are pageable copies (copy_calls.c: they are not in
 * the pool, so their bytes travel, staged, and an async copy to the host is complete when it returns); the GPU
 * cannot reach them, so they have no device pointer (cuMemHostGetDevicePointer answers CUDA_ERROR_NOT_SUPPORTED,
 * said once); cuPointerGetAttribute answers for them in the guest (query_calls.c, orion_host_range_find).
 */
#define _GNU_SOURCE
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
    HOST_ALLOC_FLAGS = 0x7,     /* CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP | WRITECOMBINED (host_agent/pinned_pool.py) */
    REGISTER_FLAGS = 0xF,       /* CU_MEMHOSTREGISTER_PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY */
    REGISTER_IOMEMORY = 0x4,    /* CU_MEMHOSTREGISTER_IOMEMORY: a device's I/O memory, which no GPU here can reach */
};

/* --- the registry: guest memory answered for as page-locked (sorted by base, never overlapping) --------------- */

static pthread_rwlock_t ranges_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct orion_host_range *ranges;
static size_t count, cap;
static atomic_size_t listed; /* `count`, read without the lock: an empty registry costs a lookup one load */

/* Under the lock: the index of the first range whose base is above `pointer` (count when none is). */
static size_t above(uint64_t pointer) {
    size_t low = 0, high = count;
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        if (ranges[middle].base <= pointer) low = middle + 1;
        else high = middle;
    }
    return low;
}

/* Under the lock: the index of the range holding `pointer`, or count. */
static size_t holding(uint64_t pointer) {
    size_t i = above(pointer);
    return i && pointer - ranges[i - 1].base < ranges[i - 1].size ? i - 1 : count;
}

/* Add a range ([base, base+size) must not wrap): CUDA_SUCCESS, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED where it
 * overlaps one listed (or the pool slice: page-locked already), or CUDA_ERROR_OUT_OF_MEMORY. */
static int range_add(struct orion_host_range range) {
    if (orion_pool_overlaps(range.base, range.size)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    int status = CUDA_SUCCESS;
    pthread_rwlock_wrlock(&ranges_lock);
    size_t i = above(range.base);
    if ((i && ranges[i - 1].base + ranges[i - 1].size > range.base) ||
        (i < count && ranges[i].base < range.base + range.size)) {
        status = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    } else if (count == cap) {
        size_t more = cap ? cap * 2 : 16;
        struct orion_host_range *grown = realloc(ranges, more * sizeof *grown);
        if (grown) {
            ranges = grown;
            cap = more;
        } else {
            status = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (status == CUDA_SUCCESS) {
        for (size_t j = count; j > i; j--) ranges[j] = ranges[j - 1];
        ranges[i] = range;
        atomic_store(&listed, ++count);
    }
    pthread_rwlock_unlock(&ranges_lock);
    return status;
}

/* Take out the range starting exactly at `base` whose kind is `owned`: 1 and the range, or 0 with *other saying
 * whether some other range holds `base` (one of the other kind, or one that starts below it). */
static int range_take(uint64_t base, int owned, struct orion_host_range *taken, int *other) {
    int done = 0;
    *other = 0;
    if (!atomic_load(&listed)) return 0;
    pthread_rwlock_wrlock(&ranges_lock);
    size_t i = holding(base);
    if (i < count) {
        if (ranges[i].base == base && ranges[i].owned == owned) {
            *taken = ranges[i];
            for (size_t j = i + 1; j < count; j++) ranges[j - 1] = ranges[j];
            atomic_store(&listed, --count);
            done = 1;
        } else {
            *other = 1;
        }
    }
    pthread_rwlock_unlock(&ranges_lock);
    return done;
}

int orion_host_range_find(uint64_t pointer, struct orion_host_range *range) {
    if (!atomic_load(&listed)) return 0;
    pthread_rwlock_rdlock(&ranges_lock);
    size_t i = holding(pointer);
    int found = i < count;
    if (found) *range = ranges[i];
    pthread_rwlock_unlock(&ranges_lock);
    return found;
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
    struct orion_host_range range = { (uint64_t)(uintptr_t)pages, size, flags, 1 };
    int status = range_add(range);
    if (status != CUDA_SUCCESS) {
        munmap(pages, rounded);
        return status == CUDA_ERROR_OUT_OF_MEMORY ? status : CUDA_ERROR_UNKNOWN; /* fresh pages overlap nothing */
    }
    pool_fallback(size);
    *pp = pages;
    return CUDA_SUCCESS;
}

/* An allocation in this channel's slice of the pool, the host's answer: a CUresult. */
static int pool_alloc(uint32_t opcode, void **pp, const uint8_t *req, size_t len) {
    int status = orion_pool_ready();
    if (status == CUDA_SUCCESS) {
        uint8_t rep[8];
        status = orion_thread_forward(opcode, req, len, rep, sizeof rep, 0);
        if (status == CUDA_SUCCESS) *pp = (void *)(uintptr_t)orion_get_u64(rep);
    }
    return status;
}

int orion_pool_alloc(void **pp, size_t size) {
    uint8_t req[8];
    orion_put_u64(req, size);
    return pool_alloc(ORION_OP_cuMemAllocHost, pp, req, sizeof req);
}

static int host_alloc(uint32_t opcode, void **pp, size_t size, unsigned int flags, const uint8_t *req, size_t len) {
    if (!pp) return CUDA_ERROR_INVALID_VALUE;
    int status = pool_alloc(opcode, pp, req, len);
    /* OUT_OF_MEMORY: the slice is full, or this region has no pool; NOT_SUPPORTED: the agent keeps no pool for this
     * session. Any other failure (no channel, no context, bad arguments) is the answer. */
    if (status == CUDA_ERROR_OUT_OF_MEMORY || status == CUDA_ERROR_NOT_SUPPORTED) status = guest_alloc(pp, size, flags);
    return status;
}

int cuMemAllocHost(void **pp, size_t size) {
    uint8_t req[8];
    orion_put_u64(req, size);
    return host_alloc(ORION_OP_cuMemAllocHost, pp, size, 0, req, sizeof req);
}

int cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
    uint8_t req[12];
    orion_put_u64(req, size);
    orion_put_u32(req + 8, flags);
    return host_alloc(ORION_OP_cuMemHostAlloc, pp, size, flags, req, sizeof req);
}

int cuMemFreeHost(void *pointer) {
    struct orion_host_range range;
    int other;
    if (range_take((uint64_t)(uintptr_t)pointer, 1, &range, &other)) { /* a fallback allocation: never forwarded */
        size_t page = page_size();
        munmap(pointer, (size_t)(range.size + page - 1) / page * page);
        return CUDA_SUCCESS;
    }
    if (other) return CUDA_ERROR_INVALID_VALUE; /* registered memory, or inside a fallback allocation */
    uint8_t req[8];
    orion_put_u64(req, (uint64_t)(uintptr_t)pointer);
    return orion_thread_forward(ORION_OP_cuMemFreeHost, req, sizeof req, NULL, 0, 0);
}

int cuMemHostGetDevicePointer(unsigned long long *pdptr, void *pointer, unsigned int flags) {
    if (!pdptr) return CUDA_ERROR_INVALID_VALUE;
    struct orion_host_range range;
    if (orion_host_range_find((uint64_t)(uintptr_t)pointer, &range))
        return flags ? CUDA_ERROR_INVALID_VALUE : no_device_pointer();
    uint8_t req[12], rep[8];
    orion_put_u64(req, (uint64_t)(uintptr_t)pointer);
    orion_put_u32(req + 8, flags);
    int status = orion_thread_forward(ORION_OP_cuMemHostGetDevicePointer, req, sizeof req, rep, sizeof rep, 0);
    if (status == CUDA_SUCCESS) *pdptr = orion_get_u64(rep);
    return status;
}

int cuMemHostGetFlags(unsigned int *pflags, void *pointer) {
    if (!pflags) return CUDA_ERROR_INVALID_VALUE;
    struct orion_host_range range;
    if (orion_host_range_find((uint64_t)(uintptr_t)pointer, &range)) {
        *pflags = range.flags; /* as given at the allocation or registration */
        return CUDA_SUCCESS;
    }
    uint8_t req[8], rep[4];
    orion_put_u64(req, (uint64_t)(uintptr_t)pointer);
    int status = orion_thread_forward(ORION_OP_cuMemHostGetFlags, req, sizeof req, rep, sizeof rep, 0);
    if (status == CUDA_SUCCESS) *pflags = orion_get_u32(rep);
    return status;
}

/* --- registration: recorded in the guest, never forwarded -------------------------------------------------------- */

/* cuda.h's cuMemHostRegister (the name cuMemHostRegister_v2 too: build.py's aliases). The range is remembered so
 * that the program sees the driver's answers (an overlap is CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, the flags
 * come back from cuMemHostGetFlags, pointer attributes say host memory); nothing is page-locked and copies stay
 * staged. Needs a current context, as the driver does. */
CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags) {
    if (!orion_is_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!orion_current_context()) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t base = (uint64_t)(uintptr_t)p;
    if (!p || !bytesize || Flags & ~(unsigned)REGISTER_FLAGS || bytesize > UINT64_MAX - base)
        return CUDA_ERROR_INVALID_VALUE;
    if (Flags & REGISTER_IOMEMORY) return orion_not_forwarded("cuMemHostRegister with CU_MEMHOSTREGISTER_IOMEMORY");
    struct orion_host_range range = { base, bytesize, Flags, 0 };
    return range_add(range);
}

/* Forget a registration made at exactly `p`; its memory stays the program's. */
CUresult cuMemHostUnregister(void *p) {
    if (!orion_is_initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    if (!orion_current_context()) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t base = (uint64_t)(uintptr_t)p;
    struct orion_host_range range;
    int other;
    if (range_take(base, 0, &range, &other)) return CUDA_SUCCESS;
    /* memory that cuMemHostAlloc gave is not "not registered" to the driver: it answers INVALID_VALUE (as reported
     * against driver 590.48) */
    if (orion_pool_contains(base, 1)) return CUDA_ERROR_INVALID_VALUE;
    if (other && orion_host_range_find(base, &range) && range.owned && range.base == base)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}
