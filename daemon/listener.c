#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "why.h"
#include "convd/status.h"
#include "listener.h"
#include "log.h"
#include "sdnotify.h"
#include "sock.h"

#define LISTEN_BACKLOG     256
#define ACCEPTS_PER_WAKEUP 64
#define EMFILE_BACKOFF_MS  100

/* Decides what to do with whatever already sits at path: 0 when the path is free (a stale socket
 * was removed), else a code. A live daemon is detected by connecting, which is the only reliable
 * test: the file of a crashed daemon looks the same as that of a running one. */
static int lis_clear_path(const char *path, char *why, size_t why_len)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return 0;
        return why_fail(why, why_len, CONVD_EIO, "cannot examine %s: %s", path, strerror(errno));
    }
    if (!S_ISSOCK(st.st_mode))
        return why_fail(why, why_len, CONVD_EEXIST,
                        "%s exists and is not a socket; refusing to replace it", path);
    int fd = sock_connect(path);
    if (fd >= 0) {
        close(fd);
        return why_fail(why, why_len, CONVD_EBUSY,
                        "another process is listening on %s (is convd already running?)", path);
    }
    if (fd != -ECONNREFUSED && fd != -ENOENT)
        return why_fail(why, why_len, CONVD_EBUSY, "cannot tell whether %s is in use: %s", path,
                        strerror(-fd));
    if (unlink(path) != 0 && errno != ENOENT)
        return why_fail(why, why_len, CONVD_EIO, "cannot remove stale socket %s: %s", path,
                        strerror(errno));
    log_notice("removed stale socket %s", path);
    return 0;
}

int listener_bind_path(const char *path, unsigned mode, bool group_set, gid_t group, dev_t *ret_dev,
                       ino_t *ret_ino, char *why, size_t why_len)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (path == NULL || path[0] == '\0' || strlen(path) >= sizeof(sa.sun_path))
        return why_fail(why, why_len, CONVD_EINVAL, "socket path is empty or too long");
    strcpy(sa.sun_path, path);

    int rc = lis_clear_path(path, why, why_len);
    if (rc != 0)
        return rc;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return why_fail(why, why_len, CONVD_EIO, "socket: %s", strerror(errno));

    /* Bind under a umask that leaves only the owner's bits, so the file is never more open than
     * mode between bind and chmod. */
    mode_t old = umask(0177);
    int b = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    int bind_errno = errno;
    umask(old);
    bool created = false;
    struct stat st;
    if (b != 0) {
        rc = why_fail(why, why_len, CONVD_EIO, "cannot bind %s: %s", path, strerror(bind_errno));
        goto fail;
    }
    created = true;
    if (group_set && chown(path, (uid_t)-1, group) != 0) {
        rc = why_fail(why, why_len, CONVD_EPERM, "cannot give %s to group %u: %s", path,
                      (unsigned)group, strerror(errno));
        goto fail;
    }
    if (chmod(path, (mode_t)mode) != 0) {
        rc = why_fail(why, why_len, CONVD_EPERM, "cannot chmod %s to %04o: %s", path, mode,
                      strerror(errno));
        goto fail;
    }
    if (stat(path, &st) != 0) {
        rc = why_fail(why, why_len, CONVD_EIO, "cannot stat %s: %s", path, strerror(errno));
        goto fail;
    }
    if (listen(fd, LISTEN_BACKLOG) != 0) {
        rc = why_fail(why, why_len, CONVD_EIO, "cannot listen on %s: %s", path, strerror(errno));
        goto fail;
    }
    *ret_dev = st.st_dev;
    *ret_ino = st.st_ino;
    return fd;
fail:
    if (created)
        unlink(path);
    close(fd);
    return rc;
}

/* Checks that a descriptor systemd passed is what convd.socket should have given. */
static int lis_check_activated(int fd, char *why, size_t why_len)
{
    int type = 0, domain = 0, accepting = 0;
    socklen_t len = sizeof(int);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0)
        return why_fail(why, why_len, CONVD_EINVAL, "passed descriptor %d is not a socket: %s", fd,
                        strerror(errno));
    len = sizeof(int);
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0)
        domain = -1;
    len = sizeof(int);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0)
        accepting = 0;
    if (domain != AF_UNIX || type != SOCK_SEQPACKET || !accepting)
        return why_fail(why, why_len, CONVD_EINVAL,
                        "passed descriptor %d is not a listening SOCK_SEQPACKET Unix socket "
                        "(use ListenSequentialPacket= in convd.socket)",
                        fd);
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
        return why_fail(why, why_len, CONVD_EIO, "cannot make descriptor %d non-blocking: %s", fd,
                        strerror(errno));
    return 0;
}

int listener_open(struct listener *l, const struct convd_config *cfg, char *why, size_t why_len)
{
    memset(l, 0, sizeof(*l));
    l->fd = -1;
    int n = sdn_listen_fds();
    if (n < 0)
        return why_fail(why, why_len, CONVD_EINVAL, "malformed LISTEN_PID/LISTEN_FDS: %s",
                        strerror(-n));
    if (n > 0) {
        int fd = SDN_LISTEN_FDS_START;
        for (int extra = fd + 1; extra < fd + n; extra++) {
            log_warn("socket activation passed %d descriptors; closing descriptor %d", n, extra);
            close(extra);
        }
        int rc = lis_check_activated(fd, why, why_len);
        if (rc != 0)
            return rc;
        struct sockaddr_un sa;
        socklen_t salen = sizeof(sa);
        memset(&sa, 0, sizeof(sa));
        if (getsockname(fd, (struct sockaddr *)&sa, &salen) == 0 && sa.sun_path[0] != '\0')
            snprintf(l->path, sizeof(l->path), "%s", sa.sun_path);
        else
            snprintf(l->path, sizeof(l->path), "(descriptor %d)", fd);
        l->fd = fd;
        l->activated = true;
        return 0;
    }
    dev_t dev;
    ino_t ino;
    int fd = listener_bind_path(cfg->socket_path, cfg->socket_mode, cfg->socket_group_set,
                                cfg->socket_group, &dev, &ino, why, why_len);
    if (fd < 0)
        return fd;
    l->fd = fd;
    l->bound = true;
    l->dev = dev;
    l->ino = ino;
    snprintf(l->path, sizeof(l->path), "%s", cfg->socket_path);
    return 0;
}

static void lis_on_backoff(uv_timer_t *t);

static void lis_on_readable(uv_poll_t *h, int status, int events)
{
    struct listener *l = h->data;
    (void)events;
    if (status < 0) {
        log_err("listener %s: poll error: %s", l->path, uv_strerror(status));
        return;
    }
    for (int i = 0; i < ACCEPTS_PER_WAKEUP && !l->closing; i++) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            l->on_accept(l, fd);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            /* The pending connection stays in the backlog; level-triggered polling would wake us
             * again at once, so pause. */
            log_warn("accept on %s: %s; pausing for %d ms", l->path, strerror(errno),
                     EMFILE_BACKOFF_MS);
            uv_poll_stop(&l->poll);
            uv_timer_start(&l->backoff, lis_on_backoff, EMFILE_BACKOFF_MS, 0);
        } else if (errno != EAGAIN) {
            log_err("accept on %s: %s", l->path, strerror(errno));
        }
        break;
    }
}

static void lis_on_backoff(uv_timer_t *t)
{
    struct listener *l = t->data;
    if (!l->closing)
        uv_poll_start(&l->poll, UV_READABLE, lis_on_readable);
}

int listener_start(struct listener *l, uv_loop_t *loop, listener_accept_cb cb, void *data)
{
    if (l == NULL || l->fd < 0 || cb == NULL || l->started)
        return CONVD_EINVAL;
    l->on_accept = cb;
    l->data = data;
    int rc = uv_poll_init(loop, &l->poll, l->fd);
    if (rc != 0)
        return CONVD_EIO;
    l->poll.data = l;
    uv_timer_init(loop, &l->backoff);
    l->backoff.data = l;
    l->handles_open = 2;
    l->started = true;
    rc = uv_poll_start(&l->poll, UV_READABLE, lis_on_readable);
    return rc == 0 ? 0 : CONVD_EIO;
}

static void lis_release(struct listener *l)
{
    if (l->fd >= 0) {
        if (l->bound) {
            /* Only remove the file if it is still the one we created: a second daemon started
             * after us may have replaced it. */
            struct stat st;
            if (lstat(l->path, &st) == 0 && st.st_dev == l->dev && st.st_ino == l->ino)
                unlink(l->path);
        }
        close(l->fd);
        l->fd = -1;
    }
    if (l->on_closed != NULL)
        l->on_closed(l);
}

static void lis_on_handle_closed(uv_handle_t *h)
{
    struct listener *l = h->data;
    if (--l->handles_open == 0)
        lis_release(l);
}

void listener_close(struct listener *l, void (*on_closed)(struct listener *l))
{
    if (l == NULL || l->closing)
        return;
    l->closing = true;
    l->on_closed = on_closed;
    if (!l->started) {
        lis_release(l);
        return;
    }
    uv_close((uv_handle_t *)&l->poll, lis_on_handle_closed);
    uv_close((uv_handle_t *)&l->backoff, lis_on_handle_closed);
}
