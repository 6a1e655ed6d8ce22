#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "convd/status.h"
#include "daemon.h"
#include "log.h"
#include "reload.h"
#include "why.h"

/* Appends to buf (of cap bytes, NUL-terminated) without overflowing it. */
static void rl_append(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void rl_append(char *buf, size_t cap, const char *fmt, ...)
{
    size_t len = strlen(buf);
    if (len + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
}

int daemon_reload(struct convd_daemon *d, const struct convd_config *next, char *why,
                  size_t why_len)
{
    struct config_change ch[CONFIG_MAX_OPTIONS];
    size_t n = config_diff(&d->cfg, next, ch, CONFIG_MAX_OPTIONS);
    if (n > CONFIG_MAX_OPTIONS)
        n = CONFIG_MAX_OPTIONS;
    size_t restart = 0;
    for (size_t i = 0; i < n; i++)
        restart += !ch[i].live;
    if (why != NULL && why_len > 0)
        why[0] = '\0';
    if (restart > 0) {
        /* "socket ("/a" -> "/b") and max_batch (32 -> 4) take a restart": every one named. */
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (ch[i].live)
                continue;
            const char *sep = k == 0 ? "" : k + 1 == restart ? " and " : ", ";
            rl_append(why, why_len, "%s%s (%s -> %s)", sep, ch[i].key, ch[i].before, ch[i].after);
            k++;
        }
        rl_append(why, why_len,
                  " %s a restart, so nothing was applied: restart convd to apply the "
                  "configuration",
                  restart == 1 ? "takes" : "take");
        return CONVD_EBUSY;
    }
    for (size_t i = 0; i < n; i++)
        rl_append(why, why_len, "%s%s %s -> %s", i == 0 ? "" : ", ", ch[i].key, ch[i].before,
                  ch[i].after);
    if (n == 0)
        rl_append(why, why_len, "nothing changed");

    d->cfg = *next;
    /* What the daemon keeps outside cfg; everything else is read from cfg where it is used. */
    convd_log_level = d->cfg.log_level;
    daemon_apply_region_limits(d);
    d->sched.limit = d->cfg.queue_limit;
    mfile_configure(&d->mfile, d->cfg.metrics_textfile, d->cfg.metrics_textfile_interval_ms);
    return 0;
}

void daemon_reload_signal(struct convd_daemon *d)
{
    char why[1024];
    if (d->draining) {
        log_notice("SIGHUP ignored: the daemon is draining for shutdown");
        return;
    }
    if (d->argv == NULL) {
        log_notice("SIGHUP ignored: this daemon was not started from a command line to re-read");
        return;
    }
    struct convd_config next;
    enum config_action action;
    int rc = config_from_args(d->argc, d->argv, &next, &action, why, sizeof(why));
    if (rc != 0) {
        d->metrics.reloads_failed++;
        d->metrics.last_reload_ok = 0;
        log_err("SIGHUP: configuration not reloaded (the running one stays): %s", why);
        return;
    }
    rc = daemon_reload(d, &next, why, sizeof(why));
    if (rc != 0) {
        d->metrics.reloads_refused++;
        d->metrics.last_reload_ok = 0;
        log_warn("SIGHUP: configuration not reloaded: %s", why);
        return;
    }
    d->metrics.reloads_applied++;
    d->metrics.last_reload_ok = 1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    d->metrics.config_loaded_unix = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
    log_notice("SIGHUP: configuration reloaded: %s", why);
}
