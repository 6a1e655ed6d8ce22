/* convctl's parsing helpers (client/cliargs.c): numbers, stride/pad/dilation forms, problem
 * options, and the shapes CSV, the project's own file included. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cliargs.h"

static void test_parse_int(void **state)
{
    (void)state;
    long long v = 7;
    char why[128];
    assert_int_equal(cli_parse_int("12", 1, 100, &v, why, sizeof(why)), 0);
    assert_int_equal(v, 12);
    assert_int_equal(cli_parse_int("-3", -5, 5, &v, why, sizeof(why)), 0);
    assert_int_equal(v, -3);
    v = 7;
    const char *bad[] = {"", "x", "12x", " 12", "+12", "1.5", "0x10", "-", "12 "};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(cli_parse_int(bad[i], -100, 100, &v, why, sizeof(why)), CONVD_EINVAL);
        assert_int_equal(v, 7);
    }
    assert_int_equal(cli_parse_int("101", 1, 100, &v, why, sizeof(why)), CONVD_EINVAL);
    assert_non_null(strstr(why, "out of range"));
    assert_int_equal(cli_parse_int("0", 1, 100, &v, why, sizeof(why)), CONVD_EINVAL);
    assert_int_equal(cli_parse_int("99999999999999999999999", 0, INT64_MAX, &v, why, sizeof(why)),
                     CONVD_EINVAL);
    assert_int_equal(cli_parse_int(NULL, 0, 1, &v, why, sizeof(why)), CONVD_EINVAL);
}

static void test_parse_double(void **state)
{
    (void)state;
    double v = 0;
    char why[128];
    assert_int_equal(cli_parse_double("2.5", 0, 10, &v, why, sizeof(why)), 0);
    assert_true(v == 2.5);
    assert_int_equal(cli_parse_double("1e-1", 0, 10, &v, why, sizeof(why)), 0);
    assert_true(v == 0.1);
    assert_int_equal(cli_parse_double("11", 0, 10, &v, why, sizeof(why)), CONVD_EINVAL);
    assert_int_equal(cli_parse_double("nan", 0, 10, &v, why, sizeof(why)), CONVD_EINVAL);
    assert_int_equal(cli_parse_double("2s", 0, 10, &v, why, sizeof(why)), CONVD_EINVAL);
    assert_int_equal(cli_parse_double("", 0, 10, &v, why, sizeof(why)), CONVD_EINVAL);
}

static void test_parse_pair(void **state)
{
    (void)state;
    int32_t v[2] = {0, 0};
    char why[128];
    assert_int_equal(cli_parse_pair("2", 1, 9, v, why, sizeof(why)), 0);
    assert_int_equal(v[0], 2);
    assert_int_equal(v[1], 2);
    assert_int_equal(cli_parse_pair("2,3", 1, 9, v, why, sizeof(why)), 0);
    assert_int_equal(v[0], 2);
    assert_int_equal(v[1], 3);
    const char *bad[] = {"", "0", "2,", ",3", "2,3,4", "2;3", "a,b", "10", "2,,3"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        v[0] = v[1] = 5;
        if (cli_parse_pair(bad[i], 1, 9, v, why, sizeof(why)) != CONVD_EINVAL)
            fail_msg("'%s' accepted", bad[i]);
        assert_int_equal(v[0], 5);
    }
}

static void test_parse_pad(void **state)
{
    (void)state;
    int32_t v[4];
    char why[128];
    assert_int_equal(cli_parse_pad("1", v, why, sizeof(why)), 0);
    assert_true(v[0] == 1 && v[1] == 1 && v[2] == 1 && v[3] == 1);
    assert_int_equal(cli_parse_pad("1,2", v, why, sizeof(why)), 0);
    assert_true(v[0] == 1 && v[1] == 1 && v[2] == 2 && v[3] == 2);
    assert_int_equal(cli_parse_pad("0,1,2,3", v, why, sizeof(why)), 0);
    assert_true(v[0] == 0 && v[1] == 1 && v[2] == 2 && v[3] == 3);
    assert_int_equal(cli_parse_pad("1,2,3", v, why, sizeof(why)), CONVD_EINVAL);
    assert_non_null(strstr(why, "PT,PB,PL,PR"));
    assert_int_equal(cli_parse_pad("1,2,3,4,5", v, why, sizeof(why)), CONVD_EINVAL);
    assert_int_equal(cli_parse_pad("-1", v, why, sizeof(why)), CONVD_EINVAL);
    assert_int_equal(cli_parse_pad("65537", v, why, sizeof(why)), CONVD_EINVAL);
}

static void test_problem_option(void **state)
{
    (void)state;
    struct convd_problem p;
    char why[160];
    convd_problem_init(&p, 1, 1, 1, 1, 1, 1, 1, 1);
    static const struct {
        const char *name, *value;
    } set[] = {
        {"n", "2"},         {"c", "64"},        {"h", "7"},        {"w", "9"},
        {"k", "32"},        {"r", "3"},         {"s", "5"},        {"groups", "8"},
        {"stride", "2,1"},  {"pad", "0,1,2,3"}, {"dilation", "3"}, {"dtype", "bf16"},
        {"layout", "NHWC"}, {"bias", NULL},     {"relu", NULL},    {"act", "relu"},
        {"tf32", NULL},
    };
    /* The table that convctl's getopt entries are made from holds exactly these, in order. */
    assert_int_equal(CLI_PO_COUNT, sizeof(set) / sizeof(set[0]));
    assert_null(cli_problem_option_name(-1));
    assert_null(cli_problem_option_name(CLI_PO_COUNT));
    for (size_t i = 0; i < sizeof(set) / sizeof(set[0]); i++) {
        assert_string_equal(cli_problem_option_name((int)i), set[i].name);
        assert_int_equal(cli_problem_option(&p, set[i].name, set[i].value, why, sizeof(why)), 0);
    }
    assert_int_equal(p.n, 2);
    assert_int_equal(p.c, 64);
    assert_int_equal(p.h, 7);
    assert_int_equal(p.w, 9);
    assert_int_equal(p.k, 32);
    assert_int_equal(p.r, 3);
    assert_int_equal(p.s, 5);
    assert_int_equal(p.groups, 8);
    assert_int_equal(p.stride_h, 2);
    assert_int_equal(p.stride_w, 1);
    assert_int_equal(p.pad_top, 0);
    assert_int_equal(p.pad_bottom, 1);
    assert_int_equal(p.pad_left, 2);
    assert_int_equal(p.pad_right, 3);
    assert_int_equal(p.dil_h, 3);
    assert_int_equal(p.dil_w, 3);
    assert_int_equal(p.dtype, CONVD_DTYPE_BF16);
    assert_int_equal(p.layout, CONVD_LAYOUT_NHWC);
    assert_true(p.allow_tf32);
    assert_true(p.has_bias);
    assert_int_equal(p.activation, CONVD_ACT_RELU);

    /* --act: names, relu6, clamp with its bounds; bad ones refused with the problem unchanged */
    assert_int_equal(cli_problem_option(&p, "act", "gelu_tanh", why, sizeof(why)), 0);
    assert_int_equal(p.activation, CONVD_ACT_GELU_TANH);
    assert_int_equal(cli_problem_option(&p, "act", "relu6", why, sizeof(why)), 0);
    assert_true(p.activation == CONVD_ACT_CLAMP && p.act_min == 0.0f && p.act_max == 6.0f);
    assert_int_equal(cli_problem_option(&p, "act", "clamp:-1.5,2", why, sizeof(why)), 0);
    assert_true(p.activation == CONVD_ACT_CLAMP && p.act_min == -1.5f && p.act_max == 2.0f);
    struct convd_problem kept = p;
    static const char *const bad_acts[] = {"clamp",      "clamp:1", "clamp:2,1", "clamp:a,b",
                                           "clamp:1,2x", "tanh",    ""};
    for (size_t i = 0; i < sizeof(bad_acts) / sizeof(bad_acts[0]); i++) {
        assert_int_equal(cli_problem_option(&p, "act", bad_acts[i], why, sizeof(why)),
                         CONVD_EINVAL);
        assert_memory_equal(&p, &kept, sizeof(p));
    }
    assert_non_null(strstr(why, "unknown activation ''"));
    assert_int_equal(cli_problem_option(&p, "relu", NULL, why, sizeof(why)), 0);
    assert_true(p.activation == CONVD_ACT_RELU && p.act_min == 0.0f && p.act_max == 0.0f);

    struct convd_problem before = p;
    assert_int_equal(cli_problem_option(&p, "n", "0", why, sizeof(why)), CONVD_EINVAL);
    assert_int_equal(cli_problem_option(&p, "dtype", "fp64", why, sizeof(why)), CONVD_EINVAL);
    assert_non_null(strstr(why, "fp64"));
    assert_int_equal(cli_problem_option(&p, "layout", "chwn", why, sizeof(why)), CONVD_EINVAL);
    assert_int_equal(cli_problem_option(&p, "stride", "0", why, sizeof(why)), CONVD_EINVAL);
    assert_int_equal(cli_problem_option(&p, "groups", NULL, why, sizeof(why)), CONVD_EINVAL);
    assert_int_equal(cli_problem_option(&p, "depth", "1", why, sizeof(why)), CONVD_EINVAL);
    assert_non_null(strstr(why, "unknown"));
    assert_int_equal(cli_problem_option(&p, "depth", NULL, why, sizeof(why)), CONVD_EINVAL);
    assert_non_null(strstr(why, "unknown"));
    assert_memory_equal(&p, &before, sizeof(p));
}

static void test_shapes_variants(void **state)
{
    (void)state;
    struct cli_shape *rows = NULL;
    size_t n = 0;
    char why[256];
    /* Columns in another order, an extra one, comments, blank lines, CRLF, blanks around values. */
    const char *text = "# shapes\r\n"
                       "\r\n"
                       "groups, name ,n,h,w,c,k,r,s,stride,pad,dil,note\r\n"
                       "32,a,1,56,56,128,128,3,3,1,1,1,first\r\n"
                       "  # comment\n"
                       "1, b ,2,7,9,3,6,1,1,2,0,2,x";
    assert_int_equal(cli_shapes_parse(text, strlen(text), &rows, &n, why, sizeof(why)), 0);
    assert_int_equal(n, 2);
    assert_string_equal(rows[0].name, "a");
    assert_int_equal(rows[0].groups, 32);
    assert_int_equal(rows[0].c, 128);
    assert_string_equal(rows[1].name, "b");
    assert_int_equal(rows[1].stride, 2);
    assert_int_equal(rows[1].pad, 0);
    assert_int_equal(rows[1].dil, 2);
    assert_ptr_equal(cli_shapes_find(rows, n, "b"), &rows[1]);
    assert_null(cli_shapes_find(rows, n, "c"));

    struct convd_problem p;
    convd_problem_init(&p, 9, 9, 9, 9, 9, 9, 9, 9);
    p.dtype = CONVD_DTYPE_FP16;
    p.activation = CONVD_ACT_RELU;
    cli_shape_apply(&rows[1], &p);
    assert_int_equal(p.n, 2);
    assert_int_equal(p.h, 7);
    assert_int_equal(p.w, 9);
    assert_int_equal(p.c, 3);
    assert_int_equal(p.k, 6);
    assert_int_equal(p.stride_w, 2);
    assert_int_equal(p.dil_h, 2);
    assert_int_equal(p.groups, 1);
    assert_int_equal(p.dtype, CONVD_DTYPE_FP16);
    assert_int_equal(p.activation, CONVD_ACT_RELU);
    free(rows);

    static const struct {
        const char *text, *says;
    } bad[] = {
        {"", "no header"},
        {"# only a comment\n", "no header"},
        {"name,n,h,w,c,k,r,s,stride,pad,dil\n", "groups"},
        {"name,n,h,w,c,k,r,s,stride,pad,dil,groups\na,1,1,1,1,1,1,1,1,0,1\n", "no value"},
        {"name,n,h,w,c,k,r,s,stride,pad,dil,groups\na,1,1,1,1,1,1,1,1,x,1,1\n", "'pad'"},
        {"name,n,h,w,c,k,r,s,stride,pad,dil,groups\na,0,1,1,1,1,1,1,1,0,1,1\n", "line 2"},
        {"name,n,h,w,c,k,r,s,stride,pad,dil,groups\n,1,1,1,1,1,1,1,1,0,1,1\n", "name"},
        {"name,n,h,w,c,k,r,s,stride,pad,dil,groups\na,1,1,1,1,1,1,1,1,0,1,1\n"
         "a,2,1,1,1,1,1,1,1,0,1,1\n",
         "twice"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        rows = (struct cli_shape *)0x1;
        why[0] = '\0';
        int rc = cli_shapes_parse(bad[i].text, strlen(bad[i].text), &rows, &n, why, sizeof(why));
        if (rc != CONVD_EINVAL || strstr(why, bad[i].says) == NULL)
            fail_msg("case %zu: rc %d, why '%s', expected '%s'", i, rc, why, bad[i].says);
        assert_ptr_equal(rows, (struct cli_shape *)0x1);
    }
    /* An embedded NUL is refused, not silently cut. */
    const char nul[] = "name,n,h,w,c,k,r,s,stride,pad,dil,groups\na,1\0,1,1,1,1,1,1,1,0,1,1\n";
    assert_int_equal(cli_shapes_parse(nul, sizeof(nul) - 1, &rows, &n, why, sizeof(why)),
                     CONVD_EINVAL);
}

/* The CSV the project ships parses, and every row is a valid problem. */
static void test_shapes_project_file(void **state)
{
    (void)state;
    FILE *f = fopen(CONVD_SOURCE_DIR "/bench/shapes.csv", "rb");
    assert_non_null(f);
    char text[16384];
    size_t len = fread(text, 1, sizeof(text), f);
    fclose(f);
    struct cli_shape *rows;
    size_t n;
    char why[256];
    assert_int_equal(cli_shapes_parse(text, len, &rows, &n, why, sizeof(why)), 0);
    assert_true(n >= 10);
    const struct cli_shape *r = cli_shapes_find(rows, n, "resnext50_l1");
    assert_non_null(r);
    assert_int_equal(r->n, 32);
    assert_int_equal(r->c, 128);
    assert_int_equal(r->groups, 32);
    for (size_t i = 0; i < n; i++) {
        struct convd_problem p;
        convd_problem_init(&p, 1, 1, 1, 1, 1, 1, 1, 1);
        cli_shape_apply(&rows[i], &p);
        if (convd_problem_check(&p, why, sizeof(why)) != 0)
            fail_msg("row %s: %s", rows[i].name, why);
    }
    free(rows);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_int),           cmocka_unit_test(test_parse_double),
        cmocka_unit_test(test_parse_pair),          cmocka_unit_test(test_parse_pad),
        cmocka_unit_test(test_problem_option),      cmocka_unit_test(test_shapes_variants),
        cmocka_unit_test(test_shapes_project_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
