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

/*
 * The knobs of routing, planning and launching, passed explicitly: the production entry points
 * (convd_kernels.h) use convd_gpu_policy_default; tests and benchmarks build others (or use the
 * development library's setters, gpu_dev.h). Each field's default is the measured best; the other
 * values exist for tests and sweeps.
 */
struct convd_gpu_policy {
    /* Programmatic stream serialization (sm_90 code): 1 on every launch, 0 on none; 2 and 3 on
     * every launch except (problems through layout copies) the copies (2) or the kernel after
     * them (3); -1 (default) is 3. */
    int pdl;
    int mma_cfg;      /* tensor-core tile configuration: -1 the planner's, i that one only */
    int mma_tma;      /* sm_90 tensor copies where a problem allows them: -1 and 1 yes, 0 never */
    int mma_stages;   /* tensor-copy halo buffers: -1 two; 1, 3, 4 forced where they fit */
    int mma_prefetch; /* weights read before the grid dependency: -1 up to 24 KB a block, 0, 1 */
    int mma_pad;      /* dense 16-bit C % 8 != 0 on channel-padded copies: 1 yes, 0 no */
    int dw_direct;    /* depthwise direct kernels: -1 default shapes, 0 never, 1 + i shape i */
    int fma_gemm;     /* fma implicit GEMM: 1 where it fills the GPU, 0 never, 2 wherever it
                         applies */
    int fma_outputs3; /* fma direct kernel: 3 outputs a thread for odd multiples of 3 (1) or not */
    int direct;       /* direct family: -1 routed where measured faster, 0 never routed, 1, 2, 4
                         routed wherever it applies with that many rows a thread */
    int direct_nhwc;  /* NHWC on the direct family through NCHW copies: -1 measured, 0, 1 */
    int direct_prefetch; /* direct family's next-plane prefetch: -1 planner, 0, 1 */
    int direct_outputs8; /* direct family's 8 outputs a thread: -1 fp32 only, 0 never, 1 always */
    /* fp32 problems that allow TF32 on the tensor-core implicit GEMM: -1 where kpg >= 24, 0 never
     * (no TF32 anywhere, the mma family's included), 1 wherever the GEMM applies. */
    int tf32;
    /* The same on the mma family (fp32 as pairs of 16-bit units, ahead of the GEMM's tiles): -1
     * where it measured faster (router.hip, mma_tf32_routes and mma_tf32_nchw_routes), 0 never,
     * 1 wherever the family takes the problem, NCHW on copies too. Asked for by name, the family
     * takes TF32 whatever this says. */
    int mma_tf32;
    /* 1x1 problems whose whole C fits no mma tile (large C on small or strided images): 1
     * (default) takes them on the mma family with C in chunks, halved until a tile fits, where
     * the FMA kernels ran a few blocks of a large C x K (NOTES.md rounds 18-19); 0 leaves them
     * to the FMA kernels. */
    int mma_split_c;
    /* Output counts no mma block width divides or fills (regnet's K 104, 208 and 440: widths
     * are 32-80): 1 (default) takes them with the last n-block of each group partial, its extra
     * columns zero weights that are never stored; 0 leaves them to the other families. Tried
     * only where no whole-block plan exists, so no plan the others found changes. */
    int mma_partial_n;
    /* A 1x1 filter with a 1x1 output (squeeze-excitation 1x1s, classifier heads): 1 runs it on
     * the fma family's matrix-vector kernel, a few lanes per output, where it has at most 4
     * images (default: 1.4-2.0 us against the GEMM's 2.4-6.7 on regnet's, H100); 2 whatever
     * the images; 0 never. */
    int gemv;
    /* The FMA GEMM's K loop split over blocks (partial sums in the workspace, a second kernel
     * adding them and applying the epilogue) where its grid fills at most a quarter of the block
     * slots: the large-C 1x1s of small images in fp32. 1 (default: rx50b1_l4_a 180 -> 19.6 us,
     * cuDNN 54.9, H100) on; 0 off. */
    int fma_split_k;
    /* Dense problems of at most 4 input channels (network stems: 3 channels) on the fma
     * family's stem kernel, where C padded to 8 for the tensor cores or the FMA tiles' halo cost
     * more than the few FMAs: 1 (default) NHWC filters of up to 9 taps on up to 8 images, where
     * it measured faster (regnet's 3x3 stem 4.7-4.9 us against 11.0, H100); 2 wherever it
     * applies, either layout; 0 never. */
    int stem;
};
#define CONVD_GPU_POLICY_DEFAULT                                                                   \
    {                                                                                              \
        -1, -1, -1, -1, -1, 1, -1, 1, 1, -1, -1, -1, -1, -1, -1, 1, 1, 1, 1, 1                     \
    }
extern const struct convd_gpu_policy convd_gpu_policy_default;

/* 0 when every field of pol holds a value listed above, else CONVD_EINVAL naming the field. */
int convd_gpu_policy_check(const struct convd_gpu_policy *pol, char *why, size_t why_len);

/* The name of the routing rule (kernels/gpu/router.hip) that takes p under pol with the
 * workspace convd_gpu_workspace() asks for and aligned tensors: "depthwise", "direct",
 * "direct-nhwc", "mma", "mma-nchw", ... ("none" for a problem the GPU refuses). Its family in
 * *ret_family when not NULL. p must be valid. */
const char *convd_gpu_rule(const struct convd_problem *p, const struct convd_gpu_policy *pol,
                           enum convd_gpu_family *ret_family);

/* The architecture of the code the current device runs, as 10 * major + minor (90 for sm_90
 * code): a compute_80 PTX build on an H100 runs sm_80 code, 80, and takes the sm_80 paths
 * (no tensor copies). 0 on AMD. Returns 0 or CONVD_EDEVICE. */
int convd_gpu_code_arch(int *ret_cc);

/* 0 when `family` can run p under pol (AUTO: always for a valid problem), else
 * CONVD_EUNSUPPORTED with the reason in why. Plans without workspace, except the direct family
 * on NHWC problems, which runs only on copies. Queries the current device's limits. */
int convd_gpu_plan_check(const struct convd_problem *p, enum convd_gpu_family family,
                         const struct convd_gpu_policy *pol, char *why, size_t why_len);

/* convd_gpu_conv() under pol on `family` (AUTO: the router's choice): the same contract, but for
 * a named family CONVD_EUNSUPPORTED when it cannot take the problem (or the pointers are not
 * aligned as it needs) instead of falling back. */
int convd_gpu_run(const struct convd_problem *p, const struct convd_tensors *t, size_t count,
                  void *workspace, size_t workspace_bytes, void *stream,
                  enum convd_gpu_family family, const struct convd_gpu_policy *pol);

/* convd_gpu_workspace() under pol. */
int convd_gpu_plan_workspace(const struct convd_problem *p, size_t count,
                             const struct convd_gpu_policy *pol, size_t *ret_bytes);

/* One line describing how `family` (AUTO: the router's choice) would run p under pol with the
 * workspace convd_gpu_workspace() asks for: tile shapes, threads, shared memory, grid and the
 * copies it runs on (convd_gpu_rule() names the rule). For benchmarks and logs. Returns 0 or the
 * family's refusal code. */
int convd_gpu_plan_describe(const struct convd_problem *p, enum convd_gpu_family family,
                            const struct convd_gpu_policy *pol, char *buf, size_t len);

/* The routing table as data, for documentation and its test: rule i's name, family, the view of
 * the tensors it plans for ("in place", "NHWC copies", ...) and one line on what it takes; NULL
 * past the last rule. Any of the out-pointers may be NULL. */
const char *convd_gpu_rule_info(int i, enum convd_gpu_family *ret_family, const char **ret_view,
                                const char **ret_doc);

/* The routing table as the markdown table the docs carry (docs/architecture.md), '\0'-terminated
 * into buf; the length it needs (without the '\0'), as snprintf. */
size_t convd_gpu_rule_table(char *buf, size_t len);

/* 1 when the library was built with CONVD_GPU_SWEEP_KERNELS (every kernel variant a policy can
 * force; the sweeps' build), 0 for the production set (what the default policy can route to; a
 * plan that needs another variant is refused, or for the depthwise direct shapes planned tiled). */
int convd_gpu_sweep_kernels(void);

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
