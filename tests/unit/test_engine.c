/*
 * test_engine.c - the continuous-batching engine on stories260K: requests
 * run together give exactly the tokens they give alone (batch invariance),
 * shared prefixes are computed once, a cache too small for everyone
 * preempts and resumes without changing any output, cancellation and a
 * full queue behave, embeddings are unit vectors. Batch invariance also
 * with F16 and Q8_0 KV caches (Q8_0 on a generated model whose heads hold
 * 32 values: stories260K's hold 8, which a Q8_0 cache refuses).
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/engine.h"
#include "model/synth.h"
#include "testutil.h"

#define MAX_GEN 64

typedef struct result {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    sb_finish finish;
    int32_t tokens[MAX_GEN];
    int32_t n;
    char text[4096];
    size_t text_len;
    int32_t n_cached;
    float embd[512];
    int32_t n_embd;
} result;

static void on_event(void *user, const sb_gen_event *ev) {
    result *r = user;
    pthread_mutex_lock(&r->lock);
    if (ev->text_len && r->text_len + ev->text_len < sizeof(r->text)) {
        memcpy(r->text + r->text_len, ev->text, ev->text_len);
        r->text_len += ev->text_len;
    }
    if (ev->kind == SB_GEN_TOKEN && r->n < MAX_GEN)
        r->tokens[r->n++] = ev->token;
    if (ev->kind == SB_GEN_DONE) {
        r->done = true;
        r->finish = ev->finish;
        r->n_cached = ev->n_prompt_cached;
        if (ev->embedding) {
            r->n_embd = ev->n_embd;
            memcpy(r->embd, ev->embedding, (size_t)ev->n_embd * sizeof(float));
        }
        pthread_cond_signal(&r->cond);
    }
    pthread_mutex_unlock(&r->lock);
}

static void result_init(result *r) {
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->cond, NULL);
}

static void result_wait(result *r) {
    pthread_mutex_lock(&r->lock);
    while (!r->done)
        pthread_cond_wait(&r->cond, &r->lock);
    pthread_mutex_unlock(&r->lock);
}

static sb_model_t *model, *wide_heads;

static int setup(void **state) {
    (void)state;
    sb_synth_params sp = sb_synth_default_params();
    sp.heads = 2; /* 32 values per head */
    sp.kv_heads = 1;
    char path[300];
    snprintf(path, sizeof(path), "%s/wide-heads.gguf", sb_test_tmpdir());
    return sb_model_load(sb_test_fixture("models/stories260K.gguf"), &model, NULL) == SB_OK &&
                   sb_synth_write(&sp, path, NULL) == SB_OK && sb_model_load(path, &wide_heads, NULL) == SB_OK
               ? 0
               : -1;
}

static int teardown(void **state) {
    (void)state;
    sb_model_free(model);
    sb_model_free(wide_heads);
    return 0;
}

/* Prompt i: BOS then a prefix of a fixed token walk, of varying length. */
static int32_t make_prompt(int i, int32_t *out) {
    int32_t n = 1 + (i * 7) % 40;
    out[0] = 1;
    for (int32_t t = 1; t < n; t++)
        out[t] = 259 + (t * 31 + i * 3) % 250;
    return n;
}

static sb_gen_params greedy(const int32_t *prompt, int32_t n, int32_t max_tokens) {
    sb_gen_params p = {.prompt = prompt, .n_prompt = n, .max_tokens = max_tokens,
                       .sampling = sb_sampler_default_params()};
    p.sampling.temperature = 0;
    return p;
}

static void run_all(const sb_model_t *m, const sb_engine_params *ep, int n_req, result *results,
                    sb_engine_stats *stats) {
    sb_engine *e;
    assert_int_equal(sb_engine_create(m, ep, &e, NULL), SB_OK);
    int32_t prompts[16][64];
    for (int i = 0; i < n_req; i++) {
        int32_t n = make_prompt(i, prompts[i]);
        sb_gen_params p = greedy(prompts[i], n, 40);
        result_init(&results[i]);
        sb_error err;
        if (sb_engine_submit(e, &p, on_event, &results[i], NULL, &err) != SB_OK)
            fail_msg("submit: %s", err.msg);
    }
    for (int i = 0; i < n_req; i++)
        result_wait(&results[i]);
    if (stats)
        sb_engine_get_stats(e, stats);
    sb_engine_free(e);
}

/* Each request's greedy tokens are the same alone, batched with 15 others,
 * and batched into a cache too small for all of them (preempted, resumed). */
static void batched_equals_alone(const sb_model_t *m, sb_cache_type cache_type) {
    enum { N = 16 };
    static result alone[N], together[N], squeezed[N];
    sb_engine_params ep = sb_engine_default_params();
    ep.cache_type = cache_type;
    ep.n_ctx = 512;
    ep.n_threads = 2;
    ep.n_parallel = 1;
    for (int i = 0; i < N; i++) { /* one at a time: nothing else in the batch */
        sb_engine *e;
        assert_int_equal(sb_engine_create(m, &ep, &e, NULL), SB_OK);
        int32_t prompt[64];
        int32_t n = make_prompt(i, prompt);
        sb_gen_params p = greedy(prompt, n, 40);
        result_init(&alone[i]);
        assert_int_equal(sb_engine_submit(e, &p, on_event, &alone[i], NULL, NULL), SB_OK);
        result_wait(&alone[i]);
        sb_engine_free(e);
    }
    ep.n_parallel = 16;
    ep.max_batch_tokens = 64; /* prompts get chunked and mixed with decoding */
    run_all(m, &ep, N, together, NULL);
    ep.n_ctx = 128; /* 16 sequences of up to 80 positions cannot all fit */
    sb_engine_stats st;
    run_all(m, &ep, N, squeezed, &st);
    fprintf(stderr, "squeezed run: %llu preemptions, %llu steps\n", (unsigned long long)st.preemptions,
            (unsigned long long)st.steps);
    assert_true(st.preemptions > 0);
    for (int i = 0; i < N; i++) {
        assert_true(alone[i].n > 0);
        assert_int_equal(alone[i].n, together[i].n);
        assert_memory_equal(alone[i].tokens, together[i].tokens, (size_t)alone[i].n * sizeof(int32_t));
        assert_int_equal(alone[i].n, squeezed[i].n);
        assert_memory_equal(alone[i].tokens, squeezed[i].tokens, (size_t)alone[i].n * sizeof(int32_t));
        assert_int_equal(alone[i].text_len, together[i].text_len);
    }
}

static void test_batched_equals_alone(void **state) {
    (void)state;
    batched_equals_alone(model, SB_CACHE_F32);
    batched_equals_alone(model, SB_CACHE_F16);
    batched_equals_alone(wide_heads, SB_CACHE_Q8_0);
    /* Heads of 8 values do not fill a Q8_0 block: a clear refusal. */
    sb_engine_params ep = sb_engine_default_params();
    ep.cache_type = SB_CACHE_Q8_0;
    sb_engine *e = NULL;
    sb_error err;
    assert_int_equal(sb_engine_create(model, &ep, &e, &err), SB_ERR_INVALID_ARG);
    assert_null(e);
    assert_non_null(strstr(err.msg, "multiple of 32"));
}

static void test_prefix_computed_once(void **state) {
    (void)state;
    sb_engine_params ep = sb_engine_default_params();
    ep.n_ctx = 512;
    ep.n_threads = 1;
    sb_engine *e;
    assert_int_equal(sb_engine_create(model, &ep, &e, NULL), SB_OK);
    int32_t prompt[100];
    prompt[0] = 1;
    for (int t = 1; t < 100; t++)
        prompt[t] = 259 + (t * 13) % 250;
    static result r[4];
    for (int i = 0; i < 4; i++) {
        prompt[99] = 300 + i; /* same 99-token prefix, different last token */
        sb_gen_params p = greedy(prompt, 100, 4);
        result_init(&r[i]);
        assert_int_equal(sb_engine_submit(e, &p, on_event, &r[i], NULL, NULL), SB_OK);
        result_wait(&r[i]);
    }
    sb_engine_stats st;
    sb_engine_get_stats(e, &st);
    fprintf(stderr, "prefix: computed %llu prompt tokens, reused %llu\n",
            (unsigned long long)st.prompt_tokens_computed, (unsigned long long)st.prompt_tokens_cached);
    assert_int_equal(r[0].n_cached, 0);
    for (int i = 1; i < 4; i++)
        assert_int_equal(r[i].n_cached, 96); /* six whole 16-token blocks */
    assert_int_equal(st.prompt_tokens_computed, 100 + 3 * 4);
    sb_engine_free(e);
}

static void test_cancel_and_queue_full(void **state) {
    (void)state;
    sb_engine_params ep = sb_engine_default_params();
    ep.n_ctx = 512;
    ep.n_parallel = 1;
    ep.max_queue = 2;
    ep.n_threads = 1;
    sb_engine *e;
    assert_int_equal(sb_engine_create(model, &ep, &e, NULL), SB_OK);
    int32_t prompt[1] = {1};
    static result r[3];
    uint64_t ids[3];
    sb_gen_params p = greedy(prompt, 1, 0); /* until the context is full */
    p.ignore_eos = true;
    for (int i = 0; i < 2; i++) {
        result_init(&r[i]);
        assert_int_equal(sb_engine_submit(e, &p, on_event, &r[i], &ids[i], NULL), SB_OK);
    }
    sb_error err;
    result_init(&r[2]);
    sb_status st = sb_engine_submit(e, &p, on_event, &r[2], &ids[2], &err);
    /* The first may already run, leaving room for the third. */
    if (st == SB_OK)
        sb_engine_cancel(e, ids[2]);
    else
        assert_int_equal(st, SB_ERR_BUSY);
    sb_engine_cancel(e, ids[0]);
    sb_engine_cancel(e, ids[1]);
    result_wait(&r[0]);
    result_wait(&r[1]);
    assert_int_equal(r[0].finish, SB_FINISH_CANCELLED);
    assert_int_equal(r[1].finish, SB_FINISH_CANCELLED);
    int32_t bad[2] = {1, 99999};
    sb_gen_params pb = greedy(bad, 2, 4);
    assert_int_equal(sb_engine_submit(e, &pb, on_event, &r[0], NULL, &err), SB_ERR_INVALID_ARG);
    sb_engine_free(e); /* with the third (if any) still queued: it ends cancelled */
}

static void test_embedding_unit_norm(void **state) {
    (void)state;
    sb_engine *e;
    sb_engine_params ep = sb_engine_default_params();
    ep.n_ctx = 256;
    assert_int_equal(sb_engine_create(model, &ep, &e, NULL), SB_OK);
    int32_t prompt[5] = {1, 403, 407, 261, 378};
    sb_gen_params p = {.prompt = prompt, .n_prompt = 5, .embedding = true, .sampling = sb_sampler_default_params()};
    static result r;
    result_init(&r);
    assert_int_equal(sb_engine_submit(e, &p, on_event, &r, NULL, NULL), SB_OK);
    result_wait(&r);
    assert_int_equal(r.n_embd, 64);
    double norm = 0;
    for (int i = 0; i < 64; i++)
        norm += (double)r.embd[i] * r.embd[i];
    assert_true(fabs(norm - 1.0) < 1e-5);
    sb_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_equals_alone),
        cmocka_unit_test(test_prefix_computed_once),
        cmocka_unit_test(test_cancel_and_queue_full),
        cmocka_unit_test(test_embedding_unit_norm),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
