/*
 * test_switchboard.c - the high-level public API (switchboard.h, "the
 * high-level API") over a generated model: blocking, streaming and pulled
 * generation agree; batch_infer gives each prompt what it gets alone, in
 * order; stop strings, cancellation, chat in both shapes; set_default with
 * and without a fallback; errors carry their status and a message; every
 * call leaves its profile. The pieces the server is built from: admin
 * listing, load/unload and totals; held models (route first, then submit),
 * token-id inputs, waiting for whole answers, grammars and JSON schemas,
 * embeddings.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "model/synth.h"
#include "switchboard.h"
#include "testutil.h"

static char model_path[512], registry_path[512];

static int setup(void **state) {
    snprintf(model_path, sizeof model_path, "%s/api-model.gguf", sb_test_tmpdir());
    sb_synth_params sp = sb_synth_default_params();
    sp.type = SB_TYPE_Q8_0;
    sp.ctx = 256;
    sb_error err;
    if (sb_synth_write(&sp, model_path, &err) != SB_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    snprintf(registry_path, sizeof registry_path, "%s/api-models.json", sb_test_tmpdir());
    FILE *f = fopen(registry_path, "w");
    if (!f)
        return -1;
    fprintf(f, "{\"fallback\": \"main\", \"models\": [\n"
               " {\"name\": \"main\", \"path\": \"api-model.gguf\", \"system_prompt\": \"Be brief.\"},\n"
               " {\"name\": \"second\", \"path\": \"api-model.gguf\", \"aliases\": [\"two\"],\n"
               "  \"parameters\": {\"temperature\": 0, \"max_tokens\": 5}}]}\n");
    fclose(f);
    return 0;
}

static sb_switchboard_t *open_or_fail(const char *path) {
    sb_error err;
    sb_switchboard_params p = sb_switchboard_default_params();
    p.n_threads = 2;
    sb_switchboard_t *sb = NULL;
    sb_status st = sb_switchboard_open(path, &p, &sb, &err);
    if (st != SB_OK)
        fail_msg("open %s: %s", path, err.msg);
    return sb;
}

static sb_sampler_params greedy(void) {
    sb_sampler_params s = sb_sampler_default_params();
    s.temperature = 0;
    return s;
}

static void complete_or_fail(sb_switchboard_t *sb, const char *prompt, const sb_infer_params *p, sb_result *res) {
    sb_error err;
    if (sb_switchboard_complete(sb, prompt, p, res, &err) != SB_OK)
        fail_msg("complete '%s': %s", prompt, err.msg);
}

typedef struct collect {
    char text[4096];
    size_t len;
    int tokens, dones, stop_after;
    sb_finish_reason finish;
} collect;

static bool on_event(void *user, const sb_stream_event *ev) {
    collect *c = user;
    assert_true(c->len + ev->text_len < sizeof c->text);
    memcpy(c->text + c->len, ev->text, ev->text_len);
    c->len += ev->text_len;
    c->text[c->len] = '\0';
    if (ev->done) {
        c->dones++;
        c->finish = ev->finish;
        return true;
    }
    c->tokens++;
    return c->stop_after == 0 || c->tokens < c->stop_after;
}

static void test_blocking_streaming_pulled_agree(void **state) {
    sb_switchboard_t *sb = open_or_fail(model_path);
    sb_sampler_params g = greedy();
    sb_infer_params p = sb_infer_default_params();
    p.sampling = &g;
    p.max_tokens = 20;
    sb_result a;
    complete_or_fail(sb, "Once upon a time", &p, &a);
    assert_int_equal(a.n_generated, 20);
    assert_int_equal(a.finish, SB_FINISHED_LENGTH);
    assert_string_equal(a.served.model, "api-model");
    assert_false(a.served.fallback);
    assert_true(a.n_prompt > 0);
    assert_int_equal(strlen(a.text), a.text_len);

    collect c = {0};
    p.on_event = on_event;
    p.user_data = &c;
    sb_result b;
    complete_or_fail(sb, "Once upon a time", &p, &b);
    assert_string_equal(a.text, b.text);
    assert_string_equal(c.text, b.text);
    assert_int_equal(c.tokens, 20);
    assert_int_equal(c.dones, 1);

    /* pulled, with a zero timeout: a poll */
    p.on_event = NULL;
    sb_input in = {.kind = SB_INPUT_TEXT, .text = "Once upon a time"};
    sb_request_t *req;
    sb_error err;
    assert_int_equal(sb_switchboard_submit(sb, &in, 1, &p, &req, &err), SB_OK);
    assert_non_null(sb_request_model(req));
    char text[4096] = "";
    size_t len = 0;
    sb_stream_event ev;
    while (!sb_request_finished(req)) {
        if (!sb_request_next(req, 0, &ev))
            continue;
        memcpy(text + len, ev.text, ev.text_len);
        len += ev.text_len;
        text[len] = '\0';
    }
    assert_false(sb_request_next(req, 10, &ev));
    assert_string_equal(text, a.text);
    sb_profile rp;
    sb_request_profile(req, &rp);
    assert_int_equal(rp.n_generated, 20);
    sb_request_free(req);
    sb_result_free(&a);
    sb_result_free(&b);
    sb_switchboard_free(sb);
}

static void test_cancel_and_early_free(void **state) {
    sb_switchboard_t *sb = open_or_fail(model_path);
    sb_sampler_params g = greedy();
    sb_infer_params p = sb_infer_default_params();
    p.sampling = &g;
    p.max_tokens = 100;
    p.ignore_eos = true;
    collect c = {.stop_after = 3};
    p.on_event = on_event;
    p.user_data = &c;
    sb_result r;
    complete_or_fail(sb, "Once upon a time", &p, &r);
    assert_int_equal(r.finish, SB_FINISHED_CANCELLED);
    assert_int_equal(c.finish, SB_FINISHED_CANCELLED);
    assert_true(r.n_generated < 100);
    sb_result_free(&r);

    /* a request freed while it runs: its hold ends when the engine is done */
    p.on_event = NULL;
    sb_input in = {.kind = SB_INPUT_TEXT, .text = "Once upon a time"};
    sb_request_t *req;
    sb_error err;
    assert_int_equal(sb_switchboard_submit(sb, &in, 1, &p, &req, &err), SB_OK);
    sb_request_free(req);
    sb_switchboard_free(sb); /* waits for the engine's last event */
}

static void test_batch_matches_single(void **state) {
    sb_switchboard_t *sb = open_or_fail(model_path);
    const char *prompts[] = {"Once upon a time", "The little dog", "One day", "A", "The sun was hot and"};
    enum { N = 5 };
    sb_sampler_params g = greedy();
    sb_infer_params p = sb_infer_default_params();
    p.sampling = &g;
    p.max_tokens = 12;
    sb_result batch[N], single;
    sb_profile whole;
    sb_error err;
    if (sb_switchboard_batch_infer(sb, prompts, N, &p, batch, &whole, &err) != SB_OK)
        fail_msg("batch: %s", err.msg);
    int generated = 0;
    for (int i = 0; i < N; i++) {
        complete_or_fail(sb, prompts[i], &p, &single);
        assert_string_equal(batch[i].text, single.text); /* batch invariance, and the order kept */
        generated += batch[i].n_generated;
        sb_result_free(&single);
        sb_result_free(&batch[i]);
    }
    assert_int_equal(whole.n_generated, generated);
    assert_true(whole.ttft_s > 0 && whole.total_s >= whole.ttft_s);
    /* one bad prompt fails the whole batch, naming it, and nothing runs */
    const char *bad[] = {"fine", NULL};
    assert_int_equal(sb_switchboard_batch_infer(sb, bad, 2, &p, batch, NULL, &err), SB_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "input 1"));
    sb_switchboard_free(sb);
}

static void test_stop_strings(void **state) {
    sb_switchboard_t *sb = open_or_fail(model_path);
    sb_sampler_params g = greedy();
    sb_infer_params p = sb_infer_default_params();
    p.sampling = &g;
    p.max_tokens = 30;
    p.ignore_eos = true;
    sb_result full, cut;
    complete_or_fail(sb, "Once upon a time", &p, &full);
    assert_true(full.text_len > 8);
    char stop[4];
    memcpy(stop, full.text + full.text_len / 2, 3);
    stop[3] = '\0';
    const char *stops[] = {stop};
    p.stops = stops;
    p.n_stops = 1;
    complete_or_fail(sb, "Once upon a time", &p, &cut);
    assert_int_equal(cut.finish, SB_FINISHED_STOP);
    const char *first = strstr(full.text, stop);
    assert_non_null(first);
    assert_int_equal(cut.text_len, (size_t)(first - full.text));
    assert_memory_equal(cut.text, full.text, cut.text_len);
    sb_result_free(&full);
    sb_result_free(&cut);
    sb_switchboard_free(sb);
}

static void test_chat_shapes(void **state) {
    sb_switchboard_t *sb = open_or_fail(registry_path);
    sb_sampler_params g = greedy();
    sb_infer_params p = sb_infer_default_params();
    p.sampling = &g;
    p.max_tokens = 8;
    sb_result a, b;
    sb_error err;
    assert_int_equal(sb_switchboard_chat(sb, "[{\"role\": \"user\", \"content\": \"Hi there\"}]", &p, &a, &err), SB_OK);
    const sb_chat_message msgs[] = {{"user", "Hi there"}};
    assert_int_equal(sb_switchboard_chat_messages(sb, msgs, 1, &p, &b, &err), SB_OK);
    assert_string_equal(a.text, b.text);
    assert_string_equal(a.served.model, "main");
    /* the registry's system prompt goes first: the prompt is longer than without it */
    sb_result c;
    const sb_chat_message with_sys[] = {{"system", "x"}, {"user", "Hi there"}};
    assert_int_equal(sb_switchboard_chat_messages(sb, with_sys, 2, &p, &c, &err), SB_OK);
    assert_true(a.n_prompt > c.n_prompt);
    sb_result_free(&a);
    sb_result_free(&b);
    sb_result_free(&c);

    assert_int_equal(sb_switchboard_chat(sb, "[{\"role\": \"user\", ", &p, &a, &err), SB_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "offset"));
    assert_int_equal(sb_switchboard_chat(sb, "{\"role\": \"user\"}", &p, &a, &err), SB_ERR_INVALID_ARG);
    assert_int_equal(sb_switchboard_chat(sb, "[]", &p, &a, &err), SB_ERR_INVALID_ARG);
    const sb_chat_message no_content[] = {{"user", NULL}};
    assert_int_equal(sb_switchboard_chat_messages(sb, no_content, 1, &p, &a, &err), SB_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "messages[0] has no content"));
    sb_switchboard_free(sb);
}

static void test_default_and_fallback(void **state) {
    /* one file: no fallback, an unknown name is not found and the default stays */
    sb_switchboard_t *one = open_or_fail(model_path);
    sb_error err;
    sb_served served;
    assert_int_equal(sb_switchboard_set_default(one, "nope", &served, &err), SB_ERR_MODEL_NOT_FOUND);
    assert_non_null(strstr(err.msg, "api-model"));
    char name[128];
    sb_switchboard_get_default(one, name, sizeof name);
    assert_string_equal(name, "api-model");
    sb_infer_params p = sb_infer_default_params();
    p.model = "nope";
    sb_result r;
    assert_int_equal(sb_switchboard_complete(one, "x", &p, &r, &err), SB_ERR_MODEL_NOT_FOUND);
    sb_switchboard_free(one);

    /* a registry with a fallback */
    sb_switchboard_t *sb = open_or_fail(registry_path);
    sb_switchboard_get_default(sb, name, sizeof name);
    assert_string_equal(name, "main");
    assert_int_equal(sb_switchboard_set_default(sb, "two", &served, &err), SB_OK);
    assert_string_equal(served.model, "second");
    assert_false(served.fallback);
    /* the model's registry defaults: temperature 0, max_tokens 5 */
    complete_or_fail(sb, "Once upon a time", NULL, &r);
    assert_string_equal(r.served.model, "second");
    assert_int_equal(r.n_generated, 5);
    sb_result_free(&r);
    assert_int_equal(sb_switchboard_set_default(sb, "missing", &served, &err), SB_OK);
    assert_true(served.fallback);
    assert_string_equal(served.model, "main");
    assert_non_null(strstr(served.fallback_reason, "missing"));
    p = sb_infer_default_params();
    p.max_tokens = 3;
    complete_or_fail(sb, "Once upon a time", &p, &r);
    assert_true(r.served.fallback);
    assert_string_equal(r.served.model, "main");
    sb_result_free(&r);
    char names[256];
    assert_int_equal(sb_switchboard_models(sb, names, sizeof names), 3); /* main, second, two */
    sb_switchboard_free(sb);
}

static void test_errors(void **state) {
    sb_switchboard_t *sb = NULL;
    sb_error err;
    assert_int_not_equal(sb_switchboard_open("/nonexistent/models.json", NULL, &sb, &err), SB_OK);
    assert_null(sb);
    assert_non_null(strstr(err.msg, "/nonexistent/models.json"));
    assert_int_equal(sb_switchboard_open(NULL, NULL, &sb, &err), SB_ERR_INVALID_ARG);

    sb_switchboard_params bp = sb_switchboard_default_params();
    bp.memory_budget = 4096; /* nothing fits */
    assert_int_equal(sb_switchboard_open(model_path, &bp, &sb, &err), SB_OK);
    sb_result r;
    assert_int_equal(sb_switchboard_complete(sb, "x", NULL, &r, &err), SB_ERR_OVER_BUDGET);
    assert_true(strlen(err.msg) > 20);
    sb_switchboard_free(sb);

    sb = open_or_fail(model_path);
    char longer[4096];
    for (size_t i = 0; i + 2 < sizeof longer; i += 2)
        memcpy(longer + i, "a ", 2);
    longer[sizeof longer - 2] = '\0';
    assert_int_equal(sb_switchboard_complete(sb, longer, NULL, &r, &err), SB_ERR_INVALID_ARG); /* > context */
    sb_infer_params p = sb_infer_default_params();
    p.top_logprobs = 21;
    assert_int_equal(sb_switchboard_complete(sb, "x", &p, &r, &err), SB_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "top_logprobs"));
    sb_switchboard_free(sb);
    sb_switchboard_free(NULL);
}

static void test_profiles(void **state) {
    sb_switchboard_t *sb = open_or_fail(model_path);
    sb_profile before;
    sb_switchboard_last_profile(sb, &before);
    assert_int_equal(before.n_generated, 0);
    sb_sampler_params g = greedy();
    sb_infer_params p = sb_infer_default_params();
    p.sampling = &g;
    p.max_tokens = 16;
    p.ignore_eos = true;
    p.logprobs = true;
    sb_result r;
    complete_or_fail(sb, "Once upon a time", &p, &r);
    const sb_profile *f = &r.profile;
    assert_true(f->load_s > 0);
    assert_true(f->ttft_s > 0 && f->total_s >= f->ttft_s);
    assert_true(f->gen_tps > 0 && f->prompt_tps > 0);
    assert_int_equal(f->n_generated, 16);
    assert_int_equal(f->n_prompt, r.n_prompt);
    assert_true(f->rss_bytes > 0 && f->peak_rss_bytes >= f->rss_bytes);
    assert_true(f->models_bytes > 0 && f->budget_bytes >= f->models_bytes);
    sb_profile last;
    sb_switchboard_last_profile(sb, &last);
    assert_int_equal(last.n_generated, 16);
    assert_true(last.total_s == f->total_s);
    sb_result_free(&r);
    /* a failed call leaves the last profile as it was */
    sb_error err;
    p.model = "nope";
    assert_int_equal(sb_switchboard_complete(sb, "x", &p, &r, &err), SB_ERR_MODEL_NOT_FOUND);
    sb_switchboard_last_profile(sb, &last);
    assert_int_equal(last.n_generated, 16);
    sb_switchboard_free(sb);
}

static void test_admin(void **state) {
    sb_switchboard_t *sb = open_or_fail(registry_path);
    assert_int_equal(sb_switchboard_list(sb, NULL, 0), 2);
    sb_model_info info[4];
    assert_int_equal(sb_switchboard_list(sb, info, 4), 2);
    assert_string_equal(info[0].name, "main");
    assert_string_equal(info[1].name, "second");
    assert_int_equal(info[0].state, SB_MODEL_UNLOADED);
    assert_int_equal(info[0].memory, 0);
    assert_string_equal(sb_model_state_str(SB_MODEL_LOADED), "loaded");
    sb_error err;
    assert_int_equal(sb_switchboard_load(sb, "main", &err), SB_OK);
    assert_int_equal(sb_switchboard_list(sb, info, 1), 2); /* the count, one filled */
    assert_int_equal(info[0].state, SB_MODEL_LOADED);
    assert_true(info[0].memory > 0);
    assert_true(info[0].kv_blocks_total > 0 && info[0].block_size > 0);
    assert_int_equal(info[0].in_flight, 0);
    sb_switchboard_totals t;
    sb_switchboard_get_totals(sb, &t);
    assert_true(t.used >= info[0].memory && t.budget >= t.used);
    assert_int_equal(t.loads, 1);
    /* a held model counts as in flight */
    sb_held_t *h;
    assert_int_equal(sb_switchboard_acquire(sb, "main", NULL, &h, &err), SB_OK);
    sb_switchboard_list(sb, info, 1);
    assert_int_equal(info[0].in_flight, 1);
    sb_held_release(h, SB_KEEP_ALIVE_UNCHANGED);
    assert_int_equal(sb_switchboard_unload(sb, "main", &err), SB_OK);
    sb_switchboard_list(sb, info, 1);
    assert_int_equal(info[0].state, SB_MODEL_UNLOADED);
    assert_int_equal(sb_switchboard_load(sb, "nope", &err), SB_ERR_MODEL_NOT_FOUND);
    assert_int_equal(sb_switchboard_load(sb, NULL, &err), SB_ERR_INVALID_ARG);
    sb_switchboard_free(sb);
}

/* Takes every event of req, whole answers at a time, into text; returns the done count. */
static int drain_whole(sb_request_t *req, char *text, size_t cap, sb_stream_event *last_done) {
    size_t len = 0;
    int dones = 0;
    sb_stream_event ev;
    while (!sb_request_finished(req)) {
        assert_true(sb_request_wait(req, -1));
        while (sb_request_next(req, 0, &ev)) {
            assert_true(len + ev.text_len < cap);
            memcpy(text + len, ev.text, ev.text_len);
            len += ev.text_len;
            if (ev.done) {
                dones++;
                *last_done = ev;
            }
        }
    }
    text[len] = '\0';
    return dones;
}

static void test_held_tokens(void **state) {
    sb_switchboard_t *sb = open_or_fail(model_path);
    sb_sampler_params g = greedy();
    sb_infer_params p = sb_infer_default_params();
    p.sampling = &g;
    p.max_tokens = 12;
    p.ignore_eos = true;
    sb_result want;
    complete_or_fail(sb, "Once upon a time", &p, &want);

    sb_held_t *h;
    sb_error err;
    assert_int_equal(sb_switchboard_acquire(sb, NULL, NULL, &h, &err), SB_OK);
    assert_int_equal(sb_held_n_ctx(h), 256);
    sb_served served;
    sb_held_served(h, &served);
    assert_string_equal(served.model, "api-model");
    int32_t ids[64];
    size_t n = 0;
    const char *prompt = "Once upon a time";
    assert_int_equal(sb_tokenize(sb_held_model(h), prompt, strlen(prompt), true, true, ids, 64, &n, &err), SB_OK);
    sb_input in = {.kind = SB_INPUT_TOKENS, .tokens = ids, .n_tokens = n};
    sb_request_t *req;
    assert_int_equal(sb_held_submit(h, &in, 1, &p, &req, &err), SB_OK);
    sb_held_release(h, SB_KEEP_ALIVE_UNCHANGED); /* the request holds the model on its own */
    assert_non_null(sb_request_model(req));
    char text[4096];
    sb_stream_event done;
    assert_int_equal(drain_whole(req, text, sizeof text, &done), 1);
    assert_string_equal(text, want.text);
    assert_int_equal(done.n_prompt, (int)n);
    assert_true(done.time_s > 0);
    sb_request_free(req);
    sb_result_free(&want);

    /* bad token inputs fail before anything runs */
    int32_t bad[] = {1, 1 << 20};
    sb_input b = {.kind = SB_INPUT_TOKENS, .tokens = bad, .n_tokens = 2};
    assert_int_equal(sb_switchboard_submit(sb, &b, 1, &p, &req, &err), SB_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "outside the vocabulary"));
    b.n_tokens = 0;
    assert_int_equal(sb_switchboard_submit(sb, &b, 1, &p, &req, &err), SB_ERR_INVALID_ARG);
    sb_switchboard_free(sb);
}

static void test_grammar_and_schema(void **state) {
    sb_switchboard_t *sb = open_or_fail(model_path);
    sb_held_t *h;
    sb_error err;
    assert_int_equal(sb_switchboard_acquire(sb, NULL, NULL, &h, &err), SB_OK);
    sb_grammar_t *g = NULL, *yes_no = NULL, *bad = NULL;
    const char gbnf[] = "root ::= [a-z ]+";
    assert_int_equal(sb_held_grammar(h, gbnf, strlen(gbnf), &g, &err), SB_OK);
    assert_int_equal(sb_held_grammar(h, "root ::= (", 10, &bad, &err), SB_ERR_INVALID_ARG);
    assert_null(bad);
    assert_int_equal(sb_held_json_schema(h, "{\"enum\": [\"yes\", \"no\"]}", &yes_no, &err), SB_OK);
    assert_int_equal(sb_held_json_schema(h, "{\"enum\": ", &bad, &err), SB_ERR_INVALID_ARG);

    sb_sampler_params s = greedy();
    sb_infer_params p = sb_infer_default_params();
    p.sampling = &s;
    p.max_tokens = 16;
    p.grammar = g;
    sb_input in = {.kind = SB_INPUT_TEXT, .text = "Once upon a time"};
    sb_request_t *req;
    assert_int_equal(sb_held_submit(h, &in, 1, &p, &req, &err), SB_OK);
    sb_grammar_free(g); /* the request keeps its own reference */
    char text[4096];
    sb_stream_event done;
    assert_int_equal(drain_whole(req, text, sizeof text, &done), 1);
    sb_request_free(req);
    assert_true(strlen(text) > 0);
    for (const char *c = text; *c; c++)
        assert_true((*c >= 'a' && *c <= 'z') || *c == ' ');

    p.grammar = yes_no;
    assert_int_equal(sb_held_submit(h, &in, 1, &p, &req, &err), SB_OK);
    assert_int_equal(drain_whole(req, text, sizeof text, &done), 1);
    sb_request_free(req);
    for (size_t k = strlen(text); k > 0 && strchr(" \t\n", text[k - 1]); k--)
        text[k - 1] = '\0'; /* JSON may end in whitespace */
    if (strcmp(text, "\"yes\"") != 0 && strcmp(text, "\"no\"") != 0)
        fail_msg("the schema allows \"yes\" or \"no\", got \x27%s\x27 (finish %d)", text, (int)done.finish);
    sb_grammar_free(yes_no);
    sb_grammar_free(NULL);
    sb_held_release(h, SB_KEEP_ALIVE_UNCHANGED);
    sb_switchboard_free(sb);
}

static void test_embedding(void **state) {
    sb_switchboard_t *sb = open_or_fail(model_path);
    sb_infer_params p = sb_infer_default_params();
    p.embedding = true;
    const sb_input in[] = {{.kind = SB_INPUT_TEXT, .text = "Once upon a time"},
                           {.kind = SB_INPUT_TEXT, .text = "The little dog"}};
    sb_request_t *req;
    sb_error err;
    assert_int_equal(sb_switchboard_submit(sb, in, 2, &p, &req, &err), SB_OK);
    const int32_t n_embd = sb_model_n_embd(sb_request_model(req));
    int dones = 0;
    sb_stream_event ev;
    while (sb_request_next(req, -1, &ev)) {
        assert_true(ev.done); /* no tokens: only the end, with the vector */
        assert_true(ev.finish != SB_FINISHED_ERROR && ev.finish != SB_FINISHED_CANCELLED);
        assert_non_null(ev.embedding);
        assert_int_equal(ev.n_embd, n_embd);
        double norm = 0;
        for (int32_t i = 0; i < ev.n_embd; i++)
            norm += (double)ev.embedding[i] * ev.embedding[i];
        assert_true(fabs(norm - 1.0) < 1e-3);
        assert_int_equal(ev.n_generated, 0);
        dones++;
    }
    assert_int_equal(dones, 2);
    sb_request_free(req);
    sb_switchboard_free(sb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocking_streaming_pulled_agree),
        cmocka_unit_test(test_cancel_and_early_free),
        cmocka_unit_test(test_batch_matches_single),
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_chat_shapes),
        cmocka_unit_test(test_default_and_fallback),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_profiles),
        cmocka_unit_test(test_admin),
        cmocka_unit_test(test_held_tokens),
        cmocka_unit_test(test_grammar_and_schema),
        cmocka_unit_test(test_embedding),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
