/*
 * convd_cpu_conv() against the naive double-precision reference (tu_ref_conv) on fresh random
 * data: random problems in every dtype and layout, targeted shapes for each path the planner
 * can pick, every ISA variant this CPU runs, thread-count independence, the group-slicing
 * identity, argument errors and concurrent callers. Outputs are poisoned first (NaN) and guarded
 * at both ends, so an unwritten or an out-of-range element fails.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>

#include "cpu_internal.h"
#include "testutil.h"

#define GUARD_BYTES 256

static struct tu_rng rng;

static int setup(void **state)
{
    (void)state;
    tu_rng_init(&rng, tu_seed());
    return 0;
}

/* Tensors of one problem, output surrounded by guard bytes. */
struct tensors {
    struct convd_problem p;
    struct convd_problem_sizes z;
    void *input, *weight, *bias;
    uint8_t *out_block; /* guard | output | guard */
    void *output;
    float *ref;
};

static void tensors_make(struct tensors *t, const struct convd_problem *p, struct tu_rng *g)
{
    memset(t, 0, sizeof(*t));
    t->p = *p;
    assert_int_equal(convd_problem_sizes(p, &t->z, NULL, 0), 0);
    t->input = malloc(t->z.input_bytes);
    t->weight = malloc(t->z.weight_bytes);
    t->bias = malloc(p->k * convd_dtype_size(p->dtype));
    t->out_block = malloc(t->z.output_bytes + 2 * GUARD_BYTES);
    t->ref = malloc(t->z.output_elems * sizeof(float));
    assert_non_null(t->input);
    assert_non_null(t->weight);
    assert_non_null(t->bias);
    assert_non_null(t->out_block);
    assert_non_null(t->ref);
    t->output = t->out_block + GUARD_BYTES;
    tu_fill_random(g, p->dtype, t->input, t->z.input_elems);
    tu_fill_random(g, p->dtype, t->weight, t->z.weight_elems);
    tu_fill_random(g, p->dtype, t->bias, (size_t)p->k);
    tu_ref_conv(p, t->input, t->weight, p->has_bias ? t->bias : NULL, t->ref);
}

static void tensors_poison(struct tensors *t)
{
    memset(t->out_block, 0xa5, GUARD_BYTES);
    memset(t->out_block + GUARD_BYTES + t->z.output_bytes, 0x5a, GUARD_BYTES);
    tu_poison(t->output, t->z.output_bytes);
}

static void tensors_free(struct tensors *t)
{
    free(t->input);
    free(t->weight);
    free(t->bias);
    free(t->out_block);
    free(t->ref);
}

static void guards_intact(const struct tensors *t)
{
    for (size_t i = 0; i < GUARD_BYTES; i++) {
        assert_int_equal(t->out_block[i], 0xa5);
        assert_int_equal(t->out_block[GUARD_BYTES + t->z.output_bytes + i], 0x5a);
    }
}

static int tensors_run(struct tensors *t, int threads, const struct cpu_isa *isa,
                       enum cpu_algo algo)
{
    struct convd_tensors ct = {
        .input = t->input,
        .weight = t->weight,
        .bias = t->p.has_bias ? t->bias : NULL,
        .output = t->output,
    };
    tensors_poison(t);
    return cpu_conv_ex(&t->p, &ct, threads, isa, algo);
}

static const char *algo_name(enum cpu_algo algo)
{
    return algo == CPU_ALGO_PLANAR ? "planar" : algo == CPU_ALGO_NHWC_CV ? "nhwc-cv" : "auto";
}

/* Runs p with `isa`, `threads` and `algo` (0: the planner's choice) and compares with the
 * reference; prints the problem on a failure. */
static void check_problem_algo(const struct convd_problem *p, int threads,
                               const struct cpu_isa *isa, enum cpu_algo algo)
{
    struct tensors t;
    tensors_make(&t, p, &rng);
    int rc = tensors_run(&t, threads, isa, algo);
    size_t bad = 0;
    double err = rc == 0 ? tu_rel_error(p->dtype, t.output, t.ref, t.z.output_elems, &bad) : 1.0;
    if (rc != 0 || !(err <= tu_tolerance(p->dtype))) {
        char buf[160];
        print_error("%s isa %s algo %s threads %d: rc %d, rel error %g (tolerance %g), element "
                    "%zu: %g vs %g\n",
                    convd_problem_str(p, buf, sizeof(buf)), isa->name, algo_name(algo), threads, rc,
                    err, tu_tolerance(p->dtype), bad, (double)tu_load(p->dtype, t.output, bad),
                    (double)t.ref[bad]);
        fail();
    }
    guards_intact(&t);
    tensors_free(&t);
}

/* Every algorithm that runs p with this ISA: the planner's choice, and the general planar path
 * when the planner picked a specialised one. */
static void check_problem_isa(const struct convd_problem *p, int threads, const struct cpu_isa *isa)
{
    struct cpu_plan plan;
    assert_int_equal(cpu_plan_init(p, isa, 0, &plan), 0);
    check_problem_algo(p, threads, isa, 0);
    if (plan.algo != CPU_ALGO_PLANAR)
        check_problem_algo(p, threads, isa, CPU_ALGO_PLANAR);
}

static void check_problem(const struct convd_problem *p, int threads)
{
    check_problem_isa(p, threads, cpu_isa_best());
}

/* The problem in every dtype and layout, plain and with a bias and an activation (a different
 * one for each dtype-layout pair: all six over the six). */
static void check_all_variants(struct convd_problem p, int threads)
{
    for (int dt = CONVD_DTYPE_FP32; dt <= CONVD_DTYPE_BF16; dt++)
        for (int lay = CONVD_LAYOUT_NCHW; lay <= CONVD_LAYOUT_NHWC; lay++)
            for (int epi = 0; epi < 2; epi++) {
                p.dtype = (enum convd_dtype)dt;
                p.layout = (enum convd_layout)lay;
                p.has_bias = epi;
                tu_set_activation(&p, epi ? (enum convd_activation)(1 + ((dt - 1) * 2 + lay - 1))
                                          : CONVD_ACT_NONE);
                check_problem(&p, threads);
            }
}

static void test_random_problems(void **state)
{
    (void)state;
    for (int dt = CONVD_DTYPE_FP32; dt <= CONVD_DTYPE_BF16; dt++)
        for (int lay = CONVD_LAYOUT_NCHW; lay <= CONVD_LAYOUT_NHWC; lay++)
            for (int i = 0; i < 40; i++) {
                struct convd_problem p;
                tu_random_problem(&rng, &p, (enum convd_dtype)dt, (enum convd_layout)lay,
                                  i % 2 ? 6 : 26);
                check_problem(&p, tu_rng_range(&rng, 1, 4));
            }
}

/* Each activation, in every dtype and layout, on every ISA this CPU runs: against the test's
 * own double-precision definitions (tu_ref_act). */
static void test_every_activation(void **state)
{
    (void)state;
    for (size_t k = 0; cpu_isa_list[k] != NULL; k++) {
        const struct cpu_isa *isa = cpu_isa_find(cpu_isa_list[k]->name);
        if (isa == NULL)
            continue;
        for (int act = CONVD_ACT_NONE; act <= CONVD_ACT_GELU_TANH; act++)
            for (int dt = CONVD_DTYPE_FP32; dt <= CONVD_DTYPE_BF16; dt++)
                for (int lay = CONVD_LAYOUT_NCHW; lay <= CONVD_LAYOUT_NHWC; lay++) {
                    struct convd_problem p;
                    tu_random_problem(&rng, &p, (enum convd_dtype)dt, (enum convd_layout)lay,
                                      act % 2 ? 4 : 20);
                    tu_set_activation(&p, (enum convd_activation)act);
                    check_problem_isa(&p, tu_rng_range(&rng, 1, 3), isa);
                }
    }
}

/* Every ISA variant this CPU can run, on random problems of both layouts. */
static void test_every_isa(void **state)
{
    (void)state;
    for (size_t k = 0; cpu_isa_list[k] != NULL; k++) {
        const struct cpu_isa *isa = cpu_isa_find(cpu_isa_list[k]->name);
        if (isa == NULL)
            continue;
        for (int i = 0; i < 30; i++) {
            struct convd_problem p;
            tu_random_problem(&rng, &p, 0, 0, i % 3 ? 8 : 40);
            check_problem_isa(&p, tu_rng_range(&rng, 1, 3), isa);
        }
    }
}

static struct convd_problem grouped(int n, int h, int w, int cpg, int kpg, int groups, int r,
                                    int s);

/* The channel-vectorised NHWC kernel on every ISA: each group size it takes, channel counts
 * that leave a partial vector, borders, strides, dilations and every dtype. */
static void test_channel_vectorised(void **state)
{
    (void)state;
    const int mm[][2] = {{1, 1}, {2, 2}, {4, 4}, {8, 8}, {16, 16}, {1, 2}, {1, 4}};
    for (size_t k = 0; cpu_isa_list[k] != NULL; k++) {
        const struct cpu_isa *isa = cpu_isa_find(cpu_isa_list[k]->name);
        if (isa == NULL)
            continue;
        for (size_t i = 0; i < sizeof(mm) / sizeof(mm[0]); i++) {
            for (int it = 0; it < 6; it++) {
                int groups = tu_rng_range(&rng, 1, 40 / mm[i][1] + 1);
                struct convd_problem p = grouped(
                    tu_rng_range(&rng, 1, 2), tu_rng_range(&rng, 1, 14), tu_rng_range(&rng, 1, 30),
                    mm[i][0], mm[i][1], groups, tu_rng_range(&rng, 1, 5), tu_rng_range(&rng, 1, 5));
                p.layout = CONVD_LAYOUT_NHWC;
                p.dtype = (enum convd_dtype)tu_rng_range(&rng, 1, 3);
                p.stride_h = tu_rng_range(&rng, 1, 2);
                p.stride_w = tu_rng_range(&rng, 1, 3);
                p.dil_h = tu_rng_range(&rng, 1, 2);
                p.dil_w = tu_rng_range(&rng, 1, 2);
                p.pad_left = tu_rng_range(&rng, 0, 3);
                p.pad_right = tu_rng_range(&rng, 0, 1);
                p.pad_top = tu_rng_range(&rng, 0, 2);
                p.has_bias = tu_rng_range(&rng, 0, 1);
                tu_random_activation(&rng, &p);
                if (convd_problem_check(&p, NULL, 0) != 0)
                    continue;
                struct cpu_plan plan;
                if (cpu_plan_init(&p, isa, CPU_ALGO_NHWC_CV, &plan) != 0)
                    continue; /* M = 16 needs 16-float vectors */
                check_problem_algo(&p, tu_rng_range(&rng, 1, 3), isa, CPU_ALGO_NHWC_CV);
            }
        }
    }
}

static struct convd_problem grouped(int n, int h, int w, int cpg, int kpg, int groups, int r, int s)
{
    struct convd_problem p;
    convd_problem_init(&p, n, h, w, cpg * groups, kpg * groups, r, s, groups);
    p.pad_top = p.pad_bottom = r / 2;
    p.pad_left = p.pad_right = s / 2;
    return p;
}

static void test_depthwise(void **state)
{
    (void)state;
    check_all_variants(grouped(2, 11, 13, 1, 1, 37, 3, 3), 2);
    check_all_variants(grouped(1, 9, 20, 1, 1, 16, 5, 5), 2);
    struct convd_problem p = grouped(1, 15, 17, 1, 1, 48, 3, 3);
    p.stride_h = p.stride_w = 2;
    check_all_variants(p, 3);
    check_all_variants(grouped(1, 12, 12, 1, 1, 24, 7, 7), 2);
}

static void test_channels_per_group(void **state)
{
    (void)state;
    const int cpgs[] = {1, 2, 3, 5, 24};
    for (size_t i = 0; i < sizeof(cpgs) / sizeof(cpgs[0]); i++)
        check_all_variants(grouped(1, 10, 9, cpgs[i], cpgs[i], 4, 3, 3), 2);
    /* larger cpg, as in ResNeXt's later stages and ShuffleNet's grouped 1x1 */
    check_all_variants(grouped(1, 7, 7, 32, 32, 3, 3, 3), 2);
    check_all_variants(grouped(1, 6, 5, 80, 80, 3, 1, 1), 2);
}

static void test_kpg_not_cpg(void **state)
{
    (void)state;
    check_all_variants(grouped(1, 9, 11, 1, 2, 32, 3, 3), 2); /* channel multiplier 2 */
    check_all_variants(grouped(2, 8, 8, 3, 5, 3, 3, 3), 2);
    check_all_variants(grouped(1, 8, 7, 5, 2, 4, 3, 3), 2);
    check_all_variants(grouped(1, 6, 9, 24, 8, 2, 3, 3), 2);
    check_all_variants(grouped(1, 6, 6, 4, 48, 2, 3, 3), 2);
    check_all_variants(grouped(1, 5, 7, 2, 19, 3, 1, 1), 2);
}

static void test_pointwise_and_dense(void **state)
{
    (void)state;
    check_all_variants(grouped(1, 9, 10, 16, 16, 1, 1, 1), 2);
    check_all_variants(grouped(3, 5, 6, 7, 9, 1, 1, 1), 2);
    check_all_variants(grouped(1, 12, 12, 16, 64, 1, 3, 3), 2);
    struct convd_problem p = grouped(1, 13, 13, 32, 32, 1, 1, 1);
    p.stride_h = p.stride_w = 2; /* ResNet's strided 1x1 downsample */
    check_all_variants(p, 2);
}

static void test_geometry(void **state)
{
    (void)state;
    struct convd_problem p;

    p = grouped(1, 14, 15, 4, 4, 4, 3, 3); /* stride 2 */
    p.stride_h = p.stride_w = 2;
    check_all_variants(p, 2);

    p = grouped(1, 16, 13, 2, 3, 3, 3, 3); /* dilation 2 */
    p.dil_h = p.dil_w = 2;
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 2;
    check_all_variants(p, 2);

    p = grouped(2, 11, 12, 3, 3, 2, 3, 3); /* asymmetric padding */
    p.pad_top = 0;
    p.pad_bottom = 2;
    p.pad_left = 2;
    p.pad_right = 1;
    check_all_variants(p, 2);

    p = grouped(1, 12, 14, 2, 2, 3, 1, 7); /* non-square filters */
    check_all_variants(p, 2);
    p = grouped(1, 12, 14, 3, 1, 2, 5, 3);
    check_all_variants(p, 2);

    p = grouped(1, 13, 17, 2, 2, 2, 3, 2); /* mixed strides and dilations */
    p.stride_h = 3;
    p.stride_w = 2;
    p.dil_h = 1;
    p.dil_w = 3;
    p.pad_left = 3;
    check_all_variants(p, 2);

    p = grouped(1, 19, 23, 2, 3, 2, 2, 2); /* stride larger than the filter: one plane per tap */
    p.stride_h = 5;
    p.stride_w = 4;
    p.pad_top = 1;
    check_all_variants(p, 2);

    p = grouped(1, 9, 9, 3, 2, 2, 9, 9); /* filter as large as the padded image */
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 0;
    check_all_variants(p, 2);

    p = grouped(1, 1, 1, 5, 3, 1, 3, 3); /* a single input pixel, padded */
    check_all_variants(p, 2);

    p = grouped(1, 3, 40, 2, 2, 2, 1, 40); /* filter as wide as the image */
    p.pad_left = p.pad_right = 0;
    check_all_variants(p, 1);
}

/* Dilation and padding far beyond the image: the planner packs one plane per tap instead of
 * stride-phase planes spanning every row between the first and the last tap, so scratch follows
 * the tensors and the work (7ab9ac0 needed 2 GB for the first problem here). */
static void test_huge_dilation(void **state)
{
    (void)state;
    struct convd_problem p = grouped(1, 1, 4000, 1, 1, 1, 3, 1);
    p.dil_h = 65536;
    p.pad_top = p.pad_bottom = 65536;
    p.pad_left = p.pad_right = 0;
    struct cpu_plan plan;
    assert_int_equal(cpu_plan_init(&p, NULL, 0, &plan), 0);
    if (plan.scratch_bytes > ((size_t)1 << 20))
        fail_msg("%zu bytes of scratch for a problem of 32 KB of tensors", plan.scratch_bytes);
    check_all_variants(p, 2);

    p = grouped(1, 6, 50, 2, 2, 2, 3, 3); /* both dimensions, and stride 2 */
    p.dil_h = p.dil_w = 4096;
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 4096;
    p.stride_h = p.stride_w = 2;
    assert_int_equal(cpu_plan_init(&p, NULL, 0, &plan), 0);
    if (plan.scratch_bytes > ((size_t)1 << 20))
        fail_msg("%zu bytes of scratch for dilation 4096", plan.scratch_bytes);
    check_all_variants(p, 2);
}

/* Images larger than the planner's bands and blocks, in both dimensions. */
static void test_large_images(void **state)
{
    (void)state;
    struct convd_problem p = grouped(1, 97, 131, 2, 2, 4, 3, 3);
    p.layout = CONVD_LAYOUT_NHWC;
    check_problem(&p, 2);
    p.layout = CONVD_LAYOUT_NCHW;
    p.dtype = CONVD_DTYPE_BF16;
    check_problem(&p, 2);

    p = grouped(1, 40, 700, 1, 1, 8, 3, 3);
    p.layout = CONVD_LAYOUT_NHWC;
    check_problem(&p, 2);
    p.layout = CONVD_LAYOUT_NCHW;
    check_problem(&p, 2);

    p = grouped(1, 30, 30, 48, 48, 2, 3, 3);
    p.layout = CONVD_LAYOUT_NHWC;
    check_problem(&p, 2);

    p = grouped(1, 300, 9, 3, 3, 1, 3, 3);
    p.dtype = CONVD_DTYPE_FP16;
    check_problem(&p, 2);
}

/* 1 thread and several threads give the same bits, for every dtype and layout. */
static void test_threads_identical(void **state)
{
    (void)state;
    for (int i = 0; i < 24; i++) {
        struct convd_problem p;
        tu_random_problem(&rng, &p, 0, 0, i % 2 ? 5 : 30);
        if (i % 3 == 0) {
            p.h = 40 + i;
            p.w = 33;
            assert_int_equal(convd_problem_check(&p, NULL, 0), 0);
        }
        struct tensors t;
        tensors_make(&t, &p, &rng);
        assert_int_equal(tensors_run(&t, 1, NULL, 0), 0);
        void *one = malloc(t.z.output_bytes);
        assert_non_null(one);
        memcpy(one, t.output, t.z.output_bytes);
        for (int threads = 2; threads <= 5; threads += 3) {
            assert_int_equal(tensors_run(&t, threads, NULL, 0), 0);
            assert_memory_equal(one, t.output, t.z.output_bytes);
        }
        assert_int_equal(tensors_run(&t, 0, NULL, 0), 0);
        assert_memory_equal(one, t.output, t.z.output_bytes);
        free(one);
        tensors_free(&t);
    }
}

/* Channels [g*per, (g+1)*per) of an NCHW tensor (n, ch, plane) into a dense one. */
static void slice_channels(const void *src, void *dst, size_t esz, int n, int ch, int per, int g,
                           size_t plane)
{
    for (int i = 0; i < n; i++)
        memcpy((uint8_t *)dst + (size_t)i * per * plane * esz,
               (const uint8_t *)src + ((size_t)i * ch + (size_t)g * per) * plane * esz,
               (size_t)per * plane * esz);
}

/* A G-group convolution equals G ungrouped convolutions on the groups' channel slices. */
static void test_group_identity(void **state)
{
    (void)state;
    for (int it = 0; it < 12; it++) {
        struct convd_problem p;
        tu_random_problem(&rng, &p, 0, CONVD_LAYOUT_NCHW, it % 2 ? 6 : 20);
        if (p.groups == 1) {
            p.groups = 3;
            p.c *= 3;
            p.k *= 3;
        }
        struct tensors t;
        tensors_make(&t, &p, &rng);
        assert_int_equal(tensors_run(&t, 2, NULL, 0), 0);

        const int G = p.groups, cpg = p.c / G, kpg = p.k / G;
        const size_t esz = convd_dtype_size(p.dtype);
        struct convd_problem q = p;
        q.groups = 1;
        q.c = cpg;
        q.k = kpg;
        struct convd_problem_sizes qz;
        assert_int_equal(convd_problem_sizes(&q, &qz, NULL, 0), 0);
        void *xs = malloc(qz.input_bytes), *ws = malloc(qz.weight_bytes);
        void *ys = malloc(qz.output_bytes), *ysl = malloc(qz.output_bytes);
        assert_true(xs && ws && ys && ysl);
        const size_t in_plane = (size_t)p.h * p.w, out_plane = (size_t)t.z.out_h * t.z.out_w;
        for (int g = 0; g < G; g++) {
            slice_channels(t.input, xs, esz, p.n, p.c, cpg, g, in_plane);
            memcpy(ws, (uint8_t *)t.weight + (size_t)g * qz.weight_bytes, qz.weight_bytes);
            struct convd_tensors ct = {
                .input = xs,
                .weight = ws,
                .bias = (uint8_t *)t.bias + (size_t)g * kpg * esz,
                .output = ys,
            };
            tu_poison(ys, qz.output_bytes);
            assert_int_equal(convd_cpu_conv(&q, &ct, 2), 0);
            slice_channels(t.output, ysl, esz, p.n, p.k, kpg, g, out_plane);
            /* The same sums in the same order: the slices agree to the bit. */
            assert_memory_equal(ys, ysl, qz.output_bytes);
        }
        free(xs);
        free(ws);
        free(ys);
        free(ysl);
        tensors_free(&t);
    }
}

static void test_bad_arguments(void **state)
{
    (void)state;
    struct convd_problem p = grouped(1, 8, 8, 2, 2, 2, 3, 3);
    float x[4 * 64] = {0}, w[4 * 18] = {0}, y[4 * 64];
    struct convd_tensors t = {.input = x, .weight = w, .bias = NULL, .output = y};
    assert_int_equal(convd_cpu_conv(NULL, &t, 1), CONVD_EINVAL);
    assert_int_equal(convd_cpu_conv(&p, NULL, 1), CONVD_EINVAL);
    assert_int_equal(convd_cpu_conv(&p, &t, -1), CONVD_EINVAL);
    struct convd_tensors t2 = t;
    t2.input = NULL;
    assert_int_equal(convd_cpu_conv(&p, &t2, 1), CONVD_EINVAL);
    t2 = t;
    t2.output = NULL;
    assert_int_equal(convd_cpu_conv(&p, &t2, 1), CONVD_EINVAL);
    p.has_bias = true;
    assert_int_equal(convd_cpu_conv(&p, &t, 1), CONVD_EINVAL); /* bias missing */
    p.has_bias = false;
    p.c = 3;
    assert_int_equal(convd_cpu_conv(&p, &t, 1), CONVD_EGROUPS);
    p.c = 4;
    p.r = 0;
    assert_int_equal(convd_cpu_conv(&p, &t, 1), CONVD_EBADSHAPE);
    p.r = 3;
    assert_int_equal(convd_cpu_conv(&p, &t, 1), 0);
}

struct concurrent_arg {
    uint64_t seed;
    int failures;
};

static void *concurrent_main(void *opaque)
{
    struct concurrent_arg *a = opaque;
    struct tu_rng g;
    tu_rng_init(&g, a->seed);
    for (int i = 0; i < 6; i++) {
        struct convd_problem p;
        tu_random_problem(&g, &p, 0, 0, 12);
        p.h += 20;
        struct tensors t;
        tensors_make(&t, &p, &g);
        struct convd_tensors ct = {t.input, t.weight, p.has_bias ? t.bias : NULL, t.output};
        tu_poison(t.output, t.z.output_bytes);
        if (convd_cpu_conv(&p, &ct, 2) != 0 ||
            !(tu_rel_error(p.dtype, t.output, t.ref, t.z.output_elems, NULL) <=
              tu_tolerance(p.dtype)))
            a->failures++;
        tensors_free(&t);
    }
    return NULL;
}

/* convd_cpu_conv() is thread-safe: callers at the same time each get their own pool. */
static void test_concurrent_callers(void **state)
{
    (void)state;
    pthread_t th[4];
    struct concurrent_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i].seed = tu_rng_next(&rng);
        args[i].failures = 0;
        assert_int_equal(pthread_create(&th[i], NULL, concurrent_main, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].failures, 0);
    }
}

/* The pool on its own: every task runs exactly once, runs back to back, more tasks than
 * threads and fewer. */
static void count_task(void *arg, size_t i, struct cpu_scratch *s)
{
    (void)s;
    __atomic_fetch_add(&((int *)arg)[i], 1, __ATOMIC_RELAXED);
}

static void test_pool(void **state)
{
    (void)state;
    struct cpu_pool *pool;
    assert_int_equal(cpu_pool_create(0, &pool), CONVD_EINVAL);
    assert_int_equal(cpu_pool_create(3, &pool), 0);
    assert_int_equal(cpu_pool_threads(pool), 3);
    assert_int_equal(cpu_pool_reserve(pool, 1000), 0);
    assert_non_null(cpu_pool_scratch(pool, 2)->buf);
    int counts[200];
    for (int round = 0; round < 50; round++) {
        size_t n = (size_t)(round * 7 % 200);
        memset(counts, 0, sizeof(counts));
        cpu_pool_run(pool, count_task, counts, n);
        for (size_t i = 0; i < 200; i++)
            assert_int_equal(counts[i], i < n ? 1 : 0);
    }
    cpu_pool_destroy(pool);
    cpu_pool_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_problems),    cmocka_unit_test(test_every_isa),
        cmocka_unit_test(test_every_activation),
        cmocka_unit_test(test_depthwise),          cmocka_unit_test(test_channels_per_group),
        cmocka_unit_test(test_kpg_not_cpg),        cmocka_unit_test(test_pointwise_and_dense),
        cmocka_unit_test(test_geometry),           cmocka_unit_test(test_large_images),
        cmocka_unit_test(test_huge_dilation),      cmocka_unit_test(test_threads_identical),
        cmocka_unit_test(test_group_identity),     cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_concurrent_callers), cmocka_unit_test(test_pool),
        cmocka_unit_test(test_channel_vectorised),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
