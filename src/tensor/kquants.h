/*
 * kquants.h - the K-quant formats (Q2_K..Q6_K weights and their activation
 * type Q8_K): block layouts and reference kernels, private to the tensor
 * module.
 *
 * A K-quant block ("super-block") holds 256 elements split into sub-blocks
 * of 16 or 32; each sub-block has a small integer scale (and, for Q2_K,
 * Q4_K and Q5_K, a small integer min) that the block's F16 d (and dmin)
 * scale: x = d*sc * q - dmin*m. Layouts and arithmetic are ggml's, byte for
 * byte and bit for bit; see kquants.c for the evaluation orders.
 */
#ifndef SB_KQUANTS_H
#define SB_KQUANTS_H

#include <stdint.h>

#include "tensor/tensor.h"

/* Block layouts (ggml-compatible). F16 fields are bit patterns. */
typedef struct {
    uint8_t scales[SB_QK_K / 16]; /* per 16-element sub-block: scale (low nibble), min (high nibble) */
    uint8_t qs[SB_QK_K / 4];      /* 2-bit quants */
    uint16_t d, dmin;             /* F16 super-scales of the scales and of the mins */
} sb_block_q2_K;

typedef struct {
    uint8_t hmask[SB_QK_K / 8]; /* third bit of each quant */
    uint8_t qs[SB_QK_K / 4];    /* low 2 bits */
    uint8_t scales[12];         /* 16 6-bit scales, stored +32 */
    uint16_t d;                 /* F16 */
} sb_block_q3_K;

typedef struct {
    uint16_t d, dmin;             /* F16 */
    uint8_t scales[12];           /* 8 6-bit scales and 8 6-bit mins (one per 32 elements) */
    uint8_t qs[SB_QK_K / 2];      /* 4-bit quants */
} sb_block_q4_K;

typedef struct {
    uint16_t d, dmin;             /* F16 */
    uint8_t scales[12];           /* as Q4_K */
    uint8_t qh[SB_QK_K / 8];      /* fifth bit of each quant */
    uint8_t qs[SB_QK_K / 2];      /* low 4 bits */
} sb_block_q5_K;

typedef struct {
    uint8_t ql[SB_QK_K / 2];      /* low 4 bits */
    uint8_t qh[SB_QK_K / 4];      /* high 2 bits */
    int8_t scales[SB_QK_K / 16];  /* 8-bit signed scale per 16 elements */
    uint16_t d;                   /* F16 */
} sb_block_q6_K;

typedef struct {
    float d;                      /* F32 scale: x = q * d */
    int8_t qs[SB_QK_K];
    int16_t bsums[SB_QK_K / 16];  /* sum of the quants of each 16 elements */
} sb_block_q8_K;

_Static_assert(sizeof(sb_block_q2_K) == 84, "q2_K block");
_Static_assert(sizeof(sb_block_q3_K) == 110, "q3_K block");
_Static_assert(sizeof(sb_block_q4_K) == 144, "q4_K block");
_Static_assert(sizeof(sb_block_q5_K) == 176, "q5_K block");
_Static_assert(sizeof(sb_block_q6_K) == 210, "q6_K block");
_Static_assert(sizeof(sb_block_q8_K) == 292, "q8_K block");

/* IQ4_XS (iquants.c): 8 sub-blocks of 32 whose quants index IQ4_NL's 16
 * values; sub-block j's 6-bit scale ls is stored + 32 in the low nibble (j
 * even) or high nibble (j odd) of scales_l[j / 2] and bits 2j..2j+1 of
 * scales_h: x = d * (ls - 32) * value[q]. Its quants sit as IQ4_NL's, 16
 * bytes a sub-block. Activations are Q8_K, as the K-quants'. */
typedef struct {
    uint16_t d;                   /* F16 */
    uint16_t scales_h;
    uint8_t scales_l[SB_QK_K / 64];
    uint8_t qs[SB_QK_K / 2];
} sb_block_iq4_xs;
_Static_assert(sizeof(sb_block_iq4_xs) == 136, "iq4_xs block");

/* IQ4_XS: sub-block j's scale, ls - 32 (-32..31). */
static inline int sb__iq4_xs_scale(const sb_block_iq4_xs *b, int j) {
    return ((b->scales_l[j / 2] >> 4 * (j % 2) & 0xf) | (b->scales_h >> 2 * j & 3) << 4) - 32;
}

/* Q4_K/Q5_K: 6-bit scale and min of 32-element sub-block j from a block's
 * 12 scale bytes. The first four are whole bytes 0..3 (scales) and 4..7
 * (mins); the last four are nibbles of bytes 8..11 with their top two bits
 * in the spare bits of bytes 0..7. */
static inline void sb__k4_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | (s[j - 4] >> 6) << 4;
        *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* Q3_K: the 6-bit value of sub-block j (before subtracting 32) from the 12
 * scale bytes s. The low nibbles of bytes 0..7 hold sub-blocks 0..7, their
 * high nibbles 8..15; bytes 8..11 hold the top two bits, sub-block j at byte
 * 8 + j%4, bits 2*(j/4). */
static inline int sb__q3_scale(const uint8_t *s, int j) {
    int lo = j < 8 ? s[j] & 0xf : s[j - 8] >> 4;
    int hi = s[8 + j % 4] >> (2 * (j / 4)) & 3;
    return lo | hi << 4;
}

/* Dequantization: exactly ggml's dequantize_row_*. n is a multiple of 256. */
void sb__q2_K_to_float(const void *src, float *dst, int64_t n);
void sb__q3_K_to_float(const void *src, float *dst, int64_t n);
void sb__q4_K_to_float(const void *src, float *dst, int64_t n);
void sb__q5_K_to_float(const void *src, float *dst, int64_t n);
void sb__q6_K_to_float(const void *src, float *dst, int64_t n);
void sb__q8_K_to_float(const void *src, float *dst, int64_t n);
/* The stored quants (0..63) of one Q6_K block, element by element: what
 * the packed kernels repack at load. */
void sb__q6_K_quants(const void *blk, uint8_t q[SB_QK_K]);
/* Its inverse: the quants q (0..63) into blk's ql and qh, its other fields
 * untouched (a row of a packed table looked up). */
void sb__q6_K_set_quants(void *blk, const uint8_t q[SB_QK_K]);

/* Quantization: exactly ggml's quantize_row_*_ref (what llama.cpp writes to
 * files without an importance matrix). Q8_K's is also what llama.cpp's x86
 * CPU backend uses for activations (its quantize_row_q8_K calls the _ref),
 * so it serves as Q8_K's act_from_float too. Unlike ggml, an all-zero Q8_K
 * block gets zero bsums rather than leaving them unwritten. */
void sb__q2_K_from_float_ref(const float *src, void *dst, int64_t n);
void sb__q3_K_from_float_ref(const float *src, void *dst, int64_t n);
void sb__q4_K_from_float_ref(const float *src, void *dst, int64_t n);
void sb__q5_K_from_float_ref(const float *src, void *dst, int64_t n);
void sb__q6_K_from_float_ref(const float *src, void *dst, int64_t n);
void sb__q8_K_from_float_ref(const float *src, void *dst, int64_t n);

/* Dot products of a weight row with a Q8_K activation row, in the float
 * order of llama.cpp's repacked Q4_K kernels (see kquants.c). */
float sb__vec_dot_q2_K_q8_K_ref(int64_t n, const void *w, const void *x);
float sb__vec_dot_q3_K_q8_K_ref(int64_t n, const void *w, const void *x);
float sb__vec_dot_q4_K_q8_K_ref(int64_t n, const void *w, const void *x);
float sb__vec_dot_q5_K_q8_K_ref(int64_t n, const void *w, const void *x);
float sb__vec_dot_q6_K_q8_K_ref(int64_t n, const void *w, const void *x);

/* IQ4_XS (iquants.c): ggml's dequantize_row_iq4_xs and quantize_iq4_xs (no
 * importance matrix); the dot product in the K-quants' order, one exact
 * integer per block (sum over sub-blocks of (ls - 32) times their
 * products), then acc = fma(sum, d_w * d_x, acc). */
void sb__iq4_xs_to_float(const void *src, float *dst, int64_t n);
void sb__iq4_xs_from_float_ref(const float *src, void *dst, int64_t n);
float sb__vec_dot_iq4_xs_q8_K_ref(int64_t n, const void *w, const void *x);

#if defined(__x86_64__)
/* AVX2 + FMA versions (x86/kquants_avx2.c), bit-identical to the _ref
 * ones; callable only on a CPU with AVX2 and FMA. */
float sb__vec_dot_q2_K_q8_K_avx2(int64_t n, const void *w, const void *x);
float sb__vec_dot_q3_K_q8_K_avx2(int64_t n, const void *w, const void *x);
float sb__vec_dot_q4_K_q8_K_avx2(int64_t n, const void *w, const void *x);
float sb__vec_dot_q5_K_q8_K_avx2(int64_t n, const void *w, const void *x);
float sb__vec_dot_q6_K_q8_K_avx2(int64_t n, const void *w, const void *x);
/* Sets the K-quant gemm entries of an AVX2 (or AVX-512) level table. */
void sb__kquants_fill_avx2(sb_kernels *k);
#endif

#endif
