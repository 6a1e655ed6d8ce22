/*
 * The lanes' ready words that the daemon may have to store itself. A request launched into a
 * lane (connection.c, "lanes") runs on the device once its client's stream has written its
 * ready word; a word that never comes would hold the lane, and a driver call that waits for the
 * device (freeing memory does) would hold whichever thread made it. So a thread of its own, not
 * the loop, watches every such word: past the request's gate deadline it stores the value
 * itself, and keeps storing it while the request is in flight (a client that writes a lower
 * value again cannot hold the lane). The loop asks it to release words early when their client
 * goes or the drain times out, and learns at completion whether a word was released, and why.
 */
#ifndef CONVD_DAEMON_WAITS_H
#define CONVD_DAEMON_WAITS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "list.h"

/* One watched word, inside the request that waits on it. */
struct wait_entry {
    struct list_node link; /* in waits.list, under waits.mu */
    _Atomic uint32_t *word;
    uint32_t value;
    uint64_t deadline_ns;
    int force;     /* waits_release's code: store the value whenever the word is below it */
    int released;  /* 0, or why the daemon stored the value: CONVD_ETIMEDOUT or the loop's code */
    uint32_t held; /* what the word held when the watchdog stored the value */
};

struct waits {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct list_node list;
    bool stop;
    bool started;
    pthread_t thread;
};

/* Starts the watchdog thread (signals blocked in it). Returns 0 or CONVD_EINTERNAL. */
int waits_start(struct waits *w);

/* Stops and joins it. Entries still listed are left alone. Safe when never started. */
void waits_stop(struct waits *w);

/* Watches word until waits_remove: from deadline_ns on, whenever it is below value (cyclically,
 * as cuStreamWaitValue32's GEQ) the thread stores value. */
void waits_add(struct waits *w, struct wait_entry *e, _Atomic uint32_t *word, uint32_t value,
               uint64_t deadline_ns);

/* Stores the value now, if the word is below it, and whenever it is below until waits_remove;
 * `code` is what waits_remove then returns, unless the word needed no store (it came by itself)
 * or a store was made earlier for another reason (the first code stays). */
void waits_release(struct waits *w, struct wait_entry *e, int code);

/* Stops watching. Returns 0 when the daemon never had to store the word, else the code of the
 * first store (CONVD_ETIMEDOUT: the deadline passed). */
int waits_remove(struct waits *w, struct wait_entry *e);

/* True when v has reached value, cyclically. */
static inline bool waits_reached(uint32_t v, uint32_t value)
{
    return (int32_t)(v - value) >= 0;
}

#endif
