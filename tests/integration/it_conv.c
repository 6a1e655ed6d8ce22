/*
 * Convolutions through the real client library against a real daemon: every dtype, layout and
 * epilogue checked against the naive reference on fresh random data with poisoned outputs;
 * hundreds of pipelined requests from one client; the blocking convd_conv; the event-loop
 * interface; region create/free cycles; status and metrics; the library's own argument checks.
 * Ends by checking that the daemon leaked nothing and exits 0 on SIGTERM.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "raw.h"
#include "wire.h"

static struct it_daemon daemon_;

static int group_setup(void **state)
{
    (void)state;
    it_daemon_start(&daemon_, NULL);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    it_daemon_kill(&daemon_);
    return 0;
}

/* Runs `count` cases on c, one region per case, submit then wait. */
static void run_cases(convd_client *c, const struct convd_problem *probs, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        convd_region *r = NULL;
        assert_int_equal(convd_region_create(c, it_case_span(&probs[i]), &r), 0);
        struct it_case t;
        it_case_init(&t, r, 0, &probs[i], it_rng());
        struct convd_conv_args a;
        it_case_args(&t, &a);
        uint64_t id;
        int rc = convd_conv_submit(c, &a, &id);
        if (rc != 0)
            fail_msg("submit: %s: %s", convd_status_name(rc), convd_errstr(c));
        struct convd_completion done;
        assert_int_equal(convd_wait(c, id, TU_TIMEOUT_MS, &done), 0);
        assert_int_equal(done.id, id);
        if (done.status != 0) {
            char desc[128];
            fail_msg("%s: %s: %s", convd_problem_str(&probs[i], desc, sizeof(desc)),
                     convd_status_name(done.status), done.error);
        }
        it_case_check(&t);
        it_case_fini(&t);
        assert_int_equal(convd_region_free(r), 0);
    }
}

/* Every dtype x layout x bias x activation, on random geometries (groups, strides, dilation,
 * asymmetric padding) plus a few fixed shapes that resemble real layers. */
static void test_roundtrip_every_dtype_layout_epilogue(void **state)
{
    (void)state;
    convd_client *c = it_connect(&daemon_, "it-roundtrip");
    const enum convd_dtype dtypes[] = {CONVD_DTYPE_FP32, CONVD_DTYPE_FP16, CONVD_DTYPE_BF16};
    const enum convd_layout layouts[] = {CONVD_LAYOUT_NCHW, CONVD_LAYOUT_NHWC};
    for (size_t d = 0; d < 3; d++)
        for (size_t l = 0; l < 2; l++)
            for (int bias = 0; bias < 2; bias++)
                for (int act = CONVD_ACT_NONE; act <= CONVD_ACT_GELU_TANH; act++) {
                    struct convd_problem probs[5];
                    for (size_t i = 0; i < 3; i++) {
                        tu_random_problem(it_rng(), &probs[i], dtypes[d], layouts[l], 8);
                        probs[i].has_bias = bias;
                        tu_set_activation(&probs[i], (enum convd_activation)act);
                    }
                    /* Depthwise, 3x3, stride 2, like a MobileNet block. */
                    convd_problem_init(&probs[3], 2, 15, 14, 24, 24, 3, 3, 24);
                    probs[3].stride_h = probs[3].stride_w = 2;
                    probs[3].pad_top = probs[3].pad_bottom = 1;
                    probs[3].pad_left = probs[3].pad_right = 1;
                    /* Grouped, cpg 4, like a small ResNeXt block. */
                    convd_problem_init(&probs[4], 1, 10, 9, 32, 32, 3, 3, 8);
                    probs[4].pad_top = probs[4].pad_left = 1;
                    probs[4].pad_bottom = probs[4].pad_right = 1;
                    for (size_t i = 3; i < 5; i++) {
                        probs[i].dtype = dtypes[d];
                        probs[i].layout = layouts[l];
                        probs[i].has_bias = bias;
                        tu_set_activation(&probs[i], (enum convd_activation)act);
                    }
                    run_cases(c, probs, 5);
                }
    convd_close(c);
}

/* Hundreds of requests in flight from one client, completions collected in whatever order they
 * come; then a second round mixing convd_wait on specific ids with convd_wait_any. */
static void test_pipelined_hundreds(void **state)
{
    (void)state;
    convd_client *c = it_connect(&daemon_, "it-pipeline");
    struct convd_server_info info;
    convd_server_info(c, &info);
    size_t count = info.max_inflight < 300 ? info.max_inflight : 300;
    assert_true(count >= 100); /* "hundreds in flight" needs the daemon to allow that many */

    struct convd_problem *probs = calloc(count, sizeof(*probs));
    struct it_case *cases = calloc(count, sizeof(*cases));
    uint64_t *ids = calloc(count, sizeof(*ids));
    bool *seen = calloc(count, sizeof(*seen));
    assert_non_null(probs);
    assert_non_null(cases);
    assert_non_null(ids);
    assert_non_null(seen);
    uint64_t total = 0;
    for (size_t i = 0; i < count; i++) {
        tu_random_problem(it_rng(), &probs[i], 0, 0, 4);
        total += it_case_span(&probs[i]);
    }
    convd_region *r = NULL;
    assert_int_equal(convd_region_create(c, total, &r), 0);
    uint64_t off = 0;
    for (size_t i = 0; i < count; i++) {
        it_case_init(&cases[i], r, off, &probs[i], it_rng());
        off += cases[i].span;
    }

    for (int round = 0; round < 2; round++) {
        for (size_t i = 0; i < count; i++) {
            if (round > 0)
                it_case_refresh(&cases[i], it_rng());
            struct convd_conv_args a;
            it_case_args(&cases[i], &a);
            a.priority = (unsigned)(i % 4);
            int rc = convd_conv_submit(c, &a, &ids[i]);
            if (rc != 0)
                fail_msg("submit %zu: %s: %s", i, convd_status_name(rc), convd_errstr(c));
            seen[i] = false;
        }
        assert_int_equal(convd_inflight(c), count);
        size_t got = 0, out_of_order = 0;
        /* Second round: wait for a few specific ids first (from the end), then any. */
        if (round == 1) {
            for (size_t j = 0; j < 10; j++) {
                size_t i = count - 1 - j * 7;
                struct convd_completion done;
                assert_int_equal(convd_wait(c, ids[i], TU_TIMEOUT_MS, &done), 0);
                assert_int_equal(done.id, ids[i]);
                if (done.status != 0)
                    fail_msg("request %zu: %s: %s", i, convd_status_name(done.status), done.error);
                assert_false(seen[i]);
                seen[i] = true;
                got++;
                /* Waiting for it again: it is no longer in flight. */
                assert_int_equal(convd_wait(c, ids[i], 0, &done), CONVD_ENOTFOUND);
            }
        }
        while (got < count) {
            struct convd_completion done;
            int rc = convd_wait_any(c, TU_TIMEOUT_MS, &done);
            if (rc != 0)
                fail_msg("wait_any after %zu of %zu: %s: %s", got, count, convd_status_name(rc),
                         convd_errstr(c));
            size_t i = 0;
            while (i < count && ids[i] != done.id)
                i++;
            assert_true(i < count);
            assert_false(seen[i]);
            if (done.status != 0)
                fail_msg("request %zu: %s: %s", i, convd_status_name(done.status), done.error);
            assert_true(done.batch_size >= 1);
            if (i != got)
                out_of_order++;
            seen[i] = true;
            got++;
        }
        assert_int_equal(convd_inflight(c), 0);
        struct convd_completion none;
        assert_int_equal(convd_wait_any(c, 0, &none), CONVD_ENOTFOUND);
        for (size_t i = 0; i < count; i++)
            it_case_check(&cases[i]);
        print_message("round %d: %zu requests in flight, %zu completions out of submission order\n",
                      round, count, out_of_order);
    }
    for (size_t i = 0; i < count; i++)
        it_case_fini(&cases[i]);
    assert_int_equal(convd_region_free(r), 0);
    free(probs);
    free(cases);
    free(ids);
    free(seen);
    convd_close(c);
}

/* Thousands of small requests back to back, alternating between shapes that split into few and
 * many parallel tasks on the CPU backend, each output checked: the daemon's worker runs one
 * problem after another with no pause, the pattern that races a thread pool's run hand-over. */
static void test_thousands_back_to_back(void **state)
{
    (void)state;
    convd_client *c = it_connect(&daemon_, "it-back-to-back");
    enum { SLOTS = 32, TOTAL = 3000 };
    struct convd_problem shapes[2];
    convd_problem_init(&shapes[0], 1, 4, 4, 4, 4, 1, 1, 1);
    convd_problem_init(&shapes[1], 2, 12, 12, 16, 16, 3, 3, 4);
    shapes[1].pad_top = shapes[1].pad_bottom = shapes[1].pad_left = shapes[1].pad_right = 1;
    shapes[1].layout = CONVD_LAYOUT_NHWC;
    struct it_case cases[SLOTS];
    uint64_t ids[SLOTS], total = 0;
    for (int i = 0; i < SLOTS; i++)
        total += it_case_span(&shapes[i % 2]);
    convd_region *r = NULL;
    assert_int_equal(convd_region_create(c, total, &r), 0);
    uint64_t off = 0;
    for (int i = 0; i < SLOTS; i++) {
        it_case_init(&cases[i], r, off, &shapes[i % 2], it_rng());
        off += cases[i].span;
    }
    int submitted = 0, completed = 0;
    for (; submitted < SLOTS; submitted++) {
        struct convd_conv_args a;
        it_case_args(&cases[submitted], &a);
        assert_int_equal(convd_conv_submit(c, &a, &ids[submitted]), 0);
    }
    while (completed < TOTAL) {
        struct convd_completion done;
        int rc = convd_wait_any(c, TU_TIMEOUT_MS, &done);
        if (rc != 0)
            fail_msg("after %d of %d completions: %s (%s)", completed, TOTAL, convd_status_name(rc),
                     convd_errstr(c));
        int i = 0;
        while (i < SLOTS && ids[i] != done.id)
            i++;
        assert_true(i < SLOTS);
        if (done.status != 0)
            fail_msg("request %d: %s (%s)", completed, convd_status_name(done.status), done.error);
        it_case_check(&cases[i]);
        completed++;
        if (submitted < TOTAL) {
            tu_poison((uint8_t *)convd_region_data(r) + cases[i].off_out, cases[i].sz.output_bytes);
            struct convd_conv_args a;
            it_case_args(&cases[i], &a);
            assert_int_equal(convd_conv_submit(c, &a, &ids[i]), 0);
            submitted++;
        }
    }
    for (int i = 0; i < SLOTS; i++)
        it_case_fini(&cases[i]);
    assert_int_equal(convd_region_free(r), 0);
    convd_close(c);
}

/* The event-loop interface: poll() on convd_client_fd, convd_client_process, convd_poll. */
static void test_event_loop_interface(void **state)
{
    (void)state;
    convd_client *c = it_connect(&daemon_, "it-evloop");
    enum { COUNT = 40 };
    struct convd_problem probs[COUNT];
    struct it_case cases[COUNT];
    uint64_t ids[COUNT], total = 0;
    bool seen[COUNT] = {false};
    for (size_t i = 0; i < COUNT; i++) {
        tu_random_problem(it_rng(), &probs[i], 0, 0, 4);
        total += it_case_span(&probs[i]);
    }
    convd_region *r = NULL;
    assert_int_equal(convd_region_create(c, total, &r), 0);
    uint64_t off = 0;
    for (size_t i = 0; i < COUNT; i++) {
        it_case_init(&cases[i], r, off, &probs[i], it_rng());
        off += cases[i].span;
        struct convd_conv_args a;
        it_case_args(&cases[i], &a);
        assert_int_equal(convd_conv_submit(c, &a, &ids[i]), 0);
    }
    struct convd_completion done;
    size_t got = 0;
    uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
    while (got < COUNT) {
        assert_true(tu_now_ms() < end);
        struct pollfd p = {.fd = convd_client_fd(c), .events = POLLIN};
        int n = poll(&p, 1, 1000);
        if (n < 0 && errno == EINTR)
            continue;
        assert_true(n >= 0);
        if (n == 0)
            continue;
        assert_int_equal(convd_client_process(c), 0);
        int rc;
        while ((rc = convd_poll(c, &done)) == 0) {
            size_t i = 0;
            while (i < COUNT && ids[i] != done.id)
                i++;
            assert_true(i < COUNT);
            assert_false(seen[i]);
            seen[i] = true;
            if (done.status != 0)
                fail_msg("request %zu: %s: %s", i, convd_status_name(done.status), done.error);
            got++;
        }
        assert_int_equal(rc, CONVD_EAGAIN);
    }
    assert_int_equal(convd_poll(c, &done), CONVD_EAGAIN);
    for (size_t i = 0; i < COUNT; i++) {
        it_case_check(&cases[i]);
        it_case_fini(&cases[i]);
    }
    assert_int_equal(convd_region_free(r), 0);
    convd_close(c);
}

/* convd_conv: plain buffers in, plain buffer out, the region growing and being reused. */
static void test_blocking_conv(void **state)
{
    (void)state;
    convd_client *c = it_connect(&daemon_, "it-blocking");
    for (int i = 0; i < 24; i++) {
        struct convd_problem p;
        tu_random_problem(it_rng(), &p, 0, 0, i < 12 ? 4 : 12);
        struct convd_problem_sizes z;
        assert_int_equal(convd_problem_sizes(&p, &z, NULL, 0), 0);
        void *in = malloc(z.input_bytes), *w = malloc(z.weight_bytes);
        void *b = p.has_bias ? malloc(z.bias_bytes) : NULL;
        void *out = malloc(z.output_bytes);
        float *ref = malloc(sizeof(float) * z.output_elems);
        assert_true(in && w && out && ref && (b || !p.has_bias));
        tu_fill_random(it_rng(), p.dtype, in, z.input_elems);
        tu_fill_random(it_rng(), p.dtype, w, z.weight_elems);
        if (b != NULL)
            tu_fill_random(it_rng(), p.dtype, b, z.bias_elems);
        tu_poison(out, z.output_bytes);
        tu_ref_conv(&p, in, w, b, ref);
        int rc = convd_conv(c, &p, in, w, b, out);
        if (rc != 0)
            fail_msg("convd_conv: %s: %s", convd_status_name(rc), convd_errstr(c));
        size_t bad = 0;
        double err = tu_rel_error(p.dtype, out, ref, z.output_elems, &bad);
        if (err > tu_tolerance(p.dtype)) {
            char desc[128];
            fail_msg("%s: relative error %g (element %zu)", convd_problem_str(&p, desc, 128), err,
                     bad);
        }
        free(in);
        free(w);
        free(b);
        free(out);
        free(ref);
    }
    /* A bad problem is refused before anything is sent, with the field named. */
    struct convd_problem p;
    convd_problem_init(&p, 1, 8, 8, 6, 8, 3, 3, 4);
    float buf[1024];
    assert_int_equal(convd_conv(c, &p, buf, buf, NULL, buf), CONVD_EGROUPS);
    assert_true(raw_contains(convd_errstr(c), "group"));
    convd_close(c);
}

/* Regions created and freed many times, of many sizes, with tensors spread over several regions
 * at once; neither the daemon nor this process may keep anything afterwards. */
static void test_region_cycles(void **state)
{
    (void)state;
    int my_fds = it_count_fds(getpid());
    int my_maps = it_count_memfd_maps(getpid());
    convd_client *c = it_connect(&daemon_, "it-regions");
    for (int cycle = 0; cycle < 60; cycle++) {
        struct convd_problem p;
        tu_random_problem(it_rng(), &p, 0, 0, 6);
        struct convd_problem_sizes z;
        assert_int_equal(convd_problem_sizes(&p, &z, NULL, 0), 0);
        /* One region per tensor, each larger than needed by a random slack, the tensor at a
         * random aligned offset. */
        uint64_t need[4] = {z.input_bytes, z.weight_bytes, z.bias_bytes, z.output_bytes};
        uint64_t offs[4];
        convd_region *rs[4] = {NULL};
        for (int t = 0; t < 4; t++) {
            if (t == 2 && !p.has_bias)
                continue;
            offs[t] = 64u * (uint64_t)tu_rng_range(it_rng(), 0, 64);
            uint64_t size = offs[t] + need[t] + (uint64_t)tu_rng_range(it_rng(), 0, 100000);
            int rc = convd_region_create(c, size, &rs[t]);
            if (rc != 0)
                fail_msg("region_create(%llu): %s: %s", (unsigned long long)size,
                         convd_status_name(rc), convd_errstr(c));
            assert_true(convd_region_size(rs[t]) >= size);
            /* The memory starts zeroed. */
            const uint8_t *m = convd_region_data(rs[t]);
            assert_int_equal(m[0], 0);
            assert_int_equal(m[size - 1], 0);
        }
        uint8_t *in = (uint8_t *)convd_region_data(rs[0]) + offs[0];
        uint8_t *w = (uint8_t *)convd_region_data(rs[1]) + offs[1];
        uint8_t *b = p.has_bias ? (uint8_t *)convd_region_data(rs[2]) + offs[2] : NULL;
        uint8_t *out = (uint8_t *)convd_region_data(rs[3]) + offs[3];
        tu_fill_random(it_rng(), p.dtype, in, z.input_elems);
        tu_fill_random(it_rng(), p.dtype, w, z.weight_elems);
        if (b != NULL)
            tu_fill_random(it_rng(), p.dtype, b, z.bias_elems);
        tu_poison(out, z.output_bytes);
        float *ref = malloc(sizeof(float) * z.output_elems);
        assert_non_null(ref);
        tu_ref_conv(&p, in, w, b, ref);
        struct convd_conv_args a = CONVD_CONV_ARGS_INIT;
        a.problem = p;
        a.input = (struct convd_tensor){rs[0], offs[0], need[0]};
        a.weight = (struct convd_tensor){rs[1], offs[1], need[1]};
        if (p.has_bias)
            a.bias = (struct convd_tensor){rs[2], offs[2], need[2]};
        a.output = (struct convd_tensor){rs[3], offs[3], need[3]};
        uint64_t id;
        assert_int_equal(convd_conv_submit(c, &a, &id), 0);
        struct convd_completion done;
        assert_int_equal(convd_wait(c, id, TU_TIMEOUT_MS, &done), 0);
        if (done.status != 0)
            fail_msg("%s: %s", convd_status_name(done.status), done.error);
        double err = tu_rel_error(p.dtype, out, ref, z.output_elems, NULL);
        assert_true(err <= tu_tolerance(p.dtype));
        free(ref);
        /* Free in a different order each time. */
        for (int t = 0; t < 4; t++) {
            int k = (t + cycle) % 4;
            assert_int_equal(convd_region_free(rs[k]), 0);
        }
    }
    /* A region freed while a request that uses it is still in flight: the request still
     * completes, and the daemon releases the region afterwards. */
    struct convd_problem p;
    tu_random_problem(it_rng(), &p, CONVD_DTYPE_FP32, 0, 8);
    convd_region *r = NULL;
    assert_int_equal(convd_region_create(c, it_case_span(&p), &r), 0);
    struct it_case t;
    it_case_init(&t, r, 0, &p, it_rng());
    struct convd_conv_args a;
    it_case_args(&t, &a);
    uint64_t id;
    assert_int_equal(convd_conv_submit(c, &a, &id), 0);
    it_case_fini(&t);
    assert_int_equal(convd_region_free(r), 0);
    struct convd_completion done;
    assert_int_equal(convd_wait(c, id, TU_TIMEOUT_MS, &done), 0);
    if (done.status != 0)
        fail_msg("request on a region freed in flight: %s: %s", convd_status_name(done.status),
                 done.error);
    convd_close(c);
    assert_int_equal(it_count_fds(getpid()), my_fds);
    assert_int_equal(it_count_memfd_maps(getpid()), my_maps);
}

/* The library refuses what it can judge itself, with the daemon's codes and a sentence. */
static void test_library_argument_checks(void **state)
{
    (void)state;
    convd_client *c = it_connect(&daemon_, "it-args");
    struct convd_problem p;
    convd_problem_init(&p, 1, 6, 6, 4, 4, 3, 3, 1);
    struct convd_problem_sizes z;
    assert_int_equal(convd_problem_sizes(&p, &z, NULL, 0), 0);
    convd_region *r = NULL;
    assert_int_equal(convd_region_create(c, 4096, &r), 0);
    struct convd_conv_args a = CONVD_CONV_ARGS_INIT;
    a.problem = p;
    a.input = (struct convd_tensor){r, 0, z.input_bytes};
    a.weight = (struct convd_tensor){r, 1024, z.weight_bytes};
    a.output = (struct convd_tensor){r, 2048, z.output_bytes};
    uint64_t id = 12345;

    struct convd_conv_args bad = a;
    bad.problem.c = 0;
    assert_int_equal(convd_conv_submit(c, &bad, &id), CONVD_EBADSHAPE);
    assert_true(strlen(convd_errstr(c)) > 8);
    bad = a;
    bad.problem.k = 6;
    bad.problem.groups = 4;
    assert_int_equal(convd_conv_submit(c, &bad, &id), CONVD_EGROUPS);
    assert_true(raw_contains(convd_errstr(c), "group"));
    bad = a;
    bad.output.offset = 4096 - 8;
    assert_int_equal(convd_conv_submit(c, &bad, &id), CONVD_EBOUNDS);
    assert_true(strlen(convd_errstr(c)) > 8);
    bad = a;
    bad.output.offset = UINT64_MAX - 16;
    assert_int_equal(convd_conv_submit(c, &bad, &id), CONVD_EBOUNDS);
    bad = a;
    bad.input.bytes = z.input_bytes + 4;
    assert_int_equal(convd_conv_submit(c, &bad, &id), CONVD_ESIZE);
    assert_true(strlen(convd_errstr(c)) > 8);
    assert_int_equal(id, 12345); /* ret_* untouched on failure */
    assert_int_equal(convd_inflight(c), 0);

    struct convd_completion done;
    assert_int_equal(convd_wait(c, 999999, 0, &done), CONVD_ENOTFOUND);
    assert_int_equal(convd_wait_any(c, 0, &done), CONVD_ENOTFOUND);
    assert_int_equal(convd_poll(c, &done), CONVD_EAGAIN);

    /* The good request still runs after all that. */
    tu_fill_random(it_rng(), p.dtype, convd_region_data(r), z.input_elems);
    assert_int_equal(convd_conv_submit(c, &a, &id), 0);
    assert_int_equal(convd_wait(c, id, TU_TIMEOUT_MS, &done), 0);
    assert_int_equal(done.status, 0);
    assert_int_equal(convd_region_free(r), 0);
    convd_close(c);

    /* No daemon at a path: ECONNECT and a sentence. */
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    char path[160];
    snprintf(path, sizeof(path), "%s/nobody-here.sock", daemon_.dir);
    o.socket_path = path;
    convd_client *none = NULL;
    assert_int_equal(convd_connect(&o, &none), CONVD_ECONNECT);
    assert_null(none);
    assert_true(strlen(convd_last_connect_error()) > 8);
    convd_close(NULL);
    assert_int_equal(convd_region_free(NULL), 0);
}

/* More of the library's own checks: foreign regions, bad tensors, limits, timeouts. */
static void test_library_edges(void **state)
{
    (void)state;
    convd_client *a = it_connect(&daemon_, "it-edge-a");
    convd_client *b = it_connect(&daemon_, "it-edge-b");
    struct convd_problem p;
    convd_problem_init(&p, 1, 6, 6, 4, 4, 3, 3, 1);
    struct convd_problem_sizes z;
    assert_int_equal(convd_problem_sizes(&p, &z, NULL, 0), 0);
    convd_region *ra = NULL, *rb = NULL;
    assert_int_equal(convd_region_create(a, 8192, &ra), 0);
    assert_int_equal(convd_region_create(b, 8192, &rb), 0);
    struct convd_conv_args args = CONVD_CONV_ARGS_INIT;
    args.problem = p;
    args.input = (struct convd_tensor){rb, 0, z.input_bytes};
    args.weight = (struct convd_tensor){rb, 1024, z.weight_bytes};
    args.output = (struct convd_tensor){rb, 2048, z.output_bytes};
    uint64_t id = 77;

    /* A region of client a in a request of client b: both number their regions the same way, so
     * sending it would silently name b's own region. It must be refused. */
    struct convd_conv_args bad = args;
    bad.output.region = ra;
    int rc = convd_conv_submit(b, &bad, &id);
    if (rc == 0) {
        struct convd_completion done;
        convd_wait(b, id, TU_TIMEOUT_MS, &done);
        fail_msg("a request naming another client's region was sent (completion: %s)",
                 convd_status_name(done.status));
    }
    assert_true(rc == CONVD_EINVAL || rc == CONVD_ENOREGION);
    assert_true(raw_contains(convd_errstr(b), "region"));
    /* No region at all. */
    bad = args;
    bad.input.region = NULL;
    assert_int_equal(convd_conv_submit(b, &bad, &id), CONVD_EINVAL);
    /* Priority out of range. */
    bad = args;
    bad.priority = 4;
    assert_int_equal(convd_conv_submit(b, &bad, &id), CONVD_EINVAL);
    /* A bias the problem asks for but the arguments lack. */
    bad = args;
    bad.problem.has_bias = true;
    rc = convd_conv_submit(b, &bad, &id);
    assert_true(rc == CONVD_EINVAL || rc == CONVD_ESIZE);
    assert_true(raw_contains(convd_errstr(b), "bias"));
    assert_int_equal(id, 77);
    /* convd_conv with a bias problem and no bias pointer. */
    float buf[2048] = {0};
    bad.problem.has_bias = true;
    rc = convd_conv(b, &bad.problem, buf, buf, NULL, buf);
    assert_int_equal(rc, CONVD_EINVAL);
    /* Regions: size 0, more bytes than a client may map. */
    convd_region *r = NULL;
    assert_int_equal(convd_region_create(b, 0, &r), CONVD_EINVAL);
    struct convd_server_info info;
    convd_server_info(b, &info);
    rc = convd_region_create(b, (size_t)info.max_mapped_bytes + 4096, &r);
    assert_int_equal(rc, CONVD_ELIMIT);
    assert_null(r);
    assert_true(strlen(convd_errstr(b)) >= 8);
    /* GPU memory on a CPU daemon. */
    uint8_t handle[64] = {0};
    assert_int_equal(convd_region_import_gpu(b, handle, sizeof(handle), 0, 4096, &r),
                     CONVD_EUNSUPPORTED);
    assert_null(r);

    /* convd_wait with timeout 0 while the request is certainly still running. */
    struct convd_problem heavy;
    it_heavy_problem(&heavy);
    convd_region *rh = NULL;
    assert_int_equal(convd_region_create(b, it_case_span(&heavy), &rh), 0);
    struct it_case hc;
    it_case_init(&hc, rh, 0, &heavy, NULL);
    struct convd_conv_args ha;
    it_case_args(&hc, &ha);
    uint64_t h1, h2;
    assert_int_equal(convd_conv_submit(b, &ha, &h1), 0);
    assert_int_equal(convd_conv_submit(b, &ha, &h2), 0);
    struct convd_completion done;
    assert_int_equal(convd_wait(b, h2, 0, &done), CONVD_ETIMEDOUT);
    assert_int_equal(convd_inflight(b), 2);
    assert_int_equal(convd_wait(b, h2, TU_TIMEOUT_MS, &done), 0);
    assert_int_equal(done.status, 0);
    assert_int_equal(convd_wait(b, h1, TU_TIMEOUT_MS, &done), 0);
    assert_int_equal(done.status, 0);
    assert_int_equal(convd_region_free(rh), 0);

    /* The good request on b still works. */
    assert_int_equal(convd_conv_submit(b, &args, &id), 0);
    assert_int_equal(convd_wait(b, id, TU_TIMEOUT_MS, &done), 0);
    assert_int_equal(done.status, 0);
    assert_int_equal(convd_region_free(ra), 0);
    assert_int_equal(convd_region_free(rb), 0);
    convd_close(a);
    convd_close(b);
}

/* Fake servers: one that accepts and never answers, one that answers garbage, one that speaks
 * another protocol version. convd_connect must fail with the matching code. */
static void fake_server(const char *path, int mode)
{
    int ls = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    /* Bound under another name and renamed once listening: the test connects as soon as the
     * path exists, and between bind and listen a connect is refused (seen under ASan in CI). */
    char tmp[sizeof(sa.sun_path)];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
        _exit(2);
    memcpy(sa.sun_path, tmp, strlen(tmp) + 1);
    if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(ls, 4) != 0 ||
        rename(tmp, path) != 0)
        _exit(2);
    int fd = accept(ls, NULL, NULL);
    if (fd < 0)
        _exit(3);
    uint8_t buf[4096];
    if (recv(fd, buf, sizeof(buf), 0) <= 0)
        _exit(4);
    if (mode == 1) {
        const uint8_t garbage[] = {0x00, 0x01, 0x02, 0xff};
        send(fd, garbage, sizeof(garbage), MSG_NOSIGNAL);
    } else if (mode == 2) {
        Convd__ServerMessage m = CONVD__SERVER_MESSAGE__INIT;
        Convd__HelloReply hr = CONVD__HELLO_REPLY__INIT;
        hr.protocol_version = CONVD_PROTOCOL_VERSION + 1;
        hr.server_version = "9.9.9";
        hr.backend = "cpu";
        hr.device = "fake";
        hr.max_inflight = 1;
        m.msg_case = CONVD__SERVER_MESSAGE__MSG_HELLO_REPLY;
        m.hello_reply = &hr;
        send(fd, buf, convd__server_message__pack(&m, buf), MSG_NOSIGNAL);
    }
    /* Hold the connection until the client goes away. */
    while (recv(fd, buf, sizeof(buf), 0) > 0)
        ;
    _exit(0);
}

static void test_connect_to_wrong_servers(void **state)
{
    (void)state;
    /* Garbage: EPROTO, or EVERSION ("does not speak the convd protocol"), as convd.h allows. */
    const int want[] = {CONVD_ETIMEDOUT, CONVD_EVERSION, CONVD_EVERSION};
    for (int mode = 0; mode < 3; mode++) {
        char path[160];
        snprintf(path, sizeof(path), "%s/fake%d.sock", daemon_.dir, mode);
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
            fake_server(path, mode);
        /* Wait for the socket to appear. */
        uint64_t end = tu_now_ms() + TU_TIMEOUT_MS;
        while (access(path, F_OK) != 0 && tu_now_ms() < end)
            tu_sleep_ms(5);
        struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
        o.socket_path = path;
        o.timeout_ms = 300;
        convd_client *c = NULL;
        int rc = convd_connect(&o, &c);
        if (rc != want[mode] && !(mode == 1 && rc == CONVD_EPROTO)) {
            kill(pid, SIGKILL); /* else it waits in accept and holds ctest's pipe open */
            fail_msg("fake server %d: %s (%s), want %s", mode, convd_status_name(rc),
                     convd_last_connect_error(), convd_status_name(want[mode]));
        }
        assert_null(c);
        assert_true(strlen(convd_last_connect_error()) >= 8);
        int st = it_wait_child(pid);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        unlink(path);
    }
    /* A path that is not a socket, and one too long for sockaddr_un. */
    struct convd_connect_options o = CONVD_CONNECT_OPTIONS_INIT;
    char longpath[300];
    memset(longpath, 'x', sizeof(longpath) - 1);
    longpath[0] = '/';
    longpath[sizeof(longpath) - 1] = '\0';
    const char *paths[] = {"/dev/null", longpath};
    for (int i = 0; i < 2; i++) {
        o.socket_path = paths[i];
        convd_client *c = NULL;
        assert_int_equal(convd_connect(&o, &c), CONVD_ECONNECT);
        assert_null(c);
        assert_true(strlen(convd_last_connect_error()) >= 8);
    }
}

/* Status and metrics describe what happened. */
static void test_status_and_metrics(void **state)
{
    (void)state;
    convd_client *c = it_connect(&daemon_, "it-status");
    struct convd_status before, after;
    assert_int_equal(convd_status_get(c, &before), 0);
    assert_string_equal(before.backend, "cpu");
    assert_int_equal(before.protocol_version, CONVD_PROTOCOL_VERSION);
    assert_true(before.clients >= 2);
    assert_true(strlen(before.server_version) > 0);
    for (int i = 0; i < 3; i++)
        it_one_conv(c, it_rng());
    assert_int_equal(convd_status_get(c, &after), 0);
    assert_true(after.requests_served >= before.requests_served + 3);
    assert_true(after.batches >= before.batches + 1);
    assert_true(after.uptime_ms >= before.uptime_ms);
    uint64_t rtt = 0;
    assert_int_equal(convd_ping(c, &rtt), 0);
    assert_true(rtt > 0);
    assert_int_equal(convd_ping(c, NULL), 0);
    char *text = NULL;
    assert_int_equal(convd_metrics_get(c, &text), 0);
    assert_non_null(text);
    assert_non_null(strstr(text, "# TYPE "));
    assert_non_null(strstr(text, IT_METRIC_REGIONS));
    assert_non_null(strstr(text, IT_METRIC_MAPPED_BYTES));
    free(text);
    /* The regions gauge counts this client's region while it exists. */
    convd_region *r = NULL;
    assert_int_equal(convd_region_create(c, 1 << 20, &r), 0);
    double regions = 0, mapped = 0;
    assert_true(it_metric(c, IT_METRIC_REGIONS, &regions));
    assert_true(it_metric(c, IT_METRIC_MAPPED_BYTES, &mapped));
    /* Nothing else is registered at this point: the gauges are exactly this region. */
    assert_int_equal((uint64_t)regions, 1);
    assert_int_equal((uint64_t)mapped, convd_region_size(r));
    assert_int_equal(convd_region_free(r), 0);
    convd_close(c);
}

/* A request whose deadline passes while it waits behind heavy work is failed with ETIMEDOUT and
 * not run: its output stays poisoned. One with a generous deadline runs normally. */
static void test_deadline_passed_request_fails_not_run(void **state)
{
    (void)state;
    convd_client *c = it_connect(&daemon_, "it-deadline");
    struct convd_problem heavy, p;
    it_heavy_problem(&heavy);
    convd_region *rh = NULL, *rs = NULL, *rg = NULL;
    assert_int_equal(convd_region_create(c, it_case_span(&heavy), &rh), 0);
    struct it_case hc, late, ok;
    it_case_init(&hc, rh, 0, &heavy, NULL);
    tu_random_problem(it_rng(), &p, 0, 0, 6);
    assert_int_equal(convd_region_create(c, it_case_span(&p), &rs), 0);
    assert_int_equal(convd_region_create(c, it_case_span(&p), &rg), 0);
    it_case_init(&late, rs, 0, &p, it_rng());
    it_case_init(&ok, rg, 0, &p, it_rng());

    struct convd_conv_args a;
    uint64_t h1, h2, id_late, id_ok;
    it_case_args(&hc, &a);
    assert_int_equal(convd_conv_submit(c, &a, &h1), 0);
    assert_int_equal(convd_conv_submit(c, &a, &h2), 0);
    it_case_args(&late, &a);
    a.timeout_us = 1000; /* 1 ms: certainly over before two heavy requests are done */
    assert_int_equal(convd_conv_submit(c, &a, &id_late), 0);
    it_case_args(&ok, &a);
    a.timeout_us = (uint64_t)TU_TIMEOUT_MS * 1000u;
    assert_int_equal(convd_conv_submit(c, &a, &id_ok), 0);

    struct convd_completion done;
    assert_int_equal(convd_wait(c, id_late, TU_TIMEOUT_MS, &done), 0);
    if (done.status != CONVD_ETIMEDOUT)
        fail_msg("request past its deadline: %s (%s), want ETIMEDOUT",
                 convd_status_name(done.status), done.error);
    assert_true(strlen(done.error) >= 8);
    const uint8_t *out = (const uint8_t *)convd_region_data(rs) + late.off_out;
    for (uint64_t i = 0; i < late.sz.output_bytes; i++)
        if (out[i] != 0xff)
            fail_msg("a request failed with ETIMEDOUT wrote its output (byte %llu)",
                     (unsigned long long)i);
    assert_int_equal(convd_wait(c, id_ok, TU_TIMEOUT_MS, &done), 0);
    if (done.status != 0)
        fail_msg("request with a generous deadline: %s (%s)", convd_status_name(done.status),
                 done.error);
    it_case_check(&ok);
    assert_int_equal(convd_wait(c, h1, TU_TIMEOUT_MS, &done), 0);
    assert_int_equal(done.status, 0);
    assert_int_equal(convd_wait(c, h2, TU_TIMEOUT_MS, &done), 0);
    assert_int_equal(done.status, 0);
    it_case_fini(&late);
    it_case_fini(&ok);
    assert_int_equal(convd_region_free(rh), 0);
    assert_int_equal(convd_region_free(rs), 0);
    assert_int_equal(convd_region_free(rg), 0);
    convd_close(c);
}

static void test_zz_no_leaks_and_clean_exit(void **state)
{
    (void)state;
    it_daemon_check_clean(&daemon_);
    it_daemon_stop(&daemon_);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_every_dtype_layout_epilogue),
        cmocka_unit_test(test_pipelined_hundreds),
        cmocka_unit_test(test_thousands_back_to_back),
        cmocka_unit_test(test_event_loop_interface),
        cmocka_unit_test(test_blocking_conv),
        cmocka_unit_test(test_region_cycles),
        cmocka_unit_test(test_library_argument_checks),
        cmocka_unit_test(test_library_edges),
        cmocka_unit_test(test_connect_to_wrong_servers),
        cmocka_unit_test(test_status_and_metrics),
        cmocka_unit_test(test_deadline_passed_request_fails_not_run),
        cmocka_unit_test(test_zz_no_leaks_and_clean_exit),
    };
    return cmocka_run_group_tests_name("integration: conv", tests, group_setup, group_teardown);
}
