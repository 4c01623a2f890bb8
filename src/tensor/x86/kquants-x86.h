/*
 * kquants-x86.h - K-quant matrices (Q2_K..Q6_K) packed at load with one
 * weight row per vector lane, and the Q8_K activation conversion, for the
 * x86 levels. Included by kernels-x86.h after its Q4_0 kernels (whose row
 * transposition, 4-byte products and high-nibble unpacking these reuse), so
 * compiled once per level; not a header to include anywhere else.
 *
 * Their reference (kquants.c) sums a whole block in integers - sc_j times
 * each sub-block's products, and m_j times its activation sums - and then
 * takes one fma per block and row (two with mins), as llama.cpp's repacked
 * Q4_K kernels do. So, as for Q4_0, a lane can hold a row: a group of QB_R
 * rows (16 on AVX-512, 8 on AVX2) is packed so that one vector load gives,
 * for every row, 4 quant bytes of the same elements. A token's sub-block is
 * then a chain of four-byte products of those vectors with its activation
 * bytes broadcast, scaled by the rows' sc_j: runs whose sums fit int16 by
 * a 16-bit multiply-add (16 elements of Q2_K, Q3_K, Q4_K; 8 of Q6_K, its
 * quants less 32); Q5_K's sub-blocks (up to 32 * 31 * 127), and Q6_K's (16 *
 * 63 * 127) in AVX-512's batched tiles (KQ_Q6_M32_BATCHED), by one 32-bit
 * multiply each (fewer uops than the multiply-adds of shorter runs). Quants
 * are unpacked unsigned. Q3_K's +4 and Q6_K's +32 come off through the chains'
 * starting values, -4 * bsum_j and -32 times the sum of the run's
 * activations (of 8, or of 16 with Q6_K's multiplies), as the scale then
 * multiplies them with the products; the mins' term of the formats with
 * mins is 4 to 8 16-bit multiply-adds per block (pairs of m_j with pairs of
 * the token's sums). The terms are prepared once per call (the packing's
 * terms, shared by the five formats so that a layer's Q4_K or Q5_K and
 * Q6_K matrices take one conversion of their input). Integers are exact,
 * so only the fmas per block and row, the scale products, the conversions
 * and the final acc - accm are float work, the reference's own, in its
 * order.
 *
 * A tile takes each block of its rows a quarter at a time (16 vectors of
 * quants unpacked into registers, with the scales of its sub-blocks; the
 * mins decoded once per block, after the units) for up to QK_T tokens, so
 * one token (decode) and many (prompts, batches) share the code; the next
 * group's rows are prefetched at the pace of the units on the first token
 * pass, as qb_tile does at the pace of its blocks.
 */

#if SBX_AVX512
/* tokens per pass over an unpacked block: 16 unpack half as often per
 * token as 8 did (110M pp512: Q5_K_M +13%, Q4_K_M +8%) */
#define QK_T 16
#else
#define QK_T 4
#endif

/* The packed formats, compile-time constants of the tile functions. */
typedef enum { KQ_Q2_K, KQ_Q3_K, KQ_Q4_K, KQ_Q5_K, KQ_Q6_K } kq_fmt;

/* Per row and block in a packed group: first the quant bytes of all blocks
 * of the group (each block's low bits, qs, as vectors of one dword of every
 * row, dword k in vector k; then its high bits, qh or hmask, the same way;
 * Q6_K's 192 bytes in the order of kq_q6_planes), then all blocks' meta: d
 * (F16), dmin (F16, formats with mins) and the scale bytes, byte i of every
 * row together. */
SBX_ALWAYS size_t kq_lobytes(kq_fmt f) { return f <= KQ_Q3_K ? 64 : 128; }
SBX_ALWAYS size_t kq_qbytes(kq_fmt f) {
    return f == KQ_Q2_K ? 64 : f == KQ_Q3_K ? 96 : f == KQ_Q4_K ? 128 : f == KQ_Q5_K ? 160 : 192;
}
SBX_ALWAYS bool kq_mins(kq_fmt f) { return f == KQ_Q2_K || f == KQ_Q4_K || f == KQ_Q5_K; }
SBX_ALWAYS int kq_nscales(kq_fmt f) { return f == KQ_Q2_K || f == KQ_Q6_K ? 16 : 12; } /* scale bytes */
SBX_ALWAYS size_t kq_meta(kq_fmt f) { return (kq_mins(f) ? 4 : 2) + (size_t)kq_nscales(f); }
SBX_ALWAYS int kq_sub(kq_fmt f) { return f == KQ_Q4_K || f == KQ_Q5_K ? 32 : 16; } /* elements per sub-block */
/* Q6_K's sub-blocks of 16 by a 32-bit multiply (m32: the tiles of several
 * tokens on AVX-512), or in runs of 8 of its quants less 32. A run of 8
 * takes a multiply-add and a broadcast starting value, where vpdpbusd adds
 * its products into the chain for free: in the AVX-512 tiles of several
 * tokens the multiply per 16 is 1.17x faster (Zen 5, 8 tokens, 768 x
 * 32000: 361-366 -> 412-433 GFLOP/s); for one token
 * (decode) it streamed cold rows of 2048 and more at 18-21 GB/s against
 * 33-35, and on AVX2 (pmaddubsw, pmaddwd and an add per 4 bytes either way)
 * it is 8% slower. */
#define KQ_Q6_M32_BATCHED SBX_AVX512
/* Elements per chain of products that one scale multiplies: sums within
 * int16, scaled by a 16-bit multiply-add, for Q2_K, Q3_K and Q4_K (16 * 15 *
 * 127 at most) and Q6_K, whose quants less 32 take runs of 8 (8 * 32 * 127:
 * the Q8_K quants are -127..127, as the quantizer makes them); by a 32-bit
 * multiply (kq_mul32), Q5_K's whole sub-block (32 * 31 * 127; one per 32
 * elements, where runs of 8 would take 4 multiply-adds) and with m32 Q6_K's
 * (16 * 63 * 127). */
SBX_ALWAYS bool kq_mul32(kq_fmt f, bool m32) { return f == KQ_Q5_K || (f == KQ_Q6_K && m32); }
SBX_ALWAYS int kq_run(kq_fmt f, bool m32) { return f == KQ_Q5_K ? 32 : f == KQ_Q6_K && !m32 ? 8 : 16; }
/* Q5_K's runs of 32 as two chains of 16 (shorter dependency chains: 110M
 * Q5_K_M pp512 +2.5%) */
SBX_ALWAYS bool kq_wide(kq_fmt f) { return f == KQ_Q5_K; }

/* Per token and block: the 4 pairs of Q4_K's and Q5_K's sub-block sums (of
 * 32; 2i in the low int16 of dword i, 2i + 1 in the high), then the 32
 * values -32 * (sum of 8) as int32 (Q6_K's runs of 8 start from them), then
 * the 16 values -4 * bsum_j (Q3_K's), then the 16 values -32 * bsum_j (Q6_K's
 * m32 sub-blocks of 16 start from them). Q2_K's mins take the bsums of the
 * Q8_K row. */
#define KQ_TERMS 272
#define KQ_TERMS_BIAS6 16
#define KQ_TERMS_BIAS3 144
#define KQ_TERMS_BIAS6_16 208

/* acc + a.lo*b.lo + a.hi*b.hi per int32 lane of int16 halves (vpdpwssd,
 * pmaddwd). With one operand's high half zero that is the one product of
 * an int16 (sign-extended or not above) by the other's low half. */
SBX_ALWAYS vi qk_madd(vi acc, vi a, vi b) {
#if SBX_AVX512
    return _mm512_dpwssd_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

/* QB_R bytes at p (one per row), zero- or sign-extended to the rows' int32 lanes. */
SBX_ALWAYS vi qk_widen(const uint8_t *p) {
#if SBX_AVX512
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
#else
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
#endif
}

SBX_ALWAYS vi qk_widen_signed(const uint8_t *p) {
#if SBX_AVX512
    return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
#else
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
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

/* Q4_K's and Q5_K's 6-bit scale j (min: its min j) of the rows, from the
 * 12 transposed scale bytes at s: sb__k4_scale_min, lane by lane. */
SBX_ALWAYS vi qk_k4(const uint8_t *s, int j, bool min) {
    const int o = min ? 4 : 0; /* the mins' bytes follow the scales' by 4 */
    if (j < 4)
        return vi_and(qk_widen(s + (j + o) * QB_R), vi_set1_32(63));
    const vi lo = qk_widen(s + (j + 4) * QB_R);
    return vi_or(min ? vi_srli32(lo, 4) : vi_and(lo, vi_set1_32(0xf)),
                 vi_slli32(vi_srli32(qk_widen(s + (j - 4 + o) * QB_R), 6), 4));
}

/* The rows' scale sc_j of one block from its transposed scale bytes at s
 * (byte i of every row at s + i*QB_R), as an int32 lane per row, with a
 * zero high half where a 16-bit multiply-add takes it: Q2_K's nibble; Q3_K's
 * 6-bit value less 32 (sb__q3_scale); Q4_K's and Q5_K's 6 bits
 * (sb__k4_scale_min); Q6_K's int8, sign-extended with m32. A tile decodes
 * a unit's scales just before the unit, so that they do not hold registers
 * across the whole block: decoding all 16 of Q6_K's up front (and its +32
 * term's pairs of them) spilled the unit's quants (8 tokens, 768 x 32000:
 * 366-369 -> 430-433 GFLOP/s hot; one token 117-119 -> 168). */
SBX_ALWAYS vi kq_scale(kq_fmt f, bool m32, const uint8_t *s, int j) {
    const vi m4 = vi_set1_32(0xf);
    switch (f) {
    case KQ_Q2_K:
        return vi_and(qk_widen(s + j * QB_R), m4);
    case KQ_Q3_K: {
        const vi lo = j < 8 ? vi_and(qk_widen(s + j * QB_R), m4) : vi_srli32(qk_widen(s + (j - 8) * QB_R), 4);
        const vi hi = vi_and(vi_srli32(qk_widen(s + (8 + j % 4) * QB_R), 2 * (j / 4)), vi_set1_32(3));
        return vi_and(vi_add32(vi_or(lo, vi_slli32(hi, 4)), vi_set1_32(-32)), vi_set1_32(0xffff));
    }
    case KQ_Q6_K: {
        const vi v = qk_widen_signed(s + j * QB_R);
        return m32 ? v : vi_and(v, vi_set1_32(0xffff));
    }
    default:
        return qk_k4(s, j, false);
    }
}

/* The rows' mins of one block, as pairs (m_2i in the low half of mn[i],
 * m_2i+1 in the high): Q2_K's high nibbles (8 pairs), Q4_K's and Q5_K's 6
 * bits (4 pairs, sb__k4_scale_min). */
SBX_ALWAYS void kq_min_pairs(kq_fmt f, const uint8_t *s, vi mn[8]) {
    if (f == KQ_Q2_K) {
        SBX_UNROLL for (int i = 0; i < 8; i++)
            mn[i] = vi_or(vi_srli32(qk_widen(s + (2 * i) * QB_R), 4),
                          vi_slli32(vi_srli32(qk_widen(s + (2 * i + 1) * QB_R), 4), 16));
        return;
    }
    SBX_UNROLL for (int i = 0; i < 4; i++)
        mn[i] = vi_or(qk_k4(s, 2 * i, true), vi_slli32(qk_k4(s, 2 * i + 1, true), 16));
}

/* a | (b & m): one vpternlogd on AVX-512. */
SBX_ALWAYS vi qk_or_and(vi a, vi b, vi m) {
#if SBX_AVX512
    return _mm512_ternarylogic_epi32(a, b, m, 0xf8);
#else
    return _mm256_or_si256(a, _mm256_and_si256(b, m));
#endif
}

/* v's bits `from`.. moved to bits `to`.. of the same bytes (a 16-bit shift:
 * the bits that cross from the neighbouring byte are masked off after). */
SBX_ALWAYS vi qk_bits_to(vi v, int from, int to) {
    return from < to ? vi_slli16(v, to - from) : from > to ? vi_srli16(v, from - to) : v;
}

/* A block's quants are unpacked a unit at a time: 16 vectors (a quarter
 * of the block), each source vector loaded once, that stay in registers
 * while every token of the pass takes its products with them. They are 4
 * groups of 16 elements, whole runs: group i of unit u is elements
 * 16 * kq_unit_group(f, u, i).., vectors wq[4 * group..]. */
SBX_ALWAYS int kq_unit_group(kq_fmt f, int u, int i) {
    return f == KQ_Q2_K || f == KQ_Q3_K ? 8 * (u / 2) + 2 * i + u % 2 : 4 * u + i;
}

/* Unit u of one packed block's quants, unsigned (0..qmax): wq[g] =
 * elements 4g..4g+3 of every row, for the 16 g of the unit's runs. Q4_K,
 * Q5_K: qs dword k of 32-element pair c has elements 64c + 4k.. in its low
 * nibbles and 64c + 32 + 4k.. in its high (unit c); Q5_K's fifth bit of
 * element 32j + i is bit j of qh byte i. Q6_K: see kq_q6_planes. Q2_K,
 * Q3_K: element 128h + 32j + l has bits 2j of qs byte 32h + l (dword
 * 8h + l / 4), Q3_K's third bit is bit 4h + j of hmask byte l; unit 2h + a
 * takes the l with l / 16 = a. */
SBX_ALWAYS void kq_unpack(kq_fmt f, bool gfni, const uint8_t *qv, int u, vi wq[64]) {
    const vi m4 = vi_set1_8(0x0f);
    if (f == KQ_Q2_K || f == KQ_Q3_K) {
        const vi m3 = vi_set1_8(3), b2 = vi_set1_8(4);
        const int h = u / 2;
        SBX_UNROLL for (int i = 0; i < 4; i++) {
            const int k = 4 * (u % 2) + i;
            const vi v = vi_load_once(qv + (size_t)(8 * h + k) * 4 * QB_R);
            const vi hm = f == KQ_Q3_K ? vi_load_once(qv + (size_t)(16 + k) * 4 * QB_R) : v;
            SBX_UNROLL for (int j = 0; j < 4; j++) {
                const vi q = vi_and(qk_bits_to(v, 2 * j, 0), m3);
                wq[32 * h + 8 * j + k] = f == KQ_Q3_K ? qk_or_and(q, qk_bits_to(hm, 4 * h + j, 2), b2) : q;
            }
        }
        return;
    }
    if (f == KQ_Q6_K) {
        const vi m6 = vi_set1_8(0x3f);
        vi p[12];
        SBX_UNROLL for (int k = 0; k < 12; k++) {
            p[k] = vi_load_once(qv + (size_t)(12 * u + k) * 4 * QB_R);
            wq[16 * u + k] = vi_and(p[k], m6);
        }
        /* the last 4 vectors from bits 6-7 of the 12: bits 2s, 2s + 1 of
         * element 4i.. from vector 4s + i */
        SBX_UNROLL for (int i = 0; i < 4; i++) {
#if SBX_AVX512
            if (gfni) {
                /* bits 6, 7 to bits 2s, 2s + 1, the rest cleared; one OR of three */
                const vi a = qb_affine(p[i], 0x4080LL << 48), b = qb_affine(p[4 + i], 0x4080LL << 32);
                wq[16 * u + 12 + i] = _mm512_ternarylogic_epi32(a, b, qb_affine(p[8 + i], 0x4080LL << 16), 0xfe);
                continue;
            }
#endif
            const vi lo = vi_and(vi_srli16(p[i], 6), vi_set1_8(3));
            const vi mid = qk_or_and(lo, vi_srli16(p[4 + i], 4), vi_set1_8(0x0c));
            wq[16 * u + 12 + i] = qk_or_and(mid, vi_srli16(p[8 + i], 2), vi_set1_8(0x30));
        }
        return;
    }
    const vi b4 = vi_set1_8(0x10);
    const int c = u;
    SBX_UNROLL for (int k = 0; k < 8; k++) {
        const vi v = vi_load_once(qv + (size_t)(8 * c + k) * 4 * QB_R);
        wq[16 * c + k] = vi_and(v, m4);
        wq[16 * c + 8 + k] = qb_high_nibbles(v, m4, gfni);
        if (f == KQ_Q5_K) {
            const vi qh = vi_load_once(qv + (size_t)(32 + k) * 4 * QB_R);
            wq[16 * c + k] = qk_or_and(wq[16 * c + k], qk_bits_to(qh, 2 * c, 4), b4);
            wq[16 * c + 8 + k] = qk_or_and(wq[16 * c + 8 + k], qk_bits_to(qh, 2 * c + 1, 4), b4);
        }
    }
}

/* A packed block's scale bytes, after its d (and dmin) in its meta mb. */
SBX_ALWAYS const uint8_t *kq_scale_bytes(kq_fmt f, const uint8_t *mb) { return mb + (kq_mins(f) ? 4 : 2) * QB_R; }

/* The end of one block of a tile: each token's integer sum isum[t] (a
 * lane per row) into acc[t] by the reference's one fma per block and row,
 * and the mins' sum of the formats with mins into accm[t]. mb: the block's
 * meta (d, dmin, scale bytes); b: its index in the row. */
SBX_ALWAYS void kq_block_end(kq_fmt f, int T, const uint8_t *mb, const uint8_t *x, size_t xs, const uint8_t *xc,
                             int64_t b, const vi *isum, vf *acc, vf *accm) {
    const int n_mins = f == KQ_Q2_K ? 8 : 4;
    const size_t xb0 = (size_t)b * sizeof(sb_block_q8_K), ct0 = (size_t)b * KQ_TERMS;
    const vf dw = qk_f16(mb), dmw = kq_mins(f) ? qk_f16(mb + 2 * QB_R) : vf_zero();
    vi mn[8];
    if (kq_mins(f))
        kq_min_pairs(f, kq_scale_bytes(f, mb), mn);
    for (int t = 0; t < T; t++) {
        const uint8_t *xb = x + (size_t)t * xs + xb0, *ct = xc + (size_t)t * xs + ct0;
        float dx;
        memcpy(&dx, xb, sizeof(dx));
        const vf vdx = vf_set1(dx);
        acc[t] = vf_fma(vi_to_vf(isum[t]), vf_mul(dw, vdx), acc[t]);
        if (kq_mins(f)) {
            /* pairs of m (16-bit halves) times pairs of sums: Q2_K's
             * bsums, the others' sums of 32 */
            const uint8_t *pairs = f == KQ_Q2_K ? xb + offsetof(sb_block_q8_K, bsums) : ct;
            vi imin = vi_zero();
            SBX_UNROLL for (int j = 0; j < n_mins; j++)
                imin = qk_madd(imin, mn[j], vi_set1_32(load_i32(pairs + 4 * j)));
            accm[t] = vf_fma(vi_to_vf(imin), vf_mul(dmw, vdx), accm[t]);
        }
    }
}

/* T (at most QK_T) tokens against one packed group of QB_R rows:
 * y[t*ldy + r]. x: the tokens' Q8_K rows, xs apart, each followed (at xc) by
 * its terms; m32: Q6_K by 32-bit multiplies; pf: the next group, prefetched
 * a quarter block per unit, or NULL. Units outer, tokens inner: a unit's 16
 * quant vectors stay in registers for all T tokens, where a whole unpacked
 * block (64 vectors) went through the stack and was reloaded for every
 * token; each token's block sum stays an int32 per row (isum[t]), the
 * reference's integer.
 * Beyond one token (decode, a constant: +10% hot) T is a run-time count, so
 * that two bodies per format instead of eight keep the code, and the
 * compile (clang's above all), a fraction of the size. */
SBX_ALWAYS void kq_tile(kq_fmt f, bool gfni, bool m32, int T, int64_t nb, const uint8_t *w, const uint8_t *x, size_t xs,
                        const uint8_t *xc, float *y, size_t ldy, const uint8_t *pf) {
    const size_t qsz = kq_qbytes(f) * QB_R, msz = kq_meta(f) * QB_R;
    /* loop bounds as constants: a division in a loop's condition gets a
     * UBSan check, and the unroll pragma is lost */
    const int sub = kq_sub(f), run = kq_run(f, m32);
    const uint8_t *meta = w + (size_t)nb * qsz;
    vf acc[QK_T], accm[QK_T];
    for (int t = 0; t < T; t++)
        acc[t] = accm[t] = vf_zero();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *qv = w + (size_t)b * qsz, *mb = meta + (size_t)b * msz;
        if (pf)
            prefetch_ahead(pf + (size_t)nb * qsz + (size_t)b * msz, msz, pf_to_l2(T));
        const uint8_t *sb = kq_scale_bytes(f, mb);
        vi sc[16], isum[QK_T];
        const size_t xb0 = (size_t)b * sizeof(sb_block_q8_K), ct0 = (size_t)b * KQ_TERMS;
        SBX_UNROLL for (int u = 0; u < 4; u++) {
            vi wq[64];
            /* the next group's block a quarter at a time: its 16-48 lines
             * asked for at once wait for each other (fill buffers), which
             * stalls the products; spread, they load while these compute
             * (8 tokens from DRAM: Q6_K +47%, Q4_K +20%, Q5_K +34%) */
            if (pf)
                prefetch_ahead(pf + (size_t)b * qsz + (size_t)u * (qsz / 4), qsz / 4, pf_to_l2(T));
            kq_unpack(f, gfni, qv, u, wq);
            SBX_UNROLL for (int i = 0; i < 4; i += sub / 16) { /* once per sub-block */
                const int j = 16 * kq_unit_group(f, u, i) / sub;
                sc[j] = kq_scale(f, m32, sb, j);
            }
            for (int t = 0; t < T; t++) {
                const uint8_t *xq = x + (size_t)t * xs + xb0 + offsetof(sb_block_q8_K, qs);
                const uint8_t *ct = xc + (size_t)t * xs + ct0;
                /* two sums of scaled runs (kq_wide: two chains per run) */
                vi part[2] = {u == 0 ? vi_zero() : isum[t], vi_zero()}, s[2] = {vi_zero(), vi_zero()};
                SBX_UNROLL for (int e = 0; e < 64; e += 4) {
                    const int g = kq_unit_group(f, u, e / 16), q = 16 * g + e % 16; /* element q.. */
                    const int c = kq_wide(f) ? q / 16 % 2 : 0;
                    if (q % run == 0)
                        s[0] = f == KQ_Q3_K  ? vi_set1_32(load_i32(ct + KQ_TERMS_BIAS3 + 4 * (q / run)))
                               : f == KQ_Q6_K ? vi_set1_32(load_i32(ct + (m32 ? KQ_TERMS_BIAS6_16 : KQ_TERMS_BIAS6) +
                                                                    4 * (q / run)))
                                              : vi_zero();
                    if (kq_wide(f) && q % 16 == 0 && c == 1)
                        s[1] = vi_zero();
                    s[c] = qb_dot4(s[c], wq[q / 4], xq + q);
                    if ((q + 4) % run == 0) {
                        const int j = q / sub, p = q / run % 2; /* the run's sub-block */
                        const vi sum = kq_wide(f) ? vi_add32(s[0], s[1]) : s[0];
                        part[p] = kq_mul32(f, m32) ? vi_add32(part[p], vi_mullo32(sum, sc[j]))
                                                   : qk_madd(part[p], sum, sc[j]);
                    }
                }
                isum[t] = vi_add32(part[0], part[1]);
            }
        }
        kq_block_end(f, T, mb, x, xs, xc, b, isum, acc, accm);
    }
    for (int t = 0; t < T; t++)
        vf_storeu(y + (size_t)t * ldy, kq_mins(f) ? vf_sub(acc[t], accm[t]) : acc[t]);
}

#if SBX_AVX512
/* kquants-amx.h's tiles: passes of T tokens, KQ_AMX_PASSES at most per
 * preparation of a block */
#define KQ_AMX_PASSES 16
SBX_ALWAYS void kq_amx_sweep(kq_fmt f, int T, int np, int64_t nb, const uint8_t *w, const uint8_t *x, size_t xs,
                             const uint8_t *xc, float *y, size_t ldy, const uint8_t *pf);
#endif

/* Token blocks outer, then groups, then passes of QK_T tokens, as
 * qb_tiles (token_block: 110M Q4_K_M pp512 +13%, 1.1B +4%). Every Q8_K row carries its
 * terms after its blocks. amx_T (the AMX level, its tiles configured for
 * that many tokens; 0 elsewhere): the whole passes of amx_T tokens go to
 * kq_amx_sweep, KQ_AMX_PASSES at a time, the rest to kq_tile. */
SBX_ALWAYS void kq_packed(kq_fmt f, bool gfni, int amx_T, int64_t n, const void *wv, size_t ws, int64_t nr,
                          const void *xv, size_t xs, int64_t nt, float *y, size_t ldy) {
    const uint8_t *w = wv, *x = xv;
    const int64_t nb = n / SB_QK_K;
    const uint8_t *xc = x + (size_t)nb * sizeof(sb_block_q8_K);
#if SBX_AVX512
    const int64_t tb = token_block(xs, amx_T ? amx_T * KQ_AMX_PASSES : QK_T);
#else
    const int64_t tb = token_block(xs, QK_T);
#endif
    for (int64_t t0 = 0; t0 < nt; t0 += tb) {
        const int64_t t1 = t0 + tb < nt ? t0 + tb : nt;
        for (int64_t r = 0; r < nr; r += QB_R) {
            const uint8_t *wr = w + (size_t)r * ws;
            const bool pf_next = r + QB_R < nr || t1 == nt;
            for (int64_t t = t0; t < t1;) {
                const uint8_t *xt = x + (size_t)t * xs, *xct = xc + (size_t)t * xs;
                float *yt = y + (size_t)t * ldy + (size_t)r;
                const uint8_t *pf = t == t0 && pf_next ? wr + (size_t)QB_R * ws : NULL;
#if SBX_AVX512
                const int64_t np = amx_T ? SB_MIN((t1 - t) / amx_T, (int64_t)KQ_AMX_PASSES) : 0;
                if (np > 0) {
                    kq_amx_sweep(f, amx_T, (int)np, nb, wr, xt, xs, xct, yt, ldy, pf);
                    t += np * amx_T;
                    continue;
                }
#else
                (void)amx_T;
#endif
                const int tt = t1 - t < QK_T ? (int)(t1 - t) : QK_T;
                if (tt == 1)
                    kq_tile(f, gfni, false, 1, nb, wr, xt, xs, xct, yt, ldy, pf);
                else
                    kq_tile(f, gfni, KQ_Q6_M32_BATCHED, tt, nb, wr, xt, xs, xct, yt, ldy, pf);
                t += tt;
            }
        }
    }
}

/* The 32 values -32 * (sum of 8 quants) of one Q8_K block, as int32 at out:
 * each sum of 8 is a sum of absolute differences from 0 of the quants
 * plus 128 (unsigned), less 8 * 128. Once per matrix call and token (the
 * product loop's first phase); the scalar sums took 3.0 us of the 5.5 that
 * an 8-token, 768-wide conversion cost. */
SBX_ALWAYS void kq_run_biases(const int8_t *qs, uint8_t *out) {
    const vi flip = vi_set1_8((char)0x80);
#if SBX_AVX512
    SBX_UNROLL for (int k = 0; k < 4; k++) {
        const __m512i sums = _mm512_sad_epu8(_mm512_xor_si512(vi_loadu(qs + 64 * k), flip), _mm512_setzero_si512());
        const __m256i s = _mm512_cvtepi64_epi32(sums);
        _mm256_storeu_si256((__m256i *)(out + 32 * k),
                            _mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(8 * 128), s), 5));
    }
#else
    SBX_UNROLL for (int k = 0; k < 8; k++) {
        const __m256i sums = _mm256_sad_epu8(_mm256_xor_si256(vi_loadu(qs + 32 * k), flip), _mm256_setzero_si256());
        const __m256i low_dwords = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
        const __m128i s = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(sums, low_dwords));
        _mm_storeu_si128((__m128i *)(out + 16 * k), _mm_slli_epi32(_mm_sub_epi32(_mm_set1_epi32(8 * 128), s), 5));
    }
#endif
}

/* The terms of one Q8_K row (KQ_TERMS per block). */
static void kq_terms(const void *x, int64_t n, void *dst) {
    const sb_block_q8_K *xb = x;
    uint8_t *out = dst;
    for (int64_t b = 0; b < n / SB_QK_K; b++, out += KQ_TERMS) {
        const int16_t *bs = xb[b].bsums;
        for (int i = 0; i < 4; i++) {
            const uint32_t lo = (uint16_t)(bs[4 * i] + bs[4 * i + 1]), hi = (uint16_t)(bs[4 * i + 2] + bs[4 * i + 3]);
            const uint32_t v = lo | hi << 16;
            memcpy(out + 4 * i, &v, sizeof(v));
        }
        kq_run_biases(xb[b].qs, out + KQ_TERMS_BIAS6);
        for (int j = 0; j < 16; j++) {
            const int32_t v3 = -4 * bs[j], v6 = -32 * bs[j];
            memcpy(out + KQ_TERMS_BIAS3 + 4 * j, &v3, sizeof(v3));
            memcpy(out + KQ_TERMS_BIAS6_16 + 4 * j, &v6, sizeof(v6));
        }
    }
}

/* Q6_K's quants of one row's block as kq_unpack takes them: 48 dwords,
 * 12 per quarter u of the block. Byte c of dword 12u + k holds element
 * 64u + 4k + c (6 bits), and in bits 6-7 bits 2(k / 4).. of element
 * 64u + 48 + 4(k % 4) + c, so that 12 of a quarter's 16 vectors are one
 * mask each (the ql/qh order took three operations per vector). */
static void kq_q6_planes(const uint8_t *blk, uint8_t out[192]) {
    uint8_t q[SB_QK_K];
    sb__q6_K_quants(blk, q);
    /* byte 16s + i of quarter u is element 64u + 16s + i, and 48 + i's bits
     * 2s..: loops of 16 bytes, which gcc turns into vector operations */
    for (int u = 0; u < 4; u++)
        for (int s = 0; s < 3; s++)
            for (int i = 0; i < 16; i++)
                out[48 * u + 16 * s + i] = (uint8_t)(q[64 * u + 16 * s + i] | (q[64 * u + 48 + i] >> 2 * s & 3) << 6);
}

/* Where a block of the format keeps its low bits, high bits, d, dmin and
 * scale bytes (off_hi, off_dmin 0 where it has none). */
typedef struct kq_fields {
    size_t size, lo, hi, d, dmin, sc;
} kq_fields;

SBX_ALWAYS kq_fields kq_fields_of(kq_fmt f) {
    switch (f) {
    case KQ_Q2_K:
        return (kq_fields){sizeof(sb_block_q2_K), offsetof(sb_block_q2_K, qs), 0, offsetof(sb_block_q2_K, d),
                           offsetof(sb_block_q2_K, dmin), offsetof(sb_block_q2_K, scales)};
    case KQ_Q3_K:
        return (kq_fields){sizeof(sb_block_q3_K), offsetof(sb_block_q3_K, qs), offsetof(sb_block_q3_K, hmask),
                           offsetof(sb_block_q3_K, d), 0, offsetof(sb_block_q3_K, scales)};
    case KQ_Q4_K:
        return (kq_fields){sizeof(sb_block_q4_K), offsetof(sb_block_q4_K, qs), 0, offsetof(sb_block_q4_K, d),
                           offsetof(sb_block_q4_K, dmin), offsetof(sb_block_q4_K, scales)};
    case KQ_Q5_K:
        return (kq_fields){sizeof(sb_block_q5_K), offsetof(sb_block_q5_K, qs), offsetof(sb_block_q5_K, qh),
                           offsetof(sb_block_q5_K, d), offsetof(sb_block_q5_K, dmin), offsetof(sb_block_q5_K, scales)};
    default:
        return (kq_fields){sizeof(sb_block_q6_K), offsetof(sb_block_q6_K, ql), offsetof(sb_block_q6_K, qh),
                           offsetof(sb_block_q6_K, d), 0, offsetof(sb_block_q6_K, scales)};
    }
}

/* kq_q6_planes' inverse: the block's quants (0..63) from its 192 bytes. */
static void kq_q6_unplanes(const uint8_t planes[192], uint8_t q[SB_QK_K]) {
    for (int u = 0; u < 4; u++) {
        memset(q + 64 * u + 48, 0, 16);
        for (int s = 0; s < 3; s++)
            for (int i = 0; i < 16; i++) {
                const uint8_t p = planes[48 * u + 16 * s + i];
                q[64 * u + 16 * s + i] = p & 63;
                q[64 * u + 48 + i] |= (uint8_t)(p >> 6 << 2 * s);
            }
    }
}

/* Groups of QB_R rows in the layout kq_qbytes describes. Same size as the rows. */
static void kq_pack(kq_fmt f, const void *src, void *dst, int64_t n_in, int64_t n_out) {
    const kq_fields k = kq_fields_of(f);
    const int64_t nb = n_in / SB_QK_K;
    const size_t row = (size_t)nb * k.size, qsz = kq_qbytes(f) * QB_R, msz = kq_meta(f) * QB_R;
    const size_t lo_chunks = kq_lobytes(f) / 16;
    const uint8_t *rp[QB_R], *pp[QB_R];
    uint8_t planes[QB_R][192];
    for (int r = 0; r < QB_R; r++)
        pp[r] = planes[r];
    for (int64_t g = 0; g < n_out / QB_R; g++) {
        const uint8_t *in = (const uint8_t *)src + (size_t)g * QB_R * row;
        uint8_t *out = (uint8_t *)dst + (size_t)g * QB_R * row, *meta = out + (size_t)nb * qsz;
        for (int r = 0; r < QB_R; r++)
            rp[r] = in + (size_t)r * row;
        for (int64_t b = 0; b < nb; b++) {
            const size_t o = (size_t)b * k.size;
            uint8_t *qv = out + (size_t)b * qsz;
            if (f == KQ_Q6_K)
                for (int r = 0; r < QB_R; r++)
                    kq_q6_planes(rp[r] + o, planes[r]);
            /* 16 bytes of every row at a time: 4 vectors, dword j in vector j */
            for (size_t i = 0; i < kq_qbytes(f) / 16; i++) {
                vi v[4];
                if (f == KQ_Q6_K)
                    qb_transpose(pp, 16 * i, v);
                else
                    qb_transpose(rp, o + (i < lo_chunks ? k.lo + 16 * i : k.hi + 16 * (i - lo_chunks)), v);
                for (int j = 0; j < 4; j++)
                    vi_storeu(qv + (4 * i + (size_t)j) * 4 * QB_R, v[j]);
            }
            uint8_t *mb = meta + (size_t)b * msz, *ms = mb + (kq_mins(f) ? 4 : 2) * QB_R;
            for (int r = 0; r < QB_R; r++) {
                memcpy(mb + 2 * r, rp[r] + o + k.d, 2);
                if (kq_mins(f))
                    memcpy(mb + 2 * QB_R + 2 * r, rp[r] + o + k.dmin, 2);
                for (int i = 0; i < kq_nscales(f); i++)
                    ms[i * QB_R + r] = rp[r][o + k.sc + (size_t)i];
            }
        }
    }
}

/* Block b of row r of a packed group, in the format's own layout: the
 * rows' dwords of quant bytes from the block's vectors (Q6_K's quants
 * out of kq_q6_planes' order, then stored as its ql and qh), d, dmin and
 * the scale bytes from the meta. */
static void kq_row_block(kq_fmt f, const void *group, int64_t n_in, int r, int64_t b, void *dst) {
    const kq_fields k = kq_fields_of(f);
    const int64_t nb = n_in / SB_QK_K;
    const size_t qsz = kq_qbytes(f) * QB_R, msz = kq_meta(f) * QB_R;
    const uint8_t *qv = (const uint8_t *)group + (size_t)b * qsz, *mb = (const uint8_t *)group + (size_t)nb * qsz +
                                                                          (size_t)b * msz;
    const uint8_t *ms = mb + (kq_mins(f) ? 4 : 2) * QB_R;
    uint8_t *out = dst, q[192];
    for (size_t i = 0; i < kq_qbytes(f) / 4; i++)
        memcpy(q + 4 * i, qv + i * 4 * QB_R + 4 * (size_t)r, 4);
    if (f == KQ_Q6_K) {
        uint8_t v[SB_QK_K];
        kq_q6_unplanes(q, v);
        sb__q6_K_set_quants(out, v);
    } else {
        memcpy(out + k.lo, q, kq_lobytes(f));
        memcpy(out + k.hi, q + kq_lobytes(f), kq_qbytes(f) - kq_lobytes(f));
    }
    memcpy(out + k.d, mb + 2 * r, 2);
    if (kq_mins(f))
        memcpy(out + k.dmin, mb + 2 * QB_R + 2 * r, 2);
    for (int i = 0; i < kq_nscales(f); i++)
        out[k.sc + (size_t)i] = ms[i * QB_R + r];
}

/* The packing entries of the three formats; on AVX-512 also gemms that
 * unpack high nibbles with GFNI (qb_high_nibbles), for CPUs that have it. */
#define KQ_ENTRIES(name, f)                                                                                       \
    static void gemm_##name##_packed(int64_t n, const void *w, size_t ws, int64_t nr, const void *x, size_t xs,  \
                                     int64_t nt, float *y, size_t ldy) {                                          \
        kq_packed(f, false, 0, n, w, ws, nr, x, xs, nt, y, ldy);                                                    \
    }                                                                                                             \
    static void pack_##name(const void *src, void *dst, int64_t n_in, int64_t n_out) {                          \
        kq_pack(f, src, dst, n_in, n_out);                                                                        \
    }                                                                                                             \
    static void row_block_##name(const void *group, int64_t n_in, int r, int64_t b, void *dst) {                \
        kq_row_block(f, group, n_in, r, b, dst);                                                                  \
    }
#define KQ_GFNI(name, f)                                                                                          \
    static void gemm_##name##_packed_gfni(int64_t n, const void *w, size_t ws, int64_t nr, const void *x,       \
                                          size_t xs, int64_t nt, float *y, size_t ldy) {                         \
        kq_packed(f, true, 0, n, w, ws, nr, x, xs, nt, y, ldy);                                                     \
    }
KQ_ENTRIES(q2_K, KQ_Q2_K)
KQ_ENTRIES(q3_K, KQ_Q3_K)
KQ_ENTRIES(q4_K, KQ_Q4_K)
KQ_ENTRIES(q5_K, KQ_Q5_K)
KQ_ENTRIES(q6_K, KQ_Q6_K)
#if SBX_AVX512
KQ_GFNI(q4_K, KQ_Q4_K)
KQ_GFNI(q5_K, KQ_Q5_K)
KQ_GFNI(q6_K, KQ_Q6_K)
#define KQ_GEMM(name) (k->gfni ? gemm_##name##_packed_gfni : gemm_##name##_packed)
#else
#define KQ_GEMM(name) gemm_##name##_packed
#endif

static void kq_fill(sb_kernels *k) {
    /* Q2_K and Q3_K have no high nibbles: no GFNI variant */
    k->packing[SB_TYPE_Q2_K] = (sb_packing){
        .rows = QB_R, .pack = pack_q2_K, .gemm = gemm_q2_K_packed, .term_bytes = KQ_TERMS, .terms = kq_terms,
        .row_block = row_block_q2_K};
    k->packing[SB_TYPE_Q3_K] = (sb_packing){
        .rows = QB_R, .pack = pack_q3_K, .gemm = gemm_q3_K_packed, .term_bytes = KQ_TERMS, .terms = kq_terms,
        .row_block = row_block_q3_K};
    k->packing[SB_TYPE_Q4_K] = (sb_packing){
        .rows = QB_R, .pack = pack_q4_K, .gemm = KQ_GEMM(q4_K), .term_bytes = KQ_TERMS, .terms = kq_terms,
        .row_block = row_block_q4_K};
    k->packing[SB_TYPE_Q5_K] = (sb_packing){
        .rows = QB_R, .pack = pack_q5_K, .gemm = KQ_GEMM(q5_K), .term_bytes = KQ_TERMS, .terms = kq_terms,
        .row_block = row_block_q5_K};
    k->packing[SB_TYPE_Q6_K] = (sb_packing){
        .rows = QB_R, .pack = pack_q6_K, .gemm = KQ_GEMM(q6_K), .term_bytes = KQ_TERMS, .terms = kq_terms,
        .row_block = row_block_q6_K};
}
#undef KQ_ENTRIES
#undef KQ_GFNI
#undef KQ_GEMM

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
