/*
 * Internal interface of the GPU kernel library, for its tests and benchmarks (and the GPU backend
 * if it wants it): the kernel families by name, running a problem on one chosen family, and a few
 * vendor-neutral device-memory helpers so that C test code needs no CUDA or HIP header.
 *
 * The product API is the convd_gpu_*() block of kernels/convd_kernels.h; it routes each problem
 * to the best family. These functions exist so that every family can be tested on every problem it
 * accepts, and benchmarked against the others.
 */
#ifndef CONVD_GPU_KERNELS_H
#define CONVD_GPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "convd_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Kernel families. AUTO lets the router choose (what convd_gpu_conv() does). */
enum convd_gpu_family {
    CONVD_GPU_FAMILY_AUTO = 0,
    CONVD_GPU_FAMILY_DEPTHWISE = 1, /* cpg = 1, kpg 1..2: direct, vectorised over channels */
    CONVD_GPU_FAMILY_FMA = 2,       /* register-tiled direct FMA, halo tile in shared memory */
    CONVD_GPU_FAMILY_MMA = 3,       /* tensor-core implicit GEMM (fp16/bf16, NVIDIA) */
    CONVD_GPU_FAMILY_GENERIC = 4,   /* one thread per output element; takes anything */
    CONVD_GPU_FAMILY_DIRECT = 5,    /* NCHW 3x3, small cpg: registers, filter in shared memory */
};
#define CONVD_GPU_FAMILY_COUNT 6

/* Most problems one launch takes; convd_gpu_conv() loops launches past it. */
#define CONVD_GPU_BATCH_MAX 32

/* "auto", "depthwise", "fma", "mma", "generic", "direct"; "unknown" otherwise. */
const char *convd_gpu_family_name(enum convd_gpu_family family);

/* Parses a family name; returns 0 or CONVD_EINVAL. */
int convd_gpu_family_parse(const char *name, enum convd_gpu_family *ret_family);

/* The family convd_gpu_conv() routes p to (never AUTO). p must be valid. Pointer alignment is not
 * known here; convd_gpu_conv() falls back to GENERIC for tensors not aligned to 16 bytes. */
enum convd_gpu_family convd_gpu_route(const struct convd_problem *p);

/* 0 when `family` can run p (AUTO: always for a valid problem), else CONVD_EUNSUPPORTED with the
 * reason in why. Queries the current device's limits (shared memory). */
int convd_gpu_family_check(const struct convd_problem *p, enum convd_gpu_family family, char *why,
                           size_t why_len);

/* convd_gpu_conv() on a chosen family: the same contract, but CONVD_EUNSUPPORTED when the family
 * cannot take the problem (or the pointers are not aligned as it needs) instead of falling back. */
int convd_gpu_conv_family(const struct convd_problem *p, const struct convd_tensors *t,
                          size_t count, void *workspace, size_t workspace_bytes, void *stream,
                          enum convd_gpu_family family);

/* One line describing how `family` (AUTO: the router's choice) would run p: tile shapes, threads,
 * shared memory, grid. For benchmarks and logs. Returns 0 or the family's refusal code. */
int convd_gpu_describe(const struct convd_problem *p, enum convd_gpu_family family, char *buf,
                       size_t len);

/* Device helpers for tests and benchmarks. All return 0 or CONVD_EDEVICE (CONVD_EINVAL for bad
 * arguments); they act on the current device and, where asynchronous, the default stream. */
int convd_gpu_device_count(int *ret_count);
/* "NVIDIA H200 (sm_90, 132 SMs)" into buf. */
int convd_gpu_device_name(char *buf, size_t len);
int convd_gpu_alloc(size_t bytes, void **ret_ptr);
void convd_gpu_free(void *ptr);
int convd_gpu_upload(void *dst, const void *src, size_t bytes);
int convd_gpu_download(void *dst, const void *src, size_t bytes);
/* Sets every byte of [dst, dst + bytes) to `value` (0xff poisons: NaN in every dtype). */
int convd_gpu_fill_bytes(void *dst, int value, size_t bytes);
/* Fills `count` elements of dtype with uniform values in [-1, 1) from a counter-based hash of
 * (seed, index): never all zero, reproducible, fast for benchmark-sized tensors. */
int convd_gpu_fill_random(void *dst, enum convd_dtype dtype, size_t count, uint64_t seed);
int convd_gpu_synchronize(void);

/* Benchmark tuning only: forces the tensor-core kernel's tile configuration (an index into its
 * table, -1 for the planner's choice). Process-global and not thread-safe; returns CONVD_EINVAL
 * for an index out of range. Shapes the forced configuration cannot take become unsupported by
 * the mma family (and route elsewhere). */
int convd_gpu_tune_mma_cfg(int cfg);
/* Tests and benchmark only: whether the tensor-core kernel moves halo and output by sm_90 tensor
 * copies where a problem allows them (NHWC in and out, the block's input channels in one chunk):
 * -1 (the default) and 1 yes, 0 never. Process-global; CONVD_EINVAL for other values. */
int convd_gpu_tune_mma_tma(int mode);
/* Tests and benchmark only: whether kernels are launched with programmatic stream serialization
 * (sm_90: a kernel's blocks start while the previous one finishes and wait for it before touching
 * memory): 1 yes, 0 no; 2 and 3 yes, except (NCHW through transposed copies) for the transposes
 * (2) or the kernel after them (3); -1, the default, is 3. Process-global; CONVD_EINVAL for
 * other values. */
int convd_gpu_tune_pdl(int mode);
/* Tests and benchmark only: halo buffers of the tensor-copy kernel: -1 (the default) two; 1, or 3
 * or 4 where shared memory holds them, forces that many. Process-global; CONVD_EINVAL for other
 * values. */
int convd_gpu_tune_mma_stages(int n);
/* Tests and benchmark only: whether the tensor-copy kernel prefetches its first item's halo and
 * weights into L2 before its grid dependency resolves: 1 yes, 0 no, -1 (the default) where a
 * block's weights are at most 24 KB.
 * Process-global; CONVD_EINVAL for other values. */
int convd_gpu_tune_mma_prefetch(int mode);

/* Tests and benchmark only: -1 routes depthwise problems that a direct kernel serves (conv_depthwise.hip:
 * NHWC 3x3 and 5x5, NCHW 3x3, 5x5 and 7x7 with "same" left padding and widths of whole 4-element
 * chunks; equal strides of 1 or 2, no dilation, one output per channel) to it, 0 keeps every
 * problem on the tiled kernels, 1 + i forces the direct kernels' shape of work i where its layout,
 * filter and stride match, the tiled kernel elsewhere. Process-global; CONVD_EINVAL past the
 * last shape. */
int convd_gpu_tune_dw_direct(int mode);

/* Tests and benchmark only: the fma family's implicit-GEMM kernel (conv_fma_gemm.hip; 1x1 with unit
 * stride and no padding, and NHWC with cpg % 4 == 0 and kpg >= 24) for 0: no problem (all on the
 * direct kernel), 1 (the default): those its planner expects to fill the GPU, 2: every problem it
 * takes. Process-global; CONVD_EINVAL for other values. */
int convd_gpu_tune_fma_gemm(int mode);

/* Tests and benchmark only: the fma family's direct kernel with 3 outputs per thread where 3
 * divides kpg and 2 does not (NHWC input; 1, the default) or only 8, 4, 2, 1 (0).
 * Process-global; CONVD_EINVAL for other values. */
int convd_gpu_tune_fma_outputs3(int mode);

/* Tests and benchmark only: the direct family (conv_direct.hip; NCHW 3x3 with pad_left 1, equal
 * strides of 1 or 2, no dilation, W and Wo multiples of 4) for -1 (the default): routed where
 * it measured faster than the other families (cpg <= 64 in fp32; cpg <= 4, or 8 at stride 2, in
 * 16-bit), rows per thread from the planner; 0: never routed; 1, 2 or 4: routed
 * wherever it applies, with that many output rows per thread. Asking for the family by name runs
 * it on any problem it applies to, whatever the mode. Process-global; CONVD_EINVAL for other
 * values. */
int convd_gpu_tune_direct(int mode);

/* Tests and benchmark only: NHWC problems on the direct family through NCHW copies of input,
 * weights and output (given the workspace convd_gpu_workspace asks for): -1 (the default) where
 * the router finds it pays (gpu_gd_routes_nhwc: 16-bit channel counts the tensor cores do not
 * take; fp32 with kpg < 24 at stride 2 or kpg not a multiple of 4), 0 never, 1 wherever the
 * direct kernel takes the NCHW form. Process-global; CONVD_EINVAL otherwise. */
int convd_gpu_tune_direct_nhwc(int mode);

/* Tests and benchmark only: dense 16-bit problems with C not a multiple of 8 (and K one) on the
 * mma family with C padded to the next multiple of 8 in the workspace (1, the default) or not
 * (0: the fma family). Process-global; CONVD_EINVAL for other values. */
int convd_gpu_tune_mma_pad(int mode);
/* Tests and benchmark only: whether the direct kernel loads the next input plane's window while
 * it multiplies the current one: -1 (the default) where its planner expects it to pay, 0 never,
 * 1 always. Process-global; CONVD_EINVAL for other values. */
int convd_gpu_tune_direct_prefetch(int mode);
/* Tests and benchmark only: where kpg is a multiple of 8, the direct kernel's threads take 8
 * outputs (one row) for -1 (the default) in fp32, 1 in every dtype; 0 keeps them at 4.
 * Process-global; CONVD_EINVAL for other values. */
int convd_gpu_tune_direct_outputs8(int mode);

#if defined(CONVD_MMA_TRACE)
/* Diagnostics build only (-DCONVD_MMA_TRACE): per-block globaltimer stamps of the tensor-copy
 * kernel, CONVD_MMA_TRACE_EVENTS per block for the first CONVD_MMA_TRACE_BLOCKS blocks, each the
 * SM id << 56 | nanoseconds (0: not reached). clear != 0 zeroes them; otherwise they are copied to
 * dst (CONVD_MMA_TRACE_BLOCKS * CONVD_MMA_TRACE_EVENTS values). bench/gpu/trace_summary.py reads
 * what convd-bench-kernels writes of them. */
#define CONVD_MMA_TRACE_BLOCKS 2048
#define CONVD_MMA_TRACE_EVENTS 64
int convd_gpu_mma_trace(unsigned long long *dst, int clear);
#endif

#ifdef __cplusplus
}
#endif

#endif
