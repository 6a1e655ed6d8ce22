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

/* Applies one problem option by name to p: "n", "c", "h", "w", "k", "r", "s", "groups",
 * "stride", "pad", "dilation", "dtype", "layout", "bias", "relu" (the last two take no value;
 * value may be NULL). Other fields stay as they are. Unknown names fail. */
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

/* The row called name, or NULL. */
const struct cli_shape *cli_shapes_find(const struct cli_shape *rows, size_t count,
                                        const char *name);

/* Sets the geometry of p from a row (square stride, symmetric padding, square dilation), leaving
 * dtype, layout, bias and relu as they are. */
void cli_shape_apply(const struct cli_shape *row, struct convd_problem *p);

#endif
