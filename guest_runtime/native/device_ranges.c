/* device_ranges.c: the device memory this process got (guest_runtime/device_ranges.py in C).
 *
 * cuMemcpy and cuMemcpyAsync with unified addressing decide a copy's direction from where each pointer lies; the
 * guest cannot ask the GPU, so it remembers every range an allocation (the generated calls whose table effect is
 * `allocates`) or a module or library global gave it, and forgets an allocation when it is freed (effect
 * `frees`). Whether the session may use a pointer is the host's check, not this file's: a pointer not listed
 * here is treated as host memory.
 */
#include <pthread.h>
#include <stdlib.h>

#include "orion_guest.h"

struct range { uint64_t base, size; };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct range *ranges;
static size_t count, cap;

/* Under `lock`: the index of the range starting at `base`, or `count`. */
static size_t find(uint64_t base) {
    size_t i = 0;
    while (i < count && ranges[i].base != base) i++;
    return i;
}

void orion_range_add(uint64_t base, uint64_t size) {
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
        ranges[i] = (struct range){ base, size };
        if (i == count) count++;
    }
    pthread_mutex_unlock(&lock);
}

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
