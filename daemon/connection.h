/*
 * One client connection, as an explicit state machine:
 *
 *   AWAIT_HELLO --Hello (version ok, peer allowed)--> READY --error/EOF/limit/shutdown--> CLOSING
 *   AWAIT_HELLO --bad version, refused peer, timeout, EOF--> CLOSING
 *
 * In CLOSING nothing more is read; queued requests are cancelled, replies already queued may be
 * flushed for a short while, then the handles are closed. The struct is freed only from a close
 * callback or from the completion of its last running request, never inside its own poll
 * callback, and only once its handles are closed, no request of it runs and every one of its
 * regions is released.
 *
 * Each connection is watched with a uv_poll_t and read with recvmsg (common/sock.c) because
 * libuv's pipes cannot carry plain file descriptors. Replies are sent without blocking; what the
 * socket does not take waits in a bounded per-connection queue flushed on UV_WRITABLE.
 */
#ifndef CONVD_DAEMON_CONNECTION_H
#define CONVD_DAEMON_CONNECTION_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "idmap.h"
#include "conn_registry.h"
#include "list.h"
#include "regions.h"
#include "request.h"
#include "ring.h"
#include "scheduler.h"
#include "users.h"
#include "wire.h"

struct convd_daemon;

/* A gated request as the loop's scan of ready words reads it (conn_poll_gates): the word, the
 * value it waits for and its deadline, side by side for every gated request of a connection, so
 * that a scan of hundreds of them reads a few contiguous lines, not each request's struct. */
struct gate_watch {
    const _Atomic uint32_t *word;
    uint32_t value;
    uint64_t deadline_ns;
    struct dreq *r;
};

enum conn_state {
    CONN_AWAIT_HELLO = 0,
    CONN_READY,
    CONN_CLOSING,
};

struct conn {
    struct list_node link; /* in daemon->conns */
    struct convd_daemon *d;
    uint64_t serial; /* "client 7" in logs */
    int fd;
    enum conn_state state;
    int refuse_status; /* != 0: answer Hello with this status, then close */
    char refuse_why[192];
    bool counted; /* counts against max_clients (else a refused one) */
    pid_t pid;
    uid_t uid;
    gid_t gid;
    struct user *user;       /* the uid's account (daemon->users), one reference */
    uint64_t last_active_ns; /* the last datagram or ring submission, for idle_timeout_ms */
    char name[CONVD_MAX_NAME_BYTES + 1];
    uint32_t proto_version; /* agreed in the handshake (0 before it) */

    uv_poll_t poll;
    uv_timer_t timer; /* Hello timeout, then the linger after CLOSING */
    int handles_open;
    bool handles_closing;
    int poll_events;

    struct list_node outq; /* struct conn_out, oldest first */
    uint64_t outq_bytes;

    uint32_t protocol_errors;
    struct region_table regions;
    struct req_problem_cache problem_cache; /* the last problem that passed its checks */
    struct idmap inflight;                  /* id -> struct dreq, queued or running */
    uint32_t running;
    struct sched_client sched;
    uint64_t served, failed; /* for the closing log line */
    uint64_t log_window_ns;  /* conn_log_allowed: the current second */
    uint32_t log_lines, log_suppressed;

    /* Rings (AttachRing): submissions and completions in shared memory. */
    bool has_ring;
    struct ring ring;
    struct list_node ring_link;   /* in daemon->ring_conns while READY with a ring */
    struct list_node notify_link; /* in daemon->ring_notify while completions await a doorbell */
    bool notify_queued;
    bool ring_stalled;      /* the completion ring is full with submissions waiting */
    uint32_t stall_cq_head; /* cq_head when the stall timer started */

    /* Requests waiting on their gates' ready words (struct dreq.gate_link), oldest first, and
     * the same requests in the same order as the scan reads them (gw_len of gw_cap). */
    struct list_node gated;
    struct gate_watch *gw;
    uint32_t gw_len, gw_cap;
    struct list_node gate_link; /* in daemon->conns.gates while gated is not empty */
    /* Lanes (device_waits): the lane this connection holds while requests of its run there
     * (-1: none), and those requests (struct dreq.wait_link), oldest first. */
    int lane;
    struct list_node waiting;
    uint32_t lane_inflight;
    /* A registration that waits for the lanes to empty (daemon_lanes_busy), and until it has
     * run nothing more is read from this connection's socket or ring; NULL: none. */
    struct conn_held *held;
    struct list_node held_link; /* in daemon->conns.held while held is set */
};

/* Takes over a freshly accepted descriptor: reads the peer's credentials, applies the allow-list
 * and max_clients (a refused peer is told why at its Hello), and starts watching it. */
void conn_accept(struct convd_daemon *d, int fd);

/* Moves c to CLOSING: cancels its queued requests, unregisters its regions, and closes its handles
 * (after flushing queued replies for up to a second when flush is set). Idempotent; a second call
 * without flush cuts a pending flush short. */
void conn_shutdown(struct conn *c, bool flush, const char *reason);

/*
 * The daemon's connections as a whole (struct conn_registry, which only this file touches).
 */

void conn_registry_init(struct conn_registry *r);

/* Connections counted against max_clients. */
uint32_t conn_clients(const struct convd_daemon *d);

/* Whether any READY connection has rings the loop must poll. */
bool conn_have_rings(const struct convd_daemon *d);

/* conn_shutdown() on every connection. */
void conn_shutdown_all(struct convd_daemon *d, bool flush, const char *reason);

/* Takes what the submission rings hold (up to a budget per ring, so that every ring gets a turn)
 * and queues it under one dispatch hold, so that what arrived together runs together. Returns
 * the number of submissions taken. A corrupt ring closes its connection. */
unsigned conn_poll_rings(struct convd_daemon *d);

/* Sets or clears NEED_WAKEUP on every ring. Returns, after setting it, whether a submission
 * arrived meanwhile (then the loop must not sleep). */
bool conn_rings_sleep(struct convd_daemon *d, bool sleeping);

/* Sends one Doorbell to each client whose completions were posted since its last one, if it
 * sleeps. */
void conn_ring_doorbells(struct convd_daemon *d);

/* Queues every gated request whose ready word has come, and fails those whose gate deadline has
 * passed. Returns how many it moved. */
unsigned conn_poll_gates(struct convd_daemon *d);

/* Fails every gated request with status and the sentence (the drain timeout). */
void conn_fail_gated(struct convd_daemon *d, int status, const char *why);

/* Requests waiting on their gates, over all connections. */
uint32_t conn_gated(const struct convd_daemon *d);

/* Connections with requests waiting on their gates. */
uint32_t conn_gated_conns(const struct convd_daemon *d);

/* Lanes (device_waits; docs/architecture.md, "Lanes"): launches each connection's gated
 * requests, oldest first, into the lane it holds (or a free one), one request a batch, while
 * its lane has a free slot; the device then waits on the ready word. Returns how many. */
unsigned conn_launch_waits(struct convd_daemon *d);

/* Connections whose registration waits for the lanes to empty. */
uint32_t conn_held(const struct convd_daemon *d);

/* Runs the registrations that waited for the lanes to empty (they are empty now), oldest
 * first, and reads those connections again. */
void conn_run_held(struct convd_daemon *d);

/* Requests in lanes, over all connections. */
uint32_t conn_waiting(const struct convd_daemon *d);

/* Stores the ready word of every request in a lane (the watchdog keeps it stored), so that the
 * lanes drain; each is reported with `status` unless its word had come by itself. */
void conn_release_waits(struct convd_daemon *d, int status);

/* Request r goes to a worker now: counted as running on its connection and the daemon, its job
 * cleared for the backend. */
void conn_request_started(struct dreq *r, uint64_t now_ns);

/* Finishes request r: sends its Completion when the connection is READY, drops its region
 * references and its id, frees it, and frees the connection if that was all it waited for. */
void conn_request_done(struct dreq *r, int status, const char *error, uint64_t queue_us,
                       uint64_t exec_us, uint32_t batch_size);

#endif
