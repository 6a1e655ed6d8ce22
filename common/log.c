#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"

int convd_log_level = LOG_LVL_INFO;

void convd_log_write(int level, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    int n = snprintf(line, sizeof(line), "<%d>", level);
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    /* one fputs per line keeps lines from different threads whole */
    size_t len = strlen(line);
    if (len + 1 < sizeof(line)) {
        line[len] = '\n';
        line[len + 1] = '\0';
    }
    fputs(line, stderr);
}

int convd_log_parse_level(const char *s, int *ret_level)
{
    static const struct {
        const char *name;
        int level;
    } names[] = {
        {"err", LOG_LVL_ERR},      {"error", LOG_LVL_ERR},     {"warning", LOG_LVL_WARNING},
        {"warn", LOG_LVL_WARNING}, {"notice", LOG_LVL_NOTICE}, {"info", LOG_LVL_INFO},
        {"debug", LOG_LVL_DEBUG},
    };
    if (s == NULL)
        return -1;
    if (s[0] >= '0' && s[0] <= '7' && s[1] == '\0') {
        *ret_level = s[0] - '0';
        return 0;
    }
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcasecmp(s, names[i].name) == 0) {
            *ret_level = names[i].level;
            return 0;
        }
    return -1;
}
