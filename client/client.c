/*
 * The connection: connect and handshake, the socket I/O every other call goes through, and the
 * dispatch of what the daemon sends.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "client_priv.h"
#include "clock.h"
#include "sock.h"
#include "wire.h"

/* convd_connect() has no handle to put its sentence on. */
static _Thread_local char cl_connect_error[CL_ERRSTR_BYTES];

int cl_fail(convd_client *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errstr, sizeof(c->errstr), fmt, ap);
    va_end(ap);
    return code;
}

static int cl_connect_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int cl_connect_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cl_connect_error, sizeof(cl_connect_error), fmt, ap);
    va_end(ap);
    return code;
}

const char *convd_last_connect_error(void)
{
    return cl_connect_error;
}

const char *convd_errstr(const convd_client *c)
{
    return c != NULL ? c->errstr : "no client";
}

void convd_server_info(const convd_client *c, struct convd_server_info *ret_info)
{
    if (c == NULL || ret_info == NULL)
        return;
    *ret_info = c->info;
}

int convd_client_fd(const convd_client *c)
{
    return c != NULL ? c->fd : -1;
}

void cl_strlcpy(char *dst, size_t cap, const char *src)
{
    if (cap == 0)
        return;
    size_t n = src != NULL ? strlen(src) : 0;
    if (n >= cap) {
        n = cap - 1;
        /* Do not end inside a multi-byte character: back off over continuation bytes. */
        while (n > 0 && ((unsigned char)src[n] & 0xc0) == 0x80)
            n--;
    }
    if (n > 0)
        memcpy(dst, src, n);
    dst[n] = '\0';
}

uint64_t cl_deadline(int timeout_ms)
{
    if (timeout_ms < 0)
        return UINT64_MAX;
    return convd_now_ns() + (uint64_t)timeout_ms * 1000000u;
}

/* Milliseconds left until deadline for poll(), rounded up so that a wait never ends early; -1 for
 * no deadline. */
static int cl_poll_ms(uint64_t deadline)
{
    if (deadline == UINT64_MAX)
        return -1;
    uint64_t now = convd_now_ns();
    if (now >= deadline)
        return 0;
    uint64_t ms = (deadline - now + 999999u) / 1000000u;
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

/* The first sentence wins until it is reported, since later trouble is usually a consequence of
 * the first. */
void cl_trouble(convd_client *c, int code, const char *fmt, ...)
{
    if (c->trouble != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->trouble_msg, sizeof(c->trouble_msg), fmt, ap);
    va_end(ap);
    c->trouble = code;
}

static int cl_closed_fail(convd_client *c)
{
    if (c->trouble != 0) {
        c->trouble = 0;
        return cl_fail(c, CONVD_ECLOSED, "the daemon closed the connection after: %s",
                       c->trouble_msg);
    }
    return cl_fail(c, CONVD_ECLOSED, "the daemon closed the connection");
}

static void cl_mark_closed(convd_client *c)
{
    c->closed = true;
    /* The daemon is gone or has dropped us: it writes no more done words. */
    cl_gates_release(c, NULL);
}

/*
 * Dispatch.
 */

/* Matches a control reply against the one being waited for. Returns true when the message was
 * taken (the caller must not free it). Replies to calls that timed out earlier (a key below the
 * next one we would use) are dropped silently; anything else is trouble. */
static bool cl_on_reply(convd_client *c, Convd__ServerMessage *m, enum cl_expect_kind kind,
                        uint64_t key, const char *what)
{
    if (c->expect.kind == kind && c->expect.key == key && c->expect.reply == NULL) {
        c->expect.reply = m;
        return true;
    }
    uint64_t next = kind == CL_EXPECT_REGION ? c->next_region_id : c->next_tag;
    if (kind != CL_EXPECT_HELLO && key < next)
        return false;
    cl_trouble(c, CONVD_EPROTO, "the daemon sent an unexpected %s (key %llu)", what,
               (unsigned long long)key);
    return false;
}

/* Handles one decoded message. Returns true when it was kept (see cl_on_reply). */
static bool cl_dispatch(convd_client *c, Convd__ServerMessage *m)
{
    switch (m->msg_case) {
    case CONVD__SERVER_MESSAGE__MSG_COMPLETION: {
        const Convd__Completion *done = m->completion;
        cl_complete(c, done->id, done->status, done->error, done->queue_us, done->exec_us,
                    done->batch_size);
        return false;
    }
    case CONVD__SERVER_MESSAGE__MSG_DOORBELL:
        /* Completions wait in the ring: whoever called us drains it next. */
        return false;
    case CONVD__SERVER_MESSAGE__MSG_RING_REPLY:
        return cl_on_reply(c, m, CL_EXPECT_RING, 0, "RingReply");
    case CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY:
        return cl_on_reply(c, m, CL_EXPECT_HELLO, 0, "HelloReply");
    case CONVD__SERVER_MESSAGE__MSG_REGION_REPLY:
        return cl_on_reply(c, m, CL_EXPECT_REGION, m->region_reply->region_id, "RegionReply");
    case CONVD__SERVER_MESSAGE__MSG_STATUS_REPLY:
        return cl_on_reply(c, m, CL_EXPECT_STATUS, m->status_reply->tag, "StatusReply");
    case CONVD__SERVER_MESSAGE__MSG_METRICS_REPLY:
        return cl_on_reply(c, m, CL_EXPECT_METRICS, m->metrics_reply->tag, "MetricsReply");
    case CONVD__SERVER_MESSAGE__MSG_PONG:
        return cl_on_reply(c, m, CL_EXPECT_PONG, m->pong->tag, "Pong");
    case CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR: {
        const Convd__ProtocolError *e = m->protocol_error;
        int code = e->status < 0 ? e->status : CONVD_EPROTO;
        /* During the handshake the reply is the whole answer: let the waiter see it. */
        if (c->expect.kind == CL_EXPECT_HELLO && c->expect.reply == NULL) {
            c->expect.reply = m;
            return true;
        }
        cl_trouble(c, code, "the daemon reported a protocol error: %s (%s)",
                   e->error[0] != '\0' ? e->error : convd_strerror(code), convd_status_name(code));
        return false;
    }
    case CONVD__SERVER_MESSAGE__MSG__NOT_SET:
    default:
        cl_trouble(c, CONVD_EPROTO, "the daemon sent a message of unknown type %d",
                   (int)m->msg_case);
        return false;
    }
}

int cl_drain(convd_client *c)
{
    if (c->has_ring)
        cl_ring_drain(c);
    if (c->closed)
        return CONVD_ECLOSED;
    for (;;) {
        int fds[SOCK_MAX_FDS];
        size_t nfds = 0;
        ssize_t n = sock_recv(c->fd, c->rxbuf, CONVD_MAX_MESSAGE_BYTES, fds, &nfds);
        if (n == -EAGAIN || n == -EWOULDBLOCK) {
            /* A Doorbell read above may stand for completions posted after the first look at
             * the ring: look again, or a caller's poll() would sleep on them. */
            if (c->has_ring)
                cl_ring_drain(c);
            return 0;
        }
        if (n == -EMSGSIZE) {
            cl_trouble(c, CONVD_EPROTO, "the daemon sent a datagram larger than %u bytes",
                       CONVD_MAX_MESSAGE_BYTES);
            continue;
        }
        if (n <= 0) {
            /* 0: orderly close; ECONNRESET and the like: gone all the same. */
            sock_close_fds(fds, nfds);
            cl_mark_closed(c);
            return CONVD_ECLOSED;
        }
        if (nfds > 0) {
            sock_close_fds(fds, nfds);
            cl_trouble(c, CONVD_EPROTO, "the daemon attached %zu file descriptors to a message",
                       nfds);
        }
        Convd__ServerMessage *m = convd__server_message__unpack(NULL, (size_t)n, c->rxbuf);
        if (m == NULL) {
            cl_trouble(c, CONVD_EPROTO,
                       "the daemon sent a datagram of %zd bytes that does not "
                       "decode as a ServerMessage",
                       n);
            continue;
        }
        if (!cl_dispatch(c, m))
            convd__server_message__free_unpacked(m, NULL);
    }
}

/* With rings, a wait first spins on the completion ring (and on the daemon's count of socket
 * messages) for spin_ns: a completion that comes within that costs no system call. Then it
 * sets WAITING and sleeps on the socket, where the daemon's doorbell wakes it. */
static int cl_pump_once(convd_client *c, cl_done_fn done, const void *arg, uint64_t deadline,
                        uint64_t *spin_end)
{
    if (c->has_ring)
        cl_ring_drain(c);
    if (done(c, arg))
        return 0;
    if (c->trouble != 0 && !c->closed) {
        int code = c->trouble;
        c->trouble = 0;
        return cl_fail(c, code, "%s", c->trouble_msg);
    }
    if (c->closed)
        return cl_closed_fail(c);
    if (c->has_ring && c->spin_ns > 0) {
        uint64_t now = convd_now_ns();
        if (*spin_end == 0) {
            *spin_end = now + c->spin_ns;
            cl_ring_set_waiting(c, false);
        }
        if (now < *spin_end && now < deadline) {
            if (cl_ring_socket_news(c))
                cl_drain(c);
            else if (*spin_end - now < c->spin_ns - CL_SPIN_PURE_NS)
                /* Past the first microseconds, let whatever else wants this CPU run (the
                 * daemon's loop, when there are more busy threads than CPUs). */
                sched_yield();
            else
                convd_cpu_relax();
            return CONVD_EAGAIN;
        }
    }
    if (c->has_ring) {
        cl_ring_set_waiting(c, true);
        if (cl_ring_drain(c) > 0)
            return CONVD_EAGAIN;
    }
    struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
    int ms = cl_poll_ms(deadline);
    int rc = poll(&pfd, 1, ms);
    if (rc < 0) {
        if (errno == EINTR)
            return CONVD_EAGAIN;
        return cl_fail(c, CONVD_EIO, "poll on the daemon's socket failed: %s", strerror(errno));
    }
    if (rc == 0) {
        if (ms != 0 || convd_now_ns() >= deadline)
            return cl_fail(c, CONVD_ETIMEDOUT, "timed out waiting for the daemon");
        return CONVD_EAGAIN;
    }
    cl_drain(c);
    return CONVD_EAGAIN;
}

int cl_pump(convd_client *c, cl_done_fn done, const void *arg, uint64_t deadline)
{
    uint64_t spin_end = 0;
    int rc;
    while ((rc = cl_pump_once(c, done, arg, deadline, &spin_end)) == CONVD_EAGAIN)
        ;
    /* Back to the caller's setting for whatever it does next: its own poll loop must be woken,
     * unless it turned doorbells off (a wait that slept set the flag). A completion posted
     * after the last look at the ring, while the flag was clear, rang no doorbell; take it
     * into the queue now, where convd_poll() finds it. */
    if (c->has_ring && (spin_end != 0 || c->no_doorbells)) {
        cl_ring_set_waiting(c, !c->no_doorbells);
        cl_ring_drain(c);
    }
    return rc;
}

int convd_client_doorbells(convd_client *c, int on)
{
    if (c == NULL)
        return CONVD_EINVAL;
    const int was = !c->no_doorbells;
    c->no_doorbells = on == 0;
    if (c->has_ring && !c->closed) {
        cl_ring_set_waiting(c, on != 0);
        /* With the flag clear a completion rang nothing: it waits in the ring, and turning the
         * doorbells on announces only later ones. Queue it now for convd_poll(). */
        if (on != 0)
            cl_ring_drain(c);
    }
    return was;
}

int cl_send(convd_client *c, const Convd__ClientMessage *m, int pass_fd, uint64_t deadline)
{
    if (c->closed)
        return cl_closed_fail(c);
    int len = wire_pack_client(m, c->txbuf, c->max_send);
    if (len < 0)
        return cl_fail(c, CONVD_ETOOBIG,
                       "the message is %zu bytes, larger than the %zu the "
                       "daemon accepts",
                       convd__client_message__get_packed_size(m), c->max_send);
    for (;;) {
        int rc = sock_send(c->fd, c->txbuf, (size_t)len, pass_fd);
        if (rc == 0)
            return 0;
        if (rc == -EPIPE || rc == -ECONNRESET || rc == -ENOTCONN) {
            /* What the daemon sent before it went (a ProtocolError saying why, completions) is
             * still queued here: take it in before reporting the close. */
            cl_drain(c);
            cl_mark_closed(c);
            return cl_closed_fail(c);
        }
        if (rc != -EAGAIN && rc != -EWOULDBLOCK && rc != -ENOBUFS)
            return cl_fail(c, CONVD_EIO, "sending to the daemon failed: %s", strerror(-rc));
        /* The daemon's receive queue is full. Wait for room, and keep reading meanwhile: it may
         * be blocked on sending us completions. */
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN | POLLOUT};
        int prc = poll(&pfd, 1, cl_poll_ms(deadline));
        if (prc < 0 && errno != EINTR)
            return cl_fail(c, CONVD_EIO, "poll on the daemon's socket failed: %s", strerror(errno));
        if (prc == 0)
            return cl_fail(c, CONVD_ETIMEDOUT,
                           "timed out waiting for room in the daemon's receive queue");
        if (prc > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR))) {
            if (cl_drain(c) == CONVD_ECLOSED)
                return cl_closed_fail(c);
        }
    }
}

static bool cl_reply_arrived(const convd_client *c, const void *arg)
{
    (void)arg;
    return c->expect.reply != NULL;
}

int cl_request(convd_client *c, const Convd__ClientMessage *m, int pass_fd,
               enum cl_expect_kind kind, uint64_t key, uint64_t deadline,
               Convd__ServerMessage **ret_reply)
{
    int rc = cl_ring_flush(c, deadline);
    if (rc != 0)
        return rc;
    c->expect.kind = kind;
    c->expect.key = key;
    c->expect.reply = NULL;
    rc = cl_send(c, m, pass_fd, deadline);
    if (rc == 0)
        rc = cl_pump(c, cl_reply_arrived, NULL, deadline);
    Convd__ServerMessage *reply = c->expect.reply;
    c->expect.kind = CL_EXPECT_NONE;
    c->expect.reply = NULL;
    if (rc != 0) {
        if (reply != NULL)
            convd__server_message__free_unpacked(reply, NULL);
        return rc;
    }
    *ret_reply = reply;
    return 0;
}

/*
 * Connect and handshake.
 */

/* Connects a non-blocking socket to path, retrying while the listen backlog is full (Unix sockets
 * answer EAGAIN then rather than queueing the attempt). Returns the descriptor or a CONVD_E* code
 * with the sentence in the thread's connect error. */
static int cl_socket_connect(const char *path, uint64_t deadline)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t plen = strlen(path);
    if (plen == 0)
        return cl_connect_fail(CONVD_ECONNECT, "the socket path is empty");
    if (plen >= sizeof(sa.sun_path))
        return cl_connect_fail(CONVD_ECONNECT,
                               "the socket path %s is %zu bytes long; at most %zu fit", path, plen,
                               sizeof(sa.sun_path) - 1);
    memcpy(sa.sun_path, path, plen + 1);

    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return cl_connect_fail(
            errno == EMFILE || errno == ENFILE || errno == ENOMEM ? CONVD_ENOMEM : CONVD_ECONNECT,
            "cannot create a socket: %s", strerror(errno));
    for (;;) {
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
            return fd;
        int err = errno;
        if (err == EINTR)
            continue;
        if (err == EAGAIN && convd_now_ns() < deadline) {
            poll(NULL, 0, 5);
            continue;
        }
        close(fd);
        if (err == EAGAIN)
            return cl_connect_fail(
                CONVD_ETIMEDOUT, "timed out connecting to %s: the daemon's backlog is full", path);
        if (err == EACCES || err == EPERM)
            return cl_connect_fail(CONVD_EPERM, "permission denied connecting to %s", path);
        if (err == ENOENT || err == ECONNREFUSED)
            return cl_connect_fail(CONVD_ECONNECT, "no daemon is listening at %s (%s)", path,
                                   strerror(err));
        return cl_connect_fail(CONVD_ECONNECT, "cannot connect to %s: %s", path, strerror(err));
    }
}

/* The name the daemon shows for this client: the caller's, else the program's, at most
 * CONVD_MAX_NAME_BYTES bytes. */
static void cl_client_name(const char *name, char out[CONVD_MAX_NAME_BYTES + 1])
{
    if (name == NULL || name[0] == '\0')
        name = program_invocation_short_name;
    cl_strlcpy(out, CONVD_MAX_NAME_BYTES + 1, name != NULL ? name : "");
}

static int cl_handshake(convd_client *c, const char *name, uint64_t deadline)
{
    char nbuf[CONVD_MAX_NAME_BYTES + 1];
    cl_client_name(name, nbuf);

    Convd__Hello hello = CONVD__HELLO__INIT;
    hello.protocol_version = CONVD_PROTOCOL_VERSION;
    hello.min_protocol_version = CONVD_PROTOCOL_VERSION_MIN;
    hello.client_name = nbuf;
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_HELLO;
    m.hello = &hello;

    Convd__ServerMessage *r = NULL;
    int rc = cl_request(c, &m, -1, CL_EXPECT_HELLO, 0, deadline, &r);
    if (rc == CONVD_ECLOSED)
        return cl_fail(c, CONVD_ECONNECT, "the daemon closed the connection during the handshake");
    if (rc == CONVD_ETIMEDOUT)
        return cl_fail(c, CONVD_ETIMEDOUT, "timed out waiting for the daemon's HelloReply");
    if (rc == CONVD_EPROTO) {
        /* Whatever answered does not speak our protocol. */
        char why[CL_ERRSTR_BYTES];
        snprintf(why, sizeof(why), "%s", c->errstr);
        return cl_fail(c, CONVD_EVERSION, "the peer does not speak the convd protocol: %s", why);
    }
    if (rc != 0)
        return rc;

    if (r->msg_case == CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR) {
        const Convd__ProtocolError *e = r->protocol_error;
        rc = e->status < 0 ? e->status : CONVD_EVERSION;
        cl_fail(c, rc, "the daemon refused the handshake: %s",
                e->error[0] != '\0' ? e->error : convd_strerror(rc));
        goto finish;
    }
    const Convd__HelloReply *h = r->hello_reply;
    if (h->status != 0) {
        rc = h->status < 0 ? h->status : CONVD_EPROTO;
        cl_fail(c, rc, "the daemon refused the connection: %s",
                h->error[0] != '\0' ? h->error : convd_strerror(rc));
        goto finish;
    }
    /* The daemon picks a version in our range; anything else is a daemon we cannot talk to. */
    if (h->protocol_version < CONVD_PROTOCOL_VERSION_MIN ||
        h->protocol_version > CONVD_PROTOCOL_VERSION) {
        rc = cl_fail(c, CONVD_EVERSION,
                     "the daemon answered with protocol version %u, this library speaks versions "
                     "%u to %u",
                     h->protocol_version, CONVD_PROTOCOL_VERSION_MIN, CONVD_PROTOCOL_VERSION);
        goto finish;
    }
    c->info.protocol_version = h->protocol_version;
    cl_strlcpy(c->info.server_version, sizeof(c->info.server_version), h->server_version);
    cl_strlcpy(c->info.backend, sizeof(c->info.backend), h->backend);
    cl_strlcpy(c->info.device, sizeof(c->info.device), h->device);
    c->info.max_inflight = h->max_inflight;
    c->info.max_regions = h->max_regions;
    c->info.max_mapped_bytes = h->max_mapped_bytes;
    c->info.max_batch = h->max_batch;
    c->ring_version = h->ring_version;
    if (h->max_message_bytes != 0 && h->max_message_bytes < c->max_send)
        c->max_send = h->max_message_bytes;
    rc = 0;
finish:
    convd__server_message__free_unpacked(r, NULL);
    return rc;
}

int cl_connect_fd(int fd, const char *name, int timeout_ms, bool use_rings, int spin_us,
                  convd_client **ret_client)
{
    int rc;
    if (timeout_ms <= 0)
        timeout_ms = CL_DEFAULT_TIMEOUT_MS;
    uint64_t deadline = cl_deadline(timeout_ms);

    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        rc = cl_connect_fail(CONVD_ECONNECT, "cannot make the socket non-blocking: %s",
                             strerror(errno));
        close(fd);
        return rc;
    }
    convd_client *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        close(fd);
        return cl_connect_fail(CONVD_ENOMEM, "out of memory for a client");
    }
    c->fd = fd;
    c->timeout_ms = timeout_ms;
    c->max_send = CONVD_MAX_MESSAGE_BYTES;
    c->next_id = 1;
    c->next_region_id = 1;
    c->next_tag = 1;
    cl_slots_init(c);
    c->rxbuf = malloc(CONVD_MAX_MESSAGE_BYTES);
    c->txbuf = malloc(CONVD_MAX_MESSAGE_BYTES);
    if (c->rxbuf == NULL || c->txbuf == NULL) {
        rc = cl_fail(c, CONVD_ENOMEM, "out of memory for the message buffers");
        goto fail;
    }
    rc = cl_handshake(c, name, deadline);
    if (rc != 0)
        goto fail;
    c->spin_ns = (uint64_t)(spin_us < 0 ? CL_DEFAULT_SPIN_US : spin_us) * 1000u;
    /* Rings are an optimisation: a daemon that refuses them still serves us on the socket. */
    if (use_rings && c->ring_version >= CONVD_RING_VERSION) {
        rc = cl_ring_attach(c, deadline);
        if (rc == CONVD_ECLOSED || rc == CONVD_ETIMEDOUT)
            goto fail;
    }
    c->errstr[0] = '\0';
    *ret_client = c;
    return 0;
fail:
    cl_connect_fail(rc, "%s", c->errstr);
    convd_close(c);
    return rc;
}

unsigned convd_version(void)
{
    return CONVD_VERSION_NUMBER;
}

const char *convd_version_string(void)
{
    return CONVD_VERSION_STRING;
}

int convd_socket_path(int device, char *ret_path, size_t cap)
{
    if (ret_path == NULL || device < -1)
        return CONVD_EINVAL;
    const char *env = getenv("CONVD_SOCKET");
    const char *dir = getenv("CONVD_SOCKET_DIR");
    if (dir == NULL || dir[0] == '\0')
        dir = CONVD_DEFAULT_SOCKET_DIR;
    /* A directory given with a trailing slash still makes one separator. */
    size_t dlen = strlen(dir);
    while (dlen > 1 && dir[dlen - 1] == '/')
        dlen--;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int n;
    if (env != NULL && env[0] != '\0')
        n = snprintf(path, sizeof(path), "%s", env);
    else if (device >= 0)
        n = snprintf(path, sizeof(path), "%.*s/gpu%d.sock", (int)dlen, dir, device);
    else
        n = snprintf(path, sizeof(path), "%.*s/convd.sock", (int)dlen, dir);
    if (n < 0 || (size_t)n >= sizeof(path) || (size_t)n >= cap)
        return CONVD_ETOOBIG;
    memcpy(ret_path, path, (size_t)n + 1);
    return 0;
}

int convd_connect(const struct convd_connect_options *opts, convd_client **ret_client)
{
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    if (ret_client == NULL)
        return cl_connect_fail(CONVD_EINVAL, "ret_client is NULL");
    if (opts != NULL) {
        /* Callers built against an older header pass a shorter struct: its fields are taken,
         * the newer ones keep their defaults. */
        const size_t first = offsetof(struct convd_connect_options, timeout_ms) + sizeof(int);
        if (opts->struct_size < first || opts->struct_size > CL_ARGS_MAX_BYTES)
            return cl_connect_fail(CONVD_EINVAL,
                                   "options struct_size is %zu, expected %zu: initialise the "
                                   "options with CONVD_CONNECT_OPTIONS_INIT",
                                   opts->struct_size, sizeof(o));
        memcpy(&o, opts, opts->struct_size < sizeof(o) ? opts->struct_size : sizeof(o));
        o.struct_size = sizeof(o);
    }
    bool use_rings = o.use_rings != 0;
    const char *env = getenv("CONVD_RINGS");
    if (o.use_rings < 0 && env != NULL && strcmp(env, "0") == 0)
        use_rings = false;
    int spin_us = o.spin_us;
    env = getenv("CONVD_SPIN_US");
    if (spin_us < 0 && env != NULL && env[0] != '\0') {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 0 && v <= 1000000)
            spin_us = (int)v;
    }
    const char *path = o.socket_path;
    char pbuf[sizeof(((struct sockaddr_un *)0)->sun_path)];
    if (o.device < -1)
        return cl_connect_fail(CONVD_EINVAL,
                               "options device is %d: -1 (the default socket) or a GPU ordinal",
                               o.device);
    if (path == NULL) {
        int prc = convd_socket_path(o.device, pbuf, sizeof(pbuf));
        if (prc != 0)
            return cl_connect_fail(CONVD_ECONNECT,
                                   "the socket path for device %d is longer than a Unix socket "
                                   "address holds ($CONVD_SOCKET or $CONVD_SOCKET_DIR too long)",
                                   o.device);
        path = pbuf;
    }
    int timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : CL_DEFAULT_TIMEOUT_MS;
    int fd = cl_socket_connect(path, cl_deadline(timeout_ms));
    if (fd < 0)
        return fd;
    convd_client *c;
    int rc = cl_connect_fd(fd, o.client_name, timeout_ms, use_rings, spin_us, &c);
    if (rc != 0) {
        /* Name the socket: the sentence alone does not say which daemon refused. */
        char msg[CL_ERRSTR_BYTES];
        snprintf(msg, sizeof(msg), "%s", cl_connect_error);
        cl_connect_fail(rc, "%s: %s", path, msg);
        return rc;
    }
    *ret_client = c;
    return 0;
}

void convd_close(convd_client *c)
{
    if (c == NULL)
        return;
    /* Closing the socket is the whole goodbye: the daemon cancels or finishes what is in flight
     * and drops our regions. Unmap ours without a round trip each, once no stream is left
     * waiting on a gate word in them. */
    cl_gates_release(c, NULL);
    cl_regions_drop_all(c);
    cl_ring_drop(c);
    if (c->fd >= 0)
        close(c->fd);
    if (c->expect.reply != NULL)
        convd__server_message__free_unpacked(c->expect.reply, NULL);
    cl_slots_free(c);
    free(c->rxbuf);
    free(c->txbuf);
    free(c);
}

int convd_client_process(convd_client *c)
{
    if (c == NULL)
        return CONVD_EINVAL;
    cl_drain(c);
    if (c->trouble != 0) {
        int code = c->trouble;
        c->trouble = 0;
        if (c->closed)
            return cl_fail(c, CONVD_ECLOSED, "the daemon closed the connection after: %s",
                           c->trouble_msg);
        return cl_fail(c, code, "%s", c->trouble_msg);
    }
    if (c->closed)
        return cl_fail(c, CONVD_ECLOSED, "the daemon closed the connection");
    return 0;
}
