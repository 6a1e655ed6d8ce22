/*
 * The regions of one connection: client memory the daemon maps (sealed memfds) or opens (GPU IPC
 * handles), named by client-chosen ids.
 *
 * A region is reference-counted by the requests that use it. Unregistering it (or closing the
 * connection) removes its id at once, but the mapping and the backend's import stay until the
 * last request using it finishes; only then is it unmapped, released and freed. Limits count a
 * region until it is really released, because until then its memory really is mapped.
 */
#ifndef CONVD_DAEMON_REGIONS_H
#define CONVD_DAEMON_REGIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "backend.h"
#include "idmap.h"
#include "list.h"

/* Totals over all connections, for status, metrics and the daemon-wide cap. */
struct region_stats {
    uint64_t regions;
    uint64_t mapped_bytes;
    uint64_t host_bytes; /* of which host memory: what a GPU backend pins */
};

/* What one user's regions hold over all its connections (users.h), charged like region_stats. */
struct region_account {
    uint32_t regions;
    uint64_t bytes;
    uint64_t host_bytes;
};

struct region_limits {
    uint32_t max_regions;      /* per connection */
    uint64_t max_mapped_bytes; /* per connection */
    /* Per user, checked only for tables with an account. */
    uint32_t max_regions_per_user;
    uint64_t max_mapped_bytes_per_user;
    /* Host-memory regions of all clients together, checked only for tables with stats; 0: no
     * cap. A GPU backend pins them (page-locked memory the kernel cannot reclaim). */
    uint64_t max_pinned_bytes;
};

struct region_table;

/* Releases that must wait (device_waits): with lanes open, a backend's mem_release (closing an
 * IPC mapping, unpinning host memory) waits for the device, and so for every client word a
 * lane waits on, which may need this very loop to launch something first (docs/architecture.md,
 * "Lanes"). While `busy` says a lane has work, a region nothing uses any more is queued here
 * instead, its connection's and user's charges taken back at once (they may go before it) and
 * the daemon-wide stats kept until region_releases_run releases it. */
struct region_releases {
    struct list_node queue; /* struct region.release_link, oldest first */
    uint32_t count;
    bool (*busy)(void *arg);
    void *arg;
};

void region_releases_init(struct region_releases *q, bool (*busy)(void *arg), void *arg);

/* Releases what is queued, oldest first; the caller knows that no lane has work. */
void region_releases_run(struct region_releases *q);

struct region {
    uint64_t id;
    struct convd_mem mem; /* what jobs point at */
    int refs;             /* requests using the region */
    bool registered;      /* still reachable by id; false once unregistered */
    bool readonly;        /* memfd sealed against writing: no output may live here */
    bool imported;        /* mem_import succeeded: mem_release is owed */
    void *map;            /* HOST: the mapping, map_len bytes */
    size_t map_len;
    dev_t dev; /* HOST: the memfd's identity, to detect aliasing */
    ino_t ino;
    struct region_table *table;    /* NULL once queued for a deferred release */
    struct convd_backend *backend; /* what imported it */
    struct region_stats *stats;    /* the daemon-wide totals it is charged to, or NULL */
    struct list_node release_link; /* in region_releases.queue while its release waits */
};

struct region_table {
    struct idmap by_id; /* registered regions */
    uint32_t count;     /* regions not yet released (registered or deferred) */
    uint64_t bytes;     /* their sizes */
    const struct region_limits *limits;
    struct convd_backend *backend;
    struct region_stats *stats;       /* may be NULL */
    struct region_account *account;   /* the peer user's; NULL: per-user limits not checked */
    struct region_releases *releases; /* NULL: release at once */
};

void region_table_init(struct region_table *t, struct convd_backend *backend,
                       const struct region_limits *limits, struct region_stats *stats);

/* Charges the table's regions to a user's account from now on (set before any registration). */
void region_table_set_account(struct region_table *t, struct region_account *account);

/* Queues the table's releases in q while q's busy says so (set before any registration). */
void region_table_set_releases(struct region_table *t, struct region_releases *q);

/* Registers `size` bytes of the sealed memfd that arrived as the message's only descriptor. The
 * descriptors stay the caller's to close (the mapping does not need them). Checks, in order:
 * exactly one descriptor (CONVD_EINVAL), size > 0 (CONVD_EINVAL), an unused id (CONVD_EEXIST),
 * the per-client and per-user count and byte limits and the daemon-wide max_pinned_bytes
 * (CONVD_ELIMIT), seals against shrinking and growing
 * (CONVD_ESEAL), the file's size (CONVD_EBOUNDS), then maps it MAP_SHARED (read-only when it is
 * sealed against writing) and imports it into the backend. Returns 0, or the code with a sentence
 * in why; nothing is left behind on failure. */
int region_register_memfd(struct region_table *t, uint64_t id, uint64_t size, const int *fds,
                          size_t nfds, char *why, size_t why_len);

/* Registers `size` bytes at `offset` in another process's GPU allocation given by an IPC handle
 * of CONVD_IPC_HANDLE_SIZE bytes; the backend opens it (the CPU backend refuses). */
int region_register_gpu(struct region_table *t, uint64_t id, uint64_t size, const uint8_t *handle,
                        size_t handle_len, uint64_t offset, char *why, size_t why_len);

/* Removes the id. The region is released now if no request uses it, else when the last one
 * finishes. CONVD_ENOREGION for an unknown id. */
int region_unregister(struct region_table *t, uint64_t id, char *why, size_t why_len);

/* The registered region with this id, or NULL. */
struct region *region_find(const struct region_table *t, uint64_t id);

void region_ref(struct region *r);

/* Drops a reference; releases the region when it was the last one and the region is no longer
 * registered. */
void region_unref(struct region *r);

/* Unregisters every region (on disconnect). Regions in use are released as their requests
 * finish; region_table_empty() says when all are gone. */
void region_table_release_all(struct region_table *t);

/* True when every region of the table has been released. */
bool region_table_empty(const struct region_table *t);

/* Frees the table's index. Only valid once region_table_empty(). */
void region_table_destroy(struct region_table *t);

/* True when bytes [a_off, a_off + a_bytes) of a and [b_off, b_off + b_bytes) of b can share
 * memory: the same memfd or the same GPU allocation (same handle), with overlapping ranges. The
 * ranges must already be inside their regions. */
bool region_ranges_overlap(const struct region *a, uint64_t a_off, uint64_t a_bytes,
                           const struct region *b, uint64_t b_off, uint64_t b_bytes);

#endif
