/*
 * convctl conv: one convolution on .npy files, through the daemon.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"
#include "util.h"

static const char conv_usage[] =
    "Usage: convctl conv --input X.npy --weight W.npy [--bias B.npy] --output Y.npy\n"
    "                    [--stride S|SH,SW] [--pad P|PH,PW|PT,PB,PL,PR] [--dilation D|DH,DW]\n"
    "                    [--groups G] [--layout nchw|nhwc] [--dtype fp32|fp16|bf16]\n"
    "                    [--act relu|relu6|clamp:LO,HI|silu|hardswish|gelu|gelu_tanh] [--relu]\n"
    "                    [--tf32]\n"
    "                    [--socket PATH | --device N] [--timeout MS]\n"
    "\n"
    "Runs one grouped 2-D convolution on the daemon and writes the result as a .npy file.\n"
    "Shapes come from the arrays:\n"
    "  nchw (default): X (N, C, H, W), W (K, C/G, R, S), Y (N, K, Ho, Wo)\n"
    "  nhwc:           X (N, H, W, C), W (K, R, S, C/G), Y (N, Ho, Wo, K)\n"
    "  bias:           B (K)\n"
    "Files are little-endian, C order, as numpy.save writes them: fp32 is <f4, fp16 <f2;\n"
    "bf16 travels as <u2 bit patterns and needs --dtype bf16. Without --dtype the dtype is the\n"
    "input's; every file must have it.\n";

/* One input array, read and checked. */
struct conv_array {
    const char *path;
    const char *role; /* "input", "weight", "bias" */
    uint8_t *file;
    size_t file_len;
    struct npy_header h;
};

static const char *conv_descr(enum convd_dtype dtype)
{
    return dtype == CONVD_DTYPE_FP32 ? "<f4" : dtype == CONVD_DTYPE_FP16 ? "<f2" : "<u2";
}

/* The descr without its byte-order mark, with '=' and '|' read as little endian (the machines
 * convd runs on are). NULL for big-endian arrays. */
static const char *conv_le_type(const struct npy_header *h)
{
    if (h->byteorder == '>')
        return NULL;
    const char *d = h->descr;
    return *d == '<' || *d == '=' || *d == '|' ? d + 1 : d;
}

static int conv_load(struct conv_array *a)
{
    if (ctl_read_file(a->path, &a->file, &a->file_len) != 0)
        return -1;
    char why[256];
    if (npy_parse_header(a->file, a->file_len, &a->h, why, sizeof(why)) != 0) {
        ctl_err("%s (%s): %s", a->path, a->role, why);
        return -1;
    }
    if (a->h.fortran_order) {
        ctl_err("%s (%s) is in Fortran order; save a C-order array "
                "(numpy.ascontiguousarray)",
                a->path, a->role);
        return -1;
    }
    if (conv_le_type(&a->h) == NULL) {
        ctl_err("%s (%s) is big-endian (%s); save it little-endian (astype('<%c%u'))", a->path,
                a->role, a->h.descr, a->h.kind, a->h.itemsize);
        return -1;
    }
    uint64_t have = a->file_len - a->h.data_offset;
    if (have != a->h.data_bytes) {
        ctl_err("%s (%s): the header promises %llu bytes of data, the file holds %llu", a->path,
                a->role, (unsigned long long)a->h.data_bytes, (unsigned long long)have);
        return -1;
    }
    return 0;
}

/* The dtype from the input's descr, when --dtype was not given. */
static int conv_infer_dtype(const struct conv_array *x, enum convd_dtype *ret)
{
    const char *t = conv_le_type(&x->h);
    if (strcmp(t, "f4") == 0) {
        *ret = CONVD_DTYPE_FP32;
        return 0;
    }
    if (strcmp(t, "f2") == 0) {
        *ret = CONVD_DTYPE_FP16;
        return 0;
    }
    if (strcmp(t, "u2") == 0) {
        ctl_err("%s (input) holds uint16 (%s); if these are bfloat16 bit patterns, pass "
                "--dtype bf16",
                x->path, x->h.descr);
        return -1;
    }
    ctl_err("%s (input) has dtype %s; convd takes float32 (<f4), float16 (<f2) or bfloat16 "
            "bits (<u2 with --dtype bf16)",
            x->path, x->h.descr);
    return -1;
}

static int conv_check_dtype(const struct conv_array *a, enum convd_dtype dtype)
{
    const char *want = conv_descr(dtype) + 1;
    if (strcmp(conv_le_type(&a->h), want) != 0) {
        ctl_err("%s (%s) has dtype %s, expected <%s for %s", a->path, a->role, a->h.descr, want,
                convd_dtype_name(dtype));
        return -1;
    }
    return 0;
}

static int conv_check_ndim(const struct conv_array *a, uint32_t ndim, const char *dims)
{
    if (a->h.ndim != ndim) {
        ctl_err("%s (%s) has %u dimensions, expected %u %s", a->path, a->role, a->h.ndim, ndim,
                dims);
        return -1;
    }
    for (uint32_t i = 0; i < ndim; i++)
        if (a->h.shape[i] == 0 || a->h.shape[i] > CONVD_MAX_DIM) {
            ctl_err("%s (%s): dimension %u is %llu, must be 1 to %d", a->path, a->role, i,
                    (unsigned long long)a->h.shape[i], CONVD_MAX_DIM);
            return -1;
        }
    return 0;
}

/* Derives the problem's sizes from the arrays, naming the array and dimension that disagree. */
static int conv_shapes(struct convd_problem *p, const struct conv_array *x,
                       const struct conv_array *w, const struct conv_array *b)
{
    const bool nhwc = p->layout == CONVD_LAYOUT_NHWC;
    if (conv_check_ndim(x, 4, nhwc ? "(N, H, W, C)" : "(N, C, H, W)") != 0 ||
        conv_check_ndim(w, 4, nhwc ? "(K, R, S, C/G)" : "(K, C/G, R, S)") != 0 ||
        (b != NULL && conv_check_ndim(b, 1, "(K)") != 0))
        return -1;
    const uint64_t *xs = x->h.shape, *ws = w->h.shape;
    p->n = (int32_t)xs[0];
    p->c = (int32_t)(nhwc ? xs[3] : xs[1]);
    p->h = (int32_t)(nhwc ? xs[1] : xs[2]);
    p->w = (int32_t)(nhwc ? xs[2] : xs[3]);
    p->k = (int32_t)ws[0];
    p->r = (int32_t)(nhwc ? ws[1] : ws[2]);
    p->s = (int32_t)(nhwc ? ws[2] : ws[3]);
    uint64_t cpg = nhwc ? ws[3] : ws[1];
    unsigned cdim = nhwc ? 3 : 1;
    if (p->c % p->groups != 0) {
        ctl_err("%s (input): dimension %u (C) is %d, not divisible by --groups %d", x->path, cdim,
                p->c, p->groups);
        return -1;
    }
    if (cpg != (uint64_t)(p->c / p->groups)) {
        ctl_err("%s (weight): dimension %u (C/G) is %llu, expected %d = C %d / groups %d", w->path,
                cdim, (unsigned long long)cpg, p->c / p->groups, p->c, p->groups);
        return -1;
    }
    if (p->k % p->groups != 0) {
        ctl_err("%s (weight): dimension 0 (K) is %d, not divisible by --groups %d", w->path, p->k,
                p->groups);
        return -1;
    }
    if (b != NULL && b->h.shape[0] != (uint64_t)p->k) {
        ctl_err("%s (bias): dimension 0 is %llu, expected K = %d from the weight", b->path,
                (unsigned long long)b->h.shape[0], p->k);
        return -1;
    }
    return 0;
}

static int conv_write(const char *path, const char *descr, const uint64_t *shape, const void *data,
                      size_t bytes)
{
    uint8_t hdr[256];
    size_t hlen;
    if (npy_write_header(hdr, sizeof(hdr), descr, shape, 4, &hlen) != 0) {
        ctl_err("cannot format the header of %s", path);
        return -1;
    }
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        ctl_err("cannot create %s: %s", path, strerror(errno));
        return -1;
    }
    bool ok = fwrite(hdr, 1, hlen, f) == hlen && fwrite(data, 1, bytes, f) == bytes;
    if (fclose(f) != 0)
        ok = false;
    if (!ok) {
        ctl_err("cannot write %s: %s", path, strerror(errno));
        remove(path);
        return -1;
    }
    return 0;
}

int cmd_conv(const struct ctl_global *g0, int argc, char **argv)
{
    enum {
        O_INPUT = 1,
        O_WEIGHT,
        O_BIAS,
        O_OUTPUT,
    };
    static const struct option opts[] = {
        CTL_COMMON_LONG_OPTIONS,
        {"input", required_argument, NULL, O_INPUT},
        {"weight", required_argument, NULL, O_WEIGHT},
        {"bias", required_argument, NULL, O_BIAS},
        {"output", required_argument, NULL, O_OUTPUT},
        CTL_PROBLEM_CONV_LONG_OPTIONS_END,
    };
    struct ctl_global g = *g0;
    struct conv_array x = {.role = "input"}, w = {.role = "weight"}, b = {.role = "bias"};
    const char *out_path = NULL;
    struct convd_problem p;
    convd_problem_init(&p, 1, 1, 1, 1, 1, 1, 1, 1);
    bool dtype_given = false;
    convd_client *c = NULL;
    void *y = NULL;
    int code = 0, opt;
    char why[160];

    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (ctl_common_option(&g, opt, optarg, &code)) {
            if (code != 0)
                return code;
            continue;
        }
        /* Only the in_conv options of the table reach here (opts has no others). */
        const char *pname = cli_problem_option_name(opt - CTL_OPT_PROBLEM_FIRST);
        if (pname != NULL) {
            if (cli_problem_option(&p, pname, optarg, why, sizeof(why)) != 0) {
                ctl_err("--%s: %s", pname, why);
                return CTL_EXIT_USAGE;
            }
            dtype_given |= opt == CTL_OPT_PROBLEM_FIRST + CLI_PO_DTYPE;
            continue;
        }
        switch (opt) {
        case 'h':
            fputs(conv_usage, stdout);
            return 0;
        case O_INPUT:
            x.path = optarg;
            break;
        case O_WEIGHT:
            w.path = optarg;
            break;
        case O_BIAS:
            b.path = optarg;
            break;
        case O_OUTPUT:
            out_path = optarg;
            break;
        default:
            return ctl_bad_option(argv, opts, "conv");
        }
    }
    if (optind < argc) {
        ctl_err("unexpected argument '%s'", argv[optind]);
        return CTL_EXIT_USAGE;
    }
    if (x.path == NULL || w.path == NULL || out_path == NULL) {
        ctl_err("conv needs --input, --weight and --output (see convctl conv --help)");
        return CTL_EXIT_USAGE;
    }

    code = CTL_EXIT_FAIL;
    p.has_bias = b.path != NULL;
    if (conv_load(&x) != 0 || conv_load(&w) != 0 || (p.has_bias && conv_load(&b) != 0))
        goto finish;
    if (!dtype_given && conv_infer_dtype(&x, &p.dtype) != 0)
        goto finish;
    if (conv_check_dtype(&x, p.dtype) != 0 || conv_check_dtype(&w, p.dtype) != 0 ||
        (p.has_bias && conv_check_dtype(&b, p.dtype) != 0))
        goto finish;
    if (conv_shapes(&p, &x, &w, p.has_bias ? &b : NULL) != 0)
        goto finish;
    struct convd_problem_sizes z;
    int rc = convd_problem_sizes(&p, &z, why, sizeof(why));
    if (rc != 0) {
        ctl_err("the arrays do not make a valid problem: %s", why);
        goto finish;
    }
    y = malloc(z.output_bytes > 0 ? z.output_bytes : 1);
    if (y == NULL) {
        ctl_err("out of memory for the output (%llu bytes)", (unsigned long long)z.output_bytes);
        goto finish;
    }
    if (ctl_connect(&g, &c) != 0)
        goto finish;
    rc = convd_conv(c, &p, x.file + x.h.data_offset, w.file + w.h.data_offset,
                    p.has_bias ? b.file + b.h.data_offset : NULL, y);
    if (rc != 0) {
        char desc[160];
        ctl_err("the daemon could not run %s: %s (%s)", convd_problem_str(&p, desc, sizeof(desc)),
                convd_errstr(c), convd_status_name(rc));
        goto finish;
    }
    uint64_t shape[4];
    if (p.layout == CONVD_LAYOUT_NHWC) {
        shape[0] = (uint64_t)p.n, shape[1] = (uint64_t)z.out_h, shape[2] = (uint64_t)z.out_w;
        shape[3] = (uint64_t)p.k;
    } else {
        shape[0] = (uint64_t)p.n, shape[1] = (uint64_t)p.k, shape[2] = (uint64_t)z.out_h;
        shape[3] = (uint64_t)z.out_w;
    }
    if (conv_write(out_path, conv_descr(p.dtype), shape, y, z.output_bytes) != 0)
        goto finish;
    code = 0;
finish:
    convd_close(c);
    free(y);
    free(x.file);
    free(w.file);
    free(b.file);
    return code;
}
