/*
 * A map from client-chosen 64-bit identifiers to pointers: the region table and the in-flight
 * request set of each connection. Open addressing with linear probing and backward-shift deletion,
 * so lookups stay O(1) whatever ids a client picks and no tombstones accumulate.
 */
#ifndef CONVD_DAEMON_IDMAP_H
#define CONVD_DAEMON_IDMAP_H

#include <stddef.h>
#include <stdint.h>

struct idmap_slot {
    uint64_t key;
    void *value; /* NULL marks an empty slot; stored values are never NULL */
};

struct idmap {
    struct idmap_slot *slots;
    size_t cap; /* 0 or a power of two */
    size_t count;
};

/* An empty map; it allocates on the first insertion. */
void idmap_init(struct idmap *m);

/* Frees the slots (not the values). Accepts a map that was never used. */
void idmap_free(struct idmap *m);

/* The value stored under key, or NULL. */
void *idmap_get(const struct idmap *m, uint64_t key);

/* Stores value (not NULL) under key. Returns 0, CONVD_EEXIST when the key is present (the map is
 * unchanged), CONVD_ENOMEM when growing failed. */
int idmap_put(struct idmap *m, uint64_t key, void *value);

/* Removes key and returns its value, or NULL when it was absent. */
void *idmap_del(struct idmap *m, uint64_t key);

/* Calls fn(value, arg) for every entry, in no particular order. fn must not change the map. */
void idmap_foreach(const struct idmap *m, void (*fn)(void *value, void *arg), void *arg);

#endif
