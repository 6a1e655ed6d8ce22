/* convd: the daemon's entry point. Everything else lives in the convd_daemon library. */
#include <stdio.h>
#include <stdlib.h>

#include "config.h"
#include "convd/convd.h"
#include "daemon.h"
#include "log.h"

int main(int argc, char **argv)
{
    struct convd_config cfg;
    enum config_action action;
    char why[512];
    const char *prog = argc > 0 ? argv[0] : "convd";

    if (config_from_args(argc, argv, &cfg, &action, why, sizeof(why)) != 0) {
        fprintf(stderr, "convd: %s\n", why);
        return 2;
    }
    switch (action) {
    case CONFIG_HELP:
        config_usage(stdout, prog);
        return 0;
    case CONFIG_VERSION:
        printf("convd %s (protocol %u)\n", CONVD_VERSION_STRING, CONVD_PROTOCOL_VERSION);
        return 0;
    case CONFIG_CHECK:
        config_print(&cfg, stdout);
        return 0;
    case CONFIG_RUN:
        break;
    }
    convd_log_level = cfg.log_level;

    struct convd_daemon *d;
    if (daemon_create(&cfg, &d, why, sizeof(why)) != 0) {
        log_err("cannot start: %s", why);
        return 1;
    }
    /* SIGHUP reads the same command line (and the file it names) again. */
    daemon_set_args(d, argc, argv);
    int rc = daemon_run(d);
    daemon_destroy(d);
    return rc;
}
