/*
 * The GPU backend (convd_gpu_backend_ops) against the double-precision reference, through the
 * same calls the daemon makes: init, mem_import of memfd host regions and of device memory by a
 * real IPC handle from another process, run_batch, the asynchronous launch / query / notify on
 * slots, trim, mem_release, destroy.
 *
 * Needs a GPU: without one (no device, no driver) it prints why and exits 77, which ctest counts
 * as skipped. Every failure prints the problem, the kernel family, the job's status and sentence
 * and the relative error, so that one run on the GPU machine tells everything.
 *
 * The IPC peer: a CUDA (HIP) process may not fork after touching the runtime, so main() forks a
 * peer process before any GPU call. The peer does nothing until the parent asks: it then
 * allocates device memory, writes what the parent sends into it, exports the IPC handle, and
 * reads results back from its own allocation to check them against a reference the parent sends.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#ifndef CONVD_HAVE_GPU
#define CONVD_HAVE_GPU 1
#endif
#include "backend.h"
#include "convd_kernels.h"
#include "testutil.h"

/* The few runtime calls the test itself makes (device presence, the peer's allocation), in C. */
#ifdef CONVD_TEST_AMD
#include <hip/hip_runtime_api.h>
typedef hipError_t rt_error;
typedef hipIpcMemHandle_t rt_ipc_handle;
#define RT_OK                   hipSuccess
#define rt_get_device_count     hipGetDeviceCount
#define rt_set_device           hipSetDevice
#define rt_malloc               hipMalloc
#define rt_free                 hipFree
#define rt_error_string         hipGetErrorString
#define rt_ipc_get_handle       hipIpcGetMemHandle
#define rt_memcpy_htod(d, s, n) hipMemcpy((d), (s), (n), hipMemcpyHostToDevice)
#define rt_memcpy_dtoh(d, s, n) hipMemcpy((d), (s), (n), hipMemcpyDeviceToHost)
#define rt_device_synchronize   hipDeviceSynchronize
#define rt_mem_get_info         hipMemGetInfo
#else
#include <cuda_runtime_api.h>
typedef cudaError_t rt_error;
typedef cudaIpcMemHandle_t rt_ipc_handle;
#define RT_OK                   cudaSuccess
#define rt_get_device_count     cudaGetDeviceCount
#define rt_set_device           cudaSetDevice
#define rt_malloc               cudaMalloc
#define rt_free                 cudaFree
#define rt_error_string         cudaGetErrorString
#define rt_ipc_get_handle       cudaIpcGetMemHandle
#define rt_memcpy_htod(d, s, n) cudaMemcpy((d), (s), (n), cudaMemcpyHostToDevice)
#define rt_memcpy_dtoh(d, s, n) cudaMemcpy((d), (s), (n), cudaMemcpyDeviceToHost)
#define rt_device_synchronize   cudaDeviceSynchronize
#define rt_mem_get_info         cudaMemGetInfo
#endif

static const struct convd_backend_ops *const ops = &convd_gpu_backend_ops;

/* The backend shared by the tests of the group (one warm-up for all). */
static void *g_ctx;
/* The group runs twice: batches reported done through completion words (the daemon's default),
 * then through events. */
static bool g_flags;
static struct convd_backend_info g_info;
static struct tu_rng g_rng;

/* ------------------------------------------------------------------------------------------- */
/* Host regions: a sealed memfd mapped MAP_SHARED, as the daemon maps a client's region. */

struct host_region {
    struct convd_mem mem;
    int fd;
    int imported;
};

static void region_open(struct host_region *r, size_t size, int prot)
{
    memset(r, 0, sizeof *r);
    r->fd = tu_memfd("convd-gpu-test", size, F_SEAL_SHRINK | F_SEAL_GROW);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    assert_true(p != MAP_FAILED);
    /* Fill while writable; a read-only test mapping is made read-only afterwards. */
    tu_poison(p, size);
    if (prot != (PROT_READ | PROT_WRITE))
        assert_int_equal(mprotect(p, size, prot), 0);
    r->mem.kind = CONVD_MEM_HOST;
    r->mem.size = size;
    r->mem.host = p;
}

static void region_import(struct host_region *r)
{
    char why[256] = "";
    int rc = ops->mem_import(g_ctx, &r->mem, why, sizeof why);
    if (rc != 0)
        fail_msg("mem_import of a %llu-byte host region: %s: %s", (unsigned long long)r->mem.size,
                 convd_status_name(rc), why);
    if (why[0])
        fprintf(stderr, "note: mem_import said: %s\n", why);
    r->imported = 1;
}

static void region_close(struct host_region *r)
{
    if (r->imported)
        ops->mem_release(g_ctx, &r->mem);
    if (r->mem.host)
        munmap(r->mem.host, (size_t)r->mem.size);
    if (r->fd >= 0)
        close(r->fd);
    memset(r, 0, sizeof *r);
    r->fd = -1;
}

/* ------------------------------------------------------------------------------------------- */
/* Problems and jobs. */

enum family { FAM_DEPTHWISE, FAM_SMALL_CPG, FAM_WIDE_CPG, FAM_DENSE, FAM_COUNT };
static const char *const family_names[FAM_COUNT] = {"depthwise", "small cpg", "cpg >= 17", "dense"};

/* A random valid problem of a family: depthwise (cpg = kpg = 1), small (2-16 channels per
 * group), wide (17-80 per group, 1-2 groups), dense (groups = 1). Geometry (stride, dilation,
 * asymmetric padding, odd sizes, bias, ReLU) from tu_random_problem. */
static void make_problem(struct tu_rng *g, enum family fam, enum convd_dtype dt,
                         enum convd_layout lay, struct convd_problem *p)
{
    for (;;) {
        tu_random_problem(g, p, dt, lay, 4);
        int groups = 1, cpg = 1, kpg = 1;
        switch (fam) {
        case FAM_DEPTHWISE:
            groups = tu_rng_range(g, 1, 48);
            break;
        case FAM_SMALL_CPG:
            groups = tu_rng_range(g, 1, 8);
            cpg = tu_rng_range(g, 2, 16);
            kpg = tu_rng_range(g, 2, 16);
            break;
        case FAM_WIDE_CPG:
            groups = tu_rng_range(g, 1, 2);
            cpg = tu_rng_range(g, 17, 80);
            kpg = tu_rng_range(g, 17, 80);
            p->n = tu_rng_range(g, 1, 2);
            break;
        default:
            cpg = tu_rng_range(g, 1, 96);
            kpg = tu_rng_range(g, 1, 96);
            p->n = tu_rng_range(g, 1, 2);
            break;
        }
        p->groups = groups;
        p->c = groups * cpg;
        p->k = groups * kpg;
        if (convd_problem_check(p, NULL, 0) == 0)
            return;
    }
}

/* One test job: a problem, where its tensors live, and the reference output. */
struct tjob {
    struct convd_problem p;
    struct convd_problem_sizes sz;
    struct convd_job job;
    float *ref;
};

/* Bytes to skip before a tensor: a non-zero multiple of 4 (the reference reads floats), rarely
 * a multiple of 256, so staged copies start at odd host addresses. */
static uint64_t random_gap(struct tu_rng *g)
{
    return 4u * (uint64_t)tu_rng_range(g, 1, 300);
}

/* Bytes a host region needs for the four tensors of p with gaps. */
static uint64_t region_bytes_for(const struct convd_problem_sizes *sz)
{
    return sz->input_bytes + sz->weight_bytes + sz->bias_bytes + sz->output_bytes + 4 * 1200 + 64;
}

static void view_set(struct convd_tensor_view *v, struct convd_mem *m, uint64_t offset,
                     uint64_t bytes)
{
    v->mem = m;
    v->offset = offset;
    v->bytes = bytes;
}

/* Places the tensors of t in region r from *cursor on (with random gaps), fills input, weight
 * and bias with fresh random data, poisons the output and computes the reference. */
static void tjob_place_host(struct tjob *t, struct host_region *r, uint64_t *cursor)
{
    struct convd_mem *m = &r->mem;
    char *base = (char *)m->host;
    uint64_t at = *cursor;
    at += random_gap(&g_rng);
    view_set(&t->job.input, m, at, t->sz.input_bytes);
    at += t->sz.input_bytes + random_gap(&g_rng);
    view_set(&t->job.weight, m, at, t->sz.weight_bytes);
    at += t->sz.weight_bytes + random_gap(&g_rng);
    if (t->p.has_bias) {
        view_set(&t->job.bias, m, at, t->sz.bias_bytes);
        at += t->sz.bias_bytes + random_gap(&g_rng);
    }
    view_set(&t->job.output, m, at, t->sz.output_bytes);
    at += t->sz.output_bytes;
    assert_true(at <= m->size);
    *cursor = at;
    tu_fill_random(&g_rng, t->p.dtype, base + t->job.input.offset, t->sz.input_elems);
    tu_fill_random(&g_rng, t->p.dtype, base + t->job.weight.offset, t->sz.weight_elems);
    if (t->p.has_bias)
        tu_fill_random(&g_rng, t->p.dtype, base + t->job.bias.offset, t->sz.bias_elems);
    tu_poison(base + t->job.output.offset, t->sz.output_bytes);
}

static void tjob_init(struct tjob *t, const struct convd_problem *p)
{
    memset(t, 0, sizeof *t);
    t->p = *p;
    assert_int_equal(convd_problem_sizes(p, &t->sz, NULL, 0), 0);
    t->job.problem = *p;
    t->job.status = 12345; /* must be overwritten */
}

static const void *view_host(const struct convd_tensor_view *v)
{
    return v->mem ? (const char *)v->mem->host + v->offset : NULL;
}

/* Computes the reference from the job's host tensors. */
static void tjob_reference(struct tjob *t)
{
    t->ref = malloc(t->sz.output_elems * sizeof(float));
    assert_non_null(t->ref);
    tu_ref_conv(&t->p, view_host(&t->job.input), view_host(&t->job.weight),
                t->p.has_bias ? view_host(&t->job.bias) : NULL, t->ref);
}

/* A job of problem p alone in a host region of its own: placed, its reference computed, the
 * region imported. */
static void tjob_alone(struct tjob *t, struct host_region *r, const struct convd_problem *p)
{
    tjob_init(t, p);
    region_open(r, region_bytes_for(&t->sz), PROT_READ | PROT_WRITE);
    uint64_t cursor = 0;
    tjob_place_host(t, r, &cursor);
    tjob_reference(t);
    region_import(r);
}

static void tjob_free(struct tjob *t)
{
    free(t->ref);
    t->ref = NULL;
}

/* Describes a job for failure messages. */
static const char *tjob_str(const struct tjob *t, char *buf, size_t len)
{
    char ps[160];
    snprintf(buf, len, "[%s] %s", convd_gpu_kernel_name(&t->p),
             convd_problem_str(&t->p, ps, sizeof ps));
    return buf;
}

/* Asserts that the job succeeded and that its output (host memory) matches the reference. */
static void tjob_expect_ok(const struct tjob *t, const char *what)
{
    char d[256];
    if (t->job.status != 0)
        fail_msg("%s: %s: status %d (%s): %s", what, tjob_str(t, d, sizeof d), t->job.status,
                 convd_status_name(t->job.status), t->job.error);
    size_t bad = 0;
    const void *out = view_host(&t->job.output);
    double err = tu_rel_error(t->p.dtype, out, t->ref, t->sz.output_elems, &bad);
    if (!(err <= tu_tolerance(t->p.dtype)))
        fail_msg("%s: %s: relative error %.3g > %.3g; element %zu of %llu is %g, reference %g",
                 what, tjob_str(t, d, sizeof d), err, tu_tolerance(t->p.dtype), bad,
                 (unsigned long long)t->sz.output_elems, (double)tu_load(t->p.dtype, out, bad),
                 (double)t->ref[bad]);
}

static void run_jobs(unsigned worker, struct tjob *const *t, size_t n, int expect_rc)
{
    struct convd_job *jobs[64];
    assert_true(n <= 64);
    for (size_t i = 0; i < n; i++)
        jobs[i] = &t[i]->job;
    int rc = ops->run_batch(g_ctx, worker, jobs, n);
    if (rc != expect_rc)
        fail_msg("run_batch(worker %u, %zu jobs) returned %d (%s), expected %d; first job: %s",
                 worker, n, rc, convd_status_name(rc), expect_rc, n ? jobs[0]->error : "");
}

/* ------------------------------------------------------------------------------------------- */
/* Tests on host memory. */

static int group_setup(void **state)
{
    (void)state;
    struct convd_backend_config cfg = {0};
    cfg.device = -1;
    cfg.max_batch = 64;
    cfg.completion_flags = g_flags;
    char why[256] = "";
    int rc = ops->init(&cfg, &g_ctx, &g_info, why, sizeof why);
    if (rc != 0) {
        fprintf(stderr, "GPU backend init failed: %s: %s\n", convd_status_name(rc), why);
        return -1;
    }
    fprintf(stderr, "GPU backend: %s, %s, %u workers, %u slots, completion by %s\n", g_info.name,
            g_info.device, g_info.max_workers, g_info.max_slots, g_flags ? "words" : "events");
#ifndef CONVD_TEST_AMD
    /* Every NVIDIA GPU this project supports has stream memory operations: a fall-back to
     * events there would be a bug, not the driver's choice. */
    if (g_flags && strstr(g_info.device, "completion by events") != NULL) {
        fprintf(stderr, "completion words were refused on an NVIDIA GPU\n");
        return -1;
    }
#endif
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    ops->destroy(g_ctx);
    g_ctx = NULL;
    return 0;
}

static void test_init_destroy(void **state)
{
    (void)state;
    struct convd_backend_config cfg = {0};
    cfg.device = -1;
    void *ctx = NULL;
    struct convd_backend_info info;
    char why[256] = "";
    int rc = ops->init(&cfg, &ctx, &info, why, sizeof why);
    if (rc != 0)
        fail_msg("init: %s: %s", convd_status_name(rc), why);
    assert_non_null(ctx);
    assert_string_equal(info.name, "gpu");
    assert_int_equal(info.max_workers, 2);
    assert_int_equal(info.max_slots, 16);
    assert_int_equal(info.default_slots, 4);
    assert_non_null(ops->launch);
    assert_non_null(ops->query);
    assert_non_null(ops->notify);
    assert_non_null(ops->trim);
    if (!strstr(info.device, "GiB)") || !strstr(info.device, " ("))
        fail_msg("device description '%s' lacks the '(arch, SMs, GiB)' part", info.device);
    ops->destroy(ctx);
    ops->destroy(NULL);

    /* A device that does not exist: a clear failure, *ret_ctx untouched. */
    cfg.device = 4096;
    void *sentinel = (void *)&cfg;
    ctx = sentinel;
    why[0] = '\0';
    rc = ops->init(&cfg, &ctx, &info, why, sizeof why);
    assert_int_equal(rc, CONVD_EDEVICE);
    assert_ptr_equal(ctx, sentinel);
    assert_true(why[0] != '\0');
    fprintf(stderr, "init on GPU 4096 says: %s\n", why);
    assert_string_equal(ops->name, "gpu");
}

/* Random problems of every family, dtype and layout, one job per batch on alternating workers,
 * tensors at random non-zero offsets of a host region. */
static void test_host_random(void **state)
{
    (void)state;
    int ran[FAM_COUNT] = {0}, skipped[FAM_COUNT] = {0};
    unsigned worker = 0;
    for (int fam = 0; fam < FAM_COUNT; fam++) {
        for (int dt = CONVD_DTYPE_FP32; dt <= CONVD_DTYPE_BF16; dt++) {
            for (int lay = CONVD_LAYOUT_NCHW; lay <= CONVD_LAYOUT_NHWC; lay++) {
                struct convd_problem p;
                make_problem(&g_rng, (enum family)fam, (enum convd_dtype)dt, (enum convd_layout)lay,
                             &p);
                char why[256] = "", ps[160];
                int rc = ops->supports(g_ctx, &p, why, sizeof why);
                if (rc != 0) {
                    fprintf(stderr, "unsupported (%s): %s: %s\n", convd_status_name(rc),
                            convd_problem_str(&p, ps, sizeof ps), why);
                    skipped[fam]++;
                    continue;
                }
                struct tjob t;
                struct host_region r;
                tjob_alone(&t, &r, &p);
                struct tjob *tp = &t;
                run_jobs(worker, &tp, 1, 0);
                worker ^= 1;
                tjob_expect_ok(&t, family_names[fam]);
                assert_true(t.job.exec_ns > 0);
                tjob_free(&t);
                region_close(&r);
                ran[fam]++;
            }
        }
    }
    for (int fam = 0; fam < FAM_COUNT; fam++) {
        fprintf(stderr, "%s: %d run, %d unsupported\n", family_names[fam], ran[fam], skipped[fam]);
        if (ran[fam] == 0)
            fail_msg("no problem of the %s family was supported", family_names[fam]);
    }
}

/* One batch: four jobs of one problem (two in one region, one sharing the other's weights, one in
 * a second region) interleaved with a job of another problem. Each must match its reference. */
static void test_host_batch_grouped(void **state)
{
    (void)state;
    struct convd_problem pa, pb;
    for (int tries = 0;; tries++) {
        assert_true(tries < 100);
        make_problem(&g_rng, FAM_SMALL_CPG, 0, 0, &pa);
        if (ops->supports(g_ctx, &pa, NULL, 0) == 0)
            break;
    }
    for (int tries = 0;; tries++) {
        assert_true(tries < 100);
        make_problem(&g_rng, FAM_DEPTHWISE, 0, 0, &pb);
        if (ops->supports(g_ctx, &pb, NULL, 0) == 0 && !convd_problem_same(&pa, &pb))
            break;
    }
    struct tjob t[5];
    tjob_init(&t[0], &pa);
    tjob_init(&t[1], &pa);
    tjob_init(&t[2], &pb);
    tjob_init(&t[3], &pa);
    tjob_init(&t[4], &pa);
    struct host_region r1, r2;
    region_open(&r1, 3 * region_bytes_for(&t[0].sz) + region_bytes_for(&t[2].sz),
                PROT_READ | PROT_WRITE);
    region_open(&r2, region_bytes_for(&t[0].sz), PROT_READ | PROT_WRITE);
    uint64_t c1 = 0, c2 = 0;
    tjob_place_host(&t[0], &r1, &c1);
    tjob_place_host(&t[1], &r1, &c1);
    tjob_place_host(&t[2], &r1, &c1);
    tjob_place_host(&t[3], &r1, &c1);
    /* t[3] shares t[1]'s weights (and bias): the backend stages them once. */
    t[3].job.weight = t[1].job.weight;
    t[3].job.bias = t[1].job.bias;
    tjob_place_host(&t[4], &r2, &c2);
    for (int i = 0; i < 5; i++)
        tjob_reference(&t[i]);
    region_import(&r1);
    region_import(&r2);
    struct tjob *tp[5] = {&t[0], &t[1], &t[2], &t[3], &t[4]};
    run_jobs(1, tp, 5, 0);
    for (int i = 0; i < 5; i++) {
        char what[32];
        snprintf(what, sizeof what, "batched job %d", i);
        tjob_expect_ok(&t[i], what);
        tjob_free(&t[i]);
    }
    region_close(&r1);
    region_close(&r2);
}

/* Bad jobs fail alone, with a status, and leave the rest of the batch alone; a bad worker index
 * fails the batch without touching the device. */
static void test_host_bad_jobs(void **state)
{
    (void)state;
    struct convd_problem p;
    for (int tries = 0;; tries++) {
        assert_true(tries < 100);
        make_problem(&g_rng, FAM_SMALL_CPG, CONVD_DTYPE_FP32, 0, &p);
        if (ops->supports(g_ctx, &p, NULL, 0) == 0)
            break;
    }
    struct tjob t[3];
    struct host_region r;
    tjob_init(&t[0], &p);
    tjob_init(&t[1], &p);
    tjob_init(&t[2], &p);
    region_open(&r, 3 * region_bytes_for(&t[0].sz), PROT_READ | PROT_WRITE);
    uint64_t c = 0;
    for (int i = 0; i < 3; i++) {
        tjob_place_host(&t[i], &r, &c);
        tjob_reference(&t[i]);
    }
    region_import(&r);
    /* t[1]'s output runs past the end of its region; t[2]'s weight view is too short. */
    t[1].job.output.offset = r.mem.size - t[1].sz.output_bytes / 2;
    t[2].job.weight.bytes = t[2].sz.weight_bytes - 1;
    struct tjob *tp[3] = {&t[0], &t[1], &t[2]};
    run_jobs(0, tp, 3, 0);
    tjob_expect_ok(&t[0], "the good job of a batch with bad ones");
    if (t[1].job.status != CONVD_EBOUNDS)
        fail_msg("output past the region: status %s (%s), expected EBOUNDS",
                 convd_status_name(t[1].job.status), t[1].job.error);
    if (t[2].job.status != CONVD_ESIZE)
        fail_msg("short weight view: status %s (%s), expected ESIZE",
                 convd_status_name(t[2].job.status), t[2].job.error);
    fprintf(stderr, "bad job sentences: '%s' / '%s'\n", t[1].job.error, t[2].job.error);

    /* Worker index out of range. */
    tu_poison((char *)r.mem.host + t[0].job.output.offset, t[0].sz.output_bytes);
    run_jobs(2, tp, 1, CONVD_EINVAL);
    assert_int_equal(t[0].job.status, CONVD_EINVAL);
    assert_true(t[0].job.error[0] != '\0');

    /* Invalid memory descriptions. */
    struct convd_mem bad;
    memset(&bad, 0, sizeof bad);
    bad.kind = CONVD_MEM_HOST;
    bad.size = 0;
    bad.host = r.mem.host;
    char why[256] = "";
    assert_int_equal(ops->mem_import(g_ctx, &bad, why, sizeof why), CONVD_EINVAL);
    assert_null(bad.be_priv);
    ops->mem_release(g_ctx, &bad); /* never imported: a no-op */
    ops->mem_release(g_ctx, NULL);

    for (int i = 0; i < 3; i++)
        tjob_free(&t[i]);
    region_close(&r);
}

/* Inputs in a read-only mapping: pinning such memory may fail, and the region must stay usable
 * with pageable copies. */
static void test_host_readonly_inputs(void **state)
{
    (void)state;
    struct convd_problem p;
    for (int tries = 0;; tries++) {
        assert_true(tries < 100);
        make_problem(&g_rng, FAM_DENSE, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC, &p);
        if (ops->supports(g_ctx, &p, NULL, 0) == 0)
            break;
    }
    struct tjob t;
    tjob_init(&t, &p);
    struct host_region in, out;
    region_open(&in, region_bytes_for(&t.sz), PROT_READ | PROT_WRITE);
    region_open(&out, t.sz.output_bytes + 4096, PROT_READ | PROT_WRITE);
    uint64_t c = 0;
    tjob_place_host(&t, &in, &c);
    tjob_reference(&t);
    view_set(&t.job.output, &out.mem, 4096 - 4 * 7, t.sz.output_bytes);
    tu_poison((char *)out.mem.host + t.job.output.offset, t.sz.output_bytes);
    assert_int_equal(mprotect(in.mem.host, (size_t)in.mem.size, PROT_READ), 0);
    region_import(&in);
    region_import(&out);
    struct tjob *tp = &t;
    run_jobs(0, &tp, 1, 0);
    tjob_expect_ok(&t, "inputs in a read-only mapping");
    tjob_free(&t);
    region_close(&in);
    region_close(&out);
}

/* A backend whose staging pool is capped at 1 MiB per worker: a batch of 20 jobs that needs
 * about 1.5 MiB runs in several launches, each job correct; a job that alone needs more than the
 * cap fails with CONVD_ENOMEM and a sentence, and the rest of its batch runs. */
static void test_pool_limit_chunks(void **state)
{
    (void)state;
    struct convd_backend_config cfg = {0};
    cfg.device = -1;
    cfg.pool_bytes = (uint64_t)1 << 20;
    void *small = NULL;
    struct convd_backend_info info;
    char why[256] = "";
    int rc = ops->init(&cfg, &small, &info, why, sizeof why);
    if (rc != 0)
        fail_msg("init with a 1 MiB pool: %s: %s", convd_status_name(rc), why);
    void *saved = g_ctx;
    g_ctx = small; /* the helpers below import into and run on g_ctx */

    /* 16x16, 32 channels in 4 groups, fp32 NHWC: about 74 KB of staging per job. */
    struct convd_problem p, big;
    convd_problem_init(&p, 1, 16, 16, 32, 32, 3, 3, 4);
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
    p.layout = CONVD_LAYOUT_NHWC;
    p.has_bias = true;
    big = p;
    big.h = big.w = 96; /* 1.2 MB of input alone */
    enum { NJOBS = 20 };
    static struct tjob t[NJOBS + 1];
    struct tjob *tp[NJOBS + 1];
    for (int i = 0; i < NJOBS; i++)
        tjob_init(&t[i], &p);
    tjob_init(&t[NJOBS], &big);
    struct host_region r;
    region_open(&r, NJOBS * region_bytes_for(&t[0].sz) + region_bytes_for(&t[NJOBS].sz),
                PROT_READ | PROT_WRITE);
    uint64_t c = 0;
    for (int i = 0; i <= NJOBS; i++) {
        tjob_place_host(&t[i], &r, &c);
        tp[i] = &t[i];
    }
    for (int i = 0; i < NJOBS; i++)
        tjob_reference(&t[i]);
    region_import(&r);
    /* The big job in the middle of the batch. */
    struct tjob *order[NJOBS + 1];
    for (int i = 0, k = 0; i <= NJOBS; i++)
        order[i] = i == NJOBS / 2 ? tp[NJOBS] : tp[k++];
    run_jobs(1, order, NJOBS + 1, 0);
    for (int i = 0; i < NJOBS; i++) {
        char what[48];
        snprintf(what, sizeof what, "job %d of a batch larger than the pool", i);
        tjob_expect_ok(&t[i], what);
        tjob_free(&t[i]);
    }
    if (t[NJOBS].job.status != CONVD_ENOMEM || !t[NJOBS].job.error[0])
        fail_msg("a job larger than the pool: status %s (%s), expected ENOMEM with a sentence",
                 convd_status_name(t[NJOBS].job.status), t[NJOBS].job.error);
    fprintf(stderr, "job larger than the pool: %s\n", t[NJOBS].job.error);
    region_close(&r);
    g_ctx = saved;
    ops->destroy(small);
}

/* Both workers at once, as the daemon runs them: each thread runs its own batches. */
struct worker_arg {
    unsigned worker;
    int rounds;
    uint64_t seed;
    char failure[512];
};

static void *worker_main(void *varg)
{
    struct worker_arg *a = varg;
    struct tu_rng g;
    tu_rng_init(&g, a->seed);
    for (int round = 0; round < a->rounds && !a->failure[0]; round++) {
        struct convd_problem p;
        make_problem(&g, (enum family)(round % FAM_COUNT), 0, 0, &p);
        if (ops->supports(g_ctx, &p, NULL, 0) != 0)
            continue;
        struct convd_problem_sizes sz;
        convd_problem_sizes(&p, &sz, NULL, 0);
        /* An anonymous shared mapping stands for a region (a worker thread may not call the
         * cmocka asserts that region_open uses). */
        struct convd_mem m;
        memset(&m, 0, sizeof m);
        m.kind = CONVD_MEM_HOST;
        m.size = sz.input_bytes + sz.weight_bytes + sz.bias_bytes + sz.output_bytes;
        m.host =
            mmap(NULL, (size_t)m.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        float *ref = malloc(sz.output_elems * sizeof *ref);
        if (m.host == MAP_FAILED || !ref) {
            snprintf(a->failure, sizeof a->failure, "out of memory");
            if (m.host != MAP_FAILED)
                munmap(m.host, (size_t)m.size);
            free(ref);
            break;
        }
        char *b = m.host;
        struct convd_job job;
        memset(&job, 0, sizeof job);
        job.problem = p;
        view_set(&job.input, &m, 0, sz.input_bytes);
        view_set(&job.weight, &m, sz.input_bytes, sz.weight_bytes);
        if (p.has_bias)
            view_set(&job.bias, &m, sz.input_bytes + sz.weight_bytes, sz.bias_bytes);
        view_set(&job.output, &m, m.size - sz.output_bytes, sz.output_bytes);
        tu_fill_random(&g, p.dtype, b, sz.input_elems);
        tu_fill_random(&g, p.dtype, b + sz.input_bytes, sz.weight_elems);
        tu_fill_random(&g, p.dtype, b + sz.input_bytes + sz.weight_bytes, sz.bias_elems);
        tu_poison(b + job.output.offset, sz.output_bytes);
        tu_ref_conv(&p, b, b + sz.input_bytes,
                    p.has_bias ? b + sz.input_bytes + sz.weight_bytes : NULL, ref);
        char why[256] = "";
        int rc = ops->mem_import(g_ctx, &m, why, sizeof why);
        struct convd_job *jp = &job;
        if (rc == 0)
            rc = ops->run_batch(g_ctx, a->worker, &jp, 1);
        char ps[160];
        size_t bad = 0;
        if (rc != 0 || job.status != 0) {
            snprintf(a->failure, sizeof a->failure, "worker %u: %s: rc %s, status %s: %s %s",
                     a->worker, convd_problem_str(&p, ps, sizeof ps), convd_status_name(rc),
                     convd_status_name(job.status), job.error, why);
        } else {
            double err = tu_rel_error(p.dtype, b + job.output.offset, ref, sz.output_elems, &bad);
            if (!(err <= tu_tolerance(p.dtype)))
                snprintf(a->failure, sizeof a->failure,
                         "worker %u: [%s] %s: relative error %.3g at element %zu", a->worker,
                         convd_gpu_kernel_name(&p), convd_problem_str(&p, ps, sizeof ps), err, bad);
        }
        if (m.be_priv)
            ops->mem_release(g_ctx, &m);
        munmap(m.host, (size_t)m.size);
        free(ref);
    }
    return NULL;
}

static void test_two_workers_concurrently(void **state)
{
    (void)state;
    struct worker_arg a[2];
    pthread_t th[2];
    for (unsigned i = 0; i < 2; i++) {
        memset(&a[i], 0, sizeof a[i]);
        a[i].worker = i;
        a[i].rounds = 12;
        a[i].seed = tu_rng_next(&g_rng);
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &a[i]), 0);
    }
    for (unsigned i = 0; i < 2; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    for (unsigned i = 0; i < 2; i++)
        if (a[i].failure[0])
            fail_msg("%s", a[i].failure);
}

/* ------------------------------------------------------------------------------------------- */
/* The IPC peer process. */

enum peer_op { PEER_ALLOC = 1, PEER_WRITE, PEER_CHECK, PEER_HANDLE, PEER_EXIT };

struct peer_cmd {
    uint32_t op;
    uint32_t dtype;
    uint64_t a; /* ALLOC: bytes; WRITE, CHECK: offset into the allocation */
    uint64_t b; /* ALLOC: device; WRITE: bytes that follow; CHECK: elements (floats follow) */
};

struct peer_reply {
    int32_t status; /* 0 or -1 */
    uint32_t pad;
    double err;
    uint64_t bad;
    uint8_t handle[CONVD_IPC_HANDLE_SIZE];
    char msg[256];
};

static int g_peer_in = -1, g_peer_out = -1; /* parent: write commands, read replies */
static pid_t g_peer_pid = -1;

static int full_write(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t k = write(fd, p, len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

static int full_read(int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len) {
        ssize_t k = read(fd, p, len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

static void peer_fail(struct peer_reply *rep, const char *what, rt_error e)
{
    rep->status = -1;
    snprintf(rep->msg, sizeof rep->msg, "peer: %s: %s", what, rt_error_string(e));
}

/* The peer's loop. It touches the GPU runtime only once asked to. */
static int peer_main(int in, int out)
{
    char *dev = NULL;
    uint64_t dev_bytes = 0;
    for (;;) {
        struct peer_cmd cmd;
        struct peer_reply rep;
        memset(&rep, 0, sizeof rep);
        if (full_read(in, &cmd, sizeof cmd) != 0)
            return dev ? 1 : 0; /* the parent is gone */
        void *payload = NULL;
        size_t payload_len = cmd.op == PEER_WRITE   ? (size_t)cmd.b
                             : cmd.op == PEER_CHECK ? (size_t)cmd.b * sizeof(float)
                                                    : 0;
        if (payload_len) {
            payload = malloc(payload_len);
            if (!payload || full_read(in, payload, payload_len) != 0)
                return 1;
        }
        rt_error e = RT_OK;
        switch (cmd.op) {
        case PEER_ALLOC:
            if ((e = rt_set_device((int)cmd.b)) != RT_OK) {
                peer_fail(&rep, "selecting the device", e);
            } else if ((e = rt_malloc((void **)&dev, (size_t)cmd.a)) != RT_OK) {
                peer_fail(&rep, "allocating device memory", e);
                dev = NULL;
            } else {
                dev_bytes = cmd.a;
            }
            break;
        case PEER_WRITE:
            if (!dev || cmd.a > dev_bytes || cmd.b > dev_bytes - cmd.a)
                snprintf(rep.msg, sizeof rep.msg, "peer: write outside the allocation"),
                    rep.status = -1;
            else if ((e = rt_memcpy_htod(dev + cmd.a, payload, (size_t)cmd.b)) != RT_OK)
                peer_fail(&rep, "writing device memory", e);
            /* A copy from pageable memory may still be in flight when cudaMemcpy returns; the
             * backend reads this memory from another process, so wait for it. */
            else if ((e = rt_device_synchronize()) != RT_OK)
                peer_fail(&rep, "synchronising after the write", e);
            break;
        case PEER_CHECK: {
            size_t esize = convd_dtype_size((enum convd_dtype)cmd.dtype);
            size_t bytes = (size_t)cmd.b * esize;
            void *host = malloc(bytes ? bytes : 1);
            if (!dev || !host || cmd.a > dev_bytes || bytes > dev_bytes - cmd.a) {
                snprintf(rep.msg, sizeof rep.msg, "peer: check outside the allocation");
                rep.status = -1;
            } else if ((e = rt_memcpy_dtoh(host, dev + cmd.a, bytes)) != RT_OK) {
                peer_fail(&rep, "reading device memory", e);
            } else {
                size_t bad = 0;
                rep.err =
                    tu_rel_error((enum convd_dtype)cmd.dtype, host, payload, (size_t)cmd.b, &bad);
                rep.bad = bad;
                snprintf(rep.msg, sizeof rep.msg, "element %zu is %g, reference %g", bad,
                         (double)tu_load((enum convd_dtype)cmd.dtype, host, bad),
                         (double)((const float *)payload)[bad]);
            }
            free(host);
            break;
        }
        case PEER_HANDLE: {
            rt_ipc_handle h;
            if (!dev)
                snprintf(rep.msg, sizeof rep.msg, "peer: nothing allocated"), rep.status = -1;
            else if ((e = rt_ipc_get_handle(&h, dev)) != RT_OK)
                peer_fail(&rep, "exporting the IPC handle", e);
            else
                memcpy(rep.handle, &h, sizeof rep.handle);
            break;
        }
        case PEER_EXIT:
            if (dev)
                rt_free(dev);
            full_write(out, &rep, sizeof rep);
            return 0;
        default:
            return 1;
        }
        free(payload);
        if (full_write(out, &rep, sizeof rep) != 0)
            return 1;
    }
}

/* Sends one command (with its payload) and returns the reply; a dead peer fails the test. */
static struct peer_reply peer_call(uint32_t op, uint32_t dtype, uint64_t a, uint64_t b,
                                   const void *payload, size_t payload_len)
{
    struct peer_cmd cmd = {op, dtype, a, b};
    struct peer_reply rep;
    if (full_write(g_peer_in, &cmd, sizeof cmd) != 0 ||
        (payload_len && full_write(g_peer_in, payload, payload_len) != 0) ||
        full_read(g_peer_out, &rep, sizeof rep) != 0)
        fail_msg("the IPC peer process died (op %u)", op);
    return rep;
}

static void peer_must(const struct peer_reply *rep, const char *what)
{
    if (rep->status != 0)
        fail_msg("%s: %s", what, rep->msg);
}

static void peer_stop(void)
{
    if (g_peer_pid <= 0)
        return;
    struct peer_cmd cmd = {PEER_EXIT, 0, 0, 0};
    struct peer_reply rep;
    if (full_write(g_peer_in, &cmd, sizeof cmd) == 0)
        (void)full_read(g_peer_out, &rep, sizeof rep);
    close(g_peer_in);
    close(g_peer_out);
    int st = 0;
    waitpid(g_peer_pid, &st, 0);
    g_peer_pid = -1;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fprintf(stderr, "the IPC peer exited abnormally (status 0x%x)\n", st);
}

/* ------------------------------------------------------------------------------------------- */
/* Tests on device memory by IPC handle. */

#define IPC_ALLOC  ((uint64_t)32 << 20) /* a multiple of 2 MiB: the allocation's size is exact */
#define IPC_REGION ((uint64_t)4096 + 256)

static struct convd_mem device_mem(const uint8_t *handle, uint64_t offset, uint64_t size)
{
    struct convd_mem m;
    memset(&m, 0, sizeof m);
    m.kind = CONVD_MEM_DEVICE;
    memcpy(m.ipc_handle, handle, CONVD_IPC_HANDLE_SIZE);
    m.ipc_offset = offset;
    m.size = size;
    return m;
}

/* Expects mem_import to refuse m with `status`; prints the sentence. */
static void expect_import_fails(struct convd_mem *m, int status, const char *what)
{
    char why[256] = "";
    int rc = ops->mem_import(g_ctx, m, why, sizeof why);
    if (rc != status) {
        if (rc == 0)
            ops->mem_release(g_ctx, m);
        fail_msg("%s: mem_import returned %s (%s), expected %s", what, convd_status_name(rc), why,
                 convd_status_name(status));
    }
    if (!why[0])
        fail_msg("%s: refused without a sentence", what);
    assert_null(m->be_priv);
    fprintf(stderr, "%s: %s\n", what, why);
}

static void import_ok(struct convd_mem *m, const char *what)
{
    char why[256] = "";
    int rc = ops->mem_import(g_ctx, m, why, sizeof why);
    if (rc != 0)
        fail_msg("%s: mem_import: %s: %s", what, convd_status_name(rc), why);
    assert_non_null(m->device_ptr);
}

/* Sends the job's host-side inputs (in `src`, laid out at the job's view offsets relative to
 * `region_base`) to the peer at the same offsets of its allocation. */
static void peer_write_view(const struct convd_tensor_view *v, const void *data, uint64_t region_at)
{
    struct peer_reply rep =
        peer_call(PEER_WRITE, 0, region_at + v->offset, v->bytes, data, (size_t)v->bytes);
    peer_must(&rep, "writing a tensor into the peer's device memory");
}

/* A job whose tensors live in device region m (at allocation offset region_at) from a cursor
 * on, with data generated here and written into place by the peer; the peer checks the output
 * in its own memory. */
struct djob {
    struct tjob t;
    struct host_region h; /* host copies of the tensors: the reference's and the peer's source */
    struct convd_job dj;  /* the job as the backend sees it */
    uint64_t region_at;
};

static void djob_prepare(struct djob *d, const struct convd_problem *p, struct convd_mem *m,
                         uint64_t region_at, uint64_t *cursor, const char *what)
{
    tjob_init(&d->t, p);
    region_open(&d->h, region_bytes_for(&d->t.sz), PROT_READ | PROT_WRITE);
    uint64_t hc = 0;
    tjob_place_host(&d->t, &d->h, &hc);
    tjob_reference(&d->t);
    d->dj = d->t.job;
    d->region_at = region_at;
    struct convd_tensor_view *views[4] = {&d->dj.input, &d->dj.weight, &d->dj.bias, &d->dj.output};
    uint64_t at = *cursor;
    for (int i = 0; i < 4; i++) {
        if (!views[i]->mem)
            continue;
        const void *data = view_host(views[i]);
        /* Device tensors must be element-aligned (the daemon refuses others before a backend
         * sees them: daemon/request.c, test_daemon_request); 16 keeps every dtype and the vector
         * paths aligned. */
        at = (at + random_gap(&g_rng) + 15) & ~(uint64_t)15;
        views[i]->mem = m;
        views[i]->offset = at;
        at += views[i]->bytes;
        if (at > m->size)
            fail_msg("%s: the test's device region is too small (%llu > %llu)", what,
                     (unsigned long long)at, (unsigned long long)m->size);
        peer_write_view(views[i], data, region_at); /* the output: poison */
    }
    *cursor = at;
}

/* Expects the job done and its output, in the peer's memory, equal to the reference. */
static void djob_check(struct djob *d, const char *what)
{
    char s[256];
    if (d->dj.status != 0)
        fail_msg("%s: %s: job %s: %s", what, tjob_str(&d->t, s, sizeof s),
                 convd_status_name(d->dj.status), d->dj.error);
    struct peer_reply rep =
        peer_call(PEER_CHECK, (uint32_t)d->t.p.dtype, d->region_at + d->dj.output.offset,
                  d->t.sz.output_elems, d->t.ref, d->t.sz.output_elems * sizeof(float));
    peer_must(&rep, "checking the output in the peer");
    if (!(rep.err <= tu_tolerance(d->t.p.dtype)))
        fail_msg("%s: %s: relative error %.3g in the peer's memory; %s", what,
                 tjob_str(&d->t, s, sizeof s), rep.err, rep.msg);
}

static void djob_free(struct djob *d)
{
    tjob_free(&d->t);
    region_close(&d->h);
}

/* A supported random problem of a family, dtype and layout (0: random). */
static void pick_problem(enum family fam, enum convd_dtype dt, enum convd_layout lay,
                         struct convd_problem *p)
{
    for (int tries = 0;; tries++) {
        assert_true(tries < 100);
        make_problem(&g_rng, fam, dt, lay, p);
        if (ops->supports(g_ctx, p, NULL, 0) == 0)
            return;
    }
}

/* One random device job through run_batch, checked in the peer. */
static void device_job_roundtrip(struct convd_mem *m, uint64_t region_at, uint64_t *cursor,
                                 unsigned worker, const char *what)
{
    struct convd_problem p;
    pick_problem((enum family)tu_rng_range(&g_rng, 0, FAM_COUNT - 1), 0, 0, &p);
    struct djob d;
    djob_prepare(&d, &p, m, region_at, cursor, what);
    struct convd_job *jp = &d.dj;
    int rc = ops->run_batch(g_ctx, worker, &jp, 1);
    char s[256];
    if (rc != 0)
        fail_msg("%s: %s: run_batch %s, job %s: %s", what, tjob_str(&d.t, s, sizeof s),
                 convd_status_name(rc), convd_status_name(d.dj.status), d.dj.error);
    djob_check(&d, what);
    djob_free(&d);
}

static void test_device_ipc(void **state)
{
    (void)state;
    struct peer_reply rep = peer_call(PEER_ALLOC, 0, IPC_ALLOC, 0, NULL, 0);
    peer_must(&rep, "peer allocation");
    rep = peer_call(PEER_HANDLE, 0, 0, 0, NULL, 0);
    peer_must(&rep, "peer handle export");
    uint8_t handle[CONVD_IPC_HANDLE_SIZE];
    memcpy(handle, rep.handle, sizeof handle);

    /* Out of range: refused with EBOUNDS, naming offset, size and allocation size. */
    struct convd_mem m = device_mem(handle, IPC_ALLOC - 100, 200);
    expect_import_fails(&m, CONVD_EBOUNDS, "region past the allocation's end");
    m = device_mem(handle, 0, IPC_ALLOC + 1);
    expect_import_fails(&m, CONVD_EBOUNDS, "region one byte too large");
    m = device_mem(handle, UINT64_MAX - 10, 100);
    expect_import_fails(&m, CONVD_EBOUNDS, "region offset near 2^64");
    m = device_mem(handle, IPC_ALLOC + 4096, 1);
    expect_import_fails(&m, CONVD_EBOUNDS, "region starting after the allocation");
    {
        char why[256] = "", alloc[32];
        snprintf(alloc, sizeof alloc, "%llu", (unsigned long long)IPC_ALLOC);
        m = device_mem(handle, 12345, IPC_ALLOC);
        (void)ops->mem_import(g_ctx, &m, why, sizeof why);
        if (!strstr(why, "12345") || !strstr(why, alloc))
            fail_msg("the EBOUNDS sentence should name the offset (12345), the size and the "
                     "allocation size (%s): '%s'",
                     alloc, why);
    }

    /* Exactly the whole allocation is fine. */
    m = device_mem(handle, 0, IPC_ALLOC);
    import_ok(&m, "the whole allocation");
    ops->mem_release(g_ctx, &m);

    /* Two regions of one allocation: one handle opened once, shared. */
    uint64_t half = IPC_ALLOC / 2;
    struct convd_mem a = device_mem(handle, IPC_REGION, half - IPC_REGION);
    struct convd_mem b = device_mem(handle, half, half);
    import_ok(&a, "region a");
    import_ok(&b, "region b");
    /* Both point into the one mapping of the allocation. */
    assert_int_equal((char *)b.device_ptr - (char *)a.device_ptr, half - IPC_REGION);
    uint64_t ca = 0, cb = 0;
    device_job_roundtrip(&a, IPC_REGION, &ca, 0, "job in device region a");
    device_job_roundtrip(&b, half, &cb, 1, "job in device region b");
    /* Releasing a keeps the allocation open for b. */
    ops->mem_release(g_ctx, &a);
    assert_null(a.be_priv);
    device_job_roundtrip(&b, half, &cb, 0, "job in region b after a's release");
    /* (A tensor whose device address splits elements never reaches the backend: the daemon
     * refuses it when it decodes the request, test_daemon_request.) */
    device_job_roundtrip(&b, half, &cb, 1, "job in region b, the other worker");
    ops->mem_release(g_ctx, &b);
    /* Closed for good now; opening it again works. */
    a = device_mem(handle, IPC_REGION, half - IPC_REGION);
    import_ok(&a, "region a, reopened");
    ca = 0;
    device_job_roundtrip(&a, IPC_REGION, &ca, 1, "job in region a after reopening");
    ops->mem_release(g_ctx, &a);
}

/* A job with its input in host memory and everything else in device memory: staging and in-place
 * tensors in one launch. */
static void test_device_mixed_with_host(void **state)
{
    (void)state;
    struct peer_reply rep = peer_call(PEER_HANDLE, 0, 0, 0, NULL, 0);
    peer_must(&rep, "peer handle export (the allocation of test_device_ipc)");
    struct convd_mem dm = device_mem(rep.handle, 0, IPC_ALLOC);
    import_ok(&dm, "mixed: device region");
    struct convd_problem p;
    for (int tries = 0;; tries++) {
        assert_true(tries < 100);
        make_problem(&g_rng, FAM_WIDE_CPG, CONVD_DTYPE_BF16, 0, &p);
        if (ops->supports(g_ctx, &p, NULL, 0) == 0)
            break;
    }
    struct tjob t;
    tjob_init(&t, &p);
    struct host_region h;
    region_open(&h, region_bytes_for(&t.sz), PROT_READ | PROT_WRITE);
    uint64_t hc = 0;
    tjob_place_host(&t, &h, &hc);
    tjob_reference(&t);
    region_import(&h);
    struct convd_job dj = t.job; /* input stays in host memory */
    uint64_t at = 8192;
    struct convd_tensor_view *views[3] = {&dj.weight, &dj.bias, &dj.output};
    for (int i = 0; i < 3; i++) {
        if (!views[i]->mem)
            continue;
        const void *data = view_host(views[i]);
        views[i]->mem = &dm;
        views[i]->offset = at;
        peer_write_view(views[i], data, 0);
        at += views[i]->bytes + 64;
    }
    assert_true(at <= IPC_ALLOC);
    struct convd_job *jp = &dj;
    int rc = ops->run_batch(g_ctx, 0, &jp, 1);
    char d[256];
    if (rc != 0 || dj.status != 0)
        fail_msg("mixed job %s: run_batch %s, job %s: %s", tjob_str(&t, d, sizeof d),
                 convd_status_name(rc), convd_status_name(dj.status), dj.error);
    rep = peer_call(PEER_CHECK, (uint32_t)p.dtype, dj.output.offset, t.sz.output_elems, t.ref,
                    t.sz.output_elems * sizeof(float));
    peer_must(&rep, "checking the mixed job's output in the peer");
    if (!(rep.err <= tu_tolerance(p.dtype)))
        fail_msg("mixed job %s: relative error %.3g; %s", tjob_str(&t, d, sizeof d), rep.err,
                 rep.msg);
    ops->mem_release(g_ctx, &dm);
    tjob_free(&t);
    region_close(&h);
}

/* Handles that name nothing: CONVD_EDEVICE with the runtime's sentence, and the backend still
 * works afterwards. */
static void test_device_bad_handle(void **state)
{
    (void)state;
    uint8_t junk[CONVD_IPC_HANDLE_SIZE];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)tu_rng_next(&g_rng);
    struct convd_mem m = device_mem(junk, 0, 4096);
    expect_import_fails(&m, CONVD_EDEVICE, "random handle bytes");
    memset(junk, 0, sizeof junk);
    m = device_mem(junk, 0, 4096);
    expect_import_fails(&m, CONVD_EDEVICE, "an all-zero handle");
    memset(junk, 0xff, sizeof junk);
    m = device_mem(junk, 0, 4096);
    expect_import_fails(&m, CONVD_EDEVICE, "an all-ones handle");

    /* Still healthy. */
    struct convd_problem p;
    for (int tries = 0;; tries++) {
        assert_true(tries < 100);
        make_problem(&g_rng, FAM_DEPTHWISE, 0, 0, &p);
        if (ops->supports(g_ctx, &p, NULL, 0) == 0)
            break;
    }
    struct tjob t;
    struct host_region r;
    tjob_alone(&t, &r, &p);
    struct tjob *tp = &t;
    run_jobs(1, &tp, 1, 0);
    tjob_expect_ok(&t, "a job after bad handles");
    tjob_free(&t);
    region_close(&r);
}

/* ------------------------------------------------------------------------------------------- */
/* Asynchronous execution: launch, query, notify and trim, called as the daemon's loop does. */

#define ASYNC_DEADLINE_NS ((uint64_t)120 * 1000000000u)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* query's answer, which must be 0 (running) or 1 (done). */
static int query_slot(unsigned slot, const char *what)
{
    int q = ops->query(g_ctx, slot);
    if (q != 0 && q != 1)
        fail_msg("%s: query(slot %u) returned %d, expected 0 or 1", what, slot, q);
    return q;
}

/* Polls until query reports the slot's batch done; returns how many polls said "running". */
static unsigned long wait_slot(unsigned slot, const char *what)
{
    unsigned long running = 0;
    uint64_t deadline = now_ns() + ASYNC_DEADLINE_NS;
    while (query_slot(slot, what) == 0) {
        running++;
        if (now_ns() > deadline)
            fail_msg("%s: slot %u still running after 120 s", what, slot);
        sleep_us(20);
    }
    return running;
}

static void launch_jobs(unsigned slot, struct convd_job **jobs, size_t n, int expect_rc,
                        const char *what)
{
    int rc = ops->launch(g_ctx, slot, jobs, n);
    if (rc != expect_rc)
        fail_msg("%s: launch(slot %u, %zu jobs) returned %d (%s), expected %s; first job: %s", what,
                 slot, n, rc, convd_status_name(rc), convd_status_name(expect_rc),
                 n ? jobs[0]->error : "");
}

/* The peer's allocation as one device region (allocated here if test_device_ipc did not). */
static void async_device_region(struct convd_mem *m)
{
    struct peer_reply rep = peer_call(PEER_HANDLE, 0, 0, 0, NULL, 0);
    if (rep.status != 0) {
        rep = peer_call(PEER_ALLOC, 0, IPC_ALLOC, 0, NULL, 0);
        peer_must(&rep, "peer allocation");
        rep = peer_call(PEER_HANDLE, 0, 0, 0, NULL, 0);
    }
    peer_must(&rep, "peer handle export");
    *m = device_mem(rep.handle, 0, IPC_ALLOC);
    import_ok(m, "async: the peer's allocation");
}

/* Expects every byte of a tensor still poisoned: nothing wrote it. */
static void expect_untouched(const struct tjob *t, const char *what)
{
    const unsigned char *o = view_host(&t->job.output);
    for (uint64_t i = 0; i < t->sz.output_bytes; i++)
        if (o[i] != 0xff)
            fail_msg("%s: output byte %llu was written (0x%02x)", what, (unsigned long long)i,
                     o[i]);
}

/* Four batches in flight at once, one per slot: two in host memory (several problems each, one
 * with two jobs of one problem), two in device memory by IPC handle, launched back to back and
 * then polled round the slots until each reports done. Every output against the reference. */
static void test_async_four_slots(void **state)
{
    (void)state;
    assert_true(g_info.max_slots >= 4);
    struct convd_mem dm;
    async_device_region(&dm);

    struct convd_problem pa, pb, pc, pd;
    pick_problem(FAM_SMALL_CPG, CONVD_DTYPE_FP32, 0, &pa);
    pick_problem(FAM_DEPTHWISE, 0, 0, &pb);
    pick_problem(FAM_DENSE, CONVD_DTYPE_BF16, 0, &pc);
    pick_problem(FAM_WIDE_CPG, CONVD_DTYPE_FP16, 0, &pd);
    enum { NH = 5, ND = 3 };
    struct tjob h[NH];
    tjob_init(&h[0], &pa);
    tjob_init(&h[1], &pa);
    tjob_init(&h[2], &pb);
    tjob_init(&h[3], &pc);
    tjob_init(&h[4], &pd);
    uint64_t bytes = 0;
    for (int i = 0; i < NH; i++)
        bytes += region_bytes_for(&h[i].sz);
    struct host_region r;
    region_open(&r, bytes, PROT_READ | PROT_WRITE);
    uint64_t c = 0;
    for (int i = 0; i < NH; i++) {
        tjob_place_host(&h[i], &r, &c);
        tjob_reference(&h[i]);
    }
    region_import(&r);
    struct djob d[ND];
    uint64_t dc = 0;
    for (int i = 0; i < ND; i++) {
        struct convd_problem p;
        pick_problem((enum family)(i + 1), i == 0 ? CONVD_DTYPE_FP16 : 0, 0, &p);
        djob_prepare(&d[i], &p, &dm, 0, &dc, "async device job");
    }

    struct convd_job *b0[3] = {&h[0].job, &h[2].job, &h[1].job};
    struct convd_job *b1[1] = {&d[0].dj};
    struct convd_job *b2[2] = {&h[3].job, &h[4].job};
    struct convd_job *b3[2] = {&d[1].dj, &d[2].dj};
    launch_jobs(0, b0, 3, 0, "four slots, slot 0 (host)");
    launch_jobs(1, b1, 1, 0, "four slots, slot 1 (device)");
    launch_jobs(2, b2, 2, 0, "four slots, slot 2 (host)");
    launch_jobs(3, b3, 2, 0, "four slots, slot 3 (device)");
    int done[4] = {0, 0, 0, 0};
    unsigned left = 4;
    unsigned long rounds = 0;
    uint64_t deadline = now_ns() + ASYNC_DEADLINE_NS;
    while (left > 0) {
        for (unsigned slot = 0; slot < 4; slot++) {
            if (!done[slot] && query_slot(slot, "four slots") == 1) {
                done[slot] = 1;
                left--;
            }
        }
        rounds++;
        if (left > 0) {
            if (now_ns() > deadline)
                fail_msg("four slots: %u of them still running after 120 s", left);
            sleep_us(10);
        }
    }
    fprintf(stderr, "four slots: all done after %lu polling rounds\n", rounds);
    for (int i = 0; i < NH; i++) {
        char what[48];
        snprintf(what, sizeof what, "four slots, host job %d", i);
        tjob_expect_ok(&h[i], what);
        assert_true(h[i].job.exec_ns > 0);
    }
    for (int i = 0; i < ND; i++) {
        char what[48];
        snprintf(what, sizeof what, "four slots, device job %d", i);
        djob_check(&d[i], what);
        assert_true(d[i].dj.exec_ns > 0);
    }
    /* Reported once: the slots are free now, and a free slot answers "done". */
    for (unsigned slot = 0; slot < 4; slot++)
        assert_int_equal(query_slot(slot, "four slots, again"), 1);

    for (int i = 0; i < NH; i++)
        tjob_free(&h[i]);
    for (int i = 0; i < ND; i++)
        djob_free(&d[i]);
    region_close(&r);
    ops->mem_release(g_ctx, &dm);
}

/* A deliberately heavy batch, 128 MiB of host tensors through the staging pool: query says
 * "running" right after launch (copies of pinned memory cannot be finished by then) and reports
 * done only with the output complete. Then trim gives the grown pool back to the device, and the
 * same batch, a small one and a run_batch on the trimmed slots still run. */
static void test_async_heavy_query_and_trim(void **state)
{
    (void)state;
    const unsigned slot = 2;
    struct convd_problem p;
    convd_problem_init(&p, 2, 512, 512, 32, 32, 3, 3, 32); /* 64 MiB in, 64 MiB out */
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
    p.dtype = CONVD_DTYPE_FP32;
    p.layout = CONVD_LAYOUT_NHWC;
    char why[256] = "", ps[160];
    int rc = ops->supports(g_ctx, &p, why, sizeof why);
    if (rc != 0)
        fail_msg("heavy batch: %s unsupported: %s: %s", convd_problem_str(&p, ps, sizeof ps),
                 convd_status_name(rc), why);
    struct tjob t;
    tjob_init(&t, &p);
    struct host_region r;
    region_open(&r, region_bytes_for(&t.sz), PROT_READ | PROT_WRITE);
    uint64_t c = 0;
    tjob_place_host(&t, &r, &c);
    tjob_reference(&t);
    rc = ops->mem_import(g_ctx, &r.mem, why, sizeof why);
    if (rc != 0)
        fail_msg("heavy batch: mem_import: %s: %s", convd_status_name(rc), why);
    r.imported = 1;
    /* Pageable memory would make the copy back synchronous inside launch. */
    int pinned = why[0] == '\0';
    if (!pinned)
        fprintf(stderr, "note: heavy batch region not pinned (%s); query may not see it run\n",
                why);

    struct convd_job *jp = &t.job;
    uint64_t t0 = now_ns();
    launch_jobs(slot, &jp, 1, 0, "heavy batch");
    uint64_t t1 = now_ns();
    unsigned long running = wait_slot(slot, "heavy batch");
    uint64_t t2 = now_ns();
    fprintf(stderr, "heavy batch: launch %.1f us, then query said running %lu times in %.2f ms\n",
            (double)(t1 - t0) / 1e3, running, (double)(t2 - t1) / 1e6);
    tjob_expect_ok(&t, "heavy batch");
    if (pinned && running == 0)
        fail_msg("heavy batch: query reported 128 MiB of copies done at its first call");

    /* The slot's pool grew past 128 MiB for that batch; trim hands it back. */
    size_t free0 = 0, free1 = 0, total = 0;
    rt_error e = rt_mem_get_info(&free0, &total);
    if (e != RT_OK)
        fail_msg("cudaMemGetInfo: %s", rt_error_string(e));
    ops->trim(g_ctx);
    e = rt_mem_get_info(&free1, &total);
    if (e != RT_OK)
        fail_msg("cudaMemGetInfo: %s", rt_error_string(e));
    fprintf(stderr, "trim: device memory free %.1f -> %.1f MiB\n", (double)free0 / 1048576.0,
            (double)free1 / 1048576.0);
    if (free1 < free0 + ((size_t)96 << 20))
        fail_msg("trim after a 128 MiB batch freed %.1f MiB of device memory, expected the "
                 "slot's pool (at least 96 MiB)",
                 ((double)free1 - (double)free0) / 1048576.0);

    /* The pool grows back on demand: the same batch again, on the same slot. */
    tu_poison((char *)r.mem.host + t.job.output.offset, t.sz.output_bytes);
    launch_jobs(slot, &jp, 1, 0, "heavy batch after trim");
    wait_slot(slot, "heavy batch after trim");
    tjob_expect_ok(&t, "heavy batch after trim");

    /* A small batch on the trimmed slot, and one through run_batch (slot 0, trimmed too). */
    struct convd_problem q;
    pick_problem(FAM_SMALL_CPG, 0, 0, &q);
    struct tjob s;
    tjob_init(&s, &q);
    struct host_region rs;
    region_open(&rs, region_bytes_for(&s.sz), PROT_READ | PROT_WRITE);
    c = 0;
    tjob_place_host(&s, &rs, &c);
    tjob_reference(&s);
    region_import(&rs);
    struct convd_job *sp = &s.job;
    launch_jobs(slot, &sp, 1, 0, "small batch after trim");
    wait_slot(slot, "small batch after trim");
    tjob_expect_ok(&s, "small batch after trim");
    tu_poison((char *)rs.mem.host + s.job.output.offset, s.sz.output_bytes);
    struct tjob *stp = &s;
    run_jobs(0, &stp, 1, 0);
    tjob_expect_ok(&s, "run_batch after trim");

    ops->trim(g_ctx);
    tjob_free(&s);
    region_close(&rs);
    tjob_free(&t);
    region_close(&r);
}

/* What a notify callback saw. */
struct notice {
    int calls;            /* atomic */
    const struct tjob *t; /* whose output the first call checks, or NULL */
    double err;           /* the output's relative error at the first call */
};

/* Runs on a runtime thread: no cmocka here, only a record of the call. */
static void notice_fn(void *arg)
{
    struct notice *nt = arg;
    if (nt->t && __atomic_load_n(&nt->calls, __ATOMIC_ACQUIRE) == 0)
        nt->err = tu_rel_error(nt->t->p.dtype, view_host(&nt->t->job.output), nt->t->ref,
                               nt->t->sz.output_elems, NULL);
    __atomic_fetch_add(&nt->calls, 1, __ATOMIC_ACQ_REL);
}

static int notice_calls(struct notice *nt)
{
    return __atomic_load_n(&nt->calls, __ATOMIC_ACQUIRE);
}

static void notice_init(struct notice *nt, const struct tjob *t)
{
    memset(nt, 0, sizeof *nt);
    nt->t = t;
    nt->err = -1.0;
}

/* Waits, without query, until the callback has been called; then checks that the output was
 * complete when it ran, and that a while later it has still been called only once. */
static void notice_expect_once(struct notice *nt, const char *what)
{
    uint64_t deadline = now_ns() + ASYNC_DEADLINE_NS;
    while (notice_calls(nt) == 0) {
        if (now_ns() > deadline)
            fail_msg("%s: no callback after 120 s", what);
        sleep_us(20);
    }
    if (nt->t && !(nt->err >= 0.0 && nt->err <= tu_tolerance(nt->t->p.dtype)))
        fail_msg("%s: the callback ran before the output was complete (relative error %.3g "
                 "then)",
                 what, nt->err);
    sleep_us(100000);
    if (notice_calls(nt) != 1)
        fail_msg("%s: the callback was called %d times, expected once", what, notice_calls(nt));
}

/* stats: the device's memory as the runtime reports it (an allocation of ours shows in it), the
 * staging pools the backend holds, and, where NVML loads, utilisations between 0 and 1. */
static void test_device_stats(void **state)
{
    (void)state;
    assert_non_null(ops->stats);
    struct convd_backend_stats st;
    memset(&st, 0, sizeof st);
    assert_int_equal(ops->stats(g_ctx, &st), 0);
    assert_true(st.has_memory);
    size_t mem_free = 0, mem_total = 0;
    assert_int_equal(rt_mem_get_info(&mem_free, &mem_total), RT_OK);
    assert_int_equal(st.memory_total_bytes, mem_total);
    assert_true(st.memory_used_bytes > 0 && st.memory_used_bytes <= st.memory_total_bytes);
    assert_true(st.has_staging);
    assert_true(st.staging_bytes > 0); /* the warm-up grew the pools */

    const size_t big = (size_t)256 << 20;
    void *p = NULL;
    assert_int_equal(rt_malloc(&p, big), RT_OK);
    struct convd_backend_stats more;
    memset(&more, 0, sizeof more);
    assert_int_equal(ops->stats(g_ctx, &more), 0);
    if (more.memory_used_bytes < st.memory_used_bytes + big / 2)
        fail_msg("256 MiB allocated, but memory in use went from %llu to %llu bytes",
                 (unsigned long long)st.memory_used_bytes,
                 (unsigned long long)more.memory_used_bytes);
    assert_int_equal(rt_free(p), RT_OK);

    if (st.has_utilization) {
        assert_true(st.utilization >= 0.0 && st.utilization <= 1.0);
        assert_true(st.memory_utilization >= 0.0 && st.memory_utilization <= 1.0);
    }
    printf("stats: %.1f of %.1f GiB in use, %.1f MiB staging, utilisation %s\n",
           (double)st.memory_used_bytes / (1 << 30), (double)st.memory_total_bytes / (1 << 30),
           (double)st.staging_bytes / (1 << 20),
           st.has_utilization ? "from NVML" : "absent (no NVML)");
}

/* notify: each call's fn runs exactly once, after the batch (its output complete, query then
 * reporting done at once), with no polling in between; at once on an idle slot; soon for a
 * batch that has finished but was not reported yet. */
static void test_async_notify(void **state)
{
    (void)state;
    const unsigned slot = 1;
    struct convd_problem p;
    convd_problem_init(&p, 2, 256, 256, 32, 32, 3, 3, 32); /* 16 MiB each way */
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
    p.dtype = CONVD_DTYPE_FP32;
    p.layout = CONVD_LAYOUT_NHWC;
    assert_int_equal(ops->supports(g_ctx, &p, NULL, 0), 0);
    struct tjob t;
    struct host_region r;
    tjob_alone(&t, &r, &p);
    struct convd_job *jp = &t.job;

    /* Two calls on one batch in flight: two callbacks, each once. */
    struct notice a, b;
    notice_init(&a, &t);
    notice_init(&b, &t);
    launch_jobs(slot, &jp, 1, 0, "notify");
    assert_int_equal(ops->notify(g_ctx, slot, notice_fn, &a), 0);
    assert_int_equal(ops->notify(g_ctx, slot, notice_fn, &b), 0);
    notice_expect_once(&a, "notify, first call");
    notice_expect_once(&b, "notify, second call");
    if (query_slot(slot, "after notify's callback") != 1)
        fail_msg("notify's callback ran, but query still says the batch is running");
    tjob_expect_ok(&t, "the batch notify waited for");

    /* An idle slot: called at once. */
    struct notice idle;
    notice_init(&idle, NULL);
    assert_int_equal(ops->notify(g_ctx, slot, notice_fn, &idle), 0);
    if (notice_calls(&idle) != 1)
        fail_msg("notify on an idle slot: %d calls when it returned, expected 1",
                 notice_calls(&idle));
    notice_expect_once(&idle, "notify on an idle slot");

    /* A batch that has finished but is not reported yet (no query since its launch). */
    struct notice late;
    notice_init(&late, &t);
    tu_poison((char *)r.mem.host + t.job.output.offset, t.sz.output_bytes);
    launch_jobs(slot, &jp, 1, 0, "notify after the end");
    sleep_us(300000);
    assert_int_equal(ops->notify(g_ctx, slot, notice_fn, &late), 0);
    notice_expect_once(&late, "notify after the batch ended");
    if (query_slot(slot, "after the late callback") != 1)
        fail_msg("notify's late callback ran, but query still says the batch is running");
    tjob_expect_ok(&t, "the batch finished before notify");

    /* A slot that does not exist: refused, never called. */
    struct notice none;
    notice_init(&none, NULL);
    assert_int_equal(ops->notify(g_ctx, g_info.max_slots, notice_fn, &none), CONVD_EINVAL);
    assert_int_equal(notice_calls(&none), 0);

    tjob_free(&t);
    region_close(&r);
}

/* Bad jobs in a launched batch fail alone with their own status while the rest succeed; a
 * launch on a slot still in flight or out of range is refused without disturbing anything; a
 * batch of only bad jobs puts nothing in flight. */
static void test_async_bad_jobs(void **state)
{
    (void)state;
    const unsigned slot = 3;
    struct convd_problem pa, pb;
    pick_problem(FAM_SMALL_CPG, CONVD_DTYPE_FP32, 0, &pa);
    for (int tries = 0;; tries++) {
        assert_true(tries < 100);
        pick_problem(FAM_DEPTHWISE, 0, 0, &pb);
        if (!convd_problem_same(&pa, &pb))
            break;
    }
    enum { NT = 5 };
    struct tjob t[NT];
    tjob_init(&t[0], &pa);
    tjob_init(&t[1], &pa);
    tjob_init(&t[2], &pb);
    tjob_init(&t[3], &pb);
    tjob_init(&t[4], &pa);
    uint64_t bytes = 0;
    for (int i = 0; i < NT; i++)
        bytes += region_bytes_for(&t[i].sz);
    struct host_region r;
    region_open(&r, bytes, PROT_READ | PROT_WRITE);
    uint64_t c = 0;
    for (int i = 0; i < NT; i++) {
        tjob_place_host(&t[i], &r, &c);
        tjob_reference(&t[i]);
    }
    region_import(&r);
    /* t[1]'s output runs past the end of its region; t[3]'s weight view is too short. */
    t[1].job.output.offset = r.mem.size - t[1].sz.output_bytes / 2;
    t[3].job.weight.bytes = t[3].sz.weight_bytes - 1;

    struct convd_job *batch[4] = {&t[0].job, &t[1].job, &t[2].job, &t[3].job};
    launch_jobs(slot, batch, 4, 0, "batch with bad jobs");
    /* The slot is taken until query reports it. */
    struct convd_job *extra = &t[4].job;
    launch_jobs(slot, &extra, 1, CONVD_EBUSY, "launch on a slot in flight");
    if (t[4].job.status != CONVD_EBUSY || !t[4].job.error[0])
        fail_msg("launch on a slot in flight: job status %s (%s), expected EBUSY with a sentence",
                 convd_status_name(t[4].job.status), t[4].job.error);
    wait_slot(slot, "batch with bad jobs");
    tjob_expect_ok(&t[0], "good job 0 beside bad ones");
    tjob_expect_ok(&t[2], "good job 2 beside bad ones");
    if (t[1].job.status != CONVD_EBOUNDS || !t[1].job.error[0])
        fail_msg("output past the region: status %s (%s), expected EBOUNDS",
                 convd_status_name(t[1].job.status), t[1].job.error);
    if (t[3].job.status != CONVD_ESIZE || !t[3].job.error[0])
        fail_msg("short weight view: status %s (%s), expected ESIZE",
                 convd_status_name(t[3].job.status), t[3].job.error);
    expect_untouched(&t[4], "the job refused on a slot in flight");
    fprintf(stderr, "async bad job sentences: '%s' / '%s' / '%s'\n", t[1].job.error, t[3].job.error,
            t[4].job.error);

    /* Only bad jobs: nothing in flight, the first query reports them. */
    struct convd_job *bad[2] = {&t[1].job, &t[3].job};
    launch_jobs(slot, bad, 2, 0, "batch of bad jobs only");
    assert_int_equal(query_slot(slot, "batch of bad jobs only"), 1);
    assert_int_equal(t[1].job.status, CONVD_EBOUNDS);
    assert_int_equal(t[3].job.status, CONVD_ESIZE);

    /* A slot out of range. */
    launch_jobs(g_info.max_slots, &extra, 1, CONVD_EINVAL, "launch on a slot out of range");
    assert_int_equal(t[4].job.status, CONVD_EINVAL);
    assert_true(t[4].job.error[0] != '\0');
    assert_int_equal(query_slot(g_info.max_slots, "query on a slot out of range"), 1);
    expect_untouched(&t[4], "the job refused on a slot out of range");

    /* The slot still works. */
    launch_jobs(slot, &extra, 1, 0, "the refused job, launched properly");
    wait_slot(slot, "the refused job, launched properly");
    tjob_expect_ok(&t[4], "the refused job, launched properly");

    for (int i = 0; i < NT; i++)
        tjob_free(&t[i]);
    region_close(&r);
}

/* A second backend context with the configuration's diagnostics, stream priority, device gates
 * and lanes. */
static void *open_ctx_waits(bool timing, bool priority, bool gates, bool waits,
                            struct convd_backend_info *info)
{
    struct convd_backend_config cfg = {0};
    cfg.device = -1;
    cfg.max_batch = 64;
    cfg.completion_flags = g_flags;
    cfg.device_timing = timing;
    cfg.stream_priority = priority;
    cfg.device_gates = gates;
    cfg.device_waits = waits;
    char why[256] = "";
    void *ctx = NULL;
    int rc = ops->init(&cfg, &ctx, info, why, sizeof why);
    if (rc != 0)
        fail_msg("init (timing %d, priority %d, gates %d, waits %d): %s: %s", timing, priority,
                 gates, waits, convd_status_name(rc), why);
    return ctx;
}

static void *open_ctx_gates(bool timing, bool priority, bool gates, struct convd_backend_info *info)
{
    return open_ctx_waits(timing, priority, gates, false, info);
}

static void *open_ctx(bool timing, bool priority, struct convd_backend_info *info)
{
    return open_ctx_gates(timing, priority, false, info);
}

/* device_timing (the daemon's batch_timing): each job of a batch reports the batch's time on the
 * device, which lies inside the host's time from launch to done (a timer's rate may differ by a
 * little: 1% and 2 us of slack); without it, none. Both the blocking and the asynchronous path,
 * with a correct output. */
static void test_device_timing(void **state)
{
    (void)state;
    struct convd_problem p;
    pick_problem(FAM_DEPTHWISE, CONVD_DTYPE_FP16, 0, &p);
    void *saved = g_ctx;
    for (int timing = 0; timing <= 1; timing++) {
        struct convd_backend_info info;
        if (timing)
            g_ctx = open_ctx(true, false, &info);
        for (int path = 0; path < 2; path++) {
            char what[64];
            snprintf(what, sizeof what, "timing %s, %s", timing ? "on" : "off",
                     path ? "launch and query" : "run_batch");
            struct tjob t;
            struct host_region r;
            tjob_alone(&t, &r, &p);
            t.job.device_ns = 12345; /* the backend must set it either way */
            struct tjob *tp = &t;
            struct convd_job *jp = &t.job;
            if (path == 0) {
                run_jobs(0, &tp, 1, 0);
            } else {
                launch_jobs(1, &jp, 1, 0, what);
                wait_slot(1, what);
            }
            tjob_expect_ok(&t, what);
            const uint64_t dev = t.job.device_ns, host = t.job.exec_ns;
            fprintf(stderr, "%s: device %.1f us, host %.1f us\n", what, (double)dev / 1e3,
                    (double)host / 1e3);
            if (!timing && dev != 0)
                fail_msg("%s: device_ns %llu without timing", what, (unsigned long long)dev);
            if (timing && (dev == 0 || dev > host + host / 100 + 2000))
                fail_msg("%s: device_ns %llu against exec_ns %llu", what, (unsigned long long)dev,
                         (unsigned long long)host);
            tjob_free(&t);
            region_close(&r);
        }
        if (timing) {
            ops->destroy(g_ctx);
            g_ctx = saved;
        }
    }
}

/* stream_priority: the driver gave the streams a priority above the default (the device line
 * says which), and they serve batches of several problems correctly through both paths. */
static void test_stream_priority(void **state)
{
    (void)state;
    void *saved = g_ctx;
    struct convd_backend_info info;
    g_ctx = open_ctx(false, true, &info);
    const char *said = strstr(info.device, ", stream priority ");
    if (said == NULL || atoi(said + strlen(", stream priority ")) >= 0)
        fail_msg("stream_priority: the device line '%s' names no priority above the default",
                 info.device);
    if (strstr(g_info.device, "stream priority") != NULL)
        fail_msg("the default backend's device line '%s' names a stream priority", g_info.device);
    for (int path = 0; path < 2; path++) {
        const char *what = path ? "high priority, launch and query" : "high priority, run_batch";
        struct convd_problem p[2];
        pick_problem(FAM_DEPTHWISE, CONVD_DTYPE_FP16, 0, &p[0]);
        pick_problem(FAM_WIDE_CPG, CONVD_DTYPE_BF16, 0, &p[1]);
        struct tjob t[2];
        struct host_region r[2];
        struct tjob *tp[2];
        struct convd_job *jp[2];
        for (int i = 0; i < 2; i++) {
            tjob_alone(&t[i], &r[i], &p[i]);
            tp[i] = &t[i];
            jp[i] = &t[i].job;
        }
        if (path == 0) {
            run_jobs(0, tp, 2, 0);
        } else {
            launch_jobs(2, jp, 2, 0, what);
            wait_slot(2, what);
        }
        for (int i = 0; i < 2; i++) {
            tjob_expect_ok(&t[i], what);
            tjob_free(&t[i]);
            region_close(&r[i]);
        }
    }
    ops->destroy(g_ctx);
    g_ctx = saved;
}

/* The output of t (host memory) against its reference, before query has set its status. */
static void expect_output(const struct tjob *t, const char *what)
{
    char d[256];
    size_t bad = 0;
    const void *out = view_host(&t->job.output);
    double err = tu_rel_error(t->p.dtype, out, t->ref, t->sz.output_elems, &bad);
    if (!(err <= tu_tolerance(t->p.dtype)))
        fail_msg("%s: %s: relative error %.3g > %.3g when its gate word was seen", what,
                 tjob_str(t, d, sizeof d), err, tu_tolerance(t->p.dtype));
}

/* Three problems of three families and two dtypes, for the word tests. */
static void pick_three(struct convd_problem p[3])
{
    pick_problem(FAM_DEPTHWISE, CONVD_DTYPE_FP16, 0, &p[0]);
    pick_problem(FAM_WIDE_CPG, CONVD_DTYPE_BF16, 0, &p[1]);
    pick_problem(FAM_DENSE, CONVD_DTYPE_FP16, 0, &p[2]);
}

/* Waits until word i (at w) holds want, stored by the device; fails after 120 s. */
static void await_word(_Atomic uint32_t *w, uint32_t want, int i, const char *what)
{
    const uint64_t deadline = now_ns() + ASYNC_DEADLINE_NS;
    while (atomic_load_explicit(w, memory_order_acquire) != want)
        if (now_ns() > deadline)
            fail_msg("%s: word %d still %#x after 120 s, expected %#x", what, i,
                     (unsigned)atomic_load(w), (unsigned)want);
}

/* device_gates: with completion words, the batch's stream stores each gated job's done word
 * (nothing else here writes it), and the job's output is complete once the word is seen, before
 * query reports the slot done; a job without a gate has none stored. Without device_gates, or
 * with completion events, no word is stored: that is left to the daemon's loop. */
static void test_device_gates(void **state)
{
    (void)state;
    void *saved = g_ctx;
    for (int gates = 0; gates <= 1; gates++) {
        struct convd_backend_info info;
        if (gates)
            g_ctx = open_ctx_gates(false, false, true, &info);
        const bool stored = gates && g_flags;
        char what[96];
        snprintf(what, sizeof what, "device gates %s, completion %s", gates ? "on" : "off",
                 g_flags ? "words" : "events");
        struct host_region gr;
        region_open(&gr, 4096, PROT_READ | PROT_WRITE);
        region_import(&gr);
        _Atomic uint32_t *words = (_Atomic uint32_t *)gr.mem.host;
        for (int i = 0; i < 3; i++)
            atomic_store(&words[16 * i], 0);
        const uint32_t values[3] = {0x5eed0001u + (uint32_t)tu_rng_range(&g_rng, 0, 999), 7, 0};
        struct convd_problem p[3];
        pick_three(p);
        struct tjob t[3];
        struct host_region r[3];
        struct convd_job *jp[3];
        for (int i = 0; i < 3; i++) {
            tjob_alone(&t[i], &r[i], &p[i]);
            jp[i] = &t[i].job;
            if (i < 2) { /* the third has no gate */
                t[i].job.gate_mem = &gr.mem;
                t[i].job.gate_offset = 64u * (unsigned)i;
                t[i].job.gate_value = values[i];
            }
        }
        launch_jobs(3, jp, 3, 0, what);
        if (stored) {
            for (int i = 0; i < 2; i++) {
                await_word(&words[16 * i], values[i], i, what);
                expect_output(&t[i], what);
            }
        }
        wait_slot(3, what);
        for (int i = 0; i < 3; i++) {
            const uint32_t want = stored && i < 2 ? values[i] : 0;
            if (atomic_load(&words[16 * i]) != want)
                fail_msg("%s: gate word %d holds %#x after the batch, expected %#x", what, i,
                         (unsigned)atomic_load(&words[16 * i]), (unsigned)want);
            tjob_expect_ok(&t[i], what);
            tjob_free(&t[i]);
            region_close(&r[i]);
        }
        region_close(&gr);
        if (gates) {
            ops->destroy(g_ctx);
            g_ctx = saved;
        }
    }
}

/* device_waits: lanes. Two requests in lane 0, launched in order, the first waiting on a word
 * that has not come and the second on one that has: neither runs (a lane runs in launch order),
 * while a request in lane 1 whose word has come runs and is right. Once the first word is
 * stored both run, each stores its done word from the device with its output complete, and
 * query reports both slots done. Memory the lanes cannot reach is not offered to them, and
 * without completion words there are no lanes. */
static void test_device_waits(void **state)
{
    (void)state;
    void *saved = g_ctx;
    struct convd_backend_info info;
    g_ctx = open_ctx_waits(false, false, false, true, &info);
    if (!g_flags) {
        if (info.lanes != 0)
            fail_msg("lanes (%u) without completion words", info.lanes);
        ops->destroy(g_ctx);
        g_ctx = saved;
        return;
    }
    if (info.lanes < 2 || info.lane_depth < 2)
        fail_msg("device_waits with completion words: %u lanes of %u slots, want at least 2 of 2",
                 info.lanes, info.lane_depth);
    const unsigned lane0 = info.max_slots, lane1 = info.max_slots + info.lane_depth;
    const char *what = "device waits";
    struct host_region gr;
    region_open(&gr, 4096, PROT_READ | PROT_WRITE);
    region_import(&gr);
    if (!gr.mem.device_words)
        fail_msg("%s: a pinned host region is not offered to the lanes (device_words unset)", what);
    _Atomic uint32_t *words = (_Atomic uint32_t *)gr.mem.host;
    /* job i: ready word at 16 * (2i), done word at 16 * (2i + 1) */
    const uint32_t ready[3] = {5, 1, 0xfffffffeu}, stored[3] = {4, 1, 3};
    struct convd_problem p[3];
    pick_three(p);
    struct tjob t[3];
    struct host_region r[3];
    for (int i = 0; i < 3; i++) {
        atomic_store(&words[32 * i], stored[i]);
        atomic_store(&words[32 * i + 16], 0);
        tjob_alone(&t[i], &r[i], &p[i]);
        t[i].job.ready_mem = &gr.mem;
        t[i].job.ready_offset = 128u * (unsigned)i;
        t[i].job.ready_value = ready[i];
        t[i].job.gate_mem = &gr.mem;
        t[i].job.gate_offset = 128u * (unsigned)i + 64u;
        t[i].job.gate_value = 0xd0e00000u + (uint32_t)i;
    }
    /* 3 (cyclically past 0xfffffffe) has come; 4 is below 5. */
    struct convd_job *j0 = &t[0].job, *j1 = &t[1].job, *j2 = &t[2].job;
    launch_jobs(lane0, &j0, 1, 0, what);
    launch_jobs(lane0 + 1, &j1, 1, 0, what);
    launch_jobs(lane1, &j2, 1, 0, what);
    wait_slot(lane1, "device waits: lane 1, its word come");
    tjob_expect_ok(&t[2], "device waits: lane 1, its word come");
    if (atomic_load(&words[32 * 2 + 16]) != 0xd0e00002u)
        fail_msg("%s: lane 1's done word holds %#x", what, (unsigned)atomic_load(&words[80]));
    sleep_us(50 * 1000);
    if (query_slot(lane0, what) != 0 || query_slot(lane0 + 1, what) != 0)
        fail_msg("%s: a lane-0 request finished before the first word came", what);
    expect_untouched(&t[0], "device waits: the first, its word not come");
    expect_untouched(&t[1], "device waits: the second, behind the first in its lane");
    if (atomic_load(&words[16]) != 0 || atomic_load(&words[48]) != 0)
        fail_msg("%s: a done word was stored before the first ready word came", what);
    atomic_store(&words[0], 5);
    for (int i = 0; i < 2; i++) {
        await_word(&words[32 * i + 16], 0xd0e00000u + (uint32_t)i, i, what);
        expect_output(&t[i], what);
    }
    wait_slot(lane0, what);
    wait_slot(lane0 + 1, what);
    for (int i = 0; i < 3; i++) {
        tjob_expect_ok(&t[i], what);
        tjob_free(&t[i]);
        region_close(&r[i]);
    }
    region_close(&gr);
    ops->destroy(g_ctx);
    g_ctx = saved;
}

/* ------------------------------------------------------------------------------------------- */

int main(void)
{
    /* As the daemon does for its lanes (the backend sets them too, but this process starts the
     * runtime before test_device_waits opens them): streams do not share hardware queues, and
     * kernels load at start. Under lazy loading test_device_waits hung on an H100 (2026-12-07):
     * lane 1's batch never ran while lane 0 waited for its word, and it passed with EAGER. */
    (void)setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    (void)setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    /* Fork the IPC peer before this process makes any GPU call. */
    int to_peer[2], from_peer[2];
    if (pipe2(to_peer, O_CLOEXEC) != 0 || pipe2(from_peer, O_CLOEXEC) != 0) {
        perror("pipe2");
        return 1;
    }
    fflush(NULL);
    g_peer_pid = fork();
    if (g_peer_pid < 0) {
        perror("fork");
        return 1;
    }
    if (g_peer_pid == 0) {
        close(to_peer[1]);
        close(from_peer[0]);
        _exit(peer_main(to_peer[0], from_peer[1]));
    }
    close(to_peer[0]);
    close(from_peer[1]);
    g_peer_in = to_peer[1];
    g_peer_out = from_peer[0];

    int count = 0;
    rt_error e = rt_get_device_count(&count);
    if (e != RT_OK || count <= 0) {
        printf("SKIP: no GPU here (%s); the GPU backend tests need one\n",
               e != RT_OK ? rt_error_string(e) : "no devices");
        peer_stop();
        return 77;
    }
    tu_rng_init(&g_rng, tu_seed());

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_destroy),
        cmocka_unit_test(test_host_random),
        cmocka_unit_test(test_host_batch_grouped),
        cmocka_unit_test(test_host_bad_jobs),
        cmocka_unit_test(test_host_readonly_inputs),
        cmocka_unit_test(test_pool_limit_chunks),
        cmocka_unit_test(test_two_workers_concurrently),
        cmocka_unit_test(test_device_ipc),
        cmocka_unit_test(test_device_mixed_with_host),
        cmocka_unit_test(test_device_bad_handle),
        cmocka_unit_test(test_async_four_slots),
        cmocka_unit_test(test_async_heavy_query_and_trim),
        cmocka_unit_test(test_async_notify),
        cmocka_unit_test(test_async_bad_jobs),
        cmocka_unit_test(test_device_stats),
        cmocka_unit_test(test_device_timing),
        cmocka_unit_test(test_stream_priority),
        cmocka_unit_test(test_device_gates),
        cmocka_unit_test(test_device_waits),
    };
    /* CONVD_TEST_FILTER (a cmocka pattern, '*' a wildcard) runs the tests it names alone: a
     * hang on the GPU machine is then timed out without the rest. */
    const char *filter = getenv("CONVD_TEST_FILTER");
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    g_flags = true;
    int failed =
        cmocka_run_group_tests_name("completion words", tests, group_setup, group_teardown);
    g_flags = false;
    failed += cmocka_run_group_tests_name("completion events", tests, group_setup, group_teardown);
    peer_stop();
    return failed;
}
