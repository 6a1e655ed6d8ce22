/*
 * SOCK_SEQPACKET helpers shared by the daemon and the client: one datagram per call, file
 * descriptors as SCM_RIGHTS. These do the system calls and nothing else; the callers own policy.
 */
#ifndef CONVD_COMMON_SOCK_H
#define CONVD_COMMON_SOCK_H

#include <stddef.h>
#include <sys/types.h>

/* Most descriptors one datagram may carry. A message needs at most one; the extra room lets the
 * receiver see (and close) descriptors a misbehaving peer attached beyond that. */
#define SOCK_MAX_FDS 8

/* Sends one datagram, with `pass_fd` attached when it is >= 0. Retries on EINTR, never raises
 * SIGPIPE. Returns 0, or -errno (-EAGAIN when a non-blocking socket is full). */
int sock_send(int fd, const void *buf, size_t len, int pass_fd);

/* Receives one datagram into buf. Descriptors that came with it are stored in fds (close-on-exec
 * set) and counted in *ret_nfds; on any failure they are closed and *ret_nfds is 0. Returns the
 * datagram's length, 0 when the peer closed, -EMSGSIZE when the datagram was longer than len (it
 * is consumed), or -errno (-EAGAIN on a non-blocking socket with nothing to read). */
ssize_t sock_recv(int fd, void *buf, size_t len, int fds[SOCK_MAX_FDS], size_t *ret_nfds);

/* Opens a SOCK_SEQPACKET socket (close-on-exec) connected to the Unix socket at path. Returns the
 * descriptor, or -errno (-ENAMETOOLONG for a path that does not fit sockaddr_un). */
int sock_connect(const char *path);

/* Closes each of n descriptors. */
void sock_close_fds(const int *fds, size_t n);

#endif
