#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

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
    met_hist_init(&m->launch_seconds, met_time_bounds, ARRAY_LEN(met_time_bounds));
    met_hist_init(&m->batch_size, met_batch_bounds, ARRAY_LEN(met_batch_bounds));
    m->start_ns = now_ns;
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

static void met_scalar(struct met_out *o, const char *name, const char *type, const char *help,
                       uint64_t v)
{
    met_head(o, name, type, help);
    met_printf(o, "%s %llu\n", name, (unsigned long long)v);
}

static void met_by_status(struct met_out *o, const char *name, const char *help,
                          const uint64_t *counts)
{
    met_head(o, name, "counter", help);
    for (size_t i = 0; i < ARRAY_LEN(met_codes); i++)
        met_printf(o, "%s{status=\"%s\"} %llu\n", name, convd_status_name(met_codes[i]),
                   (unsigned long long)counts[i]);
    if (counts[MET_STATUS_SLOTS - 1] != 0)
        met_printf(o, "%s{status=\"UNKNOWN\"} %llu\n", name,
                   (unsigned long long)counts[MET_STATUS_SLOTS - 1]);
}

static void met_hist(struct met_out *o, const char *name, const char *help,
                     const struct met_hist *h)
{
    met_head(o, name, "histogram", help);
    uint64_t cum = 0;
    for (size_t i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        met_printf(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    met_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    met_printf(o, "%s_sum %.9g\n", name, h->sum);
    met_printf(o, "%s_count %llu\n", name, (unsigned long long)h->count);
}

/* Label values may not carry '"', '\\' or newlines unescaped. */
static void met_label_value(struct met_out *o, const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '"' || *s == '\\')
            met_printf(o, "\\%c", *s);
        else if (*s == '\n')
            met_printf(o, "\\n");
        else
            met_printf(o, "%c", *s);
    }
}

int metrics_render(const struct metrics *m, const struct met_gauges *g, const char *backend,
                   const char *device, uint64_t now_ns, char *buf, size_t cap)
{
    if (buf == NULL || cap == 0)
        return -1;
    struct met_out o = {buf, cap, 0, 0};
    buf[0] = '\0';

    met_head(&o, "convd_info", "gauge", "Build and backend of this daemon (always 1).");
    met_printf(&o, "convd_info{version=\"%s\",backend=\"", CONVD_VERSION_STRING);
    met_label_value(&o, backend);
    met_printf(&o, "\",device=\"");
    met_label_value(&o, device);
    met_printf(&o, "\"} 1\n");
    met_printf(&o,
               "# HELP convd_uptime_seconds Seconds since the daemon started.\n"
               "# TYPE convd_uptime_seconds gauge\nconvd_uptime_seconds %.3f\n",
               (double)(now_ns - m->start_ns) / 1e9);

    /* The daemon's own CPU time, every thread: what the serving path costs per request is this
     * over convd_requests_total (convctl bench reports it). */
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        double user = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6;
        double sys = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
        met_printf(&o,
                   "# HELP process_cpu_seconds_total User and system CPU time of the daemon.\n"
                   "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.6f\n",
                   user + sys);
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

    met_scalar(&o, "convd_clients", "gauge", "Connections open.", g->clients);
    met_scalar(&o, "convd_users", "gauge", "Distinct users (peer uids) connected.", g->users);
    met_scalar(&o, "convd_queue_depth", "gauge", "Requests waiting in the queue.", g->queue_depth);
    met_scalar(&o, "convd_inflight", "gauge", "Requests queued or running.", g->inflight);
    met_scalar(&o, "convd_running", "gauge", "Requests running on a worker.", g->running);
    met_scalar(&o, "convd_regions", "gauge",
               "Regions mapped, including released ones still in use.", g->regions);
    met_scalar(&o, "convd_mapped_bytes", "gauge", "Bytes of regions mapped.", g->mapped_bytes);
    met_scalar(&o, "convd_workers", "gauge", "Worker threads.", g->workers);
    met_scalar(&o, "convd_workers_busy", "gauge", "Worker threads running a batch.",
               g->workers_busy);
    met_scalar(&o, "convd_doorbells_total", "counter",
               "Doorbells sent to ring clients that slept while their requests completed.",
               g->doorbells);
    met_scalar(&o, "convd_draining", "gauge", "1 while the daemon drains for shutdown.",
               (uint64_t)(g->draining != 0));

    met_hist(&o, "convd_queue_seconds", "Time from receipt to start of execution.",
             &m->queue_seconds);
    met_hist(&o, "convd_exec_seconds", "Wall time of each batch.", &m->exec_seconds);
    met_hist(&o, "convd_launch_seconds",
             "Host time the loop spent launching each batch (asynchronous backends).",
             &m->launch_seconds);
    met_hist(&o, "convd_batch_size", "Requests per batch.", &m->batch_size);
    if (o.overflow)
        return -1;
    return (int)o.len;
}
