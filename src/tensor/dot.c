/*
 * dot.c - reference dot products of a weight row with an activation row
 * already converted to the weight type's vec_dot_type.
 *
 * These follow ggml's generic (scalar) kernels step for step, so that they
 * give the same float result: float formats multiply in float and sum in
 * double; block formats form an exact integer sum per block and add
 * sumi*d_w*d_x (+ m_w*s_x for the formats with a min) to a float. They are
 * the oracle that faster kernels are tested against, so they stay plain.
 */
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

/* How a block's integer sum is scaled. ggml's q4_0 kernel multiplies by the
 * two scales one after the other, (sumi*d_w)*d_x, which can round twice; the
 * others multiply by d_w*d_x (exact: both are F16). */
typedef enum { SCALE_IN_TURN, SCALE_BY_PRODUCT } scale_order;

static float dot_blocks(const sb__qfmt *wf, const sb__qfmt *xf, scale_order order, int64_t n, const void *w,
                        const void *x) {
    const uint8_t *wb = w, *xb = x;
    int8_t wq[SB_QK], xq[SB_QK];
    float dw, mw, dx, sx;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / SB_QK; b++, wb += wf->size, xb += xf->size) {
        sb__block_unpack(wf, wb, wq, &dw, &mw);
        sb__block_unpack(xf, xb, xq, &dx, &sx);
        int sumi = 0;
        for (int e = 0; e < SB_QK; e++)
            sumi += wq[e] * xq[e];
        if (wf->has_min)
            sum += (dw * dx) * (float)sumi + mw * sx;
        else if (order == SCALE_IN_TURN)
            sum += (float)sumi * dw * dx;
        else
            sum += (float)sumi * (dw * dx);
    }
    return sum;
}

float sb__vec_dot_q4_0_q8_0_ref(int64_t n, const void *w, const void *x) {
    return dot_blocks(&sb__qfmt_q4_0, &sb__qfmt_q8_0, SCALE_IN_TURN, n, w, x);
}

float sb__vec_dot_q4_1_q8_1_ref(int64_t n, const void *w, const void *x) {
    return dot_blocks(&sb__qfmt_q4_1, &sb__qfmt_q8_1, SCALE_BY_PRODUCT, n, w, x);
}

float sb__vec_dot_q5_0_q8_0_ref(int64_t n, const void *w, const void *x) {
    return dot_blocks(&sb__qfmt_q5_0, &sb__qfmt_q8_0, SCALE_BY_PRODUCT, n, w, x);
}

float sb__vec_dot_q5_1_q8_1_ref(int64_t n, const void *w, const void *x) {
    return dot_blocks(&sb__qfmt_q5_1, &sb__qfmt_q8_1, SCALE_BY_PRODUCT, n, w, x);
}

float sb__vec_dot_q8_0_q8_0_ref(int64_t n, const void *w, const void *x) {
    return dot_blocks(&sb__qfmt_q8_0, &sb__qfmt_q8_0, SCALE_BY_PRODUCT, n, w, x);
}
