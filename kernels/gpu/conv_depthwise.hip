/*
 * Depthwise and channel-multiplier convolution (cpg = 1, kpg 1 or 2): memory bound, so the
 * kernels are judged in GB/s.
 *
 * NHWC: a block copies the input halo of a spatial tile for 32 (fp32) or 64 (fp16/bf16) adjacent
 * channels into shared memory with 16-byte cp.async, then each lane owns 1 or 2 channels and a
 * strip of P output pixels along W and produces their kpg outputs. With unit stride and dilation
 * along W, a filter row's input columns are read once into a register window and reused by every
 * tap (SMAX is the widest filter the window serves). The shared-memory tile keeps many loads in
 * flight with few registers, where reading global memory straight into registers did not.
 *
 * NHWC direct (3x3, 5x5 and 7x7 filters; equal strides of 1 or 2, no dilation; kpg = 2 for 3x3
 * stride 1): no shared memory and no barrier. A thread owns CPT adjacent channels (and their
 * CPT * kpg adjacent outputs) of P adjacent output columns and a band of TH output rows;
 * consecutive threads take consecutive channel vectors and then consecutive column groups, so each
 * input-row load of a warp is one contiguous run and the neighbours' loads of the same bytes hit
 * L1. The filter lives in registers as fp32; the band's input rows stream through registers once
 * each, fully unrolled, so the next rows' loads are in flight while the current one is multiplied.
 * It runs the MobileNet shapes in half the time of the tiled kernel below, whose blocks wait for
 * their whole halo behind a barrier and leave lanes idle in the last 64-channel block when C is not
 * a multiple of 64.
 *
 * NCHW direct (3x3, 5x5 and 7x7 with "same" padding on the left, strides 1 and 2, kpg = 1,
 * W and Wo multiples of 4): the same idea along the plane's rows, 4 adjacent columns of one
 * channel per thread read as aligned 4-element chunks. Faster than the tiled NCHW kernel and than
 * the NHWC direct kernel on the same shapes: a quarter of the registers for the filter, so 24
 * warps per SM instead of 16.
 *
 * NCHW tiled (everything else): one block per (image, channel) plane and tile of output rows.
 * The input rows the tile needs go to shared memory as fp32 (converted once, zero padded), then
 * each thread computes a strip of P outputs for each of the kpg output planes, with the same
 * register window.
 */
#include "gpu_internal.h"

#define DW_P 4

/* CPL adjacent channels of one pixel from the shared halo, as fp32. */
template <class DT, int CPL> struct dw_px;
template <> struct dw_px<dt_f32, 1> {
    static GPU_D void load(const uint8_t *p, float *v)
    {
        v[0] = *(const float *)p;
    }
};
template <class DT> struct dw_px16 {
    static GPU_D void load(const uint8_t *p, float *v)
    {
        const uint32_t u = *(const uint32_t *)p;
        v[0] = DT::load((uint16_t)(u & 0xffffu));
        v[1] = DT::load((uint16_t)(u >> 16));
    }
};
template <> struct dw_px<dt_f16, 2> : dw_px16<dt_f16> {
};
template <> struct dw_px<dt_bf16, 2> : dw_px16<dt_bf16> {
};

/* Stores N adjacent output channels (N = CPL * KPG: 1, 2 or 4). */
template <class DT, int N> GPU_D void dw_store(typename DT::T *p, const float *v)
{
#pragma unroll
    for (int i = 0; i < N; i++)
        p[i] = DT::store(v[i]);
}

struct dwt_args {
    int cb, cblocks, th, tw, tiles_h, tiles_w, ih, iw, ps;
};

/*
 * NHWC. A block owns a tile of th x tw output pixels of one image and cb = 32 * CPL channels
 * (CPL = 2 for 16-bit types, 1 for fp32: one warp spans the channels, so shared-memory reads
 * are conflict-free 4-byte accesses). The input halo arrives by 16-byte cp.async (zero-filled at
 * the borders), the block's weights as fp32 [tap][channel]. Each warp then walks strips of P
 * output pixels along W; with unit stride and dilation along W a row's input columns are read
 * once into a register window and reused by every tap (SMAX is the widest filter it serves).
 */
template <class DT, int CPL, int KPG, int P, int SMAX>
__global__ void __launch_bounds__(256)
    dw_nhwc_kernel(const struct gpu_geom g, const struct gpu_batch b, const struct dwt_args a)
{
    convd_grid_dependency();
    typedef typename DT::T T;
    extern __shared__ __align__(16) uint8_t dwt_smem[];
    const int prob = blockIdx.z;
    const T *x = (const T *)b.x[prob];
    const T *w = (const T *)b.w[prob];
    const T *bias = (const T *)b.b[prob];
    T *y = (T *)b.y[prob];
    const int es = (int)sizeof(T);

    const int cblk = blockIdx.x % a.cblocks;
    int tile = blockIdx.x / a.cblocks;
    const int tw_i = tile % a.tiles_w;
    tile /= a.tiles_w;
    const int th_i = tile % a.tiles_h;
    const int n = tile / a.tiles_h;
    const int oh0 = th_i * a.th, ow0 = tw_i * a.tw;
    const int ih0 = oh0 * g.sh - g.pt, iw0 = ow0 * g.sw - g.pl;
    const int c0 = cblk * a.cb;
    const int cbn = min(a.cb, g.c - c0);
    const int rs = g.r * g.s;
    const int hpix = a.ih * a.iw;

    uint8_t *halo = dwt_smem;
    float *wts = (float *)(dwt_smem + ((hpix * a.ps + 15) & ~15));

    /* Halo: 16-byte vectors of the block's channels (C is a multiple of the vector). */
    const int vpp = (cbn * es) >> 4;
    if ((int)blockDim.x % vpp == 0) {
        /* Fixed 16-byte column per thread, pixels walked (row, column) without divisions. */
        const int cv = threadIdx.x % vpp, pstep = blockDim.x / vpp;
        struct gpu_walk wk;
        gpu_walk_init(&wk, threadIdx.x / vpp, pstep, a.ih, a.iw);
        for (int pix = threadIdx.x / vpp; pix < hpix;
             pix += pstep, gpu_walk_step(&wk, a.ih, a.iw)) {
            const int ih = ih0 + wk.mid, iw = iw0 + wk.lo;
            const bool valid = convd_math_inside(ih, g.h) && convd_math_inside(iw, g.w);
            const T *src =
                valid ? x + ((size_t)(n * g.h + ih) * g.w + iw) * g.c + c0 + cv * (16 / es) : x;
            gpu_cp16(halo + pix * a.ps + cv * 16, src, valid);
        }
    } else {
        for (int v = threadIdx.x; v < hpix * vpp; v += blockDim.x) {
            const int pix = v / vpp, cv = v - pix * vpp;
            const int ihl = pix / a.iw, iwl = pix - ihl * a.iw;
            const int ih = ih0 + ihl, iw = iw0 + iwl;
            const bool valid = convd_math_inside(ih, g.h) && convd_math_inside(iw, g.w);
            const T *src =
                valid ? x + ((size_t)(n * g.h + ih) * g.w + iw) * g.c + c0 + cv * (16 / es) : x;
            gpu_cp16(halo + pix * a.ps + cv * 16, src, valid);
        }
    }
    /* Weights (K, R, S, 1) of outputs [c0 * KPG, (c0 + cb) * KPG) as fp32 [tap][k]. */
    const int kb = a.cb * KPG;
    for (int e = threadIdx.x; e < rs * kb; e += blockDim.x) {
        const int tap = e / kb, kl = e - tap * kb;
        const int k = c0 * KPG + kl;
        wts[e] = kl < cbn * KPG ? DT::load(w[(size_t)k * rs + tap]) : 0.0f;
    }
    gpu_cp_wait_all();
    __syncthreads();

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane * CPL >= cbn)
        return;
    const int spr = a.tw / P; /* strips per tile row */
    const float *wl = wts + lane * CPL * KPG;
    float bv[CPL * KPG];
#pragma unroll
    for (int i = 0; i < CPL * KPG; i++)
        bv[i] = g.bias ? DT::load(bias[(c0 + lane * CPL) * KPG + i]) : 0.0f;

    for (int st = warp; st < a.th * spr; st += nwarps) {
        const int tr = st / spr, sxi = st - tr * spr;
        const int oh = oh0 + tr, ow = ow0 + sxi * P;
        if (oh >= g.ho || ow >= g.wo)
            continue;
        float acc[P][CPL * KPG];
#pragma unroll
        for (int o = 0; o < P; o++)
#pragma unroll
            for (int i = 0; i < CPL * KPG; i++)
                acc[o][i] = 0.0f;
        for (int r = 0; r < g.r; r++) {
            const uint8_t *hrow =
                halo + ((tr * g.sh + r * g.dh) * a.iw + sxi * P * g.sw) * a.ps + lane * CPL * es;
            if (SMAX > 0) {
                float win[P + (SMAX > 0 ? SMAX : 1) - 1][CPL];
#pragma unroll
                for (int j = 0; j < P + SMAX - 1; j++) {
                    if (j < P + g.s - 1) {
                        dw_px<DT, CPL>::load(hrow + j * a.ps, win[j]);
                    } else {
#pragma unroll
                        for (int c = 0; c < CPL; c++)
                            win[j][c] = 0.0f;
                    }
                }
#pragma unroll
                for (int s = 0; s < SMAX; s++) {
                    if (s < g.s) {
                        const float *wt = wl + (r * g.s + s) * kb;
                        float wv[CPL * KPG];
#pragma unroll
                        for (int i = 0; i < CPL * KPG; i++)
                            wv[i] = wt[i];
#pragma unroll
                        for (int o = 0; o < P; o++)
#pragma unroll
                            for (int c = 0; c < CPL; c++)
#pragma unroll
                                for (int q = 0; q < KPG; q++)
                                    acc[o][c * KPG + q] =
                                        fmaf(win[o + s][c], wv[c * KPG + q], acc[o][c * KPG + q]);
                    }
                }
            } else {
                for (int s = 0; s < g.s; s++) {
                    const float *wt = wl + (r * g.s + s) * kb;
                    float wv[CPL * KPG];
#pragma unroll
                    for (int i = 0; i < CPL * KPG; i++)
                        wv[i] = wt[i];
#pragma unroll
                    for (int o = 0; o < P; o++) {
                        float xv[CPL];
                        dw_px<DT, CPL>::load(hrow + (o * g.sw + s * g.dw) * a.ps, xv);
#pragma unroll
                        for (int c = 0; c < CPL; c++)
#pragma unroll
                            for (int q = 0; q < KPG; q++)
                                acc[o][c * KPG + q] =
                                    fmaf(xv[c], wv[c * KPG + q], acc[o][c * KPG + q]);
                    }
                }
            }
        }
        T *out = y + ((size_t)(n * g.ho + oh) * g.wo + ow) * g.k + (c0 + lane * CPL) * KPG;
#pragma unroll
        for (int o = 0; o < P; o++) {
            if (ow + o >= g.wo)
                break;
            float ov[CPL * KPG];
#pragma unroll
            for (int i = 0; i < CPL * KPG; i++)
                ov[i] = gpu_epilogue(acc[o][i], bv[i], g);
            dw_store<DT, CPL * KPG>(out + (size_t)o * g.k, ov);
        }
    }
}

/* 2, 4 or 8 bytes from global memory through the read-only path; with HINT, asking L2 to fetch
 * the whole 256-byte block around it from DRAM (NVIDIA sm_80+; a plain load elsewhere). */
template <int BYTES, bool HINT> GPU_D void dw_ldg(const void *p, bool valid, uint32_t *u)
{
#if defined(CONVD_DEVICE_SM80)
    if (HINT) {
        if (!valid) {
            u[0] = 0u;
            if (BYTES == 8)
                u[1] = 0u;
        } else if (BYTES == 8) {
            asm("ld.global.nc.L2::256B.v2.u32 {%0, %1}, [%2];" : "=r"(u[0]), "=r"(u[1]) : "l"(p));
        } else if (BYTES == 4) {
            asm("ld.global.nc.L2::256B.u32 %0, [%1];" : "=r"(u[0]) : "l"(p));
        } else {
            unsigned short h;
            asm("ld.global.nc.L2::256B.u16 %0, [%1];" : "=h"(h) : "l"(p));
            u[0] = h;
        }
        return;
    }
#endif
    if (BYTES == 2) {
        u[0] = valid ? *(const uint16_t *)p : 0u;
    } else if (BYTES == 8) {
        const uint2 v = valid ? *(const uint2 *)p : make_uint2(0u, 0u);
        u[0] = v.x;
        u[1] = v.y;
    } else {
        u[0] = valid ? *(const uint32_t *)p : 0u;
    }
}

/* CPT elements of 2, 4 or 8 bytes in all as fp32, through dw_ldg. */
template <class DT, int CPT, bool HINT>
GPU_D void dw_direct_load(const typename DT::T *p, bool valid, float *v)
{
    constexpr int BYTES = CPT * (int)sizeof(typename DT::T);
    static_assert(BYTES == 2 || BYTES == 4 || BYTES == 8, "direct loads are 2, 4 or 8 bytes");
    uint32_t u[2];
    dw_ldg<BYTES, HINT>(p, valid, u);
    if (sizeof(typename DT::T) == 4) {
#pragma unroll
        for (int j = 0; j < CPT; j++)
            v[j] = __uint_as_float(u[j]);
    } else {
#pragma unroll
        for (int j = 0; j < CPT; j++)
            v[j] = DT::load((uint16_t)(j & 1 ? u[j >> 1] >> 16 : u[j >> 1] & 0xffffu));
    }
}

/* CPT elements (2, 4, 8 or 16 bytes in all) from fp32, rounded to the output type, one store. */
template <class DT, int CPT> GPU_D void dw_direct_store(typename DT::T *p, const float *v)
{
    constexpr int BYTES = CPT * (int)sizeof(typename DT::T);
    static_assert(BYTES == 2 || BYTES == 4 || BYTES == 8 || BYTES == 16,
                  "direct stores are 2, 4, 8 or 16 bytes");
    if (BYTES == 2) {
        *p = DT::store(v[0]);
        return;
    }
    uint32_t u[4];
    if constexpr (sizeof(typename DT::T) == 4) {
#pragma unroll
        for (int j = 0; j < CPT; j++)
            u[j] = __float_as_uint(v[j]);
    } else {
#pragma unroll
        for (int j = 0; j < CPT / 2; j++)
            u[j] = DT::store2(v[2 * j], v[2 * j + 1]);
    }
    if (BYTES == 16)
        *(uint4 *)p = make_uint4(u[0], u[1], u[2], u[3]);
    else if (BYTES == 8)
        *(uint2 *)p = make_uint2(u[0], u[1]);
    else
        *(uint32_t *)p = u[0];
}

/* A direct thread's filter taps for its CPT outputs (channels times kpg), as fp32: kept as
 * stored and converted per use, they measured slower. */
template <class DT, int CPT, int KS> struct dw_filt {
    float w[KS * KS][CPT];
    GPU_D void load(const typename DT::T *wp)
    {
#pragma unroll
        for (int j = 0; j < CPT; j++)
#pragma unroll
            for (int t = 0; t < KS * KS; t++)
                w[t][j] = DT::load(wp[(size_t)j * (KS * KS) + t]);
    }
};

/*
 * NHWC direct: the band's input rows, NC = (P - 1) * SH + KS columns each, multiplied into
 * acc[TH][P][CPT * KPG] (input channel j feeds outputs j * KPG .. j * KPG + KPG - 1). CHECK = false
 * for threads whose whole window lies inside the image (all but the border ones): no bounds tests
 * and no selects on the loads. Addresses are 32-bit element offsets from the image (the planner
 * keeps an image below 2^31 elements): one multiply-add per load for the offset, one for the
 * address; with CHECK, the columns' bounds are one bit mask per thread and a row's is folded into
 * it, so a load's test is one logic operation (measured: the 64-bit address and two bounds tests
 * per load took as many instructions as the FMAs).
 */
template <class DT, int CPT, int KPG, int KS, int SH, int TH, int P, bool CHECK, bool HINT,
          bool LEAN>
GPU_D void dw_direct_body(const typename DT::T *xb, int rowe, const struct gpu_geom &g, int ih0,
                          int iw0, const dw_filt<DT, CPT * KPG, KS> &wt,
                          float (&acc)[TH][P][CPT * KPG])
{
    constexpr int IR = (TH - 1) * SH + KS, NC = (P - 1) * SH + KS;
    static_assert(NC <= 32, "the column mask is 32 bits");
    uint32_t cmask = 0;
    if (CHECK) {
#pragma unroll
        for (int q = 0; q < NC; q++)
            cmask |= (uint32_t)convd_math_inside(iw0 + q, g.w) << q;
    }
    const int cstep = g.c;
    int lean_roff = ih0 * rowe + iw0 * cstep; /* LEAN: the row's offset, one add per row */
#pragma unroll
    for (int i = 0; i < IR; i++) {
        const int ih = ih0 + i;
        const uint32_t rmask = !CHECK || convd_math_inside(ih, g.h) ? cmask : 0u;
        int roff;
        if constexpr (LEAN) {
            roff = lean_roff;
            lean_roff += rowe;
        } else {
            roff = ih * rowe + iw0 * cstep;
        }
        float v[NC][CPT];
#pragma unroll
        for (int q = 0; q < NC; q++)
            dw_direct_load<DT, CPT, HINT>(xb + (roff + q * cstep), !CHECK || (rmask >> q & 1u) != 0,
                                          v[q]);
#pragma unroll
        for (int o = 0; o < TH; o++) {
            const int r = i - o * SH;
            if (r < 0 || r >= KS)
                continue;
            /* LEAN: an output's taps of the row back to back; every output gets its taps in the
             * same order either way. */
            if constexpr (LEAN) {
#pragma unroll
                for (int pp = 0; pp < P; pp++)
#pragma unroll
                    for (int j = 0; j < CPT * KPG; j++)
#pragma unroll
                        for (int sc = 0; sc < KS; sc++)
                            acc[o][pp][j] =
                                fmaf(v[pp * SH + sc][j / KPG], wt.w[r * KS + sc][j], acc[o][pp][j]);
            } else {
#pragma unroll
                for (int sc = 0; sc < KS; sc++)
#pragma unroll
                    for (int pp = 0; pp < P; pp++)
#pragma unroll
                        for (int j = 0; j < CPT * KPG; j++)
                            acc[o][pp][j] =
                                fmaf(v[pp * SH + sc][j / KPG], wt.w[r * KS + sc][j], acc[o][pp][j]);
            }
        }
    }
}

/* The NHWC instances built LEAN (dw_direct_body and the store): row offsets by addition, an
 * output's taps of a row back to back, the store's bounds as counts. The same loads, FMAs and
 * stores, in an order under which ptxas (sm_90) no longer spills them at their register caps:
 * 5x5 stride 2 in 16-bit (4 bytes), 3x3 at 2 channels in fp32 with kpg 1 (8) and with kpg 2 and
 * 4 rows (16); bench/gpu/NOTES.md, round 15. */
GPU_HD constexpr bool dw_direct_lean(int dtype, int cpt, int kpg, int ks, int sh, int th)
{
    if (dtype == CONVD_DTYPE_FP32)
        return cpt == 2 && ks == 3 && sh == 1 && th == 4 && (kpg == 1 || kpg == 2);
    return dtype == CONVD_DTYPE_FP16 && cpt == 2 && kpg == 1 && ks == 5 && sh == 2 && th == 4;
}

/*
 * NHWC direct. Grid: x over (group of P output columns, channel vector) of a row in blocks of
 * blockDim.x, y over (image, band of TH output rows), z over problems; with FLAT, x over all of
 * (image, band, column group, channel vector), fastest last, so that no block idles lanes at the
 * end of a row (effnet_dw5's rows of 840 threads leave 18% of 4 blocks of 256 idle; the decode
 * costs the 3x3 instances 10 spilled registers at 80). KS x KS filter, stride SH both ways.
 */
template <class DT, int CPT, int KPG, int KS, int SH, int TH, int P, bool SPLIT, int MINB,
          bool HINT, bool FLAT>
__global__ void __launch_bounds__(256, CONVD_MIN_BLOCKS(256, MINB))
    dw_direct_kernel(const struct gpu_geom g, const struct gpu_batch b, int cvn, int bands)
{
    convd_grid_dependency();
    constexpr int NO = CPT * KPG; /* outputs per pixel of a thread */
    typedef typename DT::T T;
    constexpr int IR = (TH - 1) * SH + KS, NC = (P - 1) * SH + KS;
    const int prob = blockIdx.z;
    const int wg = (g.wo + P - 1) / P;
    const int f = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (f >= (FLAT ? g.n * bands : 1) * wg * cvn)
        return;
    const int row = FLAT ? f / (wg * cvn) : (int)blockIdx.y, rf = FLAT ? f - row * (wg * cvn) : f;
    const int owg = rf / cvn, c0 = (rf - owg * cvn) * CPT, ow0 = owg * P;
    const int n = row / bands, oh0 = (row - n * bands) * TH;
    const T *x = (const T *)b.x[prob];
    const T *w = (const T *)b.w[prob];
    const T *bias = (const T *)b.b[prob];
    T *y = (T *)b.y[prob];

    dw_filt<DT, NO, KS> wt;
    wt.load(w + (size_t)c0 * KPG * (KS * KS));
    float acc[TH][P][NO];
#pragma unroll
    for (int o = 0; o < TH; o++)
#pragma unroll
        for (int pp = 0; pp < P; pp++)
#pragma unroll
            for (int j = 0; j < NO; j++)
                acc[o][pp][j] = 0.0f;

    const int ih0 = oh0 * SH - g.pt, iw0 = ow0 * SH - g.pl;
    const int rowe = g.w * g.c;
    const T *xb = x + (size_t)n * g.h * rowe + c0;
    constexpr bool LEAN = dw_direct_lean(DT::id, CPT, KPG, KS, SH, TH);
    if (SPLIT && ih0 >= 0 && ih0 + IR <= g.h && iw0 >= 0 && iw0 + NC <= g.w)
        dw_direct_body<DT, CPT, KPG, KS, SH, TH, P, false, HINT, LEAN>(xb, rowe, g, ih0, iw0, wt,
                                                                       acc);
    else
        dw_direct_body<DT, CPT, KPG, KS, SH, TH, P, true, HINT, LEAN>(xb, rowe, g, ih0, iw0, wt,
                                                                      acc);

    /* Bias and activation in place, only where asked for (a uniform branch): the plain epilogue is
     * the conversion and the store. */
    if (g.bias || g.act) {
        float bv[NO];
#pragma unroll
        for (int j = 0; j < NO; j++)
            bv[j] = g.bias ? DT::load(bias[c0 * KPG + j]) : 0.0f;
#pragma unroll
        for (int o = 0; o < TH; o++)
#pragma unroll
            for (int pp = 0; pp < P; pp++)
#pragma unroll
                for (int j = 0; j < NO; j++)
                    acc[o][pp][j] = gpu_epilogue(acc[o][pp][j], bv[j], g);
    }
    T *yb = y + ((size_t)(n * g.ho + oh0) * g.wo + ow0) * g.k + c0 * KPG;
    const int nro = g.ho - oh0, nco = g.wo - ow0; /* LEAN: rows and columns left */
#pragma unroll
    for (int o = 0; o < TH; o++) {
        if (LEAN ? o >= nro : oh0 + o >= g.ho)
            break;
#pragma unroll
        for (int pp = 0; pp < P; pp++) {
            if (LEAN ? pp >= nco : ow0 + pp >= g.wo)
                break;
            dw_direct_store<DT, NO>(yb + ((size_t)o * g.wo + pp) * g.k, acc[o][pp]);
        }
    }
}

/* The NCHW instances that address a row's chunks as 32-bit offsets from the plane instead of
 * from a 64-bit row pointer: the fp32 5x5 and 7x7 stride-2 ones, which spilled 4 to 8 bytes
 * with the pointer at their register caps (ptxas, sm_90; bench/gpu/NOTES.md, round 15). The
 * planner keeps an image's offsets below 2^31 (dw_direct_plan). */
GPU_HD constexpr bool dw_nchw_row_offsets(int dtype, int ks, int sh)
{
    return dtype == CONVD_DTYPE_FP32 && ks >= 5 && sh == 2;
}

/*
 * NCHW direct (3x3, 5x5 and 7x7 filters with "same" padding (KS - 1) / 2 on the left, equal
 * strides of 1 or 2, no dilation, kpg = 1, W and Wo multiples of 4). A thread owns 4 adjacent
 * output columns of a band of TH rows of one (image, channel) plane; consecutive threads take
 * consecutive column groups, then bands, then planes. Each input row of the band is read as the
 * aligned 4-element chunks (8 bytes for 16-bit types, 16 for fp32) that cover its window: with
 * W a multiple of 4 a chunk lies wholly inside or wholly outside the row, and the window starts
 * OFF = -pad mod 4 elements into the first chunk, the same for every thread. The filter (one
 * channel's KS x KS taps) lives in registers as fp32; outputs leave as one 4-element store per
 * row. No shared memory and no barrier, as the NHWC direct kernel; it replaces the tiled NCHW
 * kernel's one block per plane, whose blocks each waited for one plane's load behind a barrier.
 */
template <class DT, int KS, int SH, int TH, int MINB>
__global__ void __launch_bounds__(256, CONVD_MIN_BLOCKS(256, MINB))
    dw_nchw_direct_kernel(const struct gpu_geom g, const struct gpu_batch b, int cgs, int bands)
{
    convd_grid_dependency();
    typedef typename DT::T T;
    constexpr int P = 4, PAD = (KS - 1) / 2, OFF = (4 - PAD % 4) % 4;
    constexpr int IR = (TH - 1) * SH + KS, NC = (P - 1) * SH + KS, NCH = (OFF + NC + 3) / 4;
    const int prob = blockIdx.z;
    const int f = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (f >= g.n * g.c * bands * cgs)
        return;
    const int t = f / cgs, cg = f - t * cgs;
    const int plane = t / bands, band = t - plane * bands; /* plane = n * C + c */
    const int c = plane % g.c;
    const T *xp = (const T *)b.x[prob] + (size_t)plane * g.h * g.w;
    const T *w = (const T *)b.w[prob] + (size_t)c * (KS * KS);

    float wt[KS * KS];
#pragma unroll
    for (int i = 0; i < KS * KS; i++)
        wt[i] = DT::load(w[i]);
    float acc[TH][P];
#pragma unroll
    for (int o = 0; o < TH; o++)
#pragma unroll
        for (int pp = 0; pp < P; pp++)
            acc[o][pp] = 0.0f;

    const int oh0 = band * TH, ih0 = oh0 * SH - g.pt, a0 = cg * P * SH - PAD - OFF;
#pragma unroll
    for (int i = 0; i < IR; i++) {
        const int ih = ih0 + i;
        const bool rok = convd_math_inside(ih, g.h);
        float win[NCH * 4];
        if constexpr (dw_nchw_row_offsets(DT::id, KS, SH)) {
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                const int col = a0 + 4 * ch;
                const bool ok = rok && convd_math_inside(col, g.w);
                gpu_load4<DT>(xp + (ok ? ih * g.w + col : 0), ok, win + 4 * ch);
            }
        } else {
            const T *xr = xp + (size_t)(rok ? ih : 0) * g.w;
#pragma unroll
            for (int ch = 0; ch < NCH; ch++) {
                const int col = a0 + 4 * ch;
                const bool ok = rok && convd_math_inside(col, g.w);
                gpu_load4<DT>(xr + (ok ? col : 0), ok, win + 4 * ch);
            }
        }
#pragma unroll
        for (int o = 0; o < TH; o++) {
            const int r = i - o * SH;
            if (r < 0 || r >= KS)
                continue;
#pragma unroll
            for (int pp = 0; pp < P; pp++)
#pragma unroll
                for (int s = 0; s < KS; s++)
                    acc[o][pp] = fmaf(win[OFF + pp * SH + s], wt[r * KS + s], acc[o][pp]);
        }
    }

    if (g.bias || g.act) { /* in place, only where asked for (a uniform branch) */
        const float bv = g.bias ? DT::load(((const T *)b.b[prob])[c]) : 0.0f;
#pragma unroll
        for (int o = 0; o < TH; o++)
#pragma unroll
            for (int pp = 0; pp < P; pp++)
                acc[o][pp] = gpu_epilogue(acc[o][pp], bv, g);
    }
    T *yp = (T *)b.y[prob] + ((size_t)plane * g.ho + oh0) * g.wo + cg * P;
#pragma unroll
    for (int o = 0; o < TH; o++) {
        if (oh0 + o >= g.ho)
            break;
        gpu_store4<DT>(yp + (size_t)o * g.wo, acc[o]);
    }
}

/*
 * NCHW input rows [ih0, ih0 + ir) of one plane into shared memory as fp32 rows of icols (column
 * c holds input column c - pl), when W is a multiple of the 8-byte vector and the plane is
 * 8-byte aligned: the rows inside the image are one contiguous run of the plane, read as 8-byte
 * vectors, four in flight per thread; padding columns and rows outside the image become zeros.
 */
template <class DT>
GPU_D void dw_nchw_fill_vec(float *in_s, const typename DT::T *xp, const struct gpu_geom &g,
                            int ih0, int ir, int icols)
{
    typedef typename DT::T T;
    const int vecn = 8 / (int)sizeof(T), wv = g.w / vecn;
    const int bd = (int)blockDim.x, tid = (int)threadIdx.x;
    /* Rows [0, top) and [bot, ir) of the tile lie outside the image. */
    const int top = min(max(-ih0, 0), ir);
    const int bot = max(min(g.h - ih0, ir), top);
    const int nv = (bot - top) * wv;
    const uint2 *src = (const uint2 *)(xp + (size_t)(ih0 + top) * g.w);
    for (int base = tid; base < nv; base += 4 * bd) {
        uint2 u[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int e = base + k * bd;
            u[k] = e < nv ? src[e] : make_uint2(0u, 0u);
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int e = base + k * bd;
            if (e >= nv)
                break;
            const int rr = e / wv, col0 = (e - rr * wv) * vecn + g.pl;
            float v[4];
            if (sizeof(T) == 4) {
                v[0] = __uint_as_float(u[k].x);
                v[1] = __uint_as_float(u[k].y);
            } else {
                v[0] = DT::load((T)(u[k].x & 0xffffu));
                v[1] = DT::load((T)(u[k].x >> 16));
                v[2] = DT::load((T)(u[k].y & 0xffffu));
                v[3] = DT::load((T)(u[k].y >> 16));
            }
            float *dst = in_s + (top + rr) * icols + col0;
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (j < vecn && col0 + j < icols)
                    dst[j] = v[j];
        }
    }
    /* Zeros: the padding columns of every row, then the image columns of rows outside it. */
    const int right = icols - g.pl - g.w;
    const int npad = min(g.pl, icols) + (right > 0 ? right : 0);
    for (int e = tid; e < ir * npad; e += bd) {
        const int row = e / npad, k = e - row * npad;
        const int col = k < g.pl ? k : g.pl + g.w + (k - g.pl);
        in_s[row * icols + col] = 0.0f;
    }
    const int iwid = min(icols - g.pl, g.w);
    const int ninv = top + (ir - bot);
    if (iwid > 0)
        for (int e = tid; e < ninv * iwid; e += bd) {
            const int ri = e / iwid, col = g.pl + (e - ri * iwid);
            const int row = ri < top ? ri : bot + (ri - top);
            in_s[row * icols + col] = 0.0f;
        }
}

/*
 * The tiled NCHW kernels' arithmetic: DW_P outputs of row oh (row tr of the shared tile), columns
 * ow0.., of each of the kpg output planes of input channel c of image n.
 */
template <class DT, int SMAX, int SW>
GPU_D void dw_nchw_strip(const struct gpu_geom &g, const float *in_s, const float *w_s, int icols,
                         int tr, int oh, int ow0, int c, int n, const typename DT::T *bias,
                         typename DT::T *y)
{
    typedef typename DT::T T;
    const int rs = g.r * g.s;
    for (int q = 0; q < g.kpg; q++) {
        const int k = c * g.kpg + q;
        float acc[DW_P];
#pragma unroll
        for (int o = 0; o < DW_P; o++)
            acc[o] = 0.0f;
        for (int r = 0; r < g.r; r++) {
            const float *row = in_s + (tr * g.sh + r * g.dh) * icols;
            const float *wr = w_s + q * rs + r * g.s;
            if (SMAX > 0) {
                /* The strip's input columns, read once: (DW_P - 1) * SW + S of them. */
                float win[(DW_P - 1) * SW + (SMAX > 0 ? SMAX : 1)];
#pragma unroll
                for (int j = 0; j < (DW_P - 1) * SW + SMAX; j++)
                    win[j] = j < (DW_P - 1) * SW + g.s ? row[ow0 * SW + j] : 0.0f;
#pragma unroll
                for (int s = 0; s < SMAX; s++) {
                    if (s < g.s) {
                        const float wv = wr[s];
#pragma unroll
                        for (int o = 0; o < DW_P; o++)
                            acc[o] = fmaf(win[o * SW + s], wv, acc[o]);
                    }
                }
            } else {
                for (int s = 0; s < g.s; s++) {
                    const float wv = wr[s];
#pragma unroll
                    for (int o = 0; o < DW_P; o++)
                        acc[o] = fmaf(row[(ow0 + o) * g.sw + s * g.dw], wv, acc[o]);
                }
            }
        }
        const float bv = g.bias ? DT::load(bias[k]) : 0.0f;
        T *out = y + ((size_t)(n * g.k + k) * g.ho + oh) * g.wo + ow0;
#pragma unroll
        for (int o = 0; o < DW_P; o++)
            if (ow0 + o < g.wo)
                out[o] = DT::store(gpu_epilogue(acc[o], bv, g));
    }
}

/*
 * NCHW. Block: one (image, input channel) plane and `th` output rows; threads th x sx, each a
 * strip of DW_P outputs of one row, for each of the kpg output planes of the channel. 3-wide
 * windows at eight blocks per SM (32 registers; the bf16 stride-2 instance is slower at the 44
 * it takes unbounded); the others at six (40 registers, what ptxas chooses unbounded; 32 costs
 * the wider windows time).
 */
template <class DT, int SMAX, int SW>
__global__ void __launch_bounds__(256, CONVD_MIN_BLOCKS(256, SMAX == 3 ? 8 : 6))
    dw_nchw_kernel(const struct gpu_geom g, const struct gpu_batch b, int th, int sx, int tiles_h,
                   int ir, int icols)
{
    convd_grid_dependency();
    typedef typename DT::T T;
    extern __shared__ float dw_smem[];
    const int prob = blockIdx.z;
    const T *x = (const T *)b.x[prob];
    const T *w = (const T *)b.w[prob];
    const T *bias = (const T *)b.b[prob];
    T *y = (T *)b.y[prob];

    const int tile = blockIdx.x % tiles_h;
    const int plane = blockIdx.x / tiles_h; /* n * C + c */
    const int c = plane % g.c, n = plane / g.c;
    const int oh0 = tile * th;
    const int ih0 = oh0 * g.sh - g.pt;
    const int rs = g.r * g.s;
    float *in_s = dw_smem;
    float *w_s = dw_smem + ir * icols;

    const T *xp = x + (size_t)plane * g.h * g.w;
    const int vecn = 8 / (int)sizeof(T);
    if (g.w % vecn == 0 && ((uintptr_t)xp & 7) == 0) {
        dw_nchw_fill_vec<DT>(in_s, xp, g, ih0, ir, icols);
    } else {
        /* Eight loads in flight per thread before the first store. */
        const int nel = ir * icols;
        const int bd = (int)blockDim.x, dr = bd / icols, dc = bd - dr * icols;
        int rr = (int)threadIdx.x / icols, cc = (int)threadIdx.x - rr * icols;
        for (int base = threadIdx.x; base < nel; base += 8 * bd) {
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int e = base + u * bd;
                /* (rr, cc) of e, stepped without a division. */
                const int ih = ih0 + rr, iw = cc - g.pl;
                v[u] = (e < nel && convd_math_inside(ih, g.h) && convd_math_inside(iw, g.w))
                           ? DT::load(xp[ih * g.w + iw])
                           : 0.0f;
                cc += dc;
                rr += dr;
                if (cc >= icols) {
                    cc -= icols;
                    rr++;
                }
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int e = base + u * (int)blockDim.x;
                if (e < nel)
                    in_s[e] = v[u];
            }
        }
    }
    for (int e = threadIdx.x; e < g.kpg * rs; e += blockDim.x)
        w_s[e] = DT::load(w[(size_t)c * g.kpg * rs + e]);
    __syncthreads();

    const int tr = threadIdx.x / sx, sxi = threadIdx.x - tr * sx;
    if (tr >= th || oh0 + tr >= g.ho)
        return;
    dw_nchw_strip<DT, SMAX, SW>(g, in_s, w_s, icols, tr, oh0 + tr, sxi * DW_P, c, n, bias, y);
}

/*
 * NCHW, planes too small to fill a block (7x7 and 14x14 images: one plane of a 7x7 image gave
 * dw_nchw_kernel blocks of 14 threads): `pp` whole (image, channel) planes per block, each served
 * by th x sx threads as dw_nchw_kernel serves one, so th is Ho. Consecutive planes are one
 * contiguous run in NCHW: the block reads its inputs coalesced, over a zeroed tile.
 */
template <class DT, int SMAX, int SW>
__global__ void __launch_bounds__(256, CONVD_MIN_BLOCKS(256, SMAX == 3 ? 8 : 6))
    dw_nchw_planes_kernel(const struct gpu_geom g, const struct gpu_batch b, int th, int sx, int pp,
                          int ir, int icols)
{
    convd_grid_dependency();
    typedef typename DT::T T;
    extern __shared__ float dw_smem[];
    const int prob = blockIdx.z;
    const T *x = (const T *)b.x[prob];
    const T *w = (const T *)b.w[prob];
    const T *bias = (const T *)b.b[prob];
    T *y = (T *)b.y[prob];
    const int p0 = (int)blockIdx.x * pp;
    const int np = min(pp, g.n * g.c - p0);
    const int pin = ir * icols, wn = g.kpg * g.r * g.s;
    float *w_s = dw_smem + pp * pin;
    const int bd = (int)blockDim.x, tid = (int)threadIdx.x;
    for (int e = tid; e < np * pin; e += bd)
        dw_smem[e] = 0.0f;
    __syncthreads();
    /* Tile row ih + pt holds input row ih, tile column iw + pl input column iw. */
    const int hw = g.h * g.w;
    const T *xp = x + (size_t)p0 * hw;
    for (int e = tid; e < np * hw; e += bd) {
        const int pi = e / hw, rem = e - pi * hw;
        const int ih = rem / g.w, iw = rem - ih * g.w;
        if (ih + g.pt < ir && iw + g.pl < icols)
            dw_smem[pi * pin + (ih + g.pt) * icols + iw + g.pl] = DT::load(xp[e]);
    }
    for (int e = tid; e < np * wn; e += bd) {
        const int pi = e / wn;
        w_s[e] = DT::load(w[(size_t)((p0 + pi) % g.c) * wn + (e - pi * wn)]);
    }
    __syncthreads();
    const int per = th * sx, pi = tid / per, t = tid - pi * per;
    const int tr = t / sx, sxi = t - tr * sx;
    if (pi >= np || tr >= g.ho)
        return;
    const int plane = p0 + pi;
    dw_nchw_strip<DT, SMAX, SW>(g, dw_smem + pi * pin, w_s + pi * wn, icols, tr, tr, sxi * DW_P,
                                plane % g.c, plane / g.c, bias, y);
}

/* Width of the register window over a filter row (0: none): unit dilation along W, S <= 7, and
 * stride 1 along W (both layouts) or 2 (NCHW, whose window is (DW_P - 1) * 2 + S wide). Windows
 * come in widths 3, 5 and 7; taps past S are skipped by a uniform branch. */
static int dw_smax(const struct convd_problem *p)
{
    const int max_sw = p->layout == CONVD_LAYOUT_NCHW ? 2 : 1;
    if (p->stride_w < 1 || p->stride_w > max_sw || p->dil_w != 1 || p->s > 7)
        return 0;
    return p->s <= 3 ? 3 : p->s <= 5 ? 5 : 7;
}

/*
 * Shapes of work of the direct kernels, each a template instance (dw_launch_direct):
 * X(layout, filter, stride, channels per thread, outputs per channel (kpg), rows, columns,
 *   interior split, min blocks per SM, L2 256-byte fetch hint, flat grid, dtypes it is the
 *   router's choice for); NCHW rows use only the filter, stride, rows and min blocks (one channel,
 *   kpg 1, 4 columns, always flat). The router takes the first row of the problem's layout,
 * filter, stride and kpg whose dtype mask holds its dtype; every row is reachable through
 * the policy's dw_direct for tests and `convd-bench-kernels --sweep-dw`. Each row is the
 * fastest shape (or within 2% of it) of the H200 sweeps for its filter, stride and dtypes
 * (bench/gpu/NOTES.md, "depthwise"): NHWC 3x3 with kpg 1 on rows of blocks, since the flat
 * grid makes it spill; 5x5 on the flat grid; 7x7 as 6 rows at one channel per thread, which
 * frees the filter's registers for 2 blocks per SM; NCHW mostly at 4 rows (8 for 3x3 bf16).
 * dw_direct_minb lowers one fp32 instance's min blocks.
 */
#define DW_F32  (1 << CONVD_DTYPE_FP32)
#define DW_F16  (1 << CONVD_DTYPE_FP16)
#define DW_BF16 (1 << CONVD_DTYPE_BF16)
#define DW_ALL  (DW_F32 | DW_F16 | DW_BF16)
#define DW_NHWC CONVD_LAYOUT_NHWC
#define DW_NCHW CONVD_LAYOUT_NCHW
#define DW_DCFGS(X)                                                                                \
    X(DW_NHWC, 3, 1, 2, 1, 4, 4, 0, 3, 1, 0, DW_ALL)                                               \
    X(DW_NHWC, 3, 1, 2, 2, 4, 4, 0, 2, 1, 0, DW_F32)                                               \
    X(DW_NHWC, 3, 1, 2, 2, 4, 4, 0, 2, 1, 1, DW_F16 | DW_BF16)                                     \
    X(DW_NHWC, 3, 1, 2, 2, 2, 4, 0, 3, 1, 1, 0)                                                    \
    X(DW_NHWC, 3, 2, 2, 1, 6, 2, 1, 3, 1, 0, DW_ALL)                                               \
    X(DW_NHWC, 5, 1, 2, 1, 4, 4, 0, 2, 1, 1, DW_ALL)                                               \
    X(DW_NHWC, 5, 1, 2, 1, 4, 4, 0, 2, 1, 0, 0)                                                    \
    X(DW_NHWC, 5, 2, 2, 1, 4, 4, 0, 2, 1, 1, DW_ALL)                                               \
    X(DW_NHWC, 5, 2, 1, 1, 4, 4, 0, 2, 1, 1, 0)                                                    \
    X(DW_NHWC, 7, 1, 2, 1, 6, 4, 0, 1, 1, 1, 0)                                                    \
    X(DW_NHWC, 7, 1, 1, 1, 6, 4, 0, 2, 1, 1, DW_ALL)                                               \
    X(DW_NHWC, 7, 1, 1, 1, 4, 4, 0, 2, 1, 1, 0)                                                    \
    X(DW_NCHW, 3, 1, 1, 1, 4, 4, 0, 4, 0, 1, DW_F32 | DW_F16)                                      \
    X(DW_NCHW, 3, 1, 1, 1, 8, 4, 0, 2, 0, 1, DW_BF16)                                              \
    X(DW_NCHW, 3, 2, 1, 1, 4, 4, 0, 3, 0, 1, DW_ALL)                                               \
    X(DW_NCHW, 5, 1, 1, 1, 4, 4, 0, 3, 0, 1, DW_ALL)                                               \
    X(DW_NCHW, 5, 2, 1, 1, 4, 4, 0, 3, 0, 1, DW_ALL)                                               \
    X(DW_NCHW, 7, 1, 1, 1, 4, 4, 0, 2, 0, 1, DW_ALL)                                               \
    X(DW_NCHW, 7, 2, 1, 1, 2, 4, 0, 2, 0, 1, DW_ALL)
/* What the planner needs of a row; the rest are template arguments only (dw_launch_direct). */
struct dw_dcfg {
    int layout, ks, sh, cpt, kpg, th, p, flat, dtypes;
};
#define DW_DCFG_ROW(LAY, KS, SH, CPT, KPG, TH, P, SPLIT, MINB, HINT, FLAT, DTYPES)                 \
    {LAY, KS, SH, CPT, KPG, TH, P, FLAT, DTYPES},
static constexpr struct dw_dcfg dw_dcfgs[] = {DW_DCFGS(DW_DCFG_ROW)};
#undef DW_DCFG_ROW
#define DW_NDCFG ((int)(sizeof(dw_dcfgs) / sizeof(dw_dcfgs[0])))

/* The row the router takes first for (layout, filter, stride, kpg) in dtype dt, or -1. */
static constexpr int dw_first_row(int layout, int ks, int sh, int kpg, int dt)
{
    for (int i = 0; i < DW_NDCFG; i++)
        if (dw_dcfgs[i].layout == layout && dw_dcfgs[i].ks == ks && dw_dcfgs[i].sh == sh &&
            dw_dcfgs[i].kpg == kpg && (dw_dcfgs[i].dtypes >> dt & 1) != 0)
            return i;
    return -1;
}

/* Whether rows a and e are the same shape of work but for the band height: what dw_direct_plan
 * may swap a for on a small image. */
static constexpr bool dw_same_work(const struct dw_dcfg &a, const struct dw_dcfg &e)
{
    return e.layout == a.layout && e.ks == a.ks && e.sh == a.sh && e.kpg == a.kpg &&
           e.cpt == a.cpt && e.p == a.p;
}

/* Whether row i's kernel is built for dtype dt. The production library holds the rows the router
 * can choose under the default policy: the first of its (layout, filter, stride, kpg) for dt,
 * and the rows of the same work shape with another band height that dw_direct_plan swaps to on
 * small images. The others, reachable only by forcing the policy's dw_direct, are built with
 * CONVD_GPU_SWEEP_KERNELS (the sweeps' build); without it such a forced row plans as tiled. */
static constexpr bool dw_row_built(int i, int dt)
{
#if defined(CONVD_GPU_SWEEP_KERNELS)
    (void)dt;
    return i >= 0 && i < DW_NDCFG;
#else
    if (i < 0 || i >= DW_NDCFG)
        return false;
    const struct dw_dcfg &r = dw_dcfgs[i];
    const int a = dw_first_row(r.layout, r.ks, r.sh, r.kpg, dt);
    if (a < 0)
        return false;
    return a == i || (dw_same_work(dw_dcfgs[a], r) && dw_dcfgs[a].th != r.th);
#endif
}

/* The index of the row with these values (rows differ in them). */
static constexpr int dw_row_index(int layout, int ks, int sh, int cpt, int kpg, int th, int p,
                                  int flat)
{
    for (int i = 0; i < DW_NDCFG; i++)
        if (dw_dcfgs[i].layout == layout && dw_dcfgs[i].ks == ks && dw_dcfgs[i].sh == sh &&
            dw_dcfgs[i].cpt == cpt && dw_dcfgs[i].kpg == kpg && dw_dcfgs[i].th == th &&
            dw_dcfgs[i].p == p && dw_dcfgs[i].flat == flat)
            return i;
    return -1;
}

int gpu_dw_direct_shapes(void)
{
    return DW_NDCFG;
}

/* The direct kernel's shape of work: 0 when it does not apply. */
static int dw_direct_plan(const struct convd_problem *p, const struct gpu_geom *g,
                          const struct convd_gpu_policy *pol, struct gpu_dw_plan *pl)
{
    const int dw_direct_mode = pol->dw_direct;
    if (dw_direct_mode == 0 || g->r != g->s || g->sh != g->sw || g->dh != 1 || g->dw != 1)
        return 0;
    /* NCHW: "same" padding on the left (the window's offset in its first chunk is a template
     * argument) and rows of whole 4-element chunks in and out. */
    if (p->layout == CONVD_LAYOUT_NCHW &&
        (g->pl != (g->s - 1) / 2 || g->w % 4 != 0 || g->wo % 4 != 0))
        return 0;
    int ci = -1;
    if (dw_direct_mode < 0) {
        ci = dw_first_row((int)p->layout, g->r, g->sh, g->kpg, (int)p->dtype);
    } else if (dw_direct_mode <= DW_NDCFG) {
        const struct dw_dcfg &f = dw_dcfgs[dw_direct_mode - 1];
        if (f.layout == (int)p->layout && f.ks == g->r && f.sh == g->sh && f.kpg == g->kpg)
            ci = dw_direct_mode - 1;
    }
    if (ci < 0)
        return 0;
    /* Bands that overrun a small image by more than a fifth of it (6-row bands on a 7-row
     * output compute 12 rows): the same shape of work with the band that wastes least, when the
     * router chooses. */
    const int ho = g->ho;
    for (int i = 0; dw_direct_mode < 0 && i < DW_NDCFG; i++) {
        const struct dw_dcfg *a = &dw_dcfgs[ci], *e = &dw_dcfgs[i];
        const int wa = (ho + a->th - 1) / a->th * a->th - ho,
                  we = (ho + e->th - 1) / e->th * e->th - ho;
        if (5 * wa > ho && we < wa && dw_same_work(*a, *e))
            ci = i;
    }
    const struct dw_dcfg *d = &dw_dcfgs[ci];
    if (g->c % d->cpt != 0 || !dw_row_built(ci, p->dtype))
        return 0;
    /* Threads: (image, band, column group, channel vector) for NHWC, (image, channel, band,
     * column group) for NCHW; NHWC rows without FLAT put (image, band) on grid y. */
    const int cvn = g->c / d->cpt;
    const int bands = (g->ho + d->th - 1) / d->th;
    const int64_t row_threads = (int64_t)((g->wo + d->p - 1) / d->p) * cvn;
    const int64_t threads = (int64_t)g->n * bands * row_threads;
    if (threads > 0x7fffffff - 256 || (!d->flat && (int64_t)g->n * bands > 65535) ||
        (int64_t)(g->h + g->r) * (g->w + g->s) * g->c > 0x7fffffff)
        return 0; /* dw_direct_body's offsets within an image (and its padding) are 32-bit */
    pl->direct = 1 + ci;
    pl->vec = d->cpt;
    pl->cvb = p->layout == CONVD_LAYOUT_NCHW ? g->wo / d->p : cvn;
    pl->strips = d->th;
    pl->p = d->p;
    pl->tiles_h = bands;
    pl->threads = 256;
    pl->blocks_per_problem = (int)(((d->flat ? threads : row_threads) + 255) / 256);
    pl->grid_y = d->flat ? 1 : g->n * bands;
    pl->smem = 0;
    return 1;
}

int gpu_dw_plan_make(const struct convd_problem *p, const struct convd_gpu_policy *pol,
                     struct gpu_dw_plan *ret, char *why, size_t why_len)
{
    struct gpu_dw_plan pl;
    memset(&pl, 0, sizeof(pl));
    gpu_geom_from_problem(p, &pl.g);
    pl.dtype = p->dtype;
    pl.layout = p->layout;
    const struct gpu_geom *g = &pl.g;
    if (g->cpg != 1 || g->kpg > 2) {
        snprintf(why, why_len, "depthwise: needs 1 channel per group and at most 2 outputs");
        return CONVD_EUNSUPPORTED;
    }
    pl.unit = dw_smax(p);
    const int rs = g->r * g->s;
    if (dw_direct_plan(p, g, pol, &pl)) {
        *ret = pl;
        return 0;
    }
    if (p->layout == CONVD_LAYOUT_NHWC) {
        const int es = (int)convd_dtype_size(p->dtype);
        pl.vec = 16 / es;
        if (g->c % pl.vec != 0) {
            snprintf(why, why_len, "depthwise: C=%d is not a multiple of the %d-channel vector",
                     g->c, pl.vec);
            return CONVD_EUNSUPPORTED;
        }
        const int cpl = es == 2 ? 2 : 1;
        const int P = pl.unit != 0 && g->kpg == 1 ? 8 : 4;
        if (g->kpg == 2 && pl.unit > 3)
            pl.unit = 0; /* two outputs per channel and a wide window: too many registers */
        const int cb = 32 * cpl;
        /* Tile width: a multiple of P that wastes least of the row, at most 8 strips. */
        const int wr = (g->wo + P - 1) / P * P;
        int tw = P, best = 1 << 30;
        for (int k = 1; k <= 8; k++) {
            const int t = k * P;
            const int waste = ((wr + t - 1) / t) * t - g->wo;
            if (waste < best || (waste == best && t > tw)) {
                best = waste;
                tw = t;
            }
            if (t >= wr)
                break;
        }
        /* About 32 strips for small filters, 16 for wide ones (smaller halo, more blocks). */
        int th = ((g->s > 3 ? 16 : 32) * P) / tw;
        if (th < 1)
            th = 1;
        if (th > g->ho)
            th = g->ho;
        for (;;) {
            const int ih = (th - 1) * g->sh + (g->r - 1) * g->dh + 1;
            const int iw = (tw - 1) * g->sw + (g->s - 1) * g->dw + 1;
            const int ps = cb * es;
            const int bytes = ((ih * iw * ps + 15) & ~15) + rs * cb * g->kpg * 4;
            if (bytes <= 100 * 1024) {
                pl.in_rows = ih;
                pl.in_cols = iw;
                pl.smem = bytes;
                break;
            }
            if (th == 1) {
                snprintf(why, why_len, "depthwise: halo tile too large for shared memory");
                return CONVD_EUNSUPPORTED;
            }
            th = (th + 1) / 2;
        }
        pl.cvb = cb;
        pl.strips = th;
        pl.tw = tw;
        pl.p = P;
        pl.threads = 256;
        pl.tiles_h = (g->ho + th - 1) / th;
        pl.tiles_w = (g->wo + tw - 1) / tw;
        const int64_t blocks = (int64_t)g->n * pl.tiles_h * pl.tiles_w * ((g->c + cb - 1) / cb);
        if (blocks > 0x7fffffff) {
            snprintf(why, why_len, "depthwise: grid too large");
            return CONVD_EUNSUPPORTED;
        }
        pl.blocks_per_problem = (int)blocks;
    } else {
        const int sx = (g->wo + DW_P - 1) / DW_P;
        if (sx > 256) {
            snprintf(why, why_len, "depthwise: output rows wider than %d", 256 * DW_P);
            return CONVD_EUNSUPPORTED;
        }
        int th = 256 / sx;
        if (th > g->ho)
            th = g->ho;
        const int icols = (sx * DW_P - 1) * g->sw + (g->s - 1) * g->dw + 1;
        for (;;) {
            const int ir = (th - 1) * g->sh + (g->r - 1) * g->dh + 1;
            const int bytes = (ir * icols + g->kpg * rs) * (int)sizeof(float);
            if (bytes <= 48 * 1024) {
                pl.in_rows = ir;
                pl.smem = bytes;
                break;
            }
            if (th == 1) {
                snprintf(why, why_len, "depthwise: input rows too large for shared memory");
                return CONVD_EUNSUPPORTED;
            }
            th = (th + 1) / 2;
        }
        pl.in_cols = icols;
        pl.strips = th;
        pl.cvb = sx;
        pl.threads = th * sx;
        pl.tiles_h = (g->ho + th - 1) / th;
        if ((int64_t)g->n * g->c * pl.tiles_h > 0x7fffffff) {
            snprintf(why, why_len, "depthwise: grid too large");
            return CONVD_EUNSUPPORTED;
        }
        pl.blocks_per_problem = g->n * g->c * pl.tiles_h;
        /* Whole planes that leave most of a block idle: several per block (as many as fit in
         * 256 threads and 48 KiB), while that still leaves two blocks per SM. */
        const int nplanes = g->n * g->c;
        if (pl.tiles_h == 1 && pl.threads <= 128) {
            struct gpu_device_info dev;
            const int sms = gpu_device_info_get(&dev) == 0 ? dev.sm_count : 132;
            int pp = 256 / pl.threads;
            if (pp > 48 * 1024 / pl.smem)
                pp = 48 * 1024 / pl.smem;
            if (pp > nplanes / (2 * sms))
                pp = nplanes / (2 * sms);
            if (pp >= 2) {
                pl.planes = pp;
                pl.threads *= pp;
                pl.smem *= pp;
                pl.blocks_per_problem = (nplanes + pp - 1) / pp;
            }
        }
    }
    *ret = pl;
    return 0;
}

template <class DT, int CPL>
static int dw_launch_nhwc(const struct gpu_dw_plan *pl, const struct gpu_batch *b, int count,
                          const struct gpu_launch *ln)
{
    const struct gpu_geom *g = &pl->g;
    struct dwt_args a;
    a.cb = pl->cvb;
    a.cblocks = (g->c + a.cb - 1) / a.cb;
    a.th = pl->strips;
    a.tw = pl->tw;
    a.tiles_h = pl->tiles_h;
    a.tiles_w = pl->tiles_w;
    a.ih = pl->in_rows;
    a.iw = pl->in_cols;
    a.ps = a.cb * (int)sizeof(typename DT::T);
    dim3 grid((unsigned)pl->blocks_per_problem, 1, (unsigned)count);
    dim3 block((unsigned)pl->threads);
    int rc = 0;
#define DW_GO(KPG, P, SMAX)                                                                        \
    do {                                                                                           \
        rc = gpu_allow_smem((const void *)dw_nhwc_kernel<DT, CPL, KPG, P, SMAX>, pl->smem);        \
        if (rc == 0)                                                                               \
            GPU_LAUNCH((dw_nhwc_kernel<DT, CPL, KPG, P, SMAX>), grid, block, pl->smem, ln, *g, *b, \
                       a);                                                                         \
    } while (0)
    if (g->kpg == 1) {
        if (pl->unit == 3)
            DW_GO(1, 8, 3);
        else if (pl->unit == 5)
            DW_GO(1, 8, 5);
        else if (pl->unit == 7)
            DW_GO(1, 8, 7);
        else
            DW_GO(1, 4, 0);
    } else {
        if (pl->unit == 3)
            DW_GO(2, 4, 3);
        else
            DW_GO(2, 4, 0);
    }
#undef DW_GO
    if (rc != 0)
        return rc;
    CONVD_GPU_CHECK(hipGetLastError());
    return 0;
}

/* Min blocks per SM of an NHWC row's instance: the row's, but 2 for fp32 3x3 at 2 channels,
 * kpg 2 and 2 rows (row 3, the small-image swap of row 1, which has 2): ptxas (sm_90) spills it 4
 * to 8 bytes at the 80 registers of 3 blocks in every order of its work tried, its filter and
 * accumulators alone being 68 (bench/gpu/NOTES.md, round 15). */
static constexpr int dw_direct_minb(int dtype, int cpt, int kpg, int ks, int sh, int th, int minb)
{
    return dtype == CONVD_DTYPE_FP32 && cpt == 2 && kpg == 2 && ks == 3 && sh == 1 && th == 2
               ? 2
               : minb;
}

/* The kernel of a row of DW_DCFGS for DT: NHWC rows instantiate dw_direct_kernel, NCHW rows
 * dw_nchw_direct_kernel (CPT, P, SPLIT and HINT are NHWC's only); NULL where the row is not
 * built for DT (dw_row_built), which then instantiates nothing. */
typedef void (*dw_direct_fn)(const struct gpu_geom, const struct gpu_batch, int, int);
template <class DT, int LAY, int KS, int SH, int CPT, int KPG, int TH, int P, int SPLIT, int MINB,
          int HINT, int FLAT>
static constexpr dw_direct_fn dw_direct_pick()
{
    if constexpr (!dw_row_built(dw_row_index(LAY, KS, SH, CPT, KPG, TH, P, FLAT), DT::id))
        return nullptr;
    else if constexpr (LAY == DW_NCHW)
        return dw_nchw_direct_kernel<DT, KS, SH, TH, MINB>;
    else
        return dw_direct_kernel<DT, CPT, KPG, KS, SH, TH, P, SPLIT != 0,
                                dw_direct_minb(DT::id, CPT, KPG, KS, SH, TH, MINB), HINT != 0,
                                FLAT != 0>;
}

template <class DT>
static int dw_launch_direct(const struct gpu_dw_plan *pl, const struct gpu_batch *b, int count,
                            const struct gpu_launch *ln)
{
    const struct gpu_geom *g = &pl->g;
    dim3 grid((unsigned)pl->blocks_per_problem, (unsigned)pl->grid_y, (unsigned)count);
    dim3 block((unsigned)pl->threads);
#define DW_DCFG_FN(LAY, KS, SH, CPT, KPG, TH, P, SPLIT, MINB, HINT, FLAT, DTYPES)                  \
    dw_direct_pick<DT, LAY, KS, SH, CPT, KPG, TH, P, SPLIT, MINB, HINT, FLAT>(),
    static const dw_direct_fn fns[] = {DW_DCFGS(DW_DCFG_FN)};
#undef DW_DCFG_FN
    const int ci = pl->direct - 1;
    if (ci < 0 || ci >= DW_NDCFG || fns[ci] == NULL)
        return CONVD_EINVAL;
    GPU_LAUNCH(fns[ci], grid, block, 0, ln, *g, *b, pl->cvb, pl->tiles_h);
    CONVD_GPU_CHECK(hipGetLastError());
    return 0;
}

template <class DT>
static int dw_launch_nchw(const struct gpu_dw_plan *pl, const struct gpu_batch *b, int count,
                          const struct gpu_launch *ln)
{
    const struct gpu_geom *g = &pl->g;
    dim3 grid((unsigned)pl->blocks_per_problem, 1, (unsigned)count);
    dim3 block((unsigned)pl->threads);
#define DW_GO(SMAX, SW)                                                                            \
    do {                                                                                           \
        if (pl->planes > 1)                                                                        \
            GPU_LAUNCH((dw_nchw_planes_kernel<DT, SMAX, SW>), grid, block, pl->smem, ln, *g, *b,   \
                       pl->strips, pl->cvb, pl->planes, pl->in_rows, pl->in_cols);                 \
        else                                                                                       \
            GPU_LAUNCH((dw_nchw_kernel<DT, SMAX, SW>), grid, block, pl->smem, ln, *g, *b,          \
                       pl->strips, pl->cvb, pl->tiles_h, pl->in_rows, pl->in_cols);                \
    } while (0)
    if (pl->unit == 3 && g->sw == 2)
        DW_GO(3, 2);
    else if (pl->unit == 3)
        DW_GO(3, 1);
    else if (pl->unit > 3 && g->sw == 2)
        DW_GO(7, 2);
    else if (pl->unit == 5)
        DW_GO(5, 1);
    else if (pl->unit == 7)
        DW_GO(7, 1);
    else
        DW_GO(0, 1);
#undef DW_GO
    CONVD_GPU_CHECK(hipGetLastError());
    return 0;
}

int gpu_dw_launch(const struct gpu_dw_plan *pl, const struct gpu_batch *b, int count,
                  const struct gpu_launch *ln)
{
    const int nhwc = pl->layout == CONVD_LAYOUT_NHWC;
    if (pl->direct) {
        switch (pl->dtype) {
        case CONVD_DTYPE_FP32:
            return dw_launch_direct<dt_f32>(pl, b, count, ln);
        case CONVD_DTYPE_FP16:
            return dw_launch_direct<dt_f16>(pl, b, count, ln);
        case CONVD_DTYPE_BF16:
            return dw_launch_direct<dt_bf16>(pl, b, count, ln);
        }
        return CONVD_EINVAL;
    }
    switch (pl->dtype) {
    case CONVD_DTYPE_FP32:
        return nhwc ? dw_launch_nhwc<dt_f32, 1>(pl, b, count, ln)
                    : dw_launch_nchw<dt_f32>(pl, b, count, ln);
    case CONVD_DTYPE_FP16:
        return nhwc ? dw_launch_nhwc<dt_f16, 2>(pl, b, count, ln)
                    : dw_launch_nchw<dt_f16>(pl, b, count, ln);
    case CONVD_DTYPE_BF16:
        return nhwc ? dw_launch_nhwc<dt_bf16, 2>(pl, b, count, ln)
                    : dw_launch_nchw<dt_bf16>(pl, b, count, ln);
    }
    return CONVD_EINVAL;
}
