/*
 * The kernels of kern_body.h for the baseline of the build target (SSE2 on x86-64): 4-float
 * vectors. Runs anywhere the library runs; the other variants are preferred when the CPU has
 * them.
 */
#include "conv_math.h"
#include "cpu_dtype.h"
#include "cpu_internal.h"

#define VL            4
#define KBMAX         4
#define PV_FOR_KB(kb) ((kb) == 1 ? 8 : (kb) == 2 ? 5 : (kb) == 3 ? 4 : 3)
#define KERN(x)       x##_generic
#define KERN_NAME     "generic"
#include "kern_body.h"

static int usable_generic(void)
{
    return 1;
}
