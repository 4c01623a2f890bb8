/*
 * kquants-x86.h - Q4_K matrices packed at load with one weight row per vector
 * lane, and the Q8_K activation conversion, for the x86 levels. Included by
 * kernels-x86.h after its Q4_0 kernels (whose row transposition, 4-byte
 * products and high-nibble unpacking these reuse), so compiled once per
 * level; not a header to include anywhere else.
 *
 * (Q5_K's and Q6_K's kernels, AVX-512, are at the end: they keep ggml's
 * vec_dot order, 8 lanes per row and token.)
 *
 * Q4_K's reference (kquants.c) sums a whole block in integers - sc_j times
 * each 32-element sub-block's products, and m_j times its activation sums -
 * and then takes two fmas per block, as llama.cpp's repacked Q4_K kernels
 * do. So, as for Q4_0, a lane can hold a row: a group of QB_R rows (16 on
 * AVX-512, 8 on AVX2) is packed so that one vector load gives, for every
 * row, 4 quant bytes of the same elements (low nibbles: sub-block 2c, high:
 * 2c + 1). A token's sub-block is then 8 four-byte products of those vectors
 * with its activation bytes broadcast, in two runs of 16 elements whose sums
 * (at most 16 * 15 * 127, within int16) one 16-bit multiply-add scales by
 * the rows' sc_j; the block's min term is 8 more such multiply-adds of the
 * rows' m_j with the token's bsum pairs, prepared once per call (the
 * packing's terms). Integers are exact, so only the two fmas per block and
 * row, d_w*d_x and dmin_w*d_x, the conversions and the final acc - accm are
 * float work, the reference's own, in its order.
 *
 * A tile unpacks each block of its rows once (64 vectors of quants on the
 * stack, in L1; the scales and mins decoded from their 6-bit packing) for up
 * to QK_T tokens, so one token (decode) and many (prompts, batches) share
 * the code; the next group's rows are prefetched at the pace of the blocks
 * on the first token pass, as qb_tile does.
 */

#if SBX_AVX512
#define QK_T 8 /* tokens per pass over an unpacked block */
#define vi_storeu(p, v) _mm512_storeu_si512((void *)(p), v)
#define vi_zero _mm512_setzero_si512
#define vi_or _mm512_or_si512
#define vi_slli32 _mm512_slli_epi32
#define vi_srli32 _mm512_srli_epi32
#define vi_add32 _mm512_add_epi32
#define vi_to_vf _mm512_cvtepi32_ps
#else
#define QK_T 4
#define vi_storeu(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#define vi_zero _mm256_setzero_si256
#define vi_or _mm256_or_si256
#define vi_slli32 _mm256_slli_epi32
#define vi_srli32 _mm256_srli_epi32
#define vi_add32 _mm256_add_epi32
#define vi_to_vf _mm256_cvtepi32_ps
#endif
#define QK_QS 128   /* bytes of quants per row and block */
#define QK_META 16  /* bytes per row and block after them: d, dmin (F16), 12 bytes of scales */
#define QK_TERMS 32 /* per token and block: the 8 sub-blocks' bsum pairs, one per dword (high half 0) */

/* acc + a*b per int32 lane, for a and b that are int16 values in the low
 * half of each lane (sign-extended or zero above) with one of the two
 * zero above: vpdpwssd's (or pmaddwd's) pair sum is then the one product. */
SBX_ALWAYS vi qk_madd(vi acc, vi a, vi b) {
#if SBX_AVX512
    return _mm512_dpwssd_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

/* QB_R bytes at p (one per row), zero-extended to the rows' int32 lanes. */
SBX_ALWAYS vi qk_widen(const uint8_t *p) {
#if SBX_AVX512
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
#else
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
#endif
}

/* QB_R F16 values at p, as floats. */
SBX_ALWAYS vf qk_f16(const uint8_t *p) {
#if SBX_AVX512
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#else
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#endif
}

/* The rows' 6-bit scales sc[j] and mins m[j] of one block from its 12
 * transposed scale bytes (byte i of every row at s + i*QB_R): as
 * sb__k4_scale_min, lane by lane. */
SBX_ALWAYS void qk_scales(const uint8_t *s, vi sc[8], vi m[8]) {
    vi b[12];
    SBX_UNROLL for (int i = 0; i < 12; i++)
        b[i] = qk_widen(s + i * QB_R);
    const vi m6 = vi_set1_32(63), m4 = vi_set1_32(0xf);
    SBX_UNROLL for (int j = 0; j < 4; j++) {
        sc[j] = vi_and(b[j], m6);
        m[j] = vi_and(b[j + 4], m6);
        sc[j + 4] = vi_or(vi_and(b[j + 8], m4), vi_slli32(vi_srli32(b[j], 6), 4));
        m[j + 4] = vi_or(vi_srli32(b[j + 8], 4), vi_slli32(vi_srli32(b[j + 4], 6), 4));
    }
}

/* T tokens against one packed group of QB_R rows: y[t*ldy + r]. x: the
 * tokens' Q8_K rows, xs apart, each followed (at xc) by its terms; pf: the
 * next group, prefetched at the pace of the blocks, or NULL. */
SBX_ALWAYS void qk_tile(bool gfni, int T, int64_t nb, const uint8_t *w, const uint8_t *x, size_t xs,
                        const uint8_t *xc, float *y, size_t ldy, const uint8_t *pf) {
    const uint8_t *meta = w + (size_t)nb * QK_QS * QB_R;
    const vi m4 = vi_set1_8(0x0f);
    vf acc[QK_T], accm[QK_T];
    SBX_UNROLL for (int t = 0; t < T; t++)
        acc[t] = accm[t] = vf_zero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *qv = w + (size_t)b * QK_QS * QB_R, *mb = meta + (size_t)b * QK_META * QB_R;
        if (pf) {
            prefetch_ahead(pf + (size_t)b * QK_QS * QB_R, QK_QS * QB_R);
            prefetch_ahead(pf + (size_t)nb * QK_QS * QB_R + (size_t)b * QK_META * QB_R, QK_META * QB_R);
        }
        /* wq[8j + k]: dword k of sub-block j, every row */
        vi wq[64], sc[8], mn[8];
        SBX_UNROLL for (int c = 0; c < 4; c++)
            SBX_UNROLL for (int k = 0; k < 8; k++) {
                const vi v = vi_loadu(qv + (size_t)(8 * c + k) * 4 * QB_R);
                wq[16 * c + k] = vi_and(v, m4);
                wq[16 * c + 8 + k] = qb_high_nibbles(v, m4, gfni);
            }
        qk_scales(mb + 4 * QB_R, sc, mn);
        const vf dw = qk_f16(mb), dmw = qk_f16(mb + 2 * QB_R);
        SBX_UNROLL for (int t = 0; t < T; t++) {
            const uint8_t *xb = x + (size_t)t * xs + (size_t)b * sizeof(sb_block_q8_K);
            const uint8_t *xq = xb + offsetof(sb_block_q8_K, qs), *ct = xc + (size_t)t * xs + (size_t)b * QK_TERMS;
            float dx;
            memcpy(&dx, xb, sizeof(dx));
            /* two sums of sub-block products (shorter dependency chains), one of mins */
            vi isum0 = vi_zero(), isum1 = vi_zero(), imin = vi_zero();
            SBX_UNROLL for (int j = 0; j < 8; j++) {
                vi s0 = vi_zero(), s1 = vi_zero();
                SBX_UNROLL for (int k = 0; k < 4; k++) {
                    s0 = qb_dot4(s0, wq[8 * j + k], xq + 32 * j + 4 * k);
                    s1 = qb_dot4(s1, wq[8 * j + 4 + k], xq + 32 * j + 16 + 4 * k);
                }
                isum0 = qk_madd(isum0, s0, sc[j]);
                isum1 = qk_madd(isum1, s1, sc[j]);
                imin = qk_madd(imin, mn[j], vi_set1_32(load_i32(ct + 4 * j)));
            }
            const vf vdx = vf_set1(dx);
            acc[t] = vf_fma(vi_to_vf(vi_add32(isum0, isum1)), vf_mul(dw, vdx), acc[t]);
            accm[t] = vf_fma(vi_to_vf(imin), vf_mul(dmw, vdx), accm[t]);
        }
    }
    SBX_UNROLL for (int t = 0; t < T; t++)
        vf_storeu(y + (size_t)t * ldy, vf_sub(acc[t], accm[t]));
}

/* Groups outer, passes of QK_T tokens inner: a group's rows are read from
 * memory once per call. Every Q8_K row carries its terms after its blocks. */
SBX_ALWAYS void q4_K_packed(bool gfni, int64_t n, const void *wv, size_t ws, int64_t nr, const void *xv, size_t xs,
                            int64_t nt, float *y, size_t ldy) {
    const uint8_t *w = wv, *x = xv;
    const int64_t nb = n / SB_QK_K;
    const uint8_t *xc = x + (size_t)nb * sizeof(sb_block_q8_K);
    for (int64_t r = 0; r < nr; r += QB_R) {
        const uint8_t *wr = w + (size_t)r * ws;
        for (int64_t t = 0; t < nt; t += QK_T) {
            const uint8_t *xt = x + (size_t)t * xs, *xct = xc + (size_t)t * xs;
            float *yt = y + (size_t)t * ldy + (size_t)r;
            const uint8_t *pf = t == 0 ? wr + (size_t)QB_R * ws : NULL;
            switch (nt - t < QK_T ? nt - t : QK_T) {
            case 1: qk_tile(gfni, 1, nb, wr, xt, xs, xct, yt, ldy, pf); break;
            case 2: qk_tile(gfni, 2, nb, wr, xt, xs, xct, yt, ldy, pf); break;
            case 3: qk_tile(gfni, 3, nb, wr, xt, xs, xct, yt, ldy, pf); break;
#if QK_T > 4
            case 4: qk_tile(gfni, 4, nb, wr, xt, xs, xct, yt, ldy, pf); break;
            case 5: qk_tile(gfni, 5, nb, wr, xt, xs, xct, yt, ldy, pf); break;
            case 6: qk_tile(gfni, 6, nb, wr, xt, xs, xct, yt, ldy, pf); break;
            case 7: qk_tile(gfni, 7, nb, wr, xt, xs, xct, yt, ldy, pf); break;
#endif
            default: qk_tile(gfni, QK_T, nb, wr, xt, xs, xct, yt, ldy, pf); break;
            }
        }
    }
}

static void gemm_q4_K_packed(int64_t n, const void *w, size_t ws, int64_t nr, const void *x, size_t xs, int64_t nt,
                             float *y, size_t ldy) {
    q4_K_packed(false, n, w, ws, nr, x, xs, nt, y, ldy);
}

#if SBX_AVX512
static void gemm_q4_K_packed_gfni(int64_t n, const void *w, size_t ws, int64_t nr, const void *x, size_t xs,
                                  int64_t nt, float *y, size_t ldy) {
    q4_K_packed(true, n, w, ws, nr, x, xs, nt, y, ldy);
}
#endif

/* The terms of one Q8_K row: per block, bsum_2j + bsum_2j+1 of its 8
 * sub-blocks of 32, each as an int16 in the low half of a dword. */
static void qk_terms(const void *x, int64_t n, void *dst) {
    const sb_block_q8_K *xb = x;
    uint8_t *out = dst;
    for (int64_t b = 0; b < n / SB_QK_K; b++)
        for (int j = 0; j < 8; j++) {
            const uint32_t v = (uint16_t)(int16_t)(xb[b].bsums[2 * j] + xb[b].bsums[2 * j + 1]);
            memcpy(out + (size_t)b * QK_TERMS + 4 * j, &v, sizeof(v));
        }
}

/* Groups of QB_R rows: for each block the 32 vectors of its quants (dword k
 * of every row's qs, row r at byte 4r of vector k), then for each block the
 * rows' d, their dmin, and their 12 scale bytes, byte i of every row
 * together. Same size as the rows. */
static void pack_q4_K(const void *src, void *dst, int64_t n_in, int64_t n_out) {
    const int64_t nb = n_in / SB_QK_K;
    const size_t row = (size_t)nb * sizeof(sb_block_q4_K);
    const uint8_t *rp[QB_R];
    for (int64_t g = 0; g < n_out / QB_R; g++) {
        const uint8_t *in = (const uint8_t *)src + (size_t)g * QB_R * row;
        uint8_t *out = (uint8_t *)dst + (size_t)g * QB_R * row, *meta = out + (size_t)nb * QK_QS * QB_R;
        for (int r = 0; r < QB_R; r++)
            rp[r] = in + (size_t)r * row;
        for (int64_t b = 0; b < nb; b++) {
            const size_t o = (size_t)b * sizeof(sb_block_q4_K);
            for (int i = 0; i < QK_QS / 16; i++) {
                vi v[4];
                qb_transpose(rp, o + offsetof(sb_block_q4_K, qs) + 16 * (size_t)i, v);
                for (int j = 0; j < 4; j++)
                    vi_storeu(out + (size_t)b * QK_QS * QB_R + (size_t)(4 * i + j) * 4 * QB_R, v[j]);
            }
            uint8_t *mb = meta + (size_t)b * QK_META * QB_R;
            for (int r = 0; r < QB_R; r++) {
                memcpy(mb + 2 * r, rp[r] + o + offsetof(sb_block_q4_K, d), 2);
                memcpy(mb + 2 * QB_R + 2 * r, rp[r] + o + offsetof(sb_block_q4_K, dmin), 2);
                for (int i = 0; i < 12; i++)
                    mb[4 * QB_R + i * QB_R + r] = rp[r][o + offsetof(sb_block_q4_K, scales) + (size_t)i];
            }
        }
    }
}

SBX_ALWAYS vf qk_abs(vf v) {
#if SBX_AVX512
    return _mm512_abs_ps(v);
#else
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
#endif
}

/* quantize_row_q8_K_ref (kquants.c) for finite input: d = max/-127 with max
 * the first element of largest magnitude, q = nearest-even(x * -127/max) at
 * most 127, bsums per 16. The maximum skips NaN as the reference's compare
 * does (vmaxps returns its second operand when the first is NaN). */
static void act_q8_K(const float *src, void *dst, int64_t n) {
    sb_block_q8_K *blk = dst;
    for (int64_t b = 0; b < n / SB_QK_K; b++, blk++, src += SB_QK_K) {
        vf vmax = vf_zero();
        for (int i = 0; i < SB_QK_K; i += VW)
            vmax = vf_max(qk_abs(vf_loadu(src + i)), vmax);
        float lanes[VW], amax = 0;
        vf_storeu(lanes, vmax);
        for (int i = 0; i < VW; i++)
            amax = lanes[i] > amax ? lanes[i] : amax;
        memset(blk, 0, sizeof(*blk));
        if (amax == 0)
            continue;
        int first = 0;
        for (int i = 0; i < SB_QK_K; i += VW) {
#if SBX_AVX512
            const unsigned hit = _mm512_cmp_ps_mask(qk_abs(vf_loadu(src + i)), vf_set1(amax), _CMP_EQ_OQ);
#else
            const unsigned hit =
                (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(qk_abs(vf_loadu(src + i)), vf_set1(amax), _CMP_EQ_OQ));
#endif
            if (hit) {
                first = i + __builtin_ctz(hit);
                break;
            }
        }
        const float iscale = -127.0f / src[first];
        const vf vis = vf_set1(iscale);
        for (int j = 0; j < SB_QK_K / 16; j++) {
#if SBX_AVX512
            const __m512i q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(src + 16 * j), vis)),
                                               _mm512_set1_epi32(127));
            _mm_storeu_si128((__m128i *)(blk->qs + 16 * j), _mm512_cvtsepi32_epi8(q));
            blk->bsums[j] = (int16_t)_mm512_reduce_add_epi32(q);
#else
            const __m256i c127 = _mm256_set1_epi32(127);
            const __m256i q0 = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + 16 * j), vis)), c127);
            const __m256i q1 =
                _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + 16 * j + 8), vis)), c127);
            /* packs work within 128-bit halves; the permute puts them back in order */
            const __m256i p16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xd8);
            _mm_storeu_si128((__m128i *)(blk->qs + 16 * j),
                             _mm_packs_epi16(_mm256_castsi256_si128(p16), _mm256_extracti128_si256(p16, 1)));
            const __m256i s8 = _mm256_add_epi32(q0, q1);
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            blk->bsums[j] = (int16_t)_mm_cvtsi128_si32(s4);
#endif
        }
        blk->d = 1 / iscale;
    }
}

#if SBX_AVX512
/* ==== Q5_K and Q6_K, several rows and tokens (AVX-512) ===================
 *
 * These keep ggml's AVX2 vec_dot order (kquants.c: eight int32 lanes per
 * (row, token) pair and block, lane l collecting the elements with
 * (e % 32) / 4 == l, one fma per lane and block, then the halving sum; Q5_K
 * adds its min term, one scalar fma per block, after it). llama.cpp does
 * not repack them on x86, so this is what it runs. A zmm of 64 quants holds
 * two runs of 32 whose lanes l and l + 8 are the same reference lane: per 64
 * elements one vpdpbusd (4 products per lane, at most 4 * 63 * 127, within
 * int16) and one vpdpwssd by the lanes' sub-block scales, the two halves
 * added at the end of the block; Q6_K's +32 comes off through the
 * activation's bsums as in the reference. A tile of KL_R rows is unpacked
 * once per block (quants to bytes, scales to the lanes' vectors) for KL_T
 * tokens. Exact integers, the reference's float steps. */
#define KL_R 4
#define KL_T 4

typedef struct {
    __m512i q[4];  /* quants (unsigned) of elements 64p..64p+63 */
    __m512i sc[4]; /* lane i of q[p]: its sub-block's scale, an int16 with a zero high half */
    __m256i sc16;  /* Q6_K: the 16 scales as int16, for the bsums' correction */
    __m128i m16;   /* Q5_K: the 8 mins as int16 */
    float d, dmin;
} kl_row;

/* Bits 4.. of Q5_K's quants of run r (of 8): bit r of each qh byte, at bit 4. */
SBX_ALWAYS __m256i q5_high(__m256i qh, int r) {
    return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, r), _mm256_set1_epi8(1)), 4);
}

SBX_ALWAYS void kl_unpack(sb_type type, const uint8_t *blk, kl_row *o) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i run[8];
    __m512i sc32;
    if (type == SB_TYPE_Q6_K) {
        const sb_block_q6_K *b = (const sb_block_q6_K *)blk;
        const __m256i m2 = _mm256_set1_epi8(3);
        for (int c = 0; c < 2; c++) { /* 128 elements: 4 runs of 32 (kquants_avx2.c) */
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * c));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * c + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * c));
            run[4 * c] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4));
            run[4 * c + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4));
            run[4 * c + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4));
            run[4 * c + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4));
        }
        /* q[p] lane i: sub-block 4p + i/4 */
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)b->scales);
        sc32 = _mm512_and_si512(_mm512_cvtepi8_epi32(sc8), _mm512_set1_epi32(0xffff));
        o->sc16 = _mm256_cvtepi8_epi16(sc8);
        o->d = _cvtsh_ss(b->d);
    } else { /* Q5_K */
        const sb_block_q5_K *b = (const sb_block_q5_K *)blk;
        const __m256i qh = _mm256_loadu_si256((const __m256i *)b->qh);
        for (int j = 0; j < 4; j++) { /* 64 elements: low nibbles, then high */
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * j));
            run[2 * j] = _mm256_or_si256(_mm256_and_si256(bits, m4), q5_high(qh, 2 * j));
            run[2 * j + 1] =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), q5_high(qh, 2 * j + 1));
        }
        int32_t sc[16], m[8];
        for (int j = 0; j < 8; j++) {
            int scj, mj;
            sb__k4_scale_min(b->scales, j, &scj, &mj);
            sc[2 * j] = sc[2 * j + 1] = scj;
            m[j] = mj;
        }
        /* q[p] lane i: sub-block 2p + i/8; sc32 holds each sub-block's scale twice */
        sc32 = _mm512_loadu_si512(sc);
        o->m16 = _mm_packs_epi32(_mm_loadu_si128((const __m128i *)m), _mm_loadu_si128((const __m128i *)(m + 4)));
        o->d = _cvtsh_ss(b->d);
        o->dmin = _cvtsh_ss(b->dmin);
    }
    for (int p = 0; p < 4; p++) {
        o->q[p] = _mm512_inserti64x4(_mm512_castsi256_si512(run[2 * p]), run[2 * p + 1], 1);
        const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        o->sc[p] = _mm512_permutexvar_epi32(_mm512_add_epi32(_mm512_set1_epi32(4 * p), _mm512_srli_epi32(lane, 2)),
                                            sc32);
    }
}

/* One more block of a pair: acc (its 8 lanes) = fma(D, lanes, acc), and for
 * Q5_K *accm = fma(Dmin, sum(m * bsum pairs), *accm). */
SBX_ALWAYS __m256 kl_block(sb_type type, const kl_row *w, const sb_block_q8_K *x, __m256 acc, float *accm) {
    __m512i isum = _mm512_setzero_si512();
    SBX_UNROLL for (int p = 0; p < 4; p++) {
        const __m512i s =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), w->q[p], _mm512_loadu_si512(x->qs + 64 * p));
        isum = _mm512_dpwssd_epi32(isum, s, w->sc[p]);
    }
    __m256i lanes = _mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1));
    const __m256i bsums = _mm256_loadu_si256((const __m256i *)x->bsums);
    if (type == SB_TYPE_Q6_K) {
        lanes = _mm256_sub_epi32(lanes, _mm256_slli_epi32(_mm256_madd_epi16(bsums, w->sc16), 5));
    } else {
        /* bsum pairs (exact in int16 for any Q8_K row) times the mins, summed */
        const __m256i pairs = _mm256_madd_epi16(bsums, _mm256_set1_epi16(1));
        const __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(pairs), _mm256_extracti128_si256(pairs, 1));
        __m128i g = _mm_madd_epi16(p16, w->m16);
        g = _mm_add_epi32(g, _mm_shuffle_epi32(g, 0x4e));
        g = _mm_add_epi32(g, _mm_shuffle_epi32(g, 0xb1));
        *accm = fmaf(-x->d * w->dmin, (float)_mm_cvtsi128_si32(g), *accm);
    }
    return _mm256_fmadd_ps(_mm256_set1_ps(x->d * w->d), _mm256_cvtepi32_ps(lanes), acc);
}

/* ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), as the reference's hsum. */
SBX_ALWAYS float kl_hsum(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

SBX_ALWAYS void kl_tile(sb_type type, int R, int T, int64_t nb, const uint8_t *w, size_t ws, const uint8_t *x,
                        size_t xs, float *y, size_t ldy) {
    const size_t bsize = type == SB_TYPE_Q6_K ? sizeof(sb_block_q6_K) : sizeof(sb_block_q5_K);
    __m256 acc[KL_R * KL_T];
    float accm[KL_R * KL_T];
    SBX_UNROLL for (int i = 0; i < R * T; i++) {
        acc[i] = _mm256_setzero_ps();
        accm[i] = 0.0f;
    }
    for (int64_t b = 0; b < nb; b++) {
        kl_row rows[KL_R];
        SBX_UNROLL for (int r = 0; r < R; r++)
            kl_unpack(type, w + (size_t)r * ws + (size_t)b * bsize, &rows[r]);
        SBX_UNROLL for (int t = 0; t < T; t++) {
            const sb_block_q8_K *xb = (const sb_block_q8_K *)(x + (size_t)t * xs) + b;
            SBX_UNROLL for (int r = 0; r < R; r++)
                acc[t * R + r] = kl_block(type, &rows[r], xb, acc[t * R + r], &accm[t * R + r]);
        }
    }
    SBX_UNROLL for (int t = 0; t < T; t++)
        SBX_UNROLL for (int r = 0; r < R; r++) {
            const float sum = kl_hsum(acc[t * R + r]);
            y[(size_t)t * ldy + (size_t)r] = type == SB_TYPE_Q6_K ? sum : sum + accm[t * R + r];
        }
}

/* Tiles of KL_R rows x KL_T tokens, rows outer; remainders in tiles of one
 * row or one token. */
SBX_ALWAYS void kl_gemm(sb_type type, int64_t n, const void *wv, size_t ws, int64_t nr, const void *xv, size_t xs,
                        int64_t nt, float *y, size_t ldy) {
    const uint8_t *w = wv, *x = xv;
    const int64_t nb = n / SB_QK_K;
    for (int64_t r = 0; r < nr;) {
        const bool full_r = r + KL_R <= nr;
        for (int64_t t = 0; t < nt;) {
            const bool full_t = t + KL_T <= nt;
            const uint8_t *wr = w + (size_t)r * ws, *xt = x + (size_t)t * xs;
            float *yt = y + (size_t)t * ldy + (size_t)r;
            if (full_r && full_t)
                kl_tile(type, KL_R, KL_T, nb, wr, ws, xt, xs, yt, ldy);
            else if (full_r)
                kl_tile(type, KL_R, 1, nb, wr, ws, xt, xs, yt, ldy);
            else if (full_t)
                kl_tile(type, 1, KL_T, nb, wr, ws, xt, xs, yt, ldy);
            else
                kl_tile(type, 1, 1, nb, wr, ws, xt, xs, yt, ldy);
            t += full_t ? KL_T : 1;
        }
        r += full_r ? KL_R : 1;
    }
}

static void gemm_q5_K(int64_t n, const void *w, size_t ws, int64_t nr, const void *x, size_t xs, int64_t nt,
                      float *y, size_t ldy) {
    kl_gemm(SB_TYPE_Q5_K, n, w, ws, nr, x, xs, nt, y, ldy);
}

static void gemm_q6_K(int64_t n, const void *w, size_t ws, int64_t nr, const void *x, size_t xs, int64_t nt,
                      float *y, size_t ldy) {
    kl_gemm(SB_TYPE_Q6_K, n, w, ws, nr, x, xs, nt, y, ldy);
}
#endif
