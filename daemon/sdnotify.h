/*
 * The two small systemd protocols the daemon speaks, implemented directly so that libsystemd stays
 * optional: readiness notification (sd_notify(3): datagrams to $NOTIFY_SOCKET) and socket
 * activation (sd_listen_fds(3): $LISTEN_PID, $LISTEN_FDS, descriptors from 3 up).
 */
#ifndef CONVD_DAEMON_SDNOTIFY_H
#define CONVD_DAEMON_SDNOTIFY_H

#include <stdbool.h>
#include <stdint.h>

/* First descriptor passed by socket activation (SD_LISTEN_FDS_START). */
#define SDN_LISTEN_FDS_START 3

/* Sends `state` ("READY=1", "STATUS=...", newline-separated assignments) to $NOTIFY_SOCKET. An
 * address starting with '@' is abstract. Returns 1 when sent, 0 when $NOTIFY_SOCKET is not set,
 * or -errno. */
int sdn_notify(const char *state);

/* printf-style sdn_notify(). */
int sdn_notifyf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The number of descriptors systemd passed (they are SDN_LISTEN_FDS_START onwards and get
 * close-on-exec set), 0 when the process was not socket-activated (or $LISTEN_PID names another
 * process), or -errno for malformed variables. Unsets the variables so children do not inherit
 * them. */
int sdn_listen_fds(void);

/* The watchdog interval in microseconds from $WATCHDOG_USEC (when $WATCHDOG_PID is unset or names
 * this process), or 0 when no watchdog is requested. */
uint64_t sdn_watchdog_usec(void);

#endif
