/*
 * Test support shared by unit, integration and GPU tests: a naive direct-loop convolution in
 * double precision (the oracle the CPU backend is checked against), random tensors, poisoning
 * and comparison by relative error.
 */
#ifndef CONVD_TESTUTIL_H
#define CONVD_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "convd/conv.h"

/* How long any wait of a test may take before the test fails: long enough for an ASan build on a
 * loaded two-core machine. Correctness never depends on it. */
#define TU_TIMEOUT_MS 120000

/* Milliseconds since an arbitrary start (CLOCK_MONOTONIC). */
uint64_t tu_now_ms(void);

/* Sleeps a few milliseconds (used only by polling loops). */
void tu_sleep_ms(int ms);

/* Seed for this test process: $CONVD_TEST_SEED if set, else fresh from the clock and pid. The
 * seed is printed to stderr once so that a failure can be replayed. */
uint64_t tu_seed(void);

/* xorshift64* generator. */
struct tu_rng {
    uint64_t s;
};
void tu_rng_init(struct tu_rng *g, uint64_t seed);
uint64_t tu_rng_next(struct tu_rng *g);
/* Uniform integer in [lo, hi]. */
int tu_rng_range(struct tu_rng *g, int lo, int hi);
/* Uniform float in [-1, 1). */
float tu_rng_float(struct tu_rng *g);

/* Fills `count` elements of dtype with uniform values in [-1, 1), never all zero. */
void tu_fill_random(struct tu_rng *g, enum convd_dtype dtype, void *data, size_t count);

/* Sets every byte to 0xff: a NaN in fp32, fp16 and bf16, so any element a kernel forgets to
 * write fails the comparison. */
void tu_poison(void *data, size_t bytes);

/* A memfd called name (as /proc/PID/maps shows it: "/memfd:name"), sealable, of size bytes, with
 * the given seals added (F_SEAL_* bits, 0 for none). Aborts the test with a message when any step
 * fails. */
int tu_memfd(const char *name, uint64_t size, unsigned seals);

/* Reads element i of a tensor of dtype as float. */
float tu_load(enum convd_dtype dtype, const void *data, size_t i);

/* Direct convolution in double precision, straight from the definition in conv.h. Inputs are
 * in the problem's dtype and layout; the result is written as float to ref (output_elems
 * elements, the problem's output layout), before any rounding to the dtype. The problem must be
 * valid. */
void tu_ref_conv(const struct convd_problem *p, const void *input, const void *weight,
                 const void *bias, float *ref);

/* Relative error of an output (in the problem's dtype) against the reference:
 * ||out - ref||_2 / max(||ref||_2, tiny). Returns INFINITY if any element is NaN or infinite
 * while the reference is finite there; *ret_bad_index (may be NULL) gets the first such element,
 * or the element of largest absolute error. */
double tu_rel_error(enum convd_dtype dtype, const void *out, const float *ref, size_t count,
                    size_t *ret_bad_index);

/* The relative-error tolerance per dtype used by numeric tests: 1e-4 fp32, 1e-2 fp16 and bf16
 * (inputs rounded to the dtype, fp32 accumulation, one final rounding). fp32 was 1e-5 until a
 * random problem with four outputs, three of them zeroed by ReLU and the fourth 50x smaller than
 * its terms, measured 1.2e-5 from accumulation order alone (test_cpu_conv, CI seed
 * 11465520243125233); 1e-4 still fails TF32 (about 1e-3) and every indexing error. */
double tu_tolerance(enum convd_dtype dtype);

/* The tolerance for p: tu_tolerance's, but 3e-3 for fp32 problems that allow TF32. Products of
 * operands rounded to TF32 (10-bit mantissa, |error| <= 2^-11 each) put random data's relative
 * error near 3e-4; a missing tap or channel among K terms costs about 1 / sqrt(K), above 3e-3 for
 * every K below 100,000. */
double tu_tolerance_of(const struct convd_problem *p);

/* The activation of p applied to y, in double, from the definitions (PyTorch's), written apart
 * from the library's own so that the two check each other. */
double tu_ref_act(const struct convd_problem *p, double y);

/* Sets p's activation, with clamp's bounds at -0.25 and 0.5 (cutting both ways on the tests'
 * data) and 0 for the others. */
void tu_set_activation(struct convd_problem *p, enum convd_activation act);

/* A random activation for p (any of them, relu most often; clamp with random bounds). */
void tu_random_activation(struct tu_rng *g, struct convd_problem *p);

/* Random stride and dilation (1 or 2 each way) and padding (0-2 on each side). */
void tu_random_geometry(struct tu_rng *g, struct convd_problem *p);

/* A random valid problem: dims, groups with channels per group in 1..max_cpg (odd sizes
 * included), stride 1-2, dilation 1-2, asymmetric padding, layout and dtype as given
 * (0: random). Sizes are kept small enough for the naive reference. */
void tu_random_problem(struct tu_rng *g, struct convd_problem *p, enum convd_dtype dtype,
                       enum convd_layout layout, int max_cpg);

#endif
