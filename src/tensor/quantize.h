/*
 * quantize.h - llama.cpp's model quantization rules (llama_model_quantize
 * without an importance matrix): which file types ("q4_k_m", ...) exist,
 * which type each tensor of a model gets in each, and the conversion of a
 * tensor's rows to that type (the reference quantizers of the type table,
 * which are ggml's quantize_row_*_ref byte for byte), on a thread pool.
 *
 * The rules depend on the order llama.cpp visits the tensors (by name, as
 * its loader's std::map holds them: byte-wise lexicographic) through
 * counters of the attn_v and ffn_down tensors seen so far; sb_quant_plan
 * carries them, so the caller asks for the tensors in that order.
 * `switchboard quantize` (src/cli/cmd_quantize.c) reads and writes the files.
 */
#ifndef SB_QUANTIZE_H
#define SB_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/base.h"
#include "tensor/tensor.h"
#include "tensor/threadpool.h"

/* A file type of llama.cpp (llama_ftype): its name, its number (written as
 * general.file_type) and the type most tensors get. */
typedef struct sb_quant_ftype {
    const char *name; /* "q4_k_m", ... */
    uint32_t ftype;
    sb_type type;
} sb_quant_ftype;

/* The file type called `name` (case-insensitive; "q3_k", "q4_k", "q5_k" are
 * llama-quantize's aliases of the _m mixes), or NULL. */
const sb_quant_ftype *sb_quant_ftype_find(const char *name);
/* All names, comma-separated, for messages. */
const char *sb_quant_ftype_names(void);

/* GGML_QNT_VERSION: general.quantization_version of the files written. */
#define SB_QUANT_VERSION 2

typedef struct sb_quant_plan {
    const sb_quant_ftype *ft;
    int32_t n_layer;  /* <arch>.block_count */
    int32_t n_gqa;    /* attention heads per KV head (1 if unknown) */
    int32_t n_attn_v; /* tensors named *attn_v.weight / *attn_qkv.weight / *attn_kv_b.weight */
    bool has_output;  /* an output.weight (else token_embd.weight is the output matrix) */
    int32_t i_attn_v, i_ffn_down; /* counters, advanced by sb_quant_choose */
} sb_quant_plan;

/* What llama.cpp writes for one tensor: *quantize false means it is copied
 * as it is; else *type is its new type. */
void sb_quant_choose(sb_quant_plan *p, const char *name, uint32_t n_dims, const int64_t *ne, sb_type src,
                     bool *quantize, sb_type *type);

/* dst = the nrows rows of n_in elements at src (type src_type: float or, to
 * requantize, any type with to_float) converted to dst_type by its reference
 * quantizer, rows split over the pool. n_in must be a multiple of both
 * block sizes. SB_ERR_NOMEM if the row buffers cannot be had. */
sb_status sb_quant_rows(sb_threadpool *tp, sb_type src_type, const void *src, sb_type dst_type, void *dst,
                        int64_t n_in, int64_t nrows, sb_error *err);

#endif
