/*
 * Worker threads: each runs one batch at a time through the backend's run_batch and hands it back
 * to the loop through a mutex-protected list and a uv_async_t. The loop decides what runs where;
 * workers never touch connections, regions or the queue.
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
};

typedef void (*pool_done_cb)(struct worker_pool *p, struct batch *b);

struct worker_pool {
    struct convd_backend *backend;
    unsigned n;
    unsigned busy; /* loop thread only */
    struct worker *workers;
    pthread_mutex_t mu;
    struct list_node done; /* under mu */
    bool stop;             /* under mu */
    uv_async_t async;
    bool async_open;
    pool_done_cb on_done;
    void *data;
};

/* Allocates a batch for n jobs (jobs[] uninitialised). NULL when out of memory. */
struct batch *batch_new(size_t n);

/* Starts n worker threads (signals blocked in them) that call be_run_batch with their index.
 * on_done runs on the loop thread for every finished batch, after the worker is marked idle.
 * Returns 0 or CONVD_ENOMEM / CONVD_EINTERNAL; nothing is left running on failure. */
int pool_start(struct worker_pool *p, uv_loop_t *loop, struct convd_backend *backend, unsigned n,
               pool_done_cb on_done, void *data);

/* Index of an idle worker, or -1 when all are busy. */
int pool_idle_worker(const struct worker_pool *p);

/* Hands batch b to idle worker w (loop thread). */
void pool_submit(struct worker_pool *p, unsigned w, struct batch *b);

/* Stops and joins the threads (they must be idle: the caller waits for running work first) and
 * closes the async handle. Safe on a pool that failed to start or was stopped already. */
void pool_stop(struct worker_pool *p);

#endif
