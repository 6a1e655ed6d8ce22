/*
 * Gates (stream ordering, docs/protocol.md "Gates") against a real daemon on the CPU backend:
 * a gated request does not run before its ready word comes, runs once it does (checked against
 * the reference on fresh data, output poisoned first) and has its done word written; over the
 * rings and over the socket; the cyclic comparison; gate_timeout_ms and timeout_us; the
 * daemon's and the library's refusals with their sentences; a client that leaves with gated
 * requests; a daemon that dies under gated requests, whose done words the library writes. Here
 * the test program plays the GPU stream: it stores the ready word itself.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "raw.h"
#include "ring_layout.h"
#include "wire.h"

#define GATE_TIMEOUT_MS 400 /* the daemon's gate_timeout_ms here */
#define STR_(x)         #x
#define STR(x)          STR_(x)
/* How long a test watches a request that must not run: long enough for a CPU convolution of
 * these sizes to have finished many times over, were it running. */
#define HOLD_MS 150

static struct it_daemon daemon_;

static int group_setup(void **state)
{
    (void)state;
    const char *extra[] = {"--gate-timeout-ms", STR(GATE_TIMEOUT_MS), NULL};
    it_daemon_start(&daemon_, extra);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    it_daemon_kill(&daemon_);
    return 0;
}

/* One case in its own region, with 64 bytes of gate words past it: ready at +0, done at +4. */
struct gated {
    convd_region *r;
    struct it_case t;
    uint64_t words;
};

static void gated_init(struct gated *g, convd_client *c, const struct convd_problem *p)
{
    g->words = (it_case_span(p) + 63) & ~(uint64_t)63;
    assert_int_equal(convd_region_create(c, g->words + 64, &g->r), 0);
    it_case_init(&g->t, g->r, 0, p, it_rng());
}

static _Atomic uint32_t *gated_word(const struct gated *g, unsigned which)
{
    return (_Atomic uint32_t *)(void *)((uint8_t *)convd_region_data(g->r) + g->words + 4 * which);
}

static void gated_args(const struct gated *g, struct convd_conv_args *a, uint32_t ready,
                       uint32_t done)
{
    it_case_args(&g->t, a);
    a->gate.region = g->r;
    a->gate.ready_offset = g->words;
    a->gate.done_offset = g->words + 4;
    a->gate.ready_value = ready;
    a->gate.done_value = done;
}

static void gated_fini(struct gated *g)
{
    it_case_fini(&g->t);
    assert_int_equal(convd_region_free(g->r), 0);
}

static bool output_poisoned(const struct it_case *t)
{
    const uint8_t *out = (const uint8_t *)convd_region_data(t->region) + t->off_out;
    for (uint64_t i = 0; i < t->sz.output_bytes; i++)
        if (out[i] != 0xff)
            return false;
    return true;
}

static void small_problem(struct convd_problem *p)
{
    tu_random_problem(it_rng(), p, 0, 0, 6);
}

/* The request waits while the word is below the value, runs once it is stored, is right, and
 * finds its done word written before its completion is handed out. */
static void run_gated(const char *name, int use_rings)
{
    convd_client *c = it_connect_to(daemon_.sock, name, use_rings);
    struct convd_problem p;
    small_problem(&p);
    struct gated g;
    gated_init(&g, c, &p);
    struct convd_conv_args a;
    gated_args(&g, &a, 7, 0x1234567u);
    atomic_store(gated_word(&g, 0), 6);
    uint64_t id;
    int rc = convd_conv_submit(c, &a, &id);
    if (rc != 0)
        fail_msg("gated submit: %s: %s", convd_status_name(rc), convd_errstr(c));
    struct convd_completion done;
    rc = convd_wait(c, id, HOLD_MS, &done);
    if (rc != CONVD_ETIMEDOUT)
        fail_msg("a request whose ready word is below its value completed (%s, status %s)",
                 convd_status_name(rc), convd_status_name(done.status));
    assert_true(output_poisoned(&g.t));
    assert_int_equal(atomic_load(gated_word(&g, 1)), 0);
    double gated = 0;
    assert_true(it_metric(daemon_.mon, "convd_gated", &gated));
    assert_true(gated >= 1);

    atomic_store(gated_word(&g, 0), 7);
    assert_int_equal(convd_wait(c, id, TU_TIMEOUT_MS, &done), 0);
    if (done.status != 0)
        fail_msg("gated request: %s: %s", convd_status_name(done.status), done.error);
    assert_int_equal(atomic_load(gated_word(&g, 1)), 0x1234567u);
    it_case_check(&g.t);
    gated_fini(&g);
    convd_close(c);
}

static void test_gate_holds_then_runs_ring(void **state)
{
    (void)state;
    run_gated("it-gate-ring", 1);
}

static void test_gate_holds_then_runs_socket(void **state)
{
    (void)state;
    run_gated("it-gate-socket", 0);
}

/* A word already at (or past) its value runs at once; the comparison is cyclic, as
 * cuStreamWaitValue32's GEQ: 5 is past 0xfffffff0, and 0x80000005 is not past 5. */
static void test_gate_cyclic_comparison(void **state)
{
    (void)state;
    convd_client *c = it_connect_to(daemon_.sock, "it-gate-cyclic", -1);
    struct convd_problem p;
    small_problem(&p);
    const struct {
        uint32_t word, value;
        bool open;
    } cases[] = {
        {10, 10, true},          {11, 10, true},          {5, 0xfffffff0u, true},
        {0xfffffff0u, 5, false}, {0x80000005u, 5, false}, {0x7ffffff0u, 0x80000000u, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct gated g;
        gated_init(&g, c, &p);
        struct convd_conv_args a;
        gated_args(&g, &a, cases[i].value, (uint32_t)i + 1);
        atomic_store(gated_word(&g, 0), cases[i].word);
        uint64_t id;
        assert_int_equal(convd_conv_submit(c, &a, &id), 0);
        struct convd_completion done;
        int rc = convd_wait(c, id, cases[i].open ? TU_TIMEOUT_MS : HOLD_MS, &done);
        if (cases[i].open ? rc != 0 : rc != CONVD_ETIMEDOUT)
            fail_msg("word 0x%x, value 0x%x: wait %s, want the gate %s", cases[i].word,
                     cases[i].value, convd_status_name(rc), cases[i].open ? "open" : "shut");
        if (!cases[i].open) {
            assert_true(output_poisoned(&g.t));
            atomic_store(gated_word(&g, 0), cases[i].value);
            assert_int_equal(convd_wait(c, id, TU_TIMEOUT_MS, &done), 0);
        }
        assert_int_equal(done.status, 0);
        assert_int_equal(atomic_load(gated_word(&g, 1)), (uint32_t)i + 1);
        it_case_check(&g.t);
        gated_fini(&g);
    }
    convd_close(c);
}

/* Many gated requests in flight, opened in reverse order: each runs only after its own word,
 * and all are right. */
static void test_gates_open_out_of_order(void **state)
{
    (void)state;
    convd_client *c = it_connect_to(daemon_.sock, "it-gate-many", -1);
    enum { N = 24 };
    struct gated g[N];
    uint64_t ids[N];
    struct convd_problem p;
    small_problem(&p);
    for (int i = 0; i < N; i++) {
        gated_init(&g[i], c, &p);
        struct convd_conv_args a;
        gated_args(&g[i], &a, 1, 100u + (uint32_t)i);
        assert_int_equal(convd_conv_submit(c, &a, &ids[i]), 0);
    }
    for (int i = N - 1; i >= 0; i--) {
        struct convd_completion done;
        if (i % 6 == 0) /* now and then: the rest still wait */
            for (int j = 0; j < i; j++)
                assert_true(output_poisoned(&g[j].t));
        atomic_store(gated_word(&g[i], 0), 1);
        assert_int_equal(convd_wait(c, ids[i], TU_TIMEOUT_MS, &done), 0);
        assert_int_equal(done.status, 0);
        assert_int_equal(atomic_load(gated_word(&g[i], 1)), 100u + (uint32_t)i);
        it_case_check(&g[i].t);
    }
    for (int i = 0; i < N; i++)
        gated_fini(&g[i]);
    convd_close(c);
}

/* A word that never comes: ETIMEDOUT after gate_timeout_ms (or the request's shorter
 * timeout_us), naming which; the output untouched and the done word written, so that a stream
 * waiting on it goes on. */
static void test_gate_timeouts(void **state)
{
    (void)state;
    convd_client *c = it_connect_to(daemon_.sock, "it-gate-timeout", -1);
    struct convd_problem p;
    small_problem(&p);
    const struct {
        uint64_t timeout_us;
        const char *names;
    } cases[] = {{0, "gate_timeout_ms"}, {50000, "timeout_us"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct gated g;
        gated_init(&g, c, &p);
        struct convd_conv_args a;
        gated_args(&g, &a, 1, 9);
        a.timeout_us = cases[i].timeout_us;
        uint64_t t0 = tu_now_ms(), id;
        assert_int_equal(convd_conv_submit(c, &a, &id), 0);
        struct convd_completion done;
        assert_int_equal(convd_wait(c, id, TU_TIMEOUT_MS, &done), 0);
        uint64_t waited = tu_now_ms() - t0;
        if (done.status != CONVD_ETIMEDOUT || strstr(done.error, cases[i].names) == NULL ||
            strstr(done.error, "ready word") == NULL)
            fail_msg("gate never opened: %s (%s), want ETIMEDOUT naming %s",
                     convd_status_name(done.status), done.error, cases[i].names);
        uint64_t floor_ms = cases[i].timeout_us != 0 ? cases[i].timeout_us / 1000 : GATE_TIMEOUT_MS;
        if (waited + 5 < floor_ms)
            fail_msg("ETIMEDOUT after %llu ms, before the %llu ms allowed",
                     (unsigned long long)waited, (unsigned long long)floor_ms);
        assert_true(output_poisoned(&g.t));
        assert_int_equal(atomic_load(gated_word(&g, 1)), 9);
        gated_fini(&g);
    }
    /* The connection goes on. */
    it_one_conv(c, it_rng());
    convd_close(c);
}

/* The library refuses a bad gate before sending it, with the code the daemon would give. */
static void test_library_refuses_bad_gates(void **state)
{
    (void)state;
    convd_client *c = it_connect_to(daemon_.sock, "it-gate-lib", -1);
    convd_client *other = it_connect_to(daemon_.sock, "it-gate-other", -1);
    convd_region *foreign = NULL;
    assert_int_equal(convd_region_create(other, 4096, &foreign), 0);
    struct convd_problem p;
    small_problem(&p);
    struct gated g;
    gated_init(&g, c, &p);
    const uint64_t end = convd_region_size(g.r);
    const struct {
        const char *what;
        uint64_t ready, done;
        bool foreign;
        int status;
        const char *says;
    } cases[] = {
        {"misaligned", g.words + 2, g.words + 4, false, CONVD_EINVAL, "aligned"},
        {"past the end", g.words, end, false, CONVD_EBOUNDS, "does not fit"},
        {"one word", g.words, g.words, false, CONVD_EINVAL, "same word"},
        {"in the output", g.t.off_out, g.words, false, CONVD_EINVAL, "output tensor"},
        {"in the input", g.words, g.t.off_in, false, CONVD_EINVAL, "input tensor"},
        {"another client's region", 0, 4, true, CONVD_ENOREGION, "another client"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct convd_conv_args a;
        gated_args(&g, &a, 1, 1);
        a.gate.ready_offset = cases[i].ready;
        a.gate.done_offset = cases[i].done;
        if (cases[i].foreign)
            a.gate.region = foreign;
        uint64_t id;
        int rc = convd_conv_submit(c, &a, &id);
        if (rc != cases[i].status || strstr(convd_errstr(c), cases[i].says) == NULL)
            fail_msg("gate %s: %s (%s), want %s naming '%s'", cases[i].what, convd_status_name(rc),
                     convd_errstr(c), convd_status_name(cases[i].status), cases[i].says);
    }
    assert_int_equal(convd_inflight(c), 0);
    gated_fini(&g);
    assert_int_equal(convd_region_free(foreign), 0);
    convd_close(other);
    convd_close(c);
}

/* Registers a memfd of `size` bytes as region id on a raw connection; asserts success. With
 * map, the region is also mapped here and returned there. */
static void raw_region(int fd, uint64_t id, uint64_t size, unsigned extra_seals, uint8_t **map)
{
    int mfd = tu_memfd("convd-it-gate", size, F_SEAL_SHRINK | F_SEAL_GROW | extra_seals);
    if (map != NULL) {
        *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
        assert_true(*map != MAP_FAILED);
    }
    char why[256];
    int st = raw_register(fd, id, size, &mfd, 1, why, sizeof(why));
    close(mfd);
    if (st != 0)
        fail_msg("register region %llu: %s (%s)", (unsigned long long)id, convd_status_name(st),
                 why);
}

/* A raw connection (Hello said) with a small problem's request in rc, its tensors in region 1
 * from offset 0 and 64 bytes of gate words after them, from `words` on (mapped at map). */
struct raw_gated {
    int fd;
    struct raw_conv rc;
    uint64_t words, size;
    uint8_t *map;
};

static void raw_gated_open(struct raw_gated *g)
{
    g->fd = raw_connect(daemon_.sock);
    raw_hello(g->fd);
    struct convd_problem p;
    small_problem(&p);
    /* fp32: raw_conv_init lays the tensors out back to back, and only 4-byte elements start every
     * tensor on a word boundary, where a gate word placed in one meets the overlap check rather
     * than the alignment check (an fp16 weight at offset 4410 did). */
    p.dtype = CONVD_DTYPE_FP32;
    uint64_t span = raw_conv_init(&g->rc, 1, &p, 1);
    g->words = (span + 63) & ~(uint64_t)63;
    g->size = g->words + 64;
    raw_region(g->fd, 1, g->size, 0, &g->map);
}

static void raw_gated_close(struct raw_gated *g)
{
    close(g->fd);
    munmap(g->map, g->size);
}

/* The daemon's own checks, reached with hand-built requests on the socket (a client of its own
 * might send anything): each refused with its code and sentence, the connection going on. */
static void test_daemon_refuses_bad_gates(void **state)
{
    (void)state;
    struct raw_gated g;
    raw_gated_open(&g);
    const int fd = g.fd;
    const uint64_t words = g.words;
    struct raw_conv *rc = &g.rc;
    raw_region(fd, 2, 4096, F_SEAL_WRITE, NULL);
    const struct {
        const char *what;
        uint64_t region, ready, done;
        int status;
        const char *says;
    } cases[] = {
        {"unregistered", 9, words, words + 4, CONVD_ENOREGION, "not registered"},
        {"misaligned", 1, words + 1, words + 4, CONVD_EINVAL, "aligned"},
        {"past the end", 1, words, words + 64, CONVD_EBOUNDS, "past the end"},
        {"one word", 1, words + 8, words + 8, CONVD_EINVAL, "same word"},
        {"in the weight", 1, words, rc->w.offset, CONVD_EINVAL, "weight tensor"},
        {"write-sealed", 2, 0, 4, CONVD_ESEAL, "sealed"},
    };
    Convd__Gate gate = CONVD__GATE__INIT;
    rc->req.gate = &gate;
    char why[320];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        gate.region_id = cases[i].region;
        gate.ready_offset = cases[i].ready;
        gate.done_offset = cases[i].done;
        gate.ready_value = 1;
        gate.done_value = 1;
        rc->req.id = 100 + i;
        raw_conv_send(fd, rc);
        int st = raw_expect_completion(fd, rc->req.id, why, sizeof(why));
        if (st != cases[i].status || strstr(why, cases[i].says) == NULL)
            fail_msg("gate %s: %s (%s), want %s naming '%s'", cases[i].what, convd_status_name(st),
                     why, convd_status_name(cases[i].status), cases[i].says);
    }
    /* The same request with a good gate whose word is already there runs. */
    gate.region_id = 1;
    gate.ready_offset = words;
    gate.done_offset = words + 4;
    gate.ready_value = 0;
    gate.done_value = 5;
    rc->req.id = 200;
    raw_conv_send(fd, rc);
    int st = raw_expect_completion(fd, rc->req.id, why, sizeof(why));
    if (st != 0)
        fail_msg("a good gate: %s (%s)", convd_status_name(st), why);
    raw_gated_close(&g);
}

/* A request refused after its gate passed the checks (here EEXIST: its id is in flight) has its
 * done word written by the daemon, so that its stream goes on without waiting for its client to
 * read the refusal; a refusal of the gate itself writes nothing. */
static void test_refused_after_gate_check_releases(void **state)
{
    (void)state;
    struct raw_gated g;
    raw_gated_open(&g);
    const int fd = g.fd;
    const uint64_t words = g.words;
    struct raw_conv *rc = &g.rc;
    char why[320];
    int st;
    _Atomic uint32_t *w = (_Atomic uint32_t *)(void *)(g.map + words);
    /* words: 0 ready of the first, 1 its done, 2 and 3 the duplicate's, 4 and 5 a bad gate's */
    Convd__Gate gate = CONVD__GATE__INIT;
    gate.region_id = 1;
    gate.ready_offset = words;
    gate.done_offset = words + 4;
    gate.ready_value = 1;
    gate.done_value = 11;
    rc->req.gate = &gate;
    rc->req.id = 300;
    raw_conv_send(fd, rc); /* waits on word 0 */
    gate.ready_offset = words + 8;
    gate.done_offset = words + 12;
    gate.done_value = 22;
    raw_conv_send(fd, rc); /* the same id: EEXIST */
    st = raw_expect_completion(fd, 300, why, sizeof(why));
    if (st != CONVD_EEXIST)
        fail_msg("a duplicate id: %s (%s), want EEXIST", convd_status_name(st), why);
    assert_int_equal(atomic_load(&w[3]), 22);
    assert_int_equal(atomic_load(&w[1]), 0);
    gate.ready_offset = words + 16;
    gate.done_offset = words + 18; /* misaligned: the gate fails its checks */
    gate.done_value = 33;
    rc->req.id = 301;
    raw_conv_send(fd, rc);
    st = raw_expect_completion(fd, 301, why, sizeof(why));
    assert_int_equal(st, CONVD_EINVAL);
    assert_int_equal(atomic_load(&w[4]) | atomic_load(&w[5]), 0);
    atomic_store(&w[0], 1);
    st = raw_expect_completion(fd, 300, why, sizeof(why));
    if (st != 0)
        fail_msg("the gated request: %s (%s)", convd_status_name(st), why);
    assert_int_equal(atomic_load(&w[1]), 11);
    raw_gated_close(&g);
}

/* A client that leaves with gated requests: they are cancelled, nothing is left gated, and the
 * daemon goes on serving. */
static void test_client_leaves_with_gated_requests(void **state)
{
    (void)state;
    convd_client *c = it_connect_to(daemon_.sock, "it-gate-leaver", -1);
    struct convd_problem p;
    small_problem(&p);
    struct gated g[4];
    for (int i = 0; i < 4; i++) {
        gated_init(&g[i], c, &p);
        struct convd_conv_args a;
        gated_args(&g[i], &a, 1, 1);
        uint64_t id;
        assert_int_equal(convd_conv_submit(c, &a, &id), 0);
    }
    double gated = 0;
    for (int tries = 0; tries < 1000; tries++) {
        assert_true(it_metric(daemon_.mon, "convd_gated", &gated));
        if (gated >= 4)
            break;
        usleep(2000);
    }
    assert_true(gated >= 4);
    for (int i = 0; i < 4; i++)
        it_case_fini(&g[i].t);
    convd_close(c); /* with the requests and their regions */
    for (int tries = 0; tries < 1000; tries++) {
        assert_true(it_metric(daemon_.mon, "convd_gated", &gated));
        if (gated == 0)
            break;
        usleep(2000);
    }
    assert_true(gated == 0);
    convd_client *d = it_connect(&daemon_, "it-gate-after");
    it_one_conv(d, it_rng());
    convd_close(d);
}

/* The daemon's CPU time (all threads), from its metrics. */
static double daemon_cpu(convd_client *mon)
{
    double v = -1;
    assert_true(it_metric(mon, "process_cpu_seconds_total", &v));
    return v;
}

/* While requests wait on their gates and nothing else happens, the loop sleeps between looks
 * (gate_poll_us, 100 us by default) when they are those of more than gate_spin_clients
 * connections, instead of spinning: over HOLD a spinning loop would use a whole CPU, a sleeping
 * one a small part of one (8% here on an idle machine; less under load, when its wake-ups come
 * late). With gate_poll_us 0, or few enough connections (one, by default), it spins, which only
 * a machine with a CPU to spare shows, so there the test checks only that the words are seen. */
static void test_loop_sleeps_or_spins_while_gated(void **state)
{
    (void)state;
    static const struct {
        const char *args[5];
        int conns;
        bool sleeps;
    } cases[] = {
        {{"--gate-spin-clients", "0", NULL}, 1, true},
        {{"--gate-spin-clients", "1", NULL}, 2, true},
        {{NULL}, 1, false},
        {{"--gate-poll-us", "0", "--gate-spin-clients", "0", NULL}, 1, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct it_daemon dd;
        it_daemon_start(&dd, cases[i].args[0] != NULL ? cases[i].args : NULL);
        convd_client *c[2] = {NULL, NULL};
        struct gated g[2];
        uint64_t id[2];
        for (int k = 0; k < cases[i].conns; k++) {
            c[k] = it_connect_to(dd.sock, "it-gate-idle", -1);
            struct convd_problem p;
            small_problem(&p);
            gated_init(&g[k], c[k], &p);
            struct convd_conv_args a;
            gated_args(&g[k], &a, 1, 2);
            assert_int_equal(convd_conv_submit(c[k], &a, &id[k]), 0);
        }
        usleep(20 * 1000); /* past spin_us: the loop has settled */
        double cpu0 = daemon_cpu(dd.mon);
        uint64_t t0 = tu_now_ms();
        usleep(500 * 1000);
        double cpu = daemon_cpu(dd.mon) - cpu0, wall = (double)(tu_now_ms() - t0) / 1000.0;
        if (cases[i].sleeps && cpu > 0.5 * wall)
            fail_msg("case %zu: the daemon used %.3f s of CPU in %.3f s with requests of %d "
                     "connection(s) gated and nothing else to do: it should sleep between looks "
                     "(gate_poll_us)",
                     i, cpu, wall, cases[i].conns);
        for (int k = 0; k < cases[i].conns; k++) {
            atomic_store(gated_word(&g[k], 0), 1);
            struct convd_completion done;
            assert_int_equal(convd_wait(c[k], id[k], TU_TIMEOUT_MS, &done), 0);
            assert_int_equal(done.status, 0);
            it_case_check(&g[k].t);
            gated_fini(&g[k]);
            convd_close(c[k]);
        }
        it_daemon_stop(&dd);
    }
}

/* A daemon that dies under gated requests writes no done words: the library does, when it
 * sees the connection go, so that no stream waits forever. */
static void test_lost_daemon_releases_done_words(void **state)
{
    (void)state;
    struct it_daemon dd;
    it_daemon_start(&dd, NULL);
    convd_client *c = it_connect_to(dd.sock, "it-gate-orphan", -1);
    struct convd_problem p;
    small_problem(&p);
    struct gated g;
    gated_init(&g, c, &p);
    struct convd_conv_args a;
    gated_args(&g, &a, 1, 77);
    uint64_t id;
    assert_int_equal(convd_conv_submit(c, &a, &id), 0);
    assert_int_equal(atomic_load(gated_word(&g, 1)), 0);
    assert_int_equal(kill(dd.pid, SIGKILL), 0);
    struct convd_completion done;
    int rc = convd_wait(c, id, TU_TIMEOUT_MS, &done);
    if (rc != CONVD_ECLOSED)
        fail_msg("waiting on a dead daemon: %s, want ECLOSED", convd_status_name(rc));
    assert_int_equal(atomic_load(gated_word(&g, 1)), 77);
    it_case_fini(&g.t);
    convd_close(c);
    it_daemon_kill(&dd);
}

static void test_zz_no_leaks_and_clean_exit(void **state)
{
    (void)state;
    it_daemon_check_clean(&daemon_);
    it_daemon_stop(&daemon_);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gate_holds_then_runs_ring),
        cmocka_unit_test(test_gate_holds_then_runs_socket),
        cmocka_unit_test(test_gate_cyclic_comparison),
        cmocka_unit_test(test_gates_open_out_of_order),
        cmocka_unit_test(test_gate_timeouts),
        cmocka_unit_test(test_library_refuses_bad_gates),
        cmocka_unit_test(test_daemon_refuses_bad_gates),
        cmocka_unit_test(test_refused_after_gate_check_releases),
        cmocka_unit_test(test_client_leaves_with_gated_requests),
        cmocka_unit_test(test_lost_daemon_releases_done_words),
        cmocka_unit_test(test_loop_sleeps_or_spins_while_gated),
        cmocka_unit_test(test_zz_no_leaks_and_clean_exit),
    };
    return cmocka_run_group_tests_name("integration: gates", tests, group_setup, group_teardown);
}
