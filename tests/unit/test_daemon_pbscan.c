/* The explanation of undecodable datagrams: each structural fault is named with its position,
 * and well-formed messages (and every prefix of one that protobuf-c accepts) are never blamed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "convd.pb-c.h"
#include "pbscan.h"
#include "testutil.h"
#include "wire.h"

static void expect_fault(const uint8_t *buf, size_t len, const char *w1, const char *w2)
{
    char why[256] = "";
    if (pbscan_client_message(buf, len, why, sizeof(why)) != 1)
        fail_msg("no fault found, want one mentioning \"%s\"", w1);
    if (strstr(why, w1) == NULL || (w2 != NULL && strstr(why, w2) == NULL))
        fail_msg("\"%s\" does not mention \"%s\" and \"%s\"", why, w1, w2 ? w2 : "");
    /* whatever pbscan blames, protobuf-c refuses too */
    Convd__ClientMessage *m = convd__client_message__unpack(NULL, len, buf);
    if (m != NULL) {
        convd__client_message__free_unpacked(m, NULL);
        fail_msg("protobuf-c accepts what pbscan blames: %s", why);
    }
}

static void test_faults(void **state)
{
    (void)state;
    uint8_t ff[64];
    memset(ff, 0xff, sizeof(ff));
    const uint8_t zero[] = {0x00, 0x01};
    const uint8_t wt7_known[] = {0x0f};
    const uint8_t wt7[] = {0x7f, 0x01};
    const uint8_t wt6[] = {0x7e, 0x01};
    const uint8_t group[] = {0x7b};
    const uint8_t fixed64[] = {0x79, 0x01};
    const uint8_t fixed32[] = {0x7d, 0x01, 0x02};
    const uint8_t longlen[] = {0x22, 0xff, 0xff, 0xff, 0x0f, 0x08, 0x01};
    const uint8_t hello_varint[] = {0x08, 0x01};
    const uint8_t nested[] = {0x3a, 0x02, 0x08, 0x80};
    const uint8_t trunc_key[] = {0x80};
    const uint8_t trunc_len[] = {0x22, 0x80};
    expect_fault(zero, sizeof(zero), "field number 0 at byte 0", NULL);
    expect_fault(ff, sizeof(ff), "over-long", "byte 0");
    expect_fault(wt7_known, sizeof(wt7_known), "field 1 (hello)", "wire type 7");
    expect_fault(wt7, sizeof(wt7), "invalid wire type 7 (field 15)", NULL);
    expect_fault(wt6, sizeof(wt6), "invalid wire type 6", NULL);
    expect_fault(group, sizeof(group), "deprecated group wire type 3", NULL);
    expect_fault(fixed64, sizeof(fixed64), "needs 8 bytes, 1 remain", NULL);
    expect_fault(fixed32, sizeof(fixed32), "needs 4 bytes, 2 remain", NULL);
    expect_fault(longlen, sizeof(longlen), "field 4 at byte 0 declares 33554431 bytes",
                 "only 2 remain");
    expect_fault(hello_varint, sizeof(hello_varint), "field 1 (hello)", "wire type 0");
    expect_fault(nested, sizeof(nested), "in field 7 (ping): truncated varint in field 1",
                 "byte 2");
    expect_fault(trunc_key, sizeof(trunc_key), "truncated field key at byte 0", NULL);
    expect_fault(trunc_len, sizeof(trunc_len), "truncated length of field 4", NULL);
    char why[64];
    assert_int_equal(pbscan_client_message(NULL, 0, why, sizeof(why)), 1);
    assert_string_equal(why, "empty datagram");

    /* Every ClientMessage field is known, the ring messages included (found by
     * tests/fuzz/fuzz_client_message: these went unexplained). */
    const uint8_t attach_varint[] = {0x40, 0x08};
    const uint8_t doorbell_fixed32[] = {0x4d, 0x01, 0x02, 0x03, 0x04};
    const uint8_t attach_nested[] = {0x42, 0x02, 0x10, 0x80};
    expect_fault(attach_varint, sizeof(attach_varint), "field 8 (attach_ring)", "wire type 0");
    expect_fault(doorbell_fixed32, sizeof(doorbell_fixed32), "field 9 (doorbell)", "wire type 5");
    expect_fault(attach_nested, sizeof(attach_nested),
                 "in field 8 (attach_ring): truncated varint in field 2", "byte 2");
}

/* Random well-formed requests: the whole message passes; of its prefixes, pbscan blames only
 * those protobuf-c refuses. */
static void test_no_false_blame(void **state)
{
    (void)state;
    struct tu_rng g;
    tu_rng_init(&g, tu_seed());
    for (int round = 0; round < 200; round++) {
        struct convd_problem p;
        tu_random_problem(&g, &p, 0, 0, 8);
        Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
        Convd__ConvRequest rq = CONVD__CONV_REQUEST__INIT;
        Convd__Problem pb = CONVD__PROBLEM__INIT;
        Convd__TensorRef t[4];
        for (int i = 0; i < 4; i++) {
            convd__tensor_ref__init(&t[i]);
            t[i].region_id = tu_rng_next(&g);
            t[i].offset = tu_rng_next(&g) >> tu_rng_range(&g, 0, 63);
            t[i].bytes = tu_rng_next(&g) >> tu_rng_range(&g, 0, 63);
        }
        wire_problem_to_pb(&p, &pb);
        rq.id = tu_rng_next(&g);
        rq.problem = &pb;
        rq.input = &t[0];
        rq.weight = &t[1];
        rq.bias = p.has_bias ? &t[2] : NULL;
        rq.output = &t[3];
        rq.priority = (uint32_t)tu_rng_range(&g, 0, 3);
        rq.timeout_us = tu_rng_next(&g) >> 40;
        m.msg_case = CONVD__CLIENT_MESSAGE__MSG_CONV;
        m.conv = &rq;
        uint8_t buf[1024];
        int len = wire_pack_client(&m, buf, sizeof(buf));
        assert_true(len > 0);
        char why[256];
        if (pbscan_client_message(buf, (size_t)len, why, sizeof(why)) != 0)
            fail_msg("a valid message blamed: %s", why);
        for (int cut = 1; cut < len; cut++) {
            if (pbscan_client_message(buf, (size_t)cut, why, sizeof(why)) == 0)
                continue;
            Convd__ClientMessage *u = convd__client_message__unpack(NULL, (size_t)cut, buf);
            if (u != NULL) {
                convd__client_message__free_unpacked(u, NULL);
                fail_msg("prefix of %d bytes blamed but decodable: %s", cut, why);
            }
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_faults),
        cmocka_unit_test(test_no_false_blame),
    };
    return cmocka_run_group_tests_name("daemon pbscan", tests, NULL, NULL);
}
