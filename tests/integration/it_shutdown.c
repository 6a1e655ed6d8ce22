/*
 * SIGTERM while requests are queued: every request in flight gets its completion, either done
 * (output checked against the reference) or failed with ESHUTDOWN, before the daemon closes the
 * connections; then it exits 0. Once with the default drain timeout, once with no drain time at
 * all, where queued work must be failed rather than dropped.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static struct it_daemon daemon_;

static int teardown(void **state)
{
    (void)state;
    it_daemon_kill(&daemon_);
    return 0;
}

/* Queues heavy work and many small checked requests, sends SIGTERM, and collects everything.
 * Returns how many requests failed with ESHUTDOWN. */
static unsigned sigterm_with_queue(const char *const *extra, int signals)
{
    it_daemon_start(&daemon_, extra);
    convd_client *c = it_connect(&daemon_, "it-drain");
    convd_client *idle = it_connect(&daemon_, "it-idle");

    enum { HEAVY = 3, SMALL = 120 };
    struct convd_problem heavy;
    it_heavy_problem(&heavy);
    convd_region *rh = NULL, *rs = NULL;
    assert_int_equal(convd_region_create(c, it_case_span(&heavy), &rh), 0);
    struct it_case hc;
    it_case_init(&hc, rh, 0, &heavy, NULL);

    struct convd_problem probs[SMALL];
    struct it_case cases[SMALL];
    uint64_t total = 0;
    for (int i = 0; i < SMALL; i++) {
        tu_random_problem(it_rng(), &probs[i], 0, 0, 4);
        total += it_case_span(&probs[i]);
    }
    assert_int_equal(convd_region_create(c, total, &rs), 0);
    uint64_t off = 0;
    for (int i = 0; i < SMALL; i++) {
        it_case_init(&cases[i], rs, off, &probs[i], it_rng());
        off += cases[i].span;
    }

    uint64_t hid[HEAVY], sid[SMALL];
    struct convd_conv_args a;
    it_case_args(&hc, &a);
    for (int i = 0; i < HEAVY; i++)
        assert_int_equal(convd_conv_submit(c, &a, &hid[i]), 0);
    for (int i = 0; i < SMALL; i++) {
        it_case_args(&cases[i], &a);
        a.priority = 3;
        assert_int_equal(convd_conv_submit(c, &a, &sid[i]), 0);
    }
    /* A status round trip on the same connection: the daemon has read every request above. */
    struct convd_status st;
    assert_int_equal(convd_status_get(c, &st), 0);
    assert_true(st.inflight >= 1);
    for (int i = 0; i < signals; i++)
        assert_int_equal(kill(daemon_.pid, SIGTERM), 0);

    unsigned ok = 0, shut = 0;
    for (int i = 0; i < HEAVY + SMALL; i++) {
        uint64_t id = i < HEAVY ? hid[i] : sid[i - HEAVY];
        struct convd_completion done;
        int rc = convd_wait(c, id, TU_TIMEOUT_MS, &done);
        if (rc != 0)
            fail_msg("request %d: no completion after SIGTERM: %s (%s)", i, convd_status_name(rc),
                     convd_errstr(c));
        if (done.status == 0) {
            ok++;
            if (i >= HEAVY)
                it_case_check(&cases[i - HEAVY]);
        } else if (done.status == CONVD_ESHUTDOWN) {
            shut++;
            assert_true(strlen(done.error) >= 8);
        } else {
            fail_msg("request %d: %s (%s), want OK or ESHUTDOWN", i, convd_status_name(done.status),
                     done.error);
        }
    }
    print_message("after SIGTERM: %u completed, %u failed with ESHUTDOWN\n", ok, shut);
    assert_int_equal(convd_inflight(c), 0);
    for (int i = 0; i < SMALL; i++)
        it_case_fini(&cases[i]);

    it_daemon_wait_exit(&daemon_);
    /* The daemon is gone: both clients see the connection closed. */
    assert_int_equal(convd_ping(c, NULL), CONVD_ECLOSED);
    assert_int_equal(convd_ping(idle, NULL), CONVD_ECLOSED);
    convd_region_free(rh);
    convd_region_free(rs);
    convd_close(c);
    convd_close(idle);
    return shut;
}

static void test_sigterm_drains_queue(void **state)
{
    (void)state;
    sigterm_with_queue(NULL, 1);
}

static void test_sigterm_without_drain_time_fails_queued_work(void **state)
{
    (void)state;
    const char *const extra[] = {"--drain-timeout-ms", "0", NULL};
    unsigned shut = sigterm_with_queue(extra, 1);
    /* Heavy work was running when the signal came, so small requests were still queued, and
     * with no time to drain they must have been failed, not run. */
    assert_true(shut >= 1);
}

/* A second SIGTERM fails queued work at once; everything still gets its completion. */
static void test_second_sigterm(void **state)
{
    (void)state;
    sigterm_with_queue(NULL, 2);
}

/* SIGINT (Ctrl-C) drains like SIGTERM: exit 0, and a connected client sees the close. */
static void test_sigint(void **state)
{
    (void)state;
    it_daemon_start(&daemon_, NULL);
    convd_client *c = it_connect(&daemon_, "it-ctrl-c");
    it_one_conv(c, it_rng());
    assert_int_equal(kill(daemon_.pid, SIGINT), 0);
    it_daemon_wait_exit(&daemon_);
    assert_int_equal(convd_ping(c, NULL), CONVD_ECLOSED);
    convd_close(c);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_sigterm_drains_queue, teardown),
        cmocka_unit_test_teardown(test_sigterm_without_drain_time_fails_queued_work, teardown),
        cmocka_unit_test_teardown(test_second_sigterm, teardown),
        cmocka_unit_test_teardown(test_sigint, teardown),
    };
    return cmocka_run_group_tests_name("integration: shutdown", tests, NULL, NULL);
}
