/* launch_args.h: the launch tools' shared options. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "launch_args.h"

void launch_args_default(struct convd_problem *p)
{
    convd_problem_init(p, 1, 56, 56, 128, 128, 3, 3, 32);
    p->pad_top = p->pad_bottom = p->pad_left = p->pad_right = 1;
    p->dtype = CONVD_DTYPE_FP16;
    p->layout = CONVD_LAYOUT_NHWC;
}

int launch_args_take(int argc, char **argv, int *i, struct convd_problem *p, long *iters)
{
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (strcmp(a, "--shape") == 0 && v) {
        int f[11];
        if (sscanf(v, "%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d", &f[0], &f[1], &f[2], &f[3], &f[4], &f[5],
                   &f[6], &f[7], &f[8], &f[9], &f[10]) != 11) {
            fprintf(stderr, "--shape N,H,W,C,K,R,S,STRIDE,PAD,DIL,GROUPS\n");
            return -1;
        }
        const enum convd_dtype dt = p->dtype;
        const enum convd_layout lay = p->layout;
        convd_problem_init(p, f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[10]);
        p->stride_h = p->stride_w = f[7];
        p->pad_top = p->pad_bottom = p->pad_left = p->pad_right = f[8];
        p->dil_h = p->dil_w = f[9];
        p->dtype = dt;
        p->layout = lay;
    } else if (strcmp(a, "--dtype") == 0 && v) {
        if (convd_dtype_parse(v, &p->dtype) != 0) {
            fprintf(stderr, "--dtype %s: fp32, fp16 or bf16\n", v);
            return -1;
        }
    } else if (strcmp(a, "--layout") == 0 && v) {
        if (convd_layout_parse(v, &p->layout) != 0) {
            fprintf(stderr, "--layout %s: nchw or nhwc\n", v);
            return -1;
        }
    } else if (strcmp(a, "--iters") == 0 && v) {
        *iters = atol(v);
    } else {
        return 0;
    }
    (*i)++;
    return 1;
}

double launch_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int launch_cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
