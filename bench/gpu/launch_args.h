/* What convd-bench-launch and convd-launch-host share: the problem and count options, a clock
 * and a comparison for percentiles. */
#ifndef CONVD_BENCH_LAUNCH_ARGS_H
#define CONVD_BENCH_LAUNCH_ARGS_H

#include "convd_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* latency_b1_resnext: 1x128x56x56, 128 filters 3x3, 32 groups, pad 1, fp16 NHWC. */
void launch_args_default(struct convd_problem *p);

/* Reads the option at argv[*i] when it is one of --shape N,H,W,C,K,R,S,STRIDE,PAD,DIL,GROUPS,
 * --dtype, --layout or --iters N (advancing *i past its value): 1 when it was, 0 when it is
 * another option, -1 with a message on stderr when its value is bad. */
int launch_args_take(int argc, char **argv, int *i, struct convd_problem *p, long *iters);

/* CLOCK_MONOTONIC in microseconds. */
double launch_now_us(void);

/* qsort's comparison of doubles, ascending (the tools' percentiles). */
int launch_cmp_double(const void *a, const void *b);

#ifdef __cplusplus
}
#endif

#endif
