/*
 * A small persistent thread pool for parallel loops over independent tasks, plus the grow-only
 * scratch buffers each of its threads owns.
 *
 * Convolutions at batch 1 take 50 us to a few ms, so the cost of waking threads matters: workers
 * spin for a short while after a run before they sleep on the condition variable, and the caller
 * works on tasks itself instead of waiting. Tasks are handed out from an atomic counter, so a
 * thread that wakes late simply finds less (or nothing) left to do; the caller waits only for
 * the tasks and for the workers that actually joined the run, never for sleepers.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "cpu_internal.h"

#define POOL_MAX_THREADS 256
#define POOL_SPIN_NS     60000 /* how long an idle worker or a waiting caller spins before sleeping */

struct pool_worker {
    struct cpu_pool *pool;
    pthread_t thread;
    int tid;
};

struct cpu_pool {
    int nthreads;
    struct pool_worker *workers; /* nthreads - 1 */
    struct cpu_scratch *scratch; /* nthreads */

    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* a new run or stop */
    pthread_cond_t cv_done; /* a worker left a run */
    bool stop;

    /* The current run. gen changes (under mu) when a run starts; the other fields are written
     * before that and read by workers after they joined under mu. */
    _Atomic uint64_t gen;
    cpu_task_fn fn;
    void *arg;
    size_t ntasks;
    _Atomic size_t next; /* next task to hand out */
    _Atomic size_t done; /* tasks finished */
    _Atomic int in_run;  /* workers inside the run (changed under mu) */
    /* True from the start of a run until its caller has seen it finish (both under mu). A worker
     * that wakes late must not join a finished run: its fn and arg may already be freed, and the
     * task counter may already belong to the next run. */
    bool open;
};

int cpu_scratch_reserve(struct cpu_scratch *s, size_t bytes)
{
    if (bytes <= s->cap)
        return 0;
    /* Round up so that a slowly growing sequence of problems does not reallocate each time. */
    size_t cap = (bytes + 65535) & ~(size_t)65535;
    void *p = aligned_alloc(64, cap);
    if (p == NULL)
        return CONVD_ENOMEM;
    free(s->buf);
    s->buf = p;
    s->cap = cap;
    return 0;
}

void cpu_scratch_free(struct cpu_scratch *s)
{
    free(s->buf);
    s->buf = NULL;
    s->cap = 0;
}

int cpu_online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        return 1;
    return n > POOL_MAX_THREADS ? POOL_MAX_THREADS : (int)n;
}

static uint64_t pool_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void pool_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Takes tasks until none are left. */
static void pool_work(struct cpu_pool *pool, cpu_task_fn fn, void *arg, size_t ntasks, int tid)
{
    struct cpu_scratch *s = &pool->scratch[tid];
    for (;;) {
        size_t i = atomic_fetch_add_explicit(&pool->next, 1, memory_order_relaxed);
        if (i >= ntasks)
            break;
        fn(arg, i, s);
        atomic_fetch_add_explicit(&pool->done, 1, memory_order_release);
    }
}

static void *pool_main(void *opaque)
{
    struct pool_worker *w = opaque;
    struct cpu_pool *pool = w->pool;
    uint64_t seen = 0;

    for (;;) {
        /* Spin a little: back-to-back runs (a benchmark, a daemon batch) then start at once. */
        uint64_t t0 = pool_now_ns();
        for (unsigned i = 0;; i++) {
            if (atomic_load_explicit(&pool->gen, memory_order_acquire) != seen)
                break;
            if ((i & 63) == 63 && pool_now_ns() - t0 > POOL_SPIN_NS)
                break;
            pool_relax();
        }
        pthread_mutex_lock(&pool->mu);
        while (!pool->stop && atomic_load_explicit(&pool->gen, memory_order_relaxed) == seen)
            pthread_cond_wait(&pool->cv_work, &pool->mu);
        if (pool->stop) {
            pthread_mutex_unlock(&pool->mu);
            break;
        }
        seen = atomic_load_explicit(&pool->gen, memory_order_relaxed);
        if (!pool->open) {
            pthread_mutex_unlock(&pool->mu);
            continue;
        }
        cpu_task_fn fn = pool->fn;
        void *arg = pool->arg;
        size_t ntasks = pool->ntasks;
        atomic_fetch_add_explicit(&pool->in_run, 1, memory_order_relaxed);
        pthread_mutex_unlock(&pool->mu);

        pool_work(pool, fn, arg, ntasks, w->tid);

        pthread_mutex_lock(&pool->mu);
        atomic_fetch_sub_explicit(&pool->in_run, 1, memory_order_release);
        pthread_cond_signal(&pool->cv_done);
        pthread_mutex_unlock(&pool->mu);
    }
    return NULL;
}

int cpu_pool_create(int threads, struct cpu_pool **ret_pool)
{
    if (threads < 1 || threads > POOL_MAX_THREADS || ret_pool == NULL)
        return CONVD_EINVAL;

    int rc = CONVD_ENOMEM;
    int started = 0;
    struct cpu_pool *pool = calloc(1, sizeof(*pool));
    if (pool == NULL)
        return CONVD_ENOMEM;
    pool->nthreads = threads;
    pool->scratch = calloc((size_t)threads, sizeof(*pool->scratch));
    pool->workers = calloc((size_t)threads, sizeof(*pool->workers));
    if (pool->scratch == NULL || pool->workers == NULL)
        goto fail;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv_work, NULL);
    pthread_cond_init(&pool->cv_done, NULL);

    for (int i = 1; i < threads; i++) {
        struct pool_worker *w = &pool->workers[i - 1];
        w->pool = pool;
        w->tid = i;
        if (pthread_create(&w->thread, NULL, pool_main, w) != 0) {
            rc = CONVD_ENOMEM;
            goto fail;
        }
        started++;
    }
    *ret_pool = pool;
    return 0;

fail:
    if (pool->workers != NULL && pool->scratch != NULL) {
        pthread_mutex_lock(&pool->mu);
        pool->stop = true;
        pthread_cond_broadcast(&pool->cv_work);
        pthread_mutex_unlock(&pool->mu);
        for (int i = 0; i < started; i++)
            pthread_join(pool->workers[i].thread, NULL);
        pthread_cond_destroy(&pool->cv_done);
        pthread_cond_destroy(&pool->cv_work);
        pthread_mutex_destroy(&pool->mu);
    }
    free(pool->workers);
    free(pool->scratch);
    free(pool);
    return rc;
}

void cpu_pool_destroy(struct cpu_pool *pool)
{
    if (pool == NULL)
        return;
    pthread_mutex_lock(&pool->mu);
    pool->stop = true;
    pthread_cond_broadcast(&pool->cv_work);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 0; i < pool->nthreads - 1; i++)
        pthread_join(pool->workers[i].thread, NULL);
    for (int i = 0; i < pool->nthreads; i++)
        cpu_scratch_free(&pool->scratch[i]);
    pthread_cond_destroy(&pool->cv_done);
    pthread_cond_destroy(&pool->cv_work);
    pthread_mutex_destroy(&pool->mu);
    free(pool->workers);
    free(pool->scratch);
    free(pool);
}

int cpu_pool_threads(const struct cpu_pool *pool)
{
    return pool->nthreads;
}

struct cpu_scratch *cpu_pool_scratch(struct cpu_pool *pool, int tid)
{
    return &pool->scratch[tid];
}

int cpu_pool_reserve(struct cpu_pool *pool, size_t bytes)
{
    for (int i = 0; i < pool->nthreads; i++) {
        int rc = cpu_scratch_reserve(&pool->scratch[i], bytes);
        if (rc != 0)
            return rc;
    }
    return 0;
}

size_t cpu_pool_trim(struct cpu_pool *pool, size_t keep)
{
    size_t freed = 0;
    for (int i = 0; i < pool->nthreads; i++) {
        if (pool->scratch[i].cap > keep) {
            freed += pool->scratch[i].cap;
            cpu_scratch_free(&pool->scratch[i]);
        }
    }
    return freed;
}

static bool pool_finished(struct cpu_pool *pool, size_t ntasks)
{
    return atomic_load_explicit(&pool->done, memory_order_acquire) == ntasks &&
           atomic_load_explicit(&pool->in_run, memory_order_acquire) == 0;
}

void cpu_pool_run(struct cpu_pool *pool, cpu_task_fn fn, void *arg, size_t ntasks)
{
    if (ntasks == 0)
        return;
    if (pool->nthreads == 1 || ntasks == 1) {
        for (size_t i = 0; i < ntasks; i++)
            fn(arg, i, &pool->scratch[0]);
        return;
    }

    pthread_mutex_lock(&pool->mu);
    pool->fn = fn;
    pool->arg = arg;
    pool->ntasks = ntasks;
    atomic_store_explicit(&pool->next, 0, memory_order_relaxed);
    atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
    pool->open = true;
    atomic_fetch_add_explicit(&pool->gen, 1, memory_order_release);
    pthread_cond_broadcast(&pool->cv_work);
    pthread_mutex_unlock(&pool->mu);

    pool_work(pool, fn, arg, ntasks, 0);

    /* Spin briefly for the workers still on their last task, then close the run under the
     * mutex so that no late worker can join it, and wait for those inside to leave. */
    uint64_t t0 = pool_now_ns();
    for (unsigned i = 0; !pool_finished(pool, ntasks); i++) {
        if ((i & 63) == 63 && pool_now_ns() - t0 > POOL_SPIN_NS)
            break;
        pool_relax();
    }
    pthread_mutex_lock(&pool->mu);
    pool->open = false;
    while (!pool_finished(pool, ntasks))
        pthread_cond_wait(&pool->cv_done, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
}
