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
 *   - block formats: per (row, token) pair, 8 float lanes; per block one
 *     fma(d_w*d_x, lane_sum, acc) per lane, then ((l0+l4)+(l2+l6)) +
 *     ((l1+l5)+(l3+l7)), plus a scalar sum of m_w*s_x for formats with a min;
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
 * With many tokens the AVX-512 level takes other paths (qg_gemm for the
 * block formats, fg_gemm for F16/BF16) that repack or convert operands into
 * per-thread scratch first; same lanes, same operations, same bytes.
 */
#ifndef SBX_AVX512
#error "include from kernels-avx2.c or kernels-avx512.c"
#endif

#include <immintrin.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/kquants.h"
#include "tensor/tensor-impl.h"

#define SBX_ALWAYS static inline __attribute__((always_inline))
#if defined(__clang__)
#define SBX_UNROLL _Pragma("unroll")
#else
#define SBX_UNROLL _Pragma("GCC unroll 64")
#endif

/* Tile shapes, by level: gemm tiles of RM rows x TM tokens, decode (one
 * token) tiles of RV rows, so that several weight streams are in flight.
 * The accumulators (block formats: one 8-lane vector per pair; float
 * formats: at most FACC vectors per tile) and the operands must fit the
 * register file: 16 ymm on AVX2, 32 on AVX-512. Chosen by measurement
 * among the shapes that fit. */
#if SBX_AVX512
#define SBX_FILL sb__kernels_fill_avx512
#define QRM 4 /* block formats: rows x tokens */
#define QTM 4
#define QRV 4 /* block formats, one token: rows */
#define FRM 4 /* float formats */
#define FTM 4
#define FRV 4
#define FACC 16 /* float accumulators a tile may hold */
#define FGR 4   /* F16/BF16 with many tokens (fg_gemm): rows x tokens */
#define FGT 6
#define VW 16   /* floats per vector in the float kernels */
#else
#define SBX_FILL sb__kernels_fill_avx2
#define QRM 2
#define QTM 4
#define QRV 4
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

/* The formats, as compile-time constants of the tile functions. */
typedef enum { F_F32, F_F16, F_BF16, F_Q4_0, F_Q4_1, F_Q5_0, F_Q5_1, F_Q8_0 } fmt;

SBX_ALWAYS bool is_float(fmt f) { return f <= F_BF16; }
SBX_ALWAYS bool has_min(fmt f) { return f == F_Q4_1 || f == F_Q5_1; }

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
SBX_ALWAYS void prefetch_ahead(const uint8_t *p, size_t bytes) {
    if (!SBX_PREFETCH)
        return;
    for (size_t o = 0; o < bytes; o += 64)
        _mm_prefetch((const char *)p + o, _MM_HINT_T0);
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

SBX_ALWAYS size_t q_wsize(fmt f) {
    return f == F_Q4_0 ? 18 : f == F_Q4_1 ? 20 : f == F_Q5_0 ? 22 : f == F_Q5_1 ? 24 : 34;
}
SBX_ALWAYS size_t q_xsize(fmt f) { return has_min(f) ? sizeof(sb_block_q8_1) : sizeof(sb_block_q8_0); }

/* The weight quants are handled unsigned (0..2^bits-1) and the format's bias
 * taken off as bias * (sum of the activation's 4 bytes per lane), which is
 * exact. Q8_0 is stored signed: AVX-512 flips its sign bit (q + 128, bias
 * 128); AVX2's maddubs would saturate on that, so there Q8_0 uses
 * |w| * (x with w's sign), exact for activations in [-127, 127]. */
SBX_ALWAYS int q_bias(fmt f) {
    return f == F_Q4_0 ? 8 : f == F_Q5_0 ? 16 : f == F_Q8_0 && SBX_AVX512 ? 128 : 0;
}

/* Elements 0..15 from the low nibbles of qs, 16..31 from the high ones: the
 * 16 bytes in both halves (a load, no shuffle port), the upper half shifted
 * right by 4 (bits shifted in from the next byte are masked off). */
SBX_ALWAYS __m256i nibbles(const uint8_t *qs) {
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi32(b, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0f));
}

/* An F16 scale, broadcast: vpbroadcastw + vcvtph2ps (fewer shuffle-port
 * uops than converting a scalar and broadcasting the float). */
SBX_ALWAYS __m256 h2f_bcast(const uint8_t *p) { return _mm256_cvtph_ps(_mm_set1_epi16((short)load_u16(p))); }

/* 0x10 in byte e where bit e of the little-endian qh is set. */
SBX_ALWAYS __m256i fifth_bits(const uint8_t *qh) {
    uint32_t m;
    memcpy(&m, qh, sizeof(m));
#if SBX_AVX512
    return _mm256_maskz_mov_epi8((__mmask32)m, _mm256_set1_epi8(0x10));
#else
    /* Byte e gets byte e/8 of qh, keeps bit e%8, and becomes 0xff if set. */
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)m), _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x((int64_t)0x8040201008040201);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
#endif
}

typedef struct {
    __m256i q; /* quants as the level's pair_dot wants them */
    __m256i s; /* AVX2 Q8_0: the signed quants (for the sign trick) */
    __m256 d;  /* scale, broadcast */
    __m128 m;  /* min (Q4_1, Q5_1), broadcast */
} wblock;

SBX_ALWAYS wblock w_decode(fmt f, const uint8_t *b) {
    wblock o;
    o.d = h2f_bcast(b);
    o.m = has_min(f) ? _mm_cvtph_ps(_mm_set1_epi16((short)load_u16(b + 2))) : _mm_setzero_ps();
    switch (f) {
    case F_Q4_0: o.q = nibbles(b + 2); break;
    case F_Q4_1: o.q = nibbles(b + 4); break;
    case F_Q5_0: o.q = _mm256_or_si256(nibbles(b + 6), fifth_bits(b + 2)); break;
    case F_Q5_1: o.q = _mm256_or_si256(nibbles(b + 8), fifth_bits(b + 4)); break;
    default: {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(b + 2));
#if SBX_AVX512
        o.q = _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));
#else
        o.q = _mm256_abs_epi8(v);
#endif
        o.s = v;
        return o;
    }
    }
    o.s = o.q;
    return o;
}

typedef struct {
    __m256i q;  /* the 32 signed quants */
    __m256i nb; /* the bias term: AVX-512 -bias*sum per lane (int32); AVX2 bias*pair sums (int16) */
    __m256 d;   /* scale, broadcast */
} xblock;

SBX_ALWAYS xblock x_prep(fmt f, const uint8_t *b) {
    xblock o;
    const int bias = q_bias(f);
    o.d = h2f_bcast(b);
    o.q = _mm256_loadu_si256((const __m256i *)(b + (has_min(f) ? 4 : 2)));
#if SBX_AVX512
    o.nb = bias ? _mm256_sub_epi32(_mm256_setzero_si256(),
                                   _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)bias), o.q))
                : _mm256_setzero_si256();
#else
    o.nb = bias ? _mm256_maddubs_epi16(_mm256_set1_epi8((char)bias), o.q) : _mm256_setzero_si256();
#endif
    return o;
}

/* The 8 int32 lane sums sum_{e in lane} (w_e - bias) * x_e of one block. */
SBX_ALWAYS __m256i pair_dot(fmt f, const wblock *w, const xblock *x) {
#if SBX_AVX512
    (void)f;
    return _mm256_dpbusd_epi32(x->nb, w->q, x->q);
#else
    const __m256i ones = _mm256_set1_epi16(1);
    if (f == F_Q8_0)
        return _mm256_madd_epi16(_mm256_maddubs_epi16(w->q, _mm256_sign_epi8(x->q, w->s)), ones);
    __m256i p = _mm256_maddubs_epi16(w->q, x->q); /* pairs: |.| <= 2*31*128, no saturation */
    if (q_bias(f))
        p = _mm256_sub_epi16(p, x->nb);
    return _mm256_madd_epi16(p, ones);
#endif
}

/* ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). */
SBX_ALWAYS float q_finish(__m256 acc) {
    const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
    return _mm_cvtss_f32(_mm_add_ss(v2, _mm_movehdup_ps(v2)));
}

SBX_ALWAYS void q_tile(fmt f, int R, int T, int64_t n, const uint8_t *w, size_t ws, const uint8_t *x, size_t xs,
                       float *y, size_t ldy) {
    enum { RMAX = QRM > QRV ? QRM : QRV };
    const size_t wsz = q_wsize(f), xsz = q_xsize(f);
    __m256 acc[RMAX][QTM];
    /* The min terms m_w*s_x of row r, token t in lane t of mins[r]: the
     * reference's scalar mul and add, T tokens per instruction. */
    __m128 mins[RMAX];
    _Static_assert(QTM <= 4, "mins holds 4 tokens");
    SBX_UNROLL for (int r = 0; r < R; r++) {
        mins[r] = _mm_setzero_ps();
        SBX_UNROLL for (int t = 0; t < T; t++)
            acc[r][t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < n / SB_QK; b++) {
        wblock wb[RMAX];
        if (T == 1)
            prefetch_ahead(w + R * ws + (size_t)b * R * wsz, R * wsz);
        SBX_UNROLL for (int r = 0; r < R; r++)
            wb[r] = w_decode(f, w + r * ws + (size_t)b * wsz);
        if (has_min(f)) {
            const uint8_t *xb = x + (size_t)b * xsz + 2; /* Q8_1's s */
            const __m128 s = _mm_cvtph_ps(_mm_setr_epi16((short)load_u16(xb), T > 1 ? (short)load_u16(xb + xs) : 0,
                                                         T > 2 ? (short)load_u16(xb + 2 * xs) : 0,
                                                         T > 3 ? (short)load_u16(xb + 3 * xs) : 0, 0, 0, 0, 0));
            SBX_UNROLL for (int r = 0; r < R; r++)
                mins[r] = _mm_add_ps(mins[r], _mm_mul_ps(wb[r].m, s));
        }
        SBX_UNROLL for (int t = 0; t < T; t++) {
            const xblock xb = x_prep(f, x + t * xs + (size_t)b * xsz);
            SBX_UNROLL for (int r = 0; r < R; r++) {
                const __m256 d = _mm256_mul_ps(wb[r].d, xb.d);
                acc[r][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(pair_dot(f, &wb[r], &xb)), acc[r][t]);
            }
        }
    }
    SBX_UNROLL for (int r = 0; r < R; r++) {
        float m[4];
        _mm_storeu_ps(m, mins[r]);
        SBX_UNROLL for (int t = 0; t < T; t++)
            y[(size_t)t * ldy + (size_t)r] = q_finish(acc[r][t]) + m[t];
    }
}

/* ==== AVX-512 prompt gemm of the block formats ========================== */

#if SBX_AVX512
/* Many tokens (nt >= QG_MIN_NT): the float work the reference prescribes per
 * (row, token) pair and block - one scale product d_w*d_x, and per lane a
 * conversion and an fma - bounds the speed, so each zmm operation serves 16
 * (pair, lane) slots: slot 4m + 2i + j holds row m of a quad of rows, lane
 * 2h + i of a lane pair h (0..3), token j of a token pair. A tile is 8 rows
 * (2 quads) x 4 tokens (2 pairs), 16 accumulators, the 8 weight vectors of
 * a block held in registers for the 4 tokens.
 *
 * Both operands are repacked once per call into per-thread scratch (the
 * GGUF bytes stay as they are):
 *   - weights, per tile and block: for each quad q and lane pair h a zmm of
 *     the rows' unsigned quant bytes (as the decode path makes them) laid
 *     out as above, each row-lane twice (j = 0, 1); then per quad the rows'
 *     d_w (and m_w) as floats, 4 times each;
 *   - activations, per token pair and block: 64 bytes of quants, lane l of
 *     token j at 8l + 4j, so the 16 bytes at 16h are a lane pair's, ready
 *     for a 128-bit broadcast; likewise the int32 starting value of each
 *     lane sum, QG_MAGIC - bias * (sum of the lane's 4 quants); the two
 *     d_x (and s_x) as floats.
 * The lane loop is then two 16-byte broadcast loads per token pair and lane
 * pair, and per quad a vpdpbusd and two float operations. The starting
 * value carries the bias correction (exact, as on the decode path) and
 * 0x4b400000, the float 1.5*2^23: the int32 result is that float plus the
 * lane sum (|sum| < 2^22), and subtracting 1.5*2^23 gives exactly
 * (float)sum, on either vector port (vcvtdq2ps would add a uop). */
#define QG_MAGIC 0x4b400000
#define QG_MIN_NT 4 /* fewer tokens: the tiles above (repacking costs more than it saves) */
#define QG_XGROUP (192 * 1024) /* bytes of packed activations per token group (L2-resident) */
#define QG_WBLOCK (512 * 1024) /* bytes of packed weights per block of rows (L2-resident) */

SBX_ALWAYS size_t qg_wbytes(fmt f) { return 8 * 64 + 2 * 64 + (has_min(f) ? 2 * 64 : 0); } /* per block, tile */
enum { QG_XB = 8 * 8 + 8 * 8 + 8 + 8 };                                                 /* per block, pair */

/* Per-thread scratch: a weight area and an activation area, grown on
 * demand, freed when the thread exits. */
typedef struct {
    uint8_t *p[2];
    size_t cap[2];
} qg_scratch;
static pthread_key_t qg_key;
static pthread_once_t qg_once = PTHREAD_ONCE_INIT;
static bool qg_key_ok;

static void qg_scratch_free(void *v) {
    qg_scratch *s = v;
    free(s->p[0]);
    free(s->p[1]);
    free(s);
}
static void qg_key_init(void) { qg_key_ok = pthread_key_create(&qg_key, qg_scratch_free) == 0; }

/* Area i of at least `bytes` bytes, 64-aligned; NULL if out of memory. */
static uint8_t *qg_area(int i, size_t bytes) {
    pthread_once(&qg_once, qg_key_init);
    if (!qg_key_ok)
        return NULL;
    qg_scratch *s = pthread_getspecific(qg_key);
    if (!s) {
        s = calloc(1, sizeof(*s));
        if (!s || pthread_setspecific(qg_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->cap[i] < bytes) {
        const size_t cap = (bytes + bytes / 4 + 63) / 64 * 64;
        free(s->p[i]);
        s->p[i] = aligned_alloc(64, cap);
        s->cap[i] = s->p[i] ? cap : 0;
    }
    return s->p[i];
}

/* One tile of `rows` (1..8) weight rows, all nb blocks, into dst. Rows past
 * `rows` repeat the last one (their results are not stored). */
SBX_ALWAYS void qg_pack_w(fmt f, const uint8_t *w, size_t ws, int rows, int64_t nb, uint8_t *dst) {
    const size_t wsz = q_wsize(f), wb = qg_wbytes(f);
    const uint8_t *rp[8];
    for (int k = 0; k < 8; k++)
        rp[k] = w + (size_t)(k < rows ? k : rows - 1) * ws;
    /* From [row 0 | row 1] and [row 2 | row 3] (dwords 0-15, 16-31): slot
     * 4m+2i+j takes row m's lane 2h+i, dword 8m + 2h + i. */
    const __m512i ia = _mm512_setr_epi32(0, 0, 1, 1, 8, 8, 9, 9, 16, 16, 17, 17, 24, 24, 25, 25);
    const __m512i quad = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    for (int64_t b = 0; b < nb; b++, dst += wb) {
        __m256i q[8];
        uint16_t d[8], m[8];
        for (int k = 0; k < 8; k++) {
            const uint8_t *blk = rp[k] + (size_t)b * wsz;
            q[k] = w_decode(f, blk).q;
            d[k] = load_u16(blk);
            m[k] = has_min(f) ? load_u16(blk + 2) : 0;
        }
        const __m512 d8 = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d)));
        const __m512 m8 = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)m)));
        for (int qd = 0; qd < 2; qd++) {
            const __m512i lo = _mm512_inserti64x4(_mm512_castsi256_si512(q[4 * qd]), q[4 * qd + 1], 1);
            const __m512i hi = _mm512_inserti64x4(_mm512_castsi256_si512(q[4 * qd + 2]), q[4 * qd + 3], 1);
            for (int h = 0; h < 4; h++)
                _mm512_store_si512((__m512i *)(dst + 64 * (4 * qd + h)),
                                   _mm512_permutex2var_epi32(lo, _mm512_add_epi32(ia, _mm512_set1_epi32(2 * h)), hi));
            const __m512i iq = _mm512_add_epi32(quad, _mm512_set1_epi32(4 * qd));
            _mm512_store_ps(dst + 512 + 64 * qd, _mm512_permutexvar_ps(iq, d8));
            if (has_min(f))
                _mm512_store_ps(dst + 640 + 64 * qd, _mm512_permutexvar_ps(iq, m8));
        }
    }
}

/* Tokens x0 and x1 (maybe the same), all nb blocks, into dst. */
SBX_ALWAYS void qg_pack_x(fmt f, const uint8_t *x0, const uint8_t *x1, int64_t nb, uint8_t *dst) {
    const size_t xsz = q_xsize(f), qo = has_min(f) ? 4 : 2;
    const int bias = q_bias(f);
    const __m512i il = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    for (int64_t b = 0; b < nb; b++, dst += QG_XB, x0 += xsz, x1 += xsz) {
        const __m512i v = _mm512_permutex2var_epi32(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(x0 + qo))), il,
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(x1 + qo))));
        _mm512_storeu_si512((__m512i *)dst, v);
        if (bias)
            _mm512_storeu_si512((__m512i *)(dst + 64),
                                _mm512_sub_epi32(_mm512_set1_epi32(QG_MAGIC),
                                                 _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                                                     _mm512_set1_epi8((char)bias), v)));
        const float s[4] = {_cvtsh_ss(load_u16(x0)), _cvtsh_ss(load_u16(x1)),
                            has_min(f) ? _cvtsh_ss(load_u16(x0 + 2)) : 0.0f,
                            has_min(f) ? _cvtsh_ss(load_u16(x1 + 2)) : 0.0f};
        memcpy(dst + 128, s, sizeof(s));
    }
}

SBX_ALWAYS __m512i bcast16(const uint8_t *p) {
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p));
}
SBX_ALWAYS __m512 bcast8f(const uint8_t *p) {
    double v;
    memcpy(&v, p, sizeof(v));
    return _mm512_castpd_ps(_mm512_set1_pd(v));
}

/* P token pairs (xp, xp + xps, ...) with one packed weight tile; out[p][q]
 * slot 4m+j = the result of row 4q+m, token j of pair p. */
SBX_ALWAYS void qg_tile(fmt f, int P, int64_t nb, const uint8_t *wt, const uint8_t *xp, size_t xps,
                        __m512 out[2][2]) {
    const size_t wb = qg_wbytes(f);
    const __m512 magic = _mm512_castsi512_ps(_mm512_set1_epi32(QG_MAGIC));
    __m512 acc[2][2][4], mins[2][2];
    SBX_UNROLL for (int p = 0; p < P; p++)
        SBX_UNROLL for (int q = 0; q < 2; q++) {
            mins[p][q] = _mm512_setzero_ps();
            SBX_UNROLL for (int h = 0; h < 4; h++)
                acc[p][q][h] = _mm512_setzero_ps();
        }
    for (int64_t b = 0; b < nb; b++, wt += wb, xp += QG_XB) {
        __m512i wq[2][4];
        SBX_UNROLL for (int q = 0; q < 2; q++)
            SBX_UNROLL for (int h = 0; h < 4; h++) {
                wq[q][h] = _mm512_load_si512((const __m512i *)(wt + 64 * (4 * q + h)));
                /* keeps them in registers for the P pairs (else gcc reloads) */
                __asm__("" : "+v"(wq[q][h]));
            }
        SBX_UNROLL for (int p = 0; p < P; p++) {
            const uint8_t *xb = xp + p * xps;
            const __m512 dx = bcast8f(xb + 128);
            __m512 d[2];
            SBX_UNROLL for (int q = 0; q < 2; q++)
                d[q] = _mm512_mul_ps(_mm512_load_ps(wt + 512 + 64 * q), dx);
            SBX_UNROLL for (int h = 0; h < 4; h++) {
                const __m512i xv = bcast16(xb + 16 * h);
                const __m512i c = q_bias(f) ? bcast16(xb + 64 + 16 * h) : _mm512_set1_epi32(QG_MAGIC);
                SBX_UNROLL for (int q = 0; q < 2; q++) {
                    const __m512i s = _mm512_dpbusd_epi32(c, wq[q][h], xv);
                    acc[p][q][h] = _mm512_fmadd_ps(d[q], _mm512_sub_ps(_mm512_castsi512_ps(s), magic), acc[p][q][h]);
                }
            }
            if (has_min(f)) {
                const __m512 sx = bcast8f(xb + 136);
                SBX_UNROLL for (int q = 0; q < 2; q++)
                    mins[p][q] = _mm512_add_ps(mins[p][q], _mm512_mul_ps(_mm512_load_ps(wt + 640 + 64 * q), sx));
            }
        }
    }
    /* Slot i = 0 of lane pair h is lane 2h, i = 1 lane 2h+1: (h2 + h0) holds
     * r0 = l4+l0 and r1 = l5+l1, (h3 + h1) r2 and r3; their sum (r0+r2) and
     * (r1+r3), added across i. */
    SBX_UNROLL for (int p = 0; p < P; p++)
        SBX_UNROLL for (int q = 0; q < 2; q++) {
            const __m512 u = _mm512_add_ps(acc[p][q][2], acc[p][q][0]), v = _mm512_add_ps(acc[p][q][3], acc[p][q][1]);
            const __m512 s = _mm512_add_ps(u, v);
            out[p][q] = _mm512_add_ps(_mm512_add_ps(s, _mm512_permute_ps(s, 0x4e)), mins[p][q]);
        }
}

/* Slots 4m+j of v[q] -> y[(t+j)*ldy + 4q+m] for rows 4q+m < rows, j < toks. */
SBX_ALWAYS void qg_store(const __m512 v[2], int rows, int toks, float *y, size_t ldy) {
    _Alignas(64) float o[2][16];
    _mm512_store_ps(o[0], v[0]);
    _mm512_store_ps(o[1], v[1]);
    for (int j = 0; j < toks; j++)
        for (int k = 0; k < rows; k++)
            y[(size_t)j * ldy + (size_t)k] = o[k / 4][4 * (k % 4) + j];
}

/* Rows in blocks whose packed weights stay in L2 (QG_WBLOCK bytes), each
 * against all tokens, in groups whose packed activations stay there too
 * (QG_XGROUP). Returns false (nothing done) if scratch could not be had. */
SBX_ALWAYS bool qg_gemm(fmt f, int64_t n, const uint8_t *w, size_t ws, int64_t nr, const uint8_t *x, size_t xs,
                        int64_t nt, float *y, size_t ldy) {
    const int64_t nb = n / SB_QK, npairs = (nt + 1) / 2;
    const size_t tile_bytes = (size_t)nb * qg_wbytes(f), pair_bytes = (size_t)nb * QG_XB;
    int64_t group = (int64_t)(QG_XGROUP / pair_bytes); /* token pairs per group */
    group = group < 2 ? 2 : group > npairs ? npairs : group;
    int64_t tiles = (int64_t)(QG_WBLOCK / tile_bytes); /* row tiles per block */
    tiles = tiles < 1 ? 1 : tiles > (nr + 7) / 8 ? (nr + 7) / 8 : tiles;
    uint8_t *wsc = qg_area(0, tile_bytes * (size_t)tiles), *xsc = qg_area(1, pair_bytes * (size_t)group);
    if (!wsc || !xsc)
        return false;
    for (int64_t r0 = 0; r0 < nr; r0 += 8 * tiles) {
        const int64_t ntl = (nr - r0 + 7) / 8 < tiles ? (nr - r0 + 7) / 8 : tiles;
        for (int64_t i = 0; i < ntl; i++) {
            const int64_t r = r0 + 8 * i;
            qg_pack_w(f, w + (size_t)r * ws, ws, nr - r < 8 ? (int)(nr - r) : 8, nb, wsc + (size_t)i * tile_bytes);
        }
        for (int64_t p0 = 0; p0 < npairs; p0 += group) {
            const int64_t g = npairs - p0 < group ? npairs - p0 : group;
            for (int64_t p = 0; p < g; p++) {
                const int64_t t = 2 * (p0 + p);
                qg_pack_x(f, x + (size_t)t * xs, x + (size_t)(t + 1 < nt ? t + 1 : t) * xs, nb,
                          xsc + (size_t)p * pair_bytes);
            }
            for (int64_t i = 0; i < ntl; i++) {
                const int64_t r = r0 + 8 * i;
                const int rows = nr - r < 8 ? (int)(nr - r) : 8;
                const uint8_t *wt = wsc + (size_t)i * tile_bytes;
                for (int64_t p = 0; p < g;) {
                    const int P = p + 2 <= g ? 2 : 1;
                    __m512 out[2][2];
                    if (P == 2)
                        qg_tile(f, 2, nb, wt, xsc + (size_t)p * pair_bytes, pair_bytes, out);
                    else
                        qg_tile(f, 1, nb, wt, xsc + (size_t)p * pair_bytes, pair_bytes, out);
                    for (int q = 0; q < P; q++) {
                        const int64_t t = 2 * (p0 + p + q);
                        qg_store(out[q], rows, nt - t < 2 ? 1 : 2, y + (size_t)t * ldy + (size_t)r, ldy);
                    }
                    p += P;
                }
            }
        }
    }
    return true;
}

/* F16/BF16 weights with many tokens: the activations of a group of tokens
 * are converted to F32 once (exact) into scratch, so that a tile of FGR rows
 * x FGT tokens spends its vector work on the reference's fmas and on
 * converting the weights, once per FGT tokens. Same lanes, same order. */
#define FG_XGROUP (256 * 1024) /* bytes of converted activations per token group */
SBX_ALWAYS bool fg_gemm(fmt f, int64_t n, const uint8_t *w, size_t ws, int64_t nr, const uint8_t *x, size_t xs,
                        int64_t nt, float *y, size_t ldy) {
    const size_t row = (size_t)n * sizeof(float);
    int64_t group = (int64_t)(FG_XGROUP / row) / FGT * FGT;
    group = group < FGT ? FGT : group > nt ? nt : group;
    float *xf = (float *)qg_area(1, row * (size_t)group);
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

/* ==== gemm driver ======================================================= */

SBX_ALWAYS void tile(fmt f, int R, int T, int64_t n, const uint8_t *w, size_t ws, const uint8_t *x, size_t xs,
                     float *y, size_t ldy) {
    if (is_float(f))
        f_tile(f, f, R, T, n, w, ws, x, xs, y, ldy);
    else
        q_tile(f, R, T, n, w, ws, x, xs, y, ldy);
}

/* Rows outer, tokens inner: a tile's weight rows stay in L1 while the
 * activations stream past them. Remainders use tiles of one row / token. */
SBX_ALWAYS void gemm(fmt f, int64_t n, const void *wv, size_t ws, int64_t nr, const void *xv, size_t xs, int64_t nt,
                     float *y, size_t ldy) {
    const int RM = is_float(f) ? FRM : QRM, TM = is_float(f) ? FTM : QTM, RV = is_float(f) ? FRV : QRV;
    const uint8_t *w = wv, *x = xv;
    int64_t r = 0;
#if SBX_AVX512
    if (!is_float(f) && nt >= QG_MIN_NT && qg_gemm(f, n, w, ws, nr, x, xs, nt, y, ldy))
        return;
    if ((f == F_F16 || f == F_BF16) && nt >= QG_MIN_NT && fg_gemm(f, n, w, ws, nr, x, xs, nt, y, ldy))
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
SBX_GEMM(gemm_q4_0, F_Q4_0)
SBX_GEMM(gemm_q4_1, F_Q4_1)
SBX_GEMM(gemm_q5_0, F_Q5_0)
SBX_GEMM(gemm_q5_1, F_Q5_1)
SBX_GEMM(gemm_q8_0, F_Q8_0)

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

/* 8 lanes at a time; mul and add stay separate instructions (the pragma in
 * tensor-impl.h keeps the tail loop unfused too). */
static void axpy_f32(int64_t n, float a, const float *x, float *y) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_mul_ps(va, _mm256_loadu_ps(x + i))));
    for (; i < n; i++)
        y[i] += a * x[i];
}

void SBX_FILL(sb_kernels *k) {
    k->axpy = axpy_f32;
    k->gemm[SB_TYPE_F32] = gemm_f32;
    k->gemm[SB_TYPE_F16] = gemm_f16;
    k->gemm[SB_TYPE_BF16] = gemm_bf16;
    k->gemm[SB_TYPE_Q4_0] = gemm_q4_0;
    k->gemm[SB_TYPE_Q4_1] = gemm_q4_1;
    k->gemm[SB_TYPE_Q5_0] = gemm_q5_0;
    k->gemm[SB_TYPE_Q5_1] = gemm_q5_1;
    k->gemm[SB_TYPE_Q8_0] = gemm_q8_0;
    k->act_from_float[SB_TYPE_F16] = act_f16;
    k->act_from_float[SB_TYPE_BF16] = act_bf16;
    k->act_from_float[SB_TYPE_Q8_0] = act_q8_0;
    k->act_from_float[SB_TYPE_Q8_1] = act_q8_1;
    /* K-quants: AVX2 kernels at both levels (ggml runs the same code there). */
    sb__kquants_fill_avx2(k);
}
