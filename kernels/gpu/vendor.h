/*
 * The vendor layer: the HIP names the kernels use, mapped to CUDA when nvcc compiles them.
 *
 * Debian's HIP headers predate CUDA 13 and do not compile against it, so under nvcc this header
 * never includes a HIP header: it includes the CUDA runtime and defines the few hip* names the
 * project uses in terms of it. Under hipcc (CONVD_GPU=amd) it includes HIP itself. Everything
 * outside this header speaks HIP only, so the kernels and the dispatcher have one spelling.
 *
 * CONVD_GPU_NVIDIA / CONVD_GPU_AMD say which side the translation unit is on; device code that is
 * specific to an architecture (mma.sync, cp.async, ldmatrix) is additionally guarded by
 * CONVD_DEVICE_SM80 (NVIDIA, sm_80 or newer, device pass only).
 */
#ifndef CONVD_GPU_VENDOR_H
#define CONVD_GPU_VENDOR_H

#include <stdint.h>

#if defined(__CUDACC__) && !defined(__HIP_PLATFORM_AMD__)
#define CONVD_GPU_NVIDIA 1

#include <cuda_runtime.h>
#include <cuda_fp16.h>

typedef cudaStream_t hipStream_t;
typedef cudaError_t hipError_t;
typedef cudaEvent_t hipEvent_t;
typedef cudaFuncAttributes hipFuncAttributes;

#define hipSuccess                               cudaSuccess
#define hipGetLastError                          cudaGetLastError
#define hipGetErrorString                        cudaGetErrorString
#define hipGetDevice                             cudaGetDevice
#define hipSetDevice                             cudaSetDevice
#define hipGetDeviceCount                        cudaGetDeviceCount
#define hipDeviceGetAttribute                    cudaDeviceGetAttribute
#define hipDeviceAttributeMultiprocessorCount    cudaDevAttrMultiProcessorCount
#define hipDeviceAttributeComputeCapabilityMajor cudaDevAttrComputeCapabilityMajor
#define hipDeviceAttributeComputeCapabilityMinor cudaDevAttrComputeCapabilityMinor
#define hipDeviceAttributeClockRate              cudaDevAttrClockRate
#define hipFuncGetAttributes(attr, f)            cudaFuncGetAttributes(attr, (const void *)(f))
#define hipErrorInvalidDeviceFunction            cudaErrorInvalidDeviceFunction
#define hipDeviceAttributeSharedMemPerBlockOptin cudaDevAttrMaxSharedMemoryPerBlockOptin
#define hipDeviceAttributeMaxSharedMemoryPerMultiprocessor                                         \
    cudaDevAttrMaxSharedMemoryPerMultiprocessor
#define hipFuncSetAttribute(f, attr, v)            cudaFuncSetAttribute((const void *)(f), attr, v)
#define hipFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
#define hipOccupancyMaxActiveBlocksPerMultiprocessor(ret, f, threads, smem)                        \
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(ret, f, threads, smem)
#define hipMalloc               cudaMalloc
#define hipFree                 cudaFree
#define hipMemcpy               cudaMemcpy
#define hipMemcpyAsync          cudaMemcpyAsync
#define hipMemset               cudaMemset
#define hipMemcpyHostToDevice   cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost   cudaMemcpyDeviceToHost
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipDeviceSynchronize    cudaDeviceSynchronize
#define hipStreamSynchronize    cudaStreamSynchronize

/* The daemon's GPU backend: devices, streams, events, host callbacks, pinning, IPC. */
typedef cudaDeviceProp hipDeviceProp_t;
typedef cudaIpcMemHandle_t hipIpcMemHandle_t;
#define hipErrorOutOfMemory           cudaErrorMemoryAllocation
#define hipGetErrorName               cudaGetErrorName
#define hipGetDeviceProperties        cudaGetDeviceProperties
#define hipDeviceAttributeComputeMode cudaDevAttrComputeMode
#define hipComputeModeProhibited      cudaComputeModeProhibited
#define hipMemGetInfo                 cudaMemGetInfo
#define hipDeviceGetPCIBusId          cudaDeviceGetPCIBusId
#define hipStreamCreateWithFlags      cudaStreamCreateWithFlags
#define hipStreamNonBlocking          cudaStreamNonBlocking
#define hipStreamDestroy              cudaStreamDestroy
#define hipMemsetAsync                cudaMemsetAsync
#define hipHostRegister               cudaHostRegister
#define hipHostUnregister             cudaHostUnregister
#define hipHostRegisterMapped         cudaHostRegisterMapped
#define hipIpcOpenMemHandle           cudaIpcOpenMemHandle
#define hipIpcCloseMemHandle          cudaIpcCloseMemHandle
#define hipIpcMemLazyEnablePeerAccess cudaIpcMemLazyEnablePeerAccess
#define hipErrorNotReady              cudaErrorNotReady
#define hipEventCreate                cudaEventCreate
#define hipEventCreateWithFlags       cudaEventCreateWithFlags
#define hipEventElapsedTime           cudaEventElapsedTime
#define hipEventDisableTiming         cudaEventDisableTiming
#define hipEventDestroy               cudaEventDestroy
#define hipEventRecord                cudaEventRecord
#define hipEventQuery                 cudaEventQuery
#define hipEventSynchronize           cudaEventSynchronize
#define hipLaunchHostFunc             cudaLaunchHostFunc
#define hipStreamQuery                cudaStreamQuery
#define hipHostMalloc(p, size, flags) cudaHostAlloc(p, size, flags)
#define hipHostMallocMapped           cudaHostAllocMapped
#define hipHostMallocPortable         cudaHostAllocPortable
#define hipHostFree                   cudaFreeHost
#define hipHostGetDevicePointer       cudaHostGetDevicePointer
/* Stream priorities (stream_priority). */
#define hipStreamCreateWithPriority     cudaStreamCreateWithPriority
#define hipDeviceGetStreamPriorityRange cudaDeviceGetStreamPriorityRange
#define hipStreamGetPriority            cudaStreamGetPriority

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define CONVD_DEVICE_SM80 1
#endif
/* Threads an SM holds: 1536 on sm_86, sm_87 and sm_89, 2048 on sm_80 and sm_90. A
 * __launch_bounds__ minimum of blocks beyond it is a ptxas error, so kernels ask through
 * CONVD_MIN_BLOCKS, which lowers the minimum to what fits. */
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 860 || __CUDA_ARCH__ == 870 || __CUDA_ARCH__ == 890)
#define CONVD_SM_THREADS 1536
#endif
/* Hopper's tensor copies (cp.async.bulk.tensor) and transaction-counted mbarriers. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define CONVD_DEVICE_SM90 1
#endif

#else /* AMD through hipcc */
#define CONVD_GPU_AMD 1

#include <hip/hip_runtime.h>

#endif

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define CONVD_DEVICE_PASS 1
#endif

#ifndef CONVD_SM_THREADS
#define CONVD_SM_THREADS 2048
#endif
#define CONVD_MIN_BLOCKS(threads, n)                                                               \
    ((n) * (threads) <= CONVD_SM_THREADS ? (n) : CONVD_SM_THREADS / (threads))

/* The first statement of every kernel (see convd_launch): waits until the grids this one depends
 * on have completed and their memory is visible, then lets the next kernel in the stream start
 * launching. Nothing of the kernel's may touch global memory before it. In that order, a launch
 * runs at most one kernel ahead: with the trigger first, each kernel's waiting blocks released
 * the next one's, and kernels queued up resident and idle on the SMs the running one needed. A
 * no-op before sm_90, on AMD, and for a launch without the attribute. */
__device__ __forceinline__ void convd_grid_dependency(void)
{
#if defined(CONVD_DEVICE_SM90)
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/*
 * Checked runtime calls: every GPU runtime call in the library goes through this macro, which
 * returns CONVD_EDEVICE from the calling function on failure (the daemon never aborts on a
 * device error; it fails the request). The calling function must return int.
 */
#define CONVD_GPU_CHECK(call)                                                                      \
    do {                                                                                           \
        hipError_t convd_gpu_err_ = (call);                                                        \
        if (convd_gpu_err_ != hipSuccess)                                                          \
            return CONVD_EDEVICE;                                                                  \
    } while (0)

#endif
