/*
 * dot.c - reference dot products of a weight row with an activation row
 * already converted to the weight type's vec_dot_type.
 *
 * Float formats multiply in float and sum in double, as ggml's generic
 * kernels do; block formats follow the accumulation order of ggml's x86
 * kernels (see dot_blocks). They are the oracle that faster kernels are
 * tested against, so they stay plain.
 */
#include <math.h>

#include "tensor/tensor-impl.h"

float sb__vec_dot_f32_f32_ref(int64_t n, const void *w, const void *x) {
    const float *a = w, *b = x;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(a[i] * b[i]);
    return (float)sum;
}

float sb__vec_dot_f16_f16_ref(int64_t n, const void *w, const void *x) {
    const uint16_t *a = w, *b = x;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(sb_fp16_to_fp32(a[i]) * sb_fp16_to_fp32(b[i]));
    return (float)sum;
}

float sb__vec_dot_bf16_bf16_ref(int64_t n, const void *w, const void *x) {
    const uint16_t *a = w, *b = x;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(sb_bf16_to_fp32(a[i]) * sb_bf16_to_fp32(b[i]));
    return (float)sum;
}

/* Block formats accumulate the way ggml's x86 kernels do (AVX2 and up, what
 * llama.cpp runs on these machines): each block's products are summed exactly
 * in eight integer lanes of four consecutive elements, each lane is added to
 * its own float accumulator with one fused multiply-add by d_w*d_x, and the
 * eight accumulators are reduced pairwise at the end ((l0+l4)+(l2+l6)) +
 * ((l1+l5)+(l3+l7)). Formats with a minimum add m_w*s_x to a separate float
 * sum. Matching this order, not only the math, matters: activations are
 * re-quantized after every layer, and a last-bit difference that moves a
 * value across a rounding boundary changes a model's later tokens. */
static float dot_blocks(const sb__qfmt *wf, const sb__qfmt *xf, int64_t n, const void *w, const void *x) {
    const uint8_t *wb = w, *xb = x;
    int8_t wq[SB_QK], xq[SB_QK];
    float dw, mw, dx, sx;
    float lane[8] = {0}, mins = 0.0f;
    for (int64_t b = 0; b < n / SB_QK; b++, wb += wf->size, xb += xf->size) {
        sb__block_unpack(wf, wb, wq, &dw, &mw);
        sb__block_unpack(xf, xb, xq, &dx, &sx);
        const float d = dw * dx;
        for (int l = 0; l < 8; l++) {
            int sumi = 0;
            for (int e = 4 * l; e < 4 * l + 4; e++)
                sumi += wq[e] * xq[e];
            lane[l] = fmaf(d, (float)sumi, lane[l]);
        }
        if (wf->has_min)
            mins += mw * sx;
    }
    const float r0 = lane[4] + lane[0], r1 = lane[5] + lane[1], r2 = lane[6] + lane[2], r3 = lane[7] + lane[3];
    return ((r0 + r2) + (r1 + r3)) + mins;
}

float sb__vec_dot_q4_0_q8_0_ref(int64_t n, const void *w, const void *x) {
    return dot_blocks(&sb__qfmt_q4_0, &sb__qfmt_q8_0, n, w, x);
}

float sb__vec_dot_q4_1_q8_1_ref(int64_t n, const void *w, const void *x) {
    return dot_blocks(&sb__qfmt_q4_1, &sb__qfmt_q8_1, n, w, x);
}

float sb__vec_dot_q5_0_q8_0_ref(int64_t n, const void *w, const void *x) {
    return dot_blocks(&sb__qfmt_q5_0, &sb__qfmt_q8_0, n, w, x);
}

float sb__vec_dot_q5_1_q8_1_ref(int64_t n, const void *w, const void *x) {
    return dot_blocks(&sb__qfmt_q5_1, &sb__qfmt_q8_1, n, w, x);
}

float sb__vec_dot_q8_0_q8_0_ref(int64_t n, const void *w, const void *x) {
    return dot_blocks(&sb__qfmt_q8_0, &sb__qfmt_q8_0, n, w, x);
}
