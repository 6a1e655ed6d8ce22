/*
 * .npy headers. The header is a Python literal; this accepts exactly the subset numpy writes and
 * its loader accepts: a dict of the three keys descr (a type string), fortran_order (True or
 * False) and shape (a tuple of non-negative integers, the Python 2 "L" suffix allowed), in any
 * order, with optional trailing commas, then padding.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "convd/status.h"
#include "npy.h"
#include "why.h"

static const char npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

int npy_header_length(const void *buf, size_t len, size_t *ret_total, char *why, size_t why_len)
{
    const uint8_t *b = buf;
    size_t prefix;
    uint32_t hlen;

    if (memcmp(b, npy_magic, len < sizeof(npy_magic) ? len : sizeof(npy_magic)) != 0)
        return why_fail(why, why_len, CONVD_EINVAL, "not a .npy file (no \\x93NUMPY magic)");
    if (len < 8)
        return CONVD_EAGAIN;
    if (b[6] < 1 || b[6] > 3 || b[7] != 0)
        return why_fail(why, why_len, CONVD_EINVAL,
                        "unsupported .npy format version %u.%u (known: 1.0, 2.0, 3.0)", b[6], b[7]);
    prefix = b[6] == 1 ? 10 : 12;
    if (len < prefix)
        return CONVD_EAGAIN;
    if (b[6] == 1)
        hlen = (uint32_t)b[8] | (uint32_t)b[9] << 8;
    else
        hlen = (uint32_t)b[8] | (uint32_t)b[9] << 8 | (uint32_t)b[10] << 16 | (uint32_t)b[11] << 24;
    if (hlen > NPY_MAX_HEADER_BYTES)
        return why_fail(why, why_len, CONVD_EINVAL,
                        "header of %u bytes is longer than the %u accepted", hlen,
                        NPY_MAX_HEADER_BYTES);
    *ret_total = prefix + hlen;
    return 0;
}

/* A cursor over the header text. */
struct npy_lex {
    const char *p, *end;
    char *why;
    size_t why_len;
};

static void npy_ws(struct npy_lex *x)
{
    while (x->p < x->end && (*x->p == ' ' || *x->p == '\t' || *x->p == '\n' || *x->p == '\r'))
        x->p++;
}

static bool npy_eat(struct npy_lex *x, char ch)
{
    npy_ws(x);
    if (x->p < x->end && *x->p == ch) {
        x->p++;
        return true;
    }
    return false;
}

/* A quoted string without escapes (numpy never writes any in these headers). */
static int npy_string(struct npy_lex *x, char *out, size_t cap, const char *what)
{
    npy_ws(x);
    if (x->p >= x->end || (*x->p != '\'' && *x->p != '"'))
        return why_fail(x->why, x->why_len, CONVD_EINVAL, "expected a quoted string for %s", what);
    char q = *x->p++;
    const char *s = x->p;
    while (x->p < x->end && *x->p != q) {
        if (*x->p == '\\' || *x->p == '\n' || *x->p == '\0')
            return why_fail(x->why, x->why_len, CONVD_EINVAL,
                            "unsupported character in the string of %s", what);
        x->p++;
    }
    if (x->p >= x->end)
        return why_fail(x->why, x->why_len, CONVD_EINVAL, "unterminated string in %s", what);
    size_t n = (size_t)(x->p - s);
    x->p++;
    if (n >= cap)
        return why_fail(x->why, x->why_len, CONVD_EINVAL,
                        "the string of %s is too long (%zu bytes)", what, n);
    memcpy(out, s, n);
    out[n] = '\0';
    return 0;
}

static int npy_word(struct npy_lex *x, const char *w)
{
    size_t n = strlen(w);
    npy_ws(x);
    if ((size_t)(x->end - x->p) < n || memcmp(x->p, w, n) != 0)
        return -1;
    /* "Trueish" is not True. */
    if ((size_t)(x->end - x->p) > n) {
        char next = x->p[n];
        if ((next >= 'a' && next <= 'z') || (next >= 'A' && next <= 'Z') ||
            (next >= '0' && next <= '9') || next == '_')
            return -1;
    }
    x->p += n;
    return 0;
}

static int npy_bool(struct npy_lex *x, bool *ret)
{
    if (npy_word(x, "True") == 0) {
        *ret = true;
        return 0;
    }
    if (npy_word(x, "False") == 0) {
        *ret = false;
        return 0;
    }
    return why_fail(x->why, x->why_len, CONVD_EINVAL, "fortran_order must be True or False");
}

static int npy_uint(struct npy_lex *x, uint64_t *ret)
{
    npy_ws(x);
    if (x->p >= x->end || *x->p < '0' || *x->p > '9')
        return why_fail(x->why, x->why_len, CONVD_EINVAL,
                        "shape holds something other than a non-negative "
                        "integer");
    uint64_t v = 0;
    while (x->p < x->end && *x->p >= '0' && *x->p <= '9') {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, *x->p - '0', &v))
            return why_fail(x->why, x->why_len, CONVD_EINVAL,
                            "a dimension of shape overflows 64 bits");
        x->p++;
    }
    if (x->p < x->end && (*x->p == 'L' || *x->p == 'l'))
        x->p++; /* Python 2 long, written by old numpy */
    *ret = v;
    return 0;
}

/* A tuple: "()", "(5,)", "(2, 3)", "(2, 3,)". A single element needs its comma in Python:
 * "(5)" is an integer, which numpy refuses as a shape. */
static int npy_shape(struct npy_lex *x, struct npy_header *h)
{
    if (!npy_eat(x, '('))
        return why_fail(x->why, x->why_len, CONVD_EINVAL, "shape must be a tuple");
    h->ndim = 0;
    if (npy_eat(x, ')'))
        return 0;
    bool comma = false;
    for (;;) {
        if (h->ndim == NPY_MAX_DIMS)
            return why_fail(x->why, x->why_len, CONVD_EINVAL, "shape has more than %d dimensions",
                            NPY_MAX_DIMS);
        int rc = npy_uint(x, &h->shape[h->ndim]);
        if (rc != 0)
            return rc;
        h->ndim++;
        comma = npy_eat(x, ',');
        if (npy_eat(x, ')'))
            break;
        if (!comma)
            return why_fail(x->why, x->why_len, CONVD_EINVAL, "shape tuple is malformed");
    }
    if (h->ndim == 1 && !comma)
        return why_fail(x->why, x->why_len, CONVD_EINVAL,
                        "shape is a parenthesised integer, not a tuple");
    return 0;
}

/* descr: an optional byte-order character, a kind letter and the item size in bytes. */
static int npy_descr(struct npy_header *h, char *why, size_t why_len)
{
    const char *d = h->descr;
    if (d[0] == '[' || d[0] == '(' || d[0] == '{')
        return why_fail(why, why_len, CONVD_EINVAL, "structured dtype %s is not supported", d);
    h->byteorder = '=';
    if (*d == '<' || *d == '>' || *d == '|' || *d == '=')
        h->byteorder = *d++;
    if (!((*d >= 'a' && *d <= 'z') || (*d >= 'A' && *d <= 'Z')))
        return why_fail(why, why_len, CONVD_EINVAL, "descr '%s' is not a numpy type string",
                        h->descr);
    h->kind = *d++;
    if (*d < '1' || *d > '9')
        return why_fail(why, why_len, CONVD_EINVAL, "descr '%s' has no item size", h->descr);
    uint32_t size = 0;
    while (*d >= '0' && *d <= '9') {
        size = size * 10 + (uint32_t)(*d++ - '0');
        if (size > 1u << 20)
            return why_fail(why, why_len, CONVD_EINVAL, "descr '%s' has an absurd item size",
                            h->descr);
    }
    if (*d != '\0')
        return why_fail(why, why_len, CONVD_EINVAL,
                        "descr '%s' is not supported (units or extra characters)", h->descr);
    h->itemsize = size;
    return 0;
}

int npy_parse_header(const void *buf, size_t len, struct npy_header *ret, char *why, size_t why_len)
{
    size_t total;
    int rc = npy_header_length(buf, len, &total, why, why_len);
    if (rc == CONVD_EAGAIN || (rc == 0 && total > len))
        return why_fail(why, why_len, CONVD_EINVAL, "truncated header: %zu bytes given", len);
    if (rc != 0)
        return rc;

    const uint8_t *b = buf;
    struct npy_header h;
    memset(&h, 0, sizeof(h));
    h.major = b[6];
    h.minor = b[7];
    size_t prefix = h.major == 1 ? 10 : 12;
    struct npy_lex x = {(const char *)b + prefix, (const char *)b + total, why, why_len};

    /* Versions 1.0 and 2.0 are latin-1, 3.0 UTF-8; the grammar below is ASCII either way, so
     * any other byte fails to parse where it stands. */
    if (!npy_eat(&x, '{'))
        return why_fail(why, why_len, CONVD_EINVAL, "header is not a dict");
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    for (;;) {
        if (npy_eat(&x, '}'))
            break;
        char key[32];
        if ((rc = npy_string(&x, key, sizeof(key), "a key")) != 0)
            return rc;
        if (!npy_eat(&x, ':'))
            return why_fail(why, why_len, CONVD_EINVAL, "expected ':' after key '%s'", key);
        bool *seen;
        if (strcmp(key, "descr") == 0) {
            seen = &seen_descr;
            npy_ws(&x);
            if (x.p < x.end && (*x.p == '[' || *x.p == '('))
                return why_fail(why, why_len, CONVD_EINVAL, "structured dtypes are not supported");
            rc = npy_string(&x, h.descr, sizeof(h.descr), "descr");
        } else if (strcmp(key, "fortran_order") == 0) {
            seen = &seen_fortran;
            rc = npy_bool(&x, &h.fortran_order);
        } else if (strcmp(key, "shape") == 0) {
            seen = &seen_shape;
            rc = npy_shape(&x, &h);
        } else {
            return why_fail(why, why_len, CONVD_EINVAL, "unknown key '%s' in the header", key);
        }
        if (rc != 0)
            return rc;
        if (*seen)
            return why_fail(why, why_len, CONVD_EINVAL, "key '%s' appears twice", key);
        *seen = true;
        if (npy_eat(&x, ','))
            continue;
        if (npy_eat(&x, '}'))
            break;
        return why_fail(why, why_len, CONVD_EINVAL, "expected ',' or '}' after the value of '%s'",
                        key);
    }
    npy_ws(&x);
    if (x.p != x.end)
        return why_fail(why, why_len, CONVD_EINVAL,
                        "unexpected characters after the header's dict");
    if (!seen_descr || !seen_fortran || !seen_shape)
        return why_fail(why, why_len, CONVD_EINVAL, "header lacks the key '%s'",
                        !seen_descr     ? "descr"
                        : !seen_fortran ? "fortran_order"
                                        : "shape");
    if ((rc = npy_descr(&h, why, why_len)) != 0)
        return rc;

    h.count = 1;
    for (uint32_t i = 0; i < h.ndim; i++)
        if (__builtin_mul_overflow(h.count, h.shape[i], &h.count))
            return why_fail(why, why_len, CONVD_EINVAL,
                            "the shape's element count overflows 64 bits");
    if (__builtin_mul_overflow(h.count, (uint64_t)h.itemsize, &h.data_bytes))
        return why_fail(why, why_len, CONVD_EINVAL, "the array's size overflows 64 bits");
    h.data_offset = total;
    *ret = h;
    return 0;
}

int npy_write_header(void *buf, size_t cap, const char *descr, const uint64_t *shape, uint32_t ndim,
                     size_t *ret_len)
{
    char text[64 + NPY_MAX_DIMS * 22];
    if (descr == NULL || strlen(descr) >= 16 || strchr(descr, '\'') != NULL ||
        ndim > NPY_MAX_DIMS || (ndim > 0 && shape == NULL))
        return CONVD_EINVAL;
    size_t n = (size_t)snprintf(text, sizeof(text),
                                "{'descr': '%s', 'fortran_order': False, "
                                "'shape': (",
                                descr);
    for (uint32_t i = 0; i < ndim; i++)
        n += (size_t)snprintf(text + n, sizeof(text) - n, "%s%llu", i > 0 ? ", " : "",
                              (unsigned long long)shape[i]);
    n += (size_t)snprintf(text + n, sizeof(text) - n, "%s), }", ndim == 1 ? "," : "");

    /* Version 1.0 holds the length in 16 bits; longer headers need 2.0, as numpy decides. */
    size_t prefix = 10;
    size_t total = (prefix + n + 1 + 63) / 64 * 64;
    if (total - prefix > 65535) {
        prefix = 12;
        total = (prefix + n + 1 + 63) / 64 * 64;
    }
    if (total > cap)
        return CONVD_ETOOBIG;
    uint8_t *b = buf;
    size_t hlen = total - prefix;
    memcpy(b, npy_magic, sizeof(npy_magic));
    b[6] = prefix == 10 ? 1 : 2;
    b[7] = 0;
    b[8] = (uint8_t)(hlen & 0xff);
    b[9] = (uint8_t)(hlen >> 8 & 0xff);
    if (prefix == 12) {
        b[10] = (uint8_t)(hlen >> 16 & 0xff);
        b[11] = (uint8_t)(hlen >> 24 & 0xff);
    }
    memcpy(b + prefix, text, n);
    memset(b + prefix + n, ' ', hlen - n - 1);
    b[total - 1] = '\n';
    *ret_len = total;
    return 0;
}
