/*
 * act.c - the reference (scalar) activation functions of the model's
 * element-wise steps, as llama.cpp's CPU backend computes them.
 *
 * SwiGLU's SiLU follows ggml's AVX-512 ggml_v_silu operation for operation
 * (what llama.cpp runs on these machines): x / (1 + e) with e its
 * ggml_v_expf(-x), an argument reduction by round(x / ln 2), a degree-5
 * polynomial and a scaling by 2^n, not the C library's expf. Attention's
 * softmax takes its exponentials from ggml_v_expf too, as ggml's soft_max
 * does for whole vectors. The SIMD levels (x86/kernels-x86.h) give the same
 * bytes; tests check that.
 */
#include <math.h>

#include "tensor/tensor-impl.h"

/* ggml_v_expf, one lane. The scaling is exact (ldexpf rounds once, as
 * vscalefps does); |n| > 192 saturates to 0 or infinity. */
static float expf_ggml(float x) {
    const float r = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, r);
    const float n = z - r;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                         u, fmaf(0x1.ffffecp-1f, b, 1.0f));
    if (isnan(n))
        return n;
    if (fabsf(n) > 192.0f)
        return n <= 0.0f ? 0.0f : INFINITY;
    return ldexpf(j, (int)n);
}

float sb__silu_ref(float x) { return x / (1.0f + expf_ggml(0.0f - x)); }

void sb__swiglu_ref(int64_t n, float *gate, const float *up) {
    for (int64_t i = 0; i < n; i++)
        gate[i] = sb__silu_ref(gate[i]) * up[i];
}

void sb__softmax_ref(int64_t n, float *x) {
    float max = x[0];
    for (int64_t i = 1; i < n; i++)
        max = x[i] > max ? x[i] : max;
    for (int64_t i = 0; i < n; i++)
        x[i] = expf_ggml(x[i] - max);
    sb__softmax_normalize(n, x);
}

/* The sum runs in 8 lanes of double (lane j adds x[j], x[j + 8], ...), then
 * the lanes pairwise: one chain of dependent additions per element took
 * ~4 cycles each, and attention normalizes every head of every token. */
void sb__softmax_normalize(int64_t n, float *x) {
    double lane[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            lane[j] += x[i + j];
    for (int j = 0; i < n; i++, j++)
        lane[j] += x[i];
    const double sum = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    const float inv = (float)(1.0 / sum);
    for (i = 0; i < n; i++)
        x[i] *= inv;
}
