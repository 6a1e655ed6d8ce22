/*
 * Matrix-vector products on the FMA units: 1x1 filters with a 1x1 output and no padding (the
 * squeeze-excitation 1x1s and classifier heads, after a global pool), a few images at a time.
 * Each output reads one input pixel of its group, so the problem is, per image and group,
 *
 *   y[n][g * kpg + j] = sum over c < cpg of w[g * kpg + j][c] * x(n, pixel (0, 0), g * cpg + c),
 *
 * a few thousand multiply-adds where the implicit GEMM staged tiles of 32+ pixels through shared
 * memory for one pixel (rgy400b1_15, 26 -> 104: 5.6 us against cuDNN's 3.3). Here `lanes`
 * threads share one output: each reads every lanes-th channel of the output's weight row
 * (contiguous in either layout, since R = S = 1) and of the input pixel, and a shuffle sums
 * them. No shared memory, no synchronisation: the time is a launch and one round of loads.
 * The output tensor of a 1x1 image is [N][K] in either layout.
 */
#include "gpu_internal.h"

#define GV_THREADS 256

/* Sum over `width` consecutive lanes (a power of two up to 32), each of which ends with it. */
GPU_D float gv_lane_sum(float v, int width)
{
    for (int o = width / 2; o > 0; o /= 2)
#if defined(CONVD_GPU_NVIDIA)
        v += __shfl_xor_sync(0xffffffffu, v, o, width);
#else
        v += __shfl_xor(v, o, width);
#endif
    return v;
}

template <class DT, int NHWC>
__global__ void __launch_bounds__(GV_THREADS)
    gemv_kernel(const struct gpu_geom g, const struct gpu_batch b, int lanes, int outputs)
{
    convd_grid_dependency();
    typedef typename DT::T T;
    const int prob = blockIdx.z;
    const T *x = (const T *)b.x[prob];
    const T *w = (const T *)b.w[prob];
    const T *bias = (const T *)b.b[prob];
    T *y = (T *)b.y[prob];
    const int per_block = GV_THREADS / lanes;
    const int o = blockIdx.x * per_block + (int)threadIdx.x / lanes;
    const int lane = (int)threadIdx.x % lanes;
    /* Every lane of a group reaches the shuffle: outputs past the end compute nothing. */
    const bool valid = o < outputs;
    const int n = valid ? o / g.k : 0, k = valid ? o % g.k : 0;
    const int c0 = (k / g.kpg) * g.cpg;
    const int64_t plane = (int64_t)g.h * g.w;
    float acc = 0.0f;
    if (valid) {
        const T *wr = w + (int64_t)k * g.cpg;
        if (NHWC) {
            const T *xp = x + (int64_t)n * plane * g.c + c0;
            for (int c = lane; c < g.cpg; c += lanes)
                acc = fmaf(DT::load(xp[c]), DT::load(wr[c]), acc);
        } else {
            const T *xp = x + ((int64_t)n * g.c + c0) * plane;
            for (int c = lane; c < g.cpg; c += lanes)
                acc = fmaf(DT::load(xp[(int64_t)c * plane]), DT::load(wr[c]), acc);
        }
    }
    acc = gv_lane_sum(acc, lanes);
    if (valid && lane == 0)
        y[o] = DT::store(gpu_epilogue(acc, g.bias ? DT::load(bias[k]) : 0.0f, g));
}

int gpu_gemv_applies(const struct convd_problem *p)
{
    return p->r == 1 && p->s == 1 && p->pad_top == 0 && p->pad_left == 0 &&
           convd_out_dim(p->h, p->pad_top, p->pad_bottom, p->r, p->stride_h, p->dil_h) == 1 &&
           convd_out_dim(p->w, p->pad_left, p->pad_right, p->s, p->stride_w, p->dil_w) == 1;
}

int gpu_gemv_plan_make(const struct convd_problem *p, struct gpu_gemv_plan *ret, char *why,
                       size_t why_len)
{
    if (!gpu_gemv_applies(p)) {
        snprintf(why, why_len, "fma gemv: only 1x1 filters with a 1x1 output and no padding");
        return CONVD_EUNSUPPORTED;
    }
    struct gpu_gemv_plan pl;
    memset(&pl, 0, sizeof(pl));
    gpu_geom_from_problem(p, &pl.g);
    pl.dtype = p->dtype;
    pl.layout = p->layout;
    /* Lanes per output: about four channels each, from 1 (cpg <= 4) to a warp (cpg > 64). */
    int lanes = 1;
    while (lanes < 32 && lanes * 4 < pl.g.cpg)
        lanes *= 2;
    pl.lanes = lanes;
    pl.outputs = pl.g.n * pl.g.k;
    pl.blocks = (pl.outputs + GV_THREADS / lanes - 1) / (GV_THREADS / lanes);
    pl.threads = GV_THREADS;
    *ret = pl;
    return 0;
}

template <class DT>
static int gemv_launch_dt(const struct gpu_gemv_plan *pl, const struct gpu_batch *b, int count,
                          const struct gpu_launch *ln)
{
    const dim3 grid((unsigned)pl->blocks, 1, (unsigned)count);
    if (pl->layout == CONVD_LAYOUT_NHWC)
        GPU_LAUNCH((gemv_kernel<DT, 1>), grid, dim3(GV_THREADS), 0, ln, pl->g, *b, pl->lanes,
                   pl->outputs);
    else
        GPU_LAUNCH((gemv_kernel<DT, 0>), grid, dim3(GV_THREADS), 0, ln, pl->g, *b, pl->lanes,
                   pl->outputs);
    CONVD_GPU_CHECK(hipGetLastError());
    return 0;
}

int gpu_gemv_launch(const struct gpu_gemv_plan *pl, const struct gpu_batch *b, int count,
                    const struct gpu_launch *ln)
{
    switch (pl->dtype) {
    case CONVD_DTYPE_FP32:
        return gemv_launch_dt<dt_f32>(pl, b, count, ln);
    case CONVD_DTYPE_FP16:
        return gemv_launch_dt<dt_f16>(pl, b, count, ln);
    case CONVD_DTYPE_BF16:
        return gemv_launch_dt<dt_bf16>(pl, b, count, ln);
    }
    return CONVD_EINVAL;
}
