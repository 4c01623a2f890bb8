/*
 * kquants_avx2.c - AVX2 dot products of Q4_K and Q6_K weights (the Q4_K_M
 * mixture) with Q8_K activations, and gemm entries built on them (for
 * matrices the level does not pack, x86/kquants-x86.h).
 *
 * They give the bits of the reference kernels in kquants.c. Q4_K's order is
 * one integer sum per block (see there); Q6_K's float
 * order is that of ggml's AVX2 kernels: per block, eight int32 lanes where
 * lane l holds the scaled products of the elements e with (e%32)/4 == l
 * (exactly what maddubs + madd on 32-byte loads produce), one fma(D, lane,
 * acc) per lane, and the reference's final reductions. Integer work is
 * exact, so only the lane assignment and the float operations had to be
 * kept. tests/unit/test_kquants.c compares them with memcmp.
 *
 * The target (AVX2 + FMA) is set per function (as kernels-avx2.c does), so this file
 * builds with the baseline flags and is only called after cpu.c has
 * checked the CPU.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "tensor/kquants.h"
#include "tensor/tensor-impl.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

/* ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)), as the reference's hsum. */
static inline float hsum8(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* An int16 vector of a for the low 128 bits (bytes 0..15 of a 32-byte
 * load) and b for the high. */
static inline __m256i scale_pair(int a, int b) {
    return _mm256_set_m128i(_mm_set1_epi16((short)b), _mm_set1_epi16((short)a));
}

/* Q4_K in its reference's order (kquants.c: one integer sum per block, as
 * llama.cpp's repacked kernels): the integer work in 8 lanes, reduced to
 * the block's sum, then the reference's two scalar fmas. */
float sb__vec_dot_q4_K_q8_K_avx2(int64_t n, const void *w, const void *x) {
    const sb_block_q4_K *wb = w;
    const sb_block_q8_K *xb = x;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    float acc = 0, accm = 0;
    for (int64_t b = 0; b < n / SB_QK_K; b++, wb++, xb++) {
        /* the 6-bit scales and mins of the 8 sub-blocks of 32 */
        int sc[8], m[8];
        for (int j = 0; j < 8; j++)
            sb__k4_scale_min(wb->scales, j, &sc[j], &m[j]);
        int32_t imin = 0;
        for (int j = 0; j < 8; j++)
            imin += m[j] * (xb->bsums[2 * j] + xb->bsums[2 * j + 1]);

        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) { /* 64 elements: low nibbles, then high */
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(wb->qs + 32 * j));
            const __m256i lo = _mm256_and_si256(bits, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            const __m256i xl = _mm256_loadu_si256((const __m256i *)(xb->qs + 64 * j));
            const __m256i xh = _mm256_loadu_si256((const __m256i *)(xb->qs + 64 * j + 32));
            const __m256i pl = _mm256_madd_epi16(_mm256_set1_epi16((short)sc[2 * j]), _mm256_maddubs_epi16(lo, xl));
            const __m256i ph =
                _mm256_madd_epi16(_mm256_set1_epi16((short)sc[2 * j + 1]), _mm256_maddubs_epi16(hi, xh));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sumi), _mm256_extracti128_si256(sumi, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        const float dx = xb->d;
        acc = fmaf((float)_mm_cvtsi128_si32(s4), sb_fp16_to_fp32(wb->d) * dx, acc);
        accm = fmaf((float)imin, sb_fp16_to_fp32(wb->dmin) * dx, accm);
    }
    return acc - accm;
}

float sb__vec_dot_q6_K_q8_K_avx2(int64_t n, const void *w, const void *x) {
    const sb_block_q6_K *wb = w;
    const sb_block_q8_K *xb = x;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / SB_QK_K; b++, wb++, xb++) {
        const float D = xb->d * sb_fp16_to_fp32(wb->d);
        const int8_t *sc = wb->scales;
        /* The quants are stored +32: lane k loses 32 * sum(sc * bsum) of
         * elements 32k..32k+31, i.e. sub-blocks 2k and 2k+1. */
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)xb->bsums);
        const __m256i bias = _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 5);

        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++) { /* 128 elements: 4 runs of 32 */
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(wb->ql + 64 * c));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(wb->ql + 64 * c + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)(wb->qh + 32 * c));
            const __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4)),
                _mm256_or_si256(_mm256_and_si256(l1, m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4)),
            };
            for (int r = 0; r < 4; r++) {
                const int sub = 8 * c + 2 * r; /* sub-blocks of 16: two per run */
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(xb->qs + 128 * c + 32 * r));
                const __m256i p = _mm256_maddubs_epi16(q[r], xq);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(scale_pair(sc[sub], sc[sub + 1]), p));
            }
        }
        sumi = _mm256_sub_epi32(sumi, bias);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(D), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum8(acc);
}

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

static void gemm_q4_K(int64_t n, const void *w, size_t ws, int64_t nr, const void *x, size_t xs, int64_t nt,
                      float *y, size_t ldy) {
    gemm_rows(sb__vec_dot_q4_K_q8_K_avx2, n, w, ws, nr, x, xs, nt, y, ldy);
}

static void gemm_q6_K(int64_t n, const void *w, size_t ws, int64_t nr, const void *x, size_t xs, int64_t nt,
                      float *y, size_t ldy) {
    gemm_rows(sb__vec_dot_q6_K_q8_K_avx2, n, w, ws, nr, x, xs, nt, y, ldy);
}

void sb__kquants_fill_avx2(sb_kernels *k) {
    k->gemm[SB_TYPE_Q4_K] = gemm_q4_K;
    k->gemm[SB_TYPE_Q6_K] = gemm_q6_K;
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
