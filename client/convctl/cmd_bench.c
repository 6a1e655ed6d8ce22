/*
 * convctl bench: the daemon's load benchmark. N client processes, each with its own connection and
 * regions, keep D requests in flight for a duration or a number of requests; the parent reports
 * throughput, the latency distribution and the batch sizes the daemon reported.
 *
 * Children write their results into shared anonymous memory (latencies as a log-linear histogram,
 * so that a long run costs no more memory than a short one). They start together: each signals
 * readiness on one pipe, then blocks on another that the parent closes. They stop together too:
 * each signals the end of its requests on a third pipe, then blocks on a fourth until the parent
 * has read the daemon's counters and CPU time, so that the measured window holds neither the
 * clients' set-up (connection, regions, warm-up) nor their tear-down.
 *
 * With --memory gpu each child keeps its tensors in its own GPU memory (one cudaMalloc, filled
 * from the host, registered by CUDA IPC handle) through the CUDA runtime loaded at run time
 * (gpumem.h). The parent only loads the runtime, so that the children can initialise CUDA after
 * the fork.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpumem.h"
#include "mix.h"
#include "util.h"

static const char bench_usage[] =
    "Usage: convctl bench [--clients N] [--depth D] [--duration S | --requests R]\n"
    "                     [--memory host|gpu] [--gated [--gap-us G]] [--distinct K] [--json]\n"
    "                     [shape options | --shape NAME --csv FILE | --all --csv FILE]\n"
    "                     [--socket PATH | --device N] [--timeout MS]\n"
    "\n"
    "Load benchmark of the daemon: N client processes (each with its own connection and\n"
    "regions) each keep D requests in flight, for S seconds or R requests in total. Reports\n"
    "requests/s, images/s, TFLOP/s, the p50/p99/p99.9 round-trip latency, the batch sizes\n"
    "and queue/execution times the daemon reported in its completions, and the daemon's CPU\n"
    "time per request (its process_cpu_seconds_total metric over the requests it served).\n"
    "\n"
    "  --clients N     client processes (default 4)\n"
    "  --depth D       requests each keeps in flight (default 2)\n"
    "  --duration S    seconds to run (default 5)\n"
    "  --requests R    run R requests in total instead of a duration\n"
    "  --memory host   tensors in shared host memory (memfd regions; the default)\n"
    "  --memory gpu    tensors in each client's own GPU memory, registered by CUDA IPC handle\n"
    "                  (needs the daemon's GPU backend and libcudart, loaded at run time:\n"
    "                  libcudart.so, .so.13 or .so.12, or the path in $CONVD_CUDART)\n"
    "  --device N      the daemon of GPU N (gpuN.sock, see convctl --help) and, with\n"
    "                  --memory gpu, the GPU the clients allocate on (default 0); with --socket\n"
    "                  or $CONVD_SOCKET naming the daemon, only the latter\n"
    "  --gated         stream-ordered chains (gates), as patched models send them: each of a\n"
    "                  client's D requests names a ready word in a region of its own, and the\n"
    "                  client writes the oldest one's word when the one before it completes,\n"
    "                  standing in for its GPU stream; D - 1 wait on their words in the daemon\n"
    "                  meanwhile. Latency is from the ready write to the completion (needs a\n"
    "                  daemon of protocol 3)\n"
    "  --gap-us G      with --gated: the client spins G us after a completion before it writes\n"
    "                  the next word, standing in for the layers a model runs between two\n"
    "                  convolutions (default 0); the latency clock starts at the write\n"
    "  --distinct K    the shape with K different activations (1 to 7: none, relu, relu6,\n"
    "                  silu, hardswish, gelu, gelu_tanh) in turn, client i starting at the\n"
    "                  i-th: K problems of the same sizes, which do not batch with each other,\n"
    "                  as the layers of patched models do not (default 1: the shape as given)\n"
    "  --json          one JSON object per shape on stdout instead of the report\n"
    "  --shape NAME --csv FILE   a row of a shapes CSV (bench/shapes.csv)\n"
    "  --all --csv FILE          every row of the CSV in turn, one table line each\n"
    "Shape options (default: n2 c32 h16 w16 k32 r3 s3 groups 4 pad 1; they override a CSV row):\n"
    "  --n --c --h --w --k --r --s --groups --stride --pad --dilation\n"
    "  --dtype fp32|fp16|bf16  --layout nchw|nhwc  --bias\n"
    "  --act none|relu|relu6|clamp:LO,HI|silu|hardswish|gelu|gelu_tanh  (--relu: --act relu)\n"
    "  --tf32        fp32 may multiply in TF32 on the GPU (allow_tf32)\n";

#define BENCH_LAT_BUCKETS 3776 /* see bench_lat_bucket */
#define BENCH_BATCH_MAX   1024

/* One child's results, in memory shared with the parent. */
struct bench_result {
    int fatal;       /* 0, or the CONVD_E* code that stopped the child */
    char error[256]; /* its sentence, or the first failed request's */
    uint64_t completed, failed;
    int first_fail;
    uint64_t t_begin, t_end;
    uint64_t queue_ns, exec_ns;
    uint64_t lat[BENCH_LAT_BUCKETS];
    uint64_t batch[BENCH_BATCH_MAX + 1]; /* [b]: completions from batches of b; last: larger */
};

struct bench_params {
    struct convd_problem p;
    struct convd_problem_sizes z;
    int clients, depth;
    bool memory_gpu; /* tensors in the clients' GPU memory */
    bool gated;      /* chains of stream-ordered requests (--gated) */
    int distinct;    /* problems a client cycles through (--distinct), 1 to 7 */
    uint64_t gap_ns; /* --gap-us: between a completion and the next ready word */
    int device;      /* the GPU they allocate on */
    double duration_s;
    uint64_t requests; /* 0: run for duration_s */
    int wait_ms;
};

/* Log-linear buckets: exact below 64 ns, then 64 per power of two (1.6% resolution). */
static size_t bench_lat_bucket(uint64_t v)
{
    if (v < 64)
        return (size_t)v;
    int e = 63 - __builtin_clzll(v);
    uint64_t sub = (v >> (e - 6)) & 63;
    return (size_t)(e - 5) * 64 + (size_t)sub;
}

static double bench_lat_value(size_t b)
{
    if (b < 64)
        return (double)b;
    int e = (int)(b / 64) + 5;
    double lo = (double)((64 + b % 64) << (e - 6));
    return lo + (double)(1ull << (e - 6)) / 2;
}

static double bench_percentile(const uint64_t *hist, uint64_t total, double q)
{
    if (total == 0)
        return 0;
    uint64_t want = (uint64_t)ceil(q * (double)total);
    if (want == 0)
        want = 1;
    uint64_t acc = 0;
    for (size_t b = 0; b < BENCH_LAT_BUCKETS; b++) {
        acc += hist[b];
        if (acc >= want)
            return bench_lat_value(b);
    }
    return bench_lat_value(BENCH_LAT_BUCKETS - 1);
}

static void bench_note(struct bench_result *res, int fatal, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void bench_note(struct bench_result *res, int fatal, const char *fmt, ...)
{
    va_list ap;
    res->fatal = fatal;
    va_start(ap, fmt);
    vsnprintf(res->error, sizeof(res->error), fmt, ap);
    va_end(ap);
}

/* The pipes a child uses to start and stop with the others (see the top of this file). */
struct bench_fds {
    int ready, go;     /* write 'r' (or 'e') when warm; read until the parent closes go */
    int done, release; /* write one byte when finished; read until the parent closes release */
};

/* --gated: a client's requests in submission order (a ring of depth slots), each slot's gate
 * value, and the region's words (two a slot: ready, then done). */
struct bench_chain {
    int depth;
    int *slots;
    size_t head, len;
    uint32_t *val;
    _Atomic uint32_t *words;
};

/* Slot's request joins the chain's tail with the slot's next gate value (its words still hold
 * the last one, so it waits). Returns -1 when the chain already holds depth slots. */
static int bench_chain_push(struct bench_chain *ch, struct convd_conv_args *a, int slot)
{
    if (ch->len >= (size_t)ch->depth)
        return -1;
    ch->val[slot] += 1;
    a->gate.ready_value = a->gate.done_value = ch->val[slot];
    ch->slots[(ch->head + ch->len) % (size_t)ch->depth] = slot;
    ch->len++;
    return 0;
}

/* Takes slot out of the chain, wherever it is. */
static void bench_chain_drop(struct bench_chain *ch, int slot)
{
    const size_t d = (size_t)ch->depth;
    size_t i = 0;
    while (i < ch->len && ch->slots[(ch->head + i) % d] != slot)
        i++;
    if (i == ch->len)
        return;
    for (; i + 1 < ch->len; i++)
        ch->slots[(ch->head + i) % d] = ch->slots[(ch->head + i + 1) % d];
    ch->len--;
    if (ch->len == 0)
        ch->head = 0;
}

/* Writes the ready word of the chain's head (once: a word already at its value is left alone)
 * and starts its latency clock there. */
static void bench_chain_open(struct bench_chain *ch, uint64_t *sent)
{
    if (ch->len == 0)
        return;
    const int s = ch->slots[ch->head % (size_t)ch->depth];
    if (atomic_load_explicit(&ch->words[2 * s], memory_order_relaxed) == ch->val[s])
        return;
    sent[s] = ctl_now_ns();
    atomic_store_explicit(&ch->words[2 * s], ch->val[s], memory_order_release);
}

/* Submits slot's request (as the chain's tail with --gated, its head's word written then).
 * Returns 0, or -1 with the failure noted in res. */
static int bench_submit(convd_client *c, const struct bench_params *bp, struct bench_chain *ch,
                        struct convd_conv_args *args, uint64_t *ids, uint64_t *sent, int slot,
                        struct bench_result *res)
{
    sent[slot] = ctl_now_ns();
    if (bp->gated && bench_chain_push(ch, &args[slot], slot) != 0) {
        bench_note(res, CONVD_EINTERNAL, "the chain is full");
        return -1;
    }
    int rc = convd_conv_submit(c, &args[slot], &ids[slot]);
    if (rc != 0) {
        bench_note(res, rc, "submit: %s", convd_errstr(c));
        return -1;
    }
    if (bp->gated)
        bench_chain_open(ch, sent);
    return 0;
}

/* --distinct: slot i of client `index` takes the (index + i)-th of bp->distinct activations. */
static void bench_distinct(struct convd_problem *p, const struct bench_params *bp, int index, int i)
{
    static const enum convd_activation acts[] = {
        CONVD_ACT_NONE,      CONVD_ACT_RELU, CONVD_ACT_CLAMP,     CONVD_ACT_SILU,
        CONVD_ACT_HARDSWISH, CONVD_ACT_GELU, CONVD_ACT_GELU_TANH,
    };
    if (bp->distinct <= 1)
        return;
    p->activation = acts[(unsigned)(index + i) % (unsigned)bp->distinct];
    p->act_min = 0;
    p->act_max = p->activation == CONVD_ACT_CLAMP ? 6 : 0;
}

/* The body of one client process. Returns its exit code. */
static int bench_child(const struct ctl_global *g, const struct bench_params *bp, uint64_t quota,
                       int index, uint64_t seed, struct bench_result *res,
                       const struct bench_fds *fds)
{
    const struct convd_problem_sizes *z = &bp->z;
    const int depth = bp->depth;
    const uint64_t align = 256;
    const uint64_t in_sz = (z->input_bytes + align - 1) / align * align;
    const uint64_t out_sz = (z->output_bytes + align - 1) / align * align;
    const uint64_t w_sz = (z->weight_bytes + align - 1) / align * align;
    const uint64_t b_sz = (z->bias_bytes + align - 1) / align * align;
    const uint64_t total = w_sz + b_sz + (uint64_t)depth * (in_sz + out_sz);
    convd_client *c = NULL;
    convd_region *r = NULL;
    uint8_t *host = NULL; /* --memory gpu: the data, before it is copied to the GPU */
    void *dev = NULL;     /* --memory gpu: the allocation */
    uint64_t *ids = calloc((size_t)depth, sizeof(*ids));
    uint64_t *sent = calloc((size_t)depth, sizeof(*sent));
    struct convd_conv_args *args = calloc((size_t)depth, sizeof(*args));
    struct bench_chain chain = {depth, calloc((size_t)depth, sizeof(int)), 0, 0,
                                calloc((size_t)depth, sizeof(uint32_t)), NULL};
    convd_region *gr = NULL; /* --gated: the gates' words */
    struct convd_completion done;
    char ready = 'e', why[512];
    int rc;

    if (ids == NULL || sent == NULL || args == NULL || chain.slots == NULL || chain.val == NULL) {
        bench_note(res, CONVD_ENOMEM, "out of memory");
        goto signal;
    }
    /* Before any other CUDA call: the device this process's context lives on. */
    if (bp->memory_gpu && gpumem_set_device(bp->device, why, sizeof(why)) != 0) {
        bench_note(res, CONVD_EDEVICE, "%s", why);
        goto signal;
    }
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = g->socket;
    o.client_name = "convctl-bench";
    o.timeout_ms = g->timeout_ms;
    o.device = g->device;
    if ((rc = convd_connect(&o, &c)) != 0) {
        bench_note(res, rc, "cannot connect: %s", convd_last_connect_error());
        goto signal;
    }
    uint8_t *base;
    if (bp->memory_gpu) {
        if ((host = malloc((size_t)total)) == NULL) {
            bench_note(res, CONVD_ENOMEM, "cannot allocate %llu bytes of host memory",
                       (unsigned long long)total);
            goto signal;
        }
        memset(host, 0, (size_t)total);
        base = host;
    } else {
        if ((rc = convd_region_create(c, total, &r)) != 0) {
            bench_note(res, rc, "cannot create a region: %s", convd_errstr(c));
            goto signal;
        }
        base = convd_region_data(r);
    }
    struct ctl_rng rng;
    ctl_rng_seed(&rng, seed);
    ctl_fill_random(&rng, bp->p.dtype, base, z->weight_elems);
    if (bp->p.has_bias)
        ctl_fill_random(&rng, bp->p.dtype, base + w_sz, z->bias_elems);
    for (int i = 0; i < depth; i++)
        ctl_fill_random(&rng, bp->p.dtype, base + w_sz + b_sz + (uint64_t)i * (in_sz + out_sz),
                        z->input_elems);
    if (bp->memory_gpu) {
        unsigned char handle[GPUMEM_IPC_HANDLE_SIZE];
        if (gpumem_alloc_upload(host, (size_t)total, &dev, why, sizeof(why)) != 0 ||
            gpumem_ipc_handle(dev, handle, why, sizeof(why)) != 0) {
            bench_note(res, CONVD_EDEVICE, "%s", why);
            goto signal;
        }
        free(host);
        host = NULL;
        /* The handle opens at the allocation's base, where the region starts. */
        if ((rc = convd_region_import_gpu(c, handle, sizeof(handle), 0, total, &r)) != 0) {
            bench_note(res, rc, "cannot register the GPU memory: %s", convd_errstr(c));
            goto signal;
        }
    }
    for (int i = 0; i < depth; i++) {
        uint64_t off = w_sz + b_sz + (uint64_t)i * (in_sz + out_sz);
        struct convd_conv_args *a = &args[i];
        *a = (struct convd_conv_args)CONVD_CONV_ARGS_INIT;
        a->problem = bp->p;
        bench_distinct(&a->problem, bp, index, i);
        a->weight = (struct convd_tensor){r, 0, z->weight_bytes};
        if (bp->p.has_bias)
            a->bias = (struct convd_tensor){r, w_sz, z->bias_bytes};
        a->input = (struct convd_tensor){r, off, z->input_bytes};
        a->output = (struct convd_tensor){r, off + in_sz, z->output_bytes};
    }
    /* One request before the start, so that connection set-up and first-touch page faults (or
     * the daemon's import of the GPU memory) are not measured. */
    uint64_t id;
    if ((rc = convd_conv_submit(c, &args[0], &id)) != 0 ||
        (rc = convd_wait(c, id, bp->wait_ms, &done)) != 0) {
        bench_note(res, rc, "warm-up request: %s", convd_errstr(c));
        goto signal;
    }
    if (done.status != 0) {
        bench_note(res, done.status, "warm-up request failed: %s", done.error);
        goto signal;
    }
    if (bp->gated) {
        /* Two words a slot, ready then done, as the Python package lays out its gates. */
        if ((rc = convd_region_create(c, (size_t)depth * 8, &gr)) != 0) {
            bench_note(res, rc, "cannot create the gates' region: %s", convd_errstr(c));
            goto signal;
        }
        chain.words = convd_region_data(gr);
        for (int i = 0; i < depth; i++)
            args[i].gate = (struct convd_gate){gr, 8 * (uint64_t)i, 8 * (uint64_t)i + 4, 0, 0};
    }
    ready = 'r';
signal:;
    /* Closed at once, so that the parent sees the end of the pipe even if a child dies. */
    bool go = write(fds->ready, &ready, 1) == 1 && ready == 'r';
    close(fds->ready);
    if (!go)
        goto finish;
    char ch;
    while (read(fds->go, &ch, 1) < 0 && errno == EINTR)
        ;

    res->t_begin = ctl_now_ns();
    const uint64_t deadline =
        bp->requests != 0 ? UINT64_MAX : res->t_begin + (uint64_t)(bp->duration_s * 1e9);
    uint64_t submitted = 0;
    size_t inflight = 0;
    for (int i = 0; i < depth && submitted < quota; i++) {
        if (bench_submit(c, bp, &chain, args, ids, sent, i, res) != 0)
            goto finish;
        submitted++;
        inflight++;
    }
    while (inflight > 0) {
        rc = convd_wait_any(c, bp->wait_ms, &done);
        if (rc != 0) {
            bench_note(res, rc, "waiting for completions: %s", convd_errstr(c));
            goto finish;
        }
        uint64_t now = ctl_now_ns();
        inflight--;
        int slot = 0;
        while (slot < depth && ids[slot] != done.id)
            slot++;
        if (slot == depth) {
            bench_note(res, CONVD_EINTERNAL, "completion for unknown request");
            goto finish;
        }
        if (bp->gated) {
            /* Out of the chain (the head, unless requests failed out of order); the next one's
             * word is written now, as its stream would once this one's done word came and the
             * layers between (--gap-us) ran. */
            bench_chain_drop(&chain, slot);
            for (const uint64_t until = now + bp->gap_ns; ctl_now_ns() < until;)
                ;
            bench_chain_open(&chain, sent);
        }
        if (done.status == 0) {
            res->completed++;
            res->lat[bench_lat_bucket(now - sent[slot])]++;
            res->batch[done.batch_size < BENCH_BATCH_MAX ? done.batch_size : BENCH_BATCH_MAX]++;
            res->queue_ns += done.queue_us * 1000;
            res->exec_ns += done.exec_us * 1000;
        } else {
            if (res->failed++ == 0) {
                res->first_fail = done.status;
                snprintf(res->error, sizeof(res->error), "%s", done.error);
            }
        }
        res->t_end = now;
        if (now < deadline && submitted < quota) {
            if (bench_submit(c, bp, &chain, args, ids, sent, slot, res) != 0)
                goto finish;
            submitted++;
            inflight++;
        }
    }
finish:
    /* Done: wait until the parent has read the daemon's counters before tearing down. */
    bool wrote = write(fds->done, "d", 1) == 1;
    close(fds->done);
    while (wrote && read(fds->release, &ch, 1) < 0 && errno == EINTR)
        ;
    convd_region_free(gr);
    convd_region_free(r);
    convd_close(c);
    if (dev != NULL && gpumem_free(dev, why, sizeof(why)) != 0 && res->fatal == 0)
        bench_note(res, CONVD_EDEVICE, "%s", why);
    free(host);
    free(ids);
    free(sent);
    free(args);
    free(chain.slots);
    free(chain.val);
    return res->fatal != 0 ? CTL_EXIT_FAIL : 0;
}

/* The steps of convd_loop_seconds_total, as the daemon labels them. */
#define BENCH_STEPS 7
static const char *const bench_steps[BENCH_STEPS] = {"rings",     "completions", "query", "uv",
                                                     "doorbells", "dispatch",    "gates"};

/* The daemon's counters and CPU time at one moment. */
struct bench_snap {
    bool ok;       /* the status was read */
    bool have_cpu; /* and process_cpu_seconds_total */
    double cpu_s;
    uint64_t served, failed, batches;
    /* The loop thread (0 where the daemon does not export them): its busy passes, its own CPU,
     * the host time of launches (asynchronous backends), against the daemon's uptime. */
    bool have_loop;
    double uptime_s, loop_busy_s, loop_cpu_s, launch_s;
    double step_s[BENCH_STEPS]; /* convd_loop_seconds_total by step, in bench_steps' order */
    /* convd_device_seconds (the daemon's batch_timing): its sum and count; 0 without it. */
    double device_s, device_n;
};

/* Totals over the children, and the daemon's counters around the measured window. */
struct bench_sum {
    uint64_t completed, failed;
    double seconds;
    uint64_t queue_ns, exec_ns;
    uint64_t lat[BENCH_LAT_BUCKETS];
    uint64_t batch[BENCH_BATCH_MAX + 1];
    int fatal;
    char error[300];
    struct bench_snap before, after;
    /* Fairness: the slowest and the fastest client's requests/s over the mean of all (1: equal);
     * 0 when there is only one client or nothing was measured. */
    double fair_min, fair_max;
};

/* The value of an unlabelled sample in Prometheus text: the first line that starts with name
 * followed by a space (or tab), then the value. */
static bool bench_metric(const char *text, const char *name, double *ret)
{
    const size_t len = strlen(name);
    for (const char *line = text; line != NULL && *line != '\0';) {
        if (strncmp(line, name, len) == 0 && (line[len] == ' ' || line[len] == '\t')) {
            char *end;
            errno = 0;
            double v = strtod(line + len, &end);
            if (end == line + len || errno != 0 || !isfinite(v) ||
                (*end != '\0' && *end != '\n' && *end != ' ' && *end != '\t' && *end != '\r'))
                return false;
            *ret = v;
            return true;
        }
        line = strchr(line, '\n');
        if (line != NULL)
            line++;
    }
    return false;
}

/* Reads the daemon's status and metrics on c (NULL: nothing read). The reading that comes
 * second is the one whose own cost lands outside the window: status first before the
 * measurement, metrics first after it. */
static void bench_snap_take(convd_client *c, struct bench_snap *s, bool metrics_first)
{
    memset(s, 0, sizeof(*s));
    if (c == NULL)
        return;
    for (int step = 0; step < 2; step++) {
        if ((step == 0) == metrics_first) {
            char *text = NULL;
            int rc = convd_metrics_get(c, &text);
            if (rc == 0) {
                s->have_cpu = bench_metric(text, "process_cpu_seconds_total", &s->cpu_s);
                (void)bench_metric(text, "convd_device_seconds_sum", &s->device_s);
                (void)bench_metric(text, "convd_device_seconds_count", &s->device_n);
                s->have_loop = bench_metric(text, "convd_uptime_seconds", &s->uptime_s) &&
                               bench_metric(text, "convd_loop_busy_seconds_total", &s->loop_busy_s);
                if (s->have_loop) {
                    (void)bench_metric(text, "convd_loop_cpu_seconds_total", &s->loop_cpu_s);
                    (void)bench_metric(text, "convd_launch_seconds_sum", &s->launch_s);
                    for (size_t i = 0; i < BENCH_STEPS; i++) {
                        char series[80];
                        snprintf(series, sizeof(series), "convd_loop_seconds_total{step=\"%s\"}",
                                 bench_steps[i]);
                        (void)bench_metric(text, series, &s->step_s[i]);
                    }
                }
            } else
                ctl_err("metrics: %s (%s)", convd_errstr(c), convd_status_name(rc));
            free(text);
        } else {
            struct convd_status st;
            int rc = convd_status_get(c, &st);
            if (rc == 0) {
                s->ok = true;
                s->served = st.requests_served;
                s->failed = st.requests_failed;
                s->batches = st.batches;
            } else {
                ctl_err("status: %s (%s)", convd_errstr(c), convd_status_name(rc));
            }
        }
    }
}

/* The daemon's requests (served and failed) between the snapshots, and its CPU time per request
 * in microseconds; false when either is unknown. */
static bool bench_cpu_per_req(const struct bench_sum *s, double *ret_us, uint64_t *ret_requests)
{
    const struct bench_snap *a = &s->before, *b = &s->after;
    *ret_requests = 0;
    if (!a->ok || !b->ok || b->served < a->served || b->failed < a->failed)
        return false;
    *ret_requests = (b->served - a->served) + (b->failed - a->failed);
    if (!a->have_cpu || !b->have_cpu || *ret_requests == 0 || b->cpu_s < a->cpu_s)
        return false;
    *ret_us = (b->cpu_s - a->cpu_s) * 1e6 / (double)*ret_requests;
    return true;
}

/* The mean device time of the batches timed between the snapshots (the daemon's batch_timing),
 * in nanoseconds; false when none was. */
static bool bench_device(const struct bench_sum *s, double *ret_ns)
{
    const struct bench_snap *a = &s->before, *b = &s->after;
    const double n = b->device_n - a->device_n;
    if (n < 1 || b->device_s < a->device_s)
        return false;
    *ret_ns = (b->device_s - a->device_s) * 1e9 / n;
    return true;
}

struct bench_loop_use {
    double busy, cpu, launch, step[BENCH_STEPS];
};

/* The loop thread between the snapshots, as fractions of the daemon's wall time: passes that
 * found work, its own CPU (spinning included), launching, and each step of
 * convd_loop_seconds_total; false when unknown. */
static bool bench_loop(const struct bench_sum *s, struct bench_loop_use *u)
{
    const struct bench_snap *a = &s->before, *b = &s->after;
    if (!a->have_loop || !b->have_loop || b->uptime_s <= a->uptime_s)
        return false;
    const double wall = b->uptime_s - a->uptime_s;
    u->busy = (b->loop_busy_s - a->loop_busy_s) / wall;
    u->cpu = (b->loop_cpu_s - a->loop_cpu_s) / wall;
    u->launch = (b->launch_s - a->launch_s) / wall;
    for (size_t i = 0; i < BENCH_STEPS; i++)
        u->step[i] = (b->step_s[i] - a->step_s[i]) / wall;
    return true;
}

static int bench_run(const struct ctl_global *g, const struct bench_params *bp,
                     struct bench_sum *sum)
{
    const int n = bp->clients;
    size_t shared_len = (size_t)n * sizeof(struct bench_result);
    struct bench_result *res =
        mmap(NULL, shared_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED) {
        ctl_err("cannot map %zu bytes for the results: %s", shared_len, strerror(errno));
        return -1;
    }
    int ready[2] = {-1, -1}, go[2] = {-1, -1}, done[2] = {-1, -1}, release[2] = {-1, -1};
    pid_t *pids = calloc((size_t)n, sizeof(*pids));
    int started = 0, rc = -1;
    struct bench_snap before, after;
    /* The parent's own connection, for the counters around the window: opened before the
     * children so that it costs the daemon nothing inside it. */
    convd_client *snap = NULL;
    if (ctl_connect(g, &snap) != 0)
        snap = NULL;
    if (pids == NULL || pipe2(ready, O_CLOEXEC) != 0 || pipe2(go, O_CLOEXEC) != 0 ||
        pipe2(done, O_CLOEXEC) != 0 || pipe2(release, O_CLOEXEC) != 0) {
        ctl_err("cannot set up the clients: %s", strerror(errno));
        goto finish;
    }
    uint64_t seed = ctl_fresh_seed();
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < n; i++) {
        uint64_t quota = UINT64_MAX;
        if (bp->requests != 0)
            quota = bp->requests / (uint64_t)n + ((uint64_t)i < bp->requests % (uint64_t)n);
        pid_t pid = fork();
        if (pid < 0) {
            ctl_err("fork: %s", strerror(errno));
            break;
        }
        if (pid == 0) {
            /* The parent's connection is not the child's to use (its memory is left alone). */
            if (snap != NULL)
                close(convd_client_fd(snap));
            close(ready[0]);
            close(go[1]);
            close(done[0]);
            close(release[1]);
            const struct bench_fds fds = {ready[1], go[0], done[1], release[0]};
            _exit(bench_child(g, bp, quota, i, seed + (uint64_t)i * MIX_GOLDEN64, &res[i], &fds));
        }
        pids[started++] = pid;
    }
    close(ready[1]);
    ready[1] = -1;
    close(done[1]);
    done[1] = -1;
    /* Wait until every client is connected and warm (or has given up), then start them all. */
    for (int got = 0; got < started;) {
        char ch;
        ssize_t k = read(ready[0], &ch, 1);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got++;
    }
    bench_snap_take(snap, &before, false);
    close(go[1]);
    go[1] = -1;
    /* Wait until every client has its last completion (or has died), read the counters, then
     * let them tear down. */
    for (int got = 0; got < started;) {
        char ch;
        ssize_t k = read(done[0], &ch, 1);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got++;
    }
    bench_snap_take(snap, &after, true);
    close(release[1]);
    release[1] = -1;
    for (int i = 0; i < started; i++) {
        int st;
        while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR)
            ;
        if (!WIFEXITED(st) && res[i].fatal == 0) {
            res[i].fatal = CONVD_EINTERNAL;
            snprintf(res[i].error, sizeof(res[i].error), "client process died (signal %d)",
                     WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        }
    }

    memset(sum, 0, sizeof(*sum));
    sum->before = before;
    sum->after = after;
    uint64_t t_begin = UINT64_MAX, t_end = 0;
    for (int i = 0; i < started; i++) {
        const struct bench_result *r = &res[i];
        if (r->fatal != 0 && sum->fatal == 0) {
            sum->fatal = r->fatal;
            snprintf(sum->error, sizeof(sum->error), "client %d: %s (%s)", i, r->error,
                     convd_status_name(r->fatal));
        }
        if (r->failed > 0 && sum->failed == 0 && sum->fatal == 0)
            snprintf(sum->error, sizeof(sum->error), "first failed request: %s (%s)", r->error,
                     convd_status_name(r->first_fail));
        sum->completed += r->completed;
        sum->failed += r->failed;
        sum->queue_ns += r->queue_ns;
        sum->exec_ns += r->exec_ns;
        for (size_t b = 0; b < BENCH_LAT_BUCKETS; b++)
            sum->lat[b] += r->lat[b];
        for (size_t b = 0; b <= BENCH_BATCH_MAX; b++)
            sum->batch[b] += r->batch[b];
        if (r->completed + r->failed > 0) {
            if (r->t_begin < t_begin)
                t_begin = r->t_begin;
            if (r->t_end > t_end)
                t_end = r->t_end;
        }
    }
    if (started < n && sum->fatal == 0) {
        sum->fatal = CONVD_EINTERNAL;
        snprintf(sum->error, sizeof(sum->error), "only %d of %d clients started", started, n);
    }
    double rate_sum = 0, rate_min = INFINITY, rate_max = 0;
    int rated = 0;
    for (int i = 0; i < started; i++) {
        const struct bench_result *r = &res[i];
        if (r->t_end <= r->t_begin)
            continue;
        double rate = (double)r->completed / ((double)(r->t_end - r->t_begin) / 1e9);
        rate_sum += rate;
        rate_min = fmin(rate_min, rate);
        rate_max = fmax(rate_max, rate);
        rated++;
    }
    if (rated > 1 && rate_sum > 0) {
        sum->fair_min = rate_min / (rate_sum / rated);
        sum->fair_max = rate_max / (rate_sum / rated);
    }
    sum->seconds = t_end > t_begin ? (double)(t_end - t_begin) / 1e9 : 0;
    rc = 0;
finish:
    for (int i = 0; i < 2; i++) {
        if (ready[i] >= 0)
            close(ready[i]);
        if (go[i] >= 0)
            close(go[i]);
        if (done[i] >= 0)
            close(done[i]);
        if (release[i] >= 0)
            close(release[i]);
    }
    convd_close(snap);
    free(pids);
    munmap(res, shared_len);
    return rc;
}

/* The daemon's status and handshake information (checked before the runs). */
static int bench_status(const struct ctl_global *g, struct convd_status *st,
                        struct convd_server_info *info)
{
    convd_client *c;
    if (ctl_connect(g, &c) != 0)
        return -1;
    int rc = convd_status_get(c, st);
    if (rc != 0)
        ctl_err("status: %s (%s)", convd_errstr(c), convd_status_name(rc));
    if (info != NULL)
        convd_server_info(c, info);
    convd_close(c);
    return rc != 0 ? -1 : 0;
}

/* "1: 40%, 2: 35%, 4: 25%": the six most frequent batch sizes in increasing order (the rest as
 * "other"), and the mean batch size a request saw. */
static void bench_batches(const struct bench_sum *s, char *buf, size_t len, double *ret_mean)
{
    enum { SHOW = 6 };
    uint64_t total = 0;
    double acc = 0;
    size_t top[SHOW];
    int ntop = 0;
    for (size_t b = 0; b <= BENCH_BATCH_MAX; b++) {
        total += s->batch[b];
        acc += (double)b * (double)s->batch[b];
        if (s->batch[b] == 0)
            continue;
        /* Keep the SHOW largest counts. */
        if (ntop < SHOW) {
            top[ntop++] = b;
            continue;
        }
        int min = 0;
        for (int i = 1; i < SHOW; i++)
            if (s->batch[top[i]] < s->batch[top[min]])
                min = i;
        if (s->batch[b] > s->batch[top[min]])
            top[min] = b;
    }
    *ret_mean = total > 0 ? acc / (double)total : 0;
    buf[0] = '\0';
    if (total == 0)
        return;
    /* Increasing batch size. */
    for (int i = 1; i < ntop; i++)
        for (int j = i; j > 0 && top[j] < top[j - 1]; j--) {
            size_t t = top[j];
            top[j] = top[j - 1];
            top[j - 1] = t;
        }
    size_t n = 0;
    uint64_t shown = 0;
    for (int i = 0; i < ntop; i++) {
        shown += s->batch[top[i]];
        n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%s%zu: %.0f%%", i > 0 ? ", " : "",
                              top[i] == BENCH_BATCH_MAX ? ">=" : "", top[i],
                              100.0 * (double)s->batch[top[i]] / (double)total);
    }
    if (shown < total)
        snprintf(buf + n, n < len ? len - n : 0, ", other: %.0f%%",
                 100.0 * (double)(total - shown) / (double)total);
}

/* The daemon's batches between the snapshots (0: unknown). */
static uint64_t bench_batch_count(const struct bench_sum *s)
{
    if (!s->before.ok || !s->after.ok || s->after.batches < s->before.batches)
        return 0;
    return s->after.batches - s->before.batches;
}

static void bench_report(const char *name, const struct bench_params *bp, const struct bench_sum *s,
                         const struct convd_server_info *info)
{
    const uint64_t batches = bench_batch_count(s);
    double cpu_us;
    uint64_t cpu_reqs;
    const bool have_cpu = bench_cpu_per_req(s, &cpu_us, &cpu_reqs);
    char desc[192], b1[32], b2[32], b3[32], hist[256];
    double rps = s->seconds > 0 ? (double)s->completed / s->seconds : 0;
    double mean_batch;
    bench_batches(s, hist, sizeof(hist), &mean_batch);
    printf("bench %s: %s\n", name, convd_problem_str(&bp->p, desc, sizeof(desc)));
    printf("  clients    %d x depth %d%s", bp->clients, bp->depth,
           bp->gated ? " (gated chains)" : "");
    if (bp->gap_ns > 0)
        printf(", %llu us between a completion and the next word",
               (unsigned long long)(bp->gap_ns / 1000u));
    if (bp->distinct > 1)
        printf(", %d activations in turn", bp->distinct);
    printf(", %s backend (%s)", info->backend, info->device);
    if (bp->memory_gpu)
        printf(", tensors in GPU memory of device %d", bp->device);
    printf("\n");
    printf("  requests   %llu completed, %llu failed, in %.2f s\n",
           (unsigned long long)s->completed, (unsigned long long)s->failed, s->seconds);
    printf("  throughput %.1f requests/s, %.1f images/s, %.3f TFLOP/s\n", rps, rps * bp->p.n,
           rps * (double)bp->z.flops / 1e12);
    printf("  latency    p50 %s, p99 %s, p99.9 %s (%s to completion, per request)\n",
           ctl_fmt_ns(bench_percentile(s->lat, s->completed, 0.50), b1, sizeof(b1)),
           ctl_fmt_ns(bench_percentile(s->lat, s->completed, 0.99), b2, sizeof(b2)),
           ctl_fmt_ns(bench_percentile(s->lat, s->completed, 0.999), b3, sizeof(b3)),
           bp->gated ? "ready word" : "submit");
    if (s->completed > 0)
        printf("  daemon     queue %s, exec %s (means); batch sizes %s (mean %.2f per request)\n",
               ctl_fmt_ns((double)s->queue_ns / (double)s->completed, b1, sizeof(b1)),
               ctl_fmt_ns((double)s->exec_ns / (double)s->completed, b2, sizeof(b2)), hist,
               mean_batch);
    double device_ns;
    if (bench_device(s, &device_ns))
        printf("  device     %s per batch on the device (mean; the daemon's batch_timing)\n",
               ctl_fmt_ns(device_ns, b1, sizeof(b1)));
    if (have_cpu)
        printf("  daemon cpu  %.1f us per request (user+sys, all threads; %llu requests)\n", cpu_us,
               (unsigned long long)cpu_reqs);
    else
        printf("  daemon cpu  n/a (%s)\n",
               !s->before.ok || !s->after.ok ? "the daemon's counters could not be read"
               : cpu_reqs == 0               ? "the daemon served no requests meanwhile"
                                             : "the daemon does not export "
                                               "process_cpu_seconds_total");
    if (batches > 0)
        printf("  counters   %llu batches run by the daemon meanwhile\n",
               (unsigned long long)batches);
    struct bench_loop_use u;
    if (bench_loop(s, &u))
        printf("  loop       busy %.0f%% of the time, its CPU %.0f%%; launching %.0f%%, rings "
               "%.0f%%, ready words %.0f%%, completions %.0f%% (doorbells %.0f%%, dispatch "
               "%.0f%%), device queries %.0f%%, libuv %.0f%%\n",
               u.busy * 100, u.cpu * 100, u.launch * 100, u.step[0] * 100, u.step[6] * 100,
               u.step[1] * 100, u.step[4] * 100, u.step[5] * 100, u.step[2] * 100,
               u.step[3] * 100);
    if (s->fair_max > 0)
        printf("  fairness   per-client requests/s from %+.1f%% to %+.1f%% of the mean\n",
               (s->fair_min - 1) * 100, (s->fair_max - 1) * 100);
    if (s->error[0] != '\0')
        printf("  error      %s\n", s->error);
}

/* One line of JSON for a measured shape. */
static void bench_json(const char *name, const struct bench_params *bp, const struct bench_sum *s,
                       const struct convd_server_info *info)
{
    const struct convd_problem *p = &bp->p;
    const double rps = s->seconds > 0 ? (double)s->completed / s->seconds : 0;
    double mean_batch, cpu_us;
    uint64_t cpu_reqs;
    char hist[256];
    bench_batches(s, hist, sizeof(hist), &mean_batch);
    const bool have_cpu = bench_cpu_per_req(s, &cpu_us, &cpu_reqs);
    struct ctl_json j;
    ctl_json_begin(&j);
    ctl_json_str(&j, "name", name);
    ctl_json_problem(&j, p, &bp->z);
    ctl_json_int(&j, "clients", bp->clients);
    ctl_json_int(&j, "depth", bp->depth);
    ctl_json_str(&j, "memory", bp->memory_gpu ? "gpu" : "host");
    ctl_json_bool(&j, "gated", bp->gated);
    ctl_json_int(&j, "distinct", bp->distinct);
    ctl_json_int(&j, "gap_us", (long long)(bp->gap_ns / 1000u));
    if (bp->memory_gpu)
        ctl_json_int(&j, "gpu_device", bp->device);
    ctl_json_str(&j, "backend", info->backend);
    ctl_json_str(&j, "device", info->device);
    ctl_json_u64(&j, "completed", s->completed);
    ctl_json_u64(&j, "failed", s->failed);
    ctl_json_num(&j, "seconds", s->seconds);
    ctl_json_num(&j, "req_per_s", rps);
    ctl_json_num(&j, "images_per_s", rps * p->n);
    ctl_json_num(&j, "tflops", rps * (double)bp->z.flops / 1e12);
    ctl_json_num(&j, "p50_us", bench_percentile(s->lat, s->completed, 0.50) / 1e3);
    ctl_json_num(&j, "p99_us", bench_percentile(s->lat, s->completed, 0.99) / 1e3);
    ctl_json_num(&j, "p999_us", bench_percentile(s->lat, s->completed, 0.999) / 1e3);
    ctl_json_num(&j, "mean_batch", mean_batch);
    ctl_json_num(&j, "queue_us",
                 s->completed > 0 ? (double)s->queue_ns / (double)s->completed / 1e3 : 0);
    ctl_json_num(&j, "exec_us",
                 s->completed > 0 ? (double)s->exec_ns / (double)s->completed / 1e3 : 0);
    ctl_json_u64(&j, "batches", bench_batch_count(s));
    double device_ns;
    ctl_json_num(&j, "device_us", bench_device(s, &device_ns) ? device_ns / 1e3 : NAN);
    ctl_json_num(&j, "daemon_cpu_us_per_req", have_cpu ? cpu_us : NAN);
    struct bench_loop_use u;
    const bool have_loop = bench_loop(s, &u);
    ctl_json_num(&j, "loop_busy", have_loop ? u.busy : NAN);
    ctl_json_num(&j, "loop_cpu", have_loop ? u.cpu : NAN);
    ctl_json_num(&j, "loop_launch", have_loop ? u.launch : NAN);
    for (size_t i = 0; i < BENCH_STEPS; i++) {
        char key[32];
        snprintf(key, sizeof(key), "loop_%s", bench_steps[i]);
        ctl_json_num(&j, key, have_loop ? u.step[i] : NAN);
    }
    ctl_json_num(&j, "fair_min", s->fair_max > 0 ? s->fair_min : NAN);
    ctl_json_num(&j, "fair_max", s->fair_max > 0 ? s->fair_max : NAN);
    ctl_json_u64(&j, "daemon_requests", cpu_reqs);
    ctl_json_str(&j, "error", s->error[0] != '\0' ? s->error : NULL);
    ctl_json_end(&j);
}

int cmd_bench(const struct ctl_global *g0, int argc, char **argv)
{
    enum {
        B_CLIENTS = 1,
        B_DEPTH,
        B_DURATION,
        B_REQUESTS,
        B_SHAPE,
        B_CSV,
        B_ALL,
        B_MEMORY,
        B_GATED,
        B_DISTINCT,
        B_GAP,
        B_JSON
    };
    static const struct option opts[] = {
        CTL_COMMON_LONG_OPTIONS,
        {"clients", required_argument, NULL, B_CLIENTS},
        {"depth", required_argument, NULL, B_DEPTH},
        {"duration", required_argument, NULL, B_DURATION},
        {"requests", required_argument, NULL, B_REQUESTS},
        {"shape", required_argument, NULL, B_SHAPE},
        {"csv", required_argument, NULL, B_CSV},
        {"all", no_argument, NULL, B_ALL},
        {"memory", required_argument, NULL, B_MEMORY},
        {"gated", no_argument, NULL, B_GATED},
        {"distinct", required_argument, NULL, B_DISTINCT},
        {"gap-us", required_argument, NULL, B_GAP},
        {"json", no_argument, NULL, B_JSON},
        CTL_PROBLEM_LONG_OPTIONS_END,
    };
    struct ctl_global g = *g0;
    struct bench_params bp;
    memset(&bp, 0, sizeof(bp));
    bp.clients = 4;
    bp.depth = 2;
    bp.distinct = 1;
    bp.duration_s = 5;
    const char *shape_name = NULL, *csv = NULL;
    bool all = false, duration_given = false, json = false;
    struct {
        int opt;
        const char *arg;
    } popts[64];
    size_t npopts = 0;
    int opt, code = 0;
    long long v;
    char why[160];

    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (ctl_common_option(&g, opt, optarg, &code)) {
            if (code != 0)
                return code;
            continue;
        }
        if (opt >= CTL_OPT_PROBLEM_FIRST &&
            opt < CTL_OPT_PROBLEM_FIRST + CTL_PROBLEM_OPTION_COUNT) {
            if (npopts == sizeof(popts) / sizeof(popts[0])) {
                ctl_err("too many shape options");
                return CTL_EXIT_USAGE;
            }
            popts[npopts].opt = opt;
            popts[npopts++].arg = optarg;
            continue;
        }
        switch (opt) {
        case 'h':
            fputs(bench_usage, stdout);
            return 0;
        case B_CLIENTS:
        case B_DEPTH:
            if (cli_parse_int(optarg, 1, opt == B_CLIENTS ? 1024 : 65536, &v, why, sizeof(why)) !=
                0) {
                ctl_err("--%s: %s", opt == B_CLIENTS ? "clients" : "depth", why);
                return CTL_EXIT_USAGE;
            }
            *(opt == B_CLIENTS ? &bp.clients : &bp.depth) = (int)v;
            break;
        case B_DURATION:
            if (cli_parse_double(optarg, 0.01, 86400, &bp.duration_s, why, sizeof(why)) != 0) {
                ctl_err("--duration: %s", why);
                return CTL_EXIT_USAGE;
            }
            duration_given = true;
            break;
        case B_REQUESTS:
            if (cli_parse_int(optarg, 1, INT64_MAX, &v, why, sizeof(why)) != 0) {
                ctl_err("--requests: %s", why);
                return CTL_EXIT_USAGE;
            }
            bp.requests = (uint64_t)v;
            break;
        case B_SHAPE:
            shape_name = optarg;
            break;
        case B_CSV:
            csv = optarg;
            break;
        case B_ALL:
            all = true;
            break;
        case B_MEMORY:
            if (strcmp(optarg, "host") == 0) {
                bp.memory_gpu = false;
            } else if (strcmp(optarg, "gpu") == 0) {
                bp.memory_gpu = true;
            } else {
                ctl_err("--memory: '%s' is not host or gpu", optarg);
                return CTL_EXIT_USAGE;
            }
            break;
        case B_GATED:
            bp.gated = true;
            break;
        case B_DISTINCT:
            if (cli_parse_int(optarg, 1, 7, &v, why, sizeof(why)) != 0) {
                ctl_err("--distinct: %s", why);
                return CTL_EXIT_USAGE;
            }
            bp.distinct = (int)v;
            break;
        case B_GAP:
            if (cli_parse_int(optarg, 0, 1000000, &v, why, sizeof(why)) != 0) {
                ctl_err("--gap-us: %s", why);
                return CTL_EXIT_USAGE;
            }
            bp.gap_ns = (uint64_t)v * 1000u;
            break;
        case B_JSON:
            json = true;
            break;
        default:
            return ctl_bad_option(argv, opts, "bench");
        }
    }
    if (optind < argc) {
        ctl_err("unexpected argument '%s'", argv[optind]);
        return CTL_EXIT_USAGE;
    }
    /* The GPU the clients allocate on is the one whose daemon they talk to. */
    bp.device = g.device >= 0 ? g.device : 0;
    if (bp.gap_ns > 0 && !bp.gated) {
        ctl_err("--gap-us needs --gated");
        return CTL_EXIT_USAGE;
    }
    if (duration_given && bp.requests != 0) {
        ctl_err("--duration and --requests exclude each other");
        return CTL_EXIT_USAGE;
    }
    if ((shape_name != NULL || all) && csv == NULL) {
        ctl_err("--%s needs --csv FILE", all ? "all" : "shape");
        return CTL_EXIT_USAGE;
    }
    if (shape_name != NULL && all) {
        ctl_err("--shape and --all exclude each other");
        return CTL_EXIT_USAGE;
    }
    if (csv != NULL && shape_name == NULL && !all) {
        ctl_err("--csv needs --shape NAME or --all");
        return CTL_EXIT_USAGE;
    }
    if (bp.requests != 0 && bp.requests < (uint64_t)bp.clients) {
        ctl_err("--requests %llu is fewer than --clients %d", (unsigned long long)bp.requests,
                bp.clients);
        return CTL_EXIT_USAGE;
    }

    /* The rows to run: one CSV row, every row, or the problem from options alone. */
    struct cli_shape *rows = NULL;
    size_t nrows = 0;
    if (csv != NULL && ctl_load_shapes(csv, &rows, &nrows) != 0)
        return CTL_EXIT_FAIL;
    size_t first = 0, last = all ? nrows : 1;
    if (shape_name != NULL) {
        const struct cli_shape *row = cli_shapes_find(rows, nrows, shape_name);
        if (row == NULL) {
            ctl_err("%s has no shape called '%s'", csv, shape_name);
            free(rows);
            return CTL_EXIT_USAGE;
        }
        first = (size_t)(row - rows);
        last = first + 1;
    }

    struct convd_status st0;
    struct convd_server_info info;
    code = CTL_EXIT_FAIL;
    if (bench_status(&g, &st0, &info) != 0)
        goto finish;
    if (info.max_inflight != 0 && (uint32_t)bp.depth > info.max_inflight) {
        ctl_err("--depth %d is more than the %u requests the daemon allows in flight per client",
                bp.depth, info.max_inflight);
        code = CTL_EXIT_USAGE;
        goto finish;
    }
    if (bp.gated && info.protocol_version < 3) {
        ctl_err("--gated: the daemon speaks protocol %u, and gates came with protocol 3",
                info.protocol_version);
        goto finish;
    }
    if (bp.memory_gpu) {
        /* The daemon first: only its GPU backend opens GPU memory. Then the runtime, loaded here
         * (not initialised: the children do that after the fork). */
        if (strcmp(info.backend, "gpu") != 0) {
            ctl_err("--memory gpu: the daemon runs the %s backend (%s), which cannot use GPU "
                    "memory; start it with --backend gpu on a machine with a GPU",
                    info.backend, info.device);
            goto finish;
        }
        char gwhy[1024];
        if (gpumem_open(gwhy, sizeof(gwhy)) != 0) {
            ctl_err("--memory gpu: %s", gwhy);
            goto finish;
        }
    }
    bp.wait_ms = g.timeout_ms > 60000 ? g.timeout_ms : 60000;
    /* A child that dies must not take the parent with it through a closed pipe. */
    signal(SIGPIPE, SIG_IGN);
    struct bench_sum *sum = malloc(sizeof(*sum));
    if (sum == NULL) {
        ctl_err("out of memory");
        goto finish;
    }
    if (all && !json)
        printf("%-22s %10s %11s %8s %10s %10s %10s %6s %9s\n", "shape", "req/s", "images/s",
               "TFLOP/s", "p50", "p99", "p99.9", "batch", "cpu/req");
    code = 0;
    for (size_t i = first; i < last; i++) {
        const char *name = "options";
        ctl_default_problem(&bp.p);
        if (rows != NULL) {
            cli_shape_apply(&rows[i], &bp.p);
            name = rows[i].name;
        }
        unsigned given = 0;
        int ecode = 0;
        for (size_t j = 0; j < npopts; j++) {
            ctl_problem_option(&bp.p, &given, popts[j].opt, popts[j].arg, &ecode);
            if (ecode != 0) {
                code = ecode;
                goto done;
            }
        }
        if (convd_problem_sizes(&bp.p, &bp.z, why, sizeof(why)) != 0) {
            ctl_err("%s: invalid problem: %s", name, why);
            code = CTL_EXIT_FAIL;
            continue;
        }
        if (bench_run(&g, &bp, sum) != 0) {
            code = CTL_EXIT_FAIL;
            goto done;
        }
        if (json) {
            bench_json(name, &bp, sum, &info);
            if (sum->error[0] != '\0')
                ctl_err("bench %s: %s", name, sum->error);
        } else if (all) {
            char b1[32], b2[32], b3[32], cpu[32];
            double rps = sum->seconds > 0 ? (double)sum->completed / sum->seconds : 0, mb, cpu_us;
            uint64_t cpu_reqs;
            char hist[256];
            bench_batches(sum, hist, sizeof(hist), &mb);
            if (bench_cpu_per_req(sum, &cpu_us, &cpu_reqs))
                snprintf(cpu, sizeof(cpu), "%.1f us", cpu_us);
            else
                snprintf(cpu, sizeof(cpu), "n/a");
            printf("%-22s %10.1f %11.1f %8.3f %10s %10s %10s %6.2f %9s%s%s\n", name, rps,
                   rps * bp.p.n, rps * (double)bp.z.flops / 1e12,
                   ctl_fmt_ns(bench_percentile(sum->lat, sum->completed, 0.50), b1, sizeof(b1)),
                   ctl_fmt_ns(bench_percentile(sum->lat, sum->completed, 0.99), b2, sizeof(b2)),
                   ctl_fmt_ns(bench_percentile(sum->lat, sum->completed, 0.999), b3, sizeof(b3)),
                   mb, cpu, sum->error[0] != '\0' ? "  " : "", sum->error);
            fflush(stdout);
        } else {
            bench_report(name, &bp, sum, &info);
        }
        if (sum->fatal != 0 || sum->failed != 0)
            code = CTL_EXIT_FAIL;
    }
done:
    free(sum);
finish:
    free(rows);
    return code;
}
