/*
 * forward.c - the forward pass, readable top to bottom.
 *
 * A batch of n tokens (from one or several sequences) goes through every
 * layer as an (n, n_embd) matrix, so each weight matrix is read once per
 * batch rather than once per token:
 *
 *   x = embed(tokens)                                  (* sqrt(n_embd): gemma)
 *   for each layer:
 *       h = rmsnorm(x) * attn_norm
 *       q, k, v = h Wq + bq, h Wk + bk, h Wv + bv       (one fused Wqkv: phi3)
 *       q, k = rmsnorm per head (qwen3);  rotate q, k (RoPE, normal or NEOX)
 *       store k, v at each token's position of its sequence (paged KV)
 *       a = attention of each token over its sequence's positions <= its own
 *       o = a Wo                                       (rmsnorm(o): gemma2)
 *       x += o
 *       h = rmsnorm(x) * ffn_norm
 *       f = (act(h Wgate) * (h Wup)) Wdown             (rmsnorm(f): gemma2)
 *       x += f
 *   logits = (rmsnorm(x) * output_norm) Wout           (soft-capped: gemma2)
 *
 * Numerics follow ggml's CPU backend where it matters for agreement with
 * llama.cpp: RMSNorm sums squares in double, RoPE angles are built by
 * repeated float multiplication, softmax subtracts the max and takes its
 * exponentials from ggml_v_expf (the softmax kernel), GeGLU goes through F16
 * as ggml's lookup table does.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "base/base.h"
#include "model/model.h"

/* ---- profiling (sb_forward.prof) ------------------------------------------ */

/* A pass under profile reads the clock between its phases: tick() where a
 * phase starts, charge() where it ends (the next one starts there). Without
 * a profile both are a test of a pointer. */
static double tick(const sb_forward *f) {
    if (!f->prof)
        return 0;
    return sb__clock_s(f->prof_clock);
}

static void charge(sb_forward *f, sb_fwd_part part, double *t) {
    if (!f->prof)
        return;
    double now = tick(f);
    f->prof->part_s[part] += now - *t;
    *t = now;
}

/* ---- element-wise building blocks ---------------------------------------- */

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i] for one row of n. The
 * float squares are summed in double as ggml does, but in eight running
 * sums (one chain waits on every add; these vectorise): the same double
 * unless a partial sum rounds, which needs squares more than 2^29 apart.
 * Built for the machine's vector width, measured when the norms of a
 * batch ran on one thread between parallel loops (8 tokens: 181 -> 152 us
 * per step of such work, 110M model). */
SB_VECTOR_CLONES static void rmsnorm(float *out, const float *x, const float *w, int32_t n, float eps) {
    double part[8] = {0};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int32_t j = 0; j < 8; j++)
            part[j] += (double)(x[i + j] * x[i + j]);
    double sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    for (; i < n; i++)
        sum += (double)(x[i] * x[i]);
    float scale = 1.0f / sqrtf((float)(sum / n) + eps);
    for (i = 0; i < n; i++)
        out[i] = (x[i] * scale) * w[i];
}

/* The rotation of position pos: angle i is pos * base^(-2i/n_rot) (divided
 * by freq_factors[i] when given), built by repeated multiplication as ggml
 * does; cs[2i], cs[2i+1] = its cosine and sine. The same for every layer and
 * head, so computed once per token and pass. */
static void rope_angles(float *cs, int32_t n_rot, int32_t pos, float base, const float *freq_factors) {
    float theta_scale = powf(base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (int32_t i = 0; i < n_rot / 2; i++) {
        float t = freq_factors ? theta / freq_factors[i] : theta;
        cs[2 * i] = cosf(t);
        cs[2 * i + 1] = sinf(t);
        theta *= theta_scale;
    }
}

/* Rotates the first n_rot dims of each of n_heads heads by the angles in cs:
 * adjacent pairs (normal) or pairs half a rotation apart (NEOX). One loop
 * per kind, with plain indexing, so that the compiler vectorises them, for
 * the machine's vector width (KV placement per step 123 -> 101 us at 8
 * tokens, 24 -> 17 us at 1, 110M model). */
SB_VECTOR_CLONES static void rope(float *vec, int32_t n_heads, int32_t head_dim, int32_t n_rot, const float *cs, sb_rope_kind kind) {
    int32_t half = n_rot / 2;
    for (int32_t h = 0; h < n_heads; h++) {
        float *v = vec + (size_t)h * head_dim;
        if (kind == SB_ROPE_NEOX) {
            for (int32_t i = 0; i < half; i++) {
                float c = cs[2 * i], s = cs[2 * i + 1], a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = a * s + b * c;
            }
        } else {
            for (int32_t i = 0; i < half; i++) {
                float c = cs[2 * i], s = cs[2 * i + 1], a = v[2 * i], b = v[2 * i + 1];
                v[2 * i] = a * c - b * s;
                v[2 * i + 1] = a * s + b * c;
            }
        }
    }
}

/* gelu with the tanh approximation, evaluated the way ggml's table does:
 * on the F16 rounding of x, with the result rounded to F16. */
static float gelu_f16(float x) {
    if (x <= -10.0f)
        return 0.0f;
    if (x >= 10.0f)
        return x;
    float h = sb_fp16_to_fp32(sb_fp32_to_fp16(x));
    float g = 0.5f * h * (1.0f + tanhf(0.7978845608028654f * h * (1.0f + 0.044715f * h * h)));
    return sb_fp16_to_fp32(sb_fp32_to_fp16(g));
}

/* gate[i] = act(gate[i]) * up[i]; SiLU is a kernel (llama.cpp's vectorised
 * exp, see tensor/act.c). */
static void glu(float *gate, const float *up, size_t n, sb_ffn_act act) {
    if (act == SB_ACT_SILU) {
        sb_kernels_active()->swiglu((int64_t)n, gate, up);
        return;
    }
    for (size_t i = 0; i < n; i++)
        gate[i] = gelu_f16(gate[i]) * up[i];
}

/* ---- per-token work on the pool -------------------------------------------- */

/* The element-wise steps between the matrix products work on each token's
 * row alone, so a batch's tokens spread over the pool's threads (one token
 * runs on the caller alone, as the pool does with single-chunk loops). */
typedef struct token_job {
    sb_forward *f;
    const float *norm; /* rmsnorm_rows, rmsnorm_prep: the weights */
    float *out;        /* rmsnorm_rows: destination rows (n_embd apart) */
    const float *in;   /* rmsnorm_rows: source rows */
} token_job;

static void rmsnorm_row(void *arg, int64_t i, int ith) {
    (void)ith;
    const token_job *j = arg;
    const sb_hparams *hp = &j->f->model->hp;
    size_t o = (size_t)i * hp->n_embd;
    rmsnorm(j->out + o, j->in + o, j->norm, hp->n_embd, hp->rms_eps);
}

/* out[i] = rmsnorm(in[i]) * norm for the batch's n rows. */
static void rmsnorm_rows(sb_forward *f, float *out, const float *in, const float *norm, int32_t n) {
    token_job j = {.f = f, .norm = norm, .out = out, .in = in};
    sb_threadpool_for_light(f->pool, n, (int64_t)n * f->model->hp.n_embd, rmsnorm_row, &j);
}

static void add_bias(float *y, const sb_weight *b, int32_t n_tok) {
    if (!b->data)
        return;
    const float *bias = b->data;
    for (int32_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < b->n_in; i++)
            y[(size_t)t * b->n_in + i] += bias[i];
}

static void softcap(float *x, size_t n, float cap) {
    for (size_t i = 0; i < n; i++)
        x[i] = tanhf(x[i] * (1.0f / cap)) * cap;
}

static sb_matmul_dst product_into(const sb_weight *w, float *y) {
    return (sb_matmul_dst){.type = w->type, .w = w->data, .packed = w->packed, .n_out = w->n_out, .y = y};
}

/* Products' row preparations (sb_matmul_prep), with a token_job as
 * context: the norm of its `norm` (into f->xb), and the gated activation
 * of f->hb's gates by f->hb2's ups (in place). */
static void rmsnorm_prep(void *ctx, int64_t tok, float *out, const float *in, int64_t n) {
    (void)tok;
    const token_job *j = ctx;
    rmsnorm(out, in, j->norm, (int32_t)n, j->f->model->hp.rms_eps);
}

static void glu_prep(void *ctx, int64_t tok, float *out, const float *in, int64_t n) {
    const token_job *j = ctx;
    SB_ASSERT(out == in);
    glu(out, j->f->hb2 + tok * n, (size_t)n, j->f->model->hp.arch->act);
}

/* A product's input preparation: the row function, whether it works in
 * place (on f->hb, the gates; else into f->xb), and the profile part its
 * time is charged to. */
typedef struct prep_kind {
    void (*row)(void *ctx, int64_t tok, float *out, const float *in, int64_t n);
    bool in_place;
    sb_fwd_part part;
} prep_kind;
static const prep_kind NORM = {rmsnorm_prep, false, SB_FWD_NORMS}, GLU = {glu_prep, true, SB_FWD_GLU};

typedef struct prep_job {
    const sb_matmul_prep *prep;
    const float *x;
    int64_t n_in;
} prep_job;

static void prep_chunk(void *arg, int64_t tok, int ith) {
    (void)ith;
    const prep_job *j = arg;
    j->prep->row(j->prep->ctx, tok, j->prep->out + tok * j->n_in, j->x + tok * j->n_in, j->n_in);
}

/* The products d[0..n) of one input, converted once, in one parallel loop.
 * With a preparation (kind; NULL for none; norm: its weights), each row is
 * prepared by the loop's threads just before they convert it, which saves
 * the caller's pass over the batch before the loop and, for the gated
 * activation, a loop of its own (8 streams, 110M, alternated: the norms
 * Q4_K_M +3%, Q4_0 +0-4%). Under profile the preparation runs first in a
 * loop of its own, charged to its part, then one loop per matrix, charged
 * to `part` (the layers' also to their types) from *t on. */
static void multiply(sb_forward *f, const sb_matmul_dst *d, int n, int64_t n_in, const float *x,
                     const prep_kind *kind, const float *norm, int32_t n_tok, sb_fwd_part part, double *t) {
    token_job j = {.f = f, .norm = norm};
    sb_matmul_prep prep = {.ctx = &j};
    if (kind) {
        prep.row = kind->row;
        SB_ASSERT(!kind->in_place || x == f->hb); /* the gates, prepared where they are */
        prep.out = kind->in_place ? f->hb : f->xb;
    }
    if (!f->prof) {
        sb_matmul_many(f->pool, d, n, n_in, x, n_tok, kind ? &prep : NULL, f->work);
        return;
    }
    if (kind) {
        prep_job pj = {&prep, x, n_in};
        sb_threadpool_for(f->pool, n_tok, prep_chunk, &pj);
        charge(f, kind->part, t);
        x = prep.out;
    }
    for (int i = 0; i < n; i++) {
        double t0 = *t;
        sb_matmul_many(f->pool, &d[i], 1, n_in, x, n_tok, NULL, f->work);
        charge(f, part, t);
        if (part == SB_FWD_PRODUCTS) {
            f->prof->type_s[d[i].type] += *t - t0;
            f->prof->type_packed[d[i].type] |= d[i].packed;
        }
    }
}

/* Up to three of the layer's products of the same input, normalized by
 * `norm` (rmsnorm(x) * norm, into f->xb). */
static void matmul3(sb_forward *f, const float *x, const float *norm, int32_t n_tok, const sb_weight *const *w,
                    float *const *y, int n, double *t) {
    sb_matmul_dst d[3];
    for (int i = 0; i < n; i++)
        d[i] = product_into(w[i], y[i]);
    multiply(f, d, n, w[0]->n_in, x, &NORM, norm, n_tok, SB_FWD_PRODUCTS, t);
}

static void matmul(sb_forward *f, const sb_weight *w, const float *x, const float *norm, int32_t n_tok, float *y,
                   double *t) {
    matmul3(f, x, norm, n_tok, &w, &y, 1, t);
}

/* The residual stream's update at the end of a block: x += w in (the
 * product in xb), in prepared by `kind` (or NULL). The product's chunks
 * add their own rows as they finish them; post-norm models (post_norm set)
 * normalize the product first, so they add it in a pass of their own. */
static void update_residual(sb_forward *f, const sb_weight *w, const float *in, const prep_kind *kind, int32_t n,
                            const sb_weight *post_norm, double *t) {
    sb_matmul_dst d = product_into(w, f->xb);
    d.residual = post_norm ? NULL : f->x;
    multiply(f, &d, 1, w->n_in, in, kind, NULL, n, SB_FWD_PRODUCTS, t);
    if (!post_norm)
        return;
    rmsnorm_rows(f, f->xb, f->xb, post_norm->data, n);
    charge(f, SB_FWD_NORMS, t);
    for (size_t j = 0; j < (size_t)n * f->model->hp.n_embd; j++)
        f->x[j] += f->xb[j];
    charge(f, SB_FWD_OTHER, t);
}

/* ---- attention ------------------------------------------------------------ */

/* Consecutive batch tokens of one sequence at consecutive positions (a
 * prompt chunk, or a single decoding token) attend together: their q.k
 * products come from one gemm per KV block, each key row loaded once for
 * the whole group. At most ATTN_GROUP tokens per group. */
#define ATTN_GROUP 32

typedef struct attention_job {
    sb_forward *f;
    const sb_kv *kv;
    const sb_batch_token *batch;
    const sb_layer *layer;
    int32_t il;
    const float *q;           /* (n, q_dim) */
    const int32_t *group_start; /* batch index of each group's first token; n_groups + 1 entries */
} attention_job;

/* Token i's query and key: per-head norms (qwen3), rotation; then its key
 * and value go into the cache (the first phase of attention's loop). */
static void place_qkv(void *arg, int64_t i, int ith) {
    (void)ith;
    const attention_job *j = arg;
    const sb_forward *f = j->f;
    const sb_hparams *hp = &f->model->hp;
    const sb_arch_desc *a = hp->arch;
    const sb_layer *ly = j->layer;
    int32_t hd = hp->head_dim, q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    int32_t pos = j->batch[i].pos, bs = j->kv->block_size;
    int32_t block = j->batch[i].blocks[pos / bs], slot = pos % bs;
    const size_t head_stride = (size_t)bs * j->kv->row; /* a block's heads follow each other */
    uint8_t *kd = sb_kv_k(j->kv, j->il, block, 0, slot), *vd = sb_kv_v(j->kv, j->il, block, 0, slot);
    /* The new position's rows are cold (untouched since their block was
     * handed out, or long evicted): asked for first, their misses overlap
     * each other and the rotation instead of stalling the stores one by
     * one (110M Q4_K_M, 8 streams: this part 0.065-0.070 -> 0.046-0.052 ms
     * a step). */
    for (int32_t h = 0; h < hp->n_head_kv; h++)
        for (size_t o = 0; o < j->kv->row; o += 64) {
            __builtin_prefetch(kd + h * head_stride + o, 1);
            __builtin_prefetch(vd + h * head_stride + o, 1);
        }
    float *qi = f->q + (size_t)i * q_dim, *ki = f->k + (size_t)i * kv_dim;
    if (a->qk_norm) {
        for (int32_t h = 0; h < hp->n_head; h++)
            rmsnorm(qi + (size_t)h * hd, qi + (size_t)h * hd, ly->q_norm.data, hd, hp->rms_eps);
        for (int32_t h = 0; h < hp->n_head_kv; h++)
            rmsnorm(ki + (size_t)h * hd, ki + (size_t)h * hd, ly->k_norm.data, hd, hp->rms_eps);
    }
    const float *cs = f->rope_cs + (size_t)i * hp->n_rot;
    rope(qi, hp->n_head, hd, hp->n_rot, cs, a->rope);
    rope(ki, hp->n_head_kv, hd, hp->n_rot, cs, a->rope);
    const sb_store_rows_fn store = sb_kernels_active()->store_rows[j->kv->type];
    store(hd, hp->n_head_kv, ki, kd, head_stride);
    store(hd, hp->n_head_kv, f->v + (size_t)i * kv_dim, vd, head_stride);
}

/* Head h of group g (chunk = g*n_head + h): every token of the group attends
 * over the positions of its sequence up to its own (the last n_swa of them
 * in a sliding-window layer); writes head_dim values per token of f->att.
 * Every (token, position) product is the F32 vec_dot, bit for bit, however
 * the tokens are grouped. */
static void attend_group_head(void *arg, int64_t chunk, int ith) {
    const attention_job *j = arg;
    sb_forward *f = j->f;
    const sb_hparams *hp = &f->model->hp;
    const sb_kernels *kern = sb_kernels_active();
    int32_t hd = hp->head_dim, q_dim = hp->n_head * hd, bs = j->kv->block_size;
    const sb_type kt = j->kv->type, qt = sb_type_traits_of(kt)->vec_dot_type;
    size_t kv_stride = j->kv->row;
    int32_t g = (int32_t)(chunk / hp->n_head), h = (int32_t)(chunk % hp->n_head);
    int32_t i0 = j->group_start[g], nq = j->group_start[g + 1] - i0;
    const sb_batch_token *bt0 = &j->batch[i0];
    const int32_t *blocks = bt0->blocks;
    int32_t kvh = h / (hp->n_head / hp->n_head_kv); /* GQA: query heads share a KV head */
    int32_t last = bt0->pos + nq - 1;
    int32_t first = j->layer->swa ? SB_MAX(0, bt0->pos - hp->n_swa + 1) : 0, npos = last + 1 - first;
    float *scores = f->scores + (size_t)ith * ATTN_GROUP * f->max_len; /* (nq, npos) */

    /* Soft-capped models scale q before the dot products (as llama.cpp's
     * graph does); the others scale the dot products. */
    float scale = 1.0f / sqrtf((float)hd);
    const float *q = j->q + (size_t)i0 * q_dim + (size_t)h * hd;
    size_t q_stride = (size_t)q_dim * sizeof(float);
    float qs[ATTN_GROUP * 512];
    if (hp->attn_softcap > 0) {
        for (int32_t i = 0; i < nq; i++)
            for (int32_t e = 0; e < hd; e++)
                qs[i * hd + e] = q[(size_t)i * q_dim + e] * scale;
        q = qs;
        q_stride = (size_t)hd * sizeof(float);
    }
    /* F16 or Q8_0 keys meet queries converted as for their vec_dot, as in
     * llama.cpp's caches of those types. */
    const void *qx = q;
    uint8_t qc[ATTN_GROUP * 512 * sizeof(uint16_t)];
    if (qt != SB_TYPE_F32) {
        const size_t qc_row = sb_type_row_size(qt, hd);
        for (int32_t i = 0; i < nq; i++)
            kern->act_from_float[qt]((const float *)((const uint8_t *)q + (size_t)i * q_stride), qc + (size_t)i * qc_row,
                                     hd);
        qx = qc;
        q_stride = qc_row;
    }
    /* The head's keys and values lie in short runs (one per block) spread
     * over the cache, which the hardware prefetcher does not follow: ask for
     * all the keys at once, so that their misses overlap, and for each run's
     * values as its keys are multiplied, so that they do not compete with
     * the keys for the misses in flight (8 streams: attention -5%). */
    for (int32_t p = first; p <= last;) {
        int32_t slot = p % bs, run = SB_MIN(bs - slot, last + 1 - p);
        const char *k0 = (const char *)sb_kv_k(j->kv, j->il, blocks[p / bs], kvh, slot);
        for (size_t o = 0; o < (size_t)run * kv_stride; o += 64)
            __builtin_prefetch(k0 + o);
        p += run;
    }
    for (int32_t p = first; p <= last;) {
        int32_t slot = p % bs, run = SB_MIN(bs - slot, last + 1 - p);
        const char *v0 = (const char *)sb_kv_v(j->kv, j->il, blocks[p / bs], kvh, slot);
        for (size_t o = 0; o < (size_t)run * kv_stride; o += 64)
            __builtin_prefetch(v0 + o);
        const void *k0 = sb_kv_k(j->kv, j->il, blocks[p / bs], kvh, slot);
        kern->gemm[kt](hd, k0, kv_stride, run, qx, q_stride, nq, scores + (p - first), (size_t)npos);
        p += run;
    }

    for (int32_t i = 0; i < nq; i++) {
        int32_t pos = bt0->pos + i;
        int32_t from = j->layer->swa ? SB_MAX(0, pos - hp->n_swa + 1) : 0, n = pos + 1 - from;
        float *sc = scores + (size_t)i * npos + (from - first);
        for (int32_t t = 0; t < n; t++)
            sc[t] = hp->attn_softcap > 0 ? tanhf(sc[t] * (1.0f / hp->attn_softcap)) * hp->attn_softcap
                                         : sc[t] * scale;
        kern->softmax(n, sc);
        float *oh = f->att + (size_t)(i0 + i) * q_dim + (size_t)h * hd;
        memset(oh, 0, (size_t)hd * sizeof(float));
        for (int32_t t = 0; t < n;) { /* one run of positions per KV block */
            int32_t p = from + t, slot = p % bs, run = SB_MIN(bs - slot, n - t);
            kern->axpy[kt](hd, run, sc + t, sb_kv_v(j->kv, j->il, blocks[p / bs], kvh, slot), kv_stride, oh);
            t += run;
        }
    }
}

/* ---- one layer and the whole pass ----------------------------------------- */

static void attention_block(sb_forward *f, sb_kv *kv, const sb_batch_token *batch, int32_t n, int32_t il) {
    const sb_model *m = f->model;
    const sb_hparams *hp = &m->hp;
    const sb_arch_desc *a = hp->arch;
    const sb_layer *ly = &m->layers[il];
    int32_t hd = hp->head_dim;
    int32_t q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    float *q = f->q, *k = f->k, *v = f->v;

    double t = tick(f);
    if (a->fused_qkv) {
        int32_t w = q_dim + 2 * kv_dim;
        matmul(f, &ly->wqkv, f->x, ly->attn_norm.data, n, f->hb, &t);
        for (int32_t i = 0; i < n; i++) {
            const float *row = f->hb + (size_t)i * w;
            memcpy(q + (size_t)i * q_dim, row, (size_t)q_dim * sizeof(float));
            memcpy(k + (size_t)i * kv_dim, row + q_dim, (size_t)kv_dim * sizeof(float));
            memcpy(v + (size_t)i * kv_dim, row + q_dim + kv_dim, (size_t)kv_dim * sizeof(float));
        }
    } else {
        matmul3(f, f->x, ly->attn_norm.data, n, (const sb_weight *[]){&ly->wq, &ly->wk, &ly->wv},
                (float *[]){q, k, v}, 3, &t);
    }
    add_bias(q, &ly->bq, n);
    add_bias(k, &ly->bk, n);
    add_bias(v, &ly->bv, n);
    charge(f, SB_FWD_OTHER, &t);

    /* Groups: runs of tokens of one sequence at consecutive positions. */
    int32_t n_groups = 0;
    for (int32_t i = 0; i < n; i++) {
        bool same_run = i > 0 && batch[i].blocks == batch[i - 1].blocks && batch[i].pos == batch[i - 1].pos + 1 &&
                        i - f->group_start[n_groups - 1] < ATTN_GROUP;
        if (!same_run)
            f->group_start[n_groups++] = i;
    }
    f->group_start[n_groups] = n;
    /* The tokens' keys and values are stored in the first phase of the
     * heads' loop, which every thread finishes before any head starts: one
     * hand-off to the workers instead of two. A profile times them apart. */
    attention_job job = {f, kv, batch, ly, il, q, f->group_start};
    const int64_t n_heads = (int64_t)n_groups * hp->n_head;
    if (f->prof) {
        sb_threadpool_for(f->pool, n, place_qkv, &job);
        charge(f, SB_FWD_PLACE, &t);
        sb_threadpool_for(f->pool, n_heads, attend_group_head, &job);
    } else {
        sb_threadpool_for_then(f->pool, n, place_qkv, n_heads, attend_group_head, &job);
    }
    charge(f, SB_FWD_ATTENTION, &t);

    update_residual(f, &ly->wo, f->att, NULL, n, a->post_norms ? &ly->post_attn_norm : NULL, &t);
}

static void ffn_block(sb_forward *f, int32_t n, int32_t il) {
    const sb_hparams *hp = &f->model->hp;
    const sb_arch_desc *a = hp->arch;
    const sb_layer *ly = &f->model->layers[il];
    int32_t ff = hp->n_ff;

    double t = tick(f);
    if (a->fused_gate_up) {
        /* Each row of the product is [gate | up]; compact the gates into hb2. */
        matmul(f, &ly->w_up, f->x, ly->ffn_norm.data, n, f->hb, &t);
        for (int32_t i = 0; i < n; i++) {
            float *row = f->hb + (size_t)i * 2 * ff;
            memcpy(f->hb2 + (size_t)i * ff, row, (size_t)ff * sizeof(float));
            glu(f->hb2 + (size_t)i * ff, row + ff, (size_t)ff, a->act);
        }
        charge(f, SB_FWD_GLU, &t);
    } else {
        matmul3(f, f->x, ly->ffn_norm.data, n, (const sb_weight *[]){&ly->w_gate, &ly->w_up},
                (float *[]){f->hb, f->hb2}, 2, &t);
    }
    /* Separate gates and ups meet in the down product's preparation. */
    update_residual(f, &ly->w_down, a->fused_gate_up ? f->hb2 : f->hb, a->fused_gate_up ? NULL : &GLU, n,
                    a->post_norms ? &ly->post_ffn_norm : NULL, &t);
}

int32_t sb_forward_layers(sb_forward *f, sb_kv *kv, const sb_batch_token *batch, int32_t n, float *out) {
    const sb_model *m = f->model;
    const sb_hparams *hp = &m->hp;
    int32_t dim = hp->n_embd;

    double t = tick(f);
    for (int32_t i = 0; i < n; i++) {
        float *xi = f->x + (size_t)i * dim;
        sb_get_row(m->tok_embd.type, m->tok_embd.data, dim, batch[i].token, m->tok_embd.packed, xi);
        if (hp->arch->embd_scale)
            for (int32_t e = 0; e < dim; e++)
                xi[e] *= sqrtf((float)dim);
    }
    for (int32_t i = 0; i < n; i++)
        rope_angles(f->rope_cs + (size_t)i * hp->n_rot, hp->n_rot, batch[i].pos, hp->rope_freq_base,
                    m->rope_freqs.data);
    charge(f, SB_FWD_NORMS, &t);
    for (int32_t il = 0; il < hp->n_layer; il++) {
        attention_block(f, kv, batch, n, il);
        ffn_block(f, n, il);
    }

    t = tick(f);
    /* Only the tokens that continue a sequence need the output layer. */
    int32_t n_out = 0;
    for (int32_t i = 0; i < n; i++) {
        if (batch[i].want_embd)
            rmsnorm(f->embd + (size_t)i * dim, f->x + (size_t)i * dim, m->output_norm.data, dim, hp->rms_eps);
        if (batch[i].want_logits)
            rmsnorm(out + (size_t)n_out++ * dim, f->x + (size_t)i * dim, m->output_norm.data, dim, hp->rms_eps);
    }
    charge(f, SB_FWD_NORMS, &t);
    return n_out;
}

void sb_forward_logits(sb_forward *f, const float *normed, int32_t n_out) {
    const sb_model *m = f->model;
    if (n_out == 0)
        return;
    double t = tick(f);
    sb_matmul_dst d = product_into(&m->output, f->logits);
    multiply(f, &d, 1, m->output.n_in, normed, NULL, NULL, n_out, SB_FWD_HEAD, &t);
    if (f->prof) {
        f->prof->head_type = m->output.type;
        f->prof->head_packed = m->output.packed;
    }
    if (m->hp.logit_softcap > 0)
        softcap(f->logits, (size_t)n_out * m->hp.n_vocab, m->hp.logit_softcap);
    charge(f, SB_FWD_OTHER, &t);
}

int32_t sb_forward_run(sb_forward *f, sb_kv *kv, const sb_batch_token *batch, int32_t n) {
    int32_t n_out = sb_forward_layers(f, kv, batch, n, f->xb);
    sb_forward_logits(f, f->xb, n_out);
    return n_out;
}

/* ---- buffers ---------------------------------------------------------------- */

sb_status sb_forward_init(sb_forward *f, const sb_model *m, sb_threadpool *pool, int32_t max_tokens,
                          int32_t max_logits, int32_t max_len, sb_error *err) {
    const sb_hparams *hp = &m->hp;
    *f = (sb_forward){.model = m, .pool = pool, .max_tokens = max_tokens, .max_logits = max_logits,
                      .max_len = max_len};
    size_t B = (size_t)max_tokens;
    size_t q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    size_t wide = SB_MAX(2 * (size_t)hp->n_ff, q_dim + 2 * kv_dim);
    /* Layers may mix types (quantizers fall back per tensor), so size the
     * matmul scratch for the largest need over every matrix. */
    size_t work = sb_matmul_work_size(m->output.type, m->output.n_in, max_logits);
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const sb_layer *ly = &m->layers[l];
        const sb_weight *mats[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wqkv, &ly->wo, &ly->w_gate, &ly->w_up, &ly->w_down};
        for (size_t i = 0; i < SB_ARRAY_LEN(mats); i++)
            if (mats[i]->data)
                work = SB_MAX(work, sb_matmul_work_size(mats[i]->type, mats[i]->n_in, max_tokens));
    }
    f->x = sb_malloc(B * hp->n_embd * sizeof(float));
    f->xb = sb_malloc(B * SB_MAX((size_t)hp->n_embd, q_dim) * sizeof(float));
    f->q = sb_malloc(B * q_dim * sizeof(float));
    f->k = sb_malloc(B * kv_dim * sizeof(float));
    f->v = sb_malloc(B * kv_dim * sizeof(float));
    f->att = sb_malloc(B * q_dim * sizeof(float));
    f->hb = sb_malloc(B * wide * sizeof(float));
    f->hb2 = sb_malloc(B * hp->n_ff * sizeof(float));
    f->rope_cs = sb_malloc(B * (size_t)hp->n_rot * sizeof(float));
    f->scores = sb_malloc((size_t)sb_threadpool_n_threads(pool) * ATTN_GROUP * (size_t)max_len * sizeof(float));
    f->group_start = sb_malloc(((size_t)max_tokens + 1) * sizeof(int32_t));
    f->logits = sb_malloc((size_t)max_logits * hp->n_vocab * sizeof(float));
    f->work = sb_malloc(work);
    f->embd = sb_malloc(B * hp->n_embd * sizeof(float));
    if (!f->group_start || !f->embd || !f->x || !f->xb || !f->q || !f->k || !f->v || !f->att || !f->hb || !f->hb2 || !f->rope_cs || !f->scores || !f->logits ||
        !f->work) {
        sb_forward_free(f);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for forward-pass buffers (%d tokens)", max_tokens);
    }
    return SB_OK;
}

void sb_forward_free(sb_forward *f) {
    float *bufs[] = {f->x, f->xb, f->q, f->k, f->v, f->att, f->hb, f->hb2, f->rope_cs, f->scores, f->logits, f->embd};
    for (size_t i = 0; i < SB_ARRAY_LEN(bufs); i++)
        sb_free(bufs[i]);
    sb_free(f->work);
    sb_free(f->group_start);
    *f = (sb_forward){0};
}

/* ---- KV storage --------------------------------------------------------------- */

sb_status sb_kv_init(sb_kv *kv, const sb_model *m, int32_t n_blocks, int32_t block_size, sb_cache_type type,
                     sb_error *err) {
    const sb_hparams *hp = &m->hp;
    *kv = (sb_kv){0};
    sb_type t;
    switch (type) {
    case SB_CACHE_F32: t = SB_TYPE_F32; break;
    case SB_CACHE_F16: t = SB_TYPE_F16; break;
    case SB_CACHE_Q8_0: t = SB_TYPE_Q8_0; break;
    default: return sb_fail(err, SB_ERR_INVALID_ARG, "cache_type %d is not an sb_cache_type", (int)type);
    }
    if (hp->head_dim % (int32_t)sb_type_traits_of(t)->blck_size != 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "a %s KV cache needs a head size that is a multiple of %u (this model: %d)",
                       sb_cache_type_name(type), sb_type_traits_of(t)->blck_size, hp->head_dim);
    *kv = (sb_kv){.n_layer = hp->n_layer, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                  .block_size = block_size, .n_blocks = n_blocks, .type = t, .row = sb_type_row_size(t, hp->head_dim)};
    size_t bytes = (size_t)hp->n_layer * (size_t)n_blocks * (size_t)block_size * (size_t)hp->n_head_kv * kv->row;
    kv->k_mem = sb_malloc(bytes + 64);
    kv->v_mem = sb_malloc(bytes + 64);
    if (!kv->k_mem || !kv->v_mem) {
        sb_kv_free(kv);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for a KV cache of %d x %d positions in %s (%zu MiB)",
                       n_blocks, block_size, sb_cache_type_name(type), 2 * bytes >> 20);
    }
    /* 64-byte aligned, so that whole rows can be streamed in (store_rows). */
    kv->k = (uint8_t *)sb_align_up((uintptr_t)kv->k_mem, 64);
    kv->v = (uint8_t *)sb_align_up((uintptr_t)kv->v_mem, 64);
    /* Huge pages where the system gives them on request, asked for before
     * the first touch: a token's keys and values are 2 x n_head_kv rows a
     * head stride apart, and attention walks one run per block, over 4 KiB
     * pages a TLB miss each (KV placement per step: 1 stream 90-113 -> 32-44
     * us, 8 streams ~405 -> 170-186 us). Then zeroed, which also touches the
     * whole cache now, so the resident size does not grow with use. */
    sb__advise_inside(kv->k, bytes, (uintptr_t)2 << 20, MADV_HUGEPAGE);
    sb__advise_inside(kv->v, bytes, (uintptr_t)2 << 20, MADV_HUGEPAGE);
    memset(kv->k, 0, bytes);
    memset(kv->v, 0, bytes);
    return SB_OK;
}

void sb_kv_free(sb_kv *kv) {
    sb_free(kv->k_mem);
    sb_free(kv->v_mem);
    *kv = (sb_kv){0};
}
