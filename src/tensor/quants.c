/*
 * quants.c - the 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q8_1): reading blocks, dequantization, and quantization.
 *
 * All of it must agree with ggml to the bit: dequantization gives the floats
 * of ggml's dequantize_row_*, and the reference quantizers write the bytes of
 * ggml's quantize_row_*_ref (what llama.cpp's quantizer puts in files). The
 * one deliberate second flavour is the activation quantizer of Q8_0/Q8_1,
 * which rounds the way llama.cpp's x86 CPU backend does when it converts
 * activations for a matmul, so that our logits track llama.cpp's.
 *
 * The formats are described by data (sb__qfmt) and handled by one piece of
 * code each for unpacking and dequantizing (IQ4_NL's too; its quantizer,
 * a search, is iquants.c's).
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "base/base.h"
#include "tensor/tensor-impl.h"

const sb__qfmt sb__qfmt_q4_0 = {sizeof(sb_block_q4_0), 4, 0, offsetof(sb_block_q4_0, qs), 8, false, false, NULL};
const sb__qfmt sb__qfmt_q4_1 = {sizeof(sb_block_q4_1), 4, 0, offsetof(sb_block_q4_1, qs), 0, true, false, NULL};
const sb__qfmt sb__qfmt_q5_0 = {sizeof(sb_block_q5_0), 5, offsetof(sb_block_q5_0, qh), offsetof(sb_block_q5_0, qs),
                                16, false, false, NULL};
const sb__qfmt sb__qfmt_q5_1 = {sizeof(sb_block_q5_1), 5, offsetof(sb_block_q5_1, qh), offsetof(sb_block_q5_1, qs),
                                0, true, false, NULL};
const sb__qfmt sb__qfmt_q8_0 = {sizeof(sb_block_q8_0), 8, 0, offsetof(sb_block_q8_0, qs), 0, false, false, NULL};
const sb__qfmt sb__qfmt_q8_1 = {sizeof(sb_block_q8_1), 8, 0, offsetof(sb_block_q8_1, qs), 0, false, true, NULL};
const sb__qfmt sb__qfmt_iq4_nl = {sizeof(sb_block_iq4_nl), 4, 0, offsetof(sb_block_iq4_nl, qs), 0, false, false,
                                  sb__iq4nl_values};

/* ---- reading and writing block fields ---------------------------------- */


void sb__block_unpack(const sb__qfmt *f, const uint8_t *blk, int8_t q[SB_QK], float *d, float *m) {
    const uint8_t *qs = blk + f->off_qs;
    *d = sb__get_f16(blk);
    *m = f->has_min || f->has_sum ? sb__get_f16(blk + 2) : 0.0f;
    if (f->bits == 8) {
        memcpy(q, qs, SB_QK);
        return;
    }
    /* Quant e < 16 is the low nibble of byte e, quant 16 + e its high one;
     * one loop per half without a branch per element, so that it
     * vectorises (a token's embedding row is read through here). */
    const int half = SB_QK / 2;
    if (f->values) {
        for (int e = 0; e < half; e++) {
            q[e] = f->values[qs[e] & 0x0f];
            q[e + half] = f->values[qs[e] >> 4];
        }
        return;
    }
    for (int e = 0; e < half; e++) {
        q[e] = (int8_t)((qs[e] & 0x0f) - f->bias);
        q[e + half] = (int8_t)((qs[e] >> 4) - f->bias);
    }
    if (f->bits != 5)
        return;
    /* The fifth bits; qh is little-endian in the file, whatever the host. */
    const uint8_t *qhp = blk + f->off_qh;
    const uint32_t qh = (uint32_t)qhp[0] | (uint32_t)qhp[1] << 8 | (uint32_t)qhp[2] << 16 | (uint32_t)qhp[3] << 24;
    for (int e = 0; e < SB_QK; e++)
        q[e] = (int8_t)(q[e] + (int)((qh >> e) & 1) * 16);
}

/* Stores quants 0..2^bits-1 (4/5-bit formats): low nibbles in qs, fifth bits in qh. */
static void block_pack(const sb__qfmt *f, uint8_t *blk, const uint8_t q[SB_QK]) {
    uint32_t qh = 0;
    for (int j = 0; j < SB_QK / 2; j++)
        blk[f->off_qs + j] = (uint8_t)((q[j] & 0x0f) | (q[j + SB_QK / 2] & 0x0f) << 4);
    if (f->bits != 5)
        return;
    for (int e = 0; e < SB_QK; e++)
        qh |= (uint32_t)(q[e] >> 4 & 1) << e;
    for (int i = 0; i < 4; i++)
        blk[f->off_qh + i] = (uint8_t)(qh >> (8 * i));
}

/* ---- dequantization ----------------------------------------------------- */

/* As ggml's dequantize_row_*: x = q*d, or q*d + m, in float. */
static void dequantize(const sb__qfmt *f, const void *src, float *dst, int64_t n) {
    const uint8_t *blk = src;
    int8_t q[SB_QK];
    float d, m;
    for (int64_t b = 0; b < n / SB_QK; b++, blk += f->size, dst += SB_QK) {
        sb__block_unpack(f, blk, q, &d, &m);
        for (int e = 0; e < SB_QK; e++)
            dst[e] = f->has_min ? q[e] * d + m : q[e] * d;
    }
}

void sb__q4_0_to_float(const void *src, float *dst, int64_t n) { dequantize(&sb__qfmt_q4_0, src, dst, n); }
void sb__q4_1_to_float(const void *src, float *dst, int64_t n) { dequantize(&sb__qfmt_q4_1, src, dst, n); }
void sb__q5_0_to_float(const void *src, float *dst, int64_t n) { dequantize(&sb__qfmt_q5_0, src, dst, n); }
void sb__q5_1_to_float(const void *src, float *dst, int64_t n) { dequantize(&sb__qfmt_q5_1, src, dst, n); }
void sb__q8_0_to_float(const void *src, float *dst, int64_t n) { dequantize(&sb__qfmt_q8_0, src, dst, n); }
void sb__q8_1_to_float(const void *src, float *dst, int64_t n) { dequantize(&sb__qfmt_q8_1, src, dst, n); }
void sb__iq4_nl_to_float(const void *src, float *dst, int64_t n) { dequantize(&sb__qfmt_iq4_nl, src, dst, n); }

/* ---- 4- and 5-bit quantization (ggml's quantize_row_q{4,5}_{0,1}_ref) ---- */

/*
 * Symmetric formats (bias 2^(bits-1)): d = -max / 2^(bits-1), where max is
 * the first element of largest magnitude, so that element maps to quant 0
 * and the opposite extreme to 2^bits (clamped). Asymmetric formats: d spans
 * [min, max] in 2^bits - 1 steps. ggml rounds by adding 0.5 (folded into the
 * bias: 8.5, 16.5) and truncating, not with roundf; we do the same.
 */
static void quantize_small(const sb__qfmt *f, const float *src, void *dst, int64_t n) {
    const int top = (1 << f->bits) - 1;
    uint8_t *blk = dst;
    uint8_t q[SB_QK];
    for (int64_t b = 0; b < n / SB_QK; b++, blk += f->size, src += SB_QK) {
        float d, offset, min = 0.0f;
        if (f->has_min) {
            float max = -FLT_MAX;
            min = FLT_MAX;
            for (int e = 0; e < SB_QK; e++) {
                if (src[e] < min)
                    min = src[e];
                if (src[e] > max)
                    max = src[e];
            }
            d = (max - min) / (float)top;
            offset = 0.5f;
            sb__put_f16(blk + 2, min);
        } else {
            float amax = 0.0f, max = 0.0f;
            for (int e = 0; e < SB_QK; e++) {
                if (amax < fabsf(src[e])) {
                    amax = fabsf(src[e]);
                    max = src[e];
                }
            }
            d = max / (float)-f->bias;
            offset = (float)f->bias + 0.5f;
        }
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        sb__put_f16(blk, d);
        for (int e = 0; e < SB_QK; e++)
            q[e] = (uint8_t)SB_MIN(top, (int)((src[e] - min) * id + offset));
        block_pack(f, blk, q);
    }
}

void sb__q4_0_from_float_ref(const float *src, void *dst, int64_t n) { quantize_small(&sb__qfmt_q4_0, src, dst, n); }
void sb__q4_1_from_float_ref(const float *src, void *dst, int64_t n) { quantize_small(&sb__qfmt_q4_1, src, dst, n); }
void sb__q5_0_from_float_ref(const float *src, void *dst, int64_t n) { quantize_small(&sb__qfmt_q5_0, src, dst, n); }
void sb__q5_1_from_float_ref(const float *src, void *dst, int64_t n) { quantize_small(&sb__qfmt_q5_1, src, dst, n); }

/* ---- 8-bit quantization ------------------------------------------------- */

/*
 * The two ways ggml rounds Q8 blocks. Both take d = amax/127, stored as F16.
 *   Q8_REF: quantize_row_q8_{0,1}_ref, which writes model files:
 *           q = roundf(x * (1/d)), ties away from zero.
 *   Q8_ACT: the x86 CPU backend (AVX/AVX2/AVX-512 quantize_row_q8_{0,1}),
 *           which converts activations at every matmul:
 *           q = nearest-even(x * (127/amax)). The scale can differ from
 *           1/d in the last bit and the ties go the other way, so the
 *           quants do differ now and then.
 * In both, Q8_1's s is the F16 of d * sum(q).
 */
typedef enum { Q8_REF, Q8_ACT } q8_rounding;

/* A quant of each rounding from v = x / d. Beyond (-129, 128), or NaN, the
 * rounded value leaves int8's range and C leaves its conversion undefined:
 * 0. Q8_REF's roundf without a call into libm, so that the block's loop
 * vectorises (with -fno-trapping-math): the conversion truncates, and v
 * minus its truncation is exact in float, so comparing it with 0.5 is the
 * rule for ties away from zero. With block_amax, quantizing to Q8_0 takes
 * 0.18 CPU s where the scalar loops and roundf took 0.62 (110M F16). */
static inline int8_t q8_quant(q8_rounding mode, float v) {
    if (mode == Q8_ACT) {
        const float r = nearbyintf(v);
        return (int8_t)(r >= -128.0f && r <= 127.0f ? r : 0.0f);
    }
    const float in = v > -129.0f && v < 128.0f ? v : 0.0f;
    const int t = (int)in;
    const float frac = in - (float)t;
    const int r = t + (frac >= 0.5f) - (frac <= -0.5f);
    return (int8_t)(r >= -128 && r <= 127 ? r : 0);
}

/* The largest |x| of a block as ggml's loop of MAX(amax, fabsf(x)) finds
 * it. Non-negative floats order as their bit patterns, so without a NaN it
 * is their integer maximum, which vectorises where that loop is a chain of
 * dependent compares; with a NaN (bits above infinity's), ggml's loop,
 * whose answer depends on where the NaN is. */
static float block_amax(const float *x) {
    uint32_t top = 0;
    for (int e = 0; e < SB_QK; e++) {
        uint32_t bits;
        memcpy(&bits, &x[e], sizeof(bits));
        bits &= 0x7fffffffu;
        top = top > bits ? top : bits;
    }
    float amax = 0.0f;
    if (top <= 0x7f800000u) {
        memcpy(&amax, &top, sizeof(amax));
        return amax;
    }
    for (int e = 0; e < SB_QK; e++)
        amax = SB_MAX(amax, fabsf(x[e]));
    return amax;
}

static void quantize_q8(const sb__qfmt *f, q8_rounding mode, const float *src, void *dst, int64_t n) {
    uint8_t *blk = dst;
    for (int64_t b = 0; b < n / SB_QK; b++, blk += f->size, src += SB_QK) {
        const float amax = block_amax(src);
        const float d = amax / 127.0f;
        float id;
        if (mode == Q8_REF)
            id = d != 0.0f ? 1.0f / d : 0.0f;
        else
            id = amax != 0.0f ? 127.0f / amax : 0.0f;
        /* A block below ~4e-37 overflows the inverse scale (and its d is 0
         * in F16 anyway); a non-finite input has no quant. C leaves the
         * conversion of such values to int undefined, so spell it out: 0. */
        if (!isfinite(id))
            id = 0.0f;
        /* into a local array first: stores through int8_t may alias src */
        int8_t qs[SB_QK];
        int sum = 0;
        for (int e = 0; e < SB_QK; e++)
            qs[e] = q8_quant(mode, src[e] * id);
        for (int e = 0; e < SB_QK; e++)
            sum += qs[e];
        memcpy(blk + f->off_qs, qs, SB_QK);
        sb__put_f16(blk, d);
        if (f->has_sum)
            sb__put_f16(blk + 2, (float)sum * d);
    }
}

void sb__q8_0_from_float_ref(const float *src, void *dst, int64_t n) {
    quantize_q8(&sb__qfmt_q8_0, Q8_REF, src, dst, n);
}
void sb__q8_1_from_float_ref(const float *src, void *dst, int64_t n) {
    quantize_q8(&sb__qfmt_q8_1, Q8_REF, src, dst, n);
}
void sb__q8_0_from_float_act(const float *src, void *dst, int64_t n) {
    quantize_q8(&sb__qfmt_q8_0, Q8_ACT, src, dst, n);
}
void sb__q8_1_from_float_act(const float *src, void *dst, int64_t n) {
    quantize_q8(&sb__qfmt_q8_1, Q8_ACT, src, dst, n);
}
