/*
 * tensor.h - element types, quantized block layouts, and the reference
 * (scalar) conversion and dot-product kernels.
 *
 * Type ids and block layouts are those of ggml, so tensors in GGUF files
 * written by llama.cpp are used in place, byte for byte. Each type has a
 * traits entry: block geometry, conversion to and from float, and a dot
 * product against activations converted to the type's `vec_dot_type`
 * (llama.cpp quantizes activations to Q8_0/Q8_1 blocks for the quantized
 * formats and rounds them to F16 for F16 weights; matching that keeps our
 * logits within rounding of llama.cpp's).
 *
 * Matrix convention: a weight matrix with ne = [n_in, n_out] is n_out rows of
 * n_in contiguous elements; y[r] = dot(row r, x).
 */
#ifndef SB_TENSOR_H
#define SB_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ggml type ids (append-only; gaps are ids ggml retired). */
typedef enum sb_type {
    SB_TYPE_F32 = 0,
    SB_TYPE_F16 = 1,
    SB_TYPE_Q4_0 = 2,
    SB_TYPE_Q4_1 = 3,
    SB_TYPE_Q5_0 = 6,
    SB_TYPE_Q5_1 = 7,
    SB_TYPE_Q8_0 = 8,
    SB_TYPE_Q8_1 = 9,
    SB_TYPE_Q2_K = 10,
    SB_TYPE_Q3_K = 11,
    SB_TYPE_Q4_K = 12,
    SB_TYPE_Q5_K = 13,
    SB_TYPE_Q6_K = 14,
    SB_TYPE_Q8_K = 15,
    SB_TYPE_IQ2_XXS = 16,
    SB_TYPE_IQ2_XS = 17,
    SB_TYPE_IQ3_XXS = 18,
    SB_TYPE_IQ1_S = 19,
    SB_TYPE_IQ4_NL = 20,
    SB_TYPE_IQ3_S = 21,
    SB_TYPE_IQ2_S = 22,
    SB_TYPE_IQ4_XS = 23,
    SB_TYPE_I8 = 24,
    SB_TYPE_I16 = 25,
    SB_TYPE_I32 = 26,
    SB_TYPE_I64 = 27,
    SB_TYPE_F64 = 28,
    SB_TYPE_IQ1_M = 29,
    SB_TYPE_BF16 = 30,
    SB_TYPE_TQ1_0 = 34,
    SB_TYPE_TQ2_0 = 35,
    SB_TYPE_MXFP4 = 39,
    SB_TYPE_COUNT = 40
} sb_type;

#define SB_QK 32   /* elements per block of the 32-element formats */
#define SB_QK_K 256 /* elements per K-quant super-block */

/* Block layouts (ggml-compatible). `d`/`m` are F16 bit patterns. */
typedef struct { uint16_t d; uint8_t qs[SB_QK / 2]; } sb_block_q4_0;             /* x = (q - 8) * d */
typedef struct { uint16_t d, m; uint8_t qs[SB_QK / 2]; } sb_block_q4_1;          /* x = q * d + m */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[SB_QK / 2]; } sb_block_q5_0;   /* x = (q - 16) * d */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[SB_QK / 2]; } sb_block_q5_1; /* x = q * d + m */
typedef struct { uint16_t d; int8_t qs[SB_QK]; } sb_block_q8_0;                   /* x = q * d */
typedef struct { uint16_t d, s; int8_t qs[SB_QK]; } sb_block_q8_1;                /* s = d * sum(q) */
typedef struct { uint16_t d; uint8_t qs[SB_QK / 2]; } sb_block_iq4_nl;           /* x = value[q] * d, 16 fixed values */

_Static_assert(sizeof(sb_block_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(sb_block_q4_1) == 20, "q4_1 block");
_Static_assert(sizeof(sb_block_q5_0) == 22, "q5_0 block");
_Static_assert(sizeof(sb_block_q5_1) == 24, "q5_1 block");
_Static_assert(sizeof(sb_block_q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(sb_block_q8_1) == 36, "q8_1 block");
_Static_assert(sizeof(sb_block_iq4_nl) == 18, "iq4_nl block");

/* Converts n elements (a multiple of the block size) to float. */
typedef void (*sb_to_float_fn)(const void *src, float *dst, int64_t n);
/* Quantizes n floats (a multiple of the block size) into blocks. */
typedef void (*sb_from_float_fn)(const float *src, void *dst, int64_t n);
/* Dot product of n elements: a weight row of this type with an activation
 * row already converted to this type's vec_dot_type. */
typedef float (*sb_vec_dot_fn)(int64_t n, const void *w, const void *x);

typedef struct sb_type_traits {
    const char *name;  /* as ggml prints it: "f32", "q4_0", ... */
    uint32_t blck_size; /* elements per block */
    uint32_t type_size; /* bytes per block */
    /* Compute support; NULL where switchboard cannot use the type yet. */
    sb_to_float_fn to_float;     /* exactly ggml's dequantize_row_* */
    sb_from_float_fn from_float; /* exactly ggml's quantize_row_*_ref (what files hold) */
    sb_type vec_dot_type;        /* what activations are converted to for vec_dot */
    sb_vec_dot_fn vec_dot;       /* weights of this type . activations of vec_dot_type */
    /* How activations are converted when this type is another type's
     * vec_dot_type: as llama.cpp's x86 CPU backend does it. Same as
     * from_float except for Q8_0/Q8_1, where that backend scales by
     * 127/amax and rounds ties to even; NULL if not an activation type. */
    sb_from_float_fn act_from_float;
} sb_type_traits;

/* Traits of a type id, or NULL for an id that is not a ggml type. */
const sb_type_traits *sb_type_traits_of(uint32_t type);
/* True if the model code can multiply with weights of this type. */
bool sb_type_can_matmul(uint32_t type);
/* Bytes of a row of n elements; 0 if the type is unknown, n is negative or
 * not a multiple of the block size, or the size does not fit in size_t. */
size_t sb_type_row_size(sb_type type, int64_t n);

/* Scalar conversions. F16: exact IEEE round-to-nearest-even, subnormals,
 * infinities; NaN stays NaN (quieted, sign and top payload bits kept, as
 * x86 F16C does). BF16: as ggml, nearest-even, subnormals kept, NaN quieted. */
float sb_fp16_to_fp32(uint16_t h);
uint16_t sb_fp32_to_fp16(float f);
float sb_bf16_to_fp32(uint16_t h);
uint16_t sb_fp32_to_bf16(float f);

/* ---- kernel dispatch ----------------------------------------------------
 * The matmul kernels come in ISA levels. Every level computes bit-identical
 * results (same float operations in the same order as the scalar `_ref`
 * kernels of the type table; only exact integer work is reorganised), so
 * batched and unbatched runs agree and any level can stand in for another.
 * The table is chosen once, at first use, from what the CPU and OS support,
 * capped by the environment variable SB_CPU=scalar|avx2|avx512|amx. */
typedef enum sb_cpu_level {
    SB_CPU_SCALAR, /* the reference kernels, portable C */
    SB_CPU_AVX2,   /* x86-64 AVX2 + FMA + F16C */
    SB_CPU_AVX512, /* the above + AVX-512 F, BW, VL, VNNI */
    SB_CPU_AMX,    /* the above + GFNI, AMX-TILE, AMX-INT8: K-quant tiles of many tokens */
    SB_CPU_LEVEL_COUNT
} sb_cpu_level;

/* y[t*ldy + r] = dot(weight row r, activation row t) for r < nr, t < nt:
 *   w: nr weight rows of n elements, row r at (char *)w + r*w_stride
 *   x: nt activation rows, already in the weight type's vec_dot_type,
 *      row t at (char *)x + t*x_stride
 *   y: floats, token-major, row stride ldy (in floats)
 * n is a multiple of the weight type's block size; nr, nt >= 1. Each output
 * equals the type's vec_dot of the two rows, bit for bit. Q8_0/Q8_1
 * activations must hold quants in [-127, 127] (act_from_float writes no
 * other). K-quant weight rows are 2-byte aligned and Q8_K rows 4-byte
 * aligned (their blocks are structs with F16 and F32 fields), as in GGUF
 * files and in matmul's buffers. */
typedef void (*sb_gemm_fn)(int64_t n, const void *w, size_t w_stride, int64_t nr, const void *x, size_t x_stride,
                           int64_t nt, float *y, size_t ldy);

/* y[i] += a[r] * x_r[i] for r = 0, 1, ... nr-1 in turn, i < n, where x_r
 * is row r (x_stride bytes apart) of the table's type dequantized as its
 * to_float does (F32; F16 widened exactly; Q8_0 d * q, n a multiple of 32),
 * each multiply and add rounded separately (never fused), so every level
 * gives the scalar bytes. Attention's weighted sum of values, one call per
 * run of cached positions. */
typedef void (*sb_axpy_fn)(int64_t n, int64_t nr, const float *a, const void *x, size_t x_stride, float *y);

/* dst row r = src row r, for nr rows of n floats (src contiguous, dst rows
 * dst_stride bytes apart) converted to the table's type as the type's
 * act_from_float does (F32; F16 rounded to nearest even; Q8_0 as llama.cpp's
 * x86 backend quantizes, which is also what its F32 -> Q8_0 copy into a KV
 * cache does), written around the caches where the level can (F32:
 * streaming stores, for rows 64-byte aligned), and visible to every thread
 * once the call returns. New keys and values going into the KV cache: a
 * normal store first reads each cold line it fills. */
typedef void (*sb_store_rows_fn)(int64_t n, int64_t nr, const float *src, void *dst, size_t dst_stride);

/* gate[i] = silu(gate[i]) * up[i] for i < n, F32, silu(x) = x / (1 + e^-x)
 * with e^-x as llama.cpp's AVX-512 backend computes it (ggml_v_expf), the
 * same bytes at every level. SwiGLU's gated activation. */
typedef void (*sb_swiglu_fn)(int64_t n, float *gate, const float *up);

/* x[i] = e^(x[i] - max) / sum for i < n (n >= 1, finite x), e^ as ggml_v_expf
 * (see swiglu), the sum in double in 8 lanes (act.c), then one multiplication
 * by its float reciprocal: the same bytes at every level. Attention's
 * weights. */
typedef void (*sb_softmax_fn)(int64_t n, float *x);

/* A level's own layout for matrices of a type: groups of `rows`
 * consecutive rows interleaved so that one vector load serves all of them.
 * Matrices are converted once, when a model loads; the packed copy has the
 * unpacked size (group g starts at g * rows * row size), and `gemm`, given
 * packed rows from the start of a group (nr a multiple of `rows`, w_stride
 * the unpacked row size), writes the bytes gemm[type] writes for them.
 * Its activation rows are the vec_dot_type row followed by term_bytes per
 * block that `terms` derives from it: per-token terms that every chunk of
 * rows would otherwise recompute, worked out once per call. */
typedef struct sb_packing {
    int32_t rows; /* 0: none for this type */
    void (*pack)(const void *src, void *dst, int64_t n_in, int64_t n_out); /* n_out % rows == 0 */
    sb_gemm_fn gemm;
    size_t term_bytes; /* per block of the activation row */
    void (*terms)(const void *x, int64_t n, void *dst); /* x: one activation row of n elements */
    /* Block b of row r (< rows) of the packed group at `group` (rows of n_in
     * elements), back in the type's own block layout: pack's inverse, for a
     * table whose rows are also looked up one at a time (an embedding table
     * that is the output matrix too). */
    void (*row_block)(const void *group, int64_t n_in, int r, int64_t b, void *dst);
} sb_packing;

typedef struct sb_kernels {
    sb_cpu_level level;
    bool gfni; /* the CPU has GFNI: the AVX-512 level's packed Q4_0 gemm unpacks with it */
    sb_axpy_fn axpy[SB_TYPE_COUNT];             /* by row type: the KV cache's, F32, F16 and Q8_0 */
    sb_store_rows_fn store_rows[SB_TYPE_COUNT]; /* by destination type: the KV cache's, F32, F16 and Q8_0 */
    sb_swiglu_fn swiglu;
    sb_softmax_fn softmax;
    sb_gemm_fn gemm[SB_TYPE_COUNT];                 /* by weight type; NULL where the type has no vec_dot */
    sb_packing packing[SB_TYPE_COUNT];              /* by weight type */
    sb_from_float_fn act_from_float[SB_TYPE_COUNT]; /* by activation type (F32, F16, BF16, Q8_0, Q8_1):
                                                       the bytes of the type table's act_from_float */
} sb_kernels;

/* The table in use: the best level this CPU runs, capped by SB_CPU (an
 * unknown value, or a level the CPU lacks, prints one warning line to stderr
 * and falls back to the best available). Chosen once, thread-safe; the
 * table is static and never changes. */
const sb_kernels *sb_kernels_active(void);
/* A model of `bytes` of weights is loaded: where decoding then streams
 * its weights from DRAM (more than the last-level cache), on Intel, the
 * single-token kernels prefetch for that until it is unloaded (the same
 * `bytes` to each call). A hint: results are the same either way. */
void sb_kernels_weights_loaded(size_t bytes);
void sb_kernels_weights_unloaded(size_t bytes);
/* The table of one level, or NULL if this CPU cannot run it (tests, benchmarks). */
const sb_kernels *sb_kernels_for(sb_cpu_level level);
/* "scalar", "avx2", "avx512", "amx"; "?" for anything else. */
const char *sb_cpu_level_name(sb_cpu_level level);

typedef struct sb_threadpool sb_threadpool;

/* y[t][r] = dot(W row r, x[t]) for t < n_tok, r < n_out, on the pool's
 * threads (tp may be NULL: the caller's thread only).
 *   w:  weights of `type`, ne = [n_in, n_out], rows contiguous
 *   x:  (n_tok, n_in) float, row-major
 *   y:  (n_tok, n_out) float, row-major
 *   work: scratch of sb_matmul_work_size(type, n_in, n_tok) bytes
 * n_in must be a multiple of the type's block size. The result is the same
 * for every thread count. */
void sb_matmul(sb_threadpool *tp, sb_type type, const void *w, int64_t n_in, int64_t n_out, const float *x,
               int64_t n_tok, float *y, void *work);
size_t sb_matmul_work_size(sb_type type, int64_t n_in, int64_t n_tok);

/* Whether the active level packs [n_in, n_out] matrices of this type, and
 * the packing (into dst, sb_type_row_size(type, n_in) * n_out bytes). Rows
 * are packed in groups of sb_weight_pack_rows(type) (0: the type is not
 * packed), each group in place of its own rows: packing a matrix a slice of
 * whole groups at a time, src and dst advanced by the slice's bytes, gives
 * the same bytes as packing it at once. */
bool sb_weight_packable(sb_type type, int64_t n_in, int64_t n_out);
void sb_weight_pack(sb_type type, const void *src, void *dst, int64_t n_in, int64_t n_out);
int64_t sb_weight_pack_rows(sb_type type);

/* Several products of the same input (a layer's query, key and value; its
 * gate and up): y_i = W_i x for each of the n (<= SB_MATMUL_MAX) matrices,
 * all with rows of n_in. When their types share an activation format the
 * input is converted once and all their rows form one parallel loop (one
 * wait for the slowest thread instead of one per matrix); otherwise they
 * run one by one. work: the largest sb_matmul_work_size among them. */
#define SB_MATMUL_MAX 4
typedef struct sb_matmul_dst {
    sb_type type;
    const void *w;
    bool packed; /* w is sb_weight_pack's layout */
    int64_t n_out;
    float *y;       /* (n_tok, n_out) */
    float *residual; /* NULL, or (n_tok, n_out): then also residual += y, each
                      * chunk for its own rows as it finishes them (a model's
                      * residual stream, without a pass over it on one thread) */
} sb_matmul_dst;
/* A preparation of each input row before it is converted (a model's norm,
 * its gated activation), run by the product's threads, each row by one of
 * them: out = f(in) for token tok's row, both n_in floats (out may be in).
 * out rows are n_in apart in `out`, which the products then read instead
 * of x (and which keeps them). NULL for none. */
typedef struct sb_matmul_prep {
    void (*row)(void *ctx, int64_t tok, float *out, const float *in, int64_t n_in);
    void *ctx;
    float *out; /* (n_tok, n_in) */
} sb_matmul_prep;
void sb_matmul_many(sb_threadpool *tp, const sb_matmul_dst *dst, int n, int64_t n_in, const float *x, int64_t n_tok,
                    const sb_matmul_prep *prep, void *work);

/* Row `row` of a matrix of `type` with rows of n_in elements, as floats
 * (embedding lookup); packed: w is in sb_weight_pack's layout. The same
 * floats either way. */
void sb_get_row(sb_type type, const void *w, int64_t n_in, int64_t row, bool packed, float *out);

#endif
