/*
 * convd_cpu_conv(): plans a problem (algorithm and tiling), finds a thread pool and runs the
 * plan's tasks on it. The kernels themselves are in kern_body.h, compiled once per ISA.
 *
 * The plan depends on the problem and the ISA only, never on the number of threads: each output
 * element is computed by one task in one fixed order, so 1 thread and 16 give the same bits.
 */
#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "conv_math.h"
#include "cpu_internal.h"
#include "problem_priv.h"

/* Multiply-adds a task aims for: enough to amortise its packing and the pool's hand-out (a few
 * microseconds), few enough that a batch-1 problem still makes tasks for several threads. */
#define PLAN_TASK_MACS (384 * 1024)
/* Floats of packed input a planar task may hold: a quarter of a 1 MiB L2. */
#define PLAN_PLANAR_INPUT_FLOATS (64 * 1024)

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

/* Stride phases share rows between taps, but a phase plane spans every row from the first tap
 * to the last: with a large dilation that is mostly rows no tap reads (dilation 65536 made a
 * one-row output pack 131073 rows per plane). Phases are used only while they hold at most
 * twice the floats of one plane per tap. */
static bool plan_use_phase(int64_t stride, int64_t extent, int64_t dil, int64_t out)
{
    if (stride > extent)
        return false;
    int64_t phase = stride * (out + (extent - 1) * dil / stride);
    return phase <= 2 * extent * out;
}

/* Plane geometry and scratch of a planar plan for the current gb and bh. */
static void plan_planar_sizes(struct cpu_plan *pl)
{
    const struct convd_problem *p = &pl->p;
    pl->row_phase = plan_use_phase(p->stride_h, p->r, p->dil_h, pl->bh);
    pl->nrp = pl->row_phase ? p->stride_h : p->r;
    const int32_t offr_max = pl->row_phase ? (p->r - 1) * p->dil_h / p->stride_h : 0;
    const int32_t offc_max = pl->col_phase ? (p->s - 1) * p->dil_w / p->stride_w : 0;

    pl->wq = pl->ow + offc_max;
    pl->bq = pl->bh + offr_max;
    /* Pixel blocks are rounded up to whole vectors; rows and blocks spill up to a vector. */
    pl->ldt = plan_round_up((size_t)pl->bh * pl->wq, 16);
    size_t reach = pl->ldt + (size_t)offr_max * pl->wq + (size_t)offc_max;
    size_t data = (size_t)pl->bq * pl->wq + 16;
    pl->ps = plan_round_up(reach > data ? reach : data, 16);
    pl->cs = (size_t)pl->nrp * pl->ncp * pl->ps;

    size_t floats = (size_t)pl->gb * pl->cpg * pl->cs + (size_t)pl->gb * pl->kpg * pl->ldt + 16;
    if (pl->p.dtype != CONVD_DTYPE_FP32)
        floats += plan_round_up((size_t)pl->gb * pl->kpg * pl->cpg * pl->taps, 16);
    pl->scratch_bytes =
        floats * sizeof(float) + ((size_t)pl->taps + pl->cpg) * sizeof(ptrdiff_t) + 64;
}

static void plan_planar(struct cpu_plan *pl)
{
    const struct convd_problem *p = &pl->p;
    pl->algo = CPU_ALGO_PLANAR;
    pl->col_phase = plan_use_phase(p->stride_w, p->s, p->dil_w, pl->ow);
    pl->ncp = pl->col_phase ? p->stride_w : p->s;

    /* Output channels in blocks of at most kbmax, as even as possible. */
    int32_t nkb = (pl->kpg + pl->isa->kbmax - 1) / pl->isa->kbmax;
    pl->kb = (pl->kpg + nkb - 1) / nkb;

    /* Size a task by its work: full rows of as many groups as make PLAN_TASK_MACS, else a band
     * of rows of one group block. In NHWC a group's channels are a short run inside each pixel,
     * so a task takes at least enough groups to read whole cache lines. */
    const int32_t wq = pl->ow + (pl->col_phase ? (p->s - 1) * p->dil_w / p->stride_w : 0);
    const uint64_t row_macs = (uint64_t)wq * pl->kpg * pl->cpg * pl->taps; /* one group */
    const uint64_t group_macs = row_macs * (uint64_t)pl->oh;
    int64_t gb = group_macs >= PLAN_TASK_MACS ? 1 : (int64_t)(PLAN_TASK_MACS / group_macs);
    if (p->layout == CONVD_LAYOUT_NHWC) {
        int32_t lines = (16 + pl->cpg - 1) / pl->cpg;
        gb = gb > lines ? gb : lines;
    }
    pl->gb = gb < p->groups ? (int32_t)gb : p->groups;
    uint64_t bh = (PLAN_TASK_MACS + row_macs * pl->gb - 1) / (row_macs * pl->gb);
    pl->bh = bh < (uint64_t)pl->oh ? (int32_t)bh : pl->oh;

    for (;;) {
        plan_planar_sizes(pl);
        if ((size_t)pl->gb * pl->cpg * pl->cs <= PLAN_PLANAR_INPUT_FLOATS)
            break;
        if (pl->gb > 1)
            pl->gb = (pl->gb + 1) / 2;
        else if (pl->bh > 1)
            pl->bh = (pl->bh + 1) / 2;
        else
            break;
    }
    pl->ngb = (p->groups + pl->gb - 1) / pl->gb;
    pl->nbands = (pl->oh + pl->bh - 1) / pl->bh;
    pl->tasks = (size_t)p->n * pl->ngb * pl->nbands;
}

/* True when the channel-vectorised NHWC kernel runs p: whole groups of a power-of-two size up
 * to a vector, or depthwise with a multiplier of 2 or 4. */
static bool plan_cv_fits(const struct cpu_plan *pl)
{
    const int m = pl->cpg, vl = pl->isa->vl;
    if (pl->p.layout != CONVD_LAYOUT_NHWC || pl->isa->cv_task == NULL)
        return false;
    if (m == pl->kpg)
        return (m == 1 || m == 2 || m == 4 || m == 8 || m == 16) && m <= vl;
    return m == 1 && (pl->kpg == 2 || pl->kpg == 4);
}

static void plan_cv(struct cpu_plan *pl)
{
    const struct convd_problem *p = &pl->p;
    const int vl = pl->isa->vl;
    pl->algo = CPU_ALGO_NHWC_CV;

    /* output columns whose taps all land inside the image */
    int64_t lo = (p->pad_left + p->stride_w - 1) / p->stride_w;
    int64_t last = (int64_t)p->w - 1 + p->pad_left - (int64_t)(p->s - 1) * p->dil_w;
    int64_t hi = last < 0 ? 0 : last / p->stride_w + 1;
    if (hi > pl->ow)
        hi = pl->ow;
    if (lo > hi)
        lo = hi;
    pl->cv_ow_lo = (int32_t)lo;
    pl->cv_ow_hi = (int32_t)hi;

    /* A task covers a band of rows for a run of channel vectors: all of them when their
     * weights fit in half of L1, so that each input pixel is read whole, once per band. */
    const int32_t nvec = (p->c + vl - 1) / vl;
    const int32_t m = pl->cpg > pl->kpg ? pl->cpg : pl->kpg;
    const size_t wvec_bytes = (size_t)pl->taps * m * vl * sizeof(float);
    size_t cb = (24 * 1024) / wvec_bytes;
    pl->cb = cb < 1 ? 1 : cb < (size_t)nvec ? (int32_t)cb : nvec;
    pl->ncb = (nvec + pl->cb - 1) / pl->cb;
    const uint64_t row_macs = (uint64_t)pl->ow * pl->taps * vl * m * pl->cb;
    uint64_t bh = (PLAN_TASK_MACS + row_macs - 1) / row_macs;
    pl->bh = bh < (uint64_t)pl->oh ? (int32_t)bh : pl->oh;
    pl->nbands = (pl->oh + pl->bh - 1) / pl->bh;
    pl->tasks = (size_t)p->n * pl->ncb * pl->nbands;
    pl->scratch_bytes = (size_t)pl->cb * (wvec_bytes + (size_t)pl->kpg * vl * sizeof(float)) + 64;
}

int cpu_plan_init(const struct convd_problem *p, const struct cpu_isa *isa, enum cpu_algo algo,
                  struct cpu_plan *ret_plan)
{
    assert(convd_problem_check(p, NULL, 0) == 0);
    struct convd_problem_sizes z;
    convd_problem_sizes_of(p, &z);
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
    /* Channel-vectorised pays one shuffle per multiply-add for each extra channel of a group:
     * measured faster than planar up to two channels per group, slower from four on. */
    if (algo == 0)
        algo = plan_cv_fits(&pl) && pl.cpg <= 2 ? CPU_ALGO_NHWC_CV : CPU_ALGO_PLANAR;
    if (algo == CPU_ALGO_NHWC_CV && !plan_cv_fits(&pl))
        return CONVD_EUNSUPPORTED;
    if (algo == CPU_ALGO_NHWC_CV)
        plan_cv(&pl);
    else
        plan_planar(&pl);
    if (pl.scratch_bytes > CPU_SCRATCH_MAX)
        return CONVD_ETOOBIG;
    *ret_plan = pl;
    return 0;
}

/* ---- execution -------------------------------------------------------------------------- */

static cpu_task_fn plan_task_fn(const struct cpu_plan *pl)
{
    switch (pl->algo) {
    case CPU_ALGO_NHWC_CV:
        return pl->isa->cv_task;
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

int cpu_conv_ex(const struct convd_problem *p, const struct convd_tensors *t, int threads,
                const struct cpu_isa *isa, enum cpu_algo algo)
{
    if (p == NULL || t == NULL || threads < 0)
        return CONVD_EINVAL;
    /* The kernel API's entry: the one place a problem is checked on this path. */
    int rc = convd_problem_check(p, NULL, 0);
    if (rc != 0)
        return rc;
    struct cpu_plan plan;
    rc = cpu_plan_init(p, isa, algo, &plan);
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
    return cpu_conv_ex(p, t, threads, NULL, 0);
}
