/*
 * Where batches run. For a blocking backend, worker threads: each runs one batch at a time
 * through the backend's run_batch and hands it back to the loop through a mutex-protected list
 * and a uv_async_t. For an asynchronous backend (be_async), slots instead: the loop launches a
 * batch into a free slot and learns that it finished by polling (pool_poll) or, before it
 * sleeps, from the backend's notify, which wakes it through the same uv_async_t. Either way the
 * loop decides what runs where; nothing here touches connections, regions or the queue.
 */
#ifndef CONVD_DAEMON_WORKERS_H
#define CONVD_DAEMON_WORKERS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "backend.h"
#include "list.h"

/* One backend call. The loop fills jobs and n; the worker fills rc, start_ns and end_ns. */
struct batch {
    struct list_node link;
    unsigned worker;
    size_t n;
    int rc; /* what run_batch returned */
    uint64_t start_ns, end_ns;
    uint64_t launch_ns;       /* asynchronous backends: how long launch itself took */
    uint64_t launched_ns;     /* asynchronous backends: when launch began, and when it returned */
    uint64_t launch_begin_ns;
    /* The gap between the loop's last look that found it running (or its launch's return) and
     * the look that found it done: an upper bound on how late the loop learned it was done. */
    uint64_t seen_lag_ns;
    uint64_t seq;             /* launch order, for pool_arm */
    int lane;                 /* the lane of its slot, or -1 */
    unsigned lane_seq;        /* its place in its lane: launches keep that order */
    struct convd_job *jobs[]; /* n entries */
};

struct worker_pool;

struct worker {
    pthread_t thread;
    struct worker_pool *pool;
    unsigned index;
    pthread_cond_t wake;
    struct batch *todo; /* under pool->mu */
    bool busy;          /* loop thread only */
    bool started;
    struct batch *running; /* asynchronous slots: the batch in flight */
    int launched;          /* with a launch thread: its launch has returned (atomic) */
    uint64_t looked_ns;    /* asynchronous slots: the last look that found its batch running */
};

typedef void (*pool_done_cb)(struct worker_pool *p, struct batch *b);

/* The most slots a pool of an asynchronous backend has, lanes included (pool_poll's and the
 * launch queue's bound): the config caps slots at 64, and a backend's lanes add theirs. */
#define POOL_MAX_SLOTS 256
/* The most lanes a pool takes from its backend. */
#define POOL_MAX_LANES 64
/* The most launch threads (the config's launch_threads). */
#define POOL_MAX_LAUNCHERS 4

struct worker_pool {
    struct convd_backend *backend;
    bool slots;    /* slots of an asynchronous backend, no threads */
    unsigned n;    /* workers or slots (the shared ones, for the queue) */
    unsigned busy; /* of those n; loop thread only */
    /* Lanes (pool_start's lanes, backend.h): slots lane_base + l * lane_depth + k, beside the
     * shared ones; workers[] has nall entries, those in [n, lane_base) unused. */
    unsigned lanes, lane_depth, lane_base, nall;
    unsigned lane_busy; /* lane slots with a batch; loop thread only */
    /* A lane is one stream: its batches must reach the backend in the order they were submitted,
     * whichever launch thread takes them. lane_next: the next lane_seq to hand out (loop);
     * lane_turn: the lane_seq whose launch may start (atomic). */
    unsigned lane_next[POOL_MAX_LANES];
    unsigned lane_turn[POOL_MAX_LANES];
    struct worker *workers;
    pthread_mutex_t mu;
    struct list_node done; /* under mu */
    bool stop;             /* under mu */
    uv_async_t async;
    bool async_open;
    pool_done_cb on_done;
    void *data;
    uint64_t next_seq;
    uint64_t query_ns; /* asynchronous slots: host time spent asking whether batches are done */
    /* Asynchronous slots with launch threads (pool_start_launcher): the loop queues batches in
     * lq, each thread takes the oldest one not taken, launches it and marks its worker
     * launched. Batches are in different slots, so launches run side by side. */
    bool launcher;
    unsigned nlaunchers;
    pthread_t launch_threads[POOL_MAX_LAUNCHERS];
    pthread_cond_t launch_wake; /* under mu */
    struct batch *lq[POOL_MAX_SLOTS];
    unsigned lq_head, lq_tail; /* atomic: the threads advance head, the loop tail */
    int launchers_sleeping;    /* atomic; changed under mu */
    int launchers_idle;        /* atomic: threads spinning on an empty queue */
    uint64_t launcher_wakeups; /* sleeping threads the loop woke (loop thread only) */
    bool launcher_stop;        /* under mu */
    uint64_t launcher_spin_ns;
    unsigned launcher_spinners; /* threads that may spin on an empty queue at once */
    /* Atomic: launch calls in progress now, and the most that were at once since the start. */
    unsigned in_launch, launch_peak;
    /* With launch threads: the loop launches a shared slot's batch itself when no other batch
     * is in flight (launch_inline), and counts those launches (loop thread only). */
    bool launch_inline;
    uint64_t inline_launches;
};

/* Allocates a batch for n jobs (jobs[] uninitialised). NULL when out of memory. */
struct batch *batch_new(size_t n);

/* Starts n worker threads (signals blocked in them) that call be_run_batch with their index,
 * or, for an asynchronous backend, prepares n of its slots (0 or more than its max_slots: all),
 * and with `lanes` every slot of the backend's lanes (backend.h) besides.
 * on_done runs on the loop thread for every finished batch, after the worker is marked idle.
 * Returns 0 or CONVD_ENOMEM / CONVD_EINTERNAL; nothing is left running on failure. */
int pool_start(struct worker_pool *p, uv_loop_t *loop, struct convd_backend *backend, unsigned n,
               bool lanes, pool_done_cb on_done, void *data);

/* Asynchronous backends: starts n threads (1 to POOL_MAX_LAUNCHERS) that make the backend's
 * launch calls, so that the loop goes on taking submissions while the driver launches; after
 * its last launch a thread spins spin_ns on the empty queue before it sleeps, if fewer than
 * spinners others are spinning (0: no limit), else it sleeps at once. Returns 0, CONVD_EINVAL
 * (not slots, already started, n out of range, more than POOL_MAX_SLOTS) or CONVD_EINTERNAL (no
 * thread started); on failure the loop goes on launching itself. Fewer threads than asked may
 * start: p->nlaunchers says how many. */
int pool_start_launcher(struct worker_pool *p, unsigned n, uint64_t spin_ns, unsigned spinners);

/* With a launch thread: batches submitted whose launch has not returned yet (queued for the
 * thread or in its launch call). 0 without one. Loop thread only. */
unsigned pool_unlaunched(const struct worker_pool *p);

/* Index of an idle worker (of the n shared slots), or -1 when all are busy. */
int pool_idle_worker(const struct worker_pool *p);
/* Index of an idle slot of lane l, or -1 when all its slots are busy. */
int pool_idle_lane_slot(const struct worker_pool *p, unsigned l);

/* Hands batch b to idle worker w, or launches it in slot w (loop thread). */
void pool_submit(struct worker_pool *p, unsigned w, struct batch *b);

/* Asynchronous backends: hands every batch that finished to on_done. Returns how many. Does
 * nothing for worker threads, whose batches arrive through the loop. */
unsigned pool_poll(struct worker_pool *p);

/* Before the loop sleeps: asks the backend to wake it when the oldest batch in flight on a
 * shared slot finishes. Returns false when nothing is in flight there. A lane's batch waits on
 * its client's words for as long as the client takes, so none is waited for: the loop polls
 * lanes (daemon_run). */
bool pool_arm(struct worker_pool *p);

/* Stops and joins the threads (they must be idle: the caller waits for running work first) and
 * closes the async handle. Safe on a pool that failed to start or was stopped already. */
void pool_stop(struct worker_pool *p);

#endif
