/*
 * The wrappers of fault.h. Counters are atomics: the daemon's loop thread and its workers call
 * these concurrently.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>

#include "fault.h"

static _Thread_local bool fault_exempt;
static atomic_int fault_target = -1;
static atomic_long fault_countdown;
static atomic_long fault_counts[FAULT_MAX_IDS];
static atomic_bool fault_was_hit;

static const char *const fault_names[FAULT_N] = {
#define FAULT_NAME(id, name, err) name,
    FAULT_CALLS(FAULT_NAME)
#undef FAULT_NAME
};

static const int fault_errnos[FAULT_N] = {
#define FAULT_ERRNO(id, name, err) err,
    FAULT_CALLS(FAULT_ERRNO)
#undef FAULT_ERRNO
};

const char *fault_name(enum fault_fn fn)
{
    return fn < FAULT_N ? fault_names[fn] : "?";
}

void fault_exempt_self(bool exempt)
{
    fault_exempt = exempt;
}

bool fault_exempt_now(void)
{
    return fault_exempt;
}

void fault_arm(int id, long nth)
{
    atomic_store(&fault_target, -1);
    for (int i = 0; i < FAULT_MAX_IDS; i++)
        atomic_store(&fault_counts[i], 0);
    atomic_store(&fault_was_hit, false);
    atomic_store(&fault_countdown, nth);
    atomic_store(&fault_target, nth > 0 ? id : -1);
}

long fault_calls(int id)
{
    return id >= 0 && id < FAULT_MAX_IDS ? atomic_load(&fault_counts[id]) : 0;
}

bool fault_hit(void)
{
    return atomic_load(&fault_was_hit);
}

bool fault_take(int id)
{
    if (fault_exempt || id < 0 || id >= FAULT_MAX_IDS)
        return false;
    atomic_fetch_add(&fault_counts[id], 1);
    if (atomic_load(&fault_target) != id)
        return false;
    if (atomic_fetch_sub(&fault_countdown, 1) != 1)
        return false;
    atomic_store(&fault_was_hit, true);
    return true;
}

/* fault_take() for the calls of fault.h, with errno set to the call's fault. */
static bool fault_fail(enum fault_fn fn)
{
    if (!fault_take((int)fn))
        return false;
    errno = fault_errnos[fn];
    return true;
}

void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t size);
void *__real_aligned_alloc(size_t align, size_t size);
void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
ssize_t __real_recvmsg(int fd, struct msghdr *msg, int flags);
ssize_t __real_sendmsg(int fd, const struct msghdr *msg, int flags);
int __real_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags);
int __real_timerfd_create(int clock, int flags);
int __real_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);

int __real_socket(int domain, int type, int protocol);
int __real_connect(int fd, const struct sockaddr *addr, socklen_t len);
int __real_memfd_create(const char *name, unsigned flags);
int __real_ftruncate(int fd, off_t len);

int __wrap_socket(int domain, int type, int protocol);
int __wrap_connect(int fd, const struct sockaddr *addr, socklen_t len);
int __wrap_memfd_create(const char *name, unsigned flags);
int __wrap_ftruncate(int fd, off_t len);
void *__wrap_malloc(size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t size);
void *__wrap_aligned_alloc(size_t align, size_t size);
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
ssize_t __wrap_recvmsg(int fd, struct msghdr *msg, int flags);
ssize_t __wrap_sendmsg(int fd, const struct msghdr *msg, int flags);
int __wrap_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags);
int __wrap_timerfd_create(int clock, int flags);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);

void *__wrap_malloc(size_t size)
{
    return fault_fail(FAULT_MALLOC) ? NULL : __real_malloc(size);
}

void *__wrap_calloc(size_t n, size_t size)
{
    return fault_fail(FAULT_CALLOC) ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t size)
{
    return fault_fail(FAULT_REALLOC) ? NULL : __real_realloc(p, size);
}

void *__wrap_aligned_alloc(size_t align, size_t size)
{
    return fault_fail(FAULT_ALIGNED_ALLOC) ? NULL : __real_aligned_alloc(align, size);
}

void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    return fault_fail(FAULT_MMAP) ? MAP_FAILED : __real_mmap(addr, len, prot, flags, fd, off);
}

ssize_t __wrap_recvmsg(int fd, struct msghdr *msg, int flags)
{
    return fault_fail(FAULT_RECVMSG) ? -1 : __real_recvmsg(fd, msg, flags);
}

ssize_t __wrap_sendmsg(int fd, const struct msghdr *msg, int flags)
{
    return fault_fail(FAULT_SENDMSG) ? -1 : __real_sendmsg(fd, msg, flags);
}

int __wrap_accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    return fault_fail(FAULT_ACCEPT4) ? -1 : __real_accept4(fd, addr, len, flags);
}

int __wrap_timerfd_create(int clock, int flags)
{
    return fault_fail(FAULT_TIMERFD_CREATE) ? -1 : __real_timerfd_create(clock, flags);
}

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    /* pthread_create reports its error as the return value, not in errno. */
    return fault_fail(FAULT_PTHREAD_CREATE) ? EAGAIN : __real_pthread_create(t, attr, fn, arg);
}

int __wrap_socket(int domain, int type, int protocol)
{
    return fault_fail(FAULT_SOCKET) ? -1 : __real_socket(domain, type, protocol);
}

int __wrap_connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    return fault_fail(FAULT_CONNECT) ? -1 : __real_connect(fd, addr, len);
}

int __wrap_memfd_create(const char *name, unsigned flags)
{
    return fault_fail(FAULT_MEMFD_CREATE) ? -1 : __real_memfd_create(name, flags);
}

int __wrap_ftruncate(int fd, off_t len)
{
    return fault_fail(FAULT_FTRUNCATE) ? -1 : __real_ftruncate(fd, len);
}
