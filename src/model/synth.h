/*
 * synth.h - the synthetic model generator behind `switchboard gen-model`:
 * a model of any supported architecture with seeded random weights and a
 * byte-level SentencePiece vocabulary (or the vocabulary of another GGUF),
 * written as a GGUF file that llama.cpp loads.
 * Tests, benchmarks and the demo use it because real weights never go into
 * the repository. Weights are scaled so that activations stay near unit size
 * and next-token distributions are peaked, not flat.
 */
#ifndef SB_SYNTH_H
#define SB_SYNTH_H

#include "gguf/gguf.h"
#include "tensor/tensor.h"

typedef struct sb_synth_params {
    const char *arch;       /* general.architecture: llama, qwen2, qwen3, phi3, gemma2 */
    const char *vocab_from; /* copy the tokenizer (and chat template) of this GGUF; NULL: generate one */
    const char *chat_template; /* tokenizer.chat_template text (replaces a copied one); NULL: none/copied */
    int32_t dim, hidden, layers, heads, kv_heads, vocab, ctx; /* vocab: ignored with vocab_from */
    sb_type type;      /* type of the weight matrices (norms stay F32) */
    uint64_t seed;
    float rope_base;
    float logit_scale; /* standard deviation of the logits for a normed input */
    const char *name;  /* general.name */
} sb_synth_params;

/* A small model (dim 64, 2 layers, vocab 512) in F32, seed 1. */
sb_synth_params sb_synth_default_params(void);

/* Builds the model into a writer (caller frees it); tests corrupt its
 * serialized image to make malformed files. */
sb_status sb_synth_build(const sb_synth_params *p, sb_gguf_writer **out, sb_error *err);
sb_status sb_synth_write(const sb_synth_params *p, const char *path, sb_error *err);

#endif
