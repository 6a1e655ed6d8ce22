/*
 * What the tensor-core family's kernels (conv_mma.hip) and its planner (mma_plan.hip) share: the
 * warp layouts the kernels are instantiated for, and the tensor-map helpers. Private to
 * kernels/gpu.
 */
#ifndef CONVD_GPU_CONV_MMA_H
#define CONVD_GPU_CONV_MMA_H

#include "gpu_internal.h"

#if defined(CONVD_GPU_NVIDIA)
#include <cuda.h> /* CUtensorMap and cuTensorMapEncodeTiled's types (the entry point is looked up) */
#endif

/* The warp layouts: MT x NT mma tiles per warp, WM x WN warps per block; gpu_mma_plan.cfg indexes
 * this table, and gpu_mma_launch instantiates one kernel per entry. */
struct mma_cfg {
    int mt, nt, wm, wn;
};
#define MMA_NCFG 7
#if defined(CONVD_GPU_NVIDIA)
static const struct mma_cfg mma_cfgs[] = {
    {7, 1, 1, 8}, {7, 1, 1, 4}, {7, 2, 1, 4}, {7, 3, 1, 2},
    {4, 4, 2, 2}, {2, 4, 2, 2}, {4, 5, 2, 2},
};
static_assert(sizeof(mma_cfgs) / sizeof(mma_cfgs[0]) == MMA_NCFG, "MMA_NCFG counts mma_cfgs");
#endif

#if defined(CONVD_GPU_NVIDIA)
/* cuTensorMapEncodeTiled, looked up once through the runtime (no link against the driver); NULL
 * when the driver lacks it, and then no tensor-copy kernel is planned. */
typedef CUresult (*mma_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                  const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                  const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                  CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
mma_encode_fn mma_encoder(void);

/* The bits of (offset >> 3) that the tensor map's swizzle XORs into an offset's 16-byte unit,
 * for rows of `row` bytes (mma_map's choice): 0 where rows stay plain. */
int mma_swizzle_mask(int row);
#endif

#endif
