/* handle_map.c: the handle-keyed hash map of handle_map.h. */
#include "handle_map.h"

#include <stdlib.h>

#define FIRST_CAPACITY 64

static size_t cell_of(uint64_t key, size_t capacity) {
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & (capacity - 1);
}

void *handle_map_get(const struct handle_map *map, uint64_t key) {
    if (!key || !map->capacity) return NULL;
    for (size_t i = cell_of(key, map->capacity);; i = (i + 1) & (map->capacity - 1)) {
        if (map->keys[i] == key) return map->values[i];
        if (!map->keys[i]) return NULL;
    }
}

/* Put into a map known to have room; 1 when the key is new. */
static int place(struct handle_map *map, uint64_t key, void *value) {
    size_t i = cell_of(key, map->capacity);
    while (map->keys[i] && map->keys[i] != key) i = (i + 1) & (map->capacity - 1);
    int fresh = !map->keys[i];
    map->keys[i] = key;
    map->values[i] = value;
    return fresh;
}

static int grow(struct handle_map *map) {
    size_t capacity = map->capacity ? 2 * map->capacity : FIRST_CAPACITY;
    uint64_t *keys = calloc(capacity, sizeof *keys);
    void **values = calloc(capacity, sizeof *values);
    if (!keys || !values) {
        free(keys);
        free(values);
        return -1;
    }
    struct handle_map bigger = { keys, values, capacity, map->used };
    for (size_t i = 0; i < map->capacity; i++)
        if (map->keys[i]) place(&bigger, map->keys[i], map->values[i]);
    free(map->keys);
    free(map->values);
    *map = bigger;
    return 0;
}

int handle_map_put(struct handle_map *map, uint64_t key, void *value) {
    if (!key || !value) return -1;
    if (2 * (map->used + 1) > map->capacity && grow(map)) return -1;
    map->used += (size_t)place(map, key, value);
    return 0;
}

void handle_map_clear(struct handle_map *map, void (*release)(void *)) {
    for (size_t i = 0; i < map->capacity; i++) {
        if (map->keys[i] && release) release(map->values[i]);
        map->keys[i] = 0;
        map->values[i] = NULL;
    }
    map->used = 0;
}
