/*
 * The GPU backend of the daemon (convd_gpu_backend_ops, name "gpu"): device selection and
 * warm-up, per-slot device memory pools, pinning of host regions, opening of client IPC handles,
 * and asynchronous execution: launch enqueues a batch on one of GPU_SLOTS slots (staging copies
 * of host tensors, every group of same-geometry jobs in one convd_gpu_conv() call, copies of
 * host outputs back) and returns; query and notify report its end. run_batch is launch, a wait
 * on the slot's event (or stream), and the same completion as query.
 *
 * A slot owns a stream, a completion event recorded after its batch's last operation (or, with
 * completion flags, a word of mapped host memory that the stream writes instead), one device
 * block for staged tensors and kernel workspace, and host scratch. The pool grows geometrically
 * when a batch needs more, is reused across batches, is capped by
 * convd_backend_config.pool_bytes (default: a quarter of the device across the slots), and trim
 * frees it above GPU_POOL_KEEP once idle. A group whose staging exceeds the cap runs in several
 * chunks, which reuse the pool one after another in stream order (no host wait between them); a
 * single job that exceeds it fails with CONVD_ENOMEM. Jobs of a chunk that name the same host
 * bytes (shared weights) stage them once.
 *
 * Lanes (device_waits, backend.h): GPU_LANES more streams of GPU_LANE_DEPTH slots each, for
 * stream-ordered requests. A lane's batch starts with a cuStreamWaitValue32 (GEQ) on each job's
 * ready word in the client's pinned, mapped host region, and ends, like every batch with
 * device_gates, by storing its jobs' done words from the stream: the client's stream and the
 * lane hand over through host memory without the daemon's loop. A lane's slots share its stream,
 * so its batches run in launch order. They are opened only with completion words and a driver
 * that passes a wait at start.
 *
 * mem_import of host memory that cannot be pinned succeeds anyway (pageable copies) and leaves a
 * sentence in `why` saying so, for the caller to log.
 *
 * Compiled as CUDA by nvcc (through vendor.h, which maps the HIP names used here to CUDA) and as
 * HIP by hipcc. The daemon never sees this file's types: it talks to it through backend.h.
 *
 * Threading (backend.h): init, destroy, mem_import, mem_release, query, notify and trim run on
 * the daemon's loop thread, launch there or on its launch threads (several at once, each on
 * its own slot); run_batch runs on up to
 * GPU_WORKERS worker threads at once, worker w on slot w, so everything a batch touches (stream,
 * event, pool, scratch) is per slot and needs no lock. A daemon uses either run_batch or
 * launch/query, never both on one slot at a time. The IPC cache has a lock anyway, because it is
 * cheap and makes the tests' use from several threads safe. A runtime's current device is per
 * thread, so every entry point that calls the runtime sets it first.
 *
 * Errors never abort: a failed runtime call becomes CONVD_EDEVICE (CONVD_ENOMEM for allocations)
 * with the runtime's own sentence. A sticky error (the context is lost: an illegal address, a
 * dead device) is detected by probing the stream after the failure; from then on the backend
 * refuses all work with the first such sentence, so that the daemon can report it and stop.
 */
#include <assert.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vendor.h"
#include "problem_priv.h"

extern "C" {
#include "backend.h"
#include "why.h"
#include "convd_kernels.h"
}

#ifdef CONVD_GPU_NVIDIA
/* Types of the driver API only: cuMemGetAddressRange is looked up through the runtime
 * (cudaGetDriverEntryPointByVersion), so the daemon does not link libcuda and still starts, on
 * the CPU backend, where no NVIDIA driver is installed. */
#include <cudaTypedefs.h>
#endif

/* All of this file is host code. hipcc's device pass would still emit the ops table, and with it
 * references to host functions, into the GPU code object; so that pass sees nothing. */
#if !defined(__HIP_DEVICE_COMPILE__)

#define GPU_WORKERS 2 /* run_batch callers at once (max_workers); worker w runs on slot w */
/* Batches in flight at once (max_slots), one stream each: copies of one batch overlap compute of
 * another, and the loop always has a free slot while the GPU works on the others. The daemon
 * uses GPU_DEFAULT_SLOTS unless its `slots` says otherwise: with many clients whose requests do
 * not batch (patched models), batches in flight are what bounds the requests served. */
#define GPU_SLOTS         16
#define GPU_DEFAULT_SLOTS 4
/* Lanes (device_waits): one stream per client that uses one, and how many of its requests may be
 * on that stream at once; ahead of the device by this many, the loop's turn-around (tens of
 * microseconds) stays off the client's chain. */
#define GPU_LANES      16
#define GPU_LANE_DEPTH 8
#define GPU_ALL_SLOTS  (GPU_SLOTS + GPU_LANES * GPU_LANE_DEPTH)
/* How often query asks a lane slot's stream whether it failed: a lane's batch may wait on its
 * client for milliseconds, and a lane slot per client request would otherwise cost a driver call
 * each GPU_PROBE_NS. */
#define GPU_LANE_PROBE_NS (20 * 1000 * 1000)
/* A lane's staging pool, allocated when the lanes open and shared by its slots (they run one
 * after another on its stream). It never grows: allocating device memory waits for the device,
 * so for every lane's pending wait, which may need this very launch to finish first (measured:
 * the H100 test and the models stalled until the watchdog). */
#define GPU_LANE_POOL ((size_t)64 << 20)
#define GPU_ALIGN        256 /* staging buffers start at this alignment (vector loads, cp.async) */
#define GPU_POOL_GRAIN   ((size_t)2 << 20)  /* pool sizes are rounded up to this */
#define GPU_POOL_MIN_CAP ((size_t)64 << 20) /* a pool cap never below this */
#define GPU_POOL_KEEP    ((size_t)64 << 20) /* trim frees pools larger than this */
#define GPU_WHY          160                /* sizeof(convd_job.error) */
/* With completion flags, how long query trusts the word alone before it asks the stream too:
 * a failed batch never writes its word, and the stream's query is what reports the error. */
#define GPU_PROBE_NS (1000 * 1000)
/* Completion words, one cache line apart so that the device's writes to one slot's word do not
 * touch the line the loop reads for another's. */
#define GPU_FLAG_STRIDE 16

static_assert(sizeof(hipIpcMemHandle_t) == CONVD_IPC_HANDLE_SIZE,
              "the wire's IPC handle size must match the runtime's");
static_assert(GPU_WORKERS <= GPU_SLOTS, "run_batch's workers run on slots");

/* One opened IPC allocation, shared by every region whose handle has the same bytes. */
struct gpu_ipc {
    struct gpu_ipc *next;
    uint8_t handle[CONVD_IPC_HANDLE_SIZE];
    char *ptr;      /* what hipIpcOpenMemHandle returned: the allocation's base */
    uint64_t avail; /* bytes from ptr to the end of the allocation */
    unsigned refs;
};

/* be_priv of an imported region. */
struct gpu_mem {
    int pinned;          /* HOST: registered by us, to unregister at release */
    void *dev;           /* HOST, pinned: the mapping's device address (gate words), or NULL */
    struct gpu_ipc *ipc; /* DEVICE: the cache entry holding one reference for this region */
};

/* Where one job's tensors live during a chunk: an offset into the slot's pool for a staged host
 * tensor, GPU_IN_PLACE for a tensor in device memory, GPU_ABSENT for no bias. */
#define GPU_IN_PLACE UINT64_MAX
#define GPU_ABSENT   (UINT64_MAX - 1)
struct gpu_plan {
    uint64_t input, weight, bias, output;
};

/* A host tensor already staged in this chunk, so that jobs sharing weights (or inputs) copy them
 * once. */
struct gpu_stage {
    const struct convd_mem *mem;
    uint64_t offset, bytes, stage;
};

/* One convd_gpu_conv call of a launch: the jobs order[first, first + count) of one geometry,
 * their distinct staged host tensors stages[stage_first, stage_first + nstage) at pool offsets
 * below `staged`, and the workspace that follows them. */
struct gpu_chunk {
    size_t first, count;
    size_t stage_first, nstage;
    uint64_t staged;
    size_t ws_bytes;
    uint64_t output_bytes; /* per job: the size of a host output's copy back */
};

struct gpu_slot {
    hipStream_t stream;
    bool own_stream; /* created (and destroyed) by this slot; a lane's other slots share it */
    bool shared_pool; /* a lane's slot whose pool belongs to the lane's first slot */
    bool lane;       /* a lane's slot: its jobs' ready words are waited on */
    hipEvent_t done; /* recorded after the last operation of a launch */
    char *pool;      /* device memory for staging and workspace, grown on demand */
    /* With lanes open, a shared slot's pool comes from the stream-ordered allocator and goes
     * back to it on the slot's stream: cudaMalloc and cudaFree wait for the device, so for every
     * lane's pending wait (NVIDIA only; lanes are). Whether this pool came from there. */
    bool pool_async;
    size_t pool_cap; /* its size */
    /* Scratch sized for the largest batch seen (trim returns it to the configured batch). */
    size_t scratch_n;
    struct convd_job **order; /* the batch, grouped by problem */
    unsigned char *taken;
    struct convd_tensors *tensors; /* one chunk's, read by convd_gpu_conv before it returns */
    struct gpu_plan *plans;        /* per order[] entry */
    struct gpu_stage *stages;      /* at most three per job */
    struct gpu_chunk *chunks;
    struct convd_job **pending; /* the jobs whose work is on the stream */
    /* Completion flags (gpu_ctx.flags): the stream writes seq to *flag after the batch. */
    uint32_t *flag;    /* host address, read by query */
    void *flag_dev;    /* the same word, as the device addresses it */
    uint32_t seq;      /* the value of the batch in flight */
    uint64_t probe_ns; /* when query asks the stream next */
    /* Device timing (gpu_ctx.timing): events around the batch's work on the stream. */
    hipEvent_t t_start, t_end;
    bool timed; /* both were recorded for the batch in flight */
    /* The batch in flight: set by launch, cleared when query (or run_batch) reports it. */
    int busy; /* the event is recorded and its batch not reported yet */
    size_t npending;
    uint64_t t_launch;
};

#ifdef CONVD_GPU_NVIDIA
/* NVML, for the device's utilisation (the runtime has no call for it). libnvidia-ml comes with
 * the driver, not the toolkit, so it is loaded at run time like libcuda, and these few
 * declarations (NVML's documented ABI) stand in for its header. */
typedef int gpu_nvml_ret; /* nvmlReturn_t: 0 is NVML_SUCCESS */
typedef struct gpu_nvml_dev_st *gpu_nvml_dev;
struct gpu_nvml_util {
    unsigned int gpu, memory; /* nvmlUtilization_t: percent of the last sample period */
};
struct gpu_nvml {
    /* NULL: no NVML, no utilisation gauges */
    gpu_nvml_ret (*utilization)(gpu_nvml_dev, struct gpu_nvml_util *);
    gpu_nvml_dev dev;
};
#endif

struct gpu_ctx {
    int device;
    size_t pool_limit;   /* per slot */
    size_t scratch_keep; /* jobs per batch that trim keeps scratch for */
    struct gpu_slot slots[GPU_ALL_SLOTS];
    unsigned nslots; /* GPU_SLOTS, or GPU_ALL_SLOTS with lanes */
    pthread_mutex_t ipc_lock;
    struct gpu_ipc *ipcs;
    pthread_mutex_t broken_lock;
    int broken; /* read without the lock as a hint, decided under it */
    char broken_why[GPU_WHY];
    /* Completion flags: GPU_ALL_SLOTS words of mapped host memory, or NULL where the driver refused
     * (or the configuration asked for events). */
    uint32_t *flags;
    bool timing;   /* the configuration's device_timing */
    bool priority; /* the configuration's stream_priority */
    bool gates;    /* the configuration's device_gates */
    bool waits;    /* the configuration's device_waits: open lanes where the driver can */
#ifdef CONVD_GPU_NVIDIA
    PFN_cuMemGetAddressRange_v3020 get_range;
    PFN_cuStreamWriteValue32_v11070 write_value;
    PFN_cuStreamWaitValue32_v11070 wait_value; /* lanes only */
    struct gpu_nvml nvml;
#endif
};

static uint64_t gpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* "<runtime sentence> (<error name>)", or the name alone where the runtime's sentence is the
 * name (HIP's often is: "hipErrorNoDevice (hipErrorNoDevice)" said nothing twice). */
static const char *gpu_err_text(hipError_t e, char *buf, size_t len)
{
    const char *text = hipGetErrorString(e), *name = hipGetErrorName(e);
    if (text == NULL || name == NULL || strcmp(text, name) == 0)
        snprintf(buf, len, "%s", name != NULL ? name : "unknown error");
    else
        snprintf(buf, len, "%s (%s)", text, name);
    return buf;
}

/* Writes "<what>: <runtime sentence> (<error name>)" and returns the status a caller reports:
 * CONVD_ENOMEM for an allocation failure, CONVD_EDEVICE for everything else. */
static int gpu_fail(hipError_t e, char *why, size_t why_len, const char *what)
{
    char err[192];
    return why_fail(why, why_len, e == hipErrorOutOfMemory ? CONVD_ENOMEM : CONVD_EDEVICE, "%s: %s",
                    what, gpu_err_text(e, err, sizeof(err)));
}

/* Checks one runtime call inside a function that has `int rc`, `char *why`, `size_t why_len`
 * and a `finish` label. */
#define GPU_TRY(call, what)                                                                        \
    do {                                                                                           \
        hipError_t e_ = (call);                                                                    \
        if (e_ != hipSuccess) {                                                                    \
            rc = gpu_fail(e_, why, why_len, what);                                                 \
            goto finish;                                                                           \
        }                                                                                          \
    } while (0)

static size_t gpu_round_up(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

/* ---- broken state ---- */

static bool gpu_is_broken(struct gpu_ctx *ctx, char *why, size_t why_len)
{
    if (!__atomic_load_n(&ctx->broken, __ATOMIC_ACQUIRE))
        return false;
    pthread_mutex_lock(&ctx->broken_lock);
    (void)why_fail(why, why_len, 0, "%s", ctx->broken_why);
    pthread_mutex_unlock(&ctx->broken_lock);
    return true;
}

static void gpu_set_broken(struct gpu_ctx *ctx, const char *sentence)
{
    pthread_mutex_lock(&ctx->broken_lock);
    if (!ctx->broken) {
        snprintf(ctx->broken_why, sizeof ctx->broken_why, "GPU unusable after %.140s", sentence);
        __atomic_store_n(&ctx->broken, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&ctx->broken_lock);
}

/* After a failure on a slot's stream: waits for whatever was queued (no copy may land in host
 * memory after its batch is reported done or failed), clears a non-sticky error, and probes the
 * stream once more. A sticky error (the context is lost) fails the probe too; then the backend is
 * broken. This is the one place outside run_batch where the launching thread waits for the GPU, and
 * only after an error. */
static bool gpu_settle_after_error(struct gpu_ctx *ctx, struct gpu_slot *s, const char *sentence)
{
    (void)hipStreamSynchronize(s->stream);
    (void)hipGetLastError();
    hipError_t e = hipSuccess;
    if (s->pool)
        e = hipMemsetAsync(s->pool, 0, 1, s->stream);
    if (e == hipSuccess)
        e = hipStreamSynchronize(s->stream);
    if (e == hipSuccess)
        return false;
    (void)hipGetLastError();
    gpu_set_broken(ctx, sentence);
    return true;
}

/* ---- the per-slot pool and scratch ---- */

/* ordered: on the slot's stream where the pool came from the stream-ordered allocator (the
 * stream must live); otherwise, or at close, a plain free, which waits for the device. */
static void gpu_pool_free(struct gpu_slot *s, bool ordered)
{
    if (s->pool && !s->shared_pool) {
#ifdef CONVD_GPU_NVIDIA
        if (s->pool_async && ordered)
            (void)cudaFreeAsync(s->pool, s->stream);
        else
            (void)hipFree(s->pool);
#else
        (void)ordered;
        (void)hipFree(s->pool);
#endif
        (void)hipGetLastError();
    }
    s->pool = NULL;
    s->pool_async = false;
    __atomic_store_n(&s->pool_cap, (size_t)0, __ATOMIC_RELAXED);
}

static hipError_t gpu_pool_alloc(struct gpu_slot *s, void **p, size_t bytes, bool async)
{
#ifdef CONVD_GPU_NVIDIA
    if (async)
        return cudaMallocAsync(p, bytes, s->stream);
#else
    (void)s;
    (void)async;
#endif
    return hipMalloc(p, bytes);
}

/* Makes the slot's pool hold at least `need` bytes (need <= ctx->pool_limit). Nothing of ours is
 * queued on the slot's stream here (a launch reserves once, for its largest chunk, before it
 * enqueues anything, and the slot's previous batch has been reported done; the warm-up waits for
 * its stream), so the old block can go. Grows geometrically to reuse one block across batches of
 * slowly growing size. */
static int gpu_pool_reserve(struct gpu_ctx *ctx, struct gpu_slot *s, size_t need, char *why,
                            size_t why_len)
{
    if (need <= s->pool_cap)
        return 0;
    if (s->lane)
        return why_fail(why, why_len, CONVD_ENOMEM,
                        "the request needs %zu bytes of device staging, more than a lane's %zu",
                        need, s->pool_cap);
    size_t want = s->pool_cap * 2;
    if (want < need)
        want = need;
    want = gpu_round_up(want, GPU_POOL_GRAIN);
    if (want > ctx->pool_limit)
        want = ctx->pool_limit > need ? ctx->pool_limit : need;
    gpu_pool_free(s, true);
    void *p = NULL;
    /* Lane slots never grow (above), so with lanes open this is a shared slot. */
    const bool async = ctx->nslots == GPU_ALL_SLOTS;
    hipError_t e = gpu_pool_alloc(s, &p, want, async);
    if (e == hipErrorOutOfMemory && want > need) {
        (void)hipGetLastError();
        want = need;
        e = gpu_pool_alloc(s, &p, want, async);
    }
    if (e != hipSuccess) {
        (void)hipGetLastError();
        char what[96];
        snprintf(what, sizeof what, "allocating %zu bytes of device staging memory", want);
        return gpu_fail(e, why, why_len, what);
    }
    s->pool = (char *)p;
    s->pool_async = async;
    __atomic_store_n(&s->pool_cap, want, __ATOMIC_RELAXED); /* stats read it on the loop */
    return 0;
}

static void gpu_scratch_free(struct gpu_slot *s)
{
    free(s->order);
    free(s->taken);
    free(s->tensors);
    free(s->plans);
    free(s->stages);
    free(s->chunks);
    free(s->pending);
    s->order = NULL;
    s->taken = NULL;
    s->tensors = NULL;
    s->plans = NULL;
    s->stages = NULL;
    s->chunks = NULL;
    s->pending = NULL;
    s->scratch_n = 0;
}

/* Makes the slot's scratch hold a batch of n jobs. Only while the slot is free: pending[] of a
 * batch in flight lives here. */
static int gpu_scratch_reserve(struct gpu_slot *s, size_t n)
{
    if (n <= s->scratch_n)
        return 0;
    size_t want = n < 64 ? 64 : n;
    struct convd_job **order = (struct convd_job **)realloc(s->order, want * sizeof *order);
    if (order)
        s->order = order;
    unsigned char *taken = (unsigned char *)realloc(s->taken, want);
    if (taken)
        s->taken = taken;
    struct convd_tensors *t = (struct convd_tensors *)realloc(s->tensors, want * sizeof *t);
    if (t)
        s->tensors = t;
    struct gpu_plan *plans = (struct gpu_plan *)realloc(s->plans, want * sizeof *plans);
    if (plans)
        s->plans = plans;
    struct gpu_stage *stages = (struct gpu_stage *)realloc(s->stages, 3 * want * sizeof *stages);
    if (stages)
        s->stages = stages;
    struct gpu_chunk *chunks = (struct gpu_chunk *)realloc(s->chunks, want * sizeof *chunks);
    if (chunks)
        s->chunks = chunks;
    struct convd_job **pending = (struct convd_job **)realloc(s->pending, want * sizeof *pending);
    if (pending)
        s->pending = pending;
    if (!order || !taken || !t || !plans || !stages || !chunks || !pending)
        return CONVD_ENOMEM;
    s->scratch_n = want;
    return 0;
}

/* ---- jobs ---- */

static void gpu_job_fail(struct convd_job *j, int status, const char *sentence)
{
    j->status = status;
    snprintf(j->error, sizeof j->error, "%s", sentence);
}

/* Checks one tensor view of a job: imported memory, enough bytes, inside its region. The daemon
 * has checked all of this; the one check it repeats on purpose, since the views drive DMA: a
 * mistake here would write over foreign memory instead of failing one request. */
static int gpu_view_check(const struct convd_tensor_view *v, uint64_t need, size_t esz,
                          const char *name, char *why, size_t why_len)
{
    const struct convd_mem *m = v->mem;
    if (!m || !m->be_priv) {
        return why_fail(why, why_len, CONVD_EINVAL,
                        "the %s tensor's memory is not imported into the GPU backend", name);
    }
    if ((m->kind == CONVD_MEM_HOST && !m->host) ||
        (m->kind == CONVD_MEM_DEVICE && !m->device_ptr) ||
        (m->kind != CONVD_MEM_HOST && m->kind != CONVD_MEM_DEVICE)) {
        return why_fail(why, why_len, CONVD_EINVAL, "the %s tensor's memory has no usable mapping",
                        name);
    }
    if (v->bytes < need) {
        return why_fail(why, why_len, CONVD_ESIZE,
                        "the %s tensor has %llu bytes, the problem needs %llu", name,
                        (unsigned long long)v->bytes, (unsigned long long)need);
    }
    if (v->offset > m->size || need > m->size - v->offset) {
        return why_fail(why, why_len, CONVD_EBOUNDS,
                        "the %s tensor (offset %llu, %llu bytes) exceeds its %llu-byte region",
                        name, (unsigned long long)v->offset, (unsigned long long)need,
                        (unsigned long long)m->size);
    }
    /* Kernels read whole elements in place from device memory: a misaligned address there would
     * be a misaligned-access fault, which kills the context for every client. The daemon refuses
     * such a tensor when it decodes the request (daemon/request.c). */
    assert(m->kind != CONVD_MEM_DEVICE || ((uintptr_t)m->device_ptr + v->offset) % esz == 0);
    (void)esz;
    return 0;
}

static int gpu_job_check(const struct convd_job *j, const struct convd_problem_sizes *sz, char *why,
                         size_t why_len)
{
    const size_t esz = convd_dtype_size(j->problem.dtype);
    int rc = gpu_view_check(&j->input, sz->input_bytes, esz, "input", why, why_len);
    if (rc == 0)
        rc = gpu_view_check(&j->weight, sz->weight_bytes, esz, "weight", why, why_len);
    if (rc == 0 && j->problem.has_bias)
        rc = gpu_view_check(&j->bias, sz->bias_bytes, esz, "bias", why, why_len);
    if (rc == 0)
        rc = gpu_view_check(&j->output, sz->output_bytes, esz, "output", why, why_len);
    return rc;
}

/* Plans one read-only tensor: in place for device memory, else a pool offset, shared with an
 * identical view staged earlier in the chunk. Returns the offset; *total grows by new bytes. */
static uint64_t gpu_plan_read(const struct convd_tensor_view *v, uint64_t bytes,
                              struct gpu_stage *stages, size_t *nstages, uint64_t *total)
{
    if (v->mem->kind == CONVD_MEM_DEVICE)
        return GPU_IN_PLACE;
    for (size_t i = 0; i < *nstages; i++)
        if (stages[i].mem == v->mem && stages[i].offset == v->offset && stages[i].bytes == bytes)
            return stages[i].stage;
    struct gpu_stage *s = &stages[(*nstages)++];
    s->mem = v->mem;
    s->offset = v->offset;
    s->bytes = bytes;
    s->stage = *total;
    *total += gpu_round_up(bytes, GPU_ALIGN);
    return s->stage;
}

static void gpu_plan_job(const struct convd_job *j, const struct convd_problem_sizes *sz,
                         struct gpu_plan *pl, struct gpu_stage *stages, size_t *nstages,
                         uint64_t *total)
{
    pl->input = gpu_plan_read(&j->input, sz->input_bytes, stages, nstages, total);
    pl->weight = gpu_plan_read(&j->weight, sz->weight_bytes, stages, nstages, total);
    pl->bias = j->problem.has_bias ? gpu_plan_read(&j->bias, sz->bias_bytes, stages, nstages, total)
                                   : GPU_ABSENT;
    if (j->output.mem->kind == CONVD_MEM_DEVICE) {
        pl->output = GPU_IN_PLACE;
    } else {
        pl->output = *total;
        *total += gpu_round_up(sz->output_bytes, GPU_ALIGN);
    }
}

static void *gpu_resolve(struct gpu_slot *s, const struct convd_tensor_view *v, uint64_t plan)
{
    if (plan == GPU_ABSENT)
        return NULL;
    if (plan == GPU_IN_PLACE)
        return (char *)v->mem->device_ptr + v->offset;
    return s->pool + plan;
}

/* Plans one group of same-geometry jobs, order[base, base + n): fails the jobs whose problem or
 * views are wrong, or that alone exceed the pool limit, and cuts the rest into chunks whose
 * staging plus workspace fits the pool limit, each one convd_gpu_conv call, appended to
 * s->chunks. *nchunks, *nstages and *max_need (the largest chunk's pool bytes) grow. */
static void gpu_plan_group(struct gpu_ctx *ctx, struct gpu_slot *s, size_t base, size_t n,
                           size_t *nchunks, size_t *nstages, uint64_t *max_need)
{
    struct convd_job **group = s->order + base;
    char why[GPU_WHY];
    const struct convd_problem *p = &group[0]->problem;
    /* Admitted jobs (backend.h): the problem was checked at the request's decoding, with
     * supports() (convd_gpu_check) among it. */
    assert(convd_gpu_check(p, NULL, 0) == 0);
    struct convd_problem_sizes sz;
    convd_problem_sizes_of(p, &sz);
    int rc = 0;
    /* The views are admitted too; they are checked once more before any DMA touches them (a
     * mistake there would write over foreign memory instead of failing one request), and the
     * jobs that fail are dropped, keeping the order of the rest. */
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        rc = gpu_job_check(group[i], &sz, why, sizeof why);
        if (rc != 0)
            gpu_job_fail(group[i], rc, why);
        else
            group[kept++] = group[i];
    }
    size_t start = 0;
    while (start < kept) {
        /* Grow the chunk while staging plus workspace stays under the pool limit. A job tried
         * and left out writes at most three stages past the chunk's, all its own. */
        struct gpu_stage *stages = s->stages + *nstages;
        uint64_t total = 0;
        size_t nstage = 0, count = 0, ws_bytes = 0;
        while (start + count < kept) {
            uint64_t t = total;
            size_t ns = nstage, ws = 0;
            gpu_plan_job(group[start + count], &sz, &s->plans[base + start + count], stages, &ns,
                         &t);
            rc = convd_gpu_workspace(p, count + 1, &ws);
            if (rc != 0 || t + ws > ctx->pool_limit)
                break;
            total = t;
            nstage = ns;
            ws_bytes = ws;
            count++;
        }
        if (count == 0) {
            struct convd_job *j = group[start];
            if (rc != 0)
                snprintf(why, sizeof why, "the GPU kernels cannot size their workspace: %s",
                         convd_strerror(rc));
            else
                snprintf(why, sizeof why,
                         "the job needs more device staging memory than the GPU pool's %zu-byte "
                         "limit",
                         ctx->pool_limit);
            gpu_job_fail(j, rc != 0 ? rc : CONVD_ENOMEM, why);
            start++;
            continue;
        }
        struct gpu_chunk *c = &s->chunks[(*nchunks)++];
        c->first = base + start;
        c->count = count;
        c->stage_first = *nstages;
        c->nstage = nstage;
        c->staged = total;
        c->ws_bytes = ws_bytes;
        c->output_bytes = sz.output_bytes;
        *nstages += nstage;
        if (total + ws_bytes > *max_need)
            *max_need = total + ws_bytes;
        start += count;
    }
}

/* Enqueues one chunk on the slot's stream: copies of its staged host tensors to the pool, one
 * convd_gpu_conv call, copies of its host outputs back. Waits for nothing: the chunk before it
 * in the stream is done with the pool before these copies start. Returns 0, or a CONVD_E* code
 * with the sentence in why (part of the chunk may be on the stream then). */
static int gpu_enqueue_chunk(struct gpu_slot *s, const struct gpu_chunk *c, char *why,
                             size_t why_len)
{
    int rc = 0;
    struct convd_job **jobs = s->order + c->first;
    const struct gpu_plan *plans = s->plans + c->first;
    const struct convd_problem *p = &jobs[0]->problem;
    /* Host-to-device copies, one per distinct staged view. */
    for (size_t i = 0; i < c->nstage; i++) {
        const struct gpu_stage *g = &s->stages[c->stage_first + i];
        GPU_TRY(hipMemcpyAsync(s->pool + g->stage, (const char *)g->mem->host + g->offset, g->bytes,
                               hipMemcpyHostToDevice, s->stream),
                "copying a tensor to the device");
    }
    for (size_t i = 0; i < c->count; i++) {
        const struct convd_job *j = jobs[i];
        s->tensors[i].input = gpu_resolve(s, &j->input, plans[i].input);
        s->tensors[i].weight = gpu_resolve(s, &j->weight, plans[i].weight);
        s->tensors[i].bias = gpu_resolve(s, &j->bias, plans[i].bias);
        s->tensors[i].output = gpu_resolve(s, &j->output, plans[i].output);
    }
    {
        void *ws = c->ws_bytes ? s->pool + c->staged : NULL;
        rc = convd_gpu_conv(p, s->tensors, c->count, ws, c->ws_bytes, (void *)s->stream);
        if (rc != 0) {
            hipError_t e = hipGetLastError();
            if (rc == CONVD_EDEVICE && e != hipSuccess)
                rc = gpu_fail(e, why, why_len, "launching the convolution kernel");
            else if (rc == CONVD_EDEVICE)
                (void)why_fail(why, why_len, 0, "launching the convolution kernel failed");
            else if (convd_gpu_check(p, why, why_len) == 0)
                (void)why_fail(why, why_len, 0, "the GPU kernels refused the problem: %s",
                               convd_strerror(rc));
            goto finish;
        }
    }
    for (size_t i = 0; i < c->count; i++) {
        if (plans[i].output == GPU_IN_PLACE)
            continue;
        const struct convd_job *j = jobs[i];
        GPU_TRY(hipMemcpyAsync((char *)j->output.mem->host + j->output.offset,
                               s->pool + plans[i].output, c->output_bytes, hipMemcpyDeviceToHost,
                               s->stream),
                "copying an output to the host");
    }
finish:
    return rc;
}

/* Fails every job of the batch that has no status of its own yet (launch starts them all at
 * CONVD_EINTERNAL without a sentence). */
static void gpu_fail_rest(struct convd_job *const *jobs, size_t n, int status, const char *why)
{
    for (size_t i = 0; i < n; i++)
        if (jobs[i]->status == CONVD_EINTERNAL && jobs[i]->error[0] == '\0')
            gpu_job_fail(jobs[i], status, why);
}

/* The stream's last operation of a batch: the completion word's new value, or the event. */
static hipError_t gpu_mark_done(struct gpu_ctx *ctx, struct gpu_slot *s)
{
    if (!ctx->flags)
        return hipEventRecord(s->done, s->stream);
    s->seq++;
    s->probe_ns = s->t_launch + (s->lane ? GPU_LANE_PROBE_NS : GPU_PROBE_NS);
#ifdef CONVD_GPU_NVIDIA
    /* The default flags put a system-wide fence before the write: when the loop sees the word,
     * the batch's outputs (host copies included) are visible. */
    CUresult r =
        ctx->write_value((CUstream)s->stream, (CUdeviceptr)(uintptr_t)s->flag_dev, s->seq, 0);
    /* The driver's codes are the runtime's for the errors this call returns. */
    return r == CUDA_SUCCESS ? cudaSuccess : (cudaError_t)r;
#else
    return hipStreamWriteValue32(s->stream, s->flag_dev, s->seq, 0);
#endif
}

/* With device_gates, after the batch's work: each gated job's done word, stored by the stream
 * (the default flags fence each store behind the outputs, host copies included), so that the
 * client's stream, which waits on that word, goes on when the batch ends rather than when the
 * loop sees it end. A store the driver refuses is left to the loop, which stores every word
 * again when it reports the job; a broken context shows at the completion word next. */
static void gpu_store_gates(struct gpu_ctx *ctx, struct gpu_slot *s)
{
    if ((!ctx->gates && !s->lane) || !ctx->flags)
        return;
    for (size_t i = 0; i < s->npending; i++) {
        const struct convd_job *j = s->pending[i];
        const struct gpu_mem *gm =
            j->gate_mem != NULL ? (const struct gpu_mem *)j->gate_mem->be_priv : NULL;
        if (gm == NULL || gm->dev == NULL)
            continue;
        char *addr = (char *)gm->dev + j->gate_offset;
#ifdef CONVD_GPU_NVIDIA
        (void)ctx->write_value((CUstream)s->stream, (CUdeviceptr)(uintptr_t)addr, j->gate_value, 0);
#else
        if (hipStreamWriteValue32(s->stream, addr, j->gate_value, 0) != hipSuccess)
            (void)hipGetLastError();
#endif
    }
}

/* A lane's batch, after its pool is reserved (freeing the old block would wait for the device,
 * and so for these words) and before anything else of it on the stream: a wait on each job's
 * ready word (GEQ: cyclic on NVIDIA, as the protocol says; HIP compares unsigned). Returns 0, or
 * a code with the sentence in why when a wait cannot be queued: then the batch must not run
 * (the daemon's lanes hold one job a batch, so no other wait of it is on the stream). */
static int gpu_wait_ready(struct gpu_ctx *ctx, struct gpu_slot *s, struct convd_job *const *jobs,
                          size_t n, char *why, size_t why_len)
{
    for (size_t i = 0; i < n; i++) {
        struct convd_job *j = jobs[i];
        if (j->ready_mem == NULL)
            continue;
        const struct gpu_mem *gm = (const struct gpu_mem *)j->ready_mem->be_priv;
        if (!s->lane || gm == NULL || gm->dev == NULL)
            return why_fail(why, why_len, CONVD_EINTERNAL,
                            "a ready word outside a lane, or in memory the device cannot reach");
        char *addr = (char *)gm->dev + j->ready_offset;
#ifdef CONVD_GPU_NVIDIA
        CUresult r = ctx->wait_value((CUstream)s->stream, (CUdeviceptr)(uintptr_t)addr,
                                     j->ready_value, CU_STREAM_WAIT_VALUE_GEQ);
        hipError_t e = r == CUDA_SUCCESS ? cudaSuccess : (cudaError_t)r;
#else
        (void)ctx;
        hipError_t e = hipStreamWaitValue32(s->stream, addr, j->ready_value, hipStreamWaitValueGte,
                                            0xFFFFFFFFu);
#endif
        if (e != hipSuccess) {
            (void)hipGetLastError();
            return gpu_fail(e, why, why_len, "queueing the wait for a ready word");
        }
    }
    return 0;
}

static int gpu_launch(void *vctx, unsigned slot, struct convd_job *const *jobs, size_t n)
{
    struct gpu_ctx *ctx = (struct gpu_ctx *)vctx;
    char why[GPU_WHY];
    int rc = 0;
    if (n == 0)
        return 0;
    if (!ctx || !jobs)
        return CONVD_EINVAL;
    struct gpu_slot *s = slot < ctx->nslots ? &ctx->slots[slot] : NULL;
    for (size_t i = 0; i < n; i++) {
        jobs[i]->status = CONVD_EINTERNAL;
        jobs[i]->error[0] = '\0';
        jobs[i]->exec_ns = 0;
        jobs[i]->device_ns = 0;
    }
    if (!s) {
        snprintf(why, sizeof why, "slot %u out of range (the GPU backend has %u)", slot,
                 ctx->nslots);
        rc = CONVD_EINVAL;
        goto fail_all;
    }
    if (s->busy) {
        /* The caller's mistake; the batch in flight stays as it is. */
        snprintf(why, sizeof why, "slot %u still has a batch in flight", slot);
        rc = CONVD_EBUSY;
        goto fail_all;
    }
    if (gpu_is_broken(ctx, why, sizeof why)) {
        rc = CONVD_EDEVICE;
        goto fail_all;
    }
    {
        hipError_t e = hipSetDevice(ctx->device);
        if (e != hipSuccess) {
            /* The device was usable at init; losing it is not something one request caused. */
            gpu_fail(e, why, sizeof why, "selecting the device");
            gpu_set_broken(ctx, why);
            gpu_is_broken(ctx, why, sizeof why);
            rc = CONVD_EDEVICE;
            goto fail_all;
        }
    }
    if (gpu_scratch_reserve(s, n) != 0) {
        snprintf(why, sizeof why, "out of host memory for a batch of %zu jobs", n);
        rc = CONVD_ENOMEM;
        goto fail_all;
    }
    s->t_launch = gpu_now_ns();
    s->npending = 0;
    {
        /* Plan everything first: the pool is sized once, for the largest chunk, while nothing
         * of this slot is on the stream; after that the chunks only reuse it. */
        size_t placed = 0, nchunks = 0, nstages = 0;
        uint64_t max_need = 0;
        memset(s->taken, 0, n);
        for (size_t i = 0; i < n; i++) {
            if (s->taken[i])
                continue;
            size_t g = 0;
            for (size_t k = i; k < n; k++) {
                if (!s->taken[k] && convd_problem_same(&jobs[i]->problem, &jobs[k]->problem)) {
                    s->taken[k] = 1;
                    s->order[placed + g++] = jobs[k];
                }
            }
            gpu_plan_group(ctx, s, placed, g, &nchunks, &nstages, &max_need);
            placed += g;
        }
        if (nchunks == 0)
            return 0; /* every job failed before reaching the device */
        rc = gpu_pool_reserve(ctx, s, (size_t)max_need, why, sizeof why);
        if (rc != 0) {
            if (gpu_settle_after_error(ctx, s, why))
                goto broken;
            gpu_fail_rest(jobs, n, rc, why);
            return 0;
        }
        rc = gpu_wait_ready(ctx, s, jobs, n, why, sizeof why);
        if (rc != 0) {
            gpu_fail_rest(jobs, n, rc, why);
            return 0;
        }
        /* Timing is a diagnostic: an event that cannot be recorded leaves the batch untimed,
         * and a context that is broken says so at the batch's own operations. */
        s->timed = ctx->timing && hipEventRecord(s->t_start, s->stream) == hipSuccess;
        if (ctx->timing && !s->timed)
            (void)hipGetLastError();
        bool queued = false;
        for (size_t ci = 0; ci < nchunks; ci++) {
            const struct gpu_chunk *c = &s->chunks[ci];
            queued = true; /* a failing chunk may have left part of itself on the stream */
            rc = gpu_enqueue_chunk(s, c, why, sizeof why);
            if (rc == 0) {
                for (size_t i = 0; i < c->count; i++)
                    s->pending[s->npending++] = s->order[c->first + i];
                continue;
            }
            /* A runtime failure may be the context's: settle (which waits for the stream) and
             * probe. A refused problem fails its chunk alone. */
            if ((rc == CONVD_EDEVICE || rc == CONVD_ENOMEM) && gpu_settle_after_error(ctx, s, why))
                goto broken;
            for (size_t i = 0; i < c->count; i++)
                gpu_job_fail(s->order[c->first + i], rc, why);
        }
        if (queued) {
            if (s->timed && hipEventRecord(s->t_end, s->stream) != hipSuccess) {
                s->timed = false;
                (void)hipGetLastError();
            }
            gpu_store_gates(ctx, s);
            hipError_t e = gpu_mark_done(ctx, s);
            if (e != hipSuccess) {
                gpu_fail(e, why, sizeof why,
                         ctx->flags ? "writing the batch's completion word"
                                    : "recording the batch's completion event");
                if (gpu_settle_after_error(ctx, s, why))
                    goto broken;
                /* The stream is idle now, but nothing says whether its work succeeded. */
                gpu_fail_rest(jobs, n, CONVD_EDEVICE, why);
                s->npending = 0;
                return 0;
            }
            s->busy = 1;
        }
    }
    return 0;
broken:
    /* gpu_settle_after_error has waited for the stream: nothing is in flight. */
    gpu_is_broken(ctx, why, sizeof why);
    gpu_fail_rest(jobs, n, CONVD_EDEVICE, why);
    s->npending = 0;
    return CONVD_EDEVICE;
fail_all:
    for (size_t i = 0; i < n; i++)
        gpu_job_fail(jobs[i], rc, why);
    /* Out of host memory fails this batch only; a bad slot or a lost device is the backend's (or
     * its caller's) problem, reported as the return value too. */
    return rc == CONVD_ENOMEM ? 0 : rc;
}

/* Reports the slot's batch, whose event answered e: on success every enqueued job succeeded;
 * otherwise they fail with the runtime's sentence, after a probe that breaks the backend on a
 * sticky error. The slot is free afterwards. Returns true when the backend is broken. */
static bool gpu_slot_finish(struct gpu_ctx *ctx, struct gpu_slot *s, hipError_t e)
{
    char why[GPU_WHY] = "";
    bool broken = false;
    uint64_t dt = gpu_now_ns() - s->t_launch;
    if (e != hipSuccess) {
        gpu_fail(e, why, sizeof why, "running the convolution");
        (void)hipGetLastError();
        (void)hipSetDevice(ctx->device);
        broken = gpu_settle_after_error(ctx, s, why);
    }
    uint64_t device_ns = 0;
    float ms = 0;
    /* The end event precedes the completion word or event on the stream: it has completed. */
    if (e == hipSuccess && s->timed) {
        if (hipEventElapsedTime(&ms, s->t_start, s->t_end) == hipSuccess && ms > 0)
            device_ns = (uint64_t)((double)ms * 1e6);
        (void)hipGetLastError();
    }
    s->timed = false;
    for (size_t i = 0; i < s->npending; i++) {
        struct convd_job *j = s->pending[i];
        j->exec_ns = dt;
        j->device_ns = device_ns;
        if (e == hipSuccess) {
            j->status = 0;
            j->error[0] = '\0';
        } else {
            gpu_job_fail(j, CONVD_EDEVICE, why);
        }
    }
    s->npending = 0;
    s->busy = 0;
    return broken;
}

/* With completion flags: a load while the word is behind, and the stream's own query once every
 * GPU_PROBE_NS, which is what reports a batch that failed (its word is never written). */
static int gpu_query_flag(struct gpu_ctx *ctx, struct gpu_slot *s)
{
    if (__atomic_load_n(s->flag, __ATOMIC_ACQUIRE) == s->seq)
        return gpu_slot_finish(ctx, s, hipSuccess) ? CONVD_EDEVICE : 1;
    uint64_t now = gpu_now_ns();
    if (now < s->probe_ns)
        return 0;
    s->probe_ns = now + (s->lane ? GPU_LANE_PROBE_NS : GPU_PROBE_NS);
    hipError_t e = hipStreamQuery(s->stream);
    if (e == hipErrorNotReady) {
        (void)hipGetLastError();
        return 0;
    }
    /* Idle without an error: the word was written, whatever this load raced with. */
    return gpu_slot_finish(ctx, s, e) ? CONVD_EDEVICE : 1;
}

static int gpu_query(void *vctx, unsigned slot)
{
    struct gpu_ctx *ctx = (struct gpu_ctx *)vctx;
    if (!ctx || slot >= ctx->nslots || !ctx->slots[slot].busy)
        return 1;
    struct gpu_slot *s = &ctx->slots[slot];
    if (ctx->flags)
        return gpu_query_flag(ctx, s);
    hipError_t e = hipEventQuery(s->done);
    if (e == hipErrorNotReady) {
        /* Not an error, but the runtime may keep it as the thread's last one, which the kernels'
         * launch checks would then read as theirs. */
        (void)hipGetLastError();
        return 0;
    }
    return gpu_slot_finish(ctx, s, e) ? CONVD_EDEVICE : 1;
}

/* What notify hands to the runtime: one per call, owned and freed by the callback, so that a
 * callback still pending after its batch was reported (the event comes before it in the stream)
 * never sees the next batch's fn. */
struct gpu_notice {
    void (*fn)(void *arg);
    void *arg;
};

/* Runs on a runtime thread once the stream reaches it. It must not call the runtime (that may
 * deadlock), so it only hands over to the daemon's fn. */
static void gpu_notice_run(void *p)
{
    struct gpu_notice nt = *(struct gpu_notice *)p;
    free(p);
    nt.fn(nt.arg);
}

#if defined(__HIP_PLATFORM_AMD__)
/* Debian's HIP 5.2 declares hipLaunchHostFunc but its libamdhip64 does not export it; a stream
 * callback, which it does, runs at the same point of the stream. */
static void gpu_notice_callback(hipStream_t stream, hipError_t status, void *p)
{
    (void)stream;
    (void)status;
    gpu_notice_run(p);
}
#endif

static int gpu_notify(void *vctx, unsigned slot, void (*fn)(void *), void *arg)
{
    struct gpu_ctx *ctx = (struct gpu_ctx *)vctx;
    if (!ctx || slot >= ctx->nslots || !fn)
        return CONVD_EINVAL;
    struct gpu_slot *s = &ctx->slots[slot];
    if (!s->busy) {
        fn(arg);
        return 0;
    }
    struct gpu_notice *nt = (struct gpu_notice *)malloc(sizeof *nt);
    if (!nt)
        return CONVD_ENOMEM;
    nt->fn = fn;
    nt->arg = arg;
    /* After the event in stream order: when fn runs, query reports the batch done. The runtime
     * does not call it once the context has failed; the daemon's fallback poll covers that. */
#if defined(__HIP_PLATFORM_AMD__)
    hipError_t e = hipStreamAddCallback(s->stream, gpu_notice_callback, nt, 0);
#else
    hipError_t e = hipLaunchHostFunc(s->stream, gpu_notice_run, nt);
#endif
    if (e != hipSuccess) {
        (void)hipGetLastError();
        free(nt);
        return CONVD_EDEVICE;
    }
    return 0;
}

/* Gives back what one big batch grew: pools above GPU_POOL_KEEP, scratch above the configured
 * batch size; launch grows them again on demand. A slot with a batch in flight is left alone
 * (the daemon calls this only when none is). */
static void gpu_trim(void *vctx)
{
    struct gpu_ctx *ctx = (struct gpu_ctx *)vctx;
    if (!ctx)
        return;
    (void)hipSetDevice(ctx->device);
    for (unsigned i = 0; i < ctx->nslots; i++) {
        struct gpu_slot *s = &ctx->slots[i];
        if (s->busy)
            continue;
        if (s->pool_cap > GPU_POOL_KEEP && !s->lane)
            gpu_pool_free(s, true);
        if (s->scratch_n > ctx->scratch_keep) {
            gpu_scratch_free(s);
            (void)gpu_scratch_reserve(s, ctx->scratch_keep); /* else regrown by launch */
        }
    }
    (void)hipGetLastError();
}

/* The blocking form for worker threads: launch on slot `worker`, wait for the slot's event, and
 * report as query does. */
static int gpu_run_batch(void *vctx, unsigned worker, struct convd_job *const *jobs, size_t n)
{
    struct gpu_ctx *ctx = (struct gpu_ctx *)vctx;
    if (n == 0)
        return 0;
    if (!ctx || !jobs)
        return CONVD_EINVAL;
    if (worker >= GPU_WORKERS) {
        for (size_t i = 0; i < n; i++) {
            jobs[i]->exec_ns = 0;
            jobs[i]->status = CONVD_EINVAL;
            snprintf(jobs[i]->error, sizeof jobs[i]->error,
                     "worker %u out of range (the GPU backend has %d)", worker, GPU_WORKERS);
        }
        return CONVD_EINVAL;
    }
    int rc = gpu_launch(ctx, worker, jobs, n);
    struct gpu_slot *s = &ctx->slots[worker];
    if (rc != 0 || !s->busy)
        return rc;
    hipError_t e = ctx->flags ? hipStreamSynchronize(s->stream) : hipEventSynchronize(s->done);
    return gpu_slot_finish(ctx, s, e) ? CONVD_EDEVICE : 0;
}

/* ---- memory import ---- */

/* Bytes from ptr to the end of the device allocation that contains it. */
static int gpu_alloc_avail(struct gpu_ctx *ctx, char *ptr, uint64_t *ret_avail, char *why,
                           size_t why_len)
{
#ifdef CONVD_GPU_AMD
    (void)ctx;
    hipDeviceptr_t base = NULL;
    size_t size = 0;
    hipError_t e = hipMemGetAddressRange(&base, &size, (hipDeviceptr_t)ptr);
    if (e != hipSuccess) {
        (void)hipGetLastError();
        return gpu_fail(e, why, why_len, "finding the size of the opened IPC allocation");
    }
    char *b = (char *)base;
#else
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult cr = ctx->get_range(&base, &size, (CUdeviceptr)(uintptr_t)ptr);
    if (cr != CUDA_SUCCESS) {
        return why_fail(
            why, why_len, CONVD_EDEVICE,
            "finding the size of the opened IPC allocation: cuMemGetAddressRange failed "
            "with driver error %d",
            (int)cr);
    }
    char *b = (char *)(uintptr_t)base;
#endif
    if (ptr < b || ptr >= b + size) {
        return why_fail(why, why_len, CONVD_EDEVICE,
                        "the opened IPC allocation is not where the runtime says it is");
    }
    *ret_avail = (uint64_t)(b + size - ptr);
    return 0;
}

/* Takes one reference on the cache entry for a handle, opening it on first use. Several regions
 * may name the same allocation, and a process may open an allocation only once. */
static int gpu_ipc_get(struct gpu_ctx *ctx, const uint8_t *handle, struct gpu_ipc **ret_ipc,
                       char *why, size_t why_len)
{
    int rc = 0;
    struct gpu_ipc *ipc = NULL;
    void *ptr = NULL;
    pthread_mutex_lock(&ctx->ipc_lock);
    for (ipc = ctx->ipcs; ipc; ipc = ipc->next)
        if (memcmp(ipc->handle, handle, CONVD_IPC_HANDLE_SIZE) == 0)
            break;
    if (ipc) {
        ipc->refs++;
        *ret_ipc = ipc;
        goto finish;
    }
    {
        hipIpcMemHandle_t h;
        memcpy(&h, handle, sizeof h);
        hipError_t e = hipIpcOpenMemHandle(&ptr, h, hipIpcMemLazyEnablePeerAccess);
        if (e != hipSuccess) {
            (void)hipGetLastError();
            ptr = NULL;
            gpu_fail(e, why, why_len, "opening the device memory IPC handle");
            rc = CONVD_EDEVICE;
            goto finish;
        }
    }
    ipc = (struct gpu_ipc *)calloc(1, sizeof *ipc);
    if (!ipc) {
        rc = why_fail(why, why_len, CONVD_ENOMEM, "out of host memory for an IPC cache entry");
        goto finish;
    }
    rc = gpu_alloc_avail(ctx, (char *)ptr, &ipc->avail, why, why_len);
    if (rc != 0)
        goto finish;
    memcpy(ipc->handle, handle, CONVD_IPC_HANDLE_SIZE);
    ipc->ptr = (char *)ptr;
    ipc->refs = 1;
    ipc->next = ctx->ipcs;
    ctx->ipcs = ipc;
    *ret_ipc = ipc;
    ptr = NULL;
    ipc = NULL;
finish:
    if (ptr) {
        (void)hipIpcCloseMemHandle(ptr);
        (void)hipGetLastError();
        free(ipc);
    }
    pthread_mutex_unlock(&ctx->ipc_lock);
    return rc;
}

static void gpu_ipc_put(struct gpu_ctx *ctx, struct gpu_ipc *ipc)
{
    pthread_mutex_lock(&ctx->ipc_lock);
    if (--ipc->refs == 0) {
        struct gpu_ipc **pp = &ctx->ipcs;
        while (*pp != ipc)
            pp = &(*pp)->next;
        *pp = ipc->next;
        (void)hipIpcCloseMemHandle(ipc->ptr);
        (void)hipGetLastError();
        free(ipc);
    }
    pthread_mutex_unlock(&ctx->ipc_lock);
}

static int gpu_import_host(struct gpu_mem *gm, struct convd_mem *m, char *why, size_t why_len)
{
    hipError_t e = hipHostRegister(m->host, (size_t)m->size, hipHostRegisterMapped);
    if (e == hipSuccess) {
        gm->pinned = 1;
        /* Only gate words use it: without one the loop stores them, as for pageable regions. */
        if (hipHostGetDevicePointer(&gm->dev, m->host, 0) != hipSuccess) {
            gm->dev = NULL;
            (void)hipGetLastError();
        }
        return 0;
    }
    (void)hipGetLastError();
    /* Pageable copies are slower (staged through the driver's own pinned buffers) but correct,
     * so a region that cannot be pinned (a locked-memory limit, a read-only mapping, memory
     * registered already) stays usable. Success with a sentence: the caller may log it. */
    char err[192];
    (void)why_fail(why, why_len, 0,
                   "host region of %llu bytes not pinned (%s); its copies will be pageable and "
                   "slower",
                   (unsigned long long)m->size, gpu_err_text(e, err, sizeof(err)));
    return 0;
}

static int gpu_import_device(struct gpu_ctx *ctx, struct gpu_mem *gm, struct convd_mem *m,
                             char *why, size_t why_len)
{
    struct gpu_ipc *ipc = NULL;
    int rc = gpu_ipc_get(ctx, m->ipc_handle, &ipc, why, why_len);
    if (rc != 0)
        return rc;
    if (m->ipc_offset > ipc->avail || m->size > ipc->avail - m->ipc_offset) {
        (void)why_fail(
            why, why_len, 0,
            "device region at offset %llu of %llu bytes exceeds its %llu-byte allocation",
            (unsigned long long)m->ipc_offset, (unsigned long long)m->size,
            (unsigned long long)ipc->avail);
        gpu_ipc_put(ctx, ipc);
        return CONVD_EBOUNDS;
    }
    gm->ipc = ipc;
    m->device_ptr = ipc->ptr + m->ipc_offset;
    return 0;
}

static int gpu_mem_import(void *vctx, struct convd_mem *m, char *why, size_t why_len)
{
    struct gpu_ctx *ctx = (struct gpu_ctx *)vctx;
    if (why && why_len)
        why[0] = '\0';
    if (!ctx || !m || m->size == 0 || (m->kind == CONVD_MEM_HOST && !m->host) ||
        (m->kind != CONVD_MEM_HOST && m->kind != CONVD_MEM_DEVICE)) {
        return why_fail(why, why_len, CONVD_EINVAL,
                        "invalid memory description for the GPU backend");
    }
    if (gpu_is_broken(ctx, why, why_len))
        return CONVD_EDEVICE;
    hipError_t e = hipSetDevice(ctx->device);
    if (e != hipSuccess)
        return gpu_fail(e, why, why_len, "selecting the device");
    struct gpu_mem *gm = (struct gpu_mem *)calloc(1, sizeof *gm);
    if (!gm) {
        return why_fail(why, why_len, CONVD_ENOMEM, "out of host memory");
    }
    int rc = m->kind == CONVD_MEM_HOST ? gpu_import_host(gm, m, why, why_len)
                                       : gpu_import_device(ctx, gm, m, why, why_len);
    if (rc != 0) {
        free(gm);
        return rc;
    }
    m->be_priv = gm;
    /* A lane's wait and store address the word through the mapping. */
    m->device_words = gm->dev != NULL && ctx->nslots > GPU_SLOTS;
    return 0;
}

static void gpu_mem_release(void *vctx, struct convd_mem *m)
{
    struct gpu_ctx *ctx = (struct gpu_ctx *)vctx;
    if (!ctx || !m || !m->be_priv)
        return;
    struct gpu_mem *gm = (struct gpu_mem *)m->be_priv;
    (void)hipSetDevice(ctx->device);
    if (gm->pinned) {
        (void)hipHostUnregister(m->host);
        (void)hipGetLastError();
    }
    if (gm->ipc) {
        gpu_ipc_put(ctx, gm->ipc);
        m->device_ptr = NULL;
    }
    free(gm);
    m->be_priv = NULL;
}

/* ---- init, warm-up, destroy ---- */

static int gpu_supports(void *vctx, const struct convd_problem *p, char *why, size_t why_len)
{
    struct gpu_ctx *ctx = (struct gpu_ctx *)vctx;
    if (ctx && gpu_is_broken(ctx, why, why_len))
        return CONVD_EDEVICE;
    /* The check reads the limits of the calling thread's current device. */
    if (ctx)
        (void)hipSetDevice(ctx->device);
    return convd_gpu_check(p, why, why_len);
}

/* Runs p `count` times in one call on zeroed pool memory of slot 0 and waits for it (init runs
 * before any batch); `misalign` shifts the output by one element, which the kernels route to
 * their generic path. */
static int gpu_warm_one(struct gpu_ctx *ctx, const struct convd_problem *p, size_t count,
                        int misalign, char *why, size_t why_len)
{
    struct gpu_slot *s = &ctx->slots[0];
    struct convd_problem_sizes sz;
    struct convd_tensors t[2];
    size_t ws = 0;
    int rc = convd_problem_sizes(p, &sz, why, why_len);
    if (rc == 0)
        rc = convd_gpu_workspace(p, count, &ws);
    if (rc != 0) {
        return why_fail(why, why_len, CONVD_EDEVICE, "warm-up: the workspace query failed: %s",
                        convd_strerror(rc));
    }
    size_t one = gpu_round_up(sz.input_bytes, GPU_ALIGN) +
                 gpu_round_up(sz.weight_bytes, GPU_ALIGN) + gpu_round_up(sz.bias_bytes, GPU_ALIGN) +
                 gpu_round_up(sz.output_bytes + GPU_ALIGN, GPU_ALIGN);
    size_t need = count * one + ws;
    rc = gpu_pool_reserve(ctx, s, need, why, why_len);
    if (rc != 0)
        return rc;
    GPU_TRY(hipMemsetAsync(s->pool, 0, need, s->stream), "warm-up: clearing memory");
    for (size_t i = 0; i < count; i++) {
        char *b = s->pool + i * one;
        t[i].input = b;
        b += gpu_round_up(sz.input_bytes, GPU_ALIGN);
        t[i].weight = b;
        b += gpu_round_up(sz.weight_bytes, GPU_ALIGN);
        t[i].bias = p->has_bias ? b : NULL;
        b += gpu_round_up(sz.bias_bytes, GPU_ALIGN);
        t[i].output = b + (misalign ? convd_dtype_size(p->dtype) : 0);
    }
    rc = convd_gpu_conv(p, t, count, ws ? s->pool + count * one : NULL, ws, (void *)s->stream);
    if (rc != 0) {
        char ps[160];
        hipError_t e = hipGetLastError();
        return why_fail(why, why_len, CONVD_EDEVICE,
                        "warm-up of the %s kernel on %s failed: %s%s%s",
                        misalign ? "generic" : convd_gpu_kernel_name(p),
                        convd_problem_str(p, ps, sizeof ps), convd_strerror(rc),
                        e != hipSuccess ? ": " : "", e != hipSuccess ? hipGetErrorString(e) : "");
    }
    GPU_TRY(hipStreamSynchronize(s->stream), "warm-up: running the kernels");
finish:
    return rc;
}

/* Runs one small problem of every kernel family, dtype, layout and epilogue the kernels accept,
 * alone, batched and misaligned, so that lazily loaded kernels are loaded before READY=1 and the
 * first requests do not pay for it. */
static int gpu_warm(struct gpu_ctx *ctx, char *why, size_t why_len)
{
    /* {c, k, groups}: depthwise; 3 and 4 channels per group (direct FMA, merged-group MMA);
     * 32 per group; dense. */
    static const int32_t shapes[][3] = {
        {16, 16, 16}, {24, 24, 8}, {32, 32, 8}, {64, 64, 2}, {64, 64, 1}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        for (int dt = CONVD_DTYPE_FP32; dt <= CONVD_DTYPE_BF16; dt++) {
            for (int lay = CONVD_LAYOUT_NCHW; lay <= CONVD_LAYOUT_NHWC; lay++) {
                for (int epi = 0; epi < (dt == CONVD_DTYPE_FP32 ? 8 : 4); epi++) {
                    struct convd_problem p;
                    convd_problem_init(&p, 1, 8, 8, shapes[si][0], shapes[si][1], 3, 3,
                                       shapes[si][2]);
                    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
                    p.dtype = (enum convd_dtype)dt;
                    p.layout = (enum convd_layout)lay;
                    p.has_bias = (epi & 1) != 0;
                    p.activation = (epi & 2) != 0 ? CONVD_ACT_RELU : CONVD_ACT_NONE;
                    p.allow_tf32 = (epi & 4) != 0;
                    if (convd_gpu_check(&p, NULL, 0) != 0)
                        continue;
                    int rc = gpu_warm_one(ctx, &p, 1, 0, why, why_len);
                    if (rc == 0)
                        rc = gpu_warm_one(ctx, &p, 2, 0, why, why_len);
                    if (rc == 0 && si == 0)
                        rc = gpu_warm_one(ctx, &p, 1, 1, why, why_len);
                    if (rc != 0)
                        return rc;
                }
            }
        }
    }
    return 0;
}

/* ---- gauges ---- */

#ifdef CONVD_GPU_NVIDIA
/* NVML is loaded and initialised once per process and never shut down: every nvmlInit and
 * nvmlShutdown pair leaves an eventfd open (driver 580, measured with scripts/fdprobe.cu), so a
 * process that opens the backend again and again (the tests, fault_gpu) would gain a descriptor
 * each time. */
static struct {
    pthread_once_t once;
    gpu_nvml_ret (*by_bus)(const char *, gpu_nvml_dev *);
    gpu_nvml_ret (*utilization)(gpu_nvml_dev, struct gpu_nvml_util *);
} gpu_nvml_proc = {PTHREAD_ONCE_INIT, NULL, NULL};

static void gpu_nvml_load(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return;
    gpu_nvml_ret (*init)(void) = (gpu_nvml_ret(*)(void))dlsym(lib, "nvmlInit_v2");
    gpu_nvml_ret (*by_bus)(const char *, gpu_nvml_dev *) =
        (gpu_nvml_ret(*)(const char *, gpu_nvml_dev *))dlsym(lib,
                                                             "nvmlDeviceGetHandleByPciBusId_v2");
    gpu_nvml_ret (*util)(gpu_nvml_dev, struct gpu_nvml_util *) = (gpu_nvml_ret(*)(
        gpu_nvml_dev, struct gpu_nvml_util *))dlsym(lib, "nvmlDeviceGetUtilizationRates");
    if (!init || !by_bus || !util || init() != 0) {
        dlclose(lib);
        return;
    }
    gpu_nvml_proc.by_bus = by_bus;
    gpu_nvml_proc.utilization = util;
}

/* Finds our device in NVML (by PCI address, which NVML and the runtime agree on, unlike their
 * ordinals under CUDA_VISIBLE_DEVICES). Any failure leaves ctx without it: the utilisation
 * gauges are then absent, and nothing else depends on them. */
static void gpu_nvml_open(struct gpu_ctx *ctx)
{
    struct gpu_nvml *n = &ctx->nvml;
    char bus[32];
    memset(n, 0, sizeof *n);
    if (hipDeviceGetPCIBusId(bus, (int)sizeof bus, ctx->device) != hipSuccess) {
        (void)hipGetLastError();
        return;
    }
    (void)pthread_once(&gpu_nvml_proc.once, gpu_nvml_load);
    if (gpu_nvml_proc.by_bus && gpu_nvml_proc.by_bus(bus, &n->dev) == 0)
        n->utilization = gpu_nvml_proc.utilization;
}

static void gpu_nvml_close(struct gpu_ctx *ctx)
{
    memset(&ctx->nvml, 0, sizeof ctx->nvml);
}
#endif

/* The device's memory (cudaMemGetInfo: every process's use), the pools this backend holds, and,
 * with NVML, how busy the device was over the driver's last sample period. Loop thread, when the
 * metrics are rendered. The pools change only on the loop thread while the daemon launches
 * batches (run_batch's workers are the tests' and do not render metrics). */
static int gpu_stats(void *vctx, struct convd_backend_stats *ret)
{
    struct gpu_ctx *ctx = (struct gpu_ctx *)vctx;
    if (!ctx || !ret)
        return CONVD_EINVAL;
    size_t mem_free = 0, mem_total = 0;
    if (hipSetDevice(ctx->device) == hipSuccess &&
        hipMemGetInfo(&mem_free, &mem_total) == hipSuccess && mem_free <= mem_total) {
        ret->has_memory = true;
        ret->memory_used_bytes = mem_total - mem_free;
        ret->memory_total_bytes = mem_total;
    }
    (void)hipGetLastError();
    ret->has_staging = true;
    for (unsigned i = 0; i < ctx->nslots; i++)
        if (!ctx->slots[i].shared_pool)
            ret->staging_bytes += __atomic_load_n(&ctx->slots[i].pool_cap, __ATOMIC_RELAXED);
#ifdef CONVD_GPU_NVIDIA
    struct gpu_nvml_util u;
    if (ctx->nvml.utilization && ctx->nvml.utilization(ctx->nvml.dev, &u) == 0) {
        ret->has_utilization = true;
        ret->utilization = u.gpu / 100.0;
        ret->memory_utilization = u.memory / 100.0;
    }
#endif
    return 0;
}

static void gpu_close(struct gpu_ctx *ctx)
{
    (void)hipSetDevice(ctx->device);
    for (int i = 0; i < GPU_ALL_SLOTS; i++) {
        struct gpu_slot *s = &ctx->slots[i];
        /* Waits for a batch still in flight and for pending notify callbacks (stream work too):
         * the memory of both belongs to the caller. */
        if (s->stream && s->own_stream) {
            (void)hipStreamSynchronize(s->stream);
            (void)hipStreamDestroy(s->stream);
        }
        if (s->done)
            (void)hipEventDestroy(s->done);
        if (s->t_start)
            (void)hipEventDestroy(s->t_start);
        if (s->t_end)
            (void)hipEventDestroy(s->t_end);
        gpu_pool_free(s, false);
        gpu_scratch_free(s);
        memset(s, 0, sizeof *s);
    }
    if (ctx->flags) {
        (void)hipHostFree(ctx->flags);
        ctx->flags = NULL;
    }
    /* Regions the daemon forgot to release: close their handles, or the allocation's owner
     * cannot free it for real while we live. */
    while (ctx->ipcs) {
        struct gpu_ipc *ipc = ctx->ipcs;
        ctx->ipcs = ipc->next;
        (void)hipIpcCloseMemHandle(ipc->ptr);
        free(ipc);
    }
#ifdef CONVD_GPU_NVIDIA
    gpu_nvml_close(ctx);
#endif
    (void)hipGetLastError();
}

/* Sets up the completion words and checks, with one write through slot 0's stream, that the
 * device can write them; where anything refuses, the slots keep using their events. */
static void gpu_flags_open(struct gpu_ctx *ctx)
{
    const size_t bytes = GPU_ALL_SLOTS * GPU_FLAG_STRIDE * sizeof(uint32_t);
    void *mem = NULL;
#ifdef CONVD_GPU_NVIDIA
    {
        void *fn = NULL;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &fn, 11070, cudaEnableDefault,
                                             &q) != cudaSuccess ||
            !fn || q != cudaDriverEntryPointSuccess)
            goto refused;
        ctx->write_value = (PFN_cuStreamWriteValue32_v11070)fn;
    }
    if (hipHostMalloc(&mem, bytes, hipHostMallocMapped | hipHostMallocPortable) != hipSuccess)
        goto refused;
#else
    /* Coherent: the loop reads the word while the device writes it. */
    if (hipHostMalloc(&mem, bytes, hipHostMallocMapped | hipHostMallocCoherent) != hipSuccess)
        goto refused;
#endif
    memset(mem, 0, bytes);
    ctx->flags = (uint32_t *)mem;
    for (int i = 0; i < GPU_ALL_SLOTS; i++) {
        struct gpu_slot *s = &ctx->slots[i];
        s->flag = ctx->flags + i * GPU_FLAG_STRIDE;
        s->seq = 0;
        if (hipHostGetDevicePointer(&s->flag_dev, s->flag, 0) != hipSuccess)
            goto refused;
    }
    {
        struct gpu_slot *s = &ctx->slots[0];
        s->t_launch = gpu_now_ns();
        if (gpu_mark_done(ctx, s) != hipSuccess || hipStreamSynchronize(s->stream) != hipSuccess ||
            __atomic_load_n(s->flag, __ATOMIC_ACQUIRE) != s->seq)
            goto refused;
    }
    return;
refused:
    (void)hipGetLastError();
    if (mem)
        (void)hipHostFree(mem);
    ctx->flags = NULL;
    for (int i = 0; i < GPU_ALL_SLOTS; i++) {
        ctx->slots[i].flag = NULL;
        ctx->slots[i].flag_dev = NULL;
    }
}

/* Opens the lanes (device_waits): their streams and slots, after a wait on a word that has
 * already come passes on lane 0's stream. Where anything refuses, there are no lanes and the
 * daemon's loop polls every ready word, as without device_waits. */
static void gpu_lanes_open(struct gpu_ctx *ctx, int priority)
{
    if (!ctx->flags)
        return;
#ifdef CONVD_GPU_NVIDIA
    {
        void *fn = NULL;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 11070, cudaEnableDefault,
                                             &q) != cudaSuccess ||
            !fn || q != cudaDriverEntryPointSuccess)
            goto refused;
        ctx->wait_value = (PFN_cuStreamWaitValue32_v11070)fn;
    }
#endif
    for (int l = 0; l < GPU_LANES; l++) {
        hipStream_t stream = NULL;
        if (hipStreamCreateWithPriority(&stream, hipStreamNonBlocking, priority) != hipSuccess)
            goto refused;
        void *pool = NULL;
        const size_t pool_bytes = GPU_LANE_POOL < ctx->pool_limit ? GPU_LANE_POOL : ctx->pool_limit;
        if (hipMalloc(&pool, pool_bytes) != hipSuccess) {
            (void)hipStreamDestroy(stream);
            goto refused;
        }
        for (int k = 0; k < GPU_LANE_DEPTH; k++) {
            struct gpu_slot *s = &ctx->slots[GPU_SLOTS + l * GPU_LANE_DEPTH + k];
            s->stream = stream;
            s->own_stream = k == 0;
            s->lane = true;
            s->pool = (char *)pool;
            s->pool_cap = pool_bytes;
            s->shared_pool = k > 0;
            if (hipEventCreateWithFlags(&s->done, hipEventDisableTiming) != hipSuccess)
                goto refused;
            if (ctx->timing && (hipEventCreate(&s->t_start) != hipSuccess ||
                                hipEventCreate(&s->t_end) != hipSuccess))
                goto refused;
        }
    }
    {
        /* The probe: lane 0's first slot waits for its own completion word to reach the value
         * it holds, then writes the next one. */
        struct gpu_slot *s = &ctx->slots[GPU_SLOTS];
        const struct gpu_mem probe_mem = {0, s->flag_dev, NULL};
        struct convd_mem m;
        memset(&m, 0, sizeof m);
        m.be_priv = (void *)&probe_mem;
        struct convd_job j;
        memset(&j, 0, sizeof j);
        j.ready_mem = &m;
        j.ready_offset = 0;
        j.ready_value = s->seq;
        struct convd_job *jobs[1] = {&j};
        char why[GPU_WHY];
        s->t_launch = gpu_now_ns();
        if (gpu_wait_ready(ctx, s, jobs, 1, why, sizeof why) != 0 ||
            gpu_mark_done(ctx, s) != hipSuccess || hipStreamSynchronize(s->stream) != hipSuccess ||
            __atomic_load_n(s->flag, __ATOMIC_ACQUIRE) != s->seq)
            goto refused;
    }
    ctx->nslots = GPU_ALL_SLOTS;
    return;
refused:
    (void)hipGetLastError();
    for (int i = GPU_SLOTS; i < GPU_ALL_SLOTS; i++) {
        struct gpu_slot *s = &ctx->slots[i];
        if (s->stream && s->own_stream) {
            (void)hipStreamSynchronize(s->stream);
            (void)hipStreamDestroy(s->stream);
        }
        if (s->done)
            (void)hipEventDestroy(s->done);
        if (s->t_start)
            (void)hipEventDestroy(s->t_start);
        if (s->t_end)
            (void)hipEventDestroy(s->t_end);
        gpu_pool_free(s, false);
        s->stream = NULL;
        s->done = s->t_start = s->t_end = NULL;
        s->own_stream = s->lane = s->shared_pool = false;
    }
    (void)hipGetLastError();
    ctx->nslots = GPU_SLOTS;
}

/* Sets up ctx on one device and describes it in info. On failure the caller calls gpu_close. */
static int gpu_open(struct gpu_ctx *ctx, int dev, uint64_t pool_bytes, bool completion_flags,
                    struct convd_backend_info *info, char *why, size_t why_len)
{
    int rc = 0;
    hipDeviceProp_t prop;
    int mode = 0;
    size_t mem_free = 0, mem_total = 0;
    int least = 0, greatest = 0, prio = 0; /* stream priorities */
    ctx->device = dev;
    GPU_TRY(hipSetDevice(dev), "selecting the device");
    GPU_TRY(hipDeviceGetAttribute(&mode, hipDeviceAttributeComputeMode, dev),
            "reading the compute mode");
    if (mode == hipComputeModeProhibited) {
        return why_fail(why, why_len, CONVD_EDEVICE, "the device's compute mode is Prohibited");
    }
    rc = convd_gpu_device_check(dev, why, why_len);
    if (rc != 0)
        return rc;
    GPU_TRY(hipGetDeviceProperties(&prop, dev), "reading the device properties");
    /* The first call that needs a context creates it; this is where an exclusive-process device
     * held by another process answers no. */
    GPU_TRY(hipMemGetInfo(&mem_free, &mem_total), "creating a context");
    /* Priorities are numbered down (CUDA: 0 the default and least, -5 the greatest on sm_90). */
    if (ctx->priority)
        GPU_TRY(hipDeviceGetStreamPriorityRange(&least, &greatest), "reading stream priorities");
    ctx->nslots = GPU_SLOTS;
    for (int i = 0; i < GPU_SLOTS; i++) {
        GPU_TRY(hipStreamCreateWithPriority(&ctx->slots[i].stream, hipStreamNonBlocking,
                                            ctx->priority ? greatest : 0),
                "creating a stream");
        ctx->slots[i].own_stream = true;
        GPU_TRY(hipStreamGetPriority(ctx->slots[i].stream, &prio), "reading a stream's priority");
        /* No timing: exec_ns is host time, and a timing event costs more to record. */
        GPU_TRY(hipEventCreateWithFlags(&ctx->slots[i].done, hipEventDisableTiming),
                "creating an event");
        if (ctx->timing) {
            GPU_TRY(hipEventCreate(&ctx->slots[i].t_start), "creating a timing event");
            GPU_TRY(hipEventCreate(&ctx->slots[i].t_end), "creating a timing event");
        }
    }
    /* By default the pools together may take a quarter of the device: clients of the daemon
     * allocate on the same GPU (IPC regions), and staging beyond that buys nothing. A batch
     * whose staging exceeds the limit runs in several chunks. pool_bytes applies per slot, and
     * so does the default, reckoned for the default slots: more slots may stage more. */
    if (pool_bytes) {
        ctx->pool_limit = gpu_round_up((size_t)pool_bytes, GPU_ALIGN);
    } else {
        ctx->pool_limit = gpu_round_up(mem_total / 4 / GPU_DEFAULT_SLOTS, GPU_POOL_GRAIN);
        if (ctx->pool_limit < GPU_POOL_MIN_CAP)
            ctx->pool_limit = GPU_POOL_MIN_CAP;
    }
#ifdef CONVD_GPU_NVIDIA
    {
        void *fn = NULL;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        GPU_TRY(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 3020,
                                                 cudaEnableDefault, &q),
                "looking up cuMemGetAddressRange");
        if (!fn || q != cudaDriverEntryPointSuccess) {
            return why_fail(why, why_len, CONVD_EDEVICE,
                            "the driver has no cuMemGetAddressRange (query result %d)", (int)q);
        }
        ctx->get_range = (PFN_cuMemGetAddressRange_v3020)fn;
    }
#endif
    if (completion_flags)
        gpu_flags_open(ctx);
    if (ctx->waits)
        gpu_lanes_open(ctx, ctx->priority ? greatest : 0);
    rc = gpu_warm(ctx, why, why_len);
    if (rc != 0)
        return rc;
#ifdef CONVD_GPU_NVIDIA
    /* At start, not at the first metrics request: NVML's start-up takes milliseconds that the
     * loop should not spend while serving. */
    gpu_nvml_open(ctx);
#endif
    {
        char arch[32];
#ifdef CONVD_GPU_AMD
        snprintf(arch, sizeof arch, "%.*s", (int)strcspn(prop.gcnArchName, ":"), prop.gcnArchName);
#else
        snprintf(arch, sizeof arch, "sm_%d%d", prop.major, prop.minor);
#endif
        /* Clients that compute on the GPU themselves share it with the daemon without time
         * slicing only under MPS (docs/operations.md): say where operators look whether the
         * daemon is an MPS client. */
        const char *mps = "";
#ifdef CONVD_GPU_NVIDIA
        const cudaDeviceAttr mps_attr = (cudaDeviceAttr)133; /* cudaDevAttrMpsEnabled */
        int mps_on = 0;
        if (cudaDeviceGetAttribute(&mps_on, mps_attr, dev) == cudaSuccess && mps_on)
            mps = " under MPS";
        (void)cudaGetLastError(); /* drivers older than the attribute refuse it */
#endif
        memset(info, 0, sizeof *info);
        snprintf(info->name, sizeof info->name, "gpu");
        char pri[32] = "";
        if (ctx->priority)
            snprintf(pri, sizeof pri, ", stream priority %d", prio);
        snprintf(info->device, sizeof info->device, "%.60s (%.12s, %d SMs, %u GiB)%s%s%s",
                 prop.name, arch, prop.multiProcessorCount, (unsigned)(mem_total >> 30), mps,
                 completion_flags && !ctx->flags ? ", completion by events" : "", pri);
        info->max_workers = GPU_WORKERS;
        info->max_slots = GPU_SLOTS;
        info->default_slots = GPU_DEFAULT_SLOTS;
        if (ctx->nslots > GPU_SLOTS) {
            info->lanes = GPU_LANES;
            info->lane_depth = GPU_LANE_DEPTH;
        }
    }
finish:
    return rc;
}

static void gpu_destroy(void *vctx)
{
    struct gpu_ctx *ctx = (struct gpu_ctx *)vctx;
    if (!ctx)
        return;
    gpu_close(ctx);
    pthread_mutex_destroy(&ctx->ipc_lock);
    pthread_mutex_destroy(&ctx->broken_lock);
    free(ctx);
}

/* Why the runtime found no device. The CUDA runtime answers "driver version is insufficient"
 * both where the driver is too old and where there is none at all; tell them apart. */
static void gpu_say_no_runtime(hipError_t e, char *why, size_t why_len)
{
#ifdef CONVD_GPU_NVIDIA
    if (e == cudaErrorNoDevice) {
        (void)why_fail(why, why_len, 0, "no NVIDIA GPU found (the driver is installed)");
        return;
    }
    if (e == cudaErrorInsufficientDriver) {
        void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        if (lib == NULL) {
            (void)why_fail(why, why_len, 0,
                           "no NVIDIA driver is installed (libcuda.so.1 cannot be loaded)");
            return;
        }
        dlclose(lib);
        int have = 0;
        (void)cudaDriverGetVersion(&have);
        (void)hipGetLastError();
        (void)why_fail(
            why, why_len, 0,
            "the NVIDIA driver is too old: it supports CUDA %d.%d, and this convd was built "
            "with CUDA %d.%d",
            have / 1000, have % 1000 / 10, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
        return;
    }
#endif
    char err[192];
    (void)why_fail(why, why_len, 0, "the GPU runtime cannot start: %s",
                   gpu_err_text(e, err, sizeof(err)));
}

static int gpu_init(const struct convd_backend_config *cfg, void **ret_ctx,
                    struct convd_backend_info *ret_info, char *why, size_t why_len)
{
    if (!cfg || !ret_ctx || !ret_info) {
        return why_fail(why, why_len, CONVD_EINVAL, "invalid arguments to the GPU backend's init");
    }
    /* Lanes are streams that wait: where more streams than the device's hardware queues
     * (CUDA's default is 8) share one, a lane waiting for its client holds up the others'
     * work. And loading a kernel lazily, at its first launch, may wait for the device (CUDA's
     * lazy loading), so for the lanes' words: every kernel loads at start instead. Set before
     * the runtime starts, and only where the operator has not. */
    if (cfg->device_waits) {
        (void)setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
        (void)setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    }
    int count = 0;
    hipError_t e = hipGetDeviceCount(&count);
    if (e != hipSuccess) {
        (void)hipGetLastError();
        gpu_say_no_runtime(e, why, why_len);
        return CONVD_EDEVICE;
    }
    if (count <= 0) {
        return why_fail(why, why_len, CONVD_EDEVICE, "no GPU found");
    }
    if (cfg->device >= count || cfg->device < -1) {
        return why_fail(why, why_len, CONVD_EDEVICE,
                        "GPU %d requested, but the devices are 0 to %d", cfg->device, count - 1);
    }
    struct gpu_ctx *ctx = (struct gpu_ctx *)calloc(1, sizeof *ctx);
    if (!ctx) {
        return why_fail(why, why_len, CONVD_ENOMEM, "out of host memory");
    }
    pthread_mutex_init(&ctx->ipc_lock, NULL);
    pthread_mutex_init(&ctx->broken_lock, NULL);
    ctx->timing = cfg->device_timing;
    ctx->priority = cfg->stream_priority;
    ctx->gates = cfg->device_gates;
    ctx->waits = cfg->device_waits;
    struct convd_backend_info info;
    int rc = CONVD_EDEVICE;
    int first = cfg->device >= 0 ? cfg->device : 0;
    int last = cfg->device >= 0 ? cfg->device : count - 1;
    char reasons[512] = "";
    size_t used = 0;
    for (int dev = first; dev <= last; dev++) {
        char one[GPU_WHY] = "";
        rc = gpu_open(ctx, dev, cfg->pool_bytes, cfg->completion_flags, &info, one, sizeof one);
        if (rc == 0)
            break;
        gpu_close(ctx);
        if (used < sizeof reasons) {
            int k = snprintf(reasons + used, sizeof reasons - used, "%sGPU %d: %s",
                             used ? "; " : "", dev, one);
            if (k > 0)
                used += (size_t)k;
        }
    }
    if (rc != 0) {
        (void)why_fail(why, why_len, 0, "%s", reasons);
        gpu_destroy(ctx);
        return rc;
    }
    /* gpu_scratch_reserve's own minimum, so that trim does not free what it would regrow. */
    ctx->scratch_keep = cfg->max_batch > 64 ? cfg->max_batch : 64;
    for (int i = 0; i < GPU_SLOTS; i++) {
        if (cfg->max_batch && gpu_scratch_reserve(&ctx->slots[i], cfg->max_batch) != 0) {
            (void)why_fail(why, why_len, 0, "out of host memory");
            gpu_destroy(ctx);
            return CONVD_ENOMEM;
        }
    }
    *ret_info = info;
    *ret_ctx = ctx;
    return 0;
}

extern "C" const struct convd_backend_ops convd_gpu_backend_ops = {
    "gpu",         gpu_init,   gpu_destroy, gpu_supports, gpu_mem_import, gpu_mem_release,
    gpu_run_batch, gpu_launch, gpu_query,   gpu_notify,   gpu_trim,       gpu_stats,
};
#endif
