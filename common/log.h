/*
 * Logging for the daemon and the command-line tools (the libraries never log). Lines go to
 * stderr with a syslog priority prefix ("<3>...") so that journald keeps the level. The level is
 * checked before the arguments are evaluated.
 */
#ifndef CONVD_COMMON_LOG_H
#define CONVD_COMMON_LOG_H

#define LOG_LVL_ERR     3
#define LOG_LVL_WARNING 4
#define LOG_LVL_NOTICE  5
#define LOG_LVL_INFO    6
#define LOG_LVL_DEBUG   7

extern int convd_log_level;

void convd_log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parses "err", "warning", "notice", "info", "debug" (or a digit 0-7). Returns 0 or -1. */
int convd_log_parse_level(const char *s, int *ret_level);

#define log_at(level, ...)                                                                         \
    do {                                                                                           \
        if ((level) <= convd_log_level)                                                            \
            convd_log_write((level), __VA_ARGS__);                                                 \
    } while (0)

#define log_err(...)    log_at(LOG_LVL_ERR, __VA_ARGS__)
#define log_warn(...)   log_at(LOG_LVL_WARNING, __VA_ARGS__)
#define log_notice(...) log_at(LOG_LVL_NOTICE, __VA_ARGS__)
#define log_info(...)   log_at(LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...)  log_at(LOG_LVL_DEBUG, __VA_ARGS__)

#endif
