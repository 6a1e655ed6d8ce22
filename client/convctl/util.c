/* Shared helpers of convctl; see util.h. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mix.h"
#include "suggest.h"
#include "util.h"

void ctl_err(const char *fmt, ...)
{
    va_list ap;
    fputs("convctl: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void ctl_socket_path(const struct ctl_global *g, char *buf, size_t cap)
{
    if (g->socket != NULL)
        snprintf(buf, cap, "%s", g->socket);
    else if (convd_socket_path(g->device, buf, cap) != 0)
        snprintf(buf, cap, "(too long)");
}

int ctl_connect(const struct ctl_global *g, convd_client **ret_client)
{
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = g->socket;
    o.client_name = "convctl";
    o.timeout_ms = g->timeout_ms;
    o.device = g->device;
    /* $CONVD_SOCKET names the one daemon to use and wins over --device (convd_socket_path()):
     * say so, or the daemon that answers is not the one asked for. */
    const char *env = getenv("CONVD_SOCKET");
    if (g->socket == NULL && g->device >= 0 && env != NULL && env[0] != '\0')
        ctl_err("note: --device %d is overridden by $CONVD_SOCKET (%s); unset it to reach the "
                "daemon of GPU %d",
                g->device, env, g->device);
    int rc = convd_connect(&o, ret_client);
    if (rc != 0)
        ctl_err("cannot connect to the daemon: %s (%s)", convd_last_connect_error(),
                convd_status_name(rc));
    return rc;
}

int ctl_bad_option(char **argv, const struct option *opts, const char *cmd)
{
    char help[64];
    if (cmd != NULL)
        snprintf(help, sizeof(help), "see convctl help %s", cmd);
    else
        snprintf(help, sizeof(help), "see convctl --help");
    const char *arg = optind > 0 ? argv[optind - 1] : NULL;
    if (arg != NULL && strncmp(arg, "--", 2) == 0 && arg[2] != '\0') {
        char name[64];
        const char *eq = strchr(arg + 2, '=');
        size_t len = eq != NULL ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        snprintf(name, sizeof(name), "%.*s", (int)(len < sizeof(name) ? len : sizeof(name) - 1),
                 arg + 2);
        const char *names[128];
        size_t n = 0, prefixed = 0;
        for (const struct option *o = opts; o->name != NULL && n < 128; o++) {
            if (strcmp(o->name, name) == 0) {
                ctl_err(o->has_arg == required_argument ? "option '--%s' needs a value (%s)"
                                                        : "option '--%s' takes no value (%s)",
                        name, help);
                return CTL_EXIT_USAGE;
            }
            prefixed += strncmp(o->name, name, strlen(name)) == 0;
            names[n++] = o->name;
        }
        if (prefixed > 1) {
            ctl_err("option '--%s' is ambiguous: it begins more than one option (%s)", name, help);
            return CTL_EXIT_USAGE;
        }
        const char *best = suggest_closest(name, names, n);
        if (best != NULL)
            ctl_err("unknown option '--%s'; did you mean '--%s'? (%s)", name, best, help);
        else
            ctl_err("unknown option '--%s' (%s)", name, help);
        return CTL_EXIT_USAGE;
    }
    if (optopt > 0 && optopt < 128)
        ctl_err("unknown option '-%c' (%s)", optopt, help);
    else
        ctl_err("bad option '%s' (%s)", arg != NULL ? arg : "", help);
    return CTL_EXIT_USAGE;
}

bool ctl_common_option(struct ctl_global *g, int opt, const char *arg, int *ret_exit)
{
    char why[128];
    long long v;
    switch (opt) {
    case CTL_OPT_SOCKET:
        g->socket = arg;
        return true;
    case CTL_OPT_DEVICE:
        if (cli_parse_int(arg, 0, 1023, &v, why, sizeof(why)) != 0) {
            ctl_err("--device: %s", why);
            *ret_exit = CTL_EXIT_USAGE;
        } else {
            g->device = (int)v;
        }
        return true;
    case CTL_OPT_TIMEOUT:
        if (cli_parse_int(arg, 1, 3600 * 1000, &v, why, sizeof(why)) != 0) {
            ctl_err("--timeout: %s", why);
            *ret_exit = CTL_EXIT_USAGE;
        } else {
            g->timeout_ms = (int)v;
        }
        return true;
    }
    return false;
}

bool ctl_problem_option(struct convd_problem *p, unsigned *given, int opt, const char *arg,
                        int *ret_exit)
{
    int i = opt - CTL_OPT_PROBLEM_FIRST;
    if (i < 0 || i >= CTL_PROBLEM_OPTION_COUNT)
        return false;
    char why[160];
    if (cli_problem_option(p, cli_problem_option_name(i), arg, why, sizeof(why)) != 0) {
        ctl_err("--%s: %s", cli_problem_option_name(i), why);
        *ret_exit = CTL_EXIT_USAGE;
    }
    *given |= CTL_GIVEN(i);
    return true;
}

void ctl_default_problem(struct convd_problem *p)
{
    /* n2 c32x16x16 k32 3x3 g4 pad 1: grouped, padded, small enough for any backend. */
    convd_problem_init(p, 2, 16, 16, 32, 32, 3, 3, 4);
    p->pad_top = p->pad_bottom = p->pad_left = p->pad_right = 1;
}

int ctl_read_file(const char *path, uint8_t **ret_data, size_t *ret_len)
{
    char why[320];
    if (cli_read_file(path, ret_data, ret_len, why, sizeof(why)) != 0) {
        ctl_err("%s", why);
        return -1;
    }
    return 0;
}

int ctl_load_shapes(const char *path, struct cli_shape **ret_rows, size_t *ret_count)
{
    char why[320];
    if (cli_shapes_load(path, ret_rows, ret_count, why, sizeof(why)) != 0) {
        ctl_err("%s", why);
        return -1;
    }
    return 0;
}

void ctl_rng_seed(struct ctl_rng *g, uint64_t seed)
{
    g->s = seed != 0 ? seed : MIX_GOLDEN64;
}

uint64_t ctl_rng_next(struct ctl_rng *g)
{
    return mix_xorshift64s(&g->s);
}

uint64_t ctl_fresh_seed(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t s =
        (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid() << 32;
    return s != 0 ? s : 1;
}

void ctl_fill_random(struct ctl_rng *g, enum convd_dtype dtype, void *data, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        /* 24 random bits: exact in fp32, uniform in [-1, 1). */
        float v = (float)(ctl_rng_next(g) >> 40) * (2.0f / 16777216.0f) - 1.0f;
        switch (dtype) {
        case CONVD_DTYPE_FP32:
            ((float *)data)[i] = v;
            break;
        case CONVD_DTYPE_FP16:
            ((uint16_t *)data)[i] = convd_f32_to_f16(v);
            break;
        case CONVD_DTYPE_BF16:
            ((uint16_t *)data)[i] = convd_f32_to_bf16(v);
            break;
        }
    }
}

float ctl_load(enum convd_dtype dtype, const void *data, size_t i)
{
    switch (dtype) {
    case CONVD_DTYPE_FP16:
        return convd_f16_to_f32(((const uint16_t *)data)[i]);
    case CONVD_DTYPE_BF16:
        return convd_bf16_to_f32(((const uint16_t *)data)[i]);
    case CONVD_DTYPE_FP32:
        break;
    }
    return ((const float *)data)[i];
}

double ctl_rel_error(enum convd_dtype dtype, const void *out, const void *ref, size_t count,
                     double *ret_max_abs)
{
    double diff2 = 0, ref2 = 0, max_abs = 0;
    bool bad = false;
    for (size_t i = 0; i < count; i++) {
        double o = ctl_load(dtype, out, i), r = ctl_load(dtype, ref, i);
        if (!isfinite(o) && isfinite(r)) {
            bad = true;
            max_abs = INFINITY;
            continue;
        }
        double d = fabs(o - r);
        diff2 += d * d;
        ref2 += r * r;
        if (d > max_abs)
            max_abs = d;
    }
    if (ret_max_abs != NULL)
        *ret_max_abs = max_abs;
    if (bad)
        return INFINITY;
    return sqrt(diff2) / fmax(sqrt(ref2), 1e-30);
}

double ctl_tolerance(const struct convd_problem *p)
{
    /* TF32 operands carry 10 mantissa bits, as fp16's do (random data: about 3e-4). */
    if (p->dtype == CONVD_DTYPE_FP32)
        return p->allow_tf32 ? 3e-3 : 1e-5;
    return 1e-2;
}

uint64_t ctl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

char *ctl_fmt_ns(double ns, char *buf, size_t len)
{
    if (ns < 1e3)
        snprintf(buf, len, "%.0f ns", ns);
    else if (ns < 1e6)
        snprintf(buf, len, "%.1f us", ns / 1e3);
    else if (ns < 1e9)
        snprintf(buf, len, "%.2f ms", ns / 1e6);
    else
        snprintf(buf, len, "%.2f s", ns / 1e9);
    return buf;
}

/*
 * JSON.
 */

static void ctl_json_key(struct ctl_json *j, const char *key)
{
    printf("%s\"%s\":", j->fields++ == 0 ? "" : ",", key);
}

/* The length of the valid UTF-8 sequence at p (1-4), or 0 when it is not one. */
static size_t ctl_utf8_len(const unsigned char *p)
{
    size_t n = p[0] < 0x80             ? 1
               : (p[0] & 0xe0) == 0xc0 ? 2
               : (p[0] & 0xf0) == 0xe0 ? 3
               : (p[0] & 0xf8) == 0xf0 ? 4
                                       : 0;
    if (n == 0 || (n == 2 && p[0] < 0xc2) || (n == 4 && p[0] > 0xf4))
        return 0;
    for (size_t i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    return n;
}

static void ctl_json_string(const char *v)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)v; *p != '\0';) {
        if (*p == '"' || *p == '\\') {
            printf("\\%c", *p++);
        } else if (*p < 0x20 || *p == 0x7f) {
            printf("\\u%04x", *p++);
        } else {
            size_t n = ctl_utf8_len(p);
            if (n == 0) {
                fputs("\\ufffd", stdout);
                p++;
            } else {
                fwrite(p, 1, n, stdout);
                p += n;
            }
        }
    }
    putchar('"');
}

void ctl_json_begin(struct ctl_json *j)
{
    j->fields = 0;
    putchar('{');
}

void ctl_json_str(struct ctl_json *j, const char *key, const char *v)
{
    ctl_json_key(j, key);
    if (v != NULL)
        ctl_json_string(v);
    else
        fputs("null", stdout);
}

void ctl_json_int(struct ctl_json *j, const char *key, long long v)
{
    ctl_json_key(j, key);
    printf("%lld", v);
}

void ctl_json_u64(struct ctl_json *j, const char *key, uint64_t v)
{
    ctl_json_key(j, key);
    printf("%llu", (unsigned long long)v);
}

void ctl_json_num(struct ctl_json *j, const char *key, double v)
{
    ctl_json_key(j, key);
    if (isfinite(v))
        printf("%.6g", v);
    else
        fputs("null", stdout);
}

void ctl_json_bool(struct ctl_json *j, const char *key, bool v)
{
    ctl_json_key(j, key);
    fputs(v ? "true" : "false", stdout);
}

void ctl_json_problem(struct ctl_json *j, const struct convd_problem *p,
                      const struct convd_problem_sizes *z)
{
    const struct {
        const char *key;
        int32_t v;
    } dims[] = {
        {"n", p->n},
        {"h", p->h},
        {"w", p->w},
        {"c", p->c},
        {"k", p->k},
        {"r", p->r},
        {"s", p->s},
        {"groups", p->groups},
        {"stride_h", p->stride_h},
        {"stride_w", p->stride_w},
        {"pad_top", p->pad_top},
        {"pad_bottom", p->pad_bottom},
        {"pad_left", p->pad_left},
        {"pad_right", p->pad_right},
        {"dil_h", p->dil_h},
        {"dil_w", p->dil_w},
    };
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++)
        ctl_json_int(j, dims[i].key, dims[i].v);
    ctl_json_str(j, "dtype", convd_dtype_name(p->dtype));
    ctl_json_str(j, "layout", convd_layout_name(p->layout));
    ctl_json_bool(j, "bias", p->has_bias);
    ctl_json_bool(j, "relu", p->activation == CONVD_ACT_RELU);
    ctl_json_bool(j, "allow_tf32", p->allow_tf32);
    ctl_json_str(j, "activation", convd_activation_name(p->activation));
    if (p->activation == CONVD_ACT_CLAMP) {
        ctl_json_num(j, "act_min", p->act_min);
        ctl_json_num(j, "act_max", p->act_max);
    }
    ctl_json_u64(j, "input_bytes", z->input_bytes);
    ctl_json_u64(j, "weight_bytes", z->weight_bytes);
    ctl_json_u64(j, "bias_bytes", z->bias_bytes);
    ctl_json_u64(j, "output_bytes", z->output_bytes);
    ctl_json_u64(j, "flops", z->flops);
}

void ctl_json_end(struct ctl_json *j)
{
    (void)j;
    fputs("}\n", stdout);
    fflush(stdout);
}
