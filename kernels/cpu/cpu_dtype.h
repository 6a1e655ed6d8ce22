/*
 * Inline element conversions for the CPU kernels. The same results as convd_f16_to_f32() and
 * friends in core/half.c (round to nearest even, NaN kept quiet, fp16 overflow to infinity),
 * written without calls and with few branches so that the compiler inlines them into the packing
 * and store loops and vectorises those. test_half checks them against half.c bit for bit.
 */
#ifndef CONVD_CPU_DTYPE_H
#define CONVD_CPU_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "convd/conv.h"

static inline uint32_t cpu_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float cpu_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* fp16 -> fp32, exact. Shifting the exponent and mantissa into place and multiplying by 2^112
 * rebiases normals and turns fp16 subnormals into the right fp32 normals in one step; infinity
 * and NaN keep the all-ones exponent. */
static inline float cpu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t bits = em << 13;
    uint32_t r = cpu_f32_bits(cpu_bits_f32(bits) * 0x1p112f);
    if (em >= 0x7c00u)
        r = 0x7f800000u | bits;
    return cpu_bits_f32(r | sign);
}

/* fp32 -> fp16, round to nearest even. Subnormal results are rounded by an fp32 addition of 0.5
 * (whose ulp is the fp16 subnormal step), normal ones by adding the rounding bias to the bits. */
static inline uint16_t cpu_f32_to_f16(float f)
{
    uint32_t x = cpu_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7fffffffu;
    uint32_t o;
    if (a >= 0x47800000u) {
        o = a > 0x7f800000u ? 0x7e00u : 0x7c00u;
    } else if (a < 0x38800000u) {
        o = cpu_f32_bits(cpu_bits_f32(a) + 0.5f) - 0x3f000000u;
    } else {
        uint32_t odd = (a >> 13) & 1u;
        a += 0xc8000fffu + odd; /* exponent 127 -> 15 (mod 2^32), plus the rounding bias */
        o = a >> 13;
    }
    return (uint16_t)(o | sign);
}

static inline float cpu_bf16_to_f32(uint16_t b)
{
    return cpu_bits_f32((uint32_t)b << 16);
}

static inline uint16_t cpu_f32_to_bf16(float f)
{
    uint32_t x = cpu_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* Element i of a tensor of dtype dt, as fp32. dt is a constant wherever this is inlined. */
static inline __attribute__((always_inline)) float cpu_load(enum convd_dtype dt, const void *x,
                                                            size_t i)
{
    if (dt == CONVD_DTYPE_FP16)
        return cpu_f16_to_f32(((const uint16_t *)x)[i]);
    if (dt == CONVD_DTYPE_BF16)
        return cpu_bf16_to_f32(((const uint16_t *)x)[i]);
    return ((const float *)x)[i];
}

/* Stores v as element i of a tensor of dtype dt, rounding once. */
static inline __attribute__((always_inline)) void cpu_store(enum convd_dtype dt, void *y, size_t i,
                                                            float v)
{
    if (dt == CONVD_DTYPE_FP16)
        ((uint16_t *)y)[i] = cpu_f32_to_f16(v);
    else if (dt == CONVD_DTYPE_BF16)
        ((uint16_t *)y)[i] = cpu_f32_to_bf16(v);
    else
        ((float *)y)[i] = v;
}

#endif
