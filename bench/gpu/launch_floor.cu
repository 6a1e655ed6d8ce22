/*
 * The floor under convd-bench-launch's numbers: what launching a kernel that does nothing costs
 * the host, and how long until its completion is seen, as its parameter block grows from a few
 * bytes to the size of the tensor-copy mma kernel's (about 3.5 KB: arguments, 32 problems'
 * pointers and 16 tensor maps) and past the old 4 KB limit (CUDA 12.1 raised it to 32 KB on
 * Volta and later), with and without programmatic stream serialization. The kernels
 * take their parameters by value the way the library's do, so the driver copies every byte.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "launch_args.h"
#include "launch_floor.h"

template <int N> struct lf_blob {
    unsigned char b[N];
};

/* Reads one byte so that the parameter block is live; writes only when told to (never here). */
template <int N> __global__ void lf_kernel(const __grid_constant__ lf_blob<N> blob, int *sink)
{
    if (sink != NULL && blob.b[threadIdx.x % N] == 0xa5)
        *sink = 1;
}

template <int N> static cudaError_t lf_launch(cudaStream_t s, int pdl, int blocks)
{
    static lf_blob<N> blob; /* zero: the kernel never writes */
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3((unsigned)blocks);
    lc.blockDim = dim3(128);
    lc.stream = s;
    cudaLaunchAttribute at[1] = {};
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    lc.attrs = at;
    lc.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&lc, lf_kernel<N>, blob, (int *)NULL);
}

template <int N> static int lf_row(cudaStream_t s, cudaEvent_t ev, int pdl, int iters, double *trip)
{
    for (int i = 0; i < 50; i++)
        if (lf_launch<N>(s, pdl, 132) != cudaSuccess)
            return 1;
    if (cudaStreamSynchronize(s) != cudaSuccess)
        return 1;
    double host = 0;
    for (int i = 0; i < iters; i++) {
        double t0 = launch_now_us();
        lf_launch<N>(s, pdl, 132);
        host += launch_now_us() - t0;
        if (i % 16 == 15)
            cudaStreamSynchronize(s);
    }
    cudaStreamSynchronize(s);
    for (int i = 0; i < iters; i++) {
        double t0 = launch_now_us();
        lf_launch<N>(s, pdl, 132);
        cudaEventRecord(ev, s);
        while (cudaEventQuery(ev) == cudaErrorNotReady)
            ;
        trip[i] = launch_now_us() - t0;
    }
    qsort(trip, (size_t)iters, sizeof(double), launch_cmp_double);
    printf("| %d | %s | %.2f | %.2f | %.2f |\n", N, pdl ? "yes" : "no", host / iters,
           trip[iters / 2], trip[(size_t)iters * 99 / 100]);
    return cudaGetLastError() != cudaSuccess;
}

extern "C" int convd_bench_launch_floor(int iters)
{
    cudaStream_t s;
    cudaEvent_t ev;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess)
        return 1;
    double *trip = (double *)malloc(sizeof(double) * (size_t)iters);
    if (trip == NULL)
        return 1;
    /* The event alone: record and query on an idle stream. */
    double rec = 0;
    for (int i = 0; i < iters; i++) {
        double t0 = launch_now_us();
        cudaEventRecord(ev, s);
        while (cudaEventQuery(ev) == cudaErrorNotReady)
            ;
        rec += launch_now_us() - t0;
    }
    printf("An empty kernel of 132 blocks x 128 threads; record and spin on an idle stream: "
           "%.2f us.\n\n",
           rec / iters);
    printf("| parameter bytes | PDL | host us/launch | trip p50 us | trip p99 us |\n");
    printf("|---:|---|---:|---:|---:|\n");
    int rc = 0;
    for (int pdl = 0; pdl <= 1 && rc == 0; pdl++)
        rc = lf_row<8>(s, ev, pdl, iters, trip) || lf_row<512>(s, ev, pdl, iters, trip) ||
             lf_row<1024>(s, ev, pdl, iters, trip) || lf_row<2048>(s, ev, pdl, iters, trip) ||
             lf_row<3072>(s, ev, pdl, iters, trip) || lf_row<4000>(s, ev, pdl, iters, trip) ||
             lf_row<8192>(s, ev, pdl, iters, trip) || lf_row<16384>(s, ev, pdl, iters, trip);
    printf("\n");
    free(trip);
    cudaEventDestroy(ev);
    cudaStreamDestroy(s);
    return rc;
}
