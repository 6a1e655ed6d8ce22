/*
 * Index math of the convolution, shared by host code (validation, CPU backend, tests) and device
 * code (the HIP kernels). Plain C, static inline, so that one definition of the output size, of
 * the decode of the GEMM K dimension and of the activations serves everywhere. The only library
 * calls are the float functions of math.h the activations need, which host and device both have.
 *
 * The implicit GEMM of one group: M = N*Ho*Wo rows (output pixels), N_gemm = K/G columns (output
 * channels of the group), K_gemm = R*S*C/G (filter taps times channels per group). NHWC orders the
 * K dimension (r, s, c), so consecutive k are consecutive channels; NCHW orders it (c, r, s).
 */
#ifndef CONVD_CONV_MATH_H
#define CONVD_CONV_MATH_H

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define CONVD_HD __host__ __device__ __forceinline__
#else
#define CONVD_HD static inline
#endif

/* Output extent; <= 0 when the dilated filter is larger than the padded input. */
CONVD_HD int64_t convd_math_out_dim(int64_t in, int64_t pad_lo, int64_t pad_hi, int64_t k,
                                    int64_t stride, int64_t dil)
{
    int64_t span = dil * (k - 1) + 1;
    int64_t room = in + pad_lo + pad_hi - span;
    if (room < 0 || stride <= 0)
        return 0;
    return room / stride + 1;
}

/* Decode of a K_gemm index for NHWC weights (K, R, S, C/G): k = (r*S + s)*cpg + c. */
struct convd_math_rsc {
    int32_t r, s, c;
};

CONVD_HD struct convd_math_rsc convd_math_decode_k_nhwc(int32_t k, int32_t S, int32_t cpg)
{
    struct convd_math_rsc d;
    int32_t rs = k / cpg;
    d.c = k - rs * cpg;
    d.r = rs / S;
    d.s = rs - d.r * S;
    return d;
}

/* Decode of a K_gemm index for NCHW weights (K, C/G, R, S): k = (c*R + r)*S + s. */
CONVD_HD struct convd_math_rsc convd_math_decode_k_nchw(int32_t k, int32_t R, int32_t S)
{
    struct convd_math_rsc d;
    int32_t cr = k / S;
    d.s = k - cr * S;
    d.c = cr / R;
    d.r = cr - d.c * R;
    return d;
}

/* Input coordinate of output coordinate o at filter tap t; outside [0, in) means padding. */
CONVD_HD int32_t convd_math_in_coord(int32_t o, int32_t t, int32_t stride, int32_t pad_lo,
                                     int32_t dil)
{
    return o * stride - pad_lo + t * dil;
}

/* True when 0 <= v < n, with one unsigned comparison. */
CONVD_HD int convd_math_inside(int32_t v, int32_t n)
{
    return (uint32_t)v < (uint32_t)n;
}

/* The activation after the bias (enum convd_activation's values; the GPU passes them as int).
 * Written so that NaN stays NaN, as in PyTorch. */
CONVD_HD float convd_math_act(int act, float y, float lo, float hi)
{
    switch (act) {
    case 1: /* relu */
        return y < 0.0f ? 0.0f : y;
    case 2: /* clamp */
        return y < lo ? lo : (y > hi ? hi : y);
    case 3: /* silu */
        return y / (1.0f + expf(-y));
    case 4: { /* hardswish */
        float t = y + 3.0f;
        t = t < 0.0f ? 0.0f : (t > 6.0f ? 6.0f : t);
        return y * t * (1.0f / 6.0f);
    }
    case 5: /* gelu, erf form */
        return 0.5f * y * (1.0f + erff(y * 0.70710678118654752f));
    case 6: /* gelu, tanh form */
        return 0.5f * y * (1.0f + tanhf(0.79788456080286536f * (y + 0.044715f * y * y * y)));
    default:
        return y;
    }
}

/*
 * Division by a divisor fixed at launch, 1 <= d <= 2^31 - 1, of dividends 0 <= x <= 2^31 - 1, as
 * a multiply-high, an add and a shift (the round-up method of Granlund and Montgomery,
 * "Division by Invariant Integers using Multiplication", 1994): with l = ceil(log2(d)) and
 * m = floor(2^32 * (2^l - d) / d) + 1 (which fits 32 bits), x / d = (hi32(x * m) + x) >> l. The
 * kernels' work-item decodes divide by runtime tile counts several times per item; a hardware-less
 * integer division costs about 20 instructions, this one 3. Made once on the host.
 */
struct convd_math_fdiv {
    uint32_t d, m, l;
};

CONVD_HD struct convd_math_fdiv convd_math_fdiv_make(uint32_t d)
{
    struct convd_math_fdiv f;
    uint32_t l = 0;
    while (l < 31 && (1u << l) < d)
        l++;
    f.d = d;
    f.l = l;
    f.m = (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << l) - d)) / d + 1);
    return f;
}

CONVD_HD uint32_t convd_math_fdiv_div(uint32_t x, struct convd_math_fdiv f)
{
    const uint32_t hi = (uint32_t)(((uint64_t)x * f.m) >> 32);
    return (hi + x) >> f.l;
}

#endif
