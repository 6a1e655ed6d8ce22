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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "daemon.h"
#include "fault.h"
#include "scenario.h"
#include "log.h"
#include "testutil.h"

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
        scenario(s.sock, seed, &o);
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
            scenario(s.sock, seed + (uint64_t)i, &o);
            bool hit = fault_hit();
            fault_arm((enum fault_fn)fn, 0);
            if (o.lost != 0 || o.wrong != 0)
                fail_msg("%s: %d requests lost, %d wrong outputs", label, o.lost, o.wrong);
            check_serving(s.sock, seed + (uint64_t)i, label);
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
                check_serving(s.sock, seed, label);
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
