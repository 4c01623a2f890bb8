/*
 * context.c - the single-sequence inference context of the public API: one
 * sequence whose KV cache is a single block of n_ctx positions, fed through
 * the same batched forward pass as the multi-sequence engine, in chunks of
 * up to SB_MAX_BATCH tokens.
 */
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "model/model.h"

#define SB_DEFAULT_MAX_CTX 4096

/* The only block of the sequence. */
static const int32_t single_block[1] = {0};

sb_ctx_params sb_ctx_default_params(void) {
    return (sb_ctx_params){.n_ctx = 0, .n_threads = 0, .cache_type = SB_CACHE_F32};
}

bool sb_cache_type_parse(const char *name, sb_cache_type *out) {
    if (strcmp(name, "f32") == 0)
        *out = SB_CACHE_F32;
    else if (strcmp(name, "f16") == 0)
        *out = SB_CACHE_F16;
    else if (strcmp(name, "q8_0") == 0)
        *out = SB_CACHE_Q8_0;
    else
        return false;
    return true;
}

const char *sb_cache_type_name(sb_cache_type type) {
    return type == SB_CACHE_F16 ? "f16" : type == SB_CACHE_Q8_0 ? "q8_0" : "f32";
}

sb_status sb_ctx_create(const sb_model_t *model, const sb_ctx_params *params, sb_ctx_t **out, sb_error *err) {
    *out = NULL;
    sb_ctx_params p = params ? *params : sb_ctx_default_params();
    if (p.n_ctx < 0 || p.n_threads < 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "n_ctx (%d) and n_threads (%d) must not be negative", p.n_ctx,
                       p.n_threads);
    if (p.n_ctx == 0)
        p.n_ctx = SB_MIN(model->hp.n_ctx_train, SB_DEFAULT_MAX_CTX);
    sb_ctx *c = sb_calloc(1, sizeof(*c));
    if (!c)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    c->model = model;
    c->n_ctx = p.n_ctx;
    int n_threads = p.n_threads ? p.n_threads : SB_MAX(1, (int)sysconf(_SC_NPROCESSORS_ONLN));
    int32_t max_batch = SB_MIN(SB_MAX_BATCH, p.n_ctx);
    sb_status st = sb_threadpool_create(n_threads, &c->pool, err);
    if (st == SB_OK)
        st = sb_kv_init(&c->kv, model, 1, p.n_ctx, p.cache_type, err);
    if (st == SB_OK)
        st = sb_forward_init(&c->fwd, model, c->pool, max_batch, 1, p.n_ctx, err);
    if (st == SB_OK && !(c->batch = sb_calloc((size_t)max_batch, sizeof(*c->batch))))
        st = sb_fail(err, SB_ERR_NOMEM, "out of memory");
    if (st != SB_OK) {
        sb_ctx_free(c);
        return st;
    }
    *out = c;
    return SB_OK;
}

void sb_ctx_free(sb_ctx_t *c) {
    if (!c)
        return;
    sb_forward_free(&c->fwd);
    sb_kv_free(&c->kv);
    sb_threadpool_free(c->pool);
    sb_free(c->batch);
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
    for (int32_t done = 0; done < n;) {
        int32_t chunk = SB_MIN(n - done, c->fwd.max_tokens);
        for (int32_t i = 0; i < chunk; i++)
            c->batch[i] = (sb_batch_token){.token = tokens[done + i], .pos = c->n_past + i, .blocks = single_block,
                                           .want_logits = done + i == n - 1};
        sb_forward_run(&c->fwd, &c->kv, c->batch, chunk);
        c->n_past += chunk;
        done += chunk;
    }
    c->has_logits = true;
    return SB_OK;
}

const float *sb_ctx_logits(const sb_ctx_t *c) { return c->has_logits ? c->fwd.logits : NULL; }
int32_t sb_ctx_n_past(const sb_ctx_t *c) { return c->n_past; }
int32_t sb_ctx_n_ctx(const sb_ctx_t *c) { return c->n_ctx; }

void sb_ctx_reset(sb_ctx_t *c) {
    c->n_past = 0;
    c->has_logits = false;
}
