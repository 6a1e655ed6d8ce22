/*
 * The convolution problem convd serves: its fields, validation and shape math, and the dtype
 * helpers. Everything declared here is exported by libconvd-client (convd.h includes this
 * header). The kernels themselves are not part of any installed library: their in-process API
 * (tests, benchmarks, the daemon's backends) is kernels/convd_kernels.h.
 *
 * The problem is a grouped 2-D forward convolution, as torch.nn.functional.conv2d computes it:
 *
 *   y[n, k, oh, ow] = bias[k] + sum over c' < C/G, r < R, s < S of
 *                     x[n, g*C/G + c', oh*stride_h - pad_top + r*dil_h, ow*stride_w - pad_left +
 * s*dil_w]
 *                     * w[k, c', r, s]                       where g = k / (K/G)
 *
 * then an activation (enum convd_activation). Input pixels outside the image read as zero. Shapes
 * and layouts:
 *
 *   layout NCHW: x (N, C, H, W), w (K, C/G, R, S), y (N, K, Ho, Wo)  (PyTorch's default)
 *   layout NHWC: x (N, H, W, C), w (K, R, S, C/G), y (N, Ho, Wo, K)  (channels last)
 *   bias: (K), same dtype as the tensors.
 *
 * All tensors are dense and in row-major order of the shapes above. Arithmetic accumulates in
 * fp32 whatever the dtype; fp16 and bf16 outputs are rounded to nearest even.
 */
#ifndef CONVD_CONV_H
#define CONVD_CONV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "convd/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum convd_dtype {
    CONVD_DTYPE_FP32 = 1,
    CONVD_DTYPE_FP16 = 2,
    CONVD_DTYPE_BF16 = 3,
};

enum convd_layout {
    CONVD_LAYOUT_NCHW = 1,
    CONVD_LAYOUT_NHWC = 2,
};

/* The function applied to each output after the bias, as PyTorch defines it. */
enum convd_activation {
    CONVD_ACT_NONE = 0,
    CONVD_ACT_RELU = 1,      /* max(0, y) */
    CONVD_ACT_CLAMP = 2,     /* min(max(y, act_min), act_max); ReLU6 is act_min 0, act_max 6 */
    CONVD_ACT_SILU = 3,      /* y * sigmoid(y), also called swish */
    CONVD_ACT_HARDSWISH = 4, /* y * min(max(y + 3, 0), 6) / 6 */
    CONVD_ACT_GELU = 5,      /* y/2 * (1 + erf(y / sqrt(2))) */
    CONVD_ACT_GELU_TANH = 6, /* y/2 * (1 + tanh(sqrt(2/pi) * (y + 0.044715 y^3))) */
};

/* Limits enforced by convd_problem_check(). */
#define CONVD_MAX_DIM          (1 << 24)           /* n, h, w, c, k, r, s, groups */
#define CONVD_MAX_STRIDE       (1 << 16)           /* stride and dilation */
#define CONVD_MAX_PAD          (1 << 16)           /* each of the four paddings */
#define CONVD_MAX_TENSOR_BYTES ((uint64_t)1 << 40) /* any one tensor */

/* One convolution problem. Zero-initialise it and set every field; convd_problem_init() gives
 * stride 1, dilation 1, no padding, NCHW, fp32. */
struct convd_problem {
    int32_t n, h, w; /* batch, input height and width */
    int32_t c, k;    /* input and output channels; both multiples of groups */
    int32_t r, s;    /* filter height and width */
    int32_t groups;
    int32_t stride_h, stride_w;
    int32_t pad_top, pad_bottom, pad_left, pad_right;
    int32_t dil_h, dil_w;
    enum convd_dtype dtype;
    enum convd_layout layout;
    bool has_bias;   /* add bias[k] before the activation */
    bool allow_tf32; /* fp32 only: the GPU may multiply in TF32 (10-bit mantissa), as PyTorch does
                        by default; where it does not, and on the CPU, fp32 is exact */
    enum convd_activation activation; /* after the bias */
    float act_min, act_max;           /* CONVD_ACT_CLAMP's bounds; 0 for every other activation */
};

/* Sizes derived from a valid problem. Element counts and bytes per tensor, and the direct
 * convolution's FLOPs (2 per multiply-add, bias and activation not counted). */
struct convd_problem_sizes {
    int32_t out_h, out_w;
    uint64_t input_elems, weight_elems, bias_elems, output_elems;
    uint64_t input_bytes, weight_bytes, bias_bytes, output_bytes;
    uint64_t flops;
};

/* Fills *p with a 1x1, stride-1, unpadded, undilated, ungrouped fp32 NCHW problem of the given
 * sizes. A convenience for callers that then adjust a few fields. */
void convd_problem_init(struct convd_problem *p, int32_t n, int32_t h, int32_t w, int32_t c,
                        int32_t k, int32_t r, int32_t s, int32_t groups);

/* Checks a problem completely: every field in range, C and K divisible by groups, a filter that
 * fits the padded image, an output of at least one pixel, every size computation free of overflow
 * and under CONVD_MAX_TENSOR_BYTES, a known activation (clamp bounds not NaN and in order, zero
 * for the others). Returns 0, or CONVD_EBADSHAPE / CONVD_EGROUPS with a sentence
 * naming the bad field written to why (if why is not NULL; truncated to why_len). */
int convd_problem_check(const struct convd_problem *p, char *why, size_t why_len);

/* Checks the problem and computes its sizes. On failure returns what convd_problem_check()
 * returns and leaves *ret_sizes untouched. */
int convd_problem_sizes(const struct convd_problem *p, struct convd_problem_sizes *ret_sizes,
                        char *why, size_t why_len);

/* Output extent of one spatial dimension: floor((in + pads - dil*(k-1) - 1) / stride) + 1, or a
 * value <= 0 when the filter does not fit. Computed in 64 bits; no overflow for valid inputs. */
int64_t convd_out_dim(int64_t in, int64_t pad_lo, int64_t pad_hi, int64_t k, int64_t stride,
                      int64_t dil);

/* True when two problems have the same geometry, dtype, layout and epilogue, so they can run in
 * one batched launch. */
bool convd_problem_same(const struct convd_problem *a, const struct convd_problem *b);

/* Writes a one-line description ("n32 c128x56x56 k128 3x3 g32 s1 p1 d1 fp16 nhwc") into buf.
 * Returns buf. */
char *convd_problem_str(const struct convd_problem *p, char *buf, size_t len);

/* Name of an activation ("none", "relu", "clamp", "silu", "hardswish", "gelu", "gelu_tanh";
 * "unknown" otherwise) and its parser, which takes those names case-insensitively and also
 * "relu6" (clamp with bounds 0 and 6) and "swish" (silu). The parser sets p->activation and the
 * bounds (0 except for relu6) and returns 0, or CONVD_EINVAL for an unknown name. */
const char *convd_activation_name(enum convd_activation act);
int convd_activation_parse(const char *s, struct convd_problem *p);

/* Bytes per element of a dtype (4 or 2), 0 for an unknown value. */
size_t convd_dtype_size(enum convd_dtype dtype);

/* Names ("fp32", "fp16", "bf16"; "nchw", "nhwc") and their parsers. The parsers accept the names
 * case-insensitively (and "float32", "float16", "bfloat16", "half") and return 0 or
 * CONVD_EINVAL. Unknown values print as "unknown". */
const char *convd_dtype_name(enum convd_dtype dtype);
const char *convd_layout_name(enum convd_layout layout);
int convd_dtype_parse(const char *s, enum convd_dtype *ret_dtype);
int convd_layout_parse(const char *s, enum convd_layout *ret_layout);

/* Scalar conversions between fp32 and the 16-bit formats, round to nearest even, NaN kept NaN,
 * overflow to infinity (fp16). The bit patterns are IEEE binary16 and bfloat16. */
uint16_t convd_f32_to_f16(float f);
float convd_f16_to_f32(uint16_t h);
uint16_t convd_f32_to_bf16(float f);
float convd_bf16_to_f32(uint16_t b);

#ifdef __cplusplus
}
#endif

#endif
