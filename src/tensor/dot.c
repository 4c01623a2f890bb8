/*
 * dot.c - reference dot products of a weight row with an activation row
 * already converted to the weight type's vec_dot_type.
 *
 * Float formats follow the lane order of ggml's AVX-512 kernels (see
 * dot_float), block formats the whole-block order of its repacked x86
 * kernels (see dot_whole_blocks). They
 * are the scalar level of the kernel dispatch and the oracle that the SIMD
 * kernels are tested against (bit for bit), so they stay plain.
 */
#include <math.h>
#include <string.h>

#include "tensor/tensor-impl.h"

/* Float formats accumulate the way ggml's AVX-512 kernels (ggml_vec_dot_f32,
 * ggml_vec_dot_f16) do, a fixed lane structure that 8- and 16-wide SIMD can
 * both reproduce exactly:
 *   - 64 float lanes, seen as 4 accumulators of 16; for each full chunk of 64
 *     elements starting at i, lane k (0..63) gets
 *     acc[k] = fmaf(w[i+k], x[i+k], acc[k]) (for F16/BF16 the products are
 *     exact in float, so fma == mul+add there, but fmaf is kept for all);
 *   - after the chunks: accumulator 0 += accumulator 2, 1 += 3, 0 += 1
 *     (lane by lane), then the 16 lanes are halved: v[l] + v[l+8], then
 *     v[l] + v[l+4], v[l] + v[l+2], and finally v[0] + v[1];
 *   - the n % 64 leftover elements are added one at a time in double to
 *     that float, each as the double of the float product (ggml's leftover
 *     loop, sumf += (double)(w*x)), and the double is rounded to float.
 * One order for every ISA level makes batched and unbatched results equal
 * and lets the SIMD kernels be tested by memcmp against this one. */
typedef enum { FLT_F32, FLT_F16, FLT_BF16 } flt_fmt;

/* Element i of a row; rows need not be aligned. */
static inline float flt_get(flt_fmt f, const void *p, int64_t i) {
    float v;
    uint16_t h;
    if (f == FLT_F32) {
        memcpy(&v, (const char *)p + 4 * i, sizeof(v));
        return v;
    }
    memcpy(&h, (const char *)p + 2 * i, sizeof(h));
    return f == FLT_F16 ? sb_fp16_to_fp32(h) : sb_bf16_to_fp32(h);
}

static inline float dot_float(flt_fmt f, int64_t n, const void *w, const void *x) {
    float acc[64] = {0};
    const int64_t nc = n - n % 64;
    for (int64_t i = 0; i < nc; i += 64)
        for (int k = 0; k < 64; k++)
            acc[k] = fmaf(flt_get(f, w, i + k), flt_get(f, x, i + k), acc[k]);
    for (int l = 0; l < 16; l++) {
        acc[l] += acc[32 + l];
        acc[16 + l] += acc[48 + l];
        acc[l] += acc[16 + l];
    }
    for (int half = 8; half >= 1; half /= 2)
        for (int l = 0; l < half; l++)
            acc[l] += acc[l + half];
    double sum = acc[0];
    for (int64_t i = nc; i < n; i++)
        sum += (double)(flt_get(f, w, i) * flt_get(f, x, i));
    return (float)sum;
}

float sb__vec_dot_f32_f32_ref(int64_t n, const void *w, const void *x) { return dot_float(FLT_F32, n, w, x); }
float sb__vec_dot_f16_f16_ref(int64_t n, const void *w, const void *x) { return dot_float(FLT_F16, n, w, x); }
float sb__vec_dot_bf16_bf16_ref(int64_t n, const void *w, const void *x) { return dot_float(FLT_BF16, n, w, x); }

/* The block formats accumulate the way llama.cpp's x86 backend runs Q4_0
 * and Q8_0: it repacks such matrices on load (Q4_0 into 8-row groups for
 * its AVX2 gemv, Q8_0 into its AMX layout where the CPU has AMX) and sums
 * each block's products exactly into one integer, added with one
 * multiply-add per block, acc = fma(sum, d_w*d_x, acc), one accumulator per
 * (row, token) and no reduction at the end (Q4_0: bit for bit its AVX2
 * gemv; Q8_0: the same kind of order as its AMX kernel, whose exact float
 * order we do not reproduce). Formats with a minimum (Q4_1, Q5_1) add
 * m_w*s_x to a second sum per block, added to the first at the end. That
 * order lets SIMD kernels put one row in each lane (one conversion and one
 * fma per block serve 16 rows), which makes batched products far cheaper
 * than ggml's vec_dot order (eight integer lanes per block, each with its
 * own float fma, reduced pairwise at the end), which llama.cpp runs for
 * Q4_1, Q5_0 and Q5_1: its quantizer writes Q5_0 and Q5_1 for the Q4_K and
 * Q5_K matrices whose rows are not a multiple of 256 (Qwen2.5 0.5B's 896),
 * most of such a file, and the lane order ran them 2.9x slower at 8 tokens.
 * Matching one order, not only the math, matters: activations are
 * re-quantized after every layer, and a last-bit difference that moves a
 * value across a rounding boundary changes a model's later tokens. */
static float dot_whole_blocks(const sb__qfmt *wf, const sb__qfmt *xf, int64_t n, const void *w, const void *x) {
    const uint8_t *wb = w, *xb = x;
    int8_t wq[SB_QK], xq[SB_QK];
    float acc = 0.0f, mins = 0.0f, dw, mw, dx, sx;
    for (int64_t b = 0; b < n / SB_QK; b++, wb += wf->size, xb += xf->size) {
        sb__block_unpack(wf, wb, wq, &dw, &mw);
        sb__block_unpack(xf, xb, xq, &dx, &sx);
        int sumi = 0;
        for (int e = 0; e < SB_QK; e++)
            sumi += wq[e] * xq[e];
        acc = fmaf((float)sumi, dw * dx, acc);
        if (wf->has_min)
            mins += mw * sx;
    }
    return wf->has_min ? acc + mins : acc;
}

float sb__vec_dot_q4_0_q8_0_ref(int64_t n, const void *w, const void *x) {
    return dot_whole_blocks(&sb__qfmt_q4_0, &sb__qfmt_q8_0, n, w, x);
}

float sb__vec_dot_q4_1_q8_1_ref(int64_t n, const void *w, const void *x) {
    return dot_whole_blocks(&sb__qfmt_q4_1, &sb__qfmt_q8_1, n, w, x);
}

float sb__vec_dot_q5_0_q8_0_ref(int64_t n, const void *w, const void *x) {
    return dot_whole_blocks(&sb__qfmt_q5_0, &sb__qfmt_q8_0, n, w, x);
}

float sb__vec_dot_q5_1_q8_1_ref(int64_t n, const void *w, const void *x) {
    return dot_whole_blocks(&sb__qfmt_q5_1, &sb__qfmt_q8_1, n, w, x);
}

float sb__vec_dot_q8_0_q8_0_ref(int64_t n, const void *w, const void *x) {
    return dot_whole_blocks(&sb__qfmt_q8_0, &sb__qfmt_q8_0, n, w, x);
}

float sb__vec_dot_iq4_nl_q8_0_ref(int64_t n, const void *w, const void *x) {
    return dot_whole_blocks(&sb__qfmt_iq4_nl, &sb__qfmt_q8_0, n, w, x);
}
