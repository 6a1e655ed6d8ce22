/*
 * Counters, gauges and histograms of the daemon, rendered in the Prometheus text exposition
 * format (version 0.0.4) for MetricsReply. Everything is updated on the loop thread only, so
 * there are no atomics.
 */
#ifndef CONVD_DAEMON_METRICS_H
#define CONVD_DAEMON_METRICS_H

#include <stddef.h>
#include <stdint.h>

#define MET_HIST_MAX_BUCKETS 24
/* Status codes run from 0 down to CONVD_EINTERNAL; the slot after them counts unknown codes. */
#define MET_STATUS_SLOTS 29

struct met_hist {
    size_t n_bounds;
    const double *bounds;                      /* ascending upper bounds; +Inf is implied */
    uint64_t counts[MET_HIST_MAX_BUCKETS + 1]; /* per bucket, not cumulative; last is +Inf */
    double sum;
    uint64_t count;
};

struct metrics {
    uint64_t requests[MET_STATUS_SLOTS]; /* every request that got a completion, by status */
    uint64_t rejected[MET_STATUS_SLOTS]; /* those refused before they were queued */
    uint64_t batches;
    uint64_t protocol_errors;
    uint64_t connections_accepted;
    uint64_t connections_refused; /* over max_clients or not on the allow-list */
    uint64_t regions_registered;
    uint64_t region_failures;
    struct met_hist queue_seconds;  /* receipt to start of execution */
    struct met_hist exec_seconds;   /* wall time of the batch */
    struct met_hist launch_seconds; /* asynchronous backends: host time of the launch itself */
    struct met_hist batch_size;     /* requests per backend call */
    uint64_t start_ns;
};

/* Values read from the live daemon when rendering. */
struct met_gauges {
    uint64_t clients;
    uint64_t users; /* distinct peer uids connected */
    uint64_t queue_depth;
    uint64_t inflight; /* queued + running */
    uint64_t running;
    uint64_t regions;
    uint64_t mapped_bytes;
    uint64_t workers;
    uint64_t workers_busy;
    uint64_t doorbells; /* Doorbells sent to sleeping ring clients (a counter) */
    int draining;
};

void metrics_init(struct metrics *m, uint64_t now_ns);

/* Records one finished request (rejected: it never reached the queue). */
void metrics_request(struct metrics *m, int status, int rejected);

void metrics_hist_observe(struct met_hist *h, double v);

/* Writes the exposition text (NUL-terminated) into buf. Returns its length, or -1 when cap is too
 * small. backend and device become labels of convd_info. */
int metrics_render(const struct metrics *m, const struct met_gauges *g, const char *backend,
                   const char *device, uint64_t now_ns, char *buf, size_t cap);

/* Requests finished with status 0, and with any other status. */
uint64_t metrics_served(const struct metrics *m);
uint64_t metrics_failed(const struct metrics *m);

#endif
