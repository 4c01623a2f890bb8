/*
 * types.c - the element type table (block geometry of every ggml type, and
 * the kernels of those switchboard can compute with), the scalar F16/BF16
 * conversions, and row conversions of the float formats.
 *
 * Geometry is listed for every type, computable or not, so that the GGUF
 * reader can check the size of any tensor in any file.
 */
#include <string.h>

#include "base/base.h"
#include "tensor/kquants.h"
#include "tensor/tensor-impl.h"

/* ---- scalar conversions ------------------------------------------------ */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* Branch-free (the three cases computed, one selected), so that loops of it
 * vectorise. */
static inline float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    /* inf, or NaN made quiet as F16C does */
    const uint32_t special = sign | 0x7f800000 | (mant << 13) | (mant ? 0x400000 : 0);
    /* zero or subnormal: mant units of 2^-24, exact in float */
    const uint32_t small = sign | f32_bits((float)mant * 0x1p-24f);
    const uint32_t normal = sign | ((exp + 112) << 23) | (mant << 13);
    return f32_from_bits(exp == 0x1f ? special : exp == 0 ? small : normal);
}

float sb_fp16_to_fp32(uint16_t h) { return fp16_to_fp32(h); }

/* Drops the low `shift` bits of m, rounding to nearest, ties to even. */
static uint32_t shift_round_even(uint32_t m, unsigned shift) {
    uint32_t kept = m >> shift;
    uint32_t rest = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    return kept + (rest > half || (rest == half && (kept & 1)));
}

uint16_t sb_fp32_to_fp16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffff;
    if (a > 0x7f800000) /* NaN: quiet, top payload bits kept (as F16C) */
        return sign | 0x7e00 | ((a >> 13) & 0x3ff);
    if (a >= 0x477ff000) /* 65520 and up round to infinity */
        return sign | 0x7c00;
    if (a >= 0x38800000) /* normal in F16: rebias exponent, round mantissa; a carry bumps the exponent */
        return sign | (uint16_t)shift_round_even(a - (112u << 23), 13);
    /* F16 subnormal or zero: the value in units of 2^-24 is m * 2^(exp-126). */
    uint32_t exp = a >> 23;
    if (exp < 102) /* below 2^-25: rounds to zero (F32 subnormals included) */
        return sign;
    return sign | (uint16_t)shift_round_even((a & 0x7fffff) | 0x800000, 126 - exp);
}

float sb_bf16_to_fp32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

/* As ggml_compute_fp32_to_bf16: ties to even, subnormals kept, NaN quieted. */
uint16_t sb_fp32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000)
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* ---- row conversions of the float formats ------------------------------ */

void sb__f32_to_float(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

void sb__f32_from_float(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(float)); }

/* Static: gcc exports the resolver of a cloned function whatever the
 * visibility, and the library exports only switchboard.h's functions. */
SB_VECTOR_CLONES static void f16_row_to_float(const uint16_t *h, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        dst[i] = fp16_to_fp32(h[i]);
}

void sb__f16_to_float(const void *src, float *dst, int64_t n) { f16_row_to_float(src, dst, n); }

void sb__f16_from_float(const float *src, void *dst, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++)
        h[i] = sb_fp32_to_fp16(src[i]);
}

void sb__bf16_to_float(const void *src, float *dst, int64_t n) {
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = sb_bf16_to_fp32(h[i]);
}

void sb__bf16_from_float(const float *src, void *dst, int64_t n) {
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++)
        h[i] = sb_fp32_to_bf16(src[i]);
}

/* ---- the type table ---------------------------------------------------- */

/* A type switchboard computes with, and one it can only store. */
#define COMPUTABLE(nm, blck, size, to, from, dot_type, dot, act)                                        \
    {.name = (nm), .blck_size = (blck), .type_size = (size), .to_float = (to), .from_float = (from),     \
     .vec_dot_type = (dot_type), .vec_dot = (dot), .act_from_float = (act)}
#define GEOMETRY(nm, blck, size) {.name = (nm), .blck_size = (blck), .type_size = (size)}

/* Sizes are ggml's; the sums in comments are the block fields
 * (d/dmin are F16, Q8_K's d is F32). */
static const sb_type_traits traits[SB_TYPE_COUNT] = {
    [SB_TYPE_F32] = COMPUTABLE("f32", 1, 4,
        sb__f32_to_float, sb__f32_from_float,
        SB_TYPE_F32, sb__vec_dot_f32_f32_ref, sb__f32_from_float),
    [SB_TYPE_F16] = COMPUTABLE("f16", 1, 2,
        sb__f16_to_float, sb__f16_from_float,
        SB_TYPE_F16, sb__vec_dot_f16_f16_ref, sb__f16_from_float),
    [SB_TYPE_Q4_0] = COMPUTABLE("q4_0", SB_QK, sizeof(sb_block_q4_0),
        sb__q4_0_to_float, sb__q4_0_from_float_ref,
        SB_TYPE_Q8_0, sb__vec_dot_q4_0_q8_0_ref, NULL),
    [SB_TYPE_Q4_1] = COMPUTABLE("q4_1", SB_QK, sizeof(sb_block_q4_1),
        sb__q4_1_to_float, sb__q4_1_from_float_ref,
        SB_TYPE_Q8_1, sb__vec_dot_q4_1_q8_1_ref, NULL),
    [SB_TYPE_Q5_0] = COMPUTABLE("q5_0", SB_QK, sizeof(sb_block_q5_0),
        sb__q5_0_to_float, sb__q5_0_from_float_ref,
        SB_TYPE_Q8_0, sb__vec_dot_q5_0_q8_0_ref, NULL),
    [SB_TYPE_Q5_1] = COMPUTABLE("q5_1", SB_QK, sizeof(sb_block_q5_1),
        sb__q5_1_to_float, sb__q5_1_from_float_ref,
        SB_TYPE_Q8_1, sb__vec_dot_q5_1_q8_1_ref, NULL),
    [SB_TYPE_Q8_0] = COMPUTABLE("q8_0", SB_QK, sizeof(sb_block_q8_0),
        sb__q8_0_to_float, sb__q8_0_from_float_ref,
        SB_TYPE_Q8_0, sb__vec_dot_q8_0_q8_0_ref, sb__q8_0_from_float_act),
    /* Activation type only: ggml has no Q8_1 weights (and no dequantizer). */
    [SB_TYPE_Q8_1] = COMPUTABLE("q8_1", SB_QK, sizeof(sb_block_q8_1),
        sb__q8_1_to_float, sb__q8_1_from_float_ref,
        SB_TYPE_Q8_1, NULL, sb__q8_1_from_float_act),
    /* K-quants (kquants.c): 256-element super-blocks; activations go to Q8_K. */
    [SB_TYPE_Q2_K] = COMPUTABLE("q2_K", SB_QK_K, sizeof(sb_block_q2_K), /* scales 16 + qs 64 + d, dmin */
        sb__q2_K_to_float, sb__q2_K_from_float_ref,
        SB_TYPE_Q8_K, sb__vec_dot_q2_K_q8_K_ref, NULL),
    [SB_TYPE_Q3_K] = COMPUTABLE("q3_K", SB_QK_K, sizeof(sb_block_q3_K), /* hmask 32 + qs 64 + scales 12 + d */
        sb__q3_K_to_float, sb__q3_K_from_float_ref,
        SB_TYPE_Q8_K, sb__vec_dot_q3_K_q8_K_ref, NULL),
    [SB_TYPE_Q4_K] = COMPUTABLE("q4_K", SB_QK_K, sizeof(sb_block_q4_K), /* d, dmin + scales 12 + qs 128 */
        sb__q4_K_to_float, sb__q4_K_from_float_ref,
        SB_TYPE_Q8_K, sb__vec_dot_q4_K_q8_K_ref, NULL),
    [SB_TYPE_Q5_K] = COMPUTABLE("q5_K", SB_QK_K, sizeof(sb_block_q5_K), /* d, dmin + scales 12 + qh 32 + qs 128 */
        sb__q5_K_to_float, sb__q5_K_from_float_ref,
        SB_TYPE_Q8_K, sb__vec_dot_q5_K_q8_K_ref, NULL),
    [SB_TYPE_Q6_K] = COMPUTABLE("q6_K", SB_QK_K, sizeof(sb_block_q6_K), /* ql 128 + qh 64 + scales 16 + d */
        sb__q6_K_to_float, sb__q6_K_from_float_ref,
        SB_TYPE_Q8_K, sb__vec_dot_q6_K_q8_K_ref, NULL),
    /* Activation type only (ggml has no Q8_K weights); llama.cpp's x86
     * backend quantizes activations with the reference quantizer. */
    [SB_TYPE_Q8_K] = COMPUTABLE("q8_K", SB_QK_K, sizeof(sb_block_q8_K), /* d (f32) + qs 256 + bsums 16*2 */
        sb__q8_K_to_float, sb__q8_K_from_float_ref,
        SB_TYPE_Q8_K, NULL, sb__q8_K_from_float_ref),
    [SB_TYPE_IQ2_XXS] = GEOMETRY("iq2_xxs", SB_QK_K, 66), /* d + qs 32*2 */
    [SB_TYPE_IQ2_XS] = GEOMETRY("iq2_xs", SB_QK_K, 74),  /* d + qs 32*2 + scales 8 */
    [SB_TYPE_IQ3_XXS] = GEOMETRY("iq3_xxs", SB_QK_K, 98), /* d + qs 96 */
    [SB_TYPE_IQ1_S] = GEOMETRY("iq1_s", SB_QK_K, 50),    /* d + qs 32 + qh 8*2 */
    /* Older llama.cpp quantizers wrote it for the Q2_K and Q3_K matrices
     * whose rows are not a multiple of 256. */
    [SB_TYPE_IQ4_NL] = COMPUTABLE("iq4_nl", SB_QK, sizeof(sb_block_iq4_nl), /* d + qs 16 */
        sb__iq4_nl_to_float, sb__iq4_nl_from_float_ref,
        SB_TYPE_Q8_0, sb__vec_dot_iq4_nl_q8_0_ref, NULL),
    [SB_TYPE_IQ3_S] = GEOMETRY("iq3_s", SB_QK_K, 110),   /* d + qs 64 + qh 8 + signs 32 + scales 4 */
    [SB_TYPE_IQ2_S] = GEOMETRY("iq2_s", SB_QK_K, 82),    /* d + qs 64 + qh 8 + scales 8 */
    [SB_TYPE_IQ4_XS] = COMPUTABLE("iq4_xs", SB_QK_K, sizeof(sb_block_iq4_xs), /* d + scales_h 2 + scales_l 4 + qs 128 */
        sb__iq4_xs_to_float, sb__iq4_xs_from_float_ref,
        SB_TYPE_Q8_K, sb__vec_dot_iq4_xs_q8_K_ref, NULL),
    [SB_TYPE_I8] = GEOMETRY("i8", 1, 1),
    [SB_TYPE_I16] = GEOMETRY("i16", 1, 2),
    [SB_TYPE_I32] = GEOMETRY("i32", 1, 4),
    [SB_TYPE_I64] = GEOMETRY("i64", 1, 8),
    [SB_TYPE_F64] = GEOMETRY("f64", 1, 8),
    [SB_TYPE_IQ1_M] = GEOMETRY("iq1_m", SB_QK_K, 56), /* qs 32 + qh 16 + scales 8 */
    [SB_TYPE_BF16] = COMPUTABLE("bf16", 1, 2,
        sb__bf16_to_float, sb__bf16_from_float,
        SB_TYPE_BF16, sb__vec_dot_bf16_bf16_ref, sb__bf16_from_float),
    [SB_TYPE_TQ1_0] = GEOMETRY("tq1_0", SB_QK_K, 54), /* qs 48 + qh 4 + d */
    [SB_TYPE_TQ2_0] = GEOMETRY("tq2_0", SB_QK_K, 66), /* qs 64 + d */
    [SB_TYPE_MXFP4] = GEOMETRY("mxfp4", SB_QK, 17),   /* e (E8M0) + qs 16 */
};
_Static_assert(SB_ARRAY_LEN(traits) == SB_TYPE_COUNT, "one entry per type id");

const sb_type_traits *sb_type_traits_of(uint32_t type) {
    /* Ids ggml retired have no entry, hence no name. */
    if (type >= SB_TYPE_COUNT || !traits[type].name)
        return NULL;
    return &traits[type];
}

bool sb_type_can_matmul(uint32_t type) {
    const sb_type_traits *t = sb_type_traits_of(type);
    return t && t->vec_dot;
}

size_t sb_type_row_size(sb_type type, int64_t n) {
    const sb_type_traits *t = sb_type_traits_of(type);
    uint64_t size;
    if (!t || n < 0 || n % t->blck_size != 0)
        return 0;
    if (sb_mul_overflows((uint64_t)n / t->blck_size, t->type_size, &size) || size > SIZE_MAX)
        return 0;
    return (size_t)size;
}
