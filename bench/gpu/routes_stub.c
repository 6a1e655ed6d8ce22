/*
 * A CUDA runtime that describes an H200 and runs nothing, for convd-routes-host: the router and
 * the planners read device attributes, kernel attributes and the tensor-map encoder's presence,
 * and launch nothing, so linked against this instead of cudart they plan on a machine without a
 * GPU exactly as they would on one H200 (sm_90 code, 132 SMs). A route dump made so before and
 * after a routing change shows whether any choice moved; it says nothing about speed, and the
 * mma family's occupancy it reports is this file's estimate, not the device's.
 *
 * Built with STUB_LAUNCHES (convd-launch-host), launches and tensor-map encodes succeed and do
 * nothing, so the library's own host cost per call can be timed without a device.
 *
 * Development tool only: never linked into the daemon or the libraries.
 */
#include <stdint.h>
#include <string.h>

#include <cuda_runtime_api.h>

/* nvcc's registration hooks, run at start-up by every translation unit with kernels. */
static void *stub_handle[4];

void **__cudaRegisterFatBinary(void *fat)
{
    (void)fat;
    return stub_handle;
}

void __cudaRegisterFatBinaryEnd(void **handle)
{
    (void)handle;
}

void __cudaUnregisterFatBinary(void **handle)
{
    (void)handle;
}

void __cudaRegisterFunction(void **handle, const char *host_fun, char *device_fun,
                            const char *device_name, int thread_limit, void *tid, void *bid,
                            void *bdim, void *gdim, int *wsize)
{
    (void)handle, (void)host_fun, (void)device_fun, (void)device_name, (void)thread_limit;
    (void)tid, (void)bid, (void)bdim, (void)gdim, (void)wsize;
}

/* Launch paths: never taken by a route dump, refused if they were (accepted under
 * STUB_LAUNCHES). */
cudaError_t __cudaPopCallConfiguration(void *grid, void *block, size_t *smem, void *stream)
{
    (void)grid, (void)block, (void)smem, (void)stream;
    return cudaErrorNotSupported;
}

cudaError_t __cudaGetKernel(void *kernel, const void *fn)
{
    (void)kernel, (void)fn;
    return cudaErrorNotSupported;
}

cudaError_t __cudaLaunchKernel(void)
{
    return cudaErrorNotSupported;
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args)
{
    (void)config, (void)func, (void)args;
#ifdef STUB_LAUNCHES
    return cudaSuccess;
#else
    return cudaErrorNotSupported;
#endif
}

/* ---- the device ---- */

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    return device == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (device != 0)
        return cudaErrorInvalidDevice;
    switch (attr) {
    case cudaDevAttrMultiProcessorCount:
        *value = 132;
        return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
        *value = 232448;
        return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
        *value = 233472;
        return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
        *value = 9;
        return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
        *value = 0;
        return cudaSuccess;
    case cudaDevAttrClockRate:
        *value = 1980000;
        return cudaSuccess;
    case cudaDevAttrComputeMode:
        *value = cudaComputeModeDefault;
        return cudaSuccess;
    default:
        return cudaErrorInvalidValue;
    }
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (device != 0)
        return cudaErrorInvalidDevice;
    memset(prop, 0, sizeof(*prop));
    strcpy(prop->name, "NVIDIA H200 (stub runtime)");
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 132;
    return cudaSuccess;
}

cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func)
{
    (void)func;
    memset(attr, 0, sizeof(*attr));
    attr->ptxVersion = 90;
    attr->binaryVersion = 90;
    attr->maxThreadsPerBlock = 1024;
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    (void)func, (void)attr, (void)value;
    return cudaSuccess;
}

/* Blocks per SM by threads and shared memory alone (registers unknown here): an estimate, the
 * same before and after a change, which is all a route comparison needs. */
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, const void *func,
                                                          int threads, size_t smem)
{
    (void)func;
    int b = threads > 0 ? 2048 / threads : 1;
    const int by_smem = (int)(233472 / (smem + 1024));
    if (by_smem < b)
        b = by_smem;
    *blocks = b < 32 ? b : 32;
    return cudaSuccess;
}

/* cuTensorMapEncodeTiled: present (so tensor-copy plans are made), never called by planning. */
static int stub_encode(void)
{
#ifdef STUB_LAUNCHES
    return 0; /* CUDA_SUCCESS, the map left as it was */
#else
    return 1; /* CUDA_ERROR_INVALID_VALUE */
#endif
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status)
{
    (void)version, (void)flags;
    *fn = strcmp(symbol, "cuTensorMapEncodeTiled") == 0 ? (void *)stub_encode : NULL;
    if (status != NULL)
        *status = *fn != NULL ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *version)
{
    *version = 13000;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaSuccess ? "no error" : "not available in the stub runtime";
}

const char *cudaGetErrorName(cudaError_t e)
{
    return e == cudaSuccess ? "cudaSuccess" : "cudaErrorNotSupported";
}

/* ---- everything else the library references: refused ---- */

#define STUB_REFUSE(name, ...)                                                                     \
    cudaError_t name(__VA_ARGS__)                                                                  \
    {                                                                                              \
        return cudaErrorNotSupported;                                                              \
    }
STUB_REFUSE(cudaDeviceSynchronize, void)
STUB_REFUSE(cudaMalloc, void **p, size_t n)
STUB_REFUSE(cudaFree, void *p)
STUB_REFUSE(cudaMemcpy, void *d, const void *s, size_t n, enum cudaMemcpyKind k)
STUB_REFUSE(cudaMemcpyAsync, void *d, const void *s, size_t n, enum cudaMemcpyKind k,
            cudaStream_t st)
STUB_REFUSE(cudaMemset, void *d, int v, size_t n)
STUB_REFUSE(cudaMemsetAsync, void *d, int v, size_t n, cudaStream_t st)
STUB_REFUSE(cudaMemGetInfo, size_t *f, size_t *t)
STUB_REFUSE(cudaHostRegister, void *p, size_t n, unsigned int f)
STUB_REFUSE(cudaHostUnregister, void *p)
STUB_REFUSE(cudaIpcOpenMemHandle, void **p, cudaIpcMemHandle_t h, unsigned int f)
STUB_REFUSE(cudaIpcCloseMemHandle, void *p)
STUB_REFUSE(cudaDeviceGetPCIBusId, char *b, int n, int d)
STUB_REFUSE(cudaEventCreateWithFlags, cudaEvent_t *e, unsigned int f)
STUB_REFUSE(cudaEventDestroy, cudaEvent_t e)
STUB_REFUSE(cudaEventQuery, cudaEvent_t e)
STUB_REFUSE(cudaEventRecord, cudaEvent_t e, cudaStream_t s)
STUB_REFUSE(cudaEventSynchronize, cudaEvent_t e)
STUB_REFUSE(cudaLaunchHostFunc, cudaStream_t s, cudaHostFn_t f, void *u)
STUB_REFUSE(cudaStreamCreateWithFlags, cudaStream_t *s, unsigned int f)
STUB_REFUSE(cudaStreamDestroy, cudaStream_t s)
STUB_REFUSE(cudaStreamSynchronize, cudaStream_t s)
