/*
 * test_sampling.c - the sampler (penalties, greedy, top-k/top-p/min-p,
 * seeded draws, bad logits, parameter checks) and the stop-string matcher.
 *
 * Filters are checked through the public API: with hand-made logits whose
 * probabilities are known, many draws must land only on the tokens a filter
 * keeps, and on each of them.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "base/base.h"
#include "sampling/stop.h"
#include "testutil.h"

/* ---- sampler helpers --------------------------------------------------- */

/* Parameters with every filter and penalty off, at temperature 1. */
static sb_sampler_params plain_params(void) {
    sb_sampler_params p = sb_sampler_default_params();
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    return p;
}

static sb_sampler_t *make_sampler(const sb_sampler_params *p, int32_t n_vocab) {
    sb_sampler_t *s = NULL;
    sb_error err = {0};
    sb_status st = sb_sampler_create(p, n_vocab, &s, &err);
    if (st != SB_OK)
        fail_msg("sb_sampler_create: %s", err.msg);
    return s;
}

/* Logits whose softmax is exactly probs (up to rounding). */
static void logits_from_probs(const double *probs, float *logits, int n) {
    for (int i = 0; i < n; i++)
        logits[i] = (float)log(probs[i]);
}

/* Draws `draws` tokens and counts how often each id comes up. */
static void histogram(sb_sampler_t *s, const float *logits, int n_vocab, int draws, int *counts) {
    memset(counts, 0, sizeof(int) * (size_t)n_vocab);
    for (int i = 0; i < draws; i++) {
        int32_t t = sb_sampler_sample(s, logits);
        assert_true(t >= 0 && t < n_vocab);
        counts[t]++;
    }
}

/* Asserts that exactly the tokens in `allowed` (a 0/1 mask) were drawn. */
static void assert_drawn_set(const int *counts, const int *allowed, int n) {
    for (int i = 0; i < n; i++) {
        if (allowed[i] && counts[i] == 0)
            fail_msg("token %d should be drawn but never was", i);
        if (!allowed[i] && counts[i] != 0)
            fail_msg("token %d should be filtered out but was drawn %d times", i, counts[i]);
    }
}

/* Deterministic pseudo-random logits in [-5, 5) for the reproducibility tests. */
static void noise_logits(float *logits, int n, uint32_t state) {
    for (int i = 0; i < n; i++) {
        state = state * 1664525u + 1013904223u;
        logits[i] = (float)(state >> 8) / (float)(1u << 24) * 10.0f - 5.0f;
    }
}

/* Probabilities used by the filter tests: sorted, with clear gaps. */
static const double PROBS4[4] = {0.5, 0.3, 0.15, 0.05};

/* ---- greedy ------------------------------------------------------------ */

static void test_greedy_picks_argmax_lowest_id_on_ties(void **state) {
    (void)state;
    sb_sampler_params p = plain_params();
    p.temperature = 0.0f;
    sb_sampler_t *s = make_sampler(&p, 5);
    const float logits[5] = {1.0f, 3.0f, -2.0f, 3.0f, 2.5f};
    assert_int_equal(sb_sampler_sample(s, logits), 1);
    const float all_equal[5] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
    assert_int_equal(sb_sampler_sample(s, all_equal), 0);
    sb_sampler_free(s);
}

static void test_top_k_1_equals_greedy(void **state) {
    (void)state;
    enum { N = 300 };
    float logits[N];
    sb_sampler_params greedy = plain_params();
    greedy.temperature = 0.0f;
    sb_sampler_t *g = make_sampler(&greedy, N);
    for (uint64_t seed = 0; seed < 20; seed++) {
        sb_sampler_params p = plain_params();
        p.top_k = 1;
        p.seed = seed;
        sb_sampler_t *s = make_sampler(&p, N);
        noise_logits(logits, N, (uint32_t)seed + 7);
        assert_int_equal(sb_sampler_sample(s, logits), sb_sampler_sample(g, logits));
        sb_sampler_free(s);
    }
    sb_sampler_free(g);
}

/* ---- filters ----------------------------------------------------------- */

static void test_top_k_keeps_k_best(void **state) {
    (void)state;
    float logits[4];
    logits_from_probs(PROBS4, logits, 4);
    sb_sampler_params p = plain_params();
    p.top_k = 2;
    sb_sampler_t *s = make_sampler(&p, 4);
    int counts[4];
    histogram(s, logits, 4, 2000, counts);
    assert_drawn_set(counts, (const int[]){1, 1, 0, 0}, 4);
    sb_sampler_free(s);

    /* on ties the lower ids rank first */
    const float tied[4] = {1.0f, 3.0f, 3.0f, 3.0f};
    s = make_sampler(&p, 4);
    histogram(s, tied, 4, 1000, counts);
    assert_drawn_set(counts, (const int[]){0, 1, 1, 0}, 4);
    sb_sampler_free(s);

    /* top_k larger than the vocabulary keeps everything */
    p.top_k = 100;
    s = make_sampler(&p, 4);
    histogram(s, logits, 4, 4000, counts);
    assert_drawn_set(counts, (const int[]){1, 1, 1, 1}, 4);
    sb_sampler_free(s);
}

static void test_top_p_cuts_at_cumulative_mass(void **state) {
    (void)state;
    float logits[4];
    logits_from_probs(PROBS4, logits, 4);
    /* cumulative mass: 0.5, 0.8, 0.95, 1.0; the token that reaches top_p stays */
    const struct {
        float top_p;
        int allowed[4];
    } cases[] = {
        {0.4f, {1, 0, 0, 0}},
        {0.75f, {1, 1, 0, 0}},
        {0.85f, {1, 1, 1, 0}},
        {0.99f, {1, 1, 1, 1}},
    };
    for (size_t c = 0; c < SB_ARRAY_LEN(cases); c++) {
        sb_sampler_params p = plain_params();
        p.top_p = cases[c].top_p;
        sb_sampler_t *s = make_sampler(&p, 4);
        int counts[4];
        histogram(s, logits, 4, 4000, counts);
        assert_drawn_set(counts, cases[c].allowed, 4);
        sb_sampler_free(s);
    }
    /* equal logits: 0.25 each, so top_p 0.3 keeps two, the lowest ids */
    sb_sampler_params p = plain_params();
    p.top_p = 0.3f;
    sb_sampler_t *s = make_sampler(&p, 4);
    const float tied[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int counts[4];
    histogram(s, tied, 4, 1000, counts);
    assert_drawn_set(counts, (const int[]){1, 1, 0, 0}, 4);
    sb_sampler_free(s);
}

static void test_top_p_is_relative_to_top_k(void **state) {
    (void)state;
    float logits[4];
    logits_from_probs(PROBS4, logits, 4);
    /* After top_k = 2 the masses are 0.625, 0.375: top_p 0.6 then keeps one. */
    sb_sampler_params p = plain_params();
    p.top_k = 2;
    p.top_p = 0.6f;
    sb_sampler_t *s = make_sampler(&p, 4);
    int counts[4];
    histogram(s, logits, 4, 1000, counts);
    assert_drawn_set(counts, (const int[]){1, 0, 0, 0}, 4);
    sb_sampler_free(s);
}

static void test_min_p_cuts_relative_to_best(void **state) {
    (void)state;
    float logits[4];
    logits_from_probs(PROBS4, logits, 4);
    /* floors: 0.2 * 0.5 = 0.1 keeps 0.15; 0.5 * 0.5 = 0.25 keeps 0.3; 0.9 keeps only the best */
    const struct {
        float min_p;
        int allowed[4];
    } cases[] = {
        {0.2f, {1, 1, 1, 0}},
        {0.5f, {1, 1, 0, 0}},
        {0.9f, {1, 0, 0, 0}},
        {1.0f, {1, 0, 0, 0}},
    };
    for (size_t c = 0; c < SB_ARRAY_LEN(cases); c++) {
        sb_sampler_params p = plain_params();
        p.min_p = cases[c].min_p;
        sb_sampler_t *s = make_sampler(&p, 4);
        int counts[4];
        histogram(s, logits, 4, 4000, counts);
        assert_drawn_set(counts, cases[c].allowed, 4);
        sb_sampler_free(s);
    }
}

static void test_top_p_and_min_p_keep_the_shorter_cut(void **state) {
    (void)state;
    float logits[4];
    logits_from_probs(PROBS4, logits, 4);
    const struct {
        float top_p, min_p;
        int allowed[4];
    } cases[] = {
        {0.85f, 0.5f, {1, 1, 0, 0}}, /* top-p keeps 3, min-p 2 */
        {0.6f, 0.2f, {1, 1, 0, 0}},  /* top-p keeps 2, min-p 3 */
    };
    for (size_t c = 0; c < SB_ARRAY_LEN(cases); c++) {
        for (int32_t top_k = 0; top_k <= 3; top_k += 3) { /* without and with top-k */
            sb_sampler_params p = plain_params();
            p.top_p = cases[c].top_p;
            p.min_p = cases[c].min_p;
            p.top_k = top_k;
            sb_sampler_t *s = make_sampler(&p, 4);
            int counts[4];
            histogram(s, logits, 4, 2000, counts);
            assert_drawn_set(counts, cases[c].allowed, 4);
            sb_sampler_free(s);
        }
    }
}

/* Top-k keeping every unbanned token must not change anything: this pits the
 * k-best selection against the lazily ranked whole vocabulary. */
static void test_top_k_paths_agree(void **state) {
    (void)state;
    enum { N = 3000, LEN = 100 };
    static float logits[N];
    sb_sampler_params p = sb_sampler_default_params();
    p.top_p = 0.9f;
    p.min_p = 0.01f;
    p.temperature = 1.2f;
    p.seed = 7;
    sb_sampler_params with_k = p;
    p.top_k = 0;
    with_k.top_k = N - 1;
    sb_sampler_t *a = make_sampler(&p, N), *b = make_sampler(&with_k, N);
    for (int i = 0; i < LEN; i++) {
        noise_logits(logits, N, (uint32_t)i + 1000);
        logits[i] = -INFINITY;
        assert_int_equal(sb_sampler_sample(a, logits), sb_sampler_sample(b, logits));
    }
    sb_sampler_free(a);
    sb_sampler_free(b);
}

/* Pearson's statistic of observed counts against expected probabilities. */
static double chi_square(const int *counts, const double *probs, int n, int draws) {
    double x2 = 0.0;
    for (int i = 0; i < n; i++) {
        double expected = probs[i] * draws;
        x2 += (counts[i] - expected) * (counts[i] - expected) / expected;
    }
    return x2;
}

static void test_draws_follow_softmax(void **state) {
    (void)state;
    enum { DRAWS = 40000 };
    float logits[4];
    logits_from_probs(PROBS4, logits, 4);
    int counts[4];
    /* 3 degrees of freedom: P(chi2 > 30) is about 1e-6, so a correct sampler
     * essentially never fails while a wrong distribution (e.g. off by 0.02 on
     * one token) gives hundreds. */
    sb_sampler_params p = plain_params();
    p.seed = 12345;
    sb_sampler_t *s = make_sampler(&p, 4);
    histogram(s, logits, 4, DRAWS, counts);
    assert_true(chi_square(counts, PROBS4, 4, DRAWS) < 30.0);
    sb_sampler_free(s);

    /* Temperature 0.5 squares the probabilities before renormalising. */
    double sharp[4], z = 0.0;
    for (int i = 0; i < 4; i++)
        z += sharp[i] = PROBS4[i] * PROBS4[i];
    for (int i = 0; i < 4; i++)
        sharp[i] /= z;
    p.temperature = 0.5f;
    s = make_sampler(&p, 4);
    histogram(s, logits, 4, DRAWS, counts);
    assert_true(chi_square(counts, sharp, 4, DRAWS) < 30.0);
    sb_sampler_free(s);
}

/* The draw finds its token through per-block sums: the same four
 * probabilities spread over blocks far apart, every other token banned. */
static void test_draws_follow_softmax_across_blocks(void **state) {
    (void)state;
    enum { N = 300, DRAWS = 40000 };
    static const int ids[4] = {5, 70, 140, 299};
    float logits[N];
    for (int i = 0; i < N; i++)
        logits[i] = -INFINITY;
    for (int i = 0; i < 4; i++)
        logits[ids[i]] = (float)log(PROBS4[i]);
    sb_sampler_params p = plain_params();
    p.seed = 99;
    sb_sampler_t *s = make_sampler(&p, N);
    int counts[N], picked[4];
    histogram(s, logits, N, DRAWS, counts);
    for (int i = 0; i < 4; i++)
        picked[i] = counts[ids[i]];
    assert_int_equal(picked[0] + picked[1] + picked[2] + picked[3], DRAWS);
    assert_true(chi_square(picked, PROBS4, 4, DRAWS) < 30.0);
    sb_sampler_free(s);
}

/* Top-k over a vocabulary of many scan blocks, with ties and banned tokens:
 * at a temperature that flattens the survivors, the drawn set is exactly
 * the k best by (logit descending, id ascending), found here by brute force. */
static void test_top_k_large_vocabulary_exact_set(void **state) {
    (void)state;
    enum { N = 5000, K = 40, DRAWS = 8000 };
    static float logits[N];
    static int counts[N], allowed[N];
    noise_logits(logits, N, 4242);
    for (int i = 0; i < N; i += 7)
        logits[i] = logits[i / 2]; /* ties */
    for (int i = 3; i < N; i += 11)
        logits[i] = -INFINITY;
    memset(allowed, 0, sizeof(allowed));
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int i = 0; i < N; i++)
            if (!allowed[i] && logits[i] > -INFINITY && (best < 0 || logits[i] > logits[best]))
                best = i;
        allowed[best] = 1;
    }
    sb_sampler_params p = plain_params();
    p.top_k = K;
    p.temperature = 1000.0f;
    p.seed = 3;
    sb_sampler_t *s = make_sampler(&p, N);
    histogram(s, logits, N, DRAWS, counts);
    assert_drawn_set(counts, allowed, N);
    sb_sampler_free(s);
}

/* ---- penalties --------------------------------------------------------- */

/* Greedy choice among three tokens after accepting `history`. Token 2 is
 * far behind and serves as filler in histories; the cases put a penalised
 * logit just either side of another one. */
static int32_t greedy_after(const sb_sampler_params *base, float l0, float l1, const int32_t *history,
                            int n_history) {
    const float logits[3] = {l0, l1, -10.0f};
    sb_sampler_params p = *base;
    p.temperature = 0.0f;
    sb_sampler_t *s = make_sampler(&p, 3);
    for (int i = 0; i < n_history; i++)
        sb_sampler_accept(s, history[i]);
    int32_t t = sb_sampler_sample(s, logits);
    sb_sampler_free(s);
    return t;
}

static void test_repeat_penalty_divides_positive_multiplies_negative(void **state) {
    (void)state;
    const int32_t once[] = {0}, thrice[] = {0, 0, 0};
    sb_sampler_params p = plain_params();
    /* positive: 2 / 1.5 = 1.33 < 1.5, 2 / 1.25 = 1.6 > 1.5 */
    p.repeat_penalty = 1.5f;
    assert_int_equal(greedy_after(&p, 2.0f, 1.5f, once, 1), 1);
    p.repeat_penalty = 1.25f;
    assert_int_equal(greedy_after(&p, 2.0f, 1.5f, once, 1), 0);
    /* once per distinct token: 2 / 1.25^3 = 1.02 would lose */
    assert_int_equal(greedy_after(&p, 2.0f, 1.5f, thrice, 3), 0);
    /* negative: -1 * 1.5 = -1.5 < -1.4, -1 * 1.25 = -1.25 > -1.4 */
    p.repeat_penalty = 1.5f;
    assert_int_equal(greedy_after(&p, -1.0f, -1.4f, once, 1), 1);
    p.repeat_penalty = 1.25f;
    assert_int_equal(greedy_after(&p, -1.0f, -1.4f, once, 1), 0);
    /* a penalty below 1 rewards repetition: 1 / 0.5 = 2 > 1.5 */
    p.repeat_penalty = 0.5f;
    assert_int_equal(greedy_after(&p, 1.0f, 1.5f, once, 1), 0);
    /* no history, no penalty */
    p.repeat_penalty = 1.5f;
    assert_int_equal(greedy_after(&p, 2.0f, 1.5f, NULL, 0), 0);
}

static void test_frequency_and_presence_penalties(void **state) {
    (void)state;
    const int32_t zero_twice_one_once[] = {0, 1, 0};
    const int32_t zero_twice[] = {0, 2, 0};
    sb_sampler_params p = plain_params();
    /* token 0 seen twice, token 1 once: 3 - 2f vs 1 - f, equal at f = 2 */
    p.frequency_penalty = 1.9f;
    assert_int_equal(greedy_after(&p, 3.0f, 1.0f, zero_twice_one_once, 3), 0);
    p.frequency_penalty = 2.1f;
    assert_int_equal(greedy_after(&p, 3.0f, 1.0f, zero_twice_one_once, 3), 1);
    /* presence counts once per token, so it cannot reorder two seen tokens */
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 10.0f;
    assert_int_equal(greedy_after(&p, 3.0f, 1.0f, zero_twice_one_once, 3), 0);
    /* presence against an unseen token: 3 - pr vs 1 */
    p.presence_penalty = 1.9f;
    assert_int_equal(greedy_after(&p, 3.0f, 1.0f, zero_twice, 3), 0);
    p.presence_penalty = 2.1f;
    assert_int_equal(greedy_after(&p, 3.0f, 1.0f, zero_twice, 3), 1);
    /* both: 3 - 2 * 0.5 - 0.9 = 1.1 > 1; 3 - 2 * 0.5 - 1.1 = 0.9 < 1 */
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.9f;
    assert_int_equal(greedy_after(&p, 3.0f, 1.0f, zero_twice, 3), 0);
    p.presence_penalty = 1.1f;
    assert_int_equal(greedy_after(&p, 3.0f, 1.0f, zero_twice, 3), 1);
    /* repeat penalty first, then frequency: 4 / 2 - 0.6 = 1.4, where the
     * other order would give (4 - 0.6) / 2 = 1.7 */
    const int32_t once[] = {0};
    p = plain_params();
    p.repeat_penalty = 2.0f;
    p.frequency_penalty = 0.6f;
    assert_int_equal(greedy_after(&p, 4.0f, 1.55f, once, 1), 1);
    assert_int_equal(greedy_after(&p, 4.0f, 1.35f, once, 1), 0);
}

static void test_penalty_window_forgets_old_tokens(void **state) {
    (void)state;
    sb_sampler_params p = plain_params();
    p.repeat_penalty = 2.0f; /* penalised token 0 drops to 1, below token 1's 1.5 */
    p.repeat_last_n = 2;
    const int32_t old[] = {0, 2, 2}, recent[] = {2, 0, 2};
    assert_int_equal(greedy_after(&p, 2.0f, 1.5f, old, 3), 0); /* token 0 left the window */
    assert_int_equal(greedy_after(&p, 2.0f, 1.5f, recent, 3), 1);
    p.repeat_last_n = 1;
    assert_int_equal(greedy_after(&p, 2.0f, 1.5f, recent, 3), 0);
    p.repeat_last_n = 0;
    assert_int_equal(greedy_after(&p, 2.0f, 1.5f, recent, 3), 0); /* window off */
    /* out-of-vocabulary ids are ignored and take no slot in the window */
    p.repeat_last_n = 1;
    const int32_t bogus[] = {0, -1, 3, 1000};
    assert_int_equal(greedy_after(&p, 2.0f, 1.5f, bogus, 4), 1);
}

static void test_logits_are_not_modified(void **state) {
    (void)state;
    enum { N = 64 };
    float logits[N], copy[N];
    noise_logits(logits, N, 99);
    logits[3] = NAN;
    logits[5] = INFINITY;
    memcpy(copy, logits, sizeof(logits));
    sb_sampler_params p = sb_sampler_default_params();
    p.repeat_penalty = 1.3f;
    p.frequency_penalty = 0.5f;
    sb_sampler_t *s = make_sampler(&p, N);
    for (int32_t i = 0; i < 10; i++)
        sb_sampler_accept(s, i);
    sb_sampler_sample(s, logits);
    assert_memory_equal(logits, copy, sizeof(logits));
    sb_sampler_free(s);
}

/* ---- seeds ------------------------------------------------------------- */

static void sample_sequence(uint64_t seed, int32_t *out, int n) {
    enum { N = 500 };
    float logits[N];
    sb_sampler_params p = sb_sampler_default_params();
    p.temperature = 1.5f; /* a wide distribution, so seeds matter */
    p.seed = seed;
    sb_sampler_t *s = make_sampler(&p, N);
    for (int i = 0; i < n; i++) {
        noise_logits(logits, N, (uint32_t)i);
        out[i] = sb_sampler_sample(s, logits);
        sb_sampler_accept(s, out[i]);
    }
    sb_sampler_free(s);
}

static void test_same_seed_same_tokens(void **state) {
    (void)state;
    enum { LEN = 200 };
    int32_t a[LEN], b[LEN], c[LEN];
    sample_sequence(0, a, LEN);
    sample_sequence(0, b, LEN);
    assert_memory_equal(a, b, sizeof(a));
    sample_sequence(1, c, LEN);
    assert_true(memcmp(a, c, sizeof(a)) != 0);
    sample_sequence(42, b, LEN);
    assert_true(memcmp(a, b, sizeof(a)) != 0 && memcmp(b, c, sizeof(b)) != 0);
}

/* Equal logits make every weight exactly 1, so the draw is floor(u * n) with
 * no float rounding: this pins the generator and its seeding, which must
 * give these ids on every platform. */
static void test_known_sequence(void **state) {
    (void)state;
    enum { N = 1000 };
    static float logits[N];
    sb_sampler_params p = plain_params();
    p.seed = 42;
    sb_sampler_t *s = make_sampler(&p, N);
    const int32_t expected[] = {83, 378, 680, 924, 991, 769, 719, 850, 761, 583, 682, 290};
    for (size_t i = 0; i < SB_ARRAY_LEN(expected); i++)
        assert_int_equal(sb_sampler_sample(s, logits), expected[i]);
    sb_sampler_free(s);
}

/* ---- bad logits -------------------------------------------------------- */

static void test_nan_and_inf_logits(void **state) {
    (void)state;
    const float with_nan[5] = {NAN, 1.0f, NAN, 0.5f, -INFINITY};
    int counts[5];
    sb_sampler_params p = plain_params();
    sb_sampler_t *s = make_sampler(&p, 5);
    histogram(s, with_nan, 5, 2000, counts);
    assert_drawn_set(counts, (const int[]){0, 1, 0, 1, 0}, 5);

    /* +inf wins outright; two of them share the draw */
    const float with_inf[5] = {0.0f, INFINITY, 100.0f, NAN, -1.0f};
    histogram(s, with_inf, 5, 500, counts);
    assert_drawn_set(counts, (const int[]){0, 1, 0, 0, 0}, 5);
    const float two_inf[5] = {INFINITY, 0.0f, INFINITY, NAN, 3.0f};
    histogram(s, two_inf, 5, 500, counts);
    assert_drawn_set(counts, (const int[]){1, 0, 1, 0, 0}, 5);

    /* all banned: a valid id, deterministically the lowest */
    const float none[5] = {NAN, -INFINITY, NAN, NAN, -INFINITY};
    assert_int_equal(sb_sampler_sample(s, none), 0);
    sb_sampler_free(s);

    /* the same through the filters and through greedy */
    sb_sampler_params filtered = sb_sampler_default_params();
    s = make_sampler(&filtered, 5);
    histogram(s, two_inf, 5, 500, counts);
    assert_drawn_set(counts, (const int[]){1, 0, 1, 0, 0}, 5);
    assert_int_equal(sb_sampler_sample(s, none), 0);
    sb_sampler_free(s);
    p.temperature = 0.0f;
    s = make_sampler(&p, 5);
    assert_int_equal(sb_sampler_sample(s, with_nan), 1);
    assert_int_equal(sb_sampler_sample(s, two_inf), 0);
    assert_int_equal(sb_sampler_sample(s, none), 0);
    sb_sampler_free(s);

    /* a penalty pushing +inf further (x / 0.5) still leaves a clean winner */
    p = plain_params();
    p.repeat_penalty = 0.5f;
    s = make_sampler(&p, 5);
    sb_sampler_accept(s, 1);
    histogram(s, with_inf, 5, 200, counts);
    assert_drawn_set(counts, (const int[]){0, 1, 0, 0, 0}, 5);
    sb_sampler_free(s);

    /* the same where the vector loops reach them (above, 5 tokens take the
     * scalar tail alone): two +inf among NaN and finite logits at 40.. */
    enum { WIDE = 100 };
    float wide[WIDE];
    int wide_counts[WIDE], wide_allowed[WIDE] = {0};
    for (int i = 0; i < WIDE; i++)
        wide[i] = i % 7 == 0 ? NAN : (float)(i % 5);
    memcpy(wide + 40, two_inf, sizeof(two_inf));
    wide_allowed[40] = wide_allowed[42] = 1;
    p = plain_params();
    s = make_sampler(&p, WIDE);
    histogram(s, wide, WIDE, 500, wide_counts);
    assert_drawn_set(wide_counts, wide_allowed, WIDE);
    sb_sampler_free(s);
    p.temperature = 0.0f;
    s = make_sampler(&p, WIDE);
    assert_int_equal(sb_sampler_sample(s, wide), 40);
    sb_sampler_free(s);
}

/* ---- parameters and memory --------------------------------------------- */

static void test_parameter_validation(void **state) {
    (void)state;
    const struct {
        const char *field;
        float value;
        const char *message;
    } cases[] = {
        {"temperature", -0.1f, "temperature must be finite and >= 0"},
        {"temperature", NAN, "temperature"},
        {"temperature", INFINITY, "temperature"},
        {"top_p", 1.5f, "top_p must be in (0, 1], got 1.5"},
        {"top_p", 0.0f, "top_p must be in (0, 1], got 0"},
        {"top_p", NAN, "top_p"},
        {"min_p", 1.5f, "min_p must be <= 1"},
        {"repeat_penalty", 0.0f, "repeat_penalty must be finite and > 0"},
        {"repeat_penalty", -1.0f, "repeat_penalty"},
        {"repeat_last_n", -1.0f, "repeat_last_n must be >= 0 (0 = off), got -1"},
        {"frequency_penalty", NAN, "frequency_penalty must be finite"},
        {"presence_penalty", -INFINITY, "presence_penalty must be finite"},
    };
    for (size_t i = 0; i < SB_ARRAY_LEN(cases); i++) {
        sb_sampler_params p = sb_sampler_default_params();
        const char *f = cases[i].field;
        float v = cases[i].value;
        if (!strcmp(f, "temperature"))
            p.temperature = v;
        else if (!strcmp(f, "top_p"))
            p.top_p = v;
        else if (!strcmp(f, "min_p"))
            p.min_p = v;
        else if (!strcmp(f, "repeat_penalty"))
            p.repeat_penalty = v;
        else if (!strcmp(f, "repeat_last_n"))
            p.repeat_last_n = (int32_t)v;
        else if (!strcmp(f, "frequency_penalty"))
            p.frequency_penalty = v;
        else
            p.presence_penalty = v;
        sb_sampler_t *s = (sb_sampler_t *)&p; /* must be overwritten with NULL */
        sb_error err = {0};
        assert_int_equal(sb_sampler_create(&p, 10, &s, &err), SB_ERR_INVALID_ARG);
        assert_null(s);
        assert_int_equal(err.status, SB_ERR_INVALID_ARG);
        if (!strstr(err.msg, cases[i].message))
            fail_msg("case %zu: message \"%s\" lacks \"%s\"", i, err.msg, cases[i].message);
    }

    sb_sampler_t *s = NULL;
    sb_error err = {0};
    assert_int_equal(sb_sampler_create(NULL, 0, &s, &err), SB_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "n_vocab must be > 0, got 0"));

    /* boundaries that are valid: off switches, greedy, negatives meaning off */
    sb_sampler_params ok = sb_sampler_default_params();
    ok.temperature = 0.0f;
    ok.top_p = 1.0f;
    ok.min_p = -1.0f;
    ok.top_k = -5;
    ok.repeat_last_n = 0;
    ok.frequency_penalty = -2.0f;
    assert_int_equal(sb_sampler_create(&ok, 1, &s, &err), SB_OK);
    sb_sampler_free(s);
    /* NULL params are the defaults */
    assert_int_equal(sb_sampler_create(NULL, 3, &s, &err), SB_OK);
    sb_sampler_free(s);
}

static void test_no_allocation_while_sampling(void **state) {
    (void)state;
    enum { N = 2000 };
    static float logits[N];
    noise_logits(logits, N, 5);
    sb_test_count_allocs_begin();
    sb_sampler_params p = sb_sampler_default_params();
    p.repeat_penalty = 1.1f;
    sb_sampler_t *s = make_sampler(&p, N);
    size_t live = sb_test_live_bytes();
    for (int i = 0; i < 100; i++)
        sb_sampler_accept(s, sb_sampler_sample(s, logits));
    assert_int_equal(sb_test_live_bytes(), live);
    sb_sampler_free(s);
    assert_int_equal(sb_test_live_bytes(), 0);
    size_t peak = sb_test_count_allocs_end();
    assert_true(peak == live);
}

/* A full vocabulary with every filter off and a flat distribution is the
 * slow path (everything is ranked); it must still be fast. */
static void test_large_vocabulary(void **state) {
    (void)state;
    enum { N = 150000 };
    static float logits[N];
    sb_sampler_params p = plain_params();
    p.top_p = 0.99f;
    sb_sampler_t *s = make_sampler(&p, N);
    for (int i = 0; i < 20; i++) {
        int32_t t = sb_sampler_sample(s, logits);
        assert_true(t >= 0 && t < N);
    }
    sb_sampler_free(s);
}

/* ---- stop strings ------------------------------------------------------ */

/* Output of one stream fed in pieces, concatenated; flushes unless stopped. */
typedef struct {
    char text[512];
    size_t len;
    bool stopped;
} stream_result;

static stream_result run_stream(sb_stop_t *m, const char *const *pieces, size_t n_pieces) {
    stream_result r = {0};
    char out[256];
    for (size_t i = 0; i < n_pieces; i++) {
        size_t len = strlen(pieces[i]);
        assert_true(len + sb_stop_max_len(m) + 1 <= sizeof(out));
        bool stopped = false;
        size_t n = sb_stop_push(m, pieces[i], len, out, sizeof(out), &stopped);
        assert_int_equal(strlen(out), n);
        memcpy(r.text + r.len, out, n);
        r.len += n;
        r.stopped = stopped;
    }
    if (!r.stopped) {
        size_t n = sb_stop_flush(m, out, sizeof(out));
        memcpy(r.text + r.len, out, n);
        r.len += n;
    }
    r.text[r.len] = '\0';
    return r;
}

static sb_stop_t *make_stop(const char *const *stops, size_t n) {
    sb_stop_t *m = NULL;
    sb_error err = {0};
    if (sb_stop_create(stops, n, &m, &err) != SB_OK)
        fail_msg("sb_stop_create: %s", err.msg);
    return m;
}

static void test_stop_no_strings_passes_through(void **state) {
    (void)state;
    sb_stop_t *m = make_stop(NULL, 0);
    assert_int_equal(sb_stop_max_len(m), 0);
    stream_result r = run_stream(m, (const char *[]){"Hello", ", ", "world"}, 3);
    assert_string_equal(r.text, "Hello, world");
    assert_false(r.stopped);
    sb_stop_free(m);
}

static void test_stop_match_in_one_push_and_across_pushes(void **state) {
    (void)state;
    const char *stops[] = {"STOP"};
    sb_stop_t *m = make_stop(stops, 1);
    char out[64];
    bool stopped = false;
    size_t n = sb_stop_push(m, "Hello STOP world", 16, out, sizeof(out), &stopped);
    assert_true(stopped);
    assert_int_equal(n, 6);
    assert_string_equal(out, "Hello ");
    /* later pushes are discarded and flush has nothing */
    assert_int_equal(sb_stop_push(m, "more", 4, out, sizeof(out), &stopped), 0);
    assert_true(stopped);
    assert_int_equal(sb_stop_flush(m, out, sizeof(out)), 0);

    /* after flush the matcher starts a new stream */
    n = sb_stop_push(m, "Hel", 3, out, sizeof(out), &stopped);
    assert_false(stopped);
    assert_string_equal(out, "Hel");
    n = sb_stop_push(m, "lo ST", 5, out, sizeof(out), &stopped);
    assert_false(stopped);
    assert_string_equal(out, "lo "); /* "ST" held back */
    n = sb_stop_push(m, "O", 1, out, sizeof(out), &stopped);
    assert_int_equal(n, 0);
    n = sb_stop_push(m, "P and more", 10, out, sizeof(out), &stopped);
    assert_true(stopped);
    assert_int_equal(n, 0);
    sb_stop_free(m);
}

static void test_stop_holdback_released(void **state) {
    (void)state;
    const char *stops[] = {"STOP"};
    sb_stop_t *m = make_stop(stops, 1);
    char out[64];
    bool stopped = true;
    assert_int_equal(sb_stop_push(m, "ST", 2, out, sizeof(out), &stopped), 0);
    assert_false(stopped);
    assert_int_equal(sb_stop_push(m, "AR", 2, out, sizeof(out), &stopped), 4);
    assert_string_equal(out, "STAR");
    /* a tail still matching at the end of the stream is ordinary text */
    assert_int_equal(sb_stop_push(m, "abcSTO", 6, out, sizeof(out), &stopped), 3);
    assert_string_equal(out, "abc");
    assert_int_equal(sb_stop_flush(m, out, sizeof(out)), 3);
    assert_string_equal(out, "STO");
    sb_stop_free(m);

    /* a partial match that fails may contain the start of the next one */
    const char *aab[] = {"aab"};
    m = make_stop(aab, 1);
    assert_int_equal(sb_stop_push(m, "aa", 2, out, sizeof(out), &stopped), 0);
    assert_int_equal(sb_stop_push(m, "a", 1, out, sizeof(out), &stopped), 1);
    assert_string_equal(out, "a");
    assert_int_equal(sb_stop_push(m, "b", 1, out, sizeof(out), &stopped), 0);
    assert_true(stopped);
    sb_stop_free(m);
}

static void test_stop_multiple_strings(void **state) {
    (void)state;
    const char *stops[] = {"</s>", "\nUser:", "###"};
    sb_stop_t *m = make_stop(stops, 3);
    assert_int_equal(sb_stop_max_len(m), 6);
    stream_result r = run_stream(m, (const char *[]){"Sure.", "\nUs", "ually ", "#", "## x"}, 5);
    assert_string_equal(r.text, "Sure.\nUsually ");
    assert_true(r.stopped);
    sb_stop_flush(m, NULL, 0);
    r = run_stream(m, (const char *[]){"a <", "/s", "> b"}, 3);
    assert_string_equal(r.text, "a ");
    assert_true(r.stopped);
    sb_stop_flush(m, NULL, 0);
    r = run_stream(m, (const char *[]){"no stop <here> ##"}, 1);
    assert_string_equal(r.text, "no stop <here> ##");
    assert_false(r.stopped);
    sb_stop_free(m);
}

static void test_stop_overlapping_prefixes(void **state) {
    (void)state;
    /* "ab" completes before "abc" can, so it stops first, however the text is split */
    const char *ab_abc[] = {"abc", "ab"};
    sb_stop_t *m = make_stop(ab_abc, 2);
    stream_result r = run_stream(m, (const char *[]){"xa", "bc"}, 2);
    assert_string_equal(r.text, "x");
    assert_true(r.stopped);
    sb_stop_free(m);

    /* completing on the same byte: the earlier start wins, so nothing of it leaks */
    const char *orders[2][2] = {{"bc", "abc"}, {"abc", "bc"}};
    for (int order = 0; order < 2; order++) {
        m = make_stop(orders[order], 2);
        r = run_stream(m, (const char *[]){"xxabc"}, 1);
        assert_string_equal(r.text, "xx");
        sb_stop_free(m);
    }

    /* "bc" completes before "abcd" would: stop after "a", one push or many */
    const char *abcd_bc[] = {"abcd", "bc"};
    const char *text = "zabcd";
    for (size_t piece = 1; piece <= 5; piece++) {
        m = make_stop(abcd_bc, 2);
        char pieces[5][6];
        const char *ptrs[5];
        size_t n = 0;
        for (size_t at = 0; at < 5; at += piece, n++) {
            snprintf(pieces[n], sizeof(pieces[n]), "%.*s", (int)piece, text + at);
            ptrs[n] = pieces[n];
        }
        r = run_stream(m, ptrs, n);
        assert_string_equal(r.text, "za");
        assert_true(r.stopped);
        sb_stop_free(m);
    }
}

static void test_stop_create_errors(void **state) {
    (void)state;
    sb_stop_t *m = (sb_stop_t *)&m;
    sb_error err = {0};
    const char *empty[] = {"ok", ""};
    assert_int_equal(sb_stop_create(empty, 2, &m, &err), SB_ERR_INVALID_ARG);
    assert_null(m);
    assert_non_null(strstr(err.msg, "string 1 of 2 is empty"));
    const char *null[] = {NULL};
    assert_int_equal(sb_stop_create(null, 1, &m, &err), SB_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "string 0 of 1 is NULL"));

    /* strings are copied */
    char buf[8] = "END";
    const char *stops[] = {buf};
    sb_test_count_allocs_begin();
    assert_int_equal(sb_stop_create(stops, 1, &m, &err), SB_OK);
    strcpy(buf, "xyz");
    char out[16];
    bool stopped = false;
    sb_stop_push(m, "xyzEND", 6, out, sizeof(out), &stopped);
    assert_true(stopped);
    assert_string_equal(out, "xyz");
    sb_stop_free(m);
    assert_int_equal(sb_test_live_bytes(), 0);
    sb_test_count_allocs_end();
}

static void test_stop_small_cap_truncates_safely(void **state) {
    (void)state;
    const char *stops[] = {"STOP"};
    sb_stop_t *m = make_stop(stops, 1);
    char out[4] = {'x', 'x', 'x', 'x'};
    bool stopped = false;
    assert_int_equal(sb_stop_push(m, "abcdefST", 8, out, sizeof(out), &stopped), 3);
    assert_string_equal(out, "abc");
    assert_int_equal(sb_stop_push(m, "x", 1, NULL, 0, &stopped), 0);
    sb_stop_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_picks_argmax_lowest_id_on_ties),
        cmocka_unit_test(test_top_k_1_equals_greedy),
        cmocka_unit_test(test_top_k_keeps_k_best),
        cmocka_unit_test(test_top_p_cuts_at_cumulative_mass),
        cmocka_unit_test(test_top_p_is_relative_to_top_k),
        cmocka_unit_test(test_min_p_cuts_relative_to_best),
        cmocka_unit_test(test_top_p_and_min_p_keep_the_shorter_cut),
        cmocka_unit_test(test_top_k_paths_agree),
        cmocka_unit_test(test_draws_follow_softmax),
        cmocka_unit_test(test_draws_follow_softmax_across_blocks),
        cmocka_unit_test(test_top_k_large_vocabulary_exact_set),
        cmocka_unit_test(test_repeat_penalty_divides_positive_multiplies_negative),
        cmocka_unit_test(test_frequency_and_presence_penalties),
        cmocka_unit_test(test_penalty_window_forgets_old_tokens),
        cmocka_unit_test(test_logits_are_not_modified),
        cmocka_unit_test(test_same_seed_same_tokens),
        cmocka_unit_test(test_known_sequence),
        cmocka_unit_test(test_nan_and_inf_logits),
        cmocka_unit_test(test_parameter_validation),
        cmocka_unit_test(test_no_allocation_while_sampling),
        cmocka_unit_test(test_large_vocabulary),
        cmocka_unit_test(test_stop_no_strings_passes_through),
        cmocka_unit_test(test_stop_match_in_one_push_and_across_pushes),
        cmocka_unit_test(test_stop_holdback_released),
        cmocka_unit_test(test_stop_multiple_strings),
        cmocka_unit_test(test_stop_overlapping_prefixes),
        cmocka_unit_test(test_stop_create_errors),
        cmocka_unit_test(test_stop_small_cap_truncates_safely),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
