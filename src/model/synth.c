/*
 * synth.c - see synth.h.
 *
 * The vocabulary is built by levels so every piece is the concatenation of
 * two earlier pieces (SentencePiece merging can reach all of them): the
 * specials <unk> <s> </s>, the 256 byte tokens <0xXX>, "▁" and the printable
 * ASCII characters, then "▁a".."▁z", "aa".."zz", "▁aa".., "aaa".. until the
 * requested size. Earlier pieces get higher scores.
 */
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "base/rng.h"
#include "model/model.h"
#include "model/synth.h"

#define SPACE "\xe2\x96\x81" /* U+2581, SentencePiece's visible space */

enum { TOKEN_NORMAL = 1, TOKEN_UNKNOWN = 2, TOKEN_CONTROL = 3, TOKEN_BYTE = 6 };

/* Ids below this are the three specials and the 256 byte tokens. */
#define SYNTH_FIRST_NORMAL 259

sb_synth_params sb_synth_default_params(void) {
    return (sb_synth_params){.arch = "llama", .dim = 64, .hidden = 172, .layers = 2, .heads = 8, .kv_heads = 4,
                             .vocab = 512, .ctx = 512, .type = SB_TYPE_F32, .seed = 1, .rope_base = 10000.0f,
                             .logit_scale = 4.0f, .name = "switchboard-synthetic"};
}

/* Appends lowercase strings of `len` letters, optionally after "▁", in
 * lexicographic order, until the vocabulary is full. */
static void add_letter_level(char **pieces, int32_t *n, int32_t cap, int len, bool space) {
    int32_t total = 1;
    for (int i = 0; i < len; i++)
        total *= 26;
    for (int32_t k = 0; k < total && *n < cap; k++) {
        char s[16];
        int o = 0;
        if (space)
            o += sprintf(s, SPACE);
        for (int i = len - 1, v = k; i >= 0; i--, v /= 26)
            s[o + i] = (char)('a' + v % 26);
        s[o + len] = '\0';
        pieces[(*n)++] = sb_strndup(s, strlen(s));
    }
}

static sb_status build_vocab(sb_gguf_writer *w, int32_t n_vocab, sb_error *err) {
    char **pieces = sb_calloc((size_t)n_vocab, sizeof(char *));
    float *scores = sb_calloc((size_t)n_vocab, sizeof(float));
    int32_t *types = sb_calloc((size_t)n_vocab, sizeof(int32_t));
    sb_status st = SB_OK;
    if (!pieces || !scores || !types) {
        st = sb_fail(err, SB_ERR_NOMEM, "out of memory for the vocabulary");
        goto done;
    }
    int32_t n = 0;
    const char *specials[] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++) {
        types[n] = i == 0 ? TOKEN_UNKNOWN : TOKEN_CONTROL;
        pieces[n++] = sb_strndup(specials[i], strlen(specials[i]));
    }
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof(s), "<0x%02X>", b);
        types[n] = TOKEN_BYTE;
        pieces[n++] = sb_strndup(s, strlen(s));
    }
    int32_t first_normal = n;
    pieces[n++] = sb_strndup(SPACE, strlen(SPACE));
    for (char ch = '!'; ch <= '~' && n < n_vocab; ch++)
        pieces[n++] = sb_strndup(&ch, 1);
    for (int len = 1; len <= 4 && n < n_vocab; len++) {
        add_letter_level(pieces, &n, n_vocab, len, true);
        if (len < 4)
            add_letter_level(pieces, &n, n_vocab, len + 1, false);
    }
    if (n < n_vocab) {
        st = sb_fail(err, SB_ERR_INVALID_ARG, "vocabulary size %d is larger than the generator supports (%d)", n_vocab,
                     n);
        goto done;
    }
    for (int32_t i = 0; i < n; i++) {
        if (!pieces[i]) {
            st = sb_fail(err, SB_ERR_NOMEM, "out of memory for the vocabulary");
            goto done;
        }
        if (i >= first_normal) {
            types[i] = TOKEN_NORMAL;
            scores[i] = -(float)(i - first_normal);
        }
    }
    sb_gguf_set_str(w, "tokenizer.ggml.model", "llama");
    sb_gguf_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)pieces, (uint64_t)n);
    sb_gguf_set_arr(w, "tokenizer.ggml.scores", SB_GGUF_FLOAT32, scores, (uint64_t)n);
    sb_gguf_set_arr(w, "tokenizer.ggml.token_type", SB_GGUF_INT32, types, (uint64_t)n);
    sb_gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    sb_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    sb_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    sb_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    sb_gguf_set_bool(w, "tokenizer.ggml.add_eos_token", false);
done:
    if (pieces)
        for (int32_t i = 0; i < n_vocab; i++)
            sb_free(pieces[i]);
    sb_free(pieces);
    sb_free(scores);
    sb_free(types);
    return st;
}

/* llama.cpp's general.file_type for a model whose matrices are `type`. */
static uint32_t file_type_of(sb_type type) {
    switch (type) {
    case SB_TYPE_F32: return 0;
    case SB_TYPE_F16: return 1;
    case SB_TYPE_Q4_0: return 2;
    case SB_TYPE_Q4_1: return 3;
    case SB_TYPE_Q8_0: return 7;
    case SB_TYPE_Q5_0: return 8;
    case SB_TYPE_Q5_1: return 9;
    case SB_TYPE_BF16: return 32;
    default: return 0;
    }
}

/* Adds a [n_in, n_out] tensor of N(0, std^2) values (or all `fill` when std
 * is 0), stored as `type` or, if rows do not split into its blocks, as F16
 * (what llama.cpp's quantizer does). Rows below `quiet_rows` get a quarter of
 * the spread: in the output matrix those are the special and byte tokens,
 * which a random model would otherwise emit as often as text. */
static sb_status add_random(sb_gguf_writer *w, sb_rng *rng, const char *name, sb_type type, int64_t n_in,
                            int64_t n_out, float std, float fill, int64_t quiet_rows, sb_error *err) {
    const sb_type_traits *tr = sb_type_traits_of(type);
    if (n_out == 1 || n_in % tr->blck_size != 0)
        type = n_out == 1 ? SB_TYPE_F32 : SB_TYPE_F16;
    tr = sb_type_traits_of(type);
    size_t row_bytes = sb_type_row_size(type, n_in);
    float *row = sb_malloc((size_t)n_in * sizeof(float));
    uint8_t *data = sb_malloc(row_bytes * (size_t)n_out);
    if (!row || !data) {
        sb_free(row);
        sb_free(data);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory generating tensor '%s'", name);
    }
    for (int64_t r = 0; r < n_out; r++) {
        for (int64_t i = 0; i < n_in; i++)
            row[i] = std > 0 ? (r < quiet_rows ? 0.25f : 1.0f) * std * sb_rng_normal(rng) : fill;
        tr->from_float(row, data + (size_t)r * row_bytes, n_in);
    }
    int64_t ne[2] = {n_in, n_out};
    sb_gguf_add_tensor(w, name, type, n_out == 1 ? 1 : 2, ne, data, row_bytes * (size_t)n_out);
    sb_free(row);
    sb_free(data);
    return SB_OK;
}

static sb_status check_params(const sb_synth_params *p, const sb_arch_desc *arch, sb_error *err) {
    const sb_type_traits *tr = sb_type_traits_of(p->type);
    if (!arch)
        return sb_fail(err, SB_ERR_INVALID_ARG, "unknown architecture '%s' (llama, qwen2, qwen3, phi3, gemma2)",
                       p->arch);
    if (!tr || !tr->from_float || !sb_type_can_matmul(p->type))
        return sb_fail(err, SB_ERR_INVALID_ARG, "weight type %s cannot be generated", tr ? tr->name : "unknown");
    if (p->dim <= 0 || p->hidden <= 0 || p->layers <= 0 || p->heads <= 0 || p->kv_heads <= 0 || p->ctx <= 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "dimensions must be positive");
    if (p->dim % p->heads != 0 || (p->dim / p->heads) % 2 != 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "dim %d must split into %d heads of even size", p->dim, p->heads);
    if (p->heads % p->kv_heads != 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "heads %d must be a multiple of kv-heads %d", p->heads, p->kv_heads);
    if (!p->vocab_from && p->vocab < 260)
        return sb_fail(err, SB_ERR_INVALID_ARG, "vocab %d is too small: 259 ids are specials and bytes", p->vocab);
    return SB_OK;
}

/* Copies every tokenizer.* entry of another GGUF (vocabulary, merges,
 * special ids, chat template); *n_vocab receives its token count. */
static sb_status copy_vocab(sb_gguf_writer *w, const char *path, bool skip_template, int32_t *n_vocab,
                            sb_error *err) {
    sb_gguf *src;
    sb_status st = sb_gguf_open(path, &src, err);
    if (st != SB_OK)
        return st;
    const sb_gguf_kv *tokens;
    st = sb_gguf_get_arr(src, "tokenizer.ggml.tokens", SB_GGUF_STRING, &tokens, err);
    if (st == SB_OK) {
        *n_vocab = (int32_t)tokens->arr_n;
        for (uint64_t i = 0; i < src->n_kv; i++) {
            sb_gguf_str key = src->kv[i].key;
            bool is_template = key.len == 23 && memcmp(key.ptr, "tokenizer.chat_template", 23) == 0;
            if (key.len > 10 && memcmp(key.ptr, "tokenizer.", 10) == 0 && !(is_template && skip_template))
                sb_gguf_copy_kv(w, &src->kv[i]);
        }
    }
    sb_gguf_close(src);
    return st;
}

static void set_arch_u32(sb_gguf_writer *w, const char *arch, const char *suffix, uint32_t v) {
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    sb_gguf_set_u32(w, key, v);
}

static void set_arch_f32(sb_gguf_writer *w, const char *arch, const char *suffix, float v) {
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    sb_gguf_set_f32(w, key, v);
}

sb_status sb_synth_build(const sb_synth_params *p, sb_gguf_writer **out, sb_error *err) {
    *out = NULL;
    const sb_arch_desc *arch = sb_arch_find(p->arch, strlen(p->arch));
    sb_status st = check_params(p, arch, err);
    if (st != SB_OK)
        return st;
    sb_gguf_writer *w = sb_gguf_writer_create();
    if (!w)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    int32_t n_vocab = p->vocab;
    sb_hparams hp = {.arch = arch, .n_embd = p->dim, .n_ff = p->hidden, .n_layer = p->layers, .n_head = p->heads,
                     .n_head_kv = p->kv_heads, .head_dim = p->dim / p->heads};
    const char *a = arch->name;
    sb_gguf_set_str(w, "general.architecture", a);
    sb_gguf_set_str(w, "general.name", p->name);
    sb_gguf_set_u32(w, "general.alignment", SB_GGUF_DEFAULT_ALIGNMENT);
    sb_gguf_set_u32(w, "general.file_type", file_type_of(p->type));
    if (p->type != SB_TYPE_F32 && p->type != SB_TYPE_F16 && p->type != SB_TYPE_BF16)
        sb_gguf_set_u32(w, "general.quantization_version", 2);
    st = p->vocab_from ? copy_vocab(w, p->vocab_from, p->chat_template != NULL, &n_vocab, err)
                       : build_vocab(w, p->vocab, err);
    if (p->chat_template)
        sb_gguf_set_str(w, "tokenizer.chat_template", p->chat_template);
    set_arch_u32(w, a, "context_length", (uint32_t)p->ctx);
    set_arch_u32(w, a, "embedding_length", (uint32_t)p->dim);
    set_arch_u32(w, a, "block_count", (uint32_t)p->layers);
    set_arch_u32(w, a, "feed_forward_length", (uint32_t)p->hidden);
    set_arch_u32(w, a, "attention.head_count", (uint32_t)p->heads);
    set_arch_u32(w, a, "attention.head_count_kv", (uint32_t)p->kv_heads);
    set_arch_u32(w, a, "attention.key_length", (uint32_t)hp.head_dim);
    set_arch_u32(w, a, "attention.value_length", (uint32_t)hp.head_dim);
    set_arch_u32(w, a, "rope.dimension_count", (uint32_t)hp.head_dim);
    set_arch_f32(w, a, "rope.freq_base", p->rope_base);
    set_arch_f32(w, a, "attention.layer_norm_rms_epsilon", 1e-5f);
    set_arch_u32(w, a, "vocab_size", (uint32_t)n_vocab);
    if (arch->swa_pattern > 0) { /* gemma2's defaults */
        set_arch_u32(w, a, "attention.sliding_window", (uint32_t)SB_MIN(p->ctx, 4096));
        set_arch_f32(w, a, "attn_logit_softcapping", 50.0f);
        set_arch_f32(w, a, "final_logit_softcapping", 30.0f);
    }

    sb_rng rng;
    sb_rng_seed(&rng, p->seed);
    /* Unit-variance inputs give unit-variance outputs with std 1/sqrt(n_in);
     * the projections back into the residual stream are scaled down by the
     * depth so that the stream does not grow layer after layer. Norm weights
     * are 1, biases small noise. */
    float in_std = 1.0f / sqrtf((float)p->dim), resid = 1.0f / sqrtf(2.0f * (float)p->layers);
    /* A tied output reads the embedding back: if the residual stream stayed
     * close to the input embedding, every token would predict itself. Such
     * models get embeddings at the logit scale and undamped layers. */
    float embd_std = 1.0f;
    if (arch->tied_output) {
        embd_std = p->logit_scale * in_std;
        resid = 1.0f;
    }
    if (st == SB_OK)
        st = add_random(w, &rng, "token_embd.weight", p->type, p->dim, n_vocab, embd_std, 0, 0, err);
    for (int32_t il = 0; il < p->layers && st == SB_OK; il++) {
        sb_layer l;
        sb_tensor_spec spec[SB_MAX_LAYER_TENSORS];
        size_t n = sb_arch_layer_tensors(&hp, il, &l, spec);
        for (size_t j = 0; j < n && st == SB_OK; j++) {
            if (!spec[j].required)
                continue;
            bool to_residual = spec[j].w == &l.wo || spec[j].w == &l.w_down;
            bool bias = spec[j].w == &l.bq || spec[j].w == &l.bk || spec[j].w == &l.bv;
            float std = spec[j].n_out > 1 ? (to_residual ? resid : 1.0f) / sqrtf((float)spec[j].n_in) : bias ? 0.5f : 0;
            st = add_random(w, &rng, spec[j].name, p->type, spec[j].n_in, spec[j].n_out, std, 1.0f, 0, err);
        }
    }
    if (st == SB_OK)
        st = add_random(w, &rng, "output_norm.weight", p->type, p->dim, 1, 0, 1.0f, 0, err);
    if (st == SB_OK && !arch->tied_output)
        st = add_random(w, &rng, "output.weight", p->type, p->dim, n_vocab, p->logit_scale * in_std, 0,
                        p->vocab_from ? 0 : SYNTH_FIRST_NORMAL, err);
    if (st != SB_OK) {
        sb_gguf_writer_free(w);
        return st;
    }
    *out = w;
    return SB_OK;
}

sb_status sb_synth_write(const sb_synth_params *p, const char *path, sb_error *err) {
    sb_gguf_writer *w;
    sb_status st = sb_synth_build(p, &w, err);
    if (st == SB_OK)
        st = sb_gguf_writer_save(w, path, err);
    sb_gguf_writer_free(w);
    return st;
}
