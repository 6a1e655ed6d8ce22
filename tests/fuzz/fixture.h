/*
 * What the request and ring fuzzers validate against: one connection's regions on real sealed
 * memfds, registered with the null backend (whose supports() is convd_problem_check()), and the
 * checks of what a successful req_validate() promises. make_seeds uses the region table to write
 * requests that pass.
 */
#ifndef CONVD_FUZZ_FIXTURE_H
#define CONVD_FUZZ_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "convd.pb-c.h"
#include "regions.h"
#include "request.h"

/* One region of the fixture: `size` bytes from the start of memfd `file`. Regions of the same
 * file alias each other, which is what the overlap check must see through. */
struct fx_region_spec {
    uint64_t id;
    uint64_t size;
    unsigned file;
    bool write_sealed; /* a read-only region: inputs may live there, outputs may not */
};

static const struct fx_region_spec fx_regions[] = {
    {1, 1u << 20, 0, false},
    {2, 4096, 1, false},
    {3, 64u << 10, 2, true},
    {4, 7, 3, false},                                 /* smaller than most tensors, and odd */
    {5, 256u << 10, 0, false},                        /* the first quarter of region 1's memfd */
    {(uint64_t)1 << 63, (uint64_t)6 << 30, 4, false}, /* past 32 bits; never touched */
};

#define FX_N_REGIONS (sizeof(fx_regions) / sizeof(fx_regions[0]))
#define FX_N_FILES   5

/* Fails the run (abort, which libFuzzer reports with the input) when cond is false. NDEBUG is
 * set in this build type, so assert() would check nothing. */
#define FX_CHECK(cond)                                                                             \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fx_fail(__FILE__, __LINE__, #cond);                                                    \
    } while (0)

_Noreturn void fx_fail(const char *file, int line, const char *what);

/* The backend and region table, made on first use and kept for the process's life. */
struct convd_backend *fx_backend(void);
struct region_table *fx_regions_table(void);

/* A failure from a function that promises "the code with a sentence in why": a negative code
 * and a non-empty, NUL-terminated sentence within why_len bytes. */
void fx_check_sentence(int rc, const char *why, size_t why_len);

/* Everything req_validate() promises when it returns 0 for pb under ctx: the problem and sizes,
 * every view inside its region (and its mapping) with the problem's byte count, element-aligned,
 * the output in a writable region and overlapping no input (judged from the fixture's own table
 * of files, not by region_ranges_overlap()), an id not in flight and room under the limit. */
void fx_check_valid(const Convd__ConvRequest *pb, const struct req_context *ctx,
                    const struct dreq *r);

/* Checks that fixture region i has held[i] references (none when held is NULL). */
void fx_check_refs(const int *held);

/* Adds sign to uses[i] for each tensor of r in fixture region i. */
void fx_count_uses(const struct dreq *r, int *uses, int sign);

/* Takes and drops the references of a validated request, checking the counts on the way; no
 * other references may be held. */
void fx_ref_unref(struct dreq *r);

/* The reference count of fixture region i (index into fx_regions). */
int fx_region_refs(size_t i);

/* The index into fx_regions of a region, or FX_N_REGIONS when it is not one of them. */
size_t fx_region_index(const struct region *reg);

#endif
