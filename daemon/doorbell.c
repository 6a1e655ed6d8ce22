#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "clock.h"
#include "convd.pb-c.h"
#include "convd/status.h"
#include "doorbell.h"
#include "log.h"
#include "ring_layout.h"
#include "sock.h"
#include "wire.h"

/* Non-blocking socket: a full one already has its reader's attention, and a peer that left is
 * the loop's to notice. Any other failure (ENOBUFS, ENOMEM) would leave the client asleep with
 * its completions in the ring, so after one retry the connection is shut down: the client wakes
 * to a closed socket (CONVD_ECLOSED) and the loop sees the hang-up and cleans up. */
static void db_send(const struct doorbells *db, int fd)
{
    int rc = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        rc = sock_send(fd, db->msg, db->msg_len, -1);
        if (rc == 0 || rc == -EAGAIN || rc == -EPIPE || rc == -ECONNRESET)
            return;
    }
    log_warn("doorbell to socket %d failed: %s; closing that connection", fd, strerror(-rc));
    shutdown(fd, SHUT_RDWR);
}

static void *db_thread(void *arg)
{
    struct doorbells *db = arg;
    (void)pthread_setname_np(pthread_self(), "convd-bell");
    pthread_mutex_lock(&db->mu);
    unsigned me = 0;
    while (me < db->nthreads && !pthread_equal(db->threads[me], pthread_self()))
        me++;
    db->awake++;
    for (;;) {
        if (db->n == 0 && !db->stop && db->spin_ns > 0) {
            pthread_mutex_unlock(&db->mu);
            const uint64_t until = convd_now_ns() + db->spin_ns;
            while (__atomic_load_n(&db->n, __ATOMIC_RELAXED) == 0 &&
                   !__atomic_load_n(&db->stop, __ATOMIC_RELAXED) && convd_now_ns() < until)
                convd_cpu_relax();
            pthread_mutex_lock(&db->mu);
        }
        while (db->n == 0 && !db->stop) {
            db->awake--;
            pthread_cond_wait(&db->work, &db->mu);
            db->awake++;
        }
        if (db->stop)
            break;
        int fd = db->queue[0];
        memmove(db->queue, db->queue + 1, (db->n - 1) * sizeof(db->queue[0]));
        __atomic_store_n(&db->n, db->n - 1, __ATOMIC_RELAXED);
        db->busy[me] = fd;
        pthread_mutex_unlock(&db->mu);
        db_send(db, fd);
        pthread_mutex_lock(&db->mu);
        db->busy[me] = -1;
        db->rung++;
        pthread_cond_broadcast(&db->idle);
    }
    pthread_mutex_unlock(&db->mu);
    return NULL;
}

int doorbell_start(struct doorbells *db, unsigned nthreads, uint64_t spin_ns)
{
    memset(db, 0, sizeof(*db));
    db->spin_ns = spin_ns;
    Convd__ServerMessage m = CONVD__SERVER_MESSAGE__INIT;
    Convd__Doorbell bell = CONVD__DOORBELL__INIT;
    m.msg_case = CONVD__SERVER_MESSAGE__MSG_DOORBELL;
    m.doorbell = &bell;
    int len = wire_pack_server(&m, db->msg, sizeof(db->msg));
    db->msg_len = len > 0 ? (size_t)len : 0;
    pthread_mutex_init(&db->mu, NULL);
    pthread_cond_init(&db->work, NULL);
    pthread_cond_init(&db->idle, NULL);
    for (unsigned i = 0; i < DOORBELL_MAX_THREADS; i++)
        db->busy[i] = -1;
    if (nthreads > DOORBELL_MAX_THREADS)
        nthreads = DOORBELL_MAX_THREADS;
    /* Ringers take no signals: SIGTERM and friends belong to the loop. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    /* Under the lock, so that a ringer finds its own index only once threads[] is complete. */
    pthread_mutex_lock(&db->mu);
    for (unsigned i = 0; i < nthreads; i++) {
        if (pthread_create(&db->threads[i], NULL, db_thread, db) != 0)
            break;
        db->nthreads++;
    }
    pthread_mutex_unlock(&db->mu);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return db->nthreads == nthreads ? 0 : CONVD_EINTERNAL;
}

/* Queues fd under mu; false when there was no room (the caller then rings it itself). */
static bool db_queue(struct doorbells *db, int fd)
{
    for (size_t i = 0; i < db->n; i++)
        if (db->queue[i] == fd)
            return true;
    if (db->n == db->cap) {
        size_t cap = db->cap ? db->cap * 2 : 64;
        int *q = realloc(db->queue, cap * sizeof(*q));
        if (q == NULL)
            return false;
        db->queue = q;
        db->cap = cap;
    }
    db->queue[db->n] = fd;
    __atomic_store_n(&db->n, db->n + 1, __ATOMIC_RELAXED);
    return true;
}

void doorbell_ring(struct doorbells *db, const int *fds, size_t n)
{
    if (db->msg_len == 0 || n == 0)
        return;
    if (db->nthreads == 0) {
        for (size_t i = 0; i < n; i++)
            db_send(db, fds[i]);
        pthread_mutex_lock(&db->mu);
        db->rung += n;
        pthread_mutex_unlock(&db->mu);
        return;
    }
    size_t queued = 0;
    pthread_mutex_lock(&db->mu);
    while (queued < n && db_queue(db, fds[queued]))
        queued++;
    /* A ringer that is awake takes the queue's head once its send is done, without a wake-up
     * (a system call for the loop while one sleeps); wake sleepers only for what the awake ones
     * leave, with one call for the lot. */
    if (db->n > db->awake) {
        if (db->n - db->awake > 1)
            pthread_cond_broadcast(&db->work);
        else
            pthread_cond_signal(&db->work);
        db->wakes++;
    }
    pthread_mutex_unlock(&db->mu);
    /* No room to queue the rest: ring them here rather than lose them. */
    for (size_t i = queued; i < n; i++)
        db_send(db, fds[i]);
}

void doorbell_forget(struct doorbells *db, int fd)
{
    if (db->nthreads == 0)
        return;
    pthread_mutex_lock(&db->mu);
    for (size_t i = 0; i < db->n; i++)
        if (db->queue[i] == fd) {
            memmove(db->queue + i, db->queue + i + 1, (db->n - i - 1) * sizeof(db->queue[0]));
            __atomic_store_n(&db->n, db->n - 1, __ATOMIC_RELAXED);
            break;
        }
    for (;;) {
        bool busy = false;
        for (unsigned i = 0; i < db->nthreads; i++)
            busy = busy || db->busy[i] == fd;
        if (!busy)
            break;
        pthread_cond_wait(&db->idle, &db->mu);
    }
    pthread_mutex_unlock(&db->mu);
}

uint64_t doorbell_count(struct doorbells *db, uint64_t *wakes)
{
    pthread_mutex_lock(&db->mu);
    uint64_t n = db->rung;
    if (wakes != NULL)
        *wakes = db->wakes;
    pthread_mutex_unlock(&db->mu);
    return n;
}

void doorbell_stop(struct doorbells *db)
{
    if (db->msg_len == 0 && db->nthreads == 0 && db->queue == NULL)
        return;
    pthread_mutex_lock(&db->mu);
    __atomic_store_n(&db->stop, true, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&db->work);
    pthread_mutex_unlock(&db->mu);
    for (unsigned i = 0; i < db->nthreads; i++)
        pthread_join(db->threads[i], NULL);
    db->nthreads = 0;
    free(db->queue);
    db->queue = NULL;
    db->n = db->cap = 0;
    pthread_cond_destroy(&db->idle);
    pthread_cond_destroy(&db->work);
    pthread_mutex_destroy(&db->mu);
    db->msg_len = 0;
}
