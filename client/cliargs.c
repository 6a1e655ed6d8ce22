/* Parsing helpers of convctl; see cliargs.h. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cliargs.h"
#include "why.h"

int cli_parse_int(const char *s, long long lo, long long hi, long long *ret, char *why,
                  size_t why_len)
{
    if (s == NULL || *s == '\0')
        return why_fail(why, why_len, CONVD_EINVAL, "expected a number, got nothing");
    /* strtoll skips leading blanks and accepts "+"; be strict about what a user typed. */
    if (!(*s >= '0' && *s <= '9') && !(*s == '-' && s[1] >= '0' && s[1] <= '9'))
        return why_fail(why, why_len, CONVD_EINVAL, "'%s' is not a whole number", s);
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end != '\0')
        return why_fail(why, why_len, CONVD_EINVAL, "'%s' is not a whole number", s);
    if (errno == ERANGE || v < lo || v > hi)
        return why_fail(why, why_len, CONVD_EINVAL, "%s is out of range (%lld to %lld)", s, lo, hi);
    *ret = v;
    return 0;
}

int cli_parse_double(const char *s, double lo, double hi, double *ret, char *why, size_t why_len)
{
    if (s == NULL || *s == '\0')
        return why_fail(why, why_len, CONVD_EINVAL, "expected a number, got nothing");
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (*end != '\0' || end == s || *s == ' ' || !isfinite(v))
        return why_fail(why, why_len, CONVD_EINVAL, "'%s' is not a number", s);
    if (v < lo || v > hi)
        return why_fail(why, why_len, CONVD_EINVAL, "%s is out of range (%g to %g)", s, lo, hi);
    *ret = v;
    return 0;
}

/* Splits s at commas into at most max integers in [lo, hi]. Returns the count or -1. */
static int cli_split_ints(const char *s, int max, int32_t lo, int32_t hi, int32_t *out, char *why,
                          size_t why_len)
{
    char buf[128];
    if (s == NULL || strlen(s) >= sizeof(buf)) {
        why_fail(why, why_len, CONVD_EINVAL, "'%s' is not a list of numbers", s != NULL ? s : "");
        return -1;
    }
    strcpy(buf, s);
    int n = 0;
    /* strtok would merge empty fields ("1,,2"); walk the commas by hand. */
    char *p = buf;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma != NULL)
            *comma = '\0';
        long long v;
        if (n == max) {
            why_fail(why, why_len, CONVD_EINVAL, "'%s' has more than %d values", s, max);
            return -1;
        }
        if (cli_parse_int(p, lo, hi, &v, why, why_len) != 0)
            return -1;
        out[n++] = (int32_t)v;
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    return n;
}

int cli_parse_pair(const char *s, int32_t lo, int32_t hi, int32_t ret[2], char *why, size_t why_len)
{
    int32_t v[2];
    int n = cli_split_ints(s, 2, lo, hi, v, why, why_len);
    if (n < 0)
        return CONVD_EINVAL;
    ret[0] = v[0];
    ret[1] = n == 2 ? v[1] : v[0];
    return 0;
}

int cli_parse_pad(const char *s, int32_t ret[4], char *why, size_t why_len)
{
    int32_t v[4];
    int n = cli_split_ints(s, 4, 0, CONVD_MAX_PAD, v, why, why_len);
    if (n < 0)
        return CONVD_EINVAL;
    switch (n) {
    case 1:
        ret[0] = ret[1] = ret[2] = ret[3] = v[0];
        return 0;
    case 2:
        ret[0] = ret[1] = v[0];
        ret[2] = ret[3] = v[1];
        return 0;
    case 4:
        memcpy(ret, v, sizeof(v));
        return 0;
    }
    return why_fail(why, why_len, CONVD_EINVAL, "padding '%s' must be P, PH,PW or PT,PB,PL,PR", s);
}

/* --act: a name, or clamp:LO,HI. */
static int cli_parse_act(const char *value, struct convd_problem *p, char *why, size_t why_len)
{
    if (strncmp(value, "clamp:", 6) == 0) {
        const char *lo = value + 6;
        char *end;
        errno = 0;
        float a = strtof(lo, &end);
        float b = 0.0f;
        bool ok = errno == 0 && end != lo && *end == ',';
        if (ok) {
            const char *hi = end + 1;
            b = strtof(hi, &end);
            ok = errno == 0 && end != hi && *end == '\0' && !isnan(a) && !isnan(b) && a <= b;
        }
        if (!ok)
            return why_fail(why, why_len, CONVD_EINVAL,
                            "'%s': clamp takes two numbers, low first: clamp:LO,HI", value);
        p->activation = CONVD_ACT_CLAMP;
        p->act_min = a;
        p->act_max = b;
        return 0;
    }
    if (strcmp(value, "clamp") == 0)
        return why_fail(why, why_len, CONVD_EINVAL, "clamp needs its bounds: clamp:LO,HI");
    if (convd_activation_parse(value, p) != 0)
        return why_fail(why, why_len, CONVD_EINVAL,
                        "unknown activation '%s' (none, relu, relu6, clamp:LO,HI, silu, "
                        "hardswish, gelu or gelu_tanh)",
                        value);
    return 0;
}

static const char *const cli_po_names[CLI_PO_COUNT] = {
#define CLI_PO_NAME(id, name, takes_value, in_conv) [CLI_PO_##id] = name,
    CLI_PROBLEM_OPTIONS(CLI_PO_NAME)
#undef CLI_PO_NAME
};

const char *cli_problem_option_name(int i)
{
    return i >= 0 && i < CLI_PO_COUNT ? cli_po_names[i] : NULL;
}

int cli_problem_option(struct convd_problem *p, const char *name, const char *value, char *why,
                       size_t why_len)
{
    /* The fields of the size options, n .. groups. */
    static const size_t dims[CLI_PO_GROUPS + 1] = {
        [CLI_PO_N] = offsetof(struct convd_problem, n),
        [CLI_PO_C] = offsetof(struct convd_problem, c),
        [CLI_PO_H] = offsetof(struct convd_problem, h),
        [CLI_PO_W] = offsetof(struct convd_problem, w),
        [CLI_PO_K] = offsetof(struct convd_problem, k),
        [CLI_PO_R] = offsetof(struct convd_problem, r),
        [CLI_PO_S] = offsetof(struct convd_problem, s),
        [CLI_PO_GROUPS] = offsetof(struct convd_problem, groups),
    };
    int i = 0;
    while (i < CLI_PO_COUNT && strcmp(name, cli_po_names[i]) != 0)
        i++;
    if (i == CLI_PO_COUNT)
        return why_fail(why, why_len, CONVD_EINVAL, "unknown problem option --%s", name);
    if (i == CLI_PO_BIAS) {
        p->has_bias = true;
        return 0;
    }
    if (i == CLI_PO_RELU) {
        p->activation = CONVD_ACT_RELU;
        p->act_min = p->act_max = 0.0f;
        return 0;
    }
    if (i == CLI_PO_TF32) {
        p->allow_tf32 = true;
        return 0;
    }
    if (value == NULL)
        return why_fail(why, why_len, CONVD_EINVAL, "--%s needs a value", name);
    if (i <= CLI_PO_GROUPS) {
        long long v;
        if (cli_parse_int(value, 1, CONVD_MAX_DIM, &v, why, why_len) != 0)
            return CONVD_EINVAL;
        int32_t *field = (int32_t *)((char *)p + dims[i]);
        *field = (int32_t)v;
        return 0;
    }
    int32_t v[4];
    if (i == CLI_PO_STRIDE || i == CLI_PO_DILATION) {
        if (cli_parse_pair(value, 1, CONVD_MAX_STRIDE, v, why, why_len) != 0)
            return CONVD_EINVAL;
        if (i == CLI_PO_STRIDE) {
            p->stride_h = v[0];
            p->stride_w = v[1];
        } else {
            p->dil_h = v[0];
            p->dil_w = v[1];
        }
        return 0;
    }
    if (i == CLI_PO_PAD) {
        if (cli_parse_pad(value, v, why, why_len) != 0)
            return CONVD_EINVAL;
        p->pad_top = v[0];
        p->pad_bottom = v[1];
        p->pad_left = v[2];
        p->pad_right = v[3];
        return 0;
    }
    if (i == CLI_PO_DTYPE) {
        if (convd_dtype_parse(value, &p->dtype) != 0)
            return why_fail(why, why_len, CONVD_EINVAL, "unknown dtype '%s' (fp32, fp16 or bf16)",
                            value);
        return 0;
    }
    if (i == CLI_PO_LAYOUT) {
        if (convd_layout_parse(value, &p->layout) != 0)
            return why_fail(why, why_len, CONVD_EINVAL, "unknown layout '%s' (nchw or nhwc)",
                            value);
        return 0;
    }
    if (i == CLI_PO_ACT)
        return cli_parse_act(value, p, why, why_len);
    return why_fail(why, why_len, CONVD_EINVAL, "unknown problem option --%s", name);
}

/*
 * Shapes CSV.
 */

enum {
    CLI_COL_NAME,
    CLI_COL_N,
    CLI_COL_H,
    CLI_COL_W,
    CLI_COL_C,
    CLI_COL_K,
    CLI_COL_R,
    CLI_COL_S,
    CLI_COL_STRIDE,
    CLI_COL_PAD,
    CLI_COL_DIL,
    CLI_COL_GROUPS,
    CLI_NCOLS
};

static const char *const cli_col_names[CLI_NCOLS] = {
    "name", "n", "h", "w", "c", "k", "r", "s", "stride", "pad", "dil", "groups",
};

/* Splits one line (NUL-terminated, no newline) at commas in place, trimming blanks. */
static size_t cli_csv_fields(char *line, char **fields, size_t max)
{
    size_t n = 0;
    char *p = line;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma != NULL)
            *comma = '\0';
        while (*p == ' ' || *p == '\t')
            p++;
        char *e = p + strlen(p);
        while (e > p && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
            *--e = '\0';
        if (n < max)
            fields[n] = p;
        n++;
        if (comma == NULL)
            return n;
        p = comma + 1;
    }
}

int cli_shapes_parse(const char *text, size_t len, struct cli_shape **ret_rows, size_t *ret_count,
                     char *why, size_t why_len)
{
    enum { MAX_FIELDS = 64 };
    int rc = CONVD_EINVAL;
    char *copy = malloc(len + 1);
    struct cli_shape *rows = NULL;
    size_t count = 0, cap = 0;
    int col[CLI_NCOLS];
    bool have_header = false;
    if (copy == NULL)
        return why_fail(why, why_len, CONVD_EINVAL, "out of memory");
    memcpy(copy, text, len);
    copy[len] = '\0';
    if (memchr(copy, '\0', len) != NULL) {
        why_fail(why, why_len, CONVD_EINVAL, "the CSV contains a NUL byte");
        goto finish;
    }

    size_t lineno = 0;
    for (char *line = copy; line != NULL;) {
        char *nl = strchr(line, '\n');
        if (nl != NULL)
            *nl = '\0';
        char *cur = line;
        line = nl != NULL ? nl + 1 : NULL;
        lineno++;
        while (*cur == ' ' || *cur == '\t' || *cur == '\r')
            cur++;
        if (*cur == '\0' || *cur == '#')
            continue;
        char *f[MAX_FIELDS];
        size_t nf = cli_csv_fields(cur, f, MAX_FIELDS);
        if (nf > MAX_FIELDS) {
            why_fail(why, why_len, CONVD_EINVAL, "line %zu has more than %d columns", lineno,
                     MAX_FIELDS);
            goto finish;
        }
        if (!have_header) {
            for (int c = 0; c < CLI_NCOLS; c++) {
                col[c] = -1;
                for (size_t i = 0; i < nf; i++)
                    if (strcmp(f[i], cli_col_names[c]) == 0)
                        col[c] = (int)i;
                if (col[c] < 0) {
                    why_fail(why, why_len, CONVD_EINVAL, "the header line lacks the column '%s'",
                             cli_col_names[c]);
                    goto finish;
                }
            }
            have_header = true;
            continue;
        }
        struct cli_shape row;
        memset(&row, 0, sizeof(row));
        int32_t *vals[CLI_NCOLS] = {NULL,   &row.n, &row.h,      &row.w,   &row.c,   &row.k,
                                    &row.r, &row.s, &row.stride, &row.pad, &row.dil, &row.groups};
        for (int c = 0; c < CLI_NCOLS; c++) {
            if ((size_t)col[c] >= nf) {
                why_fail(why, why_len, CONVD_EINVAL, "line %zu has no value for column '%s'",
                         lineno, cli_col_names[c]);
                goto finish;
            }
            const char *v = f[col[c]];
            if (c == CLI_COL_NAME) {
                if (*v == '\0' || strlen(v) >= sizeof(row.name)) {
                    why_fail(why, why_len, CONVD_EINVAL, "line %zu: the name is empty or too long",
                             lineno);
                    goto finish;
                }
                strcpy(row.name, v);
                continue;
            }
            long long x;
            char sub[128];
            long long lo = c == CLI_COL_PAD ? 0 : 1;
            long long hi = c == CLI_COL_PAD                          ? CONVD_MAX_PAD
                           : c == CLI_COL_STRIDE || c == CLI_COL_DIL ? CONVD_MAX_STRIDE
                                                                     : CONVD_MAX_DIM;
            if (cli_parse_int(v, lo, hi, &x, sub, sizeof(sub)) != 0) {
                why_fail(why, why_len, CONVD_EINVAL, "line %zu, column '%s': %s", lineno,
                         cli_col_names[c], sub);
                goto finish;
            }
            *vals[c] = (int32_t)x;
        }
        if (cli_shapes_find(rows, count, row.name) != NULL) {
            why_fail(why, why_len, CONVD_EINVAL, "line %zu: shape '%s' appears twice", lineno,
                     row.name);
            goto finish;
        }
        if (count == cap) {
            size_t ncap = cap > 0 ? cap * 2 : 16;
            struct cli_shape *nrows = realloc(rows, ncap * sizeof(*nrows));
            if (nrows == NULL) {
                why_fail(why, why_len, CONVD_EINVAL, "out of memory");
                goto finish;
            }
            rows = nrows;
            cap = ncap;
        }
        rows[count++] = row;
    }
    if (!have_header) {
        why_fail(why, why_len, CONVD_EINVAL, "the CSV has no header line");
        goto finish;
    }
    *ret_rows = rows;
    *ret_count = count;
    rows = NULL;
    rc = 0;
finish:
    free(rows);
    free(copy);
    return rc;
}

int cli_read_file(const char *path, uint8_t **ret_data, size_t *ret_len, char *why, size_t why_len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return why_fail(why, why_len, CONVD_EINVAL, "cannot open %s: %s", path, strerror(errno));
    uint8_t *data = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len == cap) {
            size_t ncap = cap > 0 ? cap * 2 : 1 << 16;
            uint8_t *nd = realloc(data, ncap);
            if (nd == NULL) {
                rc = why_fail(why, why_len, CONVD_ENOMEM, "out of memory reading %s", path);
                break;
            }
            data = nd;
            cap = ncap;
        }
        size_t n = fread(data + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            if (ferror(f))
                rc = why_fail(why, why_len, CONVD_EINVAL, "cannot read %s: %s", path,
                              strerror(errno));
            break;
        }
    }
    fclose(f);
    if (rc != 0) {
        free(data);
        return rc;
    }
    *ret_data = data;
    *ret_len = len;
    return 0;
}

int cli_shapes_load(const char *path, struct cli_shape **ret_rows, size_t *ret_count, char *why,
                    size_t why_len)
{
    uint8_t *text;
    size_t len;
    int rc = cli_read_file(path, &text, &len, why, why_len);
    if (rc != 0)
        return rc;
    char inner[200];
    rc = cli_shapes_parse((const char *)text, len, ret_rows, ret_count, inner, sizeof(inner));
    free(text);
    if (rc != 0)
        return why_fail(why, why_len, rc, "%s: %s", path, inner);
    return 0;
}

const struct cli_shape *cli_shapes_find(const struct cli_shape *rows, size_t count,
                                        const char *name)
{
    for (size_t i = 0; i < count; i++)
        if (strcmp(rows[i].name, name) == 0)
            return &rows[i];
    return NULL;
}

void cli_shape_apply(const struct cli_shape *row, struct convd_problem *p)
{
    p->n = row->n;
    p->h = row->h;
    p->w = row->w;
    p->c = row->c;
    p->k = row->k;
    p->r = row->r;
    p->s = row->s;
    p->groups = row->groups;
    p->stride_h = p->stride_w = row->stride;
    p->pad_top = p->pad_bottom = p->pad_left = p->pad_right = row->pad;
    p->dil_h = p->dil_w = row->dil;
}
