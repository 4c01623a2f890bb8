/*
 * test_kernels.c - the kernel dispatch table: every ISA level this CPU runs
 * must give the scalar level's bytes (memcmp, not a tolerance) for every
 * gemm weight type and activation conversion, on random data with extreme
 * scales, zero blocks and rounding ties, odd sizes, odd strides and every
 * tile shape of the prompt paths; and SB_CPU must cap the level chosen.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "switchboard.h"
#include "tensor/tensor-impl.h"
#include "tensor/kquants.h"
#include "tensor/tensor.h"
#include "testutil.h"

static const sb_type weight_types[] = {SB_TYPE_F32,  SB_TYPE_F16,  SB_TYPE_BF16, SB_TYPE_Q4_0, SB_TYPE_Q4_1,
                                       SB_TYPE_Q5_0, SB_TYPE_Q5_1, SB_TYPE_Q8_0, SB_TYPE_Q2_K, SB_TYPE_Q3_K,
                                       SB_TYPE_Q4_K, SB_TYPE_Q5_K, SB_TYPE_Q6_K, SB_TYPE_IQ4_NL, SB_TYPE_IQ4_XS};
static const sb_type act_types[] = {SB_TYPE_F32, SB_TYPE_F16, SB_TYPE_BF16, SB_TYPE_Q8_0, SB_TYPE_Q8_1, SB_TYPE_Q8_K};

/* Row lengths in the tests are given for 32-element blocks; a K-quant's
 * (256-element super-blocks) are 8 times longer. */
static int64_t blocks_of(sb_type t, int64_t n) {
    return sb_type_traits_of(t)->blck_size == SB_QK_K ? n * (SB_QK_K / SB_QK) : n;
}

/* Deterministic xorshift64* so failures reproduce. */
static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint64_t rng_u64(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static uint32_t rng_below(uint32_t n) { return (uint32_t)(rng_u64() >> 32) % n; }

/* Uniform in [-1, 1). */
static float rng_unit(void) { return (float)((double)(rng_u64() >> 11) * 0x1p-52 - 1.0); }

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static void put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, sizeof(v)); }

/* An F16 scale: mostly ordinary, sometimes huge, tiny (subnormal), zero or
 * negative, so products and sums cover every rounding regime without
 * overflowing. */
static uint16_t rng_scale(void) {
    switch (rng_below(8)) {
    case 0: return 0;                                                 /* zero */
    case 1: return (uint16_t)(1 + rng_below(0x3ff));                 /* subnormal */
    case 2: return (uint16_t)(0x6000 + rng_below(0x1000));           /* 512 .. 4096 */
    case 3: return (uint16_t)(0x8000 | (0x2000 + rng_below(0x1800))); /* negative */
    default: return (uint16_t)(0x1c00 + rng_below(0x2400));          /* ~2^-8 .. 2^1 */
    }
}

/* ---- data ------------------------------------------------------------- */

static size_t row_size(sb_type t, int64_t n) {
    size_t s = sb_type_row_size(t, n);
    assert_true(s > 0);
    return s;
}

/* Fills nrows rows (stride bytes apart) of type t with random content that
 * is valid input for the kernels. Activations (act = true) of Q8 types keep
 * quants in [-127, 127], the contract of sb_gemm_fn. */
static void fill_rows(sb_type t, bool act, int64_t n, int64_t nrows, uint8_t *p, size_t stride) {
    const sb_type_traits *tr = sb_type_traits_of(t);
    for (int64_t r = 0; r < nrows; r++, p += stride) {
        const int mode = (int)rng_below(8);
        if (t == SB_TYPE_F32) {
            for (int64_t i = 0; i < n; i++) {
                float v = rng_unit() * ldexpf(1.0f, (int)rng_below(40) - 20);
                if (mode == 0 && rng_below(4) == 0)
                    v = 0.0f;
                if (mode == 1) /* small integers: many exact products and ties */
                    v = (float)((int)rng_below(9) - 4) * 0.5f;
                memcpy(p + 4 * i, &v, 4);
            }
        } else if (t == SB_TYPE_F16) {
            for (int64_t i = 0; i < n; i++) /* every finite F16, subnormals included */
                put_u16(p + 2 * i, (uint16_t)(mode == 0 ? 0x3c00 + rng_below(0x400) : rng_below(0x10000) % 0x7c00 |
                                                                                           (rng_below(2) << 15)));
        } else if (t == SB_TYPE_BF16) {
            for (int64_t i = 0; i < n; i++) { /* exponents within +-60, and subnormals */
                uint16_t e = mode == 0 ? 0 : (uint16_t)(67 + rng_below(120));
                put_u16(p + 2 * i, (uint16_t)(rng_below(2) << 15 | e << 7 | rng_below(128)));
            }
        } else if (t == SB_TYPE_Q8_K || (act && mode == 0)) {
            /* What matmul feeds the kernels: converted floats. */
            float *src = malloc((size_t)n * sizeof(float));
            /* Q8_K (its bsums must match its quants): also varied scales and zero blocks */
            for (int64_t i = 0; i < n; i++)
                src[i] = mode == 1 && i < 256 ? 0.0f : rng_unit() * (mode == 0 ? 3.0f : ldexpf(1.0f, mode * 6 - 20));
            tr->act_from_float(src, p, n);
            free(src);
        } else if (tr->blck_size == SB_QK_K) { /* K-quant weights: random bytes, then F16 d (and dmin) */
            for (int64_t b = 0; b < n / SB_QK_K; b++) {
                uint8_t *blk = p + (size_t)b * tr->type_size;
                for (uint32_t i = 0; i < tr->type_size; i++)
                    blk[i] = (uint8_t)rng_u64();
                switch (t) {
                case SB_TYPE_Q2_K:
                    put_u16(blk + offsetof(sb_block_q2_K, d), rng_scale());
                    put_u16(blk + offsetof(sb_block_q2_K, dmin), rng_scale());
                    break;
                case SB_TYPE_Q3_K: put_u16(blk + offsetof(sb_block_q3_K, d), rng_scale()); break;
                case SB_TYPE_Q6_K: put_u16(blk + offsetof(sb_block_q6_K, d), rng_scale()); break;
                default: /* Q4_K, Q5_K */
                    put_u16(blk, rng_scale());
                    put_u16(blk + 2, rng_scale());
                }
            }
        } else {
            for (int64_t b = 0; b < n / SB_QK; b++) {
                uint8_t *blk = p + (size_t)b * tr->type_size;
                for (uint32_t i = 0; i < tr->type_size; i++)
                    blk[i] = (uint8_t)rng_u64();
                put_u16(blk, rng_scale());
                if (t == SB_TYPE_Q4_1 || t == SB_TYPE_Q5_1 || t == SB_TYPE_Q8_1)
                    put_u16(blk + 2, rng_scale());
                const size_t qs = t == SB_TYPE_Q8_1 ? 4 : 2;
                if (rng_below(10) == 0) /* a zero block */
                    memset(blk + (t == SB_TYPE_Q8_0 || t == SB_TYPE_Q8_1 ? qs : 2), 0,
                           tr->type_size - (t == SB_TYPE_Q8_0 || t == SB_TYPE_Q8_1 ? qs : 2));
                if (act) /* activation quants stay in [-127, 127] */
                    for (size_t i = qs; i < tr->type_size; i++)
                        if (blk[i] == 0x80)
                            blk[i] = 0x81;
            }
        }
    }
}

/* ---- gemm ------------------------------------------------------------- */

/* The SIMD levels this CPU runs, plus the AVX-512 level as a CPU without
 * GFNI gets it where this one has GFNI (its packed Q4_0 gemm unpacks
 * nibbles without), into out[]; returns how many. The tests below compare
 * each with the scalar level. */
#define SIMD_MAX (SB_CPU_LEVEL_COUNT + 1)
static int simd_levels(const sb_kernels *out[SIMD_MAX]) {
    static sb_kernels no_gfni;
    int n = 0;
    for (int lv = SB_CPU_AVX2; lv < SB_CPU_LEVEL_COUNT; lv++)
        if (sb_kernels_for((sb_cpu_level)lv))
            out[n++] = sb_kernels_for((sb_cpu_level)lv);
#if defined(__x86_64__)
    const sb_kernels *avx512 = sb_kernels_for(SB_CPU_AVX512);
    if (avx512 && avx512->gfni) {
        no_gfni = *sb_kernels_for(SB_CPU_SCALAR);
        no_gfni.level = SB_CPU_AVX512;
        sb__kernels_fill_avx512(&no_gfni);
        out[n++] = &no_gfni;
    }
#endif
    return n;
}

/* Says (as a skip) which kernels this CPU cannot compare with the scalar
 * level: a missing SIMD level, or the AVX-512 level's GFNI variant. */
static void test_levels_compared(void **state) {
    (void)state;
    char missing[128] = "";
    for (int lv = SB_CPU_AVX2; lv < SB_CPU_LEVEL_COUNT; lv++)
        if (!sb_kernels_for((sb_cpu_level)lv))
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s", missing[0] ? ", " : "",
                     sb_cpu_level_name((sb_cpu_level)lv));
    const sb_kernels *avx512 = sb_kernels_for(SB_CPU_AVX512);
    if (avx512 && !avx512->gfni)
        snprintf(missing, sizeof missing, "the AVX-512 level's GFNI packed Q4_0 gemm (no GFNI)");
    if (missing[0]) {
        char why[200];
        snprintf(why, sizeof why, "this CPU cannot run these kernels, not compared: %s", missing);
        SB_TEST_SKIP(why);
    }
}


/* k's gemm for the type, or with `packed` its packed layout's (weights
 * packed from contiguous rows, activation rows followed by the layout's
 * terms), against the scalar gemm on the rows. */
static bool check_gemm_as(const sb_kernels *k, const sb_kernels *ref, sb_type type, bool packed, int64_t n, int64_t nr,
                          int64_t nt) {
    n = blocks_of(type, n);
    const sb_type xt = sb_type_traits_of(type)->vec_dot_type;
    const sb_packing *p = &k->packing[type];
    const size_t x_plain = row_size(xt, n);
    const size_t terms = packed ? (size_t)(n / sb_type_traits_of(type)->blck_size) * p->term_bytes : 0;
    /* Odd strides: rows not aligned, and a gap between them (packing takes
     * contiguous rows). K-quant blocks are C structs with F16 fields and
     * Q8_K's float: their rows keep 2- and 4-byte alignment, as in files
     * and in matmul's buffers. */
    const bool kq = sb_type_traits_of(type)->blck_size == SB_QK_K;
    const size_t off = kq ? 4 : 1;
    const size_t ws = row_size(type, n) + (packed ? 0 : kq ? 2 : 3), xs = x_plain + terms + (kq ? 4 : 5);
    const size_t ldy = (size_t)nr + 2;
    uint8_t *w = malloc(ws * (size_t)nr + off), *x = malloc(xs * (size_t)nt + off);
    uint8_t *wp = packed ? malloc(ws * (size_t)nr) : NULL;
    const size_t ny = ldy * (size_t)nt;
    float *y0 = malloc(ny * sizeof(float)), *y1 = malloc(ny * sizeof(float));
    fill_rows(type, false, n, nr, w + off, ws);
    fill_rows(xt, true, n, nt, x + off, xs);
    for (int64_t t = 0; packed && p->terms && t < nt; t++)
        p->terms(x + off + (size_t)t * xs, n, x + off + (size_t)t * xs + x_plain);
    memset(y0, 0x5a, ny * sizeof(float));
    memset(y1, 0x5a, ny * sizeof(float)); /* the gaps must stay untouched */
    ref->gemm[type](n, w + off, ws, nr, x + off, xs, nt, y0, ldy);
    if (packed) {
        p->pack(w + off, wp, n, nr);
        p->gemm(n, wp, ws, nr, x + off, xs, nt, y1, ldy);
    } else {
        k->gemm[type](n, w + off, ws, nr, x + off, xs, nt, y1, ldy);
    }
    bool same = memcmp(y0, y1, ny * sizeof(float)) == 0;
    if (!same) {
        for (size_t i = 0; i < ny; i++)
            if (memcmp(&y0[i], &y1[i], sizeof(float)) != 0) {
                print_error("%s %s%s n=%lld nr=%lld nt=%lld: y[t=%zu][r=%zu] = %.9g, scalar %.9g\n",
                            sb_cpu_level_name(k->level), sb_type_traits_of(type)->name, packed ? " packed" : "",
                            (long long)n, (long long)nr, (long long)nt, i / ldy, i % ldy, (double)y1[i],
                            (double)y0[i]);
                break;
            }
    }
    free(w);
    free(wp);
    free(x);
    free(y0);
    free(y1);
    return same;
}

static bool check_gemm(const sb_kernels *k, const sb_kernels *ref, sb_type type, int64_t n, int64_t nr, int64_t nt) {
    return check_gemm_as(k, ref, type, false, n, nr, nt);
}

/* Packed layouts: every level's, for each token count of a batched pass and
 * its remainders, one to three groups (tiles of one group and of pairs),
 * odd and even blocks per row. */
static void test_packed_gemm_matches_scalar(void **state) {
    (void)state;
    static const int64_t ns[] = {32, 96, 288, 1056};
    const sb_kernels *ref = sb_kernels_for(SB_CPU_SCALAR);
    int failures = 0, checked = 0;
    assert_int_equal(ref->packing[SB_TYPE_Q4_0].rows, 0); /* the scalar level packs nothing */
    const sb_kernels *simd[SIMD_MAX];
    for (int l = 0, n_simd = simd_levels(simd); l < n_simd; l++) {
        const sb_kernels *k = simd[l];
        for (uint32_t type = 0; type < SB_TYPE_COUNT; type++) {
            const sb_packing *p = &k->packing[type];
            if (p->rows == 0)
                continue;
            assert_non_null(p->pack);
            assert_non_null(p->gemm);
            for (int64_t nt = 1; nt <= 18; nt++)
                for (size_t c = 0; c < sizeof(ns) / sizeof(ns[0]); c++, checked++)
                    failures += !check_gemm_as(k, ref, (sb_type)type, true, ns[c], p->rows * (1 + (nt + c) % 3), nt);
            failures += !check_gemm_as(k, ref, (sb_type)type, true, 2048, p->rows * 2, 40);
            /* a prompt: several token blocks of whole tile passes (the AMX level's sweeps), and a rest */
            failures += !check_gemm_as(k, ref, (sb_type)type, true, 768, p->rows * 2, 600);
        }
    }
    if (checked == 0)
        print_message("no packed layout on this CPU\n");
    assert_int_equal(failures, 0);
}

/* While a model larger than the last-level cache is loaded (on Intel), the
 * single-token tiles prefetch for weights that stream from DRAM: the same
 * results, and unloading it ends that. */
static void test_packed_decode_from_dram(void **state) {
    (void)state;
    const int before = atomic_load(&sb__decode_from_dram);
    sb_kernels_weights_loaded(SIZE_MAX);
    const sb_kernels *ref = sb_kernels_for(SB_CPU_SCALAR), *simd[SIMD_MAX];
    int failures = 0;
    for (int l = 0, n_simd = simd_levels(simd); l < n_simd; l++)
        for (uint32_t type = 0; type < SB_TYPE_COUNT; type++)
            if (simd[l]->packing[type].rows > 0)
                failures += !check_gemm_as(simd[l], ref, (sb_type)type, true, 2048,
                                           simd[l]->packing[type].rows * 3, 1);
    sb_kernels_weights_unloaded(SIZE_MAX);
    assert_int_equal(atomic_load(&sb__decode_from_dram), before);
    assert_int_equal(failures, 0);
}

/* A layout packs each group of rows in place of its rows (sb_weight_pack's
 * contract, which lets a load pack a matrix a slice at a time): packing the
 * groups one by one gives the whole matrix's bytes. And its row_block gives
 * back every block of every row as it was before packing (a tied embedding
 * table's lookups read the packed copy). Odd and even block counts. */
static void test_packing_layout(void **state) {
    (void)state;
    const sb_kernels *simd[SIMD_MAX];
    int checked = 0;
    for (int l = 0, n_simd = simd_levels(simd); l < n_simd; l++)
        for (uint32_t type = 0; type < SB_TYPE_COUNT; type++) {
            const sb_packing *p = &simd[l]->packing[type];
            if (p->rows == 0)
                continue;
            assert_non_null(p->row_block);
            const sb_type_traits *t = sb_type_traits_of(type);
            static const int64_t block_counts[] = {1, 4, 9};
            for (size_t c = 0; c < sizeof(block_counts) / sizeof(block_counts[0]); c++) {
                const int64_t blocks = block_counts[c], n = (int64_t)t->blck_size * blocks, nr = 3 * (int64_t)p->rows;
                const size_t ws = row_size((sb_type)type, n), group = ws * (size_t)p->rows;
                uint8_t *w = malloc(ws * (size_t)nr), *whole = malloc(ws * (size_t)nr), *sliced = malloc(ws * (size_t)nr);
                uint8_t block[256];
                fill_rows((sb_type)type, false, n, nr, w, ws);
                p->pack(w, whole, n, nr);
                for (int64_t g = 0; g < 3; g++)
                    p->pack(w + (size_t)g * group, sliced + (size_t)g * group, n, p->rows);
                assert_memory_equal(whole, sliced, ws * (size_t)nr);
                for (int64_t r = 0; r < nr; r++)
                    for (int64_t b = 0; b < blocks; b++) {
                        p->row_block(whole + (size_t)(r / p->rows) * group, n, (int)(r % p->rows), b, block);
                        assert_memory_equal(block, w + (size_t)r * ws + (size_t)b * t->type_size, t->type_size);
                    }
                free(w);
                free(whole);
                free(sliced);
                checked++;
            }
        }
    if (checked == 0)
        print_message("no packed layout on this CPU\n");
}

static void test_gemm_matches_scalar(void **state) {
    (void)state;
    static const int64_t ns[] = {32, 96, 160, 1056};
    static const int64_t float_ns[] = {1, 7, 63, 64, 65, 128, 200, 256};
    static const int64_t nrs[] = {1, 2, 3, 5, 17};
    static const int64_t nts[] = {1, 2, 3, 5, 13};
    const sb_kernels *ref = sb_kernels_for(SB_CPU_SCALAR);
    int failures = 0;
    const sb_kernels *simd[SIMD_MAX];
    const int n_simd = simd_levels(simd);
    for (int l = 0; l < n_simd; l++) {
        const sb_kernels *k = simd[l];
        for (size_t ti = 0; ti < sizeof(weight_types) / sizeof(weight_types[0]); ti++) {
            const sb_type type = weight_types[ti];
            const bool is_float = sb_type_traits_of(type)->blck_size == 1;
            assert_non_null(k->gemm[type]);
            for (size_t a = 0; a < sizeof(nrs) / sizeof(nrs[0]); a++)
                for (size_t b = 0; b < sizeof(nts) / sizeof(nts[0]); b++) {
                    for (size_t c = 0; c < sizeof(ns) / sizeof(ns[0]); c++)
                        failures += !check_gemm(k, ref, type, ns[c], nrs[a], nts[b]);
                    if (is_float)
                        for (size_t c = 0; c < sizeof(float_ns) / sizeof(float_ns[0]); c++)
                            failures += !check_gemm(k, ref, type, float_ns[c], nrs[a], nts[b]);
                }
            /* The tile shapes' larger cases: decode and prompt sizes; for
             * floats attention's (head-sized rows, a KV block's 16 keys,
             * a group's 32 queries). */
            failures += !check_gemm(k, ref, type, 2048, 9, 1);
            failures += !check_gemm(k, ref, type, 512, 8, 16);
            if (is_float)
                failures += !check_gemm(k, ref, type, 64, 16, 32) + !check_gemm(k, ref, type, 128, 33, 32);
        }
    }
    if (n_simd == 0)
        print_message("no SIMD level on this CPU; only the scalar level is tested\n");
    assert_int_equal(failures, 0);
}

/* Every tile shape and remainder of the batched paths (AVX-512: 8-row
 * tiles passed by 4 tokens at a time for the block formats, 4 x 6 tiles for
 * F16/BF16, token groups): each nt from 1 to 40 with each nr from 1 to 17,
 * on short rows; a few long rows (several token groups, one with a partial
 * pass, several sweeps of the float lanes, a float tail) on top. */
static void test_gemm_tile_shapes(void **state) {
    (void)state;
    const sb_kernels *ref = sb_kernels_for(SB_CPU_SCALAR);
    int failures = 0;
    const sb_kernels *simd[SIMD_MAX];
    for (int l = 0, n_simd = simd_levels(simd); l < n_simd; l++) {
        const sb_kernels *k = simd[l];
        for (size_t ti = 0; ti < sizeof(weight_types) / sizeof(weight_types[0]); ti++) {
            const sb_type type = weight_types[ti];
            if (type == SB_TYPE_F32)
                continue; /* no prompt path of its own */
            const bool is_float = sb_type_traits_of(type)->blck_size == 1;
            for (int64_t nt = 1; nt <= 40; nt++)
                for (int64_t nr = 1; nr <= 17; nr++)
                    failures += !check_gemm(k, ref, type, is_float ? 70 : 64, nr, nt);
            failures += !check_gemm(k, ref, type, 4096, 24, 37);
            failures += !check_gemm(k, ref, type, is_float ? 1090 : 1088, 9, 40);
            if (sb_type_traits_of(type)->blck_size == SB_QK_K)
                continue; /* no token groups; rows 8x longer would only slow the sanitizer run */
            failures += !check_gemm(k, ref, type, 16384, 17, 5);
            failures += !check_gemm(k, ref, type, 16384, 9, 45); /* block formats: token groups of 20 */
        }
    }
    assert_int_equal(failures, 0);
}

/* The scalar level's gemm is vec_dot per output. */
static void test_scalar_gemm_is_vec_dot(void **state) {
    (void)state;
    const sb_kernels *ref = sb_kernels_for(SB_CPU_SCALAR);
    assert_non_null(ref);
    assert_int_equal(ref->level, SB_CPU_SCALAR);
    for (size_t ti = 0; ti < sizeof(weight_types) / sizeof(weight_types[0]); ti++) {
        const sb_type type = weight_types[ti];
        const sb_type_traits *t = sb_type_traits_of(type);
        const int64_t n = blocks_of(type, 160), nr = 3, nt = 2;
        const size_t ws = row_size(type, n), xs = row_size(t->vec_dot_type, n);
        uint8_t *w = malloc(ws * nr), *x = malloc(xs * nt);
        float y[6];
        fill_rows(type, false, n, nr, w, ws);
        fill_rows(t->vec_dot_type, true, n, nt, x, xs);
        ref->gemm[type](n, w, ws, nr, x, xs, nt, y, nr);
        for (int r = 0; r < nr; r++)
            for (int tk = 0; tk < nt; tk++) {
                const float want = t->vec_dot(n, w + r * ws, x + tk * xs);
                assert_memory_equal(&y[tk * nr + r], &want, sizeof(float));
            }
        free(w);
        free(x);
    }
}

/* ---- activation conversion ------------------------------------------- */

/* Floats that stress each converter: Q8 ties (amax = 127 makes the scale 1,
 * so k + 0.5 is an exact tie), zero blocks, huge and tiny blocks; for F16
 * and BF16 also halfway cases, overflow, subnormals, infinities and NaNs. */
static void fill_floats(sb_type t, float *v, int64_t n) {
    const bool q8 = t == SB_TYPE_Q8_0 || t == SB_TYPE_Q8_1 || t == SB_TYPE_Q8_K;
    for (int64_t b = 0; b < n; b += 32) {
        const int mode = (int)rng_below(8);
        const int64_t end = b + 32 < n ? b + 32 : n;
        const float scale = ldexpf(1.0f, (int)rng_below(200) - 100);
        for (int64_t i = b; i < end; i++) {
            float f = rng_unit();
            switch (mode) {
            case 0: f = 0.0f; break;
            case 1: f = (float)((int)rng_below(254) - 127) + 0.5f; break;
            case 2: f *= scale; break;
            case 3: f = float_of((uint32_t)rng_u64()); break; /* any bits */
            case 4: f = float_of((uint32_t)(rng_u64() & 0x807fffff)); break; /* float subnormals */
            case 5: f = float_of(0x33000000u + (uint32_t)rng_below(0x0b000000)); break; /* F16 subnormal..max range */
            default: f *= 100.0f; break;
            }
            /* Q8 blocks stay finite, and their amax above 127/FLT_MAX: below
             * it the reference's scale 127/amax is infinite and its float
             * to int8 conversion undefined (UBSan stops there). */
            if (q8 && (!isfinite(f) || mode == 4))
                f = 1.0f;
            if (mode == 6 && !q8) /* halfway between F16 (or BF16) neighbours */
                f = float_of(t == SB_TYPE_F16 ? (bits_of(f) & ~0x1fffu) | 0x1000u : (bits_of(f) & ~0xffffu) | 0x8000u);
            v[i] = f;
        }
        if (mode == 1 && q8 && end - b == 32)
            v[b + rng_below(32)] = rng_below(2) ? 127.0f : -127.0f; /* amax 127: scale 1, exact ties */
    }
}

static void test_act_matches_scalar(void **state) {
    (void)state;
    static const int64_t ns[] = {32, 96, 160, 1056};
    static const int64_t float_ns[] = {1, 7, 8, 15, 17, 33};
    const sb_kernels *ref = sb_kernels_for(SB_CPU_SCALAR);
    int failures = 0;
    const sb_kernels *simd[SIMD_MAX];
    for (int l = 0, n_simd = simd_levels(simd); l < n_simd; l++) {
        const sb_kernels *k = simd[l];
        for (size_t ti = 0; ti < sizeof(act_types) / sizeof(act_types[0]); ti++) {
            const sb_type t = act_types[ti];
            assert_non_null(k->act_from_float[t]);
            const bool is_float = sb_type_traits_of(t)->blck_size == 1;
            for (int rep = 0; rep < 20; rep++)
                for (size_t c = 0; c < 10; c++) {
                    if (c >= 4 && !is_float)
                        break;
                    const int64_t n = c < 4 ? blocks_of(t, ns[c]) : float_ns[c - 4];
                    const size_t size = row_size(t, n);
                    float *src = malloc((size_t)n * sizeof(float));
                    uint8_t *a = malloc(size), *b = malloc(size);
                    fill_floats(t, src, n);
                    ref->act_from_float[t](src, a, n);
                    k->act_from_float[t](src, b, n);
                    if (memcmp(a, b, size) != 0) {
                        for (size_t i = 0; i < size; i++)
                            if (a[i] != b[i]) {
                                print_error("%s act %s n=%lld: byte %zu is %02x, scalar %02x\n",
                                            sb_cpu_level_name(k->level), sb_type_traits_of(t)->name, (long long)n,
                                            i, b[i], a[i]);
                                break;
                            }
                        failures++;
                    }
                    free(src);
                    free(a);
                    free(b);
                }
        }
    }
    assert_int_equal(failures, 0);
}

/* The KV cache's element types, which axpy and store_rows serve. */
static const sb_type kv_types[] = {SB_TYPE_F32, SB_TYPE_F16, SB_TYPE_Q8_0};

/* The weighted sum of rows (F32, F16 and Q8_0 rows): every level gives the
 * scalar bytes, for row lengths around the vector widths and the 4-vector
 * stride (multiples of 32 for Q8_0), runs of 1 to 40 rows with a gap between
 * them, and values whose products round. */
static void test_axpy_matches_scalar(void **state) {
    (void)state;
    static const int64_t ns[] = {1, 7, 8, 16, 31, 32, 64, 65, 80, 96, 128, 200, 256};
    enum { MAXN = 256, MAXR = 40, GAP = 3 * 34 };
    const size_t stride = (MAXN / 32) * 34 * 4 + GAP; /* room for the widest (F32) row, then a gap */
    float *xf = malloc(sizeof(float) * MAXN), a[MAXR], y0[MAXN], y1[MAXN], start[MAXN];
    uint8_t *x = malloc(stride * MAXR);
    for (int r = 0; r < MAXR; r++)
        a[r] = rng_unit();
    for (int i = 0; i < MAXN; i++)
        start[i] = rng_unit() * 4.0f;
    const sb_kernels *ref = sb_kernels_for(SB_CPU_SCALAR);
    int failures = 0;
    const sb_kernels *simd[SIMD_MAX];
    for (size_t t = 0; t < sizeof(kv_types) / sizeof(kv_types[0]); t++) {
        const sb_type type = kv_types[t];
        const sb_type_traits *tr = sb_type_traits_of(type);
        for (int r = 0; r < MAXR; r++) { /* rows of the type, from floats over 20 binades */
            for (int i = 0; i < MAXN; i++)
                xf[i] = rng_unit() * ldexpf(1.0f, (int)rng_below(20) - 10);
            tr->from_float(xf, x + (size_t)r * stride, MAXN);
        }
        for (int l = 0, n_simd = simd_levels(simd); l < n_simd; l++)
            for (size_t c = 0; c < sizeof(ns) / sizeof(ns[0]); c++)
                for (int64_t nr = 1; nr <= MAXR; nr += nr < 4 ? 1 : 9) {
                    const sb_kernels *k = simd[l];
                    const int64_t n = ns[c];
                    if (n % tr->blck_size != 0)
                        continue;
                    memcpy(y0, start, sizeof(y0));
                    memcpy(y1, start, sizeof(y1));
                    ref->axpy[type](n, nr, a, x, stride, y0);
                    k->axpy[type](n, nr, a, x, stride, y1);
                    if (memcmp(y0, y1, sizeof(y0)) != 0) {
                        print_error("%s axpy %s n=%lld rows=%lld differs from scalar\n", sb_cpu_level_name(k->level),
                                    tr->name, (long long)n, (long long)nr);
                        failures++;
                    }
                }
    }
    free(xf);
    free(x);
    assert_int_equal(failures, 0);
}

/* Rows stored into a strided destination, converted as the type's
 * act_from_float does: the same bytes at every level, with aligned rows
 * (F32: streamed) and unaligned ones, and nothing between the rows written. */
static void test_store_rows_matches_scalar(void **state) {
    (void)state;
    enum { MAXN = 128, NR = 5, STRIDE = 3 * MAXN * 4, BYTES = STRIDE * NR + 64 };
    float *src = malloc(sizeof(float) * MAXN * NR);
    uint8_t *mem0 = aligned_alloc(64, BYTES), *mem1 = aligned_alloc(64, BYTES), *want = malloc(MAXN * 4);
    for (int i = 0; i < MAXN * NR; i++)
        src[i] = rng_unit() * ldexpf(1.0f, (int)rng_below(40) - 20);
    const sb_kernels *ref = sb_kernels_for(SB_CPU_SCALAR);
    static const int64_t ns[] = {1, 8, 16, 32, 64, 80, 128};
    const sb_kernels *simd[SIMD_MAX];
    for (int l = 0, n_simd = simd_levels(simd); l < n_simd; l++)
        for (size_t t = 0; t < sizeof(kv_types) / sizeof(kv_types[0]); t++) {
            const sb_kernels *k = simd[l];
            const sb_type type = kv_types[t];
            const sb_type_traits *tr = sb_type_traits_of(type);
            for (size_t c = 0; c < sizeof(ns) / sizeof(ns[0]); c++)
                for (int misalign = 0; misalign <= 1; misalign++) {
                    const int64_t n = ns[c];
                    if (n % tr->blck_size != 0)
                        continue;
                    const size_t stride = misalign ? STRIDE + 2 : STRIDE;
                    memset(mem0, 0x5a, BYTES);
                    memset(mem1, 0x5a, BYTES);
                    ref->store_rows[type](n, NR, src, mem0 + 2 * misalign, stride);
                    k->store_rows[type](n, NR, src, mem1 + 2 * misalign, stride);
                    assert_memory_equal(mem0, mem1, BYTES);
                    /* Row 1 holds src's row 1, converted. */
                    tr->act_from_float(src + n, want, n);
                    assert_memory_equal(mem1 + 2 * misalign + stride, want, sb_type_row_size(type, n));
                }
        }
    free(src);
    free(mem0);
    free(mem1);
    free(want);
}

/* SwiGLU: every level gives the scalar bytes (NaN for NaN), over the whole
 * float range, the saturation points of the exp and odd lengths; and the
 * scalar one is SiLU within the approximation's few ulps. */
static void test_swiglu_matches_scalar(void **state) {
    (void)state;
    enum { N = 4099 };
    static const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 87.0f, 88.5f, -88.5f, 103.9f, -103.9f, 104.0f,
                                     -104.0f, 133.0f, -133.0f, 140.0f, -140.0f, 1e30f, -1e30f, 1e-40f, -1e-40f,
                                     INFINITY, -INFINITY, NAN};
    float *g = malloc(N * sizeof(float)), *up = malloc(N * sizeof(float));
    float *want = malloc(N * sizeof(float)), *got = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) {
        const size_t ns = sizeof(specials) / sizeof(specials[0]);
        g[i] = i < (int)ns ? specials[i] : ldexpf(rng_unit(), (int)rng_below(48) - 40);
        if (i % 5 == 0 && i >= (int)ns)
            g[i] = rng_unit() * 200.0f;
        up[i] = i % 7 == 0 ? 1.0f : rng_unit() * 4.0f;
    }
    const sb_kernels *ref = sb_kernels_for(SB_CPU_SCALAR);
    memcpy(want, g, N * sizeof(float));
    ref->swiglu(N, want, up);
    for (int i = 0; i < N; i++) {
        const double x = g[i], silu = x / (1.0 + exp(-x));
        if (isfinite(x) && fabs(x) < 80.0 && fabs(silu) > 1e-30)
            assert_true(fabs(want[i] / up[i] - silu) <= 1e-6 * fabs(silu));
    }
    int failures = 0;
    const sb_kernels *simd[SIMD_MAX];
    for (int l = 0, n_simd = simd_levels(simd); l < n_simd; l++) {
        const sb_kernels *k = simd[l];
        for (int n = N - 16; n <= N; n++) {
            memcpy(got, g, N * sizeof(float));
            k->swiglu(n, got, up);
            for (int i = 0; i < n; i++)
                if (!(isnan(got[i]) && isnan(want[i])) && bits_of(got[i]) != bits_of(want[i])) {
                    print_error("%s swiglu(%a, %a) = %a, scalar %a\n", sb_cpu_level_name(k->level), (double)g[i],
                                (double)up[i], (double)got[i], (double)want[i]);
                    failures++;
                    break;
                }
            if (n < N) /* nothing past n written */
                assert_true(bits_of(got[n]) == bits_of(g[n]));
        }
    }
    free(g);
    free(up);
    free(want);
    free(got);
    assert_int_equal(failures, 0);
}

/* Attention's softmax: every level gives the scalar bytes for every length
 * around the vector widths (whole vectors and padded tails), and the
 * scalar one is the softmax within a few ulps of its float arguments. */
static void test_softmax_matches_scalar(void **state) {
    (void)state;
    enum { N = 300 };
    float x[N], want[N], got[N];
    for (int i = 0; i < N; i++)
        x[i] = rng_unit() * (i % 3 == 0 ? 40.0f : 4.0f);
    const sb_kernels *ref = sb_kernels_for(SB_CPU_SCALAR);
    int failures = 0;
    const sb_kernels *simd[SIMD_MAX];
    const int n_simd = simd_levels(simd);
    for (int n = 1; n <= N; n += n < 40 ? 1 : 37) {
        memcpy(want, x, sizeof(x));
        ref->softmax(n, want);
        double max = x[0], sum = 0.0;
        for (int i = 1; i < n; i++)
            max = x[i] > max ? x[i] : max;
        for (int i = 0; i < n; i++)
            sum += exp((double)x[i] - max);
        for (int i = 0; i < n; i++) {
            const double p = exp((double)x[i] - max) / sum;
            /* x - max is rounded to float first: |x - max| ulps of 2^-24 more. */
            const double tol = 1e-6 + fabs((double)x[i] - max) * 0x1p-23;
            assert_true(fabs(want[i] - p) <= tol * p + 1e-37);
        }
        for (int l = 0; l < n_simd; l++) {
            memcpy(got, x, sizeof(x));
            simd[l]->softmax(n, got);
            if (memcmp(got, want, (size_t)n * sizeof(float)) != 0 ||
                memcmp(got + n, x + n, (size_t)(N - n) * sizeof(float)) != 0) {
                print_error("%s softmax n=%d differs from scalar\n", sb_cpu_level_name(simd[l]->level), n);
                failures++;
            }
        }
    }
    assert_int_equal(failures, 0);
}

/* ---- level selection -------------------------------------------------- */

/* The child's log callback: one line on stderr, marked as the callback's. */
static void log_to_stderr(void *user, int level, const char *line) {
    (void)user;
    fprintf(stderr, "log %d: %s\n", level, line);
}

/* Runs sb_kernels_active() in a child with SB_CPU set to value; returns the
 * level it chose and whether it warned through the log callback. Anything
 * the library wrote to stderr itself fails the test. */
static int level_in_child(const char *value, bool *warned) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        setenv("SB_CPU", value, 1);
        sb_set_log_callback(log_to_stderr, NULL);
        _exit((int)sb_kernels_active()->level);
    }
    close(fds[1]);
    char buf[512];
    ssize_t got = read(fds[0], buf, sizeof(buf) - 1);
    close(fds[0]);
    if (got > 0) {
        buf[got] = '\0';
        char want[32];
        snprintf(want, sizeof(want), "log %d: SB_CPU=", SB_LOG_WARN);
        assert_true(strncmp(buf, want, strlen(want)) == 0);
        assert_true(strchr(buf, '\n') == buf + got - 1); /* one line, nothing else */
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    *warned = got > 0;
    return WEXITSTATUS(status);
}

/* Runs first: the children must fork before this process picks its table
 * (a child inherits the choice). */
static void test_level_selection(void **state) {
    (void)state;
    bool warned[SB_CPU_LEVEL_COUNT], warned_empty, warned_bogus;
    int forced[SB_CPU_LEVEL_COUNT];
    for (int lv = 0; lv < SB_CPU_LEVEL_COUNT; lv++)
        forced[lv] = level_in_child(sb_cpu_level_name((sb_cpu_level)lv), &warned[lv]);
    const int plain = level_in_child("", &warned_empty);
    const int bogus = level_in_child("sse9", &warned_bogus);

    int best = SB_CPU_SCALAR;
    for (int lv = 0; lv < SB_CPU_LEVEL_COUNT; lv++) {
        const sb_kernels *k = sb_kernels_for((sb_cpu_level)lv);
        if (k) {
            assert_int_equal(k->level, lv);
            assert_true(lv == best + 1 || lv == 0); /* levels are cumulative */
            best = lv;
        }
    }
    assert_null(sb_kernels_for(SB_CPU_LEVEL_COUNT));
    assert_string_equal(sb_cpu_level_name(SB_CPU_SCALAR), "scalar");
    assert_string_equal(sb_cpu_level_name(SB_CPU_AVX2), "avx2");
    assert_string_equal(sb_cpu_level_name(SB_CPU_AVX512), "avx512");
    assert_string_equal(sb_cpu_level_name(SB_CPU_LEVEL_COUNT), "?");
    const char *env = getenv("SB_CPU");
    if (!env || !*env)
        assert_int_equal(sb_kernels_active()->level, best);

    /* A level the CPU runs is taken silently; one above it warns and falls
     * back to the best; so does an unknown name; empty means no cap. */
    for (int lv = 0; lv < SB_CPU_LEVEL_COUNT; lv++) {
        assert_int_equal(forced[lv], lv <= best ? lv : best);
        assert_int_equal(warned[lv], lv > best);
    }
    assert_int_equal(plain, best);
    assert_false(warned_empty);
    assert_int_equal(bogus, best);
    assert_true(warned_bogus);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_level_selection),
        cmocka_unit_test(test_scalar_gemm_is_vec_dot),
        cmocka_unit_test(test_act_matches_scalar),
        cmocka_unit_test(test_swiglu_matches_scalar),
        cmocka_unit_test(test_softmax_matches_scalar),
        cmocka_unit_test(test_axpy_matches_scalar),
        cmocka_unit_test(test_store_rows_matches_scalar),
        cmocka_unit_test(test_gemm_matches_scalar),
        cmocka_unit_test(test_levels_compared),
        cmocka_unit_test(test_packed_gemm_matches_scalar),
        cmocka_unit_test(test_packed_decode_from_dram),
        cmocka_unit_test(test_packing_layout),
        cmocka_unit_test(test_gemm_tile_shapes),
    };
    return sb_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
