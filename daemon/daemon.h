/*
 * The daemon object: one libuv loop, the backend, the listener, the connections, the queue and the
 * workers. main() creates it, runs it and destroys it; tests do the same on a thread of their own
 * and stop it with daemon_request_stop().
 *
 * Threads: everything here runs on the loop thread except the workers (workers.h), which only
 * call the backend, and daemon_request_stop(), which may be called from any thread.
 */
#ifndef CONVD_DAEMON_DAEMON_H
#define CONVD_DAEMON_DAEMON_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "backend.h"
#include "config.h"
#include "conn_registry.h"
#include "doorbell.h"
#include "list.h"
#include "listener.h"
#include "metrics.h"
#include "metrics_file.h"
#include "regions.h"
#include "scheduler.h"
#include "users.h"
#include "waits.h"
#include "wire.h"
#include "workers.h"

struct convd_daemon {
    struct convd_config cfg;
    uv_loop_t loop;
    bool loop_open;
    bool uv_idle_time; /* libuv measures its sleep in epoll (UV_METRICS_IDLE_TIME) */
    struct convd_backend backend;
    bool backend_open;
    struct listener listener;
    bool listener_open;
    struct sched sched;
    struct worker_pool pool;
    bool pool_started;
    struct waits waits; /* the lanes' watchdog (started when the pool has lanes) */
    struct doorbells doorbells;
    struct users users; /* what each peer uid holds */
    struct metrics metrics;
    struct metrics_file mfile;                     /* metrics_textfile */
    char mfile_labels[2 * CONFIG_PATH_BYTES + 16]; /* socket="..." on every sample there */
    int argc; /* the command line SIGHUP re-reads (daemon_set_args) */
    char *const *argv;
    struct region_stats region_stats;
    struct region_limits region_limits;
    /* Region releases waiting for the lanes to empty (regions.h; device_waits only). */
    struct region_releases releases;

    struct conn_registry conns; /* connection.c's: the daemon asks it, never walks it */
    bool defer_dispatch;        /* set while requests read together queue; they dispatch after */
    bool dispatch_pending;      /* a request was queued during the hold */
    uint64_t activity;          /* bumped by every datagram and batch: the loop spins on */
    uint32_t running;           /* requests handed to workers */

    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t watchdog_timer; /* WATCHDOG=1 at half of WATCHDOG_USEC */
    uv_timer_t status_timer;   /* STATUS= for systemctl status */
    uv_timer_t drain_timer;    /* drain_timeout_ms after SIGTERM */
    uv_timer_t deadline_timer; /* the earliest queued deadline */
    uv_timer_t inflight_timer; /* a sleeping loop's fallback look at batches in flight */
    uv_timer_t trim_timer;     /* gives idle staging memory back (be_trim) */
    uint64_t batches_at_trim;  /* metrics.batches at the last trim tick */
    int delay_fd;              /* timerfd for max_queue_delay_us: uv timers have 1 ms steps */
    uv_poll_t delay_poll;
    bool delay_poll_open;
    struct sched_item **take; /* scratch for sched_take, max_batch entries */
    uv_async_t stop_async;    /* daemon_request_stop() */
    bool handles_open;
    uint64_t deadline_armed_ns; /* 0: deadline_timer idle */
    bool delay_armed;
    uint64_t watchdog_usec;
    char last_status[256];

    bool device_lost; /* the backend failed a batch with CONVD_EDEVICE: draining to exit 1 */
    bool draining;
    bool drain_expired;
    bool finishing;
    bool dispatching;

    uint64_t start_ns;
    int exit_code;

    /* Scratch buffers of the loop thread: one datagram in, one out. */
    uint8_t rx[CONVD_MAX_MESSAGE_BYTES];
    uint8_t tx[CONVD_MAX_MESSAGE_BYTES];
};

/* Opens the backend, the listener and the workers for cfg (copied) and prepares the loop. Returns
 * 0 with the daemon in *ret, or a CONVD_E* code with the reason in why (and nothing left open). */
int daemon_create(const struct convd_config *cfg, struct convd_daemon **ret, char *why,
                  size_t why_len);

/* Tells systemd READY=1 and runs the loop until the daemon has drained after SIGTERM/SIGINT or
 * daemon_request_stop(). Returns the exit status for main(): 0 after a clean drain. */
int daemon_run(struct convd_daemon *d);

/* The command line the configuration came from, which SIGHUP reads again (daemon/reload.h);
 * argv must outlive the daemon. Without it SIGHUP is logged and ignored. */
void daemon_set_args(struct convd_daemon *d, int argc, char *const *argv);

/* Starts the drain, as SIGTERM does. Safe from any thread, and before or during daemon_run(). */
void daemon_request_stop(struct convd_daemon *d);

/* Closes everything daemon_create() opened and frees d. Accepts NULL. */
void daemon_destroy(struct convd_daemon *d);

/* Derives the region limits (per connection, per user, the daemon-wide pinned cap) from the
 * config; again after a reload. */
void daemon_apply_region_limits(struct convd_daemon *d);

/* Loop-thread entry points used by the connections. */

/* Runs queued work on idle workers (and fails expired requests). */
void daemon_dispatch(struct convd_daemon *d);

/* True while a lane (device_waits) has a batch: then driver calls that wait for the device
 * (importing and releasing client memory) would also wait for the client words the lanes wait
 * on, and are held back until none has (docs/architecture.md, "Lanes"). */
bool daemon_lanes_busy(const struct convd_daemon *d);

/* True while something waits for the lanes to empty: new requests stay out of them meanwhile. */
bool daemon_lanes_paused(const struct convd_daemon *d);

/* Holds dispatching while requests that arrived together are queued, so that they can share
 * batches; returns whether it was held already. daemon_release_dispatch() with that value ends
 * the hold (and dispatches when it was the outermost). */
bool daemon_hold_dispatch(struct convd_daemon *d);
void daemon_release_dispatch(struct convd_daemon *d, bool was_held);

/* A request was queued: dispatches now, unless a hold is on (its end dispatches). */
void daemon_request_queued(struct convd_daemon *d);

/* Something happened on a connection (a datagram): the loop keeps spinning a while. */
void daemon_note_activity(struct convd_daemon *d);

/* A request daemon_dispatch() handed to a worker has completed. */
void daemon_request_finished(struct convd_daemon *d);

/* Arms the deadline timer for a request queued with this deadline (ns, monotonic). */
void daemon_note_deadline(struct convd_daemon *d, uint64_t deadline_ns);

/* Called when a connection was freed or stopped counting, so a drain can finish. */
void daemon_check_drained(struct convd_daemon *d);

/* Fills a StatusReply and renders the metrics text (into buf, NUL-terminated; returns its length
 * or -1), with `labels` (metrics_render) on every sample, or none for NULL. */
void daemon_fill_status(struct convd_daemon *d, Convd__StatusReply *st);
int daemon_render_metrics(struct convd_daemon *d, const char *labels, char *buf, size_t cap);

#endif
