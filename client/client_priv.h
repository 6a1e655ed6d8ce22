/*
 * Inside libconvd-client: the client and region structs and the functions the library's files
 * share. Not installed. The socket is non-blocking throughout; every wait is a poll() with a
 * deadline, and every datagram read while waiting is dispatched (completions queued, control
 * replies matched), so nothing the daemon sends is lost whatever call happens to read it.
 */
#ifndef CONVD_CLIENT_PRIV_H
#define CONVD_CLIENT_PRIV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "convd.pb-c.h"
#include "convd/convd.h"
#include "ring_layout.h"

#define CL_ERRSTR_BYTES 512
/* A control reply (region, status, metrics, pong) is waited for this long at least, whatever the
 * connect timeout: registering a region on a GPU backend pins it, which takes a while for
 * gigabytes. */
#define CL_REGION_TIMEOUT_MS  60000
#define CL_DEFAULT_TIMEOUT_MS 5000
/* How long a wait spins on the completion ring before it sleeps, unless the options or
 * $CONVD_SPIN_US say otherwise: a little more than a small request's round trip on a GPU. */
#define CL_DEFAULT_SPIN_US 50
/* The part of the spin that does not yield the CPU. */
#define CL_SPIN_PURE_NS 5000u
/* The largest struct_size of convd_conv_args (or options) a newer header may pass. */
#define CL_ARGS_MAX_BYTES 4096u
/* Tensors inside the staging region of convd_conv() start at multiples of this. */
#define CL_STAGING_ALIGN 256u

/* What a request slot holds. */
enum cl_slot_state {
    CL_SLOT_FREE = 0,
    CL_SLOT_WAITING,   /* submitted, no completion yet */
    CL_SLOT_DONE,      /* completion received, not yet returned to the caller */
    CL_SLOT_ABANDONED, /* the caller gave up on it (convd_conv() after a failed wait); its
                          completion is dropped when it comes, and it counts against the limit
                          until then since the daemon still holds it */
};

struct cl_slot {
    uint64_t id;
    enum cl_slot_state state;
    int32_t prev, next; /* the done list (oldest first), or the free list (next only) */
    struct convd_completion done;
    /* A gated request's done word in its region's mapping (NULL: none, or already written):
     * written here when the daemon will not (a failure seen here, a lost connection). */
    uint32_t *gate_done;
    convd_region *gate_region;
    uint32_t gate_value;
};

/* The control reply the client is blocked on; at most one at a time, since a client is used from
 * one thread. */
enum cl_expect_kind {
    CL_EXPECT_NONE = 0,
    CL_EXPECT_HELLO,
    CL_EXPECT_REGION,
    CL_EXPECT_STATUS,
    CL_EXPECT_METRICS,
    CL_EXPECT_PONG,
    CL_EXPECT_RING,
};

/* The client's side of the rings (ring.c). */
struct cl_ring {
    void *map;
    size_t map_len;
    struct convd_ring_header *hdr;
    struct convd_ring_sqe *sq;
    struct convd_ring_cqe *cq;
    uint32_t sq_entries, cq_entries;
    uint32_t sq_tail;  /* ours: the next submission */
    uint32_t cq_head;  /* ours: the next completion to read */
    uint32_t sock_seq; /* the daemon's sock_seq when we last looked */
};

struct convd_client {
    int fd;
    bool closed; /* the daemon went away; fd stays open until convd_close() */
    int timeout_ms;
    struct convd_server_info info;
    size_t max_send; /* largest datagram we send: ours and the daemon's limit, the smaller */
    char errstr[CL_ERRSTR_BYTES];

    /* Protocol trouble noticed while reading (a ProtocolError, a message that fits no request).
     * The next call that waits on the socket reports it once as its result. */
    int trouble;
    char trouble_msg[CL_ERRSTR_BYTES];

    uint8_t *rxbuf; /* CONVD_MAX_MESSAGE_BYTES */
    uint8_t *txbuf; /* CONVD_MAX_MESSAGE_BYTES */

    uint64_t next_id;        /* request ids: 1, 2, 3, ... */
    uint64_t next_region_id; /* region ids: 1, 2, 3, ... */
    uint64_t next_tag;       /* ping, status and metrics tags */

    /* Requests, requests.c's. slots grows by doubling; index maps id -> slot (open addressing,
     * linear probing, -1 empty, capacity a power of two at least twice the slots). */
    struct cl_slot *slots;
    int32_t slot_cap;
    int32_t free_head;
    int32_t *index;
    size_t index_cap;
    int32_t done_head, done_tail;
    size_t n_waiting, n_done, n_abandoned; /* convd_inflight() is waiting + done */

    struct {
        enum cl_expect_kind kind;
        uint64_t key; /* region id or tag */
        Convd__ServerMessage *reply;
    } expect;

    struct convd_region *regions; /* doubly linked */
    size_t n_regions;
    uint64_t mapped_bytes;
    struct convd_region *staging; /* convd_conv()'s region, or NULL */

    uint32_t ring_version; /* what HelloReply offered */
    bool has_ring;
    struct cl_ring ring;
    uint64_t spin_ns; /* how long a wait spins on the completion ring before it sleeps */
    /* Between waits, whether completions ring the socket (convd_client_doorbells); calloc's
     * zero is read as on. */
    bool no_doorbells;
};

struct convd_region {
    convd_client *client;
    uint64_t id;
    void *data; /* NULL for GPU regions */
    size_t size;
    bool gpu;
    struct convd_region *prev, *next;
};

/* Sets c->errstr and returns code. */
int cl_fail(convd_client *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Takes ownership of fd, a connected SOCK_SEQPACKET socket, and performs the handshake. The
 * part of convd_connect() after the socket exists; the unit tests call it with one end of a
 * socketpair. name may be NULL (the program's name). Rings are attached when use_rings is set
 * and the daemon offers them; spin_us < 0 takes the default. Errors as convd_connect(), sentence in
 * convd_last_connect_error(). */
int cl_connect_fd(int fd, const char *name, int timeout_ms, bool use_rings, int spin_us,
                  convd_client **ret_client);

/* Absolute CLOCK_MONOTONIC deadline timeout_ms from now; -1 gives UINT64_MAX (none). */
uint64_t cl_deadline(int timeout_ms);

/* Packs and sends one message (with pass_fd attached when >= 0), waiting for room until deadline
 * and reading what arrives meanwhile. Returns 0, CONVD_ECLOSED, CONVD_ETIMEDOUT, CONVD_ETOOBIG or
 * CONVD_EIO, with errstr set. */
int cl_send(convd_client *c, const Convd__ClientMessage *m, int pass_fd, uint64_t deadline);

/* Reads and dispatches every datagram available now. Returns 0, or CONVD_ECLOSED when the peer
 * is gone (c->closed is set). Never blocks. */
int cl_drain(convd_client *c);

/* Predicate for cl_pump(). */
typedef bool (*cl_done_fn)(const convd_client *c, const void *arg);

/* Reads until done(c, arg) holds (0), the deadline passes (CONVD_ETIMEDOUT), trouble arrives
 * (its code), or the daemon goes away (CONVD_ECLOSED). errstr is set on failure. */
int cl_pump(convd_client *c, cl_done_fn done, const void *arg, uint64_t deadline);

/* Sends m and waits for the control reply of the given kind and key until deadline. On success
 * *ret_reply is the decoded message, freed by the caller with
 * convd__server_message__free_unpacked(). */
int cl_request(convd_client *c, const Convd__ClientMessage *m, int pass_fd,
               enum cl_expect_kind kind, uint64_t key, uint64_t deadline,
               Convd__ServerMessage **ret_reply);

/* Records protocol trouble for the next waiting call to report (the first one wins). */
void cl_trouble(convd_client *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Hands the completion of request id to its slot (or drops it for an abandoned one). From the
 * socket's Completion messages and from the completion ring alike. */
void cl_complete(convd_client *c, uint64_t id, int status, const char *error, uint64_t queue_us,
                 uint64_t exec_us, uint32_t batch_size);

/* Rings (ring.c). attach creates and registers them (after the handshake; on failure the
 * client goes on with the socket alone, and the sentence is in errstr). submit writes one
 * request, already checked, into the submission ring: 0, or CONVD_EAGAIN when the ring is full
 * (the caller sends it on the socket instead). drain reads every completion posted and returns
 * how many. socket_news says whether the daemon sent something on the socket since the last
 * look. set_waiting tells the daemon whether to ring our socket for completions. */
int cl_ring_attach(convd_client *c, uint64_t deadline);
void cl_ring_drop(convd_client *c);
int cl_ring_submit(convd_client *c, const struct convd_conv_args *a, uint64_t id);

/* Stores the done value of every gated request in flight (all of them, or only those whose gate
 * lies in `region` when it is not NULL), so that no stream waits on a word nobody will write. */
void cl_gates_release(convd_client *c, const convd_region *region);
unsigned cl_ring_drain(convd_client *c);
bool cl_ring_socket_news(convd_client *c);
void cl_ring_set_waiting(convd_client *c, bool waiting);
/* Waits until the daemon has taken every submission in the ring, so that a message sent on the
 * socket next (unregistering a region, say) comes after them, as it would on the socket alone.
 * 0, or CONVD_ETIMEDOUT. */
int cl_ring_flush(convd_client *c, uint64_t deadline);

/* Copies a protobuf string into a fixed buffer, truncated on a UTF-8 character boundary. */
void cl_strlcpy(char *dst, size_t cap, const char *src);

/* Request slots (requests.c, which alone reads and writes slots, index, the free list, the done
 * list and the counts). */
void cl_slots_init(convd_client *c);
int32_t cl_slot_find(const convd_client *c, uint64_t id);
void cl_slots_free(convd_client *c);

/* Regions (regions.c): unmaps and frees every region without telling the daemon. */
void cl_regions_drop_all(convd_client *c);

#endif
