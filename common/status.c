/* Strings of the status table in include/convd/status.h. */
#include "convd/status.h"

const char *convd_strerror(int status)
{
    switch (status) {
#define XX(name, value, msg)                                                                       \
    case (value):                                                                                  \
        return (msg);
        CONVD_STATUS_MAP(XX)
#undef XX
    }
    return "unknown status";
}

const char *convd_status_name(int status)
{
    switch (status) {
#define XX(name, value, msg)                                                                       \
    case (value):                                                                                  \
        return #name;
        CONVD_STATUS_MAP(XX)
#undef XX
    }
    return "UNKNOWN";
}
