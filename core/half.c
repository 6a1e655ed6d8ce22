/*
 * fp32 <-> fp16 / bf16 conversion on the host, round to nearest even. Bit manipulation rather
 * than _Float16 so that the results do not depend on the compiler or the CPU's F16C support.
 */
#include <string.h>

#include "convd/conv.h"

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

uint16_t convd_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t abs = x & 0x7fffffffu;

    if (abs >= 0x7f800000u) /* Inf or NaN; keep NaN a quiet NaN */
        return (uint16_t)(sign | 0x7c00u | (abs > 0x7f800000u ? 0x0200u : 0));
    if (abs >= 0x477ff000u) /* rounds to >= 65520: overflow to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) {   /* below the smallest normal fp16 (2^-14): subnormal or zero */
        if (abs < 0x33000000u) /* below half the smallest subnormal (2^-25): zero */
            return (uint16_t)sign;
        uint32_t e = abs >> 23;
        uint32_t m = (abs & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24: the value is m * 2^(e-150), fp16 unit is 2^-24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    /* normal: rebias exponent 127 -> 15 and round the 13 dropped mantissa bits */
    uint32_t r = abs - 0x38000000u; /* exponent - 112 */
    uint32_t q = r >> 13;
    uint32_t rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u)))
        q++;
    return (uint16_t)(sign | q);
}

float convd_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1f)
        return bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (m == 0)
            return bits_f32(sign);
        /* subnormal: m * 2^-24 is exact in fp32 */
        float v = (float)m * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t convd_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet, never round to Inf */
        return (uint16_t)((x >> 16) | 0x0040u);
    uint32_t lsb = (x >> 16) & 1u;
    x += 0x7fffu + lsb;
    return (uint16_t)(x >> 16);
}

float convd_bf16_to_f32(uint16_t b)
{
    return bits_f32((uint32_t)b << 16);
}
