/*
 * The daemon: start-up, the dispatch loop between the queue and the workers, deadlines, the drain
 * on SIGTERM, and the systemd notifications.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "why.h"
#include "clock.h"
#include "connection.h"
#include "convd/convd.h"
#include "daemon.h"
#include "log.h"
#include "request.h"
#include "reload.h"
#include "ring.h"
#include "sdnotify.h"

#define STATUS_INTERVAL_MS 5000
/* Spreading a queue over free slots stops at batches this small: below it a launch costs more
 * host time per request than it saves in waiting (convd-bench-launch: 4.75 us per call at one
 * problem, 4.4 at four, 1.1 us per problem). */
#define DMN_MIN_SPREAD 4

/* --- backend ------------------------------------------------------------------------------ */

static int dmn_try_backend(struct convd_daemon *d, const struct convd_backend_ops *ops, char *why,
                           size_t why_len)
{
    struct convd_backend_config bc = {
        .threads = d->cfg.threads,
        .device = d->cfg.device,
        .max_batch = d->cfg.max_batch,
        .null_launch_ns = d->cfg.null_launch_us * 1000u,
        .null_launch_item_ns = d->cfg.null_launch_item_us * 1000u,
        .null_exec_ns = d->cfg.null_exec_us * 1000u,
        .completion_flags = d->cfg.completion_flags != 0,
        .device_timing = d->cfg.batch_timing != 0,
        .stream_priority = d->cfg.stream_priority != 0,
        .device_gates = d->cfg.device_gates != 0,
        .device_waits = d->cfg.device_waits != 0,
    };
    void *ctx = NULL;
    struct convd_backend_info info;
    memset(&info, 0, sizeof(info));
    int rc = ops->init(&bc, &ctx, &info, why, why_len);
    if (rc != 0)
        return rc;
    info.name[sizeof(info.name) - 1] = '\0';
    info.device[sizeof(info.device) - 1] = '\0';
    if (info.max_workers == 0)
        info.max_workers = 1;
    d->backend.ops = ops;
    d->backend.ctx = ctx;
    d->backend.info = info;
    d->backend_open = true;
    return 0;
}

/* auto: the GPU when this build has one and a device answers, else the CPU. */
static int dmn_open_backend(struct convd_daemon *d, char *why, size_t why_len)
{
    char be_why[256] = "";
    int rc;
    if (d->cfg.backend == CONFIG_BACKEND_NULL) {
        rc = dmn_try_backend(d, &convd_null_backend_ops, be_why, sizeof(be_why));
        if (rc != 0)
            return why_fail(why, why_len, rc, "the null backend did not start: %s", be_why);
        log_warn("backend null: requests complete without computing anything; outputs are "
                 "never written (for measuring the serving path only)");
        return 0;
    }
    if (d->cfg.backend != CONFIG_BACKEND_CPU) {
#ifdef CONVD_HAVE_GPU
        rc = dmn_try_backend(d, &convd_gpu_backend_ops, be_why, sizeof(be_why));
        if (rc == 0)
            return 0;
        if (d->cfg.backend == CONFIG_BACKEND_GPU)
            return why_fail(why, why_len, rc, "the GPU backend did not start: %s",
                            be_why[0] ? be_why : convd_strerror(rc));
        log_notice("no usable GPU (%s); serving from the CPU backend",
                   be_why[0] ? be_why : convd_strerror(rc));
#else
        if (d->cfg.backend == CONFIG_BACKEND_GPU)
            return why_fail(why, why_len, CONVD_EUNSUPPORTED,
                            "this convd was built without GPU support (CONVD_GPU=off); use "
                            "--backend cpu or auto");
#endif
    }
    rc = dmn_try_backend(d, &convd_cpu_backend_ops, be_why, sizeof(be_why));
    if (rc != 0)
        return why_fail(why, why_len, rc, "the CPU backend did not start: %s",
                        be_why[0] ? be_why : convd_strerror(rc));
    return 0;
}

/* --- deadlines, dispatch and completions -------------------------------------------------- */

/* Fails every queued request whose deadline has passed. */
static void dmn_expire(struct convd_daemon *d, uint64_t now)
{
    struct list_node expired;
    list_init(&expired);
    if (sched_expire(&d->sched, now, &expired) == 0)
        return;
    while (!list_empty(&expired)) {
        struct sched_item *it = list_entry(expired.next, struct sched_item, link);
        list_del(&it->link);
        struct dreq *r = req_from_item(it);
        uint64_t waited_us = (now - r->recv_ns) / 1000;
        char msg[160];
        snprintf(msg, sizeof(msg),
                 "request %llu waited %llu us in the queue, past its timeout of %llu us; it was "
                 "not run",
                 (unsigned long long)r->id, (unsigned long long)waited_us,
                 (unsigned long long)r->timeout_us);
        conn_request_done(r, CONVD_ETIMEDOUT, msg, waited_us, 0, 0);
    }
}

static void dmn_on_deadline(uv_timer_t *t);

void daemon_note_deadline(struct convd_daemon *d, uint64_t deadline_ns)
{
    if (d->finishing || deadline_ns == 0)
        return;
    if (d->deadline_armed_ns != 0 && d->deadline_armed_ns <= deadline_ns)
        return;
    uint64_t now = convd_now_ns();
    /* libuv timers count whole milliseconds: round up so the timer never fires early; an early
     * wake-up would find nothing expired and re-arm anyway */
    uint64_t ms = deadline_ns > now ? (deadline_ns - now + 999999) / 1000000 : 0;
    d->deadline_armed_ns = deadline_ns;
    uv_timer_start(&d->deadline_timer, dmn_on_deadline, ms, 0);
}

static void dmn_on_deadline(uv_timer_t *t)
{
    struct convd_daemon *d = t->data;
    d->deadline_armed_ns = 0;
    dmn_expire(d, convd_now_ns());
    uint64_t next = sched_next_deadline(&d->sched);
    if (next != 0) {
        if (next <= convd_now_ns())
            next = convd_now_ns() + 1000000;
        daemon_note_deadline(d, next);
    }
    daemon_check_drained(d);
}

static void dmn_arm_delay(struct convd_daemon *d, uint64_t wait_ns)
{
    if (d->delay_armed)
        return;
    struct itimerspec its = {0};
    its.it_value.tv_sec = (time_t)(wait_ns / 1000000000u);
    its.it_value.tv_nsec = (long)(wait_ns % 1000000000u);
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
        its.it_value.tv_nsec = 1;
    if (timerfd_settime(d->delay_fd, 0, &its, NULL) == 0)
        d->delay_armed = true;
}

static void dmn_on_delay(uv_poll_t *h, int status, int events)
{
    struct convd_daemon *d = h->data;
    uint64_t expirations;
    (void)status;
    (void)events;
    while (read(d->delay_fd, &expirations, sizeof(expirations)) > 0)
        ;
    d->delay_armed = false;
    daemon_dispatch(d);
}

/* launch_ahead: with the launch thread, the next batch is formed only when fewer than
 * launch_ahead batches wait for or are in a launch, and takes all that is queued (up to
 * max_batch): requests that arrive during a launch ride in the next one together, instead of
 * each free slot getting a small batch that queues behind the launch thread anyway. */
static bool dmn_paced(const struct convd_daemon *d)
{
    return d->pool.launcher && d->cfg.launch_ahead > 0;
}

static bool dmn_launch_room(const struct convd_daemon *d)
{
    return !dmn_paced(d) || pool_unlaunched(&d->pool) < d->cfg.launch_ahead;
}

/* How many requests the next batch may take. With slots free, what is queued is spread over
 * them rather than put in one batch: batches in flight side by side finish at different times,
 * so their clients come back at different times and the next batches keep the device busy,
 * where one big batch would make every client wait for all of them (16 clients at depth 1 went
 * in lock-step, one batch of 15 a round). */
static size_t dmn_batch_cap(const struct convd_daemon *d)
{
    size_t cap = d->cfg.max_batch;
    if (!d->pool.slots || dmn_paced(d))
        return cap;
    size_t free_slots = d->pool.n - d->pool.busy;
    size_t queued = sched_depth(&d->sched);
    size_t share = free_slots > 0 ? (queued + free_slots - 1) / free_slots : queued;
    if (share < DMN_MIN_SPREAD)
        share = DMN_MIN_SPREAD;
    return share < cap ? share : cap;
}

bool daemon_lanes_busy(const struct convd_daemon *d)
{
    return d->pool.lane_busy > 0;
}

bool daemon_lanes_paused(const struct convd_daemon *d)
{
    return d->releases.count > 0 || conn_held(d) > 0;
}

static bool dmn_releases_wait(void *arg)
{
    return daemon_lanes_busy(arg);
}

/* The lanes have emptied: what waited for that runs now, releases first (a registration held
 * meanwhile may name memory one of them still maps). */
static void dmn_run_deferred(struct convd_daemon *d)
{
    if (daemon_lanes_busy(d))
        return;
    if (d->releases.count > 0)
        region_releases_run(&d->releases);
    conn_run_held(d);
}

void daemon_dispatch(struct convd_daemon *d)
{
    if (d->dispatching || d->finishing || !d->pool_started)
        return;
    d->dispatching = true;
    conn_launch_waits(d);
    uint64_t now = convd_now_ns();
    dmn_expire(d, now);
    while (sched_depth(&d->sched) > 0) {
        int w = pool_idle_worker(&d->pool);
        if (w < 0 || !dmn_launch_room(d))
            break;
        if (d->cfg.max_queue_delay_us > 0 && !d->draining) {
            /* An idle worker may wait a little for the head's batch to fill. */
            const struct sched_item *head;
            size_t avail = sched_peek(&d->sched, &head);
            uint64_t due = head->enqueue_ns + d->cfg.max_queue_delay_us * 1000u;
            if (avail < d->cfg.max_batch && now < due) {
                dmn_arm_delay(d, due - now);
                break;
            }
        }
        size_t cap = dmn_batch_cap(d);
        size_t n = sched_take(&d->sched, d->take, cap);
        struct batch *b = batch_new(n);
        if (b == NULL) {
            for (size_t i = 0; i < n; i++)
                conn_request_done(req_from_item(d->take[i]), CONVD_ENOMEM,
                                  "out of memory starting the batch", 0, 0, 0);
            continue;
        }
        for (size_t i = 0; i < n; i++) {
            struct dreq *r = req_from_item(d->take[i]);
            conn_request_started(r, now);
            b->jobs[i] = &r->job;
        }
        pool_submit(&d->pool, (unsigned)w, b);
    }
    d->dispatching = false;
}

bool daemon_hold_dispatch(struct convd_daemon *d)
{
    bool was_held = d->defer_dispatch;
    d->defer_dispatch = true;
    return was_held;
}

void daemon_release_dispatch(struct convd_daemon *d, bool was_held)
{
    if (was_held)
        return;
    d->defer_dispatch = false;
    if (d->dispatch_pending) {
        d->dispatch_pending = false;
        daemon_dispatch(d);
    }
}

void daemon_request_queued(struct convd_daemon *d)
{
    if (d->defer_dispatch)
        d->dispatch_pending = true;
    else
        daemon_dispatch(d);
}

void daemon_note_activity(struct convd_daemon *d)
{
    d->activity++;
}

void daemon_request_finished(struct convd_daemon *d)
{
    d->running--;
}

static void dmn_begin_drain(struct convd_daemon *d, const char *cause);

static void dmn_on_batch_done(struct worker_pool *p, struct batch *b)
{
    struct convd_daemon *d = p->data;
    uint64_t exec_ns = b->end_ns - b->start_ns;
    d->metrics.batches++;
    metrics_hist_observe(&d->metrics.exec_seconds, (double)exec_ns / 1e9);
    metrics_hist_observe(&d->metrics.batch_size, (double)b->n);
    if (p->slots) {
        metrics_hist_observe(&d->metrics.launch_seconds, (double)b->launch_ns / 1e9);
        if (p->launcher && b->launch_begin_ns >= b->start_ns)
            metrics_hist_observe(&d->metrics.launch_wait_seconds,
                                 (double)(b->launch_begin_ns - b->start_ns) / 1e9);
        metrics_hist_observe(&d->metrics.seen_lag_seconds, (double)b->seen_lag_ns / 1e9);
    }
    /* batch_timing: the jobs of a batch share its device time; 0 where nothing was timed. */
    if (b->n > 0 && b->jobs[0]->device_ns > 0)
        metrics_hist_observe(&d->metrics.device_seconds, (double)b->jobs[0]->device_ns / 1e9);
    if (b->rc != 0)
        log_err("%s backend: a batch of %zu failed as a whole: %s", d->backend.info.name, b->n,
                convd_strerror(b->rc));
    for (size_t i = 0; i < b->n; i++) {
        struct convd_job *job = b->jobs[i];
        struct dreq *r = job->owner;
        uint64_t queue_ns = b->start_ns > r->recv_ns ? b->start_ns - r->recv_ns : 0;
        metrics_hist_observe(&d->metrics.queue_seconds, (double)queue_ns / 1e9);
        int status = job->status;
        if (status == 0 && b->rc != 0)
            status = b->rc; /* a broken backend must not report success */
        job->error[sizeof(job->error) - 1] = '\0';
        conn_request_done(r, status, job->error[0] ? job->error : convd_strerror(status),
                          queue_ns / 1000, exec_ns / 1000, (uint32_t)b->n);
    }
    bool lost = b->rc == CONVD_EDEVICE;
    free(b);
    d->activity++;
    uint64_t t0 = convd_now_ns();
    conn_ring_doorbells(d);
    uint64_t t1 = convd_now_ns();
    d->metrics.loop_doorbell_ns += t1 - t0;
    if (lost && !d->device_lost) {
        /* The backend says its device is gone for good (a lost context): every later request
         * would fail the same way. Drain, failing what is queued with the backend's sentence,
         * and exit non-zero so that the service manager starts a fresh daemon. */
        d->device_lost = true;
        d->exit_code = 1;
        log_err("%s backend: the device is unusable; stopping so that convd can be restarted",
                d->backend.info.name);
        dmn_begin_drain(d, "device lost");
    }
    dmn_run_deferred(d);
    daemon_dispatch(d);
    d->metrics.loop_dispatch_ns += convd_now_ns() - t1;
    daemon_check_drained(d);
}

/* --- drain and shutdown ------------------------------------------------------------------- */

static void dmn_close_handles(struct convd_daemon *d)
{
    if (!d->handles_open)
        return;
    d->handles_open = false;
    uv_close((uv_handle_t *)&d->sig_term, NULL);
    uv_close((uv_handle_t *)&d->sig_int, NULL);
    uv_close((uv_handle_t *)&d->sig_hup, NULL);
    uv_close((uv_handle_t *)&d->watchdog_timer, NULL);
    uv_close((uv_handle_t *)&d->status_timer, NULL);
    uv_close((uv_handle_t *)&d->drain_timer, NULL);
    uv_close((uv_handle_t *)&d->deadline_timer, NULL);
    uv_close((uv_handle_t *)&d->inflight_timer, NULL);
    uv_close((uv_handle_t *)&d->trim_timer, NULL);
    uv_close((uv_handle_t *)&d->stop_async, NULL);
    mfile_close(&d->mfile);
    if (d->delay_poll_open) {
        uv_close((uv_handle_t *)&d->delay_poll, NULL);
        d->delay_poll_open = false;
    }
}

/* Everything queued is done: close the connections (flushing their last replies), the workers and
 * every handle, so that uv_run returns. */
static void dmn_finish(struct convd_daemon *d)
{
    d->finishing = true;
    log_notice("drained: closing %u connection(s)", (unsigned)conn_clients(d));
    conn_shutdown_all(d, true, "the daemon is shutting down");
    if (d->listener_open) {
        listener_close(&d->listener, NULL);
        d->listener_open = false;
    }
    if (d->pool_started) {
        pool_stop(&d->pool);
        d->pool_started = false;
    }
    region_releases_run(&d->releases);
    dmn_close_handles(d);
}

static bool dmn_drained(const struct convd_daemon *d)
{
    return d->draining && !d->finishing && sched_depth(&d->sched) == 0 && d->running == 0 &&
           conn_gated(d) == 0;
}

static void dmn_on_finish(uv_timer_t *t)
{
    struct convd_daemon *d = t->data;
    if (dmn_drained(d))
        dmn_finish(d);
}

void daemon_check_drained(struct convd_daemon *d)
{
    /* Called from deep inside completion and close callbacks: the teardown (which joins the
     * workers and closes every connection) runs from a fresh callback instead, on the next loop
     * iteration. The drain timer has nothing left to time once the queue is empty. */
    if (dmn_drained(d))
        uv_timer_start(&d->drain_timer, dmn_on_finish, 0, 0);
}

static void dmn_drain_expire(struct convd_daemon *d)
{
    d->drain_expired = true;
    struct list_node all;
    list_init(&all);
    size_t n = sched_cancel_all(&d->sched, &all) + conn_gated(d);
    if (n > 0)
        log_notice("drain timeout: failing %zu queued request(s) with ESHUTDOWN", n);
    conn_fail_gated(d, CONVD_ESHUTDOWN,
                    "the daemon is shutting down and its drain timeout passed before the "
                    "request's gate opened");
    conn_release_waits(d, CONVD_ESHUTDOWN);
    uint64_t now = convd_now_ns();
    while (!list_empty(&all)) {
        struct sched_item *it = list_entry(all.next, struct sched_item, link);
        list_del(&it->link);
        struct dreq *r = req_from_item(it);
        conn_request_done(r, CONVD_ESHUTDOWN,
                          "the daemon is shutting down and its drain timeout passed before the "
                          "request ran",
                          (now - r->recv_ns) / 1000, 0, 0);
    }
    daemon_check_drained(d);
}

static void dmn_on_drain_timeout(uv_timer_t *t)
{
    dmn_drain_expire(t->data);
}

static void dmn_begin_drain(struct convd_daemon *d, const char *cause)
{
    if (d->finishing)
        return;
    if (d->draining) {
        log_notice("%s again: failing queued work now", cause);
        dmn_drain_expire(d);
        return;
    }
    d->draining = true;
    log_notice("%s: draining (%u queued, %u running), no longer accepting connections", cause,
               (unsigned)sched_depth(&d->sched), (unsigned)d->running);
    sdn_notifyf("STOPPING=1\nSTATUS=draining: %u queued, %u running",
                (unsigned)sched_depth(&d->sched), (unsigned)d->running);
    if (d->listener_open) {
        listener_close(&d->listener, NULL);
        d->listener_open = false;
    }
    if (d->cfg.drain_timeout_ms == 0)
        dmn_drain_expire(d);
    else
        uv_timer_start(&d->drain_timer, dmn_on_drain_timeout, d->cfg.drain_timeout_ms, 0);
    /* the delay must not hold back a drain */
    daemon_dispatch(d);
    daemon_check_drained(d);
}

static void dmn_on_signal(uv_signal_t *h, int signum)
{
    struct convd_daemon *d = h->data;
    if (signum == SIGHUP) {
        daemon_reload_signal(d);
        return;
    }
    dmn_begin_drain(d, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

static void dmn_on_stop(uv_async_t *h)
{
    dmn_begin_drain(h->data, "stop requested");
}

void daemon_set_args(struct convd_daemon *d, int argc, char *const *argv)
{
    d->argc = argc;
    d->argv = argv;
}

void daemon_request_stop(struct convd_daemon *d)
{
    uv_async_send(&d->stop_async);
}

/* --- systemd ------------------------------------------------------------------------------ */

static void dmn_on_watchdog(uv_timer_t *t)
{
    (void)t;
    sdn_notify("WATCHDOG=1");
}

static void dmn_on_status_timer(uv_timer_t *t)
{
    struct convd_daemon *d = t->data;
    char line[256];
    snprintf(line, sizeof(line),
             "STATUS=%s backend on %s: %u client(s), %u queued, %u running, %llu served",
             d->backend.info.name, d->listener.path, (unsigned)conn_clients(d),
             (unsigned)sched_depth(&d->sched), (unsigned)d->running,
             (unsigned long long)metrics_served(&d->metrics));
    if (strcmp(line, d->last_status) != 0 && !d->draining) {
        sdn_notify(line);
        snprintf(d->last_status, sizeof(d->last_status), "%s", line);
    }
}

/* --- status and metrics ------------------------------------------------------------------- */

void daemon_fill_status(struct convd_daemon *d, Convd__StatusReply *st)
{
    st->server_version = (char *)CONVD_VERSION_STRING;
    st->backend = d->backend.info.name;
    st->device = d->backend.info.device;
    st->clients = conn_clients(d);
    st->queue_depth = sched_depth(&d->sched);
    st->inflight = sched_depth(&d->sched) + d->running + conn_gated(d);
    st->requests_served = metrics_served(&d->metrics);
    st->requests_failed = metrics_failed(&d->metrics);
    st->batches = d->metrics.batches;
    st->uptime_ms = (convd_now_ns() - d->start_ns) / 1000000u;
    st->protocol_version = CONVD_PROTOCOL_VERSION;
}

int daemon_render_metrics(struct convd_daemon *d, const char *labels, char *buf, size_t cap)
{
    uint64_t wakes = 0;
    const uint64_t rung = doorbell_count(&d->doorbells, &wakes);
    struct met_gauges g = {
        .clients = conn_clients(d),
        .users = d->users.count,
        .queue_depth = sched_depth(&d->sched),
        .inflight = sched_depth(&d->sched) + d->running + conn_gated(d),
        .running = d->running,
        .gated = conn_gated(d),
        .waiting = conn_waiting(d),
        .regions = d->region_stats.regions,
        .mapped_bytes = d->region_stats.mapped_bytes,
        .host_bytes = d->region_stats.host_bytes,
        .max_pinned_bytes = d->region_limits.max_pinned_bytes,
        .workers = d->pool.n,
        .workers_busy = d->pool.busy,
        .doorbells = rung,
        .doorbell_wakes = wakes,
        .draining = d->draining,
        .loop_cpu_s = -1,
        .query_ns = d->pool.query_ns,
        .launch_peak = __atomic_load_n(&d->pool.launch_peak, __ATOMIC_RELAXED),
        .inline_launches = d->pool.inline_launches,
        .launcher_wakeups = d->pool.launcher_wakeups,
    };
    /* Metrics are rendered on the loop thread: its own rusage is the loop's. */
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) == 0)
        g.loop_cpu_s = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
    be_stats(&d->backend, &g.device);
    return metrics_render(&d->metrics, &g, d->backend.info.name, d->backend.info.device, labels,
                          convd_now_ns(), buf, cap);
}

static int dmn_render_file(void *arg, char *buf, size_t cap)
{
    struct convd_daemon *d = arg;
    return daemon_render_metrics(d, d->mfile_labels, buf, cap);
}

#define DMN_TRIM_MS 5000

/* Memory a big request made the backend grow is given back once a tick passes with no batch
 * run and nothing in flight (a lane's batch counts: freeing device memory waits for the device,
 * and so for the words its lanes wait on). */
static void dmn_on_trim_timer(uv_timer_t *t)
{
    struct convd_daemon *d = t->data;
    if (d->pool_started && d->pool.busy == 0 && d->pool.lane_busy == 0 &&
        d->metrics.batches == d->batches_at_trim)
        be_trim(&d->backend);
    d->batches_at_trim = d->metrics.batches;
}

/* --- life cycle --------------------------------------------------------------------------- */

static void dmn_on_accept(struct listener *l, int fd)
{
    conn_accept(l->data, fd);
}

static int dmn_init_handles(struct convd_daemon *d, char *why, size_t why_len)
{
    uv_loop_t *loop = &d->loop;
    uv_signal_init(loop, &d->sig_term);
    uv_signal_init(loop, &d->sig_int);
    uv_signal_init(loop, &d->sig_hup);
    uv_timer_init(loop, &d->watchdog_timer);
    uv_timer_init(loop, &d->status_timer);
    uv_timer_init(loop, &d->drain_timer);
    uv_timer_init(loop, &d->deadline_timer);
    uv_timer_init(loop, &d->inflight_timer);
    uv_timer_init(loop, &d->trim_timer);
    if (uv_async_init(loop, &d->stop_async, dmn_on_stop) != 0) {
        /* nothing above can fail, but it must still be closed */
        uv_handle_t *h[] = {(uv_handle_t *)&d->sig_term,       (uv_handle_t *)&d->sig_int,
                            (uv_handle_t *)&d->sig_hup,        (uv_handle_t *)&d->watchdog_timer,
                            (uv_handle_t *)&d->status_timer,   (uv_handle_t *)&d->drain_timer,
                            (uv_handle_t *)&d->deadline_timer, (uv_handle_t *)&d->inflight_timer,
                            (uv_handle_t *)&d->trim_timer};
        for (size_t i = 0; i < sizeof(h) / sizeof(h[0]); i++)
            uv_close(h[i], NULL);
        return why_fail(why, why_len, CONVD_EINTERNAL, "cannot set up the event loop");
    }
    d->handles_open = true;
    uv_handle_t *all[] = {(uv_handle_t *)&d->stop_async,     (uv_handle_t *)&d->sig_term,
                          (uv_handle_t *)&d->sig_int,        (uv_handle_t *)&d->sig_hup,
                          (uv_handle_t *)&d->watchdog_timer, (uv_handle_t *)&d->status_timer,
                          (uv_handle_t *)&d->drain_timer,    (uv_handle_t *)&d->deadline_timer,
                          (uv_handle_t *)&d->inflight_timer, (uv_handle_t *)&d->trim_timer};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        all[i]->data = d;
    d->delay_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (d->delay_fd < 0)
        return why_fail(why, why_len, CONVD_EINTERNAL, "timerfd_create: %s", strerror(errno));
    if (uv_poll_init(loop, &d->delay_poll, d->delay_fd) != 0)
        return why_fail(why, why_len, CONVD_EINTERNAL, "cannot watch the delay timer");
    d->delay_poll_open = true;
    d->delay_poll.data = d;
    uv_poll_start(&d->delay_poll, UV_READABLE, dmn_on_delay);
    uv_timer_start(&d->trim_timer, dmn_on_trim_timer, DMN_TRIM_MS, DMN_TRIM_MS);
    uv_signal_start(&d->sig_term, dmn_on_signal, SIGTERM);
    uv_signal_start(&d->sig_int, dmn_on_signal, SIGINT);
    uv_signal_start(&d->sig_hup, dmn_on_signal, SIGHUP);
    mfile_init(&d->mfile, loop, dmn_render_file, d);
    char esc[2 * CONFIG_PATH_BYTES];
    snprintf(d->mfile_labels, sizeof(d->mfile_labels), "socket=\"%s\"",
             metrics_label_escape(d->listener.path, esc, sizeof(esc)));
    mfile_configure(&d->mfile, d->cfg.metrics_textfile, d->cfg.metrics_textfile_interval_ms);

    d->watchdog_usec = sdn_watchdog_usec();
    if (d->watchdog_usec > 0) {
        uint64_t ms = d->watchdog_usec / 2000u;
        if (ms == 0)
            ms = 1;
        uv_timer_start(&d->watchdog_timer, dmn_on_watchdog, ms, ms);
        log_info("systemd watchdog: WATCHDOG=1 every %llu ms", (unsigned long long)ms);
    }
    const char *notify = getenv("NOTIFY_SOCKET");
    if (notify != NULL && notify[0] != '\0')
        uv_timer_start(&d->status_timer, dmn_on_status_timer, STATUS_INTERVAL_MS,
                       STATUS_INTERVAL_MS);
    return 0;
}

void daemon_apply_region_limits(struct convd_daemon *d)
{
    struct region_limits *l = &d->region_limits;
    l->max_regions = d->cfg.max_regions;
    l->max_mapped_bytes = d->cfg.max_mapped_bytes;
    l->max_regions_per_user = d->cfg.max_regions_per_user;
    l->max_mapped_bytes_per_user = d->cfg.max_mapped_bytes_per_user;
    l->max_pinned_bytes = d->cfg.max_pinned_bytes;
    if (l->max_pinned_bytes == 0) {
        /* Pinned pages cannot be swapped or reclaimed: half of the machine leaves the rest of
         * it to everything else, LimitMEMLOCK=infinity notwithstanding. */
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        l->max_pinned_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 2 : 0;
    }
}

int daemon_create(const struct convd_config *cfg, struct convd_daemon **ret, char *why,
                  size_t why_len)
{
    if (cfg == NULL || ret == NULL)
        return why_fail(why, why_len, CONVD_EINVAL, "no configuration");
    struct convd_daemon *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return why_fail(why, why_len, CONVD_ENOMEM, "out of memory");
    int rc;
    d->cfg = *cfg;
    d->delay_fd = -1;
    d->start_ns = convd_now_ns();
    conn_registry_init(&d->conns);
    region_releases_init(&d->releases, dmn_releases_wait, d);
    users_init(&d->users);
    metrics_init(&d->metrics, d->start_ns);
    daemon_apply_region_limits(d);
    sched_init(&d->sched, cfg->queue_limit, cfg->max_batch);
    /* a client that vanishes must not kill the daemon with SIGPIPE; sends use MSG_NOSIGNAL too */
    signal(SIGPIPE, SIG_IGN);

    d->take = calloc(cfg->max_batch ? cfg->max_batch : 1, sizeof(*d->take));
    if (d->take == NULL) {
        rc = why_fail(why, why_len, CONVD_ENOMEM, "out of memory");
        goto fail;
    }
    if (uv_loop_init(&d->loop) != 0) {
        rc = why_fail(why, why_len, CONVD_EINTERNAL, "cannot create the event loop");
        goto fail;
    }
    d->loop_open = true;
    /* The time libuv sleeps in epoll, so that work handled on waking counts as the loop's busy
     * time (daemon_run); without it, a loop that sleeps between requests reported none. */
    d->uv_idle_time = uv_loop_configure(&d->loop, UV_METRICS_IDLE_TIME) == 0;
    rc = dmn_open_backend(d, why, why_len);
    if (rc != 0)
        goto fail;
    if (!be_async(&d->backend))
        log_notice("backend %s: %s (requested %s), %u worker(s)", d->backend.info.name,
                   d->backend.info.device, config_backend_name(cfg->backend),
                   d->backend.info.max_workers);
    rc = listener_open(&d->listener, cfg, why, why_len);
    if (rc != 0)
        goto fail;
    d->listener_open = true;
    rc = dmn_init_handles(d, why, why_len);
    if (rc != 0)
        goto fail;
    rc = pool_start(&d->pool, &d->loop, &d->backend,
                    be_async(&d->backend) ? cfg->slots : d->backend.info.max_workers,
                    cfg->device_waits != 0, dmn_on_batch_done, d);
    if (rc != 0) {
        why_fail(why, why_len, rc, "cannot start %u worker thread(s)", d->backend.info.max_workers);
        goto fail;
    }
    d->pool_started = true;
    if (be_async(&d->backend)) /* after pool_start, which decides how many of the slots serve */
        log_notice("backend %s: %s (requested %s), %u slot(s) for batches in flight",
                   d->backend.info.name, d->backend.info.device, config_backend_name(cfg->backend),
                   d->pool.n);
    if (cfg->device_waits && d->pool.lanes == 0)
        log_warn("device_waits: the %s backend has no lanes here (it needs completion words and "
                 "the driver's stream memory operations); gates are polled by the loop",
                 d->backend.info.name);
    if (d->pool.lanes > CONN_MAX_LANES)
        d->pool.lanes = CONN_MAX_LANES;
    if (d->pool.lanes > 0) {
        rc = waits_start(&d->waits);
        if (rc != 0) {
            why_fail(why, why_len, rc, "cannot start the lanes' watchdog thread");
            goto fail;
        }
        log_notice("device_waits: %u lanes of %u slots for stream-ordered requests",
                   d->pool.lanes, d->pool.lane_depth);
        if (strcmp(d->backend.info.name, "gpu") == 0)
            log_warn("device_waits is experimental: a registration waits until no lane has a "
                     "batch, up to gate_timeout_ms behind a client whose word does not come "
                     "(docs/architecture.md, Lanes)");
    }
    if (cfg->launch_threads > 0 && be_async(&d->backend)) {
        if (pool_start_launcher(&d->pool, cfg->launch_threads, cfg->spin_us * 1000u,
                                cfg->launch_spinners) != 0)
            log_warn("cannot start a launch thread; the loop launches batches itself");
        else if (d->pool.nlaunchers < cfg->launch_threads)
            log_warn("started %u of %u launch threads", d->pool.nlaunchers, cfg->launch_threads);
        else if (d->pool.nlaunchers == 1)
            log_notice("batches are launched on a thread of their own");
        else
            log_notice("batches are launched on %u threads of their own", d->pool.nlaunchers);
        d->pool.launch_inline = cfg->launch_inline != 0;
    }
    if (doorbell_start(&d->doorbells, d->cfg.doorbell_threads, d->cfg.doorbell_spin_us * 1000u) !=
        0)
        log_warn("started %u of %u doorbell thread(s); the loop sends the rest itself",
                 d->doorbells.nthreads, d->cfg.doorbell_threads);
    rc = listener_start(&d->listener, &d->loop, dmn_on_accept, d);
    if (rc != 0) {
        why_fail(why, why_len, rc, "cannot watch the listening socket");
        goto fail;
    }
    *ret = d;
    return 0;
fail:
    daemon_destroy(d);
    return rc;
}

/* One pass over what the loop polls rather than waits for: the rings, then the batches in
 * flight on an asynchronous backend. Returns true when anything was taken or finished. */
static bool dmn_poll(struct convd_daemon *d)
{
    unsigned work = 0;
    uint64_t t0 = convd_now_ns(), t1 = t0;
    if (conn_have_rings(d) && !d->finishing) {
        work += conn_poll_rings(d);
        t1 = convd_now_ns();
        d->metrics.loop_rings_ns += t1 - t0;
    }
    if (conn_gated(d) > 0 && !d->finishing) {
        const uint64_t g0 = convd_now_ns();
        work += conn_poll_gates(d);
        t1 = convd_now_ns();
        d->metrics.loop_gates_ns += t1 - g0;
    }
    if (d->pool_started) {
        unsigned done = pool_poll(&d->pool);
        work += done;
        /* Paced: a launch that returned makes room for what queued meanwhile. */
        if (dmn_paced(d) && sched_depth(&d->sched) > 0 && d->pool.busy < d->pool.n &&
            dmn_launch_room(d)) {
            const unsigned before = d->pool.busy;
            daemon_dispatch(d);
            work += d->pool.busy != before;
        }
        if (done > 0)
            d->metrics.loop_done_ns += convd_now_ns() - t1;
    }
    return work > 0;
}

#define DMN_INFLIGHT_POLL_MS 5
#define DMN_UV_EVERY_NS      (5 * 1000)

static void dmn_on_inflight_timer(uv_timer_t *t)
{
    struct convd_daemon *d = t->data;
    if (d->pool_started)
        pool_poll(&d->pool);
}

/*
 * The loop: poll the rings and the device, run libuv without blocking, and keep doing so for
 * spin_us after the last thing that happened; only then sleep in libuv, with the rings' flags
 * set so that clients ring the doorbell and the backend told to wake us when its oldest batch
 * is done. While work flows the daemon never sleeps, so a request costs no wake-up on this side.
 */
int daemon_run(struct convd_daemon *d)
{
    sdn_notifyf("READY=1\nSTATUS=%s backend (%s) on %s", d->backend.info.name,
                d->backend.info.device, d->listener.path);
    log_notice("convd %s ready on %s%s", CONVD_VERSION_STRING, d->listener.path,
               d->listener.activated ? " (socket-activated)" : "");
    const uint64_t spin_ns = d->cfg.spin_us * 1000u;
    uint64_t last_work = convd_now_ns(), last_uv = 0;
    for (;;) {
        uint64_t seen = d->activity;
        const uint64_t pass_start = convd_now_ns();
        bool work = dmn_poll(d);
        uint64_t now = convd_now_ns();
        /* libuv's poll is a system call: while rings or batches in flight keep the loop busy,
         * the sockets are looked at every DMN_UV_EVERY_NS rather than on every pass. */
        if (now - last_uv >= DMN_UV_EVERY_NS ||
            (!conn_have_rings(d) && (!d->pool_started || d->pool.busy == 0))) {
            if (uv_run(&d->loop, UV_RUN_NOWAIT) == 0)
                break;
            last_uv = now;
            now = convd_now_ns();
            d->metrics.loop_uv_ns += now - last_uv;
        }
        if (work || d->activity != seen) {
            d->metrics.loop_busy_ns += now - pass_start;
            last_work = now;
            continue;
        }
        /* Nothing but a client's GPU stream announces a gate's ready word: while a request
         * waits on one the loop spins (gate_poll_us 0, or the requests of at most
         * gate_spin_clients connections) or sleeps at most gate_poll_us at a time, and a wake
         * that finds nothing does not start another spin. A lone patched model runs other
         * layers between two convolutions, longer than spin_us, so each of its words would
         * otherwise wait for the next look (bench/gpu/NOTES.md round 28). */
        const bool gated = conn_gated(d) > 0 || conn_waiting(d) > 0;
        const bool gate_spin =
            gated && (d->cfg.gate_poll_us == 0 ||
                      (conn_gated(d) > 0 && conn_gated_conns(d) <= d->cfg.gate_spin_clients));
        if (now - last_work < spin_ns || gate_spin) {
            convd_cpu_relax();
            continue;
        }
        if (conn_rings_sleep(d, true)) {
            conn_rings_sleep(d, false);
            last_work = now;
            continue;
        }
        /* The backend's notify wakes us when the oldest batch is done; the timer covers a
         * device that has failed, whose runtime calls nothing back any more. */
        bool inflight = d->pool_started && pool_arm(&d->pool);
        if (inflight)
            uv_timer_start(&d->inflight_timer, dmn_on_inflight_timer, DMN_INFLIGHT_POLL_MS, 0);
        if (gated)
            dmn_arm_delay(d, d->cfg.gate_poll_us * 1000u);
        const uint64_t before = d->activity;
        const uint64_t sleep_start = convd_now_ns();
        const uint64_t idle0 = d->uv_idle_time ? uv_metrics_idle_time(&d->loop) : 0;
        int alive = uv_run(&d->loop, UV_RUN_ONCE);
        if (d->uv_idle_time && d->activity != before) {
            /* Woken by work: what was not asleep in epoll was spent on it. */
            const uint64_t spent = convd_now_ns() - sleep_start,
                           idle = uv_metrics_idle_time(&d->loop) - idle0;
            if (spent > idle)
                d->metrics.loop_busy_ns += spent - idle;
        }
        if (inflight)
            uv_timer_stop(&d->inflight_timer);
        conn_rings_sleep(d, false);
        if (alive == 0)
            break;
        if (!gated || d->activity != before)
            last_work = convd_now_ns();
    }
    log_notice("convd stopped");
    return d->exit_code;
}

void daemon_destroy(struct convd_daemon *d)
{
    if (d == NULL)
        return;
    if (d->loop_open) {
        /* Whatever daemon_run() did not close (it never ran, or failed half-way) is closed
         * here, and the loop runs once more to deliver the close callbacks. */
        if (!d->finishing) {
            /* finishing first: no dispatch while the connections go */
            d->draining = true;
            d->finishing = true;
            conn_shutdown_all(d, false, "the daemon is shutting down");
        }
        if (d->listener_open) {
            listener_close(&d->listener, NULL);
            d->listener_open = false;
        }
        if (d->pool_started) {
            pool_stop(&d->pool);
            d->pool_started = false;
        }
        region_releases_run(&d->releases);
        waits_stop(&d->waits);
        dmn_close_handles(d);
        uv_run(&d->loop, UV_RUN_DEFAULT);
        if (uv_loop_close(&d->loop) != 0)
            log_warn("event loop still had open handles at exit");
        d->loop_open = false;
        /* Every connection's descriptor is closed by now: no ringer can touch one. */
        doorbell_stop(&d->doorbells);
        users_destroy(&d->users);
    } else if (d->listener_open) {
        listener_close(&d->listener, NULL);
    }
    if (d->delay_fd >= 0)
        close(d->delay_fd);
    if (d->backend_open)
        d->backend.ops->destroy(d->backend.ctx);
    free(d->take);
    free(d);
}
