/*
 * The one way code reports a failure: a code plus a sentence written into the caller's buffer,
 * so that the reason travels to the client (Completion.error, RegionReply.error), the log or
 * convctl's message unchanged. Compiled into convd_core, so that the daemon, both backends, the
 * client library and convctl share it; the name has no convd_ prefix, so the client library's
 * version script keeps it local.
 */
#ifndef CONVD_COMMON_WHY_H
#define CONVD_COMMON_WHY_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Formats the sentence into why (when why is not NULL and why_len > 0; truncated to fit) and
 * returns code, so that `return why_fail(why, len, CONVD_EBOUNDS, "...", ...);` reads as one
 * statement. */
int why_fail(char *why, size_t why_len, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#ifdef __cplusplus
}
#endif

#endif
