/*
 * model.c - loading a GGUF file into an sb_model: reading the architecture's
 * hyper-parameters, binding every weight to its place in the mapping with
 * its shape and type checked, and loading the vocabulary. Also the public
 * model and tokenizer entry points of switchboard.h, which forward to the
 * tokenizer module.
 */
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "model/model.h"

/* Reads "<arch>.<suffix>" as a positive int32. */
static sb_status get_dim(const sb_gguf *g, const char *arch, const char *suffix, bool required, int32_t def,
                         int32_t *out, sb_error *err) {
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    uint32_t v;
    sb_status st = required ? sb_gguf_get_u32(g, key, &v, err) : sb_gguf_get_u32_or(g, key, (uint32_t)def, &v, err);
    if (st != SB_OK)
        return st;
    if (v == 0 || v > (1u << 30))
        return sb_fail(err, SB_ERR_FORMAT, "metadata '%s' = %u is out of range", key, v);
    *out = (int32_t)v;
    return SB_OK;
}

static sb_status read_hparams(const sb_gguf *g, sb_hparams *hp, sb_error *err) {
    sb_gguf_str arch;
    sb_status st = sb_gguf_get_str(g, "general.architecture", &arch, err);
    if (st != SB_OK)
        return st;
    if (!(arch.len == 5 && memcmp(arch.ptr, "llama", 5) == 0))
        return sb_fail(err, SB_ERR_UNSUPPORTED, "unsupported architecture '%.*s' (supported: llama)",
                       (int)SB_MIN(arch.len, 64), arch.ptr);
    const char *a = "llama";
    hp->arch = SB_ARCH_LLAMA;
    if ((st = get_dim(g, a, "context_length", true, 0, &hp->n_ctx_train, err)) != SB_OK ||
        (st = get_dim(g, a, "embedding_length", true, 0, &hp->n_embd, err)) != SB_OK ||
        (st = get_dim(g, a, "feed_forward_length", true, 0, &hp->n_ff, err)) != SB_OK ||
        (st = get_dim(g, a, "block_count", true, 0, &hp->n_layer, err)) != SB_OK ||
        (st = get_dim(g, a, "attention.head_count", true, 0, &hp->n_head, err)) != SB_OK ||
        (st = get_dim(g, a, "attention.head_count_kv", false, hp->n_head, &hp->n_head_kv, err)) != SB_OK)
        return st;
    if (hp->n_embd % hp->n_head != 0)
        return sb_fail(err, SB_ERR_FORMAT, "embedding_length %d is not a multiple of head_count %d", hp->n_embd,
                       hp->n_head);
    if (hp->n_head % hp->n_head_kv != 0)
        return sb_fail(err, SB_ERR_FORMAT, "head_count %d is not a multiple of head_count_kv %d", hp->n_head,
                       hp->n_head_kv);
    if ((st = get_dim(g, a, "attention.key_length", false, hp->n_embd / hp->n_head, &hp->head_dim, err)) != SB_OK ||
        (st = get_dim(g, a, "rope.dimension_count", false, hp->head_dim, &hp->n_rot, err)) != SB_OK)
        return st;
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return sb_fail(err, SB_ERR_FORMAT, "rope.dimension_count %d must be even and at most the head size %d",
                       hp->n_rot, hp->head_dim);
    if ((st = sb_gguf_get_f32_or(g, "llama.rope.freq_base", 10000.0f, &hp->rope_freq_base, err)) != SB_OK ||
        (st = sb_gguf_get_f32_or(g, "llama.attention.layer_norm_rms_epsilon", 1e-5f, &hp->rms_eps, err)) != SB_OK)
        return st;
    if (!(hp->rope_freq_base > 0) || !(hp->rms_eps >= 0))
        return sb_fail(err, SB_ERR_FORMAT, "rope.freq_base %g or layer_norm_rms_epsilon %g is out of range",
                       hp->rope_freq_base, hp->rms_eps);
    return SB_OK;
}

/* Binds tensor `name` and checks it is a [n_in, n_out] matrix we can use. */
static sb_status bind(const sb_gguf *g, const char *name, int64_t n_in, int64_t n_out, bool required, sb_weight *w,
                      sb_error *err) {
    const sb_gguf_tensor *t = sb_gguf_find_tensor(g, name);
    if (!t) {
        w->data = NULL;
        return required ? sb_fail(err, SB_ERR_FORMAT, "missing tensor '%s'", name) : SB_OK;
    }
    if (t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != 1 || t->ne[3] != 1)
        return sb_fail(err, SB_ERR_FORMAT, "tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]", name,
                       (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                       (long long)n_in, (long long)n_out);
    bool is_vector = n_out == 1;
    if (is_vector ? t->type != SB_TYPE_F32 : !sb_type_can_matmul(t->type)) {
        const sb_type_traits *tr = sb_type_traits_of(t->type);
        return sb_fail(err, SB_ERR_UNSUPPORTED, "tensor '%s' has type %s, which switchboard cannot compute with yet",
                       name, tr ? tr->name : "unknown");
    }
    *w = (sb_weight){.type = (sb_type)t->type, .n_in = n_in, .n_out = n_out, .data = t->data};
    return SB_OK;
}

static sb_status bind_weights(sb_model *m, sb_error *err) {
    const sb_gguf *g = m->gguf;
    const sb_hparams *hp = &m->hp;
    int64_t q_dim = (int64_t)hp->n_head * hp->head_dim, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    sb_status st;
    if ((st = bind(g, "token_embd.weight", hp->n_embd, hp->n_vocab, true, &m->tok_embd, err)) != SB_OK ||
        (st = bind(g, "output_norm.weight", hp->n_embd, 1, true, &m->output_norm, err)) != SB_OK ||
        (st = bind(g, "output.weight", hp->n_embd, hp->n_vocab, false, &m->output, err)) != SB_OK)
        return st;
    if (!m->output.data)
        m->output = m->tok_embd;
    m->layers = sb_calloc((size_t)hp->n_layer, sizeof(*m->layers));
    if (!m->layers)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for %d layers", hp->n_layer);
    for (int32_t i = 0; i < hp->n_layer; i++) {
        sb_layer *l = &m->layers[i];
        struct {
            const char *name;
            int64_t n_in, n_out;
            sb_weight *w;
        } spec[] = {
            {"attn_norm", hp->n_embd, 1, &l->attn_norm}, {"attn_q", hp->n_embd, q_dim, &l->wq},
            {"attn_k", hp->n_embd, kv_dim, &l->wk},       {"attn_v", hp->n_embd, kv_dim, &l->wv},
            {"attn_output", q_dim, hp->n_embd, &l->wo},   {"ffn_norm", hp->n_embd, 1, &l->ffn_norm},
            {"ffn_gate", hp->n_embd, hp->n_ff, &l->w_gate}, {"ffn_up", hp->n_embd, hp->n_ff, &l->w_up},
            {"ffn_down", hp->n_ff, hp->n_embd, &l->w_down},
        };
        for (size_t j = 0; j < SB_ARRAY_LEN(spec); j++) {
            char name[96];
            snprintf(name, sizeof(name), "blk.%d.%s.weight", i, spec[j].name);
            if ((st = bind(g, name, spec[j].n_in, spec[j].n_out, true, spec[j].w, err)) != SB_OK)
                return st;
        }
    }
    return SB_OK;
}

sb_status sb_model_load(const char *path, sb_model_t **out, sb_error *err) {
    *out = NULL;
    sb_model *m = sb_calloc(1, sizeof(*m));
    if (!m)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    sb_status st = sb_gguf_open(path, &m->gguf, err);
    if (st == SB_OK)
        st = read_hparams(m->gguf, &m->hp, err);
    if (st == SB_OK)
        st = sb_vocab_load(m->gguf, &m->vocab, err);
    if (st == SB_OK) {
        m->hp.n_vocab = sb_vocab_n_tokens(m->vocab);
        st = bind_weights(m, err);
    }
    if (st != SB_OK) {
        /* Messages from the GGUF reader already carry the path. */
        if (err && m->gguf) {
            char inner[sizeof(err->msg)];
            memcpy(inner, err->msg, sizeof(inner));
            sb_fail(err, st, "%s: %s", path, inner);
        }
        sb_model_free(m);
        return st;
    }
    *out = m;
    return SB_OK;
}

void sb_model_free(sb_model_t *m) {
    if (!m)
        return;
    sb_vocab_free(m->vocab);
    sb_free(m->layers);
    sb_gguf_close(m->gguf);
    sb_free(m);
}

int32_t sb_model_n_vocab(const sb_model_t *m) { return m->hp.n_vocab; }
int32_t sb_model_n_ctx_train(const sb_model_t *m) { return m->hp.n_ctx_train; }
int32_t sb_model_token_bos(const sb_model_t *m) { return sb_vocab_bos(m->vocab); }
int32_t sb_model_token_eos(const sb_model_t *m) { return sb_vocab_eos(m->vocab); }
bool sb_model_add_bos(const sb_model_t *m) { return sb_vocab_add_bos(m->vocab); }
bool sb_model_token_is_eog(const sb_model_t *m, int32_t t) { return sb_vocab_is_eog(m->vocab, t); }

sb_status sb_tokenize(const sb_model_t *m, const char *text, size_t len, bool add_special, bool parse_special,
                      int32_t *ids, size_t cap, size_t *n_out, sb_error *err) {
    return sb_vocab_tokenize(m->vocab, text, len, add_special, parse_special, ids, cap, n_out, err);
}

const char *sb_token_text(const sb_model_t *m, int32_t t) { return sb_vocab_text(m->vocab, t); }

sb_status sb_detok_create(const sb_model_t *m, bool strip_leading_space, sb_detok_t **out, sb_error *err) {
    return sb_vocab_detok_create(m->vocab, strip_leading_space, out, err);
}

size_t sb_detok_push(sb_detok_t *d, int32_t t, bool render_special, char *out, size_t cap) {
    return sb_vocab_detok_push(d, t, render_special, out, cap);
}

size_t sb_detok_flush(sb_detok_t *d, char *out, size_t cap) { return sb_vocab_detok_flush(d, out, cap); }

void sb_detok_free(sb_detok_t *d) { sb_vocab_detok_free(d); }

sb_status sb_detokenize(const sb_model_t *m, const int32_t *ids, size_t n, bool strip_leading_space,
                        bool render_special, char *out, size_t cap, size_t *n_out, sb_error *err) {
    return sb_vocab_detokenize(m->vocab, ids, n, strip_leading_space, render_special, out, cap, n_out, err);
}
