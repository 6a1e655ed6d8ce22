/*
 * The development library (gpu_dev.h): a process-global policy, its setters, and the
 * family-level entry points under it. Linked by tests and benchmarks, never by the daemon.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_dev.h"

struct convd_gpu_policy convd_gpu_dev_policy = CONVD_GPU_POLICY_DEFAULT;

/* Sets one knob if the policy with it passes the checks; restores it otherwise. */
static int dev_set(int *knob, int value)
{
    const int old = *knob;
    *knob = value;
    if (convd_gpu_policy_check(&convd_gpu_dev_policy, NULL, 0) != 0) {
        *knob = old;
        return CONVD_EINVAL;
    }
    return 0;
}

#define DEV_SETTER(name, field)                                                                    \
    int convd_gpu_tune_##name(int value)                                                           \
    {                                                                                              \
        return dev_set(&convd_gpu_dev_policy.field, value);                                        \
    }
DEV_SETTER(pdl, pdl)
DEV_SETTER(mma_cfg, mma_cfg)
DEV_SETTER(mma_tma, mma_tma)
DEV_SETTER(mma_stages, mma_stages)
DEV_SETTER(mma_prefetch, mma_prefetch)
DEV_SETTER(mma_pad, mma_pad)
DEV_SETTER(dw_direct, dw_direct)
DEV_SETTER(fma_gemm, fma_gemm)
DEV_SETTER(fma_outputs3, fma_outputs3)
DEV_SETTER(direct, direct)
DEV_SETTER(direct_nhwc, direct_nhwc)
DEV_SETTER(direct_prefetch, direct_prefetch)
DEV_SETTER(direct_outputs8, direct_outputs8)
DEV_SETTER(tf32, tf32)

int convd_gpu_tune_arg(const char *arg, char *why, size_t why_len)
{
    static const struct {
        const char *name;
        int (*set)(int);
    } knobs[] = {
        {"pdl", convd_gpu_tune_pdl},
        {"mma_cfg", convd_gpu_tune_mma_cfg},
        {"mma_tma", convd_gpu_tune_mma_tma},
        {"mma_stages", convd_gpu_tune_mma_stages},
        {"mma_prefetch", convd_gpu_tune_mma_prefetch},
        {"mma_pad", convd_gpu_tune_mma_pad},
        {"dw_direct", convd_gpu_tune_dw_direct},
        {"fma_gemm", convd_gpu_tune_fma_gemm},
        {"fma_outputs3", convd_gpu_tune_fma_outputs3},
        {"direct", convd_gpu_tune_direct},
        {"direct_nhwc", convd_gpu_tune_direct_nhwc},
        {"direct_prefetch", convd_gpu_tune_direct_prefetch},
        {"direct_outputs8", convd_gpu_tune_direct_outputs8},
        {"tf32", convd_gpu_tune_tf32},
    };
    const char *eq = arg != NULL ? strchr(arg, '=') : NULL;
    for (size_t i = 0; eq != NULL && i < sizeof(knobs) / sizeof(knobs[0]); i++)
        if (strlen(knobs[i].name) == (size_t)(eq - arg) &&
            strncmp(arg, knobs[i].name, (size_t)(eq - arg)) == 0) {
            char *end;
            const long v = strtol(eq + 1, &end, 10);
            if (end != eq + 1 && *end == '\0' && v >= -1000 && v <= 1000 &&
                knobs[i].set((int)v) == 0)
                return 0;
            if (why != NULL && why_len > 0)
                snprintf(why, why_len, "%s: not a value of knob %s", arg, knobs[i].name);
            return CONVD_EINVAL;
        }
    if (why != NULL && why_len > 0)
        snprintf(why, why_len, "%s: expected KNOB=VALUE with a knob of struct convd_gpu_policy",
                 arg != NULL ? arg : "(null)");
    return CONVD_EINVAL;
}

enum convd_gpu_family convd_gpu_route(const struct convd_problem *p)
{
    enum convd_gpu_family f = CONVD_GPU_FAMILY_GENERIC;
    (void)convd_gpu_rule(p, &convd_gpu_dev_policy, &f);
    return f;
}

int convd_gpu_family_check(const struct convd_problem *p, enum convd_gpu_family family, char *why,
                           size_t why_len)
{
    return convd_gpu_plan_check(p, family, &convd_gpu_dev_policy, why, why_len);
}

int convd_gpu_conv_family(const struct convd_problem *p, const struct convd_tensors *t,
                          size_t count, void *workspace, size_t workspace_bytes, void *stream,
                          enum convd_gpu_family family)
{
    return convd_gpu_run(p, t, count, workspace, workspace_bytes, stream, family,
                         &convd_gpu_dev_policy);
}

int convd_gpu_describe(const struct convd_problem *p, enum convd_gpu_family family, char *buf,
                       size_t len)
{
    return convd_gpu_plan_describe(p, family, &convd_gpu_dev_policy, buf, len);
}

int convd_gpu_dev_workspace(const struct convd_problem *p, size_t count, size_t *ret_bytes)
{
    return convd_gpu_plan_workspace(p, count, &convd_gpu_dev_policy, ret_bytes);
}

const char *convd_gpu_dev_rule(const struct convd_problem *p)
{
    return convd_gpu_rule(p, &convd_gpu_dev_policy, NULL);
}
