/*
 * Layout change for NCHW problems on the NHWC kernels: a batched 32x32-tile transpose through
 * shared memory (coalesced reads and writes), src [outer][rows][cols] -> dst [outer][cols][rows].
 * NCHW input (N, C, H*W) becomes NHWC (N, H*W, C); NCHW weights (K, C/G, R*S) become (K, R*S, C/G).
 * The output needs no pass of its own: the NHWC kernels write NCHW from their epilogue.
 */
#include "gpu_internal.h"

struct tr_batch {
    const void *src[CONVD_GPU_BATCH_MAX];
    void *dst[CONVD_GPU_BATCH_MAX];
};

template <class T>
__global__ void __launch_bounds__(256)
    transpose_kernel(const struct tr_batch b, int outer, int rows, int cols, int rtiles)
{
    __shared__ T tile[32][33];
    const T *src = (const T *)b.src[blockIdx.z];
    T *dst = (T *)b.dst[blockIdx.z];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    const int c0 = blockIdx.x * 32;
    for (int oy = blockIdx.y; oy < outer * rtiles; oy += gridDim.y) {
        const int o = oy / rtiles, r0 = (oy - o * rtiles) * 32;
        const T *s = src + (size_t)o * rows * cols;
        T *d = dst + (size_t)o * rows * cols;
#pragma unroll
        for (int j = ty; j < 32; j += 8) {
            const int r = r0 + j, c = c0 + tx;
            if (r < rows && c < cols)
                tile[j][tx] = s[(size_t)r * cols + c];
        }
        __syncthreads();
#pragma unroll
        for (int j = ty; j < 32; j += 8) {
            const int c = c0 + j, r = r0 + tx;
            if (c < cols && r < rows)
                d[(size_t)c * rows + r] = tile[tx][j];
        }
        __syncthreads();
    }
}

int gpu_transpose_launch(const void *const *src, void *const *dst, int count, int outer, int rows,
                         int cols, int elem_bytes, hipStream_t stream)
{
    if (count < 1 || count > CONVD_GPU_BATCH_MAX)
        return CONVD_EINVAL;
    struct tr_batch b;
    memset(&b, 0, sizeof(b));
    for (int i = 0; i < count; i++) {
        b.src[i] = src[i];
        b.dst[i] = dst[i];
    }
    const int rtiles = (rows + 31) / 32;
    int64_t gy = (int64_t)outer * rtiles;
    if (gy > 65535)
        gy = 65535;
    dim3 grid((unsigned)((cols + 31) / 32), (unsigned)gy, (unsigned)count);
    if (elem_bytes == 2)
        hipLaunchKernelGGL(transpose_kernel<uint16_t>, grid, dim3(256), 0, stream, b, outer, rows,
                           cols, rtiles);
    else if (elem_bytes == 4)
        hipLaunchKernelGGL(transpose_kernel<uint32_t>, grid, dim3(256), 0, stream, b, outer, rows,
                           cols, rtiles);
    else
        return CONVD_EINVAL;
    CONVD_GPU_CHECK(hipGetLastError());
    return 0;
}
