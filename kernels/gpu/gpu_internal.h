/*
 * Shared by the HIP sources of the kernel library (C++ only): the geometry and pointer batch the
 * kernels take as parameters, dtype traits for loads and rounding stores, the per-family plan
 * and launch entry points, and the device-limit cache.
 */
#ifndef CONVD_GPU_INTERNAL_H
#define CONVD_GPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "vendor.h"
#include "convd_kernels.h"
#include "conv_math.h"
#include "gpu_kernels.h"

#define GPU_HD __host__ __device__ __forceinline__
#define GPU_D  __device__ __forceinline__

/* How one launch goes: its stream, and whether it asks for programmatic stream serialization
 * (pdl): the kernel's blocks may start while the previous kernel in the stream finishes, and
 * every kernel of ours begins with convd_grid_dependency(), which waits for that kernel (memory
 * included) before anything else. What overlaps is the launch and the block scheduling. The
 * caller decides pdl from its policy and from the code the device runs (gpu_launch_for). */
struct gpu_launch {
    hipStream_t stream;
    int pdl;
};

#if defined(CONVD_GPU_NVIDIA)
template <typename... KArgs, typename... Args>
static inline void convd_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t shmem,
                                const struct gpu_launch *ln, Args &&...args)
{
    cudaLaunchConfig_t lc = {};
    lc.gridDim = grid;
    lc.blockDim = block;
    lc.dynamicSmemBytes = shmem;
    lc.stream = ln->stream;
    cudaLaunchAttribute at[1] = {};
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    lc.attrs = at;
    lc.numAttrs = ln->pdl ? 1 : 0;
    (void)cudaLaunchKernelEx(&lc, kernel, static_cast<Args &&>(args)...);
}
/* Every kernel launch of the library. An error is left for the caller's hipGetLastError(). */
#define GPU_LAUNCH(kernel, grid, block, shmem, ln, ...)                                            \
    convd_launch((kernel), dim3(grid), dim3(block), (size_t)(shmem), (ln), __VA_ARGS__)
#else
#define GPU_LAUNCH(kernel, grid, block, shmem, ln, ...)                                            \
    hipLaunchKernelGGL((kernel), dim3(grid), dim3(block), (shmem), (ln)->stream, __VA_ARGS__)
#endif

/* The problem as the kernels see it: everything int32 (convd_gpu_family_check() refuses tensors
 * of 2^31 elements or more, so every index below fits). */
struct gpu_geom {
    int n, h, w, c, k, r, s, g, cpg, kpg, ho, wo;
    int sh, sw, pt, pl, dh, dw;
    int bias, act; /* has a bias; a clamp to [act_lo, act_hi] (ReLU: [0, inf)) */
    float act_lo, act_hi;
};

/* Tensors of up to CONVD_GPU_BATCH_MAX problems of one geometry: blockIdx.z (or the work item)
 * picks the problem. Kernel parameters, so no device-side table is needed. */
struct gpu_batch {
    const void *x[CONVD_GPU_BATCH_MAX];
    const void *w[CONVD_GPU_BATCH_MAX];
    const void *b[CONVD_GPU_BATCH_MAX];
    void *y[CONVD_GPU_BATCH_MAX];
    /* Per problem, the workspace a plan's own kernels use (the FMA GEMM's split-K partial sums);
     * NULL where it has none. */
    void *ws[CONVD_GPU_BATCH_MAX];
};

/* dtype traits. Storage types are plain integers for the 16-bit formats so that nothing depends
 * on the vendor's half types; conversions round to nearest even. */
struct dt_f32 {
    typedef float T;
    static const int id = CONVD_DTYPE_FP32;
    static GPU_D float load(T v)
    {
        return v;
    }
    static GPU_D T store(float f)
    {
        return f;
    }
};

struct dt_f16 {
    typedef uint16_t T;
    static const int id = CONVD_DTYPE_FP16;
    static GPU_D float load(T v)
    {
#if defined(CONVD_GPU_NVIDIA)
        return __half2float(__ushort_as_half(v));
#else
        return (float)__builtin_bit_cast(_Float16, v);
#endif
    }
    static GPU_D T store(float f)
    {
#if defined(CONVD_GPU_NVIDIA)
        return __half_as_ushort(__float2half_rn(f));
#else
        return __builtin_bit_cast(uint16_t, (_Float16)f);
#endif
    }
    /* Two values rounded as store() does, lo in the low half: one conversion instruction. */
    static GPU_D uint32_t store2(float lo, float hi)
    {
#if defined(CONVD_GPU_NVIDIA)
        const __half2 h = __floats2half2_rn(lo, hi);
        return *(const uint32_t *)&h;
#else
        return (uint32_t)store(lo) | (uint32_t)store(hi) << 16;
#endif
    }
};

struct dt_bf16 {
    typedef uint16_t T;
    static const int id = CONVD_DTYPE_BF16;
    static GPU_D float load(T v)
    {
        return __uint_as_float((uint32_t)v << 16);
    }
    /* NVIDIA sm_80 and later convert in hardware (cvt.rn: round to nearest even, NaN to the
     * canonical quiet NaN); elsewhere the same rounding in integer arithmetic, about six
     * instructions a value. */
    static GPU_D T store(float f)
    {
#if defined(CONVD_DEVICE_SM80)
        uint16_t r;
        asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(r) : "f"(f));
        return r;
#else
        uint32_t u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            return (T)((u >> 16) | 0x40u); /* quiet NaN stays NaN */
        u += 0x7fffu + ((u >> 16) & 1u);
        return (T)(u >> 16);
#endif
    }
    static GPU_D uint32_t store2(float lo, float hi)
    {
#if defined(CONVD_DEVICE_SM80)
        uint32_t r; /* the first source goes to the upper half */
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
#else
        return (uint32_t)store(lo) | (uint32_t)store(hi) << 16;
#endif
    }
};

/* Four adjacent elements as loaded: one 8-byte (16-bit types) or 16-byte (fp32) vector, zeros
 * when !valid (p must be aligned to that size), and its values as fp32. Kernels that load a
 * chunk early and convert it later (prefetch) keep the vector; gpu_load4 does both at once. */
template <int ES> struct gpu_chunk4;
template <> struct gpu_chunk4<4> {
    typedef float4 V;
    static GPU_D V load(const void *p, bool valid)
    {
        return valid ? *(const float4 *)p : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    template <class DT> static GPU_D void to_f32(const V &u, float *v)
    {
        v[0] = u.x;
        v[1] = u.y;
        v[2] = u.z;
        v[3] = u.w;
    }
};
template <> struct gpu_chunk4<2> {
    typedef uint2 V;
    static GPU_D V load(const void *p, bool valid)
    {
        return valid ? *(const uint2 *)p : make_uint2(0u, 0u);
    }
    template <class DT> static GPU_D void to_f32(const V &u, float *v)
    {
        v[0] = DT::load((uint16_t)(u.x & 0xffffu));
        v[1] = DT::load((uint16_t)(u.x >> 16));
        v[2] = DT::load((uint16_t)(u.y & 0xffffu));
        v[3] = DT::load((uint16_t)(u.y >> 16));
    }
};

template <class DT> GPU_D void gpu_load4(const typename DT::T *p, bool valid, float *v)
{
    typedef gpu_chunk4<sizeof(typename DT::T)> C;
    C::template to_f32<DT>(C::load(p, valid), v);
}

/* Four adjacent elements from fp32, rounded to the storage type, as one 8-byte (16-bit types) or
 * 16-byte (fp32) store: p must be aligned to that size. */
template <class DT> GPU_D void gpu_store4(typename DT::T *p, const float *v)
{
    if constexpr (sizeof(typename DT::T) == 4)
        *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
    else
        *(uint2 *)p = make_uint2(DT::store2(v[0], v[1]), DT::store2(v[2], v[3]));
}

#include "gpu_async.h"

/* The activations the kernels' epilogue applies: ReLU and clamp, as a clamp (two selects,
 * bounds from the kernel's parameters). The others (hardswish, SiLU, GELU) run as a pass of
 * their own over the output (gpu_act_launch): inlined into every kernel, even hardswish's few
 * multiplies changed register allocation and made kernels spill that did not. */
GPU_HD int gpu_act_inline(int act)
{
    return act == CONVD_ACT_NONE || act == CONVD_ACT_RELU || act == CONVD_ACT_CLAMP;
}

/* Epilogue shared by every family: bias, then the clamp (NaN stays NaN, as in PyTorch). */
GPU_D float gpu_epilogue(float acc, float bias, const gpu_geom &g)
{
    acc += bias;
    if (g.act) {
        acc = acc < g.act_lo ? g.act_lo : acc;
        acc = acc > g.act_hi ? g.act_hi : acc;
    }
    return acc;
}

/*
 * A flat index walked with a fixed stride and kept decoded as (hi, mid, lo) with lo < nlo and
 * mid < nmid: the decode costs divisions once, every step only adds and carries. Loops over
 * halo pixels and output pixels use it instead of dividing per element.
 */
struct gpu_walk {
    int hi, mid, lo;
    int shi, smid, slo;
};

/* Divisions for gpu_walk_init: the '/' operator, or a divisor made on the host. */
struct gpu_div_plain {
    int d;
    GPU_D int div(int x) const
    {
        return x / d;
    }
};
struct gpu_div_fast {
    struct convd_math_fdiv f;
    GPU_D int div(int x) const
    {
        return (int)convd_math_fdiv_div((uint32_t)x, f);
    }
};

/* start, step >= 0; by_plane divides by nmid * nlo, by_lo by nlo. */
template <class D>
GPU_D void gpu_walk_init_by(struct gpu_walk *w, int start, int step, int nmid, int nlo, D by_plane,
                            D by_lo)
{
    const int plane = nmid * nlo;
    w->hi = by_plane.div(start);
    const int r = start - w->hi * plane;
    w->mid = by_lo.div(r);
    w->lo = r - w->mid * nlo;
    w->shi = by_plane.div(step);
    const int sr = step - w->shi * plane;
    w->smid = by_lo.div(sr);
    w->slo = sr - w->smid * nlo;
}

GPU_D void gpu_walk_init(struct gpu_walk *w, int start, int step, int nmid, int nlo)
{
    gpu_walk_init_by(w, start, step, nmid, nlo, gpu_div_plain{nmid * nlo}, gpu_div_plain{nlo});
}

GPU_D void gpu_walk_step(struct gpu_walk *w, int nmid, int nlo)
{
    w->lo += w->slo;
    w->mid += w->smid;
    w->hi += w->shi;
    if (w->lo >= nlo) {
        w->lo -= nlo;
        w->mid++;
    }
    if (w->mid >= nmid) {
        w->mid -= nmid;
        w->hi++;
    }
}

/* Device limits, read once per device. */
/* Rates the planners' cost models charge, per second: the tensor cores' effective fp16 rate on
 * the mma kernel (flops), L2 traffic, shared-memory fragment reads and NCHW output writes
 * (bytes). Per architecture from gpu_rate_table (gpu_api.hip), scaled by the device's SM count
 * and clock against the table's reference device. The planners compare costs of one problem on
 * one device, so what steers them is the ratios between the four. */
struct gpu_rates {
    double mma, l2, lds, nchw_write;
};

struct gpu_device_info {
    int sm_count;
    int smem_optin; /* most dynamic shared memory one block may ask for */
    int smem_per_sm;
    int cc_major; /* compute capability (NVIDIA) or GCN major (AMD) */
    /* NVIDIA: the architecture the running code was built for, as the runtime reports it
     * (80 for compute_80 PTX, even on an sm_90 device); what the kernels may use is bounded by
     * it, not by cc_major. 0 on AMD. */
    int code_cc;
    int cc_minor, clock_khz; /* clock_khz 0 when the runtime does not say */
    struct gpu_rates rate;
};
int gpu_device_info_get(struct gpu_device_info *ret);

/* Copies the problem into the kernels' geometry. The problem must be valid. */
void gpu_geom_from_problem(const struct convd_problem *p, struct gpu_geom *g);

/* Raises a kernel's dynamic shared-memory limit once (thread-safe, idempotent). */
int gpu_allow_smem(const void *kernel, int bytes);

/*
 * Families. Each has a plan (host-side choice of tiles; 0 or CONVD_EUNSUPPORTED with a reason)
 * and a launch that runs `count` <= CONVD_GPU_BATCH_MAX problems of the plan's geometry.
 */
struct gpu_dw_plan {
    struct gpu_geom g;
    int dtype, layout;
    int vec;    /* NHWC: channels per thread vector */
    int unit;   /* stride_w == 1 && dil_w == 1: sliding-window reuse */
    int cvb;    /* NHWC: channel vectors per block */
    int strips; /* NHWC: output strips per block; NCHW: rows per block */
    int threads;
    int blocks_per_problem;
    int smem;
    int tiles_h;          /* NCHW: row tiles per plane */
    int in_rows, in_cols; /* shared-memory input rows, padded row length (NHWC: halo) */
    int tw, p, tiles_w;   /* NHWC: tile width, outputs per strip, tiles along W */
    int direct;           /* direct kernel: 1 + its shape (0: not direct); vec = channels per
                             thread, cvb = channel vectors per row (NHWC) or column groups (NCHW),
                             strips = rows per band, p = columns per thread, tiles_h = bands */
    int grid_y;           /* direct kernel: grid height (1 for a flat grid) */
    int planes;           /* NCHW tiled: whole planes per block (0: one plane, tiles of rows) */
};
int gpu_dw_plan_make(const struct convd_problem *p, const struct convd_gpu_policy *pol,
                     struct gpu_dw_plan *ret, char *why, size_t why_len);
int gpu_dw_launch(const struct gpu_dw_plan *pl, const struct gpu_batch *b, int count,
                  const struct gpu_launch *ln);

/* Grouped direct NCHW kernel (conv_direct.hip): the "direct" family. */
struct gpu_gd_plan {
    struct gpu_geom g;
    int dtype;
    int kt, ktiles; /* outputs per thread (divides kpg), output tiles per group */
    int th;         /* output rows per thread */
    int cgs, bands; /* 4-column groups per row, row bands per plane */
    int planes;     /* (image, group, output tile) planes: grid x */
    int grid_y;     /* blocks per plane */
    int threads, smem;
    int prefetch; /* next input plane's window loaded while this one is multiplied */
};
int gpu_gd_plan_make(const struct convd_problem *p, const struct convd_gpu_policy *pol,
                     struct gpu_gd_plan *ret, char *why, size_t why_len);
int gpu_gd_launch(const struct gpu_gd_plan *pl, const struct gpu_batch *b, int count,
                  const struct gpu_launch *ln);

/* Implicit GEMM on the FMA units (conv_fma_gemm.hip): part of the fma family. */
struct gpu_pw_plan {
    struct gpu_geom g;
    int dtype, layout;
    int tch, tpx;       /* tile: outputs x pixels */
    int ctiles, ptiles; /* output tiles per group, pixel tiles (NCHW: per image) */
    int threads, smem;
    int vec_out;  /* outputs leave as 4-element runs */
    int vec_in;   /* operands arrive as 4-element loads */
    int out_nchw; /* NHWC input (transposed copies of an NCHW problem), NCHW output */
    int tf32;     /* TF32 tensor-core tiles (fp32 problems that allow it) */
    /* Split K (policy fma_split_k): ksplit blocks share each tile, each kchunk K elements (a
     * multiple of PW_KC); their fp32 partial sums go to the problem's workspace,
     * [ksplit][N*Ho*Wo][K], and a second kernel adds them and applies the epilogue. 1: no split. */
    int ksplit, kchunk;
};
/* Whether the implicit GEMM takes p's shape (1x1 unit stride; NHWC cpg % 4 == 0, kpg >= 24)
 * and pol does not switch it off; its planner may still refuse a grid that would not fill the
 * GPU. */
int gpu_pw_applies(const struct convd_problem *p, const struct convd_gpu_policy *pol);
/* tf32: TF32 tiles (p fp32 with allow_tf32, NVIDIA sm_80+, the shape as above whatever
 * pol->fma_gemm says), or a refusal. ws_avail: workspace bytes per problem the plan may use for
 * split-K partial sums (0: none, no split). */
int gpu_pw_plan_make(const struct convd_problem *p, int out_nchw, int tf32,
                     const struct convd_gpu_policy *pol, size_t ws_avail, struct gpu_pw_plan *ret,
                     char *why, size_t why_len);
int gpu_pw_launch(const struct gpu_pw_plan *pl, const struct gpu_batch *b, int count,
                  const struct gpu_launch *ln);

/* Matrix-vector products on the FMA units (conv_gemv.hip): part of the fma family. */
struct gpu_gemv_plan {
    struct gpu_geom g;
    int dtype, layout;
    int lanes;   /* threads per output, a power of two up to 32 */
    int outputs; /* N * K */
    int blocks, threads;
};
/* Whether p is a matrix-vector product per image: a 1x1 filter, a 1x1 output, no padding. */
int gpu_gemv_applies(const struct convd_problem *p);
int gpu_gemv_plan_make(const struct convd_problem *p, struct gpu_gemv_plan *ret, char *why,
                       size_t why_len);
int gpu_gemv_launch(const struct gpu_gemv_plan *pl, const struct gpu_batch *b, int count,
                    const struct gpu_launch *ln);

/* Dense problems of a few input channels (network stems) on the FMA units (conv_stem.hip): part
 * of the fma family. */
struct gpu_stem_plan {
    struct gpu_geom g;
    int dtype, layout;
    int pairs;   /* output pixel pairs per row */
    int kchunks; /* K / 8 */
    int items;   /* threads with work: N * Ho * pairs * kchunks */
    int blocks, threads, smem;
};
/* Whether the stem kernel takes p: groups 1, C <= 4, K % 8 == 0, its weights within 48 KB. */
int gpu_stem_applies(const struct convd_problem *p);
int gpu_stem_plan_make(const struct convd_problem *p, struct gpu_stem_plan *ret, char *why,
                       size_t why_len);
int gpu_stem_launch(const struct gpu_stem_plan *pl, const struct gpu_batch *b, int count,
                    const struct gpu_launch *ln);

struct gpu_fma_plan {
    struct gpu_geom g;
    int dtype, layout;
    int tn;     /* output channels per thread (divides kpg) */
    int ks;     /* exact register-window width (1, 3, 5, 7), 0: generic loop */
    int nch;    /* output-channel chunks (threads along N) per block */
    int bn;     /* output channels per block: nch * tn */
    int gpb;    /* groups per block (>= 1); 0 when the block covers part of one group */
    int nsplit; /* blocks per group when kpg > bn */
    int nblk;   /* n-blocks per problem */
    int sx, th; /* strips per tile row, tile rows */
    int tiles_w, tiles_h, tiles;
    int ih, iw; /* halo tile */
    int kc;     /* channels per group per chunk */
    int nchunks;
    int cbc;  /* halo channels per pixel (all groups of the block, one chunk) */
    int ps;   /* halo pixel stride in floats */
    int bnp;  /* weight row length in floats (bn padded) */
    int rpx;  /* halo row pitch in pixels (>= iw) */
    int smap; /* thread mapping: 1 strip-major (t % strips), 0 chunk-major (t % nch) */
    int threads, smem;
    int out_nchw;
    int gemm; /* run on the implicit-GEMM kernel with plan pw (the fields above unused) */
    struct gpu_pw_plan pw;
    int gemv; /* run on the matrix-vector kernel with plan gv (the fields above unused) */
    struct gpu_gemv_plan gv;
    int stem; /* run on the stem kernel with plan st (the fields above unused) */
    struct gpu_stem_plan st;
};
/* out_nchw: p is the NHWC view of an NCHW problem whose input and weights were transposed into
 * the workspace; the kernel writes the output in NCHW. Problems the implicit GEMM takes
 * (gpu_pw_applies and its planner) run on gpu_pw_*: NCHW pointwise ones natively, other NCHW
 * ones on the transposed copies with the GEMM's NCHW epilogue. */
/* kernel: GPU_FMA_ANY (the implicit GEMM where it applies and its planner takes the problem,
 * else the direct kernel), GPU_FMA_GEMM, GPU_FMA_TF32 or GPU_FMA_DIRECT (that kernel or
 * nothing). */
#define GPU_FMA_ANY    0
#define GPU_FMA_GEMM   1
#define GPU_FMA_DIRECT 2
#define GPU_FMA_TF32   3 /* the implicit GEMM's TF32 tiles or nothing */
#define GPU_FMA_GEMV   4 /* the matrix-vector kernel or nothing */
#define GPU_FMA_STEM   5 /* the stem kernel or nothing */
int gpu_fma_plan_make(const struct convd_problem *p, int out_nchw, int kernel,
                      const struct convd_gpu_policy *pol, size_t ws_avail, struct gpu_fma_plan *ret,
                      char *why, size_t why_len);
int gpu_fma_launch(const struct gpu_fma_plan *pl, const struct gpu_batch *b, int count,
                   const struct gpu_launch *ln);

/* The mma family's plan. fp32 (TF32) problems are planned as 16-bit units: g.c, g.cpg and every
 * channel count below count two units per fp32 channel; g.k and the outputs stay fp32. */
struct gpu_mma_plan {
    struct gpu_geom g;
    int dtype, layout;
    int cfg;        /* index into the kernel configuration table */
    int gm;         /* groups merged into one block-diagonal super-group */
    int cpgm, kpgm; /* channels and outputs per super-group */
    int bm, bn;
    int sgb;          /* super-groups per block (>= 1) or 0 when the block is part of one */
    int nsplit;       /* blocks per super-group when kpgm > bn */
    int nblk;         /* n-blocks per problem */
    int imgs, th, tw; /* tile: images x rows x cols */
    int tiles_h, tiles_w, tiles;
    int ih, iw;      /* halo rows and columns per image */
    int kc, nchunks; /* channels per super-group per chunk */
    int noct, nk16;  /* 8-channel octets per chunk (all taps), k16 steps */
    int cbc;         /* halo channels per pixel */
    int ps;          /* halo pixel stride, bytes */
    int brs;         /* weight row stride, bytes */
    int a_bytes, b_bytes, stage_bytes;
    int off_a0, off_a1, off_b0, off_b1, off_oct, off_stage;
    int smem;
    int threads;
    int fast_w; /* weights copied with 16-byte cp.async (NHWC, gm == 1) */
    int out_nchw;
    /* Tensor copies (sm_90): the halo arrives as one cp.async.bulk.tensor box per item into a
     * ring of nst A buffers (rows of ps bytes: cbc * 2 swizzled at 32, 64 or 128 bytes, else
     * padded to an odd number of 16-byte units; 1024-byte aligned, a_stride apart), the output
     * leaves as one box from a double-buffered, swizzled staging tile (off_stage, off_stage1);
     * completion is counted on the mbarriers at off_bar. a_tx: the halo box's bytes. */
    int tma;
    int off_stage1, off_bar, a_tx;
    int nst, a_stride; /* tensor copies: halo buffers in the ring (2; 1, 3, 4 forced), spacing */
    int prefetch;      /* weights (and the first halo) read before the grid dependency */
};
int gpu_mma_plan_make(const struct convd_problem *p, int out_nchw,
                      const struct convd_gpu_policy *pol, struct gpu_mma_plan *ret, char *why,
                      size_t why_len);
int gpu_mma_launch(const struct gpu_mma_plan *pl, const struct gpu_batch *b, int count,
                   const struct gpu_launch *ln);

/* One line about a plan: configuration, tile, occupancy. */
void gpu_mma_describe(const struct gpu_mma_plan *pl, char *buf, size_t len);

/* Batched layout change: for each of up to GPU_TRANSPOSE_JOBS matrices of one element size, and
 * each of `count` problems, src[i] is [outer][rows][cols] and dst[i] becomes [outer][cols][rows];
 * elem_bytes 2 or 4. NCHW -> NHWC for inputs (outer N, rows C, cols H*W) and for weights (outer
 * K, rows C/G, cols R*S), both in one launch. */
#define GPU_TRANSPOSE_JOBS 2
struct gpu_transpose {
    const void *src[CONVD_GPU_BATCH_MAX];
    void *dst[CONVD_GPU_BATCH_MAX];
    int outer, rows, cols;
};
int gpu_transpose_launch(const struct gpu_transpose *jobs, int njobs, int count, int elem_bytes,
                         const struct gpu_launch *ln);

/* The activation a problem's epilogue does not take (gpu_act_inline), in place over `elems`
 * outputs of each of `count` problems (conv_layout.hip). */
struct gpu_act {
    void *y[CONVD_GPU_BATCH_MAX];
    int64_t elems;
    int act;
    float lo, hi;
};
int gpu_act_launch(const struct gpu_act *a, int count, int dtype, const struct gpu_launch *ln);

/* Batched channel padding (conv_layout.hip): dst [outer][inner][cp] from src [outer][inner][c]
 * (chan_first 0) or [outer][c][inner] (chan_first 1), channels past c zero; up to GPU_PADC_JOBS
 * of one element size in one launch, src[i] / dst[i] per problem i < count. */
#define GPU_PADC_JOBS 2
struct gpu_padc {
    const void *src[CONVD_GPU_BATCH_MAX];
    void *dst[CONVD_GPU_BATCH_MAX];
    int outer, inner, c, cp, chan_first;
};
int gpu_padc_launch(const struct gpu_padc *jobs, int njobs, int count, int elem_bytes,
                    const struct gpu_launch *ln);

struct gpu_generic_plan {
    struct gpu_geom g;
    int dtype, layout;
};
int gpu_generic_plan_make(const struct convd_problem *p, struct gpu_generic_plan *ret);
int gpu_generic_launch(const struct gpu_generic_plan *pl, const struct gpu_batch *b, int count,
                       const struct gpu_launch *ln);

#endif
