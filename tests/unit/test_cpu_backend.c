/*
 * The CPU backend through its vtable, as the daemon uses it: init and destroy, supports, memory
 * import (host accepted, device refused with a sentence), and run_batch on jobs whose tensors are
 * views at non-zero offsets into shared host regions, each job checked against the reference and
 * each failure (device memory, out of bounds, too small, misaligned) confined to its own job.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "testutil.h"

static struct tu_rng rng;

static int setup(void **state)
{
    (void)state;
    tu_rng_init(&rng, tu_seed());
    return 0;
}

static void test_init_destroy(void **state)
{
    (void)state;
    const struct convd_backend_ops *ops = &convd_cpu_backend_ops;
    assert_string_equal(ops->name, "cpu");

    struct convd_backend_config cfg = {.threads = 2, .device = -1, .max_batch = 16};
    struct convd_backend_info info;
    void *ctx = NULL;
    char why[160] = "";
    assert_int_equal(ops->init(&cfg, &ctx, &info, why, sizeof(why)), 0);
    assert_non_null(ctx);
    assert_string_equal(info.name, "cpu");
    assert_int_equal(strncmp(info.device, "cpu: 2 threads (", 16), 0);
    assert_int_equal(info.max_workers, 1);
    ops->destroy(ctx);

    cfg.threads = 0; /* one per online CPU */
    assert_int_equal(ops->init(&cfg, &ctx, &info, why, sizeof(why)), 0);
    assert_int_equal(strncmp(info.device, "cpu: ", 5), 0);
    assert_non_null(strchr(info.device, '('));
    ops->destroy(ctx);

    cfg.threads = 1;
    assert_int_equal(ops->init(&cfg, &ctx, &info, why, sizeof(why)), 0);
    assert_int_equal(strncmp(info.device, "cpu: 1 thread (", 15), 0);
    ops->destroy(ctx);

    void *untouched = (void *)&cfg;
    cfg.threads = -3;
    assert_int_equal(ops->init(&cfg, &untouched, &info, why, sizeof(why)), CONVD_EINVAL);
    assert_ptr_equal(untouched, (void *)&cfg);
    assert_non_null(strstr(why, "threads"));
    assert_int_equal(ops->init(NULL, &ctx, &info, NULL, 0), CONVD_EINVAL);
    ops->destroy(NULL);
}

static void test_supports_and_memory(void **state)
{
    (void)state;
    const struct convd_backend_ops *ops = &convd_cpu_backend_ops;
    struct convd_backend_config cfg = {.threads = 1};
    struct convd_backend_info info;
    void *ctx;
    char why[160];
    assert_int_equal(ops->init(&cfg, &ctx, &info, why, sizeof(why)), 0);

    struct convd_problem p;
    convd_problem_init(&p, 1, 5, 5, 6, 9, 3, 3, 3);
    p.dtype = CONVD_DTYPE_BF16;
    p.layout = CONVD_LAYOUT_NHWC;
    assert_int_equal(ops->supports(ctx, &p, why, sizeof(why)), 0);
    /* An invalid problem never reaches supports(): the daemon refuses it first
     * (test_daemon_request). */

    uint8_t buf[64];
    struct convd_mem host = {.kind = CONVD_MEM_HOST, .size = sizeof(buf), .host = buf};
    assert_int_equal(ops->mem_import(ctx, &host, why, sizeof(why)), 0);
    ops->mem_release(ctx, &host);

    struct convd_mem dev = {.kind = CONVD_MEM_DEVICE, .size = 1 << 20, .ipc_offset = 256};
    why[0] = '\0';
    assert_int_equal(ops->mem_import(ctx, &dev, why, sizeof(why)), CONVD_EUNSUPPORTED);
    assert_string_equal(why, "the cpu backend cannot access GPU memory");
    assert_null(dev.device_ptr);

    struct convd_mem odd = {.kind = (enum convd_mem_kind)9, .size = 4, .host = buf};
    assert_int_equal(ops->mem_import(ctx, &odd, why, sizeof(why)), CONVD_EINVAL);
    struct convd_mem unmapped = {.kind = CONVD_MEM_HOST, .size = 4, .host = NULL};
    assert_int_equal(ops->mem_import(ctx, &unmapped, why, sizeof(why)), CONVD_EINVAL);
    ops->destroy(ctx);
}

/* A job whose four tensors are laid out one after another in `mem`, from `offset` on. */
struct job_data {
    struct convd_job job;
    struct convd_problem_sizes z;
    float *ref;
};

static uint64_t place(struct convd_tensor_view *v, struct convd_mem *mem, uint64_t *cursor,
                      uint64_t bytes)
{
    v->mem = mem;
    v->offset = *cursor;
    v->bytes = bytes;
    *cursor += (bytes + 63) / 64 * 64 + 64; /* a gap, so that neighbours are not contiguous */
    return v->offset;
}

static void job_make(struct job_data *d, const struct convd_problem *p, struct convd_mem *mem,
                     uint64_t *cursor)
{
    memset(d, 0, sizeof(*d));
    d->job.problem = *p;
    assert_int_equal(convd_problem_sizes(p, &d->z, NULL, 0), 0);
    uint8_t *base = mem->host;
    uint64_t xo = place(&d->job.input, mem, cursor, d->z.input_bytes);
    uint64_t wo = place(&d->job.weight, mem, cursor, d->z.weight_bytes);
    uint64_t bo = 0;
    if (p->has_bias)
        bo = place(&d->job.bias, mem, cursor, d->z.bias_bytes);
    uint64_t yo = place(&d->job.output, mem, cursor, d->z.output_bytes);
    assert_true(*cursor <= mem->size);
    tu_fill_random(&rng, p->dtype, base + xo, d->z.input_elems);
    tu_fill_random(&rng, p->dtype, base + wo, d->z.weight_elems);
    if (p->has_bias)
        tu_fill_random(&rng, p->dtype, base + bo, d->z.bias_elems);
    tu_poison(base + yo, d->z.output_bytes);
    d->ref = malloc(d->z.output_elems * sizeof(float));
    assert_non_null(d->ref);
    tu_ref_conv(p, base + xo, base + wo, p->has_bias ? base + bo : NULL, d->ref);
    d->job.status = 12345;
}

static void job_check_ok(struct job_data *d)
{
    if (d->job.status != 0) {
        print_error("job failed: %d %s\n", d->job.status, d->job.error);
        fail();
    }
    assert_true(d->job.exec_ns > 0);
    const uint8_t *y = (const uint8_t *)d->job.output.mem->host + d->job.output.offset;
    double err = tu_rel_error(d->job.problem.dtype, y, d->ref, d->z.output_elems, NULL);
    assert_true(err <= tu_tolerance(d->job.problem.dtype));
}

static void test_run_batch(void **state)
{
    (void)state;
    const struct convd_backend_ops *ops = &convd_cpu_backend_ops;
    struct convd_backend_config cfg = {.threads = 3};
    struct convd_backend_info info;
    void *ctx;
    char why[160];
    assert_int_equal(ops->init(&cfg, &ctx, &info, why, sizeof(why)), 0);

    const uint64_t region = 8u << 20;
    struct convd_mem mem = {.kind = CONVD_MEM_HOST, .size = region, .host = malloc(region)};
    assert_non_null(mem.host);
    memset(mem.host, 0, region);
    assert_int_equal(ops->mem_import(ctx, &mem, why, sizeof(why)), 0);

    enum { NJOBS = 7 };
    struct job_data d[NJOBS];
    uint64_t cursor = 192; /* nothing starts at the region's first byte */
    for (int i = 0; i < NJOBS; i++) {
        struct convd_problem p;
        if (i < 5) {
            tu_random_problem(&rng, &p, 0, 0, 10); /* small: run side by side */
        } else {
            convd_problem_init(&p, 1, 20, 20, 48, 48, 3, 3, 2); /* > 8 MFLOP: whole pool */
            p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
            p.layout = i == 5 ? CONVD_LAYOUT_NHWC : CONVD_LAYOUT_NCHW;
            p.dtype = i == 5 ? CONVD_DTYPE_FP32 : CONVD_DTYPE_FP16;
            p.has_bias = true;
            p.activation = CONVD_ACT_RELU;
        }
        job_make(&d[i], &p, &mem, &cursor);
    }
    /* Jobs reach run_batch admitted (backend.h): views outside their region, of the wrong size,
     * splitting elements or in GPU memory are the daemon's to refuse (test_daemon_request,
     * test_daemon_regions). */

    struct convd_job *jobs[NJOBS];
    for (int i = 0; i < NJOBS; i++)
        jobs[i] = &d[i].job;
    assert_int_equal(ops->run_batch(ctx, 0, jobs, NJOBS), 0);

    for (int i = 0; i < NJOBS; i++)
        job_check_ok(&d[i]);

    /* The same jobs again, one at a time, then an empty batch. */
    for (int i = 0; i < NJOBS; i++) {
        tu_poison((uint8_t *)mem.host + d[i].job.output.offset, d[i].z.output_bytes);
        assert_int_equal(ops->run_batch(ctx, 0, &jobs[i], 1), 0);
        job_check_ok(&d[i]);
    }
    assert_int_equal(ops->run_batch(ctx, 0, NULL, 0), 0);

    for (int i = 0; i < NJOBS; i++)
        free(d[i].ref);
    ops->mem_release(ctx, &mem);
    free(mem.host);
    ops->destroy(ctx);
}

/* Many small jobs with one thread and with several give the same bits. */
static void test_batch_threads_agree(void **state)
{
    (void)state;
    const struct convd_backend_ops *ops = &convd_cpu_backend_ops;
    const uint64_t region = 4u << 20;
    struct convd_mem mem = {.kind = CONVD_MEM_HOST, .size = region, .host = malloc(region)};
    assert_non_null(mem.host);
    enum { NJOBS = 8 };
    struct job_data d[NJOBS];
    struct convd_job *jobs[NJOBS];
    uint64_t cursor = 64;
    for (int i = 0; i < NJOBS; i++) {
        struct convd_problem p;
        tu_random_problem(&rng, &p, 0, 0, 12);
        job_make(&d[i], &p, &mem, &cursor);
        jobs[i] = &d[i].job;
    }
    uint8_t *first = malloc(region);
    assert_non_null(first);
    for (int threads = 1; threads <= 4; threads += 3) {
        struct convd_backend_config cfg = {.threads = threads};
        struct convd_backend_info info;
        void *ctx;
        char why[160];
        assert_int_equal(ops->init(&cfg, &ctx, &info, why, sizeof(why)), 0);
        assert_int_equal(ops->run_batch(ctx, 0, jobs, NJOBS), 0);
        for (int i = 0; i < NJOBS; i++)
            job_check_ok(&d[i]);
        if (threads == 1)
            memcpy(first, mem.host, region);
        else
            assert_memory_equal(first, mem.host, region);
        ops->destroy(ctx);
    }
    free(first);
    for (int i = 0; i < NJOBS; i++)
        free(d[i].ref);
    free(mem.host);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_destroy),
        cmocka_unit_test(test_supports_and_memory),
        cmocka_unit_test(test_run_batch),
        cmocka_unit_test(test_batch_threads_agree),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
