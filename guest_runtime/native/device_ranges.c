/* device_ranges.c: the device memory this process got (guest_runtime/device_ranges.py in C).
 *
 * cuMemcpy and cuMemcpyAsync with unified addressing decide a copy's direction from where each pointer lies; the
 * guest cannot ask the GPU, so it remembers every range an allocation (the generated calls whose table effect is
 * `allocates`) or a module or library global gave it, and forgets an allocation when it is freed (effect
 * `frees`). Whether the session may use a pointer is the host's check, not this file's: a pointer not listed
 * here is treated as host memory. A reserved range (effect `reserves`) and a graph's allocation are listed too, as
 * not allocated: they are device memory only while mapped or while their graph's allocation lives, so a copy into
 * one is never posted (copy_calls.c asks orion_range_allocated).
 */
#include <pthread.h>
#include <stdlib.h>

#include "orion_guest.h"

struct range { uint64_t base, size; int allocated; /* 0: reserved (VMM), or a graph's allocation */ };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct range *ranges;
static size_t count, cap;

/* Under `lock`: the index of the range starting at `base`, or `count`. */
static size_t find(uint64_t base) {
    size_t i = 0;
    while (i < count && ranges[i].base != base) i++;
    return i;
}

static void add(uint64_t base, uint64_t size, int allocated) {
    pthread_mutex_lock(&lock);
    size_t i = find(base);
    if (i == count && count == cap) {
        size_t more = cap ? cap * 2 : 64;
        struct range *grown = realloc(ranges, more * sizeof *grown);
        if (grown) {
            ranges = grown;
            cap = more;
        }
    }
    if (i < cap) { /* without room the range stays unlisted: a copy with it is then taken as host memory */
        ranges[i] = (struct range){ base, size, allocated };
        if (i == count) count++;
    }
    pthread_mutex_unlock(&lock);
}

void orion_range_add(uint64_t base, uint64_t size) { add(base, size, 1); }

void orion_range_reserve(uint64_t base, uint64_t size) { add(base, size, 0); }

void orion_range_remove(uint64_t base) {
    pthread_mutex_lock(&lock);
    size_t i = find(base);
    if (i < count) ranges[i] = ranges[--count];
    pthread_mutex_unlock(&lock);
}

int orion_range_contains(uint64_t pointer) {
    pthread_mutex_lock(&lock);
    int inside = 0;
    for (size_t i = 0; i < count && !inside; i++)
        inside = ranges[i].base <= pointer && pointer - ranges[i].base < ranges[i].size;
    pthread_mutex_unlock(&lock);
    return inside;
}

int orion_range_allocated(uint64_t pointer, uint64_t size) {
    pthread_mutex_lock(&lock);
    int inside = 0;
    for (size_t i = 0; i < count && !inside; i++)
        inside = ranges[i].allocated && ranges[i].base <= pointer && pointer - ranges[i].base <= ranges[i].size
                 && size <= ranges[i].size - (pointer - ranges[i].base);
    pthread_mutex_unlock(&lock);
    return inside;
}
