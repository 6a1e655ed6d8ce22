/*
 * The development library (convd_gpu_dev): what tests, benchmarks and sweeps use to steer the
 * kernels, kept out of the production library that the daemon links. It holds one process-global
 * policy (convd_gpu_dev_policy, starting as convd_gpu_policy_default), setters for each of its
 * knobs, and the family-level entry points of gpu_kernels.h under that policy. Not thread-safe:
 * set the knobs before running work that reads them.
 */
#ifndef CONVD_GPU_DEV_H
#define CONVD_GPU_DEV_H

#include "gpu_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

extern struct convd_gpu_policy convd_gpu_dev_policy;

/* convd_gpu_rule() under the development policy: the family it routes p to (never AUTO). */
enum convd_gpu_family convd_gpu_route(const struct convd_problem *p);

/* convd_gpu_plan_check(), convd_gpu_run(), convd_gpu_plan_describe() and
 * convd_gpu_plan_workspace() under the development policy. */
int convd_gpu_family_check(const struct convd_problem *p, enum convd_gpu_family family, char *why,
                           size_t why_len);
int convd_gpu_conv_family(const struct convd_problem *p, const struct convd_tensors *t,
                          size_t count, void *workspace, size_t workspace_bytes, void *stream,
                          enum convd_gpu_family family);
int convd_gpu_describe(const struct convd_problem *p, enum convd_gpu_family family, char *buf,
                       size_t len);
int convd_gpu_dev_workspace(const struct convd_problem *p, size_t count, size_t *ret_bytes);
/* convd_gpu_rule() under the development policy. */
const char *convd_gpu_dev_rule(const struct convd_problem *p);

/* Setters of the development policy's knobs, one per field of struct convd_gpu_policy (named
 * after it; gpu_kernels.h says what each value does). Each checks the value against the policy's
 * rules (convd_gpu_policy_check) and returns 0, or CONVD_EINVAL leaving the knob as it was. */
int convd_gpu_tune_pdl(int mode);
int convd_gpu_tune_mma_cfg(int cfg);
int convd_gpu_tune_mma_tma(int mode);
int convd_gpu_tune_mma_stages(int n);
int convd_gpu_tune_mma_prefetch(int mode);
int convd_gpu_tune_mma_pad(int mode);
int convd_gpu_tune_dw_direct(int mode);
int convd_gpu_tune_fma_gemm(int mode);
int convd_gpu_tune_fma_outputs3(int mode);
int convd_gpu_tune_direct(int mode);
int convd_gpu_tune_direct_nhwc(int mode);
int convd_gpu_tune_direct_prefetch(int mode);
int convd_gpu_tune_direct_outputs8(int mode);
int convd_gpu_tune_tf32(int mode);
int convd_gpu_tune_mma_tf32(int mode);
int convd_gpu_tune_mma_split_c(int mode);
int convd_gpu_tune_mma_partial_n(int mode);
int convd_gpu_tune_gemv(int mode);
int convd_gpu_tune_fma_split_k(int mode);
int convd_gpu_tune_stem(int mode);

/* "KNOB=VALUE" (a field of struct convd_gpu_policy, a whole number): that knob's setter. 0, or
 * CONVD_EINVAL with the reason in why (an unknown knob, or a value the setter refuses). For the
 * --tune options of the tools. */
int convd_gpu_tune_arg(const char *arg, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif
