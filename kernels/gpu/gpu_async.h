/*
 * The asynchronous-copy and tensor-core primitives the kernels share, one inline wrapper per PTX
 * instruction: cp.async (sm_80), ldmatrix and mma.sync (sm_80), mbarriers, tensor copies and L2
 * prefetches (sm_90). Each compiles to nothing, or to a plain load and store, where the target
 * lacks the instruction, so that every family builds for every architecture; the planners keep
 * kernels that need one off devices without it. Included by gpu_internal.h.
 */
#ifndef CONVD_GPU_ASYNC_H
#define CONVD_GPU_ASYNC_H

#if defined(CONVD_GPU_NVIDIA)
#include <cuda.h> /* CUtensorMap */
#endif

/* ---- sm_80 asynchronous copies: global -> shared, zero-filled when !valid ---- */

#if defined(CONVD_GPU_NVIDIA)
GPU_D uint32_t gpu_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes to a shared-memory address (gpu_smem_addr). */
GPU_D void gpu_cp16_s(uint32_t dst, const void *src, bool valid)
{
#if defined(CONVD_DEVICE_SM80)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0));
#endif
}
#endif

/* Asynchronous copies global -> shared of 4 or 16 bytes, zero-filled when !valid (cp.async on
 * NVIDIA sm_80+; a plain load and store elsewhere), and the wait for all of a thread's copies. */
GPU_D void gpu_cp4(float *dst, const float *src, bool valid)
{
#if defined(CONVD_DEVICE_SM80)
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
                 "r"(valid ? 4 : 0));
#else
    *dst = valid ? *src : 0.0f;
#endif
}

GPU_D void gpu_cp16(void *dst, const void *src, bool valid)
{
#if defined(CONVD_DEVICE_SM80)
    gpu_cp16_s(gpu_smem_addr(dst), src, valid);
#else
    *(uint4 *)dst = valid ? *(const uint4 *)src : make_uint4(0, 0, 0, 0);
#endif
}

GPU_D void gpu_cp_wait_all()
{
#if defined(CONVD_DEVICE_SM80)
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::);
#endif
}

#if defined(CONVD_GPU_NVIDIA)
GPU_D void gpu_cp_commit()
{
#if defined(CONVD_DEVICE_SM80)
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N> GPU_D void gpu_cp_wait()
{
#if defined(CONVD_DEVICE_SM80)
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

GPU_D void gpu_ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3)
{
#if defined(CONVD_DEVICE_SM80)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
#endif
}

GPU_D void gpu_ldsm_x2(uint32_t addr, uint32_t &r0, uint32_t &r1)
{
#if defined(CONVD_DEVICE_SM80)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(addr));
#endif
}

/* ---- sm_90 tensor copies and mbarriers ---- */

GPU_D void gpu_mbar_init(uint32_t bar, int count)
{
#if defined(CONVD_DEVICE_SM90)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
#endif
}

/* Makes the initialised mbarriers visible to the tensor-copy unit (the async proxy). */
GPU_D void gpu_mbar_init_fence()
{
#if defined(CONVD_DEVICE_SM90)
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

/* Waits until the barrier's phase with parity `parity` has completed. */
GPU_D void gpu_mbar_wait(uint32_t bar, uint32_t parity)
{
#if defined(CONVD_DEVICE_SM90)
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "wait_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait_%=;\n"
                 "}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
#endif
}

/* One 4-D box (channels, columns, rows, images) from global memory into shared memory, its bytes
 * counted on `bar` (the caller's arrive announced them); coordinates outside the tensor read as
 * zero, which is the convolution's padding. */
GPU_D void gpu_tma_load4(uint32_t dst, const CUtensorMap *map, int c, int w, int h, int n,
                         uint32_t bar, uint32_t bytes)
{
#if defined(CONVD_DEVICE_SM90)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c), "r"(w), "r"(h), "r"(n), "r"(bar)
                 : "memory");
#endif
}

/* Hints that bring one 4-D box, or a byte range, into L2 without touching shared memory or any
 * register. Safe before griddepcontrol.wait even where the previous kernel writes that memory: L2
 * is the one coherent copy of global memory, so a line fetched early is updated in place by those
 * writes, and nothing of it reaches the SM before the wait. */
GPU_D void gpu_tma_prefetch4(const CUtensorMap *map, int c, int w, int h, int n)
{
#if defined(CONVD_DEVICE_SM90)
    asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\n" ::"l"(
                     (uint64_t)map),
                 "r"(c), "r"(w), "r"(h), "r"(n)
                 : "memory");
#endif
}

/* The whole 16-byte units inside [p, p + bytes). */
GPU_D void gpu_prefetch_l2(const void *p, size_t bytes)
{
#if defined(CONVD_DEVICE_SM90)
    const uint64_t b = ((uint64_t)p + 15) & ~(uint64_t)15,
                   e = ((uint64_t)p + bytes) & ~(uint64_t)15;
    for (uint64_t q = b; q < e; q += 1u << 20) {
        const uint32_t n = (uint32_t)(e - q < (1u << 20) ? e - q : (1u << 20));
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(q), "r"(n) : "memory");
    }
#endif
}

/* One 4-D box from shared memory to global memory; elements outside the tensor are dropped. */
GPU_D void gpu_tma_store4(const CUtensorMap *map, uint32_t src, int c, int w, int h, int n)
{
#if defined(CONVD_DEVICE_SM90)
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group"
                 " [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"((uint64_t)map),
                 "r"(src), "r"(c), "r"(w), "r"(h), "r"(n)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}

/* Waits until the bulk stores issued by this thread have read their shared memory (READ) or
 * have completed. */
template <bool READ> GPU_D void gpu_tma_store_wait()
{
#if defined(CONVD_DEVICE_SM90)
    if (READ)
        asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    else
        asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

/* Orders this thread's ordinary shared-memory writes before later tensor copies that read them. */
GPU_D void gpu_fence_async_smem()
{
#if defined(CONVD_DEVICE_SM90)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* fp32 rounded to TF32 (nearest, ties away: what cuBLAS and cuDNN do), low 13 bits zero. */
GPU_D float gpu_to_tf32(float v)
{
#if defined(CONVD_DEVICE_SM80)
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
    return __uint_as_float(r);
#else
    return v;
#endif
}

/* c += a * b on TF32 operands (gpu_to_tf32), one m16n8k8 tile, fp32 accumulation. */
GPU_D void gpu_mma_tf32(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
{
#if defined(CONVD_DEVICE_SM80)
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

template <class DT> struct gpu_mma_op;
template <> struct gpu_mma_op<dt_f16> {
    static GPU_D void run(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
    {
#if defined(CONVD_DEVICE_SM80)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
    }
};
template <> struct gpu_mma_op<dt_bf16> {
    static GPU_D void run(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
    {
#if defined(CONVD_DEVICE_SM80)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
    }
};
#endif /* CONVD_GPU_NVIDIA */

#endif
