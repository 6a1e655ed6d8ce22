/*
 * The kernels of kern_body.h for x86-64 with AVX-512 (F, BW, DQ, VL) and FMA: 16-float vectors,
 * 32 vector registers, so register blocks of up to 8 output channels x 3-8 vectors.
 */
#include "conv_math.h"
#include "cpu_dtype.h"
#include "cpu_internal.h"

#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,fma,f16c,bmi,bmi2")

#define VL            16
#define KBMAX         8
#define PV_FOR_KB(kb) ((kb) <= 2 ? 8 : (kb) == 3 ? 7 : (kb) == 4 ? 6 : (kb) <= 6 ? 4 : 3)
#define KERN(x)       x##_avx512
#define KERN_NAME     "avx512"
#include "kern_body.h"

static int usable_avx512(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
