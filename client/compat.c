/*
 * The functions of libconvd-client.so's first ABI (node CONVD_0) whose struct convd_problem grew
 * in CONVD_0.2, when `bool relu` gave way to `activation` and its bounds. A program linked
 * against the old header calls these, with the old layout; each converts and calls the current
 * function. The library's rules for growing a struct the caller fills without a size field are in
 * convd.h ("Compatibility"). Only the shared library has them: a static link has one version.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "client_priv.h"
#include "convd/convd.h"

/* struct convd_problem as CONVD_0 laid it out. */
struct problem_v0 {
    int32_t n, h, w;
    int32_t c, k;
    int32_t r, s;
    int32_t groups;
    int32_t stride_h, stride_w;
    int32_t pad_top, pad_bottom, pad_left, pad_right;
    int32_t dil_h, dil_w;
    enum convd_dtype dtype;
    enum convd_layout layout;
    bool has_bias;
    bool relu;
    bool allow_tf32;
};

/* struct convd_conv_args as CONVD_0 laid it out. */
struct conv_args_v0 {
    size_t struct_size;
    struct problem_v0 problem;
    struct convd_tensor input, weight, bias, output;
    unsigned priority;
    uint64_t timeout_us;
};

/* The geometry fields come first in both layouts, in the same order. */
_Static_assert(offsetof(struct problem_v0, dtype) == offsetof(struct convd_problem, dtype),
               "problem prefix");

static void from_v0(const struct problem_v0 *o, struct convd_problem *p)
{
    memset(p, 0, sizeof(*p));
    memcpy(p, o, offsetof(struct problem_v0, has_bias));
    p->has_bias = o->has_bias;
    p->allow_tf32 = o->allow_tf32;
    p->activation = o->relu ? CONVD_ACT_RELU : CONVD_ACT_NONE;
}

/* The old names, bound to CONVD_0; their own names stay local (the version script). */
void compat0_problem_init(struct problem_v0 *p, int32_t n, int32_t h, int32_t w, int32_t c,
                          int32_t k, int32_t r, int32_t s, int32_t groups);
int compat0_problem_check(const struct problem_v0 *p, char *why, size_t why_len);
int compat0_problem_sizes(const struct problem_v0 *p, struct convd_problem_sizes *ret_sizes,
                          char *why, size_t why_len);
bool compat0_problem_same(const struct problem_v0 *a, const struct problem_v0 *b);
char *compat0_problem_str(const struct problem_v0 *p, char *buf, size_t len);
int compat0_conv(convd_client *c, const struct problem_v0 *p, const void *input, const void *weight,
                 const void *bias, void *output);
int compat0_conv_submit(convd_client *c, const struct conv_args_v0 *args, uint64_t *ret_id);

__attribute__((symver("convd_problem_init@CONVD_0"))) void
compat0_problem_init(struct problem_v0 *p, int32_t n, int32_t h, int32_t w, int32_t c, int32_t k,
                     int32_t r, int32_t s, int32_t groups)
{
    struct convd_problem q;
    convd_problem_init(&q, n, h, w, c, k, r, s, groups);
    memset(p, 0, sizeof(*p));
    memcpy(p, &q, offsetof(struct problem_v0, has_bias));
}

__attribute__((symver("convd_problem_check@CONVD_0"))) int
compat0_problem_check(const struct problem_v0 *p, char *why, size_t why_len)
{
    if (p == NULL)
        return convd_problem_check(NULL, why, why_len);
    struct convd_problem q;
    from_v0(p, &q);
    return convd_problem_check(&q, why, why_len);
}

__attribute__((symver("convd_problem_sizes@CONVD_0"))) int
compat0_problem_sizes(const struct problem_v0 *p, struct convd_problem_sizes *ret_sizes, char *why,
                      size_t why_len)
{
    if (p == NULL)
        return convd_problem_sizes(NULL, ret_sizes, why, why_len);
    struct convd_problem q;
    from_v0(p, &q);
    return convd_problem_sizes(&q, ret_sizes, why, why_len);
}

__attribute__((symver("convd_problem_same@CONVD_0"))) bool
compat0_problem_same(const struct problem_v0 *a, const struct problem_v0 *b)
{
    struct convd_problem qa, qb;
    from_v0(a, &qa);
    from_v0(b, &qb);
    return convd_problem_same(&qa, &qb);
}

__attribute__((symver("convd_problem_str@CONVD_0"))) char *
compat0_problem_str(const struct problem_v0 *p, char *buf, size_t len)
{
    struct convd_problem q;
    from_v0(p, &q);
    return convd_problem_str(&q, buf, len);
}

__attribute__((symver("convd_conv@CONVD_0"))) int
compat0_conv(convd_client *c, const struct problem_v0 *p, const void *input, const void *weight,
             const void *bias, void *output)
{
    if (p == NULL)
        return convd_conv(c, NULL, input, weight, bias, output);
    struct convd_problem q;
    from_v0(p, &q);
    return convd_conv(c, &q, input, weight, bias, output);
}

__attribute__((symver("convd_conv_submit@CONVD_0"))) int
compat0_conv_submit(convd_client *c, const struct conv_args_v0 *args, uint64_t *ret_id)
{
    if (c == NULL || args == NULL)
        return convd_conv_submit(c, NULL, ret_id);
    /* The old rule: struct_size reaches at least the end of output, and the bytes past the old
     * struct (a header newer than this layout: impossible for a program bound to CONVD_0) are
     * refused by the current function's own check of struct_size. */
    const size_t need = offsetof(struct conv_args_v0, output) + sizeof(args->output);
    if (args->struct_size < need || args->struct_size > sizeof(struct conv_args_v0))
        return cl_fail(c, CONVD_EINVAL,
                       "args struct_size is %zu, expected %zu (at least %zu): initialise the "
                       "arguments with CONVD_CONV_ARGS_INIT",
                       args->struct_size, sizeof(struct conv_args_v0), need);
    struct conv_args_v0 o;
    memset(&o, 0, sizeof(o));
    memcpy(&o, args, args->struct_size);
    struct convd_conv_args a = CONVD_CONV_ARGS_INIT;
    from_v0(&o.problem, &a.problem);
    a.input = o.input;
    a.weight = o.weight;
    a.bias = o.bias;
    a.output = o.output;
    a.priority = o.priority;
    a.timeout_us = o.timeout_us;
    return convd_conv_submit(c, &a, ret_id);
}
