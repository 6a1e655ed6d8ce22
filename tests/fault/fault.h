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

/* Ids from FAULT_N up to FAULT_MAX_IDS are free for other wrapper sets (the GPU runtime's,
 * tests/gpu/fault_cuda.c), which count and fail through fault_take(). */
#define FAULT_MAX_IDS 64

/* The call's name ("malloc"); other sets name theirs. */
const char *fault_name(enum fault_fn fn);

/* Counts a call of id on this thread and says whether it is the one to fail (never on an
 * exempt thread). The wrappers' common core. */
bool fault_take(int id);

/* Calls on this thread are neither counted nor failed from now on (or again, with false). */
void fault_exempt_self(bool exempt);

/* Whether this thread is exempt. */
bool fault_exempt_now(void);

/* Fails the nth (1-based) counted call of id from now on, once; n = 0 disarms. Resets the
 * counters and the hit flag. id: an enum fault_fn or another set's id. */
void fault_arm(int id, long nth);

/* Counted calls of id since the last fault_arm(). */
long fault_calls(int id);

/* Whether the armed call was reached and failed. */
bool fault_hit(void);

#endif
