#include <stdarg.h>
#include <stdio.h>

#include "why.h"
#include "pbscan.h"

/* ClientMessage's oneof fields, by number. Keep it in step with proto/convd.proto: a field missing
 * here is neither checked for its wire type nor scanned inside. */
static const char *const pbs_names[] = {
    NULL,      "hello", "register_region", "unregister_region", "conv", "status",
    "metrics", "ping",  "attach_ring",     "doorbell"};

/* Reads a varint at *pos. 0 on success; 1 when the buffer ends inside it; 2 when it is longer
 * than the 10 bytes a 64-bit value can take. */
static int pbs_varint(const uint8_t *p, size_t len, size_t *pos, uint64_t *ret)
{
    uint64_t v = 0;
    for (int shift = 0, n = 0;; shift += 7, n++) {
        if (n == 10)
            return 2;
        if (*pos >= len)
            return 1;
        uint8_t b = p[(*pos)++];
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            break;
    }
    *ret = v;
    return 0;
}

/* Scans the fields of one message occupying p[0, len). `where` prefixes the sentence ("" at the
 * top, "in field 4 (conv): " one level down); `base` is p's offset in the datagram. */
static int pbs_scan(const uint8_t *p, size_t len, size_t base, int top, const char *where,
                    char *why, size_t why_len)
{
    size_t i = 0;
    while (i < len) {
        size_t at = base + i;
        uint64_t key, v;
        int rc = pbs_varint(p, len, &i, &key);
        if (rc != 0)
            return why_fail(why, why_len, 1, "%s%s field key at byte %zu", where,
                            rc == 1 ? "truncated" : "over-long (more than 10 bytes)", at);
        uint64_t field = key >> 3;
        unsigned wt = (unsigned)(key & 7);
        if (field == 0)
            return why_fail(why, why_len, 1, "%sfield number 0 at byte %zu (never valid)", where,
                            at);
        if (top && field < sizeof(pbs_names) / sizeof(pbs_names[0]) && wt != 2)
            return why_fail(why, why_len, 1,
                            "field %llu (%s) at byte %zu has wire type %u, expected 2 "
                            "(a length-delimited message)",
                            (unsigned long long)field, pbs_names[field], at, wt);
        switch (wt) {
        case 0:
            rc = pbs_varint(p, len, &i, &v);
            if (rc != 0)
                return why_fail(why, why_len, 1, "%s%s varint in field %llu at byte %zu", where,
                                rc == 1 ? "truncated" : "over-long", (unsigned long long)field, at);
            break;
        case 1:
        case 5: {
            size_t need = wt == 1 ? 8 : 4;
            if (len - i < need)
                return why_fail(why, why_len, 1,
                                "%sfield %llu at byte %zu needs %zu bytes, %zu remain", where,
                                (unsigned long long)field, at, need, len - i);
            i += need;
            break;
        }
        case 2:
            rc = pbs_varint(p, len, &i, &v);
            if (rc != 0)
                return why_fail(why, why_len, 1, "%s%s length of field %llu at byte %zu", where,
                                rc == 1 ? "truncated" : "over-long", (unsigned long long)field, at);
            if (v > len - i)
                return why_fail(why, why_len, 1,
                                "%sfield %llu at byte %zu declares %llu bytes, only %zu remain",
                                where, (unsigned long long)field, at, (unsigned long long)v,
                                len - i);
            if (top && field < sizeof(pbs_names) / sizeof(pbs_names[0])) {
                char inner[64];
                snprintf(inner, sizeof(inner), "in field %llu (%s): ", (unsigned long long)field,
                         pbs_names[field]);
                if (pbs_scan(p + i, (size_t)v, base + i, 0, inner, why, why_len))
                    return 1;
            }
            i += (size_t)v;
            break;
        case 3:
        case 4:
            return why_fail(why, why_len, 1,
                            "%sfield %llu at byte %zu uses the deprecated group wire type %u",
                            where, (unsigned long long)field, at, wt);
        default:
            return why_fail(why, why_len, 1, "%sinvalid wire type %u (field %llu) at byte %zu",
                            where, wt, (unsigned long long)field, at);
        }
    }
    return 0;
}

int pbscan_client_message(const uint8_t *buf, size_t len, char *why, size_t why_len)
{
    if (buf == NULL || len == 0)
        return why_fail(why, why_len, 1, "empty datagram");
    return pbs_scan(buf, len, 0, 1, "", why, why_len);
}
