/*
 * test_tensor.c - element types and reference kernels: the type table's
 * geometry, F16/BF16 conversions, block (de)quantization against known bytes
 * and error bounds, dot products against a double-precision oracle, and
 * matmul / get_row on awkward sizes.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tensor/tensor.h"
#include "tensor/threadpool.h"
#include "testutil.h"

/* Types switchboard computes with (weights), in table order. */
static const sb_type weight_types[] = {SB_TYPE_F32,  SB_TYPE_F16,  SB_TYPE_Q4_0, SB_TYPE_Q4_1,
                                       SB_TYPE_Q5_0, SB_TYPE_Q5_1, SB_TYPE_Q8_0, SB_TYPE_IQ4_NL, SB_TYPE_BF16};
/* The K-quants are weights too; test_kquants.c covers their numerics. */
static const sb_type kquant_types[] = {SB_TYPE_Q2_K, SB_TYPE_Q3_K, SB_TYPE_Q4_K, SB_TYPE_Q5_K, SB_TYPE_Q6_K,
                                       SB_TYPE_IQ4_XS};

/* Deterministic xorshift64* so failures reproduce. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_u64(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

/* Uniform in [-1, 1). */
static float rng_float(void) { return (float)((double)(rng_u64() >> 11) * 0x1p-52 - 1.0); }

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static const sb_type_traits *traits(sb_type type) {
    const sb_type_traits *t = sb_type_traits_of(type);
    assert_non_null(t);
    return t;
}

/* ---- type table ------------------------------------------------------- */

static void test_traits_geometry(void **state) {
    (void)state;
    static const struct {
        sb_type type;
        const char *name;
        uint32_t blck, size;
    } want[] = {
        {SB_TYPE_F32, "f32", 1, 4},           {SB_TYPE_F16, "f16", 1, 2},
        {SB_TYPE_Q4_0, "q4_0", 32, 18},       {SB_TYPE_Q4_1, "q4_1", 32, 20},
        {SB_TYPE_Q5_0, "q5_0", 32, 22},       {SB_TYPE_Q5_1, "q5_1", 32, 24},
        {SB_TYPE_Q8_0, "q8_0", 32, 34},       {SB_TYPE_Q8_1, "q8_1", 32, 36},
        {SB_TYPE_Q2_K, "q2_K", 256, 84},      {SB_TYPE_Q3_K, "q3_K", 256, 110},
        {SB_TYPE_Q4_K, "q4_K", 256, 144},     {SB_TYPE_Q5_K, "q5_K", 256, 176},
        {SB_TYPE_Q6_K, "q6_K", 256, 210},     {SB_TYPE_Q8_K, "q8_K", 256, 292},
        {SB_TYPE_IQ2_XXS, "iq2_xxs", 256, 66}, {SB_TYPE_IQ2_XS, "iq2_xs", 256, 74},
        {SB_TYPE_IQ3_XXS, "iq3_xxs", 256, 98}, {SB_TYPE_IQ1_S, "iq1_s", 256, 50},
        {SB_TYPE_IQ4_NL, "iq4_nl", 32, 18},   {SB_TYPE_IQ3_S, "iq3_s", 256, 110},
        {SB_TYPE_IQ2_S, "iq2_s", 256, 82},    {SB_TYPE_IQ4_XS, "iq4_xs", 256, 136},
        {SB_TYPE_I8, "i8", 1, 1},             {SB_TYPE_I16, "i16", 1, 2},
        {SB_TYPE_I32, "i32", 1, 4},           {SB_TYPE_I64, "i64", 1, 8},
        {SB_TYPE_F64, "f64", 1, 8},           {SB_TYPE_IQ1_M, "iq1_m", 256, 56},
        {SB_TYPE_BF16, "bf16", 1, 2},         {SB_TYPE_TQ1_0, "tq1_0", 256, 54},
        {SB_TYPE_TQ2_0, "tq2_0", 256, 66},    {SB_TYPE_MXFP4, "mxfp4", 32, 17},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const sb_type_traits *t = traits(want[i].type);
        assert_string_equal(t->name, want[i].name);
        assert_int_equal(t->blck_size, want[i].blck);
        assert_int_equal(t->type_size, want[i].size);
    }
}

static void test_traits_invalid_ids(void **state) {
    (void)state;
    static const uint32_t retired[] = {4, 5, 31, 32, 33, 36, 37, 38, 40, 41, 1000, UINT32_MAX};
    for (size_t i = 0; i < sizeof(retired) / sizeof(retired[0]); i++) {
        assert_null(sb_type_traits_of(retired[i]));
        assert_false(sb_type_can_matmul(retired[i]));
    }
    int valid = 0;
    for (uint32_t id = 0; id < SB_TYPE_COUNT; id++)
        valid += sb_type_traits_of(id) != NULL;
    assert_int_equal(valid, SB_TYPE_COUNT - 8);
}

static void test_traits_compute_support(void **state) {
    (void)state;
    for (uint32_t id = 0; id < SB_TYPE_COUNT; id++) {
        const sb_type_traits *t = sb_type_traits_of(id);
        bool weight = false;
        for (size_t i = 0; i < sizeof(weight_types) / sizeof(weight_types[0]); i++)
            weight |= weight_types[i] == id;
        for (size_t i = 0; i < sizeof(kquant_types) / sizeof(kquant_types[0]); i++)
            weight |= kquant_types[i] == id;
        assert_int_equal(sb_type_can_matmul(id), weight);
        if (!weight)
            continue;
        assert_non_null(t->to_float);
        assert_non_null(t->from_float);
        const sb_type_traits *xt = traits(t->vec_dot_type);
        assert_non_null(xt->act_from_float);
        assert_int_equal(xt->blck_size, t->blck_size);
    }
    assert_int_equal(traits(SB_TYPE_F16)->vec_dot_type, SB_TYPE_F16);
    assert_int_equal(traits(SB_TYPE_BF16)->vec_dot_type, SB_TYPE_BF16);
    assert_int_equal(traits(SB_TYPE_Q4_0)->vec_dot_type, SB_TYPE_Q8_0);
    assert_int_equal(traits(SB_TYPE_Q5_0)->vec_dot_type, SB_TYPE_Q8_0);
    assert_int_equal(traits(SB_TYPE_Q8_0)->vec_dot_type, SB_TYPE_Q8_0);
    assert_int_equal(traits(SB_TYPE_Q4_1)->vec_dot_type, SB_TYPE_Q8_1);
    assert_int_equal(traits(SB_TYPE_Q5_1)->vec_dot_type, SB_TYPE_Q8_1);
    assert_int_equal(traits(SB_TYPE_IQ4_NL)->vec_dot_type, SB_TYPE_Q8_0);
    assert_non_null(traits(SB_TYPE_Q8_1)->to_float); /* activation type: convertible, not a weight */
    assert_null(traits(SB_TYPE_IQ3_S)->to_float); /* sizes known, no compute support */
}

static void test_row_size(void **state) {
    (void)state;
    assert_int_equal(sb_type_row_size(SB_TYPE_F32, 7), 28);
    assert_int_equal(sb_type_row_size(SB_TYPE_Q4_0, 96), 3 * 18);
    assert_int_equal(sb_type_row_size(SB_TYPE_Q6_K, 4096), 16 * 210);
    assert_int_equal(sb_type_row_size(SB_TYPE_MXFP4, 64), 34);
    assert_int_equal(sb_type_row_size(SB_TYPE_Q4_0, 0), 0);
    assert_int_equal(sb_type_row_size(SB_TYPE_Q4_0, 33), 0);
    assert_int_equal(sb_type_row_size(SB_TYPE_Q4_K, 32), 0);
    assert_int_equal(sb_type_row_size(SB_TYPE_F32, -4), 0);
    assert_int_equal(sb_type_row_size((sb_type)4, 32), 0);
    assert_int_equal(sb_type_row_size(SB_TYPE_F64, INT64_MAX / 2), 0); /* 2^65 bytes */
}

/* ---- F16 / BF16 ----------------------------------------------------- */

static bool is_nan16(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }

static void test_fp16_all_patterns(void **state) {
    (void)state;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = sb_fp16_to_fp32(h);
        uint16_t back = sb_fp32_to_fp16(f);
        if (is_nan16(h)) {
            assert_true(isnan(f));
            assert_int_equal(back, h | 0x200); /* quieted, sign and payload kept */
            continue;
        }
        assert_int_equal(back, h);
        /* The float value itself: (-1)^s * 2^(e-15) * 1.m, or m * 2^-24. */
        int e = (h >> 10) & 0x1f, m = h & 0x3ff;
        double v = e == 0 ? ldexp(m, -24) : e == 31 ? INFINITY : ldexp(1024 + m, e - 25);
        assert_true((double)f == ((h & 0x8000) ? -v : v));
        assert_int_equal(signbit(f) != 0, (h & 0x8000) != 0);
    }
}

static void test_fp16_rounding(void **state) {
    (void)state;
    static const struct {
        float f;
        uint16_t h;
    } cases[] = {
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f + 0x1p-11f, 0x3c00},              /* tie -> even (down) */
        {1.0f + 3 * 0x1p-11f, 0x3c02},          /* tie -> even (up) */
        {1.0f + 0x1p-11f + 0x1p-23f, 0x3c01},   /* just above the tie */
        {1.0f + 0x1p-11f - 0x1p-23f, 0x3c00},   /* just below */
        {2047.0f + 0.5f, 0x6800},               /* tie at 2048 (ulp 1): 2047.5 -> 2048 */
        {65504.0f, 0x7bff},                     /* largest finite */
        {65519.99f, 0x7bff},                    /* below the overflow tie */
        {65520.0f, 0x7c00},                     /* tie -> even is infinity */
        {1e10f, 0x7c00},
        {-INFINITY, 0xfc00},
        {0x1p-14f, 0x0400},                     /* smallest normal */
        {0x1p-14f - 0x1p-25f, 0x0400},          /* subnormal tie rounds up into the normals */
        {0x1p-24f, 0x0001},                     /* smallest subnormal */
        {0x1p-25f, 0x0000},                     /* tie -> even (zero) */
        {-0x1p-25f, 0x8000},
        {0x1p-25f * 1.0000001f, 0x0001},        /* above the tie */
        {3 * 0x1p-25f, 0x0002},                 /* 1.5 ulp -> 2 */
        {5 * 0x1p-25f, 0x0002},                 /* 2.5 ulp -> 2 */
        {0x1p-26f, 0x0000},
        {0x1p-149f, 0x0000},                    /* F32 subnormal */
        {0.1f, 0x2e66},
        {3.14159265f, 0x4248},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint16_t got = sb_fp32_to_fp16(cases[i].f);
        if (got != cases[i].h)
            fail_msg("fp16(%a) = 0x%04x, want 0x%04x", (double)cases[i].f, got, cases[i].h);
    }
    /* NaN stays NaN, quiet, with its sign. */
    uint16_t qnan = sb_fp32_to_fp16(float_of(0x7fc00000));
    uint16_t snan = sb_fp32_to_fp16(float_of(0xff800001));
    assert_true(is_nan16(qnan) && (qnan & 0x200) && !(qnan & 0x8000));
    assert_true(is_nan16(snan) && (snan & 0x200) && (snan & 0x8000));
}

/* Against the compiler's own conversion where it has one (gcc 12 on x86). */
static void test_fp16_vs_compiler(void **state) {
    (void)state;
#if defined(__FLT16_MAX__) && !defined(__clang__)
    for (int i = 0; i < 1 << 22; i++) {
        uint32_t u = (uint32_t)rng_u64();
        /* Concentrate on the F16 range: exponents 100..145. */
        if (i & 1)
            u = (u & 0x807fffff) | (uint32_t)(100 + (u >> 8) % 46) << 23;
        float f = float_of(u);
        if (isnan(f))
            continue;
        _Float16 h = (_Float16)f;
        uint16_t want;
        memcpy(&want, &h, sizeof(want));
        if (sb_fp32_to_fp16(f) != want)
            fail_msg("fp16(%a) = 0x%04x, compiler says 0x%04x", (double)f, sb_fp32_to_fp16(f), want);
    }
#else
    SB_TEST_SKIP("the compiler has no _Float16 to compare with");
#endif
}

static void test_bf16(void **state) {
    (void)state;
    assert_int_equal(sb_fp32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(sb_fp32_to_bf16(float_of(0x3f808000)), 0x3f80); /* tie -> even */
    assert_int_equal(sb_fp32_to_bf16(float_of(0x3f818000)), 0x3f82); /* tie -> even */
    assert_int_equal(sb_fp32_to_bf16(float_of(0x3f808001)), 0x3f81);
    assert_int_equal(sb_fp32_to_bf16(float_of(0x00018000)), 0x0002); /* subnormals kept, not flushed */
    assert_int_equal(sb_fp32_to_bf16(float_of(0x7f7fffff)), 0x7f80); /* rounds up to infinity */
    assert_int_equal(sb_fp32_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(sb_fp32_to_bf16(float_of(0x7f800001)), 0x7fc0); /* signalling NaN quieted */
    assert_int_equal(sb_fp32_to_bf16(float_of(0xffc12345)), 0xffc1);
    for (uint32_t i = 0; i < 65536; i++) {
        float f = sb_bf16_to_fp32((uint16_t)i);
        assert_int_equal(bits_of(f), i << 16);
        if (!isnan(f))
            assert_int_equal(sb_fp32_to_bf16(f), i);
    }
}

/* ---- block formats: known bytes --------------------------------------- */

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void assert_floats_equal(const float *got, const float *want, int n) {
    for (int i = 0; i < n; i++)
        if (bits_of(got[i]) != bits_of(want[i]))
            fail_msg("element %d: got %a, want %a", i, (double)got[i], (double)want[i]);
}

static void test_q4_0_known(void **state) {
    (void)state;
    /* x = (e%16 - 8)/4: the first largest magnitude is -2, so d = -2/-8 =
     * 0.25 and element e gets quant e%16. */
    float x[32], back[32];
    uint8_t want[18] = {0x00, 0x34}, got[18];
    for (int e = 0; e < 32; e++)
        x[e] = (float)(e % 16 - 8) * 0.25f;
    for (int j = 0; j < 16; j++)
        want[2 + j] = (uint8_t)(0x11 * j);
    traits(SB_TYPE_Q4_0)->from_float(x, got, 32);
    assert_memory_equal(got, want, 18);
    traits(SB_TYPE_Q4_0)->to_float(got, back, 32);
    assert_floats_equal(back, x, 32);

    /* The positive extreme +2 maps to 16 and is clamped to 15 (1.75). */
    x[5] = 2.0f;
    traits(SB_TYPE_Q4_0)->from_float(x, got, 32);
    assert_int_equal(got[2 + 5], 0x5f);
}

/* A block (found by search) where element 17 is 0.3*id + 8.5 = 6 when
 * rounded step by step, as ggml does, but 5.99999976 with the two fused into
 * one FMA: guards against the compiler contracting the kernels. */
static void test_q4_0_not_fused(void **state) {
    (void)state;
    static const float x[32] = {0.685f,  -0.244f, 0.655f,  -0.542f, 0.480f,  0.476f, -0.223f, -0.086f,
                                0.258f,  0.729f,  -0.056f, 0.062f,  0.810f,  0.598f, 0.848f,  -0.127f,
                                -0.879f, 0.300f,  0.193f,  0.483f,  -0.162f, 0.960f, -0.152f, -0.433f,
                                -0.024f, -0.753f, 0.362f,  0.431f,  0.690f,  -0.818f, -0.102f, -0.470f};
    static const uint8_t want[18] = {0xae, 0xaf, 0xf2, 0x6a, 0x63, 0x4d, 0x94, 0x04, 0x9a,
                                     0xc9, 0x86, 0xe2, 0x58, 0x47, 0x21, 0xf3, 0x91, 0xc9};
    uint8_t got[18];
    traits(SB_TYPE_Q4_0)->from_float(x, got, 32);
    assert_memory_equal(got, want, 18);
}

static void test_q4_1_known(void **state) {
    (void)state;
    /* min -1, max 14: d = 1, m = -1, element e gets quant e%16. */
    float x[32], back[32];
    uint8_t want[20] = {0x00, 0x3c, 0x00, 0xbc}, got[20];
    for (int e = 0; e < 32; e++)
        x[e] = (float)(e % 16) - 1.0f;
    for (int j = 0; j < 16; j++)
        want[4 + j] = (uint8_t)(0x11 * j);
    traits(SB_TYPE_Q4_1)->from_float(x, got, 32);
    assert_memory_equal(got, want, 20);
    traits(SB_TYPE_Q4_1)->to_float(got, back, 32);
    assert_floats_equal(back, x, 32);
}

static void test_q5_known(void **state) {
    (void)state;
    /* Q5_0 bytes -> floats: d = 0.5; qh bit e is element e's fifth bit. */
    uint8_t b0[22] = {0};
    float got[32], want[32];
    put16(b0, 0x3800);
    b0[2] = 0x01;             /* element 0 */
    b0[5] = 0x80;             /* element 31 */
    b0[6 + 0] = 0x0f;         /* element 0 low nibble 15, element 16 low nibble 0 */
    b0[6 + 15] = 0xa0;        /* element 15 low 0, element 31 low 10 */
    for (int e = 0; e < 32; e++)
        want[e] = -16 * 0.5f;
    want[0] = (31 - 16) * 0.5f;
    want[31] = (26 - 16) * 0.5f;
    traits(SB_TYPE_Q5_0)->to_float(b0, got, 32);
    assert_floats_equal(got, want, 32);

    /* Q5_1 round trip through known bytes: min 0, max 31 -> d 1, quant e. */
    float x[32];
    uint8_t b1[24];
    for (int e = 0; e < 32; e++)
        x[e] = (float)e;
    traits(SB_TYPE_Q5_1)->from_float(x, b1, 32);
    assert_int_equal(b1[0] | b1[1] << 8, 0x3c00);
    assert_int_equal(b1[2] | b1[3] << 8, 0x0000);
    assert_int_equal(b1[4] | b1[5] << 8 | b1[6] << 16 | (uint32_t)b1[7] << 24, 0xffff0000u);
    for (int j = 0; j < 16; j++)
        assert_int_equal(b1[8 + j], (uint8_t)(j | (j << 4)));
    traits(SB_TYPE_Q5_1)->to_float(b1, got, 32);
    assert_floats_equal(got, x, 32);

    /* Q5_0: -16 -> d = 1, quants e (x = e - 16). */
    for (int e = 0; e < 32; e++)
        x[e] = (float)(e - 16);
    traits(SB_TYPE_Q5_0)->from_float(x, b0, 32);
    assert_int_equal(b0[0] | b0[1] << 8, 0x3c00);
    assert_int_equal(b0[2] | b0[3] << 8 | b0[4] << 16 | (uint32_t)b0[5] << 24, 0xffff0000u);
    traits(SB_TYPE_Q5_0)->to_float(b0, got, 32);
    assert_floats_equal(got, x, 32);
}

/* Q8: the reference quantizer rounds ties away from zero, the activation
 * quantizer (like ggml's x86 backend) to even. amax 127 gives d = 1. */
static void test_q8_rounding(void **state) {
    (void)state;
    float x[32] = {127.0f, 2.5f, -0.5f, 3.5f, -2.5f, 0.49f, -127.0f};
    static const int8_t ref[7] = {127, 3, -1, 4, -3, 0, -127};
    static const int8_t act[7] = {127, 2, 0, 4, -2, 0, -127};
    uint8_t b0[34], b1[36];

    traits(SB_TYPE_Q8_0)->from_float(x, b0, 32);
    assert_int_equal(b0[0] | b0[1] << 8, 0x3c00);
    assert_memory_equal(b0 + 2, ref, 7);
    traits(SB_TYPE_Q8_0)->act_from_float(x, b0, 32);
    assert_memory_equal(b0 + 2, act, 7);

    /* Q8_1 adds s = d * sum(q): 127+3-1+4-3-127 = 3, and 127+2+0+4-2-127 = 4. */
    traits(SB_TYPE_Q8_1)->from_float(x, b1, 32);
    assert_int_equal(b1[2] | b1[3] << 8, sb_fp32_to_fp16(3.0f));
    assert_memory_equal(b1 + 4, ref, 7);
    traits(SB_TYPE_Q8_1)->act_from_float(x, b1, 32);
    assert_int_equal(b1[2] | b1[3] << 8, sb_fp32_to_fp16(4.0f));
    assert_memory_equal(b1 + 4, act, 7);

    /* An all-zero block has d = 0 and zero quants. */
    float z[32] = {0};
    traits(SB_TYPE_Q8_0)->act_from_float(z, b0, 32);
    for (int i = 0; i < 34; i++)
        assert_int_equal(b0[i], 0);
}

/* ggml's quantize_row_q8_0_ref for one block, as a plain loop: amax by
 * MAX over fabsf in order (so a NaN counts only where it is), roundf, and a
 * quant outside int8 (or of a NaN) as 0. */
static void q8_0_block_spec(const float *x, uint8_t out[34]) {
    float amax = 0.0f;
    for (int e = 0; e < 32; e++)
        amax = amax > fabsf(x[e]) ? amax : fabsf(x[e]);
    const float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    if (!isfinite(id))
        id = 0.0f;
    const uint16_t h = sb_fp32_to_fp16(d);
    memcpy(out, &h, sizeof(h));
    for (int e = 0; e < 32; e++) {
        const float r = roundf(x[e] * id);
        out[2 + e] = (uint8_t)(int8_t)(r >= -128.0f && r <= 127.0f ? r : 0.0f);
    }
}

/* The vectorised Q8_0 quantizer (its own roundf and amax) gives the plain
 * loop's bytes beside ties and on blocks with NaN or infinities. */
static void test_q8_0_edges_match_plain_loop(void **state) {
    (void)state;
    enum { CASES = 8 };
    static const float near_ties[] = {127.0f, 0.49999997f, 126.5f, -126.5f, 1.4999999f, 1.5f, -2.4999998f,
                                      -2.5f, -126.49999f, -0.5f, 0.50000006f, 64.5f}; /* amax 127: d = 1 */
    for (int c = 0; c < CASES; c++) {
        float x[32];
        uint8_t got[34], want[34];
        for (int e = 0; e < 32; e++)
            x[e] = rng_float() * 3.0f;
        if (c == 0)
            memcpy(x, near_ties, sizeof(near_ties));
        const int at[CASES] = {-1, 0, 17, 31, 3, 9, 30, -1};
        if (c >= 1 && c <= 3)
            x[at[c]] = NAN;
        if (c == 4 || c == 5)
            x[at[c]] = c == 4 ? INFINITY : -INFINITY;
        if (c == 6) {
            x[2] = INFINITY;
            x[at[c]] = NAN;
        }
        for (int e = 0; c == 7 && e < 32; e++)
            x[e] *= 1e-39f; /* 1 / d overflows */
        q8_0_block_spec(x, want);
        traits(SB_TYPE_Q8_0)->from_float(x, got, 32);
        if (memcmp(got, want, sizeof(got)) != 0)
            fail_msg("case %d: the quantizer's block differs from the plain loop's", c);
    }
}

/* ---- block formats: random round trips -------------------------------- */

/* Largest error quantization may leave in a block, from its range: half a
 * step (a whole step where the symmetric formats clamp the far extreme),
 * plus the F16 rounding of d and m (relative, or absolute where d is an F16
 * subnormal: up to 127 quants times half of 2^-24). */
static double block_error_bound(sb_type type, const float *x) {
    double amax = 0, min = x[0], max = x[0];
    for (int e = 0; e < 32; e++) {
        amax = fmax(amax, fabs(x[e]));
        min = fmin(min, x[e]);
        max = fmax(max, x[e]);
    }
    double f16 = 0x1p-10 * (amax + (max - min)) + 128 * 0x1p-25;
    switch (type) {
    case SB_TYPE_Q4_0: return amax / 8 + f16;
    case SB_TYPE_Q5_0: return amax / 16 + f16;
    case SB_TYPE_Q4_1: return (max - min) / 30 + f16;
    case SB_TYPE_Q5_1: return (max - min) / 62 + f16;
    case SB_TYPE_Q8_0:
    case SB_TYPE_Q8_1: return amax / 254 + f16;
    /* its values are up to 24 apart, d near amax / 127; the fitted scale
     * may clip the far extreme at 113 d */
    case SB_TYPE_IQ4_NL: return amax / 8 + f16;
    case SB_TYPE_F16: return amax * 0x1p-11;
    case SB_TYPE_BF16: return amax * 0x1p-8;
    default: return 0;
    }
}

static void check_round_trip(sb_type type, sb_from_float_fn from_float, float scale) {
    enum { N = 32 * 37 };
    const sb_type_traits *t = traits(type);
    float *x = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float));
    void *q = malloc(sb_type_row_size(type, N));
    for (int i = 0; i < N; i++)
        x[i] = rng_float() * scale;
    x[5] = 0; /* a block of constants and one of zeros */
    for (int i = 64; i < 96; i++)
        x[i] = 0.75f * scale;
    for (int i = 96; i < 128; i++)
        x[i] = 0;
    from_float(x, q, N);
    t->to_float(q, back, N);
    double sq = 0, sq_err = 0;
    for (int b = 0; b < N / 32; b++) {
        double bound = block_error_bound(type, x + 32 * b);
        for (int e = 32 * b; e < 32 * b + 32; e++) {
            double err = fabs((double)back[e] - x[e]);
            if (err > bound)
                fail_msg("%s: element %d: %g -> %g, error %g > %g", t->name, e, (double)x[e], (double)back[e], err,
                         bound);
            sq += (double)x[e] * x[e];
            sq_err += err * err;
        }
    }
    /* Relative RMS error well under one step of each format. */
    double rel = sqrt(sq_err / sq);
    double limit = type == SB_TYPE_Q4_0 || type == SB_TYPE_Q4_1 || type == SB_TYPE_IQ4_NL ? 0.12 : type == SB_TYPE_F32 ? 0 : 0.06;
    if (rel > limit)
        fail_msg("%s: relative RMS error %g > %g", t->name, rel, limit);
    free(x);
    free(back);
    free(q);
}

static void test_round_trip_all_types(void **state) {
    (void)state;
    static const float scales[] = {1.0f, 1e-3f, 300.0f};
    for (size_t s = 0; s < sizeof(scales) / sizeof(scales[0]); s++) {
        for (size_t i = 0; i < sizeof(weight_types) / sizeof(weight_types[0]); i++)
            check_round_trip(weight_types[i], traits(weight_types[i])->from_float, scales[s]);
        check_round_trip(SB_TYPE_Q8_1, traits(SB_TYPE_Q8_1)->from_float, scales[s]);
        check_round_trip(SB_TYPE_Q8_0, traits(SB_TYPE_Q8_0)->act_from_float, scales[s]);
        check_round_trip(SB_TYPE_Q8_1, traits(SB_TYPE_Q8_1)->act_from_float, scales[s]);
    }
}

/* The Q8_1 s field is F16(d * sum(q)), d = amax/127 before its own F16
 * rounding, in both flavours, on random data. */
static void test_q8_1_sum(void **state) {
    (void)state;
    float x[64];
    sb_block_q8_1 b[2];
    for (int i = 0; i < 64; i++)
        x[i] = rng_float();
    for (int flavour = 0; flavour < 2; flavour++) {
        const sb_type_traits *t = traits(SB_TYPE_Q8_1);
        (flavour ? t->act_from_float : t->from_float)(x, b, 64);
        for (int k = 0; k < 2; k++) {
            float amax = 0;
            int sum = 0;
            for (int e = 0; e < 32; e++) {
                amax = fmaxf(amax, fabsf(x[32 * k + e]));
                sum += b[k].qs[e];
            }
            assert_int_equal(b[k].d, sb_fp32_to_fp16(amax / 127));
            assert_int_equal(b[k].s, sb_fp32_to_fp16((float)sum * (amax / 127)));
        }
    }
}

/* ---- dot products and matmul ----------------------------------------- */

/* A weight row quantized with from_float and an activation row converted as
 * matmul does it; both dequantized, so the oracle sees the same inputs. */
typedef struct {
    void *wq, *xq;
    float *w, *x;
} dot_case;

static void dot_case_make(dot_case *c, sb_type type, int64_t n) {
    const sb_type_traits *t = traits(type), *xt = traits(t->vec_dot_type);
    float *src = malloc((size_t)n * sizeof(float));
    c->wq = malloc(sb_type_row_size(type, n));
    c->xq = malloc(sb_type_row_size(t->vec_dot_type, n));
    c->w = malloc((size_t)n * sizeof(float));
    c->x = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        src[i] = rng_float();
    t->from_float(src, c->wq, n);
    t->to_float(c->wq, c->w, n);
    for (int64_t i = 0; i < n; i++)
        src[i] = rng_float() * 4.0f;
    xt->act_from_float(src, c->xq, n);
    xt->to_float(c->xq, c->x, n);
    free(src);
}

static void dot_case_free(dot_case *c) {
    free(c->wq);
    free(c->xq);
    free(c->w);
    free(c->x);
}

/* Q4_1/Q5_1 against Q8_1 use the block's stored s = F16(d*sum(q)) for the
 * min term, not the dequantized activations: that term carries the F16
 * rounding of s (and of d), about 2^-10 of m*s per block. */
static double min_term_tolerance(sb_type type, const void *wq, const void *xq, int64_t n) {
    const sb_type_traits *t = traits(type), *xt = traits(t->vec_dot_type);
    double tol = 0;
    if (t->vec_dot_type != SB_TYPE_Q8_1)
        return 0;
    for (int64_t b = 0; b < n / 32; b++) {
        const uint16_t *wb = (const void *)((const char *)wq + b * t->type_size);
        const uint16_t *xb = (const void *)((const char *)xq + b * xt->type_size);
        tol += fabs((double)sb_fp16_to_fp32(wb[1]) * sb_fp16_to_fp32(xb[1])) * 0x1p-10;
    }
    return tol;
}

/* Otherwise only per-block float rounding separates vec_dot from the exact
 * dot of the dequantized rows: a few float ulps of the sum of |terms|. */
static void assert_dot_close(float got, const float *w, const float *x, int64_t n, double extra_tol,
                             const char *what) {
    double exact = 0, mag = 0;
    for (int64_t i = 0; i < n; i++) {
        exact += (double)w[i] * x[i];
        mag += fabs((double)w[i] * x[i]);
    }
    double tol = 1e-6 * mag + extra_tol + 1e-30;
    if (fabs(got - exact) > tol)
        fail_msg("%s: got %.9g, exact %.9g (tolerance %g)", what, (double)got, exact, tol);
}

static void test_vec_dot_vs_oracle(void **state) {
    (void)state;
    static const int64_t sizes[] = {32, 96, 2048};
    for (size_t i = 0; i < sizeof(weight_types) / sizeof(weight_types[0]); i++) {
        const sb_type_traits *t = traits(weight_types[i]);
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            for (int rep = 0; rep < 20; rep++) {
                dot_case c;
                dot_case_make(&c, weight_types[i], sizes[s]);
                assert_dot_close(t->vec_dot(sizes[s], c.wq, c.xq), c.w, c.x, sizes[s],
                                 min_term_tolerance(weight_types[i], c.wq, c.xq, sizes[s]), t->name);
                dot_case_free(&c);
            }
        }
    }
}

/* Dot products of hand-made blocks where every float step is exact. */
static void test_vec_dot_known(void **state) {
    (void)state;
    /* q4_0 with d = 0.25 (quants e%16 - 8) against q8_0 with d = 1, q = 1. */
    float w[32], one[32];
    uint8_t wq[18], xq[34];
    for (int e = 0; e < 32; e++) {
        w[e] = (float)(e % 16 - 8) * 0.25f;
        one[e] = e == 0 ? 127.0f : 1.0f;
    }
    traits(SB_TYPE_Q4_0)->from_float(w, wq, 32);
    traits(SB_TYPE_Q8_0)->act_from_float(one, xq, 32);
    /* d_w = 0.25 and d_x = 1, so the result is exactly 0.25 * sumi. */
    int sumi = 0;
    for (int e = 0; e < 32; e++)
        sumi += (e % 16 - 8) * (e == 0 ? 127 : 1);
    assert_true(traits(SB_TYPE_Q4_0)->vec_dot(32, wq, xq) == (float)sumi * 0.25f);

    /* q4_1: x = q - 1 (d 1, m -1) against ones: sum(q)*1 + (-1)*s. */
    uint8_t w1[20], x1[36];
    for (int e = 0; e < 32; e++)
        w[e] = (float)(e % 16) - 1.0f;
    traits(SB_TYPE_Q4_1)->from_float(w, w1, 32);
    traits(SB_TYPE_Q8_1)->act_from_float(one, x1, 32);
    double want = 0;
    for (int e = 0; e < 32; e++)
        want += (double)w[e] * (e == 0 ? 127 : 1);
    assert_true(traits(SB_TYPE_Q4_1)->vec_dot(32, w1, x1) == (float)want);
}

/* F16 and BF16 weights see activations rounded to their own type. */
static void test_float_activation_rounding(void **state) {
    (void)state;
    static const sb_type types[] = {SB_TYPE_F16, SB_TYPE_BF16};
    for (size_t i = 0; i < 2; i++) {
        const sb_type_traits *t = traits(types[i]);
        float ones[5] = {1, 1, 1, 1, 1}, x[5], y[1];
        uint16_t w[5];
        double want = 0;
        t->from_float(ones, w, 5);
        for (int k = 0; k < 5; k++) {
            x[k] = 1.0f + 0x1p-20f * (float)(k + 1); /* not representable in either */
            uint16_t h;
            t->from_float(&x[k], &h, 1);
            float r;
            t->to_float(&h, &r, 1);
            want += r;
        }
        void *work = malloc(sb_matmul_work_size(types[i], 5, 1));
        sb_matmul(NULL, types[i], w, 5, 1, x, 1, y, work);
        free(work);
        /* The rounded sum (here 5), not that of the unrounded activations. */
        assert_true(y[0] == (float)want);
        assert_true(want == 5.0);
    }
}

/* A row preparation for the products: out = 2 in + 1. */
static void twice_plus_one(void *ctx, int64_t tok, float *out, const float *in, int64_t n) {
    (void)ctx;
    (void)tok;
    for (int64_t k = 0; k < n; k++)
        out[k] = 2.0f * in[k] + 1.0f;
}

/* Products of one input, its rows prepared first: the same bytes as one
 * sb_matmul per matrix of the prepared rows, on a pool (2 threads: the
 * chunks split evenly between them; 3: with chunks left over), for
 * matrices that share an activation format (one loop) and for a mix that
 * does not (one by one); the prepared rows are kept. */
static void test_matmul_many_equals_one_by_one(void **state) {
    (void)state;
    enum { N_IN = 256, N_TOK = 5 };
    static const sb_type sets[][3] = {{SB_TYPE_Q4_0, SB_TYPE_Q8_0, SB_TYPE_Q4_0}, {SB_TYPE_Q4_0, SB_TYPE_Q4_1, SB_TYPE_F16}};
    static const int64_t n_out[3] = {37, 64, 9};
    float *x = malloc(sizeof(float) * N_IN * N_TOK), *prepared = malloc(sizeof(float) * N_IN * N_TOK),
          *kept = malloc(sizeof(float) * N_IN * N_TOK);
    for (int64_t k = 0; k < N_IN * N_TOK; k++)
        x[k] = rng_float() * 3.0f;
    twice_plus_one(NULL, 0, prepared, x, N_IN * N_TOK);
    for (size_t case_ = 0; case_ < 2 * sizeof(sets) / sizeof(sets[0]); case_++) {
        const size_t set = case_ / 2;
        sb_threadpool *tp = NULL;
        assert_int_equal(sb_threadpool_create(2 + (int)(case_ % 2), &tp, NULL), SB_OK);
        sb_matmul_dst dst[3];
        float *want[3];
        size_t work_size = 0;
        for (int m = 0; m < 3; m++) {
            const sb_type type = sets[set][m];
            const size_t w_row = sb_type_row_size(type, N_IN);
            float *src = malloc(sizeof(float) * N_IN);
            char *w = malloc(w_row * (size_t)n_out[m]);
            for (int64_t r = 0; r < n_out[m]; r++) {
                for (int64_t k = 0; k < N_IN; k++)
                    src[k] = rng_float();
                traits(type)->from_float(src, w + (size_t)r * w_row, N_IN);
            }
            free(src);
            dst[m] = (sb_matmul_dst){.type = type, .w = w, .n_out = n_out[m], .y = malloc(sizeof(float) * N_TOK * n_out[m])};
            want[m] = malloc(sizeof(float) * N_TOK * n_out[m]);
            work_size = work_size > sb_matmul_work_size(type, N_IN, N_TOK) ? work_size
                                                                            : sb_matmul_work_size(type, N_IN, N_TOK);
        }
        /* The second product also updates a residual stream. */
        float *residual = malloc(sizeof(float) * N_TOK * n_out[1]), *residual0 = malloc(sizeof(float) * N_TOK * n_out[1]);
        for (int64_t k = 0; k < N_TOK * n_out[1]; k++)
            residual[k] = residual0[k] = rng_float() * 2.0f;
        dst[1].residual = residual;
        void *work = malloc(work_size);
        for (int m = 0; m < 3; m++)
            sb_matmul(NULL, dst[m].type, dst[m].w, N_IN, n_out[m], prepared, N_TOK, want[m], work);
        memset(kept, 0, sizeof(float) * N_IN * N_TOK);
        sb_matmul_many(tp, dst, 3, N_IN, x, N_TOK, &(sb_matmul_prep){.row = twice_plus_one, .out = kept}, work);
        assert_memory_equal(kept, prepared, sizeof(float) * N_IN * N_TOK);
        for (int64_t k = 0; k < N_TOK * n_out[1]; k++)
            residual0[k] += want[1][k];
        assert_memory_equal(residual, residual0, sizeof(float) * N_TOK * n_out[1]);
        free(residual);
        free(residual0);
        for (int m = 0; m < 3; m++) {
            assert_memory_equal(dst[m].y, want[m], sizeof(float) * N_TOK * n_out[m]);
            free((void *)dst[m].w);
            free(dst[m].y);
            free(want[m]);
        }
        free(work);
        sb_threadpool_free(tp);
    }
    free(x);
    free(prepared);
    free(kept);
}

static void test_matmul_odd_sizes(void **state) {
    (void)state;
    static const struct {
        int64_t n_in, n_out, n_tok;
    } shapes[] = {{32, 1, 1}, {96, 7, 3}, {160, 13, 5}, {224, 3, 11}};
    for (size_t i = 0; i < sizeof(weight_types) / sizeof(weight_types[0]); i++) {
        const sb_type type = weight_types[i];
        const sb_type_traits *t = traits(type), *xt = traits(t->vec_dot_type);
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
            const int64_t n_in = shapes[s].n_in, n_out = shapes[s].n_out, n_tok = shapes[s].n_tok;
            const size_t w_row = sb_type_row_size(type, n_in), x_row = sb_type_row_size(t->vec_dot_type, n_in);
            float *src = malloc((size_t)(n_in * n_out) * sizeof(float));
            float *x = malloc((size_t)(n_in * n_tok) * sizeof(float));
            float *y = malloc((size_t)(n_out * n_tok) * sizeof(float));
            float *wf = malloc((size_t)n_in * sizeof(float)), *xf = malloc((size_t)n_in * sizeof(float));
            char *w = malloc(w_row * (size_t)n_out), *xq = malloc(x_row);
            /* Exactly the size asked for, so ASan sees any overrun: the
             * converted rows (and a packed layout's terms after each). */
            void *work = malloc(sb_matmul_work_size(type, n_in, n_tok));
            assert_true(sb_matmul_work_size(type, n_in, n_tok) >= x_row * (size_t)n_tok);

            for (int64_t k = 0; k < n_in * n_out; k++)
                src[k] = rng_float();
            for (int64_t k = 0; k < n_in * n_tok; k++)
                x[k] = rng_float() * 3.0f;
            for (int64_t r = 0; r < n_out; r++)
                t->from_float(src + r * n_in, w + (size_t)r * w_row, n_in);
            sb_matmul(NULL, type, w, n_in, n_out, x, n_tok, y, work);

            for (int64_t tok = 0; tok < n_tok; tok++) {
                xt->act_from_float(x + tok * n_in, xq, n_in);
                xt->to_float(xq, xf, n_in);
                for (int64_t r = 0; r < n_out; r++) {
                    const char *wr = w + (size_t)r * w_row;
                    /* Exactly the definition, and close to the exact product. */
                    assert_true(y[tok * n_out + r] == t->vec_dot(n_in, wr, xq));
                    sb_get_row(type, w, n_in, r, false, wf);
                    assert_dot_close(y[tok * n_out + r], wf, xf, n_in, min_term_tolerance(type, wr, xq, n_in),
                                     t->name);
                }
            }
            free(src);
            free(x);
            free(y);
            free(wf);
            free(xf);
            free(w);
            free(xq);
            free(work);
        }
    }
}

static void test_get_row(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof(weight_types) / sizeof(weight_types[0]); i++) {
        const sb_type type = weight_types[i];
        const sb_type_traits *t = traits(type);
        const int64_t n_in = 96, n_rows = 5;
        const size_t row = sb_type_row_size(type, n_in);
        float src[96 * 5], all[96 * 5], got[96];
        char *w = malloc(row * n_rows);
        for (int k = 0; k < 96 * 5; k++)
            src[k] = rng_float();
        t->from_float(src, w, n_in * n_rows);
        t->to_float(w, all, n_in * n_rows);
        for (int64_t r = 0; r < n_rows; r++) {
            sb_get_row(type, w, n_in, r, false, got);
            assert_floats_equal(got, all + r * n_in, (int)n_in);
        }
        free(w);
    }
}

/* A packed matrix's rows (a tied embedding table) read back as the
 * unpacked rows do, for every type the active level packs. */
static void test_get_row_packed(void **state) {
    (void)state;
    int checked = 0;
    for (uint32_t type = 0; type < SB_TYPE_COUNT; type++) {
        const int64_t n_in = 512, n_rows = 2 * sb_weight_pack_rows((sb_type)type);
        if (n_rows == 0 || !sb_weight_packable((sb_type)type, n_in, n_rows))
            continue;
        const sb_type_traits *t = traits((sb_type)type);
        const size_t row = sb_type_row_size((sb_type)type, n_in);
        float *src = malloc((size_t)(n_in * n_rows) * sizeof(float)), want[512], got[512];
        char *w = malloc(row * (size_t)n_rows), *packed = malloc(row * (size_t)n_rows);
        for (int64_t k = 0; k < n_in * n_rows; k++)
            src[k] = rng_float();
        t->from_float(src, w, n_in * n_rows);
        sb_weight_pack((sb_type)type, w, packed, n_in, n_rows);
        for (int64_t r = 0; r < n_rows; r++) {
            sb_get_row((sb_type)type, w, n_in, r, false, want);
            sb_get_row((sb_type)type, packed, n_in, r, true, got);
            assert_memory_equal(got, want, sizeof(want));
        }
        free(src);
        free(w);
        free(packed);
        checked++;
    }
    if (checked == 0)
        print_message("the active level packs nothing\n");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_traits_geometry),
        cmocka_unit_test(test_traits_invalid_ids),
        cmocka_unit_test(test_traits_compute_support),
        cmocka_unit_test(test_row_size),
        cmocka_unit_test(test_fp16_all_patterns),
        cmocka_unit_test(test_fp16_rounding),
        cmocka_unit_test(test_fp16_vs_compiler),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_q4_0_known),
        cmocka_unit_test(test_q4_0_not_fused),
        cmocka_unit_test(test_q4_1_known),
        cmocka_unit_test(test_q5_known),
        cmocka_unit_test(test_q8_rounding),
        cmocka_unit_test(test_q8_0_edges_match_plain_loop),
        cmocka_unit_test(test_round_trip_all_types),
        cmocka_unit_test(test_q8_1_sum),
        cmocka_unit_test(test_vec_dot_known),
        cmocka_unit_test(test_vec_dot_vs_oracle),
        cmocka_unit_test(test_float_activation_rounding),
        cmocka_unit_test(test_matmul_odd_sizes),
        cmocka_unit_test(test_matmul_many_equals_one_by_one),
        cmocka_unit_test(test_get_row),
        cmocka_unit_test(test_get_row_packed),
    };
    return sb_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
