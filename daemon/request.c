#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "why.h"
#include "request.h"
#include "wire.h"

static const char *const req_names[REQ_TENSORS] = {"input", "weight", "bias", "output"};

/* Resolves one tensor reference against the connection's regions and the size the problem
 * needs. */
static int req_tensor(const struct req_context *ctx, int which, const Convd__TensorRef *ref,
                      uint64_t need, size_t esz, struct convd_tensor_view *view,
                      struct region **ret_region, char *why, size_t why_len)
{
    const char *name = req_names[which];
    struct region *reg = region_find(ctx->regions, ref->region_id);
    if (reg == NULL)
        return why_fail(why, why_len, CONVD_ENOREGION,
                        "%s tensor names region %llu, which is not registered on this connection",
                        name, (unsigned long long)ref->region_id);
    /* The byte count first: once it matches the shape, a bounds failure is about where the
     * tensor is, not about how large the client said it was. */
    if (ref->bytes != need)
        return why_fail(why, why_len, CONVD_ESIZE,
                        "%s tensor has %llu bytes, the problem needs %llu", name,
                        (unsigned long long)ref->bytes, (unsigned long long)need);
    /* overflow-safe: offset + bytes <= size without computing offset + bytes */
    uint64_t size = reg->mem.size;
    if (ref->offset > size || ref->bytes > size - ref->offset)
        return why_fail(why, why_len, CONVD_EBOUNDS,
                        "%s tensor at offset %llu with %llu bytes ends past the end of region "
                        "%llu (%llu bytes)",
                        name, (unsigned long long)ref->offset, (unsigned long long)ref->bytes,
                        (unsigned long long)ref->region_id, (unsigned long long)size);
    /* Element-aligned, or the backend would read across elements (and a GPU would fault). */
    if (ref->offset % esz != 0)
        return why_fail(why, why_len, CONVD_EINVAL,
                        "%s tensor at offset %llu is not aligned to its %zu-byte elements", name,
                        (unsigned long long)ref->offset, esz);
    /* In device memory the kernels read whole elements in place: the device address must be
     * aligned too (a region may start anywhere in its allocation), or the access would fault and
     * take the GPU context down for every client. */
    if (reg->mem.kind == CONVD_MEM_DEVICE &&
        ((uintptr_t)reg->mem.device_ptr + (uintptr_t)ref->offset) % esz != 0)
        return why_fail(why, why_len, CONVD_EINVAL,
                        "%s tensor in device memory (region %llu, offset %llu) is not aligned to "
                        "its %zu-byte elements: the region starts at allocation offset %llu",
                        name, (unsigned long long)ref->region_id, (unsigned long long)ref->offset,
                        esz, (unsigned long long)reg->mem.ipc_offset);
    if (which == REQ_OUTPUT && reg->readonly)
        return why_fail(why, why_len, CONVD_ESEAL,
                        "output tensor is in region %llu, which is sealed against writing",
                        (unsigned long long)ref->region_id);
    view->mem = &reg->mem;
    view->offset = ref->offset;
    view->bytes = ref->bytes;
    *ret_region = reg;
    return 0;
}

/* One gate word: 4-byte aligned, inside the region, outside every tensor of the request. */
static int req_gate_word(const char *name, uint64_t off, const struct region *reg,
                         const struct dreq *r, char *why, size_t why_len)
{
    if (off % 4 != 0)
        return why_fail(why, why_len, CONVD_EINVAL,
                        "gate %s word at offset %llu is not aligned to 4 bytes", name,
                        (unsigned long long)off);
    if (reg->mem.size < 4 || off > reg->mem.size - 4)
        return why_fail(why, why_len, CONVD_EBOUNDS,
                        "gate %s word at offset %llu ends past the end of region %llu (%llu "
                        "bytes)",
                        name, (unsigned long long)off, (unsigned long long)reg->id,
                        (unsigned long long)reg->mem.size);
    const struct convd_tensor_view *views[REQ_TENSORS] = {&r->job.input, &r->job.weight,
                                                          &r->job.bias, &r->job.output};
    for (int i = 0; i < REQ_TENSORS; i++)
        if (r->regions[i] != NULL &&
            region_ranges_overlap(reg, off, 4, r->regions[i], views[i]->offset, views[i]->bytes))
            return why_fail(why, why_len, CONVD_EINVAL,
                            "gate %s word (region %llu, offset %llu) lies in the %s tensor", name,
                            (unsigned long long)reg->id, (unsigned long long)off, req_names[i]);
    return 0;
}

/* The gate: protocol 3, a writable host region, two distinct words. */
static int req_gate(const Convd__Gate *g, const struct req_context *ctx, struct dreq *r, char *why,
                    size_t why_len)
{
    if (ctx->proto_version < CONVD_PROTOCOL_GATES)
        return why_fail(why, why_len, CONVD_EUNSUPPORTED,
                        "a gate needs protocol version %u, and the connection speaks %u",
                        CONVD_PROTOCOL_GATES, (unsigned)ctx->proto_version);
    struct region *reg = region_find(ctx->regions, g->region_id);
    if (reg == NULL)
        return why_fail(why, why_len, CONVD_ENOREGION,
                        "gate names region %llu, which is not registered on this connection",
                        (unsigned long long)g->region_id);
    /* The daemon reads and writes the words from its CPU: device memory it cannot poll. */
    if (reg->mem.kind != CONVD_MEM_HOST)
        return why_fail(why, why_len, CONVD_EINVAL,
                        "gate region %llu is device memory; gate words must be in a host "
                        "(memfd) region",
                        (unsigned long long)g->region_id);
    if (reg->readonly)
        return why_fail(why, why_len, CONVD_ESEAL,
                        "gate region %llu is sealed against writing; the daemon writes the done "
                        "word",
                        (unsigned long long)g->region_id);
    int rc = req_gate_word("ready", g->ready_offset, reg, r, why, why_len);
    if (rc == 0)
        rc = req_gate_word("done", g->done_offset, reg, r, why, why_len);
    if (rc != 0)
        return rc;
    if (g->ready_offset == g->done_offset)
        return why_fail(why, why_len, CONVD_EINVAL,
                        "gate ready and done words are the same word (offset %llu)",
                        (unsigned long long)g->ready_offset);
    uint8_t *base = reg->mem.host;
    r->gate_region = reg;
    r->gate_ready = (_Atomic uint32_t *)(void *)(base + g->ready_offset);
    r->ready_offset = g->ready_offset;
    r->gate_done = (_Atomic uint32_t *)(void *)(base + g->done_offset);
    r->ready_value = g->ready_value;
    r->done_value = g->done_value;
    r->job.gate_mem = &reg->mem;
    r->job.gate_offset = g->done_offset;
    r->job.gate_value = g->done_value;
    return 0;
}

int req_validate(const Convd__ConvRequest *pb, const struct req_context *ctx, struct dreq *r,
                 char *why, size_t why_len)
{
    r->gate_region = NULL;
    r->job.gate_mem = NULL;
    if (pb->priority > CONVD_MAX_PRIORITY)
        return why_fail(why, why_len, CONVD_EINVAL,
                        "field priority is %u, must be 0 (highest) to %u (lowest)",
                        (unsigned)pb->priority, CONVD_MAX_PRIORITY);

    struct convd_problem p;
    int rc = wire_problem_from_pb(pb->problem, &p, why, why_len);
    if (rc != 0)
        return rc;
    struct convd_problem_sizes sz;
    struct req_problem_cache *cache = ctx->cache;
    if (cache != NULL && cache->valid && convd_problem_same(&p, &cache->p)) {
        sz = cache->sz;
    } else {
        rc = convd_problem_sizes(&p, &sz, why, why_len);
        if (rc != 0)
            return rc;
        rc = wire_request_supported(&p, ctx->proto_version, why, why_len);
        if (rc != 0)
            return rc;
        char be_why[256] = "";
        rc = be_supports(ctx->backend, &p, be_why, sizeof(be_why));
        if (rc != 0)
            return why_fail(why, why_len, rc, "the %s backend cannot run this problem: %s",
                            ctx->backend->info.name, be_why[0] ? be_why : convd_strerror(rc));
        if (cache != NULL) {
            cache->p = p;
            cache->sz = sz;
            cache->valid = true;
        }
    }

    const Convd__TensorRef *refs[REQ_TENSORS] = {pb->input, pb->weight, pb->bias, pb->output};
    const uint64_t need[REQ_TENSORS] = {sz.input_bytes, sz.weight_bytes, sz.bias_bytes,
                                        sz.output_bytes};
    for (int i = 0; i < REQ_TENSORS; i++) {
        if (i == REQ_BIAS) {
            if (p.has_bias && refs[i] == NULL)
                return why_fail(why, why_len, CONVD_EINVAL,
                                "problem has_bias is set but the request has no bias tensor");
            if (!p.has_bias && refs[i] != NULL)
                return why_fail(why, why_len, CONVD_EINVAL,
                                "request has a bias tensor but problem has_bias is not set");
        } else if (refs[i] == NULL) {
            return why_fail(why, why_len, CONVD_EINVAL, "request has no %s tensor", req_names[i]);
        }
    }

    struct convd_job *job = &r->job;
    memset(job, 0, sizeof(*job));
    job->problem = p;
    struct convd_tensor_view *views[REQ_TENSORS] = {&job->input, &job->weight, &job->bias,
                                                    &job->output};
    for (int i = 0; i < REQ_TENSORS; i++) {
        r->regions[i] = NULL;
        if (refs[i] == NULL)
            continue;
        rc = req_tensor(ctx, i, refs[i], need[i], convd_dtype_size(p.dtype), views[i],
                        &r->regions[i], why, why_len);
        if (rc != 0)
            return rc;
    }
    /* The output is written while the inputs are read: an overlap would give a result that
     * depends on the order the kernel visits elements. */
    for (int i = 0; i < REQ_OUTPUT; i++) {
        if (r->regions[i] == NULL)
            continue;
        if (region_ranges_overlap(r->regions[REQ_OUTPUT], views[REQ_OUTPUT]->offset,
                                  views[REQ_OUTPUT]->bytes, r->regions[i], views[i]->offset,
                                  views[i]->bytes))
            return why_fail(why, why_len, CONVD_EINVAL,
                            "output tensor (region %llu, offset %llu, %llu bytes) overlaps the "
                            "%s tensor (region %llu, offset %llu, %llu bytes)",
                            (unsigned long long)r->regions[REQ_OUTPUT]->id,
                            (unsigned long long)views[REQ_OUTPUT]->offset,
                            (unsigned long long)views[REQ_OUTPUT]->bytes, req_names[i],
                            (unsigned long long)r->regions[i]->id,
                            (unsigned long long)views[i]->offset,
                            (unsigned long long)views[i]->bytes);
    }

    if (pb->gate != NULL) {
        rc = req_gate(pb->gate, ctx, r, why, why_len);
        if (rc != 0)
            return rc;
    }

    if (idmap_get(ctx->inflight, pb->id) != NULL)
        return why_fail(why, why_len, CONVD_EEXIST, "request id %llu is already in flight",
                        (unsigned long long)pb->id);
    if (ctx->inflight->count >= ctx->max_inflight)
        return why_fail(why, why_len, CONVD_ELIMIT,
                        "this client already has %u requests in flight, the limit "
                        "(max_inflight)",
                        (unsigned)ctx->inflight->count);

    r->id = pb->id;
    r->timeout_us = pb->timeout_us;
    r->sched.problem = &job->problem;
    r->sched.priority = pb->priority;
    job->owner = r;
    return 0;
}

void req_ref_regions(struct dreq *r)
{
    for (int i = 0; i < REQ_TENSORS; i++)
        if (r->regions[i] != NULL)
            region_ref(r->regions[i]);
    if (r->gate_region != NULL)
        region_ref(r->gate_region);
}

void req_unref_regions(struct dreq *r)
{
    for (int i = 0; i < REQ_TENSORS; i++)
        if (r->regions[i] != NULL) {
            region_unref(r->regions[i]);
            r->regions[i] = NULL;
        }
    if (r->gate_region != NULL) {
        region_unref(r->gate_region);
        r->gate_region = NULL;
    }
}
