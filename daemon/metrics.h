/*
 * Counters, gauges and histograms of the daemon, rendered in the Prometheus text exposition
 * format (version 0.0.4) for MetricsReply. Everything is updated on the loop thread only, so
 * there are no atomics.
 */
#ifndef CONVD_DAEMON_METRICS_H
#define CONVD_DAEMON_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

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
    uint64_t lane_launches; /* gated requests launched into lanes (device_waits) */
    uint64_t protocol_errors;
    uint64_t connections_accepted;
    uint64_t connections_refused; /* over max_clients or not on the allow-list */
    uint64_t regions_registered;
    uint64_t region_failures;
    uint64_t region_holds; /* registrations that waited for the lanes to empty */
    struct met_hist queue_seconds;  /* receipt to start of execution */
    struct met_hist exec_seconds;   /* wall time of the batch */
    struct met_hist device_seconds; /* batch_timing: its time on the device */
    struct met_hist launch_seconds; /* asynchronous backends: host time of the launch itself */
    struct met_hist launch_wait_seconds; /* launch threads: queued until a thread took it */
    struct met_hist seen_lag_seconds;    /* asynchronous backends: bound on how late seen done */
    struct met_hist batch_size;     /* requests per backend call */
    struct met_hist gate_seconds;   /* gated requests: receipt to their ready word */
    /* The loop thread's passes that found work (rings, completions, sockets), end to end: with
     * the wall clock it says how close the one thread that launches is to saturation. */
    uint64_t loop_busy_ns;
    /* Where the loop's time goes, end to end of each step (launches nested in rings and
     * completions are also in launch_seconds): taking ring submissions, handling finished
     * batches, running libuv. The pool counts its device queries itself. */
    uint64_t loop_rings_ns, loop_done_ns, loop_uv_ns;
    uint64_t loop_gates_ns; /* looking at gated requests' ready words (and launching lanes) */
    uint64_t loop_doorbell_ns, loop_dispatch_ns; /* inside loop_done_ns, for finished batches */
    uint64_t start_ns;
    /* Configuration reloads (SIGHUP): applied, refused (a key that takes a restart changed),
     * failed (the file did not parse); whether the last one was applied, and when (wall clock,
     * seconds) the configuration in force was loaded, the start included. */
    uint64_t reloads_applied, reloads_refused, reloads_failed;
    int last_reload_ok;
    double config_loaded_unix;
};

/* Values read from the live daemon when rendering. */
struct met_gauges {
    uint64_t clients;
    uint64_t users; /* distinct peer uids connected */
    uint64_t queue_depth;
    uint64_t inflight; /* queued + running */
    uint64_t running;
    uint64_t gated; /* waiting on their gates' ready words (also in inflight) */
    uint64_t waiting; /* in lanes, the device waiting on their ready words (also in running) */
    uint64_t regions;
    uint64_t mapped_bytes;
    uint64_t host_bytes;       /* of which host memory (pinned by a GPU backend) */
    uint64_t max_pinned_bytes; /* the cap on host_bytes */
    uint64_t workers;
    uint64_t workers_busy;
    uint64_t doorbells;      /* Doorbells sent to sleeping ring clients (a counter) */
    uint64_t doorbell_wakes; /* wake-ups of sleeping ringers the loop made for them (a counter) */
    double loop_cpu_s;       /* CPU time of the loop thread itself (-1: unknown) */
    uint64_t query_ns;       /* asynchronous backends: time the loop spent in be_query */
    uint64_t launch_peak;    /* asynchronous backends: most launch calls in progress at once */
    uint64_t inline_launches; /* with launch threads: batches the loop launched itself */
    uint64_t launcher_wakeups; /* sleeping launch threads the loop woke */
    int draining;
    struct convd_backend_stats device; /* the backend's device gauges, where it has them */
};

void metrics_init(struct metrics *m, uint64_t now_ns);

/* Records one finished request (rejected: it never reached the queue). */
void metrics_request(struct metrics *m, int status, int rejected);
/* One malformed or out-of-order message; one region registered (ok) or refused; one connection
 * accepted or refused. */
void metrics_protocol_error(struct metrics *m);
/* A gated request's ready word came after waiting_ns. */
void metrics_gate_wait(struct metrics *m, uint64_t waiting_ns);
void metrics_region(struct metrics *m, bool ok);
void metrics_connection(struct metrics *m, bool accepted);

void metrics_hist_observe(struct met_hist *h, double v);

/* Writes the exposition text (NUL-terminated) into buf. Returns its length, or -1 when cap is too
 * small. backend and device become labels of convd_info. labels, when not NULL or empty, is a
 * label set added to every sample (`socket="/run/convd/gpu0.sock"`, already escaped with
 * metrics_label_escape): it keeps the samples of several daemons apart where their metrics meet
 * without a scrape target of their own, as in node_exporter's textfile collector. */
int metrics_render(const struct metrics *m, const struct met_gauges *g, const char *backend,
                   const char *device, const char *labels, uint64_t now_ns, char *buf, size_t cap);

/* Escapes a label value for the exposition format ('"', '\\' and newlines). Returns buf. */
char *metrics_label_escape(const char *value, char *buf, size_t cap);

/* Requests finished with status 0, and with any other status. */
uint64_t metrics_served(const struct metrics *m);
uint64_t metrics_failed(const struct metrics *m);

#endif
