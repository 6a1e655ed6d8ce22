/*
 * Depthwise and channel-multiplier convolution (cpg = 1, kpg 1 or 2): memory bound, so the
 * kernels are judged in GB/s.
 *
 * NHWC: each thread owns a vector of V adjacent input channels (16 bytes: 8 fp16/bf16 or 4 fp32)
 * and a strip of P output pixels along W; it produces the V*kpg adjacent output channels of those
 * pixels. Lanes are arranged 4 channel vectors x 8 strips so that a warp's loads are 64-byte
 * contiguous runs and its weight reads from shared memory hit only 4 addresses (broadcast).
 * With unit stride and dilation along W, the input columns of a filter row are loaded once into
 * a register window and reused by every tap (SMAX is the widest filter the window serves).
 *
 * NCHW: one block per (image, channel) plane and tile of output rows. The input rows the tile
 * needs go to shared memory as fp32 (converted once, zero padded), then each thread computes a
 * strip of P outputs for each of the kpg output planes, with the same register window.
 */
#include "gpu_internal.h"

#define DW_P 4

/* 16-byte vector load/store of V elements of DT, converted to/from fp32. */
template <class DT, int V> struct dw_vec;

template <> struct dw_vec<dt_f32, 4> {
    static GPU_D void load(const float *p, float *v)
    {
        float4 q = *(const float4 *)p;
        v[0] = q.x;
        v[1] = q.y;
        v[2] = q.z;
        v[3] = q.w;
    }
    static GPU_D void store(float *p, const float *v)
    {
        *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
    }
};

template <class DT> struct dw_vec16 {
    static GPU_D void load(const uint16_t *p, float *v)
    {
        uint4 q = *(const uint4 *)p;
        const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[2 * i] = DT::load((uint16_t)(u[i] & 0xffffu));
            v[2 * i + 1] = DT::load((uint16_t)(u[i] >> 16));
        }
    }
    static GPU_D void store(uint16_t *p, const float *v)
    {
        uint32_t u[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            u[i] = (uint32_t)DT::store(v[2 * i]) | ((uint32_t)DT::store(v[2 * i + 1]) << 16);
        *(uint4 *)p = make_uint4(u[0], u[1], u[2], u[3]);
    }
};
template <> struct dw_vec<dt_f16, 8> : dw_vec16<dt_f16> {
};
template <> struct dw_vec<dt_bf16, 8> : dw_vec16<dt_bf16> {
};

/*
 * NHWC. Block: ncg groups of 4 channel vectors x nsg groups of 8 strips (one warp each).
 * grid.x = strip blocks * channel blocks, grid.z = problem.
 */
template <class DT, int V, int KPG, int SMAX>
__global__ void __launch_bounds__(256)
    dw_nhwc_kernel(const struct gpu_geom g, const struct gpu_batch b, int ncg, int nsg,
                   int cblocks, int64_t strips)
{
    typedef typename DT::T T;
    extern __shared__ float dw_smem[];
    const int prob = blockIdx.z;
    const T *x = (const T *)b.x[prob];
    const T *w = (const T *)b.w[prob];
    const T *bias = (const T *)b.b[prob];
    T *y = (T *)b.y[prob];

    const int cvb = 4 * ncg;            /* channel vectors per block */
    const int kpb = cvb * V * KPG;      /* output channels per block */
    const int cblk = blockIdx.x % cblocks;
    const int64_t sblk = blockIdx.x / cblocks;
    const int rs = g.r * g.s;

    /* Weights of the block's output channels as fp32, [tap][k]. */
    for (int e = threadIdx.x; e < rs * kpb; e += blockDim.x) {
        const int tap = e / kpb, kl = e - tap * kpb;
        const int k = cblk * kpb + kl;
        dw_smem[e] = k < g.k ? DT::load(w[k * rs + tap]) : 0.0f;
    }
    __syncthreads();

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int cg = warp % ncg, sg = warp / ncg;
    const int cvl = cg * 4 + (lane & 3);
    const int cv = cblk * cvb + cvl;
    const int64_t st = sblk * (nsg * 8) + sg * 8 + (lane >> 2);
    const int sxw = (g.wo + DW_P - 1) / DW_P;
    if (cv * V >= g.c || st >= strips)
        return;
    const int sx = (int)(st % sxw);
    const int64_t t2 = st / sxw;
    const int oh = (int)(t2 % g.ho);
    const int n = (int)(t2 / g.ho);
    const int ow0 = sx * DW_P;

    float acc[DW_P][V * KPG];
#pragma unroll
    for (int o = 0; o < DW_P; o++)
#pragma unroll
        for (int i = 0; i < V * KPG; i++)
            acc[o][i] = 0.0f;

    const float *wl = dw_smem + cvl * V * KPG;
    for (int r = 0; r < g.r; r++) {
        const int ih = convd_math_in_coord(oh, r, g.sh, g.pt, g.dh);
        if (!convd_math_inside(ih, g.h))
            continue;
        const T *row = x + (size_t)(n * g.h + ih) * g.w * g.c + cv * V;
        if (SMAX > 0) {
            float win[DW_P + (SMAX > 0 ? SMAX : 1) - 1][V];
#pragma unroll
            for (int j = 0; j < DW_P + SMAX - 1; j++) {
                const int iw = ow0 - g.pl + j;
                if (j < DW_P + g.s - 1 && convd_math_inside(iw, g.w)) {
                    dw_vec<DT, V>::load(row + (size_t)iw * g.c, win[j]);
                } else {
#pragma unroll
                    for (int v = 0; v < V; v++)
                        win[j][v] = 0.0f;
                }
            }
#pragma unroll
            for (int s = 0; s < SMAX; s++) {
                if (s < g.s) {
                    const float *wt = wl + (r * g.s + s) * kpb;
                    float wv[V * KPG];
#pragma unroll
                    for (int i = 0; i < V * KPG; i += 4) {
                        float4 q = *(const float4 *)(wt + i);
                        wv[i] = q.x;
                        wv[i + 1] = q.y;
                        wv[i + 2] = q.z;
                        wv[i + 3] = q.w;
                    }
#pragma unroll
                    for (int o = 0; o < DW_P; o++)
#pragma unroll
                        for (int v = 0; v < V; v++)
#pragma unroll
                            for (int q = 0; q < KPG; q++)
                                acc[o][v * KPG + q] =
                                    fmaf(win[o + s][v], wv[v * KPG + q], acc[o][v * KPG + q]);
                }
            }
        } else {
            for (int s = 0; s < g.s; s++) {
                const float *wt = wl + (r * g.s + s) * kpb;
                float wv[V * KPG];
#pragma unroll
                for (int i = 0; i < V * KPG; i += 4) {
                    float4 q = *(const float4 *)(wt + i);
                    wv[i] = q.x;
                    wv[i + 1] = q.y;
                    wv[i + 2] = q.z;
                    wv[i + 3] = q.w;
                }
#pragma unroll
                for (int o = 0; o < DW_P; o++) {
                    const int iw = convd_math_in_coord(ow0 + o, s, g.sw, g.pl, g.dw);
                    if (!convd_math_inside(iw, g.w))
                        continue;
                    float xv[V];
                    dw_vec<DT, V>::load(row + (size_t)iw * g.c, xv);
#pragma unroll
                    for (int v = 0; v < V; v++)
#pragma unroll
                        for (int q = 0; q < KPG; q++)
                            acc[o][v * KPG + q] = fmaf(xv[v], wv[v * KPG + q], acc[o][v * KPG + q]);
                }
            }
        }
    }

    float bv[V * KPG];
#pragma unroll
    for (int i = 0; i < V * KPG; i++)
        bv[i] = g.bias ? DT::load(bias[cv * V * KPG + i]) : 0.0f;
    T *out = y + ((size_t)(n * g.ho + oh) * g.wo + ow0) * g.k + cv * V * KPG;
#pragma unroll
    for (int o = 0; o < DW_P; o++) {
        if (ow0 + o >= g.wo)
            break;
        float ov[V * KPG];
#pragma unroll
        for (int i = 0; i < V * KPG; i++)
            ov[i] = gpu_epilogue(acc[o][i], bv[i], g.relu);
#pragma unroll
        for (int i = 0; i < KPG; i++)
            dw_vec<DT, V>::store(out + (size_t)o * g.k + i * V, ov + i * V);
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
    for (int e = threadIdx.x; e < ir * icols; e += blockDim.x) {
        const int rr = e / icols, cc = e - rr * icols;
        const int ih = ih0 + rr, iw = cc - g.pl;
        in_s[e] = (convd_math_inside(ih, g.h) && convd_math_inside(iw, g.w))
                      ? DT::load(xp[ih * g.w + iw])
                      : 0.0f;
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
        pl.vec = p->dtype == CONVD_DTYPE_FP32 ? 4 : 8;
        if (g->c % pl.vec != 0) {
            snprintf(why, why_len, "depthwise: C=%d is not a multiple of the %d-channel vector",
                     g->c, pl.vec);
            return CONVD_EUNSUPPORTED;
        }
        if (g->kpg == 2 && pl.unit == 7) {
            /* Two outputs per channel and a 7-wide window exceed the register budget. */
            pl.unit = 0;
        }
        const int cv = g->c / pl.vec;
        int ncg = (cv + 3) / 4;
        if (ncg > 8)
            ncg = 8;
        while (ncg > 1 && rs * 4 * ncg * pl.vec * g->kpg * 4 > 48 * 1024)
            ncg--;
        if (rs * 4 * pl.vec * g->kpg * 4 > 48 * 1024) {
            snprintf(why, why_len, "depthwise: %dx%d filter too large for shared memory", g->r,
                     g->s);
            return CONVD_EUNSUPPORTED;
        }
        int nsg = 8 / ncg;
        if (nsg < 1)
            nsg = 1;
        pl.cvb = ncg;     /* stored as channel groups of 4 vectors */
        pl.strips = nsg;  /* stored as strip groups of 8 */
        pl.threads = 32 * ncg * nsg;
        pl.smem = rs * 4 * ncg * pl.vec * g->kpg * (int)sizeof(float);
        const int cblocks = (cv + 4 * ncg - 1) / (4 * ncg);
        const int64_t strips = (int64_t)g->n * g->ho * ((g->wo + DW_P - 1) / DW_P);
        const int64_t sblocks = (strips + nsg * 8 - 1) / (nsg * 8);
        if (sblocks * cblocks > 0x7fffffff) {
            snprintf(why, why_len, "depthwise: grid too large");
            return CONVD_EUNSUPPORTED;
        }
        pl.blocks_per_problem = (int)(sblocks * cblocks);
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

template <class DT, int V>
static int dw_launch_nhwc(const struct gpu_dw_plan *pl, const struct gpu_batch *b, int count,
                          hipStream_t stream)
{
    const struct gpu_geom *g = &pl->g;
    const int ncg = pl->cvb, nsg = pl->strips;
    const int cv = g->c / V;
    const int cblocks = (cv + 4 * ncg - 1) / (4 * ncg);
    const int64_t strips = (int64_t)g->n * g->ho * ((g->wo + DW_P - 1) / DW_P);
    dim3 grid((unsigned)pl->blocks_per_problem, 1, (unsigned)count);
    dim3 block((unsigned)pl->threads);
#define DW_GO(KPG, SMAX)                                                                           \
    hipLaunchKernelGGL((dw_nhwc_kernel<DT, V, KPG, SMAX>), grid, block, pl->smem, stream, *g, *b,   \
                       ncg, nsg, cblocks, strips)
    if (g->kpg == 1) {
        if (pl->unit == 3)
            DW_GO(1, 3);
        else if (pl->unit == 7)
            DW_GO(1, 7);
        else
            DW_GO(1, 0);
    } else {
        if (pl->unit == 3)
            DW_GO(2, 3);
        else
            DW_GO(2, 0);
    }
#undef DW_GO
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
        return nhwc ? dw_launch_nhwc<dt_f32, 4>(pl, b, count, stream)
                    : dw_launch_nchw<dt_f32>(pl, b, count, stream);
    case CONVD_DTYPE_FP16:
        return nhwc ? dw_launch_nhwc<dt_f16, 8>(pl, b, count, stream)
                    : dw_launch_nchw<dt_f16>(pl, b, count, stream);
    case CONVD_DTYPE_BF16:
        return nhwc ? dw_launch_nhwc<dt_bf16, 8>(pl, b, count, stream)
                    : dw_launch_nchw<dt_bf16>(pl, b, count, stream);
    }
    return CONVD_EINVAL;
}
