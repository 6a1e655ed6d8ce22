/*
 * Layout change for NCHW problems on the NHWC kernels: a batched 32x32-tile transpose through
 * shared memory (coalesced reads and writes), src [outer][rows][cols] -> dst [outer][cols][rows],
 * of the input and the weights in one launch (a launch of its own for the weights cost more than
 * their bytes in batch-1 problems).
 * NCHW input (N, C, H*W) becomes NHWC (N, H*W, C); NCHW weights (K, C/G, R*S) become (K, R*S, C/G).
 * The output needs no pass of its own: the NHWC kernels write NCHW from their epilogue. The same
 * kernel serves the reverse route (NHWC problems on the NCHW direct kernel: input and weights to
 * NCHW, then the output back to NHWC, a third pass), and the channel padding below the dense
 * problems whose C the tensor-core kernel cannot take. Last, the pass that applies SiLU and GELU
 * to an output, which the kernels' epilogues leave out.
 */
#include "gpu_internal.h"

/* The kernel's view of the jobs: their tiles numbered one after another along grid x. A job of
 * 2-byte elements whose rows and columns are even (and pointers 4-byte aligned) moves pairs: 64 x
 * 64 tiles, every access 4 bytes, so a warp reads and writes 128 contiguous bytes (single 2-byte
 * elements in 32 x 32 tiles ran at well under half the fp32 rate). */
struct tr_args {
    struct gpu_transpose job[GPU_TRANSPOSE_JOBS];
    int rtiles[GPU_TRANSPOSE_JOBS], ctiles[GPU_TRANSPOSE_JOBS];
    int pairs[GPU_TRANSPOSE_JOBS];
    int first[GPU_TRANSPOSE_JOBS + 1]; /* first tile of each job; first[njobs] = all tiles */
    int njobs;
};

template <class T>
GPU_D void tr_tile32(const T *s, T *d, int rows, int cols, int r0, int c0, T (*tile)[33])
{
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int i = ty + 8 * q;
        const int r = r0 + i, c = c0 + tx;
        if (r < rows && c < cols)
            tile[i][tx] = s[(size_t)r * cols + c];
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int i = ty + 8 * q;
        const int c = c0 + i, r = r0 + tx;
        if (c < cols && r < rows)
            d[(size_t)c * rows + r] = tile[tx][i];
    }
}

/* rows and cols even: a pair never straddles an edge. */
GPU_D void tr_tile64_pairs(const uint16_t *s, uint16_t *d, int rows, int cols, int r0, int c0,
                           uint16_t (*tile)[66])
{
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
#pragma unroll
    for (int q = 0; q < 8; q++) {
        const int i = ty + 8 * q;
        const int r = r0 + i, c = c0 + 2 * tx;
        if (r < rows && c < cols)
            *(uint32_t *)&tile[i][2 * tx] = *(const uint32_t *)(s + (size_t)r * cols + c);
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < 8; q++) {
        const int i = ty + 8 * q;
        const int c = c0 + i, r = r0 + 2 * tx;
        if (c < cols && r < rows)
            *(uint32_t *)(d + (size_t)c * rows + r) =
                (uint32_t)tile[2 * tx][i] | ((uint32_t)tile[2 * tx + 1][i] << 16);
    }
}

template <class T> __global__ void __launch_bounds__(256) transpose_kernel(const struct tr_args a)
{
    convd_grid_dependency();
    __shared__ __align__(16) uint32_t tr_smem[64 * 33];
    int j = 0;
    while (j + 1 < a.njobs && (int)blockIdx.x >= a.first[j + 1])
        j++;
    const struct gpu_transpose &jb = a.job[j];
    int t = (int)blockIdx.x - a.first[j];
    const int ct = t % a.ctiles[j];
    t /= a.ctiles[j];
    const int rt = t % a.rtiles[j], o = t / a.rtiles[j];
    const int rows = jb.rows, cols = jb.cols;
    const T *s = (const T *)jb.src[blockIdx.z] + (size_t)o * rows * cols;
    T *d = (T *)jb.dst[blockIdx.z] + (size_t)o * rows * cols;
    if (sizeof(T) == 2 && a.pairs[j])
        tr_tile64_pairs((const uint16_t *)s, (uint16_t *)d, rows, cols, rt * 64, ct * 64,
                        (uint16_t(*)[66])tr_smem);
    else
        tr_tile32<T>(s, d, rows, cols, rt * 32, ct * 32, (T(*)[33])tr_smem);
}

int gpu_transpose_launch(const struct gpu_transpose *jobs, int njobs, int count, int elem_bytes,
                         const struct gpu_launch *ln)
{
    if (count < 1 || count > CONVD_GPU_BATCH_MAX || njobs < 1 || njobs > GPU_TRANSPOSE_JOBS)
        return CONVD_EINVAL;
    struct tr_args a;
    memset(&a, 0, sizeof(a));
    a.njobs = njobs;
    int64_t tiles = 0;
    for (int j = 0; j < njobs; j++) {
        a.job[j] = jobs[j];
        int pairs = elem_bytes == 2 && jobs[j].rows % 2 == 0 && jobs[j].cols % 2 == 0;
        for (int i = 0; i < count; i++)
            if ((((uintptr_t)jobs[j].src[i] | (uintptr_t)jobs[j].dst[i]) & 3) != 0)
                pairs = 0;
        const int side = pairs ? 64 : 32;
        a.pairs[j] = pairs;
        a.rtiles[j] = (jobs[j].rows + side - 1) / side;
        a.ctiles[j] = (jobs[j].cols + side - 1) / side;
        a.first[j] = (int)tiles;
        tiles += (int64_t)jobs[j].outer * a.rtiles[j] * a.ctiles[j];
        if (tiles > (1 << 24)) /* 64 GiB of fp32: past any tensor, inside every grid limit */
            return CONVD_EUNSUPPORTED;
    }
    a.first[njobs] = (int)tiles;
    if (tiles == 0)
        return 0;
    dim3 grid((unsigned)tiles, 1, (unsigned)count);
    if (elem_bytes == 2)
        GPU_LAUNCH(transpose_kernel<uint16_t>, grid, dim3(256), 0, ln, a);
    else if (elem_bytes == 4)
        GPU_LAUNCH(transpose_kernel<uint32_t>, grid, dim3(256), 0, ln, a);
    else
        return CONVD_EINVAL;
    CONVD_GPU_CHECK(hipGetLastError());
    return 0;
}

/*
 * Channel padding for dense problems whose C is not a multiple of 8 (the 3-channel stem), so
 * that the tensor-core kernel takes them: dst [outer][inner][cp] from src [outer][inner][c]
 * (channels last: NHWC input, NHWC weights [K][R*S][C]) or src [outer][c][inner] (channels
 * first: NCHW input and weights), channels c..cp-1 zero. One thread per destination element,
 * consecutive threads along the destination's channels: its writes are coalesced, and the few
 * source bytes a block reads come through L1.
 */
struct pad_args {
    struct gpu_padc job[GPU_PADC_JOBS];
    int64_t first[GPU_PADC_JOBS + 1]; /* first destination element of each job, per problem */
    int njobs;
};

template <class T> __global__ void __launch_bounds__(256) padc_kernel(const struct pad_args a)
{
    convd_grid_dependency();
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= a.first[a.njobs])
        return;
    int j = 0;
    while (j + 1 < a.njobs && e >= a.first[j + 1])
        j++;
    const struct gpu_padc &jb = a.job[j];
    const int64_t k = e - a.first[j];
    const int64_t row = k / jb.cp; /* outer * inner + inner index */
    const int ch = (int)(k - row * jb.cp);
    const int64_t o = row / jb.inner, i = row - o * jb.inner;
    const T *s = (const T *)jb.src[blockIdx.z];
    T v = 0;
    if (ch < jb.c)
        v = jb.chan_first ? s[(o * jb.c + ch) * jb.inner + i] : s[row * jb.c + ch];
    ((T *)jb.dst[blockIdx.z])[k] = v;
}

int gpu_padc_launch(const struct gpu_padc *jobs, int njobs, int count, int elem_bytes,
                    const struct gpu_launch *ln)
{
    if (count < 1 || count > CONVD_GPU_BATCH_MAX || njobs < 1 || njobs > GPU_PADC_JOBS)
        return CONVD_EINVAL;
    struct pad_args a;
    memset(&a, 0, sizeof(a));
    a.njobs = njobs;
    int64_t total = 0;
    for (int j = 0; j < njobs; j++) {
        a.job[j] = jobs[j];
        a.first[j] = total;
        total += (int64_t)jobs[j].outer * jobs[j].inner * jobs[j].cp;
    }
    a.first[njobs] = total;
    if (total == 0)
        return 0;
    const int64_t blocks = (total + 255) / 256;
    if (blocks > 0x7fffffff)
        return CONVD_EUNSUPPORTED;
    dim3 grid((unsigned)blocks, 1, (unsigned)count);
    if (elem_bytes == 2)
        GPU_LAUNCH(padc_kernel<uint16_t>, grid, dim3(256), 0, ln, a);
    else if (elem_bytes == 4)
        GPU_LAUNCH(padc_kernel<uint32_t>, grid, dim3(256), 0, ln, a);
    else
        return CONVD_EINVAL;
    CONVD_GPU_CHECK(hipGetLastError());
    return 0;
}

/* The activations the kernels' epilogue does not take (gpu_act_inline), in place over each
 * problem's output after the convolution: what PyTorch computes when the activation follows the
 * convolution as a layer of its own (the output rounded to its dtype, then the activation). A
 * grid-stride loop, about 4 items a thread. */
template <class DT> __global__ void __launch_bounds__(256) act_kernel(const struct gpu_act a)
{
    convd_grid_dependency();
    typename DT::T *y = (typename DT::T *)a.y[blockIdx.z];
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.elems; i += step)
        y[i] = DT::store(convd_math_act(a.act, DT::load(y[i]), a.lo, a.hi));
}

int gpu_act_launch(const struct gpu_act *a, int count, int dtype, const struct gpu_launch *ln)
{
    if (count < 1 || count > CONVD_GPU_BATCH_MAX || a->elems < 0)
        return CONVD_EINVAL;
    if (a->elems == 0)
        return 0;
    int64_t blocks = (a->elems + 4 * 256 - 1) / (4 * 256);
    if (blocks > 65535)
        blocks = 65535;
    dim3 grid((unsigned)blocks, 1, (unsigned)count);
    switch (dtype) {
    case CONVD_DTYPE_FP32:
        GPU_LAUNCH(act_kernel<dt_f32>, grid, dim3(256), 0, ln, *a);
        break;
    case CONVD_DTYPE_FP16:
        GPU_LAUNCH(act_kernel<dt_f16>, grid, dim3(256), 0, ln, *a);
        break;
    case CONVD_DTYPE_BF16:
        GPU_LAUNCH(act_kernel<dt_bf16>, grid, dim3(256), 0, ln, *a);
        break;
    default:
        return CONVD_EINVAL;
    }
    CONVD_GPU_CHECK(hipGetLastError());
    return 0;
}
