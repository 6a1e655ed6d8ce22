/*
 * convd-bench-call: the C client's cost per blocking call, the baseline of the Python package's
 * overhead benchmark (bench/python/overhead.py).
 *
 *   convd-bench-call --socket PATH --n 1 --c 8 --h 8 --w 8 --k 8 --r 3 --s 3 --groups 1 --pad 1
 *                    [--dtype fp32] [--layout nchw] [--calls 2000] [--batches 9]
 *                    [--fresh-output]
 *
 * Connects through libconvd-client, fills random input and weight, and times `batches` runs of
 * `calls` back-to-back convd_conv() calls on plain host memory (the library copies in and out
 * of its staging region), after one untimed run. With --fresh-output each call writes into a
 * newly allocated output buffer (malloc, free after the call), as a binding that returns a new
 * array per call must. Prints one JSON line: the problem, and the mean microseconds per call of
 * each run.
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <convd/convd.h>

static double bc_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int bc_int(const char *s, const char *name)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || v < 0 || v > (1 << 24)) {
        fprintf(stderr, "convd-bench-call: bad --%s '%s'\n", name, s);
        exit(2);
    }
    return (int)v;
}

/* Uniform values in [-0.5, 0.5) in the problem's dtype (normal numbers, as the Python side's
 * random data: denormals would slow the CPU backend down on one side only). */
static void bc_fill(uint8_t *buf, uint64_t elems, enum convd_dtype dtype)
{
    for (uint64_t i = 0; i < elems; i++) {
        float v = (float)rand() / ((float)RAND_MAX + 1.0f) - 0.5f;
        if (dtype == CONVD_DTYPE_FP32) {
            memcpy(buf + 4 * i, &v, 4);
        } else {
            uint16_t b = dtype == CONVD_DTYPE_FP16 ? convd_f32_to_f16(v) : convd_f32_to_bf16(v);
            memcpy(buf + 2 * i, &b, 2);
        }
    }
}

int main(int argc, char **argv)
{
    const char *sock = NULL;
    int n = 1, c = 8, h = 8, w = 8, k = 8, r = 3, s = 3, groups = 1, pad = 1;
    int calls = 2000, batches = 9, fresh = 0;
    enum convd_dtype dtype = CONVD_DTYPE_FP32;
    enum convd_layout layout = CONVD_LAYOUT_NCHW;
    static const struct option longopts[] = {
        {"socket", required_argument, NULL, 'S'}, {"n", required_argument, NULL, 'n'},
        {"c", required_argument, NULL, 'c'},      {"h", required_argument, NULL, 'h'},
        {"w", required_argument, NULL, 'w'},      {"k", required_argument, NULL, 'k'},
        {"r", required_argument, NULL, 'r'},      {"s", required_argument, NULL, 's'},
        {"groups", required_argument, NULL, 'g'}, {"pad", required_argument, NULL, 'p'},
        {"dtype", required_argument, NULL, 'd'},  {"layout", required_argument, NULL, 'l'},
        {"calls", required_argument, NULL, 'C'},  {"batches", required_argument, NULL, 'B'},
        {"fresh-output", no_argument, NULL, 'F'}, {NULL, 0, NULL, 0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case 'S':
            sock = optarg;
            break;
        case 'n':
            n = bc_int(optarg, "n");
            break;
        case 'c':
            c = bc_int(optarg, "c");
            break;
        case 'h':
            h = bc_int(optarg, "h");
            break;
        case 'w':
            w = bc_int(optarg, "w");
            break;
        case 'k':
            k = bc_int(optarg, "k");
            break;
        case 'r':
            r = bc_int(optarg, "r");
            break;
        case 's':
            s = bc_int(optarg, "s");
            break;
        case 'g':
            groups = bc_int(optarg, "groups");
            break;
        case 'p':
            pad = bc_int(optarg, "pad");
            break;
        case 'C':
            calls = bc_int(optarg, "calls");
            break;
        case 'B':
            batches = bc_int(optarg, "batches");
            break;
        case 'F':
            fresh = 1;
            break;
        case 'd':
            if (convd_dtype_parse(optarg, &dtype) != 0) {
                fprintf(stderr, "convd-bench-call: bad --dtype '%s'\n", optarg);
                return 2;
            }
            break;
        case 'l':
            if (convd_layout_parse(optarg, &layout) != 0) {
                fprintf(stderr, "convd-bench-call: bad --layout '%s'\n", optarg);
                return 2;
            }
            break;
        default:
            return 2;
        }
    }
    if (calls < 1 || batches < 1) {
        fprintf(stderr, "convd-bench-call: --calls and --batches must be at least 1\n");
        return 2;
    }

    struct convd_problem p;
    convd_problem_init(&p, n, h, w, c, k, r, s, groups);
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = pad;
    p.dtype = dtype;
    p.layout = layout;
    struct convd_problem_sizes z;
    char why[256];
    if (convd_problem_sizes(&p, &z, why, sizeof(why)) != 0) {
        fprintf(stderr, "convd-bench-call: bad problem: %s\n", why);
        return 2;
    }

    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = sock;
    o.client_name = "convd-bench-call";
    convd_client *cl;
    if (convd_connect(&o, &cl) != 0) {
        fprintf(stderr, "convd-bench-call: %s\n", convd_last_connect_error());
        return 1;
    }
    uint8_t *x = malloc(z.input_bytes), *wt = malloc(z.weight_bytes), *y = malloc(z.output_bytes);
    if (x == NULL || wt == NULL || y == NULL) {
        fprintf(stderr, "convd-bench-call: out of memory\n");
        return 1;
    }
    srand(1);
    bc_fill(x, z.input_elems, dtype);
    bc_fill(wt, z.weight_elems, dtype);

    int rc = 0;
    printf("{\"problem\": \"%s\", \"calls\": %d, \"us_per_call\": [",
           convd_problem_str(&p, why, sizeof(why)), calls);
    for (int b = -1; b < batches && rc == 0; b++) {
        double t0 = bc_now_us();
        for (int i = 0; i < calls && rc == 0; i++) {
            if (fresh) {
                uint8_t *fo = malloc(z.output_bytes);
                if (fo == NULL) {
                    rc = CONVD_ENOMEM;
                    break;
                }
                rc = convd_conv(cl, &p, x, wt, NULL, fo);
                free(fo);
            } else {
                rc = convd_conv(cl, &p, x, wt, NULL, y);
            }
        }
        double per = (bc_now_us() - t0) / calls;
        if (b >= 0)
            printf("%s%.3f", b > 0 ? ", " : "", per);
    }
    printf("]}\n");
    if (rc != 0)
        fprintf(stderr, "convd-bench-call: convd_conv: %s (%s)\n", convd_status_name(rc),
                convd_errstr(cl));
    free(x);
    free(wt);
    free(y);
    convd_close(cl);
    return rc != 0;
}
