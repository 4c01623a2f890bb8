/*
 * llama.c - the llama forward pass, readable top to bottom.
 *
 * A chunk of n tokens goes through every layer as an (n, n_embd) matrix, so
 * each weight matrix is read once per chunk rather than once per token:
 *
 *   x = embed(tokens)
 *   for each layer:
 *       h = rmsnorm(x) * attn_norm
 *       q, k, v = h Wq, h Wk, h Wv;  rotate q, k (RoPE);  append k, v to the cache
 *       x += causal_attention(q, cache) Wo
 *       h = rmsnorm(x) * ffn_norm
 *       x += (silu(h Wgate) * (h Wup)) Wdown
 *   logits = (rmsnorm(x_last) * output_norm) Wout
 *
 * Numerics follow ggml's CPU backend where it matters for agreement with
 * llama.cpp: RMSNorm sums squares in double, RoPE angles are built by
 * repeated float multiplication, and softmax subtracts the max.
 */
#include <math.h>
#include <string.h>

#include "model/model.h"
#include "tensor/threadpool.h"

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i] for one row of n. */
static void rmsnorm(float *out, const float *x, const float *w, int32_t n, float eps) {
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        sum += (double)(x[i] * x[i]);
    float scale = 1.0f / sqrtf((float)(sum / n) + eps);
    for (int32_t i = 0; i < n; i++)
        out[i] = (x[i] * scale) * w[i];
}

/* GGML "normal" rotary embedding: rotates adjacent pairs (x[2i], x[2i+1]) of
 * the first n_rot dims of each head by pos * base^(-2i/n_rot). */
static void rope(float *vec, int32_t n_heads, int32_t head_dim, int32_t n_rot, int32_t pos, float base) {
    float theta_scale = powf(base, -2.0f / (float)n_rot);
    for (int32_t h = 0; h < n_heads; h++) {
        float *v = vec + (size_t)h * head_dim;
        float theta = (float)pos;
        for (int32_t i = 0; i < n_rot; i += 2) {
            float c = cosf(theta), s = sinf(theta);
            float a = v[i], b = v[i + 1];
            v[i] = a * c - b * s;
            v[i + 1] = a * s + b * c;
            theta *= theta_scale;
        }
    }
}

static void softmax(float *x, int32_t n) {
    float max = x[0];
    for (int32_t i = 1; i < n; i++)
        max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int32_t i = 0; i < n; i++)
        x[i] *= inv;
}

static void matmul(sb_ctx *c, const sb_weight *w, const float *x, int32_t n_tok, float *y) {
    sb_matmul(c->pool, w->type, w->data, w->n_in, w->n_out, x, n_tok, y, c->work);
}

/* One layer's causal attention for a chunk of tokens, parallel over
 * (token, head) pairs. */
typedef struct attention_job {
    sb_ctx *c;
    const float *k_layer, *v_layer; /* (n_ctx, n_head_kv*head_dim) */
    int32_t pos0;                   /* position of the chunk's first token */
} attention_job;

/* Head h of token i (pair = i*n_head + h) attends over cache positions
 * 0..pos0+i; writes head_dim values of c->att. */
static void attend_head(void *arg, int64_t pair, int ith) {
    const attention_job *j = arg;
    sb_ctx *c = j->c;
    const sb_hparams *hp = &c->model->hp;
    int32_t hd = hp->head_dim, kv_dim = hp->n_head_kv * hd, q_dim = hp->n_head * hd;
    int32_t i = (int32_t)(pair / hp->n_head), h = (int32_t)(pair % hp->n_head);
    int32_t pos = j->pos0 + i, kvh = h / (hp->n_head / hp->n_head_kv); /* GQA: query heads share a KV head */
    const float *qh = c->q + (size_t)i * q_dim + (size_t)h * hd;
    float *scores = c->scores + (size_t)ith * c->n_ctx;
    float scale = 1.0f / sqrtf((float)hd);
    for (int32_t t = 0; t <= pos; t++) {
        const float *kt = j->k_layer + (size_t)t * kv_dim + (size_t)kvh * hd;
        float dot = 0.0f;
        for (int32_t e = 0; e < hd; e++)
            dot += qh[e] * kt[e];
        scores[t] = dot * scale;
    }
    softmax(scores, pos + 1);
    float *oh = c->att + (size_t)i * q_dim + (size_t)h * hd;
    memset(oh, 0, (size_t)hd * sizeof(float));
    for (int32_t t = 0; t <= pos; t++) {
        const float *vt = j->v_layer + (size_t)t * kv_dim + (size_t)kvh * hd;
        float a = scores[t];
        for (int32_t e = 0; e < hd; e++)
            oh[e] += a * vt[e];
    }
}

void sb_llama_forward(sb_ctx *c, const int32_t *tokens, int32_t n) {
    const sb_model *m = c->model;
    const sb_hparams *hp = &m->hp;
    int32_t dim = hp->n_embd, hd = hp->head_dim;
    int32_t q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    int32_t pos0 = c->n_past;

    for (int32_t i = 0; i < n; i++)
        sb_get_row(m->tok_embd.type, m->tok_embd.data, dim, tokens[i], c->x + (size_t)i * dim);

    for (int32_t l = 0; l < hp->n_layer; l++) {
        const sb_layer *ly = &m->layers[l];
        float *k_layer = c->k_cache + (size_t)l * c->n_ctx * kv_dim;
        float *v_layer = c->v_cache + (size_t)l * c->n_ctx * kv_dim;

        /* attention block */
        for (int32_t i = 0; i < n; i++)
            rmsnorm(c->xb + (size_t)i * dim, c->x + (size_t)i * dim, ly->attn_norm.data, dim, hp->rms_eps);
        matmul(c, &ly->wq, c->xb, n, c->q);
        matmul(c, &ly->wk, c->xb, n, c->k);
        matmul(c, &ly->wv, c->xb, n, c->v);
        for (int32_t i = 0; i < n; i++) {
            int32_t pos = pos0 + i;
            rope(c->q + (size_t)i * q_dim, hp->n_head, hd, hp->n_rot, pos, hp->rope_freq_base);
            rope(c->k + (size_t)i * kv_dim, hp->n_head_kv, hd, hp->n_rot, pos, hp->rope_freq_base);
            memcpy(k_layer + (size_t)pos * kv_dim, c->k + (size_t)i * kv_dim, (size_t)kv_dim * sizeof(float));
            memcpy(v_layer + (size_t)pos * kv_dim, c->v + (size_t)i * kv_dim, (size_t)kv_dim * sizeof(float));
        }
        attention_job aj = {c, k_layer, v_layer, pos0};
        sb_threadpool_for(c->pool, (int64_t)n * hp->n_head, attend_head, &aj);
        matmul(c, &ly->wo, c->att, n, c->xb);
        for (size_t j = 0; j < (size_t)n * dim; j++)
            c->x[j] += c->xb[j];

        /* feed-forward block (SwiGLU) */
        for (int32_t i = 0; i < n; i++)
            rmsnorm(c->xb + (size_t)i * dim, c->x + (size_t)i * dim, ly->ffn_norm.data, dim, hp->rms_eps);
        matmul(c, &ly->w_gate, c->xb, n, c->hb);
        matmul(c, &ly->w_up, c->xb, n, c->hb2);
        for (size_t j = 0; j < (size_t)n * hp->n_ff; j++) {
            float g = c->hb[j];
            c->hb[j] = g / (1.0f + expf(-g)) * c->hb2[j];
        }
        matmul(c, &ly->w_down, c->hb, n, c->xb);
        for (size_t j = 0; j < (size_t)n * dim; j++)
            c->x[j] += c->xb[j];
    }

    /* Only the last token's logits are needed to continue the sequence. */
    float *last = c->x + (size_t)(n - 1) * dim;
    rmsnorm(c->xb, last, m->output_norm.data, dim, hp->rms_eps);
    matmul(c, &m->output, c->xb, 1, c->logits);
    c->n_past += n;
}
