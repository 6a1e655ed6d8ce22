/*
 * The routing table (router.h says how it is read) and the policy that steers it. The `when`
 * predicates hold the thresholds measured on the H200 with the sweeps of convd-bench-kernels
 * (bench/gpu/NOTES.md, under each rule's name); the families' planners hold no routing.
 */
#include "router.h"

const struct convd_gpu_policy convd_gpu_policy_default = CONVD_GPU_POLICY_DEFAULT;

extern "C" int convd_gpu_policy_check(const struct convd_gpu_policy *pol, char *why, size_t why_len)
{
    if (pol == NULL)
        return CONVD_EINVAL;
    /* Each knob's range, and the one value inside it that means nothing (-9: none). */
    const struct {
        const char *name;
        int value, lo, hi, hole;
    } knobs[] = {
        {"pdl", pol->pdl, -1, 3, -9},
        {"mma_cfg", pol->mma_cfg, -1, gpu_mma_configs() - 1, -9},
        {"mma_tma", pol->mma_tma, -1, 1, -9},
        {"mma_stages", pol->mma_stages, -1, 4, 0},
        {"mma_prefetch", pol->mma_prefetch, -1, 1, -9},
        {"mma_pad", pol->mma_pad, 0, 1, -9},
        {"dw_direct", pol->dw_direct, -1, gpu_dw_direct_shapes(), -9},
        {"fma_gemm", pol->fma_gemm, 0, 2, -9},
        {"fma_outputs3", pol->fma_outputs3, 0, 1, -9},
        {"direct", pol->direct, -1, 4, 3},
        {"direct_nhwc", pol->direct_nhwc, -1, 1, -9},
        {"direct_prefetch", pol->direct_prefetch, -1, 1, -9},
        {"direct_outputs8", pol->direct_outputs8, -1, 1, -9},
        {"tf32", pol->tf32, -1, 1, -9},
        {"mma_tf32", pol->mma_tf32, -1, 1, -9},
        {"mma_split_c", pol->mma_split_c, 0, 1, -9},
        {"mma_partial_n", pol->mma_partial_n, 0, 1, -9},
        {"gemv", pol->gemv, 0, 2, -9},
        {"fma_split_k", pol->fma_split_k, 0, 1, -9},
        {"stem", pol->stem, 0, 2, -9},
    };
    for (size_t i = 0; i < sizeof(knobs) / sizeof(knobs[0]); i++) {
        const int v = knobs[i].value;
        if (v < knobs[i].lo || v > knobs[i].hi || v == knobs[i].hole) {
            if (why != NULL && why_len > 0)
                snprintf(why, why_len, "policy: %s = %d is not one of its values", knobs[i].name,
                         v);
            return CONVD_EINVAL;
        }
    }
    return 0;
}

int gpu_pad_channels(const struct convd_problem *p, const struct convd_gpu_policy *pol)
{
    if (!pol->mma_pad || p->groups != 1 || p->c % 8 == 0 || p->k % 8 != 0 ||
        p->dtype == CONVD_DTYPE_FP32)
        return 0;
    return (p->c + 7) / 8 * 8;
}

/* ---- predicates ---- */

static int cpg_of(const struct convd_problem *p)
{
    return p->c / p->groups;
}

static int kpg_of(const struct convd_problem *p)
{
    return p->k / p->groups;
}

static int nchw(const struct gpu_route_in *in)
{
    return in->p->layout == CONVD_LAYOUT_NCHW;
}

static int nhwc(const struct gpu_route_in *in)
{
    return in->p->layout == CONVD_LAYOUT_NHWC;
}

static int always(const struct gpu_route_in *in)
{
    (void)in;
    return 1;
}

static int unaligned(const struct gpu_route_in *in)
{
    return !in->aligned;
}

static int depthwise(const struct gpu_route_in *in)
{
    return cpg_of(in->p) == 1 && kpg_of(in->p) <= 2;
}

/* Whether the tensor-core family refuses p's NHWC form (16-bit cpg 5, 7, ...; on AMD, all). */
static int no_mma(const struct gpu_route_in *in)
{
    struct convd_problem q = *in->p;
    q.layout = CONVD_LAYOUT_NHWC;
    struct gpu_mma_plan mp;
    char why[160];
    return gpu_mma_plan_make(&q, nchw(in), in->pol, &mp, why, sizeof(why)) != 0;
}

/* NCHW on the direct family where it measured faster than the routes it replaced
 * (--sweep-direct): fp32 at every cpg up to 64; 16-bit at cpg <= 4, and at cpg 8 only at stride 2,
 * where mma would first transpose an input four times the size of the output; and 16-bit channel
 * counts mma cannot take, which would go to the fma family on transposed copies, slower up to
 * cpg 64. The policy's direct: 0 never, 1, 2, 4 wherever the kernel applies. */
static int direct_routes(const struct gpu_route_in *in)
{
    const struct convd_problem *p = in->p;
    if (in->pol->direct != -1)
        return in->pol->direct > 0;
    const int cpg = cpg_of(p);
    if (p->dtype == CONVD_DTYPE_FP32)
        return cpg <= 64;
    if (cpg <= 4 || (cpg <= 8 && p->stride_h == 2))
        return 1;
    return cpg <= 64 && no_mma(in);
}

/* NHWC on the direct family through NCHW copies, where the fma family's direct kernel would take
 * it and measured slower (--sweep-direct): 16-bit channel counts mma cannot take; fp32 below the
 * implicit GEMM's kpg (24) at stride 2 or with kpg not a multiple of 4, except odd multiples of 3,
 * where the fma kernel's 3 outputs per thread win. Stride 1 with kpg 4 or 8 is even and stays on
 * fma. The policy's direct_nhwc: 0 never, 1 wherever the kernel takes the NCHW form. */
static int direct_routes_nhwc(const struct gpu_route_in *in)
{
    const struct convd_problem *p = in->p;
    if (in->pol->direct_nhwc >= 0)
        return in->pol->direct_nhwc;
    const int cpg = cpg_of(p), kpg = kpg_of(p);
    if (in->pol->direct == 0 || cpg > 64)
        return 0;
    if (p->dtype == CONVD_DTYPE_FP32)
        return kpg < 24 && (p->stride_h == 2 || kpg % 4 != 0) && !(kpg % 2 != 0 && kpg % 3 == 0);
    if (p->groups == 1 && p->k % 8 == 0)
        return 0; /* dense: the tensor cores take it, channels padded where C needs it */
    return no_mma(in);
}

/* TF32 is allowed: by the problem (fp32, allow_tf32) and by the policy (tf32 not 0). A fits
 * predicate, so that a family asked for by name keeps to it too. */
static int tf32_allowed(const struct gpu_route_in *in)
{
    return in->p->dtype == CONVD_DTYPE_FP32 && in->p->allow_tf32 && in->pol->tf32 != 0;
}

/* Where the implicit GEMM's tensor-core tiles paid on the H200 (policy tf32 -1): kpg >= 24, every
 * shape of the suite that takes them (1.25-1.6x the exact GEMM's or direct kernel's time, the
 * 1x1 of kpg 80 in NHWC at 0.95x); 1: wherever the GEMM applies, pointwise with fewer outputs
 * too. */
static int tf32_routes(const struct gpu_route_in *in)
{
    return in->pol->tf32 == 1 || kpg_of(in->p) >= 24;
}

static int nhwc_with_output_copies(const struct gpu_route_in *in)
{
    return nhwc(in) && in->ws >= GPU_WS_OUTPUT;
}

static int nchw_with_copies(const struct gpu_route_in *in)
{
    return nchw(in) && in->ws >= GPU_WS_COPIES;
}

static int nchw_without_copies(const struct gpu_route_in *in)
{
    return nchw(in) && in->ws < GPU_WS_COPIES;
}

/* The 16-bit rules of the mma family: its planner takes fp32 too (as TF32), but only through the
 * TF32 rules, which say so in their names. */
static int half_dtype(const struct gpu_route_in *in)
{
    return in->p->dtype != CONVD_DTYPE_FP32;
}

static int nhwc_half(const struct gpu_route_in *in)
{
    return half_dtype(in) && nhwc(in);
}

static int nchw_with_copies_half(const struct gpu_route_in *in)
{
    return half_dtype(in) && nchw_with_copies(in);
}

static int nchw_without_copies_half(const struct gpu_route_in *in)
{
    return half_dtype(in) && nchw_without_copies(in);
}

static int padded_c(const struct gpu_route_in *in)
{
    return in->ws >= GPU_WS_OUTPUT && gpu_pad_channels(in->p, in->pol) > 0;
}

/* The padding copy is a launch of its own, and an mma tile is 16 output pixels or more: with
 * fewer pixels than that in the whole problem (the squeeze-excitation 1x1s on 1x1 images) the
 * implicit GEMM takes it in place (H100: rgy400b1_11, 12 -> 104 on a 1x1 image, 4.8 us padded
 * against 2.5 on the GEMM). */
static int padded_pays(const struct gpu_route_in *in)
{
    const struct convd_problem *p = in->p;
    const int64_t ho = convd_out_dim(p->h, p->pad_top, p->pad_bottom, p->r, p->stride_h, p->dil_h),
                  wo = convd_out_dim(p->w, p->pad_left, p->pad_right, p->s, p->stride_w, p->dil_w);
    return p->n * ho * wo >= 16;
}

/* NCHW problems the fma family runs on NHWC copies: all but those the implicit GEMM takes in
 * place (1x1 unit stride). */
static int fma_copies(const struct gpu_route_in *in)
{
    return nchw_with_copies(in) && !gpu_pw_applies(in->p, in->pol);
}

static int fma_in_place(const struct gpu_route_in *in)
{
    return !fma_copies(in);
}

static int tf32_in_place(const struct gpu_route_in *in)
{
    return tf32_allowed(in) && fma_in_place(in);
}

static int tf32_copies(const struct gpu_route_in *in)
{
    return tf32_allowed(in) && fma_copies(in);
}

/* Where the mma family takes TF32 in NHWC (policy mma_tf32 -1): where it measured faster than
 * the routes it replaces (--sweep-tf32 on both CSVs; bench/gpu/NOTES.md, round 16), which is
 * everywhere but kpg 6 or 12, merged into 24-wide warp tiles of poor occupancy, and grouped
 * stride 2 with kpg >= 32. 1: wherever it fits; 0: never. */
static int mma_tf32_routes(const struct gpu_route_in *in)
{
    const struct convd_problem *p = in->p;
    if (in->pol->mma_tf32 >= 0)
        return in->pol->mma_tf32;
    const int kpg = kpg_of(p);
    return !(kpg % 8 != 0 && kpg > 4) &&
           !(p->groups > 1 && kpg >= 32 && (p->stride_h > 1 || p->stride_w > 1));
}

/* NCHW on NHWC copies where the rules after this one would take copies too: fma-tf32-nchw
 * (kpg >= 24, ahead of the direct kernel), or fma-nchw where the direct kernel cannot take the
 * problem. There mma won 3 of the 5 suite rows (1.24-1.68x), tied one and lost one (0.90x);
 * where the direct kernel (kpg < 24) or the implicit GEMM (pointwise) takes the problem in place,
 * they stayed 1.04-3.6x faster (--sweep-tf32; bench/gpu/NOTES.md, round 17). */
static int mma_tf32_nchw_routes(const struct gpu_route_in *in)
{
    if (in->pol->mma_tf32 >= 0)
        return in->pol->mma_tf32;
    if (!mma_tf32_routes(in) || gpu_pw_applies(in->p, in->pol))
        return 0;
    if (tf32_routes(in) || !direct_routes(in))
        return 1;
    struct gpu_gd_plan gp;
    char why[160];
    return gpu_gd_plan_make(in->p, in->pol, &gp, why, sizeof(why)) != 0;
}

static int tf32_nhwc(const struct gpu_route_in *in)
{
    return tf32_allowed(in) && nhwc(in);
}

static int tf32_nchw_copies(const struct gpu_route_in *in)
{
    return tf32_allowed(in) && nchw_with_copies(in);
}

/* A matrix-vector product per image (1x1 filter, 1x1 output), in either layout (the two are
 * the same memory there), unless the policy's gemv is 0: a fits predicate, so that the fma
 * family asked for by name then keeps to its other kernels. */
static int gemv_fits(const struct gpu_route_in *in)
{
    return in->pol->gemv != 0 && gpu_gemv_applies(in->p);
}

/* Where the matrix-vector kernel replaces the implicit GEMM's tiles: a few images, where the
 * tiles of 32+ pixels would stage one (policy gemv 1, the default: bench/gpu/NOTES.md, round
 * 23; 2 at any image count, 0 never). */
static int gemv_routes(const struct gpu_route_in *in)
{
    return in->pol->gemv == 2 || (in->pol->gemv == 1 && in->p->n <= 4);
}

/* A dense problem of a few input channels (a network's stem) that the stem kernel takes, unless
 * the policy's stem is 0: a fits predicate, so that the fma family asked for by name then keeps
 * to its other kernels. */
static int stem_fits(const struct gpu_route_in *in)
{
    return in->pol->stem != 0 && gpu_stem_applies(in->p);
}

/* Where the stem kernel beats the other routes (policy stem 1; 2 wherever it applies): NHWC
 * filters of up to 9 taps on up to 8 images. regnet's 3x3 stride-2 stem takes 4.7-4.9 us against
 * mma-padded's 11.0 and fma's 10.9, 15.6-15.7 against 26.5-35.5 at 8 images (H100); 7x7 filters
 * ran 2.5x slower than mma-padded, and NCHW's 3x3 is the direct kernel's (NOTES round 24). */
static int stem_routes(const struct gpu_route_in *in)
{
    const struct convd_problem *p = in->p;
    return in->pol->stem == 2 || (p->layout == CONVD_LAYOUT_NHWC && p->r * p->s <= 9 && p->n <= 8);
}

/* ---- the table ---- */

#define N       GPU_VIEW_NATIVE
#define TO_NHWC GPU_VIEW_NHWC_COPIES
#define TO_NCHW GPU_VIEW_NCHW_COPIES
static const struct gpu_rule gpu_rules[] = {
    {"generic-unaligned", CONVD_GPU_FAMILY_GENERIC, N, 0, unaligned, always,
     "tensors not 16-byte aligned: one thread per output"},
    {"fma-gemv", CONVD_GPU_FAMILY_FMA, N, GPU_FMA_GEMV, gemv_fits, gemv_routes,
     "policy gemv 1: 1x1 filter, 1x1 output, no padding, at most 4 images (squeeze-excitation "
     "1x1s, heads): lanes of a warp share each output, either layout"},
    {"fma-stem", CONVD_GPU_FAMILY_FMA, N, GPU_FMA_STEM, stem_fits, stem_routes,
     "dense, C <= 4, K a multiple of 8, NHWC, up to 9 taps and 8 images (network stems): 2 "
     "pixels x 8 outputs a thread, weights in shared memory"},
    {"depthwise", CONVD_GPU_FAMILY_DEPTHWISE, N, 0, always, depthwise,
     "cpg 1, kpg 1-2, either layout"},
    {"mma-tf32", CONVD_GPU_FAMILY_MMA, N, 0, tf32_nhwc, mma_tf32_routes,
     "fp32 allowing TF32, NHWC, cpg and kpg multiples of 4 and 8 or made so by merging groups, "
     "but kpg 6 or 12 and grouped stride 2 with kpg >= 32: the mma kernels on pairs of 16-bit "
     "units (m16n8k8 TF32)"},
    {"mma-tf32-nchw", CONVD_GPU_FAMILY_MMA, TO_NHWC, 0, tf32_nchw_copies, mma_tf32_nchw_routes,
     "the same in NCHW on NHWC copies, NCHW out from the epilogue, but where the direct kernel "
     "(kpg < 24) or the implicit GEMM (pointwise) takes the problem in place"},
    {"fma-tf32", CONVD_GPU_FAMILY_FMA, N, GPU_FMA_TF32, tf32_in_place, tf32_routes,
     "fp32 allowing TF32 with kpg >= 24, in the implicit GEMM's shapes: its tiles on the tensor "
     "cores (mma m16n8k8 TF32, fp32 accumulation)"},
    {"fma-tf32-nchw", CONVD_GPU_FAMILY_FMA, TO_NHWC, GPU_FMA_TF32, tf32_copies, tf32_routes,
     "NCHW of the same (not 1x1) on NHWC copies, NCHW out from the epilogue"},
    {"direct", CONVD_GPU_FAMILY_DIRECT, N, 0, nchw, direct_routes,
     "NCHW 3x3, pad_left 1, stride 1 or 2, W and Wo multiples of 4: fp32 cpg <= 64; 16-bit cpg "
     "<= 4, cpg 8 at stride 2, or cpg <= 64 that mma cannot take"},
    {"direct-nhwc", CONVD_GPU_FAMILY_DIRECT, TO_NCHW, 0, nhwc_with_output_copies,
     direct_routes_nhwc,
     "NHWC of the direct geometry on NCHW copies: 16-bit cpg <= 64 that mma cannot take; fp32 "
     "kpg < 24 at stride 2 or kpg not a multiple of 4 (odd multiples of 3 excepted)"},
    {"mma", CONVD_GPU_FAMILY_MMA, N, 0, nhwc_half, always,
     "NHWC fp16/bf16, cpg and kpg multiples of 8 (or made so by merging 2 or 4 groups)"},
    {"mma-nchw", CONVD_GPU_FAMILY_MMA, TO_NHWC, 0, nchw_with_copies_half, always,
     "the same in NCHW, on NHWC copies of input and weights, NCHW out from the epilogue"},
    {"mma-nchw-gather", CONVD_GPU_FAMILY_MMA, N, 0, nchw_without_copies_half, always,
     "the same in NCHW without workspace, gathering NCHW in place"},
    {"mma-padded", CONVD_GPU_FAMILY_MMA, GPU_VIEW_PADDED_C, 0, padded_c, padded_pays,
     "dense fp16/bf16 with K a multiple of 8 and C not, on NHWC copies with C padded to 8, with "
     "16 output pixels or more"},
    {"fma-gemm", CONVD_GPU_FAMILY_FMA, N, GPU_FMA_GEMM, fma_in_place, always,
     "1x1 unit stride, or NHWC with cpg % 4 == 0 and kpg >= 24 whose tiles fill the GPU: "
     "implicit GEMM on the FMA units"},
    {"fma-gemm-nchw", CONVD_GPU_FAMILY_FMA, TO_NHWC, GPU_FMA_GEMM, fma_copies, always,
     "NCHW of the same (not 1x1) on NHWC copies, NCHW out from the epilogue"},
    {"fma", CONVD_GPU_FAMILY_FMA, N, GPU_FMA_DIRECT, fma_in_place, always,
     "whatever the halo tile fits: register-tiled direct FMA kernel"},
    {"fma-nchw", CONVD_GPU_FAMILY_FMA, TO_NHWC, GPU_FMA_DIRECT, fma_copies, always,
     "the same in NCHW on NHWC copies"},
    {"generic", CONVD_GPU_FAMILY_GENERIC, N, 0, always, always, "the rest: one thread per output"},
};
#undef N
#undef TO_NHWC
#undef TO_NCHW
#define GPU_NRULES ((int)(sizeof(gpu_rules) / sizeof(gpu_rules[0])))

static const char *view_name(enum gpu_view v)
{
    switch (v) {
    case GPU_VIEW_NATIVE:
        return "in place";
    case GPU_VIEW_NHWC_COPIES:
        return "NHWC copies";
    case GPU_VIEW_NCHW_COPIES:
        return "NCHW copies";
    case GPU_VIEW_PADDED_C:
        return "C padded";
    }
    return "?";
}

extern "C" const char *convd_gpu_rule_info(int i, enum convd_gpu_family *ret_family,
                                           const char **ret_view, const char **ret_doc)
{
    if (i < 0 || i >= GPU_NRULES)
        return NULL;
    if (ret_family != NULL)
        *ret_family = gpu_rules[i].family;
    if (ret_view != NULL)
        *ret_view = view_name(gpu_rules[i].view);
    if (ret_doc != NULL)
        *ret_doc = gpu_rules[i].doc;
    return gpu_rules[i].name;
}

extern "C" size_t convd_gpu_rule_table(char *buf, size_t len)
{
    size_t n = 0;
    const char *head = "| # | rule | family | tensors | takes |\n|---:|---|---|---|---|\n";
    n += (size_t)snprintf(buf, len, "%s", head);
    for (int i = 0; i < GPU_NRULES; i++) {
        const struct gpu_rule *r = &gpu_rules[i];
        n += (size_t)snprintf(n < len ? buf + n : NULL, n < len ? len - n : 0,
                              "| %d | `%s` | %s | %s | %s |\n", i + 1, r->name,
                              convd_gpu_family_name(r->family), view_name(r->view), r->doc);
    }
    return n;
}

/* The family's plan of p seen through the rule's view. */
static int plan_rule(const struct gpu_rule *r, const struct gpu_route_in *in, struct gpu_plan *ret,
                     char *why, size_t why_len)
{
    const struct convd_problem *p = in->p;
    ret->rule = r;
    ret->family = r->family;
    ret->transposed = r->view == GPU_VIEW_NHWC_COPIES;
    ret->via_nchw = r->view == GPU_VIEW_NCHW_COPIES;
    ret->padded_c = 0;
    struct convd_problem q = *p;
    int out_nchw = 0;
    switch (r->view) {
    case GPU_VIEW_NATIVE:
        break;
    case GPU_VIEW_NHWC_COPIES:
        q.layout = CONVD_LAYOUT_NHWC;
        out_nchw = 1;
        break;
    case GPU_VIEW_NCHW_COPIES:
        q.layout = CONVD_LAYOUT_NCHW;
        break;
    case GPU_VIEW_PADDED_C:
        q.c = gpu_pad_channels(p, in->pol);
        q.layout = CONVD_LAYOUT_NHWC;
        out_nchw = p->layout == CONVD_LAYOUT_NCHW;
        ret->padded_c = q.c;
        break;
    }
    switch (r->family) {
    case CONVD_GPU_FAMILY_DEPTHWISE:
        return gpu_dw_plan_make(&q, in->pol, &ret->u.dw, why, why_len);
    case CONVD_GPU_FAMILY_DIRECT:
        return gpu_gd_plan_make(&q, in->pol, &ret->u.gd, why, why_len);
    case CONVD_GPU_FAMILY_MMA:
        return gpu_mma_plan_make(&q, out_nchw, in->pol, &ret->u.mma, why, why_len);
    case CONVD_GPU_FAMILY_FMA:
        return gpu_fma_plan_make(
            &q, out_nchw, r->fma_kernel, in->pol,
            r->view == GPU_VIEW_NATIVE && in->ws >= GPU_WS_OUTPUT ? gpu_ws_slot_out(p, in->pol) : 0,
            &ret->u.fma, why, why_len);
    case CONVD_GPU_FAMILY_GENERIC:
        return gpu_generic_plan_make(&q, &ret->u.gen);
    case CONVD_GPU_FAMILY_AUTO:
        break;
    }
    snprintf(why, why_len, "unknown kernel family");
    return CONVD_EINVAL;
}

int gpu_route_plan(const struct gpu_route_in *in, enum convd_gpu_family family,
                   struct gpu_plan *ret, char *why, size_t why_len)
{
    int rc = 0;
    for (int i = 0; i < GPU_NRULES; i++) {
        const struct gpu_rule *r = &gpu_rules[i];
        if (family != CONVD_GPU_FAMILY_AUTO && r->family != family)
            continue;
        if (!r->fits(in) || (family == CONVD_GPU_FAMILY_AUTO && !r->when(in)))
            continue;
        rc = plan_rule(r, in, ret, why, why_len);
        if (rc == 0)
            return 0;
    }
    if (rc != 0)
        return rc;
    const char *what = "no rule fits the problem's layout and workspace";
    if (family == CONVD_GPU_FAMILY_DIRECT && in->p->layout == CONVD_LAYOUT_NHWC)
        what = "NHWC runs on NCHW copies in the workspace";
    else if (family == CONVD_GPU_FAMILY_MMA && in->p->dtype == CONVD_DTYPE_FP32 &&
             !tf32_allowed(in))
        what = "fp32 runs on the tensor cores only as TF32 (allow_tf32)";
    snprintf(why, why_len, "%s: %s", convd_gpu_family_name(family), what);
    return CONVD_EUNSUPPORTED;
}

int gpu_plan_launch(const struct gpu_plan *pl, const struct gpu_batch *b, int count,
                    const struct gpu_launch *ln)
{
    switch (pl->family) {
    case CONVD_GPU_FAMILY_DEPTHWISE:
        return gpu_dw_launch(&pl->u.dw, b, count, ln);
    case CONVD_GPU_FAMILY_FMA:
        return gpu_fma_launch(&pl->u.fma, b, count, ln);
    case CONVD_GPU_FAMILY_MMA:
        return gpu_mma_launch(&pl->u.mma, b, count, ln);
    case CONVD_GPU_FAMILY_GENERIC:
        return gpu_generic_launch(&pl->u.gen, b, count, ln);
    case CONVD_GPU_FAMILY_DIRECT:
        return gpu_gd_launch(&pl->u.gd, b, count, ln);
    case CONVD_GPU_FAMILY_AUTO:
        break;
    }
    return CONVD_EINVAL;
}
