/*
 * Grouped direct convolution in NCHW (the "direct" family): 3x3 filters with "same" left padding
 * (pad_left 1), equal strides of 1 or 2, no dilation, W and Wo multiples of 4, any number of
 * channels per group. It is the NCHW depthwise direct kernel (conv_depthwise.hip) grown to several
 * input channels and outputs per group: a thread owns 4 adjacent output columns x TH rows x KT
 * outputs of one (image, group) and walks the group's input planes one after another; each input
 * row of its window arrives as aligned 4-element chunks (8 bytes for 16-bit types, 16 for fp32;
 * with W a multiple of 4 a chunk lies wholly inside or outside the row), and every window element
 * feeds KT FMAs per tap. A block serves one (image, group, output tile) plane, so the plane's
 * filter taps sit in shared memory as fp32 [c][tap][KT]: one broadcast read of KT weights per tap
 * and row, 4 * KT FMA.
 *
 * Why: the NHWC kernels reach NCHW through transposed copies and an NCHW epilogue, which for
 * small cpg cost more than the convolution itself. Here NCHW is native: the input is read where
 * it lies, the output leaves as 4-element runs of its rows, and nothing is staged but the filter.
 */
#include "gpu_internal.h"

/* The prefetching instances that load the next plane's window row by row (ROLL below): those
 * where the whole window at once spills at the 128 registers of two blocks per SM (ptxas, sm_90;
 * bench/gpu/NOTES.md, round 15). */
GPU_HD constexpr bool gd_rolling_prefetch(int dtype, int sh, int kt, int th)
{
    return dtype == CONVD_DTYPE_FP32 ? sh == 1 && kt == 2 && th == 4
                                     : sh == 2 && kt == 4 && th == 2;
}

template <class DT, int SH, int KT, int TH, bool PF>
__global__ void __launch_bounds__(256, CONVD_MIN_BLOCKS(256, 2))
    gd_nchw_kernel(const struct gpu_geom g, const struct gpu_batch b, int cgs, int bands,
                   int ktiles)
{
    convd_grid_dependency();
    typedef typename DT::T T;
    extern __shared__ float gd_w[];       /* [cpg][9][KT] */
    constexpr int KS = 3, P = 4, OFF = 3; /* window start: 3 elements into the first chunk */
    constexpr int IR = (TH - 1) * SH + KS, NCH = (OFF + (P - 1) * SH + KS + 3) / 4;
    const int prob = blockIdx.z;
    int plane = (int)blockIdx.x; /* (image, group, output tile) */
    const int kt = plane % ktiles;
    plane /= ktiles;
    const int grp = plane % g.g, n = plane / g.g;
    const int k0 = grp * g.kpg + kt * KT; /* first output channel of the thread */

    const T *w = (const T *)b.w[prob] + (size_t)k0 * g.cpg * (KS * KS);
    const int nw = g.cpg * (KS * KS) * KT;
    for (int e = (int)threadIdx.x; e < nw; e += (int)blockDim.x) {
        const int c = e / (KS * KS * KT), rem = e - c * (KS * KS * KT);
        const int tap = rem / KT, k = rem - tap * KT;
        gd_w[e] = DT::load(w[((size_t)k * g.cpg + c) * (KS * KS) + tap]);
    }
    __syncthreads();

    const int f = (int)(blockIdx.y * blockDim.x + threadIdx.x);
    if (f >= cgs * bands)
        return;
    const int band = f / cgs, cg = f - band * cgs;
    const int hw = g.h * g.w;
    const T *xg = (const T *)b.x[prob] + ((size_t)n * g.c + (size_t)grp * g.cpg) * hw;

    float acc[TH][KT][P];
#pragma unroll
    for (int o = 0; o < TH; o++)
#pragma unroll
        for (int k = 0; k < KT; k++)
#pragma unroll
            for (int pp = 0; pp < P; pp++)
                acc[o][k][pp] = 0.0f;

    const int oh0 = band * TH, ih0 = oh0 * SH - g.pt, a0 = cg * P * SH - 4;
    /* One input row of the window (as fp32) into the accumulators of the output rows it feeds. */
    auto row_fma = [&](const float *wc, int i, const float *win) {
#pragma unroll
        for (int o = 0; o < TH; o++) {
            const int r = i - o * SH;
            if (r < 0 || r >= KS)
                continue;
#pragma unroll
            for (int s = 0; s < KS; s++) {
                float wv[KT];
                const float *wp = wc + (r * KS + s) * KT;
                if (KT % 4 == 0) {
#pragma unroll
                    for (int q = 0; q < KT / 4; q++) {
                        const float4 v = *(const float4 *)(wp + 4 * q);
                        wv[4 * q] = v.x;
                        wv[(4 * q + 1) % KT] = v.y;
                        wv[(4 * q + 2) % KT] = v.z;
                        wv[(4 * q + 3) % KT] = v.w;
                    }
                } else if (KT == 2) {
                    const float2 v = *(const float2 *)wp;
                    wv[0] = v.x;
                    wv[1 % KT] = v.y;
                } else {
                    wv[0] = wp[0];
                }
#pragma unroll
                for (int k = 0; k < KT; k++)
#pragma unroll
                    for (int pp = 0; pp < P; pp++)
                        acc[o][k][pp] = fmaf(win[OFF + pp * SH + s], wv[k], acc[o][k][pp]);
            }
        }
    };
    if constexpr (PF) {
        /* The next plane's window is loaded (raw) while this one is multiplied: all of it at the
         * top of the plane, or with ROLL row by row into the registers of the row just converted,
         * which holds one window instead of two at the same distance between load and use. */
        typedef gpu_chunk4<sizeof(T)> C;
        typedef typename C::V V;
        constexpr bool ROLL = gd_rolling_prefetch(DT::id, SH, KT, TH);
        V cur[IR][NCH];
        auto fetch_row = [&](int c, int i, V(&dst)[NCH]) {
            const T *xp = xg + (size_t)c * hw;
            const int ih = ih0 + i;
            const bool rok = convd_math_inside(ih, g.h);
            const T *xr = xp + (rok ? ih : 0) * g.w;
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                const int col = a0 + 4 * ch;
                const bool ok = rok && convd_math_inside(col, g.w);
                /* The select outside the load: with it inside (C::load(xr + (ok ? col : 0),
                 * ok)) ptxas spilled 116-212 bytes in five instances, 140 in the 16-bit
                 * stride-2 one that resnext50_l2_down runs. */
                dst[ch] = ok ? *(const V *)(xr + col) : C::load(xr, false);
            }
        };
#pragma unroll
        for (int i = 0; i < IR; i++)
            fetch_row(0, i, cur[i]);
        for (int c = 0; c < g.cpg; c++) {
            V nxt[ROLL ? 1 : IR][NCH];
            if constexpr (!ROLL) {
                if (c + 1 < g.cpg)
#pragma unroll
                    for (int i = 0; i < IR; i++)
                        fetch_row(c + 1, i, nxt[i]);
            }
            const float *wc = gd_w + c * (KS * KS * KT);
#pragma unroll
            for (int i = 0; i < IR; i++) {
                float win[NCH * 4];
#pragma unroll
                for (int ch = 0; ch < NCH; ch++)
                    C::template to_f32<DT>(cur[i][ch], win + 4 * ch);
                if constexpr (ROLL) {
                    if (c + 1 < g.cpg)
                        fetch_row(c + 1, i, cur[i]);
                }
                row_fma(wc, i, win);
            }
            if constexpr (!ROLL) {
                if (c + 1 < g.cpg)
#pragma unroll
                    for (int i = 0; i < IR; i++)
#pragma unroll
                        for (int ch = 0; ch < NCH; ch++)
                            cur[i][ch] = nxt[i][ch];
            }
        }
    } else {
        for (int c = 0; c < g.cpg; c++) {
            const T *xp = xg + (size_t)c * hw;
            const float *wc = gd_w + c * (KS * KS * KT);
#pragma unroll
            for (int i = 0; i < IR; i++) {
                const int ih = ih0 + i;
                const bool rok = convd_math_inside(ih, g.h);
                const T *xr = xp + (rok ? ih : 0) * g.w;
                float win[NCH * 4];
#pragma unroll
                for (int ch = 0; ch < NCH; ch++) {
                    const int col = a0 + 4 * ch;
                    const bool ok = rok && convd_math_inside(col, g.w);
                    gpu_load4<DT>(xr + (ok ? col : 0), ok, win + 4 * ch);
                }
                row_fma(wc, i, win);
            }
        }
    }

    const T *bias = (const T *)b.b[prob];
    T *y = (T *)b.y[prob];
#pragma unroll
    for (int k = 0; k < KT; k++) {
        const float bv = g.bias ? DT::load(bias[k0 + k]) : 0.0f;
        T *yp = y + (((size_t)n * g.k + k0 + k) * g.ho + oh0) * g.wo + cg * P;
#pragma unroll
        for (int o = 0; o < TH; o++) {
            if (oh0 + o >= g.ho)
                break;
            float ov[P];
#pragma unroll
            for (int pp = 0; pp < P; pp++)
                ov[pp] = gpu_epilogue(acc[o][k][pp], bv, g);
            gpu_store4<DT>(yp + (size_t)o * g.wo, ov);
        }
    }
}

static int gd_shape_ok(const struct convd_problem *p, const struct gpu_geom *g, char *why,
                       size_t why_len)
{
    if (p->layout != CONVD_LAYOUT_NCHW) {
        snprintf(why, why_len, "direct: NCHW only");
        return 0;
    }
    if (g->r != 3 || g->s != 3 || g->dh != 1 || g->dw != 1 || g->sh != g->sw ||
        (g->sh != 1 && g->sh != 2) || g->pl != 1) {
        snprintf(why, why_len,
                 "direct: needs a 3x3 filter, equal strides of 1 or 2, no dilation and "
                 "pad_left 1");
        return 0;
    }
    if (g->w % 4 != 0 || g->wo % 4 != 0) {
        snprintf(why, why_len, "direct: W=%d and Wo=%d must be multiples of 4", g->w, g->wo);
        return 0;
    }
    return 1;
}

/* What the planner picks under the default policy. 8 outputs (one row) where kpg allows pay in
 * fp32 and not in 16-bit, where the window's loads cost less than the accumulators' registers.
 * Prefetching the next plane's window pays where a plane's window is a few rows of several
 * threads' work (2 or 4 rows) and costs where it is not (1 row); fp32 at stride 2 with 4 outputs
 * spills with it. */
static constexpr bool gd_default_outputs8(int dtype)
{
    return dtype == CONVD_DTYPE_FP32;
}

static constexpr bool gd_default_prefetch(int dtype, int sh, int kt, int th)
{
    return th >= 2 && !(dtype == CONVD_DTYPE_FP32 && sh == 2 && kt == 4);
}

/* Whether the kernel variant is built. The production library holds what the planner picks
 * under the default policy (above). The others, reachable by forcing the policy's
 * direct_prefetch or direct_outputs8, are built with CONVD_GPU_SWEEP_KERNELS (the sweeps'
 * build); without it a plan that needs one is refused. */
static constexpr bool gd_built(int dtype, int sh, int kt, int th, bool pf)
{
#if defined(CONVD_GPU_SWEEP_KERNELS)
    (void)dtype, (void)sh, (void)kt, (void)th, (void)pf;
    return true;
#else
    return (kt != 8 || gd_default_outputs8(dtype)) && pf == gd_default_prefetch(dtype, sh, kt, th);
#endif
}

int gpu_gd_plan_make(const struct convd_problem *p, const struct convd_gpu_policy *pol,
                     struct gpu_gd_plan *ret, char *why, size_t why_len)
{
    struct gpu_gd_plan pl;
    memset(&pl, 0, sizeof(pl));
    gpu_geom_from_problem(p, &pl.g);
    pl.dtype = p->dtype;
    const struct gpu_geom *g = &pl.g;
    if (!gd_shape_ok(p, g, why, why_len))
        return CONVD_EUNSUPPORTED;
    pl.kt = g->kpg % 4 == 0 ? 4 : g->kpg % 2 == 0 ? 2 : 1;
    if (g->kpg % 8 == 0 &&
        (pol->direct_outputs8 > 0 || (pol->direct_outputs8 < 0 && gd_default_outputs8(p->dtype))))
        pl.kt = 8;
    pl.ktiles = g->kpg / pl.kt;
    pl.smem = g->cpg * 9 * pl.kt * (int)sizeof(float);
    struct gpu_device_info dev;
    if (gpu_device_info_get(&dev) != 0) {
        dev.sm_count = 132;
        dev.smem_optin = 48 * 1024;
    }
    if (pl.smem > 48 * 1024 && pl.smem > dev.smem_optin) {
        snprintf(why, why_len, "direct: the group's filter (%d bytes) does not fit shared memory",
                 pl.smem);
        return CONVD_EUNSUPPORTED;
    }
    const int64_t planes = (int64_t)g->n * g->g * pl.ktiles;
    if (planes > 0x7fffffff) {
        snprintf(why, why_len, "direct: grid too large");
        return CONVD_EUNSUPPORTED;
    }
    pl.cgs = g->wo / 4;
    /* Rows per thread: the most (fewest loads and weight reads per FMA) that still give the GPU
     * about 8 warps per SM, a forced mode's otherwise. 4 rows spill at the 128 registers of two
     * blocks per SM with 4 outputs (64 accumulators) or at stride 2 (a 9-row window). */
    const int th_max = pl.kt == 8 ? 1 : pl.kt == 4 || g->sh == 2 ? 2 : 4;
    pl.th = pol->direct > 0 ? (pol->direct < th_max ? pol->direct : th_max) : 1;
    if (pol->direct <= 0)
        for (int th = th_max; th >= 1; th /= 2) {
            const int64_t threads = planes * pl.cgs * ((g->ho + th - 1) / th);
            if (threads >= (int64_t)dev.sm_count * 256 || th == 1) {
                pl.th = th;
                break;
            }
        }
    pl.prefetch = pol->direct_prefetch >= 0 ? pol->direct_prefetch
                                            : gd_default_prefetch(p->dtype, g->sh, pl.kt, pl.th);
    if (!gd_built(p->dtype, g->sh, pl.kt, pl.th, pl.prefetch != 0)) {
        snprintf(why, why_len,
                 "direct: %d outputs x %d rows%s is built only with CONVD_GPU_SWEEP_KERNELS", pl.kt,
                 pl.th, pl.prefetch ? " with prefetch" : " without prefetch");
        return CONVD_EUNSUPPORTED;
    }
    pl.bands = (g->ho + pl.th - 1) / pl.th;
    const int64_t per_plane = (int64_t)pl.cgs * pl.bands;
    const int64_t ys = (per_plane + 255) / 256;
    if (ys > 65535) {
        snprintf(why, why_len, "direct: image too large");
        return CONVD_EUNSUPPORTED;
    }
    pl.grid_y = (int)ys;
    pl.threads = (int)((per_plane + ys - 1) / ys + 31) / 32 * 32;
    pl.planes = (int)planes;
    *ret = pl;
    return 0;
}

/* The kernel variant, or NULL (nothing instantiated) where gd_built says it is not built. */
typedef void (*gd_fn)(const struct gpu_geom, const struct gpu_batch, int, int, int);
template <class DT, int SH, int KT, int TH, bool PF> static constexpr gd_fn gd_kernel_if()
{
    if constexpr (gd_built(DT::id, SH, KT, TH, PF))
        return gd_nchw_kernel<DT, SH, KT, TH, PF>;
    else
        return nullptr;
}

template <class DT, int SH>
static int gd_launch_sh(const struct gpu_gd_plan *pl, const struct gpu_batch *b, int count,
                        const struct gpu_launch *ln)
{
    dim3 grid((unsigned)pl->planes, (unsigned)pl->grid_y, (unsigned)count);
    dim3 block((unsigned)pl->threads);
    void (*fn)(const struct gpu_geom, const struct gpu_batch, int, int, int) = NULL;
#define GD_PICK(KT, TH)                                                                            \
    if (pl->kt == KT && pl->th == TH)                                                              \
        fn = pl->prefetch ? gd_kernel_if<DT, SH, KT, TH, true>()                                   \
                          : gd_kernel_if<DT, SH, KT, TH, false>();
    GD_PICK(1, 1)
    GD_PICK(1, 2)
    GD_PICK(2, 1)
    GD_PICK(2, 2)
    GD_PICK(4, 1)
    GD_PICK(4, 2)
    GD_PICK(8, 1)
    if constexpr (SH == 1) {
        GD_PICK(1, 4)
        GD_PICK(2, 4)
    }
#undef GD_PICK
    if (fn == NULL)
        return CONVD_EINVAL;
    int rc = gpu_allow_smem((const void *)fn, pl->smem);
    if (rc != 0)
        return rc;
    GPU_LAUNCH(fn, grid, block, pl->smem, ln, pl->g, *b, pl->cgs, pl->bands, pl->ktiles);
    CONVD_GPU_CHECK(hipGetLastError());
    return 0;
}

template <class DT>
static int gd_launch_dt(const struct gpu_gd_plan *pl, const struct gpu_batch *b, int count,
                        const struct gpu_launch *ln)
{
    return pl->g.sh == 2 ? gd_launch_sh<DT, 2>(pl, b, count, ln)
                         : gd_launch_sh<DT, 1>(pl, b, count, ln);
}

int gpu_gd_launch(const struct gpu_gd_plan *pl, const struct gpu_batch *b, int count,
                  const struct gpu_launch *ln)
{
    switch (pl->dtype) {
    case CONVD_DTYPE_FP32:
        return gd_launch_dt<dt_f32>(pl, b, count, ln);
    case CONVD_DTYPE_FP16:
        return gd_launch_dt<dt_f16>(pl, b, count, ln);
    case CONVD_DTYPE_BF16:
        return gd_launch_dt<dt_bf16>(pl, b, count, ln);
    }
    return CONVD_EINVAL;
}
