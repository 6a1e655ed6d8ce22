/*
 * The in-process daemon of insrv.h.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "insrv.h"

void tu_srv_config(struct tu_srv *s, const char *prefix)
{
    memset(s, 0, sizeof(*s));
    snprintf(s->dir, sizeof(s->dir), "/tmp/%s-XXXXXX", prefix);
    assert_non_null(mkdtemp(s->dir));
    snprintf(s->sock, sizeof(s->sock), "%s/convd.sock", s->dir);
    config_defaults(&s->cfg);
    snprintf(s->cfg.socket_path, sizeof(s->cfg.socket_path), "%s", s->sock);
    s->cfg.backend = CONFIG_BACKEND_CPU;
    s->cfg.threads = 2;
}

void *tu_srv_thread(void *arg)
{
    struct tu_srv *s = arg;
    s->rc = daemon_run(s->d);
    return NULL;
}

void tu_srv_start(struct tu_srv *s)
{
    char why[256];
    int rc = daemon_create(&s->cfg, &s->d, why, sizeof(why));
    if (rc != 0)
        fail_msg("daemon_create: %s", why);
    assert_int_equal(pthread_create(&s->thread, NULL, tu_srv_thread, s), 0);
}

void tu_srv_join(struct tu_srv *s)
{
    daemon_request_stop(s->d);
    assert_int_equal(pthread_join(s->thread, NULL), 0);
    daemon_destroy(s->d);
    s->d = NULL;
}
