/*
 * Integration test harness: starts a real convd (CPU backend) on a temporary socket, talks to it
 * through the real client library or through raw SOCK_SEQPACKET sockets with hand-built
 * protobuf, and checks afterwards that the daemon still answers, that nothing leaked (its open
 * descriptors in /proc/<pid>/fd, its memfd mappings in /proc/<pid>/maps, its region gauges in
 * the metrics) and that SIGTERM makes it drain and exit 0.
 *
 * Every helper asserts through cmocka, so a failure points at the line that called it. Waits
 * are bounded by generous timeouts (TU_TIMEOUT_MS) and never assert on speed: a slow machine or
 * a sanitizer build only makes a test take longer.
 */
#ifndef CONVD_IT_HARNESS_H
#define CONVD_IT_HARNESS_H

/* cmocka needs these before its header. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdbool.h>
#include <sys/types.h>

#include "convd.pb-c.h"
#include "convd/convd.h"
#include "raw.h"
#include "testutil.h"

/* The daemon's gauges for registered memory, as its metrics export them. */
#define IT_METRIC_REGIONS      "convd_regions"
#define IT_METRIC_MAPPED_BYTES "convd_mapped_bytes"

/* A running daemon. `mon` is a client connected for the daemon's whole life: it reads status
 * and metrics and proves that the daemon still answers. */
struct it_daemon {
    pid_t pid;
    char dir[64];   /* temporary directory holding the socket */
    char sock[128]; /* socket path */
    convd_client *mon;
    int base_fds;       /* daemon's open descriptors with only `mon` connected */
    int base_ring_maps; /* its ring mappings then: mon's, when the library attached rings */
    uint32_t base_clients;
    bool stopped;
};

/* Starts build/bin/convd --socket <tmpdir>/convd.sock plus `args` (NULL-terminated), polls
 * until a client can connect and connects `mon` as monitor_name. Returns 0, or -1 with the
 * reason in why (the daemon is gone and the directory removed then). No cmocka asserts, so it
 * can run before the tests do (the GPU daemon test probes with it). */
int it_daemon_spawn(struct it_daemon *d, const char *const *args, const char *monitor_name,
                    char *why, size_t why_len);

/* Starts build/bin/convd --backend cpu --threads 2 --socket <tmpdir>/convd.sock plus `extra`
 * (NULL-terminated, may be NULL), waits until a client can connect, connects `mon` and records
 * the baseline. Asserts on failure. */
void it_daemon_start(struct it_daemon *d, const char *const *extra);

/* Records the baseline it_daemon_check_baseline compares with, once the daemon has released
 * every region: only `mon` connected, its open descriptors, no memfd mapped, the monitor's rings.
 * it_daemon_start calls it after its warm-up; a test that spawns its own daemon calls it after
 * its own. Asserts on failure. */
void it_daemon_take_baseline(struct it_daemon *d);

/* Waits until the daemon is back to its baseline (only `mon` connected, as many open
 * descriptors as at the start, no region registered, no memfd mapped) and asserts it, then
 * proves that it still answers a ping and a convolution. */
void it_daemon_check_clean(struct it_daemon *d);

/* it_daemon_check_clean without the convolution at the end (a daemon that computes nothing:
 * the null backend): the baseline, then a ping. */
void it_daemon_check_baseline(struct it_daemon *d);

/* Sends SIGTERM, waits for the daemon to exit and asserts it exited with status 0. Closes `mon`
 * first. Removes the temporary directory. */
void it_daemon_stop(struct it_daemon *d);

/* Waits for a daemon the test already sent SIGTERM to, asserts exit status 0, closes `mon`
 * and removes the temporary directory. */
void it_daemon_wait_exit(struct it_daemon *d);

/* Last-resort cleanup for a group teardown after a failed test: SIGKILL, reap, remove files.
 * Does nothing if the daemon was stopped already. */
void it_daemon_kill(struct it_daemon *d);

/* Connects a new client to the daemon (asserts success). */
convd_client *it_connect(const struct it_daemon *d, const char *name);

/* Connects to the daemon at sock as `name`, with the library's use_rings option (-1: its
 * default). Asserts on failure. */
convd_client *it_connect_to(const char *sock, const char *name, int use_rings);

/* Counts entries of /proc/<pid>/fd, or -1 if the process is gone. */
int it_count_fds(pid_t pid);

/* A field of /proc/<pid>/status in kB ("VmRSS", "VmHWM"), or -1. */
long it_proc_kb(pid_t pid, const char *field);

/* Counts mappings of memfd files ("/memfd:" in /proc/<pid>/maps) other than rings, or -1. */
int it_count_memfd_maps(pid_t pid);

/* Counts mappings of ring memfds, or -1. */
int it_count_ring_maps(pid_t pid);

/* Reads one unlabelled metric from the daemon's Prometheus text. Returns true and sets *ret
 * when it is present. */
bool it_metric(convd_client *c, const char *name, double *ret);

/* The process-wide random generator, seeded from tu_seed(). */
struct tu_rng *it_rng(void);

/*
 * One convolution laid out in a region: input, weight, bias (if any) and output at 64-byte
 * aligned offsets from `base`, inputs random, output poisoned, reference computed.
 */
struct it_case {
    struct convd_problem p;
    struct convd_problem_sizes sz;
    convd_region *region;
    uint64_t base;
    uint64_t off_in, off_w, off_b, off_out;
    uint64_t span; /* bytes the case occupies from base */
    float *ref;
};

/* Bytes a problem needs in a region (the span of it_case_init). */
uint64_t it_case_span(const struct convd_problem *p);

/* Lays out the problem in region r at base (r must hold it), fills inputs with random data from
 * g, poisons the output and computes the reference. With g NULL it only lays out and poisons
 * (inputs stay as they are, no reference): for load whose results are not checked. */
void it_case_init(struct it_case *t, convd_region *r, uint64_t base, const struct convd_problem *p,
                  struct tu_rng *g);

/* Arguments naming the case's tensors. */
void it_case_args(const struct it_case *t, struct convd_conv_args *a);

/* Asserts the output matches the reference within the dtype's tolerance. */
void it_case_check(const struct it_case *t);

/* Like it_case_check but returns false instead of failing (for forked children). */
bool it_case_ok(const struct it_case *t, char *why, size_t why_len);

/* Re-randomises the inputs and re-poisons the output so the same layout can be reused. */
void it_case_refresh(struct it_case *t, struct tu_rng *g);

void it_case_fini(struct it_case *t);

/* Runs one small random convolution through c (own region) and asserts it is right. */
void it_one_conv(convd_client *c, struct tu_rng *g);

/* A problem heavy enough to take a noticeable time on the CPU backend (about a second or more):
 * used to keep the daemon's workers busy so that later requests stay queued. Its output is not
 * checked. */
void it_heavy_problem(struct convd_problem *p);

/*
 * A helper process that keeps running convolutions through its own client and checking them,
 * to show that hostile traffic on other connections does not disturb well-behaved clients.
 */
struct it_worker {
    pid_t pid;
    int stop_fd; /* write end: closing it tells the worker to stop */
};

void it_worker_start(struct it_worker *w, const struct it_daemon *d, uint64_t seed);

/* Stops the worker and asserts that it ran at least one convolution and all were correct. */
void it_worker_stop(struct it_worker *w);

/* Waits for a child process (bounded) and returns its raw wait status; asserts it exited. */
int it_wait_child(pid_t pid);

#endif
