/*
 * Hostile and broken input on raw SOCK_SEQPACKET connections, with hand-built protobuf and plain
 * bytes, while a well-behaved client (a separate process) keeps running checked convolutions in
 * parallel. Every bad input must be answered with its own status code and a sentence naming the
 * problem; descriptors that come with bad messages must be closed; the daemon must keep serving
 * and end with nothing leaked.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "raw.h"
#include "wire.h"

static struct it_daemon daemon_;
static struct it_worker worker_;

static int group_setup(void **state)
{
    (void)state;
    it_daemon_start(&daemon_, NULL);
    it_worker_start(&worker_, &daemon_, tu_rng_next(it_rng()));
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    if (worker_.pid > 0) {
        kill(worker_.pid, SIGKILL);
        it_wait_child(worker_.pid);
        worker_.pid = 0;
    }
    it_daemon_kill(&daemon_);
    return 0;
}

/* The daemon still answers, on the monitor connection. */
static void assert_alive(void)
{
    int rc = convd_ping(daemon_.mon, NULL);
    if (rc != 0)
        fail_msg("the daemon stopped answering: %s (%s)", convd_status_name(rc),
                 convd_errstr(daemon_.mon));
}

/* A connection that has completed its handshake. */
static int conn(void)
{
    int fd = raw_connect(daemon_.sock);
    raw_hello(fd);
    return fd;
}

static void send_ping(int fd, uint64_t tag)
{
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__Ping ping = CONVD__PING__INIT;
    ping.tag = tag;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_PING;
    m.ping = &ping;
    raw_send(fd, &m, NULL, 0);
}

/* The connection still works: a Ping gets its Pong. */
static void assert_pong(int fd, uint64_t tag)
{
    send_ping(fd, tag);
    Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_PONG);
    assert_int_equal(r->pong->tag, tag);
    raw_free(r);
}

/* Registers a sealed memfd of `size` bytes as region_id; asserts success. */
static void register_ok(int fd, uint64_t region_id, uint64_t size)
{
    int mfd = tu_memfd("convd-it", size, F_SEAL_SHRINK | F_SEAL_GROW);
    char why[256];
    int st = raw_register(fd, region_id, size, &mfd, 1, why, sizeof(why));
    close(mfd);
    if (st != 0)
        fail_msg("register region %llu: %s: %s", (unsigned long long)region_id,
                 convd_status_name(st), why);
}

/* Registers with the given descriptors and asserts the reply's status and sentence. */
static void register_expect(int fd, uint64_t region_id, uint64_t size, const int *fds, size_t nfds,
                            int status, const char *word)
{
    char why[256];
    int st = raw_register(fd, region_id, size, fds, nfds, why, sizeof(why));
    if (st != status)
        fail_msg("register region %llu (size %llu, %zu fds): got %s (%s), want %s",
                 (unsigned long long)region_id, (unsigned long long)size, nfds,
                 convd_status_name(st), why, convd_status_name(status));
    if (status != 0 && (strlen(why) < 8 || (word != NULL && !raw_contains(why, word))))
        fail_msg("register region %llu: %s with sentence \"%s\", which does not name \"%s\"",
                 (unsigned long long)region_id, convd_status_name(st), why, word ? word : "");
}

/* Sends a request and asserts its completion's status and sentence. */
static void conv_expect(int fd, struct raw_conv *rc, int status, const char *word)
{
    raw_conv_send(fd, rc);
    char why[256];
    int st = raw_expect_completion(fd, rc->req.id, why, sizeof(why));
    if (st != status)
        fail_msg("request %llu: got %s (%s), want %s", (unsigned long long)rc->req.id,
                 convd_status_name(st), why, convd_status_name(status));
    if (status != 0 && (strlen(why) < 8 || (word != NULL && !raw_contains(why, word))))
        fail_msg("request %llu: %s with sentence \"%s\", which does not name \"%s\"",
                 (unsigned long long)rc->req.id, convd_status_name(st), why, word ? word : "");
}

/* The small problem most request tests start from, laid out in region 1. */
static void small_problem(struct convd_problem *p)
{
    convd_problem_init(p, 1, 6, 6, 4, 8, 3, 3, 2);
    p->pad_top = p->pad_bottom = p->pad_left = p->pad_right = 1;
    p->has_bias = true;
}

#define REGION_SIZE (1u << 20)

/*
 * Undecodable datagrams.
 */

static void test_garbage_datagrams(void **state)
{
    (void)state;
    uint8_t buf[512];
    /* Field number 0 is never valid protobuf. */
    buf[0] = 0x00;
    for (size_t i = 1; i < sizeof(buf); i++)
        buf[i] = (uint8_t)tu_rng_next(it_rng());
    int fd = conn();
    raw_send_bytes(fd, buf, sizeof(buf));
    raw_expect_protocol_error(fd, CONVD_EPROTO, NULL);
    assert_pong(fd, 1); /* one bad datagram is not fatal */
    /* A varint that never ends. */
    memset(buf, 0xff, sizeof(buf));
    raw_send_bytes(fd, buf, 64);
    raw_expect_protocol_error(fd, CONVD_EPROTO, NULL);
    /* Wire type 7 does not exist. */
    buf[0] = 0x0f;
    raw_send_bytes(fd, buf, 16);
    raw_expect_protocol_error(fd, CONVD_EPROTO, NULL);
    /* A length prefix far beyond the datagram. */
    const uint8_t longlen[] = {0x22, 0xff, 0xff, 0xff, 0x0f, 0x08, 0x01};
    raw_send_bytes(fd, longlen, sizeof(longlen));
    raw_expect_protocol_error(fd, CONVD_EPROTO, NULL);
    assert_pong(fd, 2);
    close(fd);

    /* Enough protocol errors end the connection; the daemon stays up. */
    fd = conn();
    buf[0] = 0x00;
    for (int i = 0; i < 200; i++) {
        if (raw_send_bytes_fds(fd, buf, 32, NULL, 0) != 0)
            break; /* already closed on us */
    }
    raw_expect_eof(fd);
    close(fd);
    assert_alive();
}

/* A client of protocol 1 (which has relu only, as Problem.relu) that sends an activation
 * anyway gets EUNSUPPORTED naming the version, not a run without it; relu works. Bad activation
 * fields are bad problems. */
static void test_protocol1_activations(void **state)
{
    (void)state;
    int fd = raw_connect(daemon_.sock);
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__Hello h = CONVD__HELLO__INIT;
    h.protocol_version = 1;
    h.client_name = "it-protocol1";
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_HELLO;
    m.hello = &h;
    raw_send(fd, &m, NULL, 0);
    Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY);
    assert_int_equal(r->hello_reply->status, 0);
    assert_int_equal(r->hello_reply->protocol_version, 1);
    raw_free(r);
    register_ok(fd, 1, REGION_SIZE);
    struct convd_problem p;
    small_problem(&p);
    struct raw_conv rc;
    raw_conv_init(&rc, 1, &p, 1);
    rc.prob.activation = CONVD__ACTIVATION__ACTIVATION_GELU;
    conv_expect(fd, &rc, CONVD_EUNSUPPORTED, "needs protocol version 2");
    raw_conv_init(&rc, 2, &p, 1);
    rc.prob.relu = true;
    conv_expect(fd, &rc, 0, NULL);
    raw_conv_init(&rc, 3, &p, 1);
    rc.prob.relu = true;
    rc.prob.activation = CONVD__ACTIVATION__ACTIVATION_SILU;
    conv_expect(fd, &rc, CONVD_EBADSHAPE, "relu is set with activation 3");
    raw_conv_init(&rc, 4, &p, 1);
    rc.prob.activation = (Convd__Activation)42;
    conv_expect(fd, &rc, CONVD_EBADSHAPE, "activation is 42");
    raw_conv_init(&rc, 5, &p, 1);
    rc.prob.activation = CONVD__ACTIVATION__ACTIVATION_HARDSWISH;
    rc.prob.act_max = 6.0f;
    conv_expect(fd, &rc, CONVD_EBADSHAPE, "clamp activation only");
    close(fd);
    assert_alive();
}

static void test_truncated_protobuf(void **state)
{
    (void)state;
    int fd = conn();
    register_ok(fd, 1, REGION_SIZE);
    struct convd_problem p;
    small_problem(&p);
    struct raw_conv rc;
    raw_conv_init(&rc, 5, &p, 1);
    uint8_t buf[1024];
    size_t len = convd__client_message__pack(&rc.msg, buf);
    assert_true(len > 20);
    const size_t cuts[] = {1, 2, len / 2, len - 1};
    for (size_t i = 0; i < 4; i++) {
        raw_send_bytes(fd, buf, cuts[i]);
        raw_expect_protocol_error(fd, CONVD_EPROTO, NULL);
    }
    /* The whole message still works afterwards. */
    conv_expect(fd, &rc, 0, NULL);
    close(fd);
    assert_alive();
}

static void test_valid_protobuf_wrong_type(void **state)
{
    (void)state;
    int fd = conn();
    /* A Problem on its own: field 1 is a varint where ClientMessage has the Hello message. */
    struct convd_problem p;
    small_problem(&p);
    Convd__Problem pb = CONVD__PROBLEM__INIT;
    wire_problem_to_pb(&p, &pb);
    uint8_t buf[1024];
    size_t len = convd__problem__pack(&pb, buf);
    raw_send_bytes(fd, buf, len);
    raw_expect_protocol_error(fd, CONVD_EPROTO, NULL);
    /* A ClientMessage that decodes but holds only an unknown field: no message in it. */
    const uint8_t unknown[] = {0x78, 0x01}; /* field 15, varint 1 */
    raw_send_bytes(fd, unknown, sizeof(unknown));
    raw_expect_protocol_error(fd, CONVD_EPROTO, NULL);
    /* A second Hello on a connection that already did its handshake. */
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__Hello h = CONVD__HELLO__INIT;
    h.protocol_version = 1;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_HELLO;
    m.hello = &h;
    raw_send(fd, &m, NULL, 0);
    raw_expect_protocol_error(fd, CONVD_EPROTO, "hello");
    assert_pong(fd, 3);
    close(fd);
    assert_alive();
}

static void test_empty_datagram(void **state)
{
    (void)state;
    int fd = conn();
    raw_send_bytes(fd, "", 0);
    raw_expect_protocol_error(fd, CONVD_EPROTO, NULL);
    assert_pong(fd, 4);
    close(fd);
    /* Before the handshake too. */
    fd = raw_connect(daemon_.sock);
    raw_send_bytes(fd, "", 0);
    raw_expect_protocol_error(fd, CONVD_EPROTO, NULL);
    close(fd);
    assert_alive();
}

/* Descriptors attached to empty datagrams, before and after Hello, are closed: the daemon's
 * descriptor count does not grow by the 80 each connection sends (7ab9ac0 kept every one). */
static void test_empty_datagram_with_fds(void **state)
{
    (void)state;
    enum { ROUNDS = 10, PER = 8 };
    for (int hello = 0; hello < 2; hello++) {
        int base = it_count_fds(daemon_.pid);
        assert_true(base > 0);
        int fd = hello ? conn() : raw_connect(daemon_.sock);
        int fds[PER];
        for (int i = 0; i < PER; i++) {
            fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
            assert_true(fds[i] >= 0);
        }
        for (int k = 0; k < ROUNDS; k++) {
            assert_int_equal(raw_send_bytes_fds(fd, "", 0, fds, PER), 0);
            raw_expect_protocol_error(fd, CONVD_EPROTO, "empty");
        }
        /* Every datagram has been answered, so each was read: the connection itself is the
         * one descriptor more (the background worker may hold one briefly while it registers
         * a region). */
        int held = it_count_fds(daemon_.pid);
        if (held - base > 2)
            fail_msg("the daemon holds %d descriptors more after %d empty datagrams with %d "
                     "descriptors each (%s Hello)",
                     held - base, ROUNDS, PER, hello ? "after" : "before");
        for (int i = 0; i < PER; i++)
            close(fds[i]);
        close(fd);
    }
    assert_alive();
}

/* A request of 32 KB of tensors with dilation and padding of 65536 rows: the daemon's peak
 * memory must not follow the padding (7ab9ac0 grew from 2 MB to 2 GB and kept it), and the
 * result is still right. */
static void test_huge_padding_memory(void **state)
{
    (void)state;
    convd_client *c = it_connect(&daemon_, "it-huge-padding");
    struct convd_problem p;
    convd_problem_init(&p, 1, 1, 4000, 1, 1, 3, 1, 1);
    p.dil_h = 65536;
    p.pad_top = p.pad_bottom = 65536;
    convd_region *r = NULL;
    assert_int_equal(convd_region_create(c, it_case_span(&p), &r), 0);
    struct it_case t;
    it_case_init(&t, r, 0, &p, it_rng());
    long before = it_proc_kb(daemon_.pid, "VmHWM");
    assert_true(before > 0);
    struct convd_conv_args a;
    it_case_args(&t, &a);
    uint64_t id;
    assert_int_equal(convd_conv_submit(c, &a, &id), 0);
    struct convd_completion done;
    assert_int_equal(convd_wait(c, id, TU_TIMEOUT_MS, &done), 0);
    if (done.status != 0)
        fail_msg("%s: %s", convd_status_name(done.status), done.error);
    it_case_check(&t);
    long after = it_proc_kb(daemon_.pid, "VmHWM");
    if (after - before > 128 * 1024)
        fail_msg("the daemon's peak memory grew from %ld kB to %ld kB for 32 KB of tensors", before,
                 after);
    it_case_fini(&t);
    convd_region_free(r);
    convd_close(c);
    assert_alive();
}

static void test_messages_before_hello(void **state)
{
    (void)state;
    int fd = raw_connect(daemon_.sock);
    send_ping(fd, 9);
    raw_expect_protocol_error(fd, CONVD_EPROTO, "hello");
    close(fd);

    /* A request before Hello. */
    fd = raw_connect(daemon_.sock);
    struct convd_problem p;
    small_problem(&p);
    struct raw_conv rc;
    raw_conv_init(&rc, 1, &p, 1);
    raw_conv_send(fd, &rc);
    raw_expect_protocol_error(fd, CONVD_EPROTO, "hello");
    close(fd);

    /* A region (with its descriptor) before Hello: refused, and the descriptor not kept. */
    fd = raw_connect(daemon_.sock);
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
    raw_expect_protocol_error(fd, CONVD_EPROTO, "hello");
    close(fd);
    assert_alive();
}

/* Hello with an unsupported version: EVERSION (in the HelloReply or a ProtocolError), then the
 * daemon closes the connection. */
static void test_wrong_protocol_version(void **state)
{
    (void)state;
    const uint32_t versions[] = {0, CONVD_PROTOCOL_VERSION + 1, 0xffffffffu};
    for (size_t i = 0; i < 3; i++) {
        int fd = raw_connect(daemon_.sock);
        Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
        Convd__Hello h = CONVD__HELLO__INIT;
        h.protocol_version = versions[i];
        h.client_name = "it-old";
        m.msg_case = CONVD__CLIENT_MESSAGE__MSG_HELLO;
        m.hello = &h;
        raw_send(fd, &m, NULL, 0);
        Convd__ServerMessage *r = raw_recv(fd);
        if (r == NULL)
            fail_msg("version %u: connection closed without a reply", versions[i]);
        int st = 0;
        const char *err = "";
        if (r->msg_case == CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY) {
            st = r->hello_reply->status;
            err = r->hello_reply->error;
            /* what it does speak */
            assert_int_equal(r->hello_reply->protocol_version, CONVD_PROTOCOL_VERSION);
        } else if (r->msg_case == CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR) {
            st = r->protocol_error->status;
            err = r->protocol_error->error;
        } else {
            fail_msg("version %u: unexpected reply case %d", versions[i], (int)r->msg_case);
        }
        if (st != CONVD_EVERSION)
            fail_msg("version %u: got %s (%s), want EVERSION", versions[i], convd_status_name(st),
                     err);
        assert_true(raw_contains(err, "version"));
        /* The sentence names the versions the daemon does speak. */
        char range[64];
        snprintf(range, sizeof(range), "versions %u to %u", CONVD_PROTOCOL_VERSION_MIN,
                 CONVD_PROTOCOL_VERSION);
        if (!raw_contains(err, range))
            fail_msg("version %u: '%s' does not name the supported range (%s)", versions[i], err,
                     range);
        raw_free(r);
        raw_expect_eof(fd);
        close(fd);
    }
    assert_alive();
}

/* Client names that are far too long or full of control characters: the daemon accepts the
 * connection (keeping a cleaned-up prefix for its logs) or refuses it with EINVAL, and either
 * way goes on. */
static void test_hello_odd_client_names(void **state)
{
    (void)state;
    static char name[8192];
    for (size_t i = 0; i < sizeof(name) - 1; i++)
        name[i] = (char)(i % 3 == 0 ? '\n' : i % 3 == 1 ? '\x1b' : 'A' + (int)(i % 26));
    name[sizeof(name) - 1] = '\0';
    const char *names[] = {name, "", "%s%s%s%n%n"};
    for (size_t i = 0; i < 3; i++) {
        int fd = raw_connect(daemon_.sock);
        Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
        Convd__Hello h = CONVD__HELLO__INIT;
        h.protocol_version = 1;
        h.client_name = (char *)names[i];
        m.msg_case = CONVD__CLIENT_MESSAGE__MSG_HELLO;
        m.hello = &h;
        raw_send(fd, &m, NULL, 0);
        Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY);
        int st = r->hello_reply->status;
        raw_free(r);
        if (st == 0)
            assert_pong(fd, 10 + i);
        else if (st != CONVD_EINVAL)
            fail_msg("client name %zu: %s, want OK or EINVAL", i, convd_status_name(st));
        close(fd);
    }
    assert_alive();
}

static void test_oversized_datagram(void **state)
{
    (void)state;
    int fd = conn();
    /* Raise our send buffer so the kernel takes the datagram; the daemon must refuse it. */
    int sz = 1 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
    size_t lens[] = {CONVD_MAX_MESSAGE_BYTES + 1, 3 * CONVD_MAX_MESSAGE_BYTES};
    for (size_t i = 0; i < 2; i++) {
        uint8_t *big = calloc(1, lens[i]);
        assert_non_null(big);
        /* A ping whose tag field is followed by a huge unknown bytes field: well-formed,
         * just too large. */
        big[0] = 0x3a; /* field 7 (ping), length-delimited */
        raw_send_bytes(fd, big, lens[i]);
        free(big);
        raw_expect_protocol_error(fd, CONVD_ETOOBIG, NULL);
    }
    assert_pong(fd, 5);
    close(fd);
    assert_alive();
}

/*
 * Bad requests: each answered by a Completion for its id.
 */

static void test_bad_shapes(void **state)
{
    (void)state;
    int fd = conn();
    register_ok(fd, 1, REGION_SIZE);
    struct convd_problem p;
    small_problem(&p);
    struct raw_conv rc;
    uint64_t id = 100;
    struct {
        uint32_t *field;
        uint32_t value;
        int status;
        const char *word;
    } cases[] = {
        {&rc.prob.n, 0, CONVD_EBADSHAPE, "field n"},
        {&rc.prob.h, 0, CONVD_EBADSHAPE, "field h"},
        {&rc.prob.w, 0, CONVD_EBADSHAPE, "field w"},
        {&rc.prob.c, 0, CONVD_EBADSHAPE, "field c"},
        {&rc.prob.k, 0, CONVD_EBADSHAPE, "field k"},
        {&rc.prob.groups, 0, CONVD_EBADSHAPE, "groups"},
        {&rc.prob.stride_h, 0, CONVD_EBADSHAPE, "stride_h"},
        {&rc.prob.dil_w, 0, CONVD_EBADSHAPE, "dil_w"},
        /* Negative numbers as a C client would send them through uint32. */
        {&rc.prob.c, (uint32_t)-4, CONVD_EBADSHAPE, "field c"},
        {&rc.prob.h, (uint32_t)-1, CONVD_EBADSHAPE, "field h"},
        {&rc.prob.pad_left, (uint32_t)-1, CONVD_EBADSHAPE, "pad_left"},
        /* Filter larger than the padded image. */
        {&rc.prob.r, 9, CONVD_EBADSHAPE, "filter"},
        {&rc.prob.s, 1000, CONVD_EBADSHAPE, "filter"},
        /* Dimensions beyond the limits. */
        {&rc.prob.n, 1u << 30, CONVD_EBADSHAPE, "field n"},
        /* Channels not divisible by groups. */
        {&rc.prob.c, 5, CONVD_EGROUPS, "groups"},
        {&rc.prob.k, 7, CONVD_EGROUPS, "groups"},
        {&rc.prob.groups, 3, CONVD_EGROUPS, "groups"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        raw_conv_init(&rc, id++, &p, 1);
        /* The field pointers refer to rc.prob, which raw_conv_init just reset. */
        *cases[i].field = cases[i].value;
        conv_expect(fd, &rc, cases[i].status, cases[i].word);
    }
    /* Unknown dtype and layout, including the protocol's UNSPECIFIED zero. */
    const int dtypes[] = {0, 9, -1};
    for (size_t i = 0; i < 3; i++) {
        raw_conv_init(&rc, id++, &p, 1);
        rc.prob.dtype = (Convd__DType)dtypes[i];
        conv_expect(fd, &rc, CONVD_EBADSHAPE, "dtype");
    }
    const int layouts[] = {0, 3, 1000};
    for (size_t i = 0; i < 3; i++) {
        raw_conv_init(&rc, id++, &p, 1);
        rc.prob.layout = (Convd__Layout)layouts[i];
        conv_expect(fd, &rc, CONVD_EBADSHAPE, "layout");
    }
    /* No problem at all. */
    raw_conv_init(&rc, id++, &p, 1);
    rc.req.problem = NULL;
    conv_expect(fd, &rc, CONVD_EBADSHAPE, "problem");
    /* allow_tf32 on fp16. */
    struct convd_problem h = p;
    h.dtype = CONVD_DTYPE_FP16;
    raw_conv_init(&rc, id++, &h, 1);
    rc.prob.allow_tf32 = true;
    conv_expect(fd, &rc, CONVD_EBADSHAPE, "tf32");
    /* The connection is fine after all of them. */
    raw_conv_init(&rc, id++, &p, 1);
    conv_expect(fd, &rc, 0, NULL);
    close(fd);
    assert_alive();
}

static void test_bad_tensor_references(void **state)
{
    (void)state;
    int fd = conn();
    register_ok(fd, 1, REGION_SIZE);
    register_ok(fd, 2, 4096);
    struct convd_problem p;
    small_problem(&p);
    struct convd_problem_sizes z;
    assert_int_equal(convd_problem_sizes(&p, &z, NULL, 0), 0);
    struct raw_conv rc;
    uint64_t id = 200;

    /* Unknown regions. */
    raw_conv_init(&rc, id++, &p, 1);
    rc.in.region_id = 77;
    conv_expect(fd, &rc, CONVD_ENOREGION, "region");
    raw_conv_init(&rc, id++, &p, 1);
    rc.out.region_id = 0;
    conv_expect(fd, &rc, CONVD_ENOREGION, "region");
    raw_conv_init(&rc, id++, &p, 1);
    rc.b.region_id = 3;
    conv_expect(fd, &rc, CONVD_ENOREGION, "region");

    /* Outside the region: past the end, straddling the end, and offsets whose sum with the
     * byte count overflows 64 bits. */
    raw_conv_init(&rc, id++, &p, 1);
    rc.out.offset = REGION_SIZE;
    conv_expect(fd, &rc, CONVD_EBOUNDS, "output");
    raw_conv_init(&rc, id++, &p, 1);
    rc.in.offset = REGION_SIZE - z.input_bytes + 4;
    conv_expect(fd, &rc, CONVD_EBOUNDS, "input");
    raw_conv_init(&rc, id++, &p, 2);
    rc.w.offset = 4096 - 4;
    conv_expect(fd, &rc, CONVD_EBOUNDS, "weight");
    raw_conv_init(&rc, id++, &p, 1);
    rc.out.offset = UINT64_MAX - 3;
    conv_expect(fd, &rc, CONVD_EBOUNDS, "output");
    raw_conv_init(&rc, id++, &p, 1);
    rc.in.offset = UINT64_MAX - z.input_bytes + 1;
    conv_expect(fd, &rc, CONVD_EBOUNDS, "input");
    raw_conv_init(&rc, id++, &p, 1);
    rc.b.offset = UINT64_MAX;
    conv_expect(fd, &rc, CONVD_EBOUNDS, "bias");
    raw_conv_init(&rc, id++, &p, 1);
    rc.w.offset = (uint64_t)1 << 63;
    conv_expect(fd, &rc, CONVD_EBOUNDS, "weight");

    /* Byte counts that do not match the shape. */
    raw_conv_init(&rc, id++, &p, 1);
    rc.in.bytes -= 4;
    conv_expect(fd, &rc, CONVD_ESIZE, "input");
    raw_conv_init(&rc, id++, &p, 1);
    rc.w.bytes += 4;
    conv_expect(fd, &rc, CONVD_ESIZE, "weight");
    raw_conv_init(&rc, id++, &p, 1);
    rc.out.bytes = 0;
    conv_expect(fd, &rc, CONVD_ESIZE, "output");
    raw_conv_init(&rc, id++, &p, 1);
    rc.b.bytes = 2;
    conv_expect(fd, &rc, CONVD_ESIZE, "bias");
    raw_conv_init(&rc, id++, &p, 1);
    rc.out.bytes = UINT64_MAX;
    conv_expect(fd, &rc, CONVD_ESIZE, "output");

    /* A bias the problem asks for but the request leaves out. */
    raw_conv_init(&rc, id++, &p, 1);
    rc.req.bias = NULL;
    conv_expect(fd, &rc, CONVD_EINVAL, "bias");
    /* A bias the problem does not ask for. */
    struct convd_problem nb = p;
    nb.has_bias = false;
    raw_conv_init(&rc, id++, &nb, 1);
    rc.b = rc.in;
    rc.req.bias = &rc.b;
    conv_expect(fd, &rc, CONVD_EINVAL, "bias");
    /* Missing input, weight and output references. */
    raw_conv_init(&rc, id++, &p, 1);
    rc.req.input = NULL;
    conv_expect(fd, &rc, CONVD_EINVAL, "input");
    raw_conv_init(&rc, id++, &p, 1);
    rc.req.weight = NULL;
    conv_expect(fd, &rc, CONVD_EINVAL, "weight");
    raw_conv_init(&rc, id++, &p, 1);
    rc.req.output = NULL;
    conv_expect(fd, &rc, CONVD_EINVAL, "output");
    /* Priority out of range. */
    raw_conv_init(&rc, id++, &p, 1);
    rc.req.priority = 4;
    conv_expect(fd, &rc, CONVD_EINVAL, "priority");

    /* And a good request on the same connection. */
    raw_conv_init(&rc, id++, &p, 1);
    conv_expect(fd, &rc, 0, NULL);
    close(fd);
    assert_alive();
}

/*
 * Regions.
 */

static void test_bad_regions(void **state)
{
    (void)state;
    int fd = conn();
    /* Unsealed, or sealed against only one of shrinking and growing. */
    const unsigned seals[] = {0, F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL};
    for (size_t i = 0; i < 4; i++) {
        int mfd = tu_memfd("convd-it", 8192, seals[i]);
        register_expect(fd, 10 + i, 8192, &mfd, 1, CONVD_ESEAL, "seal");
        close(mfd);
    }
    /* A descriptor that is not a memfd at all. */
    int pfd[2];
    assert_int_equal(pipe2(pfd, O_CLOEXEC), 0);
    register_expect(fd, 20, 4096, &pfd[0], 1, CONVD_ESEAL, NULL);
    close(pfd[0]);
    close(pfd[1]);
    /* A sealed memfd smaller than the size the message declares. */
    int mfd = tu_memfd("convd-it", 4096, F_SEAL_SHRINK | F_SEAL_GROW);
    register_expect(fd, 21, 8192, &mfd, 1, CONVD_EBOUNDS, "size");
    /* Size zero. */
    register_expect(fd, 22, 0, &mfd, 1, CONVD_EINVAL, "size");
    /* No descriptor, and two. */
    register_expect(fd, 23, 4096, NULL, 0, CONVD_EINVAL, "descriptor");
    int two[2] = {mfd, tu_memfd("convd-it", 4096, F_SEAL_SHRINK | F_SEAL_GROW)};
    register_expect(fd, 24, 4096, two, 2, CONVD_EINVAL, "descriptor");
    close(two[1]);
    /* A region kind this daemon cannot use, and none at all. */
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__RegisterRegion rr = CONVD__REGISTER_REGION__INIT;
    uint8_t handle[64] = {1, 2, 3};
    rr.region_id = 25;
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
    raw_free(r);
    register_expect(fd, 26, 4096, &mfd, 1, CONVD_OK, NULL);
    rr.region_id = 27;
    rr.kind = CONVD__REGION_KIND__REGION_KIND_UNSPECIFIED;
    raw_send(fd, &m, &mfd, 1);
    r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_REGION_REPLY);
    if (r->region_reply->status != CONVD_EINVAL || !raw_contains(r->region_reply->error, "kind"))
        fail_msg("region kind 0: %s (%s), want EINVAL naming the kind",
                 convd_status_name(r->region_reply->status), r->region_reply->error);
    raw_free(r);
    /* Duplicate region id: refused, and the first registration still works. */
    register_expect(fd, 26, 4096, &mfd, 1, CONVD_EEXIST, "26");
    struct convd_problem p;
    convd_problem_init(&p, 1, 4, 4, 2, 2, 1, 1, 1);
    struct raw_conv rc;
    raw_conv_init(&rc, 1, &p, 26);
    conv_expect(fd, &rc, 0, NULL);
    /* Unregistering twice, and an id never registered. */
    assert_int_equal(raw_unregister(fd, 26), 0);
    assert_int_equal(raw_unregister(fd, 26), CONVD_ENOREGION);
    assert_int_equal(raw_unregister(fd, 999), CONVD_ENOREGION);
    raw_conv_init(&rc, 2, &p, 26);
    conv_expect(fd, &rc, CONVD_ENOREGION, "region");
    close(mfd);
    /* A descriptor attached to a message that takes none: not kept. */
    int stray = tu_memfd("convd-it", 4096, F_SEAL_SHRINK | F_SEAL_GROW);
    Convd__ClientMessage pm = CONVD__CLIENT_MESSAGE__INIT;
    Convd__Ping ping = CONVD__PING__INIT;
    ping.tag = 6;
    pm.msg_case = CONVD__CLIENT_MESSAGE__MSG_PING;
    pm.ping = &ping;
    raw_send(fd, &pm, &stray, 1);
    close(stray);
    r = raw_recv(fd);
    assert_non_null(r);
    assert_true(r->msg_case == CONVD__SERVER_MESSAGE__MSG_PONG ||
                r->msg_case == CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR);
    raw_free(r);
    close(fd);
    assert_alive();
}

/* A write-sealed memfd: usable for inputs, refused (not crashed on) as an output. */
static void test_write_sealed_region(void **state)
{
    (void)state;
    int fd = conn();
    struct convd_problem p;
    small_problem(&p);
    struct raw_conv rc;
    uint64_t need = raw_conv_init(&rc, 1, &p, 1);
    const unsigned wseals[] = {F_SEAL_WRITE, F_SEAL_FUTURE_WRITE};
    for (size_t i = 0; i < 2; i++) {
        uint64_t ro = 10 + i;
        int mfd = tu_memfd("convd-it", need, F_SEAL_SHRINK | F_SEAL_GROW | wseals[i]);
        char why[256];
        int st = raw_register(fd, ro, need, &mfd, 1, why, sizeof(why));
        close(mfd);
        if (st != 0) {
            /* Refusing a read-only region outright is acceptable too. */
            assert_true(strlen(why) >= 8);
            continue;
        }
        register_ok(fd, 20 + i, need);
        /* Inputs in the read-only region, output elsewhere: fine. */
        raw_conv_init(&rc, 100 + i, &p, ro);
        rc.out.region_id = 20 + i;
        conv_expect(fd, &rc, 0, NULL);
        /* Output in the read-only region: refused with a sentence naming the output. */
        raw_conv_init(&rc, 200 + i, &p, 20 + i);
        rc.out.region_id = ro;
        raw_conv_send(fd, &rc);
        st = raw_expect_completion(fd, rc.req.id, why, sizeof(why));
        if (st == 0)
            fail_msg("output into a write-sealed memfd (seal %#x) was accepted", wseals[i]);
        if (!raw_contains(why, "output"))
            fail_msg("output into a write-sealed memfd: %s \"%s\" does not name the output",
                     convd_status_name(st), why);
    }
    assert_pong(fd, 7);
    close(fd);
    assert_alive();
}

/* A region unregistered while a request that uses it is still queued: the unregistration
 * succeeds, the request still completes correctly, the id is free for a new region at once, and
 * the new region is the one later requests see. */
static void test_region_id_reuse_while_old_one_in_use(void **state)
{
    (void)state;
    int fd = conn();
    struct convd_problem heavy, p;
    it_heavy_problem(&heavy);
    convd_problem_init(&p, 1, 5, 5, 2, 2, 1, 1, 1); /* 1x1: y = w * x per pixel */
    struct raw_conv hc, rc;
    uint64_t hneed = raw_conv_init(&hc, 1, &heavy, 1);
    register_ok(fd, 1, hneed);
    uint64_t need = raw_conv_init(&rc, 2, &p, 5);
    /* Old region 5: inputs all 1, weights identity: the output is 1 everywhere. */
    int old_fd = tu_memfd("convd-it", need, 0);
    float *m = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, old_fd, 0);
    assert_true(m != MAP_FAILED);
    for (int i = 0; i < 25 * 2; i++)
        m[i] = 1.0f;
    m[50] = 1.0f, m[51] = 0.0f, m[52] = 0.0f, m[53] = 1.0f;
    assert_int_equal(fcntl(old_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    char why[256];
    assert_int_equal(raw_register(fd, 5, need, &old_fd, 1, why, sizeof(why)), 0);
    close(old_fd);

    raw_conv_send(fd, &hc); /* keeps the worker busy */
    raw_conv_send(fd, &rc); /* queued, uses region 5 */
    assert_int_equal(raw_unregister(fd, 5), 0);
    /* New region under the same id: inputs 2, weights identity. */
    int new_fd = tu_memfd("convd-it", need, 0);
    float *n2 = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, new_fd, 0);
    assert_true(n2 != MAP_FAILED);
    for (int i = 0; i < 25 * 2; i++)
        n2[i] = 2.0f;
    n2[50] = 1.0f, n2[51] = 0.0f, n2[52] = 0.0f, n2[53] = 1.0f;
    assert_int_equal(fcntl(new_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    int st = raw_register(fd, 5, need, &new_fd, 1, why, sizeof(why));
    close(new_fd);
    if (st != 0)
        fail_msg("re-registering id 5 after unregistering it: %s (%s)", convd_status_name(st), why);
    rc.req.id = 3;
    raw_conv_send(fd, &rc);
    /* Completions: the heavy one, and 2 then 3 in some order. */
    bool seen[4] = {false};
    for (int i = 0; i < 3; i++) {
        Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_COMPLETION);
        uint64_t id = r->completion->id;
        assert_true(id >= 1 && id <= 3);
        if (r->completion->status != 0)
            fail_msg("request %llu: %s (%s)", (unsigned long long)id,
                     convd_status_name(r->completion->status), r->completion->error);
        seen[id] = true;
        raw_free(r);
    }
    assert_true(seen[1] && seen[2] && seen[3]);
    for (int i = 0; i < 50; i++) {
        if (m[54 + i] != 1.0f)
            fail_msg("request 2 (old region 5) output[%d] = %g, want 1", i, (double)m[54 + i]);
        if (n2[54 + i] != 2.0f)
            fail_msg("request 3 (new region 5) output[%d] = %g, want 2", i, (double)n2[54 + i]);
    }
    munmap(m, need);
    munmap(n2, need);
    close(fd);
    assert_alive();
}

/* Deadlines at the edge of the 64-bit range must not overflow into "already passed" or crash. */
static void test_extreme_deadlines(void **state)
{
    (void)state;
    int fd = conn();
    register_ok(fd, 1, REGION_SIZE);
    struct convd_problem p;
    small_problem(&p);
    struct raw_conv rc;
    const uint64_t deadlines[] = {UINT64_MAX, UINT64_MAX / 1000 + 1, (uint64_t)1 << 63};
    for (size_t i = 0; i < 3; i++) {
        raw_conv_init(&rc, 1 + i, &p, 1);
        rc.req.timeout_us = deadlines[i];
        raw_conv_send(fd, &rc);
        char why[256];
        int st = raw_expect_completion(fd, rc.req.id, why, sizeof(why));
        if (st != 0 && st != CONVD_EINVAL)
            fail_msg("timeout_us %llu: %s (%s), want OK (no effective deadline) or EINVAL",
                     (unsigned long long)deadlines[i], convd_status_name(st), why);
    }
    close(fd);
    assert_alive();
}

static void test_region_limits(void **state)
{
    (void)state;
    int fd = raw_connect(daemon_.sock);
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__Hello h = CONVD__HELLO__INIT;
    h.protocol_version = 1;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_HELLO;
    m.hello = &h;
    raw_send(fd, &m, NULL, 0);
    Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY);
    assert_int_equal(r->hello_reply->status, 0);
    uint32_t max_regions = r->hello_reply->max_regions;
    uint64_t max_bytes = r->hello_reply->max_mapped_bytes;
    raw_free(r);
    assert_true(max_regions > 0 && max_regions <= 4096);
    /* One region over the byte limit (a sparse memfd: nothing is allocated). */
    int mfd = tu_memfd("convd-it", max_bytes + 4096, F_SEAL_SHRINK | F_SEAL_GROW);
    register_expect(fd, 1, max_bytes + 4096, &mfd, 1, CONVD_ELIMIT, NULL);
    close(mfd);
    /* As many regions as allowed, then one more. */
    for (uint32_t i = 0; i < max_regions; i++)
        register_ok(fd, 100 + i, 4096);
    mfd = tu_memfd("convd-it", 4096, F_SEAL_SHRINK | F_SEAL_GROW);
    register_expect(fd, 100 + max_regions, 4096, &mfd, 1, CONVD_ELIMIT, "region");
    /* Freeing one makes room again. */
    assert_int_equal(raw_unregister(fd, 100), 0);
    register_expect(fd, 100 + max_regions, 4096, &mfd, 1, CONVD_OK, NULL);
    close(mfd);
    close(fd); /* all of them left registered: the daemon releases them */
    assert_alive();
}

/*
 * Request ids and flow control. A few heavy requests keep the workers busy so that what follows
 * is certainly still in flight when the next message arrives.
 */

static void test_duplicate_request_id(void **state)
{
    (void)state;
    int fd = conn();
    struct convd_problem heavy, p;
    it_heavy_problem(&heavy);
    small_problem(&p);
    struct raw_conv hc, rc;
    uint64_t need = raw_conv_init(&hc, 1, &heavy, 1);
    register_ok(fd, 1, need);
    register_ok(fd, 2, REGION_SIZE);
    raw_conv_send(fd, &hc);
    /* Same id while the first is in flight. */
    raw_conv_init(&rc, 1, &p, 2);
    raw_conv_send(fd, &rc);
    char why[256];
    int st1 = raw_expect_completion(fd, 1, why, sizeof(why));
    if (st1 != CONVD_EEXIST)
        fail_msg("duplicate id 1 in flight: first completion %s (%s), want EEXIST",
                 convd_status_name(st1), why);
    assert_true(strlen(why) >= 8);
    int st2 = raw_expect_completion(fd, 1, why, sizeof(why));
    if (st2 != 0)
        fail_msg("the original request 1: %s (%s)", convd_status_name(st2), why);
    /* Once completed, the id may be used again. */
    conv_expect(fd, &rc, 0, NULL);
    close(fd);
    assert_alive();
}

static void test_too_many_in_flight(void **state)
{
    (void)state;
    int fd = conn();
    struct convd_server_info info;
    convd_server_info(daemon_.mon, &info);
    uint32_t max = info.max_inflight;
    struct convd_problem heavy, p;
    it_heavy_problem(&heavy);
    small_problem(&p);
    struct raw_conv hc, rc;
    uint64_t need = raw_conv_init(&hc, 1, &heavy, 1);
    register_ok(fd, 1, need);
    register_ok(fd, 2, REGION_SIZE);
    raw_conv_init(&rc, 0, &p, 2);
    uint32_t total = max + 32;
    int *status = calloc(total + 1, sizeof(int));
    bool *seen = calloc(total + 1, sizeof(bool));
    assert_non_null(status);
    assert_non_null(seen);
    /* Two heavy requests first, then small ones past the limit. Replies are read afterwards; the
     * daemon must buffer them meanwhile. */
    for (uint64_t id = 1; id <= total; id++) {
        if (id <= 2) {
            hc.req.id = id;
            raw_conv_send(fd, &hc);
        } else {
            rc.req.id = id;
            raw_conv_send(fd, &rc);
        }
    }
    uint32_t ok = 0, limited = 0;
    for (uint32_t n = 0; n < total; n++) {
        Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_COMPLETION);
        uint64_t id = r->completion->id;
        assert_true(id >= 1 && id <= total);
        assert_false(seen[id]);
        seen[id] = true;
        status[id] = r->completion->status;
        if (status[id] == 0) {
            ok++;
        } else if (status[id] == CONVD_ELIMIT) {
            limited++;
            if (strlen(r->completion->error) < 8)
                fail_msg("ELIMIT without a sentence");
        } else {
            fail_msg("request %llu: %s (%s), want OK or ELIMIT", (unsigned long long)id,
                     convd_status_name(status[id]), r->completion->error);
        }
        raw_free(r);
    }
    print_message("max_inflight %u: %u ran, %u refused with ELIMIT\n", max, ok, limited);
    assert_int_equal(ok + limited, total);
    assert_true(limited >= 1);
    assert_true(ok >= max);
    assert_int_equal(status[1], 0);
    free(status);
    free(seen);
    close(fd);
    assert_alive();
}

static void test_zz_worker_correct_no_leaks_clean_exit(void **state)
{
    (void)state;
    it_worker_stop(&worker_);
    it_daemon_check_clean(&daemon_);
    it_daemon_stop(&daemon_);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_garbage_datagrams),
        cmocka_unit_test(test_truncated_protobuf),
        cmocka_unit_test(test_valid_protobuf_wrong_type),
        cmocka_unit_test(test_empty_datagram),
        cmocka_unit_test(test_empty_datagram_with_fds),
        cmocka_unit_test(test_huge_padding_memory),
        cmocka_unit_test(test_messages_before_hello),
        cmocka_unit_test(test_wrong_protocol_version),
        cmocka_unit_test(test_protocol1_activations),
        cmocka_unit_test(test_hello_odd_client_names),
        cmocka_unit_test(test_oversized_datagram),
        cmocka_unit_test(test_bad_shapes),
        cmocka_unit_test(test_bad_tensor_references),
        cmocka_unit_test(test_bad_regions),
        cmocka_unit_test(test_write_sealed_region),
        cmocka_unit_test(test_region_id_reuse_while_old_one_in_use),
        cmocka_unit_test(test_extreme_deadlines),
        cmocka_unit_test(test_region_limits),
        cmocka_unit_test(test_duplicate_request_id),
        cmocka_unit_test(test_too_many_in_flight),
        cmocka_unit_test(test_zz_worker_correct_no_leaks_clean_exit),
    };
    return cmocka_run_group_tests_name("integration: hostile input", tests, group_setup,
                                       group_teardown);
}
