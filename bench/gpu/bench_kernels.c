/*
 * convd-bench-kernels: the GPU kernels against cuDNN, in one process, on the same buffers.
 *
 * For every row of a shapes CSV (name,n,h,w,c,k,r,s,stride,pad,dil,groups), dtype and layout:
 * our time and cuDNN's (legacy API through dlopen("libcudnn.so.9"); fp32 in CUDNN_FMA_MATH, exact,
 * or with --tf32 in CUDNN_DEFAULT_MATH, TF32 allowed on both sides as PyTorch allows it; the
 * fastest algorithm cudnnFindConvolutionForwardAlgorithmEx finds, with its workspace),
 * each the median of --iters CUDA-event timings after warm-up, inputs and outputs rotated over
 * enough buffers to exceed the L2, random data. Our output is checked against cuDNN's (relative
 * L2 error) in the same run. The fraction of the roofline is computed as in
 * shared/bench/cudnn-h200-baseline.md: floor = max(FLOPs / matmul rate, (input + weights +
 * output bytes) / copy bandwidth), frac = floor / time, with the ceilings measured in this run
 * (device-to-device copy; bf16 and fp32 GEMM through cuBLAS, dlopen'ed) or, if cuBLAS is missing,
 * the baseline's 4.20 TB/s, 748 and 50.8 TFLOP/s.
 *
 * With --streams S (2 to 64), each row is timed a second time, ours and cuDNN's alike, as S
 * streams running the convolution side by side (one graph, forked and joined), and the time per
 * convolution is the graph's over S times its runs: what a GPU shared by S processes under MPS
 * gets from each kernel, where a kernel that spreads over every SM for a short time may cost
 * more than one that uses a few for longer. The streams share the workspaces, so these runs'
 * outputs are not checked.
 *
 * Prints a markdown table and summary lines; --csv-out writes the rows as CSV. The --sweep-*
 * options force kernel variants the router does not choose; the production library builds only
 * the variants the router can choose, so the depthwise and direct sweeps need a build with
 * -DCONVD_GPU_SWEEP_KERNELS=ON (the sweep says so when a variant is missing).
 */
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <cublas_api.h>

#include "cliargs.h"
#include "convd_kernels.h"
#include "gpu_dev.h"

#define MAX_ROWS 512

struct row {
    char shape[64];
    enum convd_dtype dtype;
    enum convd_layout layout;
    int groups;
    char kernel[24]; /* the routing rule, or the family asked for */
    double ours_us, cudnn_us, floor_us, frac, rel_err;
    double ours_call_us, cudnn_call_us; /* per-call event timing, host work included */
    /* Per convolution with --streams S side by side; 0: not run. */
    double ours_conc_us, cudnn_conc_us;
    char plan[200];
    char bound[8];
    int ok; /* output matches cuDNN's */
};

struct opts {
    const char *shapes;
    const char *csv_out;
    const char *only;
    int iters, warmup;
    int dt_mask, lay_mask;
    int no_cudnn;
    int sweep_mma;
    int sweep_pdl;
    int sweep_dw;
    int sweep_nchw;
    int sweep_fma;
    int sweep_tf32;
    int sweep_direct;
    int tf32;    /* fp32 problems allow TF32, and cuDNN may use it too */
    int streams; /* --streams: also time S streams side by side (0: not) */
    enum convd_gpu_family family;
};

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            die("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_));               \
    } while (0)

/* ---- cuDNN through dlopen ---- */

struct dnn {
    void *lib;
    cudnnHandle_t h;
    __typeof__(&cudnnCreate) create;
    __typeof__(&cudnnGetErrorString) err;
    __typeof__(&cudnnCreateTensorDescriptor) mk_tensor;
    __typeof__(&cudnnSetTensor4dDescriptor) set_tensor;
    __typeof__(&cudnnDestroyTensorDescriptor) rm_tensor;
    __typeof__(&cudnnCreateFilterDescriptor) mk_filter;
    __typeof__(&cudnnSetFilter4dDescriptor) set_filter;
    __typeof__(&cudnnDestroyFilterDescriptor) rm_filter;
    __typeof__(&cudnnCreateConvolutionDescriptor) mk_conv;
    __typeof__(&cudnnSetConvolution2dDescriptor) set_conv;
    __typeof__(&cudnnSetConvolutionGroupCount) set_groups;
    __typeof__(&cudnnSetConvolutionMathType) set_math;
    __typeof__(&cudnnDestroyConvolutionDescriptor) rm_conv;
    __typeof__(&cudnnGetConvolutionForwardAlgorithmMaxCount) algo_max;
    __typeof__(&cudnnFindConvolutionForwardAlgorithmEx) find;
    __typeof__(&cudnnConvolutionForward) fwd;
    __typeof__(&cudnnSetStream) set_stream;
};

/* Everything runs on this stream (graph capture needs a non-default stream)... */
static cudaStream_t g_stream;
/* ...except the side-by-side runs of --streams, which put each run on g_run (g_stream
 * otherwise), the streams beside g_stream being g_side[1..S-1]. */
#define MAX_STREAMS 64
static cudaStream_t g_run, g_side[MAX_STREAMS];

static void *sym(void *lib, const char *name)
{
    void *p = dlsym(lib, name);
    if (p == NULL)
        die("cuDNN: missing symbol %s", name);
    return p;
}

static int dnn_open(struct dnn *d)
{
    memset(d, 0, sizeof(*d));
    d->lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (d->lib == NULL) {
        fprintf(stderr, "cuDNN not available: %s\n", dlerror());
        return -1;
    }
    d->create = sym(d->lib, "cudnnCreate");
    d->err = sym(d->lib, "cudnnGetErrorString");
    d->mk_tensor = sym(d->lib, "cudnnCreateTensorDescriptor");
    d->set_tensor = sym(d->lib, "cudnnSetTensor4dDescriptor");
    d->rm_tensor = sym(d->lib, "cudnnDestroyTensorDescriptor");
    d->mk_filter = sym(d->lib, "cudnnCreateFilterDescriptor");
    d->set_filter = sym(d->lib, "cudnnSetFilter4dDescriptor");
    d->rm_filter = sym(d->lib, "cudnnDestroyFilterDescriptor");
    d->mk_conv = sym(d->lib, "cudnnCreateConvolutionDescriptor");
    d->set_conv = sym(d->lib, "cudnnSetConvolution2dDescriptor");
    d->set_groups = sym(d->lib, "cudnnSetConvolutionGroupCount");
    d->set_math = sym(d->lib, "cudnnSetConvolutionMathType");
    d->rm_conv = sym(d->lib, "cudnnDestroyConvolutionDescriptor");
    d->algo_max = sym(d->lib, "cudnnGetConvolutionForwardAlgorithmMaxCount");
    d->find = sym(d->lib, "cudnnFindConvolutionForwardAlgorithmEx");
    d->fwd = sym(d->lib, "cudnnConvolutionForward");
    d->set_stream = sym(d->lib, "cudnnSetStream");
    cudnnStatus_t st = d->create(&d->h);
    if (st != CUDNN_STATUS_SUCCESS) {
        fprintf(stderr, "cudnnCreate: %s\n", d->err(st));
        return -1;
    }
    d->set_stream(d->h, g_stream);
    return 0;
}

/* ---- cuBLAS for the matmul ceilings ---- */

typedef int (*blas_create_t)(void **);
typedef int (*blas_gemmex_t)(void *, int, int, int, int, int, const void *, const void *, int, int,
                             const void *, int, int, const void *, void *, int, int, int, int);

/* TFLOP/s of an m = n = k GEMM in dtype (CUDA_R_16BF or CUDA_R_32F) with compute type `compute`
 * (CUBLAS_COMPUTE_32F: exact fp32; CUBLAS_COMPUTE_32F_FAST_TF32: TF32 tensor cores). Returns 0 on
 * failure. */
static double gemm_rate(void *lib, void *h, int dt, int m, int compute)
{
    blas_gemmex_t gemm = (blas_gemmex_t)dlsym(lib, "cublasGemmEx");
    if (gemm == NULL)
        return 0.0;
    const size_t es = dt == CUDA_R_32F ? 4 : 2;
    void *a, *b, *c;
    CK(cudaMalloc(&a, (size_t)m * m * es));
    CK(cudaMalloc(&b, (size_t)m * m * es));
    CK(cudaMalloc(&c, (size_t)m * m * es));
    enum convd_dtype cd = dt == CUDA_R_32F ? CONVD_DTYPE_FP32 : CONVD_DTYPE_BF16;
    convd_gpu_fill_random(a, cd, (size_t)m * m, 1);
    convd_gpu_fill_random(b, cd, (size_t)m * m, 2);
    const float alpha = 1.0f, beta = 0.0f;
    double best = 0.0;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; i++)
        if (gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &alpha, a, dt, m, b, dt, m, &beta, c, dt, m,
                 compute, CUBLAS_GEMM_DEFAULT) != 0)
            goto out;
    for (int rep = 0; rep < 3; rep++) {
        const int reps = 10;
        CK(cudaEventRecord(e0, 0));
        for (int i = 0; i < reps; i++)
            gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &alpha, a, dt, m, b, dt, m, &beta, c, dt, m,
                 compute, CUBLAS_GEMM_DEFAULT);
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        double r = 2.0 * m * (double)m * m * reps / (ms * 1e-3) / 1e12;
        if (r > best)
            best = r;
    }
out:
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    return best;
}

struct ceilings {
    double bw;               /* bytes/s, read + written */
    double bf16, fp32, tf32; /* FLOP/s */
    int measured_bw, measured_mm;
};

static void measure_ceilings(struct ceilings *c)
{
    c->bw = 4.20e12;
    c->bf16 = 748e12;
    c->fp32 = 50.8e12;
    c->tf32 = c->bf16 / 2; /* the tensor cores' TF32 rate is half their 16-bit rate */
    c->measured_bw = c->measured_mm = 0;
    const size_t bytes = (size_t)1 << 30;
    void *a, *b;
    if (cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess) {
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        CK(cudaMemset(a, 1, bytes));
        double best = 0.0;
        for (int rep = 0; rep < 5; rep++) {
            CK(cudaEventRecord(e0, 0));
            for (int i = 0; i < 4; i++)
                CK(cudaMemcpyAsync(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice,
                                   0));
            CK(cudaEventRecord(e1, 0));
            CK(cudaEventSynchronize(e1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            double bw = 2.0 * bytes * 4 / (ms * 1e-3);
            if (bw > best)
                best = bw;
        }
        c->bw = best;
        c->measured_bw = 1;
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        cudaFree(a);
        cudaFree(b);
    } else {
        cudaGetLastError();
    }
    const char *names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    void *lib = NULL;
    for (int i = 0; i < 3 && lib == NULL; i++)
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "cuBLAS not available (%s): using the baseline's matmul rates\n",
                dlerror());
        return;
    }
    blas_create_t create = (blas_create_t)dlsym(lib, "cublasCreate_v2");
    void *h = NULL;
    if (create == NULL || create(&h) != 0) {
        fprintf(stderr, "cublasCreate failed: using the baseline's matmul rates\n");
        return;
    }
    double bf = gemm_rate(lib, h, CUDA_R_16BF, 8192, CUBLAS_COMPUTE_32F);
    double f32 = gemm_rate(lib, h, CUDA_R_32F, 4096, CUBLAS_COMPUTE_32F);
    double tf = gemm_rate(lib, h, CUDA_R_32F, 8192, CUBLAS_COMPUTE_32F_FAST_TF32);
    if (bf > 0.0 && f32 > 0.0 && tf > 0.0) {
        c->bf16 = bf * 1e12;
        c->fp32 = f32 * 1e12;
        c->tf32 = tf * 1e12;
        c->measured_mm = 1;
    }
}

/* ---- one measurement ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct bufs {
    void *ws; /* workspace for our NCHW runs (NHWC copies) */
    size_t ws_bytes;
    int nbuf;
    void **x, **y;
    void *w;
    void *y_check; /* cuDNN's output of buffer 0 */
};

typedef int (*run_fn)(void *ctx, int buf);

/* Median microseconds of fn over iters timed runs after warmup, rotating buffers. Returns <0 on
 * failure. */
static double time_fn(run_fn fn, void *ctx, int nbuf, int iters, int warmup)
{
    for (int i = 0; i < warmup; i++)
        if (fn(ctx, i % nbuf) != 0)
            return -1.0;
    cudaEvent_t *ev = malloc(sizeof(cudaEvent_t) * 2 * (size_t)iters);
    double *us = malloc(sizeof(double) * (size_t)iters);
    if (ev == NULL || us == NULL)
        die("out of memory");
    for (int i = 0; i < 2 * iters; i++)
        CK(cudaEventCreate(&ev[i]));
    int bad = 0;
    for (int i = 0; i < iters; i++) {
        CK(cudaEventRecord(ev[2 * i], g_stream));
        if (fn(ctx, (warmup + i) % nbuf) != 0)
            bad = 1;
        CK(cudaEventRecord(ev[2 * i + 1], g_stream));
    }
    CK(cudaDeviceSynchronize());
    for (int i = 0; i < iters; i++) {
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
        us[i] = ms * 1000.0;
    }
    for (int i = 0; i < 2 * iters; i++)
        cudaEventDestroy(ev[i]);
    double m = bad ? -1.0 : median(us, iters);
    free(ev);
    free(us);
    return m;
}

/* The median over `reps` timed launches of an instantiated graph (after two untimed ones), in
 * microseconds divided by `runs`, the runs one launch makes. */
static double graph_median_us(cudaGraphExec_t exec, int reps, double runs)
{
    double *us = malloc(sizeof(double) * (size_t)reps);
    if (us == NULL)
        die("out of memory");
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 2; i++)
        CK(cudaGraphLaunch(exec, g_stream));
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(e0, g_stream));
        CK(cudaGraphLaunch(exec, g_stream));
        CK(cudaEventRecord(e1, g_stream));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        us[r] = ms * 1000.0 / runs;
    }
    const double m = median(us, reps);
    free(us);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return m;
}

/* Device time per run: `per` runs (rotating buffers) captured in a CUDA graph, the graph launched
 * `reps` times, each launch timed with events; median over launches divided by `per`. Host-side
 * work (our planning and launch, cuDNN's dispatch) is out of the measurement. <0 on failure. */
static double time_graph(run_fn fn, void *ctx, int nbuf, int reps)
{
    int per = 2 * nbuf;
    if (per < 20)
        per = 20;
    if (per > 128)
        per = 128;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    if (cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
        cudaGetLastError();
        return -1.0;
    }
    int bad = 0;
    for (int i = 0; i < per; i++)
        if (fn(ctx, i % nbuf) != 0)
            bad = 1;
    if (cudaStreamEndCapture(g_stream, &graph) != cudaSuccess || bad) {
        cudaGetLastError();
        if (graph)
            cudaGraphDestroy(graph);
        return -1.0;
    }
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
        cudaGetLastError();
        cudaGraphDestroy(graph);
        return -1.0;
    }
    const double m = graph_median_us(exec, reps, per);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return m;
}

/* Device time per run with `nstreams` streams side by side: each stream `per` runs, forked from
 * and joined into g_stream in one captured graph; the graph's median time over `reps` launches
 * divided by nstreams * per. <0 on failure. */
static double time_graph_conc(run_fn fn, void *ctx, int nbuf, int reps, int nstreams)
{
    const int per = 20;
    cudaEvent_t fork, join[MAX_STREAMS];
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    for (int s = 1; s < nstreams; s++)
        CK(cudaEventCreateWithFlags(&join[s], cudaEventDisableTiming));
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    int bad = cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeRelaxed) != cudaSuccess ||
              cudaEventRecord(fork, g_stream) != cudaSuccess;
    for (int s = 0; s < nstreams && !bad; s++) {
        g_run = s == 0 ? g_stream : g_side[s];
        if (s > 0 && cudaStreamWaitEvent(g_run, fork, 0) != cudaSuccess)
            bad = 1;
        for (int i = 0; i < per && !bad; i++)
            if (fn(ctx, (s * per + i) % nbuf) != 0)
                bad = 1;
        if (s > 0 && !bad &&
            (cudaEventRecord(join[s], g_run) != cudaSuccess ||
             cudaStreamWaitEvent(g_stream, join[s], 0) != cudaSuccess))
            bad = 1;
    }
    g_run = g_stream;
    if (cudaStreamEndCapture(g_stream, &graph) != cudaSuccess || bad ||
        cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
        cudaGetLastError();
        bad = 1;
    }
    const double m = bad ? -1.0 : graph_median_us(exec, reps, (double)per * nstreams);
    if (exec)
        cudaGraphExecDestroy(exec);
    if (graph)
        cudaGraphDestroy(graph);
    cudaEventDestroy(fork);
    for (int s = 1; s < nstreams; s++)
        cudaEventDestroy(join[s]);
    return m;
}

struct ours_ctx {
    const struct convd_problem *p;
    struct bufs *b;
    enum convd_gpu_family fam;
};

static int ours_run(void *vctx, int buf)
{
    struct ours_ctx *c = vctx;
    struct convd_tensors t = {c->b->x[buf], c->b->w, NULL, c->b->y[buf]};
    return convd_gpu_conv_family(c->p, &t, 1, c->b->ws, c->b->ws_bytes, (void *)g_run, c->fam);
}

struct dnn_ctx {
    struct dnn *d;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    cudnnConvolutionFwdAlgo_t algo;
    void *ws;
    size_t ws_bytes;
    struct bufs *b;
    cudaStream_t stream; /* the handle's stream */
};

static int dnn_run(void *vctx, int buf)
{
    struct dnn_ctx *c = vctx;
    const float alpha = 1.0f, beta = 0.0f;
    if (c->stream != g_run) {
        c->d->set_stream(c->d->h, g_run);
        c->stream = g_run;
    }
    cudnnStatus_t st = c->d->fwd(c->d->h, &alpha, c->xd, c->b->x[buf], c->wd, c->b->w, c->cd,
                                 c->algo, c->ws, c->ws_bytes, &beta, c->yd, c->b->y[buf]);
    return st == CUDNN_STATUS_SUCCESS ? 0 : -1;
}

static cudnnDataType_t dnn_type(enum convd_dtype dt)
{
    return dt == CONVD_DTYPE_FP32   ? CUDNN_DATA_FLOAT
           : dt == CONVD_DTYPE_FP16 ? CUDNN_DATA_HALF
                                    : CUDNN_DATA_BFLOAT16;
}

/* Sets up descriptors and finds the fastest algorithm. Returns 0 or -1 (unsupported). */
static int dnn_setup(struct dnn_ctx *c, struct dnn *d, const struct convd_problem *p,
                     const struct convd_problem_sizes *z, struct bufs *b)
{
    memset(c, 0, sizeof(*c));
    c->d = d;
    c->b = b;
    const cudnnTensorFormat_t fmt =
        p->layout == CONVD_LAYOUT_NHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    const cudnnDataType_t t = dnn_type(p->dtype);
    if (d->mk_tensor(&c->xd) || d->mk_tensor(&c->yd) || d->mk_filter(&c->wd) || d->mk_conv(&c->cd))
        return -1;
    if (d->set_tensor(c->xd, fmt, t, p->n, p->c, p->h, p->w) ||
        d->set_tensor(c->yd, fmt, t, p->n, p->k, z->out_h, z->out_w) ||
        d->set_filter(c->wd, t, fmt, p->k, p->c / p->groups, p->r, p->s) ||
        d->set_conv(c->cd, p->pad_top, p->pad_left, p->stride_h, p->stride_w, p->dil_h, p->dil_w,
                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT) ||
        d->set_groups(c->cd, p->groups) ||
        d->set_math(c->cd, p->dtype == CONVD_DTYPE_FP32 && !p->allow_tf32 ? CUDNN_FMA_MATH
                                                                          : CUDNN_DEFAULT_MATH))
        return -1;
    int maxn = 0;
    d->algo_max(d->h, &maxn);
    if (maxn <= 0)
        maxn = 8;
    cudnnConvolutionFwdAlgoPerf_t perf[16];
    if (maxn > 16)
        maxn = 16;
    const size_t ws_limit = (size_t)1 << 30;
    void *ws = NULL;
    if (cudaMalloc(&ws, ws_limit) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    int got = 0;
    cudnnStatus_t st = d->find(d->h, c->xd, b->x[0], c->wd, b->w, c->cd, c->yd, b->y[0], maxn, &got,
                               perf, ws, ws_limit);
    cudaFree(ws);
    if (st != CUDNN_STATUS_SUCCESS)
        return -1;
    for (int i = 0; i < got; i++)
        if (perf[i].status == CUDNN_STATUS_SUCCESS) {
            c->algo = perf[i].algo;
            c->ws_bytes = perf[i].memory;
            if (c->ws_bytes > 0 && cudaMalloc(&c->ws, c->ws_bytes) != cudaSuccess) {
                cudaGetLastError();
                return -1;
            }
            return 0;
        }
    return -1;
}

static void dnn_teardown(struct dnn_ctx *c)
{
    if (c->d == NULL)
        return;
    if (c->xd)
        c->d->rm_tensor(c->xd);
    if (c->yd)
        c->d->rm_tensor(c->yd);
    if (c->wd)
        c->d->rm_filter(c->wd);
    if (c->cd)
        c->d->rm_conv(c->cd);
    if (c->ws)
        cudaFree(c->ws);
}

static float load_val(enum convd_dtype dt, const void *p, size_t i)
{
    switch (dt) {
    case CONVD_DTYPE_FP32:
        return ((const float *)p)[i];
    case CONVD_DTYPE_FP16:
        return convd_f16_to_f32(((const uint16_t *)p)[i]);
    case CONVD_DTYPE_BF16:
        return convd_bf16_to_f32(((const uint16_t *)p)[i]);
    }
    return NAN;
}

/* ||a - b|| / ||b|| over host copies of two device outputs; INFINITY on NaN. */
static double rel_err_dev(enum convd_dtype dt, const void *da, const void *db, size_t elems)
{
    const size_t bytes = elems * convd_dtype_size(dt);
    void *a = malloc(bytes), *b = malloc(bytes);
    if (a == NULL || b == NULL)
        die("out of memory");
    CK(cudaMemcpy(a, da, bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b, db, bytes, cudaMemcpyDeviceToHost));
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < elems; i++) {
        double x = load_val(dt, a, i), y = load_val(dt, b, i);
        if (!isfinite(x) || !isfinite(y)) {
            num = INFINITY;
            break;
        }
        num += (x - y) * (x - y);
        den += y * y;
    }
    free(a);
    free(b);
    return isinf(num) ? INFINITY : sqrt(num) / (den > 0 ? sqrt(den) : 1e-30);
}

static int bench_one(const struct opts *o, struct dnn *d, const struct ceilings *ce,
                     const struct cli_shape *sh, enum convd_dtype dt, enum convd_layout lay,
                     struct row *out)
{
    struct convd_problem p;
    convd_problem_init(&p, 1, 1, 1, 1, 1, 1, 1, 1);
    cli_shape_apply(sh, &p);
    p.dtype = dt;
    p.layout = lay;
    p.allow_tf32 = o->tf32 && dt == CONVD_DTYPE_FP32;
    struct convd_problem_sizes z;
    char why[160];
    if (convd_problem_sizes(&p, &z, why, sizeof(why)) != 0) {
        fprintf(stderr, "%s: %s\n", sh->name, why);
        return -1;
    }
    memset(out, 0, sizeof(*out));
    memcpy(out->shape, sh->name, sizeof(out->shape));
    out->shape[sizeof(out->shape) - 1] = '\0';
    out->dtype = dt;
    out->layout = lay;
    out->groups = sh->groups;
    enum convd_gpu_family fam =
        o->family == CONVD_GPU_FAMILY_AUTO ? convd_gpu_route(&p) : o->family;
    snprintf(out->kernel, sizeof(out->kernel), "%s",
             o->family == CONVD_GPU_FAMILY_AUTO ? convd_gpu_dev_rule(&p)
                                                : convd_gpu_family_name(fam));

    struct bufs b;
    const double per = (double)(z.input_bytes + z.output_bytes);
    b.nbuf = (int)ceil(200e6 / per);
    if (b.nbuf < 2)
        b.nbuf = 2;
    if (b.nbuf > 64)
        b.nbuf = 64;
    b.x = calloc((size_t)b.nbuf, sizeof(void *));
    b.y = calloc((size_t)b.nbuf, sizeof(void *));
    for (int i = 0; i < b.nbuf; i++) {
        CK(cudaMalloc(&b.x[i], z.input_bytes));
        CK(cudaMalloc(&b.y[i], z.output_bytes));
        convd_gpu_fill_random(b.x[i], dt, z.input_elems, 1000 + (uint64_t)i);
    }
    CK(cudaMalloc(&b.w, z.weight_bytes));
    /* Workspace for every route: NCHW copies of NHWC problems (input, weights, output) or NHWC
     * copies of NCHW ones (input, weights), 256-byte aligned each. */
    b.ws_bytes = z.input_bytes + z.weight_bytes + z.output_bytes + 1024;
    CK(cudaMalloc(&b.ws, b.ws_bytes));
    CK(cudaMalloc(&b.y_check, z.output_bytes));
    convd_gpu_fill_random(b.w, dt, z.weight_elems, 7);
    CK(cudaDeviceSynchronize());

    /* AUTO runs what the router chooses: a family asked for by name takes its first rule that
     * fits, whatever the rule's `when` says (fma-tf32 ahead of fma-gemm below kpg 32). */
    struct ours_ctx oc = {&p, &b, o->family};
    convd_gpu_describe(&p, o->family, out->plan, sizeof(out->plan));
    out->ours_call_us = time_fn(ours_run, &oc, b.nbuf, o->iters, o->warmup);
    out->ours_us = time_graph(ours_run, &oc, b.nbuf, o->iters > 15 ? 15 : o->iters);
    if (out->ours_us <= 0)
        out->ours_us = out->ours_call_us;
    if (o->streams > 1)
        out->ours_conc_us = time_graph_conc(ours_run, &oc, b.nbuf, 10, o->streams);
    out->cudnn_us = out->cudnn_call_us = -1.0;
    out->rel_err = NAN;
    if (d != NULL) {
        struct dnn_ctx dc;
        if (dnn_setup(&dc, d, &p, &z, &b) == 0) {
            out->cudnn_call_us = time_fn(dnn_run, &dc, b.nbuf, o->iters, o->warmup);
            out->cudnn_us = time_graph(dnn_run, &dc, b.nbuf, o->iters > 15 ? 15 : o->iters);
            if (out->cudnn_us <= 0)
                out->cudnn_us = out->cudnn_call_us;
            if (o->streams > 1)
                out->cudnn_conc_us = time_graph_conc(dnn_run, &dc, b.nbuf, 10, o->streams);
            /* Same input, both outputs, compared. */
            void *y0 = b.y[0];
            dnn_run(&dc, 0);
            CK(cudaStreamSynchronize(g_stream));
            /* On g_stream: it does not synchronise with the legacy stream, so a plain
             * cudaMemcpy/cudaMemset could still be running when our kernel starts. */
            CK(cudaMemcpyAsync(b.y_check, y0, z.output_bytes, cudaMemcpyDeviceToDevice, g_stream));
            CK(cudaMemsetAsync(y0, 0xff, z.output_bytes, g_stream));
            if (ours_run(&oc, 0) == 0) {
                CK(cudaStreamSynchronize(g_stream));
                out->rel_err = rel_err_dev(dt, y0, b.y_check, z.output_elems);
            }
        } else {
            fprintf(stderr, "%s %s %s: cuDNN has no algorithm\n", sh->name, convd_dtype_name(dt),
                    convd_layout_name(lay));
        }
        dnn_teardown(&dc);
    }
    /* Two TF32 results (ours, cuDNN's) differ by about 5e-4 on random data. */
    const double tol = dt == CONVD_DTYPE_FP32 ? (p.allow_tf32 ? 3e-3 : 1e-4) : 2e-2;
    out->ok = isnan(out->rel_err) || out->rel_err <= tol;

    const double rate = dt == CONVD_DTYPE_FP32 ? (p.allow_tf32 ? ce->tf32 : ce->fp32) : ce->bf16;
    const double t_flop = (double)z.flops / rate * 1e6;
    const double t_mem = (double)(z.input_bytes + z.weight_bytes + z.output_bytes) / ce->bw * 1e6;
    out->floor_us = t_flop > t_mem ? t_flop : t_mem;
    snprintf(out->bound, sizeof(out->bound), "%s", t_flop > t_mem ? "compute" : "mem");
    out->frac = out->ours_us > 0 ? out->floor_us / out->ours_us : 0.0;

    /* --sweep-dw: the tiled depthwise kernel and every shape of the direct ones that fits the
     * problem, same buffers, for the routing decision. */
    if (o->sweep_dw && convd_gpu_family_check(&p, CONVD_GPU_FAMILY_DEPTHWISE, NULL, 0) == 0) {
        for (int mode = 0; convd_gpu_tune_dw_direct(mode) == 0; mode++) {
            char d2[200];
            convd_gpu_describe(&p, CONVD_GPU_FAMILY_DEPTHWISE, d2, sizeof(d2));
            if (mode > 0 && strstr(d2, "direct") == NULL)
                continue; /* shape for another filter or stride */
            double us = time_graph(ours_run, &oc, b.nbuf, 10);
            printf("sweep %s %s %s dw mode %d: %.1f us (default %.1f us) %s\n", sh->name,
                   convd_dtype_name(dt), convd_layout_name(lay), mode, us, out->ours_us, d2);
        }
        convd_gpu_tune_dw_direct(-1);
    }

    /* --sweep-nchw: NCHW without the workspace (kernels gather NCHW directly, no transposed
     * copies), for the routing decision. */
    if (o->sweep_nchw && lay == CONVD_LAYOUT_NCHW && b.ws != NULL) {
        void *ws = b.ws;
        const size_t ws_bytes = b.ws_bytes;
        b.ws = NULL;
        b.ws_bytes = 0;
        const double us = time_graph(ours_run, &oc, b.nbuf, 10);
        printf("sweep %s %s nchw without workspace: %.1f us (with: %.1f us)\n", sh->name,
               convd_dtype_name(dt), us, out->ours_us);
        b.ws = ws;
        b.ws_bytes = ws_bytes;
    }

    /* --sweep-fma: fma-family problems on the direct FMA kernel (gemm mode 0) and, where it
     * takes them, the implicit GEMM regardless of its planner's fill estimate (mode 2), then
     * the direct kernel without 3 outputs per thread, same buffers, for the routing. */
    if (o->sweep_fma && fam == CONVD_GPU_FAMILY_FMA) {
        for (int mode = 0; mode <= 2; mode += 2) {
            convd_gpu_tune_fma_gemm(mode);
            char d2[200];
            convd_gpu_describe(&p, CONVD_GPU_FAMILY_FMA, d2, sizeof(d2));
            if (mode == 2 && strstr(d2, "gemm") == NULL)
                continue;
            const double us = time_graph(ours_run, &oc, b.nbuf, 10);
            printf("sweep %s %s %s fma gemm mode %d: %.1f us (default %.1f us) %s\n", sh->name,
                   convd_dtype_name(dt), convd_layout_name(lay), mode, us, out->ours_us, d2);
        }
        convd_gpu_tune_fma_gemm(1);
        /* The direct kernel without 3 outputs per thread, where the plan has them. */
        char d3[200];
        convd_gpu_describe(&p, CONVD_GPU_FAMILY_FMA, d3, sizeof(d3));
        if (strstr(d3, "tn 3 ") != NULL) {
            convd_gpu_tune_fma_outputs3(0);
            convd_gpu_describe(&p, CONVD_GPU_FAMILY_FMA, d3, sizeof(d3));
            const double us = time_graph(ours_run, &oc, b.nbuf, 10);
            printf("sweep %s %s %s fma without 3 outputs: %.1f us (default %.1f us) %s\n", sh->name,
                   convd_dtype_name(dt), convd_layout_name(lay), us, out->ours_us, d3);
            convd_gpu_tune_fma_outputs3(1);
        }
    }

    /* --sweep-tf32: fp32 rows that allow TF32, on the mma family's TF32 kernels by name (whatever
     * the policy's mma_tf32 says), same buffers, checked against cuDNN's output: for the routing.
     */
    const enum convd_gpu_family fam0 = oc.fam;
    oc.fam = CONVD_GPU_FAMILY_MMA;
    /* A trial call decides, not convd_gpu_family_check: that offers no workspace, and NCHW rows
     * run on NHWC copies in it. */
    if (o->sweep_tf32 && p.allow_tf32 && ours_run(&oc, 0) == 0) {
        char d2[200];
        convd_gpu_describe(&p, CONVD_GPU_FAMILY_MMA, d2, sizeof(d2));
        const double us = time_graph(ours_run, &oc, b.nbuf, 10);
        double err = NAN;
        if (out->cudnn_us > 0) { /* y_check holds cuDNN's output for buffer 0 */
            CK(cudaMemsetAsync(b.y[0], 0xff, z.output_bytes, g_stream));
            if (ours_run(&oc, 0) == 0) {
                CK(cudaStreamSynchronize(g_stream));
                err = rel_err_dev(dt, b.y[0], b.y_check, z.output_elems);
            }
        }
        printf("sweep %s fp32 %s mma-tf32: %.1f us (default %.1f us, cuDNN %.1f us: %.2fx) "
               "err %.1e %s\n",
               sh->name, convd_layout_name(lay), us, out->ours_us, out->cudnn_us,
               out->cudnn_us > 0 && us > 0 ? out->cudnn_us / us : 0.0, err, d2);
    }
    oc.fam = fam0;

    /* --sweep-direct, NHWC: problems the direct family can run on NCHW copies, routed with and
     * without that route. */
    if (o->sweep_direct && lay == CONVD_LAYOUT_NHWC &&
        convd_gpu_family_check(&p, CONVD_GPU_FAMILY_DIRECT, NULL, 0) == 0) {
        oc.fam = CONVD_GPU_FAMILY_AUTO;
        for (int m = 0; m <= 1; m++) {
            convd_gpu_tune_direct_nhwc(m);
            char d2[200];
            convd_gpu_describe(&p, CONVD_GPU_FAMILY_AUTO, d2, sizeof(d2));
            const double us = time_graph(ours_run, &oc, b.nbuf, 10);
            printf("sweep %s %s nhwc via nchw direct %s: %.1f us (default %.1f us) %s\n", sh->name,
                   convd_dtype_name(dt), m ? "on" : "off", us, out->ours_us, d2);
        }
        convd_gpu_tune_direct_nhwc(-1);
        oc.fam = fam;
    }

    /* --sweep-direct: NCHW problems the direct family can run, routed without it (mode 0: the
     * route it replaces) and on it with 1, 2 and 4 rows per thread, each without and with the
     * next plane's prefetch, then with 8 outputs per thread where kpg allows, same buffers. */
    if (o->sweep_direct && lay == CONVD_LAYOUT_NCHW &&
        convd_gpu_family_check(&p, CONVD_GPU_FAMILY_DIRECT, NULL, 0) == 0) {
        static const int modes[] = {0, 1, 2, 4};
        oc.fam = CONVD_GPU_FAMILY_AUTO;    /* the router decides, not the family routed first */
        convd_gpu_tune_direct_outputs8(0); /* 4 outputs per thread here, 8 below */
        for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++)
            for (int pf = 0; pf <= (modes[m] > 0); pf++) {
                convd_gpu_tune_direct(modes[m]);
                convd_gpu_tune_direct_prefetch(pf);
                char d2[200];
                convd_gpu_describe(&p, CONVD_GPU_FAMILY_AUTO, d2, sizeof(d2));
                const double us = time_graph(ours_run, &oc, b.nbuf, 10);
                printf("sweep %s %s nchw direct mode %d prefetch %d: %.1f us (default %.1f us) "
                       "%s\n",
                       sh->name, convd_dtype_name(dt), modes[m], pf, us, out->ours_us, d2);
            }
        if (p.k / p.groups % 8 == 0) {
            convd_gpu_tune_direct(1);
            convd_gpu_tune_direct_outputs8(1);
            char d2[200];
            convd_gpu_describe(&p, CONVD_GPU_FAMILY_AUTO, d2, sizeof(d2));
            const double us = time_graph(ours_run, &oc, b.nbuf, 10);
            printf("sweep %s %s nchw direct 8 outputs: %.1f us (default %.1f us) %s\n", sh->name,
                   convd_dtype_name(dt), us, out->ours_us, d2);
            convd_gpu_tune_direct_outputs8(-1);
        }
        convd_gpu_tune_direct(-1);
        convd_gpu_tune_direct_prefetch(-1);
        oc.fam = fam;
    }

#if defined(CONVD_MMA_TRACE)
    {
        const char *tp = getenv("CONVD_TRACE_OUT");
        FILE *tf = tp ? fopen(tp, "a") : NULL;
        if (tf) {
            /* the second of two back-to-back runs (it overwrites the first's stamps) */
            CK(cudaStreamSynchronize(g_stream));
            convd_gpu_mma_trace(NULL, 1);
            CK(cudaDeviceSynchronize());
            ours_run(&oc, 0);
            ours_run(&oc, 1 % b.nbuf);
            CK(cudaStreamSynchronize(g_stream));
            enum { NB = CONVD_MMA_TRACE_BLOCKS, NE = CONVD_MMA_TRACE_EVENTS };
            unsigned long long *tr = malloc((size_t)NB * NE * sizeof(*tr));
            convd_gpu_mma_trace(tr, 0);
            for (int bi = 0; bi < NB; bi++)
                for (int e = 0; e < NE; e++)
                    if (tr[bi * NE + e])
                        fprintf(tf, "%s %s %d %d %llu %llu\n", sh->name, convd_dtype_name(dt), bi,
                                e, tr[bi * NE + e] >> 56, tr[bi * NE + e] & ((1ull << 56) - 1));
            free(tr);
            fclose(tf);
        }
    }
#endif
    /* Programmatic launch: off, and (NCHW through transposed copies) with the transposes or the
     * kernel after them launched plainly. */
    for (int mode = 0; o->sweep_pdl && mode <= 3; mode++) {
        if (mode >= 2 && lay != CONVD_LAYOUT_NCHW)
            break;
        convd_gpu_tune_pdl(mode);
        const double us = time_graph(ours_run, &oc, b.nbuf, 10);
        printf("sweep %s %s %s pdl mode %d: %.1f us (default %.1f us)\n", sh->name,
               convd_dtype_name(dt), convd_layout_name(lay), mode, us, out->ours_us);
    }
    convd_gpu_tune_pdl(-1);

    if (o->sweep_mma && fam == CONVD_GPU_FAMILY_MMA) {
        for (int cfg = 0; cfg < 16; cfg++) {
            if (convd_gpu_tune_mma_cfg(cfg) != 0)
                break;
            /* Each layout with the sm_90 tensor copies where it takes them, then without. */
            for (int tma = 1; tma >= 0; tma--) {
                convd_gpu_tune_mma_tma(tma ? -1 : 0);
                if (convd_gpu_family_check(&p, CONVD_GPU_FAMILY_MMA, NULL, 0) != 0)
                    continue;
                char d2[200];
                convd_gpu_describe(&p, CONVD_GPU_FAMILY_MMA, d2, sizeof(d2));
                if (tma && strstr(d2, " tma") == NULL)
                    continue; /* the same kernel as the pass without */
                double us = time_graph(ours_run, &oc, b.nbuf, 10);
                printf("sweep %s %s %s cfg %d: %.1f us (%s)\n", sh->name, convd_dtype_name(dt),
                       convd_layout_name(lay), cfg, us, d2);
                /* Tensor copies: each forced ring depth, then launched without programmatic
                 * serialization. */
                for (int nst = 1; tma && nst <= 4; nst++) {
                    convd_gpu_tune_mma_stages(nst);
                    char d3[200];
                    convd_gpu_describe(&p, CONVD_GPU_FAMILY_MMA, d3, sizeof(d3));
                    us = time_graph(ours_run, &oc, b.nbuf, 10);
                    printf("sweep %s %s %s cfg %d: %.1f us (%s, %d stages forced)\n", sh->name,
                           convd_dtype_name(dt), convd_layout_name(lay), cfg, us, d3, nst);
                }
                convd_gpu_tune_mma_stages(-1);
                if (tma) {
                    convd_gpu_tune_mma_prefetch(0);
                    us = time_graph(ours_run, &oc, b.nbuf, 10);
                    convd_gpu_tune_mma_prefetch(-1);
                    printf("sweep %s %s %s cfg %d: %.1f us (%s, no prefetch)\n", sh->name,
                           convd_dtype_name(dt), convd_layout_name(lay), cfg, us, d2);
                    convd_gpu_tune_pdl(0);
                    us = time_graph(ours_run, &oc, b.nbuf, 10);
                    convd_gpu_tune_pdl(-1);
                    printf("sweep %s %s %s cfg %d: %.1f us (%s, no pdl)\n", sh->name,
                           convd_dtype_name(dt), convd_layout_name(lay), cfg, us, d2);
                }
            }
        }
        convd_gpu_tune_mma_tma(-1);
        convd_gpu_tune_mma_cfg(-1);
    }

    for (int i = 0; i < b.nbuf; i++) {
        cudaFree(b.x[i]);
        cudaFree(b.y[i]);
    }
    cudaFree(b.w);
    cudaFree(b.ws);
    cudaFree(b.y_check);
    free(b.x);
    free(b.y);
    cudaGetLastError();
    return 0;
}

/* ---- shapes, options, report ---- */

/* The rows of a shapes CSV (malloc'ed), at most max of them; dies on an error. */
static struct cli_shape *load_shapes(const char *path, int max, int *ret_count)
{
    struct cli_shape *rows = NULL;
    size_t count = 0;
    char why[320];
    if (cli_shapes_load(path, &rows, &count, why, sizeof(why)) != 0)
        die("%s", why);
    if (count > (size_t)max)
        die("%s: more than %d shapes", path, max);
    *ret_count = (int)count;
    return rows;
}

/* Whether `name` is one of the comma-separated names of `list`. */
static int name_listed(const char *list, const char *name)
{
    const size_t len = strlen(name);
    for (const char *p = list; *p != '\0';) {
        const char *end = strchr(p, ',');
        const size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
        if (n == len && strncmp(p, name, n) == 0)
            return 1;
        if (end == NULL)
            break;
        p = end + 1;
    }
    return 0;
}

static void usage(void)
{
    printf("usage: convd-bench-kernels [--shapes FILE] [--csv-out FILE] [--dtypes fp16,bf16,fp32]\n"
           "         [--layouts nhwc,nchw] [--only NAME,...] [--iters N] [--warmup N]\n"
           "         [--family auto|depthwise|fma|mma|generic|direct] [--no-cudnn] [--tf32]\n"
           "         [--tune KNOB=VALUE]... (a knob of the development policy, gpu_dev.h)\n"
           "         [--streams S] (also time S streams side by side, 2 to 64)\n"
           "         [--sweep-mma] [--sweep-pdl] [--sweep-dw] [--sweep-nchw] [--sweep-fma] "
           "[--sweep-direct] [--sweep-tf32]\n"
           "(the depthwise and direct sweeps reach every variant only in a build with\n"
           " -DCONVD_GPU_SWEEP_KERNELS=ON)\n");
}

static int parse_mask(const char *s, int is_dtype)
{
    int mask = 0;
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *tok = strtok(buf, ","); tok != NULL; tok = strtok(NULL, ",")) {
        if (is_dtype) {
            enum convd_dtype d;
            if (convd_dtype_parse(tok, &d) != 0)
                die("unknown dtype %s", tok);
            mask |= 1 << d;
        } else {
            enum convd_layout l;
            if (convd_layout_parse(tok, &l) != 0)
                die("unknown layout %s", tok);
            mask |= 1 << l;
        }
    }
    return mask;
}

static void append(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Appends to a NUL-terminated buffer, truncating at its capacity. */
static void append(char *buf, size_t cap, const char *fmt, ...)
{
    size_t l = strlen(buf);
    if (l + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + l, cap - l, fmt, ap);
    va_end(ap);
}

static double geomean(const double *v, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += log(v[i]);
    return n ? exp(s / n) : 0.0;
}

static void summary(const struct row *rows, int nrows, const struct ceilings *ce, int tf32)
{
    static const enum convd_dtype dts[] = {CONVD_DTYPE_FP16, CONVD_DTYPE_BF16, CONVD_DTYPE_FP32};
    static const enum convd_layout lays[] = {CONVD_LAYOUT_NHWC, CONVD_LAYOUT_NCHW};
    printf("\nCeilings: copy %.2f TB/s (%s), bf16 matmul %.0f TFLOP/s, fp32 %.1f TFLOP/s, TF32 "
           "%.0f TFLOP/s (%s)%s\n\n",
           ce->bw / 1e12, ce->measured_bw ? "measured" : "baseline", ce->bf16 / 1e12,
           ce->fp32 / 1e12, ce->tf32 / 1e12, ce->measured_mm ? "measured, cuBLAS" : "baseline",
           tf32 ? "; fp32 rows allow TF32 on both sides (roofline at the TF32 rate)" : "");
    printf("| dtype | layout | geomean speedup | median frac | slower than cuDNN | wrong |\n");
    printf("|---|---|---:|---:|---|---:|\n");
    for (int di = 0; di < 3; di++)
        for (int li = 0; li < 2; li++) {
            double sp[MAX_ROWS], fr[MAX_ROWS];
            int ns = 0, nf = 0, wrong = 0;
            char slow[1024] = "";
            for (int i = 0; i < nrows; i++) {
                const struct row *r = &rows[i];
                if (r->dtype != dts[di] || r->layout != lays[li])
                    continue;
                if (r->ours_us > 0)
                    fr[nf++] = r->frac;
                if (!r->ok)
                    wrong++;
                if (r->ours_us > 0 && r->cudnn_us > 0) {
                    sp[ns++] = r->cudnn_us / r->ours_us;
                    if (r->ours_us > r->cudnn_us)
                        append(slow, sizeof(slow), "%s%s (%.2fx)", slow[0] ? ", " : "", r->shape,
                               r->cudnn_us / r->ours_us);
                }
            }
            if (nf == 0)
                continue;
            printf("| %s | %s | %.2fx | %.2f | %s | %d |\n", convd_dtype_name(dts[di]),
                   convd_layout_name(lays[li]), geomean(sp, ns), median(fr, nf),
                   slow[0] ? slow : "none", wrong);
        }
    /* The targets. */
    printf("\nTargets:\n");
    for (int di = 0; di < 3; di++) {
        double sp[MAX_ROWS], fr[MAX_ROWS];
        int ns = 0, nf = 0, grouped_slow = 0;
        double dense = -1.0;
        for (int i = 0; i < nrows; i++) {
            const struct row *r = &rows[i];
            if (r->dtype != dts[di] || r->layout != CONVD_LAYOUT_NHWC || r->ours_us <= 0)
                continue;
            fr[nf++] = r->frac;
            if (r->cudnn_us > 0) {
                sp[ns++] = r->cudnn_us / r->ours_us;
                if (r->groups > 1 && r->ours_us > r->cudnn_us)
                    grouped_slow++;
                if (strcmp(r->shape, "dense_resnet50_l1") == 0)
                    dense = r->cudnn_us / r->ours_us;
            }
        }
        if (nf == 0)
            continue;
        const double gm = geomean(sp, ns), md = median(fr, nf);
        if (dts[di] == CONVD_DTYPE_FP32) {
            printf("- fp32 nhwc: geomean %.2fx (target >= 3x: %s)\n", gm,
                   gm >= 3 ? "met" : "MISSED");
        } else {
            char dn[64] = "dense_resnet50_l1 not in this CSV";
            if (dense >= 0)
                snprintf(dn, sizeof(dn), "dense_resnet50_l1 %.2fx (>= 0.8x: %s)", dense,
                         dense >= 0.8 ? "met" : "MISSED");
            printf("- %s nhwc: geomean %.2fx (>= 3x: %s); grouped shapes slower than cuDNN: %d "
                   "(target 0: %s); %s; median frac %.2f (>= 0.5: %s)\n",
                   convd_dtype_name(dts[di]), gm, gm >= 3 ? "met" : "MISSED", grouped_slow,
                   grouped_slow == 0 ? "met" : "MISSED", dn, md, md >= 0.5 ? "met" : "MISSED");
        }
    }
    int nchw_slow = 0, nchw_wrong = 0;
    for (int i = 0; i < nrows; i++) {
        const struct row *r = &rows[i];
        if (r->layout != CONVD_LAYOUT_NCHW)
            continue;
        if (!r->ok)
            nchw_wrong++;
        if (r->groups > 1 && r->cudnn_us > 0 && r->ours_us > r->cudnn_us)
            nchw_slow++;
    }
    printf("- nchw: wrong outputs %d, grouped shapes slower than cuDNN's NCHW: %d (target 0: %s)\n",
           nchw_wrong, nchw_slow, nchw_slow == 0 ? "met" : "MISSED");
}

int main(int argc, char **argv)
{
    struct opts o = {
        .shapes = "bench/shapes.csv", .iters = 50, .warmup = 10, .family = CONVD_GPU_FAMILY_AUTO};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--shapes") == 0 && v) {
            o.shapes = v;
            i++;
        } else if (strcmp(a, "--csv-out") == 0 && v) {
            o.csv_out = v;
            i++;
        } else if (strcmp(a, "--only") == 0 && v) {
            o.only = v;
            i++;
        } else if (strcmp(a, "--iters") == 0 && v) {
            o.iters = atoi(v);
            i++;
        } else if (strcmp(a, "--warmup") == 0 && v) {
            o.warmup = atoi(v);
            i++;
        } else if (strcmp(a, "--dtypes") == 0 && v) {
            o.dt_mask = parse_mask(v, 1);
            i++;
        } else if (strcmp(a, "--layouts") == 0 && v) {
            o.lay_mask = parse_mask(v, 0);
            i++;
        } else if (strcmp(a, "--family") == 0 && v) {
            if (convd_gpu_family_parse(v, &o.family) != 0)
                die("unknown family %s", v);
            i++;
        } else if (strcmp(a, "--tune") == 0 && v) {
            char why[160];
            if (convd_gpu_tune_arg(v, why, sizeof(why)) != 0)
                die("%s", why);
            i++;
        } else if (strcmp(a, "--streams") == 0 && v) {
            o.streams = atoi(v);
            if (o.streams < 2 || o.streams > MAX_STREAMS)
                die("--streams takes 2 to %d", MAX_STREAMS);
            i++;
        } else if (strcmp(a, "--no-cudnn") == 0) {
            o.no_cudnn = 1;
        } else if (strcmp(a, "--tf32") == 0) {
            o.tf32 = 1;
        } else if (strcmp(a, "--sweep-mma") == 0) {
            o.sweep_mma = 1;
        } else if (strcmp(a, "--sweep-pdl") == 0) {
            o.sweep_pdl = 1;
        } else if (strcmp(a, "--sweep-fma") == 0) {
            o.sweep_fma = 1;
        } else if (strcmp(a, "--sweep-tf32") == 0) {
            o.sweep_tf32 = 1;
        } else if (strcmp(a, "--sweep-dw") == 0) {
            o.sweep_dw = 1;
        } else if (strcmp(a, "--sweep-nchw") == 0) {
            o.sweep_nchw = 1;
        } else if (strcmp(a, "--sweep-direct") == 0) {
            o.sweep_direct = 1;
        } else {
            usage();
            return strcmp(a, "--help") == 0 ? 0 : 2;
        }
    }
    if ((o.sweep_dw || o.sweep_direct) && !convd_gpu_sweep_kernels())
        fprintf(stderr, "note: this build has the production kernel set; variants the router does "
                        "not choose show as tiled or unsupported (build with "
                        "-DCONVD_GPU_SWEEP_KERNELS=ON to sweep them)\n");
    if (o.iters < 1)
        o.iters = 1;
    if (o.dt_mask == 0)
        o.dt_mask = (1 << CONVD_DTYPE_FP16) | (1 << CONVD_DTYPE_BF16) | (1 << CONVD_DTYPE_FP32);
    if (o.lay_mask == 0)
        o.lay_mask = (1 << CONVD_LAYOUT_NHWC) | (1 << CONVD_LAYOUT_NCHW);

    int ndev = 0;
    if (convd_gpu_device_count(&ndev) != 0 || ndev == 0)
        die("no GPU");
    char dev[160];
    convd_gpu_device_name(dev, sizeof(dev));
    int nshapes = 0;
    struct cli_shape *shapes = load_shapes(o.shapes, MAX_ROWS, &nshapes);

    CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    g_run = g_stream;
    for (int s = 1; s < o.streams; s++)
        CK(cudaStreamCreateWithFlags(&g_side[s], cudaStreamNonBlocking));
    struct ceilings ce;
    measure_ceilings(&ce);
    struct dnn dnn_s, *d = NULL;
    if (!o.no_cudnn && dnn_open(&dnn_s) == 0)
        d = &dnn_s;

    printf("# convd-bench-kernels\n\ndevice: %s; shapes: %s; median of %d after %d warm-up; "
           "cuDNN: %s\n\n",
           dev, o.shapes, o.iters, o.warmup,
           d ? "libcudnn.so.9, legacy API, fastest FindEx algo" : "not used");
    printf("Times are device time per convolution (CUDA graph of back-to-back runs, median of the "
           "graph launches); 'call' columns are per-call CUDA events around the API call, host "
           "work included.\n\n");
    printf("| shape | dtype | layout | kernel | ours us | cuDNN us | speedup | floor us | frac | "
           "bound | ours call us | cuDNN call us | rel err vs cuDNN |\n");
    printf("|---|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|\n");
    fflush(stdout);

    static struct row rows[MAX_ROWS * 6];
    int nrows = 0;
    static const enum convd_dtype dts[] = {CONVD_DTYPE_FP16, CONVD_DTYPE_BF16, CONVD_DTYPE_FP32};
    static const enum convd_layout lays[] = {CONVD_LAYOUT_NHWC, CONVD_LAYOUT_NCHW};
    for (int si = 0; si < nshapes; si++) {
        if (o.only != NULL && !name_listed(o.only, shapes[si].name))
            continue;
        for (int di = 0; di < 3; di++) {
            if (!(o.dt_mask & (1 << dts[di])))
                continue;
            for (int li = 0; li < 2; li++) {
                if (!(o.lay_mask & (1 << lays[li])))
                    continue;
                struct row *r = &rows[nrows];
                if (bench_one(&o, d, &ce, &shapes[si], dts[di], lays[li], r) != 0)
                    continue;
                nrows++;
                char cud[32], sp[32], err[32];
                snprintf(cud, sizeof(cud), r->cudnn_us > 0 ? "%.1f" : "n/a", r->cudnn_us);
                snprintf(sp, sizeof(sp), r->cudnn_us > 0 && r->ours_us > 0 ? "%.2fx" : "n/a",
                         r->cudnn_us / r->ours_us);
                snprintf(err, sizeof(err), isnan(r->rel_err) ? "n/a" : "%.1e%s", r->rel_err,
                         r->ok ? "" : " WRONG");
                printf("| %s | %s | %s | %s | %.1f | %s | %s | %.1f | %.2f | %s | %.1f | %.1f | %s "
                       "|\n",
                       r->shape, convd_dtype_name(r->dtype), convd_layout_name(r->layout),
                       r->kernel, r->ours_us, cud, sp, r->floor_us, r->frac, r->bound,
                       r->ours_call_us, r->cudnn_call_us, err);
                fflush(stdout);
            }
        }
    }
    free(shapes);
    if (o.streams > 1) {
        double sp[MAX_ROWS * 6];
        int ns = 0;
        printf("\n%d streams side by side (one graph): device time per convolution, and against "
               "one stream\n\n",
               o.streams);
        printf("| shape | dtype | layout | ours us | cuDNN us | speedup | ours alone us | cuDNN "
               "alone us |\n|---|---|---|---:|---:|---:|---:|---:|\n");
        for (int i = 0; i < nrows; i++) {
            const struct row *r = &rows[i];
            const int both = r->ours_conc_us > 0 && r->cudnn_conc_us > 0;
            if (both)
                sp[ns++] = r->cudnn_conc_us / r->ours_conc_us;
            printf("| %s | %s | %s | %.2f | %.2f | %.2fx | %.2f | %.2f |\n", r->shape,
                   convd_dtype_name(r->dtype), convd_layout_name(r->layout), r->ours_conc_us,
                   r->cudnn_conc_us, both ? r->cudnn_conc_us / r->ours_conc_us : 0.0, r->ours_us,
                   r->cudnn_us);
        }
        printf("\nSide by side: geomean %.2fx cuDNN over %d rows\n", geomean(sp, ns), ns);
    }
    summary(rows, nrows, &ce, o.tf32);
    printf("\nPlans:\n");
    for (int i = 0; i < nrows; i++)
        printf("- %s %s %s: %s\n", rows[i].shape, convd_dtype_name(rows[i].dtype),
               convd_layout_name(rows[i].layout), rows[i].plan);

    if (o.csv_out != NULL) {
        FILE *f = fopen(o.csv_out, "w");
        if (f == NULL)
            die("cannot write %s", o.csv_out);
        fprintf(f, "shape,dtype,layout,kernel,ours_us,cudnn_us,speedup,floor_us,frac,bound,"
                   "rel_err,ok,ours_call_us,cudnn_call_us,groups,ours_conc_us,cudnn_conc_us\n");
        for (int i = 0; i < nrows; i++) {
            const struct row *r = &rows[i];
            fprintf(f, "%s,%s,%s,%s,%.2f,%.2f,%.3f,%.2f,%.3f,%s,%.3g,%d,%.2f,%.2f,%d,%.2f,%.2f\n",
                    r->shape, convd_dtype_name(r->dtype), convd_layout_name(r->layout), r->kernel,
                    r->ours_us, r->cudnn_us,
                    r->cudnn_us > 0 && r->ours_us > 0 ? r->cudnn_us / r->ours_us : 0.0, r->floor_us,
                    r->frac, r->bound, r->rel_err, r->ok, r->ours_call_us, r->cudnn_call_us,
                    r->groups, r->ours_conc_us, r->cudnn_conc_us);
        }
        fclose(f);
    }
    int wrong = 0;
    for (int i = 0; i < nrows; i++)
        wrong += !rows[i].ok;
    return wrong ? 1 : 0;
}
