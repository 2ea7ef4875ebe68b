/* handle_map.h: a small hash map from a CUDA handle (a non-zero 64-bit number) to a pointer, for what the native
 * guest driver remembers per handle (param_layouts.c). Open addressing, grown at half full, emptied all at once
 * (handles may name other objects after an unload); no deletion of single keys. Not thread-safe: its user locks.
 */
#ifndef ORION_HANDLE_MAP_H
#define ORION_HANDLE_MAP_H

#include <stddef.h>
#include <stdint.h>

struct handle_map {
    uint64_t *keys; /* 0: an empty cell */
    void **values;
    size_t capacity; /* a power of two, or 0 before the first put */
    size_t used;
};

/* The value kept for `key`, or NULL. */
void *handle_map_get(const struct handle_map *map, uint64_t key);
/* Keep `value` (not NULL) for `key` (not 0), replacing what was there: 0, or -1 when memory ran out. */
int handle_map_put(struct handle_map *map, uint64_t key, void *value);
/* Forget every key, calling `release` (may be NULL) on each value first. */
void handle_map_clear(struct handle_map *map, void (*release)(void *));

#endif
