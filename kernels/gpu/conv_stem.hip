/*
 * Dense convolutions of a few input channels on the FMA units: the stems of image networks (3
 * channels, 3x3 to 7x7 filters at stride 2), in either layout. A thread owns ST_PX adjacent
 * output pixels of a row x ST_KT adjacent output channels; the block's weights sit in shared
 * memory as fp32 [tap][c][k], so each tap and channel is two 16-byte reads of the thread's ST_KT
 * weights feeding ST_PX x ST_KT FMAs, and the input values come straight from global memory,
 * where the threads of a pixel share them through L1.
 *
 * Why: with C = 3 the tensor cores need C padded to 8 on a copy of the input (`mma-padded`) and
 * the FMA tiles stage a halo of 3-channel pixels for a reduction of 27-147 terms: regnet's
 * 3x3 stem took 10.7 us in fp16 NHWC against cuDNN's 5.7, resnext50's 7x7 fp32 35.7 against 17.0
 * (H100, bench/gpu/NOTES.md round 23). The work is small (11-118 M FMAs); what costs is the
 * launch, a copy and a tile's set-up.
 *
 * Threads walk their items with the channel chunk fastest in NHWC (a pixel's threads store
 * adjacent 16- or 32-byte runs) and the pixel pair fastest in NCHW (a warp stores runs of its
 * channels' rows, and reads the same weights).
 */
#include "gpu_internal.h"

#define ST_THREADS 128 /* 2-3 blocks an SM on the stems: an even spread over the SMs */
#define ST_KT      8   /* output channels per thread */
#define ST_PX      2   /* adjacent output pixels of a row per thread */
#define ST_CMAX    4   /* input channels the kernel takes */
#define ST_SMEM    (48 * 1024)

/* KS: the filter's width when compiled for it (3 or 7, with 3 channels: the stems), so that a
 * filter row's input loads issue together; 0 loops over g.s at run time. */
template <class DT, int NHWC, int CC, int KS>
__global__ void __launch_bounds__(ST_THREADS)
    stem_kernel(const struct gpu_geom g, const struct gpu_batch b, int pairs, int kchunks,
                int items)
{
    convd_grid_dependency();
    typedef typename DT::T T;
    extern __shared__ float st_w[]; /* [r][s][c][k] */
    const int prob = blockIdx.z;
    const T *x = (const T *)b.x[prob];
    const T *w = (const T *)b.w[prob];
    const T *bias = (const T *)b.b[prob];
    T *y = (T *)b.y[prob];

    const int taps = g.r * g.s, nw = taps * CC * g.k;
    /* Read in the weights' own order (coalesced; every block reads them all), scattered into
     * [tap][c][k]. NHWC weights are [K][R][S][C], NCHW ones [K][C][R][S]. */
    for (int e = (int)threadIdx.x; e < nw; e += ST_THREADS) {
        const int k = e / (taps * CC), rest = e - k * (taps * CC);
        const int tap = NHWC ? rest / CC : rest % taps, c = NHWC ? rest % CC : rest / taps;
        st_w[(tap * CC + c) * g.k + k] = DT::load(w[e]);
    }
    __syncthreads();

    const int i = (int)(blockIdx.x * ST_THREADS + threadIdx.x);
    if (i >= items)
        return;
    int kc, q, oh, n;
    if (NHWC) {
        kc = i % kchunks;
        int t = i / kchunks;
        q = t % pairs;
        t /= pairs;
        oh = t % g.ho;
        n = t / g.ho;
    } else {
        q = i % pairs;
        int t = i / pairs;
        oh = t % g.ho;
        t /= g.ho;
        kc = t % kchunks;
        n = t / kchunks;
    }
    const int k0 = kc * ST_KT, ow0 = q * ST_PX;

    float acc[ST_PX][ST_KT];
#pragma unroll
    for (int px = 0; px < ST_PX; px++)
#pragma unroll
        for (int k = 0; k < ST_KT; k++)
            acc[px][k] = 0.0f;

    for (int r = 0; r < g.r; r++) {
        const int ih = convd_math_in_coord(oh, r, g.sh, g.pt, g.dh);
        if (!convd_math_inside(ih, g.h))
            continue;
        const int ns = KS > 0 ? KS : g.s;
#pragma unroll
        for (int s = 0; s < ns; s++) {
            float xv[ST_PX][CC];
#pragma unroll
            for (int px = 0; px < ST_PX; px++) {
                const int iw = convd_math_in_coord(ow0 + px, s, g.sw, g.pl, g.dw);
                const bool in = convd_math_inside(iw, g.w) && ow0 + px < g.wo;
#pragma unroll
                for (int c = 0; c < CC; c++) {
                    const int xi = NHWC ? ((n * g.h + ih) * g.w + iw) * CC + c
                                        : ((n * CC + c) * g.h + ih) * g.w + iw;
                    xv[px][c] = in ? DT::load(x[xi]) : 0.0f;
                }
            }
            const float *wt = st_w + ((r * ns + s) * CC) * g.k + k0;
#pragma unroll
            for (int c = 0; c < CC; c++) {
                const float4 w0 = *(const float4 *)(wt + c * g.k);
                const float4 w1 = *(const float4 *)(wt + c * g.k + 4);
                const float wv[ST_KT] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
                for (int px = 0; px < ST_PX; px++)
#pragma unroll
                    for (int k = 0; k < ST_KT; k++)
                        acc[px][k] = fmaf(xv[px][c], wv[k], acc[px][k]);
            }
        }
    }

    float bv[ST_KT];
#pragma unroll
    for (int k = 0; k < ST_KT; k++)
        bv[k] = g.bias ? DT::load(bias[k0 + k]) : 0.0f;
#pragma unroll
    for (int px = 0; px < ST_PX; px++) {
        const int ow = ow0 + px;
        if (ow >= g.wo)
            break;
        float v[ST_KT];
#pragma unroll
        for (int k = 0; k < ST_KT; k++)
            v[k] = gpu_epilogue(acc[px][k], bv[k], g);
        if (NHWC) {
            /* K % 8 == 0 and 16-byte aligned tensors: both runs of 4 are aligned. */
            T *yp = y + ((size_t)(n * g.ho + oh) * g.wo + ow) * g.k + k0;
            gpu_store4<DT>(yp, v);
            gpu_store4<DT>(yp + 4, v + 4);
        } else {
            const size_t plane = (size_t)g.ho * g.wo;
            T *yp = y + ((size_t)n * g.k + k0) * plane + (size_t)oh * g.wo + ow;
#pragma unroll
            for (int k = 0; k < ST_KT; k++)
                yp[k * plane] = DT::store(v[k]);
        }
    }
}

int gpu_stem_applies(const struct convd_problem *p)
{
    return p->groups == 1 && p->c <= ST_CMAX && p->k % ST_KT == 0 &&
           (size_t)p->r * p->s * p->c * p->k * sizeof(float) <= ST_SMEM;
}

int gpu_stem_plan_make(const struct convd_problem *p, struct gpu_stem_plan *ret, char *why,
                       size_t why_len)
{
    if (!gpu_stem_applies(p)) {
        snprintf(why, why_len,
                 "fma stem: only dense problems of at most %d input channels with K a multiple "
                 "of %d and fp32 weights within %d KB",
                 ST_CMAX, ST_KT, ST_SMEM / 1024);
        return CONVD_EUNSUPPORTED;
    }
    struct gpu_stem_plan pl;
    memset(&pl, 0, sizeof(pl));
    gpu_geom_from_problem(p, &pl.g);
    pl.dtype = p->dtype;
    pl.layout = p->layout;
    pl.pairs = (pl.g.wo + ST_PX - 1) / ST_PX;
    pl.kchunks = pl.g.k / ST_KT;
    const int64_t items = (int64_t)pl.g.n * pl.g.ho * pl.pairs * pl.kchunks;
    if (items > INT32_MAX - ST_THREADS) {
        snprintf(why, why_len, "fma stem: %lld work items do not fit its index", (long long)items);
        return CONVD_EUNSUPPORTED;
    }
    pl.items = (int)items;
    pl.threads = ST_THREADS;
    pl.blocks = (pl.items + ST_THREADS - 1) / ST_THREADS;
    pl.smem = pl.g.r * pl.g.s * pl.g.c * pl.g.k * (int)sizeof(float);
    *ret = pl;
    return 0;
}

template <class DT, int NHWC>
static int stem_launch_c(const struct gpu_stem_plan *pl, const struct gpu_batch *b, int count,
                         const struct gpu_launch *ln)
{
    const dim3 grid((unsigned)pl->blocks, 1, (unsigned)count);
#define ST_GO(CC, KS)                                                                              \
    GPU_LAUNCH((stem_kernel<DT, NHWC, CC, KS>), grid, dim3(ST_THREADS), (size_t)pl->smem, ln,      \
               pl->g, *b, pl->pairs, pl->kchunks, pl->items)
    switch (pl->g.c) {
    case 1:
        ST_GO(1, 0);
        break;
    case 2:
        ST_GO(2, 0);
        break;
    case 3:
        if (pl->g.s == 3)
            ST_GO(3, 3);
        else if (pl->g.s == 7)
            ST_GO(3, 7);
        else
            ST_GO(3, 0);
        break;
    case 4:
        ST_GO(4, 0);
        break;
    default:
        return CONVD_EINVAL;
    }
#undef ST_GO
    CONVD_GPU_CHECK(hipGetLastError());
    return 0;
}

template <class DT>
static int stem_launch_dt(const struct gpu_stem_plan *pl, const struct gpu_batch *b, int count,
                          const struct gpu_launch *ln)
{
    if (pl->layout == CONVD_LAYOUT_NHWC)
        return stem_launch_c<DT, 1>(pl, b, count, ln);
    return stem_launch_c<DT, 0>(pl, b, count, ln);
}

int gpu_stem_launch(const struct gpu_stem_plan *pl, const struct gpu_batch *b, int count,
                    const struct gpu_launch *ln)
{
    switch (pl->dtype) {
    case CONVD_DTYPE_FP32:
        return stem_launch_dt<dt_f32>(pl, b, count, ln);
    case CONVD_DTYPE_FP16:
        return stem_launch_dt<dt_f16>(pl, b, count, ln);
    case CONVD_DTYPE_BF16:
        return stem_launch_dt<dt_bf16>(pl, b, count, ln);
    }
    return CONVD_EINVAL;
}
