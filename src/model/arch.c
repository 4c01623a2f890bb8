/*
 * arch.c - the architectures switchboard runs, as descriptions over the one
 * forward pass, and loading them: reading "<arch>.*" hyper-parameters and
 * binding every tensor to its place in the mapping with its shape and type
 * checked. A file of any other architecture fails to load with a message
 * naming it.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "model/model.h"

static const sb_arch_desc archs[] = {
    {.name = "llama", .rope = SB_ROPE_NORMAL, .act = SB_ACT_SILU},
    {.name = "qwen2", .rope = SB_ROPE_NEOX, .act = SB_ACT_SILU, .qkv_bias = true},
    {.name = "qwen3", .rope = SB_ROPE_NEOX, .act = SB_ACT_SILU, .qk_norm = true},
    {.name = "phi3", .rope = SB_ROPE_NEOX, .act = SB_ACT_SILU, .fused_qkv = true, .fused_gate_up = true},
    {.name = "gemma2", .rope = SB_ROPE_NEOX, .act = SB_ACT_GELU_TANH, .post_norms = true, .embd_scale = true,
     .swa_pattern = 2, .tied_output = true},
};

const sb_arch_desc *sb_arch_find(const char *name, size_t len) {
    for (size_t i = 0; i < SB_ARRAY_LEN(archs); i++)
        if (strlen(archs[i].name) == len && memcmp(archs[i].name, name, len) == 0)
            return &archs[i];
    return NULL;
}

/* "<arch>.<suffix>" as a positive int32 (absent: def, or an error if required). */
static sb_status get_dim(const sb_gguf *g, const char *arch, const char *suffix, bool required, int32_t def,
                         int32_t *out, sb_error *err) {
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    uint32_t v;
    sb_status st = required ? sb_gguf_get_u32(g, key, &v, err) : sb_gguf_get_u32_or(g, key, (uint32_t)def, &v, err);
    if (st != SB_OK)
        return st;
    if ((v == 0 && required) || v > (1u << 30))
        return sb_fail(err, SB_ERR_FORMAT, "metadata '%s' = %u is out of range", key, v);
    *out = (int32_t)v;
    return SB_OK;
}

static sb_status get_float(const sb_gguf *g, const char *arch, const char *suffix, float def, float *out,
                           sb_error *err) {
    char key[128];
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    sb_status st = sb_gguf_get_f32_or(g, key, def, out, err);
    if (st == SB_OK && !(isfinite(*out) && *out >= 0))
        return sb_fail(err, SB_ERR_FORMAT, "metadata '%s' = %g is out of range", key, *out);
    return st;
}

static sb_status read_hparams(const sb_gguf *g, sb_hparams *hp, sb_error *err) {
    sb_gguf_str name;
    sb_status st = sb_gguf_get_str(g, "general.architecture", &name, err);
    if (st != SB_OK)
        return st;
    hp->arch = sb_arch_find(name.ptr, name.len);
    if (!hp->arch) {
        char known[128] = "";
        for (size_t i = 0; i < SB_ARRAY_LEN(archs); i++)
            snprintf(known + strlen(known), sizeof(known) - strlen(known), "%s%s", i ? ", " : "", archs[i].name);
        return sb_fail(err, SB_ERR_UNSUPPORTED, "unsupported architecture '%.*s' (supported: %s)",
                       (int)SB_MIN(name.len, 64), name.ptr, known);
    }
    const char *a = hp->arch->name;
    if ((st = get_dim(g, a, "context_length", true, 0, &hp->n_ctx_train, err)) != SB_OK ||
        (st = get_dim(g, a, "embedding_length", true, 0, &hp->n_embd, err)) != SB_OK ||
        (st = get_dim(g, a, "feed_forward_length", true, 0, &hp->n_ff, err)) != SB_OK ||
        (st = get_dim(g, a, "block_count", true, 0, &hp->n_layer, err)) != SB_OK ||
        (st = get_dim(g, a, "attention.head_count", true, 0, &hp->n_head, err)) != SB_OK ||
        (st = get_dim(g, a, "attention.head_count_kv", false, hp->n_head, &hp->n_head_kv, err)) != SB_OK)
        return st;
    if (hp->n_head_kv == 0 || hp->n_head % hp->n_head_kv != 0)
        return sb_fail(err, SB_ERR_FORMAT, "%s.attention.head_count %d is not a multiple of head_count_kv %d", a,
                       hp->n_head, hp->n_head_kv);
    if (hp->n_embd % hp->n_head != 0 && !sb_gguf_find(g, "llama.attention.key_length"))
        return sb_fail(err, SB_ERR_FORMAT, "%s.embedding_length %d is not a multiple of head_count %d", a,
                       hp->n_embd, hp->n_head);
    if ((st = get_dim(g, a, "attention.key_length", false, hp->n_embd / hp->n_head, &hp->head_dim, err)) != SB_OK ||
        (st = get_dim(g, a, "rope.dimension_count", false, hp->head_dim, &hp->n_rot, err)) != SB_OK ||
        (st = get_dim(g, a, "attention.sliding_window", false, 0, &hp->n_swa, err)) != SB_OK)
        return st;
    if (hp->head_dim == 0 || hp->head_dim > 512 || hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return sb_fail(err, SB_ERR_FORMAT, "%s: head size %d (at most 512) and rope.dimension_count %d (even, at "
                       "most the head size) are out of range", a, hp->head_dim, hp->n_rot);
    if ((st = get_float(g, a, "rope.freq_base", 10000.0f, &hp->rope_freq_base, err)) != SB_OK ||
        (st = get_float(g, a, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->rms_eps, err)) != SB_OK ||
        (st = get_float(g, a, "attn_logit_softcapping", 0.0f, &hp->attn_softcap, err)) != SB_OK ||
        (st = get_float(g, a, "final_logit_softcapping", 0.0f, &hp->logit_softcap, err)) != SB_OK)
        return st;
    if (!(hp->rope_freq_base > 0))
        return sb_fail(err, SB_ERR_FORMAT, "%s.rope.freq_base %g is out of range", a, hp->rope_freq_base);
    return SB_OK;
}

/* Binds tensor `name` as an [n_in, n_out] matrix (n_out == 1: a vector) of
 * a type we can compute with. Absent and optional: w->data = NULL. */
static sb_status bind(const sb_gguf *g, const char *name, int64_t n_in, int64_t n_out, bool required, sb_weight *w,
                      sb_error *err) {
    const sb_gguf_tensor *t = sb_gguf_find_tensor(g, name);
    *w = (sb_weight){0};
    if (!t)
        return required ? sb_fail(err, SB_ERR_FORMAT, "missing tensor '%s'", name) : SB_OK;
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

size_t sb_arch_layer_tensors(const sb_hparams *hp, int32_t il, sb_layer *l, sb_tensor_spec *out) {
    const sb_arch_desc *a = hp->arch;
    int64_t dim = hp->n_embd, q_dim = (int64_t)hp->n_head * hp->head_dim;
    int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim, ff = hp->n_ff;
    const struct {
        const char *suffix;
        int64_t n_in, n_out;
        bool required;
        sb_weight *w;
    } spec[] = {
        {"attn_norm.weight", dim, 1, true, &l->attn_norm},
        {"attn_q.weight", dim, q_dim, !a->fused_qkv, &l->wq},
        {"attn_k.weight", dim, kv_dim, !a->fused_qkv, &l->wk},
        {"attn_v.weight", dim, kv_dim, !a->fused_qkv, &l->wv},
        {"attn_qkv.weight", dim, q_dim + 2 * kv_dim, a->fused_qkv, &l->wqkv},
        {"attn_q.bias", q_dim, 1, a->qkv_bias, &l->bq},
        {"attn_k.bias", kv_dim, 1, a->qkv_bias, &l->bk},
        {"attn_v.bias", kv_dim, 1, a->qkv_bias, &l->bv},
        {"attn_q_norm.weight", hp->head_dim, 1, a->qk_norm, &l->q_norm},
        {"attn_k_norm.weight", hp->head_dim, 1, a->qk_norm, &l->k_norm},
        {"attn_output.weight", q_dim, dim, true, &l->wo},
        {"post_attention_norm.weight", dim, 1, a->post_norms, &l->post_attn_norm},
        {"ffn_norm.weight", dim, 1, true, &l->ffn_norm},
        {"ffn_gate.weight", dim, ff, !a->fused_gate_up, &l->w_gate},
        {"ffn_up.weight", dim, a->fused_gate_up ? 2 * ff : ff, true, &l->w_up},
        {"ffn_down.weight", ff, dim, true, &l->w_down},
        {"post_ffw_norm.weight", dim, 1, a->post_norms, &l->post_ffn_norm},
    };
    _Static_assert(SB_ARRAY_LEN(spec) <= SB_MAX_LAYER_TENSORS, "SB_MAX_LAYER_TENSORS");
    for (size_t j = 0; j < SB_ARRAY_LEN(spec); j++) {
        out[j] = (sb_tensor_spec){.n_in = spec[j].n_in, .n_out = spec[j].n_out, .required = spec[j].required,
                                  .w = spec[j].w};
        snprintf(out[j].name, sizeof(out[j].name), "blk.%d.%s", il, spec[j].suffix);
    }
    return SB_ARRAY_LEN(spec);
}

static sb_status bind_layer(const sb_gguf *g, const sb_hparams *hp, int32_t il, sb_layer *l, sb_error *err) {
    sb_tensor_spec spec[SB_MAX_LAYER_TENSORS];
    size_t n = sb_arch_layer_tensors(hp, il, l, spec);
    for (size_t j = 0; j < n; j++) {
        sb_status st = bind(g, spec[j].name, spec[j].n_in, spec[j].n_out, spec[j].required, spec[j].w, err);
        if (st != SB_OK)
            return st;
    }
    const sb_arch_desc *a = hp->arch;
    l->swa = hp->n_swa > 0 && a->swa_pattern > 0 && il % a->swa_pattern < a->swa_pattern - 1;
    return SB_OK;
}

sb_status sb_arch_load(sb_model *m, sb_error *err) {
    const sb_gguf *g = m->gguf;
    sb_hparams *hp = &m->hp;
    sb_status st = read_hparams(g, hp, err);
    if (st != SB_OK)
        return st;
    /* The vocabulary size is the embedding's row count; the caller checks
     * the tokenizer agrees. */
    const sb_gguf_tensor *embd = sb_gguf_find_tensor(g, "token_embd.weight");
    if (!embd)
        return sb_fail(err, SB_ERR_FORMAT, "missing tensor 'token_embd.weight'");
    if (embd->ne[1] > INT32_MAX)
        return sb_fail(err, SB_ERR_FORMAT, "token_embd.weight has %lld rows, too many", (long long)embd->ne[1]);
    hp->n_vocab = (int32_t)embd->ne[1];
    if ((st = bind(g, "token_embd.weight", hp->n_embd, hp->n_vocab, true, &m->tok_embd, err)) != SB_OK ||
        (st = bind(g, "output_norm.weight", hp->n_embd, 1, true, &m->output_norm, err)) != SB_OK ||
        (st = bind(g, "output.weight", hp->n_embd, hp->n_vocab, false, &m->output, err)) != SB_OK ||
        (st = bind(g, "rope_freqs.weight", hp->n_rot / 2, 1, false, &m->rope_freqs, err)) != SB_OK)
        return st;
    if (!m->output.data)
        m->output = m->tok_embd;
    /* block_count is only a number in the file: before anything is sized by
     * it, the file must hold every layer's required tensors (so the layers
     * cost at most what the tensor table already does), and the last layer's
     * first. Then binding names the first tensor that is missing. */
    sb_layer probe;
    sb_tensor_spec spec[SB_MAX_LAYER_TENSORS];
    uint64_t required = 0;
    size_t n_spec = sb_arch_layer_tensors(hp, hp->n_layer - 1, &probe, spec);
    for (size_t j = 0; j < n_spec; j++)
        required += spec[j].required;
    if ((uint64_t)hp->n_layer * required > g->n_tensors)
        return sb_fail(err, SB_ERR_FORMAT, "%s.block_count %d needs at least %llu tensors; the file has %llu",
                       hp->arch->name, hp->n_layer, (unsigned long long)((uint64_t)hp->n_layer * required),
                       (unsigned long long)g->n_tensors);
    if (!sb_gguf_find_tensor(g, spec[0].name))
        return sb_fail(err, SB_ERR_FORMAT, "%s.block_count is %d but tensor '%s' of its last layer is missing",
                       hp->arch->name, hp->n_layer, spec[0].name);
    m->layers = sb_calloc((size_t)hp->n_layer, sizeof(*m->layers));
    if (!m->layers)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for %d layers", hp->n_layer);
    for (int32_t il = 0; il < hp->n_layer; il++)
        if ((st = bind_layer(g, hp, il, &m->layers[il], err)) != SB_OK)
            return st;
    return SB_OK;
}
