/*
 * tensor-impl.h - what the files of the tensor module share and nothing
 * else should use: the layouts of the 32-element block formats, and the
 * reference (portable scalar) kernels that the traits table points at.
 *
 * The `_ref` kernels are the "scalar level" of the kernel dispatch: SIMD
 * versions added later override entries of the table and are tested against
 * these, so these stay plain and follow ggml's generic C code operation for
 * operation (including its float evaluation order).
 */
#ifndef SB_TENSOR_IMPL_H
#define SB_TENSOR_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "tensor/tensor.h"

/* Every float operation in the kernels rounds on its own: no fusing of a*b+c
 * into one FMA, which compilers do by default when the target has FMA
 * (-march=native). ggml builds its reference (de)quantizers without FMA, so
 * fusing would change the bytes we write; and the reference kernels must
 * give the same answer whatever the build flags. Applies to every file of
 * the module, as each includes this header. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* ggml's quantizers: a group of weights with |x| below this is all zero. */
#define GROUP_MAX_EPS 1e-15f

/* Round to nearest, ties to even, as ggml's nearest_int: adding 1.5*2^23
 * leaves the rounded integer in the low mantissa bits. Valid for
 * |v| <= 2^22 (ggml asserts it); outside that range (and for NaN) it
 * returns the same garbage ggml's does, which is the point. */
static inline int sb__nearest_int(float v) {
    const float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, sizeof(i));
    return (i & 0x007fffff) - 0x00400000;
}

/* Block scales are F16 bit patterns at unaligned offsets. */
static inline float sb__get_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof(h));
    return sb_fp16_to_fp32(h);
}

static inline void sb__put_f16(uint8_t *p, float v) {
    uint16_t h = sb_fp32_to_fp16(v);
    memcpy(p, &h, sizeof(h));
}

/* Where the fields of a 32-element block format sit. Every such block starts
 * with the F16 scale d; element e's quant has its low bits in qs (elements
 * e and e+16 share byte e of a 4/5-bit qs: low nibble, high nibble) and, for
 * 5-bit formats, its fifth bit at bit e of the little-endian 32-bit qh.
 * IQ4_NL's nibble is an index into 16 fixed values (`values`), spaced
 * closer near zero, where weights cluster. */
typedef struct sb__qfmt {
    uint8_t size;   /* bytes per block */
    uint8_t bits;   /* bits per quant: 4, 5 or 8 */
    uint8_t off_qh; /* byte offset of qh; 0 if the format has none */
    uint8_t off_qs; /* byte offset of qs */
    int8_t bias;    /* subtracted from a stored quant to get its signed value */
    bool has_min;   /* x = q*d + m, m the F16 after d (else x = q*d) */
    bool has_sum;   /* Q8_1: the F16 after d is s = d*sum(q) */
    const int8_t *values; /* IQ4_NL: a stored quant's signed value (bias 0); else NULL */
} sb__qfmt;

extern const sb__qfmt sb__qfmt_q4_0, sb__qfmt_q4_1, sb__qfmt_q5_0, sb__qfmt_q5_1, sb__qfmt_q8_0, sb__qfmt_q8_1,
    sb__qfmt_iq4_nl;
/* IQ4_NL's 16 values (ggml's kvalues_iq4nl), ascending. */
extern const int8_t sb__iq4nl_values[16];

/* Reads one block: q = the signed quants (stored value minus bias), d = the
 * scale, m = the F16 after d (min or sum, see has_min/has_sum; else 0). */
void sb__block_unpack(const sb__qfmt *f, const uint8_t *blk, int8_t q[SB_QK], float *d, float *m);

/* Float formats (types.c). */
void sb__f32_to_float(const void *src, float *dst, int64_t n);
void sb__f32_from_float(const float *src, void *dst, int64_t n);
void sb__f16_to_float(const void *src, float *dst, int64_t n);
void sb__f16_from_float(const float *src, void *dst, int64_t n);
void sb__bf16_to_float(const void *src, float *dst, int64_t n);
void sb__bf16_from_float(const float *src, void *dst, int64_t n);

/* Block formats (quants.c): dequantization, the reference quantizers, and
 * the x86-backend-style activation quantizers of Q8_0/Q8_1. */
void sb__q4_0_to_float(const void *src, float *dst, int64_t n);
void sb__q4_1_to_float(const void *src, float *dst, int64_t n);
void sb__q5_0_to_float(const void *src, float *dst, int64_t n);
void sb__q5_1_to_float(const void *src, float *dst, int64_t n);
void sb__q8_0_to_float(const void *src, float *dst, int64_t n);
void sb__q8_1_to_float(const void *src, float *dst, int64_t n);
void sb__iq4_nl_to_float(const void *src, float *dst, int64_t n);
void sb__q4_0_from_float_ref(const float *src, void *dst, int64_t n);
void sb__q4_1_from_float_ref(const float *src, void *dst, int64_t n);
void sb__q5_0_from_float_ref(const float *src, void *dst, int64_t n);
void sb__q5_1_from_float_ref(const float *src, void *dst, int64_t n);
void sb__q8_0_from_float_ref(const float *src, void *dst, int64_t n);
void sb__q8_1_from_float_ref(const float *src, void *dst, int64_t n);
void sb__iq4_nl_from_float_ref(const float *src, void *dst, int64_t n);
void sb__q8_0_from_float_act(const float *src, void *dst, int64_t n);
void sb__q8_1_from_float_act(const float *src, void *dst, int64_t n);

/* Dot products (dot.c), named weight type _ activation type. */
float sb__vec_dot_f32_f32_ref(int64_t n, const void *w, const void *x);
float sb__vec_dot_f16_f16_ref(int64_t n, const void *w, const void *x);
float sb__vec_dot_bf16_bf16_ref(int64_t n, const void *w, const void *x);
float sb__vec_dot_q4_0_q8_0_ref(int64_t n, const void *w, const void *x);
float sb__vec_dot_q4_1_q8_1_ref(int64_t n, const void *w, const void *x);
float sb__vec_dot_q5_0_q8_0_ref(int64_t n, const void *w, const void *x);
float sb__vec_dot_q5_1_q8_1_ref(int64_t n, const void *w, const void *x);
float sb__vec_dot_q8_0_q8_0_ref(int64_t n, const void *w, const void *x);
float sb__vec_dot_iq4_nl_q8_0_ref(int64_t n, const void *w, const void *x);

/* Activation functions (act.c). */
float sb__silu_ref(float x);
void sb__swiglu_ref(int64_t n, float *gate, const float *up);
void sb__softmax_ref(int64_t n, float *x);
/* softmax's last step: x[i] * (1 / sum), the sum in double in 8 lanes. */
void sb__softmax_normalize(int64_t n, float *x);

/* How many loaded models stream their weights from DRAM as the x86 levels'
 * single-token tiles decode them (cpu.c, sb_kernels_weights_loaded); read
 * relaxed, a hint. */
extern atomic_int sb__decode_from_dram;

/* ISA levels (x86/kernels-*.c): each overrides, in a table that starts as a
 * copy of the scalar level, the entries it has kernels for. Called once by
 * cpu.c, and only where the CPU runs that level. */
#if defined(__x86_64__)
void sb__kernels_fill_avx2(sb_kernels *k);
void sb__kernels_fill_avx512(sb_kernels *k);
/* the AMX level: over a copy of the AVX-512 table */
void sb__kernels_fill_amx(sb_kernels *k);
#endif

#endif
