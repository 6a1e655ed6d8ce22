// Which CUDA or NVML step leaves a descriptor behind: prints this process's descriptors (the
// driver's /dev/nvidia* nodes aside) after each step of three set-up and tear-down cycles like
// backends/gpu.hip's. On the GPU machine (driver 580) every nvmlInit/nvmlShutdown pair left an
// eventfd open, which is why the backend initialises NVML once per process.
//
//   nvcc -O1 -o fdprobe scripts/fdprobe.cu -ldl && ./fdprobe
#include <cuda_runtime.h>
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static void show(const char *step)
{
    DIR *d = opendir("/proc/self/fd");
    char path[64], t[256], list[4096] = "";
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(path, t, sizeof t - 1);
        t[len > 0 ? len : 0] = 0;
        if (strncmp(t, "/dev/nvidia", 11) == 0) continue;
        if (strstr(t, "anon_inode") || strstr(t, "pipe") || strstr(t, "socket")) {
            size_t l = strlen(list);
            snprintf(list + l, sizeof list - l, " %s:%s", e->d_name, t);
        }
        n++;
    }
    closedir(d);
    printf("%-28s %2d fds;%s\n", step, n, list);
}
static void CUDART_CB hostfn(void *arg) { (void)arg; }
int main(void)
{
    show("start");
    for (int cycle = 0; cycle < 3; cycle++) {
        printf("-- cycle %d\n", cycle);
        cudaSetDevice(0); show("setdevice");
        size_t f, t; cudaMemGetInfo(&f, &t); show("context");
        cudaStream_t s[4]; cudaEvent_t ev[4];
        for (int i = 0; i < 4; i++) cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking);
        show("streams");
        for (int i = 0; i < 4; i++) cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming);
        show("events");
        void *p; cudaMalloc(&p, 1 << 20); show("malloc");
        for (int i = 0; i < 4; i++) cudaLaunchHostFunc(s[i], hostfn, NULL);
        for (int i = 0; i < 4; i++) cudaStreamSynchronize(s[i]);
        show("hostfunc");
        void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
        int (*init)(void) = h ? (int (*)(void))dlsym(h, "nvmlInit_v2") : NULL;
        int (*shut)(void) = h ? (int (*)(void))dlsym(h, "nvmlShutdown") : NULL;
        if (init) { init(); show("nvmlInit"); shut(); show("nvmlShutdown"); }
        if (h) { dlclose(h); show("dlclose nvml"); }
        cudaFree(p);
        for (int i = 0; i < 4; i++) { cudaStreamDestroy(s[i]); cudaEventDestroy(ev[i]); }
        show("destroyed");
    }
    return 0;
}
