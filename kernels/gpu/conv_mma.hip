/*
 * Tensor-core implicit GEMM for fp16/bf16 (NVIDIA mma.sync m16n8k16, fp32 accumulation), and for
 * fp32 with TF32 allowed as pairs of 16-bit units (m16n8k8 TF32; see mma_dt).
 *
 * Per group the convolution is a GEMM: M = output pixels, N = kpg, K = R*S*cpg. Groups whose cpg
 * or kpg is not a multiple of 8 are merged gm at a time (gm = 2 or 4) into a super-group with a
 * block-diagonal weight matrix, so cpg 2 and 4 also reach the tensor cores (wasting part of each
 * tile costs less than the FMA units would).
 *
 * A block owns a spatial tile of output pixels (imgs images x th rows x tw columns, bm slots) and
 * bn output channels (whole super-groups, or a slice of one). Shared memory holds:
 *  - A: the input halo of the tile for the block's channels, [pixel][channel], copied from NHWC
 *    with 16-byte cp.async (zero-filled outside the image): every filter tap then reads the same
 *    halo at a shifted address, so the input crosses L2 about once instead of R*S times;
 *  - B: the weights of the block's outputs, [n][tap*kc + c], which is the NHWC weight layout
 *    itself (rows padded to an odd number of 16-byte units so ldmatrix is conflict-free).
 * The K dimension is walked in 8-channel octets (tap, c8); a k16 step is two octets, whose A
 * rows ldmatrix gathers with per-lane addresses from a small table of tap offsets, so octets of
 * different taps mix freely and every cpg that is a multiple of 8 runs full k16 steps.
 *
 * The grid is persistent: each block walks a contiguous range of work items (problem, n-block,
 * tile), prefetching the next item's halo with cp.async while the current one computes; weights
 * stay resident while the n-block does not change. Large cpg is split in chunks of kc channels,
 * then halo and weights are double-buffered per chunk. The epilogue (bias, activation,
 * rounding) goes through shared memory so global stores are 16-byte and coalesced (NHWC) or
 * pixel-contiguous (NCHW). NCHW input is gathered with ordinary loads (it has to be transposed on
 * the way in).
 *
 * On sm_90, NHWC problems whose block channels are one chunk run mma_tma_kernel instead: the halo
 * and the output tile each move as one tensor copy per item (see its comment), which measured
 * faster on every NHWC shape of the suite.
 *
 * This file holds the kernels and their launch; the planner that picks a plan for them is
 * mma_plan.hip, the PTX primitives they use gpu_async.h.
 */
#include <pthread.h>

#include "conv_mma.h"
#include "mix.h"

#define MMA_U 8

struct mma_args {
    struct gpu_geom g;
    int gm, cpgm, kpgm, bn, sgb, nsplit, nblk, gms;
    int imgs, th, tw, tiles_h, tiles_w, tiles;
    int ih, iw, kc, nchunks, noct, nk16, cbc, ps, brs;
    int off_a0, off_a1, off_b0, off_b1, off_oct, off_stage, stage_sep;
    int fast_w;
    int out_nchw; /* NHWC input (a transposed copy), NCHW output */
    int items;    /* count * nblk * tiles < 2^31 (tiles and outputs are bounded by it) */
    /* The item decode's divisors (mma_decode runs twice per item in every thread). */
    struct convd_math_fdiv fd_tiles, fd_nblk, fd_tiles_w, fd_tiles_h;
    /* mma_load_a's and the NHWC epilogue's per-thread decodes, once per item. */
    struct convd_math_fdiv fd_vpp, fd_kc8, fd_hplane, fd_iw, fd_vpr, fd_tplane, fd_tw;
    /* mma_load_b's, per element (block-diagonal) or per 8-element vector. */
    struct convd_math_fdiv fd_kt, fd_kt8, fd_kc, fd_cpg, fd_kpgm, fd_kpg;
    int halo_vpt; /* NHWC halo vectors per thread (mma_halo_nhwc), 0: mma_halo_nhwc_any */
    struct convd_math_fdiv fd_tpp;
    int out_vpt;  /* NHWC copy-out columns per thread (mma_out_nhwc), 0: the any-shape loop */
    int merged_w; /* 4 or 2: mma_load_b_merged for groups of that many channels, else 0 */
    struct convd_math_fdiv fd_tpr;
    /* Tensor-copy kernel (mma_tma_kernel): second staging buffer, the A mbarriers (one per ring
     * buffer), the halo box's bytes, and the swizzle masks of A and staging (mma_swizzle_mask; 0
     * for plain or padded rows). */
    int off_stage1, off_bar, a_tx, smask_a, smask_s;
    int nst, a_stride; /* A stages (a ring from off_a0) and their spacing */
    int prefetch;      /* L2 prefetch of the first item before the grid dependency */
};

#if defined(CONVD_GPU_NVIDIA)
/* Tensor maps of the tensor-copy kernel, passed by value (__grid_constant__): input and output of
 * up to MMA_TMA_PROBS problems per launch (larger batches take several launches). */
#define MMA_TMA_PROBS 8
struct mma_tmaps {
    CUtensorMap x[MMA_TMA_PROBS];
    CUtensorMap y[MMA_TMA_PROBS];
};
#endif

#if defined(CONVD_GPU_NVIDIA)

#if defined(CONVD_MMA_TRACE)
#define MMA_TRACE_BLOCKS CONVD_MMA_TRACE_BLOCKS
#define MMA_TRACE_EV     CONVD_MMA_TRACE_EVENTS
#define MMA_TRACE_EV_END (MMA_TRACE_EV - 1)
__device__ unsigned long long mma_trace[MMA_TRACE_BLOCKS][MMA_TRACE_EV];
GPU_D void mma_tr(int ev)
{
    if (threadIdx.x == 0 && blockIdx.x < MMA_TRACE_BLOCKS && ev < MMA_TRACE_EV) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        mma_trace[blockIdx.x][ev] = t | ((unsigned long long)sm << 56);
    }
}
#define MMA_TR(ev) mma_tr(ev)
#else
#define MMA_TR(ev)       ((void)0)
#define MMA_TRACE_EV_END 0
#endif

/*
 * The family's view of a dtype (DT: dt_f16, dt_bf16 or dt_tf32x2): T, the 16-bit unit the loaders
 * stage and ldmatrix reads; OT, what the epilogue writes (OES bytes) and the bias is; the mma of
 * one k16 step; TF32, whether fragment registers are rounded (mma_frag4) before it.
 *
 * fp32 with TF32 allowed runs as pairs of 16-bit units (dt_tf32x2): an fp32 channel is two units,
 * so the halo, the weights, the octets and the ldmatrix fragments of a k16 step hold byte for byte
 * what they hold for a 16-bit problem of twice the channels, and they are the fragments of one
 * m16n8k8 TF32 mma: 32-bit word j of row r of an 8x8 b16 matrix is element (r, j) of the 8x4 fp32
 * matrix in the same bytes, for A and B alike, and the k16 step's four (A) and two (B) matrices
 * sit where the k8 step's do. The planner doubles C and cpg; K, the output and the bias stay
 * fp32. Fragments are rounded to TF32 as cuBLAS and the fma family's TF32 tiles round (nearest,
 * ties away), once per ldmatrix.
 */
struct dt_tf32x2 {
};

template <class DT> struct mma_dt {
    typedef typename DT::T T;
    typedef typename DT::T OT;
    static constexpr int OES = 2;
    static constexpr bool TF32 = false;
    static GPU_D float bias(const OT *b, int k)
    {
        return DT::load(b[k]);
    }
    static GPU_D void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
    {
        gpu_mma_op<DT>::run(c, a, b0, b1);
    }
    /* Outputs n and n + 1 of a pixel, adjacent ([m][n] staging). */
    static GPU_D void put_row(uint8_t *p, float lo, float hi)
    {
        *(uint32_t *)p = DT::store2(lo, hi);
    }
    /* The same outputs into two channel rows ([n][m] staging). */
    static GPU_D void put_col(uint8_t *p0, uint8_t *p1, float lo, float hi)
    {
        const uint32_t v = DT::store2(lo, hi);
        *(uint16_t *)p0 = (uint16_t)v;
        *(uint16_t *)p1 = (uint16_t)(v >> 16);
    }
};

template <> struct mma_dt<dt_tf32x2> {
    typedef uint16_t T;
    typedef float OT;
    static constexpr int OES = 4;
    static constexpr bool TF32 = true;
    static GPU_D float bias(const OT *b, int k)
    {
        return b[k];
    }
    static GPU_D void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
    {
        gpu_mma_tf32(c, a, b0, b1);
    }
    static GPU_D void put_row(uint8_t *p, float lo, float hi)
    {
        *(float2 *)p = make_float2(lo, hi);
    }
    static GPU_D void put_col(uint8_t *p0, uint8_t *p1, float lo, float hi)
    {
        *(float *)p0 = lo;
        *(float *)p1 = hi;
    }
};

/* A TF32 fragment register rounded to nearest, ties away (cvt.rna; mma_dt<dt_tf32x2>); four at
 * once. */
GPU_D uint32_t mma_tf32_bits(uint32_t r)
{
    return __float_as_uint(gpu_to_tf32(__uint_as_float(r)));
}

GPU_D void mma_frag4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3)
{
    r0 = mma_tf32_bits(r0);
    r1 = mma_tf32_bits(r1);
    r2 = mma_tf32_bits(r2);
    r3 = mma_tf32_bits(r3);
}

/* Where a work item sits: problem, image/tile origin, output channels and input channels. */
struct mma_item {
    int prob, n0, oh0, ow0;
    int k0, kend, ch0, nsg;
};

GPU_D struct mma_item mma_decode(const struct mma_args &a, int item)
{
    struct mma_item it;
    const int q = (int)convd_math_fdiv_div((uint32_t)item, a.fd_tiles);
    int tile = item - q * a.tiles;
    it.prob = (int)convd_math_fdiv_div((uint32_t)q, a.fd_nblk);
    const int nb = q - it.prob * a.nblk;
    const int trow = (int)convd_math_fdiv_div((uint32_t)tile, a.fd_tiles_w);
    const int tw_i = tile - trow * a.tiles_w;
    tile = trow;
    const int timg = (int)convd_math_fdiv_div((uint32_t)tile, a.fd_tiles_h);
    const int th_i = tile - timg * a.tiles_h;
    it.n0 = timg * a.imgs;
    it.oh0 = th_i * a.th;
    it.ow0 = tw_i * a.tw;
    if (a.sgb > 0) {
        const int sg0 = nb * a.sgb;
        it.nsg = min(a.sgb, a.gms - sg0);
        it.k0 = sg0 * a.kpgm;
        it.kend = it.k0 + it.nsg * a.kpgm;
        it.ch0 = sg0 * a.cpgm;
    } else {
        const int sg = nb / a.nsplit;
        it.nsg = 1;
        it.k0 = sg * a.kpgm + (nb % a.nsplit) * a.bn;
        it.kend = min(it.k0 + a.bn, (sg + 1) * a.kpgm); /* partial n-blocks (mma_partial_n) */
        it.ch0 = sg * a.cpgm;
    }
    return it;
}

/*
 * The NHWC halo of one item and chunk into A, 16-byte cp.async per 8-channel vector. VPT vectors
 * per thread of one pixel (vpp / VPT threads per pixel, a divisor of the block): the thread keeps
 * its vectors' channel offsets and walks pixels, so a pixel's decode, bounds and address serve
 * VPT copies (it was 57 instructions per copy with one vector per thread). Its vectors are
 * vpp / VPT apart, so that each copy instruction of a warp covers adjacent vectors. Pixel indices
 * are 32-bit (the API keeps every tensor below 2^31 elements).
 */
template <class T, int VPT>
GPU_D void mma_halo_nhwc(const struct mma_args &a, const struct mma_item &it, const T *x, int c0,
                         uint32_t abase, int tid, int nthr, int ih0, int iw0, int hpix)
{
    const struct gpu_geom &g = a.g;
    const int vpp = a.cbc >> 3, tpp = vpp / VPT, kc8 = a.kc >> 3;
    const gpu_div_fast by_tpp{a.fd_tpp};
    const int pix0 = by_tpp.div(tid), cv0 = tid - pix0 * tpp;
    const T *xc[VPT];
    bool cvalid[VPT];
#pragma unroll
    for (int j = 0; j < VPT; j++) {
        const int cv = cv0 + j * tpp;
        const int sgl = gpu_div_fast{a.fd_kc8}.div(cv), c = c0 + (cv - sgl * kc8) * 8;
        cvalid[j] = sgl < it.nsg && c < a.cpgm;
        xc[j] = x + it.ch0 + sgl * a.cpgm + c;
    }
    const int pstep = by_tpp.div(nthr);
    struct gpu_walk wk;
    gpu_walk_init_by(&wk, pix0, pstep, a.ih, a.iw, gpu_div_fast{a.fd_hplane},
                     gpu_div_fast{a.fd_iw});
    for (int pix = pix0; pix < hpix; pix += pstep, gpu_walk_step(&wk, a.ih, a.iw)) {
        const int n = it.n0 + wk.hi, ih = ih0 + wk.mid, iw = iw0 + wk.lo;
        const bool pvalid = n < g.n && convd_math_inside(ih, g.h) && convd_math_inside(iw, g.w);
        const size_t po = pvalid ? (size_t)(uint32_t)((n * g.h + ih) * g.w + iw) * g.c : 0;
        const uint32_t dst = abase + pix * a.ps + cv0 * 16;
#pragma unroll
        for (int j = 0; j < VPT; j++) {
            const bool valid = pvalid && cvalid[j];
            gpu_cp16_s(dst + j * tpp * 16, valid ? xc[j] + po : x, valid);
        }
    }
}

/* The same for any vpp and block size: one (pixel, vector) per step, decoded by host-made
 * divisors. */
template <class T>
GPU_D void mma_halo_nhwc_any(const struct mma_args &a, const struct mma_item &it, const T *x,
                             int c0, uint32_t abase, int tid, int nthr, int ih0, int iw0, int hpix)
{
    const struct gpu_geom &g = a.g;
    const int vpp = a.cbc >> 3, kc8 = a.kc >> 3, ihw = a.ih * a.iw;
    for (int v = tid; v < hpix * vpp; v += nthr) {
        const int pix = gpu_div_fast{a.fd_vpp}.div(v), cv = v - pix * vpp;
        const int sgl = gpu_div_fast{a.fd_kc8}.div(cv), c = c0 + (cv - sgl * kc8) * 8;
        const int img = gpu_div_fast{a.fd_hplane}.div(pix), rem = pix - img * ihw;
        const int ihl = gpu_div_fast{a.fd_iw}.div(rem), iwl = rem - ihl * a.iw;
        const int n = it.n0 + img, ih = ih0 + ihl, iw = iw0 + iwl;
        const bool valid = n < g.n && convd_math_inside(ih, g.h) && convd_math_inside(iw, g.w) &&
                           sgl < it.nsg && c < a.cpgm;
        const T *src = valid ? x + (size_t)(uint32_t)((n * g.h + ih) * g.w + iw) * g.c + it.ch0 +
                                   sgl * a.cpgm + c
                             : x;
        gpu_cp16_s(abase + pix * a.ps + cv * 16, src, valid);
    }
}

/* Copies the halo of one item and chunk into A. */
template <class DT, int NHWC>
GPU_D void mma_load_a(const struct mma_args &a, const struct gpu_batch &b,
                      const struct mma_item &it, int c0, uint8_t *abuf, int tid, int nthr)
{
    typedef typename mma_dt<DT>::T T;
    const struct gpu_geom &g = a.g;
    const T *x = (const T *)b.x[it.prob];
    const int ihw = a.ih * a.iw;
    const int hpix = a.imgs * ihw;
    const int ih0 = it.oh0 * g.sh - g.pt, iw0 = it.ow0 * g.sw - g.pl;
    if (NHWC) {
        const uint32_t abase = gpu_smem_addr(abuf);
        if (a.halo_vpt == 3)
            mma_halo_nhwc<T, 3>(a, it, x, c0, abase, tid, nthr, ih0, iw0, hpix);
        else if (a.halo_vpt == 2)
            mma_halo_nhwc<T, 2>(a, it, x, c0, abase, tid, nthr, ih0, iw0, hpix);
        else if (a.halo_vpt == 1)
            mma_halo_nhwc<T, 1>(a, it, x, c0, abase, tid, nthr, ih0, iw0, hpix);
        else
            mma_halo_nhwc_any<T>(a, it, x, c0, abase, tid, nthr, ih0, iw0, hpix);
    } else {
        /* NCHW: the layout is transposed on the way in. A warp takes (channel, image, halo row)
         * units, its lanes the row's columns (coalesced loads); four units' loads are in flight
         * before the first shared-memory store, and index math is per unit, not per element. */
        const int lane = tid & 31, wid = tid >> 5, nw = nthr >> 5;
        const int rows = a.imgs * a.ih, units = a.cbc * rows;
        for (int cb0 = 0; cb0 < a.iw; cb0 += 64) {
            for (int u0 = wid; u0 < units; u0 += 4 * nw) {
                T v[4][2];
                int dst[4];
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const int u = u0 + r * nw;
                    v[r][0] = v[r][1] = 0;
                    dst[r] = -1;
                    if (u < units) {
                        const int cb = u / rows, rr = u - cb * rows;
                        const int img = rr / a.ih, ihl = rr - img * a.ih;
                        const int sgl = cb / a.kc, c = c0 + cb - sgl * a.kc;
                        const int n = it.n0 + img, ih = ih0 + ihl;
                        dst[r] = rr * a.iw * a.ps + cb * 2;
                        if (n < g.n && convd_math_inside(ih, g.h) && sgl < it.nsg && c < a.cpgm) {
                            const T *row =
                                x +
                                ((size_t)(n * g.c + it.ch0 + sgl * a.cpgm + c) * g.h + ih) * g.w;
#pragma unroll
                            for (int j = 0; j < 2; j++) {
                                const int col = cb0 + lane + 32 * j, iw = iw0 + col;
                                if (col < a.iw && convd_math_inside(iw, g.w))
                                    v[r][j] = row[iw];
                            }
                        }
                    }
                }
#pragma unroll
                for (int r = 0; r < 4; r++)
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const int col = cb0 + lane + 32 * j;
                        if (dst[r] >= 0 && col < a.iw)
                            *(T *)(abuf + dst[r] + col * a.ps) = v[r][j];
                    }
            }
        }
    }
}

/*
 * B for merged groups of CPG = 4 or 2 channels (8 per super-group, one chunk): each 16-byte
 * octet of a row is one tap of the super-group, whose only non-zero part is the output's own
 * group, CPG contiguous weights; one 8- or 4-byte load and one 16-byte store per octet, where an
 * element-wise loader spends tens of instructions per element.
 */
template <class T, int CPG>
GPU_D void mma_load_b_merged(const struct mma_args &a, const struct mma_item &it, const T *w,
                             uint8_t *bbuf, int tid, int nthr)
{
    static_assert(CPG == 2 || CPG == 4, "two or four channels per group");
    const struct gpu_geom &g = a.g;
    const int rs = g.r * g.s, vpr = a.nk16 * 2;
    const gpu_div_fast by_vpr{a.fd_kt8};
    for (int v = tid; v < a.bn * vpr; v += nthr) {
        const int nl = by_vpr.div(v), tap = v - nl * vpr, k = it.k0 + nl;
        uint32_t q[4] = {0u, 0u, 0u, 0u};
        if (k < it.kend && tap < rs) {
            const int kq = gpu_div_fast{a.fd_kpgm}.div(k);
            const int sub = gpu_div_fast{a.fd_kpg}.div(k - kq * a.kpgm);
            const T *src = w + ((size_t)k * rs + tap) * CPG;
            if (CPG == 4) {
                const uint2 u = *(const uint2 *)src;
                q[0] = sub == 0 ? u.x : 0u;
                q[1] = sub == 0 ? u.y : 0u;
                q[2] = sub == 1 ? u.x : 0u;
                q[3] = sub == 1 ? u.y : 0u;
            } else {
                const uint32_t u = *(const uint32_t *)src;
#pragma unroll
                for (int i = 0; i < 4; i++)
                    q[i] = sub == i ? u : 0u;
            }
        }
        *(uint4 *)(bbuf + nl * a.brs + tap * 16) = make_uint4(q[0], q[1], q[2], q[3]);
    }
}

/* Copies the weights of one item's outputs and chunk into B: [n][tap * kc + c], zero padded,
 * block-diagonal when groups are merged. */
template <class DT, int NHWC>
GPU_D void mma_load_b(const struct mma_args &a, const struct gpu_batch &b,
                      const struct mma_item &it, int c0, uint8_t *bbuf, int tid, int nthr)
{
    typedef typename mma_dt<DT>::T T;
    const struct gpu_geom &g = a.g;
    const T *w = (const T *)b.w[it.prob];
    const int rs = g.r * g.s;
    const int kt = a.nk16 * 16;
    const int kflat = rs * a.kc;
    const gpu_div_fast by_kc{a.fd_kc};
    if (NHWC && a.merged_w == 4) {
        mma_load_b_merged<T, 4>(a, it, w, bbuf, tid, nthr);
    } else if (NHWC && a.merged_w == 2) {
        mma_load_b_merged<T, 2>(a, it, w, bbuf, tid, nthr);
    } else if (a.fast_w) {
        const int vpr = kt >> 3;
        const gpu_div_fast by_vpr{a.fd_kt8};
        const uint32_t bbase = gpu_smem_addr(bbuf);
        for (int v = tid; v < a.bn * vpr; v += nthr) {
            const int nl = by_vpr.div(v), q = (v - nl * vpr) * 8;
            const int tap = by_kc.div(q), c = c0 + q - tap * a.kc;
            const int k = it.k0 + nl;
            const bool valid = k < it.kend && q < kflat && c < a.cpgm;
            const T *src = valid ? w + ((size_t)k * rs + tap) * g.cpg + c : w;
            gpu_cp16_s(bbase + nl * a.brs + (q >> 3) * 16, src, valid);
        }
    } else {
        const int nel = a.bn * kt;
        for (int base = tid; base < nel; base += MMA_U * nthr) {
            T v[MMA_U];
            int dst[MMA_U];
#pragma unroll
            for (int u = 0; u < MMA_U; u++) {
                const int e = base + u * nthr;
                v[u] = 0;
                dst[u] = -1;
                if (e < nel) {
                    const int nl = gpu_div_fast{a.fd_kt}.div(e), q = e - nl * kt;
                    const int tap = by_kc.div(q), cc = c0 + q - tap * a.kc;
                    const int k = it.k0 + nl;
                    dst[u] = nl * a.brs + q * 2;
                    if (k < it.kend && q < kflat && cc < a.cpgm) {
                        const int sub = gpu_div_fast{a.fd_cpg}.div(cc);
                        const int kq = gpu_div_fast{a.fd_kpgm}.div(k);
                        if (sub == gpu_div_fast{a.fd_kpg}.div(k - kq * a.kpgm)) {
                            const int c = cc - sub * g.cpg;
                            v[u] = NHWC ? w[((size_t)k * rs + tap) * g.cpg + c]
                                        : w[((size_t)k * g.cpg + c) * rs + tap];
                        }
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < MMA_U; u++)
                if (dst[u] >= 0)
                    *(T *)(bbuf + dst[u]) = v[u];
        }
    }
}

/* Bias and activation on the accumulators in place (the caller skips it when there are neither: the
 * plain epilogue is a conversion and a store per two values; bias and ReLU add an add, a compare
 * and a select per value). */
template <class DT, int MT, int NT>
GPU_D void mma_bias_act(float (&acc)[MT][NT][4], const typename mma_dt<DT>::OT *bias,
                        const struct mma_item &it, const struct gpu_geom &g, int wn, int lane)
{
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int k = it.k0 + wn * NT * 8 + nt * 8 + 2 * (lane & 3);
        float b0 = 0.0f, b1 = 0.0f;
        if (g.bias && k < it.kend) {
            b0 = mma_dt<DT>::bias(bias, k);
            b1 = mma_dt<DT>::bias(bias, k + 1);
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[mt][nt][i] = gpu_epilogue(acc[mt][nt][i], i & 1 ? b1 : b0, g);
    }
}

/* The epilogue's first half: accumulators (bias and activation applied) -> rounding -> staging, as
 * [m][n] rows of `pitch` bytes (NHWC output: a pixel's channels are one run) or [n][m] (NCHW: a
 * channel's pixels are one run; rows n, n + 1 of a (bm + 8)-element pitch, so that the warp's 8 m
 * and 4 n pairs fall in distinct banks); elements of mma_dt<DT>::OES bytes. smask (NHWC only):
 * staging for a tensor store, whose rows are bn * OES bytes with their 16-byte units swizzled
 * like the store's map (as in
 * mma_mainloop), so the warp's 8 rows x 16 bytes land in distinct banks (plain rows of 96 or 160
 * bytes: two rows per bank group); 0 for the padded pitch of the cp.async kernel. */
template <class DT, int MT, int NT, bool NCHW_OUT>
GPU_D void mma_stage(const float (&acc)[MT][NT][4], uint8_t *stage, int wm, int wn, int lane,
                     int pitch, int smask)
{
    constexpr int ES = mma_dt<DT>::OES;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int n = wn * NT * 8 + nt * 8 + 2 * (lane & 3);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int m = wm * MT * 16 + mt * 16 + (lane >> 2);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float lo = acc[mt][nt][2 * h], hi = acc[mt][nt][2 * h + 1];
                if (NCHW_OUT) {
                    const int mo = (m + 8 * h) * ES;
                    mma_dt<DT>::put_col(stage + n * pitch + mo, stage + (n + 1) * pitch + mo, lo,
                                        hi);
                } else {
                    uint32_t o = (uint32_t)((m + 8 * h) * pitch + n * ES);
                    o ^= (o >> 3) & (uint32_t)smask;
                    mma_dt<DT>::put_row(stage + o, lo, hi);
                }
            }
        }
    }
}

/* The tensor-copy kernel's staging offsets of a lane (mma_stage's, NHWC, swizzled by smask), kept
 * in registers for the whole item loop where they are few (MT * NT <= 8: 16 registers at most):
 * recomputed per item they were about 60 of a warp's 440 instructions per item (resnext50_l2,
 * 112x32 layout). Larger layouts compute them per item (PRE false). */
template <int MT, int NT> struct mma_stage_offs {
    static constexpr bool PRE = MT * NT <= 8;
    uint32_t o[PRE ? MT : 1][PRE ? NT : 1][2];
};

template <int MT, int NT, int ES>
GPU_D void mma_stage_offs_init(mma_stage_offs<MT, NT> &so, int wm, int wn, int lane, int pitch,
                               int smask)
{
    if constexpr (mma_stage_offs<MT, NT>::PRE) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int n = wn * NT * 8 + nt * 8 + 2 * (lane & 3);
                    const int m = wm * MT * 16 + mt * 16 + (lane >> 2) + 8 * h;
                    uint32_t o = (uint32_t)(m * pitch + n * ES);
                    o ^= (o >> 3) & (uint32_t)smask;
                    asm volatile("" : "+r"(o)); /* kept, not recomputed (see mma_abase) */
                    so.o[mt][nt][h] = o;
                }
    }
}

/* mma_stage for NHWC staging through precomputed offsets (or mma_stage itself without them). */
template <class DT, int MT, int NT>
GPU_D void mma_stage_pre(const float (&acc)[MT][NT][4], uint8_t *stage,
                         const mma_stage_offs<MT, NT> &so, int wm, int wn, int lane, int pitch,
                         int smask)
{
    if constexpr (mma_stage_offs<MT, NT>::PRE) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    mma_dt<DT>::put_row(stage + so.o[mt][nt][h], acc[mt][nt][2 * h],
                                        acc[mt][nt][2 * h + 1]);
    } else {
        mma_stage<DT, MT, NT, false>(acc, stage, wm, wn, lane, pitch, smask);
    }
}

/* The NHWC copy-out of one item: each thread keeps VPT 16-byte columns (8 16-bit or 4 fp32
 * outputs; vpr / VPT apart, so a warp's stores cover adjacent columns) and walks output pixels,
 * one decode and address per pixel for VPT 16-byte stores. */
template <class T, int VPT>
GPU_D void mma_out_nhwc(const struct mma_args &a, const struct mma_item &it, T *y,
                        const uint8_t *stage, int pitch, int bm, int tid, int nthr)
{
    const struct gpu_geom &g = a.g;
    constexpr int EPV = 16 / (int)sizeof(T), EPV_LOG = EPV == 8 ? 3 : 2;
    const gpu_div_fast by_tpr{a.fd_tpr};
    const int tpr = (a.bn >> EPV_LOG) / VPT, m0 = by_tpr.div(tid), c80 = tid - m0 * tpr;
    const int mstep = by_tpr.div(nthr);
    struct gpu_walk wk;
    gpu_walk_init_by(&wk, m0, mstep, a.th, a.tw, gpu_div_fast{a.fd_tplane}, gpu_div_fast{a.fd_tw});
    for (int m = m0; m < bm; m += mstep, gpu_walk_step(&wk, a.th, a.tw)) {
        const int n = it.n0 + wk.hi, oh = it.oh0 + wk.mid, ow = it.ow0 + wk.lo;
        if (wk.hi >= a.imgs || n >= g.n || oh >= g.ho || ow >= g.wo)
            continue;
        T *yp = y + (size_t)(uint32_t)((n * g.ho + oh) * g.wo + ow) * g.k + it.k0;
        const uint8_t *sp = stage + m * pitch;
#pragma unroll
        for (int j = 0; j < VPT; j++) {
            const int c8 = c80 + j * tpr;
            if (it.k0 + c8 * EPV < it.kend)
                *(uint4 *)(yp + c8 * EPV) = *(const uint4 *)(sp + c8 * 16);
        }
    }
}

/* The tap-offset table: for each 8-channel octet of a chunk's K, the byte offset of its (tap,
 * channel octet) from a pixel's halo row. */
GPU_D void mma_oct_init(const struct mma_args &a, int *oct, int tid, int nthr)
{
    const struct gpu_geom &g = a.g;
    for (int o = tid; o < a.nk16 * 2; o += nthr) {
        int off = 0;
        if (o < a.noct) {
            const int q = o * 8, tap = q / a.kc, c8 = (q - tap * a.kc) >> 3;
            const int r = tap / g.s, s = tap - r * g.s;
            off = (r * g.dh * a.iw + s * g.dw) * a.ps + c8 * 16;
        }
        oct[o] = off;
    }
}

/* Per-lane A row bases: ldmatrix.x4 lane -> row (lane & 15), k half (lane >> 4). */
template <int MT, int NT>
GPU_D void mma_abase(const struct mma_args &a, int wm, int wn, int lane, int (&abase)[MT])
{
    const struct gpu_geom &g = a.g;
    const int sgl_w = a.sgb > 0 ? (wn * NT * 8) / a.kpgm : 0;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        int p = wm * MT * 16 + mt * 16 + (lane & 15);
        if (p >= a.imgs * a.th * a.tw)
            p = 0;
        const int img = gpu_div_fast{a.fd_tplane}.div(p), rem = p - img * a.th * a.tw;
        const int tr = gpu_div_fast{a.fd_tw}.div(rem), tc = rem - tr * a.tw;
        abase[mt] = ((img * a.ih + tr * g.sh) * a.iw + tc * g.sw) * a.ps + sgl_w * a.kc * 2;
    }
    /* Opaque from here on: the compiler otherwise recomputes the bases (two divisions each) in
     * front of every item's k loop and again for its odd last step rather than keep MT registers
     * live across the item loop, which was about half of the instructions a warp issued. */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
        asm volatile("" : "+r"(abase[mt]));
}

/* The k16 loop of one item and chunk: A fragments by ldmatrix from the halo at the lane's row
 * bases plus the octet's tap offset, B from the weights. SWZ: the halo came by a tensor copy with
 * the 32-, 64- or 128-byte swizzle, so every A address has its 16-byte unit XOR'd with its row
 * bits ((offset >> 3) & smask, the buffer 1024-byte aligned; smask 0 for plain rows). */
template <class DT, int MT, int NT, bool SWZ>
GPU_D void mma_mainloop(float (&acc)[MT][NT][4], const struct mma_args &a, const int *oct,
                        uint32_t sa, const int (&abase)[MT], uint32_t sb, int khalf, int smask)
{
    typedef mma_dt<DT> M;
    for (int ks = 0; ks < a.nk16; ks++) {
        const int off = oct[2 * ks + khalf];
        uint32_t af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            uint32_t o = (uint32_t)(abase[mt] + off);
            if (SWZ)
                o ^= (o >> 3) & (uint32_t)smask;
            gpu_ldsm_x4(sa + o, af[mt][0], af[mt][1], af[mt][2], af[mt][3]);
            if constexpr (M::TF32)
                mma_frag4(af[mt][0], af[mt][1], af[mt][2], af[mt][3]);
        }
        const uint32_t sbk = sb + ks * 32;
#pragma unroll
        for (int nt = 0; nt + 1 < NT; nt += 2) {
            uint32_t b0, b1, b2, b3;
            gpu_ldsm_x4(sbk + nt * 8 * a.brs, b0, b1, b2, b3);
            if constexpr (M::TF32)
                mma_frag4(b0, b1, b2, b3);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                M::mma(acc[mt][nt], af[mt], b0, b1);
                M::mma(acc[mt][nt + 1], af[mt], b2, b3);
            }
        }
        if (NT & 1) {
            uint32_t b0, b1;
            gpu_ldsm_x2(sbk + (NT - 1) * 8 * a.brs, b0, b1);
            if constexpr (M::TF32) {
                b0 = mma_tf32_bits(b0);
                b1 = mma_tf32_bits(b1);
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                M::mma(acc[mt][NT - 1], af[mt], b0, b1);
        }
    }
}

/* 256-thread configurations are held to 128 registers (2 blocks per SM), smaller ones to 255/3:
 * the persistent grid relies on a second resident block to overlap one block's epilogue and
 * barriers with another's tensor-core work; a third block, at 80 registers, spills and is
 * slower. */
template <class DT, int NHWC, int MT, int NT, int WM, int WN>
__global__ void __launch_bounds__(WM *WN * 32,
                                  CONVD_MIN_BLOCKS(WM *WN * 32, (WM * WN * 32 >= 256) ? 2 : 3))
    mma_kernel(const struct mma_args a, const struct gpu_batch b)
{
    convd_grid_dependency();
#if defined(CONVD_DEVICE_SM80)
    typedef typename mma_dt<DT>::OT OT;
    constexpr int ES = mma_dt<DT>::OES, EPV = 16 / ES, EPV_LOG = EPV == 8 ? 3 : 2;
    extern __shared__ __align__(128) uint8_t mma_smem[];
    const struct gpu_geom &g = a.g;
    const int nthr = WM * WN * 32;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WM, wn = warp / WM;
    const int bm = MT * WM * 16;

    const int it_begin = (int)((int64_t)blockIdx.x * a.items / gridDim.x);
    const int it_end = (int)((int64_t)(blockIdx.x + 1) * a.items / gridDim.x);
    if (it_begin >= it_end)
        return;

    int *oct = (int *)(mma_smem + a.off_oct);
    mma_oct_init(a, oct, tid, nthr);
    int abase[MT];
    mma_abase<MT, NT>(a, wm, wn, lane, abase);
    const int khalf = lane >> 4;
    /* B rows of the warp for ldmatrix: tile (lane >> 4) of a pair, row lane & 7, octet bit 3. */
    const int brow = wn * NT * 8 + (lane & 7) + ((lane >> 4) << 3);
    const int bko = (lane >> 3) & 1;

    const bool resident = a.nchunks == 1;
    const int nstages = (it_end - it_begin) * a.nchunks;
    /* Buffer selection by arithmetic, not by a pointer array (which would live in local memory). */
#define MMA_ABUF(i) (mma_smem + ((i) ? a.off_a1 : a.off_a0))
#define MMA_BBUF(i) (mma_smem + ((i) ? a.off_b1 : a.off_b0))
    int ab = 0, bb = 0;

    {
        const struct mma_item it = mma_decode(a, it_begin);
        mma_load_a<DT, NHWC>(a, b, it, 0, MMA_ABUF(0), tid, nthr);
        mma_load_b<DT, NHWC>(a, b, it, 0, MMA_BBUF(0), tid, nthr);
        gpu_cp_commit();
    }

    float acc[MT][NT][4];
    int item = it_begin, chunk = 0;
    for (int st = 0; st < nstages; st++) {
        const bool has_next = st + 1 < nstages;
        const int nitem = chunk + 1 == a.nchunks ? item + 1 : item;
        const int nchunk = chunk + 1 == a.nchunks ? 0 : chunk + 1;
        const bool key_change = has_next && convd_math_fdiv_div((uint32_t)nitem, a.fd_tiles) !=
                                                convd_math_fdiv_div((uint32_t)item, a.fd_tiles);
        const bool prefetch = has_next && (!resident || !key_change);
        if (prefetch) {
            const struct mma_item nit = mma_decode(a, nitem);
            mma_load_a<DT, NHWC>(a, b, nit, nchunk * a.kc, MMA_ABUF(ab ^ 1), tid, nthr);
            if (!resident)
                mma_load_b<DT, NHWC>(a, b, nit, nchunk * a.kc, MMA_BBUF(bb ^ 1), tid, nthr);
            gpu_cp_commit();
            gpu_cp_wait<1>();
        } else {
            gpu_cp_wait<0>();
        }
        __syncthreads();

        if (chunk == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        acc[mt][nt][i] = 0.0f;
        }

        const uint32_t sa = gpu_smem_addr(MMA_ABUF(ab));
        const uint32_t sb = gpu_smem_addr(MMA_BBUF(resident ? 0 : bb)) + brow * a.brs + bko * 16;
        mma_mainloop<DT, MT, NT, false>(acc, a, oct, sa, abase, sb, khalf, 0);

        if (chunk == a.nchunks - 1) {
            const struct mma_item it = mma_decode(a, item);
            const OT *bias = (const OT *)b.b[it.prob];
            OT *y = (OT *)b.y[it.prob];
            uint8_t *stage = a.stage_sep ? mma_smem + a.off_stage : MMA_ABUF(ab);
            /* Staging [m][n] for NHWC output (a pixel's channels are one run), [n][m] for NCHW
             * (a channel's pixels are one run): the copy-out reads runs of 8 or 16 bytes. */
            const bool nchw_out = !NHWC || a.out_nchw;
            const int pitch = (a.bn + 8) * ES, mpitch = (bm + 8) * ES;
            __syncthreads();
            /* Accumulators -> bias, activation, rounding -> staging; one branch on the layout
             * around the whole loop (inside it, both layouts' stores were issued, predicated). */
            if (g.bias || g.act)
                mma_bias_act<DT, MT, NT>(acc, bias, it, g, wn, lane);
            if (nchw_out)
                mma_stage<DT, MT, NT, true>(acc, stage, wm, wn, lane, mpitch, 0);
            else
                mma_stage<DT, MT, NT, false>(acc, stage, wm, wn, lane, pitch, 0);
            __syncthreads();
            const int tslots = a.th * a.tw;
            if (NHWC && !a.out_nchw && a.out_vpt == 2) {
                mma_out_nhwc<OT, 2>(a, it, y, stage, pitch, bm, tid, nthr);
            } else if (NHWC && !a.out_nchw && a.out_vpt == 1) {
                mma_out_nhwc<OT, 1>(a, it, y, stage, pitch, bm, tid, nthr);
            } else if (NHWC && !a.out_nchw) {
                const int vpr = a.bn >> EPV_LOG;
                for (int v = tid; v < bm * vpr; v += nthr) {
                    const int m = gpu_div_fast{a.fd_vpr}.div(v), c8 = v - m * vpr;
                    const int img = gpu_div_fast{a.fd_tplane}.div(m), rem = m - img * tslots;
                    const int tr = gpu_div_fast{a.fd_tw}.div(rem), tc = rem - tr * a.tw;
                    const int n = it.n0 + img, oh = it.oh0 + tr, ow = it.ow0 + tc;
                    const int k = it.k0 + c8 * EPV;
                    if (img < a.imgs && n < g.n && oh < g.ho && ow < g.wo && k < it.kend)
                        *(uint4 *)(y + (size_t)(uint32_t)((n * g.ho + oh) * g.wo + ow) * g.k + k) =
                            *(const uint4 *)(stage + m * pitch + c8 * 16);
                }
            } else {
                /* NCHW: each thread writes V adjacent pixels of one output row (one store of
                 * V * ES bytes; V divides the tile width and the output width, so the run
                 * stays in one row and is aligned), walking (channel, tile row, run) without
                 * divisions. */
                const int V = (g.wo % 4 == 0 && a.tw % 4 == 0)   ? 4
                              : (g.wo % 2 == 0 && a.tw % 2 == 0) ? 2
                                                                 : 1;
                const int rows = a.imgs * a.th, runs = a.tw / V;
                struct gpu_walk wk;
                gpu_walk_init(&wk, tid, nthr, rows, runs);
                for (int e = tid; e < a.bn * rows * runs;
                     e += nthr, gpu_walk_step(&wk, rows, runs)) {
                    const int nl = wk.hi, row = wk.mid, tc = wk.lo * V;
                    const int img = a.imgs == 1 ? 0 : row / a.th, tr = row - img * a.th;
                    const int n = it.n0 + img, oh = it.oh0 + tr, ow = it.ow0 + tc;
                    const int k = it.k0 + nl;
                    if (n >= g.n || oh >= g.ho || ow >= g.wo || k >= it.kend)
                        continue;
                    /* m = row * tw + tc: the run is V adjacent staged elements. */
                    const uint8_t *sp = stage + nl * mpitch + (row * a.tw + tc) * ES;
                    OT *yp = y + ((size_t)(n * g.k + k) * g.ho + oh) * g.wo + ow;
                    if (ES == 4 && V == 4)
                        *(uint4 *)yp = *(const uint4 *)sp;
                    else if (V * ES == 8)
                        *(uint2 *)yp = *(const uint2 *)sp;
                    else if (V * ES == 4)
                        *(uint32_t *)yp = *(const uint32_t *)sp;
                    else
                        *yp = *(const OT *)sp;
                }
            }
        }
        __syncthreads();
        if (has_next && !prefetch) {
            const struct mma_item nit = mma_decode(a, nitem);
            mma_load_a<DT, NHWC>(a, b, nit, nchunk * a.kc, MMA_ABUF(ab ^ 1), tid, nthr);
            mma_load_b<DT, NHWC>(a, b, nit, nchunk * a.kc, MMA_BBUF(0), tid, nthr);
            gpu_cp_commit();
        }
        ab ^= 1;
        if (!resident)
            bb ^= 1;
        item = nitem;
        chunk = nchunk;
    }
#undef MMA_ABUF
#undef MMA_BBUF
#endif
}

/*
 * The tensor-copy variant (sm_90, NHWC in and out, one chunk, block channels contiguous; see
 * gpu_mma_plan.tma). Per item one thread moves the whole halo with one cp.async.bulk.tensor box
 * (padding filled by the copy unit) and the whole output tile with another, so the warps only
 * multiply and stage. A ring of nst halo buffers (2; 1, 3 or 4 only when forced for a sweep):
 * the first item's halo is issued at the start and the next nst - 1 once it has landed; then the
 * halo of item i + nst is issued as soon as every warp has finished item i, into the buffer item
 * i used; each buffer has an mbarrier whose phase completes when its bytes have landed. Staging is
 * double-buffered, so one block barrier per item suffices: before it, thread 0 waits until the
 * store of the previous item has read its staging buffer (long done: it was issued a whole item
 * earlier), which is the buffer the next item stages into.
 */
template <class DT, int MT, int NT, int WM, int WN>
__global__ void __launch_bounds__(WM *WN * 32,
                                  CONVD_MIN_BLOCKS(WM *WN * 32, (WM * WN * 32 >= 256) ? 2 : 3))
    mma_tma_kernel(const struct mma_args a, const struct gpu_batch b,
                   const __grid_constant__ struct mma_tmaps tm)
{
#if defined(CONVD_DEVICE_SM90)
    extern __shared__ __align__(1024) uint8_t mma_smem[];
    /* The swizzle patterns repeat every 1024 bytes of address: align the buffers to that. */
    uint8_t *smem = mma_smem + ((1024u - (gpu_smem_addr(mma_smem) & 1023u)) & 1023u);
    const struct gpu_geom &g = a.g;
    const int nthr = WM * WN * 32;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WM, wn = warp / WM;

    MMA_TR(0);
    const int it_begin = (int)((int64_t)blockIdx.x * a.items / gridDim.x);
    const int it_end = (int)((int64_t)(blockIdx.x + 1) * a.items / gridDim.x);
    if (it_begin >= it_end)
        return;

    int *oct = (int *)(smem + a.off_oct);
    mma_oct_init(a, oct, tid, nthr);
    int abase[MT];
    mma_abase<MT, NT>(a, wm, wn, lane, abase);
    const int khalf = lane >> 4;
    const int brow = wn * NT * 8 + (lane & 7) + ((lane >> 4) << 3);
    const int bko = (lane >> 3) & 1;

    constexpr int ES = mma_dt<DT>::OES;
    mma_stage_offs<MT, NT> soffs;
    mma_stage_offs_init<MT, NT, ES>(soffs, wm, wn, lane, a.bn * ES, a.smask_s);

    const uint32_t bar0 = gpu_smem_addr(smem + a.off_bar);
#define MMA_TMA_A(i)   (smem + a.off_a0 + (i)*a.a_stride)
#define MMA_TMA_BAR(i) (bar0 + 8u * (uint32_t)(i))
    if (tid == 0) {
        for (int i = 0; i < a.nst; i++)
            gpu_mbar_init(MMA_TMA_BAR(i), 1);
        gpu_mbar_init_fence();
    }
    /* The first item's halo and weights into L2 while the previous kernel finishes (a hint:
     * see gpu_tma_prefetch4; inputs that kernel wrote are in L2 already). */
    const struct mma_item first = mma_decode(a, it_begin);
    if (tid == 0 && a.prefetch) {
        gpu_tma_prefetch4(&tm.x[first.prob], first.ch0, first.ow0 * g.sw - g.pl,
                          first.oh0 * g.sh - g.pt, first.n0);
        const size_t row = (size_t)g.r * g.s * g.cpg * sizeof(typename mma_dt<DT>::T);
        gpu_prefetch_l2((const uint8_t *)b.w[first.prob] + (size_t)first.k0 * row,
                        (size_t)(first.kend - first.k0) * row);
    }
    __syncthreads();
    /* Launched with programmatic stream serialization (convd_launch): the set-up above, which
     * reads no global memory, overlaps the previous kernel's tail. */
    convd_grid_dependency();
    MMA_TR(1);
    /* The halo box of an item: block channels from ch0, the tile's input window. */
#define MMA_TMA_HALO(item, i)                                                                      \
    do {                                                                                           \
        const struct mma_item hit_ = mma_decode(a, (item));                                        \
        gpu_tma_load4(gpu_smem_addr(MMA_TMA_A(i)), &tm.x[hit_.prob], hit_.ch0,                     \
                      hit_.ow0 *g.sw - g.pl, hit_.oh0 * g.sh - g.pt, hit_.n0, MMA_TMA_BAR(i),      \
                      (uint32_t)a.a_tx);                                                           \
    } while (0)
    /* Only the first item's halo now: the others follow once it has landed (below). Every block
     * starts at once, and with all of their first nst halos requested together the first ones
     * arrived only when nearly all had. */
    if (tid == 0)
        MMA_TMA_HALO(it_begin, 0);
    mma_load_b<DT, 1>(a, b, first, 0, smem + a.off_b0, tid, nthr);
    gpu_cp_commit();
    bool bfresh = true;
    uint32_t phase = 0;
    const uint32_t sb = gpu_smem_addr(smem + a.off_b0) + brow * a.brs + bko * 16;
    int ab = 0, sbuf = 0; /* A stage of this item (a ring of nst), staging buffer */
    for (int item = it_begin; item < it_end; item++, ab = ab + 1 == a.nst ? 0 : ab + 1, sbuf ^= 1) {
        if (bfresh) { /* the weights' cp.async copies, by every thread */
            gpu_cp_wait<0>();
            __syncthreads();
            bfresh = false;
            MMA_TR(2);
        }
        gpu_mbar_wait(MMA_TMA_BAR(ab), (phase >> ab) & 1u);
        phase ^= 1u << ab;
        MMA_TR(3 + 3 * (item - it_begin));
        if (item == it_begin && tid == 0)
            for (int i = 1; i < a.nst && it_begin + i < it_end; i++)
                MMA_TMA_HALO(it_begin + i, i);

        float acc[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[mt][nt][i] = 0.0f;
        mma_mainloop<DT, MT, NT, true>(acc, a, oct, gpu_smem_addr(MMA_TMA_A(ab)), abase, sb, khalf,
                                       a.smask_a);

        MMA_TR(4 + 3 * (item - it_begin));
        const struct mma_item it = mma_decode(a, item);
        if (g.bias || g.act)
            mma_bias_act<DT, MT, NT>(acc, (const typename mma_dt<DT>::OT *)b.b[it.prob], it, g, wn,
                                     lane);
        uint8_t *stage = smem + (sbuf ? a.off_stage1 : a.off_stage);
        mma_stage_pre<DT, MT, NT>(acc, stage, soffs, wm, wn, lane, a.bn * ES, a.smask_s);
        gpu_fence_async_smem();
        if (tid == 0)
            gpu_tma_store_wait<true>(); /* the previous item's store has read the other buffer */
        __syncthreads();
        if (tid == 0) {
            gpu_tma_store4(&tm.y[it.prob], gpu_smem_addr(stage), it.k0, it.ow0, it.oh0, it.n0);
            if (item + a.nst < it_end)
                MMA_TMA_HALO(item + a.nst, ab);
            MMA_TR(5 + 3 * (item - it_begin));
        }
        /* A new n-block: its weights replace these (every warp is past its HMMA loop). */
        if (item + 1 < it_end && convd_math_fdiv_div((uint32_t)(item + 1), a.fd_tiles) !=
                                     convd_math_fdiv_div((uint32_t)item, a.fd_tiles)) {
            const struct mma_item nit = mma_decode(a, item + 1);
            mma_load_b<DT, 1>(a, b, nit, 0, smem + a.off_b0, tid, nthr);
            gpu_cp_commit();
            bfresh = true;
        }
    }
    if (tid == 0)
        gpu_tma_store_wait<false>();
    MMA_TR(MMA_TRACE_EV_END);
#undef MMA_TMA_HALO
#undef MMA_TMA_A
#undef MMA_TMA_BAR
#endif
}

/* The tensor-copy kernel of a dtype and warp layout (for occupancy queries). */
static const void *mma_tma_fn(int dtype, int cfg)
{
    static const void *f16[MMA_NCFG] = {
        (const void *)mma_tma_kernel<dt_f16, 7, 1, 1, 8>,
        (const void *)mma_tma_kernel<dt_f16, 7, 1, 1, 4>,
        (const void *)mma_tma_kernel<dt_f16, 7, 2, 1, 4>,
        (const void *)mma_tma_kernel<dt_f16, 7, 3, 1, 2>,
        (const void *)mma_tma_kernel<dt_f16, 4, 4, 2, 2>,
        (const void *)mma_tma_kernel<dt_f16, 2, 4, 2, 2>,
        (const void *)mma_tma_kernel<dt_f16, 4, 5, 2, 2>,
    };
    static const void *bf16[MMA_NCFG] = {
        (const void *)mma_tma_kernel<dt_bf16, 7, 1, 1, 8>,
        (const void *)mma_tma_kernel<dt_bf16, 7, 1, 1, 4>,
        (const void *)mma_tma_kernel<dt_bf16, 7, 2, 1, 4>,
        (const void *)mma_tma_kernel<dt_bf16, 7, 3, 1, 2>,
        (const void *)mma_tma_kernel<dt_bf16, 4, 4, 2, 2>,
        (const void *)mma_tma_kernel<dt_bf16, 2, 4, 2, 2>,
        (const void *)mma_tma_kernel<dt_bf16, 4, 5, 2, 2>,
    };
    static const void *tf32[MMA_NCFG] = {
        (const void *)mma_tma_kernel<dt_tf32x2, 7, 1, 1, 8>,
        (const void *)mma_tma_kernel<dt_tf32x2, 7, 1, 1, 4>,
        (const void *)mma_tma_kernel<dt_tf32x2, 7, 2, 1, 4>,
        (const void *)mma_tma_kernel<dt_tf32x2, 7, 3, 1, 2>,
        (const void *)mma_tma_kernel<dt_tf32x2, 4, 4, 2, 2>,
        (const void *)mma_tma_kernel<dt_tf32x2, 2, 4, 2, 2>,
        (const void *)mma_tma_kernel<dt_tf32x2, 4, 5, 2, 2>,
    };
    if (cfg < 0 || cfg >= MMA_NCFG)
        return NULL;
    return dtype == CONVD_DTYPE_FP32 ? tf32[cfg] : dtype == CONVD_DTYPE_BF16 ? bf16[cfg] : f16[cfg];
}

/* Occupancy per (kernel, shared memory), computed once. */
struct mma_occ_entry {
    const void *fn;
    int smem, blocks;
};
static struct mma_occ_entry mma_occ[128];
static int mma_occ_n;
static pthread_mutex_t mma_occ_lock = PTHREAD_MUTEX_INITIALIZER;

static int mma_blocks_per_sm(const void *fn, int threads, int smem, int *ret)
{
    pthread_mutex_lock(&mma_occ_lock);
    for (int i = 0; i < mma_occ_n; i++)
        if (mma_occ[i].fn == fn && mma_occ[i].smem == smem) {
            *ret = mma_occ[i].blocks;
            pthread_mutex_unlock(&mma_occ_lock);
            return 0;
        }
    pthread_mutex_unlock(&mma_occ_lock);
    int blocks = 0;
    CONVD_GPU_CHECK(hipOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, threads, smem));
    if (blocks < 1)
        blocks = 1;
    pthread_mutex_lock(&mma_occ_lock);
    if (mma_occ_n < (int)(sizeof(mma_occ) / sizeof(mma_occ[0]))) {
        mma_occ[mma_occ_n].fn = fn;
        mma_occ[mma_occ_n].smem = smem;
        mma_occ[mma_occ_n].blocks = blocks;
        mma_occ_n++;
    }
    pthread_mutex_unlock(&mma_occ_lock);
    *ret = blocks;
    return 0;
}

/* The persistent grid of a kernel with the plan's shared memory: blocks resident on every SM
 * (its shared-memory limit raised first). */
static int mma_grid_cap(const void *fn, const struct gpu_mma_plan *pl, int64_t *ret)
{
    int rc = gpu_allow_smem(fn, pl->smem);
    if (rc != 0)
        return rc;
    int per_sm = 1;
    rc = mma_blocks_per_sm(fn, pl->threads, pl->smem, &per_sm);
    if (rc != 0)
        return rc;
    struct gpu_device_info dev;
    rc = gpu_device_info_get(&dev);
    if (rc != 0)
        return rc;
    *ret = (int64_t)dev.sm_count * per_sm;
    return 0;
}

template <class DT, int NHWC, int MT, int NT, int WM, int WN>
static int mma_go(const struct gpu_mma_plan *pl, struct mma_args *a, const struct gpu_batch *b,
                  int count, const struct gpu_launch *ln)
{
    int64_t grid = 0;
    int rc = mma_grid_cap((const void *)mma_kernel<DT, NHWC, MT, NT, WM, WN>, pl, &grid);
    if (rc != 0)
        return rc;
    a->items = count * pl->nblk * pl->tiles;
    if (grid > a->items)
        grid = a->items;
    GPU_LAUNCH((mma_kernel<DT, NHWC, MT, NT, WM, WN>), dim3((unsigned)grid),
               dim3((unsigned)pl->threads), pl->smem, ln, *a, *b);
    CONVD_GPU_CHECK(hipGetLastError());
    return 0;
}

template <class DT, int NHWC>
static int mma_launch_cfg(const struct gpu_mma_plan *pl, struct mma_args *a,
                          const struct gpu_batch *b, int count, const struct gpu_launch *ln)
{
    switch (pl->cfg) {
    case 0:
        return mma_go<DT, NHWC, 7, 1, 1, 8>(pl, a, b, count, ln);
    case 1:
        return mma_go<DT, NHWC, 7, 1, 1, 4>(pl, a, b, count, ln);
    case 2:
        return mma_go<DT, NHWC, 7, 2, 1, 4>(pl, a, b, count, ln);
    case 3:
        return mma_go<DT, NHWC, 7, 3, 1, 2>(pl, a, b, count, ln);
    case 4:
        return mma_go<DT, NHWC, 4, 4, 2, 2>(pl, a, b, count, ln);
    case 5:
        return mma_go<DT, NHWC, 2, 4, 2, 2>(pl, a, b, count, ln);
    case 6:
        return mma_go<DT, NHWC, 4, 5, 2, 2>(pl, a, b, count, ln);
    }
    return CONVD_EINVAL;
}

/* How many of an item's `vecs` 16-byte vectors per pixel one thread copies: the most, up to
 * `most`, that divides them and leaves a whole number of pixels per block step of `threads`;
 * 0 when even one does not (the any-shape loops). */
static int mma_per_thread(int vecs, int threads, int most)
{
    for (int vpt = most; vpt >= 1; vpt--)
        if (vecs % vpt == 0 && threads % (vecs / vpt) == 0)
            return vpt;
    return 0;
}

static mma_encode_fn mma_encode;
static pthread_once_t mma_encode_once = PTHREAD_ONCE_INIT;

static void mma_encode_lookup(void)
{
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        mma_encode = (mma_encode_fn)fn;
    else
        (void)cudaGetLastError();
}

mma_encode_fn mma_encoder(void)
{
    pthread_once(&mma_encode_once, mma_encode_lookup);
    return mma_encode;
}

int mma_swizzle_mask(int row)
{
    return row == 128 ? 0x70 : row == 64 ? 0x30 : row == 32 ? 0x10 : 0;
}

/* A 4-D NHWC tensor map (dims innermost first: channels, columns, rows, images) with a box of
 * `box` elements per dimension, swizzled by the box's row bytes where that is 32, 64 or 128.
 * dtype FP32 maps 4-byte elements (the TF32 output); the halo of a TF32 problem is mapped as
 * FP16 units (the copies move bytes, and out-of-bounds fill is zero bits either way). */
static int mma_map_encode(CUtensorMap *m, int dtype, void *base, int c, int w, int h, int n,
                          const cuuint32_t box[4])
{
    const mma_encode_fn enc = mma_encoder();
    if (enc == NULL)
        return CONVD_EDEVICE;
    const cuuint64_t es = convd_dtype_size((enum convd_dtype)dtype);
    const cuuint64_t dims[4] = {(cuuint64_t)c, (cuuint64_t)w, (cuuint64_t)h, (cuuint64_t)n};
    const cuuint64_t strides[3] = {(cuuint64_t)c * es, (cuuint64_t)c * w * es,
                                   (cuuint64_t)c * w * h * es};
    const cuuint32_t one[4] = {1, 1, 1, 1};
    const cuuint64_t row = box[0] * es;
    const CUtensorMapSwizzle swz = row == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                   : row == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                   : row == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                                               : CU_TENSOR_MAP_SWIZZLE_NONE;
    const CUtensorMapDataType type = dtype == CONVD_DTYPE_FP32   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                     : dtype == CONVD_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    const CUresult r =
        enc(m, type, 4, base, dims, strides, box, one, CU_TENSOR_MAP_INTERLEAVE_NONE, swz,
            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : CONVD_EDEVICE;
}

/*
 * Encoded tensor maps, kept: cuTensorMapEncodeTiled cost about 0.9 us of host time per map on the
 * H200 (a one-problem call 5.7 us against 3.7 us for the kernel without maps), and a serving
 * client sends its requests from the same buffers again and again. A map is a pure function of
 * its arguments (address, sizes, box, type), so an entry never goes stale: memory freed and
 * allocated again at the same address with the same sizes gets the same map. Direct-mapped; a
 * collision only costs an encode.
 */
struct mma_map_key {
    const void *base;
    int dtype, c, w, h, n;
    cuuint32_t box[4];
};
struct mma_map_slot {
    struct mma_map_key key;
    int used;
    CUtensorMap map;
};
#define MMA_MAP_SLOTS 1024
static struct mma_map_slot mma_maps[MMA_MAP_SLOTS];
static pthread_mutex_t mma_maps_lock = PTHREAD_MUTEX_INITIALIZER;

/* mma_map_encode's map, from the cache above, or encoded and kept. */
static int mma_map(CUtensorMap *m, int dtype, void *base, int c, int w, int h, int n,
                   const cuuint32_t box[4])
{
    struct mma_map_key k;
    memset(&k, 0, sizeof(k)); /* the padding too: keys compare as bytes */
    k.base = base;
    k.dtype = dtype;
    k.c = c;
    k.w = w;
    k.h = h;
    k.n = n;
    memcpy(k.box, box, sizeof(k.box));
    uint64_t hv = mix_splitmix64((uint64_t)(uintptr_t)base);
    hv = mix_splitmix64(hv ^ ((uint64_t)(uint32_t)c << 32 | (uint32_t)w));
    hv = mix_splitmix64(hv ^ ((uint64_t)(uint32_t)h << 32 | (uint32_t)n));
    hv = mix_splitmix64(hv ^ ((uint64_t)box[0] << 48 | (uint64_t)box[1] << 32 |
                              (uint64_t)box[2] << 16 | (uint64_t)(box[3] ^ (cuuint32_t)dtype)));
    struct mma_map_slot *s = &mma_maps[hv % MMA_MAP_SLOTS];
    pthread_mutex_lock(&mma_maps_lock);
    if (s->used && memcmp(&s->key, &k, sizeof(k)) == 0) {
        *m = s->map;
        pthread_mutex_unlock(&mma_maps_lock);
        return 0;
    }
    pthread_mutex_unlock(&mma_maps_lock);
    const int rc = mma_map_encode(m, dtype, base, c, w, h, n, box);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&mma_maps_lock);
    s->key = k;
    s->map = *m;
    s->used = 1;
    pthread_mutex_unlock(&mma_maps_lock);
    return 0;
}

template <class DT, int MT, int NT, int WM, int WN>
static int mma_go_tma(const struct gpu_mma_plan *pl, struct mma_args *a, const struct gpu_batch *b,
                      int count, const struct gpu_launch *ln)
{
    int64_t cap = 0;
    int rc = mma_grid_cap((const void *)mma_tma_kernel<DT, MT, NT, WM, WN>, pl, &cap);
    if (rc != 0)
        return rc;
    const struct gpu_geom *g = &pl->g;
    const cuuint32_t xbox[4] = {(cuuint32_t)pl->ps / 2, (cuuint32_t)pl->iw, (cuuint32_t)pl->ih,
                                (cuuint32_t)pl->imgs};
    const cuuint32_t ybox[4] = {(cuuint32_t)pl->bn, (cuuint32_t)pl->tw, (cuuint32_t)pl->th,
                                (cuuint32_t)pl->imgs};
    for (int p0 = 0; p0 < count; p0 += MMA_TMA_PROBS) {
        const int cnt = count - p0 < MMA_TMA_PROBS ? count - p0 : MMA_TMA_PROBS;
        struct gpu_batch sub;
        memset(&sub, 0, sizeof(sub));
        struct mma_tmaps tm;
        memset(&tm, 0, sizeof(tm));
        for (int i = 0; i < cnt; i++) {
            sub.x[i] = b->x[p0 + i];
            sub.w[i] = b->w[p0 + i];
            sub.b[i] = b->b[p0 + i];
            sub.y[i] = b->y[p0 + i];
            /* TF32: the halo in 16-bit units (g->c counts them), the output in fp32. */
            const int xdt = pl->dtype == CONVD_DTYPE_FP32 ? CONVD_DTYPE_FP16 : pl->dtype;
            rc = mma_map(&tm.x[i], xdt, (void *)sub.x[i], g->c, g->w, g->h, g->n, xbox);
            if (rc == 0)
                rc = mma_map(&tm.y[i], pl->dtype, sub.y[i], g->k, g->wo, g->ho, g->n, ybox);
            if (rc != 0)
                return rc;
        }
        a->items = cnt * pl->nblk * pl->tiles;
        const int64_t grid = cap < a->items ? cap : a->items;
        GPU_LAUNCH((mma_tma_kernel<DT, MT, NT, WM, WN>), dim3((unsigned)grid),
                   dim3((unsigned)pl->threads), pl->smem, ln, *a, sub, tm);
        CONVD_GPU_CHECK(hipGetLastError());
    }
    return 0;
}

template <class DT>
static int mma_launch_tma(const struct gpu_mma_plan *pl, struct mma_args *a,
                          const struct gpu_batch *b, int count, const struct gpu_launch *ln)
{
    switch (pl->cfg) {
    case 0:
        return mma_go_tma<DT, 7, 1, 1, 8>(pl, a, b, count, ln);
    case 1:
        return mma_go_tma<DT, 7, 1, 1, 4>(pl, a, b, count, ln);
    case 2:
        return mma_go_tma<DT, 7, 2, 1, 4>(pl, a, b, count, ln);
    case 3:
        return mma_go_tma<DT, 7, 3, 1, 2>(pl, a, b, count, ln);
    case 4:
        return mma_go_tma<DT, 4, 4, 2, 2>(pl, a, b, count, ln);
    case 5:
        return mma_go_tma<DT, 2, 4, 2, 2>(pl, a, b, count, ln);
    case 6:
        return mma_go_tma<DT, 4, 5, 2, 2>(pl, a, b, count, ln);
    }
    return CONVD_EINVAL;
}

int gpu_mma_launch(const struct gpu_mma_plan *pl, const struct gpu_batch *b, int count,
                   const struct gpu_launch *ln)
{
    struct mma_args a;
    memset(&a, 0, sizeof(a));
    a.g = pl->g;
    a.gm = pl->gm;
    a.cpgm = pl->cpgm;
    a.kpgm = pl->kpgm;
    a.bn = pl->bn;
    a.sgb = pl->sgb;
    a.nsplit = pl->nsplit;
    a.nblk = pl->nblk;
    a.gms = pl->g.g / pl->gm;
    a.imgs = pl->imgs;
    a.th = pl->th;
    a.tw = pl->tw;
    a.tiles_h = pl->tiles_h;
    a.tiles_w = pl->tiles_w;
    a.tiles = pl->tiles;
    a.fd_tiles = convd_math_fdiv_make((uint32_t)a.tiles);
    a.fd_nblk = convd_math_fdiv_make((uint32_t)a.nblk);
    a.fd_tiles_w = convd_math_fdiv_make((uint32_t)a.tiles_w);
    a.fd_tiles_h = convd_math_fdiv_make((uint32_t)a.tiles_h);
    a.ih = pl->ih;
    a.iw = pl->iw;
    a.kc = pl->kc;
    a.nchunks = pl->nchunks;
    a.noct = pl->noct;
    a.nk16 = pl->nk16;
    a.cbc = pl->cbc;
    a.ps = pl->ps;
    a.brs = pl->brs;
    a.off_a0 = pl->off_a0;
    a.off_a1 = pl->off_a1;
    a.off_b0 = pl->off_b0;
    a.off_b1 = pl->off_b1;
    a.off_oct = pl->off_oct;
    a.off_stage = pl->off_stage;
    a.stage_sep = pl->off_stage != pl->off_a0;
    a.fast_w = pl->fast_w;
    a.out_nchw = pl->out_nchw;
    /* Channel vectors per halo pixel and per output pixel (at least 1 for the divisors): 8 16-bit
     * units, and 8 16-bit or 4 fp32 (TF32) outputs. */
    const int oes = (int)convd_dtype_size((enum convd_dtype)pl->dtype);
    const int vpp = a.cbc >> 3 > 0 ? a.cbc >> 3 : 1;
    const int vpr = a.bn * oes / 16 > 0 ? a.bn * oes / 16 : 1;
    a.fd_vpp = convd_math_fdiv_make((uint32_t)vpp);
    a.fd_kc8 = convd_math_fdiv_make((uint32_t)(a.kc >> 3 > 0 ? a.kc >> 3 : 1));
    a.fd_hplane = convd_math_fdiv_make((uint32_t)(a.ih * a.iw));
    a.fd_iw = convd_math_fdiv_make((uint32_t)a.iw);
    a.fd_vpr = convd_math_fdiv_make((uint32_t)vpr);
    a.fd_tplane = convd_math_fdiv_make((uint32_t)(a.th * a.tw));
    a.fd_tw = convd_math_fdiv_make((uint32_t)a.tw);
    a.fd_kt = convd_math_fdiv_make((uint32_t)(a.nk16 * 16));
    a.fd_kt8 = convd_math_fdiv_make((uint32_t)(a.nk16 * 2));
    a.fd_kc = convd_math_fdiv_make((uint32_t)a.kc);
    a.fd_cpg = convd_math_fdiv_make((uint32_t)a.g.cpg);
    a.fd_kpgm = convd_math_fdiv_make((uint32_t)a.kpgm);
    a.fd_kpg = convd_math_fdiv_make((uint32_t)a.g.kpg);
    /* Halo vectors and copy-out columns per thread (mma_per_thread; 4 measured slower). */
    a.halo_vpt = mma_per_thread(vpp, pl->threads, 3);
    a.fd_tpp = convd_math_fdiv_make((uint32_t)(a.halo_vpt > 0 ? vpp / a.halo_vpt : 1));
    a.out_vpt = mma_per_thread(vpr, pl->threads, 2);
    a.fd_tpr = convd_math_fdiv_make((uint32_t)(a.out_vpt > 0 ? vpr / a.out_vpt : 1));
    a.merged_w =
        a.gm > 1 && a.cpgm == 8 && a.kc == 8 && a.nchunks == 1 && (a.g.cpg == 4 || a.g.cpg == 2)
            ? a.g.cpg
            : 0;
    a.off_stage1 = pl->off_stage1;
    a.nst = pl->nst;
    a.prefetch = pl->prefetch;
    a.a_stride = pl->a_stride;
    a.off_bar = pl->off_bar;
    a.a_tx = pl->a_tx;
    a.smask_a = mma_swizzle_mask(a.ps);
    a.smask_s = mma_swizzle_mask(a.bn * oes);
    if (pl->tma) {
        if (pl->dtype == CONVD_DTYPE_FP16)
            return mma_launch_tma<dt_f16>(pl, &a, b, count, ln);
        if (pl->dtype == CONVD_DTYPE_BF16)
            return mma_launch_tma<dt_bf16>(pl, &a, b, count, ln);
        if (pl->dtype == CONVD_DTYPE_FP32)
            return mma_launch_tma<dt_tf32x2>(pl, &a, b, count, ln);
        return CONVD_EINVAL;
    }
    const int nhwc = pl->layout == CONVD_LAYOUT_NHWC;
    /* TF32 pairs need NHWC tensors (the planner refuses NCHW in place). */
    if (pl->dtype == CONVD_DTYPE_FP32)
        return nhwc ? mma_launch_cfg<dt_tf32x2, 1>(pl, &a, b, count, ln) : CONVD_EINVAL;
    if (pl->dtype == CONVD_DTYPE_FP16)
        return nhwc ? mma_launch_cfg<dt_f16, 1>(pl, &a, b, count, ln)
                    : mma_launch_cfg<dt_f16, 0>(pl, &a, b, count, ln);
    if (pl->dtype == CONVD_DTYPE_BF16)
        return nhwc ? mma_launch_cfg<dt_bf16, 1>(pl, &a, b, count, ln)
                    : mma_launch_cfg<dt_bf16, 0>(pl, &a, b, count, ln);
    return CONVD_EINVAL;
}

#else /* AMD: no MFMA kernel yet; the router sends these shapes to the FMA family. */

int gpu_mma_launch(const struct gpu_mma_plan *pl, const struct gpu_batch *b, int count,
                   const struct gpu_launch *ln)
{
    (void)pl;
    (void)b;
    (void)count;
    (void)ln;
    return CONVD_EUNSUPPORTED;
}

#endif

void gpu_mma_describe(const struct gpu_mma_plan *pl, char *buf, size_t len)
{
    int per_sm = 0;
#if defined(CONVD_GPU_NVIDIA)
    static const void *fns[] = {
        (const void *)mma_kernel<dt_f16, 1, 7, 1, 1, 8>,
        (const void *)mma_kernel<dt_f16, 1, 7, 1, 1, 4>,
        (const void *)mma_kernel<dt_f16, 1, 7, 2, 1, 4>,
        (const void *)mma_kernel<dt_f16, 1, 7, 3, 1, 2>,
        (const void *)mma_kernel<dt_f16, 1, 4, 4, 2, 2>,
        (const void *)mma_kernel<dt_f16, 1, 2, 4, 2, 2>,
        (const void *)mma_kernel<dt_f16, 1, 4, 5, 2, 2>,
    };
    static const void *fns_tf32[] = {
        (const void *)mma_kernel<dt_tf32x2, 1, 7, 1, 1, 8>,
        (const void *)mma_kernel<dt_tf32x2, 1, 7, 1, 1, 4>,
        (const void *)mma_kernel<dt_tf32x2, 1, 7, 2, 1, 4>,
        (const void *)mma_kernel<dt_tf32x2, 1, 7, 3, 1, 2>,
        (const void *)mma_kernel<dt_tf32x2, 1, 4, 4, 2, 2>,
        (const void *)mma_kernel<dt_tf32x2, 1, 2, 4, 2, 2>,
        (const void *)mma_kernel<dt_tf32x2, 1, 4, 5, 2, 2>,
    };
    if (pl->cfg >= 0 && pl->cfg < MMA_NCFG) {
        const void *fn = pl->tma                         ? mma_tma_fn(pl->dtype, pl->cfg)
                         : pl->dtype == CONVD_DTYPE_FP32 ? fns_tf32[pl->cfg]
                                                         : fns[pl->cfg];
        if (gpu_allow_smem(fn, pl->smem) == 0)
            (void)mma_blocks_per_sm(fn, pl->threads, pl->smem, &per_sm);
    }
#endif
    snprintf(buf, len,
             "mma cfg %d gm %d bm %d bn %d sgb %d nsplit %d tile %dx%dx%d halo %dx%d kc %d/%d "
             "k16 %d threads %d smem %d blocks/SM %d items %d%s%s",
             pl->cfg, pl->gm, pl->bm, pl->bn, pl->sgb, pl->nsplit, pl->imgs, pl->th, pl->tw, pl->ih,
             pl->iw, pl->kc, pl->cpgm, pl->nk16, pl->threads, pl->smem, per_sm,
             pl->tiles * pl->nblk, pl->dtype == CONVD_DTYPE_FP32 ? " tf32" : "",
             pl->tma ? (pl->nst == 2   ? " tma"
                        : pl->nst == 1 ? " tma x1"
                        : pl->nst == 3 ? " tma x3"
                                       : " tma x4")
                     : "");
}

#if defined(CONVD_MMA_TRACE) && defined(CONVD_GPU_NVIDIA)
extern "C" int convd_gpu_mma_trace(unsigned long long *dst, int clear)
{
    void *p = NULL;
    if (cudaGetSymbolAddress(&p, mma_trace) != cudaSuccess)
        return CONVD_EDEVICE;
    if (clear)
        return cudaMemset(p, 0, sizeof(mma_trace)) == cudaSuccess ? 0 : CONVD_EDEVICE;
    return cudaMemcpy(dst, p, sizeof(mma_trace), cudaMemcpyDeviceToHost) == cudaSuccess
               ? 0
               : CONVD_EDEVICE;
}
#endif
