/*
 * The CUDA runtime calls fault_cuda.c wraps, with the error each returns when failed. Ids start
 * after tests/fault's POSIX calls.
 */
#ifndef CONVD_TEST_FAULT_CUDA_H
#define CONVD_TEST_FAULT_CUDA_H

#include <stdbool.h>

#include "fault.h"

#define FAULT_CUDA_CALLS(X)                                                                        \
    X(MALLOC, "cudaMalloc", cudaErrorMemoryAllocation)                                             \
    X(MEMCPY, "cudaMemcpyAsync", cudaErrorInvalidValue)                                            \
    X(MEMSET, "cudaMemsetAsync", cudaErrorInvalidValue)                                            \
    X(HOST_REGISTER, "cudaHostRegister", cudaErrorMemoryAllocation)                                \
    X(STREAM_CREATE, "cudaStreamCreateWithFlags", cudaErrorMemoryAllocation)                       \
    X(EVENT_CREATE, "cudaEventCreateWithFlags", cudaErrorMemoryAllocation)                         \
    X(EVENT_RECORD, "cudaEventRecord", cudaErrorInvalidResourceHandle)                             \
    X(EVENT_QUERY, "cudaEventQuery", cudaErrorLaunchOutOfResources)                                \
    X(STREAM_SYNC, "cudaStreamSynchronize", cudaErrorLaunchOutOfResources)                         \
    X(HOST_FUNC, "cudaLaunchHostFunc", cudaErrorInvalidValue)                                      \
    X(STREAM_QUERY, "cudaStreamQuery", cudaErrorLaunchOutOfResources)                              \
    X(WRITE_VALUE, "cuStreamWriteValue32", cudaErrorInvalidValue)                                  \
    X(LAST_ERROR, "cudaGetLastError", cudaErrorLaunchOutOfResources)

#define FC_FIRST FAULT_N
enum {
#define FC_ENUM(id, name, err) FC_##id,
    FAULT_CUDA_CALLS(FC_ENUM)
#undef FC_ENUM
        FC_N
};

/* The name of id (FC_FIRST + FC_*). */
const char *fault_cuda_name(int id);

/* on: the next injected failure starts sticky mode (a lost context); off: ends it. */
void fault_cuda_sticky(bool on);

/* Whether sticky mode has started. */
bool fault_cuda_lost(void);

#endif
