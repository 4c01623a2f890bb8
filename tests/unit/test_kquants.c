/*
 * test_kquants.c - the K-quant formats (Q2_K..Q6_K, Q8_K): block sizes and
 * type table entries, dequantization of hand-built blocks, quantization
 * error bounds, and dot products against a double-precision oracle.
 * Bit-exactness against llama.cpp itself is test_ggml_oracle.c's job.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tensor/kquants.h"
#include "tensor/tensor.h"
#include "testutil.h"

static const sb_type kquant_types[] = {SB_TYPE_Q2_K, SB_TYPE_Q3_K, SB_TYPE_Q4_K, SB_TYPE_Q5_K, SB_TYPE_Q6_K};
#define N_KTYPES (sizeof(kquant_types) / sizeof(kquant_types[0]))

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_u64(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

/* Uniform in [-1, 1). */
static float rng_float(void) { return (float)((double)(rng_u64() >> 11) * 0x1p-52 - 1.0); }

static const sb_type_traits *traits(sb_type type) {
    const sb_type_traits *t = sb_type_traits_of(type);
    assert_non_null(t);
    return t;
}

/* F16 bit patterns used below. */
enum { H_0_25 = 0x3400, H_0_5 = 0x3800, H_1 = 0x3c00, H_2 = 0x4000 };

/* ---- type table ---------------------------------------------------------- */

static void test_block_sizes(void **state) {
    (void)state;
    static const struct {
        sb_type type;
        size_t size;
    } want[] = {{SB_TYPE_Q2_K, 84},  {SB_TYPE_Q3_K, 110}, {SB_TYPE_Q4_K, 144},
                {SB_TYPE_Q5_K, 176}, {SB_TYPE_Q6_K, 210}, {SB_TYPE_Q8_K, 292}};
    assert_int_equal(sizeof(sb_block_q2_K), 84);
    assert_int_equal(sizeof(sb_block_q3_K), 110);
    assert_int_equal(sizeof(sb_block_q4_K), 144);
    assert_int_equal(sizeof(sb_block_q5_K), 176);
    assert_int_equal(sizeof(sb_block_q6_K), 210);
    assert_int_equal(sizeof(sb_block_q8_K), 292);
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const sb_type_traits *t = traits(want[i].type);
        assert_int_equal(t->blck_size, 256);
        assert_int_equal(t->type_size, want[i].size);
        assert_non_null(t->to_float);
        assert_non_null(t->from_float);
        assert_int_equal(sb_type_row_size(want[i].type, 4096), 16 * want[i].size);
        assert_int_equal(sb_type_row_size(want[i].type, 4096 + 32), 0);
    }
    for (size_t i = 0; i < N_KTYPES; i++) {
        const sb_type_traits *t = traits(kquant_types[i]);
        assert_true(sb_type_can_matmul(kquant_types[i]));
        assert_int_equal(t->vec_dot_type, SB_TYPE_Q8_K);
        assert_non_null(t->vec_dot);
    }
    /* Q8_K is an activation type, not a weight type. */
    assert_false(sb_type_can_matmul(SB_TYPE_Q8_K));
    assert_non_null(traits(SB_TYPE_Q8_K)->act_from_float);
}

/* ---- hand-built blocks -------------------------------------------------- */

static void dequant_block(sb_type type, const void *blk, float out[SB_QK_K]) {
    traits(type)->to_float(blk, out, SB_QK_K);
}

/* Q2_K: x = d*sc*q - dmin*m; sub-block j = elements 16j..16j+15; element e
 * at bits 2*((e%128)/32) of qs[32*(e/128) + e%32]. */
static void test_q2_K_known_block(void **state) {
    (void)state;
    sb_block_q2_K b;
    float x[SB_QK_K];
    memset(&b, 0, sizeof(b));
    b.d = H_0_5;
    b.dmin = H_0_25;
    b.scales[0] = 0x31; /* sc 1, m 3 */
    b.scales[5] = 0x0f; /* sc 15, m 0 */
    b.qs[0] = 0x03;     /* element 0 = 3 */
    b.qs[16] = 0x20;    /* element 80 (chunk 0, shift 4, byte 16) = 2 */
    dequant_block(SB_TYPE_Q2_K, &b, x);
    assert_true(x[0] == 0.5f * 1 * 3 - 0.25f * 3);
    assert_true(x[1] == -0.75f); /* q 0, same sub-block's min */
    assert_true(x[80] == 0.5f * 15 * 2);
    assert_true(x[81] == 0.0f);
    assert_true(x[16] == 0.0f); /* sub-block 1: scale and min 0 */
}

/* Q3_K: x = d*(s-32)*(q - 4*(hbit==0)); the 6-bit s of sub-block j: low
 * nibble of byte j (j<8) or high nibble of byte j-8, top 2 bits at byte
 * 8+j%4, bits 2*(j/4). hmask bit e/32 of byte e%32 is element e's third bit. */
static void test_q3_K_known_block(void **state) {
    (void)state;
    sb_block_q3_K b;
    float x[SB_QK_K];
    memset(&b, 0, sizeof(b));
    b.d = H_1;
    b.scales[0] = 0x08;    /* sub-block 0: low nibble 8 ... */
    b.scales[8] = 0x02;    /* ... top bits 2: s = 40, scale 8 */
    b.scales[1] = 0x50;    /* sub-block 9: low nibble 5, top bits 0: scale -27; sub-block 1: s 0, scale -32 */
    b.qs[0] = 0x02;        /* element 0: low bits 2 */
    b.hmask[0] = 0x01;     /*   high bit set: q = 2 */
    b.qs[1] = 0x01;        /* element 1: low bits 1, high bit clear: q = 1 - 4 */
    b.qs[48] = 0x03;       /* element 144 (chunk 1, shift 0, byte 32+16) */
    b.hmask[16] = 0x10;    /*   high bit (bit 4 = element/32): q = 3 */
    dequant_block(SB_TYPE_Q3_K, &b, x);
    assert_true(x[0] == 8.0f * 2);
    assert_true(x[1] == 8.0f * -3);
    assert_true(x[2] == 8.0f * -4);
    assert_true(x[16] == -32.0f * -4);
    assert_true(x[144] == -27.0f * 3);
}

/* Q4_K: x = d*sc*q - dmin*m per 32 elements; element e in qs[32*(e/64) + e%32],
 * low nibble for (e%64) < 32. Sub-blocks 4..7 keep their top 2 bits in bytes 0..7. */
static void test_q4_K_known_block(void **state) {
    (void)state;
    sb_block_q4_K b;
    float x[SB_QK_K];
    memset(&b, 0, sizeof(b));
    b.d = H_1;
    b.dmin = H_2;
    b.scales[0] = 1;                                  /* sub-block 0: sc 1, m 0 */
    b.scales[1] = 2 | (37 >> 4) << 6;                 /* sub-block 1: sc 2; sub-block 5's sc top bits */
    b.scales[5] = 1 | (19 >> 4) << 6;                 /* sub-block 1: m 1; sub-block 5's m top bits */
    b.scales[9] = (37 & 0xf) | (19 & 0xf) << 4;       /* sub-block 5: sc 37, m 19 */
    b.qs[0] = 0x73;                                   /* element 0 = 3, element 32 = 7 */
    b.qs[64] = 0xa0;                                  /* element 128 = 0, element 160 = 10 */
    dequant_block(SB_TYPE_Q4_K, &b, x);
    assert_true(x[0] == 3.0f);
    assert_true(x[32] == 2.0f * 7 - 2.0f * 1);
    assert_true(x[128] == 0.0f);
    assert_true(x[160] == 37.0f * 10 - 2.0f * 19);
}

/* Q5_K: Q4_K plus a fifth bit, bit e/32 of qh[e%32]. */
static void test_q5_K_known_block(void **state) {
    (void)state;
    sb_block_q5_K b;
    float x[SB_QK_K];
    memset(&b, 0, sizeof(b));
    b.d = H_1;
    b.dmin = H_1;
    b.scales[0] = 1; /* sub-block 0: sc 1 */
    b.scales[4] = 1; /* sub-block 0: m 1 */
    b.scales[3] = 3; /* sub-block 3: sc 3, m 0 */
    b.qs[0] = 0x05;
    b.qh[0] = 0x01; /* element 0 = 16 + 5 */
    b.qs[1] = 0x0f; /* element 1 = 15 */
    b.qs[32 + 7] = 0x20;
    b.qh[7] = 0x08; /* element 96+7 (sub-block 3, high nibble of byte 32+7): 16 + 2 */
    dequant_block(SB_TYPE_Q5_K, &b, x);
    assert_true(x[0] == 21.0f - 1);
    assert_true(x[1] == 15.0f - 1);
    assert_true(x[2] == -1.0f);
    assert_true(x[103] == 3.0f * 18);
}

/* Q6_K: x = d*sc*(q - 32), sc int8 per 16 elements; per 128 elements, the
 * low nibbles of ql[0..31] are elements 0..31, of ql[32..63] 32..63, the
 * high nibbles 64..95 and 96..127; qh[l] holds the top 2 bits of elements
 * l, l+32, l+64, l+96 at bits 0, 2, 4, 6. */
static void test_q6_K_known_block(void **state) {
    (void)state;
    sb_block_q6_K b;
    float x[SB_QK_K];
    memset(&b, 0, sizeof(b));
    b.d = H_0_5;
    b.scales[0] = -3;
    b.scales[2] = 5;
    b.scales[4] = 7;
    b.scales[6] = 2;
    b.scales[13] = 127;
    b.ql[0] = 0x21;
    b.ql[32] = 0x0f;
    b.qh[0] = 0xe7;   /* 11 10 01 11: top bits of elements 96, 64, 32, 0 */
    b.ql[64 + 16] = 0xf0;
    b.qh[32 + 16] = 0x30; /* element 128+64+16 = 208: 15 | 3<<4 = 63 */
    dequant_block(SB_TYPE_Q6_K, &b, x);
    assert_true(x[0] == 0.5f * -3 * (49 - 32));
    assert_true(x[32] == 0.5f * 5 * (31 - 32));
    assert_true(x[64] == 0.5f * 7 * (34 - 32));
    assert_true(x[96] == 0.5f * 2 * (48 - 32));
    assert_true(x[208] == 0.5f * 127 * (63 - 32));
    assert_true(x[1] == 0.5f * -3 * -32);
}

/* Q8_K: d = max/-127 for the first element of largest magnitude (so that
 * element becomes -127, whatever its sign); bsums are sums of 16 quants. */
static void test_q8_K_known_block(void **state) {
    (void)state;
    float x[SB_QK_K] = {0}, y[SB_QK_K];
    sb_block_q8_K b;
    x[0] = 2.0f;
    x[1] = -2.0f; /* same magnitude, later: not the max */
    x[20] = 1.0f;
    traits(SB_TYPE_Q8_K)->from_float(x, &b, SB_QK_K);
    assert_true(b.d == 1 / (-127.0f / 2.0f));
    assert_int_equal(b.qs[0], -127);
    assert_int_equal(b.qs[1], 127);
    assert_int_equal(b.qs[20], -64); /* -63.5 rounds to even */
    assert_int_equal(b.bsums[0], 0);
    assert_int_equal(b.bsums[1], -64);
    dequant_block(SB_TYPE_Q8_K, &b, y);
    assert_true(y[0] == b.d * -127);
    /* An all-zero block is all zero, bsums included. */
    memset(x, 0, sizeof(x));
    memset(&b, 0xa5, sizeof(b));
    traits(SB_TYPE_Q8_K)->from_float(x, &b, SB_QK_K);
    const sb_block_q8_K zero = {0};
    assert_memory_equal(&b, &zero, sizeof(b));
}

/* All-zero input quantizes to all-zero bytes, which dequantize to zeros. */
static void test_zero_input(void **state) {
    (void)state;
    float x[SB_QK_K] = {0}, y[SB_QK_K];
    uint8_t blk[320], zero[320] = {0};
    for (size_t i = 0; i < N_KTYPES; i++) {
        const sb_type_traits *t = traits(kquant_types[i]);
        memset(blk, 0xa5, sizeof(blk));
        t->from_float(x, blk, SB_QK_K);
        assert_memory_equal(blk, zero, t->type_size);
        t->to_float(blk, y, SB_QK_K);
        for (int e = 0; e < SB_QK_K; e++)
            assert_true(y[e] == 0.0f);
    }
}

/* ---- quantization error ------------------------------------------------- */

/* RMS error of quantize -> dequantize on uniform [-1,1) data (RMS 0.577),
 * and max error; bounds are about 1.1x what ggml's quantizers achieve
 * (measured: rms 0.134, 0.073, 0.032, 0.016, 0.0076), and the error must
 * fall with every added bit. */
static void test_roundtrip_error(void **state) {
    (void)state;
    enum { N = 64 * SB_QK_K };
    static const double max_rms[] = {0.148, 0.080, 0.035, 0.0176, 0.0084};
    static const double max_abs[] = {0.44, 0.27, 0.103, 0.052, 0.019};
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    uint8_t *q = malloc(sb_type_row_size(SB_TYPE_Q8_K, N));
    double prev = 1.0;
    for (int i = 0; i < N; i++)
        x[i] = rng_float();
    for (size_t k = 0; k < N_KTYPES; k++) {
        const sb_type_traits *t = traits(kquant_types[k]);
        t->from_float(x, q, N);
        t->to_float(q, y, N);
        double se = 0, worst = 0;
        for (int i = 0; i < N; i++) {
            const double d = fabs((double)y[i] - x[i]);
            se += d * d;
            worst = d > worst ? d : worst;
        }
        const double rms = sqrt(se / N);
        print_message("%s: rms %.5f, max %.5f\n", t->name, rms, worst);
        assert_true(rms < max_rms[k]);
        assert_true(worst < max_abs[k]);
        assert_true(rms < prev);
        prev = rms;
    }
    /* Q8_K: error at most half a step, d = amax/127 per block. */
    traits(SB_TYPE_Q8_K)->from_float(x, q, N);
    traits(SB_TYPE_Q8_K)->to_float(q, y, N);
    for (int i = 0; i < N; i++)
        assert_true(fabsf(y[i] - x[i]) <= 0.5f / 127 * 1.0001f);
    free(x);
    free(y);
    free(q);
}

/* Sub-blocks of magnitudes 100x apart within one block, centred and shifted
 * (all positive): the large sub-blocks keep their precision; the small ones
 * are limited by how their scales quantize against the large ones' (a
 * small sub-block's scale or min can round to 0), so their error is bounded
 * only by their own magnitude. Bounds ~1.1x measured, in units of the
 * sub-block's magnitude. */
static void test_roundtrip_mixed_scales(void **state) {
    (void)state;
    static const float tol_small[] = {3.0f, 2.75f, 0.86f, 0.86f, 0.59f};
    static const float tol_big[] = {0.5f, 0.34f, 0.092f, 0.065f, 0.043f};
    float x[4 * SB_QK_K], y[4 * SB_QK_K];
    uint8_t q[4 * 292];
    for (int i = 0; i < 4 * SB_QK_K; i++) {
        const float mag = (i / 32) % 2 ? 1.0f : 0.01f;
        x[i] = i >= 2 * SB_QK_K ? mag * (1.5f + rng_float()) : mag * rng_float();
    }
    for (size_t k = 0; k < N_KTYPES; k++) {
        const sb_type_traits *t = traits(kquant_types[k]);
        t->from_float(x, q, 4 * SB_QK_K);
        t->to_float(q, y, 4 * SB_QK_K);
        for (int i = 0; i < 4 * SB_QK_K; i++) {
            const bool big = (i / 32) % 2;
            const float tol = big ? tol_big[k] : 0.01f * tol_small[k];
            if (fabsf(y[i] - x[i]) > tol)
                fail_msg("%s element %d: %g -> %g", t->name, i, (double)x[i], (double)y[i]);
        }
    }
}

/* ---- dot products -------------------------------------------------------- */

/* vec_dot == the double-precision dot of the dequantized rows, within float
 * rounding of the terms' magnitudes. */
static void test_vec_dot_vs_double(void **state) {
    (void)state;
    enum { N = 16 * SB_QK_K };
    float *w = malloc(N * sizeof(float)), *x = malloc(N * sizeof(float));
    float *wd = malloc(N * sizeof(float)), *xd = malloc(N * sizeof(float));
    uint8_t *wq = malloc(sb_type_row_size(SB_TYPE_Q8_K, N)), *xq = malloc(sb_type_row_size(SB_TYPE_Q8_K, N));
    for (int trial = 0; trial < 8; trial++) {
        for (int i = 0; i < N; i++) {
            w[i] = rng_float() + (trial % 2 ? 0.5f : 0.0f); /* odd trials: mins matter */
            x[i] = rng_float() * (trial % 3 == 0 ? 100.0f : 1.0f);
        }
        const sb_type_traits *xt = traits(SB_TYPE_Q8_K);
        xt->act_from_float(x, xq, N);
        xt->to_float(xq, xd, N);
        for (size_t k = 0; k < N_KTYPES; k++) {
            const sb_type_traits *t = traits(kquant_types[k]);
            t->from_float(w, wq, N);
            t->to_float(wq, wd, N);
            for (int64_t n = SB_QK_K; n <= N; n *= 4) {
                double want = 0, mag = 0;
                for (int64_t i = 0; i < n; i++) {
                    want += (double)wd[i] * xd[i];
                    mag += fabs((double)wd[i] * xd[i]);
                }
                const float got = t->vec_dot(n, wq, xq);
                if (fabs(got - want) > 1e-5 * mag + 1e-30)
                    fail_msg("%s n=%lld: got %.9g, want %.9g (magnitude %g)", t->name, (long long)n, (double)got,
                             want, mag);
            }
        }
    }
    free(w);
    free(x);
    free(wd);
    free(xd);
    free(wq);
    free(xq);
}

/* The weights' and activations' roles: the Q8_K row of constant 1s picks
 * out the sum of the dequantized weights (q = -127, d = -1/127). */
static void test_vec_dot_sum(void **state) {
    (void)state;
    float w[SB_QK_K], ones[SB_QK_K], wd[SB_QK_K];
    uint8_t wq[210];
    sb_block_q8_K xq;
    for (int i = 0; i < SB_QK_K; i++) {
        w[i] = rng_float();
        ones[i] = 1.0f;
    }
    traits(SB_TYPE_Q8_K)->act_from_float(ones, &xq, SB_QK_K);
    for (size_t k = 0; k < N_KTYPES; k++) {
        const sb_type_traits *t = traits(kquant_types[k]);
        t->from_float(w, wq, SB_QK_K);
        t->to_float(wq, wd, SB_QK_K);
        double sum = 0, mag = 0;
        for (int i = 0; i < SB_QK_K; i++) {
            sum += wd[i] * (double)(xq.d * -127.0f);
            mag += fabs(wd[i]);
        }
        assert_true(fabs(t->vec_dot(SB_QK_K, wq, &xq) - sum) <= 1e-5 * mag);
    }
}

/* Each block of a row is independent: quantizing a row equals quantizing
 * its blocks one at a time, and dequantizing likewise. */
static void test_rows_are_blockwise(void **state) {
    (void)state;
    enum { N = 3 * SB_QK_K };
    float x[N], y[N], yb[N];
    uint8_t row[3 * 292], blk[3 * 292];
    for (int i = 0; i < N; i++)
        x[i] = rng_float() * (float)(1 + i / SB_QK_K);
    for (size_t k = 0; k < N_KTYPES + 1; k++) {
        const sb_type type = k < N_KTYPES ? kquant_types[k] : SB_TYPE_Q8_K;
        const sb_type_traits *t = traits(type);
        t->from_float(x, row, N);
        for (int b = 0; b < 3; b++)
            t->from_float(x + b * SB_QK_K, blk + b * t->type_size, SB_QK_K);
        assert_memory_equal(row, blk, 3 * t->type_size);
        t->to_float(row, y, N);
        for (int b = 0; b < 3; b++)
            t->to_float(blk + b * t->type_size, yb + b * SB_QK_K, SB_QK_K);
        assert_memory_equal(y, yb, sizeof(y));
    }
}

/* ---- SIMD kernels --------------------------------------------------------- */

/* The AVX2 dot products and gemm entries give the reference's bits, on
 * quantized rows, on random weight bytes (scales of every value), and on
 * activations with extreme quants. */
static void test_avx2_matches_reference(void **state) {
    (void)state;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        SB_TEST_SKIP("this CPU has no AVX2+FMA");
    enum { N = 16 * SB_QK_K, NT = 3 };
    static const struct {
        sb_type type;
        float (*avx2)(int64_t, const void *, const void *);
    } kernels[] = {{SB_TYPE_Q2_K, sb__vec_dot_q2_K_q8_K_avx2},
                   {SB_TYPE_Q3_K, sb__vec_dot_q3_K_q8_K_avx2},
                   {SB_TYPE_Q4_K, sb__vec_dot_q4_K_q8_K_avx2},
                   {SB_TYPE_Q5_K, sb__vec_dot_q5_K_q8_K_avx2},
                   {SB_TYPE_Q6_K, sb__vec_dot_q6_K_q8_K_avx2}};
    float *w = malloc(N * sizeof(float)), *x = malloc(NT * N * sizeof(float));
    uint8_t *wq = malloc(sb_type_row_size(SB_TYPE_Q8_K, N)), *xq = malloc(NT * sb_type_row_size(SB_TYPE_Q8_K, N));
    const size_t xs = sb_type_row_size(SB_TYPE_Q8_K, N);
    sb_kernels k;
    memset(&k, 0, sizeof(k));
    sb__kquants_fill_avx2(&k);
    for (size_t i = 0; i < sizeof(kernels) / sizeof(kernels[0]); i++) {
        const sb_type_traits *t = traits(kernels[i].type);
        const size_t ws = t->type_size * (N / SB_QK_K);
        assert_non_null(k.gemm[kernels[i].type]);
        for (int trial = 0; trial < 12; trial++) {
            for (int j = 0; j < N; j++)
                w[j] = rng_float() * (trial % 2 ? 1.0f : 1e-3f) + (trial % 3 == 1 ? 0.7f : 0.0f);
            for (int j = 0; j < NT * N; j++)
                x[j] = rng_float() * (float)(1 + j % 7);
            if (trial >= 8) { /* random bytes, with finite F16 scales */
                for (size_t j = 0; j < ws; j++)
                    wq[j] = (uint8_t)rng_u64();
                for (int b = 0; b < N / SB_QK_K; b++) {
                    uint8_t *blk = wq + (size_t)b * t->type_size;
                    /* d (and dmin): the top exponent bit cleared, finite */
                    switch (kernels[i].type) {
                    case SB_TYPE_Q2_K: blk[81] &= 0xbf, blk[83] &= 0xbf; break;
                    case SB_TYPE_Q3_K: blk[109] &= 0xbf; break;
                    case SB_TYPE_Q6_K: blk[209] &= 0xbf; break;
                    default: blk[1] &= 0xbf, blk[3] &= 0xbf;
                    }
                }
            } else {
                t->from_float(w, wq, N);
            }
            for (int tok = 0; tok < NT; tok++)
                traits(SB_TYPE_Q8_K)->act_from_float(x + tok * N, xq + tok * xs, N);
            if (trial == 11) /* quants at -128: outside what act_from_float writes */
                for (int tok = 0; tok < NT; tok++) {
                    sb_block_q8_K *blk = (sb_block_q8_K *)(xq + tok * xs);
                    memset(blk->qs, 0x80, sizeof(blk->qs));
                    for (int g = 0; g < 16; g++)
                        blk->bsums[g] = -128 * 16;
                }
            for (int64_t n = SB_QK_K; n <= N; n *= 4) {
                const float want = t->vec_dot(n, wq, xq), got = kernels[i].avx2(n, wq, xq);
                if (memcmp(&want, &got, sizeof(float)) != 0)
                    fail_msg("%s avx2 trial %d n=%lld: %a, reference %a", t->name, trial, (long long)n, (double)got,
                             (double)want);
            }
            float y[2 * NT];
            k.gemm[kernels[i].type](N / 2, wq, ws / 2, 2, xq, xs, NT, y, 2); /* two rows of N/2 */
            for (int tok = 0; tok < NT; tok++)
                for (int r = 0; r < 2; r++) {
                    const float want = t->vec_dot(N / 2, wq + (size_t)r * ws / 2, xq + tok * xs);
                    assert_memory_equal(&y[tok * 2 + r], &want, sizeof(float));
                }
        }
    }
    free(w);
    free(x);
    free(wq);
    free(xq);
#else
    SB_TEST_SKIP("not an x86-64 build");
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_sizes),
        cmocka_unit_test(test_q2_K_known_block),
        cmocka_unit_test(test_q3_K_known_block),
        cmocka_unit_test(test_q4_K_known_block),
        cmocka_unit_test(test_q5_K_known_block),
        cmocka_unit_test(test_q6_K_known_block),
        cmocka_unit_test(test_q8_K_known_block),
        cmocka_unit_test(test_zero_input),
        cmocka_unit_test(test_roundtrip_error),
        cmocka_unit_test(test_roundtrip_mixed_scales),
        cmocka_unit_test(test_vec_dot_vs_double),
        cmocka_unit_test(test_vec_dot_sum),
        cmocka_unit_test(test_rows_are_blockwise),
        cmocka_unit_test(test_avx2_matches_reference),
    };
    return sb_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
