/*
 * The kernels' in-process API, private to this project (never installed): the CPU
 * implementation, always built (convd_cpu, the reference every GPU kernel is tested against), and
 * the GPU kernels, declared always and defined only in convd_gpu, which exists when the project is
 * built with CONVD_GPU=nvidia or amd (CONVD_HAVE_GPU is then defined for code that links it).
 * The daemon's backends, the tests, the benchmarks and convctl's verify link them statically.
 */
#ifndef CONVD_KERNELS_H
#define CONVD_KERNELS_H

#include "convd/conv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Pointers to the four tensors of one problem. bias may be NULL only when the problem has no bias.
 * Which memory they point into (host or device) depends on the function they are given to. */
struct convd_tensors {
    const void *input;
    const void *weight;
    const void *bias;
    void *output;
};

/*
 * CPU implementation. Always built; it is the reference every GPU kernel is tested against.
 * Runs the problem on host memory using up to `threads` threads (0: one per online CPU; 1: on the
 * calling thread only). Returns 0, or what convd_problem_check() returns. Thread-safe: concurrent
 * calls on different outputs are fine.
 */
int convd_cpu_conv(const struct convd_problem *p, const struct convd_tensors *t, int threads);

/*
 * GPU kernels (convd_gpu). Pointers are device pointers. `stream` is a hipStream_t (cudaStream_t
 * on NVIDIA); NULL is the default stream. The functions are asynchronous with respect to the
 * host, like a kernel launch.
 */

/* Returns 0 when this build's kernels can run on GPU `device` (and makes it current), else
 * CONVD_EUNSUPPORTED for a device older than sm_80 or one the binary has no code for, or
 * CONVD_EDEVICE, with a sentence naming the device, its architecture and the build option in
 * why. */
int convd_gpu_device_check(int device, char *why, size_t why_len);

/* Returns 0 when the GPU kernels run this problem, else CONVD_EUNSUPPORTED (or the problem's
 * check error) with the reason in why. */
int convd_gpu_check(const struct convd_problem *p, char *why, size_t why_len);

/* Device workspace, in bytes, that convd_gpu_conv() needs to run `count` problems of this
 * geometry in one call (0 is a valid answer). */
int convd_gpu_workspace(const struct convd_problem *p, size_t count, size_t *ret_bytes);

/* Runs `count` problems of identical geometry, t[i] holding the tensors of the i-th, in as few
 * launches as the kernels allow. workspace must hold convd_gpu_workspace(p, count) bytes of
 * device memory (it may be NULL when that is 0). Returns 0 once the work is queued on `stream`,
 * CONVD_EUNSUPPORTED / CONVD_EBADSHAPE for a problem it cannot run, CONVD_EDEVICE when a launch
 * fails. */
int convd_gpu_conv(const struct convd_problem *p, const struct convd_tensors *t, size_t count,
                   void *workspace, size_t workspace_bytes, void *stream);

/* Name of the kernel family convd_gpu_conv() routes this problem to ("depthwise", "smallcpg",
 * "mma", ...), for benchmarks and logs. Static string; "none" when unsupported. */
const char *convd_gpu_kernel_name(const struct convd_problem *p);

#ifdef __cplusplus
}
#endif

#endif
