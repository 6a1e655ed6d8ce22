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
 *
 * Built a second time as fault_gpu (FAULT_GPU, NVIDIA builds, tests/gpu): the daemon on the GPU
 * backend, with the CUDA runtime calls of tests/gpu/fault_cuda.c failed in turn too, and a lost
 * context (every call failing from one on), after which the daemon must drain and exit 1.
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
#ifdef FAULT_GPU
#include <cuda_runtime_api.h>
#include <time.h>

#include "fault_cuda.h"
#endif
#include "fault.h"
#include "insrv.h"
#include "scenario.h"
#include "log.h"
#include "testutil.h"

/* --- the daemon under test ---------------------------------------------------------------- */

static unsigned srv_ringers; /* doorbell threads of the daemons the test starts */
static enum config_backend srv_backend = CONFIG_BACKEND_CPU;

static void srv_config(struct tu_srv *s)
{
    tu_srv_config(s, "convd-fault");
    s->cfg.backend = srv_backend;
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

/* The wrapped calls a set names: the POSIX ones of fault.h, or (fault_gpu) the CUDA runtime's. */
struct call_set {
    int first, n;
    const char *(*name)(int id);
};

static const char *posix_name(int id)
{
    return fault_name((enum fault_fn)id);
}

static const struct call_set posix_calls = {0, FAULT_N, posix_name};

/* Every call of the set that the serving scenario reaches, failed in turn. */
static void serving_faults(const struct call_set *set)
{
    uint64_t seed = tu_seed();
    long cap = runs_cap();
    int total_runs = 0, total_hits = 0;
    for (int fn = set->first; fn < set->first + set->n; fn++) {
        /* Count this call's uses in an unfaulted run. */
        struct tu_srv s;
        srv_config(&s);
        int fds = count_fds(), maps = count_memfd_maps();
        tu_srv_start(&s);
        long calls = scenario_count_calls(s.sock, seed, fn);
        struct outcome o = {0};
        tu_srv_join(&s);
        rmdir(s.dir);
        check_no_leaks(fds, maps, "unfaulted run");

        long runs = calls < cap ? calls : cap;
        int hits = 0;
        for (long i = 0; i < runs; i++) {
            long nth = nth_call(i, calls, cap);
            char label[96];
            snprintf(label, sizeof(label), "%s call %ld of %ld failed", set->name(fn), nth, calls);
            srv_config(&s);
            fds = count_fds();
            maps = count_memfd_maps();
            tu_srv_start(&s);
            memset(&o, 0, sizeof(o));
            fault_arm(fn, nth);
            scenario(s.sock, seed + (uint64_t)i, &o);
            bool hit = fault_hit();
            fault_arm(fn, 0);
            if (o.lost != 0 || o.wrong != 0)
                fail_msg("%s: %d requests lost, %d wrong outputs", label, o.lost, o.wrong);
            check_serving(s.sock, seed + (uint64_t)i, label);
            tu_srv_join(&s);
            rmdir(s.dir);
            check_no_leaks(fds, maps, label);
            hits += hit;
        }
        fprintf(stderr, "fault: %-26s %5ld calls in the serving scenario, %3ld runs, %3d hit\n",
                set->name(fn), calls, runs, hits);
        total_runs += (int)runs;
        total_hits += hits;
    }
    fprintf(stderr, "fault: serving on %s with %u ringer threads: %d runs, %d faults injected\n",
            srv_backend == CONFIG_BACKEND_GPU ? "the GPU" : "the CPU", srv_ringers, total_runs,
            total_hits);
    assert_true(total_hits > 0);
}

/* *state: doorbells sent by the loop itself (0) or by ringer threads (2). */
static void test_serving_faults(void **state)
{
    srv_ringers = (unsigned)(uintptr_t)*state;
    serving_faults(&posix_calls);
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
        struct tu_srv s;
        srv_config(&s);
        fault_exempt_self(false);
        fault_arm(fn, 0);
        char why[256] = "";
        int rc = daemon_create(&s.cfg, &s.d, why, sizeof(why));
        long calls = fault_calls(fn);
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
            fault_arm(fn, nth);
            rc = daemon_create(&s.cfg, &s.d, why, sizeof(why));
            fault_exempt_self(true);
            bool hit = fault_hit();
            fault_arm(fn, 0);
            if (rc != 0) {
                if (why[0] == '\0')
                    fail_msg("%s: refused with no sentence", label);
                if (!hit)
                    fail_msg("%s: refused without a fault: %s", label, why);
                refused++;
            } else {
                assert_int_equal(pthread_create(&s.thread, NULL, tu_srv_thread, &s), 0);
                check_serving(s.sock, seed, label);
                tu_srv_join(&s);
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

#ifdef FAULT_GPU
/* --- the GPU backend (fault_gpu) ----------------------------------------------------------- */

static bool gpu_present(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

static const struct call_set cuda_calls = {FC_FIRST, FC_N, fault_cuda_name};

/* Each CUDA runtime call the backend makes while serving, failed in turn as a failure that
 * leaves the context usable: the requests it hit fail with a status and the daemon serves on. */
static void test_gpu_runtime_faults(void **state)
{
    (void)state;
    srv_ringers = 0;
    serving_faults(&cuda_calls);
}

/* Joins the daemon thread of s if it returns within ms. */
static bool joined_within(struct tu_srv *s, int ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
    }
    return pthread_timedjoin_np(s->thread, NULL, &until) == 0;
}

/* A lost context: from one failed call on, every runtime call of the daemon fails. No request
 * is lost, and the daemon drains and returns 1 from daemon_run by itself, for the service
 * manager to restart it. */
static void test_gpu_context_lost(void **state)
{
    (void)state;
    srv_ringers = 0;
    uint64_t seed = tu_seed();
    static const int ids[] = {FC_FIRST + FC_EVENT_QUERY, FC_FIRST + FC_LAST_ERROR,
                              FC_FIRST + FC_MEMCPY,      FC_FIRST + FC_STREAM_SYNC,
                              FC_FIRST + FC_WRITE_VALUE, FC_FIRST + FC_STREAM_QUERY};
    int exits = 0;
    for (size_t k = 0; k < sizeof(ids) / sizeof(ids[0]); k++) {
        int id = ids[k];
        struct tu_srv s;
        srv_config(&s);
        tu_srv_start(&s);
        long calls = scenario_count_calls(s.sock, seed, id);
        struct outcome o = {0};
        tu_srv_join(&s);
        rmdir(s.dir);
        const long picks[3] = {1, (calls + 1) / 2, calls};
        for (int i = 0; i < 3 && calls > 0; i++) {
            char label[96];
            snprintf(label, sizeof(label), "context lost at %s call %ld of %ld",
                     fault_cuda_name(id), picks[i], calls);
            srv_config(&s);
            int fds = count_fds(), maps = count_memfd_maps();
            tu_srv_start(&s);
            memset(&o, 0, sizeof(o));
            fault_cuda_sticky(true);
            fault_arm(id, picks[i]);
            scenario(s.sock, seed + (uint64_t)i, &o);
            bool hit = fault_hit();
            if (o.lost != 0 || o.wrong != 0)
                fail_msg("%s: %d requests lost, %d wrong outputs", label, o.lost, o.wrong);
            if (hit) {
                /* A failed call whose result the daemon ignores (clearing an error) shows only at
                 * its next runtime call; when it was the scenario's last, a next client brings
                 * one, as it would after a real loss. */
                bool ended = joined_within(&s, 2000);
                if (!ended) {
                    struct outcome next = {0};
                    scenario(s.sock, seed + 100 + (uint64_t)i, &next);
                    if (next.lost != 0 || next.wrong != 0)
                        fail_msg("%s: after the loss %d requests lost, %d wrong outputs", label,
                                 next.lost, next.wrong);
                }
                if (!ended && !joined_within(&s, WAIT_MS))
                    fail_msg("%s: the daemon kept running with a lost device", label);
                if (s.rc != 1)
                    fail_msg("%s: daemon_run returned %d, want 1", label, s.rc);
                fault_arm(id, 0);
                fault_cuda_sticky(false);
                daemon_destroy(s.d);
                s.d = NULL;
                exits++;
            } else {
                fault_arm(id, 0);
                fault_cuda_sticky(false);
                tu_srv_join(&s);
            }
            rmdir(s.dir);
            check_no_leaks(fds, maps, label);
        }
    }
    fprintf(stderr, "fault: lost context: the daemon stopped itself %d times\n", exits);
    assert_true(exits > 0);
}
#endif

int main(void)
{
    fault_exempt_self(true);
#ifdef FAULT_GPU
    if (!gpu_present()) {
        printf("SKIP: no GPU\n");
        return 77;
    }
    srv_backend = CONFIG_BACKEND_GPU;
    fds_skip_gpu_nodes = true;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_create_faults, (void *)(uintptr_t)0),
        cmocka_unit_test_prestate(test_serving_faults, (void *)(uintptr_t)0),
        cmocka_unit_test(test_gpu_runtime_faults),
        cmocka_unit_test(test_gpu_context_lost),
    };
#else
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_create_faults, (void *)(uintptr_t)2),
        cmocka_unit_test_prestate(test_serving_faults, (void *)(uintptr_t)0),
        cmocka_unit_test_prestate(test_serving_faults, (void *)(uintptr_t)2),
    };
#endif
    /* CONVD_TEST_ONLY=test_gpu_context_lost (a glob) runs the tests it matches alone. */
    if (getenv("CONVD_TEST_ONLY") != NULL)
        cmocka_set_test_filter(getenv("CONVD_TEST_ONLY"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
