/*
 * The kernels of kern_body.h for x86-64 with AVX2 and FMA: 8-float vectors, 16 vector
 * registers, so register blocks of up to 4 output channels x 3-8 vectors.
 */
#include "conv_math.h"
#include "cpu_dtype.h"
#include "cpu_internal.h"

#pragma GCC target("avx2,fma,f16c,bmi,bmi2")

#define VL            8
#define KBMAX         4
#define PV_FOR_KB(kb) ((kb) == 1 ? 8 : (kb) == 2 ? 5 : (kb) == 3 ? 4 : 3)
#define KERN(x)       x##_avx2
#define KERN_NAME     "avx2"
#include "kern_body.h"

static int usable_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
}
