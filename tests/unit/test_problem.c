/*
 * The problem's validation and shape math (core/problem.c): every field rejected with a
 * sentence that names it, divisibility by groups, filters that do not fit, size overflow, the
 * derived sizes, the output-extent formula, names and parsers, and problem equality.
 */
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "convd/conv.h"
#include "conv_math.h"

static struct convd_problem valid_problem(void)
{
    struct convd_problem p;
    convd_problem_init(&p, 2, 16, 16, 32, 64, 3, 3, 4);
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
    return p;
}

/* Checks p, expects `code` and a sentence containing `needle`. */
static void expect_reject(const struct convd_problem *p, int code, const char *needle)
{
    char why[200] = "";
    int rc = convd_problem_check(p, why, sizeof(why));
    if (rc != code || strstr(why, needle) == NULL) {
        print_error("expected %d naming '%s', got %d: '%s'\n", code, needle, rc, why);
        fail();
    }
}

struct field {
    const char *name;
    size_t offset;
    int32_t lo, hi;
};

#define FIELD(f, lo, hi)                                                                           \
    {                                                                                              \
#f, offsetof(struct convd_problem, f), lo, hi                                              \
    }

static const struct field fields[] = {
    FIELD(n, 1, CONVD_MAX_DIM),           FIELD(h, 1, CONVD_MAX_DIM),
    FIELD(w, 1, CONVD_MAX_DIM),           FIELD(c, 1, CONVD_MAX_DIM),
    FIELD(k, 1, CONVD_MAX_DIM),           FIELD(r, 1, CONVD_MAX_DIM),
    FIELD(s, 1, CONVD_MAX_DIM),           FIELD(groups, 1, CONVD_MAX_DIM),
    FIELD(stride_h, 1, CONVD_MAX_STRIDE), FIELD(stride_w, 1, CONVD_MAX_STRIDE),
    FIELD(dil_h, 1, CONVD_MAX_STRIDE),    FIELD(dil_w, 1, CONVD_MAX_STRIDE),
    FIELD(pad_top, 0, CONVD_MAX_PAD),     FIELD(pad_bottom, 0, CONVD_MAX_PAD),
    FIELD(pad_left, 0, CONVD_MAX_PAD),    FIELD(pad_right, 0, CONVD_MAX_PAD),
};

static void set_field(struct convd_problem *p, const struct field *f, int32_t v)
{
    memcpy((char *)p + f->offset, &v, sizeof(v));
}

/* Every integer field: below its range (zero or negative), far below, above, and INT32_MAX. */
static void test_each_field_out_of_range(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        const struct field *f = &fields[i];
        const int32_t bad[] = {f->lo - 1, -1, INT32_MIN, f->hi + 1, INT32_MAX};
        char needle[40];
        snprintf(needle, sizeof(needle), "field %s ", f->name);
        for (size_t j = 0; j < sizeof(bad) / sizeof(bad[0]); j++) {
            struct convd_problem p = valid_problem();
            set_field(&p, f, bad[j]);
            expect_reject(&p, CONVD_EBADSHAPE, needle);
        }
        if (f->lo == 1) {
            struct convd_problem p = valid_problem();
            set_field(&p, f, 0);
            expect_reject(&p, CONVD_EBADSHAPE, needle);
        }
    }
}

static void test_groups_divisibility(void **state)
{
    (void)state;
    struct convd_problem p = valid_problem();
    assert_int_equal(convd_problem_check(&p, NULL, 0), 0);
    p.c = 30;
    expect_reject(&p, CONVD_EGROUPS, "c=30");
    expect_reject(&p, CONVD_EGROUPS, "groups=4");
    p = valid_problem();
    p.k = 66;
    expect_reject(&p, CONVD_EGROUPS, "k=66");
    p = valid_problem();
    p.groups = 32; /* depthwise-like: c = 32 divisible, k = 64 divisible */
    assert_int_equal(convd_problem_check(&p, NULL, 0), 0);
    p.groups = 64; /* c = 32 is not */
    expect_reject(&p, CONVD_EGROUPS, "input channels");
}

static void test_filter_must_fit(void **state)
{
    (void)state;
    struct convd_problem p;
    convd_problem_init(&p, 1, 3, 8, 1, 1, 5, 1, 1);
    expect_reject(&p, CONVD_EBADSHAPE, "r=5");
    p.pad_top = 1;
    expect_reject(&p, CONVD_EBADSHAPE, "height");
    p.pad_bottom = 1; /* 3 + 2 = 5: fits exactly */
    assert_int_equal(convd_problem_check(&p, NULL, 0), 0);
    p.dil_h = 2; /* dilated extent 9 */
    expect_reject(&p, CONVD_EBADSHAPE, "dil_h=2");

    convd_problem_init(&p, 1, 8, 4, 1, 1, 1, 3, 1);
    p.dil_w = 2; /* extent 5 > 4 */
    expect_reject(&p, CONVD_EBADSHAPE, "s=3");
    p.pad_right = 1;
    assert_int_equal(convd_problem_check(&p, NULL, 0), 0);
}

static void test_size_overflow(void **state)
{
    (void)state;
    struct convd_problem p;
    /* input 2^24 x 2^24 x 2^24 elements */
    convd_problem_init(&p, CONVD_MAX_DIM, CONVD_MAX_DIM, CONVD_MAX_DIM, 1, 1, 1, 1, 1);
    expect_reject(&p, CONVD_EBADSHAPE, "input tensor");
    /* 2^40 bytes exactly is allowed only up to the limit: 2^38 fp32 elements is 2^40 bytes */
    convd_problem_init(&p, 1 << 14, 1 << 12, 1 << 12, 1, 1, 1, 1, 1);
    assert_int_equal(convd_problem_check(&p, NULL, 0), 0);
    p.n = (1 << 14) + 1;
    expect_reject(&p, CONVD_EBADSHAPE, "input tensor");
    /* weight k * r * s * c/g */
    convd_problem_init(&p, 1, 1, 1, CONVD_MAX_DIM, CONVD_MAX_DIM, 1, 1, 1);
    expect_reject(&p, CONVD_EBADSHAPE, "weight tensor");
    /* output n * oh * ow * k with small input and weight */
    convd_problem_init(&p, 1, 1 << 12, 1 << 12, 1, CONVD_MAX_DIM, 1, 1, 1);
    expect_reject(&p, CONVD_EBADSHAPE, "output tensor");
    /* output extent beyond CONVD_MAX_DIM through padding */
    convd_problem_init(&p, 1, CONVD_MAX_DIM, 1, 1, 1, 1, 1, 1);
    p.pad_top = p.pad_bottom = CONVD_MAX_PAD;
    expect_reject(&p, CONVD_EBADSHAPE, "too large");
    /* fp16 halves the bytes: the same element count fits where fp32 did not */
    convd_problem_init(&p, (1 << 14) + 1, 1 << 12, 1 << 12, 1, 1, 1, 1, 1);
    p.dtype = CONVD_DTYPE_FP16;
    assert_int_equal(convd_problem_check(&p, NULL, 0), 0);
}

static void test_bad_enums_and_tf32(void **state)
{
    (void)state;
    struct convd_problem p = valid_problem();
    p.dtype = (enum convd_dtype)0;
    expect_reject(&p, CONVD_EBADSHAPE, "dtype");
    p.dtype = (enum convd_dtype)4;
    expect_reject(&p, CONVD_EBADSHAPE, "dtype");
    p = valid_problem();
    p.layout = (enum convd_layout)0;
    expect_reject(&p, CONVD_EBADSHAPE, "layout");
    p.layout = (enum convd_layout)3;
    expect_reject(&p, CONVD_EBADSHAPE, "layout");
    p = valid_problem();
    p.allow_tf32 = true;
    assert_int_equal(convd_problem_check(&p, NULL, 0), 0);
    p.dtype = CONVD_DTYPE_FP16;
    expect_reject(&p, CONVD_EBADSHAPE, "allow_tf32");
    p.dtype = CONVD_DTYPE_BF16;
    expect_reject(&p, CONVD_EBADSHAPE, "allow_tf32");
}

static void test_why_handling(void **state)
{
    (void)state;
    assert_int_equal(convd_problem_check(NULL, NULL, 0), CONVD_EINVAL);
    struct convd_problem p = valid_problem();
    p.h = 0;
    assert_int_equal(convd_problem_check(&p, NULL, 0), CONVD_EBADSHAPE);
    assert_int_equal(convd_problem_check(&p, NULL, 100), CONVD_EBADSHAPE);
    char small[8];
    memset(small, 'x', sizeof(small));
    assert_int_equal(convd_problem_check(&p, small, sizeof(small)), CONVD_EBADSHAPE);
    assert_int_equal(strlen(small), sizeof(small) - 1);
    char untouched[16] = "same";
    assert_int_equal(convd_problem_check(&p, untouched, 0), CONVD_EBADSHAPE);
    assert_string_equal(untouched, "same");
}

static void test_sizes(void **state)
{
    (void)state;
    struct convd_problem p;
    convd_problem_init(&p, 2, 5, 7, 6, 4, 3, 2, 2);
    p.stride_h = 2;
    p.pad_top = 1;
    p.pad_left = p.pad_right = 1;
    p.dil_w = 2;
    p.dtype = CONVD_DTYPE_FP16;
    p.has_bias = true;
    struct convd_problem_sizes z;
    assert_int_equal(convd_problem_sizes(&p, &z, NULL, 0), 0);
    assert_int_equal(z.out_h, 2); /* (5 + 1 - 2 - 1) / 2 + 1 */
    assert_int_equal(z.out_w, 7); /* (7 + 2 - 2 - 1) / 1 + 1 */
    assert_int_equal(z.input_elems, 2 * 5 * 7 * 6);
    assert_int_equal(z.weight_elems, 4 * 3 * 2 * 3);
    assert_int_equal(z.bias_elems, 4);
    assert_int_equal(z.output_elems, 2 * 2 * 7 * 4);
    assert_int_equal(z.input_bytes, 2 * z.input_elems);
    assert_int_equal(z.weight_bytes, 2 * z.weight_elems);
    assert_int_equal(z.bias_bytes, 8);
    assert_int_equal(z.output_bytes, 2 * z.output_elems);
    assert_int_equal(z.flops, 2 * z.output_elems * 3 * 2 * 3);

    p.has_bias = false;
    p.dtype = CONVD_DTYPE_FP32;
    assert_int_equal(convd_problem_sizes(&p, &z, NULL, 0), 0);
    assert_int_equal(z.bias_elems, 0);
    assert_int_equal(z.bias_bytes, 0);
    assert_int_equal(z.output_bytes, 4 * z.output_elems);

    /* untouched on failure */
    struct convd_problem_sizes before;
    memset(&before, 0x3c, sizeof(before));
    z = before;
    p.k = 3;
    char why[100];
    assert_int_equal(convd_problem_sizes(&p, &z, why, sizeof(why)), CONVD_EGROUPS);
    assert_memory_equal(&z, &before, sizeof(z));
    assert_non_null(strstr(why, "k=3"));
}

static void test_out_dim(void **state)
{
    (void)state;
    assert_int_equal(convd_out_dim(56, 1, 1, 3, 1, 1), 56);
    assert_int_equal(convd_out_dim(56, 1, 1, 3, 2, 1), 28);
    assert_int_equal(convd_out_dim(112, 1, 1, 3, 2, 1), 56);
    assert_int_equal(convd_out_dim(224, 3, 3, 7, 2, 1), 112);
    assert_int_equal(convd_out_dim(7, 0, 0, 3, 1, 2), 3);
    assert_int_equal(convd_out_dim(7, 0, 1, 3, 3, 1), 2);
    assert_int_equal(convd_out_dim(5, 0, 0, 5, 1, 1), 1);
    assert_true(convd_out_dim(3, 0, 0, 5, 1, 1) <= 0);
    assert_true(convd_out_dim(3, 1, 0, 3, 1, 2) <= 0);
    /* large values do not overflow */
    assert_int_equal(convd_out_dim(CONVD_MAX_DIM, CONVD_MAX_PAD, CONVD_MAX_PAD, 1, 1, 1),
                     (int64_t)CONVD_MAX_DIM + 2 * CONVD_MAX_PAD);
    assert_int_equal(convd_out_dim(CONVD_MAX_DIM, 0, 0, CONVD_MAX_DIM, CONVD_MAX_STRIDE, 1), 1);
}

static void test_names_and_parsers(void **state)
{
    (void)state;
    assert_string_equal(convd_dtype_name(CONVD_DTYPE_FP32), "fp32");
    assert_string_equal(convd_dtype_name(CONVD_DTYPE_FP16), "fp16");
    assert_string_equal(convd_dtype_name(CONVD_DTYPE_BF16), "bf16");
    assert_string_equal(convd_dtype_name((enum convd_dtype)9), "unknown");
    assert_string_equal(convd_layout_name(CONVD_LAYOUT_NCHW), "nchw");
    assert_string_equal(convd_layout_name(CONVD_LAYOUT_NHWC), "nhwc");
    assert_string_equal(convd_layout_name((enum convd_layout)0), "unknown");
    assert_int_equal(convd_dtype_size(CONVD_DTYPE_FP32), 4);
    assert_int_equal(convd_dtype_size(CONVD_DTYPE_FP16), 2);
    assert_int_equal(convd_dtype_size(CONVD_DTYPE_BF16), 2);
    assert_int_equal(convd_dtype_size((enum convd_dtype)7), 0);

    static const struct {
        const char *s;
        enum convd_dtype d;
    } dts[] = {
        {"fp32", CONVD_DTYPE_FP32},    {"FP32", CONVD_DTYPE_FP32}, {"float32", CONVD_DTYPE_FP32},
        {"Float", CONVD_DTYPE_FP32},   {"fp16", CONVD_DTYPE_FP16}, {"HALF", CONVD_DTYPE_FP16},
        {"float16", CONVD_DTYPE_FP16}, {"bf16", CONVD_DTYPE_BF16}, {"BFloat16", CONVD_DTYPE_BF16},
    };
    for (size_t i = 0; i < sizeof(dts) / sizeof(dts[0]); i++) {
        enum convd_dtype d = (enum convd_dtype)0;
        assert_int_equal(convd_dtype_parse(dts[i].s, &d), 0);
        assert_int_equal(d, dts[i].d);
        /* names round-trip */
        assert_int_equal(convd_dtype_parse(convd_dtype_name(d), &d), 0);
        assert_int_equal(d, dts[i].d);
    }
    const char *bad[] = {"", "fp8", "fp32 ", "f", "bfloat"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        enum convd_dtype d = (enum convd_dtype)42;
        assert_int_equal(convd_dtype_parse(bad[i], &d), CONVD_EINVAL);
        assert_int_equal(d, 42);
    }
    enum convd_dtype d;
    assert_int_equal(convd_dtype_parse(NULL, &d), CONVD_EINVAL);
    assert_int_equal(convd_dtype_parse("fp32", NULL), CONVD_EINVAL);

    enum convd_layout l = (enum convd_layout)0;
    assert_int_equal(convd_layout_parse("NHWC", &l), 0);
    assert_int_equal(l, CONVD_LAYOUT_NHWC);
    assert_int_equal(convd_layout_parse("nchw", &l), 0);
    assert_int_equal(l, CONVD_LAYOUT_NCHW);
    l = (enum convd_layout)7;
    assert_int_equal(convd_layout_parse("chwn", &l), CONVD_EINVAL);
    assert_int_equal(l, 7);
    assert_int_equal(convd_layout_parse(NULL, &l), CONVD_EINVAL);
    assert_int_equal(convd_layout_parse("nhwc", NULL), CONVD_EINVAL);
}

static void test_init_and_str(void **state)
{
    (void)state;
    struct convd_problem p;
    memset(&p, 0x7f, sizeof(p));
    convd_problem_init(&p, 32, 56, 57, 128, 256, 3, 5, 32);
    assert_int_equal(p.n, 32);
    assert_int_equal(p.h, 56);
    assert_int_equal(p.w, 57);
    assert_int_equal(p.c, 128);
    assert_int_equal(p.k, 256);
    assert_int_equal(p.r, 3);
    assert_int_equal(p.s, 5);
    assert_int_equal(p.groups, 32);
    assert_int_equal(p.stride_h, 1);
    assert_int_equal(p.stride_w, 1);
    assert_int_equal(p.dil_h, 1);
    assert_int_equal(p.dil_w, 1);
    assert_int_equal(p.pad_top + p.pad_bottom + p.pad_left + p.pad_right, 0);
    assert_int_equal(p.dtype, CONVD_DTYPE_FP32);
    assert_int_equal(p.layout, CONVD_LAYOUT_NCHW);
    assert_false(p.has_bias || p.allow_tf32);
    assert_int_equal(p.activation, CONVD_ACT_NONE);
    assert_true(p.act_min == 0.0f && p.act_max == 0.0f);

    p.dtype = CONVD_DTYPE_BF16;
    p.layout = CONVD_LAYOUT_NHWC;
    p.activation = CONVD_ACT_RELU;
    char buf[160];
    assert_ptr_equal(convd_problem_str(&p, buf, sizeof(buf)), buf);
    assert_non_null(strstr(buf, "n32"));
    assert_non_null(strstr(buf, "c128x56x57"));
    assert_non_null(strstr(buf, "k256"));
    assert_non_null(strstr(buf, "3x5"));
    assert_non_null(strstr(buf, "g32"));
    assert_non_null(strstr(buf, "bf16 nhwc"));
    assert_non_null(strstr(buf, "relu"));
    char tiny[6];
    convd_problem_str(&p, tiny, sizeof(tiny));
    assert_int_equal(strlen(tiny), sizeof(tiny) - 1);
}

static void test_same(void **state)
{
    (void)state;
    struct convd_problem a = valid_problem(), b = a;
    assert_true(convd_problem_same(&a, &b));
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        b = a;
        int32_t v;
        memcpy(&v, (char *)&b + fields[i].offset, sizeof(v));
        set_field(&b, &fields[i], v + 1);
        assert_false(convd_problem_same(&a, &b));
    }
    b = a;
    b.dtype = CONVD_DTYPE_BF16;
    assert_false(convd_problem_same(&a, &b));
    b = a;
    b.layout = CONVD_LAYOUT_NHWC;
    assert_false(convd_problem_same(&a, &b));
    b = a;
    b.has_bias = true;
    assert_false(convd_problem_same(&a, &b));
    b = a;
    b.activation = CONVD_ACT_RELU;
    assert_false(convd_problem_same(&a, &b));
    b = a;
    b.allow_tf32 = true;
    assert_false(convd_problem_same(&a, &b));
    /* clamp bounds are part of the problem */
    a.activation = b.activation = CONVD_ACT_CLAMP;
    a.act_max = 6.0f;
    b = a;
    assert_true(convd_problem_same(&a, &b));
    b.act_max = 5.0f;
    assert_false(convd_problem_same(&a, &b));
    b = a;
    b.act_min = -1.0f;
    assert_false(convd_problem_same(&a, &b));
}

/* Activations: names both ways, relu6 and swish as aliases, and the checks of the enum and of
 * clamp's bounds, each naming the field. */
static void test_activations(void **state)
{
    (void)state;
    static const char *const names[] = {"none", "relu", "clamp", "silu",
                                        "hardswish", "gelu", "gelu_tanh"};
    for (int a = CONVD_ACT_NONE; a <= CONVD_ACT_GELU_TANH; a++) {
        assert_string_equal(convd_activation_name((enum convd_activation)a), names[a]);
        struct convd_problem p = valid_problem();
        p.act_max = 9.0f;
        assert_int_equal(convd_activation_parse(names[a], &p), 0);
        assert_int_equal(p.activation, a);
        assert_true(p.act_min == 0.0f && p.act_max == 0.0f);
    }
    assert_string_equal(convd_activation_name((enum convd_activation)7), "unknown");
    struct convd_problem p = valid_problem();
    assert_int_equal(convd_activation_parse("ReLU6", &p), 0);
    assert_int_equal(p.activation, CONVD_ACT_CLAMP);
    assert_true(p.act_min == 0.0f && p.act_max == 6.0f);
    assert_int_equal(convd_problem_check(&p, NULL, 0), 0);
    assert_int_equal(convd_activation_parse("swish", &p), 0);
    assert_int_equal(p.activation, CONVD_ACT_SILU);
    assert_int_equal(convd_activation_parse("tanh", &p), CONVD_EINVAL);
    assert_int_equal(convd_activation_parse(NULL, &p), CONVD_EINVAL);

    char why[200];
    p = valid_problem();
    p.activation = (enum convd_activation)7;
    assert_int_equal(convd_problem_check(&p, why, sizeof(why)), CONVD_EBADSHAPE);
    assert_non_null(strstr(why, "activation is 7"));
    p = valid_problem();
    p.activation = CONVD_ACT_CLAMP;
    p.act_min = 1.0f;
    p.act_max = 0.5f;
    assert_int_equal(convd_problem_check(&p, why, sizeof(why)), CONVD_EBADSHAPE);
    assert_non_null(strstr(why, "act_min <= act_max"));
    p.act_min = NAN;
    assert_int_equal(convd_problem_check(&p, why, sizeof(why)), CONVD_EBADSHAPE);
    p.act_min = -INFINITY; /* a one-sided clamp */
    assert_int_equal(convd_problem_check(&p, why, sizeof(why)), 0);
    char buf[160];
    p.act_min = 0.0f;
    p.act_max = 6.0f;
    assert_non_null(strstr(convd_problem_str(&p, buf, sizeof(buf)), "clamp(0,6)"));
    p = valid_problem();
    p.activation = CONVD_ACT_SILU;
    p.act_max = 1.0f;
    assert_int_equal(convd_problem_check(&p, why, sizeof(why)), CONVD_EBADSHAPE);
    assert_non_null(strstr(why, "clamp activation only"));
    assert_non_null(strstr(why, "silu"));
}

/* The kernels' division by invariant divisors against the '/' operator: every divisor up to 4096
 * and powers of two and their neighbours up to 2^31 - 1, at dividends around every multiple of the
 * divisor near 0, near 2^31 - 1 and in between. */
static void check_fdiv(uint32_t d)
{
    const struct convd_math_fdiv f = convd_math_fdiv_make(d);
    const uint32_t max = 0x7fffffffu;
    const uint32_t starts[] = {0, d > 64 ? d - 64 : 0, max / 3, max / 2, max - 300};
    for (size_t i = 0; i < sizeof(starts) / sizeof(starts[0]); i++)
        for (uint32_t x = starts[i]; x - starts[i] < 300 && x <= max; x++) {
            const uint32_t q = convd_math_fdiv_div(x, f);
            if (q != x / d) {
                print_error("%u / %u: fast division gave %u, want %u\n", x, d, q, x / d);
                fail();
            }
        }
    for (uint32_t k = 1; k < 64; k++) { /* dividends just below and at multiples of d */
        const uint64_t x = (uint64_t)d * k * (max / d / 64 + 1);
        for (int e = -1; e <= 0; e++)
            if (x + e <= max)
                assert_int_equal(convd_math_fdiv_div((uint32_t)(x + e), f), (x + e) / d);
    }
}

static void test_fdiv(void **state)
{
    (void)state;
    for (uint32_t d = 1; d <= 4096; d++)
        check_fdiv(d);
    for (int b = 12; b < 31; b++)
        for (int e = -3; e <= 3; e++)
            check_fdiv((1u << b) + (uint32_t)e);
    check_fdiv(0x7fffffffu);
    check_fdiv(0x7ffffffeu);
    check_fdiv(1000003u);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_field_out_of_range),
        cmocka_unit_test(test_groups_divisibility),
        cmocka_unit_test(test_filter_must_fit),
        cmocka_unit_test(test_size_overflow),
        cmocka_unit_test(test_bad_enums_and_tf32),
        cmocka_unit_test(test_why_handling),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_out_dim),
        cmocka_unit_test(test_names_and_parsers),
        cmocka_unit_test(test_init_and_str),
        cmocka_unit_test(test_same), cmocka_unit_test(test_activations),
        cmocka_unit_test(test_fdiv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
