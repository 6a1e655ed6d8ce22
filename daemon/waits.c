#include <errno.h>
#include <signal.h>
#include <time.h>

#include "clock.h"
#include "convd/status.h"
#include "log.h"
#include "waits.h"

/* How often the thread stores released words again, and looks at words past their deadline. */
#define WAITS_RESTORE_NS (1000 * 1000)

/* Stores e's value when its word is below it; marks the entry released with code the first
 * time. Under w->mu. */
static void waits_store(struct wait_entry *e, int code)
{
    uint32_t v = atomic_load_explicit(e->word, memory_order_acquire);
    if (waits_reached(v, e->value))
        return;
    if (e->released == 0) {
        e->released = code;
        e->held = v;
    }
    atomic_store_explicit(e->word, e->value, memory_order_release);
}

static void *waits_thread(void *arg)
{
    struct waits *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        const uint64_t now = convd_now_ns();
        uint64_t next = UINT64_MAX;
        struct list_node *pos;
        list_for_each(pos, &w->list)
        {
            struct wait_entry *e = list_entry(pos, struct wait_entry, link);
            if (e->force != 0 || now >= e->deadline_ns) {
                waits_store(e, e->force != 0 ? e->force : CONVD_ETIMEDOUT);
                if (next > now + WAITS_RESTORE_NS)
                    next = now + WAITS_RESTORE_NS;
            } else if (e->deadline_ns < next) {
                next = e->deadline_ns;
            }
        }
        if (next == UINT64_MAX) {
            pthread_cond_wait(&w->cv, &w->mu);
            continue;
        }
        struct timespec ts = {.tv_sec = (time_t)(next / 1000000000u),
                              .tv_nsec = (long)(next % 1000000000u)};
        (void)pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int waits_start(struct waits *w)
{
    list_init(&w->list);
    w->stop = false;
    w->started = false;
    pthread_mutex_init(&w->mu, NULL);
    /* Deadlines are convd_now_ns() times: CLOCK_MONOTONIC. */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&w->thread, NULL, waits_thread, w);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        log_err("cannot start the lanes' watchdog thread");
        return CONVD_EINTERNAL;
    }
    w->started = true;
    return 0;
}

void waits_stop(struct waits *w)
{
    if (!w->started)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    w->started = false;
}

void waits_add(struct waits *w, struct wait_entry *e, _Atomic uint32_t *word, uint32_t value,
               uint64_t deadline_ns)
{
    e->word = word;
    e->value = value;
    e->deadline_ns = deadline_ns;
    e->released = 0;
    e->force = 0;
    e->held = 0;
    pthread_mutex_lock(&w->mu);
    list_add_tail(&w->list, &e->link);
    /* A deadline earlier than the one the thread sleeps towards: let it look again. */
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void waits_release(struct waits *w, struct wait_entry *e, int code)
{
    pthread_mutex_lock(&w->mu);
    if (e->force == 0)
        e->force = code;
    waits_store(e, e->force);
    pthread_cond_signal(&w->cv); /* keep it stored from now on */
    pthread_mutex_unlock(&w->mu);
}

int waits_remove(struct waits *w, struct wait_entry *e)
{
    pthread_mutex_lock(&w->mu);
    list_del(&e->link);
    const int code = e->released;
    pthread_mutex_unlock(&w->mu);
    return code;
}
