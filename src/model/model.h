/*
 * model.h - a loaded model (hyper-parameters, weights bound to the GGUF
 * mapping, vocabulary), the paged KV storage, and the batched forward pass
 * that every user of the engine goes through: the single-sequence sb_ctx of
 * the public API and the multi-sequence scheduler alike.
 *
 * Architectures are descriptions (sb_arch_desc) over one forward pass: the
 * llama family's block with switches for what each family adds (QKV biases,
 * per-head Q/K norms, fused projections, GeGLU, post-norms, soft-capping,
 * sliding windows, NEOX rotation).
 *
 * Ownership: sb_model owns the sb_gguf (and so the mapping every weight
 * points into) and the vocabulary. Everything else borrows the model, which
 * must outlive it.
 */
#ifndef SB_MODEL_H
#define SB_MODEL_H

#include <time.h>

#include "gguf/gguf.h"
#include "switchboard.h"
#include "tensor/tensor.h"
#include "tensor/threadpool.h"
#include "tokenizer/vocab.h"

typedef struct sb_model sb_model;
typedef struct sb_ctx sb_ctx;

typedef enum sb_rope_kind {
    SB_ROPE_NORMAL, /* GGML "normal": rotate adjacent pairs (x[2i], x[2i+1]) */
    SB_ROPE_NEOX,   /* rotate (x[i], x[i + n_rot/2]) */
} sb_rope_kind;

typedef enum sb_ffn_act {
    SB_ACT_SILU,      /* SwiGLU: silu(gate) * up */
    SB_ACT_GELU_TANH, /* GeGLU: gelu_tanh(gate) * up */
} sb_ffn_act;

/* What an architecture adds to the llama block. */
typedef struct sb_arch_desc {
    const char *name; /* general.architecture, and the prefix of its keys */
    sb_rope_kind rope;
    sb_ffn_act act;
    bool qk_norm;       /* RMSNorm over each head of Q and K before RoPE (qwen3) */
    bool fused_qkv;     /* one attn_qkv matrix (phi3) */
    bool fused_gate_up; /* ffn_up holds gate then up (phi3) */
    bool post_norms;    /* RMSNorm after attention and after the FFN (gemma2) */
    bool embd_scale;    /* inputs scaled by sqrt(n_embd) (gemma) */
    int swa_pattern;    /* > 0: layers with il % swa_pattern < swa_pattern-1 use the sliding window */
    bool qkv_bias;      /* files carry attn_q/k/v biases (qwen2); optional for the others */
    bool tied_output;   /* files have no output.weight: the output is token_embd (gemma2) */
} sb_arch_desc;

typedef struct sb_hparams {
    const sb_arch_desc *arch;
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
    float attn_softcap;  /* 0: off; else scores = c * tanh(scores / c) */
    float logit_softcap; /* 0: off */
    int32_t n_swa;       /* sliding-window length for SWA layers; 0: none */
} sb_hparams;

/* A matrix, or a vector when n_out == 1, inside the mapping (or, packed,
 * in the model's packed copy); data is NULL for an optional tensor the file
 * does not have. */
typedef struct sb_weight {
    sb_type type;
    int64_t n_in;  /* ne[0]: elements per row */
    int64_t n_out; /* ne[1]: rows */
    const void *data;
    bool packed; /* data is in sb_weight_pack's layout (matrix products; rows by sb_get_row) */
} sb_weight;

typedef struct sb_layer {
    sb_weight attn_norm;                   /* (n_embd) */
    sb_weight wq, wk, wv;                  /* (n_head*hd | n_head_kv*hd, n_embd); or wqkv */
    sb_weight wqkv;                        /* fused (q_dim + 2*kv_dim, n_embd) */
    sb_weight bq, bk, bv;                  /* optional biases */
    sb_weight q_norm, k_norm;              /* (head_dim) qwen3 */
    sb_weight wo;                          /* (n_embd, n_head*hd) */
    sb_weight post_attn_norm;              /* (n_embd) gemma2 */
    sb_weight ffn_norm;                    /* (n_embd) */
    sb_weight w_gate, w_up;                /* (n_ff, n_embd); w_up is (2*n_ff) when fused */
    sb_weight w_down;                      /* (n_embd, n_ff) */
    sb_weight post_ffn_norm;               /* (n_embd) gemma2 */
    bool swa;                              /* this layer uses the sliding window */
} sb_layer;

struct sb_model {
    sb_gguf *gguf;
    sb_vocab *vocab;
    sb_hparams hp;
    sb_weight tok_embd;    /* (n_vocab, n_embd) */
    sb_weight output_norm; /* (n_embd) */
    sb_weight output;      /* (n_vocab, n_embd); tok_embd when the file ties them */
    sb_weight rope_freqs;  /* optional (n_rot/2) divisors of the rotation frequencies (Llama 3.1) */
    sb_layer *layers;      /* n_layer */
    void *packed;          /* the packed matrices and the embedding table's copy (one allocation) */
    size_t packed_bytes;   /* its size */
    size_t counted_bytes;  /* the weights told to sb_kernels_weights_loaded, to be told unloaded */
    void *reuse;           /* while loading: an earlier model's packed allocation to pack into (owned) */
};

/* Architecture table (arch.c). */
const sb_arch_desc *sb_arch_find(const char *name, size_t len);

/* One tensor of a layer: "blk.<il>.<suffix>", its shape (n_out == 1: a
 * vector), whether files of the architecture carry it, and where it binds. */
typedef struct sb_tensor_spec {
    char name[64];
    int64_t n_in, n_out;
    bool required;
    sb_weight *w;
} sb_tensor_spec;
#define SB_MAX_LAYER_TENSORS 24
/* Fills out[] with layer il's tensors (binding into l); returns the count. */
size_t sb_arch_layer_tensors(const sb_hparams *hp, int32_t il, sb_layer *l, sb_tensor_spec *out);
/* Reads the architecture's hyper-parameters and binds its tensors. */
sb_status sb_arch_load(sb_model *m, sb_error *err);
/* Moves the matrices the active kernels multiply faster packed, and the
 * token embedding table as it is, into m->packed (huge pages where the
 * system gives them; the mapping's pages of the originals are given back). */
sb_status sb_model_pack(sb_model *m, sb_error *err);
/* sb_model_load from a file image the caller keeps alive until the model is
 * freed (the fuzzers' entry; tensors point into it). */
sb_status sb__model_load_memory(const void *data, uint64_t size, sb_model **out, sb_error *err);
/* sb_model_load_with, packing into `region` (an allocation sb__model_take_packed
 * gave; ownership passes in, freed on failure; NULL: a fresh one). Its pages
 * are in memory already, and faulting in and zeroing fresh pages is most of
 * what a load costs once the file is in the page cache. */
sb_status sb__model_load_reusing(const char *path, const sb_model_params *params, void *region, sb_model **out,
                                 sb_error *err);
/* Takes the packed allocation out of m (which must then only be freed);
 * the caller owns it (sb_free, or pass it to sb__model_load_reusing). */
void *sb__model_take_packed(sb_model *m);

/* ---- paged KV storage ---------------------------------------------------- */

/* Keys and values for n_blocks blocks of block_size positions each, per
 * layer, F32. A sequence owns a list of blocks (its block table): position
 * p lives in block table[p / block_size] at slot p % block_size. Who owns
 * which block is the caller's business (sb_ctx: one sequence holding all;
 * the engine: a block allocator with prefix sharing). Within a block the
 * positions of one KV head are contiguous, so attention (one head at a
 * time) reads each block's keys and values as one stream. */
typedef struct sb_kv {
    int32_t n_layer, n_head_kv, head_dim, block_size, n_blocks;
    sb_type type; /* F32 (exact attention), F16 (llama.cpp's default) or Q8_0 */
    size_t row;   /* bytes of one head's key or value: head_dim elements of type */
    uint8_t *k;   /* (n_layer, n_blocks, n_head_kv, block_size) rows, 64-byte aligned */
    uint8_t *v;   /* same */
    void *k_mem, *v_mem; /* the allocations k and v lie in */
} sb_kv;

sb_status sb_kv_init(sb_kv *kv, const sb_model *m, int32_t n_blocks, int32_t block_size, sb_cache_type type,
                     sb_error *err);
void sb_kv_free(sb_kv *kv);

static inline size_t sb_kv_offset(const sb_kv *kv, int32_t layer, int32_t block, int32_t head, int32_t slot) {
    return ((((size_t)layer * kv->n_blocks + (size_t)block) * kv->n_head_kv + (size_t)head) * kv->block_size +
            (size_t)slot) *
           kv->row;
}
static inline void *sb_kv_k(const sb_kv *kv, int32_t layer, int32_t block, int32_t head, int32_t slot) {
    return kv->k + sb_kv_offset(kv, layer, block, head, slot);
}
static inline void *sb_kv_v(const sb_kv *kv, int32_t layer, int32_t block, int32_t head, int32_t slot) {
    return kv->v + sb_kv_offset(kv, layer, block, head, slot);
}

/* ---- the batched forward pass -------------------------------------------- */

/* One token of a batch: it is at position `pos` of the sequence whose
 * blocks are `blocks`, attends to positions 0..pos of that sequence (the
 * batch's own earlier tokens of the sequence included), and its keys and
 * values are written at `pos`. */
typedef struct sb_batch_token {
    int32_t token;
    int32_t pos;
    const int32_t *blocks; /* the sequence's block table, covering pos */
    bool want_logits;      /* compute the next-token logits after this token */
    bool want_embd;        /* keep the final normed hidden state (embeddings) */
} sb_batch_token;

/* Where forward passes spend their time, summed over the passes run while
 * sb_forward.prof is set (bench_engine --profile): seconds of
 * sb_forward.prof_clock on the calling thread (wall time, each parallel
 * loop's waits included; or the thread's CPU time). While profiled, the
 * products of one input (a layer's q, k and v; gate and up) run as one
 * parallel loop per matrix, so that each is charged to its type: a few
 * microseconds of extra hand-offs per layer. */
typedef enum sb_fwd_part {
    SB_FWD_PRODUCTS,  /* the layers' matrix products (by type: type_s) */
    SB_FWD_HEAD,      /* the output matrix's product */
    SB_FWD_NORMS,     /* RMSNorms, the embedding lookup, RoPE angles */
    SB_FWD_PLACE,     /* per-head Q/K norms, RoPE, KV stores */
    SB_FWD_ATTENTION, /* scores, softmax, weighted values */
    SB_FWD_GLU,       /* the gated activation */
    SB_FWD_OTHER,     /* biases, splitting fused products, post-norm additions, soft-caps */
    SB_FWD_N_PARTS
} sb_fwd_part;

/* Seconds on clock c (a profile's clock). */
static inline double sb__clock_s(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct sb_fwd_profile {
    double part_s[SB_FWD_N_PARTS];
    double type_s[SB_TYPE_COUNT];    /* SB_FWD_PRODUCTS by weight type */
    bool type_packed[SB_TYPE_COUNT]; /* some matrix of that type was multiplied packed */
    sb_type head_type;
    bool head_packed;
} sb_fwd_profile;

/* Scratch for batches of up to max_tokens tokens, at most max_logits of
 * which want logits, from sequences at most max_len long; on a thread pool. */
typedef struct sb_forward {
    const sb_model *model;
    sb_threadpool *pool; /* borrowed */
    int32_t max_tokens, max_logits, max_len;
    float *x;      /* (max_tokens, n_embd) residual stream */
    float *xb;     /* (max_tokens, max(n_embd, q_dim)) normed input of a block */
    float *q;      /* (max_tokens, q_dim) */
    float *k, *v;  /* (max_tokens, kv_dim) */
    float *att;    /* (max_tokens, q_dim) attention output */
    float *hb;     /* (max_tokens, max(2*n_ff, q_dim + 2*kv_dim)): fused products land here */
    float *hb2;    /* (max_tokens, n_ff) */
    float *rope_cs; /* (max_tokens, n_rot) cos and sin of each token's rotation angles */
    float *scores; /* (n_threads, ATTN_GROUP, max_len) attention weights of a group of tokens per thread */
    int32_t *group_start; /* (max_tokens + 1) attention groups of the current batch */
    float *logits; /* (max_logits, n_vocab) */
    float *embd;   /* (max_tokens, n_embd): final normed hidden state of tokens that want it */
    void *work;    /* sb_matmul scratch */
    sb_fwd_profile *prof; /* NULL: not timed (the default); else passes add to it */
    clockid_t prof_clock; /* what prof counts: CLOCK_MONOTONIC or CLOCK_THREAD_CPUTIME_ID */
} sb_forward;

sb_status sb_forward_init(sb_forward *f, const sb_model *m, sb_threadpool *pool, int32_t max_tokens,
                          int32_t max_logits, int32_t max_len, sb_error *err);
void sb_forward_free(sb_forward *f);

/* Runs a batch (n <= max_tokens, at most max_logits wanting logits) through
 * the model, writing its keys and values into kv, and leaves the logits of
 * the tokens that want them in f->logits, one row per such token, in batch
 * order, and the final hidden states of tokens that want them in f->embd
 * at their batch index. Returns the number of logits rows. */
int32_t sb_forward_run(sb_forward *f, sb_kv *kv, const sb_batch_token *batch, int32_t n);
/* sb_forward_run in its two parts: the layers, leaving the final normed
 * hidden state of each token that wants logits in out (n_embd floats per
 * row, in batch order; f->xb, or another forward's rows: any buffer that
 * the pass itself does not use), returning how many; and the output
 * matrix's logits of such rows, into f->logits. Split, several forwards'
 * layers (one thread each) can share one output product on the pool. */
int32_t sb_forward_layers(sb_forward *f, sb_kv *kv, const sb_batch_token *batch, int32_t n, float *out);
void sb_forward_logits(sb_forward *f, const float *normed, int32_t n_out);

/* ---- the single-sequence context of the public API ------------------------ */

struct sb_ctx {
    const sb_model *model;
    int32_t n_ctx;
    int32_t n_past;
    sb_threadpool *pool;
    sb_kv kv;           /* one block of n_ctx positions */
    sb_forward fwd;
    sb_batch_token *batch; /* (SB_MAX_BATCH) */
    bool has_logits;
};

/* Tokens per forward step when a prompt is evaluated in chunks. */
#define SB_MAX_BATCH 512

#endif
