/*
 * Soak: a real daemon (CPU backend, 2 threads) under bounded, randomised load for --seconds, to
 * find what only time finds: memory, descriptors, mappings or regions that leak a little per
 * connection, gauges that drift, a crash after the thousandth odd disconnect.
 *
 * The parent keeps --clients client processes and --hostile hostile processes alive, forking a
 * replacement whenever one ends:
 * - a client connects through the library (rings on or off, spinning or not, at random), runs
 *   rounds of random small problems (every dtype and layout, bias, ReLU, groups:
 *   tu_random_problem) in one or two regions with 1 to 8 requests in flight, and checks every
 *   completed output against the naive reference; then it closes cleanly, closes with requests
 *   in flight, or _exit()s with requests in flight; the parent SIGKILLs one now and then;
 * - a hostile process speaks the raw protocol (raw.h): garbage, truncated and oversized
 *   datagrams, descriptors on empty datagrams, bad descriptors in registrations, corrupt ring
 *   indices, bad ring entries, requests naming unregistered regions or tensors out of bounds,
 *   duplicate ids, messages before Hello, a wrong version, connections abandoned with work in
 *   flight; each must get its documented answer (a ProtocolError, a RegionReply, RingReply or
 *   Completion code) or its documented disconnect. A harness assertion in a hostile process
 *   prints its message and aborts (CMOCKA_TEST_ABORT), which the parent reports.
 *
 * Every second the parent samples the daemon: VmRSS (and its anonymous and shared parts),
 * descriptors, memfd and ring mappings from /proc, and regions, mapped bytes, queue depth,
 * requests in flight and clients from its metrics (one CSV row each with --csv). At the end it
 * stops every process, waits until the daemon is back at the baseline it had with only the
 * monitor connected (no region, no mapping but the monitor's ring, as many descriptors, one
 * client, nothing in flight), bounds the growth of its RSS since the warm-up, scans the daemon's
 * log for sanitizer reports, and requires SIGTERM to give exit status 0.
 *
 * Exit status: 0 pass, 1 failure (a wrong output, an unexpected status or answer, a process that
 * died unexpectedly, the daemon's death, a metric not back to its baseline), 2 bad usage.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "raw.h"
#include "wire.h"

/*
 * Options.
 */

static const char usage[] =
    "Usage: convd-soak [--seconds S] [--clients N] [--hostile H] [--csv FILE]\n"
    "                  [--daemon-log FILE] [--warmup S] [--rss-bound-mb M] [--kill-ms MS]\n"
    "                  [--threads T] [--replay SEED | --replay-hostile SEED]\n"
    "\n"
    "Starts convd (CPU backend) and keeps N client processes and H hostile processes running\n"
    "against it for S seconds, checking every output and every answer; samples the daemon every\n"
    "second; at the end requires it back at its baseline and a clean exit on SIGTERM.\n"
    "\n"
    "  --seconds S       duration of the load (default 120)\n"
    "  --clients N       client processes kept alive (default 24, at most 64)\n"
    "  --hostile H       hostile processes kept alive (default 2, at most 8)\n"
    "  --csv FILE        one row per second: time, RSS, descriptors, mappings, gauges, totals\n"
    "  --daemon-log FILE where the daemon's stderr goes (default /tmp/convd-soak-daemon-PID.log);\n"
    "                    scanned for sanitizer reports at the end\n"
    "  --warmup S        the RSS the end is compared with is taken after S seconds (default: a\n"
    "                    tenth of the run, 10 to 60 s)\n"
    "  --rss-bound-mb M  how far the RSS may be above the warm-up's at the end (default 32)\n"
    "  --kill-ms MS      mean interval between SIGKILLs of a random process (default 1000)\n"
    "  --threads T       the daemon's CPU backend threads (default 2)\n"
    "  --replay SEED     run only the client process of this seed (as a failure prints it),\n"
    "                    once, with no kills, then the end's checks; --seconds caps it\n"
    "  --replay-hostile SEED  the same for a hostile process\n"
    "The seed comes from $CONVD_TEST_SEED (printed at the start).\n";

struct soak_opts {
    int seconds;
    int clients;
    int hostile;
    const char *csv;
    const char *daemon_log;
    int warmup;
    int rss_bound_mb;
    int kill_ms;
    const char *threads;
    bool replay;          /* one process of a given seed, once */
    uint64_t replay_seed; /* its seed */
};

#define SOAK_MAX_CLIENTS 64
#define SOAK_MAX_HOSTILE 8

/*
 * State shared by the parent and every child (an anonymous shared mapping made before the first
 * fork). Children add to the counters as they go, so that a killed child's work still counts.
 */

/* Status codes 0 .. -27 are counted at index -code; anything else at the last index. */
#define SOAK_CODES 32

/* How a client ends (the parent's SIGKILL is counted by the parent). */
enum soak_end {
    END_CLEAN,          /* waits for everything, frees its regions, closes */
    END_CLOSE_INFLIGHT, /* convd_close() with requests in flight and regions registered */
    END_EXIT_INFLIGHT,  /* _exit() with requests in flight */
    END_COUNT
};
static const char *const end_names[END_COUNT] = {"clean", "closed with requests in flight",
                                                 "_exit with requests in flight"};

/* Hostile actions. */
enum h_kind {
    H_GARBAGE,      /* undecodable datagrams: ProtocolError EPROTO each */
    H_TRUNCATED,    /* a request cut short: EPROTO; then whole: runs, output checked */
    H_OVERSIZED,    /* a datagram over 64 KiB: ETOOBIG */
    H_FDS,          /* descriptors on empty datagrams and on a Ping: EPROTO, ETOOBIG, Pong */
    H_BAD_REGIONS,  /* unsealed memfds, pipes, short files, no or two fds: RegionReply codes */
    H_BAD_REFS,     /* unregistered regions, out-of-bounds tensors, bad shapes: Completions */
    H_RING_CORRUPT, /* impossible sq_tail / cq_head: ProtocolError "ring corrupt", closed */
    H_RING_ENTRIES, /* bad ring entries: Completions on the socket; good ones in the ring */
    H_FLOOD,        /* protocol errors until the daemon closes the connection */
    H_BEFORE_HELLO, /* messages before Hello: EPROTO; then Hello works */
    H_VERSION,      /* Hello with another protocol version: EVERSION, closed */
    H_DUP_ID,       /* the same request id twice: EEXIST (or both run when the first was done) */
    H_ABANDON,      /* regions and requests (socket and ring), then close without reading */
    H_SILENT,       /* connect and say nothing: closed after hello_timeout_ms */
    H_COUNT
};
static const char *const h_names[H_COUNT] = {
    "garbage",  "truncated",    "oversized",    "fds",   "bad-regions",
    "bad-refs", "ring-corrupt", "ring-entries", "flood", "before-hello",
    "version",  "dup-id",       "abandon",      "silent"};

struct soak_shared {
    atomic_int stop; /* the parent asks clients to finish cleanly */
    _Atomic uint64_t connects, connects_rings, regions, submitted, checked, checked_raw, queries;
    _Atomic uint64_t ends[END_COUNT];
    _Atomic uint64_t conditioned; /* outputs that needed the per-element bound (see below) */
    _Atomic uint64_t worst_ratio; /* their largest |out - ref| / sum|x*w|, in 1e-12 units */
    _Atomic uint64_t client_status[SOAK_CODES]; /* clients' completions by status: only OK */
    _Atomic uint64_t hostile_actions[H_COUNT];
    _Atomic uint64_t hostile_answers[SOAK_CODES]; /* documented answers hostile actions got */
    _Atomic uint64_t hostile_disconnects;         /* documented disconnects they got */
    _Atomic uint64_t failures;
    atomic_int error_taken;
    char error[1024]; /* the first failure's sentence */
};

static struct soak_shared *sh;
static struct it_daemon daemon_;
static pid_t parent_pid;
static uint64_t child_seed; /* in a child: its seed, for its messages */

static int code_index(int status)
{
    return status <= 0 && status > -(SOAK_CODES - 1) ? -status : SOAK_CODES - 1;
}

static void soak_record_error(const char *msg)
{
    atomic_fetch_add(&sh->failures, 1);
    if (atomic_exchange(&sh->error_taken, 1) == 0)
        snprintf(sh->error, sizeof(sh->error), "%s", msg);
}

static int child_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A client's failure: printed with its pid and seed, recorded, returned as its exit code. */
static int child_fail(int code, const char *fmt, ...)
{
    char msg[900], line[1000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(line, sizeof(line), "client %d (seed %llu): %s", (int)getpid(),
             (unsigned long long)child_seed, msg);
    fprintf(stderr, "soak: %s\n", line);
    soak_record_error(line);
    return code;
}

/*
 * Checking outputs. it_case_ok measures the relative L2 error against the output's own norm.
 * When ReLU zeroes most outputs and the rest are sums that cancel to far less than their terms
 * (a random problem with a handful of outputs), fp32 accumulation order alone exceeds its 1e-4:
 * the first 2-minute run here met "relative error 4.7e-4, element 3: got 9.58126e-06, want
 * 9.57678e-06", an absolute error of 4.5e-9 in a sum of 18 products of values up to 1. Such an
 * output is then held to the bound any correct summation meets, per element:
 * |out - ref| <= tol * (sum |x*w| + |bias|) (+ the smallest fp16 subnormal for fp16 outputs),
 * where tol is the dtype's tolerance; an indexing or data error is of the order of that sum, so
 * it still fails. Outputs that need this bound are counted and reported.
 */

/* Copies n elements of a tensor with their sign bits cleared: |v| in fp32, fp16 and bf16. */
static void *abs_copy(enum convd_dtype dtype, const uint8_t *src, size_t n)
{
    size_t esz = convd_dtype_size(dtype);
    uint8_t *dst = malloc(n * esz + 1);
    if (dst == NULL)
        abort();
    memcpy(dst, src, n * esz);
    for (size_t i = 0; i < n; i++) {
        if (esz == 4) {
            uint32_t v;
            memcpy(&v, dst + 4 * i, 4);
            v &= 0x7fffffffu;
            memcpy(dst + 4 * i, &v, 4);
        } else {
            uint16_t v;
            memcpy(&v, dst + 2 * i, 2);
            v &= 0x7fffu;
            memcpy(dst + 2 * i, &v, 2);
        }
    }
    return dst;
}

static bool conditioned_ok(const struct convd_problem *p, const struct convd_problem_sizes *z,
                           const uint8_t *in, const uint8_t *w, const uint8_t *b,
                           const uint8_t *out, const float *ref, char *why, size_t why_len)
{
    void *ain = abs_copy(p->dtype, in, z->input_elems);
    void *aw = abs_copy(p->dtype, w, z->weight_elems);
    void *ab = p->has_bias ? abs_copy(p->dtype, b, z->bias_elems) : NULL;
    float *mag = malloc(sizeof(float) * z->output_elems + 1);
    if (mag == NULL)
        abort();
    struct convd_problem pa = *p;
    tu_set_activation(&pa, CONVD_ACT_NONE); /* and its bounds: NONE with a clamp's is invalid */
    tu_ref_conv(&pa, ain, aw, ab, mag);
    const double tol = tu_tolerance(p->dtype);
    const double floor_abs = p->dtype == CONVD_DTYPE_FP16 ? 6e-8 : 1e-30;
    double worst = 0;
    bool ok = true;
    for (size_t i = 0; i < z->output_elems && ok; i++) {
        double o = tu_load(p->dtype, out, i), e = fabs(o - (double)ref[i]);
        double bound = tol * (double)mag[i] + floor_abs;
        if (!isfinite(o) || e > bound) {
            size_t len = strlen(why);
            snprintf(why + len, why_len - len,
                     "; element %zu is also outside the per-element bound: |%g - %g| > %g", i, o,
                     (double)ref[i], bound);
            ok = false;
        }
        double ratio = e / ((double)mag[i] + floor_abs);
        worst = ratio > worst ? ratio : worst;
    }
    free(ain);
    free(aw);
    free(ab);
    free(mag);
    if (ok) {
        atomic_fetch_add(&sh->conditioned, 1);
        uint64_t v = (uint64_t)(worst * 1e12), cur = atomic_load(&sh->worst_ratio);
        while (v > cur && !atomic_compare_exchange_weak(&sh->worst_ratio, &cur, v))
            ;
    }
    return ok;
}

/* A client's case: it_case_ok, else the per-element bound. */
static bool case_ok(const struct it_case *t, char *why, size_t why_len)
{
    if (it_case_ok(t, why, why_len))
        return true;
    const uint8_t *base = convd_region_data(t->region);
    return conditioned_ok(&t->p, &t->sz, base + t->off_in, base + t->off_w, base + t->off_b,
                          base + t->off_out, t->ref, why, why_len);
}

/*
 * Clients: the library, every output checked.
 */

struct soak_req {
    struct it_case t;
    uint64_t id;
    bool busy;
};

/* A finished round: 0 to go on, >0 a failure (exit code), -1 the client has closed already. */
#define ROUND_CLOSED (-1)

static int client_round(convd_client *c, struct tu_rng *g, enum soak_end how)
{
    const int depth = tu_rng_range(g, 1, 8);
    const int count = tu_rng_range(g, depth, 3 * depth);
    const int nregions = tu_rng_range(g, 1, 2);
    struct convd_problem probs[24];
    int where[24];
    uint64_t base[24], total[2] = {0, 0};
    for (int i = 0; i < count; i++) {
        tu_random_problem(g, &probs[i], 0, 0, tu_rng_range(g, 1, 8));
        where[i] = tu_rng_range(g, 0, nregions - 1);
        base[i] = total[where[i]];
        total[where[i]] += it_case_span(&probs[i]);
    }
    convd_region *regs[2] = {NULL, NULL};
    for (int r = 0; r < nregions; r++) {
        int rc = convd_region_create(c, total[r] > 0 ? total[r] : 64, &regs[r]);
        if (rc != 0) {
            int ret =
                child_fail(3, "convd_region_create(%llu): %s: %s", (unsigned long long)total[r],
                           convd_status_name(rc), convd_errstr(c));
            convd_region_free(regs[0]);
            return ret;
        }
        atomic_fetch_add(&sh->regions, 1);
    }
    struct soak_req *reqs = calloc((size_t)count, sizeof(*reqs));
    if (reqs == NULL)
        abort();
    for (int i = 0; i < count; i++)
        it_case_init(&reqs[i].t, regs[where[i]], base[i], &probs[i], g);

    /* With an abrupt end, the moment: after this many completions, with requests in flight. */
    const int abrupt_after = how == END_CLEAN ? -1 : tu_rng_range(g, 0, count - 1);
    int ret = 0, next = 0, inflight = 0, completed = 0;
    while (ret == 0 && (next < count || inflight > 0)) {
        while (ret == 0 && next < count && inflight < depth) {
            struct convd_conv_args a;
            it_case_args(&reqs[next].t, &a);
            a.priority = (unsigned)tu_rng_range(g, 0, 3);
            int rc = convd_conv_submit(c, &a, &reqs[next].id);
            if (rc != 0) {
                ret = child_fail(4, "convd_conv_submit: %s: %s", convd_status_name(rc),
                                 convd_errstr(c));
                break;
            }
            reqs[next].busy = true;
            atomic_fetch_add(&sh->submitted, 1);
            next++;
            inflight++;
        }
        if (ret != 0)
            break;
        if (completed == abrupt_after) {
            atomic_fetch_add(&sh->ends[how], 1);
            if (how == END_EXIT_INFLIGHT)
                _exit(0); /* no clean-up at all: the daemon must cope */
            convd_close(c);
            for (int i = 0; i < count; i++)
                it_case_fini(&reqs[i].t);
            free(reqs);
            return ROUND_CLOSED;
        }
        struct convd_completion done;
        int rc = convd_wait_any(c, TU_TIMEOUT_MS, &done);
        if (rc != 0) {
            ret = child_fail(5, "convd_wait_any with %d in flight: %s: %s", inflight,
                             convd_status_name(rc), convd_errstr(c));
            break;
        }
        atomic_fetch_add(&sh->client_status[code_index(done.status)], 1);
        int k = 0;
        while (k < count && !(reqs[k].busy && reqs[k].id == done.id))
            k++;
        if (k == count) {
            ret = child_fail(6, "completion for id %llu, which is not in flight",
                             (unsigned long long)done.id);
            break;
        }
        reqs[k].busy = false;
        inflight--;
        completed++;
        char desc[128], why[400];
        convd_problem_str(&reqs[k].t.p, desc, sizeof(desc));
        if (done.status != 0) {
            ret = child_fail(7, "request %llu (%s) failed: %s: %s", (unsigned long long)done.id,
                             desc, convd_status_name(done.status), done.error);
        } else if (!case_ok(&reqs[k].t, why, sizeof(why))) {
            ret = child_fail(8, "request %llu: wrong output: %s", (unsigned long long)done.id, why);
        } else {
            atomic_fetch_add(&sh->checked, 1);
        }
    }
    /* Now and then a control message between rounds (with rings, the library first waits for
     * the daemon to take every submission). */
    if (ret == 0 && tu_rng_range(g, 0, 7) == 0) {
        struct convd_status st;
        int rc = tu_rng_range(g, 0, 1) ? convd_ping(c, NULL) : convd_status_get(c, &st);
        if (rc != 0)
            ret = child_fail(9, "ping/status: %s: %s", convd_status_name(rc), convd_errstr(c));
        atomic_fetch_add(&sh->queries, 1);
    }
    for (int i = 0; i < count; i++)
        it_case_fini(&reqs[i].t);
    free(reqs);
    for (int r = 0; r < nregions; r++) {
        int rc = convd_region_free(regs[r]);
        if (rc != 0 && ret == 0)
            ret =
                child_fail(10, "convd_region_free: %s: %s", convd_status_name(rc), convd_errstr(c));
    }
    return ret;
}

static int client_main(void)
{
    struct tu_rng g;
    tu_rng_init(&g, child_seed);
    char name[48];
    snprintf(name, sizeof(name), "soak-client-%d", (int)getpid());
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = daemon_.sock;
    o.client_name = name;
    o.timeout_ms = TU_TIMEOUT_MS;
    o.use_rings = tu_rng_range(&g, 0, 1);
    o.spin_us = tu_rng_range(&g, 0, 1) ? 0 : 50;
    int pick = tu_rng_range(&g, 0, 99);
    enum soak_end end = pick < 50 ? END_CLEAN : pick < 75 ? END_CLOSE_INFLIGHT : END_EXIT_INFLIGHT;
    /* Most clients are short-lived (connection churn); some stay for many rounds (region
     * churn on one connection). */
    const int rounds = tu_rng_range(&g, 0, 3) ? tu_rng_range(&g, 1, 10) : tu_rng_range(&g, 10, 60);

    convd_client *c = NULL;
    int rc = convd_connect(&o, &c);
    if (rc != 0)
        return child_fail(2, "convd_connect (rings %d): %s: %s", o.use_rings, convd_status_name(rc),
                          convd_last_connect_error());
    atomic_fetch_add(&sh->connects, 1);
    if (o.use_rings)
        atomic_fetch_add(&sh->connects_rings, 1);
    for (int round = 0; round < rounds; round++) {
        bool stop = atomic_load(&sh->stop) != 0;
        bool last = stop || round == rounds - 1;
        int ret = client_round(c, &g, last && !stop ? end : END_CLEAN);
        if (ret == ROUND_CLOSED)
            return 0;
        if (ret != 0) {
            convd_close(c);
            return ret;
        }
        if (last)
            break;
    }
    atomic_fetch_add(&sh->ends[END_CLEAN], 1);
    convd_close(c);
    return 0;
}

/*
 * Hostile processes: raw.h, every answer checked. Their assertions go through cmocka, which
 * (with CMOCKA_TEST_ABORT=1) prints the message and aborts the process.
 */

static void h_answer(int status)
{
    atomic_fetch_add(&sh->hostile_answers[code_index(status)], 1);
}

static void h_disconnect(void)
{
    atomic_fetch_add(&sh->hostile_disconnects, 1);
}

static int h_conn(void)
{
    int fd = raw_connect(daemon_.sock);
    raw_hello(fd);
    return fd;
}

static void h_send_ping(int fd, uint64_t tag)
{
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__Ping ping = CONVD__PING__INIT;
    ping.tag = tag;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_PING;
    m.ping = &ping;
    raw_send(fd, &m, NULL, 0);
}

/* The connection still works: a Ping gets its Pong. */
static void h_pong(int fd, uint64_t tag)
{
    h_send_ping(fd, tag);
    Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_PONG);
    assert_int_equal(r->pong->tag, tag);
    raw_free(r);
}

static void h_perr(int fd, int status, const char *word)
{
    raw_expect_protocol_error(fd, status, word);
    h_answer(status);
}

/* The sentence exists and names the problem. */
static void h_sentence(const char *what, int status, const char *why, const char *word)
{
    if (strlen(why) < 8 || (word != NULL && !raw_contains(why, word)))
        fail_msg("%s: %s with sentence \"%s\", which does not name \"%s\"", what,
                 convd_status_name(status), why, word != NULL ? word : "");
}

/* The next message is a ProtocolError of this status naming both words, then (when `eof`) the
 * daemon closes the connection. For connections the daemon closes, whose datagrams of ours may
 * be unread (raw_recv_past_reset). */
static void h_perr_closing(int fd, int status, const char *word1, const char *word2)
{
    Convd__ServerMessage *r = raw_recv_past_reset(fd);
    if (r == NULL)
        fail_msg("the daemon closed the connection without a ProtocolError %s (\"%s\")",
                 convd_status_name(status), word2);
    if (r->msg_case != CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR)
        fail_msg("expected ProtocolError %s (\"%s\"), got message case %d",
                 convd_status_name(status), word2, (int)r->msg_case);
    const char *err = r->protocol_error->error != NULL ? r->protocol_error->error : "";
    if (r->protocol_error->status != status)
        fail_msg("ProtocolError %s (%s), want %s", convd_status_name(r->protocol_error->status),
                 err, convd_status_name(status));
    h_sentence("ProtocolError", status, err, word1);
    h_sentence("ProtocolError", status, err, word2);
    raw_free(r);
    h_answer(status);
    raw_expect_eof(fd);
    h_disconnect();
}

/* A region of the hostile process's own: a sealed memfd mapped here and registered. */
struct h_region {
    uint64_t id, size;
    uint8_t *map;
};

static void h_region_new(int fd, struct h_region *r, uint64_t id, uint64_t size)
{
    r->id = id;
    r->size = (size + 4095u) & ~(uint64_t)4095u;
    int mfd = tu_memfd("convd-it", r->size, 0);
    void *map = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    assert_true(map != MAP_FAILED);
    assert_int_equal(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    r->map = map;
    char why[256];
    int st = raw_register(fd, id, r->size, &mfd, 1, why, sizeof(why));
    close(mfd);
    if (st != 0)
        fail_msg("register region %llu (%llu bytes): %s: %s", (unsigned long long)id,
                 (unsigned long long)r->size, convd_status_name(st), why);
    atomic_fetch_add(&sh->regions, 1);
}

static void h_region_unmap(struct h_region *r)
{
    if (r->map != NULL)
        munmap(r->map, r->size);
    r->map = NULL;
}

/* A random request laid out back to back from offset 0 of a region (raw_conv_init), with
 * random inputs, a poisoned output and the reference. Never copied once made: the message
 * points into itself. */
struct h_case {
    struct raw_conv rc;
    struct convd_problem p;
    struct convd_problem_sizes z;
    uint64_t need;
    float *ref;
};

static void h_case_new(struct h_case *hc, struct tu_rng *g, uint64_t id, uint64_t region_id)
{
    memset(hc, 0, sizeof(*hc));
    tu_random_problem(g, &hc->p, 0, 0, 4);
    assert_int_equal(convd_problem_sizes(&hc->p, &hc->z, NULL, 0), 0);
    hc->need = raw_conv_init(&hc->rc, id, &hc->p, region_id);
}

/* (Re)builds the request message, for when a test changed it. */
static void h_case_reset(struct h_case *hc, uint64_t id, uint64_t region_id)
{
    raw_conv_init(&hc->rc, id, &hc->p, region_id);
}

static void h_case_fill(struct h_case *hc, struct tu_rng *g, const struct h_region *r)
{
    assert_true(hc->need <= r->size);
    const struct raw_conv *rc = &hc->rc;
    tu_fill_random(g, hc->p.dtype, r->map + rc->in.offset, hc->z.input_elems);
    tu_fill_random(g, hc->p.dtype, r->map + rc->w.offset, hc->z.weight_elems);
    if (hc->p.has_bias)
        tu_fill_random(g, hc->p.dtype, r->map + rc->b.offset, hc->z.bias_elems);
    tu_poison(r->map + rc->out.offset, hc->z.output_bytes);
    free(hc->ref);
    hc->ref = malloc(sizeof(float) * hc->z.output_elems);
    assert_non_null(hc->ref);
    tu_ref_conv(&hc->p, r->map + rc->in.offset, r->map + rc->w.offset,
                hc->p.has_bias ? r->map + rc->b.offset : NULL, hc->ref);
}

static void h_case_check(const struct h_case *hc, const struct h_region *r)
{
    size_t bad = 0;
    const uint8_t *out = r->map + hc->rc.out.offset;
    double err = tu_rel_error(hc->p.dtype, out, hc->ref, hc->z.output_elems, &bad);
    if (err > tu_tolerance(hc->p.dtype)) {
        char desc[128], why[600];
        convd_problem_str(&hc->p, desc, sizeof(desc));
        snprintf(why, sizeof(why),
                 "raw request %llu (%s): relative error %g > %g (element %zu: got %g, want %g)",
                 (unsigned long long)hc->rc.req.id, desc, err, tu_tolerance(hc->p.dtype), bad,
                 (double)tu_load(hc->p.dtype, out, bad), (double)hc->ref[bad]);
        const struct raw_conv *rc = &hc->rc;
        if (!conditioned_ok(&hc->p, &hc->z, r->map + rc->in.offset, r->map + rc->w.offset,
                            r->map + rc->b.offset, out, hc->ref, why, sizeof(why)))
            fail_msg("%s", why);
    }
    atomic_fetch_add(&sh->checked_raw, 1);
}

static void h_case_fini(struct h_case *hc)
{
    free(hc->ref);
    hc->ref = NULL;
}

/* Sends the request and asserts its completion's status and sentence. */
static void h_conv_expect(int fd, struct raw_conv *rc, int status, const char *word)
{
    raw_conv_send(fd, rc);
    char why[256];
    int st = raw_expect_completion(fd, rc->req.id, why, sizeof(why));
    if (st != status)
        fail_msg("request %llu: got %s (%s), want %s", (unsigned long long)rc->req.id,
                 convd_status_name(st), why, convd_status_name(status));
    if (status != 0)
        h_sentence("request", st, why, word);
    h_answer(st);
}

static void h_register_expect(int fd, uint64_t region_id, uint64_t size, const int *fds,
                              size_t nfds, int status, const char *word)
{
    char why[256];
    int st = raw_register(fd, region_id, size, fds, nfds, why, sizeof(why));
    if (st != status)
        fail_msg("register region %llu (size %llu, %zu fds): got %s (%s), want %s",
                 (unsigned long long)region_id, (unsigned long long)size, nfds,
                 convd_status_name(st), why, convd_status_name(status));
    if (status != 0)
        h_sentence("register", st, why, word);
    h_answer(st);
}

/* Sends one datagram with any number of descriptors (raw.h stops at SOCK_MAX_FDS). */
static int h_send_fds(int fd, const void *buf, size_t len, const int *fds, size_t nfds)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    size_t space = CMSG_SPACE(sizeof(int) * nfds);
    char *ctl = calloc(1, space);
    assert_non_null(ctl);
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = space};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    ssize_t n;
    do
        n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    free(ctl);
    return n < 0 ? -errno : 0;
}

/* One undecodable datagram of a random kind; returns its length. */
static size_t h_garbage(struct tu_rng *g, uint8_t *buf, size_t cap)
{
    size_t len = (size_t)tu_rng_range(g, 1, (int)cap);
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)tu_rng_next(g);
    switch (tu_rng_range(g, 0, 3)) {
    case 0:
        buf[0] = 0x00; /* field number 0 */
        break;
    case 1:
        buf[0] = 0x0f; /* wire type 7 */
        break;
    case 2: /* a varint that never ends */
        len = len < 16 ? 16 : len;
        memset(buf, 0xff, len);
        break;
    default: { /* field 4 declaring far more bytes than follow */
        const uint8_t longlen[] = {0x22, 0xff, 0xff, 0xff, 0x0f, 0x08, 0x01};
        memcpy(buf, longlen, sizeof(longlen));
        len = sizeof(longlen);
        break;
    }
    }
    return len;
}

static void h_do_garbage(struct tu_rng *g)
{
    int fd = h_conn();
    uint8_t buf[512];
    int n = tu_rng_range(g, 1, 8);
    for (int i = 0; i < n; i++) {
        size_t len = h_garbage(g, buf, sizeof(buf));
        raw_send_bytes(fd, buf, len);
        h_perr(fd, CONVD_EPROTO, NULL);
    }
    h_pong(fd, 1);
    close(fd);
}

static void h_do_truncated(struct tu_rng *g)
{
    int fd = h_conn();
    struct h_case hc;
    h_case_new(&hc, g, 5, 1);
    struct h_region r;
    h_region_new(fd, &r, 1, hc.need);
    h_case_fill(&hc, g, &r);
    size_t len = convd__client_message__get_packed_size(&hc.rc.msg);
    uint8_t *buf = malloc(len);
    assert_non_null(buf);
    assert_int_equal(convd__client_message__pack(&hc.rc.msg, buf), len);
    /* The message is one length-delimited field: every proper prefix is undecodable. */
    const size_t cuts[] = {1, (size_t)tu_rng_range(g, 1, (int)len - 1), len - 1};
    for (size_t i = 0; i < 3; i++) {
        raw_send_bytes(fd, buf, cuts[i]);
        h_perr(fd, CONVD_EPROTO, NULL);
    }
    free(buf);
    h_conv_expect(fd, &hc.rc, 0, NULL);
    h_case_check(&hc, &r);
    h_case_fini(&hc);
    close(fd);
    h_region_unmap(&r);
}

static void h_do_oversized(struct tu_rng *g)
{
    int fd = h_conn();
    int sz = 1 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
    size_t len =
        CONVD_MAX_MESSAGE_BYTES + 1 + (size_t)tu_rng_range(g, 0, 2 * (int)CONVD_MAX_MESSAGE_BYTES);
    uint8_t *big = calloc(1, len);
    assert_non_null(big);
    big[0] = 0x3a; /* a ping with a huge unknown field: well-formed, too large */
    raw_send_bytes(fd, big, len);
    free(big);
    h_perr(fd, CONVD_ETOOBIG, NULL);
    h_pong(fd, 2);
    close(fd);
}

static void h_do_fds(struct tu_rng *g)
{
    bool hello = tu_rng_range(g, 0, 1);
    int fd = hello ? h_conn() : raw_connect(daemon_.sock);
    enum { MANY = 40 };
    int fds[MANY];
    for (int i = 0; i < MANY; i++) {
        switch (i % 3) {
        case 0:
            fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
            break;
        case 1:
            fds[i] = tu_memfd("convd-it", 4096, F_SEAL_SHRINK | F_SEAL_GROW);
            break;
        default: {
            int p[2];
            assert_int_equal(pipe2(p, O_CLOEXEC), 0);
            close(p[1]);
            fds[i] = p[0];
            break;
        }
        }
        assert_true(fds[i] >= 0);
    }
    /* Up to SOCK_MAX_FDS on an empty datagram: "empty datagram", the descriptors closed. */
    int n = tu_rng_range(g, 1, 8);
    assert_int_equal(raw_send_bytes_fds(fd, "", 0, fds, (size_t)n), 0);
    h_perr(fd, CONVD_EPROTO, "empty");
    /* More than that: the datagram is refused whole (ETOOBIG), the descriptors closed. */
    n = tu_rng_range(g, 9, MANY);
    assert_int_equal(h_send_fds(fd, "", 0, fds, (size_t)n), 0);
    h_perr(fd, CONVD_ETOOBIG, NULL);
    if (!hello)
        raw_hello(fd);
    /* Descriptors on a message that takes none: closed, the message handled. */
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__Ping ping = CONVD__PING__INIT;
    ping.tag = 77;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_PING;
    m.ping = &ping;
    raw_send(fd, &m, fds, (size_t)tu_rng_range(g, 1, 8));
    Convd__ServerMessage *r = raw_recv(fd);
    if (r == NULL)
        fail_msg("a Ping with descriptors attached: the daemon closed the connection");
    if (r->msg_case == CONVD__SERVER_MESSAGE__MSG_PONG)
        assert_int_equal(r->pong->tag, 77);
    else if (r->msg_case == CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR)
        h_answer(r->protocol_error->status);
    else
        fail_msg("a Ping with descriptors attached: answered with message case %d",
                 (int)r->msg_case);
    raw_free(r);
    for (int i = 0; i < MANY; i++)
        close(fds[i]);
    h_pong(fd, 3);
    close(fd);
}

static void h_do_bad_regions(struct tu_rng *g)
{
    int fd = h_conn();
    uint64_t id = 10;
    const int cases = tu_rng_range(g, 2, 10);
    for (int k = 0; k < cases; k++, id++) {
        int mfd = -1;
        switch (tu_rng_range(g, 0, 9)) {
        case 0:
        case 1: { /* unsealed, or sealed against only one of shrinking and growing */
            const unsigned seals[] = {0, F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL};
            mfd = tu_memfd("convd-it", 8192, seals[tu_rng_range(g, 0, 3)]);
            h_register_expect(fd, id, 8192, &mfd, 1, CONVD_ESEAL, "seal");
            break;
        }
        case 2: { /* not a memfd */
            int p[2];
            assert_int_equal(pipe2(p, O_CLOEXEC), 0);
            h_register_expect(fd, id, 4096, &p[0], 1, CONVD_ESEAL, NULL);
            close(p[0]);
            close(p[1]);
            break;
        }
        case 3: /* shorter than declared */
            mfd = tu_memfd("convd-it", 4096, F_SEAL_SHRINK | F_SEAL_GROW);
            h_register_expect(fd, id, 8192 + (uint64_t)tu_rng_range(g, 0, 1 << 20), &mfd, 1,
                              CONVD_EBOUNDS, "size");
            break;
        case 4: /* size zero */
            mfd = tu_memfd("convd-it", 4096, F_SEAL_SHRINK | F_SEAL_GROW);
            h_register_expect(fd, id, 0, &mfd, 1, CONVD_EINVAL, "size");
            break;
        case 5: /* no descriptor */
            h_register_expect(fd, id, 4096, NULL, 0, CONVD_EINVAL, "descriptor");
            break;
        case 6: { /* two */
            int two[2] = {tu_memfd("convd-it", 4096, F_SEAL_SHRINK | F_SEAL_GROW),
                          tu_memfd("convd-it", 4096, F_SEAL_SHRINK | F_SEAL_GROW)};
            h_register_expect(fd, id, 4096, two, 2, CONVD_EINVAL, "descriptor");
            close(two[0]);
            close(two[1]);
            break;
        }
        case 7: { /* a GPU region on the CPU backend */
            Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
            Convd__RegisterRegion rr = CONVD__REGISTER_REGION__INIT;
            uint8_t handle[64] = {1, 2, 3};
            rr.region_id = id;
            rr.kind = CONVD__REGION_KIND__REGION_GPU_IPC;
            rr.size = 4096;
            rr.ipc_handle.data = handle;
            rr.ipc_handle.len = sizeof(handle);
            m.msg_case = CONVD__CLIENT_MESSAGE__MSG_REGISTER_REGION;
            m.register_region = &rr;
            raw_send(fd, &m, NULL, 0);
            Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_REGION_REPLY);
            if (r->region_reply->status != CONVD_EUNSUPPORTED)
                fail_msg("GPU region on a CPU daemon: %s (%s), want EUNSUPPORTED",
                         convd_status_name(r->region_reply->status), r->region_reply->error);
            h_answer(r->region_reply->status);
            raw_free(r);
            break;
        }
        case 8: { /* region kind 0 */
            mfd = tu_memfd("convd-it", 4096, F_SEAL_SHRINK | F_SEAL_GROW);
            Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
            Convd__RegisterRegion rr = CONVD__REGISTER_REGION__INIT;
            rr.region_id = id;
            rr.kind = CONVD__REGION_KIND__REGION_KIND_UNSPECIFIED;
            rr.size = 4096;
            m.msg_case = CONVD__CLIENT_MESSAGE__MSG_REGISTER_REGION;
            m.register_region = &rr;
            raw_send(fd, &m, &mfd, 1);
            Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_REGION_REPLY);
            if (r->region_reply->status != CONVD_EINVAL ||
                !raw_contains(r->region_reply->error, "kind"))
                fail_msg("region kind 0: %s (%s), want EINVAL naming the kind",
                         convd_status_name(r->region_reply->status), r->region_reply->error);
            h_answer(r->region_reply->status);
            raw_free(r);
            break;
        }
        default: { /* a good one, then the same id again, then unregistered twice */
            struct h_region r;
            h_region_new(fd, &r, id, 4096);
            mfd = tu_memfd("convd-it", 4096, F_SEAL_SHRINK | F_SEAL_GROW);
            char word[24];
            snprintf(word, sizeof(word), "%llu", (unsigned long long)id);
            h_register_expect(fd, id, 4096, &mfd, 1, CONVD_EEXIST, word);
            if (tu_rng_range(g, 0, 1)) {
                assert_int_equal(raw_unregister(fd, id), 0);
                int st = raw_unregister(fd, id);
                assert_int_equal(st, CONVD_ENOREGION);
                h_answer(st);
            }
            h_region_unmap(&r);
            break;
        }
        }
        if (mfd >= 0)
            close(mfd);
    }
    h_pong(fd, 4);
    close(fd); /* whatever is still registered is the daemon's to release */
}

static void h_do_bad_refs(struct tu_rng *g)
{
    int fd = h_conn();
    struct h_case hc;
    h_case_new(&hc, g, 100, 1);
    struct h_region r;
    h_region_new(fd, &r, 1, hc.need);
    struct raw_conv *rc = &hc.rc;
    uint64_t id = 100;
    const int cases = tu_rng_range(g, 2, 10);
    for (int k = 0; k < cases; k++) {
        h_case_reset(&hc, ++id, 1);
        switch (tu_rng_range(g, 0, 10)) {
        case 0:
            rc->in.region_id = 77;
            h_conv_expect(fd, rc, CONVD_ENOREGION, "region 77");
            break;
        case 1:
            rc->out.offset = r.size;
            h_conv_expect(fd, rc, CONVD_EBOUNDS, "output");
            break;
        case 2:
            rc->out.offset = UINT64_MAX - 3;
            h_conv_expect(fd, rc, CONVD_EBOUNDS, "output");
            break;
        case 3:
            rc->w.offset = (uint64_t)1 << 63;
            h_conv_expect(fd, rc, CONVD_EBOUNDS, "weight");
            break;
        case 4:
            rc->in.bytes += 4;
            h_conv_expect(fd, rc, CONVD_ESIZE, "input");
            break;
        case 5:
            rc->req.priority = 4 + (uint32_t)tu_rng_range(g, 0, 1000);
            h_conv_expect(fd, rc, CONVD_EINVAL, "priority");
            break;
        case 6:
            if (hc.p.has_bias) {
                rc->req.bias = NULL;
            } else {
                rc->b = rc->in;
                rc->req.bias = &rc->b;
            }
            h_conv_expect(fd, rc, CONVD_EINVAL, "bias");
            break;
        case 7:
            rc->prob.n = 0;
            h_conv_expect(fd, rc, CONVD_EBADSHAPE, "field n");
            break;
        case 8:
            rc->prob.dtype = (Convd__DType)9;
            h_conv_expect(fd, rc, CONVD_EBADSHAPE, "dtype");
            break;
        case 9:
            rc->out.offset = rc->in.offset;
            h_conv_expect(fd, rc, CONVD_EINVAL, "overlap");
            break;
        default:
            if (hc.p.groups > 1) {
                rc->prob.c += 1;
                h_conv_expect(fd, rc, CONVD_EGROUPS, "groups");
            } else {
                rc->in.offset += 1; /* not aligned to the element size */
                h_conv_expect(fd, rc, CONVD_EINVAL, "aligned");
            }
            break;
        }
    }
    /* And a good request on the same connection, its output checked. */
    h_case_reset(&hc, ++id, 1);
    h_case_fill(&hc, g, &r);
    h_conv_expect(fd, rc, 0, NULL);
    h_case_check(&hc, &r);
    h_case_fini(&hc);
    close(fd);
    h_region_unmap(&r);
}

/* Waits (bounded) until the daemon has taken submissions up to `want`. */
static void h_wait_sq_head(struct raw_ring *r, uint32_t want)
{
    uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
    while (atomic_load(&r->hdr->sq_head) != want) {
        if (tu_now_ms() > end)
            fail_msg("the daemon took %u of %u ring submissions", atomic_load(&r->hdr->sq_head),
                     want);
        tu_sleep_ms(1);
    }
}

/* A good request through the ring: its completion in the ring, its output checked. */
static void h_ring_good(int fd, struct raw_ring *ring, struct tu_rng *g, struct h_case *hc,
                        const struct h_region *r, uint64_t id)
{
    h_case_reset(hc, id, r->id);
    h_case_fill(hc, g, r);
    raw_ring_submit(fd, ring, &hc->rc);
    struct convd_ring_cqe cqe;
    char why[256];
    int st = raw_ring_expect_completion(fd, ring, id, &cqe, why, sizeof(why));
    if (st != 0 || cqe.id != id)
        fail_msg("ring request %llu: %s (%s)%s", (unsigned long long)id, convd_status_name(st), why,
                 cqe.id != id ? ", completed on the socket" : "");
    h_answer(st);
    h_case_check(hc, r);
}

static void h_do_ring_corrupt(struct tu_rng *g)
{
    int fd = h_conn();
    struct raw_ring ring;
    uint32_t entries = 1u << tu_rng_range(g, 0, 5);
    raw_ring_create(&ring, entries, entries);
    raw_ring_attach(fd, &ring);
    struct h_case hc;
    h_case_new(&hc, g, 1, 1);
    struct h_region r;
    h_region_new(fd, &r, 1, hc.need);
    for (uint64_t id = 1; id <= 2; id++)
        h_ring_good(fd, &ring, g, &hc, &r, id);
    if (tu_rng_range(g, 0, 1)) {
        /* sq_tail more than a ring ahead of sq_head, or behind it. */
        uint32_t ahead =
            tu_rng_range(g, 0, 1) ? entries + 1 + (uint32_t)tu_rng_range(g, 0, 1000) : UINT32_MAX;
        atomic_store(&ring.hdr->sq_tail, ring.sq_tail + ahead);
        atomic_thread_fence(memory_order_seq_cst);
        (void)raw_send_doorbell(fd);
        h_perr_closing(fd, CONVD_EPROTO, "ring corrupt", "sq_tail");
    } else {
        /* cq_head more than a ring behind cq_tail, or ahead of it; the daemon looks when it
         * takes the next submission. */
        uint32_t back =
            tu_rng_range(g, 0, 1) ? entries + 1 + (uint32_t)tu_rng_range(g, 0, 100) : UINT32_MAX;
        atomic_store(&ring.hdr->cq_head, ring.cq_head - back);
        h_case_reset(&hc, 3, 1);
        raw_ring_submit(fd, &ring, &hc.rc);
        (void)raw_send_doorbell(fd);
        h_perr_closing(fd, CONVD_EPROTO, "ring corrupt", "cq_head");
    }
    h_case_fini(&hc);
    close(fd);
    raw_ring_destroy(&ring);
    h_region_unmap(&r);
}

static void h_do_ring_entries(struct tu_rng *g)
{
    int fd = h_conn();
    struct raw_ring ring;
    raw_ring_create(&ring, 16, 16);
    raw_ring_attach(fd, &ring);
    struct h_case hc;
    h_case_new(&hc, g, 1, 1);
    struct h_region r;
    h_region_new(fd, &r, 1, hc.need);
    uint64_t id = 10;
    const int cases = tu_rng_range(g, 2, 10);
    for (int k = 0; k < cases; k++) {
        id++;
        if (tu_rng_range(g, 0, 2) == 0) {
            h_ring_good(fd, &ring, g, &hc, &r, id);
            continue;
        }
        h_case_reset(&hc, id, 1);
        struct convd_ring_sqe e;
        const char *word;
        int want;
        switch (tu_rng_range(g, 0, 5)) {
        case 0:
            raw_ring_sqe_from_conv(&hc.rc, &e);
            e.opcode = tu_rng_range(g, 0, 1) ? 0 : 7;
            want = CONVD_EPROTO, word = "opcode";
            break;
        case 1:
            raw_ring_sqe_from_conv(&hc.rc, &e);
            /* A bit above CONVD_RING_F_ALL: every one of them is unknown. */
            e.flags |= (CONVD_RING_F_ALL + 1u) << tu_rng_range(g, 0, 27);
            want = CONVD_EPROTO, word = "flags";
            break;
        case 2:
            raw_ring_sqe_from_conv(&hc.rc, &e);
            e.activation = 7u + (uint32_t)tu_rng_range(g, 0, 1000);
            want = CONVD_EBADSHAPE, word = "activation";
            break;
        case 3:
            hc.rc.in.region_id = 99;
            raw_ring_sqe_from_conv(&hc.rc, &e);
            want = CONVD_ENOREGION, word = "region 99";
            break;
        case 4:
            hc.rc.out.offset = r.size - hc.rc.out.bytes + 4;
            raw_ring_sqe_from_conv(&hc.rc, &e);
            want = CONVD_EBOUNDS, word = "output";
            break;
        default:
            hc.rc.w.bytes += 4;
            raw_ring_sqe_from_conv(&hc.rc, &e);
            want = CONVD_ESIZE, word = "weight";
            break;
        }
        raw_ring_put(&ring, &e);
        raw_ring_publish(fd, &ring);
        struct convd_ring_cqe cqe;
        char why[256];
        int st = raw_ring_expect_completion(fd, &ring, id, &cqe, why, sizeof(why));
        if (st != want || cqe.id != 0)
            fail_msg("bad ring entry %llu: %s (%s)%s, want %s on the socket",
                     (unsigned long long)id, convd_status_name(st), why,
                     cqe.id != 0 ? " in the ring" : "", convd_status_name(want));
        h_sentence("bad ring entry", st, why, word);
        h_answer(st);
    }
    /* Sometimes leave with good entries submitted and not waited for. */
    if (tu_rng_range(g, 0, 1)) {
        h_case_reset(&hc, ++id, 1);
        for (int i = 0; i < 4; i++, hc.rc.req.id++)
            raw_ring_submit(fd, &ring, &hc.rc);
    } else {
        h_pong(fd, 5);
    }
    h_case_fini(&hc);
    close(fd);
    raw_ring_destroy(&ring);
    h_region_unmap(&r);
}

static void h_do_flood(struct tu_rng *g)
{
    int fd = h_conn();
    uint8_t buf[512];
    /* max_protocol_errors (16) is the daemon's default; sending stops when it has closed. */
    for (int i = 0; i < 200; i++) {
        size_t len = h_garbage(g, buf, sizeof(buf));
        if (raw_send_bytes_fds(fd, buf, len, NULL, 0) != 0)
            break;
    }
    raw_expect_eof(fd);
    h_disconnect();
    close(fd);
}

static void h_do_before_hello(struct tu_rng *g)
{
    int fd = raw_connect(daemon_.sock);
    const int n = tu_rng_range(g, 1, 3);
    for (int i = 0; i < n; i++) {
        switch (tu_rng_range(g, 0, 2)) {
        case 0:
            h_send_ping(fd, 9);
            break;
        case 1: {
            struct h_case hc;
            h_case_new(&hc, g, 1, 1);
            raw_conv_send(fd, &hc.rc);
            break;
        }
        default: { /* a region, with its descriptor: refused, the descriptor not kept */
            int mfd = tu_memfd("convd-it", 4096, F_SEAL_SHRINK | F_SEAL_GROW);
            Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
            Convd__RegisterRegion rr = CONVD__REGISTER_REGION__INIT;
            rr.region_id = 1;
            rr.kind = CONVD__REGION_KIND__REGION_MEMFD;
            rr.size = 4096;
            m.msg_case = CONVD__CLIENT_MESSAGE__MSG_REGISTER_REGION;
            m.register_region = &rr;
            raw_send(fd, &m, &mfd, 1);
            close(mfd);
            break;
        }
        }
        h_perr(fd, CONVD_EPROTO, "hello");
    }
    raw_hello(fd);
    h_pong(fd, 6);
    close(fd);
}

static void h_do_version(struct tu_rng *g)
{
    const uint32_t versions[] = {0, CONVD_PROTOCOL_VERSION + 1, 0xffffffffu};
    uint32_t v = versions[tu_rng_range(g, 0, 2)];
    int fd = raw_connect(daemon_.sock);
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__Hello h = CONVD__HELLO__INIT;
    h.protocol_version = v;
    h.client_name = "soak-old";
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_HELLO;
    m.hello = &h;
    raw_send(fd, &m, NULL, 0);
    Convd__ServerMessage *r = raw_recv(fd);
    if (r == NULL)
        fail_msg("version %u: connection closed without a reply", v);
    int st = 0;
    const char *err = "";
    if (r->msg_case == CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY) {
        st = r->hello_reply->status;
        err = r->hello_reply->error;
    } else if (r->msg_case == CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR) {
        st = r->protocol_error->status;
        err = r->protocol_error->error;
    } else {
        fail_msg("version %u: unexpected reply case %d", v, (int)r->msg_case);
    }
    if (st != CONVD_EVERSION)
        fail_msg("version %u: got %s (%s), want EVERSION", v, convd_status_name(st), err);
    h_sentence("Hello", st, err, "version");
    raw_free(r);
    h_answer(st);
    raw_expect_eof(fd);
    h_disconnect();
    close(fd);
}

static void h_do_dup_id(struct tu_rng *g)
{
    int fd = h_conn();
    struct h_case hc;
    h_case_new(&hc, g, 42, 1);
    struct h_region r;
    h_region_new(fd, &r, 1, hc.need);
    h_case_fill(&hc, g, &r);
    /* Back to back: the second finds the first in flight (EEXIST, at once), unless the first
     * was already done when the daemon read it; then both run. */
    raw_conv_send(fd, &hc.rc);
    raw_conv_send(fd, &hc.rc);
    int ok = 0, exists = 0;
    for (int i = 0; i < 2; i++) {
        char why[256];
        int st = raw_expect_completion(fd, 42, why, sizeof(why));
        if (st == 0) {
            ok++;
        } else if (st == CONVD_EEXIST) {
            exists++;
            h_sentence("duplicate id", st, why, "42");
        } else {
            fail_msg("duplicate request id 42: %s (%s), want OK or EEXIST", convd_status_name(st),
                     why);
        }
        h_answer(st);
    }
    if (ok < 1 || exists > 1)
        fail_msg("duplicate request id 42: %d OK and %d EEXIST", ok, exists);
    h_case_check(&hc, &r);
    h_case_fini(&hc);
    close(fd);
    h_region_unmap(&r);
}

static void h_do_abandon(struct tu_rng *g)
{
    int fd = h_conn();
    struct raw_ring ring;
    bool rings = tu_rng_range(g, 0, 1);
    if (rings) {
        raw_ring_create(&ring, 8, 8);
        raw_ring_attach(fd, &ring);
    }
    struct h_case hc;
    h_case_new(&hc, g, 1, 1);
    const int nregions = tu_rng_range(g, 1, 3);
    struct h_region r[3];
    for (int i = 0; i < nregions; i++)
        h_region_new(fd, &r[i], (uint64_t)i + 1, hc.need);
    const int n = tu_rng_range(g, 0, 20);
    for (int i = 0; i < n; i++) {
        h_case_reset(&hc, (uint64_t)i + 1, (uint64_t)tu_rng_range(g, 1, nregions));
        if (rings && i < 8)
            raw_ring_submit(fd, &ring, &hc.rc);
        else
            raw_conv_send(fd, &hc.rc);
    }
    /* Sometimes until the daemon has taken the ring's submissions: they are its work then. */
    if (rings && tu_rng_range(g, 0, 1))
        h_wait_sq_head(&ring, ring.sq_tail);
    close(fd);
    if (rings)
        raw_ring_destroy(&ring);
    for (int i = 0; i < nregions; i++)
        h_region_unmap(&r[i]);
}

static void h_do_silent(void)
{
    int fd = raw_connect(daemon_.sock);
    raw_expect_eof(fd); /* after hello_timeout_ms (10 s by default) */
    h_disconnect();
    close(fd);
}

/* What a hostile process is doing, for the message when an assertion aborts it. */
static char h_doing[160];

static void h_on_abort(int sig)
{
    ssize_t n = write(2, h_doing, strlen(h_doing));
    (void)n;
    signal(sig, SIG_DFL);
    raise(sig);
}

static int hostile_main(void)
{
    struct tu_rng g;
    tu_rng_init(&g, child_seed);
    signal(SIGABRT, h_on_abort);
    const int actions = tu_rng_range(&g, 3, 12);
    for (int i = 0; i < actions && atomic_load(&sh->stop) == 0; i++) {
        /* Long waits are rare: "silent" holds the process for the hello timeout. */
        int kind = tu_rng_range(&g, 0, H_COUNT * 4 - 1) / 4;
        if (kind == H_SILENT && tu_rng_range(&g, 0, 3) != 0)
            kind = H_GARBAGE;
        atomic_fetch_add(&sh->hostile_actions[kind], 1);
        snprintf(h_doing, sizeof(h_doing),
                 "\nsoak: hostile process %d (seed %llu) failed in its action %d, \"%s\"\n",
                 (int)getpid(), (unsigned long long)child_seed, i + 1, h_names[kind]);
        switch ((enum h_kind)kind) {
        case H_GARBAGE:
            h_do_garbage(&g);
            break;
        case H_TRUNCATED:
            h_do_truncated(&g);
            break;
        case H_OVERSIZED:
            h_do_oversized(&g);
            break;
        case H_FDS:
            h_do_fds(&g);
            break;
        case H_BAD_REGIONS:
            h_do_bad_regions(&g);
            break;
        case H_BAD_REFS:
            h_do_bad_refs(&g);
            break;
        case H_RING_CORRUPT:
            h_do_ring_corrupt(&g);
            break;
        case H_RING_ENTRIES:
            h_do_ring_entries(&g);
            break;
        case H_FLOOD:
            h_do_flood(&g);
            break;
        case H_BEFORE_HELLO:
            h_do_before_hello(&g);
            break;
        case H_VERSION:
            h_do_version(&g);
            break;
        case H_DUP_ID:
            h_do_dup_id(&g);
            break;
        case H_ABANDON:
            h_do_abandon(&g);
            break;
        case H_SILENT:
        case H_COUNT:
            h_do_silent();
            break;
        }
        tu_sleep_ms(tu_rng_range(&g, 0, 200));
    }
    return 0;
}

/*
 * The parent: processes, kills, samples, the end.
 */

struct soak_proc {
    pid_t pid; /* 0: free slot */
    bool hostile;
    bool killed;   /* by us, with SIGKILL */
    uint64_t seed; /* its random choices, for messages */
};

static struct soak_proc procs[SOAK_MAX_CLIENTS + SOAK_MAX_HOSTILE];
static int nprocs;

/* What the parent counts. */
struct soak_totals {
    uint64_t forks, kills, hostile_kills, client_exits, hostile_exits;
    uint64_t bad_exits;
    int daemon_deaths;
    int daemon_status;
};
static struct soak_totals tot;

static volatile sig_atomic_t interrupted;

static uint64_t hostile_total(void)
{
    uint64_t n = 0;
    for (int i = 0; i < H_COUNT; i++)
        n += atomic_load(&sh->hostile_actions[i]);
    return n;
}

static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

static int parent_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int parent_fail(const char *fmt, ...)
{
    char msg[1000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "soak: FAIL: %s\n", msg);
    soak_record_error(msg);
    return 1;
}

static void soak_fork(struct soak_proc *p, bool hostile, uint64_t seed)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        parent_fail("fork: %s", strerror(errno));
        return;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent_pid)
            _exit(0);
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        signal(SIGINT, SIG_IGN); /* the parent decides when to stop */
        /* The monitor's connection is the parent's: drop this copy (no goodbye is sent). */
        convd_close(daemon_.mon);
        daemon_.mon = NULL;
        child_seed = seed;
        exit(hostile ? hostile_main() : client_main());
    }
    p->pid = pid;
    p->hostile = hostile;
    p->killed = false;
    p->seed = seed;
    tot.forks++;
}

/* Reaps every child that ended; the daemon's death is recorded. */
static void soak_reap(void)
{
    for (;;) {
        int st = 0;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid <= 0)
            return;
        if (pid == daemon_.pid) {
            daemon_.stopped = true;
            tot.daemon_deaths++;
            tot.daemon_status = st;
            if (WIFSIGNALED(st))
                parent_fail("the daemon died: killed by signal %d (%s)", WTERMSIG(st),
                            strsignal(WTERMSIG(st)));
            else
                parent_fail("the daemon died: exit status %d", WEXITSTATUS(st));
            continue;
        }
        struct soak_proc *p = NULL;
        for (int i = 0; i < nprocs; i++)
            if (procs[i].pid == pid)
                p = &procs[i];
        if (p == NULL)
            continue;
        bool killed = p->killed && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
        bool ok = (WIFEXITED(st) && WEXITSTATUS(st) == 0) || killed;
        if (killed && p->hostile)
            tot.hostile_kills++;
        else if (killed)
            tot.kills++;
        if (p->hostile)
            tot.hostile_exits++;
        else
            tot.client_exits++;
        if (!ok) {
            tot.bad_exits++;
            if (WIFSIGNALED(st))
                parent_fail("%s process %d (seed %llu) was killed by signal %d (%s)%s",
                            p->hostile ? "hostile" : "client", (int)pid,
                            (unsigned long long)p->seed, WTERMSIG(st), strsignal(WTERMSIG(st)),
                            WTERMSIG(st) == SIGABRT ? ": an assertion failed (message above)" : "");
            else
                parent_fail("%s process %d (seed %llu) exited with status %d (messages above)",
                            p->hostile ? "hostile" : "client", (int)pid,
                            (unsigned long long)p->seed, WEXITSTATUS(st));
        }
        p->pid = 0;
    }
}

static int soak_alive(bool hostile)
{
    int n = 0;
    for (int i = 0; i < nprocs; i++)
        if (procs[i].pid > 0 && procs[i].hostile == hostile)
            n++;
    return n;
}

/* SIGKILLs a random live process: a client four times in five, else a hostile one. */
static void soak_kill_one(struct tu_rng *g)
{
    bool hostile = tu_rng_range(g, 0, 4) == 0;
    int live[SOAK_MAX_CLIENTS + SOAK_MAX_HOSTILE], n = 0;
    for (int i = 0; i < nprocs; i++)
        if (procs[i].pid > 0 && !procs[i].killed && procs[i].hostile == hostile)
            live[n++] = i;
    if (n == 0)
        return;
    struct soak_proc *p = &procs[live[tu_rng_range(g, 0, n - 1)]];
    /* Counted when reaped, if it did die of it (it may have been exiting already). */
    if (kill(p->pid, SIGKILL) == 0)
        p->killed = true;
}

/*
 * Samples.
 */

struct soak_sample {
    double t;
    long rss_kb, anon_kb, shmem_kb;
    int fds, memfd_maps, ring_maps;
    double regions, mapped, queue, inflight, clients, ok_total, proto_errors;
    uint64_t checked;
    bool have_metrics;
};

/* The value of a sample line `name value` (name may carry labels) in Prometheus text. */
static bool metric_value(const char *text, const char *name, double *ret)
{
    size_t len = strlen(name);
    for (const char *line = text; line != NULL && *line != '\0';) {
        if (line[0] != '#' && strncmp(line, name, len) == 0 &&
            (line[len] == ' ' || line[len] == '\t')) {
            *ret = strtod(line + len, NULL);
            return true;
        }
        line = strchr(line, '\n');
        if (line != NULL)
            line++;
    }
    return false;
}

static uint64_t t0_ms;

static void soak_sample_take(struct soak_sample *s)
{
    memset(s, 0, sizeof(*s));
    s->t = (double)(tu_now_ms() - t0_ms) / 1000.0;
    s->rss_kb = it_proc_kb(daemon_.pid, "VmRSS");
    s->anon_kb = it_proc_kb(daemon_.pid, "RssAnon");
    s->shmem_kb = it_proc_kb(daemon_.pid, "RssShmem");
    s->fds = it_count_fds(daemon_.pid);
    s->memfd_maps = it_count_memfd_maps(daemon_.pid);
    s->ring_maps = it_count_ring_maps(daemon_.pid);
    s->checked = atomic_load(&sh->checked) + atomic_load(&sh->checked_raw);
    char *text = NULL;
    if (daemon_.stopped || convd_metrics_get(daemon_.mon, &text) != 0)
        return;
    s->have_metrics = metric_value(text, "convd_regions", &s->regions) &&
                      metric_value(text, "convd_mapped_bytes", &s->mapped) &&
                      metric_value(text, "convd_queue_depth", &s->queue) &&
                      metric_value(text, "convd_inflight", &s->inflight) &&
                      metric_value(text, "convd_clients", &s->clients);
    metric_value(text, "convd_requests_total{status=\"OK\"}", &s->ok_total);
    metric_value(text, "convd_protocol_errors_total", &s->proto_errors);
    free(text);
}

static void soak_csv_header(FILE *f)
{
    fprintf(f, "t_s,phase,rss_kb,rss_anon_kb,rss_shmem_kb,fds,memfd_maps,ring_maps,regions,"
               "mapped_bytes,queue_depth,inflight,clients,requests_ok_total,protocol_errors_total,"
               "checked,kills\n");
}

static void soak_csv_row(FILE *f, const char *phase, const struct soak_sample *s)
{
    if (f == NULL)
        return;
    fprintf(f, "%.1f,%s,%ld,%ld,%ld,%d,%d,%d,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%llu,%llu\n", s->t,
            phase, s->rss_kb, s->anon_kb, s->shmem_kb, s->fds, s->memfd_maps, s->ring_maps,
            s->regions, s->mapped, s->queue, s->inflight, s->clients, s->ok_total, s->proto_errors,
            (unsigned long long)s->checked, (unsigned long long)(tot.kills + tot.hostile_kills));
    fflush(f);
}

/* Minimum, maximum and sum of each sampled value during the load. */
struct soak_range {
    double min[10], max[10], sum[10];
    int n;
};

static void soak_values(const struct soak_sample *s, double v[10])
{
    v[0] = (double)s->rss_kb, v[1] = (double)s->anon_kb, v[2] = (double)s->fds;
    v[3] = s->memfd_maps, v[4] = s->ring_maps, v[5] = s->regions, v[6] = s->mapped / 1048576.0;
    v[7] = s->queue, v[8] = s->inflight, v[9] = s->clients;
}

static const char *const value_names[10] = {
    "VmRSS (kB)", "RssAnon (kB)", "descriptors", "memfd mappings", "ring mappings",
    "regions",    "mapped (MiB)", "queue depth", "in flight",      "clients"};

static void soak_range_add(struct soak_range *r, const struct soak_sample *s)
{
    double v[10];
    soak_values(s, v);
    for (int i = 0; i < 10; i++) {
        if (r->n == 0 || v[i] < r->min[i])
            r->min[i] = v[i];
        if (r->n == 0 || v[i] > r->max[i])
            r->max[i] = v[i];
        r->sum[i] += v[i];
    }
    r->n++;
}

/* Scans the daemon's log for sanitizer reports; returns how many lines look like one. */
static int soak_scan_log(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        parent_fail("cannot read the daemon's log %s: %s", path, strerror(errno));
        return 1;
    }
    static const char *const marks[] = {
        "ERROR: AddressSanitizer",    "ERROR: LeakSanitizer",      "runtime error:",
        "UndefinedBehaviorSanitizer", "SUMMARY: AddressSanitizer", "WARNING: AddressSanitizer"};
    char line[4096];
    int hits = 0;
    while (fgets(line, sizeof(line), f) != NULL)
        for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++)
            if (strstr(line, marks[i]) != NULL) {
                if (hits++ < 5)
                    fprintf(stderr, "soak: daemon log: %s", line);
                break;
            }
    fclose(f);
    return hits;
}

/* Waits until the daemon is back at its baseline (it_daemon_check_clean, without asserts).
 * Returns true when it is; *s holds the last sample either way. */
static bool soak_wait_clean(struct soak_sample *s, uint64_t timeout_ms)
{
    uint64_t end = tu_now_ms() + timeout_ms;
    for (;;) {
        soak_reap();
        soak_sample_take(s);
        if (daemon_.stopped)
            return false;
        if (s->have_metrics && s->clients == daemon_.base_clients && s->inflight == 0 &&
            s->queue == 0 && s->regions == 0 && s->mapped == 0 && s->fds == daemon_.base_fds &&
            s->memfd_maps == 0 && s->ring_maps == daemon_.base_ring_maps)
            return true;
        if (tu_now_ms() > end)
            return false;
        tu_sleep_ms(50);
    }
}

static void print_codes(const char *what, _Atomic uint64_t *codes)
{
    printf("soak: %s:", what);
    bool any = false;
    for (int i = 0; i < SOAK_CODES; i++) {
        uint64_t n = atomic_load(&codes[i]);
        if (n == 0)
            continue;
        printf(" %s %llu", i == SOAK_CODES - 1 ? "other" : convd_status_name(-i),
               (unsigned long long)n);
        any = true;
    }
    printf("%s\n", any ? "" : " none");
}

static int parse_int(const char *s, int lo, int hi, const char *what)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || end == s || v < lo || v > hi) {
        fprintf(stderr, "convd-soak: %s must be an integer from %d to %d, got '%s'\n", what, lo, hi,
                s);
        exit(2);
    }
    return (int)v;
}

static void parse_opts(int argc, char **argv, struct soak_opts *o)
{
    *o = (struct soak_opts){.seconds = 120,
                            .clients = 24,
                            .hostile = 2,
                            .warmup = -1,
                            .rss_bound_mb = 32,
                            .kill_ms = 1000,
                            .threads = "2"};
    static const struct option longopts[] = {{"seconds", required_argument, NULL, 's'},
                                             {"clients", required_argument, NULL, 'c'},
                                             {"hostile", required_argument, NULL, 'H'},
                                             {"csv", required_argument, NULL, 'o'},
                                             {"daemon-log", required_argument, NULL, 'l'},
                                             {"warmup", required_argument, NULL, 'w'},
                                             {"rss-bound-mb", required_argument, NULL, 'r'},
                                             {"kill-ms", required_argument, NULL, 'k'},
                                             {"threads", required_argument, NULL, 't'},
                                             {"replay", required_argument, NULL, 'p'},
                                             {"replay-hostile", required_argument, NULL, 'P'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    int ch;
    bool replay_hostile = false;
    while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (ch) {
        case 's':
            o->seconds = parse_int(optarg, 1, 7 * 24 * 3600, "--seconds");
            break;
        case 'c':
            o->clients = parse_int(optarg, 0, SOAK_MAX_CLIENTS, "--clients");
            break;
        case 'H':
            o->hostile = parse_int(optarg, 0, SOAK_MAX_HOSTILE, "--hostile");
            break;
        case 'o':
            o->csv = optarg;
            break;
        case 'l':
            o->daemon_log = optarg;
            break;
        case 'w':
            o->warmup = parse_int(optarg, 0, 3600, "--warmup");
            break;
        case 'r':
            o->rss_bound_mb = parse_int(optarg, 0, 1 << 20, "--rss-bound-mb");
            break;
        case 'k':
            o->kill_ms = parse_int(optarg, 0, 3600 * 1000, "--kill-ms");
            break;
        case 't':
            parse_int(optarg, 1, 1024, "--threads");
            o->threads = optarg;
            break;
        case 'p':
        case 'P': {
            char *end = NULL;
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (errno != 0 || end == optarg || *end != '\0') {
                fprintf(stderr, "convd-soak: %s wants a seed (a decimal number), got '%s'\n",
                        ch == 'p' ? "--replay" : "--replay-hostile", optarg);
                exit(2);
            }
            o->replay = true;
            o->replay_seed = v;
            replay_hostile = ch == 'P';
            break;
        }
        case 'h':
            fputs(usage, stdout);
            exit(0);
        default:
            fputs(usage, stderr);
            exit(2);
        }
    }
    if (optind != argc) {
        fprintf(stderr, "convd-soak: unexpected argument '%s'\n%s", argv[optind], usage);
        exit(2);
    }
    if (o->replay) {
        /* That process alone (a client, or a hostile one), and no kills. */
        o->clients = !replay_hostile;
        o->hostile = replay_hostile;
        o->kill_ms = 0;
    }
    if (o->warmup < 0) {
        o->warmup = o->seconds / 10;
        o->warmup = o->warmup < 10 ? 10 : o->warmup > 60 ? 60 : o->warmup;
    }
    if (o->warmup >= o->seconds)
        o->warmup = o->seconds / 2;
}

int main(int argc, char **argv)
{
    struct soak_opts o;
    parse_opts(argc, argv, &o);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    /* A harness assertion outside a cmocka test prints nothing and exits; with this it prints
     * its message and aborts, in the parent and in every child. */
    setenv("CMOCKA_TEST_ABORT", "1", 1);
    setvbuf(stdout, NULL, _IOLBF, 0);
    parent_pid = getpid();

    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("convd-soak: mmap");
        return 1;
    }
    memset(sh, 0, sizeof(*sh));

    uint64_t seed = tu_seed();
    struct tu_rng g;
    tu_rng_init(&g, seed);

    FILE *csv = NULL;
    if (o.csv != NULL && (csv = fopen(o.csv, "w")) == NULL) {
        fprintf(stderr, "convd-soak: cannot write %s: %s\n", o.csv, strerror(errno));
        return 2;
    }
    if (csv != NULL)
        soak_csv_header(csv);
    char log_default[64];
    if (o.daemon_log == NULL) {
        snprintf(log_default, sizeof(log_default), "/tmp/convd-soak-daemon-%d.log", (int)getpid());
        o.daemon_log = log_default;
    }

    /* The daemon, its stderr into the log. */
    int logfd = open(o.daemon_log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (logfd < 0) {
        fprintf(stderr, "convd-soak: cannot write %s: %s\n", o.daemon_log, strerror(errno));
        return 2;
    }
    fflush(stderr);
    int saved_stderr = dup(2);
    dup2(logfd, 2);
    close(logfd);
    const char *args[] = {"--backend",   "cpu",    "--threads", o.threads,
                          "--log-level", "notice", NULL};
    char why[256];
    int rc = it_daemon_spawn(&daemon_, args, "soak-monitor", why, sizeof(why));
    dup2(saved_stderr, 2);
    close(saved_stderr);
    if (rc != 0) {
        fprintf(stderr, "soak: FAIL: %s (its log: %s)\n", why, o.daemon_log);
        return 1;
    }
    printf("soak: convd pid %d on %s, log %s; %d s, %d clients, %d hostile, warm-up %d s, RSS "
           "bound +%d MB, a SIGKILL every %d ms on average, seed CONVD_TEST_SEED=%llu\n",
           (int)daemon_.pid, daemon_.sock, o.daemon_log, o.seconds, o.clients, o.hostile, o.warmup,
           o.rss_bound_mb, o.kill_ms, (unsigned long long)seed);
    if (o.replay)
        printf("soak: replaying the %s process of seed %llu, once, without kills\n",
               o.hostile ? "hostile" : "client", (unsigned long long)o.replay_seed);

    /* Warm up once (workers, lazily opened resources), then take the baseline with only the
     * monitor connected and nothing registered (it_daemon_start, without its asserts). */
    it_one_conv(daemon_.mon, &g);
    t0_ms = tu_now_ms();
    struct soak_sample base;
    uint64_t bend = tu_now_ms() + TU_TIMEOUT_MS;
    for (;;) {
        soak_sample_take(&base);
        if ((base.have_metrics && base.regions == 0 && base.memfd_maps == 0) || tu_now_ms() > bend)
            break;
        tu_sleep_ms(10);
    }
    if (!base.have_metrics || base.regions != 0 || base.memfd_maps != 0 || base.clients != 1 ||
        base.fds <= 0 || base.ring_maps < 0 || base.ring_maps > 1) {
        fprintf(stderr,
                "soak: FAIL: no baseline: metrics %s, %.0f regions, %d memfd maps, %.0f "
                "clients, %d fds, %d ring maps\n",
                base.have_metrics ? "read" : "not read", base.regions, base.memfd_maps,
                base.clients, base.fds, base.ring_maps);
        it_daemon_kill(&daemon_);
        return 1;
    }
    daemon_.base_clients = 1;
    daemon_.base_fds = base.fds;
    daemon_.base_ring_maps = base.ring_maps;
    soak_csv_row(csv, "baseline", &base);
    printf("soak: baseline: VmRSS %ld kB (anon %ld kB), %d descriptors, %d memfd and %d ring "
           "mappings, %.0f regions, %.0f clients\n",
           base.rss_kb, base.anon_kb, base.fds, base.memfd_maps, base.ring_maps, base.regions,
           base.clients);

    /* The load; or, replaying, the one process of the given seed (parse_opts made it the only
     * one and turned the kills off), forked once. */
    nprocs = o.clients + o.hostile;
    for (int i = 0; i < nprocs; i++)
        procs[i].hostile = i >= o.clients;
    if (o.replay)
        soak_fork(&procs[0], procs[0].hostile, o.replay_seed);
    const uint64_t end_ms = t0_ms + (uint64_t)o.seconds * 1000u;
    const uint64_t warm_ms = t0_ms + (uint64_t)o.warmup * 1000u;
    uint64_t next_sample = t0_ms + 1000, next_report = t0_ms + 10000;
    uint64_t last_progress_ms = t0_ms, last_checked = 0;
    struct soak_sample warm = {0}, s = {0};
    bool have_warm = false;
    struct soak_range run = {0};
    const int tick_ms = 20;
    while (!interrupted && tu_now_ms() < end_ms && atomic_load(&sh->failures) == 0) {
        soak_reap();
        if (daemon_.stopped)
            break;
        if (o.replay && procs[0].pid == 0)
            break; /* it ended, and soak_reap judged how */
        for (int i = 0; i < nprocs; i++)
            if (procs[i].pid == 0)
                soak_fork(&procs[i], procs[i].hostile, tu_rng_next(&g));
        if (o.kill_ms > 0 && tu_rng_range(&g, 0, o.kill_ms / tick_ms) == 0)
            soak_kill_one(&g);
        uint64_t now = tu_now_ms();
        if (now >= next_sample) {
            next_sample += 1000;
            soak_sample_take(&s);
            if (!s.have_metrics && !daemon_.stopped) {
                parent_fail("the daemon did not answer the monitor's metrics request: %s",
                            convd_errstr(daemon_.mon));
                break;
            }
            bool is_warm = !have_warm && now >= warm_ms;
            soak_csv_row(csv, is_warm ? "warm" : now < warm_ms ? "warmup" : "run", &s);
            if (is_warm) {
                warm = s;
                have_warm = true;
            }
            if (now >= warm_ms)
                soak_range_add(&run, &s);
            if (s.checked != last_checked) {
                last_checked = s.checked;
                last_progress_ms = now;
            } else if (o.clients > 0 && now - last_progress_ms > 60000) {
                parent_fail("no request completed for %llu s",
                            (unsigned long long)(now - last_progress_ms) / 1000);
                break;
            }
        }
        if (now >= next_report) {
            next_report += 10000;
            printf("soak: %3.0f s: %llu checked, %llu kills, %llu hostile actions, VmRSS %ld kB "
                   "(anon %ld kB), %d fds, %d memfd + %d ring maps, %.0f regions, queue %.0f, "
                   "in flight %.0f, %.0f clients\n",
                   s.t, (unsigned long long)s.checked, (unsigned long long)tot.kills,
                   (unsigned long long)hostile_total(), s.rss_kb, s.anon_kb, s.fds, s.memfd_maps,
                   s.ring_maps, s.regions, s.queue, s.inflight, s.clients);
        }
        tu_sleep_ms(tick_ms);
    }
    double ran_s = (double)(tu_now_ms() - t0_ms) / 1000.0;
    if (!have_warm) {
        soak_sample_take(&warm);
        have_warm = true;
    }

    /* The end: clients finish their round and close cleanly; hostile processes finish their
     * action. Then everything still there is killed, and counted as a failure. */
    atomic_store(&sh->stop, 1);
    uint64_t stop_end = tu_now_ms() + 2 * TU_TIMEOUT_MS;
    while (soak_alive(false) + soak_alive(true) > 0 && tu_now_ms() < stop_end) {
        soak_reap();
        tu_sleep_ms(tick_ms);
    }
    for (int i = 0; i < nprocs; i++)
        if (procs[i].pid > 0) {
            parent_fail("%s process %d did not finish within %d s of being asked to",
                        procs[i].hostile ? "hostile" : "client", (int)procs[i].pid,
                        2 * TU_TIMEOUT_MS / 1000);
            kill(procs[i].pid, SIGKILL);
            procs[i].killed = true;
            waitpid(procs[i].pid, NULL, 0);
            procs[i].pid = 0;
        }

    /* Flat: the daemon returns to its baseline. */
    struct soak_sample fin;
    bool clean = !daemon_.stopped && soak_wait_clean(&fin, TU_TIMEOUT_MS);
    if (daemon_.stopped)
        fin = s;
    soak_csv_row(csv, "end", &fin);
    if (!daemon_.stopped && !clean)
        parent_fail("the daemon did not return to its baseline: clients %.0f (want %u), in flight "
                    "%.0f, queue %.0f, regions %.0f, mapped bytes %.0f, fds %d (want %d), memfd "
                    "maps %d, ring maps %d (want %d)",
                    fin.clients, daemon_.base_clients, fin.inflight, fin.queue, fin.regions,
                    fin.mapped, fin.fds, daemon_.base_fds, fin.memfd_maps, fin.ring_maps,
                    daemon_.base_ring_maps);
    const long bound_kb = (long)o.rss_bound_mb * 1024;
    if (!daemon_.stopped && fin.rss_kb > warm.rss_kb + bound_kb)
        parent_fail("the daemon's VmRSS grew from %ld kB after the warm-up to %ld kB at the end "
                    "(bound +%d MB)",
                    warm.rss_kb, fin.rss_kb, o.rss_bound_mb);
    if (!daemon_.stopped && fin.anon_kb > warm.anon_kb + bound_kb)
        parent_fail("the daemon's RssAnon grew from %ld kB after the warm-up to %ld kB at the "
                    "end (bound +%d MB)",
                    warm.anon_kb, fin.anon_kb, o.rss_bound_mb);
    /* It still serves. */
    if (!daemon_.stopped && clean) {
        uint64_t rtt = 0;
        if (convd_ping(daemon_.mon, &rtt) != 0)
            parent_fail("the daemon does not answer a ping at the end: %s",
                        convd_errstr(daemon_.mon));
        else
            it_one_conv(daemon_.mon, &g);
    }
    if (csv != NULL)
        fclose(csv);

    /* Totals. */
    printf("soak: ran %.0f s (%s), %d clients and %d hostile processes at a time\n", ran_s,
           interrupted ? "interrupted" : "to the end", o.clients, o.hostile);
    printf("soak: requests: %llu submitted by clients, %llu completed and checked (and %llu of "
           "hostile processes), %llu pings/status between rounds\n",
           (unsigned long long)atomic_load(&sh->submitted),
           (unsigned long long)atomic_load(&sh->checked),
           (unsigned long long)atomic_load(&sh->checked_raw),
           (unsigned long long)atomic_load(&sh->queries));
    print_codes("clients' completions by status (only OK is right)", sh->client_status);
    printf("soak: outputs within the per-element bound only (cancellation): %llu, largest "
           "|out - ref| / sum|x*w| among them %.3g\n",
           (unsigned long long)atomic_load(&sh->conditioned),
           (double)atomic_load(&sh->worst_ratio) * 1e-12);
    printf("soak: clients: %llu processes, %llu connected (%llu with rings), %llu regions; ends: "
           "%llu %s, %llu %s, %llu %s, %llu SIGKILLed by the soak\n",
           (unsigned long long)tot.client_exits, (unsigned long long)atomic_load(&sh->connects),
           (unsigned long long)atomic_load(&sh->connects_rings),
           (unsigned long long)atomic_load(&sh->regions),
           (unsigned long long)atomic_load(&sh->ends[END_CLEAN]), end_names[END_CLEAN],
           (unsigned long long)atomic_load(&sh->ends[END_CLOSE_INFLIGHT]),
           end_names[END_CLOSE_INFLIGHT],
           (unsigned long long)atomic_load(&sh->ends[END_EXIT_INFLIGHT]),
           end_names[END_EXIT_INFLIGHT], (unsigned long long)tot.kills);
    uint64_t actions = 0;
    printf("soak: hostile actions:");
    for (int i = 0; i < H_COUNT; i++) {
        actions += atomic_load(&sh->hostile_actions[i]);
        printf(" %s %llu", h_names[i], (unsigned long long)atomic_load(&sh->hostile_actions[i]));
    }
    printf("; %llu in all, by %llu processes (%llu SIGKILLed)\n", (unsigned long long)actions,
           (unsigned long long)tot.hostile_exits, (unsigned long long)tot.hostile_kills);
    print_codes("documented answers hostile actions got", sh->hostile_answers);
    printf("soak: documented disconnects: %llu\n",
           (unsigned long long)atomic_load(&sh->hostile_disconnects));
    printf("soak: daemon: %.0f requests OK by its own count, %.0f protocol errors; restarts %d; "
           "unexpected process exits %llu\n",
           fin.ok_total, fin.proto_errors, tot.daemon_deaths, (unsigned long long)tot.bad_exits);
    printf("soak: %-16s %12s %12s %12s %12s %12s\n", "", "baseline", "warm-up", "run min",
           "run max", "end");
    double vb[10], vw[10], ve[10];
    soak_values(&base, vb);
    soak_values(&warm, vw);
    soak_values(&fin, ve);
    for (int i = 0; i < 10; i++)
        printf("soak: %-16s %12.0f %12.0f %12.0f %12.0f %12.0f\n", value_names[i], vb[i], vw[i],
               run.n ? run.min[i] : 0, run.n ? run.max[i] : 0, ve[i]);

    /* SIGTERM: a clean drain and exit status 0. */
    if (!daemon_.stopped) {
        convd_close(daemon_.mon);
        daemon_.mon = NULL;
        kill(daemon_.pid, SIGTERM);
        uint64_t wend = tu_now_ms() + TU_TIMEOUT_MS;
        int wst = 0;
        pid_t r;
        while ((r = waitpid(daemon_.pid, &wst, WNOHANG)) == 0 && tu_now_ms() < wend)
            tu_sleep_ms(10);
        daemon_.stopped = r == daemon_.pid;
        if (r != daemon_.pid)
            parent_fail("the daemon did not exit within %d s of SIGTERM", TU_TIMEOUT_MS / 1000);
        else if (WIFSIGNALED(wst))
            parent_fail("the daemon was killed by signal %d after SIGTERM", WTERMSIG(wst));
        else if (WEXITSTATUS(wst) != 0)
            parent_fail("the daemon exited with status %d after SIGTERM (want 0; a "
                        "LeakSanitizer report exits 23)",
                        WEXITSTATUS(wst));
        else
            printf("soak: SIGTERM: the daemon exited with status 0\n");
    }
    it_daemon_kill(&daemon_); /* removes the socket directory; kills only if still running */
    int reports = soak_scan_log(o.daemon_log);
    if (reports > 0)
        parent_fail("the daemon's log %s holds %d sanitizer report line(s)", o.daemon_log, reports);

    uint64_t failures = atomic_load(&sh->failures);
    if (failures != 0) {
        printf("soak: FAIL: %llu failure(s); the first: %s\n", (unsigned long long)failures,
               sh->error);
        return 1;
    }
    if (interrupted) {
        printf("soak: INTERRUPTED after %.0f s: no failure seen, but the run was cut short\n",
               ran_s);
        return 1;
    }
    printf("soak: PASS\n");
    return 0;
}
