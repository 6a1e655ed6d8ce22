/*
 * libconvd-client: talk to the convd daemon.
 *
 * A client connects to the daemon's Unix socket, registers regions of memory that hold its
 * tensors, and submits convolutions that name tensors as (region, offset, bytes). The daemon runs
 * them, writes the outputs in place and answers each with a completion. Tensors never travel
 * through the socket.
 *
 *   convd_client *c;
 *   convd_connect(NULL, &c);                        // $CONVD_SOCKET or /run/convd/convd.sock
 *   convd_region *r;
 *   convd_region_create(c, bytes, &r);              // shared memory, mapped here and in convd
 *   float *base = convd_region_data(r);             // write input and weights here
 *   struct convd_conv_args a = CONVD_CONV_ARGS_INIT;
 *   a.problem = problem;
 *   a.input = (struct convd_tensor){r, 0, in_bytes};   ... weight, output likewise
 *   uint64_t id;
 *   convd_conv_submit(c, &a, &id);
 *   struct convd_completion done;
 *   convd_wait(c, id, -1, &done);                   // done.status == 0: output is in the region
 *   convd_region_free(r);
 *   convd_close(c);
 *
 * Errors: every function returns 0 or a negative CONVD_E* code (include/convd/status.h). When a
 * function that takes a client fails, convd_errstr() gives a sentence about the failure, naming
 * the bad field where there is one. Output parameters (ret_*) are written only on success.
 *
 * Thread safety: a convd_client and its regions are not thread-safe; use one client per thread,
 * or serialise calls on a client with a lock of your own. Different clients are independent.
 * Region memory (convd_region_data) may be read and written from any thread, but not while a
 * request that uses it is in flight.
 *
 * Compatibility (libconvd-client.so.0). A program built against an older header keeps working
 * with a newer library:
 *   - Structs the caller fills (convd_connect_options, convd_conv_args) start with struct_size,
 *     which the *_INIT macros set. Fields only ever get appended. The library reads the first
 *     struct_size bytes and gives every field beyond them its default, so an older, smaller
 *     struct works. A newer, larger struct works with an older library as long as the fields
 *     that library does not know are left as the INIT macro sets them (see each struct).
 *   - Structs the library fills (convd_server_info, convd_status, convd_completion,
 *     convd_problem_sizes) have no size field and never change layout under a given symbol
 *     version. When one has to grow, the functions that fill it get a new symbol version (a new
 *     node in the library's version script) and the old symbols keep filling the old layout, so
 *     programs linked earlier are unaffected; a program rebuilt against the new header gets the
 *     new layout and the new symbols together.
 *   - convd_version() says which library is loaded at run time; CONVD_VERSION_NUMBER which
 *     header a program was built with.
 * docs/protocol.md ("Versioning") has the wire protocol's rules.
 */
#ifndef CONVD_CONVD_H
#define CONVD_CONVD_H

#include <stddef.h>
#include <stdint.h>

#include "convd/conv.h"
#include "convd/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header (and of the library built with it). */
#define CONVD_VERSION_MAJOR  0
#define CONVD_VERSION_MINOR  1
#define CONVD_VERSION_PATCH  0
#define CONVD_VERSION_STRING "0.1.0"
#define CONVD_VERSION_NUMBER                                                                       \
    ((CONVD_VERSION_MAJOR << 16) | (CONVD_VERSION_MINOR << 8) | CONVD_VERSION_PATCH)

/* The version of the library loaded at run time, as CONVD_VERSION_NUMBER encodes it (major << 16
 * | minor << 8 | patch), and as a string ("0.1.0"). A program may compare it with the
 * CONVD_VERSION_NUMBER it was built with; the library accepts programs built against any older
 * header of the same major version (see "Compatibility" above). */
unsigned convd_version(void);
const char *convd_version_string(void);

/* Where daemons listen. One daemon for the machine listens on CONVD_DEFAULT_SOCKET; with one
 * daemon per GPU, the daemon of GPU N listens on "gpuN.sock" in the same directory
 * (/run/convd/gpu0.sock, ...). $CONVD_SOCKET_DIR, when set, replaces the directory
 * (CONVD_DEFAULT_SOCKET_DIR) in both names. */
#define CONVD_DEFAULT_SOCKET_DIR "/run/convd"
#define CONVD_DEFAULT_SOCKET     CONVD_DEFAULT_SOCKET_DIR "/convd.sock"

/* The socket path a client uses when it names no socket itself, for a given device: in order,
 * $CONVD_SOCKET if set and not empty (whatever device says: it names the one daemon to use);
 * else, for device >= 0, "<dir>/gpu<device>.sock"; else "<dir>/convd.sock", where <dir> is
 * $CONVD_SOCKET_DIR if set and not empty, else CONVD_DEFAULT_SOCKET_DIR. Writes the
 * NUL-terminated path into ret_path (cap bytes). Returns 0, CONVD_EINVAL (device below -1, or
 * ret_path NULL) or CONVD_ETOOBIG (the path does not fit in cap bytes, or in a Unix socket
 * address: 107 bytes). */
int convd_socket_path(int device, char *ret_path, size_t cap);

typedef struct convd_client convd_client;
typedef struct convd_region convd_region;

/* Options for convd_connect(). Initialise with CONVD_CONNECT_OPTIONS_INIT so that fields added
 * later get their defaults. timeout_ms also bounds, on the connected client, the wait for the
 * answers to ping, status and metrics and for room in a full socket; registering and
 * unregistering a region waits at least 60 s (a GPU daemon pins the memory).
 *
 * Fields are preferences: a library older than the caller's header ignores the fields it does
 * not know (struct_size up to 4096 bytes is accepted). A struct_size that does not reach
 * timeout_ms is refused with CONVD_EINVAL. */
struct convd_connect_options {
    size_t struct_size; /* sizeof(struct convd_connect_options) */
    /* The daemon's socket. NULL: the path convd_socket_path(device) gives ($CONVD_SOCKET, else
     * the device's socket, else the default one). */
    const char *socket_path;
    const char *client_name; /* shown in the daemon's logs; NULL: the program's name */
    int timeout_ms;          /* for connecting and the handshake; <= 0: 5000 */
    /* Requests and completions travel through rings in shared memory when the daemon offers
     * them, the socket carrying only set-up, failures and wake-ups. 1: use them; 0: never;
     * -1 (the default): use them unless $CONVD_RINGS is "0". */
    int use_rings;
    /* How long convd_wait(), convd_wait_any() and convd_conv() poll the completion ring before
     * they sleep on the socket, in microseconds: a completion that arrives within it costs no
     * system call and no wake-up. 0: sleep at once (best when there are more busy processes
     * than CPUs); -1 (the default): $CONVD_SPIN_US if set, else 50. */
    int spin_us;
    /* With one daemon per GPU: the ordinal of the GPU whose daemon to connect to, which selects
     * the socket "gpuN.sock" when socket_path is NULL and $CONVD_SOCKET is unset (see
     * convd_socket_path()). -1 (the default): the machine's daemon, CONVD_DEFAULT_SOCKET. A
     * library from before this field (one without convd_socket_path()) ignores it. */
    int device;
};
#define CONVD_CONNECT_OPTIONS_INIT                                                                 \
    {                                                                                              \
        sizeof(struct convd_connect_options), NULL, NULL, 0, -1, -1, -1                            \
    }

/* What the daemon announced in its handshake. */
struct convd_server_info {
    uint32_t protocol_version;
    char server_version[32];
    char backend[16]; /* "cpu" or "gpu" */
    char device[128];
    uint32_t max_inflight; /* requests this client may have in flight */
    uint32_t max_regions;
    uint64_t max_mapped_bytes;
    uint32_t max_batch;
};

/* Connects to the daemon and performs the version handshake. opts may be NULL. On success
 * *ret_client is a new client that convd_close() releases. On failure returns CONVD_ECONNECT (no
 * daemon at the path), CONVD_EVERSION, CONVD_EPERM, CONVD_ETIMEDOUT or CONVD_ENOMEM, or the
 * status the daemon refused the connection with (CONVD_ELIMIT: too many clients); no handle
 * exists then, so the sentence goes to convd_last_connect_error() of the calling thread. */
int convd_connect(const struct convd_connect_options *opts, convd_client **ret_client);

/* The sentence describing the calling thread's last failed convd_connect(). Never NULL. */
const char *convd_last_connect_error(void);

/* Closes the connection and frees the client and all its regions. Requests still in flight are
 * abandoned: the daemon finishes or cancels them and releases their regions; their outputs must
 * not be relied on. Accepts NULL. */
void convd_close(convd_client *c);

/* The sentence describing the last failure on this client ("" if none). Valid until the next call
 * on the client. */
const char *convd_errstr(const convd_client *c);

/* The handshake's information. Never fails. */
void convd_server_info(const convd_client *c, struct convd_server_info *ret_info);

/*
 * Regions.
 */

/* Creates `size` bytes of shared host memory (a memfd sealed against shrinking and growing),
 * maps it here, and registers it with the daemon, which maps it too. The memory starts zeroed.
 * Fails with CONVD_ELIMIT when the daemon's per-client region or byte limit is reached. */
int convd_region_create(convd_client *c, size_t size, convd_region **ret_region);

/* Registers `size` bytes of another process-visible GPU allocation: ipc_handle holds the bytes of
 * a hipIpcMemHandle_t / cudaIpcMemHandle_t (handle_len must be 64) for the allocation, offset the
 * region's start from the allocation's base (a handle opens at the base, not at a sub-allocated
 * pointer). The daemon checks offset + size against the allocation. convd_region_data() returns
 * NULL for such a region. Fails with CONVD_EUNSUPPORTED on a daemon without a GPU backend. */
int convd_region_import_gpu(convd_client *c, const void *ipc_handle, size_t handle_len,
                            uint64_t offset, uint64_t size, convd_region **ret_region);

/* The region's memory in this process (NULL for GPU regions), and its size. */
void *convd_region_data(const convd_region *r);
size_t convd_region_size(const convd_region *r);

/* Unregisters the region and unmaps it here. The daemon releases its side once requests that
 * use it finish. Accepts NULL. Returns 0 or the daemon's error. */
int convd_region_free(convd_region *r);

/*
 * Convolutions.
 */

/* A tensor: `bytes` bytes at `offset` in `region`. */
struct convd_tensor {
    convd_region *region;
    uint64_t offset;
    uint64_t bytes;
};

/* Stream ordering (protocol 3; docs/protocol.md, "Gates"): two 32-bit words in a host region
 * (convd_region_create) through which a GPU stream orders a request without a CPU waiting. The
 * daemon starts the request only once the word at ready_offset holds a value v with
 * (int32_t)(v - ready_value) >= 0 (the cyclic comparison of cuStreamWaitValue32's GEQ), and once
 * the request has finished, successfully or not, stores done_value into the word at done_offset.
 * A client's stream writes the first after the work that produces the inputs
 * (cuStreamWriteValue32 on the region's memory, registered with cuMemHostRegister) and waits on
 * the second before the work that reads the output (cuStreamWaitValue32).
 *
 * The library stores done_value into the done word itself when it hands out the request's failed
 * completion, and for every gated request still in flight when the connection is lost or closed,
 * so that a stream waiting on the word is never left waiting (a request still running when its
 * client closes may then write its output after the stream went on: wait for gated requests'
 * completions before convd_close). The words must be 4-byte aligned, distinct, inside the region
 * and outside every tensor of the request. A request that waits on its ready word longer than its
 * timeout_us, or the daemon's gate_timeout_ms, fails with CONVD_ETIMEDOUT. Needs a daemon of
 * protocol 3 (CONVD_EUNSUPPORTED before). */
struct convd_gate {
    convd_region *region; /* NULL: no gate, the request may start at once */
    uint64_t ready_offset;
    uint64_t done_offset;
    uint32_t ready_value;
    uint32_t done_value;
};

/* One request. Initialise with CONVD_CONV_ARGS_INIT. bias is used only when problem.has_bias.
 *
 * struct_size must reach at least the end of `output`: priority and timeout_us, when beyond it,
 * take their defaults (0). Fields appended later will have 0 as their "as before" value, and a
 * library that does not know a field refuses a request whose unknown bytes are not all zero
 * (CONVD_EUNSUPPORTED), rather than run it without what the field asked for. */
struct convd_conv_args {
    size_t struct_size; /* sizeof(struct convd_conv_args) */
    struct convd_problem problem;
    struct convd_tensor input, weight, bias, output;
    unsigned priority;      /* 0 (highest) .. 3 (lowest) */
    uint64_t timeout_us;    /* 0: none; else fail with CONVD_ETIMEDOUT if not started by then */
    struct convd_gate gate; /* stream ordering; gate.region NULL: none */
};
/* C++ has no universal zero initialiser {0} that -Wextra accepts for a struct; {} is its own. */
/* clang-format off */
#ifdef __cplusplus
#define CONVD_CONV_ARGS_INIT                                                                       \
    {                                                                                              \
        sizeof(struct convd_conv_args), {}, {}, {}, {}, {}, 0, 0, {}                               \
    }
#else
#define CONVD_CONV_ARGS_INIT                                                                       \
    {                                                                                              \
        sizeof(struct convd_conv_args), {0}, {0}, {0}, {0}, {0}, 0, 0, {0}                         \
    }
#endif
/* clang-format on */

/* The outcome of one request. */
struct convd_completion {
    uint64_t id;
    int status;          /* 0: the output is written; else a CONVD_E* code */
    char error[256];     /* the daemon's sentence when status != 0 */
    uint64_t queue_us;   /* waiting in the daemon's queue */
    uint64_t exec_us;    /* running the batch it was part of */
    uint32_t batch_size; /* requests in that batch */
};

/* Sends a request and returns at once with its id in *ret_id. The client checks the problem and
 * the tensor bounds first (failing with the same codes the daemon would). Fails with CONVD_ELIMIT
 * when max_inflight requests are already in flight: wait for one first. */
int convd_conv_submit(convd_client *c, const struct convd_conv_args *args, uint64_t *ret_id);

/* Waits up to timeout_ms (-1: forever, 0: do not block) for request `id` to complete and
 * returns its completion in *ret. Returns 0 when the completion was received (look at
 * ret->status for the request's own result), CONVD_ETIMEDOUT, CONVD_ENOTFOUND for an id that is
 * not in flight, or CONVD_ECLOSED when the daemon went away. Completions of other requests that
 * arrive meanwhile are kept for later. When the daemon sends a ProtocolError or a message that
 * answers nothing the client asked, the call that reads it (this one, or any other that waits on
 * the socket) fails once with its code (CONVD_EPROTO) and the sentence in convd_errstr(); the
 * requests in flight stay in flight. */
int convd_wait(convd_client *c, uint64_t id, int timeout_ms, struct convd_completion *ret);

/* Like convd_wait() for whichever request completes first (completions already received are
 * returned first, oldest first). CONVD_ENOTFOUND when nothing is in flight. */
int convd_wait_any(convd_client *c, int timeout_ms, struct convd_completion *ret);

/* Requests submitted and not yet returned by convd_wait*() or convd_poll(). */
size_t convd_inflight(const convd_client *c);

/*
 * Event-loop integration: add convd_client_fd() to your poll set for reading; when it is
 * readable call convd_client_process(), then convd_poll() until it returns CONVD_EAGAIN. A
 * caller that also waits with convd_wait() or convd_conv() calls convd_poll() after them too:
 * completions of other requests that arrived during the wait are queued, and announce nothing
 * on the socket.
 */

/* The socket descriptor; do not read from or close it. */
int convd_client_fd(const convd_client *c);

/* Reads every message waiting on the socket without blocking and queues the completions.
 * Returns 0, CONVD_ECLOSED when the daemon went away, or CONVD_EPROTO (see convd_wait()). Queued
 * completions stay available to convd_poll() in every case. */
int convd_client_process(convd_client *c);

/* Returns a queued completion (0), or CONVD_EAGAIN when none is queued. Never blocks. */
int convd_poll(convd_client *c, struct convd_completion *ret);

/* Whether completions that arrive while no wait of this client is in progress announce
 * themselves on convd_client_fd() (on != 0: the default) or only in the completion ring (0),
 * where convd_client_process() takes them. A caller that takes its completions on a schedule of
 * its own, without polling the descriptor, turns them off: the daemon then sends no doorbell
 * (a datagram, and a hand-off on its side) per completion. Waits (convd_wait(), convd_wait_any(),
 * convd_conv()) still sleep on the socket and are woken in either mode. Without rings every
 * completion comes on the socket and this changes nothing. After turning them back on, call
 * convd_poll(): completions that came meanwhile are queued and announce nothing. Returns the
 * previous setting (1 or 0), or CONVD_EINVAL for a NULL client. */
int convd_client_doorbells(convd_client *c, int on);

/* Blocking convenience: copies input, weight and (if p->has_bias) bias from plain host memory
 * into a region the client keeps for this purpose, runs the problem, waits, and copies the output
 * to `output`. The region grows as needed and is reused by later calls. Returns 0 or the
 * request's status. Sizes come from the problem (convd_problem_sizes). */
int convd_conv(convd_client *c, const struct convd_problem *p, const void *input,
               const void *weight, const void *bias, void *output);

/*
 * Queries.
 */

/* Round trip to the daemon; *ret_rtt_ns (may be NULL) gets the time it took. */
int convd_ping(convd_client *c, uint64_t *ret_rtt_ns);

struct convd_status {
    char server_version[32];
    char backend[16];
    char device[128];
    uint32_t protocol_version;
    uint32_t clients;         /* connections open now */
    uint32_t queue_depth;     /* requests waiting */
    uint32_t inflight;        /* requests waiting or running */
    uint64_t requests_served; /* completed successfully since start */
    uint64_t requests_failed;
    uint64_t batches;
    uint64_t uptime_ms;
};

/* The daemon's status. */
int convd_status_get(convd_client *c, struct convd_status *ret_status);

/* The daemon's metrics in Prometheus text format. *ret_text is a NUL-terminated string the
 * caller frees with free(). */
int convd_metrics_get(convd_client *c, char **ret_text);

#ifdef __cplusplus
}
#endif

#endif
