/*
 * What the fault tests share: a scenario of real clients (through libconvd-client), the check that
 * a daemon still serves and holds nothing, and the process's own leak checks.
 *
 * Client-library calls run with this thread's faults enabled (CL): in fault_client the library is
 * linked statically and wrapped, so they are the calls under test; in fault_daemon it is the
 * shared library, whose calls are never wrapped. Everything else the test does is exempt.
 */
#ifndef CONVD_TEST_FAULT_SCENARIO_H
#define CONVD_TEST_FAULT_SCENARIO_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define WAIT_MS 60000 /* bound on any wait: a request still in flight after this was lost */

/* What a scenario saw. `lost` and `wrong` are fatal; the others say how far a fault reached. */
struct outcome {
    int lost;      /* requests that never completed */
    int wrong;     /* requests that succeeded with a wrong output */
    int failed;    /* calls or requests that failed with a status */
    int completed; /* requests that succeeded */
    char what[256];
};

/* Three clients against the daemon at sock: one with rings (three requests in one region, then
 * status, metrics and an orderly close), one without (the blocking convd_conv), and one that
 * leaves with a request in flight. Each stops at its first failure and releases what it holds. */
void scenario(const char *sock, uint64_t seed, struct outcome *o);

/* Connects (retrying while a paused listener catches up), waits until this is the daemon's only
 * client and no region or request remains, then runs the ring client and requires all three
 * requests to match the reference. Fails the test with label otherwise. */
void check_serving(const char *sock, uint64_t seed, const char *label);

/* Runs the scenario with nothing armed and returns how often it called wrapped call id; fails
 * the test unless everything in it succeeded. */
long scenario_count_calls(const char *sock, uint64_t seed, int id);

/* Open descriptors of process pid (0: this process), and this process's memfd mappings.
 * count_fds() also remembers what each descriptor points to, so that check_no_leaks() can name
 * the descriptors that are new since. */
int count_fds_of(pid_t pid);
int count_fds(void);
/* fault_gpu: descriptors on /dev/nvidia* nodes are the CUDA driver's, kept for the process's
 * context after a daemon is gone; they are listed in a leak report but not counted. */
extern bool fds_skip_gpu_nodes;
int count_memfd_maps(void);

/* Fails the test unless descriptors and memfd mappings are back at fds and maps, and (ASan
 * builds) LeakSanitizer finds nothing. */
void check_no_leaks(int fds, int maps, const char *label);

/* The i-th of at most cap evenly spaced call numbers in 1..calls. */
long nth_call(long i, long calls, long cap);

/* Runs per call at most: $CONVD_FAULT_MAX, default 120. */
long runs_cap(void);

#endif
