/* The daemon's side of the rings (daemon/ring.c) on plain memory (ring_init_mem) and on real
 * memfds (ring_map): taking and posting, FIFO order, the copy out of shared memory, the 32-bit
 * counters wrapping, back-pressure from the completion ring, reservations given back, every
 * index a hostile client can write, the doorbell flags and sock_seq; and ring_map's checks of an
 * AttachRing, each with its code and a sentence, leaving no mapping and no descriptor behind. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "convd/status.h"
#include "ring.h"
#include "testutil.h"

/* --- helpers ------------------------------------------------------------------------------ */

/* A ring on plain memory with its entry counts. */
struct mem_ring {
    void *mem;
    size_t len;
    struct ring r;
};

static void mem_ring_init(struct mem_ring *m, uint32_t sq_entries, uint32_t cq_entries)
{
    m->len = (size_t)convd_ring_bytes(sq_entries, cq_entries);
    m->mem = aligned_alloc(4096, m->len);
    assert_non_null(m->mem);
    /* What a client might leave in the daemon's line: ring_init_mem must clear it. */
    memset(m->mem, 0xa5, m->len);
    struct convd_ring_header *h = m->mem;
    h->magic = CONVD_RING_MAGIC;
    h->version = CONVD_RING_VERSION;
    h->sq_entries = sq_entries;
    h->cq_entries = cq_entries;
    atomic_store(&h->sq_tail, 0);
    atomic_store(&h->cq_head, 0);
    atomic_store(&h->client_flags, 0);
    ring_init_mem(&m->r, m->mem, m->len, sq_entries, cq_entries);
}

static void mem_ring_fini(struct mem_ring *m)
{
    ring_unmap(&m->r); /* plain memory is not the ring's to unmap */
    free(m->mem);
}

static struct convd_ring_header *hdr(struct mem_ring *m)
{
    return m->mem;
}

static struct convd_ring_sqe *sq_slot(struct mem_ring *m, uint32_t i)
{
    return (struct convd_ring_sqe *)((uint8_t *)m->mem + CONVD_RING_SQ_OFFSET) +
           (i & (m->r.sq_entries - 1));
}

static struct convd_ring_cqe *cq_slot(struct mem_ring *m, uint32_t i)
{
    return (struct convd_ring_cqe *)((uint8_t *)m->mem + convd_ring_cq_offset(m->r.sq_entries)) +
           (i & (m->r.cq_entries - 1));
}

/* The client's side: writes an entry with this id at sq_tail and publishes it. */
static void client_submit(struct mem_ring *m, uint64_t id)
{
    struct convd_ring_header *h = hdr(m);
    uint32_t tail = atomic_load(&h->sq_tail);
    struct convd_ring_sqe *e = sq_slot(m, tail);
    memset(e, 0, sizeof(*e));
    e->id = id;
    e->opcode = CONVD_RING_OP_CONV;
    e->n = (uint32_t)(id & 0xffff);
    atomic_store_explicit(&h->sq_tail, tail + 1, memory_order_release);
}

/* Takes one entry and asserts it is the one with this id. */
static void take_expect(struct mem_ring *m, uint64_t id)
{
    struct convd_ring_sqe e;
    char why[256] = "";
    enum ring_take_result res = ring_take(&m->r, &e, why, sizeof(why));
    if (res != RING_TAKEN)
        fail_msg("ring_take for id %llu: result %d (%s)", (unsigned long long)id, (int)res, why);
    assert_int_equal(e.id, id);
    assert_int_equal(e.n, (uint32_t)(id & 0xffff));
    assert_int_equal(atomic_load(&hdr(m)->sq_head), m->r.sq_head);
}

/* Posts the completion of id; asserts success and that it sits where the client reads it. */
static void post_expect(struct mem_ring *m, uint64_t id)
{
    struct convd_ring_cqe c = {
        .id = id, .status = 0, .batch_size = 3, .queue_us = 7, .exec_us = 11};
    uint32_t slot = m->r.cq_tail;
    char why[256] = "";
    if (ring_post(&m->r, &c, why, sizeof(why)) != 0)
        fail_msg("ring_post for id %llu: %s", (unsigned long long)id, why);
    assert_int_equal(atomic_load(&hdr(m)->cq_tail), slot + 1);
    assert_int_equal(m->r.cq_tail, slot + 1);
    const struct convd_ring_cqe *got = cq_slot(m, slot);
    assert_int_equal(got->id, id);
    assert_int_equal(got->status, 0);
    assert_int_equal(got->batch_size, 3);
    assert_int_equal(got->queue_us, 7);
    assert_int_equal(got->exec_us, 11);
}

/* The client reads every completion posted so far, checking they come in this id order. */
static void client_consume(struct mem_ring *m, uint32_t n)
{
    struct convd_ring_header *h = hdr(m);
    uint32_t head = atomic_load(&h->cq_head);
    uint32_t tail = atomic_load(&h->cq_tail);
    assert_int_equal(tail - head, n);
    atomic_store_explicit(&h->cq_head, tail, memory_order_release);
}

static enum ring_take_result take(struct mem_ring *m, char *why, size_t why_len)
{
    struct convd_ring_sqe e;
    why[0] = '\0';
    return ring_take(&m->r, &e, why, why_len);
}

static void assert_mentions(const char *why, const char *word)
{
    if (strlen(why) < 8 || strstr(why, word) == NULL)
        fail_msg("\"%s\" does not mention \"%s\"", why, word);
}

/* --- plain memory ------------------------------------------------------------------------- */

static void test_init_clears_daemon_line(void **state)
{
    (void)state;
    struct mem_ring m;
    mem_ring_init(&m, 8, 4);
    struct convd_ring_header *h = hdr(&m);
    assert_int_equal(atomic_load(&h->sq_head), 0);
    assert_int_equal(atomic_load(&h->cq_tail), 0);
    assert_int_equal(atomic_load(&h->daemon_flags), 0);
    assert_int_equal(atomic_load(&h->sock_seq), 0);
    assert_int_equal(m.r.sq_entries, 8);
    assert_int_equal(m.r.cq_entries, 4);
    assert_int_equal(m.r.sq_head, 0);
    assert_int_equal(m.r.cq_tail, 0);
    assert_int_equal(m.r.reserved, 0);
    assert_ptr_equal(m.r.hdr, m.mem);
    assert_ptr_equal(m.r.sq, (uint8_t *)m.mem + CONVD_RING_SQ_OFFSET);
    assert_ptr_equal(m.r.cq, (uint8_t *)m.mem + CONVD_RING_SQ_OFFSET + 8 * 256);
    /* Nothing submitted. */
    char why[256];
    assert_false(ring_has_submissions(&m.r));
    assert_int_equal(take(&m, why, sizeof(why)), RING_EMPTY);
    mem_ring_fini(&m);
}

static void test_round_trip_fifo(void **state)
{
    (void)state;
    struct mem_ring m;
    mem_ring_init(&m, 8, 8);
    for (uint64_t id = 100; id < 105; id++)
        client_submit(&m, id);
    assert_true(ring_has_submissions(&m.r));
    for (uint64_t id = 100; id < 105; id++)
        take_expect(&m, id);
    char why[256];
    assert_false(ring_has_submissions(&m.r));
    assert_int_equal(take(&m, why, sizeof(why)), RING_EMPTY);
    assert_int_equal(m.r.reserved, 5);
    /* Completions in any order the requests finish; the ring keeps the posting order. */
    post_expect(&m, 102);
    post_expect(&m, 100);
    assert_int_equal(m.r.reserved, 3);
    assert_int_equal(cq_slot(&m, 0)->id, 102);
    assert_int_equal(cq_slot(&m, 1)->id, 100);
    client_consume(&m, 2);
    assert_int_equal(ring_cq_head(&m.r), 2);
    post_expect(&m, 101);
    post_expect(&m, 103);
    post_expect(&m, 104);
    assert_int_equal(m.r.reserved, 0);
    client_consume(&m, 3);
    mem_ring_fini(&m);
}

/* The entry is copied before anything looks at it: a client rewriting it afterwards changes
 * nothing the daemon holds. */
static void test_take_copies_out(void **state)
{
    (void)state;
    struct mem_ring m;
    mem_ring_init(&m, 4, 4);
    client_submit(&m, 42);
    sq_slot(&m, 0)->c = 16;
    sq_slot(&m, 0)->groups = 4;
    struct convd_ring_sqe e;
    char why[256];
    assert_int_equal(ring_take(&m.r, &e, why, sizeof(why)), RING_TAKEN);
    sq_slot(&m, 0)->id = 43;
    sq_slot(&m, 0)->c = 15;
    sq_slot(&m, 0)->groups = 0;
    memset(&sq_slot(&m, 0)->output, 0xff, sizeof(e.output));
    assert_int_equal(e.id, 42);
    assert_int_equal(e.c, 16);
    assert_int_equal(e.groups, 4);
    assert_int_equal(e.output.region_id, 0);
    assert_int_equal(e.output.bytes, 0);
    mem_ring_fini(&m);
}

/* Free-running counters wrap at 2^32: entries keep their order and their slots, and the room
 * and corruption checks still hold across the wrap. Both sides start consistently just below
 * UINT32_MAX. */
static void test_counters_wrap(void **state)
{
    (void)state;
    struct mem_ring m;
    mem_ring_init(&m, 4, 4);
    const uint32_t start = UINT32_MAX - 5;
    struct convd_ring_header *h = hdr(&m);
    m.r.sq_head = start;
    m.r.cq_tail = start;
    atomic_store(&h->sq_head, start);
    atomic_store(&h->cq_tail, start);
    atomic_store(&h->sq_tail, start);
    atomic_store(&h->cq_head, start);
    uint64_t next_take = 1000, next_submit = 1000;
    char why[256];
    for (int round = 0; round < 6; round++) {
        /* Fill the submission ring (4), take as much as the completion ring allows (4), post
         * and consume them. */
        for (int i = 0; i < 4; i++)
            client_submit(&m, next_submit++);
        for (int i = 0; i < 4; i++) {
            uint32_t slot = m.r.sq_head & 3;
            assert_int_equal(sq_slot(&m, m.r.sq_head)->id, next_take);
            assert_int_equal(slot, (uint32_t)((start + (next_take - 1000)) & 3));
            take_expect(&m, next_take++);
        }
        assert_int_equal(take(&m, why, sizeof(why)), RING_EMPTY);
        for (uint64_t id = next_take - 4; id < next_take; id++)
            post_expect(&m, id);
        /* The completion ring is full of unread entries: a new submission waits. */
        client_submit(&m, next_submit++);
        assert_int_equal(take(&m, why, sizeof(why)), RING_FULL);
        client_consume(&m, 4);
        take_expect(&m, next_take++);
        post_expect(&m, next_take - 1);
        client_consume(&m, 1);
    }
    /* 30 entries went through: the counters wrapped. */
    assert_true(m.r.sq_head < start);
    assert_int_equal(m.r.sq_head, start + 30);
    assert_int_equal(atomic_load(&h->cq_tail), start + 30);
    /* Across the wrap, a tail more than sq_entries ahead is still seen as corrupt, and one
     * exactly sq_entries ahead is not. */
    uint32_t head = m.r.sq_head;
    atomic_store(&h->sq_tail, head + 5);
    assert_int_equal(take(&m, why, sizeof(why)), RING_CORRUPT);
    atomic_store(&h->sq_tail, head + 4);
    for (int i = 0; i < 4; i++) {
        struct convd_ring_sqe *e = sq_slot(&m, head + (uint32_t)i);
        e->id = 5000 + (uint64_t)i;
        e->n = (uint32_t)((5000 + i) & 0xffff);
    }
    for (int i = 0; i < 4; i++)
        take_expect(&m, 5000 + (uint64_t)i);
    mem_ring_fini(&m);
}

/* Back-pressure: completions unread plus completions owed fill the completion ring, and the
 * next submission waits until the client reads. */
static void test_full_until_client_reads(void **state)
{
    (void)state;
    struct mem_ring m;
    mem_ring_init(&m, 16, 4);
    char why[256];
    for (uint64_t id = 1; id <= 8; id++)
        client_submit(&m, id);
    /* Owed only: 4 taken, none posted. */
    for (uint64_t id = 1; id <= 4; id++)
        take_expect(&m, id);
    assert_int_equal(take(&m, why, sizeof(why)), RING_FULL);
    assert_int_equal(m.r.sq_head, 4); /* nothing was taken */
    assert_int_equal(atomic_load(&hdr(&m)->sq_head), 4);
    /* Posted but unread: still full. */
    post_expect(&m, 1);
    post_expect(&m, 2);
    assert_int_equal(take(&m, why, sizeof(why)), RING_FULL);
    /* Mixed: 2 unread, 2 owed. The client reads one: room for one more. */
    atomic_store(&hdr(&m)->cq_head, 1);
    take_expect(&m, 5);
    assert_int_equal(take(&m, why, sizeof(why)), RING_FULL);
    /* It reads the other one: room for one more (3, 4 and 5 still owed). */
    client_consume(&m, 1);
    take_expect(&m, 6);
    assert_int_equal(take(&m, why, sizeof(why)), RING_FULL);
    assert_int_equal(m.r.reserved, 4);
    mem_ring_fini(&m);
}

/* A submission answered on the socket gives its reserved completion back. */
static void test_release_gives_room_back(void **state)
{
    (void)state;
    struct mem_ring m;
    mem_ring_init(&m, 8, 2);
    char why[256];
    for (uint64_t id = 1; id <= 4; id++)
        client_submit(&m, id);
    take_expect(&m, 1);
    take_expect(&m, 2);
    assert_int_equal(take(&m, why, sizeof(why)), RING_FULL);
    ring_release(&m.r); /* request 2 failed: its completion went to the socket */
    assert_int_equal(m.r.reserved, 1);
    take_expect(&m, 3);
    assert_int_equal(take(&m, why, sizeof(why)), RING_FULL);
    ring_release(&m.r);
    ring_release(&m.r);
    assert_int_equal(m.r.reserved, 0);
    /* Releasing more than was reserved does not wrap the count. */
    ring_release(&m.r);
    assert_int_equal(m.r.reserved, 0);
    take_expect(&m, 4);
    assert_int_equal(m.r.reserved, 1);
    post_expect(&m, 4);
    assert_int_equal(m.r.reserved, 0);
    mem_ring_fini(&m);
}

static void test_corrupt_sq_tail(void **state)
{
    (void)state;
    struct mem_ring m;
    mem_ring_init(&m, 8, 8);
    char why[256];
    client_submit(&m, 1);
    take_expect(&m, 1);
    const uint32_t bad[] = {1 + 9, 1 + 1000, 0 /* behind sq_head: 2^32 - 1 ahead */, UINT32_MAX};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        atomic_store(&hdr(&m)->sq_tail, bad[i]);
        assert_int_equal(take(&m, why, sizeof(why)), RING_CORRUPT);
        assert_mentions(why, "ring corrupt");
        assert_mentions(why, "sq_tail");
        /* Nothing was taken. */
        assert_int_equal(m.r.sq_head, 1);
        assert_int_equal(m.r.reserved, 1);
        assert_int_equal(atomic_load(&hdr(&m)->sq_head), 1);
    }
    /* Exactly sq_entries ahead is a full submission ring, not corruption. */
    atomic_store(&hdr(&m)->sq_tail, 1 + 8);
    struct convd_ring_sqe e;
    assert_int_equal(ring_take(&m.r, &e, why, sizeof(why)), RING_TAKEN);
    mem_ring_fini(&m);
}

static void test_corrupt_cq_head(void **state)
{
    (void)state;
    struct mem_ring m;
    mem_ring_init(&m, 8, 4);
    char why[256];
    for (uint64_t id = 1; id <= 3; id++) {
        client_submit(&m, id);
        take_expect(&m, id);
        post_expect(&m, id);
    }
    client_consume(&m, 3);
    client_submit(&m, 4);
    /* cq_tail is 3: cq_head more than 4 behind, or ahead of cq_tail, is impossible. */
    const uint32_t bad[] = {(uint32_t)(3 - 5), (uint32_t)(3 - 1000), 4, 100};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        atomic_store(&hdr(&m)->cq_head, bad[i]);
        assert_int_equal(take(&m, why, sizeof(why)), RING_CORRUPT);
        assert_mentions(why, "ring corrupt");
        assert_mentions(why, "cq_head");
        assert_int_equal(m.r.sq_head, 3);
        assert_int_equal(m.r.reserved, 0);
    }
    /* Exactly cq_entries behind: a full completion ring, not corruption. */
    atomic_store(&hdr(&m)->cq_head, (uint32_t)(3 - 4));
    assert_int_equal(take(&m, why, sizeof(why)), RING_FULL);
    atomic_store(&hdr(&m)->cq_head, 3);
    take_expect(&m, 4);
    mem_ring_fini(&m);
}

/* The client moves cq_head back after the daemon reserved room: the post is refused, with a
 * sentence, and nothing is written. */
static void test_post_refused_when_room_taken(void **state)
{
    (void)state;
    struct mem_ring m;
    mem_ring_init(&m, 8, 4);
    char why[256];
    client_submit(&m, 1);
    take_expect(&m, 1);
    post_expect(&m, 1);
    client_consume(&m, 1);
    client_submit(&m, 2);
    take_expect(&m, 2); /* room reserved: cq_tail 1, cq_head 1 */
    memset(cq_slot(&m, 1), 0x5a, sizeof(struct convd_ring_cqe));
    const uint32_t bad[] = {(uint32_t)(1 - 4) /* 4 unread: the ring is full */, (uint32_t)(1 - 5),
                            2 /* ahead of cq_tail */};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        atomic_store(&hdr(&m)->cq_head, bad[i]);
        struct convd_ring_cqe c = {.id = 2};
        why[0] = '\0';
        assert_int_equal(ring_post(&m.r, &c, why, sizeof(why)), -1);
        assert_mentions(why, "ring corrupt");
        assert_mentions(why, "cq_head");
        assert_int_equal(m.r.cq_tail, 1);
        assert_int_equal(atomic_load(&hdr(&m)->cq_tail), 1);
        assert_int_equal(cq_slot(&m, 1)->id, 0x5a5a5a5a5a5a5a5aull);
    }
    /* 3 unread plus the one reserved fill the ring exactly: the post goes through. */
    atomic_store(&hdr(&m)->cq_head, (uint32_t)(1 - 3));
    post_expect(&m, 2);
    assert_int_equal(m.r.reserved, 0);
    mem_ring_fini(&m);
}

static void test_flags_and_sock_seq(void **state)
{
    (void)state;
    struct mem_ring m;
    mem_ring_init(&m, 4, 4);
    struct convd_ring_header *h = hdr(&m);
    ring_set_need_wakeup(&m.r, true);
    assert_int_equal(atomic_load(&h->daemon_flags), CONVD_RING_NEED_WAKEUP);
    ring_set_need_wakeup(&m.r, false);
    assert_int_equal(atomic_load(&h->daemon_flags), 0);

    assert_false(ring_client_waiting(&m.r));
    atomic_store(&h->client_flags, CONVD_RING_WAITING);
    assert_true(ring_client_waiting(&m.r));
    atomic_store(&h->client_flags, 0xfffffffeu); /* every bit but WAITING */
    assert_false(ring_client_waiting(&m.r));
    atomic_store(&h->client_flags, 0xffffffffu);
    assert_true(ring_client_waiting(&m.r));

    assert_int_equal(atomic_load(&h->sock_seq), 0);
    ring_note_socket(&m.r);
    assert_int_equal(atomic_load(&h->sock_seq), 1);
    /* The daemon counts from its own copy: a client overwriting sock_seq changes nothing. */
    atomic_store(&h->sock_seq, 1000);
    ring_note_socket(&m.r);
    assert_int_equal(atomic_load(&h->sock_seq), 2);
    ring_note_socket(&m.r);
    assert_int_equal(atomic_load(&h->sock_seq), 3);
    mem_ring_fini(&m);
}

/* The daemon's counters come from its own copies: a client scribbling over sq_head and cq_tail
 * does not move what the daemon takes or where it posts. */
static void test_own_copies(void **state)
{
    (void)state;
    struct mem_ring m;
    mem_ring_init(&m, 4, 4);
    struct convd_ring_header *h = hdr(&m);
    client_submit(&m, 1);
    client_submit(&m, 2);
    take_expect(&m, 1);
    atomic_store(&h->sq_head, 77);
    atomic_store(&h->cq_tail, 99);
    take_expect(&m, 2);
    assert_int_equal(atomic_load(&h->sq_head), 2);
    post_expect(&m, 1);
    assert_int_equal(atomic_load(&h->cq_tail), 1);
    assert_int_equal(cq_slot(&m, 0)->id, 1);
    mem_ring_fini(&m);
}

/* --- ring_map on real memfds -------------------------------------------------------------- */

#define UNIT_RING_NAME "convd-unit-ring"

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (d == NULL)
        return -1;
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

static int count_ring_maps(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int n = 0;
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f) != NULL)
        if (strstr(line, "/memfd:" UNIT_RING_NAME) != NULL)
            n++;
    fclose(f);
    return n;
}

#define SEALED (F_SEAL_SHRINK | F_SEAL_GROW)

/* ring_map refuses with this code and a sentence naming the problem, and leaves the ring
 * zeroed and nothing mapped. */
static void map_expect_refused(uint32_t version, uint32_t sq, uint32_t cq, uint64_t size,
                               const int *fds, size_t nfds, int code, const char *word)
{
    int maps = count_ring_maps();
    struct ring r;
    memset(&r, 0x5a, sizeof(r));
    char why[256] = "";
    int rc = ring_map(&r, version, sq, cq, size, fds, nfds, why, sizeof(why));
    if (rc != code)
        fail_msg("ring_map(version %u, %u/%u entries, %llu bytes, %zu fds): %s (%s), want %s",
                 version, sq, cq, (unsigned long long)size, nfds, convd_status_name(rc), why,
                 convd_status_name(code));
    assert_mentions(why, word);
    assert_null(r.map);
    assert_null(r.hdr);
    assert_int_equal(count_ring_maps(), maps);
    ring_unmap(&r); /* harmless on a refused ring */
}

static void test_map_refusals(void **state)
{
    (void)state;
    int base_fds = count_fds();
    const uint64_t size = convd_ring_bytes(16, 16);
    int fd = tu_memfd(UNIT_RING_NAME, size, SEALED);
    /* No descriptor, two. */
    map_expect_refused(1, 16, 16, size, NULL, 0, CONVD_EINVAL, "descriptor");
    int two[2] = {fd, tu_memfd(UNIT_RING_NAME, size, SEALED)};
    map_expect_refused(1, 16, 16, size, two, 2, CONVD_EINVAL, "descriptor");
    close(two[1]);
    /* Layout version. */
    map_expect_refused(2, 16, 16, size, &fd, 1, CONVD_EVERSION, "version 2");
    map_expect_refused(0, 16, 16, size, &fd, 1, CONVD_EVERSION, "version");
    /* Entry counts: zero, not a power of two, past the maximum; each side. */
    const uint32_t counts[] = {0, 3, 8192, 6, UINT32_MAX, 0x80000000u};
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
        map_expect_refused(1, counts[i], 16, size, &fd, 1, CONVD_EINVAL, "power of two");
        map_expect_refused(1, 16, counts[i], size, &fd, 1, CONVD_EINVAL, "power of two");
    }
    /* Size not the layout's. */
    map_expect_refused(1, 16, 16, size - 4096, &fd, 1, CONVD_EINVAL, "size");
    map_expect_refused(1, 16, 16, size + 4096, &fd, 1, CONVD_EINVAL, "size");
    map_expect_refused(1, 16, 16, 0, &fd, 1, CONVD_EINVAL, "size");
    map_expect_refused(1, 32, 16, size, &fd, 1, CONVD_EINVAL, "size");
    close(fd);
    /* Seals missing, or against writing. */
    fd = tu_memfd(UNIT_RING_NAME, size, 0);
    map_expect_refused(1, 16, 16, size, &fd, 1, CONVD_ESEAL, "not sealed");
    close(fd);
    fd = tu_memfd(UNIT_RING_NAME, size, F_SEAL_SHRINK);
    map_expect_refused(1, 16, 16, size, &fd, 1, CONVD_ESEAL, "F_SEAL_GROW");
    close(fd);
    fd = tu_memfd(UNIT_RING_NAME, size, F_SEAL_GROW);
    map_expect_refused(1, 16, 16, size, &fd, 1, CONVD_ESEAL, "F_SEAL_SHRINK");
    close(fd);
    fd = tu_memfd(UNIT_RING_NAME, size, SEALED | F_SEAL_WRITE);
    map_expect_refused(1, 16, 16, size, &fd, 1, CONVD_ESEAL, "writing");
    close(fd);
    fd = tu_memfd(UNIT_RING_NAME, size, SEALED | F_SEAL_FUTURE_WRITE);
    map_expect_refused(1, 16, 16, size, &fd, 1, CONVD_ESEAL, "writing");
    close(fd);
    /* A memfd smaller than the size it claims. */
    fd = tu_memfd(UNIT_RING_NAME, 4096, SEALED);
    map_expect_refused(1, 16, 16, size, &fd, 1, CONVD_EBOUNDS, "larger than its memfd");
    close(fd);
    /* A memfd created without sealing support has F_SEAL_SEAL set and nothing else. */
    fd = memfd_create(UNIT_RING_NAME, MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    map_expect_refused(1, 16, 16, size, &fd, 1, CONVD_ESEAL, "sealed");
    close(fd);
    /* Not a memfd: a pipe, a directory. */
    int p[2];
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    map_expect_refused(1, 16, 16, size, &p[0], 1, CONVD_ESEAL, "memfd");
    close(p[0]);
    close(p[1]);
    fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(fd >= 0);
    map_expect_refused(1, 16, 16, size, &fd, 1, CONVD_ESEAL, "memfd");
    close(fd);
    /* The descriptors stay the caller's: ring_map closed none, kept none. */
    assert_int_equal(count_fds(), base_fds);
}

static void test_map_success(void **state)
{
    (void)state;
    int base_fds = count_fds();
    int base_maps = count_ring_maps();
    const uint32_t shapes[][2] = {{16, 16}, {1, 1}, {4096, 4096}, {2, 64}, {64, 2}};
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        uint32_t sq = shapes[i][0], cq = shapes[i][1];
        const uint64_t size = convd_ring_bytes(sq, cq);
        int fd = tu_memfd(UNIT_RING_NAME, size, SEALED);
        uint8_t *mine = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        assert_true(mine != MAP_FAILED);
        struct convd_ring_header *h = (struct convd_ring_header *)mine;
        h->magic = CONVD_RING_MAGIC;
        atomic_store(&h->sq_head, 1234); /* the daemon starts its line from zero */
        atomic_store(&h->sock_seq, 99);
        struct ring r;
        char why[256] = "";
        int rc = ring_map(&r, CONVD_RING_VERSION, sq, cq, size, &fd, 1, why, sizeof(why));
        if (rc != 0)
            fail_msg("ring_map %u/%u: %s (%s)", sq, cq, convd_status_name(rc), why);
        /* ring_map keeps no descriptor: closing ours leaves the mapping. */
        close(fd);
        assert_int_equal(count_fds(), base_fds);
        assert_int_equal(count_ring_maps(), base_maps + 2);
        assert_non_null(r.map);
        assert_int_equal(r.map_len, size);
        assert_int_equal(r.sq_entries, sq);
        assert_int_equal(r.cq_entries, cq);
        assert_int_equal(r.hdr->magic, CONVD_RING_MAGIC);
        assert_int_equal(atomic_load(&h->sq_head), 0);
        assert_int_equal(atomic_load(&h->sock_seq), 0);
        /* The same memory on both sides: a submission from ours, a completion from the
         * daemon's, in the last entry of each ring. */
        struct convd_ring_sqe *sqe =
            (struct convd_ring_sqe *)(mine + CONVD_RING_SQ_OFFSET) + (sq - 1);
        sqe->id = 7;
        sqe->opcode = CONVD_RING_OP_CONV;
        atomic_store(&h->sq_tail, sq);
        struct convd_ring_sqe e;
        for (uint32_t k = 0; k < sq; k++)
            assert_int_equal(ring_take(&r, &e, why, sizeof(why)), k < cq ? RING_TAKEN : RING_FULL);
        if (sq <= cq)
            assert_int_equal(e.id, 7);
        for (uint32_t k = 0; k < cq; k++)
            ring_release(&r);
        r.cq_tail = cq - 1;
        atomic_store(&h->cq_head, cq - 1);
        struct convd_ring_cqe c = {.id = 8};
        rc = ring_post(&r, &c, why, sizeof(why));
        if (rc != 0)
            fail_msg("ring_post: %s", why);
        const struct convd_ring_cqe *cqe =
            (const struct convd_ring_cqe *)(mine + convd_ring_cq_offset(sq)) + (cq - 1);
        assert_int_equal(cqe->id, 8);
        assert_int_equal(atomic_load(&h->cq_tail), cq);
        ring_unmap(&r);
        assert_null(r.map);
        assert_int_equal(count_ring_maps(), base_maps + 1);
        munmap(mine, size);
        assert_int_equal(count_ring_maps(), base_maps);
    }
    /* Unmapping a ring that was never mapped is allowed. */
    struct ring none;
    memset(&none, 0, sizeof(none));
    ring_unmap(&none);
    assert_int_equal(count_fds(), base_fds);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_clears_daemon_line),
        cmocka_unit_test(test_round_trip_fifo),
        cmocka_unit_test(test_take_copies_out),
        cmocka_unit_test(test_counters_wrap),
        cmocka_unit_test(test_full_until_client_reads),
        cmocka_unit_test(test_release_gives_room_back),
        cmocka_unit_test(test_corrupt_sq_tail),
        cmocka_unit_test(test_corrupt_cq_head),
        cmocka_unit_test(test_post_refused_when_room_taken),
        cmocka_unit_test(test_flags_and_sock_seq),
        cmocka_unit_test(test_own_copies),
        cmocka_unit_test(test_map_refusals),
        cmocka_unit_test(test_map_success),
    };
    return cmocka_run_group_tests_name("daemon: rings", tests, NULL, NULL);
}
