/*
 * Writes the seed corpora of the fuzz targets: make_seeds OUTDIR [EXAMPLE_CONF]. Each seed is a
 * valid input (a few are deliberately just wrong, to seed the refusals), packed with protobuf-c
 * or laid out with the project's own structs, so that the fuzzers start from what a real client
 * sends. Requests place their tensors in the regions of fixture.h. The output is kept in the tree
 * (tests/fuzz/corpus/); rerun this after changing the protocol, the ring layout or the fixture.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "convd.pb-c.h"
#include "fixture.h"
#include "ring_layout.h"
#include "wire.h"

static const char *out_dir;

static void write_seed(const char *target, const char *name, const void *buf, size_t len)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", out_dir, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/%s/%s", out_dir, target, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static void write_client(const char *name, const Convd__ClientMessage *m)
{
    uint8_t buf[CONVD_MAX_MESSAGE_BYTES];
    int n = wire_pack_client(m, buf, sizeof(buf));
    if (n < 0) {
        fprintf(stderr, "%s: does not pack\n", name);
        exit(1);
    }
    write_seed("fuzz_client_message", name, buf, (size_t)n);
}

/* --- requests ----------------------------------------------------------------------------- */

/* Where a tensor goes: a fixture region and an offset; its byte count is the problem's. */
struct place {
    uint64_t region;
    uint64_t offset;
};

struct seed_req {
    const char *name;
    uint64_t id;
    struct convd_problem p;
    struct place t[4]; /* input, weight, bias (ignored without bias), output */
    uint32_t priority;
    uint64_t timeout_us;
    struct place gate; /* region 0: no gate; else the ready word there, the done word past it */
};

static struct convd_problem problem(int n, int hw, int c, int k, int rs, int groups,
                                    enum convd_dtype dt, enum convd_layout layout, bool bias)
{
    struct convd_problem p;
    convd_problem_init(&p, n, hw, hw, c, k, rs, rs, groups);
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = rs / 2;
    p.dtype = dt;
    p.layout = layout;
    p.has_bias = bias;
    return p;
}

static struct seed_req requests[10];
static size_t n_requests;

static struct seed_req *add(const char *name, uint64_t id, struct convd_problem p,
                            const struct place t[4])
{
    struct seed_req *r = &requests[n_requests++];
    *r = (struct seed_req){.name = name, .id = id, .p = p};
    memcpy(r->t, t, sizeof(r->t));
    return r;
}

static void make_requests(void)
{
    const uint64_t K64 = 64u << 10, GiB = (uint64_t)1 << 30, BIG = (uint64_t)1 << 63;
    const enum convd_dtype F32 = CONVD_DTYPE_FP32, F16 = CONVD_DTYPE_FP16, B16 = CONVD_DTYPE_BF16;
    const enum convd_layout NCHW = CONVD_LAYOUT_NCHW, NHWC = CONVD_LAYOUT_NHWC;
    struct seed_req *r;
    /* the unit tests' small grouped problem, every tensor in region 1 at 64 KiB steps */
    add("fp32_nchw_bias", 100, problem(2, 6, 4, 8, 3, 2, F32, NCHW, true),
        (struct place[4]){{1, 0}, {1, K64}, {1, 2 * K64}, {1, 3 * K64}});
    /* read-only inputs in the write-sealed region, output in region 2 */
    r = add("fp16_nhwc", 101, problem(1, 8, 16, 16, 1, 1, F16, NHWC, false),
            (struct place[4]){{3, 0}, {3, 4096}, {0, 0}, {2, 0}});
    r->priority = 1;
    /* depthwise bf16, stride 2, dilation 2, ReLU, lowest priority, a timeout */
    r = add("bf16_nchw_depthwise", 102, problem(1, 16, 8, 8, 3, 8, B16, NCHW, true),
            (struct place[4]){{1, 0}, {1, 8192}, {1, 8192 + 256}, {1, 16384}});
    r->p.stride_h = r->p.stride_w = 2;
    r->p.dil_h = r->p.dil_w = 2;
    r->p.pad_top = r->p.pad_bottom = r->p.pad_left = r->p.pad_right = 2;
    r->p.activation = CONVD_ACT_RELU;
    r->priority = 3;
    r->timeout_us = 5000;
    /* inputs through region 5, the alias of region 1's start; output in region 1 past it; ReLU6 */
    r = add("fp16_nchw_alias", 103, problem(4, 14, 32, 32, 3, 4, F16, NCHW, true),
            (struct place[4]){{5, 0}, {5, K64}, {5, 2 * K64}, {1, 6 * K64}});
    r->priority = 2;
    r->p.activation = CONVD_ACT_CLAMP;
    r->p.act_max = 6.0f;
    /* a 2 GiB input and a 4 GiB output offset, in the 6 GiB region */
    add("fp32_nhwc_big", 104, problem(1, 4096, 32, 16, 3, 1, F32, NHWC, true),
        (struct place[4]){{BIG, 0}, {BIG, 2 * GiB}, {BIG, 2 * GiB + K64}, {BIG, 4 * GiB}});
    /* refused: the output overlaps the input through the alias */
    add("overlap_alias", 105, problem(2, 6, 4, 8, 3, 2, F32, NCHW, false),
        (struct place[4]){{5, 0}, {1, K64}, {0, 0}, {1, 128}});
    /* refused: the output in the write-sealed region */
    add("output_sealed", 106, problem(2, 6, 4, 8, 3, 2, F32, NCHW, false),
        (struct place[4]){{1, 0}, {1, K64}, {0, 0}, {3, 0}});
    /* a gate in region 1, past the tensors */
    r = add("fp32_nchw_gated", 107, problem(2, 6, 4, 8, 3, 2, F32, NCHW, true),
            (struct place[4]){{1, 0}, {1, K64}, {1, 2 * K64}, {1, 3 * K64}});
    r->gate = (struct place){1, 4 * K64};
    /* refused: the gate's words inside the output */
    r = add("gate_in_output", 108, problem(2, 6, 4, 8, 3, 2, F32, NCHW, false),
            (struct place[4]){{1, 0}, {1, K64}, {0, 0}, {1, 3 * K64}});
    r->gate = (struct place){1, 3 * K64 + 8};
    /* refused: id 6 is in flight in the request fuzzer's fixture */
    add("id_in_flight", 6, problem(1, 5, 3, 4, 1, 1, F32, NHWC, false),
        (struct place[4]){{2, 0}, {2, 512}, {0, 0}, {2, 1024}});
}

/* A request as protobuf-c structs, in storage the caller provides. */
struct pb_req {
    Convd__ConvRequest req;
    Convd__Problem prob;
    Convd__TensorRef t[4];
    Convd__Gate gate;
};

static void to_pb(const struct seed_req *s, struct pb_req *out)
{
    struct convd_problem_sizes sz;
    if (convd_problem_sizes(&s->p, &sz, NULL, 0) != 0) {
        fprintf(stderr, "%s: invalid problem\n", s->name);
        exit(1);
    }
    convd__conv_request__init(&out->req);
    convd__problem__init(&out->prob);
    wire_problem_to_pb(&s->p, &out->prob);
    const uint64_t bytes[4] = {sz.input_bytes, sz.weight_bytes, sz.bias_bytes, sz.output_bytes};
    for (int i = 0; i < 4; i++) {
        convd__tensor_ref__init(&out->t[i]);
        out->t[i].region_id = s->t[i].region;
        out->t[i].offset = s->t[i].offset;
        out->t[i].bytes = bytes[i];
    }
    out->req.id = s->id;
    out->req.problem = &out->prob;
    out->req.input = &out->t[0];
    out->req.weight = &out->t[1];
    out->req.bias = s->p.has_bias ? &out->t[2] : NULL;
    out->req.output = &out->t[3];
    out->req.priority = s->priority;
    out->req.timeout_us = s->timeout_us;
    convd__gate__init(&out->gate);
    if (s->gate.region != 0) {
        out->gate.region_id = s->gate.region;
        out->gate.ready_offset = s->gate.offset;
        out->gate.done_offset = s->gate.offset + 4;
        out->gate.ready_value = 1;
        out->gate.done_value = 1;
        out->req.gate = &out->gate;
    }
}

/* The same request as a ring entry (wire_ring_request's inverse). */
static void to_sqe(const struct seed_req *s, uint64_t id, struct convd_ring_sqe *e)
{
    struct pb_req pb;
    to_pb(s, &pb);
    pb.req.id = id;
    wire_ring_entry(&pb.req, e);
}

static void request_seeds(void)
{
    for (size_t i = 0; i < n_requests; i++) {
        struct pb_req pb;
        to_pb(&requests[i], &pb);
        uint8_t buf[1024];
        size_t n = convd__conv_request__get_packed_size(&pb.req);
        if (n > sizeof(buf))
            exit(1);
        convd__conv_request__pack(&pb.req, buf);
        write_seed("fuzz_request", requests[i].name, buf, n);
        /* the same request as a datagram, for the message fuzzer */
        Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
        m.msg_case = CONVD__CLIENT_MESSAGE__MSG_CONV;
        m.conv = &pb.req;
        char name[96];
        snprintf(name, sizeof(name), "conv_%s", requests[i].name);
        write_client(name, &m);
    }
}

/* --- other messages ----------------------------------------------------------------------- */

static void message_seeds(void)
{
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;

    Convd__Hello hello = CONVD__HELLO__INIT;
    hello.protocol_version = CONVD_PROTOCOL_VERSION;
    hello.client_name = "fuzz-seed";
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_HELLO;
    m.hello = &hello;
    write_client("hello", &m);

    Convd__RegisterRegion rr = CONVD__REGISTER_REGION__INIT;
    rr.region_id = 1;
    rr.kind = CONVD__REGION_KIND__REGION_MEMFD;
    rr.size = 1u << 20;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_REGISTER_REGION;
    m.register_region = &rr;
    write_client("register_memfd", &m);
    uint8_t handle[CONVD_IPC_HANDLE_BYTES];
    for (size_t i = 0; i < sizeof(handle); i++)
        handle[i] = (uint8_t)(i * 37 + 1);
    rr.region_id = 9;
    rr.kind = CONVD__REGION_KIND__REGION_GPU_IPC;
    rr.ipc_handle.data = handle;
    rr.ipc_handle.len = sizeof(handle);
    rr.ipc_offset = 4096;
    write_client("register_gpu", &m);

    Convd__UnregisterRegion ur = CONVD__UNREGISTER_REGION__INIT;
    ur.region_id = 1;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_UNREGISTER_REGION;
    m.unregister_region = &ur;
    write_client("unregister", &m);

    Convd__StatusRequest st = CONVD__STATUS_REQUEST__INIT;
    st.tag = 7;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_STATUS;
    m.status = &st;
    write_client("status", &m);

    Convd__MetricsRequest mr = CONVD__METRICS_REQUEST__INIT;
    mr.tag = 8;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_METRICS;
    m.metrics = &mr;
    write_client("metrics", &m);

    Convd__Ping ping = CONVD__PING__INIT;
    ping.tag = 0x1234567890ull;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_PING;
    m.ping = &ping;
    write_client("ping", &m);

    Convd__AttachRing ar = CONVD__ATTACH_RING__INIT;
    ar.version = CONVD_RING_VERSION;
    ar.sq_entries = 64;
    ar.cq_entries = 128;
    ar.size = convd_ring_bytes(64, 128);
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_ATTACH_RING;
    m.attach_ring = &ar;
    write_client("attach_ring", &m);

    Convd__Doorbell db = CONVD__DOORBELL__INIT;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_DOORBELL;
    m.doorbell = &db;
    write_client("doorbell", &m);

    /* refused by protobuf-c: a ConvRequest cut in the middle of its problem */
    struct pb_req pb;
    to_pb(&requests[0], &pb);
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_CONV;
    m.conv = &pb.req;
    uint8_t buf[1024];
    int n = wire_pack_client(&m, buf, sizeof(buf));
    if (n < 12)
        exit(1);
    write_seed("fuzz_client_message", "truncated_conv", buf, (size_t)n / 2);
}

/* --- rings -------------------------------------------------------------------------------- */

enum { OP_POLL, OP_DONE, OP_FAIL, OP_CONSUME, OP_CQ_HEAD, OP_SUBMIT, OP_SCRIBBLE, OP_WAKE };

struct step {
    uint8_t op, arg;
};
_Static_assert(sizeof(struct step) == 2, "a step is two bytes of fuzz_ring's input");

/* fuzz_ring's input: shape, max_inflight - 1, start, header, entries, steps. `which` lists the
 * request of each entry (an index into requests[], or -1 for an entry with a bad opcode). */
static void ring_seed(const char *name, unsigned sq_log2, unsigned cq_log2, unsigned max_inflight,
                      uint32_t start, uint32_t sq_tail, uint32_t cq_head, const int *which,
                      const struct step *steps, size_t n_steps)
{
    uint32_t sq = 1u << sq_log2;
    size_t len = 6 + sizeof(struct convd_ring_header) + sq * sizeof(struct convd_ring_sqe) +
                 n_steps * sizeof(*steps);
    uint8_t *buf = calloc(1, len);
    if (buf == NULL)
        exit(1);
    buf[0] = (uint8_t)(sq_log2 | cq_log2 << 2);
    buf[1] = (uint8_t)(max_inflight - 1);
    for (int i = 0; i < 4; i++)
        buf[2 + i] = (uint8_t)(start >> (8 * i));
    struct convd_ring_header h;
    memset(&h, 0, sizeof(h));
    h.magic = CONVD_RING_MAGIC;
    h.version = CONVD_RING_VERSION;
    h.sq_entries = sq;
    h.cq_entries = 1u << cq_log2;
    atomic_init(&h.sq_tail, sq_tail);
    atomic_init(&h.cq_head, cq_head);
    memcpy(buf + 6, &h, sizeof(h));
    uint8_t *entries = buf + 6 + sizeof(h);
    for (uint32_t i = 0; i < sq; i++) {
        struct convd_ring_sqe e;
        memset(&e, 0, sizeof(e));
        if (which[i] >= 0)
            to_sqe(&requests[which[i]], 1000 + i, &e);
        else
            e.opcode = 2;
        memcpy(entries + (size_t)i * sizeof(e), &e, sizeof(e));
    }
    memcpy(entries + (size_t)sq * sizeof(struct convd_ring_sqe), steps, n_steps * sizeof(*steps));
    write_seed("fuzz_ring", name, buf, len);
    free(buf);
}

#define RING_SEED(name, sq_log2, cq_log2, max_inflight, start, sq_tail, cq_head, which, ...)       \
    do {                                                                                           \
        const struct step steps_[] = {__VA_ARGS__};                                                \
        ring_seed(name, sq_log2, cq_log2, max_inflight, start, sq_tail, cq_head, which, steps_,    \
                  sizeof(steps_) / sizeof(steps_[0]));                                             \
    } while (0)

static void ring_seeds(void)
{
    /* three requests, completed and consumed in turn */
    const int four[4] = {0, 1, 2, 3};
    RING_SEED("three_done", 2, 2, 16, 0, 3, 0, four, {OP_DONE, 0}, {OP_DONE, 0}, {OP_CONSUME, 8},
              {OP_DONE, 0}, {OP_POLL, 63});
    /* one completion slot: back-pressure until the client reads */
    const int two[2] = {0, 3};
    RING_SEED("backpressure", 1, 0, 16, 0, 2, 0, two, {OP_POLL, 63}, {OP_DONE, 0}, {OP_POLL, 63},
              {OP_CONSUME, 1}, {OP_POLL, 63}, {OP_DONE, 0}, {OP_CONSUME, 1});
    /* counters about to wrap, a bad opcode, a failure, more submissions, the doorbell flags */
    const int eight[8] = {0, 1, -1, 2, 3, 0, 4, 1};
    RING_SEED("wrap", 3, 3, 16, 0xfffffffdu, 6, 0, eight, {OP_FAIL, 0}, {OP_DONE, 0}, {OP_WAKE, 3},
              {OP_CONSUME, 4}, {OP_SUBMIT, 2}, {OP_POLL, 63}, {OP_SCRIBBLE, 0x5a}, {OP_DONE, 0},
              {OP_WAKE, 0}, {OP_POLL, 63});
    /* a client that moves cq_head past what it was given */
    const int one[1] = {0};
    RING_SEED("cq_head_ahead", 0, 1, 16, 100, 1, 0, one, {OP_CQ_HEAD, 0xfb}, {OP_DONE, 0});
    /* sq_tail far past sq_head: corrupt */
    RING_SEED("sq_tail_corrupt", 0, 0, 16, 0, 9, 0, one, {OP_POLL, 63});
    /* one request allowed in flight: the rest wait in the ring, then fail with ELIMIT */
    RING_SEED("limit_one", 2, 2, 1, 7, 4, 0, four, {OP_POLL, 63}, {OP_DONE, 0}, {OP_CONSUME, 4},
              {OP_POLL, 63});
}

/* --- configuration ------------------------------------------------------------------------ */

static void config_seeds(const char *example)
{
    /* what --check-config prints without a configuration file */
    struct convd_config c;
    config_defaults(&c);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f == NULL)
        exit(1);
    config_print(&c, f);
    fclose(f);
    write_seed("fuzz_config", "check_config.conf", text, len);
    free(text);

    static const char every[] = "# every option, away from its default\n"
                                "socket = \"/tmp/convd # test.sock\"   # quoted, with a '#'\n"
                                "backend = null\n"
                                "log-level = debug\n"
                                "threads = 4\n"
                                "device = -1\n"
                                "max_clients = 64\n"
                                "max_clients_per_user = 8\n"
                                "max_inflight_per_user = 512\n"
                                "idle_timeout_ms = 0\n"
                                "max_inflight = 32\n"
                                "max_regions = 16\n"
                                "max_mapped_bytes = 2GiB\n"
                                "max_batch = 8\n"
                                "max_queue_delay_us = 100\n"
                                "queue_limit = 1024\n"
                                "drain_timeout_ms = 500\n"
                                "socket_mode = 0600\n"
                                "socket_group = 0\n"
                                "allow_uids = 0, 1000,1001\n"
                                "allow_gids = root\n"
                                "max_protocol_errors = 4\n"
                                "max_send_queue_bytes = 4M\n"
                                "hello_timeout_ms = 1000\n"
                                "\tspin_us = 0\r\n"
                                "doorbell_threads = 2\n"
                                "ring_stall_timeout_ms = 100\n";
    write_seed("fuzz_config", "every_option.conf", every, sizeof(every) - 1);
    static const char bad[] = "max_batch = 4\nbackend = cpu\nmax_batch = 4096\nthreads = 2\n";
    write_seed("fuzz_config", "out_of_range.conf", bad, sizeof(bad) - 1);

    if (example == NULL)
        return;
    f = fopen(example, "rb");
    if (f == NULL) {
        perror(example);
        exit(1);
    }
    char buf[16384];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    write_seed("fuzz_config", "example.conf", buf, n);
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s OUTDIR [EXAMPLE_CONF]\n", argv[0]);
        return 2;
    }
    out_dir = argv[1];
    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
        perror(out_dir);
        return 1;
    }
    make_requests();
    request_seeds();
    message_seeds();
    ring_seeds();
    config_seeds(argc == 3 ? argv[2] : NULL);
    return 0;
}
