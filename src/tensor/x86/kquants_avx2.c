/*
 * kquants_avx2.c - AVX2 dot products of the K-quant weights (Q2_K..Q6_K)
 * with Q8_K activations, and gemm entries built on them, for matrices the
 * level does not pack (x86/kquants-x86.h packs them where their row count
 * allows).
 *
 * They give the bits of the reference kernels in kquants.c: one exact
 * integer sum per block (see there), then the reference's fmas. Integer
 * work is exact, so only the float operations had to be kept.
 * tests/unit/test_kquants.c compares them with memcmp.
 *
 * The target (AVX2 + FMA) is set per function (as kernels-avx2.c does), so this file
 * builds with the baseline flags and is only called after cpu.c has
 * checked the CPU.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "tensor/kquants.h"
#include "tensor/tensor-impl.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

/* An int16 vector of a for the low 128 bits (bytes 0..15 of a 32-byte
 * load) and b for the high. */
static inline __m256i scale_pair(int a, int b) {
    return _mm256_set_m128i(_mm_set1_epi16((short)b), _mm_set1_epi16((short)a));
}

/* Bits from.. of each byte of v at bits to.. (a 16-bit shift; the caller
 * masks off what crosses from the neighbouring byte). */
static inline __m256i bits_to(__m256i v, int from, int to) {
    return from < to ? _mm256_slli_epi16(v, to - from) : from > to ? _mm256_srli_epi16(v, from - to) : v;
}

/* The stored quants (0..qmax) of a block in 8 runs of 32: run r holds
 * elements 32r..32r+31. */
static inline void block_runs(sb_type type, const uint8_t *blk, __m256i run[8]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    switch (type) {
    case SB_TYPE_Q2_K:
    case SB_TYPE_Q3_K: {
        /* element 128h + 32j + l: bits 2j of qs[32h + l]; Q3_K's third bit
         * is bit 4h + j of hmask[l] */
        const uint8_t *qs = blk + (type == SB_TYPE_Q2_K ? offsetof(sb_block_q2_K, qs) : offsetof(sb_block_q3_K, qs));
        const __m256i hm = type == SB_TYPE_Q3_K ? _mm256_loadu_si256((const __m256i *)blk) : _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
            for (int j = 0; j < 4; j++) {
                run[4 * h + j] = _mm256_and_si256(bits_to(q, 2 * j, 0), m2);
                if (type == SB_TYPE_Q3_K)
                    run[4 * h + j] = _mm256_or_si256(
                        run[4 * h + j], _mm256_and_si256(bits_to(hm, 4 * h + j, 2), _mm256_set1_epi8(4)));
            }
        }
        return;
    }
    case SB_TYPE_Q6_K: {
        const sb_block_q6_K *b = (const sb_block_q6_K *)blk;
        for (int c = 0; c < 2; c++) { /* 128 elements: 4 runs of 32 */
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
        return;
    }
    default: {
        /* Q4_K, Q5_K: 64 elements per 32 bytes of qs, low nibbles then
         * high; Q5_K's fifth bit of element 32r + i is bit r of qh[i]. */
        const uint8_t *qs = blk + (type == SB_TYPE_Q4_K ? offsetof(sb_block_q4_K, qs) : offsetof(sb_block_q5_K, qs));
        const __m256i qh = type == SB_TYPE_Q5_K
                               ? _mm256_loadu_si256((const __m256i *)(blk + offsetof(sb_block_q5_K, qh)))
                               : _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            run[2 * j] = _mm256_and_si256(bits, m4);
            run[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            if (type == SB_TYPE_Q5_K)
                for (int h = 0; h < 2; h++)
                    run[2 * j + h] = _mm256_or_si256(
                        run[2 * j + h], _mm256_and_si256(bits_to(qh, 2 * j + h, 4), _mm256_set1_epi8(0x10)));
        }
    }
    }
}

/* The reference's order (kquants.c: one integer sum per block, as
 * llama.cpp's repacked Q4_K kernels): the integer work in 8 lanes (maddubs
 * pairs stay below 2 * 63 * 128: no saturation), reduced to the block's
 * sum, then the reference's scalar fmas. Per block: sc, m (0 without
 * mins) per sub-block; `bias` the stored quants' offset, taken off through
 * the activation's bsums. */
static inline float dot_block(sb_type type, int64_t n, const void *w, const void *x) {
    size_t bsize = sizeof(sb_block_q4_K), off_d = offsetof(sb_block_q4_K, d), off_dmin = offsetof(sb_block_q4_K, dmin);
    int bias = 0;
    switch (type) {
    case SB_TYPE_Q2_K:
        bsize = sizeof(sb_block_q2_K), off_d = offsetof(sb_block_q2_K, d), off_dmin = offsetof(sb_block_q2_K, dmin);
        break;
    case SB_TYPE_Q3_K: bsize = sizeof(sb_block_q3_K), off_d = offsetof(sb_block_q3_K, d), bias = 4; break;
    case SB_TYPE_Q5_K: bsize = sizeof(sb_block_q5_K); break;
    case SB_TYPE_Q6_K: bsize = sizeof(sb_block_q6_K), off_d = offsetof(sb_block_q6_K, d), bias = 32; break;
    default: break;
    }
    const bool mins = type == SB_TYPE_Q2_K || type == SB_TYPE_Q4_K || type == SB_TYPE_Q5_K;
    const bool sub16 = type == SB_TYPE_Q2_K || type == SB_TYPE_Q3_K || type == SB_TYPE_Q6_K;
    const uint8_t *wb = w;
    const sb_block_q8_K *xb = x;
    float acc = 0, accm = 0;
    for (int64_t b = 0; b < n / SB_QK_K; b++, wb += bsize, xb++) {
        __m256i run[8];
        block_runs(type, wb, run);
        int sc[16], m[16] = {0};
        switch (type) {
        case SB_TYPE_Q2_K:
            for (int j = 0; j < 16; j++) {
                sc[j] = wb[offsetof(sb_block_q2_K, scales) + j] & 0xf;
                m[j] = wb[offsetof(sb_block_q2_K, scales) + j] >> 4;
            }
            break;
        case SB_TYPE_Q3_K:
            for (int j = 0; j < 16; j++)
                sc[j] = sb__q3_scale(wb + offsetof(sb_block_q3_K, scales), j) - 32;
            break;
        case SB_TYPE_Q6_K:
            for (int j = 0; j < 16; j++)
                sc[j] = (int8_t)wb[offsetof(sb_block_q6_K, scales) + j];
            break;
        default: /* Q4_K and Q5_K blocks start alike: d, dmin, 12 bytes of scales */
            for (int j = 0; j < 8; j++)
                sb__k4_scale_min(wb + offsetof(sb_block_q4_K, scales), j, &sc[j], &m[j]);
        }
        int32_t imin = 0, bias_sum = 0;
        for (int k = 0; k < 16; k++) { /* the 16 bsums against their sub-blocks */
            const int j = sub16 ? k : k / 2;
            imin += m[j] * xb->bsums[k];
            bias_sum += sc[j] * xb->bsums[k];
        }
        __m256i sumi = _mm256_setzero_si256();
        for (int r = 0; r < 8; r++) {
            const __m256i p = _mm256_maddubs_epi16(run[r], _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * r)));
            const __m256i s = sub16 ? scale_pair(sc[2 * r], sc[2 * r + 1]) : _mm256_set1_epi16((short)sc[r]);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s, p));
        }
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sumi), _mm256_extracti128_si256(sumi, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        const int32_t isum = _mm_cvtsi128_si32(s4) - bias * bias_sum;
        acc = fmaf((float)isum, sb__get_f16(wb + off_d) * xb->d, acc);
        if (mins)
            accm = fmaf((float)imin, sb__get_f16(wb + off_dmin) * xb->d, accm);
    }
    return mins ? acc - accm : acc;
}

float sb__vec_dot_q2_K_q8_K_avx2(int64_t n, const void *w, const void *x) { return dot_block(SB_TYPE_Q2_K, n, w, x); }
float sb__vec_dot_q3_K_q8_K_avx2(int64_t n, const void *w, const void *x) { return dot_block(SB_TYPE_Q3_K, n, w, x); }
float sb__vec_dot_q4_K_q8_K_avx2(int64_t n, const void *w, const void *x) { return dot_block(SB_TYPE_Q4_K, n, w, x); }
float sb__vec_dot_q5_K_q8_K_avx2(int64_t n, const void *w, const void *x) { return dot_block(SB_TYPE_Q5_K, n, w, x); }
float sb__vec_dot_q6_K_q8_K_avx2(int64_t n, const void *w, const void *x) { return dot_block(SB_TYPE_Q6_K, n, w, x); }

/* Row-outer gemm over a vec_dot: each weight row is read once for all tokens. */
static inline void gemm_rows(float (*dot)(int64_t, const void *, const void *), int64_t n, const void *w,
                             size_t w_stride, int64_t nr, const void *x, size_t x_stride, int64_t nt, float *y,
                             size_t ldy) {
    for (int64_t r = 0; r < nr; r++) {
        const char *wr = (const char *)w + (size_t)r * w_stride;
        for (int64_t t = 0; t < nt; t++)
            y[(size_t)t * ldy + (size_t)r] = dot(n, wr, (const char *)x + (size_t)t * x_stride);
    }
}

#define GEMM_ROWS(name)                                                                                           \
    static void gemm_##name(int64_t n, const void *w, size_t ws, int64_t nr, const void *x, size_t xs, int64_t nt, \
                            float *y, size_t ldy) {                                                                \
        gemm_rows(sb__vec_dot_##name##_q8_K_avx2, n, w, ws, nr, x, xs, nt, y, ldy);                               \
    }
GEMM_ROWS(q2_K)
GEMM_ROWS(q3_K)
GEMM_ROWS(q4_K)
GEMM_ROWS(q5_K)
GEMM_ROWS(q6_K)
#undef GEMM_ROWS

void sb__kquants_fill_avx2(sb_kernels *k) {
    k->gemm[SB_TYPE_Q2_K] = gemm_q2_K;
    k->gemm[SB_TYPE_Q3_K] = gemm_q3_K;
    k->gemm[SB_TYPE_Q4_K] = gemm_q4_K;
    k->gemm[SB_TYPE_Q5_K] = gemm_q5_K;
    k->gemm[SB_TYPE_Q6_K] = gemm_q6_K;
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
