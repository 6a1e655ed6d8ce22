/*
 * libFuzzer target: one datagram as the daemon reads it (conn_on_datagram). protobuf-c decodes it
 * or refuses it, and pbscan explains a refusal in the sentence the client gets. Checked: pbscan
 * stays inside the datagram and the sentence buffer, returns a NUL-terminated, non-empty sentence
 * whenever it finds a fault, never blames a datagram protobuf-c accepts, and names a ClientMessage
 * field of the wrong wire type as its header promises; a decoded ConvRequest's problem converts
 * and sizes as the daemon will use it; every decoded message packs back to bytes that decode and
 * pack to the same bytes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convd.pb-c.h"
#include "fixture.h"
#include "pbscan.h"
#include "wire.h"

#define WHY_BYTES 192 /* as conn_on_datagram's */

/* The field number and wire type of the datagram's first key, or -1 when it is not a whole
 * varint of at most 10 bytes. */
static int first_key(const uint8_t *p, size_t len, uint64_t *field, unsigned *wt)
{
    uint64_t v = 0;
    for (size_t i = 0; i < len && i < 10; i++) {
        v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
        if (!(p[i] & 0x80)) {
            *field = v >> 3;
            *wt = (unsigned)(v & 7);
            return 0;
        }
    }
    return -1;
}

static void check_pbscan(const uint8_t *data, size_t size, bool decoded)
{
    /* Buffers of the exact size, so that ASan sees a write past them. */
    char *why = malloc(WHY_BYTES);
    size_t small_len = 1 + size % 16;
    char *small = malloc(small_len);
    FX_CHECK(why != NULL && small != NULL);
    int found = pbscan_client_message(data, size, why, WHY_BYTES);
    FX_CHECK(found == 0 || found == 1);
    if (found) {
        FX_CHECK(why[0] != '\0' && memchr(why, '\0', WHY_BYTES) != NULL);
        /* A short buffer gets the same verdict and the start of the same sentence. */
        FX_CHECK(pbscan_client_message(data, size, small, small_len) == 1);
        FX_CHECK(memchr(small, '\0', small_len) != NULL);
        FX_CHECK(strncmp(small, why, small_len - 1) == 0);
    }
    /* An empty datagram decodes as an empty ClientMessage; pbscan calls it a fault on purpose.
     * protobuf-c 1.4 takes field number 0 for an unknown field when its key has more than one
     * byte (it checks one-byte keys only); pbscan rightly calls it invalid. */
    if (decoded && size > 0 && found) {
        const char *zero = strstr(why, "field number 0 at byte ");
        size_t at = SIZE_MAX;
        FX_CHECK(zero != NULL && sscanf(zero, "field number 0 at byte %zu", &at) == 1);
        FX_CHECK(at < size && (data[at] & 0xf8) == 0x80); /* more bytes, field bits 0 */
    }
    uint64_t field;
    unsigned wt;
    if (first_key(data, size, &field, &wt) == 0 && wt != 2 && field <= UINT32_MAX &&
        protobuf_c_message_descriptor_get_field(&convd__client_message__descriptor,
                                                (unsigned)field) != NULL)
        FX_CHECK(found);
    free(small);
    free(why);
}

static void check_conv(const Convd__ConvRequest *req)
{
    struct convd_problem p;
    char why[256];
    int rc = wire_problem_from_pb(req->problem, &p, why, sizeof(why));
    if (rc != 0) {
        fx_check_sentence(rc, why, sizeof(why));
        return;
    }
    /* A problem convd_problem_check() passed has sizes (under 1 TiB a tensor). */
    struct convd_problem_sizes sz;
    FX_CHECK(convd_problem_sizes(&p, &sz, why, sizeof(why)) == 0);
    /* The sizes again, from the definitions in conv.h, in 128 bits. */
    int64_t eh = (int64_t)p.h + p.pad_top + p.pad_bottom - (int64_t)p.dil_h * (p.r - 1) - 1;
    int64_t ew = (int64_t)p.w + p.pad_left + p.pad_right - (int64_t)p.dil_w * (p.s - 1) - 1;
    FX_CHECK(eh >= 0 && ew >= 0);
    FX_CHECK(sz.out_h == eh / p.stride_h + 1 && sz.out_w == ew / p.stride_w + 1);
    const unsigned __int128 esz = convd_dtype_size(p.dtype);
    FX_CHECK(sz.input_bytes == (unsigned __int128)p.n * p.h * p.w * p.c * esz);
    FX_CHECK(sz.weight_bytes == (unsigned __int128)p.k * p.r * p.s * (p.c / p.groups) * esz);
    FX_CHECK(sz.output_bytes == (unsigned __int128)p.n * sz.out_h * sz.out_w * p.k * esz);
    FX_CHECK(sz.input_bytes > 0 && sz.input_bytes <= CONVD_MAX_TENSOR_BYTES);
    FX_CHECK(sz.weight_bytes > 0 && sz.weight_bytes <= CONVD_MAX_TENSOR_BYTES);
    FX_CHECK(sz.output_bytes > 0 && sz.output_bytes <= CONVD_MAX_TENSOR_BYTES);
    FX_CHECK(sz.bias_bytes <= CONVD_MAX_TENSOR_BYTES && (sz.bias_bytes > 0) == p.has_bias);
    rc = wire_request_supported(&p, CONVD_PROTOCOL_VERSION, why, sizeof(why));
    if (rc != 0)
        fx_check_sentence(rc, why, sizeof(why));
    /* What the client library sends for this problem is what arrived. */
    Convd__Problem back = CONVD__PROBLEM__INIT;
    wire_problem_to_pb(&p, &back);
    const Convd__Problem *in = req->problem;
    FX_CHECK(back.n == in->n && back.h == in->h && back.w == in->w && back.c == in->c &&
             back.k == in->k && back.r == in->r && back.s == in->s && back.groups == in->groups);
    FX_CHECK(back.stride_h == in->stride_h && back.stride_w == in->stride_w &&
             back.pad_top == in->pad_top && back.pad_bottom == in->pad_bottom &&
             back.pad_left == in->pad_left && back.pad_right == in->pad_right &&
             back.dil_h == in->dil_h && back.dil_w == in->dil_w);
    FX_CHECK(back.dtype == in->dtype && back.layout == in->layout &&
             back.has_bias == in->has_bias && back.act_min == in->act_min &&
             back.act_max == in->act_max && back.allow_tf32 == in->allow_tf32);
    /* ReLU arrives as the flag, the enum or both, and goes back as both. */
    const Convd__Activation act = in->relu ? CONVD__ACTIVATION__ACTIVATION_RELU : in->activation;
    FX_CHECK(back.activation == act && back.relu == (act == CONVD__ACTIVATION__ACTIVATION_RELU));
    char str[256];
    convd_problem_str(&p, str, sizeof(str));
    FX_CHECK(memchr(str, '\0', sizeof(str)) != NULL);
}

/* True when m or a message inside it kept an unknown field numbered 0 (see check_pbscan):
 * protobuf-c packs it back as a one-byte key, which it then refuses. */
static bool has_field_zero(const ProtobufCMessage *m)
{
    for (unsigned i = 0; i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == 0)
            return true;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)(const void *)((const char *)m + f->quantifier_offset) != f->id)
            continue;
        const ProtobufCMessage *sub =
            *(const ProtobufCMessage *const *)(const void *)((const char *)m + f->offset);
        if (sub != NULL && has_field_zero(sub))
            return true;
    }
    return false;
}

static void check_repack(const Convd__ClientMessage *m)
{
    if (has_field_zero(&m->base))
        return;
    size_t n = convd__client_message__get_packed_size(m);
    uint8_t *a = malloc(n + 1), *b = malloc(n + 1);
    FX_CHECK(a != NULL && b != NULL);
    FX_CHECK(convd__client_message__pack(m, a) == n);
    if (n > 0)
        FX_CHECK(wire_pack_client(m, b, n - 1) == CONVD_ETOOBIG);
    Convd__ClientMessage *again = convd__client_message__unpack(NULL, n, a);
    FX_CHECK(again != NULL);
    FX_CHECK(again->msg_case == m->msg_case);
    FX_CHECK(convd__client_message__get_packed_size(again) == n);
    FX_CHECK(convd__client_message__pack(again, b) == n);
    FX_CHECK(memcmp(a, b, n) == 0);
    convd__client_message__free_unpacked(again, NULL);
    free(b);
    free(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Convd__ClientMessage *m = convd__client_message__unpack(NULL, size, data);
    check_pbscan(data, size, m != NULL);
    if (m == NULL)
        return 0;
    if (m->msg_case == CONVD__CLIENT_MESSAGE__MSG_CONV)
        check_conv(m->conv);
    check_repack(m);
    convd__client_message__free_unpacked(m, NULL);
    return 0;
}
