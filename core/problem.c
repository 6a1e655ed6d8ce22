/*
 * Validation and shape math of a convolution problem. Pure functions on the problem struct: the
 * daemon, the client library, the CPU backend and the GPU dispatcher all call these, so a problem
 * is judged the same way everywhere.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "convd/conv.h"
#include "conv_math.h"
#include "problem_priv.h"
#include "why.h"

void convd_problem_init(struct convd_problem *p, int32_t n, int32_t h, int32_t w, int32_t c,
                        int32_t k, int32_t r, int32_t s, int32_t groups)
{
    memset(p, 0, sizeof(*p));
    p->n = n;
    p->h = h;
    p->w = w;
    p->c = c;
    p->k = k;
    p->r = r;
    p->s = s;
    p->groups = groups;
    p->stride_h = p->stride_w = 1;
    p->dil_h = p->dil_w = 1;
    p->dtype = CONVD_DTYPE_FP32;
    p->layout = CONVD_LAYOUT_NCHW;
}

int64_t convd_out_dim(int64_t in, int64_t pad_lo, int64_t pad_hi, int64_t k, int64_t stride,
                      int64_t dil)
{
    return convd_math_out_dim(in, pad_lo, pad_hi, k, stride, dil);
}

size_t convd_dtype_size(enum convd_dtype dtype)
{
    switch (dtype) {
    case CONVD_DTYPE_FP32:
        return 4;
    case CONVD_DTYPE_FP16:
    case CONVD_DTYPE_BF16:
        return 2;
    }
    return 0;
}

/* a * b into *ret with overflow detection, for element and byte counts. */
static int mul_u64(uint64_t a, uint64_t b, uint64_t *ret)
{
    return __builtin_mul_overflow(a, b, ret) ? -1 : 0;
}

static int product(uint64_t *ret, int count, const int64_t *factors)
{
    uint64_t acc = 1;
    for (int i = 0; i < count; i++)
        if (mul_u64(acc, (uint64_t)factors[i], &acc) != 0)
            return -1;
    *ret = acc;
    return 0;
}

struct dim_rule {
    const char *name;
    int32_t value;
    int32_t lo, hi;
};

int convd_problem_check(const struct convd_problem *p, char *why, size_t why_len)
{
    if (p == NULL)
        return why_fail(why, why_len, CONVD_EINVAL, "problem is NULL");

    const struct dim_rule rules[] = {
        {"n", p->n, 1, CONVD_MAX_DIM},
        {"h", p->h, 1, CONVD_MAX_DIM},
        {"w", p->w, 1, CONVD_MAX_DIM},
        {"c", p->c, 1, CONVD_MAX_DIM},
        {"k", p->k, 1, CONVD_MAX_DIM},
        {"r", p->r, 1, CONVD_MAX_DIM},
        {"s", p->s, 1, CONVD_MAX_DIM},
        {"groups", p->groups, 1, CONVD_MAX_DIM},
        {"stride_h", p->stride_h, 1, CONVD_MAX_STRIDE},
        {"stride_w", p->stride_w, 1, CONVD_MAX_STRIDE},
        {"dil_h", p->dil_h, 1, CONVD_MAX_STRIDE},
        {"dil_w", p->dil_w, 1, CONVD_MAX_STRIDE},
        {"pad_top", p->pad_top, 0, CONVD_MAX_PAD},
        {"pad_bottom", p->pad_bottom, 0, CONVD_MAX_PAD},
        {"pad_left", p->pad_left, 0, CONVD_MAX_PAD},
        {"pad_right", p->pad_right, 0, CONVD_MAX_PAD},
    };
    for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++) {
        const struct dim_rule *d = &rules[i];
        if (d->value < d->lo || d->value > d->hi)
            return why_fail(why, why_len, CONVD_EBADSHAPE,
                            "field %s is %d, must be between %d and %d", d->name, (int)d->value,
                            (int)d->lo, (int)d->hi);
    }
    if (p->dtype != CONVD_DTYPE_FP32 && p->dtype != CONVD_DTYPE_FP16 &&
        p->dtype != CONVD_DTYPE_BF16)
        return why_fail(why, why_len, CONVD_EBADSHAPE,
                        "field dtype is %d, must be fp32 (1), fp16 (2) or bf16 (3)", (int)p->dtype);
    if (p->layout != CONVD_LAYOUT_NCHW && p->layout != CONVD_LAYOUT_NHWC)
        return why_fail(why, why_len, CONVD_EBADSHAPE,
                        "field layout is %d, must be nchw (1) or nhwc (2)", (int)p->layout);
    if (p->c % p->groups != 0)
        return why_fail(why, why_len, CONVD_EGROUPS,
                        "input channels c=%d are not divisible by groups=%d", (int)p->c,
                        (int)p->groups);
    if (p->k % p->groups != 0)
        return why_fail(why, why_len, CONVD_EGROUPS,
                        "output channels k=%d are not divisible by groups=%d", (int)p->k,
                        (int)p->groups);
    if (p->allow_tf32 && p->dtype != CONVD_DTYPE_FP32)
        return why_fail(why, why_len, CONVD_EBADSHAPE, "field allow_tf32 applies to fp32 only");
    if ((unsigned)p->activation > CONVD_ACT_GELU_TANH)
        return why_fail(why, why_len, CONVD_EBADSHAPE,
                        "field activation is %d, must be between none (0) and gelu_tanh (%d)",
                        (int)p->activation, (int)CONVD_ACT_GELU_TANH);
    if (p->activation == CONVD_ACT_CLAMP) {
        if (isnan(p->act_min) || isnan(p->act_max) || p->act_min > p->act_max)
            return why_fail(why, why_len, CONVD_EBADSHAPE,
                            "clamp bounds act_min=%g and act_max=%g must be numbers with act_min "
                            "<= act_max",
                            (double)p->act_min, (double)p->act_max);
    } else if (p->act_min != 0.0f || p->act_max != 0.0f) {
        return why_fail(why, why_len, CONVD_EBADSHAPE,
                        "fields act_min and act_max apply to the clamp activation only, and are "
                        "%g and %g with %s",
                        (double)p->act_min, (double)p->act_max,
                        convd_activation_name(p->activation));
    }

    int64_t oh = convd_math_out_dim(p->h, p->pad_top, p->pad_bottom, p->r, p->stride_h, p->dil_h);
    if (oh <= 0)
        return why_fail(why, why_len, CONVD_EBADSHAPE,
                        "filter height r=%d with dil_h=%d does not fit input height h=%d "
                        "padded by %d+%d",
                        (int)p->r, (int)p->dil_h, (int)p->h, (int)p->pad_top, (int)p->pad_bottom);
    int64_t ow = convd_math_out_dim(p->w, p->pad_left, p->pad_right, p->s, p->stride_w, p->dil_w);
    if (ow <= 0)
        return why_fail(why, why_len, CONVD_EBADSHAPE,
                        "filter width s=%d with dil_w=%d does not fit input width w=%d "
                        "padded by %d+%d",
                        (int)p->s, (int)p->dil_w, (int)p->w, (int)p->pad_left, (int)p->pad_right);
    if (oh > CONVD_MAX_DIM || ow > CONVD_MAX_DIM)
        return why_fail(why, why_len, CONVD_EBADSHAPE, "output of %lldx%lld is too large",
                        (long long)oh, (long long)ow);

    const uint64_t esz = convd_dtype_size(p->dtype);
    const struct {
        const char *name;
        int64_t f[4];
    } tensors[] = {
        {"input", {p->n, p->h, p->w, p->c}},
        {"weight", {p->k, p->r, p->s, p->c / p->groups}},
        {"output", {p->n, oh, ow, p->k}},
    };
    for (size_t i = 0; i < 3; i++) {
        uint64_t elems, bytes;
        if (product(&elems, 4, tensors[i].f) != 0 || mul_u64(elems, esz, &bytes) != 0 ||
            bytes > CONVD_MAX_TENSOR_BYTES)
            return why_fail(why, why_len, CONVD_EBADSHAPE,
                            "%s tensor of %lld x %lld x %lld x %lld elements exceeds %llu bytes",
                            tensors[i].name, (long long)tensors[i].f[0], (long long)tensors[i].f[1],
                            (long long)tensors[i].f[2], (long long)tensors[i].f[3],
                            (unsigned long long)CONVD_MAX_TENSOR_BYTES);
    }
    return 0;
}

void convd_problem_sizes_of(const struct convd_problem *p, struct convd_problem_sizes *ret_sizes)
{
    /* Every product below was bounded by convd_problem_check(). */
    struct convd_problem_sizes z;
    const uint64_t esz = convd_dtype_size(p->dtype);
    z.out_h =
        (int32_t)convd_math_out_dim(p->h, p->pad_top, p->pad_bottom, p->r, p->stride_h, p->dil_h);
    z.out_w =
        (int32_t)convd_math_out_dim(p->w, p->pad_left, p->pad_right, p->s, p->stride_w, p->dil_w);
    z.input_elems = (uint64_t)p->n * p->h * p->w * p->c;
    z.weight_elems = (uint64_t)p->k * p->r * p->s * (p->c / p->groups);
    z.bias_elems = p->has_bias ? (uint64_t)p->k : 0;
    z.output_elems = (uint64_t)p->n * z.out_h * z.out_w * p->k;
    z.input_bytes = z.input_elems * esz;
    z.weight_bytes = z.weight_elems * esz;
    z.bias_bytes = z.bias_elems * esz;
    z.output_bytes = z.output_elems * esz;
    /* 2 * output elements * taps per output; saturate rather than wrap for absurd sizes. */
    uint64_t taps = (uint64_t)p->r * p->s * (p->c / p->groups);
    if (mul_u64(z.output_elems, taps, &z.flops) != 0 || mul_u64(z.flops, 2, &z.flops) != 0)
        z.flops = UINT64_MAX;
    *ret_sizes = z;
}

int convd_problem_sizes(const struct convd_problem *p, struct convd_problem_sizes *ret_sizes,
                        char *why, size_t why_len)
{
    int rc = convd_problem_check(p, why, why_len);
    if (rc != 0)
        return rc;
    convd_problem_sizes_of(p, ret_sizes);
    return 0;
}

bool convd_problem_same(const struct convd_problem *a, const struct convd_problem *b)
{
    return a->n == b->n && a->h == b->h && a->w == b->w && a->c == b->c && a->k == b->k &&
           a->r == b->r && a->s == b->s && a->groups == b->groups && a->stride_h == b->stride_h &&
           a->stride_w == b->stride_w && a->pad_top == b->pad_top &&
           a->pad_bottom == b->pad_bottom && a->pad_left == b->pad_left &&
           a->pad_right == b->pad_right && a->dil_h == b->dil_h && a->dil_w == b->dil_w &&
           a->dtype == b->dtype && a->layout == b->layout && a->has_bias == b->has_bias &&
           a->allow_tf32 == b->allow_tf32 && a->activation == b->activation &&
           a->act_min == b->act_min && a->act_max == b->act_max;
}

char *convd_problem_str(const struct convd_problem *p, char *buf, size_t len)
{
    char act[48] = "";
    if (p->activation == CONVD_ACT_CLAMP)
        snprintf(act, sizeof(act), " clamp(%g,%g)", (double)p->act_min, (double)p->act_max);
    else if (p->activation != CONVD_ACT_NONE)
        snprintf(act, sizeof(act), " %s", convd_activation_name(p->activation));
    snprintf(buf, len, "n%d c%dx%dx%d k%d %dx%d g%d s%d,%d p%d,%d,%d,%d d%d,%d %s %s%s%s%s",
             (int)p->n, (int)p->c, (int)p->h, (int)p->w, (int)p->k, (int)p->r, (int)p->s,
             (int)p->groups, (int)p->stride_h, (int)p->stride_w, (int)p->pad_top,
             (int)p->pad_bottom, (int)p->pad_left, (int)p->pad_right, (int)p->dil_h, (int)p->dil_w,
             convd_dtype_name(p->dtype), convd_layout_name(p->layout), p->has_bias ? " bias" : "",
             act, p->allow_tf32 ? " tf32" : "");
    return buf;
}

static const struct {
    const char *name;
    enum convd_activation act;
    float lo, hi;
} act_names[] = {
    {"none", CONVD_ACT_NONE, 0, 0},           {"relu", CONVD_ACT_RELU, 0, 0},
    {"clamp", CONVD_ACT_CLAMP, 0, 0},         {"silu", CONVD_ACT_SILU, 0, 0},
    {"hardswish", CONVD_ACT_HARDSWISH, 0, 0}, {"gelu", CONVD_ACT_GELU, 0, 0},
    {"gelu_tanh", CONVD_ACT_GELU_TANH, 0, 0}, {"relu6", CONVD_ACT_CLAMP, 0, 6},
    {"swish", CONVD_ACT_SILU, 0, 0},
};

const char *convd_activation_name(enum convd_activation act)
{
    for (size_t i = 0; i < sizeof(act_names) / sizeof(act_names[0]); i++)
        if (act_names[i].act == act)
            return act_names[i].name;
    return "unknown";
}

int convd_activation_parse(const char *s, struct convd_problem *p)
{
    if (s == NULL || p == NULL)
        return CONVD_EINVAL;
    for (size_t i = 0; i < sizeof(act_names) / sizeof(act_names[0]); i++)
        if (strcasecmp(s, act_names[i].name) == 0) {
            p->activation = act_names[i].act;
            p->act_min = act_names[i].lo;
            p->act_max = act_names[i].hi;
            return 0;
        }
    return CONVD_EINVAL;
}

const char *convd_dtype_name(enum convd_dtype dtype)
{
    switch (dtype) {
    case CONVD_DTYPE_FP32:
        return "fp32";
    case CONVD_DTYPE_FP16:
        return "fp16";
    case CONVD_DTYPE_BF16:
        return "bf16";
    }
    return "unknown";
}

const char *convd_layout_name(enum convd_layout layout)
{
    switch (layout) {
    case CONVD_LAYOUT_NCHW:
        return "nchw";
    case CONVD_LAYOUT_NHWC:
        return "nhwc";
    }
    return "unknown";
}

int convd_dtype_parse(const char *s, enum convd_dtype *ret_dtype)
{
    static const struct {
        const char *name;
        enum convd_dtype dtype;
    } names[] = {
        {"fp32", CONVD_DTYPE_FP32}, {"float32", CONVD_DTYPE_FP32},  {"float", CONVD_DTYPE_FP32},
        {"fp16", CONVD_DTYPE_FP16}, {"float16", CONVD_DTYPE_FP16},  {"half", CONVD_DTYPE_FP16},
        {"bf16", CONVD_DTYPE_BF16}, {"bfloat16", CONVD_DTYPE_BF16},
    };
    if (s == NULL || ret_dtype == NULL)
        return CONVD_EINVAL;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcasecmp(s, names[i].name) == 0) {
            *ret_dtype = names[i].dtype;
            return 0;
        }
    return CONVD_EINVAL;
}

int convd_layout_parse(const char *s, enum convd_layout *ret_layout)
{
    if (s == NULL || ret_layout == NULL)
        return CONVD_EINVAL;
    if (strcasecmp(s, "nchw") == 0) {
        *ret_layout = CONVD_LAYOUT_NCHW;
        return 0;
    }
    if (strcasecmp(s, "nhwc") == 0) {
        *ret_layout = CONVD_LAYOUT_NHWC;
        return 0;
    }
    return CONVD_EINVAL;
}
