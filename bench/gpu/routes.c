/*
 * convd-routes: prints what the GPU router does with each problem, one line per problem, so that
 * a change to the router can be compared before and after on the same device (`diff`). For each
 * row of the shape CSVs x dtype x layout x epilogue, then for seeded random problems:
 *   the routed plan (convd_gpu_describe, the daemon's workspace level), the workspace bytes for
 *   one problem and for a full launch, and each family's answer when asked for by name (its plan,
 *   or why it refuses, without workspace as convd_gpu_family_check plans).
 *
 *   convd-routes [--shapes FILE]... [--random N] [--seed S] [--tune KNOB=VALUE]... [--brief]
 *                [--tf32]   (fp32 problems allow TF32)
 *   convd-routes --table      (the routing table as docs/architecture.md carries it; no GPU)
 *
 * --tune sets a knob of the development policy (gpu_dev.h: pdl, mma_cfg, mma_tma, mma_stages,
 * mma_prefetch, mma_pad, dw_direct, fma_gemm, fma_outputs3, direct, direct_nhwc,
 * direct_prefetch, direct_outputs8, tf32, mma_tf32, mma_split_c) before anything is planned.
 *
 * Needs a GPU (the planners read the device); no kernel is launched.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cliargs.h"
#include "convd_kernels.h"
#include "gpu_dev.h"
#include "mix.h"

/* The epilogues that change a plan's inputs: none, bias+ReLU (inline), clamp (inline bounds),
 * SiLU (a separate pass after the kernel). */
static const struct {
    const char *name;
    int bias;
    enum convd_activation act;
} epilogues[] = {
    {"plain", 0, CONVD_ACT_NONE},
    {"bias+relu", 1, CONVD_ACT_RELU},
    {"clamp", 0, CONVD_ACT_CLAMP},
    {"bias+silu", 1, CONVD_ACT_SILU},
};

/* The routing rule's name (the family's before the router had rules: ROUTES_FAMILY_ONLY). */
#ifdef ROUTES_FAMILY_ONLY
#define ROUTES_NAME(p) convd_gpu_family_name(convd_gpu_route(p))
#else
#define ROUTES_NAME(p) convd_gpu_dev_rule(p)
#endif

static int brief; /* --brief: the routed plan and workspace only, shapes without an epilogue */
static int tf32;  /* --tf32: fp32 problems allow TF32 */

static void print_problem(const char *label, const struct convd_problem *p)
{
    char key[200];
    snprintf(key, sizeof(key),
             "%s n%d h%d w%d c%d k%d g%d r%d s%d st%d,%d pad%d,%d,%d,%d dil%d,%d %s%s %s%s %s",
             label, p->n, p->h, p->w, p->c, p->k, p->groups, p->r, p->s, p->stride_h, p->stride_w,
             p->pad_top, p->pad_bottom, p->pad_left, p->pad_right, p->dil_h, p->dil_w,
             convd_dtype_name(p->dtype), p->allow_tf32 ? "+tf32" : "", convd_layout_name(p->layout),
             p->has_bias ? " bias" : "", convd_activation_name(p->activation));
    char why[200];
    if (convd_gpu_check(p, why, sizeof(why)) != 0) {
        printf("%s | refused: %s\n", key, why);
        return;
    }
    char plan[240];
    convd_gpu_describe(p, CONVD_GPU_FAMILY_AUTO, plan, sizeof(plan));
    size_t ws1 = 0, wsn = 0;
    convd_gpu_dev_workspace(p, 1, &ws1);
    convd_gpu_dev_workspace(p, CONVD_GPU_BATCH_MAX, &wsn);
    printf("%s | %s -> %s | ws %zu,%zu", key, ROUTES_NAME(p), plan, ws1, wsn);
    for (int f = 1; !brief && f < CONVD_GPU_FAMILY_COUNT; f++) {
        const enum convd_gpu_family fam = (enum convd_gpu_family)f;
        why[0] = '\0';
        if (convd_gpu_family_check(p, fam, why, sizeof(why)) != 0) {
            printf(" | %s: no (%s)", convd_gpu_family_name(fam), why);
            continue;
        }
        convd_gpu_describe(p, fam, plan, sizeof(plan));
        printf(" | %s: %s", convd_gpu_family_name(fam), plan);
    }
    printf("\n");
}

static void set_epilogue(struct convd_problem *p, size_t e)
{
    p->has_bias = epilogues[e].bias != 0;
    p->activation = epilogues[e].act;
    p->act_min = 0.0f; /* ReLU6 where clamped */
    p->act_max = p->activation == CONVD_ACT_CLAMP ? 6.0f : 0.0f;
}

static int dump_csv(const char *path)
{
    struct cli_shape *rows = NULL;
    size_t count = 0;
    char why[320];
    if (cli_shapes_load(path, &rows, &count, why, sizeof(why)) != 0) {
        fprintf(stderr, "convd-routes: %s\n", why);
        return 1;
    }
    static const enum convd_dtype dts[] = {CONVD_DTYPE_FP16, CONVD_DTYPE_BF16, CONVD_DTYPE_FP32};
    for (size_t i = 0; i < count; i++)
        for (int d = 0; d < 3; d++)
            for (int l = 0; l < 2; l++)
                for (size_t e = 0; e < (brief ? 1 : sizeof(epilogues) / sizeof(epilogues[0]));
                     e++) {
                    struct convd_problem p;
                    convd_problem_init(&p, 1, 1, 1, 1, 1, 1, 1, 1);
                    cli_shape_apply(&rows[i], &p);
                    p.dtype = dts[d];
                    p.layout = l == 0 ? CONVD_LAYOUT_NHWC : CONVD_LAYOUT_NCHW;
                    set_epilogue(&p, e);
                    p.allow_tf32 = tf32 && p.dtype == CONVD_DTYPE_FP32;
                    print_problem(rows[i].name, &p);
                }
    free(rows);
    return 0;
}

/* "name=value": sets that knob; 0, or 1 with a message. */
static int tune(const char *arg)
{
    char why[160];
    if (convd_gpu_tune_arg(arg, why, sizeof(why)) == 0)
        return 0;
    fprintf(stderr, "convd-routes: %s\n", why);
    return 1;
}

static uint64_t rng_state;

static int pick(int lo, int hi)
{
    rng_state = mix_splitmix64(rng_state);
    return lo + (int)(rng_state % (uint64_t)(hi - lo + 1));
}

static int pick_of(const int *v, int n)
{
    return v[pick(0, n - 1)];
}

/* Random problems around the routing thresholds: channels per group near the tensor-core and
 * vector widths, small and odd images, every filter size the families special-case. */
static void dump_random(int count)
{
    static const int cpgs[] = {1, 1, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128};
    static const int kpgs[] = {1, 1, 2, 4, 8, 16, 24, 32, 64, 128};
    static const int groups[] = {1, 1, 2, 4, 8, 16, 32, 64};
    static const int filters[] = {1, 1, 3, 3, 3, 5, 7};
    static const int dims[] = {1, 2, 3, 5, 7, 8, 14, 15, 28, 32, 35, 56};
    for (int i = 0, made = 0; made < count && i < count * 50; i++) {
        struct convd_problem p;
        const int cpg = pick_of(cpgs, (int)(sizeof(cpgs) / sizeof(cpgs[0])));
        const int kpg = cpg == 1 && pick(0, 1)
                            ? pick(1, 2)
                            : pick_of(kpgs, (int)(sizeof(kpgs) / sizeof(kpgs[0])));
        int g = pick_of(groups, (int)(sizeof(groups) / sizeof(groups[0])));
        if (cpg == 1 && kpg <= 2 && pick(0, 1))
            g = pick_of((const int[]){32, 96, 144, 240, 384}, 5);
        const int r = pick_of(filters, (int)(sizeof(filters) / sizeof(filters[0])));
        const int s =
            pick(0, 3) ? r : pick_of(filters, (int)(sizeof(filters) / sizeof(filters[0])));
        const int h = pick_of(dims, (int)(sizeof(dims) / sizeof(dims[0])));
        const int w = pick(0, 2) ? h : pick_of(dims, (int)(sizeof(dims) / sizeof(dims[0])));
        convd_problem_init(&p, pick_of((const int[]){1, 1, 2, 8, 32}, 5), h, w, cpg * g, kpg * g, r,
                           s, g);
        p.stride_h = pick(1, 2);
        p.stride_w = pick(0, 3) ? p.stride_h : pick(1, 2);
        p.pad_top = p.pad_bottom = pick(0, r / 2);
        p.pad_left = p.pad_right = pick(0, 3) ? p.pad_top : pick(0, s / 2);
        if (pick(0, 7) == 0)
            p.pad_bottom = pick(0, r / 2);
        p.dil_h = p.dil_w = pick(0, 5) ? 1 : 2;
        p.dtype = (enum convd_dtype)pick_of(
            (const int[]){CONVD_DTYPE_FP16, CONVD_DTYPE_BF16, CONVD_DTYPE_FP32}, 3);
        p.layout = pick(0, 1) ? CONVD_LAYOUT_NHWC : CONVD_LAYOUT_NCHW;
        set_epilogue(&p, (size_t)pick(0, 3));
        p.allow_tf32 = tf32 && p.dtype == CONVD_DTYPE_FP32;
        if (convd_problem_check(&p, NULL, 0) != 0)
            continue;
        char label[32];
        snprintf(label, sizeof(label), "random%d", made);
        print_problem(label, &p);
        made++;
    }
}

int main(int argc, char **argv)
{
    const char *csvs[8];
    int ncsv = 0, nrandom = 2000;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--shapes") == 0 && v && ncsv < 8) {
            csvs[ncsv++] = v;
            i++;
        } else if (strcmp(argv[i], "--random") == 0 && v) {
            nrandom = atoi(v);
            i++;
        } else if (strcmp(argv[i], "--seed") == 0 && v) {
            seed = strtoull(v, NULL, 0);
            i++;
        } else if (strcmp(argv[i], "--brief") == 0) {
            brief = 1;
        } else if (strcmp(argv[i], "--tf32") == 0) {
            tf32 = 1;
        } else if (strcmp(argv[i], "--table") == 0) {
            const size_t need = convd_gpu_rule_table(NULL, 0);
            char *table = malloc(need + 1);
            if (table == NULL)
                return 1;
            convd_gpu_rule_table(table, need + 1);
            fputs(table, stdout);
            free(table);
            return 0;
        } else if (strcmp(argv[i], "--tune") == 0 && v) {
            if (tune(v) != 0)
                return 2;
            i++;
        } else {
            printf("usage: convd-routes [--shapes FILE]... [--random N] [--seed S] "
                   "[--tune KNOB=VALUE]... [--brief] [--tf32] | --table\n");
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    if (ncsv == 0) {
        csvs[ncsv++] = "bench/shapes.csv";
        csvs[ncsv++] = "bench/shapes-extra.csv";
    }
    int ndev = 0;
    if (convd_gpu_device_count(&ndev) != 0 || ndev == 0) {
        fprintf(stderr, "convd-routes: no GPU\n");
        return 1;
    }
    char dev[160];
    convd_gpu_device_name(dev, sizeof(dev));
    printf("# convd-routes on %s\n", dev);
    for (int i = 0; i < ncsv; i++)
        if (dump_csv(csvs[i]) != 0)
            return 1;
    rng_state = seed;
    dump_random(nrandom);
    return 0;
}
