/*
 * libFuzzer target: the bytes as a client's ring, and a script of what the client and the daemon
 * do next. The daemon's side runs as connection.c runs it: ring_take until EMPTY, FULL or
 * CORRUPT, each entry turned into a ConvRequest (wire_ring_request, as the daemon does),
 * validated against the fixture (fixture.h) with the requests in flight as the idmap, a
 * rejection giving its reservation back (ring_release), an accepted request holding its regions
 * until it completes with ring_post (success) or ring_release (failure). The client may move
 * cq_head and sq_tail anywhere and scribble on the daemon's line between steps.
 *
 * Input: shape (sq_entries = 1 << (b & 3), cq_entries = 1 << ((b >> 2) & 3)), max_inflight - 1
 * (low 4 bits), 4 bytes of start (little-endian: every counter has already wrapped this far), the
 * 192-byte header (its sq_tail and cq_head are taken relative to start), sq_entries entries of
 * 256 bytes, then two-byte steps (op, arg); a short input is zero-filled up to the steps.
 *
 * Checked after every step: the daemon's copies (sq_head, cq_tail, entry counts) are what the
 * script says they must be whatever the client wrote, reserved equals the requests in flight and
 * never exceeds cq_entries, a take never leaves fewer free completion slots than reservations, a
 * post succeeds whenever the client's cq_head leaves room for the reserved completion, the entry
 * taken is the one at sq_head, every refusal has a sentence, and region references and the
 * in-flight map match the requests held.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convd.pb-c.h"
#include "convd/status.h"
#include "fixture.h"
#include "idmap.h"
#include "request.h"
#include "ring.h"
#include "why.h"
#include "wire.h"

#define MAX_STEPS  512
#define MAX_FLIGHT 16

enum {
    OP_POLL = 0, /* the daemon polls the ring: arg % 64 + 1 entries at most */
    OP_DONE,     /* the oldest request in flight succeeds: its completion is posted */
    OP_FAIL,     /* the oldest request in flight fails: answered on the socket instead */
    OP_CONSUME,  /* the client reads up to arg completions and publishes cq_head */
    OP_CQ_HEAD,  /* the client adds (int8_t)arg to cq_head, sane or not */
    OP_SUBMIT,   /* the client adds (int8_t)arg to sq_tail, sane or not */
    OP_SCRIBBLE, /* the client writes arg bytes over the daemon's line */
    OP_WAKE,     /* the doorbell handshake: NEED_WAKEUP (arg & 1), WAITING (arg & 2), sock_seq */
    OP_COUNT,
};

struct state {
    struct ring ring;
    struct convd_ring_header *hdr;
    uint32_t sq_entries, cq_entries;
    uint32_t sq_head, cq_tail; /* what the daemon's copies must be */
    bool alive;                /* false once the daemon found the ring corrupt */
    struct req_context ctx;
    struct idmap inflight;
    struct dreq *flight[MAX_FLIGHT]; /* accepted requests, oldest first */
    unsigned n_flight;
    int held[FX_N_REGIONS]; /* region references the requests in flight hold */
};

static void check_state(const struct state *s)
{
    const struct ring *r = &s->ring;
    FX_CHECK(r->hdr == s->hdr && r->sq_entries == s->sq_entries && r->cq_entries == s->cq_entries);
    FX_CHECK(r->sq_head == s->sq_head && r->cq_tail == s->cq_tail);
    FX_CHECK(r->reserved == s->n_flight);
    FX_CHECK(r->reserved <= r->cq_entries);
    FX_CHECK(s->inflight.count == s->n_flight);
    fx_check_refs(s->held);
}

/* A taken entry: rejected (its reservation given back, as conn_reject does) or in flight. */
static void accept_entry(struct state *s, const struct convd_ring_sqe *e)
{
    Convd__ConvRequest req;
    Convd__Problem pb;
    Convd__TensorRef refs[4];
    Convd__Gate gate;
    char why[320];
    int rc = wire_ring_request(e, &req, &pb, refs, &gate, why, sizeof(why));
    if (rc == 0) {
        FX_CHECK(s->n_flight < MAX_FLIGHT);
        struct dreq *d = malloc(sizeof(*d));
        FX_CHECK(d != NULL);
        memset(d, 0xa5, sizeof(*d));
        rc = req_validate(&req, &s->ctx, d, why, sizeof(why));
        if (rc == 0) {
            fx_check_valid(&req, &s->ctx, d);
            d->via_ring = true;
            FX_CHECK(idmap_put(&s->inflight, d->id, d) == 0);
            req_ref_regions(d);
            fx_count_uses(d, s->held, 1);
            s->flight[s->n_flight++] = d;
            return;
        }
        free(d);
    }
    fx_check_sentence(rc, why, sizeof(why));
    ring_release(&s->ring);
}

/* conn_poll_ring. */
static void poll_ring(struct state *s, unsigned budget)
{
    for (unsigned taken = 0; taken < budget && s->alive; taken++) {
        bool hint = ring_has_submissions(&s->ring);
        uint32_t tail = atomic_load(&s->hdr->sq_tail);
        uint32_t cq_head = atomic_load(&s->hdr->cq_head);
        uint32_t waiting = tail - s->sq_head, unread = s->cq_tail - cq_head;
        uint32_t reserved = s->ring.reserved;
        struct convd_ring_sqe e;
        char why[256] = "";
        enum ring_take_result res = ring_take(&s->ring, &e, why, sizeof(why));
        switch (res) {
        case RING_EMPTY:
            FX_CHECK(waiting == 0);
            return;
        case RING_FULL:
            FX_CHECK(waiting >= 1 && waiting <= s->sq_entries);
            FX_CHECK(unread <= s->cq_entries && unread + reserved >= s->cq_entries);
            return;
        case RING_CORRUPT:
            fx_check_sentence(CONVD_EPROTO, why, sizeof(why));
            FX_CHECK(waiting > s->sq_entries || (waiting > 0 && unread > s->cq_entries));
            s->alive = false;
            return;
        case RING_TAKEN:
            FX_CHECK(hint);
            FX_CHECK(waiting >= 1 && waiting <= s->sq_entries);
            /* Room for every completion owed, this one included. */
            FX_CHECK(unread + s->ring.reserved <= s->cq_entries);
            FX_CHECK(memcmp(&e, &s->ring.sq[s->sq_head & (s->sq_entries - 1)], sizeof(e)) == 0);
            s->sq_head++;
            FX_CHECK(atomic_load(&s->hdr->sq_head) == s->sq_head);
            accept_entry(s, &e);
            check_state(s);
            break;
        default:
            FX_CHECK(!"ring_take result");
        }
    }
}

/* The oldest request in flight finishes: posted on success (conn_request_done), its reservation
 * given back on failure or once the ring is dead. */
static void finish_oldest(struct state *s, bool ok)
{
    if (s->n_flight == 0)
        return;
    struct dreq *d = s->flight[0];
    s->n_flight--;
    memmove(&s->flight[0], &s->flight[1], s->n_flight * sizeof(s->flight[0]));
    if (ok && s->alive) {
        struct convd_ring_cqe cqe = {.id = d->id, .status = 0, .batch_size = 1, .exec_us = 3};
        uint32_t cq_head = atomic_load(&s->hdr->cq_head);
        uint32_t unread = s->cq_tail - cq_head;
        uint32_t reserved = s->ring.reserved;
        char why[192] = "";
        if (ring_post(&s->ring, &cqe, why, sizeof(why)) == 0) {
            FX_CHECK(unread < s->cq_entries);
            FX_CHECK(memcmp(&s->ring.cq[s->cq_tail & (s->cq_entries - 1)], &cqe, sizeof(cqe)) == 0);
            s->cq_tail++;
            FX_CHECK(atomic_load(&s->hdr->cq_tail) == s->cq_tail);
        } else {
            /* Only a client that moved cq_head past its reservations can make a post fail. */
            FX_CHECK((uint64_t)unread + reserved > s->cq_entries);
            fx_check_sentence(CONVD_EPROTO, why, sizeof(why));
            s->alive = false;
            ring_release(&s->ring);
        }
    } else {
        ring_release(&s->ring);
    }
    FX_CHECK(idmap_del(&s->inflight, d->id) == d);
    fx_count_uses(d, s->held, -1);
    req_unref_regions(d);
    free(d);
}

static void step(struct state *s, uint8_t op, uint8_t arg)
{
    struct convd_ring_header *h = s->hdr;
    switch (op % OP_COUNT) {
    case OP_POLL:
        poll_ring(s, arg % 64u + 1);
        break;
    case OP_DONE:
        finish_oldest(s, true);
        break;
    case OP_FAIL:
        finish_oldest(s, false);
        break;
    case OP_CONSUME: {
        uint32_t head = atomic_load(&h->cq_head);
        uint32_t unread = atomic_load(&h->cq_tail) - head;
        atomic_store(&h->cq_head, head + (arg < unread ? arg : unread));
        break;
    }
    case OP_CQ_HEAD:
        atomic_fetch_add(&h->cq_head, (uint32_t)(int32_t)(int8_t)arg);
        break;
    case OP_SUBMIT:
        atomic_fetch_add(&h->sq_tail, (uint32_t)(int32_t)(int8_t)arg);
        break;
    case OP_SCRIBBLE: {
        uint32_t junk = arg * 0x01010101u;
        atomic_store(&h->sq_head, junk);
        atomic_store(&h->cq_tail, junk);
        atomic_store(&h->daemon_flags, junk);
        atomic_store(&h->sock_seq, junk);
        break;
    }
    case OP_WAKE: {
        ring_set_need_wakeup(&s->ring, arg & 1);
        FX_CHECK(atomic_load(&h->daemon_flags) == (arg & 1 ? CONVD_RING_NEED_WAKEUP : 0));
        ring_fence();
        atomic_store(&h->client_flags, arg & 2 ? CONVD_RING_WAITING : 0);
        FX_CHECK(ring_client_waiting(&s->ring) == ((arg & 2) != 0));
        FX_CHECK(ring_cq_head(&s->ring) == atomic_load(&h->cq_head));
        uint32_t seq = s->ring.sock_seq;
        ring_note_socket(&s->ring);
        FX_CHECK(s->ring.sock_seq == seq + 1 && atomic_load(&h->sock_seq) == seq + 1);
        break;
    }
    }
    check_state(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    enum { HEAD = 6 };
    uint8_t head[HEAD] = {0};
    memcpy(head, data, size < HEAD ? size : HEAD);
    struct state *s = calloc(1, sizeof(*s));
    FX_CHECK(s != NULL);
    s->sq_entries = 1u << (head[0] & 3);
    s->cq_entries = 1u << ((head[0] >> 2) & 3);
    uint32_t start = (uint32_t)head[2] | (uint32_t)head[3] << 8 | (uint32_t)head[4] << 16 |
                     (uint32_t)head[5] << 24;

    /* Exactly the bytes the daemon may touch, so that ASan sees one past them. */
    size_t image = CONVD_RING_SQ_OFFSET + (size_t)s->sq_entries * sizeof(struct convd_ring_sqe);
    size_t len = (size_t)convd_ring_cq_offset(s->sq_entries) +
                 (size_t)s->cq_entries * sizeof(struct convd_ring_cqe);
    uint8_t *mem = calloc(1, len);
    FX_CHECK(mem != NULL);
    size_t have = size > HEAD ? size - HEAD : 0;
    size_t hdr_bytes = sizeof(struct convd_ring_header);
    memcpy(mem, data + HEAD, have < hdr_bytes ? have : hdr_bytes);
    if (have > hdr_bytes)
        memcpy(mem + CONVD_RING_SQ_OFFSET, data + HEAD + hdr_bytes,
               have - hdr_bytes < image - CONVD_RING_SQ_OFFSET ? have - hdr_bytes
                                                               : image - CONVD_RING_SQ_OFFSET);
    size_t steps_at = HEAD + hdr_bytes + (image - CONVD_RING_SQ_OFFSET);

    ring_init_mem(&s->ring, mem, len, s->sq_entries, s->cq_entries);
    s->hdr = s->ring.hdr;
    /* A ring that has carried `start` requests already: both sides' counters moved on. */
    s->ring.sq_head = s->ring.cq_tail = s->sq_head = s->cq_tail = start;
    atomic_store(&s->hdr->sq_head, start);
    atomic_store(&s->hdr->cq_tail, start);
    atomic_fetch_add(&s->hdr->sq_tail, start);
    atomic_fetch_add(&s->hdr->cq_head, start);
    s->alive = true;
    idmap_init(&s->inflight);
    s->ctx = (struct req_context){fx_regions_table(), fx_backend(), &s->inflight,
                                  1u + (head[1] & 15u), CONVD_PROTOCOL_VERSION};
    check_state(s);

    /* The daemon looks at a ring as soon as it is attached. */
    poll_ring(s, 64);
    check_state(s);
    for (size_t i = steps_at, n = 0; i + 1 < size && n < MAX_STEPS && s->alive; i += 2, n++)
        step(s, data[i], data[i + 1]);
    /* Requests in flight finish, and are posted while the ring lives. */
    while (s->n_flight > 0) {
        finish_oldest(s, true);
        check_state(s);
    }
    FX_CHECK(s->ring.reserved == 0);
    fx_check_refs(NULL);
    idmap_free(&s->inflight);
    ring_unmap(&s->ring);
    free(mem);
    free(s);
    return 0;
}
