/*
 * The GPU kernel API of kernels/convd_kernels.h: validation, routing by shape, batching of
 * problems of one geometry into as few launches as possible, and the device helpers of
 * gpu_kernels.h.
 *
 * Which family runs a problem is the rule table of router.hip; convd_gpu_kernel_name() names
 * the rule.
 */
#include <pthread.h>

#include "mix.h"
#include "router.h"

/* ---- device limits ---- */

#define GPU_MAX_DEVICES 16
static struct gpu_device_info gpu_devs[GPU_MAX_DEVICES];
static int gpu_devs_ok[GPU_MAX_DEVICES];
static pthread_mutex_t gpu_devs_lock = PTHREAD_MUTEX_INITIALIZER;

/* Whether launches may ask for programmatic serialization: 1 once every device in use runs code
 * built for sm_90 or newer (whose kernels wait on griddepcontrol), -1 when one does not (a kernel
 * built for an older architecture would not wait for its predecessor), 0 not known yet. Set by
 * gpu_device_info_get(). */
static int gpu_pdl_code = 0;

/* Empty: its attributes tell which of the binary's code images a device runs, if any. */
__global__ void gpu_probe_kernel(void)
{
}

#ifndef CONVD_CUDA_ARCHS
#define CONVD_CUDA_ARCHS "?"
#endif

extern "C" int convd_gpu_device_check(int device, char *why, size_t why_len)
{
    if (why && why_len)
        why[0] = '\0';
    hipError_t e = hipSetDevice(device);
    if (e != hipSuccess) {
        (void)hipGetLastError();
        if (why)
            snprintf(why, why_len, "GPU %d cannot be selected: %s", device, hipGetErrorString(e));
        return CONVD_EDEVICE;
    }
#ifdef CONVD_GPU_NVIDIA
    int major = 0, minor = 0;
    if (hipDeviceGetAttribute(&major, hipDeviceAttributeComputeCapabilityMajor, device) !=
            hipSuccess ||
        hipDeviceGetAttribute(&minor, hipDeviceAttributeComputeCapabilityMinor, device) !=
            hipSuccess) {
        (void)hipGetLastError();
        if (why)
            snprintf(why, why_len, "GPU %d: cannot read its compute capability", device);
        return CONVD_EDEVICE;
    }
    if (major < 8) {
        if (why)
            snprintf(why, why_len,
                     "GPU %d is sm_%d%d; convd's kernels need sm_80 (Ampere) or newer", device,
                     major, minor);
        return CONVD_EUNSUPPORTED;
    }
    hipFuncAttributes fa;
    e = hipFuncGetAttributes(&fa, gpu_probe_kernel);
    if (e != hipSuccess) {
        (void)hipGetLastError();
        if (why)
            snprintf(why, why_len,
                     "GPU %d is sm_%d%d and this convd has no code for it (built for CUDA "
                     "architectures %s); rebuild with -DCONVD_CUDA_ARCH=%d%d (or native)",
                     device, major, minor, CONVD_CUDA_ARCHS, major, minor);
        return CONVD_EUNSUPPORTED;
    }
#endif
    return 0;
}
/* A launch on stream under pol; plain: without programmatic serialization whatever pol says. */
static struct gpu_launch gpu_launch_for(hipStream_t stream, const struct convd_gpu_policy *pol,
                                        int plain)
{
    struct gpu_launch ln;
    ln.stream = stream;
    ln.pdl = pol->pdl != 0 && gpu_pdl_code > 0 && !plain;
    return ln;
}

/* Per architecture: the reference device, and what the mma planner's cost model charges on it.
 * sm_90 is the H200 the model was fitted on (bench/gpu/NOTES.md); the others scale the H200's
 * effective fraction of the tensor-core peak (450 of 989 TFLOP/s) by their vendor peaks, shared
 * memory by 128 bytes a clock per SM, L2 and DRAM writes by their published bandwidths: estimates
 * until measured there. The last row serves anything else. */
static const struct {
    int cc_major, cc_minor; /* -1: any */
    int sm_count, clock_khz;
    struct gpu_rates rate;
} gpu_rate_table[] = {
    {9, -1, 132, 1980000, {450e12, 7e12, 33e12, 4.6e12}},    /* H200 */
    {8, 0, 108, 1410000, {142e12, 4.2e12, 19.5e12, 1.9e12}}, /* A100 */
    {8, 6, 84, 1800000, {70e12, 2.5e12, 19.4e12, 0.7e12}},   /* RTX A6000 */
    {8, 9, 58, 2040000, {55e12, 2.0e12, 15.1e12, 0.28e12}},  /* L4 */
    {-1, -1, 132, 1980000, {450e12, 7e12, 33e12, 4.6e12}},
};

static struct gpu_rates gpu_rates_for(const struct gpu_device_info *d)
{
    size_t i = 0;
    const size_t n = sizeof(gpu_rate_table) / sizeof(gpu_rate_table[0]);
    while (i + 1 < n &&
           !(gpu_rate_table[i].cc_major == d->cc_major &&
             (gpu_rate_table[i].cc_minor < 0 || gpu_rate_table[i].cc_minor == d->cc_minor)))
        i++;
    const double ref = (double)gpu_rate_table[i].sm_count * gpu_rate_table[i].clock_khz;
    const double here =
        (double)d->sm_count * (d->clock_khz > 0 ? d->clock_khz : gpu_rate_table[i].clock_khz);
    const double f = here / ref;
    struct gpu_rates r = gpu_rate_table[i].rate;
    r.mma *= f;
    r.l2 *= f;
    r.lds *= f;
    r.nchw_write *= f;
    return r;
}

int gpu_device_info_get(struct gpu_device_info *ret)
{
    int dev = 0;
    CONVD_GPU_CHECK(hipGetDevice(&dev));
    if (dev < 0 || dev >= GPU_MAX_DEVICES)
        return CONVD_EDEVICE;
    pthread_mutex_lock(&gpu_devs_lock);
    if (gpu_devs_ok[dev]) {
        *ret = gpu_devs[dev];
        pthread_mutex_unlock(&gpu_devs_lock);
        return 0;
    }
    pthread_mutex_unlock(&gpu_devs_lock);
    struct gpu_device_info info;
    CONVD_GPU_CHECK(
        hipDeviceGetAttribute(&info.sm_count, hipDeviceAttributeMultiprocessorCount, dev));
    CONVD_GPU_CHECK(
        hipDeviceGetAttribute(&info.smem_optin, hipDeviceAttributeSharedMemPerBlockOptin, dev));
    CONVD_GPU_CHECK(hipDeviceGetAttribute(&info.smem_per_sm,
                                          hipDeviceAttributeMaxSharedMemoryPerMultiprocessor, dev));
    CONVD_GPU_CHECK(
        hipDeviceGetAttribute(&info.cc_major, hipDeviceAttributeComputeCapabilityMajor, dev));
    CONVD_GPU_CHECK(
        hipDeviceGetAttribute(&info.cc_minor, hipDeviceAttributeComputeCapabilityMinor, dev));
    if (hipDeviceGetAttribute(&info.clock_khz, hipDeviceAttributeClockRate, dev) != hipSuccess) {
        info.clock_khz = 0;
        (void)hipGetLastError();
    }
    info.rate = gpu_rates_for(&info);
    info.code_cc = 0;
#ifdef CONVD_GPU_NVIDIA
    hipFuncAttributes fa;
    CONVD_GPU_CHECK(hipFuncGetAttributes(&fa, gpu_probe_kernel));
    info.code_cc = fa.ptxVersion;
#endif
    pthread_mutex_lock(&gpu_devs_lock);
    if (info.code_cc < 90)
        gpu_pdl_code = -1;
    else if (gpu_pdl_code == 0)
        gpu_pdl_code = 1;
    gpu_devs[dev] = info;
    gpu_devs_ok[dev] = 1;
    pthread_mutex_unlock(&gpu_devs_lock);
    *ret = info;
    return 0;
}

/* Kernels whose dynamic shared-memory limit was raised, and to what. */
struct gpu_smem_entry {
    const void *fn;
    int bytes;
};
static struct gpu_smem_entry gpu_smem_set[256];
static int gpu_smem_n;
static pthread_mutex_t gpu_smem_lock = PTHREAD_MUTEX_INITIALIZER;

int gpu_allow_smem(const void *kernel, int bytes)
{
    if (bytes <= 48 * 1024)
        return 0;
    pthread_mutex_lock(&gpu_smem_lock);
    for (int i = 0; i < gpu_smem_n; i++)
        if (gpu_smem_set[i].fn == kernel && gpu_smem_set[i].bytes >= bytes) {
            pthread_mutex_unlock(&gpu_smem_lock);
            return 0;
        }
    hipError_t e = hipFuncSetAttribute(kernel, hipFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == hipSuccess) {
        int i;
        for (i = 0; i < gpu_smem_n; i++)
            if (gpu_smem_set[i].fn == kernel)
                break;
        if (i < (int)(sizeof(gpu_smem_set) / sizeof(gpu_smem_set[0]))) {
            gpu_smem_set[i].fn = kernel;
            gpu_smem_set[i].bytes = bytes;
            if (i == gpu_smem_n)
                gpu_smem_n++;
        }
    }
    pthread_mutex_unlock(&gpu_smem_lock);
    return e == hipSuccess ? 0 : CONVD_EDEVICE;
}

void gpu_geom_from_problem(const struct convd_problem *p, struct gpu_geom *g)
{
    memset(g, 0, sizeof(*g));
    g->n = p->n;
    g->h = p->h;
    g->w = p->w;
    g->c = p->c;
    g->k = p->k;
    g->r = p->r;
    g->s = p->s;
    g->g = p->groups;
    g->cpg = p->c / p->groups;
    g->kpg = p->k / p->groups;
    g->ho = (int)convd_math_out_dim(p->h, p->pad_top, p->pad_bottom, p->r, p->stride_h, p->dil_h);
    g->wo = (int)convd_math_out_dim(p->w, p->pad_left, p->pad_right, p->s, p->stride_w, p->dil_w);
    g->sh = p->stride_h;
    g->sw = p->stride_w;
    g->pt = p->pad_top;
    g->pl = p->pad_left;
    g->dh = p->dil_h;
    g->dw = p->dil_w;
    g->bias = p->has_bias ? 1 : 0;
    g->act = p->activation != CONVD_ACT_NONE && gpu_act_inline((int)p->activation);
    g->act_lo = p->activation == CONVD_ACT_CLAMP ? p->act_min : 0.0f;
    g->act_hi = p->activation == CONVD_ACT_CLAMP ? p->act_max : INFINITY;
}

/* ---- plans ---- */

/* Workspace bytes of one problem's copies, 256-byte aligned each: input, then weights; with_out
 * (the GPU_WS_OUTPUT level) also the output, and at least the channel-padded input and weights
 * where those apply. Offsets of the weights and output copies in *ret_w_off, *ret_o_off; of the
 * padded weights in *ret_pw_off. */
static size_t ws_slot(const struct convd_problem *p, const struct convd_gpu_policy *pol,
                      int with_out, size_t *ret_w_off, size_t *ret_o_off, size_t *ret_pw_off)
{
    struct convd_problem_sizes z;
    if (convd_problem_sizes(p, &z, NULL, 0) != 0)
        return 0;
    const size_t in = ((size_t)z.input_bytes + 255) & ~(size_t)255;
    const size_t w = ((size_t)z.weight_bytes + 255) & ~(size_t)255;
    const size_t out = with_out ? ((size_t)z.output_bytes + 255) & ~(size_t)255 : 0;
    size_t pin = 0, pw = 0;
    const int cp = with_out ? gpu_pad_channels(p, pol) : 0;
    if (cp > 0) {
        pin = ((size_t)z.input_bytes / (size_t)p->c * (size_t)cp + 255) & ~(size_t)255;
        pw = ((size_t)z.weight_bytes / (size_t)p->c * (size_t)cp + 255) & ~(size_t)255;
    }
    if (ret_w_off != NULL)
        *ret_w_off = in;
    if (ret_o_off != NULL)
        *ret_o_off = in + w;
    if (ret_pw_off != NULL)
        *ret_pw_off = pin;
    return in + w + out > pin + pw ? in + w + out : pin + pw;
}

size_t gpu_ws_slot_out(const struct convd_problem *p, const struct convd_gpu_policy *pol)
{
    return ws_slot(p, pol, 1, NULL, NULL, NULL);
}

/* Whether plan pl's own kernels use workspace (the FMA GEMM's split K). */
static int plan_own_ws(const struct gpu_plan *pl)
{
    return pl->family == CONVD_GPU_FAMILY_FMA && pl->u.fma.gemm && pl->u.fma.pw.ksplit > 1;
}

/* Workspace bytes one problem of plan pl uses (0: none): the GPU_WS_COPIES slot for NCHW on
 * NHWC copies, the GPU_WS_OUTPUT one for NHWC on NCHW copies, for padded channels and for split
 * K's partial sums (its planner keeps them within that slot). */
static size_t plan_slot(const struct convd_problem *p, const struct convd_gpu_policy *pol,
                        const struct gpu_plan *pl)
{
    if (pl->via_nchw || pl->padded_c || plan_own_ws(pl))
        return gpu_ws_slot_out(p, pol);
    return pl->transposed ? ws_slot(p, pol, 0, NULL, NULL, NULL) : 0;
}

static int gpu_limits_check(const struct convd_problem *p, char *why, size_t why_len)
{
    struct convd_problem_sizes z;
    int rc = convd_problem_sizes(p, &z, why, why_len);
    if (rc != 0)
        return rc;
    const uint64_t lim = (uint64_t)1 << 31;
    if (z.input_elems >= lim || z.weight_elems >= lim || z.output_elems >= lim) {
        snprintf(why, why_len,
                 "GPU kernels index tensors with 32 bits: each must have fewer "
                 "than 2^31 elements");
        return CONVD_EUNSUPPORTED;
    }
    return 0;
}

/*
 * Plans are cached: planning walks tile candidates and reads device limits, which costs more host
 * time than a small convolution takes on the device. The cache is keyed by device, problem,
 * requested family, workspace level, alignment and policy; a small array with round-robin
 * replacement.
 */
#define PLAN_CACHE_SIZE 64
struct plan_entry {
    int used, dev, ws, aligned;
    enum convd_gpu_family req;
    struct convd_gpu_policy pol;
    struct convd_problem p;
    struct gpu_plan plan;
};
static struct plan_entry plan_cache[PLAN_CACHE_SIZE];
static int plan_cache_next;
static pthread_mutex_t plan_cache_lock = PTHREAD_MUTEX_INITIALIZER;

static int plan_cached(const struct gpu_route_in *in, enum convd_gpu_family req,
                       struct gpu_plan *ret, char *why, size_t why_len)
{
    int dev = 0;
    if (hipGetDevice(&dev) != hipSuccess) {
        (void)hipGetLastError();
        dev = -1;
    }
    pthread_mutex_lock(&plan_cache_lock);
    for (int i = 0; i < PLAN_CACHE_SIZE; i++) {
        const struct plan_entry *e = &plan_cache[i];
        /* The policy last: every entry of a daemon has the same one. */
        if (e->used && e->dev == dev && e->req == req && e->ws == in->ws &&
            e->aligned == in->aligned && convd_problem_same(&e->p, in->p) &&
            memcmp(&e->pol, in->pol, sizeof(e->pol)) == 0) {
            *ret = e->plan;
            pthread_mutex_unlock(&plan_cache_lock);
            return 0;
        }
    }
    pthread_mutex_unlock(&plan_cache_lock);
    int rc = gpu_route_plan(in, req, ret, why, why_len);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&plan_cache_lock);
    struct plan_entry *e = &plan_cache[plan_cache_next];
    plan_cache_next = (plan_cache_next + 1) % PLAN_CACHE_SIZE;
    e->used = 1;
    e->dev = dev;
    e->req = req;
    e->ws = in->ws;
    e->aligned = in->aligned;
    e->pol = *in->pol;
    e->p = *in->p;
    e->plan = *ret;
    pthread_mutex_unlock(&plan_cache_lock);
    return 0;
}

/* The plan for p under pol with the workspace convd_gpu_workspace() asks for, aligned tensors. */
static int plan_full(const struct convd_problem *p, enum convd_gpu_family family,
                     const struct convd_gpu_policy *pol, struct gpu_plan *ret, char *why,
                     size_t why_len)
{
    const struct gpu_route_in in = {p, pol, GPU_WS_OUTPUT, 1};
    return plan_cached(&in, family, ret, why, why_len);
}

extern "C" int convd_gpu_plan_describe(const struct convd_problem *p, enum convd_gpu_family family,
                                       const struct convd_gpu_policy *pol, char *buf, size_t len)
{
    if (p == NULL || pol == NULL || buf == NULL || len == 0)
        return CONVD_EINVAL;
    int rc = gpu_limits_check(p, buf, len);
    if (rc != 0)
        return rc;
    struct gpu_plan pl;
    char why[160];
    rc = plan_full(p, family, pol, &pl, why, sizeof(why));
    if (rc != 0) {
        snprintf(buf, len, "unsupported");
        return rc;
    }
    char extra[32] = "";
    if (pl.transposed)
        snprintf(extra, sizeof(extra), " (NCHW via NHWC copies)");
    if (pl.via_nchw)
        snprintf(extra, sizeof(extra), " (NHWC via NCHW copies)");
    if (pl.padded_c)
        snprintf(extra, sizeof(extra), " (C padded to %d)", pl.padded_c);
    switch (pl.family) {
    case CONVD_GPU_FAMILY_DEPTHWISE:
        if (pl.u.dw.direct)
            snprintf(buf, len, "depthwise direct %d cpt %d rows %d cols %d threads %d blocks %d",
                     pl.u.dw.direct - 1, pl.u.dw.vec, pl.u.dw.strips, pl.u.dw.p, pl.u.dw.threads,
                     pl.u.dw.blocks_per_problem);
        else
            snprintf(buf, len, "depthwise vec %d window %d planes %d threads %d smem %d blocks %d",
                     pl.u.dw.vec, pl.u.dw.unit, pl.u.dw.planes, pl.u.dw.threads, pl.u.dw.smem,
                     pl.u.dw.blocks_per_problem);
        break;
    case CONVD_GPU_FAMILY_FMA:
        if (pl.u.fma.gemv) {
            snprintf(buf, len, "fma gemv lanes %d threads %d blocks %d", pl.u.fma.gv.lanes,
                     pl.u.fma.gv.threads, pl.u.fma.gv.blocks);
            break;
        }
        if (pl.u.fma.stem) {
            snprintf(buf, len, "fma stem 2 pixels x 8 outputs a thread, threads %d smem %d blocks %d",
                     pl.u.fma.st.threads, pl.u.fma.st.smem, pl.u.fma.st.blocks);
            break;
        }
        if (pl.u.fma.gemm) {
            snprintf(buf, len, "%s gemm tile %dx%d threads %d smem %d blocks %dx%d",
                     pl.u.fma.pw.tf32 ? "tf32" : "fma", pl.u.fma.pw.tch, pl.u.fma.pw.tpx,
                     pl.u.fma.pw.threads, pl.u.fma.pw.smem,
                     pl.u.fma.pw.ptiles *
                         (pl.u.fma.pw.layout == CONVD_LAYOUT_NHWC ? 1 : pl.u.fma.g.n),
                     pl.u.fma.pw.ctiles * pl.u.fma.g.g);
            if (pl.u.fma.pw.ksplit > 1) {
                const size_t l = strlen(buf);
                snprintf(buf + l, len - l, " split k %dx%d", pl.u.fma.pw.ksplit,
                         pl.u.fma.pw.kchunk);
            }
            break;
        }
        snprintf(buf, len,
                 "fma tn %d window %d nch %d bn %d gpb %d tile %dx%d kc %d/%d threads %d "
                 "smem %d blocks %d",
                 pl.u.fma.tn, pl.u.fma.ks, pl.u.fma.nch, pl.u.fma.bn, pl.u.fma.gpb, pl.u.fma.th,
                 pl.u.fma.sx * 8, pl.u.fma.kc, pl.u.fma.g.cpg, pl.u.fma.threads, pl.u.fma.smem,
                 pl.u.fma.tiles * pl.u.fma.nblk);
        break;
    case CONVD_GPU_FAMILY_MMA:
        gpu_mma_describe(&pl.u.mma, buf, len);
        break;
    case CONVD_GPU_FAMILY_DIRECT:
        snprintf(buf, len, "direct outputs %d rows %d threads %d smem %d blocks %dx%d", pl.u.gd.kt,
                 pl.u.gd.th, pl.u.gd.threads, pl.u.gd.smem, pl.u.gd.planes, pl.u.gd.grid_y);
        break;
    default:
        snprintf(buf, len, "%s", convd_gpu_family_name(pl.family));
        break;
    }
    if (extra[0] != '\0') {
        size_t l = strlen(buf);
        snprintf(buf + l, len - l, "%s", extra);
    }
    return 0;
}

static int aligned16(const void *ptr)
{
    return ((uintptr_t)ptr & 15u) == 0;
}

extern "C" int convd_gpu_run(const struct convd_problem *p, const struct convd_tensors *t,
                             size_t count, void *workspace, size_t workspace_bytes, void *stream,
                             enum convd_gpu_family family, const struct convd_gpu_policy *pol)
{
    char why[160];
    if (p == NULL || pol == NULL || (t == NULL && count > 0))
        return CONVD_EINVAL;
    int rc = gpu_limits_check(p, why, sizeof(why));
    hipStream_t s = (hipStream_t)stream;
    if (rc != 0)
        return rc;
    int all_aligned = 1;
    for (size_t i = 0; i < count; i++) {
        if (t[i].input == NULL || t[i].weight == NULL || t[i].output == NULL ||
            (p->has_bias && t[i].bias == NULL))
            return CONVD_EINVAL;
        if (!aligned16(t[i].input) || !aligned16(t[i].weight) || !aligned16(t[i].output))
            all_aligned = 0;
    }
    if (count == 0)
        return 0;
    if (gpu_pdl_code == 0) {
        /* Not every planner reads the device; whether launches may ask for programmatic
         * serialization (vendor.h) must be known before the first one. */
        struct gpu_device_info dev;
        (void)gpu_device_info_get(&dev);
    }

    struct gpu_plan pl;
    if (family != CONVD_GPU_FAMILY_AUTO && !all_aligned && family != CONVD_GPU_FAMILY_GENERIC)
        return CONVD_EUNSUPPORTED;
    size_t w_off = 0, o_off = 0;
    size_t pw_off = 0;
    const size_t slot = ws_slot(p, pol, 0, NULL, NULL, NULL),
                 slot_out = ws_slot(p, pol, 1, &w_off, &o_off, &pw_off);
    const size_t per_launch = count < CONVD_GPU_BATCH_MAX ? count : CONVD_GPU_BATCH_MAX;
    const int ws_ok = workspace == NULL || !aligned16(workspace) ? 0
                      : workspace_bytes >= slot_out * per_launch ? GPU_WS_OUTPUT
                      : workspace_bytes >= slot * per_launch     ? GPU_WS_COPIES
                                                                 : 0;
    const struct gpu_route_in in = {p, pol, ws_ok, all_aligned};
    rc = plan_cached(&in, family, &pl, why, sizeof(why));
    if (rc != 0)
        return rc;
    const size_t stride = plan_slot(p, pol, &pl);
    /* Launch modes: the layout copies before the kernel (plain under pdl 2); the kernel (plain
     * after copies under pdl -1 and 3: launched early beside the copies' last wave, it ran slower
     * on small images); the output's copy back (always plain); the activation pass. */
    const int copies = pl.transposed || pl.via_nchw || pl.padded_c;
    const struct gpu_launch ln_copy = gpu_launch_for(s, pol, pol->pdl == 2),
                            ln_kernel =
                                gpu_launch_for(s, pol, copies && (pol->pdl == -1 || pol->pdl == 3)),
                            ln_back = gpu_launch_for(s, pol, 1), ln_act = gpu_launch_for(s, pol, 0);

    const size_t es = convd_dtype_size(p->dtype);
    for (size_t base = 0; base < count; base += CONVD_GPU_BATCH_MAX) {
        const int n =
            (int)(count - base < CONVD_GPU_BATCH_MAX ? count - base : CONVD_GPU_BATCH_MAX);
        struct gpu_batch b;
        memset(&b, 0, sizeof(b));
        for (int i = 0; i < n; i++) {
            b.x[i] = t[base + i].input;
            b.w[i] = t[base + i].weight;
            b.b[i] = t[base + i].bias;
            b.y[i] = t[base + i].output;
        }
        if (pl.transposed) {
            /* NCHW -> NHWC copies of inputs and weights in the workspace, then the NHWC kernel,
             * whose epilogue writes NCHW. */
            struct gpu_transpose tr[2];
            memset(tr, 0, sizeof(tr));
            for (int i = 0; i < n; i++) {
                uint8_t *slot_base = (uint8_t *)workspace + (size_t)i * stride;
                tr[0].src[i] = b.x[i];
                tr[1].src[i] = b.w[i];
                tr[0].dst[i] = slot_base;
                tr[1].dst[i] = slot_base + w_off;
                b.x[i] = tr[0].dst[i];
                b.w[i] = tr[1].dst[i];
            }
            tr[0].outer = p->n;
            tr[0].rows = p->c;
            tr[0].cols = p->h * p->w;
            tr[1].outer = p->k;
            tr[1].rows = p->c / p->groups;
            tr[1].cols = p->r * p->s;
            rc = gpu_transpose_launch(tr, 2, n, (int)es, &ln_copy);
            if (rc != 0)
                return rc;
        }
        if (pl.padded_c) {
            /* Input [N][HW][C] or [N][C][HW] and weights [K][RS][C] or [K][C][RS] into NHWC
             * copies with C padded by zero channels. */
            struct gpu_padc pc[2];
            memset(pc, 0, sizeof(pc));
            for (int i = 0; i < n; i++) {
                uint8_t *slot_base = (uint8_t *)workspace + (size_t)i * stride;
                pc[0].src[i] = b.x[i];
                pc[1].src[i] = b.w[i];
                pc[0].dst[i] = slot_base;
                pc[1].dst[i] = slot_base + pw_off;
                b.x[i] = pc[0].dst[i];
                b.w[i] = pc[1].dst[i];
            }
            const int cf = p->layout == CONVD_LAYOUT_NCHW;
            pc[0].outer = p->n;
            pc[0].inner = p->h * p->w;
            pc[1].outer = p->k;
            pc[1].inner = p->r * p->s;
            pc[0].c = pc[1].c = p->c;
            pc[0].cp = pc[1].cp = pl.padded_c;
            pc[0].chan_first = pc[1].chan_first = cf;
            rc = gpu_padc_launch(pc, 2, n, (int)es, &ln_copy);
            if (rc != 0)
                return rc;
        }
        struct gpu_transpose back;
        memset(&back, 0, sizeof(back));
        if (pl.via_nchw) {
            /* NHWC -> NCHW copies of inputs ([n][HW][C] -> [n][C][HW]) and weights ([K][RS][cpg]
             * -> [K][cpg][RS]); the NCHW kernel writes its output into the workspace, and that
             * comes back [n][K][HoWo] -> [n][HoWo][K] into the caller's output. */
            struct gpu_transpose tr[2];
            memset(tr, 0, sizeof(tr));
            for (int i = 0; i < n; i++) {
                uint8_t *slot_base = (uint8_t *)workspace + (size_t)i * stride;
                tr[0].src[i] = b.x[i];
                tr[1].src[i] = b.w[i];
                tr[0].dst[i] = slot_base;
                tr[1].dst[i] = slot_base + w_off;
                back.src[i] = slot_base + o_off;
                back.dst[i] = b.y[i];
                b.x[i] = tr[0].dst[i];
                b.w[i] = tr[1].dst[i];
                b.y[i] = slot_base + o_off;
            }
            tr[0].outer = p->n;
            tr[0].rows = p->h * p->w;
            tr[0].cols = p->c;
            tr[1].outer = p->k;
            tr[1].rows = p->r * p->s;
            tr[1].cols = p->c / p->groups;
            back.outer = p->n;
            back.rows = p->k;
            back.cols = pl.u.gd.g.ho * pl.u.gd.g.wo;
            rc = gpu_transpose_launch(tr, 2, n, (int)es, &ln_copy);
            if (rc != 0)
                return rc;
        }
        if (plan_own_ws(&pl))
            for (int i = 0; i < n; i++)
                b.ws[i] = (uint8_t *)workspace + (size_t)i * stride;
        rc = gpu_plan_launch(&pl, &b, n, &ln_kernel);
        if (rc != 0)
            return rc;
        if (pl.via_nchw) {
            rc = gpu_transpose_launch(&back, 1, n, (int)es, &ln_back);
            if (rc != 0)
                return rc;
        }
        if (!gpu_act_inline((int)p->activation)) {
            struct gpu_act a;
            memset(&a, 0, sizeof(a));
            for (int i = 0; i < n; i++)
                a.y[i] = t[base + i].output;
            a.elems =
                (int64_t)p->n * p->k *
                convd_math_out_dim(p->h, p->pad_top, p->pad_bottom, p->r, p->stride_h, p->dil_h) *
                convd_math_out_dim(p->w, p->pad_left, p->pad_right, p->s, p->stride_w, p->dil_w);
            a.act = (int)p->activation;
            a.lo = p->act_min;
            a.hi = p->act_max;
            rc = gpu_act_launch(&a, n, (int)p->dtype, &ln_act);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

/* ---- public API (conv.h) ---- */

extern "C" int convd_gpu_check(const struct convd_problem *p, char *why, size_t why_len)
{
    if (p == NULL)
        return CONVD_EINVAL;
    return gpu_limits_check(p, why, why_len);
}

extern "C" int convd_gpu_plan_workspace(const struct convd_problem *p, size_t count,
                                        const struct convd_gpu_policy *pol, size_t *ret_bytes)
{
    if (p == NULL || pol == NULL || ret_bytes == NULL)
        return CONVD_EINVAL;
    int rc = gpu_limits_check(p, NULL, 0);
    if (rc != 0)
        return rc;
    /* NCHW problems on the mma and fma families run faster on NHWC copies of input and weights,
     * NHWC problems with few channels per group on the direct family's NCHW copies of input,
     * weights and output, and dense 16-bit ones with C not a multiple of 8 on channel-padded
     * copies; everything else needs no scratch memory. With less workspace than this they still
     * run. */
    size_t bytes = 0;
    struct gpu_plan pl;
    char why[160];
    if (plan_full(p, CONVD_GPU_FAMILY_AUTO, pol, &pl, why, sizeof(why)) == 0)
        bytes =
            plan_slot(p, pol, &pl) * (count < CONVD_GPU_BATCH_MAX ? count : CONVD_GPU_BATCH_MAX);
    *ret_bytes = bytes;
    return 0;
}

extern "C" int convd_gpu_workspace(const struct convd_problem *p, size_t count, size_t *ret_bytes)
{
    return convd_gpu_plan_workspace(p, count, &convd_gpu_policy_default, ret_bytes);
}

extern "C" int convd_gpu_conv(const struct convd_problem *p, const struct convd_tensors *t,
                              size_t count, void *workspace, size_t workspace_bytes, void *stream)
{
    return convd_gpu_run(p, t, count, workspace, workspace_bytes, stream, CONVD_GPU_FAMILY_AUTO,
                         &convd_gpu_policy_default);
}

extern "C" const char *convd_gpu_kernel_name(const struct convd_problem *p)
{
    return convd_gpu_rule(p, &convd_gpu_policy_default, NULL);
}

/* ---- internal API (gpu_kernels.h) ---- */

extern "C" const char *convd_gpu_family_name(enum convd_gpu_family family)
{
    switch (family) {
    case CONVD_GPU_FAMILY_AUTO:
        return "auto";
    case CONVD_GPU_FAMILY_DEPTHWISE:
        return "depthwise";
    case CONVD_GPU_FAMILY_FMA:
        return "fma";
    case CONVD_GPU_FAMILY_MMA:
        return "mma";
    case CONVD_GPU_FAMILY_GENERIC:
        return "generic";
    case CONVD_GPU_FAMILY_DIRECT:
        return "direct";
    }
    return "unknown";
}

extern "C" int convd_gpu_family_parse(const char *name, enum convd_gpu_family *ret_family)
{
    if (name == NULL || ret_family == NULL)
        return CONVD_EINVAL;
    for (int f = 0; f < CONVD_GPU_FAMILY_COUNT; f++)
        if (strcmp(name, convd_gpu_family_name((enum convd_gpu_family)f)) == 0) {
            *ret_family = (enum convd_gpu_family)f;
            return 0;
        }
    return CONVD_EINVAL;
}

extern "C" const char *convd_gpu_rule(const struct convd_problem *p,
                                      const struct convd_gpu_policy *pol,
                                      enum convd_gpu_family *ret_family)
{
    if (ret_family != NULL)
        *ret_family = CONVD_GPU_FAMILY_GENERIC;
    if (p == NULL || pol == NULL || gpu_limits_check(p, NULL, 0) != 0)
        return "none";
    struct gpu_plan pl;
    char why[160];
    if (plan_full(p, CONVD_GPU_FAMILY_AUTO, pol, &pl, why, sizeof(why)) != 0)
        return "none";
    if (ret_family != NULL)
        *ret_family = pl.family;
    return pl.rule->name;
}

extern "C" int convd_gpu_plan_check(const struct convd_problem *p, enum convd_gpu_family family,
                                    const struct convd_gpu_policy *pol, char *why, size_t why_len)
{
    if (p == NULL || pol == NULL)
        return CONVD_EINVAL;
    int rc = gpu_limits_check(p, why, why_len);
    if (rc != 0 || family == CONVD_GPU_FAMILY_AUTO)
        return rc;
    /* Without workspace, except the direct family on NHWC problems, which runs only on copies. */
    struct gpu_plan pl;
    const int ws =
        family == CONVD_GPU_FAMILY_DIRECT && p->layout == CONVD_LAYOUT_NHWC ? GPU_WS_OUTPUT : 0;
    const struct gpu_route_in in = {p, pol, ws, 1};
    char spare[160];
    return gpu_route_plan(&in, family, &pl, why != NULL ? why : spare,
                          why != NULL ? why_len : sizeof(spare));
}

extern "C" int convd_gpu_code_arch(int *ret_cc)
{
    if (ret_cc == NULL)
        return CONVD_EINVAL;
    struct gpu_device_info dev;
    const int rc = gpu_device_info_get(&dev);
    if (rc != 0)
        return rc;
    *ret_cc = dev.code_cc;
    return 0;
}

extern "C" int convd_gpu_sweep_kernels(void)
{
#if defined(CONVD_GPU_SWEEP_KERNELS)
    return 1;
#else
    return 0;
#endif
}

extern "C" int convd_gpu_device_count(int *ret_count)
{
    if (ret_count == NULL)
        return CONVD_EINVAL;
    int n = 0;
    if (hipGetDeviceCount(&n) != hipSuccess)
        n = 0;
    *ret_count = n;
    return 0;
}

extern "C" int convd_gpu_device_name(char *buf, size_t len)
{
    if (buf == NULL || len == 0)
        return CONVD_EINVAL;
    int dev = 0;
    CONVD_GPU_CHECK(hipGetDevice(&dev));
#if defined(CONVD_GPU_NVIDIA)
    cudaDeviceProp prop;
    CONVD_GPU_CHECK(cudaGetDeviceProperties(&prop, dev));
    snprintf(buf, len, "%s (sm_%d%d, %d SMs)", prop.name, prop.major, prop.minor,
             prop.multiProcessorCount);
#else
    hipDeviceProp_t prop;
    CONVD_GPU_CHECK(hipGetDeviceProperties(&prop, dev));
    snprintf(buf, len, "%s (%s, %d CUs)", prop.name, prop.gcnArchName, prop.multiProcessorCount);
#endif
    return 0;
}

extern "C" int convd_gpu_alloc(size_t bytes, void **ret_ptr)
{
    if (ret_ptr == NULL)
        return CONVD_EINVAL;
    void *p = NULL;
    CONVD_GPU_CHECK(hipMalloc(&p, bytes ? bytes : 1));
    *ret_ptr = p;
    return 0;
}

extern "C" void convd_gpu_free(void *ptr)
{
    if (ptr != NULL)
        (void)hipFree(ptr);
}

extern "C" int convd_gpu_upload(void *dst, const void *src, size_t bytes)
{
    CONVD_GPU_CHECK(hipMemcpy(dst, src, bytes, hipMemcpyHostToDevice));
    return 0;
}

extern "C" int convd_gpu_download(void *dst, const void *src, size_t bytes)
{
    CONVD_GPU_CHECK(hipMemcpy(dst, src, bytes, hipMemcpyDeviceToHost));
    return 0;
}

extern "C" int convd_gpu_fill_bytes(void *dst, int value, size_t bytes)
{
    CONVD_GPU_CHECK(hipMemset(dst, value, bytes));
    return 0;
}

template <class DT>
__global__ void fill_random_kernel(typename DT::T *dst, size_t count, uint64_t seed)
{
    convd_grid_dependency();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t h = mix_splitmix64(seed ^ mix_splitmix64(i));
        const float v = (float)((double)(h >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
        dst[i] = DT::store(v);
    }
}

extern "C" int convd_gpu_fill_random(void *dst, enum convd_dtype dtype, size_t count, uint64_t seed)
{
    if (dst == NULL && count > 0)
        return CONVD_EINVAL;
    if (count == 0)
        return 0;
    size_t blocks = (count + 255) / 256;
    if (blocks > 8192)
        blocks = 8192;
    const struct gpu_launch ln = gpu_launch_for(0, &convd_gpu_policy_default, 0);
    switch (dtype) {
    case CONVD_DTYPE_FP32:
        GPU_LAUNCH(fill_random_kernel<dt_f32>, dim3((unsigned)blocks), dim3(256), 0, &ln,
                   (float *)dst, count, seed);
        break;
    case CONVD_DTYPE_FP16:
        GPU_LAUNCH(fill_random_kernel<dt_f16>, dim3((unsigned)blocks), dim3(256), 0, &ln,
                   (uint16_t *)dst, count, seed);
        break;
    case CONVD_DTYPE_BF16:
        GPU_LAUNCH(fill_random_kernel<dt_bf16>, dim3((unsigned)blocks), dim3(256), 0, &ln,
                   (uint16_t *)dst, count, seed);
        break;
    default:
        return CONVD_EINVAL;
    }
    CONVD_GPU_CHECK(hipGetLastError());
    return 0;
}

extern "C" int convd_gpu_synchronize(void)
{
    CONVD_GPU_CHECK(hipDeviceSynchronize());
    return 0;
}
