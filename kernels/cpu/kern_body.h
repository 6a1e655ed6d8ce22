/*
 * The CPU kernels, written once and compiled once per instruction set: kern_avx512.c,
 * kern_avx2.c and kern_generic.c each set the target with #pragma GCC target, define VL (floats
 * per vector), KERN(name) (the name with the variant's suffix) and the register blocking, and
 * include this file. GCC's generic vectors (vector_size) give the width; -ffp-contract=fast
 * turns a * b + c into FMA where the target has it. Partial-vector loads and stores and the
 * fp16 conversions use the target's instructions where it has them (masked AVX-512 moves,
 * F16C), plain C elsewhere.
 *
 * Required before inclusion: VL, KBMAX, PV_FOR_KB(kb), KERN(name), KERN_NAME.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__AVX512F__) || defined(__AVX2__))
#include <immintrin.h>
#endif

#include "conv_math.h"
#include "cpu_dtype.h"
#include "cpu_internal.h"

typedef float vf __attribute__((vector_size(VL * 4)));
typedef float vfu __attribute__((vector_size(VL * 4), aligned(4), may_alias));
typedef int32_t vi __attribute__((vector_size(VL * 4)));
typedef uint32_t vu __attribute__((vector_size(VL * 4)));

#define UNROLL        _Pragma("GCC unroll 16")
#define ALWAYS_INLINE inline __attribute__((always_inline))

/* ===========================================================================================
 * Vector helpers
 * ========================================================================================= */

static ALWAYS_INLINE vf KERN(loadu)(const float *p)
{
    return *(const vfu *)p;
}

static ALWAYS_INLINE void KERN(storeu)(float *p, vf v)
{
    *(vfu *)p = v;
}

static inline size_t KERN(round_up)(size_t v, size_t m)
{
    return (v + m - 1) / m * m;
}

/* fp32 lanes <-> 16-bit lanes held in the low halves of 32-bit lanes. */
static ALWAYS_INLINE vf KERN(bf16_to_f32)(vu h)
{
    return (vf)(h << 16);
}

static ALWAYS_INLINE vu KERN(f32_to_bf16)(vf v)
{
    vu x = (vu)v;
    vu r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    vu nan = ((x >> 16) | 0x40u) & 0xffffu;
    vu is_nan = (vu)((x & 0x7fffffffu) > 0x7f800000u); /* all ones where NaN */
    return (nan & is_nan) | (r & ~is_nan);
}

/* Elements [i, i + n) of a tensor of dtype DT as fp32 lanes, zero in lanes n and up (n <= VL;
 * only those n elements are read). */
static ALWAYS_INLINE vf KERN(vload)(const enum convd_dtype DT, const void *base, size_t i, int n)
{
#if defined(__AVX512F__) && VL == 16
    const __mmask16 m = (__mmask16)_bzhi_u32(0xffffu, (unsigned)n);
    if (DT == CONVD_DTYPE_FP32)
        return (vf)_mm512_maskz_loadu_ps(m, (const float *)base + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)base + i);
    if (DT == CONVD_DTYPE_FP16)
        return (vf)_mm512_cvtph_ps(h);
    return (vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
#else
    if (DT == CONVD_DTYPE_FP32) {
        if (n == VL)
            return KERN(loadu)((const float *)base + i);
        float tmp[VL] = {0};
        memcpy(tmp, (const float *)base + i, (size_t)n * sizeof(float));
        return KERN(loadu)(tmp);
    }
    uint16_t h[VL] = {0};
    memcpy(h, (const uint16_t *)base + i, (size_t)n * sizeof(uint16_t));
#if defined(__AVX2__) && defined(__F16C__) && VL == 8
    __m128i hv;
    memcpy(&hv, h, sizeof(hv));
    if (DT == CONVD_DTYPE_FP16)
        return (vf)_mm256_cvtph_ps(hv);
    return (vf)_mm256_slli_epi32(_mm256_cvtepu16_epi32(hv), 16);
#else
    vu u;
#pragma GCC unroll 16
    for (int l = 0; l < VL; l++)
        u[l] = h[l];
    if (DT == CONVD_DTYPE_BF16)
        return KERN(bf16_to_f32)(u);
    vf r;
#pragma GCC unroll 16
    for (int l = 0; l < VL; l++)
        r[l] = cpu_f16_to_f32(h[l]);
    return r;
#endif
#endif
}

/* Stores the first n lanes of v as elements [i, i + n) of a tensor of dtype DT, rounding to
 * nearest even for the 16-bit types. Writes nothing else. */
static ALWAYS_INLINE void KERN(vstore)(const enum convd_dtype DT, void *base, size_t i, vf v, int n)
{
#if defined(__AVX512F__) && VL == 16
    const __mmask16 m = (__mmask16)_bzhi_u32(0xffffu, (unsigned)n);
    if (DT == CONVD_DTYPE_FP32) {
        _mm512_mask_storeu_ps((float *)base + i, m, (__m512)v);
        return;
    }
    __m256i h;
    if (DT == CONVD_DTYPE_FP16)
        h = _mm512_cvtps_ph((__m512)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    else
        h = _mm512_cvtepi32_epi16((__m512i)KERN(f32_to_bf16)(v));
    _mm256_mask_storeu_epi16((uint16_t *)base + i, m, h);
#else
    if (DT == CONVD_DTYPE_FP32) {
        if (n == VL) {
            KERN(storeu)((float *)base + i, v);
            return;
        }
        float tmp[VL];
        KERN(storeu)(tmp, v);
        memcpy((float *)base + i, tmp, (size_t)n * sizeof(float));
        return;
    }
    uint16_t h[VL];
#if defined(__AVX2__) && defined(__F16C__) && VL == 8
    if (DT == CONVD_DTYPE_FP16) {
        __m128i hv = _mm256_cvtps_ph((__m256)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        memcpy(h, &hv, sizeof(hv));
    } else {
        vu b = KERN(f32_to_bf16)(v);
#pragma GCC unroll 16
        for (int l = 0; l < VL; l++)
            h[l] = (uint16_t)b[l];
    }
#else
    if (DT == CONVD_DTYPE_FP16) {
#pragma GCC unroll 16
        for (int l = 0; l < VL; l++)
            h[l] = cpu_f32_to_f16(v[l]);
    } else {
        vu b = KERN(f32_to_bf16)(v);
#pragma GCC unroll 16
        for (int l = 0; l < VL; l++)
            h[l] = (uint16_t)b[l];
    }
#endif
    memcpy((uint16_t *)base + i, h, (size_t)n * sizeof(uint16_t));
#endif
}

/* In-register transpose of VL x VL floats: v[i][j] -> v[j][i]. Each stage swaps the
 * off-diagonal h x h blocks, which exchanges bit h of the row and of the column index; after
 * every power of two below VL each element has its row and column swapped. */
#if VL == 16
#define KERN_LANES(F, h)                                                                           \
    F(0, h), F(1, h), F(2, h), F(3, h), F(4, h), F(5, h), F(6, h), F(7, h), F(8, h), F(9, h),      \
        F(10, h), F(11, h), F(12, h), F(13, h), F(14, h), F(15, h)
#elif VL == 8
#define KERN_LANES(F, h) F(0, h), F(1, h), F(2, h), F(3, h), F(4, h), F(5, h), F(6, h), F(7, h)
#else
#define KERN_LANES(F, h) F(0, h), F(1, h), F(2, h), F(3, h)
#endif
#define KERN_LO(j, h)   (((j) & (h)) ? VL + (j) - (h) : (j))
#define KERN_EVEN(j, h) (2 * (j) + (h))
#define KERN_HI(j, h)   (((j) & (h)) ? VL + (j) : (j) + (h))

#define KERN_TRANSPOSE_STAGE(v, h)                                                                 \
    do {                                                                                           \
        UNROLL for (int i_ = 0; i_ < VL; i_++) if ((i_ & (h)) == 0)                                \
        {                                                                                          \
            vf a_ = v[i_], b_ = v[i_ + (h)];                                                       \
            v[i_] = __builtin_shuffle(a_, b_, (vi){KERN_LANES(KERN_LO, h)});                       \
            v[i_ + (h)] = __builtin_shuffle(a_, b_, (vi){KERN_LANES(KERN_HI, h)});                 \
        }                                                                                          \
    } while (0)

static ALWAYS_INLINE void KERN(transpose)(vf v[VL])
{
    KERN_TRANSPOSE_STAGE(v, 1);
    KERN_TRANSPOSE_STAGE(v, 2);
#if VL >= 8
    KERN_TRANSPOSE_STAGE(v, 4);
#endif
#if VL >= 16
    KERN_TRANSPOSE_STAGE(v, 8);
#endif
}

/* Zeroes floats [from, to) of d with whole vectors: up to VL - 1 floats after `to` are zeroed
 * too, which callers allow for (they write those later, or they are slack). */
static ALWAYS_INLINE void KERN(zero_span)(float *d, int64_t from, int64_t to)
{
    for (int64_t q = from; q < to; q += VL)
        KERN(storeu)(d + q, (vf){0});
}

#define KERN_DT_DISPATCH(dt, call)                                                                 \
    do {                                                                                           \
        switch (dt) {                                                                              \
        case CONVD_DTYPE_FP16: {                                                                   \
            const enum convd_dtype DT = CONVD_DTYPE_FP16;                                          \
            call;                                                                                  \
        } break;                                                                                   \
        case CONVD_DTYPE_BF16: {                                                                   \
            const enum convd_dtype DT = CONVD_DTYPE_BF16;                                          \
            call;                                                                                  \
        } break;                                                                                   \
        default: {                                                                                 \
            const enum convd_dtype DT = CONVD_DTYPE_FP32;                                          \
            call;                                                                                  \
        } break;                                                                                   \
        }                                                                                          \
    } while (0)

/* Converts n elements of dtype DT to fp32 (weights of 16-bit problems, once per task). */
static ALWAYS_INLINE void KERN(to_f32_dt)(const enum convd_dtype DT, const void *src, size_t n,
                                          float *dst)
{
    size_t i = 0;
    for (; i + VL <= n; i += VL)
        KERN(storeu)(dst + i, KERN(vload)(DT, src, i, VL));
    if (i < n) {
        vf v = KERN(vload)(DT, src, i, (int)(n - i));
        KERN(vstore)(CONVD_DTYPE_FP32, dst, i, v, (int)(n - i));
    }
}

/* ===========================================================================================
 * CPU_ALGO_PLANAR
 *
 * A task owns (image n, groups [g0, g0 + gcount), output rows [oh0, oh0 + bhn)). It copies the
 * input rows that band reads, for its channels, into fp32 planes padded with zeros; a stride s
 * splits each row into s phase planes so that the taps of consecutive output pixels read
 * consecutive floats. Output pixel (oh, ow) of the band becomes q = oh * wq + ow, and tap (r, s)
 * of every pixel reads plane[phase(r, s)][q + offset(r, s)]: the whole band is a 1-D convolution
 * over q with one offset per tap. The columns ow >= out_w of each flattened row are computed and
 * thrown away, which is cheaper than masking (wq - out_w is the padding plus the filter width).
 *
 * The weights are read where they are (fp32) or from an fp32 copy in the layout they have
 * (16-bit): the micro-kernel walks K = (c, t) in the order the layout stores it, (c, t) for
 * NCHW and (t, c) for NHWC, so its weight pointer only ever steps by one, and reaches output
 * channel kk of its block at a fixed stride cpg * R * S.
 * ========================================================================================= */

/* One register block: acc[KB][PV] vectors = KB output channels x PV*VL pixels, summed over
 * K = na x nb steps; step (a, b) reads x + offa[a] + offb[b] and weight w[kk * wk]. */
static ALWAYS_INLINE void KERN(planar_block)(const float *restrict x,
                                             const ptrdiff_t *restrict offa, int na,
                                             const ptrdiff_t *restrict offb, int nb,
                                             const float *restrict w, size_t wk, float *restrict o,
                                             size_t ldo, const int KB, const int PV)
{
    vf acc[KBMAX][8];
#pragma GCC unroll 16
    for (int k = 0; k < KB; k++)
#pragma GCC unroll 16
        for (int v = 0; v < PV; v++)
            acc[k][v] = (vf){0};
    for (int a = 0; a < na; a++) {
        const float *xa = x + offa[a];
        for (int b = 0; b < nb; b++) {
            const float *xp = xa + offb[b];
            vf xv[8];
#pragma GCC unroll 16
            for (int v = 0; v < PV; v++)
                xv[v] = KERN(loadu)(xp + v * VL);
#pragma GCC unroll 16
            for (int k = 0; k < KB; k++) {
                const float wv = w[k * wk];
#pragma GCC unroll 16
                for (int v = 0; v < PV; v++)
                    acc[k][v] += xv[v] * wv;
            }
            w++;
        }
    }
#pragma GCC unroll 16
    for (int k = 0; k < KB; k++)
#pragma GCC unroll 16
        for (int v = 0; v < PV; v++)
            KERN(storeu)(o + (size_t)k * ldo + (size_t)v * VL, acc[k][v]);
}

/* All pixels [0, npix) of one block of KB output channels: full blocks of PV vectors, then one
 * narrower block for the rest (rounded up to a vector; the tile and planes have room). */
static ALWAYS_INLINE void KERN(planar_row)(const float *x, const ptrdiff_t *offa, int na,
                                           const ptrdiff_t *offb, int nb, const float *w, size_t wk,
                                           float *o, size_t ldo, int npix, const int KB)
{
    const int PV = PV_FOR_KB(KB);
    int q = 0;
    for (; q + PV * VL <= npix; q += PV * VL)
        KERN(planar_block)(x + q, offa, na, offb, nb, w, wk, o + q, ldo, KB, PV);
    int rest = (npix - q + VL - 1) / VL;
    switch (rest) {
#define PLANAR_TAIL(n)                                                                             \
    case n:                                                                                        \
        if (n <= PV)                                                                               \
            KERN(planar_block)                                                                     \
        (x + q, offa, na, offb, nb, w, wk, o + q, ldo, KB, n <= PV ? n : PV);                      \
        break;
        PLANAR_TAIL(1)
        PLANAR_TAIL(2)
        PLANAR_TAIL(3)
        PLANAR_TAIL(4)
        PLANAR_TAIL(5)
        PLANAR_TAIL(6)
        PLANAR_TAIL(7)
        PLANAR_TAIL(8)
#undef PLANAR_TAIL
    default:
        break;
    }
}

typedef void (*KERN(planar_row_fn))(const float *x, const ptrdiff_t *offa, int na,
                                    const ptrdiff_t *offb, int nb, const float *w, size_t wk,
                                    float *o, size_t ldo, int npix);

#define PLANAR_ROW_KB(kb)                                                                          \
    static void KERN(planar_row_##kb)(const float *x, const ptrdiff_t *offa, int na,               \
                                      const ptrdiff_t *offb, int nb, const float *w, size_t wk,    \
                                      float *o, size_t ldo, int npix)                              \
    {                                                                                              \
        KERN(planar_row)(x, offa, na, offb, nb, w, wk, o, ldo, npix, kb < KBMAX ? kb : KBMAX);     \
    }
PLANAR_ROW_KB(1)
PLANAR_ROW_KB(2)
PLANAR_ROW_KB(3)
PLANAR_ROW_KB(4)
PLANAR_ROW_KB(5)
PLANAR_ROW_KB(6)
PLANAR_ROW_KB(7)
PLANAR_ROW_KB(8)
#undef PLANAR_ROW_KB

static const KERN(planar_row_fn) KERN(planar_rows)[9] = {
    NULL,
    KERN(planar_row_1),
    KERN(planar_row_2),
    KERN(planar_row_3),
    KERN(planar_row_4),
    KERN(planar_row_5),
    KERN(planar_row_6),
    KERN(planar_row_7),
    KERN(planar_row_8),
};

/* Plane columns [lo, hi) of a plane row hold input columns iw0 + (col - lo) * sw; the rest of
 * the row is padding. */
struct KERN(span) {
    int64_t lo, hi, iw0;
};

static ALWAYS_INLINE struct KERN(span) KERN(planar_span)(const struct cpu_plan *pl, int base_c)
{
    const struct convd_problem *p = &pl->p;
    const int sw = p->stride_w;
    struct KERN(span) sp;
    const int64_t a = (int64_t)p->pad_left - base_c;
    sp.lo = a > 0 ? (a + sw - 1) / sw : 0;
    const int64_t e = (int64_t)p->w + a;
    sp.hi = e > 0 ? (e + sw - 1) / sw : 0;
    if (sp.hi > pl->wq)
        sp.hi = pl->wq;
    if (sp.lo > sp.hi)
        sp.lo = sp.hi;
    sp.iw0 = sp.lo * sw + base_c - p->pad_left;
    return sp;
}

/* NCHW: each plane row is a (strided, for sw > 1) run of one input row. */
static ALWAYS_INLINE void KERN(planar_pack_row_nchw)(const struct cpu_plan *pl, const void *x,
                                                     size_t src, struct KERN(span) sp, float *d,
                                                     int nc, const enum convd_dtype DT)
{
    const struct convd_problem *p = &pl->p;
    const size_t plane_in = (size_t)p->h * p->w;
    const int sw = p->stride_w;
    for (int c = 0; c < nc; c++, src += plane_in) {
        float *dc = d + (size_t)c * pl->cs;
        KERN(zero_span)(dc, 0, sp.lo);
        int64_t q = sp.lo;
        if (sw == 1) {
            const size_t s0 = src - (size_t)sp.lo; /* element of plane column 0 */
            for (; q + VL <= sp.hi; q += VL)
                KERN(storeu)(dc + q, KERN(vload)(DT, x, s0 + (size_t)q, VL));
            if (q < sp.hi) /* zeros after the run: the right padding starts here anyway */
                KERN(storeu)(dc + q, KERN(vload)(DT, x, s0 + (size_t)q, (int)(sp.hi - q)));
        } else if (sw == 2) {
            /* two vectors of the row, even lanes kept */
            for (; q < sp.hi; q += VL) {
                const int need = 2 * (sp.hi - q < VL ? (int)(sp.hi - q) : VL) - 1;
                const size_t e = src + (size_t)(q - sp.lo) * 2;
                vf a = KERN(vload)(DT, x, e, need < VL ? need : VL);
                vf b = need > VL ? KERN(vload)(DT, x, e + VL, need - VL) : (vf){0};
                KERN(storeu)(dc + q, __builtin_shuffle(a, b, (vi){KERN_LANES(KERN_EVEN, 0)}));
            }
        } else {
            for (; q < sp.hi; q++)
                dc[q] = cpu_load(DT, x, src + (size_t)((q - sp.lo) * sw));
        }
        KERN(zero_span)(dc, sp.hi, pl->wq);
    }
}

/* NHWC: VL pixels x VL channels at a time, transposed in registers. */
static ALWAYS_INLINE void KERN(planar_pack_row_nhwc)(const struct cpu_plan *pl, const void *x,
                                                     size_t src, struct KERN(span) sp, float *d,
                                                     int nc, const enum convd_dtype DT)
{
    const struct convd_problem *p = &pl->p;
    const size_t step = (size_t)p->stride_w * p->c; /* elements between the pixels of a row */
    for (int c = 0; c < nc; c++)
        KERN(zero_span)(d + (size_t)c * pl->cs, 0, sp.lo);
    for (int64_t q = sp.lo; q < sp.hi; q += VL) {
        const int npx = sp.hi - q < VL ? (int)(sp.hi - q) : VL;
        const size_t s = src + (size_t)(q - sp.lo) * step;
        for (int cb = 0; cb < nc; cb += VL) {
            const int ncc = nc - cb < VL ? nc - cb : VL;
            vf v[VL];
#pragma GCC unroll 16
            for (int i = 0; i < VL; i++)
                v[i] = i < npx ? KERN(vload)(DT, x, s + (size_t)i * step + cb, ncc) : (vf){0};
            KERN(transpose)(v);
            for (int i = 0; i < ncc; i++)
                KERN(storeu)(d + (size_t)(cb + i) * pl->cs + q, v[i]);
        }
    }
    for (int c = 0; c < nc; c++)
        KERN(zero_span)(d + (size_t)c * pl->cs, sp.hi, pl->wq);
}

/* The input rows a band reads, channels [c0, c0 + nc), into zero-padded planes: every float of
 * [0, bq * wq) of every plane is written (zeros outside the image). Rows are written in order,
 * so a row's whole-vector spill past its end is overwritten by the next row; the plane's slack
 * after bq * wq is zeroed last. */
static ALWAYS_INLINE void KERN(planar_pack_x_dt)(const struct cpu_plan *pl, const void *x, int n,
                                                 int c0, int nc, int oh0, float *dst,
                                                 const enum convd_dtype DT)
{
    const struct convd_problem *p = &pl->p;
    const int sh = p->stride_h, H = p->h, W = p->w, C = p->c;
    const int wq = pl->wq, bq = pl->bq, ncp = pl->ncp;
    const bool nchw = p->layout == CONVD_LAYOUT_NCHW;

    for (int jr = 0; jr < pl->nrp; jr++) {
        const int base_r = pl->row_phase ? jr : jr * p->dil_h;
        for (int jc = 0; jc < ncp; jc++) {
            const struct KERN(span) sp = KERN(planar_span)(pl, pl->col_phase ? jc : jc * p->dil_w);
            float *d = dst + (size_t)(jr * ncp + jc) * pl->ps;
            for (int i = 0; i < bq; i++, d += wq) {
                const int64_t ih = (int64_t)oh0 * sh + (int64_t)i * sh + base_r - p->pad_top;
                if (ih < 0 || ih >= H) {
                    for (int c = 0; c < nc; c++)
                        KERN(zero_span)(d + (size_t)c * pl->cs, 0, wq);
                } else if (nchw) {
                    size_t src = (((size_t)n * C + c0) * H + (size_t)ih) * W + (size_t)sp.iw0;
                    KERN(planar_pack_row_nchw)(pl, x, src, sp, d, nc, DT);
                } else {
                    size_t src = (((size_t)n * H + (size_t)ih) * W + (size_t)sp.iw0) * C + c0;
                    KERN(planar_pack_row_nhwc)(pl, x, src, sp, d, nc, DT);
                }
            }
        }
    }
    const size_t used = (size_t)bq * wq;
    for (int c = 0; c < nc; c++)
        for (int pi = 0; pi < pl->nrp * ncp; pi++)
            KERN(zero_span)
    (dst + (size_t)c * pl->cs + (size_t)pi * pl->ps, (int64_t)used, (int64_t)(pl->ps - VL + 1));
}

/* Bias and activation of one vector of outputs. ReLU, the common one, stays a vector mask; the
 * others go lane by lane through the definition every backend shares (conv_math.h). */
static ALWAYS_INLINE vf KERN(epilogue)(vf v, vf b, const struct convd_problem *p)
{
    v += b;
    if (p->activation == CONVD_ACT_RELU) {
        v = (vf)((vi)v & ~(v < 0.0f)); /* NaN stays NaN, as in PyTorch */
    } else if (p->activation != CONVD_ACT_NONE) {
        for (int i = 0; i < VL; i++)
            v[i] = convd_math_act((int)p->activation, v[i], p->act_min, p->act_max);
    }
    return v;
}

static ALWAYS_INLINE void KERN(planar_store_dt)(const struct cpu_plan *pl, const void *bias,
                                                void *y, int n, int k0, int nk, int oh0, int bhn,
                                                const float *tile, const enum convd_dtype DT)
{
    const struct convd_problem *p = &pl->p;
    const int Ho = pl->oh, Wo = pl->ow, K = p->k;
    const size_t ldt = pl->ldt, wq = (size_t)pl->wq;
    if (p->layout == CONVD_LAYOUT_NCHW) {
        for (int kl = 0; kl < nk; kl++) {
            const int k = k0 + kl;
            const vf b = (vf){0} + (bias != NULL ? cpu_load(DT, bias, (size_t)k) : 0.0f);
            for (int r = 0; r < bhn; r++) {
                const float *t = tile + (size_t)kl * ldt + (size_t)r * wq;
                const size_t o = (((size_t)n * K + k) * Ho + oh0 + r) * Wo;
                int ow = 0;
                for (; ow + VL <= Wo; ow += VL)
                    KERN(vstore)(DT, y, o + ow, KERN(epilogue)(KERN(loadu)(t + ow), b, p), VL);
                if (ow < Wo)
                    KERN(vstore)
                (DT, y, o + ow, KERN(epilogue)(KERN(loadu)(t + ow), b, p), Wo - ow);
            }
        }
        return;
    }
    /* NHWC: VL channels x VL pixels, transposed so that each vector is one pixel's channels. */
    for (int kb = 0; kb < nk; kb += VL) {
        const int nkc = nk - kb < VL ? nk - kb : VL;
        const vf b = bias != NULL ? KERN(vload)(DT, bias, (size_t)(k0 + kb), nkc) : (vf){0};
        for (int r = 0; r < bhn; r++) {
            const float *t = tile + (size_t)kb * ldt + (size_t)r * wq;
            const size_t o = (((size_t)n * Ho + oh0 + r) * Wo) * K + k0 + kb;
            for (int ow = 0; ow < Wo; ow += VL) {
                const int npx = Wo - ow < VL ? Wo - ow : VL;
                vf v[VL];
#pragma GCC unroll 16
                for (int i = 0; i < VL; i++)
                    v[i] = i < nkc ? KERN(loadu)(t + (size_t)i * ldt + ow) : (vf){0};
                KERN(transpose)(v);
                for (int i = 0; i < npx; i++)
                    KERN(vstore)
                (DT, y, o + (size_t)(ow + i) * K, KERN(epilogue)(v[i], b, p), nkc);
            }
        }
    }
}

static void KERN(planar_task)(void *arg, size_t task, struct cpu_scratch *s)
{
    const struct cpu_job_ctx *j = arg;
    const struct cpu_plan *pl = j->plan;
    const struct convd_problem *p = &pl->p;
    const int cpg = pl->cpg, kpg = pl->kpg, T = pl->taps, KB = pl->kb;

    const int band = (int)(task % (size_t)pl->nbands);
    const size_t rest = task / (size_t)pl->nbands;
    const int gblk = (int)(rest % (size_t)pl->ngb);
    const int n = (int)(rest / (size_t)pl->ngb);
    const int g0 = gblk * pl->gb;
    const int gcount = p->groups - g0 < pl->gb ? p->groups - g0 : pl->gb;
    const int oh0 = band * pl->bh;
    const int bhn = pl->oh - oh0 < pl->bh ? pl->oh - oh0 : pl->bh;
    const int npix = bhn * pl->wq;
    const size_t wsize = (size_t)kpg * cpg * T; /* weights of one group */

    /* scratch: input planes | output tile | fp32 weights (16-bit dtypes) | offsets */
    float *xin = s->buf;
    float *tile = xin + (size_t)pl->gb * cpg * pl->cs;
    float *wf = tile + (size_t)pl->gb * kpg * pl->ldt + VL;
    ptrdiff_t *offs = (ptrdiff_t *)(wf + (p->dtype == CONVD_DTYPE_FP32
                                              ? 0
                                              : KERN(round_up)((size_t)pl->gb * wsize, 16)));

    const enum convd_dtype dt = p->dtype;
    const float *wg; /* weights of group g0 in fp32, the tensor's own layout */
    if (dt == CONVD_DTYPE_FP32) {
        wg = (const float *)j->t.weight + (size_t)g0 * wsize;
    } else {
        const size_t off = (size_t)g0 * wsize * 2;
        KERN_DT_DISPATCH(dt, KERN(to_f32_dt)(DT, (const uint8_t *)j->t.weight + off,
                                             (size_t)gcount * wsize, wf));
        wg = wf;
    }
    KERN_DT_DISPATCH(
        dt, KERN(planar_pack_x_dt)(pl, j->t.input, n, g0 * cpg, gcount * cpg, oh0, xin, DT));

    /* Offsets of the two K loops: taps (as the planes were laid out above) and channels. */
    ptrdiff_t *toff = offs, *coff = offs + T;
    for (int r = 0; r < p->r; r++) {
        const int a = r * p->dil_h;
        const int jr = pl->row_phase ? a % p->stride_h : r;
        const int offr = pl->row_phase ? a / p->stride_h : 0;
        for (int c = 0; c < p->s; c++) {
            const int b = c * p->dil_w;
            const int jc = pl->col_phase ? b % p->stride_w : c;
            const int offc = pl->col_phase ? b / p->stride_w : 0;
            toff[r * p->s + c] = (ptrdiff_t)((size_t)(jr * pl->ncp + jc) * pl->ps +
                                             (size_t)offr * pl->wq + (size_t)offc);
        }
    }
    for (int c = 0; c < cpg; c++)
        coff[c] = (ptrdiff_t)((size_t)c * pl->cs);
    const bool nchw = p->layout == CONVD_LAYOUT_NCHW;
    const ptrdiff_t *offa = nchw ? coff : toff, *offb = nchw ? toff : coff;
    const int na = nchw ? cpg : T, nb = nchw ? T : cpg;

    for (int gi = 0; gi < gcount; gi++) {
        const float *xg = xin + (size_t)gi * cpg * pl->cs;
        for (int kb0 = 0; kb0 < kpg; kb0 += KB) {
            const int kbw = kpg - kb0 < KB ? kpg - kb0 : KB;
            const size_t kl = (size_t)gi * kpg + kb0;
            KERN(planar_rows)
            [kbw](xg, offa, na, offb, nb, wg + kl * cpg * T, (size_t)cpg * T, tile + kl * pl->ldt,
                  pl->ldt, npix);
        }
    }

    KERN_DT_DISPATCH(dt, KERN(planar_store_dt)(pl, p->has_bias ? j->t.bias : NULL, j->t.output, n,
                                               g0 * kpg, gcount * kpg, oh0, bhn, tile, DT));
}

/* ===========================================================================================
 * CPU_ALGO_NHWC_CV: channel-vectorised NHWC for small groups
 *
 * In NHWC the channels of a pixel are contiguous, and when kpg divides VL a vector of VL output
 * channels holds whole groups. Two cases run straight on the tensors, with no packing:
 *
 * - cpg = kpg = M (M a power of two <= VL): the input vector at the same channels holds exactly
 *   the input channels of those groups. Lane l (group-local output j = l % M) needs input lane
 *   l - j + c for every c < M; taking c = (j + d) % M for d = 0..M-1 turns that into a rotation
 *   by d inside each block of M lanes, so output lane l accumulates rot_d(x)[l] * w_d[l] with
 *   w_d[l] = w[k0 + l][tap][(j + d) % M]. d = 0 needs no shuffle; depthwise (M = 1) none at all.
 * - cpg = 1, kpg = M (depthwise with a channel multiplier): a vector of VL input channels feeds
 *   M accumulators, one per output j of each group, interleaved into the output on the store.
 *
 * A task owns (image, a run of channel vectors, a band of output rows). Output pixels whose taps
 * all fall inside the image run in register blocks of P pixels without bounds checks; the border
 * pixels run one at a time with checks. fp16 and bf16 are converted to fp32 as vectors are
 * loaded, and rounded once on the store.
 * ========================================================================================= */

static ALWAYS_INLINE vf KERN(rot)(vf v, const int M, const int d)
{
    vi idx;
#pragma GCC unroll 16
    for (int l = 0; l < VL; l++)
        idx[l] = (l & ~(M - 1)) | ((l + d) & (M - 1));
    return __builtin_shuffle(v, idx);
}

/* The M output vectors of a multiplier-M block: lane l of acc[j] is output channel
 * (g0 + l) * M + j, so output vector i holds groups [i * VL / M, (i + 1) * VL / M). */
static ALWAYS_INLINE void KERN(interleave)(vf *acc, vf *out, const int M)
{
    if (M == 1) {
        out[0] = acc[0];
        return;
    }
    vf t[4];
#pragma GCC unroll 16
    for (int i = 0; i < M; i++)
        t[i] = acc[i];
        /* log2(M) rounds of a perfect shuffle of pairs: after them, the lanes of t are in output
         * order across t[0..M) */
#pragma GCC unroll 16
    for (int span = M / 2; span >= 1; span /= 2) {
        vf u[4];
#pragma GCC unroll 16
        for (int i = 0; i < M / 2; i++) {
            vi lo, hi;
#pragma GCC unroll 16
            for (int l = 0; l < VL; l++) {
                lo[l] = (l / 2) + (l % 2 ? VL : 0);
                hi[l] = VL / 2 + (l / 2) + (l % 2 ? VL : 0);
            }
            u[2 * i] = __builtin_shuffle(t[i], t[i + M / 2], lo);
            u[2 * i + 1] = __builtin_shuffle(t[i], t[i + M / 2], hi);
        }
#pragma GCC unroll 16
        for (int i = 0; i < M; i++)
            t[i] = u[i];
    }
#pragma GCC unroll 16
    for (int i = 0; i < M; i++)
        out[i] = t[i];
}

/* The multiply-adds of one tap for P pixels: rotations for whole groups (MI > 1), one
 * accumulator per group output for a multiplier. */
static ALWAYS_INLINE void KERN(cv_fmas)(vf acc[4][16], const vf *xv, const float *w, const int MI,
                                        const int NA, const int P)
{
    if (MI > 1) {
#pragma GCC unroll 16
        for (int d = 0; d < MI; d++) {
            const vf wv = KERN(loadu)(w + (size_t)d * VL);
#pragma GCC unroll 16
            for (int q = 0; q < P; q++)
                acc[0][q] += (d == 0 ? xv[q] : KERN(rot)(xv[q], MI, d)) * wv;
        }
    } else {
#pragma GCC unroll 16
        for (int jj = 0; jj < NA; jj++) {
            const vf wv = KERN(loadu)(w + (size_t)jj * VL);
#pragma GCC unroll 16
            for (int q = 0; q < P; q++)
                acc[jj][q] += xv[q] * wv;
        }
    }
}

/* One register block of P output pixels in row oh, starting at ow, for the channel vector whose
 * lane 0 is input channel c0 and output channel k0; ncl lanes (input channels) are valid, all of
 * them when FULL. CHECK: the pixels may have taps outside the image (border pixels; P is 1). */
static ALWAYS_INLINE void KERN(cv_block)(const struct cpu_plan *pl, const void *x, const float *wp,
                                         const vf *bias, void *y, int n, int oh, int ow, int c0,
                                         int k0, int ncl, const enum convd_dtype DT, const int MI,
                                         const int MO, const int P, const bool CHECK,
                                         const bool FULL, const bool SHIFT)
{
    const struct convd_problem *p = &pl->p;
    const int H = p->h, W = p->w, C = p->c, K = p->k, S = p->s;
    const int NA = MI > 1 ? 1 : MO; /* accumulators per pixel */
    if (FULL)
        ncl = VL;
    vf acc[4][16];
#pragma GCC unroll 16
    for (int a = 0; a < NA; a++)
#pragma GCC unroll 16
        for (int q = 0; q < P; q++)
            acc[a][q] = (vf){0};
    const int iw0 = ow * p->stride_w - p->pad_left;
    const ptrdiff_t step = (ptrdiff_t)p->stride_w * C; /* between the block's pixels */
    const ptrdiff_t dstep = (ptrdiff_t)p->dil_w * C;   /* between the taps of a row */
    const size_t wtap = (size_t)NA * (MI > 1 ? MI : 1) * VL;
    for (int r = 0; r < p->r; r++) {
        const int ih = oh * p->stride_h - p->pad_top + r * p->dil_h;
        if (ih < 0 || ih >= H)
            continue;
        /* element (ih, iw0, c0); iw0 is negative for left border pixels */
        ptrdiff_t e = ((ptrdiff_t)(((size_t)n * H + (size_t)ih) * W) + iw0) * C + c0;
        const float *w = wp + (size_t)r * S * wtap;
        if (SHIFT) {
            /* stride 1, no dilation: tap s + 1 of pixel q is tap s of pixel q + 1, so the
             * window of inputs shifts by one pixel per tap and only one new vector is loaded */
            vf xv[16];
            ptrdiff_t eq = e;
#pragma GCC unroll 16
            for (int q = 0; q < P; q++, eq += C)
                xv[q] = KERN(vload)(DT, x, (size_t)eq, ncl);
            for (int s = 0; s < S; s++, w += wtap) {
                KERN(cv_fmas)(acc, xv, w, MI, NA, P);
                if (s + 1 < S) {
#pragma GCC unroll 16
                    for (int q = 0; q + 1 < P; q++)
                        xv[q] = xv[q + 1];
                    xv[P - 1] = KERN(vload)(DT, x, (size_t)eq, ncl);
                    eq += C;
                }
            }
            continue;
        }
        for (int s = 0; s < S; s++, e += dstep, w += wtap) {
            vf xv[16];
            ptrdiff_t eq = e;
            if (CHECK) {
                /* border block: a tap outside the image contributes zero */
                const int iws = iw0 + s * p->dil_w;
                if (iws + (P - 1) * p->stride_w < 0 || iws >= W)
                    continue;
#pragma GCC unroll 16
                for (int q = 0; q < P; q++, eq += step) {
                    const int iw = iws + q * p->stride_w;
                    xv[q] = iw >= 0 && iw < W ? KERN(vload)(DT, x, (size_t)eq, ncl) : (vf){0};
                }
            } else {
#pragma GCC unroll 16
                for (int q = 0; q < P; q++, eq += step)
                    xv[q] = KERN(vload)(DT, x, (size_t)eq, ncl);
            }
            KERN(cv_fmas)(acc, xv, w, MI, NA, P);
        }
    }
    size_t o = (((size_t)n * pl->oh + oh) * pl->ow + ow) * K + k0;
#pragma GCC unroll 16
    for (int q = 0; q < P; q++, o += (size_t)K) {
        if (MI > 1 || MO == 1) {
            KERN(vstore)(DT, y, o, KERN(epilogue)(acc[0][q], bias[0], p), ncl);
        } else {
            vf a[4], out[4];
#pragma GCC unroll 16
            for (int jj = 0; jj < MO; jj++)
                a[jj] = acc[jj][q];
            KERN(interleave)(a, out, MO);
#pragma GCC unroll 16
            for (int i = 0; i < MO; i++) {
                const int nv = ncl * MO - i * VL;
                if (nv > 0)
                    KERN(vstore)
                (DT, y, o + (size_t)i * VL, KERN(epilogue)(out[i], bias[i], p),
                 nv < VL ? nv : VL);
            }
        }
    }
}

/* One output row over channel vectors [v0, v1). Interior pixels (every tap inside the image)
 * run in register blocks of P, then 4, then 1; border pixels in blocks of 4 (then 1) whose
 * taps outside the image read zeros. Enough independent accumulators keep the FMA pipes busy
 * at the borders too, which matters for large filters (7x7 has 6 border pixels per row). The
 * channel vectors are the innermost loop, so that a block's pixels are read whole (all their
 * channels) while they are in L1. */
#define KERN_CV_BLOCK(PP, CHECK, FULL, SHIFT)                                                      \
    KERN(cv_block)(pl, x, w, b, y, n, oh, ow, c0, k0, ncl, DT, MI, MO, PP, CHECK, FULL, SHIFT)

static ALWAYS_INLINE void KERN(cv_row)(const struct cpu_plan *pl, const void *x, const float *wp,
                                       const vf *bias, void *y, int n, int oh, int v0, int v1,
                                       const enum convd_dtype DT, const int MI, const int MO,
                                       const int P)
{
    const struct convd_problem *p = &pl->p;
    const int lo = pl->cv_ow_lo, hi = pl->cv_ow_hi, m = MI > 1 ? MI : MO;
    const size_t wvec = (size_t)pl->taps * m * VL; /* weights of one channel vector */
    const int nfull = (p->c - v0 * VL) / VL < v1 - v0 ? (p->c - v0 * VL) / VL : v1 - v0;
    const bool shift = p->stride_w == 1 && p->dil_w == 1;
    int ow = 0;
    while (ow < pl->ow) {
        /* a full block of P interior pixels, else a checked block of 4 (or 1 at the very end)
         * that may reach into the interior: the borders and the interior's remainder */
        const bool border = !(ow >= lo && ow + P <= hi);
        const int pp = border ? (ow + 4 <= pl->ow ? 4 : 1) : P;
        for (int v = v0; v < v1; v++) {
            const int c0 = v * VL, k0 = c0 * (MI > 1 ? 1 : MO);
            const int ncl = p->c - c0 < VL ? p->c - c0 : VL;
            const float *w = wp + (size_t)(v - v0) * wvec;
            const vf *b = bias + (size_t)(v - v0) * MO;
            const bool full = v - v0 < nfull;
            if (border && pp == 4)
                KERN_CV_BLOCK(4, true, false, false);
            else if (border)
                KERN_CV_BLOCK(1, true, false, false);
            else if (full && shift)
                KERN_CV_BLOCK(P, false, true, true);
            else if (full)
                KERN_CV_BLOCK(P, false, true, false);
            else
                KERN_CV_BLOCK(P, false, false, false);
        }
        ow += pp;
    }
}
#undef KERN_CV_BLOCK

/* Weights of channel vector `cv` in kernel order [tap][d or j][VL] as fp32, and its bias. */
static ALWAYS_INLINE void KERN(cv_pack_dt)(const struct cpu_plan *pl, const void *w,
                                           const void *bias, int c0, int k0, int ncl, float *wp,
                                           vf *bv, const enum convd_dtype DT, const int MI,
                                           const int MO)
{
    const int T = pl->taps;
    if (MI > 1) {
        /* w_d[l] = w[k0 + l][t][(l % M + d) % M]; NHWC weights are (K, R, S, cpg) */
        for (int t = 0; t < T; t++)
            for (int d = 0; d < MI; d++)
                for (int l = 0; l < VL; l++)
                    wp[((size_t)t * MI + d) * VL + l] =
                        l < ncl
                            ? cpu_load(DT, w, ((size_t)(k0 + l) * T + t) * MI + ((l % MI + d) % MI))
                            : 0.0f;
        bv[0] = bias != NULL ? KERN(vload)(DT, bias, (size_t)k0, ncl) : (vf){0};
        return;
    }
    /* multiplier: w_j[l] = w[(c0 + l) * M + j][t] (cpg = 1) */
    for (int t = 0; t < T; t++)
        for (int j = 0; j < MO; j++)
            for (int l = 0; l < VL; l++)
                wp[((size_t)t * MO + j) * VL + l] =
                    l < ncl ? cpu_load(DT, w, ((size_t)(c0 + l) * MO + j) * T + t) : 0.0f;
    for (int i = 0; i < MO; i++) {
        const int nv = ncl * MO - i * VL;
        bv[i] = bias != NULL && nv > 0
                    ? KERN(vload)(DT, bias, (size_t)k0 + (size_t)i * VL, nv < VL ? nv : VL)
                    : (vf){0};
    }
}

static ALWAYS_INLINE void KERN(cv_task_m)(const struct cpu_job_ctx *j, size_t task,
                                          struct cpu_scratch *s, const enum convd_dtype DT,
                                          const int MI, const int MO)
{
    const struct cpu_plan *pl = j->plan;
    const struct convd_problem *p = &pl->p;
    const int band = (int)(task % (size_t)pl->nbands);
    const size_t rest = task / (size_t)pl->nbands;
    const int cblk = (int)(rest % (size_t)pl->ncb);
    const int n = (int)(rest / (size_t)pl->ncb);
    const int oh0 = band * pl->bh;
    const int oh1 = pl->oh - oh0 < pl->bh ? pl->oh : oh0 + pl->bh;
    const int nvec = (p->c + VL - 1) / VL; /* vectors over the input channels */
    const int v0 = cblk * pl->cb, v1 = v0 + pl->cb < nvec ? v0 + pl->cb : nvec;
    /* pixels per register block: P accumulators (times MO) and P inputs in registers */
    const int P = MI > 1 ? (VL == 16 ? 8 : 4) : (MO == 1 ? (VL == 16 ? 8 : 6) : 4);
    const int m = MI > 1 ? MI : MO;
    /* scratch: biases (MO vectors per channel vector) | weights */
    vf *bv = s->buf;
    float *wp = (float *)(bv + (size_t)pl->cb * MO);
    for (int v = v0; v < v1; v++) {
        const int c0 = v * VL;
        const int ncl = p->c - c0 < VL ? p->c - c0 : VL;
        KERN(cv_pack_dt)
        (pl, j->t.weight, p->has_bias ? j->t.bias : NULL, c0, c0 * (MI > 1 ? 1 : MO), ncl,
         wp + (size_t)(v - v0) * pl->taps * m * VL, bv + (size_t)(v - v0) * MO, DT, MI, MO);
    }
    for (int oh = oh0; oh < oh1; oh++)
        KERN(cv_row)(pl, j->t.input, wp, bv, j->t.output, n, oh, v0, v1, DT, MI, MO, P);
}

#define KERN_CV_CASE(mi, mo)                                                                       \
    if (pl->cpg == mi && pl->kpg == mo) {                                                          \
        KERN_DT_DISPATCH(pl->p.dtype, KERN(cv_task_m)(j, task, s, DT, mi, mo));                    \
        return;                                                                                    \
    }

static void KERN(cv_task)(void *arg, size_t task, struct cpu_scratch *s)
{
    const struct cpu_job_ctx *j = arg;
    const struct cpu_plan *pl = j->plan;
    KERN_CV_CASE(1, 1)
    KERN_CV_CASE(2, 2)
    KERN_CV_CASE(4, 4)
#if VL >= 8
    KERN_CV_CASE(8, 8)
#endif
#if VL >= 16
    KERN_CV_CASE(16, 16)
#endif
    KERN_CV_CASE(1, 2)
    KERN_CV_CASE(1, 4)
}

static int KERN(usable)(void);

const struct cpu_isa KERN(cpu_isa) = {
    .name = KERN_NAME,
    .vl = VL,
    .kbmax = KBMAX,
    .usable = KERN(usable),
    .planar_task = KERN(planar_task),
    .cv_task = KERN(cv_task),
};
