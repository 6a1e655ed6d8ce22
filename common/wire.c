#include <stdio.h>
#include <string.h>

#include "wire.h"
#include "why.h"

int wire_request_supported(const struct convd_problem *p, uint32_t version, char *why,
                           size_t why_len)
{
    if (version < CONVD_PROTOCOL_ACTIVATIONS && p->activation != CONVD_ACT_NONE &&
        p->activation != CONVD_ACT_RELU) {
        if (why != NULL && why_len > 0)
            snprintf(why, why_len,
                     "activation %s needs protocol version %u, and the connection speaks %u (an "
                     "older daemon, which knows only relu): upgrade the daemon",
                     convd_activation_name(p->activation), CONVD_PROTOCOL_ACTIVATIONS,
                     (unsigned)version);
        return CONVD_EUNSUPPORTED;
    }
    return 0;
}

int wire_pick_version(uint32_t peer_min, uint32_t peer_max, uint32_t own_min, uint32_t own_max,
                      const char *peer, const char *self, uint32_t *ret_version, char *why,
                      size_t why_len)
{
    if (peer_min == 0)
        peer_min = peer_max;
    uint32_t v = peer_max < own_max ? peer_max : own_max;
    uint32_t floor = peer_min > own_min ? peer_min : own_min;
    if (peer_max == 0 || peer_min > peer_max || v < floor) {
        if (why != NULL && why_len > 0) {
            char range[48];
            if (peer_min == peer_max)
                snprintf(range, sizeof(range), "version %u", (unsigned)peer_max);
            else
                snprintf(range, sizeof(range), "versions %u to %u", (unsigned)peer_min,
                         (unsigned)peer_max);
            snprintf(why, why_len,
                     "the %s speaks protocol %s and this %s versions %u to %u: no version in "
                     "common",
                     peer, range, self, (unsigned)own_min, (unsigned)own_max);
        }
        return CONVD_EVERSION;
    }
    *ret_version = v;
    return 0;
}

int wire_problem_from_pb(const Convd__Problem *pb, struct convd_problem *ret, char *why,
                         size_t why_len)
{
    if (pb == NULL) {
        snprintf(why, why_len, "request has no problem");
        return CONVD_EBADSHAPE;
    }
    const struct {
        const char *name;
        uint32_t v;
    } f[] = {
        {"n", pb->n},
        {"h", pb->h},
        {"w", pb->w},
        {"c", pb->c},
        {"k", pb->k},
        {"r", pb->r},
        {"s", pb->s},
        {"groups", pb->groups},
        {"stride_h", pb->stride_h},
        {"stride_w", pb->stride_w},
        {"pad_top", pb->pad_top},
        {"pad_bottom", pb->pad_bottom},
        {"pad_left", pb->pad_left},
        {"pad_right", pb->pad_right},
        {"dil_h", pb->dil_h},
        {"dil_w", pb->dil_w},
    };
    struct convd_problem p = {0};
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
        if (f[i].v > INT32_MAX) {
            snprintf(why, why_len, "field %s is %u, larger than %d", f[i].name, f[i].v, INT32_MAX);
            return CONVD_EBADSHAPE;
        }
    }
    p.n = (int32_t)pb->n;
    p.h = (int32_t)pb->h;
    p.w = (int32_t)pb->w;
    p.c = (int32_t)pb->c;
    p.k = (int32_t)pb->k;
    p.r = (int32_t)pb->r;
    p.s = (int32_t)pb->s;
    p.groups = (int32_t)pb->groups;
    p.stride_h = (int32_t)pb->stride_h;
    p.stride_w = (int32_t)pb->stride_w;
    p.pad_top = (int32_t)pb->pad_top;
    p.pad_bottom = (int32_t)pb->pad_bottom;
    p.pad_left = (int32_t)pb->pad_left;
    p.pad_right = (int32_t)pb->pad_right;
    p.dil_h = (int32_t)pb->dil_h;
    p.dil_w = (int32_t)pb->dil_w;
    switch (pb->dtype) {
    case CONVD__DTYPE__DTYPE_FP32:
        p.dtype = CONVD_DTYPE_FP32;
        break;
    case CONVD__DTYPE__DTYPE_FP16:
        p.dtype = CONVD_DTYPE_FP16;
        break;
    case CONVD__DTYPE__DTYPE_BF16:
        p.dtype = CONVD_DTYPE_BF16;
        break;
    default:
        snprintf(why, why_len, "field dtype is %d, must be fp32 (1), fp16 (2) or bf16 (3)",
                 (int)pb->dtype);
        return CONVD_EBADSHAPE;
    }
    switch (pb->layout) {
    case CONVD__LAYOUT__LAYOUT_NCHW:
        p.layout = CONVD_LAYOUT_NCHW;
        break;
    case CONVD__LAYOUT__LAYOUT_NHWC:
        p.layout = CONVD_LAYOUT_NHWC;
        break;
    default:
        snprintf(why, why_len, "field layout is %d, must be nchw (1) or nhwc (2)", (int)pb->layout);
        return CONVD_EBADSHAPE;
    }
    p.has_bias = pb->has_bias;
    p.allow_tf32 = pb->allow_tf32;
    /* Protocol 1 says ReLU with its flag; protocol 2 with the enum (and may set both). The enum's
     * values are the API's. */
    p.activation = (enum convd_activation)pb->activation;
    if (pb->relu) {
        if (p.activation != CONVD_ACT_NONE && p.activation != CONVD_ACT_RELU) {
            snprintf(why, why_len, "field relu is set with activation %d: set one of them",
                     (int)pb->activation);
            return CONVD_EBADSHAPE;
        }
        p.activation = CONVD_ACT_RELU;
    }
    p.act_min = pb->act_min;
    p.act_max = pb->act_max;
    int rc = convd_problem_check(&p, why, why_len);
    if (rc != 0)
        return rc;
    *ret = p;
    return 0;
}

void wire_problem_to_pb(const struct convd_problem *p, Convd__Problem *pb)
{
    pb->n = (uint32_t)p->n;
    pb->h = (uint32_t)p->h;
    pb->w = (uint32_t)p->w;
    pb->c = (uint32_t)p->c;
    pb->k = (uint32_t)p->k;
    pb->r = (uint32_t)p->r;
    pb->s = (uint32_t)p->s;
    pb->groups = (uint32_t)p->groups;
    pb->stride_h = (uint32_t)p->stride_h;
    pb->stride_w = (uint32_t)p->stride_w;
    pb->pad_top = (uint32_t)p->pad_top;
    pb->pad_bottom = (uint32_t)p->pad_bottom;
    pb->pad_left = (uint32_t)p->pad_left;
    pb->pad_right = (uint32_t)p->pad_right;
    pb->dil_h = (uint32_t)p->dil_h;
    pb->dil_w = (uint32_t)p->dil_w;
    pb->dtype = p->dtype == CONVD_DTYPE_FP16   ? CONVD__DTYPE__DTYPE_FP16
                : p->dtype == CONVD_DTYPE_BF16 ? CONVD__DTYPE__DTYPE_BF16
                : p->dtype == CONVD_DTYPE_FP32 ? CONVD__DTYPE__DTYPE_FP32
                                               : CONVD__DTYPE__DTYPE_UNSPECIFIED;
    pb->layout = p->layout == CONVD_LAYOUT_NHWC   ? CONVD__LAYOUT__LAYOUT_NHWC
                 : p->layout == CONVD_LAYOUT_NCHW ? CONVD__LAYOUT__LAYOUT_NCHW
                                                  : CONVD__LAYOUT__LAYOUT_UNSPECIFIED;
    pb->has_bias = p->has_bias;
    /* ReLU goes as protocol 1's flag too, so that a daemon of protocol 1 runs it. */
    pb->relu = p->activation == CONVD_ACT_RELU;
    pb->allow_tf32 = p->allow_tf32;
    pb->activation = (Convd__Activation)p->activation;
    pb->act_min = p->act_min;
    pb->act_max = p->act_max;
}

int wire_pack_client(const Convd__ClientMessage *m, uint8_t *buf, size_t cap)
{
    size_t need = convd__client_message__get_packed_size(m);
    if (need > cap)
        return CONVD_ETOOBIG;
    return (int)convd__client_message__pack(m, buf);
}

int wire_pack_server(const Convd__ServerMessage *m, uint8_t *buf, size_t cap)
{
    size_t need = convd__server_message__get_packed_size(m);
    if (need > cap)
        return CONVD_ETOOBIG;
    return (int)convd__server_message__pack(m, buf);
}

int wire_ring_request(const struct convd_ring_sqe *e, Convd__ConvRequest *req, Convd__Problem *pb,
                      Convd__TensorRef refs[4], Convd__Gate *gate, char *why, size_t why_len)
{
    if (e->opcode != CONVD_RING_OP_CONV)
        return why_fail(why, why_len, CONVD_EPROTO,
                        "ring entry for request %llu has opcode %u; the only one is CONV (1)",
                        (unsigned long long)e->id, e->opcode);
    if ((e->flags & ~CONVD_RING_F_ALL) != 0)
        return why_fail(why, why_len, CONVD_EPROTO,
                        "ring entry for request %llu sets unknown flags (0x%x)",
                        (unsigned long long)e->id, e->flags);
    *pb = (Convd__Problem)CONVD__PROBLEM__INIT;
    pb->n = e->n;
    pb->h = e->h;
    pb->w = e->w;
    pb->c = e->c;
    pb->k = e->k;
    pb->r = e->r;
    pb->s = e->s;
    pb->groups = e->groups;
    pb->stride_h = e->stride_h;
    pb->stride_w = e->stride_w;
    pb->pad_top = e->pad_top;
    pb->pad_bottom = e->pad_bottom;
    pb->pad_left = e->pad_left;
    pb->pad_right = e->pad_right;
    pb->dil_h = e->dil_h;
    pb->dil_w = e->dil_w;
    pb->dtype = (Convd__DType)e->dtype;
    pb->layout = (Convd__Layout)e->layout;
    pb->has_bias = (e->flags & CONVD_RING_F_BIAS) != 0;
    pb->relu = (e->flags & CONVD_RING_F_RELU) != 0;
    pb->allow_tf32 = (e->flags & CONVD_RING_F_ALLOW_TF32) != 0;
    pb->activation = (Convd__Activation)e->activation;
    pb->act_min = e->act_min;
    pb->act_max = e->act_max;
    const struct convd_ring_tensor *t[4] = {&e->input, &e->weight, &e->bias, &e->output};
    for (int i = 0; i < 4; i++) {
        refs[i] = (Convd__TensorRef)CONVD__TENSOR_REF__INIT;
        refs[i].region_id = t[i]->region_id;
        refs[i].offset = t[i]->offset;
        refs[i].bytes = t[i]->bytes;
    }
    *req = (Convd__ConvRequest)CONVD__CONV_REQUEST__INIT;
    req->id = e->id;
    req->problem = pb;
    req->input = &refs[0];
    req->weight = &refs[1];
    /* An absent bias is all zeros; one that is present is checked like any tensor. */
    bool bias_named = e->bias.region_id != 0 || e->bias.offset != 0 || e->bias.bytes != 0;
    req->bias = pb->has_bias || bias_named ? &refs[2] : NULL;
    req->output = &refs[3];
    req->priority = e->priority;
    req->timeout_us = e->timeout_us;
    if (e->flags & CONVD_RING_F_GATE) {
        *gate = (Convd__Gate)CONVD__GATE__INIT;
        gate->region_id = e->gate.region_id;
        gate->ready_offset = e->gate.ready_offset;
        gate->done_offset = e->gate.done_offset;
        gate->ready_value = e->gate.ready_value;
        gate->done_value = e->gate.done_value;
        req->gate = gate;
    }
    return 0;
}

static void wire_ring_tensor(const Convd__TensorRef *t, struct convd_ring_tensor *out)
{
    out->region_id = t->region_id;
    out->offset = t->offset;
    out->bytes = t->bytes;
}

void wire_ring_entry(const Convd__ConvRequest *req, struct convd_ring_sqe *e)
{
    const Convd__Problem *p = req->problem;
    memset(e, 0, sizeof(*e));
    e->id = req->id;
    e->opcode = CONVD_RING_OP_CONV;
    const bool relu = p->relu || p->activation == CONVD__ACTIVATION__ACTIVATION_RELU;
    e->flags = (p->has_bias ? CONVD_RING_F_BIAS : 0) | (relu ? CONVD_RING_F_RELU : 0) |
               (p->allow_tf32 ? CONVD_RING_F_ALLOW_TF32 : 0);
    e->activation = relu ? 0 : (uint32_t)p->activation;
    e->act_min = p->act_min;
    e->act_max = p->act_max;
    e->n = p->n;
    e->h = p->h;
    e->w = p->w;
    e->c = p->c;
    e->k = p->k;
    e->r = p->r;
    e->s = p->s;
    e->groups = p->groups;
    e->stride_h = p->stride_h;
    e->stride_w = p->stride_w;
    e->pad_top = p->pad_top;
    e->pad_bottom = p->pad_bottom;
    e->pad_left = p->pad_left;
    e->pad_right = p->pad_right;
    e->dil_h = p->dil_h;
    e->dil_w = p->dil_w;
    e->dtype = (uint32_t)p->dtype;
    e->layout = (uint32_t)p->layout;
    e->priority = req->priority;
    e->timeout_us = req->timeout_us;
    wire_ring_tensor(req->input, &e->input);
    wire_ring_tensor(req->weight, &e->weight);
    if (req->bias != NULL)
        wire_ring_tensor(req->bias, &e->bias);
    wire_ring_tensor(req->output, &e->output);
    if (req->gate != NULL) {
        e->flags |= CONVD_RING_F_GATE;
        e->gate.region_id = req->gate->region_id;
        e->gate.ready_offset = req->gate->ready_offset;
        e->gate.done_offset = req->gate->done_offset;
        e->gate.ready_value = req->gate->ready_value;
        e->gate.done_value = req->gate->done_value;
    }
}
