/*
 * GPU kernel tests: every kernel family (depthwise, fma, mma, generic, and the router) against
 * the CPU reference on fresh random problems, outputs poisoned with 0xff (NaN) first so that an
 * element a kernel forgets to write fails. Plus two identities that must hold bit for bit: a
 * G-group convolution equals G independent convolutions on channel slices, and a multi-problem
 * launch equals one launch per problem.
 *
 * Without a GPU every test prints "skipped: no GPU" and is skipped. CONVD_TEST_SEED replays a run.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "convd_kernels.h"
#include "gpu_dev.h"
#include "testutil.h"

static struct tu_rng rng;

static int have_gpu(void)
{
    static int known = -1;
    if (known < 0) {
        int n = 0;
        convd_gpu_device_count(&n);
        known = n > 0;
        if (known) {
            char name[160];
            if (convd_gpu_device_name(name, sizeof(name)) == 0)
                fprintf(stderr, "device: %s\n", name);
        }
    }
    return known;
}

#define REQUIRE_GPU()                                                                              \
    do {                                                                                           \
        if (!have_gpu()) {                                                                         \
            printf("skipped: no GPU\n");                                                           \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

/* Host and device tensors of one problem. */
struct tcase {
    struct convd_problem p;
    struct convd_problem_sizes z;
    void *hx, *hw, *hb, *hy;
    float *ref;
    void *dx, *dw, *db, *dy;
    void *ws; /* room for NHWC copies of input and weights (NCHW problems) */
    size_t ws_bytes;
};

static void tc_init(struct tcase *c, const struct convd_problem *p)
{
    memset(c, 0, sizeof(*c));
    c->p = *p;
    assert_int_equal(convd_problem_sizes(p, &c->z, NULL, 0), 0);
    c->hx = malloc(c->z.input_bytes);
    c->hw = malloc(c->z.weight_bytes);
    c->hb = malloc(c->z.bias_bytes ? c->z.bias_bytes : 1);
    c->hy = malloc(c->z.output_bytes);
    c->ref = malloc(c->z.output_elems * sizeof(float));
    assert_non_null(c->hx);
    assert_non_null(c->hw);
    assert_non_null(c->hb);
    assert_non_null(c->hy);
    assert_non_null(c->ref);
    tu_fill_random(&rng, p->dtype, c->hx, c->z.input_elems);
    tu_fill_random(&rng, p->dtype, c->hw, c->z.weight_elems);
    if (p->has_bias)
        tu_fill_random(&rng, p->dtype, c->hb, c->z.bias_elems);
    assert_int_equal(convd_gpu_alloc(c->z.input_bytes, &c->dx), 0);
    assert_int_equal(convd_gpu_alloc(c->z.weight_bytes, &c->dw), 0);
    assert_int_equal(convd_gpu_alloc(c->z.bias_bytes ? c->z.bias_bytes : 16, &c->db), 0);
    assert_int_equal(convd_gpu_alloc(c->z.output_bytes, &c->dy), 0);
    /* Room for every route's copies: NHWC copies of an NCHW problem's input and weights, or
     * NCHW copies of an NHWC problem's input, weights and output (256-byte aligned each). */
    c->ws_bytes = c->z.input_bytes + c->z.weight_bytes + c->z.output_bytes + 1024;
    size_t need = 0; /* channel-padded copies can take more */
    assert_int_equal(convd_gpu_dev_workspace(p, 1, &need), 0);
    if (need > c->ws_bytes)
        c->ws_bytes = need;
    assert_int_equal(convd_gpu_alloc(c->ws_bytes, &c->ws), 0);
    assert_int_equal(convd_gpu_upload(c->dx, c->hx, c->z.input_bytes), 0);
    assert_int_equal(convd_gpu_upload(c->dw, c->hw, c->z.weight_bytes), 0);
    if (p->has_bias)
        assert_int_equal(convd_gpu_upload(c->db, c->hb, c->z.bias_bytes), 0);
}

static void tc_free(struct tcase *c)
{
    free(c->hx);
    free(c->hw);
    free(c->hb);
    free(c->hy);
    free(c->ref);
    convd_gpu_free(c->dx);
    convd_gpu_free(c->dw);
    convd_gpu_free(c->db);
    convd_gpu_free(c->dy);
    convd_gpu_free(c->ws);
}

/* Reference output as float: the CPU backend's convolution when it is linked, else the naive
 * double-precision loop of testutil. */
static void tc_reference(struct tcase *c)
{
#ifdef CONVD_TEST_HAVE_CPU
    void *out = malloc(c->z.output_bytes);
    assert_non_null(out);
    struct convd_tensors t = {c->hx, c->hw, c->p.has_bias ? c->hb : NULL, out};
    assert_int_equal(convd_cpu_conv(&c->p, &t, 0), 0);
    for (uint64_t i = 0; i < c->z.output_elems; i++)
        c->ref[i] = tu_load(c->p.dtype, out, i);
    free(out);
#else
    tu_ref_conv(&c->p, c->hx, c->hw, c->p.has_bias ? c->hb : NULL, c->ref);
#endif
}

/* Runs on `family`: AUTO through the product's convd_gpu_conv() while the development policy is
 * the default (so that entry point is what the tests cover), through the development library's
 * router otherwise (a test that turned a knob tests the route under it). */
static int run_on(const struct convd_problem *p, const struct convd_tensors *t, size_t count,
                  void *ws, size_t ws_bytes, enum convd_gpu_family family)
{
    if (family != CONVD_GPU_FAMILY_AUTO ||
        memcmp(&convd_gpu_dev_policy, &convd_gpu_policy_default, sizeof(convd_gpu_dev_policy)) != 0)
        return convd_gpu_conv_family(p, t, count, ws, ws_bytes, NULL, family);
    return convd_gpu_conv(p, t, count, ws, ws_bytes, NULL);
}

/* Poisons the device output, runs the family, downloads into hy. Returns the API's code. With
 * use_ws the workspace is offered (NCHW problems then run on NHWC copies), else not (NCHW read
 * directly). */
static int tc_run_ws(struct tcase *c, enum convd_gpu_family fam, int use_ws)
{
    assert_int_equal(convd_gpu_fill_bytes(c->dy, 0xff, c->z.output_bytes), 0);
    struct convd_tensors t = {c->dx, c->dw, c->p.has_bias ? c->db : NULL, c->dy};
    void *ws = use_ws ? c->ws : NULL;
    size_t wsb = use_ws ? c->ws_bytes : 0;
    int rc = run_on(&c->p, &t, 1, ws, wsb, fam);
    if (rc != 0)
        return rc;
    assert_int_equal(convd_gpu_synchronize(), 0);
    assert_int_equal(convd_gpu_download(c->hy, c->dy, c->z.output_bytes), 0);
    return 0;
}

static int tc_run(struct tcase *c, enum convd_gpu_family fam)
{
    return tc_run_ws(c, fam, 1);
}

static int n_checked;

/* Runs p on `fam` and compares with the reference. A family that cannot take the problem is
 * allowed only when `must` is 0; returns 1 when it ran. */
static int check_problem(const struct convd_problem *p, enum convd_gpu_family fam, int must)
{
    char desc[160], why[160] = "";
    convd_problem_str(p, desc, sizeof(desc));
    if (fam != CONVD_GPU_FAMILY_AUTO && convd_gpu_family_check(p, fam, why, sizeof(why)) != 0) {
        if (must)
            fail_msg("%s: family %s refused: %s", desc, convd_gpu_family_name(fam), why);
        return 0;
    }
    struct tcase c;
    tc_init(&c, p);
    tc_reference(&c);
    /* NCHW runs twice where it matters: on NHWC copies (workspace given) and gathered directly. */
    const int variants = p->layout == CONVD_LAYOUT_NCHW &&
                                 (fam == CONVD_GPU_FAMILY_MMA || fam == CONVD_GPU_FAMILY_FMA ||
                                  fam == CONVD_GPU_FAMILY_AUTO)
                             ? 2
                             : 1;
    for (int v = 0; v < variants; v++) {
        int rc = tc_run_ws(&c, fam, v == 0);
        if (rc != 0) {
            tc_free(&c);
            fail_msg("%s: family %s returned %s", desc, convd_gpu_family_name(fam),
                     convd_strerror(rc));
        }
        size_t bad = 0;
        double err = tu_rel_error(p->dtype, c.hy, c.ref, c.z.output_elems, &bad);
        double tol = tu_tolerance_of(p);
        if (!(err <= tol)) {
            float got = tu_load(p->dtype, c.hy, bad), want = c.ref[bad];
            tc_free(&c);
            fail_msg("%s [%s -> %s%s]: rel error %.3g > %.3g (element %zu: got %g, want %g)", desc,
                     convd_gpu_family_name(fam),
                     fam == CONVD_GPU_FAMILY_AUTO ? convd_gpu_dev_rule(p) : "forced",
                     v == 0 ? "" : ", no workspace", err, tol, bad, (double)got, (double)want);
        }
        n_checked++;
    }
    tc_free(&c);
    return 1;
}

static struct convd_problem mk(int n, int h, int w, int c, int k, int r, int s, int g, int stride,
                               int pad, int dil, enum convd_dtype dt, enum convd_layout lay)
{
    struct convd_problem p;
    convd_problem_init(&p, n, h, w, c, k, r, s, g);
    p.stride_h = p.stride_w = stride;
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = pad;
    p.dil_h = p.dil_w = dil;
    p.dtype = dt;
    p.layout = lay;
    return p;
}

static const enum convd_dtype dtypes[] = {CONVD_DTYPE_FP32, CONVD_DTYPE_FP16, CONVD_DTYPE_BF16};
static const enum convd_layout layouts[] = {CONVD_LAYOUT_NHWC, CONVD_LAYOUT_NCHW};

/* Sets p's activation to the i-th of the six that are not none (i < 0: none), so that the
 * variants of a sweep cover all of them. */
/* NHWC, 4 groups of 8 channels, stride 2 in rows only, padding on two sides only: tiles that the
 * image edges cut unevenly. */
static struct convd_problem mk_asym(enum convd_dtype dt)
{
    struct convd_problem p = mk(2, 12, 13, 32, 32, 3, 3, 4, 1, 0, 1, dt, CONVD_LAYOUT_NHWC);
    p.pad_top = 2;
    p.pad_right = 1;
    p.stride_h = 2;
    return p;
}

static void set_act(struct convd_problem *p, int i)
{
    tu_set_activation(p, i < 0 ? CONVD_ACT_NONE : (enum convd_activation)(1 + i % 6));
}

/* Runs one geometry over every dtype and layout, plain and with a bias and an activation (each
 * of the six once over the six dtype-layout pairs), on a family. */
static void sweep(struct convd_problem p, enum convd_gpu_family fam, int must, int half_only)
{
    for (int d = 0; d < 3; d++) {
        if (half_only && dtypes[d] == CONVD_DTYPE_FP32)
            continue;
        for (int l = 0; l < 2; l++) {
            p.dtype = dtypes[d];
            p.layout = layouts[l];
            p.has_bias = false;
            set_act(&p, -1);
            check_problem(&p, fam, must);
            p.has_bias = true;
            set_act(&p, d * 2 + l);
            check_problem(&p, fam, must);
        }
    }
}

/* ---- families ---- */

/* Every depthwise case, on whichever NHWC kernel the router picks (see the two tests below). */
static void depthwise_cases(void)
{
    const enum convd_gpu_family F = CONVD_GPU_FAMILY_DEPTHWISE;
    struct convd_problem p;
    sweep(mk(2, 13, 11, 16, 16, 3, 3, 16, 1, 1, 1, 0, 0), F, 1, 0); /* 3x3 s1, W % 4 != 0 */
    sweep(mk(3, 15, 17, 24, 24, 3, 3, 24, 2, 1, 1, 0, 0), F, 1, 0); /* stride 2 */
    sweep(mk(1, 20, 19, 8, 8, 5, 5, 8, 1, 2, 1, 0, 0), F, 1, 0);    /* 5x5 */
    sweep(mk(2, 16, 18, 32, 32, 7, 7, 32, 1, 3, 1, 0, 0), F, 1, 0); /* 7x7 */
    sweep(mk(2, 12, 12, 16, 32, 3, 3, 16, 1, 1, 1, 0, 0), F, 1, 0); /* multiplier 2 */
    sweep(mk(2, 14, 14, 8, 16, 3, 3, 8, 2, 1, 1, 0, 0), F, 1, 0);   /* multiplier 2, s2 */
    sweep(mk(1, 17, 15, 16, 16, 3, 3, 16, 1, 2, 2, 0, 0), F, 1, 0); /* dilation 2 */
    sweep(mk(4, 9, 9, 8, 8, 1, 1, 8, 1, 0, 1, 0, 0), F, 1, 0);      /* 1x1 */
    sweep(mk(2, 30, 70, 8, 8, 3, 3, 8, 1, 1, 1, 0, 0), F, 1, 0);    /* wide rows */
    p = mk(2, 11, 13, 16, 16, 3, 5, 16, 1, 0, 1, 0, 0);             /* asymmetric */
    p.pad_top = 2;
    p.pad_bottom = 0;
    p.pad_left = 1;
    p.pad_right = 3;
    p.stride_h = 2;
    sweep(p, F, 1, 0);
    p = mk(1, 9, 10, 16, 16, 4, 2, 16, 1, 1, 1, 0, 0); /* non-square, dil 1x2 */
    p.dil_w = 2;
    p.pad_right = 0;
    sweep(p, F, 1, 0);
    /* NCHW only: C not a multiple of the NHWC vector. */
    p = mk(2, 10, 10, 5, 10, 3, 3, 5, 1, 1, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NCHW);
    check_problem(&p, F, 1);
    /* NHWC: several channel blocks per pixel, the last one partial (C = 200, 144). */
    sweep(mk(2, 9, 13, 200, 200, 3, 3, 200, 1, 1, 1, 0, 0), F, 1, 0);
    sweep(mk(1, 12, 11, 144, 144, 3, 3, 144, 2, 1, 1, 0, 0), F, 1, 0); /* stride-2 window */
    sweep(mk(1, 15, 14, 32, 32, 5, 5, 32, 2, 2, 1, 0, 0), F, 1, 0);    /* 5x5, stride 2 */
    sweep(mk(1, 17, 16, 16, 16, 7, 7, 16, 2, 3, 1, 0, 0), F, 1, 0);    /* 7x7, stride 2 */
    sweep(mk(1, 13, 14, 16, 16, 3, 3, 16, 3, 1, 1, 0, 0), F, 1, 0);    /* stride 3: no window */
    /* Weights too large to stay resident (512 x 25 taps): reloaded per channel block. */
    sweep(mk(1, 10, 9, 512, 512, 5, 5, 512, 1, 2, 1, 0, 0), F, 1, 0);
    sweep(mk(3, 20, 22, 48, 48, 3, 3, 48, 1, 1, 1, 0, 0), F, 1, 0);
    sweep(mk(2, 21, 18, 96, 96, 3, 3, 96, 2, 1, 1, 0, 0), F, 1, 0);
    sweep(mk(2, 11, 12, 24, 48, 3, 3, 24, 1, 1, 1, 0, 0), F, 1, 0);
}

/* Default routing: NHWC 3x3 and 5x5 problems and NCHW 3x3, 5x5 and 7x7 ones (with "same" left
 * padding and widths of whole 4-element chunks) with equal strides of 1 or 2 run on the direct
 * kernels (bands of output rows and groups of columns that end inside or past the image, padding
 * wider than the filter's reach, no padding at all, images narrower than a band), the rest on the
 * tiled ones. */
static void test_depthwise(void **state)
{
    (void)state;
    REQUIRE_GPU();
    const enum convd_gpu_family F = CONVD_GPU_FAMILY_DEPTHWISE;
    depthwise_cases();
    sweep(mk(3, 23, 9, 20, 20, 3, 3, 20, 1, 1, 1, 0, 0), F, 1, 0); /* C % 8 = 4 */
    sweep(mk(2, 7, 30, 12, 12, 3, 3, 12, 2, 2, 1, 0, 0), F, 1, 0); /* pad 2, s2 */
    sweep(mk(5, 5, 6, 16, 16, 5, 5, 16, 1, 0, 1, 0, 0), F, 1, 0);  /* no padding, 5x5 */
    sweep(mk(2, 3, 4, 40, 40, 5, 5, 40, 2, 2, 1, 0, 0), F, 1, 0);  /* 2x2 output, 5x5 s2 */
    sweep(mk(1, 29, 31, 240, 240, 5, 5, 240, 1, 2, 1, 0, 0), F, 1, 0);
    sweep(mk(70, 8, 8, 8, 8, 3, 3, 8, 1, 1, 1, 0, 0), F, 1, 0); /* many images */
}

/* The same cases with the direct kernels off: every problem on the tiled kernels. */
static void test_depthwise_tiled(void **state)
{
    (void)state;
    REQUIRE_GPU();
    assert_int_equal(convd_gpu_tune_dw_direct(0), 0);
    depthwise_cases();
    assert_int_equal(convd_gpu_tune_dw_direct(-1), 0);
    assert_int_equal(convd_gpu_tune_dw_direct(1000), CONVD_EINVAL);
    assert_int_equal(convd_gpu_tune_dw_direct(-2), CONVD_EINVAL);
}

/* Whether family's plan for p names `word` in its description (which kernel runs it). */
static int described_as(const struct convd_problem *p, enum convd_gpu_family family,
                        const char *word)
{
    char d[200];
    assert_int_equal(convd_gpu_describe(p, family, d, sizeof(d)), 0);
    return strstr(d, word) != NULL;
}

static int dw_is_direct(const struct convd_problem *p)
{
    return described_as(p, CONVD_GPU_FAMILY_DEPTHWISE, "direct");
}

/* Every shape of work of the direct kernels, on problems whose edges cut their bands and column
 * groups (Ho, Wo not multiples of the rows and columns per thread), with padding on all sides;
 * the NCHW ones on widths that are multiples of 4 (its chunks), with "same" padding on the left
 * and any on the right. A forced shape that the production kernel set leaves out runs tiled
 * (dw_row_built), so only a -DCONVD_GPU_SWEEP_KERNELS=ON build covers them all: there each
 * forced shape must run direct in some dtype; here the count of those that did is printed. */
static void test_depthwise_direct_shapes(void **state)
{
    (void)state;
    REQUIRE_GPU();
    const enum convd_gpu_family F = CONVD_GPU_FAMILY_DEPTHWISE;
    struct convd_problem q = mk(1, 13, 16, 8, 8, 3, 3, 8, 1, 1, 1, 0, CONVD_LAYOUT_NCHW);
    q.pad_top = 0;
    q.pad_bottom = 2;
    q.pad_right = 5; /* Wo = 20: the last column group reads only padding */
    const struct convd_problem nhwc[] = {
        mk(2, 13, 11, 24, 24, 3, 3, 24, 1, 1, 1, 0, 0),
        mk(1, 30, 27, 16, 16, 3, 3, 16, 1, 0, 1, 0, 0),
        mk(2, 15, 17, 40, 40, 3, 3, 40, 2, 1, 1, 0, 0),
        mk(1, 19, 23, 8, 8, 5, 5, 8, 1, 2, 1, 0, 0),
        mk(2, 17, 14, 16, 16, 5, 5, 16, 2, 2, 1, 0, 0),
        mk(2, 13, 12, 24, 24, 3, 3, 24, 1, 1, 1, 0, 0),
        mk(2, 15, 16, 40, 40, 3, 3, 40, 2, 1, 1, 0, 0),
        mk(1, 30, 28, 16, 16, 5, 5, 16, 1, 2, 1, 0, 0),
        mk(2, 17, 16, 16, 16, 5, 5, 16, 2, 2, 1, 0, 0),
        mk(1, 11, 20, 8, 8, 7, 7, 8, 1, 3, 1, 0, 0),
        mk(1, 13, 24, 8, 8, 7, 7, 8, 2, 3, 1, 0, 0),
        mk(2, 13, 11, 24, 48, 3, 3, 24, 1, 1, 1, 0, 0), /* multiplier 2 */
        mk(1, 30, 27, 16, 32, 3, 3, 16, 1, 0, 1, 0, 0),
    };
    int shapes = 0, nchw_shapes = 0, direct_modes = 0;
    for (int mode = 1; convd_gpu_tune_dw_direct(mode) == 0; mode++, shapes++) {
        int direct = 0;
        for (size_t i = 0; i < sizeof(nhwc) / sizeof(nhwc[0]); i++) {
            sweep(nhwc[i], F, 1, 0);
            for (int d = 0; d < 3; d++) {
                struct convd_problem r = nhwc[i];
                r.dtype = dtypes[d];
                r.layout = CONVD_LAYOUT_NHWC;
                direct += dw_is_direct(&r);
            }
        }
        sweep(q, F, 1, 0);
        for (int ks = 3; ks <= 7; ks += 2)
            for (int st = 1; st <= 2; st++) {
                struct convd_problem r = mk(1, 16, 16, 8, 8, ks, ks, 8, st, ks / 2, 1,
                                            CONVD_DTYPE_FP16, CONVD_LAYOUT_NCHW);
                nchw_shapes += dw_is_direct(&r);
            }
        direct_modes += direct > 0;
        if (convd_gpu_sweep_kernels() && direct == 0)
            fail_msg("forced depthwise direct shape %d ran no case on a direct kernel", mode);
    }
    fprintf(stderr, "depthwise direct shapes: %d forced, %d ran direct in some dtype (%s)\n",
            shapes, direct_modes,
            convd_gpu_sweep_kernels() ? "sweep build: all" : "production kernel set");
    assert_true(direct_modes >= 1);
    assert_true(shapes >= 2);
    assert_true(nchw_shapes >= 6); /* every NCHW filter and stride has a shape */
    assert_int_equal(convd_gpu_tune_dw_direct(-1), 0);
    /* Default routing: NCHW on the direct kernel where its conditions hold, else tiled. */
    struct convd_problem r =
        mk(2, 28, 28, 24, 24, 5, 5, 24, 1, 2, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NCHW);
    assert_true(dw_is_direct(&r));
    r.w = 30; /* not whole chunks */
    assert_false(dw_is_direct(&r));
    r.w = 28;
    r.pad_left = 1; /* not "same" on the left */
    assert_false(dw_is_direct(&r));
    /* NHWC: 3x3, 5x5 and 7x7 at stride 1 in every dtype. */
    for (int ks = 3; ks <= 7; ks += 2)
        for (int dt = CONVD_DTYPE_FP32; dt <= CONVD_DTYPE_BF16; dt++) {
            struct convd_problem h = mk(2, 20, 20, 32, 32, ks, ks, 32, 1, ks / 2, 1,
                                        (enum convd_dtype)dt, CONVD_LAYOUT_NHWC);
            assert_true(dw_is_direct(&h));
        }
    /* NHWC 5x5 stride 2 (MobileNetV3's downsampling): the direct kernel in every dtype. */
    for (int dt = CONVD_DTYPE_FP32; dt <= CONVD_DTYPE_BF16; dt++) {
        struct convd_problem h =
            mk(2, 20, 20, 32, 32, 5, 5, 32, 2, 2, 1, (enum convd_dtype)dt, CONVD_LAYOUT_NHWC);
        assert_true(dw_is_direct(&h));
    }
    /* 7x7 on a 7x7 output: 4-row bands rather than the default 6 (which would compute 12). */
    struct convd_problem sm =
        mk(2, 7, 7, 32, 32, 7, 7, 32, 1, 3, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC);
    assert_true(described_as(&sm, F, "rows 4 "));
    sm.h = sm.w = 56;
    assert_true(described_as(&sm, F, "rows 6 "));
    /* NHWC channel multiplier 2, 3x3 stride 1: the direct kernel in every dtype. */
    for (int dt = CONVD_DTYPE_FP32; dt <= CONVD_DTYPE_BF16; dt++) {
        struct convd_problem h =
            mk(2, 20, 20, 32, 64, 3, 3, 32, 1, 1, 1, (enum convd_dtype)dt, CONVD_LAYOUT_NHWC);
        assert_true(dw_is_direct(&h));
    }
}

/* NCHW planes too small for a block (7x7 and 14x14 images, widths not whole 4-element chunks):
 * several whole planes per block, planes of two channels and of two images in one block, the last
 * block partial, kpg 2, stride 2 with input rows the tile leaves out, dilation. */
static void test_depthwise_planes(void **state)
{
    (void)state;
    REQUIRE_GPU();
    const enum convd_gpu_family F = CONVD_GPU_FAMILY_DEPTHWISE;
    const enum convd_layout NCHW = CONVD_LAYOUT_NCHW;
    struct convd_problem cases[] = {
        mk(4, 7, 7, 160, 160, 5, 5, 160, 1, 2, 1, 0, NCHW),    /* MobileNetV3's last stage */
        mk(3, 14, 14, 241, 241, 3, 3, 241, 1, 1, 1, 0, NCHW),  /* partial last block */
        mk(8, 7, 7, 250, 500, 7, 7, 250, 1, 3, 1, 0, NCHW),    /* kpg 2, 7x7 */
        mk(11, 10, 10, 107, 107, 3, 3, 107, 2, 0, 1, 0, NCHW), /* s2: input row 9 unused */
        mk(4, 10, 9, 150, 150, 3, 3, 150, 1, 2, 2, 0, NCHW),   /* dilation 2 */
        mk(6, 6, 5, 100, 100, 3, 5, 100, 2, 1, 1, 0, NCHW),    /* 3x5 filter, stride 2 */
    };
    cases[5].pad_left = 2;
    cases[5].pad_right = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int d = 0; d < 3; d++) {
            cases[i].dtype = dtypes[d];
            cases[i].has_bias = d != 1;
            set_act(&cases[i], d != 1 ? (int)i + d : -1);
            assert_false(dw_is_direct(&cases[i]));
            assert_false(described_as(&cases[i], F, "planes 0 ")); /* several per block */
            check_problem(&cases[i], F, 1);
            check_problem(&cases[i], CONVD_GPU_FAMILY_AUTO, 1);
        }
    }
    /* Few planes: one per block, as before (two blocks per SM would not be filled). */
    struct convd_problem few = mk(1, 7, 7, 64, 64, 3, 3, 64, 1, 1, 1, CONVD_DTYPE_FP16, NCHW);
    assert_true(described_as(&few, F, "planes 0 "));
    check_problem(&few, F, 1);
}

static void test_fma(void **state)
{
    (void)state;
    REQUIRE_GPU();
    const enum convd_gpu_family F = CONVD_GPU_FAMILY_FMA;
    struct convd_problem p;
    sweep(mk(2, 12, 12, 8, 8, 3, 3, 4, 1, 1, 1, 0, 0), F, 1, 0);   /* cpg 2 */
    sweep(mk(2, 14, 13, 16, 16, 3, 3, 4, 1, 1, 1, 0, 0), F, 1, 0); /* cpg 4 */
    sweep(mk(1, 11, 9, 15, 25, 3, 3, 5, 1, 1, 1, 0, 0), F, 1, 0);  /* cpg 3, kpg 5 */
    sweep(mk(2, 10, 10, 48, 48, 3, 3, 2, 2, 1, 1, 0, 0), F, 1, 0); /* cpg 24, stride 2 */
    sweep(mk(1, 9, 9, 64, 64, 3, 3, 1, 1, 1, 2, 0, 0), F, 1, 0);   /* dense, dilation 2 */
    sweep(mk(1, 7, 7, 256, 16, 3, 3, 1, 1, 1, 1, 0, 0), F, 1, 0);  /* chunked channels */
    sweep(mk(2, 6, 6, 24, 264, 1, 1, 3, 1, 0, 1, 0, 0), F, 1, 0);  /* kpg > block: split */
    sweep(mk(1, 40, 45, 12, 12, 3, 3, 3, 1, 1, 1, 0, 0), F, 1, 0); /* many tiles */
    sweep(mk(3, 5, 5, 7, 14, 2, 4, 7, 1, 1, 1, 0, 0), F, 1, 0);    /* depthwise x2, 2x4 */
    sweep(mk(1, 12, 12, 4, 12, 1, 9, 1, 1, 0, 1, 0, 0), F, 1, 0);  /* S > 7: no window */
    /* Every exact window width, with channel counts that leave a remainder after the loop's
     * two-channel steps (cpg 3, 5). */
    sweep(mk(2, 8, 9, 15, 40, 1, 1, 5, 1, 0, 1, 0, 0), F, 1, 0);   /* 1x1, cpg 3, kpg 8 */
    sweep(mk(1, 10, 11, 25, 20, 3, 3, 5, 1, 1, 1, 0, 0), F, 1, 0); /* 3x3, cpg 5, kpg 4 */
    sweep(mk(1, 11, 10, 12, 24, 5, 5, 4, 1, 2, 1, 0, 0), F, 1, 0); /* 5x5, cpg 3, kpg 6 */
    sweep(mk(2, 9, 12, 20, 40, 7, 7, 4, 1, 3, 1, 0, 0), F, 1, 0);  /* 7x7, cpg 5, kpg 10 */
    sweep(mk(1, 9, 10, 8, 8, 4, 4, 2, 1, 1, 1, 0, 0), F, 1, 0);    /* S = 4: generic loop */
    p = mk(2, 13, 12, 6, 9, 3, 2, 3, 1, 0, 1, 0, 0);               /* asymmetric */
    p.pad_top = 0;
    p.pad_bottom = 2;
    p.pad_left = 3;
    p.pad_right = 1;
    p.stride_w = 2;
    sweep(p, F, 1, 0);
    for (int i = 0; i < 24; i++) {
        tu_random_problem(&rng, &p, 0, 0, 9);
        check_problem(&p, F, 1);
    }
    /* 3 outputs per thread where 3 divides kpg and 2 does not (NHWC input; the cases above with
     * kpg 3 and 5 x 3 ran on it), and the same problems with it switched off; kpg 6 keeps 2. */
    struct convd_problem t3 =
        mk(1, 11, 9, 18, 54, 3, 3, 6, 1, 1, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC);
    struct convd_problem t6 =
        mk(1, 11, 10, 12, 24, 5, 5, 4, 1, 2, 1, CONVD_DTYPE_BF16, CONVD_LAYOUT_NHWC);
    assert_true(described_as(&t3, F, "tn 3 "));
    assert_true(described_as(&t6, F, "tn 2 "));
    sweep(t3, F, 1, 0);
    assert_int_equal(convd_gpu_tune_fma_outputs3(0), 0);
    assert_true(described_as(&t3, F, "tn 1 "));
    sweep(t3, F, 1, 0);
    assert_int_equal(convd_gpu_tune_fma_outputs3(1), 0);
    assert_int_equal(convd_gpu_tune_fma_outputs3(2), CONVD_EINVAL);
}

/* Whether the fma family runs p (as NHWC) on its implicit-GEMM kernel. */
static int fma_is_gemm(struct convd_problem p)
{
    p.layout = CONVD_LAYOUT_NHWC;
    return described_as(&p, CONVD_GPU_FAMILY_FMA, "gemm");
}

/* The fma family's implicit-GEMM kernel: pointwise problems (1x1, unit stride, no padding) with
 * tails in pixels (H*W = 63, not a multiple of 4 or of any tile), outputs (kpg 15, 45) and K
 * steps (cpg 300), dense and grouped, in both layouts; and general filters in NHWC with
 * cpg % 4 == 0 and kpg >= 24 (stride 2, dilation, asymmetric padding, non-square filters, K not
 * a multiple of the step), forced onto it (mode 2: these small grids would not fill the GPU);
 * in NCHW those run on transposed copies with the GEMM writing NCHW (planes of 143 and 49
 * pixels: runs that cross images; 64: whole runs). Then the same problems on the direct FMA
 * kernel, which must still serve them. */
static void test_fma_gemm(void **state)
{
    (void)state;
    REQUIRE_GPU();
    const enum convd_gpu_family F = CONVD_GPU_FAMILY_FMA;
    struct convd_problem ps[] = {
        mk(2, 7, 9, 30, 45, 1, 1, 3, 1, 0, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NCHW),
        mk(3, 8, 8, 64, 64, 1, 1, 1, 1, 0, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NCHW),
        mk(1, 5, 6, 600, 90, 1, 1, 2, 1, 0, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NCHW),
        mk(2, 14, 14, 240, 240, 1, 1, 3, 1, 0, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NCHW),
        mk(1, 3, 3, 6, 2, 1, 1, 2, 1, 0, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NCHW),
        mk(2, 11, 13, 48, 48, 3, 3, 2, 1, 1, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NCHW),
        mk(2, 7, 7, 64, 128, 3, 3, 2, 1, 1, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NCHW),
        mk(1, 12, 9, 32, 64, 3, 5, 1, 2, 0, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NCHW),
        mk(1, 10, 10, 20, 120, 1, 1, 5, 2, 1, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NCHW),
        mk(2, 8, 8, 32, 48, 3, 3, 1, 1, 1, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NCHW),
    };
    const size_t np = sizeof(ps) / sizeof(ps[0]);
    ps[7].pad_top = 1;
    ps[7].pad_bottom = 2;
    ps[7].pad_left = 2;
    ps[7].pad_right = 0;
    ps[7].dil_h = 2;
    assert_int_equal(convd_gpu_tune_fma_gemm(2), 0);
    for (size_t i = 0; i < np; i++) {
        if (!fma_is_gemm(ps[i]))
            fail_msg("case %zu not on the gemm kernel", i);
        /* NCHW too: natively (1x1) or on NHWC copies with the GEMM's NCHW epilogue. */
        if (!described_as(&ps[i], F, "gemm"))
            fail_msg("case %zu in NCHW not on the gemm kernel", i);
        sweep(ps[i], F, 1, 0);
    }
    struct convd_problem q = ps[0];
    q.stride_h = 2; /* cpg 10: only 1x1 unit-stride problems take the gemm */
    assert_false(fma_is_gemm(q));
    q = ps[5];
    q.k = 40; /* kpg 20 < 24 */
    assert_false(fma_is_gemm(q));
    assert_int_equal(convd_gpu_tune_fma_gemm(1), 0);
    assert_false(fma_is_gemm(ps[5])); /* 2 x 11 x 13 pixels: too few blocks for the default */
    assert_true(fma_is_gemm(ps[1]));  /* pointwise: always */
    assert_int_equal(convd_gpu_tune_fma_gemm(0), 0);
    for (size_t i = 0; i < np; i++) {
        assert_false(fma_is_gemm(ps[i]));
        sweep(ps[i], F, 1, 0);
    }
    assert_int_equal(convd_gpu_tune_fma_gemm(1), 0);
    assert_int_equal(convd_gpu_tune_fma_gemm(3), CONVD_EINVAL);
}

/* Runs p (fp32, allow_tf32) on fam with the workspace: its result must meet the TF32 tolerance
 * and, where the tensor cores ran it (tensor_cores), differ from the exact reference by more than
 * fp32 arithmetic would (2e-5): proof that TF32, not exact fp32, computed it. */
static void check_tf32_run(const struct convd_problem *p, enum convd_gpu_family fam,
                           int tensor_cores, const char *what)
{
    char desc[160];
    convd_problem_str(p, desc, sizeof(desc));
    struct tcase c;
    tc_init(&c, p);
    tc_reference(&c);
    const int rc = tc_run(&c, fam);
    if (rc != 0) {
        tc_free(&c);
        fail_msg("%s [%s]: %s", desc, what, convd_strerror(rc));
    }
    size_t bad = 0;
    const double err = tu_rel_error(CONVD_DTYPE_FP32, c.hy, c.ref, c.z.output_elems, &bad);
    const double got = ((const float *)c.hy)[bad], want = c.ref[bad];
    tc_free(&c);
    if (!(err <= tu_tolerance_of(p)))
        fail_msg("%s [%s]: rel error %.3g > %.3g (element %zu: got %g, want %g)", desc, what, err,
                 tu_tolerance_of(p), bad, got, want);
    if (tensor_cores && !(err > 2e-5))
        fail_msg("%s [%s]: rel error %.3g: exact fp32, not TF32", desc, what, err);
    n_checked++;
}

/* TF32 (fp32 problems with allow_tf32): routed to the tensor cores (the mma family's TF32 rules
 * or the implicit GEMM's tiles) where kpg
 * >= 24, in both layouts (NCHW on NHWC copies, or in place for 1x1), every loader (4-channel
 * gathers, pointwise channel by channel, NCHW pixel runs), with tails in pixels, outputs (kpg 40:
 * a half-empty second warp tile) and K (36 = 9 taps x cpg 4: a short last step), stride,
 * dilation and asymmetric padding, bias and activations (check_tf32_run). Without allow_tf32 the
 * same problems stay off TF32; the policy's tf32 knob switches it off (0), also for the fma
 * family asked for by name, or forces it below kpg 24 (1). */
static void test_tf32(void **state)
{
    (void)state;
    REQUIRE_GPU();
    const enum convd_layout H = CONVD_LAYOUT_NHWC, C = CONVD_LAYOUT_NCHW;
    const enum convd_dtype F32 = CONVD_DTYPE_FP32;
    struct convd_problem ps[] = {
        mk(2, 13, 11, 64, 64, 3, 3, 1, 1, 1, 1, F32, H),  /* dense 3x3 */
        mk(2, 13, 11, 64, 64, 3, 3, 1, 1, 1, 1, F32, C),  /* the same on NHWC copies */
        mk(2, 9, 9, 128, 128, 3, 3, 4, 2, 1, 1, F32, H),  /* grouped, kpg 32, stride 2 */
        mk(1, 12, 9, 32, 64, 3, 5, 1, 2, 0, 1, F32, C),   /* 3x5, asymmetric pad, dilation */
        mk(2, 7, 9, 30, 96, 1, 1, 1, 1, 0, 1, F32, C),    /* pointwise cpg 30: pixel by pixel */
        mk(2, 7, 9, 30, 96, 1, 1, 1, 1, 0, 1, F32, H),    /* the same, channel by channel */
        mk(2, 8, 8, 64, 64, 1, 1, 1, 1, 0, 1, F32, C),    /* pointwise, 4-pixel runs */
        mk(1, 10, 10, 32, 320, 3, 3, 8, 1, 1, 1, F32, H), /* cpg 4: K 36, a short last step */
        mk(2, 11, 13, 48, 80, 3, 3, 2, 1, 1, 1, F32, H),  /* kpg 40: a half-empty warp tile */
    };
    ps[3].pad_top = 1;
    ps[3].pad_bottom = 2;
    ps[3].pad_left = 2;
    ps[3].pad_right = 0;
    ps[3].dil_h = 2;
    const size_t np = sizeof(ps) / sizeof(ps[0]);
    /* TF32 needs the tensor cores that the mma family needs (NVIDIA, sm_80 code). */
    struct convd_problem probe = mk(1, 8, 8, 32, 32, 3, 3, 4, 1, 1, 1, CONVD_DTYPE_FP16, H);
    char why[160];
    const int tensor_cores =
        convd_gpu_family_check(&probe, CONVD_GPU_FAMILY_MMA, why, sizeof(why)) == 0;
    /* Routed with the mma family's TF32 rules as measured (the default), off, and everywhere
     * the family takes the problem. */
    for (int m = -1; m <= 1; m++) {
        assert_int_equal(convd_gpu_tune_mma_tf32(m), 0);
        for (size_t i = 0; i < np; i++)
            for (int v = 0; v < 3; v++) {
                struct convd_problem p = ps[i];
                p.allow_tf32 = true;
                p.has_bias = v > 0;
                set_act(&p, v == 0 ? -1 : (int)(i + (size_t)v) % 6);
                char desc[160];
                convd_problem_str(&p, desc, sizeof(desc));
                const char *rule = convd_gpu_dev_rule(&p);
                if (tensor_cores && strstr(rule, "tf32") == NULL)
                    fail_msg("%s allows TF32 and went to %s", desc, rule);
                if (!tensor_cores && strstr(rule, "tf32") != NULL)
                    fail_msg("%s went to %s on a GPU without TF32", desc, rule);
                check_tf32_run(&p, CONVD_GPU_FAMILY_AUTO, tensor_cores, rule);
                p.allow_tf32 = false;
                if (strstr(convd_gpu_dev_rule(&p), "tf32") != NULL)
                    fail_msg("%s without allow_tf32 went to %s", desc, convd_gpu_dev_rule(&p));
            }
    }
    /* The fma family's tiles (the mma family's rules off): forced onto a 1x1 of kpg 8, below
     * their default's 24. */
    assert_int_equal(convd_gpu_tune_mma_tf32(0), 0);
    struct convd_problem p = mk(2, 9, 9, 64, 64, 1, 1, 8, 1, 0, 1, F32, H);
    p.allow_tf32 = true;
    assert_string_not_equal(convd_gpu_dev_rule(&p), "fma-tf32");
    assert_int_equal(convd_gpu_tune_tf32(1), 0);
    if (tensor_cores) {
        assert_string_equal(convd_gpu_dev_rule(&p), "fma-tf32");
        check_problem(&p, CONVD_GPU_FAMILY_AUTO, 1);
    }
    assert_int_equal(convd_gpu_tune_mma_tf32(-1), 0);
    p = ps[0];
    p.allow_tf32 = true;
    assert_int_equal(convd_gpu_tune_tf32(-1), 0);
    /* mma_tf32 -1 (the default): the mma family's in NHWC, and in NCHW where the problem would
     * go to NHWC copies anyway (W 11: not the direct kernel's; kpg 64 at W 12: the fma family's
     * TF32 tiles come before the direct kernel), not where the direct kernel (kpg 16 at W 12) or
     * the implicit GEMM (pointwise) takes it in place; 0: the fma family's; 1: the mma family's
     * in NCHW too. */
    struct convd_problem q = ps[1], q12 = ps[1], qd = ps[1], qp = ps[6];
    q.allow_tf32 = q12.allow_tf32 = qd.allow_tf32 = qp.allow_tf32 = true;
    q12.w = qd.w = 12;
    qd.groups = 4;
    if (tensor_cores) {
        assert_string_equal(convd_gpu_dev_rule(&p), "mma-tf32");
        assert_string_equal(convd_gpu_dev_rule(&q), "mma-tf32-nchw");
        assert_string_equal(convd_gpu_dev_rule(&q12), "mma-tf32-nchw");
        assert_string_equal(convd_gpu_dev_rule(&qd), "direct");
        assert_string_equal(convd_gpu_dev_rule(&qp), "fma-tf32");
    }
    assert_int_equal(convd_gpu_tune_mma_tf32(0), 0);
    if (tensor_cores) {
        assert_string_equal(convd_gpu_dev_rule(&p), "fma-tf32");
        assert_string_equal(convd_gpu_dev_rule(&q), "fma-tf32-nchw");
    }
    assert_int_equal(convd_gpu_tune_mma_tf32(1), 0);
    if (tensor_cores) {
        assert_string_equal(convd_gpu_dev_rule(&q), "mma-tf32-nchw");
        assert_string_equal(convd_gpu_dev_rule(&qd), "mma-tf32-nchw");
    }
    assert_int_equal(convd_gpu_tune_mma_tf32(-1), 0);
    /* tf32 0: no TF32 anywhere, the mma family asked for by name included. */
    assert_int_equal(convd_gpu_tune_tf32(0), 0);
    assert_null(strstr(convd_gpu_dev_rule(&p), "tf32"));
    check_problem(&p, CONVD_GPU_FAMILY_AUTO, 1);
    assert_false(described_as(&p, CONVD_GPU_FAMILY_FMA, "tf32"));
    assert_int_not_equal(convd_gpu_family_check(&p, CONVD_GPU_FAMILY_MMA, NULL, 0), 0);
    assert_int_equal(convd_gpu_tune_tf32(2), CONVD_EINVAL);
    assert_int_equal(convd_gpu_tune_mma_tf32(2), CONVD_EINVAL);
}

/* The mma family's TF32 kernels (fp32 as pairs of 16-bit units), asked for by name: every warp
 * layout on problems of its output widths, then, with and without sm_90 tensor copies and in
 * both layouts (NCHW on NHWC copies, its epilogue writing NCHW), problems that reach each loader
 * and epilogue path: channels in chunks (cpg 128: K 2304 units), groups merged 2 and 4 at a time
 * (cpg 4, 2 and 1, including both block-diagonal fast loaders), kpg split over n-blocks (128),
 * a partial last n-block, images per tile, the flattened 1x1, stride, dilation and asymmetric
 * padding, bias and activations. Every result meets the TF32 tolerance and is not exact fp32
 * (check_tf32_run). Without allow_tf32 the family refuses fp32 and says why. */
static void require_mma(void);

static void test_mma_tf32(void **state)
{
    (void)state;
    REQUIRE_GPU();
    require_mma();
    const enum convd_gpu_family F = CONVD_GPU_FAMILY_MMA;
    const enum convd_dtype F32 = CONVD_DTYPE_FP32;
    const enum convd_layout H = CONVD_LAYOUT_NHWC, C = CONVD_LAYOUT_NCHW;
    const struct convd_problem asym = mk_asym(F32);
    const struct convd_problem probs[] = {
        mk(2, 13, 11, 64, 64, 3, 3, 1, 1, 1, 1, F32, H),  /* dense, one chunk */
        mk(1, 17, 15, 64, 64, 3, 3, 8, 1, 1, 1, F32, H),  /* cpg 8, kpg 8 */
        mk(2, 9, 9, 128, 128, 3, 3, 1, 1, 1, 1, F32, H),  /* cpg 128: chunks */
        mk(1, 17, 15, 32, 32, 3, 3, 8, 1, 1, 1, F32, H),  /* cpg 4: 2 merged */
        mk(2, 12, 12, 16, 16, 3, 3, 8, 1, 1, 1, F32, H),  /* cpg 2, kpg 2: 4 merged */
        mk(2, 11, 9, 16, 32, 3, 3, 8, 1, 1, 1, F32, H),   /* cpg 2, kpg 4: merged_w 4 */
        mk(1, 10, 10, 8, 64, 3, 3, 8, 1, 1, 1, F32, H),   /* cpg 1, kpg 8: merged_w 2 */
        mk(1, 9, 9, 64, 128, 3, 3, 1, 1, 1, 1, F32, H),   /* kpg 128: split */
        mk(1, 10, 11, 96, 96, 3, 3, 12, 1, 1, 1, F32, H), /* last n-block partial */
        mk(3, 7, 7, 64, 64, 3, 3, 2, 1, 1, 1, F32, H),    /* images per tile */
        mk(2, 9, 11, 96, 96, 1, 1, 2, 1, 0, 1, F32, H),   /* 1x1, flattened in NHWC */
        mk(2, 15, 15, 64, 64, 3, 3, 8, 2, 1, 1, F32, H),  /* stride 2 */
        mk(1, 13, 13, 32, 32, 3, 3, 4, 1, 2, 2, F32, H),  /* dilation 2 */
        asym,
    };
    const size_t np = sizeof(probs) / sizeof(probs[0]);
    /* Every warp layout on the problems of its output widths (kpg 8, 16, 24, 40, 64; each
     * layout takes at least one). */
    const struct convd_problem widths[] = {
        probs[0],
        probs[1],
        mk(1, 9, 10, 64, 64, 3, 3, 4, 1, 1, 1, F32, H), /* kpg 16 */
        mk(1, 10, 9, 32, 96, 3, 3, 4, 1, 1, 1, F32, H), /* kpg 24 */
        mk(2, 9, 11, 80, 80, 1, 1, 2, 1, 0, 1, F32, H), /* kpg 40 */
    };
    for (int cfg = 0; convd_gpu_tune_mma_cfg(cfg) == 0; cfg++) {
        int ran = 0;
        for (size_t i = 0; i < sizeof(widths) / sizeof(widths[0]); i++) {
            struct convd_problem p = widths[i];
            p.allow_tf32 = true;
            if (convd_gpu_family_check(&p, F, NULL, 0) != 0)
                continue;
            char what[32];
            snprintf(what, sizeof(what), "mma cfg %d", cfg);
            check_tf32_run(&p, F, 1, what);
            ran++;
        }
        if (ran == 0)
            fail_msg("mma configuration %d ran no TF32 problem", cfg);
    }
    assert_int_equal(convd_gpu_tune_mma_cfg(-1), 0);
    for (int tma = 1; tma >= 0; tma--) {
        assert_int_equal(convd_gpu_tune_mma_tma(tma ? -1 : 0), 0);
        for (size_t i = 0; i < np; i++)
            for (int l = 0; l < 2; l++) {
                struct convd_problem p = probs[i];
                p.layout = l ? C : H;
                p.allow_tf32 = true;
                p.has_bias = (i + (size_t)l) % 2 == 1;
                set_act(&p, (int)(i + (size_t)l) % 4 == 0 ? -1 : (int)i);
                char why[160] = "", desc[160];
                /* The check plans without workspace, which NCHW TF32 needs for its copies:
                 * NCHW is checked by running it, with the workspace. */
                if (l == 0 && convd_gpu_family_check(&p, F, why, sizeof(why)) != 0) {
                    convd_problem_str(&p, desc, sizeof(desc));
                    fail_msg("%s: mma refused TF32: %s", desc, why);
                }
                check_tf32_run(&p, F, 1, tma ? "mma tf32" : "mma tf32, no tensor copies");
            }
    }
    assert_int_equal(convd_gpu_tune_mma_tma(-1), 0);
    /* Exact fp32 is not the family's. */
    struct convd_problem p = probs[0];
    char why[160] = "";
    assert_int_not_equal(convd_gpu_family_check(&p, F, why, sizeof(why)), 0);
    assert_non_null(strstr(why, "TF32"));
}

/* Runs p in NCHW over every dtype, plain and with a bias and an activation. */
static void sweep_nchw(struct convd_problem p, enum convd_gpu_family fam)
{
    p.layout = CONVD_LAYOUT_NCHW;
    for (int d = 0; d < 3; d++) {
        p.dtype = dtypes[d];
        p.has_bias = false;
        set_act(&p, -1);
        check_problem(&p, fam, 1);
        p.has_bias = true;
        set_act(&p, d * 2 + (int)(p.k % 2));
        check_problem(&p, fam, 1);
    }
}

/* The direct family (grouped NCHW, 3x3): every rows-per-thread shape (modes 1, 2, 4) on
 * problems whose bands and column groups the edges cut, outputs per thread of 4, 2 and 1 (kpg
 * 4, 6 and 5; 8 in two tiles), stride 2, asymmetric padding with the right side past the
 * image, one input channel with several outputs, and a dense layer; then the router's choice. */
static void test_direct(void **state)
{
    (void)state;
    REQUIRE_GPU();
    const enum convd_gpu_family F = CONVD_GPU_FAMILY_DIRECT;
    const enum convd_dtype H = CONVD_DTYPE_FP16; /* sweep_nchw runs every dtype */
    const enum convd_layout L = CONVD_LAYOUT_NCHW;
    struct convd_problem ps[] = {
        mk(2, 13, 16, 16, 16, 3, 3, 4, 1, 1, 1, H, L), /* cpg 4, kpg 4 */
        mk(1, 9, 12, 9, 15, 3, 3, 3, 1, 1, 1, H, L),   /* cpg 3, kpg 5 */
        mk(2, 15, 24, 8, 8, 3, 3, 4, 2, 1, 1, H, L),   /* cpg 2, stride 2 */
        mk(1, 10, 16, 10, 12, 3, 3, 2, 1, 1, 1, H, L), /* cpg 5, kpg 6 */
        mk(1, 8, 8, 24, 8, 3, 3, 1, 1, 1, 1, H, L),    /* dense */
        mk(2, 11, 16, 16, 32, 3, 3, 2, 2, 1, 1, H, L), /* kpg 16, stride 2 */
        mk(1, 12, 20, 6, 24, 3, 3, 6, 1, 1, 1, H, L),  /* cpg 1, kpg 4 */
        mk(3, 7, 8, 16, 64, 3, 3, 2, 1, 1, 1, H, L),   /* kpg 32 */
    };
    const size_t np = sizeof(ps) / sizeof(ps[0]);
    ps[3].pad_top = 0;
    ps[3].pad_bottom = 2;
    ps[3].pad_right = 5; /* Wo = 20: the last column group reads only padding */
    ps[5].pad_bottom = 0;
    static const int modes[] = {1, 2, 4};
    /* Each number of rows with the planner's prefetch; with every variant built (sweep build),
     * also without and with prefetch forced, and 8 outputs per thread in every dtype. */
    const int nm = convd_gpu_sweep_kernels() ? 7 : 3;
    for (int m = 0; m < nm; m++) {
        /* m 6: 8 outputs per thread where kpg allows (one row, no prefetch) */
        assert_int_equal(convd_gpu_tune_direct_outputs8(m == 6), 0);
        assert_int_equal(convd_gpu_tune_direct(modes[m % 3]), 0);
        assert_int_equal(convd_gpu_tune_direct_prefetch(nm == 7 ? m / 3 % 2 : -1), 0);
        for (size_t i = 0; i < np; i++) {
            if (!described_as(&ps[i], CONVD_GPU_FAMILY_AUTO, "direct"))
                fail_msg("case %zu not routed to the direct family in mode %d", i, modes[m % 3]);
            sweep_nchw(ps[i], F);
        }
    }
    assert_int_equal(convd_gpu_tune_direct(-1), 0);
    assert_int_equal(convd_gpu_tune_direct_prefetch(-1), 0);
    assert_int_equal(convd_gpu_tune_direct_outputs8(-1), 0);
    for (int i = 0; i < 12; i++) {
        struct convd_problem p;
        tu_random_problem(&rng, &p, 0, 0, 9);
        p.layout = CONVD_LAYOUT_NCHW;
        p.r = p.s = 3;
        p.stride_w = p.stride_h;
        p.dil_h = p.dil_w = 1;
        p.pad_left = 1;
        p.w = (p.w + 3) / 4 * 4 + 4;
        if (p.stride_h > 2)
            p.stride_h = p.stride_w = 2;
        /* Wo a multiple of 4: widen the right padding. */
        while (((p.w + p.pad_left + p.pad_right - 3) / p.stride_w + 1) % 4 != 0)
            p.pad_right++;
        char why[160];
        if (convd_problem_check(&p, why, sizeof(why)) != 0)
            continue;
        check_problem(&p, F, 1);
    }
    /* Routing: small cpg in NCHW goes here; cpg past the bound only when asked for by name. */
    struct convd_problem q = mk(1, 56, 56, 128, 128, 3, 3, 32, 1, 1, 1, H, L);
    assert_true(described_as(&q, CONVD_GPU_FAMILY_AUTO, "direct"));
    q.groups = 16; /* cpg 8: the tensor cores' at stride 1 (where they exist), here at stride 2 */
    struct convd_problem qh = q;
    qh.layout = CONVD_LAYOUT_NHWC;
    const int have_mma = convd_gpu_family_check(&qh, CONVD_GPU_FAMILY_MMA, NULL, 0) == 0;
    assert_true(described_as(&q, CONVD_GPU_FAMILY_AUTO, "direct") == !have_mma);
    q.stride_h = q.stride_w = 2;
    assert_true(described_as(&q, CONVD_GPU_FAMILY_AUTO, "direct"));
    q.stride_h = q.stride_w = 1;
    /* 16-bit cpg 5 (kpg 5): no tensor-core kernel takes it, so here rather than the fma family
     * on transposed copies; at cpg 6 the tensor cores take it by merging 4 groups. In NHWC the
     * same, through NCHW copies of input, weights and output; in fp32 NHWC where the fma
     * family's direct kernel measured slower: kpg not a multiple of 4 (but not an odd multiple
     * of 3), or stride 2. */
    struct convd_problem q5 = mk(2, 28, 28, 160, 160, 3, 3, 32, 1, 1, 1, H, L);
    assert_true(described_as(&q5, CONVD_GPU_FAMILY_AUTO, "direct"));
    check_problem(&q5, CONVD_GPU_FAMILY_AUTO, 1);
    q5.layout = CONVD_LAYOUT_NHWC;
    assert_true(described_as(&q5, CONVD_GPU_FAMILY_AUTO, "direct"));
    assert_true(described_as(&q5, CONVD_GPU_FAMILY_AUTO, "(NHWC via NCHW copies)"));
    check_problem(&q5, CONVD_GPU_FAMILY_AUTO, 1);
    size_t wsb = 0;
    assert_int_equal(convd_gpu_dev_workspace(&q5, 2, &wsb), 0);
    assert_true(wsb >= 2 * (size_t)2 * 28 * 28 * 160 * 2 * 2); /* input and output, twice */
    q5.dtype = CONVD_DTYPE_FP32;
    assert_true(described_as(&q5, CONVD_GPU_FAMILY_AUTO, "(NHWC via NCHW copies)"));
    struct convd_problem q4 =
        mk(2, 56, 56, 128, 128, 3, 3, 32, 1, 1, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NHWC);
    assert_false(described_as(&q4, CONVD_GPU_FAMILY_AUTO, "direct")); /* kpg 4, stride 1 */
    struct convd_problem q3 = q4;
    q3.c = q3.k = 96; /* kpg 3: the fma kernel's 3 outputs per thread */
    assert_false(described_as(&q3, CONVD_GPU_FAMILY_AUTO, "direct"));
    q4.stride_h = q4.stride_w = 2;
    assert_true(described_as(&q4, CONVD_GPU_FAMILY_AUTO, "(NHWC via NCHW copies)"));
    check_problem(&q4, CONVD_GPU_FAMILY_AUTO, 1);
    q4.stride_h = q4.stride_w = 1;
    assert_int_equal(convd_gpu_tune_direct_nhwc(1), 0);
    assert_true(described_as(&q4, CONVD_GPU_FAMILY_AUTO, "direct"));
    check_problem(&q4, CONVD_GPU_FAMILY_AUTO, 1);
    q5.dtype = H;
    assert_int_equal(convd_gpu_tune_direct_nhwc(0), 0);
    assert_false(described_as(&q5, CONVD_GPU_FAMILY_AUTO, "direct"));
    assert_int_equal(convd_gpu_tune_direct_nhwc(-1), 0);
    assert_int_equal(convd_gpu_tune_direct_nhwc(2), CONVD_EINVAL);
    q5.layout = L;
    q5.c = q5.k = 192;
    assert_true(described_as(&q5, CONVD_GPU_FAMILY_AUTO, "direct") == !have_mma);
    /* Every case above in NHWC, forced onto the direct family (NCHW copies), every dtype. */
    for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++) {
        struct convd_problem h = ps[i];
        h.layout = CONVD_LAYOUT_NHWC;
        for (int d = 0; d < 3; d++) {
            h.dtype = dtypes[d];
            h.has_bias = d != 1;
            set_act(&h, d != 1 ? (int)i + d : -1);
            check_problem(&h, F, 1);
        }
    }
    q.dtype = CONVD_DTYPE_FP32;
    q.groups = 2; /* fp32: up to cpg 64, 8 outputs per thread */
    assert_true(described_as(&q, CONVD_GPU_FAMILY_AUTO, "direct outputs 8"));
    q.groups = 1; /* cpg 128 */
    assert_false(described_as(&q, CONVD_GPU_FAMILY_AUTO, "direct"));
    assert_int_equal(convd_gpu_family_check(&q, F, NULL, 0), 0);
    q.dtype = CONVD_DTYPE_FP16;
    q.groups = 32;
    q.w = 54; /* not whole chunks */
    assert_int_not_equal(convd_gpu_family_check(&q, F, NULL, 0), 0);
    q.w = 56;
    q.pad_left = 0; /* the window starts 3 elements into its first chunk */
    q.pad_right = 2;
    assert_int_not_equal(convd_gpu_family_check(&q, F, NULL, 0), 0);
    q.pad_left = q.pad_right = 1;
    q.layout = CONVD_LAYOUT_NHWC; /* on NCHW copies */
    assert_int_equal(convd_gpu_family_check(&q, F, NULL, 0), 0);
    q.layout = CONVD_LAYOUT_NCHW;
    q.dil_w = 2;
    q.pad_right = 3;
    assert_int_not_equal(convd_gpu_family_check(&q, F, NULL, 0), 0);
    assert_int_equal(convd_gpu_tune_direct(0), 0);
    q = ps[0];
    assert_false(described_as(&q, CONVD_GPU_FAMILY_AUTO, "direct"));
    check_problem(&q, CONVD_GPU_FAMILY_AUTO, 1);
    assert_int_equal(convd_gpu_tune_direct(-1), 0);
    assert_int_equal(convd_gpu_tune_direct(3), CONVD_EINVAL);
    assert_int_equal(convd_gpu_tune_direct(-2), CONVD_EINVAL);
    assert_int_equal(convd_gpu_tune_direct_prefetch(2), CONVD_EINVAL);
    assert_int_equal(convd_gpu_tune_direct_outputs8(2), CONVD_EINVAL);
}

/* After a test that forces kernel shapes: back to the router's choices, also when it failed
 * midway (cmocka leaves the test at the failing assertion). */
static int untune(void **state)
{
    (void)state;
    convd_gpu_dev_policy = convd_gpu_policy_default;
    return 0;
}

/* The policy's checks, the development setters, and the routing table as data: no GPU needed. */
static void test_policy(void **state)
{
    (void)state;
    char why[160];
    assert_int_equal(convd_gpu_policy_check(&convd_gpu_policy_default, why, sizeof(why)), 0);
    assert_int_equal(convd_gpu_policy_check(NULL, why, sizeof(why)), CONVD_EINVAL);
    struct convd_gpu_policy pol = convd_gpu_policy_default;
    pol.direct = 3; /* rows per thread 1, 2 or 4 */
    assert_int_equal(convd_gpu_policy_check(&pol, why, sizeof(why)), CONVD_EINVAL);
    assert_non_null(strstr(why, "direct = 3"));
    pol = convd_gpu_policy_default;
    pol.mma_stages = 0;
    assert_int_equal(convd_gpu_policy_check(&pol, why, sizeof(why)), CONVD_EINVAL);
    assert_non_null(strstr(why, "mma_stages"));
    /* A refused value leaves the development policy as it was. */
    assert_int_equal(convd_gpu_tune_fma_gemm(2), 0);
    assert_int_equal(convd_gpu_dev_policy.fma_gemm, 2);
    assert_int_equal(convd_gpu_tune_fma_gemm(3), CONVD_EINVAL);
    assert_int_equal(convd_gpu_dev_policy.fma_gemm, 2);
    assert_int_equal(convd_gpu_tune_pdl(4), CONVD_EINVAL);
    assert_int_equal(convd_gpu_tune_mma_cfg(-2), CONVD_EINVAL);
    convd_gpu_dev_policy = convd_gpu_policy_default;

    /* Rule names are unique; unaligned tensors are caught first and generic takes the rest. */
    int n = 0;
    enum convd_gpu_family fam;
    const char *view, *doc, *name;
    for (; (name = convd_gpu_rule_info(n, &fam, &view, &doc)) != NULL; n++) {
        assert_true(fam != CONVD_GPU_FAMILY_AUTO);
        assert_true(strlen(doc) > 10);
        assert_true(strncmp(name, convd_gpu_family_name(fam), strlen(convd_gpu_family_name(fam))) ==
                    0);
        for (int j = 0; j < n; j++)
            assert_string_not_equal(name, convd_gpu_rule_info(j, NULL, NULL, NULL));
    }
    assert_true(n >= 5);
    assert_string_equal(convd_gpu_rule_info(0, &fam, NULL, NULL), "generic-unaligned");
    assert_string_equal(convd_gpu_rule_info(n - 1, &fam, &view, NULL), "generic");
    assert_int_equal(fam, CONVD_GPU_FAMILY_GENERIC);
    assert_null(convd_gpu_rule_info(-1, NULL, NULL, NULL));
}

/* docs/architecture.md and docs/benchmarks.md carry the routing table as convd_gpu_rule_table()
 * prints it, between the two marker lines below. */
static void test_routing_documented(void **state)
{
    (void)state;
    const size_t need = convd_gpu_rule_table(NULL, 0);
    char *want = malloc(need + 1);
    assert_non_null(want);
    assert_int_equal(convd_gpu_rule_table(want, need + 1), need);
    static const char *docs[] = {CONVD_SOURCE_DIR "/docs/architecture.md",
                                 CONVD_SOURCE_DIR "/docs/benchmarks.md"};
    static const char begin[] = "<!-- routing table: convd-routes --table -->\n",
                      end[] = "<!-- end of routing table -->";
    for (size_t d = 0; d < sizeof(docs) / sizeof(docs[0]); d++) {
        FILE *f = fopen(docs[d], "r");
        assert_non_null(f);
        static char text[1 << 20];
        const size_t len = fread(text, 1, sizeof(text) - 1, f);
        fclose(f);
        text[len] = '\0';
        const char *a = strstr(text, begin), *b = a != NULL ? strstr(a, end) : NULL;
        if (a == NULL || b == NULL)
            fail_msg("%s: no routing table between \"%.*s\" and \"%s\"", docs[d],
                     (int)strlen(begin) - 1, begin, end);
        a += strlen(begin);
        if ((size_t)(b - a) != need || memcmp(a, want, need) != 0)
            fail_msg("%s: the routing table differs from the router's; paste in the output of "
                     "convd-routes --table:\n%s",
                     docs[d], want);
    }
    free(want);
}

/* Skips the calling test where the mma family does not exist (AMD: no MFMA kernel yet). */
static void require_mma(void)
{
    struct convd_problem p =
        mk(1, 8, 8, 32, 32, 3, 3, 4, 1, 1, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC);
    char why[160];
    if (convd_gpu_family_check(&p, CONVD_GPU_FAMILY_MMA, why, sizeof(why)) != 0) {
        printf("skipped: mma family not available here (%s)\n", why);
        skip();
    }
}

/* Case i of a family test in dtypes[d] and layouts[l]: NCHW with a bias and an activation that
 * moves with i and d, NHWC with neither. */
static struct convd_problem variant(const struct convd_problem *p, size_t i, int d, int l)
{
    struct convd_problem q = *p;
    q.dtype = dtypes[d];
    q.layout = layouts[l];
    q.has_bias = l == 1;
    set_act(&q, l == 1 ? (int)i + d : -1);
    return q;
}

/* Dense 16-bit problems whose C is not a multiple of 8 (the 3-channel stem) run on the mma family
 * with C padded to the next multiple of 8 in NHWC copies (from NHWC or NCHW input); K must be a
 * multiple of 8, fp32 stays on the fma family, and the switch turns it off. */
static void test_mma_padded(void **state)
{
    (void)state;
    REQUIRE_GPU();
    require_mma();
    assert_int_equal(convd_gpu_tune_stem(0), 0); /* the stems' own kernel aside (test_fma_stem) */
    struct convd_problem ps[] = {
        mk(2, 19, 21, 3, 16, 7, 7, 1, 2, 3, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC), /* stem */
        mk(3, 9, 10, 5, 24, 3, 3, 1, 1, 1, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
        mk(2, 7, 9, 12, 8, 1, 1, 1, 1, 0, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC), /* to 16 */
    };
    for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++) {
        for (int d = 1; d < 3; d++) {
            for (int l = 0; l < 2; l++) {
                const struct convd_problem q = variant(&ps[i], i, d, l);
                if (!described_as(&q, CONVD_GPU_FAMILY_AUTO, "(C padded to"))
                    fail_msg("case %zu dtype %d layout %d not padded", i, d, l);
                check_problem(&q, CONVD_GPU_FAMILY_AUTO, 1);
            }
        }
    }
    struct convd_problem q = ps[0];
    assert_true(described_as(&q, CONVD_GPU_FAMILY_AUTO, "(C padded to 8)"));
    assert_true(described_as(&ps[2], CONVD_GPU_FAMILY_AUTO, "(C padded to 16)"));
    size_t ws = 0, one = 0;
    assert_int_equal(convd_gpu_dev_workspace(&q, 3, &ws), 0);
    assert_int_equal(convd_gpu_dev_workspace(&q, 1, &one), 0);
    assert_true(one >= (size_t)2 * 19 * 21 * 8 * 2 + 16 * 49 * 8 * 2); /* padded in + weights */
    assert_int_equal(ws, 3 * one);
    q.k = 12; /* K not a multiple of 8 */
    assert_false(described_as(&q, CONVD_GPU_FAMILY_AUTO, "padded"));
    q.k = 16;
    q.dtype = CONVD_DTYPE_FP32;
    assert_false(described_as(&q, CONVD_GPU_FAMILY_AUTO, "padded"));
    q.dtype = CONVD_DTYPE_FP16;
    q.groups = 3;
    q.k = 24; /* grouped: cpg 1, the depthwise family's */
    assert_false(described_as(&q, CONVD_GPU_FAMILY_AUTO, "padded"));
    assert_int_equal(convd_gpu_tune_mma_pad(0), 0);
    assert_false(described_as(&ps[0], CONVD_GPU_FAMILY_AUTO, "padded"));
    check_problem(&ps[0], CONVD_GPU_FAMILY_AUTO, 1);
    assert_int_equal(convd_gpu_tune_mma_pad(1), 0);
    assert_int_equal(convd_gpu_tune_mma_pad(2), CONVD_EINVAL);
}

/* Each of ps in both 16-bit dtypes and both layouts (with bias and activations, variant()) must
 * be planned on the mma family in the way plan_ok checks on its description, and match the
 * reference; what names that way in the failure. */
static void check_mma_plans(const struct convd_problem *ps, size_t np,
                            int (*plan_ok)(const struct convd_problem *q, const char *desc),
                            const char *what)
{
    for (size_t i = 0; i < np; i++) {
        for (int d = 1; d < 3; d++) {
            for (int l = 0; l < 2; l++) {
                const struct convd_problem q = variant(&ps[i], i, d, l);
                char desc[200];
                assert_int_equal(convd_gpu_describe(&q, CONVD_GPU_FAMILY_AUTO, desc, sizeof(desc)),
                                 0);
                if (strstr(desc, "mma cfg") == NULL || !plan_ok(&q, desc))
                    fail_msg("case %zu dtype %d layout %d: not on mma %s: %s", i, d, l, what, desc);
                check_problem(&q, CONVD_GPU_FAMILY_AUTO, 1);
            }
        }
    }
}

/* The plan streams C in chunks: "kc CHUNK/WHOLE" with CHUNK < WHOLE. */
static int plan_chunked(const struct convd_problem *q, const char *desc)
{
    (void)q;
    const char *kc = strstr(desc, " kc ");
    int chunk = 0, whole = 0;
    return kc != NULL && sscanf(kc, " kc %d/%d", &chunk, &whole) == 2 && chunk < whole;
}

/* The plan's n-blocks cover more than a group's outputs: the last one is partial. */
static int plan_partial_n(const struct convd_problem *q, const char *desc)
{
    const char *bn = strstr(desc, " bn ");
    int width = 0, split = 0;
    return bn != NULL && sscanf(bn, " bn %d sgb %*d nsplit %d", &width, &split) == 2 &&
           width * split > q->k / q->groups;
}

/* mma_split_c: 1x1 problems whose whole C fits no mma tile (resnext50's downsamples and a 7x7
 * 1x1 at batch 1; a C whose largest chunk is not a power of two) leave the FMA kernels for the
 * mma family with C in chunks, and match the reference in both 16-bit dtypes and both layouts,
 * with bias and activations; with the knob off, the first three stay off the mma family. */
static void test_mma_split_c(void **state)
{
    (void)state;
    REQUIRE_GPU();
    require_mma();
    struct convd_problem ps[] = {
        mk(1, 28, 28, 512, 1024, 1, 1, 1, 2, 0, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
        mk(1, 14, 14, 1024, 2048, 1, 1, 1, 2, 0, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
        mk(1, 7, 7, 2048, 1024, 1, 1, 1, 1, 0, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
        mk(2, 9, 11, 1032, 64, 1, 1, 1, 2, 0, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
    };
    const size_t np = sizeof(ps) / sizeof(ps[0]);
    assert_int_equal(convd_gpu_tune_mma_split_c(0), 0);
    for (size_t i = 0; i + 1 < np; i++)
        if (described_as(&ps[i], CONVD_GPU_FAMILY_AUTO, "mma cfg"))
            fail_msg("case %zu on the mma family without mma_split_c", i);
    assert_int_equal(convd_gpu_tune_mma_split_c(1), 0);
    check_mma_plans(ps, np, plan_chunked, "in chunks");
    assert_int_equal(convd_gpu_tune_mma_split_c(2), CONVD_EINVAL);
}

/* mma_partial_n: output counts that no block width divides or fills (regnet_y_400mf's batch-1
 * downsamples, K 104, 208 and 440; a grouped 3x3 with 104 outputs a group, whose partial block
 * must leave the next group's columns alone) run on the mma family with a partial last n-block
 * and match the reference in both 16-bit dtypes and both layouts, with bias and activations;
 * with the knob off, none of them is on the mma family. */
static void test_mma_partial_n(void **state)
{
    (void)state;
    REQUIRE_GPU();
    require_mma();
    struct convd_problem ps[] = {
        mk(1, 56, 56, 48, 104, 1, 1, 1, 2, 0, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
        mk(1, 28, 28, 104, 208, 1, 1, 1, 2, 0, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
        mk(1, 14, 14, 208, 440, 1, 1, 1, 2, 0, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
        mk(2, 13, 11, 64, 208, 3, 3, 2, 1, 1, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
    };
    const size_t np = sizeof(ps) / sizeof(ps[0]);
    assert_int_equal(convd_gpu_tune_mma_partial_n(0), 0);
    for (size_t i = 0; i < np; i++)
        if (described_as(&ps[i], CONVD_GPU_FAMILY_AUTO, "mma cfg"))
            fail_msg("case %zu on the mma family without mma_partial_n", i);
    assert_int_equal(convd_gpu_tune_mma_partial_n(1), 0);
    check_mma_plans(ps, np, plan_partial_n, "with a partial block");
    assert_int_equal(convd_gpu_tune_mma_partial_n(2), CONVD_EINVAL);
}

/* Every warp layout of the mma kernel (forced with convd_gpu_tune_mma_cfg), on problems whose
 * tiles the image edges cut, in each per-super-group output width it takes (8: cpg 8 and cpg 4
 * merged; 16, 24, 32, 40); every layout must have run at least one of them. */
static void test_mma_configs(void **state)
{
    (void)state;
    REQUIRE_GPU();
    const enum convd_gpu_family F = CONVD_GPU_FAMILY_MMA;
    require_mma();
    const enum convd_dtype H = CONVD_DTYPE_FP16;
    const enum convd_layout L = CONVD_LAYOUT_NHWC;
    const struct convd_problem probs[] = {
        mk(2, 13, 11, 64, 64, 3, 3, 8, 1, 1, 1, H, L),  /* kpg 8 */
        mk(1, 17, 15, 32, 32, 3, 3, 8, 1, 1, 1, H, L),  /* cpg 4, 2 merged */
        mk(2, 9, 10, 64, 64, 3, 3, 4, 1, 1, 1, H, L),   /* kpg 16 */
        mk(1, 10, 9, 72, 72, 3, 3, 3, 2, 1, 1, H, L),   /* kpg 24, stride 2 */
        mk(3, 7, 7, 64, 64, 3, 3, 2, 1, 1, 1, H, L),    /* kpg 32 */
        mk(2, 9, 11, 160, 160, 1, 1, 4, 1, 0, 1, H, L), /* kpg 40, 1x1 */
    };
    int cfgs = 0;
    for (int cfg = 0; convd_gpu_tune_mma_cfg(cfg) == 0; cfg++, cfgs++) {
        int ran = 0;
        for (size_t i = 0; i < sizeof(probs) / sizeof(probs[0]); i++) {
            struct convd_problem p = probs[i];
            if (convd_gpu_family_check(&p, F, NULL, 0) != 0)
                continue; /* this layout does not take that width */
            sweep(p, F, 1, 1);
            ran++;
        }
        if (ran == 0)
            fail_msg("mma configuration %d ran none of the problems", cfg);
    }
    assert_int_equal(convd_gpu_tune_mma_cfg(-1), 0);
    assert_true(cfgs >= 7);
}

/* Whether the code running takes the tensor copies: sm_90 code, which a compute_80 PTX build
 * is not even on an sm_90 device. */
static int device_has_tma(void)
{
    int cc = 0;
    assert_int_equal(convd_gpu_code_arch(&cc), 0);
    return cc >= 90;
}

/* The tensor-core kernel with sm_90 tensor copies (the halo in as one box per item, padding
 * filled by the copy unit; the output out as one box, clipped at the edges): every warp layout
 * that takes a problem through them, against the reference, on problems whose tiles the image
 * edges cut, with asymmetric padding, stride, dilation, merged groups, several images per tile,
 * a last n-block that is partial (block channels past C, outputs past K), kpg split over
 * n-blocks, and rows that are swizzled (32, 64, 128 bytes) or padded (96, 160 bytes to 112, 176,
 * the box reading 8 channels past the block's, past C on the last). The router sends
 * such problems to the copies by default, and never with the copies switched off. */
static void test_mma_tma(void **state)
{
    (void)state;
    REQUIRE_GPU();
    require_mma();
    if (!device_has_tma()) {
        printf("skipped: no sm_90 tensor copies on this device\n");
        skip();
    }
    const enum convd_gpu_family F = CONVD_GPU_FAMILY_MMA;
    const enum convd_dtype H = CONVD_DTYPE_FP16;
    const enum convd_layout L = CONVD_LAYOUT_NHWC;
    const struct convd_problem asym = mk_asym(H);
    const struct convd_problem probs[] = {
        mk(2, 13, 11, 64, 64, 3, 3, 8, 1, 1, 1, H, L),  /* cpg 8 */
        mk(1, 17, 15, 32, 32, 3, 3, 8, 1, 1, 1, H, L),  /* cpg 4, 2 merged */
        mk(2, 12, 12, 16, 16, 3, 3, 8, 1, 1, 1, H, L),  /* cpg 2, 4 merged */
        mk(2, 9, 10, 64, 64, 3, 3, 4, 1, 1, 1, H, L),   /* cpg 16 */
        mk(3, 7, 7, 64, 64, 3, 3, 2, 1, 1, 1, H, L),    /* cpg 32, images per tile */
        mk(2, 15, 15, 64, 64, 3, 3, 8, 2, 1, 1, H, L),  /* stride 2 */
        mk(1, 13, 13, 32, 32, 3, 3, 4, 1, 2, 2, H, L),  /* dilation 2 */
        mk(1, 12, 12, 64, 64, 3, 3, 1, 1, 1, 1, H, L),  /* dense */
        mk(1, 10, 11, 96, 96, 3, 3, 12, 1, 1, 1, H, L), /* last n-block partial */
        mk(1, 9, 9, 64, 128, 3, 3, 1, 1, 1, 1, H, L),   /* kpg 128: split */
        mk(2, 10, 10, 72, 72, 3, 3, 3, 1, 1, 1, H, L),  /* cpg 24: 96-byte rows, padded */
        mk(2, 9, 11, 160, 160, 1, 1, 2, 1, 0, 1, H, L), /* cpg 80, 1x1: 160-byte rows, padded */
        asym,
    };
    for (size_t i = 0; i < sizeof(probs) / sizeof(probs[0]); i++) {
        int ran = 0;
        for (int cfg = 0; convd_gpu_tune_mma_cfg(cfg) == 0; cfg++) {
            struct convd_problem p = probs[i];
            if (convd_gpu_family_check(&p, F, NULL, 0) != 0 || !described_as(&p, F, " tma"))
                continue;
            sweep(p, F, 1, 1);
            ran++;
        }
        assert_int_equal(convd_gpu_tune_mma_cfg(-1), 0);
        if (ran == 0)
            fail_msg("problem %zu ran on no warp layout with tensor copies", i);
        /* One halo buffer, and rings of 3 and 4 (the default takes two). */
        for (int nst = 1; nst <= 4; nst++) {
            if (nst == 2)
                continue;
            assert_int_equal(convd_gpu_tune_mma_stages(nst), 0);
            const char *want = nst == 1 ? " tma x1" : nst == 3 ? " tma x3" : " tma x4";
            struct convd_problem p = probs[i];
            if (!described_as(&p, F, want))
                fail_msg("problem %zu: no ring of %d halo buffers", i, nst);
            sweep(p, F, 1, 1);
        }
        assert_int_equal(convd_gpu_tune_mma_stages(-1), 0);
    }
    assert_int_equal(convd_gpu_tune_mma_stages(5), CONVD_EINVAL);
    struct convd_problem p = mk(2, 9, 10, 32, 32, 3, 3, 4, 1, 1, 1, H, L);
    assert_true(described_as(&p, F, " tma"));
    p = mk(32, 56, 56, 128, 128, 3, 3, 32, 1, 1, 1, CONVD_DTYPE_BF16, L);
    assert_true(described_as(&p, F, " tma"));
    assert_int_equal(convd_gpu_tune_mma_tma(0), 0);
    assert_false(described_as(&p, F, " tma"));
    p = mk(2, 13, 11, 64, 64, 3, 3, 8, 1, 1, 1, H, L);
    sweep(p, F, 1, 1); /* the same problem through cp.async, for the record */
    assert_int_equal(convd_gpu_tune_mma_tma(-1), 0);
    assert_int_equal(convd_gpu_tune_mma_tma(2), CONVD_EINVAL);
}

/* Back-to-back dependent launches of one problem: six convolutions on one stream, each reading
 * the output the one before wrote, with no synchronisation between them. Every kernel is
 * launched with programmatic serialization (its blocks start during the previous kernel's tail
 * and must wait for it before touching memory; the default launches the kernel after NCHW
 * transposes plainly), so a missing wait would read the poison (NaN) or a partial tensor. Each
 * stage is checked against the reference run on that stage's actual input. With use_ws, NCHW runs
 * as two kernels per stage (transposed copies, then the GEMM). */
static void chain_case(struct convd_problem p, const char *kernel, int use_ws)
{
    struct tcase c;
    tc_init(&c, &p);
    assert_int_equal(c.z.input_bytes, c.z.output_bytes);
    assert_true(described_as(&p, CONVD_GPU_FAMILY_AUTO, kernel));
    enum { STAGES = 6 };
    void *buf[STAGES + 1];
    buf[0] = c.dx;
    for (int i = 1; i <= STAGES; i++) {
        assert_int_equal(convd_gpu_alloc(c.z.output_bytes, &buf[i]), 0);
        assert_int_equal(convd_gpu_fill_bytes(buf[i], 0xff, c.z.output_bytes), 0);
    }
    assert_int_equal(convd_gpu_synchronize(), 0);
    for (int i = 1; i <= STAGES; i++) {
        struct convd_tensors t = {buf[i - 1], c.dw, NULL, buf[i]};
        assert_int_equal(
            run_on(&p, &t, 1, use_ws ? c.ws : NULL, use_ws ? c.ws_bytes : 0, CONVD_GPU_FAMILY_AUTO),
            0);
    }
    assert_int_equal(convd_gpu_synchronize(), 0);
    char desc[160];
    convd_problem_str(&p, desc, sizeof(desc));
    for (int i = 1; i <= STAGES; i++) {
        assert_int_equal(convd_gpu_download(c.hx, buf[i - 1], c.z.input_bytes), 0);
        tc_reference(&c);
        assert_int_equal(convd_gpu_download(c.hy, buf[i], c.z.output_bytes), 0);
        size_t bad = 0;
        const double err = tu_rel_error(p.dtype, c.hy, c.ref, c.z.output_elems, &bad);
        if (!(err <= tu_tolerance(p.dtype)))
            fail_msg("%s stage %d: rel error %.3g (element %zu: got %g, want %g)", desc, i, err,
                     bad, (double)tu_load(p.dtype, c.hy, bad), (double)c.ref[bad]);
        n_checked++;
    }
    for (int i = 1; i <= STAGES; i++)
        convd_gpu_free(buf[i]);
    tc_free(&c);
}

/* The chain on each kernel family that the router reaches with C = K. bf16: six stages grow the
 * values about 3x each, past fp16's range for some seeds. */
static void test_chain(void **state)
{
    (void)state;
    REQUIRE_GPU();
    const enum convd_dtype B = CONVD_DTYPE_BF16, S = CONVD_DTYPE_FP32;
    const enum convd_layout NHWC = CONVD_LAYOUT_NHWC, NCHW = CONVD_LAYOUT_NCHW;
    struct convd_problem p = mk(2, 20, 20, 64, 64, 3, 3, 8, 1, 1, 1, B, NHWC);
    if (convd_gpu_family_check(&p, CONVD_GPU_FAMILY_MMA, NULL, 0) == 0) { /* not on AMD */
        if (device_has_tma())
            assert_true(described_as(&p, CONVD_GPU_FAMILY_MMA, " tma"));
        chain_case(p, "mma", 0);
        /* The L2 prefetch of each stage's first halo, issued before the previous stage has
         * finished writing it, forced on and off (the default takes it for this problem). */
        for (int mode = 0; mode <= 1; mode++) {
            assert_int_equal(convd_gpu_tune_mma_prefetch(mode), 0);
            chain_case(p, "mma", 0);
        }
        assert_int_equal(convd_gpu_tune_mma_prefetch(2), CONVD_EINVAL);
        assert_int_equal(convd_gpu_tune_mma_prefetch(-1), 0);
        /* Two kernels per stage, in each programmatic-launch arrangement (the default launches
         * the GEMM after the transposes plainly; 1 launches both early, 2 the GEMM only). */
        const struct convd_problem q = mk(2, 20, 20, 64, 64, 3, 3, 8, 1, 1, 1, B, NCHW);
        for (int mode = -1; mode <= 2; mode++) {
            assert_int_equal(convd_gpu_tune_pdl(mode), 0);
            chain_case(q, "mma", 1);
        }
        assert_int_equal(convd_gpu_tune_pdl(4), CONVD_EINVAL);
        assert_int_equal(convd_gpu_tune_pdl(-1), 0);
    }
    chain_case(mk(2, 24, 24, 32, 32, 3, 3, 32, 1, 1, 1, B, NHWC), "depthwise", 0);
    chain_case(mk(2, 24, 24, 32, 32, 3, 3, 32, 1, 1, 1, S, NCHW), "depthwise", 0);
    chain_case(mk(2, 16, 16, 32, 32, 3, 3, 4, 1, 1, 1, S, NHWC), "fma", 0);
    chain_case(mk(2, 16, 16, 32, 32, 3, 3, 4, 1, 1, 1, S, NCHW), "direct", 0);
}

static void test_mma(void **state)
{
    (void)state;
    REQUIRE_GPU();
    const enum convd_gpu_family F = CONVD_GPU_FAMILY_MMA;
    struct convd_problem p;
    require_mma();
    sweep(mk(2, 14, 14, 64, 64, 3, 3, 8, 1, 1, 1, 0, 0), F, 1, 1);  /* cpg 8 */
    sweep(mk(2, 9, 9, 64, 64, 3, 3, 4, 1, 1, 1, 0, 0), F, 1, 1);    /* cpg 16 */
    sweep(mk(2, 10, 10, 72, 72, 3, 3, 3, 1, 1, 1, 0, 0), F, 1, 1);  /* cpg 24 */
    sweep(mk(3, 7, 7, 64, 64, 3, 3, 2, 1, 1, 1, 0, 0), F, 1, 1);    /* cpg 32, 7x7 images */
    sweep(mk(2, 9, 11, 160, 160, 1, 1, 2, 1, 0, 1, 0, 0), F, 1, 1); /* cpg 80, 1x1 */
    sweep(mk(1, 12, 12, 64, 64, 3, 3, 1, 1, 1, 1, 0, 0), F, 1, 1);  /* dense */
    sweep(mk(2, 12, 12, 32, 32, 3, 3, 8, 1, 1, 1, 0, 0), F, 1, 1);  /* cpg 4: 2 merged */
    sweep(mk(2, 12, 12, 16, 16, 3, 3, 8, 1, 1, 1, 0, 0), F, 1, 1);  /* cpg 2: 4 merged */
    sweep(mk(1, 10, 10, 16, 32, 3, 3, 4, 1, 1, 1, 0, 0), F, 1, 1);  /* cpg 4, kpg 8 */
    sweep(mk(2, 9, 9, 40, 40, 3, 3, 5, 1, 1, 1, 0, 0), F, 1, 1);    /* 5 groups: n tail */
    sweep(mk(1, 6, 6, 16, 256, 3, 3, 1, 1, 1, 1, 0, 0), F, 1, 1);   /* kpg > bn: split */
    sweep(mk(1, 6, 7, 160, 16, 3, 3, 1, 1, 1, 1, 0, 0), F, 1, 1);   /* K chunks + tail */
    sweep(mk(2, 15, 15, 64, 64, 3, 3, 8, 2, 1, 1, 0, 0), F, 1, 1);  /* stride 2 */
    sweep(mk(1, 13, 13, 32, 32, 3, 3, 4, 1, 2, 2, 0, 0), F, 1, 1);  /* dilation 2 */
    sweep(mk(1, 60, 60, 16, 16, 3, 3, 2, 1, 1, 1, 0, 0), F, 1, 1);  /* many tiles */
    sweep(mk(40, 4, 4, 16, 16, 3, 3, 2, 1, 1, 1, 0, 0), F, 1, 1);   /* images per tile */
    sweep(mk(1, 11, 10, 8, 8, 2, 5, 1, 1, 0, 1, 0, 0), F, 1, 1);    /* non-square */
    p = mk(2, 12, 13, 32, 32, 3, 3, 4, 1, 0, 1, 0, 0);              /* asymmetric */
    p.pad_top = 2;
    p.pad_bottom = 0;
    p.pad_left = 0;
    p.pad_right = 1;
    p.stride_h = 2;
    sweep(p, F, 1, 1);
    for (int i = 0; i < 20; i++) {
        tu_random_problem(&rng, &p, tu_rng_range(&rng, 2, 3), 0, 6);
        check_problem(&p, F, 0); /* random channel counts: run only where mma takes them */
    }
}

static void test_generic(void **state)
{
    (void)state;
    REQUIRE_GPU();
    sweep(mk(2, 7, 9, 6, 9, 3, 2, 3, 2, 1, 2, 0, 0), CONVD_GPU_FAMILY_GENERIC, 1, 0);
    struct convd_problem p;
    for (int i = 0; i < 16; i++) {
        tu_random_problem(&rng, &p, 0, 0, 7);
        check_problem(&p, CONVD_GPU_FAMILY_GENERIC, 1);
    }
}

/* The router on random problems of every kind, and on scaled-down versions of the bench shapes. */
static void test_auto(void **state)
{
    (void)state;
    REQUIRE_GPU();
    struct convd_problem p;
    for (int i = 0; i < 40; i++) {
        tu_random_problem(&rng, &p, 0, 0, tu_rng_range(&rng, 1, 20));
        check_problem(&p, CONVD_GPU_FAMILY_AUTO, 1);
    }
    /* Suite shapes with N = 2 (same channel structure, so the same routes). */
    static const int shapes[][10] = {
        /* h, w, c, k, r, stride, pad, groups */
        {56, 56, 128, 128, 3, 1, 1, 32}, {28, 28, 256, 256, 3, 1, 1, 32},
        {14, 14, 512, 512, 3, 1, 1, 32}, {7, 7, 1024, 1024, 3, 1, 1, 32},
        {56, 56, 256, 256, 3, 2, 1, 32}, {28, 28, 120, 120, 3, 1, 1, 5},
        {14, 14, 336, 336, 3, 1, 1, 14}, {56, 56, 64, 64, 3, 1, 1, 32},
        {56, 56, 64, 128, 3, 1, 1, 64},  {56, 56, 144, 144, 3, 1, 1, 144},
        {112, 112, 96, 96, 3, 2, 1, 96}, {28, 28, 240, 240, 5, 1, 2, 240},
        {56, 56, 96, 96, 7, 1, 3, 96},   {28, 28, 240, 240, 1, 1, 0, 3},
        {56, 56, 64, 64, 3, 1, 1, 1},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        const int *s = shapes[i];
        for (int d = 0; d < 3; d++)
            for (int l = 0; l < 2; l++) {
                p = mk(2, s[0], s[1], s[2], s[3], s[4], s[4], s[7], s[5], s[6], 1, dtypes[d],
                       layouts[l]);
                p.has_bias = d == 1;
                set_act(&p, l == 1 ? (int)i + d : -1);
                check_problem(&p, CONVD_GPU_FAMILY_AUTO, 1);
            }
    }
}

/* ---- identities ---- */

/* Channel slice g of a tensor whose channel dimension is `ch` wide, `per` channels a group. */
static void slice_channels(const struct convd_problem *p, const void *src, void *dst, int hh,
                           int ww, int ch, int per, int g)
{
    const size_t es = convd_dtype_size(p->dtype);
    for (int n = 0; n < p->n; n++)
        for (int y = 0; y < hh; y++)
            for (int x = 0; x < ww; x++)
                for (int c = 0; c < per; c++) {
                    size_t si, di;
                    if (p->layout == CONVD_LAYOUT_NHWC) {
                        si = (((size_t)n * hh + y) * ww + x) * ch + (size_t)g * per + c;
                        di = (((size_t)n * hh + y) * ww + x) * per + c;
                    } else {
                        si = (((size_t)n * ch + (size_t)g * per + c) * hh + y) * ww + x;
                        di = (((size_t)n * per + c) * hh + y) * ww + x;
                    }
                    memcpy((char *)dst + di * es, (const char *)src + si * es, es);
                }
}

/* Per family: identity cases tried, and those checked (not refused). */
struct identity_tally {
    int tried[CONVD_GPU_FAMILY_COUNT];
    int ran[CONVD_GPU_FAMILY_COUNT];
};

/* Checks that each group of a grouped run on `fam` equals, bit for bit, the same family's run of
 * that group alone, and counts it in *t. A family that refuses the grouped problem or its
 * one-group slice is counted as tried only, with the reason printed. */
static void identity_case(struct identity_tally *t, struct convd_problem p,
                          enum convd_gpu_family fam)
{
    t->tried[fam]++;
    char desc[160], why[160] = "";
    convd_problem_str(&p, desc, sizeof(desc));
    struct convd_problem q = p;
    q.c = p.c / p.groups;
    q.k = p.k / p.groups;
    q.groups = 1;
    if (convd_gpu_family_check(&p, fam, why, sizeof(why)) != 0 ||
        convd_gpu_family_check(&q, fam, why, sizeof(why)) != 0) {
        printf("group identity: %s [%s] not checked: %s\n", desc, convd_gpu_family_name(fam), why);
        return;
    }
    struct tcase c;
    tc_init(&c, &p);
    assert_int_equal(tc_run(&c, fam), 0);
    const size_t es = convd_dtype_size(p.dtype);
    const int ho = (int)convd_out_dim(p.h, p.pad_top, p.pad_bottom, p.r, p.stride_h, p.dil_h);
    const int wo = (int)convd_out_dim(p.w, p.pad_left, p.pad_right, p.s, p.stride_w, p.dil_w);
    for (int g = 0; g < p.groups; g++) {
        struct tcase s;
        tc_init(&s, &q);
        slice_channels(&p, c.hx, s.hx, p.h, p.w, p.c, q.c, g);
        memcpy(s.hw, (const char *)c.hw + (size_t)g * s.z.weight_elems * es, s.z.weight_bytes);
        if (p.has_bias)
            memcpy(s.hb, (const char *)c.hb + (size_t)g * q.k * es, s.z.bias_bytes);
        assert_int_equal(convd_gpu_upload(s.dx, s.hx, s.z.input_bytes), 0);
        assert_int_equal(convd_gpu_upload(s.dw, s.hw, s.z.weight_bytes), 0);
        if (p.has_bias)
            assert_int_equal(convd_gpu_upload(s.db, s.hb, s.z.bias_bytes), 0);
        assert_int_equal(tc_run(&s, fam), 0);
        void *want = malloc(s.z.output_bytes);
        assert_non_null(want);
        slice_channels(&p, c.hy, want, ho, wo, p.k, q.k, g);
        if (memcmp(want, s.hy, s.z.output_bytes) != 0)
            fail_msg("%s [%s]: group %d differs from the grouped run", desc,
                     convd_gpu_family_name(fam), g);
        free(want);
        tc_free(&s);
    }
    tc_free(&c);
    n_checked++;
    t->ran[fam]++;
}

/* Each family's grouped run against its own one-group runs, over three dtypes and both layouts.
 * The test fails when a family checks nothing: the generic family takes every problem; fma takes
 * all of these (its only refusals are a halo tile over shared memory and a grid over 2^31
 * blocks); depthwise takes cpg 1, kpg 2; direct takes NCHW 3x3 stride-1 pad-1 with W and Wo
 * multiples of 4 (W 8); mma takes fp16 and bf16 where cpg and kpg reach multiples of 8 (16 and
 * 16, 24 and 48), on NVIDIA only. */
static void test_group_identity(void **state)
{
    (void)state;
    REQUIRE_GPU();
    struct identity_tally t;
    memset(&t, 0, sizeof(t));
    for (int d = 0; d < 3; d++)
        for (int l = 0; l < 2; l++) {
            struct convd_problem p = mk(2, 11, 12, 24, 36, 3, 3, 3, 1, 1, 1, dtypes[d], layouts[l]);
            p.has_bias = true;
            set_act(&p, l == 0 ? d : -1);
            identity_case(&t, p, CONVD_GPU_FAMILY_FMA);
            identity_case(&t, p, CONVD_GPU_FAMILY_GENERIC);
            p = mk(2, 10, 9, 32, 48, 3, 3, 4, 2, 1, 1, dtypes[d], layouts[l]); /* cpg 8, kpg 12 */
            identity_case(&t, p, CONVD_GPU_FAMILY_FMA);
            p = mk(1, 9, 10, 64, 64, 3, 3, 4, 1, 1, 1, dtypes[d], layouts[l]); /* cpg 16 */
            p.has_bias = true;
            identity_case(&t, p, CONVD_GPU_FAMILY_MMA);
            p = mk(2, 8, 8, 48, 96, 1, 1, 2, 1, 0, 1, dtypes[d], layouts[l]); /* cpg 24, kpg 48 */
            identity_case(&t, p, CONVD_GPU_FAMILY_MMA);
            p = mk(2, 9, 8, 6, 12, 3, 3, 6, 1, 1, 1, dtypes[d], CONVD_LAYOUT_NCHW);
            identity_case(&t, p, CONVD_GPU_FAMILY_DEPTHWISE);
            p = mk(2, 9, 8, 12, 24, 3, 3, 3, 1, 1, 1, dtypes[d], CONVD_LAYOUT_NCHW);
            p.has_bias = true;
            identity_case(&t, p, CONVD_GPU_FAMILY_DIRECT);
        }
    for (int f = 0; f < CONVD_GPU_FAMILY_COUNT; f++) {
        if (t.tried[f] == 0)
            continue;
        const char *name = convd_gpu_family_name((enum convd_gpu_family)f);
        printf("group identity: %s checked %d of %d\n", name, t.ran[f], t.tried[f]);
#if defined(__HIP_PLATFORM_AMD__)
        if (f == CONVD_GPU_FAMILY_MMA)
            continue; /* no MFMA kernel yet: the family refuses everything on AMD */
#endif
        if (t.ran[f] == 0)
            fail_msg("group identity: the %s family checked none of its %d problems", name,
                     t.tried[f]);
    }
    if (t.ran[CONVD_GPU_FAMILY_GENERIC] != t.tried[CONVD_GPU_FAMILY_GENERIC])
        fail_msg("group identity: the generic family, which takes every problem, refused one");
}

static void batch_case(struct convd_problem p, enum convd_gpu_family fam, int count)
{
    char desc[160];
    convd_problem_str(&p, desc, sizeof(desc));
    if (fam != CONVD_GPU_FAMILY_AUTO && convd_gpu_family_check(&p, fam, NULL, 0) != 0)
        return;
    struct tcase *cs = calloc((size_t)count, sizeof(*cs));
    struct convd_tensors *ts = calloc((size_t)count, sizeof(*ts));
    assert_non_null(cs);
    assert_non_null(ts);
    for (int i = 0; i < count; i++) {
        tc_init(&cs[i], &p);
        assert_int_equal(convd_gpu_fill_bytes(cs[i].dy, 0xff, cs[i].z.output_bytes), 0);
        ts[i].input = cs[i].dx;
        ts[i].weight = cs[i].dw;
        ts[i].bias = p.has_bias ? cs[i].db : NULL;
        ts[i].output = cs[i].dy;
    }
    size_t ws = 1;
    assert_int_equal(convd_gpu_dev_workspace(&p, (size_t)count, &ws), 0);
    /* NHWC asks for workspace only for NCHW copies and for split K's partial sums. */
    if (p.layout == CONVD_LAYOUT_NHWC && !described_as(&p, CONVD_GPU_FAMILY_AUTO, "NCHW copies") &&
        !described_as(&p, CONVD_GPU_FAMILY_AUTO, "split k"))
        assert_int_equal(ws, 0);
    /* The same per-problem room as the single runs get, so both take the same path. */
    const size_t slot = cs[0].ws_bytes;
    ws = slot * (size_t)(count < CONVD_GPU_BATCH_MAX ? count : CONVD_GPU_BATCH_MAX);
    void *dws = NULL;
    assert_int_equal(convd_gpu_alloc(ws, &dws), 0);
    int rc = run_on(&p, ts, (size_t)count, dws, ws, fam);
    assert_int_equal(rc, 0);
    assert_int_equal(convd_gpu_synchronize(), 0);
    convd_gpu_free(dws);
    void *batched = malloc(cs[0].z.output_bytes);
    assert_non_null(batched);
    for (int i = 0; i < count; i++) {
        assert_int_equal(convd_gpu_download(batched, cs[i].dy, cs[i].z.output_bytes), 0);
        assert_int_equal(tc_run(&cs[i], fam), 0);
        if (memcmp(batched, cs[i].hy, cs[i].z.output_bytes) != 0)
            fail_msg("%s [%s]: problem %d of %d differs between the batched and the single run",
                     desc, convd_gpu_family_name(fam), i, count);
        if (i == 0 || i == count - 1) {
            tc_reference(&cs[i]);
            double err = tu_rel_error(p.dtype, cs[i].hy, cs[i].ref, cs[i].z.output_elems, NULL);
            if (!(err <= tu_tolerance(p.dtype)))
                fail_msg("%s [%s]: batched problem %d rel error %.3g", desc,
                         convd_gpu_family_name(fam), i, err);
        }
    }
    free(batched);
    for (int i = 0; i < count; i++)
        tc_free(&cs[i]);
    free(cs);
    free(ts);
    n_checked++;
}

static void test_multi_problem(void **state)
{
    (void)state;
    REQUIRE_GPU();
    struct convd_problem p =
        mk(2, 9, 10, 32, 32, 3, 3, 4, 1, 1, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC);
    p.has_bias = true;
    batch_case(p, CONVD_GPU_FAMILY_AUTO, 5);
    batch_case(p, CONVD_GPU_FAMILY_MMA, 37); /* past one launch's capacity */
    batch_case(p, CONVD_GPU_FAMILY_FMA, 5);
    p.dtype = CONVD_DTYPE_BF16;
    p.layout = CONVD_LAYOUT_NCHW;
    batch_case(p, CONVD_GPU_FAMILY_MMA, 6);
    p = mk(1, 12, 12, 16, 16, 3, 3, 16, 1, 1, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NHWC);
    batch_case(p, CONVD_GPU_FAMILY_DEPTHWISE, 34);
    p = mk(1, 12, 12, 48, 48, 3, 3, 48, 1, 1, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC);
    batch_case(p, CONVD_GPU_FAMILY_DEPTHWISE, 5); /* direct kernel */
    assert_int_equal(convd_gpu_tune_dw_direct(0), 0);
    batch_case(p, CONVD_GPU_FAMILY_DEPTHWISE, 5); /* tiled kernel */
    assert_int_equal(convd_gpu_tune_dw_direct(-1), 0);
    p = mk(1, 12, 12, 16, 16, 3, 3, 16, 1, 1, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NHWC);
    p.layout = CONVD_LAYOUT_NCHW;
    batch_case(p, CONVD_GPU_FAMILY_DEPTHWISE, 3);
    p = mk(2, 9, 7, 24, 36, 1, 1, 3, 1, 0, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NCHW);
    batch_case(p, CONVD_GPU_FAMILY_FMA, 7); /* pointwise */
    p = mk(2, 10, 12, 16, 16, 3, 3, 4, 2, 1, 1, CONVD_DTYPE_BF16, CONVD_LAYOUT_NCHW);
    p.has_bias = true;
    batch_case(p, CONVD_GPU_FAMILY_DIRECT, 9);
    p = mk(1, 6, 7, 6, 9, 2, 3, 3, 1, 1, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NCHW);
    batch_case(p, CONVD_GPU_FAMILY_GENERIC, 33);
    /* NHWC on the direct kernel through NCHW copies: past one launch's capacity, so the second
     * launch's problems take the workspace's slots again. */
    p = mk(2, 10, 12, 20, 20, 3, 3, 4, 1, 1, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC);
    p.has_bias = true;
    batch_case(p, CONVD_GPU_FAMILY_DIRECT, 35);
    batch_case(p, CONVD_GPU_FAMILY_AUTO, 3);
    /* The 3-channel stem with its channels padded for the mma family, past one launch too. */
    p = mk(2, 19, 21, 3, 16, 7, 7, 1, 2, 3, 1, CONVD_DTYPE_BF16, CONVD_LAYOUT_NCHW);
    p.has_bias = true;
    batch_case(p, CONVD_GPU_FAMILY_AUTO, 35);
}

/* The fma family's matrix-vector kernel (1x1 filter, 1x1 output): the squeeze-excitation shapes
 * of regnet_y_400mf (cpg 12 and 26: lanes of 4 and 8), a grouped one (cpg 6, kpg 24), one of a
 * channel per group and two outputs (ahead of the depthwise kernel), a long row (cpg 1,000:
 * a warp an output, outputs past the last block's end), and a 3x3 image at stride 3 (the
 * output's one pixel of a larger plane: NCHW reads channels a plane apart), each in every dtype
 * and layout with and without bias and activations, alone and batched. Then the policy: past 4
 * images only with gemv 2, and never with 0, when the other kernels still serve them; 1 is the
 * default. */
static void test_fma_gemv(void **state)
{
    (void)state;
    REQUIRE_GPU();
    const enum convd_gpu_family F = CONVD_GPU_FAMILY_FMA, A = CONVD_GPU_FAMILY_AUTO;
    assert_int_equal(convd_gpu_policy_default.gemv, 1);
    struct convd_problem ps[] = {
        mk(1, 1, 1, 12, 104, 1, 1, 1, 1, 0, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
        mk(1, 1, 1, 26, 104, 1, 1, 1, 1, 0, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
        mk(2, 1, 1, 104, 26, 1, 1, 1, 1, 0, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
        mk(3, 1, 1, 96, 384, 1, 1, 16, 1, 0, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
        mk(1, 1, 1, 16, 32, 1, 1, 16, 1, 0, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
        mk(1, 1, 1, 1000, 37, 1, 1, 1, 1, 0, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
        mk(4, 3, 3, 40, 20, 1, 1, 2, 3, 0, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
    };
    const size_t np = sizeof(ps) / sizeof(ps[0]);
    for (size_t i = 0; i < np; i++) {
        for (int l = 0; l < 2; l++) {
            struct convd_problem q = ps[i];
            q.layout = layouts[l];
            if (!described_as(&q, A, "gemv"))
                fail_msg("case %zu layout %d not routed to the gemv kernel", i, l);
        }
        sweep(ps[i], F, 1, 0);
        struct convd_problem q = ps[i];
        q.has_bias = true;
        set_act(&q, (int)i);
        batch_case(q, A, 3);
        q.layout = CONVD_LAYOUT_NCHW;
        batch_case(q, A, 3);
    }
    struct convd_problem q = ps[1];
    q.n = 5; /* past the default's images */
    assert_false(described_as(&q, A, "gemv"));
    assert_true(described_as(&q, F, "gemv")); /* asked for by name, the family takes it */
    assert_int_equal(convd_gpu_tune_gemv(2), 0);
    assert_true(described_as(&q, A, "gemv"));
    sweep(q, A, 1, 0);
    q = ps[1];
    q.pad_top = q.pad_bottom = 1; /* a 3x1 output */
    assert_false(described_as(&q, A, "gemv"));
    assert_int_equal(convd_gpu_tune_gemv(0), 0);
    for (size_t i = 0; i < np; i++) {
        assert_false(described_as(&ps[i], A, "gemv"));
        sweep(ps[i], A, 1, 0);
    }
    assert_int_equal(convd_gpu_tune_gemv(3), CONVD_EINVAL);
    assert_int_equal(convd_gpu_tune_gemv(1), 0); /* back to the default for the tests after */
}

/* Runs p on `fam` without any workspace and compares with the reference: plans that
 * would use workspace of their own must take another way then. */
static void check_without_workspace(const struct convd_problem *p, enum convd_gpu_family fam)
{
    char desc[160];
    convd_problem_str(p, desc, sizeof(desc));
    struct tcase c;
    tc_init(&c, p);
    tc_reference(&c);
    int rc = tc_run_ws(&c, fam, 0);
    if (rc != 0) {
        tc_free(&c);
        fail_msg("%s [%s, no workspace]: %s", desc, convd_gpu_family_name(fam), convd_strerror(rc));
    }
    double err = tu_rel_error(p->dtype, c.hy, c.ref, c.z.output_elems, NULL);
    tc_free(&c);
    if (!(err <= tu_tolerance_of(p)))
        fail_msg("%s [%s, no workspace]: rel error %.3g", desc, convd_gpu_family_name(fam), err);
    n_checked++;
}

/* A policy knob that sends problems to one kernel: under 0 none of ps is described as `word`;
 * under `on` each is, in both layouts, and runs right through the router in every dtype and
 * layout with and without bias and activations, batched (the first `first_batch` problems at
 * once, the others 3), and, with `no_ws`, without workspace too; back at 0, none is again, and
 * on + 1 is refused. The test's teardown puts the default back. */
static void knob_routes(const struct convd_problem *ps, size_t np, const char *word,
                        int (*tune)(int), int on, int first_batch, int no_ws)
{
    const enum convd_gpu_family A = CONVD_GPU_FAMILY_AUTO;
    assert_int_equal(tune(0), 0);
    for (size_t i = 0; i < np; i++)
        assert_false(described_as(&ps[i], A, word));
    assert_int_equal(tune(on), 0);
    for (size_t i = 0; i < np; i++) {
        for (int l = 0; l < 2; l++) {
            struct convd_problem q = ps[i];
            q.layout = layouts[l];
            if (!described_as(&q, A, word))
                fail_msg("case %zu layout %d not routed to the %s kernel", i, l, word);
        }
        sweep(ps[i], A, 1, 0);
        struct convd_problem q = ps[i];
        q.has_bias = true;
        set_act(&q, (int)i);
        batch_case(q, A, i == 0 ? first_batch : 3);
        if (no_ws)
            check_without_workspace(&q, A);
        q.layout = CONVD_LAYOUT_NCHW;
        batch_case(q, A, 3);
    }
    assert_int_equal(tune(on + 1), CONVD_EINVAL);
    assert_int_equal(tune(0), 0);
    for (size_t i = 0; i < np; i++)
        assert_false(described_as(&ps[i], A, word));
}

/* Split K in the FMA GEMM (policy fma_split_k, on by default): the large-C 1x1s of small images
 * that resnext50 and regnet meet at batch 1 (7x7 and 14x14, C 512-2048, grouped too), K not a
 * multiple of 4 (scalar stores), several images. Their fp32 route is the GEMM (16-bit takes the
 * mma family); batched, each problem's partial sums go to its own workspace, and without
 * workspace nothing splits. A grid that fills more than a quarter of the block slots (56x56
 * pixels) does not split. */
static void test_fma_split_k(void **state)
{
    (void)state;
    REQUIRE_GPU();
    const enum convd_gpu_family A = CONVD_GPU_FAMILY_AUTO;
    assert_int_equal(convd_gpu_policy_default.fma_split_k, 1);
    const struct convd_problem ps[] = {
        mk(1, 7, 7, 2048, 512, 1, 1, 1, 1, 0, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NHWC),
        mk(1, 14, 14, 1024, 256, 1, 1, 1, 1, 0, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NHWC),
        mk(2, 7, 7, 512, 100, 1, 1, 1, 1, 0, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NHWC),
        mk(1, 7, 7, 1024, 256, 1, 1, 4, 1, 0, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NHWC),
    };
    for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++)
        assert_true(described_as(&ps[i], A, "split k"));
    knob_routes(ps, sizeof(ps) / sizeof(ps[0]), "split k", convd_gpu_tune_fma_split_k, 1, 3, 1);
    assert_int_equal(convd_gpu_tune_fma_split_k(1), 0);
    const struct convd_problem big =
        mk(1, 56, 56, 256, 128, 1, 1, 1, 1, 0, 1, CONVD_DTYPE_FP32, CONVD_LAYOUT_NCHW);
    assert_false(described_as(&big, A, "split k"));
}

/* The fma family's stem kernel (policy stem): regnet's 3x3 stride-2 stem and resnext50's 7x7
 * one on small odd images (a row's last pixel pair half outside), one input channel with
 * dilation, four with asymmetric padding and strides, two on a 1x1 filter; batched past one
 * launch, in either layout with stem 2. The default (1) takes NHWC filters of up to 9 taps on up
 * to 8 images only. Past its reach: five channels, a group, K not a multiple of 8. */
static void test_fma_stem(void **state)
{
    (void)state;
    REQUIRE_GPU();
    const enum convd_gpu_family A = CONVD_GPU_FAMILY_AUTO;
    assert_int_equal(convd_gpu_policy_default.stem, 1);
    struct convd_problem ps[] = {
        mk(2, 17, 19, 3, 32, 3, 3, 1, 2, 1, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
        mk(1, 23, 21, 3, 64, 7, 7, 1, 2, 3, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
        mk(2, 15, 16, 1, 8, 5, 5, 1, 1, 4, 2, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
        mk(3, 13, 11, 4, 16, 3, 2, 1, 1, 1, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
        mk(1, 9, 10, 2, 24, 1, 1, 1, 1, 0, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC),
    };
    ps[3].pad_top = 2;
    ps[3].pad_bottom = 0;
    ps[3].pad_right = 0;
    ps[3].stride_w = 2;
    /* The default's reach. */
    struct convd_problem q = ps[0];
    assert_true(described_as(&q, A, "stem"));
    q.n = 8;
    assert_true(described_as(&q, A, "stem"));
    q.n = 9;
    assert_false(described_as(&q, A, "stem"));
    q = ps[0];
    q.layout = CONVD_LAYOUT_NCHW;
    assert_false(described_as(&q, A, "stem"));
    assert_false(described_as(&ps[1], A, "stem")); /* 7x7 */
    knob_routes(ps, sizeof(ps) / sizeof(ps[0]), "stem", convd_gpu_tune_stem, 2, 35, 0);
    assert_int_equal(convd_gpu_tune_stem(2), 0);
    q = ps[0];
    q.c = 5;
    assert_false(described_as(&q, A, "stem"));
    q = ps[0];
    q.c = 4;
    q.groups = 2;
    assert_false(described_as(&q, A, "stem"));
    q = ps[0];
    q.k = 36;
    assert_false(described_as(&q, A, "stem"));
}

/* ---- API contract ---- */

static void test_api(void **state)
{
    (void)state;
    struct convd_problem p =
        mk(32, 28, 28, 256, 256, 3, 3, 32, 1, 1, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC);
    char why[160];
    assert_int_equal(convd_gpu_check(&p, why, sizeof(why)), 0);
    struct convd_problem bad = p;
    bad.groups = 3;
    assert_int_not_equal(convd_gpu_check(&bad, why, sizeof(why)), 0);
    assert_string_equal(convd_gpu_kernel_name(&bad), "none");
    /* An NHWC problem whose route reads it in place needs no workspace, with a GPU or without
     * one (fp32, kpg 8 at stride 1: the fma family either way; the 16-bit p goes to the tensor
     * cores on a GPU and, with none to plan for, through NCHW copies). */
    struct convd_problem in_place = p;
    in_place.dtype = CONVD_DTYPE_FP32;
    size_t ws = 7;
    assert_int_equal(convd_gpu_workspace(&in_place, 4, &ws), 0);
    assert_int_equal(ws, 0);
    assert_int_equal(convd_gpu_workspace(NULL, 4, &ws), CONVD_EINVAL);
    assert_int_equal(convd_gpu_workspace(&p, 4, NULL), CONVD_EINVAL);
    assert_int_equal(convd_gpu_conv(&p, NULL, 1, NULL, 0, NULL), CONVD_EINVAL);
    struct convd_tensors t = {NULL, NULL, NULL, NULL};
    assert_int_equal(convd_gpu_conv(&p, &t, 1, NULL, 0, NULL), CONVD_EINVAL);
    enum convd_gpu_family f;
    assert_int_equal(convd_gpu_family_parse("fma", &f), 0);
    assert_int_equal(f, CONVD_GPU_FAMILY_FMA);
    assert_int_equal(convd_gpu_family_parse("tensor", &f), CONVD_EINVAL);

    REQUIRE_GPU();
    /* Routing of the suite's families. */
    struct convd_problem dw =
        mk(32, 56, 56, 144, 144, 3, 3, 144, 1, 1, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC);
    assert_string_equal(convd_gpu_kernel_name(&dw), "depthwise");
    p.dtype = CONVD_DTYPE_FP32;
    assert_string_equal(convd_gpu_kernel_name(&p), "fma");
    p.dtype = CONVD_DTYPE_FP16;
    const char *mma_name = convd_gpu_kernel_name(&p);
    /* AMD has no mma family: cpg 8 then goes to the direct kernel on NCHW copies. */
    assert_true(strcmp(mma_name, "mma") == 0 || strcmp(mma_name, "direct-nhwc") == 0);

    /* Unaligned tensors: the router falls back to the generic kernel, a forced family refuses. */
    struct convd_problem u =
        mk(1, 8, 8, 16, 16, 3, 3, 2, 1, 1, 1, CONVD_DTYPE_FP16, CONVD_LAYOUT_NHWC);
    struct tcase c;
    tc_init(&c, &u);
    tc_reference(&c);
    void *dx2 = NULL;
    assert_int_equal(convd_gpu_alloc(c.z.input_bytes + 16, &dx2), 0);
    assert_int_equal(convd_gpu_upload((char *)dx2 + 2, c.hx, c.z.input_bytes), 0);
    assert_int_equal(convd_gpu_fill_bytes(c.dy, 0xff, c.z.output_bytes), 0);
    struct convd_tensors tu = {(char *)dx2 + 2, c.dw, NULL, c.dy};
    assert_int_equal(convd_gpu_conv_family(&u, &tu, 1, NULL, 0, NULL, CONVD_GPU_FAMILY_FMA),
                     CONVD_EUNSUPPORTED);
    assert_int_equal(convd_gpu_conv(&u, &tu, 1, NULL, 0, NULL), 0);
    assert_int_equal(convd_gpu_synchronize(), 0);
    assert_int_equal(convd_gpu_download(c.hy, c.dy, c.z.output_bytes), 0);
    assert_true(tu_rel_error(u.dtype, c.hy, c.ref, c.z.output_elems, NULL) <=
                tu_tolerance(u.dtype));
    convd_gpu_free(dx2);
    tc_free(&c);
}

static int report(void **state)
{
    (void)state;
    fprintf(stderr, "checked %d problem runs against the reference or bit for bit\n", n_checked);
    return 0;
}

int main(void)
{
    tu_rng_init(&rng, tu_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_api),
        cmocka_unit_test_teardown(test_policy, untune),
        cmocka_unit_test(test_routing_documented),
        cmocka_unit_test(test_depthwise),
        cmocka_unit_test_teardown(test_depthwise_tiled, untune),
        cmocka_unit_test_teardown(test_depthwise_direct_shapes, untune),
        cmocka_unit_test(test_depthwise_planes),
        cmocka_unit_test_teardown(test_fma, untune),
        cmocka_unit_test(test_fma_gemm),
        cmocka_unit_test_teardown(test_tf32, untune),
        cmocka_unit_test_teardown(test_mma_tf32, untune),
        cmocka_unit_test_teardown(test_direct, untune),
        cmocka_unit_test(test_mma),
        cmocka_unit_test_teardown(test_mma_padded, untune),
        cmocka_unit_test_teardown(test_mma_split_c, untune),
        cmocka_unit_test_teardown(test_mma_partial_n, untune),
        cmocka_unit_test_teardown(test_fma_gemv, untune),
        cmocka_unit_test_teardown(test_fma_split_k, untune),
        cmocka_unit_test_teardown(test_fma_stem, untune),
        cmocka_unit_test_teardown(test_mma_configs, untune),
        cmocka_unit_test_teardown(test_mma_tma, untune),
        cmocka_unit_test_teardown(test_chain, untune),
        cmocka_unit_test(test_generic),
        cmocka_unit_test(test_auto),
        cmocka_unit_test(test_group_identity),
        cmocka_unit_test(test_multi_problem),
    };
    /* CONVD_TEST_ONLY=test_fma_gemv (a glob) runs the tests it matches alone. */
    if (getenv("CONVD_TEST_ONLY") != NULL)
        cmocka_set_test_filter(getenv("CONVD_TEST_ONLY"));
    int failed = cmocka_run_group_tests(tests, NULL, report);
    /* With a GPU, a run that compared nothing is a failure, not a pass. */
    if (failed == 0 && have_gpu() && n_checked == 0) {
        fprintf(stderr, "error: a GPU is present and no problem run was checked\n");
        return 1;
    }
    return failed;
}
