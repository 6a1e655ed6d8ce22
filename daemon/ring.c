#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "convd/status.h"
#include "ring.h"
#include "why.h"

static void ring_setup(struct ring *r, void *mem, size_t len, uint32_t sq_entries,
                       uint32_t cq_entries)
{
    memset(r, 0, sizeof(*r));
    r->map = mem;
    r->map_len = len;
    r->hdr = mem;
    r->sq = convd_ring_sq(mem);
    r->cq = convd_ring_cq(mem, sq_entries);
    r->sq_entries = sq_entries;
    r->cq_entries = cq_entries;
    /* The client's line may hold anything; ours starts from zero, and so do our copies. */
    atomic_store_explicit(&r->hdr->sq_head, 0, memory_order_relaxed);
    atomic_store_explicit(&r->hdr->cq_tail, 0, memory_order_relaxed);
    atomic_store_explicit(&r->hdr->daemon_flags, 0, memory_order_relaxed);
    atomic_store_explicit(&r->hdr->sock_seq, 0, memory_order_release);
}

void ring_init_mem(struct ring *r, void *mem, size_t len, uint32_t sq_entries, uint32_t cq_entries)
{
    ring_setup(r, mem, len, sq_entries, cq_entries);
    r->map = NULL; /* not ours to unmap */
}

int ring_map(struct ring *r, uint32_t version, uint32_t sq_entries, uint32_t cq_entries,
             uint64_t size, const int *fds, size_t nfds, char *why, size_t why_len)
{
    memset(r, 0, sizeof(*r));
    if (nfds != 1)
        return why_fail(why, why_len, CONVD_EINVAL,
                        "AttachRing carries exactly one file descriptor (the ring's memfd), this "
                        "one carried %zu",
                        nfds);
    if (version != CONVD_RING_VERSION)
        return why_fail(why, why_len, CONVD_EVERSION,
                        "ring layout version %u is not supported; this daemon takes version %u",
                        version, CONVD_RING_VERSION);
    if (!convd_ring_entries_ok(sq_entries) || !convd_ring_entries_ok(cq_entries))
        return why_fail(why, why_len, CONVD_EINVAL,
                        "ring of %u submission and %u completion entries: each must be a power "
                        "of two from 1 to %u",
                        sq_entries, cq_entries, CONVD_RING_MAX_ENTRIES);
    uint64_t need = convd_ring_bytes(sq_entries, cq_entries);
    if (size != need)
        return why_fail(why, why_len, CONVD_EINVAL,
                        "ring size is %llu bytes; %u submission and %u completion entries of "
                        "layout version %u take %llu",
                        (unsigned long long)size, sq_entries, cq_entries, version,
                        (unsigned long long)need);
    int fd = fds[0];
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0)
        return why_fail(why, why_len, CONVD_ESEAL,
                        "the ring's descriptor is not a memfd that supports seals (%s)",
                        strerror(errno));
    if (!(seals & F_SEAL_SHRINK) || !(seals & F_SEAL_GROW))
        return why_fail(why, why_len, CONVD_ESEAL,
                        "the ring's memfd is not sealed against shrinking and growing "
                        "(F_SEAL_SHRINK, F_SEAL_GROW)");
    if (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE))
        return why_fail(why, why_len, CONVD_ESEAL,
                        "the ring's memfd is sealed against writing; the daemon writes "
                        "completions into it");
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return why_fail(why, why_len, CONVD_ESEAL, "the ring's descriptor is not a memfd");
    if ((uint64_t)st.st_size < size)
        return why_fail(why, why_len, CONVD_EBOUNDS,
                        "ring size %llu is larger than its memfd (%llu bytes)",
                        (unsigned long long)size, (unsigned long long)st.st_size);
    void *map = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        return why_fail(why, why_len, errno == ENOMEM ? CONVD_ENOMEM : CONVD_EIO,
                        "cannot map the ring's %llu bytes: %s", (unsigned long long)size,
                        strerror(errno));
    ring_setup(r, map, (size_t)size, sq_entries, cq_entries);
    return 0;
}

void ring_unmap(struct ring *r)
{
    if (r->map != NULL)
        munmap(r->map, r->map_len);
    memset(r, 0, sizeof(*r));
}

enum ring_take_result ring_take(struct ring *r, struct convd_ring_sqe *ret_sqe, char *why,
                                size_t why_len)
{
    uint32_t tail = atomic_load_explicit(&r->hdr->sq_tail, memory_order_acquire);
    uint32_t waiting = tail - r->sq_head;
    if (waiting == 0)
        return RING_EMPTY;
    if (waiting > r->sq_entries) {
        why_fail(why, why_len, CONVD_EPROTO,
                 "ring corrupt: sq_tail %u is %u entries past sq_head %u, the submission ring "
                 "holds %u",
                 tail, waiting, r->sq_head, r->sq_entries);
        return RING_CORRUPT;
    }
    uint32_t head = atomic_load_explicit(&r->hdr->cq_head, memory_order_acquire);
    uint32_t unread = r->cq_tail - head;
    if (unread > r->cq_entries) {
        why_fail(why, why_len, CONVD_EPROTO,
                 "ring corrupt: cq_head %u is %u entries behind cq_tail %u, the completion ring "
                 "holds %u",
                 head, unread, r->cq_tail, r->cq_entries);
        return RING_CORRUPT;
    }
    if (unread + r->reserved >= r->cq_entries)
        return RING_FULL;
    /* One copy out of shared memory: the client may rewrite the entry while we look at it. */
    memcpy(ret_sqe, &r->sq[r->sq_head & (r->sq_entries - 1)], sizeof(*ret_sqe));
    r->sq_head++;
    r->reserved++;
    atomic_store_explicit(&r->hdr->sq_head, r->sq_head, memory_order_release);
    return RING_TAKEN;
}

void ring_release(struct ring *r)
{
    if (r->reserved > 0)
        r->reserved--;
}

int ring_post(struct ring *r, const struct convd_ring_cqe *cqe, char *why, size_t why_len)
{
    uint32_t head = atomic_load_explicit(&r->hdr->cq_head, memory_order_acquire);
    uint32_t unread = r->cq_tail - head;
    if (unread >= r->cq_entries) {
        why_fail(why, why_len, CONVD_EPROTO,
                 "ring corrupt: cq_head %u leaves no room for a completion the daemon had "
                 "reserved (cq_tail %u, %u entries)",
                 head, r->cq_tail, r->cq_entries);
        return -1;
    }
    memcpy(&r->cq[r->cq_tail & (r->cq_entries - 1)], cqe, sizeof(*cqe));
    r->cq_tail++;
    if (r->reserved > 0)
        r->reserved--;
    atomic_store_explicit(&r->hdr->cq_tail, r->cq_tail, memory_order_release);
    return 0;
}

bool ring_has_submissions(const struct ring *r)
{
    if (atomic_load_explicit(&r->hdr->sq_tail, memory_order_relaxed) == r->sq_head)
        return false;
    uint32_t unread = r->cq_tail - atomic_load_explicit(&r->hdr->cq_head, memory_order_relaxed);
    /* A corrupt value is for ring_take to report: look. */
    return unread > r->cq_entries || unread + r->reserved < r->cq_entries;
}

uint32_t ring_cq_head(const struct ring *r)
{
    return atomic_load_explicit(&r->hdr->cq_head, memory_order_relaxed);
}

void ring_set_need_wakeup(struct ring *r, bool on)
{
    atomic_store_explicit(&r->hdr->daemon_flags, on ? CONVD_RING_NEED_WAKEUP : 0,
                          memory_order_relaxed);
}

bool ring_client_waiting(const struct ring *r)
{
    return (atomic_load_explicit(&r->hdr->client_flags, memory_order_relaxed) &
            CONVD_RING_WAITING) != 0;
}

void ring_note_socket(struct ring *r)
{
    r->sock_seq++;
    atomic_store_explicit(&r->hdr->sock_seq, r->sock_seq, memory_order_release);
}
