#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "convd/convd.h"
#include "convd/status.h"
#include "metrics.h"

/* Latency buckets from 10 us to 10 s: wide enough for a 1 us CPU job and a 5 s GPU batch. */
static const double met_time_bounds[] = {1e-5,   2.5e-5, 5e-5, 1e-4,   2.5e-4, 5e-4, 1e-3,
                                         2.5e-3, 5e-3,   1e-2, 2.5e-2, 5e-2,   0.1,  0.25,
                                         0.5,    1.0,    2.5,  5.0,    10.0};
static const double met_batch_bounds[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static const int met_codes[] = {
#define MET_CODE_(name, value, msg) value,
    CONVD_STATUS_MAP(MET_CODE_)
#undef MET_CODE_
};

_Static_assert(ARRAY_LEN(met_codes) < MET_STATUS_SLOTS, "MET_STATUS_SLOTS too small");

static void met_hist_init(struct met_hist *h, const double *bounds, size_t n)
{
    memset(h, 0, sizeof(*h));
    h->bounds = bounds;
    h->n_bounds = n;
}

void metrics_init(struct metrics *m, uint64_t now_ns)
{
    memset(m, 0, sizeof(*m));
    met_hist_init(&m->queue_seconds, met_time_bounds, ARRAY_LEN(met_time_bounds));
    met_hist_init(&m->exec_seconds, met_time_bounds, ARRAY_LEN(met_time_bounds));
    met_hist_init(&m->device_seconds, met_time_bounds, ARRAY_LEN(met_time_bounds));
    met_hist_init(&m->launch_seconds, met_time_bounds, ARRAY_LEN(met_time_bounds));
    met_hist_init(&m->launch_wait_seconds, met_time_bounds, ARRAY_LEN(met_time_bounds));
    met_hist_init(&m->seen_lag_seconds, met_time_bounds, ARRAY_LEN(met_time_bounds));
    met_hist_init(&m->batch_size, met_batch_bounds, ARRAY_LEN(met_batch_bounds));
    met_hist_init(&m->gate_seconds, met_time_bounds, ARRAY_LEN(met_time_bounds));
    m->start_ns = now_ns;
    m->last_reload_ok = 1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    m->config_loaded_unix = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t met_slot(int status)
{
    if (status > 0 || -(long)status >= (long)ARRAY_LEN(met_codes))
        return MET_STATUS_SLOTS - 1;
    return (size_t)-status;
}

void metrics_request(struct metrics *m, int status, int rejected)
{
    size_t s = met_slot(status);
    m->requests[s]++;
    if (rejected)
        m->rejected[s]++;
}

void metrics_protocol_error(struct metrics *m)
{
    m->protocol_errors++;
}

void metrics_region(struct metrics *m, bool ok)
{
    if (ok)
        m->regions_registered++;
    else
        m->region_failures++;
}

void metrics_connection(struct metrics *m, bool accepted)
{
    if (accepted)
        m->connections_accepted++;
    else
        m->connections_refused++;
}

void metrics_gate_wait(struct metrics *m, uint64_t waiting_ns)
{
    metrics_hist_observe(&m->gate_seconds, (double)waiting_ns / 1e9);
}

void metrics_hist_observe(struct met_hist *h, double v)
{
    size_t i = 0;
    while (i < h->n_bounds && v > h->bounds[i])
        i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

uint64_t metrics_served(const struct metrics *m)
{
    return m->requests[0];
}

uint64_t metrics_failed(const struct metrics *m)
{
    uint64_t n = 0;
    for (size_t i = 1; i < MET_STATUS_SLOTS; i++)
        n += m->requests[i];
    return n;
}

struct met_out {
    char *buf;
    size_t cap, len;
    int overflow;
    const char *labels; /* added to every sample; "" for none */
};

static void met_printf(struct met_out *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void met_printf(struct met_out *o, const char *fmt, ...)
{
    if (o->overflow)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= o->cap - o->len) {
        o->overflow = 1;
        return;
    }
    o->len += (size_t)n;
}

static void met_head(struct met_out *o, const char *name, const char *type, const char *help)
{
    met_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One sample: name, its label set (the output's own labels, then `more`), the value. */
static void met_sample(struct met_out *o, const char *name, const char *more, const char *value)
{
    bool a = o->labels[0] != '\0', b = more != NULL && more[0] != '\0';
    if (a || b)
        met_printf(o, "%s{%s%s%s} %s\n", name, a ? o->labels : "", a && b ? "," : "", b ? more : "",
                   value);
    else
        met_printf(o, "%s %s\n", name, value);
}

static void met_sample_u64(struct met_out *o, const char *name, const char *more, uint64_t v)
{
    char value[24];
    snprintf(value, sizeof(value), "%llu", (unsigned long long)v);
    met_sample(o, name, more, value);
}

/* A sample with a fractional value: `decimals` places, or -1 for 9 significant digits. */
static void met_sample_f(struct met_out *o, const char *name, const char *more, int decimals,
                         double v)
{
    char value[40];
    if (decimals < 0)
        snprintf(value, sizeof(value), "%.9g", v);
    else
        snprintf(value, sizeof(value), "%.*f", decimals, v);
    met_sample(o, name, more, value);
}

static void met_scalar(struct met_out *o, const char *name, const char *type, const char *help,
                       uint64_t v)
{
    met_head(o, name, type, help);
    met_sample_u64(o, name, NULL, v);
}

static void met_by_status(struct met_out *o, const char *name, const char *help,
                          const uint64_t *counts)
{
    char more[48];
    met_head(o, name, "counter", help);
    for (size_t i = 0; i < ARRAY_LEN(met_codes); i++) {
        snprintf(more, sizeof(more), "status=\"%s\"", convd_status_name(met_codes[i]));
        met_sample_u64(o, name, more, counts[i]);
    }
    if (counts[MET_STATUS_SLOTS - 1] != 0)
        met_sample_u64(o, name, "status=\"UNKNOWN\"", counts[MET_STATUS_SLOTS - 1]);
}

static void met_hist(struct met_out *o, const char *name, const char *help,
                     const struct met_hist *h)
{
    char series[96], more[48];
    met_head(o, name, "histogram", help);
    snprintf(series, sizeof(series), "%s_bucket", name);
    uint64_t cum = 0;
    for (size_t i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        snprintf(more, sizeof(more), "le=\"%g\"", h->bounds[i]);
        met_sample_u64(o, series, more, cum);
    }
    cum += h->counts[h->n_bounds];
    met_sample_u64(o, series, "le=\"+Inf\"", cum);
    snprintf(series, sizeof(series), "%s_sum", name);
    met_sample_f(o, series, NULL, -1, h->sum);
    snprintf(series, sizeof(series), "%s_count", name);
    met_sample_u64(o, series, NULL, h->count);
}

char *metrics_label_escape(const char *value, char *buf, size_t cap)
{
    size_t k = 0;
    if (cap == 0)
        return buf;
    for (const char *s = value; s != NULL && *s != '\0'; s++) {
        const char *rep = *s == '"' ? "\\\"" : *s == '\\' ? "\\\\" : *s == '\n' ? "\\n" : NULL;
        size_t need = rep != NULL ? 2 : 1;
        if (k + need >= cap)
            break;
        if (rep != NULL) {
            memcpy(buf + k, rep, 2);
        } else {
            buf[k] = *s;
        }
        k += need;
    }
    buf[k] = '\0';
    return buf;
}

/* The device's gauges, for those the backend reports. */
static void met_device(struct met_out *o, const struct convd_backend_stats *dev)
{
    if (dev->has_memory) {
        met_scalar(o, "convd_device_memory_used_bytes", "gauge",
                   "Device memory in use, by every process on the device (total - free).",
                   dev->memory_used_bytes);
        met_scalar(o, "convd_device_memory_total_bytes", "gauge", "The device's memory.",
                   dev->memory_total_bytes);
    }
    if (dev->has_staging)
        met_scalar(o, "convd_device_staging_bytes", "gauge",
                   "Device memory the backend holds for staging host tensors and workspace.",
                   dev->staging_bytes);
    if (dev->has_utilization) {
        met_head(o, "convd_device_utilization_ratio", "gauge",
                 "Fraction of the driver's last sample period in which a kernel ran on the device "
                 "(any process's).");
        met_sample_f(o, "convd_device_utilization_ratio", NULL, 3, dev->utilization);
        met_head(o, "convd_device_memory_utilization_ratio", "gauge",
                 "Fraction of the driver's last sample period in which device memory was read or "
                 "written.");
        met_sample_f(o, "convd_device_memory_utilization_ratio", NULL, 3, dev->memory_utilization);
    }
}

int metrics_render(const struct metrics *m, const struct met_gauges *g, const char *backend,
                   const char *device, const char *labels, uint64_t now_ns, char *buf, size_t cap)
{
    if (buf == NULL || cap == 0)
        return -1;
    struct met_out o = {buf, cap, 0, 0, labels != NULL ? labels : ""};
    buf[0] = '\0';

    char info[512], b_esc[64], d_esc[300];
    snprintf(info, sizeof(info), "version=\"%s\",backend=\"%s\",device=\"%s\"",
             CONVD_VERSION_STRING, metrics_label_escape(backend, b_esc, sizeof(b_esc)),
             metrics_label_escape(device, d_esc, sizeof(d_esc)));
    met_head(&o, "convd_info", "gauge", "Build and backend of this daemon (always 1).");
    met_sample(&o, "convd_info", info, "1");
    met_head(&o, "convd_uptime_seconds", "gauge", "Seconds since the daemon started.");
    met_sample_f(&o, "convd_uptime_seconds", NULL, 3, (double)(now_ns - m->start_ns) / 1e9);

    /* The daemon's own CPU time, every thread: what the serving path costs per request is this
     * over convd_requests_total (convctl bench reports it). */
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        double user = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6;
        double sys = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
        met_head(&o, "process_cpu_seconds_total", "counter",
                 "User and system CPU time of the daemon.");
        met_sample_f(&o, "process_cpu_seconds_total", NULL, 6, user + sys);
    }

    met_head(&o, "convd_loop_busy_seconds_total", "counter",
             "Time the loop thread spent in passes that found work (rings, completions, "
             "launches, sockets); the rest it spun or slept.");
    met_sample_f(&o, "convd_loop_busy_seconds_total", NULL, 6, (double)m->loop_busy_ns / 1e9);
    met_head(&o, "convd_loop_seconds_total", "counter",
             "Time the loop thread spent in each step: polling the rings and taking their "
             "submissions, idle polls included (rings), looking at gated requests' ready words "
             "(gates), handling finished batches "
             "(completions; of which waking sleeping clients, doorbells, and forming and "
             "submitting the next batches, dispatch), asking the device whether batches are done "
             "(query), running libuv "
             "(uv); launches made inside rings and completions are counted there and in "
             "convd_launch_seconds.");
    met_sample_f(&o, "convd_loop_seconds_total", "step=\"rings\"", 6,
                 (double)m->loop_rings_ns / 1e9);
    met_sample_f(&o, "convd_loop_seconds_total", "step=\"gates\"", 6,
                 (double)m->loop_gates_ns / 1e9);
    met_sample_f(&o, "convd_loop_seconds_total", "step=\"completions\"", 6,
                 (double)m->loop_done_ns / 1e9);
    met_sample_f(&o, "convd_loop_seconds_total", "step=\"doorbells\"", 6,
                 (double)m->loop_doorbell_ns / 1e9);
    met_sample_f(&o, "convd_loop_seconds_total", "step=\"dispatch\"", 6,
                 (double)m->loop_dispatch_ns / 1e9);
    met_sample_f(&o, "convd_loop_seconds_total", "step=\"query\"", 6, (double)g->query_ns / 1e9);
    met_sample_f(&o, "convd_loop_seconds_total", "step=\"uv\"", 6, (double)m->loop_uv_ns / 1e9);
    if (g->loop_cpu_s >= 0) {
        met_head(&o, "convd_loop_cpu_seconds_total", "counter",
                 "User and system CPU time of the loop thread alone.");
        met_sample_f(&o, "convd_loop_cpu_seconds_total", NULL, 6, g->loop_cpu_s);
    }

    met_by_status(&o, "convd_requests_total", "Requests completed, by status.", m->requests);
    met_by_status(&o, "convd_requests_rejected_total",
                  "Requests refused before they were queued (invalid, limits, queue full, "
                  "shutdown), by status.",
                  m->rejected);
    met_scalar(&o, "convd_batches_total", "counter", "Backend calls (batches) run.", m->batches);
    met_scalar(&o, "convd_protocol_errors_total", "counter",
               "Datagrams that could not be decoded or were not allowed.", m->protocol_errors);
    met_scalar(&o, "convd_connections_total", "counter", "Connections accepted.",
               m->connections_accepted);
    met_scalar(&o, "convd_connections_refused_total", "counter",
               "Connections refused (client limit or allow-list).", m->connections_refused);
    met_scalar(&o, "convd_regions_registered_total", "counter", "Regions registered.",
               m->regions_registered);
    met_scalar(&o, "convd_region_failures_total", "counter", "Region registrations refused.",
               m->region_failures);
    met_scalar(&o, "convd_region_holds_total", "counter",
               "Region registrations that waited for the lanes to empty (device_waits).",
               m->region_holds);

    met_scalar(&o, "convd_clients", "gauge", "Connections open.", g->clients);
    met_scalar(&o, "convd_users", "gauge", "Distinct users (peer uids) connected.", g->users);
    met_scalar(&o, "convd_queue_depth", "gauge", "Requests waiting in the queue.", g->queue_depth);
    met_scalar(&o, "convd_inflight", "gauge", "Requests queued or running.", g->inflight);
    met_scalar(&o, "convd_running", "gauge", "Requests running on a worker.", g->running);
    met_scalar(&o, "convd_gated", "gauge",
               "Requests waiting on their gates' ready words (stream ordering).", g->gated);
    met_scalar(&o, "convd_lane_requests", "gauge",
               "Stream-ordered requests launched into lanes and not yet finished (device_waits; "
               "also counted as running).",
               g->waiting);
    met_scalar(&o, "convd_lane_launches_total", "counter",
               "Stream-ordered requests launched into lanes, where the device waits on their "
               "ready words (device_waits).",
               m->lane_launches);
    met_scalar(&o, "convd_regions", "gauge",
               "Regions mapped, including released ones still in use.", g->regions);
    met_scalar(&o, "convd_mapped_bytes", "gauge", "Bytes of regions mapped.", g->mapped_bytes);
    met_scalar(&o, "convd_host_region_bytes", "gauge",
               "Bytes of host-memory regions (pinned by the GPU backend).", g->host_bytes);
    met_scalar(&o, "convd_host_region_bytes_limit", "gauge",
               "The cap on them, all clients together (max_pinned_bytes).", g->max_pinned_bytes);
    met_scalar(&o, "convd_workers", "gauge", "Worker threads.", g->workers);
    met_scalar(&o, "convd_workers_busy", "gauge", "Worker threads running a batch.",
               g->workers_busy);
    met_scalar(&o, "convd_launch_concurrency_peak", "gauge",
               "Most launch calls of the asynchronous backend in progress at once since the start "
               "(above 1 only with several launch threads).",
               g->launch_peak);
    met_scalar(&o, "convd_launches_inline_total", "counter",
               "Batches the loop launched itself although launch threads run: nothing else was "
               "in flight (launch_inline).",
               g->inline_launches);
    met_scalar(&o, "convd_launcher_wakeups_total", "counter",
               "Sleeping launch threads the loop woke for a batch that no thread spinning on "
               "the launch queue could take.",
               g->launcher_wakeups);
    met_scalar(&o, "convd_doorbells_total", "counter",
               "Doorbells sent to ring clients that slept while their requests completed.",
               g->doorbells);
    met_scalar(&o, "convd_doorbell_wakeups_total", "counter",
               "Times the loop woke a sleeping ringer thread to send doorbells (none while an "
               "awake ringer can take them).",
               g->doorbell_wakes);
    met_scalar(&o, "convd_draining", "gauge", "1 while the daemon drains for shutdown.",
               (uint64_t)(g->draining != 0));
    met_device(&o, &g->device);

    met_head(&o, "convd_config_reloads_total", "counter",
             "Configuration reloads on SIGHUP: applied, refused (a key that takes a restart "
             "changed) or failed (the configuration did not parse).");
    met_sample_u64(&o, "convd_config_reloads_total", "result=\"applied\"", m->reloads_applied);
    met_sample_u64(&o, "convd_config_reloads_total", "result=\"refused\"", m->reloads_refused);
    met_sample_u64(&o, "convd_config_reloads_total", "result=\"failed\"", m->reloads_failed);
    met_scalar(&o, "convd_config_last_reload_successful", "gauge",
               "0 when the last SIGHUP left the configuration file unapplied, else 1.",
               (uint64_t)(m->last_reload_ok != 0));
    met_head(&o, "convd_config_last_reload_success_timestamp_seconds", "gauge",
             "When the configuration in force was loaded (Unix time), at start or on SIGHUP.");
    met_sample_f(&o, "convd_config_last_reload_success_timestamp_seconds", NULL, 3,
                 m->config_loaded_unix);

    met_hist(&o, "convd_queue_seconds", "Time from receipt to start of execution.",
             &m->queue_seconds);
    met_hist(&o, "convd_exec_seconds", "Wall time of each batch.", &m->exec_seconds);
    met_hist(&o, "convd_device_seconds",
             "Device time of each batch, from its first to its last operation on its stream "
             "(with batch_timing; empty otherwise).",
             &m->device_seconds);
    met_hist(&o, "convd_launch_seconds",
             "Host time the loop spent launching each batch (asynchronous backends).",
             &m->launch_seconds);
    met_hist(&o, "convd_launch_wait_seconds",
             "Time each batch waited for a launch thread, from the loop's queueing to the start of "
             "its launch (launch threads only).",
             &m->launch_wait_seconds);
    met_hist(&o, "convd_seen_lag_seconds",
             "For each batch of an asynchronous backend, the time between the loop's last look "
             "that found it running (or its launch's return) and the look that found it done: a "
             "bound on how late the loop learned that it had finished.",
             &m->seen_lag_seconds);
    met_hist(&o, "convd_batch_size", "Requests per batch.", &m->batch_size);
    met_hist(&o, "convd_gate_wait_seconds",
             "Time gated requests waited for their ready words, from receipt (the client's GPU "
             "stream reaching the request).",
             &m->gate_seconds);
    if (o.overflow)
        return -1;
    return (int)o.len;
}
