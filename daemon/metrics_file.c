#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "metrics_file.h"

/* The text is rendered on the loop into a buffer of this size: far more than the metrics take
 * (about 20 KiB), since the file is not bounded by a datagram. */
#define MFILE_CAP (256u * 1024u)

/* One write, owned by the thread pool from uv_queue_work() to its after-callback. */
struct mfile_job {
    uv_work_t work;
    struct metrics_file *f;
    char path[CONFIG_FILE_BYTES];
    char tmp[CONFIG_FILE_BYTES + 8];
    char *text;
    size_t len;
    int err;                           /* errno of the failed step, 0 on success */
    char why[CONFIG_FILE_BYTES + 128]; /* the failed step, with its path and error */
};

/* Thread pool: write <path>.tmp whole, then rename it over <path>. */
static void mfile_fail(struct mfile_job *j, int err, const char *what, const char *path)
{
    j->err = err;
    snprintf(j->why, sizeof(j->why), "cannot %s %s: %s", what, path, strerror(err));
}

static void mfile_write(uv_work_t *w)
{
    struct mfile_job *j = w->data;
    int fd = open(j->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        mfile_fail(j, errno, "create", j->tmp);
        return;
    }
    size_t off = 0;
    while (off < j->len) {
        ssize_t n = write(fd, j->text + off, j->len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            mfile_fail(j, n < 0 ? errno : EIO, "write", j->tmp);
            close(fd);
            unlink(j->tmp);
            return;
        }
        off += (size_t)n;
    }
    if (close(fd) != 0) {
        mfile_fail(j, errno, "write", j->tmp);
        unlink(j->tmp);
        return;
    }
    if (rename(j->tmp, j->path) != 0) {
        mfile_fail(j, errno, "rename the new file onto", j->path);
        unlink(j->tmp);
    }
}

static void mfile_remove(const char *path)
{
    if (path[0] != '\0' && unlink(path) != 0 && errno != ENOENT)
        log_warn("metrics textfile: cannot remove %s: %s", path, strerror(errno));
}

/* Loop: the job is done. A failure is logged once until it changes or the writes recover. */
static void mfile_after(uv_work_t *w, int status)
{
    struct mfile_job *j = w->data;
    struct metrics_file *f = j->f;
    f->job = NULL;
    bool current = !f->closing && strcmp(j->path, f->path) == 0;
    if (status == 0 && j->err == 0) {
        f->writes++;
        if (!current) {
            /* Closed or moved while this write ran: it must not leave a file behind. */
            mfile_remove(j->path);
        } else {
            f->written = true;
            if (f->last_error[0] != '\0')
                log_notice("metrics textfile: writing %s again", j->path);
            f->last_error[0] = '\0';
        }
    } else if (current) {
        f->failures++;
        if (status != 0)
            snprintf(j->why, sizeof(j->why), "the write of %s was cancelled", j->path);
        if (strcmp(j->why, f->last_error) != 0) {
            /* Under the unit's ProtectSystem=strict, a directory not in ReadWritePaths= is
             * read-only: say so where it is the likely cause. */
            bool sandbox = j->err == EROFS || j->err == EACCES || j->err == EPERM;
            log_warn("metrics textfile: %s%s; retrying every %llu ms", j->why,
                     sandbox ? " (under systemd the unit needs ReadWritePaths= for its directory)"
                             : "",
                     (unsigned long long)f->interval_ms);
            snprintf(f->last_error, sizeof(f->last_error), "%s", j->why);
        }
    }
    free(j->text);
    free(j);
}

static void mfile_tick(uv_timer_t *t)
{
    struct metrics_file *f = t->data;
    if (f->closing || f->path[0] == '\0' || f->job != NULL)
        return; /* a slow file system: skip a beat rather than queue writes */
    struct mfile_job *j = calloc(1, sizeof(*j));
    char *text = malloc(MFILE_CAP);
    if (j == NULL || text == NULL) {
        free(j);
        free(text);
        return;
    }
    int len = f->render(f->render_arg, text, MFILE_CAP);
    if (len < 0) {
        free(j);
        free(text);
        return;
    }
    j->f = f;
    j->text = text;
    j->len = (size_t)len;
    j->work.data = j;
    snprintf(j->path, sizeof(j->path), "%s", f->path);
    snprintf(j->tmp, sizeof(j->tmp), "%s.tmp", f->path);
    if (uv_queue_work(f->loop, &j->work, mfile_write, mfile_after) != 0) {
        free(text);
        free(j);
        return;
    }
    f->job = j;
}

void mfile_init(struct metrics_file *f, uv_loop_t *loop, mfile_render_fn render, void *arg)
{
    memset(f, 0, sizeof(*f));
    f->loop = loop;
    f->render = render;
    f->render_arg = arg;
    uv_timer_init(loop, &f->timer);
    f->timer.data = f;
    f->timer_open = true;
}

void mfile_configure(struct metrics_file *f, const char *path, uint64_t interval_ms)
{
    if (!f->timer_open || f->closing)
        return;
    if (path == NULL)
        path = "";
    if (interval_ms == 0)
        interval_ms = 1000;
    bool moved = strcmp(path, f->path) != 0;
    if (!moved && interval_ms == f->interval_ms)
        return;
    if (moved) {
        if (f->written)
            mfile_remove(f->path);
        f->written = false;
        f->last_error[0] = '\0';
        snprintf(f->path, sizeof(f->path), "%s", path);
    }
    f->interval_ms = interval_ms;
    uv_timer_stop(&f->timer);
    if (f->path[0] == '\0')
        return;
    if (moved)
        log_notice("metrics textfile: %s every %llu ms", f->path,
                   (unsigned long long)f->interval_ms);
    uv_timer_start(&f->timer, mfile_tick, moved ? 0 : interval_ms, interval_ms);
}

void mfile_close(struct metrics_file *f)
{
    if (!f->timer_open || f->closing)
        return;
    f->closing = true;
    uv_timer_stop(&f->timer);
    uv_close((uv_handle_t *)&f->timer, NULL);
    if (f->written)
        mfile_remove(f->path);
    f->written = false;
}
