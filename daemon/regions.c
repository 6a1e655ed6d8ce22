#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "why.h"
#include "log.h"
#include "regions.h"

void region_table_init(struct region_table *t, struct convd_backend *backend,
                       const struct region_limits *limits, struct region_stats *stats)
{
    memset(t, 0, sizeof(*t));
    idmap_init(&t->by_id);
    t->limits = limits;
    t->backend = backend;
    t->stats = stats;
}

/* The checks every kind shares: id free, count and byte limits per connection and per user,
 * and for host memory the daemon-wide pinned cap. */
static int reg_admit(const struct region_table *t, uint64_t id, uint64_t size, bool host, char *why,
                     size_t why_len)
{
    const struct region_limits *l = t->limits;
    const struct region_account *a = t->account;
    if (size == 0)
        return why_fail(why, why_len, CONVD_EINVAL, "region %llu: field size is 0",
                        (unsigned long long)id);
    if (idmap_get(&t->by_id, id) != NULL)
        return why_fail(why, why_len, CONVD_EEXIST,
                        "region id %llu is already registered on this connection",
                        (unsigned long long)id);
    if (t->count >= t->limits->max_regions)
        return why_fail(why, why_len, CONVD_ELIMIT,
                        "region %llu: this client already has %u regions, the limit "
                        "(max_regions)",
                        (unsigned long long)id, (unsigned)t->count);
    if (size > t->limits->max_mapped_bytes || t->bytes > t->limits->max_mapped_bytes - size)
        return why_fail(why, why_len, CONVD_ELIMIT,
                        "region %llu: %llu more bytes would exceed this client's limit of %llu "
                        "mapped bytes (max_mapped_bytes; %llu in use)",
                        (unsigned long long)id, (unsigned long long)size,
                        (unsigned long long)t->limits->max_mapped_bytes,
                        (unsigned long long)t->bytes);
    if (a != NULL && a->regions >= l->max_regions_per_user)
        return why_fail(why, why_len, CONVD_ELIMIT,
                        "region %llu: this client's user already has %u regions over all its "
                        "connections, the limit (max_regions_per_user)",
                        (unsigned long long)id, (unsigned)a->regions);
    if (a != NULL &&
        (size > l->max_mapped_bytes_per_user || a->bytes > l->max_mapped_bytes_per_user - size))
        return why_fail(why, why_len, CONVD_ELIMIT,
                        "region %llu: %llu more bytes would exceed the limit of %llu mapped bytes "
                        "for this client's user over all its connections "
                        "(max_mapped_bytes_per_user; %llu in use)",
                        (unsigned long long)id, (unsigned long long)size,
                        (unsigned long long)l->max_mapped_bytes_per_user,
                        (unsigned long long)a->bytes);
    if (host && t->stats != NULL && l->max_pinned_bytes != 0 &&
        (size > l->max_pinned_bytes || t->stats->host_bytes > l->max_pinned_bytes - size))
        return why_fail(why, why_len, CONVD_ELIMIT,
                        "region %llu: %llu more bytes of host memory would exceed the daemon's "
                        "limit of %llu for all clients together (max_pinned_bytes; %llu in use)",
                        (unsigned long long)id, (unsigned long long)size,
                        (unsigned long long)l->max_pinned_bytes,
                        (unsigned long long)t->stats->host_bytes);
    return 0;
}

void region_table_set_account(struct region_table *t, struct region_account *account)
{
    t->account = account;
}

void region_table_set_releases(struct region_table *t, struct region_releases *q)
{
    t->releases = q;
}

/* Adds a region's charge to its table and user (add), or takes it back. */
static void reg_charge_table(struct region_table *t, const struct region *r, bool add)
{
    const uint64_t bytes = r->mem.size, host = r->mem.kind == CONVD_MEM_HOST ? bytes : 0;
    struct region_account *a = t->account;
    if (add) {
        t->count++;
        t->bytes += bytes;
        if (a != NULL) {
            a->regions++;
            a->bytes += bytes;
            a->host_bytes += host;
        }
    } else {
        t->count--;
        t->bytes -= bytes;
        if (a != NULL) {
            a->regions--;
            a->bytes -= bytes;
            a->host_bytes -= host;
        }
    }
}

/* The same for the daemon-wide totals, which count a region until its release has run. */
static void reg_charge_stats(const struct region *r, bool add)
{
    struct region_stats *st = r->stats;
    if (st == NULL)
        return;
    const uint64_t bytes = r->mem.size, host = r->mem.kind == CONVD_MEM_HOST ? bytes : 0;
    if (add) {
        st->regions++;
        st->mapped_bytes += bytes;
        st->host_bytes += host;
    } else {
        st->regions--;
        st->mapped_bytes -= bytes;
        st->host_bytes -= host;
    }
}

/* Imports the region into the backend and files it under its id. Frees nothing on failure. */
static int reg_install(struct region_table *t, struct region *r, char *why, size_t why_len)
{
    char be_why[256] = "";
    int rc = be_mem_import(t->backend, &r->mem, be_why, sizeof(be_why));
    if (rc != 0)
        return why_fail(why, why_len, rc, "region %llu: the %s backend cannot use it: %s",
                        (unsigned long long)r->id, t->backend->info.name,
                        be_why[0] ? be_why : convd_strerror(rc));
    r->imported = true;
    rc = idmap_put(&t->by_id, r->id, r);
    if (rc != 0) {
        be_mem_release(t->backend, &r->mem);
        r->imported = false;
        return why_fail(why, why_len, rc, "region %llu: out of memory", (unsigned long long)r->id);
    }
    r->registered = true;
    r->table = t;
    r->backend = t->backend;
    r->stats = t->stats;
    reg_charge_table(t, r, true);
    reg_charge_stats(r, true);
    return 0;
}

int region_register_memfd(struct region_table *t, uint64_t id, uint64_t size, const int *fds,
                          size_t nfds, char *why, size_t why_len)
{
    if (nfds != 1)
        return why_fail(why, why_len, CONVD_EINVAL,
                        "region %llu: a MEMFD registration carries exactly one file descriptor, "
                        "this one carried %zu",
                        (unsigned long long)id, nfds);
    int rc = reg_admit(t, id, size, true, why, why_len);
    if (rc != 0)
        return rc;
    int fd = fds[0];

    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0)
        return why_fail(why, why_len, CONVD_ESEAL,
                        "region %llu: the descriptor is not a memfd that supports seals (%s)",
                        (unsigned long long)id, strerror(errno));
    if (!(seals & F_SEAL_SHRINK))
        return why_fail(why, why_len, CONVD_ESEAL,
                        "memfd is not sealed against shrinking (F_SEAL_SHRINK)");
    if (!(seals & F_SEAL_GROW))
        return why_fail(why, why_len, CONVD_ESEAL,
                        "memfd is not sealed against growing (F_SEAL_GROW)");
    struct stat st;
    if (fstat(fd, &st) != 0)
        return why_fail(why, why_len, CONVD_EIO, "region %llu: fstat: %s", (unsigned long long)id,
                        strerror(errno));
    if (!S_ISREG(st.st_mode))
        return why_fail(why, why_len, CONVD_ESEAL, "region %llu: the descriptor is not a memfd",
                        (unsigned long long)id);
    if ((uint64_t)st.st_size < size)
        return why_fail(why, why_len, CONVD_EBOUNDS,
                        "region %llu: size %llu is larger than the memfd (%llu bytes)",
                        (unsigned long long)id, (unsigned long long)size,
                        (unsigned long long)st.st_size);

    /* A write-sealed memfd cannot be mapped writable; map it read-only and refuse outputs there
     * instead of refusing the region: read-only weights are a sensible thing to share. */
    bool readonly = (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0;
    void *map =
        mmap(NULL, (size_t)size, readonly ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        int err = errno;
        return why_fail(why, why_len,
                        err == ENOMEM                     ? CONVD_ENOMEM
                        : (err == EPERM || err == EACCES) ? CONVD_EPERM
                                                          : CONVD_EIO,
                        "region %llu: cannot map %llu bytes of the memfd: %s",
                        (unsigned long long)id, (unsigned long long)size, strerror(err));
    }
    struct region *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        munmap(map, (size_t)size);
        return why_fail(why, why_len, CONVD_ENOMEM, "region %llu: out of memory",
                        (unsigned long long)id);
    }
    r->id = id;
    r->mem.kind = CONVD_MEM_HOST;
    r->mem.size = size;
    r->mem.host = map;
    r->map = map;
    r->map_len = (size_t)size;
    r->readonly = readonly;
    r->dev = st.st_dev;
    r->ino = st.st_ino;
    rc = reg_install(t, r, why, why_len);
    if (rc != 0) {
        munmap(map, (size_t)size);
        free(r);
        return rc;
    }
    return 0;
}

int region_register_gpu(struct region_table *t, uint64_t id, uint64_t size, const uint8_t *handle,
                        size_t handle_len, uint64_t offset, char *why, size_t why_len)
{
    if (handle_len != CONVD_IPC_HANDLE_SIZE)
        return why_fail(why, why_len, CONVD_EINVAL,
                        "region %llu: field ipc_handle has %zu bytes, must have %d",
                        (unsigned long long)id, handle_len, CONVD_IPC_HANDLE_SIZE);
    uint64_t end;
    if (__builtin_add_overflow(offset, size, &end))
        return why_fail(
            why, why_len, CONVD_EBOUNDS, "region %llu: ipc_offset %llu + size %llu overflows",
            (unsigned long long)id, (unsigned long long)offset, (unsigned long long)size);
    int rc = reg_admit(t, id, size, false, why, why_len);
    if (rc != 0)
        return rc;
    struct region *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return why_fail(why, why_len, CONVD_ENOMEM, "region %llu: out of memory",
                        (unsigned long long)id);
    r->id = id;
    r->mem.kind = CONVD_MEM_DEVICE;
    r->mem.size = size;
    memcpy(r->mem.ipc_handle, handle, CONVD_IPC_HANDLE_SIZE);
    r->mem.ipc_offset = offset;
    rc = reg_install(t, r, why, why_len);
    if (rc != 0) {
        free(r);
        return rc;
    }
    return 0;
}

/* Un-imports, unmaps and frees a region, once nothing uses it and no lane waits. */
static void reg_free(struct region *r)
{
    if (r->imported)
        be_mem_release(r->backend, &r->mem);
    if (r->map != NULL)
        munmap(r->map, r->map_len);
    reg_charge_stats(r, false);
    log_debug("region %llu released (%llu bytes)", (unsigned long long)r->id,
              (unsigned long long)r->mem.size);
    free(r);
}

/* A region nothing uses any more: released now, or queued while a lane has work. */
static void reg_release(struct region *r)
{
    struct region_table *t = r->table;
    struct region_releases *q = t->releases;
    reg_charge_table(t, r, false);
    r->table = NULL;
    if (r->imported && q != NULL && q->busy(q->arg)) {
        list_add_tail(&q->queue, &r->release_link);
        q->count++;
        return;
    }
    reg_free(r);
}

void region_releases_init(struct region_releases *q, bool (*busy)(void *arg), void *arg)
{
    list_init(&q->queue);
    q->count = 0;
    q->busy = busy;
    q->arg = arg;
}

void region_releases_run(struct region_releases *q)
{
    while (!list_empty(&q->queue)) {
        struct region *r = list_entry(q->queue.next, struct region, release_link);
        list_del(&r->release_link);
        q->count--;
        reg_free(r);
    }
}

int region_unregister(struct region_table *t, uint64_t id, char *why, size_t why_len)
{
    struct region *r = idmap_del(&t->by_id, id);
    if (r == NULL)
        return why_fail(why, why_len, CONVD_ENOREGION,
                        "region %llu is not registered on this connection", (unsigned long long)id);
    r->registered = false;
    if (r->refs == 0)
        reg_release(r);
    else
        log_debug("region %llu unregistered; release deferred until %d request(s) finish",
                  (unsigned long long)id, r->refs);
    return 0;
}

struct region *region_find(const struct region_table *t, uint64_t id)
{
    return idmap_get(&t->by_id, id);
}

void region_ref(struct region *r)
{
    r->refs++;
}

void region_unref(struct region *r)
{
    if (--r->refs == 0 && !r->registered)
        reg_release(r);
}

static void reg_collect(void *value, void *arg)
{
    struct region ***cursor = arg;
    *(*cursor)++ = value;
}

void region_table_release_all(struct region_table *t)
{
    size_t n = t->by_id.count;
    if (n == 0)
        return;
    /* Collect first: releasing changes the map that idmap_foreach walks. */
    struct region **all = malloc(n * sizeof(*all));
    if (all == NULL) {
        /* Without memory for the list, take them one by one from the map's slots. */
        while (t->by_id.count > 0) {
            for (size_t i = 0; i < t->by_id.cap; i++)
                if (t->by_id.slots[i].value != NULL) {
                    struct region *r = t->by_id.slots[i].value;
                    region_unregister(t, r->id, NULL, 0);
                    break;
                }
        }
        return;
    }
    struct region **cursor = all;
    idmap_foreach(&t->by_id, reg_collect, &cursor);
    for (size_t i = 0; i < n; i++)
        region_unregister(t, all[i]->id, NULL, 0);
    free(all);
}

bool region_table_empty(const struct region_table *t)
{
    return t->count == 0;
}

void region_table_destroy(struct region_table *t)
{
    idmap_free(&t->by_id);
}

bool region_ranges_overlap(const struct region *a, uint64_t a_off, uint64_t a_bytes,
                           const struct region *b, uint64_t b_off, uint64_t b_bytes)
{
    uint64_t a_base = 0, b_base = 0;
    if (a->mem.kind != b->mem.kind)
        return false;
    if (a->mem.kind == CONVD_MEM_HOST) {
        if (a->dev != b->dev || a->ino != b->ino)
            return false;
    } else {
        if (memcmp(a->mem.ipc_handle, b->mem.ipc_handle, CONVD_IPC_HANDLE_SIZE) != 0)
            return false;
        a_base = a->mem.ipc_offset;
        b_base = b->mem.ipc_offset;
    }
    /* Registration checked base + size for overflow and the callers checked off + bytes <=
     * size, so these sums cannot wrap. */
    uint64_t a_lo = a_base + a_off, a_hi = a_lo + a_bytes;
    uint64_t b_lo = b_base + b_off, b_hi = b_lo + b_bytes;
    return a_lo < b_hi && b_lo < a_hi;
}
