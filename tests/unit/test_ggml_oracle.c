/*
 * test_ggml_oracle.c - bit-exactness against llama.cpp's own ggml.
 *
 * Loads llama.cpp's libggml-base.so (from the npm package node-llama-cpp,
 * pinned version, see LLAMACPP-ORACLE.md) with dlopen and, for every block
 * and float format switchboard computes with, requires:
 *   - our from_float bytes == its quantize_row_<type>_ref bytes, and ==
 *     ggml_quantize_chunk's (what llama-quantize writes to files; only
 *     that for IQ4_NL, whose _ref skips the search for the scale);
 *   - our to_float floats == its dequantize_row_<type> floats, on its
 *     blocks and on blocks of random bytes.
 * If its x86 CPU backend (libggml-cpu-haswell.so) runs on this CPU, also:
 *   - our act_from_float bytes == its quantize_row_<type> (activation
 *     quantization as llama.cpp does it at every matmul);
 *   - our vec_dot == its ggml_vec_dot_<w>_<x>, to the bit (Q4_0, Q4_K: ==
 *     the gemv of its repacked layout, what it runs those matrices with);
 *     Q2_K, Q3_K, Q5_K and Q6_K, whose order is ours (Q4_K's repacked one,
 *     which llama.cpp's AVX2 backend does not run for them), Q8_0, Q4_1,
 *     Q5_0, Q5_1 and IQ4_NL (one integer sum per block, as Q4_0's and llama.cpp's
 *     AMX kernel), within the rounding of two float orders of the same exact
 *     integer sums.
 *
 * The library is found at $SB_GGML_BASE, else at
 * tests/npm/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so
 * under the source tree. Missing library = failure, with how to install it.
 */
#include <dlfcn.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tensor/kquants.h"
#include "tensor/tensor.h"
#include "testutil.h"

#define NPM_BINS "tests/npm/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"

/* ggml's signatures (ggml.h / ggml-quants.h / ggml-cpu). Type ids are ggml's, as ours. */
typedef void (*ggml_to_float_fn)(const void *x, float *y, int64_t k);
typedef void (*ggml_from_float_fn)(const float *x, void *y, int64_t k);
typedef size_t (*ggml_quantize_chunk_fn)(int type, const float *src, void *dst, int64_t start, int64_t nrows,
                                         int64_t n_per_row, const float *imatrix);
typedef void (*ggml_vec_dot_fn)(int n, float *s, size_t bs, const void *x, size_t bx, const void *y, size_t by,
                                int nrc);
/* ggml::cpu::repack::gemv<block, interleave, ...>: nc interleaved weight rows times one activation row. */
typedef void (*ggml_gemv_fn)(int n, float *s, size_t bs, const void *vx, const void *vy, int nr, int nc);

/* Every format switchboard converts, with ggml's names for its row functions. */
static const struct {
    sb_type type;
    const char *to_float;   /* ggml's dequantizer; NULL if it has none */
    const char *from_float; /* ggml's reference quantizer */
    bool chunk;             /* ggml_quantize_chunk handles it */
    bool chunk_only;        /* ggml's _ref is not what files get (IQ4_NL's searches no scale): ours is the chunk's */
} formats[] = {
    {SB_TYPE_F16, "ggml_fp16_to_fp32_row", "ggml_fp32_to_fp16_row", true, false},
    {SB_TYPE_BF16, "ggml_bf16_to_fp32_row", "ggml_fp32_to_bf16_row_ref", true, false},
    {SB_TYPE_Q4_0, "dequantize_row_q4_0", "quantize_row_q4_0_ref", true, false},
    {SB_TYPE_Q4_1, "dequantize_row_q4_1", "quantize_row_q4_1_ref", true, false},
    {SB_TYPE_Q5_0, "dequantize_row_q5_0", "quantize_row_q5_0_ref", true, false},
    {SB_TYPE_Q5_1, "dequantize_row_q5_1", "quantize_row_q5_1_ref", true, false},
    {SB_TYPE_Q8_0, "dequantize_row_q8_0", "quantize_row_q8_0_ref", true, false},
    {SB_TYPE_IQ4_NL, "dequantize_row_iq4_nl", "quantize_row_iq4_nl_ref", true, true},
    {SB_TYPE_Q8_1, NULL, "quantize_row_q8_1_ref", false, false},
    {SB_TYPE_Q2_K, "dequantize_row_q2_K", "quantize_row_q2_K_ref", true, false},
    {SB_TYPE_Q3_K, "dequantize_row_q3_K", "quantize_row_q3_K_ref", true, false},
    {SB_TYPE_Q4_K, "dequantize_row_q4_K", "quantize_row_q4_K_ref", true, false},
    {SB_TYPE_Q5_K, "dequantize_row_q5_K", "quantize_row_q5_K_ref", true, false},
    {SB_TYPE_Q6_K, "dequantize_row_q6_K", "quantize_row_q6_K_ref", true, false},
    {SB_TYPE_IQ4_XS, "dequantize_row_iq4_xs", "quantize_row_iq4_xs_ref", true, false},
    {SB_TYPE_Q8_K, "dequantize_row_q8_K", "quantize_row_q8_K_ref", false, false},
};

/* Weight formats whose dot product we check against ggml's x86 kernels
 * (block formats only; the float formats' dots are not compared here).
 * Q4_0 is checked against the kernel llama.cpp runs it with on x86: the
 * gemv of its repacked 8-row layout, gemv<block_q4_0, 8, 8, GGML_TYPE_Q8_0>;
 * Q4_K likewise against ggml_gemv_q4_K_8x8_q8_K (block_q4_Kx8). `close`:
 * our float order differs from that kernel's (see dot_bound). */
#define GEMV_Q4_0_8X8 "_ZN4ggml3cpu6repack4gemvI10block_q4_0Ll8ELl8EL9ggml_type8EEEviPfmPKvS7_ii"
#define GEMV_Q4_K_8X8 "ggml_gemv_q4_K_8x8_q8_K"
static const struct {
    sb_type type;
    const char *vec_dot;
    bool close;
} dots[] = {
    {SB_TYPE_Q4_0, GEMV_Q4_0_8X8, false}, {SB_TYPE_Q4_1, "ggml_vec_dot_q4_1_q8_1", true},
    {SB_TYPE_Q5_0, "ggml_vec_dot_q5_0_q8_0", true}, {SB_TYPE_Q5_1, "ggml_vec_dot_q5_1_q8_1", true},
    {SB_TYPE_Q8_0, "ggml_vec_dot_q8_0_q8_0", true}, {SB_TYPE_IQ4_NL, "ggml_vec_dot_iq4_nl_q8_0", true},
    {SB_TYPE_Q2_K, "ggml_vec_dot_q2_K_q8_K", true}, {SB_TYPE_Q3_K, "ggml_vec_dot_q3_K_q8_K", true},
    {SB_TYPE_Q4_K, GEMV_Q4_K_8X8, false}, {SB_TYPE_Q5_K, "ggml_vec_dot_q5_K_q8_K", true},
    {SB_TYPE_Q6_K, "ggml_vec_dot_q6_K_q8_K", true}, {SB_TYPE_IQ4_XS, "ggml_vec_dot_iq4_xs_q8_K", true},
};

/* Activation types and the CPU backend's quantizer for them. */
static const struct {
    sb_type type;
    const char *quantize;
} acts[] = {
    {SB_TYPE_Q8_0, "quantize_row_q8_0"},
    {SB_TYPE_Q8_1, "quantize_row_q8_1"},
    {SB_TYPE_Q8_K, "quantize_row_q8_K"},
};

enum { ROW = 4096, N_KINDS = 8 };

static void *lib_base, *lib_cpu;

/* ---- loading the library ------------------------------------------------ */

static const char *source_dir(void) {
#ifdef SB_SOURCE_DIR
    return SB_SOURCE_DIR;
#else
    /* __FILE__ is <source>/tests/unit/test_ggml_oracle.c when built by CMake. */
    static char dir[4096];
    snprintf(dir, sizeof(dir), "%s", __FILE__);
    for (int up = 0; up < 3; up++) {
        char *slash = strrchr(dir, '/');
        if (!slash)
            return ".";
        *slash = '\0';
    }
    return dir;
#endif
}

static int setup(void **state) {
    (void)state;
    static char path[4096 + 256];
    const char *env = getenv("SB_GGML_BASE");
    if (env && *env)
        snprintf(path, sizeof(path), "%s", env);
    else
        snprintf(path, sizeof(path), "%s/" NPM_BINS "/libggml-base.so", source_dir());
    lib_base = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib_base) {
        fprintf(stderr,
                "cannot load llama.cpp's ggml: %s\n"
                "install it with: (cd tests/npm && npm i -E node-llama-cpp@3.21.1)\n"
                "or point SB_GGML_BASE at a libggml-base.so\n",
                dlerror());
        return -1;
    }
    /* The CPU backend sits next to it; its AVX2 build is the one whose x86
     * kernels our reference kernels follow. Optional: only if this CPU runs it. */
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2")) {
        char *slash = strrchr(path, '/');
        if (slash) {
            snprintf(slash + 1, sizeof(path) - (size_t)(slash + 1 - path), "libggml-cpu-haswell.so");
            lib_cpu = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            /* Required: it fills the F16 table the kernels read their scales
             * through; without it every dot product comes out 0. */
            void (*cpu_init)(void) = lib_cpu ? (void (*)(void))dlsym(lib_cpu, "ggml_cpu_init") : NULL;
            if (cpu_init)
                cpu_init();
            else if (lib_cpu) {
                dlclose(lib_cpu);
                lib_cpu = NULL;
            }
        }
    }
    if (!lib_cpu)
        fprintf(stderr, "note: llama.cpp's AVX2 CPU backend not usable here; skipping dot-product checks\n");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    /* Not dlclose'd: ggml registers atexit-time state in some builds. */
    return 0;
}

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p)
        fail_msg("llama.cpp's ggml lacks %s", name);
    return p;
}

/* ---- test data ----------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rng_u64(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static float rng_uniform(void) { return (float)((double)(rng_u64() >> 11) * 0x1p-53); } /* [0, 1) */

static float rng_gauss(void) {
    const double u = (rng_u64() >> 11) * 0x1p-53 + 0x1p-54, v = (rng_u64() >> 11) * 0x1p-53;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* A row of kind k: the shapes that reach every branch of the quantizers. */
static void make_row(int kind, float *x, int n) {
    for (int i = 0; i < n; i++) {
        switch (kind) {
        case 0: /* uniform */
            x[i] = 2 * rng_uniform() - 1;
            break;
        case 1: /* weights-like: gaussian with 1% outliers */
            x[i] = 0.02f * rng_gauss() * (rng_u64() % 100 == 0 ? 20.0f : 1.0f);
            break;
        case 2: /* all positive: min > 0 paths */
            x[i] = 0.5f + rng_uniform();
            break;
        case 3: /* all negative */
            x[i] = -0.5f - rng_uniform();
            break;
        case 4: /* per 16 elements: zero, constant, tiny, huge, spike, or normal */
            switch ((i / 16 * 7 + 3) % 6) {
            case 0: x[i] = 0.0f; break;
            case 1: x[i] = 0.75f; break;
            case 2: x[i] = 1e-20f * rng_gauss(); break;
            case 3: x[i] = 1e4f * rng_gauss(); break;
            case 4: x[i] = i % 16 == 5 ? -3.0f : 0.0f; break;
            default: x[i] = rng_gauss(); break;
            }
            break;
        case 5: /* quantized-looking: few distinct values, exact ties */
            x[i] = (float)((int)(rng_u64() % 9) - 4) * 0.25f;
            break;
        case 6: /* wide dynamic range within blocks */
            x[i] = rng_gauss() * exp2f((float)(int)(rng_u64() % 30) - 20.0f);
            break;
        default: /* F16/BF16 edge values: overflow, subnormal, underflow, -0 */
            {
                static const float edge[] = {70000.0f, -65520.0f, 65504.0f, 6e-8f, -3e-8f, 1e-9f, -0.0f, 1e-40f, 3.0e38f};
                x[i] = rng_u64() % 4 == 0 ? edge[rng_u64() % 9] : rng_gauss();
            }
            break;
        }
    }
}

static const char *kind_name(int kind) {
    static const char *names[N_KINDS] = {"uniform", "gaussian+outliers", "positive",   "negative",
                                         "mixed sub-blocks", "ties",     "wide range", "f16 edges"};
    return names[kind];
}

/* Random bytes for n elements of a format, with every F16/F32 scale field
 * made finite (NaN payloads are not what we compare). */
static void random_blocks(sb_type type, uint8_t *buf, int64_t n) {
    const sb_type_traits *t = sb_type_traits_of(type);
    const size_t size = sb_type_row_size(type, n);
    for (size_t i = 0; i < size; i++)
        buf[i] = (uint8_t)rng_u64();
    /* Offsets of the F16 scales within each block (ggml layouts). */
    int f16_off[2] = {-1, -1}, f32_off = -1;
    switch (type) {
    case SB_TYPE_F16: case SB_TYPE_BF16: f16_off[0] = 0; break;
    case SB_TYPE_Q4_0: case SB_TYPE_Q5_0: case SB_TYPE_Q8_0: case SB_TYPE_IQ4_NL: f16_off[0] = 0; break;
    case SB_TYPE_Q4_1: case SB_TYPE_Q5_1: case SB_TYPE_Q8_1: f16_off[0] = 0; f16_off[1] = 2; break;
    case SB_TYPE_Q2_K: f16_off[0] = 80; f16_off[1] = 82; break;
    case SB_TYPE_Q3_K: f16_off[0] = 108; break;
    case SB_TYPE_Q4_K: case SB_TYPE_Q5_K: f16_off[0] = 0; f16_off[1] = 2; break;
    case SB_TYPE_IQ4_XS: f16_off[0] = 0; break;
    case SB_TYPE_Q6_K: f16_off[0] = 208; break;
    case SB_TYPE_Q8_K: f32_off = 0; break;
    default: fail_msg("no layout for type %d", (int)type);
    }
    for (size_t b = 0; b < size / t->type_size; b++) {
        uint8_t *blk = buf + b * t->type_size;
        for (int k = 0; k < 2; k++) {
            if (f16_off[k] < 0)
                continue;
            /* exponent field 31 (F16) or 255 (BF16) would be inf/NaN: clear its top bit */
            blk[f16_off[k] + 1] &= 0xbf;
        }
        if (f32_off >= 0) {
            const float d = rng_gauss() * 1e-2f;
            memcpy(blk + f32_off, &d, sizeof(d));
        }
    }
}

/* ---- comparisons ---------------------------------------------------------- */

static void assert_same_bytes(const char *what, sb_type type, const char *kind, const void *ours, const void *theirs,
                              size_t size) {
    if (memcmp(ours, theirs, size) == 0)
        return;
    const uint8_t *a = ours, *b = theirs;
    size_t i = 0;
    while (a[i] == b[i])
        i++;
    const size_t bs = sb_type_traits_of(type)->type_size;
    fail_msg("%s %s (%s data): first difference at byte %zu (block %zu, offset %zu): ours 0x%02x, ggml 0x%02x", what,
             sb_type_traits_of(type)->name, kind, i, i / bs, i % bs, a[i], b[i]);
}

static void assert_same_floats(const char *what, sb_type type, const char *kind, const float *ours,
                               const float *theirs, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (memcmp(&ours[i], &theirs[i], sizeof(float)) != 0)
            fail_msg("%s %s (%s): element %lld: ours %a, ggml %a", what, sb_type_traits_of(type)->name, kind,
                     (long long)i, (double)ours[i], (double)theirs[i]);
    }
}

/* ---- tests --------------------------------------------------------------- */

/* from_float == quantize_row_*_ref == ggml_quantize_chunk, byte for byte
 * (IQ4_NL: == ggml_quantize_chunk). */
static void test_quantize_matches_ggml(void **state) {
    (void)state;
    ggml_quantize_chunk_fn chunk = (ggml_quantize_chunk_fn)sym(lib_base, "ggml_quantize_chunk");
    float *x = malloc(ROW * sizeof(float));
    uint8_t *ours = malloc(ROW * 4), *theirs = malloc(ROW * 4);
    for (size_t f = 0; f < sizeof(formats) / sizeof(formats[0]); f++) {
        const sb_type type = formats[f].type;
        const sb_type_traits *t = sb_type_traits_of(type);
        ggml_from_float_fn ref = (ggml_from_float_fn)sym(lib_base, formats[f].from_float);
        const size_t size = sb_type_row_size(type, ROW);
        for (int kind = 0; kind < N_KINDS; kind++) {
            rng_state = 0x9e3779b97f4a7c15ull + (uint64_t)(kind * 131 + (int)type);
            make_row(kind, x, ROW);
            memset(ours, 0, size);
            memset(theirs, 0, size);
            t->from_float(x, ours, ROW);
            if (!formats[f].chunk_only) {
                ref(x, theirs, ROW);
                assert_same_bytes(formats[f].from_float, type, kind_name(kind), ours, theirs, size);
            }
            if (formats[f].chunk) {
                memset(theirs, 0, size);
                /* 4 rows of ROW/4: also checks that rows are independent */
                assert_int_equal(chunk((int)type, x, theirs, 0, 4, ROW / 4, NULL), size);
                assert_same_bytes("ggml_quantize_chunk", type, kind_name(kind), ours, theirs, size);
            }
        }
    }
    free(x);
    free(ours);
    free(theirs);
}

/* to_float == dequantize_row_*, float for float, on ggml's blocks and on random ones. */
static void test_dequantize_matches_ggml(void **state) {
    (void)state;
    float *x = malloc(ROW * sizeof(float)), *ours = malloc(ROW * sizeof(float)), *theirs = malloc(ROW * sizeof(float));
    uint8_t *blocks = malloc(ROW * 4);
    for (size_t f = 0; f < sizeof(formats) / sizeof(formats[0]); f++) {
        if (!formats[f].to_float)
            continue;
        const sb_type type = formats[f].type;
        const sb_type_traits *t = sb_type_traits_of(type);
        ggml_from_float_fn ref = (ggml_from_float_fn)sym(lib_base, formats[f].from_float);
        ggml_to_float_fn deq = (ggml_to_float_fn)sym(lib_base, formats[f].to_float);
        for (int kind = 0; kind <= N_KINDS; kind++) {
            rng_state = 0x2545f4914f6cdd1dull + (uint64_t)(kind * 31 + (int)type);
            if (kind < N_KINDS) {
                make_row(kind, x, ROW);
                memset(blocks, 0, sb_type_row_size(type, ROW));
                ref(x, blocks, ROW);
            } else {
                random_blocks(type, blocks, ROW);
            }
            t->to_float(blocks, ours, ROW);
            deq(blocks, theirs, ROW);
            assert_same_floats(formats[f].to_float, type, kind < N_KINDS ? kind_name(kind) : "random bytes", ours,
                               theirs, ROW);
        }
    }
    free(x);
    free(ours);
    free(theirs);
    free(blocks);
}

/* act_from_float == the x86 CPU backend's quantize_row_* (activations). */
static void test_activation_quantize_matches_ggml_cpu(void **state) {
    (void)state;
    if (!lib_cpu)
        SB_TEST_SKIP("llama.cpp's CPU backend (libggml-cpu) is not loadable here");
    float *x = malloc(ROW * sizeof(float));
    uint8_t *ours = malloc(ROW * 2), *theirs = malloc(ROW * 2);
    for (size_t a = 0; a < sizeof(acts) / sizeof(acts[0]); a++) {
        const sb_type type = acts[a].type;
        ggml_from_float_fn q = (ggml_from_float_fn)sym(lib_cpu, acts[a].quantize);
        const size_t size = sb_type_row_size(type, ROW);
        for (int kind = 0; kind < N_KINDS - 1; kind++) {
            rng_state = 0x1234567887654321ull + (uint64_t)(kind * 17 + (int)type);
            make_row(kind, x, ROW);
            memset(ours, 0, size);
            memset(theirs, 0, size);
            sb_type_traits_of(type)->act_from_float(x, ours, ROW);
            q(x, theirs, ROW);
            assert_same_bytes(acts[a].quantize, type, kind_name(kind), ours, theirs, size);
        }
    }
    free(x);
    free(ours);
    free(theirs);
}

/* ggml's repacked Q4_0 (repack.cpp, block_q4_0x8): per block the 8 rows'
 * F16 scales, then their quants in 8-byte pieces taken from the rows in
 * turn, each byte xor 0x88 (signed nibbles). Row r of the first n elements
 * of 8 rows of `stride` bytes, times xq, lands in out[r]. */
static void gemv_q4_0_repacked(int64_t n, const uint8_t *rows, size_t stride, const uint8_t *xq, float out[8]) {
    const int64_t nb = n / SB_QK;
    uint8_t *packed = malloc((size_t)nb * 144);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *dst = packed + b * 144;
        for (int r = 0; r < 8; r++)
            memcpy(dst + 2 * r, rows + r * stride + b * 18, 2);
        for (int i = 0; i < 16; i++)
            for (int k = 0; k < 8; k++)
                dst[16 + 8 * i + k] = rows[(i % 8) * stride + b * 18 + 2 + (i / 8) * 8 + k] ^ 0x88;
    }
    ((ggml_gemv_fn)sym(lib_cpu, GEMV_Q4_0_8X8))((int)n, out, 0, packed, xq, 1, 8);
    free(packed);
}

/* ggml's repacked Q4_K (block_q4_Kx8): per block the 8 rows' d, their
 * dmin, their 6-bit scales and mins regrouped by sub-block (12 bytes per
 * sub-block pair position: the rows' values of sub-block i (and i + 4 in the
 * spare top bits), as make_block_q4_Kx8 lays them out), then their quants in
 * 8-byte pieces taken from the rows in turn. */
static void gemv_q4_K_repacked(int64_t n, const uint8_t *rows, size_t stride, const uint8_t *xq, float out[8]) {
    const int64_t nb = n / SB_QK_K;
    const size_t bsize = 32 + 96 + 1024;
    uint8_t *packed = malloc((size_t)nb * bsize);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *dst = packed + b * bsize;
        const uint8_t *blk[8];
        for (int r = 0; r < 8; r++) {
            blk[r] = rows + r * stride + b * 144;
            memcpy(dst + 2 * r, blk[r], 2);
            memcpy(dst + 16 + 2 * r, blk[r] + 2, 2);
        }
        for (int half = 0; half < 2; half++)
            for (int i = 0; i < 4; i++) {
                uint8_t sc[8], mn[8], *o = dst + 32 + 48 * half + 12 * i;
                for (int r = 0; r < 8; r++) {
                    const uint8_t *s = blk[r] + 4;
                    sc[r] = half ? (uint8_t)((s[i] & 192) >> 2 | (s[i + 8] & 15)) : s[i] & 63;
                    mn[r] = half ? (uint8_t)((s[i + 4] & 192) >> 2 | (s[i + 8] & 240) >> 4) : s[i + 4] & 63;
                }
                for (int r = 0; r < 4; r++) {
                    o[r] = (uint8_t)((sc[r] & 63) + ((sc[r + 4] & 48) << 2));
                    o[4 + r] = (uint8_t)((mn[r] & 63) + ((mn[r + 4] & 48) << 2));
                    o[8 + r] = (uint8_t)((sc[r + 4] & 15) + ((mn[r + 4] & 15) << 4));
                }
            }
        for (int i = 0; i < 128; i++)
            memcpy(dst + 128 + 8 * i, blk[i % 8] + 16 + (i / 8) * 8, 8);
    }
    ((ggml_gemv_fn)sym(lib_cpu, GEMV_Q4_K_8X8))((int)n, out, 0, packed, xq, 1, 8);
    free(packed);
}

/* The bound on |ours - ggml's| for a K-quant (but Q4_K) or 32-element block format (but Q4_0) dot of
 * n elements: both sum the same exact integers per block (sc * q * x,
 * m * bsum) and differ only in where they round (ours: one conversion and
 * fma per block and sum; ggml: 8 lanes per block, then a halving sum), each
 * rounding at most 2^-24 of a partial sum, and every partial sum is at most
 * S = sum over blocks and sub-blocks j of (|d_w sc_j| qmax + |dmin_w m_j|)
 * |d_x| sum_j |x|, qmax the largest |q - bias|. 2^-24 * S per block and
 * step, 4 steps per block (conversion, product, fma, the final sums) and 8
 * for the reductions: far below what one wrong integer product moves the
 * result by. The 32-element formats likewise, with their blocks of 32:
 * sum |d_w q_w d_x q_x| (the dequantized values less the min m_w, times the
 * activations'), plus |m_w s_x| with a min. */
static double dot_bound(sb_type type, int64_t n, const uint8_t *w, const uint8_t *xq) {
    const sb_type_traits *t = sb_type_traits_of(type);
    if (t->blck_size == SB_QK) {
        const bool min = type == SB_TYPE_Q4_1 || type == SB_TYPE_Q5_1;
        const sb_type_traits *xt = sb_type_traits_of(t->vec_dot_type);
        double S = 0;
        for (int64_t b = 0; b < n / SB_QK; b++) {
            const uint8_t *wb = w + b * t->type_size, *xb = xq + b * xt->type_size;
            const double m = min ? sb_fp16_to_fp32((uint16_t)(wb[2] | wb[3] << 8)) : 0;
            float wf[SB_QK], xf[SB_QK];
            t->to_float(wb, wf, SB_QK);
            xt->to_float(xb, xf, SB_QK);
            for (int e = 0; e < SB_QK; e++)
                S += fabs(((double)wf[e] - m) * xf[e]);
            if (min)
                S += fabs(m * sb_fp16_to_fp32((uint16_t)(xb[2] | xb[3] << 8)));
        }
        return 0x1p-24 * S * (double)(4 * (n / SB_QK) + 8);
    }
    const size_t bsize = sb_type_traits_of(type)->type_size;
    double S = 0;
    for (int64_t b = 0; b < n / SB_QK_K; b++) {
        const sb_block_q8_K *xb = (const sb_block_q8_K *)(xq + b * sizeof(sb_block_q8_K));
        double ax[16] = {0}; /* sum |x| per 16 elements */
        for (int e = 0; e < SB_QK_K; e++)
            ax[e / 16] += abs(xb->qs[e]);
        const uint8_t *blk = w + b * bsize;
        int sc[16], m[16] = {0}, qmax, nsub = 16;
        float d, dmin = 0;
        switch (type) {
        case SB_TYPE_Q2_K:
            for (int j = 0; j < 16; j++)
                sc[j] = blk[j] & 15, m[j] = blk[j] >> 4;
            d = sb_fp16_to_fp32((uint16_t)(blk[80] | blk[81] << 8));
            dmin = sb_fp16_to_fp32((uint16_t)(blk[82] | blk[83] << 8));
            qmax = 3;
            break;
        case SB_TYPE_Q3_K:
            for (int j = 0; j < 16; j++)
                sc[j] = sb__q3_scale(blk + 96, j) - 32;
            d = sb_fp16_to_fp32((uint16_t)(blk[108] | blk[109] << 8));
            qmax = 4;
            break;
        case SB_TYPE_Q6_K:
            for (int j = 0; j < 16; j++)
                sc[j] = (int8_t)blk[192 + j];
            d = sb_fp16_to_fp32((uint16_t)(blk[208] | blk[209] << 8));
            qmax = 32;
            break;
        case SB_TYPE_IQ4_XS:
            for (int j = 0; j < 8; j++)
                sc[j] = sb__iq4_xs_scale((const sb_block_iq4_xs *)blk, j);
            d = sb_fp16_to_fp32((uint16_t)(blk[0] | blk[1] << 8));
            qmax = 127; /* the largest |value| */
            nsub = 8;
            break;
        default: /* Q5_K */
            for (int j = 0; j < 8; j++)
                sb__k4_scale_min(blk + 4, j, &sc[j], &m[j]);
            d = sb_fp16_to_fp32((uint16_t)(blk[0] | blk[1] << 8));
            dmin = sb_fp16_to_fp32((uint16_t)(blk[2] | blk[3] << 8));
            qmax = 31;
            nsub = 8;
        }
        for (int j = 0; j < nsub; j++) {
            const double a = nsub == 16 ? ax[j] : ax[2 * j] + ax[2 * j + 1];
            S += (fabs((double)d * sc[j]) * qmax + fabs((double)dmin * m[j])) * fabs((double)xb->d) * a;
        }
    }
    return 0x1p-24 * S * (double)(4 * (n / SB_QK_K) + 8);
}

/* vec_dot == ggml_vec_dot_*_q8_K of the AVX2 backend, to the bit: on
 * quantized rows of every kind, on random weight bytes, and for one block. */
static void test_vec_dot_matches_ggml_cpu(void **state) {
    (void)state;
    if (!lib_cpu)
        SB_TEST_SKIP("llama.cpp's CPU backend (libggml-cpu) is not loadable here");
    float *w = malloc(ROW * sizeof(float)), *x = malloc(ROW * sizeof(float));
    /* 8 rows, as the repacked Q4_0 kernel wants them; the others use row 0. */
    uint8_t *wq = malloc(8 * ROW * 2), *xq = malloc(ROW * 2);
    for (size_t d = 0; d < sizeof(dots) / sizeof(dots[0]); d++) {
        const sb_type type = dots[d].type;
        const sb_type_traits *t = sb_type_traits_of(type), *xt = sb_type_traits_of(t->vec_dot_type);
        const size_t stride = sb_type_row_size(type, ROW);
        const bool repacked = type == SB_TYPE_Q4_0 || type == SB_TYPE_Q4_K;
        ggml_vec_dot_fn dot = repacked ? NULL : (ggml_vec_dot_fn)sym(lib_cpu, dots[d].vec_dot);
        for (int trial = 0; trial < 3 * N_KINDS; trial++) {
            const int kind = trial % N_KINDS;
            rng_state = 0x0ddba11cafef00dull + (uint64_t)(trial * 7 + (int)type);
            for (int r = 0; r < (repacked ? 8 : 1); r++) {
                if (trial < 2 * N_KINDS) {
                    make_row((kind + r) % N_KINDS, w, ROW);
                    t->from_float(w, wq + r * stride, ROW);
                } else {
                    random_blocks(type, wq + r * stride, ROW);
                }
            }
            make_row(trial < N_KINDS ? 1 : (kind + 3) % (N_KINDS - 1), x, ROW);
            xt->act_from_float(x, xq, ROW);
            for (int64_t n = SB_QK_K; n <= ROW; n *= 16) {
                float theirs[8];
                if (type == SB_TYPE_Q4_0)
                    gemv_q4_0_repacked(n, wq, stride, xq, theirs);
                else if (type == SB_TYPE_Q4_K)
                    gemv_q4_K_repacked(n, wq, stride, xq, theirs);
                else
                    dot((int)n, &theirs[0], 0, wq, 0, xq, 0, 1);
                for (int r = 0; r < (repacked ? 8 : 1); r++) {
                    const float ours = t->vec_dot(n, wq + r * stride, xq);
                    if (dots[d].close) {
                        const double bound = dot_bound(type, n, wq, xq);
                        /* Weights quantized from huge values: both non-finite (where one
                         * order adds +inf to -inf, the other may meet only one of them). */
                        const bool same = ours == theirs[r] || (!isfinite(ours) && !isfinite(theirs[r]));
                        if (!same && !(fabs((double)ours - (double)theirs[r]) <= bound))
                            fail_msg("%s, n=%lld, trial %d (%s weights): ours %a, ggml %a, more than %g apart",
                                     dots[d].vec_dot, (long long)n, trial,
                                     trial < 2 * N_KINDS ? kind_name(kind) : "random", (double)ours,
                                     (double)theirs[r], bound);
                    } else if (memcmp(&ours, &theirs[r], sizeof(float)) != 0)
                        fail_msg("%s, n=%lld, trial %d (%s weights), row %d: ours %a, ggml %a", dots[d].vec_dot,
                                 (long long)n, trial, trial < 2 * N_KINDS ? kind_name(kind) : "random", r,
                                 (double)ours, (double)theirs[r]);
                }
            }
        }
    }
    free(w);
    free(x);
    free(wq);
    free(xq);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_matches_ggml),
        cmocka_unit_test(test_dequantize_matches_ggml),
        cmocka_unit_test(test_activation_quantize_matches_ggml_cpu),
        cmocka_unit_test(test_vec_dot_matches_ggml_cpu),
    };
    return sb_test_exit(cmocka_run_group_tests(tests, setup, teardown));
}
