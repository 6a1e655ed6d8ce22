/*
 * What the subcommands of convctl share: the global options, connecting, messages, random data,
 * comparison, files and time.
 */
#ifndef CONVD_CONVCTL_UTIL_H
#define CONVD_CONVCTL_UTIL_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cliargs.h"
#include "convd/convd.h"

/* Exit codes: 0 success, 1 the operation failed (or a check FAILed), 2 bad usage. */
#define CTL_EXIT_FAIL  1
#define CTL_EXIT_USAGE 2

/* Global options (before the command, or after it). */
struct ctl_global {
    const char *socket; /* NULL: convd_socket_path(device) */
    int timeout_ms;     /* 0: the library's default */
    int device;         /* --device N: the daemon of GPU N (gpuN.sock); -1: the default one */
};
#define CTL_GLOBAL_INIT                                                                            \
    {                                                                                              \
        NULL, 0, -1                                                                                \
    }

/* A subcommand: argv[0] is its name. Returns the exit code. */
typedef int (*ctl_cmd_fn)(const struct ctl_global *g, int argc, char **argv);

int cmd_status(const struct ctl_global *g, int argc, char **argv);
int cmd_ping(const struct ctl_global *g, int argc, char **argv);
int cmd_metrics(const struct ctl_global *g, int argc, char **argv);
int cmd_conv(const struct ctl_global *g, int argc, char **argv);
int cmd_verify(const struct ctl_global *g, int argc, char **argv);
int cmd_bench(const struct ctl_global *g, int argc, char **argv);

/* "convctl: <message>\n" on stderr. */
void ctl_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Connects with the global options; prints the reason and returns non-zero on failure. */
int ctl_connect(const struct ctl_global *g, convd_client **ret_client);

/* The socket path the global options lead to (--socket, else convd_socket_path(--device)), for
 * messages and status. */
void ctl_socket_path(const struct ctl_global *g, char *buf, size_t cap);

/* Handles an option every subcommand takes (--socket, --timeout, --device). Returns true if it
 * was one. */
bool ctl_common_option(struct ctl_global *g, int opt, const char *arg, int *ret_exit);

/* For getopt_long's '?' (opterr is off): says which option was wrong and how ("unknown option
 * '--jsn'; did you mean '--json'?", "option '--csv' needs a value"), naming `cmd`'s help, and
 * returns CTL_EXIT_USAGE. argv and opts are those given to getopt_long. */
int ctl_bad_option(char **argv, const struct option *opts, const char *cmd);

/* Option codes of the common and the problem options, for getopt_long tables. */
enum {
    CTL_OPT_SOCKET = 1000,
    CTL_OPT_TIMEOUT,
    CTL_OPT_DEVICE,
    CTL_OPT_PROBLEM_FIRST = 1100, /* + CLI_PO_x (cliargs.h) */
};
#define CTL_COMMON_OPTION_COUNT 4
#define CTL_COMMON_LONG_OPTIONS                                                                    \
    {"socket", required_argument, NULL, CTL_OPT_SOCKET},                                           \
        {"timeout", required_argument, NULL, CTL_OPT_TIMEOUT},                                     \
        {"device", required_argument, NULL, CTL_OPT_DEVICE},                                       \
    {                                                                                              \
        "help", no_argument, NULL, 'h'                                                             \
    }

/*
 * --json: one JSON object on one line of stdout per result (JSON Lines), the same way for
 * status, verify and bench, built field by field. Strings are escaped (invalid UTF-8 becomes
 * U+FFFD), numbers that are not finite become null.
 */
struct ctl_json {
    int fields;
};
void ctl_json_begin(struct ctl_json *j);
void ctl_json_str(struct ctl_json *j, const char *key, const char *v); /* NULL: null */
void ctl_json_int(struct ctl_json *j, const char *key, long long v);
void ctl_json_u64(struct ctl_json *j, const char *key, uint64_t v);
void ctl_json_num(struct ctl_json *j, const char *key, double v);
void ctl_json_bool(struct ctl_json *j, const char *key, bool v);
/* The problem's fields (n, h, w, c, k, r, s, groups, strides, paddings, dilations, dtype,
 * layout, bias, relu, activation and clamp's bounds) and its sizes (input_bytes .. output_bytes,
 * flops), as bench and verify print them. */
void ctl_json_problem(struct ctl_json *j, const struct convd_problem *p,
                      const struct convd_problem_sizes *z);
/* Ends the object and the line, and flushes stdout. */
void ctl_json_end(struct ctl_json *j);
/* getopt_long entries of the problem options, made from cliargs.h's table (the code of option
 * CLI_PO_x is CTL_OPT_PROBLEM_FIRST + CLI_PO_x), followed by the zero entry that ends a
 * getopt_long table: they go last, `{..., {"json", no_argument, NULL, 'j'}, CTL_PROBLEM_..._END}`.
 */
#define CTL_PO_LONG(id, name, takes_value, in_conv)                                                \
    {name, (takes_value) ? required_argument : no_argument, NULL,                                  \
     CTL_OPT_PROBLEM_FIRST + CLI_PO_##id},
/* Every problem option: verify and bench. */
#define CTL_PROBLEM_LONG_OPTIONS_END                                                               \
    CLI_PROBLEM_OPTIONS(CTL_PO_LONG)                                                               \
    {                                                                                              \
        NULL, 0, NULL, 0                                                                           \
    }
/* The options marked in_conv: conv. */
#define CTL_PO_LONG_CONV(id, name, takes_value, in_conv)                                           \
    CTL_PO_LONG_IF_##in_conv(id, name, takes_value, in_conv)
#define CTL_PO_LONG_IF_0(id, name, takes_value, in_conv)
#define CTL_PO_LONG_IF_1 CTL_PO_LONG
#define CTL_PROBLEM_CONV_LONG_OPTIONS_END                                                          \
    CLI_PROBLEM_OPTIONS(CTL_PO_LONG_CONV)                                                          \
    {                                                                                              \
        NULL, 0, NULL, 0                                                                           \
    }
#define CTL_PROBLEM_OPTION_COUNT CLI_PO_COUNT

/* Applies a problem option (code from CTL_PROBLEM_LONG_OPTIONS_END) to p and records which were
 * given in *given (bit per option). Returns true if opt was one; on a bad value prints the
 * reason and sets *ret_exit. */
bool ctl_problem_option(struct convd_problem *p, unsigned *given, int opt, const char *arg,
                        int *ret_exit);
#define CTL_GIVEN(name_index) (1u << (name_index))
#define CTL_GIVEN_GEOMETRY    (CTL_GIVEN(CLI_PO_DILATION + 1) - 1u) /* n .. dilation */
#define CTL_GIVEN_DTYPE       CTL_GIVEN(CLI_PO_DTYPE)
#define CTL_GIVEN_LAYOUT      CTL_GIVEN(CLI_PO_LAYOUT)

/* The problem verify and bench use when no shape is given: a small grouped 3x3 convolution. */
void ctl_default_problem(struct convd_problem *p);

/* Loads a shapes CSV; prints the reason on failure. */
int ctl_load_shapes(const char *path, struct cli_shape **ret_rows, size_t *ret_count);

/* Reads a whole file; prints the reason on failure. */
int ctl_read_file(const char *path, uint8_t **ret_data, size_t *ret_len);

/* xorshift64* random numbers. */
struct ctl_rng {
    uint64_t s;
};
void ctl_rng_seed(struct ctl_rng *g, uint64_t seed);
uint64_t ctl_rng_next(struct ctl_rng *g);
/* A seed from the clock and the pid. */
uint64_t ctl_fresh_seed(void);
/* count elements of dtype, uniform in [-1, 1). */
void ctl_fill_random(struct ctl_rng *g, enum convd_dtype dtype, void *data, size_t count);

/* Element i of a tensor of dtype, as float. */
float ctl_load(enum convd_dtype dtype, const void *data, size_t i);

/* Compares out with ref (both count elements of dtype): relative L2 error
 * ||out - ref|| / ||ref|| (INFINITY if out has a NaN or infinity where ref is finite) and the
 * largest absolute difference. */
double ctl_rel_error(enum convd_dtype dtype, const void *out, const void *ref, size_t count,
                     double *ret_max_abs);

/* Relative L2 tolerance for p: 1e-5 fp32 (3e-3 allowing TF32), 1e-2 fp16 and bf16. */
double ctl_tolerance(const struct convd_problem *p);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t ctl_now_ns(void);

/* Formats a duration in ns as "12.3 us", "4.56 ms", "1.23 s" into buf. Returns buf. */
char *ctl_fmt_ns(double ns, char *buf, size_t len);

#endif
