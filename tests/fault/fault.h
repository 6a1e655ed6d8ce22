/*
 * Fault injection by -Wl,--wrap: the test executable links the daemon's static libraries with
 * every call below redirected to __wrap_NAME, which fails one chosen call and passes the others
 * to __real_NAME. Calls from shared libraries (libuv, protobuf-c, the client library) are not
 * redirected, so the injected faults land in convd's own code and nowhere else.
 *
 * Calls made on a thread that called fault_exempt_self() (the test's own thread, which also
 * drives the client library) are neither counted nor failed.
 */
#ifndef CONVD_TEST_FAULT_H
#define CONVD_TEST_FAULT_H

#include <stdbool.h>

#define FAULT_CALLS(X)                                                                             \
    X(MALLOC, "malloc", ENOMEM)                                                                    \
    X(CALLOC, "calloc", ENOMEM)                                                                    \
    X(REALLOC, "realloc", ENOMEM)                                                                  \
    X(ALIGNED_ALLOC, "aligned_alloc", ENOMEM)                                                      \
    X(MMAP, "mmap", ENOMEM)                                                                        \
    X(RECVMSG, "recvmsg", ENOMEM)                                                                  \
    X(SENDMSG, "sendmsg", ENOBUFS)                                                                 \
    X(ACCEPT4, "accept4", EMFILE)                                                                  \
    X(TIMERFD_CREATE, "timerfd_create", EMFILE)                                                    \
    X(PTHREAD_CREATE, "pthread_create", EAGAIN)                                                    \
    X(SOCKET, "socket", EMFILE)                                                                    \
    X(CONNECT, "connect", EAGAIN)                                                                  \
    X(MEMFD_CREATE, "memfd_create", EMFILE)                                                        \
    X(FTRUNCATE, "ftruncate", ENOSPC)

enum fault_fn {
#define FAULT_ENUM(id, name, err) FAULT_##id,
    FAULT_CALLS(FAULT_ENUM)
#undef FAULT_ENUM
        FAULT_N
};

/* The call's name ("malloc"). */
const char *fault_name(enum fault_fn fn);

/* Calls on this thread are neither counted nor failed from now on (or again, with false). */
void fault_exempt_self(bool exempt);

/* Fails the nth (1-based) counted call of fn from now on, once; n = 0 disarms. Resets the
 * counters and the hit flag. */
void fault_arm(enum fault_fn fn, long nth);

/* Counted calls of fn since the last fault_arm(). */
long fault_calls(enum fault_fn fn);

/* Whether the armed call was reached and failed. */
bool fault_hit(void);

#endif
