/*
 * The request queue: four priority levels, round-robin across clients within a level, a bound on
 * the total, deadlines, and batch selection. Pure data structure: no threads, no clock, no I/O,
 * so every policy is tested directly. The daemon owns the clock and the workers and calls in.
 *
 * Layout: each client has one FIFO per level; each level has a ring of the clients whose FIFO at
 * that level is not empty. The next batch starts with the head of the first client in the ring of
 * the highest non-empty level; that client then moves to the back of the ring, so a client with a
 * thousand requests and a client with one take turns.
 *
 * A batch is that head request plus queued requests with the same problem (convd_problem_same),
 * collected from the head's level downwards, taking one request per client per pass round each
 * ring, so that a full batch is shared fairly too.
 */
#ifndef CONVD_DAEMON_SCHEDULER_H
#define CONVD_DAEMON_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "convd/conv.h"
#include "list.h"

#define SCHED_LEVELS 4

/* Scheduling state of one client; embed it in the connection and sched_client_init() it. */
struct sched_client {
    struct list_node fifo[SCHED_LEVELS];
    struct list_node ring[SCHED_LEVELS]; /* unlinked while fifo[level] is empty */
    struct list_node *cursor;            /* scratch for batch collection */
    uint32_t queued;
};

/* One queued request; embed it in the request. The caller fills problem, priority, enqueue_ns
 * and deadline_ns before sched_push(); the rest belongs to the scheduler. */
struct sched_item {
    struct list_node link;
    struct sched_client *client;
    const struct convd_problem *problem;
    unsigned priority; /* 0 (highest) .. SCHED_LEVELS-1 */
    uint64_t enqueue_ns;
    uint64_t deadline_ns; /* 0: none; else the item expires when now >= deadline_ns */
};

struct sched {
    struct list_node ring[SCHED_LEVELS];
    uint32_t queued;
    uint32_t limit;
    uint32_t max_batch;
    /* At most the earliest deadline of a queued item (exact after sched_expire walked the
     * queue), 0 when none has one: dispatch calls sched_expire for every batch, and this keeps
     * that from walking the whole queue while nothing can have expired. */
    uint64_t deadline_floor;
};

void sched_init(struct sched *s, uint32_t limit, uint32_t max_batch);
void sched_client_init(struct sched_client *c);

/* Queues the item for client c. Returns 0, CONVD_EQUEUEFULL when `limit` items are queued already,
 * CONVD_EINVAL for a priority out of range. */
int sched_push(struct sched *s, struct sched_client *c, struct sched_item *it);

/* Takes the next batch (at most min(cap, max_batch) items) into out[] and returns its size, 0
 * when nothing is queued. Call sched_expire() first so that no expired item is taken. */
size_t sched_take(struct sched *s, struct sched_item **out, size_t cap);

/* The batch sched_take() would return now, without taking it: its size (at most max_batch) and
 * its head in *ret_head (NULL when nothing is queued). For a dispatcher that may wait for a batch
 * to grow. Changes nothing but scratch state. */
size_t sched_peek(struct sched *s, const struct sched_item **ret_head);

/* Removes every item whose deadline is <= now and appends them (by their link) to `out`. Returns
 * how many. Looks at the items only when the earliest deadline may have passed. */
size_t sched_expire(struct sched *s, uint64_t now_ns, struct list_node *out);

/* Removes every item of client c and appends them to `out`. Returns how many. */
size_t sched_cancel_client(struct sched *s, struct sched_client *c, struct list_node *out);

/* Removes every item and appends them to `out`. Returns how many. */
size_t sched_cancel_all(struct sched *s, struct list_node *out);

/* The earliest deadline of a queued item, or 0 when none has one. */
uint64_t sched_next_deadline(const struct sched *s);

static inline uint32_t sched_depth(const struct sched *s)
{
    return s->queued;
}

#endif
