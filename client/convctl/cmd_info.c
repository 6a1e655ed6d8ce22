/* convctl status, ping, metrics: queries answered by the daemon's loop thread. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "util.h"

/* Parses a command that takes the common options and `extra` (--count, --json). Returns -1 to
 * go on, else an exit code. */
static int info_parse(struct ctl_global *g, int argc, char **argv, const char *usage,
                      const struct option *extra, int *ret_count, bool *ret_json)
{
    struct option opts[CTL_COMMON_OPTION_COUNT + 4] = {CTL_COMMON_LONG_OPTIONS};
    size_t n = CTL_COMMON_OPTION_COUNT;
    for (; extra != NULL && extra->name != NULL && n + 1 < sizeof(opts) / sizeof(opts[0]); extra++)
        opts[n++] = *extra;
    opts[n] = (struct option){NULL, 0, NULL, 0};
    int opt, code = 0;
    char why[128];
    long long v;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (ctl_common_option(g, opt, optarg, &code)) {
            if (code != 0)
                return code;
            continue;
        }
        switch (opt) {
        case 'h':
            fputs(usage, stdout);
            return 0;
        case 'c':
            if (cli_parse_int(optarg, 1, 1000000, &v, why, sizeof(why)) != 0) {
                ctl_err("--count: %s", why);
                return CTL_EXIT_USAGE;
            }
            *ret_count = (int)v;
            break;
        case 'j':
            *ret_json = true;
            break;
        default:
            return ctl_bad_option(argv, opts, argv[0]);
        }
    }
    if (optind < argc) {
        ctl_err("unexpected argument '%s'", argv[optind]);
        return CTL_EXIT_USAGE;
    }
    return -1;
}

int cmd_status(const struct ctl_global *g0, int argc, char **argv)
{
    static const char usage[] =
        "Usage: convctl status [--json] [--socket PATH | --device N] [--timeout MS]\n"
        "\n"
        "Prints the daemon's socket, version, backend and device, the limits it gives this\n"
        "client, the clients connected, the requests queued and in flight, those served and\n"
        "failed, the batches run and the uptime.\n"
        "\n"
        "  --json   one JSON object on one line instead: socket, client_version, server_version,\n"
        "           protocol_version, backend, device, clients, queue_depth, inflight,\n"
        "           requests_served, requests_failed, batches, uptime_ms, max_inflight,\n"
        "           max_regions, max_mapped_bytes, max_batch\n";
    static const struct option extra[] = {{"json", no_argument, NULL, 'j'}, {NULL, 0, NULL, 0}};
    struct ctl_global g = *g0;
    bool json = false;
    int code = info_parse(&g, argc, argv, usage, extra, NULL, &json);
    if (code >= 0)
        return code;
    convd_client *c;
    if (ctl_connect(&g, &c) != 0)
        return CTL_EXIT_FAIL;
    struct convd_status st;
    int rc = convd_status_get(c, &st);
    if (rc != 0) {
        ctl_err("status: %s (%s)", convd_errstr(c), convd_status_name(rc));
        convd_close(c);
        return CTL_EXIT_FAIL;
    }
    struct convd_server_info info;
    convd_server_info(c, &info);
    char path[128];
    ctl_socket_path(&g, path, sizeof(path));
    if (json) {
        struct ctl_json j;
        ctl_json_begin(&j);
        ctl_json_str(&j, "socket", path);
        ctl_json_str(&j, "client_version", convd_version_string());
        ctl_json_str(&j, "server_version", st.server_version);
        ctl_json_u64(&j, "protocol_version", info.protocol_version);
        ctl_json_str(&j, "backend", st.backend);
        ctl_json_str(&j, "device", st.device);
        ctl_json_u64(&j, "clients", st.clients);
        ctl_json_u64(&j, "queue_depth", st.queue_depth);
        ctl_json_u64(&j, "inflight", st.inflight);
        ctl_json_u64(&j, "requests_served", st.requests_served);
        ctl_json_u64(&j, "requests_failed", st.requests_failed);
        ctl_json_u64(&j, "batches", st.batches);
        ctl_json_u64(&j, "uptime_ms", st.uptime_ms);
        ctl_json_u64(&j, "max_inflight", info.max_inflight);
        ctl_json_u64(&j, "max_regions", info.max_regions);
        ctl_json_u64(&j, "max_mapped_bytes", info.max_mapped_bytes);
        ctl_json_u64(&j, "max_batch", info.max_batch);
        ctl_json_end(&j);
        convd_close(c);
        return 0;
    }
    uint64_t up = st.uptime_ms / 1000;
    printf("socket        %s\n", path);
    printf("version       convd %s (protocol %u)\n", st.server_version, info.protocol_version);
    printf("backend       %s\n", st.backend);
    printf("device        %s\n", st.device);
    printf("clients       %u\n", st.clients);
    printf("queue depth   %u\n", st.queue_depth);
    printf("in flight     %u\n", st.inflight);
    printf("served        %llu\n", (unsigned long long)st.requests_served);
    printf("failed        %llu\n", (unsigned long long)st.requests_failed);
    printf("batches       %llu\n", (unsigned long long)st.batches);
    printf("uptime        %llud %02llu:%02llu:%02llu\n", (unsigned long long)(up / 86400),
           (unsigned long long)(up / 3600 % 24), (unsigned long long)(up / 60 % 60),
           (unsigned long long)(up % 60));
    printf("limits        %u in flight, %u regions, %llu bytes mapped per client; batches of "
           "up to %u\n",
           info.max_inflight, info.max_regions, (unsigned long long)info.max_mapped_bytes,
           info.max_batch);
    convd_close(c);
    return 0;
}

int cmd_ping(const struct ctl_global *g0, int argc, char **argv)
{
    static const char usage[] =
        "Usage: convctl ping [--count N] [--socket PATH | --device N] [--timeout MS]\n"
        "\n"
        "Measures the round trip to the daemon N times (default 1).\n";
    static const struct option extra[] = {{"count", required_argument, NULL, 'c'},
                                          {NULL, 0, NULL, 0}};
    struct ctl_global g = *g0;
    int count = 1;
    bool json = false;
    int code = info_parse(&g, argc, argv, usage, extra, &count, &json);
    if (code >= 0)
        return code;
    convd_client *c;
    if (ctl_connect(&g, &c) != 0)
        return CTL_EXIT_FAIL;
    struct convd_server_info info;
    convd_server_info(c, &info);
    for (int i = 0; i < count; i++) {
        uint64_t rtt;
        int rc = convd_ping(c, &rtt);
        if (rc != 0) {
            ctl_err("ping: %s (%s)", convd_errstr(c), convd_status_name(rc));
            convd_close(c);
            return CTL_EXIT_FAIL;
        }
        char buf[32];
        printf("pong from convd %s (%s backend): %s\n", info.server_version, info.backend,
               ctl_fmt_ns((double)rtt, buf, sizeof(buf)));
    }
    convd_close(c);
    return 0;
}

int cmd_metrics(const struct ctl_global *g0, int argc, char **argv)
{
    static const char usage[] =
        "Usage: convctl metrics [--socket PATH | --device N] [--timeout MS]\n"
        "\n"
        "Prints the daemon's metrics in the Prometheus text format, as the daemon sends them.\n";
    struct ctl_global g = *g0;
    bool json = false;
    int code = info_parse(&g, argc, argv, usage, NULL, NULL, &json);
    if (code >= 0)
        return code;
    convd_client *c;
    if (ctl_connect(&g, &c) != 0)
        return CTL_EXIT_FAIL;
    char *text;
    int rc = convd_metrics_get(c, &text);
    if (rc != 0) {
        ctl_err("metrics: %s (%s)", convd_errstr(c), convd_status_name(rc));
        convd_close(c);
        return CTL_EXIT_FAIL;
    }
    fputs(text, stdout);
    free(text);
    convd_close(c);
    return 0;
}
