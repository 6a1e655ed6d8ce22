/*
 * Configuration: one table of options drives the file parser, the command line, --help and
 * --check-config, so the three can never disagree about a name or a range.
 */
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "why.h"
#include "config.h"
#include "convd/convd.h"
#include "convd/status.h"
#include "log.h"
#include "suggest.h"

enum cfg_type {
    CFG_PATH, /* a socket path: 1 to CONFIG_PATH_BYTES - 1 bytes */
    CFG_FILE, /* a file path, absolute, or empty for none */
    CFG_BACKEND,
    CFG_LOG_LEVEL,
    CFG_INT,   /* int, decimal */
    CFG_U32,   /* uint32_t, decimal */
    CFG_U64,   /* uint64_t, decimal */
    CFG_BYTES, /* uint64_t, decimal with an optional K, M, G, T suffix (powers of 1024) */
    CFG_MODE,  /* uint32_t, octal */
    CFG_GROUP, /* a group name or number */
    CFG_UIDS,  /* comma-separated user names or numbers */
    CFG_GIDS,  /* comma-separated group names or numbers */
};

struct cfg_option {
    const char *key;
    enum cfg_type type;
    size_t offset;
    int64_t min;
    uint64_t max;
    const char *arg;
    const char *help;
    /* SIGHUP applies a new value to the running daemon (it is read where it is used, or the
     * reload hands it on); without it the option takes a restart: it shaped the socket, the
     * backend or something sized at start. */
    bool live;
};

#define OFF(field) offsetof(struct convd_config, field)
#define LIVE       true

static const struct cfg_option cfg_options[] = {
    {"socket", CFG_PATH, OFF(socket_path), 0, 0, "PATH",
     "socket to listen on when not socket-activated (default $CONVD_SOCKET, "
     "else " CONVD_DEFAULT_SOCKET ")"},
    {"backend", CFG_BACKEND, OFF(backend), 0, 0, "auto|cpu|gpu|null",
     "auto: the GPU when built and a device answers, else the CPU; null: complete requests "
     "without computing (for measuring the serving path only)"},
    {"log_level", CFG_LOG_LEVEL, OFF(log_level), 0, 0, "LEVEL", "err, warning, notice, info, debug",
     LIVE},
    {"threads", CFG_INT, OFF(threads), 0, 4096, "N", "CPU backend threads (0: one per CPU)"},
    {"device", CFG_INT, OFF(device), -1, 1023, "N", "GPU ordinal (-1: the first usable)"},
    {"max_clients", CFG_U32, OFF(max_clients), 1, 65536, "N", "connections at once", LIVE},
    {"max_clients_per_user", CFG_U32, OFF(max_clients_per_user), 1, 65536, "N",
     "connections one user (uid) may hold at once", LIVE},
    {"max_inflight_per_user", CFG_U32, OFF(max_inflight_per_user), 1, 1048576, "N",
     "requests one user may have queued or running over all its connections", LIVE},
    {"idle_timeout_ms", CFG_U64, OFF(idle_timeout_ms), 0, 86400000, "MS",
     "when the daemon is full, a client with nothing in flight for this long is closed to admit "
     "a new one (0: never)",
     LIVE},
    {"max_inflight", CFG_U32, OFF(max_inflight), 1, 65536, "N",
     "requests one client may have queued or running", LIVE},
    {"max_regions", CFG_U32, OFF(max_regions), 1, 65536, "N", "regions one client may register",
     LIVE},
    {"max_mapped_bytes", CFG_BYTES, OFF(max_mapped_bytes), 1, (uint64_t)1 << 50, "BYTES",
     "bytes of regions one client may register (suffixes K, M, G, T)", LIVE},
    {"max_regions_per_user", CFG_U32, OFF(max_regions_per_user), 1, 1048576, "N",
     "regions one user may register over all its connections", LIVE},
    {"max_mapped_bytes_per_user", CFG_BYTES, OFF(max_mapped_bytes_per_user), 1, (uint64_t)1 << 50,
     "BYTES", "bytes of regions one user may register over all its connections", LIVE},
    {"max_pinned_bytes", CFG_BYTES, OFF(max_pinned_bytes), 0, (uint64_t)1 << 50, "BYTES",
     "bytes of host-memory regions all clients together may register; the GPU backend pins them "
     "(0: half of the machine's memory)",
     LIVE},
    {"max_batch", CFG_U32, OFF(max_batch), 1, 1024, "N", "requests per backend call"},
    {"slots", CFG_U32, OFF(slots), 0, 64, "N",
     "batches in flight at once on the GPU (and null) backend, at most its own number (0: the "
     "backend's default: 4 of the GPU's 16)"},
    {"launch_threads", CFG_U32, OFF(launch_threads), 0, 4, "N",
     "threads that make the GPU (and null) backend's launch calls, beside the loop, each "
     "launching a different slot's batch (0: the loop launches itself; default 3 with 16 or more "
     "CPUs, 1 with 8 to 15)"},
    {"launch_ahead", CFG_U32, OFF(launch_ahead), 0, 64, "N",
     "with the launch thread, batches that may wait for or be in its launch at once; the queue "
     "forms the next batch, up to max_batch, only when fewer are (0: no bound, the queue is "
     "spread over the free slots)"},
    {"launch_inline", CFG_U32, OFF(launch_inline), 0, 1, "0|1",
     "with launch threads: 1 lets the loop launch a batch itself when no other batch is in "
     "flight, so that a lone request does not wait for a thread; 0: the threads launch every "
     "batch"},
    {"launch_spinners", CFG_U32, OFF(launch_spinners), 0, 4, "N",
     "launch threads that may spin spin_us on an empty queue at once; the others sleep as soon as "
     "they find it empty, leaving their CPUs to the clients (0: every thread spins)"},
    {"completion_flags", CFG_U32, OFF(completion_flags), 0, 1, "0|1",
     "GPU backend: learn that a batch is done from a word its stream writes to mapped host "
     "memory, read with a load (1, where the driver allows), rather than by querying an event "
     "(0)"},
    {"batch_timing", CFG_U32, OFF(batch_timing), 0, 1, "0|1",
     "GPU (and null) backend: time each batch on the device, from its first to its last "
     "operation on its stream, into the histogram convd_device_seconds (a diagnostic: two timing "
     "events a batch)"},
    {"stream_priority", CFG_U32, OFF(stream_priority), 0, 1, "0|1",
     "GPU backend: 1 creates the slots' streams at the device's highest priority, so that the "
     "GPU's scheduler starts the daemon's blocks before those of other processes' streams (under "
     "MPS) and other streams of its own; 0: the default priority"},
    {"device_gates", CFG_U32, OFF(device_gates), 0, 1, "0|1",
     "GPU backend, with completion_flags: 1 stores a stream-ordered request's done word from the "
     "batch's stream right after its work, so that the client's stream goes on without waiting "
     "for the loop to see the batch done; 0: the loop stores it"},
    {"device_waits", CFG_U32, OFF(device_waits), 0, 1, "0|1",
     "GPU backend with completion_flags (and null): 1 launches each stream-ordered request into "
     "its client's lane as it arrives, where the device waits for its ready word and stores its "
     "done word, so that no host hop is on the client's stream; 0: the loop polls ready words "
     "and queues the requests whose words came"},
    {"null_launch_us", CFG_U64, OFF(null_launch_us), 0, 1000000, "US",
     "null backend: host time each launch call takes (busy), modelling a driver's launch"},
    {"null_launch_item_us", CFG_U64, OFF(null_launch_item_us), 0, 1000000, "US",
     "null backend: host time each launch call takes per request, on top of null_launch_us"},
    {"null_exec_us", CFG_U64, OFF(null_exec_us), 0, 1000000, "US",
     "null backend: time from a launch's return to its batch being done, modelling a kernel"},
    {"max_queue_delay_us", CFG_U64, OFF(max_queue_delay_us), 0, 10000000, "US",
     "time an idle worker may wait for a batch to fill (0: dispatch at once)", LIVE},
    {"queue_limit", CFG_U32, OFF(queue_limit), 1, 1048576, "N",
     "requests waiting, all clients together", LIVE},
    {"drain_timeout_ms", CFG_U64, OFF(drain_timeout_ms), 0, 3600000, "MS",
     "on SIGTERM, time left to queued work before it fails with ESHUTDOWN", LIVE},
    {"socket_mode", CFG_MODE, OFF(socket_mode), 0, 0777, "OCTAL",
     "permissions of a socket convd binds itself"},
    {"socket_group", CFG_GROUP, OFF(socket_group), 0, 0, "GROUP",
     "group of a socket convd binds itself"},
    {"allow_uids", CFG_UIDS, OFF(allow_uids), 0, 0, "LIST",
     "users allowed to connect (names or numbers, comma-separated)", LIVE},
    {"allow_gids", CFG_GIDS, OFF(allow_gids), 0, 0, "LIST",
     "groups allowed to connect (names or numbers, comma-separated)", LIVE},
    {"max_protocol_errors", CFG_U32, OFF(max_protocol_errors), 1, 1000000, "N",
     "protocol errors before a connection is closed", LIVE},
    {"max_send_queue_bytes", CFG_BYTES, OFF(max_send_queue_bytes), 65536, (uint64_t)1 << 30,
     "BYTES", "replies a client has not read before it is disconnected", LIVE},
    {"hello_timeout_ms", CFG_U64, OFF(hello_timeout_ms), 100, 3600000, "MS",
     "time a new connection has to send Hello", LIVE},
    {"spin_us", CFG_U64, OFF(spin_us), 0, 1000000, "US",
     "time the loop keeps polling rings, sockets and the device after its last work before it "
     "sleeps (0: sleep at once)"},
    {"doorbell_threads", CFG_U32, OFF(doorbell_threads), 0, 8, "N",
     "threads that send doorbells to ring clients asleep on their sockets (0: the loop does; "
     "default 2 with 8 or more CPUs, else 0)"},
    {"doorbell_spin_us", CFG_U64, OFF(doorbell_spin_us), 0, 1000000, "US",
     "time a doorbell thread keeps polling its queue after its last send before it sleeps, so "
     "that the loop need not wake it (0: it sleeps at once)"},
    {"ring_stall_timeout_ms", CFG_U64, OFF(ring_stall_timeout_ms), 10, 3600000, "MS",
     "time a client's completion ring may stay full and unread before it is disconnected", LIVE},
    {"gate_timeout_ms", CFG_U64, OFF(gate_timeout_ms), 1, 3600000, "MS",
     "time a request may wait on its gate's ready word (stream ordering) before it fails with "
     "ETIMEDOUT",
     LIVE},
    {"gate_poll_us", CFG_U64, OFF(gate_poll_us), 0, 1000000, "US",
     "while requests wait on their gates and nothing else happens, the loop sleeps this long "
     "between looks at their ready words (0: it spins)",
     LIVE},
    {"gate_spin_clients", CFG_U32, OFF(gate_spin_clients), 0, 65536, "N",
     "while the requests waiting on their gates are those of at most N connections, the loop "
     "spins on their ready words rather than sleeping gate_poll_us between looks: a few "
     "clients leave the host CPUs to spare (0: never; default one per four CPUs, at least 1)",
     LIVE},
    {"metrics_textfile", CFG_FILE, OFF(metrics_textfile), 0, 0, "FILE",
     "write the metrics there, for node_exporter's textfile collector (a .prom file; "
     "{device} becomes the device option's value, so that per-GPU daemons sharing this file "
     "write one each; empty: none)",
     LIVE},
    {"metrics_textfile_interval_ms", CFG_U64, OFF(metrics_textfile_interval_ms), 1000, 3600000,
     "MS", "how often metrics_textfile is rewritten", LIVE},
};

#define N_OPTIONS (sizeof(cfg_options) / sizeof(cfg_options[0]))

void config_defaults(struct convd_config *c)
{
    memset(c, 0, sizeof(*c));
    const char *env = getenv("CONVD_SOCKET");
    if (env != NULL && *env != '\0' && strlen(env) < sizeof(c->socket_path))
        strcpy(c->socket_path, env);
    else
        strcpy(c->socket_path, CONVD_DEFAULT_SOCKET);
    c->backend = CONFIG_BACKEND_AUTO;
    c->log_level = LOG_LVL_INFO;
    c->threads = 0;
    c->device = -1;
    c->max_clients = 128;
    /* Three quarters of the connections and half of the queue per user: whatever one user
     * holds, another still gets in and gets queued, and a service with dozens of worker
     * processes under one uid still fits. */
    c->max_clients_per_user = 96;
    c->max_inflight_per_user = 2048;
    c->idle_timeout_ms = 30000;
    c->max_inflight = 256;
    c->max_regions = 256;
    c->max_mapped_bytes = (uint64_t)16 << 30;
    /* Per user, four clients' bytes and sixteen clients' regions; max_pinned_bytes bounds
     * everyone's host memory together. */
    c->max_regions_per_user = 4096;
    c->max_mapped_bytes_per_user = (uint64_t)64 << 30;
    c->max_pinned_bytes = 0;
    c->max_batch = 32;
    c->slots = 0;
    /* Under many clients the loop thread is the ceiling and launching was 45% of it: off the
     * loop, 16 clients x 1 did 1.32x the requests (H100, docs/benchmarks.md). With completion
     * words the one launch thread became the ceiling, and three took 64 x 1 from 520k to 628k
     * images/s and 16 x 4 from 569k to 683k (H100, 2026-12-06). Like the ringers, they only
     * compete with the clients on a small machine. */
    const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    c->launch_threads = ncpu >= 16 ? 3 : ncpu >= 8 ? 1 : 0;
    c->launch_ahead = 0;
    c->launch_inline = 1;
    c->launch_spinners = 0;
    c->completion_flags = 1;
    c->max_queue_delay_us = 0;
    c->queue_limit = 4096;
    c->drain_timeout_ms = 10000;
    c->socket_mode = 0660;
    c->max_protocol_errors = 16;
    c->max_send_queue_bytes = (uint64_t)1 << 20;
    c->hello_timeout_ms = 10000;
    c->spin_us = 50;
    /* Ringers pay off where clients have CPUs of their own to sleep and wake on; on a small
     * machine they only compete with the clients and the loop (measured on 2 CPUs). */
    c->doorbell_threads = sysconf(_SC_NPROCESSORS_ONLN) >= 8 ? 2 : 0;
    c->doorbell_spin_us = 0;
    c->ring_stall_timeout_ms = 10000;
    c->gate_timeout_ms = 10000;
    c->gate_poll_us = 100;
    c->gate_spin_clients = ncpu >= 8 ? (uint32_t)(ncpu / 4) : 1;
    c->metrics_textfile[0] = '\0';
    c->metrics_textfile_interval_ms = 15000;
}

const char *config_backend_name(enum config_backend b)
{
    switch (b) {
    case CONFIG_BACKEND_AUTO:
        return "auto";
    case CONFIG_BACKEND_CPU:
        return "cpu";
    case CONFIG_BACKEND_GPU:
        return "gpu";
    case CONFIG_BACKEND_NULL:
        return "null";
    }
    return "unknown";
}

static const struct cfg_option *cfg_find(const char *key)
{
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (strcmp(cfg_options[i].key, key) == 0)
            return &cfg_options[i];
    return NULL;
}

/* "; did you mean 'max_inflight'?" for a key that is a likely typo of a known one (with dashes
 * for the command line), else "". */
static const char *cfg_hint(const char *key, bool dashes, char *buf, size_t cap)
{
    const char *names[N_OPTIONS + 1];
    for (size_t i = 0; i < N_OPTIONS; i++)
        names[i] = cfg_options[i].key;
    names[N_OPTIONS] = "config";
    const char *best = suggest_closest(key, names, N_OPTIONS + 1);
    if (best == NULL) {
        buf[0] = '\0';
        return buf;
    }
    char name[64];
    snprintf(name, sizeof(name), "%s", best);
    for (char *p = name; dashes && *p != '\0'; p++)
        if (*p == '_')
            *p = '-';
    snprintf(buf, cap, dashes ? "; did you mean --%s?" : "; did you mean '%s'?", name);
    return buf;
}

bool config_key_live(const char *key)
{
    const struct cfg_option *o = key != NULL ? cfg_find(key) : NULL;
    return o != NULL && o->live;
}

/* Parses an unsigned decimal (or, with base 8, octal) number covering all of s, with an optional
 * binary size suffix when `suffixes` is set. Rejects signs, which strtoull would accept. */
static int cfg_parse_u64(const char *s, int base, bool suffixes, uint64_t *ret)
{
    if (!isdigit((unsigned char)s[0]))
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, base);
    if (errno != 0 || end == s)
        return -1;
    if (suffixes && *end != '\0') {
        static const char units[] = "KMGT";
        const char *u = strchr(units, toupper((unsigned char)*end));
        if (u == NULL)
            return -1;
        end++;
        if (strcasecmp(end, "ib") == 0 || strcasecmp(end, "b") == 0)
            end += strlen(end);
        unsigned shift = 10u * (unsigned)(u - units + 1);
        if (v > (ULLONG_MAX >> shift))
            return -1;
        v <<= shift;
    }
    if (*end != '\0')
        return -1;
    *ret = v;
    return 0;
}

static int cfg_parse_id(const char *name, bool group, uint32_t *ret)
{
    uint64_t v;
    if (cfg_parse_u64(name, 10, false, &v) == 0) {
        if (v >= UINT32_MAX) /* (uid_t)-1 means "no change" to chown: never an identity */
            return -1;
        *ret = (uint32_t)v;
        return 0;
    }
    char buf[4096];
    if (group) {
        struct group gr, *res = NULL;
        if (getgrnam_r(name, &gr, buf, sizeof(buf), &res) != 0 || res == NULL)
            return -1;
        *ret = res->gr_gid;
    } else {
        struct passwd pw, *res = NULL;
        if (getpwnam_r(name, &pw, buf, sizeof(buf), &res) != 0 || res == NULL)
            return -1;
        *ret = res->pw_uid;
    }
    return 0;
}

/* "a, b,c" into ids; an empty value clears the list. */
static int cfg_parse_id_list(const char *key, const char *value, bool group, uint32_t *ids,
                             size_t *ret_n, char *why, size_t why_len)
{
    uint32_t tmp[CONFIG_MAX_IDS];
    size_t n = 0;
    const char *p = value;
    while (*p != '\0') {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (*p == '\0')
            break;
        const char *e = p;
        while (*e != '\0' && *e != ',' && *e != ' ' && *e != '\t')
            e++;
        char name[256];
        size_t len = (size_t)(e - p);
        if (len >= sizeof(name))
            return why_fail(why, why_len, CONVD_EINVAL, "%s: name '%.40s...' is too long", key, p);
        memcpy(name, p, len);
        name[len] = '\0';
        if (n == CONFIG_MAX_IDS)
            return why_fail(why, why_len, CONVD_EINVAL, "%s: more than %d entries", key,
                            CONFIG_MAX_IDS);
        if (cfg_parse_id(name, group, &tmp[n]) != 0)
            return why_fail(why, why_len, CONVD_EINVAL,
                            "%s: '%s' is not a known %s name or a number", key, name,
                            group ? "group" : "user");
        n++;
        p = e;
    }
    memcpy(ids, tmp, n * sizeof(ids[0]));
    *ret_n = n;
    return 0;
}

int config_set(struct convd_config *c, const char *key, const char *value, char *why,
               size_t why_len)
{
    if (c == NULL || key == NULL || value == NULL)
        return why_fail(why, why_len, CONVD_EINVAL, "missing key or value");
    const struct cfg_option *o = cfg_find(key);
    if (o == NULL) {
        char hint[96];
        return why_fail(why, why_len, CONVD_EINVAL, "unknown key '%s'%s", key,
                        cfg_hint(key, false, hint, sizeof(hint)));
    }
    char *field = (char *)c + o->offset;
    uint64_t v;

    switch (o->type) {
    case CFG_PATH: {
        size_t len = strlen(value);
        if (len == 0)
            return why_fail(why, why_len, CONVD_EINVAL, "%s: empty path", key);
        if (len >= CONFIG_PATH_BYTES)
            return why_fail(why, why_len, CONVD_EINVAL,
                            "%s: path of %zu bytes is longer than the %d a Unix "
                            "socket address holds",
                            key, len, CONFIG_PATH_BYTES - 1);
        memset(field, 0, CONFIG_PATH_BYTES);
        memcpy(field, value, len);
        return 0;
    }
    case CFG_FILE: {
        size_t len = strlen(value);
        if (len >= CONFIG_FILE_BYTES)
            return why_fail(why, why_len, CONVD_EINVAL, "%s: path of %zu bytes is too long", key,
                            len);
        if (len > 0 && value[0] != '/')
            return why_fail(why, why_len, CONVD_EINVAL, "%s: '%s' is not an absolute path", key,
                            value);
        memset(field, 0, CONFIG_FILE_BYTES);
        memcpy(field, value, len);
        return 0;
    }
    case CFG_BACKEND: {
        enum config_backend b;
        if (strcasecmp(value, "auto") == 0)
            b = CONFIG_BACKEND_AUTO;
        else if (strcasecmp(value, "cpu") == 0)
            b = CONFIG_BACKEND_CPU;
        else if (strcasecmp(value, "gpu") == 0)
            b = CONFIG_BACKEND_GPU;
        else if (strcasecmp(value, "null") == 0)
            b = CONFIG_BACKEND_NULL;
        else
            return why_fail(why, why_len, CONVD_EINVAL, "%s: '%s' is not auto, cpu, gpu or null",
                            key, value);
        c->backend = b;
        return 0;
    }
    case CFG_LOG_LEVEL: {
        int level;
        if (convd_log_parse_level(value, &level) != 0)
            return why_fail(why, why_len, CONVD_EINVAL,
                            "%s: '%s' is not err, warning, notice, info, debug or 0-7", key, value);
        c->log_level = level;
        return 0;
    }
    case CFG_INT: {
        bool neg = value[0] == '-';
        if (cfg_parse_u64(value + neg, 10, false, &v) != 0 || v > (uint64_t)INT32_MAX)
            return why_fail(why, why_len, CONVD_EINVAL, "%s: '%s' is not a number", key, value);
        int64_t s = neg ? -(int64_t)v : (int64_t)v;
        if (s < o->min || s > (int64_t)o->max)
            return why_fail(why, why_len, CONVD_EINVAL, "%s: %lld is out of range (%lld to %llu)",
                            key, (long long)s, (long long)o->min, (unsigned long long)o->max);
        *(int *)(void *)field = (int)s;
        return 0;
    }
    case CFG_U32:
    case CFG_U64:
    case CFG_BYTES:
    case CFG_MODE:
        if (cfg_parse_u64(value, o->type == CFG_MODE ? 8 : 10, o->type == CFG_BYTES, &v) != 0)
            return why_fail(why, why_len, CONVD_EINVAL, "%s: '%s' is not %s", key, value,
                            o->type == CFG_MODE    ? "an octal mode"
                            : o->type == CFG_BYTES ? "a byte count (suffixes K, M, G, T)"
                                                   : "a non-negative number");
        if (v < (uint64_t)o->min || v > o->max) {
            if (o->type == CFG_MODE)
                return why_fail(why, why_len, CONVD_EINVAL, "%s: %llo is out of range (0 to 0777)",
                                key, (unsigned long long)v);
            return why_fail(why, why_len, CONVD_EINVAL, "%s: %llu is out of range (%lld to %llu)",
                            key, (unsigned long long)v, (long long)o->min,
                            (unsigned long long)o->max);
        }
        if (o->type == CFG_U32 || o->type == CFG_MODE)
            *(uint32_t *)(void *)field = (uint32_t)v;
        else
            *(uint64_t *)(void *)field = v;
        return 0;
    case CFG_GROUP: {
        uint32_t gid;
        if (value[0] == '\0') {
            c->socket_group_set = false;
            return 0;
        }
        if (cfg_parse_id(value, true, &gid) != 0)
            return why_fail(why, why_len, CONVD_EINVAL,
                            "%s: '%s' is not a known group name or a number", key, value);
        c->socket_group = gid;
        c->socket_group_set = true;
        return 0;
    }
    case CFG_UIDS:
        return cfg_parse_id_list(key, value, false, c->allow_uids, &c->n_allow_uids, why, why_len);
    case CFG_GIDS:
        return cfg_parse_id_list(key, value, true, c->allow_gids, &c->n_allow_gids, why, why_len);
    }
    return why_fail(why, why_len, CONVD_EINVAL, "%s: option of unknown type", key);
}

static bool cfg_space(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\r';
}

/* Parses one line (no newline) into key and value, both NUL-terminated copies. Returns 1 for a
 * key/value line, 0 for a blank or comment line, -1 with the reason in why for anything else. */
static int cfg_split_line(const char *line, size_t len, char *key, size_t key_cap, char *value,
                          size_t value_cap, char *why, size_t why_len)
{
    const char *p = line, *end = line + len;
    while (p < end && cfg_space(*p))
        p++;
    if (p == end || *p == '#')
        return 0;
    for (const char *q = p; q < end; q++)
        if (*q == '\0' || (iscntrl((unsigned char)*q) && *q != '\t' && *q != '\r'))
            return why_fail(why, why_len, CONVD_EINVAL, "control character in line"), -1;
    const char *eq = memchr(p, '=', (size_t)(end - p));
    if (eq == NULL)
        return why_fail(why, why_len, CONVD_EINVAL, "expected 'key = value', got '%.*s'",
                        (int)(end - p), p),
               -1;
    const char *ke = eq;
    while (ke > p && cfg_space(ke[-1]))
        ke--;
    if (ke == p)
        return why_fail(why, why_len, CONVD_EINVAL, "missing key before '='"), -1;
    for (const char *q = p; q < ke; q++)
        if (!(isalnum((unsigned char)*q) || *q == '_' || *q == '-'))
            return why_fail(why, why_len, CONVD_EINVAL,
                            "key '%.*s' has a character other than letters, "
                            "digits, '_' and '-'",
                            (int)(ke - p), p),
                   -1;
    if ((size_t)(ke - p) >= key_cap)
        return why_fail(why, why_len, CONVD_EINVAL, "key '%.40s...' is too long", p), -1;

    const char *v = eq + 1, *ve = end;
    while (v < ve && cfg_space(*v))
        v++;
    if (v < ve && *v == '"') {
        const char *close = memchr(v + 1, '"', (size_t)(ve - v - 1));
        if (close == NULL)
            return why_fail(why, why_len, CONVD_EINVAL, "unterminated quote"), -1;
        const char *rest = close + 1;
        while (rest < ve && cfg_space(*rest))
            rest++;
        if (rest < ve && *rest != '#')
            return why_fail(why, why_len, CONVD_EINVAL, "text after the closing quote"), -1;
        v++;
        ve = close;
    } else {
        /* a '#' that follows whitespace starts a comment */
        for (const char *q = v; q < ve; q++)
            if (*q == '#' && (q == v || cfg_space(q[-1]))) {
                ve = q;
                break;
            }
        while (ve > v && cfg_space(ve[-1]))
            ve--;
    }
    if ((size_t)(ve - v) >= value_cap)
        return why_fail(why, why_len, CONVD_EINVAL, "value is too long"), -1;

    size_t kl = (size_t)(ke - p);
    for (size_t i = 0; i < kl; i++)
        key[i] = p[i] == '-' ? '_' : p[i];
    key[kl] = '\0';
    memcpy(value, v, (size_t)(ve - v));
    value[ve - v] = '\0';
    return 1;
}

int config_parse_text(struct convd_config *c, const char *text, size_t len, const char *source,
                      char *why, size_t why_len)
{
    if (c == NULL || (text == NULL && len > 0))
        return why_fail(why, why_len, CONVD_EINVAL, "no configuration text");
    if (source == NULL)
        source = "config";
    const char *p = text, *end = text + len;
    for (unsigned lineno = 1; p < end; lineno++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl != NULL ? nl : end;
        char key[64], value[1024], err[384];
        int kind = cfg_split_line(p, (size_t)(le - p), key, sizeof(key), value, sizeof(value), err,
                                  sizeof(err));
        if (kind < 0)
            return why_fail(why, why_len, CONVD_EINVAL, "%s:%u: %s", source, lineno, err);
        if (kind > 0) {
            if (strcmp(key, "config") == 0)
                return why_fail(why, why_len, CONVD_EINVAL,
                                "%s:%u: 'config' is a command-line option only", source, lineno);
            if (config_set(c, key, value, err, sizeof(err)) != 0)
                return why_fail(why, why_len, CONVD_EINVAL, "%s:%u: %s", source, lineno, err);
        }
        p = nl != NULL ? nl + 1 : end;
    }
    return 0;
}

int config_load_file(struct convd_config *c, const char *path, char *why, size_t why_len)
{
    /* A config file is small; anything larger than this is not one. */
    enum { MAX_FILE = 1 << 20 };
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        int err = errno;
        why_fail(why, why_len, CONVD_EINVAL, "cannot open %s: %s", path, strerror(err));
        return CONVD_EIO;
    }
    int rc = CONVD_EIO;
    char *buf = malloc(MAX_FILE + 1);
    if (buf == NULL) {
        why_fail(why, why_len, CONVD_EINVAL, "out of memory reading %s", path);
        rc = CONVD_ENOMEM;
        goto out;
    }
    size_t n = fread(buf, 1, MAX_FILE + 1, f);
    if (ferror(f)) {
        why_fail(why, why_len, CONVD_EINVAL, "cannot read %s", path);
        goto out;
    }
    if (n > MAX_FILE) {
        rc = why_fail(why, why_len, CONVD_EINVAL, "%s is larger than %d bytes", path, MAX_FILE);
        goto out;
    }
    rc = config_parse_text(c, buf, n, path, why, why_len);
out:
    free(buf);
    fclose(f);
    return rc;
}

/* metrics_textfile with "{device}" replaced by the device option's value ("any" for -1), once
 * the file and the command line are both applied: the daemons of convd@.service read one
 * convd.conf and get --device on their command lines, and each must write a file of its own. */
static void cfg_expand_textfile(struct convd_config *c)
{
    static const char mark[] = "{device}";
    char *at = strstr(c->metrics_textfile, mark);
    if (at == NULL)
        return;
    char dev[16], out[CONFIG_FILE_BYTES];
    if (c->device >= 0)
        snprintf(dev, sizeof(dev), "%d", c->device);
    else
        snprintf(dev, sizeof(dev), "any");
    /* The value (at most 4 characters: device <= 1023) is shorter than the mark, so the result
     * always fits where the template did. */
    size_t len = 0;
    for (const char *p = c->metrics_textfile; *p != '\0';) {
        if (strncmp(p, mark, sizeof(mark) - 1) == 0) {
            memcpy(out + len, dev, strlen(dev));
            len += strlen(dev);
            p += sizeof(mark) - 1;
        } else {
            out[len++] = *p++;
        }
    }
    out[len] = '\0';
    memcpy(c->metrics_textfile, out, len + 1);
}

/* One command-line option that waits to be applied after the file. */
struct cfg_arg {
    const char *key_src; /* as written, without the leading dashes and any "=value" */
    size_t key_len;
    const char *value;
};

int config_from_args(int argc, char *const argv[], struct convd_config *ret_config,
                     enum config_action *ret_action, char *why, size_t why_len)
{
    if (argc < 1 || argv == NULL || ret_config == NULL || ret_action == NULL)
        return why_fail(why, why_len, CONVD_EINVAL, "no arguments");
    struct cfg_arg *args = calloc((size_t)argc, sizeof(*args));
    if (args == NULL)
        return why_fail(why, why_len, CONVD_EINVAL, "out of memory");
    size_t n_args = 0;
    const char *config_path = NULL;
    enum config_action action = CONFIG_RUN;
    int rc = CONVD_EINVAL;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            action = CONFIG_HELP;
            continue;
        }
        if (strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) {
            if (action == CONFIG_RUN)
                action = CONFIG_VERSION;
            continue;
        }
        if (strcmp(a, "--check-config") == 0) {
            if (action == CONFIG_RUN)
                action = CONFIG_CHECK;
            continue;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            why_fail(why, why_len, CONVD_EINVAL, "unexpected argument '%s' (see --help)", a);
            goto out;
        }
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t name_len = eq != NULL ? (size_t)(eq - name) : strlen(name);
        const char *value;
        if (eq != NULL) {
            value = eq + 1;
        } else {
            if (i + 1 >= argc) {
                why_fail(why, why_len, CONVD_EINVAL, "option --%s needs a value", name);
                goto out;
            }
            value = argv[++i];
        }
        if (name_len == 6 && strncmp(name, "config", 6) == 0) {
            config_path = value;
            continue;
        }
        args[n_args++] = (struct cfg_arg){name, name_len, value};
    }

    struct convd_config c;
    config_defaults(&c);
    if (action == CONFIG_HELP || action == CONFIG_VERSION) {
        *ret_config = c;
        *ret_action = action;
        rc = 0;
        goto out;
    }
    if (config_path != NULL) {
        rc = config_load_file(&c, config_path, why, why_len);
        if (rc != 0)
            goto out;
    } else if (access(CONVD_DEFAULT_CONFIG, F_OK) == 0) {
        rc = config_load_file(&c, CONVD_DEFAULT_CONFIG, why, why_len);
        if (rc != 0)
            goto out;
    }
    rc = CONVD_EINVAL;
    for (size_t i = 0; i < n_args; i++) {
        char key[64], err[384];
        if (args[i].key_len >= sizeof(key)) {
            why_fail(why, why_len, CONVD_EINVAL, "unknown option --%.*s", (int)args[i].key_len,
                     args[i].key_src);
            goto out;
        }
        for (size_t k = 0; k < args[i].key_len; k++)
            key[k] = args[i].key_src[k] == '-' ? '_' : args[i].key_src[k];
        key[args[i].key_len] = '\0';
        if (cfg_find(key) == NULL) {
            char hint[96];
            why_fail(why, why_len, CONVD_EINVAL, "unknown option --%.*s%s (see --help)",
                     (int)args[i].key_len, args[i].key_src,
                     cfg_hint(key, true, hint, sizeof(hint)));
            goto out;
        }
        if (config_set(&c, key, args[i].value, err, sizeof(err)) != 0) {
            why_fail(why, why_len, CONVD_EINVAL, "--%.*s: %s", (int)args[i].key_len,
                     args[i].key_src, err);
            goto out;
        }
    }
    cfg_expand_textfile(&c);
    *ret_config = c;
    *ret_action = action;
    rc = 0;
out:
    free(args);
    return rc;
}

void config_usage(FILE *out, const char *prog)
{
    fprintf(out,
            "Usage: %s [OPTIONS]\n"
            "convd serves grouped 2-D convolutions to local processes over a Unix socket.\n\n",
            prog);
    const char *const general[][2] = {
        {"--config FILE",
         "read `key = value` lines (default " CONVD_DEFAULT_CONFIG " if it exists)"},
        {"", "every option below is also a key there, with '_' for '-'; the command line wins"},
        {"--check-config", "print the effective configuration and exit"},
        {"-h, --help", "this text"},
        {"-V, --version", "the version"},
    };
    for (size_t i = 0; i < sizeof(general) / sizeof(general[0]); i++)
        fprintf(out, "  %-30s %s\n", general[i][0], general[i][1]);
    fputc('\n', out);
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const struct cfg_option *o = &cfg_options[i];
        char flag[64];
        size_t k = 0;
        for (const char *p = o->key; *p != '\0' && k + 1 < sizeof(flag); p++)
            flag[k++] = *p == '_' ? '-' : *p;
        flag[k] = '\0';
        char left[96];
        snprintf(left, sizeof(left), "--%s %s", flag, o->arg);
        fprintf(out, "  %-30s %s\n", left, o->help);
    }
}

/* An option's value as config_print() writes it after "key =" (with its leading space), so that
 * config_parse_text() reads it back: paths quoted, so that a '#' and edge spaces survive (but a
 * quoted value ends at its first '"', so a path holding one, which a file can only give as an
 * unquoted value, goes unquoted), numbers in decimal, the mode in octal, lists comma-separated;
 * nothing at all for an unset group or an empty list. */
static void cfg_format(const struct cfg_option *o, const struct convd_config *c, char *buf,
                       size_t cap)
{
    static const char *const levels[] = {"0",       "1",      "2",    "err",
                                         "warning", "notice", "info", "debug"};
    const char *field = (const char *)c + o->offset;
    switch (o->type) {
    case CFG_PATH:
    case CFG_FILE:
        snprintf(buf, cap, strchr(field, '"') != NULL ? " %s" : " \"%s\"", field);
        return;
    case CFG_BACKEND:
        snprintf(buf, cap, " %s", config_backend_name(c->backend));
        return;
    case CFG_LOG_LEVEL:
        snprintf(buf, cap, " %s",
                 c->log_level >= 0 && c->log_level <= 7 ? levels[c->log_level] : "info");
        return;
    case CFG_INT:
        snprintf(buf, cap, " %d", *(const int *)(const void *)field);
        return;
    case CFG_U32:
        snprintf(buf, cap, " %u", (unsigned)*(const uint32_t *)(const void *)field);
        return;
    case CFG_U64:
    case CFG_BYTES:
        snprintf(buf, cap, " %llu", (unsigned long long)*(const uint64_t *)(const void *)field);
        return;
    case CFG_MODE:
        snprintf(buf, cap, " %04o", (unsigned)*(const uint32_t *)(const void *)field);
        return;
    case CFG_GROUP:
        if (c->socket_group_set)
            snprintf(buf, cap, " %u", (unsigned)c->socket_group);
        else
            buf[0] = '\0';
        return;
    case CFG_UIDS:
    case CFG_GIDS: {
        const uint32_t *ids = o->type == CFG_UIDS ? c->allow_uids : c->allow_gids;
        size_t n = o->type == CFG_UIDS ? c->n_allow_uids : c->n_allow_gids;
        size_t len = 0;
        buf[0] = '\0';
        for (size_t i = 0; i < n && len < cap; i++) {
            int k = snprintf(buf + len, cap - len, "%s%u", i ? "," : " ", (unsigned)ids[i]);
            if (k < 0)
                break;
            len += (size_t)k;
        }
        return;
    }
    }
    buf[0] = '\0';
}

void config_print(const struct convd_config *c, FILE *out)
{
    char value[CONFIG_FILE_BYTES + 8];
    for (size_t i = 0; i < N_OPTIONS; i++) {
        cfg_format(&cfg_options[i], c, value, sizeof(value));
        fprintf(out, "%s =%s\n", cfg_options[i].key, value);
    }
}

/* Copies a formatted value without its leading space, cut with "..." to fit. */
static void cfg_short(char *dst, size_t cap, const char *value)
{
    const char *v = value[0] == ' ' ? value + 1 : value;
    size_t len = strlen(v);
    if (len < cap) {
        memcpy(dst, v, len + 1);
        return;
    }
    snprintf(dst, cap, "%.*s...", (int)(cap - 4), v);
}

size_t config_diff(const struct convd_config *a, const struct convd_config *b,
                   struct config_change *out, size_t cap)
{
    size_t n = 0;
    char va[CONFIG_FILE_BYTES + 8], vb[CONFIG_FILE_BYTES + 8];
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const struct cfg_option *o = &cfg_options[i];
        cfg_format(o, a, va, sizeof(va));
        cfg_format(o, b, vb, sizeof(vb));
        if (strcmp(va, vb) == 0)
            continue;
        if (n < cap) {
            out[n].key = o->key;
            out[n].live = o->live;
            cfg_short(out[n].before, sizeof(out[n].before), va);
            cfg_short(out[n].after, sizeof(out[n].after), vb);
        }
        n++;
    }
    return n;
}

bool config_peer_allowed(const struct convd_config *c, uid_t uid, const gid_t *gids, size_t n_gids)
{
    if (c->n_allow_uids == 0 && c->n_allow_gids == 0)
        return true;
    for (size_t i = 0; i < c->n_allow_uids; i++)
        if (c->allow_uids[i] == uid)
            return true;
    for (size_t i = 0; i < c->n_allow_gids; i++)
        for (size_t j = 0; j < n_gids; j++)
            if (c->allow_gids[i] == gids[j])
                return true;
    return false;
}
