/* The scheduler as a data structure: priorities, round-robin across clients, batching of
 * same-problem requests up to max_batch, the queue bound, deadlines, cancellation, and a random
 * workload checked against the invariants. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "convd/status.h"
#include "idmap.h"
#include "scheduler.h"
#include "testutil.h"

struct item {
    struct sched_item si;
    int client;
    int seq;
    int taken;
};

/* Distinct problems: index i gives n = i + 1. */
static struct convd_problem probs[8];

static int setup(void **state)
{
    (void)state;
    for (int i = 0; i < 8; i++)
        convd_problem_init(&probs[i], i + 1, 4, 4, 2, 2, 1, 1, 1);
    return 0;
}

static void item_init(struct item *it, int client, int seq, int prob, unsigned prio,
                      uint64_t deadline)
{
    memset(it, 0, sizeof(*it));
    it->client = client;
    it->seq = seq;
    it->si.problem = &probs[prob];
    it->si.priority = prio;
    it->si.deadline_ns = deadline;
}

static struct item *I(struct sched_item *si)
{
    return list_entry(si, struct item, si);
}

static void test_priorities(void **state)
{
    (void)state;
    struct sched s;
    struct sched_client c;
    struct item it[4];
    sched_init(&s, 100, 8);
    sched_client_init(&c);
    /* lowest priority first, each a different problem so nothing batches */
    for (int i = 0; i < 4; i++) {
        item_init(&it[i], 0, i, i, (unsigned)(3 - i), 0);
        assert_int_equal(sched_push(&s, &c, &it[i].si), 0);
    }
    assert_int_equal(sched_depth(&s), 4);
    struct sched_item *out[8];
    for (int want = 3; want >= 0; want--) {
        assert_int_equal(sched_take(&s, out, 8), 1);
        assert_int_equal(I(out[0])->seq, want);
    }
    assert_int_equal(sched_take(&s, out, 8), 0);
    assert_int_equal(sched_depth(&s), 0);
    assert_int_equal(c.queued, 0);
    /* a priority out of range is refused */
    struct item bad;
    item_init(&bad, 0, 0, 0, SCHED_LEVELS, 0);
    assert_int_equal(sched_push(&s, &c, &bad.si), CONVD_EINVAL);
}

/* Clients A (5 requests), B (2), C (1) at one level take turns: A B C A B A A A. */
static void test_round_robin(void **state)
{
    (void)state;
    struct sched s;
    struct sched_client cl[3];
    struct item it[8];
    sched_init(&s, 100, 8);
    const int counts[3] = {5, 2, 1};
    int k = 0;
    for (int c = 0; c < 3; c++) {
        sched_client_init(&cl[c]);
        for (int j = 0; j < counts[c]; j++, k++) {
            /* consecutive requests of a client differ in problem: no batching */
            item_init(&it[k], c, j, (c * 3 + j) % 8, 1, 0);
            assert_int_equal(sched_push(&s, &cl[c], &it[k].si), 0);
        }
    }
    const int order[8] = {0, 1, 2, 0, 1, 0, 0, 0};
    int next_seq[3] = {0, 0, 0};
    for (int i = 0; i < 8; i++) {
        struct sched_item *out[1];
        assert_int_equal(sched_take(&s, out, 1), 1);
        if (I(out[0])->client != order[i])
            fail_msg("take %d: client %d, want %d", i, I(out[0])->client, order[i]);
        /* each client's own requests come in order */
        assert_int_equal(I(out[0])->seq, next_seq[order[i]]++);
    }
    assert_int_equal(sched_depth(&s), 0);
}

/* Same-problem requests batch up to max_batch, one per client per pass, after the head; other
 * problems wait. */
static void test_batching(void **state)
{
    (void)state;
    struct sched s;
    struct sched_client a, b;
    struct item ia[4], ib[3], other;
    sched_init(&s, 100, 4);
    sched_client_init(&a);
    sched_client_init(&b);
    for (int j = 0; j < 4; j++) {
        item_init(&ia[j], 0, j, 0, 2, 0);
        assert_int_equal(sched_push(&s, &a, &ia[j].si), 0);
    }
    item_init(&other, 1, 100, 5, 2, 0);
    assert_int_equal(sched_push(&s, &b, &other.si), 0);
    for (int j = 0; j < 3; j++) {
        item_init(&ib[j], 1, j, 0, 2, 0);
        assert_int_equal(sched_push(&s, &b, &ib[j].si), 0);
    }
    const struct sched_item *head;
    assert_int_equal(sched_peek(&s, &head), 4);
    assert_ptr_equal(head, &ia[0].si);
    assert_int_equal(sched_depth(&s), 8); /* peek takes nothing */

    struct sched_item *out[8];
    size_t n = sched_take(&s, out, 8);
    assert_int_equal(n, 4); /* max_batch */
    /* head a0, then passes starting with b (a went to the back): b0, a1, b1 */
    assert_ptr_equal(out[0], &ia[0].si);
    assert_ptr_equal(out[1], &ib[0].si);
    assert_ptr_equal(out[2], &ia[1].si);
    assert_ptr_equal(out[3], &ib[1].si);
    for (size_t i = 0; i < n; i++)
        assert_true(convd_problem_same(out[i]->problem, &probs[0]));
    assert_int_equal(sched_depth(&s), 4);

    /* b's head is now `other` (problem 5), alone; a batch of the rest follows */
    n = sched_take(&s, out, 8);
    assert_int_equal(n, 1);
    assert_ptr_equal(out[0], &other.si);
    n = sched_take(&s, out, 8);
    assert_int_equal(n, 3);
    assert_ptr_equal(out[0], &ia[2].si);
    assert_ptr_equal(out[1], &ib[2].si);
    assert_ptr_equal(out[2], &ia[3].si);
    /* the cap argument limits too */
    struct item more[3];
    for (int j = 0; j < 3; j++) {
        item_init(&more[j], 0, j, 1, 0, 0);
        assert_int_equal(sched_push(&s, &a, &more[j].si), 0);
    }
    assert_int_equal(sched_take(&s, out, 2), 2);
    assert_int_equal(sched_take(&s, out, 2), 1);
    assert_int_equal(sched_depth(&s), 0);
}

/* A batch led by a high-priority request takes same-problem requests from lower levels too, never
 * from higher ones (there are none above the head). */
static void test_batching_across_levels(void **state)
{
    (void)state;
    struct sched s;
    struct sched_client a, b;
    struct item lo[2], hi, mid_other;
    sched_init(&s, 100, 8);
    sched_client_init(&a);
    sched_client_init(&b);
    item_init(&lo[0], 0, 0, 2, 3, 0);
    item_init(&lo[1], 1, 1, 2, 3, 0);
    item_init(&mid_other, 1, 2, 3, 1, 0);
    item_init(&hi, 0, 3, 2, 0, 0);
    assert_int_equal(sched_push(&s, &a, &lo[0].si), 0);
    assert_int_equal(sched_push(&s, &b, &lo[1].si), 0);
    assert_int_equal(sched_push(&s, &b, &mid_other.si), 0);
    assert_int_equal(sched_push(&s, &a, &hi.si), 0);
    struct sched_item *out[8];
    assert_int_equal(sched_take(&s, out, 8), 3);
    assert_ptr_equal(out[0], &hi.si);
    assert_int_equal(sched_take(&s, out, 8), 1);
    assert_ptr_equal(out[0], &mid_other.si);
    assert_int_equal(sched_depth(&s), 0);
}

static void test_queue_full(void **state)
{
    (void)state;
    struct sched s;
    struct sched_client c;
    struct item it[4];
    sched_init(&s, 3, 8);
    sched_client_init(&c);
    for (int i = 0; i < 3; i++) {
        item_init(&it[i], 0, i, i, 0, 0);
        assert_int_equal(sched_push(&s, &c, &it[i].si), 0);
    }
    item_init(&it[3], 0, 3, 3, 0, 0);
    assert_int_equal(sched_push(&s, &c, &it[3].si), CONVD_EQUEUEFULL);
    assert_int_equal(sched_depth(&s), 3);
    struct sched_item *out[1];
    assert_int_equal(sched_take(&s, out, 1), 1);
    assert_int_equal(sched_push(&s, &c, &it[3].si), 0);
    assert_int_equal(sched_depth(&s), 3);
}

static void test_deadlines(void **state)
{
    (void)state;
    struct sched s;
    struct sched_client a, b;
    struct item it[4];
    sched_init(&s, 100, 8);
    sched_client_init(&a);
    sched_client_init(&b);
    item_init(&it[0], 0, 0, 0, 0, 1000);
    item_init(&it[1], 0, 1, 0, 2, 3000);
    item_init(&it[2], 1, 2, 0, 1, 0); /* no deadline */
    item_init(&it[3], 1, 3, 1, 1, 2000);
    assert_int_equal(sched_push(&s, &a, &it[0].si), 0);
    assert_int_equal(sched_push(&s, &a, &it[1].si), 0);
    assert_int_equal(sched_push(&s, &b, &it[2].si), 0);
    assert_int_equal(sched_push(&s, &b, &it[3].si), 0);
    assert_int_equal(sched_next_deadline(&s), 1000);
    assert_int_equal(s.deadline_floor, 1000);

    struct list_node out;
    list_init(&out);
    assert_int_equal(sched_expire(&s, 999, &out), 0);
    assert_int_equal(sched_expire(&s, 1000, &out), 1); /* due exactly now counts as expired */
    assert_ptr_equal(out.next, &it[0].si.link);
    assert_int_equal(sched_next_deadline(&s), 2000);
    assert_int_equal(s.deadline_floor, 2000); /* the walk left the earliest deadline */
    list_init(&out);
    assert_int_equal(sched_expire(&s, 5000, &out), 2);
    assert_int_equal(s.deadline_floor, 0);
    assert_int_equal(list_length(&out), 2);
    assert_int_equal(sched_next_deadline(&s), 0);
    /* what is left is the one without a deadline */
    assert_int_equal(sched_depth(&s), 1);
    assert_int_equal(a.queued, 0);
    struct sched_item *o[4];
    assert_int_equal(sched_take(&s, o, 4), 1);
    assert_ptr_equal(o[0], &it[2].si);
}

static void test_cancel(void **state)
{
    (void)state;
    struct sched s;
    struct sched_client a, b;
    struct item ia[3], ib[2];
    sched_init(&s, 100, 8);
    sched_client_init(&a);
    sched_client_init(&b);
    for (int j = 0; j < 3; j++) {
        item_init(&ia[j], 0, j, 0, (unsigned)j, 0);
        assert_int_equal(sched_push(&s, &a, &ia[j].si), 0);
    }
    for (int j = 0; j < 2; j++) {
        item_init(&ib[j], 1, j, 0, 1, 0);
        assert_int_equal(sched_push(&s, &b, &ib[j].si), 0);
    }
    struct list_node out;
    list_init(&out);
    assert_int_equal(sched_cancel_client(&s, &a, &out), 3);
    assert_int_equal(list_length(&out), 3);
    assert_int_equal(a.queued, 0);
    assert_int_equal(sched_depth(&s), 2);
    /* nothing of a is ever taken */
    struct sched_item *o[8];
    assert_int_equal(sched_take(&s, o, 8), 2);
    assert_int_equal(I(o[0])->client, 1);
    assert_int_equal(I(o[1])->client, 1);
    /* cancelling a client with nothing queued is harmless */
    list_init(&out);
    assert_int_equal(sched_cancel_client(&s, &a, &out), 0);
    /* cancel_all */
    for (int j = 0; j < 3; j++)
        assert_int_equal(sched_push(&s, &a, &ia[j].si), 0);
    for (int j = 0; j < 2; j++)
        assert_int_equal(sched_push(&s, &b, &ib[j].si), 0);
    assert_int_equal(sched_cancel_all(&s, &out), 5);
    assert_int_equal(sched_depth(&s), 0);
    assert_int_equal(sched_take(&s, o, 8), 0);
}

/* Random pushes, takes, expiries and cancellations against the invariants: every item leaves
 * exactly once, batches share one problem and respect max_batch, no queued item outranks the
 * head of the batch just taken, nothing expired is taken, and the per-client counts add up. */
static void test_random_workload(void **state)
{
    (void)state;
    struct tu_rng g;
    tu_rng_init(&g, tu_seed());
    enum { CLIENTS = 6, ITEMS = 3000, MAXB = 5 };
    struct sched s;
    struct sched_client cl[CLIENTS];
    struct item *items = calloc(ITEMS, sizeof(*items));
    assert_non_null(items);
    sched_init(&s, 200, MAXB);
    for (int c = 0; c < CLIENTS; c++)
        sched_client_init(&cl[c]);
    int pushed = 0, left = 0;
    uint64_t now = 1;
    while (pushed < ITEMS || sched_depth(&s) > 0) {
        int op = tu_rng_range(&g, 0, 9);
        if (op < 6 && pushed < ITEMS) {
            struct item *it = &items[pushed];
            int c = tu_rng_range(&g, 0, CLIENTS - 1);
            uint64_t dl = tu_rng_range(&g, 0, 3) == 0 ? now + (uint64_t)tu_rng_range(&g, 1, 50) : 0;
            item_init(it, c, pushed, tu_rng_range(&g, 0, 2), (unsigned)tu_rng_range(&g, 0, 3), dl);
            int rc = sched_push(&s, &cl[c], &it->si);
            if (rc == CONVD_EQUEUEFULL) {
                assert_int_equal(sched_depth(&s), 200);
                it->taken = 1;
            } else {
                assert_int_equal(rc, 0);
            }
            pushed++;
        } else if (op < 9) {
            struct list_node exp;
            list_init(&exp);
            sched_expire(&s, now, &exp);
            struct list_node *pos;
            list_for_each(pos, &exp)
            {
                struct item *it = I(list_entry(pos, struct sched_item, link));
                assert_true(it->si.deadline_ns != 0 && it->si.deadline_ns <= now);
                assert_int_equal(it->taken, 0);
                it->taken = 1;
            }
            struct sched_item *out[MAXB + 3];
            size_t n = sched_take(&s, out, MAXB + 3);
            assert_true(n <= MAXB);
            for (size_t i = 0; i < n; i++) {
                struct item *it = I(out[i]);
                assert_int_equal(it->taken, 0);
                it->taken = 1;
                assert_true(convd_problem_same(out[i]->problem, out[0]->problem));
                assert_true(out[i]->priority >= out[0]->priority);
                assert_true(it->si.deadline_ns == 0 || it->si.deadline_ns > now);
            }
            /* nothing left outranks the head */
            for (int l = 0; n > 0 && l < (int)out[0]->priority; l++)
                assert_true(list_empty(&s.ring[l]));
        } else {
            struct list_node out;
            list_init(&out);
            int c = tu_rng_range(&g, 0, CLIENTS - 1);
            sched_cancel_client(&s, &cl[c], &out);
            assert_int_equal(cl[c].queued, 0);
            struct list_node *pos;
            list_for_each(pos, &out)
            {
                struct item *it = I(list_entry(pos, struct sched_item, link));
                assert_int_equal(it->client, c);
                assert_int_equal(it->taken, 0);
                it->taken = 1;
            }
        }
        uint32_t sum = 0;
        for (int c = 0; c < CLIENTS; c++)
            sum += cl[c].queued;
        assert_int_equal(sum, sched_depth(&s));
        /* sched_expire skips its walk before deadline_floor: it must never pass a queued
         * item's deadline */
        uint64_t earliest = sched_next_deadline(&s);
        if (earliest != 0)
            assert_true(s.deadline_floor != 0 && s.deadline_floor <= earliest);
        now += (uint64_t)tu_rng_range(&g, 0, 3);
    }
    for (int i = 0; i < ITEMS; i++)
        if (!items[i].taken)
            left++;
    assert_int_equal(left, 0);
    free(items);
}

/* The id map behind regions and in-flight requests: inserts, duplicates, deletes that keep
 * probe chains intact, growth. */
static void test_idmap(void **state)
{
    (void)state;
    struct idmap m;
    idmap_init(&m);
    assert_null(idmap_get(&m, 5));
    assert_null(idmap_del(&m, 5));
    static int vals[4000];
    for (int i = 0; i < 4000; i++)
        assert_int_equal(idmap_put(&m, (uint64_t)i * 7919u, &vals[i]), 0);
    assert_int_equal(idmap_put(&m, 7919u, &vals[0]), CONVD_EEXIST);
    assert_int_equal(m.count, 4000);
    for (int i = 0; i < 4000; i += 2)
        assert_ptr_equal(idmap_del(&m, (uint64_t)i * 7919u), &vals[i]);
    for (int i = 0; i < 4000; i++) {
        void *v = idmap_get(&m, (uint64_t)i * 7919u);
        if (i % 2)
            assert_ptr_equal(v, &vals[i]);
        else
            assert_null(v);
    }
    assert_int_equal(idmap_put(&m, UINT64_MAX, &vals[1]), 0);
    assert_ptr_equal(idmap_get(&m, UINT64_MAX), &vals[1]);
    assert_int_equal(m.count, 2001);
    idmap_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_priorities), cmocka_unit_test(test_round_robin),
        cmocka_unit_test(test_batching),   cmocka_unit_test(test_batching_across_levels),
        cmocka_unit_test(test_queue_full), cmocka_unit_test(test_deadlines),
        cmocka_unit_test(test_cancel),     cmocka_unit_test(test_random_workload),
        cmocka_unit_test(test_idmap),
    };
    return cmocka_run_group_tests_name("daemon scheduler", tests, setup, NULL);
}
