/*
 * Reloading the configuration on SIGHUP: the same sources as at start (defaults, the config
 * file, the command line) are read again, and what changed is applied to the running daemon if
 * every changed key can change live (config_key_live: limits, timeouts, the allow-lists, the log
 * level, the metrics textfile). If a key that takes a restart changed (the socket, the backend,
 * the device, anything sized at start), nothing is applied and the log names those keys. Loop
 * thread only.
 */
#ifndef CONVD_DAEMON_RELOAD_H
#define CONVD_DAEMON_RELOAD_H

#include <stddef.h>

#include "config.h"

struct convd_daemon;

/* Applies next to d if only live keys differ. Returns 0 with a summary ("max_inflight 256 ->
 * 12") in why, or CONVD_EBUSY with a sentence naming the keys that take a restart. */
int daemon_reload(struct convd_daemon *d, const struct convd_config *next, char *why,
                  size_t why_len);

/* SIGHUP: re-reads the command line given to daemon_set_args() and the file it names (or the
 * default one), applies it with daemon_reload(), and logs and counts the outcome. */
void daemon_reload_signal(struct convd_daemon *d);

#endif
