/*
 * convd_cpu_conv(): plans a problem (algorithm and tiling), finds a thread pool and runs the
 * plan's tasks on it. The kernels themselves are in kern_body.h, compiled once per ISA.
 *
 * The plan depends on the problem and the ISA only, never on the number of threads: each output
 * element is computed by one task in one fixed order, so 1 thread and 16 give the same bits.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "conv_math.h"
#include "cpu_internal.h"

/* Pixels a planar task aims for: enough to amortise packing its weights, few enough that the
 * tasks of a batch-1 problem keep two to a few dozen threads busy. */
#define PLAN_PLANAR_PIXELS 1024
/* Floats of packed input a planar task may hold: half of a 1 MiB L2. */
#define PLAN_PLANAR_INPUT_FLOATS (128 * 1024)

/* ---- ISA selection ---------------------------------------------------------------------- */

const struct cpu_isa *const cpu_isa_list[] = {
#if defined(__x86_64__)
    &cpu_isa_avx512,
    &cpu_isa_avx2,
#endif
    &cpu_isa_generic,
    NULL,
};

const struct cpu_isa *cpu_isa_find(const char *name)
{
    for (size_t i = 0; cpu_isa_list[i] != NULL; i++)
        if (strcmp(cpu_isa_list[i]->name, name) == 0)
            return cpu_isa_list[i]->usable() ? cpu_isa_list[i] : NULL;
    return NULL;
}

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static const struct cpu_isa *isa_best;

static void isa_pick(void)
{
    const char *env = getenv("CONVD_CPU_ISA");
    if (env != NULL && *env != '\0')
        isa_best = cpu_isa_find(env);
    for (size_t i = 0; isa_best == NULL && cpu_isa_list[i] != NULL; i++)
        if (cpu_isa_list[i]->usable())
            isa_best = cpu_isa_list[i];
}

const struct cpu_isa *cpu_isa_best(void)
{
    pthread_once(&isa_once, isa_pick);
    return isa_best;
}

/* ---- planning --------------------------------------------------------------------------- */

static size_t plan_round_up(size_t v, size_t m)
{
    return (v + m - 1) / m * m;
}

/* Plane geometry and scratch of a planar plan for the current gb and bh. */
static void plan_planar_sizes(struct cpu_plan *pl)
{
    const struct convd_problem *p = &pl->p;
    const int32_t offr_max = pl->row_phase ? (p->r - 1) * p->dil_h / p->stride_h : 0;
    const int32_t offc_max = pl->col_phase ? (p->s - 1) * p->dil_w / p->stride_w : 0;

    pl->wq = pl->ow + offc_max;
    pl->bq = pl->bh + offr_max;
    pl->ldt = plan_round_up((size_t)pl->bh * pl->wq, 16);
    size_t reach = pl->ldt + (size_t)offr_max * pl->wq + (size_t)offc_max;
    size_t data = (size_t)pl->bq * pl->wq;
    pl->ps = plan_round_up(reach > data ? reach : data, 16);
    pl->cs = (size_t)pl->nrp * pl->ncp * pl->ps;

    size_t floats = plan_round_up((size_t)pl->gb * pl->kpg * pl->cpg * pl->taps, 16) +
                    (size_t)pl->gb * pl->cpg * pl->cs + (size_t)pl->gb * pl->kpg * pl->ldt;
    pl->scratch_bytes = floats * sizeof(float) + (size_t)pl->taps * sizeof(ptrdiff_t) + 64;
}

static void plan_planar(struct cpu_plan *pl)
{
    const struct convd_problem *p = &pl->p;
    pl->algo = CPU_ALGO_PLANAR;
    pl->row_phase = p->stride_h <= p->r;
    pl->col_phase = p->stride_w <= p->s;
    pl->nrp = pl->row_phase ? p->stride_h : p->r;
    pl->ncp = pl->col_phase ? p->stride_w : p->s;

    /* Output channels in blocks of at most kbmax, as even as possible. */
    int32_t nkb = (pl->kpg + pl->isa->kbmax - 1) / pl->isa->kbmax;
    pl->kb = (pl->kpg + nkb - 1) / nkb;

    /* In NHWC a group's channels are a short run inside each pixel; a task takes enough groups
     * to read whole cache lines. */
    pl->gb = 1;
    if (p->layout == CONVD_LAYOUT_NHWC) {
        int32_t want = (16 + pl->cpg - 1) / pl->cpg;
        pl->gb = want < p->groups ? want : p->groups;
    }
    int32_t wq = pl->ow + (pl->col_phase ? (p->s - 1) * p->dil_w / p->stride_w : 0);
    int32_t bh = (PLAN_PLANAR_PIXELS + wq - 1) / wq;
    pl->bh = bh < pl->oh ? bh : pl->oh;

    for (;;) {
        plan_planar_sizes(pl);
        if ((size_t)pl->gb * pl->cpg * pl->cs <= PLAN_PLANAR_INPUT_FLOATS)
            break;
        if (pl->bh > 1)
            pl->bh = (pl->bh + 1) / 2;
        else if (pl->gb > 1)
            pl->gb = (pl->gb + 1) / 2;
        else
            break;
    }
    pl->ngb = (p->groups + pl->gb - 1) / pl->gb;
    pl->nbands = (pl->oh + pl->bh - 1) / pl->bh;
    pl->tasks = (size_t)p->n * pl->ngb * pl->nbands;
}

int cpu_plan_init(const struct convd_problem *p, const struct cpu_isa *isa,
                  struct cpu_plan *ret_plan)
{
    struct convd_problem_sizes z;
    int rc = convd_problem_sizes(p, &z, NULL, 0);
    if (rc != 0)
        return rc;
    if (isa == NULL)
        isa = cpu_isa_best();

    struct cpu_plan pl;
    memset(&pl, 0, sizeof(pl));
    pl.p = *p;
    pl.isa = isa;
    pl.oh = z.out_h;
    pl.ow = z.out_w;
    pl.cpg = p->c / p->groups;
    pl.kpg = p->k / p->groups;
    pl.taps = p->r * p->s;
    pl.esz = convd_dtype_size(p->dtype);
    plan_planar(&pl);
    *ret_plan = pl;
    return 0;
}

/* ---- execution -------------------------------------------------------------------------- */

static cpu_task_fn plan_task_fn(const struct cpu_plan *pl)
{
    switch (pl->algo) {
    case CPU_ALGO_NHWC_DW:
        return pl->isa->nhwc_dw_task;
    case CPU_ALGO_NHWC_GEMM:
        return pl->isa->nhwc_gemm_task;
    case CPU_ALGO_PLANAR:
        break;
    }
    return pl->isa->planar_task;
}

int cpu_conv_execute(const struct cpu_plan *plan, const struct convd_tensors *t,
                     struct cpu_pool *pool, struct cpu_scratch *scratch)
{
    struct cpu_job_ctx ctx = {.plan = plan, .t = *t};
    cpu_task_fn fn = plan_task_fn(plan);
    int rc;
    if (pool != NULL) {
        rc = cpu_pool_reserve(pool, plan->scratch_bytes);
        if (rc != 0)
            return rc;
        cpu_pool_run(pool, fn, &ctx, plan->tasks);
        return 0;
    }
    rc = cpu_scratch_reserve(scratch, plan->scratch_bytes);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < plan->tasks; i++)
        fn(&ctx, i, scratch);
    return 0;
}

/* ---- pools for convd_cpu_conv() ---------------------------------------------------------- */

/* Idle pools kept between calls, so that repeated calls neither start threads nor fault in
 * scratch. A call takes a pool of its size out of the cache (or makes one) and puts it back
 * after; concurrent calls therefore never share a pool. */
#define POOL_CACHE_SIZE 8

static pthread_mutex_t pool_cache_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cpu_pool *pool_cache[POOL_CACHE_SIZE];

static int pool_acquire(int threads, struct cpu_pool **ret_pool)
{
    struct cpu_pool *pool = NULL;
    pthread_mutex_lock(&pool_cache_mu);
    for (int i = 0; i < POOL_CACHE_SIZE; i++)
        if (pool_cache[i] != NULL && cpu_pool_threads(pool_cache[i]) == threads) {
            pool = pool_cache[i];
            pool_cache[i] = NULL;
            break;
        }
    pthread_mutex_unlock(&pool_cache_mu);
    if (pool != NULL) {
        *ret_pool = pool;
        return 0;
    }
    return cpu_pool_create(threads, ret_pool);
}

static void pool_release(struct cpu_pool *pool)
{
    pthread_mutex_lock(&pool_cache_mu);
    for (int i = 0; i < POOL_CACHE_SIZE; i++)
        if (pool_cache[i] == NULL) {
            pool_cache[i] = pool;
            pool = NULL;
            break;
        }
    pthread_mutex_unlock(&pool_cache_mu);
    cpu_pool_destroy(pool);
}

int cpu_conv_isa(const struct convd_problem *p, const struct convd_tensors *t, int threads,
                 const struct cpu_isa *isa)
{
    if (p == NULL || t == NULL || threads < 0)
        return CONVD_EINVAL;
    struct cpu_plan plan;
    int rc = cpu_plan_init(p, isa, &plan);
    if (rc != 0)
        return rc;
    if (t->input == NULL || t->weight == NULL || t->output == NULL ||
        (p->has_bias && t->bias == NULL))
        return CONVD_EINVAL;

    if (threads == 0)
        threads = cpu_online_cpus();
    if ((size_t)threads > plan.tasks)
        threads = (int)plan.tasks;

    struct cpu_pool *pool;
    rc = pool_acquire(threads, &pool);
    if (rc != 0)
        return rc;
    rc = cpu_conv_execute(&plan, t, pool, NULL);
    pool_release(pool);
    return rc;
}

int convd_cpu_conv(const struct convd_problem *p, const struct convd_tensors *t, int threads)
{
    return cpu_conv_isa(p, t, threads, NULL);
}
