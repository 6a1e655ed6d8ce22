/*
 * Fault injection into the daemon (issue 17, item 7): a convd_daemon runs in this process on the
 * CPU backend, linked with fault.c's wrappers, while the test drives it through the real client
 * library (a shared library, so its own calls are never failed). For each wrapped call the test
 * first counts how often a scenario reaches it, then reruns the scenario once per call, failing
 * that call. After every run:
 *   - no request was lost: each one the daemon accepted completed, with a status, within a bound;
 *   - the daemon still serves: a new client's convolution matches the reference;
 *   - nothing leaked: clients, regions and requests in flight are back to zero in the metrics, the
 *     process's descriptors and memfd mappings are back to their count before the daemon started,
 *     and (sanitizer builds) LeakSanitizer finds no leak.
 * The same holds for daemon_create() failing part-way: an error sentence, and nothing left open.
 *
 * CONVD_FAULT_MAX (default 120) caps the runs per call; more calls than that are sampled evenly.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "convd/convd.h"
#include "daemon.h"
#include "fault.h"
#include "log.h"
#include "testutil.h"

#define WAIT_MS 60000 /* bound on any wait: a request still in flight after this was lost */

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FAULT_LSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define FAULT_LSAN 1
#endif
#ifdef FAULT_LSAN
int __lsan_do_recoverable_leak_check(void);
#endif

/* --- the daemon under test ---------------------------------------------------------------- */

struct srv {
    struct convd_daemon *d;
    pthread_t thread;
    int rc;
    char dir[64];
    char sock[CONFIG_PATH_BYTES];
    struct convd_config cfg;
};

static void *srv_thread(void *arg)
{
    struct srv *s = arg;
    s->rc = daemon_run(s->d);
    return NULL;
}

static unsigned srv_ringers; /* doorbell threads of the daemons the test starts */

static void srv_config(struct srv *s)
{
    memset(s, 0, sizeof(*s));
    snprintf(s->dir, sizeof(s->dir), "/tmp/convd-fault-XXXXXX");
    assert_non_null(mkdtemp(s->dir));
    snprintf(s->sock, sizeof(s->sock), "%s/convd.sock", s->dir);
    config_defaults(&s->cfg);
    snprintf(s->cfg.socket_path, sizeof(s->cfg.socket_path), "%s", s->sock);
    s->cfg.backend = CONFIG_BACKEND_CPU;
    s->cfg.threads = 2;
    s->cfg.max_batch = 4;
    /* The loop sleeps instead of spinning: fewer recvmsg calls to fail, and a sleeping loop is
     * the harder case for a lost wake-up. */
    s->cfg.spin_us = 0;
    s->cfg.doorbell_threads = srv_ringers;
    /* Faults make the daemon log errors by design; CONVD_FAULT_VERBOSE=1 shows them. */
    s->cfg.log_level = getenv("CONVD_FAULT_VERBOSE") != NULL ? LOG_LVL_DEBUG : LOG_LVL_ERR - 1;
    convd_log_level = s->cfg.log_level;
}

static int count_fds(void)
{
    DIR *dir = opendir("/proc/self/fd");
    assert_non_null(dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL;)
        if (e->d_name[0] != '.')
            n++;
    closedir(dir);
    return n - 1; /* the directory's own descriptor */
}

static int count_memfd_maps(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof(line), f) != NULL)
        if (strstr(line, "/memfd:") != NULL)
            n++;
    fclose(f);
    return n;
}

/* --- the clients -------------------------------------------------------------------------- */

struct job {
    struct convd_problem p;
    struct convd_problem_sizes z;
    uint64_t in_off, w_off, b_off, out_off, bytes;
};

static uint64_t align64(uint64_t v)
{
    return (v + 63) & ~(uint64_t)63;
}

static void job_init(struct job *j, int which)
{
    struct convd_problem *p = &j->p;
    if (which == 0) {
        convd_problem_init(p, 2, 9, 9, 8, 8, 3, 3, 4);
        p->pad_top = p->pad_bottom = p->pad_left = p->pad_right = 1;
        p->layout = CONVD_LAYOUT_NHWC;
        p->has_bias = true;
        p->relu = true;
    } else {
        convd_problem_init(p, 1, 7, 6, 6, 6, 3, 3, 6);
        p->stride_h = p->stride_w = 2;
        p->pad_top = p->pad_left = 1;
        p->dtype = CONVD_DTYPE_FP16;
    }
    assert_int_equal(convd_problem_sizes(p, &j->z, NULL, 0), 0);
    j->in_off = 0;
    j->w_off = align64(j->z.input_bytes);
    j->b_off = j->w_off + align64(j->z.weight_bytes);
    j->out_off = j->b_off + align64(j->z.bias_bytes);
    j->bytes = j->out_off + align64(j->z.output_bytes);
}

static void job_fill(const struct job *j, uint8_t *base, struct tu_rng *g)
{
    tu_fill_random(g, j->p.dtype, base + j->in_off, j->z.input_elems);
    tu_fill_random(g, j->p.dtype, base + j->w_off, j->z.weight_elems);
    if (j->p.has_bias)
        tu_fill_random(g, j->p.dtype, base + j->b_off, j->z.bias_elems);
    tu_poison(base + j->out_off, j->z.output_bytes);
}

/* Whether the output in base matches the reference. */
static bool job_correct(const struct job *j, const uint8_t *base)
{
    float *ref = malloc(j->z.output_elems * sizeof(float));
    assert_non_null(ref);
    tu_ref_conv(&j->p, base + j->in_off, base + j->w_off, j->p.has_bias ? base + j->b_off : NULL,
                ref);
    double err = tu_rel_error(j->p.dtype, base + j->out_off, ref, j->z.output_elems, NULL);
    free(ref);
    return err <= tu_tolerance(j->p.dtype);
}

static convd_client *cl_connect(const struct srv *s, int rings)
{
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = s->sock;
    o.client_name = "fault";
    o.timeout_ms = WAIT_MS;
    o.use_rings = rings;
    o.spin_us = 0;
    convd_client *c = NULL;
    if (convd_connect(&o, &c) != 0)
        return NULL;
    return c;
}

/* What a scenario saw. `lost` is fatal; the others only say how far the fault reached. */
struct outcome {
    int lost;      /* requests that never completed */
    int wrong;     /* requests that succeeded with a wrong output */
    int failed;    /* calls or requests that failed with a status */
    int completed; /* requests that succeeded */
    char what[256];
};

static void note_fail(struct outcome *o, const char *step, int rc)
{
    if (o->failed++ == 0)
        snprintf(o->what, sizeof(o->what), "%s: %s", step, convd_status_name(rc));
}

/* Client with rings: three requests in one region (they may batch), then status, metrics and an
 * orderly close. Returns with everything released whatever failed. */
static void client_rings(const struct srv *s, struct tu_rng *g, struct outcome *o, bool strict)
{
    struct job j;
    job_init(&j, 0);
    convd_client *c = cl_connect(s, 1);
    if (c == NULL) {
        note_fail(o, "connect (rings)", CONVD_ECONNECT);
        return;
    }
    convd_region *r = NULL;
    int rc = convd_region_create(c, 3 * j.bytes, &r);
    if (rc != 0) {
        note_fail(o, "region_create", rc);
        goto out;
    }
    uint8_t *base = convd_region_data(r);
    uint64_t ids[3];
    bool sent[3] = {false, false, false};
    for (int i = 0; i < 3; i++) {
        job_fill(&j, base + i * j.bytes, g);
        struct convd_conv_args a = CONVD_CONV_ARGS_INIT;
        a.problem = j.p;
        uint64_t at = (uint64_t)i * j.bytes;
        a.input = (struct convd_tensor){r, at + j.in_off, j.z.input_bytes};
        a.weight = (struct convd_tensor){r, at + j.w_off, j.z.weight_bytes};
        a.bias = (struct convd_tensor){r, at + j.b_off, j.z.bias_bytes};
        a.output = (struct convd_tensor){r, at + j.out_off, j.z.output_bytes};
        rc = convd_conv_submit(c, &a, &ids[i]);
        if (rc != 0)
            note_fail(o, "submit", rc);
        else
            sent[i] = true;
    }
    for (int i = 0; i < 3; i++) {
        if (!sent[i])
            continue;
        struct convd_completion done;
        rc = convd_wait(c, ids[i], WAIT_MS, &done);
        if (rc == CONVD_ETIMEDOUT) {
            o->lost++;
        } else if (rc != 0) {
            note_fail(o, "wait", rc);
        } else if (done.status != 0) {
            note_fail(o, "request", done.status);
        } else if (!job_correct(&j, base + i * j.bytes)) {
            o->wrong++;
        } else {
            o->completed++;
        }
    }
    struct convd_status st;
    rc = convd_status_get(c, &st);
    if (rc != 0)
        note_fail(o, "status", rc);
    char *text = NULL;
    rc = convd_metrics_get(c, &text);
    if (rc != 0)
        note_fail(o, "metrics", rc);
    free(text);
out:
    if (r != NULL && convd_region_free(r) != 0)
        note_fail(o, "region_free", CONVD_EIO);
    convd_close(c);
    if (strict && o->failed != 0)
        fail_msg("a client on an unfaulted daemon failed: %s", o->what);
}

/* Client without rings: the blocking convenience call, fp16 NCHW. */
static void client_socket(const struct srv *s, struct tu_rng *g, struct outcome *o)
{
    struct job j;
    job_init(&j, 1);
    convd_client *c = cl_connect(s, 0);
    if (c == NULL) {
        note_fail(o, "connect (socket)", CONVD_ECONNECT);
        return;
    }
    uint8_t *buf = malloc(j.bytes);
    assert_non_null(buf);
    job_fill(&j, buf, g);
    int rc = convd_conv(c, &j.p, buf + j.in_off, buf + j.w_off, NULL, buf + j.out_off);
    if (rc == CONVD_ETIMEDOUT)
        o->lost++;
    else if (rc != 0)
        note_fail(o, "conv", rc);
    else if (!job_correct(&j, buf))
        o->wrong++;
    else
        o->completed++;
    free(buf);
    convd_close(c);
}

/* Client that leaves with a request in flight: the daemon must cancel or finish it and release
 * the region either way. */
static void client_vanish(const struct srv *s, struct tu_rng *g, struct outcome *o)
{
    struct job j;
    job_init(&j, 0);
    convd_client *c = cl_connect(s, 1);
    if (c == NULL) {
        note_fail(o, "connect (vanish)", CONVD_ECONNECT);
        return;
    }
    convd_region *r = NULL;
    int rc = convd_region_create(c, j.bytes, &r);
    if (rc == 0) {
        job_fill(&j, convd_region_data(r), g);
        struct convd_conv_args a = CONVD_CONV_ARGS_INIT;
        a.problem = j.p;
        a.input = (struct convd_tensor){r, j.in_off, j.z.input_bytes};
        a.weight = (struct convd_tensor){r, j.w_off, j.z.weight_bytes};
        a.bias = (struct convd_tensor){r, j.b_off, j.z.bias_bytes};
        a.output = (struct convd_tensor){r, j.out_off, j.z.output_bytes};
        uint64_t id;
        rc = convd_conv_submit(c, &a, &id);
        if (rc != 0)
            note_fail(o, "submit (vanish)", rc);
    } else {
        note_fail(o, "region_create (vanish)", rc);
    }
    convd_close(c); /* frees r too */
}

static void scenario(const struct srv *s, uint64_t seed, struct outcome *o)
{
    struct tu_rng g;
    tu_rng_init(&g, seed);
    client_rings(s, &g, o, false);
    client_socket(s, &g, o);
    client_vanish(s, &g, o);
}

/* --- after each run: the daemon serves, and holds nothing ----------------------------------- */

static double metric(const char *text, const char *name)
{
    size_t len = strlen(name);
    for (const char *p = text; p != NULL && *p != '\0';) {
        if (strncmp(p, name, len) == 0 && p[len] == ' ')
            return strtod(p + len + 1, NULL);
        p = strchr(p, '\n');
        if (p != NULL)
            p++;
    }
    fail_msg("metric %s missing", name);
    return -1;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Connects (retrying while a paused listener or a full table catches up), waits until this is
 * the only client and no region or request remains, then runs a full, strict client. */
static void check_serving(const struct srv *s, uint64_t seed, const char *label)
{
    uint64_t until = now_ms() + WAIT_MS;
    convd_client *c;
    while ((c = cl_connect(s, 0)) == NULL) {
        if (now_ms() > until)
            fail_msg("%s: the daemon no longer accepts clients", label);
        usleep(20000);
    }
    for (;;) {
        char *text = NULL;
        int rc = convd_metrics_get(c, &text);
        if (rc != 0)
            fail_msg("%s: metrics failed on an unfaulted daemon: %s", label, convd_errstr(c));
        double clients = metric(text, "convd_clients");
        double regions = metric(text, "convd_regions");
        double inflight = metric(text, "convd_inflight");
        free(text);
        if (clients == 1 && regions == 0 && inflight == 0)
            break;
        if (now_ms() > until)
            fail_msg("%s: the daemon still holds %.0f clients, %.0f regions, %.0f requests", label,
                     clients - 1, regions, inflight);
        usleep(5000);
    }
    convd_close(c);
    struct tu_rng g;
    tu_rng_init(&g, seed ^ 0x5eed);
    struct outcome o = {0};
    client_rings(s, &g, &o, true);
    if (o.lost != 0 || o.wrong != 0 || o.completed != 3)
        fail_msg("%s: on the recovered daemon %d lost, %d wrong, %d of 3 completed", label, o.lost,
                 o.wrong, o.completed);
}

static void check_no_leaks(int fds, int maps, const char *label)
{
    int now_fds = count_fds(), now_maps = count_memfd_maps();
    if (now_fds != fds)
        fail_msg("%s: %d descriptors open, %d before the daemon started", label, now_fds, fds);
    if (now_maps != maps)
        fail_msg("%s: %d memfd mappings, %d before the daemon started", label, now_maps, maps);
#ifdef FAULT_LSAN
    if (__lsan_do_recoverable_leak_check() != 0)
        fail_msg("%s: LeakSanitizer found leaks (above)", label);
#endif
}

/* Evenly spaced call numbers to fail, at most `cap` of 1..calls. */
static long nth_call(long i, long calls, long cap)
{
    if (calls <= cap)
        return i + 1;
    return 1 + (i * (calls - 1)) / (cap - 1);
}

static long runs_cap(void)
{
    const char *e = getenv("CONVD_FAULT_MAX");
    long v = e != NULL ? strtol(e, NULL, 10) : 0;
    return v >= 2 ? v : 120;
}

/* --- tests -------------------------------------------------------------------------------- */

static void srv_start(struct srv *s)
{
    char why[256];
    int rc = daemon_create(&s->cfg, &s->d, why, sizeof(why));
    if (rc != 0)
        fail_msg("daemon_create: %s", why);
    assert_int_equal(pthread_create(&s->thread, NULL, srv_thread, s), 0);
}

static void srv_stop(struct srv *s)
{
    daemon_request_stop(s->d);
    assert_int_equal(pthread_join(s->thread, NULL), 0);
    daemon_destroy(s->d);
    s->d = NULL;
}

/* Every wrapped call the serving scenario reaches, failed in turn; *state: doorbells sent by
 * the loop itself (0) or by ringer threads (2). */
static void test_serving_faults(void **state)
{
    srv_ringers = (unsigned)(uintptr_t)*state;
    uint64_t seed = tu_seed();
    long cap = runs_cap();
    int total_runs = 0, total_hits = 0;
    for (int fn = 0; fn < FAULT_N; fn++) {
        /* Count this call's uses in an unfaulted run. */
        struct srv s;
        srv_config(&s);
        int fds = count_fds(), maps = count_memfd_maps();
        srv_start(&s);
        struct outcome o = {0};
        fault_arm((enum fault_fn)fn, 0);
        scenario(&s, seed, &o);
        long calls = fault_calls((enum fault_fn)fn);
        if (o.lost != 0 || o.wrong != 0 || o.failed != 0)
            fail_msg("unfaulted scenario: %d lost, %d wrong, %d failed (%s)", o.lost, o.wrong,
                     o.failed, o.what);
        srv_stop(&s);
        rmdir(s.dir);
        check_no_leaks(fds, maps, "unfaulted run");

        long runs = calls < cap ? calls : cap;
        int hits = 0;
        for (long i = 0; i < runs; i++) {
            long nth = nth_call(i, calls, cap);
            char label[96];
            snprintf(label, sizeof(label), "%s call %ld of %ld failed", fault_name(fn), nth, calls);
            srv_config(&s);
            fds = count_fds();
            maps = count_memfd_maps();
            srv_start(&s);
            memset(&o, 0, sizeof(o));
            fault_arm((enum fault_fn)fn, nth);
            scenario(&s, seed + (uint64_t)i, &o);
            bool hit = fault_hit();
            fault_arm((enum fault_fn)fn, 0);
            if (o.lost != 0 || o.wrong != 0)
                fail_msg("%s: %d requests lost, %d wrong outputs", label, o.lost, o.wrong);
            check_serving(&s, seed + (uint64_t)i, label);
            srv_stop(&s);
            rmdir(s.dir);
            check_no_leaks(fds, maps, label);
            hits += hit;
        }
        fprintf(stderr, "fault: %-15s %5ld calls in the serving scenario, %3ld runs, %3d hit\n",
                fault_name(fn), calls, runs, hits);
        total_runs += (int)runs;
        total_hits += hits;
    }
    fprintf(stderr, "fault: serving with %u ringer threads: %d runs, %d faults injected\n",
            srv_ringers, total_runs, total_hits);
    assert_true(total_hits > 0);
}

/* daemon_create() with each of its calls failed in turn: an error sentence, nothing left open;
 * or, when the failed call was one it can do without, a daemon that serves. */
static void test_create_faults(void **state)
{
    srv_ringers = (unsigned)(uintptr_t)*state;
    uint64_t seed = tu_seed();
    long cap = runs_cap();
    int refused = 0, served = 0;
    for (int fn = 0; fn < FAULT_N; fn++) {
        struct srv s;
        srv_config(&s);
        fault_exempt_self(false);
        fault_arm((enum fault_fn)fn, 0);
        char why[256] = "";
        int rc = daemon_create(&s.cfg, &s.d, why, sizeof(why));
        long calls = fault_calls((enum fault_fn)fn);
        fault_exempt_self(true);
        if (rc != 0)
            fail_msg("unfaulted daemon_create: %s", why);
        daemon_destroy(s.d);
        rmdir(s.dir);
        long runs = calls < cap ? calls : cap;
        fprintf(stderr, "fault: %-15s %5ld calls in daemon_create\n", fault_name(fn), calls);
        for (long i = 0; i < runs; i++) {
            long nth = nth_call(i, calls, cap);
            char label[96];
            snprintf(label, sizeof(label), "daemon_create with %s call %ld of %ld failed",
                     fault_name(fn), nth, calls);
            srv_config(&s);
            int fds = count_fds(), maps = count_memfd_maps();
            why[0] = '\0';
            fault_exempt_self(false);
            fault_arm((enum fault_fn)fn, nth);
            rc = daemon_create(&s.cfg, &s.d, why, sizeof(why));
            fault_exempt_self(true);
            bool hit = fault_hit();
            fault_arm((enum fault_fn)fn, 0);
            if (rc != 0) {
                if (why[0] == '\0')
                    fail_msg("%s: refused with no sentence", label);
                if (!hit)
                    fail_msg("%s: refused without a fault: %s", label, why);
                refused++;
            } else {
                assert_int_equal(pthread_create(&s.thread, NULL, srv_thread, &s), 0);
                check_serving(&s, seed, label);
                srv_stop(&s);
                served++;
            }
            rmdir(s.dir);
            check_no_leaks(fds, maps, label);
        }
    }
    fprintf(stderr, "fault: daemon_create: %d runs refused with a sentence, %d served\n", refused,
            served);
    assert_true(refused > 0);
}

int main(void)
{
    fault_exempt_self(true);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_create_faults, (void *)(uintptr_t)2),
        cmocka_unit_test_prestate(test_serving_faults, (void *)(uintptr_t)0),
        cmocka_unit_test_prestate(test_serving_faults, (void *)(uintptr_t)2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
