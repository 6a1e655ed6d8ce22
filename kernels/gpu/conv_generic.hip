/*
 * The generic kernel: one thread per output element, straight from the definition in conv.h,
 * for either layout and any dtype. It takes every valid problem (the router's last resort, and
 * the path for tensors that are not 16-byte aligned); it is correct rather than fast.
 */
#include "gpu_internal.h"

template <class DT, int NHWC>
__global__ void __launch_bounds__(256)
    generic_kernel(const struct gpu_geom g, const struct gpu_batch b, int64_t total)
{
    convd_grid_dependency();
    typedef typename DT::T T;
    const int prob = blockIdx.z;
    const T *x = (const T *)b.x[prob];
    const T *w = (const T *)b.w[prob];
    const T *bias = (const T *)b.b[prob];
    T *y = (T *)b.y[prob];

    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int k, oh, ow, n;
        int64_t t = i;
        if (NHWC) {
            k = (int)(t % g.k);
            t /= g.k;
            ow = (int)(t % g.wo);
            t /= g.wo;
            oh = (int)(t % g.ho);
            n = (int)(t / g.ho);
        } else {
            ow = (int)(t % g.wo);
            t /= g.wo;
            oh = (int)(t % g.ho);
            t /= g.ho;
            k = (int)(t % g.k);
            n = (int)(t / g.k);
        }
        const int grp = k / g.kpg;
        float acc = 0.0f;
        for (int c = 0; c < g.cpg; c++) {
            const int ci = grp * g.cpg + c;
            for (int r = 0; r < g.r; r++) {
                const int ih = convd_math_in_coord(oh, r, g.sh, g.pt, g.dh);
                if (!convd_math_inside(ih, g.h))
                    continue;
                for (int s = 0; s < g.s; s++) {
                    const int iw = convd_math_in_coord(ow, s, g.sw, g.pl, g.dw);
                    if (!convd_math_inside(iw, g.w))
                        continue;
                    int xi, wi;
                    if (NHWC) {
                        xi = ((n * g.h + ih) * g.w + iw) * g.c + ci;
                        wi = ((k * g.r + r) * g.s + s) * g.cpg + c;
                    } else {
                        xi = ((n * g.c + ci) * g.h + ih) * g.w + iw;
                        wi = ((k * g.cpg + c) * g.r + r) * g.s + s;
                    }
                    acc = fmaf(DT::load(x[xi]), DT::load(w[wi]), acc);
                }
            }
        }
        const float bv = g.bias ? DT::load(bias[k]) : 0.0f;
        y[i] = DT::store(gpu_epilogue(acc, bv, g));
    }
}

int gpu_generic_plan_make(const struct convd_problem *p, struct gpu_generic_plan *ret)
{
    gpu_geom_from_problem(p, &ret->g);
    ret->dtype = p->dtype;
    ret->layout = p->layout;
    return 0;
}

template <class DT>
static int generic_launch_dt(const struct gpu_generic_plan *pl, const struct gpu_batch *b,
                             int count, const struct gpu_launch *ln)
{
    const struct gpu_geom *g = &pl->g;
    const int64_t total = (int64_t)g->n * g->k * g->ho * g->wo;
    int64_t blocks = (total + 255) / 256;
    if (blocks > 65536)
        blocks = 65536;
    dim3 grid((unsigned)blocks, 1, (unsigned)count);
    if (pl->layout == CONVD_LAYOUT_NHWC)
        GPU_LAUNCH((generic_kernel<DT, 1>), grid, dim3(256), 0, ln, *g, *b, total);
    else
        GPU_LAUNCH((generic_kernel<DT, 0>), grid, dim3(256), 0, ln, *g, *b, total);
    CONVD_GPU_CHECK(hipGetLastError());
    return 0;
}

int gpu_generic_launch(const struct gpu_generic_plan *pl, const struct gpu_batch *b, int count,
                       const struct gpu_launch *ln)
{
    switch (pl->dtype) {
    case CONVD_DTYPE_FP32:
        return generic_launch_dt<dt_f32>(pl, b, count, ln);
    case CONVD_DTYPE_FP16:
        return generic_launch_dt<dt_f16>(pl, b, count, ln);
    case CONVD_DTYPE_BF16:
        return generic_launch_dt<dt_bf16>(pl, b, count, ln);
    }
    return CONVD_EINVAL;
}
