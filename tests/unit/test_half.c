/*
 * fp16 and bf16 conversions (core/half.c): every fp16 pattern round-trips through fp32 and
 * decodes to the value of the IEEE formula; ties round to even in both formats; overflow goes to
 * infinity; subnormals are exact; NaN stays NaN. The CPU kernels' inline copies
 * (kernels/cpu/cpu_dtype.h) must give the same bits as half.c.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "convd/conv.h"
#include "cpu_dtype.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static int f16_is_nan(uint16_t h)
{
    return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}

static int bf16_is_nan(uint16_t b)
{
    return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0;
}

/* The value of an fp16 pattern from the IEEE 754 definition, in double. */
static double f16_value(uint16_t h)
{
    int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v;
    if (e == 0x1f)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp(m, -24);
    else
        v = ldexp(1024 + m, e - 25);
    return sign ? -v : v;
}

static void test_f16_every_pattern(void **state)
{
    (void)state;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = convd_f16_to_f32(h);
        double want = f16_value(h);
        if (isnan(want)) {
            assert_true(isnan(f));
            assert_true(f16_is_nan(convd_f32_to_f16(f)));
        } else {
            assert_true((double)f == want);
            assert_int_equal(signbit(f) != 0, (h >> 15) != 0); /* -0 stays -0 */
            assert_int_equal(convd_f32_to_f16(f), h);
        }
        /* the kernels' inline copies agree bit for bit */
        assert_int_equal(bits(cpu_f16_to_f32(h)), bits(f));
    }
}

static void test_bf16_every_pattern(void **state)
{
    (void)state;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t b = (uint16_t)i;
        float f = convd_bf16_to_f32(b);
        assert_int_equal(bits(f), (uint32_t)b << 16);
        if (bf16_is_nan(b))
            assert_true(bf16_is_nan(convd_f32_to_bf16(f)));
        else
            assert_int_equal(convd_f32_to_bf16(f), b);
        assert_int_equal(bits(cpu_bf16_to_f32(b)), bits(f));
    }
}

/* Halfway between two adjacent finite values the result is the one with an even mantissa; just
 * off the midpoint it is the nearer one. Midpoints are exact in fp32 for both formats. */
static void test_ties_to_even(void **state)
{
    (void)state;
    for (uint32_t i = 0; i < 0x7bff; i++) { /* positive finite fp16, not the largest */
        for (int neg = 0; neg < 2; neg++) {
            uint16_t lo = (uint16_t)(i | (neg ? 0x8000u : 0)), hi = (uint16_t)(lo + 1);
            float a = convd_f16_to_f32(lo), b = convd_f16_to_f32(hi);
            float mid = (float)(((double)a + (double)b) / 2);
            assert_true((double)mid == ((double)a + (double)b) / 2);
            uint16_t even = (lo & 1u) ? hi : lo;
            assert_int_equal(convd_f32_to_f16(mid), even);
            assert_int_equal(convd_f32_to_f16(nextafterf(mid, a)), lo);
            assert_int_equal(convd_f32_to_f16(nextafterf(mid, b)), hi);
            assert_int_equal(cpu_f32_to_f16(mid), even);
            assert_int_equal(cpu_f32_to_f16(nextafterf(mid, a)), lo);
            assert_int_equal(cpu_f32_to_f16(nextafterf(mid, b)), hi);
        }
    }
    for (uint32_t i = 0; i < 0x7f7f; i++) { /* positive finite bf16, not the largest */
        uint16_t lo = (uint16_t)i, hi = (uint16_t)(i + 1);
        float a = convd_bf16_to_f32(lo), b = convd_bf16_to_f32(hi);
        float mid = from_bits(((uint32_t)lo << 16) | 0x8000u);
        assert_true((double)mid == ((double)a + (double)b) / 2);
        uint16_t even = (lo & 1u) ? hi : lo;
        assert_int_equal(convd_f32_to_bf16(mid), even);
        assert_int_equal(convd_f32_to_bf16(-mid), even | 0x8000u);
        assert_int_equal(convd_f32_to_bf16(nextafterf(mid, a)), lo);
        assert_int_equal(convd_f32_to_bf16(nextafterf(mid, b)), hi);
        assert_int_equal(cpu_f32_to_bf16(mid), even);
    }
    /* a few by hand */
    assert_int_equal(convd_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);     /* tie, down to even */
    assert_int_equal(convd_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02); /* tie, up to even */
    assert_int_equal(convd_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(convd_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
}

static void test_overflow(void **state)
{
    (void)state;
    assert_int_equal(convd_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(convd_f32_to_f16(nextafterf(65520.0f, 0.0f)), 0x7bff);
    assert_int_equal(convd_f32_to_f16(65520.0f), 0x7c00); /* the midpoint to 2^16 rounds up */
    assert_int_equal(convd_f32_to_f16(1e10f), 0x7c00);
    assert_int_equal(convd_f32_to_f16(-1e10f), 0xfc00);
    assert_int_equal(convd_f32_to_f16(3.4e38f), 0x7c00);
    assert_int_equal(convd_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(convd_f32_to_f16(-INFINITY), 0xfc00);
    assert_true(isinf(convd_f16_to_f32(0x7c00)) && convd_f16_to_f32(0x7c00) > 0);
    assert_true(isinf(convd_f16_to_f32(0xfc00)) && convd_f16_to_f32(0xfc00) < 0);
    assert_int_equal(convd_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(convd_f32_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(convd_f32_to_bf16(3.4028235e38f), 0x7f80); /* FLT_MAX rounds up to inf */
    assert_int_equal(convd_f32_to_bf16(from_bits(0x7f7f7fffu)), 0x7f7f);
    assert_int_equal(cpu_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(cpu_f32_to_f16(-1e10f), 0xfc00);
}

static void test_subnormals(void **state)
{
    (void)state;
    assert_true(convd_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(convd_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    assert_true(convd_f16_to_f32(0x0400) == 0x1p-14f);
    assert_true(convd_f16_to_f32(0x8001) == -0x1p-24f);
    assert_int_equal(convd_f32_to_f16(0x1p-24f), 0x0001);
    assert_int_equal(convd_f32_to_f16(0x1p-25f), 0x0000); /* tie to even: 0 */
    assert_int_equal(convd_f32_to_f16(nextafterf(0x1p-25f, 1)), 0x0001);
    assert_int_equal(convd_f32_to_f16(3 * 0x1p-25f), 0x0002); /* tie to even: 2 */
    assert_int_equal(convd_f32_to_f16(-0x1p-25f), 0x8000);
    assert_int_equal(convd_f32_to_f16(0x1p-30f), 0x0000);
    assert_int_equal(convd_f32_to_f16(1023.5f * 0x1p-24f), 0x0400); /* up to the smallest normal */
    assert_int_equal(convd_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(convd_f32_to_f16(1e-45f), 0x0000); /* fp32 subnormal */
    assert_true(convd_bf16_to_f32(0x0001) == 0x1p-133f);
    assert_int_equal(convd_f32_to_bf16(0x1p-133f), 0x0001);
    assert_int_equal(convd_f32_to_bf16(from_bits(0x00008000u)), 0x0000); /* tie to even */
    assert_int_equal(convd_f32_to_bf16(from_bits(0x00018000u)), 0x0002);
    assert_int_equal(cpu_f32_to_f16(3 * 0x1p-25f), 0x0002);
    assert_int_equal(cpu_f32_to_f16(0x1p-25f), 0x0000);
}

static void test_nan_stays_nan(void **state)
{
    (void)state;
    const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0x7fffffffu, 0x7f801000u,
                             0xffc00000u, 0xff800001u, 0xffffffffu, 0x7f802000u, 0x7fc0ffffu};
    for (size_t i = 0; i < sizeof(nans) / sizeof(nans[0]); i++) {
        float f = from_bits(nans[i]);
        assert_true(f16_is_nan(convd_f32_to_f16(f)));
        assert_true(bf16_is_nan(convd_f32_to_bf16(f)));
        assert_int_equal(convd_f32_to_f16(f) >> 15, nans[i] >> 31);
        assert_int_equal(convd_f32_to_bf16(f) >> 15, nans[i] >> 31);
        assert_int_equal(cpu_f32_to_f16(f), convd_f32_to_f16(f));
        assert_int_equal(cpu_f32_to_bf16(f), convd_f32_to_bf16(f));
    }
    assert_true(isnan(convd_f16_to_f32(0x7e00)));
    assert_true(isnan(convd_f16_to_f32(0x7c01)));
    assert_true(isnan(convd_bf16_to_f32(0x7f81)));
}

/* The inline conversions of the CPU kernels against half.c on a spread of fp32 patterns: every
 * exponent, mantissas near the rounding boundaries, both signs. */
static void test_inline_copies_match(void **state)
{
    (void)state;
    for (uint64_t u = 0; u <= 0xffffffffu; u += 4093) {
        float f = from_bits((uint32_t)u);
        assert_int_equal(cpu_f32_to_f16(f), convd_f32_to_f16(f));
        assert_int_equal(cpu_f32_to_bf16(f), convd_f32_to_bf16(f));
    }
    for (uint32_t e = 0; e < 256; e++)
        for (uint32_t m = 0; m < 0x4000; m += 3) {
            const uint32_t low[] = {m, 0x7fffffu - m, 0x1000u + m, 0x8000u ^ m};
            for (size_t i = 0; i < 4; i++) {
                uint32_t u = (e << 23) | (low[i] & 0x7fffffu);
                float f = from_bits(u), g = from_bits(u | 0x80000000u);
                assert_int_equal(cpu_f32_to_f16(f), convd_f32_to_f16(f));
                assert_int_equal(cpu_f32_to_f16(g), convd_f32_to_f16(g));
                assert_int_equal(cpu_f32_to_bf16(f), convd_f32_to_bf16(f));
            }
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_every_pattern),   cmocka_unit_test(test_bf16_every_pattern),
        cmocka_unit_test(test_ties_to_even),        cmocka_unit_test(test_overflow),
        cmocka_unit_test(test_subnormals),          cmocka_unit_test(test_nan_stays_nan),
        cmocka_unit_test(test_inline_copies_match),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
