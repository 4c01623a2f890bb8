/*
 * iquants.c - the non-linear 4-bit formats IQ4_NL and IQ4_XS, whose quants
 * index 16 fixed values, denser near zero where weights cluster.
 *
 * IQ4_NL is a 32-element block with an F16 scale (its dequantization and
 * dot products are quants.c's and dot.c's, through sb__qfmt's value
 * table). IQ4_XS is a 256-element block of 8 such sub-blocks whose scales
 * are 6-bit multiples of one F16 scale, run against Q8_K activations as the
 * K-quants are (kquants.h has its layout). Older llama.cpp quantizers wrote
 * IQ4_NL for the Q2_K/Q3_K matrices whose rows are not a multiple of 256;
 * IQ4_XS is a file type of its own.
 *
 * The quantizers are ggml's quantize_iq4_nl and quantize_iq4_xs without an
 * importance matrix, byte for byte: each 32 elements' scale is searched
 * among 16 candidates, by the weighted fit below, in ggml's float order.
 */
#include <math.h>
#include <string.h>

#include "base/base.h"
#include "tensor/kquants.h"
#include "tensor/tensor-impl.h"

const int8_t sb__iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* ---- the scale search ----------------------------------------------------- */

/* For each of 32 elements, the index of the value nearest id x (the upper
 * on a tie). ggml bisects to the two values around v and compares v - lo <
 * hi - v; that test is false for every pair below v and true for every
 * pair above, so the index is the count of pairs where it is false - the
 * same float comparisons, without the branches, which the compiler
 * vectorizes (the bisection's mispredicted branches made the IQ4 quantizers
 * 1.5x slower than llama.cpp's). */
static void nearest_values(const float *x, float id, uint8_t l[SB_QK]) {
    for (int e = 0; e < SB_QK; e++) {
        const float v = id * x[e];
        int n = 0;
        for (int k = 0; k < 15; k++)
            n += !(v - sb__iq4nl_values[k] < sb__iq4nl_values[k + 1] - v);
        l[e] = (uint8_t)n;
    }
}

/* The weighted sums that rate the inverse scale id for 32 elements:
 * sum(w q x) and sum(w q^2), q the nearest value of id x, w = x^2. */
static void fit(const float *x, float id, float *sumqx, float *sumq2) {
    uint8_t l[SB_QK];
    nearest_values(x, id, l);
    float qx = 0.0f, q2 = 0.0f;
    for (int e = 0; e < SB_QK; e++) {
        const float q = sb__iq4nl_values[l[e]], w = x[e] * x[e];
        qx += w * q * x[e];
        q2 += w * q * q;
    }
    *sumqx = qx;
    *sumq2 = q2;
}

/* 32 elements' scale: the one that maps the largest magnitude to the
 * first value (-127), refined by least squares, then 15 more starting
 * points around it, the best by sum(w q x)^2 / sum(w q^2). 0 for a group
 * below GROUP_MAX_EPS. */
static float group_scale(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int e = 0; e < SB_QK; e++)
        if (fabsf(x[e]) > amax) {
            amax = fabsf(x[e]);
            max = x[e];
        }
    if (amax < GROUP_MAX_EPS)
        return 0.0f;
    float sumqx, sumq2;
    fit(x, 1.0f / (-max / sb__iq4nl_values[0]), &sumqx, &sumq2);
    float d = sumqx / sumq2, best = d * sumqx;
    for (int itry = -7; itry <= 7; itry++) {
        fit(x, (float)(itry + sb__iq4nl_values[0]) / max, &sumqx, &sumq2);
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

/* 32 elements as the nearest values of id x, stored as IQ4_NL's 16 bytes:
 * element e < 16 in the low nibble of byte e, 16 + e in its high one. */
static void store_nibbles(const float *x, float id, uint8_t *qs) {
    uint8_t l[SB_QK];
    nearest_values(x, id, l);
    for (int j = 0; j < SB_QK / 2; j++)
        qs[j] = (uint8_t)(l[j] | l[j + SB_QK / 2] << 4);
}

/* ---- IQ4_NL ----------------------------------------------------------------- */

/* The quants are the nearest values at the searched scale, not at its F16. */
void sb__iq4_nl_from_float_ref(const float *src, void *dst, int64_t n) {
    sb_block_iq4_nl *blk = dst;
    for (int64_t b = 0; b < n / SB_QK; b++, src += SB_QK, blk++) {
        const float d = group_scale(src);
        blk->d = sb_fp32_to_fp16(d);
        store_nibbles(src, d != 0.0f ? 1.0f / d : 0.0f, blk->qs);
    }
}

/* ---- IQ4_XS ----------------------------------------------------------------- */

/* The block's d is the largest sub-block scale (by magnitude) over -32;
 * each sub-block's scale becomes the nearest multiple of d in -32..31, and
 * its quants the nearest values at that rounded scale (d unrounded). */
void sb__iq4_xs_from_float_ref(const float *src, void *dst, int64_t n) {
    sb_block_iq4_xs *blk = dst;
    for (int64_t b = 0; b < n / SB_QK_K; b++, src += SB_QK_K, blk++) {
        enum { NSUB = SB_QK_K / SB_QK };
        float scales[NSUB], max_scale = 0.0f, amax_scale = 0.0f;
        for (int j = 0; j < NSUB; j++) {
            scales[j] = group_scale(src + SB_QK * j);
            if (fabsf(scales[j]) > amax_scale) {
                amax_scale = fabsf(scales[j]);
                max_scale = scales[j];
            }
        }
        memset(blk, 0, sizeof(*blk));
        const float d = -max_scale / 32, id = d != 0.0f ? 1.0f / d : 0.0f;
        blk->d = sb_fp32_to_fp16(d);
        for (int j = 0; j < NSUB; j++) {
            const int l = SB_MAX(-32, SB_MIN(31, sb__nearest_int(id * scales[j])));
            const float dl = d * (float)l;
            store_nibbles(src + SB_QK * j, dl != 0.0f ? 1.0f / dl : 0.0f, blk->qs + SB_QK / 2 * j);
            blk->scales_l[j / 2] |= (uint8_t)(((l + 32) & 0xf) << 4 * (j % 2));
            blk->scales_h |= (uint16_t)((l + 32) >> 4 << 2 * j);
        }
    }
}

void sb__iq4_xs_to_float(const void *src, float *dst, int64_t n) {
    const sb_block_iq4_xs *blk = src;
    for (int64_t b = 0; b < n / SB_QK_K; b++, blk++) {
        const float d = sb_fp16_to_fp32(blk->d);
        for (int j = 0; j < SB_QK_K / SB_QK; j++, dst += SB_QK) {
            const float dl = d * (float)sb__iq4_xs_scale(blk, j);
            const uint8_t *qs = blk->qs + SB_QK / 2 * j;
            for (int e = 0; e < SB_QK / 2; e++) {
                dst[e] = dl * sb__iq4nl_values[qs[e] & 0xf];
                dst[e + SB_QK / 2] = dl * sb__iq4nl_values[qs[e] >> 4];
            }
        }
    }
}

float sb__vec_dot_iq4_xs_q8_K_ref(int64_t n, const void *w, const void *x) {
    const sb_block_iq4_xs *wb = w;
    const sb_block_q8_K *xb = x;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / SB_QK_K; b++, wb++, xb++) {
        int32_t isum = 0;
        for (int j = 0; j < SB_QK_K / SB_QK; j++) {
            const uint8_t *qs = wb->qs + SB_QK / 2 * j;
            const int8_t *q8 = xb->qs + SB_QK * j;
            int32_t s = 0;
            for (int e = 0; e < SB_QK / 2; e++)
                s += sb__iq4nl_values[qs[e] & 0xf] * q8[e] + sb__iq4nl_values[qs[e] >> 4] * q8[e + SB_QK / 2];
            isum += sb__iq4_xs_scale(wb, j) * s;
        }
        acc = fmaf((float)isum, sb_fp16_to_fp32(wb->d) * xb->d, acc);
    }
    return acc;
}
