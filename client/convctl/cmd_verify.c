/*
 * convctl verify: fresh random tensors through the daemon, checked against convd_cpu_conv() run
 * here on the same inputs.
 */
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convd_kernels.h"
#include "util.h"

static const char verify_usage[] =
    "Usage: convctl verify [shape options | --shape NAME --csv FILE] [--repeat N] [--seed S]\n"
    "                      [--threads T] [--json] [--socket PATH | --device N] [--timeout MS]\n"
    "\n"
    "Makes fresh random tensors, runs the convolution on the daemon, runs it again here with the\n"
    "CPU reference (convd_cpu_conv) and compares: relative L2 error under 1e-5 for fp32 (3e-3 "
    "with\n"
    "--tf32), 1e-2 for fp16 and bf16 is a PASS. Prints the problem, the daemon's backend, the\n"
    "errors and the times (the round trip seen here, and the daemon's queue and execution times).\n"
    "Exit status 1 on FAIL.\n"
    "\n"
    "Shape options (default: n2 c32 h16 w16 k32 r3 s3 groups 4 pad 1, fp32, nchw):\n"
    "  --n N --c C --h H --w W --k K --r R --s S --groups G\n"
    "  --stride S|SH,SW  --pad P|PH,PW|PT,PB,PL,PR  --dilation D|DH,DW\n"
    "  --dtype fp32|fp16|bf16  --layout nchw|nhwc  --bias\n"
    "  --act none|relu|relu6|clamp:LO,HI|silu|hardswish|gelu|gelu_tanh  (--relu: --act relu)\n"
    "  --tf32        fp32 may multiply in TF32 on the GPU (allow_tf32)\n"
    "  --shape NAME --csv FILE   a row of a shapes CSV (bench/shapes.csv); shape options given\n"
    "                            as well override its fields\n"
    "Other options:\n"
    "  --repeat N    run the request N times, checking each output (default 1)\n"
    "  --seed S      random seed (default: fresh; printed for replay)\n"
    "  --threads T   threads of the CPU reference (default: all)\n"
    "  --json        one JSON object on one line instead of the report: the problem's fields\n"
    "                (as bench --json), seed, runs, backend, device, result (PASS or FAIL),\n"
    "                rel_error, max_abs_error, tolerance, rtt_us, rtt_min_us, queue_us,\n"
    "                exec_us, reference_us (medians) and error (the daemon's sentence or null)\n";

enum { V_SHAPE = 1, V_CSV, V_REPEAT, V_SEED, V_THREADS, V_JSON };

static int verify_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int cmd_verify(const struct ctl_global *g0, int argc, char **argv)
{
    static const struct option opts[] = {
        CTL_COMMON_LONG_OPTIONS,
        {"shape", required_argument, NULL, V_SHAPE},
        {"csv", required_argument, NULL, V_CSV},
        {"repeat", required_argument, NULL, V_REPEAT},
        {"seed", required_argument, NULL, V_SEED},
        {"threads", required_argument, NULL, V_THREADS},
        {"json", no_argument, NULL, V_JSON},
        CTL_PROBLEM_LONG_OPTIONS_END,
    };
    struct ctl_global g = *g0;
    const char *shape_name = NULL, *csv = NULL;
    long long repeat = 1, threads = 0, seed_arg = -1;
    bool json = false;
    struct {
        int opt;
        const char *arg;
    } popts[64];
    size_t npopts = 0;
    int opt, code = 0;
    char why[160];

    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (ctl_common_option(&g, opt, optarg, &code)) {
            if (code != 0)
                return code;
            continue;
        }
        if (opt >= CTL_OPT_PROBLEM_FIRST &&
            opt < CTL_OPT_PROBLEM_FIRST + CTL_PROBLEM_OPTION_COUNT) {
            /* Applied after the CSV row, which they override. */
            if (npopts == sizeof(popts) / sizeof(popts[0])) {
                ctl_err("too many shape options");
                return CTL_EXIT_USAGE;
            }
            popts[npopts].opt = opt;
            popts[npopts++].arg = optarg;
            continue;
        }
        switch (opt) {
        case 'h':
            fputs(verify_usage, stdout);
            return 0;
        case V_SHAPE:
            shape_name = optarg;
            break;
        case V_CSV:
            csv = optarg;
            break;
        case V_REPEAT:
            if (cli_parse_int(optarg, 1, 1000000, &repeat, why, sizeof(why)) != 0) {
                ctl_err("--repeat: %s", why);
                return CTL_EXIT_USAGE;
            }
            break;
        case V_SEED:
            if (cli_parse_int(optarg, 0, INT64_MAX, &seed_arg, why, sizeof(why)) != 0) {
                ctl_err("--seed: %s", why);
                return CTL_EXIT_USAGE;
            }
            break;
        case V_THREADS:
            if (cli_parse_int(optarg, 0, 4096, &threads, why, sizeof(why)) != 0) {
                ctl_err("--threads: %s", why);
                return CTL_EXIT_USAGE;
            }
            break;
        case V_JSON:
            json = true;
            break;
        default:
            return ctl_bad_option(argv, opts, "verify");
        }
    }
    if (optind < argc) {
        ctl_err("unexpected argument '%s'", argv[optind]);
        return CTL_EXIT_USAGE;
    }
    if ((shape_name == NULL) != (csv == NULL)) {
        ctl_err("--shape and --csv go together");
        return CTL_EXIT_USAGE;
    }

    struct convd_problem p;
    ctl_default_problem(&p);
    if (shape_name != NULL) {
        struct cli_shape *rows;
        size_t nrows;
        if (ctl_load_shapes(csv, &rows, &nrows) != 0)
            return CTL_EXIT_FAIL;
        const struct cli_shape *row = cli_shapes_find(rows, nrows, shape_name);
        if (row == NULL) {
            ctl_err("%s has no shape called '%s'", csv, shape_name);
            free(rows);
            return CTL_EXIT_USAGE;
        }
        cli_shape_apply(row, &p);
        free(rows);
    }
    unsigned given = 0;
    for (size_t i = 0; i < npopts; i++) {
        ctl_problem_option(&p, &given, popts[i].opt, popts[i].arg, &code);
        if (code != 0)
            return code;
    }
    struct convd_problem_sizes z;
    if (convd_problem_sizes(&p, &z, why, sizeof(why)) != 0) {
        ctl_err("invalid problem: %s", why);
        return CTL_EXIT_USAGE;
    }

    code = CTL_EXIT_FAIL;
    convd_client *c = NULL;
    convd_region *region = NULL;
    void *ref = NULL;
    uint64_t *rtt = NULL, *queue = NULL, *exec = NULL;
    const uint64_t align = 256;
    const uint64_t w_off = (z.input_bytes + align - 1) / align * align;
    const uint64_t b_off = (w_off + z.weight_bytes + align - 1) / align * align;
    const uint64_t o_off = (b_off + z.bias_bytes + align - 1) / align * align;
    const uint64_t total = o_off + z.output_bytes;
    const uint64_t seed = seed_arg >= 0 ? (uint64_t)seed_arg : ctl_fresh_seed();

    ref = malloc(z.output_bytes);
    rtt = calloc((size_t)repeat, sizeof(*rtt));
    queue = calloc((size_t)repeat, sizeof(*queue));
    exec = calloc((size_t)repeat, sizeof(*exec));
    if (ref == NULL || rtt == NULL || queue == NULL || exec == NULL) {
        ctl_err("out of memory");
        goto finish;
    }
    if (ctl_connect(&g, &c) != 0)
        goto finish;
    int rc = convd_region_create(c, total, &region);
    if (rc != 0) {
        ctl_err("cannot create a region of %llu bytes: %s (%s)", (unsigned long long)total,
                convd_errstr(c), convd_status_name(rc));
        goto finish;
    }
    uint8_t *base = convd_region_data(region);
    struct ctl_rng rng;
    ctl_rng_seed(&rng, seed);
    ctl_fill_random(&rng, p.dtype, base, z.input_elems);
    ctl_fill_random(&rng, p.dtype, base + w_off, z.weight_elems);
    if (p.has_bias)
        ctl_fill_random(&rng, p.dtype, base + b_off, z.bias_elems);

    struct convd_server_info info;
    convd_server_info(c, &info);
    char desc[192];
    if (!json) {
        printf("problem   %s\n", convd_problem_str(&p, desc, sizeof(desc)));
        printf("          %.3g GFLOP, %llu + %llu + %llu bytes in, %llu out, seed %llu\n",
               (double)z.flops / 1e9, (unsigned long long)z.input_bytes,
               (unsigned long long)z.weight_bytes, (unsigned long long)z.bias_bytes,
               (unsigned long long)z.output_bytes, (unsigned long long)seed);
        printf("daemon    convd %s, %s backend (%s)\n", info.server_version, info.backend,
               info.device);
        fflush(stdout);
    }

    /* The reference, here, from the same bytes the daemon reads. */
    struct convd_tensors t = {base, base + w_off, p.has_bias ? base + b_off : NULL, ref};
    uint64_t r0 = ctl_now_ns();
    rc = convd_cpu_conv(&p, &t, (int)threads);
    uint64_t ref_ns = ctl_now_ns() - r0;
    if (rc != 0) {
        ctl_err("the CPU reference failed: %s", convd_strerror(rc));
        goto finish;
    }

    struct convd_conv_args a = CONVD_CONV_ARGS_INIT;
    a.problem = p;
    a.input = (struct convd_tensor){region, 0, z.input_bytes};
    a.weight = (struct convd_tensor){region, w_off, z.weight_bytes};
    if (p.has_bias)
        a.bias = (struct convd_tensor){region, b_off, z.bias_bytes};
    a.output = (struct convd_tensor){region, o_off, z.output_bytes};
    const double tol = ctl_tolerance(&p);
    double worst_rel = 0, worst_abs = 0;
    bool pass = true;
    char b1[32], b2[32], b3[32];
    char failure[300] = ""; /* the daemon's sentence for a request it failed */
    long long runs = 0;
    for (long long i = 0; i < repeat; i++) {
        /* 0xff bytes are NaN in every dtype: an element the daemon does not write fails. */
        memset(base + o_off, 0xff, z.output_bytes);
        uint64_t id, t0 = ctl_now_ns();
        rc = convd_conv_submit(c, &a, &id);
        struct convd_completion done;
        if (rc == 0)
            rc = convd_wait(c, id, -1, &done);
        rtt[i] = ctl_now_ns() - t0;
        if (rc != 0) {
            ctl_err("request failed: %s (%s)", convd_errstr(c), convd_status_name(rc));
            goto finish;
        }
        if (done.status != 0) {
            snprintf(failure, sizeof(failure), "%s (%s)", done.error,
                     convd_status_name(done.status));
            if (!json)
                printf("run %lld   the daemon failed the request: %s\nresult    FAIL\n", i + 1,
                       failure);
            pass = false;
            break;
        }
        queue[i] = done.queue_us * 1000;
        exec[i] = done.exec_us * 1000;
        runs = i + 1;
        double max_abs;
        double rel = ctl_rel_error(p.dtype, base + o_off, ref, z.output_elems, &max_abs);
        bool ok = rel <= tol;
        pass = pass && ok;
        worst_rel = fmax(worst_rel, rel);
        worst_abs = fmax(worst_abs, max_abs);
        if (!json && (repeat <= 20 || !ok))
            printf("run %-5lld max abs error %.3g, relative L2 error %.3g (tolerance %.0e) %s; "
                   "round trip %s, queue %s, exec %s, batch %u\n",
                   i + 1, max_abs, rel, tol, ok ? "PASS" : "FAIL",
                   ctl_fmt_ns((double)rtt[i], b1, sizeof(b1)),
                   ctl_fmt_ns((double)queue[i], b2, sizeof(b2)),
                   ctl_fmt_ns((double)exec[i], b3, sizeof(b3)), done.batch_size);
    }
    qsort(rtt, (size_t)runs, sizeof(*rtt), verify_cmp_u64);
    qsort(queue, (size_t)runs, sizeof(*queue), verify_cmp_u64);
    qsort(exec, (size_t)runs, sizeof(*exec), verify_cmp_u64);
    size_t mid = (size_t)runs / 2;
    if (json) {
        struct ctl_json j;
        ctl_json_begin(&j);
        ctl_json_str(&j, "name", shape_name != NULL ? shape_name : "options");
        ctl_json_problem(&j, &p, &z);
        ctl_json_u64(&j, "seed", seed);
        ctl_json_int(&j, "repeat", repeat);
        ctl_json_int(&j, "runs", runs);
        ctl_json_str(&j, "backend", info.backend);
        ctl_json_str(&j, "device", info.device);
        ctl_json_str(&j, "result", pass ? "PASS" : "FAIL");
        ctl_json_num(&j, "rel_error", runs > 0 ? worst_rel : NAN);
        ctl_json_num(&j, "max_abs_error", runs > 0 ? worst_abs : NAN);
        ctl_json_num(&j, "tolerance", tol);
        ctl_json_num(&j, "rtt_us", runs > 0 ? (double)rtt[mid] / 1e3 : NAN);
        ctl_json_num(&j, "rtt_min_us", runs > 0 ? (double)rtt[0] / 1e3 : NAN);
        ctl_json_num(&j, "queue_us", runs > 0 ? (double)queue[mid] / 1e3 : NAN);
        ctl_json_num(&j, "exec_us", runs > 0 ? (double)exec[mid] / 1e3 : NAN);
        ctl_json_num(&j, "reference_us", (double)ref_ns / 1e3);
        ctl_json_str(&j, "error", failure[0] != '\0' ? failure : NULL);
        ctl_json_end(&j);
    } else if (failure[0] == '\0') {
        printf("timing    round trip %s (median of %lld, min %s), daemon queue %s, exec %s; CPU "
               "reference here %s\n",
               ctl_fmt_ns((double)rtt[mid], b1, sizeof(b1)), repeat,
               ctl_fmt_ns((double)rtt[0], b2, sizeof(b2)),
               ctl_fmt_ns((double)queue[mid], b3, sizeof(b3)),
               ctl_fmt_ns((double)exec[mid], desc, 32), ctl_fmt_ns((double)ref_ns, desc + 32, 32));
        printf("result    %s: relative L2 error %.3g, max abs error %.3g, tolerance %.0e (%s)\n",
               pass ? "PASS" : "FAIL", worst_rel, worst_abs, tol, convd_dtype_name(p.dtype));
    }
    code = pass ? 0 : CTL_EXIT_FAIL;
finish:
    if (region != NULL)
        convd_region_free(region);
    convd_close(c);
    free(ref);
    free(rtt);
    free(queue);
    free(exec);
    return code;
}
