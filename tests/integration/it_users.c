/*
 * Limits per user (peer uid), against a real daemon: one user's connections and requests in
 * flight are capped so that another user still gets in and gets served, and a full daemon makes
 * room by closing a client that has sat idle. The other user is `nobody` (uid 65534) in forked
 * children, so these tests need root and are skipped without it.
 *
 * The daemon runs with max_clients 4, max_clients_per_user 3, max_inflight and
 * max_inflight_per_user 8, idle_timeout_ms 300, max_mapped_bytes_per_user 48M and
 * max_pinned_bytes 200M; the monitor connection is the first of root's three.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define OTHER_UID ((uid_t)65534)

static struct it_daemon daemon_;

static int group_setup(void **state)
{
    (void)state;
    static const char *const extra[] = {
        "--max-clients",
        "4",
        "--max-clients-per-user",
        "3",
        "--max-inflight",
        "8",
        "--max-inflight-per-user",
        "8",
        "--idle-timeout-ms",
        "300",
        "--max-mapped-bytes-per-user",
        "48M",
        "--max-pinned-bytes",
        "200M",
        "--socket-mode",
        "0666",
        NULL,
    };
    it_daemon_start(&daemon_, extra);
    /* The other user must reach the socket inside the test's private directory. */
    assert_int_equal(chmod(daemon_.dir, 0755), 0);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    it_daemon_kill(&daemon_);
    return 0;
}

static void need_root(void)
{
    if (geteuid() != 0) {
        print_message("not root: the other user cannot be simulated; skipped\n");
        skip();
    }
}

static bool become_other_user(void)
{
    return setgroups(0, NULL) == 0 && setgid(OTHER_UID) == 0 && setuid(OTHER_UID) == 0;
}

/* A child of the other user. mode 'h': connect and hold the connection until `ctl` closes.
 * mode 'c': connect and run one checked convolution at priority 0. Writes 'r' on `ready` once
 * connected ('e' on failure); exits 0 when everything went as it should. */
static int other_user_main(char mode, int ready, int ctl)
{
    char ok = 'e';
    int rc = 1;
    convd_client *c = NULL;
    if (!become_other_user()) {
        fprintf(stderr, "other user: cannot become uid %u\n", (unsigned)OTHER_UID);
        goto out;
    }
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = daemon_.sock;
    o.client_name = mode == 'h' ? "it-other-hold" : "it-other-conv";
    if (convd_connect(&o, &c) != 0) {
        fprintf(stderr, "other user: connect: %s\n", convd_last_connect_error());
        goto out;
    }
    ok = 'r';
    if (write(ready, &ok, 1) != 1)
        goto out;
    if (mode == 'h') {
        char b;
        while (read(ctl, &b, 1) < 0 && errno == EINTR)
            ;
        rc = 0;
        goto out;
    }
    struct tu_rng g;
    tu_rng_init(&g, 12345);
    struct convd_problem p;
    convd_problem_init(&p, 1, 6, 6, 4, 4, 3, 3, 2);
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
    convd_region *r = NULL;
    if (convd_region_create(c, it_case_span(&p), &r) != 0) {
        fprintf(stderr, "other user: region: %s\n", convd_errstr(c));
        goto out;
    }
    struct it_case t;
    it_case_init(&t, r, 0, &p, &g);
    struct convd_conv_args a;
    it_case_args(&t, &a);
    a.priority = 0;
    uint64_t id;
    struct convd_completion done;
    if (convd_conv_submit(c, &a, &id) != 0 || convd_wait(c, id, TU_TIMEOUT_MS, &done) != 0) {
        fprintf(stderr, "other user: request: %s\n", convd_errstr(c));
    } else if (done.status != 0) {
        fprintf(stderr, "other user: request failed: %s: %s\n", convd_status_name(done.status),
                done.error);
    } else {
        char why[256];
        if (it_case_ok(&t, why, sizeof(why)))
            rc = 0;
        else
            fprintf(stderr, "other user: wrong result: %s\n", why);
    }
    it_case_fini(&t);
    convd_region_free(r);
out:
    if (ok != 'r')
        (void)!write(ready, &ok, 1);
    convd_close(c);
    return rc;
}

struct other {
    pid_t pid;
    int ctl; /* closing it releases a holding child */
};

/* Starts a child of the other user and waits until it is connected (asserts it could). */
static struct other other_start(char mode)
{
    int ready[2], ctl[2];
    assert_int_equal(pipe2(ready, O_CLOEXEC), 0);
    assert_int_equal(pipe2(ctl, O_CLOEXEC), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(ready[0]);
        close(ctl[1]);
        _exit(other_user_main(mode, ready[1], ctl[0]));
    }
    close(ready[1]);
    close(ctl[0]);
    struct pollfd pfd = {.fd = ready[0], .events = POLLIN};
    char b = 0;
    if (poll(&pfd, 1, TU_TIMEOUT_MS) != 1 || read(ready[0], &b, 1) != 1 || b != 'r')
        fail_msg("the other user's client could not connect");
    close(ready[0]);
    return (struct other){pid, ctl[1]};
}

/* Releases the child and asserts it exited 0. */
static void other_finish(struct other *o)
{
    close(o->ctl);
    int st = it_wait_child(o->pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("the other user's client failed (wait status 0x%x)", st);
}

/* One user holds at most max_clients_per_user connections; a full daemon closes the client idle
 * longest to admit another. */
static void test_connections_per_user_and_idle_eviction(void **state)
{
    (void)state;
    need_root();
    /* root: the monitor plus two more, its limit of three. */
    convd_client *a = it_connect(&daemon_, "it-root-a");
    convd_client *b = it_connect(&daemon_, "it-root-b");
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = daemon_.sock;
    convd_client *c = NULL;
    assert_int_equal(convd_connect(&o, &c), CONVD_ELIMIT);
    if (strstr(convd_last_connect_error(), "max_clients_per_user") == NULL)
        fail_msg("refusal does not name the per-user limit: %s", convd_last_connect_error());

    /* The other user takes the fourth and last slot. */
    struct other hold = other_start('h');

    /* Full: a newcomer gets in once a client has been idle past idle_timeout_ms, and it is the
     * one idle longest (a, connected first; the monitor was just used). */
    tu_sleep_ms(450);
    assert_int_equal(convd_ping(daemon_.mon, NULL), 0);
    assert_int_equal(convd_ping(b, NULL), 0);
    struct other conv = other_start('c');
    other_finish(&conv);
    int rc = convd_ping(a, NULL);
    if (rc == 0)
        fail_msg("the idle client was not closed to admit the newcomer");
    if (strstr(convd_errstr(a), "idle_timeout_ms") == NULL)
        fail_msg("the idle client was told \"%s\", which does not name idle_timeout_ms",
                 convd_errstr(a));
    assert_int_equal(convd_ping(b, NULL), 0);

    convd_close(a);
    convd_close(b);
    other_finish(&hold);
}

/* One user's requests in flight, over all its connections, stop at max_inflight_per_user; the
 * other user's request is still queued and served first (priority 0). */
static void test_inflight_share_per_user(void **state)
{
    (void)state;
    need_root();
    convd_client *h = it_connect(&daemon_, "it-root-heavy");
    struct convd_problem heavy;
    it_heavy_problem(&heavy);
    struct convd_problem_sizes z;
    assert_int_equal(convd_problem_sizes(&heavy, &z, NULL, 0), 0);
    convd_region *hr = NULL;
    assert_int_equal(convd_region_create(h, it_case_span(&heavy), &hr), 0);
    struct it_case ht;
    it_case_init(&ht, hr, 0, &heavy, NULL);
    struct convd_conv_args ha;
    it_case_args(&ht, &ha);
    ha.priority = 3;
    /* Eight at once may write the same output: nobody reads it, and the connection closes
     * before they would all have run. */
    for (int i = 0; i < 8; i++) {
        uint64_t id;
        assert_int_equal(convd_conv_submit(h, &ha, &id), 0);
    }

    /* Root's ninth request, on another connection: refused with the per-user share. */
    convd_client *j = it_connect(&daemon_, "it-root-ninth");
    convd_region *jr = NULL;
    struct convd_problem small;
    convd_problem_init(&small, 1, 4, 4, 2, 2, 1, 1, 1);
    assert_int_equal(convd_region_create(j, it_case_span(&small), &jr), 0);
    struct it_case jt;
    it_case_init(&jt, jr, 0, &small, it_rng());
    struct convd_conv_args ja;
    it_case_args(&jt, &ja);
    uint64_t id;
    assert_int_equal(convd_conv_submit(j, &ja, &id), 0);
    struct convd_completion done;
    assert_int_equal(convd_wait(j, id, TU_TIMEOUT_MS, &done), 0);
    assert_int_equal(done.status, CONVD_ELIMIT);
    if (strstr(done.error, "max_inflight_per_user") == NULL)
        fail_msg("refusal does not name the per-user share: %s", done.error);

    /* The other user is served while root's eight are still queued or running. */
    struct other conv = other_start('c');
    other_finish(&conv);

    it_case_fini(&jt);
    convd_region_free(jr);
    convd_close(j);
    it_case_fini(&ht);
    convd_close(h); /* cancels what is still queued */
}

/* Region bytes are charged to the user over all its connections; another user has its own
 * account. The daemon-wide cap on host memory is the configured one. */
static void test_mapped_bytes_per_user(void **state)
{
    (void)state;
    need_root();
    double cap = 0;
    assert_true(it_metric(daemon_.mon, "convd_host_region_bytes_limit", &cap));
    assert_true(cap == 200.0 * 1024 * 1024);
    /* The heavy request of the test before may still be running, its region still charged. */
    uint64_t until = tu_now_ms() + TU_TIMEOUT_MS;
    double regions = -1;
    while (it_metric(daemon_.mon, "convd_regions", &regions) && regions != 0 && tu_now_ms() < until)
        tu_sleep_ms(20);
    assert_true(regions == 0);
    convd_client *a = it_connect(&daemon_, "it-root-bytes-a");
    convd_client *b = it_connect(&daemon_, "it-root-bytes-b");
    convd_region *ra = NULL, *rb = NULL;
    if (convd_region_create(a, (size_t)32 << 20, &ra) != 0)
        fail_msg("32M on the first connection: %s", convd_errstr(a));
    /* 32M + 20M > 48M: refused on the second connection, although each is far under its own
     * max_mapped_bytes. */
    assert_int_equal(convd_region_create(b, (size_t)20 << 20, &rb), CONVD_ELIMIT);
    if (strstr(convd_errstr(b), "max_mapped_bytes_per_user") == NULL)
        fail_msg("refusal does not name the per-user limit: %s", convd_errstr(b));
    double host = 0;
    assert_true(it_metric(daemon_.mon, "convd_host_region_bytes", &host));
    assert_true(host >= 32.0 * 1024 * 1024);

    /* The other user registers and is served meanwhile. */
    struct other conv = other_start('c');
    other_finish(&conv);

    /* Released bytes are the user's again. */
    assert_int_equal(convd_region_free(ra), 0);
    if (convd_region_create(b, (size_t)20 << 20, &rb) != 0)
        fail_msg("20M after the 32M were freed: %s", convd_errstr(b));
    assert_int_equal(convd_region_free(rb), 0);
    convd_close(a);
    convd_close(b);
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
        cmocka_unit_test(test_connections_per_user_and_idle_eviction),
        cmocka_unit_test(test_inflight_share_per_user),
        cmocka_unit_test(test_mapped_bytes_per_user),
        cmocka_unit_test(test_zz_no_leaks_and_clean_exit),
    };
    return cmocka_run_group_tests_name("integration: limits per user", tests, group_setup,
                                       group_teardown);
}
