/*
 * The metrics as a file, for node_exporter's textfile collector: metrics reachable without a
 * convd client and without a network socket (the unit allows AF_UNIX only). Every interval the
 * loop renders the metrics (as for a MetricsRequest, each sample labelled with the daemon's
 * socket so that several daemons' files can sit side by side) and a libuv thread-pool job writes
 * them to "<path>.tmp" and renames that over <path>, so that a reader sees the old file or the
 * new one, never half of one. The loop never waits for the file system. The file is removed when
 * the daemon stops or the path changes, so that a stopped daemon leaves no metrics that look
 * alive.
 */
#ifndef CONVD_DAEMON_METRICS_FILE_H
#define CONVD_DAEMON_METRICS_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"

/* Renders the metrics into buf (cap bytes): the length, or -1 when they do not fit. */
typedef int (*mfile_render_fn)(void *arg, char *buf, size_t cap);

struct metrics_file {
    uv_loop_t *loop;
    uv_timer_t timer;
    bool timer_open;
    bool closing;
    mfile_render_fn render;
    void *render_arg;
    char path[CONFIG_FILE_BYTES]; /* "" while disabled */
    uint64_t interval_ms;
    struct mfile_job *job; /* the write on the thread pool, or NULL */
    bool written;          /* path holds a file this daemon wrote */
    char last_error[CONFIG_FILE_BYTES +
                    128]; /* the failure last logged: a lasting one is logged once */
    uint64_t writes, failures;
};

/* Prepares f on the loop (nothing is written until mfile_configure() gives it a path). */
void mfile_init(struct metrics_file *f, uv_loop_t *loop, mfile_render_fn render, void *arg);

/* Starts writing to path every interval_ms (the first write at once), moves to a new path or
 * interval, or, with path "" (or NULL), stops and removes the file it wrote. */
void mfile_configure(struct metrics_file *f, const char *path, uint64_t interval_ms);

/* Stops the timer, closes its handle and removes the file (now, and again if a write still in
 * flight lands after). The loop must run on for the handle's close and the job's end. */
void mfile_close(struct metrics_file *f);

#endif
