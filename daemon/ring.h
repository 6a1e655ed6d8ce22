/*
 * The daemon's side of one connection's rings (common/ring_layout.h): mapping the client's memfd,
 * and taking submissions and posting completions with every index the client wrote checked. No
 * sockets and no connection state here, so that a hostile ring is tested on plain memory.
 */
#ifndef CONVD_DAEMON_RING_H
#define CONVD_DAEMON_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ring_layout.h"

struct ring {
    void *map;
    size_t map_len;
    struct convd_ring_header *hdr;
    struct convd_ring_sqe *sq;
    struct convd_ring_cqe *cq;
    /* Our own copies: never read back from shared memory. */
    uint32_t sq_entries, cq_entries;
    uint32_t sq_head;  /* next submission to take */
    uint32_t cq_tail;  /* next completion slot */
    uint32_t reserved; /* submissions taken whose completion is still owed */
    uint32_t sock_seq; /* what the header's sock_seq says */
};

enum ring_take_result {
    RING_EMPTY = 0, /* nothing submitted */
    RING_TAKEN,     /* *ret_sqe holds a copy of the next submission; a completion is reserved */
    RING_FULL,      /* submissions wait, but the completion ring has no room for another */
    RING_CORRUPT,   /* an index the client wrote is impossible; the sentence says which */
};

/* Checks an AttachRing (version, entry counts, size, exactly one descriptor, seals against
 * shrinking and growing and none against writing, the file's size) and maps the memfd shared
 * and writable. Returns 0, or CONVD_EINVAL / CONVD_ESEAL / CONVD_EBOUNDS / CONVD_EVERSION /
 * CONVD_ENOMEM with a sentence; nothing is left mapped on failure. The descriptors stay the
 * caller's to close. */
int ring_map(struct ring *r, uint32_t version, uint32_t sq_entries, uint32_t cq_entries,
             uint64_t size, const int *fds, size_t nfds, char *why, size_t why_len);

/* Sets the daemon's fields of a ring on plain memory (tests): as ring_map after mapping. */
void ring_init_mem(struct ring *r, void *mem, size_t len, uint32_t sq_entries, uint32_t cq_entries);

/* Unmaps the ring. Accepts a ring that was never mapped. */
void ring_unmap(struct ring *r);

/* Takes the next submission, copied out of shared memory before anything looks at it. */
enum ring_take_result ring_take(struct ring *r, struct convd_ring_sqe *ret_sqe, char *why,
                                size_t why_len);

/* Gives back the completion reserved for a submission that is answered on the socket instead. */
void ring_release(struct ring *r);

/* Posts the completion reserved for a submission. Returns 0, or -1 when the client moved
 * cq_head so that the reserved room is gone (a corrupt ring; the sentence says so). */
int ring_post(struct ring *r, const struct convd_ring_cqe *cqe, char *why, size_t why_len);

/* True when the client has published submissions not yet taken and the completion ring has room
 * to take one (a hint: ring_take decides). A ring that is full waits for its client, who rings
 * the doorbell after reading completions while submissions wait. */
bool ring_has_submissions(const struct ring *r);

/* cq_head as the client last published it. */
uint32_t ring_cq_head(const struct ring *r);

/* Sets or clears NEED_WAKEUP. Call ring_fence() between setting it and the last look at the
 * ring before sleeping. */
void ring_set_need_wakeup(struct ring *r, bool on);

/* True when the client sleeps and wants a Doorbell for completions posted before the fence. */
bool ring_client_waiting(const struct ring *r);

/* Counts a message sent on the socket, so that a client spinning on the rings looks there. */
void ring_note_socket(struct ring *r);

/* The full fence of the doorbell protocol (common/ring_layout.h). */
static inline void ring_fence(void)
{
    atomic_thread_fence(memory_order_seq_cst);
}

#endif
