/*
 * Explains why a datagram is not a valid protobuf ClientMessage. protobuf-c only says that
 * unpacking failed; a client author needs to know where and why, so this walks the encoding
 * itself (no I/O, no allocation) and names the first structural fault: a truncated varint, field
 * number 0, an invalid or deprecated wire type, a length that runs past the end, or a
 * ClientMessage field that is not a length-delimited message. It descends one level, into the
 * message a ClientMessage field holds.
 */
#ifndef CONVD_DAEMON_PBSCAN_H
#define CONVD_DAEMON_PBSCAN_H

#include <stddef.h>
#include <stdint.h>

/* Returns 1 with a sentence in why when a fault was found, 0 when the encoding looks well formed
 * at the levels scanned (the fault, if any, is deeper or semantic). */
int pbscan_client_message(const uint8_t *buf, size_t len, char *why, size_t why_len);

#endif
