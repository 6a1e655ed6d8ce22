#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "sdnotify.h"

int sdn_notify(const char *state)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (path == NULL || path[0] == '\0')
        return 0;
    if (path[0] != '/' && path[0] != '@')
        return -EAFNOSUPPORT; /* vsock and others: not for a local daemon */

    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t plen = strlen(path);
    if (plen >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    memcpy(sa.sun_path, path, plen);
    if (sa.sun_path[0] == '@')
        sa.sun_path[0] = '\0';
    /* Abstract names are not NUL-terminated: the address length carries their end. */
    socklen_t salen =
        (socklen_t)(offsetof(struct sockaddr_un, sun_path) + plen + (path[0] == '/' ? 1 : 0));

    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    ssize_t n;
    do
        n = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, salen);
    while (n < 0 && errno == EINTR);
    int rc = n < 0 ? -errno : 1;
    close(fd);
    return rc;
}

int sdn_notifyf(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return sdn_notify(buf);
}

static int sdn_parse_ulong(const char *s, unsigned long long *ret)
{
    if (s == NULL || s[0] < '0' || s[0] > '9')
        return -EINVAL;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return -EINVAL;
    *ret = v;
    return 0;
}

int sdn_listen_fds(void)
{
    unsigned long long pid, n;
    int rc = 0;
    const char *pid_s = getenv("LISTEN_PID");
    const char *fds_s = getenv("LISTEN_FDS");
    if (pid_s == NULL || fds_s == NULL)
        goto out;
    if (sdn_parse_ulong(pid_s, &pid) != 0 || sdn_parse_ulong(fds_s, &n) != 0) {
        rc = -EINVAL;
        goto out;
    }
    if (pid != (unsigned long long)getpid())
        goto out;
    if (n > 1024) {
        rc = -EINVAL;
        goto out;
    }
    for (int fd = SDN_LISTEN_FDS_START; fd < SDN_LISTEN_FDS_START + (int)n; fd++) {
        int flags = fcntl(fd, F_GETFD);
        if (flags < 0) {
            rc = -errno;
            goto out;
        }
        if (!(flags & FD_CLOEXEC) && fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0) {
            rc = -errno;
            goto out;
        }
    }
    rc = (int)n;
out:
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    return rc;
}

uint64_t sdn_watchdog_usec(void)
{
    unsigned long long usec, pid;
    if (sdn_parse_ulong(getenv("WATCHDOG_USEC"), &usec) != 0 || usec == 0)
        return 0;
    const char *pid_s = getenv("WATCHDOG_PID");
    if (pid_s != NULL && (sdn_parse_ulong(pid_s, &pid) != 0 || pid != (unsigned long long)getpid()))
        return 0;
    return usec;
}
