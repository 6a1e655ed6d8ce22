/*
 * End to end on the GPU: a real convd (--backend gpu) on a temporary socket, driven through the
 * real client library, with tensors in host memory (memfd regions) and in this process's device
 * memory (cudaMalloc + cudaIpcGetMemHandle, registered with convd_region_import_gpu).
 *
 * Every output is poisoned (0xff bytes, NaN in every dtype) before the request and compared with
 * the double-precision reference (tu_ref_conv) on fresh random data afterwards.
 *
 * Needs a GPU: a forked probe asks the runtime for devices before this process touches it; with
 * none (or a daemon that serves from the CPU) it prints "SKIP: no GPU" and exits 77, which ctest
 * counts as skipped. A daemon that cannot start although the probe found a device is a failure.
 *
 * Order matters: a CUDA (HIP) process may not fork after it has used the runtime, and the
 * batching test forks client processes. So the tests that fork run before the first test that
 * allocates device memory here; g_rt_used guards this. The daemon itself is fork+exec, which is
 * safe at any time.
 *
 * Failure messages name the problem, the test's family label, the request's status and the
 * daemon's sentence, the relative error and the first bad element, so that one run on the GPU
 * machine tells what went wrong. The daemon's own log (level notice) goes to stderr as well.
 */
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

/* The few runtime calls the test makes itself (device presence, the client's allocation), in C. */
#ifdef CONVD_TEST_AMD
#include <hip/hip_runtime_api.h>
typedef hipError_t rt_error;
typedef hipIpcMemHandle_t rt_ipc_handle;
#define RT_OK                   hipSuccess
#define RT_NAME                 "hip"
#define rt_get_device_count     hipGetDeviceCount
#define rt_set_device           hipSetDevice
#define rt_malloc               hipMalloc
#define rt_free                 hipFree
#define rt_memset               hipMemset
#define rt_synchronize          hipDeviceSynchronize
#define rt_error_string         hipGetErrorString
#define rt_ipc_get_handle       hipIpcGetMemHandle
#define rt_memcpy_htod(d, s, n) hipMemcpy((d), (s), (n), hipMemcpyHostToDevice)
#define rt_memcpy_dtoh(d, s, n) hipMemcpy((d), (s), (n), hipMemcpyDeviceToHost)
#else
#include <cuda_runtime_api.h>
typedef cudaError_t rt_error;
typedef cudaIpcMemHandle_t rt_ipc_handle;
#define RT_OK                   cudaSuccess
#define RT_NAME                 "cuda"
#define rt_get_device_count     cudaGetDeviceCount
#define rt_set_device           cudaSetDevice
#define rt_malloc               cudaMalloc
#define rt_free                 cudaFree
#define rt_memset               cudaMemset
#define rt_synchronize          cudaDeviceSynchronize
#define rt_error_string         cudaGetErrorString
#define rt_ipc_get_handle       cudaIpcGetMemHandle
#define rt_memcpy_htod(d, s, n) cudaMemcpy((d), (s), (n), cudaMemcpyHostToDevice)
#define rt_memcpy_dtoh(d, s, n) cudaMemcpy((d), (s), (n), cudaMemcpyDeviceToHost)
#endif

#define GD_HANDLE_BYTES 64 /* convd_region_import_gpu's handle_len */
_Static_assert(sizeof(rt_ipc_handle) == GD_HANDLE_BYTES, "an IPC handle is 64 bytes");

/* The device the daemon is told to use (--device) and the one this process allocates on: an IPC
 * handle is opened on the device it was made on. */
#define GD_DEVICE     0
#define GD_DEVICE_STR "0"

/* The daemon every test but the last shares, and the one the last test starts for itself. */
static struct it_daemon g_d, g_d2;
/* Set once this process has called the GPU runtime: it may not fork client processes after. */
static bool g_rt_used;

/* ------------------------------------------------------------------------------------------- */
/* The GPU probe and the daemon. */

struct probe_reply {
    int32_t rt_status; /* the runtime's error code, 0 on success */
    int32_t count;
    char msg[200];
};

/* Asks the runtime for the device count in a child process, so that this process stays free to
 * fork. Returns the count (0 when there is none) and the reason in why. */
static int gd_probe(char *why, size_t why_len)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        snprintf(why, why_len, "pipe2: %s", strerror(errno));
        return 0;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, why_len, "fork: %s", strerror(errno));
        close(p[0]);
        close(p[1]);
        return 0;
    }
    if (pid == 0) {
        close(p[0]);
        struct probe_reply r;
        memset(&r, 0, sizeof r);
        int n = 0;
        rt_error e = rt_get_device_count(&n);
        r.rt_status = (int32_t)e;
        r.count = e == RT_OK ? n : 0;
        snprintf(r.msg, sizeof r.msg, "%s", e == RT_OK ? "ok" : rt_error_string(e));
        ssize_t w = write(p[1], &r, sizeof r);
        _exit(w == (ssize_t)sizeof r ? 0 : 1);
    }
    close(p[1]);
    struct probe_reply r;
    memset(&r, 0, sizeof r);
    ssize_t got;
    do
        got = read(p[0], &r, sizeof r);
    while (got < 0 && errno == EINTR);
    close(p[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (got != (ssize_t)sizeof r) {
        snprintf(why, why_len, "the probe process died (wait status 0x%x)", st);
        return 0;
    }
    if (r.rt_status != 0)
        snprintf(why, why_len, "%sGetDeviceCount failed: %s", RT_NAME, r.msg);
    else if (r.count <= 0)
        snprintf(why, why_len, "%sGetDeviceCount found no device", RT_NAME);
    else
        snprintf(why, why_len, "%d device(s)", r.count);
    return r.rt_status == 0 ? r.count : 0;
}

/* Starts convd --backend gpu on a temporary socket and connects d->mon. Returns 0, or -1 with
 * the reason in why (the daemon is gone then). No cmocka asserts: main() calls it too. */
static int gd_daemon_start(struct it_daemon *d, char *why, size_t why_len)
{
    const char *const args[] = {"--backend",   "gpu",    "--device", GD_DEVICE_STR,
                                "--log-level", "notice", NULL};
    if (it_daemon_spawn(d, args, "gpud-monitor", why, why_len) != 0)
        return -1;
    d->base_clients = 1;
    d->base_fds = it_count_fds(d->pid);
    return 0;
}

/* Fails the test when the daemon process is gone (it must never die because of a client). */
static void gd_expect_alive(struct it_daemon *d, const char *after)
{
    if (d->stopped)
        fail_msg("%s: the daemon was stopped already", after);
    int st = 0;
    if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
        d->stopped = true;
        if (WIFSIGNALED(st))
            fail_msg("%s: convd died from signal %d", after, WTERMSIG(st));
        fail_msg("%s: convd exited with status %d", after, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
}

/* ------------------------------------------------------------------------------------------- */
/* Problems. */

enum gd_family { FAM_DEPTHWISE, FAM_CPG4, FAM_CPG32, FAM_DENSE, FAM_CPG3, FAM_COUNT };
static const char *const fam_names[FAM_COUNT] = {"depthwise", "cpg 4", "cpg 32", "groups 1",
                                                 "cpg 3"};

/* A random valid problem of a family (depthwise: one channel per group; cpg 4, 32, 3: that many
 * input and output channels per group; groups 1: dense with odd channel counts) with random
 * geometry (filter 1-5, stride, dilation, asymmetric padding), small enough for the reference.
 * `act`: a random activation (tu_random_activation), else none. */
static void gd_problem(struct tu_rng *g, enum gd_family f, enum convd_dtype dt,
                       enum convd_layout lay, bool bias, bool act, struct convd_problem *p)
{
    for (;;) {
        int groups = 1, cpg = 1, kpg = 1, max_rs = 3;
        switch (f) {
        case FAM_DEPTHWISE:
            groups = tu_rng_range(g, 8, 64);
            max_rs = 5;
            break;
        case FAM_CPG4:
            groups = tu_rng_range(g, 2, 12);
            cpg = kpg = 4;
            break;
        case FAM_CPG32:
            groups = tu_rng_range(g, 1, 3);
            cpg = kpg = 32;
            break;
        case FAM_CPG3:
            groups = tu_rng_range(g, 2, 12);
            cpg = kpg = 3;
            break;
        default:
            cpg = tu_rng_range(g, 5, 64);
            kpg = tu_rng_range(g, 5, 64);
            break;
        }
        int r = tu_rng_range(g, 1, max_rs), s = tu_rng_range(g, 1, max_rs);
        convd_problem_init(p, tu_rng_range(g, 1, 2), tu_rng_range(g, 4, 16), tu_rng_range(g, 4, 16),
                           groups * cpg, groups * kpg, r, s, groups);
        tu_random_geometry(g, p);
        p->dtype = dt;
        p->layout = lay;
        p->has_bias = bias;
        p->activation = CONVD_ACT_NONE;
        p->act_min = p->act_max = 0.0f;
        if (act)
            tu_random_activation(g, p);
        p->allow_tf32 = false; /* the fp32 tolerance is for fp32 arithmetic */
        if (convd_problem_check(p, NULL, 0) == 0)
            return;
    }
}

static const char *gd_pstr(const struct convd_problem *p, char *buf, size_t len)
{
    return convd_problem_str(p, buf, len);
}

/* Waits for request `id` on c and returns its completion; a failure to wait fails the test. */
static void gd_wait(convd_client *c, uint64_t id, const char *what, struct convd_completion *ret)
{
    int rc = convd_wait(c, id, TU_TIMEOUT_MS, ret);
    if (rc != 0)
        fail_msg("%s: convd_wait(request %llu): %s (%s)", what, (unsigned long long)id,
                 convd_status_name(rc), convd_errstr(c));
}

/* ------------------------------------------------------------------------------------------- */
/* Host regions. */

/* A host region whose tensors start a little after the region's start (a multiple of 4 bytes,
 * so that the reference reads aligned floats), holding one it_case. */
static convd_region *gd_host_case(convd_client *c, struct it_case *t, const struct convd_problem *p,
                                  struct tu_rng *g, const char *what)
{
    uint64_t base = 4u * (uint64_t)tu_rng_range(g, 0, 40);
    convd_region *r = NULL;
    int rc = convd_region_create(c, (size_t)(base + it_case_span(p)), &r);
    if (rc != 0)
        fail_msg("%s: convd_region_create(%llu bytes): %s (%s)", what,
                 (unsigned long long)(base + it_case_span(p)), convd_status_name(rc),
                 convd_errstr(c));
    it_case_init(t, r, base, p, g);
    return r;
}

/* Checks a completion and the case's output; returns false with a sentence instead of failing. */
static bool gd_case_result(const struct it_case *t, const struct convd_completion *cpl,
                           const char *label, char *why, size_t why_len)
{
    char ps[200];
    if (cpl->status != 0) {
        snprintf(why, why_len, "[%s] %s: status %s (%d): %s", label, gd_pstr(&t->p, ps, sizeof ps),
                 convd_status_name(cpl->status), cpl->status, cpl->error);
        return false;
    }
    if (cpl->batch_size < 1) {
        snprintf(why, why_len, "[%s] %s: succeeded with batch_size %u", label,
                 gd_pstr(&t->p, ps, sizeof ps), cpl->batch_size);
        return false;
    }
    char err[320];
    if (!it_case_ok(t, err, sizeof err)) {
        snprintf(why, why_len, "[%s] %s (batch of %u)", label, err, cpl->batch_size);
        return false;
    }
    return true;
}

/* One host-region convolution of p on c that must succeed and be right. */
static void gd_host_conv_of(convd_client *c, const struct convd_problem *p, const char *what)
{
    struct it_case t;
    convd_region *r = gd_host_case(c, &t, p, it_rng(), what);
    struct convd_conv_args a;
    it_case_args(&t, &a);
    uint64_t id = 0;
    int rc = convd_conv_submit(c, &a, &id);
    if (rc != 0)
        fail_msg("%s: convd_conv_submit: %s (%s)", what, convd_status_name(rc), convd_errstr(c));
    struct convd_completion cpl;
    gd_wait(c, id, what, &cpl);
    char why[600];
    if (!gd_case_result(&t, &cpl, what, why, sizeof why))
        fail_msg("%s: a host-region convolution failed: %s", what, why);
    it_case_fini(&t);
    rc = convd_region_free(r);
    if (rc != 0)
        fail_msg("%s: convd_region_free: %s (%s)", what, convd_status_name(rc), convd_errstr(c));
}

/* One host-region convolution on c that must succeed: proves that the daemon still serves. */
static void gd_host_conv(convd_client *c, const char *what)
{
    struct convd_problem p;
    gd_problem(it_rng(), FAM_CPG4, CONVD_DTYPE_FP32, CONVD_LAYOUT_NHWC, true, true, &p);
    gd_host_conv_of(c, &p, what);
}

/* ------------------------------------------------------------------------------------------- */
/* Tests: the handshake, and host regions of every dtype, layout, epilogue and family. */

static void test_handshake_says_gpu(void **state)
{
    (void)state;
    struct convd_server_info info;
    convd_server_info(g_d.mon, &info);
    fprintf(stderr, "daemon: convd %s, backend %s, device %s, max_batch %u\n", info.server_version,
            info.backend, info.device, info.max_batch);
    if (strcmp(info.backend, "gpu") != 0)
        fail_msg("HelloReply.backend is '%s', want 'gpu'", info.backend);
    if (info.device[0] == '\0' || strstr(info.device, "GiB") == NULL)
        fail_msg("HelloReply.device '%s' does not describe a GPU ('name (arch, SMs, GiB)')",
                 info.device);
    assert_int_equal(info.protocol_version, CONVD_PROTOCOL_VERSION);
    struct convd_status st;
    int rc = convd_status_get(g_d.mon, &st);
    if (rc != 0)
        fail_msg("convd_status_get: %s (%s)", convd_status_name(rc), convd_errstr(g_d.mon));
    if (strcmp(st.backend, "gpu") != 0 || strcmp(st.device, info.device) != 0)
        fail_msg("StatusReply says backend '%s' on '%s'; HelloReply said 'gpu' on '%s'", st.backend,
                 st.device, info.device);
}

/* fp32 requests that allow TF32 through the whole serving path, in host regions, both layouts, with
 * and without bias and activation: the daemon routes dense problems of kpg 64 to the TF32 tiles,
 * and each result must meet the TF32 tolerance (tu_tolerance_of); test_gpu_kernels checks that
 * the tensor cores, not exact fp32, computed it. */
static void test_tf32_requests(void **state)
{
    (void)state;
    convd_client *c = it_connect(&g_d, "gpud-tf32");
    for (int v = 0; v < 4; v++) {
        struct convd_problem p;
        convd_problem_init(&p, 2, 12, 11, 64, 64, 3, 3, v == 3 ? 2 : 1);
        p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
        p.dtype = CONVD_DTYPE_FP32;
        p.layout = v % 2 ? CONVD_LAYOUT_NCHW : CONVD_LAYOUT_NHWC;
        p.has_bias = v >= 2;
        if (v >= 2)
            tu_random_activation(it_rng(), &p);
        p.allow_tf32 = true;
        char what[64];
        snprintf(what, sizeof what, "tf32 case %d", v);
        gd_host_conv_of(c, &p, what);
    }
    convd_close(c);
}

#define HOST_CASES (FAM_COUNT * 3 * 2 * 4)

/* Every family x dtype x layout x {none, bias, activation, bias+activation}, all in flight at once
 * on one client, each in its own memfd region at a small non-zero offset. */
static void test_host_regions(void **state)
{
    (void)state;
    convd_client *c = it_connect(&g_d, "gpud-host");
    struct it_case *cases = calloc(HOST_CASES, sizeof *cases);
    convd_region **regs = calloc(HOST_CASES, sizeof *regs);
    uint64_t *ids = calloc(HOST_CASES, sizeof *ids);
    const char **labels = calloc(HOST_CASES, sizeof *labels);
    assert_non_null(cases);
    assert_non_null(regs);
    assert_non_null(ids);
    assert_non_null(labels);
    size_t n = 0;
    for (int f = 0; f < FAM_COUNT; f++)
        for (int dt = CONVD_DTYPE_FP32; dt <= CONVD_DTYPE_BF16; dt++)
            for (int lay = CONVD_LAYOUT_NCHW; lay <= CONVD_LAYOUT_NHWC; lay++)
                for (int epi = 0; epi < 4; epi++) {
                    struct convd_problem p;
                    gd_problem(it_rng(), (enum gd_family)f, (enum convd_dtype)dt,
                               (enum convd_layout)lay, (epi & 1) != 0, (epi & 2) != 0, &p);
                    labels[n] = fam_names[f];
                    regs[n] = gd_host_case(c, &cases[n], &p, it_rng(), "host regions");
                    struct convd_conv_args a;
                    it_case_args(&cases[n], &a);
                    int rc = convd_conv_submit(c, &a, &ids[n]);
                    if (rc != 0) {
                        char ps[200];
                        fail_msg("host regions: [%s] %s: convd_conv_submit: %s (%s)", labels[n],
                                 gd_pstr(&p, ps, sizeof ps), convd_status_name(rc),
                                 convd_errstr(c));
                    }
                    n++;
                }
    assert_int_equal(n, HOST_CASES);

    size_t bad = 0, batched = 0;
    char first[700] = "";
    for (size_t done = 0; done < n; done++) {
        struct convd_completion cpl;
        int rc = convd_wait_any(c, TU_TIMEOUT_MS, &cpl);
        if (rc != 0)
            fail_msg("host regions: convd_wait_any after %zu of %zu completions: %s (%s)", done, n,
                     convd_status_name(rc), convd_errstr(c));
        size_t i = 0;
        while (i < n && ids[i] != cpl.id)
            i++;
        if (i == n)
            fail_msg("host regions: a completion for request %llu, which was not submitted",
                     (unsigned long long)cpl.id);
        if (cpl.batch_size > 1)
            batched++;
        char why[700];
        if (!gd_case_result(&cases[i], &cpl, labels[i], why, sizeof why)) {
            print_error("host regions: %s\n", why);
            if (bad++ == 0)
                snprintf(first, sizeof first, "%s", why);
        }
    }
    fprintf(stderr, "host regions: %zu requests, %zu wrong, %zu ran in batches of more than one\n",
            n, bad, batched);
    if (bad != 0)
        fail_msg("host regions: %zu of %zu requests failed or were wrong; the first: %s", bad, n,
                 first);
    for (size_t i = 0; i < n; i++) {
        it_case_fini(&cases[i]);
        int rc = convd_region_free(regs[i]);
        if (rc != 0)
            fail_msg("host regions: convd_region_free: %s (%s)", convd_status_name(rc),
                     convd_errstr(c));
    }
    struct convd_status st;
    assert_int_equal(convd_status_get(c, &st), 0);
    if (strcmp(st.backend, "gpu") != 0)
        fail_msg("host regions: StatusReply.backend is '%s' after serving", st.backend);
    if (st.requests_served < HOST_CASES)
        fail_msg("host regions: StatusReply.requests_served is %llu after %d good requests",
                 (unsigned long long)st.requests_served, HOST_CASES);
    free(cases);
    free(regs);
    free(ids);
    free(labels);
    convd_close(c);
}

/* ------------------------------------------------------------------------------------------- */
/* Batching: client processes pipeline many requests of one problem. */

#define BATCH_CLIENTS 4
#define BATCH_REQS    64

struct batch_report {
    int32_t child;
    int32_t failed;    /* 0: every request completed and was right */
    uint32_t done;     /* completions received */
    uint32_t batched;  /* of them with batch_size > 1 */
    uint32_t max_size; /* largest batch_size seen */
    char msg[400];     /* the first failure */
};

/* fp16 NHWC, 2 groups of 32 channels (the tensor-core family), bias and ReLU. */
static void batch_problem(struct convd_problem *p)
{
    convd_problem_init(p, 1, 20, 20, 64, 64, 3, 3, 2);
    p->pad_top = p->pad_bottom = p->pad_left = p->pad_right = 1;
    p->dtype = CONVD_DTYPE_FP16;
    p->layout = CONVD_LAYOUT_NHWC;
    p->has_bias = true;
    p->activation = CONVD_ACT_RELU;
}

static uint64_t gd_align64(uint64_t v)
{
    return (v + 63u) & ~(uint64_t)63u;
}

/* The body of one client process: one region with shared weights and bias and BATCH_REQS
 * input/output pairs; tells the parent it is ready, waits for the go, submits everything at
 * once, waits for all completions and checks each output. No cmocka here: the report goes to
 * the parent through a pipe. */
static int batch_child(int child, const char *sock, uint64_t seed, int ready_fd, int go_fd,
                       int report_fd)
{
    struct batch_report rep;
    memset(&rep, 0, sizeof rep);
    rep.child = child;
    rep.failed = 1;
    convd_client *c = NULL;
    convd_region *r = NULL;
    float *refs[BATCH_REQS] = {0};
    uint64_t ids[BATCH_REQS] = {0};
    struct convd_problem p;
    struct convd_problem_sizes z;
    struct tu_rng g;
    tu_rng_init(&g, seed);
    batch_problem(&p);
    (void)convd_problem_sizes(&p, &z, NULL, 0);
    const uint64_t off_b = gd_align64(z.weight_bytes);
    const uint64_t first = off_b + gd_align64(z.bias_bytes);
    const uint64_t out_at = gd_align64(z.input_bytes);
    const uint64_t per = out_at + gd_align64(z.output_bytes);

    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = sock;
    o.client_name = "gpud-batch";
    o.timeout_ms = TU_TIMEOUT_MS;
    int rc = convd_connect(&o, &c);
    if (rc != 0) {
        snprintf(rep.msg, sizeof rep.msg, "client %d: convd_connect: %s: %s", child,
                 convd_status_name(rc), convd_last_connect_error());
        goto out;
    }
    rc = convd_region_create(c, (size_t)(first + BATCH_REQS * per), &r);
    if (rc != 0) {
        snprintf(rep.msg, sizeof rep.msg, "client %d: convd_region_create: %s: %s", child,
                 convd_status_name(rc), convd_errstr(c));
        goto out;
    }
    uint8_t *base = convd_region_data(r);
    tu_fill_random(&g, p.dtype, base, z.weight_elems);
    tu_fill_random(&g, p.dtype, base + off_b, z.bias_elems);
    for (int i = 0; i < BATCH_REQS; i++) {
        uint8_t *in = base + first + (uint64_t)i * per;
        tu_fill_random(&g, p.dtype, in, z.input_elems);
        tu_poison(in + out_at, z.output_bytes);
        refs[i] = malloc(z.output_elems * sizeof(float));
        if (refs[i] == NULL) {
            snprintf(rep.msg, sizeof rep.msg, "client %d: out of memory", child);
            goto out;
        }
        tu_ref_conv(&p, in, base, base + off_b, refs[i]);
    }
    char ch = 'r';
    if (write(ready_fd, &ch, 1) != 1) {
        snprintf(rep.msg, sizeof rep.msg, "client %d: cannot signal readiness", child);
        goto out;
    }
    /* The go (or the parent's end closing) releases every client at once. */
    while (read(go_fd, &ch, 1) < 0 && errno == EINTR)
        ;
    for (int i = 0; i < BATCH_REQS; i++) {
        uint64_t at = first + (uint64_t)i * per;
        struct convd_conv_args a = CONVD_CONV_ARGS_INIT;
        a.problem = p;
        a.input = (struct convd_tensor){r, at, z.input_bytes};
        a.weight = (struct convd_tensor){r, 0, z.weight_bytes}; /* shared by every request */
        a.bias = (struct convd_tensor){r, off_b, z.bias_bytes};
        a.output = (struct convd_tensor){r, at + out_at, z.output_bytes};
        rc = convd_conv_submit(c, &a, &ids[i]);
        if (rc != 0) {
            snprintf(rep.msg, sizeof rep.msg, "client %d: convd_conv_submit of request %d: %s: %s",
                     child, i, convd_status_name(rc), convd_errstr(c));
            goto out;
        }
    }
    int wrong = 0;
    for (int k = 0; k < BATCH_REQS; k++) {
        struct convd_completion cpl;
        rc = convd_wait_any(c, TU_TIMEOUT_MS, &cpl);
        if (rc != 0) {
            snprintf(rep.msg, sizeof rep.msg,
                     "client %d: convd_wait_any after %u completions: %s: %s", child, rep.done,
                     convd_status_name(rc), convd_errstr(c));
            goto out;
        }
        rep.done++;
        if (cpl.batch_size > 1)
            rep.batched++;
        if (cpl.batch_size > rep.max_size)
            rep.max_size = cpl.batch_size;
        int i = 0;
        while (i < BATCH_REQS && ids[i] != cpl.id)
            i++;
        char ps[200];
        if (i == BATCH_REQS) {
            snprintf(rep.msg, sizeof rep.msg, "client %d: completion for unknown request %llu",
                     child, (unsigned long long)cpl.id);
            goto out;
        }
        if (cpl.status != 0) {
            if (wrong++ == 0)
                snprintf(rep.msg, sizeof rep.msg, "client %d: request %d (%s, batch of %u): %s: %s",
                         child, i, gd_pstr(&p, ps, sizeof ps), cpl.batch_size,
                         convd_status_name(cpl.status), cpl.error);
            continue;
        }
        const uint8_t *out = base + first + (uint64_t)i * per + out_at;
        size_t bad = 0;
        double err = tu_rel_error(p.dtype, out, refs[i], z.output_elems, &bad);
        if (!(err <= tu_tolerance(p.dtype)) && wrong++ == 0)
            snprintf(rep.msg, sizeof rep.msg,
                     "client %d: request %d (%s, batch of %u): relative error %.3g > %.3g, "
                     "element %zu is %g, reference %g",
                     child, i, gd_pstr(&p, ps, sizeof ps), cpl.batch_size, err,
                     tu_tolerance(p.dtype), bad, (double)tu_load(p.dtype, out, bad),
                     (double)refs[i][bad]);
    }
    rep.failed = wrong != 0;
out:
    for (int i = 0; i < BATCH_REQS; i++)
        free(refs[i]);
    if (r != NULL)
        (void)convd_region_free(r);
    convd_close(c);
    ssize_t w = write(report_fd, &rep, sizeof rep);
    return w == (ssize_t)sizeof rep && !rep.failed ? 0 : 1;
}

/* A heavy fp32 problem that keeps one of the daemon's two GPU workers busy for milliseconds,
 * so that the clients' requests queue and batch meanwhile. `relu` makes a second, different
 * problem, which goes to the other worker. Its output is not checked, only its status. */
static void blocker_problem(struct convd_problem *p, bool relu)
{
    convd_problem_init(p, 16, 32, 32, 1024, 1024, 3, 3, 1);
    p->pad_top = p->pad_bottom = p->pad_left = p->pad_right = 1;
    tu_set_activation(p, relu ? CONVD_ACT_RELU : CONVD_ACT_NONE);
}

static void test_batching(void **state)
{
    (void)state;
    if (g_rt_used)
        fail_msg("batching: this process used the GPU runtime already and may not fork client "
                 "processes; the tests that fork must run before the device-memory tests");
    int ready[2], go[2], report[2];
    assert_int_equal(pipe2(ready, O_CLOEXEC), 0);
    assert_int_equal(pipe2(go, O_CLOEXEC), 0);
    assert_int_equal(pipe2(report, O_CLOEXEC), 0);
    pid_t kids[BATCH_CLIENTS];
    for (int i = 0; i < BATCH_CLIENTS; i++) {
        uint64_t seed = tu_rng_next(it_rng());
        fflush(NULL);
        kids[i] = fork();
        assert_true(kids[i] >= 0);
        if (kids[i] == 0) {
            close(ready[0]);
            close(go[1]);
            close(report[0]);
            _exit(batch_child(i, g_d.sock, seed, ready[1], go[0], report[1]));
        }
    }
    close(ready[1]);
    close(go[0]);
    close(report[1]);

    /* All clients connected, their data and references ready. */
    int ready_n = 0;
    uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
    while (ready_n < BATCH_CLIENTS && tu_now_ms() < end) {
        struct pollfd pfd = {.fd = ready[0], .events = POLLIN};
        if (poll(&pfd, 1, 100) <= 0) {
            /* A client that died before it was ready: stop waiting (it is reaped below). */
            bool died = false;
            for (int i = 0; i < BATCH_CLIENTS && !died; i++) {
                siginfo_t si;
                memset(&si, 0, sizeof si);
                died = waitid(P_PID, (id_t)kids[i], &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                       si.si_pid == kids[i];
            }
            if (died)
                break;
            continue;
        }
        char buf[BATCH_CLIENTS];
        ssize_t got = read(ready[0], buf, sizeof buf);
        if (got <= 0)
            break; /* every child closed its end: some died; their reports say why */
        ready_n += (int)got;
    }

    /* Both workers busy with a heavy request each; then the clients submit at once. */
    convd_client *b = it_connect(&g_d, "gpud-blocker");
    struct convd_problem pa, pb;
    blocker_problem(&pa, false);
    blocker_problem(&pb, true);
    struct convd_problem_sizes z;
    assert_int_equal(convd_problem_sizes(&pa, &z, NULL, 0), 0);
    const uint64_t w_at = gd_align64(z.input_bytes), oa_at = w_at + gd_align64(z.weight_bytes);
    const uint64_t ob_at = oa_at + gd_align64(z.output_bytes);
    convd_region *br = NULL;
    int rc = convd_region_create(b, (size_t)(ob_at + z.output_bytes), &br);
    if (rc != 0)
        fail_msg("batching: blocker region of %llu bytes: %s (%s)",
                 (unsigned long long)(ob_at + z.output_bytes), convd_status_name(rc),
                 convd_errstr(b));
    tu_fill_random(it_rng(), pa.dtype, convd_region_data(br), z.input_elems);
    tu_fill_random(it_rng(), pa.dtype, (uint8_t *)convd_region_data(br) + w_at, z.weight_elems);
    uint64_t bid[2];
    for (int i = 0; i < 2; i++) {
        struct convd_conv_args a = CONVD_CONV_ARGS_INIT;
        a.problem = i == 0 ? pa : pb;
        a.input = (struct convd_tensor){br, 0, z.input_bytes};
        a.weight = (struct convd_tensor){br, w_at, z.weight_bytes};
        a.output = (struct convd_tensor){br, i == 0 ? oa_at : ob_at, z.output_bytes};
        rc = convd_conv_submit(b, &a, &bid[i]);
        if (rc != 0)
            fail_msg("batching: blocker %d: convd_conv_submit: %s (%s)", i, convd_status_name(rc),
                     convd_errstr(b));
    }
    bool both_running = false;
    uint64_t wend = tu_now_ms() + 10000;
    while (tu_now_ms() < wend) {
        struct convd_status st;
        rc = convd_status_get(g_d.mon, &st);
        if (rc != 0)
            fail_msg("batching: convd_status_get: %s (%s)", convd_status_name(rc),
                     convd_errstr(g_d.mon));
        if (st.inflight >= 2 && st.queue_depth == 0) {
            both_running = true;
            break;
        }
        if (st.inflight == 0)
            break; /* done already */
        tu_sleep_ms(1);
    }
    char go_bytes[BATCH_CLIENTS];
    memset(go_bytes, 'g', sizeof go_bytes);
    if (write(go[1], go_bytes, sizeof go_bytes) != (ssize_t)sizeof go_bytes)
        print_error("batching: could not write the go to every client\n");
    close(go[1]);

    struct convd_completion bc[2];
    for (int i = 0; i < 2; i++) {
        gd_wait(b, bid[i], "batching: blocker", &bc[i]);
        if (bc[i].status != 0) {
            char ps[200];
            fail_msg("batching: blocker %s failed: %s: %s", gd_pstr(i ? &pb : &pa, ps, sizeof ps),
                     convd_status_name(bc[i].status), bc[i].error);
        }
    }
    fprintf(stderr,
            "batching: %d of %d clients ready; blockers %s both running at the go; they ran "
            "%llu us and %llu us\n",
            ready_n, BATCH_CLIENTS, both_running ? "were" : "were NOT seen",
            (unsigned long long)bc[0].exec_us, (unsigned long long)bc[1].exec_us);
    (void)convd_region_free(br);
    convd_close(b);

    /* Reports, then the processes. */
    struct batch_report reps[BATCH_CLIENTS];
    int nrep = 0;
    while (nrep < BATCH_CLIENTS) {
        ssize_t got;
        do
            got = read(report[0], &reps[nrep], sizeof reps[nrep]);
        while (got < 0 && errno == EINTR);
        if (got != (ssize_t)sizeof reps[nrep])
            break;
        nrep++;
    }
    close(ready[0]);
    close(report[0]);
    int dead = 0;
    for (int i = 0; i < BATCH_CLIENTS; i++) {
        int st = it_wait_child(kids[i]);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            print_error("batching: client process %d ended with wait status 0x%x\n", i, st);
            dead++;
        }
    }
    uint32_t done = 0, batched = 0, max_size = 0;
    const char *first_fail = NULL;
    for (int i = 0; i < nrep; i++) {
        done += reps[i].done;
        batched += reps[i].batched;
        if (reps[i].max_size > max_size)
            max_size = reps[i].max_size;
        reps[i].msg[sizeof reps[i].msg - 1] = '\0';
        if (reps[i].failed) {
            print_error("batching: %s\n", reps[i].msg);
            if (first_fail == NULL)
                first_fail = reps[i].msg;
        }
    }
    fprintf(stderr,
            "batching: %u of %d completions, %u of them in batches of more than one, largest "
            "batch %u\n",
            done, BATCH_CLIENTS * BATCH_REQS, batched, max_size);
    if (nrep != BATCH_CLIENTS)
        fail_msg("batching: only %d of %d client processes reported (the others died: see their "
                 "messages above)",
                 nrep, BATCH_CLIENTS);
    if (first_fail != NULL)
        fail_msg("batching: requests failed or were wrong; the first: %s", first_fail);
    if (dead != 0)
        fail_msg("batching: %d client process(es) exited abnormally", dead);
    assert_int_equal(done, BATCH_CLIENTS * BATCH_REQS);
    if (batched == 0)
        fail_msg("batching: %d clients pipelined %d requests of one problem each%s, yet every "
                 "completion reports batch_size 1: the scheduler never batched queued requests",
                 BATCH_CLIENTS, BATCH_REQS,
                 both_running ? " while both GPU workers were busy" : "");
}

/* ------------------------------------------------------------------------------------------- */
/* Device memory of this process, by IPC handle. */

/* A multiple of 2 MiB, so that the allocation's size as the driver reports it is exactly this. */
#define DEV_ALLOC ((uint64_t)32 << 20)
static char *g_dev;
static uint8_t g_handle[GD_HANDLE_BYTES];

static void rt_must(rt_error e, const char *what)
{
    if (e != RT_OK)
        fail_msg("%s (in the test process): %s", what, rt_error_string(e));
}

/* Allocates the test's device memory and exports its IPC handle, once. */
static void dev_setup(void)
{
    if (g_dev != NULL)
        return;
    g_rt_used = true;
    rt_must(rt_set_device(GD_DEVICE), "selecting GPU " GD_DEVICE_STR);
    void *p = NULL;
    rt_must(rt_malloc(&p, DEV_ALLOC), "allocating 32 MiB of device memory");
    g_dev = p;
    rt_ipc_handle h;
    rt_must(rt_ipc_get_handle(&h, g_dev), "exporting the allocation's IPC handle");
    memcpy(g_handle, &h, sizeof g_handle);
}

enum { T_IN, T_W, T_B, T_OUT, T_COUNT };
static const char *const t_names[T_COUNT] = {"input", "weight", "bias", "output"};

/* One convolution whose tensors live at absolute offsets `at` of the device allocation; host
 * copies of the inputs for the reference, host room for the output read back. */
struct dcase {
    const char *label;
    struct convd_problem p;
    struct convd_problem_sizes sz;
    uint64_t bytes[T_COUNT];
    uint64_t at[T_COUNT];
    uint8_t *host[T_COUNT];
    float *ref;
};

static void dcase_init(struct dcase *d, const char *label, const struct convd_problem *p)
{
    memset(d, 0, sizeof *d);
    d->label = label;
    d->p = *p;
    assert_int_equal(convd_problem_sizes(p, &d->sz, NULL, 0), 0);
    d->bytes[T_IN] = d->sz.input_bytes;
    d->bytes[T_W] = d->sz.weight_bytes;
    d->bytes[T_B] = p->has_bias ? d->sz.bias_bytes : 0;
    d->bytes[T_OUT] = d->sz.output_bytes;
    for (int i = 0; i < T_COUNT; i++) {
        d->host[i] = malloc(d->bytes[i] ? d->bytes[i] : 1);
        assert_non_null(d->host[i]);
    }
    tu_fill_random(it_rng(), p->dtype, d->host[T_IN], d->sz.input_elems);
    tu_fill_random(it_rng(), p->dtype, d->host[T_W], d->sz.weight_elems);
    if (p->has_bias)
        tu_fill_random(it_rng(), p->dtype, d->host[T_B], d->sz.bias_elems);
    d->ref = malloc(d->sz.output_elems * sizeof(float));
    assert_non_null(d->ref);
    tu_ref_conv(p, d->host[T_IN], d->host[T_W], p->has_bias ? d->host[T_B] : NULL, d->ref);
}

static void dcase_fini(struct dcase *d)
{
    for (int i = 0; i < T_COUNT; i++)
        free(d->host[i]);
    free(d->ref);
    memset(d, 0, sizeof *d);
}

/* Places the tensors from *cursor on. aligned: each tensor 256-byte aligned (the fast kernel
 * families); else only element-aligned and never 16-byte aligned (the generic path). The bias is
 * element-aligned only in both cases (kernels read it one element at a time). */
static void dcase_place(struct dcase *d, uint64_t *cursor, bool aligned)
{
    const uint64_t es = convd_dtype_size(d->p.dtype);
    uint64_t at = *cursor;
    for (int i = 0; i < T_COUNT; i++) {
        if (d->bytes[i] == 0)
            continue;
        at = (at + 255u) & ~(uint64_t)255u;
        /* An odd multiple of the element size past 256: never a multiple of 16. */
        if (i == T_B || !aligned)
            at += es * (uint64_t)(2 * tu_rng_range(it_rng(), 0, 20) + 1);
        d->at[i] = at;
        at += d->bytes[i];
    }
    if (at > DEV_ALLOC)
        fail_msg("%s: the test's device allocation is too small (%llu > %llu)", d->label,
                 (unsigned long long)at, (unsigned long long)DEV_ALLOC);
    *cursor = at;
}

/* Copies the inputs to the device and poisons the output there. The runtime's copies from
 * pageable memory and its memset may still be in flight when the calls return, and the daemon
 * reads through another context: synchronise before handing the memory over. */
static void dcase_upload(const struct dcase *d)
{
    for (int i = T_IN; i <= T_B; i++)
        if (d->bytes[i])
            rt_must(rt_memcpy_htod(g_dev + d->at[i], d->host[i], d->bytes[i]),
                    "copying a tensor to the device");
    rt_must(rt_memset(g_dev + d->at[T_OUT], 0xff, d->bytes[T_OUT]), "poisoning the output");
    rt_must(rt_synchronize(), "waiting for the uploads");
}

/* Reads the output back from the device and compares it with the reference. */
static void dcase_check(struct dcase *d, const struct convd_completion *cpl, const char *how)
{
    char ps[200];
    if (cpl->status != 0)
        fail_msg("%s, %s: %s: status %s (%d): %s", d->label, how, gd_pstr(&d->p, ps, sizeof ps),
                 convd_status_name(cpl->status), cpl->status, cpl->error);
    rt_must(rt_memcpy_dtoh(d->host[T_OUT], g_dev + d->at[T_OUT], d->bytes[T_OUT]),
            "reading the output back from the device");
    size_t bad = 0;
    double err = tu_rel_error(d->p.dtype, d->host[T_OUT], d->ref, d->sz.output_elems, &bad);
    if (!(err <= tu_tolerance(d->p.dtype)))
        fail_msg("%s, %s: %s (batch of %u; tensors at allocation offsets %llu, %llu, %llu, "
                 "%llu): relative error %.3g > %.3g; element %zu of %llu is %g, reference %g",
                 d->label, how, gd_pstr(&d->p, ps, sizeof ps), cpl->batch_size,
                 (unsigned long long)d->at[T_IN], (unsigned long long)d->at[T_W],
                 (unsigned long long)d->at[T_B], (unsigned long long)d->at[T_OUT], err,
                 tu_tolerance(d->p.dtype), bad, (unsigned long long)d->sz.output_elems,
                 (double)tu_load(d->p.dtype, d->host[T_OUT], bad), (double)d->ref[bad]);
}

static convd_region *dev_import(convd_client *c, uint64_t offset, uint64_t size, const char *what)
{
    convd_region *r = NULL;
    int rc = convd_region_import_gpu(c, g_handle, GD_HANDLE_BYTES, offset, size, &r);
    if (rc != 0)
        fail_msg("%s: convd_region_import_gpu(offset %llu, %llu bytes of a %llu-byte "
                 "allocation): %s (%s)",
                 what, (unsigned long long)offset, (unsigned long long)size,
                 (unsigned long long)DEV_ALLOC, convd_status_name(rc), convd_errstr(c));
    if (convd_region_data(r) != NULL)
        fail_msg("%s: convd_region_data() of a GPU region is not NULL", what);
    if (convd_region_size(r) != size)
        fail_msg("%s: convd_region_size() is %zu, registered %llu", what, convd_region_size(r),
                 (unsigned long long)size);
    return r;
}

static void region_free_ok(convd_client *c, convd_region *r, const char *what)
{
    int rc = convd_region_free(r);
    if (rc != 0)
        fail_msg("%s: convd_region_free: %s (%s)", what, convd_status_name(rc), convd_errstr(c));
}

/* Tensor views of d in regions: one region per tensor (regs[i], tensor at `pre[i]`), or one
 * region for all (regs[0] at `shared_base`). */
static void dcase_args(const struct dcase *d, convd_region *const *regs, const uint64_t *pre,
                       bool shared, uint64_t shared_base, struct convd_conv_args *a)
{
    struct convd_conv_args init = CONVD_CONV_ARGS_INIT;
    *a = init;
    a->problem = d->p;
    struct convd_tensor *t[T_COUNT] = {&a->input, &a->weight, &a->bias, &a->output};
    for (int i = 0; i < T_COUNT; i++) {
        if (d->bytes[i] == 0)
            continue;
        if (shared)
            *t[i] = (struct convd_tensor){regs[0], d->at[i] - shared_base, d->bytes[i]};
        else
            *t[i] = (struct convd_tensor){regs[i], pre[i], d->bytes[i]};
    }
}

static uint64_t gd_submit(convd_client *c, const struct convd_conv_args *a, const char *what)
{
    uint64_t id = 0;
    int rc = convd_conv_submit(c, a, &id);
    if (rc != 0) {
        char ps[200];
        fail_msg("%s: %s: convd_conv_submit: %s (%s)", what, gd_pstr(&a->problem, ps, sizeof ps),
                 convd_status_name(rc), convd_errstr(c));
    }
    return id;
}

struct dev_spec {
    enum gd_family fam;
    enum convd_dtype dt;
    enum convd_layout lay;
    bool bias, act;
};

static const struct dev_spec dev_specs[] = {
    {FAM_DENSE, CONVD_DTYPE_FP32, CONVD_LAYOUT_NCHW, true, true},
    {FAM_CPG32, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC, true, false},
    {FAM_DEPTHWISE, CONVD_DTYPE_BF16, CONVD_LAYOUT_NHWC, false, true},
    {FAM_CPG4, CONVD_DTYPE_FP16, CONVD_LAYOUT_NCHW, true, true},
    {FAM_CPG3, CONVD_DTYPE_BF16, CONVD_LAYOUT_NCHW, false, false},
    {FAM_DEPTHWISE, CONVD_DTYPE_FP32, CONVD_LAYOUT_NHWC, true, false},
    {FAM_CPG32, CONVD_DTYPE_BF16, CONVD_LAYOUT_NCHW, true, true},
};

/* Each problem twice, both in flight together: once with one region per tensor (regions at
 * non-zero allocation offsets, each reaching over the next tensor, so that regions overlap while
 * tensors do not), once with one region holding all four tensors at a non-zero allocation
 * offset. Tensors 256-byte aligned or only element-aligned, alternately. */
static void test_device_regions(void **state)
{
    (void)state;
    dev_setup();
    convd_client *c = it_connect(&g_d, "gpud-device");
    uint64_t cursor = 4096 + 256; /* nothing at the allocation's base: every region is offset */
    const size_t nspec = sizeof dev_specs / sizeof dev_specs[0];
    for (size_t si = 0; si < nspec; si++) {
        const struct dev_spec *s = &dev_specs[si];
        struct convd_problem p;
        gd_problem(it_rng(), s->fam, s->dt, s->lay, s->bias, s->act, &p);
        char label[96];
        snprintf(label, sizeof label, "device [%s]", fam_names[s->fam]);
        struct dcase per, all;
        dcase_init(&per, label, &p);
        dcase_init(&all, label, &p);
        if (cursor > DEV_ALLOC / 2)
            cursor = 4096 + 256;
        dcase_place(&per, &cursor, si % 2 == 0);
        dcase_place(&all, &cursor, si % 2 == 1);
        dcase_upload(&per);
        dcase_upload(&all);

        /* One region per tensor: the tensor `pre` bytes into its region, the region reaching
         * 4 KiB past the tensor's end. */
        convd_region *regs[T_COUNT] = {0};
        uint64_t pre[T_COUNT] = {0};
        for (int i = 0; i < T_COUNT; i++) {
            if (per.bytes[i] == 0)
                continue;
            pre[i] = convd_dtype_size(p.dtype) * (uint64_t)tu_rng_range(it_rng(), 0, 8);
            uint64_t size = pre[i] + per.bytes[i] + 4096;
            if (per.at[i] - pre[i] + size > DEV_ALLOC)
                size = DEV_ALLOC - (per.at[i] - pre[i]);
            char what[160];
            snprintf(what, sizeof what, "%s, %s region", label, t_names[i]);
            regs[i] = dev_import(c, per.at[i] - pre[i], size, what);
        }
        /* One region for everything, starting a little before the first tensor. */
        uint64_t lo = all.at[T_IN], hi = 0;
        for (int i = 0; i < T_COUNT; i++) {
            if (all.bytes[i] == 0)
                continue;
            if (all.at[i] < lo)
                lo = all.at[i];
            if (all.at[i] + all.bytes[i] > hi)
                hi = all.at[i] + all.bytes[i];
        }
        const uint64_t shared_base = lo - convd_dtype_size(p.dtype) * 3;
        convd_region *one = dev_import(c, shared_base, hi - shared_base, label);

        struct convd_conv_args a1, a2;
        dcase_args(&per, regs, pre, false, 0, &a1);
        dcase_args(&all, &one, NULL, true, shared_base, &a2);
        uint64_t id1 = gd_submit(c, &a1, label);
        uint64_t id2 = gd_submit(c, &a2, label);
        struct convd_completion c1, c2;
        gd_wait(c, id1, label, &c1);
        gd_wait(c, id2, label, &c2);
        dcase_check(&per, &c1,
                    si % 2 == 0 ? "one region per tensor, 256-byte aligned tensors"
                                : "one region per tensor, element-aligned tensors");
        dcase_check(&all, &c2,
                    si % 2 == 1 ? "one region for all tensors, 256-byte aligned tensors"
                                : "one region for all tensors, element-aligned tensors");
        for (int i = 0; i < T_COUNT; i++)
            if (regs[i] != NULL)
                region_free_ok(c, regs[i], label);
        region_free_ok(c, one, label);
        dcase_fini(&per);
        dcase_fini(&all);
    }
    convd_close(c);
}

/* The input in a host region, everything else in device memory: staged and in-place tensors in
 * one request. */
static void test_device_mixed_with_host(void **state)
{
    (void)state;
    dev_setup();
    convd_client *c = it_connect(&g_d, "gpud-mixed");
    struct convd_problem p;
    gd_problem(it_rng(), FAM_CPG32, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC, true, true, &p);
    struct dcase d;
    dcase_init(&d, "mixed host input, device weight/bias/output", &p);
    uint64_t cursor = (uint64_t)1 << 20;
    dcase_place(&d, &cursor, true);
    dcase_upload(&d);
    convd_region *h = NULL;
    int rc = convd_region_create(c, (size_t)d.bytes[T_IN] + 64, &h);
    if (rc != 0)
        fail_msg("%s: convd_region_create: %s (%s)", d.label, convd_status_name(rc),
                 convd_errstr(c));
    memcpy((uint8_t *)convd_region_data(h) + 64, d.host[T_IN], d.bytes[T_IN]);
    const uint64_t base = d.at[T_W] - 128;
    convd_region *dr = dev_import(c, base, d.at[T_OUT] + d.bytes[T_OUT] - base, d.label);
    struct convd_conv_args a = CONVD_CONV_ARGS_INIT;
    a.problem = p;
    a.input = (struct convd_tensor){h, 64, d.bytes[T_IN]};
    a.weight = (struct convd_tensor){dr, d.at[T_W] - base, d.bytes[T_W]};
    a.bias = (struct convd_tensor){dr, d.at[T_B] - base, d.bytes[T_B]};
    a.output = (struct convd_tensor){dr, d.at[T_OUT] - base, d.bytes[T_OUT]};
    uint64_t id = gd_submit(c, &a, d.label);
    struct convd_completion cpl;
    gd_wait(c, id, d.label, &cpl);
    dcase_check(&d, &cpl, "input staged from host memory");
    region_free_ok(c, h, d.label);
    region_free_ok(c, dr, d.label);
    dcase_fini(&d);
    convd_close(c);
}

/* An output in one device region overlapping the input in another region of the same
 * allocation: only the daemon can see it (the client compares regions, not allocations). */
static void test_device_overlap_across_regions(void **state)
{
    (void)state;
    dev_setup();
    convd_client *c = it_connect(&g_d, "gpud-overlap");
    struct convd_problem p;
    gd_problem(it_rng(), FAM_DENSE, CONVD_DTYPE_FP32, CONVD_LAYOUT_NCHW, false, false, &p);
    struct convd_problem_sizes z;
    assert_int_equal(convd_problem_sizes(&p, &z, NULL, 0), 0);
    const uint64_t in_at = (uint64_t)2 << 20;
    const uint64_t out_at = in_at + ((z.input_bytes / 2) & ~(uint64_t)3); /* inside the input */
    const uint64_t w_at = in_at + z.input_bytes + z.output_bytes + 4096;
    convd_region *ri = dev_import(c, in_at, z.input_bytes, "overlap: input region");
    convd_region *ro = dev_import(c, out_at, z.output_bytes, "overlap: output region");
    convd_region *rw = dev_import(c, w_at, z.weight_bytes, "overlap: weight region");
    struct convd_conv_args a = CONVD_CONV_ARGS_INIT;
    a.problem = p;
    a.input = (struct convd_tensor){ri, 0, z.input_bytes};
    a.weight = (struct convd_tensor){rw, 0, z.weight_bytes};
    a.output = (struct convd_tensor){ro, 0, z.output_bytes};
    uint64_t id = 0;
    int rc = convd_conv_submit(c, &a, &id);
    struct convd_completion cpl;
    memset(&cpl, 0, sizeof cpl);
    const char *sentence = convd_errstr(c);
    if (rc == 0) {
        gd_wait(c, id, "overlap", &cpl);
        rc = cpl.status;
        sentence = cpl.error;
    }
    if (rc != CONVD_EINVAL || strstr(sentence, "overlap") == NULL)
        fail_msg("an output overlapping the input in another region of the same allocation "
                 "(allocation offsets %llu and %llu) should fail with EINVAL naming the overlap, "
                 "got %s: '%s'",
                 (unsigned long long)out_at, (unsigned long long)in_at, convd_status_name(rc),
                 sentence);
    fprintf(stderr, "overlap across regions: %s: %s\n", convd_status_name(rc), sentence);
    region_free_ok(c, ri, "overlap");
    region_free_ok(c, ro, "overlap");
    region_free_ok(c, rw, "overlap");
    convd_close(c);
}

/* Regions that reach past the allocation: EBOUNDS with a sentence naming the offset; the exact
 * allocation is fine; the daemon answers afterwards. */
static void test_device_bounds(void **state)
{
    (void)state;
    dev_setup();
    convd_client *c = it_connect(&g_d, "gpud-bounds");
    const struct {
        uint64_t offset, size;
        const char *what;
    } bad[] = {
        {DEV_ALLOC - 4096, 8192, "a region running 4 KiB past the allocation's end"},
        {4096, DEV_ALLOC, "a region at offset 4096 as large as the allocation"},
        {DEV_ALLOC, 1, "a region starting at the allocation's end"},
        {DEV_ALLOC + ((uint64_t)1 << 30), 4096, "a region starting 1 GiB past the allocation"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        convd_region *r = NULL;
        int rc =
            convd_region_import_gpu(c, g_handle, GD_HANDLE_BYTES, bad[i].offset, bad[i].size, &r);
        const char *why = convd_errstr(c);
        if (rc == 0) {
            (void)convd_region_free(r);
            fail_msg("%s (offset %llu, %llu bytes, allocation %llu bytes) was accepted",
                     bad[i].what, (unsigned long long)bad[i].offset,
                     (unsigned long long)bad[i].size, (unsigned long long)DEV_ALLOC);
        }
        char off[32];
        snprintf(off, sizeof off, "%llu", (unsigned long long)bad[i].offset);
        if (rc != CONVD_EBOUNDS || why[0] == '\0' || strstr(why, off) == NULL)
            fail_msg("%s (offset %llu, %llu bytes, allocation %llu bytes): want EBOUNDS with a "
                     "sentence naming offset %s, got %s: '%s'",
                     bad[i].what, (unsigned long long)bad[i].offset,
                     (unsigned long long)bad[i].size, (unsigned long long)DEV_ALLOC, off,
                     convd_status_name(rc), why);
        fprintf(stderr, "bounds: %s: %s: %s\n", bad[i].what, convd_status_name(rc), why);
        int prc = convd_ping(c, NULL);
        if (prc != 0)
            fail_msg("after refusing %s, the daemon does not answer a ping: %s (%s)", bad[i].what,
                     convd_status_name(prc), convd_errstr(c));
    }
    /* Exactly the whole allocation, and the last byte alone. */
    convd_region *whole = dev_import(c, 0, DEV_ALLOC, "the whole allocation");
    convd_region *last = dev_import(c, DEV_ALLOC - 1, 1, "the allocation's last byte");
    region_free_ok(c, whole, "bounds");
    region_free_ok(c, last, "bounds");
    gd_expect_alive(&g_d, "after out-of-bounds regions");
    convd_close(c);
}

/* One device-memory convolution through c that must succeed. */
static void gd_device_conv(convd_client *c, uint64_t at, const char *what)
{
    dev_setup();
    struct convd_problem p;
    gd_problem(it_rng(), FAM_CPG4, CONVD_DTYPE_BF16, CONVD_LAYOUT_NHWC, true, true, &p);
    struct dcase d;
    dcase_init(&d, what, &p);
    uint64_t cursor = at;
    dcase_place(&d, &cursor, true);
    dcase_upload(&d);
    const uint64_t base = d.at[T_IN] - 256;
    convd_region *r = dev_import(c, base, cursor - base, what);
    convd_region *regs[1] = {r};
    struct convd_conv_args a;
    dcase_args(&d, regs, NULL, true, base, &a);
    uint64_t id = gd_submit(c, &a, what);
    struct convd_completion cpl;
    gd_wait(c, id, what, &cpl);
    dcase_check(&d, &cpl, "a device-memory convolution");
    region_free_ok(c, r, what);
    dcase_fini(&d);
}

/* Handles that name nothing are refused with a sentence; the daemon still answers and serves, on
 * host and on device memory. */
static void test_device_bad_handles(void **state)
{
    (void)state;
    dev_setup();
    convd_client *c = it_connect(&g_d, "gpud-bad-handle");
    uint8_t junk[3][GD_HANDLE_BYTES];
    for (size_t i = 0; i < GD_HANDLE_BYTES; i++)
        junk[0][i] = (uint8_t)tu_rng_next(it_rng());
    memset(junk[1], 0, GD_HANDLE_BYTES);
    memset(junk[2], 0xff, GD_HANDLE_BYTES);
    const char *names[3] = {"random handle bytes", "an all-zero handle", "an all-ones handle"};
    for (int i = 0; i < 3; i++) {
        convd_region *r = NULL;
        int rc = convd_region_import_gpu(c, junk[i], GD_HANDLE_BYTES, 4096, 4096, &r);
        if (rc == 0) {
            (void)convd_region_free(r);
            fail_msg("%s was accepted as a GPU region", names[i]);
        }
        const char *why = convd_errstr(c);
        if (why[0] == '\0')
            fail_msg("%s was refused (%s) without a sentence", names[i], convd_status_name(rc));
        fprintf(stderr, "bad handle: %s: %s: %s\n", names[i], convd_status_name(rc), why);
        gd_expect_alive(&g_d, names[i]);
        int prc = convd_ping(c, NULL);
        if (prc != 0)
            fail_msg("after refusing %s, the daemon does not answer a ping: %s (%s)", names[i],
                     convd_status_name(prc), convd_errstr(c));
    }
    gd_host_conv(c, "a host-region request after bad handles");
    gd_device_conv(c, (uint64_t)3 << 20, "a device-memory request after bad handles");
    convd_close(c);
}

/* ------------------------------------------------------------------------------------------- */
/* Afterwards: still serving, nothing left registered, SIGTERM exits 0. */

static void test_still_serving_then_sigterm(void **state)
{
    (void)state;
    gd_expect_alive(&g_d, "after all tests");
    /* Every other client has closed; the daemon releases their regions asynchronously. */
    uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
    struct convd_status st;
    double regions = -1, mapped = -1;
    int maps = -1;
    for (;;) {
        int rc = convd_status_get(g_d.mon, &st);
        if (rc != 0)
            fail_msg("the daemon stopped answering status: %s (%s)", convd_status_name(rc),
                     convd_errstr(g_d.mon));
        bool have = it_metric(g_d.mon, IT_METRIC_REGIONS, &regions) &&
                    it_metric(g_d.mon, IT_METRIC_MAPPED_BYTES, &mapped);
        maps = it_count_memfd_maps(g_d.pid);
        if (have && st.clients == 1 && st.inflight == 0 && regions == 0 && mapped == 0 && maps == 0)
            break;
        if (tu_now_ms() > end)
            fail_msg("the daemon did not return to rest: clients %u (want 1), in flight %u, "
                     "regions %.0f, mapped bytes %.0f, memfd mappings %d",
                     st.clients, st.inflight, regions, mapped, maps);
        tu_sleep_ms(20);
    }
    fprintf(stderr,
            "at rest: served %llu, failed %llu, %llu batches; daemon descriptors %d (%d after "
            "start-up)\n",
            (unsigned long long)st.requests_served, (unsigned long long)st.requests_failed,
            (unsigned long long)st.batches, it_count_fds(g_d.pid), g_d.base_fds);
    if (strcmp(st.backend, "gpu") != 0)
        fail_msg("StatusReply.backend is '%s' at the end", st.backend);
    /* The device's gauges (the backend's stats op): memory in use within the device's total. */
    double used = -1, total = -1;
    if (!it_metric(g_d.mon, "convd_device_memory_used_bytes", &used) ||
        !it_metric(g_d.mon, "convd_device_memory_total_bytes", &total))
        fail_msg("the GPU daemon's metrics have no device memory gauges");
    if (!(used > 0 && used <= total))
        fail_msg("device memory gauges: %.0f used of %.0f", used, total);
    assert_int_equal(convd_ping(g_d.mon, NULL), 0);
    gd_host_conv(g_d.mon, "a host-region request at the end");
    if (g_dev != NULL)
        gd_device_conv(g_d.mon, (uint64_t)5 << 20, "a device-memory request at the end");
    it_daemon_stop(&g_d);
}

/* Device tensors at offsets that are not a multiple of their element size, in a daemon of their
 * own: the request may succeed (with the right output) or be refused, but it must not take the
 * GPU down: the same daemon must serve a good device request afterwards and exit 0 on SIGTERM. */
static void test_device_misaligned_elements(void **state)
{
    (void)state;
    dev_setup();
    char why[400];
    if (gd_daemon_start(&g_d2, why, sizeof why) != 0)
        fail_msg("misaligned: a second daemon did not start: %s", why);
    convd_client *c = it_connect(&g_d2, "gpud-misaligned");
    const struct {
        uint64_t region_at, tensor_pad;
        enum convd_dtype dt;
        const char *what;
    } cases[] = {
        {((uint64_t)6 << 20) + 2, 0, CONVD_DTYPE_FP32,
         "fp32 tensors in a region at an allocation offset of 2 mod 4"},
        {(uint64_t)6 << 20, 1, CONVD_DTYPE_FP16, "fp16 tensors at odd byte offsets of a region"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct convd_problem p;
        gd_problem(it_rng(), FAM_CPG4, cases[k].dt, CONVD_LAYOUT_NHWC, false, false, &p);
        struct dcase d;
        dcase_init(&d, cases[k].what, &p);
        /* Region offsets of input, weight and output; the input and the output misaligned. */
        const uint64_t pad = cases[k].tensor_pad;
        const uint64_t o_in = pad, o_w = o_in + d.bytes[T_IN] + 64 + pad;
        const uint64_t o_out = o_w + d.bytes[T_W] + 64 + pad;
        d.at[T_IN] = cases[k].region_at + o_in;
        d.at[T_W] = cases[k].region_at + o_w;
        d.at[T_OUT] = cases[k].region_at + o_out;
        dcase_upload(&d);
        convd_region *r =
            dev_import(c, cases[k].region_at, o_out + d.bytes[T_OUT] + 64, cases[k].what);
        convd_region *regs[1] = {r};
        struct convd_conv_args a;
        dcase_args(&d, regs, NULL, true, cases[k].region_at, &a);
        uint64_t id = 0;
        int rc = convd_conv_submit(c, &a, &id);
        char ps[200];
        if (rc == 0) {
            struct convd_completion cpl;
            gd_wait(c, id, cases[k].what, &cpl);
            fprintf(stderr, "misaligned: %s (%s): %s%s%s\n", cases[k].what,
                    gd_pstr(&p, ps, sizeof ps), convd_status_name(cpl.status),
                    cpl.status ? ": " : "", cpl.status ? cpl.error : "");
            if (cpl.status == CONVD_EDEVICE)
                fail_msg("misaligned: %s (%s) took the GPU down: %s: %s. The daemon should refuse "
                         "device tensors whose address is not a multiple of the element size "
                         "(EINVAL) instead of launching a kernel on them",
                         cases[k].what, gd_pstr(&p, ps, sizeof ps), convd_status_name(cpl.status),
                         cpl.error);
            if (cpl.status == 0)
                dcase_check(&d, &cpl, "accepted although misaligned");
        } else {
            fprintf(stderr, "misaligned: %s: refused by the client: %s: %s\n", cases[k].what,
                    convd_status_name(rc), convd_errstr(c));
        }
        region_free_ok(c, r, cases[k].what);
        dcase_fini(&d);
        gd_expect_alive(&g_d2, cases[k].what);
        char after[200];
        snprintf(after, sizeof after, "a good device request after %s", cases[k].what);
        gd_device_conv(c, (uint64_t)8 << 20, after);
    }
    convd_close(c);
    it_daemon_stop(&g_d2);
}

/* ------------------------------------------------------------------------------------------- */

static int group_teardown(void **state)
{
    (void)state;
    it_daemon_kill(&g_d);
    it_daemon_kill(&g_d2);
    if (g_dev != NULL) {
        rt_free(g_dev);
        g_dev = NULL;
    }
    return 0;
}

int main(void)
{
    char why[400];
    int count = gd_probe(why, sizeof why);
    if (count <= 0) {
        printf("SKIP: no GPU (%s)\n", why);
        return 77;
    }
    fprintf(stderr, "GPU probe: %s\n", why);
    (void)it_rng(); /* prints the seed */
    if (gd_daemon_start(&g_d, why, sizeof why) != 0) {
        fprintf(stderr,
                "FAIL: the GPU daemon did not start although the runtime sees %d "
                "device(s): %s\n",
                count, why);
        return 1;
    }
    g_d2.stopped = true;
    struct convd_server_info info;
    convd_server_info(g_d.mon, &info);
    if (strcmp(info.backend, "gpu") != 0) {
        printf("SKIP: no GPU (the daemon serves from its %s backend: %s)\n", info.backend,
               info.device);
        it_daemon_kill(&g_d);
        return 77;
    }

    /* The order matters: test_batching forks client processes, so it runs before the first
     * test that calls the GPU runtime in this process (dev_setup). */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handshake_says_gpu),
        cmocka_unit_test(test_host_regions),
        cmocka_unit_test(test_tf32_requests),
        cmocka_unit_test(test_batching),
        cmocka_unit_test(test_device_regions),
        cmocka_unit_test(test_device_mixed_with_host),
        cmocka_unit_test(test_device_overlap_across_regions),
        cmocka_unit_test(test_device_bounds),
        cmocka_unit_test(test_device_bad_handles),
        cmocka_unit_test(test_still_serving_then_sigterm),
        cmocka_unit_test(test_device_misaligned_elements),
    };
    return cmocka_run_group_tests(tests, NULL, group_teardown);
}
