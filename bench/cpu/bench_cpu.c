/*
 * convd-bench-cpu: times convd_cpu_conv() on the shapes of a shapes CSV and prints a markdown
 * table next to PyTorch's time for the same shape (from a CSV that bench/cpu/pytorch_cpu.py
 * writes, or the stored baseline), with the ratio PyTorch ms / convd ms.
 *
 * Timing: per shape and layout, `warmup` untimed calls, then the median of `runs` timed calls,
 * each call timed alone with CLOCK_MONOTONIC (as pytorch_cpu.py does with perf_counter).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "convd_kernels.h"
#include "cpu_internal.h"

#define BENCH_MAX_SHAPES 256
#define BENCH_MAX_REFS   1024

struct bench_shape {
    char name[64];
    int n, h, w, c, k, r, s, stride, pad, dil, groups;
};

struct bench_ref {
    char shape[64];
    char layout[8];
    double ms;
};

struct bench_opts {
    const char *shapes;
    const char *pytorch; /* comma-separated CSVs; the fastest per row counts */
    const char *pytorch_label;
    const char *ours; /* report these CSVs of earlier --csv passes instead of timing */
    bool csv;
    const char *only;
    const char *isa;
    enum cpu_algo algo;
    int n; /* 0: the CSV's */
    enum convd_dtype dtype;
    int threads;
    int runs, warmup;
    bool use_min;
    bool layouts[3];
};

static void bench_usage(FILE *f)
{
    fprintf(f,
            "usage: convd-bench-cpu [options]\n"
            "  --shapes FILE     shapes CSV (default bench/shapes.csv)\n"
            "  --n N             batch size (default 1; 0 keeps the CSV's)\n"
            "  --dtype T         fp32, fp16 or bf16 (default fp32)\n"
            "  --layouts L       nchw,nhwc (default both)\n"
            "  --threads T       threads (default 2; 0: one per CPU)\n"
            "  --runs N          timed runs, the median is reported (default 15)\n"
            "  --warmup N        untimed runs first (default 3)\n"
            "  --pytorch F[,F]   PyTorch times (CSVs from pytorch_cpu.py) to compare with;\n"
            "                    with several passes the fastest per row counts\n"
            "  --csv             print CSV rows (as pytorch_cpu.py does) instead of the table\n"
            "  --ours F[,F]      report earlier --csv passes (fastest per row) instead of timing\n"
            "  --pytorch-label S where those times come from (printed under the table)\n"
            "  --only NAME       only this shape\n"
            "  --isa NAME        kernel variant: avx512, avx2 or generic (default: the best)\n"
            "  --algo A          force an algorithm: planar or cv (default: the planner's)\n"
            "  --min             report the fastest run instead of the median (for A/B work\n"
            "                    on a busy machine; the PyTorch column stays a median)\n");
}

static double bench_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Splits a CSV line in place; returns the number of fields. */
static int bench_split(char *line, char **fields, int max)
{
    int n = 0;
    line[strcspn(line, "\r\n")] = '\0';
    for (char *p = line; n < max;) {
        fields[n++] = p;
        char *comma = strchr(p, ',');
        if (comma == NULL)
            break;
        *comma = '\0';
        p = comma + 1;
    }
    return n;
}

static int bench_read_shapes(const char *path, struct bench_shape *shapes, int max)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "convd-bench-cpu: %s: %s\n", path, strerror(errno));
        return -1;
    }
    char line[512];
    int count = 0, lineno = 0;
    while (fgets(line, sizeof(line), f) != NULL && count < max) {
        lineno++;
        char *fl[16];
        if (lineno == 1 || line[0] == '#' || line[0] == '\n')
            continue; /* header */
        if (bench_split(line, fl, 16) != 12) {
            fprintf(stderr, "convd-bench-cpu: %s:%d: expected 12 fields\n", path, lineno);
            fclose(f);
            return -1;
        }
        size_t name_len = strlen(fl[0]);
        struct bench_shape *s = &shapes[count++];
        if (name_len >= sizeof(s->name)) {
            fprintf(stderr, "convd-bench-cpu: %s:%d: shape name longer than %zu bytes\n", path,
                    lineno, sizeof(s->name) - 1);
            fclose(f);
            return -1;
        }
        memcpy(s->name, fl[0], name_len + 1);
        int *dst[] = {&s->n, &s->h,      &s->w,   &s->c,   &s->k,     &s->r,
                      &s->s, &s->stride, &s->pad, &s->dil, &s->groups};
        for (int i = 0; i < 11; i++)
            *dst[i] = atoi(fl[i + 1]);
    }
    fclose(f);
    return count;
}

/* PyTorch times: CSV with a header naming at least shape, layout and ms. */
static int bench_read_refs(const char *path, struct bench_ref *refs, int max)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "convd-bench-cpu: %s: %s\n", path, strerror(errno));
        return -1;
    }
    char line[512];
    int count = 0, col_shape = -1, col_layout = -1, col_ms = -1;
    bool header = true;
    while (fgets(line, sizeof(line), f) != NULL && count < max) {
        if (line[0] == '#')
            continue; /* provenance comments of the stored baseline */
        char *fl[16];
        int nf = bench_split(line, fl, 16);
        if (header) {
            for (int i = 0; i < nf; i++) {
                if (strcmp(fl[i], "shape") == 0)
                    col_shape = i;
                else if (strcmp(fl[i], "layout") == 0)
                    col_layout = i;
                else if (strcmp(fl[i], "ms") == 0)
                    col_ms = i;
            }
            header = false;
            if (col_shape < 0 || col_layout < 0 || col_ms < 0) {
                fprintf(stderr, "convd-bench-cpu: %s: header lacks shape, layout or ms\n", path);
                fclose(f);
                return -1;
            }
            continue;
        }
        if (nf <= col_ms || nf <= col_shape || nf <= col_layout)
            continue;
        struct bench_ref *r = &refs[count++];
        snprintf(r->shape, sizeof(r->shape), "%s", fl[col_shape]);
        snprintf(r->layout, sizeof(r->layout), "%s", fl[col_layout]);
        r->ms = atof(fl[col_ms]);
    }
    fclose(f);
    return count;
}

/* Fastest time for (shape, layout) over all rows, or 0 when there is none. */
static double bench_ref_ms(const struct bench_ref *refs, int nrefs, const char *shape,
                           const char *layout)
{
    double best = 0.0;
    for (int i = 0; i < nrefs; i++)
        if (strcmp(refs[i].shape, shape) == 0 && strcmp(refs[i].layout, layout) == 0 &&
            refs[i].ms > 0 && (best == 0.0 || refs[i].ms < best))
            best = refs[i].ms;
    return best;
}

/* Reads every CSV of a comma-separated list into refs; returns the row count or -1. */
static int bench_read_ref_list(const char *list, struct bench_ref *refs, int max, int *ret_files)
{
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", list);
    int total = 0, files = 0;
    for (char *save = NULL, *path = strtok_r(buf, ",", &save); path != NULL;
         path = strtok_r(NULL, ",", &save)) {
        int n = bench_read_refs(path, refs + total, max - total);
        if (n < 0)
            return -1;
        total += n;
        files++;
    }
    *ret_files = files;
    return total;
}

/* Times one shape in one layout; returns the median ms or a negative value on error. */
static double bench_time(const struct bench_opts *o, const struct convd_problem *p,
                         const struct cpu_isa *isa)
{
    struct convd_problem_sizes z;
    char why[160];
    if (convd_problem_sizes(p, &z, why, sizeof(why)) != 0) {
        fprintf(stderr, "convd-bench-cpu: bad shape: %s\n", why);
        return -1;
    }
    void *x = malloc(z.input_bytes), *w = malloc(z.weight_bytes), *y = malloc(z.output_bytes);
    double *times = calloc((size_t)o->runs, sizeof(double));
    double ms = -1;
    if (x == NULL || w == NULL || y == NULL || times == NULL) {
        fprintf(stderr, "convd-bench-cpu: out of memory\n");
        goto done;
    }
    /* values in [-1, 1): random bits would include NaN and denormals */
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    const size_t esz = convd_dtype_size(p->dtype);
    void *bufs[2] = {x, w};
    size_t counts[2] = {z.input_elems, z.weight_elems};
    for (int b = 0; b < 2; b++)
        for (size_t i = 0; i < counts[b]; i++) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            float v = (float)((double)(seed >> 40) / (double)(1u << 23) - 1.0);
            if (esz == 4)
                ((float *)bufs[b])[i] = v;
            else if (p->dtype == CONVD_DTYPE_FP16)
                ((uint16_t *)bufs[b])[i] = convd_f32_to_f16(v);
            else
                ((uint16_t *)bufs[b])[i] = convd_f32_to_bf16(v);
        }
    struct convd_tensors t = {.input = x, .weight = w, .bias = NULL, .output = y};
    for (int i = 0; i < o->warmup + o->runs; i++) {
        double t0 = bench_now_ms();
        int rc = cpu_conv_ex(p, &t, o->threads, isa, o->algo);
        double t1 = bench_now_ms();
        if (rc != 0) {
            fprintf(stderr, "convd-bench-cpu: convd_cpu_conv: %s\n", convd_strerror(rc));
            goto done;
        }
        if (i >= o->warmup)
            times[i - o->warmup] = t1 - t0;
    }
    ms = bench_median(times, o->runs);
    if (o->use_min)
        ms = times[0]; /* sorted by bench_median */
done:
    free(x);
    free(w);
    free(y);
    free(times);
    return ms;
}

static int bench_parse(int argc, char **argv, struct bench_opts *o)
{
    static const struct option longopts[] = {
        {"shapes", required_argument, NULL, 'S'},
        {"n", required_argument, NULL, 'n'},
        {"dtype", required_argument, NULL, 'd'},
        {"layouts", required_argument, NULL, 'l'},
        {"threads", required_argument, NULL, 't'},
        {"runs", required_argument, NULL, 'r'},
        {"warmup", required_argument, NULL, 'w'},
        {"pytorch", required_argument, NULL, 'p'},
        {"pytorch-label", required_argument, NULL, 'L'},
        {"csv", no_argument, NULL, 'c'},
        {"ours", required_argument, NULL, 'O'},
        {"only", required_argument, NULL, 'o'},
        {"isa", required_argument, NULL, 'i'},
        {"min", no_argument, NULL, 'm'},
        {"algo", required_argument, NULL, 'a'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (struct bench_opts){.shapes = "bench/shapes.csv",
                             .pytorch_label = NULL,
                             .n = 1,
                             .dtype = CONVD_DTYPE_FP32,
                             .threads = 2,
                             .runs = 15,
                             .warmup = 3,
                             .layouts = {false, true, true}};
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'S':
            o->shapes = optarg;
            break;
        case 'n':
            o->n = atoi(optarg);
            break;
        case 'd':
            if (convd_dtype_parse(optarg, &o->dtype) != 0) {
                fprintf(stderr, "convd-bench-cpu: unknown dtype '%s'\n", optarg);
                return -1;
            }
            break;
        case 'l': {
            o->layouts[CONVD_LAYOUT_NCHW] = strstr(optarg, "nchw") != NULL;
            o->layouts[CONVD_LAYOUT_NHWC] = strstr(optarg, "nhwc") != NULL;
            break;
        }
        case 't':
            o->threads = atoi(optarg);
            break;
        case 'r':
            o->runs = atoi(optarg);
            break;
        case 'w':
            o->warmup = atoi(optarg);
            break;
        case 'p':
            o->pytorch = optarg;
            break;
        case 'L':
            o->pytorch_label = optarg;
            break;
        case 'c':
            o->csv = true;
            break;
        case 'O':
            o->ours = optarg;
            break;
        case 'o':
            o->only = optarg;
            break;
        case 'i':
            o->isa = optarg;
            break;
        case 'm':
            o->use_min = true;
            break;
        case 'a':
            if (strcmp(optarg, "planar") == 0) {
                o->algo = CPU_ALGO_PLANAR;
            } else if (strcmp(optarg, "cv") == 0) {
                o->algo = CPU_ALGO_NHWC_CV;
            } else {
                fprintf(stderr, "convd-bench-cpu: --algo is planar or cv\n");
                return -1;
            }
            break;
        case 'h':
            bench_usage(stdout);
            exit(0);
        default:
            bench_usage(stderr);
            return -1;
        }
    }
    if (o->runs < 1 || o->warmup < 0 || o->threads < 0 || o->n < 0) {
        fprintf(stderr, "convd-bench-cpu: runs must be >= 1, warmup, threads and n >= 0\n");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct bench_opts o;
    if (bench_parse(argc, argv, &o) != 0)
        return 2;
    const struct cpu_isa *isa = cpu_isa_best();
    if (o.isa != NULL && (isa = cpu_isa_find(o.isa)) == NULL) {
        fprintf(stderr, "convd-bench-cpu: kernel variant '%s' is unknown or not usable here\n",
                o.isa);
        return 2;
    }

    static struct bench_shape shapes[BENCH_MAX_SHAPES];
    static struct bench_ref refs[BENCH_MAX_REFS], ours[BENCH_MAX_REFS];
    int nshapes = bench_read_shapes(o.shapes, shapes, BENCH_MAX_SHAPES);
    if (nshapes < 0)
        return 1;
    int nrefs = 0, nours = 0, ref_passes = 0, our_passes = 0;
    if (o.pytorch != NULL &&
        (nrefs = bench_read_ref_list(o.pytorch, refs, BENCH_MAX_REFS, &ref_passes)) < 0)
        return 1;
    if (o.ours != NULL &&
        (nours = bench_read_ref_list(o.ours, ours, BENCH_MAX_REFS, &our_passes)) < 0)
        return 1;

    if (o.csv)
        printf("shape,layout,dtype,n,threads,ms,gflops\n");
    else
        printf("| shape | layout | ms | GFLOP/s | PyTorch ms | ratio |\n"
               "|---|---|---:|---:|---:|---:|\n");
    double ratios_grouped[2 * BENCH_MAX_SHAPES], ratios_all[2 * BENCH_MAX_SHAPES];
    int ngrouped = 0, nall = 0;
    for (int i = 0; i < nshapes; i++) {
        const struct bench_shape *s = &shapes[i];
        if (o.only != NULL && strcmp(o.only, s->name) != 0)
            continue;
        for (int lay = CONVD_LAYOUT_NCHW; lay <= CONVD_LAYOUT_NHWC; lay++) {
            if (!o.layouts[lay])
                continue;
            struct convd_problem p;
            convd_problem_init(&p, o.n > 0 ? o.n : s->n, s->h, s->w, s->c, s->k, s->r, s->s,
                               s->groups);
            p.stride_h = p.stride_w = s->stride;
            p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = s->pad;
            p.dil_h = p.dil_w = s->dil;
            p.dtype = o.dtype;
            p.layout = (enum convd_layout)lay;
            const char *ln = convd_layout_name(p.layout);
            double ms =
                o.ours != NULL ? bench_ref_ms(ours, nours, s->name, ln) : bench_time(&o, &p, isa);
            if (ms < 0)
                return 1;
            if (ms == 0) {
                fprintf(stderr, "convd-bench-cpu: no time for %s %s in %s\n", s->name, ln, o.ours);
                continue;
            }
            struct convd_problem_sizes z;
            convd_problem_sizes(&p, &z, NULL, 0);
            const double gflops = (double)z.flops / (ms * 1e6);
            if (o.csv) {
                printf("%s,%s,%s,%d,%d,%.4f,%.1f\n", s->name, ln, convd_dtype_name(o.dtype), p.n,
                       o.threads, ms, gflops);
                fflush(stdout);
                continue;
            }
            double ref = bench_ref_ms(refs, nrefs, s->name, ln);
            printf("| %s | %s | %.3f | %.1f |", s->name, ln, ms, gflops);
            if (ref > 0) {
                double ratio = ref / ms;
                printf(" %.3f | %.2f |\n", ref, ratio);
                ratios_all[nall++] = ratio;
                if (s->groups > 1)
                    ratios_grouped[ngrouped++] = ratio;
            } else {
                printf(" - | - |\n");
            }
            fflush(stdout);
        }
    }
    if (o.csv)
        return 0;
    printf("\nconvd: %s kernels, %d thread%s, %s, ", isa->name, o.threads,
           o.threads == 1 ? "" : "s", convd_dtype_name(o.dtype));
    if (o.n > 0)
        printf("N=%d,", o.n);
    else
        printf("N from the CSV,");
    printf(" %s of %d runs after %d warm-ups", o.use_min ? "fastest" : "median", o.runs, o.warmup);
    if (our_passes > 1)
        printf(", the faster of %d such passes", our_passes);
    printf(".");
    if (nall > 0) {
        printf(" PyTorch: %s", o.pytorch_label != NULL ? o.pytorch_label : o.pytorch);
        if (ref_passes > 1)
            printf(", the faster of %d passes", ref_passes);
        printf(".\nMedian ratio (PyTorch ms / convd ms): grouped shapes %.2f (%d), all %.2f "
               "(%d).\n",
               ngrouped > 0 ? bench_median(ratios_grouped, ngrouped) : 0.0, ngrouped,
               bench_median(ratios_all, nall), nall);
    } else {
        printf(" No PyTorch times given.\n");
    }
    return 0;
}
