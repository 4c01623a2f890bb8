/*
 * context.c - the inference context: a KV cache sized for n_ctx tokens,
 * scratch buffers for one chunk of tokens, and the public entry points that
 * feed tokens through the forward pass in chunks.
 */
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "model/model.h"
#include "tensor/threadpool.h"

#define SB_DEFAULT_MAX_CTX 4096

sb_ctx_params sb_ctx_default_params(void) { return (sb_ctx_params){.n_ctx = 0, .n_threads = 0}; }

sb_status sb_ctx_create(const sb_model_t *model, const sb_ctx_params *params, sb_ctx_t **out, sb_error *err) {
    *out = NULL;
    sb_ctx_params p = params ? *params : sb_ctx_default_params();
    const sb_hparams *hp = &model->hp;
    if (p.n_ctx < 0 || p.n_threads < 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "n_ctx (%d) and n_threads (%d) must not be negative", p.n_ctx,
                       p.n_threads);
    if (p.n_ctx == 0)
        p.n_ctx = SB_MIN(hp->n_ctx_train, SB_DEFAULT_MAX_CTX);
    sb_ctx *c = sb_calloc(1, sizeof(*c));
    if (!c)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    c->model = model;
    c->n_ctx = p.n_ctx;
    int n_threads = p.n_threads ? p.n_threads : SB_MAX(1, (int)sysconf(_SC_NPROCESSORS_ONLN));
    sb_status st = sb_threadpool_create(n_threads, &c->pool, err);
    if (st != SB_OK) {
        sb_ctx_free(c);
        return st;
    }
    size_t B = SB_MAX_BATCH;
    size_t q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    size_t cache = (size_t)hp->n_layer * (size_t)p.n_ctx * kv_dim;
    size_t work = 0;
    /* Layers may mix types (quantizers fall back per tensor), so size the
     * matmul scratch for the largest need over every matrix. */
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const sb_layer *ly = &model->layers[l];
        const sb_weight *lm[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w_gate, &ly->w_up, &ly->w_down};
        for (size_t i = 0; i < SB_ARRAY_LEN(lm); i++)
            work = SB_MAX(work, sb_matmul_work_size(lm[i]->type, lm[i]->n_in, (int64_t)B));
    }
    work = SB_MAX(work, sb_matmul_work_size(model->output.type, model->output.n_in, 1));
    c->k_cache = sb_calloc(cache, sizeof(float));
    c->v_cache = sb_calloc(cache, sizeof(float));
    c->x = sb_malloc(B * hp->n_embd * sizeof(float));
    c->xb = sb_malloc(B * hp->n_embd * sizeof(float));
    c->q = sb_malloc(B * q_dim * sizeof(float));
    c->k = sb_malloc(B * kv_dim * sizeof(float));
    c->v = sb_malloc(B * kv_dim * sizeof(float));
    c->att = sb_malloc(B * q_dim * sizeof(float));
    c->hb = sb_malloc(B * hp->n_ff * sizeof(float));
    c->hb2 = sb_malloc(B * hp->n_ff * sizeof(float));
    c->scores = sb_malloc((size_t)n_threads * (size_t)p.n_ctx * sizeof(float));
    c->logits = sb_malloc((size_t)hp->n_vocab * sizeof(float));
    c->work = sb_malloc(work);
    if (!c->k_cache || !c->v_cache || !c->x || !c->xb || !c->q || !c->k || !c->v || !c->att || !c->hb || !c->hb2 ||
        !c->scores || !c->logits || !c->work) {
        sb_ctx_free(c);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for a %d-token context (KV cache %zu MiB)", p.n_ctx,
                       2 * cache * sizeof(float) >> 20);
    }
    *out = c;
    return SB_OK;
}

void sb_ctx_free(sb_ctx_t *c) {
    if (!c)
        return;
    float *bufs[] = {c->k_cache, c->v_cache, c->x, c->xb, c->q, c->k, c->v, c->att, c->hb, c->hb2, c->scores, c->logits};
    for (size_t i = 0; i < SB_ARRAY_LEN(bufs); i++)
        sb_free(bufs[i]);
    sb_free(c->work);
    sb_threadpool_free(c->pool);
    sb_free(c);
}

sb_status sb_ctx_eval(sb_ctx_t *c, const int32_t *tokens, int32_t n, sb_error *err) {
    if (n <= 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "no tokens to evaluate");
    if (n > c->n_ctx - c->n_past)
        return sb_fail(err, SB_ERR_CONTEXT_FULL, "%d tokens do not fit: %d of the context's %d are used", n, c->n_past,
                       c->n_ctx);
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->model->hp.n_vocab)
            return sb_fail(err, SB_ERR_INVALID_ARG, "token %d at index %d is outside the vocabulary (0..%d)", tokens[i],
                           i, c->model->hp.n_vocab - 1);
    for (int32_t done = 0; done < n; done += SB_MAX_BATCH)
        sb_llama_forward(c, tokens + done, SB_MIN(n - done, SB_MAX_BATCH));
    c->has_logits = true;
    return SB_OK;
}

const float *sb_ctx_logits(const sb_ctx_t *c) { return c->has_logits ? c->logits : NULL; }
int32_t sb_ctx_n_past(const sb_ctx_t *c) { return c->n_past; }
int32_t sb_ctx_n_ctx(const sb_ctx_t *c) { return c->n_ctx; }

void sb_ctx_reset(sb_ctx_t *c) {
    c->n_past = 0;
    c->has_logits = false;
}
