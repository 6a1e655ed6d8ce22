/*
 * The fault tests' scenario and checks (scenario.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/types.h>
#include <unistd.h>

#include "convd/convd.h"
#include "fault.h"
#include "scenario.h"
#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__)
#define FAULT_LSAN 1
int __lsan_do_recoverable_leak_check(void);
#endif

/* A client-library call with this thread's faults enabled. */
static int cl_rc;
#define CL(call) (fault_exempt_self(false), cl_rc = (call), fault_exempt_self(true), cl_rc)
#define CL_VOID(call)                                                                              \
    do {                                                                                           \
        fault_exempt_self(false);                                                                  \
        call;                                                                                      \
        fault_exempt_self(true);                                                                   \
    } while (0)

struct job {
    struct convd_problem p;
    struct convd_problem_sizes z;
    uint64_t in_off, w_off, b_off, out_off, bytes;
};

/* This process's descriptors and their targets at the last count_fds(): a leak report names
 * what changed since, not only what is open. */
#define FD_SNAP 1024
static char fd_snap[FD_SNAP][96];

bool fds_skip_gpu_nodes;

/* A descriptor on an NVIDIA device node: the driver opens those for the process's CUDA context
 * (channels, memory mappings) and keeps them after the daemon that caused them is gone; the
 * daemon never opens one itself. */
static bool fd_is_gpu_node(const char *target)
{
    return strncmp(target, "/dev/nvidia", 11) == 0;
}

/* Counts the open descriptors of pid (0: this process). For this process it also reads their
 * targets: with `print` it reports each descriptor that is not in the last snapshot (or points
 * elsewhere) and each snapshot entry that is gone; with `snap` it records them as the snapshot. */
static int walk_fds_diff(pid_t pid, bool print, bool snap)
{
    static char now[FD_SNAP][96];
    memset(now, 0, sizeof(now));
    char path[64];
    if (pid == 0)
        snprintf(path, sizeof(path), "/proc/self/fd");
    else
        snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    assert_non_null(dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        n++;
        long fd = strtol(e->d_name, NULL, 10);
        if (pid == 0 && fd >= 0 && fd < FD_SNAP && fd != dirfd(dir)) {
            ssize_t len = readlinkat(dirfd(dir), e->d_name, now[fd], sizeof(now[fd]) - 1);
            now[fd][len > 0 ? len : 0] = '\0';
            if (now[fd][0] == '\0')
                snprintf(now[fd], sizeof(now[fd]), "?");
            if (fds_skip_gpu_nodes && fd_is_gpu_node(now[fd]))
                n--;
        }
    }
    closedir(dir);
    if (print) {
        for (int fd = 0; fd < FD_SNAP; fd++) {
            if (now[fd][0] != '\0' && strcmp(now[fd], fd_snap[fd]) != 0)
                fprintf(stderr, "  new fd %d -> %s%s%s%s\n", fd, now[fd],
                        fd_snap[fd][0] ? ", was " : "", fd_snap[fd],
                        fds_skip_gpu_nodes && fd_is_gpu_node(now[fd]) ? " (driver, not counted)"
                                                                      : "");
            else if (now[fd][0] == '\0' && fd_snap[fd][0] != '\0')
                fprintf(stderr, "  closed fd %d, was %s\n", fd, fd_snap[fd]);
        }
    }
    if (snap)
        memcpy(fd_snap, now, sizeof(fd_snap));
    return pid == 0 ? n - 1 : n; /* our own count includes the directory's descriptor */
}

int count_fds_of(pid_t pid)
{
    return walk_fds_diff(pid, false, false);
}

int count_fds(void)
{
    return walk_fds_diff(0, false, true);
}

long scenario_count_calls(const char *sock, uint64_t seed, int id)
{
    struct outcome o = {0};
    fault_arm(id, 0);
    scenario(sock, seed, &o);
    if (o.lost != 0 || o.wrong != 0 || o.failed != 0)
        fail_msg("unfaulted scenario: %d lost, %d wrong, %d failed (%s)", o.lost, o.wrong, o.failed,
                 o.what);
    return fault_calls(id);
}

int count_memfd_maps(void)
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
        p->activation = CONVD_ACT_RELU;
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

static convd_client *cl_connect(const char *sock, int rings)
{
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = sock;
    o.client_name = "fault";
    o.timeout_ms = WAIT_MS;
    o.use_rings = rings;
    o.spin_us = 0;
    convd_client *c = NULL;
    if (CL(convd_connect(&o, &c)) != 0)
        return NULL;
    return c;
}

static void note_fail(struct outcome *o, const char *step, int rc)
{
    if (o->failed++ == 0)
        snprintf(o->what, sizeof(o->what), "%s: %s", step, convd_status_name(rc));
}

/* Client with rings: three requests in one region (they may batch), then status, metrics and an
 * orderly close. Returns with everything released whatever failed. */
static void client_rings(const char *sock, struct tu_rng *g, struct outcome *o, bool strict)
{
    struct job j;
    job_init(&j, 0);
    convd_client *c = cl_connect(sock, 1);
    if (c == NULL) {
        note_fail(o, "connect (rings)", CONVD_ECONNECT);
        return;
    }
    convd_region *r = NULL;
    int rc = CL(convd_region_create(c, 3 * j.bytes, &r));
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
        rc = CL(convd_conv_submit(c, &a, &ids[i]));
        if (rc != 0)
            note_fail(o, "submit", rc);
        else
            sent[i] = true;
    }
    for (int i = 0; i < 3; i++) {
        if (!sent[i])
            continue;
        struct convd_completion done;
        rc = CL(convd_wait(c, ids[i], WAIT_MS, &done));
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
    rc = CL(convd_status_get(c, &st));
    if (rc != 0)
        note_fail(o, "status", rc);
    char *text = NULL;
    rc = CL(convd_metrics_get(c, &text));
    if (rc != 0)
        note_fail(o, "metrics", rc);
    free(text);
out:
    if (r != NULL && CL(convd_region_free(r)) != 0)
        note_fail(o, "region_free", CONVD_EIO);
    CL_VOID(convd_close(c));
    if (strict && o->failed != 0)
        fail_msg("a client on an unfaulted daemon failed: %s", o->what);
}

/* Client without rings: the blocking convenience call, fp16 NCHW. */
static void client_socket(const char *sock, struct tu_rng *g, struct outcome *o)
{
    struct job j;
    job_init(&j, 1);
    convd_client *c = cl_connect(sock, 0);
    if (c == NULL) {
        note_fail(o, "connect (socket)", CONVD_ECONNECT);
        return;
    }
    uint8_t *buf = malloc(j.bytes);
    assert_non_null(buf);
    job_fill(&j, buf, g);
    int rc = CL(convd_conv(c, &j.p, buf + j.in_off, buf + j.w_off, NULL, buf + j.out_off));
    if (rc == CONVD_ETIMEDOUT)
        o->lost++;
    else if (rc != 0)
        note_fail(o, "conv", rc);
    else if (!job_correct(&j, buf))
        o->wrong++;
    else
        o->completed++;
    free(buf);
    CL_VOID(convd_close(c));
}

/* Client that leaves with a request in flight: the daemon must cancel or finish it and release
 * the region either way. */
static void client_vanish(const char *sock, struct tu_rng *g, struct outcome *o)
{
    struct job j;
    job_init(&j, 0);
    convd_client *c = cl_connect(sock, 1);
    if (c == NULL) {
        note_fail(o, "connect (vanish)", CONVD_ECONNECT);
        return;
    }
    convd_region *r = NULL;
    int rc = CL(convd_region_create(c, j.bytes, &r));
    if (rc == 0) {
        job_fill(&j, convd_region_data(r), g);
        struct convd_conv_args a = CONVD_CONV_ARGS_INIT;
        a.problem = j.p;
        a.input = (struct convd_tensor){r, j.in_off, j.z.input_bytes};
        a.weight = (struct convd_tensor){r, j.w_off, j.z.weight_bytes};
        a.bias = (struct convd_tensor){r, j.b_off, j.z.bias_bytes};
        a.output = (struct convd_tensor){r, j.out_off, j.z.output_bytes};
        uint64_t id;
        rc = CL(convd_conv_submit(c, &a, &id));
        if (rc != 0)
            note_fail(o, "submit (vanish)", rc);
    } else {
        note_fail(o, "region_create (vanish)", rc);
    }
    CL_VOID(convd_close(c)); /* frees r too */
}

void scenario(const char *sock, uint64_t seed, struct outcome *o)
{
    struct tu_rng g;
    tu_rng_init(&g, seed);
    client_rings(sock, &g, o, false);
    client_socket(sock, &g, o);
    client_vanish(sock, &g, o);
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
void check_serving(const char *sock, uint64_t seed, const char *label)
{
    uint64_t until = now_ms() + WAIT_MS;
    convd_client *c;
    while ((c = cl_connect(sock, 0)) == NULL) {
        if (now_ms() > until)
            fail_msg("%s: the daemon no longer accepts clients", label);
        usleep(20000);
    }
    for (;;) {
        char *text = NULL;
        int rc = CL(convd_metrics_get(c, &text));
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
    CL_VOID(convd_close(c));
    struct tu_rng g;
    tu_rng_init(&g, seed ^ 0x5eed);
    struct outcome o = {0};
    client_rings(sock, &g, &o, true);
    if (o.lost != 0 || o.wrong != 0 || o.completed != 3)
        fail_msg("%s: on the recovered daemon %d lost, %d wrong, %d of 3 completed", label, o.lost,
                 o.wrong, o.completed);
}

void check_no_leaks(int fds, int maps, const char *label)
{
    int now_fds = walk_fds_diff(0, false, false), now_maps = count_memfd_maps();
    static int shown;
    if (fds_skip_gpu_nodes && now_fds == fds && shown < 3) {
        /* What the driver opened meanwhile, for the log: the first few checks only. */
        shown++;
        fprintf(stderr, "%s: descriptors changed since the daemon started (driver's excepted):\n",
                label);
        walk_fds_diff(0, true, false);
    }
    if (now_fds != fds) {
        walk_fds_diff(0, true, false);
        fail_msg("%s: %d descriptors open, %d before the daemon started", label, now_fds, fds);
    }
    if (now_maps != maps)
        fail_msg("%s: %d memfd mappings, %d before the daemon started", label, now_maps, maps);
#ifdef FAULT_LSAN
    if (__lsan_do_recoverable_leak_check() != 0)
        fail_msg("%s: LeakSanitizer found leaks (above)", label);
#endif
}

/* Evenly spaced call numbers to fail, at most `cap` of 1..calls. */
long nth_call(long i, long calls, long cap)
{
    if (calls <= cap)
        return i + 1;
    return 1 + (i * (calls - 1)) / (cap - 1);
}

long runs_cap(void)
{
    const char *e = getenv("CONVD_FAULT_MAX");
    long v = e != NULL ? strtol(e, NULL, 10) : 0;
    return v >= 2 ? v : 120;
}
