/*
 * GPU memory for convctl bench --memory gpu, through the CUDA runtime loaded at run time: convctl
 * does not link CUDA, so that one binary runs on machines with and without it.
 *
 * gpumem_open() dlopens libcudart ($CONVD_CUDART if set, else libcudart.so, libcudart.so.13,
 * libcudart.so.12) and resolves the few functions used here; it does not initialise CUDA, so a
 * process may open the runtime and then fork children that use it. Every other call initialises
 * CUDA in the calling process. Each function returns 0, or -1 with a sentence in why that names
 * the library that could not be loaded or the call that failed and cudaGetErrorString's text.
 */
#ifndef CONVD_CONVCTL_GPUMEM_H
#define CONVD_CONVCTL_GPUMEM_H

#include <stddef.h>

#define GPUMEM_IPC_HANDLE_SIZE 64

/* Loads the runtime (once per process; later calls return at once). */
int gpumem_open(char *why, size_t why_len);

/* cudaSetDevice(device): call first in each process that uses the GPU. */
int gpumem_set_device(int device, char *why, size_t why_len);

/* cudaMalloc(size) and a copy of host[0..size) into it; *ret_dev is the allocation's base. */
int gpumem_alloc_upload(const void *host, size_t size, void **ret_dev, char *why, size_t why_len);

/* cudaIpcGetMemHandle for an allocation's base: GPUMEM_IPC_HANDLE_SIZE bytes into handle. */
int gpumem_ipc_handle(void *dev, unsigned char handle[GPUMEM_IPC_HANDLE_SIZE], char *why,
                      size_t why_len);

/* cudaFree. Accepts NULL. */
int gpumem_free(void *dev, char *why, size_t why_len);

#endif
