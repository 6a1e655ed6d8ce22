/*
 * libconvd-client against a scripted fake daemon: the peer end of a SOCK_SEQPACKET socketpair,
 * driven by the test (replies queued before the call that reads them, or a thread where the
 * peer must react to what the client sends). The fake lives only here.
 *
 * Covered: handshake and version checks, socket path resolution, regions (memfd seals, shared
 * mapping, refusal, GPU import), client-side request validation, ids, the in-flight limit,
 * out-of-order completions, timeouts, the daemon closing mid-wait, ProtocolError and other
 * unexpected input, event-loop integration, queries and stale replies, a full send queue, and
 * convd_conv() against a fake daemon that computes with the reference convolution.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "client_priv.h"
#include "sock.h"
#include "testutil.h"
#include "wire.h"

/*
 * The fake peer's I/O.
 */

static int count_fds(void)
{
    int n = 0;
    for (int fd = 0; fd < 1024; fd++)
        if (fcntl(fd, F_GETFD) >= 0)
            n++;
    return n;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void peer_send_fd(int fd, const Convd__ServerMessage *m, int pass_fd)
{
    static uint8_t buf[CONVD_MAX_MESSAGE_BYTES];
    int len = wire_pack_server(m, buf, sizeof(buf));
    assert_true(len > 0);
    assert_int_equal(sock_send(fd, buf, (size_t)len, pass_fd), 0);
}

static void peer_send(int fd, const Convd__ServerMessage *m)
{
    peer_send_fd(fd, m, -1);
}

struct hello_opts {
    uint32_t version;
    int status;
    const char *error;
    uint32_t max_inflight, max_regions;
    uint64_t max_mapped;
    const char *backend;
};
#define HELLO_DEFAULTS                                                                             \
    {                                                                                              \
        CONVD_PROTOCOL_VERSION, 0, "", 64, 16, 1u << 30, "cpu"                                     \
    }

static void peer_hello_reply(int fd, const struct hello_opts *o)
{
    Convd__HelloReply h = CONVD__HELLO_REPLY__INIT;
    h.status = o->status;
    h.error = (char *)o->error;
    h.protocol_version = o->version;
    h.server_version = "9.8.7";
    h.backend = (char *)o->backend;
    h.device = "fake device";
    h.max_inflight = o->max_inflight;
    h.max_message_bytes = CONVD_MAX_MESSAGE_BYTES;
    h.max_regions = o->max_regions;
    h.max_mapped_bytes = o->max_mapped;
    h.max_batch = 16;
    Convd__ServerMessage m = CONVD__SERVER_MESSAGE__INIT;
    m.msg_case = CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY;
    m.hello_reply = &h;
    peer_send(fd, &m);
}

static void peer_region_reply(int fd, uint64_t id, int status, const char *error)
{
    Convd__RegionReply r = CONVD__REGION_REPLY__INIT;
    r.region_id = id;
    r.status = status;
    r.error = (char *)error;
    Convd__ServerMessage m = CONVD__SERVER_MESSAGE__INIT;
    m.msg_case = CONVD__SERVER_MESSAGE__MSG_REGION_REPLY;
    m.region_reply = &r;
    peer_send(fd, &m);
}

static void peer_completion_fd(int fd, uint64_t id, int status, const char *error, int pass_fd)
{
    Convd__Completion c = CONVD__COMPLETION__INIT;
    c.id = id;
    c.status = status;
    c.error = (char *)error;
    c.queue_us = id * 10;
    c.exec_us = id * 100;
    c.batch_size = (uint32_t)id;
    Convd__ServerMessage m = CONVD__SERVER_MESSAGE__INIT;
    m.msg_case = CONVD__SERVER_MESSAGE__MSG_COMPLETION;
    m.completion = &c;
    peer_send_fd(fd, &m, pass_fd);
}

static void peer_completion(int fd, uint64_t id, int status, const char *error)
{
    peer_completion_fd(fd, id, status, error, -1);
}

static void peer_protocol_error(int fd, int status, const char *error)
{
    Convd__ProtocolError e = CONVD__PROTOCOL_ERROR__INIT;
    e.status = status;
    e.error = (char *)error;
    Convd__ServerMessage m = CONVD__SERVER_MESSAGE__INIT;
    m.msg_case = CONVD__SERVER_MESSAGE__MSG_PROTOCOL_ERROR;
    m.protocol_error = &e;
    peer_send(fd, &m);
}

static void peer_pong(int fd, uint64_t tag)
{
    Convd__Pong p = CONVD__PONG__INIT;
    p.tag = tag;
    Convd__ServerMessage m = CONVD__SERVER_MESSAGE__INIT;
    m.msg_case = CONVD__SERVER_MESSAGE__MSG_PONG;
    m.pong = &p;
    peer_send(fd, &m);
}

/* Receives one client message, waiting up to 5 s. The descriptor it carried goes to *ret_fd (-1
 * if none); without ret_fd the message must carry none. */
static Convd__ClientMessage *peer_recv(int fd, int *ret_fd)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 5000), 1);
    static uint8_t buf[CONVD_MAX_MESSAGE_BYTES];
    int fds[SOCK_MAX_FDS];
    size_t nfds;
    ssize_t n = sock_recv(fd, buf, sizeof(buf), fds, &nfds);
    assert_true(n > 0);
    Convd__ClientMessage *m = convd__client_message__unpack(NULL, (size_t)n, buf);
    assert_non_null(m);
    if (ret_fd != NULL) {
        assert_true(nfds <= 1);
        *ret_fd = nfds == 1 ? fds[0] : -1;
    } else {
        assert_int_equal(nfds, 0);
    }
    return m;
}

/* True when the client has sent nothing more. */
static bool peer_idle(int fd)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    return poll(&pfd, 1, 0) == 0;
}

/* A client connected to a fake peer through cl_connect_fd(). */
struct fake {
    convd_client *c;
    int peer;
    uint64_t next_region;
    int fds_before;
};

static void fake_connect_opts(struct fake *f, const struct hello_opts *o, int timeout_ms)
{
    int sv[2];
    f->fds_before = count_fds();
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    peer_hello_reply(sv[1], o);
    assert_int_equal(cl_connect_fd(sv[0], "unit", timeout_ms, false, -1, &f->c), 0);
    Convd__ClientMessage *m = peer_recv(sv[1], NULL);
    assert_int_equal(m->msg_case, CONVD__CLIENT_MESSAGE__MSG_HELLO);
    assert_int_equal(m->hello->protocol_version, CONVD_PROTOCOL_VERSION);
    assert_int_equal(m->hello->min_protocol_version, CONVD_PROTOCOL_VERSION_MIN);
    assert_string_equal(m->hello->client_name, "unit");
    convd__client_message__free_unpacked(m, NULL);
    f->peer = sv[1];
    f->next_region = 1;
}

static void fake_connect(struct fake *f)
{
    struct hello_opts o = HELLO_DEFAULTS;
    fake_connect_opts(f, &o, 2000);
}

/* Closes both ends and checks that no descriptor leaked. */
static void fake_close(struct fake *f)
{
    convd_close(f->c);
    if (f->peer >= 0)
        close(f->peer);
    assert_int_equal(count_fds(), f->fds_before);
}

/* Creates a region the peer accepts; the peer's copy of the memfd goes to *ret_memfd (or is
 * closed). */
static convd_region *fake_region(struct fake *f, size_t size, int *ret_memfd)
{
    convd_region *r;
    uint64_t id = f->next_region++;
    peer_region_reply(f->peer, id, 0, "");
    assert_int_equal(convd_region_create(f->c, size, &r), 0);
    int memfd;
    Convd__ClientMessage *m = peer_recv(f->peer, &memfd);
    assert_int_equal(m->msg_case, CONVD__CLIENT_MESSAGE__MSG_REGISTER_REGION);
    assert_int_equal(m->register_region->region_id, id);
    assert_int_equal(m->register_region->kind, CONVD__REGION_KIND__REGION_MEMFD);
    assert_int_equal(m->register_region->size, size);
    assert_true(memfd >= 0);
    convd__client_message__free_unpacked(m, NULL);
    if (ret_memfd != NULL)
        *ret_memfd = memfd;
    else
        close(memfd);
    return r;
}

/* A small valid problem and its arguments in region r: input at 0, weight at 256, output at
 * 1024. */
static void small_args(struct convd_conv_args *a, convd_region *r)
{
    *a = (struct convd_conv_args)CONVD_CONV_ARGS_INIT;
    convd_problem_init(&a->problem, 1, 4, 4, 2, 2, 3, 3, 1);
    a->problem.pad_top = a->problem.pad_bottom = a->problem.pad_left = a->problem.pad_right = 1;
    a->input = (struct convd_tensor){r, 0, 128};
    a->weight = (struct convd_tensor){r, 256, 144};
    a->output = (struct convd_tensor){r, 1024, 128};
}

/* A daemon of protocol 1 knows relu only: relu still goes (as Problem.relu, which it reads), and
 * any other activation is refused here by name rather than sent to be silently dropped. */
static void test_old_daemon_activations(void **state)
{
    (void)state;
    struct fake f;
    struct hello_opts o = HELLO_DEFAULTS;
    o.version = 1;
    fake_connect_opts(&f, &o, 2000);
    convd_region *r = fake_region(&f, 4096, NULL);
    struct convd_conv_args a;
    uint64_t id = 5;
    for (int act = CONVD_ACT_CLAMP; act <= CONVD_ACT_GELU_TANH; act++) {
        small_args(&a, r);
        a.problem.activation = (enum convd_activation)act;
        a.problem.act_max = act == CONVD_ACT_CLAMP ? 6.0f : 0.0f;
        assert_int_equal(convd_conv_submit(f.c, &a, &id), CONVD_EUNSUPPORTED);
        assert_non_null(strstr(convd_errstr(f.c), "needs protocol version 2"));
        assert_non_null(strstr(convd_errstr(f.c), convd_activation_name(a.problem.activation)));
        assert_int_equal(id, 5);
        assert_true(peer_idle(f.peer));
    }
    small_args(&a, r);
    a.problem.activation = CONVD_ACT_RELU;
    uint64_t got;
    assert_int_equal(convd_conv_submit(f.c, &a, &got), 0);
    Convd__ClientMessage *m = peer_recv(f.peer, NULL);
    assert_int_equal(m->msg_case, CONVD__CLIENT_MESSAGE__MSG_CONV);
    assert_true(m->conv->problem->relu);
    convd__client_message__free_unpacked(m, NULL);
    fake_close(&f);
}

static uint64_t submit_seen(struct fake *f, const struct convd_conv_args *a)
{
    uint64_t id;
    int rc = convd_conv_submit(f->c, a, &id);
    if (rc != 0)
        fail_msg("submit: %s", convd_errstr(f->c));
    Convd__ClientMessage *m = peer_recv(f->peer, NULL);
    assert_int_equal(m->msg_case, CONVD__CLIENT_MESSAGE__MSG_CONV);
    assert_int_equal(m->conv->id, id);
    convd__client_message__free_unpacked(m, NULL);
    return id;
}

/*
 * Handshake.
 */

static void test_handshake(void **state)
{
    (void)state;
    struct fake f;
    struct hello_opts o = HELLO_DEFAULTS;
    o.max_inflight = 7;
    o.backend = "gpu";
    fake_connect_opts(&f, &o, 2000);
    struct convd_server_info info;
    convd_server_info(f.c, &info);
    assert_int_equal(info.protocol_version, CONVD_PROTOCOL_VERSION);
    assert_string_equal(info.server_version, "9.8.7");
    assert_string_equal(info.backend, "gpu");
    assert_string_equal(info.device, "fake device");
    assert_int_equal(info.max_inflight, 7);
    assert_int_equal(info.max_regions, 16);
    assert_int_equal(info.max_mapped_bytes, 1u << 30);
    assert_int_equal(info.max_batch, 16);
    assert_string_equal(convd_errstr(f.c), "");
    assert_int_equal(convd_inflight(f.c), 0);
    assert_true(convd_client_fd(f.c) >= 0);
    fake_close(&f);
}

/* Without a name the program's name is sent; a long one is cut to 64 bytes on a character
 * boundary. */
static void test_handshake_names(void **state)
{
    (void)state;
    struct hello_opts o = HELLO_DEFAULTS;
    char longname[100];
    memset(longname, 'a', sizeof(longname));
    memcpy(longname + 63, "\xc3\xa9", 2); /* a two-byte character straddles the 64-byte cut */
    longname[99] = '\0';
    const char *names[] = {NULL, longname};
    for (int i = 0; i < 2; i++) {
        int sv[2];
        convd_client *c;
        assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
        peer_hello_reply(sv[1], &o);
        assert_int_equal(cl_connect_fd(sv[0], names[i], 1000, false, -1, &c), 0);
        Convd__ClientMessage *m = peer_recv(sv[1], NULL);
        if (i == 0) {
            assert_string_equal(m->hello->client_name, program_invocation_short_name);
        } else {
            assert_int_equal(strlen(m->hello->client_name), 63);
            assert_memory_equal(m->hello->client_name, longname, 63);
        }
        convd__client_message__free_unpacked(m, NULL);
        convd_close(c);
        close(sv[1]);
    }
}

/* Each way a handshake fails, with its code and a sentence that says why. */
static void test_handshake_failures(void **state)
{
    (void)state;
    int fds_before = count_fds();
    struct {
        int kind; /* 0 HelloReply, 1 ProtocolError, 2 close, 3 silence, 4 garbage */
        uint32_t version;
        int status;
        const char *error;
        int want;
        const char *says;
    } cases[] = {
        {0, CONVD_PROTOCOL_VERSION + 1, 0, "", CONVD_EVERSION, "version 4"},
        {0, 0, 0, "", CONVD_EVERSION, "version 0"},
        {0, 1, CONVD_EVERSION, "client too old", CONVD_EVERSION, "client too old"},
        {0, 1, CONVD_EPERM, "uid 1000 not allowed", CONVD_EPERM, "uid 1000 not allowed"},
        {1, 0, CONVD_EVERSION, "protocol 1 unsupported", CONVD_EVERSION, "protocol 1 unsupported"},
        {2, 0, 0, "", CONVD_ECONNECT, "closed the connection"},
        {3, 0, 0, "", CONVD_ETIMEDOUT, "timed out"},
        {4, 0, 0, "", CONVD_EVERSION, "does not speak"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
        struct hello_opts o = HELLO_DEFAULTS;
        o.version = cases[i].version;
        o.status = cases[i].status;
        o.error = cases[i].error;
        switch (cases[i].kind) {
        case 0:
            peer_hello_reply(sv[1], &o);
            break;
        case 1:
            peer_protocol_error(sv[1], cases[i].status, cases[i].error);
            break;
        case 2:
            close(sv[1]);
            sv[1] = -1;
            break;
        case 4:
            assert_int_equal(sock_send(sv[1], "\xff\xff\xff\xff", 4, -1), 0);
            break;
        }
        convd_client *c = (convd_client *)0x1;
        uint64_t t0 = now_ms();
        int rc = cl_connect_fd(sv[0], "unit", 150, false, -1, &c);
        const char *why = convd_last_connect_error();
        if (rc != cases[i].want || strstr(why, cases[i].says) == NULL)
            fail_msg("case %zu: rc %d (%s), '%s'; expected %d and '%s'", i, rc,
                     convd_status_name(rc), why, cases[i].want, cases[i].says);
        assert_ptr_equal(c, (convd_client *)0x1);
        if (cases[i].kind == 3)
            assert_true(now_ms() - t0 >= 150);
        if (sv[1] >= 0)
            close(sv[1]);
    }
    assert_int_equal(count_fds(), fds_before);
}

/*
 * Socket paths.
 */

struct acceptor {
    int lfd;
    char name[80];
};

/* A daemon stand-in on a real listening socket: accepts one client, answers its Hello, and
 * waits for it to close. */
static void *acceptor_main(void *arg)
{
    struct acceptor *a = arg;
    int fd = accept4(a->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return NULL;
    Convd__ClientMessage *m = peer_recv(fd, NULL);
    snprintf(a->name, sizeof(a->name), "%s", m->hello->client_name);
    convd__client_message__free_unpacked(m, NULL);
    struct hello_opts o = HELLO_DEFAULTS;
    peer_hello_reply(fd, &o);
    char buf[64];
    int fds[SOCK_MAX_FDS];
    size_t nfds;
    while (sock_recv(fd, buf, sizeof(buf), fds, &nfds) > 0)
        ;
    close(fd);
    return NULL;
}

static void *connect_bad_path(void *arg)
{
    (void)arg;
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = "/nonexistent/other-thread.sock";
    convd_client *c;
    convd_connect(&o, &c);
    return NULL;
}

static void test_connect_paths(void **state)
{
    (void)state;
    char dir[] = "/tmp/convd-client-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[100], missing[100];
    snprintf(path, sizeof(path), "%s/convd.sock", dir);
    snprintf(missing, sizeof(missing), "%s/missing.sock", dir);

    struct acceptor a = {.lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)};
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    assert_int_equal(bind(a.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(a.lfd, 4), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, acceptor_main, &a), 0);

    /* $CONVD_SOCKET when no path is given. */
    setenv("CONVD_SOCKET", path, 1);
    convd_client *c = NULL;
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.client_name = "by-env";
    int rc = convd_connect(&o, &c);
    if (rc != 0)
        fail_msg("connect: %s", convd_last_connect_error());
    struct convd_server_info info;
    convd_server_info(c, &info);
    assert_string_equal(info.server_version, "9.8.7");
    convd_close(c);
    pthread_join(th, NULL);
    assert_string_equal(a.name, "by-env");

    /* An explicit path wins over the environment. */
    o.socket_path = missing;
    c = (convd_client *)0x1;
    assert_int_equal(convd_connect(&o, &c), CONVD_ECONNECT);
    assert_ptr_equal(c, (convd_client *)0x1);
    assert_non_null(strstr(convd_last_connect_error(), missing));

    /* The environment's path, when it names nothing. */
    setenv("CONVD_SOCKET", missing, 1);
    assert_int_equal(convd_connect(NULL, &c), CONVD_ECONNECT);
    assert_non_null(strstr(convd_last_connect_error(), missing));

    /* The error is per thread. */
    pthread_t t2;
    assert_int_equal(pthread_create(&t2, NULL, connect_bad_path, NULL), 0);
    pthread_join(t2, NULL);
    assert_non_null(strstr(convd_last_connect_error(), missing));

    /* Without either: the default path (a daemon may really run there; only check the name). */
    unsetenv("CONVD_SOCKET");
    rc = convd_connect(NULL, &c);
    if (rc == 0)
        convd_close(c);
    else
        assert_non_null(strstr(convd_last_connect_error(), CONVD_DEFAULT_SOCKET));

    /* Bad arguments. */
    char toolong[200];
    memset(toolong, 'x', sizeof(toolong));
    toolong[0] = '/';
    toolong[199] = '\0';
    o.socket_path = toolong;
    assert_int_equal(convd_connect(&o, &c), CONVD_ECONNECT);
    assert_non_null(strstr(convd_last_connect_error(), "long"));
    struct convd_connect_options old = o;
    old.struct_size = 8;
    assert_int_equal(convd_connect(&old, &c), CONVD_EINVAL);
    assert_int_equal(convd_connect(NULL, NULL), CONVD_EINVAL);

    close(a.lfd);
    unlink(path);
    rmdir(dir);
}

/* convd_socket_path(): $CONVD_SOCKET names the one daemon whatever the device; else gpuN.sock
 * for device N, convd.sock without one, in $CONVD_SOCKET_DIR or /run/convd. */
static void test_socket_path_for_device(void **state)
{
    (void)state;
    char *saved_sock = getenv("CONVD_SOCKET") ? strdup(getenv("CONVD_SOCKET")) : NULL;
    char *saved_dir = getenv("CONVD_SOCKET_DIR") ? strdup(getenv("CONVD_SOCKET_DIR")) : NULL;
    char buf[128];
    unsetenv("CONVD_SOCKET");
    unsetenv("CONVD_SOCKET_DIR");
    assert_int_equal(convd_socket_path(-1, buf, sizeof(buf)), 0);
    assert_string_equal(buf, CONVD_DEFAULT_SOCKET);
    assert_string_equal(buf, "/run/convd/convd.sock");
    assert_int_equal(convd_socket_path(0, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/run/convd/gpu0.sock");
    assert_int_equal(convd_socket_path(13, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/run/convd/gpu13.sock");

    /* The directory, with or without a trailing slash; empty means unset. */
    setenv("CONVD_SOCKET_DIR", "/tmp/sockets//", 1);
    assert_int_equal(convd_socket_path(2, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/tmp/sockets/gpu2.sock");
    assert_int_equal(convd_socket_path(-1, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/tmp/sockets/convd.sock");
    setenv("CONVD_SOCKET_DIR", "", 1);
    assert_int_equal(convd_socket_path(1, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/run/convd/gpu1.sock");

    /* $CONVD_SOCKET wins over the device and the directory. */
    setenv("CONVD_SOCKET_DIR", "/tmp/sockets", 1);
    setenv("CONVD_SOCKET", "/tmp/one.sock", 1);
    assert_int_equal(convd_socket_path(3, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/tmp/one.sock");
    assert_int_equal(convd_socket_path(-1, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/tmp/one.sock");

    /* Paths that do not fit the buffer or a socket address; bad arguments. */
    assert_int_equal(convd_socket_path(3, buf, 5), CONVD_ETOOBIG);
    unsetenv("CONVD_SOCKET");
    char longdir[120];
    memset(longdir, 'd', sizeof(longdir));
    longdir[0] = '/';
    longdir[sizeof(longdir) - 1] = '\0';
    setenv("CONVD_SOCKET_DIR", longdir, 1);
    char big[256];
    assert_int_equal(convd_socket_path(0, big, sizeof(big)), CONVD_ETOOBIG);
    unsetenv("CONVD_SOCKET_DIR");
    assert_int_equal(convd_socket_path(-2, buf, sizeof(buf)), CONVD_EINVAL);
    assert_int_equal(convd_socket_path(0, NULL, 10), CONVD_EINVAL);

    if (saved_sock != NULL)
        setenv("CONVD_SOCKET", saved_sock, 1);
    if (saved_dir != NULL)
        setenv("CONVD_SOCKET_DIR", saved_dir, 1);
    free(saved_sock);
    free(saved_dir);
}

/* convd_connect() with options.device reaches the daemon at <dir>/gpuN.sock; an options struct
 * from before the field (smaller struct_size) reaches the default socket. */
static void test_connect_device(void **state)
{
    (void)state;
    char *saved_sock = getenv("CONVD_SOCKET") ? strdup(getenv("CONVD_SOCKET")) : NULL;
    char dir[] = "/tmp/convd-client-dev-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[100];
    snprintf(path, sizeof(path), "%s/gpu3.sock", dir);
    struct acceptor a = {.lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)};
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    assert_int_equal(bind(a.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(a.lfd, 4), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, acceptor_main, &a), 0);

    unsetenv("CONVD_SOCKET");
    setenv("CONVD_SOCKET_DIR", dir, 1);
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    assert_int_equal(o.device, -1);
    o.client_name = "by-device";
    o.device = 3;
    convd_client *c = NULL;
    int rc = convd_connect(&o, &c);
    if (rc != 0)
        fail_msg("connect: %s", convd_last_connect_error());
    convd_close(c);
    pthread_join(th, NULL);
    assert_string_equal(a.name, "by-device");

    /* Another device: its socket is named in the failure. */
    o.device = 4;
    assert_int_equal(convd_connect(&o, &c), CONVD_ECONNECT);
    assert_non_null(strstr(convd_last_connect_error(), "/gpu4.sock"));
    o.device = -7;
    assert_int_equal(convd_connect(&o, &c), CONVD_EINVAL);
    assert_non_null(strstr(convd_last_connect_error(), "device"));

    /* A struct from a header without `device`: whatever lies beyond it, the default socket. */
    o.device = 3;
    o.struct_size = offsetof(struct convd_connect_options, device);
    assert_int_equal(convd_connect(&o, &c), CONVD_ECONNECT);
    assert_non_null(strstr(convd_last_connect_error(), "/convd.sock"));

    unsetenv("CONVD_SOCKET_DIR");
    if (saved_sock != NULL)
        setenv("CONVD_SOCKET", saved_sock, 1);
    free(saved_sock);
    close(a.lfd);
    unlink(path);
    rmdir(dir);
}

static void test_version(void **state)
{
    (void)state;
    assert_int_equal(convd_version(), CONVD_VERSION_NUMBER);
    assert_int_equal(convd_version(), (CONVD_VERSION_MAJOR << 16) | (CONVD_VERSION_MINOR << 8) |
                                          CONVD_VERSION_PATCH);
    assert_string_equal(convd_version_string(), CONVD_VERSION_STRING);
    char want[32];
    snprintf(want, sizeof(want), "%d.%d.%d", CONVD_VERSION_MAJOR, CONVD_VERSION_MINOR,
             CONVD_VERSION_PATCH);
    assert_string_equal(convd_version_string(), want);
}

/*
 * Regions.
 */

static void test_region_memfd(void **state)
{
    (void)state;
    struct fake f;
    fake_connect(&f);
    int memfd;
    convd_region *r = fake_region(&f, 10000, &memfd);
    assert_int_equal(convd_region_size(r), 10000);

    /* Sealed so that neither side can resize it under the other's mapping. */
    int seals = fcntl(memfd, F_GET_SEALS);
    assert_int_equal(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
                     F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    assert_int_not_equal(ftruncate(memfd, 4096), 0);
    struct stat st;
    assert_int_equal(fstat(memfd, &st), 0);
    assert_int_equal(st.st_size, 10000);
    assert_true(fcntl(memfd, F_GETFD) & FD_CLOEXEC);

    /* Zeroed, and the same memory on both sides. */
    uint8_t *mine = convd_region_data(r);
    for (size_t i = 0; i < 10000; i++)
        assert_int_equal(mine[i], 0);
    uint8_t *theirs = mmap(NULL, 10000, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    assert_true(theirs != MAP_FAILED);
    theirs[9999] = 0x5a;
    mine[0] = 0xa5;
    assert_int_equal(mine[9999], 0x5a);
    assert_int_equal(theirs[0], 0xa5);
    munmap(theirs, 10000);
    close(memfd);

    /* Free: the daemon is told and answers. */
    peer_region_reply(f.peer, 1, 0, "");
    assert_int_equal(convd_region_free(r), 0);
    Convd__ClientMessage *m = peer_recv(f.peer, NULL);
    assert_int_equal(m->msg_case, CONVD__CLIENT_MESSAGE__MSG_UNREGISTER_REGION);
    assert_int_equal(m->unregister_region->region_id, 1);
    convd__client_message__free_unpacked(m, NULL);
    assert_int_equal(convd_region_free(NULL), 0);
    fake_close(&f);
}

static void test_region_refused(void **state)
{
    (void)state;
    struct fake f;
    struct hello_opts o = HELLO_DEFAULTS;
    o.max_regions = 2;
    o.max_mapped = 1 << 20;
    fake_connect_opts(&f, &o, 2000);

    /* The daemon's refusal comes back with its code and sentence. */
    convd_region *r = (convd_region *)0x1;
    peer_region_reply(f.peer, 1, CONVD_ESEAL, "memfd lacks F_SEAL_SHRINK");
    assert_int_equal(convd_region_create(f.c, 4096, &r), CONVD_ESEAL);
    assert_ptr_equal(r, (convd_region *)0x1);
    assert_non_null(strstr(convd_errstr(f.c), "memfd lacks F_SEAL_SHRINK"));
    int memfd;
    Convd__ClientMessage *m = peer_recv(f.peer, &memfd);
    assert_int_equal(m->msg_case, CONVD__CLIENT_MESSAGE__MSG_REGISTER_REGION);
    convd__client_message__free_unpacked(m, NULL);
    close(memfd);
    assert_true(peer_idle(f.peer));

    /* The limits the daemon announced are checked here first, without a message. */
    f.next_region = 2;
    convd_region *a = fake_region(&f, 1000, NULL);
    assert_int_equal(convd_region_create(f.c, (1 << 20) - 999, &r), CONVD_ELIMIT);
    assert_non_null(strstr(convd_errstr(f.c), "bytes"));
    convd_region *b = fake_region(&f, 1000, NULL);
    assert_int_equal(convd_region_create(f.c, 1000, &r), CONVD_ELIMIT);
    assert_non_null(strstr(convd_errstr(f.c), "regions"));
    assert_true(peer_idle(f.peer));
    assert_int_equal(convd_region_create(f.c, 0, &r), CONVD_EINVAL);
    assert_int_equal(convd_region_create(f.c, 10, NULL), CONVD_EINVAL);
    assert_int_equal(convd_region_create(NULL, 10, &r), CONVD_EINVAL);

    /* A ProtocolError instead of an answer fails the call; the client tells the daemon to drop
     * the region in case it registered it after all. */
    peer_region_reply(f.peer, 2, 0, "");
    assert_int_equal(convd_region_free(a), 0);
    convd__client_message__free_unpacked(peer_recv(f.peer, NULL), NULL);
    peer_protocol_error(f.peer, CONVD_EPROTO, "bad RegisterRegion");
    assert_int_equal(convd_region_create(f.c, 1000, &r), CONVD_EPROTO);
    assert_non_null(strstr(convd_errstr(f.c), "bad RegisterRegion"));
    m = peer_recv(f.peer, &memfd);
    assert_int_equal(m->msg_case, CONVD__CLIENT_MESSAGE__MSG_REGISTER_REGION);
    uint64_t lost = m->register_region->region_id;
    convd__client_message__free_unpacked(m, NULL);
    close(memfd);
    m = peer_recv(f.peer, NULL);
    assert_int_equal(m->msg_case, CONVD__CLIENT_MESSAGE__MSG_UNREGISTER_REGION);
    assert_int_equal(m->unregister_region->region_id, lost);
    convd__client_message__free_unpacked(m, NULL);
    /* Its late answers are dropped without complaint. */
    peer_region_reply(f.peer, lost, 0, "");
    peer_region_reply(f.peer, lost, CONVD_ENOREGION, "");
    assert_int_equal(convd_client_process(f.c), 0);

    /* Closing the client frees b without a round trip. */
    (void)b;
    fake_close(&f);
}

static void test_region_gpu(void **state)
{
    (void)state;
    uint8_t handle[64];
    for (int i = 0; i < 64; i++)
        handle[i] = (uint8_t)(i * 3 + 1);
    convd_region *r = (convd_region *)0x1;

    struct fake f;
    fake_connect(&f); /* a cpu daemon */
    assert_int_equal(convd_region_import_gpu(f.c, handle, 64, 0, 4096, &r), CONVD_EUNSUPPORTED);
    assert_non_null(strstr(convd_errstr(f.c), "cpu"));
    assert_true(peer_idle(f.peer));
    fake_close(&f);

    struct hello_opts o = HELLO_DEFAULTS;
    o.backend = "gpu";
    fake_connect_opts(&f, &o, 2000);
    assert_int_equal(convd_region_import_gpu(f.c, handle, 63, 0, 4096, &r), CONVD_EINVAL);
    assert_int_equal(convd_region_import_gpu(f.c, handle, 64, 0, 0, &r), CONVD_EINVAL);
    assert_int_equal(convd_region_import_gpu(f.c, handle, 64, UINT64_MAX, 2, &r), CONVD_EINVAL);
    assert_ptr_equal(r, (convd_region *)0x1);
    peer_region_reply(f.peer, 1, 0, "");
    assert_int_equal(convd_region_import_gpu(f.c, handle, 64, 1 << 20, 1 << 21, &r), 0);
    assert_null(convd_region_data(r));
    assert_int_equal(convd_region_size(r), 1 << 21);
    Convd__ClientMessage *m = peer_recv(f.peer, NULL); /* and no descriptor */
    assert_int_equal(m->register_region->kind, CONVD__REGION_KIND__REGION_GPU_IPC);
    assert_int_equal(m->register_region->ipc_handle.len, 64);
    assert_memory_equal(m->register_region->ipc_handle.data, handle, 64);
    assert_int_equal(m->register_region->ipc_offset, 1 << 20);
    assert_int_equal(m->register_region->size, 1 << 21);
    convd__client_message__free_unpacked(m, NULL);
    /* The daemon may refuse the handle. */
    peer_region_reply(f.peer, 2, CONVD_EBOUNDS, "offset + size beyond the allocation");
    convd_region *r2;
    assert_int_equal(convd_region_import_gpu(f.c, handle, 64, 0, 1 << 29, &r2), CONVD_EBOUNDS);
    assert_non_null(strstr(convd_errstr(f.c), "beyond the allocation"));
    convd__client_message__free_unpacked(peer_recv(f.peer, NULL), NULL);
    fake_close(&f);
}

/*
 * Requests.
 */

static void test_submit_validation(void **state)
{
    (void)state;
    struct fake f;
    struct hello_opts o = HELLO_DEFAULTS;
    o.max_inflight = 2;
    fake_connect_opts(&f, &o, 2000);
    convd_region *r = fake_region(&f, 4096, NULL);
    struct convd_conv_args a;
    uint64_t id = 12345;

    /* Each refusal: the code the daemon would give, a sentence, nothing sent, id untouched. */
    struct {
        const char *what;
        int want;
        const char *says;
    } cases[] = {
        {"groups", CONVD_EGROUPS, "divisible"},
        {"n0", CONVD_EBADSHAPE, "field n"},
        {"dtype", CONVD_EBADSHAPE, "dtype"},
        {"noregion", CONVD_EINVAL, "no region"},
        {"size", CONVD_ESIZE, "needs 144"},
        {"bounds", CONVD_EBOUNDS, "does not fit"},
        {"overflow", CONVD_EBOUNDS, "does not fit"},
        {"bias", CONVD_EINVAL, "bias"},
        {"overlap", CONVD_EINVAL, "overlaps"},
        {"priority", CONVD_EINVAL, "priority"},
        {"struct", CONVD_EINVAL, "CONVD_CONV_ARGS_INIT"},
        {"size+bounds", CONVD_ESIZE, "the problem needs 128"},
        {"misaligned", CONVD_EINVAL, "not aligned to its 4-byte elements"},
        {"tf32", CONVD_EBADSHAPE, "allow_tf32"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        small_args(&a, r);
        const char *w = cases[i].what;
        if (strcmp(w, "groups") == 0)
            a.problem.groups = 3;
        else if (strcmp(w, "n0") == 0)
            a.problem.n = 0;
        else if (strcmp(w, "dtype") == 0)
            a.problem.dtype = 9;
        else if (strcmp(w, "noregion") == 0)
            a.weight.region = NULL;
        else if (strcmp(w, "size") == 0)
            a.weight.bytes = 140;
        else if (strcmp(w, "bounds") == 0)
            a.output.offset = 4000;
        else if (strcmp(w, "overflow") == 0)
            a.input.offset = UINT64_MAX - 64;
        else if (strcmp(w, "bias") == 0)
            a.problem.has_bias = true;
        else if (strcmp(w, "overlap") == 0)
            a.output.offset = 64;
        else if (strcmp(w, "priority") == 0)
            a.priority = 4;
        else if (strcmp(w, "struct") == 0)
            a.struct_size = 16;
        else if (strcmp(w, "size+bounds") == 0)
            a.output = (struct convd_tensor){r, 4090, 100};
        else if (strcmp(w, "misaligned") == 0)
            a.output.offset += 2;
        else if (strcmp(w, "tf32") == 0) {
            a.problem.allow_tf32 = true; /* an fp32 permission only */
            a.problem.dtype = CONVD_DTYPE_FP16;
        }
        int rc = convd_conv_submit(f.c, &a, &id);
        if (rc != cases[i].want || strstr(convd_errstr(f.c), cases[i].says) == NULL)
            fail_msg("%s: rc %d (%s) '%s'", w, rc, convd_status_name(rc), convd_errstr(f.c));
        assert_int_equal(id, 12345);
        assert_true(peer_idle(f.peer));
    }
    small_args(&a, r);
    assert_int_equal(convd_conv_submit(f.c, NULL, &id), CONVD_EINVAL);
    assert_int_equal(convd_conv_submit(f.c, &a, NULL), CONVD_EINVAL);
    assert_int_equal(convd_conv_submit(NULL, &a, &id), CONVD_EINVAL);

    /* A region of another client. */
    struct fake g;
    fake_connect(&g);
    convd_region *other = fake_region(&g, 4096, NULL);
    a.input.region = other;
    assert_int_equal(convd_conv_submit(f.c, &a, &id), CONVD_ENOREGION);
    assert_non_null(strstr(convd_errstr(f.c), "another client"));
    fake_close(&g);

    /* Ids increase; the limit counts requests not yet returned to the caller. */
    small_args(&a, r);
    a.priority = 3;
    a.timeout_us = 777;
    uint64_t id1 = submit_seen(&f, &a);
    uint64_t id2 = submit_seen(&f, &a);
    assert_true(id2 > id1);
    assert_int_equal(convd_inflight(f.c), 2);
    assert_int_equal(convd_conv_submit(f.c, &a, &id), CONVD_ELIMIT);
    assert_non_null(strstr(convd_errstr(f.c), "wait for one"));
    peer_completion(f.peer, id1, 0, "");
    assert_int_equal(convd_client_process(f.c), 0);
    /* Received but not yet returned: still counts. */
    assert_int_equal(convd_conv_submit(f.c, &a, &id), CONVD_ELIMIT);
    struct convd_completion done;
    assert_int_equal(convd_wait(f.c, id1, 0, &done), 0);
    uint64_t id3;
    assert_int_equal(convd_conv_submit(f.c, &a, &id3), 0);
    assert_true(id3 > id2);

    /* What went over the wire. */
    Convd__ClientMessage *m = peer_recv(f.peer, NULL);
    Convd__ConvRequest *q = m->conv;
    assert_int_equal(q->id, id3);
    assert_int_equal(q->priority, 3);
    assert_int_equal(q->timeout_us, 777);
    assert_int_equal(q->problem->n, 1);
    assert_int_equal(q->problem->c, 2);
    assert_int_equal(q->problem->pad_right, 1);
    assert_int_equal(q->problem->dtype, CONVD__DTYPE__DTYPE_FP32);
    assert_int_equal(q->problem->layout, CONVD__LAYOUT__LAYOUT_NCHW);
    assert_int_equal(q->input->region_id, 1);
    assert_int_equal(q->weight->offset, 256);
    assert_int_equal(q->weight->bytes, 144);
    assert_int_equal(q->output->offset, 1024);
    assert_null(q->bias);
    convd__client_message__free_unpacked(m, NULL);
    fake_close(&f);
}

/* struct_size of convd_conv_args: a struct from an older header (ending at `output`) gets the
 * defaults for the fields beyond it, whatever its memory holds there; one from a newer header is
 * taken when the bytes this library does not know are zero, refused when they are not. */
static void test_args_struct_size(void **state)
{
    (void)state;
    struct fake f;
    fake_connect(&f);
    convd_region *r = fake_region(&f, 4096, NULL);
    uint64_t id;

    /* Older and smaller: priority and timeout_us lie beyond it and are not read. */
    struct convd_conv_args a;
    small_args(&a, r);
    a.priority = 3;
    a.timeout_us = 777;
    a.struct_size = offsetof(struct convd_conv_args, priority);
    assert_int_equal(convd_conv_submit(f.c, &a, &id), 0);
    Convd__ClientMessage *m = peer_recv(f.peer, NULL);
    assert_int_equal(m->msg_case, CONVD__CLIENT_MESSAGE__MSG_CONV);
    assert_int_equal(m->conv->id, id);
    assert_int_equal(m->conv->priority, 0);
    assert_int_equal(m->conv->timeout_us, 0);
    assert_int_equal(m->conv->output->offset, 1024);
    convd__client_message__free_unpacked(m, NULL);
    /* The same struct at full size sends what it holds. */
    a.struct_size = sizeof(a);
    assert_int_equal(convd_conv_submit(f.c, &a, &id), 0);
    m = peer_recv(f.peer, NULL);
    assert_int_equal(m->conv->priority, 3);
    assert_int_equal(m->conv->timeout_us, 777);
    convd__client_message__free_unpacked(m, NULL);
    /* Ending inside `output` is too small: the tensors are not optional. */
    a.struct_size = offsetof(struct convd_conv_args, output) + 8;
    id = 12345;
    assert_int_equal(convd_conv_submit(f.c, &a, &id), CONVD_EINVAL);
    assert_non_null(strstr(convd_errstr(f.c), "struct_size"));
    assert_int_equal(id, 12345);

    /* Newer and larger: a field this library does not know. */
    struct {
        struct convd_conv_args a;
        uint64_t newer_field;
        uint32_t another;
    } big;
    memset(&big, 0, sizeof(big));
    small_args(&big.a, r);
    big.a.struct_size = sizeof(big);
    assert_int_equal(convd_conv_submit(f.c, &big.a, &id), 0);
    m = peer_recv(f.peer, NULL);
    assert_int_equal(m->conv->id, id);
    convd__client_message__free_unpacked(m, NULL);
    big.another = 1;
    id = 12345;
    assert_int_equal(convd_conv_submit(f.c, &big.a, &id), CONVD_EUNSUPPORTED);
    assert_non_null(strstr(convd_errstr(f.c), "knows only"));
    assert_int_equal(id, 12345);
    assert_true(peer_idle(f.peer));
    /* Beyond any plausible header. */
    big.another = 0;
    big.a.struct_size = 1u << 20;
    assert_int_equal(convd_conv_submit(f.c, &big.a, &id), CONVD_EINVAL);
    assert_true(peer_idle(f.peer));
    fake_close(&f);
}

static void test_out_of_order(void **state)
{
    (void)state;
    struct fake f;
    fake_connect(&f);
    convd_region *r = fake_region(&f, 4096, NULL);
    struct convd_conv_args a;
    small_args(&a, r);
    uint64_t id[4];
    for (int i = 0; i < 4; i++)
        id[i] = submit_seen(&f, &a);

    /* The daemon answers 3, 1, 4 (a failure), 2. */
    peer_completion(f.peer, id[2], 0, "");
    peer_completion(f.peer, id[0], 0, "");
    peer_completion(f.peer, id[3], CONVD_EBOUNDS, "tensor outside its region");
    peer_completion(f.peer, id[1], 0, "");

    struct convd_completion d;
    assert_int_equal(convd_wait(f.c, id[1], 1000, &d), 0);
    assert_int_equal(d.id, id[1]);
    assert_int_equal(d.status, 0);
    assert_int_equal(d.queue_us, id[1] * 10);
    assert_int_equal(d.exec_us, id[1] * 100);
    assert_int_equal(d.batch_size, id[1]);
    assert_int_equal(convd_inflight(f.c), 3);
    /* The rest in the order received. */
    assert_int_equal(convd_wait_any(f.c, 0, &d), 0);
    assert_int_equal(d.id, id[2]);
    assert_int_equal(convd_poll(f.c, &d), 0);
    assert_int_equal(d.id, id[0]);
    assert_int_equal(convd_wait(f.c, id[3], 0, &d), 0);
    assert_int_equal(d.status, CONVD_EBOUNDS);
    assert_string_equal(d.error, "tensor outside its region");
    assert_int_equal(convd_poll(f.c, &d), CONVD_EAGAIN);
    assert_int_equal(convd_inflight(f.c), 0);
    /* Returned requests are gone. */
    assert_int_equal(convd_wait(f.c, id[1], 0, &d), CONVD_ENOTFOUND);
    assert_int_equal(convd_wait(f.c, 999, 0, &d), CONVD_ENOTFOUND);
    assert_non_null(strstr(convd_errstr(f.c), "999"));
    assert_int_equal(convd_wait_any(f.c, -1, &d), CONVD_ENOTFOUND);

    /* Completions that arrive while the client waits for a control reply are kept. */
    uint64_t early = submit_seen(&f, &a);
    peer_completion(f.peer, early, 0, "");
    peer_region_reply(f.peer, 2, 0, "");
    convd_region *r2;
    assert_int_equal(convd_region_create(f.c, 4096, &r2), 0);
    int memfd;
    convd__client_message__free_unpacked(peer_recv(f.peer, &memfd), NULL);
    close(memfd);
    assert_int_equal(convd_poll(f.c, &d), 0);
    assert_int_equal(d.id, early);
    assert_int_equal(convd_poll(f.c, &d), CONVD_EAGAIN);

    /* Many in flight, answered in reverse: the table finds each. */
    uint64_t ids[40];
    for (int i = 0; i < 40; i++)
        ids[i] = submit_seen(&f, &a);
    for (int i = 39; i >= 0; i--)
        peer_completion(f.peer, ids[i], 0, "");
    for (int i = 0; i < 40; i += 2) {
        assert_int_equal(convd_wait(f.c, ids[i], 1000, &d), 0);
        assert_int_equal(d.id, ids[i]);
    }
    for (int i = 39; i >= 1; i -= 2) {
        assert_int_equal(convd_wait_any(f.c, 1000, &d), 0);
        assert_int_equal(d.id, ids[i]);
    }
    assert_int_equal(convd_inflight(f.c), 0);
    fake_close(&f);
}

static void test_wait_timeout(void **state)
{
    (void)state;
    struct fake f;
    fake_connect(&f);
    convd_region *r = fake_region(&f, 4096, NULL);
    struct convd_conv_args a;
    small_args(&a, r);
    uint64_t id = submit_seen(&f, &a);
    struct convd_completion d;
    memset(&d, 0x5a, sizeof(d));
    uint64_t t0 = now_ms();
    assert_int_equal(convd_wait(f.c, id, 80, &d), CONVD_ETIMEDOUT);
    assert_true(now_ms() - t0 >= 80);
    assert_int_equal(convd_wait(f.c, id, 0, &d), CONVD_ETIMEDOUT);
    assert_int_equal(convd_wait_any(f.c, 10, &d), CONVD_ETIMEDOUT);
    assert_int_equal(d.id, 0x5a5a5a5a5a5a5a5aull); /* untouched */
    assert_int_equal(convd_inflight(f.c), 1);
    peer_completion(f.peer, id, 0, "");
    assert_int_equal(convd_wait(f.c, id, 0, &d), 0);
    assert_int_equal(d.id, id);
    fake_close(&f);
}

static void *close_later(void *arg)
{
    int *fd = arg;
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    close(*fd);
    *fd = -1;
    return NULL;
}

static void test_daemon_closes(void **state)
{
    (void)state;
    struct fake f;
    fake_connect(&f);
    convd_region *r = fake_region(&f, 4096, NULL);
    struct convd_conv_args a;
    small_args(&a, r);
    uint64_t done_id = submit_seen(&f, &a);
    uint64_t lost_id = submit_seen(&f, &a);
    peer_completion(f.peer, done_id, 0, "");

    /* The daemon goes away while the client blocks in wait. */
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, close_later, &f.peer), 0);
    struct convd_completion d;
    assert_int_equal(convd_wait(f.c, lost_id, -1, &d), CONVD_ECLOSED);
    pthread_join(th, NULL);
    assert_non_null(strstr(convd_errstr(f.c), "closed"));
    /* What arrived before is still there. */
    assert_int_equal(convd_wait(f.c, done_id, -1, &d), 0);
    assert_int_equal(d.id, done_id);
    assert_int_equal(convd_wait(f.c, lost_id, -1, &d), CONVD_ECLOSED);
    assert_int_equal(convd_wait_any(f.c, -1, &d), CONVD_ECLOSED);
    /* Everything else says so too, without SIGPIPE. */
    uint64_t id;
    assert_int_equal(convd_conv_submit(f.c, &a, &id), CONVD_ECLOSED);
    assert_int_equal(convd_ping(f.c, NULL), CONVD_ECLOSED);
    struct convd_status st;
    assert_int_equal(convd_status_get(f.c, &st), CONVD_ECLOSED);
    convd_region *r2;
    assert_int_equal(convd_region_create(f.c, 4096, &r2), CONVD_ECLOSED);
    assert_int_equal(convd_client_process(f.c), CONVD_ECLOSED);
    assert_int_equal(convd_region_free(r), CONVD_ECLOSED);
    fake_close(&f);
}

/* A send to a daemon that is gone before the client noticed: EPIPE, not SIGPIPE. */
static void test_send_after_close(void **state)
{
    (void)state;
    struct fake f;
    fake_connect(&f);
    convd_region *r = fake_region(&f, 4096, NULL);
    struct convd_conv_args a;
    small_args(&a, r);
    close(f.peer);
    f.peer = -1;
    uint64_t id;
    assert_int_equal(convd_conv_submit(f.c, &a, &id), CONVD_ECLOSED);
    assert_int_equal(convd_inflight(f.c), 0);
    assert_int_equal(convd_ping(f.c, NULL), CONVD_ECLOSED);
    fake_close(&f);
}

static void test_protocol_trouble(void **state)
{
    (void)state;
    struct fake f;
    fake_connect(&f);
    convd_region *r = fake_region(&f, 4096, NULL);
    struct convd_conv_args a;
    small_args(&a, r);
    uint64_t id = submit_seen(&f, &a);
    struct convd_completion d;

    /* A ProtocolError fails the waiting call with its code and sentence, once. */
    peer_protocol_error(f.peer, CONVD_EPROTO, "cannot decode ConvRequest");
    assert_int_equal(convd_wait(f.c, id, 1000, &d), CONVD_EPROTO);
    assert_non_null(strstr(convd_errstr(f.c), "cannot decode ConvRequest"));
    assert_int_equal(convd_wait(f.c, id, 0, &d), CONVD_ETIMEDOUT);

    /* Each kind of unexpected input: reported, dropped, and the connection goes on. */
    int p[2];
    assert_int_equal(pipe(p), 0);
    static uint8_t big[70000];
    memset(big, 0, sizeof(big));
    for (int k = 0; k < 6; k++) {
        const char *says = NULL;
        switch (k) {
        case 0:
            peer_completion(f.peer, 999, 0, "");
            says = "not in flight";
            break;
        case 1:
            assert_int_equal(sock_send(f.peer, "\x08\xff\xff", 3, -1), 0);
            says = "does not decode";
            break;
        case 2:
            peer_completion_fd(f.peer, 998, 0, "", p[0]);
            says = "descriptors";
            break;
        case 3:
            assert_int_equal(sock_send(f.peer, big, sizeof(big), -1), 0);
            says = "larger than";
            break;
        case 4: {
            struct hello_opts o = HELLO_DEFAULTS;
            peer_hello_reply(f.peer, &o);
            says = "unexpected HelloReply";
            break;
        }
        case 5:
            peer_pong(f.peer, 1000);
            says = "unexpected Pong";
            break;
        }
        int rc = convd_wait(f.c, id, 1000, &d);
        if (rc != CONVD_EPROTO || strstr(convd_errstr(f.c), says) == NULL)
            fail_msg("case %d: rc %d '%s', expected '%s'", k, rc, convd_errstr(f.c), says);
    }
    close(p[0]);
    close(p[1]);
    /* The request itself still completes. */
    peer_completion(f.peer, id, 0, "");
    assert_int_equal(convd_wait(f.c, id, 1000, &d), 0);
    /* A duplicate completion is trouble too. */
    peer_completion(f.peer, id, 0, "");
    assert_int_equal(convd_client_process(f.c), CONVD_EPROTO);
    assert_non_null(strstr(convd_errstr(f.c), "not in flight"));
    /* A fatal ProtocolError followed by the close: the sentence says both. */
    peer_protocol_error(f.peer, CONVD_EPROTO, "too many protocol errors");
    close(f.peer);
    f.peer = -1;
    assert_int_equal(convd_ping(f.c, NULL), CONVD_ECLOSED);
    assert_non_null(strstr(convd_errstr(f.c), "too many protocol errors"));
    fake_close(&f);
}

static void test_event_loop(void **state)
{
    (void)state;
    struct fake f;
    fake_connect(&f);
    convd_region *r = fake_region(&f, 4096, NULL);
    struct convd_conv_args a;
    small_args(&a, r);
    uint64_t id1 = submit_seen(&f, &a), id2 = submit_seen(&f, &a);
    struct convd_completion d;
    assert_int_equal(convd_client_process(f.c), 0);
    assert_int_equal(convd_poll(f.c, &d), CONVD_EAGAIN);

    peer_completion(f.peer, id2, 0, "");
    peer_completion(f.peer, id1, CONVD_ECANCELED, "");
    struct pollfd pfd = {.fd = convd_client_fd(f.c), .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 1000), 1);
    assert_int_equal(convd_client_process(f.c), 0);
    assert_int_equal(convd_poll(f.c, &d), 0);
    assert_int_equal(d.id, id2);
    assert_int_equal(convd_poll(f.c, &d), 0);
    assert_int_equal(d.id, id1);
    assert_int_equal(d.status, CONVD_ECANCELED);
    /* A failure without a sentence gets the status's. */
    assert_string_equal(d.error, convd_strerror(CONVD_ECANCELED));
    assert_int_equal(convd_poll(f.c, &d), CONVD_EAGAIN);
    assert_int_equal(convd_inflight(f.c), 0);
    assert_int_equal(convd_poll(f.c, NULL), CONVD_EINVAL);
    assert_int_equal(convd_poll(NULL, &d), CONVD_EINVAL);

    close(f.peer);
    f.peer = -1;
    assert_int_equal(convd_client_process(f.c), CONVD_ECLOSED);
    fake_close(&f);
}

static void test_queries(void **state)
{
    (void)state;
    struct fake f;
    struct hello_opts o = HELLO_DEFAULTS;
    fake_connect_opts(&f, &o, 100); /* the connect timeout also bounds queries */

    /* No answer: ETIMEDOUT. */
    uint64_t rtt = 0;
    uint64_t t0 = now_ms();
    assert_int_equal(convd_ping(f.c, &rtt), CONVD_ETIMEDOUT);
    assert_true(now_ms() - t0 >= 100);
    Convd__ClientMessage *m = peer_recv(f.peer, NULL);
    assert_int_equal(m->msg_case, CONVD__CLIENT_MESSAGE__MSG_PING);
    uint64_t tag1 = m->ping->tag;
    convd__client_message__free_unpacked(m, NULL);

    /* The late answer is dropped; the next ping gets its own. */
    peer_pong(f.peer, tag1);
    peer_pong(f.peer, tag1 + 1);
    assert_int_equal(convd_ping(f.c, &rtt), 0);
    assert_true(rtt > 0);
    m = peer_recv(f.peer, NULL);
    assert_int_equal(m->ping->tag, tag1 + 1);
    convd__client_message__free_unpacked(m, NULL);
    assert_int_equal(convd_client_process(f.c), 0);

    /* Status: every field. */
    Convd__StatusReply s = CONVD__STATUS_REPLY__INIT;
    s.tag = tag1 + 2;
    s.server_version = "9.8.7";
    s.backend = "cpu";
    s.device = "fake device";
    s.clients = 3;
    s.queue_depth = 4;
    s.inflight = 5;
    s.requests_served = 6;
    s.requests_failed = 7;
    s.batches = 8;
    s.uptime_ms = 9;
    s.protocol_version = 2;
    Convd__ServerMessage sm = CONVD__SERVER_MESSAGE__INIT;
    sm.msg_case = CONVD__SERVER_MESSAGE__MSG_STATUS_REPLY;
    sm.status_reply = &s;
    peer_send(f.peer, &sm);
    struct convd_status st;
    assert_int_equal(convd_status_get(f.c, &st), 0);
    assert_string_equal(st.server_version, "9.8.7");
    assert_string_equal(st.backend, "cpu");
    assert_string_equal(st.device, "fake device");
    assert_int_equal(st.protocol_version, 2);
    assert_int_equal(st.clients, 3);
    assert_int_equal(st.queue_depth, 4);
    assert_int_equal(st.inflight, 5);
    assert_int_equal(st.requests_served, 6);
    assert_int_equal(st.requests_failed, 7);
    assert_int_equal(st.batches, 8);
    assert_int_equal(st.uptime_ms, 9);
    m = peer_recv(f.peer, NULL);
    assert_int_equal(m->msg_case, CONVD__CLIENT_MESSAGE__MSG_STATUS);
    assert_int_equal(m->status->tag, tag1 + 2);
    convd__client_message__free_unpacked(m, NULL);

    /* Metrics: the text as sent. */
    Convd__MetricsReply mr = CONVD__METRICS_REPLY__INIT;
    mr.tag = tag1 + 3;
    mr.text = "# HELP convd_x x\n# TYPE convd_x counter\nconvd_x 1\n";
    sm.msg_case = CONVD__SERVER_MESSAGE__MSG_METRICS_REPLY;
    sm.metrics_reply = &mr;
    peer_send(f.peer, &sm);
    char *text = NULL;
    assert_int_equal(convd_metrics_get(f.c, &text), 0);
    assert_string_equal(text, mr.text);
    free(text);
    m = peer_recv(f.peer, NULL);
    assert_int_equal(m->msg_case, CONVD__CLIENT_MESSAGE__MSG_METRICS);
    convd__client_message__free_unpacked(m, NULL);
    assert_int_equal(convd_metrics_get(f.c, NULL), CONVD_EINVAL);
    assert_int_equal(convd_status_get(f.c, NULL), CONVD_EINVAL);
    fake_close(&f);
}

/* A daemon that does not read: submit waits for room up to the timeout, and reads what the
 * daemon sends meanwhile. */
static void test_send_queue_full(void **state)
{
    (void)state;
    struct fake f;
    struct hello_opts o = HELLO_DEFAULTS;
    o.max_inflight = 100000;
    fake_connect_opts(&f, &o, 200);
    convd_region *r = fake_region(&f, 4096, NULL);
    struct convd_conv_args a;
    small_args(&a, r);
    uint64_t id;
    int rc = 0, sent = 0;
    while (sent < 100000 && (rc = convd_conv_submit(f.c, &a, &id)) == 0)
        sent++;
    assert_int_equal(rc, CONVD_ETIMEDOUT);
    assert_true(sent > 0);
    assert_int_equal(convd_inflight(f.c), (size_t)sent);
    /* The daemon catches up; sending works again. */
    for (int i = 0; i < sent; i++)
        convd__client_message__free_unpacked(peer_recv(f.peer, NULL), NULL);
    assert_int_equal(convd_conv_submit(f.c, &a, &id), 0);
    assert_int_equal(id, (uint64_t)sent + 2); /* the id of the timed-out submit is not reused */
    fake_close(&f);
}

/*
 * convd_conv() against a fake daemon that computes.
 */

struct fake_daemon {
    int fd;
    int registered, unregistered, convs;
    struct {
        uint64_t id;
        uint8_t *map;
        size_t size;
    } regions[16];
};

static uint8_t *fd_region(struct fake_daemon *d, uint64_t id)
{
    for (int i = 0; i < 16; i++)
        if (d->regions[i].map != NULL && d->regions[i].id == id)
            return d->regions[i].map;
    return NULL;
}

static void fd_conv(struct fake_daemon *d, const Convd__ConvRequest *q)
{
    struct convd_problem p;
    char why[256];
    int status = wire_problem_from_pb(q->problem, &p, why, sizeof(why));
    if (status == 0 && p.k == 7) {
        status = CONVD_EUNSUPPORTED;
        snprintf(why, sizeof(why), "the fake daemon does not run k=7");
    }
    if (status == 0) {
        struct convd_problem_sizes z;
        convd_problem_sizes(&p, &z, NULL, 0);
        uint8_t *in = fd_region(d, q->input->region_id) + q->input->offset;
        uint8_t *w = fd_region(d, q->weight->region_id) + q->weight->offset;
        uint8_t *b = q->bias != NULL ? fd_region(d, q->bias->region_id) + q->bias->offset : NULL;
        uint8_t *out = fd_region(d, q->output->region_id) + q->output->offset;
        float *ref = malloc(z.output_elems * sizeof(float));
        tu_ref_conv(&p, in, w, b, ref);
        for (uint64_t i = 0; i < z.output_elems; i++) {
            if (p.dtype == CONVD_DTYPE_FP32)
                ((float *)out)[i] = ref[i];
            else if (p.dtype == CONVD_DTYPE_FP16)
                ((uint16_t *)out)[i] = convd_f32_to_f16(ref[i]);
            else
                ((uint16_t *)out)[i] = convd_f32_to_bf16(ref[i]);
        }
        free(ref);
        d->convs++;
    }
    peer_completion(d->fd, q->id, status, status != 0 ? why : "");
}

static void *fake_daemon_main(void *arg)
{
    struct fake_daemon *d = arg;
    static uint8_t buf[CONVD_MAX_MESSAGE_BYTES];
    for (;;) {
        int fds[SOCK_MAX_FDS];
        size_t nfds;
        ssize_t n = sock_recv(d->fd, buf, sizeof(buf), fds, &nfds);
        if (n <= 0)
            break;
        Convd__ClientMessage *m = convd__client_message__unpack(NULL, (size_t)n, buf);
        if (m == NULL)
            break;
        if (m->msg_case == CONVD__CLIENT_MESSAGE__MSG_REGISTER_REGION) {
            const Convd__RegisterRegion *rr = m->register_region;
            for (int i = 0; i < 16; i++) {
                if (d->regions[i].map == NULL) {
                    d->regions[i].id = rr->region_id;
                    d->regions[i].size = rr->size;
                    d->regions[i].map =
                        mmap(NULL, rr->size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
                    break;
                }
            }
            close(fds[0]);
            d->registered++;
            peer_region_reply(d->fd, rr->region_id, 0, "");
        } else if (m->msg_case == CONVD__CLIENT_MESSAGE__MSG_UNREGISTER_REGION) {
            for (int i = 0; i < 16; i++) {
                if (d->regions[i].map != NULL &&
                    d->regions[i].id == m->unregister_region->region_id) {
                    munmap(d->regions[i].map, d->regions[i].size);
                    d->regions[i].map = NULL;
                }
            }
            d->unregistered++;
            peer_region_reply(d->fd, m->unregister_region->region_id, 0, "");
        } else if (m->msg_case == CONVD__CLIENT_MESSAGE__MSG_CONV) {
            fd_conv(d, m->conv);
        }
        convd__client_message__free_unpacked(m, NULL);
    }
    for (int i = 0; i < 16; i++)
        if (d->regions[i].map != NULL)
            munmap(d->regions[i].map, d->regions[i].size);
    close(d->fd);
    return NULL;
}

static int run_conv(convd_client *c, struct tu_rng *g, const struct convd_problem *p)
{
    struct convd_problem_sizes z;
    assert_int_equal(convd_problem_sizes(p, &z, NULL, 0), 0);
    void *in = malloc(z.input_bytes), *w = malloc(z.weight_bytes);
    void *b = p->has_bias ? malloc(z.bias_bytes) : NULL, *out = malloc(z.output_bytes);
    float *ref = malloc(z.output_elems * sizeof(float));
    tu_fill_random(g, p->dtype, in, z.input_elems);
    tu_fill_random(g, p->dtype, w, z.weight_elems);
    if (b != NULL)
        tu_fill_random(g, p->dtype, b, z.bias_elems);
    tu_poison(out, z.output_bytes);
    int rc = convd_conv(c, p, in, w, b, out);
    if (rc == 0) {
        tu_ref_conv(p, in, w, b, ref);
        double err = tu_rel_error(p->dtype, out, ref, z.output_elems, NULL);
        char desc[160];
        if (!(err <= tu_tolerance(p->dtype)))
            fail_msg("%s: relative error %g", convd_problem_str(p, desc, sizeof(desc)), err);
    }
    free(in);
    free(w);
    free(b);
    free(out);
    free(ref);
    return rc;
}

static void test_blocking_conv(void **state)
{
    (void)state;
    int fds_before = count_fds();
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    struct hello_opts o = HELLO_DEFAULTS;
    peer_hello_reply(sv[1], &o);
    convd_client *c;
    assert_int_equal(cl_connect_fd(sv[0], "unit", 2000, false, -1, &c), 0);
    convd__client_message__free_unpacked(peer_recv(sv[1], NULL), NULL);
    struct fake_daemon d;
    memset(&d, 0, sizeof(d));
    d.fd = sv[1];
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fake_daemon_main, &d), 0);

    struct tu_rng g;
    tu_rng_init(&g, tu_seed());
    for (int i = 0; i < 8; i++) {
        struct convd_problem p;
        do /* k == 7 is the fake daemon's marker for a refused request, tested below */
            tu_random_problem(&g, &p, 0, 0, 8);
        while (p.k == 7);
        p.has_bias = i % 2 == 0;
        tu_random_activation(&g, &p);
        assert_int_equal(run_conv(c, &g, &p), 0);
    }
    /* Larger than the staging region so far: it is replaced by a bigger one. */
    struct convd_problem big;
    convd_problem_init(&big, 1, 128, 128, 24, 8, 1, 1, 1);
    assert_int_equal(run_conv(c, &g, &big), 0);
    /* A request the daemon refuses: its code and sentence. */
    struct convd_problem bad;
    convd_problem_init(&bad, 1, 4, 4, 4, 7, 1, 1, 1);
    assert_int_equal(run_conv(c, &g, &bad), CONVD_EUNSUPPORTED);
    assert_non_null(strstr(convd_errstr(c), "k=7"));
    assert_int_equal(convd_conv(c, &big, NULL, NULL, NULL, NULL), CONVD_EINVAL);
    big.has_bias = true;
    uint8_t one[4];
    assert_int_equal(convd_conv(c, &big, one, one, NULL, one), CONVD_EINVAL);
    assert_non_null(strstr(convd_errstr(c), "bias"));
    assert_int_equal(convd_inflight(c), 0);

    convd_close(c);
    pthread_join(th, NULL);
    assert_int_equal(d.convs, 9);
    assert_int_equal(d.registered, 2);
    assert_int_equal(d.unregistered, 1);
    assert_int_equal(count_fds(), fds_before);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handshake),
        cmocka_unit_test(test_handshake_names),
        cmocka_unit_test(test_handshake_failures),
        cmocka_unit_test(test_connect_paths),
        cmocka_unit_test(test_socket_path_for_device),
        cmocka_unit_test(test_connect_device),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_region_memfd),
        cmocka_unit_test(test_region_refused),
        cmocka_unit_test(test_region_gpu),
        cmocka_unit_test(test_submit_validation),
        cmocka_unit_test(test_old_daemon_activations),
        cmocka_unit_test(test_args_struct_size),
        cmocka_unit_test(test_out_of_order),
        cmocka_unit_test(test_wait_timeout),
        cmocka_unit_test(test_daemon_closes),
        cmocka_unit_test(test_send_after_close),
        cmocka_unit_test(test_protocol_trouble),
        cmocka_unit_test(test_event_loop),
        cmocka_unit_test(test_queries),
        cmocka_unit_test(test_send_queue_full),
        cmocka_unit_test(test_blocking_conv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
