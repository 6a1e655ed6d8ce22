/*
 * GPU runtime faults for fault_gpu.c: -Wl,--wrap wrappers of the CUDA runtime calls the GPU
 * backend makes, counted and failed through tests/fault's fault_take() with ids after the POSIX
 * set. A failed call returns the error a real failure of that call returns.
 *
 * Sticky mode models a lost context (an illegal address in a kernel): from the failed call on,
 * every wrapped call on a non-exempt thread fails with cudaErrorIllegalAddress, as the real
 * runtime does until the process exits.
 */
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "fault.h"
#include "fault_cuda.h"

static const char *const fc_names[FC_N] = {
#define FC_NAME(id, name, err) name,
    FAULT_CUDA_CALLS(FC_NAME)
#undef FC_NAME
};

static const cudaError_t fc_errors[FC_N] = {
#define FC_ERR(id, name, err) err,
    FAULT_CUDA_CALLS(FC_ERR)
#undef FC_ERR
};

static atomic_bool fc_sticky_armed; /* the next failure starts sticky mode */
static atomic_bool fc_sticky;       /* every call fails now */

const char *fault_cuda_name(int id)
{
    return id >= FC_FIRST && id < FC_FIRST + FC_N ? fc_names[id - FC_FIRST] : "?";
}

void fault_cuda_sticky(bool on)
{
    atomic_store(&fc_sticky_armed, on);
    if (!on)
        atomic_store(&fc_sticky, false);
}

bool fault_cuda_lost(void)
{
    return atomic_load(&fc_sticky);
}

/* cudaSuccess, or the error this call returns now. */
static cudaError_t fc_fail(int which)
{
    bool taken = fault_take(FC_FIRST + which);
    if (atomic_load(&fc_sticky) && !fault_exempt_now())
        return cudaErrorIllegalAddress;
    if (!taken)
        return cudaSuccess;
    if (atomic_load(&fc_sticky_armed)) {
        atomic_store(&fc_sticky, true);
        return cudaErrorIllegalAddress;
    }
    return fc_errors[which];
}

#define FC_WRAP(ret_type, name, id, params, args)                                                  \
    ret_type __real_##name params;                                                                 \
    ret_type __wrap_##name params;                                                                 \
    ret_type __wrap_##name params                                                                  \
    {                                                                                              \
        cudaError_t e = fc_fail(id);                                                               \
        return e != cudaSuccess ? e : __real_##name args;                                          \
    }

FC_WRAP(cudaError_t, cudaMalloc, FC_MALLOC, (void **p, size_t n), (p, n))
FC_WRAP(cudaError_t, cudaMemcpyAsync, FC_MEMCPY,
        (void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st),
        (d, s, n, k, st))
FC_WRAP(cudaError_t, cudaMemsetAsync, FC_MEMSET, (void *d, int v, size_t n, cudaStream_t st),
        (d, v, n, st))
FC_WRAP(cudaError_t, cudaHostRegister, FC_HOST_REGISTER, (void *p, size_t n, unsigned flags),
        (p, n, flags))
FC_WRAP(cudaError_t, cudaStreamCreateWithFlags, FC_STREAM_CREATE,
        (cudaStream_t * st, unsigned flags), (st, flags))
FC_WRAP(cudaError_t, cudaEventCreateWithFlags, FC_EVENT_CREATE, (cudaEvent_t * ev, unsigned flags),
        (ev, flags))
FC_WRAP(cudaError_t, cudaEventRecord, FC_EVENT_RECORD, (cudaEvent_t ev, cudaStream_t st), (ev, st))
FC_WRAP(cudaError_t, cudaEventQuery, FC_EVENT_QUERY, (cudaEvent_t ev), (ev))
FC_WRAP(cudaError_t, cudaStreamSynchronize, FC_STREAM_SYNC, (cudaStream_t st), (st))
FC_WRAP(cudaError_t, cudaLaunchHostFunc, FC_HOST_FUNC,
        (cudaStream_t st, cudaHostFn_t fn, void *arg), (st, fn, arg))
FC_WRAP(cudaError_t, cudaStreamQuery, FC_STREAM_QUERY, (cudaStream_t st), (st))

/* The backend writes its completion words through a driver entry point, which no linker wrap
 * reaches: the lookup is wrapped instead, and hands out this function around the driver's. The
 * runtime's codes are the driver's for the errors injected here. */
static PFN_cuStreamWriteValue32_v11070 fc_real_write_value;

static CUresult CUDAAPI fc_write_value(CUstream st, CUdeviceptr addr, cuuint32_t v, unsigned flags)
{
    cudaError_t e = fc_fail(FC_WRITE_VALUE);
    return e != cudaSuccess ? (CUresult)e : fc_real_write_value(st, addr, v, flags);
}

cudaError_t __real_cudaGetDriverEntryPointByVersion(const char *symbol, void **fn,
                                                    unsigned int version, unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *status);
cudaError_t __wrap_cudaGetDriverEntryPointByVersion(const char *symbol, void **fn,
                                                    unsigned int version, unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *status);
cudaError_t __wrap_cudaGetDriverEntryPointByVersion(const char *symbol, void **fn,
                                                    unsigned int version, unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *status)
{
    cudaError_t e = __real_cudaGetDriverEntryPointByVersion(symbol, fn, version, flags, status);
    if (e == cudaSuccess && *fn != NULL && strcmp(symbol, "cuStreamWriteValue32") == 0) {
        fc_real_write_value = (PFN_cuStreamWriteValue32_v11070)*fn;
        *fn = (void *)fc_write_value;
    }
    return e;
}
/* Kernel launches are checked with cudaGetLastError right after them: failing it is a failed
 * launch as the backend sees one. */
FC_WRAP(cudaError_t, cudaGetLastError, FC_LAST_ERROR, (void), ())
