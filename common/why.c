#include <stdarg.h>
#include <stdio.h>

#include "why.h"

int why_fail(char *why, size_t why_len, int code, const char *fmt, ...)
{
    if (why != NULL && why_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return code;
}
