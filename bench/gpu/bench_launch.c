/*
 * convd-bench-launch: what one batched call costs the host and how long it takes to come back,
 * the two numbers the daemon's serving path is made of. For a shape (default latency_b1_resnext,
 * fp16 NHWC) and batches of 1 to 32 problems with their own buffers, it reports:
 *   host      the time convd_gpu_conv() takes to return (planning, tensor maps, the launch);
 *   record    the same plus cudaEventRecord;
 *   trip      launch, record and a cudaEventQuery spin until the event completes (the p50 and
 *             p99 of many, one at a time): what the daemon's loop sees as the batch's exec time.
 * Inputs are random and never checked here: the kernels' tests do that.
 *
 * --floor prints first the same for an empty kernel by parameter size (launch_floor.cu), the
 * part of the above no library change can remove; --tune sets a knob of the development policy
 * (gpu_dev.h, as convd-routes does), to compare the launch of one plan with another's.
 *
 *   convd-bench-launch [--shape N,H,W,C,K,R,S,STRIDE,PAD,DIL,GROUPS] [--dtype fp16] [--layout nhwc]
 *                      [--iters 2000] [--floor] [--tune KNOB=VALUE]...
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convd_kernels.h"
#include "gpu_dev.h"
#include "launch_args.h"
#include "launch_floor.h"

#define BL_MAX 32

static int bl_check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    fprintf(stderr, "convd-bench-launch: %s: %s\n", what, cudaGetErrorString(e));
    return 1;
}

/* "name=value": sets that knob of the development policy; 0, or 1 with a message. */
static int bl_tune(const char *arg)
{
    char why[160];
    if (convd_gpu_tune_arg(arg, why, sizeof(why)) == 0)
        return 0;
    fprintf(stderr, "convd-bench-launch: %s\n", why);
    return 1;
}

/* convd_gpu_conv() under the development policy (its default unless --tune changed it). */
static int bl_conv(const struct convd_problem *p, const struct convd_tensors *t, size_t count,
                   void *ws, size_t ws_bytes, cudaStream_t s)
{
    return convd_gpu_conv_family(p, t, count, ws, ws_bytes, s, CONVD_GPU_FAMILY_AUTO);
}

int main(int argc, char **argv)
{
    int floor = 0;
    struct convd_problem p;
    launch_args_default(&p);
    long iters = 2000;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        const int took = launch_args_take(argc, argv, &i, &p, &iters);
        if (took < 0)
            return 2;
        if (took > 0)
            continue;
        if (strcmp(argv[i], "--floor") == 0) {
            floor = 1;
        } else if (strcmp(argv[i], "--tune") == 0 && v) {
            if (bl_tune(v) != 0)
                return 2;
            i++;
        } else {
            fprintf(stderr, "usage: convd-bench-launch [--shape N,H,W,C,K,R,S,STRIDE,PAD,DIL,"
                            "GROUPS] [--dtype D] [--layout L] [--iters N] [--floor] "
                            "[--tune KNOB=VALUE]...\n");
            return 2;
        }
    }
    if (iters < 10)
        iters = 10;
    struct convd_problem_sizes z;
    char why[256];
    if (convd_problem_sizes(&p, &z, why, sizeof(why)) != 0) {
        fprintf(stderr, "convd-bench-launch: %s\n", why);
        return 2;
    }
    /* Every problem of a batch has its own input and output, as clients' requests do. */
    const size_t per = z.input_bytes + z.output_bytes;
    char *mem = NULL;
    size_t ws_bytes = 0;
    if (bl_check(cudaMalloc((void **)&mem, per * BL_MAX + z.weight_bytes), "cudaMalloc") ||
        convd_gpu_dev_workspace(&p, BL_MAX, &ws_bytes) != 0)
        return 1;
    void *ws = NULL;
    if (ws_bytes > 0 && bl_check(cudaMalloc(&ws, ws_bytes), "cudaMalloc workspace"))
        return 1;
    if (bl_check(cudaMemset(mem, 0x3c, per * BL_MAX + z.weight_bytes), "cudaMemset"))
        return 1;
    struct convd_tensors t[BL_MAX];
    for (int i = 0; i < BL_MAX; i++) {
        t[i].input = mem + (size_t)i * per;
        t[i].output = mem + (size_t)i * per + z.input_bytes;
        t[i].weight = mem + per * BL_MAX;
        t[i].bias = NULL;
    }
    cudaStream_t s;
    cudaEvent_t ev;
    if (bl_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream") ||
        bl_check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "event"))
        return 1;
    double *trip = malloc(sizeof(double) * (size_t)iters);
    if (trip == NULL)
        return 1;
    if (floor && convd_bench_launch_floor((int)iters) != 0) {
        fprintf(stderr, "convd-bench-launch: the floor table failed\n");
        return 1;
    }
    char desc[160], plan[512];
    if (convd_gpu_describe(&p, CONVD_GPU_FAMILY_AUTO, plan, sizeof(plan)) != 0)
        snprintf(plan, sizeof(plan), "(no plan)");
    printf("convd-bench-launch: %s, rule %s, %ld iterations\n%s\n\n",
           convd_problem_str(&p, desc, sizeof(desc)), convd_gpu_dev_rule(&p), iters, plan);
    printf("| batch | host us/call | +record us | trip p50 us | trip p99 us | host us/problem |\n");
    printf("|---:|---:|---:|---:|---:|---:|\n");
    for (int count = 1; count <= BL_MAX; count *= 2) {
        /* Warm-up: plans, tensor-map entry points, the first launches. */
        for (int i = 0; i < 20; i++)
            if (bl_conv(&p, t, (size_t)count, ws, ws_bytes, s) != 0) {
                fprintf(stderr, "convd-bench-launch: convd_gpu_conv failed\n");
                return 1;
            }
        cudaStreamSynchronize(s);
        /* Host time of the call alone, 16 calls between synchronisations. */
        double host = 0, rec = 0;
        for (int i = 0; i < iters; i++) {
            double t0 = launch_now_us();
            bl_conv(&p, t, (size_t)count, ws, ws_bytes, s);
            double t1 = launch_now_us();
            cudaEventRecord(ev, s);
            double t2 = launch_now_us();
            host += t1 - t0;
            rec += t2 - t0;
            if (i % 16 == 15)
                cudaStreamSynchronize(s);
        }
        cudaStreamSynchronize(s);
        /* One at a time: launch, record, spin on the event. */
        for (int i = 0; i < iters; i++) {
            double t0 = launch_now_us();
            bl_conv(&p, t, (size_t)count, ws, ws_bytes, s);
            cudaEventRecord(ev, s);
            while (cudaEventQuery(ev) == cudaErrorNotReady)
                ;
            trip[i] = launch_now_us() - t0;
        }
        qsort(trip, (size_t)iters, sizeof(double), launch_cmp_double);
        printf("| %d | %.2f | %.2f | %.2f | %.2f | %.2f |\n", count, host / iters, rec / iters,
               trip[iters / 2], trip[(size_t)iters * 99 / 100], host / iters / count);
        fflush(stdout);
    }
    if (bl_check(cudaGetLastError(), "after the runs"))
        return 1;
    free(trip);
    cudaEventDestroy(ev);
    cudaStreamDestroy(s);
    cudaFree(ws);
    cudaFree(mem);
    return 0;
}
