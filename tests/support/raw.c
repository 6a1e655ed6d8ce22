#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

/* cmocka needs these before its header. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "raw.h"
#include "sock.h"
#include "testutil.h"
#include "wire.h"

int raw_connect(const char *path)
{
    int fd = sock_connect(path);
    if (fd < 0)
        fail_msg("connect %s: %s", path, strerror(-fd));
    return fd;
}

int raw_send_bytes_fds(int fd, const void *buf, size_t len, const int *fds, size_t nfds)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * SOCK_MAX_FDS)];
    } ctl;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds > 0) {
        if (nfds > SOCK_MAX_FDS)
            return -EINVAL;
        memset(&ctl, 0, sizeof(ctl));
        msg.msg_control = ctl.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    for (;;) {
        if (sendmsg(fd, &msg, MSG_NOSIGNAL) >= 0)
            return 0;
        if (errno != EINTR)
            return -errno;
    }
}

void raw_send_bytes(int fd, const void *buf, size_t len)
{
    int rc = raw_send_bytes_fds(fd, buf, len, NULL, 0);
    if (rc != 0)
        fail_msg("send %zu bytes: %s", len, strerror(-rc));
}

void raw_send(int fd, const Convd__ClientMessage *m, const int *fds, size_t nfds)
{
    static uint8_t buf[CONVD_MAX_MESSAGE_BYTES];
    int len = wire_pack_client(m, buf, sizeof(buf));
    assert_true(len >= 0);
    int rc = raw_send_bytes_fds(fd, buf, (size_t)len, fds, nfds);
    if (rc != 0)
        fail_msg("send message: %s", strerror(-rc));
}

static Convd__ServerMessage *raw_recv_opt(int fd, bool past_reset);

Convd__ServerMessage *raw_recv(int fd)
{
    return raw_recv_opt(fd, false);
}

Convd__ServerMessage *raw_recv_past_reset(int fd)
{
    return raw_recv_opt(fd, true);
}

static Convd__ServerMessage *raw_recv_opt(int fd, bool past_reset)
{
    static uint8_t buf[CONVD_MAX_MESSAGE_BYTES + 1];
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n;
    do
        n = poll(&p, 1, TU_TIMEOUT_MS);
    while (n < 0 && errno == EINTR);
    if (n == 0)
        fail_msg("no message from the daemon within %d ms", TU_TIMEOUT_MS);
    assert_true(n == 1);
    int fds[SOCK_MAX_FDS];
    size_t nfds = 0;
    ssize_t len = sock_recv(fd, buf, sizeof(buf), fds, &nfds);
    if (len == -ECONNRESET && past_reset) {
        /* The reset is reported once, ahead of what was queued before it. */
        len = sock_recv(fd, buf, sizeof(buf), fds, &nfds);
        if (len == -EAGAIN)
            len = 0;
    }
    if (len == 0 || len == -ECONNRESET)
        return NULL;
    if (len < 0)
        fail_msg("recv: %s", strerror((int)-len));
    if (nfds != 0) {
        sock_close_fds(fds, nfds);
        fail_msg("the daemon sent %zu descriptors", nfds);
    }
    Convd__ServerMessage *m = convd__server_message__unpack(NULL, (size_t)len, buf);
    if (m == NULL)
        fail_msg("the daemon sent %zd bytes that do not decode as a ServerMessage", len);
    return m;
}

static const char *raw_case_name(Convd__ServerMessage__MsgCase c)
{
    switch (c) {
    case CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY:
        return "HelloReply";
    case CONVD__SERVER_MESSAGE__MSG_REGION_REPLY:
        return "RegionReply";
    case CONVD__SERVER_MESSAGE__MSG_COMPLETION:
        return "Completion";
    case CONVD__SERVER_MESSAGE__MSG_STATUS_REPLY:
        return "StatusReply";
    case CONVD__SERVER_MESSAGE__MSG_METRICS_REPLY:
        return "MetricsReply";
    case CONVD__SERVER_MESSAGE__MSG_PONG:
        return "Pong";
    case CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR:
        return "ProtocolError";
    case CONVD__SERVER_MESSAGE__MSG_RING_REPLY:
        return "RingReply";
    case CONVD__SERVER_MESSAGE__MSG_DOORBELL:
        return "Doorbell";
    default:
        return "(empty)";
    }
}

Convd__ServerMessage *raw_expect(int fd, Convd__ServerMessage__MsgCase what)
{
    Convd__ServerMessage *m = raw_recv(fd);
    if (m == NULL)
        fail_msg("the daemon closed the connection; expected %s", raw_case_name(what));
    if (m->msg_case != what) {
        char extra[300] = "";
        if (m->msg_case == CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR)
            snprintf(extra, sizeof(extra), " (%s: %s)",
                     convd_status_name(m->protocol_error->status), m->protocol_error->error);
        fail_msg("expected %s, got %s%s", raw_case_name(what), raw_case_name(m->msg_case), extra);
    }
    return m;
}

void raw_free(Convd__ServerMessage *m)
{
    if (m != NULL)
        convd__server_message__free_unpacked(m, NULL);
}

void raw_expect_eof(int fd)
{
    uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
    static uint8_t buf[CONVD_MAX_MESSAGE_BYTES + 1];
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)(end - tu_now_ms());
        if (left <= 0 || poll(&p, 1, left) == 0)
            fail_msg("the daemon did not close the connection within %d ms", TU_TIMEOUT_MS);
        int fds[SOCK_MAX_FDS];
        size_t nfds = 0;
        ssize_t len = sock_recv(fd, buf, sizeof(buf), fds, &nfds);
        sock_close_fds(fds, nfds);
        if (len == 0 || len == -ECONNRESET)
            return;
        if (len < 0 && len != -EINTR && len != -EAGAIN)
            fail_msg("recv: %s", strerror((int)-len));
    }
}

int raw_contains(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (const char *h = hay; *h != '\0'; h++) {
        size_t i = 0;
        while (i < n && h[i] != '\0' &&
               tolower((unsigned char)h[i]) == tolower((unsigned char)needle[i]))
            i++;
        if (i == n)
            return 1;
    }
    return n == 0;
}

uint32_t raw_hello(int fd)
{
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__Hello h = CONVD__HELLO__INIT;
    h.protocol_version = CONVD_PROTOCOL_VERSION;
    h.min_protocol_version = CONVD_PROTOCOL_VERSION_MIN;
    h.client_name = "it-raw";
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_HELLO;
    m.hello = &h;
    raw_send(fd, &m, NULL, 0);
    Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY);
    if (r->hello_reply->status != 0)
        fail_msg("Hello refused: %s: %s", convd_status_name(r->hello_reply->status),
                 r->hello_reply->error);
    assert_int_equal(r->hello_reply->protocol_version, CONVD_PROTOCOL_VERSION);
    assert_true(r->hello_reply->max_inflight > 0);
    uint32_t max = r->hello_reply->max_inflight;
    raw_free(r);
    return max;
}

void raw_expect_protocol_error(int fd, int status, const char *word)
{
    Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR);
    const char *err = r->protocol_error->error != NULL ? r->protocol_error->error : "";
    if (r->protocol_error->status != status)
        fail_msg("ProtocolError status %s (%s), want %s",
                 convd_status_name(r->protocol_error->status), err, convd_status_name(status));
    if (strlen(err) < 8)
        fail_msg("ProtocolError %s has no sentence (\"%s\")", convd_status_name(status), err);
    if (word != NULL && !raw_contains(err, word))
        fail_msg("ProtocolError %s: \"%s\" does not mention \"%s\"", convd_status_name(status), err,
                 word);
    raw_free(r);
}

int raw_register(int fd, uint64_t region_id, uint64_t size, const int *fds, size_t nfds, char *why,
                 size_t why_len)
{
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__RegisterRegion rr = CONVD__REGISTER_REGION__INIT;
    rr.region_id = region_id;
    rr.kind = CONVD__REGION_KIND__REGION_MEMFD;
    rr.size = size;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_REGISTER_REGION;
    m.register_region = &rr;
    raw_send(fd, &m, fds, nfds);
    Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_REGION_REPLY);
    assert_int_equal(r->region_reply->region_id, region_id);
    int st = r->region_reply->status;
    if (why != NULL)
        snprintf(why, why_len, "%s", r->region_reply->error != NULL ? r->region_reply->error : "");
    raw_free(r);
    return st;
}

int raw_unregister(int fd, uint64_t region_id)
{
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__UnregisterRegion ur = CONVD__UNREGISTER_REGION__INIT;
    ur.region_id = region_id;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_UNREGISTER_REGION;
    m.unregister_region = &ur;
    raw_send(fd, &m, NULL, 0);
    Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_REGION_REPLY);
    assert_int_equal(r->region_reply->region_id, region_id);
    int st = r->region_reply->status;
    raw_free(r);
    return st;
}

uint64_t raw_conv_init(struct raw_conv *rc, uint64_t id, const struct convd_problem *p,
                       uint64_t region_id)
{
    struct convd_problem_sizes z;
    assert_int_equal(convd_problem_sizes(p, &z, NULL, 0), 0);
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__ConvRequest req = CONVD__CONV_REQUEST__INIT;
    Convd__Problem pb = CONVD__PROBLEM__INIT;
    Convd__TensorRef t = CONVD__TENSOR_REF__INIT;
    rc->msg = m;
    rc->req = req;
    rc->prob = pb;
    rc->in = rc->w = rc->b = rc->out = t;
    wire_problem_to_pb(p, &rc->prob);
    uint64_t off = 0;
    rc->in = (Convd__TensorRef){
        .base = t.base, .region_id = region_id, .offset = off, .bytes = z.input_bytes};
    off += z.input_bytes;
    rc->w = (Convd__TensorRef){
        .base = t.base, .region_id = region_id, .offset = off, .bytes = z.weight_bytes};
    off += z.weight_bytes;
    if (p->has_bias) {
        rc->b = (Convd__TensorRef){
            .base = t.base, .region_id = region_id, .offset = off, .bytes = z.bias_bytes};
        off += z.bias_bytes;
    }
    rc->out = (Convd__TensorRef){
        .base = t.base, .region_id = region_id, .offset = off, .bytes = z.output_bytes};
    off += z.output_bytes;
    rc->req.id = id;
    rc->req.problem = &rc->prob;
    rc->req.input = &rc->in;
    rc->req.weight = &rc->w;
    rc->req.bias = p->has_bias ? &rc->b : NULL;
    rc->req.output = &rc->out;
    rc->msg.msg_case = CONVD__CLIENT_MESSAGE__MSG_CONV;
    rc->msg.conv = &rc->req;
    return off;
}

void raw_conv_send(int fd, struct raw_conv *rc)
{
    raw_send(fd, &rc->msg, NULL, 0);
}

int raw_expect_completion(int fd, uint64_t id, char *why, size_t why_len)
{
    Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_COMPLETION);
    if (r->completion->id != id)
        fail_msg("completion for id %llu, want %llu (%s: %s)",
                 (unsigned long long)r->completion->id, (unsigned long long)id,
                 convd_status_name(r->completion->status), r->completion->error);
    int st = r->completion->status;
    if (why != NULL)
        snprintf(why, why_len, "%s", r->completion->error != NULL ? r->completion->error : "");
    raw_free(r);
    return st;
}

/*
 * Rings.
 */

void raw_ring_create(struct raw_ring *r, uint32_t sq_entries, uint32_t cq_entries)
{
    memset(r, 0, sizeof(*r));
    r->len = (size_t)convd_ring_bytes(sq_entries, cq_entries);
    r->memfd = tu_memfd(RAW_RING_MEMFD_NAME, r->len, F_SEAL_SHRINK | F_SEAL_GROW);
    void *map = mmap(NULL, r->len, PROT_READ | PROT_WRITE, MAP_SHARED, r->memfd, 0);
    assert_true(map != MAP_FAILED);
    r->map = map;
    r->sq_entries = sq_entries;
    r->cq_entries = cq_entries;
    r->hdr = map;
    r->sq = (struct convd_ring_sqe *)(r->map + CONVD_RING_SQ_OFFSET);
    r->cq = (struct convd_ring_cqe *)(r->map + convd_ring_cq_offset(sq_entries));
    r->hdr->magic = CONVD_RING_MAGIC;
    r->hdr->version = CONVD_RING_VERSION;
    r->hdr->sq_entries = sq_entries;
    r->hdr->cq_entries = cq_entries;
}

void raw_ring_destroy(struct raw_ring *r)
{
    if (r->map != NULL)
        munmap(r->map, r->len);
    if (r->memfd >= 0)
        close(r->memfd);
    memset(r, 0, sizeof(*r));
    r->memfd = -1;
}

int raw_attach_ring(int fd, uint32_t version, uint32_t sq_entries, uint32_t cq_entries,
                    uint64_t size, const int *fds, size_t nfds, char *why, size_t why_len)
{
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__AttachRing ar = CONVD__ATTACH_RING__INIT;
    ar.version = version;
    ar.sq_entries = sq_entries;
    ar.cq_entries = cq_entries;
    ar.size = size;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_ATTACH_RING;
    m.attach_ring = &ar;
    raw_send(fd, &m, fds, nfds);
    Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_RING_REPLY);
    int st = r->ring_reply->status;
    if (why != NULL)
        snprintf(why, why_len, "%s", r->ring_reply->error != NULL ? r->ring_reply->error : "");
    raw_free(r);
    return st;
}

void raw_ring_attach(int fd, struct raw_ring *r)
{
    char why[256];
    int st = raw_attach_ring(fd, CONVD_RING_VERSION, r->sq_entries, r->cq_entries, r->len,
                             &r->memfd, 1, why, sizeof(why));
    if (st != 0)
        fail_msg("AttachRing (%u/%u entries): %s: %s", r->sq_entries, r->cq_entries,
                 convd_status_name(st), why);
}

void raw_ring_sqe_from_conv(const struct raw_conv *rc, struct convd_ring_sqe *e)
{
    wire_ring_entry(&rc->req, e);
}

void raw_ring_put(struct raw_ring *r, const struct convd_ring_sqe *e)
{
    memcpy(&r->sq[r->sq_tail & (r->sq_entries - 1)], e, sizeof(*e));
    r->sq_tail++;
}

int raw_send_doorbell(int fd)
{
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__Doorbell db = CONVD__DOORBELL__INIT;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_DOORBELL;
    m.doorbell = &db;
    uint8_t buf[16];
    int len = wire_pack_client(&m, buf, sizeof(buf));
    assert_true(len >= 0);
    return raw_send_bytes_fds(fd, buf, (size_t)len, NULL, 0);
}

bool raw_ring_publish(int fd, struct raw_ring *r)
{
    atomic_store_explicit(&r->hdr->sq_tail, r->sq_tail, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    if (!(atomic_load_explicit(&r->hdr->daemon_flags, memory_order_relaxed) &
          CONVD_RING_NEED_WAKEUP))
        return false;
    (void)raw_send_doorbell(fd);
    return true;
}

void raw_ring_submit(int fd, struct raw_ring *r, const struct raw_conv *rc)
{
    struct convd_ring_sqe e;
    raw_ring_sqe_from_conv(rc, &e);
    raw_ring_put(r, &e);
    raw_ring_publish(fd, r);
}

uint32_t raw_ring_cq_ready(const struct raw_ring *r)
{
    return atomic_load_explicit(&r->hdr->cq_tail, memory_order_acquire) - r->cq_head;
}

/* Consumes the next completion, which must be there. */
static void raw_ring_consume(struct raw_ring *r, struct convd_ring_cqe *ret)
{
    uint32_t ready = raw_ring_cq_ready(r);
    if (ready > r->cq_entries)
        fail_msg("the daemon's cq_tail says %u completions are ready; the ring holds %u", ready,
                 r->cq_entries);
    memcpy(ret, &r->cq[r->cq_head & (r->cq_entries - 1)], sizeof(*ret));
    r->cq_head++;
    atomic_store_explicit(&r->hdr->cq_head, r->cq_head, memory_order_release);
}

bool raw_ring_wait_cqe(struct raw_ring *r, struct convd_ring_cqe *ret, int timeout_ms)
{
    uint64_t end = tu_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        if (raw_ring_cq_ready(r) > 0) {
            raw_ring_consume(r, ret);
            return true;
        }
        if (tu_now_ms() >= end)
            return false;
        tu_sleep_ms(1);
    }
}

bool raw_ring_next(int fd, struct raw_ring *r, struct convd_ring_cqe *ret_cqe,
                   Convd__ServerMessage **ret_msg)
{
    uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
    *ret_msg = NULL;
    for (;;) {
        if (raw_ring_cq_ready(r) > 0) {
            raw_ring_consume(r, ret_cqe);
            return true;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int n = poll(&p, 1, 1);
        if (n > 0) {
            *ret_msg = raw_recv_past_reset(fd);
            return false;
        }
        if (n < 0 && errno != EINTR)
            fail_msg("poll: %s", strerror(errno));
        if (tu_now_ms() > end)
            fail_msg("no completion in the ring and no message on the socket within %d ms",
                     TU_TIMEOUT_MS);
    }
}

int raw_ring_expect_completion(int fd, struct raw_ring *r, uint64_t id,
                               struct convd_ring_cqe *ret_cqe, char *why, size_t why_len)
{
    struct convd_ring_cqe cqe;
    Convd__ServerMessage *m = NULL;
    if (why != NULL && why_len > 0)
        why[0] = '\0';
    if (raw_ring_next(fd, r, &cqe, &m)) {
        if (cqe.id != id)
            fail_msg("ring completion for id %llu, want %llu", (unsigned long long)cqe.id,
                     (unsigned long long)id);
        if (ret_cqe != NULL)
            *ret_cqe = cqe;
        return cqe.status;
    }
    if (m == NULL)
        fail_msg("the daemon closed the connection; expected the completion of %llu",
                 (unsigned long long)id);
    if (m->msg_case != CONVD__SERVER_MESSAGE__MSG_COMPLETION) {
        char extra[300] = "";
        if (m->msg_case == CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR)
            snprintf(extra, sizeof(extra), " (%s: %s)",
                     convd_status_name(m->protocol_error->status), m->protocol_error->error);
        fail_msg("expected the completion of %llu, got %s%s", (unsigned long long)id,
                 raw_case_name(m->msg_case), extra);
    }
    if (m->completion->id != id)
        fail_msg("completion for id %llu, want %llu (%s: %s)",
                 (unsigned long long)m->completion->id, (unsigned long long)id,
                 convd_status_name(m->completion->status), m->completion->error);
    int st = m->completion->status;
    if (why != NULL)
        snprintf(why, why_len, "%s", m->completion->error != NULL ? m->completion->error : "");
    if (ret_cqe != NULL)
        memset(ret_cqe, 0, sizeof(*ret_cqe));
    raw_free(m);
    return st;
}
