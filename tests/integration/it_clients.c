/*
 * Many clients and badly behaved ones, against a real daemon: 64 processes connected at once,
 * each pipelining checked convolutions; a client killed with SIGKILL while its requests are in
 * flight; clients that close without unregistering anything; a client that never reads its
 * completions. After each, the daemon must release everything the client held and keep serving
 * the others.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "mix.h"
#include "raw.h"

static struct it_daemon daemon_;

static int group_setup(void **state)
{
    (void)state;
    it_daemon_start(&daemon_, NULL);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    it_daemon_kill(&daemon_);
    return 0;
}

/* Reads one byte, waiting up to TU_TIMEOUT_MS. Returns 1, 0 on EOF, -1 on timeout. */
static int read_byte(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n;
    do
        n = poll(&p, 1, TU_TIMEOUT_MS);
    while (n < 0 && errno == EINTR);
    if (n <= 0)
        return -1;
    char b;
    ssize_t r;
    do
        r = read(fd, &b, 1);
    while (r < 0 && errno == EINTR);
    return r == 1 ? 1 : 0;
}

static convd_client *child_connect(const char *sock, const char *name)
{
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = sock;
    o.client_name = name;
    o.timeout_ms = TU_TIMEOUT_MS;
    convd_client *c = NULL;
    if (convd_connect(&o, &c) != 0) {
        fprintf(stderr, "%s: connect: %s\n", name, convd_last_connect_error());
        return NULL;
    }
    return c;
}

/* One of the 64: connect, say so, wait for the start signal, then two rounds of pipelined
 * requests, every output checked. Runs in a forked child: no cmocka asserts here. */
static int many_child(const char *sock, uint64_t seed, int ready_fd, int go_fd)
{
    char name[32];
    snprintf(name, sizeof(name), "it-many-%d", (int)getpid());
    convd_client *c = child_connect(sock, name);
    if (c == NULL)
        return 2;
    if (write(ready_fd, "r", 1) != 1)
        return 3;
    if (read_byte(go_fd) != 0) /* EOF is the start signal */
        return 4;
    struct tu_rng g;
    tu_rng_init(&g, seed);
    enum { PER_ROUND = 12 };
    int ret = 0;
    for (int round = 0; round < 2 && ret == 0; round++) {
        struct convd_problem probs[PER_ROUND];
        struct it_case cases[PER_ROUND];
        uint64_t ids[PER_ROUND], total = 0;
        for (int i = 0; i < PER_ROUND; i++) {
            tu_random_problem(&g, &probs[i], 0, 0, 4);
            total += it_case_span(&probs[i]);
        }
        convd_region *r = NULL;
        if (convd_region_create(c, total, &r) != 0) {
            fprintf(stderr, "%s: region_create: %s\n", name, convd_errstr(c));
            ret = 5;
            break;
        }
        uint64_t off = 0;
        for (int i = 0; i < PER_ROUND; i++) {
            it_case_init(&cases[i], r, off, &probs[i], &g);
            off += cases[i].span;
        }
        int submitted = 0;
        for (int i = 0; i < PER_ROUND; i++) {
            struct convd_conv_args a;
            it_case_args(&cases[i], &a);
            int rc = convd_conv_submit(c, &a, &ids[i]);
            if (rc != 0) {
                fprintf(stderr, "%s: submit: %s: %s\n", name, convd_status_name(rc),
                        convd_errstr(c));
                ret = 6;
                break;
            }
            submitted++;
        }
        for (int k = 0; k < submitted; k++) {
            struct convd_completion done;
            int rc = convd_wait_any(c, TU_TIMEOUT_MS, &done);
            if (rc != 0) {
                fprintf(stderr, "%s: wait_any: %s: %s\n", name, convd_status_name(rc),
                        convd_errstr(c));
                ret = 7;
                break;
            }
            if (done.status != 0) {
                fprintf(stderr, "%s: request failed: %s: %s\n", name,
                        convd_status_name(done.status), done.error);
                ret = 8;
            }
        }
        for (int i = 0; i < PER_ROUND; i++) {
            char why[320];
            if (ret == 0 && !it_case_ok(&cases[i], why, sizeof(why))) {
                fprintf(stderr, "%s: wrong output: %s\n", name, why);
                ret = 9;
            }
            it_case_fini(&cases[i]);
        }
        if (convd_region_free(r) != 0 && ret == 0)
            ret = 10;
    }
    convd_close(c);
    return ret;
}

static void test_64_clients_at_once(void **state)
{
    (void)state;
    enum { CLIENTS = 64 };
    int ready[2], go[2];
    assert_int_equal(pipe2(ready, O_CLOEXEC), 0);
    assert_int_equal(pipe2(go, O_CLOEXEC), 0);
    pid_t pids[CLIENTS];
    uint64_t seed = tu_rng_next(it_rng());
    fflush(NULL);
    for (int i = 0; i < CLIENTS; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            close(ready[0]);
            close(go[1]);
            _exit(
                many_child(daemon_.sock, seed + MIX_GOLDEN64 * (uint64_t)(i + 1), ready[1], go[0]));
        }
    }
    close(ready[1]);
    close(go[0]);
    /* All 64 connected before any starts: they really are served at the same time. */
    int connected = 0;
    while (connected < CLIENTS && read_byte(ready[0]) == 1)
        connected++;
    struct convd_status st;
    assert_int_equal(convd_status_get(daemon_.mon, &st), 0);
    close(go[1]);
    int failed = 0;
    for (int i = 0; i < CLIENTS; i++) {
        int ws = it_wait_child(pids[i]);
        if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
            print_error("client %d (pid %d) failed: wait status 0x%x\n", i, (int)pids[i], ws);
            failed++;
        }
    }
    close(ready[0]);
    assert_int_equal(connected, CLIENTS);
    assert_true(st.clients >= CLIENTS + 1);
    assert_int_equal(failed, 0);
    it_daemon_check_clean(&daemon_);
}

/* A client with regions and queued work is killed: the daemon finishes or cancels its work,
 * then releases its regions and descriptors, and serves everyone else meanwhile. */
static void test_sigkill_with_requests_in_flight(void **state)
{
    (void)state;
    int ready[2];
    assert_int_equal(pipe2(ready, O_CLOEXEC), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(ready[0]);
        convd_client *c = child_connect(daemon_.sock, "it-victim");
        if (c == NULL)
            _exit(2);
        struct convd_problem heavy;
        it_heavy_problem(&heavy);
        convd_region *r = NULL, *r2 = NULL;
        if (convd_region_create(c, it_case_span(&heavy), &r) != 0 ||
            convd_region_create(c, 1 << 20, &r2) != 0)
            _exit(3);
        struct tu_rng g;
        tu_rng_init(&g, 42);
        struct it_case t;
        it_case_init(&t, r, 0, &heavy, NULL);
        struct convd_conv_args a;
        it_case_args(&t, &a);
        uint64_t id;
        for (int i = 0; i < 3; i++)
            if (convd_conv_submit(c, &a, &id) != 0)
                _exit(4);
        struct convd_problem small;
        convd_problem_init(&small, 1, 8, 8, 8, 8, 3, 3, 2);
        struct it_case s;
        it_case_init(&s, r2, 0, &small, &g);
        it_case_args(&s, &a);
        for (int i = 0; i < 50; i++)
            if (convd_conv_submit(c, &a, &id) != 0)
                _exit(5);
        if (write(ready[1], "r", 1) != 1)
            _exit(6);
        for (;;)
            pause();
    }
    close(ready[1]);
    int got = read_byte(ready[0]);
    close(ready[0]);
    struct convd_status st;
    assert_int_equal(convd_status_get(daemon_.mon, &st), 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    int ws = it_wait_child(pid);
    assert_int_equal(got, 1);
    assert_true(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);
    assert_true(st.clients >= 2);
    /* Others are served while the victim's work drains. */
    convd_client *c = it_connect(&daemon_, "it-bystander");
    it_one_conv(c, it_rng());
    convd_close(c);
    it_daemon_check_clean(&daemon_);
}

/* Raw clients that register regions, submit, and close the socket without unregistering
 * anything; then a library client that closes with requests in flight. */
/* A small random convolution laid out in a region of its own, with its arguments. */
static void random_case(convd_client *c, convd_region **r, struct it_case *t,
                        struct convd_conv_args *a)
{
    struct convd_problem q;
    tu_random_problem(it_rng(), &q, 0, 0, 8);
    assert_int_equal(convd_region_create(c, it_case_span(&q), r), 0);
    it_case_init(t, *r, 0, &q, it_rng());
    it_case_args(t, a);
}

static void test_close_without_unregistering(void **state)
{
    (void)state;
    struct convd_problem p;
    convd_problem_init(&p, 1, 12, 12, 16, 16, 3, 3, 4);
    for (int k = 0; k < 5; k++) {
        int fd = raw_connect(daemon_.sock);
        raw_hello(fd);
        struct raw_conv rc;
        uint64_t need = raw_conv_init(&rc, 7, &p, 1);
        for (uint64_t id = 1; id <= 3; id++) {
            int mfd = tu_memfd("convd-it", need, F_SEAL_SHRINK | F_SEAL_GROW);
            char why[256];
            int st = raw_register(fd, id, need, &mfd, 1, why, sizeof(why));
            close(mfd);
            if (st != 0)
                fail_msg("register: %s: %s", convd_status_name(st), why);
        }
        /* k = 0: close with nothing in flight; otherwise with k requests in flight. */
        for (int i = 0; i < k; i++) {
            rc.req.id = 100 + (uint64_t)i;
            raw_conv_send(fd, &rc);
        }
        close(fd);
    }
    convd_client *c = it_connect(&daemon_, "it-abandon");
    convd_region *r = NULL;
    struct it_case t;
    struct convd_conv_args a;
    random_case(c, &r, &t, &a);
    for (int i = 0; i < 20; i++) {
        uint64_t id;
        assert_int_equal(convd_conv_submit(c, &a, &id), 0);
    }
    it_case_fini(&t);
    convd_close(c);
    it_daemon_check_clean(&daemon_);
}

/* Takes c's next completion by polling, as a caller with its own schedule does: never sleeping
 * on the socket. */
static void poll_completion(convd_client *c, uint64_t id, struct convd_completion *done)
{
    const uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
    for (;;) {
        assert_int_equal(convd_client_process(c), 0);
        int rc = convd_poll(c, done);
        if (rc == 0)
            break;
        assert_int_equal(rc, CONVD_EAGAIN);
        if (tu_now_ms() > end)
            fail_msg("request %llu: no completion within %d ms", (unsigned long long)id,
                     TU_TIMEOUT_MS);
        tu_sleep_ms(1);
    }
    assert_true(done->id == id);
    if (done->status != 0)
        fail_msg("request %llu: %s: %s", (unsigned long long)id, convd_status_name(done->status),
                 done->error);
}

static bool fd_readable(int fd, int ms)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    return poll(&pf, 1, ms) > 0;
}

/* With its doorbells off (convd_client_doorbells) a client's completions wait in its ring: the
 * daemon sends no doorbell, the descriptor stays quiet and convd_client_process() takes them; a
 * blocking wait still sleeps on the socket and is woken. Back on, a completion makes the
 * descriptor readable again. */
static void test_doorbells_off(void **state)
{
    (void)state;
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = daemon_.sock;
    o.client_name = "it-doorbells";
    o.timeout_ms = TU_TIMEOUT_MS;
    o.use_rings = 1;
    o.spin_us = 0; /* a wait sleeps on the socket at once: only a doorbell can end it */
    convd_client *c = NULL;
    assert_int_equal(convd_connect(&o, &c), 0);
    convd_region *r = NULL;
    struct it_case t;
    struct convd_conv_args a;
    random_case(c, &r, &t, &a);
    const int fd = convd_client_fd(c);
    assert_int_equal(convd_client_doorbells(NULL, 0), CONVD_EINVAL);
    assert_int_equal(convd_client_doorbells(c, 0), 1);
    assert_int_equal(convd_client_doorbells(c, 0), 0);
    double bells0 = 0, bells1 = 0;
    assert_true(it_metric(daemon_.mon, "convd_doorbells_total", &bells0));
    struct convd_completion done;
    uint64_t id;
    for (int i = 0; i < 3; i++) {
        it_case_refresh(&t, it_rng());
        assert_int_equal(convd_conv_submit(c, &a, &id), 0);
        poll_completion(c, id, &done);
        it_case_check(&t);
    }
    tu_sleep_ms(20); /* a doorbell would be on its way by now */
    assert_false(fd_readable(fd, 0));
    assert_true(it_metric(daemon_.mon, "convd_doorbells_total", &bells1));
    if (bells1 != bells0)
        fail_msg("the daemon rang %.0f doorbell(s) to a client that turned them off",
                 bells1 - bells0);
    /* A blocking wait asks for its doorbell, whatever the setting. */
    it_case_refresh(&t, it_rng());
    assert_int_equal(convd_conv_submit(c, &a, &id), 0);
    assert_int_equal(convd_wait(c, id, TU_TIMEOUT_MS, &done), 0);
    assert_int_equal(done.status, 0);
    it_case_check(&t);
    /* Back on: the next completion announces itself on the descriptor. */
    assert_int_equal(convd_client_doorbells(c, 1), 0);
    it_case_refresh(&t, it_rng());
    assert_int_equal(convd_conv_submit(c, &a, &id), 0);
    if (!fd_readable(fd, TU_TIMEOUT_MS))
        fail_msg("doorbells on again, and the descriptor stayed quiet");
    poll_completion(c, id, &done);
    it_case_check(&t);
    it_case_fini(&t);
    assert_int_equal(convd_region_free(r), 0);
    convd_close(c);
}

/* A client that sends requests and never reads a single completion: its replies pile up, but
 * the daemon goes on serving others, and releases everything when the client finally closes. */
static void test_client_never_reads(void **state)
{
    (void)state;
    int fd = raw_connect(daemon_.sock);
    uint32_t max_inflight = raw_hello(fd);
    struct convd_problem p;
    convd_problem_init(&p, 1, 6, 6, 4, 4, 3, 3, 1);
    struct raw_conv rc;
    uint64_t need = raw_conv_init(&rc, 1, &p, 1);
    int mfd = tu_memfd("convd-it", need, F_SEAL_SHRINK | F_SEAL_GROW);
    char why[256];
    int st = raw_register(fd, 1, need, &mfd, 1, why, sizeof(why));
    close(mfd);
    if (st != 0)
        fail_msg("register: %s: %s", convd_status_name(st), why);

    int fl = fcntl(fd, F_GETFL);
    assert_int_equal(fcntl(fd, F_SETFL, fl | O_NONBLOCK), 0);
    static uint8_t buf[1024];
    uint64_t sent = 0, target = 8u * max_inflight + 2000u;
    int stalls = 0;
    for (uint64_t id = 1; id <= target && stalls < 50; id++) {
        rc.req.id = id;
        size_t len = convd__client_message__pack(&rc.msg, buf);
        int r = raw_send_bytes_fds(fd, buf, len, NULL, 0);
        if (r == -EAGAIN) {
            /* The daemon stopped reading us for now (allowed); try a little later. */
            stalls++;
            id--;
            tu_sleep_ms(20);
            continue;
        }
        if (r == -EPIPE || r == -ECONNRESET)
            break; /* the daemon dropped us for not reading (allowed too) */
        assert_int_equal(r, 0);
        sent++;
    }
    print_message("sent %llu requests without reading a reply\n", (unsigned long long)sent);
    assert_true(sent > 0);

    /* Everyone else is still served. */
    convd_client *c = it_connect(&daemon_, "it-polite");
    for (int i = 0; i < 3; i++)
        it_one_conv(c, it_rng());
    assert_int_equal(convd_ping(daemon_.mon, NULL), 0);
    convd_close(c);
    close(fd);
    it_daemon_check_clean(&daemon_);
}

/* A daemon limited to three connections: the fourth is refused with ELIMIT and a sentence, and
 * admitted once another leaves. */
static void test_max_clients(void **state)
{
    (void)state;
    struct it_daemon d;
    const char *const extra[] = {"--max-clients", "3", NULL};
    it_daemon_start(&d, extra); /* its monitor is the first connection */
    convd_client *a = it_connect(&d, "it-a");
    convd_client *b = it_connect(&d, "it-b");
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = d.sock;
    o.timeout_ms = TU_TIMEOUT_MS;
    convd_client *extra_client = NULL;
    int rc = convd_connect(&o, &extra_client);
    if (rc != CONVD_ELIMIT)
        fail_msg("fourth connection: %s (%s), want ELIMIT", convd_status_name(rc),
                 convd_last_connect_error());
    assert_null(extra_client);
    assert_true(strlen(convd_last_connect_error()) >= 8);
    convd_close(a);
    /* The daemon notices the close asynchronously: retry until it admits the newcomer. */
    uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
    while ((rc = convd_connect(&o, &extra_client)) == CONVD_ELIMIT && tu_now_ms() < end)
        tu_sleep_ms(20);
    assert_int_equal(rc, 0);
    it_one_conv(extra_client, it_rng());
    convd_close(extra_client);
    convd_close(b);
    it_daemon_check_clean(&d);
    it_daemon_stop(&d);
}

/* A connection that never sends Hello is closed after the hello timeout, and leaves nothing. */
/* CPU time (user + system, in clock ticks) of each of pid's threads named `name`; returns how
 * many were found, at most max. */
static int thread_ticks(pid_t pid, const char *name, long long *ticks, int max)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *dir = opendir(path);
    assert_non_null(dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL && n < max;) {
        if (e->d_name[0] == '.')
            continue;
        char file[300], comm[32] = "", stat[1024] = "";
        snprintf(file, sizeof file, "/proc/%d/task/%s/comm", (int)pid, e->d_name);
        FILE *f = fopen(file, "r");
        if (f == NULL)
            continue;
        if (fgets(comm, sizeof comm, f) == NULL)
            comm[0] = '\0';
        fclose(f);
        comm[strcspn(comm, "\n")] = '\0';
        if (strcmp(comm, name) != 0)
            continue;
        snprintf(file, sizeof file, "/proc/%d/task/%s/stat", (int)pid, e->d_name);
        f = fopen(file, "r");
        assert_non_null(f);
        assert_non_null(fgets(stat, sizeof stat, f));
        fclose(f);
        /* Fields after the command's closing parenthesis: state is the 3rd, utime the 14th. */
        const char *q = strrchr(stat, ')');
        assert_non_null(q);
        unsigned long long ut = 0, st = 0;
        assert_int_equal(
            sscanf(q + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st), 2);
        ticks[n++] = (long long)(ut + st);
    }
    closedir(dir);
    return n;
}

/* launch_spinners 1: of three launch threads, one spins on the empty queue and the others sleep
 * at once. With spin_us at its longest (1 s, counted from the threads' start), three spinners
 * (and the loop, which spins too) would each burn a share of the machine's CPUs over the
 * window; with the cap at most one thread gets any. */
static void test_launch_spinners(void **state)
{
    (void)state;
    const char *args[] = {"--backend",
                          "null",
                          "--launch-threads",
                          "3",
                          "--launch-spinners",
                          "1",
                          "--spin-us",
                          "1000000",
                          "--doorbell-threads",
                          "0",
                          NULL};
    struct it_daemon d;
    char why[256];
    if (it_daemon_spawn(&d, args, "it-spinners-monitor", why, sizeof why) != 0)
        fail_msg("%s", why);
    long long t0[8], t1[8];
    const int n0 = thread_ticks(d.pid, "convd-launch", t0, 8);
    tu_sleep_ms(300);
    const int n1 = thread_ticks(d.pid, "convd-launch", t1, 8);
    assert_int_equal(n0, 3);
    assert_int_equal(n1, 3);
    const long hz = sysconf(_SC_CLK_TCK);
    int busy = 0;
    for (int i = 0; i < 3; i++)
        if ((t1[i] - t0[i]) * 1000 / hz >= 30) /* ms of CPU in the 300 ms window */
            busy++;
    if (busy > 1)
        fail_msg("%d of 3 launch threads spun with launch_spinners 1", busy);
    it_daemon_stop(&d);
}

static void test_hello_timeout(void **state)
{
    (void)state;
    struct it_daemon d;
    const char *const extra[] = {"--hello-timeout-ms", "300", NULL};
    it_daemon_start(&d, extra);
    int fds[4];
    for (int i = 0; i < 4; i++)
        fds[i] = raw_connect(d.sock);
    for (int i = 0; i < 4; i++) {
        raw_expect_eof(fds[i]);
        close(fds[i]);
    }
    it_daemon_check_clean(&d);
    it_daemon_stop(&d);
}

static void test_zz_no_leaks_and_clean_exit(void **state)
{
    (void)state;
    it_daemon_check_clean(&daemon_);
    it_daemon_stop(&daemon_);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_64_clients_at_once),
        cmocka_unit_test(test_sigkill_with_requests_in_flight),
        cmocka_unit_test(test_close_without_unregistering),
        cmocka_unit_test(test_client_never_reads),
        cmocka_unit_test(test_doorbells_off),
        cmocka_unit_test(test_launch_spinners),
        cmocka_unit_test(test_max_clients),
        cmocka_unit_test(test_hello_timeout),
        cmocka_unit_test(test_zz_no_leaks_and_clean_exit),
    };
    return cmocka_run_group_tests_name("integration: clients", tests, group_setup, group_teardown);
}
