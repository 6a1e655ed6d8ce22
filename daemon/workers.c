#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "convd/status.h"
#include "log.h"
#include "ring_layout.h"
#include "workers.h"

struct batch *batch_new(size_t n)
{
    struct batch *b = calloc(1, sizeof(*b) + n * sizeof(b->jobs[0]));
    if (b == NULL)
        return NULL;
    list_init(&b->link);
    b->n = n;
    return b;
}

static void *pool_thread(void *arg)
{
    struct worker *w = arg;
    struct worker_pool *p = w->pool;

    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (w->todo == NULL && !p->stop)
            pthread_cond_wait(&w->wake, &p->mu);
        if (w->todo == NULL)
            break;
        struct batch *b = w->todo;
        w->todo = NULL;
        pthread_mutex_unlock(&p->mu);

        b->start_ns = convd_now_ns();
        b->rc = be_run_batch(p->backend, w->index, b->jobs, b->n);
        b->end_ns = convd_now_ns();

        pthread_mutex_lock(&p->mu);
        list_add_tail(&p->done, &b->link);
        /* uv_async_send is the one libuv call that is safe from another thread; calls coalesce */
        uv_async_send(&p->async);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

unsigned pool_poll(struct worker_pool *p)
{
    if (!p->slots || p->busy + p->lane_busy == 0)
        return 0;
    /* Every slot is asked first, then the finished batches are handed over: one clock read
     * for the looks and one for their end, not two per busy slot (with completion words a
     * query is a load, cheaper than reading the clock). */
    unsigned done = 0;
    unsigned finished[POOL_MAX_SLOTS];
    int result[POOL_MAX_SLOTS];
    const uint64_t t0 = convd_now_ns();
    for (unsigned i = 0; i < p->nall; i++) {
        struct worker *w = &p->workers[i];
        if (!w->busy)
            continue;
        if (p->launcher && !__atomic_load_n(&w->launched, __ATOMIC_ACQUIRE))
            continue; /* still with the launch thread */
        int q = be_query(p->backend, i);
        if (q == 0) {
            w->looked_ns = t0;
            continue;
        }
        result[done] = q;
        finished[done++] = i;
    }
    const uint64_t t1 = convd_now_ns();
    p->query_ns += t1 - t0;
    for (unsigned k = 0; k < done; k++) {
        const unsigned i = finished[k];
        struct worker *w = &p->workers[i];
        struct batch *b = w->running;
        const uint64_t prev = w->looked_ns > b->launched_ns ? w->looked_ns : b->launched_ns;
        b->seen_lag_ns = t0 > prev ? t0 - prev : 0;
        w->looked_ns = 0;
        if (result[k] < 0)
            b->rc = result[k]; /* finished, and the backend is broken since */
        w->running = NULL;
        w->busy = false;
        if (i < p->n)
            p->busy--;
        else
            p->lane_busy--;
        b->end_ns = t1;
        p->on_done(p, b);
    }
    return done;
}

static void pool_wake(void *arg)
{
    uv_async_send(arg);
}

bool pool_arm(struct worker_pool *p)
{
    if (!p->slots || p->busy + p->lane_busy == 0)
        return p->busy > 0;
    if (pool_unlaunched(p) > 0) {
        /* A batch is still with the launch thread: nothing may be on the device to be told
         * about yet, and the loop may have requests waiting for that launch to return (the
         * daemon's launch_ahead). Do not sleep; a launch takes microseconds. */
        uv_async_send(&p->async);
        return true;
    }
    if (p->busy == 0)
        return false; /* lanes only: polled */
    struct worker *oldest = NULL;
    for (unsigned i = 0; i < p->n; i++)
        if (p->workers[i].busy &&
            (oldest == NULL || p->workers[i].running->seq < oldest->running->seq))
            oldest = &p->workers[i];
    if (be_notify(p->backend, oldest->index, pool_wake, &p->async) != 0) {
        /* No way to be told: do not sleep past the batch. */
        uv_async_send(&p->async);
    }
    return true;
}

static void pool_on_async(uv_async_t *h)
{
    struct worker_pool *p = h->data;
    if (p->slots) {
        pool_poll(p);
        return;
    }
    struct list_node done;
    list_init(&done);
    pthread_mutex_lock(&p->mu);
    list_splice_tail(&done, &p->done);
    pthread_mutex_unlock(&p->mu);
    while (!list_empty(&done)) {
        struct batch *b = list_entry(done.next, struct batch, link);
        list_del(&b->link);
        p->workers[b->worker].busy = false;
        p->busy--;
        p->on_done(p, b);
    }
}

int pool_start(struct worker_pool *p, uv_loop_t *loop, struct convd_backend *backend, unsigned n,
               bool lanes, pool_done_cb on_done, void *data)
{
    memset(p, 0, sizeof(*p));
    if (be_async(backend) && n == 0 && backend->info.default_slots != 0)
        n = backend->info.default_slots;
    if (be_async(backend) && (n == 0 || n > backend->info.max_slots))
        n = backend->info.max_slots;
    if (n == 0 || on_done == NULL)
        return CONVD_EINVAL;
    p->backend = backend;
    p->slots = be_async(backend);
    p->on_done = on_done;
    p->data = data;
    p->nall = n;
    if (lanes && p->slots && backend->info.lanes > 0 && backend->info.lane_depth > 0) {
        p->lanes = backend->info.lanes < POOL_MAX_LANES ? backend->info.lanes : POOL_MAX_LANES;
        p->lane_depth = backend->info.lane_depth;
        p->lane_base = backend->info.max_slots;
        p->nall = p->lane_base + p->lanes * p->lane_depth;
    }
    if (p->slots && p->nall > POOL_MAX_SLOTS)
        return CONVD_EINVAL; /* pool_poll and the launch queue hold at most that many */
    list_init(&p->done);
    p->workers = calloc(p->nall, sizeof(*p->workers));
    if (p->workers == NULL)
        return CONVD_ENOMEM;
    pthread_mutex_init(&p->mu, NULL);
    if (uv_async_init(loop, &p->async, pool_on_async) != 0) {
        pthread_mutex_destroy(&p->mu);
        free(p->workers);
        p->workers = NULL;
        return CONVD_EINTERNAL;
    }
    p->async.data = p;
    p->async_open = true;
    p->n = n;
    if (p->slots) {
        for (unsigned i = 0; i < p->nall; i++)
            p->workers[i].index = i;
        return 0;
    }

    /* Threads inherit the mask: block every signal so that SIGTERM and friends always reach the
     * loop's handlers, never a worker in the middle of a kernel. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = 0;
    for (unsigned i = 0; i < n; i++) {
        struct worker *w = &p->workers[i];
        w->pool = p;
        w->index = i;
        pthread_cond_init(&w->wake, NULL);
        if (pthread_create(&w->thread, NULL, pool_thread, w) != 0) {
            pthread_cond_destroy(&w->wake);
            log_err("cannot start worker thread %u", i);
            rc = CONVD_EINTERNAL;
            break;
        }
        w->started = true;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        pool_stop(p);
    return rc;
}

/* be_launch, counted in p->in_launch and p->launch_peak (any thread). */
static int pool_launch_counted(struct worker_pool *p, struct batch *b)
{
    unsigned now = __atomic_add_fetch(&p->in_launch, 1, __ATOMIC_RELAXED);
    unsigned peak = __atomic_load_n(&p->launch_peak, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&p->launch_peak, &peak, now, true,
                                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
    const int rc = be_launch(p->backend, b->worker, b->jobs, b->n);
    __atomic_sub_fetch(&p->in_launch, 1, __ATOMIC_RELAXED);
    return rc;
}

/* Counts the caller among the spinning launch threads (launchers_idle) unless launcher_spinners
 * already spin: a spinner keeps a CPU busy, and under many clients that CPU is a client's (16
 * spinning clients and three spinning threads on 16 CPUs, bench/gpu/NOTES.md round 28). */
static bool launcher_take_spin(struct worker_pool *p)
{
    int n = __atomic_load_n(&p->launchers_idle, __ATOMIC_SEQ_CST);
    do {
        if (p->launcher_spinners > 0 && (unsigned)n >= p->launcher_spinners)
            return false;
    } while (!__atomic_compare_exchange_n(&p->launchers_idle, &n, n + 1, false, __ATOMIC_SEQ_CST,
                                          __ATOMIC_SEQ_CST));
    return true;
}

/* A launch thread: takes the oldest batch of the loop's queue that no other thread took,
 * launches it in its slot, and marks the slot launched (release: the loop then sees what launch
 * wrote into the batch and jobs). Spins launcher_spin_ns after its last launch, then sleeps
 * until the loop signals; where launcher_spinners others already spin, it sleeps at once. */
static void *pool_launcher(void *arg)
{
    struct worker_pool *p = arg;
    (void)pthread_setname_np(pthread_self(), "convd-launch");
    uint64_t last = convd_now_ns();
    /* Counted in launchers_idle while it spins on an empty queue (pool_submit wakes a sleeper
     * only for batches no idle one can take). */
    bool idle = false;
    for (;;) {
        unsigned head = __atomic_load_n(&p->lq_head, __ATOMIC_SEQ_CST);
        if (head == __atomic_load_n(&p->lq_tail, __ATOMIC_SEQ_CST)) {
            if (convd_now_ns() - last < p->launcher_spin_ns && (idle || launcher_take_spin(p))) {
                if (!idle) {
                    idle = true;
                    continue; /* look at the queue again now that the loop may count on us */
                }
                convd_cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            /* Counted as sleeping before no longer idle: while this thread still looks at the
             * queue, the loop always sees it as one or the other. */
            __atomic_add_fetch(&p->launchers_sleeping, 1, __ATOMIC_SEQ_CST);
            if (idle) {
                idle = false;
                __atomic_sub_fetch(&p->launchers_idle, 1, __ATOMIC_SEQ_CST);
            }
            while (!p->launcher_stop && __atomic_load_n(&p->lq_head, __ATOMIC_SEQ_CST) ==
                                            __atomic_load_n(&p->lq_tail, __ATOMIC_SEQ_CST))
                pthread_cond_wait(&p->launch_wake, &p->mu);
            __atomic_sub_fetch(&p->launchers_sleeping, 1, __ATOMIC_SEQ_CST);
            bool stop = p->launcher_stop && __atomic_load_n(&p->lq_head, __ATOMIC_SEQ_CST) ==
                                                __atomic_load_n(&p->lq_tail, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&p->mu);
            if (stop)
                return NULL;
            last = convd_now_ns();
            continue;
        }
        /* No longer idle before the claim, so that the loop never counts on a thread that is
         * committed to a batch: at worst it wakes a sleeper for nothing. */
        if (idle) {
            idle = false;
            __atomic_sub_fetch(&p->launchers_idle, 1, __ATOMIC_SEQ_CST);
        }
        /* Read before the claim: once head moves past it, the entry may be reused. */
        struct batch *b = p->lq[head % POOL_MAX_SLOTS];
        if (!__atomic_compare_exchange_n(&p->lq_head, &head, head + 1, false, __ATOMIC_SEQ_CST,
                                         __ATOMIC_SEQ_CST))
            continue; /* another thread took it */
        /* The lane's earlier batch was claimed earlier (the queue is in order); another thread
         * may still be launching it. */
        const int lane = b->lane;
        const unsigned lane_seq = b->lane_seq;
        if (lane >= 0)
            while (__atomic_load_n(&p->lane_turn[lane], __ATOMIC_ACQUIRE) != lane_seq)
                convd_cpu_relax();
        const uint64_t t0 = convd_now_ns();
        const int rc = pool_launch_counted(p, b);
        last = convd_now_ns();
        if (lane >= 0)
            __atomic_store_n(&p->lane_turn[lane], lane_seq + 1, __ATOMIC_RELEASE);
        b->rc = rc;
        b->launch_ns = last - t0;
        b->launch_begin_ns = t0;
        b->launched_ns = last;
        /* From this store on the batch is the loop's, which may free it: b is not read again. */
        __atomic_store_n(&p->workers[b->worker].launched, 1, __ATOMIC_RELEASE);
        if (rc != 0)
            uv_async_send(&p->async); /* nothing in flight to notify about: wake the loop */
    }
}

int pool_start_launcher(struct worker_pool *p, unsigned n, uint64_t spin_ns, unsigned spinners)
{
    if (!p->slots || p->launcher || p->nall > POOL_MAX_SLOTS || n == 0 || n > POOL_MAX_LAUNCHERS)
        return CONVD_EINVAL;
    p->launcher_spin_ns = spin_ns;
    p->launcher_spinners = spinners;
    p->launcher_stop = false;
    p->nlaunchers = 0;
    pthread_cond_init(&p->launch_wake, NULL);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (unsigned i = 0; i < n; i++) {
        if (pthread_create(&p->launch_threads[i], NULL, pool_launcher, p) != 0)
            break;
        p->nlaunchers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (p->nlaunchers == 0) {
        pthread_cond_destroy(&p->launch_wake);
        return CONVD_EINTERNAL;
    }
    p->launcher = true;
    return 0;
}

unsigned pool_unlaunched(const struct worker_pool *p)
{
    unsigned n = 0;
    if (!p->launcher)
        return 0;
    for (unsigned i = 0; i < p->nall; i++)
        n += p->workers[i].busy && !__atomic_load_n(&p->workers[i].launched, __ATOMIC_ACQUIRE);
    return n;
}

int pool_idle_worker(const struct worker_pool *p)
{
    if (p->busy >= p->n)
        return -1;
    for (unsigned i = 0; i < p->n; i++)
        if (!p->workers[i].busy)
            return (int)i;
    return -1;
}

int pool_idle_lane_slot(const struct worker_pool *p, unsigned l)
{
    if (l >= p->lanes)
        return -1;
    const unsigned first = p->lane_base + l * p->lane_depth;
    for (unsigned i = first; i < first + p->lane_depth; i++)
        if (!p->workers[i].busy)
            return (int)i;
    return -1;
}

void pool_submit(struct worker_pool *p, unsigned w, struct batch *b)
{
    b->worker = w;
    b->seq = p->next_seq++;
    b->lane = -1;
    p->workers[w].busy = true;
    if (w < p->n) {
        p->busy++;
    } else {
        p->lane_busy++;
        b->lane = (int)((w - p->lane_base) / p->lane_depth);
        b->lane_seq = p->lane_next[b->lane]++;
    }
    /* A lone batch (nothing else in flight, so nothing queued for the threads either) is
     * launched here: handing it over would cost a thread's wake-up or cache-line round trip
     * and it has nothing to overlap with. */
    const bool inline_launch =
        p->slots && p->launcher && p->launch_inline && b->lane < 0 && p->busy + p->lane_busy == 1;
    if (p->slots && p->launcher && !inline_launch) {
        b->start_ns = convd_now_ns();
        p->workers[w].running = b;
        __atomic_store_n(&p->workers[w].launched, 0, __ATOMIC_RELAXED);
        /* At most n batches are queued (one per busy slot), so the ring never overflows. */
        p->lq[p->lq_tail % POOL_MAX_SLOTS] = b;
        __atomic_store_n(&p->lq_tail, p->lq_tail + 1, __ATOMIC_SEQ_CST);
        /* A sleeper is woken (a system call here, a wake-up there) only for batches that the
         * threads spinning on the queue cannot take: each of them takes one. */
        const unsigned unclaimed = p->lq_tail - __atomic_load_n(&p->lq_head, __ATOMIC_SEQ_CST);
        if (unclaimed > (unsigned)__atomic_load_n(&p->launchers_idle, __ATOMIC_SEQ_CST) &&
            __atomic_load_n(&p->launchers_sleeping, __ATOMIC_SEQ_CST) > 0) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->launch_wake);
            pthread_mutex_unlock(&p->mu);
            p->launcher_wakeups++;
        }
        return;
    }
    if (p->slots) {
        b->start_ns = convd_now_ns();
        b->launch_begin_ns = b->start_ns;
        b->rc = pool_launch_counted(p, b);
        b->launched_ns = convd_now_ns();
        b->launch_ns = b->launched_ns - b->start_ns;
        if (b->lane >= 0)
            p->lane_turn[b->lane] = b->lane_seq + 1;
        p->workers[w].running = b;
        if (inline_launch) {
            p->inline_launches++;
            __atomic_store_n(&p->workers[w].launched, 1, __ATOMIC_RELAXED);
        }
        if (b->rc != 0) {
            /* Nothing is in flight; the next poll hands it back with its statuses set. */
            uv_async_send(&p->async);
        }
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->workers[w].todo = b;
    pthread_cond_signal(&p->workers[w].wake);
    pthread_mutex_unlock(&p->mu);
}

void pool_stop(struct worker_pool *p)
{
    if (p->workers == NULL)
        return;
    /* Batches still in flight write into client memory: wait for them, then hand them over (the
     * daemon has released its lanes' words first). */
    while (p->slots && p->busy + p->lane_busy > 0) {
        if (pool_poll(p) == 0)
            usleep(20);
    }
    if (p->launcher) {
        pthread_mutex_lock(&p->mu);
        p->launcher_stop = true;
        pthread_cond_broadcast(&p->launch_wake);
        pthread_mutex_unlock(&p->mu);
        for (unsigned i = 0; i < p->nlaunchers; i++)
            pthread_join(p->launch_threads[i], NULL);
        pthread_cond_destroy(&p->launch_wake);
        p->launcher = false;
        p->nlaunchers = 0;
    }
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    for (unsigned i = 0; i < p->n; i++)
        if (p->workers[i].started)
            pthread_cond_signal(&p->workers[i].wake);
    pthread_mutex_unlock(&p->mu);
    for (unsigned i = 0; i < p->n; i++)
        if (p->workers[i].started) {
            pthread_join(p->workers[i].thread, NULL);
            pthread_cond_destroy(&p->workers[i].wake);
        }
    /* batches finished after the last async callback: hand them over before closing */
    if (p->async_open) {
        pool_on_async(&p->async);
        uv_close((uv_handle_t *)&p->async, NULL);
        p->async_open = false;
    }
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    p->workers = NULL;
    p->n = 0;
}
