/*
 * cmd_run.c - `switchboard run`: one generation. The prompt is evaluated in
 * one call (batched), then tokens are sampled one at a time and streamed to
 * stdout as soon as they form whole UTF-8 characters; stop strings are
 * matched on the text. Speeds go to stderr. With --json nothing is streamed
 * and one JSON object (prompt and generated ids, text, stop reason) is
 * printed at the end, for scripts and tests. With --chat the prompt is the
 * user's message, formatted by the model's chat template.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "base/base.h"
#include "model/chat.h"
#include "sampling/stop.h"
#include "switchboard.h"

#define MAX_STOPS 16

typedef struct run_opts {
    const char *model, *prompt;
    int32_t n_predict, n_ctx, n_threads;
    sb_cache_type cache_type;
    sb_sampler_params sp;
    bool seed_given, json, chat;
    const char *system; /* --chat: an optional system message */
    const char *stops[MAX_STOPS];
    size_t n_stops;
} run_opts;

static void parse_opts(int argc, char **argv, run_opts *o) {
    const char *v;
    for (int i = 1; i < argc; i++) {
        if (sb_cli_end_of_options(argc, argv, i, NULL))
            break;
        if (sb_cli_opt(argc, argv, &i, "-m", &o->model) || sb_cli_opt(argc, argv, &i, "--model", &o->model) ||
            sb_cli_opt(argc, argv, &i, "-p", &o->prompt) || sb_cli_opt(argc, argv, &i, "--prompt", &o->prompt))
            continue;
        if (sb_cli_opt(argc, argv, &i, "-n", &v) || sb_cli_opt(argc, argv, &i, "--n-predict", &v))
            o->n_predict = (int32_t)sb_cli_int("-n", v, 0, 1 << 30);
        else if (sb_cli_opt(argc, argv, &i, "--temp", &v))
            o->sp.temperature = sb_cli_float("--temp", v);
        else if (sb_cli_opt(argc, argv, &i, "--top-k", &v))
            o->sp.top_k = (int32_t)sb_cli_int("--top-k", v, 0, 1 << 30);
        else if (sb_cli_opt(argc, argv, &i, "--top-p", &v))
            o->sp.top_p = sb_cli_float("--top-p", v);
        else if (sb_cli_opt(argc, argv, &i, "--min-p", &v))
            o->sp.min_p = sb_cli_float("--min-p", v);
        else if (sb_cli_opt(argc, argv, &i, "--repeat-penalty", &v))
            o->sp.repeat_penalty = sb_cli_float("--repeat-penalty", v);
        else if (sb_cli_opt(argc, argv, &i, "--repeat-last-n", &v))
            o->sp.repeat_last_n = (int32_t)sb_cli_int("--repeat-last-n", v, 0, 1 << 20);
        else if (sb_cli_opt(argc, argv, &i, "--frequency-penalty", &v))
            o->sp.frequency_penalty = sb_cli_float("--frequency-penalty", v);
        else if (sb_cli_opt(argc, argv, &i, "--presence-penalty", &v))
            o->sp.presence_penalty = sb_cli_float("--presence-penalty", v);
        else if (sb_cli_opt(argc, argv, &i, "--seed", &v)) {
            o->sp.seed = (uint64_t)sb_cli_int("--seed", v, 0, INT64_MAX);
            o->seed_given = true;
        } else if (sb_cli_opt(argc, argv, &i, "-t", &v) || sb_cli_opt(argc, argv, &i, "--threads", &v))
            o->n_threads = (int32_t)sb_cli_int("--threads", v, 1, 1024);
        else if (sb_cli_opt(argc, argv, &i, "-c", &v) || sb_cli_opt(argc, argv, &i, "--ctx", &v))
            o->n_ctx = (int32_t)sb_cli_int("--ctx", v, 1, 1 << 24);
        else if (sb_cli_opt(argc, argv, &i, "--cache-type", &v))
            o->cache_type = sb_cli_cache_type("--cache-type", v);
        else if (sb_cli_opt(argc, argv, &i, "--stop", &v)) {
            if (o->n_stops == MAX_STOPS) {
                fprintf(stderr, "switchboard run: at most %d --stop strings\n", MAX_STOPS);
                exit(SB_EXIT_USAGE);
            }
            o->stops[o->n_stops++] = v;
        } else if (sb_cli_opt(argc, argv, &i, "--system", &o->system)) {
            o->chat = true;
        } else if (strcmp(argv[i], "--chat") == 0)
            o->chat = true;
        else if (strcmp(argv[i], "--json") == 0)
            o->json = true;
        else {
            fprintf(stderr, "switchboard run: unknown option '%s' (see 'switchboard --help')\n", argv[i]);
            exit(SB_EXIT_USAGE);
        }
    }
    if (!o->model) {
        fputs("usage: switchboard run -m FILE [-p PROMPT] [-n N] [--temp T] ... (see 'switchboard --help')\n", stderr);
        exit(SB_EXIT_USAGE);
    }
}

/* Everything one generation owns, freed in one place. */
typedef struct run_state {
    sb_model_t *model;
    sb_chat *chat;
    sb_ctx_t *ctx;
    sb_sampler_t *sampler;
    sb_detok_t *detok;
    sb_stop_t *stop;
    char *out; /* stop-matcher output: a piece plus the longest stop string */
    int32_t *prompt_ids, *gen_ids;
    char *text;
    size_t text_len, text_cap;
} run_state;

static void run_state_free(run_state *s) {
    sb_stop_free(s->stop);
    sb_detok_free(s->detok);
    sb_sampler_free(s->sampler);
    sb_ctx_free(s->ctx);
    sb_chat_free(s->chat);
    sb_model_free(s->model);
    sb_free(s->prompt_ids);
    free(s->gen_ids);
    free(s->text);
    free(s->out);
}

/* Streams text to stdout, or collects it for --json. */
static void emit(run_state *s, bool json, const char *p, size_t n) {
    if (n == 0)
        return;
    if (!json) {
        fwrite(p, 1, n, stdout);
        fflush(stdout);
        return;
    }
    if (s->text_len + n + 1 > s->text_cap) {
        size_t cap = s->text_cap ? s->text_cap : 256;
        while (cap < s->text_len + n + 1)
            cap *= 2;
        char *t = realloc(s->text, cap);
        if (!t)
            return;
        s->text = t;
        s->text_cap = cap;
    }
    memcpy(s->text + s->text_len, p, n);
    s->text_len += n;
    s->text[s->text_len] = '\0';
}

/* The prompt's tokens: the text as is (BOS per the model), or with --chat
 * the user message (and --system message) through the chat template. */
static sb_status prompt_tokens(run_state *s, const run_opts *o, size_t *n, sb_error *err) {
    if (!o->chat) {
        size_t len = strlen(o->prompt);
        sb_tokenize(s->model, o->prompt, len, true, false, NULL, 0, n, NULL);
        if (!(s->prompt_ids = sb_malloc((*n + 1) * sizeof(int32_t))))
            return sb_fail(err, SB_ERR_NOMEM, "out of memory");
        return sb_tokenize(s->model, o->prompt, len, true, false, s->prompt_ids, *n, n, err);
    }
    cJSON *msgs = cJSON_CreateArray();
    if (o->system) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", o->system);
        cJSON_AddItemToArray(msgs, m);
    }
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", o->prompt);
    cJSON_AddItemToArray(msgs, m);
    char *json = cJSON_PrintUnformatted(msgs);
    cJSON_Delete(msgs);
    sb_status st = json ? sb_chat_create(s->model, &s->chat, err) : sb_fail(err, SB_ERR_NOMEM, "out of memory");
    if (st == SB_OK)
        st = sb_chat_tokenize(s->chat, json, &s->prompt_ids, n, err);
    cJSON_free(json);
    return st;
}

static cJSON *ids_json(const int32_t *ids, int32_t n) {
    cJSON *a = cJSON_CreateArray();
    for (int32_t i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

int sb_cmd_run(int argc, char **argv) {
    run_opts o = {.prompt = "", .n_predict = 128, .sp = sb_sampler_default_params()};
    parse_opts(argc, argv, &o);
    if (!o.seed_given)
        o.sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);

    run_state s = {0};
    sb_error err;
    int rc = 1;
    size_t n_prompt = 0;
    const char *stop_reason = "length";
    if (sb_model_load(o.model, &s.model, &err) != SB_OK) {
        sb_cli_error("%s", err.msg);
        goto done;
    }
    size_t plen = strlen(o.prompt);
    if (prompt_tokens(&s, &o, &n_prompt, &err) != SB_OK) {
        sb_cli_error("%s", err.msg);
        goto done;
    }
    s.gen_ids = malloc(((size_t)o.n_predict + 1) * sizeof(int32_t));
    if (!s.gen_ids) {
        sb_cli_error("out of memory");
        goto done;
    }
    sb_ctx_params cp = {.n_ctx = o.n_ctx, .n_threads = o.n_threads, .cache_type = o.cache_type};
    if (sb_ctx_create(s.model, &cp, &s.ctx, &err) != SB_OK ||
        sb_sampler_create(&o.sp, sb_model_n_vocab(s.model), &s.sampler, &err) != SB_OK ||
        sb_detok_create(s.model, plen == 0 && !o.chat, &s.detok, &err) != SB_OK ||
        sb_stop_create(o.stops, o.n_stops, &s.stop, &err) != SB_OK) {
        sb_cli_error("%s", err.msg);
        goto done;
    }
    if (n_prompt == 0) {
        sb_cli_error("the prompt is empty and the model adds no BOS token: nothing to start from");
        goto done;
    }
    if ((int32_t)n_prompt >= sb_ctx_n_ctx(s.ctx)) {
        sb_cli_error("the prompt has %zu tokens, the context holds %d (use --ctx to enlarge it, up to the model's %d)",
                     n_prompt, sb_ctx_n_ctx(s.ctx), sb_model_n_ctx_train(s.model));
        goto done;
    }
    for (size_t i = 0; i < n_prompt; i++)
        sb_sampler_accept(s.sampler, s.prompt_ids[i]);

    double t0 = sb_cli_now();
    if (sb_ctx_eval(s.ctx, s.prompt_ids, (int32_t)n_prompt, &err) != SB_OK) {
        sb_cli_error("%s", err.msg);
        goto done;
    }
    double t1 = sb_cli_now();
    int32_t n_gen = 0;
    char piece[256];
    size_t out_cap = sizeof(piece) + sb_stop_max_len(s.stop) + 1;
    char *out = s.out = malloc(out_cap);
    bool stopped = false;
    if (!out) {
        sb_cli_error("out of memory");
        goto done;
    }
    while (n_gen < o.n_predict && !stopped) {
        int32_t tok = sb_sampler_sample(s.sampler, sb_ctx_logits(s.ctx));
        if (sb_model_token_is_eog(s.model, tok)) {
            stop_reason = "eos";
            break;
        }
        s.gen_ids[n_gen++] = tok;
        sb_sampler_accept(s.sampler, tok);
        size_t n = sb_detok_push(s.detok, tok, false, piece, sizeof(piece));
        emit(&s, o.json, out, sb_stop_push(s.stop, piece, n, out, out_cap, &stopped));
        if (stopped) {
            stop_reason = "stop";
            break;
        }
        if (n_gen == o.n_predict)
            break;
        if (sb_ctx_n_past(s.ctx) >= sb_ctx_n_ctx(s.ctx)) {
            stop_reason = "context";
            fprintf(stderr, "\nswitchboard: the context is full (%d tokens); stopping\n", sb_ctx_n_ctx(s.ctx));
            break;
        }
        if (sb_ctx_eval(s.ctx, &tok, 1, &err) != SB_OK) {
            sb_cli_error("%s", err.msg);
            goto done;
        }
    }
    if (!stopped) {
        size_t n = sb_detok_flush(s.detok, piece, sizeof(piece));
        emit(&s, o.json, out, sb_stop_push(s.stop, piece, n, out, out_cap, &stopped));
        emit(&s, o.json, out, sb_stop_flush(s.stop, out, out_cap));
    }
    double t2 = sb_cli_now();
    if (o.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddItemToObject(j, "prompt_ids", ids_json(s.prompt_ids, (int32_t)n_prompt));
        cJSON_AddItemToObject(j, "gen_ids", ids_json(s.gen_ids, n_gen));
        cJSON_AddStringToObject(j, "text", s.text ? s.text : "");
        cJSON_AddStringToObject(j, "stop", stop_reason);
        char *str = cJSON_PrintUnformatted(j);
        puts(str);
        cJSON_free(str);
        cJSON_Delete(j);
    } else {
        putchar('\n');
        fflush(stdout);
    }
    fprintf(stderr, "prompt: %zu tokens in %.1f ms (%.1f tokens/s); generation: %d tokens in %.1f ms (%.1f tokens/s)\n",
            n_prompt, (t1 - t0) * 1e3, (double)n_prompt / (t1 - t0), n_gen, (t2 - t1) * 1e3,
            n_gen > 0 ? (double)n_gen / (t2 - t1) : 0.0);
    rc = 0;
done:
    run_state_free(&s);
    return rc;
}
