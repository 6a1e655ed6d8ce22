/*
 * The daemon library end to end, in process: a convd_daemon runs on a thread of the test with the
 * CPU backend and a temporary socket, and the test speaks the wire protocol to it with raw
 * SOCK_SEQPACKET sockets. Covers the handshake, numeric results against the reference, batching
 * and priorities as seen through completions, deadlines, the queue bound, cancellation on
 * disconnect, refusals (allow-list, max_clients, Hello timeout), slow readers, the drain,
 * listener path handling, socket activation and the systemd notifications.
 *
 * Tests that need a busy worker submit one heavy request first; later requests are sent right
 * behind it and are certainly queued while it runs. Nothing asserts on speed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "config.h"
#include "daemon.h"
#include "insrv.h"
#include "listener.h"
#include "log.h"
#include "raw.h"
#include "sdnotify.h"
#include "sock.h"
#include "testutil.h"
#include "wire.h"

/* --- the daemon under test ---------------------------------------------------------------- */

static void srv_config(struct tu_srv *s)
{
    tu_srv_config(s, "convd-unit");
    s->cfg.max_batch = 8;
}

/* Stops the daemon as SIGTERM would and checks it exited cleanly and removed its socket. */
static void srv_stop(struct tu_srv *s)
{
    tu_srv_join(s);
    assert_int_equal(s->rc, 0);
    struct stat st;
    assert_int_equal(lstat(s->sock, &st), -1);
    rmdir(s->dir);
}

/* --- a raw client ------------------------------------------------------------------------- */

/* The helpers of tests/support/raw.h, and a send that may fail (the daemon hung up). */
static int cl_try_send(int fd, const Convd__ClientMessage *m)
{
    uint8_t buf[CONVD_MAX_MESSAGE_BYTES];
    int len = wire_pack_client(m, buf, sizeof(buf));
    assert_true(len >= 0);
    return raw_send_bytes_fds(fd, buf, (size_t)len, NULL, 0);
}

static void cl_send_hello_range(int fd, uint32_t min_version, uint32_t version)
{
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__Hello h = CONVD__HELLO__INIT;
    h.protocol_version = version;
    h.min_protocol_version = min_version;
    h.client_name = "unit\ntest"; /* a newline the daemon must not put in its log */
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_HELLO;
    m.hello = &h;
    raw_send(fd, &m, NULL, 0);
}

static void cl_send_hello(int fd, uint32_t version)
{
    cl_send_hello_range(fd, 0, version);
}

/* Connects and completes the handshake; returns the descriptor. */
static int cl_open(const struct tu_srv *s)
{
    int fd = raw_connect(s->sock);
    cl_send_hello(fd, CONVD_PROTOCOL_VERSION);
    Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY);
    if (r->hello_reply->status != 0)
        fail_msg("hello: %s", r->hello_reply->error);
    raw_free(r);
    return fd;
}

/* A region of `size` bytes registered as `id`, mapped here too. */
struct cl_region {
    uint64_t id;
    size_t size;
    uint8_t *data;
};

static void cl_region(int fd, uint64_t id, size_t size, struct cl_region *ret)
{
    int mfd = tu_memfd("convd-unit", size, F_SEAL_SHRINK | F_SEAL_GROW);
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__RegisterRegion rr = CONVD__REGISTER_REGION__INIT;
    rr.region_id = id;
    rr.kind = CONVD__REGION_KIND__REGION_MEMFD;
    rr.size = size;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_REGISTER_REGION;
    m.register_region = &rr;
    raw_send(fd, &m, &mfd, 1);
    Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_REGION_REPLY);
    if (r->region_reply->status != 0)
        fail_msg("register: %s", r->region_reply->error);
    raw_free(r);
    ret->id = id;
    ret->size = size;
    ret->data = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    assert_true(ret->data != MAP_FAILED);
    close(mfd);
}

static void cl_region_unmap(struct cl_region *r)
{
    munmap(r->data, r->size);
}

/* One convolution laid out in a region at base: input, weight, bias, output, 64-byte aligned. */
struct cl_case {
    struct convd_problem p;
    struct convd_problem_sizes sz;
    struct cl_region *reg;
    uint64_t off[4];
    uint64_t span;
    float *ref;
};

static uint64_t align64(uint64_t v)
{
    return (v + 63) & ~(uint64_t)63;
}

static void case_layout(struct cl_case *t, const struct convd_problem *p, struct cl_region *reg,
                        uint64_t base)
{
    memset(t, 0, sizeof(*t));
    t->p = *p;
    t->reg = reg;
    assert_int_equal(convd_problem_sizes(p, &t->sz, NULL, 0), 0);
    const uint64_t bytes[4] = {t->sz.input_bytes, t->sz.weight_bytes, t->sz.bias_bytes,
                               t->sz.output_bytes};
    uint64_t off = base;
    for (int i = 0; i < 4; i++) {
        t->off[i] = off;
        off = align64(off + bytes[i]);
    }
    t->span = off - base;
    assert_true(off <= reg->size);
}

static void case_fill(struct cl_case *t, struct tu_rng *g)
{
    uint8_t *d = t->reg->data;
    tu_fill_random(g, t->p.dtype, d + t->off[0], t->sz.input_elems);
    tu_fill_random(g, t->p.dtype, d + t->off[1], t->sz.weight_elems);
    if (t->p.has_bias)
        tu_fill_random(g, t->p.dtype, d + t->off[2], t->sz.bias_elems);
    tu_poison(d + t->off[3], t->sz.output_bytes);
    t->ref = malloc(t->sz.output_elems * sizeof(float));
    assert_non_null(t->ref);
    tu_ref_conv(&t->p, d + t->off[0], d + t->off[1], t->p.has_bias ? d + t->off[2] : NULL, t->ref);
}

static void case_check(const struct cl_case *t)
{
    size_t bad;
    double err =
        tu_rel_error(t->p.dtype, t->reg->data + t->off[3], t->ref, t->sz.output_elems, &bad);
    if (!(err <= tu_tolerance(t->p.dtype))) {
        char s[160];
        fail_msg("%s: relative error %g (element %zu)", convd_problem_str(&t->p, s, sizeof(s)), err,
                 bad);
    }
}

static void case_send(int fd, const struct cl_case *t, uint64_t id, unsigned prio,
                      uint64_t timeout_us)
{
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__ConvRequest rq = CONVD__CONV_REQUEST__INIT;
    Convd__Problem pb = CONVD__PROBLEM__INIT;
    Convd__TensorRef tr[4];
    const uint64_t bytes[4] = {t->sz.input_bytes, t->sz.weight_bytes, t->sz.bias_bytes,
                               t->sz.output_bytes};
    for (int i = 0; i < 4; i++) {
        convd__tensor_ref__init(&tr[i]);
        tr[i].region_id = t->reg->id;
        tr[i].offset = t->off[i];
        tr[i].bytes = bytes[i];
    }
    wire_problem_to_pb(&t->p, &pb);
    rq.id = id;
    rq.problem = &pb;
    rq.input = &tr[0];
    rq.weight = &tr[1];
    rq.bias = t->p.has_bias ? &tr[2] : NULL;
    rq.output = &tr[3];
    rq.priority = prio;
    rq.timeout_us = timeout_us;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_CONV;
    m.conv = &rq;
    raw_send(fd, &m, NULL, 0);
}

/* The next completion: its id, status and batch size. */
struct done {
    uint64_t id;
    int status;
    uint32_t batch;
    char error[256];
};

static struct done cl_completion(int fd)
{
    Convd__ServerMessage *m = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_COMPLETION);
    struct done d = {m->completion->id, m->completion->status, m->completion->batch_size, ""};
    snprintf(d.error, sizeof(d.error), "%s", m->completion->error);
    raw_free(m);
    return d;
}

/* A problem that keeps the CPU worker busy for a while (its output is never checked). */
static void heavy_problem(struct convd_problem *p)
{
    convd_problem_init(p, 8, 56, 56, 256, 256, 3, 3, 1);
    p->pad_top = p->pad_bottom = p->pad_left = p->pad_right = 1;
}

static double cl_metric(int fd, const char *name)
{
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__MetricsRequest mr = CONVD__METRICS_REQUEST__INIT;
    mr.tag = 77;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_METRICS;
    m.metrics = &mr;
    raw_send(fd, &m, NULL, 0);
    Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_METRICS_REPLY);
    assert_int_equal(r->metrics_reply->tag, 77);
    size_t nl = strlen(name);
    double v = -1;
    for (const char *line = r->metrics_reply->text; line != NULL && *line != '\0';) {
        if (strncmp(line, name, nl) == 0 && line[nl] == ' ') {
            v = strtod(line + nl + 1, NULL);
            break;
        }
        line = strchr(line, '\n');
        if (line != NULL)
            line++;
    }
    raw_free(r);
    if (v < 0)
        fail_msg("metric %s not found", name);
    return v;
}

/* Polls a metric until it has the value (bounded). */
static void cl_wait_metric(int fd, const char *name, double want)
{
    uint64_t end = convd_now_ns() + (uint64_t)TU_TIMEOUT_MS * 1000000u;
    double v;
    while ((v = cl_metric(fd, name)) != want) {
        if (convd_now_ns() > end)
            fail_msg("metric %s is %g, want %g", name, v, want);
        usleep(2000);
    }
}

static int quiet(void **state)
{
    (void)state;
    const char *lvl = getenv("CONVD_TEST_LOG");
    if (lvl == NULL || convd_log_parse_level(lvl, &convd_log_level) != 0)
        convd_log_level = LOG_LVL_ERR;
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

/* --- tests -------------------------------------------------------------------------------- */

static void test_handshake_and_queries(void **state)
{
    (void)state;
    struct tu_srv s;
    srv_config(&s);
    s.cfg.max_inflight = 77;
    s.cfg.max_regions = 9;
    s.cfg.max_mapped_bytes = 12345678;
    tu_srv_start(&s);

    int fd = raw_connect(s.sock);
    cl_send_hello(fd, CONVD_PROTOCOL_VERSION);
    Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY);
    Convd__HelloReply *h = r->hello_reply;
    assert_int_equal(h->status, 0);
    assert_int_equal(h->protocol_version, CONVD_PROTOCOL_VERSION);
    assert_string_equal(h->backend, "cpu");
    assert_non_null(strstr(h->device, "cpu"));
    assert_int_equal(h->max_inflight, 77);
    assert_int_equal(h->max_regions, 9);
    assert_int_equal(h->max_mapped_bytes, 12345678);
    assert_int_equal(h->max_batch, 8);
    assert_int_equal(h->max_message_bytes, CONVD_MAX_MESSAGE_BYTES);
    assert_true(strlen(h->server_version) > 0);
    raw_free(r);

    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__Ping ping = CONVD__PING__INIT;
    ping.tag = 0xfeedfacecafeull;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_PING;
    m.ping = &ping;
    raw_send(fd, &m, NULL, 0);
    r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_PONG);
    assert_true(r->pong->tag == 0xfeedfacecafeull);
    raw_free(r);

    Convd__StatusRequest sr = CONVD__STATUS_REQUEST__INIT;
    sr.tag = 5;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_STATUS;
    m.status = &sr;
    raw_send(fd, &m, NULL, 0);
    r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_STATUS_REPLY);
    assert_int_equal(r->status_reply->tag, 5);
    assert_int_equal(r->status_reply->clients, 1);
    assert_int_equal(r->status_reply->queue_depth, 0);
    assert_int_equal(r->status_reply->protocol_version, CONVD_PROTOCOL_VERSION);
    assert_string_equal(r->status_reply->backend, "cpu");
    raw_free(r);

    /* the exposition format: comments, then "name[{labels}] value" lines */
    assert_int_equal(cl_metric(fd, "convd_clients"), 1);
    assert_int_equal(cl_metric(fd, "convd_regions"), 0);
    assert_int_equal(cl_metric(fd, "convd_queue_depth"), 0);
    assert_int_equal(cl_metric(fd, "convd_batch_size_count"), 0);

    /* a second connection with the wrong version is told and closed */
    int old = raw_connect(s.sock);
    cl_send_hello(old, 7);
    r = raw_expect(old, CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY);
    assert_int_equal(r->hello_reply->status, CONVD_EVERSION);
    assert_non_null(strstr(r->hello_reply->error, "version 7"));
    /* the sentence names the range the daemon does speak, and the reply carries it */
    char range[64];
    snprintf(range, sizeof(range), "this daemon versions %u to %u", CONVD_PROTOCOL_VERSION_MIN,
             CONVD_PROTOCOL_VERSION);
    if (strstr(r->hello_reply->error, range) == NULL)
        fail_msg("'%s' does not name the range ('%s')", r->hello_reply->error, range);
    assert_int_equal(r->hello_reply->min_protocol_version, CONVD_PROTOCOL_VERSION_MIN);
    assert_int_equal(r->hello_reply->max_protocol_version, CONVD_PROTOCOL_VERSION);
    raw_free(r);
    raw_expect_eof(old);
    close(old);

    /* a newer client that still speaks this daemon's version gets it */
    int newer = raw_connect(s.sock);
    cl_send_hello_range(newer, CONVD_PROTOCOL_VERSION_MIN, CONVD_PROTOCOL_VERSION + 5);
    r = raw_expect(newer, CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY);
    assert_int_equal(r->hello_reply->status, 0);
    assert_int_equal(r->hello_reply->protocol_version, CONVD_PROTOCOL_VERSION);
    assert_int_equal(r->hello_reply->min_protocol_version, CONVD_PROTOCOL_VERSION_MIN);
    assert_int_equal(r->hello_reply->max_protocol_version, CONVD_PROTOCOL_VERSION);
    raw_free(r);
    close(newer);
    /* one that no longer does is told the range */
    int newest = raw_connect(s.sock);
    cl_send_hello_range(newest, CONVD_PROTOCOL_VERSION + 1, CONVD_PROTOCOL_VERSION + 5);
    r = raw_expect(newest, CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY);
    assert_int_equal(r->hello_reply->status, CONVD_EVERSION);
    assert_non_null(strstr(r->hello_reply->error, range));
    raw_free(r);
    raw_expect_eof(newest);
    close(newest);
    close(fd);
    srv_stop(&s);
}

/* Random problems of every dtype and layout, all submitted before any is awaited; each output
 * matches the reference. */
static void test_numeric(void **state)
{
    (void)state;
    struct tu_srv s;
    srv_config(&s);
    tu_srv_start(&s);
    int fd = cl_open(&s);
    struct tu_rng g;
    tu_rng_init(&g, tu_seed());
    enum { N = 24 };
    struct cl_case cases[N];
    struct convd_problem probs[N];
    uint64_t total = 0;
    for (int i = 0; i < N; i++) {
        tu_random_problem(&g, &probs[i], 0, 0, 6);
        struct cl_case tmp;
        struct cl_region fake = {0, UINT64_MAX, NULL};
        case_layout(&tmp, &probs[i], &fake, 0);
        total += tmp.span;
    }
    struct cl_region reg;
    cl_region(fd, 1, (size_t)total, &reg);
    uint64_t off = 0;
    for (int i = 0; i < N; i++) {
        case_layout(&cases[i], &probs[i], &reg, off);
        case_fill(&cases[i], &g);
        off += cases[i].span;
    }
    for (int i = 0; i < N; i++)
        case_send(fd, &cases[i], 1000 + (uint64_t)i, (unsigned)(i % 4), 0);
    bool seen[N] = {false};
    for (int i = 0; i < N; i++) {
        struct done d = cl_completion(fd);
        assert_true(d.id >= 1000 && d.id < 1000 + N);
        if (d.status != 0)
            fail_msg("request %llu: %s: %s", (unsigned long long)d.id, convd_status_name(d.status),
                     d.error);
        assert_false(seen[d.id - 1000]);
        seen[d.id - 1000] = true;
        assert_true(d.batch >= 1 && d.batch <= 8);
    }
    for (int i = 0; i < N; i++) {
        case_check(&cases[i]);
        free(cases[i].ref);
    }
    assert_int_equal(cl_metric(fd, "convd_regions"), 1);
    cl_region_unmap(&reg);
    close(fd);
    srv_stop(&s);
}

/* While the worker is busy: a priority-0 request overtakes lower ones, same-problem requests run
 * in batches of at most max_batch, and the lowest priority goes last. */
static void test_batching_and_priority(void **state)
{
    (void)state;
    struct tu_srv s;
    srv_config(&s);
    s.cfg.max_batch = 4;
    tu_srv_start(&s);
    int fd = cl_open(&s);
    struct tu_rng g;
    tu_rng_init(&g, tu_seed());

    struct convd_problem heavy, same, other, last;
    heavy_problem(&heavy);
    convd_problem_init(&same, 1, 9, 9, 8, 8, 3, 3, 4);
    convd_problem_init(&other, 2, 7, 7, 6, 6, 1, 1, 3);
    convd_problem_init(&last, 1, 5, 5, 2, 4, 3, 3, 1);
    struct cl_case hc;
    struct cl_region big, small;
    struct cl_region fake = {0, UINT64_MAX, NULL};
    case_layout(&hc, &heavy, &fake, 0);
    cl_region(fd, 1, (size_t)hc.span, &big);
    case_layout(&hc, &heavy, &big, 0);
    cl_region(fd, 2, 1 << 20, &small);
    struct cl_case sc[6], oc, lc;
    uint64_t off = 0;
    for (int i = 0; i < 6; i++) {
        case_layout(&sc[i], &same, &small, off);
        case_fill(&sc[i], &g);
        off += sc[i].span;
    }
    case_layout(&oc, &other, &small, off);
    case_fill(&oc, &g);
    off += oc.span;
    case_layout(&lc, &last, &small, off);
    case_fill(&lc, &g);

    case_send(fd, &hc, 1, 0, 0);
    case_send(fd, &lc, 30, 3, 0);
    for (int i = 0; i < 6; i++)
        case_send(fd, &sc[i], 10 + (uint64_t)i, 2, 0);
    case_send(fd, &oc, 20, 0, 0);

    struct done d = cl_completion(fd);
    assert_int_equal(d.id, 1);
    assert_int_equal(d.status, 0);
    d = cl_completion(fd);
    assert_int_equal(d.id, 20);
    assert_int_equal(d.batch, 1);
    int in_first = 0;
    for (int i = 0; i < 6; i++) {
        d = cl_completion(fd);
        assert_true(d.id >= 10 && d.id < 16);
        assert_int_equal(d.status, 0);
        assert_int_equal(d.batch, i < 4 ? 4 : 2);
        in_first += i < 4;
    }
    assert_int_equal(in_first, 4);
    d = cl_completion(fd);
    assert_int_equal(d.id, 30);
    assert_int_equal(d.batch, 1);
    for (int i = 0; i < 6; i++) {
        case_check(&sc[i]);
        free(sc[i].ref);
    }
    case_check(&oc);
    case_check(&lc);
    free(oc.ref);
    free(lc.ref);
    assert_int_equal(cl_metric(fd, "convd_batch_size_count"), 5);
    assert_int_equal(cl_metric(fd, "convd_batches_total"), 5);
    cl_region_unmap(&big);
    cl_region_unmap(&small);
    close(fd);
    srv_stop(&s);
}

/* A deadline that passes while the request waits fails it with ETIMEDOUT without running it; a
 * full queue refuses at once with EQUEUEFULL. */
static void test_deadline_and_queue_full(void **state)
{
    (void)state;
    struct tu_srv s;
    srv_config(&s);
    s.cfg.queue_limit = 3;
    tu_srv_start(&s);
    int fd = cl_open(&s);
    struct tu_rng g;
    tu_rng_init(&g, tu_seed());

    struct convd_problem heavy, p;
    heavy_problem(&heavy);
    convd_problem_init(&p, 1, 6, 6, 4, 4, 3, 3, 2);
    struct cl_case hc, c[5];
    struct cl_region fake = {0, UINT64_MAX, NULL}, big, small;
    case_layout(&hc, &heavy, &fake, 0);
    cl_region(fd, 1, (size_t)hc.span, &big);
    case_layout(&hc, &heavy, &big, 0);
    cl_region(fd, 2, 1 << 20, &small);
    uint64_t off = 0;
    for (int i = 0; i < 5; i++) {
        case_layout(&c[i], &p, &small, off);
        case_fill(&c[i], &g);
        off += c[i].span;
    }
    case_send(fd, &hc, 1, 0, 0);
    /* Deadline 1 ms: it expires while the heavy request runs. Its output stays poisoned. */
    case_send(fd, &c[0], 2, 0, 1000);
    struct done d = cl_completion(fd);
    assert_int_equal(d.id, 2);
    assert_int_equal(d.status, CONVD_ETIMEDOUT);
    assert_non_null(strstr(d.error, "timeout of 1000 us"));
    const uint8_t *o = small.data + c[0].off[3];
    for (uint64_t i = 0; i < c[0].sz.output_bytes; i++)
        assert_int_equal(o[i], 0xff);
    /* The queue holds 3: the fourth is refused at once, the rest run after the heavy one. */
    for (int i = 1; i < 5; i++)
        case_send(fd, &c[i], 10 + (uint64_t)i, 1, 0);
    d = cl_completion(fd);
    assert_int_equal(d.id, 14);
    assert_int_equal(d.status, CONVD_EQUEUEFULL);
    assert_non_null(strstr(d.error, "queue_limit"));
    d = cl_completion(fd);
    assert_int_equal(d.id, 1);
    for (int i = 1; i < 4; i++) {
        d = cl_completion(fd);
        assert_int_equal(d.status, 0);
        assert_true(d.id >= 11 && d.id <= 13);
        assert_int_equal(d.batch, 3); /* same problem: one batch */
    }
    for (int i = 1; i < 4; i++)
        case_check(&c[i]);
    for (int i = 0; i < 5; i++)
        free(c[i].ref);
    assert_int_equal(cl_metric(fd, "convd_requests_total{status=\"ETIMEDOUT\"}"), 1);
    assert_int_equal(cl_metric(fd, "convd_requests_rejected_total{status=\"EQUEUEFULL\"}"), 1);
    cl_region_unmap(&big);
    cl_region_unmap(&small);
    close(fd);
    srv_stop(&s);
}

/* A client that disconnects with work queued and running: the queued requests are cancelled, the
 * running one finishes, then its regions are released. */
static void test_disconnect_cancels(void **state)
{
    (void)state;
    struct tu_srv s;
    srv_config(&s);
    tu_srv_start(&s);
    int mon = cl_open(&s);
    int fd = cl_open(&s);
    struct convd_problem heavy, p;
    heavy_problem(&heavy);
    convd_problem_init(&p, 1, 6, 6, 4, 4, 3, 3, 2);
    struct cl_case hc, c[5];
    struct cl_region fake = {0, UINT64_MAX, NULL}, big, small;
    case_layout(&hc, &heavy, &fake, 0);
    cl_region(fd, 1, (size_t)hc.span, &big);
    case_layout(&hc, &heavy, &big, 0);
    cl_region(fd, 2, 1 << 20, &small);
    uint64_t off = 0;
    for (int i = 0; i < 5; i++) {
        case_layout(&c[i], &p, &small, off);
        off += c[i].span;
    }
    case_send(fd, &hc, 1, 0, 0);
    for (int i = 0; i < 5; i++)
        case_send(fd, &c[i], 10 + (uint64_t)i, 3, 0);
    /* a round trip proves the daemon has read them all */
    assert_int_equal(cl_metric(fd, "convd_inflight"), 6);
    assert_int_equal(cl_metric(mon, "convd_regions"), 2);
    close(fd);
    cl_region_unmap(&big);
    cl_region_unmap(&small);
    cl_wait_metric(mon, "convd_clients", 1);
    cl_wait_metric(mon, "convd_inflight", 0);
    cl_wait_metric(mon, "convd_regions", 0);
    assert_int_equal(cl_metric(mon, "convd_mapped_bytes"), 0);
    assert_int_equal(cl_metric(mon, "convd_requests_total{status=\"ECANCELED\"}"), 5);
    assert_int_equal(cl_metric(mon, "convd_requests_total{status=\"OK\"}"), 1);
    close(mon);
    srv_stop(&s);
}

static void test_refusals(void **state)
{
    (void)state;
    struct tu_srv s;
    /* an allow-list without us */
    srv_config(&s);
    s.cfg.n_allow_uids = 1;
    s.cfg.allow_uids[0] = getuid() + 12345;
    tu_srv_start(&s);
    int fd = raw_connect(s.sock);
    cl_send_hello(fd, CONVD_PROTOCOL_VERSION);
    Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY);
    assert_int_equal(r->hello_reply->status, CONVD_EPERM);
    assert_non_null(strstr(r->hello_reply->error, "allow_uids"));
    raw_free(r);
    raw_expect_eof(fd);
    close(fd);
    srv_stop(&s);

    /* our group is enough */
    srv_config(&s);
    s.cfg.n_allow_uids = 1;
    s.cfg.allow_uids[0] = getuid() + 12345;
    s.cfg.n_allow_gids = 1;
    s.cfg.allow_gids[0] = getgid();
    tu_srv_start(&s);
    fd = cl_open(&s);
    close(fd);
    srv_stop(&s);

    /* max_clients, and a Hello timeout */
    srv_config(&s);
    s.cfg.max_clients = 1;
    s.cfg.hello_timeout_ms = 200;
    tu_srv_start(&s);
    int first = cl_open(&s);
    fd = raw_connect(s.sock);
    cl_send_hello(fd, CONVD_PROTOCOL_VERSION);
    r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY);
    assert_int_equal(r->hello_reply->status, CONVD_ELIMIT);
    assert_non_null(strstr(r->hello_reply->error, "max_clients"));
    raw_free(r);
    raw_expect_eof(fd);
    close(fd);
    /* a refused peer that says nothing goes at the Hello timeout as well */
    fd = raw_connect(s.sock);
    raw_expect_eof(fd);
    close(fd);
    /* the first client is unaffected; once it leaves, a silent one is dropped at the timeout */
    assert_int_equal(cl_metric(first, "convd_clients"), 1);
    assert_int_equal(cl_metric(first, "convd_connections_refused_total"), 2);
    close(first);
    fd = raw_connect(s.sock);
    uint64_t t0 = convd_now_ns();
    raw_expect_eof(fd);
    assert_true(convd_now_ns() - t0 >= 150000000u);
    close(fd);
    srv_stop(&s);
}

/* Protocol errors: messages before Hello, garbage, empty and oversized datagrams, descriptors on
 * the wrong message; enough of them close the connection. */
static void test_protocol_errors(void **state)
{
    (void)state;
    struct tu_srv s;
    srv_config(&s);
    s.cfg.max_protocol_errors = 4;
    tu_srv_start(&s);
    int fd = raw_connect(s.sock);
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__Ping ping = CONVD__PING__INIT;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_PING;
    m.ping = &ping;
    raw_send(fd, &m, NULL, 0);
    Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR);
    assert_int_equal(r->protocol_error->status, CONVD_EPROTO);
    assert_non_null(strstr(r->protocol_error->error, "first message must be Hello, got Ping"));
    raw_free(r);
    cl_send_hello(fd, CONVD_PROTOCOL_VERSION);
    raw_free(raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY));
    /* an empty datagram is not the end of the connection */
    assert_int_equal(sock_send(fd, "", 0, -1), 0);
    r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR);
    assert_non_null(strstr(r->protocol_error->error, "empty datagram"));
    raw_free(r);
    /* a descriptor on a ping is closed, the ping answered */
    int stray = tu_memfd("convd-unit", 4096, F_SEAL_SHRINK | F_SEAL_GROW);
    raw_send(fd, &m, &stray, 1);
    close(stray);
    raw_free(raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_PONG));
    /* too large */
    int sz = 1 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
    uint8_t *big = calloc(1, CONVD_MAX_MESSAGE_BYTES + 1);
    assert_int_equal(sock_send(fd, big, CONVD_MAX_MESSAGE_BYTES + 1, -1), 0);
    free(big);
    r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR);
    assert_int_equal(r->protocol_error->status, CONVD_ETOOBIG);
    raw_free(r);
    /* the fourth error closes the connection */
    assert_int_equal(sock_send(fd, "\xff\xff\xff", 3, -1), 0);
    r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR);
    assert_non_null(strstr(r->protocol_error->error, "not a valid convd.ClientMessage"));
    raw_free(r);
    raw_expect_eof(fd);
    close(fd);
    int mon = cl_open(&s);
    assert_int_equal(cl_metric(mon, "convd_protocol_errors_total"), 4);
    close(mon);
    srv_stop(&s);
}

/* A client that sends and never reads is disconnected once its unread replies pass
 * max_send_queue_bytes; the daemon does not block on it. */
static void test_slow_reader(void **state)
{
    (void)state;
    struct tu_srv s;
    srv_config(&s);
    s.cfg.max_send_queue_bytes = 65536;
    tu_srv_start(&s);
    int fd = cl_open(&s);
    int mon = cl_open(&s);
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__MetricsRequest mr = CONVD__METRICS_REQUEST__INIT;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_METRICS;
    m.metrics = &mr;
    int sent = 0;
    for (; sent < 2000; sent++)
        if (cl_try_send(fd, &m) != 0)
            break; /* the daemon hung up on us */
    cl_wait_metric(mon, "convd_clients", 1);
    int got = 0;
    for (Convd__ServerMessage *r; (r = raw_recv(fd)) != NULL; got++)
        raw_free(r);
    assert_true(got < sent);
    close(fd);
    close(mon);
    srv_stop(&s);
}

/* Stopping drains: queued work finishes and every request gets its completion before the
 * connection closes. With no drain time, queued work fails with ESHUTDOWN instead. */
static void drain_case(uint64_t drain_ms, int want_status)
{
    struct tu_srv s;
    srv_config(&s);
    s.cfg.drain_timeout_ms = drain_ms;
    tu_srv_start(&s);
    int fd = cl_open(&s);
    struct tu_rng g;
    tu_rng_init(&g, tu_seed());
    struct convd_problem heavy, p;
    heavy_problem(&heavy);
    convd_problem_init(&p, 1, 6, 6, 4, 4, 3, 3, 2);
    struct cl_case hc, c[4];
    struct cl_region fake = {0, UINT64_MAX, NULL}, big, small;
    case_layout(&hc, &heavy, &fake, 0);
    cl_region(fd, 1, (size_t)hc.span, &big);
    case_layout(&hc, &heavy, &big, 0);
    cl_region(fd, 2, 1 << 20, &small);
    uint64_t off = 0;
    for (int i = 0; i < 4; i++) {
        case_layout(&c[i], &p, &small, off);
        case_fill(&c[i], &g);
        off += c[i].span;
        /* different priorities: the drain must not care */
    }
    case_send(fd, &hc, 1, 0, 0);
    for (int i = 0; i < 4; i++)
        case_send(fd, &c[i], 10 + (uint64_t)i, (unsigned)i, 0);
    assert_int_equal(cl_metric(fd, "convd_inflight"), 5);
    daemon_request_stop(s.d);
    /* With no drain time the queued requests fail at once, before the running one ends. */
    for (int i = 0; i < 5; i++) {
        struct done d = cl_completion(fd);
        if (d.id == 1) {
            assert_int_equal(d.status, 0);
            continue;
        }
        assert_true(d.id >= 10 && d.id < 14);
        assert_int_equal(d.status, want_status);
        if (want_status == 0)
            case_check(&c[d.id - 10]);
        else
            assert_non_null(strstr(d.error, "shutting down"));
    }
    raw_expect_eof(fd);
    close(fd);
    for (int i = 0; i < 4; i++)
        free(c[i].ref);
    cl_region_unmap(&big);
    cl_region_unmap(&small);
    assert_int_equal(pthread_join(s.thread, NULL), 0);
    assert_int_equal(s.rc, 0);
    daemon_destroy(s.d);
    assert_int_equal(sock_connect(s.sock), -ENOENT);
    rmdir(s.dir);
}

static void test_drain(void **state)
{
    (void)state;
    drain_case(60000, 0);
}

static void test_drain_timeout_zero(void **state)
{
    (void)state;
    drain_case(0, CONVD_ESHUTDOWN);
}

/* Binding: mode and group, a live socket is never stolen, a stale one is replaced, anything
 * that is not a socket is left alone. */
static void test_listener_paths(void **state)
{
    (void)state;
    char dir[] = "/tmp/convd-unit-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128], why[256];
    snprintf(path, sizeof(path), "%s/l.sock", dir);
    dev_t dev;
    ino_t ino;
    int fd = listener_bind_path(path, 0660, true, getgid(), &dev, &ino, why, sizeof(why));
    if (fd < 0)
        fail_msg("bind: %s", why);
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0660);
    assert_int_equal(st.st_gid, getgid());
    assert_true(st.st_ino == ino);
    int sotype = 0;
    socklen_t len = sizeof(sotype);
    assert_int_equal(getsockopt(fd, SOL_SOCKET, SO_TYPE, &sotype, &len), 0);
    assert_int_equal(sotype, SOCK_SEQPACKET);
    assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    assert_true(fcntl(fd, F_GETFL) & O_NONBLOCK);
    /* a live socket */
    int rc = listener_bind_path(path, 0600, false, 0, &dev, &ino, why, sizeof(why));
    assert_int_equal(rc, CONVD_EBUSY);
    assert_non_null(strstr(why, "already running"));
    /* stale: the listener is gone, the file is not */
    close(fd);
    fd = listener_bind_path(path, 0600, false, 0, &dev, &ino, why, sizeof(why));
    if (fd < 0)
        fail_msg("rebind over a stale socket: %s", why);
    assert_int_equal(lstat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    close(fd);
    unlink(path);
    /* not a socket */
    int f = open(path, O_CREAT | O_WRONLY, 0600);
    assert_true(f >= 0);
    close(f);
    assert_int_equal(listener_bind_path(path, 0660, false, 0, &dev, &ino, why, sizeof(why)),
                     CONVD_EEXIST);
    assert_non_null(strstr(why, "not a socket"));
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    unlink(path);
    /* a directory that does not exist */
    snprintf(path, sizeof(path), "%s/missing/l.sock", dir);
    assert_int_equal(listener_bind_path(path, 0660, false, 0, &dev, &ino, why, sizeof(why)),
                     CONVD_EIO);
    assert_non_null(strstr(why, "cannot bind"));
    rmdir(dir);
}

/* A datagram socket standing in for systemd's notification socket. */
static int notify_socket(const char *name, bool abstract)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    socklen_t salen;
    if (abstract) {
        sa.sun_path[0] = '\0';
        memcpy(sa.sun_path + 1, name, strlen(name));
        salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
    } else {
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", name);
        salen = sizeof(sa);
    }
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, salen), 0);
    struct timeval tv = {.tv_sec = TU_TIMEOUT_MS / 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

/* Reads notifications until one contains `want`. */
static void notify_expect(int fd, const char *want)
{
    char buf[1024];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
        if (n < 0) {
            fail_msg("no notification \"%s\": %s", want, strerror(errno));
            return;
        }
        buf[n] = '\0';
        if (strstr(buf, want) != NULL)
            return;
    }
}

static void test_sd_notify(void **state)
{
    (void)state;
    unsetenv("NOTIFY_SOCKET");
    assert_int_equal(sdn_notify("READY=1"), 0);
    char name[64];
    snprintf(name, sizeof(name), "convd-unit-%d", (int)getpid());
    int fd = notify_socket(name, true);
    char env[80];
    snprintf(env, sizeof(env), "@%s", name);
    setenv("NOTIFY_SOCKET", env, 1);
    assert_int_equal(sdn_notifyf("STATUS=%d clients", 3), 1);
    notify_expect(fd, "STATUS=3 clients");
    unsetenv("NOTIFY_SOCKET");
    close(fd);

    setenv("WATCHDOG_USEC", "2000000", 1);
    unsetenv("WATCHDOG_PID");
    assert_true(sdn_watchdog_usec() == 2000000);
    setenv("WATCHDOG_PID", "1", 1); /* someone else's */
    assert_true(sdn_watchdog_usec() == 0);
    unsetenv("WATCHDOG_PID");
    unsetenv("WATCHDOG_USEC");
    assert_true(sdn_watchdog_usec() == 0);

    setenv("LISTEN_PID", "1", 1);
    setenv("LISTEN_FDS", "1", 1);
    assert_int_equal(sdn_listen_fds(), 0); /* not for us */
    assert_null(getenv("LISTEN_FDS"));
    char pid[32];
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    setenv("LISTEN_PID", pid, 1);
    setenv("LISTEN_FDS", "x", 1);
    assert_true(sdn_listen_fds() < 0);
}

/* Socket activation in a child process: systemd's listening socket arrives as descriptor 3, the
 * daemon uses it (not its configured path), notifies READY=1, sends WATCHDOG=1, STOPPING=1 on
 * SIGTERM, exits 0, and leaves the socket file to systemd. */
static void test_socket_activation(void **state)
{
    (void)state;
    char dir[] = "/tmp/convd-unit-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[96], npath[96], why[256];
    snprintf(path, sizeof(path), "%s/act.sock", dir);
    snprintf(npath, sizeof(npath), "%s/notify", dir);
    dev_t dev;
    ino_t ino;
    int lfd = listener_bind_path(path, 0660, false, 0, &dev, &ino, why, sizeof(why));
    assert_true(lfd >= 0);
    int nfd = notify_socket(npath, false);

    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        if (dup2(lfd, SDN_LISTEN_FDS_START) < 0)
            _exit(10);
        char pid[32];
        snprintf(pid, sizeof(pid), "%d", (int)getpid());
        setenv("LISTEN_PID", pid, 1);
        setenv("LISTEN_FDS", "1", 1);
        setenv("NOTIFY_SOCKET", npath, 1);
        setenv("WATCHDOG_USEC", "100000", 1);
        struct convd_config cfg;
        config_defaults(&cfg);
        snprintf(cfg.socket_path, sizeof(cfg.socket_path), "%s/unused.sock", dir);
        cfg.backend = CONFIG_BACKEND_CPU;
        cfg.threads = 1;
        struct convd_daemon *d;
        if (daemon_create(&cfg, &d, why, sizeof(why)) != 0) {
            fprintf(stderr, "daemon_create: %s\n", why);
            _exit(11);
        }
        int rc = daemon_run(d);
        daemon_destroy(d);
        _exit(rc);
    }
    close(lfd);
    notify_expect(nfd, "READY=1");
    notify_expect(nfd, "WATCHDOG=1");
    struct tu_srv s;
    memset(&s, 0, sizeof(s));
    snprintf(s.sock, sizeof(s.sock), "%s", path);
    int fd = cl_open(&s);
    assert_int_equal(cl_metric(fd, "convd_clients"), 1);
    struct stat st;
    char unused[160];
    snprintf(unused, sizeof(unused), "%s/unused.sock", dir);
    assert_int_equal(lstat(unused, &st), -1);
    assert_int_equal(kill(child, SIGTERM), 0);
    notify_expect(nfd, "STOPPING=1");
    raw_expect_eof(fd);
    close(fd);
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* the file belongs to systemd's socket unit: still there */
    assert_int_equal(lstat(path, &st), 0);
    close(nfd);
    unlink(path);
    unlink(npath);
    rmdir(dir);
}

/* A configured max_queue_delay_us holds a lone request back while an idle worker waits for its
 * batch to fill; a full batch goes at once. */
static void test_queue_delay(void **state)
{
    (void)state;
    struct tu_srv s;
    srv_config(&s);
    s.cfg.max_batch = 3;
    s.cfg.max_queue_delay_us = 200000;
    tu_srv_start(&s);
    int fd = cl_open(&s);
    struct tu_rng g;
    tu_rng_init(&g, tu_seed());
    struct convd_problem p;
    convd_problem_init(&p, 1, 6, 6, 4, 4, 3, 3, 2);
    struct cl_region reg;
    cl_region(fd, 1, 1 << 20, &reg);
    struct cl_case c[4];
    uint64_t off = 0;
    for (int i = 0; i < 4; i++) {
        case_layout(&c[i], &p, &reg, off);
        case_fill(&c[i], &g);
        off += c[i].span;
    }
    /* three at once: a full batch, no waiting */
    for (int i = 0; i < 3; i++)
        case_send(fd, &c[i], 1 + (uint64_t)i, 0, 0);
    for (int i = 0; i < 3; i++) {
        struct done d = cl_completion(fd);
        assert_int_equal(d.status, 0);
        assert_int_equal(d.batch, 3);
    }
    /* one alone waits for the delay, then runs as a batch of one */
    uint64_t t0 = convd_now_ns();
    case_send(fd, &c[3], 9, 0, 0);
    struct done d = cl_completion(fd);
    assert_int_equal(d.id, 9);
    assert_int_equal(d.batch, 1);
    assert_true(convd_now_ns() - t0 >= 200000000u);
    for (int i = 0; i < 4; i++) {
        case_check(&c[i]);
        free(c[i].ref);
    }
    cl_region_unmap(&reg);
    close(fd);
    srv_stop(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handshake_and_queries),
        cmocka_unit_test(test_numeric),
        cmocka_unit_test(test_batching_and_priority),
        cmocka_unit_test(test_deadline_and_queue_full),
        cmocka_unit_test(test_disconnect_cancels),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_protocol_errors),
        cmocka_unit_test(test_slow_reader),
        cmocka_unit_test(test_drain),
        cmocka_unit_test(test_drain_timeout_zero),
        cmocka_unit_test(test_listener_paths),
        cmocka_unit_test(test_sd_notify),
        cmocka_unit_test(test_socket_activation),
        cmocka_unit_test(test_queue_delay),
    };
    return cmocka_run_group_tests_name("daemon server", tests, quiet, NULL);
}
