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

/* Every knob of struct convd_gpu_policy, once: the setters and convd_gpu_tune_arg's table. */
#define DEV_KNOBS(X)                                                                               \
    X(pdl)                                                                                         \
    X(mma_cfg)                                                                                     \
    X(mma_tma)                                                                                     \
    X(mma_stages)                                                                                  \
    X(mma_prefetch)                                                                                \
    X(mma_pad)                                                                                     \
    X(dw_direct)                                                                                   \
    X(fma_gemm)                                                                                    \
    X(fma_outputs3)                                                                                \
    X(direct)                                                                                      \
    X(direct_nhwc)                                                                                 \
    X(direct_prefetch)                                                                             \
    X(direct_outputs8)                                                                             \
    X(tf32)                                                                                        \
    X(mma_tf32)                                                                                    \
    X(mma_split_c)                                                                                 \
    X(mma_partial_n)                                                                               \
    X(gemv)                                                                                        \
    X(fma_split_k)                                                                                 \
    X(stem)

#define DEV_SETTER(name)                                                                           \
    int convd_gpu_tune_##name(int value)                                                           \
    {                                                                                              \
        return dev_set(&convd_gpu_dev_policy.name, value);                                         \
    }
DEV_KNOBS(DEV_SETTER)
#undef DEV_SETTER

int convd_gpu_tune_arg(const char *arg, char *why, size_t why_len)
{
    static const struct {
        const char *name;
        int (*set)(int);
    } knobs[] = {
#define DEV_ENTRY(name) {#name, convd_gpu_tune_##name},
        DEV_KNOBS(DEV_ENTRY)
#undef DEV_ENTRY
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
