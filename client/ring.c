/*
 * The client's side of the rings (common/ring_layout.h): a memfd the client creates and the
 * daemon maps, so that a request is a store into shared memory and its completion a load,
 * without a system call either way while both sides are awake. The socket stays for everything
 * else, for failed requests (their completions carry sentences), and as the doorbell of a side
 * that sleeps.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client_priv.h"
#include "clock.h"
#include "sock.h"
#include "wire.h"

/* Entries for a client that may have max_inflight requests in flight: the submission ring then
 * never fills before the in-flight limit does. */
static uint32_t cl_ring_entries(uint32_t max_inflight)
{
    uint32_t n = 16;
    while (n < max_inflight && n < CONVD_RING_MAX_ENTRIES)
        n <<= 1;
    return n;
}

static void cl_ring_unmap(convd_client *c)
{
    if (c->ring.map != NULL)
        munmap(c->ring.map, c->ring.map_len);
    memset(&c->ring, 0, sizeof(c->ring));
    c->has_ring = false;
}

int cl_ring_attach(convd_client *c, uint64_t deadline)
{
    const uint32_t n = cl_ring_entries(c->info.max_inflight);
    const uint64_t size = convd_ring_bytes(n, n);
    int fd = memfd_create("convd-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return cl_fail(c, CONVD_ENOMEM, "memfd_create for the rings: %s", strerror(errno));
    void *map = MAP_FAILED;
    if (ftruncate(fd, (off_t)size) == 0)
        map = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        int err = errno;
        if (map != MAP_FAILED)
            munmap(map, (size_t)size);
        close(fd);
        return cl_fail(c, CONVD_ENOMEM, "cannot set up %llu bytes of rings: %s",
                       (unsigned long long)size, strerror(err));
    }
    struct cl_ring *r = &c->ring;
    r->map = map;
    r->map_len = (size_t)size;
    r->hdr = map;
    r->sq = convd_ring_sq(map);
    r->cq = convd_ring_cq(map, n);
    r->sq_entries = n;
    r->cq_entries = n;
    r->hdr->magic = CONVD_RING_MAGIC;
    r->hdr->version = CONVD_RING_VERSION;
    r->hdr->sq_entries = n;
    r->hdr->cq_entries = n;
    /* Until a wait spins, completions ring the socket: a caller with its own poll loop sees
     * them on convd_client_fd(). */
    atomic_store_explicit(&r->hdr->client_flags, CONVD_RING_WAITING, memory_order_release);

    Convd__AttachRing ar = CONVD__ATTACH_RING__INIT;
    ar.version = CONVD_RING_VERSION;
    ar.sq_entries = n;
    ar.cq_entries = n;
    ar.size = size;
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_ATTACH_RING;
    m.attach_ring = &ar;
    Convd__ServerMessage *reply = NULL;
    int rc = cl_request(c, &m, fd, CL_EXPECT_RING, 0, deadline, &reply);
    close(fd);
    if (rc != 0) {
        cl_ring_unmap(c);
        return rc;
    }
    const Convd__RingReply *rr = reply->ring_reply;
    rc = rr->status;
    if (rc != 0) {
        cl_fail(c, rc < 0 ? rc : CONVD_EPROTO, "the daemon refused the rings: %s",
                rr->error[0] != '\0' ? rr->error : convd_strerror(rc));
        rc = rc < 0 ? rc : CONVD_EPROTO;
        cl_ring_unmap(c);
    } else {
        c->has_ring = true;
    }
    convd__server_message__free_unpacked(reply, NULL);
    return rc;
}

void cl_ring_drop(convd_client *c)
{
    cl_ring_unmap(c);
}

/* Wakes a daemon that sleeps with NEED_WAKEUP set. */
static void cl_ring_doorbell(convd_client *c)
{
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    Convd__Doorbell db = CONVD__DOORBELL__INIT;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_DOORBELL;
    m.doorbell = &db;
    uint8_t buf[16];
    int len = wire_pack_client(&m, buf, sizeof(buf));
    /* A full socket means the daemon has reading to do anyway. */
    if (len > 0)
        (void)sock_send(c->fd, buf, (size_t)len, -1);
}

static void cl_ring_tensor(const struct convd_tensor *t, struct convd_ring_tensor *out)
{
    out->region_id = t->region->id;
    out->offset = t->offset;
    out->bytes = t->bytes;
}

int cl_ring_submit(convd_client *c, const struct convd_conv_args *a, uint64_t id)
{
    struct cl_ring *r = &c->ring;
    uint32_t head = atomic_load_explicit(&r->hdr->sq_head, memory_order_acquire);
    if (r->sq_tail - head >= r->sq_entries)
        return CONVD_EAGAIN;
    const struct convd_problem *p = &a->problem;
    struct convd_ring_sqe *e = &r->sq[r->sq_tail & (r->sq_entries - 1)];
    memset(e, 0, sizeof(*e));
    e->id = id;
    e->opcode = CONVD_RING_OP_CONV;
    const bool relu = p->activation == CONVD_ACT_RELU;
    e->flags = (p->has_bias ? CONVD_RING_F_BIAS : 0) | (relu ? CONVD_RING_F_RELU : 0) |
               (p->allow_tf32 ? CONVD_RING_F_ALLOW_TF32 : 0);
    e->activation = relu ? 0 : (uint32_t)p->activation;
    e->act_min = p->act_min;
    e->act_max = p->act_max;
    e->n = (uint32_t)p->n;
    e->h = (uint32_t)p->h;
    e->w = (uint32_t)p->w;
    e->c = (uint32_t)p->c;
    e->k = (uint32_t)p->k;
    e->r = (uint32_t)p->r;
    e->s = (uint32_t)p->s;
    e->groups = (uint32_t)p->groups;
    e->stride_h = (uint32_t)p->stride_h;
    e->stride_w = (uint32_t)p->stride_w;
    e->pad_top = (uint32_t)p->pad_top;
    e->pad_bottom = (uint32_t)p->pad_bottom;
    e->pad_left = (uint32_t)p->pad_left;
    e->pad_right = (uint32_t)p->pad_right;
    e->dil_h = (uint32_t)p->dil_h;
    e->dil_w = (uint32_t)p->dil_w;
    Convd__Problem pb = CONVD__PROBLEM__INIT;
    wire_problem_to_pb(p, &pb);
    e->dtype = (uint32_t)pb.dtype;
    e->layout = (uint32_t)pb.layout;
    e->priority = a->priority;
    e->timeout_us = a->timeout_us;
    cl_ring_tensor(&a->input, &e->input);
    cl_ring_tensor(&a->weight, &e->weight);
    if (p->has_bias)
        cl_ring_tensor(&a->bias, &e->bias);
    cl_ring_tensor(&a->output, &e->output);
    if (a->gate.region != NULL) {
        e->flags |= CONVD_RING_F_GATE;
        e->gate.region_id = a->gate.region->id;
        e->gate.ready_offset = a->gate.ready_offset;
        e->gate.done_offset = a->gate.done_offset;
        e->gate.ready_value = a->gate.ready_value;
        e->gate.done_value = a->gate.done_value;
    }
    r->sq_tail++;
    atomic_store_explicit(&r->hdr->sq_tail, r->sq_tail, memory_order_release);
    /* The doorbell protocol's fence: either the daemon, about to sleep, sees this entry, or we
     * see its NEED_WAKEUP and wake it. */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&r->hdr->daemon_flags, memory_order_relaxed) & CONVD_RING_NEED_WAKEUP)
        cl_ring_doorbell(c);
    return 0;
}

unsigned cl_ring_drain(convd_client *c)
{
    struct cl_ring *r = &c->ring;
    uint32_t tail = atomic_load_explicit(&r->hdr->cq_tail, memory_order_acquire);
    uint32_t avail = tail - r->cq_head;
    if (avail == 0)
        return 0;
    if (avail > r->cq_entries) {
        cl_trouble(c, CONVD_EPROTO,
                   "the daemon's completion ring says %u completions wait; it holds %u", avail,
                   r->cq_entries);
        return 0;
    }
    for (uint32_t i = 0; i < avail; i++) {
        const struct convd_ring_cqe *e = &r->cq[(r->cq_head + i) & (r->cq_entries - 1)];
        cl_complete(c, e->id, e->status, "", e->queue_us, e->exec_us, e->batch_size);
    }
    r->cq_head = tail;
    atomic_store_explicit(&r->hdr->cq_head, r->cq_head, memory_order_release);
    /* A daemon that went to sleep on a full completion ring waits for this room: the same fence
     * and flag as after a submission. */
    if (atomic_load_explicit(&r->hdr->sq_head, memory_order_relaxed) != r->sq_tail) {
        atomic_thread_fence(memory_order_seq_cst);
        if (atomic_load_explicit(&r->hdr->daemon_flags, memory_order_relaxed) &
            CONVD_RING_NEED_WAKEUP)
            cl_ring_doorbell(c);
    }
    return avail;
}

bool cl_ring_socket_news(convd_client *c)
{
    uint32_t seq = atomic_load_explicit(&c->ring.hdr->sock_seq, memory_order_acquire);
    if (seq == c->ring.sock_seq)
        return false;
    c->ring.sock_seq = seq;
    return true;
}

void cl_ring_set_waiting(convd_client *c, bool waiting)
{
    atomic_store_explicit(&c->ring.hdr->client_flags, waiting ? CONVD_RING_WAITING : 0u,
                          memory_order_relaxed);
    if (waiting)
        atomic_thread_fence(memory_order_seq_cst);
}

int cl_ring_flush(convd_client *c, uint64_t deadline)
{
    while (c->has_ring && !c->closed &&
           atomic_load_explicit(&c->ring.hdr->sq_head, memory_order_acquire) != c->ring.sq_tail) {
        /* Reading our completions makes the room the daemon may be waiting for. */
        cl_drain(c);
        if (convd_now_ns() >= deadline)
            return cl_fail(c, CONVD_ETIMEDOUT,
                           "timed out waiting for the daemon to take the requests in the ring");
        poll(NULL, 0, 0);
    }
    return 0;
}
