/* GPU memory through a dlopened CUDA runtime; see gpumem.h. */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "why.h"

/* The few CUDA runtime types used here, declared as the runtime's ABI has them. */
typedef int cuda_error_t; /* cudaError_t; 0 is cudaSuccess */
/* cudaIpcMemHandle_t */
typedef struct {
    char reserved[GPUMEM_IPC_HANDLE_SIZE];
} cuda_ipc_mem_handle_t;
/* cudaMemcpyKind's cudaMemcpyHostToDevice */
enum { CUDA_MEMCPY_HOST_TO_DEVICE = 1 };

typedef cuda_error_t (*cuda_set_device_fn)(int device);
typedef cuda_error_t (*cuda_malloc_fn)(void **dev, size_t size);
typedef cuda_error_t (*cuda_memcpy_fn)(void *dst, const void *src, size_t count, int kind);
typedef cuda_error_t (*cuda_ipc_get_mem_handle_fn)(cuda_ipc_mem_handle_t *handle, void *dev);
typedef cuda_error_t (*cuda_free_fn)(void *dev);
typedef const char *(*cuda_get_error_string_fn)(cuda_error_t err);

static struct {
    void *lib;
    char name[256];
    cuda_set_device_fn set_device;
    cuda_malloc_fn malloc_;
    cuda_memcpy_fn memcpy_;
    cuda_ipc_get_mem_handle_fn ipc_get_mem_handle;
    cuda_free_fn free_;
    cuda_get_error_string_fn get_error_string;
} rt;

/* A failed runtime call as a sentence. */
static int gm_cuda_fail(cuda_error_t e, char *why, size_t len, const char *call)
{
    const char *s = rt.get_error_string != NULL ? rt.get_error_string(e) : NULL;
    return why_fail(why, len, -1, "%s failed: %s (CUDA error %d, runtime %s)", call,
                    s != NULL ? s : "no description", e, rt.name);
}

static void *gm_sym(const char *name, char *why, size_t len)
{
    dlerror();
    void *p = dlsym(rt.lib, name);
    if (p == NULL) {
        const char *e = dlerror();
        why_fail(why, len, -1, "the CUDA runtime %s has no %s: %s", rt.name, name,
                 e != NULL ? e : "symbol not found");
    }
    return p;
}

int gpumem_open(char *why, size_t why_len)
{
    if (rt.lib != NULL)
        return 0;
    static const char *const names[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12"};
    const char *env = getenv("CONVD_CUDART");
    char tried[768] = "";
    size_t n = 0;
    void *lib = NULL;
    const char *name = NULL;
    if (env != NULL && env[0] != '\0') {
        name = env;
        lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL) {
            const char *e = dlerror();
            return why_fail(why, why_len, -1,
                            "cannot load the CUDA runtime that CONVD_CUDART names: %s",
                            e != NULL ? e : env);
        }
    }
    for (size_t i = 0; lib == NULL && i < sizeof(names) / sizeof(names[0]); i++) {
        name = names[i];
        lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL) {
            const char *e = dlerror();
            n += (size_t)snprintf(tried + n, n < sizeof(tried) ? sizeof(tried) - n : 0, "%s%s",
                                  i > 0 ? "; " : "", e != NULL ? e : name);
        }
    }
    if (lib == NULL)
        return why_fail(why, why_len, -1,
                        "cannot load the CUDA runtime (%s); install it, add its directory to "
                        "LD_LIBRARY_PATH, or set CONVD_CUDART to its path",
                        tried);
    rt.lib = lib;
    snprintf(rt.name, sizeof(rt.name), "%s", name);
    /* On a missing symbol the library is closed again and rt left unopened. */
    void *s[6];
    static const char *const syms[6] = {"cudaGetErrorString", "cudaSetDevice",       "cudaMalloc",
                                        "cudaMemcpy",         "cudaIpcGetMemHandle", "cudaFree"};
    for (int i = 0; i < 6; i++) {
        if ((s[i] = gm_sym(syms[i], why, why_len)) == NULL) {
            dlclose(lib);
            memset(&rt, 0, sizeof(rt));
            return -1;
        }
    }
    /* POSIX guarantees that a dlsym result converts to a function pointer. */
    rt.get_error_string = (cuda_get_error_string_fn)s[0];
    rt.set_device = (cuda_set_device_fn)s[1];
    rt.malloc_ = (cuda_malloc_fn)s[2];
    rt.memcpy_ = (cuda_memcpy_fn)s[3];
    rt.ipc_get_mem_handle = (cuda_ipc_get_mem_handle_fn)s[4];
    rt.free_ = (cuda_free_fn)s[5];
    return 0;
}

int gpumem_set_device(int device, char *why, size_t why_len)
{
    if (gpumem_open(why, why_len) != 0)
        return -1;
    cuda_error_t e = rt.set_device(device);
    if (e != 0) {
        char call[48];
        snprintf(call, sizeof(call), "cudaSetDevice(%d)", device);
        return gm_cuda_fail(e, why, why_len, call);
    }
    return 0;
}

int gpumem_alloc_upload(const void *host, size_t size, void **ret_dev, char *why, size_t why_len)
{
    if (gpumem_open(why, why_len) != 0)
        return -1;
    void *dev = NULL;
    char call[64];
    cuda_error_t e = rt.malloc_(&dev, size);
    if (e != 0) {
        snprintf(call, sizeof(call), "cudaMalloc of %zu bytes", size);
        return gm_cuda_fail(e, why, why_len, call);
    }
    e = rt.memcpy_(dev, host, size, CUDA_MEMCPY_HOST_TO_DEVICE);
    if (e != 0) {
        snprintf(call, sizeof(call), "cudaMemcpy of %zu bytes to the GPU", size);
        gm_cuda_fail(e, why, why_len, call);
        rt.free_(dev);
        return -1;
    }
    *ret_dev = dev;
    return 0;
}

int gpumem_ipc_handle(void *dev, unsigned char handle[GPUMEM_IPC_HANDLE_SIZE], char *why,
                      size_t why_len)
{
    if (gpumem_open(why, why_len) != 0)
        return -1;
    cuda_ipc_mem_handle_t h;
    memset(&h, 0, sizeof(h));
    cuda_error_t e = rt.ipc_get_mem_handle(&h, dev);
    if (e != 0)
        return gm_cuda_fail(e, why, why_len, "cudaIpcGetMemHandle");
    memcpy(handle, h.reserved, GPUMEM_IPC_HANDLE_SIZE);
    return 0;
}

int gpumem_free(void *dev, char *why, size_t why_len)
{
    if (dev == NULL)
        return 0;
    if (gpumem_open(why, why_len) != 0)
        return -1;
    cuda_error_t e = rt.free_(dev);
    if (e != 0)
        return gm_cuda_fail(e, why, why_len, "cudaFree");
    return 0;
}
