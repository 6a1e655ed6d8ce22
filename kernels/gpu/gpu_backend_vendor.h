/*
 * The runtime names that only the daemon's GPU backend uses (device selection, streams, events,
 * host callbacks, pinning, IPC), on top of vendor.h: under nvcc they map to CUDA like vendor.h's
 * own; under hipcc HIP defines them already. Each is guarded, so vendor.h may take any of them
 * over later.
 */
#ifndef CONVD_GPU_BACKEND_VENDOR_H
#define CONVD_GPU_BACKEND_VENDOR_H

#include "vendor.h"

#ifdef CONVD_GPU_NVIDIA
#ifndef hipErrorOutOfMemory
#define hipErrorOutOfMemory cudaErrorMemoryAllocation
#endif
#ifndef hipGetErrorName
#define hipGetErrorName cudaGetErrorName
#endif
#ifndef hipSetDevice
#define hipSetDevice cudaSetDevice
#endif
#ifndef hipDeviceProp_t
#define hipDeviceProp_t cudaDeviceProp
#endif
#ifndef hipGetDeviceProperties
#define hipGetDeviceProperties cudaGetDeviceProperties
#endif
#ifndef hipDeviceAttributeComputeMode
#define hipDeviceAttributeComputeMode cudaDevAttrComputeMode
#endif
#ifndef hipComputeModeProhibited
#define hipComputeModeProhibited cudaComputeModeProhibited
#endif
#ifndef hipMemGetInfo
#define hipMemGetInfo cudaMemGetInfo
#endif
#ifndef hipDeviceGetPCIBusId
#define hipDeviceGetPCIBusId cudaDeviceGetPCIBusId
#endif
#ifndef hipStreamCreateWithFlags
#define hipStreamCreateWithFlags cudaStreamCreateWithFlags
#endif
#ifndef hipStreamNonBlocking
#define hipStreamNonBlocking cudaStreamNonBlocking
#endif
#ifndef hipStreamDestroy
#define hipStreamDestroy cudaStreamDestroy
#endif
#ifndef hipMemsetAsync
#define hipMemsetAsync cudaMemsetAsync
#endif
#ifndef hipHostRegister
#define hipHostRegister cudaHostRegister
#endif
#ifndef hipHostUnregister
#define hipHostUnregister cudaHostUnregister
#endif
#ifndef hipHostRegisterDefault
#define hipHostRegisterDefault cudaHostRegisterDefault
#endif
#ifndef hipIpcMemHandle_t
#define hipIpcMemHandle_t cudaIpcMemHandle_t
#endif
#ifndef hipIpcOpenMemHandle
#define hipIpcOpenMemHandle cudaIpcOpenMemHandle
#endif
#ifndef hipIpcCloseMemHandle
#define hipIpcCloseMemHandle cudaIpcCloseMemHandle
#endif
#ifndef hipIpcMemLazyEnablePeerAccess
#define hipIpcMemLazyEnablePeerAccess cudaIpcMemLazyEnablePeerAccess
#endif
#ifndef hipErrorNotReady
#define hipErrorNotReady cudaErrorNotReady
#endif
#ifndef hipEventCreateWithFlags
#define hipEventCreateWithFlags cudaEventCreateWithFlags
#endif
#ifndef hipEventDisableTiming
#define hipEventDisableTiming cudaEventDisableTiming
#endif
#ifndef hipEventDestroy
#define hipEventDestroy cudaEventDestroy
#endif
#ifndef hipEventRecord
#define hipEventRecord cudaEventRecord
#endif
#ifndef hipEventQuery
#define hipEventQuery cudaEventQuery
#endif
#ifndef hipEventSynchronize
#define hipEventSynchronize cudaEventSynchronize
#endif
#ifndef hipLaunchHostFunc
#define hipLaunchHostFunc cudaLaunchHostFunc
#endif
#endif /* CONVD_GPU_NVIDIA */

#endif
