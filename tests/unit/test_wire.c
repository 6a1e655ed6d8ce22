/* Wire conversions: Problem <-> struct convd_problem, packing limits, and decoding of hostile
 * bytes by protobuf-c (which the daemon relies on to reject garbage). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "wire.h"

static void fill_pb(Convd__Problem *pb)
{
    convd__problem__init(pb);
    pb->n = 2;
    pb->h = 9;
    pb->w = 7;
    pb->c = 12;
    pb->k = 8;
    pb->r = 3;
    pb->s = 2;
    pb->groups = 4;
    pb->stride_h = 2;
    pb->stride_w = 1;
    pb->pad_top = 1;
    pb->pad_bottom = 0;
    pb->pad_left = 2;
    pb->pad_right = 1;
    pb->dil_h = 1;
    pb->dil_w = 2;
    pb->dtype = CONVD__DTYPE__DTYPE_BF16;
    pb->layout = CONVD__LAYOUT__LAYOUT_NHWC;
    pb->has_bias = 1;
    pb->activation = CONVD__ACTIVATION__ACTIVATION_CLAMP;
    pb->act_min = -0.5f;
    pb->act_max = 6.0f;
}

static void test_round_trip(void **state)
{
    (void)state;
    Convd__Problem pb, back;
    struct convd_problem p;
    char why[128];
    fill_pb(&pb);
    assert_int_equal(wire_problem_from_pb(&pb, &p, why, sizeof(why)), 0);
    assert_int_equal(p.n, 2);
    assert_int_equal(p.c, 12);
    assert_int_equal(p.groups, 4);
    assert_int_equal(p.pad_left, 2);
    assert_int_equal(p.dil_w, 2);
    assert_int_equal(p.dtype, CONVD_DTYPE_BF16);
    assert_int_equal(p.layout, CONVD_LAYOUT_NHWC);
    assert_true(p.has_bias && !p.allow_tf32);
    assert_int_equal(p.activation, CONVD_ACT_CLAMP);
    assert_true(p.act_min == -0.5f && p.act_max == 6.0f);

    convd__problem__init(&back);
    wire_problem_to_pb(&p, &back);
    uint8_t a[256], b[256];
    size_t la = convd__problem__pack(&pb, a), lb = convd__problem__pack(&back, b);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
}

static void test_rejects_named_fields(void **state)
{
    (void)state;
    Convd__Problem pb;
    struct convd_problem p, untouched;
    char why[160];
    memset(&p, 0x5a, sizeof(p));
    untouched = p;

    fill_pb(&pb);
    pb.groups = 0;
    assert_int_equal(wire_problem_from_pb(&pb, &p, why, sizeof(why)), CONVD_EBADSHAPE);
    assert_non_null(strstr(why, "groups"));
    assert_memory_equal(&p, &untouched, sizeof(p));

    fill_pb(&pb);
    pb.w = 0x80000000u;
    assert_int_equal(wire_problem_from_pb(&pb, &p, why, sizeof(why)), CONVD_EBADSHAPE);
    assert_non_null(strstr(why, "field w"));

    fill_pb(&pb);
    pb.k = 10; /* not a multiple of groups = 4 */
    assert_int_equal(wire_problem_from_pb(&pb, &p, why, sizeof(why)), CONVD_EGROUPS);
    assert_non_null(strstr(why, "k=10"));

    fill_pb(&pb);
    pb.dtype = 9;
    assert_int_equal(wire_problem_from_pb(&pb, &p, why, sizeof(why)), CONVD_EBADSHAPE);
    assert_non_null(strstr(why, "dtype"));

    fill_pb(&pb);
    pb.layout = CONVD__LAYOUT__LAYOUT_UNSPECIFIED;
    assert_int_equal(wire_problem_from_pb(&pb, &p, why, sizeof(why)), CONVD_EBADSHAPE);
    assert_non_null(strstr(why, "layout"));

    assert_int_equal(wire_problem_from_pb(NULL, &p, why, sizeof(why)), CONVD_EBADSHAPE);
    assert_memory_equal(&p, &untouched, sizeof(p));
}

static void test_pack_limits(void **state)
{
    (void)state;
    Convd__ServerMessage m = CONVD__SERVER_MESSAGE__INIT;
    Convd__MetricsReply mr = CONVD__METRICS_REPLY__INIT;
    static char text[CONVD_MAX_MESSAGE_BYTES + 16];
    static uint8_t buf[CONVD_MAX_MESSAGE_BYTES];
    memset(text, 'x', sizeof(text) - 1);
    text[sizeof(text) - 1] = '\0';
    mr.text = text;
    m.msg_case = CONVD__SERVER_MESSAGE__MSG_METRICS_REPLY;
    m.metrics_reply = &mr;
    assert_int_equal(wire_pack_server(&m, buf, sizeof(buf)), CONVD_ETOOBIG);
    text[100] = '\0';
    int n = wire_pack_server(&m, buf, sizeof(buf));
    assert_true(n > 100 && n < 200);
    Convd__ServerMessage *d = convd__server_message__unpack(NULL, (size_t)n, buf);
    assert_non_null(d);
    assert_int_equal(d->msg_case, CONVD__SERVER_MESSAGE__MSG_METRICS_REPLY);
    assert_int_equal(strlen(d->metrics_reply->text), 100);
    convd__server_message__free_unpacked(d, NULL);
}

/* protobuf-c must survive garbage (ASan watches this loop) and refuse truncated messages: the
 * daemon feeds it whatever a client sends. */
static void test_garbage_decode(void **state)
{
    (void)state;
    uint64_t x = 0x243f6a8885a308d3ull;
    uint8_t buf[512];
    for (int round = 0; round < 5000; round++) {
        size_t len = (size_t)(x % sizeof(buf));
        for (size_t i = 0; i < len; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf[i] = (uint8_t)x;
        }
        Convd__ClientMessage *m = convd__client_message__unpack(NULL, len, buf);
        if (m != NULL) {
            assert_true(m->msg_case >= CONVD__CLIENT_MESSAGE__MSG__NOT_SET &&
                        m->msg_case <= CONVD__CLIENT_MESSAGE__MSG_PING);
            convd__client_message__free_unpacked(m, NULL);
        }
    }

    /* a valid request cut short anywhere inside its nested problem is refused */
    Convd__ClientMessage cm = CONVD__CLIENT_MESSAGE__INIT;
    Convd__ConvRequest req = CONVD__CONV_REQUEST__INIT;
    Convd__Problem pb;
    fill_pb(&pb);
    req.id = 77;
    req.problem = &pb;
    cm.msg_case = CONVD__CLIENT_MESSAGE__MSG_CONV;
    cm.conv = &req;
    int n = wire_pack_client(&cm, buf, sizeof(buf));
    assert_true(n > 20);
    Convd__ClientMessage *whole = convd__client_message__unpack(NULL, (size_t)n, buf);
    assert_non_null(whole);
    assert_int_equal(whole->conv->id, 77);
    assert_int_equal(whole->conv->problem->groups, 4);
    convd__client_message__free_unpacked(whole, NULL);
    for (int cut = 1; cut < 6; cut++)
        assert_null(convd__client_message__unpack(NULL, (size_t)(n - cut), buf));
}

/* The version a connection speaks: the newest in both ranges, or EVERSION naming both. */
static void test_pick_version(void **state)
{
    (void)state;
    const struct {
        uint32_t peer_min, peer_max, own_min, own_max;
        int want;
        uint32_t version;
        const char *says;
    } cases[] = {
        {0, 1, 1, 1, 0, 1, NULL}, /* a Hello of protocol 1 without a minimum */
        {1, 1, 1, 1, 0, 1, NULL}, /* the same, said in full */
        {1, 5, 1, 1, 0, 1, NULL}, /* a newer client that still speaks 1 */
        {0, 1, 1, 2, 0, 1, NULL}, /* an old client and a daemon of protocols 1 and 2 */
        {1, 2, 1, 2, 0, 2, NULL}, /* both speak 2: the newest wins */
        {2, 3, 1, 2, 0, 2, NULL}, /* overlap at one end */
        {0, 2, 1, 1, CONVD_EVERSION, 0,
         "the client speaks protocol version 2 and this daemon "
         "versions 1 to 1: no version in common"},
        {2, 5, 1, 1, CONVD_EVERSION, 0, "versions 2 to 5 and this daemon versions 1 to 1"},
        {0, 1, 2, 3, CONVD_EVERSION, 0, "version 1 and this daemon versions 2 to 3"},
        {0, 0, 1, 1, CONVD_EVERSION, 0, "version 0"},
        {3, 2, 1, 3, CONVD_EVERSION, 0, "versions 3 to 2"},
        {0, 0xffffffffu, 1, 1, CONVD_EVERSION, 0, "version 4294967295"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint32_t v = 12345;
        char why[200] = "";
        int rc = wire_pick_version(cases[i].peer_min, cases[i].peer_max, cases[i].own_min,
                                   cases[i].own_max, "client", "daemon", &v, why, sizeof(why));
        if (rc != cases[i].want)
            fail_msg("case %zu: rc %d, want %d (%s)", i, rc, cases[i].want, why);
        if (rc == 0) {
            assert_int_equal(v, cases[i].version);
        } else {
            assert_int_equal(v, 12345);
            if (strstr(why, cases[i].says) == NULL)
                fail_msg("case %zu: '%s' does not say '%s'", i, why, cases[i].says);
        }
    }
}

/* A ring entry and the ConvRequest it stands for carry the same gate both ways; without
 * F_GATE the entry's gate bytes are not read, and a request without a gate gets no F_GATE. */
static void test_ring_gate_round_trip(void **state)
{
    (void)state;
    Convd__Problem pb;
    fill_pb(&pb);
    Convd__TensorRef t[4];
    for (int i = 0; i < 4; i++) {
        convd__tensor_ref__init(&t[i]);
        t[i].region_id = 1;
        t[i].offset = 4096u * (unsigned)i;
        t[i].bytes = 64;
    }
    Convd__Gate gate = CONVD__GATE__INIT;
    gate.region_id = 3;
    gate.ready_offset = 0x100000008ull;
    gate.done_offset = 12;
    gate.ready_value = 0xfffffff0u;
    gate.done_value = 7;
    Convd__ConvRequest req = CONVD__CONV_REQUEST__INIT;
    req.id = 42;
    req.problem = &pb;
    req.input = &t[0];
    req.weight = &t[1];
    req.bias = &t[2];
    req.output = &t[3];
    req.gate = &gate;
    struct convd_ring_sqe e;
    wire_ring_entry(&req, &e);
    assert_true(e.flags & CONVD_RING_F_GATE);

    Convd__ConvRequest back;
    Convd__Problem bpb;
    Convd__TensorRef brefs[4];
    Convd__Gate bgate;
    char why[128];
    assert_int_equal(wire_ring_request(&e, &back, &bpb, brefs, &bgate, why, sizeof(why)), 0);
    assert_non_null(back.gate);
    assert_int_equal(back.gate->region_id, 3);
    assert_true(back.gate->ready_offset == 0x100000008ull);
    assert_int_equal(back.gate->done_offset, 12);
    assert_int_equal(back.gate->ready_value, 0xfffffff0u);
    assert_int_equal(back.gate->done_value, 7);
    uint8_t a[512], b[512];
    size_t la = convd__conv_request__pack(&req, a), lb = convd__conv_request__pack(&back, b);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);

    /* Gate bytes without the flag are padding: no gate. */
    e.flags &= ~CONVD_RING_F_GATE;
    assert_int_equal(wire_ring_request(&e, &back, &bpb, brefs, &bgate, why, sizeof(why)), 0);
    assert_null(back.gate);
    req.gate = NULL;
    wire_ring_entry(&req, &e);
    assert_false(e.flags & CONVD_RING_F_GATE);
    assert_int_equal(e.gate.region_id, 0);
    /* A flag beyond F_GATE is still refused by name. */
    e.flags |= CONVD_RING_F_GATE << 1;
    assert_int_equal(wire_ring_request(&e, &back, &bpb, brefs, &bgate, why, sizeof(why)),
                     CONVD_EPROTO);
    assert_non_null(strstr(why, "flags"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),   cmocka_unit_test(test_rejects_named_fields),
        cmocka_unit_test(test_pack_limits),  cmocka_unit_test(test_garbage_decode),
        cmocka_unit_test(test_pick_version), cmocka_unit_test(test_ring_gate_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
