/* common/mix.h and common/why.h: splitmix64 against its published sequence, the id hash that the
 * daemon's idmap and the client's request table share, xorshift64*, and why_fail. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "mix.h"
#include "why.h"

/* The first outputs of splitmix64 seeded with 0 (Vigna's splitmix64.c; Java's
 * SplittableRandom(0).nextLong() gives the same): state s yields mix_splitmix64(s), then
 * s += MIX_GOLDEN64. */
static void test_splitmix64(void **state)
{
    (void)state;
    static const uint64_t want[3] = {0xe220a8397b1dcdafull, 0x6e789e6aa1b965f4ull,
                                     0x06c45d188009454full};
    uint64_t s = 0;
    for (int i = 0; i < 3; i++, s += MIX_GOLDEN64)
        assert_int_equal(mix_splitmix64(s), want[i]);
    assert_int_equal(mix_fin64(0), 0); /* the finaliser alone fixes 0 */
}

/* Ids 0, 1, 2, ... and pointer-like ids (multiples of 4096) both spread over a table: no slot of
 * 1024 gets more than a handful of 1024 ids, where the identity would put every page-aligned
 * id in slot 0. */
static void test_id_slot(void **state)
{
    (void)state;
    enum { CAP = 1024 };
    static const uint64_t steps[2] = {1, 4096};
    for (int t = 0; t < 2; t++) {
        int count[CAP];
        memset(count, 0, sizeof(count));
        int most = 0;
        for (uint64_t i = 0; i < CAP; i++) {
            size_t slot = mix_id_slot(0x7f0000000000ull * (t == 1) + i * steps[t], CAP);
            assert_true(slot < CAP);
            if (++count[slot] > most)
                most = count[slot];
        }
        assert_true(most <= 8);
    }
}

/* xorshift64*: advances the state by the xorshift step and returns it times the multiplier. */
static void test_xorshift64s(void **state)
{
    (void)state;
    uint64_t s = 1;
    uint64_t x = 1;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    assert_int_equal(mix_xorshift64s(&s), x * 0x2545f4914f6cdd1dull);
    assert_int_equal(s, x);
    assert_int_equal(x, 0x2000001ull); /* 1 ^ 1 << 25 */
}

static void test_why_fail(void **state)
{
    (void)state;
    char why[16];
    memset(why, 'x', sizeof(why));
    assert_int_equal(why_fail(why, sizeof(why), -7, "%s %d", "code", 42), -7);
    assert_string_equal(why, "code 42");
    /* Truncated to fit, terminated. */
    assert_int_equal(why_fail(why, 5, -1, "%s", "a long sentence"), -1);
    assert_string_equal(why, "a lo");
    /* No buffer: only the code. */
    assert_int_equal(why_fail(NULL, 0, -3, "ignored %d", 1), -3);
    why[0] = 'q';
    assert_int_equal(why_fail(why, 0, -4, "ignored"), -4);
    assert_int_equal(why[0], 'q');
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_splitmix64),
        cmocka_unit_test(test_id_slot),
        cmocka_unit_test(test_xorshift64s),
        cmocka_unit_test(test_why_fail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
