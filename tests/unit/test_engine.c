/*
 * test_engine.c - the continuous-batching engine on stories260K: requests
 * run together give exactly the tokens they give alone (batch invariance),
 * shared prefixes are computed once, a cache too small for everyone
 * preempts and resumes without changing any output, cancellation and a
 * full queue behave, embeddings are unit vectors. Batch invariance also
 * with F16 and Q8_0 KV caches (Q8_0 on a generated model whose heads hold
 * 32 values: stories260K's hold 8, which a Q8_0 cache refuses).
 *
 * The executor under several engines: two models' requests at once give
 * what each gives alone, and the busy engines alternate step by step, or,
 * as many as the executor has threads, run side by side, one thread each; a
 * high-priority request preempts low ones, which finish unchanged; an
 * engine freed while another runs; no more threads than n_threads; an
 * engine's memory as its allocations measure it.
 */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "engine/engine.h"
#include "model/synth.h"
#include "testutil.h"

#define MAX_GEN 64

typedef struct result {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int tag;              /* > 0: its events go to the engine log under this tag */
    int submitted_at, first_at, done_at; /* when it was submitted, its first token and its end came, on event_clock */
    struct result *watch;  /* another request: its token count at this one's first token and end */
    int watch_first, watch_done;
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

/* Every request's events in arrival order: a clock, and the tags of tagged
 * requests' tokens (which engine was stepped, step after step) with the
 * threads their callbacks ran on. */
static atomic_int event_clock;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static int event_log[4096], n_event_log;
static pthread_t event_thread[4096]; /* the thread each logged token's callback ran on */

static void on_event(void *user, const sb_gen_event *ev) {
    result *r = user;
    int now = atomic_fetch_add(&event_clock, 1) + 1;
    int watched = 0; /* a watched request has no watch of its own: the locks never nest the other way */
    if (r->watch) {
        pthread_mutex_lock(&r->watch->lock);
        watched = r->watch->n;
        pthread_mutex_unlock(&r->watch->lock);
    }
    if (r->tag > 0 && ev->kind == SB_GEN_TOKEN) {
        pthread_mutex_lock(&log_lock);
        if (n_event_log < (int)SB_ARRAY_LEN(event_log)) {
            event_thread[n_event_log] = pthread_self();
            event_log[n_event_log++] = r->tag;
        }
        pthread_mutex_unlock(&log_lock);
    }
    pthread_mutex_lock(&r->lock);
    if (ev->kind == SB_GEN_TOKEN && r->n == 0) {
        r->first_at = now;
        r->watch_first = watched;
    }
    if (ev->kind == SB_GEN_DONE) {
        r->done_at = now;
        r->watch_done = watched;
    }
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

static sb_model_t *model, *wide_heads, *other;
static sb_executor *exec; /* the one every test's engines share, unless it makes its own */

static int setup(void **state) {
    (void)state;
    sb_synth_params sp = sb_synth_default_params();
    sp.heads = 2; /* 32 values per head */
    sp.kv_heads = 1;
    sb_synth_params op = sb_synth_default_params(); /* a second generated model, unlike the first */
    op.seed = 7;
    op.layers = 3;
    char path[300], other_path[300];
    snprintf(path, sizeof(path), "%s/wide-heads.gguf", sb_test_tmpdir());
    snprintf(other_path, sizeof(other_path), "%s/other.gguf", sb_test_tmpdir());
    sb_executor_params xp = {.n_threads = 2};
    return sb_model_load(sb_test_fixture("models/stories260K.gguf"), &model, NULL) == SB_OK &&
                   sb_synth_write(&sp, path, NULL) == SB_OK && sb_model_load(path, &wide_heads, NULL) == SB_OK &&
                   sb_synth_write(&op, other_path, NULL) == SB_OK &&
                   sb_model_load(other_path, &other, NULL) == SB_OK && sb_executor_create(&xp, &exec, NULL) == SB_OK
               ? 0
               : -1;
}

static int teardown(void **state) {
    (void)state;
    sb_executor_free(exec);
    sb_model_free(model);
    sb_model_free(wide_heads);
    sb_model_free(other);
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

/* Request i with nothing else in the batch: an engine of its own. */
static void run_alone(const sb_model_t *m, const sb_engine_params *ep, int i, sb_gen_params p, result *r) {
    sb_engine_params one = *ep;
    one.n_parallel = 1;
    sb_engine *e;
    assert_int_equal(sb_engine_create(m, &one, exec, &e, NULL), SB_OK);
    int32_t prompt[64];
    p.prompt = prompt;
    p.n_prompt = make_prompt(i, prompt);
    result_init(r);
    assert_int_equal(sb_engine_submit(e, &p, on_event, r, NULL, NULL), SB_OK);
    result_wait(r);
    sb_engine_free(e);
}

static void assert_same_tokens(const result *a, const result *b) {
    assert_true(a->n > 0);
    assert_int_equal(a->n, b->n);
    assert_memory_equal(a->tokens, b->tokens, (size_t)a->n * sizeof(int32_t));
}

/* With prof: the engine's profile of its decoding steps of n_req tokens. */
static void run_all(const sb_model_t *m, const sb_engine_params *ep, int n_req, result *results,
                    sb_engine_stats *stats, sb_step_profile *prof) {
    sb_engine *e;
    assert_int_equal(sb_engine_create(m, ep, exec, &e, NULL), SB_OK);
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
    for (int n = 1; prof && n <= n_req; n++) /* prof[n - 1]: the steps of n tokens */
        assert_true(sb_engine_get_profile(e, n, &prof[n - 1]));
    sb_engine_free(e);
}

/* Each request's greedy tokens are the same alone, batched with 15 others
 * (decoding steps split by rows, as lanes, or as the engine measures), and
 * batched into a cache too small for all of them (preempted, resumed). */
static void batched_equals_alone(const sb_model_t *m, sb_cache_type cache_type) {
    enum { N = 16 };
    static result alone[N], together[N], squeezed[N];
    sb_engine_params ep = sb_engine_default_params();
    ep.cache_type = cache_type;
    ep.n_ctx = 512;
    for (int i = 0; i < N; i++)
        run_alone(m, &ep, i, greedy(NULL, 0, 40), &alone[i]);
    ep.n_parallel = 16;
    ep.max_batch_tokens = 64; /* prompts get chunked and mixed with decoding */
    for (int split = SB_SPLIT_ROWS; split <= SB_SPLIT_LANES; split++) {
        ep.split = (sb_split_mode)split;
        run_all(m, &ep, N, together, NULL, NULL);
        for (int i = 0; i < N; i++)
            assert_same_tokens(&alone[i], &together[i]);
    }
    ep.split = SB_SPLIT_AUTO;
    run_all(m, &ep, N, together, NULL, NULL);
    ep.n_ctx = 128; /* 16 sequences of up to 80 positions cannot all fit */
    sb_engine_stats st;
    run_all(m, &ep, N, squeezed, &st, NULL);
    fprintf(stderr, "squeezed run: %llu preemptions, %llu steps\n", (unsigned long long)st.preemptions,
            (unsigned long long)st.steps);
    assert_true(st.preemptions > 0);
    for (int i = 0; i < N; i++) {
        assert_same_tokens(&alone[i], &together[i]);
        assert_same_tokens(&alone[i], &squeezed[i]);
        assert_int_equal(alone[i].text_len, together[i].text_len);
    }
}

/* A profile's parts lie within its whole. */
static void assert_parts_within(const sb_step_profile *p) {
    double parts = 0;
    for (int i = 0; i < SB_FWD_N_PARTS; i++) {
        assert_true(p->fwd.part_s[i] >= 0);
        parts += p->fwd.part_s[i];
    }
    assert_true(p->fwd.part_s[SB_FWD_PRODUCTS] > 0 && p->fwd.part_s[SB_FWD_HEAD] > 0);
    assert_true(parts <= p->forward_s * 1.0001 + 1e-6);
    assert_true(p->plan_s + p->forward_s + p->sample_s + p->report_s <= p->step_s * 1.0001 + 1e-6);
}

/* A profiled engine generates the same tokens (its products run one matrix
 * per parallel loop, each (row, token) result computed as before) and
 * accounts for every decoding step, its parts within its whole. */
static void test_profile_of_decoding_steps(void **state) {
    (void)state;
    enum { N = 4 };
    static result plain[N], profiled[N];
    sb_engine_params ep = sb_engine_default_params();
    ep.n_ctx = 512;
    run_all(model, &ep, N, plain, NULL, NULL);
    for (int clock = SB_PROFILE_WALL; clock <= SB_PROFILE_THREAD_CPU; clock++) {
        ep.profile = (sb_profile_clock)clock;
        sb_step_profile p[N];
        run_all(model, &ep, N, profiled, NULL, p);
        uint64_t decoded = 0, counted = 0;
        for (int i = 0; i < N; i++) {
            assert_same_tokens(&plain[i], &profiled[i]);
            decoded += (uint64_t)profiled[i].n - 1; /* each one's first token comes with its prompt */
        }
        for (int n = 1; n <= N; n++) {
            counted += (uint64_t)n * p[n - 1].steps;
            if (p[n - 1].steps > 0)
                assert_parts_within(&p[n - 1]);
        }
        /* Every decoded token is in a counted step, except those that shared
         * a step with a later request's prompt: at most N - 1 such steps of
         * at most N - 1 tokens, however the submissions meet the steps (on
         * a busy machine the test thread can be late with the last ones). */
        assert_true(counted <= decoded && counted + (N - 1) * (N - 1) >= decoded);
    }
    sb_engine *e;
    sb_step_profile p;
    ep.profile = SB_PROFILE_OFF;
    assert_int_equal(sb_engine_create(model, &ep, exec, &e, NULL), SB_OK);
    assert_false(sb_engine_get_profile(e, 1, &p));
    assert_int_equal(p.steps, 0);
    sb_engine_free(e);
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
    assert_int_equal(sb_engine_create(model, &ep, exec, &e, &err), SB_ERR_INVALID_ARG);
    assert_null(e);
    assert_non_null(strstr(err.msg, "multiple of 32"));
    ep = sb_engine_default_params();
    ep.split = (sb_split_mode)7;
    assert_int_equal(sb_engine_create(model, &ep, exec, &e, &err), SB_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "split mode 7"));
}

static void test_prefix_computed_once(void **state) {
    (void)state;
    sb_engine_params ep = sb_engine_default_params();
    ep.n_ctx = 512;
    sb_engine *e;
    assert_int_equal(sb_engine_create(model, &ep, exec, &e, NULL), SB_OK);
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
    sb_engine *e;
    assert_int_equal(sb_engine_create(model, &ep, exec, &e, NULL), SB_OK);
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
    assert_int_equal(sb_engine_create(model, &ep, exec, &e, NULL), SB_OK);
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

/* ---- the executor ------------------------------------------------------------ */

static sb_gen_params long_greedy(int32_t max_tokens) {
    sb_gen_params p = greedy(NULL, 0, max_tokens);
    p.ignore_eos = true;
    return p;
}

/* Submits prompt i for r, tagged for the engine log (tag > 0) and watching
 * another request (watch not NULL), as result says. */
static void submit_prompt(sb_engine *e, int i, sb_gen_params p, result *r, int tag, result *watch) {
    int32_t prompt[64];
    p.prompt = prompt;
    p.n_prompt = make_prompt(i, prompt);
    result_init(r);
    r->tag = tag;
    r->watch = watch;
    r->submitted_at = atomic_load(&event_clock);
    sb_error err;
    if (sb_engine_submit(e, &p, on_event, r, NULL, &err) != SB_OK)
        fail_msg("submit: %s", err.msg);
}

/* Waits until request r has generated at least n tokens. */
static void wait_tokens(result *r, int n) {
    for (;;) {
        pthread_mutex_lock(&r->lock);
        bool there = r->n >= n || r->done;
        pthread_mutex_unlock(&r->lock);
        if (there)
            return;
        usleep(200);
    }
}

static int count_threads(void) {
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    int n = 0;
    for (struct dirent *de; (de = readdir(d));)
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Runs n_req requests on each of the n_models engines of executor x at
 * once (engine k's tagged k + 1 in the engine log; request i of engine k
 * in r[k * n_req + i]); each request's greedy tokens are what it gives
 * alone. */
static void run_models(sb_executor *x, const sb_model_t *const *models, int n_models, int n_req, result *r) {
    enum { MAX = 16 };
    static result alone[MAX];
    assert_true(n_models * n_req <= MAX && n_models <= 4);
    sb_engine_params ep = sb_engine_default_params();
    ep.n_ctx = 512;
    for (int k = 0; k < n_models; k++)
        for (int i = 0; i < n_req; i++)
            run_alone(models[k], &ep, i, long_greedy(40), &alone[k * n_req + i]);
    sb_engine *e[4];
    for (int k = 0; k < n_models; k++)
        assert_int_equal(sb_engine_create(models[k], &ep, x, &e[k], NULL), SB_OK);
    n_event_log = 0;
    for (int i = 0; i < n_req; i++)
        for (int k = 0; k < n_models; k++)
            submit_prompt(e[k], i, long_greedy(40), &r[k * n_req + i], k + 1, NULL);
    for (int j = 0; j < n_models * n_req; j++) {
        result_wait(&r[j]);
        assert_same_tokens(&alone[j], &r[j]);
    }
    for (int k = 0; k < n_models; k++)
        sb_engine_free(e[k]);
}

/* Two models (stories260K and a generated one), TWO_N requests each. */
enum { TWO_N = 6 };
static void run_two_models(sb_executor *x) {
    static result r[2 * TWO_N];
    run_models(x, (const sb_model_t *[]){model, other}, 2, TWO_N, r);
}

/* Two busy models on an executor with more threads than busy engines:
 * it alternates, one step each: a run of one engine's tokens between the
 * other's is one step, at most one token per sequence; every callback on
 * the scheduler's thread. */
static void test_two_models_alternate(void **state) {
    (void)state;
    sb_executor *x;
    sb_executor_params xp = {.n_threads = 3};
    assert_int_equal(sb_executor_create(&xp, &x, NULL), SB_OK);
    run_two_models(x);
    int runs = 0, longest = 0;
    for (int a = 0, b; a < n_event_log; a = b) {
        for (b = a; b < n_event_log && event_log[b] == event_log[a];)
            b++;
        if (a > 0 && b < n_event_log) { /* the first and last runs may hold several steps */
            runs++;
            longest = SB_MAX(longest, b - a);
        }
    }
    fprintf(stderr, "two models alternating: %d tokens, %d inner runs, the longest %d\n", n_event_log, runs, longest);
    assert_true(runs >= 30); /* 40 tokens per request, TWO_N per step: about 40 steps each */
    assert_true(longest <= TWO_N);
    for (int i = 1; i < n_event_log; i++)
        assert_true(pthread_equal(event_thread[i], event_thread[0]));
    sb_executor_free(x);
}

/* Two busy models on a 2-thread executor: lanes, one thread each, side by
 * side: the tokens are still what each request gives alone, both engines'
 * callbacks ran on both of the pool's threads between them, and the process
 * has no thread more than before. */
static void test_two_models_side_by_side(void **state) {
    (void)state;
    int before = count_threads();
    run_two_models(exec);
    int threads = 0;
    pthread_t seen[2];
    for (int i = 0; i < n_event_log && threads < 2; i++)
        if (threads == 0 || !pthread_equal(event_thread[i], seen[0]))
            seen[threads++] = event_thread[i];
    fprintf(stderr, "two models side by side: %d tokens on %d threads\n", n_event_log, threads);
    assert_int_equal(threads, 2);
    assert_int_equal(count_threads(), before);
}

/* Three busy models on a 2-thread executor: lanes of two at a time, which
 * rotate (a turn's steps each while the third waits), so none starves:
 * every request's first token comes within a few steps' events of its
 * submission (starving, it would wait for another engine's requests to
 * end: 40 tokens each), and the tokens are what each gives alone. */
static void test_three_models_take_turns_in_lanes(void **state) {
    (void)state;
    enum { N = 2 };
    static result r[3 * N];
    run_models(exec, (const sb_model_t *[]){model, other, wide_heads}, 3, N, r);
    int longest = 0;
    for (int j = 0; j < 3 * N; j++)
        longest = SB_MAX(longest, r[j].first_at - r[j].submitted_at);
    fprintf(stderr, "three models, two lanes: at most %d events from a submission to its first token\n", longest);
    assert_true(longest < 40);
}

/* An engine full of low-priority requests (two slots, a third waiting):
 * a high-priority request goes in at once, preempting the newest low one,
 * and finishes first; the low ones then finish with their greedy tokens
 * unchanged, the preempted one before the one that waited. */
static void test_priority_preempts_lower(void **state) {
    (void)state;
    static result alone[4], r[4];
    sb_engine_params ep = sb_engine_default_params();
    ep.n_ctx = 512;
    sb_gen_params low = long_greedy(400), high = long_greedy(8); /* low: long enough to outlast any delay of this thread */
    high.priority = 5;
    for (int i = 0; i < 3; i++)
        run_alone(model, &ep, i, low, &alone[i]);
    run_alone(model, &ep, 3, high, &alone[3]);
    ep.n_parallel = 2;
    sb_engine *e;
    assert_int_equal(sb_engine_create(model, &ep, exec, &e, NULL), SB_OK);
    submit_prompt(e, 0, low, &r[0], 0, NULL);
    submit_prompt(e, 1, low, &r[1], 0, NULL);
    wait_tokens(&r[0], 2);
    wait_tokens(&r[1], 2); /* both slots taken */
    submit_prompt(e, 2, low, &r[2], 0, NULL);
    submit_prompt(e, 3, high, &r[3], 0, NULL);
    for (int i = 0; i < 4; i++) {
        result_wait(&r[i]);
        assert_same_tokens(&alone[i], &r[i]);
    }
    sb_engine_stats st;
    sb_engine_get_stats(e, &st);
    assert_true(st.preemptions >= 1);
    assert_true(r[3].first_at < r[2].first_at); /* admitted before the low one that waited */
    for (int i = 0; i < 3; i++)
        assert_true(r[3].done_at < r[i].done_at);
    assert_true(r[1].done_at < r[2].done_at); /* the preempted one resumed first */
    assert_int_equal(st.waiting + st.running, 0);
    sb_engine_free(e);
}

/* The executor serves the engine of higher priority first. */
static void test_priority_across_engines(void **state) {
    (void)state;
    static result r[2];
    sb_engine_params ep = sb_engine_default_params();
    ep.n_ctx = 512;
    sb_engine *e[2];
    for (int k = 0; k < 2; k++)
        assert_int_equal(sb_engine_create(k ? other : model, &ep, exec, &e[k], NULL), SB_OK);
    sb_gen_params low = long_greedy(200), high = long_greedy(10);
    high.priority = 1;
    submit_prompt(e[0], 0, low, &r[0], 0, NULL);
    wait_tokens(&r[0], 2);
    submit_prompt(e[1], 0, high, &r[1], 0, &r[0]);
    result_wait(&r[1]);
    /* From the high one's first token to its end, the low one got no step. */
    int during = r[1].watch_done - r[1].watch_first;
    fprintf(stderr, "priority across engines: the low one got %d tokens while the high one ran\n", during);
    assert_int_equal(during, 0);
    result_wait(&r[0]);
    for (int k = 0; k < 2; k++)
        sb_engine_free(e[k]);
}

/* Two engines busy at the same priority run in lanes; a request of higher
 * priority on a third ends them after their step and runs alone, to its end
 * before theirs: from its first token to its end the low ones get no step. */
static void test_priority_ends_lanes(void **state) {
    (void)state;
    static result low[2], high;
    const sb_model_t *models[3] = {model, other, wide_heads};
    sb_engine_params ep = sb_engine_default_params();
    ep.n_ctx = 512;
    sb_engine *e[3];
    for (int k = 0; k < 3; k++)
        assert_int_equal(sb_engine_create(models[k], &ep, exec, &e[k], NULL), SB_OK);
    sb_gen_params lo = long_greedy(200), hi = long_greedy(10);
    hi.priority = 1;
    for (int k = 0; k < 2; k++)
        submit_prompt(e[k], 0, lo, &low[k], 0, NULL);
    wait_tokens(&low[0], 2);
    wait_tokens(&low[1], 2);
    submit_prompt(e[2], 0, hi, &high, 0, &low[0]);
    result_wait(&high);
    int during = high.watch_done - high.watch_first;
    fprintf(stderr, "priority over lanes: a low one got %d tokens while the high one ran\n", during);
    assert_int_equal(during, 0);
    for (int k = 0; k < 2; k++) {
        result_wait(&low[k]);
        assert_true(high.done_at < low[k].done_at); /* the lanes ended for it */
    }
    for (int k = 0; k < 3; k++)
        sb_engine_free(e[k]);
}

/* Freeing an engine while another runs: its own requests end cancelled, the
 * other's go on unchanged. */
static void test_free_engine_while_others_run(void **state) {
    (void)state;
    enum { N = 4 };
    static result alone[N], r[N], doomed[2];
    sb_engine_params ep = sb_engine_default_params();
    ep.n_ctx = 512;
    for (int i = 0; i < N; i++)
        run_alone(other, &ep, i, long_greedy(50), &alone[i]);
    sb_engine *stays, *goes;
    assert_int_equal(sb_engine_create(other, &ep, exec, &stays, NULL), SB_OK);
    assert_int_equal(sb_engine_create(model, &ep, exec, &goes, NULL), SB_OK);
    for (int i = 0; i < 2; i++)
        submit_prompt(goes, i, long_greedy(0), &doomed[i], 0, NULL); /* until the context is full */
    for (int i = 0; i < N; i++)
        submit_prompt(stays, i, long_greedy(50), &r[i], 0, NULL);
    wait_tokens(&doomed[0], 3);
    wait_tokens(&r[0], 3);
    sb_engine_free(goes);
    for (int i = 0; i < 2; i++) {
        assert_true(doomed[i].done); /* its DONE came before free returned */
        /* Cancelled by the free, unless a fast machine filled the context first. */
        assert_true(doomed[i].finish == SB_FINISH_CANCELLED || doomed[i].finish == SB_FINISH_LENGTH);
    }
    for (int i = 0; i < N; i++) {
        result_wait(&r[i]);
        assert_same_tokens(&alone[i], &r[i]);
    }
    sb_engine_free(stays);
}

/* An executor of n threads adds n threads to the process, its engines
 * none, however many there are and however busy. */
static void test_no_more_threads_than_n_threads(void **state) {
    (void)state;
    enum { N = 8 };
    static result r[2][N];
    int before = count_threads();
    sb_executor *x;
    sb_executor_params xp = {.n_threads = 3};
    assert_int_equal(sb_executor_create(&xp, &x, NULL), SB_OK);
    assert_int_equal(sb_executor_n_threads(x), 3);
    int with_executor = count_threads();
    assert_int_equal(with_executor - before, 3); /* the scheduler thread and 2 pool workers */
    sb_engine_params ep = sb_engine_default_params();
    ep.n_ctx = 512;
    sb_engine *e[2];
    for (int k = 0; k < 2; k++)
        assert_int_equal(sb_engine_create(k ? other : model, &ep, x, &e[k], NULL), SB_OK);
    for (int i = 0; i < N; i++)
        for (int k = 0; k < 2; k++)
            submit_prompt(e[k], i, long_greedy(30), &r[k][i], 0, NULL);
    wait_tokens(&r[0][0], 2);
    wait_tokens(&r[1][0], 2);
    assert_int_equal(count_threads(), with_executor); /* busy, both */
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < N; i++)
            result_wait(&r[k][i]);
    for (int k = 0; k < 2; k++)
        sb_engine_free(e[k]);
    sb_executor_free(x);
    assert_int_equal(count_threads(), before);
}

/* sb_engine_memory is what creating the engine allocated: the heap grows by
 * it (plus the executor's registration), and it holds at least the KV pool. */
static void test_engine_memory_is_measured(void **state) {
    (void)state;
    sb_test_count_allocs_begin(); /* a fresh executor: every block it frees was counted */
    sb_executor *x;
    assert_int_equal(sb_executor_create(NULL, &x, NULL), SB_OK);
    sb_engine_params ep = sb_engine_default_params();
    ep.n_ctx = 1024;
    size_t live = sb_test_live_bytes();
    sb_engine *e;
    assert_int_equal(sb_engine_create(model, &ep, x, &e, NULL), SB_OK);
    size_t grown = sb_test_live_bytes() - live, mem = sb_engine_memory(e);
    size_t kv = (size_t)2 * 1024 * 5 /* layers */ * 4 /* kv heads */ * 8 /* head size */ * 2 /* f16 */;
    fprintf(stderr, "engine memory %zu bytes (heap grew %zu, KV %zu)\n", mem, grown, kv);
    assert_true(mem >= kv && mem <= grown && grown - mem <= 256);
    sb_engine_free(e);
    sb_executor_free(x);
    assert_int_equal(sb_test_live_bytes(), 0);
    sb_test_count_allocs_end();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_equals_alone),
        cmocka_unit_test(test_profile_of_decoding_steps),
        cmocka_unit_test(test_prefix_computed_once),
        cmocka_unit_test(test_cancel_and_queue_full),
        cmocka_unit_test(test_embedding_unit_norm),
        cmocka_unit_test(test_two_models_alternate),
        cmocka_unit_test(test_two_models_side_by_side),
        cmocka_unit_test(test_three_models_take_turns_in_lanes),
        cmocka_unit_test(test_priority_preempts_lower),
        cmocka_unit_test(test_priority_across_engines),
        cmocka_unit_test(test_priority_ends_lanes),
        cmocka_unit_test(test_free_engine_while_others_run),
        cmocka_unit_test(test_no_more_threads_than_n_threads),
        cmocka_unit_test(test_engine_memory_is_measured),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
