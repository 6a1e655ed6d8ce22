/*
 * The listening socket: the one systemd passed (socket activation), or a SOCK_SEQPACKET socket
 * the daemon binds itself. Accepting happens on the loop through a uv_poll_t; each accepted
 * descriptor (non-blocking, close-on-exec) goes to a callback.
 */
#ifndef CONVD_DAEMON_LISTENER_H
#define CONVD_DAEMON_LISTENER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>
#include <uv.h>

#include "config.h"

struct listener;

/* Gets a new connection's descriptor, which it then owns. */
typedef void (*listener_accept_cb)(struct listener *l, int fd);

struct listener {
    int fd;
    bool activated; /* passed by systemd: not ours to unlink */
    bool bound;     /* we bound `path` and unlink it on close */
    char path[CONFIG_PATH_BYTES];
    dev_t dev; /* identity of the socket file we created, so we never unlink another */
    ino_t ino;
    uv_poll_t poll;
    uv_timer_t backoff; /* pauses accepting after EMFILE/ENFILE instead of spinning */
    bool started, closing;
    int handles_open;
    listener_accept_cb on_accept;
    void (*on_closed)(struct listener *l);
    void *data;
};

/* Binds a SOCK_SEQPACKET socket at path, listening, non-blocking and close-on-exec, with the given
 * permission bits (the umask is narrowed around bind so it is never wider in between) and, when
 * group_set, the given group. Refuses a path where a live socket answers (CONVD_EBUSY), removes a
 * stale socket file, refuses to replace anything that is not a socket (CONVD_EEXIST). Returns the
 * descriptor or a CONVD_E* code with the reason in why; *ret_dev / *ret_ino identify the file. */
int listener_bind_path(const char *path, unsigned mode, bool group_set, gid_t group, dev_t *ret_dev,
                       ino_t *ret_ino, char *why, size_t why_len);

/* Opens the listener: the first socket systemd passed when activated (checked to be a listening
 * SOCK_SEQPACKET Unix socket; the rest are closed), else listener_bind_path() with the config's
 * socket, mode and group. Returns 0 or a CONVD_E* code with the reason in why. */
int listener_open(struct listener *l, const struct convd_config *cfg, char *why, size_t why_len);

/* Starts accepting on loop. Returns 0 or a CONVD_E* code. */
int listener_start(struct listener *l, uv_loop_t *loop, listener_accept_cb cb, void *data);

/* Stops accepting, closes the handles and the descriptor, and removes the socket file if this
 * process created it and it is still the same file. on_closed (may be NULL) runs once everything
 * is closed. Safe to call twice; a listener that was opened but never started is closed at once. */
void listener_close(struct listener *l, void (*on_closed)(struct listener *l));

#endif
