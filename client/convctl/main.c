/*
 * convctl: the command-line client of convd. Global options, then a command with its own options;
 * every command answers --help.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

static const struct {
    const char *name;
    ctl_cmd_fn fn;
    const char *summary;
} ctl_commands[] = {
    {"status", cmd_status, "the daemon's version, backend, device and counters"},
    {"ping", cmd_ping, "round trip to the daemon"},
    {"metrics", cmd_metrics, "the daemon's metrics in Prometheus text format"},
    {"conv", cmd_conv, "run one convolution on .npy files"},
    {"verify", cmd_verify, "run a random problem through the daemon, check it against the CPU"},
    {"bench", cmd_bench, "load benchmark: many clients pipelining requests"},
};

static void ctl_usage(FILE *out)
{
    fprintf(out, "Usage: convctl [--socket PATH] [--timeout MS] COMMAND [OPTIONS]\n"
                 "\n"
                 "Commands:\n");
    for (size_t i = 0; i < sizeof(ctl_commands) / sizeof(ctl_commands[0]); i++)
        fprintf(out, "  %-8s %s\n", ctl_commands[i].name, ctl_commands[i].summary);
    fprintf(out,
            "  help     this text, or `convctl help COMMAND` for a command's options\n"
            "\n"
            "Global options (also accepted after the command):\n"
            "  --socket PATH   the daemon's socket (default: $CONVD_SOCKET, else %s)\n"
            "  --timeout MS    for connecting and for the daemon's answers (default 5000)\n"
            "  --version       print convctl's version\n"
            "\n"
            "Exit status: 0 success, 1 failure (or a FAILed check), 2 bad usage.\n",
            CONVD_DEFAULT_SOCKET);
}

static ctl_cmd_fn ctl_find(const char *name)
{
    for (size_t i = 0; i < sizeof(ctl_commands) / sizeof(ctl_commands[0]); i++)
        if (strcmp(ctl_commands[i].name, name) == 0)
            return ctl_commands[i].fn;
    return NULL;
}

int main(int argc, char **argv)
{
    struct ctl_global g = {NULL, 0};
    static const struct option opts[] = {
        CTL_COMMON_LONG_OPTIONS,
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    int opt, code = 0;
    /* "+": stop at the command; its options are its own. */
    while ((opt = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        if (ctl_common_option(&g, opt, optarg, &code)) {
            if (code != 0)
                return code;
            continue;
        }
        switch (opt) {
        case 'h':
            ctl_usage(stdout);
            return 0;
        case 'V':
            printf("convctl %s (protocol 1)\n", CONVD_VERSION_STRING);
            return 0;
        default:
            ctl_usage(stderr);
            return CTL_EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        ctl_usage(stderr);
        return CTL_EXIT_USAGE;
    }
    const char *cmd = argv[optind];
    if (strcmp(cmd, "help") == 0) {
        if (optind + 1 >= argc) {
            ctl_usage(stdout);
            return 0;
        }
        ctl_cmd_fn fn = ctl_find(argv[optind + 1]);
        if (fn == NULL) {
            ctl_err("unknown command '%s'", argv[optind + 1]);
            return CTL_EXIT_USAGE;
        }
        char *hargv[] = {argv[optind + 1], "--help", NULL};
        optind = 0;
        return fn(&g, 2, hargv);
    }
    ctl_cmd_fn fn = ctl_find(cmd);
    if (fn == NULL) {
        ctl_err("unknown command '%s' (see convctl --help)", cmd);
        return CTL_EXIT_USAGE;
    }
    int sub_argc = argc - optind;
    char **sub_argv = argv + optind;
    /* Reset getopt for the command's own parse. */
    optind = 0;
    return fn(&g, sub_argc, sub_argv);
}
