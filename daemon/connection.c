#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "connection.h"
#include "convd/convd.h"
#include "daemon.h"
#include "log.h"
#include "pbscan.h"
#include "sock.h"
#include "why.h"

#define CONN_READS_PER_WAKEUP 32   /* datagrams read before other connections get a turn */
#define CONN_LINGER_MS        1000 /* how long a closing connection may take to flush */
#define CONN_MAX_GIDS         64
#define CONN_TRIM_BYTES       (256u * 1024u) /* unread replies worth returning to the system */

/* A RegisterRegion held until the lanes empty (conn_hold_register): the message's fields, and a
 * duplicate of its memfd's descriptor (the caller closes the one that came with it). */
struct conn_held {
    uint64_t id, size, ipc_offset;
    Convd__RegionKind kind;
    int fd; /* -1 for GPU_IPC */
    uint8_t ipc_handle[CONVD_IPC_HANDLE_SIZE];
};

/* One encoded datagram waiting for the socket to take it. */
struct conn_out {
    struct list_node link;
    size_t len;
    uint8_t data[];
};

static void conn_close_handles(struct conn *c);
static void conn_maybe_free(struct conn *c);
static void conn_on_poll(uv_poll_t *h, int status, int events);

static const char *conn_msg_name(Convd__ClientMessage__MsgCase m)
{
    switch (m) {
    case CONVD__CLIENT_MESSAGE__MSG_HELLO:
        return "Hello";
    case CONVD__CLIENT_MESSAGE__MSG_REGISTER_REGION:
        return "RegisterRegion";
    case CONVD__CLIENT_MESSAGE__MSG_UNREGISTER_REGION:
        return "UnregisterRegion";
    case CONVD__CLIENT_MESSAGE__MSG_CONV:
        return "ConvRequest";
    case CONVD__CLIENT_MESSAGE__MSG_STATUS:
        return "StatusRequest";
    case CONVD__CLIENT_MESSAGE__MSG_METRICS:
        return "MetricsRequest";
    case CONVD__CLIENT_MESSAGE__MSG_PING:
        return "Ping";
    case CONVD__CLIENT_MESSAGE__MSG_ATTACH_RING:
        return "AttachRing";
    case CONVD__CLIENT_MESSAGE__MSG_DOORBELL:
        return "Doorbell";
    default:
        return "nothing";
    }
}

static const char *conn_label(const struct conn *c)
{
    return c->name[0] != '\0' ? c->name : "?";
}

/* --- sending ------------------------------------------------------------------------------ */

/* What c's socket is watched for: requests, unless a held registration stops reading (a
 * hang-up is noticed when reading resumes), and room for unsent replies. */
static int conn_events(const struct conn *c)
{
    if (c->state == CONN_CLOSING)
        return UV_WRITABLE;
    int events = c->held != NULL ? 0 : UV_READABLE | UV_DISCONNECT;
    return list_empty(&c->outq) ? events : events | UV_WRITABLE;
}

static void conn_set_events(struct conn *c, int events)
{
    if (c->handles_closing || events == c->poll_events)
        return;
    c->poll_events = events;
    if (events == 0)
        uv_poll_stop(&c->poll);
    else
        uv_poll_start(&c->poll, events, conn_on_poll);
}

/* Sends what the queue holds. Returns 0, or -1 when the connection broke (and is shut down). */
static int conn_flush(struct conn *c)
{
    while (!list_empty(&c->outq)) {
        struct conn_out *o = list_entry(c->outq.next, struct conn_out, link);
        int rc = sock_send(c->fd, o->data, o->len, -1);
        if (rc == -EAGAIN)
            return 0;
        if (rc != 0) {
            char reason[96];
            snprintf(reason, sizeof(reason), "send failed: %s", strerror(-rc));
            conn_shutdown(c, false, reason);
            return -1;
        }
        c->outq_bytes -= o->len;
        list_del(&o->link);
        free(o);
    }
    if (c->state == CONN_CLOSING) {
        /* the flush a closing connection waited for is complete */
        conn_close_handles(c);
        return 0;
    }
    conn_set_events(c, conn_events(c));
    return 0;
}

/* Encodes and sends one message, queueing it when the socket is full. A peer whose queue grows
 * past max_send_queue_bytes is not reading its replies and is disconnected. */
static void conn_send(struct conn *c, const Convd__ServerMessage *m)
{
    struct convd_daemon *d = c->d;
    if (c->handles_closing || c->fd < 0)
        return;
    int len = wire_pack_server(m, d->tx, sizeof(d->tx));
    if (len < 0) {
        log_err("client %llu: reply does not fit in %u bytes; dropped",
                (unsigned long long)c->serial, CONVD_MAX_MESSAGE_BYTES);
        return;
    }
    if (c->has_ring)
        ring_note_socket(&c->ring);
    if (list_empty(&c->outq)) {
        int rc = sock_send(c->fd, d->tx, (size_t)len, -1);
        if (rc == 0)
            return;
        if (rc != -EAGAIN) {
            char reason[96];
            snprintf(reason, sizeof(reason), "send failed: %s", strerror(-rc));
            conn_shutdown(c, false, reason);
            return;
        }
    }
    if (c->outq_bytes + (uint64_t)len > d->cfg.max_send_queue_bytes) {
        log_warn("client %llu (%s): %llu bytes of replies unread; disconnecting it",
                 (unsigned long long)c->serial, conn_label(c), (unsigned long long)c->outq_bytes);
        conn_shutdown(c, false, "not reading its replies (max_send_queue_bytes)");
        return;
    }
    struct conn_out *o = malloc(sizeof(*o) + (size_t)len);
    if (o == NULL) {
        conn_shutdown(c, false, "out of memory queueing a reply");
        return;
    }
    o->len = (size_t)len;
    memcpy(o->data, d->tx, (size_t)len);
    list_add_tail(&c->outq, &o->link);
    c->outq_bytes += (uint64_t)len;
    conn_set_events(c, conn_events(c));
}

static void conn_send_protocol_error(struct conn *c, int status, const char *text)
{
    Convd__ServerMessage m = CONVD__SERVER_MESSAGE__INIT;
    Convd__ProtocolError pe = CONVD__PROTOCOL_ERROR__INIT;
    pe.status = status;
    pe.error = (char *)text;
    m.msg_case = CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR;
    m.protocol_error = &pe;
    conn_send(c, &m);
}

/* A datagram that cannot be decoded or is not allowed now. Counted; past the limit the connection
 * is closed. */
static void conn_protocol_error(struct conn *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void conn_protocol_error(struct conn *c, int status, const char *fmt, ...)
{
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    c->protocol_errors++;
    metrics_protocol_error(&c->d->metrics);
    log_debug("client %llu (%s): protocol error %s: %s", (unsigned long long)c->serial,
              conn_label(c), convd_status_name(status), text);
    conn_send_protocol_error(c, status, text);
    if (c->protocol_errors >= c->d->cfg.max_protocol_errors && c->state != CONN_CLOSING)
        conn_shutdown(c, true, "too many protocol errors (max_protocol_errors)");
}

static void conn_send_completion(struct conn *c, uint64_t id, int status, const char *error,
                                 uint64_t queue_us, uint64_t exec_us, uint32_t batch_size)
{
    Convd__ServerMessage m = CONVD__SERVER_MESSAGE__INIT;
    Convd__Completion done = CONVD__COMPLETION__INIT;
    done.id = id;
    done.status = status;
    done.error = (char *)(status != 0 && error != NULL ? error : "");
    done.queue_us = queue_us;
    done.exec_us = exec_us;
    done.batch_size = batch_size;
    m.msg_case = CONVD__SERVER_MESSAGE__MSG_COMPLETION;
    m.completion = &done;
    conn_send(c, &m);
}

static void conn_send_region_reply(struct conn *c, uint64_t id, int status, const char *error)
{
    Convd__ServerMessage m = CONVD__SERVER_MESSAGE__INIT;
    Convd__RegionReply rr = CONVD__REGION_REPLY__INIT;
    rr.region_id = id;
    rr.status = status;
    rr.error = (char *)(status != 0 ? error : "");
    m.msg_case = CONVD__SERVER_MESSAGE__MSG_REGION_REPLY;
    m.region_reply = &rr;
    conn_send(c, &m);
}

/* --- requests ----------------------------------------------------------------------------- */

/* Adds r to c's watch array, at the end (the list's order). Returns false when out of memory. */
static bool conn_watch_gate(struct conn *c, struct dreq *r)
{
    if (c->gw_len == c->gw_cap) {
        uint32_t cap = c->gw_cap != 0 ? 2 * c->gw_cap : 16;
        struct gate_watch *gw = realloc(c->gw, cap * sizeof(*gw));
        if (gw == NULL)
            return false;
        c->gw = gw;
        c->gw_cap = cap;
    }
    c->gw[c->gw_len++] = (struct gate_watch){r->gate_ready, r->ready_value, r->gate_deadline_ns, r};
    return true;
}

static void conn_ungate(struct conn *c, struct dreq *r)
{
    /* Usually the oldest: the client's stream writes its words in order. */
    uint32_t i = 0;
    while (i < c->gw_len && c->gw[i].r != r)
        i++;
    assert(i < c->gw_len);
    if (i < c->gw_len) {
        memmove(&c->gw[i], &c->gw[i + 1], (c->gw_len - i - 1) * sizeof(c->gw[0]));
        c->gw_len--;
    }
    r->gated = false;
    list_del(&r->gate_link);
    c->d->conns.gated--;
    if (list_empty(&c->gated)) {
        list_del(&c->gate_link);
        c->d->conns.gated_conns--;
    }
}

static void conn_free_request(struct conn *c, struct dreq *r)
{
    if (r->gated)
        conn_ungate(c, r);
    c->user->inflight--;
    idmap_del(&c->inflight, r->id);
    req_unref_regions(r);
    free(r);
}

/* A request of a lane has finished: the watchdog lets go of its word, the lane of its slot.
 * Returns the status to report: a word the daemon had to store means the batch ran on inputs
 * that were not known to be ready. */
static int conn_lane_done(struct conn *c, struct dreq *r, int status, const char **error,
                          char *why, size_t why_len)
{
    struct convd_daemon *d = c->d;
    const int released = waits_remove(&d->waits, &r->wait);
    r->waited = false;
    list_del(&r->wait_link);
    d->conns.waiting--;
    if (--c->lane_inflight == 0) {
        d->conns.lane_owner[c->lane] = NULL;
        c->lane = -1;
    }
    if (released == 0 || (status != 0 && status != CONVD_EDEVICE))
        return status;
    if (released == CONVD_ETIMEDOUT)
        snprintf(why, why_len,
                 "the gate's ready word (region %llu) still held %u after %llu ms, below %u "
                 "(%s); the daemon stored %u to free its lane, so the output is not valid",
                 (unsigned long long)r->gate_region->id, (unsigned)r->wait.held,
                 (unsigned long long)((r->gate_deadline_ns - r->recv_ns) / 1000000u),
                 (unsigned)r->ready_value,
                 r->gate_deadline_ns == r->sched.deadline_ns ? "the request's timeout_us"
                                                             : "gate_timeout_ms",
                 (unsigned)r->ready_value);
    else
        snprintf(why, why_len,
                 "%s before the request's gate opened; the daemon stored its ready word to free "
                 "its lane, so the output is not valid",
                 released == CONVD_ESHUTDOWN ? "the daemon is shutting down and its drain timeout "
                                               "passed"
                                             : "the request was cancelled");
    *error = why;
    return released;
}

void conn_request_done(struct dreq *r, int status, const char *error, uint64_t queue_us,
                       uint64_t exec_us, uint32_t batch_size)
{
    struct conn *c = r->conn;
    struct convd_daemon *d = c->d;
    char lane_why[320];
    if (r->waited)
        status = conn_lane_done(c, r, status, &error, lane_why, sizeof(lane_why));
    metrics_request(&d->metrics, status, 0);
    /* Before the completion: a client that sees it finds the word written. */
    req_gate_release(r);
    if (status == 0)
        c->served++;
    else
        c->failed++;
    if (c->state == CONN_READY && r->via_ring && status == 0) {
        struct convd_ring_cqe cqe = {
            .id = r->id,
            .status = 0,
            .batch_size = batch_size,
            .queue_us = queue_us > UINT32_MAX ? UINT32_MAX : (uint32_t)queue_us,
            .exec_us = exec_us > UINT32_MAX ? UINT32_MAX : (uint32_t)exec_us,
        };
        char why[192];
        if (ring_post(&c->ring, &cqe, why, sizeof(why)) != 0) {
            conn_send_protocol_error(c, CONVD_EPROTO, why);
            conn_shutdown(c, true, why);
        } else if (!c->notify_queued) {
            c->notify_queued = true;
            list_add_tail(&d->conns.notify, &c->notify_link);
        }
    } else {
        if (r->via_ring && c->has_ring)
            ring_release(&c->ring);
        if (c->state == CONN_READY)
            conn_send_completion(c, r->id, status, error, queue_us, exec_us, batch_size);
    }
    if (status != 0 && status != CONVD_ECANCELED)
        log_debug("client %llu (%s): request %llu failed: %s: %s", (unsigned long long)c->serial,
                  conn_label(c), (unsigned long long)r->id, convd_status_name(status),
                  error != NULL ? error : "");
    bool was_running = r->running;
    conn_free_request(c, r);
    if (was_running) {
        c->running--;
        daemon_request_finished(d);
    }
    if (c->state == CONN_CLOSING)
        conn_maybe_free(c);
}

/* Per-request log lines (rejections, refused regions) are limited per connection, so that a
 * burst of bad requests cannot flood the journal: CONN_LOG_BURST lines a second, then one line
 * saying how many were left out. */
#define CONN_LOG_BURST 10

static bool conn_log_allowed(struct conn *c)
{
    uint64_t now = convd_now_ns();
    if (now - c->log_window_ns >= 1000000000u) {
        if (c->log_suppressed > 0)
            log_info("client %llu (%s): %u more rejections in the last second were not logged",
                     (unsigned long long)c->serial, conn_label(c), c->log_suppressed);
        c->log_window_ns = now;
        c->log_lines = 0;
        c->log_suppressed = 0;
    }
    if (c->log_lines < CONN_LOG_BURST) {
        c->log_lines++;
        return true;
    }
    c->log_suppressed++;
    return false;
}

/* Completion for a request refused before it was queued; always on the socket, since it
 * carries a sentence. */
static void conn_reject(struct conn *c, bool via_ring, uint64_t id, int status, const char *why)
{
    struct convd_daemon *d = c->d;
    if (via_ring)
        ring_release(&c->ring);
    metrics_request(&d->metrics, status, 1);
    c->failed++;
    if (conn_log_allowed(c))
        log_info("client %llu (%s): request %llu rejected: %s: %s", (unsigned long long)c->serial,
                 conn_label(c), (unsigned long long)id, convd_status_name(status), why);
    conn_send_completion(c, id, status, why, 0, 0, 0);
}

static void conn_on_conv(struct conn *c, const Convd__ConvRequest *pb, bool via_ring)
{
    struct convd_daemon *d = c->d;
    char why[320];
    if (d->draining) {
        conn_reject(c, via_ring, pb->id, CONVD_ESHUTDOWN,
                    "the daemon is shutting down; no new requests");
        return;
    }
    struct dreq *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        conn_reject(c, via_ring, pb->id, CONVD_ENOMEM, "out of memory");
        return;
    }
    const struct req_context ctx = {
        .regions = &c->regions,
        .backend = &d->backend,
        .inflight = &c->inflight,
        .max_inflight = d->cfg.max_inflight,
        .proto_version = c->proto_version,
        .cache = &c->problem_cache,
    };
    int rc = req_validate(pb, &ctx, r, why, sizeof(why));
    if (rc != 0) {
        /* Refused after its gate passed the checks (EEXIST, ELIMIT): its stream goes on. */
        req_gate_release(r);
        free(r);
        conn_reject(c, via_ring, pb->id, rc, why);
        return;
    }
    r->conn = c;
    r->via_ring = via_ring;
    r->recv_ns = convd_now_ns();
    r->sched.enqueue_ns = r->recv_ns;
    if (r->timeout_us != 0) {
        uint64_t dl;
        if (__builtin_mul_overflow(r->timeout_us, (uint64_t)1000, &dl) ||
            __builtin_add_overflow(dl, r->recv_ns, &dl))
            dl = 0; /* a timeout past the end of time is no timeout */
        r->sched.deadline_ns = dl;
    }
    rc = idmap_put(&c->inflight, r->id, r);
    if (rc != 0) {
        req_gate_release(r);
        free(r);
        conn_reject(c, via_ring, pb->id, rc, "out of memory");
        return;
    }
    if (c->user->inflight >= d->cfg.max_inflight_per_user) {
        idmap_del(&c->inflight, r->id);
        req_gate_release(r);
        free(r);
        snprintf(why, sizeof(why),
                 "uid %u already has %u requests queued or running over its connections, its "
                 "share (max_inflight_per_user)",
                 (unsigned)c->uid, (unsigned)c->user->inflight);
        conn_reject(c, via_ring, pb->id, CONVD_ELIMIT, why);
        return;
    }
    if (r->gate_region != NULL && !req_gate_open(r)) {
        /* Out of the queue until its client's stream writes the ready word (conn_poll_gates). */
        uint64_t gate_dl = r->recv_ns + d->cfg.gate_timeout_ms * 1000000u;
        r->gate_deadline_ns = r->sched.deadline_ns != 0 && r->sched.deadline_ns < gate_dl
                                  ? r->sched.deadline_ns
                                  : gate_dl;
        if (!conn_watch_gate(c, r)) {
            idmap_del(&c->inflight, r->id);
            req_gate_release(r);
            free(r);
            conn_reject(c, via_ring, pb->id, CONVD_ENOMEM,
                        "out of memory for watching the request's ready word");
            return;
        }
        r->gated = true;
        if (list_empty(&c->gated)) {
            list_add_tail(&d->conns.gates, &c->gate_link);
            d->conns.gated_conns++;
        }
        list_add_tail(&c->gated, &r->gate_link);
        d->conns.gated++;
        c->user->inflight++;
        req_ref_regions(r);
        if (d->pool.lanes > 0)
            conn_launch_waits(d);
        return;
    }
    rc = sched_push(&d->sched, &c->sched, &r->sched);
    if (rc != 0) {
        idmap_del(&c->inflight, r->id);
        req_gate_release(r);
        free(r);
        snprintf(why, sizeof(why), "the queue holds %u requests, the limit (queue_limit)",
                 (unsigned)sched_depth(&d->sched));
        conn_reject(c, via_ring, pb->id, rc, why);
        return;
    }
    c->user->inflight++;
    req_ref_regions(r);
    if (r->sched.deadline_ns != 0)
        daemon_note_deadline(d, r->sched.deadline_ns);
    daemon_request_queued(d);
}

/* --- gates -------------------------------------------------------------------------------- */

/* A gated request whose ready word came: into the queue, timed from now. */
static void conn_gate_opened(struct conn *c, struct dreq *r, uint64_t now)
{
    struct convd_daemon *d = c->d;
    conn_ungate(c, r);
    metrics_gate_wait(&d->metrics, now - r->recv_ns);
    r->recv_ns = now;
    r->sched.enqueue_ns = now;
    int rc = sched_push(&d->sched, &c->sched, &r->sched);
    if (rc != 0) {
        char why[160];
        snprintf(why, sizeof(why), "the queue holds %u requests, the limit (queue_limit)",
                 (unsigned)sched_depth(&d->sched));
        conn_request_done(r, rc, why, 0, 0, 0);
        return;
    }
    if (r->sched.deadline_ns != 0)
        daemon_note_deadline(d, r->sched.deadline_ns);
    daemon_request_queued(d);
}

static void conn_gate_expired(struct conn *c, struct dreq *r, uint64_t now)
{
    char why[256];
    snprintf(why, sizeof(why),
             "the gate's ready word (region %llu) still held %u after %llu ms, below %u%s",
             (unsigned long long)r->gate_region->id,
             (unsigned)atomic_load_explicit(r->gate_ready, memory_order_relaxed),
             (unsigned long long)((now - r->recv_ns) / 1000000u), (unsigned)r->ready_value,
             r->gate_deadline_ns == r->sched.deadline_ns ? " (the request's timeout_us)"
                                                         : " (gate_timeout_ms)");
    conn_ungate(c, r);
    conn_request_done(r, CONVD_ETIMEDOUT, why, (now - r->recv_ns) / 1000u, 0, 0);
}

void conn_fail_gated(struct convd_daemon *d, int status, const char *why)
{
    uint64_t now = convd_now_ns();
    while (!list_empty(&d->conns.gates)) {
        struct conn *c = list_entry(d->conns.gates.next, struct conn, gate_link);
        struct dreq *r = list_entry(c->gated.next, struct dreq, gate_link);
        conn_ungate(c, r);
        conn_request_done(r, status, why, (now - r->recv_ns) / 1000u, 0, 0);
    }
}

uint32_t conn_gated(const struct convd_daemon *d)
{
    return d->conns.gated;
}

uint32_t conn_gated_conns(const struct convd_daemon *d)
{
    return d->conns.gated_conns;
}

/* --- lanes --------------------------------------------------------------------------------- */

/* The lane c holds, or a free one it takes now; -1 when every lane is held. */
static int conn_lane(struct conn *c)
{
    struct convd_daemon *d = c->d;
    if (c->lane >= 0)
        return c->lane;
    for (unsigned l = 0; l < d->pool.lanes; l++)
        if (d->conns.lane_owner[l] == NULL) {
            d->conns.lane_owner[l] = c;
            c->lane = (int)l;
            return c->lane;
        }
    return -1;
}

/* Launches r, the oldest of c's gated requests, into c's lane slot `slot`, alone: the request
 * after it is usually gated on this one's done word, so a batch of both would never start. */
static void conn_launch_wait(struct conn *c, struct dreq *r, struct batch *b, unsigned slot,
                             uint64_t now)
{
    struct convd_daemon *d = c->d;
    conn_ungate(c, r);
    r->waited = true;
    r->job.ready_mem = &r->gate_region->mem;
    r->job.ready_offset = r->ready_offset;
    r->job.ready_value = r->ready_value;
    list_add_tail(&c->waiting, &r->wait_link);
    c->lane_inflight++;
    d->conns.waiting++;
    d->metrics.lane_launches++;
    waits_add(&d->waits, &r->wait, r->gate_ready, r->ready_value, r->gate_deadline_ns);
    conn_request_started(r, now);
    b->jobs[0] = &r->job;
    pool_submit(&d->pool, slot, b);
}

unsigned conn_launch_waits(struct convd_daemon *d)
{
    /* Paused while a registration or release waits for the lanes to empty: the loop polls the
     * new requests' words meanwhile and runs them on the other slots. */
    if (d->pool.lanes == 0 || d->conns.gated == 0 || d->finishing || !d->pool_started ||
        daemon_lanes_paused(d))
        return 0;
    unsigned launched = 0;
    const uint64_t now = convd_now_ns();
    struct list_node *cpos, *ctmp;
    list_for_each_safe(cpos, ctmp, &d->conns.gates)
    {
        struct conn *c = list_entry(cpos, struct conn, gate_link);
        /* c leaves d->conns.gates when its last gated request goes: test before each. */
        for (bool more = true; more;) {
            struct dreq *r = list_entry(c->gated.next, struct dreq, gate_link);
            /* A word the device cannot reach (the region could not be pinned and mapped) stays
             * with the loop's polling, and so does every later request of c: in a lane they
             * could run before it. */
            if (!r->gate_region->mem.device_words || conn_lane(c) < 0)
                break;
            const int slot = pool_idle_lane_slot(&d->pool, (unsigned)c->lane);
            if (slot < 0)
                break;
            struct batch *b = batch_new(1);
            if (b == NULL)
                break; /* polled by the loop meanwhile, tried again at the next dispatch */
            more = c->gated.next->next != &c->gated;
            conn_launch_wait(c, r, b, (unsigned)slot, now);
            launched++;
        }
        if (c->lane >= 0 && c->lane_inflight == 0) {
            d->conns.lane_owner[c->lane] = NULL; /* taken, but nothing went into it */
            c->lane = -1;
        }
    }
    return launched;
}

uint32_t conn_waiting(const struct convd_daemon *d)
{
    return d->conns.waiting;
}

void conn_release_waits(struct convd_daemon *d, int status)
{
    struct list_node *cpos;
    list_for_each(cpos, &d->conns.all)
    {
        struct conn *c = list_entry(cpos, struct conn, link);
        struct list_node *pos;
        list_for_each(pos, &c->waiting)
        {
            struct dreq *r = list_entry(pos, struct dreq, wait_link);
            waits_release(&d->waits, &r->wait, status);
        }
    }
}

unsigned conn_poll_gates(struct convd_daemon *d)
{
    if (d->conns.gated == 0)
        return 0;
    conn_launch_waits(d);
    if (d->conns.gated == 0)
        return 0;
    unsigned moved = 0;
    uint64_t now = convd_now_ns();
    bool held = daemon_hold_dispatch(d);
    struct list_node *cpos, *ctmp;
    list_for_each_safe(cpos, ctmp, &d->conns.gates)
    {
        struct conn *c = list_entry(cpos, struct conn, gate_link);
        uint32_t i = 0;
        while (i < c->gw_len) {
            const struct gate_watch *w = &c->gw[i];
            /* req_gate_open's cyclic comparison, on the copy. */
            const uint32_t v = atomic_load_explicit(w->word, memory_order_acquire);
            if ((int32_t)(v - w->value) >= 0)
                conn_gate_opened(c, w->r, now); /* takes entry i out */
            else if (now >= w->deadline_ns)
                conn_gate_expired(c, w->r, now);
            else {
                i++;
                continue;
            }
            moved++;
            /* A failure's completion may have closed the connection (a full send queue), which
             * cancelled the rest of its requests. */
            if (c->state != CONN_READY)
                break;
        }
    }
    daemon_release_dispatch(d, held);
    return moved;
}

/* --- rings -------------------------------------------------------------------------------- */

#define CONN_RING_BUDGET 64 /* submissions taken from one ring before the next ring's turn */

static void conn_send_ring_reply(struct conn *c, int status, const char *error)
{
    Convd__ServerMessage m = CONVD__SERVER_MESSAGE__INIT;
    Convd__RingReply rr = CONVD__RING_REPLY__INIT;
    rr.status = status;
    rr.error = (char *)(status != 0 ? error : "");
    m.msg_case = CONVD__SERVER_MESSAGE__MSG_RING_REPLY;
    m.ring_reply = &rr;
    conn_send(c, &m);
}

static void conn_on_attach_ring(struct conn *c, const Convd__AttachRing *ar, const int *fds,
                                size_t nfds)
{
    struct convd_daemon *d = c->d;
    char why[256];
    int rc;
    if (c->has_ring) {
        rc = CONVD_EEXIST;
        snprintf(why, sizeof(why), "this connection already has rings");
    } else if (d->draining) {
        rc = CONVD_ESHUTDOWN;
        snprintf(why, sizeof(why), "the daemon is shutting down; no new rings");
    } else {
        rc = ring_map(&c->ring, ar->version, ar->sq_entries, ar->cq_entries, ar->size, fds, nfds,
                      why, sizeof(why));
    }
    if (rc != 0) {
        log_info("client %llu (%s): rings refused: %s: %s", (unsigned long long)c->serial,
                 conn_label(c), convd_status_name(rc), why);
        conn_send_ring_reply(c, rc, why);
        return;
    }
    c->has_ring = true;
    list_add_tail(&d->conns.rings, &c->ring_link);
    log_debug("client %llu (%s): rings attached (%u submissions, %u completions)",
              (unsigned long long)c->serial, conn_label(c), ar->sq_entries, ar->cq_entries);
    conn_send_ring_reply(c, 0, "");
}

/* Stops serving the rings: after this nothing reads or writes them. */
static void conn_detach_ring(struct conn *c)
{
    if (!c->has_ring)
        return;
    list_del(&c->ring_link);
    if (c->notify_queued) {
        list_del(&c->notify_link);
        c->notify_queued = false;
    }
    if (c->ring_stalled)
        uv_timer_stop(&c->timer);
    c->ring_stalled = false;
    c->has_ring = false;
    ring_unmap(&c->ring);
}

static void conn_on_ring_stall(uv_timer_t *t);

/* The completion ring is full while submissions wait: back-pressure, unless the client stops
 * reading its completions altogether, which the timer catches. */
static void conn_ring_stall_start(struct conn *c)
{
    if (c->ring_stalled)
        return;
    c->ring_stalled = true;
    c->stall_cq_head = ring_cq_head(&c->ring);
    uv_timer_start(&c->timer, conn_on_ring_stall, c->d->cfg.ring_stall_timeout_ms, 0);
}

static void conn_on_ring_stall(uv_timer_t *t)
{
    struct conn *c = t->data;
    if (c->state != CONN_READY || !c->has_ring || !c->ring_stalled)
        return;
    uint32_t head = ring_cq_head(&c->ring);
    if (head != c->stall_cq_head) {
        /* It does read, slowly: keep watching. */
        c->ring_stalled = false;
        return;
    }
    char why[192];
    snprintf(why, sizeof(why),
             "the completion ring stayed full for %llu ms with submissions waiting: the client "
             "does not read its completions (ring_stall_timeout_ms)",
             (unsigned long long)c->d->cfg.ring_stall_timeout_ms);
    log_warn("client %llu (%s): %s; disconnecting it", (unsigned long long)c->serial, conn_label(c),
             why);
    conn_send_protocol_error(c, CONVD_ETIMEDOUT, why);
    conn_shutdown(c, true, why);
}

static unsigned conn_poll_ring(struct conn *c)
{
    unsigned taken = 0;
    while (taken < CONN_RING_BUDGET && c->state == CONN_READY && c->has_ring && c->held == NULL) {
        struct convd_ring_sqe e;
        char why[256];
        enum ring_take_result res = ring_take(&c->ring, &e, why, sizeof(why));
        if (res == RING_EMPTY)
            break;
        if (res == RING_FULL) {
            conn_ring_stall_start(c);
            break;
        }
        if (res == RING_CORRUPT) {
            metrics_protocol_error(&c->d->metrics);
            log_info("client %llu (%s): %s; disconnecting it", (unsigned long long)c->serial,
                     conn_label(c), why);
            conn_send_protocol_error(c, CONVD_EPROTO, why);
            conn_shutdown(c, true, why);
            break;
        }
        if (taken++ == 0)
            c->last_active_ns = convd_now_ns();
        if (c->ring_stalled) {
            c->ring_stalled = false;
            uv_timer_stop(&c->timer);
        }
        Convd__ConvRequest req;
        Convd__Problem pb;
        Convd__TensorRef refs[4];
        Convd__Gate gate;
        if (wire_ring_request(&e, &req, &pb, refs, &gate, why, sizeof(why)) != 0) {
            conn_reject(c, true, e.id, CONVD_EPROTO, why);
            c->protocol_errors++;
            metrics_protocol_error(&c->d->metrics);
            if (c->protocol_errors >= c->d->cfg.max_protocol_errors)
                conn_shutdown(c, true, "too many protocol errors (max_protocol_errors)");
            continue;
        }
        conn_on_conv(c, &req, true);
    }
    return taken;
}

/* Takes c off the notify list; true when it needs a doorbell (its client sleeps on the socket). */
static bool conn_needs_doorbell(struct conn *c)
{
    list_del(&c->notify_link);
    c->notify_queued = false;
    if (c->state != CONN_READY || !c->has_ring || !ring_client_waiting(&c->ring))
        return false;
    /* A full socket already has the client's attention; a doorbell is never queued. */
    return list_empty(&c->outq);
}

/* --- regions ------------------------------------------------------------------------------ */

/* With lanes busy, holds a registration that would import memory (the checks that refuse it
 * before any import run at once): importing waits for the device, and so for the words the
 * lanes wait on, whose clients may need this loop to launch their earlier requests first.
 * Until it runs, nothing more is read from c: the requests behind it may name the region. True
 * when held. */
static bool conn_hold_register(struct conn *c, const Convd__RegisterRegion *rr, const int *fds,
                               size_t nfds)
{
    struct convd_daemon *d = c->d;
    if (d->draining || !daemon_lanes_busy(d))
        return false;
    const bool memfd = rr->kind == CONVD__REGION_KIND__REGION_MEMFD && nfds == 1;
    const bool ipc = rr->kind == CONVD__REGION_KIND__REGION_GPU_IPC && nfds == 0 &&
                     rr->ipc_handle.len == CONVD_IPC_HANDLE_SIZE;
    if (!memfd && !ipc)
        return false;
    /* Without memory or a descriptor to hold it with, it imports now: the lanes' watchdog
     * frees a stalled lane within gate_timeout_ms. */
    struct conn_held *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return false;
    h->fd = -1;
    if (memfd && (h->fd = fcntl(fds[0], F_DUPFD_CLOEXEC, 0)) < 0) {
        free(h);
        return false;
    }
    h->id = rr->region_id;
    h->size = rr->size;
    h->kind = rr->kind;
    h->ipc_offset = rr->ipc_offset;
    if (ipc)
        memcpy(h->ipc_handle, rr->ipc_handle.data, CONVD_IPC_HANDLE_SIZE);
    c->held = h;
    list_add_tail(&d->conns.held, &c->held_link);
    d->conns.nheld++;
    d->metrics.region_holds++;
    conn_set_events(c, conn_events(c));
    log_debug("client %llu (%s): region %llu waits for the lanes to empty",
              (unsigned long long)c->serial, conn_label(c), (unsigned long long)rr->region_id);
    return true;
}

/* Takes c's held registration off the list; the caller runs or drops it. */
static struct conn_held *conn_unhold(struct conn *c)
{
    struct conn_held *h = c->held;
    if (h != NULL) {
        list_del(&c->held_link);
        c->d->conns.nheld--;
        c->held = NULL;
    }
    return h;
}

static void conn_on_register(struct conn *c, const Convd__RegisterRegion *rr, const int *fds,
                             size_t nfds)
{
    struct convd_daemon *d = c->d;
    char why[320];
    int rc;
    if (conn_hold_register(c, rr, fds, nfds))
        return;
    if (d->draining) {
        rc = CONVD_ESHUTDOWN;
        snprintf(why, sizeof(why), "the daemon is shutting down; no new regions");
    } else if (rr->kind == CONVD__REGION_KIND__REGION_MEMFD) {
        rc = region_register_memfd(&c->regions, rr->region_id, rr->size, fds, nfds, why,
                                   sizeof(why));
    } else if (rr->kind == CONVD__REGION_KIND__REGION_GPU_IPC) {
        if (nfds > 0) {
            rc = CONVD_EINVAL;
            snprintf(why, sizeof(why),
                     "region %llu: a GPU_IPC registration carries no file descriptor, this one "
                     "carried %zu",
                     (unsigned long long)rr->region_id, nfds);
        } else {
            rc = region_register_gpu(&c->regions, rr->region_id, rr->size, rr->ipc_handle.data,
                                     rr->ipc_handle.len, rr->ipc_offset, why, sizeof(why));
        }
    } else {
        rc = CONVD_EINVAL;
        snprintf(why, sizeof(why),
                 "region %llu: field kind is %d, must be REGION_MEMFD (1) or REGION_GPU_IPC (2)",
                 (unsigned long long)rr->region_id, (int)rr->kind);
    }
    if (rc == 0) {
        metrics_region(&d->metrics, true);
        log_debug("client %llu (%s): region %llu registered (%llu bytes)",
                  (unsigned long long)c->serial, conn_label(c), (unsigned long long)rr->region_id,
                  (unsigned long long)rr->size);
    } else {
        metrics_region(&d->metrics, false);
        if (conn_log_allowed(c))
            log_info("client %llu (%s): region %llu refused: %s: %s", (unsigned long long)c->serial,
                     conn_label(c), (unsigned long long)rr->region_id, convd_status_name(rc), why);
    }
    conn_send_region_reply(c, rr->region_id, rc, why);
}

uint32_t conn_held(const struct convd_daemon *d)
{
    return d->conns.nheld;
}

void conn_run_held(struct convd_daemon *d)
{
    while (!list_empty(&d->conns.held)) {
        struct conn *c = list_entry(d->conns.held.next, struct conn, held_link);
        struct conn_held *h = conn_unhold(c);
        Convd__RegisterRegion rr = CONVD__REGISTER_REGION__INIT;
        rr.region_id = h->id;
        rr.size = h->size;
        rr.kind = h->kind;
        rr.ipc_offset = h->ipc_offset;
        if (h->fd < 0) {
            rr.ipc_handle.data = h->ipc_handle;
            rr.ipc_handle.len = CONVD_IPC_HANDLE_SIZE;
        }
        conn_on_register(c, &rr, &h->fd, h->fd >= 0 ? 1 : 0);
        if (h->fd >= 0)
            close(h->fd);
        free(h);
        if (c->state != CONN_CLOSING)
            conn_set_events(c, conn_events(c)); /* its ring is polled on the loop's next pass */
    }
}

static void conn_on_unregister(struct conn *c, const Convd__UnregisterRegion *ur)
{
    char why[256];
    int rc = region_unregister(&c->regions, ur->region_id, why, sizeof(why));
    conn_send_region_reply(c, ur->region_id, rc, why);
}

/* --- handshake and queries ---------------------------------------------------------------- */

/* Keeps a client's name printable and short: it ends up in logs. */
static void conn_set_name(struct conn *c, const char *name)
{
    size_t k = 0;
    for (const char *p = name; p != NULL && *p != '\0' && k < CONVD_MAX_NAME_BYTES; p++)
        c->name[k++] = isprint((unsigned char)*p) ? *p : '?';
    c->name[k] = '\0';
    if (k == 0)
        snprintf(c->name, sizeof(c->name), "pid %d", (int)c->pid);
}

static void conn_on_hello(struct conn *c, const Convd__Hello *h)
{
    struct convd_daemon *d = c->d;
    Convd__ServerMessage m = CONVD__SERVER_MESSAGE__INIT;
    Convd__HelloReply hr = CONVD__HELLO_REPLY__INIT;
    char err[256] = "";
    m.msg_case = CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY;
    m.hello_reply = &hr;
    hr.protocol_version = CONVD_PROTOCOL_VERSION;
    hr.min_protocol_version = CONVD_PROTOCOL_VERSION_MIN;
    hr.max_protocol_version = CONVD_PROTOCOL_VERSION;
    hr.server_version = (char *)CONVD_VERSION_STRING;
    hr.backend = d->backend.info.name;
    hr.device = d->backend.info.device;
    hr.max_message_bytes = CONVD_MAX_MESSAGE_BYTES;
    hr.error = err;
    conn_set_name(c, h->client_name);

    if (c->refuse_status != 0) {
        hr.status = c->refuse_status;
        snprintf(err, sizeof(err), "%s", c->refuse_why);
        conn_send(c, &m);
        conn_shutdown(c, true, c->refuse_why);
        return;
    }
    uint32_t version;
    if (wire_pick_version(h->min_protocol_version, h->protocol_version, CONVD_PROTOCOL_VERSION_MIN,
                          CONVD_PROTOCOL_VERSION, "client", "daemon", &version, err,
                          sizeof(err)) != 0) {
        hr.status = CONVD_EVERSION;
        conn_send(c, &m);
        conn_shutdown(c, true, err);
        return;
    }
    c->proto_version = version;
    hr.protocol_version = version;
    hr.max_inflight = d->cfg.max_inflight;
    hr.max_regions = d->cfg.max_regions;
    hr.max_mapped_bytes = d->cfg.max_mapped_bytes;
    hr.max_batch = d->cfg.max_batch;
    hr.ring_version = CONVD_RING_VERSION;
    c->state = CONN_READY;
    uv_timer_stop(&c->timer);
    log_info("client %llu (%s) ready: pid %d, uid %u, gid %u, protocol %u",
             (unsigned long long)c->serial, c->name, (int)c->pid, (unsigned)c->uid,
             (unsigned)c->gid, (unsigned)version);
    conn_send(c, &m);
}

static void conn_on_status(struct conn *c, const Convd__StatusRequest *sr)
{
    Convd__ServerMessage m = CONVD__SERVER_MESSAGE__INIT;
    Convd__StatusReply st = CONVD__STATUS_REPLY__INIT;
    daemon_fill_status(c->d, &st);
    st.tag = sr->tag;
    m.msg_case = CONVD__SERVER_MESSAGE__MSG_STATUS_REPLY;
    m.status_reply = &st;
    conn_send(c, &m);
}

static void conn_on_metrics(struct conn *c, const Convd__MetricsRequest *mr)
{
    /* leave room for the envelope within one datagram */
    enum { TEXT_CAP = CONVD_MAX_MESSAGE_BYTES - 256 };
    char *text = malloc(TEXT_CAP);
    if (text == NULL) {
        conn_send_protocol_error(c, CONVD_ENOMEM, "out of memory rendering metrics");
        return;
    }
    if (daemon_render_metrics(c->d, NULL, text, TEXT_CAP) < 0)
        snprintf(text, TEXT_CAP, "# metrics do not fit in one message\n");
    Convd__ServerMessage m = CONVD__SERVER_MESSAGE__INIT;
    Convd__MetricsReply rep = CONVD__METRICS_REPLY__INIT;
    rep.tag = mr->tag;
    rep.text = text;
    m.msg_case = CONVD__SERVER_MESSAGE__MSG_METRICS_REPLY;
    m.metrics_reply = &rep;
    conn_send(c, &m);
    free(text);
}

static void conn_on_ping(struct conn *c, const Convd__Ping *p)
{
    Convd__ServerMessage m = CONVD__SERVER_MESSAGE__INIT;
    Convd__Pong pong = CONVD__PONG__INIT;
    pong.tag = p->tag;
    m.msg_case = CONVD__SERVER_MESSAGE__MSG_PONG;
    m.pong = &pong;
    conn_send(c, &m);
}

/* --- reading ------------------------------------------------------------------------------ */

/* Handles one datagram. The descriptors that came with it stay the caller's to close. */
static void conn_on_datagram(struct conn *c, const uint8_t *buf, size_t len, const int *fds,
                             size_t nfds)
{
    Convd__ClientMessage *msg = convd__client_message__unpack(NULL, len, buf);
    if (msg == NULL) {
        char fault[192];
        if (!pbscan_client_message(buf, len, fault, sizeof(fault)))
            snprintf(fault, sizeof(fault), "protobuf decoding failed");
        conn_protocol_error(c, CONVD_EPROTO,
                            "datagram of %zu bytes is not a valid convd.ClientMessage: %s", len,
                            fault);
        return;
    }
    /* What the client put in its ring before sending this datagram comes first, as it would
     * on the socket alone (an UnregisterRegion after requests that use the region). */
    while (c->has_ring && c->state == CONN_READY && conn_poll_ring(c) == CONN_RING_BUDGET)
        ;
    Convd__ClientMessage__MsgCase kind = msg->msg_case;
    bool fds_expected = kind == CONVD__CLIENT_MESSAGE__MSG_REGISTER_REGION ||
                        kind == CONVD__CLIENT_MESSAGE__MSG_ATTACH_RING;
    if (nfds > 0 && !fds_expected)
        log_debug("client %llu (%s): closing %zu unexpected descriptor(s) sent with %s",
                  (unsigned long long)c->serial, conn_label(c), nfds, conn_msg_name(kind));

    if (kind == CONVD__CLIENT_MESSAGE__MSG__NOT_SET) {
        conn_protocol_error(c, CONVD_EPROTO,
                            "ClientMessage carries no message (empty, or a kind this daemon "
                            "does not know)");
    } else if (c->state == CONN_AWAIT_HELLO && kind != CONVD__CLIENT_MESSAGE__MSG_HELLO) {
        if (c->refuse_status != 0) {
            conn_send_protocol_error(c, c->refuse_status, c->refuse_why);
            conn_shutdown(c, true, c->refuse_why);
        } else {
            conn_protocol_error(c, CONVD_EPROTO, "the first message must be Hello, got %s",
                                conn_msg_name(kind));
        }
    } else {
        switch (kind) {
        case CONVD__CLIENT_MESSAGE__MSG_HELLO:
            if (c->state == CONN_READY)
                conn_protocol_error(c, CONVD_EPROTO, "Hello was already received");
            else
                conn_on_hello(c, msg->hello);
            break;
        case CONVD__CLIENT_MESSAGE__MSG_REGISTER_REGION:
            conn_on_register(c, msg->register_region, fds, nfds);
            break;
        case CONVD__CLIENT_MESSAGE__MSG_UNREGISTER_REGION:
            conn_on_unregister(c, msg->unregister_region);
            break;
        case CONVD__CLIENT_MESSAGE__MSG_CONV:
            conn_on_conv(c, msg->conv, false);
            break;
        case CONVD__CLIENT_MESSAGE__MSG_ATTACH_RING:
            conn_on_attach_ring(c, msg->attach_ring, fds, nfds);
            break;
        case CONVD__CLIENT_MESSAGE__MSG_DOORBELL:
            /* The loop polls every ring on its next pass; the datagram only woke it. */
            break;
        case CONVD__CLIENT_MESSAGE__MSG_STATUS:
            conn_on_status(c, msg->status);
            break;
        case CONVD__CLIENT_MESSAGE__MSG_METRICS:
            conn_on_metrics(c, msg->metrics);
            break;
        case CONVD__CLIENT_MESSAGE__MSG_PING:
            conn_on_ping(c, msg->ping);
            break;
        default:
            conn_protocol_error(c, CONVD_EPROTO, "unknown message kind %d", (int)kind);
            break;
        }
    }
    convd__client_message__free_unpacked(msg, NULL);
}

static void conn_read_some(struct conn *c);

/* Requests read in one go are dispatched together, so that they can share batches. */
static void conn_read(struct conn *c)
{
    struct convd_daemon *d = c->d;
    bool held = daemon_hold_dispatch(d);
    conn_read_some(c);
    daemon_release_dispatch(d, held);
}

static void conn_read_some(struct conn *c)
{
    struct convd_daemon *d = c->d;
    for (int i = 0; i < CONN_READS_PER_WAKEUP && c->state != CONN_CLOSING && c->held == NULL; i++) {
        int fds[SOCK_MAX_FDS];
        size_t nfds = 0;
        ssize_t n = sock_recv(c->fd, d->rx, sizeof(d->rx), fds, &nfds);
        if (n == -EAGAIN)
            return;
        if (n == -EMSGSIZE) {
            conn_protocol_error(c, CONVD_ETOOBIG,
                                "datagram is larger than %u bytes or carries more than %d file "
                                "descriptors; it was discarded",
                                CONVD_MAX_MESSAGE_BYTES, SOCK_MAX_FDS);
            continue;
        }
        if (n == 0) {
            /* An empty datagram can still carry descriptors: they are never ours to keep. */
            sock_close_fds(fds, nfds);
            /* SOCK_SEQPACKET reads an empty datagram as 0 bytes, like the end of the stream;
             * only the hang-up flag tells them apart. */
            struct pollfd pfd = {.fd = c->fd, .events = POLLRDHUP};
            if (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
                conn_shutdown(c, false, "closed by the client");
                return;
            }
            conn_protocol_error(c, CONVD_EPROTO, "empty datagram: no message in it");
            continue;
        }
        if (n < 0) {
            char reason[96];
            snprintf(reason, sizeof(reason), "receive failed: %s", strerror((int)-n));
            conn_shutdown(c, false, reason);
            return;
        }
        daemon_note_activity(d);
        c->last_active_ns = convd_now_ns();
        conn_on_datagram(c, d->rx, (size_t)n, fds, nfds);
        sock_close_fds(fds, nfds);
    }
}

static void conn_on_poll(uv_poll_t *h, int status, int events)
{
    struct conn *c = h->data;
    if (status < 0) {
        /* libuv reports EPOLLERR as UV_EBADF; the socket's own error says what happened
         * (usually a reset: the client went away with replies unread). */
        int err = 0;
        socklen_t len = sizeof(err);
        char reason[96];
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err != 0)
            snprintf(reason, sizeof(reason), "connection error: %s", strerror(err));
        else
            snprintf(reason, sizeof(reason), "connection error: %s", uv_strerror(status));
        conn_shutdown(c, false, reason);
        return;
    }
    if ((events & UV_WRITABLE) && conn_flush(c) != 0)
        return;
    if (c->state != CONN_CLOSING && (events & (UV_READABLE | UV_DISCONNECT)))
        conn_read(c);
}

static void conn_on_timer(uv_timer_t *t)
{
    struct conn *c = t->data;
    if (c->state == CONN_AWAIT_HELLO) {
        char reason[96];
        snprintf(reason, sizeof(reason), "no Hello within %llu ms (hello_timeout_ms)",
                 (unsigned long long)c->d->cfg.hello_timeout_ms);
        conn_shutdown(c, false, reason);
    } else if (c->state == CONN_CLOSING) {
        log_debug("client %llu (%s): %llu bytes of replies were never read",
                  (unsigned long long)c->serial, conn_label(c), (unsigned long long)c->outq_bytes);
        conn_close_handles(c);
    }
}

/* --- lifetime ----------------------------------------------------------------------------- */

static void conn_maybe_free(struct conn *c)
{
    if (c->handles_open > 0 || !c->handles_closing || c->running > 0 ||
        !region_table_empty(&c->regions))
        return;
    struct convd_daemon *d = c->d;
    list_del(&c->link);
    idmap_free(&c->inflight);
    region_table_destroy(&c->regions);
    users_put(&d->users, c->user);
    free(c->gw);
    free(c);
    daemon_check_drained(d);
}

static void conn_on_handle_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    if (--c->handles_open > 0)
        return;
    if (c->fd >= 0) {
        doorbell_forget(&c->d->doorbells, c->fd);
        close(c->fd);
        c->fd = -1;
    }
    while (!list_empty(&c->outq)) {
        struct conn_out *o = list_entry(c->outq.next, struct conn_out, link);
        list_del(&o->link);
        free(o);
    }
    /* Replies a client never read can add up to megabytes of small blocks: hand them back to
     * the system rather than keep them in the heap (64 such clients once left 660 MB). */
    if (c->outq_bytes >= CONN_TRIM_BYTES)
        malloc_trim(0);
    c->outq_bytes = 0;
    conn_maybe_free(c);
}

static void conn_close_handles(struct conn *c)
{
    if (c->handles_closing)
        return;
    c->handles_closing = true;
    uv_close((uv_handle_t *)&c->poll, conn_on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, conn_on_handle_closed);
}

void conn_shutdown(struct conn *c, bool flush, const char *reason)
{
    struct convd_daemon *d = c->d;
    if (c->state == CONN_CLOSING) {
        if (!flush)
            conn_close_handles(c);
        return;
    }
    enum conn_state was = c->state;
    c->state = CONN_CLOSING;
    conn_detach_ring(c);
    struct conn_held *held = conn_unhold(c);
    if (held != NULL) {
        if (held->fd >= 0)
            close(held->fd);
        free(held);
    }
    if (c->counted) {
        d->conns.clients--;
        c->user->conns--;
        c->counted = false;
    } else {
        d->conns.refused--;
    }

    /* Queued requests will never run; running ones finish and keep their regions alive. */
    struct list_node cancelled;
    list_init(&cancelled);
    size_t n = sched_cancel_client(&d->sched, &c->sched, &cancelled);
    while (!list_empty(&cancelled)) {
        struct sched_item *it = list_entry(cancelled.next, struct sched_item, link);
        list_del(&it->link);
        struct dreq *r = req_from_item(it);
        metrics_request(&d->metrics, CONVD_ECANCELED, 0);
        conn_free_request(c, r);
    }
    /* Requests in its lane run once their words are stored: nobody will write them now. */
    struct list_node *pos;
    list_for_each(pos, &c->waiting)
    {
        struct dreq *r = list_entry(pos, struct dreq, wait_link);
        waits_release(&d->waits, &r->wait, CONVD_ECANCELED);
    }
    /* Gated ones too: their client is gone, and nobody waits on their done words. */
    while (!list_empty(&c->gated)) {
        struct dreq *r = list_entry(c->gated.next, struct dreq, gate_link);
        metrics_request(&d->metrics, CONVD_ECANCELED, 0);
        conn_free_request(c, r);
        n++;
    }
    region_table_release_all(&c->regions);

    if (was == CONN_READY || c->refuse_status == 0)
        log_info("client %llu (%s) disconnected: %s (%llu served, %llu failed, %zu cancelled, "
                 "%u still running)",
                 (unsigned long long)c->serial, conn_label(c), reason,
                 (unsigned long long)c->served, (unsigned long long)c->failed, n,
                 (unsigned)c->running);
    else
        log_info("client %llu refused: %s", (unsigned long long)c->serial, reason);

    if (flush && !list_empty(&c->outq) && !c->handles_closing) {
        conn_set_events(c, UV_WRITABLE);
        uv_timer_start(&c->timer, conn_on_timer, CONN_LINGER_MS, 0);
    } else {
        conn_close_handles(c);
    }
    if (n > 0)
        daemon_dispatch(d); /* the queue changed: a waiting batch may now be complete */
    daemon_check_drained(d);
}

static void conn_peer_ids(struct conn *c, gid_t *gids, size_t *ret_n)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);
    size_t n = 0;
    if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
        c->pid = cred.pid;
        c->uid = cred.uid;
        c->gid = cred.gid;
    } else {
        /* no credentials: treat as nobody so an allow-list refuses it */
        c->pid = 0;
        c->uid = (uid_t)-1;
        c->gid = (gid_t)-1;
    }
    gids[n++] = c->gid;
#ifdef SO_PEERGROUPS
    gid_t extra[CONN_MAX_GIDS - 1];
    len = sizeof(extra);
    if (getsockopt(c->fd, SOL_SOCKET, SO_PEERGROUPS, extra, &len) == 0)
        for (size_t i = 0; i < len / sizeof(gid_t) && n < CONN_MAX_GIDS; i++)
            gids[n++] = extra[i];
#endif
    *ret_n = n;
}

/* A full daemon makes room for a newcomer by closing the client that has been idle longest,
 * nothing in flight, for at least idle_timeout_ms: connections that only hold a slot must not
 * lock everyone else out. Returns true when one was closed. */
static bool conn_evict_idle(struct convd_daemon *d)
{
    if (d->cfg.idle_timeout_ms == 0)
        return false;
    const uint64_t now = convd_now_ns(), idle_ns = d->cfg.idle_timeout_ms * 1000000u;
    struct conn *oldest = NULL;
    struct list_node *pos;
    list_for_each(pos, &d->conns.all)
    {
        struct conn *c = list_entry(pos, struct conn, link);
        if (!c->counted || c->state == CONN_CLOSING || c->inflight.count > 0 ||
            now - c->last_active_ns < idle_ns)
            continue;
        if (oldest == NULL || c->last_active_ns < oldest->last_active_ns)
            oldest = c;
    }
    if (oldest == NULL)
        return false;
    char why[160];
    snprintf(why, sizeof(why),
             "closed after %llu ms without a request, to admit a new client to a full daemon "
             "(idle_timeout_ms)",
             (unsigned long long)((now - oldest->last_active_ns) / 1000000u));
    conn_send_protocol_error(oldest, CONVD_ETIMEDOUT, why);
    conn_shutdown(oldest, true, why);
    return true;
}

void conn_accept(struct convd_daemon *d, int fd)
{
    /* Refused peers are held only until they have been told why; past this many, new ones are
     * closed without a word so that a flood cannot pin descriptors. */
    if (d->draining) {
        close(fd);
        return;
    }
    struct conn *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        log_err("out of memory accepting a connection");
        close(fd);
        return;
    }
    c->d = d;
    c->fd = fd;
    c->serial = ++d->conns.next_serial;
    c->state = CONN_AWAIT_HELLO;
    list_init(&c->outq);
    list_init(&c->gated);
    list_init(&c->waiting);
    c->lane = -1;
    idmap_init(&c->inflight);
    sched_client_init(&c->sched);
    region_table_init(&c->regions, &d->backend, &d->region_limits, &d->region_stats);

    gid_t gids[CONN_MAX_GIDS];
    size_t n_gids;
    conn_peer_ids(c, gids, &n_gids);
    c->user = users_get(&d->users, c->uid);
    c->last_active_ns = convd_now_ns();
    if (c->user == NULL) {
        log_err("out of memory accepting a connection");
        region_table_destroy(&c->regions);
        free(c);
        close(fd);
        return;
    }
    region_table_set_account(&c->regions, &c->user->regions);
    region_table_set_releases(&c->regions, &d->releases);
    if (!config_peer_allowed(&d->cfg, c->uid, gids, n_gids)) {
        c->refuse_status = CONVD_EPERM;
        snprintf(c->refuse_why, sizeof(c->refuse_why),
                 "uid %u (gid %u) is not allowed to use convd (allow_uids / allow_gids)",
                 (unsigned)c->uid, (unsigned)c->gid);
    } else if (c->user->conns >= d->cfg.max_clients_per_user) {
        c->refuse_status = CONVD_ELIMIT;
        snprintf(c->refuse_why, sizeof(c->refuse_why),
                 "uid %u already holds %u connections, its limit (max_clients_per_user)",
                 (unsigned)c->uid, (unsigned)c->user->conns);
    } else if (d->conns.clients >= d->cfg.max_clients && !conn_evict_idle(d)) {
        c->refuse_status = CONVD_ELIMIT;
        snprintf(c->refuse_why, sizeof(c->refuse_why),
                 "the daemon already serves %u clients, the limit (max_clients)",
                 (unsigned)d->conns.clients);
    }
    if (c->refuse_status != 0 && d->conns.refused >= d->cfg.max_clients) {
        log_warn("client %llu (pid %d, uid %u) dropped: %s", (unsigned long long)c->serial,
                 (int)c->pid, (unsigned)c->uid, c->refuse_why);
        metrics_connection(&d->metrics, false);
        region_table_destroy(&c->regions);
        users_put(&d->users, c->user);
        free(c);
        close(fd);
        return;
    }

    if (uv_poll_init(&d->loop, &c->poll, fd) != 0) {
        log_err("cannot watch a new connection");
        region_table_destroy(&c->regions);
        users_put(&d->users, c->user);
        free(c);
        close(fd);
        return;
    }
    uv_timer_init(&d->loop, &c->timer);
    c->poll.data = c;
    c->timer.data = c;
    c->handles_open = 2;
    list_add_tail(&d->conns.all, &c->link);
    if (c->refuse_status != 0) {
        d->conns.refused++;
        metrics_connection(&d->metrics, false);
        log_info("client %llu (pid %d, uid %u) will be refused: %s", (unsigned long long)c->serial,
                 (int)c->pid, (unsigned)c->uid, c->refuse_why);
    } else {
        c->counted = true;
        d->conns.clients++;
        c->user->conns++;
        metrics_connection(&d->metrics, true);
        log_info("client %llu connected: pid %d, uid %u, gid %u", (unsigned long long)c->serial,
                 (int)c->pid, (unsigned)c->uid, (unsigned)c->gid);
    }
    conn_set_events(c, UV_READABLE | UV_DISCONNECT);
    uv_timer_start(&c->timer, conn_on_timer, d->cfg.hello_timeout_ms, 0);
}

/* --- the connections as a whole ------------------------------------------------------------ */

void conn_registry_init(struct conn_registry *r)
{
    list_init(&r->all);
    list_init(&r->rings);
    list_init(&r->notify);
    list_init(&r->gates);
    list_init(&r->held);
    r->nheld = 0;
    r->gated = 0;
    r->clients = 0;
    r->refused = 0;
    r->next_serial = 0;
}

uint32_t conn_clients(const struct convd_daemon *d)
{
    return d->conns.clients;
}

bool conn_have_rings(const struct convd_daemon *d)
{
    return !list_empty(&d->conns.rings);
}

void conn_shutdown_all(struct convd_daemon *d, bool flush, const char *reason)
{
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &d->conns.all)
    {
        conn_shutdown(list_entry(pos, struct conn, link), flush, reason);
    }
}

unsigned conn_poll_rings(struct convd_daemon *d)
{
    unsigned work = 0;
    bool held = daemon_hold_dispatch(d);
    struct list_node *pos, *tmp;
    list_for_each_safe(pos, tmp, &d->conns.rings)
    {
        work += conn_poll_ring(list_entry(pos, struct conn, ring_link));
    }
    daemon_release_dispatch(d, held);
    return work;
}

bool conn_rings_sleep(struct convd_daemon *d, bool sleeping)
{
    struct list_node *pos;
    list_for_each(pos, &d->conns.rings)
    {
        ring_set_need_wakeup(&list_entry(pos, struct conn, ring_link)->ring, sleeping);
    }
    if (!sleeping)
        return false;
    ring_fence();
    list_for_each(pos, &d->conns.rings)
    {
        const struct conn *c = list_entry(pos, struct conn, ring_link);
        if (c->held == NULL && ring_has_submissions(&c->ring))
            return true; /* a held connection's ring waits for conn_run_held */
    }
    return false;
}

void conn_ring_doorbells(struct convd_daemon *d)
{
    if (list_empty(&d->conns.notify))
        return;
    ring_fence();
    int fds[64];
    size_t n = 0;
    while (!list_empty(&d->conns.notify)) {
        struct conn *c = list_entry(d->conns.notify.next, struct conn, notify_link);
        if (conn_needs_doorbell(c))
            fds[n++] = c->fd;
        if (n == sizeof(fds) / sizeof(fds[0])) {
            doorbell_ring(&d->doorbells, fds, n);
            n = 0;
        }
    }
    doorbell_ring(&d->doorbells, fds, n);
}

void conn_request_started(struct dreq *r, uint64_t now_ns)
{
    r->running = true;
    r->start_ns = now_ns;
    r->conn->running++;
    r->conn->d->running++;
    r->job.status = 0;
    r->job.error[0] = '\0';
    r->job.exec_ns = 0;
    r->job.device_ns = 0;
}
