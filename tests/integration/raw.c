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

#include "harness.h"
#include "raw.h"
#include "sock.h"
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

Convd__ServerMessage *raw_recv(int fd)
{
    static uint8_t buf[CONVD_MAX_MESSAGE_BYTES + 1];
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n;
    do
        n = poll(&p, 1, IT_TIMEOUT_MS);
    while (n < 0 && errno == EINTR);
    if (n == 0)
        fail_msg("no message from the daemon within %d ms", IT_TIMEOUT_MS);
    assert_true(n == 1);
    int fds[SOCK_MAX_FDS];
    size_t nfds = 0;
    ssize_t len = sock_recv(fd, buf, sizeof(buf), fds, &nfds);
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
    uint64_t end = it_now_ms() + IT_TIMEOUT_MS;
    static uint8_t buf[CONVD_MAX_MESSAGE_BYTES + 1];
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)(end - it_now_ms());
        if (left <= 0 || poll(&p, 1, left) == 0)
            fail_msg("the daemon did not close the connection within %d ms", IT_TIMEOUT_MS);
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
    h.protocol_version = 1;
    h.client_name = "it-raw";
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_HELLO;
    m.hello = &h;
    raw_send(fd, &m, NULL, 0);
    Convd__ServerMessage *r = raw_expect(fd, CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY);
    if (r->hello_reply->status != 0)
        fail_msg("Hello refused: %s: %s", convd_status_name(r->hello_reply->status),
                 r->hello_reply->error);
    assert_int_equal(r->hello_reply->protocol_version, 1);
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

int raw_memfd(uint64_t size, unsigned seals)
{
    int fd = memfd_create("convd-it", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    if (seals != 0)
        assert_int_equal(fcntl(fd, F_ADD_SEALS, (int)seals), 0);
    return fd;
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
