/*
 * Register-tiled direct convolution on the FMA units: the fp32 path, and the fp16/bf16 path for
 * channel counts the tensor-core kernel does not take (odd cpg/kpg, depthwise with wide
 * multipliers, AMD).
 *
 * A block owns a tile of th x (sx * FMA_TM) output pixels of one image and bn output channels: a
 * run of whole groups (gpb of them) or a part of one group. The input halo the tile needs, for
 * the block's channels, sits in shared memory as fp32 ([pixel][channel], odd pixel stride), and
 * the weights as [tap][c][n] so that a thread's tn outputs are one vector read. Each thread
 * computes FMA_TM adjacent pixels of one row times tn output channels of one group; with unit
 * stride and dilation along W the input columns of a filter row are read once into a register
 * window and reused by every tap. Large cpg is processed in channel chunks.
 *
 * Each output's accumulation order is (chunk, r, c, s), fixed by cpg, R and S alone, so a grouped
 * problem and its groups run one by one give identical bits.
 */
#include "gpu_internal.h"

#define FMA_TM 8
#define FMA_U  8

template <int TN> struct fma_wvec {
    static GPU_D void load(const float *p, float *v)
    {
#pragma unroll
        for (int i = 0; i < TN; i += 4) {
            float4 q = *(const float4 *)(p + i);
            v[i] = q.x;
            v[i + 1] = q.y;
            v[i + 2] = q.z;
            v[i + 3] = q.w;
        }
    }
};
template <> struct fma_wvec<2> {
    static GPU_D void load(const float *p, float *v)
    {
        float2 q = *(const float2 *)p;
        v[0] = q.x;
        v[1] = q.y;
    }
};
template <> struct fma_wvec<1> {
    static GPU_D void load(const float *p, float *v)
    {
        v[0] = *p;
    }
};
/* 3 outputs per thread (kpg 3, 9, 15, ...): not 8- or 16-byte aligned. */
template <> struct fma_wvec<3> {
    static GPU_D void load(const float *p, float *v)
    {
        v[0] = p[0];
        v[1] = p[1];
        v[2] = p[2];
    }
};

/*
 * One input channel of one filter row for a strip of FMA_TM pixels, KS taps wide with unit
 * stride and dilation along W: the FMA_TM + KS - 1 input columns (ps floats apart) are read once
 * and reused by every tap; tap s's TN weights are at w + s * wtap.
 */
template <int TN, int KS>
GPU_D void fma_window(const float *hp, int ps, const float *w, int wtap, float (&acc)[FMA_TM][TN])
{
    float win[FMA_TM + KS - 1];
#pragma unroll
    for (int j = 0; j < FMA_TM + KS - 1; j++)
        win[j] = hp[j * ps];
#pragma unroll
    for (int s = 0; s < KS; s++) {
        float wv[TN];
        fma_wvec<TN>::load(w + s * wtap, wv);
#pragma unroll
        for (int o = 0; o < FMA_TM; o++)
#pragma unroll
            for (int i = 0; i < TN; i++)
                acc[o][i] = fmaf(win[o + s], wv[i], acc[o][i]);
    }
}

/* Stores TN adjacent channels of one NHWC pixel (aligned: K and the offset are multiples of TN). */
template <class DT, int TN> struct fma_out {
    static GPU_D void store(typename DT::T *p, const float *v)
    {
#pragma unroll
        for (int i = 0; i < TN; i++)
            p[i] = DT::store(v[i]);
    }
};
template <int TN> struct fma_out_f32 {
    static GPU_D void store(float *p, const float *v)
    {
#pragma unroll
        for (int i = 0; i < TN; i += 4)
            *(float4 *)(p + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
    }
};
template <> struct fma_out<dt_f32, 4> : fma_out_f32<4> {
};
template <> struct fma_out<dt_f32, 8> : fma_out_f32<8> {
};
template <class DT, int TN> struct fma_out16 {
    static GPU_D void store(uint16_t *p, const float *v)
    {
        uint32_t u[TN / 2];
#pragma unroll
        for (int i = 0; i < TN / 2; i++)
            u[i] = (uint32_t)DT::store(v[2 * i]) | ((uint32_t)DT::store(v[2 * i + 1]) << 16);
        if (TN == 8)
            *(uint4 *)p = make_uint4(u[0], u[TN > 2 ? 1 : 0], u[TN > 4 ? 2 : 0], u[TN > 4 ? 3 : 0]);
        else if (TN == 4)
            *(uint2 *)p = make_uint2(u[0], u[TN > 2 ? 1 : 0]);
        else
            *(uint32_t *)p = u[0];
    }
};
template <> struct fma_out<dt_f16, 2> : fma_out16<dt_f16, 2> {
};
template <> struct fma_out<dt_f16, 4> : fma_out16<dt_f16, 4> {
};
template <> struct fma_out<dt_f16, 8> : fma_out16<dt_f16, 8> {
};
template <> struct fma_out<dt_bf16, 2> : fma_out16<dt_bf16, 2> {
};
template <> struct fma_out<dt_bf16, 4> : fma_out16<dt_bf16, 4> {
};
template <> struct fma_out<dt_bf16, 8> : fma_out16<dt_bf16, 8> {
};

/* The first nv of FMA_TM adjacent outputs of one NCHW plane row: runs of four as one vector
 * store (16 bytes for fp32, 8 for 16-bit types) where the address allows, else one by one. */
template <class DT> GPU_D void fma_store_run(typename DT::T *p, const float *v, int nv)
{
    typedef typename DT::T T;
#pragma unroll
    for (int o = 0; o < FMA_TM; o += 4) {
        if (o + 4 <= nv && ((uintptr_t)(p + o) & (4 * sizeof(T) - 1)) == 0) {
            if (sizeof(T) == 4) {
                *(float4 *)(p + o) = make_float4(v[o], v[o + 1], v[o + 2], v[o + 3]);
            } else {
                const uint32_t lo =
                    (uint32_t)DT::store(v[o]) | ((uint32_t)DT::store(v[o + 1]) << 16);
                const uint32_t hi =
                    (uint32_t)DT::store(v[o + 2]) | ((uint32_t)DT::store(v[o + 3]) << 16);
                *(uint2 *)(p + o) = make_uint2(lo, hi);
            }
        } else {
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (o + j < nv)
                    p[o + j] = DT::store(v[o + j]);
        }
    }
}

struct fma_args {
    struct gpu_geom g;
    int nch, bn, gpb, nsplit, nblk;
    int sx, th, tiles_w, tiles_h;
    int ih, iw, kc, cbc, ps, bnp;
    int rpx;      /* halo row pitch in pixels (>= iw), chosen against bank conflicts */
    int smap;     /* 1: thread t computes strip t % strips of channel chunk t / strips */
    int out_nchw; /* NHWC input (a transposed copy), NCHW output */
};

template <class DT, int NHWC, int TN, int KS>
__global__ void __launch_bounds__(256, CONVD_MIN_BLOCKS(256, 2))
    fma_kernel(const struct fma_args a, const struct gpu_batch b)
{
    convd_grid_dependency();
    typedef typename DT::T T;
    extern __shared__ float fma_smem[];
    const struct gpu_geom &g = a.g;
    const int prob = blockIdx.z;
    const T *x = (const T *)b.x[prob];
    const T *w = (const T *)b.w[prob];
    const T *bias = (const T *)b.b[prob];
    T *y = (T *)b.y[prob];

    const int nb = blockIdx.x % a.nblk;
    int tile = blockIdx.x / a.nblk;
    const int tw_i = tile % a.tiles_w;
    tile /= a.tiles_w;
    const int th_i = tile % a.tiles_h;
    const int n = tile / a.tiles_h;
    const int tw = a.sx * FMA_TM;
    const int oh0 = th_i * a.th, ow0 = tw_i * tw;
    const int ih0 = oh0 * g.sh - g.pt, iw0 = ow0 * g.sw - g.pl;

    /* The block's output channels [k0, k0 + bn) and their groups. */
    int k0, grp0, ngrp;
    if (a.gpb > 0) {
        grp0 = nb * a.gpb;
        ngrp = min(a.gpb, g.g - grp0);
        k0 = grp0 * g.kpg;
    } else {
        grp0 = nb / a.nsplit;
        ngrp = 1;
        k0 = grp0 * g.kpg + (nb % a.nsplit) * a.bn;
    }
    const int kend = a.gpb > 0 ? k0 + ngrp * g.kpg : k0 + a.bn;
    const int rs = g.r * g.s;
    const int hpix = a.ih * a.rpx;

    float *halo = fma_smem;
    /* Weights start 16-byte aligned: they are read as float2/float4. */
    float *wts = fma_smem + ((hpix * a.ps + 3) & ~3);

    const int t = threadIdx.x;
    const int nstrips = a.th * a.sx;
    /* smap: a warp's lanes take different strips of one channel chunk (its weight reads are
     * broadcasts); else adjacent lanes take adjacent chunks of one strip. The planner picks the
     * mapping and the halo pitches with the fewest shared-memory bank conflicts. */
    const int nc = a.smap ? t / nstrips : t % a.nch;
    const int strip = a.smap ? t - nc * nstrips : t / a.nch;
    const int tr = strip / a.sx, sxi = strip - tr * a.sx;
    const int kt = k0 + nc * TN; /* first output channel of the thread */
    const int gl = (kt / g.kpg) - grp0;
    const bool active = nc < a.nch && strip < nstrips && kt < kend;

    float acc[FMA_TM][TN];
#pragma unroll
    for (int o = 0; o < FMA_TM; o++)
#pragma unroll
        for (int i = 0; i < TN; i++)
            acc[o][i] = 0.0f;

    for (int c0 = 0; c0 < g.cpg; c0 += a.kc) {
        const int kcn = min(a.kc, g.cpg - c0);
        /* Halo of the chunk: [pixel][group-local * kc + c]. Loads are issued FMA_U at a time so
         * that their latencies overlap (a load-then-store loop would wait for each), and index
         * math is per halo row rather than per element. */
        if (NHWC && DT::id == CONVD_DTYPE_FP32) {
            /* fp32: 4-byte cp.async, every copy of the chunk in flight at once. Elements
             * (iwl, group, c) of a halo row, channels fastest, walked without divisions. */
            const int gib = a.cbc / a.kc;
            struct gpu_walk w0;
            gpu_walk_init(&w0, t, (int)blockDim.x, gib, a.kc);
            const int rowel = a.iw * a.cbc;
            for (int ihl = 0; ihl < a.ih; ihl++) {
                const int ih = ih0 + ihl;
                const bool row_ok = convd_math_inside(ih, g.h);
                const float *xrow = (const float *)x +
                                    (size_t)(n * g.h + (row_ok ? ih : 0)) * g.w * g.c +
                                    grp0 * g.cpg + c0;
                float *hrow_s = halo + ihl * a.rpx * a.ps;
                struct gpu_walk wk = w0;
                for (int q = t; q < rowel; q += blockDim.x, gpu_walk_step(&wk, gib, a.kc)) {
                    const int iw = iw0 + wk.hi;
                    const bool ok =
                        row_ok && wk.mid < ngrp && wk.lo < kcn && convd_math_inside(iw, g.w);
                    const float *src =
                        ok ? xrow + (size_t)iw * g.c + wk.mid * g.cpg + wk.lo : (const float *)x;
                    gpu_cp4(hrow_s + wk.hi * a.ps + wk.mid * a.kc + wk.lo, src, ok);
                }
            }
        } else if (NHWC) {
            /* Row by row: elements (iwl, cb) of a row, channels fastest (contiguous in memory
             * when the chunk is the whole group). */
            const int rowel = a.iw * a.cbc;
            for (int ihl = 0; ihl < a.ih; ihl++) {
                const int ih = ih0 + ihl;
                if (!convd_math_inside(ih, g.h)) {
                    for (int q = t; q < rowel; q += blockDim.x) {
                        const int iwl = q / a.cbc;
                        halo[(ihl * a.rpx + iwl) * a.ps + q - iwl * a.cbc] = 0.0f;
                    }
                    continue;
                }
                const T *xrow = x + (size_t)(n * g.h + ih) * g.w * g.c + grp0 * g.cpg + c0;
                for (int base = t; base < rowel; base += FMA_U * (int)blockDim.x) {
                    float v[FMA_U];
                    int dst[FMA_U];
#pragma unroll
                    for (int u = 0; u < FMA_U; u++) {
                        const int q = base + u * (int)blockDim.x;
                        v[u] = 0.0f;
                        dst[u] = -1;
                        if (q < rowel) {
                            const int iwl = q / a.cbc, cb = q - iwl * a.cbc;
                            const int gi = a.kc == g.cpg ? 0 : cb / a.kc;
                            const int c = a.kc == g.cpg ? cb : cb - gi * a.kc;
                            const int iw = iw0 + iwl;
                            dst[u] = (ihl * a.rpx + iwl) * a.ps + cb;
                            const bool ok =
                                a.kc == g.cpg ? cb < ngrp * g.cpg : (gi < ngrp && c < kcn);
                            if (ok && convd_math_inside(iw, g.w))
                                v[u] = DT::load(xrow[(size_t)iw * g.c + gi * g.cpg + c]);
                        }
                    }
#pragma unroll
                    for (int u = 0; u < FMA_U; u++)
                        if (dst[u] >= 0)
                            halo[dst[u]] = v[u];
                }
            }
        } else {
            /* Units of (channel, halo row), one per warp, lanes across columns. */
            const int lane = t & 31, wid = t >> 5, nw = ((int)blockDim.x + 31) >> 5;
            const int units = a.cbc * a.ih;
            for (int col0 = 0; col0 < a.iw; col0 += 32) {
                for (int u0 = wid; u0 < units; u0 += FMA_U * nw) {
                    float v[FMA_U];
                    int dst[FMA_U];
#pragma unroll
                    for (int r = 0; r < FMA_U; r++) {
                        const int u = u0 + r * nw;
                        const int col = col0 + lane;
                        v[r] = 0.0f;
                        dst[r] = -1;
                        if (u < units && col < a.iw) {
                            const int cb = u / a.ih, ihl = u - cb * a.ih;
                            const int gi = cb / a.kc, c = cb - gi * a.kc;
                            const int ih = ih0 + ihl, iw = iw0 + col;
                            dst[r] = (ihl * a.rpx + col) * a.ps + cb;
                            if (gi < ngrp && c < kcn && convd_math_inside(ih, g.h) &&
                                convd_math_inside(iw, g.w))
                                v[r] = DT::load(
                                    x[((size_t)(n * g.c + (grp0 + gi) * g.cpg + c0 + c) * g.h +
                                       ih) *
                                          g.w +
                                      iw]);
                        }
                    }
#pragma unroll
                    for (int r = 0; r < FMA_U; r++)
                        if (dst[r] >= 0)
                            halo[dst[r]] = v[r];
                }
            }
        }
        /* Weights of the chunk: [tap][c][n]. */
        const int nw = a.bn * rs * a.kc;
        if (NHWC && DT::id == CONVD_DTYPE_FP32) {
            /* Elements e = (nl, tap, c) in the order of the NHWC weights, copied asynchronously
             * like the halo. */
            for (int e = t; e < nw; e += blockDim.x) {
                const int c = e % a.kc, q = e / a.kc;
                const int tap = q % rs, nl = q / rs;
                const int k = k0 + nl;
                const bool ok = k < kend && c < kcn;
                const float *src = ok ? (const float *)w + ((size_t)k * rs + tap) * g.cpg + c0 + c
                                      : (const float *)w;
                gpu_cp4(wts + (tap * a.kc + c) * a.bnp + nl, src, ok);
            }
            gpu_cp_wait_all();
        } else
            for (int base = t; base < nw; base += FMA_U * (int)blockDim.x) {
                float v[FMA_U];
                int dst[FMA_U];
#pragma unroll
                for (int u = 0; u < FMA_U; u++) {
                    const int e = base + u * (int)blockDim.x;
                    v[u] = 0.0f;
                    dst[u] = -1;
                    if (e < nw) {
                        int nl, tap, c;
                        if (NHWC) {
                            c = e % a.kc;
                            const int q = e / a.kc;
                            tap = q % rs;
                            nl = q / rs;
                        } else {
                            tap = e % rs;
                            const int q = e / rs;
                            c = q % a.kc;
                            nl = q / a.kc;
                        }
                        dst[u] = (tap * a.kc + c) * a.bnp + nl;
                        const int k = k0 + nl;
                        if (k < kend && c < kcn) {
                            const size_t wi = NHWC ? ((size_t)k * rs + tap) * g.cpg + c0 + c
                                                   : ((size_t)k * g.cpg + c0 + c) * rs + tap;
                            v[u] = DT::load(w[wi]);
                        }
                    }
                }
#pragma unroll
                for (int u = 0; u < FMA_U; u++)
                    if (dst[u] >= 0)
                        wts[dst[u]] = v[u];
            }
        __syncthreads();

        if (active) {
            const float *hb = halo + gl * a.kc;
            const float *wb = wts + nc * TN;
            const int wtap = a.kc * a.bnp; /* weights: distance between taps */
            for (int r = 0; r < g.r; r++) {
                const int ihl = tr * g.sh + r * g.dh;
                const float *hrow = hb + ihl * a.rpx * a.ps;
                const float *wr = wb + r * g.s * wtap;
                if (KS > 0) {
                    /* Straight-line work per channel, CU channels at a time so that the next
                     * channel's shared-memory reads are in flight during this one's FMAs (one
                     * at a time for wide filters and 8 outputs, which take too many registers). */
                    constexpr int CU = KS * TN <= 12 ? 2 : 1;
                    const float *hp = hrow + sxi * FMA_TM * a.ps;
                    int c = 0;
                    for (; c + CU <= kcn; c += CU)
#pragma unroll
                        for (int u = 0; u < CU; u++)
                            fma_window<TN, KS>(hp + c + u, a.ps, wr + (c + u) * a.bnp, wtap, acc);
                    for (; c < kcn; c++)
                        fma_window<TN, KS>(hp + c, a.ps, wr + c * a.bnp, wtap, acc);
                } else {
                    for (int c = 0; c < kcn; c++)
                        for (int s = 0; s < g.s; s++) {
                            float wv[TN];
                            fma_wvec<TN>::load(wr + s * wtap + c * a.bnp, wv);
#pragma unroll
                            for (int o = 0; o < FMA_TM; o++) {
                                const int iwl = (sxi * FMA_TM + o) * g.sw + s * g.dw;
                                const float xv = hrow[iwl * a.ps + c];
#pragma unroll
                                for (int i = 0; i < TN; i++)
                                    acc[o][i] = fmaf(xv, wv[i], acc[o][i]);
                            }
                        }
                }
            }
        }
        __syncthreads();
    }

    const int oh = oh0 + tr;
    if (!active || oh >= g.ho || n >= g.n)
        return;
    float bv[TN];
#pragma unroll
    for (int i = 0; i < TN; i++)
        bv[i] = g.bias ? DT::load(bias[kt + i]) : 0.0f;
    const int ows = ow0 + sxi * FMA_TM; /* first output column of the strip */
    if (NHWC && !a.out_nchw) {
#pragma unroll
        for (int o = 0; o < FMA_TM; o++) {
            const int ow = ows + o;
            if (ow >= g.wo)
                break;
            float ov[TN];
#pragma unroll
            for (int i = 0; i < TN; i++)
                ov[i] = gpu_epilogue(acc[o][i], bv[i], g);
            fma_out<DT, TN>::store(y + ((size_t)(n * g.ho + oh) * g.wo + ow) * g.k + kt, ov);
        }
    } else {
        /* NCHW: the strip is a run of FMA_TM pixels of each output plane. */
        const int nv = min(FMA_TM, g.wo - ows);
#pragma unroll
        for (int i = 0; i < TN; i++) {
            float ov[FMA_TM];
#pragma unroll
            for (int o = 0; o < FMA_TM; o++)
                ov[o] = gpu_epilogue(acc[o][i], bv[i], g);
            fma_store_run<DT>(y + ((size_t)(n * g.k + kt + i) * g.ho + oh) * g.wo + ows, ov, nv);
        }
    }
}

#define FMA_SMEM_MAX     (64 * 1024)
#define FMA_SMEM_MAX_BIG (112 * 1024) /* blocks of 192+ threads: two per SM still fit */

/* Mean over the block's warps of the worst shared-memory bank conflict of one halo read (the
 * most distinct words any bank serves), for a thread mapping and halo pitches. Lanes of one
 * strip and group read the same word (a broadcast). */
static double fma_conflicts(const struct gpu_fma_plan *pl, int smap, int rpx, int ps)
{
    const struct gpu_geom *g = &pl->g;
    const int nstrips = pl->th * pl->sx;
    int total = 0, warps = 0;
    for (int w0 = 0; w0 < pl->threads; w0 += 32) {
        int addr[32], n = 0;
        for (int t = w0; t < w0 + 32; t++) {
            const int nc = smap ? t / nstrips : t % pl->nch;
            const int strip = smap ? t - nc * nstrips : t / pl->nch;
            if (nc >= pl->nch || strip >= nstrips)
                continue;
            const int tr = strip / pl->sx, sxi = strip - tr * pl->sx;
            const int gl = pl->gpb > 0 ? (nc * pl->tn) / g->kpg : 0;
            const int a = gl * pl->kc + (tr * g->sh * rpx + sxi * FMA_TM * g->sw) * ps;
            int dup = 0;
            for (int i = 0; i < n; i++)
                dup |= addr[i] == a;
            if (!dup)
                addr[n++] = a;
        }
        if (n == 0)
            continue;
        int deg = 0;
        for (int i = 0; i < n; i++) {
            int cnt = 0;
            for (int j = 0; j < n; j++)
                cnt += (addr[j] & 31) == (addr[i] & 31);
            if (cnt > deg)
                deg = cnt;
        }
        total += deg;
        warps++;
    }
    return warps > 0 ? (double)total / warps : 1.0;
}

/* The exact filter width the kernel's register window is built for (fma_window), 0 for the
 * generic loop: unit stride and dilation along W and S of 1, 3, 5 or 7 (only 3 when the kernel
 * gathers NCHW input, to bound the number of instances). */
static int fma_ks(const struct gpu_geom *g, int nhwc_input)
{
    if (g->sw != 1 || g->dw != 1 || (g->s != 1 && g->s != 3 && g->s != 5 && g->s != 7))
        return 0;
    return nhwc_input || g->s == 3 ? g->s : 0;
}

int gpu_fma_plan_make(const struct convd_problem *p, int out_nchw, int kernel,
                      const struct convd_gpu_policy *pol, size_t ws_avail, struct gpu_fma_plan *ret,
                      char *why, size_t why_len)
{
    struct gpu_fma_plan pl;
    memset(&pl, 0, sizeof(pl));
    gpu_geom_from_problem(p, &pl.g);
    pl.dtype = p->dtype;
    pl.layout = p->layout;
    pl.out_nchw = out_nchw;
    const struct gpu_geom *g = &pl.g;
    if (kernel == GPU_FMA_GEMV) {
        const int rc = gpu_gemv_plan_make(p, &pl.gv, why, why_len);
        if (rc != 0)
            return rc;
        pl.gemv = 1;
        pl.threads = pl.gv.threads;
        *ret = pl;
        return 0;
    }
    if (kernel == GPU_FMA_STEM) {
        const int rc = gpu_stem_plan_make(p, &pl.st, why, why_len);
        if (rc != 0)
            return rc;
        pl.stem = 1;
        pl.threads = pl.st.threads;
        pl.smem = pl.st.smem;
        *ret = pl;
        return 0;
    }
    /* The implicit GEMM where it applies and its planner takes the problem; else direct. */
    if (kernel != GPU_FMA_DIRECT) {
        const int rc = gpu_pw_plan_make(p, out_nchw, kernel == GPU_FMA_TF32, pol, ws_avail, &pl.pw,
                                        why, why_len);
        if (rc == 0) {
            pl.gemm = 1;
            pl.threads = pl.pw.threads;
            pl.smem = pl.pw.smem;
            *ret = pl;
            return 0;
        }
        if (kernel == GPU_FMA_GEMM || kernel == GPU_FMA_TF32)
            return rc;
    }

    /* Outputs per thread: the largest of 8, 4, 2 that divides kpg, else 3 where it divides kpg
     * (NHWC input), else 1. One output reads 10 window and 3 weight values per 24 FMAs; 3 won
     * where kpg is an odd multiple of 3, while 5, and 3 in place of 2, lost. */
    pl.tn = g->kpg % 8 == 0 ? 8 : g->kpg % 4 == 0 ? 4 : g->kpg % 2 == 0 ? 2 : 1;
    if (p->layout == CONVD_LAYOUT_NHWC && pol->fma_outputs3 && pl.tn == 1 && g->kpg % 3 == 0)
        pl.tn = 3;
    pl.ks = fma_ks(g, p->layout == CONVD_LAYOUT_NHWC);
    const int per_group = g->kpg / pl.tn;
    /* Spatial tile first (about 32 strips of FMA_TM pixels), then enough output-channel chunks
     * to fill 256 threads: whole groups (a power of two of them) when a group has few chunks,
     * else a divisor of the group's chunks. */
    int sx = (g->wo + FMA_TM - 1) / FMA_TM;
    if (sx > 8)
        sx = 8;
    int th = 32 / sx;
    if (th < 1)
        th = 1;
    if (th > g->ho)
        th = g->ho;
    int nch_target = 256 / (sx * th);
    if (nch_target < 1)
        nch_target = 1;
    if (per_group >= nch_target) {
        int nch = 1;
        for (int d = 1; d <= nch_target; d++)
            if (per_group % d == 0)
                nch = d;
        pl.nch = nch;
        pl.nsplit = per_group / nch;
        pl.gpb = pl.nsplit == 1 ? 1 : 0;
        pl.bn = nch * pl.tn;
    } else {
        int gpb = 1;
        while (gpb * 2 * per_group <= nch_target && gpb * 2 <= g->g)
            gpb *= 2;
        pl.gpb = gpb;
        pl.nsplit = 1;
        pl.nch = gpb * per_group;
        pl.bn = gpb * g->kpg;
    }
    /* At least two blocks per SM: fewer groups per block when the grid would be too small. */
    {
        struct gpu_device_info dev;
        const int64_t sms = gpu_device_info_get(&dev) == 0 ? dev.sm_count : 132;
        const int64_t tiles =
            (int64_t)g->n * ((g->ho + th - 1) / th) * ((g->wo + sx * FMA_TM - 1) / (sx * FMA_TM));
        while (pl.gpb > 1 && tiles * ((g->g + pl.gpb - 1) / pl.gpb) < 2 * sms) {
            pl.gpb /= 2;
            pl.nch = pl.gpb * per_group;
            pl.bn = pl.gpb * g->kpg;
        }
    }
    pl.nblk = pl.gpb > 0 ? (g->g + pl.gpb - 1) / pl.gpb : g->g * pl.nsplit;
    pl.bnp = (pl.bn + 3) & ~3;

    const int rs = g->r * g->s;
    const int groups_in_block = pl.gpb > 0 ? pl.gpb : 1;
    for (;;) {
        const int ih = (th - 1) * g->sh + (g->r - 1) * g->dh + 1;
        const int iw = (sx * FMA_TM - 1) * g->sw + (g->s - 1) * g->dw + 1;
        int kc = g->cpg;
        for (;;) {
            const int cbc = groups_in_block * kc;
            const int ps = cbc | 1;
            const long bytes =
                ((((long)ih * iw * ps + 3) & ~3L) + (long)rs * kc * pl.bnp) * (long)sizeof(float);
            const long cap = pl.nch * sx * th >= 192 ? FMA_SMEM_MAX_BIG : FMA_SMEM_MAX;
            if (bytes <= cap) {
                pl.ih = ih;
                pl.iw = iw;
                pl.kc = kc;
                pl.cbc = cbc;
                pl.ps = ps;
                pl.smem = (int)bytes;
                break;
            }
            if (kc == 1)
                break;
            kc = (kc + 1) / 2;
        }
        if (pl.smem > 0)
            break;
        if (th == 1 && sx == 1) {
            snprintf(why, why_len, "fma: halo tile does not fit in shared memory");
            return CONVD_EUNSUPPORTED;
        }
        if (th > 1)
            th = (th + 1) / 2;
        else
            sx = (sx + 1) / 2;
    }
    pl.sx = sx;
    pl.th = th;
    pl.nchunks = (g->cpg + pl.kc - 1) / pl.kc;
    /* Whole warps: the NCHW halo loader hands a warp's lanes a row of columns. */
    pl.threads = (pl.nch * sx * th + 31) & ~31;
    /* Thread mapping and halo pitches (row pitch up to 15 pixels, pixel stride up to 3 floats
     * past the minimum) with the fewest bank conflicts, then the least shared memory; the
     * strip-major mapping first, since its weight reads are broadcasts. */
    {
        double best = 1e9;
        long best_bytes = 0;
        const long cap = pl.nch * sx * th >= 192 ? FMA_SMEM_MAX_BIG : FMA_SMEM_MAX;
        pl.smap = 1;
        pl.rpx = pl.iw;
        for (int smap = 1; smap >= 0; smap--)
            for (int rpx = pl.iw; rpx < pl.iw + 16; rpx++)
                for (int ps = pl.cbc; ps < pl.cbc + 4; ps++) {
                    const long bytes =
                        ((((long)pl.ih * rpx * ps + 3) & ~3L) + (long)rs * pl.kc * pl.bnp) *
                        (long)sizeof(float);
                    if (bytes > cap && !(rpx == pl.iw && ps == pl.cbc))
                        continue;
                    const double c = fma_conflicts(&pl, smap, rpx, ps);
                    if (c < best - 1e-9 ||
                        (c < best + 1e-9 && smap == pl.smap && bytes < best_bytes)) {
                        best = c;
                        best_bytes = bytes;
                        pl.smap = smap;
                        pl.rpx = rpx;
                        pl.ps = ps;
                    }
                }
        pl.smem = (int)best_bytes;
    }
    pl.tiles_w = (g->wo + sx * FMA_TM - 1) / (sx * FMA_TM);
    pl.tiles_h = (g->ho + th - 1) / th;
    const int64_t blocks = (int64_t)g->n * pl.tiles_h * pl.tiles_w * pl.nblk;
    if (blocks > 0x7fffffff) {
        snprintf(why, why_len, "fma: grid too large");
        return CONVD_EUNSUPPORTED;
    }
    pl.tiles = (int)((int64_t)g->n * pl.tiles_h * pl.tiles_w);
    *ret = pl;
    return 0;
}

template <class DT, int NHWC, int TN, int KS>
static int fma_launch_ks(const struct gpu_fma_plan *pl, const struct fma_args *a,
                         const struct gpu_batch *b, int count, const struct gpu_launch *ln)
{
    dim3 grid((unsigned)(pl->tiles * pl->nblk), 1, (unsigned)count);
    dim3 block((unsigned)pl->threads);
    int rc = gpu_allow_smem((const void *)fma_kernel<DT, NHWC, TN, KS>, pl->smem);
    if (rc != 0)
        return rc;
    GPU_LAUNCH((fma_kernel<DT, NHWC, TN, KS>), grid, block, pl->smem, ln, *a, *b);
    CONVD_GPU_CHECK(hipGetLastError());
    return 0;
}

/* Instances: the exact window widths of fma_ks (1, 3, 5, 7 for NHWC input, 3 for NCHW) and the
 * generic loop (0). */
template <class DT, int NHWC, int TN>
static int fma_launch_tn(const struct gpu_fma_plan *pl, const struct fma_args *a,
                         const struct gpu_batch *b, int count, const struct gpu_launch *ln)
{
    switch (pl->ks) {
    case 1:
        return fma_launch_ks < DT, NHWC, TN, NHWC ? 1 : 0 > (pl, a, b, count, ln);
    case 3:
        return fma_launch_ks<DT, NHWC, TN, 3>(pl, a, b, count, ln);
    case 5:
        return fma_launch_ks < DT, NHWC, TN, NHWC ? 5 : 0 > (pl, a, b, count, ln);
    case 7:
        return fma_launch_ks < DT, NHWC, TN, NHWC ? 7 : 0 > (pl, a, b, count, ln);
    default:
        return fma_launch_ks<DT, NHWC, TN, 0>(pl, a, b, count, ln);
    }
}

template <class DT, int NHWC>
static int fma_launch_layout(const struct gpu_fma_plan *pl, const struct fma_args *a,
                             const struct gpu_batch *b, int count, const struct gpu_launch *ln)
{
    switch (pl->tn) {
    case 8:
        return fma_launch_tn<DT, NHWC, 8>(pl, a, b, count, ln);
    case 3:
        /* NHWC input only (the planner's rule): the NCHW gather is the no-workspace fallback. */
        if constexpr (NHWC != 0)
            return fma_launch_tn<DT, NHWC, 3>(pl, a, b, count, ln);
        return CONVD_EINVAL;
    case 4:
        return fma_launch_tn<DT, NHWC, 4>(pl, a, b, count, ln);
    case 2:
        return fma_launch_tn<DT, NHWC, 2>(pl, a, b, count, ln);
    default:
        return fma_launch_tn<DT, NHWC, 1>(pl, a, b, count, ln);
    }
}

template <class DT>
static int fma_launch_dt(const struct gpu_fma_plan *pl, const struct fma_args *a,
                         const struct gpu_batch *b, int count, const struct gpu_launch *ln)
{
    if (pl->layout == CONVD_LAYOUT_NHWC)
        return fma_launch_layout<DT, 1>(pl, a, b, count, ln);
    return fma_launch_layout<DT, 0>(pl, a, b, count, ln);
}

int gpu_fma_launch(const struct gpu_fma_plan *pl, const struct gpu_batch *b, int count,
                   const struct gpu_launch *ln)
{
    if (pl->gemm)
        return gpu_pw_launch(&pl->pw, b, count, ln);
    if (pl->gemv)
        return gpu_gemv_launch(&pl->gv, b, count, ln);
    if (pl->stem)
        return gpu_stem_launch(&pl->st, b, count, ln);
    struct fma_args a;
    a.g = pl->g;
    a.nch = pl->nch;
    a.bn = pl->bn;
    a.gpb = pl->gpb;
    a.nsplit = pl->nsplit;
    a.nblk = pl->nblk;
    a.sx = pl->sx;
    a.th = pl->th;
    a.tiles_w = pl->tiles_w;
    a.tiles_h = pl->tiles_h;
    a.ih = pl->ih;
    a.iw = pl->iw;
    a.kc = pl->kc;
    a.cbc = pl->cbc;
    a.ps = pl->ps;
    a.bnp = pl->bnp;
    a.rpx = pl->rpx;
    a.smap = pl->smap;
    a.out_nchw = pl->out_nchw;
    switch (pl->dtype) {
    case CONVD_DTYPE_FP32:
        return fma_launch_dt<dt_f32>(pl, &a, b, count, ln);
    case CONVD_DTYPE_FP16:
        return fma_launch_dt<dt_f16>(pl, &a, b, count, ln);
    case CONVD_DTYPE_BF16:
        return fma_launch_dt<dt_bf16>(pl, &a, b, count, ln);
    }
    return CONVD_EINVAL;
}
