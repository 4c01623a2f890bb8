/*
 * kquants-amx.h - the K-quant tiles of many tokens on AMX (Intel's tile
 * matrix unit, AMX-INT8: Sapphire Rapids and later), the SB_CPU_AMX level.
 * Included by kernels-x86.h after kquants-x86.h at the AVX-512 level only,
 * whose packed layout, unpacking and block ends these reuse; not a header
 * to include anywhere else.
 *
 * Why: one TDPBSSD multiplies a tile of up to 16 tokens' activation bytes
 * by 16 rows' quant bytes, 16 x 16 x 64 products in the time the vector
 * unit takes for a few hundred, on a unit of its own. VNNI's tile spends 20
 * multiply-port operations per token, 16 rows and 64 elements; here a
 * sub-block of 16 tokens is one tile product, its 16 sums per token stored
 * and scaled by the rows' sc_j (one vpmulld a token), so the vector unit is
 * left the unpacking and the scaling.
 *
 * The packed group is already AMX's B layout: its vector k holds, for each
 * of the 16 rows, the 4 quant bytes of elements 4k..4k+3, which is row k of
 * a B tile whose 16 columns are the weight rows. kq_unpack's vectors (bytes
 * 0..63, so signed bytes too) go to a 1 KB buffer a unit at a time and load
 * as B, one tile a sub-block (S = 32 elements for Q4_K and Q5_K, 16 for the
 * others); A is the tokens' Q8_K bytes of the sub-block, loaded in place
 * (row stride xs). The tile C (tokens x rows, int32) gives each token's
 * sum of the sub-block for every row in one vector, as the VNNI chains do;
 * Q3_K's and Q6_K's bias (-4 and -32 times the sub-block's activation sum)
 * is added to it, and isum[t] += sum * sc_j. Integers are exact, so isum is
 * the reference's, and the block's floats are kq_block_end's.
 *
 * Tiles: 0 = C (T rows of 16 int32), 1 = A (T rows of S bytes), 2 = B (S / 4
 * rows of 64 bytes). The configuration is loaded per call for one T (every
 * full pass of QK_T tokens, or all the tokens of a smaller call), the rest
 * of the tokens go through the VNNI tile, and the tiles are released at the
 * end so that a thread holds AMX state only inside a call.
 */

/* fewest tokens a call must have for the tiles (below, the VNNI tile) */
#define KQ_AMX_MIN_T 4

/* The tile configuration (LDTILECFG's 64-byte operand, palette 1). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} kq_amx_cfg;

/* GCC's tile intrinsics are asm statements that do not say which memory
 * they read or write: a compiler barrier after the B buffer is written and
 * after C is stored keeps the vector code's stores and loads on the right
 * side of them. */
#define KQ_AMX_FENCE() __asm__ volatile("" ::: "memory")

SBX_ALWAYS int kq_amx_sub(kq_fmt f) { return f == KQ_Q4_K || f == KQ_Q5_K ? 32 : 16; }

static void kq_amx_configure(kq_fmt f, int T) {
    kq_amx_cfg c __attribute__((aligned(64)));
    memset(&c, 0, sizeof(c));
    c.palette = 1;
    static const int sums[] = {0, 3, 4, 5}, acts[] = {1, 6}, quants[] = {2, 7};
    for (int i = 0; i < 4; i++) {
        c.rows[sums[i]] = (uint8_t)T;
        c.colsb[sums[i]] = 64;
    }
    for (int i = 0; i < 2; i++) {
        c.rows[acts[i]] = (uint8_t)T;
        c.colsb[acts[i]] = (uint16_t)kq_amx_sub(f);
        c.rows[quants[i]] = (uint8_t)(kq_amx_sub(f) / 4);
        c.colsb[quants[i]] = 64;
    }
    _tile_loadconfig(&c);
}

/* Sub-block j's scale of the rows, sign-extended to int32 for vpmulld. */
SBX_ALWAYS vi kq_amx_scale(kq_fmt f, const uint8_t *sb, int j) {
    const vi v = kq_scale(f, true, sb, j);
    return f == KQ_Q3_K ? _mm512_srai_epi32(vi_slli32(v, 16), 16) : v;
}

/* One sub-block's product: C tile c = A tile a (the tokens' bytes of
 * elements q..q+S) x B tile b (the rows' bytes from the buffer), stored to
 * out. Tile numbers are literals in the asm of GCC's intrinsics. */
#define KQ_AMX_PRODUCT(c, a, b, xq, xs, bq, out)                                                                  \
    do {                                                                                                          \
        _tile_zero(c);                                                                                            \
        _tile_loadd(a, xq, (long)(xs));                                                                           \
        _tile_loadd(b, bq, 64);                                                                                   \
        _tile_dpbssd(c, a, b);                                                                                    \
        _tile_stored(c, out, 64);                                                                                 \
    } while (0)

/* T tokens (the configured count) against one packed group, as kq_tile, a
 * block at a time in three phases: the whole block unpacked into the B
 * buffer (element order: sub-block j is its rows S/4 * j..), every
 * sub-block's product stored, four C tiles in turn so that a product need
 * not wait for the previous one's store, then the sums scaled. A sum is
 * read back only after the other sub-blocks' products were issued: a load
 * that waits on a tile store just made stalls the pipeline. */
SBX_ALWAYS void kq_amx_tile(kq_fmt f, bool gfni, int T, int64_t nb, const uint8_t *w, const uint8_t *x, size_t xs,
                            const uint8_t *xc, float *y, size_t ldy, const uint8_t *pf) {
    const size_t qsz = kq_qbytes(f) * QB_R, msz = kq_meta(f) * QB_R;
    const int S = kq_amx_sub(f), NS = SB_QK_K / kq_amx_sub(f);
    const uint8_t *meta = w + (size_t)nb * qsz;
    uint8_t bq[64 * 64] __attribute__((aligned(64)));
    int32_t cs[16][QK_T * 16] __attribute__((aligned(64)));
    vf acc[QK_T], accm[QK_T];
    for (int t = 0; t < T; t++)
        acc[t] = accm[t] = vf_zero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *qv = w + (size_t)b * qsz, *mb = meta + (size_t)b * msz;
        if (pf)
            prefetch_ahead(pf + (size_t)nb * qsz + (size_t)b * msz, msz);
        const uint8_t *sb = kq_scale_bytes(f, mb);
        const uint8_t *xq = x + (size_t)b * sizeof(sb_block_q8_K) + offsetof(sb_block_q8_K, qs);
        const uint8_t *ct = xc + (size_t)b * KQ_TERMS;
        SBX_UNROLL for (int u = 0; u < 4; u++) {
            vi wq[64];
            if (pf)
                prefetch_ahead(pf + (size_t)b * qsz + (size_t)u * (qsz / 4), qsz / 4);
            kq_unpack(f, gfni, qv, u, wq);
            SBX_UNROLL for (int i = 0; i < 4; i++) {
                const int g = kq_unit_group(f, u, i);
                SBX_UNROLL for (int k = 0; k < 4; k++)
                    _mm512_store_si512(bq + 64 * (4 * g + k), wq[4 * g + k]);
            }
        }
        KQ_AMX_FENCE();
        for (int j = 0; j < NS; j += 4) {
            const size_t bj = (size_t)64 * (size_t)(S / 4);
            KQ_AMX_PRODUCT(0, 1, 2, xq + S * j, xs, bq + bj * (size_t)j, cs[j]);
            KQ_AMX_PRODUCT(3, 1, 2, xq + S * (j + 1), xs, bq + bj * (size_t)(j + 1), cs[j + 1]);
            KQ_AMX_PRODUCT(4, 6, 7, xq + S * (j + 2), xs, bq + bj * (size_t)(j + 2), cs[j + 2]);
            KQ_AMX_PRODUCT(5, 6, 7, xq + S * (j + 3), xs, bq + bj * (size_t)(j + 3), cs[j + 3]);
        }
        KQ_AMX_FENCE();
        vi sc[16], isum[QK_T];
        SBX_UNROLL for (int j = 0; j < NS; j++)
            sc[j] = kq_amx_scale(f, sb, j);
        for (int t = 0; t < T; t++) {
            vi sum = vi_zero();
            SBX_UNROLL for (int j = 0; j < NS; j++) {
                vi s = _mm512_load_si512(cs[j] + 16 * t);
                if (f == KQ_Q3_K || f == KQ_Q6_K) {
                    const size_t bias = f == KQ_Q3_K ? KQ_TERMS_BIAS3 : KQ_TERMS_BIAS6_16;
                    s = vi_add32(s, vi_set1_32(load_i32(ct + (size_t)t * xs + bias + 4 * (size_t)j)));
                }
                sum = vi_add32(sum, vi_mullo32(s, sc[j]));
            }
            isum[t] = sum;
        }
        kq_block_end(f, T, mb, x, xs, xc, b, isum, acc, accm);
    }
    for (int t = 0; t < T; t++)
        vf_storeu(y + (size_t)t * ldy, kq_mins(f) ? vf_sub(acc[t], accm[t]) : acc[t]);
}

/* kq_packed with the passes of the configured token count on the tiles. */
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
    const int64_t tb = token_block(xs, QK_T);
    kq_amx_configure(f, T);
    for (int64_t t0 = 0; t0 < nt; t0 += tb) {
        const int64_t t1 = t0 + tb < nt ? t0 + tb : nt;
        for (int64_t r = 0; r < nr; r += QB_R) {
            const uint8_t *wr = w + (size_t)r * ws;
            const bool pf_next = r + QB_R < nr || t1 == nt;
            for (int64_t t = t0; t < t1; t += QK_T) {
                const uint8_t *xt = x + (size_t)t * xs, *xct = xc + (size_t)t * xs;
                float *yt = y + (size_t)t * ldy + (size_t)r;
                const uint8_t *pf = t == t0 && pf_next ? wr + (size_t)QB_R * ws : NULL;
                const int tt = t1 - t < QK_T ? (int)(t1 - t) : QK_T;
                if (tt == T)
                    kq_amx_tile(f, true, T, nb, wr, xt, xs, xct, yt, ldy, pf);
                else
                    kq_tile(f, true, KQ_Q6_M32_BATCHED, tt, nb, wr, xt, xs, xct, yt, ldy, pf);
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
