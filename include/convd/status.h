/*
 * convd status codes: one table shared by the daemon, the client library, the kernel library and
 * the wire protocol.
 *
 * Every function of the public API returns 0 on success or one of the negative CONVD_E* codes
 * below. On the wire a status travels as the same negative number (field type int32), so the code
 * a client reads from a completion is the code the daemon produced.
 *
 * The table is an X-macro in the manner of libuv's UV_ERRNO_MAP: XX(name, value, message). Add new
 * codes at the end; never renumber, since old clients compare against these values.
 */
#ifndef CONVD_STATUS_H
#define CONVD_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

#define CONVD_STATUS_MAP(XX)                                                                       \
    XX(OK, 0, "success")                                                                           \
    XX(EINVAL, -1, "invalid argument")                                                             \
    XX(EPROTO, -2, "malformed or unexpected protocol message")                                     \
    XX(EVERSION, -3, "unsupported protocol version")                                               \
    XX(ENOMEM, -4, "out of memory")                                                                \
    XX(EBADSHAPE, -5, "invalid convolution problem")                                               \
    XX(EGROUPS, -6, "channels not divisible by groups")                                            \
    XX(EUNSUPPORTED, -7, "problem not supported by this backend")                                  \
    XX(ENOREGION, -8, "unknown region")                                                            \
    XX(EBOUNDS, -9, "tensor reference outside its region")                                         \
    XX(ESIZE, -10, "tensor byte count does not match the problem")                                 \
    XX(ESEAL, -11, "memfd is not sealed against shrinking and growing")                            \
    XX(ETOOBIG, -12, "message or request too large")                                               \
    XX(EQUEUEFULL, -13, "request queue is full")                                                   \
    XX(ELIMIT, -14, "per-client limit reached")                                                    \
    XX(ETIMEDOUT, -15, "timed out")                                                                \
    XX(ECANCELED, -16, "request canceled")                                                         \
    XX(EDEVICE, -17, "device error")                                                               \
    XX(EIO, -18, "input/output error")                                                             \
    XX(ECONNECT, -19, "cannot connect to the daemon")                                              \
    XX(ECLOSED, -20, "connection closed")                                                          \
    XX(EAGAIN, -21, "no result available yet")                                                     \
    XX(ENOTFOUND, -22, "no such request")                                                          \
    XX(EPERM, -23, "permission denied")                                                            \
    XX(ESHUTDOWN, -24, "daemon is shutting down")                                                  \
    XX(EEXIST, -25, "identifier already in use")                                                   \
    XX(EBUSY, -26, "resource busy")                                                                \
    XX(EINTERNAL, -27, "internal error")

enum convd_status_code {
#define CONVD_STATUS_ENUM_(name, value, msg) CONVD_##name = (value),
    CONVD_STATUS_MAP(CONVD_STATUS_ENUM_)
#undef CONVD_STATUS_ENUM_
};

/* Returns the sentence for a status code ("tensor reference outside its region"). Never NULL:
 * unknown codes give "unknown status". The string is static. */
const char *convd_strerror(int status);

/* Returns the symbolic name of a status code without its prefix ("EBOUNDS"), or "UNKNOWN". */
const char *convd_status_name(int status);

#ifdef __cplusplus
}
#endif

#endif
