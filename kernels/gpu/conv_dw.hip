/*
 * Depthwise and channel-multiplier convolution (cpg = 1, kpg 1 or 2): memory bound, so the
 * kernels are judged in GB/s.
 *
 * NHWC: a block copies the input halo of a spatial tile for 32 (fp32) or 64 (fp16/bf16) adjacent
 * channels into shared memory with 16-byte cp.async, then each lane owns 1 or 2 channels and a
 * strip of P output pixels along W and produces their kpg outputs. With unit stride and dilation
 * along W, a filter row's input columns are read once into a register window and reused by every
 * tap (SMAX is the widest filter the window serves). The first version read global memory
 * straight into registers and ran at 1-2 blocks per SM for lack of registers (0.05-0.4 of the
 * bandwidth); the shared-memory tile keeps many loads in flight with few registers.
 *
 * NCHW: one block per (image, channel) plane and tile of output rows. The input rows the tile
 * needs go to shared memory as fp32 (converted once, zero padded), then each thread computes a
 * strip of P outputs for each of the kpg output planes, with the same register window.
 */
#include "gpu_internal.h"

#define DW_P 4

/* Asynchronous 16-byte copy global -> shared, zero-filled when !valid: cp.async on NVIDIA
 * (sm_80+), a plain vector load and store elsewhere. */
GPU_D void dw_cp16(void *dst, const void *src, bool valid)
{
#if defined(CONVD_DEVICE_SM80)
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(valid ? 16 : 0));
#else
    *(uint4 *)dst = valid ? *(const uint4 *)src : make_uint4(0, 0, 0, 0);
#endif
}

GPU_D void dw_cp_wait_all()
{
#if defined(CONVD_DEVICE_SM80)
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::);
#endif
}

/* CPL adjacent channels of one pixel from the shared halo, as fp32. */
template <class DT, int CPL> struct dw_px;
template <> struct dw_px<dt_f32, 1> {
    static GPU_D void load(const uint8_t *p, float *v)
    {
        v[0] = *(const float *)p;
    }
};
template <class DT> struct dw_px16 {
    static GPU_D void load(const uint8_t *p, float *v)
    {
        const uint32_t u = *(const uint32_t *)p;
        v[0] = DT::load((uint16_t)(u & 0xffffu));
        v[1] = DT::load((uint16_t)(u >> 16));
    }
};
template <> struct dw_px<dt_f16, 2> : dw_px16<dt_f16> {
};
template <> struct dw_px<dt_bf16, 2> : dw_px16<dt_bf16> {
};

/* Stores N adjacent output channels (N = CPL * KPG: 1, 2 or 4). */
template <class DT, int N> GPU_D void dw_store(typename DT::T *p, const float *v)
{
#pragma unroll
    for (int i = 0; i < N; i++)
        p[i] = DT::store(v[i]);
}

struct dwt_args {
    int cb, cblocks, th, tw, tiles_h, tiles_w, ih, iw, ps;
};

/*
 * NHWC. A block owns a tile of th x tw output pixels of one image and cb = 32 * CPL channels
 * (CPL = 2 for 16-bit types, 1 for fp32: one warp spans the channels, so shared-memory reads
 * are conflict-free 4-byte accesses). The input halo arrives by 16-byte cp.async (zero-filled at
 * the borders), the block's weights as fp32 [tap][channel]. Each warp then walks strips of P
 * output pixels along W; with unit stride and dilation along W a row's input columns are read
 * once into a register window and reused by every tap (SMAX is the widest filter it serves).
 */
template <class DT, int CPL, int KPG, int P, int SMAX>
__global__ void __launch_bounds__(256)
    dw_nhwc_kernel(const struct gpu_geom g, const struct gpu_batch b, const struct dwt_args a)
{
    typedef typename DT::T T;
    extern __shared__ __align__(16) uint8_t dwt_smem[];
    const int prob = blockIdx.z;
    const T *x = (const T *)b.x[prob];
    const T *w = (const T *)b.w[prob];
    const T *bias = (const T *)b.b[prob];
    T *y = (T *)b.y[prob];
    const int es = (int)sizeof(T);

    const int cblk = blockIdx.x % a.cblocks;
    int tile = blockIdx.x / a.cblocks;
    const int tw_i = tile % a.tiles_w;
    tile /= a.tiles_w;
    const int th_i = tile % a.tiles_h;
    const int n = tile / a.tiles_h;
    const int oh0 = th_i * a.th, ow0 = tw_i * a.tw;
    const int ih0 = oh0 * g.sh - g.pt, iw0 = ow0 * g.sw - g.pl;
    const int c0 = cblk * a.cb;
    const int cbn = min(a.cb, g.c - c0);
    const int rs = g.r * g.s;
    const int hpix = a.ih * a.iw;

    uint8_t *halo = dwt_smem;
    float *wts = (float *)(dwt_smem + ((hpix * a.ps + 15) & ~15));

    /* Halo: 16-byte vectors of the block's channels (C is a multiple of the vector). */
    const int vpp = (cbn * es) >> 4;
    if ((int)blockDim.x % vpp == 0) {
        /* Fixed 16-byte column per thread, pixels walked (row, column) without divisions. */
        const int cv = threadIdx.x % vpp, pstep = blockDim.x / vpp;
        struct gpu_walk wk;
        gpu_walk_init(&wk, threadIdx.x / vpp, pstep, a.ih, a.iw);
        for (int pix = threadIdx.x / vpp; pix < hpix;
             pix += pstep, gpu_walk_step(&wk, a.ih, a.iw)) {
            const int ih = ih0 + wk.mid, iw = iw0 + wk.lo;
            const bool valid = convd_math_inside(ih, g.h) && convd_math_inside(iw, g.w);
            const T *src = valid ? x + ((size_t)(n * g.h + ih) * g.w + iw) * g.c + c0 +
                                       cv * (16 / es)
                                 : x;
            dw_cp16(halo + pix * a.ps + cv * 16, src, valid);
        }
    } else
    for (int v = threadIdx.x; v < hpix * vpp; v += blockDim.x) {
        const int pix = v / vpp, cv = v - pix * vpp;
        const int ihl = pix / a.iw, iwl = pix - ihl * a.iw;
        const int ih = ih0 + ihl, iw = iw0 + iwl;
        const bool valid = convd_math_inside(ih, g.h) && convd_math_inside(iw, g.w);
        const T *src = valid ? x + ((size_t)(n * g.h + ih) * g.w + iw) * g.c + c0 + cv * (16 / es)
                             : x;
        dw_cp16(halo + pix * a.ps + cv * 16, src, valid);
    }
    /* Weights (K, R, S, 1) of outputs [c0 * KPG, (c0 + cb) * KPG) as fp32 [tap][k]. */
    const int kb = a.cb * KPG;
    for (int e = threadIdx.x; e < rs * kb; e += blockDim.x) {
        const int tap = e / kb, kl = e - tap * kb;
        const int k = c0 * KPG + kl;
        wts[e] = kl < cbn * KPG ? DT::load(w[(size_t)k * rs + tap]) : 0.0f;
    }
    dw_cp_wait_all();
    __syncthreads();

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane * CPL >= cbn)
        return;
    const int spr = a.tw / P; /* strips per tile row */
    const float *wl = wts + lane * CPL * KPG;
    float bv[CPL * KPG];
#pragma unroll
    for (int i = 0; i < CPL * KPG; i++)
        bv[i] = g.bias ? DT::load(bias[(c0 + lane * CPL) * KPG + i]) : 0.0f;

    for (int st = warp; st < a.th * spr; st += nwarps) {
        const int tr = st / spr, sxi = st - tr * spr;
        const int oh = oh0 + tr, ow = ow0 + sxi * P;
        if (oh >= g.ho || ow >= g.wo)
            continue;
        float acc[P][CPL * KPG];
#pragma unroll
        for (int o = 0; o < P; o++)
#pragma unroll
            for (int i = 0; i < CPL * KPG; i++)
                acc[o][i] = 0.0f;
        for (int r = 0; r < g.r; r++) {
            const uint8_t *hrow =
                halo + ((tr * g.sh + r * g.dh) * a.iw + sxi * P * g.sw) * a.ps + lane * CPL * es;
            if (SMAX > 0) {
                float win[P + (SMAX > 0 ? SMAX : 1) - 1][CPL];
#pragma unroll
                for (int j = 0; j < P + SMAX - 1; j++) {
                    if (j < P + g.s - 1) {
                        dw_px<DT, CPL>::load(hrow + j * a.ps, win[j]);
                    } else {
#pragma unroll
                        for (int c = 0; c < CPL; c++)
                            win[j][c] = 0.0f;
                    }
                }
#pragma unroll
                for (int s = 0; s < SMAX; s++) {
                    if (s < g.s) {
                        const float *wt = wl + (r * g.s + s) * kb;
                        float wv[CPL * KPG];
#pragma unroll
                        for (int i = 0; i < CPL * KPG; i++)
                            wv[i] = wt[i];
#pragma unroll
                        for (int o = 0; o < P; o++)
#pragma unroll
                            for (int c = 0; c < CPL; c++)
#pragma unroll
                                for (int q = 0; q < KPG; q++)
                                    acc[o][c * KPG + q] =
                                        fmaf(win[o + s][c], wv[c * KPG + q], acc[o][c * KPG + q]);
                    }
                }
            } else {
                for (int s = 0; s < g.s; s++) {
                    const float *wt = wl + (r * g.s + s) * kb;
                    float wv[CPL * KPG];
#pragma unroll
                    for (int i = 0; i < CPL * KPG; i++)
                        wv[i] = wt[i];
#pragma unroll
                    for (int o = 0; o < P; o++) {
                        float xv[CPL];
                        dw_px<DT, CPL>::load(hrow + (o * g.sw + s * g.dw) * a.ps, xv);
#pragma unroll
                        for (int c = 0; c < CPL; c++)
#pragma unroll
                            for (int q = 0; q < KPG; q++)
                                acc[o][c * KPG + q] = fmaf(xv[c], wv[c * KPG + q], acc[o][c * KPG + q]);
                    }
                }
            }
        }
        T *out = y + ((size_t)(n * g.ho + oh) * g.wo + ow) * g.k + (c0 + lane * CPL) * KPG;
#pragma unroll
        for (int o = 0; o < P; o++) {
            if (ow + o >= g.wo)
                break;
            float ov[CPL * KPG];
#pragma unroll
            for (int i = 0; i < CPL * KPG; i++)
                ov[i] = gpu_epilogue(acc[o][i], bv[i], g.relu);
            dw_store<DT, CPL * KPG>(out + (size_t)o * g.k, ov);
        }
    }
}

/*
 * NCHW. Block: one (image, input channel) plane and `th` output rows; threads th x sx, each a
 * strip of DW_P outputs of one row, for each of the kpg output planes of the channel.
 */
template <class DT, int SMAX>
__global__ void __launch_bounds__(256)
    dw_nchw_kernel(const struct gpu_geom g, const struct gpu_batch b, int th, int sx, int tiles_h,
                   int ir, int icols)
{
    typedef typename DT::T T;
    extern __shared__ float dw_smem[];
    const int prob = blockIdx.z;
    const T *x = (const T *)b.x[prob];
    const T *w = (const T *)b.w[prob];
    const T *bias = (const T *)b.b[prob];
    T *y = (T *)b.y[prob];

    const int tile = blockIdx.x % tiles_h;
    const int plane = blockIdx.x / tiles_h; /* n * C + c */
    const int c = plane % g.c, n = plane / g.c;
    const int oh0 = tile * th;
    const int ih0 = oh0 * g.sh - g.pt;
    const int rs = g.r * g.s;
    float *in_s = dw_smem;
    float *w_s = dw_smem + ir * icols;

    const T *xp = x + (size_t)plane * g.h * g.w;
    /* Eight loads in flight per thread before the first store. */
    const int nel = ir * icols;
    const int bd = (int)blockDim.x, dr = bd / icols, dc = bd - dr * icols;
    int rr = (int)threadIdx.x / icols, cc = (int)threadIdx.x - rr * icols;
    for (int base = threadIdx.x; base < nel; base += 8 * bd) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int e = base + u * bd;
            /* (rr, cc) of e, stepped without a division. */
            const int ih = ih0 + rr, iw = cc - g.pl;
            v[u] = (e < nel && convd_math_inside(ih, g.h) && convd_math_inside(iw, g.w))
                       ? DT::load(xp[ih * g.w + iw])
                       : 0.0f;
            cc += dc;
            rr += dr;
            if (cc >= icols) {
                cc -= icols;
                rr++;
            }
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int e = base + u * (int)blockDim.x;
            if (e < nel)
                in_s[e] = v[u];
        }
    }
    for (int e = threadIdx.x; e < g.kpg * rs; e += blockDim.x)
        w_s[e] = DT::load(w[(size_t)c * g.kpg * rs + e]);
    __syncthreads();

    const int tr = threadIdx.x / sx, sxi = threadIdx.x - tr * sx;
    const int oh = oh0 + tr;
    if (tr >= th || oh >= g.ho)
        return;
    const int ow0 = sxi * DW_P;

    for (int q = 0; q < g.kpg; q++) {
        const int k = c * g.kpg + q;
        float acc[DW_P];
#pragma unroll
        for (int o = 0; o < DW_P; o++)
            acc[o] = 0.0f;
        for (int r = 0; r < g.r; r++) {
            const float *row = in_s + (tr * g.sh + r * g.dh) * icols;
            const float *wr = w_s + q * rs + r * g.s;
            if (SMAX > 0) {
                float win[DW_P + (SMAX > 0 ? SMAX : 1) - 1];
#pragma unroll
                for (int j = 0; j < DW_P + SMAX - 1; j++)
                    win[j] = j < DW_P + g.s - 1 ? row[ow0 + j] : 0.0f;
#pragma unroll
                for (int s = 0; s < SMAX; s++) {
                    if (s < g.s) {
                        const float wv = wr[s];
#pragma unroll
                        for (int o = 0; o < DW_P; o++)
                            acc[o] = fmaf(win[o + s], wv, acc[o]);
                    }
                }
            } else {
                for (int s = 0; s < g.s; s++) {
                    const float wv = wr[s];
#pragma unroll
                    for (int o = 0; o < DW_P; o++)
                        acc[o] = fmaf(row[(ow0 + o) * g.sw + s * g.dw], wv, acc[o]);
                }
            }
        }
        const float bv = g.bias ? DT::load(bias[k]) : 0.0f;
        T *out = y + ((size_t)(n * g.k + k) * g.ho + oh) * g.wo + ow0;
#pragma unroll
        for (int o = 0; o < DW_P; o++)
            if (ow0 + o < g.wo)
                out[o] = DT::store(gpu_epilogue(acc[o], bv, g.relu));
    }
}

static int dw_smax(const struct convd_problem *p)
{
    if (p->stride_w != 1 || p->dil_w != 1 || p->s > 7)
        return 0;
    return p->s <= 3 ? 3 : 7;
}

int gpu_dw_plan_make(const struct convd_problem *p, struct gpu_dw_plan *ret, char *why,
                     size_t why_len)
{
    struct gpu_dw_plan pl;
    memset(&pl, 0, sizeof(pl));
    gpu_geom_from_problem(p, &pl.g);
    pl.dtype = p->dtype;
    pl.layout = p->layout;
    const struct gpu_geom *g = &pl.g;
    if (g->cpg != 1 || g->kpg > 2) {
        snprintf(why, why_len, "depthwise: needs 1 channel per group and at most 2 outputs");
        return CONVD_EUNSUPPORTED;
    }
    pl.unit = dw_smax(p);
    const int rs = g->r * g->s;
    if (p->layout == CONVD_LAYOUT_NHWC) {
        const int es = (int)convd_dtype_size(p->dtype);
        pl.vec = 16 / es;
        if (g->c % pl.vec != 0) {
            snprintf(why, why_len, "depthwise: C=%d is not a multiple of the %d-channel vector",
                     g->c, pl.vec);
            return CONVD_EUNSUPPORTED;
        }
        const int cpl = es == 2 ? 2 : 1;
        const int P = pl.unit != 0 && g->kpg == 1 ? 8 : 4;
        if (g->kpg == 2 && pl.unit == 7)
            pl.unit = 0; /* two outputs per channel and a 7-wide window: too many registers */
        const int cb = 32 * cpl;
        /* Tile width: a multiple of P that wastes least of the row, at most 8 strips. */
        const int wr = (g->wo + P - 1) / P * P;
        int tw = P, best = 1 << 30;
        for (int k = 1; k <= 8; k++) {
            const int t = k * P;
            const int waste = ((wr + t - 1) / t) * t - g->wo;
            if (waste < best || (waste == best && t > tw)) {
                best = waste;
                tw = t;
            }
            if (t >= wr)
                break;
        }
        /* About 32 strips for small filters, 16 for wide ones (smaller halo, more blocks). */
        int th = ((g->s > 3 ? 16 : 32) * P) / tw;
        if (th < 1)
            th = 1;
        if (th > g->ho)
            th = g->ho;
        for (;;) {
            const int ih = (th - 1) * g->sh + (g->r - 1) * g->dh + 1;
            const int iw = (tw - 1) * g->sw + (g->s - 1) * g->dw + 1;
            const int ps = cb * es;
            const int bytes = ((ih * iw * ps + 15) & ~15) + rs * cb * g->kpg * 4;
            if (bytes <= 100 * 1024) {
                pl.in_rows = ih;
                pl.in_cols = iw;
                pl.smem = bytes;
                break;
            }
            if (th == 1) {
                snprintf(why, why_len, "depthwise: halo tile too large for shared memory");
                return CONVD_EUNSUPPORTED;
            }
            th = (th + 1) / 2;
        }
        pl.cvb = cb;
        pl.strips = th;
        pl.tw = tw;
        pl.p = P;
        pl.threads = 256;
        pl.tiles_h = (g->ho + th - 1) / th;
        pl.tiles_w = (g->wo + tw - 1) / tw;
        const int64_t blocks =
            (int64_t)g->n * pl.tiles_h * pl.tiles_w * ((g->c + cb - 1) / cb);
        if (blocks > 0x7fffffff) {
            snprintf(why, why_len, "depthwise: grid too large");
            return CONVD_EUNSUPPORTED;
        }
        pl.blocks_per_problem = (int)blocks;
    } else {
        const int sx = (g->wo + DW_P - 1) / DW_P;
        if (sx > 256) {
            snprintf(why, why_len, "depthwise: output rows wider than %d", 256 * DW_P);
            return CONVD_EUNSUPPORTED;
        }
        int th = 256 / sx;
        if (th > g->ho)
            th = g->ho;
        const int icols = (sx * DW_P - 1) * g->sw + (g->s - 1) * g->dw + 1;
        for (;;) {
            const int ir = (th - 1) * g->sh + (g->r - 1) * g->dh + 1;
            const int bytes = (ir * icols + g->kpg * rs) * (int)sizeof(float);
            if (bytes <= 48 * 1024) {
                pl.in_rows = ir;
                pl.smem = bytes;
                break;
            }
            if (th == 1) {
                snprintf(why, why_len, "depthwise: input rows too large for shared memory");
                return CONVD_EUNSUPPORTED;
            }
            th = (th + 1) / 2;
        }
        pl.in_cols = icols;
        pl.strips = th;
        pl.cvb = sx;
        pl.threads = th * sx;
        pl.tiles_h = (g->ho + th - 1) / th;
        if ((int64_t)g->n * g->c * pl.tiles_h > 0x7fffffff) {
            snprintf(why, why_len, "depthwise: grid too large");
            return CONVD_EUNSUPPORTED;
        }
        pl.blocks_per_problem = g->n * g->c * pl.tiles_h;
    }
    *ret = pl;
    return 0;
}

template <class DT, int CPL>
static int dw_launch_nhwc(const struct gpu_dw_plan *pl, const struct gpu_batch *b, int count,
                          hipStream_t stream)
{
    const struct gpu_geom *g = &pl->g;
    struct dwt_args a;
    a.cb = pl->cvb;
    a.cblocks = (g->c + a.cb - 1) / a.cb;
    a.th = pl->strips;
    a.tw = pl->tw;
    a.tiles_h = pl->tiles_h;
    a.tiles_w = pl->tiles_w;
    a.ih = pl->in_rows;
    a.iw = pl->in_cols;
    a.ps = a.cb * (int)sizeof(typename DT::T);
    dim3 grid((unsigned)pl->blocks_per_problem, 1, (unsigned)count);
    dim3 block((unsigned)pl->threads);
    int rc = 0;
#define DW_GO(KPG, P, SMAX)                                                                        \
    do {                                                                                           \
        rc = gpu_allow_smem((const void *)dw_nhwc_kernel<DT, CPL, KPG, P, SMAX>, pl->smem);        \
        if (rc == 0)                                                                               \
            hipLaunchKernelGGL((dw_nhwc_kernel<DT, CPL, KPG, P, SMAX>), grid, block, pl->smem,     \
                               stream, *g, *b, a);                                                 \
    } while (0)
    if (g->kpg == 1) {
        if (pl->unit == 3)
            DW_GO(1, 8, 3);
        else if (pl->unit == 7)
            DW_GO(1, 8, 7);
        else
            DW_GO(1, 4, 0);
    } else {
        if (pl->unit == 3)
            DW_GO(2, 4, 3);
        else
            DW_GO(2, 4, 0);
    }
#undef DW_GO
    if (rc != 0)
        return rc;
    CONVD_GPU_CHECK(hipGetLastError());
    return 0;
}

template <class DT>
static int dw_launch_nchw(const struct gpu_dw_plan *pl, const struct gpu_batch *b, int count,
                          hipStream_t stream)
{
    const struct gpu_geom *g = &pl->g;
    dim3 grid((unsigned)pl->blocks_per_problem, 1, (unsigned)count);
    dim3 block((unsigned)pl->threads);
#define DW_GO(SMAX)                                                                                \
    hipLaunchKernelGGL((dw_nchw_kernel<DT, SMAX>), grid, block, pl->smem, stream, *g, *b,          \
                       pl->strips, pl->cvb, pl->tiles_h, pl->in_rows, pl->in_cols)
    if (pl->unit == 3)
        DW_GO(3);
    else if (pl->unit == 7)
        DW_GO(7);
    else
        DW_GO(0);
#undef DW_GO
    CONVD_GPU_CHECK(hipGetLastError());
    return 0;
}

int gpu_dw_launch(const struct gpu_dw_plan *pl, const struct gpu_batch *b, int count,
                  hipStream_t stream)
{
    const int nhwc = pl->layout == CONVD_LAYOUT_NHWC;
    switch (pl->dtype) {
    case CONVD_DTYPE_FP32:
        return nhwc ? dw_launch_nhwc<dt_f32, 1>(pl, b, count, stream)
                    : dw_launch_nchw<dt_f32>(pl, b, count, stream);
    case CONVD_DTYPE_FP16:
        return nhwc ? dw_launch_nhwc<dt_f16, 2>(pl, b, count, stream)
                    : dw_launch_nchw<dt_f16>(pl, b, count, stream);
    case CONVD_DTYPE_BF16:
        return nhwc ? dw_launch_nhwc<dt_bf16, 2>(pl, b, count, stream)
                    : dw_launch_nchw<dt_bf16>(pl, b, count, stream);
    }
    return CONVD_EINVAL;
}
