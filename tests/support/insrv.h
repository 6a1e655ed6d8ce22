/*
 * A convd_daemon run in the test's own process, on a thread, with a temporary socket: for the
 * daemon library's server test and the fault-injection tests. Asserts through cmocka.
 */
#ifndef CONVD_TEST_INSRV_H
#define CONVD_TEST_INSRV_H

#include <pthread.h>

#include "config.h"
#include "daemon.h"

struct tu_srv {
    struct convd_daemon *d;
    pthread_t thread;
    int rc; /* daemon_run's exit status, once the thread has ended */
    char dir[64];
    char sock[CONFIG_PATH_BYTES];
    struct convd_config cfg;
};

/* Zeroes s, makes a directory /tmp/<prefix>-XXXXXX for the socket and gives cfg the defaults
 * with that socket, the CPU backend and 2 threads; the caller adjusts cfg before starting. */
void tu_srv_config(struct tu_srv *s, const char *prefix);

/* The thread's body: s->rc = daemon_run(s->d). */
void *tu_srv_thread(void *arg);

/* daemon_create() (failing the test with its sentence) and the thread. */
void tu_srv_start(struct tu_srv *s);

/* Asks the daemon to stop, joins its thread and destroys it; s->rc holds its exit status. The
 * directory stays (the caller removes it). */
void tu_srv_join(struct tu_srv *s);

#endif
