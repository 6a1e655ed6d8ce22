/*
 * Submission and completion rings in shared memory (common/ring_layout.h, docs/protocol.md
 * "Rings") against a real daemon: AttachRing and its refusals, requests and completions through
 * a ring written by hand, both doorbells, bad entries answered on the socket with the same codes
 * as the socket path, impossible indices, a completion ring nobody reads, a client that leaves
 * with work in its ring, and the client library over rings and over the socket. A well-behaved
 * client (a separate process) keeps running checked convolutions in parallel the whole time; the
 * daemon must keep serving it and end with nothing leaked.
 *
 * The daemon runs with ring_stall_timeout_ms = 300 so that the unread-ring test takes a moment.
 */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"
#include "raw.h"
#include "wire.h"

static struct it_daemon daemon_;
static struct it_worker worker_;
/* The daemon's ring mappings while only the monitor and the worker are connected. */
static int base_ring_maps;

#define STALL_TIMEOUT_MS 300 /* the daemon's ring_stall_timeout_ms here */
#define STR_(x)          #x
#define STR(x)           STR_(x)
#define SEALED           (F_SEAL_SHRINK | F_SEAL_GROW)
#define REGION_SIZE      (1u << 20)

/* Waits (bounded) until the daemon holds `want` ring mappings, and asserts it. */
static void wait_ring_maps(int want)
{
    uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
    int n;
    while ((n = it_count_ring_maps(daemon_.pid)) != want && tu_now_ms() < end)
        tu_sleep_ms(5);
    if (n != want)
        fail_msg("the daemon holds %d ring mappings, want %d", n, want);
}

static int group_setup(void **state)
{
    (void)state;
    const char *extra[] = {"--ring-stall-timeout-ms", STR(STALL_TIMEOUT_MS), NULL};
    it_daemon_start(&daemon_, extra);
    it_worker_start(&worker_, &daemon_, tu_rng_next(it_rng()));
    /* Wait for the worker to be connected (with rings when the monitor has them: both follow
     * $CONVD_RINGS), so that the daemon's ring mappings only change with what the tests do. */
    uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
    struct convd_status st = {0};
    for (;;) {
        assert_int_equal(convd_status_get(daemon_.mon, &st), 0);
        if (st.clients == daemon_.base_clients + 1 &&
            it_count_ring_maps(daemon_.pid) == 2 * daemon_.base_ring_maps)
            break;
        if (tu_now_ms() > end)
            fail_msg("the worker did not connect: %u clients, %d ring mappings", st.clients,
                     it_count_ring_maps(daemon_.pid));
        tu_sleep_ms(5);
    }
    base_ring_maps = 2 * daemon_.base_ring_maps;
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

/* Raw connections a test opened: a failed test leaves its own open, and the teardown closes
 * them so that the next test starts from the baseline. */
#define MAX_OPEN 8
static int open_fds[MAX_OPEN];
static int n_open;

static int open_conn(void)
{
    int fd = raw_connect(daemon_.sock);
    assert_true(n_open < MAX_OPEN);
    open_fds[n_open++] = fd;
    return fd;
}

static void close_conn(int fd)
{
    for (int i = 0; i < n_open; i++)
        if (open_fds[i] == fd) {
            open_fds[i] = open_fds[--n_open];
            break;
        }
    close(fd);
}

/* A connection that has completed its handshake. */
static int conn(void)
{
    int fd = open_conn();
    raw_hello(fd);
    return fd;
}

static int close_leftovers(void **state)
{
    (void)state;
    if (n_open == 0)
        return 0;
    while (n_open > 0)
        close(open_fds[--n_open]);
    /* Give the daemon a moment to drop what they held (no assert: the test failed already). */
    uint64_t end = tu_now_ms() + 10000;
    while (it_count_ring_maps(daemon_.pid) > base_ring_maps && tu_now_ms() < end)
        tu_sleep_ms(10);
    return 0;
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

/* The connection still works: a Ping gets its Pong, and nothing else comes first. */
static void assert_pong(int fd, uint64_t tag)
{
    send_ping(fd, tag);
    Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_PONG);
    assert_int_equal(r->pong->tag, tag);
    raw_free(r);
}

/* Nothing waits on the socket. */
static void assert_socket_quiet(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 0) != 0) {
        Convd__ServerMessage *m = raw_recv(fd);
        fail_msg("unexpected message on the socket (case %d)", m != NULL ? (int)m->msg_case : -1);
    }
}

/* A sentence that says something, and names the problem. */
static void assert_sentence(const char *what, int status, const char *why, const char *word)
{
    if (strlen(why) < 8 || (word != NULL && !raw_contains(why, word)))
        fail_msg("%s: %s with sentence \"%s\", which does not name \"%s\"", what,
                 convd_status_name(status), why, word != NULL ? word : "");
}

/* The next message is a ProtocolError with this status whose sentence names both words. */
static void expect_protocol_error(int fd, int status, const char *word1, const char *word2)
{
    /* The daemon closes the connection after it, perhaps with a Doorbell of ours unread. */
    Convd__ServerMessage *r = raw_recv_past_reset(fd);
    if (r == NULL)
        fail_msg("the daemon closed the connection without a ProtocolError (%s, \"%s\")",
                 convd_status_name(status), word2);
    if (r->msg_case != CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR)
        fail_msg("expected ProtocolError %s (\"%s\"), got message case %d",
                 convd_status_name(status), word2, (int)r->msg_case);
    const char *err = r->protocol_error->error != NULL ? r->protocol_error->error : "";
    if (r->protocol_error->status != status)
        fail_msg("ProtocolError %s (%s), want %s", convd_status_name(r->protocol_error->status),
                 err, convd_status_name(status));
    assert_sentence("ProtocolError", status, err, word1);
    assert_sentence("ProtocolError", status, err, word2);
    raw_free(r);
}

/* AttachRing refused with this status and a sentence naming the problem; the connection goes
 * on (a Ping gets its Pong) and the daemon mapped nothing. */
static void attach_expect_maps(int fd, uint32_t version, uint32_t sq, uint32_t cq, uint64_t size,
                               const int *fds, size_t nfds, int status, const char *word,
                               uint64_t *tag, int maps)
{
    char why[256];
    int st = raw_attach_ring(fd, version, sq, cq, size, fds, nfds, why, sizeof(why));
    if (st != status)
        fail_msg("AttachRing (version %u, %u/%u entries, %llu bytes, %zu fds): %s (%s), want %s",
                 version, sq, cq, (unsigned long long)size, nfds, convd_status_name(st), why,
                 convd_status_name(status));
    if (status != 0) {
        assert_sentence("AttachRing", st, why, word);
        assert_pong(fd, (*tag)++);
        assert_int_equal(it_count_ring_maps(daemon_.pid), maps);
    }
}

static void attach_expect(int fd, uint32_t version, uint32_t sq, uint32_t cq, uint64_t size,
                          const int *fds, size_t nfds, int status, const char *word, uint64_t *tag)
{
    attach_expect_maps(fd, version, sq, cq, size, fds, nfds, status, word, tag, base_ring_maps);
}

/* Registers a sealed memfd of `size` bytes as region_id; asserts success. */
static void register_ok(int fd, uint64_t region_id, uint64_t size)
{
    int mfd = tu_memfd("convd-it", size, SEALED);
    char why[256];
    int st = raw_register(fd, region_id, size, &mfd, 1, why, sizeof(why));
    close(mfd);
    if (st != 0)
        fail_msg("register region %llu: %s: %s", (unsigned long long)region_id,
                 convd_status_name(st), why);
}

/* The small problem most request tests start from. */
static void small_problem(struct convd_problem *p)
{
    convd_problem_init(p, 1, 6, 6, 4, 8, 3, 3, 2);
    p->pad_top = p->pad_bottom = p->pad_left = p->pad_right = 1;
    p->has_bias = true;
}

/*
 * One problem in its own region: the tensors of raw_conv_init laid out in a memfd the test
 * maps too, inputs random, output poisoned, reference computed.
 */
struct ring_case {
    struct convd_problem p;
    struct convd_problem_sizes z;
    struct raw_conv rc;
    uint8_t *mem;
    uint64_t len;
    float *ref;
};

static void case_init(int fd, struct ring_case *t, uint64_t id, uint64_t region_id,
                      const struct convd_problem *p)
{
    memset(t, 0, sizeof(*t));
    t->p = *p;
    assert_int_equal(convd_problem_sizes(p, &t->z, NULL, 0), 0);
    t->len = raw_conv_init(&t->rc, id, p, region_id);
    int mfd = tu_memfd("convd-it", t->len, 0);
    t->mem = mmap(NULL, t->len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    assert_true(t->mem != MAP_FAILED);
    assert_int_equal(fcntl(mfd, F_ADD_SEALS, SEALED), 0);
    struct tu_rng *g = it_rng();
    tu_fill_random(g, p->dtype, t->mem + t->rc.in.offset, t->z.input_elems);
    tu_fill_random(g, p->dtype, t->mem + t->rc.w.offset, t->z.weight_elems);
    if (p->has_bias)
        tu_fill_random(g, p->dtype, t->mem + t->rc.b.offset, t->z.bias_elems);
    tu_poison(t->mem + t->rc.out.offset, t->z.output_bytes);
    t->ref = malloc(sizeof(float) * t->z.output_elems);
    assert_non_null(t->ref);
    tu_ref_conv(p, t->mem + t->rc.in.offset, t->mem + t->rc.w.offset,
                p->has_bias ? t->mem + t->rc.b.offset : NULL, t->ref);
    char why[256];
    int st = raw_register(fd, region_id, t->len, &mfd, 1, why, sizeof(why));
    close(mfd);
    if (st != 0)
        fail_msg("register region %llu: %s: %s", (unsigned long long)region_id,
                 convd_status_name(st), why);
}

static void case_check(const struct ring_case *t)
{
    size_t bad = 0;
    double err =
        tu_rel_error(t->p.dtype, t->mem + t->rc.out.offset, t->ref, t->z.output_elems, &bad);
    if (err > tu_tolerance(t->p.dtype)) {
        char desc[128];
        convd_problem_str(&t->p, desc, sizeof(desc));
        fail_msg("request %llu (%s): relative error %g > %g (element %zu: got %g, want %g)",
                 (unsigned long long)t->rc.req.id, desc, err, tu_tolerance(t->p.dtype), bad,
                 (double)tu_load(t->p.dtype, t->mem + t->rc.out.offset, bad), (double)t->ref[bad]);
    }
}

static void case_fini(struct ring_case *t)
{
    munmap(t->mem, t->len);
    free(t->ref);
    t->ref = NULL;
}

/* A random problem the daemon runs (allow_tf32 left clear). */
static void random_problem(struct convd_problem *p)
{
    tu_random_problem(it_rng(), p, 0, 0, 4);
    p->allow_tf32 = false;
}

/* A successful ring completion of this id. */
static void expect_cqe_ok(int fd, struct raw_ring *r, uint64_t id)
{
    struct convd_ring_cqe cqe;
    char why[256];
    int st = raw_ring_expect_completion(fd, r, id, &cqe, why, sizeof(why));
    if (st != 0)
        fail_msg("request %llu: %s (%s)", (unsigned long long)id, convd_status_name(st), why);
    assert_int_equal(cqe.id, id);
    assert_int_equal(cqe.status, 0);
    assert_true(cqe.batch_size >= 1);
    assert_int_equal(cqe.reserved, 0);
}

/* Waits (bounded) until the daemon has taken `n` submissions in all. */
static void wait_sq_head(struct raw_ring *r, uint32_t n)
{
    uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
    while (atomic_load_explicit(&r->hdr->sq_head, memory_order_acquire) != n) {
        if (tu_now_ms() > end)
            fail_msg("the daemon took %u submissions, want %u", atomic_load(&r->hdr->sq_head), n);
        tu_sleep_ms(1);
    }
}

/* The heavy problem in a sparse region of its own (inputs zero; the result is not checked). */
static void heavy_conv(int fd, struct raw_conv *hc, uint64_t id, uint64_t region_id)
{
    struct convd_problem heavy;
    it_heavy_problem(&heavy);
    uint64_t need = raw_conv_init(hc, id, &heavy, region_id);
    register_ok(fd, region_id, need);
}

/*
 * Handshake and AttachRing.
 */

static void test_hello_ring_version(void **state)
{
    (void)state;
    const uint32_t versions[] = {1, CONVD_PROTOCOL_VERSION, CONVD_PROTOCOL_VERSION + 1};
    for (size_t i = 0; i < 3; i++) {
        int fd = open_conn();
        Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
        Convd__Hello h = CONVD__HELLO__INIT;
        h.protocol_version = versions[i];
        h.client_name = "it-rings";
        m.msg_case = CONVD__CLIENT_MESSAGE__MSG_HELLO;
        m.hello = &h;
        raw_send(fd, &m, NULL, 0);
        Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY);
        if (versions[i] <= CONVD_PROTOCOL_VERSION) {
            assert_int_equal(r->hello_reply->status, 0);
            assert_int_equal(r->hello_reply->ring_version, CONVD_RING_VERSION);
            assert_int_equal(r->hello_reply->ring_version, 1);
        } else {
            /* A refused Hello announces no rings (the field is filled only on success). */
            assert_int_equal(r->hello_reply->status, CONVD_EVERSION);
            assert_int_equal(r->hello_reply->ring_version, 0);
        }
        raw_free(r);
        close_conn(fd);
    }
    assert_alive();
}

static void test_attach_refusals(void **state)
{
    (void)state;
    uint64_t tag = 1;
    const uint64_t size = convd_ring_bytes(16, 16);
    int fd = open_conn();
    /* Before Hello: a protocol error, and the descriptor is not kept. */
    int good = tu_memfd("convd-it", size, SEALED);
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__AttachRing ar = CONVD__ATTACH_RING__INIT;
    ar.version = 1;
    ar.sq_entries = ar.cq_entries = 16;
    ar.size = size;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_ATTACH_RING;
    m.attach_ring = &ar;
    raw_send(fd, &m, &good, 1);
    expect_protocol_error(fd, CONVD_EPROTO, "hello", "AttachRing");
    raw_hello(fd);
    assert_pong(fd, tag++);
    assert_int_equal(it_count_ring_maps(daemon_.pid), base_ring_maps);

    /* No descriptor, two. */
    attach_expect(fd, 1, 16, 16, size, NULL, 0, CONVD_EINVAL, "descriptor", &tag);
    int two[2] = {good, tu_memfd("convd-it", size, SEALED)};
    attach_expect(fd, 1, 16, 16, size, two, 2, CONVD_EINVAL, "descriptor", &tag);
    close(two[1]);
    /* Layout versions it does not take. */
    attach_expect(fd, 2, 16, 16, size, &good, 1, CONVD_EVERSION, "version 2", &tag);
    attach_expect(fd, 0, 16, 16, size, &good, 1, CONVD_EVERSION, "version", &tag);
    /* Entry counts: zero, not a power of two, past 4096; on either side. */
    const uint32_t counts[] = {0, 3, 8192};
    for (size_t i = 0; i < 3; i++) {
        attach_expect(fd, 1, counts[i], 16, size, &good, 1, CONVD_EINVAL, "power of two", &tag);
        attach_expect(fd, 1, 16, counts[i], size, &good, 1, CONVD_EINVAL, "power of two", &tag);
    }
    /* A size the layout does not give for these counts. */
    attach_expect(fd, 1, 16, 16, size + 4096, &good, 1, CONVD_EINVAL, "size", &tag);
    attach_expect(fd, 1, 16, 16, size - 4096, &good, 1, CONVD_EINVAL, "size", &tag);
    attach_expect(fd, 1, 32, 16, size, &good, 1, CONVD_EINVAL, "size", &tag);
    /* Seals: none, and against writing (the daemon writes completions into the ring). */
    int mfd = tu_memfd("convd-it", size, 0);
    attach_expect(fd, 1, 16, 16, size, &mfd, 1, CONVD_ESEAL, "sealed", &tag);
    close(mfd);
    mfd = tu_memfd("convd-it", size, F_SEAL_GROW);
    attach_expect(fd, 1, 16, 16, size, &mfd, 1, CONVD_ESEAL, "F_SEAL_SHRINK", &tag);
    close(mfd);
    mfd = tu_memfd("convd-it", size, SEALED | F_SEAL_WRITE);
    attach_expect(fd, 1, 16, 16, size, &mfd, 1, CONVD_ESEAL, "writing", &tag);
    close(mfd);
    mfd = tu_memfd("convd-it", size, SEALED | F_SEAL_FUTURE_WRITE);
    attach_expect(fd, 1, 16, 16, size, &mfd, 1, CONVD_ESEAL, "writing", &tag);
    close(mfd);
    /* A memfd smaller than the ring it claims to hold. */
    mfd = tu_memfd("convd-it", 4096, SEALED);
    attach_expect(fd, 1, 16, 16, size, &mfd, 1, CONVD_EBOUNDS, "memfd", &tag);
    close(mfd);
    /* Not a memfd at all. */
    int p[2];
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    attach_expect(fd, 1, 16, 16, size, &p[0], 1, CONVD_ESEAL, "memfd", &tag);
    close(p[0]);
    close(p[1]);
    close(good);

    /* After all that, a correct attach works and the rings serve; a second one is refused and
     * leaves the first in place. */
    struct raw_ring r;
    raw_ring_create(&r, 16, 16);
    raw_ring_attach(fd, &r);
    assert_int_equal(it_count_ring_maps(daemon_.pid), base_ring_maps + 1);
    struct raw_ring r2;
    raw_ring_create(&r2, 16, 16);
    attach_expect_maps(fd, 1, 16, 16, r2.len, &r2.memfd, 1, CONVD_EEXIST, "already", &tag,
                       base_ring_maps + 1);
    raw_ring_destroy(&r2);
    assert_int_equal(it_count_ring_maps(daemon_.pid), base_ring_maps + 1);
    struct ring_case t;
    struct convd_problem pr;
    small_problem(&pr);
    case_init(fd, &t, 1, 1, &pr);
    raw_ring_submit(fd, &r, &t.rc);
    expect_cqe_ok(fd, &r, 1);
    case_check(&t);
    case_fini(&t);
    assert_pong(fd, tag++);
    close_conn(fd);
    raw_ring_destroy(&r);
    wait_ring_maps(base_ring_maps);
    assert_alive();
}

/*
 * Requests through a ring.
 */

static void test_ring_requests(void **state)
{
    (void)state;
    int fd = conn();
    struct raw_ring r;
    raw_ring_create(&r, 16, 16);
    raw_ring_attach(fd, &r);
    /* One at a time, then eight at once, all random problems. */
    enum { ONE = 4, MANY = 8 };
    struct ring_case t[ONE + MANY];
    for (int i = 0; i < ONE + MANY; i++) {
        struct convd_problem p;
        random_problem(&p);
        case_init(fd, &t[i], 100 + (uint64_t)i, 10 + (uint64_t)i, &p);
    }
    /* The RingReply was counted in sock_seq; successes never touch the socket. */
    uint32_t seq = atomic_load(&r.hdr->sock_seq);
    assert_true(seq >= 1);
    for (int i = 0; i < ONE; i++) {
        raw_ring_submit(fd, &r, &t[i].rc);
        expect_cqe_ok(fd, &r, t[i].rc.req.id);
        case_check(&t[i]);
    }
    for (int i = ONE; i < ONE + MANY; i++) {
        struct convd_ring_sqe e;
        raw_ring_sqe_from_conv(&t[i].rc, &e);
        raw_ring_put(&r, &e);
    }
    raw_ring_publish(fd, &r);
    bool seen[MANY] = {false};
    for (int n = 0; n < MANY; n++) {
        struct convd_ring_cqe cqe;
        Convd__ServerMessage *m = NULL;
        if (!raw_ring_next(fd, &r, &cqe, &m))
            fail_msg("a message on the socket (case %d) where ring completions were due",
                     m != NULL ? (int)m->msg_case : -1);
        assert_true(cqe.id >= 100 + ONE && cqe.id < 100 + ONE + MANY);
        assert_false(seen[cqe.id - 100 - ONE]);
        seen[cqe.id - 100 - ONE] = true;
        assert_int_equal(cqe.status, 0);
        assert_true(cqe.batch_size >= 1);
    }
    for (int i = ONE; i < ONE + MANY; i++)
        case_check(&t[i]);
    assert_int_equal(atomic_load(&r.hdr->sq_head), ONE + MANY);
    assert_int_equal(atomic_load(&r.hdr->cq_tail), ONE + MANY);
    assert_int_equal(atomic_load(&r.hdr->sock_seq), seq);
    assert_socket_quiet(fd);
    /* A message on the socket is counted. */
    assert_pong(fd, 1);
    assert_int_equal(atomic_load(&r.hdr->sock_seq), seq + 1);
    for (int i = 0; i < ONE + MANY; i++)
        case_fini(&t[i]);
    close_conn(fd);
    raw_ring_destroy(&r);
    wait_ring_maps(base_ring_maps);
    assert_alive();
}

/* The worker is stopped for the doorbell test, so that nothing but the doorbell can wake the
 * daemon; this teardown lets it go on even when the test fails. */
static int continue_worker(void **state)
{
    if (worker_.pid > 0)
        kill(worker_.pid, SIGCONT);
    return close_leftovers(state);
}

/* The daemon has gone to sleep (NEED_WAKEUP set): a submission followed by a Doorbell wakes it,
 * and the Doorbell itself gets no answer. A daemon timer may wake it just as the test submits
 * (then no Doorbell is due): such rounds are repeated until three went through a Doorbell. */
static void test_doorbell_wakes_sleeping_daemon(void **state)
{
    (void)state;
    int fd = conn();
    struct raw_ring r;
    raw_ring_create(&r, 16, 16);
    raw_ring_attach(fd, &r);
    struct ring_case t;
    struct convd_problem p;
    small_problem(&p);
    case_init(fd, &t, 1, 1, &p);
    /* Only the monitor (idle) and this connection are left to keep the daemon busy. */
    assert_int_equal(kill(worker_.pid, SIGSTOP), 0);
    int rung = 0, attempt = 0;
    for (; rung < 3; attempt++) {
        if (attempt == 20)
            fail_msg("only %d of %d submissions found the daemon asleep", rung, attempt);
        /* The daemon spins spin_us (50 us) after its last work, then sleeps with NEED_WAKEUP
         * set on every ring. */
        uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
        while (!(atomic_load(&r.hdr->daemon_flags) & CONVD_RING_NEED_WAKEUP)) {
            if (tu_now_ms() > end)
                fail_msg("the daemon never set NEED_WAKEUP on an idle ring");
            tu_sleep_ms(5);
        }
        tu_sleep_ms(50);
        t.rc.req.id = 100 + (uint64_t)attempt;
        tu_poison(t.mem + t.rc.out.offset, t.z.output_bytes);
        struct convd_ring_sqe e;
        raw_ring_sqe_from_conv(&t.rc, &e);
        raw_ring_put(&r, &e);
        if (raw_ring_publish(fd, &r))
            rung++;
        expect_cqe_ok(fd, &r, t.rc.req.id);
        case_check(&t);
        /* No answer to the Doorbell: the next message is the Pong. */
        assert_pong(fd, 10 + (uint64_t)attempt);
    }
    print_message("%d of %d submissions rang the doorbell\n", rung, attempt);
    assert_int_equal(kill(worker_.pid, SIGCONT), 0);
    case_fini(&t);
    close_conn(fd);
    raw_ring_destroy(&r);
    wait_ring_maps(base_ring_maps);
    assert_alive();
}

/* What a client put in its ring before a socket message is taken before that message is
 * handled (docs/protocol.md, "Ordering"): with the daemon asleep and no Doorbell rung, an
 * UnregisterRegion sent right after a submission that uses the region comes after it, so the
 * request runs and the unregistration succeeds. */
static void test_ring_taken_before_socket_message(void **state)
{
    (void)state;
    int fd = conn();
    struct raw_ring r;
    raw_ring_create(&r, 16, 16);
    raw_ring_attach(fd, &r);
    enum { ROUNDS = 3 };
    struct ring_case t[ROUNDS];
    struct convd_problem p;
    small_problem(&p);
    for (int i = 0; i < ROUNDS; i++)
        case_init(fd, &t[i], 1 + (uint64_t)i, 5 + (uint64_t)i, &p);
    assert_int_equal(kill(worker_.pid, SIGSTOP), 0);
    for (int i = 0; i < ROUNDS; i++) {
        uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
        while (!(atomic_load(&r.hdr->daemon_flags) & CONVD_RING_NEED_WAKEUP)) {
            if (tu_now_ms() > end)
                fail_msg("the daemon never set NEED_WAKEUP on an idle ring");
            tu_sleep_ms(5);
        }
        struct convd_ring_sqe e;
        raw_ring_sqe_from_conv(&t[i].rc, &e);
        raw_ring_put(&r, &e);
        atomic_store_explicit(&r.hdr->sq_tail, r.sq_tail, memory_order_release);
        int st = raw_unregister(fd, t[i].rc.in.region_id);
        if (st != 0)
            fail_msg("UnregisterRegion after a submission: %s", convd_status_name(st));
        expect_cqe_ok(fd, &r, t[i].rc.req.id);
        case_check(&t[i]);
    }
    assert_int_equal(kill(worker_.pid, SIGCONT), 0);
    for (int i = 0; i < ROUNDS; i++)
        case_fini(&t[i]);
    close_conn(fd);
    raw_ring_destroy(&r);
    wait_ring_maps(base_ring_maps);
    assert_alive();
}

/* The smallest rings (one entry each) serve requests one after another. */
static void test_one_entry_ring(void **state)
{
    (void)state;
    int fd = conn();
    struct raw_ring r;
    raw_ring_create(&r, 1, 1);
    raw_ring_attach(fd, &r);
    for (int i = 0; i < 5; i++) {
        struct ring_case t;
        struct convd_problem p;
        random_problem(&p);
        case_init(fd, &t, 1 + (uint64_t)i, 1 + (uint64_t)i, &p);
        raw_ring_submit(fd, &r, &t.rc);
        expect_cqe_ok(fd, &r, t.rc.req.id);
        case_check(&t);
        case_fini(&t);
    }
    assert_int_equal(atomic_load(&r.hdr->cq_tail), 5);
    close_conn(fd);
    raw_ring_destroy(&r);
    wait_ring_maps(base_ring_maps);
    assert_alive();
}

/* A ring request that fails after it was queued (its deadline passes behind a heavy request on
 * the daemon's one worker) completes on the socket, naming the timeout, and gives its room in
 * the completion ring back: afterwards two requests still fit in a ring of two. */
static void test_failure_after_queueing_gives_room_back(void **state)
{
    (void)state;
    int fd = conn();
    struct raw_ring r;
    raw_ring_create(&r, 4, 2);
    raw_ring_attach(fd, &r);
    struct raw_conv hc;
    heavy_conv(fd, &hc, 1, 1);
    hc.req.priority = 0;
    struct ring_case t[2];
    struct convd_problem p;
    small_problem(&p);
    case_init(fd, &t[0], 3, 3, &p);
    case_init(fd, &t[1], 4, 4, &p);
    struct raw_conv rc = t[0].rc;
    rc.req.id = 2;
    rc.req.priority = 3;
    rc.req.timeout_us = 1;
    struct convd_ring_sqe e;
    raw_ring_sqe_from_conv(&hc, &e);
    raw_ring_put(&r, &e);
    raw_ring_sqe_from_conv(&rc, &e);
    raw_ring_put(&r, &e);
    raw_ring_publish(fd, &r);
    char why[320];
    int st = raw_ring_expect_completion(fd, &r, 2, NULL, why, sizeof(why));
    if (st != CONVD_ETIMEDOUT)
        fail_msg("request 2 (timeout 1 us, behind a heavy one): %s (%s), want ETIMEDOUT",
                 convd_status_name(st), why);
    assert_sentence("expired request", st, why, "timeout");
    expect_cqe_ok(fd, &r, 1);
    /* Both fit: neither waits for the other's completion to be read. */
    for (int i = 0; i < 2; i++) {
        raw_ring_sqe_from_conv(&t[i].rc, &e);
        raw_ring_put(&r, &e);
    }
    raw_ring_publish(fd, &r);
    uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
    while (raw_ring_cq_ready(&r) < 2) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 1) > 0) {
            Convd__ServerMessage *m = raw_recv(fd);
            if (m != NULL && m->msg_case == CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR)
                fail_msg("with %u completion(s) in a ring of two: ProtocolError %s: %s",
                         raw_ring_cq_ready(&r), convd_status_name(m->protocol_error->status),
                         m->protocol_error->error);
            fail_msg("with %u completion(s) in a ring of two: message case %d on the socket",
                     raw_ring_cq_ready(&r), m != NULL ? (int)m->msg_case : -1);
        }
        if (tu_now_ms() > end)
            fail_msg("only %u of 2 requests completed in a ring of two", raw_ring_cq_ready(&r));
    }
    bool seen[2] = {false, false};
    for (int i = 0; i < 2; i++) {
        struct convd_ring_cqe cqe;
        assert_true(raw_ring_wait_cqe(&r, &cqe, 0));
        assert_true(cqe.id == 3 || cqe.id == 4);
        assert_int_equal(cqe.status, 0);
        seen[cqe.id - 3] = true;
    }
    assert_true(seen[0] && seen[1]);
    for (int i = 0; i < 2; i++) {
        case_check(&t[i]);
        case_fini(&t[i]);
    }
    assert_pong(fd, 1);
    close_conn(fd);
    raw_ring_destroy(&r);
    wait_ring_maps(base_ring_maps);
    assert_alive();
}

/* A client that sleeps on its socket sets WAITING: the daemon sends a Doorbell after posting,
 * and the completion is in the ring by then. Without WAITING, no Doorbell. */
static void test_doorbell_to_waiting_client(void **state)
{
    (void)state;
    int fd = conn();
    struct raw_ring r;
    raw_ring_create(&r, 16, 16);
    raw_ring_attach(fd, &r);
    struct ring_case t[4];
    struct convd_problem p;
    small_problem(&p);
    for (int i = 0; i < 4; i++)
        case_init(fd, &t[i], 1 + (uint64_t)i, 1 + (uint64_t)i, &p);
    for (int i = 0; i < 4; i++) {
        bool waiting = i % 2 == 0;
        atomic_store(&r.hdr->client_flags, waiting ? CONVD_RING_WAITING : 0u);
        atomic_thread_fence(memory_order_seq_cst);
        raw_ring_submit(fd, &r, &t[i].rc);
        if (waiting) {
            Convd__ServerMessage *m = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_DOORBELL);
            raw_free(m);
            /* Posted before the doorbell was sent. */
            assert_int_equal(raw_ring_cq_ready(&r), 1);
        }
        expect_cqe_ok(fd, &r, t[i].rc.req.id);
        case_check(&t[i]);
        /* Nothing else on the socket: the next message is the Pong. */
        assert_pong(fd, 20 + (uint64_t)i);
    }
    for (int i = 0; i < 4; i++)
        case_fini(&t[i]);
    close_conn(fd);
    raw_ring_destroy(&r);
    wait_ring_maps(base_ring_maps);
    assert_alive();
}

/*
 * Bad entries: each answered by a Completion on the socket, with the same code and sentence as
 * the same request sent on the socket.
 */

/* Submits e through the ring and returns the status of its completion (socket or ring). */
static int ring_status(int fd, struct raw_ring *r, const struct convd_ring_sqe *e, char *why,
                       size_t why_len)
{
    raw_ring_put(r, e);
    raw_ring_publish(fd, r);
    return raw_ring_expect_completion(fd, r, e->id, NULL, why, why_len);
}

/* Submits e through the ring, expects a socket Completion with this status naming `word`. */
static void ring_expect(int fd, struct raw_ring *r, const struct convd_ring_sqe *e, int status,
                        const char *word)
{
    uint32_t seq = atomic_load(&r->hdr->sock_seq);
    uint32_t cq_tail = atomic_load(&r->hdr->cq_tail);
    char why[320];
    int st = ring_status(fd, r, e, why, sizeof(why));
    if (st != status)
        fail_msg("ring entry %llu: %s (%s), want %s", (unsigned long long)e->id,
                 convd_status_name(st), why, convd_status_name(status));
    assert_sentence("ring entry", st, why, word);
    /* On the socket, counted in sock_seq; nothing in the completion ring. */
    assert_true(atomic_load(&r->hdr->sock_seq) != seq);
    assert_int_equal(atomic_load(&r->hdr->cq_tail), cq_tail);
}

/* The request as the ring carries it and as the socket carries it get the same code and the
 * same sentence; the code is `status` (0: any failure) and the sentence names `word`. */
static void ring_same_as_socket(int fd, struct raw_ring *r, struct raw_conv *rc, int status,
                                const char *word)
{
    struct convd_ring_sqe e;
    raw_ring_sqe_from_conv(rc, &e);
    char rwhy[320], swhy[320];
    int rst = ring_status(fd, r, &e, rwhy, sizeof(rwhy));
    raw_conv_send(fd, rc);
    int sst = raw_expect_completion(fd, rc->req.id, swhy, sizeof(swhy));
    if (rst != sst || strcmp(rwhy, swhy) != 0)
        fail_msg("request %llu: the ring gives %s (%s), the socket %s (%s)",
                 (unsigned long long)rc->req.id, convd_status_name(rst), rwhy,
                 convd_status_name(sst), swhy);
    if (sst == 0 || (status != 0 && sst != status))
        fail_msg("request %llu: %s (%s), want %s", (unsigned long long)rc->req.id,
                 convd_status_name(sst), swhy,
                 status != 0 ? convd_status_name(status) : "a failure");
    assert_sentence("request", sst, swhy, word);
}

static void test_bad_entries(void **state)
{
    (void)state;
    int fd = conn();
    struct raw_ring r;
    raw_ring_create(&r, 16, 16);
    raw_ring_attach(fd, &r);
    register_ok(fd, 1, REGION_SIZE);
    struct convd_problem p;
    small_problem(&p);
    struct raw_conv rc;
    raw_conv_init(&rc, 1, &p, 1);
    struct convd_ring_sqe e;

    /* What only a ring entry has: opcode and flags (EPROTO, counted). */
    raw_ring_sqe_from_conv(&rc, &e);
    e.id = 11, e.opcode = 7;
    ring_expect(fd, &r, &e, CONVD_EPROTO, "opcode");
    raw_ring_sqe_from_conv(&rc, &e);
    e.id = 12, e.opcode = 0;
    ring_expect(fd, &r, &e, CONVD_EPROTO, "opcode");
    raw_ring_sqe_from_conv(&rc, &e);
    e.id = 13, e.flags |= 16;
    ring_expect(fd, &r, &e, CONVD_EPROTO, "flags");
    raw_ring_sqe_from_conv(&rc, &e);
    e.id = 14, e.flags |= 0x80000000u;
    ring_expect(fd, &r, &e, CONVD_EPROTO, "flags");
    /* The activation word, which layout 1 had as reserved: an unknown value, and relu said twice
     * over with another activation, are bad problems (the Problem message's checks). */
    raw_ring_sqe_from_conv(&rc, &e);
    e.id = 15, e.activation = 99;
    ring_expect(fd, &r, &e, CONVD_EBADSHAPE, "activation is 99");
    raw_ring_sqe_from_conv(&rc, &e);
    e.id = 16, e.activation = CONVD_ACT_SILU, e.flags |= CONVD_RING_F_RELU;
    ring_expect(fd, &r, &e, CONVD_EBADSHAPE, "relu is set with activation 3");
    raw_ring_sqe_from_conv(&rc, &e);
    e.id = 17, e.activation = CONVD_ACT_CLAMP, e.act_min = 1.0f, e.act_max = -1.0f;
    ring_expect(fd, &r, &e, CONVD_EBADSHAPE, "act_min <= act_max");

    /* What both paths check: the same codes, the same sentences. */
    raw_conv_init(&rc, 20, &p, 1);
    rc.prob.c = 5; /* C not divisible by groups (2) */
    ring_same_as_socket(fd, &r, &rc, CONVD_EGROUPS, "groups");
    raw_conv_init(&rc, 21, &p, 1);
    rc.prob.k = 7;
    ring_same_as_socket(fd, &r, &rc, CONVD_EGROUPS, "groups");
    raw_conv_init(&rc, 22, &p, 1);
    rc.prob.groups = 0;
    ring_same_as_socket(fd, &r, &rc, 0, "groups");
    raw_conv_init(&rc, 23, &p, 1);
    rc.prob.dtype = (Convd__DType)99;
    ring_same_as_socket(fd, &r, &rc, 0, "dtype");
    raw_conv_init(&rc, 24, &p, 1);
    rc.prob.layout = CONVD__LAYOUT__LAYOUT_UNSPECIFIED;
    ring_same_as_socket(fd, &r, &rc, 0, "layout");
    raw_conv_init(&rc, 25, &p, 1);
    rc.in.region_id = 99; /* never registered */
    ring_same_as_socket(fd, &r, &rc, CONVD_ENOREGION, "region 99");
    raw_conv_init(&rc, 26, &p, 1);
    rc.out.offset = REGION_SIZE - rc.out.bytes + 4; /* past the end of the region */
    ring_same_as_socket(fd, &r, &rc, CONVD_EBOUNDS, "output");
    raw_conv_init(&rc, 27, &p, 1);
    rc.out.offset = UINT64_MAX - 3; /* offset + bytes overflows */
    ring_same_as_socket(fd, &r, &rc, CONVD_EBOUNDS, "output");
    raw_conv_init(&rc, 28, &p, 1);
    rc.w.bytes += 4;
    ring_same_as_socket(fd, &r, &rc, CONVD_ESIZE, "weight");
    raw_conv_init(&rc, 29, &p, 1);
    rc.req.priority = 9;
    ring_same_as_socket(fd, &r, &rc, CONVD_EINVAL, "priority");
    /* A bias named without has_bias, and has_bias with the bias all zeros (no region 0). */
    raw_conv_init(&rc, 30, &p, 1);
    rc.prob.has_bias = false;
    ring_same_as_socket(fd, &r, &rc, CONVD_EINVAL, "bias");
    raw_conv_init(&rc, 31, &p, 1);
    rc.b.region_id = 0, rc.b.offset = 0, rc.b.bytes = 0;
    ring_same_as_socket(fd, &r, &rc, 0, "bias");
    /* Output overlapping an input. */
    raw_conv_init(&rc, 32, &p, 1);
    rc.out.offset = rc.in.offset;
    ring_same_as_socket(fd, &r, &rc, CONVD_EINVAL, "overlap");

    /* A duplicate id in flight: both entries published together, so the first is certainly
     * still in flight when the second is taken. The heavy one completes in the ring. */
    struct raw_conv hc;
    heavy_conv(fd, &hc, 40, 2);
    raw_conv_init(&rc, 40, &p, 1);
    struct convd_ring_sqe he;
    raw_ring_sqe_from_conv(&hc, &he);
    raw_ring_put(&r, &he);
    raw_ring_sqe_from_conv(&rc, &e);
    raw_ring_put(&r, &e);
    raw_ring_publish(fd, &r);
    /* Two completions for 40: the refusal on the socket, the heavy one in the ring. */
    bool refused = false, ran = false;
    char why[320];
    for (int i = 0; i < 2; i++) {
        struct convd_ring_cqe cqe;
        int st = raw_ring_expect_completion(fd, &r, 40, &cqe, why, sizeof(why));
        if (st == CONVD_EEXIST && !refused && cqe.id == 0) {
            refused = true;
            assert_sentence("duplicate id", st, why, "40");
        } else if (st == 0 && !ran && cqe.id == 40) {
            ran = true;
        } else {
            fail_msg("duplicate id 40 in one ring: completion %d is %s (%s)", i,
                     convd_status_name(st), why);
        }
    }
    int st;
    /* In flight through the ring, then the same id on the socket. */
    hc.req.id = 41;
    raw_ring_submit(fd, &r, &hc);
    wait_sq_head(&r, r.sq_tail);
    raw_conv_init(&rc, 41, &p, 1);
    raw_conv_send(fd, &rc);
    st = raw_expect_completion(fd, 41, why, sizeof(why));
    if (st != CONVD_EEXIST)
        fail_msg("id 41 in flight through the ring, again on the socket: %s (%s), want EEXIST",
                 convd_status_name(st), why);
    expect_cqe_ok(fd, &r, 41);

    /* The connection is fine: a good entry still completes in the ring. */
    assert_pong(fd, 1);
    raw_conv_init(&rc, 50, &p, 1);
    raw_ring_submit(fd, &r, &rc);
    expect_cqe_ok(fd, &r, 50);
    close_conn(fd);
    raw_ring_destroy(&r);
    wait_ring_maps(base_ring_maps);
    assert_alive();
}

/* max_protocol_errors (16) bad entries close the connection; 15 do not. */
static void test_bad_entries_close_connection(void **state)
{
    (void)state;
    int fd = conn();
    struct raw_ring r;
    raw_ring_create(&r, 32, 32);
    raw_ring_attach(fd, &r);
    struct convd_problem p;
    small_problem(&p);
    struct raw_conv rc;
    raw_conv_init(&rc, 0, &p, 1);
    struct convd_ring_sqe e;
    raw_ring_sqe_from_conv(&rc, &e);
    e.opcode = 7;
    for (uint64_t id = 1; id <= 15; id++) {
        e.id = id;
        raw_ring_put(&r, &e);
    }
    raw_ring_publish(fd, &r);
    for (uint64_t id = 1; id <= 15; id++) {
        char why[256];
        int st = raw_ring_expect_completion(fd, &r, id, NULL, why, sizeof(why));
        assert_int_equal(st, CONVD_EPROTO);
        assert_sentence("bad opcode", st, why, "opcode");
    }
    assert_pong(fd, 1);
    e.id = 16;
    raw_ring_put(&r, &e);
    raw_ring_publish(fd, &r);
    char why[256];
    int st = raw_ring_expect_completion(fd, &r, 16, NULL, why, sizeof(why));
    assert_int_equal(st, CONVD_EPROTO);
    raw_expect_eof(fd);
    close_conn(fd);
    raw_ring_destroy(&r);
    wait_ring_maps(base_ring_maps);
    assert_alive();
}

/*
 * Impossible indices.
 */

/* Submits and completes two good requests, so that the counters are not all zero. */
static void two_good_requests(int fd, struct raw_ring *r)
{
    register_ok(fd, 1, REGION_SIZE);
    struct convd_problem p;
    small_problem(&p);
    struct raw_conv rc;
    for (uint64_t id = 1; id <= 2; id++) {
        raw_conv_init(&rc, id, &p, 1);
        raw_ring_submit(fd, r, &rc);
        expect_cqe_ok(fd, r, id);
    }
}

static void test_corrupt_sq_tail(void **state)
{
    (void)state;
    const uint32_t ahead[] = {17, 1000, UINT32_MAX /* behind sq_head */};
    for (size_t i = 0; i < 3; i++) {
        int fd = conn();
        struct raw_ring r;
        raw_ring_create(&r, 16, 16);
        raw_ring_attach(fd, &r);
        two_good_requests(fd, &r);
        atomic_store(&r.hdr->sq_tail, r.sq_tail + ahead[i]);
        atomic_thread_fence(memory_order_seq_cst);
        (void)raw_send_doorbell(fd);
        expect_protocol_error(fd, CONVD_EPROTO, "ring corrupt", "sq_tail");
        raw_expect_eof(fd);
        close_conn(fd);
        raw_ring_destroy(&r);
        wait_ring_maps(base_ring_maps);
        assert_alive();
    }
}

static void test_corrupt_cq_head(void **state)
{
    (void)state;
    const uint32_t back[] = {17, 100, UINT32_MAX /* ahead of cq_tail */};
    for (size_t i = 0; i < 3; i++) {
        int fd = conn();
        struct raw_ring r;
        raw_ring_create(&r, 16, 16);
        raw_ring_attach(fd, &r);
        two_good_requests(fd, &r);
        atomic_store(&r.hdr->cq_head, r.cq_head - back[i]);
        /* The daemon looks at cq_head when it takes a submission. */
        struct convd_problem p;
        small_problem(&p);
        struct raw_conv rc;
        raw_conv_init(&rc, 3, &p, 1);
        raw_ring_submit(fd, &r, &rc);
        (void)raw_send_doorbell(fd);
        expect_protocol_error(fd, CONVD_EPROTO, "ring corrupt", "cq_head");
        raw_expect_eof(fd);
        close_conn(fd);
        raw_ring_destroy(&r);
        wait_ring_maps(base_ring_maps);
        assert_alive();
    }
}

/* The client takes back room the daemon reserved for a completion (cq_head moved back by a
 * whole ring while a request runs): the daemon cannot post it and closes the connection. */
static void test_cq_head_takes_reserved_room(void **state)
{
    (void)state;
    int fd = conn();
    struct raw_ring r;
    raw_ring_create(&r, 16, 16);
    raw_ring_attach(fd, &r);
    two_good_requests(fd, &r);
    struct raw_conv hc;
    heavy_conv(fd, &hc, 3, 2);
    raw_ring_submit(fd, &r, &hc);
    wait_sq_head(&r, 3); /* taken: its completion is reserved; it runs for a while */
    /* Exactly a full ring of unread completions: not corrupt by itself, but no room. */
    atomic_store(&r.hdr->cq_head, r.cq_head - 16);
    expect_protocol_error(fd, CONVD_EPROTO, "ring corrupt", "cq_head");
    raw_expect_eof(fd);
    close_conn(fd);
    raw_ring_destroy(&r);
    wait_ring_maps(base_ring_maps);
    assert_alive();
}

/* A completion ring nobody reads, with submissions waiting: after ring_stall_timeout_ms the
 * daemon says so (ETIMEDOUT, naming the completion ring) and closes the connection. */
static void test_ring_never_drained(void **state)
{
    (void)state;
    int fd = conn();
    struct raw_ring r;
    raw_ring_create(&r, 16, 16);
    raw_ring_attach(fd, &r);
    register_ok(fd, 1, REGION_SIZE);
    struct convd_problem p;
    small_problem(&p);
    struct raw_conv rc;
    raw_conv_init(&rc, 0, &p, 1);
    struct convd_ring_sqe e;
    raw_ring_sqe_from_conv(&rc, &e);
    /* A full submission ring; the daemon takes all of it (the completion ring has room for 16),
     * then it is filled again: those wait, and nobody reads the completions. */
    for (uint64_t id = 1; id <= 16; id++) {
        e.id = id;
        raw_ring_put(&r, &e);
    }
    raw_ring_publish(fd, &r);
    wait_sq_head(&r, 16);
    uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
    while (raw_ring_cq_ready(&r) != 16) {
        if (tu_now_ms() > end)
            fail_msg("%u of 16 requests completed in the ring", raw_ring_cq_ready(&r));
        tu_sleep_ms(1);
    }
    for (uint64_t id = 17; id <= 32; id++) {
        e.id = id;
        raw_ring_put(&r, &e);
    }
    uint64_t start = tu_now_ms();
    raw_ring_publish(fd, &r);
    expect_protocol_error(fd, CONVD_ETIMEDOUT, "completion ring", "ring_stall_timeout_ms");
    uint64_t waited = tu_now_ms() - start;
    raw_expect_eof(fd);
    print_message("the daemon gave up on the unread ring after %llu ms\n",
                  (unsigned long long)waited);
    /* Not before the timeout could have passed. */
    if (waited < STALL_TIMEOUT_MS - 50)
        fail_msg("ETIMEDOUT after %llu ms, before ring_stall_timeout_ms (%d)",
                 (unsigned long long)waited, STALL_TIMEOUT_MS);
    /* The first 16 completed into the ring; none of the others was taken. */
    assert_int_equal(atomic_load(&r.hdr->cq_tail), 16);
    assert_int_equal(atomic_load(&r.hdr->sq_head), 16);
    for (uint32_t i = 0; i < 16; i++)
        assert_int_equal(r.cq[i].status, 0);
    close_conn(fd);
    raw_ring_destroy(&r);
    wait_ring_maps(base_ring_maps);
    assert_alive();
}

/* A client that leaves with requests running, submissions not yet taken and completions
 * unread: the daemon drops its ring at once and, once the running requests finish, its regions
 * (the final clean check proves nothing leaked). */
static void test_disconnect_with_work_in_ring(void **state)
{
    (void)state;
    int fd = conn();
    struct raw_ring r;
    raw_ring_create(&r, 16, 16);
    raw_ring_attach(fd, &r);
    register_ok(fd, 1, REGION_SIZE);
    struct raw_conv hc, rc;
    heavy_conv(fd, &hc, 1, 2);
    struct convd_problem p;
    small_problem(&p);
    raw_conv_init(&rc, 0, &p, 1);
    struct convd_ring_sqe e;
    raw_ring_sqe_from_conv(&hc, &e);
    raw_ring_put(&r, &e);
    raw_ring_sqe_from_conv(&rc, &e);
    for (uint64_t id = 2; id <= 16; id++) {
        e.id = id;
        raw_ring_put(&r, &e);
    }
    raw_ring_publish(fd, &r);
    wait_sq_head(&r, 16);
    for (uint64_t id = 17; id <= 32; id++) {
        e.id = id;
        raw_ring_put(&r, &e);
    }
    raw_ring_publish(fd, &r);
    close_conn(fd);
    raw_ring_destroy(&r);
    wait_ring_maps(base_ring_maps);
    assert_alive();
}

/*
 * The client library.
 */

static convd_client *lib_connect(int use_rings)
{
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = daemon_.sock;
    o.client_name = use_rings ? "it-rings-lib" : "it-socket-lib";
    o.timeout_ms = TU_TIMEOUT_MS;
    o.use_rings = use_rings;
    convd_client *c = NULL;
    int rc = convd_connect(&o, &c);
    if (rc != 0)
        fail_msg("convd_connect(use_rings %d): %s: %s", use_rings, convd_status_name(rc),
                 convd_last_connect_error());
    return c;
}

static void test_library_rings_and_socket_agree(void **state)
{
    (void)state;
    enum { N = 6 };
    struct convd_problem probs[N];
    for (int i = 0; i < N; i++)
        random_problem(&probs[i]);
    uint64_t seed = tu_rng_next(it_rng());
    float *outs[2][N];
    for (int use_rings = 1; use_rings >= 0; use_rings--) {
        convd_client *c = lib_connect(use_rings);
        /* Connected with rings: the daemon maps them; without, it maps nothing more. */
        assert_int_equal(it_count_ring_maps(daemon_.pid), base_ring_maps + use_rings);
        /* The same problems with the same inputs on both paths; all submitted, then waited. */
        struct tu_rng g;
        tu_rng_init(&g, seed);
        convd_region *reg[N];
        struct it_case t[N];
        uint64_t ids[N];
        for (int i = 0; i < N; i++) {
            int rc = convd_region_create(c, it_case_span(&probs[i]), &reg[i]);
            if (rc != 0)
                fail_msg("convd_region_create: %s: %s", convd_status_name(rc), convd_errstr(c));
            it_case_init(&t[i], reg[i], 0, &probs[i], &g);
            struct convd_conv_args a;
            it_case_args(&t[i], &a);
            rc = convd_conv_submit(c, &a, &ids[i]);
            if (rc != 0)
                fail_msg("convd_conv_submit: %s: %s", convd_status_name(rc), convd_errstr(c));
        }
        for (int i = 0; i < N; i++) {
            struct convd_completion done;
            int rc = convd_wait(c, ids[i], TU_TIMEOUT_MS, &done);
            if (rc != 0)
                fail_msg("convd_wait: %s: %s", convd_status_name(rc), convd_errstr(c));
            if (done.status != 0)
                fail_msg("request over %s: %s: %s", use_rings ? "rings" : "the socket",
                         convd_status_name(done.status), done.error);
            it_case_check(&t[i]);
            outs[use_rings][i] = malloc(sizeof(float) * t[i].sz.output_elems);
            assert_non_null(outs[use_rings][i]);
            const uint8_t *base = convd_region_data(reg[i]);
            for (size_t k = 0; k < t[i].sz.output_elems; k++)
                outs[use_rings][i][k] = tu_load(probs[i].dtype, base + t[i].off_out, k);
        }
        /* One more, the synchronous way. */
        it_one_conv(c, it_rng());
        for (int i = 0; i < N; i++) {
            it_case_fini(&t[i]);
            assert_int_equal(convd_region_free(reg[i]), 0);
        }
        convd_close(c);
        wait_ring_maps(base_ring_maps);
    }
    /* Both paths computed the same thing (to the dtype's tolerance). */
    for (int i = 0; i < N; i++) {
        struct convd_problem_sizes z;
        assert_int_equal(convd_problem_sizes(&probs[i], &z, NULL, 0), 0);
        double err = tu_rel_error(CONVD_DTYPE_FP32, outs[0][i], outs[1][i], z.output_elems, NULL);
        if (err > tu_tolerance(probs[i].dtype))
            fail_msg("problem %d: rings and socket differ by %g", i, err);
        free(outs[0][i]);
        free(outs[1][i]);
    }
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
        cmocka_unit_test_teardown(test_hello_ring_version, close_leftovers),
        cmocka_unit_test_teardown(test_attach_refusals, close_leftovers),
        cmocka_unit_test_teardown(test_ring_requests, close_leftovers),
        cmocka_unit_test_teardown(test_doorbell_wakes_sleeping_daemon, continue_worker),
        cmocka_unit_test_teardown(test_ring_taken_before_socket_message, continue_worker),
        cmocka_unit_test_teardown(test_one_entry_ring, close_leftovers),
        cmocka_unit_test_teardown(test_failure_after_queueing_gives_room_back, close_leftovers),
        cmocka_unit_test_teardown(test_doorbell_to_waiting_client, close_leftovers),
        cmocka_unit_test_teardown(test_bad_entries, close_leftovers),
        cmocka_unit_test_teardown(test_bad_entries_close_connection, close_leftovers),
        cmocka_unit_test_teardown(test_corrupt_sq_tail, close_leftovers),
        cmocka_unit_test_teardown(test_corrupt_cq_head, close_leftovers),
        cmocka_unit_test_teardown(test_cq_head_takes_reserved_room, close_leftovers),
        cmocka_unit_test_teardown(test_ring_never_drained, close_leftovers),
        cmocka_unit_test_teardown(test_disconnect_with_work_in_ring, close_leftovers),
        cmocka_unit_test_teardown(test_library_rings_and_socket_agree, close_leftovers),
        cmocka_unit_test_teardown(test_zz_worker_correct_no_leaks_clean_exit, close_leftovers),
    };
    return cmocka_run_group_tests_name("integration: rings", tests, group_setup, group_teardown);
}
