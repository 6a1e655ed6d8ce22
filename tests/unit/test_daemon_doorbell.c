/* The daemon's doorbell ringers (daemon/doorbell.c) on real socket pairs: every queued socket
 * gets exactly one Doorbell datagram, from ringer threads or inline; a socket queued again before
 * its ringer took it is rung once; doorbell_forget leaves nothing queued for a socket; and the
 * loop wakes a sleeping ringer only when no awake one can take the doorbell (with ringers that
 * poll for a second, a hundred doorbells in a row cost at most the first wake-up). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "doorbell.h"

#define NPAIRS 8

struct pairs {
    int daemon[NPAIRS]; /* the side the ringers send on */
    int client[NPAIRS];
};

static void pairs_open(struct pairs *p)
{
    for (int i = 0; i < NPAIRS; i++) {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0, sv), 0);
        p->daemon[i] = sv[0];
        p->client[i] = sv[1];
    }
}

static void pairs_close(struct pairs *p)
{
    for (int i = 0; i < NPAIRS; i++) {
        close(p->daemon[i]);
        close(p->client[i]);
    }
}

/* Datagrams waiting on fd within ms milliseconds, each the packed Doorbell's length. */
static int received(const struct doorbells *db, int fd, int ms)
{
    int n = 0;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    while (poll(&pfd, 1, n == 0 ? ms : 0) == 1) {
        unsigned char buf[64];
        ssize_t len = recv(fd, buf, sizeof(buf), 0);
        if (len < 0 && errno == EAGAIN)
            break;
        assert_int_equal(len, (ssize_t)db->msg_len);
        n++;
    }
    return n;
}

/* Waits until the ringers have sent want doorbells in all (at most 5 s). */
static void wait_rung(struct doorbells *db, uint64_t want)
{
    for (int i = 0; i < 5000 && doorbell_count(db, NULL) < want; i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(doorbell_count(db, NULL), want);
}

/* Rings every socket `copies` times in one call (under one lock, so no ringer takes one in
 * between) and checks that each got exactly one doorbell. */
static void ring_all_once(unsigned nthreads, int copies)
{
    struct doorbells db;
    struct pairs p;
    pairs_open(&p);
    assert_int_equal(doorbell_start(&db, nthreads, 0), 0);
    assert_true(db.msg_len > 0);
    int fds[2 * NPAIRS];
    for (int c = 0; c < copies; c++)
        for (int i = 0; i < NPAIRS; i++)
            fds[c * NPAIRS + i] = p.daemon[i];
    doorbell_ring(&db, fds, (size_t)copies * NPAIRS);
    wait_rung(&db, NPAIRS);
    for (int i = 0; i < NPAIRS; i++)
        assert_int_equal(received(&db, p.client[i], 2000), 1);
    doorbell_stop(&db);
    pairs_close(&p);
}

static void test_inline(void **state)
{
    (void)state;
    ring_all_once(0, 1);
}

static void test_threads(void **state)
{
    (void)state;
    ring_all_once(1, 1);
    ring_all_once(3, 1);
}

/* A socket queued twice before a ringer took it: one doorbell. */
static void test_no_duplicates(void **state)
{
    (void)state;
    ring_all_once(1, 2);
    ring_all_once(3, 2);
}

/* After doorbell_forget(fd) no ringer sends to fd: whatever was queued for it is gone. */
static void test_forget(void **state)
{
    (void)state;
    struct doorbells db;
    struct pairs p;
    pairs_open(&p);
    assert_int_equal(doorbell_start(&db, 2, 0), 0);
    for (int round = 0; round < 200; round++) {
        doorbell_ring(&db, p.daemon, NPAIRS);
        doorbell_forget(&db, p.daemon[NPAIRS - 1]);
        const int got = received(&db, p.client[NPAIRS - 1], 0);
        assert_true(got <= 1);
        /* Nothing more may arrive for the forgotten socket. */
        assert_int_equal(received(&db, p.client[NPAIRS - 1], 5), 0);
        for (int i = 0; i < NPAIRS - 1; i++)
            doorbell_forget(&db, p.daemon[i]);
        for (int i = 0; i < NPAIRS - 1; i++)
            (void)received(&db, p.client[i], 0);
    }
    doorbell_stop(&db);
    pairs_close(&p);
}

/* Ringers that poll for a second stay awake between doorbells a millisecond apart: after the
 * first, the loop never wakes one (the system call this count stands for). Ringers that sleep
 * at once need a wake-up for most. */
static void test_wakes(void **state)
{
    (void)state;
    for (int spin = 0; spin < 2; spin++) {
        struct doorbells db;
        struct pairs p;
        pairs_open(&p);
        assert_int_equal(doorbell_start(&db, 2, spin ? 1000000000u : 0), 0);
        const int rounds = 100;
        for (int i = 0; i < rounds; i++) {
            doorbell_ring(&db, &p.daemon[i % NPAIRS], 1);
            assert_int_equal(received(&db, p.client[i % NPAIRS], 2000), 1);
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        wait_rung(&db, rounds); /* a ringer counts its send after the datagram left */
        uint64_t wakes = 0;
        assert_int_equal(doorbell_count(&db, &wakes), (uint64_t)rounds);
        if (spin)
            assert_true(wakes <= 1);
        else
            assert_true(wakes >= rounds / 2);
        doorbell_stop(&db);
        pairs_close(&p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inline),        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_no_duplicates), cmocka_unit_test(test_forget),
        cmocka_unit_test(test_wakes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
