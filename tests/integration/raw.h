/*
 * Raw protocol access for hostile tests: a SOCK_SEQPACKET connection with hand-built protobuf
 * (or plain bytes), descriptors attached as the test wants, and decoded replies. Nothing here goes
 * through the client library, so the daemon sees exactly what a broken or malicious peer sends.
 */
#ifndef CONVD_IT_RAW_H
#define CONVD_IT_RAW_H

#include <stddef.h>
#include <stdint.h>

#include "convd.pb-c.h"
#include "convd/conv.h"

/* Connects to the socket (asserts success). */
int raw_connect(const char *path);

/* Sends bytes as one datagram with `nfds` descriptors attached (SCM_RIGHTS). Returns 0 or
 * -errno. */
int raw_send_bytes_fds(int fd, const void *buf, size_t len, const int *fds, size_t nfds);

/* Sends bytes as one datagram without descriptors; asserts success. */
void raw_send_bytes(int fd, const void *buf, size_t len);

/* Packs and sends a message with descriptors; asserts success. */
void raw_send(int fd, const Convd__ClientMessage *m, const int *fds, size_t nfds);

/* Receives and decodes one message, waiting up to IT_TIMEOUT_MS. Returns NULL when the daemon
 * closed the connection; asserts on timeout or on an undecodable reply. Free the result with
 * raw_free(). */
Convd__ServerMessage *raw_recv(int fd);

/* Like raw_recv, but asserts that a message came and that it has the given case. */
Convd__ServerMessage *raw_expect(int fd, Convd__ServerMessage__MsgCase what);

void raw_free(Convd__ServerMessage *m);

/* Waits until the daemon closes the connection, discarding anything it still sends; asserts
 * it happens within IT_TIMEOUT_MS. */
void raw_expect_eof(int fd);

/* Sends Hello with the given version and asserts a successful HelloReply (for the current
 * version). Returns the reply's max_inflight. */
uint32_t raw_hello(int fd);

/* Asserts that the next message is a ProtocolError with status `status` and a non-empty
 * sentence containing `word` (case-insensitive; NULL: any), and returns nothing. */
void raw_expect_protocol_error(int fd, int status, const char *word);

/* Creates a memfd of `size` bytes with the given seals (F_SEAL_* bits, 0 for none). */
int raw_memfd(uint64_t size, unsigned seals);

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

#endif
