/*
 * kquants-amx.h - the Q4_K, Q5_K and Q6_K tiles of many tokens (prompts) on
 * AMX (Intel's tile matrix unit, AMX-INT8: Sapphire Rapids and later), the
 * SB_CPU_AMX level. Included by kernels-x86.h after kquants-x86.h at the
 * AVX-512 level only, whose packed layout, unpacking and block ends these
 * reuse; not a header to include anywhere else.
 *
 * Why: one tile product multiplies up to 16 tokens' activation bytes by 16
 * rows' quant bytes over 64 elements, 16 x 16 x 64 products, on a unit of
 * its own, where VNNI's tile spends 20 multiply-port operations per token,
 * 16 rows and 64 elements.
 *
 * The packed group is already AMX's B layout: its vector k holds, for each
 * of the 16 rows, the 4 quant bytes of elements 4k..4k+3, which is row k of
 * a B tile whose 16 columns are the weight rows; A is the tokens' Q8_K
 * bytes, loaded in place (row stride xs), and a row of C (tokens x rows,
 * int32) is one token's sums for the 16 rows, a vector as the VNNI tile
 * has them. The sub-block scales go into B: each block's quants are
 * unpacked once for up to KQ_AMX_PASSES passes of tokens and multiplied
 * into pieces of the scale that keep every product a byte (kq_amx_pieces),
 * so one C tile per piece sums the whole block, and the pieces' sums
 * shifted by their bits and added are the reference's integer, with no
 * per-sub-block stores or multiplies. The block's floats are kq_block_end's.
 * (A first version stored every sub-block's sums and scaled them by
 * vpmulld: 1.17x VNNI where this is 1.6-1.8x.) Q2_K and Q3_K stay on VNNI.
 *
 * The configuration is loaded per call for one T (16, or all the tokens of
 * a smaller call), the rest of the tokens go through the VNNI tile, and the
 * tiles are released at the end so that a thread holds AMX state only
 * inside a call.
 */

/* Fewest tokens a call must have for the tiles; below, the VNNI tile,
 * which is as fast at 8 tokens (bench_kernels 768 x 2048 Q4_K: 4 tokens
 * 329 against 261 GFLOP/s, 8: 411 and 413, 10: 421 and 499), so batched
 * decoding's steps keep it. Q6_K's four pieces cost more to prepare: its
 * tiles win from 32 tokens (16: 346 against 313, 24: 336 against 272, 32:
 * 343 against 402, 512: 326 against 518). */
SBX_ALWAYS int64_t kq_amx_min_tokens(kq_fmt f) { return f == KQ_Q6_K ? 32 : 9; }

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

/* The pieces a block's quants are scaled into: Q4_K's and Q5_K's 6-bit
 * scales in two of 3 bits (q * piece at most 31 * 7, unsigned), Q6_K's
 * signed 8-bit ones in four of 2 bits, the last signed (sc >> 6, -2..1),
 * times q - 32 (at most 32 * 3 in magnitude, signed). */
SBX_ALWAYS int kq_amx_pieces(kq_fmt f) { return f == KQ_Q6_K ? 4 : 2; }
SBX_ALWAYS int kq_amx_bits(kq_fmt f) { return f == KQ_Q6_K ? 2 : 3; }

/* Tiles 0, 1, 5, 6: C, the pieces' sums (T rows of 16 int32): Q4_K's and
 * Q5_K's two of a pair of passes (0, 1 and 5, 6), Q6_K's four of one pass;
 * 2 (and 7 for Q4_K's and Q5_K's second pass): A, the tokens' bytes of 64
 * elements (T rows); 3, 4 (and 7 for Q6_K): B, the pieces' quant bytes of
 * those elements (16 rows of 16 weight rows' 4 bytes). */
static void kq_amx_configure(kq_fmt f, int T) {
    kq_amx_cfg c __attribute__((aligned(64)));
    memset(&c, 0, sizeof(c));
    c.palette = 1;
    for (int i = 0; i < 8; i++) {
        c.rows[i] = (uint8_t)T;
        c.colsb[i] = 64;
    }
    c.rows[3] = c.rows[4] = 16;
    if (f == KQ_Q6_K)
        c.rows[7] = 16;
    _tile_loadconfig(&c);
}

/* One block of the group unpacked and scaled into the pieces (bq: piece i
 * at i * 4096, 64 vectors in element order). A 16-bit multiply by the piece
 * in both halves of a row's dword scales its two bytes at once where
 * neither product carries out of its byte (unsigned q); Q6_K's signed q -
 * 32 takes its odd bytes by a second multiply, of the high bytes alone. */
SBX_ALWAYS void kq_amx_prepare(kq_fmt f, const uint8_t *qv, const uint8_t *sb, uint8_t *bq, const uint8_t *pf,
                               size_t pf_bytes) {
    /* loop bounds as constants, no divisions (which get a UBSan check and
     * lose the unroll pragma): sub-blocks per unit, vectors per sub-block */
    const int per_unit = f == KQ_Q6_K ? 4 : 2, vecs = f == KQ_Q6_K ? 4 : 8, bits = kq_amx_bits(f);
    SBX_UNROLL for (int u = 0; u < 4; u++) {
        vi wq[64];
        if (pf)
            prefetch_ahead(pf + (size_t)u * pf_bytes, pf_bytes, false);
        kq_unpack(f, true, qv, u, wq);
        SBX_UNROLL for (int h = 0; h < per_unit; h++) {
            const int j = per_unit * u + h; /* the sub-block: vectors vecs * j.. */
            const vi sc = kq_scale(f, true, sb, j);
            SBX_UNROLL for (int i = 0; i < kq_amx_pieces(f); i++) {
                const bool top = i == kq_amx_pieces(f) - 1;
                const vi pc = top ? _mm512_srai_epi32(sc, bits * i)
                                  : vi_and(vi_srli32(sc, bits * i), vi_set1_32((1 << bits) - 1));
                const vi m = vi_or(vi_and(pc, vi_set1_32(0xffff)), vi_slli32(pc, 16));
                SBX_UNROLL for (int e = 0; e < vecs; e++) {
                    const int k = vecs * j + e;
                    vi v;
                    if (f == KQ_Q6_K) {
                        const vi q = _mm512_sub_epi8(wq[k], vi_set1_8(32));
                        v = _mm512_mask_blend_epi8((__mmask64)0xAAAAAAAAAAAAAAAAULL, _mm512_mullo_epi16(q, m),
                                                   _mm512_mullo_epi16(vi_and(q, _mm512_set1_epi16((short)0xff00)), m));
                    } else {
                        v = _mm512_mullo_epi16(wq[k], m);
                    }
                    _mm512_store_si512(bq + 4096 * i + 64 * k, v);
                }
            }
        }
    }
}

/* The products of one block for one pass (tokens at xa; C tiles 0, 1) or
 * two (also xb; C tiles 5, 6, A tile 7), Q4_K's and Q5_K's two pieces'
 * sums over 256 elements (TDPBSUD: signed tokens, unsigned quants), stored
 * at oa and ob (one piece's 256 int32 after the other). Two passes share
 * each chunk's B tiles, and their products are independent, so the tile
 * unit overlaps them. */
#define KQ_AMX_PRODUCTS(two, xa, xb, xs, bq, oa, ob)                                                             \
    do {                                                                                                          \
        _tile_zero(0);                                                                                            \
        _tile_zero(1);                                                                                            \
        if (two) {                                                                                                \
            _tile_zero(5);                                                                                        \
            _tile_zero(6);                                                                                        \
        }                                                                                                         \
        for (int c_ = 0; c_ < 4; c_++) {                                                                          \
            _tile_loadd(3, (bq) + 1024 * c_, 64);                                                                 \
            _tile_loadd(4, (bq) + 4096 + 1024 * c_, 64);                                                          \
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

/* Q6_K's products of one block for one pass: its four pieces' sums
 * (TDPBSSD: both signed) in C tiles 0, 1, 5, 6, stored at out. */
#define KQ_AMX_PRODUCTS_Q6(xa, xs, bq, out)                                                                       \
    do {                                                                                                          \
        _tile_zero(0);                                                                                            \
        _tile_zero(1);                                                                                            \
        _tile_zero(5);                                                                                            \
        _tile_zero(6);                                                                                            \
        for (int c_ = 0; c_ < 4; c_++) {                                                                          \
            _tile_loadd(2, (xa) + 64 * c_, (long)(xs));                                                           \
            _tile_loadd(3, (bq) + 1024 * c_, 64);                                                                 \
            _tile_dpbssd(0, 2, 3);                                                                                \
            _tile_loadd(4, (bq) + 4096 + 1024 * c_, 64);                                                          \
            _tile_dpbssd(1, 2, 4);                                                                                \
            _tile_loadd(7, (bq) + 2 * 4096 + 1024 * c_, 64);                                                      \
            _tile_dpbssd(5, 2, 7);                                                                                \
            _tile_loadd(3, (bq) + 3 * 4096 + 1024 * c_, 64);                                                      \
            _tile_dpbssd(6, 2, 3);                                                                                \
        }                                                                                                         \
        _tile_stored(0, out, 64);                                                                                 \
        _tile_stored(1, (out) + 256, 64);                                                                         \
        _tile_stored(5, (out) + 512, 64);                                                                         \
        _tile_stored(6, (out) + 768, 64);                                                                         \
    } while (0)

/* A pass's block sums, isum = the pieces' sums by their weights (1, 8 or
 * 1, 4, 16, 64): the reference's integer, through kq_block_end. */
SBX_ALWAYS void kq_amx_finish(kq_fmt f, int T, const uint8_t *mb, const uint8_t *x, size_t xs, const uint8_t *xc,
                              int64_t b, const int32_t *sums, vf *acc, vf *accm) {
    vi isum[QK_T];
    for (int t = 0; t < T; t++) {
        vi sum = _mm512_load_si512(sums + 16 * t);
        SBX_UNROLL for (int i = 1; i < kq_amx_pieces(f); i++)
            sum = vi_add32(sum, vi_slli32(_mm512_load_si512(sums + 256 * i + 16 * t), kq_amx_bits(f) * i));
        isum[t] = sum;
    }
    kq_block_end(f, T, mb, x, xs, xc, b, isum, acc, accm);
}

/* np passes of T tokens (the configured count; tokens T * p.. in pass p)
 * against one packed group, in steps of two passes (Q4_K, Q5_K) or one
 * (Q6_K, whose four pieces fill the C tiles): each block is prepared once
 * for all passes, and a step's sums are read back after the next step's
 * products are issued (a load that waits on a tile store just made stalls
 * the pipeline). */
SBX_ALWAYS void kq_amx_sweep(kq_fmt f, int T, int np, int64_t nb, const uint8_t *w, const uint8_t *x, size_t xs,
                             const uint8_t *xc, float *y, size_t ldy, const uint8_t *pf) {
    const size_t qsz = kq_qbytes(f) * QB_R, msz = kq_meta(f) * QB_R;
    const int step = f == KQ_Q6_K ? 1 : 2;
    const uint8_t *meta = w + (size_t)nb * qsz;
    uint8_t bq[4 * 4096] __attribute__((aligned(64)));
    int32_t sums[2][2][4 * 16 * 16] __attribute__((aligned(64))); /* [step % 2][pass of the step] */
    vf acc[KQ_AMX_PASSES][QK_T], accm[KQ_AMX_PASSES][QK_T];
    for (int p = 0; p < np; p++)
        for (int t = 0; t < T; t++)
            acc[p][t] = accm[p][t] = vf_zero();
    const size_t pxs = (size_t)T * xs; /* one pass's tokens */
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *qv = w + (size_t)b * qsz, *mb = meta + (size_t)b * msz;
        if (pf)
            prefetch_ahead(pf + (size_t)nb * qsz + (size_t)b * msz, msz, false);
        kq_amx_prepare(f, qv, kq_scale_bytes(f, mb), bq, pf ? pf + (size_t)b * qsz : NULL, qsz / 4);
        KQ_AMX_FENCE();
        const uint8_t *xq = x + (size_t)b * sizeof(sb_block_q8_K) + offsetof(sb_block_q8_K, qs);
        for (int p = 0; p < np + step; p += step) {
            if (p < np) {
                int32_t *out = sums[p / step % 2][0], *out2 = sums[p / step % 2][1];
                if (f == KQ_Q6_K)
                    KQ_AMX_PRODUCTS_Q6(xq + (size_t)p * pxs, xs, bq, out);
                else
                    KQ_AMX_PRODUCTS(p + 1 < np, xq + (size_t)p * pxs, xq + (size_t)(p + 1) * pxs, xs, bq, out, out2);
                KQ_AMX_FENCE();
            }
            for (int q = p - step; q >= 0 && q < p && q < np; q++) /* the previous step's passes */
                kq_amx_finish(f, T, mb, x + (size_t)q * pxs, xs, xc + (size_t)q * pxs, b,
                              sums[q / step % 2][q % step], acc[q], accm[q]);
        }
    }
    for (int p = 0; p < np; p++)
        for (int t = 0; t < T; t++)
            vf_storeu(y + (size_t)(T * p + t) * ldy, kq_mins(f) ? vf_sub(acc[p][t], accm[p][t]) : acc[p][t]);
}

/* kq_packed with the whole passes of T tokens (16, or all of a smaller
 * call) on the tiles, configured for T, released at the end. */
SBX_ALWAYS void kq_amx_packed(kq_fmt f, int64_t n, const void *wv, size_t ws, int64_t nr, const void *xv, size_t xs,
                              int64_t nt, float *y, size_t ldy) {
    if (nt < kq_amx_min_tokens(f)) {
        kq_packed(f, true, 0, n, wv, ws, nr, xv, xs, nt, y, ldy);
        return;
    }
    const int T = nt < QK_T ? (int)nt : QK_T;
    kq_amx_configure(f, T);
    kq_packed(f, true, T, n, wv, ws, nr, xv, xs, nt, y, ldy);
    _tile_release();
}

#define KQ_AMX(name, f)                                                                                           \
    static void gemm_##name##_packed_amx(int64_t n, const void *w, size_t ws, int64_t nr, const void *x,        \
                                         size_t xs, int64_t nt, float *y, size_t ldy) {                          \
        kq_amx_packed(f, n, w, ws, nr, x, xs, nt, y, ldy);                                                       \
    }
KQ_AMX(q4_K, KQ_Q4_K)
KQ_AMX(q5_K, KQ_Q5_K)
KQ_AMX(q6_K, KQ_Q6_K)
#undef KQ_AMX

/* The AMX level: the AVX-512 table (packing included) with the K-quants'
 * gemms on the tiles. Called only where cpu.c found AMX-INT8, GFNI and the
 * kernel's permission to use the tile state. */
void sb__kernels_fill_amx(sb_kernels *k) {
    k->packing[SB_TYPE_Q4_K].gemm = gemm_q4_K_packed_amx;
    k->packing[SB_TYPE_Q5_K].gemm = gemm_q5_K_packed_amx;
    k->packing[SB_TYPE_Q6_K].gemm = gemm_q6_K_packed_amx;
}
