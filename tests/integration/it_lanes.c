/*
 * Lanes (device_waits; docs/architecture.md, "Lanes") against a real daemon on the null backend,
 * whose lanes behave as a GPU's streams do (backends/null.c): a stream-ordered request is
 * launched into its client's lane when it arrives, runs once its ready word comes, and has its
 * done word stored then; a lane runs its requests in order. The null backend computes nothing,
 * so these tests check order, words, statuses and the daemon's state, not numbers (the GPU
 * backend's test_device_waits checks outputs). Here the test program plays each client's GPU
 * stream: it stores the ready word once the previous done word has come.
 *
 * Covered: a request held until its word and released by it; chains longer than a lane is deep,
 * over the rings and over the socket; more clients than lanes (the rest are polled by the loop);
 * a word that never comes (ETIMEDOUT after gate_timeout_ms, the request behind it then runs);
 * a hostile client that keeps writing a lower value while another client's chain runs
 * undisturbed; a registration and a release held back while a lane has a batch (the null
 * backend refuses them then, as a GPU would stall); a client that leaves with requests in its
 * lane; a drain that times out with
 * requests in lanes, and a clean exit.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define GATE_TIMEOUT_MS 400 /* the daemon's gate_timeout_ms here */
#define STR_(x)         #x
#define STR(x)          STR_(x)
#define HOLD_MS         150 /* how long a test watches a request that must not finish */
#define NULL_LANES      4   /* backends/null.c: NULLB_LANES */

static struct it_daemon daemon_;

static void lanes_warm_up(const struct it_daemon *d);

/* A null-backend daemon with lanes; the baseline as it_daemon_start takes it, after a warm-up
 * (what the daemon opens at its first client stays open). Three launch threads, each launch
 * made to take 20 us: a lane's launches overlap on several threads, and must still reach the
 * backend in order. */
static void lanes_daemon_start(struct it_daemon *d, const char *drain_ms)
{
    const char *args[] = {"--backend",
                          "null",
                          "--device-waits",
                          "1",
                          "--launch-threads",
                          "3",
                          "--null-launch-us",
                          "20",
                          "--gate-timeout-ms",
                          STR(GATE_TIMEOUT_MS),
                          "--log-level",
                          "notice",
                          "--drain-timeout-ms",
                          drain_ms,
                          NULL};
    char why[256];
    if (it_daemon_spawn(d, args, "it-lanes-monitor", why, sizeof(why)) != 0)
        fail_msg("%s", why);
    struct convd_server_info info;
    convd_server_info(d->mon, &info);
    assert_string_equal(info.backend, "null");
    lanes_warm_up(d);
    it_daemon_take_baseline(d);
}

static int group_setup(void **state)
{
    (void)state;
    lanes_daemon_start(&daemon_, "10000");
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    it_daemon_kill(&daemon_);
    return 0;
}

/* A client's tensors (one small case) and, past them, its words: ready at +0, done at +64,
 * a second pair at +128/+192. */
struct lane_client {
    convd_client *c;
    convd_region *r;
    struct it_case t;
    uint64_t words;
};

static void lc_open(struct lane_client *lc, const char *sock, const char *name, int use_rings)
{
    lc->c = it_connect_to(sock, name, use_rings);
    struct convd_problem p;
    tu_random_problem(it_rng(), &p, 0, 0, 6);
    lc->words = (it_case_span(&p) + 63) & ~(uint64_t)63;
    assert_int_equal(convd_region_create(lc->c, lc->words + 256, &lc->r), 0);
    it_case_init(&lc->t, lc->r, 0, &p, it_rng());
}

static void lc_close(struct lane_client *lc)
{
    it_case_fini(&lc->t);
    assert_int_equal(convd_region_free(lc->r), 0);
    convd_close(lc->c);
}

/* Word pair `pair`: which 0 is its ready word, 1 its done word. */
static _Atomic uint32_t *lc_word(const struct lane_client *lc, unsigned pair, unsigned which)
{
    return (_Atomic uint32_t *)(void *)((uint8_t *)convd_region_data(lc->r) + lc->words +
                                        128 * pair + 64 * which);
}

static uint64_t lc_submit(struct lane_client *lc, unsigned pair, uint32_t ready, uint32_t done)
{
    struct convd_conv_args a;
    it_case_args(&lc->t, &a);
    a.gate.region = lc->r;
    a.gate.ready_offset = lc->words + 128 * pair;
    a.gate.done_offset = lc->words + 128 * pair + 64;
    a.gate.ready_value = ready;
    a.gate.done_value = done;
    uint64_t id = 0;
    int rc = convd_conv_submit(lc->c, &a, &id);
    if (rc != 0)
        fail_msg("gated submit: %s: %s", convd_status_name(rc), convd_errstr(lc->c));
    return id;
}

/* One request through a lane and one whose word has come (queued at once), over the rings. */
static void lanes_warm_up(const struct it_daemon *d)
{
    struct lane_client lc;
    lc_open(&lc, d->sock, "it-lanes-warm-up", 1);
    atomic_store(lc_word(&lc, 0, 0), 0);
    atomic_store(lc_word(&lc, 1, 0), 1);
    uint64_t ids[2] = {lc_submit(&lc, 0, 1, 1), lc_submit(&lc, 1, 1, 1)};
    atomic_store(lc_word(&lc, 0, 0), 1);
    for (int i = 0; i < 2; i++) {
        struct convd_completion done;
        assert_int_equal(convd_wait(lc.c, ids[i], TU_TIMEOUT_MS, &done), 0);
        assert_int_equal(done.status, 0);
    }
    lc_close(&lc);
}

static double metric(const char *name)
{
    double v = -1;
    if (!it_metric(daemon_.mon, name, &v))
        fail_msg("the daemon's metrics have no %s", name);
    return v;
}

/* Waits until metric `name` is `want` (the loop's view moves a little after completions). */
static void expect_metric(const char *name, double want)
{
    double v = -1;
    for (int tries = 0; tries < 2000; tries++) {
        v = metric(name);
        if (v == want)
            return;
        usleep(1000);
    }
    fail_msg("%s is %g, want %g", name, v, want);
}

/* A request in a lane waits while its word is below the value, is counted as a lane request
 * meanwhile, and finishes once the word comes, with its done word stored. */
static void test_lane_holds_then_runs(void **state)
{
    (void)state;
    const double launches = metric("convd_lane_launches_total");
    const double lags = metric("convd_seen_lag_seconds_count");
    const double lag_sum = metric("convd_seen_lag_seconds_sum");
    const double waits = metric("convd_launch_wait_seconds_count");
    struct lane_client lc;
    lc_open(&lc, daemon_.sock, "it-lane-hold", -1);
    atomic_store(lc_word(&lc, 0, 0), 6);
    atomic_store(lc_word(&lc, 0, 1), 0);
    uint64_t id = lc_submit(&lc, 0, 7, 0x1234567u);
    struct convd_completion done;
    int rc = convd_wait(lc.c, id, HOLD_MS, &done);
    if (rc != CONVD_ETIMEDOUT)
        fail_msg("a lane request whose ready word is below its value finished (%s, status %s)",
                 convd_status_name(rc), convd_status_name(done.status));
    assert_int_equal(atomic_load(lc_word(&lc, 0, 1)), 0);
    assert_true(metric("convd_lane_requests") == 1);
    assert_true(metric("convd_gated") == 0); /* in the lane, not polled by the loop */
    assert_true(metric("convd_lane_launches_total") == launches + 1);
    atomic_store(lc_word(&lc, 0, 0), 7);
    assert_int_equal(convd_wait(lc.c, id, TU_TIMEOUT_MS, &done), 0);
    if (done.status != 0)
        fail_msg("lane request: %s: %s", convd_status_name(done.status), done.error);
    assert_int_equal(atomic_load(lc_word(&lc, 0, 1)), 0x1234567u);
    expect_metric("convd_lane_requests", 0);
    /* Its batch was timed once: the wait for a launch thread, and how late the loop saw it done,
     * which is bounded by the gap between two looks, not by the HOLD_MS it ran. */
    assert_true(metric("convd_seen_lag_seconds_count") == lags + 1);
    assert_true(metric("convd_launch_wait_seconds_count") == waits + 1);
    const double lag = metric("convd_seen_lag_seconds_sum") - lag_sum;
    if (lag >= HOLD_MS / 3 / 1e3)
        fail_msg("the loop saw a lane's batch done %.1f ms after its previous look", lag * 1e3);
    lc_close(&lc);
}

/* A client's stream: request i waits for ready value base + i + 1 and stores done value
 * base + i + 1, as the Python package's gates do; the "stream" stores each ready word once the
 * previous done word has come. */
struct chain {
    struct lane_client lc;
    const char *sock;
    char name[32];
    int use_rings;
    unsigned n;
    uint32_t base;
    uint64_t ids[64];
    char failure[512]; /* "": every request finished with status 0 */
};

static void *chain_run(void *arg)
{
    struct chain *ch = arg;
    struct lane_client *lc = &ch->lc;
    _Atomic uint32_t *ready = lc_word(lc, 0, 0), *done = lc_word(lc, 0, 1);
    atomic_store(ready, ch->base);
    atomic_store(done, ch->base);
    for (unsigned i = 0; i < ch->n; i++)
        ch->ids[i] = lc_submit(lc, 0, ch->base + i + 1, ch->base + i + 1);
    for (unsigned i = 0; i < ch->n; i++) {
        const uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
        while ((int32_t)(atomic_load(done) - (ch->base + i)) < 0) {
            if (tu_now_ms() > end) {
                snprintf(ch->failure, sizeof(ch->failure),
                         "%s: done word %#x after request %u, want %#x", ch->name,
                         (unsigned)atomic_load(done), i, (unsigned)(ch->base + i));
                return NULL;
            }
            usleep(50);
        }
        atomic_store(ready, ch->base + i + 1);
    }
    for (unsigned i = 0; i < ch->n; i++) {
        struct convd_completion c;
        int rc = convd_wait(lc->c, ch->ids[i], TU_TIMEOUT_MS, &c);
        if (rc != 0 || c.status != 0) {
            snprintf(ch->failure, sizeof(ch->failure), "%s: request %u: wait %s, status %s: %s",
                     ch->name, i, convd_status_name(rc), convd_status_name(c.status),
                     rc == 0 ? c.error : "");
            return NULL;
        }
    }
    if (atomic_load(done) != ch->base + ch->n)
        snprintf(ch->failure, sizeof(ch->failure), "%s: done word %#x at the end, want %#x",
                 ch->name, (unsigned)atomic_load(done), (unsigned)(ch->base + ch->n));
    return NULL;
}

/* Connects `clients` chains of n requests (their regions registered). */
static void chains_open(struct chain *ch, unsigned clients, unsigned n, int use_rings)
{
    assert_true(clients <= 8 && n <= 64);
    for (unsigned k = 0; k < clients; k++) {
        memset(&ch[k], 0, sizeof(ch[k]));
        snprintf(ch[k].name, sizeof(ch[k].name), "it-lane-chain-%u", k);
        ch[k].n = n;
        /* Near the wrap for some: the comparison is cyclic. */
        ch[k].base = k % 2 ? 0xfffffff0u : 100u * k;
        lc_open(&ch[k].lc, daemon_.sock, ch[k].name, use_rings);
    }
}

/* Runs the chains at once, each in its own thread on its own connection, and closes them. */
static void chains_run(struct chain *ch, unsigned clients)
{
    pthread_t th[8];
    for (unsigned k = 0; k < clients; k++)
        assert_int_equal(pthread_create(&th[k], NULL, chain_run, &ch[k]), 0);
    for (unsigned k = 0; k < clients; k++)
        pthread_join(th[k], NULL);
    for (unsigned k = 0; k < clients; k++) {
        if (ch[k].failure[0])
            fail_msg("%s", ch[k].failure);
        lc_close(&ch[k].lc);
    }
}

static void run_chains(unsigned clients, unsigned n, int use_rings)
{
    struct chain ch[8];
    chains_open(ch, clients, n, use_rings);
    chains_run(ch, clients);
}

/* Chains ten times deeper than a lane, over the rings and over the socket. Most requests go
 * through the lane; one whose word has come before a lane slot is free is queued by the loop
 * instead (it needs no wait), so the count is not exact. */
static void test_lane_chain(void **state)
{
    (void)state;
    const double launches = metric("convd_lane_launches_total");
    run_chains(1, 40, 1);
    run_chains(1, 40, 0);
    const double used = metric("convd_lane_launches_total") - launches;
    if (used < 8 || used > 80)
        fail_msg("%g of 80 chained requests went through the lane", used);
    expect_metric("convd_lane_requests", 0);
}

/* More clients than lanes: those without one are polled by the loop, and every chain ends. */
static void test_more_clients_than_lanes(void **state)
{
    (void)state;
    run_chains(NULL_LANES + 2, 30, -1);
    expect_metric("convd_lane_requests", 0);
}

/* A word that never comes: ETIMEDOUT after gate_timeout_ms, naming it and the lane, the done
 * word stored; the request behind it in the lane (its word came soon after it was sent) runs
 * then, and the connection goes on. (A request whose word has come when it arrives needs no
 * lane: it is queued at once, as without device_waits.) */
static void test_lane_timeout(void **state)
{
    (void)state;
    struct lane_client lc;
    lc_open(&lc, daemon_.sock, "it-lane-timeout", -1);
    for (unsigned pair = 0; pair < 2; pair++)
        for (unsigned w = 0; w < 2; w++)
            atomic_store(lc_word(&lc, pair, w), 0);
    const uint64_t t0 = tu_now_ms();
    uint64_t stuck = lc_submit(&lc, 0, 1, 9);
    uint64_t behind = lc_submit(&lc, 1, 3, 4);
    expect_metric("convd_lane_requests", 2);
    atomic_store(lc_word(&lc, 1, 0), 3);
    struct convd_completion done;
    assert_int_equal(convd_wait(lc.c, behind, HOLD_MS, &done), CONVD_ETIMEDOUT);
    assert_int_equal(convd_wait(lc.c, stuck, TU_TIMEOUT_MS, &done), 0);
    const uint64_t waited = tu_now_ms() - t0;
    if (done.status != CONVD_ETIMEDOUT || strstr(done.error, "gate_timeout_ms") == NULL ||
        strstr(done.error, "ready word") == NULL || strstr(done.error, "lane") == NULL)
        fail_msg("a word that never came: %s (%s), want ETIMEDOUT naming the ready word, "
                 "gate_timeout_ms and the lane",
                 convd_status_name(done.status), done.error);
    if (waited + 5 < GATE_TIMEOUT_MS)
        fail_msg("ETIMEDOUT after %llu ms, before the %d ms allowed", (unsigned long long)waited,
                 GATE_TIMEOUT_MS);
    assert_int_equal(atomic_load(lc_word(&lc, 0, 1)), 9);
    assert_int_equal(convd_wait(lc.c, behind, TU_TIMEOUT_MS, &done), 0);
    if (done.status != 0)
        fail_msg("the request behind the stuck one: %s: %s", convd_status_name(done.status),
                 done.error);
    assert_int_equal(atomic_load(lc_word(&lc, 1, 1)), 4);
    /* The connection goes on, in its lane. */
    atomic_store(lc_word(&lc, 0, 0), 10);
    uint64_t id = lc_submit(&lc, 0, 10, 11);
    assert_int_equal(convd_wait(lc.c, id, TU_TIMEOUT_MS, &done), 0);
    assert_int_equal(done.status, 0);
    expect_metric("convd_lane_requests", 0);
    lc_close(&lc);
}

struct lowering {
    _Atomic uint32_t *word;
    atomic_bool stop;
};

static void *lower_run(void *arg)
{
    struct lowering *l = arg;
    while (!atomic_load(&l->stop)) {
        atomic_store(l->word, 0);
        usleep(100);
    }
    return NULL;
}

/* A hostile client keeps storing a value below its request's: the daemon stores the value
 * back until the request has run, it fails with ETIMEDOUT, and other clients' chains run
 * meanwhile as if nothing happened. (Their regions are registered first: a registration waits
 * for the lanes to empty, test_lane_defers_memory_calls.) */
static void test_lane_hostile_lower_value(void **state)
{
    (void)state;
    struct chain ch[2];
    chains_open(ch, 2, 20, -1);
    struct lane_client bad;
    lc_open(&bad, daemon_.sock, "it-lane-hostile", -1);
    struct lowering l = {.word = lc_word(&bad, 0, 0)};
    atomic_store(&l.stop, false);
    atomic_store(lc_word(&bad, 0, 1), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, lower_run, &l), 0);
    const uint64_t t0 = tu_now_ms();
    uint64_t id = lc_submit(&bad, 0, 5, 6);
    chains_run(ch, 2);
    const uint64_t chains_ms = tu_now_ms() - t0;
    if (chains_ms >= GATE_TIMEOUT_MS)
        fail_msg("two honest chains took %llu ms beside a hostile client, past its %d ms "
                 "timeout: they waited for it",
                 (unsigned long long)chains_ms, GATE_TIMEOUT_MS);
    struct convd_completion done;
    assert_int_equal(convd_wait(bad.c, id, TU_TIMEOUT_MS, &done), 0);
    atomic_store(&l.stop, true);
    pthread_join(th, NULL);
    if (done.status != CONVD_ETIMEDOUT || strstr(done.error, "gate_timeout_ms") == NULL)
        fail_msg("the hostile client's request: %s (%s), want ETIMEDOUT naming gate_timeout_ms",
                 convd_status_name(done.status), done.error);
    assert_int_equal(atomic_load(lc_word(&bad, 0, 1)), 6);
    expect_metric("convd_lane_requests", 0);
    lc_close(&bad);
}

struct registering {
    convd_client *c;
    convd_region *r;
    int rc;
    char error[256];
    atomic_bool finished;
};

static void *register_run(void *arg)
{
    struct registering *g = arg;
    g->rc = convd_region_create(g->c, 4096, &g->r);
    if (g->rc != 0)
        snprintf(g->error, sizeof(g->error), "%s", convd_errstr(g->c));
    atomic_store(&g->finished, true);
    return NULL;
}

/* With a batch in a lane, importing or releasing memory would wait for the device on a GPU,
 * and so for the lane's word. A registration waits until the lane is empty (its client is not
 * read meanwhile) while another client is served; a release is queued until then, its region
 * still counted. The null backend refuses an import while a lane has a batch, so a daemon that
 * asked would fail the registration here. */
static void test_lane_defers_memory_calls(void **state)
{
    (void)state;
    struct lane_client lc, other;
    lc_open(&lc, daemon_.sock, "it-lane-mem-lane", -1);
    lc_open(&other, daemon_.sock, "it-lane-mem-other", -1);
    struct registering g = {.c = it_connect_to(daemon_.sock, "it-lane-mem-register", -1)};
    atomic_store(&g.finished, false);
    const double holds = metric("convd_region_holds_total");
    atomic_store(lc_word(&lc, 0, 0), 0);
    uint64_t id = lc_submit(&lc, 0, 1, 1);
    expect_metric("convd_lane_requests", 1);

    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, register_run, &g), 0);
    expect_metric("convd_region_holds_total", holds + 1);
    struct convd_conv_args a;
    it_case_args(&other.t, &a);
    uint64_t oid = 0;
    struct convd_completion done;
    assert_int_equal(convd_conv_submit(other.c, &a, &oid), 0);
    assert_int_equal(convd_wait(other.c, oid, TU_TIMEOUT_MS, &done), 0);
    if (done.status != 0)
        fail_msg("another client's request beside a held registration: %s: %s",
                 convd_status_name(done.status), done.error);
    usleep(HOLD_MS * 1000);
    if (atomic_load(&g.finished))
        fail_msg("a registration finished while a lane had a batch (%s: %s)",
                 convd_status_name(g.rc), g.error);
    atomic_store(lc_word(&lc, 0, 0), 1);
    pthread_join(th, NULL);
    if (g.rc != 0)
        fail_msg("the held registration: %s: %s", convd_status_name(g.rc), g.error);
    assert_int_equal(convd_wait(lc.c, id, TU_TIMEOUT_MS, &done), 0);
    assert_int_equal(done.status, 0);
    expect_metric("convd_lane_requests", 0);

    /* A release while the lane has a batch waits for it. */
    const double regions = metric("convd_regions");
    uint64_t id2 = lc_submit(&lc, 0, 2, 2);
    expect_metric("convd_lane_requests", 1);
    assert_int_equal(convd_region_free(g.r), 0);
    usleep(HOLD_MS * 1000);
    if (metric("convd_regions") != regions)
        fail_msg("a region was released while a lane had a batch (%g regions, %g before)",
                 metric("convd_regions"), regions);
    atomic_store(lc_word(&lc, 0, 0), 2);
    assert_int_equal(convd_wait(lc.c, id2, TU_TIMEOUT_MS, &done), 0);
    assert_int_equal(done.status, 0);
    expect_metric("convd_regions", regions - 1);
    expect_metric("convd_lane_requests", 0);
    convd_close(g.c);
    lc_close(&other);
    lc_close(&lc);
}

/* A client that leaves with requests in its lane: the daemon stores their words, they finish
 * well before gate_timeout_ms, and the daemon goes on serving. */
static void test_lane_client_leaves(void **state)
{
    (void)state;
    struct lane_client lc;
    lc_open(&lc, daemon_.sock, "it-lane-leaver", -1);
    atomic_store(lc_word(&lc, 0, 0), 0);
    for (uint32_t i = 0; i < 3; i++)
        (void)lc_submit(&lc, 0, 1 + i, 1 + i);
    expect_metric("convd_lane_requests", 3);
    const uint64_t t0 = tu_now_ms();
    it_case_fini(&lc.t);
    convd_close(lc.c); /* with its region */
    expect_metric("convd_lane_requests", 0);
    if (tu_now_ms() - t0 >= GATE_TIMEOUT_MS)
        fail_msg("a departed client's lane drained only after %llu ms: its words were not "
                 "released when it left",
                 (unsigned long long)(tu_now_ms() - t0));
    run_chains(1, 5, -1);
    expect_metric("convd_lane_requests", 0);
}

/* A drain that times out with a request in a lane: its word is stored, the request fails with
 * ESHUTDOWN, and the daemon exits 0 well before gate_timeout_ms would have released it. */
static void test_lane_drain_timeout(void **state)
{
    (void)state;
    struct it_daemon dd;
    lanes_daemon_start(&dd, "50");
    struct lane_client lc;
    lc_open(&lc, dd.sock, "it-lane-drain", -1);
    atomic_store(lc_word(&lc, 0, 0), 0);
    uint64_t id = lc_submit(&lc, 0, 1, 2);
    double v = -1;
    for (int tries = 0; tries < 2000 && v != 1; tries++) {
        assert_true(it_metric(dd.mon, "convd_lane_requests", &v));
        usleep(1000);
    }
    assert_true(v == 1);
    const uint64_t t0 = tu_now_ms();
    assert_int_equal(kill(dd.pid, SIGTERM), 0);
    struct convd_completion done;
    assert_int_equal(convd_wait(lc.c, id, TU_TIMEOUT_MS, &done), 0);
    if (done.status != CONVD_ESHUTDOWN || strstr(done.error, "drain") == NULL)
        fail_msg("a lane request at the drain timeout: %s (%s), want ESHUTDOWN naming the drain",
                 convd_status_name(done.status), done.error);
    assert_int_equal(atomic_load(lc_word(&lc, 0, 1)), 2);
    it_case_fini(&lc.t);
    convd_close(lc.c);
    it_daemon_wait_exit(&dd);
    if (tu_now_ms() - t0 >= GATE_TIMEOUT_MS)
        fail_msg("the daemon took %llu ms to stop with a 50 ms drain timeout",
                 (unsigned long long)(tu_now_ms() - t0));
}

static void test_zz_no_leaks_and_clean_exit(void **state)
{
    (void)state;
    it_daemon_check_baseline(&daemon_);
    it_daemon_stop(&daemon_);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lane_holds_then_runs),
        cmocka_unit_test(test_lane_chain),
        cmocka_unit_test(test_more_clients_than_lanes),
        cmocka_unit_test(test_lane_timeout),
        cmocka_unit_test(test_lane_hostile_lower_value),
        cmocka_unit_test(test_lane_defers_memory_calls),
        cmocka_unit_test(test_lane_client_leaves),
        cmocka_unit_test(test_lane_drain_timeout),
        cmocka_unit_test(test_zz_no_leaks_and_clean_exit),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
