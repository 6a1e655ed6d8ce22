/* Request validation: every rejection path of a ConvRequest with its code and sentence, and what
 * a valid request turns into. Regions are real sealed memfds registered with the CPU backend. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "idmap.h"
#include "regions.h"
#include "request.h"
#include "wire.h"
#include "testutil.h"

#define BIG (1u << 20)

struct fixture {
    struct convd_backend be;
    struct convd_backend refusing; /* the CPU backend, except that it refuses NHWC */
    struct region_limits limits;
    struct region_table t;
    struct idmap inflight;
};

/* supports() of a backend that runs everything the CPU backend runs except NHWC: the one path
 * (CONVD_EUNSUPPORTED) the real CPU backend never takes. */
static void *cpu_ctx_for_refusing;
static int refusing_supports(void *ctx, const struct convd_problem *p, char *why, size_t len)
{
    (void)ctx;
    if (p->layout == CONVD_LAYOUT_NHWC) {
        snprintf(why, len, "nhwc is not implemented here");
        return CONVD_EUNSUPPORTED;
    }
    return convd_cpu_backend_ops.supports(cpu_ctx_for_refusing, p, why, len);
}
static struct convd_backend_ops refusing_ops;

static void add_region(struct fixture *fx, uint64_t id, size_t size, unsigned extra_seals)
{
    char why[256];
    int fd = tu_memfd("convd-unit", size, F_SEAL_SHRINK | F_SEAL_GROW | extra_seals);
    if (region_register_memfd(&fx->t, id, size, &fd, 1, why, sizeof(why)) != 0)
        fail_msg("region %llu: %s", (unsigned long long)id, why);
    close(fd);
}

static int setup(void **state)
{
    struct fixture *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    struct convd_backend_config cfg = {.threads = 1, .device = -1, .max_batch = 8};
    char why[256];
    fx->be.ops = &convd_cpu_backend_ops;
    assert_int_equal(convd_cpu_backend_ops.init(&cfg, &fx->be.ctx, &fx->be.info, why, sizeof(why)),
                     0);
    refusing_ops = convd_cpu_backend_ops;
    refusing_ops.supports = refusing_supports;
    cpu_ctx_for_refusing = fx->be.ctx;
    fx->refusing = fx->be;
    fx->refusing.ops = &refusing_ops;
    fx->limits.max_regions = 16;
    fx->limits.max_mapped_bytes = 64u << 20;
    region_table_init(&fx->t, &fx->be, &fx->limits, NULL);
    add_region(fx, 1, BIG, 0);
    add_region(fx, 2, 4096, 0);
    add_region(fx, 3, BIG, F_SEAL_WRITE);
    idmap_init(&fx->inflight);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *fx = *state;
    region_table_release_all(&fx->t);
    assert_true(region_table_empty(&fx->t));
    region_table_destroy(&fx->t);
    idmap_free(&fx->inflight);
    fx->be.ops->destroy(fx->be.ctx);
    free(fx);
    return 0;
}

/* A request of problem p with every tensor in region 1 at 64 KiB steps, in a form tests edit. */
struct req {
    Convd__ConvRequest pb;
    Convd__Problem prob;
    Convd__TensorRef in, w, b, out;
    struct convd_problem_sizes sz;
};

static void req_init(struct req *r, uint64_t id, const struct convd_problem *p)
{
    convd__conv_request__init(&r->pb);
    convd__problem__init(&r->prob);
    wire_problem_to_pb(p, &r->prob);
    assert_int_equal(convd_problem_sizes(p, &r->sz, NULL, 0), 0);
    Convd__TensorRef *t[4] = {&r->in, &r->w, &r->b, &r->out};
    const uint64_t bytes[4] = {r->sz.input_bytes, r->sz.weight_bytes, r->sz.bias_bytes,
                               r->sz.output_bytes};
    for (int i = 0; i < 4; i++) {
        convd__tensor_ref__init(t[i]);
        t[i]->region_id = 1;
        t[i]->offset = (uint64_t)i * 65536;
        t[i]->bytes = bytes[i];
    }
    r->pb.id = id;
    r->pb.problem = &r->prob;
    r->pb.input = &r->in;
    r->pb.weight = &r->w;
    r->pb.bias = p->has_bias ? &r->b : NULL;
    r->pb.output = &r->out;
}

static void small(struct convd_problem *p)
{
    convd_problem_init(p, 2, 6, 6, 4, 8, 3, 3, 2);
    p->pad_top = p->pad_bottom = p->pad_left = p->pad_right = 1;
    p->has_bias = true;
}

static int validate(struct fixture *fx, struct convd_backend *be, const struct req *r,
                    uint32_t max_inflight, struct dreq *out, char *why, size_t len)
{
    const struct req_context ctx = {&fx->t, be, &fx->inflight, max_inflight};
    return req_validate(&r->pb, &ctx, out, why, len);
}

static void expect_reject(struct fixture *fx, const struct req *r, int want, const char *w1,
                          const char *w2)
{
    struct dreq d;
    char why[320] = "";
    int rc = validate(fx, &fx->be, r, 64, &d, why, sizeof(why));
    if (rc != want)
        fail_msg("got %s (%s), want %s", convd_status_name(rc), why, convd_status_name(want));
    if (w1 != NULL && strstr(why, w1) == NULL)
        fail_msg("\"%s\" does not mention \"%s\"", why, w1);
    if (w2 != NULL && strstr(why, w2) == NULL)
        fail_msg("\"%s\" does not mention \"%s\"", why, w2);
}

/* supports() that counts its calls and refuses NHWC, as refusing_supports does. */
static int supports_calls;
static int counting_supports(void *ctx, const struct convd_problem *p, char *why, size_t len)
{
    supports_calls++;
    return refusing_supports(ctx, p, why, len);
}

/* The connection's problem cache: a problem that passed its checks is not checked again while it
 * repeats (the backend is asked once), but tensors still are every time, a new problem is
 * checked and replaces it, and a refused problem is never cached. */
static void test_problem_cache(void **state)
{
    struct fixture *fx = *state;
    struct convd_backend_ops ops = refusing_ops;
    ops.supports = counting_supports;
    struct convd_backend be = fx->refusing;
    be.ops = &ops;
    struct req_problem_cache cache;
    memset(&cache, 0, sizeof(cache));
    const struct req_context ctx = {&fx->t, &be, &fx->inflight, 64, CONVD_PROTOCOL_VERSION, &cache};
    struct convd_problem p, q, nhwc;
    small(&p);
    q = p;
    q.has_bias = false;
    nhwc = p;
    nhwc.layout = CONVD_LAYOUT_NHWC;
    struct req r;
    struct dreq d;
    char why[320];
    supports_calls = 0;
    const struct {
        const struct convd_problem *p;
        uint64_t out_bytes_delta;
        int want, calls;
    } steps[] = {
        {&p, 0, 0, 1},                     /* checked, cached */
        {&p, 0, 0, 1},                     /* the same: not asked again */
        {&p, 2, CONVD_ESIZE, 1},           /* its tensors are still checked */
        {&q, 0, 0, 2},                     /* another problem: checked, cached */
        {&p, 0, 0, 3},                     /* the first again: checked again */
        {&nhwc, 0, CONVD_EUNSUPPORTED, 4}, /* refused ... */
        {&nhwc, 0, CONVD_EUNSUPPORTED, 5}, /* ... and not cached */
        {&p, 0, 0, 5},                     /* the cache still holds p */
    };
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        req_init(&r, 100 + i, steps[i].p);
        r.out.bytes += steps[i].out_bytes_delta;
        why[0] = '\0';
        int rc = req_validate(&r.pb, &ctx, &d, why, sizeof(why));
        if (rc != steps[i].want || supports_calls != steps[i].calls)
            fail_msg("step %zu: %s (%s) after %d supports() calls, want %s after %d", i,
                     convd_status_name(rc), why, supports_calls, convd_status_name(steps[i].want),
                     steps[i].calls);
    }
    /* A malformed problem is refused whatever the cache holds. */
    struct convd_problem bad = p;
    bad.c = 5; /* not a multiple of groups = 2 */
    req_init(&r, 200, &p);
    wire_problem_to_pb(&bad, &r.prob);
    assert_int_equal(req_validate(&r.pb, &ctx, &d, why, sizeof(why)), CONVD_EGROUPS);
}

static void test_valid_request(void **state)
{
    struct fixture *fx = *state;
    struct convd_problem p;
    small(&p);
    struct req r;
    req_init(&r, 42, &p);
    r.pb.priority = 2;
    r.pb.timeout_us = 500;
    struct dreq d;
    memset(&d, 0xab, sizeof(d));
    char why[256] = "";
    assert_int_equal(validate(fx, &fx->be, &r, 64, &d, why, sizeof(why)), 0);
    struct region *reg = region_find(&fx->t, 1);
    assert_int_equal(d.id, 42);
    assert_true(convd_problem_same(&d.job.problem, &p));
    assert_ptr_equal(d.job.input.mem, &reg->mem);
    assert_ptr_equal(d.job.weight.mem, &reg->mem);
    assert_ptr_equal(d.job.bias.mem, &reg->mem);
    assert_ptr_equal(d.job.output.mem, &reg->mem);
    assert_int_equal(d.job.weight.offset, 65536);
    assert_int_equal(d.job.output.offset, 3 * 65536);
    assert_int_equal(d.job.output.bytes, r.sz.output_bytes);
    assert_ptr_equal(d.job.owner, &d);
    assert_ptr_equal(d.sched.problem, &d.job.problem);
    assert_int_equal(d.sched.priority, 2);
    assert_int_equal(d.timeout_us, 500);
    for (int i = 0; i < REQ_TENSORS; i++)
        assert_ptr_equal(d.regions[i], reg);
    /* references are taken only on request */
    assert_int_equal(reg->refs, 0);
    req_ref_regions(&d);
    assert_int_equal(reg->refs, 4);
    req_unref_regions(&d);
    assert_int_equal(reg->refs, 0);

    /* without bias: no bias view, no bias region */
    p.has_bias = false;
    req_init(&r, 43, &p);
    assert_int_equal(validate(fx, &fx->be, &r, 64, &d, why, sizeof(why)), 0);
    assert_null(d.job.bias.mem);
    assert_null(d.regions[REQ_BIAS]);
    /* inputs may live in a write-sealed region; tensors may share a region with no overlap */
    req_init(&r, 44, &p);
    r.in.region_id = 3;
    r.w.region_id = 3;
    r.w.offset = 0; /* input and weight may overlap: both are only read */
    assert_int_equal(validate(fx, &fx->be, &r, 64, &d, why, sizeof(why)), 0);
}

static void test_problem_rejections(void **state)
{
    struct fixture *fx = *state;
    struct convd_problem p;
    small(&p);
    struct req r;

    req_init(&r, 1, &p);
    r.pb.priority = 4;
    expect_reject(fx, &r, CONVD_EINVAL, "field priority is 4", "0 (highest) to 3");
    req_init(&r, 1, &p);
    r.pb.problem = NULL;
    expect_reject(fx, &r, CONVD_EBADSHAPE, "no problem", NULL);
    req_init(&r, 1, &p);
    r.prob.n = 0;
    expect_reject(fx, &r, CONVD_EBADSHAPE, "field n is 0", NULL);
    req_init(&r, 1, &p);
    r.prob.h = 0x80000000u;
    expect_reject(fx, &r, CONVD_EBADSHAPE, "field h", NULL);
    req_init(&r, 1, &p);
    r.prob.dtype = 7;
    expect_reject(fx, &r, CONVD_EBADSHAPE, "dtype", NULL);
    req_init(&r, 1, &p);
    r.prob.layout = 0;
    expect_reject(fx, &r, CONVD_EBADSHAPE, "layout", NULL);
    req_init(&r, 1, &p);
    r.prob.c = 5;
    expect_reject(fx, &r, CONVD_EGROUPS, "groups", NULL);
    req_init(&r, 1, &p);
    r.prob.r = 20;
    expect_reject(fx, &r, CONVD_EBADSHAPE, "filter height", NULL);
    /* TF32 is an fp32 permission: allowed there (and reaches the job), refused elsewhere */
    req_init(&r, 1, &p);
    r.prob.allow_tf32 = true;
    {
        struct dreq d;
        char why[320];
        assert_int_equal(validate(fx, &fx->be, &r, 64, &d, why, sizeof(why)), 0);
        assert_true(d.job.problem.allow_tf32);
    }
    req_init(&r, 1, &p);
    r.prob.allow_tf32 = true;
    r.prob.dtype = CONVD__DTYPE__DTYPE_FP16;
    expect_reject(fx, &r, CONVD_EBADSHAPE, "allow_tf32", NULL);

    /* a problem the backend does not run */
    struct convd_problem nhwc = p;
    nhwc.layout = CONVD_LAYOUT_NHWC;
    req_init(&r, 1, &nhwc);
    struct dreq d;
    char why[320];
    assert_int_equal(validate(fx, &fx->refusing, &r, 64, &d, why, sizeof(why)), CONVD_EUNSUPPORTED);
    assert_non_null(strstr(why, "the cpu backend cannot run this problem: nhwc"));
    /* ... which the real CPU backend does */
    assert_int_equal(validate(fx, &fx->be, &r, 64, &d, why, sizeof(why)), 0);
}

static void test_tensor_rejections(void **state)
{
    struct fixture *fx = *state;
    struct convd_problem p;
    small(&p);
    struct req r;
    char buf[128];

    /* presence */
    req_init(&r, 1, &p);
    r.pb.input = NULL;
    expect_reject(fx, &r, CONVD_EINVAL, "request has no input tensor", NULL);
    req_init(&r, 1, &p);
    r.pb.weight = NULL;
    expect_reject(fx, &r, CONVD_EINVAL, "no weight tensor", NULL);
    req_init(&r, 1, &p);
    r.pb.output = NULL;
    expect_reject(fx, &r, CONVD_EINVAL, "no output tensor", NULL);
    req_init(&r, 1, &p);
    r.pb.bias = NULL;
    expect_reject(fx, &r, CONVD_EINVAL, "has_bias is set but the request has no bias", NULL);
    struct convd_problem nb = p;
    nb.has_bias = false;
    req_init(&r, 1, &nb);
    r.pb.bias = &r.b;
    expect_reject(fx, &r, CONVD_EINVAL, "bias tensor but problem has_bias is not set", NULL);

    /* unknown regions, naming the tensor */
    req_init(&r, 1, &p);
    r.w.region_id = 99;
    expect_reject(fx, &r, CONVD_ENOREGION, "weight tensor names region 99", "not registered");
    req_init(&r, 1, &p);
    r.b.region_id = 0;
    expect_reject(fx, &r, CONVD_ENOREGION, "bias tensor names region 0", NULL);

    /* bounds: past the end, straddling it, and sums that overflow 64 bits */
    req_init(&r, 1, &p);
    r.out.offset = BIG;
    snprintf(buf, sizeof(buf), "output tensor at offset %u with %llu bytes", BIG,
             (unsigned long long)r.sz.output_bytes);
    expect_reject(fx, &r, CONVD_EBOUNDS, buf, "region 1 (1048576 bytes)");
    req_init(&r, 1, &p);
    r.in.offset = BIG - r.sz.input_bytes + 1;
    expect_reject(fx, &r, CONVD_EBOUNDS, "input tensor at offset", "ends past the end");
    req_init(&r, 1, &p);
    r.in.region_id = 2;
    r.in.offset = 4096 - 4;
    expect_reject(fx, &r, CONVD_EBOUNDS, "input tensor at offset 4092", "region 2 (4096 bytes)");
    req_init(&r, 1, &p);
    r.out.offset = UINT64_MAX - 3;
    expect_reject(fx, &r, CONVD_EBOUNDS, "output tensor at offset 18446744073709551612", NULL);
    req_init(&r, 1, &p);
    r.b.offset = UINT64_MAX;
    expect_reject(fx, &r, CONVD_EBOUNDS, "bias tensor", NULL);

    /* byte counts, naming expected and got */
    req_init(&r, 1, &p);
    r.in.bytes -= 4;
    snprintf(buf, sizeof(buf), "input tensor has %llu bytes, the problem needs %llu",
             (unsigned long long)r.sz.input_bytes - 4, (unsigned long long)r.sz.input_bytes);
    expect_reject(fx, &r, CONVD_ESIZE, buf, NULL);
    req_init(&r, 1, &p);
    r.b.bytes = 2;
    expect_reject(fx, &r, CONVD_ESIZE, "bias tensor has 2 bytes", NULL);
    req_init(&r, 1, &p);
    r.out.bytes = 0;
    expect_reject(fx, &r, CONVD_ESIZE, "output tensor has 0 bytes", NULL);
    /* a count that could not fit anywhere is still a count that does not match */
    req_init(&r, 1, &p);
    r.w.bytes = UINT64_MAX;
    expect_reject(fx, &r, CONVD_ESIZE, "weight tensor has 18446744073709551615 bytes", NULL);

    /* output in a region sealed against writing */
    req_init(&r, 1, &p);
    r.out.region_id = 3;
    expect_reject(fx, &r, CONVD_ESEAL, "output tensor is in region 3", "sealed against writing");

    /* offsets that split elements, inside the region: the client library refuses these too */
    req_init(&r, 1, &p);
    r.in.offset += 2;
    expect_reject(fx, &r, CONVD_EINVAL, "input tensor at offset", "not aligned to its 4-byte");
    req_init(&r, 1, &p);
    r.out.offset += 1;
    expect_reject(fx, &r, CONVD_EINVAL, "output tensor", "not aligned");

    /* output overlapping an input */
    req_init(&r, 1, &p);
    r.out.offset = 12;
    expect_reject(fx, &r, CONVD_EINVAL, "overlaps the input tensor", NULL);
    req_init(&r, 1, &p);
    r.out.offset = r.w.offset + r.sz.weight_bytes - 4;
    expect_reject(fx, &r, CONVD_EINVAL, "overlaps the weight tensor", NULL);
    req_init(&r, 1, &p);
    r.out.offset = r.b.offset;
    expect_reject(fx, &r, CONVD_EINVAL, "overlaps the bias tensor", NULL);
    /* adjacent is fine */
    req_init(&r, 1, &p);
    r.out.offset = r.b.offset + r.sz.bias_bytes;
    expect_reject(fx, &r, 0, NULL, NULL);
}

static void test_inflight_rejections(void **state)
{
    struct fixture *fx = *state;
    struct convd_problem p;
    small(&p);
    struct req r;
    struct dreq d;
    char why[320];
    static int token[3];
    assert_int_equal(idmap_put(&fx->inflight, 5, &token[0]), 0);
    assert_int_equal(idmap_put(&fx->inflight, 6, &token[1]), 0);
    req_init(&r, 5, &p);
    expect_reject(fx, &r, CONVD_EEXIST, "request id 5 is already in flight", NULL);
    req_init(&r, 7, &p);
    assert_int_equal(validate(fx, &fx->be, &r, 3, &d, why, sizeof(why)), 0);
    assert_int_equal(idmap_put(&fx->inflight, 7, &token[2]), 0);
    req_init(&r, 8, &p);
    assert_int_equal(validate(fx, &fx->be, &r, 3, &d, why, sizeof(why)), CONVD_ELIMIT);
    assert_non_null(strstr(why, "3 requests in flight, the limit (max_inflight)"));
    /* checks about the request itself come first: a bad request is named for what is wrong */
    r.in.region_id = 50;
    assert_int_equal(validate(fx, &fx->be, &r, 3, &d, why, sizeof(why)), CONVD_ENOREGION);
}

/* A backend that imports device regions at a made-up address (nothing is dereferenced while a
 * request is validated): allocation base 0x100000, so a region's address is that plus its
 * allocation offset. */
static int fakedev_import(void *ctx, struct convd_mem *m, char *why, size_t len)
{
    (void)ctx, (void)why, (void)len;
    m->device_ptr = (void *)(uintptr_t)(0x100000 + m->ipc_offset);
    m->be_priv = m;
    return 0;
}

static void fakedev_release(void *ctx, struct convd_mem *m)
{
    (void)ctx;
    m->device_ptr = NULL;
    m->be_priv = NULL;
}

/* Device memory: a tensor whose device address splits elements is refused when the request is
 * decoded (the backends assume it never reaches them), though its offset in the region is
 * element-aligned; the same tensor in a region that starts on an element boundary is admitted. */
static void test_device_alignment(void **state)
{
    struct fixture *fx = *state;
    struct convd_backend_ops ops = convd_cpu_backend_ops;
    ops.mem_import = fakedev_import;
    ops.mem_release = fakedev_release;
    struct convd_backend be = fx->be;
    be.ops = &ops;
    struct region_table t;
    region_table_init(&t, &be, &fx->limits, NULL);
    const uint8_t handle[CONVD_IPC_HANDLE_SIZE] = {1};
    char why[320] = "";
    assert_int_equal(region_register_gpu(&t, 7, BIG, handle, sizeof handle, 2, why, sizeof why), 0);
    assert_int_equal(region_register_gpu(&t, 8, BIG, handle, sizeof handle, 256, why, sizeof why),
                     0);
    struct convd_problem p;
    small(&p);
    p.dtype = CONVD_DTYPE_FP32;
    struct req r;
    req_init(&r, 1, &p);
    r.in.region_id = r.w.region_id = r.b.region_id = r.out.region_id = 7;
    const struct req_context ctx = {&t, &be, &fx->inflight, 64, CONVD_PROTOCOL_VERSION};
    struct dreq d;
    int rc = req_validate(&r.pb, &ctx, &d, why, sizeof why);
    if (rc != CONVD_EINVAL || strstr(why, "input tensor in device memory") == NULL ||
        strstr(why, "allocation offset 2") == NULL)
        fail_msg("misaligned device tensor: %s (%s)", convd_status_name(rc), why);
    r.in.region_id = r.w.region_id = r.b.region_id = r.out.region_id = 8;
    assert_int_equal(req_validate(&r.pb, &ctx, &d, why, sizeof why), 0);
    assert_ptr_equal(d.job.input.mem, &region_find(&t, 8)->mem);
    region_table_release_all(&t);
    region_table_destroy(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_valid_request, setup, teardown),
        cmocka_unit_test_setup_teardown(test_problem_rejections, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tensor_rejections, setup, teardown),
        cmocka_unit_test_setup_teardown(test_device_alignment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inflight_rejections, setup, teardown),
        cmocka_unit_test_setup_teardown(test_problem_cache, setup, teardown),
    };
    return cmocka_run_group_tests_name("daemon request validation", tests, NULL, NULL);
}
