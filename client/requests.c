/*
 * Requests: submit, the table of requests in flight, waiting for completions, and the blocking
 * convd_conv() on its staging region.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "client_priv.h"
#include "mix.h"
#include "wire.h"

/*
 * The table. Slots are indexed by an open-addressing hash of the id so that a completion, which
 * may come in any order, finds its request in constant time whatever the depth of the pipeline.
 */

int32_t cl_slot_find(const convd_client *c, uint64_t id)
{
    if (c->index_cap == 0)
        return -1;
    size_t mask = c->index_cap - 1;
    for (size_t i = mix_id_slot(id, c->index_cap);; i = (i + 1) & mask) {
        int32_t s = c->index[i];
        if (s < 0)
            return -1;
        if (c->slots[s].id == id)
            return s;
    }
}

static void cl_index_insert(convd_client *c, uint64_t id, int32_t s)
{
    size_t mask = c->index_cap - 1;
    size_t i = mix_id_slot(id, c->index_cap);
    while (c->index[i] >= 0)
        i = (i + 1) & mask;
    c->index[i] = s;
}

/* Removes id from the index by backward shifting, so that probing needs no tombstones. */
static void cl_index_remove(convd_client *c, uint64_t id)
{
    size_t mask = c->index_cap - 1;
    size_t i = mix_id_slot(id, c->index_cap);
    while (c->index[i] >= 0 && c->slots[c->index[i]].id != id)
        i = (i + 1) & mask;
    if (c->index[i] < 0)
        return;
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (c->index[j] < 0)
            break;
        size_t k = mix_id_slot(c->slots[c->index[j]].id, c->index_cap);
        /* Entry j may move into the hole at i unless its home lies cyclically in (i, j]. */
        bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            c->index[i] = c->index[j];
            i = j;
        }
    }
    c->index[i] = -1;
}

static int cl_slots_grow(convd_client *c)
{
    int32_t ncap = c->slot_cap > 0 ? c->slot_cap * 2 : 16;
    size_t icap = 1;
    while (icap < (size_t)ncap * 2)
        icap <<= 1;
    struct cl_slot *slots = realloc(c->slots, (size_t)ncap * sizeof(*slots));
    if (slots == NULL)
        return CONVD_ENOMEM;
    c->slots = slots;
    int32_t *index = malloc(icap * sizeof(*index));
    if (index == NULL)
        return CONVD_ENOMEM;
    for (int32_t s = ncap - 1; s >= c->slot_cap; s--) {
        memset(&slots[s], 0, sizeof(slots[s]));
        slots[s].state = CL_SLOT_FREE;
        slots[s].next = c->free_head;
        c->free_head = s;
    }
    free(c->index);
    c->index = index;
    c->index_cap = icap;
    for (size_t i = 0; i < icap; i++)
        index[i] = -1;
    for (int32_t s = 0; s < c->slot_cap; s++)
        if (slots[s].state != CL_SLOT_FREE)
            cl_index_insert(c, slots[s].id, s);
    c->slot_cap = ncap;
    return 0;
}

static int32_t cl_slot_alloc(convd_client *c, uint64_t id)
{
    if (c->free_head < 0 && cl_slots_grow(c) != 0)
        return -1;
    int32_t s = c->free_head;
    c->free_head = c->slots[s].next;
    c->slots[s].id = id;
    c->slots[s].state = CL_SLOT_WAITING;
    c->slots[s].gate_done = NULL;
    c->slots[s].gate_region = NULL;
    c->slots[s].prev = c->slots[s].next = -1;
    cl_index_insert(c, id, s);
    return s;
}

static void cl_gate_release(struct cl_slot *slot)
{
    if (slot->gate_done != NULL) {
        __atomic_store_n(slot->gate_done, slot->gate_value, __ATOMIC_RELEASE);
        slot->gate_done = NULL;
        slot->gate_region = NULL;
    }
}

void cl_gates_release(convd_client *c, const convd_region *region)
{
    for (int32_t s = 0; s < c->slot_cap; s++)
        if (c->slots[s].state != CL_SLOT_FREE && c->slots[s].gate_done != NULL &&
            (region == NULL || c->slots[s].gate_region == region))
            cl_gate_release(&c->slots[s]);
}

void cl_slots_init(convd_client *c)
{
    c->free_head = c->done_head = c->done_tail = -1;
}

static void cl_slot_release(convd_client *c, int32_t s)
{
    cl_index_remove(c, c->slots[s].id);
    c->slots[s].state = CL_SLOT_FREE;
    c->slots[s].next = c->free_head;
    c->free_head = s;
}

void cl_slots_free(convd_client *c)
{
    free(c->slots);
    free(c->index);
    c->slots = NULL;
    c->index = NULL;
    c->slot_cap = 0;
    c->index_cap = 0;
}

void cl_complete(convd_client *c, uint64_t id, int status, const char *error, uint64_t queue_us,
                 uint64_t exec_us, uint32_t batch_size)
{
    int32_t s = cl_slot_find(c, id);
    if (s < 0 || c->slots[s].state == CL_SLOT_DONE) {
        cl_trouble(c, CONVD_EPROTO,
                   "the daemon sent a completion for request %llu, which is not in flight",
                   (unsigned long long)id);
        return;
    }
    struct cl_slot *slot = &c->slots[s];
    /* The daemon writes the done word of every request it finishes; one that failed may have
     * failed before the daemon knew its gate. */
    if (status != 0)
        cl_gate_release(slot);
    else
        slot->gate_done = NULL;
    if (slot->state == CL_SLOT_ABANDONED) {
        c->n_abandoned--;
        cl_slot_release(c, s);
        return;
    }
    struct convd_completion *d = &slot->done;
    d->id = id;
    d->status = status;
    cl_strlcpy(d->error, sizeof(d->error), error);
    if (d->status != 0 && d->error[0] == '\0')
        cl_strlcpy(d->error, sizeof(d->error), convd_strerror(d->status));
    d->queue_us = queue_us;
    d->exec_us = exec_us;
    d->batch_size = batch_size;
    slot->state = CL_SLOT_DONE;
    c->n_waiting--;
    c->n_done++;
    slot->next = -1;
    slot->prev = c->done_tail;
    if (c->done_tail >= 0)
        c->slots[c->done_tail].next = s;
    else
        c->done_head = s;
    c->done_tail = s;
}

/* Hands a received completion to the caller and forgets the request. */
static void cl_take_done(convd_client *c, int32_t s, struct convd_completion *ret)
{
    struct cl_slot *slot = &c->slots[s];
    if (slot->prev >= 0)
        c->slots[slot->prev].next = slot->next;
    else
        c->done_head = slot->next;
    if (slot->next >= 0)
        c->slots[slot->next].prev = slot->prev;
    else
        c->done_tail = slot->prev;
    *ret = slot->done;
    c->n_done--;
    cl_slot_release(c, s);
}

/*
 * Submit.
 */

/* One tensor reference, checked as the daemon checks it: its region, then its byte count, then
 * its bounds. */
static int cl_check_tensor(convd_client *c, const char *name, const struct convd_tensor *t,
                           uint64_t need, size_t esz)
{
    if (t->region->client != c)
        return cl_fail(c, CONVD_ENOREGION, "the %s tensor's region belongs to another client",
                       name);
    if (t->bytes != need)
        return cl_fail(c, CONVD_ESIZE, "the %s tensor is %llu bytes, the problem needs %llu", name,
                       (unsigned long long)t->bytes, (unsigned long long)need);
    uint64_t end;
    if (__builtin_add_overflow(t->offset, t->bytes, &end) || end > t->region->size)
        return cl_fail(c, CONVD_EBOUNDS,
                       "the %s tensor at offset %llu, %llu bytes, does not fit in region %llu "
                       "of %zu bytes",
                       name, (unsigned long long)t->offset, (unsigned long long)t->bytes,
                       (unsigned long long)t->region->id, t->region->size);
    if (t->offset % esz != 0)
        return cl_fail(c, CONVD_EINVAL,
                       "the %s tensor at offset %llu is not aligned to its %zu-byte elements", name,
                       (unsigned long long)t->offset, esz);
    return 0;
}

static bool cl_overlap(const struct convd_tensor *a, const struct convd_tensor *b)
{
    return a->region == b->region && a->offset < b->offset + b->bytes &&
           b->offset < a->offset + a->bytes;
}

/* One gate word, as the daemon checks it. */
static int cl_check_gate_word(convd_client *c, const struct convd_conv_args *a, const char *name,
                              uint64_t off)
{
    const convd_region *r = a->gate.region;
    if (off % 4 != 0)
        return cl_fail(c, CONVD_EINVAL, "the gate %s word at offset %llu is not aligned to 4 bytes",
                       name, (unsigned long long)off);
    if (r->size < 4 || off > r->size - 4)
        return cl_fail(c, CONVD_EBOUNDS,
                       "the gate %s word at offset %llu does not fit in region %llu of %zu bytes",
                       name, (unsigned long long)off, (unsigned long long)r->id, r->size);
    const struct convd_tensor word = {a->gate.region, off, 4};
    const struct {
        const char *name;
        const struct convd_tensor *t;
    } ts[] = {
        {"input", &a->input}, {"weight", &a->weight}, {"bias", &a->bias}, {"output", &a->output}};
    for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
        if ((i != 2 || a->problem.has_bias) && cl_overlap(&word, ts[i].t))
            return cl_fail(c, CONVD_EINVAL, "the gate %s word (offset %llu) lies in the %s tensor",
                           name, (unsigned long long)off, ts[i].name);
    return 0;
}

static int cl_check_gate(convd_client *c, const struct convd_conv_args *a)
{
    const struct convd_gate *g = &a->gate;
    if (c->info.protocol_version < CONVD_PROTOCOL_GATES)
        return cl_fail(c, CONVD_EUNSUPPORTED,
                       "a gate needs protocol version %u, and the daemon speaks %u: upgrade the "
                       "daemon",
                       CONVD_PROTOCOL_GATES, (unsigned)c->info.protocol_version);
    if (g->region->client != c)
        return cl_fail(c, CONVD_ENOREGION, "the gate's region belongs to another client");
    if (g->region->gpu)
        return cl_fail(c, CONVD_EINVAL,
                       "the gate's region %llu is device memory; gate words must be in a host "
                       "region (convd_region_create)",
                       (unsigned long long)g->region->id);
    int rc = cl_check_gate_word(c, a, "ready", g->ready_offset);
    if (rc == 0)
        rc = cl_check_gate_word(c, a, "done", g->done_offset);
    if (rc == 0 && g->ready_offset == g->done_offset)
        rc = cl_fail(c, CONVD_EINVAL,
                     "the gate ready and done words are the same word (offset "
                     "%llu)",
                     (unsigned long long)g->ready_offset);
    return rc;
}

static void cl_tensor_ref(const struct convd_tensor *t, Convd__TensorRef *pb)
{
    pb->region_id = t->region->id;
    pb->offset = t->offset;
    pb->bytes = t->bytes;
}

/* The caller's arguments as this library's struct: a smaller struct from an older header gets
 * the defaults (0) for the fields beyond it; a larger one from a newer header is taken when
 * every byte this library does not know is zero, the value new fields keep for "as before". */
static int cl_args_take(convd_client *c, const struct convd_conv_args *in,
                        struct convd_conv_args *out)
{
    const size_t need = offsetof(struct convd_conv_args, output) + sizeof(in->output);
    const size_t size = in->struct_size;
    if (size < need || size > CL_ARGS_MAX_BYTES)
        return cl_fail(c, CONVD_EINVAL,
                       "args struct_size is %zu, expected %zu (at least %zu): initialise the "
                       "arguments with CONVD_CONV_ARGS_INIT",
                       size, sizeof(*out), need);
    memset(out, 0, sizeof(*out));
    memcpy(out, in, size < sizeof(*out) ? size : sizeof(*out));
    for (size_t i = sizeof(*out); i < size; i++)
        if (((const unsigned char *)in)[i] != 0)
            return cl_fail(c, CONVD_EUNSUPPORTED,
                           "args struct_size is %zu and byte %zu is set, but this library (convd "
                           "%s) knows only the first %zu bytes: a field it does not implement",
                           size, i, CONVD_VERSION_STRING, sizeof(*out));
    out->struct_size = sizeof(*out);
    return 0;
}

int convd_conv_submit(convd_client *c, const struct convd_conv_args *args, uint64_t *ret_id)
{
    if (c == NULL)
        return CONVD_EINVAL;
    if (args == NULL || ret_id == NULL)
        return cl_fail(c, CONVD_EINVAL, "args and ret_id must not be NULL");
    struct convd_conv_args taken;
    int rc = cl_args_take(c, args, &taken);
    if (rc != 0)
        return rc;
    const struct convd_conv_args *a = &taken;

    /* The checks the daemon makes, in its order (docs/protocol.md, "Error behaviour"), so that a
     * bad request fails here with the code it would get there, without a round trip. Only the
     * backend's own verdict on the problem is left to the daemon. */
    if (a->priority > CONVD_MAX_PRIORITY)
        return cl_fail(c, CONVD_EINVAL, "priority is %u, must be 0 (highest) to %u (lowest)",
                       a->priority, CONVD_MAX_PRIORITY);
    char why[256];
    struct convd_problem_sizes z;
    rc = convd_problem_sizes(&a->problem, &z, why, sizeof(why));
    if (rc == 0)
        rc = wire_request_supported(&a->problem, c->info.protocol_version, why, sizeof(why));
    if (rc != 0)
        return cl_fail(c, rc, "%s", why);
    const bool bias = a->problem.has_bias;
    const struct {
        const char *name;
        const struct convd_tensor *t;
        bool used;
    } present[] = {{"input", &a->input, true},
                   {"weight", &a->weight, true},
                   {"bias", &a->bias, bias},
                   {"output", &a->output, true}};
    for (size_t i = 0; i < sizeof(present) / sizeof(present[0]); i++)
        if (present[i].used && present[i].t->region == NULL)
            return cl_fail(c, CONVD_EINVAL, "the %s tensor has no region", present[i].name);
    const size_t esz = convd_dtype_size(a->problem.dtype);
    if ((rc = cl_check_tensor(c, "input", &a->input, z.input_bytes, esz)) != 0 ||
        (rc = cl_check_tensor(c, "weight", &a->weight, z.weight_bytes, esz)) != 0 ||
        (bias && (rc = cl_check_tensor(c, "bias", &a->bias, z.bias_bytes, esz)) != 0) ||
        (rc = cl_check_tensor(c, "output", &a->output, z.output_bytes, esz)) != 0)
        return rc;
    if (cl_overlap(&a->output, &a->input) || cl_overlap(&a->output, &a->weight) ||
        (bias && cl_overlap(&a->output, &a->bias)))
        return cl_fail(c, CONVD_EINVAL,
                       "the output tensor overlaps the input, weight or bias tensor");
    const bool gated = a->gate.region != NULL;
    if (gated && (rc = cl_check_gate(c, a)) != 0)
        return rc;
    if (c->closed)
        return cl_fail(c, CONVD_ECLOSED, "the daemon closed the connection");
    size_t held = c->n_waiting + c->n_done + c->n_abandoned;
    if (c->info.max_inflight != 0 && held >= c->info.max_inflight)
        return cl_fail(c, CONVD_ELIMIT,
                       "%zu requests are in flight, the daemon allows %u per client: wait for "
                       "one first",
                       held, c->info.max_inflight);

    uint64_t id = c->next_id;
    int32_t s = cl_slot_alloc(c, id);
    if (s < 0)
        return cl_fail(c, CONVD_ENOMEM, "out of memory for the request table");
    if (gated) {
        c->slots[s].gate_done =
            (uint32_t *)(void *)((uint8_t *)a->gate.region->data + a->gate.done_offset);
        c->slots[s].gate_region = a->gate.region;
        c->slots[s].gate_value = a->gate.done_value;
    }
    if (c->has_ring && cl_ring_submit(c, a, id) == 0) {
        c->next_id++;
        c->n_waiting++;
        *ret_id = id;
        return 0;
    }

    Convd__Problem pb = CONVD__PROBLEM__INIT;
    wire_problem_to_pb(&a->problem, &pb);
    Convd__TensorRef in = CONVD__TENSOR_REF__INIT, wt = CONVD__TENSOR_REF__INIT,
                     bs = CONVD__TENSOR_REF__INIT, out = CONVD__TENSOR_REF__INIT;
    cl_tensor_ref(&a->input, &in);
    cl_tensor_ref(&a->weight, &wt);
    cl_tensor_ref(&a->output, &out);
    Convd__ConvRequest req = CONVD__CONV_REQUEST__INIT;
    req.id = id;
    req.problem = &pb;
    req.input = &in;
    req.weight = &wt;
    req.output = &out;
    if (bias) {
        cl_tensor_ref(&a->bias, &bs);
        req.bias = &bs;
    }
    req.priority = a->priority;
    req.timeout_us = a->timeout_us;
    Convd__Gate gate = CONVD__GATE__INIT;
    if (gated) {
        gate.region_id = a->gate.region->id;
        gate.ready_offset = a->gate.ready_offset;
        gate.done_offset = a->gate.done_offset;
        gate.ready_value = a->gate.ready_value;
        gate.done_value = a->gate.done_value;
        req.gate = &gate;
    }
    Convd__ClientMessage m = CONVD__CLIENT_MESSAGE__INIT;
    m.msg_case = CONVD__CLIENT_MESSAGE__MSG_CONV;
    m.conv = &req;

    c->next_id++;
    c->n_waiting++;
    rc = cl_send(c, &m, -1, cl_deadline(c->timeout_ms));
    if (rc != 0) {
        c->n_waiting--;
        cl_slot_release(c, s);
        return rc;
    }
    *ret_id = id;
    return 0;
}

/*
 * Wait.
 */

static bool cl_slot_is_done(const convd_client *c, const void *arg)
{
    int32_t s = *(const int32_t *)arg;
    return c->slots[s].state == CL_SLOT_DONE;
}

static bool cl_any_done(const convd_client *c, const void *arg)
{
    (void)arg;
    return c->done_head >= 0;
}

int convd_wait(convd_client *c, uint64_t id, int timeout_ms, struct convd_completion *ret)
{
    if (c == NULL)
        return CONVD_EINVAL;
    if (ret == NULL)
        return cl_fail(c, CONVD_EINVAL, "ret must not be NULL");
    int32_t s = cl_slot_find(c, id);
    if (s < 0 || c->slots[s].state == CL_SLOT_ABANDONED)
        return cl_fail(c, CONVD_ENOTFOUND, "request %llu is not in flight", (unsigned long long)id);
    /* Slots do not move while we wait: only submit grows the table. */
    int rc = cl_pump(c, cl_slot_is_done, &s, cl_deadline(timeout_ms));
    if (rc != 0)
        return rc;
    cl_take_done(c, s, ret);
    return 0;
}

int convd_wait_any(convd_client *c, int timeout_ms, struct convd_completion *ret)
{
    if (c == NULL)
        return CONVD_EINVAL;
    if (ret == NULL)
        return cl_fail(c, CONVD_EINVAL, "ret must not be NULL");
    if (c->done_head < 0 && c->n_waiting == 0)
        return cl_fail(c, CONVD_ENOTFOUND, "no request is in flight");
    int rc = cl_pump(c, cl_any_done, NULL, cl_deadline(timeout_ms));
    if (rc != 0)
        return rc;
    cl_take_done(c, c->done_head, ret);
    return 0;
}

int convd_poll(convd_client *c, struct convd_completion *ret)
{
    if (c == NULL)
        return CONVD_EINVAL;
    if (ret == NULL)
        return cl_fail(c, CONVD_EINVAL, "ret must not be NULL");
    if (c->done_head < 0)
        return CONVD_EAGAIN;
    cl_take_done(c, c->done_head, ret);
    return 0;
}

size_t convd_inflight(const convd_client *c)
{
    return c != NULL ? c->n_waiting + c->n_done : 0;
}

/*
 * The blocking call.
 */

static uint64_t cl_align(uint64_t v)
{
    return (v + CL_STAGING_ALIGN - 1) & ~(uint64_t)(CL_STAGING_ALIGN - 1);
}

/* Makes the staging region at least `need` bytes. It grows to a power of two when the daemon's
 * byte limit leaves room, so that a run of slowly growing problems does not re-register each
 * time. */
static int cl_staging_reserve(convd_client *c, uint64_t need)
{
    if (c->staging != NULL && c->staging->size >= need)
        return 0;
    uint64_t want = 1u << 20;
    while (want < need)
        want <<= 1;
    uint64_t other = c->mapped_bytes - (c->staging != NULL ? c->staging->size : 0);
    if (c->info.max_mapped_bytes != 0 && other + want > c->info.max_mapped_bytes)
        want = need;
    if (want > SIZE_MAX)
        return cl_fail(c, CONVD_ETOOBIG, "the problem needs %llu bytes of staging memory",
                       (unsigned long long)need);
    if (c->staging != NULL) {
        convd_region *old = c->staging;
        c->staging = NULL;
        int rc = convd_region_free(old);
        if (rc != 0)
            return rc;
    }
    convd_region *r;
    int rc = convd_region_create(c, (size_t)want, &r);
    if (rc != 0)
        return rc;
    c->staging = r;
    return 0;
}

/* After a wait that did not end in a completion the request may still run and write into the
 * staging region: forget the request and the region (the daemon releases it once the request is
 * done), keeping the failure's sentence. */
static void cl_staging_abandon(convd_client *c, uint64_t id)
{
    char keep[CL_ERRSTR_BYTES];
    memcpy(keep, c->errstr, sizeof(keep));
    int32_t s = cl_slot_find(c, id);
    if (s >= 0 && c->slots[s].state == CL_SLOT_WAITING) {
        c->slots[s].state = CL_SLOT_ABANDONED;
        c->n_waiting--;
        c->n_abandoned++;
    }
    convd_region *r = c->staging;
    c->staging = NULL;
    convd_region_free(r);
    memcpy(c->errstr, keep, sizeof(keep));
}

int convd_conv(convd_client *c, const struct convd_problem *p, const void *input,
               const void *weight, const void *bias, void *output)
{
    if (c == NULL)
        return CONVD_EINVAL;
    if (p == NULL || input == NULL || weight == NULL || output == NULL)
        return cl_fail(c, CONVD_EINVAL, "problem, input, weight and output must not be NULL");
    if (p->has_bias && bias == NULL)
        return cl_fail(c, CONVD_EINVAL, "the problem has a bias but bias is NULL");
    char why[256];
    struct convd_problem_sizes z;
    int rc = convd_problem_sizes(p, &z, why, sizeof(why));
    if (rc != 0)
        return cl_fail(c, rc, "%s", why);

    /* Each tensor is at most CONVD_MAX_TENSOR_BYTES, so these sums cannot overflow. */
    const uint64_t w_off = cl_align(z.input_bytes);
    const uint64_t b_off = cl_align(w_off + z.weight_bytes);
    const uint64_t o_off = cl_align(b_off + z.bias_bytes);
    rc = cl_staging_reserve(c, o_off + z.output_bytes);
    if (rc != 0)
        return rc;

    convd_region *r = c->staging;
    uint8_t *base = convd_region_data(r);
    memcpy(base, input, z.input_bytes);
    memcpy(base + w_off, weight, z.weight_bytes);
    if (p->has_bias)
        memcpy(base + b_off, bias, z.bias_bytes);

    struct convd_conv_args a = CONVD_CONV_ARGS_INIT;
    a.problem = *p;
    a.input = (struct convd_tensor){r, 0, z.input_bytes};
    a.weight = (struct convd_tensor){r, w_off, z.weight_bytes};
    if (p->has_bias)
        a.bias = (struct convd_tensor){r, b_off, z.bias_bytes};
    a.output = (struct convd_tensor){r, o_off, z.output_bytes};
    uint64_t id;
    rc = convd_conv_submit(c, &a, &id);
    if (rc != 0)
        return rc;
    struct convd_completion done;
    rc = convd_wait(c, id, -1, &done);
    if (rc != 0) {
        cl_staging_abandon(c, id);
        return rc;
    }
    if (done.status != 0)
        return cl_fail(c, done.status, "%s", done.error);
    memcpy(output, base + o_off, z.output_bytes);
    return 0;
}
