/* pinned_pool.c: the guest's view of its channel's slice of the region's page-locked pool
 * (guest_runtime/pinned_pool.py in C; the host side is host_agent/session/pinned_pool.py).
 *
 * cuMemAllocHost and cuMemHostAlloc hand out memory from this slice: the host allocates and both sides see the same
 * pages, so a copy from or to it travels as an address (the pinned variant of the copy), not as bytes. At the first
 * allocation the guest tells the host where it sees the slice (POOL_MAP); the host maps its pages at that address
 * if it can, else answers its own address, which the guest then tries in its own process (a second mapping of the
 * region file there, never replacing anything). Only if both are taken do the two sides use different addresses.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/mman.h>

#include "orion_guest.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000 /* Linux 4.17; older kernels take it as a hint, so the result is checked */
#endif

static pthread_mutex_t setting_up = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint64_t pool_base; /* what this process's pointers into the slice are relative to (0: not set up) */
static _Atomic uint64_t pool_size;
static int pool_fd = -1;           /* the region file, and where the slice lies in it (set before pool_base) */
static uint64_t pool_file_offset;

/* POOL_MAP: propose `address` for the slice; a CUresult and the host's address. */
static int map_call(uint64_t address, uint64_t *host) {
    uint8_t req[ORION_POOL_MAP_REQ_SIZE], rep[ORION_POOL_MAP_REP_SIZE];
    orion_put_u64(req + ORION_POOL_MAP_REQ_guest_address, address);
    int status = orion_thread_forward(ORION_OP_POOL_MAP, req, sizeof req, rep, sizeof rep, ORION_CALL_NO_FOLD);
    *host = status == CUDA_SUCCESS ? orion_get_u64(rep + ORION_POOL_MAP_REP_host_address) : 0;
    return status;
}

/* Map `size` bytes of the region file from `offset` at exactly `address`, shared and writable (fixed_map.map_at):
 * 0 when that range is taken, not page-aligned, or the kernel put the mapping elsewhere (then undone). */
static int map_at(int fd, uint64_t offset, uint64_t size, uint64_t address) {
    if (!address || address % 4096 || offset % 4096 || !size) return 0;
    void *got = mmap((void *)(uintptr_t)address, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE,
                     fd, (off_t)offset);
    if (got == MAP_FAILED) return 0;
    if ((uint64_t)(uintptr_t)got != address) {
        munmap(got, (size_t)size);
        return 0;
    }
    return 1;
}

/* Under `setting_up`. */
static int set_up(void) {
    orion_channel *channel = orion_process_channel();
    if (!channel) return CUDA_ERROR_NOT_INITIALIZED;
    uint8_t *map;
    int fd;
    uint64_t offset, size;
    if (orion_pool_slice(channel, &map, NULL, &fd, &offset, &size) != ORION_OK) return CUDA_ERROR_UNKNOWN;
    if (!size) return CUDA_ERROR_OUT_OF_MEMORY; /* this region has no pool */
    uint64_t ours = (uint64_t)(uintptr_t)(map + offset), host;
    int status = map_call(ours, &host);
    if (status != CUDA_SUCCESS) return status;
    uint64_t base = ours;
    if (host != ours) {
        if (map_at(fd, offset, size, host)) { /* the host's address is free here: use it */
            uint64_t again;
            status = map_call(host, &again);
            if (status == CUDA_SUCCESS && again == host) {
                base = host;
            } else {
                munmap((void *)(uintptr_t)host, (size_t)size);
                status = map_call(ours, &again);
                if (status != CUDA_SUCCESS) return status;
            }
        }
        if (base != host)
            fprintf(stderr, "orion: page-locked memory is at %#llx here and %#llx on the host; pass kernels the "
                    "pointer cuMemHostGetDevicePointer gives, not the host pointer\n", (unsigned long long)ours,
                    (unsigned long long)host);
    }
    pool_fd = fd;
    pool_file_offset = offset;
    atomic_store(&pool_size, size);
    atomic_store(&pool_base, base); /* last: orion_pool_contains reads it first */
    return CUDA_SUCCESS;
}

int orion_pool_ready(void) {
    if (atomic_load(&pool_base)) return CUDA_SUCCESS;
    pthread_mutex_lock(&setting_up);
    int status = atomic_load(&pool_base) ? CUDA_SUCCESS : set_up();
    pthread_mutex_unlock(&setting_up);
    return status;
}

int orion_pool_contains(uint64_t pointer, uint64_t size) {
    uint64_t base = atomic_load(&pool_base);
    if (!base) return 0;
    uint64_t span = atomic_load(&pool_size), need = size ? size : 1;
    return base <= pointer && pointer - base <= span && need <= span - (pointer - base);
}

int orion_pool_overlaps(uint64_t pointer, uint64_t size) {
    uint64_t base = atomic_load(&pool_base);
    if (!base || !size) return 0;
    uint64_t span = atomic_load(&pool_size);
    return pointer < base + span && base < pointer + size; /* callers keep [pointer, pointer+size) from wrapping */
}

uint64_t orion_pool_size(void) { return atomic_load(&pool_size); }

int orion_pool_file(uint64_t pointer, uint64_t size, int *fd, uint64_t *offset) {
    if (!orion_pool_contains(pointer, size)) return 0;
    *fd = pool_fd;
    *offset = pool_file_offset + (pointer - atomic_load(&pool_base));
    return 1;
}
