/*
 * Doorbells to clients that sleep on their sockets, sent from threads of their own. A send on a
 * Unix socket costs the sender a few microseconds, most of it waking the receiver; with tens of
 * clients asleep that would be most of what the loop thread does (64 clients at depth 4 on the
 * H200: 5.4 us of daemon CPU per request, the loop saturated). The loop only queues the socket;
 * the ringers send.
 *
 * A queued descriptor may be closed only after doorbell_forget() returned for it: from then on
 * no ringer touches it, so a number reused by a later connection never gets a stray doorbell.
 */
#ifndef CONVD_DAEMON_DOORBELL_H
#define CONVD_DAEMON_DOORBELL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DOORBELL_MAX_THREADS 8

struct doorbells {
    pthread_mutex_t mu;
    pthread_cond_t work; /* descriptors queued, or stop */
    pthread_cond_t idle; /* a ringer finished a send */
    int *queue;          /* descriptors to ring, oldest first; each at most once */
    size_t n, cap;       /* n written under mu, atomically: spinning ringers read it without */
    int busy[DOORBELL_MAX_THREADS]; /* what each ringer is sending to, -1 */
    pthread_t threads[DOORBELL_MAX_THREADS];
    unsigned nthreads; /* 0: doorbell_ring sends on the caller's thread */
    uint64_t spin_ns;  /* a ringer polls the queue this long after its last send, then sleeps */
    bool stop;         /* written under mu, atomically: spinning ringers read it without */
    uint8_t msg[16];   /* the packed Doorbell */
    size_t msg_len;
    uint64_t rung;  /* doorbells sent (under mu) */
    unsigned awake; /* ringers not waiting on work (under mu): each takes the queue's head next */
    uint64_t wakes; /* times doorbell_ring woke a sleeping ringer (under mu) */
};

/* Packs the message and starts nthreads ringers (0: none; sends happen inline), each polling the
 * queue for spin_ns after its last send before it sleeps on the condition variable, so that a
 * doorbell queued meanwhile costs the loop no wake-up of a sleeping thread. Returns 0, or
 * CONVD_EINTERNAL when no thread could start (then it runs with none). */
int doorbell_start(struct doorbells *db, unsigned nthreads, uint64_t spin_ns);

/* Queues doorbells for the sockets fds[0..n) (loop thread), under one lock and with at most one
 * wake-up call, made only when more are queued than ringers are awake (sending or polling) to
 * take them; a descriptor already queued is not queued twice. */
void doorbell_ring(struct doorbells *db, const int *fds, size_t n);

/* Drops what is queued for fd and waits until no ringer is sending to it (loop thread, before
 * closing fd). */
void doorbell_forget(struct doorbells *db, int fd);

/* Doorbells sent so far, and the wake-ups of sleeping ringers they took. */
uint64_t doorbell_count(struct doorbells *db, uint64_t *wakes);

/* Stops and joins the ringers; what is still queued is dropped. Safe on a set never started. */
void doorbell_stop(struct doorbells *db);

#endif
