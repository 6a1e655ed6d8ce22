/*
 * The CPU kernels, written once and compiled once per instruction set: kern_avx512.c,
 * kern_avx2.c and kern_generic.c each set the target with #pragma GCC target, define VL (floats
 * per vector), KERN(name) (the name with the variant's suffix) and the register blocking, and
 * include this file. GCC's generic vectors (vector_size) give the width; -ffp-contract=fast
 * turns a * b + c into FMA where the target has it.
 *
 * Required before inclusion: VL, KBMAX, PV_FOR_KB(kb), KERN(name).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "conv_math.h"
#include "cpu_dtype.h"
#include "cpu_internal.h"

typedef float vf __attribute__((vector_size(VL * 4)));
typedef float vfu __attribute__((vector_size(VL * 4), aligned(4), may_alias));

#define UNROLL        _Pragma("GCC unroll 16")
#define ALWAYS_INLINE inline __attribute__((always_inline))

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
 * ========================================================================================= */

/* One register block: acc[KB][PV] vectors = KB output channels x PV*VL pixels, over every
 * (channel, tap) of the group. w holds the block's weights as [c][t][KB]. */
static ALWAYS_INLINE void KERN(planar_block)(const float *restrict x, size_t cs,
                                             const ptrdiff_t *restrict toff, int nt, int cpg,
                                             const float *restrict w, float *restrict o, size_t ldo,
                                             const int KB, const int PV)
{
    vf acc[KBMAX][8];
    UNROLL for (int k = 0; k < KB; k++) UNROLL for (int v = 0; v < PV; v++) acc[k][v] = (vf){0};
    for (int c = 0; c < cpg; c++) {
        const float *xc = x + (size_t)c * cs;
        for (int t = 0; t < nt; t++) {
            const float *xp = xc + toff[t];
            vf xv[8];
            UNROLL for (int v = 0; v < PV; v++) xv[v] = KERN(loadu)(xp + v * VL);
            UNROLL for (int k = 0; k < KB; k++)
            {
                float wk = w[k];
                UNROLL for (int v = 0; v < PV; v++) acc[k][v] += xv[v] * wk;
            }
            w += KB;
        }
    }
    UNROLL for (int k = 0; k < KB; k++) UNROLL for (int v = 0; v < PV; v++)
        KERN(storeu)(o + (size_t)k * ldo + (size_t)v * VL, acc[k][v]);
}

/* All pixels [0, npix) of one block of KB output channels: full blocks of PV vectors, then one
 * narrower block for the rest (rounded up to a vector; the tile and planes have room). */
static ALWAYS_INLINE void KERN(planar_row)(const float *x, size_t cs, const ptrdiff_t *toff, int nt,
                                           int cpg, const float *w, float *o, size_t ldo, int npix,
                                           const int KB)
{
    const int PV = PV_FOR_KB(KB);
    int q = 0;
    for (; q + PV * VL <= npix; q += PV * VL)
        KERN(planar_block)(x + q, cs, toff, nt, cpg, w, o + q, ldo, KB, PV);
    int rest = (npix - q + VL - 1) / VL;
    switch (rest) {
#define PLANAR_TAIL(n)                                                                             \
    case n:                                                                                        \
        if (n <= PV)                                                                               \
            KERN(planar_block)(x + q, cs, toff, nt, cpg, w, o + q, ldo, KB, n <= PV ? n : PV);     \
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

typedef void (*KERN(planar_row_fn))(const float *x, size_t cs, const ptrdiff_t *toff, int nt,
                                    int cpg, const float *w, float *o, size_t ldo, int npix);

#define PLANAR_ROW_KB(kb)                                                                          \
    static void KERN(planar_row_##kb)(const float *x, size_t cs, const ptrdiff_t *toff, int nt,    \
                                      int cpg, const float *w, float *o, size_t ldo, int npix)     \
    {                                                                                              \
        KERN(planar_row)(x, cs, toff, nt, cpg, w, o, ldo, npix, kb < KBMAX ? kb : KBMAX);          \
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

/* Weights of groups [g0, g0 + gcount) into micro-kernel order: per group, per block of kb output
 * channels, [c][t][kbw]. */
static ALWAYS_INLINE void KERN(planar_pack_w_dt)(const struct cpu_plan *pl, const void *w, int g0,
                                                 int gcount, float *dst, const enum convd_dtype dt)
{
    const int cpg = pl->cpg, kpg = pl->kpg, T = pl->taps, KB = pl->kb;
    const bool nhwc = pl->p.layout == CONVD_LAYOUT_NHWC;
    for (int gi = 0; gi < gcount; gi++) {
        for (int kb0 = 0; kb0 < kpg; kb0 += KB) {
            const int kbw = kpg - kb0 < KB ? kpg - kb0 : KB;
            float *d = dst + ((size_t)gi * kpg + kb0) * cpg * T;
            for (int kk = 0; kk < kbw; kk++) {
                const size_t k = (size_t)(g0 + gi) * kpg + kb0 + kk;
                for (int c = 0; c < cpg; c++)
                    for (int t = 0; t < T; t++) {
                        size_t si = nhwc ? (k * T + t) * cpg + c : (k * cpg + c) * T + t;
                        d[((size_t)c * T + t) * kbw + kk] = cpu_load(dt, w, si);
                    }
            }
        }
    }
}

/* The input rows a band reads, channels [c0, c0 + nc), into zero-padded planes: every float of
 * [0, bq * wq) of every plane is written (zeros outside the image), and the slack after it that
 * the rounded-up pixel blocks read is zeroed too. */
static ALWAYS_INLINE void KERN(planar_pack_x_dt)(const struct cpu_plan *pl, const void *x, int n,
                                                 int c0, int nc, int oh0, float *dst,
                                                 const enum convd_dtype dt)
{
    const struct convd_problem *p = &pl->p;
    const int sh = p->stride_h, sw = p->stride_w, W = p->w, H = p->h, C = p->c;
    const int wq = pl->wq, bq = pl->bq, ncp = pl->ncp;
    const size_t cs = pl->cs, ps = pl->ps;
    const bool nchw = p->layout == CONVD_LAYOUT_NCHW;

    for (int jr = 0; jr < pl->nrp; jr++) {
        const int base_r = pl->row_phase ? jr : jr * p->dil_h;
        for (int i = 0; i < bq; i++) {
            const int64_t ih = (int64_t)oh0 * sh + (int64_t)i * sh + base_r - p->pad_top;
            const bool row_in = ih >= 0 && ih < H;
            for (int jc = 0; jc < ncp; jc++) {
                const int base_c = pl->col_phase ? jc : jc * p->dil_w;
                float *d = dst + (size_t)(jr * ncp + jc) * ps + (size_t)i * wq;
                /* plane columns [lo, hi) map to input columns iw = col * sw + base_c - pad_left
                 * inside [0, W) */
                int64_t lo = 0, hi = 0;
                if (row_in) {
                    const int64_t a = (int64_t)p->pad_left - base_c;
                    lo = a > 0 ? (a + sw - 1) / sw : 0;
                    const int64_t e = (int64_t)W + a;
                    hi = e > 0 ? (e + sw - 1) / sw : 0;
                    if (hi > wq)
                        hi = wq;
                    if (lo > hi)
                        lo = hi;
                }
                const int64_t iw0 = lo * sw + base_c - p->pad_left;
                if (nchw) {
                    for (int c = 0; c < nc; c++) {
                        float *dc = d + (size_t)c * cs;
                        const size_t src = (((size_t)n * C + c0 + c) * H + (size_t)ih) * W;
                        for (int64_t q = 0; q < lo; q++)
                            dc[q] = 0.0f;
                        if (sw == 1) {
                            const size_t s0 = src + (size_t)iw0 - (size_t)lo;
                            for (int64_t q = lo; q < hi; q++)
                                dc[q] = cpu_load(dt, x, s0 + (size_t)q);
                        } else {
                            for (int64_t q = lo; q < hi; q++)
                                dc[q] = cpu_load(dt, x, src + (size_t)(iw0 + (q - lo) * sw));
                        }
                        for (int64_t q = hi; q < wq; q++)
                            dc[q] = 0.0f;
                    }
                } else {
                    for (int c = 0; c < nc; c++) {
                        float *dc = d + (size_t)c * cs;
                        for (int64_t q = 0; q < lo; q++)
                            dc[q] = 0.0f;
                        for (int64_t q = hi; q < wq; q++)
                            dc[q] = 0.0f;
                    }
                    for (int64_t q = lo; q < hi; q++) {
                        const size_t src =
                            (((size_t)n * H + (size_t)ih) * W + (size_t)(iw0 + (q - lo) * sw)) * C +
                            c0;
                        for (int c = 0; c < nc; c++)
                            d[(size_t)c * cs + q] = cpu_load(dt, x, src + c);
                    }
                }
            }
        }
    }
    const size_t used = (size_t)bq * wq;
    for (int c = 0; c < nc; c++)
        for (int pi = 0; pi < pl->nrp * ncp; pi++)
            memset(dst + (size_t)c * cs + (size_t)pi * ps + used, 0, (ps - used) * sizeof(float));
}

/* Bias, ReLU, rounding and the store of a task's tile [k][q] to the output tensor. */
static ALWAYS_INLINE void KERN(planar_store_dt)(const struct cpu_plan *pl, const void *bias,
                                                void *y, int n, int k0, int nk, int oh0, int bhn,
                                                const float *tile, const enum convd_dtype dt)
{
    const struct convd_problem *p = &pl->p;
    const int Ho = pl->oh, Wo = pl->ow, K = p->k;
    const size_t ldt = pl->ldt, wq = (size_t)pl->wq;
    const bool relu = p->relu;
    if (p->layout == CONVD_LAYOUT_NCHW) {
        for (int kl = 0; kl < nk; kl++) {
            const int k = k0 + kl;
            const float b = bias != NULL ? cpu_load(dt, bias, (size_t)k) : 0.0f;
            for (int r = 0; r < bhn; r++) {
                const float *t = tile + (size_t)kl * ldt + (size_t)r * wq;
                const size_t o = (((size_t)n * K + k) * Ho + oh0 + r) * Wo;
                for (int ow = 0; ow < Wo; ow++) {
                    float v = t[ow] + b;
                    if (relu)
                        v = v > 0.0f ? v : 0.0f;
                    cpu_store(dt, y, o + ow, v);
                }
            }
        }
    } else {
        float bv[CPU_KB_MAX * 64];
        const bool small = nk <= CPU_KB_MAX * 64;
        if (small)
            for (int kl = 0; kl < nk; kl++)
                bv[kl] = bias != NULL ? cpu_load(dt, bias, (size_t)(k0 + kl)) : 0.0f;
        for (int r = 0; r < bhn; r++)
            for (int ow = 0; ow < Wo; ow++) {
                const float *t = tile + (size_t)r * wq + ow;
                const size_t o = (((size_t)n * Ho + oh0 + r) * Wo + ow) * K + k0;
                for (int kl = 0; kl < nk; kl++) {
                    float b = small ? bv[kl]
                                    : (bias != NULL ? cpu_load(dt, bias, (size_t)(k0 + kl)) : 0.0f);
                    float v = t[(size_t)kl * ldt] + b;
                    if (relu)
                        v = v > 0.0f ? v : 0.0f;
                    cpu_store(dt, y, o + kl, v);
                }
            }
    }
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

    float *wpk = s->buf;
    float *xin = wpk + KERN(round_up)((size_t)pl->gb * kpg * cpg * T, 16);
    float *tile = xin + (size_t)pl->gb * cpg * pl->cs;
    ptrdiff_t *toff = (ptrdiff_t *)(tile + (size_t)pl->gb * kpg * pl->ldt);

    const enum convd_dtype dt = p->dtype;
    KERN_DT_DISPATCH(dt, KERN(planar_pack_w_dt)(pl, j->t.weight, g0, gcount, wpk, DT));
    KERN_DT_DISPATCH(
        dt, KERN(planar_pack_x_dt)(pl, j->t.input, n, g0 * cpg, gcount * cpg, oh0, xin, DT));

    /* tap (r, s) -> plane and offset, as the planes were laid out above */
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

    for (int gi = 0; gi < gcount; gi++) {
        const float *xg = xin + (size_t)gi * cpg * pl->cs;
        for (int kb0 = 0; kb0 < kpg; kb0 += KB) {
            const int kbw = kpg - kb0 < KB ? kpg - kb0 : KB;
            const size_t kl = (size_t)gi * kpg + kb0;
            KERN(planar_rows)
            [kbw](xg, pl->cs, toff, T, cpg, wpk + kl * cpg * T, tile + kl * pl->ldt, pl->ldt, npix);
        }
    }

    KERN_DT_DISPATCH(dt, KERN(planar_store_dt)(pl, p->has_bias ? j->t.bias : NULL, j->t.output, n,
                                               g0 * kpg, gcount * kpg, oh0, bhn, tile, DT));
}

static int KERN(usable)(void);

const struct cpu_isa KERN(cpu_isa) = {
    .name = KERN_NAME,
    .vl = VL,
    .kbmax = KBMAX,
    .usable = KERN(usable),
    .planar_task = KERN(planar_task),
    .nhwc_dw_task = NULL,
    .nhwc_gemm_task = NULL,
};
