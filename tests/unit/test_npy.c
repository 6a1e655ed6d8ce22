/* The .npy header parser and writer (client/npy.c): every version, numpy's own spellings, and
 * every malformed case the parser must refuse with a sentence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "convd/status.h"
#include "npy.h"

/* Builds a file prefix of the given version around header text, padded as numpy pads (spaces and
 * a newline to a multiple of 64). Returns the total length. */
static size_t mk(uint8_t *buf, size_t cap, int major, int minor, const char *text)
{
    size_t prefix = major == 1 ? 10 : 12;
    size_t n = strlen(text);
    size_t total = (prefix + n + 1 + 63) / 64 * 64;
    assert_true(total <= cap);
    size_t hlen = total - prefix;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (uint8_t)major;
    buf[7] = (uint8_t)minor;
    buf[8] = (uint8_t)(hlen & 0xff);
    buf[9] = (uint8_t)(hlen >> 8);
    if (prefix == 12) {
        buf[10] = (uint8_t)(hlen >> 16);
        buf[11] = (uint8_t)(hlen >> 24);
    }
    memcpy(buf + prefix, text, n);
    memset(buf + prefix + n, ' ', hlen - n - 1);
    buf[total - 1] = '\n';
    return total;
}

static int parse(int major, const char *text, struct npy_header *h, char *why, size_t why_len)
{
    uint8_t buf[8192];
    size_t len = mk(buf, sizeof(buf), major, 0, text);
    return npy_parse_header(buf, len, h, why, why_len);
}

static void test_valid_v1(void **state)
{
    (void)state;
    struct npy_header h;
    char why[256] = "";
    /* Exactly what numpy 1.x/2.x writes for np.zeros((2, 3, 4, 5), np.float32). */
    assert_int_equal(parse(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 4, 5), }",
                           &h, why, sizeof(why)),
                     0);
    assert_int_equal(h.major, 1);
    assert_int_equal(h.minor, 0);
    assert_string_equal(h.descr, "<f4");
    assert_int_equal(h.byteorder, '<');
    assert_int_equal(h.kind, 'f');
    assert_int_equal(h.itemsize, 4);
    assert_false(h.fortran_order);
    assert_int_equal(h.ndim, 4);
    assert_int_equal(h.shape[0], 2);
    assert_int_equal(h.shape[3], 5);
    assert_int_equal(h.count, 120);
    assert_int_equal(h.data_bytes, 480);
    assert_int_equal(h.data_offset, 128);
    assert_int_equal(h.data_offset % 64, 0);
}

static void test_valid_v2_v3(void **state)
{
    (void)state;
    struct npy_header h;
    char why[256] = "";
    assert_int_equal(
        parse(2, "{'descr': '<f2', 'fortran_order': False, 'shape': (5,), }", &h, why, sizeof(why)),
        0);
    assert_int_equal(h.major, 2);
    assert_int_equal(h.ndim, 1);
    assert_int_equal(h.shape[0], 5);
    assert_int_equal(h.itemsize, 2);
    assert_int_equal(h.data_offset % 64, 0);

    /* A 0-d array: shape () holds one element. */
    assert_int_equal(
        parse(3, "{'descr': '<u2', 'fortran_order': False, 'shape': (), }", &h, why, sizeof(why)),
        0);
    assert_int_equal(h.major, 3);
    assert_int_equal(h.ndim, 0);
    assert_int_equal(h.count, 1);
    assert_int_equal(h.kind, 'u');
    assert_int_equal(h.data_bytes, 2);

    /* An empty array. */
    assert_int_equal(parse(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 0), }", &h,
                           why, sizeof(why)),
                     0);
    assert_int_equal(h.count, 0);
    assert_int_equal(h.data_bytes, 0);
}

static void test_valid_spellings(void **state)
{
    (void)state;
    struct npy_header h;
    char why[256] = "";
    /* Keys in another order, double quotes, no trailing comma, extra blanks. */
    assert_int_equal(parse(1, "{ \"shape\" : ( 7 , 8 ) , \"fortran_order\":True,\"descr\":\">f8\"}",
                           &h, why, sizeof(why)),
                     0);
    assert_true(h.fortran_order);
    assert_int_equal(h.byteorder, '>');
    assert_int_equal(h.itemsize, 8);
    assert_int_equal(h.count, 56);
    /* Python 2 longs, as old numpy wrote them. */
    assert_int_equal(parse(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }", &h,
                           why, sizeof(why)),
                     0);
    assert_int_equal(h.shape[1], 3);
    /* One-byte types carry '|'; a descr without byte order is native. */
    assert_int_equal(
        parse(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (4,)}", &h, why, sizeof(why)),
        0);
    assert_int_equal(h.byteorder, '|');
    assert_int_equal(
        parse(1, "{'descr': 'f4', 'fortran_order': False, 'shape': (4,)}", &h, why, sizeof(why)),
        0);
    assert_int_equal(h.byteorder, '=');
    /* Trailing comma inside a longer tuple. */
    assert_int_equal(parse(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3,)}", &h,
                           why, sizeof(why)),
                     0);
    assert_int_equal(h.ndim, 3);
}

static void test_header_length(void **state)
{
    (void)state;
    uint8_t buf[256];
    size_t total = 0;
    char why[256];
    size_t len =
        mk(buf, sizeof(buf), 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}");
    for (size_t n = 0; n < 10; n++)
        assert_int_equal(npy_header_length(buf, n, &total, why, sizeof(why)), CONVD_EAGAIN);
    assert_int_equal(npy_header_length(buf, 10, &total, why, sizeof(why)), 0);
    assert_int_equal(total, len);
    len = mk(buf, sizeof(buf), 2, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}");
    assert_int_equal(npy_header_length(buf, 11, &total, why, sizeof(why)), CONVD_EAGAIN);
    assert_int_equal(npy_header_length(buf, 12, &total, why, sizeof(why)), 0);
    assert_int_equal(total, len);
    /* A wrong first byte is known to be wrong at once. */
    assert_int_equal(npy_header_length("PK", 2, &total, why, sizeof(why)), CONVD_EINVAL);
    assert_non_null(strstr(why, "magic"));
}

static void test_writer_roundtrip(void **state)
{
    (void)state;
    uint8_t buf[512];
    size_t len;
    struct npy_header h;
    char why[256];
    const uint64_t shapes[][4] = {
        {2, 3, 4, 5}, {1, 1, 1, 1}, {32, 128, 56, 56}, {16777216, 1, 1, 3}};
    const char *descrs[] = {"<f4", "<f2", "<u2"};
    for (size_t d = 0; d < 3; d++) {
        for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
            assert_int_equal(npy_write_header(buf, sizeof(buf), descrs[d], shapes[i], 4, &len), 0);
            assert_int_equal(len % 64, 0);
            assert_int_equal(buf[len - 1], '\n');
            assert_int_equal(buf[6], 1);
            assert_int_equal(npy_parse_header(buf, len, &h, why, sizeof(why)), 0);
            assert_string_equal(h.descr, descrs[d]);
            assert_int_equal(h.ndim, 4);
            assert_memory_equal(h.shape, shapes[i], sizeof(shapes[i]));
            assert_false(h.fortran_order);
            assert_int_equal(h.data_offset, len);
        }
    }
    /* numpy's exact text for a 1-d and a 0-d array. */
    const uint64_t five = 5;
    assert_int_equal(npy_write_header(buf, sizeof(buf), "<f4", &five, 1, &len), 0);
    assert_int_equal(len, 128); /* numpy's usual 128-byte header */
    assert_memory_equal(buf + 10, "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", 57);
    assert_int_equal(npy_write_header(buf, sizeof(buf), "<f4", NULL, 0, &len), 0);
    assert_memory_equal(buf + 10, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 55);
    /* Too small a buffer, bad arguments. */
    assert_int_equal(npy_write_header(buf, 63, "<f4", &five, 1, &len), CONVD_ETOOBIG);
    assert_int_equal(npy_write_header(buf, sizeof(buf), "<f'4", &five, 1, &len), CONVD_EINVAL);
    assert_int_equal(npy_write_header(buf, sizeof(buf), "<f4", &five, NPY_MAX_DIMS + 1, &len),
                     CONVD_EINVAL);
}

/* Each malformed header and a word its sentence must contain. */
static void test_malformed_text(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        const char *says;
    } bad[] = {
        {"", "not a dict"},
        {"[1, 2]", "not a dict"},
        {"{'descr': '<f4', 'fortran_order': False}", "shape"},
        {"{'descr': '<f4', 'shape': (1,)}", "fortran_order"},
        {"{'fortran_order': False, 'shape': (1,)}", "descr"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}", "unknown key"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", "twice"},
        {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}", "structured"},
        {"{'descr': '<f', 'fortran_order': False, 'shape': (1,)}", "size"},
        {"{'descr': '<f4x', 'fortran_order': False, 'shape': (1,)}", "not supported"},
        {"{'descr': '<M8[ns]', 'fortran_order': False, 'shape': (1,)}", "not supported"},
        {"{'descr': '<4', 'fortran_order': False, 'shape': (1,)}", "type string"},
        {"{'descr': 4, 'fortran_order': False, 'shape': (1,)}", "quoted string"},
        {"{'descr': '<f4', 'fortran_order': Maybe, 'shape': (1,)}", "True or False"},
        {"{'descr': '<f4', 'fortran_order': Trueish, 'shape': (1,)}", "True or False"},
        {"{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", "True or False"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': [1, 2]}", "tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (5)}", "parenthesised"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", "non-negative"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,)}", "malformed"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}", "malformed"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (,)}", "non-negative"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2}", "malformed"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", "overflows"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296,)}",
         "overflows"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 1073741824,)}", "size"},
        {"{'descr': '<f4, 'fortran_order': False, 'shape': (1,)}", "expected ','"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x", "unexpected characters"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", "expected ','"},
        {"{'descr' '<f4', 'fortran_order': False, 'shape': (1,)}", "expected ':'"},
        {"{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}", "expected ','"},
        {"{'descr': '<f\\x34', 'fortran_order': False, 'shape': (1,)}", "unsupported character"},
        {"{descr: '<f4', 'fortran_order': False, 'shape': (1,)}", "quoted string"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,),,}", "quoted string"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (\xc3\xa9,)}", "non-negative"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}}", "unexpected characters"},
    };
    char shape33[400] = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
    for (int i = 0; i < 33; i++)
        strcat(shape33, "1, ");
    strcat(shape33, ")}");

    struct npy_header h;
    char why[256];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(&h, 0x5a, sizeof(h));
        why[0] = '\0';
        int rc = parse(1, bad[i].text, &h, why, sizeof(why));
        if (rc != CONVD_EINVAL || strstr(why, bad[i].says) == NULL)
            fail_msg("case %zu <%s>: rc %d, why '%s', expected '%s'", i, bad[i].text, rc, why,
                     bad[i].says);
        /* ret untouched on failure */
        assert_int_equal(h.major, 0x5a);
    }
    assert_int_equal(parse(3, shape33, &h, why, sizeof(why)), CONVD_EINVAL);
    assert_non_null(strstr(why, "more than 32"));
}

static void test_malformed_prefix(void **state)
{
    (void)state;
    uint8_t buf[256];
    struct npy_header h;
    char why[256];
    const char *ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}";
    size_t len;

    len = mk(buf, sizeof(buf), 1, 0, ok);
    buf[0] = 0x92;
    assert_int_equal(npy_parse_header(buf, len, &h, why, sizeof(why)), CONVD_EINVAL);
    assert_non_null(strstr(why, "magic"));

    len = mk(buf, sizeof(buf), 4, 0, ok);
    assert_int_equal(npy_parse_header(buf, len, &h, why, sizeof(why)), CONVD_EINVAL);
    assert_non_null(strstr(why, "version 4.0"));
    len = mk(buf, sizeof(buf), 0, 0, ok);
    assert_int_equal(npy_parse_header(buf, len, &h, why, sizeof(why)), CONVD_EINVAL);
    len = mk(buf, sizeof(buf), 1, 1, ok);
    assert_int_equal(npy_parse_header(buf, len, &h, why, sizeof(why)), CONVD_EINVAL);
    assert_non_null(strstr(why, "version 1.1"));

    /* Truncated anywhere: in the prefix, in the header. */
    len = mk(buf, sizeof(buf), 1, 0, ok);
    for (size_t n = 0; n < len; n += 7) {
        assert_int_equal(npy_parse_header(buf, n, &h, why, sizeof(why)), CONVD_EINVAL);
        assert_non_null(strstr(why, "truncated"));
    }
    assert_int_equal(npy_parse_header(buf, len - 1, &h, why, sizeof(why)), CONVD_EINVAL);
    assert_int_equal(npy_parse_header(buf, len, &h, why, sizeof(why)), 0);

    /* A header length beyond the limit (version 2's 32-bit length). */
    len = mk(buf, sizeof(buf), 2, 0, ok);
    buf[10] = 0x00;
    buf[11] = 0x10; /* 256 MiB */
    size_t total;
    assert_int_equal(npy_header_length(buf, len, &total, why, sizeof(why)), CONVD_EINVAL);
    assert_non_null(strstr(why, "longer"));

    /* A NUL inside the header text. */
    len = mk(buf, sizeof(buf), 1, 0, ok);
    buf[10 + 12] = '\0';
    assert_int_equal(npy_parse_header(buf, len, &h, why, sizeof(why)), CONVD_EINVAL);
    /* Padding that is not blank. */
    len = mk(buf, sizeof(buf), 1, 0, ok);
    buf[len - 3] = 'x';
    assert_int_equal(npy_parse_header(buf, len, &h, why, sizeof(why)), CONVD_EINVAL);
    assert_non_null(strstr(why, "unexpected characters"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_v1),         cmocka_unit_test(test_valid_v2_v3),
        cmocka_unit_test(test_valid_spellings),  cmocka_unit_test(test_header_length),
        cmocka_unit_test(test_writer_roundtrip), cmocka_unit_test(test_malformed_text),
        cmocka_unit_test(test_malformed_prefix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
