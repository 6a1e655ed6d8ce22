/* Shared helpers of convctl; see util.h. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

static const char *const ctl_problem_option_names[CTL_PROBLEM_OPTION_COUNT] = {
    "n",      "c",   "h",        "w",     "k",      "r",    "s",    "groups",
    "stride", "pad", "dilation", "dtype", "layout", "bias", "relu",
};

void ctl_err(const char *fmt, ...)
{
    va_list ap;
    fputs("convctl: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int ctl_connect(const struct ctl_global *g, convd_client **ret_client)
{
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    o.socket_path = g->socket;
    o.client_name = "convctl";
    o.timeout_ms = g->timeout_ms;
    int rc = convd_connect(&o, ret_client);
    if (rc != 0)
        ctl_err("cannot connect to the daemon: %s (%s)", convd_last_connect_error(),
                convd_status_name(rc));
    return rc;
}

bool ctl_common_option(struct ctl_global *g, int opt, const char *arg, int *ret_exit)
{
    char why[128];
    long long v;
    switch (opt) {
    case CTL_OPT_SOCKET:
        g->socket = arg;
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
    if (cli_problem_option(p, ctl_problem_option_names[i], arg, why, sizeof(why)) != 0) {
        ctl_err("--%s: %s", ctl_problem_option_names[i], why);
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
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        ctl_err("cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    uint8_t *data = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            size_t ncap = cap > 0 ? cap * 2 : 1 << 16;
            uint8_t *nd = realloc(data, ncap);
            if (nd == NULL) {
                ctl_err("out of memory reading %s", path);
                goto fail;
            }
            data = nd;
            cap = ncap;
        }
        size_t n = fread(data + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            if (ferror(f)) {
                ctl_err("cannot read %s: %s", path, strerror(errno));
                goto fail;
            }
            break;
        }
    }
    fclose(f);
    *ret_data = data;
    *ret_len = len;
    return 0;
fail:
    free(data);
    fclose(f);
    return -1;
}

int ctl_load_shapes(const char *path, struct cli_shape **ret_rows, size_t *ret_count)
{
    uint8_t *text;
    size_t len;
    if (ctl_read_file(path, &text, &len) != 0)
        return -1;
    char why[256];
    int rc = cli_shapes_parse((const char *)text, len, ret_rows, ret_count, why, sizeof(why));
    free(text);
    if (rc != 0) {
        ctl_err("%s: %s", path, why);
        return -1;
    }
    return 0;
}

void ctl_rng_seed(struct ctl_rng *g, uint64_t seed)
{
    g->s = seed != 0 ? seed : 0x9e3779b97f4a7c15ull;
}

uint64_t ctl_rng_next(struct ctl_rng *g)
{
    g->s ^= g->s >> 12;
    g->s ^= g->s << 25;
    g->s ^= g->s >> 27;
    return g->s * 0x2545f4914f6cdd1dull;
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

double ctl_tolerance(enum convd_dtype dtype)
{
    return dtype == CONVD_DTYPE_FP32 ? 1e-5 : 1e-2;
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
