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

int req_validate(const Convd__ConvRequest *pb, const struct req_context *ctx, struct dreq *r,
                 char *why, size_t why_len)
{
    if (pb->priority > CONVD_MAX_PRIORITY)
        return why_fail(why, why_len, CONVD_EINVAL,
                        "field priority is %u, must be 0 (highest) to %u (lowest)",
                        (unsigned)pb->priority, CONVD_MAX_PRIORITY);

    struct convd_problem p;
    int rc = wire_problem_from_pb(pb->problem, &p, why, why_len);
    if (rc != 0)
        return rc;
    struct convd_problem_sizes sz;
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
}

void req_unref_regions(struct dreq *r)
{
    for (int i = 0; i < REQ_TENSORS; i++)
        if (r->regions[i] != NULL) {
            region_unref(r->regions[i]);
            r->regions[i] = NULL;
        }
}
