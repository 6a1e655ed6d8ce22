/*
 * The router (router.hip): which family runs a problem, on which view of its tensors, as one
 * ordered table of rules. Private to kernels/gpu; gpu_api.hip plans through it, caches the plans
 * and runs them.
 *
 * A rule has a name (what convd_gpu_kernel_name() reports), a family, the view of the tensors the
 * family plans for, and two predicates on the problem: `fits`, what the view needs (layout,
 * workspace, aligned tensors), and `when`, where the router prefers the rule (the thresholds
 * measured on the H200, bench/gpu/NOTES.md under the rule's name). The router takes the first rule
 * that fits, applies and whose family plans the problem; a family asked for by name takes its
 * first rule that fits and plans, whatever `when` says.
 */
#ifndef CONVD_GPU_ROUTER_H
#define CONVD_GPU_ROUTER_H

#include "gpu_internal.h"

/* The tensors a family sees. */
enum gpu_view {
    GPU_VIEW_NATIVE,      /* the problem's own layout */
    GPU_VIEW_NHWC_COPIES, /* NCHW problem on NHWC copies of input and weights in the workspace;
                             the kernel's epilogue writes NCHW */
    GPU_VIEW_NCHW_COPIES, /* NHWC problem on NCHW copies of input, weights and output */
    GPU_VIEW_PADDED_C,    /* dense problem on NHWC copies with C padded to a multiple of 8 */
};

/* Workspace levels a caller gives: 0 none; GPU_WS_COPIES input and weight copies; GPU_WS_OUTPUT
 * those and an output copy, or the channel-padded input and weights where larger. */
#define GPU_WS_COPIES 1
#define GPU_WS_OUTPUT 2

struct gpu_route_in {
    const struct convd_problem *p;
    const struct convd_gpu_policy *pol;
    int ws;      /* workspace level */
    int aligned; /* every tensor 16-byte aligned */
};

struct gpu_rule {
    const char *name;
    enum convd_gpu_family family;
    enum gpu_view view;
    int fma_kernel; /* fma family: GPU_FMA_GEMM, GPU_FMA_TF32 or GPU_FMA_DIRECT */
    int (*fits)(const struct gpu_route_in *in);
    int (*when)(const struct gpu_route_in *in);
    const char *doc; /* what it takes, one line (docs/benchmarks.md's routing table) */
};

struct gpu_plan {
    const struct gpu_rule *rule;
    enum convd_gpu_family family;
    int transposed; /* GPU_VIEW_NHWC_COPIES */
    int via_nchw;   /* GPU_VIEW_NCHW_COPIES */
    int padded_c;   /* GPU_VIEW_PADDED_C: the padded channel count; 0 otherwise */
    union {
        struct gpu_dw_plan dw;
        struct gpu_fma_plan fma;
        struct gpu_mma_plan mma;
        struct gpu_generic_plan gen;
        struct gpu_gd_plan gd;
    } u;
};

/* family AUTO: the first rule that fits, applies and plans; otherwise the first rule of `family`
 * that fits and plans. 0, or CONVD_EUNSUPPORTED with the last refusal in why. */
int gpu_route_plan(const struct gpu_route_in *in, enum convd_gpu_family family,
                   struct gpu_plan *ret, char *why, size_t why_len);

/* Runs a plan's kernel on `count` problems of its geometry (the view's copies already made). */
int gpu_plan_launch(const struct gpu_plan *pl, const struct gpu_batch *b, int count,
                    const struct gpu_launch *ln);

/* Bytes of the GPU_WS_OUTPUT workspace level per problem (gpu_api.hip): what a plan of the
 * native view may use for its own scratch (the FMA GEMM's split-K partial sums). */
size_t gpu_ws_slot_out(const struct convd_problem *p, const struct convd_gpu_policy *pol);

/* The padded channel count of p's GPU_VIEW_PADDED_C under pol, or 0 where it does not apply. */
int gpu_pad_channels(const struct convd_problem *p, const struct convd_gpu_policy *pol);

/* Table sizes the policy's checks need (conv_depthwise.hip, mma_plan.hip). */
int gpu_dw_direct_shapes(void);
int gpu_mma_configs(void);

#endif
