/*
 * The wire protocol's constants and the conversions between protobuf-c messages and the C
 * structs of the API. No I/O here: everything works on byte buffers, so it is tested directly.
 */
#ifndef CONVD_COMMON_WIRE_H
#define CONVD_COMMON_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "convd.pb-c.h"
#include "convd/conv.h"
#include "ring_layout.h"

/* The protocol versions this build speaks: the newest, which a client asks for and a daemon
 * prefers, and the oldest it still accepts (docs/protocol.md, "Versioning"). */
#define CONVD_PROTOCOL_VERSION     3u
#define CONVD_PROTOCOL_VERSION_MIN 1u
/* The first version whose Problem carries activations other than relu. */
#define CONVD_PROTOCOL_ACTIVATIONS 2u
/* The first version whose ConvRequest may carry a Gate (and ring entries CONVD_RING_F_GATE). */
#define CONVD_PROTOCOL_GATES 3u
/* Largest datagram either side reads or writes. Requests are a few hundred bytes; metrics replies
 * are the largest messages. */
#define CONVD_MAX_MESSAGE_BYTES (64u * 1024u)
#define CONVD_IPC_HANDLE_BYTES  64u
#define CONVD_MAX_PRIORITY      3u
#define CONVD_MAX_NAME_BYTES    64u

/* Converts a decoded Problem into the C struct. Every field is range-checked against int32 (the
 * struct's type) and the enums are mapped; the full semantic check is convd_problem_check(),
 * which this calls. Returns 0 or a CONVD_E* code with the reason in why. */
int wire_problem_from_pb(const Convd__Problem *pb, struct convd_problem *ret, char *why,
                         size_t why_len);

/* What a request may ask for beyond a valid problem on a connection of protocol `version`,
 * judged the same way by the client library and the daemon (CONVD_EUNSUPPORTED, so that nothing
 * asked for is silently dropped): an activation other than relu needs protocol 2, which an older
 * daemon would not read. Returns 0 or the code with a sentence. (allow_tf32 needs nothing here:
 * daemons before TF32 refuse it themselves, naming the flag.) */
int wire_request_supported(const struct convd_problem *p, uint32_t version, char *why,
                           size_t why_len);

/* The protocol version of a connection: the newest that both sides speak, the peer from
 * peer_min to peer_max (peer_min 0: peer_max alone, as a Hello without min_protocol_version
 * says) and this side from own_min to own_max. Returns 0 with it in *ret_version, or
 * CONVD_EVERSION with a sentence naming both ranges ("the client speaks protocol version 7 and
 * this daemon versions 1 to 1: no version in common"); `peer` and `self` name the two sides in
 * it. */
int wire_pick_version(uint32_t peer_min, uint32_t peer_max, uint32_t own_min, uint32_t own_max,
                      const char *peer, const char *self, uint32_t *ret_version, char *why,
                      size_t why_len);

/* Turns a ring entry into the ConvRequest it stands for, so that the ring and the socket share
 * every check after this one: the fields the message does not have (opcode, flags) are checked
 * here (CONVD_EPROTO). req points into pb, refs and gate, which the caller provides. */
int wire_ring_request(const struct convd_ring_sqe *e, Convd__ConvRequest *req, Convd__Problem *pb,
                      Convd__TensorRef refs[4], Convd__Gate *gate, char *why, size_t why_len);

/* The ring entry for a ConvRequest: wire_ring_request's inverse (ReLU as the flag, any other
 * activation in the activation word, an absent bias all zeros). For clients that speak the
 * protocol by hand: the tests and the fuzzers' seeds. */
void wire_ring_entry(const Convd__ConvRequest *req, struct convd_ring_sqe *e);

/* Fills an initialised Problem message from a C struct (no allocation). */
void wire_problem_to_pb(const struct convd_problem *p, Convd__Problem *pb);

/* Packs a message into buf if it fits in cap bytes. Returns the packed length, or CONVD_ETOOBIG
 * when it does not fit. */
int wire_pack_client(const Convd__ClientMessage *m, uint8_t *buf, size_t cap);
int wire_pack_server(const Convd__ServerMessage *m, uint8_t *buf, size_t cap);

#endif
