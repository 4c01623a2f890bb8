/*
 * dot.c - reference dot products of a weight row with an activation row
 * already converted to the weight type's vec_dot_type.
 *
 * Float formats follow the lane order of ggml's AVX-512 kernels (see
 * dot_float), block formats that of its x86 kernels (see dot_blocks, and
 * the whole-block order of Q4_0, Q5_0 and Q8_0 below). They
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

/* The other block formats accumulate the way ggml's x86 vec_dot kernels do
 * (AVX2 and up, what llama.cpp runs on these machines for them): each block's products are summed exactly
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

/* Q4_0 and Q8_0 accumulate the way llama.cpp's x86 backend actually runs
 * them: it repacks such matrices on load (Q4_0 into 8-row groups for its
 * AVX2 gemv, Q8_0 into its AMX layout where the CPU has AMX) and sums each
 * block's products exactly into one integer, added with one multiply-add
 * per block, acc = fma(sum, d_w*d_x, acc), one accumulator per (row, token)
 * and no reduction at the end (Q4_0: bit for bit its AVX2 gemv; Q8_0: the
 * same kind of order as its AMX kernel, whose exact float order we do not
 * reproduce). That order also lets SIMD kernels put one row in each lane (one
 * conversion and one fma per block serve 16 rows), and lets an AMX tile sum
 * a block for 16 rows and 16 tokens at once, which makes batched products
 * far cheaper than the lane order above. Q5_0 takes it too, where llama.cpp
 * runs the lane order: llama.cpp's quantizer writes Q5_0 for the Q4_K
 * matrices whose rows are not a multiple of 256 (Qwen2.5 0.5B's 896), most
 * of such a Q4_K_M file, which the lane order ran 2.9x slower at 8 tokens. */
float sb__block_fma(const sb__qfmt *wf, const uint8_t *w, const uint8_t *x, float acc) {
    int8_t wq[SB_QK], xq[SB_QK];
    float dw, dx, unused;
    sb__block_unpack(wf, w, wq, &dw, &unused);
    sb__block_unpack(&sb__qfmt_q8_0, x, xq, &dx, &unused);
    int sumi = 0;
    for (int e = 0; e < SB_QK; e++)
        sumi += wq[e] * xq[e];
    return fmaf((float)sumi, dw * dx, acc);
}

static float dot_whole_blocks(const sb__qfmt *wf, int64_t n, const void *w, const void *x) {
    const uint8_t *wb = w, *xb = x;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / SB_QK; b++, wb += wf->size, xb += sb__qfmt_q8_0.size)
        acc = sb__block_fma(wf, wb, xb, acc);
    return acc;
}

float sb__vec_dot_q4_0_q8_0_ref(int64_t n, const void *w, const void *x) {
    return dot_whole_blocks(&sb__qfmt_q4_0, n, w, x);
}

float sb__vec_dot_q4_1_q8_1_ref(int64_t n, const void *w, const void *x) {
    return dot_blocks(&sb__qfmt_q4_1, &sb__qfmt_q8_1, n, w, x);
}

float sb__vec_dot_q5_0_q8_0_ref(int64_t n, const void *w, const void *x) {
    return dot_whole_blocks(&sb__qfmt_q5_0, n, w, x);
}

float sb__vec_dot_q5_1_q8_1_ref(int64_t n, const void *w, const void *x) {
    return dot_blocks(&sb__qfmt_q5_1, &sb__qfmt_q8_1, n, w, x);
}

float sb__vec_dot_q8_0_q8_0_ref(int64_t n, const void *w, const void *x) {
    return dot_whole_blocks(&sb__qfmt_q8_0, n, w, x);
}
