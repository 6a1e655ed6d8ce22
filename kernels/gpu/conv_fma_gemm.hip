/*
 * Implicit GEMM on the FMA units: a grouped convolution is, per group, a GEMM of the outputs'
 * weights [kpg][K] (K = cpg * R * S, ordered tap-major: k = (r * S + s) * cpg + c) with the
 * input gathered for each output pixel, [K][pixels] (NCHW: one image's Ho*Wo pixels, NHWC: all
 * N*Ho*Wo):
 *
 *   y[pixel][g * kpg + j] = sum over k < K of w[g * kpg + j][k] * x(pixel, tap(k), g * cpg + c(k)).
 *
 * A block computes a tile of tch outputs x tpx pixels of one group (and image, for NCHW): each
 * K step of PW_KC elements is staged in shared memory as fp32, [k][pixel] and [k][output], and
 * every thread accumulates a 4 x 8 outer product per k from one 16-byte read of weights and two
 * of pixels. The direct FMA kernel (conv_fma.hip) walks a halo window per tap and reads shared
 * memory once per 1-2 FMA; here it is 3 reads per 32 FMA, and NCHW needs no transposed copies.
 * It serves 1x1 convolutions with unit stride and no padding (the GEMM itself, any cpg, both
 * layouts) and, in NHWC, where tiles of outputs fill its threads (kpg >= PW_MIN_KPG) and channels
 * come in fours (cpg % 4 == 0), every other filter, stride, padding and dilation, when the
 * planner expects its tiles to use the GPU well (PW_MIN_EFF); the rest stays on the direct
 * kernel. NCHW problems with other filters run on the NHWC copies the router makes (input and
 * weights transposed) and leave through an NCHW epilogue; NCHW gathers for general filters (one
 * element per load) measured slower than the direct kernel on transposed copies and are not
 * built. NHWC weights are [K][R][S][cpg], already tap-major.
 *
 * TF32 (fp32 problems that allow it, NVIDIA sm_80 and later): the same tiles, loaders and
 * epilogue, operands rounded to TF32 as they are staged, and each warp multiplies a 32 x 32 part
 * of the tile on the tensor cores (mma m16n8k8) instead of each thread a 4 x 8 outer product;
 * the accumulators go through shared memory into the FMA path's layout for the epilogue.
 *
 * Split K (policy fma_split_k; NOTES round 23): where the tiles leave most SMs idle (the large-C
 * 1x1s of 7x7 and 14x14 images: 49 pixels, 16 blocks for 132 SMs, each walking all of K), ksplit
 * blocks share a tile, each a kchunk of K, and store their fp32 sums in the problem's workspace
 * ([ksplit][N*Ho*Wo][K]); pw_reduce_kernel adds them in split order (deterministic) and applies
 * the epilogue.
 */
#include "gpu_internal.h"

#define PW_TC      4  /* outputs per thread */
#define PW_TP      8  /* pixels per thread: two runs of 4, half a tile apart */
#define PW_KC      16 /* K elements per shared-memory step */
#define PW_U       16 /* staged elements per thread and operand: PW_KC * 128 / 128 threads */
#define PW_UV      4  /* the same in 4-element vectors */
#define PW_MIN_KPG 24 /* smallest kpg that takes the GEMM for filters other than 1x1 */
/* Least useful fraction of tile work x waves for general filters (fma_gemm 1): the point below
 * which the direct kernel won in `--sweep-fma` (bench/gpu/NOTES.md, "fma"). */
#define PW_MIN_EFF 0.6
/* TF32 tiles: warps of 32 outputs x 32 pixels, 128 to 256 threads. */
#define PW_TF32_WARP 32
/* Split K: at most this many splits, each at least PW_SPLIT_STEPS K steps. */
#define PW_MAX_SPLIT   16
#define PW_SPLIT_STEPS 4
/* ...and only where the grid would leave at least this many block slots a block. */
#define PW_SPLIT_MIN_FILL 4

static int pw_is_pointwise(const struct convd_problem *p)
{
    return p->r == 1 && p->s == 1 && p->stride_h == 1 && p->stride_w == 1 && p->pad_top == 0 &&
           p->pad_bottom == 0 && p->pad_left == 0 && p->pad_right == 0;
}

static int pw_shape_ok(const struct convd_problem *p)
{
    if (p->groups < 1)
        return 0;
    const int64_t cpg = p->c / p->groups, kpg = p->k / p->groups;
    return pw_is_pointwise(p) ||
           (p->layout == CONVD_LAYOUT_NHWC && cpg % 4 == 0 && kpg >= PW_MIN_KPG);
}

int gpu_pw_applies(const struct convd_problem *p, const struct convd_gpu_policy *pol)
{
    return pol->fma_gemm != 0 && pw_shape_ok(p);
}

/* v unchanged, but opaque to the compiler: what a loop derives from it is computed in the loop
 * instead of hoisted out and kept live through it, one register per use. */
static __device__ __forceinline__ int pw_opaque(int v)
{
#if defined(CONVD_GPU_NVIDIA)
    asm volatile("" : "+r"(v));
#endif
    return v;
}

/*
 * Grid: x over pixel tiles (NCHW: images x tiles of a plane), y over groups x output tiles,
 * z over problems. Threads: (tch / 4) x (tpx / 8), pixel-group fastest. NCHW output rows and
 * NHWC output pixels leave as 4-element runs where the sizes allow (vec_out), else elementwise.
 * Loaders (template): NHWC with VEC gathers 4 channels of one tap per load (cpg % 4 == 0, any
 * filter); the others serve pointwise problems only (NHWC: one channel per load; NCHW: one pixel,
 * or with VEC 4 pixels of a plane).
 */
template <class DT, int NHWC, int VEC, int TF32>
__global__ void __launch_bounds__(256, CONVD_MIN_BLOCKS(256, 2))
    pw_kernel(const struct gpu_geom g, const struct gpu_batch b, int tch, int tpx, int ctiles,
              int ptiles, int vec_out, int out_nchw, int ksplit, int kchunk)
{
    convd_grid_dependency();
    typedef typename DT::T T;
    extern __shared__ float pw_smem[];
    const int prob = (int)blockIdx.z / ksplit, ks = (int)blockIdx.z - prob * ksplit;
    const int grp = (int)blockIdx.y / ctiles, ct = (int)blockIdx.y - grp * ctiles;
    int pt = (int)blockIdx.x, n = 0;
    if (!NHWC) {
        n = pt / ptiles;
        pt -= n * ptiles;
    }
    const int howo = g.ho * g.wo, hw = g.h * g.w, rs = g.r * g.s, kdim = g.cpg * rs;
    /* This block's part of K (all of it without a split); kdim stays the weight rows' length. */
    const int kbeg = ks * kchunk, kend = min(kdim, kbeg + kchunk);
    const int npix = NHWC ? g.n * howo : howo; /* output pixels the tiles run over */
    const int p0 = pt * tpx, c0 = ct * tch;
    const int tid = (int)threadIdx.x, nthr = (int)blockDim.x;
    const int tpn = tpx / PW_TP, ti = tid / tpn, tj = tid - ti * tpn;
    const int xs = tpx + 4, ws = tch + 4; /* row pitches in floats (16-byte multiples) */
    float *xsm = pw_smem;                 /* [PW_KC][xs] */
    float *wsm = pw_smem + PW_KC * xs;    /* [PW_KC][ws] */
    const T *x = (const T *)b.x[prob];
    const T *w = (const T *)b.w[prob] + (size_t)grp * g.kpg * kdim;
    /* NCHW: this image's planes of the group; NHWC: the group's channels of pixel 0. */
    const T *xg = NHWC ? x + (size_t)grp * g.cpg : x + ((size_t)n * g.c + (size_t)grp * g.cpg) * hw;

    float acc[PW_TC][PW_TP];
#pragma unroll
    for (int i = 0; i < PW_TC; i++)
#pragma unroll
        for (int j = 0; j < PW_TP; j++)
            acc[i][j] = 0.0f;

    /* Staging registers: each K step's elements, at most PW_U (PW_UV vectors) per thread and
     * operand, loaded one step ahead so that step k + 1's loads are in flight while step k is
     * multiplied (loading straight into shared memory serialised a global-memory latency per
     * element row). A thread's elements are affine in u, and what a pixel needs (its image's
     * offset and window origin) is decoded once per tile: NCHW pixel p0 + tid, rows u; NHWC and
     * weights: k quad (or k) tid % 4 (16), rows tid / 4 (16) + u * nthr / 4 (16). Vector loads
     * keep the integer pipe from bounding the pointwise shapes. */
    const int lk = tid & (PW_KC - 1), lr = tid >> 4;
    int lstep = nthr >> 4;
    const int vk = tid & 3, vr = tid >> 2, vstep = nthr >> 2;
    const int qsh = VEC && !NHWC ? __ffs(tpx / 4) - 1 : 0; /* log2(quads per pixel row) */
    constexpr int NS = VEC && NHWC ? PW_UV : 1;
    int poff[NS], pih[NS], piw[NS]; /* NHWC gather: image offset, window origin per slot */
    if (VEC && NHWC)
#pragma unroll
        for (int u = 0; u < NS; u++) {
            const int j = vr + u * vstep, m = p0 + j;
            poff[u] = 0;
            pih[u] = -0x40000000; /* outside for every tap */
            piw[u] = 0;
            if (j < tpx && m < npix) {
                const int img = m / howo, rem = m - img * howo, oh = rem / g.wo;
                poff[u] = img * hw * g.c;
                pih[u] = oh * g.sh - g.pt;
                piw[u] = (rem - oh * g.wo) * g.sw - g.pl;
            }
        }
    /* The scalar loaders' slot u stages weight row lr + u * lstep and, in NHWC, pixel row
     * lr + u * lstep. Hoisted out of the K loop, the 16 slots' conditions and offsets outlived
     * the registers (ptxas spilled 8 to 28 bytes): the NCHW FMA loader tests a slot's weight row
     * against a count (nwl: slots whose row is inside the tile and kpg), the NHWC ones recompute
     * what they derive from lstep every step (pw_opaque). */
    constexpr bool WCOUNT = !NHWC && !VEC && !TF32;
    int nwl = 0;
    if constexpr (WCOUNT)
        nwl = (min(tch, g.kpg - c0) - lr + lstep - 1) / lstep;
    float vx[VEC ? PW_UV : 1][4], vw[VEC ? PW_UV : 1][4];
    float sx[VEC ? 1 : PW_U], sw[VEC ? 1 : PW_U];
    auto load = [&](int k0) {
        if (VEC) {
            /* This thread's k quad: 4 channels of one tap (cpg % 4 == 0). */
            const int kq = k0 + vk * 4, tap = kq / g.cpg, c = kq - tap * g.cpg;
            const int r = tap / g.s, dr = r * g.dh, ds = (tap - r * g.s) * g.dw;
            const bool kok = kq < kend;
#pragma unroll
            for (int u = 0; u < PW_UV; u++) {
                if (NHWC) {
                    const int ih = pih[u] + dr, iw = piw[u] + ds;
                    const bool ok = kok && convd_math_inside(ih, g.h) && convd_math_inside(iw, g.w);
                    gpu_load4<DT>(xg + (ok ? poff[u] + (ih * g.w + iw) * g.c + c : 0), ok, vx[u]);
                } else {
                    const int e = tid + u * nthr, row = e >> qsh, q = e - (row << qsh);
                    const int k = k0 + row, pix = p0 + q * 4;
                    const bool ok = row < PW_KC && k < kend && pix < npix;
                    gpu_load4<DT>(xg + (ok ? k * hw + pix : 0), ok, vx[u]);
                }
                /* Weights: NHWC [kpg][R][S][cpg] is tap-major like k; pointwise NCHW too. */
                const int i = vr + u * vstep;
                const bool ok = i < tch && c0 + i < g.kpg && kok;
                gpu_load4<DT>(w + (ok ? (c0 + i) * kdim + kq : 0), ok, vw[u]);
            }
        } else {
            /* Pointwise: k is the channel. Weights k = k0 + lk for every slot, NCHW pixels k0 + u.
             */
            const int kw = k0 + lk;
#pragma unroll
            for (int u = 0; u < PW_U; u++) {
                if (NHWC) {
                    const int j = lr + u * lstep, k = k0 + lk;
                    const bool ok = j < tpx && k < kend && p0 + j < npix;
                    /* 32-bit offsets: tensors have fewer than 2^31 elements. */
                    sx[u] = ok ? DT::load(xg[(p0 + j) * g.c + k]) : 0.0f;
                } else {
                    const int k = k0 + u, pix = p0 + tid;
                    const bool ok = u < PW_KC && tid < tpx && k < kend && pix < npix;
                    sx[u] = ok ? DT::load(xg[k * hw + pix]) : 0.0f;
                }
                const int i = lr + u * lstep;
                bool ok;
                if constexpr (WCOUNT)
                    ok = u < nwl && kw < kend;
                else
                    ok = i < tch && c0 + i < g.kpg && kw < kend;
                sw[u] = ok ? DT::load(w[(c0 + i) * kdim + kw]) : 0.0f;
            }
        }
    };
    /* TF32 rounds once, as each element is staged, not per fragment read. */
    auto cv = [](float v) {
#if defined(CONVD_GPU_NVIDIA)
        return TF32 ? gpu_to_tf32(v) : v;
#else
        return v;
#endif
    };
    auto store = [&]() {
        if (VEC) {
#pragma unroll
            for (int u = 0; u < PW_UV; u++) {
                if (NHWC) {
                    const int j = vr + u * vstep;
                    if (j < tpx)
#pragma unroll
                        for (int t = 0; t < 4; t++)
                            xsm[(vk * 4 + t) * xs + j] = cv(vx[u][t]);
                } else {
                    const int e = tid + u * nthr, row = e >> qsh, q = e - (row << qsh);
                    if (row < PW_KC)
                        *(float4 *)(xsm + row * xs + q * 4) =
                            make_float4(cv(vx[u][0]), cv(vx[u][1]), cv(vx[u][2]), cv(vx[u][3]));
                }
                const int i = vr + u * vstep;
                if (i < tch)
#pragma unroll
                    for (int t = 0; t < 4; t++)
                        wsm[(vk * 4 + t) * ws + i] = cv(vw[u][t]);
            }
        } else {
#pragma unroll
            for (int u = 0; u < PW_U; u++) {
                if (NHWC) {
                    const int j = lr + u * lstep;
                    if (j < tpx)
                        xsm[lk * xs + j] = cv(sx[u]);
                } else if (u < PW_KC && tid < tpx) {
                    xsm[u * xs + tid] = cv(sx[u]);
                }
                const int i = lr + u * lstep;
                if (i < tch)
                    wsm[lk * ws + i] = cv(sw[u]);
            }
        }
    };

    /* TF32: this warp's 32 x 32 part of the tile, (wm, wn) in units of 32, as 2 x 4 mma tiles
     * of 16 outputs x 8 pixels; lane (lg, lt) holds fragment rows lg, lg + 8 and columns lt,
     * lt + 4 (k) or 2 lt, 2 lt + 1 (pixels). Rows of xs and ws are 4 mod 32 floats apart, so the
     * fragment reads hit 32 banks. */
    float d[TF32 ? 2 : 1][TF32 ? 4 : 1][4];
    const int mw = TF32 ? tch / PW_TF32_WARP : 1, wm = (tid >> 5) % mw, wn = (tid >> 5) / mw;
    const int lg = (tid & 31) >> 2, lt = tid & 3;
    if (TF32)
#pragma unroll
        for (int mt = 0; mt < (TF32 ? 2 : 1); mt++)
#pragma unroll
            for (int nt = 0; nt < (TF32 ? 4 : 1); nt++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    d[mt][nt][i] = 0.0f;

    load(kbeg);
    for (int k0 = kbeg; k0 < kend; k0 += PW_KC) {
        if constexpr (NHWC && !VEC)
            lstep = pw_opaque(lstep);
        store();
        __syncthreads();
        if (k0 + PW_KC < kend)
            load(k0 + PW_KC);
#if defined(CONVD_GPU_NVIDIA)
        if constexpr (TF32) {
            /* Rows past kdim were staged as zeros: both k8 halves always run. */
            const float *wa = wsm + wm * PW_TF32_WARP + lg, *xb = xsm + wn * PW_TF32_WARP + lg;
#pragma unroll
            for (int k8 = 0; k8 < PW_KC; k8 += 8) {
                const float *w0 = wa + (k8 + lt) * ws, *w1 = w0 + 4 * ws;
                const float *x0 = xb + (k8 + lt) * xs, *x1 = x0 + 4 * xs;
                uint32_t a[2][4], bb[4][2];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    a[mt][0] = __float_as_uint(w0[mt * 16]);
                    a[mt][1] = __float_as_uint(w0[mt * 16 + 8]);
                    a[mt][2] = __float_as_uint(w1[mt * 16]);
                    a[mt][3] = __float_as_uint(w1[mt * 16 + 8]);
                }
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    bb[nt][0] = __float_as_uint(x0[nt * 8]);
                    bb[nt][1] = __float_as_uint(x1[nt * 8]);
                }
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int nt = 0; nt < 4; nt++)
                        gpu_mma_tf32(d[mt][nt], a[mt], bb[nt][0], bb[nt][1]);
            }
            __syncthreads();
            continue;
        }
#endif
        const int kn = min(PW_KC, kend - k0);
        const float *wr = wsm + ti * PW_TC, *xr = xsm + tj * 4;
#pragma unroll 4
        for (int kk = 0; kk < kn; kk++) {
            const float4 a = *(const float4 *)(wr + kk * ws);
            const float4 b0 = *(const float4 *)(xr + kk * xs);
            const float4 b1 = *(const float4 *)(xr + kk * xs + tpx / 2);
            const float av[4] = {a.x, a.y, a.z, a.w};
            const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < PW_TC; i++)
#pragma unroll
                for (int j = 0; j < PW_TP; j++)
                    acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }

    if (TF32) {
        /* The warps' fragments into shared memory ([output][pixel], rows tpx + 4 apart; the last
         * K step's barrier freed it), then each thread's 4 x 8 of the FMA layout out of it. */
        const int sp = tpx + 4;
#pragma unroll
        for (int mt = 0; mt < (TF32 ? 2 : 1); mt++)
#pragma unroll
            for (int nt = 0; nt < (TF32 ? 4 : 1); nt++) {
                const int m = wm * PW_TF32_WARP + mt * 16 + lg;
                const int n = wn * PW_TF32_WARP + nt * 8 + 2 * lt;
                *(float2 *)(pw_smem + m * sp + n) = make_float2(d[mt][nt][0], d[mt][nt][1]);
                *(float2 *)(pw_smem + (m + 8) * sp + n) = make_float2(d[mt][nt][2], d[mt][nt][3]);
            }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < PW_TC; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float4 v =
                    *(const float4 *)(pw_smem + (ti * PW_TC + i) * sp + tj * 4 + h * (tpx / 2));
                acc[i][h * 4] = v.x;
                acc[i][h * 4 + 1] = v.y;
                acc[i][h * 4 + 2] = v.z;
                acc[i][h * 4 + 3] = v.w;
            }
    }

    /* Epilogue. Pixels of the thread: p0 + tj * 4 + {0..3} and the same half a tile on. */
    const int ch0 = c0 + ti * PW_TC;
    if (ksplit > 1) {
        /* This split's sums, [pixel][K] over every image's pixels (NCHW: image n's from n * howo
         * on); pw_reduce_kernel does the rest. */
        float *part = (float *)b.ws[prob] + (size_t)ks * g.n * howo * g.k;
        const int pbase = NHWC ? 0 : n * howo;
#pragma unroll
        for (int j = 0; j < PW_TP; j++) {
            const int pix = p0 + tj * 4 + (j & 3) + (j >> 2) * (tpx / 2);
            if (pix >= npix)
                continue;
            float *pp = part + (size_t)(pbase + pix) * g.k + (size_t)grp * g.kpg + ch0;
#pragma unroll
            for (int i = 0; i < PW_TC; i++)
                if (ch0 + i < g.kpg)
                    pp[i] = acc[i][j];
        }
        return;
    }
    const T *bias = (const T *)b.b[prob];
    T *y = (T *)b.y[prob];
    float bv[PW_TC];
#pragma unroll
    for (int i = 0; i < PW_TC; i++)
        bv[i] = g.bias && ch0 + i < g.kpg ? DT::load(bias[grp * g.kpg + ch0 + i]) : 0.0f;
#pragma unroll
    for (int i = 0; i < PW_TC; i++)
#pragma unroll
        for (int j = 0; j < PW_TP; j++)
            acc[i][j] = gpu_epilogue(acc[i][j], bv[i], g);
    if (NHWC && out_nchw) {
        /* NHWC input (a transposed copy of an NCHW problem), NCHW output: per output channel,
         * two runs of 4 adjacent pixels, whole runs inside one image when its plane is a
         * multiple of 4 pixels (vec_out), else pixel by pixel. */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int pix = p0 + tj * 4 + h * (tpx / 2);
            if (pix >= npix)
                continue;
            const int img = pix / howo, rem = pix - img * howo;
            T *yp = y + ((size_t)img * g.k + (size_t)grp * g.kpg + ch0) * howo + rem;
#pragma unroll
            for (int i = 0; i < PW_TC; i++) {
                if (ch0 + i >= g.kpg)
                    break;
                if (vec_out && pix + 4 <= npix) {
                    gpu_store4<DT>(yp + (size_t)i * howo, &acc[i][h * 4]);
                } else {
                    int im = img, rm = rem;
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        if (pix + j >= npix)
                            break;
                        y[((size_t)im * g.k + (size_t)grp * g.kpg + ch0 + i) * howo + rm] =
                            DT::store(acc[i][h * 4 + j]);
                        if (++rm == howo) {
                            rm = 0;
                            im++;
                        }
                    }
                }
            }
        }
    } else if (NHWC) {
        /* Per pixel, the thread's 4 outputs are adjacent channels. */
#pragma unroll
        for (int j = 0; j < PW_TP; j++) {
            const int pix = p0 + tj * 4 + (j & 3) + (j >> 2) * (tpx / 2);
            if (pix >= npix)
                continue;
            T *yp = y + (size_t)pix * g.k + (size_t)grp * g.kpg + ch0;
            if (vec_out && ch0 + PW_TC <= g.kpg) {
                const float v[4] = {acc[0][j], acc[1][j], acc[2][j], acc[3][j]};
                gpu_store4<DT>(yp, v);
            } else {
#pragma unroll
                for (int i = 0; i < PW_TC; i++)
                    if (ch0 + i < g.kpg)
                        yp[i] = DT::store(acc[i][j]);
            }
        }
    } else {
        /* Per output channel, two runs of 4 adjacent pixels of its plane. */
#pragma unroll
        for (int i = 0; i < PW_TC; i++) {
            if (ch0 + i >= g.kpg)
                break;
            T *yp = y + ((size_t)n * g.k + (size_t)grp * g.kpg + ch0 + i) * npix;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int pix = p0 + tj * 4 + h * (tpx / 2);
                if (vec_out && pix + 4 <= npix) {
                    gpu_store4<DT>(yp + pix, &acc[i][h * 4]);
                } else {
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        if (pix + j < npix)
                            yp[pix + j] = DT::store(acc[i][h * 4 + j]);
                }
            }
        }
    }
}

/* Split K's second pass: one thread an output element, the splits' sums added in split order,
 * then bias and activation; elements in the output's order (NCHW: [n][K][HoWo]) so that the
 * stores coalesce. */
template <class DT>
__global__ void __launch_bounds__(256)
    pw_reduce_kernel(const struct gpu_geom g, const struct gpu_batch b, int ksplit, int nchw)
{
    convd_grid_dependency();
    typedef typename DT::T T;
    const int prob = (int)blockIdx.y, howo = g.ho * g.wo;
    const int64_t total = (int64_t)g.n * howo * g.k;
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total)
        return;
    int64_t pix;
    int k;
    if (nchw) {
        const int64_t img = e / ((int64_t)g.k * howo), rem = e - img * g.k * howo;
        k = (int)(rem / howo);
        pix = img * howo + (rem - (int64_t)k * howo);
    } else {
        pix = e / g.k;
        k = (int)(e - pix * g.k);
    }
    const float *part = (const float *)b.ws[prob] + pix * g.k + k;
    float s = 0.0f;
    for (int ks = 0; ks < ksplit; ks++)
        s += part[(int64_t)ks * total];
    const T *bias = (const T *)b.b[prob];
    const float bv = g.bias ? DT::load(bias[k]) : 0.0f;
    ((T *)b.y[prob])[e] = DT::store(gpu_epilogue(s, bv, g));
}

/*
 * Tile choice: tpx from a few multiples of 8, tch a multiple of 4 up to 128, threads
 * (tch / 4) * (tpx / 8) between 128 and 256 (so that PW_U staging registers hold a K step). Cost
 * model: waves of blocks (two per SM, as the launch bounds promise) times a block's time, which is
 * its tile's FMA plus its K-step loads (PW_LOAD_COST FMA-equivalents per staged element), so padded
 * tiles and a last partial wave both count.
 */
#define PW_LOAD_COST 8

/* TF32 tiles cost a quarter of the FMA path's per multiply (mma.sync TF32 against FFMA on the
 * H100 and H200: about 4x); the loads cost the same. */
#define PW_TF32_MATH 4

int gpu_pw_plan_make(const struct convd_problem *p, int out_nchw, int tf32,
                     const struct convd_gpu_policy *pol, size_t ws_avail, struct gpu_pw_plan *ret,
                     char *why, size_t why_len)
{
    struct gpu_device_info dev;
    const int have_dev = gpu_device_info_get(&dev) == 0;
    if (!have_dev)
        dev.sm_count = 132;
    if (tf32) {
#if defined(CONVD_GPU_NVIDIA)
        const int cc = have_dev ? dev.code_cc : 0;
#else
        const int cc = 0; /* no TF32 tensor-core kernel on AMD */
#endif
        if (p->dtype != CONVD_DTYPE_FP32 || !p->allow_tf32) {
            snprintf(why, why_len, "tf32 gemm: needs an fp32 problem that allows TF32");
            return CONVD_EUNSUPPORTED;
        }
        if (cc < 80) {
            snprintf(why, why_len, "tf32 gemm: needs NVIDIA tensor cores of sm_80 or later");
            return CONVD_EUNSUPPORTED;
        }
    }
    if (tf32 ? !pw_shape_ok(p) : !gpu_pw_applies(p, pol)) {
        snprintf(why, why_len,
                 "fma gemm: needs a 1x1 filter with unit stride and no padding, or cpg a "
                 "multiple of 4 and kpg >= %d",
                 PW_MIN_KPG);
        return CONVD_EUNSUPPORTED;
    }
    struct gpu_pw_plan pl;
    memset(&pl, 0, sizeof(pl));
    gpu_geom_from_problem(p, &pl.g);
    pl.dtype = p->dtype;
    pl.layout = p->layout;
    pl.out_nchw = out_nchw && p->layout == CONVD_LAYOUT_NHWC;
    const struct gpu_geom *g = &pl.g;
    const int nhwc = p->layout == CONVD_LAYOUT_NHWC;
    const int pointwise = pw_is_pointwise(p);
    const int64_t npix = nhwc ? (int64_t)g->n * g->ho * g->wo : (int64_t)g->ho * g->wo;
    static const int tpxs[] = {128, 112, 96, 64, 32};
    const int tch_step = tf32 ? PW_TF32_WARP : PW_TC;
    /* NCHW vector loads step through a tile's pixel rows by shifts: power-of-two tiles only. */
    const int pow2_only = !nhwc && pointwise && g->cpg % 4 == 0 && npix % 4 == 0;
    double best = -1.0;
    for (size_t a = 0; a < sizeof(tpxs) / sizeof(tpxs[0]); a++) {
        const int tpx = tpxs[a];
        if ((pow2_only && (tpx & (tpx - 1)) != 0) || (tf32 && tpx % PW_TF32_WARP != 0))
            continue;
        for (int tch = tch_step; tch <= 128; tch += tch_step) {
            const int threads = (tch / PW_TC) * (tpx / PW_TP);
            if (threads < 128 || threads > 256 || threads % 32 != 0)
                continue;
            const int64_t ptiles = (npix + tpx - 1) / tpx;
            const int64_t ctiles = (g->kpg + tch - 1) / tch;
            const int64_t blocks = ptiles * (nhwc ? 1 : g->n) * ctiles * g->g;
            if (ptiles * (nhwc ? 1 : g->n) > 0x7fffffff || ctiles * g->g > 65535)
                continue;
            const int64_t slots = (int64_t)dev.sm_count * 2;
            const double waves = (double)((blocks + slots - 1) / slots);
            const double kp = (double)((g->cpg * g->r * g->s + PW_KC - 1) / PW_KC * PW_KC);
            const double math = (double)tch * tpx / (tf32 ? PW_TF32_MATH : 1);
            const double cost = waves * kp * (math + PW_LOAD_COST * (double)(tch + tpx));
            if (best < 0.0 || cost < best) {
                best = cost;
                pl.tch = tch;
                pl.tpx = tpx;
                pl.threads = threads;
                pl.ptiles = (int)ptiles;
                pl.ctiles = (int)ctiles;
            }
        }
    }
    if (best < 0.0) {
        snprintf(why, why_len, "fma gemm: grid too large");
        return CONVD_EUNSUPPORTED;
    }
    /* A 1x1 filter at any stride is the GEMM on a subsampled set of pixels: the direct kernel
     * has no taps to share a window between, whatever the grid (bench/gpu/NOTES.md, round 19). */
    if (!pointwise && pol->fma_gemm == 1 && !tf32 && !(g->r == 1 && g->s == 1)) {
        /* Useful fraction: outputs of the channel tiles times blocks of the last wave (blocks
         * per SM from the 128 registers the launch bounds allow). */
        const int64_t blocks = (int64_t)pl.ptiles * pl.ctiles * g->g;
        const int64_t bps = 65536 / (128 * pl.threads), slots = (int64_t)dev.sm_count * bps;
        const double eff = (double)g->kpg / ((double)pl.ctiles * pl.tch) * (double)blocks /
                           (double)((blocks + slots - 1) / slots * slots);
        if (eff < PW_MIN_EFF) {
            snprintf(why, why_len, "fma gemm: tiles would use %.2f of the GPU (< %.2f)", eff,
                     PW_MIN_EFF);
            return CONVD_EUNSUPPORTED;
        }
    }
    /* Split K where the grid fills at most a quarter of the GPU's block slots (two an SM) and
     * the partial sums fit the workspace the caller gives; never for an NCHW output of NHWC
     * copies (their workspace is taken). A grid of a third to a half gained nothing from two
     * splits, and lost up to 33% (H100: 98-104 blocks, rx50b1_l1_a, l2_ds, l3_in; NOTES round
     * 24). */
    const int ksteps = (g->cpg * g->r * g->s + PW_KC - 1) / PW_KC;
    pl.ksplit = 1;
    pl.kchunk = ksteps * PW_KC;
    if (pol->fma_split_k && ws_avail > 0 && !pl.out_nchw) {
        const int64_t blocks = (int64_t)pl.ptiles * (nhwc ? 1 : g->n) * pl.ctiles * g->g;
        const int64_t outs = (int64_t)g->n * g->ho * g->wo * g->k;
        int64_t want = (int64_t)dev.sm_count * 2 / blocks;
        if (want < PW_SPLIT_MIN_FILL)
            want = 1;
        if (want > ksteps / PW_SPLIT_STEPS)
            want = ksteps / PW_SPLIT_STEPS;
        if (want > PW_MAX_SPLIT)
            want = PW_MAX_SPLIT;
        if (want > (int64_t)(ws_avail / ((size_t)outs * sizeof(float))))
            want = (int64_t)(ws_avail / ((size_t)outs * sizeof(float)));
        if (want >= 2) {
            const int steps = (ksteps + (int)want - 1) / (int)want;
            pl.kchunk = steps * PW_KC;
            pl.ksplit = (ksteps + steps - 1) / steps;
        }
    }
    pl.smem = PW_KC * (pl.tpx + 4 + pl.tch + 4) * (int)sizeof(float);
    pl.tf32 = tf32;
    if (tf32 && pl.tch * (pl.tpx + 4) * (int)sizeof(float) > pl.smem)
        pl.smem = pl.tch * (pl.tpx + 4) * (int)sizeof(float); /* the accumulators' way out */
    /* NHWC: 4 channels of a tap per load (any filter); NCHW: 4 pixels of a plane (pointwise). */
    pl.vec_in =
        g->cpg % 4 == 0 && (nhwc || (pointwise && npix % 4 == 0 && (pl.tpx & (pl.tpx - 1)) == 0));
    /* 4-element output runs stay inside a row and aligned: NHWC needs K and kpg multiples of 4,
     * NCHW (native or from NHWC copies) a plane of a multiple of 4 pixels (tiles and runs start
     * at multiples of 4). */
    pl.vec_out =
        nhwc && !pl.out_nchw ? g->k % 4 == 0 && g->kpg % 4 == 0 : (int64_t)g->ho * g->wo % 4 == 0;
    *ret = pl;
    return 0;
}

/* Split K's second pass over `count` problems. */
template <class DT>
static int pw_reduce_dt(const struct gpu_pw_plan *pl, const struct gpu_batch *b, int count,
                        const struct gpu_launch *ln)
{
    const struct gpu_geom *g = &pl->g;
    const int64_t total = (int64_t)g->n * g->ho * g->wo * g->k;
    dim3 grid((unsigned)((total + 255) / 256), (unsigned)count);
    GPU_LAUNCH((pw_reduce_kernel<DT>), grid, dim3(256), 0, ln, *g, *b, pl->ksplit,
               pl->layout == CONVD_LAYOUT_NCHW);
    CONVD_GPU_CHECK(hipGetLastError());
    return 0;
}

template <class DT>
static int pw_launch_dt(const struct gpu_pw_plan *pl, const struct gpu_batch *b, int count,
                        const struct gpu_launch *ln)
{
    const struct gpu_geom *g = &pl->g;
    const int nhwc = pl->layout == CONVD_LAYOUT_NHWC;
    if (pl->ksplit > 1)
        for (int i = 0; i < count; i++)
            if (b->ws[i] == NULL)
                return CONVD_EINVAL; /* the caller gave no workspace for the partial sums */
    dim3 grid((unsigned)(pl->ptiles * (nhwc ? 1 : g->n)), (unsigned)(pl->ctiles * g->g),
              (unsigned)(count * pl->ksplit));
    dim3 block((unsigned)pl->threads);
#define PW_GO(NHWC, VEC, TF32)                                                                     \
    GPU_LAUNCH((pw_kernel<DT, NHWC, VEC, TF32>), grid, block, pl->smem, ln, *g, *b, pl->tch,       \
               pl->tpx, pl->ctiles, pl->ptiles, pl->vec_out, pl->out_nchw, pl->ksplit, pl->kchunk)
#if defined(CONVD_GPU_NVIDIA)
    if constexpr (DT::id == CONVD_DTYPE_FP32) {
        if (pl->tf32) {
            if (nhwc && pl->vec_in)
                PW_GO(1, 1, 1);
            else if (nhwc)
                PW_GO(1, 0, 1);
            else if (pl->vec_in)
                PW_GO(0, 1, 1);
            else
                PW_GO(0, 0, 1);
            CONVD_GPU_CHECK(hipGetLastError());
            return pl->ksplit > 1 ? pw_reduce_dt<DT>(pl, b, count, ln) : 0;
        }
    }
#endif
    if (nhwc && pl->vec_in)
        PW_GO(1, 1, 0);
    else if (nhwc)
        PW_GO(1, 0, 0);
    else if (pl->vec_in)
        PW_GO(0, 1, 0);
    else
        PW_GO(0, 0, 0);
#undef PW_GO
    CONVD_GPU_CHECK(hipGetLastError());
    return pl->ksplit > 1 ? pw_reduce_dt<DT>(pl, b, count, ln) : 0;
}

int gpu_pw_launch(const struct gpu_pw_plan *pl, const struct gpu_batch *b, int count,
                  const struct gpu_launch *ln)
{
    switch (pl->dtype) {
    case CONVD_DTYPE_FP32:
        return pw_launch_dt<dt_f32>(pl, b, count, ln);
    case CONVD_DTYPE_FP16:
        return pw_launch_dt<dt_f16>(pl, b, count, ln);
    case CONVD_DTYPE_BF16:
        return pw_launch_dt<dt_bf16>(pl, b, count, ln);
    }
    return CONVD_EINVAL;
}
