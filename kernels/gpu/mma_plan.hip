/*
 * The tensor-core family's planner: for a problem, the warp layout, block tile, channel chunks,
 * shared-memory map and kernel variant (cp.async or tensor copies) that gpu_mma_launch runs, or
 * why none fits. Host code only; the kernels and their launch are conv_mma.hip.
 */
#include <stdio.h>
#include <string.h>

#include "conv_mma.h"

#if defined(CONVD_GPU_NVIDIA)

/* Bytes rounded up to the tensor-copy kernel's 1024-byte buffer alignment. */
static int mma_round1k(int bytes)
{
    return (bytes + 1023) & ~1023;
}

/* Channels per super-group per chunk: all of them unless the flattened K of one chunk would pass
 * 1152 elements (then 576 per chunk). Depends on cpgm and R*S only, so the accumulation order of an
 * output does not depend on how many groups the problem has. */
static int mma_pick_kc(int cpgm, int rs)
{
    int kc = cpgm;
    if (rs * kc > 1152) {
        /* Streamed in chunks: halo and weights are double-buffered, so take half as much. */
        kc = (576 / rs) & ~7;
        if (kc < 8)
            kc = 8;
    }
    return kc;
}

/* The next chunk to try where kc channels do not fit: the largest multiple of 8 at most half of
 * kc that divides cpgm (whole chunks), else half of kc in multiples of 8; at least 8. */
static int mma_smaller_kc(int cpgm, int kc)
{
    const int half = (kc / 2) & ~7;
    for (int c = half; c >= 8; c -= 8)
        if (cpgm % c == 0)
            return c;
    return half < 8 ? 8 : half;
}

struct mma_tile {
    int imgs, th, tw, tiles_h, tiles_w;
    int64_t tiles;
};

/* Candidate spatial tiles for bm slots; returns how many were written. */
static int mma_tiles(const struct gpu_geom *g, int bm, struct mma_tile *out, int max)
{
    int n = 0;
    const int plane = g->ho * g->wo;
    if (plane <= bm) {
        struct mma_tile t;
        t.imgs = bm / plane;
        t.th = g->ho;
        t.tw = g->wo;
        t.tiles_h = 1;
        t.tiles_w = 1;
        t.tiles = (g->n + t.imgs - 1) / t.imgs;
        out[n++] = t;
        return n;
    }
    const int tws[] = {0, 8, 16, 28, 32, 56, 64, bm};
    for (size_t i = 0; i < sizeof(tws) / sizeof(tws[0]) && n < max; i++) {
        int tw = tws[i] == 0 ? g->wo : tws[i];
        if (tw > g->wo || tw > bm)
            continue;
        if (i > 0 && tw == g->wo)
            continue;
        struct mma_tile t;
        t.imgs = 1;
        t.tw = tw;
        t.th = bm / tw;
        if (t.th > g->ho)
            t.th = g->ho;
        t.tiles_h = (g->ho + t.th - 1) / t.th;
        t.tiles_w = (g->wo + tw - 1) / tw;
        t.tiles = (int64_t)g->n * t.tiles_h * t.tiles_w;
        out[n++] = t;
    }
    return n;
}

/* How well a tile suits NCHW output: 2 divides the output width and fills all bm pixel slots,
 * 1 divides the width, 0 neither. */
static int mma_tile_fit(const struct gpu_geom *g, const struct mma_tile *t, int bm)
{
    if (g->wo % t->tw != 0)
        return 0;
    return t->imgs * t->th * t->tw == bm ? 2 : 1;
}

#endif /* CONVD_GPU_NVIDIA: the planner's helpers */

static int mma_plan(const struct convd_problem *p, int out_nchw, const struct convd_gpu_policy *pol,
                    struct gpu_mma_plan *ret, char *why, size_t why_len)
{
#if !defined(CONVD_GPU_NVIDIA)
    (void)p;
    (void)ret;
    (void)out_nchw;
    (void)pol;
    snprintf(why, why_len, "mma: no tensor-core kernel for AMD yet (MFMA); FMA family used");
    return CONVD_EUNSUPPORTED;
#else
    /* fp32 runs as TF32 on pairs of 16-bit units (conv_mma.hip, mma_dt): NHWC tensors only. */
    const bool tf32 = p->dtype == CONVD_DTYPE_FP32;
    if (tf32 && (!p->allow_tf32 || pol->tf32 == 0)) {
        snprintf(why, why_len, "mma: fp32 only as TF32 (allow_tf32)");
        return CONVD_EUNSUPPORTED;
    }
    if (tf32 && p->layout != CONVD_LAYOUT_NHWC) {
        snprintf(why, why_len, "mma: TF32 takes NCHW only on NHWC copies");
        return CONVD_EUNSUPPORTED;
    }
    if (!tf32 && p->dtype != CONVD_DTYPE_FP16 && p->dtype != CONVD_DTYPE_BF16) {
        snprintf(why, why_len, "mma: fp16, bf16 and TF32 only");
        return CONVD_EUNSUPPORTED;
    }
    struct gpu_geom g;
    gpu_geom_from_problem(p, &g);
    /* TF32: input channels counted in 16-bit units from here on; outputs stay fp32 (oes bytes). */
    const int oes = (int)convd_dtype_size(p->dtype);
    if (tf32) {
        g.c *= 2;
        g.cpg *= 2;
    }
    int gm = 0;
    for (int f = 1; f <= 4; f *= 2)
        if ((f * g.cpg) % 8 == 0 && (f * g.kpg) % 8 == 0 && g.g % f == 0) {
            gm = f;
            break;
        }
    if (gm == 0) {
        snprintf(why, why_len,
                 "mma: cpg=%d, kpg=%d do not reach multiples of %d and 8 by merging 1, 2 or 4 "
                 "groups",
                 p->c / p->groups, g.kpg, tf32 ? 4 : 8);
        return CONVD_EUNSUPPORTED;
    }
    /* A 1x1, stride-1, unpadded NHWC problem is one long row of pixels: no halo, no tile waste. */
    if (p->layout == CONVD_LAYOUT_NHWC && !out_nchw && g.r == 1 && g.s == 1 && g.sh == 1 &&
        g.sw == 1 && g.pt == 0 && g.pl == 0 && g.ho == g.h && g.wo == g.w) {
        g.w = g.wo = g.n * g.h * g.w;
        g.h = g.ho = 1;
        g.n = 1;
    }
    const int cpgm = gm * g.cpg, kpgm = gm * g.kpg, gms = g.g / gm;
    const bool nchw_out = out_nchw || p->layout == CONVD_LAYOUT_NCHW;
    const int rs = g.r * g.s;
    int kc = mma_pick_kc(cpgm, rs), nchunks = 0, noct = 0, nk16 = 0, brs = 0;

    struct gpu_device_info dev;
    if (gpu_device_info_get(&dev) != 0) {
        snprintf(why, why_len, "mma: no device");
        return CONVD_EDEVICE;
    }

    /* Tensor copies: sm_90 code, NHWC in and out, 16-byte pixel strides, the encoder found. */
    const bool tma_ok = pol->mma_tma != 0 && dev.code_cc >= 90 && !nchw_out && g.c % 8 == 0 &&
                        g.k % 8 == 0 && mma_encoder() != NULL;

    double best = 0.0;
    struct gpu_mma_plan bp;
    bool any_width = false; /* some configuration's block width suits kpg: the refusal is smem */
    /* Partial n-blocks (mma_partial_n): tried only once no configuration's width suits kpgm, so
     * that every problem a whole-block plan takes keeps its plan. */
    bool partial = false;
    /* With mma_split_c, a 1x1 problem that no tile takes with kc channels a chunk (large C on
     * small or strided images: the halo of a whole C, or of a 7x7 plane, and the weights of a
     * whole C) halves the chunk until one does: chunks of C stream through the cp.async kernel
     * instead of the FMA kernels. Problems that fit keep their chunking. */
    for (;;) {
        nchunks = (cpgm + kc - 1) / kc;
        noct = rs * kc / 8;
        nk16 = (noct + 1) / 2;
        brs = nk16 * 32 + 16;
        memset(&bp, 0, sizeof(bp));
        bp.cfg = -1;
        for (int ci = 0; ci < MMA_NCFG; ci++) {
            if (pol->mma_cfg >= 0 && ci != pol->mma_cfg)
                continue;
            const struct mma_cfg *c = &mma_cfgs[ci];
            const int wnw = c->nt * 8, bn = c->wn * wnw, bm = 16 * c->mt * c->wm;
            int sgb = 0, nsplit = 1;
            if (partial)
                nsplit = (kpgm + bn - 1) / bn; /* the last n-block of a group is partial */
            else if (kpgm % wnw != 0)
                continue;
            else if (bn % kpgm == 0)
                sgb = bn / kpgm;
            else if (kpgm % bn == 0)
                nsplit = kpgm / bn;
            else
                continue;
            any_width = true;
            const int nblk = sgb > 0 ? (gms + sgb - 1) / sgb : gms * nsplit;
            const int cbc = (sgb > 0 ? sgb : 1) * kc;
            /* Tensor copies need the block's channels contiguous (one chunk) and box rows of at
             * most 256 elements; boxes are checked per tile below. Rows of 32, 64 or 128 bytes are
             * swizzled; other rows of an even number of 16-byte units (48, 80, 128 channels) are
             * padded to an odd one, the box taking 8 channels past the block's (the next block's,
             * or zeros past C) that no octet reads: conflict-free ldmatrix. Swizzled rows stay
             * unpadded: their two swizzle instructions per A fragment cost less than a larger
             * halo. A partial n-block's output box would cover the next group's columns: tensor
             * copies take it only where the tensor's end clips it (one super-group). */
            const bool tma_cfg =
                tma_ok && nchunks == 1 && cbc <= 256 && bn <= 256 && (!partial || gms == 1);
            int ps = cbc * 2;
            if ((ps / 16) % 2 == 0 && (!tma_cfg || (mma_swizzle_mask(ps) == 0 && cbc + 8 <= 256)))
                ps += 16;
            /* The cp.async kernel's rows: always padded to an odd number of 16-byte units. */
            const int ps_async = (cbc * 2 / 16) % 2 == 0 ? cbc * 2 + 16 : cbc * 2;
            struct mma_tile tiles[8];
            const int nt = mma_tiles(&g, bm, tiles, 8);
            /* NCHW output: prefer tiles that divide the width and fill the block's bm pixel slots
             * (the write term below favours wide tiles, and wide tiles that waste columns or slots
             * are slower). */
            int want = 0;
            for (int ti = 0; ti < nt && nchw_out; ti++) {
                const int lvl = mma_tile_fit(&g, &tiles[ti], bm);
                want = lvl > want ? lvl : want;
            }
            for (int ti = 0; ti < nt; ti++) {
                const struct mma_tile *t = &tiles[ti];
                const int lvl = mma_tile_fit(&g, t, bm);
                if (nchw_out && lvl < want)
                    continue;
                const int ih = (t->th - 1) * g.sh + (g.r - 1) * g.dh + 1;
                const int iw = (t->tw - 1) * g.sw + (g.s - 1) * g.dw + 1;
                const int b_bytes = bn * brs;
                const int oct_bytes = nk16 * 2 * 4;
                const bool tma_geom = tma_cfg && ih <= 256 && iw <= 256 && t->imgs <= 256 &&
                                      t->th <= 256 && t->tw <= 256;
                /* The tensor-copy variant where the tile takes it, else the cp.async one. TF32 also
                 * falls back to cp.async where the tensor copies' buffers (two halos, two staging
                 * tiles) do not fit, as its tiles at twice the bytes often do not
                 * (dense_resnet50_l1 on 2 x 4 warp tiles: 234 KB with copies, 203 KB without);
                 * 16-bit plans stay as measured until the same is measured for them. */
                const int nv = tma_geom && !tf32 ? 1 : 2;
                for (int v = tma_geom ? 0 : 1; v < nv; v++) {
                    const bool tma = v == 0;
                    const int vps = tma || !tf32 ? ps : ps_async;
                    const int a_bytes = t->imgs * ih * iw * vps;
                    /* [m][n] for NHWC output, [n][m] for NCHW (see the epilogue); with tensor
                     * copies, two dense [m][n] buffers. */
                    int stage_bytes = nchw_out ? bn * (bm + 8) * oes : bm * (bn + 8) * oes;
                    int smem = 2 * a_bytes + (nchunks > 1 ? 2 : 1) * b_bytes + oct_bytes;
                    if (tma) {
                        stage_bytes = mma_round1k(bm * bn * oes);
                        smem = 2 * mma_round1k(a_bytes) + 2 * stage_bytes + b_bytes + oct_bytes +
                               16 + 1024;
                    } else if (stage_bytes > a_bytes) {
                        smem += stage_bytes;
                    }
                    if (smem > dev.smem_optin)
                        continue; /* the next variant, or the next tile */
                    const int64_t items = t->tiles * nblk;
                    const double mmas = (double)items * nchunks * nk16 * (bm / 16) * (bn / 8);
                    const double l2_bytes =
                        (double)items * nchunks * (double)(a_bytes + (nchunks > 1 ? b_bytes : 0));
                    /* Fragment reads from shared memory: every warp reads its A (16x16) and B
                     * (16x8) fragments for each k16 step, so warps that share a row of the block
                     * tile re-read the same A. At ~33 TB/s (128 B per clock per SM) this is what
                     * separates configurations of equal mma count. */
                    const int nwarps = c->wm * c->wn;
                    const double lds_bytes =
                        (double)items * nchunks * nk16 * nwarps * (c->mt * 512.0 + c->nt * 256.0);
                    double cost = mmas * 4096.0 / dev.rate.mma + l2_bytes / dev.rate.l2 +
                                  lds_bytes / dev.rate.lds;
                    /* NCHW output writes: a run is a tile row of one channel (or th whole rows when
                     * the tile spans the width), and each run touches about one partial 32-byte
                     * sector more than its bytes fill; rated at nchw_write (4.6 TB/s on the H200,
                     * fitted to two measurements). (NHWC writes whole pixels, the same bytes in
                     * every configuration.) */
                    if (nchw_out) {
                        const double run =
                            (t->tw == g.wo ? (double)t->th * g.wo : (double)t->tw) * oes;
                        cost += (double)g.n * g.ho * g.wo * g.k * oes * (ceil(run / 32.0) + 1.0) *
                                32.0 / run / dev.rate.nchw_write;
                    }
                    int per_sm = dev.smem_per_sm / (smem + 1024);
                    const int threads = c->wm * c->wn * 32;
                    if (per_sm * threads > 2048)
                        per_sm = 2048 / threads;
                    if (per_sm < 2)
                        cost *= 1.3;
                    /* Tensor copies: faster than the cp.async halo on every layout that takes them,
                     * and more so with more blocks resident, which the terms above rate equal. */
                    if (tma)
                        cost *= 0.85 * (1.0 + 0.2 / (per_sm > 1 ? per_sm : 1));
                    /* A grid smaller than the GPU: the cost grows with the idle share. At most two
                     * resident blocks per SM count here: spreading a small problem over more SMs
                     * beats stacking more blocks on fewer, which a count of all slots did not see.
                     */
                    const int counted = per_sm > 2 ? 2 : (per_sm > 0 ? per_sm : 1);
                    const double slots = (double)dev.sm_count * counted;
                    if ((double)items < slots)
                        cost *= slots / (double)items;
                    if (bp.cfg < 0 || cost < best) {
                        best = cost;
                        bp.cfg = ci;
                        bp.bm = bm;
                        bp.bn = bn;
                        bp.sgb = sgb;
                        bp.nsplit = nsplit;
                        bp.nblk = nblk;
                        bp.imgs = t->imgs;
                        bp.th = t->th;
                        bp.tw = t->tw;
                        bp.tiles_h = t->tiles_h;
                        bp.tiles_w = t->tiles_w;
                        bp.tiles = (int)t->tiles;
                        bp.ih = ih;
                        bp.iw = iw;
                        bp.cbc = cbc;
                        bp.ps = vps;
                        bp.a_bytes = a_bytes;
                        bp.b_bytes = b_bytes;
                        bp.stage_bytes = stage_bytes;
                        bp.smem = smem;
                        bp.threads = threads;
                        bp.tma = tma;
                    }
                    break; /* the tensor copies fit: the cp.async variant is not a candidate */
                }
            }
        }
        if (bp.cfg < 0 && !any_width && pol->mma_partial_n && !partial) {
            partial = true; /* the same chunking again, with partial n-blocks */
            continue;
        }
        if (bp.cfg >= 0 || kc <= 8 || rs != 1 || !pol->mma_split_c)
            break;
        kc = mma_smaller_kc(cpgm, kc);
    }
    if (bp.cfg < 0 && !any_width) {
        /* regnet's K 104, 208, 440: n-blocks are whole unless mma_partial_n, so bn must divide
         * kpg or be a multiple */
        snprintf(why, why_len,
                 "mma: no block width suits %d outputs a group: a block's 32-80 (in warp tiles "
                 "of 8-40) must divide them or be a multiple of them (mma_partial_n lifts this)",
                 kpgm);
        return CONVD_EUNSUPPORTED;
    }
    if (bp.cfg < 0) {
        snprintf(why, why_len, "mma: no tile configuration fits in shared memory");
        return CONVD_EUNSUPPORTED;
    }
    bp.g = g;
    bp.dtype = p->dtype;
    bp.layout = p->layout;
    bp.gm = gm;
    bp.cpgm = cpgm;
    bp.kpgm = kpgm;
    bp.kc = kc;
    bp.nchunks = nchunks;
    bp.noct = noct;
    bp.nk16 = nk16;
    bp.brs = brs;
    bp.fast_w = p->layout == CONVD_LAYOUT_NHWC && gm == 1;
    bp.out_nchw = out_nchw;
    if (bp.tma) {
        /* Two halo buffers: deeper rings (the policy's mma_stages) were no faster where
         * they kept every resident block, and slower where they cost one: the loads are not
         * what the items wait for. */
        const int a_stride = mma_round1k(bp.a_bytes);
        bp.nst = 2;
        const int nst = pol->mma_stages;
        if (nst == 1 || (nst > 2 && bp.smem + (nst - 2) * a_stride <= dev.smem_optin))
            bp.nst = nst;
        /* A ring (1024-byte aligned from the kernel's aligned base), S0 S1, B0, oct, bars, and
         * the 1024 bytes of slack the kernel's alignment may use. */
        int off = 0;
        bp.off_a0 = off;
        bp.a_stride = a_stride;
        off += bp.nst * a_stride;
        bp.off_a1 = bp.off_a0 + a_stride;
        bp.off_stage = off;
        off += bp.stage_bytes;
        bp.off_stage1 = off;
        off += bp.stage_bytes;
        bp.off_b0 = bp.off_b1 = off;
        off += bp.b_bytes;
        bp.off_oct = off;
        off += nk16 * 2 * 4;
        off = (off + 15) & ~15;
        bp.off_bar = off;
        off += 8 * bp.nst;
        bp.smem = off + 1024;
        bp.a_tx = bp.a_bytes;
        *ret = bp;
        return 0;
    }
    /* Shared-memory layout: A0 A1 B0 [B1] oct [stage]. */
    int off = 0;
    bp.off_a0 = off;
    off += bp.a_bytes;
    bp.off_a1 = off;
    off += bp.a_bytes;
    bp.off_b0 = off;
    off += bp.b_bytes;
    bp.off_b1 = bp.off_b0;
    if (nchunks > 1) {
        bp.off_b1 = off;
        off += bp.b_bytes;
    }
    bp.off_oct = off;
    off += nk16 * 2 * 4;
    off = (off + 15) & ~15;
    if (bp.stage_bytes > bp.a_bytes) {
        bp.off_stage = off;
        off += bp.stage_bytes;
    } else {
        bp.off_stage = bp.off_a0;
    }
    bp.smem = off;
    *ret = bp;
    return 0;
#endif
}

int gpu_mma_plan_make(const struct convd_problem *p, int out_nchw,
                      const struct convd_gpu_policy *pol, struct gpu_mma_plan *ret, char *why,
                      size_t why_len)
{
    const int rc = mma_plan(p, out_nchw, pol, ret, why, why_len);
    if (rc != 0)
        return rc;
    /* Weights read before the previous kernel ends pay where a block's weights are a few KB and
     * its items many, and cost with tens of KB per block, whose early reads compete with the
     * previous kernel's. */
    ret->prefetch = pol->mma_prefetch == 1 ||
                    (pol->mma_prefetch == -1 &&
                     (int64_t)ret->bn * ret->g.r * ret->g.s * ret->g.cpg * 2 <= 24 * 1024);
    return 0;
}

int gpu_mma_configs(void)
{
    return MMA_NCFG;
}
