#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "wire.h"

#ifndef CONVD_DAEMON_PATH
#error "CONVD_DAEMON_PATH must name the convd binary under test"
#endif

/* The daemon under test: $CONVD_IT_DAEMON where set (tests/tsan/run.sh points it at a
 * ThreadSanitizer build), else this build's. */
static const char *it_daemon_path(void)
{
    const char *p = getenv("CONVD_IT_DAEMON");
    return p != NULL && *p != '\0' ? p : CONVD_DAEMON_PATH;
}

struct tu_rng *it_rng(void)
{
    static struct tu_rng g;
    static bool init;
    if (!init) {
        tu_rng_init(&g, tu_seed());
        init = true;
    }
    return &g;
}

int it_count_fds(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    if (dir == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(dir);
    return n;
}

long it_proc_kb(pid_t pid, const char *field)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    long kb = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, field, n) == 0 && line[n] == ':') {
            kb = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return kb;
}

static int it_count_maps(pid_t pid, bool rings)
{
    char path[64], line[512];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    int n = 0;
    while (fgets(line, sizeof(line), f) != NULL)
        if (strstr(line, "/memfd:") != NULL &&
            (strstr(line, "/memfd:" RAW_RING_MEMFD_NAME) != NULL) == rings)
            n++;
    fclose(f);
    return n;
}

int it_count_memfd_maps(pid_t pid)
{
    return it_count_maps(pid, false);
}

int it_count_ring_maps(pid_t pid)
{
    return it_count_maps(pid, true);
}

bool it_metric(convd_client *c, const char *name, double *ret)
{
    char *text = NULL;
    int rc = convd_metrics_get(c, &text);
    if (rc != 0) {
        print_error("convd_metrics_get: %s (%s)\n", convd_status_name(rc), convd_errstr(c));
        return false;
    }
    size_t len = strlen(name);
    bool found = false;
    for (char *line = text; line != NULL && *line != '\0';) {
        char *nl = strchr(line, '\n');
        if (line[0] != '#' && strncmp(line, name, len) == 0 &&
            (line[len] == ' ' || line[len] == '\t')) {
            *ret = strtod(line + len, NULL);
            found = true;
            break;
        }
        line = nl != NULL ? nl + 1 : NULL;
    }
    free(text);
    return found;
}

convd_client *it_connect_to(const char *sock, const char *name, int use_rings)
{
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = sock;
    o.client_name = name;
    o.timeout_ms = TU_TIMEOUT_MS;
    o.use_rings = use_rings;
    convd_client *c = NULL;
    int rc = convd_connect(&o, &c);
    if (rc != 0)
        fail_msg("convd_connect(%s): %s: %s", sock, convd_status_name(rc),
                 convd_last_connect_error());
    assert_non_null(c);
    return c;
}

convd_client *it_connect(const struct it_daemon *d, const char *name)
{
    return it_connect_to(d->sock, name, -1);
}

/* Polls waitpid until the child exits; SIGKILLs it after the timeout. Returns the wait status,
 * or -1 after a timeout. */
static int it_reap(pid_t pid, int timeout_ms)
{
    uint64_t end = tu_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        int st = 0;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return st;
        if (r < 0 && errno != EINTR)
            return -1;
        if (tu_now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        tu_sleep_ms(5);
    }
}

int it_wait_child(pid_t pid)
{
    int st = it_reap(pid, TU_TIMEOUT_MS);
    if (st == -1)
        fail_msg("child %d did not exit within %d ms", (int)pid, TU_TIMEOUT_MS);
    assert_true(WIFEXITED(st) || WIFSIGNALED(st));
    return st;
}

static void it_remove_dir(struct it_daemon *d)
{
    if (d->dir[0] == '\0')
        return;
    unlink(d->sock);
    rmdir(d->dir);
    d->dir[0] = '\0';
}

int it_daemon_spawn(struct it_daemon *d, const char *const *args, const char *monitor_name,
                    char *why, size_t why_len)
{
    memset(d, 0, sizeof(*d));
    d->stopped = true; /* until there is a process */
    snprintf(d->dir, sizeof(d->dir), "/tmp/convd-it-XXXXXX");
    if (mkdtemp(d->dir) == NULL) {
        snprintf(why, why_len, "mkdtemp: %s", strerror(errno));
        d->dir[0] = '\0';
        return -1;
    }
    snprintf(d->sock, sizeof(d->sock), "%s/convd.sock", d->dir);
    const char *path = it_daemon_path();
    const char *argv[32] = {path, "--socket", d->sock};
    size_t argc = 3;
    for (size_t i = 0; args != NULL && args[i] != NULL && argc < 31; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;

    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, why_len, "fork: %s", strerror(errno));
        it_remove_dir(d);
        return -1;
    }
    if (pid == 0) {
        /* The daemon dies with the test, even when a timeout kills the test. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execv(path, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", path, strerror(errno));
        _exit(127);
    }
    d->pid = pid;
    d->stopped = false;

    /* Poll connect until the daemon listens (a GPU backend warms its kernels up first); stop
     * early if it died. */
    uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = d->sock;
    o.client_name = monitor_name;
    o.timeout_ms = TU_TIMEOUT_MS;
    for (;;) {
        int st = 0;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            d->stopped = true;
            it_remove_dir(d);
            if (WIFEXITED(st))
                snprintf(why, why_len,
                         "convd exited with status %d during start-up (its log is above: "
                         "'cannot start: ...')",
                         WEXITSTATUS(st));
            else
                snprintf(why, why_len, "convd was killed by signal %d during start-up",
                         WIFSIGNALED(st) ? WTERMSIG(st) : 0);
            return -1;
        }
        int rc = convd_connect(&o, &d->mon);
        if (rc == 0)
            return 0;
        if (rc != CONVD_ECONNECT || tu_now_ms() > end) {
            snprintf(why, why_len, "cannot connect to convd at %s: %s: %s", d->sock,
                     convd_status_name(rc), convd_last_connect_error());
            it_daemon_kill(d);
            it_remove_dir(d);
            return -1;
        }
        tu_sleep_ms(20);
    }
}

void it_daemon_start(struct it_daemon *d, const char *const *extra)
{
    /* --log-level notice: hostile tests make the daemon warn a lot; warnings still show.
     * $CONVD_IT_THREADS overrides the thread count, to tell a backend problem from the rest. */
    const char *threads = getenv("CONVD_IT_THREADS");
    if (threads == NULL || *threads == '\0')
        threads = "2";
    const char *args[32] = {"--backend", "cpu", "--threads", threads, "--log-level", "notice"};
    size_t argc = 6;
    for (size_t i = 0; extra != NULL && extra[i] != NULL && argc < 31; i++)
        args[argc++] = extra[i];
    args[argc] = NULL;
    char why[256];
    if (it_daemon_spawn(d, args, "it-monitor", why, sizeof(why)) != 0)
        fail_msg("%s", why);

    struct convd_server_info info;
    convd_server_info(d->mon, &info);
    assert_string_equal(info.backend, "cpu");
    assert_int_equal(info.protocol_version, CONVD_PROTOCOL_VERSION);

    /* Warm up once (workers and lazily opened resources), then take the baseline. */
    it_one_conv(d->mon, it_rng());
    it_daemon_take_baseline(d);
}

void it_daemon_take_baseline(struct it_daemon *d)
{
    uint64_t wend = tu_now_ms() + TU_TIMEOUT_MS;
    double regions = -1;
    while ((!it_metric(d->mon, IT_METRIC_REGIONS, &regions) || regions != 0) && tu_now_ms() < wend)
        tu_sleep_ms(10);
    struct convd_status st;
    assert_int_equal(convd_status_get(d->mon, &st), 0);
    d->base_clients = st.clients;
    assert_int_equal(d->base_clients, 1);
    d->base_fds = it_count_fds(d->pid);
    assert_true(d->base_fds > 0);
    assert_int_equal(it_count_memfd_maps(d->pid), 0);
    /* The monitor's rings, when the library attached them. */
    d->base_ring_maps = it_count_ring_maps(d->pid);
    assert_true(d->base_ring_maps == 0 || d->base_ring_maps == 1);
}

void it_daemon_check_baseline(struct it_daemon *d)
{
    uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
    struct convd_status st = {0};
    double regions = -1, mapped = -1;
    int fds = -1, maps = -1, ring_maps = -1;
    bool have_regions = false, have_mapped = false;
    for (;;) {
        int rc = convd_status_get(d->mon, &st);
        if (rc != 0)
            fail_msg("daemon stopped answering status: %s (%s)", convd_status_name(rc),
                     convd_errstr(d->mon));
        have_regions = it_metric(d->mon, IT_METRIC_REGIONS, &regions);
        have_mapped = it_metric(d->mon, IT_METRIC_MAPPED_BYTES, &mapped);
        fds = it_count_fds(d->pid);
        maps = it_count_memfd_maps(d->pid);
        ring_maps = it_count_ring_maps(d->pid);
        if (st.clients == d->base_clients && st.inflight == 0 && have_regions && regions == 0 &&
            have_mapped && mapped == 0 && fds == d->base_fds && maps == 0 &&
            ring_maps == d->base_ring_maps)
            break;
        if (tu_now_ms() > end)
            break;
        tu_sleep_ms(20);
    }
    if (!have_regions || !have_mapped) {
        char *text = NULL;
        if (convd_metrics_get(d->mon, &text) == 0) {
            print_error("metrics:\n%s\n", text);
            free(text);
        }
    }
    assert_true(have_regions);
    assert_true(have_mapped);
    if (st.clients != d->base_clients || st.inflight != 0 || regions != 0 || mapped != 0 ||
        fds != d->base_fds || maps != 0 || ring_maps != d->base_ring_maps)
        fail_msg("daemon did not return to its baseline: clients %u (want %u), inflight %u, "
                 "regions %.0f, mapped bytes %.0f, fds %d (want %d), memfd maps %d, ring maps "
                 "%d (want %d)",
                 st.clients, d->base_clients, st.inflight, regions, mapped, fds, d->base_fds, maps,
                 ring_maps, d->base_ring_maps);
    uint64_t rtt = 0;
    assert_int_equal(convd_ping(d->mon, &rtt), 0);
}

void it_daemon_check_clean(struct it_daemon *d)
{
    it_daemon_check_baseline(d);
    it_one_conv(d->mon, it_rng());
}

void it_daemon_kill(struct it_daemon *d)
{
    if (d->mon != NULL) {
        convd_close(d->mon);
        d->mon = NULL;
    }
    if (!d->stopped && d->pid > 0) {
        kill(d->pid, SIGKILL);
        int st;
        waitpid(d->pid, &st, 0);
        d->stopped = true;
    }
    it_remove_dir(d);
}

void it_daemon_wait_exit(struct it_daemon *d)
{
    int st = it_reap(d->pid, TU_TIMEOUT_MS);
    d->stopped = true;
    if (d->mon != NULL) {
        convd_close(d->mon);
        d->mon = NULL;
    }
    it_remove_dir(d);
    if (st == -1)
        fail_msg("convd did not exit within %d ms of SIGTERM", TU_TIMEOUT_MS);
    if (WIFSIGNALED(st))
        fail_msg("convd was killed by signal %d after SIGTERM", WTERMSIG(st));
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) != 0)
        fail_msg("convd exited with status %d after SIGTERM (want 0)", WEXITSTATUS(st));
}

void it_daemon_stop(struct it_daemon *d)
{
    if (d->stopped)
        return;
    convd_close(d->mon);
    d->mon = NULL;
    assert_int_equal(kill(d->pid, SIGTERM), 0);
    it_daemon_wait_exit(d);
}

/*
 * Cases.
 */

static uint64_t it_align64(uint64_t v)
{
    return (v + 63u) & ~(uint64_t)63u;
}

uint64_t it_case_span(const struct convd_problem *p)
{
    struct convd_problem_sizes z;
    if (convd_problem_sizes(p, &z, NULL, 0) != 0)
        return 0;
    return it_align64(z.input_bytes) + it_align64(z.weight_bytes) +
           (p->has_bias ? it_align64(z.bias_bytes) : 0) + it_align64(z.output_bytes);
}

static void it_case_fill(struct it_case *t, struct tu_rng *g)
{
    uint8_t *base = convd_region_data(t->region);
    tu_fill_random(g, t->p.dtype, base + t->off_in, t->sz.input_elems);
    tu_fill_random(g, t->p.dtype, base + t->off_w, t->sz.weight_elems);
    if (t->p.has_bias)
        tu_fill_random(g, t->p.dtype, base + t->off_b, t->sz.bias_elems);
    tu_poison(base + t->off_out, t->sz.output_bytes);
    tu_ref_conv(&t->p, base + t->off_in, base + t->off_w, t->p.has_bias ? base + t->off_b : NULL,
                t->ref);
}

void it_case_init(struct it_case *t, convd_region *r, uint64_t base, const struct convd_problem *p,
                  struct tu_rng *g)
{
    memset(t, 0, sizeof(*t));
    t->p = *p;
    char why[160];
    if (convd_problem_sizes(p, &t->sz, why, sizeof(why)) != 0) {
        fprintf(stderr, "it_case_init: invalid problem: %s\n", why);
        abort();
    }
    t->region = r;
    t->base = base;
    t->off_in = base;
    t->off_w = t->off_in + it_align64(t->sz.input_bytes);
    t->off_b = t->off_w + it_align64(t->sz.weight_bytes);
    t->off_out = t->off_b + (p->has_bias ? it_align64(t->sz.bias_bytes) : 0);
    t->span = t->off_out + it_align64(t->sz.output_bytes) - base;
    if (base + t->span > convd_region_size(r)) {
        fprintf(stderr, "it_case_init: region too small\n");
        abort();
    }
    if (g == NULL) {
        /* Layout only: used for load whose results are not checked. */
        tu_poison((uint8_t *)convd_region_data(r) + t->off_out, t->sz.output_bytes);
        return;
    }
    t->ref = malloc(sizeof(float) * t->sz.output_elems);
    if (t->ref == NULL)
        abort();
    it_case_fill(t, g);
}

void it_case_refresh(struct it_case *t, struct tu_rng *g)
{
    it_case_fill(t, g);
}

void it_case_args(const struct it_case *t, struct convd_conv_args *a)
{
    struct convd_conv_args init = CONVD_CONV_ARGS_INIT;
    *a = init;
    a->problem = t->p;
    a->input = (struct convd_tensor){t->region, t->off_in, t->sz.input_bytes};
    a->weight = (struct convd_tensor){t->region, t->off_w, t->sz.weight_bytes};
    if (t->p.has_bias)
        a->bias = (struct convd_tensor){t->region, t->off_b, t->sz.bias_bytes};
    a->output = (struct convd_tensor){t->region, t->off_out, t->sz.output_bytes};
}

bool it_case_ok(const struct it_case *t, char *why, size_t why_len)
{
    if (t->ref == NULL) {
        snprintf(why, why_len, "case has no reference");
        return false;
    }
    const uint8_t *base = convd_region_data(t->region);
    size_t bad = 0;
    double err = tu_rel_error(t->p.dtype, base + t->off_out, t->ref, t->sz.output_elems, &bad);
    if (err <= tu_tolerance_of(&t->p))
        return true;
    char desc[128];
    convd_problem_str(&t->p, desc, sizeof(desc));
    snprintf(why, why_len, "%s: relative error %g > %g (element %zu: got %g, want %g)", desc, err,
             tu_tolerance_of(&t->p), bad, (double)tu_load(t->p.dtype, base + t->off_out, bad),
             (double)t->ref[bad]);
    return false;
}

void it_case_check(const struct it_case *t)
{
    char why[320];
    if (!it_case_ok(t, why, sizeof(why)))
        fail_msg("%s", why);
}

void it_case_fini(struct it_case *t)
{
    free(t->ref);
    t->ref = NULL;
}

void it_one_conv(convd_client *c, struct tu_rng *g)
{
    struct convd_problem p;
    tu_random_problem(g, &p, 0, 0, 6);
    convd_region *r = NULL;
    int rc = convd_region_create(c, it_case_span(&p), &r);
    if (rc != 0)
        fail_msg("convd_region_create: %s: %s", convd_status_name(rc), convd_errstr(c));
    struct it_case t;
    it_case_init(&t, r, 0, &p, g);
    struct convd_conv_args a;
    it_case_args(&t, &a);
    uint64_t id = 0;
    rc = convd_conv_submit(c, &a, &id);
    if (rc != 0)
        fail_msg("convd_conv_submit: %s: %s", convd_status_name(rc), convd_errstr(c));
    struct convd_completion done;
    rc = convd_wait(c, id, TU_TIMEOUT_MS, &done);
    if (rc != 0)
        fail_msg("convd_wait: %s: %s", convd_status_name(rc), convd_errstr(c));
    if (done.status != 0)
        fail_msg("conv failed: %s: %s", convd_status_name(done.status), done.error);
    it_case_check(&t);
    it_case_fini(&t);
    assert_int_equal(convd_region_free(r), 0);
}

void it_heavy_problem(struct convd_problem *p)
{
    /* 2 * 4 * 64 * 64 * 256 * 256 * 9 = 19 GFLOP: a few hundred milliseconds for the
     * vectorised CPU backend on two cores, seconds for plain loops or under ASan. What follows
     * such a request (a few hundred small datagrams) is read by the daemon in milliseconds. */
    convd_problem_init(p, 4, 64, 64, 256, 256, 3, 3, 1);
    p->pad_top = p->pad_bottom = p->pad_left = p->pad_right = 1;
    p->layout = CONVD_LAYOUT_NHWC;
}

/*
 * Background worker.
 */

static int it_worker_main(const char *sock, uint64_t seed, int stop_fd)
{
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = sock;
    o.client_name = "it-worker";
    o.timeout_ms = TU_TIMEOUT_MS;
    convd_client *c = NULL;
    int rc = convd_connect(&o, &c);
    if (rc != 0) {
        fprintf(stderr, "worker: connect: %s\n", convd_last_connect_error());
        return 2;
    }
    struct tu_rng g;
    tu_rng_init(&g, seed);
    unsigned done = 0;
    int ret = 0;
    for (;;) {
        struct pollfd pfd = {.fd = stop_fd, .events = POLLIN};
        if (done >= 3 && poll(&pfd, 1, 0) > 0)
            break;
        struct convd_problem p;
        tu_random_problem(&g, &p, 0, 0, 5);
        convd_region *r = NULL;
        rc = convd_region_create(c, it_case_span(&p), &r);
        if (rc != 0) {
            fprintf(stderr, "worker: region_create: %s\n", convd_errstr(c));
            ret = 3;
            break;
        }
        struct it_case t;
        it_case_init(&t, r, 0, &p, &g);
        struct convd_conv_args a;
        it_case_args(&t, &a);
        uint64_t id;
        struct convd_completion cpl;
        rc = convd_conv_submit(c, &a, &id);
        if (rc == 0)
            rc = convd_wait(c, id, TU_TIMEOUT_MS, &cpl);
        if (rc == 0)
            rc = cpl.status;
        char why[320];
        if (rc != 0) {
            fprintf(stderr, "worker: conv %u: %s: %s\n", done, convd_status_name(rc),
                    convd_errstr(c));
            ret = 4;
        } else if (!it_case_ok(&t, why, sizeof(why))) {
            fprintf(stderr, "worker: conv %u wrong: %s\n", done, why);
            ret = 5;
        }
        it_case_fini(&t);
        if (convd_region_free(r) != 0 && ret == 0)
            ret = 6;
        if (ret != 0)
            break;
        done++;
    }
    convd_close(c);
    return ret;
}

void it_worker_start(struct it_worker *w, const struct it_daemon *d, uint64_t seed)
{
    int p[2];
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[1]);
        _exit(it_worker_main(d->sock, seed, p[0]));
    }
    close(p[0]);
    w->pid = pid;
    w->stop_fd = p[1];
}

void it_worker_stop(struct it_worker *w)
{
    if (w->pid <= 0)
        return;
    close(w->stop_fd);
    int st = it_wait_child(w->pid);
    w->pid = 0;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("background worker failed (wait status 0x%x): see its messages above", st);
}
