/*
 * A convolution request inside the daemon, and the checks a ConvRequest must pass before it is
 * queued. Validation is a pure function of the decoded message, the connection's regions and
 * in-flight ids, and the backend, so each rejection is tested with its code and sentence.
 */
#ifndef CONVD_DAEMON_REQUEST_H
#define CONVD_DAEMON_REQUEST_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "convd.pb-c.h"
#include "idmap.h"
#include "list.h"
#include "regions.h"
#include "scheduler.h"
#include "waits.h"

struct conn;

enum { REQ_INPUT = 0, REQ_WEIGHT, REQ_BIAS, REQ_OUTPUT, REQ_TENSORS };

struct dreq {
    uint64_t id;
    struct conn *conn;
    struct convd_job job;                /* job.owner points back here */
    struct region *regions[REQ_TENSORS]; /* one reference each; NULL for an absent bias */
    struct sched_item sched;             /* problem, priority, enqueue and deadline times */
    uint64_t recv_ns;
    uint64_t start_ns;
    uint64_t timeout_us;
    bool running;  /* handed to a worker */
    bool via_ring; /* submitted through the connection's ring: a success completes there */
    /* Gate (stream ordering): the request waits, out of the queue, until *gate_ready reaches
     * ready_value; done_value goes into *gate_done once it has finished. Both words lie in
     * gate_region's mapping, which the request holds a reference on. */
    struct region *gate_region; /* NULL: no gate */
    _Atomic uint32_t *gate_ready, *gate_done;
    uint32_t ready_value, done_value;
    bool gated;                 /* waiting on its ready word (in conn->gated) */
    struct list_node gate_link; /* in conn->gated while gated */
    uint64_t gate_deadline_ns;  /* fail with ETIMEDOUT when the word has not come by then */
    uint64_t ready_offset;      /* of gate_ready in gate_region */
    /* Launched into its connection's lane (device_waits): the device waits on the ready word,
     * the watchdog (waits.h) on its deadline. In conn->waiting until it finishes. */
    bool waited;
    struct wait_entry wait;
    struct list_node wait_link;
};

/* The last problem a connection's request passed the problem checks with, and its sizes: a
 * client that sends one shape again and again has it checked once (the problem, the protocol,
 * the backend's supports()), not per request. Tensors, gates, ids and limits are checked every
 * time. Zeroed: empty. */
struct req_problem_cache {
    bool valid;
    struct convd_problem p;
    struct convd_problem_sizes sz;
};

/* What validation needs to know about the connection and the daemon. */
struct req_context {
    const struct region_table *regions;
    struct convd_backend *backend;
    const struct idmap *inflight; /* ids of the client's requests queued or running */
    uint32_t max_inflight;
    uint32_t proto_version;          /* the connection's (what the request may ask for) */
    struct req_problem_cache *cache; /* the connection's; NULL: check every problem */
};

/* Checks a decoded ConvRequest: priority, the problem (wire_problem_from_pb), the backend's
 * support, the presence of each tensor (bias exactly when has_bias), each tensor's region
 * (CONVD_ENOREGION), byte count (CONVD_ESIZE) and range (CONVD_EBOUNDS), an output that is not in
 * a write-sealed region and overlaps no input, the gate (protocol 3; its words in a writable host
 * region, aligned, inside it, distinct and outside every tensor), an id not in flight
 * (CONVD_EEXIST) and the in-flight limit (CONVD_ELIMIT). A problem equal (convd_problem_same) to
 * the one in ctx->cache skips its own checks; one that passes them replaces it there. A backend
 * that breaks later (a lost GPU) then refuses at launch instead. On success fills r's id, job
 * (problem and views), regions and gate (no references taken yet), priority and timeout; on failure
 * returns the code with a sentence in why and leaves r's contents unspecified but for gate_region:
 * NULL, or set when the gate passed its checks (the caller may then store its done word). */
int req_validate(const Convd__ConvRequest *pb, const struct req_context *ctx, struct dreq *r,
                 char *why, size_t why_len);

/* True when the gate's ready word has reached ready_value (a cyclic comparison, as
 * cuStreamWaitValue32's GEQ). */
static inline bool req_gate_open(const struct dreq *r)
{
    uint32_t v = atomic_load_explicit(r->gate_ready, memory_order_acquire);
    return (int32_t)(v - r->ready_value) >= 0;
}

/* Stores the gate's done value (release: after the output, which the backend has finished). */
static inline void req_gate_release(const struct dreq *r)
{
    if (r->gate_region != NULL)
        atomic_store_explicit(r->gate_done, r->done_value, memory_order_release);
}

/* Takes one reference on each region the request uses (the gate's too). */
void req_ref_regions(struct dreq *r);

/* Drops the references req_ref_regions() took. */
void req_unref_regions(struct dreq *r);

/* The dreq that contains a scheduler item. */
static inline struct dreq *req_from_item(struct sched_item *it)
{
    return list_entry(it, struct dreq, sched);
}

#endif
