/*
 * sampler.c - picks the next token from a vector of logits.
 *
 * The pipeline is llama.cpp's default chain, so users get the behaviour they
 * know: repetition penalties over a window of recent tokens, logit biases
 * and a grammar's mask (banned tokens become -inf), then either the
 * greedy argmax (temperature 0) or top-k -> top-p -> min-p -> temperature ->
 * softmax -> a seeded random draw. Top-p and min-p see probabilities at
 * temperature 1, as in llama.cpp.
 *
 * Determinism: the generator is xoshiro256** seeded through splitmix64, pure
 * integer arithmetic. Candidates are ordered by (logit descending, id
 * ascending), a total order, using this file's own heaps rather than qsort
 * (whose treatment of ties differs between C libraries). The same seed and
 * logits therefore give the same tokens on every platform, up to last-bit
 * differences in expf or in the compiler's fusing of multiply-adds, which
 * can only matter when a draw lands within rounding of a boundary.
 *
 * Cost per token: O(n_vocab) to copy and scan the logits. With top-k on,
 * the k best are kept in a k-sized heap (O(log k) per candidate that enters
 * it), and blocks of the vocabulary with no logit that can enter it are
 * passed over after one vectorisable test; without top-k, candidates are
 * ranked lazily from a heap of the whole vocabulary, O(log n_vocab) each,
 * only as far as top-p and min-p look. Nothing is allocated after create.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/base.h"
#include "base/rng.h"

/* Tokens per block of the draw: the blocks' sums locate the drawn one. */
#define DRAW_BLOCK 64

typedef struct {
    int32_t id;
    float logit; /* after penalties; the draw reuses it for the unnormalised probability */
} candidate;

struct sb_sampler {
    sb_sampler_params params;
    int32_t n_vocab;
    float *logits;       /* (n_vocab) after penalties, NaN banned (-inf) and +inf made finite */
    int32_t *ids;        /* (n_vocab) the draw's tokens, when not all of them */
    double *block_sums;  /* (n_vocab / DRAW_BLOCK + 1) the draw's weight per block */
    candidate *heap;     /* (n_vocab) a heap of the candidates (without top-k) */
    candidate *ranked;   /* (n_vocab) candidates in best-first order, as far as ranked */
    int32_t *recent;     /* (repeat_last_n) ring of the last accepted tokens; NULL if no penalty */
    int32_t n_recent;    /* tokens in the ring, <= repeat_last_n */
    int32_t recent_next; /* slot the next accepted token overwrites */
    int32_t *counts;     /* (n_vocab) occurrences of each token in the ring; NULL if no penalty */
    sb_logit_bias *bias; /* (params.n_logit_bias) copied; banned ones carry -inf */
    sb_rng rng;          /* seeded once; one draw per sampled token */
};

/* ---- parameters -------------------------------------------------------- */

sb_sampler_params sb_sampler_default_params(void) {
    return (sb_sampler_params){
        .temperature = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .repeat_last_n = 64,
        .frequency_penalty = 0.0f,
        .presence_penalty = 0.0f,
        .seed = 0,
    };
}

/* The checks are written as !(valid) so that NaN, which fails every
 * comparison, is rejected as well. */
static sb_status check_params(const sb_sampler_params *p, int32_t n_vocab, sb_error *err) {
    if (n_vocab <= 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "sampler: n_vocab must be > 0, got %d", (int)n_vocab);
    if (!(p->temperature >= 0.0f && isfinite(p->temperature)))
        return sb_fail(err, SB_ERR_INVALID_ARG, "sampler: temperature must be finite and >= 0 (0 = greedy), got %g",
                       (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return sb_fail(err, SB_ERR_INVALID_ARG, "sampler: top_p must be in (0, 1], got %g", (double)p->top_p);
    if (!(p->min_p <= 1.0f))
        return sb_fail(err, SB_ERR_INVALID_ARG, "sampler: min_p must be <= 1 (<= 0 = off), got %g", (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f && isfinite(p->repeat_penalty)))
        return sb_fail(err, SB_ERR_INVALID_ARG, "sampler: repeat_penalty must be finite and > 0 (1 = off), got %g",
                       (double)p->repeat_penalty);
    if (p->repeat_last_n < 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "sampler: repeat_last_n must be >= 0 (0 = off), got %d",
                       (int)p->repeat_last_n);
    if (!isfinite(p->frequency_penalty))
        return sb_fail(err, SB_ERR_INVALID_ARG, "sampler: frequency_penalty must be finite, got %g",
                       (double)p->frequency_penalty);
    if (!isfinite(p->presence_penalty))
        return sb_fail(err, SB_ERR_INVALID_ARG, "sampler: presence_penalty must be finite, got %g",
                       (double)p->presence_penalty);
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
        return sb_fail(err, SB_ERR_INVALID_ARG, "sampler: logit_bias has %d entries and no array",
                       (int)p->n_logit_bias);
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        const sb_logit_bias *b = &p->logit_bias[i];
        if (b->token < 0 || b->token >= n_vocab)
            return sb_fail(err, SB_ERR_INVALID_ARG, "sampler: logit_bias token %d is outside the vocabulary (0..%d)",
                           (int)b->token, (int)n_vocab - 1);
        if (!(b->bias >= -100.0f && b->bias <= 100.0f))
            return sb_fail(err, SB_ERR_INVALID_ARG, "sampler: logit_bias of token %d must be in [-100, 100], got %g",
                           (int)b->token, (double)b->bias);
    }
    return SB_OK;
}

/* Whether any penalty can change a logit; if none can, no history is kept. */
static bool penalizes(const sb_sampler_params *p) {
    return p->repeat_last_n > 0 &&
           (p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f);
}

/* ---- lifecycle --------------------------------------------------------- */

/* NULL params means sb_sampler_default_params(). */
sb_status sb_sampler_create(const sb_sampler_params *params, int32_t n_vocab, sb_sampler_t **out,
                            sb_error *err) {
    *out = NULL;
    sb_sampler_params p = params ? *params : sb_sampler_default_params();
    sb_status status = check_params(&p, n_vocab, err);
    if (status != SB_OK)
        return status;

    sb_sampler_t *s = sb_calloc(1, sizeof(*s));
    if (!s)
        return sb_fail(err, SB_ERR_NOMEM, "sampler: out of memory");
    s->params = p;
    s->n_vocab = n_vocab;
    s->logits = sb_calloc((size_t)n_vocab, sizeof(*s->logits));
    s->ids = sb_calloc((size_t)n_vocab, sizeof(*s->ids));
    s->block_sums = sb_calloc((size_t)n_vocab / DRAW_BLOCK + 1, sizeof(*s->block_sums));
    s->heap = sb_calloc((size_t)n_vocab, sizeof(*s->heap));
    s->ranked = sb_calloc((size_t)n_vocab, sizeof(*s->ranked));
    bool ok = s->logits && s->ids && s->block_sums && s->heap && s->ranked;
    if (ok && penalizes(&p)) {
        s->recent = sb_calloc((size_t)p.repeat_last_n, sizeof(*s->recent));
        s->counts = sb_calloc((size_t)n_vocab, sizeof(*s->counts));
        ok = s->recent && s->counts;
    }
    if (ok && p.n_logit_bias > 0) {
        /* -100 is OpenAI's "ban": exactly, not a logit merely lowered by 100. */
        s->bias = sb_malloc((size_t)p.n_logit_bias * sizeof(*s->bias));
        ok = s->bias != NULL;
        for (int32_t i = 0; ok && i < p.n_logit_bias; i++) {
            s->bias[i] = p.logit_bias[i];
            if (s->bias[i].bias <= -100.0f)
                s->bias[i].bias = -INFINITY;
        }
    }
    s->params.logit_bias = NULL; /* the caller's array is not kept */
    if (!ok) {
        sb_sampler_free(s);
        return sb_fail(err, SB_ERR_NOMEM, "sampler: out of memory for a vocabulary of %d tokens", (int)n_vocab);
    }
    sb_rng_seed(&s->rng, p.seed);
    *out = s;
    return SB_OK;
}

void sb_sampler_free(sb_sampler_t *s) {
    if (!s)
        return;
    sb_free(s->logits);
    sb_free(s->ids);
    sb_free(s->block_sums);
    sb_free(s->heap);
    sb_free(s->ranked);
    sb_free(s->recent);
    sb_free(s->counts);
    sb_free(s->bias);
    sb_free(s);
}

/* Ids outside the vocabulary cannot be penalised and are ignored. */
void sb_sampler_accept(sb_sampler_t *s, int32_t token) {
    if (!s->counts || token < 0 || token >= s->n_vocab)
        return;
    int32_t window = s->params.repeat_last_n;
    if (s->n_recent == window)
        s->counts[s->recent[s->recent_next]]--;
    else
        s->n_recent++;
    s->recent[s->recent_next] = token;
    s->counts[token]++;
    s->recent_next = (s->recent_next + 1) % window;
}

/* ---- penalties --------------------------------------------------------- */

/* Applies the llama.cpp repeat penalty and the OpenAI frequency/presence
 * penalties to logits[]. */
static void apply_penalties(sb_sampler_t *s) {
    if (!s->counts)
        return;
    const sb_sampler_params *p = &s->params;
    /* The ring may hold a token many times, but each penalty applies once per
     * distinct token: a handled token's count is negated, then restored. */
    for (int32_t i = 0; i < s->n_recent; i++) {
        int32_t token = s->recent[i];
        int32_t count = s->counts[token];
        if (count <= 0)
            continue;
        float *logit = &s->logits[token];
        *logit = *logit > 0.0f ? *logit / p->repeat_penalty : *logit * p->repeat_penalty;
        *logit -= (float)count * p->frequency_penalty + p->presence_penalty;
        s->counts[token] = -count;
    }
    for (int32_t i = 0; i < s->n_recent; i++) {
        int32_t token = s->recent[i];
        if (s->counts[token] < 0)
            s->counts[token] = -s->counts[token];
    }
}

typedef float f32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));

/* dst[i] = src[i] tamed (dst may be src): NaN becomes -inf (banned, like a
 * masked token) and +inf the largest float, which still wins but keeps
 * softmax arithmetic finite. Returns the largest tamed value. The copy, the
 * taming and the maximum are one pass, since the logits arrive from the
 * other threads' caches (a second pass for the maximum: 24 us per
 * 32,000-token draw against 22), with two running maxima of 16 lanes each
 * (one waits on every comparison; gcc does not vectorise a float max
 * reduction by itself). */
static inline float tamed(float x) { return x != x ? -INFINITY : x == INFINITY ? FLT_MAX : x; }

SB_VECTOR_CLONES static float tame_max(float *dst, const float *src, size_t n) {
    f32x16 neg_inf, inf, big;
    for (int j = 0; j < 16; j++) {
        neg_inf[j] = -INFINITY;
        inf[j] = INFINITY;
        big[j] = FLT_MAX;
    }
    f32x16 m[2] = {neg_inf, neg_inf};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int h = 0; h < 2; h++) {
            f32x16 x;
            memcpy(&x, src + i + 16 * h, sizeof(x));
            const i32x16 nan = x != x, pinf = x == inf;
            x = (f32x16)((nan & (i32x16)neg_inf) | (~nan & (i32x16)x));
            x = (f32x16)((pinf & (i32x16)big) | (~pinf & (i32x16)x));
            memcpy(dst + i + 16 * h, &x, sizeof(x));
            const i32x16 gt = x > m[h];
            m[h] = (f32x16)((gt & (i32x16)x) | (~gt & (i32x16)m[h]));
        }
    float best = -INFINITY;
    for (int j = 0; j < 16; j++) {
        best = m[0][j] > best ? m[0][j] : best;
        best = m[1][j] > best ? m[1][j] : best;
    }
    for (; i < n; i++) {
        dst[i] = tamed(src[i]);
        best = dst[i] > best ? dst[i] : best;
    }
    return best;
}

/* The first i with v[i] == x (x is in v), a block of 64 at a time (one
 * vectorisable test per block). */
SB_VECTOR_CLONES static size_t first_index(const float *v, size_t n, float x) {
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        int hit = 0;
        for (int j = 0; j < 64; j++)
            hit |= v[i + j] == x;
        if (hit)
            break;
    }
    while (v[i] != x)
        i++;
    return i;
}

/* Bans (-inf) the tokens whose bit is clear, a word of 32 at a time: a
 * grammar's mask is mostly all-ones or all-zeros words. */
static void apply_mask(float *v, size_t n, const uint32_t *allowed) {
    for (size_t w = 0; w * 32 < n; w++) {
        uint32_t bits = allowed[w];
        size_t i0 = w * 32, i1 = i0 + 32 < n ? i0 + 32 : n;
        if (bits == UINT32_MAX && i1 - i0 == 32)
            continue;
        for (size_t i = i0; i < i1; i++)
            if (!(bits >> (i - i0) & 1))
                v[i] = -INFINITY;
    }
}

/* Copies logits into s->logits, penalised, biased, masked and tamed;
 * returns the largest. */
static float load_logits(sb_sampler_t *s, const float *logits, const uint32_t *allowed) {
    float *v = s->logits;
    const size_t n = (size_t)s->n_vocab;
    if (!s->counts && !s->bias && !allowed)
        return tame_max(v, logits, n);
    memcpy(v, logits, n * sizeof(*v));
    apply_penalties(s);
    for (int32_t i = 0; s->bias && i < s->params.n_logit_bias; i++)
        v[s->bias[i].token] += s->bias[i].bias;
    if (allowed)
        apply_mask(v, n, allowed);
    return tame_max(v, v, n);
}

/* ---- ranking ----------------------------------------------------------- */

/* Best-first total order: higher logit, then lower id, so that ties break
 * the same way on every platform. */
static bool better(candidate a, candidate b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); }

/* Heaps come in two orientations: best-first ranks the whole vocabulary,
 * worst-first keeps the k best seen so far with the one to beat at the root. */
static bool above(candidate a, candidate b, bool worst_first) { return worst_first ? better(b, a) : better(a, b); }

static void sift_down(candidate *h, size_t n, size_t i, bool worst_first) {
    for (;;) {
        size_t top = i, left = 2 * i + 1, right = left + 1;
        if (left < n && above(h[left], h[top], worst_first))
            top = left;
        if (right < n && above(h[right], h[top], worst_first))
            top = right;
        if (top == i)
            return;
        candidate tmp = h[i];
        h[i] = h[top];
        h[top] = tmp;
        i = top;
    }
}

static void heapify(candidate *h, size_t n, bool worst_first) {
    for (size_t i = n / 2; i-- > 0;)
        sift_down(h, n, i, worst_first);
}

/* Removes and returns the best of the *n candidates in a best-first heap. */
static candidate pop_best(candidate *h, size_t *n) {
    candidate top = h[0];
    h[0] = h[--*n];
    sift_down(h, *n, 0, false);
    return top;
}

/* The first j >= i with v[j] > x, or n: a block of 64 at a time (one
 * vectorisable test per block). */
SB_VECTOR_CLONES static size_t next_above(const float *v, size_t i, size_t n, float x) {
    for (; i + 64 <= n; i += 64) {
        int hit = 0;
        for (int j = 0; j < 64; j++)
            hit |= v[i + j] > x;
        if (hit)
            break;
    }
    while (i < n && !(v[i] > x))
        i++;
    return i;
}

/* Writes the k best unbanned tokens of v[0..n) to out[], best first, and
 * returns how many there are (fewer than k if fewer are unbanned). Tokens
 * are scanned in id order, so a later token beats the heap's worst only
 * with a strictly larger logit, and the scan for the next such token
 * passes over blocks in one vector test each: after the first few thousand
 * tokens nearly all blocks hold none. O(log k) per token that enters the
 * running top k. */
static size_t select_best(const float *v, size_t n, size_t k, candidate *out) {
    size_t m = 0, i = 0;
    for (; i < n && m < k; i++)
        if (v[i] > -INFINITY)
            out[m++] = (candidate){(int32_t)i, v[i]};
    heapify(out, m, true);
    while (m == k && (i = next_above(v, i, n, out[0].logit)) < n) {
        out[0] = (candidate){(int32_t)i, v[i]};
        sift_down(out, k, 0, true);
        i++;
    }
    /* Heapsort: moving the worst to the back each time leaves out[] best first. */
    for (size_t end = m; end > 1; end--) {
        candidate worst = out[0];
        out[0] = out[end - 1];
        out[end - 1] = worst;
        sift_down(out, end - 1, 0, true);
    }
    return m;
}

/* ---- sampling ---------------------------------------------------------- */

/* Applies top-k, top-p and min-p to the loaded candidates, whose largest
 * logit is max (finite). Returns the survivors' count, at least one, and
 * through *out where they are, ranked[] best first; when no filter is on,
 * *out is NULL and every token survives (the draw weighs banned ones 0).
 * Only as many candidates are ranked as the filters look at. */
static size_t apply_filters(sb_sampler_t *s, float max, candidate **out) {
    const sb_sampler_params *p = &s->params;
    const size_t n_vocab = (size_t)s->n_vocab;
    const bool top_k = p->top_k > 0 && (size_t)p->top_k < n_vocab;
    const bool top_p = p->top_p < 1.0f;
    const bool min_p = p->min_p > 0.0f;
    /* Banned (-inf) tokens never survive a filter, which also keeps the
     * one-survivor rule from ever bringing one back; with no filter on they
     * stay, and the draw weighs them 0. */
    size_t n_heap = 0, n_ranked = 0;
    if (!top_k && !top_p && !min_p) {
        *out = NULL;
        return n_vocab;
    }

    /* min-p keeps a token whose probability is at least min_p times the best
     * one's, i.e. whose logit is at least max + log(min_p) <= max, so the
     * best token always passes. */
    const float min_logit = min_p ? max + logf(p->min_p) : -INFINITY;
    /* top-p measures mass against what top-k kept (at temperature 1), so
     * top-k is applied in full first; without it the reference is every
     * token, and those below the min-p floor are counted but never ranked. */
    double mass = 0.0;
    if (top_k) {
        n_ranked = select_best(s->logits, n_vocab, (size_t)p->top_k, s->ranked);
        for (size_t i = 0; i < n_ranked; i++)
            mass += expf(s->ranked[i].logit - max);
    } else {
        for (size_t i = 0; i < n_vocab; i++) {
            float v = s->logits[i];
            mass += expf(v - max);
            if (v > -INFINITY && v >= min_logit)
                s->heap[n_heap++] = (candidate){(int32_t)i, v};
        }
        heapify(s->heap, n_heap, false);
    }
    const double target = top_p ? (double)p->top_p * mass : INFINITY;

    /* Both top-p and min-p keep a prefix of the best-first order, so top-p
     * followed by min-p keeps the shorter prefix: one walk stopping at the
     * first cut gives llama.cpp's result. Without top-k, candidates are
     * ranked lazily, as the walk reaches them. */
    const size_t limit = top_k ? n_ranked : n_heap;
    size_t keep = 0;
    double cum = 0.0;
    while (keep < limit) {
        if (keep == n_ranked)
            s->ranked[n_ranked++] = pop_best(s->heap, &n_heap);
        const candidate *c = &s->ranked[keep];
        if (c->logit < min_logit)
            break;
        keep++;
        cum += expf(c->logit - max);
        if (cum >= target)
            break;
    }
    *out = s->ranked;
    return keep;
}

/* e^x for x <= 0, 0 below -87 (where expf leaves the normal range): 2^k
 * times a degree-6 polynomial on |r| <= ln(2)/2, within about an ulp of
 * expf. Plain float arithmetic, so the draw loop vectorises and gives the
 * same weights on every platform. */
static inline float exp_nonpositive(float x) {
    const float big = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const float xc = x > -87.0f ? x : -87.0f; /* keeps 2^k a normal float (and -inf out) */
    float k = (xc * 1.44269504f + big) - big;
    float r = (xc - k * 0.693145752f) - k * 1.42860677e-06f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666672f + r * (0.0416666679f + r * (0.00833333377f +
                                                                                          r * 0.00138888892f)))));
    /* 2^k from its exponent bits (a union, not memcpy, so that loops of it vectorise). */
    union {
        int32_t bits;
        float f;
    } scale = {.bits = ((int32_t)k + 127) << 23};
    return x > -87.0f ? p * scale.f : 0.0f;
}

/* Draws from the softmax at the sampler's temperature of n logits w[0..n)
 * (overwritten with their weights) of tokens ids[0..n) (ids NULL: token i);
 * max is their largest logit. The weights are summed per block of
 * DRAW_BLOCK in 8 independent lanes (vectorisable, in a fixed order), the
 * total over blocks in order; the draw walks the blocks, then the one it
 * lands in. Rounding can leave the walk short of u: then the last weighted
 * token of that block (or of all) wins. */
/* The weights and per-block sums of draw(): all the weights first, whose
 * exponentials are independent, then the sums (the exponentials block by
 * block, each block's ahead of its sums: 28 us per 32,000-token draw
 * against 24). */
SB_VECTOR_CLONES static double weigh_blocks(float *w, size_t n, float max, float inv_t, double *block_sums) {
    const size_t n_blocks = (n + DRAW_BLOCK - 1) / DRAW_BLOCK;
    for (size_t i = 0; i < n; i++)
        w[i] = exp_nonpositive((w[i] - max) * inv_t);
    double total = 0.0;
    for (size_t b = 0; b < n_blocks; b++) {
        const size_t i0 = b * DRAW_BLOCK, i1 = i0 + DRAW_BLOCK < n ? i0 + DRAW_BLOCK : n;
        /* Lane j sums w[i0 + j], w[i0 + 8 + j], ... in double: 8 lanes as one vector. */
        typedef float f32x8 __attribute__((vector_size(32)));
        typedef double f64x8 __attribute__((vector_size(64)));
        f64x8 lanes = {0};
        size_t i = i0;
        for (; i + 8 <= i1; i += 8) {
            f32x8 x;
            memcpy(&x, w + i, sizeof(x));
            lanes += __builtin_convertvector(x, f64x8);
        }
        double lane[8];
        memcpy(lane, &lanes, sizeof(lane));
        for (; i < i1; i++)
            lane[0] += w[i];
        block_sums[b] = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
        total += block_sums[b];
    }
    return total;
}

static int32_t draw(sb_sampler_t *s, float *w, const int32_t *ids, size_t n, float max) {
    const size_t n_blocks = (n + DRAW_BLOCK - 1) / DRAW_BLOCK;
    const double total = weigh_blocks(w, n, max, 1.0f / s->params.temperature, s->block_sums);
    const double u = sb_rng_uniform(&s->rng) * total;
    double cum = 0.0;
    size_t b = 0;
    while (b + 1 < n_blocks && !(u < cum + s->block_sums[b]))
        cum += s->block_sums[b++];
    size_t chosen = SIZE_MAX;
    for (size_t i = b * DRAW_BLOCK; i < n && i < (b + 1) * DRAW_BLOCK; i++) {
        if (w[i] == 0.0f)
            continue;
        chosen = i;
        cum += w[i];
        if (u < cum)
            break;
    }
    /* Only the last block can be reached without weight (rounding): then
     * the last weighted token before it; the best token weighs 1. */
    for (size_t i = b * DRAW_BLOCK; chosen == SIZE_MAX && i-- > 0;)
        chosen = w[i] != 0.0f ? i : chosen;
    return ids ? ids[chosen] : (int32_t)chosen;
}

int32_t sb_sampler_sample(sb_sampler_t *s, const float *logits) { return sb_sampler_sample_masked(s, logits, NULL); }

int32_t sb_sampler_sample_masked(sb_sampler_t *s, const float *logits, const uint32_t *allowed) {
    const float max = load_logits(s, logits, allowed);
    /* Greedy: the best token, the lowest id among ties; with everything
     * banned there is no preference, and the same rule picks token 0. */
    if (s->params.temperature == 0.0f || max == -INFINITY)
        return (int32_t)first_index(s->logits, (size_t)s->n_vocab, max);
    candidate *survivors;
    size_t n_survivors = apply_filters(s, max, &survivors);
    if (!survivors) /* no filter: every token, banned ones weigh 0 */
        return draw(s, s->logits, NULL, (size_t)s->n_vocab, max);
    /* The survivors' logits and ids, apart, into scratch the filters are done with. */
    for (size_t i = 0; i < n_survivors; i++) {
        s->logits[i] = survivors[i].logit;
        s->ids[i] = survivors[i].id;
    }
    return draw(s, s->logits, s->ids, n_survivors, max);
}
