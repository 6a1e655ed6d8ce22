/*
 * The private backend interface: the only thing the daemon knows of how convolutions run. A
 * backend is a table of operations plus a context pointer (ggml's backend iface, valkey's
 * ConnectionType); the daemon calls it through the small inline wrappers at the end and never
 * includes a GPU header.
 *
 * Two ways to run work:
 *   - run_batch (every backend): blocking, called from worker threads, at most `max_workers`
 *     (from the info init returned) at once, each with its own worker index in
 *     [0, max_workers). The CPU backend computes on its own thread pool inside it.
 *   - launch / query / notify (optional, for backends whose work runs elsewhere: the GPU, the
 *     null backend): asynchronous, called from the daemon's loop thread, with `max_slots`
 *     batches in flight at once, each in its own slot [0, max_slots). The daemon prefers this
 *     when launch is not NULL: a batch costs the loop a launch and a few polls, and no thread
 *     hand-off.
 *
 * Threading: init, destroy, mem_import, mem_release, query and notify are called from the
 * daemon's loop thread; launch from the loop thread or from launch threads beside it (the
 * daemon's launch_threads; several may be in launch at once, each for a different slot), never
 * for a slot whose last launch has not returned, and query and
 * notify for a slot only after its launch returned (the thread publishes that with a release
 * store); run_batch from worker threads; supports from any thread. Memory that
 * a job references stays imported until its run_batch call returns, or until query has reported
 * its batch done.
 */
#ifndef CONVD_KERNELS_BACKEND_H
#define CONVD_KERNELS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "convd/conv.h"

#define CONVD_IPC_HANDLE_SIZE 64

struct convd_backend_config {
    int threads;        /* CPU threads to use; 0: one per online CPU */
    int device;         /* GPU ordinal; -1: the first usable */
    unsigned max_batch; /* most jobs the daemon passes to one run_batch call */
    /* GPU: device staging memory per slot (a batch that needs more runs in several
     * launches); 0: a quarter of the device's memory, shared by the slots. */
    uint64_t pool_bytes;
    /* GPU: learn that a batch is done from a word its stream writes to mapped host memory
     * (where the driver allows it) rather than by querying an event. */
    bool completion_flags;
    /* Time each batch on the device: the GPU records timing events around the batch's work on
     * its stream, the null backend reports its model's batch time; job->device_ns carries it. */
    bool device_timing;
    /* GPU: create the slots' streams at the device's highest priority. */
    bool stream_priority;
    /* GPU: store each job's gate word (convd_job.gate_mem) from the batch's stream, right after
     * its work, where the driver allows it. */
    bool device_gates;
    /* Open lanes (convd_backend_info.lanes) where the device can wait on host words: batches
     * whose jobs name a ready word (convd_job.ready_mem) start on the device once the words
     * come, and store their done words there too (as device_gates). */
    bool device_waits;
    /* Null backend only: a model of a device's costs, so that the serving path's dynamics under
     * a launch-bound load show on any machine. Each launch call busy-waits launch_ns plus
     * launch_item_ns per job (the driver's host time); a batch is done exec_ns after its launch
     * returned. 0 and 0 and 0: launches return at once and batches are done at the next query. */
    uint64_t null_launch_ns, null_launch_item_ns, null_exec_ns;
};

struct convd_backend_info {
    char name[16];        /* "cpu", "gpu" */
    char device[128];     /* "cpu: 2 threads", "NVIDIA H200 (sm_90, 132 SMs, 140 GiB)" */
    unsigned max_workers; /* worker threads the daemon may run run_batch on concurrently */
    unsigned max_slots;   /* asynchronous backends: batches that may be in flight at once */
    unsigned default_slots; /* of those, how many the daemon uses when not told (0: all) */
    /* Asynchronous backends with device_waits: `lanes` ordered queues of `lane_depth` slots
     * each, beside the max_slots: lane l's slots are max_slots + l * lane_depth + k. A lane's
     * batches run on the device one after another in launch order, each once its jobs' ready
     * words have come, so a lane holds one client's stream-ordered requests and a word that
     * never comes stalls only its lane. 0 and 0: no lanes. */
    unsigned lanes, lane_depth;
};

/* What a backend's device reports about itself, for the daemon's gauges (backend op `stats`).
 * Each group counts only when its has_* flag is set; a backend sets the groups its device and
 * driver provide and leaves the rest zero. */
struct convd_backend_stats {
    bool has_memory;
    uint64_t memory_used_bytes;  /* device memory in use, every process's (total - free) */
    uint64_t memory_total_bytes; /* the device's memory */
    bool has_staging;
    uint64_t staging_bytes; /* device memory this backend holds for staging and workspace */
    bool has_utilization;
    double utilization;        /* fraction of the driver's last sample period a kernel ran */
    double memory_utilization; /* fraction of it device memory was being read or written */
};

enum convd_mem_kind {
    CONVD_MEM_HOST = 1,   /* host memory mapped into the daemon (a sealed memfd) */
    CONVD_MEM_DEVICE = 2, /* device memory of another process, by IPC handle */
};

/* A block of memory a client registered, as backends see it. The daemon fills the fields before
 * mem_import; the backend may keep its own state in be_priv and, for DEVICE memory, must set
 * device_ptr to the region's first byte (allocation base + ipc_offset) in its address space. */
struct convd_mem {
    enum convd_mem_kind kind;
    uint64_t size;                             /* usable bytes from the start of the region */
    void *host;                                /* HOST: the daemon's mapping */
    uint8_t ipc_handle[CONVD_IPC_HANDLE_SIZE]; /* DEVICE: the handle's bytes */
    uint64_t ipc_offset;                       /* DEVICE: region start within the allocation */
    void *device_ptr;                          /* DEVICE: set by mem_import */
    /* HOST: set by mem_import when the device can wait on words of this memory and store them
     * (lanes' ready words, device_gates' done words). */
    bool device_words;
    void *be_priv;                             /* the backend's own */
};

/* One tensor of a job: bytes [offset, offset + bytes) of mem. mem is NULL for an absent bias. */
struct convd_tensor_view {
    struct convd_mem *mem;
    uint64_t offset;
    uint64_t bytes;
};

/* One convolution to run. The daemon fills problem and the views; run_batch fills status (0 or
 * a CONVD_E* code), error (a sentence, on failure), exec_ns and, with device_timing, device_ns.
 *
 * A job reaches a backend admitted, validated once where the request came in (daemon/request.c):
 * the problem passed convd_problem_check() and the backend's supports(); every view's memory was
 * imported by this backend, the view lies inside it, holds exactly the bytes the problem needs
 * (convd_problem_sizes_of) and starts on an element boundary, in device memory at the device
 * address too. Backends assert this and do not check it again; what they may still refuse is
 * what only they know (a job larger than their staging pool, a device that fails). */
struct convd_job {
    struct convd_problem problem;
    struct convd_tensor_view input, weight, bias, output;
    int status;
    char error[160];
    uint64_t exec_ns;
    /* With device_timing, on success: the device time of the job's batch, from its first to its
     * last operation on the stream (waits for the device's SMs included); 0 when not measured. */
    uint64_t device_ns;
    /* A stream-ordered request's done word: gate_value goes into the 4 bytes at gate_offset of
     * gate_mem (host memory this backend imported) once the job's output is written. NULL: no
     * gate. An asynchronous backend with device_gates stores it from the device after the
     * batch, so that the client's stream goes on without waiting for the daemon's loop to see
     * the batch done; the daemon stores it again (the same value) when it reports the job. */
    struct convd_mem *gate_mem;
    uint64_t gate_offset;
    uint32_t gate_value;
    /* Lanes only: the batch starts on the device once the 4 bytes at ready_offset of ready_mem
     * (host memory with device_words) reach ready_value, compared cyclically as
     * cuStreamWaitValue32's GEQ; its done word (gate_mem) is then stored from the device. NULL:
     * no wait. The daemon stores the value itself to release a word that does not come. */
    struct convd_mem *ready_mem;
    uint64_t ready_offset;
    uint32_t ready_value;
    void *owner; /* the daemon's own; backends leave it alone */
};

struct convd_backend_ops {
    const char *name;
    /* Opens the backend. Returns 0 or a CONVD_E* code; on failure *ret_ctx is untouched and the
     * reason is in why. */
    int (*init)(const struct convd_backend_config *cfg, void **ret_ctx,
                struct convd_backend_info *ret_info, char *why, size_t why_len);
    void (*destroy)(void *ctx);
    /* 0 when the backend can run p, else a CONVD_E* code with the reason. p is already valid. */
    int (*supports)(void *ctx, const struct convd_problem *p, char *why, size_t why_len);
    /* Makes registered memory usable (pin host memory, open an IPC handle). */
    int (*mem_import)(void *ctx, struct convd_mem *m, char *why, size_t why_len);
    void (*mem_release)(void *ctx, struct convd_mem *m);
    /* Runs n jobs and returns once every output is written (or its job failed). Jobs with the
     * same problem (convd_problem_same) should run in shared launches. The return value is 0, or
     * a CONVD_E* code when the backend itself is broken (each job's status is set either way). */
    int (*run_batch)(void *ctx, unsigned worker, struct convd_job *const *jobs, size_t n);

    /* Asynchronous execution (all three NULL for a backend that has only run_batch).
     *
     * launch starts n jobs (same contract as run_batch: groups of the same problem share
     * launches) in `slot`, which is free: never used, or its last batch was reported done by
     * query. It returns without waiting for the work. The jobs and their memory must stay valid
     * until query reports the slot done; their status, error and exec_ns are read only then.
     * Returns 0, or a CONVD_E* code when the backend itself is broken, in which case nothing is
     * in flight, every job's status is set, and the slot is free again.
     *
     * query never blocks: it returns 1 when the slot's batch has finished (every job's status,
     * error and exec_ns set; the slot is free), 0 while it runs, and a CONVD_E* code instead of
     * 1 when the batch finished and the backend is broken since.
     *
     * A backend is broken when its device is lost for good (a GPU context after an illegal
     * address): it reports CONVD_EDEVICE from run_batch, launch or query, and the daemon then
     * drains and exits non-zero to be restarted.
     *
     * notify arranges for fn(arg) to be called once, from any thread (the backend's or the
     * runtime's), after the slot's batch has finished, or soon if it has already; the daemon's
     * fn only wakes its loop, which then calls query. Returns 0, or a CONVD_E* code when it
     * cannot (the daemon then polls). */
    int (*launch)(void *ctx, unsigned slot, struct convd_job *const *jobs, size_t n);
    int (*query)(void *ctx, unsigned slot);
    int (*notify)(void *ctx, unsigned slot, void (*fn)(void *arg), void *arg);
    /* Optional: frees caches and staging memory above what steady serving needs; called from
     * the loop thread when nothing has been in flight for a while. */
    void (*trim)(void *ctx);
    /* Optional: fills *ret (zeroed by the caller) with what the device reports now. Called from
     * the loop thread when the metrics are rendered, never per request; it may take a driver
     * call or two. Returns 0, or a CONVD_E* code when the device cannot say (nothing in *ret
     * counts then). Backends without a device (CPU, null) leave it NULL: no gauges. */
    int (*stats)(void *ctx, struct convd_backend_stats *ret);
};

extern const struct convd_backend_ops convd_cpu_backend_ops;
extern const struct convd_backend_ops convd_null_backend_ops;
#ifdef CONVD_HAVE_GPU
extern const struct convd_backend_ops convd_gpu_backend_ops;
#endif

struct convd_backend {
    const struct convd_backend_ops *ops;
    void *ctx;
    struct convd_backend_info info;
};

static inline int be_supports(struct convd_backend *b, const struct convd_problem *p, char *why,
                              size_t len)
{
    return b->ops->supports(b->ctx, p, why, len);
}

static inline int be_mem_import(struct convd_backend *b, struct convd_mem *m, char *why, size_t len)
{
    return b->ops->mem_import(b->ctx, m, why, len);
}

static inline void be_mem_release(struct convd_backend *b, struct convd_mem *m)
{
    b->ops->mem_release(b->ctx, m);
}

static inline int be_run_batch(struct convd_backend *b, unsigned worker,
                               struct convd_job *const *jobs, size_t n)
{
    return b->ops->run_batch(b->ctx, worker, jobs, n);
}

static inline bool be_async(const struct convd_backend *b)
{
    return b->ops->launch != NULL;
}

static inline int be_launch(struct convd_backend *b, unsigned slot, struct convd_job *const *jobs,
                            size_t n)
{
    return b->ops->launch(b->ctx, slot, jobs, n);
}

static inline int be_query(struct convd_backend *b, unsigned slot)
{
    return b->ops->query(b->ctx, slot);
}

static inline int be_notify(struct convd_backend *b, unsigned slot, void (*fn)(void *), void *arg)
{
    return b->ops->notify(b->ctx, slot, fn, arg);
}

static inline void be_trim(struct convd_backend *b)
{
    if (b->ops->trim != NULL)
        b->ops->trim(b->ctx);
}

/* The device's gauges; all absent (every has_* false) for a backend without the op or when the
 * device cannot answer. */
static inline void be_stats(struct convd_backend *b, struct convd_backend_stats *ret)
{
    memset(ret, 0, sizeof(*ret));
    if (b->ops->stats != NULL && b->ops->stats(b->ctx, ret) != 0)
        memset(ret, 0, sizeof(*ret));
}

#endif
