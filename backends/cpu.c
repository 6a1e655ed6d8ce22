/*
 * The CPU backend: convd_cpu_backend_ops, what the daemon runs when it has no GPU.
 *
 * It owns one thread pool (cfg->threads threads, the calling worker thread included) and runs
 * every job of a batch on host memory. Parallelism lives inside run_batch, so the daemon gets
 * max_workers = 1: a large job is split into tasks over the whole pool; several small jobs run
 * side by side, one per thread, which keeps batch-1 requests from paying the pool's
 * synchronisation once per job.
 */
#include <assert.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cpu_internal.h"
#include "problem_priv.h"
#include "why.h"

/* Jobs below this many FLOPs run one per thread when a batch has several of them. */
#define CPUB_SMALL_JOB_FLOPS (8u * 1000u * 1000u)

struct cpub_ctx {
    struct cpu_pool *pool;
    int threads;
};

static void cpub_cpu_model(char *buf, size_t len)
{
    snprintf(buf, len, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "re");
    if (f == NULL)
        return;
    char line[256];
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        const char *v = strchr(line, ':');
        if (v == NULL)
            continue;
        v++;
        while (*v == ' ' || *v == '\t')
            v++;
        size_t n = strcspn(v, "\n");
        if (n > 0)
            snprintf(buf, len, "%.*s", (int)n, v);
        break;
    }
    fclose(f);
}

static int cpub_init(const struct convd_backend_config *cfg, void **ret_ctx,
                     struct convd_backend_info *ret_info, char *why, size_t why_len)
{
    if (cfg == NULL || ret_ctx == NULL || ret_info == NULL) {
        return why_fail(why, why_len, CONVD_EINVAL,
                        "cpu backend: init called with a NULL argument");
    }
    if (cfg->threads < 0) {
        return why_fail(why, why_len, CONVD_EINVAL,
                        "cpu backend: threads is %d, must be 0 (one per CPU) or more",
                        cfg->threads);
    }
    int threads = cfg->threads == 0 ? cpu_online_cpus() : cfg->threads;

    struct cpub_ctx *be = calloc(1, sizeof(*be));
    if (be == NULL) {
        return why_fail(why, why_len, CONVD_ENOMEM, "cpu backend: out of memory");
    }
    int rc = cpu_pool_create(threads, &be->pool);
    if (rc != 0) {
        free(be);
        return why_fail(why, why_len, rc, "cpu backend: cannot start %d threads: %s", threads,
                        convd_strerror(rc));
    }
    be->threads = threads;

    struct convd_backend_info info;
    memset(&info, 0, sizeof(info));
    snprintf(info.name, sizeof(info.name), "cpu");
    char model[96];
    cpub_cpu_model(model, sizeof(model));
    snprintf(info.device, sizeof(info.device), "cpu: %d thread%s (%s, %s kernels)", threads,
             threads == 1 ? "" : "s", model, cpu_isa_best()->name);
    info.max_workers = 1;

    *ret_ctx = be;
    *ret_info = info;
    return 0;
}

static void cpub_destroy(void *ctx)
{
    struct cpub_ctx *be = ctx;
    if (be == NULL)
        return;
    cpu_pool_destroy(be->pool);
    free(be);
}

static int cpub_supports(void *ctx, const struct convd_problem *p, char *why, size_t why_len)
{
    (void)ctx;
    struct cpu_plan plan;
    int rc = cpu_plan_init(p, NULL, 0, &plan);
    if (rc == CONVD_ETOOBIG)
        return why_fail(why, why_len, rc,
                        "the cpu backend would need more than %zu MiB of scratch per thread for "
                        "one output row of this problem",
                        CPU_SCRATCH_MAX >> 20);
    if (rc != 0)
        return why_fail(why, why_len, rc, "the cpu backend cannot plan this problem: %s",
                        convd_strerror(rc));
    return 0;
}

static int cpub_mem_import(void *ctx, struct convd_mem *m, char *why, size_t why_len)
{
    (void)ctx;
    if (m == NULL) {
        return why_fail(why, why_len, CONVD_EINVAL, "cpu backend: memory is NULL");
    }
    switch (m->kind) {
    case CONVD_MEM_HOST:
        if (m->host == NULL && m->size > 0) {
            return why_fail(why, why_len, CONVD_EINVAL,
                            "cpu backend: host memory of %llu bytes has no mapping",
                            (unsigned long long)m->size);
        }
        return 0;
    case CONVD_MEM_DEVICE:
        return why_fail(why, why_len, CONVD_EUNSUPPORTED,
                        "the cpu backend cannot access GPU memory");
    }
    return why_fail(why, why_len, CONVD_EINVAL, "cpu backend: unknown memory kind %d",
                    (int)m->kind);
}

static void cpub_mem_release(void *ctx, struct convd_mem *m)
{
    /* Host memory needs no pinning or handle, so there is nothing to undo. */
    (void)ctx;
    (void)m;
}

static uint64_t cpub_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cpub_job_fail(struct convd_job *job, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int cpub_job_fail(struct convd_job *job, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(job->error, sizeof(job->error), fmt, ap);
    va_end(ap);
    job->status = status;
    return status;
}

/* The host address of an admitted view (backend.h: host memory this backend imported, inside
 * it, the problem's bytes, element-aligned). */
static void *cpub_view(const struct convd_tensor_view *v, uint64_t need, size_t esz)
{
    assert(v->mem != NULL && v->mem->kind == CONVD_MEM_HOST && v->mem->host != NULL);
    assert(v->offset <= v->mem->size && v->bytes <= v->mem->size - v->offset);
    assert(v->bytes == need);
    const uintptr_t addr = (uintptr_t)v->mem->host + (uintptr_t)v->offset;
    assert(addr % esz == 0);
    (void)need, (void)esz;
    return (void *)addr;
}

/* Resolves an admitted job's tensors and sizes. */
static void cpub_job_prepare(const struct convd_job *job, struct convd_tensors *ret_t,
                             struct convd_problem_sizes *ret_z)
{
    const struct convd_problem *p = &job->problem;
    struct convd_problem_sizes z;
    convd_problem_sizes_of(p, &z);
    const size_t esz = convd_dtype_size(p->dtype);
    ret_t->input = cpub_view(&job->input, z.input_bytes, esz);
    ret_t->weight = cpub_view(&job->weight, z.weight_bytes, esz);
    ret_t->bias = p->has_bias ? cpub_view(&job->bias, z.bias_bytes, esz) : NULL;
    ret_t->output = cpub_view(&job->output, z.output_bytes, esz);
    *ret_z = z;
}

static void cpub_job_run(struct convd_job *job, const struct convd_tensors *t,
                         struct cpu_pool *pool, struct cpu_scratch *scratch)
{
    uint64_t t0 = cpub_now_ns();
    struct cpu_plan plan;
    int rc = cpu_plan_init(&job->problem, NULL, 0, &plan);
    if (rc == 0)
        rc = cpu_conv_execute(&plan, t, pool, scratch);
    job->exec_ns = cpub_now_ns() - t0;
    if (rc != 0) {
        cpub_job_fail(job, rc, "cpu backend: %s", convd_strerror(rc));
        return;
    }
    job->status = 0;
    job->error[0] = '\0';
}

struct cpub_small {
    struct convd_job *job;
    struct convd_tensors t;
};

static void cpub_small_task(void *arg, size_t i, struct cpu_scratch *scratch)
{
    struct cpub_small *s = &((struct cpub_small *)arg)[i];
    cpub_job_run(s->job, &s->t, NULL, scratch);
}

static int cpub_run_batch(void *ctx, unsigned worker, struct convd_job *const *jobs, size_t n)
{
    struct cpub_ctx *be = ctx;
    (void)worker;
    if (be == NULL || (jobs == NULL && n > 0))
        return CONVD_EINVAL;

    /* Small jobs are collected and spread over the pool one per thread; big ones use the whole
     * pool each, one after another. */
    struct cpub_small *small = n > 1 ? calloc(n, sizeof(*small)) : NULL;
    size_t nsmall = 0;
    for (size_t i = 0; i < n; i++) {
        struct convd_job *job = jobs[i];
        struct convd_tensors t = {0};
        struct convd_problem_sizes z = {0};
        job->exec_ns = 0;
        cpub_job_prepare(job, &t, &z);
        if (small != NULL && z.flops < CPUB_SMALL_JOB_FLOPS && be->threads > 1) {
            small[nsmall].job = job;
            small[nsmall].t = t;
            nsmall++;
            continue;
        }
        cpub_job_run(job, &t, be->pool, NULL);
    }
    if (nsmall == 1) {
        cpub_job_run(small[0].job, &small[0].t, be->pool, NULL);
    } else if (nsmall > 1) {
        /* Each thread's scratch is grown by the task that needs it (cpu_conv_execute). */
        cpu_pool_run(be->pool, cpub_small_task, small, nsmall);
    }
    free(small);
    /* A large problem's scratch is not kept for the next batch: the daemon may be idle for
     * hours after it. */
    if (cpu_pool_trim(be->pool, CPU_SCRATCH_KEEP) > 0)
        malloc_trim(0);
    return 0;
}

const struct convd_backend_ops convd_cpu_backend_ops = {
    .name = "cpu",
    .init = cpub_init,
    .destroy = cpub_destroy,
    .supports = cpub_supports,
    .mem_import = cpub_mem_import,
    .mem_release = cpub_mem_release,
    .run_batch = cpub_run_batch,
};
