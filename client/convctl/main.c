/*
 * convctl: the command-line client of convd. Global options, then a command with its own options;
 * every command answers --help.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "suggest.h"
#include "util.h"
#include "wire.h"

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
    fprintf(out, "Usage: convctl [--socket PATH | --device N] [--timeout MS] COMMAND [OPTIONS]\n"
                 "\n"
                 "Commands:\n");
    for (size_t i = 0; i < sizeof(ctl_commands) / sizeof(ctl_commands[0]); i++)
        fprintf(out, "  %-8s %s\n", ctl_commands[i].name, ctl_commands[i].summary);
    fprintf(out,
            "  help     this text, or `convctl help COMMAND` for a command's options\n"
            "\n"
            "Global options (also accepted after the command):\n"
            "  --socket PATH   the daemon's socket (default: $CONVD_SOCKET, else %s)\n"
            "  --device N      with one daemon per GPU: the daemon of GPU N, listening on\n"
            "                  gpuN.sock in $CONVD_SOCKET_DIR (default %s); --socket and\n"
            "                  $CONVD_SOCKET win over it\n"
            "  --timeout MS    for connecting and for the daemon's answers (default 5000)\n"
            "  --version       print convctl's version\n"
            "\n"
            "status, verify and bench take --json: one JSON object per line on stdout.\n"
            "Exit status: 0 success, 1 failure (or a FAILed check), 2 bad usage.\n",
            CONVD_DEFAULT_SOCKET, CONVD_DEFAULT_SOCKET_DIR);
}

/* "unknown command 'stauts'; did you mean 'status'?" */
static int ctl_unknown_command(const char *name)
{
    const char *names[sizeof(ctl_commands) / sizeof(ctl_commands[0]) + 1];
    size_t n = 0;
    for (; n < sizeof(ctl_commands) / sizeof(ctl_commands[0]); n++)
        names[n] = ctl_commands[n].name;
    names[n++] = "help";
    char hint[96];
    ctl_err("unknown command '%s'%s (see convctl --help)", name,
            suggest_hint(name, names, n, hint, sizeof(hint)));
    return CTL_EXIT_USAGE;
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
    struct ctl_global g = CTL_GLOBAL_INIT;
    static const struct option opts[] = {
        CTL_COMMON_LONG_OPTIONS,
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    int opt, code = 0;
    /* Bad options are reported by ctl_bad_option(), with a hint, rather than by getopt. */
    opterr = 0;
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
            printf("convctl %s (library %s, protocol %u)\n", CONVD_VERSION_STRING,
                   convd_version_string(), CONVD_PROTOCOL_VERSION);
            return 0;
        default:
            return ctl_bad_option(argv, opts, NULL);
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
        if (fn == NULL)
            return ctl_unknown_command(argv[optind + 1]);
        char *hargv[] = {argv[optind + 1], "--help", NULL};
        optind = 0;
        return fn(&g, 2, hargv);
    }
    ctl_cmd_fn fn = ctl_find(cmd);
    if (fn == NULL)
        return ctl_unknown_command(cmd);
    int sub_argc = argc - optind;
    char **sub_argv = argv + optind;
    /* Reset getopt for the command's own parse. */
    optind = 0;
    return fn(&g, sub_argc, sub_argv);
}
