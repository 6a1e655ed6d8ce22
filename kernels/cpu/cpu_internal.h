/*
 * Internals of the CPU implementation: the thread pool, per-thread scratch, the execution plan
 * of one problem and the per-ISA kernel tables. Not installed; the tests include it to run every
 * ISA variant and to reach the pool directly.
 *
 * How a convolution runs: cpu_plan_init() takes a valid problem, picks an algorithm and a tiling
 * that depend only on the problem (never on the thread count, so that any number of threads
 * gives bit-identical results), and says how many independent tasks there are and how much
 * scratch one task needs. The tasks then run on a pool; each one reads its slice of the input,
 * converts it to fp32 in its own scratch, computes in fp32 and rounds once when it stores.
 */
#ifndef CONVD_CPU_INTERNAL_H
#define CONVD_CPU_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "convd_kernels.h"

/* ---- scratch ---------------------------------------------------------------------------- */

/* A grow-only, 64-byte aligned buffer. Kept between calls so that steady-state runs neither
 * allocate nor fault pages in. */
struct cpu_scratch {
    void *buf;
    size_t cap;
};

/* Makes s->buf at least `bytes` long. Returns 0 or CONVD_ENOMEM (s unchanged). */
int cpu_scratch_reserve(struct cpu_scratch *s, size_t bytes);
void cpu_scratch_free(struct cpu_scratch *s);

/* ---- thread pool ------------------------------------------------------------------------ */

/* One task of a parallel loop: `task` in [0, ntasks), `scratch` is the running thread's own. */
typedef void (*cpu_task_fn)(void *arg, size_t task, struct cpu_scratch *scratch);

struct cpu_pool;

/* Creates a pool of `threads` threads in total: the caller of cpu_pool_run() is one of them, so
 * threads - 1 are started (none for 1). Returns 0, CONVD_EINVAL or CONVD_ENOMEM. */
int cpu_pool_create(int threads, struct cpu_pool **ret_pool);
/* Stops and joins the threads and frees the scratch. Accepts NULL. */
void cpu_pool_destroy(struct cpu_pool *pool);
int cpu_pool_threads(const struct cpu_pool *pool);
/* Grows the scratch of every thread of the pool to at least `bytes`. */
int cpu_pool_reserve(struct cpu_pool *pool, size_t bytes);
/* Frees the scratch of every thread that holds more than `keep` bytes. Call only between runs.
 * Returns the bytes freed. */
size_t cpu_pool_trim(struct cpu_pool *pool, size_t keep);
/* Runs fn(arg, i, scratch) for every i in [0, ntasks) on the pool's threads and the caller, and
 * returns when all are done. Tasks are handed out dynamically. One run at a time per pool: the
 * caller must serialise its own calls. */
void cpu_pool_run(struct cpu_pool *pool, cpu_task_fn fn, void *arg, size_t ntasks);
/* The scratch of thread `tid` (0 is the caller's). */
struct cpu_scratch *cpu_pool_scratch(struct cpu_pool *pool, int tid);

/* Number of online CPUs, at least 1. */
int cpu_online_cpus(void);

/* ---- plan ------------------------------------------------------------------------------- */

enum cpu_algo {
    /* Input repacked per task into zero-padded fp32 planes (one per channel and stride phase),
     * output pixels flattened over the padded width and vectorised; output channels broadcast.
     * Runs every problem. */
    CPU_ALGO_PLANAR = 1,
    /* NHWC with small power-of-two groups (cpg = kpg = M, or depthwise with multiplier M):
     * vectorised across channels, whole groups per vector, directly on the tensors. */
    CPU_ALGO_NHWC_CV = 2,
};

#define CPU_KB_MAX   8    /* most output channels one planar micro-kernel holds */
#define CPU_TAPS_MAX 4096 /* R*S above which planar computes tap offsets in chunks */

struct cpu_isa;

struct cpu_plan {
    struct convd_problem p;
    const struct cpu_isa *isa;
    enum cpu_algo algo;
    int32_t oh, ow, cpg, kpg, taps;
    size_t esz;           /* bytes per element of the tensors */
    size_t tasks;         /* independent tasks */
    size_t scratch_bytes; /* per task */

    /* Tiling shared by the algorithms: a task is (image, block of groups, band of rows). */
    int32_t gb;  /* groups per task */
    int32_t ngb; /* group blocks */
    int32_t bh;  /* output rows per band */
    int32_t nbands;

    /* CPU_ALGO_PLANAR. Each dimension is split into planes one of two ways: by stride phase
     * (plane j holds padded coordinates i * stride + j; when stride <= filter extent) or by
     * filter tap (plane j holds i * stride + j * dil; when the stride is larger, so that a huge
     * stride never costs more planes than taps). */
    bool row_phase, col_phase;
    int32_t nrp, ncp; /* row planes, column planes */
    int32_t wq;       /* width of a plane (and of the flattened output rows) */
    int32_t bq;       /* rows of a plane for a full band */
    size_t ps;        /* floats per plane */
    size_t cs;        /* floats per channel (nrp * ncp * ps) */
    size_t ldt;       /* floats per output channel in the tile */
    int32_t kb;       /* output channels per micro-kernel block (the last may be narrower) */

    /* CPU_ALGO_NHWC_CV */
    int32_t cb;                 /* channel vectors (VL input channels each) per task */
    int32_t ncb;                /* blocks of channel vectors */
    int32_t cv_ow_lo, cv_ow_hi; /* output columns whose taps all fall inside the image */
};

/* Most scratch one task may use. Plans are sized by the tensors and the work (a few MiB for the
 * largest layers of real networks); only a problem whose single output row needs more than this
 * is refused, rather than letting one request grow every thread's scratch without bound. */
#define CPU_SCRATCH_MAX ((size_t)256 << 20)
/* Scratch a thread keeps between batches; more is returned once the batch is done. */
#define CPU_SCRATCH_KEEP ((size_t)8 << 20)

/* Fills *ret_plan for running p, which must be valid (convd_problem_check() passed where it came
 * in; asserted), with `isa` (NULL: the best one this CPU runs) and algorithm `algo` (0: the
 * planner's choice). Returns 0, CONVD_EUNSUPPORTED when the forced algorithm cannot run p, or
 * CONVD_ETOOBIG when a task would need more than CPU_SCRATCH_MAX of scratch. */
int cpu_plan_init(const struct convd_problem *p, const struct cpu_isa *isa, enum cpu_algo algo,
                  struct cpu_plan *ret_plan);

/* What a task needs: the plan and the tensors. */
struct cpu_job_ctx {
    const struct cpu_plan *plan;
    struct convd_tensors t;
};

/* Runs a planned problem: on `pool` when it is not NULL, else serially on the calling thread
 * with `scratch`. Returns 0 or CONVD_ENOMEM. */
int cpu_conv_execute(const struct cpu_plan *plan, const struct convd_tensors *t,
                     struct cpu_pool *pool, struct cpu_scratch *scratch);

/* convd_cpu_conv() with an explicit ISA (NULL: the best) and algorithm (0: the planner's
 * choice). For tests and benchmarks. */
int cpu_conv_ex(const struct convd_problem *p, const struct convd_tensors *t, int threads,
                const struct cpu_isa *isa, enum cpu_algo algo);

/* ---- ISA variants ----------------------------------------------------------------------- */

/* One compiled variant of the kernels. Each is the same source (kern_body.h) compiled for a
 * different instruction set and vector width. */
struct cpu_isa {
    const char *name;
    int vl;    /* floats per vector */
    int kbmax; /* widest planar block */
    int (*usable)(void);
    cpu_task_fn planar_task;
    cpu_task_fn cv_task;
};

extern const struct cpu_isa cpu_isa_avx512;
extern const struct cpu_isa cpu_isa_avx2;
extern const struct cpu_isa cpu_isa_generic;

/* The variants in order of preference, NULL-terminated. */
extern const struct cpu_isa *const cpu_isa_list[];

/* The best variant this CPU runs; $CONVD_CPU_ISA ("avx512", "avx2", "generic") overrides it
 * when that variant is usable. */
const struct cpu_isa *cpu_isa_best(void);
/* The variant of that name if this CPU runs it, else NULL. */
const struct cpu_isa *cpu_isa_find(const char *name);

#endif
