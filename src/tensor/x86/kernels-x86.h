/*
 * kernels-x86.h - the x86 SIMD gemm and activation kernels, written once and
 * compiled once per ISA level: kernels-avx2.c and kernels-avx512.c include
 * this file under their own target pragma, with SBX_AVX512 set to 0 or 1.
 * Not a header to include anywhere else.
 *
 * Every kernel gives the bytes of the scalar reference (dot.c, quants.c,
 * types.c); tests/unit/test_kernels.c checks that with memcmp. That rules
 * what may change: integer sums are exact, so any instruction sequence that
 * yields the same per-lane int32 sums will do (maddubs+madd on AVX2, VNNI
 * vpdpbusd with a bias correction on AVX-512); float operations are the
 * reference's own, one for one, in the same order:
 *   - the 32-element block formats: per (row, token) pair one
 *     fma(block_sum, d_w*d_x, acc) per block, plus a sum of m_w*s_x for
 *     formats with a min (qb_gemm: one row per vector lane); the K-quants
 *     likewise per 256 (kquants-x86.h);
 *   - float formats: 64 lanes per pair (fmaf per element, by position
 *     mod 64), a fixed reduction, the tail in double.
 * Lanes are independent, so the kernels are free in how they walk them: a
 * gemm tile of R weight rows x T tokens keeps one accumulator per (row,
 * token, lane group) and reuses each loaded weight block for T tokens and
 * each activation block for R rows.
 *
 * Tiles are written once as always-inline functions of (format, R, T) and
 * instantiated with constants, so each instance keeps its accumulators in
 * registers.
 *
 * With several tokens the AVX-512 level takes other float paths (fg_gemm
 * for F16/BF16 from FG_MIN_NT tokens) that convert operands into per-thread
 * scratch first, and fs_gemm for float rows of 64-256 elements (attention's
 * q.k), which reduces 16 rows' lanes in one shuffle tree; same lanes, same
 * operations, same bytes.
 */
#ifndef SBX_AVX512
#error "include from kernels-avx2.c or kernels-avx512.c"
#endif

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "tensor/kquants.h"
#include "tensor/tensor-impl.h"

#define SBX_ALWAYS static inline __attribute__((always_inline))
#if defined(__clang__)
#define SBX_UNROLL _Pragma("unroll")
#else
#define SBX_UNROLL _Pragma("GCC unroll 64")
#endif

/* Float tile shapes, by level: gemm tiles of FRM rows x FTM tokens, decode
 * (one token) tiles of FRV rows, so that several weight streams are in
 * flight. The accumulators (at most FACC vectors per tile) and the operands
 * must fit the register file: 16 ymm on AVX2, 32 on AVX-512. Chosen by
 * measurement among the shapes that fit. */
#if SBX_AVX512
#define SBX_FILL sb__kernels_fill_avx512
#define FRM 4 /* float formats: rows x tokens */
#define FTM 4
#define FRV 4
#define FACC 16 /* float accumulators a tile may hold */
#define FGR 4   /* F16/BF16 with many tokens (fg_gemm): rows x tokens */
#define FGT 6
#define VW 16   /* floats per vector in the float kernels */
#else
#define SBX_FILL sb__kernels_fill_avx2
#define FRM 2
#define FTM 4
#define FRV 1
#define FACC 8
#define FGR 1
#define FGT 1
#define VW 8
#endif
#define FP (64 / VW) /* vectors per 64-lane float accumulator */
#ifndef FKB
#define FKB 512 /* elements per sweep of a multi-sweep float tile (a multiple of 64) */
#endif

/* The float formats, as compile-time constants of the tile functions (the
 * block formats have their own kernels, qb_gemm); F_Q8_0 names the KV
 * cache's rows for axpy. */
typedef enum { F_F32, F_F16, F_BF16, F_Q8_0 } fmt;

SBX_ALWAYS uint16_t load_u16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof(h));
    return h;
}

/* Decode reads each weight once, in R short interleaved row streams (a
 * block-format row is ~1-3 KB) that the hardware prefetcher follows poorly:
 * without help, decode of Q4_0/Q8_0 ran at about half the speed from DRAM
 * that it reaches from cache. A block-format decode tile therefore
 * prefetches the next tile's rows (they follow this tile's when rows are
 * packed) at the pace it consumes its own: `bytes` more of them per block.
 * Float rows are long page-sized streams that the hardware prefetcher
 * handles, and prefetching them measured no better. */
#ifndef SBX_PREFETCH
#define SBX_PREFETCH 1
#endif
/* Whether a tile of T tokens is decoding weights that stream from DRAM
 * (sb_kernels_weights_loaded): then the tiles prefetch the next group into
 * L2 rather than L1, and Q8_0's its own group's stream QB_PF_NEAR bytes
 * ahead instead (qb_load_block). */
SBX_ALWAYS bool pf_to_l2(int T) {
    return T == 1 && atomic_load_explicit(&sb__decode_from_dram, memory_order_relaxed) > 0;
}

SBX_ALWAYS void prefetch_ahead(const uint8_t *p, size_t bytes, bool l2) {
    if (!SBX_PREFETCH)
        return;
    for (size_t o = 0; o < bytes; o += 64) {
        if (l2)
            _mm_prefetch((const char *)p + o, _MM_HINT_T1);
        else
            _mm_prefetch((const char *)p + o, _MM_HINT_T0);
    }
}

/* ==== float formats ===================================================== */

SBX_ALWAYS size_t f_esize(fmt f) { return f == F_F32 ? 4 : 2; }

SBX_ALWAYS float f_get(fmt f, const uint8_t *row, int64_t i) {
    uint16_t h;
    if (f == F_F32) {
        float v;
        memcpy(&v, row + 4 * i, sizeof(v));
        return v;
    }
    memcpy(&h, row + 2 * i, sizeof(h));
    return f == F_F16 ? _cvtsh_ss(h) : sb_bf16_to_fp32(h);
}

#if SBX_AVX512
typedef __m512 vf;
SBX_ALWAYS vf vf_load(fmt f, const uint8_t *p) {
    if (f == F_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    if (f == F_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
    return _mm512_loadu_ps((const float *)p);
}
#define vf_zero _mm512_setzero_ps
#define vf_fma _mm512_fmadd_ps
#define vf_fnma _mm512_fnmadd_ps
#define vf_add _mm512_add_ps
#define vf_sub _mm512_sub_ps
#define vf_mul _mm512_mul_ps
#define vf_div _mm512_div_ps
#define vf_max _mm512_max_ps
#define vf_set1 _mm512_set1_ps
#define vf_loadu _mm512_loadu_ps
#define vf_storeu _mm512_storeu_ps
#define vf_store _mm512_store_ps
#define vf_loada _mm512_load_ps
#else
typedef __m256 vf;
SBX_ALWAYS vf vf_load(fmt f, const uint8_t *p) {
    if (f == F_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    if (f == F_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    return _mm256_loadu_ps((const float *)p);
}
#define vf_zero _mm256_setzero_ps
#define vf_fma _mm256_fmadd_ps
#define vf_fnma _mm256_fnmadd_ps
#define vf_add _mm256_add_ps
#define vf_sub _mm256_sub_ps
#define vf_mul _mm256_mul_ps
#define vf_div _mm256_div_ps
#define vf_max _mm256_max_ps
#define vf_set1 _mm256_set1_ps
#define vf_loadu _mm256_loadu_ps
#define vf_storeu _mm256_storeu_ps
#define vf_store _mm256_store_ps
#define vf_loada _mm256_load_ps
#endif

/* The reference's end of a float dot: the 64 lanes in a[] (accumulator j =
 * a[16j..16j+15]) combined as 0+=2, 1+=3, 0+=1, halved 16->8->4->2->1, then
 * the n - nc leftover products added in double. */
SBX_ALWAYS float f_finish(fmt f, fmt fx, const float *a, int64_t n, int64_t nc, const uint8_t *w, const uint8_t *x) {
    __m256 u[8];
    for (int k = 0; k < 8; k++)
        u[k] = _mm256_load_ps(a + 8 * k);
    u[0] = _mm256_add_ps(u[0], u[4]);
    u[1] = _mm256_add_ps(u[1], u[5]);
    u[2] = _mm256_add_ps(u[2], u[6]);
    u[3] = _mm256_add_ps(u[3], u[7]);
    u[0] = _mm256_add_ps(u[0], u[2]);
    u[1] = _mm256_add_ps(u[1], u[3]);
    const __m256 v8 = _mm256_add_ps(u[0], u[1]);
    const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
    const __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
    const float s = _mm_cvtss_f32(_mm_add_ss(v2, _mm_movehdup_ps(v2)));
    if (nc == n)
        return s;
    double sum = s;
    for (int64_t i = nc; i < n; i++)
        sum += (double)(f_get(f, w, i) * f_get(fx, x, i));
    return (float)sum;
}

/* Vectors of each 64-lane accumulator a tile of rt pairs keeps live at once
 * (a power of two dividing FP): all of them for decode-sized tiles, so one
 * sweep reads the rows; one for large tiles, which then sweep the rows FP
 * times, one lane group per sweep (the rows stay in L1/L2 meanwhile). */
SBX_ALWAYS int f_passes(int rt) {
    return FP * rt <= FACC ? FP : FP / 2 * rt <= FACC ? FP / 2 : FP / 4 * rt <= FACC ? FP / 4 : 1;
}

/* fx: the format of the activations, f's own, or F32 (fg_gemm's converted copy). */
SBX_ALWAYS void f_tile(fmt f, fmt fx, int R, int T, int64_t n, const uint8_t *w, size_t ws, const uint8_t *x,
                       size_t xs, float *y, size_t ldy) {
    enum { RMX = FRV > FRM ? (FRV > FGR ? FRV : FGR) : (FRM > FGR ? FRM : FGR), TMX = FTM > FGT ? FTM : FGT };
    const int64_t nc = n - n % 64;
    const size_t es = f_esize(f), xes = f_esize(fx);
    const int ps = f_passes(R * T);
    /* A tile that sweeps its rows several times does so FKB elements at a
     * time, so that the sweeps find them in L1; the accumulators wait in
     * lanes[] meanwhile. */
    const int64_t nk = ps < FP && nc > FKB ? (nc + FKB - 1) / FKB : 1;
    _Alignas(64) float lanes[RMX * TMX][64];
    for (int64_t kb = 0; kb < nk; kb++) {
        const int64_t k0 = kb * FKB, k1 = nk == 1 || nc - k0 < FKB ? nc : k0 + FKB;
        for (int p0 = 0; p0 < FP; p0 += ps) {
            vf acc[RMX][TMX][FP];
            SBX_UNROLL for (int r = 0; r < R; r++)
                SBX_UNROLL for (int t = 0; t < T; t++)
                    SBX_UNROLL for (int q = 0; q < ps; q++)
                        acc[r][t][q] = vf_zero();
            if (kb > 0)
                SBX_UNROLL for (int r = 0; r < R; r++)
                    SBX_UNROLL for (int t = 0; t < T; t++)
                        SBX_UNROLL for (int q = 0; q < ps; q++)
                            acc[r][t][q] = vf_loada(lanes[r * T + t] + (p0 + q) * VW);
            for (int64_t i = k0; i < k1; i += 64) {
                SBX_UNROLL for (int q = 0; q < ps; q++) {
                    vf wv[RMX];
                    SBX_UNROLL for (int r = 0; r < R; r++)
                        wv[r] = vf_load(f, w + r * ws + (size_t)(i + (p0 + q) * VW) * es);
                    SBX_UNROLL for (int t = 0; t < T; t++) {
                        const vf xv = vf_load(fx, x + t * xs + (size_t)(i + (p0 + q) * VW) * xes);
                        SBX_UNROLL for (int r = 0; r < R; r++)
                            acc[r][t][q] = vf_fma(wv[r], xv, acc[r][t][q]);
                    }
                }
            }
            SBX_UNROLL for (int r = 0; r < R; r++)
                SBX_UNROLL for (int t = 0; t < T; t++)
                    SBX_UNROLL for (int q = 0; q < ps; q++)
                        vf_store(lanes[r * T + t] + (p0 + q) * VW, acc[r][t][q]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++)
            y[(size_t)t * ldy + (size_t)r] = f_finish(f, fx, lanes[r * T + t], n, nc, w + r * ws, x + t * xs);
}

/* ==== block formats ===================================================== */

/* 0x4b400000 is the float 1.5*2^23: an int32 sum that starts from it holds,
 * as a float, 1.5*2^23 plus the sum (|sum| < 2^22), and subtracting 1.5*2^23
 * gives exactly (float)sum, on either vector port (vcvtdq2ps would add a
 * uop on the one that the integer dot products need). */
#define QB_MAGIC 0x4b400000

/* Per-thread scratch: a weight area and an activation area, grown on
 * demand, freed when the thread exits; through the allocator hook like
 * every other allocation (sb_aligned_alloc). */
typedef struct {
    uint8_t *p[2];
    size_t cap[2];
} scratch_areas;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static bool scratch_key_ok;

static void scratch_free(void *v) {
    scratch_areas *s = v;
    sb_aligned_free(s->p[0]);
    sb_aligned_free(s->p[1]);
    sb_free(s);
}
static void scratch_key_init(void) { scratch_key_ok = pthread_key_create(&scratch_key, scratch_free) == 0; }

/* Area i of at least `bytes` bytes, 64-aligned; NULL if out of memory. */
static uint8_t *scratch_area(int i, size_t bytes) {
    pthread_once(&scratch_once, scratch_key_init);
    if (!scratch_key_ok)
        return NULL;
    scratch_areas *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = sb_calloc(1, sizeof(*s));
        if (!s || pthread_setspecific(scratch_key, s) != 0) {
            sb_free(s);
            return NULL;
        }
    }
    if (s->cap[i] < bytes) {
        const size_t cap = (bytes + bytes / 4 + 63) / 64 * 64;
        sb_aligned_free(s->p[i]);
        s->p[i] = sb_aligned_alloc(64, cap);
        s->cap[i] = s->p[i] ? cap : 0;
    }
    return s->p[i];
}


#if SBX_AVX512
/* F16/BF16 weights with many tokens: the activations of a group of tokens
 * are converted to F32 once (exact) into scratch, so that a tile of FGR rows
 * x FGT tokens spends its vector work on the reference's fmas and on
 * converting the weights, once per FGT tokens. Same lanes, same order. */
#define FG_MIN_NT 4         /* fewer tokens: the tiles below (converting costs more than it saves) */
#define FG_XGROUP (256 * 1024) /* bytes of converted activations per token group */
SBX_ALWAYS bool fg_gemm(fmt f, int64_t n, const uint8_t *w, size_t ws, int64_t nr, const uint8_t *x, size_t xs,
                        int64_t nt, float *y, size_t ldy) {
    const size_t row = (size_t)n * sizeof(float);
    int64_t group = (int64_t)(FG_XGROUP / row) / FGT * FGT;
    group = group < FGT ? FGT : group > nt ? nt : group;
    float *xf = (float *)scratch_area(1, row * (size_t)group);
    if (!xf)
        return false;
    for (int64_t t0 = 0; t0 < nt; t0 += group) {
        const int64_t g = nt - t0 < group ? nt - t0 : group;
        for (int64_t t = 0; t < g; t++) {
            const uint8_t *src = x + (size_t)(t0 + t) * xs;
            float *dst = xf + (size_t)t * (size_t)n;
            int64_t i = 0;
            for (; i + 16 <= n; i += 16)
                _mm512_storeu_ps(dst + i, vf_load(f, src + 2 * i));
            for (; i < n; i++)
                dst[i] = f_get(f, src, i);
        }
        for (int64_t r = 0; r < nr;) {
            const bool full_r = r + FGR <= nr;
            for (int64_t t = 0; t < g;) {
                const bool full_t = t + FGT <= g;
                const uint8_t *wr = w + r * ws, *xt = (const uint8_t *)(xf + (size_t)t * (size_t)n);
                float *yt = y + (size_t)(t0 + t) * ldy + r;
                if (full_r && full_t)
                    f_tile(f, F_F32, FGR, FGT, n, wr, ws, xt, row, yt, ldy);
                else if (full_r)
                    f_tile(f, F_F32, FGR, 1, n, wr, ws, xt, row, yt, ldy);
                else if (full_t)
                    f_tile(f, F_F32, 1, FGT, n, wr, ws, xt, row, yt, ldy);
                else
                    f_tile(f, F_F32, 1, 1, n, wr, ws, xt, row, yt, ldy);
                t += full_t ? FGT : 1;
            }
            r += full_r ? FGR : 1;
        }
    }
    return true;
}
#endif

#if SBX_AVX512
/* ==== float rows of 64 to 256 elements: attention's q.k ================== */

/* f_finish for 16 pairs at once, from each pair's 64 lanes already folded
 * as f_finish's first steps fold them (0+=2, 1+=3, 0+=1: v[p] holds both
 * 8-lane halves, u[0] and u[1]); the sum of pair p in lane p. The same
 * additions in the same order, each step for all pairs, the pairs'
 * vectors interleaved by shuffles: 16 -> 8 (two pairs a vector), 8 -> 4
 * (four), then 4 -> 2 and 2 -> 1 within the 128-bit lanes. */
SBX_ALWAYS __m512 f_finish16(__m512 v[16]) {
    SBX_UNROLL for (int k = 0; k < 8; k++)
        v[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xee));
    SBX_UNROLL for (int k = 0; k < 4; k++)
        v[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xdd));
    SBX_UNROLL for (int k = 0; k < 2; k++)
        v[k] = _mm512_add_ps(_mm512_shuffle_ps(v[2 * k], v[2 * k + 1], 0x44),
                             _mm512_shuffle_ps(v[2 * k], v[2 * k + 1], 0xee));
    const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xdd));
    /* lane 4l + j holds pair 4j + l */
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), s);
}

#define FS_MAX_N 256 /* longest rows fs_gemm takes (a multiple of 64) */

/* Float rows of n elements (a multiple of 64, at most FS_MAX_N), 16 at a
 * time: each row's 64 lanes are 4 vectors in registers, so 16 rows' dots
 * with one token end in one f_finish16 and one store. f_tile keeps the
 * lanes in memory and ends every dot on its own; for head-sized rows
 * (n = 64: 4 products a dot) that end cost 5x the products. Rows not in
 * F32 are converted once per group of 16 into scratch, tokens (in the
 * rows' format) once each onto the stack. False without scratch. */
SBX_ALWAYS bool fs_gemm(fmt f, int64_t n, const uint8_t *w, size_t ws, int64_t nr, const uint8_t *x,
                        size_t xs, int64_t nt, float *y, size_t ldy) {
    const int64_t nch = n / 64;
    float *wf = f == F_F32 ? NULL : (float *)scratch_area(0, 16 * (size_t)n * sizeof(float));
    if (f != F_F32 && !wf)
        return false;
    for (int64_t r0 = 0; r0 < nr; r0 += 16) {
        const int rows = nr - r0 < 16 ? (int)(nr - r0) : 16;
        const float *wr[16];
        for (int r = 0; r < 16; r++) { /* a last group of fewer rows repeats its last */
            const uint8_t *src = w + (size_t)(r0 + (r < rows ? r : rows - 1)) * ws;
            if (f == F_F32 || r >= rows) {
                wr[r] = f == F_F32 ? (const float *)src : wr[rows - 1];
                continue;
            }
            for (int64_t i = 0; i < n; i += 16)
                _mm512_store_ps(wf + (size_t)r * (size_t)n + i, vf_load(f, src + (size_t)i * f_esize(f)));
            wr[r] = wf + (size_t)r * (size_t)n;
        }
        for (int64_t t = 0; t < nt; t++) {
            _Alignas(64) float xbuf[FS_MAX_N];
            const float *xt = (const float *)(x + (size_t)t * xs);
            if (f != F_F32) {
                for (int64_t i = 0; i < n; i += 16)
                    _mm512_store_ps(xbuf + i, vf_load(f, x + (size_t)t * xs + (size_t)i * f_esize(f)));
                xt = xbuf;
            }
            __m512 v[16];
            SBX_UNROLL for (int r = 0; r < 16; r++) {
                vf a[4];
                SBX_UNROLL for (int q = 0; q < 4; q++)
                    a[q] = vf_fma(vf_loadu(wr[r] + 16 * q), vf_loadu(xt + 16 * q), vf_zero());
                for (int64_t c = 1; c < nch; c++)
                    SBX_UNROLL for (int q = 0; q < 4; q++)
                        a[q] = vf_fma(vf_loadu(wr[r] + 64 * c + 16 * q), vf_loadu(xt + 64 * c + 16 * q), a[q]);
                v[r] = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
            }
            _mm512_mask_storeu_ps(y + (size_t)t * ldy + (size_t)r0, (__mmask16)((1u << rows) - 1), f_finish16(v));
        }
    }
    return true;
}
#endif

/* ==== the 32-element block formats: one weight row per lane ============= */

/* Their reference (dot.c) sums each block's products into one integer and
 * adds it with one fma per (row, token) pair: acc = fma(sum, d_w*d_x, acc).
 * So a vector lane can hold a whole row: a tile of QB_R rows (16 on AVX-512,
 * 8 on AVX2) is transposed block by block into 8 vectors, vector k holding
 * for every row the 4 quant bytes of elements 4k..4k+3 (Q4_0, k < 4: the low
 * nibbles of qs bytes 4k..4k+3; k >= 4: their high nibbles, elements
 * 16+4(k-4)..; Q8_0: qs bytes 4k..4k+3), and a token's block is 8
 * multiply-adds of those vectors with its activation bytes 4k..4k+3
 * broadcast, then one conversion, one scale product and one fma for all QB_R
 * rows. The transposition serves up to QB_T tokens, so one token (decode)
 * and many (batches, prompts) share the code; matrices whose row count is
 * a multiple of QB_R are transposed once, at load (qb_pack), at both levels.
 *
 * The quants are taken unsigned and the bias folded into the integer sum's
 * starting value, -bias * (sum of the token's 32 quants), exact: Q4_0's
 * nibbles (0..15, bias 8); Q5_0's, each with its fifth bit from qh (bit e
 * of the rows' qh dword for element e; 0..31, bias 16); Q8_0's bytes with
 * their sign bit flipped on AVX-512 (q + 128, bias 128). AVX2's maddubs
 * would saturate on those, so there Q8_0 keeps its signed bytes and
 * multiplies |w| by x with w's sign (exact for activations in [-127, 127],
 * which is what act_q8_0 makes). IQ4_NL's nibbles index 16 values: one byte
 * shuffle per vector looks them up, as Q8_0's flipped bytes on AVX-512
 * (bias 128), as its signed ones on AVX2. Q4_1 and Q5_1 (no bias: x = q d + m) add
 * m_w * s_x to a second sum per block, as their reference does (Q8_1
 * activations, s_x = d_x * their quants' sum). The starting value also
 * carries QB_MAGIC so that one float subtraction turns the sum into a
 * float. They are prepared once per call and token, with d_x (and s_x) as
 * floats, in qb_xb bytes per block. */
typedef enum { QB_Q4_0, QB_Q4_1, QB_Q5_0, QB_Q5_1, QB_Q8_0, QB_IQ4_NL, QB_IQ4_XS } qbf; /* the weight format */

SBX_ALWAYS size_t qb_wsize(qbf f) {
    return f == QB_Q4_1   ? sizeof(sb_block_q4_1)
           : f == QB_Q5_0 ? sizeof(sb_block_q5_0)
           : f == QB_Q5_1 ? sizeof(sb_block_q5_1)
           : f == QB_Q8_0 ? sizeof(sb_block_q8_0)
           : f == QB_IQ4_XS ? sizeof(sb_block_iq4_xs)
                          : sizeof(sb_block_q4_0); /* Q4_0, IQ4_NL */
}
SBX_ALWAYS bool qb_min(qbf f) { return f == QB_Q4_1 || f == QB_Q5_1; } /* x = q d + m */
SBX_ALWAYS bool qb_five(qbf f) { return f == QB_Q5_0 || f == QB_Q5_1; } /* fifth bits in qh */
SBX_ALWAYS bool qb_nibbles(qbf f) { return f != QB_Q8_0; }
/* Byte values that the products take signed (AVX2 has no unsigned product of them that cannot saturate). */
SBX_ALWAYS bool qb_signed(qbf f) { return f == QB_Q8_0 || f == QB_IQ4_NL || f == QB_IQ4_XS; }
SBX_ALWAYS int qb_bias(qbf f) { return f == QB_Q4_0 ? 8 : f == QB_Q5_0 ? 16 : qb_signed(f) && SBX_AVX512 ? 128 : 0; }
/* What Q8_0's bytes are xor'ed with as the products take them: their sign
 * bit flipped where the bias is 128 (AVX-512), nothing on AVX2. */
SBX_ALWAYS uint8_t qb_flip(qbf f) { return f == QB_Q8_0 ? (uint8_t)qb_bias(f) : 0; }
/* Where a weight block keeps its quant bytes and its qh. */
SBX_ALWAYS size_t qb_qs(qbf f) {
    return f == QB_Q4_1 ? offsetof(sb_block_q4_1, qs)
           : f == QB_Q5_0 ? offsetof(sb_block_q5_0, qs)
           : f == QB_Q5_1 ? offsetof(sb_block_q5_1, qs)
                          : 2;
}
SBX_ALWAYS size_t qb_qh(qbf f) { return f == QB_Q5_1 ? offsetof(sb_block_q5_1, qh) : offsetof(sb_block_q5_0, qh); }
/* The activation blocks (Q8_1 for the formats with a min, else Q8_0): their
 * size and where their quants start. */
SBX_ALWAYS size_t qb_xsize(qbf f) {
    return f == QB_IQ4_XS ? sizeof(sb_block_q8_K) : qb_min(f) ? sizeof(sb_block_q8_1) : sizeof(sb_block_q8_0);
}
/* Elements per weight (and activation) block. */
SBX_ALWAYS int64_t qb_blck(qbf f) { return f == QB_IQ4_XS ? SB_QK_K : SB_QK; }
SBX_ALWAYS size_t qb_xq(qbf f) { return qb_min(f) ? offsetof(sb_block_q8_1, qs) : offsetof(sb_block_q8_0, qs); }
/* Prepared bytes per token and block: int32 starting value, float d_x, and
 * with a min float s_x; IQ4_XS float d_x and its 8 sub-blocks' starting values. */
SBX_ALWAYS size_t qb_xb(qbf f) { return f == QB_IQ4_XS ? 4 + 4 * 8 : qb_min(f) ? 12 : 8; }
#if SBX_AVX512
typedef __m512i vi;
#define QB_R 16
#define QB_T 8
#define vi_set1_32 _mm512_set1_epi32
#define vi_set1_8 _mm512_set1_epi8
#define vi_loadu(p) _mm512_loadu_si512(p)
#define vi_and _mm512_and_si512
#define vi_xor _mm512_xor_si512
#define vi_srli16 _mm512_srli_epi16
#define vi_unpacklo32 _mm512_unpacklo_epi32
#define vi_unpackhi32 _mm512_unpackhi_epi32
#define vi_unpacklo64 _mm512_unpacklo_epi64
#define vi_unpackhi64 _mm512_unpackhi_epi64
#define vi_as_vf _mm512_castsi512_ps
#define vi_storeu(p, v) _mm512_storeu_si512((void *)(p), v)
#define vi_zero _mm512_setzero_si512
#define vi_or _mm512_or_si512
#define vi_slli16 _mm512_slli_epi16
#define vi_slli32 _mm512_slli_epi32
#define vi_srli32 _mm512_srli_epi32
#define vi_add32 _mm512_add_epi32
#define vi_sub32 _mm512_sub_epi32
#define vi_mullo32 _mm512_mullo_epi32
#define vi_to_vf _mm512_cvtepi32_ps
#else
typedef __m256i vi;
#define QB_R 8
#define QB_T 4
#define vi_set1_32 _mm256_set1_epi32
#define vi_set1_8 _mm256_set1_epi8
#define vi_loadu(p) _mm256_loadu_si256((const __m256i *)(p))
#define vi_and _mm256_and_si256
#define vi_xor _mm256_xor_si256
#define vi_srli16 _mm256_srli_epi16
#define vi_unpacklo32 _mm256_unpacklo_epi32
#define vi_unpackhi32 _mm256_unpackhi_epi32
#define vi_unpacklo64 _mm256_unpacklo_epi64
#define vi_unpackhi64 _mm256_unpackhi_epi64
#define vi_as_vf _mm256_castsi256_ps
#define vi_storeu(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#define vi_zero _mm256_setzero_si256
#define vi_or _mm256_or_si256
#define vi_slli16 _mm256_slli_epi16
#define vi_slli32 _mm256_slli_epi32
#define vi_srli32 _mm256_srli_epi32
#define vi_add32 _mm256_add_epi32
#define vi_sub32 _mm256_sub_epi32
#define vi_mullo32 _mm256_mullo_epi32
#define vi_to_vf _mm256_cvtepi32_ps
#endif

/* A vector loaded by an instruction of its own, however many instructions
 * take it: gcc folds the load into the first one (a mask, say) and loads
 * again for the next (the high nibbles' shift or bit-matrix product), and
 * the tiles are bound by their loads (each product's broadcast activation
 * is one). AVX-512, hot, one thread, 768 x 2048, alternated (CPU time):
 * 4 tokens Q4_0 340-387 -> 434-452 GFLOP/s, Q4_K 368-371 -> 410-421, Q6_K
 * 306-319 -> 343-359, Q2_K 356-361 -> 434-442; 8 tokens +5-13%; decode
 * from the L3 (2048 x 5632) Q4_0 50-56 -> 60-71 GB/s, from DRAM the same.
 * AVX2 the same within noise. */
SBX_ALWAYS vi vi_load_once(const void *p) {
    vi v = vi_loadu(p);
    __asm__("" : "+v"(v)); /* an opaque register value: no use can fold the load */
    return v;
}

#define QB_XGROUP (256 * 1024) /* bytes of prepared terms per token group */

SBX_ALWAYS int32_t load_i32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* Sum of 32 signed bytes: their unsigned (q + 128) sums of absolute
 * differences against zero, less 32 * 128. */
SBX_ALWAYS int32_t q8_block_sum(const uint8_t *q) {
    const __m256i v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)q), _mm256_set1_epi8((char)0x80));
    const __m256i s = _mm256_sad_epu8(v, _mm256_setzero_si256());
    __m128i t = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    t = _mm_add_epi64(t, _mm_unpackhi_epi64(t, t));
    return _mm_cvtsi128_si32(t) - 32 * 128;
}

SBX_ALWAYS void qb_prepare(qbf f, const uint8_t *x, int64_t nb, uint8_t *dst) {
    if (f == QB_IQ4_XS) { /* Q8_K rows; each sub-block of 32 starts from -bias times its sum */
        for (int64_t b = 0; b < nb; b++, x += qb_xsize(f), dst += qb_xb(f)) {
            const sb_block_q8_K *blk = (const sb_block_q8_K *)x;
            memcpy(dst, &blk->d, sizeof(float));
            for (int j = 0; j < 8; j++) {
                const int32_t start = -qb_bias(f) * (blk->bsums[2 * j] + blk->bsums[2 * j + 1]);
                memcpy(dst + 4 + 4 * j, &start, sizeof(start));
            }
        }
        return;
    }
    for (int64_t b = 0; b < nb; b++, x += qb_xsize(f), dst += qb_xb(f)) {
        const int32_t start = QB_MAGIC - (qb_bias(f) ? qb_bias(f) * q8_block_sum(x + qb_xq(f)) : 0);
        const float dx = _cvtsh_ss(load_u16(x));
        memcpy(dst, &start, sizeof(start));
        memcpy(dst + 4, &dx, sizeof(dx));
        if (qb_min(f)) {
            const float sx = _cvtsh_ss(load_u16(x + offsetof(sb_block_q8_1, s)));
            memcpy(dst + 8, &sx, sizeof(sx));
        }
    }
}

/* The 16 quant bytes of each row's block at offset off, transposed: v[j]
 * holds bytes 4j..4j+3 of row r in lane r. Row 4L+m enters 128-bit lane L of
 * a[m], so that the two unpack stages leave the rows in order. */
SBX_ALWAYS void qb_transpose(const uint8_t *const *rp, size_t off, vi v[4]) {
    vi a[4];
    SBX_UNROLL for (int m = 0; m < 4; m++) {
#define QB_ROW(L) _mm_loadu_si128((const __m128i *)(rp[4 * (L) + m] + off))
#if SBX_AVX512
        __m512i t = _mm512_castsi128_si512(QB_ROW(0));
        t = _mm512_inserti32x4(t, QB_ROW(1), 1);
        t = _mm512_inserti32x4(t, QB_ROW(2), 2);
        a[m] = _mm512_inserti32x4(t, QB_ROW(3), 3);
#else
        a[m] = _mm256_inserti128_si256(_mm256_castsi128_si256(QB_ROW(0)), QB_ROW(1), 1);
#endif
#undef QB_ROW
    }
    const vi u0 = vi_unpacklo32(a[0], a[1]), u1 = vi_unpackhi32(a[0], a[1]);
    const vi u2 = vi_unpacklo32(a[2], a[3]), u3 = vi_unpackhi32(a[2], a[3]);
    v[0] = vi_unpacklo64(u0, u2);
    v[1] = vi_unpackhi64(u0, u2);
    v[2] = vi_unpacklo64(u1, u3);
    v[3] = vi_unpackhi64(u1, u3);
}

/* The QB_R rows' dwords at p (row r's at p + off[r]). */
SBX_ALWAYS vi qb_gather(const uint8_t *p, vi off) {
#if SBX_AVX512
    return _mm512_i32gather_epi32(off, p, 1);
#else
    return _mm256_i32gather_epi32((const int *)p, off, 1);
#endif
}

/* A group of QB_R rows of `row` bytes at src: group g's row pointers (into
 * rp) and its first byte; the rows' offsets from it, for qb_gather. */
SBX_ALWAYS const uint8_t *qb_group_rows(const void *src, size_t row, int64_t g, const uint8_t *rp[QB_R]) {
    const uint8_t *in = (const uint8_t *)src + (size_t)g * QB_R * row;
    for (int r = 0; r < QB_R; r++)
        rp[r] = in + (size_t)r * row;
    return in;
}
SBX_ALWAYS vi qb_row_offsets(size_t row) {
    int32_t off[QB_R];
    for (int r = 0; r < QB_R; r++)
        off[r] = (int32_t)((size_t)r * row);
    return vi_loadu(off);
}

/* The QB_R rows' d_w of the block at p (row r at p + off[r]): one gather of
 * each row's first dword, whose low half is the F16 scale. */
SBX_ALWAYS vf qb_f16_low(vi g) { /* the F16 in each dword's low half, as floats */
#if SBX_AVX512
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
#else
    const __m256i low = _mm256_shuffle_epi8(g, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1,
                                                                -1, 0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1,
                                                                -1, -1));
    return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(low, 0x08)));
#endif
}
SBX_ALWAYS vf qb_scales(const uint8_t *p, vi off) { return qb_f16_low(qb_gather(p, off)); }

/* acc + the sums of 4 products per int32 lane: w's bytes (unsigned) times
 * the 4 signed bytes at x. With AVX-512 the broadcast of x is the product's
 * own memory operand ({1to16}), one fused uop where gcc emits a separate
 * broadcast: at 8 tokens the tile's 64 products per block are bound by
 * issue width, and this measured +5-8% (hot, one thread). */
SBX_ALWAYS vi qb_dot4(vi acc, vi w, const uint8_t *x) {
#if SBX_AVX512
    __asm__("vpdpbusd %[x]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [x] "m"(*(const int32_t *)x));
    return acc;
#else
    /* maddubs pairs stay below 2 * 15 * 128: no saturation. */
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, _mm256_set1_epi32(load_i32(x))),
                                                   _mm256_set1_epi16(1)));
#endif
}

/* qb_dot4 of a format's weight vector w: AVX2's Q8_0 and IQ4_NL bytes are
 * signed (see above), |w| times x with w's sign; pairs stay below 2 * 128 * 127. */
SBX_ALWAYS vi qb_dot(qbf f, vi acc, vi w, const uint8_t *x) {
#if !SBX_AVX512
    if (qb_signed(f)) {
        const __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32(load_i32(x)), w);
        return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), xs),
                                                       _mm256_set1_epi16(1)));
    }
#else
    (void)f;
#endif
    return qb_dot4(acc, w, x);
}

/* The high nibbles of v's bytes, as bytes 0-15. With gfni (AVX-512 only)
 * one GF(2) bit-matrix product per byte moves bits 4-7 to 0-3 and clears
 * the rest, one uop where a shift and a mask take two: engine 8 streams
 * +2% (110M Q4_0, A/B alternated). Inline assembly, so that this file
 * needs no GFNI target: the fill only picks the gfni path where CPUID has
 * it. */
#define QB_HIGH_NIBBLE_MATRIX 0x1020408000000000LL /* row i (byte 7 - i) selects bit 4 + i */
#if SBX_AVX512
/* Every byte of v through the GF(2) bit matrix m (vgf2p8affineqb): bit i of
 * a result byte is the parity of the byte and byte 7 - i of m. */
SBX_ALWAYS vi qb_affine(vi v, int64_t m) {
    vi r;
    __asm__("vgf2p8affineqb $0, %[m], %[v], %[r]" : [r] "=v"(r) : [v] "v"(v), [m] "v"(_mm512_set1_epi64(m)));
    return r;
}
#endif

SBX_ALWAYS vi qb_high_nibbles(vi v, vi m4, bool gfni) {
#if SBX_AVX512
    if (gfni)
        return qb_affine(v, QB_HIGH_NIBBLE_MATRIX);
#else
    (void)gfni;
#endif
    return vi_and(vi_srli16(v, 4), m4);
}

/* Q5_0's quants of elements 4j..4j+3 (vector j of a block) with their fifth
 * bits, bits 4j..4j+3 of the rows' qh dwords: byte j / 2 of each dword
 * spread over the dword's 4 bytes, then byte c keeps bit 4(j % 2) + c. */
SBX_ALWAYS vi qb_fifth_bits(vi q, vi qh, int j) {
    const int32_t bits = j % 2 ? (int32_t)0x80402010 : 0x08040201;
#if SBX_AVX512
    /* in-lane byte indices 4d + j/2 for the lane's dwords d = 0..3 */
    const __m512i at = _mm512_add_epi8(_mm512_set4_epi32(0x0c0c0c0c, 0x08080808, 0x04040404, 0), vi_set1_8((char)(j / 2)));
    const __mmask64 set = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, at), vi_set1_32(bits));
    return _mm512_mask_add_epi8(q, set, q, vi_set1_8(0x10));
#else
    const __m256i at = _mm256_add_epi8(_mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c, 0, 0x04040404,
                                                         0x08080808, 0x0c0c0c0c),
                                       vi_set1_8((char)(j / 2)));
    const __m256i bit = vi_set1_32(bits);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, at), bit), bit);
    return _mm256_or_si256(q, _mm256_and_si256(set, vi_set1_8(0x10)));
#endif
}

/* IQ4_NL's values of the nibbles q (0..15): signed, or with AVX-512 plus
 * 128 (the sign bit flipped), as the products take Q8_0's bytes. */
SBX_ALWAYS vi qb_iq4nl_lookup(vi q) {
    const __m128i values = _mm_loadu_si128((const __m128i *)sb__iq4nl_values);
#if SBX_AVX512
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_xor_si128(values, _mm_set1_epi8((char)0x80))), q);
#else
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(values), q);
#endif
}

/* The low and high nibbles of v's bytes as the products take them: the IQ
 * formats' looked up. */
SBX_ALWAYS void qb_nibble_pair(qbf f, vi v, bool gfni, vi *lo, vi *hi) {
    const vi m4 = vi_set1_8(0x0f);
    *lo = vi_and(v, m4);
    *hi = qb_high_nibbles(v, m4, gfni);
    if (f == QB_IQ4_NL || f == QB_IQ4_XS) {
        *lo = qb_iq4nl_lookup(*lo);
        *hi = qb_iq4nl_lookup(*hi);
    }
}

/* T tokens against the QB_R rows from w (rows past `rows` repeat the last;
 * their results are not stored): y[t*ldy + r]. xc: the tokens' prepared
 * terms. pf: the next tile's rows (QB_R rows, contiguous), prefetched at the
 * pace of the blocks (issued all at once, the prefetches wait for each
 * other; not at all, the loads of QB_R interleaved short rows from DRAM
 * wait on every line).
 *
 * packed: w is a group of qb_pack's layout, which holds each block's
 * transposed quants (qb_packed_q bytes: the 4 vectors of nibble pairs of
 * Q4_0 and Q4_1, Q5_0's and Q5_1's followed by their rows' qh dwords,
 * Q8_0's 8 vectors, on AVX-512 of flipped bytes) and then, for all blocks,
 * the QB_R scales and with a min the QB_R mins (qb_meta bytes per block);
 * the per-block transposition and gather (about a fifth of the vector work
 * at 8 tokens with AVX-512, a quarter with AVX2) are done once, at load.
 * gfni: see qb_high_nibbles. */
SBX_ALWAYS size_t qb_packed_q(qbf f) { return (f == QB_Q8_0 ? 8 : qb_five(f) ? 5 : 4) * sizeof(vi); }
SBX_ALWAYS size_t qb_meta(qbf f) { return (qb_min(f) ? 4 : 2) * QB_R; }

/* Decoding Q8_0 weights that stream from DRAM (pf_to_l2), a packed tile
 * asks for its own group's bytes this far ahead of its loads, into L1, and
 * not for the next group's into L2: the group, its meta and the next group
 * are one stream. Intel AMX VM, 1.1B tg64, alternated with the next group
 * into L2: 26.1-26.8 -> 27.6-28.3 t/s, 18.6-19.4 -> 20.3-21.4 in slower
 * minutes (512 bytes ahead 27.6-28.1, 2048 27.6-27.9; a read loop over 1
 * GiB, 2 threads: 31.5 GB/s plain, 36 with 256-1024 bytes ahead, 31 with
 * 4-16 KB). Q4_0 read 44-47 t/s either way in fast minutes and 2-3% less
 * so in slow ones; the K-quant tiles lost 7-13%: they keep the next group. */
#define QB_PF_NEAR 1024

/* Block b of the packed group at pf (its nb blocks of qb quant bytes, then
 * the meta) asked for: its quants, and the meta's line where the block's
 * meta starts one. */
SBX_ALWAYS void qb_prefetch_packed(qbf f, const uint8_t *pf, int64_t b, int64_t nb, size_t qb, bool l2) {
    prefetch_ahead(pf + (size_t)b * qb, qb, l2);
    if ((size_t)b * qb_meta(f) % 64 < qb_meta(f))
        prefetch_ahead(pf + (size_t)nb * qb + (size_t)b * qb_meta(f), 64, l2);
}

/* The QB_R rows' d_w (min: m_w, after them) of block b of the packed group at w. */
SBX_ALWAYS vf qb_packed_scales(qbf f, const uint8_t *w, int64_t b, int64_t nb, size_t qb, bool min) {
    const uint8_t *p = w + (size_t)nb * qb + (size_t)b * qb_meta(f) + (min ? 2 * QB_R : 0);
#if SBX_AVX512
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#else
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#endif
}

/* A token's block sum starts from its prepared starting value (xct: the
 * token's terms). */
SBX_ALWAYS vi qb_sum_start(qbf f, const uint8_t *xct, int64_t b) {
    return vi_set1_32(load_i32(xct + (size_t)b * qb_xb(f)));
}

SBX_ALWAYS float qb_term(qbf f, const uint8_t *xct, int64_t b, int i) {
    float v;
    memcpy(&v, xct + (size_t)b * qb_xb(f) + 4 * (size_t)i, sizeof(v));
    return v;
}

/* acc + the block's result for one token: its exact integer sum s (biased
 * by the magic number) times d_w * d_x, the reference's rounding; with a
 * min also accm + m_w * s_x. */
SBX_ALWAYS vf qb_block_acc(qbf f, vf acc, vf *accm, vi s, vf dw, vf mw, const uint8_t *xct, int64_t b) {
    if (qb_min(f))
        *accm = vf_add(*accm, vf_mul(mw, vf_set1(qb_term(f, xct, b, 2))));
    return vf_fma(vf_sub(vi_as_vf(s), vi_as_vf(vi_set1_32(QB_MAGIC))), vf_mul(dw, vf_set1(qb_term(f, xct, b, 1))),
                  acc);
}

/* Block b's 8 weight vectors and scales (and mins, into *mw), as the
 * products want them. */
SBX_ALWAYS vf qb_load_block(qbf f, bool packed, bool gfni, int64_t b, int64_t nb, const uint8_t *w,
                            const uint8_t *const *rp, vi rowoff, const uint8_t *pf, bool from_dram, vi wq[8], vf *mw) {
    const size_t o = (size_t)b * qb_wsize(f);
    vi v[8], qh = vi_set1_32(0);
    vf dw;
    if (packed) {
        const size_t qb = qb_packed_q(f);
        if (from_dram && f == QB_Q8_0)
            prefetch_ahead(w + (size_t)b * qb + QB_PF_NEAR, qb, false);
        else if (pf)
            qb_prefetch_packed(f, pf, b, nb, qb, from_dram);
        SBX_UNROLL for (int j = 0; j < 4; j++)
            v[j] = vi_load_once(w + (size_t)b * qb + sizeof(vi) * j);
        if (f == QB_Q8_0)
            SBX_UNROLL for (int j = 4; j < 8; j++)
                v[j] = vi_loadu(w + (size_t)b * qb + sizeof(vi) * j);
        if (qb_five(f))
            qh = vi_loadu(w + (size_t)b * qb + 4 * sizeof(vi));
        dw = qb_packed_scales(f, w, b, nb, qb, false);
        if (qb_min(f))
            *mw = qb_packed_scales(f, w, b, nb, qb, true);
    } else {
        if (pf)
            prefetch_ahead(pf + (size_t)b * QB_R * qb_wsize(f), QB_R * qb_wsize(f), from_dram);
        qb_transpose(rp, o + qb_qs(f), v);
        if (f == QB_Q8_0)
            qb_transpose(rp, o + 18, v + 4);
        if (qb_five(f))
            qh = qb_gather(w + o + qb_qh(f), rowoff);
        dw = qb_scales(w + o, rowoff);
        if (qb_min(f))
            *mw = qb_scales(w + o + 2, rowoff);
    }
    if (qb_nibbles(f)) {
        SBX_UNROLL for (int k = 0; k < 4; k++)
            qb_nibble_pair(f, v[k], gfni, &wq[k], &wq[4 + k]);
        if (qb_five(f))
            SBX_UNROLL for (int j = 0; j < 8; j++)
                wq[j] = qb_fifth_bits(wq[j], qh, j);
    } else {
        SBX_UNROLL for (int k = 0; k < 8; k++)
            wq[k] = packed || !qb_flip(f) ? v[k] : vi_xor(v[k], vi_set1_8((char)qb_flip(f)));
    }
    return dw;
}

/* The first `rows` of acc's lanes, stored at y. */
SBX_ALWAYS void qb_store_rows(float *y, vf acc, int rows) {
#if SBX_AVX512
    _mm512_mask_storeu_ps(y, (__mmask16)((1u << rows) - 1), acc);
#else
    _mm256_maskstore_ps(y, _mm256_cmpgt_epi32(_mm256_set1_epi32(rows), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), acc);
#endif
}

/* ---- IQ4_XS ----
 * Its reference (iquants.c) sums a block of 256 in integers, (ls_j - 32)
 * times each sub-block's products, then takes one fma: so a lane holds a
 * row as for Q4_0, each sub-block's 16 quant bytes transposed as Q4_0's
 * block (4 vectors), its values looked up as IQ4_NL's, and the rows' d,
 * scales_h (one dword: d low) and scales_l (sub-block j's nibble at bits
 * 4j) gathered per block. Packed, a group of QB_R rows holds per block
 * the 8 sub-blocks' transposed vectors, then for all blocks those two
 * dwords of every row: per row 136 = 128 + 8 bytes, the rows' own.
 * Each sub-block's chain starts from -bias times its activations' sum
 * (qb_prepare's, with d_x), the bias qb_bias's. */
#define XS_Q (8 * 4 * sizeof(vi)) /* packed quant bytes per block */
#define XS_META (8 * QB_R)
/* Where block b's vector k of sub-block j starts in a packed group. */
SBX_ALWAYS size_t xs_vec(int64_t b, int j, int k) { return (size_t)b * XS_Q + (4 * (size_t)j + (size_t)k) * sizeof(vi); }

/* T tokens against QB_R rows from w (rows past `rows` repeat the last;
 * rp: their starts, rowoff: their offsets from w; packed: a group of
 * xs_pack's layout): y[t*ldy + r]. pf: the next rows, prefetched. */
SBX_ALWAYS void xs_tile(bool packed, bool gfni, int T, int64_t nb, const uint8_t *w, const uint8_t *const *rp,
                        vi rowoff, int rows, const uint8_t *x, size_t xs, const uint8_t *xc, size_t xcs, float *y,
                        size_t ldy, const uint8_t *pf) {
    vf acc[QB_T];
    SBX_UNROLL for (int t = 0; t < T; t++)
        acc[t] = vf_zero();
    for (int64_t b = 0; b < nb; b++) {
        const size_t o = (size_t)b * sizeof(sb_block_iq4_xs);
        vi dh, sl;
        if (packed) {
            const uint8_t *meta = w + (size_t)nb * XS_Q + (size_t)b * XS_META;
            if (pf) {
                prefetch_ahead(pf + (size_t)b * XS_Q, XS_Q, pf_to_l2(T));
                prefetch_ahead(pf + (size_t)nb * XS_Q + (size_t)b * XS_META, XS_META, pf_to_l2(T));
            }
            dh = vi_loadu(meta);
            sl = vi_loadu(meta + XS_META / 2);
        } else {
            if (pf)
                prefetch_ahead(pf + (size_t)b * QB_R * sizeof(sb_block_iq4_xs), QB_R * sizeof(sb_block_iq4_xs),
                               pf_to_l2(T));
            dh = qb_gather(w + o, rowoff);
            sl = qb_gather(w + o + offsetof(sb_block_iq4_xs, scales_l), rowoff);
        }
        const vf dw = qb_f16_low(dh);
        const vi sh = vi_srli32(dh, 16);
        vi isum[QB_T];
        SBX_UNROLL for (int t = 0; t < T; t++)
            isum[t] = vi_zero();
        for (int j = 0; j < 8; j++) {
            const vi sc = vi_sub32(vi_or(vi_and(vi_srli32(sl, 4 * j), vi_set1_32(0xf)),
                                         vi_slli32(vi_and(vi_srli32(sh, 2 * j), vi_set1_32(3)), 4)),
                                   vi_set1_32(32));
            vi v[4], wq[8];
            if (packed)
                SBX_UNROLL for (int k = 0; k < 4; k++)
                    v[k] = vi_load_once(w + xs_vec(b, j, k));
            else
                qb_transpose(rp, o + offsetof(sb_block_iq4_xs, qs) + 16 * (size_t)j, v);
            SBX_UNROLL for (int k = 0; k < 4; k++)
                qb_nibble_pair(QB_IQ4_XS, v[k], gfni, &wq[k], &wq[4 + k]);
            SBX_UNROLL for (int t = 0; t < T; t++) {
                const uint8_t *xt = x + t * xs + (size_t)b * sizeof(sb_block_q8_K) + offsetof(sb_block_q8_K, qs) + 32 * j;
                vi s = vi_set1_32(load_i32(xc + t * xcs + (size_t)b * qb_xb(QB_IQ4_XS) + 4 + 4 * j));
                SBX_UNROLL for (int k = 0; k < 8; k++)
                    s = qb_dot(QB_IQ4_XS, s, wq[k], xt + 4 * k);
                isum[t] = vi_add32(isum[t], vi_mullo32(s, sc));
            }
        }
        SBX_UNROLL for (int t = 0; t < T; t++) {
            float dx;
            memcpy(&dx, xc + t * xcs + (size_t)b * qb_xb(QB_IQ4_XS), sizeof(dx));
            acc[t] = vf_fma(vi_to_vf(isum[t]), vf_mul(dw, vf_set1(dx)), acc[t]);
        }
    }
    SBX_UNROLL for (int t = 0; t < T; t++)
        qb_store_rows(y + (size_t)t * ldy, acc[t], rows);
}

/* Packs groups of QB_R rows in place of the rows (see xs_tile). */
SBX_ALWAYS void xs_pack(const void *src, void *dst, int64_t n_in, int64_t n_out) {
    const int64_t nb = n_in / SB_QK_K;
    const size_t row = (size_t)nb * sizeof(sb_block_iq4_xs);
    const uint8_t *rp[QB_R];
    const vi rowoff = qb_row_offsets(row);
    for (int64_t g = 0; g < n_out / QB_R; g++) {
        const uint8_t *in = qb_group_rows(src, row, g, rp);
        uint8_t *out = (uint8_t *)dst + (size_t)g * QB_R * row;
        for (int64_t b = 0; b < nb; b++) {
            const size_t o = (size_t)b * sizeof(sb_block_iq4_xs);
            for (int j = 0; j < 8; j++) {
                vi v[4];
                qb_transpose(rp, o + offsetof(sb_block_iq4_xs, qs) + 16 * (size_t)j, v);
                for (int k = 0; k < 4; k++)
                    vi_storeu(out + xs_vec(b, j, k), v[k]);
            }
            uint8_t *meta = out + (size_t)nb * XS_Q + (size_t)b * XS_META;
            vi_storeu(meta, qb_gather(in + o, rowoff));
            vi_storeu(meta + XS_META / 2, qb_gather(in + o + offsetof(sb_block_iq4_xs, scales_l), rowoff));
        }
    }
}

/* Block b of row r of a packed group, back in IQ4_XS's layout. */
SBX_ALWAYS void xs_row_block(const void *group, int64_t n_in, int r, int64_t b, void *dst) {
    const int64_t nb = n_in / SB_QK_K;
    const uint8_t *g = group, *meta = g + (size_t)nb * XS_Q + (size_t)b * XS_META;
    uint8_t *out = dst;
    memcpy(out, meta + 4 * (size_t)r, 4); /* d, scales_h */
    memcpy(out + offsetof(sb_block_iq4_xs, scales_l), meta + XS_META / 2 + 4 * (size_t)r, 4);
    for (int j = 0; j < 8; j++)
        for (int k = 0; k < 4; k++)
            memcpy(out + offsetof(sb_block_iq4_xs, qs) + 16 * j + 4 * k, g + xs_vec(b, j, k) + 4 * (size_t)r, 4);
}

SBX_ALWAYS void qb_tile(qbf f, bool packed, bool gfni, int T, int64_t nb, const uint8_t *w, size_t ws, int rows,
                        const uint8_t *x, size_t xs, const uint8_t *xc, size_t xcs, float *y, size_t ldy,
                        const uint8_t *pf) {
    const uint8_t *rp[QB_R];
    int32_t off[QB_R];
    for (int r = 0; r < QB_R; r++) {
        rp[r] = w + (size_t)(r < rows ? r : rows - 1) * ws;
        off[r] = (int32_t)(rp[r] - w);
    }
    const vi rowoff = vi_loadu(off);
    if (f == QB_IQ4_XS) {
        xs_tile(packed, gfni, T, nb, w, rp, rowoff, rows, x, xs, xc, xcs, y, ldy, pf);
        return;
    }
    vf acc[QB_T], accm[QB_T];
    SBX_UNROLL for (int t = 0; t < T; t++)
        acc[t] = accm[t] = vf_zero();
    for (int64_t b = 0; b < nb; b++) {
        vi wq[8];
        vf mw = vf_zero();
        const vf dw = qb_load_block(f, packed, gfni, b, nb, w, rp, rowoff, pf, pf_to_l2(T), wq, &mw);
        /* The tokens' sums are T chains of 8 dependent products each; issued
         * product k of every token, then k + 1, they overlap without relying
         * on the out-of-order window to reach the next token's chain. */
        vi s[QB_T];
        SBX_UNROLL for (int t = 0; t < T; t++)
            s[t] = qb_sum_start(f, xc + t * xcs, b);
        SBX_UNROLL for (int k = 0; k < 8; k++)
            SBX_UNROLL for (int t = 0; t < T; t++)
                s[t] = qb_dot(f, s[t], wq[k], x + t * xs + (size_t)b * qb_xsize(f) + qb_xq(f) + 4 * k);
        SBX_UNROLL for (int t = 0; t < T; t++)
            acc[t] = qb_block_acc(f, acc[t], &accm[t], s[t], dw, mw, xc + t * xcs, b);
    }
    SBX_UNROLL for (int t = 0; t < T; t++) {
        if (qb_min(f))
            acc[t] = vf_add(acc[t], accm[t]);
        qb_store_rows(y + (size_t)t * ldy, acc[t], rows);
    }
}

#if SBX_AVX512
/* Q4_0's, IQ4_NL's and Q8_0's up to QB_PAIR_T tokens against two packed groups (2 * QB_R rows, the
 * second group QB_R * ws after the first): each product's activation is
 * broadcast into a register once for both groups, where qb_tile's
 * products each load their own. A tile of few tokens is bound by its
 * loads (qb_tile at 4 tokens: 32 of ~45 loads a block are the products'
 * activations); two groups take ~50 loads for 64 products where qb_tile
 * takes ~90, and their 8 chains of products a block keep the two
 * multiply pipes busy. The integer sums are exact, so their order is
 * free: the same bits as qb_tile. */
#define QB_PAIR_T 4
/* Whether a packed call of nt tokens (1..QB_PAIR_T) takes pairs: Q8_0's of
 * 2 or 3 tokens ran 5-8% slower than single groups (hot, one thread), the
 * nibble formats' faster from 2 tokens on, and at one token too (110M tg128,
 * alternated, AMX VM: Q4_0 626-631 -> 641-646 t/s, IQ4_NL 695-696 ->
 * 707-715; 1.1B Q4_0 from DRAM +0-3%). */
SBX_ALWAYS bool qb_pair(qbf f, int64_t nt) {
    return f == QB_Q4_0 || f == QB_IQ4_NL || (f == QB_Q8_0 && nt == QB_PAIR_T);
}
/* pf: the next pair's rows (or the next chunk's), prefetched as qb_tile's
 * (decoding from DRAM, into L2). */
SBX_ALWAYS void qb_tile_pair(qbf f, bool gfni, int T, int64_t nb, const uint8_t *w, size_t ws, const uint8_t *x,
                             size_t xs, const uint8_t *xc, size_t xcs, float *y, size_t ldy, const uint8_t *pf) {
    const size_t qb = qb_packed_q(f), group = (size_t)QB_R * ws;
    const int nv = qb_nibbles(f) ? 4 : 8; /* packed quant vectors a block */
    vf acc[2][QB_PAIR_T];
    SBX_UNROLL for (int g = 0; g < 2; g++)
        SBX_UNROLL for (int t = 0; t < T; t++)
            acc[g][t] = vf_zero();
    for (int64_t b = 0; b < nb; b++) {
        SBX_UNROLL for (int g = 0; g < 2; g++)
            qb_prefetch_packed(f, pf + g * group, b, nb, qb, pf_to_l2(T));
        vi s[2][QB_PAIR_T];
        SBX_UNROLL for (int t = 0; t < T; t++)
            s[0][t] = s[1][t] = qb_sum_start(f, xc + t * xcs, b);
        SBX_UNROLL for (int k = 0; k < nv; k++) {
            vi lo[2], hi[2];
            SBX_UNROLL for (int g = 0; g < 2; g++) {
                const vi v = vi_load_once(w + g * group + (size_t)b * qb + 64 * k);
                lo[g] = hi[g] = v;
                if (qb_nibbles(f))
                    qb_nibble_pair(f, v, gfni, &lo[g], &hi[g]);
            }
            SBX_UNROLL for (int t = 0; t < T; t++) {
                const uint8_t *xt = x + t * xs + (size_t)b * sizeof(sb_block_q8_0) + 2;
                vi xl = vi_set1_32(load_i32(xt + 4 * k));
                __asm__("" : "+v"(xl)); /* one broadcast for both groups' products */
                SBX_UNROLL for (int g = 0; g < 2; g++)
                    s[g][t] = _mm512_dpbusd_epi32(s[g][t], lo[g], xl);
                if (qb_nibbles(f)) {
                    vi xh = vi_set1_32(load_i32(xt + 16 + 4 * k));
                    __asm__("" : "+v"(xh));
                    SBX_UNROLL for (int g = 0; g < 2; g++)
                        s[g][t] = _mm512_dpbusd_epi32(s[g][t], hi[g], xh);
                }
            }
        }
        SBX_UNROLL for (int g = 0; g < 2; g++) {
            const vf dw = qb_packed_scales(f, w + g * group, b, nb, qb, false);
            SBX_UNROLL for (int t = 0; t < T; t++)
                acc[g][t] = qb_block_acc(f, acc[g][t], NULL, s[g][t], dw, vf_zero(), xc + t * xcs, b);
        }
    }
    SBX_UNROLL for (int g = 0; g < 2; g++)
        SBX_UNROLL for (int t = 0; t < T; t++)
            vf_storeu(y + (size_t)t * ldy + g * QB_R, acc[g][t]);
}
#endif

/* Tiles of QB_R rows outer, passes of QB_T tokens inner, so a tile's rows
 * are read from memory once per call; xc: the tokens' prepared terms, xcs
 * apart. */
/* Bytes of activations that a block of tokens may take in the packed
 * gemms, which run every group of a chunk's rows over a block before the
 * next: well inside the L2 (2 MB a core on the machines measured) beside
 * the chunk's rows. A whole 512-token prompt (2 MB of Q8_K rows at 2048
 * wide) came from the L3 for every group of 16 rows. */
#define TOKEN_BLOCK_BYTES (512 * 1024)

/* Tokens per such block for activation rows of xs bytes: a multiple of
 * the tile's tokens, at least one tile. */
SBX_ALWAYS int64_t token_block(size_t xs, int tile_tokens) {
    const int64_t tb = (int64_t)(TOKEN_BLOCK_BYTES / xs) / tile_tokens * tile_tokens;
    return tb < tile_tokens ? tile_tokens : tb;
}

/* Token blocks outer (token_block), then groups of rows, then tiles of
 * tokens. The next group is prefetched on the first tile of each block;
 * the rows after the chunk (the same thread's next chunk, see dot_rows)
 * only in the last block. */
SBX_ALWAYS void qb_tiles(qbf f, bool packed, bool gfni, int64_t nb, const uint8_t *w, size_t ws, int64_t nr,
                         const uint8_t *x, size_t xs, const uint8_t *xc, size_t xcs, int64_t nt, float *y, size_t ldy) {
    const int64_t tb = token_block(xs, QB_T);
    for (int64_t t0 = 0; t0 < nt; t0 += tb) {
        const int64_t t1 = t0 + tb < nt ? t0 + tb : nt;
        for (int64_t r = 0; r < nr; r += QB_R) {
#if SBX_AVX512
            /* A call of a few tokens is one token block: the next rows are
             * the next pair's, or the next chunk's. */
            if (packed && nt <= QB_PAIR_T && qb_pair(f, nt) && nr - r >= 2 * QB_R) {
                const uint8_t *pf = w + (size_t)(r + 2 * QB_R) * ws;
                switch (nt) {
                case 1: qb_tile_pair(f, gfni, 1, nb, w + (size_t)r * ws, ws, x, xs, xc, xcs, y + r, ldy, pf); break;
                case 2: qb_tile_pair(f, gfni, 2, nb, w + (size_t)r * ws, ws, x, xs, xc, xcs, y + r, ldy, pf); break;
                case 3: qb_tile_pair(f, gfni, 3, nb, w + (size_t)r * ws, ws, x, xs, xc, xcs, y + r, ldy, pf); break;
                default: qb_tile_pair(f, gfni, 4, nb, w + (size_t)r * ws, ws, x, xs, xc, xcs, y + r, ldy, pf); break;
                }
                r += QB_R; /* the pair's second group */
                continue;
            }
#endif
            const int rows = nr - r < QB_R ? (int)(nr - r) : QB_R;
            const bool pf_next = r + QB_R < nr || t1 == nt;
            for (int64_t t = t0; t < t1; t += QB_T) {
                const uint8_t *wr = w + (size_t)r * ws, *xt = x + (size_t)t * xs, *xct = xc + (size_t)t * xcs;
                float *yt = y + (size_t)t * ldy + (size_t)r;
                const uint8_t *pf = t == t0 && pf_next ? w + (size_t)(r + QB_R) * ws : NULL;
                switch (t1 - t < QB_T ? t1 - t : QB_T) {
                case 1: qb_tile(f, packed, gfni, 1, nb, wr, ws, rows, xt, xs, xct, xcs, yt, ldy, pf); break;
                case 2: qb_tile(f, packed, gfni, 2, nb, wr, ws, rows, xt, xs, xct, xcs, yt, ldy, pf); break;
                case 3: qb_tile(f, packed, gfni, 3, nb, wr, ws, rows, xt, xs, xct, xcs, yt, ldy, pf); break;
#if QB_T > 4
                case 4: qb_tile(f, packed, gfni, 4, nb, wr, ws, rows, xt, xs, xct, xcs, yt, ldy, pf); break;
                case 5: qb_tile(f, packed, gfni, 5, nb, wr, ws, rows, xt, xs, xct, xcs, yt, ldy, pf); break;
                case 6: qb_tile(f, packed, gfni, 6, nb, wr, ws, rows, xt, xs, xct, xcs, yt, ldy, pf); break;
                case 7: qb_tile(f, packed, gfni, 7, nb, wr, ws, rows, xt, xs, xct, xcs, yt, ldy, pf); break;
#endif
                default: qb_tile(f, packed, gfni, QB_T, nb, wr, ws, rows, xt, xs, xct, xcs, yt, ldy, pf); break;
                }
            }
        }
    }
}

/* Unpacked rows: the tokens' terms are prepared into scratch, in groups
 * that stay in L2. Without scratch (out of memory) it falls back to the
 * reference, which gives the same bytes. */
SBX_ALWAYS void qb_gemm(qbf f, int64_t n, const void *wv, size_t ws, int64_t nr, const void *xv, size_t xs,
                        int64_t nt, float *y, size_t ldy) {
    const uint8_t *w = wv, *x = xv;
    const int64_t nb = n / qb_blck(f);
    const size_t xcs = (size_t)nb * qb_xb(f);
    int64_t group = (int64_t)(QB_XGROUP / xcs) / QB_T * QB_T;
    group = group < QB_T ? QB_T : group > nt ? nt : group;
    uint8_t *xc = scratch_area(1, xcs * (size_t)group);
    if (!xc) {
        const sb_vec_dot_fn dot = f == QB_Q4_0   ? sb__vec_dot_q4_0_q8_0_ref
                                  : f == QB_Q4_1 ? sb__vec_dot_q4_1_q8_1_ref
                                  : f == QB_Q5_0 ? sb__vec_dot_q5_0_q8_0_ref
                                  : f == QB_Q5_1 ? sb__vec_dot_q5_1_q8_1_ref
                                  : f == QB_Q8_0 ? sb__vec_dot_q8_0_q8_0_ref
                                  : f == QB_IQ4_NL ? sb__vec_dot_iq4_nl_q8_0_ref
                                                 : sb__vec_dot_iq4_xs_q8_K_ref;
        for (int64_t t = 0; t < nt; t++)
            for (int64_t r = 0; r < nr; r++)
                y[t * ldy + r] = dot(n, w + r * ws, x + t * xs);
        return;
    }
    for (int64_t t0 = 0; t0 < nt; t0 += group) {
        const int64_t g = nt - t0 < group ? nt - t0 : group;
        for (int64_t t = 0; t < g; t++)
            qb_prepare(f, x + (size_t)(t0 + t) * xs, nb, xc + (size_t)t * xcs);
        qb_tiles(f, false, false, nb, w, ws, nr, x + (size_t)t0 * xs, xs, xc, xcs, g, y + (size_t)t0 * ldy, ldy);
    }
}

#define QB_GEMM(name, f)                                                                                          \
    static void gemm_##name(int64_t n, const void *w, size_t ws, int64_t nr, const void *x, size_t xs, int64_t nt, \
                            float *y, size_t ldy) {                                                                \
        qb_gemm(f, n, w, ws, nr, x, xs, nt, y, ldy);                                                               \
    }
QB_GEMM(q4_0, QB_Q4_0)
QB_GEMM(q4_1, QB_Q4_1)
QB_GEMM(q5_0, QB_Q5_0)
QB_GEMM(q5_1, QB_Q5_1)
QB_GEMM(q8_0, QB_Q8_0)
QB_GEMM(iq4_nl, QB_IQ4_NL)
QB_GEMM(iq4_xs, QB_IQ4_XS)
#undef QB_GEMM

/* Packed rows: every activation row carries its terms after its blocks
 * (qb_terms_*, once per call), so a chunk of rows starts computing at once. */
SBX_ALWAYS void qb_packed(qbf f, bool gfni, int64_t n, const void *w, size_t ws, int64_t nr, const void *xv,
                          size_t xs, int64_t nt, float *y, size_t ldy) {
    const uint8_t *x = xv;
    const int64_t nb = n / qb_blck(f);
    qb_tiles(f, true, gfni, nb, w, ws, nr, x, xs, x + (size_t)nb * qb_xsize(f), xs, nt, y, ldy);
}

/* Groups of QB_R rows: per block the vectors qb_transpose makes (dword j
 * of row r at byte j * sizeof(vi) + 4r; Q5_0's and Q5_1's then followed by
 * their rows' qh dwords, Q8_0's on AVX-512 with their sign bits flipped),
 * then all blocks' QB_R F16 scales (and QB_R mins). The same bytes as the
 * rows: per row 18 = 16 + 2, 20 = 16 + 4, 22 = 20 + 2, 24 = 20 + 4, 34 =
 * 32 + 2. */
SBX_ALWAYS void qb_pack(qbf f, const void *src, void *dst, int64_t n_in, int64_t n_out) {
    if (f == QB_IQ4_XS) {
        xs_pack(src, dst, n_in, n_out);
        return;
    }
    const int64_t nb = n_in / SB_QK;
    const size_t row = (size_t)nb * qb_wsize(f), qb = qb_packed_q(f);
    const uint8_t *rp[QB_R];
    const vi rowoff = qb_row_offsets(row);
    for (int64_t g = 0; g < n_out / QB_R; g++) {
        const uint8_t *in = qb_group_rows(src, row, g, rp);
        uint8_t *out = (uint8_t *)dst + (size_t)g * QB_R * row, *meta = out + (size_t)nb * qb;
        for (int64_t b = 0; b < nb; b++) {
            const size_t o = (size_t)b * qb_wsize(f);
            vi v[8];
            qb_transpose(rp, o + qb_qs(f), v);
            if (qb_five(f))
                v[4] = qb_gather(in + o + qb_qh(f), rowoff);
            if (f == QB_Q8_0)
                qb_transpose(rp, o + 18, v + 4);
            if (qb_flip(f))
                for (int j = 0; j < 8; j++)
                    v[j] = vi_xor(v[j], vi_set1_8((char)qb_flip(f)));
            for (size_t j = 0; j < qb / sizeof(vi); j++)
                vi_storeu(out + (size_t)b * qb + sizeof(vi) * j, v[j]);
            /* d (and m): the first two halves of each row's block */
            uint8_t *mb = meta + (size_t)b * qb_meta(f);
            for (int r = 0; r < QB_R; r++) {
                memcpy(mb + 2 * r, rp[r] + o, 2);
                if (qb_min(f))
                    memcpy(mb + 2 * (QB_R + r), rp[r] + o + 2, 2);
            }
        }
    }
}


/* Block b of row r of a group in qb_pack's layout, in the format's own:
 * its scale (and min), the qh of Q5_0 and Q5_1, then its quant dwords from
 * the block's vectors (Q8_0's sign bits flipped back). */
SBX_ALWAYS void qb_row_block(qbf f, const void *group, int64_t n_in, int r, int64_t b, void *dst) {
    if (f == QB_IQ4_XS) {
        xs_row_block(group, n_in, r, b, dst);
        return;
    }
    const int64_t nb = n_in / SB_QK;
    const size_t qb = qb_packed_q(f), nq = f == QB_Q8_0 ? 8 : 4; /* quant vectors a block */
    const uint8_t *g = group, *blk = g + (size_t)b * qb + 4 * (size_t)r;
    const uint8_t *mb = g + (size_t)nb * qb + (size_t)b * qb_meta(f) + 2 * (size_t)r;
    uint8_t *out = dst;
    memcpy(out, mb, 2);
    if (qb_min(f))
        memcpy(out + 2, mb + 2 * QB_R, 2);
    if (qb_five(f))
        memcpy(out + qb_qh(f), blk + sizeof(vi) * nq, 4);
    for (size_t j = 0; j < nq; j++)
        for (size_t c = 0; c < 4; c++)
            out[qb_qs(f) + 4 * j + c] = blk[sizeof(vi) * j + c] ^ qb_flip(f);
}

/* The packing entries of the formats, and gemms that unpack high nibbles
 * with GFNI (qb_high_nibbles), for CPUs that have it (Q8_0 has none: the
 * same code either way). */
#define QB_ENTRIES(name, f)                                                                                       \
    static void gemm_##name##_packed(int64_t n, const void *w, size_t ws, int64_t nr, const void *x, size_t xs,  \
                                     int64_t nt, float *y, size_t ldy) {                                          \
        qb_packed(f, false, n, w, ws, nr, x, xs, nt, y, ldy);                                                    \
    }                                                                                                             \
    static void gemm_##name##_packed_gfni(int64_t n, const void *w, size_t ws, int64_t nr, const void *x,       \
                                          size_t xs, int64_t nt, float *y, size_t ldy) {                         \
        qb_packed(f, true, n, w, ws, nr, x, xs, nt, y, ldy);                                                     \
    }                                                                                                             \
    static void qb_terms_##name(const void *x, int64_t n, void *dst) {                                          \
        qb_prepare(f, x, n / qb_blck(f), dst);                                                                    \
    }                                                                                                             \
    static void pack_##name(const void *src, void *dst, int64_t n_in, int64_t n_out) {                          \
        qb_pack(f, src, dst, n_in, n_out);                                                                        \
    }                                                                                                             \
    static void row_block_##name(const void *group, int64_t n_in, int r, int64_t b, void *dst) {                \
        qb_row_block(f, group, n_in, r, b, dst);                                                                  \
    }                                                                                                             \
    static sb_packing packing_##name(bool gfni) {                                                                 \
        return (sb_packing){.rows = QB_R,                                                                         \
                            .pack = pack_##name,                                                                  \
                            .gemm = gfni ? gemm_##name##_packed_gfni : gemm_##name##_packed,                     \
                            .term_bytes = qb_xb(f),                                                               \
                            .terms = qb_terms_##name,                                                             \
                            .row_block = row_block_##name};                                                       \
    }
QB_ENTRIES(q4_0, QB_Q4_0)
QB_ENTRIES(q4_1, QB_Q4_1)
QB_ENTRIES(q5_0, QB_Q5_0)
QB_ENTRIES(q5_1, QB_Q5_1)
QB_ENTRIES(q8_0, QB_Q8_0)
QB_ENTRIES(iq4_nl, QB_IQ4_NL)
QB_ENTRIES(iq4_xs, QB_IQ4_XS)
#undef QB_ENTRIES

#include "tensor/x86/kquants-x86.h"
#if SBX_AVX512
#include "tensor/x86/kquants-amx.h"
#endif

/* ==== gemm driver ======================================================= */

SBX_ALWAYS void tile(fmt f, int R, int T, int64_t n, const uint8_t *w, size_t ws, const uint8_t *x, size_t xs,
                     float *y, size_t ldy) {
    f_tile(f, f, R, T, n, w, ws, x, xs, y, ldy);
}

/* The float formats' gemm. Rows outer, tokens inner: a tile's weight rows
 * stay in L1 while the activations stream past them. Remainders use tiles
 * of one row / token. */
SBX_ALWAYS void gemm(fmt f, int64_t n, const void *wv, size_t ws, int64_t nr, const void *xv, size_t xs, int64_t nt,
                     float *y, size_t ldy) {
    const int RM = FRM, TM = FTM, RV = FRV;
    const uint8_t *w = wv, *x = xv;
    int64_t r = 0;
#if SBX_AVX512
    if (n % 64 == 0 && n <= FS_MAX_N && fs_gemm(f, n, w, ws, nr, x, xs, nt, y, ldy))
        return;
    if ((f == F_F16 || f == F_BF16) && nt >= FG_MIN_NT && fg_gemm(f, n, w, ws, nr, x, xs, nt, y, ldy))
        return;
#endif
    if (nt == 1) {
        for (; r + RV <= nr; r += RV)
            tile(f, RV, 1, n, w + r * ws, ws, x, xs, y + r, ldy);
        for (; r < nr; r++)
            tile(f, 1, 1, n, w + r * ws, ws, x, xs, y + r, ldy);
        return;
    }
    for (; r < nr;) {
        const bool full_r = r + RM <= nr;
        for (int64_t t = 0; t < nt;) {
            const bool full_t = t + TM <= nt;
            const uint8_t *wr = w + r * ws, *xt = x + t * xs;
            float *yt = y + t * ldy + r;
            if (full_r && full_t)
                tile(f, RM, TM, n, wr, ws, xt, xs, yt, ldy);
            else if (full_r)
                tile(f, RM, 1, n, wr, ws, xt, xs, yt, ldy);
            else if (full_t)
                tile(f, 1, TM, n, wr, ws, xt, xs, yt, ldy);
            else
                tile(f, 1, 1, n, wr, ws, xt, xs, yt, ldy);
            t += full_t ? TM : 1;
        }
        r += full_r ? RM : 1;
    }
}

#define SBX_GEMM(name, f)                                                                                        \
    static void name(int64_t n, const void *w, size_t ws, int64_t nr, const void *x, size_t xs, int64_t nt,     \
                     float *y, size_t ldy) {                                                                    \
        gemm(f, n, w, ws, nr, x, xs, nt, y, ldy);                                                               \
    }
SBX_GEMM(gemm_f32, F_F32)
SBX_GEMM(gemm_f16, F_F16)
SBX_GEMM(gemm_bf16, F_BF16)

/* ==== activation conversion ============================================= */

/* Q8_0/Q8_1 as the x86 backend (and quants.c's Q8_ACT): d = amax/127 as
 * F16, q = nearest-even(x * (127/amax)), Q8_1's s = F16(d * sum(q)). The
 * conversion to int rounds in the current mode, as nearbyintf does. */
SBX_ALWAYS void q8_act(bool with_sum, const float *src, void *dst, int64_t n) {
    uint8_t *blk = dst;
    const size_t bsize = with_sum ? sizeof(sb_block_q8_1) : sizeof(sb_block_q8_0);
    for (int64_t b = 0; b < n / SB_QK; b++, blk += bsize, src += SB_QK) {
#if SBX_AVX512
        const __m512 v0 = _mm512_loadu_ps(src), v1 = _mm512_loadu_ps(src + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
#else
        __m256 v[4], m;
        const __m256 sign = _mm256_set1_ps(-0.0f);
        for (int k = 0; k < 4; k++)
            v[k] = _mm256_loadu_ps(src + 8 * k);
        m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                          _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
#endif
        const float d = amax / 127.0f;
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        /* amax below 127/FLT_MAX makes id infinite and every x*id +-inf or
         * NaN; the reference's (int8_t) of that is undefined in C, and what
         * x86 compilers emit (cvttss2si, then the low byte of 0x80000000)
         * writes 0. A zero id gives those zeros here too. */
        if (id > 0x1.fffffep127f)
            id = 0.0f;
        int8_t *qs = (int8_t *)(blk + (with_sum ? 4 : 2));
        int sum;
#if SBX_AVX512
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid)), i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
        _mm_storeu_si128((__m128i *)qs, _mm512_cvtsepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(qs + 16), _mm512_cvtsepi32_epi8(i1));
        sum = with_sum ? _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1)) : 0;
#else
        const __m256 vid = _mm256_set1_ps(id);
        __m256i i[4];
        for (int k = 0; k < 4; k++)
            i[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], vid));
        /* packs work within 128-bit halves; the permute puts the dwords back in order. */
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        _mm256_storeu_si256((__m256i *)qs, _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        const __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        sum = _mm_cvtsi128_si32(s4);
#endif
        const uint16_t dh = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        memcpy(blk, &dh, sizeof(dh));
        if (with_sum) {
            const uint16_t sh = _cvtss_sh((float)sum * d, _MM_FROUND_TO_NEAREST_INT);
            memcpy(blk + 2, &sh, sizeof(sh));
        }
    }
}

static void act_q8_0(const float *src, void *dst, int64_t n) { q8_act(false, src, dst, n); }
static void act_q8_1(const float *src, void *dst, int64_t n) { q8_act(true, src, dst, n); }

/* F16C rounds to nearest even, as sb_fp32_to_fp16. */
static void act_f16(const float *src, void *dst, int64_t n) {
    uint16_t *h = dst;
    int64_t i = 0;
#if SBX_AVX512
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(h + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        h[i] = sb_fp32_to_fp16(src[i]);
}

/* As sb_fp32_to_bf16: NaN -> top half | 0x40 (quiet), else round the top
 * half to nearest even. */
static void act_bf16(const float *src, void *dst, int64_t n) {
    uint16_t *h = dst;
    int64_t i = 0;
#if SBX_AVX512
    for (; i + 16 <= n; i += 16) {
        const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(src + i));
        const __m512i hi = _mm512_srli_epi32(u, 16);
        const __mmask16 nan =
            _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
        const __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
        r = _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
        _mm256_storeu_si256((__m256i *)(h + i), _mm512_cvtepi32_epi16(r));
    }
#else
    for (; i + 16 <= n; i += 16) {
        __m256i r[2];
        for (int k = 0; k < 2; k++) {
            const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(src + i + 8 * k));
            const __m256i hi = _mm256_srli_epi32(u, 16);
            /* |u| as int32 is non-negative, so a signed compare will do. */
            const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                                   _mm256_set1_epi32(0x7f800000));
            const __m256i odd = _mm256_and_si256(hi, _mm256_set1_epi32(1));
            const __m256i rounded =
                _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
            r[k] = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
        }
        /* Values fit in 16 bits, so the saturating pack is exact; it works
         * within 128-bit halves, hence the permute. */
        _mm256_storeu_si256((__m256i *)(h + i), _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xd8));
    }
#endif
    for (; i < n; i++)
        h[i] = sb_fp32_to_bf16(src[i]);
}

/* ---- axpy ---- */

/* Columns of y 4 vectors at a time, held in registers while the rows pass
 * over them; mul and add stay separate instructions (the pragma in
 * tensor-impl.h keeps the tail loop unfused too). Each element sees the
 * rows in order, as in the reference. */
#define AX_FMA_SEP(acc, a, x) vf_add(acc, vf_mul(vf_set1(a), x))

/* Elements i.. of a row of format f, dequantized as the reference does
 * (Q8_0: d * q; i a multiple of VW, so one block holds them all). */
SBX_ALWAYS vf ax_load(fmt f, const uint8_t *row, int64_t i) {
    if (f != F_Q8_0)
        return vf_load(f, row + (size_t)i * f_esize(f));
    const uint8_t *blk = row + (size_t)(i / SB_QK) * sizeof(sb_block_q8_0);
    const __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2 + i % SB_QK));
#if SBX_AVX512
    const vf v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
#else
    const vf v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
#endif
    return vf_mul(vf_set1(_cvtsh_ss(load_u16(blk))), v);
}

SBX_ALWAYS float ax_get(fmt f, const uint8_t *row, int64_t i) {
    if (f != F_Q8_0)
        return f_get(f, row, i);
    const uint8_t *blk = row + (size_t)(i / SB_QK) * sizeof(sb_block_q8_0);
    return (float)(int8_t)blk[2 + i % SB_QK] * _cvtsh_ss(load_u16(blk));
}

SBX_ALWAYS void axpy_rows(fmt f, int64_t n, int64_t nr, const float *a, const void *xv, size_t xs, float *y) {
    const uint8_t *x = xv;
    int64_t i = 0;
    for (; i + 4 * VW <= n; i += 4 * VW) {
        vf acc[4];
        SBX_UNROLL for (int k = 0; k < 4; k++)
            acc[k] = vf_loadu(y + i + k * VW);
        for (int64_t r = 0; r < nr; r++)
            SBX_UNROLL for (int k = 0; k < 4; k++)
                acc[k] = AX_FMA_SEP(acc[k], a[r], ax_load(f, x + (size_t)r * xs, i + k * VW));
        SBX_UNROLL for (int k = 0; k < 4; k++)
            vf_storeu(y + i + k * VW, acc[k]);
    }
    for (; i + VW <= n; i += VW) {
        vf acc = vf_loadu(y + i);
        for (int64_t r = 0; r < nr; r++)
            acc = AX_FMA_SEP(acc, a[r], ax_load(f, x + (size_t)r * xs, i));
        vf_storeu(y + i, acc);
    }
    for (; i < n; i++)
        for (int64_t r = 0; r < nr; r++)
            y[i] += a[r] * ax_get(f, x + (size_t)r * xs, i);
}
#undef AX_FMA_SEP

static void axpy_f32(int64_t n, int64_t nr, const float *a, const void *x, size_t xs, float *y) {
    axpy_rows(F_F32, n, nr, a, x, xs, y);
}

static void axpy_f16(int64_t n, int64_t nr, const float *a, const void *x, size_t xs, float *y) {
    axpy_rows(F_F16, n, nr, a, x, xs, y);
}

static void axpy_q8_0(int64_t n, int64_t nr, const float *a, const void *x, size_t xs, float *y) {
    axpy_rows(F_Q8_0, n, nr, a, x, xs, y);
}

/* ---- store_rows ---- */

/* Whole vectors of 64-byte aligned rows go out as streaming stores (no
 * read of the line first); the fence orders them before the call returns
 * (the pool's hand-over to the next loop then publishes them). */
static void store_rows_f32(int64_t n, int64_t nr, const float *src, void *dstv, size_t dst_stride) {
    uint8_t *row = dstv;
    const bool stream = n % VW == 0 && ((uintptr_t)row | dst_stride) % 64 == 0;
    for (int64_t r = 0; r < nr; r++, src += n, row += dst_stride) {
        float *dst = (float *)row;
        if (!stream) {
            memcpy(dst, src, (size_t)n * sizeof(float));
            continue;
        }
        for (int64_t i = 0; i < n; i += VW)
#if SBX_AVX512
            _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
#else
            _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
#endif
    }
    _mm_sfence();
}

/* F16 and Q8_0 rows are converted on the way by the level's activation
 * conversion (a KV cache in those types holds half or a quarter of the
 * bytes anyway). */
SBX_ALWAYS void store_rows_through(sb_from_float_fn convert, int64_t n, int64_t nr, const float *src, void *dst,
                                   size_t dst_stride) {
    for (int64_t r = 0; r < nr; r++)
        convert(src + (size_t)r * (size_t)n, (uint8_t *)dst + (size_t)r * dst_stride, n);
}

static void store_rows_f16(int64_t n, int64_t nr, const float *src, void *dst, size_t dst_stride) {
    store_rows_through(act_f16, n, nr, src, dst, dst_stride);
}

static void store_rows_q8_0(int64_t n, int64_t nr, const float *src, void *dst, size_t dst_stride) {
    store_rows_through(act_q8_0, n, nr, src, dst, dst_stride);
}

/* ---- swiglu ---- */

/* j * 2^n for act.c's exp (n integer-valued), saturated to 0 / infinity for
 * |n| > 192. AVX-512 scales with vscalefps, as ggml; AVX2 multiplies by
 * 2^(n>>1) (exact) and then by 2^(n - (n>>1)) (one rounding), which gives
 * the same result for every |n| <= 192. */
SBX_ALWAYS vf exp_scale(vf j, vf n) {
#if SBX_AVX512
    const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(n), vf_set1(192.0f), _CMP_GT_OQ);
    const __m512 sat = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, vf_zero(), _CMP_LE_OQ), vf_set1(INFINITY), vf_zero());
    return _mm512_mask_blend_ps(big, _mm512_scalef_ps(j, n), sat);
#else
    const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    const __m256 big = _mm256_cmp_ps(_mm256_andnot_ps(vf_set1(-0.0f), n), vf_set1(192.0f), _CMP_GT_OQ);
    const __m256 sat = _mm256_blendv_ps(vf_set1(INFINITY), vf_zero(), _mm256_cmp_ps(n, vf_zero(), _CMP_LE_OQ));
    return _mm256_blendv_ps(vf_mul(vf_mul(j, s1), s2), sat, big);
#endif
}

/* act.c's ggml_v_expf, VW lanes at a time. */
SBX_ALWAYS vf exp_v(vf x) {
    const vf n = vf_sub(vf_fma(x, vf_set1(0x1.715476p+0f), vf_set1(0x1.8p23f)), vf_set1(0x1.8p23f));
    const vf b = vf_fnma(n, vf_set1(0x1.7f7d1cp-20f), vf_fnma(n, vf_set1(0x1.62e4p-1f), x));
    const vf u = vf_mul(b, b);
    const vf j = vf_fma(vf_fma(vf_fma(vf_set1(0x1.0e4020p-7f), b, vf_set1(0x1.573e2ep-5f)), u,
                               vf_fma(vf_set1(0x1.555e66p-3f), b, vf_set1(0x1.fffdb6p-2f))),
                        u, vf_fma(vf_set1(0x1.ffffecp-1f), b, vf_set1(1.0f)));
    return exp_scale(j, n);
}

/* act.c's SiLU: x / (1 + ggml_v_expf(-x)). */
SBX_ALWAYS vf silu_v(vf x) { return vf_div(x, vf_add(vf_set1(1.0f), exp_v(vf_sub(vf_zero(), x)))); }

static void swiglu_f32(int64_t n, float *gate, const float *up) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW)
        vf_storeu(gate + i, vf_mul(silu_v(vf_loadu(gate + i)), vf_loadu(up + i)));
    sb__swiglu_ref(n - i, gate + i, up + i);
}

/* ---- softmax ---- */

static void softmax_f32(int64_t n, float *x) {
    int64_t i = 0;
    vf m = vf_set1(x[0]);
    for (; i + VW <= n; i += VW)
        m = vf_max(m, vf_loadu(x + i));
    float lane[VW], max = x[0];
    vf_storeu(lane, m);
    for (int k = 0; k < VW; k++)
        max = lane[k] > max ? lane[k] : max;
    for (; i < n; i++)
        max = x[i] > max ? x[i] : max;
    const vf mv = vf_set1(max);
    for (i = 0; i + VW <= n; i += VW)
        vf_storeu(x + i, exp_v(vf_sub(vf_loadu(x + i), mv)));
    if (i < n) { /* the tail through one more vector, padded with values whose exp is 0 */
        float pad[VW];
        for (int k = 0; k < VW; k++)
            pad[k] = i + k < n ? x[i + k] : -1e30f;
        vf_storeu(pad, exp_v(vf_sub(vf_loadu(pad), mv)));
        memcpy(x + i, pad, (size_t)(n - i) * sizeof(float));
    }
    sb__softmax_normalize(n, x);
}

void SBX_FILL(sb_kernels *k) {
    k->axpy[SB_TYPE_F32] = axpy_f32;
    k->axpy[SB_TYPE_F16] = axpy_f16;
    k->axpy[SB_TYPE_Q8_0] = axpy_q8_0;
    k->store_rows[SB_TYPE_F32] = store_rows_f32;
    k->store_rows[SB_TYPE_F16] = store_rows_f16;
    k->store_rows[SB_TYPE_Q8_0] = store_rows_q8_0;
    k->swiglu = swiglu_f32;
    k->softmax = softmax_f32;
    k->gemm[SB_TYPE_F32] = gemm_f32;
    k->gemm[SB_TYPE_F16] = gemm_f16;
    k->gemm[SB_TYPE_BF16] = gemm_bf16;
    k->gemm[SB_TYPE_Q4_0] = gemm_q4_0;
    k->packing[SB_TYPE_Q4_0] = packing_q4_0(k->gfni);
    k->packing[SB_TYPE_Q4_1] = packing_q4_1(k->gfni);
    k->packing[SB_TYPE_Q5_0] = packing_q5_0(k->gfni);
    k->packing[SB_TYPE_Q5_1] = packing_q5_1(k->gfni);
    k->packing[SB_TYPE_Q8_0] = packing_q8_0(k->gfni);
    k->packing[SB_TYPE_IQ4_NL] = packing_iq4_nl(k->gfni);
    k->packing[SB_TYPE_IQ4_XS] = packing_iq4_xs(k->gfni);
    k->gemm[SB_TYPE_Q4_1] = gemm_q4_1;
    k->gemm[SB_TYPE_Q5_0] = gemm_q5_0;
    k->gemm[SB_TYPE_Q5_1] = gemm_q5_1;
    k->gemm[SB_TYPE_Q8_0] = gemm_q8_0;
    k->gemm[SB_TYPE_IQ4_NL] = gemm_iq4_nl;
    k->gemm[SB_TYPE_IQ4_XS] = gemm_iq4_xs;
    k->act_from_float[SB_TYPE_F16] = act_f16;
    k->act_from_float[SB_TYPE_BF16] = act_bf16;
    k->act_from_float[SB_TYPE_Q8_0] = act_q8_0;
    k->act_from_float[SB_TYPE_Q8_1] = act_q8_1;
    /* K-quants: Q4_K, Q5_K and Q6_K packed at load (kquants-x86.h); the
     * AVX2 dot products at both levels for matrices that cannot be. */
    sb__kquants_fill_avx2(k);
    k->act_from_float[SB_TYPE_Q8_K] = act_q8_K;
    kq_fill(k);
}
