/*
 * The one way daemon code reports a failure: a code plus a sentence written into the caller's
 * buffer, so that the reason travels to the client (Completion.error, RegionReply.error) or the
 * log unchanged.
 */
#ifndef CONVD_DAEMON_WHY_H
#define CONVD_DAEMON_WHY_H

#include <stddef.h>

/* Formats the sentence into why (when why is not NULL and why_len > 0; truncated to fit) and
 * returns code, so that `return why_fail(why, len, CONVD_EBOUNDS, "...", ...);` reads as one
 * statement. */
int why_fail(char *why, size_t why_len, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
