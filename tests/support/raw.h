/*
 * Raw protocol access for tests (the integration tests against the daemon binary, the daemon
 * library's in-process server test): a SOCK_SEQPACKET connection with hand-built protobuf
 * (or plain bytes), descriptors attached as the test wants, and decoded replies. Nothing here goes
 * through the client library, so the daemon sees exactly what a broken or malicious peer sends.
 */
#ifndef CONVD_TEST_RAW_H
#define CONVD_TEST_RAW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "convd.pb-c.h"
#include "convd/conv.h"
#include "ring_layout.h"

/* The name the client library gives its ring memfds (raw_ring_create uses it too). */
#define RAW_RING_MEMFD_NAME "convd-ring"

/* Connects to the socket (asserts success). */
int raw_connect(const char *path);

/* Sends bytes as one datagram with `nfds` descriptors attached (SCM_RIGHTS). Returns 0 or
 * -errno. */
int raw_send_bytes_fds(int fd, const void *buf, size_t len, const int *fds, size_t nfds);

/* Sends bytes as one datagram without descriptors; asserts success. */
void raw_send_bytes(int fd, const void *buf, size_t len);

/* Packs and sends a message with descriptors; asserts success. */
void raw_send(int fd, const Convd__ClientMessage *m, const int *fds, size_t nfds);

/* Receives and decodes one message, waiting up to TU_TIMEOUT_MS. Returns NULL when the daemon
 * closed the connection; asserts on timeout or on an undecodable reply. Free the result with
 * raw_free(). */
Convd__ServerMessage *raw_recv(int fd);

/* Like raw_recv, but when the daemon closed the connection with datagrams of ours unread, the
 * kernel reports the reset (ECONNRESET) ahead of the messages the daemon queued before closing:
 * this reads on past it, so that those messages are not lost. For tests whose connection the
 * daemon closes (a ProtocolError, then EOF). */
Convd__ServerMessage *raw_recv_past_reset(int fd);

/* Like raw_recv, but asserts that a message came and that it has the given case. */
Convd__ServerMessage *raw_expect(int fd, Convd__ServerMessage__MsgCase what);

void raw_free(Convd__ServerMessage *m);

/* Waits until the daemon closes the connection, discarding anything it still sends; asserts
 * it happens within TU_TIMEOUT_MS. */
void raw_expect_eof(int fd);

/* Sends Hello with the given version and asserts a successful HelloReply (for the current
 * version). Returns the reply's max_inflight. */
uint32_t raw_hello(int fd);

/* Asserts that the next message is a ProtocolError with status `status` and a non-empty
 * sentence containing `word` (case-insensitive; NULL: any), and returns nothing. */
void raw_expect_protocol_error(int fd, int status, const char *word);

/* Sends RegisterRegion(MEMFD) with the given descriptors and returns the RegionReply's status;
 * if why is not NULL the reply's sentence is copied there. */
int raw_register(int fd, uint64_t region_id, uint64_t size, const int *fds, size_t nfds, char *why,
                 size_t why_len);

/* Sends UnregisterRegion and returns the RegionReply's status. */
int raw_unregister(int fd, uint64_t region_id);

/* A ConvRequest under construction: the message, its problem and its four tensor references,
 * wired together. */
struct raw_conv {
    Convd__ClientMessage msg;
    Convd__ConvRequest req;
    Convd__Problem prob;
    Convd__TensorRef in, w, b, out;
};

/* Fills a request for problem p with all tensors in region_id, laid out back to back from
 * offset 0 (input, weight, bias if any, output), byte counts matching the problem. Returns the
 * number of bytes the layout needs. */
uint64_t raw_conv_init(struct raw_conv *rc, uint64_t id, const struct convd_problem *p,
                       uint64_t region_id);

/* Sends the request. */
void raw_conv_send(int fd, struct raw_conv *rc);

/* Waits for the completion of `id` and returns its status (sentence copied to why). Asserts
 * that the next message is a Completion for that id. */
int raw_expect_completion(int fd, uint64_t id, char *why, size_t why_len);

/* Case-insensitive substring test. */
int raw_contains(const char *hay, const char *needle);

/*
 * Rings (common/ring_layout.h) from the client's side, written by hand: the test decides every
 * counter and every byte of every entry, so it can also write what a correct client never would.
 */

/* A ring the test created: its memfd, the test's own shared mapping of it, and the client's
 * counters as the test last published them. */
struct raw_ring {
    int memfd; /* -1 once closed */
    uint8_t *map;
    size_t len;
    uint32_t sq_entries, cq_entries;
    struct convd_ring_header *hdr;
    struct convd_ring_sqe *sq;
    struct convd_ring_cqe *cq;
    uint32_t sq_tail; /* entries written (published or not) */
    uint32_t cq_head; /* completions consumed */
};

/* Creates a ring memfd for sq_entries / cq_entries (named like the library's, so that
 * it_count_ring_maps counts the daemon's mapping of it): tu_memfd of convd_ring_bytes sealed
 * with F_SEAL_SHRINK | F_SEAL_GROW, mapped shared, the header's informational fields filled.
 * Asserts success. */
void raw_ring_create(struct raw_ring *r, uint32_t sq_entries, uint32_t cq_entries);

/* Unmaps the ring and closes its memfd (if still open). */
void raw_ring_destroy(struct raw_ring *r);

/* Sends AttachRing with exactly these fields and descriptors, and returns RingReply's status;
 * the sentence is copied to why (when not NULL). Asserts that the answer is a RingReply. */
int raw_attach_ring(int fd, uint32_t version, uint32_t sq_entries, uint32_t cq_entries,
                    uint64_t size, const int *fds, size_t nfds, char *why, size_t why_len);

/* Attaches r to the connection with its own memfd and a correct AttachRing; asserts success. */
void raw_ring_attach(int fd, struct raw_ring *r);

/* The submission entry for a request built with raw_conv_init (and perhaps changed since): its
 * id, problem, tensor references, priority and timeout, opcode CONV. */
void raw_ring_sqe_from_conv(const struct raw_conv *rc, struct convd_ring_sqe *e);

/* Writes e at the next submission slot without publishing it. */
void raw_ring_put(struct raw_ring *r, const struct convd_ring_sqe *e);

/* Publishes every entry written so far as the protocol says: sq_tail with release ordering, a
 * full fence, then a Doorbell on fd when the daemon's NEED_WAKEUP is set. Returns whether a
 * Doorbell was sent. A failed send (the daemon closed the connection) is not an error here. */
bool raw_ring_publish(int fd, struct raw_ring *r);

/* raw_ring_put of the request's entry, then raw_ring_publish. */
void raw_ring_submit(int fd, struct raw_ring *r, const struct raw_conv *rc);

/* Sends a Doorbell datagram; returns 0 or -errno. */
int raw_send_doorbell(int fd);

/* Completions posted and not yet consumed. */
uint32_t raw_ring_cq_ready(const struct raw_ring *r);

/* Waits up to timeout_ms for a completion in the ring; when one is there, copies it to *ret,
 * consumes it (publishing cq_head) and returns true. */
bool raw_ring_wait_cqe(struct raw_ring *r, struct convd_ring_cqe *ret, int timeout_ms);

/* Waits (up to TU_TIMEOUT_MS, asserting) for whichever comes first: a completion in the ring
 * (copied to *ret_cqe and consumed; returns true) or a message on the socket (*ret_msg, NULL
 * when the daemon closed the connection; returns false). */
bool raw_ring_next(int fd, struct raw_ring *r, struct convd_ring_cqe *ret_cqe,
                   Convd__ServerMessage **ret_msg);

/* Waits for the completion of id, in the ring or as a Completion on the socket, asserting that
 * whatever comes next is for id. Returns its status; the sentence goes to why (empty for a ring
 * completion) and the ring entry to *ret_cqe (when not NULL; zeroed for a socket one). */
int raw_ring_expect_completion(int fd, struct raw_ring *r, uint64_t id,
                               struct convd_ring_cqe *ret_cqe, char *why, size_t why_len);

#endif
