#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "mix.h"
#include "testutil.h"

uint64_t tu_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void tu_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

uint64_t tu_seed(void)
{
    static uint64_t seed;
    static int done;
    if (!done) {
        const char *env = getenv("CONVD_TEST_SEED");
        if (env != NULL && *env != '\0') {
            seed = strtoull(env, NULL, 0);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            seed = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40);
        }
        if (seed == 0)
            seed = MIX_GOLDEN64;
        fprintf(stderr, "test seed: CONVD_TEST_SEED=%llu\n", (unsigned long long)seed);
        done = 1;
    }
    return seed;
}

void tu_rng_init(struct tu_rng *g, uint64_t seed)
{
    g->s = seed ? seed : MIX_GOLDEN64;
}

uint64_t tu_rng_next(struct tu_rng *g)
{
    return mix_xorshift64s(&g->s);
}

int tu_rng_range(struct tu_rng *g, int lo, int hi)
{
    return lo + (int)(tu_rng_next(g) % (uint64_t)(hi - lo + 1));
}

float tu_rng_float(struct tu_rng *g)
{
    return (float)((double)(tu_rng_next(g) >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

void tu_fill_random(struct tu_rng *g, enum convd_dtype dtype, void *data, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        float v = tu_rng_float(g);
        if (i == 0 && v == 0.0f)
            v = 0.5f;
        switch (dtype) {
        case CONVD_DTYPE_FP32:
            ((float *)data)[i] = v;
            break;
        case CONVD_DTYPE_FP16:
            ((uint16_t *)data)[i] = convd_f32_to_f16(v);
            break;
        case CONVD_DTYPE_BF16:
            ((uint16_t *)data)[i] = convd_f32_to_bf16(v);
            break;
        }
    }
}

void tu_poison(void *data, size_t bytes)
{
    memset(data, 0xff, bytes);
}

int tu_memfd(const char *name, uint64_t size, unsigned seals)
{
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0 ||
        (seals != 0 && fcntl(fd, F_ADD_SEALS, (int)seals) != 0)) {
        fprintf(stderr, "tu_memfd(%s, %llu bytes, seals 0x%x): %s\n", name,
                (unsigned long long)size, seals, strerror(errno));
        abort();
    }
    return fd;
}

float tu_load(enum convd_dtype dtype, const void *data, size_t i)
{
    switch (dtype) {
    case CONVD_DTYPE_FP32:
        return ((const float *)data)[i];
    case CONVD_DTYPE_FP16:
        return convd_f16_to_f32(((const uint16_t *)data)[i]);
    case CONVD_DTYPE_BF16:
        return convd_bf16_to_f32(((const uint16_t *)data)[i]);
    }
    return NAN;
}

double tu_ref_act(const struct convd_problem *p, double y)
{
    switch (p->activation) {
    case CONVD_ACT_NONE:
        return y;
    case CONVD_ACT_RELU:
        return y < 0.0 ? 0.0 : y;
    case CONVD_ACT_CLAMP:
        return y < p->act_min ? p->act_min : y > p->act_max ? p->act_max : y;
    case CONVD_ACT_SILU:
        return y / (1.0 + exp(-y));
    case CONVD_ACT_HARDSWISH:
        return y * fmin(fmax(y + 3.0, 0.0), 6.0) / 6.0;
    case CONVD_ACT_GELU:
        return 0.5 * y * (1.0 + erf(y / sqrt(2.0)));
    case CONVD_ACT_GELU_TANH:
        return 0.5 * y *
               (1.0 + tanh(0.79788456080286536 /* sqrt(2 / pi) */ * (y + 0.044715 * y * y * y)));
    }
    abort();
}

void tu_set_activation(struct convd_problem *p, enum convd_activation act)
{
    p->activation = act;
    p->act_min = act == CONVD_ACT_CLAMP ? -0.25f : 0.0f;
    p->act_max = act == CONVD_ACT_CLAMP ? 0.5f : 0.0f;
}

void tu_random_activation(struct tu_rng *g, struct convd_problem *p)
{
    /* relu twice as often as each of the others: it is what most models use. */
    int a = tu_rng_range(g, 0, 7);
    p->activation = a == 7 ? CONVD_ACT_RELU : (enum convd_activation)a;
    p->act_min = p->act_max = 0.0f;
    if (p->activation == CONVD_ACT_CLAMP) {
        p->act_min = -0.125f * (float)tu_rng_range(g, 0, 4);
        p->act_max = p->act_min + 0.25f * (float)tu_rng_range(g, 1, 8);
    }
}

void tu_ref_conv(const struct convd_problem *p, const void *input, const void *weight,
                 const void *bias, float *ref)
{
    struct convd_problem_sizes z;
    if (convd_problem_sizes(p, &z, NULL, 0) != 0)
        abort();
    const int64_t N = p->n, H = p->h, W = p->w, C = p->c, K = p->k, R = p->r, S = p->s;
    const int64_t G = p->groups, cpg = C / G, kpg = K / G, OH = z.out_h, OW = z.out_w;
    const int nhwc = p->layout == CONVD_LAYOUT_NHWC;

    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    int64_t g = k / kpg;
                    double acc = p->has_bias ? tu_load(p->dtype, bias, (size_t)k) : 0.0;
                    for (int64_t c = 0; c < cpg; c++)
                        for (int64_t r = 0; r < R; r++)
                            for (int64_t s = 0; s < S; s++) {
                                int64_t ih = oh * p->stride_h - p->pad_top + r * p->dil_h;
                                int64_t iw = ow * p->stride_w - p->pad_left + s * p->dil_w;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W)
                                    continue;
                                int64_t ci = g * cpg + c;
                                size_t xi = nhwc ? (size_t)(((n * H + ih) * W + iw) * C + ci)
                                                 : (size_t)(((n * C + ci) * H + ih) * W + iw);
                                size_t wi = nhwc ? (size_t)(((k * R + r) * S + s) * cpg + c)
                                                 : (size_t)(((k * cpg + c) * R + r) * S + s);
                                acc += (double)tu_load(p->dtype, input, xi) *
                                       (double)tu_load(p->dtype, weight, wi);
                            }
                    acc = tu_ref_act(p, acc);
                    size_t yi = nhwc ? (size_t)(((n * OH + oh) * OW + ow) * K + k)
                                     : (size_t)(((n * K + k) * OH + oh) * OW + ow);
                    ref[yi] = (float)acc;
                }
}

double tu_rel_error(enum convd_dtype dtype, const void *out, const float *ref, size_t count,
                    size_t *ret_bad_index)
{
    double num = 0.0, den = 0.0, worst = -1.0;
    size_t worst_i = 0;
    for (size_t i = 0; i < count; i++) {
        double a = tu_load(dtype, out, i), r = ref[i];
        if (!isfinite(a) && isfinite(r)) {
            if (ret_bad_index != NULL)
                *ret_bad_index = i;
            return INFINITY;
        }
        double d = fabs(a - r);
        if (d > worst) {
            worst = d;
            worst_i = i;
        }
        num += d * d;
        den += r * r;
    }
    if (ret_bad_index != NULL)
        *ret_bad_index = worst_i;
    return sqrt(num) / (den > 1e-30 ? sqrt(den) : 1e-15);
}

double tu_tolerance(enum convd_dtype dtype)
{
    return dtype == CONVD_DTYPE_FP32 ? 1e-4 : 1e-2;
}

double tu_tolerance_of(const struct convd_problem *p)
{
    return p->dtype == CONVD_DTYPE_FP32 && p->allow_tf32 ? 3e-3 : tu_tolerance(p->dtype);
}

void tu_random_geometry(struct tu_rng *g, struct convd_problem *p)
{
    p->stride_h = tu_rng_range(g, 1, 2);
    p->stride_w = tu_rng_range(g, 1, 2);
    p->dil_h = tu_rng_range(g, 1, 2);
    p->dil_w = tu_rng_range(g, 1, 2);
    p->pad_top = tu_rng_range(g, 0, 2);
    p->pad_bottom = tu_rng_range(g, 0, 2);
    p->pad_left = tu_rng_range(g, 0, 2);
    p->pad_right = tu_rng_range(g, 0, 2);
}

void tu_random_problem(struct tu_rng *g, struct convd_problem *p, enum convd_dtype dtype,
                       enum convd_layout layout, int max_cpg)
{
    for (;;) {
        int groups = tu_rng_range(g, 1, 6);
        int cpg = tu_rng_range(g, 1, max_cpg);
        int kpg = tu_rng_range(g, 1, max_cpg);
        int r = tu_rng_range(g, 1, 5), s = tu_rng_range(g, 1, 5);
        convd_problem_init(p, tu_rng_range(g, 1, 3), tu_rng_range(g, 1, 13), tu_rng_range(g, 1, 13),
                           groups * cpg, groups * kpg, r, s, groups);
        tu_random_geometry(g, p);
        p->dtype = dtype ? dtype : (enum convd_dtype)tu_rng_range(g, 1, 3);
        p->layout = layout ? layout : (enum convd_layout)tu_rng_range(g, 1, 2);
        p->has_bias = tu_rng_range(g, 0, 1);
        tu_random_activation(g, p);
        if (convd_problem_check(p, NULL, 0) == 0)
            return;
    }
}
