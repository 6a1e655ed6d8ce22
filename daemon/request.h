/*
 * A convolution request inside the daemon, and the checks a ConvRequest must pass before it is
 * queued. Validation is a pure function of the decoded message, the connection's regions and
 * in-flight ids, and the backend, so each rejection is tested with its code and sentence.
 */
#ifndef CONVD_DAEMON_REQUEST_H
#define CONVD_DAEMON_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "convd.pb-c.h"
#include "idmap.h"
#include "list.h"
#include "regions.h"
#include "scheduler.h"

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
};

/* What validation needs to know about the connection and the daemon. */
struct req_context {
    const struct region_table *regions;
    struct convd_backend *backend;
    const struct idmap *inflight; /* ids of the client's requests queued or running */
    uint32_t max_inflight;
    uint32_t proto_version; /* the connection's (what the request may ask for) */
};

/* Checks a decoded ConvRequest: priority, the problem (wire_problem_from_pb), the backend's
 * support, the presence of each tensor (bias exactly when has_bias), each tensor's region
 * (CONVD_ENOREGION), byte count (CONVD_ESIZE) and range (CONVD_EBOUNDS), an output that is not in
 * a write-sealed region and overlaps no input, an id not in flight (CONVD_EEXIST) and the
 * in-flight limit (CONVD_ELIMIT). On success fills r's id, job (problem and views), regions (no
 * references taken yet), priority and timeout; on failure returns the code with a sentence in why
 * and leaves r's contents unspecified. */
int req_validate(const Convd__ConvRequest *pb, const struct req_context *ctx, struct dreq *r,
                 char *why, size_t why_len);

/* Takes one reference on each region the request uses. */
void req_ref_regions(struct dreq *r);

/* Drops the references req_ref_regions() took. */
void req_unref_regions(struct dreq *r);

/* The dreq that contains a scheduler item. */
static inline struct dreq *req_from_item(struct sched_item *it)
{
    return list_entry(it, struct dreq, sched);
}

#endif
