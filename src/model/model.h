/*
 * model.h - a loaded model: hyper-parameters, weights bound to the GGUF
 * mapping, and the vocabulary; plus the inference context (KV cache and
 * scratch) that the forward pass runs in.
 *
 * Ownership: sb_model owns the sb_gguf (and so the mapping every weight
 * points into) and the vocabulary. sb_ctx borrows the model, which must
 * outlive it, and owns its KV cache and scratch buffers.
 */
#ifndef SB_MODEL_H
#define SB_MODEL_H

#include "gguf/gguf.h"
#include "switchboard.h"
#include "tensor/tensor.h"
#include "tokenizer/vocab.h"

typedef struct sb_model sb_model;
typedef struct sb_ctx sb_ctx;

typedef enum sb_arch {
    SB_ARCH_LLAMA,
} sb_arch;

typedef struct sb_hparams {
    sb_arch arch;
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_embd;    /* model width */
    int32_t n_ff;      /* feed-forward hidden width */
    int32_t n_layer;
    int32_t n_head;    /* query heads */
    int32_t n_head_kv; /* key/value heads (GQA when < n_head) */
    int32_t head_dim;
    int32_t n_rot;     /* leading dims of each head that are rotated */
    float rope_freq_base;
    float rms_eps;
} sb_hparams;

/* A matrix (or vector when n_out == 1) inside the mapping. */
typedef struct sb_weight {
    sb_type type;
    int64_t n_in;  /* ne[0]: elements per row */
    int64_t n_out; /* ne[1]: rows */
    const void *data;
} sb_weight;

typedef struct sb_layer {
    sb_weight attn_norm; /* (n_embd) f32 */
    sb_weight wq;        /* (n_head*head_dim, n_embd) */
    sb_weight wk;        /* (n_head_kv*head_dim, n_embd) */
    sb_weight wv;        /* (n_head_kv*head_dim, n_embd) */
    sb_weight wo;        /* (n_embd, n_head*head_dim) */
    sb_weight ffn_norm;  /* (n_embd) f32 */
    sb_weight w_gate;    /* (n_ff, n_embd) */
    sb_weight w_up;      /* (n_ff, n_embd) */
    sb_weight w_down;    /* (n_embd, n_ff) */
} sb_layer;

struct sb_model {
    sb_gguf *gguf;
    sb_vocab *vocab;
    sb_hparams hp;
    sb_weight tok_embd;    /* (n_vocab, n_embd) */
    sb_weight output_norm; /* (n_embd) f32 */
    sb_weight output;      /* (n_vocab, n_embd); tok_embd when the file ties them */
    sb_layer *layers;      /* n_layer */
};

/* Tokens processed per forward step when a prompt is evaluated in chunks. */
#define SB_MAX_BATCH 512

struct sb_ctx {
    const struct sb_model *model;
    int32_t n_ctx;
    int32_t n_past;
    sb_threadpool *pool; /* n_threads workers, the caller included */
    /* KV cache, F32: (n_layer, n_ctx, n_head_kv*head_dim) each. */
    float *k_cache;
    float *v_cache;
    /* Scratch for one chunk of up to SB_MAX_BATCH tokens. */
    float *x;      /* (batch, n_embd) residual stream */
    float *xb;     /* (batch, n_embd) normed input of a block */
    float *q;      /* (batch, n_head*head_dim) */
    float *k;      /* (batch, n_kv*head_dim) */
    float *v;      /* (batch, n_kv*head_dim) */
    float *att;    /* (batch, n_head*head_dim) attention output */
    float *hb;     /* (batch, n_ff) */
    float *hb2;    /* (batch, n_ff) */
    float *scores; /* (n_threads, n_ctx) one head's attention weights per thread */
    float *logits; /* (n_vocab) after the last token */
    bool has_logits;
    void *work;    /* sb_matmul scratch */
};

/* Runs tokens[0..n) (n <= SB_MAX_BATCH, already known to fit) through the
 * model at positions n_past.., appends their keys and values to the cache,
 * and leaves the logits of the last token in ctx->logits. */
void sb_llama_forward(struct sb_ctx *ctx, const int32_t *tokens, int32_t n);

#endif
