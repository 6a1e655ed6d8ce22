/*
 * The daemon's configuration: built-in defaults, then $CONVD_SOCKET, then the config file, then
 * the command line, each overriding the one before. Every option has one name: `max_batch` in the
 * file is `--max-batch` on the command line.
 *
 * The file format is `key = value` lines; blank lines and lines starting with '#' are ignored, and
 * a '#' after whitespace starts a comment. Values may be double-quoted.
 *
 * The parsers do no I/O apart from reading the file named by --config and looking up user and
 * group names, so they are tested on strings.
 */
#ifndef CONVD_DAEMON_CONFIG_H
#define CONVD_DAEMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define CONFIG_MAX_IDS    32
#define CONFIG_PATH_BYTES 108  /* sizeof(sockaddr_un.sun_path) */
#define CONFIG_FILE_BYTES 4096 /* a file path (PATH_MAX) */

/* Used when --config is not given, and only if the file exists. */
#ifndef CONVD_DEFAULT_CONFIG
#define CONVD_DEFAULT_CONFIG "/etc/convd/convd.conf"
#endif

enum config_backend {
    CONFIG_BACKEND_AUTO = 0, /* the GPU when built and a device answers, else the CPU */
    CONFIG_BACKEND_CPU,
    CONFIG_BACKEND_GPU,
    CONFIG_BACKEND_NULL, /* completes requests without computing: serving-path benchmarks */
};

struct convd_config {
    char socket_path[CONFIG_PATH_BYTES];
    enum config_backend backend;
    int log_level;                  /* LOG_LVL_* */
    int threads;                    /* CPU backend threads; 0: one per online CPU */
    int device;                     /* GPU ordinal; -1: the first usable */
    uint32_t max_clients;           /* connections that completed or await their handshake */
    uint32_t max_clients_per_user;  /* of those, held by one uid */
    uint32_t max_inflight_per_user; /* requests queued or running, one uid's connections together */
    uint64_t idle_timeout_ms;      /* a full daemon closes a client idle this long for a newcomer */
    uint32_t max_inflight;         /* per client: requests queued or running */
    uint32_t max_regions;          /* per client */
    uint64_t max_mapped_bytes;     /* per client: bytes of registered regions */
    uint32_t max_regions_per_user; /* one uid's connections together */
    uint64_t max_mapped_bytes_per_user; /* one uid's connections together */
    uint64_t max_pinned_bytes; /* host-memory regions of all clients; 0: half the machine's RAM */
    uint32_t max_batch;        /* requests per backend call */
    uint32_t slots;            /* asynchronous backends: batches in flight (0: the backend's) */
    uint32_t launch_threads;   /* asynchronous backends: 1 launches beside the loop */
    uint32_t launch_ahead;     /* with the launch thread: batches not yet launched (0: any) */
    uint32_t launch_inline;    /* with launch threads: the loop launches a lone batch itself */
    uint32_t launch_spinners;  /* launch threads that may spin at once (0: all) */
    uint32_t completion_flags; /* GPU: batches report done through host words (0: events) */
    uint32_t batch_timing;     /* time each batch on the device (convd_device_seconds) */
    uint32_t stream_priority;  /* GPU: the slots' streams at the highest priority */
    uint32_t device_gates;     /* GPU: gates' done words stored by the batch's stream */
    uint32_t device_waits;     /* GPU, null: gated requests launched into lanes at once */
    uint64_t doorbell_spin_us; /* ringers poll their queue this long before they sleep */
    uint64_t null_launch_us, null_launch_item_us, null_exec_us; /* the null backend's model */
    uint64_t max_queue_delay_us; /* how long an idle worker may wait for a batch to grow */
    uint32_t queue_limit;        /* requests waiting, all clients together */
    uint64_t drain_timeout_ms;   /* on SIGTERM, time for queued work before it is failed */
    uint32_t socket_mode;        /* permission bits of a socket the daemon binds itself */
    bool socket_group_set;
    gid_t socket_group; /* group of that socket, when socket_group_set */
    size_t n_allow_uids, n_allow_gids;
    uid_t allow_uids[CONFIG_MAX_IDS]; /* both lists empty: every peer the socket admits */
    gid_t allow_gids[CONFIG_MAX_IDS];
    uint32_t max_protocol_errors;   /* per connection, before the daemon closes it */
    uint64_t max_send_queue_bytes;  /* per connection: replies the peer has not read yet */
    uint64_t hello_timeout_ms;      /* a connection must send Hello within this time */
    uint64_t spin_us;               /* the loop polls rings and sockets this long before sleeping */
    uint32_t doorbell_threads;      /* threads that wake sleeping ring clients (0: the loop) */
    uint64_t ring_stall_timeout_ms; /* a full completion ring nobody reads closes the connection */
    uint64_t gate_timeout_ms;       /* a gated request waits this long for its ready word */
    uint64_t gate_poll_us;          /* an idle loop's sleep between looks at gates (0: spin) */
    uint32_t gate_spin_clients;     /* ... unless at most this many connections wait on gates */
    char metrics_textfile[CONFIG_FILE_BYTES]; /* node_exporter textfile; "": none */
    uint64_t metrics_textfile_interval_ms;    /* how often it is rewritten */
};

/* What main() should do after config_from_args(). */
enum config_action {
    CONFIG_RUN = 0,
    CONFIG_HELP,
    CONFIG_VERSION,
    CONFIG_CHECK, /* --check-config: print the effective configuration and exit */
};

/* Fills c with the built-in defaults; the socket path comes from $CONVD_SOCKET when it is set and
 * fits, else CONVD_DEFAULT_SOCKET. */
void config_defaults(struct convd_config *c);

/* Sets one option from its textual value. Returns 0, or CONVD_EINVAL with a sentence in why
 * naming the key and what is wrong with the value. c is unchanged on failure. */
int config_set(struct convd_config *c, const char *key, const char *value, char *why,
               size_t why_len);

/* Applies every `key = value` line of text (len bytes, need not be NUL-terminated). Stops at the
 * first bad line and returns CONVD_EINVAL with "<source>:<line>: ..." in why; lines before it stay
 * applied. */
int config_parse_text(struct convd_config *c, const char *text, size_t len, const char *source,
                      char *why, size_t why_len);

/* Reads path and applies it with config_parse_text(). CONVD_EIO when it cannot be read. */
int config_load_file(struct convd_config *c, const char *path, char *why, size_t why_len);

/* The whole start-up sequence: defaults, $CONVD_SOCKET, the config file (--config FILE, else
 * CONVD_DEFAULT_CONFIG if it exists), then the other command-line options. Returns 0 with the
 * result in *ret_config and what to do in *ret_action, or CONVD_EINVAL / CONVD_EIO with the
 * reason in why. argv[0] is skipped. */
int config_from_args(int argc, char *const argv[], struct convd_config *ret_config,
                     enum config_action *ret_action, char *why, size_t why_len);

/* Prints the --help text. */
void config_usage(FILE *out, const char *prog);

/* Prints the configuration as `key = value` lines that config_parse_text() reads back. */
void config_print(const struct convd_config *c, FILE *out);

/* One option that differs between two configurations (config_diff). Values as config_print
 * writes them, cut to fit. */
struct config_change {
    const char *key;
    bool live; /* SIGHUP applies it to the running daemon; false: it takes a restart */
    char before[64], after[64];
};
#define CONFIG_MAX_OPTIONS 64

/* The options whose values differ between a and b, in the order --help lists them, into out
 * (at most cap). Returns how many differ (which may exceed cap). */
size_t config_diff(const struct convd_config *a, const struct convd_config *b,
                   struct config_change *out, size_t cap);

/* True when SIGHUP applies key to a running daemon; false for keys that take a restart (and for
 * unknown keys). */
bool config_key_live(const char *key);

/* True when the peer may use the daemon: both allow-lists are empty (the socket's mode and group
 * are then the only gate), its uid is in allow_uids, or one of its gids (primary and
 * supplementary) is in allow_gids. Nobody is allowed implicitly, root included. */
bool config_peer_allowed(const struct convd_config *c, uid_t uid, const gid_t *gids, size_t n_gids);

const char *config_backend_name(enum config_backend b);

#endif
