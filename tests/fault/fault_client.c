/*
 * Fault injection into the client library: libconvd-client linked statically with fault.c's
 * wrappers, against a real convd process (CPU backend) on a temporary socket. Each wrapped call
 * the scenario's client calls make is failed in turn. After every run:
 *   - every call returned 0 or a status, and no request that the library accepted was lost (each
 *     wait ended with a completion or an error, within a bound); none succeeded with a wrong
 *     output;
 *   - the daemon holds no client, region or request of ours, still serves a new client, and its
 *     descriptor count is back where it was;
 *   - this process's descriptors and memfd mappings are back where they were, and (ASan builds)
 *     LeakSanitizer finds no leak.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "convd/convd.h"
#include "fault.h"
#include "scenario.h"
#include "testutil.h"

#ifndef CONVD_BIN
#error "CONVD_BIN: path of the convd executable"
#endif

struct proc {
    pid_t pid;
    char dir[64];
    char sock[108];
};

static void proc_start(struct proc *d)
{
    snprintf(d->dir, sizeof(d->dir), "/tmp/convd-fault-XXXXXX");
    assert_non_null(mkdtemp(d->dir));
    snprintf(d->sock, sizeof(d->sock), "%s/convd.sock", d->dir);
    d->pid = fork();
    assert_true(d->pid >= 0);
    if (d->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* a failing test leaves no daemon behind */
        execl(CONVD_BIN, "convd", "--backend", "cpu", "--threads", "2", "--socket", d->sock,
              "--log-level", "warning", (char *)NULL);
        _exit(127);
    }
    /* check_serving retries until the daemon accepts, and proves it computes. */
    check_serving(d->sock, 1, "daemon start");
}

static void proc_stop(struct proc *d)
{
    assert_int_equal(kill(d->pid, SIGTERM), 0);
    int st;
    assert_int_equal(waitpid(d->pid, &st, 0), d->pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    rmdir(d->dir);
}

static void test_client_faults(void **state)
{
    (void)state;
    uint64_t seed = tu_seed();
    long cap = runs_cap();
    struct proc d;
    proc_start(&d);
    usleep(200000); /* let the daemon finish closing proc_start's client */
    int daemon_fds = count_fds_of(d.pid);
    int total_runs = 0, total_hits = 0;
    for (int fn = 0; fn < FAULT_N; fn++) {
        int fds = count_fds(), maps = count_memfd_maps();
        long calls = scenario_count_calls(d.sock, seed, fn);
        struct outcome o = {0};
        check_serving(d.sock, seed, "unfaulted run");
        check_no_leaks(fds, maps, "unfaulted run");

        long runs = calls < cap ? calls : cap;
        int hits = 0;
        for (long i = 0; i < runs; i++) {
            long nth = nth_call(i, calls, cap);
            char label[96];
            snprintf(label, sizeof(label), "client %s call %ld of %ld failed", fault_name(fn), nth,
                     calls);
            memset(&o, 0, sizeof(o));
            fault_arm(fn, nth);
            scenario(d.sock, seed + (uint64_t)i, &o);
            hits += fault_hit();
            fault_arm(fn, 0);
            if (o.lost != 0 || o.wrong != 0)
                fail_msg("%s: %d requests lost, %d wrong outputs", label, o.lost, o.wrong);
            check_serving(d.sock, seed + (uint64_t)i, label);
            check_no_leaks(fds, maps, label);
            /* The daemon closes check_serving's connection on its own time. */
            int now;
            for (int tries = 0; (now = count_fds_of(d.pid)) != daemon_fds && tries < 500; tries++)
                usleep(10000);
            if (now != daemon_fds)
                fail_msg("%s: the daemon holds %d descriptors, %d before", label, now, daemon_fds);
        }
        fprintf(stderr, "fault: %-15s %5ld calls in the client scenario, %3ld runs, %3d hit\n",
                fault_name(fn), calls, runs, hits);
        total_runs += (int)runs;
        total_hits += hits;
    }
    proc_stop(&d);
    fprintf(stderr, "fault: client: %d runs, %d faults injected\n", total_runs, total_hits);
    assert_true(total_hits > 0);
}

int main(void)
{
    fault_exempt_self(true);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_faults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
