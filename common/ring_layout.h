/*
 * Submission and completion rings in shared memory: the fast path between a client and the
 * daemon (docs/protocol.md, "Rings"). Layout version 1.
 *
 * The client creates a memfd of convd_ring_bytes(sq, cq) bytes, seals it against shrinking and
 * growing, maps it, and passes it with AttachRing; the daemon maps it too. Then:
 *   - the client writes a convd_ring_sqe at sq_tail & (sq_entries - 1) and publishes it by
 *     advancing sq_tail (release); the daemon consumes entries up to sq_tail and publishes
 *     sq_head;
 *   - the daemon writes a convd_ring_cqe for each request that succeeded at cq_tail and
 *     advances cq_tail (release); the client consumes up to cq_tail and publishes cq_head.
 *     Failed requests are answered on the socket instead, with a Completion that carries the
 *     sentence;
 *   - the daemon only takes a submission when the completion ring has room for it, so a
 *     completion never waits for space;
 *   - the daemon bumps sock_seq after each message it sends on the socket (Doorbells aside: they
 *     go only to a client that sleeps on the socket), so that a client spinning on cq_tail knows
 *     when to read the socket too;
 *   - a client that reads completions while submissions of its own wait checks NEED_WAKEUP too
 *     (after the same fence), since a daemon may have gone to sleep on a full completion ring;
 *   - doorbells: a side that is about to sleep sets its flag (the daemon NEED_WAKEUP, the client
 *     WAITING), then issues a full fence and looks at the ring once more; the other side, after
 *     publishing, issues a full fence and, when it sees the flag, sends a Doorbell datagram on
 *     the socket. Either the sleeper sees the new entry or the publisher sees the flag.
 *
 * Each counter is written by one side only, and each side keeps its own copy of what it writes:
 * the daemon never trusts a value it reads back from the ring, and checks every index it reads
 * (a client can write anything there at any time).
 */
#ifndef CONVD_COMMON_RING_LAYOUT_H
#define CONVD_COMMON_RING_LAYOUT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define CONVD_RING_VERSION     1u
#define CONVD_RING_MAGIC       0x31474e52u /* "RNG1" */
#define CONVD_RING_MAX_ENTRIES 4096u

/* daemon_flags */
#define CONVD_RING_NEED_WAKEUP 1u /* the daemon sleeps: send a Doorbell after submitting */
/* client_flags */
#define CONVD_RING_WAITING 1u /* the client sleeps on its socket: send a Doorbell after posting */

/* sqe.opcode */
#define CONVD_RING_OP_CONV 1u

/* sqe.flags: the problem's booleans. RELU is also what layout 1 had before sqe.activation (whose
 * word was reserved and had to be 0): a client says relu with the flag alone, so that any
 * daemon of this layout runs it, and an older daemon refuses any other activation by name. */
#define CONVD_RING_F_BIAS       1u
#define CONVD_RING_F_RELU       2u
#define CONVD_RING_F_ALLOW_TF32 4u
#define CONVD_RING_F_GATE       8u /* sqe.gate holds the request's Gate (protocol 3) */
#define CONVD_RING_F_ALL        15u

/* The two cache lines of counters at the start of the ring: one written by the client only, one
 * by the daemon only, so that neither side's writes evict the other's line. */
struct convd_ring_header {
    uint32_t magic;      /* CONVD_RING_MAGIC, written by the client at creation */
    uint32_t version;    /* CONVD_RING_VERSION */
    uint32_t sq_entries; /* as in AttachRing */
    uint32_t cq_entries;
    uint8_t pad0[48];
    /* written by the client */
    _Atomic uint32_t sq_tail;
    _Atomic uint32_t cq_head;
    _Atomic uint32_t client_flags;
    uint8_t pad1[52];
    /* written by the daemon */
    _Atomic uint32_t sq_head;
    _Atomic uint32_t cq_tail;
    _Atomic uint32_t daemon_flags;
    _Atomic uint32_t sock_seq; /* bumped after each message the daemon sends on the socket */
    uint8_t pad2[48];
};

/* A tensor: bytes [offset, offset + bytes) of region region_id (all zero for an absent bias). */
struct convd_ring_tensor {
    uint64_t region_id;
    uint64_t offset;
    uint64_t bytes;
};

/* A Gate (stream ordering, protocol 3): two 32-bit words of a host region. */
struct convd_ring_gate {
    uint64_t region_id;
    uint64_t ready_offset;
    uint64_t done_offset;
    uint32_t ready_value;
    uint32_t done_value;
};

/* One request, the fixed-size twin of ConvRequest: the same fields, the same checks, the same
 * completion codes. Enumerations carry the wire's values (DType, Layout). */
struct convd_ring_sqe {
    uint64_t id;
    uint32_t opcode; /* CONVD_RING_OP_CONV */
    uint32_t flags;  /* CONVD_RING_F_* */
    uint32_t n, h, w, c, k, r, s, groups;
    uint32_t stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right, dil_h, dil_w;
    uint32_t dtype, layout;
    uint32_t priority;
    uint32_t activation; /* Activation's wire value other than relu (F_RELU), or 0 */
    uint64_t timeout_us;
    struct convd_ring_tensor input, weight, bias, output;
    float act_min, act_max;      /* clamp's bounds, as Problem's */
    struct convd_ring_gate gate; /* read only with CONVD_RING_F_GATE */
    uint8_t pad[16];
};

/* The completion of a request that succeeded. */
struct convd_ring_cqe {
    uint64_t id;
    int32_t status; /* 0 */
    uint32_t batch_size;
    uint32_t queue_us;
    uint32_t exec_us;
    uint64_t reserved;
};

_Static_assert(sizeof(struct convd_ring_header) == 192, "ring header layout");
_Static_assert(offsetof(struct convd_ring_header, sq_tail) == 64, "client line");
_Static_assert(offsetof(struct convd_ring_header, sq_head) == 128, "daemon line");
_Static_assert(sizeof(struct convd_ring_sqe) == 256, "sqe layout");
_Static_assert(sizeof(struct convd_ring_cqe) == 32, "cqe layout");
_Static_assert(offsetof(struct convd_ring_sqe, gate) == 208, "sqe gate");

#define CONVD_RING_SQ_OFFSET 256u

/* Byte offset of the completion array, and the ring's total size, for entry counts that
 * convd_ring_entries_ok() accepts. */
static inline uint64_t convd_ring_cq_offset(uint32_t sq_entries)
{
    return CONVD_RING_SQ_OFFSET + (uint64_t)sq_entries * sizeof(struct convd_ring_sqe);
}

static inline uint64_t convd_ring_bytes(uint32_t sq_entries, uint32_t cq_entries)
{
    uint64_t end =
        convd_ring_cq_offset(sq_entries) + (uint64_t)cq_entries * sizeof(struct convd_ring_cqe);
    return (end + 4095u) & ~(uint64_t)4095u;
}

/* The submission and completion arrays of a ring mapped at mem. */
static inline struct convd_ring_sqe *convd_ring_sq(void *mem)
{
    return (struct convd_ring_sqe *)((uint8_t *)mem + CONVD_RING_SQ_OFFSET);
}

static inline struct convd_ring_cqe *convd_ring_cq(void *mem, uint32_t sq_entries)
{
    return (struct convd_ring_cqe *)((uint8_t *)mem + convd_ring_cq_offset(sq_entries));
}

/* A power of two from 1 to CONVD_RING_MAX_ENTRIES. */
static inline int convd_ring_entries_ok(uint32_t n)
{
    return n >= 1 && n <= CONVD_RING_MAX_ENTRIES && (n & (n - 1)) == 0;
}

/* A pause for spinning loops: lets the sibling hyper-thread run and saves power. */
static inline void convd_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif
