/*
 * convd-launch-host: the library's own host time per convd_gpu_conv() call, without a device.
 * Linked against routes_stub.c built with STUB_LAUNCHES (an H200's attributes; launches and
 * tensor-map encodes return at once), so what it times is planning lookups, argument assembly
 * and the loop over launches: the part of convd-bench-launch's "host us/call" that is ours, the
 * rest being the driver's (convd-bench-launch --floor). Pointers are made up and never read.
 *
 *   convd-launch-host [--shape N,H,W,C,K,R,S,STRIDE,PAD,DIL,GROUPS] [--dtype fp16]
 *                     [--layout nhwc] [--iters 200000]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convd_kernels.h"
#include "launch_args.h"

#define LH_MAX 32

int main(int argc, char **argv)
{
    struct convd_problem p;
    launch_args_default(&p);
    long iters = 200000;
    for (int i = 1; i < argc; i++) {
        const int took = launch_args_take(argc, argv, &i, &p, &iters);
        if (took < 0)
            return 2;
        if (took == 0) {
            fprintf(stderr, "usage: convd-launch-host [--shape N,H,W,C,K,R,S,STRIDE,PAD,DIL,"
                            "GROUPS] [--dtype D] [--layout L] [--iters N]\n");
            return 2;
        }
    }
    if (iters < 100)
        iters = 100;
    struct convd_problem_sizes z;
    char why[256];
    if (convd_problem_sizes(&p, &z, why, sizeof(why)) != 0) {
        fprintf(stderr, "convd-launch-host: %s\n", why);
        return 2;
    }
    size_t ws_bytes = 0;
    if (convd_gpu_workspace(&p, LH_MAX, &ws_bytes) != 0)
        return 1;
    /* Made-up device addresses, 256-byte aligned like the pool's: nothing dereferences them. */
    const uintptr_t per = ((uintptr_t)z.input_bytes + z.output_bytes + 255) & ~(uintptr_t)255;
    const uintptr_t base = (uintptr_t)1 << 40;
    struct convd_tensors t[LH_MAX];
    for (int i = 0; i < LH_MAX; i++) {
        t[i].input = (const void *)(base + (uintptr_t)i * per);
        t[i].output = (void *)(base + (uintptr_t)i * per + (z.input_bytes + 255) / 256 * 256);
        t[i].weight = (const void *)(base + per * LH_MAX);
        t[i].bias = NULL;
    }
    void *ws =
        ws_bytes > 0 ? (void *)(base + per * LH_MAX + ((z.weight_bytes + 255) & ~255u)) : NULL;
    char desc[160];
    printf("convd-launch-host: %s, rule %s, stub runtime, %ld calls a row\n\n",
           convd_problem_str(&p, desc, sizeof(desc)), convd_gpu_kernel_name(&p), iters);
    printf("| batch | host us/call | host us/problem |\n|---:|---:|---:|\n");
    for (int count = 1; count <= LH_MAX; count *= 2) {
        if (convd_gpu_conv(&p, t, (size_t)count, ws, ws_bytes, NULL) != 0) {
            fprintf(stderr, "convd-launch-host: convd_gpu_conv failed\n");
            return 1;
        }
        double t0 = launch_now_us();
        for (long i = 0; i < iters; i++)
            convd_gpu_conv(&p, t, (size_t)count, ws, ws_bytes, NULL);
        double us = (launch_now_us() - t0) / (double)iters;
        printf("| %d | %.3f | %.3f |\n", count, us, us / count);
    }
    return 0;
}
