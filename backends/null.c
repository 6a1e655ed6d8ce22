/*
 * The null backend: convd_null_backend_ops, selected only by name (`--backend null`). It accepts
 * every valid problem and completes every job at once without computing anything, so
 * that the daemon's serving path (socket, rings, validation, queue, batching, completions) can
 * be measured and profiled alone, on any machine. Its device string says so, and the daemon
 * logs it at start; status and metrics name it.
 *
 * It is asynchronous like the GPU backend (launch, then query), so the daemon runs the same
 * loop for it as for a GPU; a launched batch is done by the next query. With the daemon's
 * null_launch_us, null_launch_item_us and null_exec_us it models a device instead: each launch
 * call busy-waits the host time a driver's launch takes, and a batch is done null_exec_us after
 * its launch returned (slots run side by side, as streams do). Its notify then wakes the daemon
 * at once, so the loop polls while a modelled batch runs. With device_timing each job reports
 * the model's batch time (null_exec_us) as its device time, which is how the daemon's timing
 * metric is tested without a GPU.
 *
 * With lanes it keeps the GPU's rule for them too: on a GPU, importing or releasing client memory
 * waits for the device, and so for every word a lane waits on (docs/architecture.md, "Lanes"),
 * so the daemon must not ask while a lane has a batch. Here an import is refused then (a
 * release, which cannot fail, is logged as an error) instead of stalling, which is how the
 * tests see it.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "clock.h"
#include "log.h"

#define NULLB_SLOTS      4
#define NULLB_LANES      4
#define NULLB_LANE_DEPTH 4
#define NULLB_ALL        (NULLB_SLOTS + NULLB_LANES * NULLB_LANE_DEPTH)

struct nullb_slot {
    struct convd_job *const *jobs;
    size_t n;
    uint64_t done_ns; /* the modelled batch is done from then on */
    uint64_t lane_seq; /* lanes: the batch's place in its lane (1, 2, ...) */
    bool started;      /* lanes: its words came and it is first in its lane */
};

struct nullb_ctx {
    struct nullb_slot slots[NULLB_ALL];
    unsigned nslots; /* NULLB_SLOTS, or NULLB_ALL with lanes */
    /* Per lane: batches launched, and batches finished (they finish in order). */
    uint64_t lane_launched[NULLB_LANES], lane_finished[NULLB_LANES];
    uint64_t launch_ns, launch_item_ns, exec_ns; /* the model; all 0: none */
    bool timing;                                 /* report exec_ns as device_ns */
    /* Lane batches launched and not yet reported done: set by launch threads, read by the loop. */
    atomic_uint lane_pending;
};

/* The lane of a lane slot (slot >= NULLB_SLOTS). */
static unsigned nullb_lane(unsigned slot)
{
    return (slot - NULLB_SLOTS) / NULLB_LANE_DEPTH;
}

static int nullb_why(char *why, size_t len, int code, const char *text)
{
    if (why != NULL && len > 0)
        snprintf(why, len, "%s", text);
    return code;
}

static int nullb_init(const struct convd_backend_config *cfg, void **ret_ctx,
                      struct convd_backend_info *ret_info, char *why, size_t why_len)
{
    if (cfg == NULL || ret_ctx == NULL || ret_info == NULL)
        return nullb_why(why, why_len, CONVD_EINVAL, "null backend: init called with NULL");
    struct nullb_ctx *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return nullb_why(why, why_len, CONVD_ENOMEM, "null backend: out of memory");
    ctx->launch_ns = cfg->null_launch_ns;
    ctx->launch_item_ns = cfg->null_launch_item_ns;
    ctx->exec_ns = cfg->null_exec_ns;
    ctx->timing = cfg->device_timing;
    struct convd_backend_info info;
    memset(&info, 0, sizeof(info));
    snprintf(info.name, sizeof(info.name), "null");
    if (ctx->launch_ns == 0 && ctx->launch_item_ns == 0 && ctx->exec_ns == 0)
        snprintf(info.device, sizeof(info.device),
                 "null: completes requests without computing (serving-path benchmark only)");
    else
        snprintf(info.device, sizeof(info.device),
                 "null: a model, launches %u us + %u us a request, batches %u us; computes "
                 "nothing (serving-path benchmark only)",
                 (unsigned)(ctx->launch_ns / 1000), (unsigned)(ctx->launch_item_ns / 1000),
                 (unsigned)(ctx->exec_ns / 1000));
    info.max_workers = 1;
    info.max_slots = NULLB_SLOTS;
    ctx->nslots = NULLB_SLOTS;
    if (cfg->device_waits) {
        info.lanes = NULLB_LANES;
        info.lane_depth = NULLB_LANE_DEPTH;
        ctx->nslots = NULLB_ALL;
    }
    *ret_ctx = ctx;
    *ret_info = info;
    return 0;
}

static void nullb_destroy(void *ctx)
{
    free(ctx);
}

/* Every valid problem (the daemon checked p before asking). */
static int nullb_supports(void *ctx, const struct convd_problem *p, char *why, size_t why_len)
{
    (void)ctx, (void)p, (void)why, (void)why_len;
    return 0;
}

static int nullb_mem_import(void *vctx, struct convd_mem *m, char *why, size_t why_len)
{
    struct nullb_ctx *ctx = vctx;
    if (m == NULL)
        return nullb_why(why, why_len, CONVD_EINVAL, "null backend: memory is NULL");
    if (atomic_load(&ctx->lane_pending) > 0)
        return nullb_why(why, why_len, CONVD_EINTERNAL,
                         "null backend: an import while a lane has a batch (a GPU would wait for "
                         "the lane's words here)");
    if (m->kind != CONVD_MEM_HOST)
        return nullb_why(why, why_len, CONVD_EUNSUPPORTED,
                         "the null backend cannot open GPU memory");
    m->device_words = true; /* its "device" reads and writes the daemon's mapping */
    return 0;
}

static void nullb_mem_release(void *vctx, struct convd_mem *m)
{
    struct nullb_ctx *ctx = vctx;
    (void)m;
    if (atomic_load(&ctx->lane_pending) > 0)
        log_err("null backend: a release while a lane has a batch (a GPU would wait for the "
                "lane's words here)");
}

static void nullb_complete(struct convd_job *const *jobs, size_t n, uint64_t device_ns)
{
    for (size_t i = 0; i < n; i++) {
        jobs[i]->status = 0;
        jobs[i]->error[0] = '\0';
        jobs[i]->exec_ns = 0;
        jobs[i]->device_ns = device_ns;
    }
}

static int nullb_run_batch(void *ctx, unsigned worker, struct convd_job *const *jobs, size_t n)
{
    (void)ctx;
    (void)worker;
    nullb_complete(jobs, n, 0); /* no model here: nothing was timed */
    return 0;
}

static int nullb_launch(void *vctx, unsigned slot, struct convd_job *const *jobs, size_t n)
{
    struct nullb_ctx *ctx = vctx;
    if (slot >= ctx->nslots) {
        for (size_t i = 0; i < n; i++) {
            jobs[i]->status = CONVD_EINVAL;
            snprintf(jobs[i]->error, sizeof(jobs[i]->error), "null backend: slot %u out of range",
                     slot);
        }
        return CONVD_EINVAL;
    }
    ctx->slots[slot].jobs = jobs;
    ctx->slots[slot].n = n;
    uint64_t now = convd_now_ns();
    const uint64_t until = now + ctx->launch_ns + ctx->launch_item_ns * n;
    while (now < until) /* the driver's host time: the calling thread is busy, as in a launch */
        now = convd_now_ns();
    ctx->slots[slot].done_ns = now + ctx->exec_ns;
    ctx->slots[slot].started = slot < NULLB_SLOTS;
    if (slot >= NULLB_SLOTS) {
        ctx->slots[slot].lane_seq = ++ctx->lane_launched[nullb_lane(slot)];
        atomic_fetch_add(&ctx->lane_pending, 1);
    }
    return 0;
}

/* A job's ready word has reached its value (cyclically, as cuStreamWaitValue32's GEQ). */
static bool nullb_ready(const struct convd_job *j)
{
    if (j->ready_mem == NULL)
        return true;
    _Atomic uint32_t *w = (_Atomic uint32_t *)(void *)((char *)j->ready_mem->host + j->ready_offset);
    return (int32_t)(atomic_load_explicit(w, memory_order_acquire) - j->ready_value) >= 0;
}

/* A lane's batch starts once it is first in its lane and its words have come; the model's time
 * counts from then. */
static bool nullb_lane_started(struct nullb_ctx *ctx, unsigned slot)
{
    struct nullb_slot *s = &ctx->slots[slot];
    if (s->started)
        return true;
    if (ctx->lane_finished[nullb_lane(slot)] + 1 != s->lane_seq)
        return false;
    for (size_t i = 0; i < s->n; i++)
        if (!nullb_ready(s->jobs[i]))
            return false;
    s->started = true;
    s->done_ns = convd_now_ns() + ctx->exec_ns;
    return true;
}

static int nullb_query(void *vctx, unsigned slot)
{
    struct nullb_ctx *ctx = vctx;
    if (slot < ctx->nslots && ctx->slots[slot].jobs != NULL) {
        struct nullb_slot *s = &ctx->slots[slot];
        if (!nullb_lane_started(ctx, slot))
            return 0;
        if (ctx->exec_ns != 0 && convd_now_ns() < s->done_ns)
            return 0;
        nullb_complete(s->jobs, s->n, ctx->timing ? ctx->exec_ns : 0);
        if (slot >= NULLB_SLOTS) {
            ctx->lane_finished[nullb_lane(slot)]++;
            atomic_fetch_sub(&ctx->lane_pending, 1);
            /* As a device's stream does after a lane's batch: the done words, release. */
            for (size_t i = 0; i < s->n; i++) {
                const struct convd_job *j = s->jobs[i];
                if (j->gate_mem != NULL)
                    atomic_store_explicit(
                        (_Atomic uint32_t *)(void *)((char *)j->gate_mem->host + j->gate_offset),
                        j->gate_value, memory_order_release);
            }
        }
        s->jobs = NULL;
        s->n = 0;
    }
    return 1;
}

static int nullb_notify(void *ctx, unsigned slot, void (*fn)(void *), void *arg)
{
    (void)ctx;
    (void)slot;
    fn(arg);
    return 0;
}

const struct convd_backend_ops convd_null_backend_ops = {
    .name = "null",
    .init = nullb_init,
    .destroy = nullb_destroy,
    .supports = nullb_supports,
    .mem_import = nullb_mem_import,
    .mem_release = nullb_mem_release,
    .run_batch = nullb_run_batch,
    .launch = nullb_launch,
    .query = nullb_query,
    .notify = nullb_notify,
};
