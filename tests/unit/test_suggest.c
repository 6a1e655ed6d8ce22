/* Typo hints: the edit distance and which candidate, if any, is offered. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "suggest.h"

static void test_distance(void **state)
{
    (void)state;
    const struct {
        const char *a, *b;
        size_t d;
    } cases[] = {
        {"", "", 0},
        {"abc", "", 3},
        {"", "abc", 3},
        {"status", "status", 0},
        {"stauts", "status", 1},  /* neighbours swapped */
        {"staus", "status", 1},   /* one left out */
        {"statuss", "status", 1}, /* one too many */
        {"ststus", "status", 1},  /* one wrong */
        {"max_inflght", "max_inflight", 1},
        {"max-inflight", "max_inflight", 0}, /* '-' and '_' spell the same key */
        {"MAX_Batch", "max_batch", 0},       /* case does not count */
        {"ca", "abc", 3},                    /* a swap is not also an insertion */
        {"kitten", "sitting", 3},
        {"frobnicate", "verify", 9},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t d = suggest_distance(cases[i].a, cases[i].b);
        if (d != cases[i].d)
            fail_msg("distance('%s', '%s') = %zu, want %zu", cases[i].a, cases[i].b, d, cases[i].d);
        assert_int_equal(suggest_distance(cases[i].b, cases[i].a), d);
    }
    char longer[100];
    memset(longer, 'a', sizeof(longer) - 1);
    longer[sizeof(longer) - 1] = '\0';
    assert_int_equal(suggest_distance(longer, "a"), SIZE_MAX);
}

static void test_closest(void **state)
{
    (void)state;
    static const char *const cmds[] = {"status", "ping", "metrics", "conv", "verify", "bench"};
    const size_t n = sizeof(cmds) / sizeof(cmds[0]);
    const struct {
        const char *word, *want;
    } cases[] = {
        {"stauts", "status"},
        {"statsu", "status"},
        {"STATUS", "status"},
        {"pign", "ping"},
        {"metric", "metrics"},
        {"verfy", "verify"},
        {"bech", "bench"},
        {"cnov", "conv"},
        {"status", NULL},     /* the word itself: nothing to suggest */
        {"frobnicate", NULL}, /* nothing close */
        {"p", NULL},          /* "ping" is 3 away from a 1-letter word */
        {"bnch", "bench"},
        {"bnh", NULL}, /* 2 edits: too many for a 3-letter word */
        {"", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *got = suggest_closest(cases[i].word, cmds, n);
        if ((got == NULL) != (cases[i].want == NULL) ||
            (got != NULL && strcmp(got, cases[i].want) != 0))
            fail_msg("'%s': got %s, want %s", cases[i].word, got ? got : "NULL",
                     cases[i].want ? cases[i].want : "NULL");
    }
    /* Keys: the nearer of two wins; ties go to the first. */
    static const char *const keys[] = {"max_inflight", "max_inflight_per_user", "max_batch",
                                       "max_regions"};
    assert_string_equal(suggest_closest("max_inflght", keys, 4), "max_inflight");
    assert_string_equal(suggest_closest("max_inflight_per_usr", keys, 4), "max_inflight_per_user");
    assert_string_equal(suggest_closest("max_bach", keys, 4), "max_batch");
    static const char *const tie[] = {"abcd", "abce"};
    assert_string_equal(suggest_closest("abcx", tie, 2), "abcd");

    char buf[64];
    assert_string_equal(suggest_hint("max_inflght", keys, 4, buf, sizeof(buf)),
                        "; did you mean 'max_inflight'?");
    assert_string_equal(suggest_hint("zzz", keys, 4, buf, sizeof(buf)), "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_distance),
        cmocka_unit_test(test_closest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
