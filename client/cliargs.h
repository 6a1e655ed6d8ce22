/*
 * Parsing helpers of convctl that do no I/O: numbers, stride/pad/dilation forms, problem options
 * and the benchmark shapes CSV. Each returns 0 or CONVD_EINVAL with a sentence in why.
 */
#ifndef CONVD_CLIENT_CLIARGS_H
#define CONVD_CLIENT_CLIARGS_H

#include <stddef.h>
#include <stdint.h>

#include "convd/conv.h"

/* A whole decimal integer in [lo, hi] ("12"; no sign for lo >= 0, no trailing characters). */
int cli_parse_int(const char *s, long long lo, long long hi, long long *ret, char *why,
                  size_t why_len);

/* A number in [lo, hi] ("2.5", "1e-3"). */
int cli_parse_double(const char *s, double lo, double hi, double *ret, char *why, size_t why_len);

/* "V" or "VH,VW" (stride, dilation): ret[0] vertical, ret[1] horizontal, each in [lo, hi]. */
int cli_parse_pair(const char *s, int32_t lo, int32_t hi, int32_t ret[2], char *why,
                   size_t why_len);

/* "P", "PH,PW" or "PT,PB,PL,PR" into top, bottom, left, right, each in [0, CONVD_MAX_PAD]. */
int cli_parse_pad(const char *s, int32_t ret[4], char *why, size_t why_len);

/*
 * The problem options, in one table that cli_problem_option() and convctl's getopt tables are
 * all made from: X(ID, name, takes_value, in_conv). verify and bench offer every one; conv only
 * those marked in_conv, because it reads the sizes from its .npy arrays and its --bias names a
 * file.
 */
#define CLI_PROBLEM_OPTIONS(X)                                                                     \
    X(N, "n", 1, 0)                                                                                \
    X(C, "c", 1, 0)                                                                                \
    X(H, "h", 1, 0)                                                                                \
    X(W, "w", 1, 0)                                                                                \
    X(K, "k", 1, 0)                                                                                \
    X(R, "r", 1, 0)                                                                                \
    X(S, "s", 1, 0)                                                                                \
    X(GROUPS, "groups", 1, 1)                                                                      \
    X(STRIDE, "stride", 1, 1)                                                                      \
    X(PAD, "pad", 1, 1)                                                                            \
    X(DILATION, "dilation", 1, 1)                                                                  \
    X(DTYPE, "dtype", 1, 1)                                                                        \
    X(LAYOUT, "layout", 1, 1)                                                                      \
    X(BIAS, "bias", 0, 0)                                                                          \
    X(RELU, "relu", 0, 1)                                                                          \
    X(ACT, "act", 1, 1)                                                                            \
    X(TF32, "tf32", 0, 1)

/* Indices into the table: CLI_PO_N, ..., CLI_PO_ACT, then the count. */
enum cli_problem_opt {
#define CLI_PO_ENUM(id, name, takes_value, in_conv) CLI_PO_##id,
    CLI_PROBLEM_OPTIONS(CLI_PO_ENUM)
#undef CLI_PO_ENUM
        CLI_PO_COUNT
};

/* The name of option i of the table ("stride"), or NULL when i is out of range. */
const char *cli_problem_option_name(int i);

/* Applies one problem option of the table, by name, to p. bias, relu and tf32 (allow_tf32) take
 * no value (value may be NULL); the others need one. act takes an activation's name
 * (convd_activation_parse(): relu, relu6, silu, ...) or clamp:LO,HI; --relu is --act relu. Other
 * fields stay as they are. Unknown names fail. */
int cli_problem_option(struct convd_problem *p, const char *name, const char *value, char *why,
                       size_t why_len);

/* One row of bench/shapes.csv. */
struct cli_shape {
    char name[64];
    int32_t n, h, w, c, k, r, s, stride, pad, dil, groups;
};

/* Parses shapes CSV text: a header line naming at least the columns name, n, h, w, c, k, r, s,
 * stride, pad, dil, groups (any order; other columns ignored), then one row per line. Blank lines
 * and lines starting with '#' are skipped. *ret_rows is malloc'ed (free it); *ret_count rows. */
int cli_shapes_parse(const char *text, size_t len, struct cli_shape **ret_rows, size_t *ret_count,
                     char *why, size_t why_len);

/* The whole of the file at path, malloc'ed (free it), in *ret_data and *ret_len; 0, or a code
 * with why naming the file and the failure. */
int cli_read_file(const char *path, uint8_t **ret_data, size_t *ret_len, char *why, size_t why_len);

/* cli_shapes_parse() on the whole of the file at path; why names the file on failure. */
int cli_shapes_load(const char *path, struct cli_shape **ret_rows, size_t *ret_count, char *why,
                    size_t why_len);

/* The row called name, or NULL. */
const struct cli_shape *cli_shapes_find(const struct cli_shape *rows, size_t count,
                                        const char *name);

/* Sets the geometry of p from a row (square stride, symmetric padding, square dilation), leaving
 * dtype, layout, bias and activation as they are. */
void cli_shape_apply(const struct cli_shape *row, struct convd_problem *p);

#endif
