/*
 * kquants-amx.h - the Q4_K and Q5_K tiles of many tokens (prompts) on AMX
 * (Intel's tile matrix unit, AMX-INT8: Sapphire Rapids and later), the
 * SB_CPU_AMX level. Included by kernels-x86.h after kquants-x86.h at the
 * AVX-512 level only, whose packed layout, unpacking and block ends these
 * reuse; not a header to include anywhere else.
 *
 * Why: one TDPBSUD multiplies up to 16 tokens' activation bytes by 16
 * rows' quant bytes over 64 elements, 16 x 16 x 64 products, on a unit of
 * its own, where VNNI's tile spends 20 multiply-port operations per token,
 * 16 rows and 64 elements.
 *
 * The packed group is already AMX's B layout: its vector k holds, for each
 * of the 16 rows, the 4 quant bytes of elements 4k..4k+3, which is row k of
 * a B tile whose 16 columns are the weight rows; A is the tokens' Q8_K
 * bytes, loaded in place (row stride xs), and a row of C (tokens x rows,
 * int32) is one token's sums for the 16 rows, a vector as the VNNI tile
 * has them. The sub-block scales sc_j (6 bits) go into B: each block's
 * quants are unpacked once for up to KQ_AMX_PASSES passes of tokens and
 * multiplied into two pieces, q * (sc_j & 7) and q * (sc_j >> 3), bytes of
 * at most 31 * 7 (unsigned B, signed A), so one C tile per piece sums the
 * whole block and isum = lo + 8 * hi is the reference's integer, with no
 * per-sub-block stores or multiplies. The block's floats are kq_block_end's.
 * (A first version stored every sub-block's sums and scaled them by
 * vpmulld: 1.17x VNNI where this is 1.6-1.8x; Q6_K's signed 8-bit scales
 * would take four pieces, so Q6_K, and Q2_K and Q3_K, stay on VNNI.)
 *
 * The configuration is loaded per call for one T (16, or all the tokens of
 * a smaller call), the rest of the tokens go through the VNNI tile, and the
 * tiles are released at the end so that a thread holds AMX state only
 * inside a call.
 */

/* fewest tokens a call must have for the tiles: below, the VNNI tile, as
 * fast at 8 tokens (bench_kernels 768 x 2048 Q4_K: 4 tokens 329 against
 * 261 GFLOP/s, 8: 411 and 413, 10: 421 and 499), so batched decoding's
 * steps keep it */
#define KQ_AMX_MIN_T 9
/* passes of T tokens that share one preparation of a block's quants */
#define KQ_AMX_PASSES 16

/* The tile configuration (LDTILECFG's 64-byte operand, palette 1). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} kq_amx_cfg;

/* GCC's tile intrinsics are asm statements that do not say which memory
 * they read or write: a compiler barrier after the B buffers are written
 * and after C is stored keeps the vector code's stores and loads on the
 * right side of them. */
#define KQ_AMX_FENCE() __asm__ volatile("" ::: "memory")

/* Tiles 0, 1 and 5, 6: the two pieces' sums of a pair's two passes (T
 * rows of 16 int32); 2 and 7: the passes' tokens' bytes of 64 elements (T
 * rows); 3, 4: the two pieces' quant bytes of those elements (16 rows of
 * 16 rows' 4 bytes). */
static void kq_amx_configure(int T) {
    kq_amx_cfg c __attribute__((aligned(64)));
    memset(&c, 0, sizeof(c));
    c.palette = 1;
    static const int token_rows[] = {0, 1, 2, 5, 6, 7};
    for (int i = 0; i < 6; i++)
        c.rows[token_rows[i]] = (uint8_t)T;
    c.rows[3] = c.rows[4] = 16;
    for (int i = 0; i < 8; i++)
        c.colsb[i] = 64;
    _tile_loadconfig(&c);
}

/* One block of the group unpacked and scaled into the pieces lo and hi
 * (64 vectors each, element order): byte q * (sc_j & 7) and q * (sc_j >> 3),
 * each at most 31 * 7. A 16-bit multiply by the piece in both halves of a
 * row's dword multiplies its two bytes at once, as neither product carries
 * out of its byte. */
SBX_ALWAYS void kq_amx_prepare(kq_fmt f, const uint8_t *qv, const uint8_t *sb, uint8_t *lo, uint8_t *hi,
                               const uint8_t *pf, size_t pf_bytes) {
    SBX_UNROLL for (int u = 0; u < 4; u++) {
        vi wq[64];
        if (pf)
            prefetch_ahead(pf + (size_t)u * pf_bytes, pf_bytes);
        kq_unpack(f, true, qv, u, wq);
        SBX_UNROLL for (int h = 0; h < 2; h++) {
            const int j = 2 * u + h; /* the sub-block: vectors 8j.. */
            const vi sc = kq_scale(f, false, sb, j), sl = vi_and(sc, vi_set1_32(7)), sh = vi_srli32(sc, 3);
            const vi ml = vi_or(sl, vi_slli32(sl, 16)), mh = vi_or(sh, vi_slli32(sh, 16));
            SBX_UNROLL for (int k = 8 * j; k < 8 * j + 8; k++) {
                _mm512_store_si512(lo + 64 * k, _mm512_mullo_epi16(wq[k], ml));
                _mm512_store_si512(hi + 64 * k, _mm512_mullo_epi16(wq[k], mh));
            }
        }
    }
}

/* The products of one block for one pass (tokens at xa; C tiles 0, 1) or
 * two (also xb; C tiles 5, 6, A tile 7), each the two pieces' sums over
 * 256 elements (TDPBSUD: signed tokens, unsigned quants), stored at oa and
 * ob (lo, then hi 256 int32 later). Two passes share each chunk's B tiles,
 * and their products are independent, so the tile unit overlaps them. */
#define KQ_AMX_PRODUCTS(two, xa, xb, xs, lo, hi, oa, ob)                                                         \
    do {                                                                                                          \
        _tile_zero(0);                                                                                            \
        _tile_zero(1);                                                                                            \
        if (two) {                                                                                                \
            _tile_zero(5);                                                                                        \
            _tile_zero(6);                                                                                        \
        }                                                                                                         \
        for (int c_ = 0; c_ < 4; c_++) {                                                                          \
            _tile_loadd(3, (lo) + 1024 * c_, 64);                                                                 \
            _tile_loadd(4, (hi) + 1024 * c_, 64);                                                                 \
            _tile_loadd(2, (xa) + 64 * c_, (long)(xs));                                                           \
            _tile_dpbsud(0, 2, 3);                                                                                \
            _tile_dpbsud(1, 2, 4);                                                                                \
            if (two) {                                                                                            \
                _tile_loadd(7, (xb) + 64 * c_, (long)(xs));                                                       \
                _tile_dpbsud(5, 7, 3);                                                                            \
                _tile_dpbsud(6, 7, 4);                                                                            \
            }                                                                                                     \
        }                                                                                                         \
        _tile_stored(0, oa, 64);                                                                                  \
        _tile_stored(1, (oa) + 256, 64);                                                                          \
        if (two) {                                                                                                \
            _tile_stored(5, ob, 64);                                                                              \
            _tile_stored(6, (ob) + 256, 64);                                                                      \
        }                                                                                                         \
    } while (0)

/* A pass's block sums, isum = lo + 8 * hi per token (the reference's
 * integer), through kq_block_end. */
SBX_ALWAYS void kq_amx_finish(kq_fmt f, int T, const uint8_t *mb, const uint8_t *x, size_t xs, const uint8_t *xc,
                              int64_t b, const int32_t *sums, vf *acc, vf *accm) {
    vi isum[QK_T];
    for (int t = 0; t < T; t++)
        isum[t] = vi_add32(_mm512_load_si512(sums + 16 * t), vi_slli32(_mm512_load_si512(sums + 256 + 16 * t), 3));
    kq_block_end(f, T, mb, x, xs, xc, b, isum, acc, accm);
}

/* np passes of T tokens (the configured count; tokens T * p.. in pass p)
 * against one packed group, two at a time: each block is prepared once for
 * all passes, and a pair's sums are read back after the next pair's
 * products are issued (a load that waits on a tile store just made stalls
 * the pipeline). */
SBX_ALWAYS void kq_amx_sweep(kq_fmt f, int T, int np, int64_t nb, const uint8_t *w, const uint8_t *x, size_t xs,
                             const uint8_t *xc, float *y, size_t ldy, const uint8_t *pf) {
    const size_t qsz = kq_qbytes(f) * QB_R, msz = kq_meta(f) * QB_R;
    const uint8_t *meta = w + (size_t)nb * qsz;
    uint8_t lo[64 * 64] __attribute__((aligned(64))), hi[64 * 64] __attribute__((aligned(64)));
    int32_t sums[2][2][2 * 16 * 16] __attribute__((aligned(64))); /* [pair % 2][pass of the pair] */
    vf acc[KQ_AMX_PASSES][QK_T], accm[KQ_AMX_PASSES][QK_T];
    for (int p = 0; p < np; p++)
        for (int t = 0; t < T; t++)
            acc[p][t] = accm[p][t] = vf_zero();
    const size_t pxs = (size_t)T * xs; /* one pass's tokens */
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *qv = w + (size_t)b * qsz, *mb = meta + (size_t)b * msz;
        if (pf)
            prefetch_ahead(pf + (size_t)nb * qsz + (size_t)b * msz, msz);
        kq_amx_prepare(f, qv, kq_scale_bytes(f, mb), lo, hi, pf ? pf + (size_t)b * qsz : NULL, qsz / 4);
        KQ_AMX_FENCE();
        const uint8_t *xq = x + (size_t)b * sizeof(sb_block_q8_K) + offsetof(sb_block_q8_K, qs);
        for (int p = 0; p < np + 2; p += 2) {
            if (p < np) {
                int32_t *out = sums[p / 2 % 2][0], *out2 = sums[p / 2 % 2][1];
                KQ_AMX_PRODUCTS(p + 1 < np, xq + (size_t)p * pxs, xq + (size_t)(p + 1) * pxs, xs, lo, hi, out, out2);
                KQ_AMX_FENCE();
            }
            for (int q = p - 2; q >= 0 && q < p && q < np; q++) /* the previous pair */
                kq_amx_finish(f, T, mb, x + (size_t)q * pxs, xs, xc + (size_t)q * pxs, b, sums[q / 2 % 2][q % 2],
                              acc[q], accm[q]);
        }
    }
    for (int p = 0; p < np; p++)
        for (int t = 0; t < T; t++)
            vf_storeu(y + (size_t)(T * p + t) * ldy, kq_mins(f) ? vf_sub(acc[p][t], accm[p][t]) : acc[p][t]);
}

/* kq_packed with the full passes of the configured token count on the
 * tiles, KQ_AMX_PASSES at a time, the rest of the tokens on VNNI. */
SBX_ALWAYS void kq_amx_packed(kq_fmt f, int64_t n, const void *wv, size_t ws, int64_t nr, const void *xv, size_t xs,
                              int64_t nt, float *y, size_t ldy) {
    const int T = nt < QK_T ? (int)nt : QK_T;
    if (T < KQ_AMX_MIN_T) {
        kq_packed(f, true, n, wv, ws, nr, xv, xs, nt, y, ldy);
        return;
    }
    const uint8_t *w = wv, *x = xv;
    const int64_t nb = n / SB_QK_K;
    const uint8_t *xc = x + (size_t)nb * sizeof(sb_block_q8_K);
    const int64_t tb = token_block(xs, T * KQ_AMX_PASSES);
    kq_amx_configure(T);
    for (int64_t t0 = 0; t0 < nt; t0 += tb) {
        const int64_t t1 = t0 + tb < nt ? t0 + tb : nt;
        for (int64_t r = 0; r < nr; r += QB_R) {
            const uint8_t *wr = w + (size_t)r * ws;
            const uint8_t *pf = r + QB_R < nr || t1 == nt ? wr + (size_t)QB_R * ws : NULL;
            for (int64_t t = t0; t < t1;) {
                const uint8_t *xt = x + (size_t)t * xs, *xct = xc + (size_t)t * xs;
                float *yt = y + (size_t)t * ldy + (size_t)r;
                const int64_t np = (t1 - t) / T < KQ_AMX_PASSES ? (t1 - t) / T : KQ_AMX_PASSES;
                if (np > 0) {
                    kq_amx_sweep(f, T, (int)np, nb, wr, xt, xs, xct, yt, ldy, t == t0 ? pf : NULL);
                    t += np * T;
                } else {
                    kq_tile(f, true, KQ_Q6_M32_BATCHED, (int)(t1 - t), nb, wr, xt, xs, xct, yt, ldy, NULL);
                    t = t1;
                }
            }
        }
    }
    _tile_release();
}

#define KQ_AMX(name, f)                                                                                           \
    static void gemm_##name##_packed_amx(int64_t n, const void *w, size_t ws, int64_t nr, const void *x,        \
                                         size_t xs, int64_t nt, float *y, size_t ldy) {                          \
        kq_amx_packed(f, n, w, ws, nr, x, xs, nt, y, ldy);                                                       \
    }
KQ_AMX(q4_K, KQ_Q4_K)
KQ_AMX(q5_K, KQ_Q5_K)
#undef KQ_AMX

/* The AMX level: the AVX-512 table (packing included) with the K-quants'
 * gemms on the tiles. Called only where cpu.c found AMX-INT8, GFNI and the
 * kernel's permission to use the tile state. */
void sb__kernels_fill_amx(sb_kernels *k) {
    k->packing[SB_TYPE_Q4_K].gemm = gemm_q4_K_packed_amx;
    k->packing[SB_TYPE_Q5_K].gemm = gemm_q5_K_packed_amx;
}
