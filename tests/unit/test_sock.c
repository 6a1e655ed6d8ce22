/* SOCK_SEQPACKET helpers: datagram boundaries, descriptor passing, truncation, peer close. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "sock.h"

static void pair(int sv[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
}

static void test_boundaries_and_fd(void **state)
{
    (void)state;
    int sv[2], fds[SOCK_MAX_FDS], p[2];
    size_t nfds;
    char buf[64];
    pair(sv);
    assert_int_equal(pipe(p), 0);

    assert_int_equal(sock_send(sv[0], "hello", 5, -1), 0);
    assert_int_equal(sock_send(sv[0], "world!", 6, p[1]), 0);

    assert_int_equal(sock_recv(sv[1], buf, sizeof(buf), fds, &nfds), 5);
    assert_int_equal(nfds, 0);
    assert_memory_equal(buf, "hello", 5);

    assert_int_equal(sock_recv(sv[1], buf, sizeof(buf), fds, &nfds), 6);
    assert_int_equal(nfds, 1);
    assert_true(fcntl(fds[0], F_GETFD) & FD_CLOEXEC);
    /* the received descriptor is the pipe's write end */
    assert_int_equal(write(fds[0], "x", 1), 1);
    char c;
    assert_int_equal(read(p[0], &c, 1), 1);
    assert_int_equal(c, 'x');

    sock_close_fds(fds, nfds);
    close(p[0]);
    close(p[1]);
    close(sv[0]);
    close(sv[1]);
}

static int count_open_fds(void)
{
    int n = 0;
    for (int fd = 0; fd < 1024; fd++)
        if (fcntl(fd, F_GETFD) >= 0)
            n++;
    return n;
}

static void test_truncation_closes_fds(void **state)
{
    (void)state;
    int sv[2], fds[SOCK_MAX_FDS], p[2];
    size_t nfds = 99;
    char big[256], small[16];
    pair(sv);
    assert_int_equal(pipe(p), 0);
    memset(big, 'a', sizeof(big));
    int before = count_open_fds();
    assert_int_equal(sock_send(sv[0], big, sizeof(big), p[0]), 0);
    assert_int_equal(sock_recv(sv[1], small, sizeof(small), fds, &nfds), -EMSGSIZE);
    assert_int_equal(nfds, 0);
    assert_int_equal(count_open_fds(), before);
    /* the next datagram is intact */
    assert_int_equal(sock_send(sv[0], "ok", 2, -1), 0);
    assert_int_equal(sock_recv(sv[1], small, sizeof(small), fds, &nfds), 2);
    close(p[0]);
    close(p[1]);
    close(sv[0]);
    close(sv[1]);
}

static void test_many_fds(void **state)
{
    (void)state;
    int sv[2], fds[SOCK_MAX_FDS], p[2];
    size_t nfds;
    char buf[8];
    pair(sv);
    assert_int_equal(pipe(p), 0);
    int three[3] = {p[0], p[1], p[0]};
    union {
        struct cmsghdr align;
        char b[CMSG_SPACE(sizeof(three))];
    } ctl;
    struct iovec iov = {.iov_base = "m", .iov_len = 1};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(three));
    memcpy(CMSG_DATA(cm), three, sizeof(three));
    assert_int_equal(sendmsg(sv[0], &msg, 0), 1);
    assert_int_equal(sock_recv(sv[1], buf, sizeof(buf), fds, &nfds), 1);
    assert_int_equal(nfds, 3);
    sock_close_fds(fds, nfds);
    close(p[0]);
    close(p[1]);
    close(sv[0]);
    close(sv[1]);
}

static void test_peer_close_and_connect_errors(void **state)
{
    (void)state;
    int sv[2], fds[SOCK_MAX_FDS];
    size_t nfds;
    char buf[8];
    pair(sv);
    close(sv[0]);
    assert_int_equal(sock_recv(sv[1], buf, sizeof(buf), fds, &nfds), 0);
    /* sending to a closed peer reports EPIPE instead of raising SIGPIPE */
    assert_int_equal(sock_send(sv[1], "x", 1, -1), -EPIPE);
    close(sv[1]);

    assert_int_equal(sock_connect("/nonexistent/convd-test.sock"), -ENOENT);
    char longpath[200];
    memset(longpath, 'a', sizeof(longpath) - 1);
    longpath[sizeof(longpath) - 1] = '\0';
    assert_int_equal(sock_connect(longpath), -ENAMETOOLONG);
    assert_int_equal(sock_connect(""), -ENAMETOOLONG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_boundaries_and_fd),
        cmocka_unit_test(test_truncation_closes_fds),
        cmocka_unit_test(test_many_fds),
        cmocka_unit_test(test_peer_close_and_connect_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
