/*
 * account.c - the response cache, usage, request log and feedback around
 * the generation endpoints (see account.h).
 *
 * Cache keys. A key is the SHA-256 of everything that decides the answer:
 *   - the serving model's identity: its name and the size and modification
 *     time of its file (and of its chat template file): what a hot swap
 *     changes, by rename or in place, so a swapped model never answers
 *     from its predecessor's entries; the KV cache type (its rounding
 *     changes logits). Not the registry's in-process version number: two
 *     replicas sharing a Redis cache would never agree on it.
 *   - the prompts as token lists, after the chat template, the system
 *     prompt and the prompt library rendered them;
 *   - the resolved parameters (the registry's and the library prompt's
 *     defaults applied): sampling, max_tokens, n, stops, logprobs;
 *   - every other field of the body, canonically (top-level names sorted):
 *     response_format, grammar, tools, tool_choice ... whatever changes
 *     the output, without a list to keep in step with openai.c. Left out:
 *     stream and stream_options (a stream and a whole answer share the
 *     entry), model (the identity above replaces it: an alias and its
 *     model share), user (it only picks a route's arm, which the identity
 *     says), keep_alive, metadata, store, service_tier.
 * Never the API key: two callers asking the same question get the same
 * answer.
 *
 * Cache values. The answer's events (sb_stream_event: each token's text,
 * logprobs and alternatives; each choice's end with its counts), not a
 * rendered body: a hit is replayed through the same code a live answer
 * goes through (sb_srv_pull_replay feeds them to sb_oai_resp_add, or to
 * sb_oai_resp_chunk for a stream), so the whole body, or the chunks of a
 * stream, come out as the live ones did, with a new id and created time.
 * A hit reports every prompt token as cached.
 */
#include "server/account.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <microhttpd.h>

#include "base/base.h"
#include "gateway/cache.h"
#include "gateway/reqlog.h"
#include "gateway/usage.h"
#include "server/server-impl.h"

/* How long GET /v1/usage and POST /v1/feedback wait for the writer to
 * record what ended before them (read-your-writes). */
#define FLUSH_WAIT_MS 3000
/* A usage.db that cannot be opened or written is retried this often. */
#define RETRY_MS 1000

struct sb_srv_account {
    sb_srv *srv;
    sb_gw_cache *cache;   /* NULL: off */
    sb_gw_reqlog *log;    /* NULL: no request log */
    bool usage_wanted;    /* --state-dir given */
    pthread_mutex_t usage_mu; /* usage and usage_error: the writer reopens, the endpoints read */
    sb_gw_usage *usage;   /* NULL while it cannot be opened */
    char usage_error[512]; /* why not, or why the last write failed ("" when fine) */
    int64_t usage_retry_ms; /* the writer's */
    pthread_t thread;
    bool running;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    sb_srv_acct *head, *tail; /* ended requests for the writer (under mu) */
    size_t pending;           /* queued plus waiting for usage.db (under mu) */
    uint64_t enqueued, finished; /* requests handed to the writer / done with (under mu) */
    uint64_t dropped;
    bool stop;
};

struct sb_srv_acct {
    sb_srv_acct *next;
    sb_srv *srv;
    sb_gw_caller caller;
    sb_oai_kind kind;
    int32_t n, n_choices;
    char served[SB_GW_USAGE_NAME_MAX], requested[SB_GW_USAGE_NAME_MAX];
    char id[48];
    double price_prompt, price_completion;
    sb_srv_model_metrics *mm;
    double t_start, t_begin; /* monotonic: the request's head arrived; parsed */
    double ttft_s;           /* < 0: no token yet */
    int64_t end_ms;          /* wall clock */
    double latency_s;
    unsigned status;
    bool cacheable, hit, failed;
    bool refused;            /* before any model: logged, not counted */
    int32_t n_done;
    int64_t prompt, completion, cached;
    sb_gw_cache_key key;
    sb_srv_buf value;        /* the events, encoded, while they can still be stored */
    bool store;              /* value goes to the (remote) cache from the writer */
    char *prompt_text;       /* --log-prompts: the body's messages / prompt / input (cJSON_free) */
    sb_srv_buf *texts;       /* --log-prompts: each choice's text */
};

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int64_t wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- cache keys ------------------------------------------------------------- */

static void hash_i64(sb_gw_hasher *h, int64_t v) { sb_gw_hasher_update(h, &v, sizeof v); }
static void hash_f32(sb_gw_hasher *h, float v) { sb_gw_hasher_update(h, &v, sizeof v); }
static void hash_str(sb_gw_hasher *h, const char *s) { sb_gw_hasher_field(h, s ? s : "", s ? strlen(s) : 0); }

static int by_name(const void *a, const void *b) {
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

static bool excluded(const char *name) {
    static const char *const skip[] = {"stream", "stream_options", "model", "user", "keep_alive",
                                       "metadata", "store", "service_tier"};
    for (size_t i = 0; i < SB_ARRAY_LEN(skip); i++)
        if (strcmp(name, skip[i]) == 0)
            return true;
    return false;
}

/* The body's fields, names sorted, each as its canonical JSON text. */
static bool hash_body(sb_gw_hasher *h, const cJSON *root) {
    size_t n = 0, k = 0;
    for (const cJSON *x = root->child; x; x = x->next)
        n++;
    const cJSON **items = sb_calloc(n ? n : 1, sizeof *items);
    if (!items)
        return false;
    for (const cJSON *x = root->child; x; x = x->next)
        if (x->string && !excluded(x->string))
            items[k++] = x;
    qsort(items, k, sizeof *items, by_name);
    bool ok = true;
    for (size_t i = 0; ok && i < k; i++) {
        char *text = cJSON_PrintUnformatted(items[i]);
        ok = text != NULL;
        hash_str(h, items[i]->string);
        hash_str(h, text);
        cJSON_free(text);
    }
    sb_free(items);
    return ok;
}

/* Whether the request is deterministic (greedy, or a seed fixed by the
 * client, the registry entry or the library prompt) and, if so, its key. */
static bool cache_key(const sb_srv *srv, const sb_oai_req *r, const char *served, const char *body, size_t len,
                      sb_gw_cache_key *key) {
    const sb_regfile_model *cfg = sb_reg_lease_config(r->lease);
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root)
        return false;
    bool seeded = cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(root, "seed")) ||
                  (cfg->params.set & SB_PARAM_SEED) || (r->library && (r->library->params.set & SB_PARAM_SEED));
    if (!(r->sampling.temperature <= 0 || seeded)) {
        cJSON_Delete(root);
        return false;
    }
    sb_gw_hasher h;
    sb_gw_hasher_init(&h);
    hash_str(&h, "switchboard response cache 1");
    hash_i64(&h, r->kind);
    hash_str(&h, served);
    hash_i64(&h, (int64_t)cfg->file.size);
    hash_i64(&h, cfg->file.mtime_ns);
    hash_i64(&h, cfg->chat_template ? (int64_t)cfg->chat_template_file.size : -1);
    hash_i64(&h, cfg->chat_template ? cfg->chat_template_file.mtime_ns : -1);
    hash_i64(&h, cfg->has_cache_type ? cfg->cache_type : srv->p.engine.cache_type);
    hash_i64(&h, r->n_prompts);
    for (int32_t i = 0; i < r->n_prompts; i++)
        sb_gw_hasher_field(&h, r->prompts[i], (size_t)r->prompt_lens[i] * sizeof(int32_t));
    const sb_sampler_params *sp = &r->sampling;
    hash_f32(&h, sp->temperature);
    hash_i64(&h, sp->top_k);
    hash_f32(&h, sp->top_p);
    hash_f32(&h, sp->min_p);
    hash_f32(&h, sp->repeat_penalty);
    hash_i64(&h, sp->repeat_last_n);
    hash_f32(&h, sp->frequency_penalty);
    hash_f32(&h, sp->presence_penalty);
    hash_i64(&h, seeded ? (int64_t)sp->seed : 0);
    hash_i64(&h, r->n_logit_bias);
    for (int32_t i = 0; i < r->n_logit_bias; i++) {
        hash_i64(&h, r->logit_bias[i].token);
        hash_f32(&h, r->logit_bias[i].bias);
    }
    hash_i64(&h, r->max_tokens);
    hash_i64(&h, r->n);
    hash_i64(&h, (int64_t)r->n_stops);
    for (size_t i = 0; i < r->n_stops; i++)
        hash_str(&h, r->stops[i]);
    hash_i64(&h, r->logprobs);
    hash_i64(&h, r->top_logprobs);
    bool ok = hash_body(&h, root);
    cJSON_Delete(root);
    return sb_gw_hasher_final(&h, key) && ok;
}

/* ---- cache values: the events of an answer ------------------------------------ */

/* Per event: choice, done, finish, token, logprob, n_top, n_top (token,
 * logprob) pairs, n_prompt, n_generated, text_len, text. Native byte order:
 * replicas sharing a Redis run on one architecture (a foreign value fails
 * the checks of decode and is a miss). */
#define VALUE_MAGIC "SBR1"

static void put32(sb_srv_buf *b, int32_t v) { sb_srv_buf_append(b, (const char *)&v, sizeof v); }

static void encode(sb_srv_buf *b, const sb_stream_event *ev) {
    if (b->len == 0)
        sb_srv_buf_append(b, VALUE_MAGIC, 4);
    put32(b, ev->index);
    put32(b, ev->done);
    put32(b, ev->finish);
    put32(b, ev->token);
    sb_srv_buf_append(b, (const char *)&ev->logprob, sizeof ev->logprob);
    put32(b, ev->n_top);
    for (int32_t i = 0; i < ev->n_top; i++) {
        put32(b, ev->top[i].token);
        sb_srv_buf_append(b, (const char *)&ev->top[i].logprob, sizeof ev->top[i].logprob);
    }
    put32(b, ev->n_prompt);
    put32(b, ev->n_generated);
    put32(b, (int32_t)ev->text_len);
    sb_srv_buf_append(b, ev->text, ev->text_len);
}

typedef struct reader {
    const uint8_t *p, *end;
    bool bad;
} reader;

static int32_t get32(reader *r) {
    int32_t v = 0;
    if (r->end - r->p < 4)
        r->bad = true;
    else
        memcpy(&v, r->p, 4);
    r->p += r->bad ? 0 : 4;
    return v;
}

static float getf(reader *r) {
    int32_t bits = get32(r);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* One more event at the end of out (NULL if out of memory). */
static sb_srv_replayed *replay_push(sb_srv_replay *out) {
    if (out->n == out->cap) {
        size_t cap = out->cap ? out->cap * 2 : 64;
        sb_srv_replayed *e = sb_realloc(out->events, cap * sizeof *e);
        if (!e)
            return NULL;
        out->events = e;
        out->cap = cap;
    }
    sb_srv_replayed *e = &out->events[out->n++];
    memset(e, 0, sizeof *e);
    return e;
}

/* The events of a value into *out, checked against the request (its
 * choices); false (out empty) if anything does not fit (a value written by
 * another version, a foreign key): that is a miss. Every prompt token of a
 * hit counts as cached. */
static bool decode(const void *value, size_t len, int32_t n_choices, sb_srv_replay *out) {
    reader r = {(const uint8_t *)value, (const uint8_t *)value + len, len < 4 || memcmp(value, VALUE_MAGIC, 4) != 0};
    r.p += 4;
    memset(out, 0, sizeof *out);
    int32_t n_done = 0;
    while (!r.bad && r.p < r.end) {
        int32_t choice = get32(&r), done = get32(&r), finish = get32(&r), token = get32(&r);
        float logprob = getf(&r);
        int32_t n_top = get32(&r);
        if (r.bad || choice < 0 || choice >= n_choices || n_top < 0 || n_top > 20 ||
            (finish != SB_FINISHED_NOT && finish != SB_FINISHED_STOP && finish != SB_FINISHED_LENGTH)) {
            r.bad = true;
            break;
        }
        sb_token_logprob top[20];
        for (int32_t i = 0; i < n_top; i++) {
            top[i].token = get32(&r);
            top[i].logprob = getf(&r);
        }
        int32_t n_prompt = get32(&r), n_generated = get32(&r), text_len = get32(&r);
        if (r.bad || text_len < 0 || text_len > r.end - r.p) {
            r.bad = true;
            break;
        }
        sb_srv_replayed *e = replay_push(out);
        char *text = e ? sb_strndup((const char *)r.p, (size_t)text_len) : NULL;
        if (!text) {
            r.bad = true;
            break;
        }
        e->ev = (sb_stream_event){.index = choice, .done = done != 0, .token = token, .text = text,
                                  .text_len = (size_t)text_len, .logprob = logprob, .top = e->top, .n_top = n_top,
                                  .finish = (sb_finish_reason)finish, .n_prompt = n_prompt,
                                  .n_prompt_cached = n_prompt, .n_generated = n_generated};
        memcpy(e->top, top, (size_t)n_top * sizeof top[0]);
        r.p += text_len;
        n_done += e->ev.done;
    }
    if (r.bad || n_done != n_choices) {
        sb_srv_replay_free(out);
        return false;
    }
    return true;
}

/* ---- one request ------------------------------------------------------------ */

/* The part of the body a --log-prompts line shows. */
static char *prompt_text(const char *body, size_t len) {
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root)
        return NULL;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!p)
        p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p)
        p = cJSON_GetObjectItemCaseSensitive(root, "input");
    char *text = p ? cJSON_PrintUnformatted(p) : NULL;
    cJSON_Delete(root);
    return text;
}

sb_srv_acct *sb_srv_acct_begin(sb_srv *srv, const sb_oai_req *req, const char *body, size_t len, double t_start) {
    sb_srv_account *A = srv->account;
    if (!A)
        return NULL;
    sb_srv_acct *a = sb_calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->srv = srv;
    a->caller = req->caller;
    a->kind = req->kind;
    a->n = req->n > 0 ? req->n : 1;
    a->n_choices = req->n_choices;
    a->t_start = t_start;
    a->t_begin = mono_s();
    a->ttft_s = -1;
    sb_served served;
    sb_held_served(req->held, &served);
    snprintf(a->served, sizeof a->served, "%s", served.model);
    snprintf(a->requested, sizeof a->requested, "%s", served.route[0] ? served.route : a->served);
    const sb_regfile_model *cfg = sb_reg_lease_config(req->lease);
    a->price_prompt = cfg->price_prompt;
    a->price_completion = cfg->price_completion;
    a->mm = sb_srv_metrics_model(&srv->metrics, a->served);
    if (A->cache && req->kind != SB_OAI_EMBEDDING)
        a->cacheable = cache_key(srv, req, served.model, body, len, &a->key);
    if (A->log && srv->p.log_prompts) {
        a->prompt_text = prompt_text(body, len);
        a->texts = sb_calloc((size_t)a->n_choices, sizeof *a->texts);
    }
    return a;
}

bool sb_srv_acct_lookup(sb_srv_acct *a, sb_srv_replay *out) {
    if (!a || !a->cacheable)
        return false;
    void *value;
    size_t len;
    a->hit = false;
    if (sb_gw_cache_get(a->srv->account->cache, &a->key, &value, &len)) {
        a->hit = decode(value, len, a->n_choices, out);
        sb_free(value);
    }
    if (a->mm)
        sb_srv_metrics_cache(a->mm, a->hit);
    return a->hit;
}

void sb_srv_acct_id(sb_srv_acct *a, const char *id) {
    if (a)
        snprintf(a->id, sizeof a->id, "%s", id);
}

void sb_srv_acct_event(sb_srv_acct *a, const sb_stream_event *ev) {
    if (!a)
        return;
    if (a->hit && a->ttft_s < 0) /* the answer is there at once */
        a->ttft_s = mono_s() - a->t_start;
    if (ev->done) {
        if (ev->index % a->n == 0) { /* the prompt counts once, however many choices it has (as usage says) */
            a->prompt += ev->n_prompt;
            a->cached += ev->n_prompt_cached;
        }
        a->completion += ev->n_generated;
        a->n_done++;
        if (ev->finish == SB_FINISHED_ERROR || ev->finish == SB_FINISHED_CANCELLED)
            a->failed = true;
        if (!a->hit && ev->ttft_s > 0) {
            double t = a->t_begin - a->t_start + ev->ttft_s; /* the engine's, from submission */
            if (a->ttft_s < 0 || t < a->ttft_s)
                a->ttft_s = t;
        }
    }
    if (a->cacheable && !a->hit && !a->failed)
        encode(&a->value, ev);
    if (a->texts && ev->index >= 0 && ev->index < a->n_choices)
        sb_srv_buf_append(&a->texts[ev->index], ev->text, ev->text_len);
}

void sb_srv_acct_headers(const sb_srv_acct *a, struct MHD_Response *r) {
    if (a && r && a->cacheable)
        MHD_add_response_header(r, "x-switchboard-cache", a->hit ? "hit" : "miss");
}

static void acct_free(sb_srv_acct *a) {
    sb_srv_buf_free(&a->value);
    cJSON_free(a->prompt_text);
    for (int32_t i = 0; a->texts && i < a->n_choices; i++)
        sb_srv_buf_free(&a->texts[i]);
    sb_free(a->texts);
    sb_free(a);
}

/* Drops a's cache value and texts: what stays is what usage needs. */
static void acct_trim(sb_srv_acct *a) {
    sb_srv_buf_free(&a->value);
    cJSON_free(a->prompt_text);
    a->prompt_text = NULL;
    for (int32_t i = 0; a->texts && i < a->n_choices; i++)
        sb_srv_buf_free(&a->texts[i]);
    sb_free(a->texts);
    a->texts = NULL;
}

void sb_srv_acct_refused(sb_srv *srv, sb_oai_kind kind, const sb_gw_caller *caller, const char *body, size_t len,
                         double t_start, unsigned status) {
    sb_srv_account *A = srv->account;
    if (!A || !A->log)
        return;
    sb_srv_acct *a = sb_calloc(1, sizeof *a);
    if (!a)
        return;
    a->srv = srv;
    a->caller = *caller;
    a->kind = kind;
    a->refused = true;
    a->t_start = t_start;
    a->ttft_s = -1;
    cJSON *root = cJSON_ParseWithLength(body ? body : "", len);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (cJSON_IsString(m))
        snprintf(a->requested, sizeof a->requested, "%s", m->valuestring);
    cJSON_Delete(root);
    if (srv->p.log_prompts)
        a->prompt_text = prompt_text(body ? body : "", len);
    sb_srv_acct_end(a, status);
}

void sb_srv_acct_end(sb_srv_acct *a, unsigned status) {
    if (!a)
        return;
    sb_srv_account *A = a->srv->account;
    a->status = status;
    a->latency_s = mono_s() - a->t_start;
    a->end_ms = wall_ms();
    bool store = a->cacheable && !a->hit && status == MHD_HTTP_OK && !a->failed && a->n_done == a->n_choices &&
                 !a->value.failed && a->value.len > 0;
    if (store && !sb_gw_cache_remote(A->cache)) {
        sb_gw_cache_put(A->cache, &a->key, a->value.p, a->value.len); /* microseconds: now, so the next request hits */
        store = false;
    }
    a->store = store;
    if (!store)
        sb_srv_buf_free(&a->value);
    if ((!A->log && !A->usage_wanted && !store) || (a->refused && !A->log)) {
        acct_free(a);
        return;
    }
    pthread_mutex_lock(&A->mu);
    bool full = A->pending >= SB_SRV_ACCT_QUEUE;
    uint64_t dropped = full ? ++A->dropped : 0;
    if (!full) {
        if (A->tail)
            A->tail->next = a;
        else
            A->head = a;
        A->tail = a;
        A->pending++;
        A->enqueued++;
        pthread_cond_signal(&A->work);
    }
    pthread_mutex_unlock(&A->mu);
    if (full) {
        if ((dropped & (dropped - 1)) == 0) /* 1, 2, 4, ...: a flood is not a flood of lines */
            sb__srv_log(a->srv, "accounting: %d requests wait for the writer (usage.db slow or locked?): this one's "
                        "usage and log line are dropped (%llu so far)", SB_SRV_ACCT_QUEUE, (unsigned long long)dropped);
        acct_free(a);
    }
}

/* ---- the writer ------------------------------------------------------------- */

static cJSON *add_text(cJSON *o, const char *name, const char *s) {
    return s && *s ? cJSON_AddStringToObject(o, name, s) : cJSON_AddNullToObject(o, name);
}

static void write_log_line(sb_srv_account *A, const sb_srv_acct *a) {
    char when[40];
    time_t t = (time_t)(a->end_ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + n, sizeof when - n, ".%03dZ", (int)(a->end_ms % 1000));
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "time", when);
    add_text(o, "request_id", a->caller.request_id);
    add_text(o, "id", a->id);
    cJSON_AddStringToObject(o, "key", a->caller.key);
    add_text(o, "tier", a->caller.tier);
    cJSON_AddStringToObject(o, "endpoint", a->kind == SB_OAI_CHAT ? "/v1/chat/completions"
                                           : a->kind == SB_OAI_COMPLETION ? "/v1/completions" : "/v1/embeddings");
    add_text(o, "model_requested", a->requested);
    add_text(o, "model", a->served);
    cJSON_AddNumberToObject(o, "status", a->status);
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)a->prompt);
    cJSON_AddNumberToObject(o, "completion_tokens", (double)a->completion);
    cJSON_AddNumberToObject(o, "cached_tokens", (double)a->cached);
    if (a->ttft_s >= 0)
        cJSON_AddNumberToObject(o, "ttft_ms", a->ttft_s * 1e3);
    else
        cJSON_AddNullToObject(o, "ttft_ms");
    cJSON_AddNumberToObject(o, "latency_ms", a->latency_s * 1e3);
    if (a->cacheable)
        cJSON_AddStringToObject(o, "cache", a->hit ? "hit" : "miss");
    else
        cJSON_AddNullToObject(o, "cache");
    if (A->srv->p.log_prompts) {
        cJSON *p = a->prompt_text ? cJSON_Parse(a->prompt_text) : NULL;
        cJSON_AddItemToObject(o, "prompt", p ? p : cJSON_CreateNull());
        cJSON *c = cJSON_AddArrayToObject(o, "completion");
        for (int32_t i = 0; a->texts && i < a->n_choices; i++)
            cJSON_AddItemToArray(c, cJSON_CreateString(a->texts[i].p ? a->texts[i].p : ""));
    }
    char *line = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!line)
        return;
    size_t len = strlen(line);
    line[len] = '\n'; /* over the NUL: the length says where the line ends */
    sb_error err;
    if (!sb_gw_reqlog_write(A->log, line, len + 1, &err) && err.msg[0])
        sb__srv_log(A->srv, "%s (lines are dropped until it works again)", err.msg);
    cJSON_free(line);
}

static sb_gw_usage_rec usage_rec(const sb_srv_acct *a) {
    bool ok = a->status == MHD_HTTP_OK && !a->failed;
    return (sb_gw_usage_rec){
        .time_s = a->end_ms / 1000,
        .key = a->caller.key,
        .model = a->served,
        .requested = a->requested,
        .id = ok && a->id[0] ? a->id : NULL,
        .prompt = a->prompt,
        .completion = a->completion,
        .cached = a->cached,
        .cache_hit = a->hit,
        .error = !ok,
        .latency_ms = a->latency_s * 1e3,
        .ttft_ms = a->ttft_s >= 0 ? a->ttft_s * 1e3 : -1,
        /* A cache hit cost no compute. */
        .cost = a->hit ? 0 : ((double)a->prompt * a->price_prompt + (double)a->completion * a->price_completion) / 1e6,
    };
}

/* Opens usage.db when it is not (at start, or after it failed), at most
 * every RETRY_MS; a new reason is logged once. */
static bool usage_ready(sb_srv_account *A) {
    if (A->usage)
        return true;
    int64_t now = wall_ms();
    if (now < A->usage_retry_ms)
        return false;
    A->usage_retry_ms = now + RETRY_MS;
    sb_error err;
    if (sb_gw_usage_open(A->srv->p.state_dir, &A->usage, &err) == SB_OK) {
        if (A->usage_error[0])
            sb__srv_log(A->srv, "usage: %s/%s is usable again", A->srv->p.state_dir, SB_GW_USAGE_FILE);
        A->usage_error[0] = '\0';
        return true;
    }
    if (strcmp(err.msg, A->usage_error) != 0)
        sb__srv_log(A->srv, "usage: %s; usage is kept in memory (at most %d requests) and retried; the server keeps "
                    "serving", err.msg, SB_SRV_ACCT_QUEUE);
    snprintf(A->usage_error, sizeof A->usage_error, "%s", err.msg);
    return false;
}

/* Records the list's usage in one transaction; false (nothing recorded) if
 * usage.db is unavailable, locked past the busy wait, or failing. */
static bool record_usage_locked(sb_srv_account *A, sb_srv_acct *list, size_t n) {
    if (!usage_ready(A))
        return false;
    sb_gw_usage_rec *recs = sb_calloc(n ? n : 1, sizeof *recs);
    if (!recs)
        return false;
    size_t i = 0;
    for (sb_srv_acct *a = list; a; a = a->next)
        if (!a->refused)
            recs[i++] = usage_rec(a);
    sb_error err;
    sb_status st = sb_gw_usage_record(A->usage, recs, i, &err);
    sb_free(recs);
    if (st == SB_OK)
        return true;
    if (strcmp(err.msg, A->usage_error) != 0)
        sb__srv_log(A->srv, "usage: %s; %zu requests wait and are retried; the server keeps serving", err.msg, n);
    snprintf(A->usage_error, sizeof A->usage_error, "%s", err.msg);
    if (st == SB_ERR_FORMAT) { /* reopened on the next try: maybe it was replaced */
        sb_gw_usage_close(A->usage);
        A->usage = NULL;
    }
    A->usage_retry_ms = wall_ms() + RETRY_MS;
    return false;
}

static bool record_usage(sb_srv_account *A, sb_srv_acct *list, size_t n) {
    pthread_mutex_lock(&A->usage_mu);
    bool ok = record_usage_locked(A, list, n);
    pthread_mutex_unlock(&A->usage_mu);
    return ok;
}

static void *writer_main(void *arg) {
    sb_srv_account *A = arg;
    sb_srv_acct *waiting = NULL; /* written to cache and log; usage.db still owes them */
    size_t n_waiting = 0;
    pthread_mutex_lock(&A->mu);
    for (;;) {
        while (!A->head && !A->stop && !n_waiting)
            pthread_cond_wait(&A->work, &A->mu);
        if (!A->head && n_waiting && !A->stop) { /* only a retry is due: not before RETRY_MS */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += RETRY_MS / 1000;
            pthread_cond_timedwait(&A->work, &A->mu, &ts);
        }
        sb_srv_acct *list = A->head;
        A->head = A->tail = NULL;
        bool stop = A->stop;
        pthread_mutex_unlock(&A->mu);

        size_t n_new = 0;
        for (sb_srv_acct *a = list; a; a = a->next, n_new++) {
            if (a->store)
                sb_gw_cache_put(A->cache, &a->key, a->value.p, a->value.len);
            if (A->log)
                write_log_line(A, a);
            acct_trim(a);
        }
        /* The new ones join those still waiting for usage.db, in order. */
        sb_srv_acct **end = &waiting;
        while (*end)
            end = &(*end)->next;
        *end = list;
        n_waiting += n_new;
        size_t n_done = 0;
        if (n_waiting && (!A->usage_wanted || record_usage(A, waiting, n_waiting) || stop)) {
            if (A->usage_wanted && stop && A->usage_error[0])
                sb__srv_log(A->srv, "usage: stopping with %zu requests unrecorded: %s", n_waiting, A->usage_error);
            while (waiting) {
                sb_srv_acct *next = waiting->next;
                acct_free(waiting);
                waiting = next;
            }
            n_done = n_waiting;
            n_waiting = 0;
        }
        pthread_mutex_lock(&A->mu);
        A->pending -= n_done;
        A->finished += n_done;
        pthread_cond_broadcast(&A->done);
        if (stop && !A->head && !n_waiting)
            break;
    }
    pthread_mutex_unlock(&A->mu);
    return NULL;
}

/* Waits (bounded) until everything that ended before now is recorded. */
static void flush(sb_srv_account *A) {
    pthread_mutex_lock(&A->mu);
    uint64_t target = A->enqueued;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += FLUSH_WAIT_MS / 1000;
    while (A->finished < target && pthread_cond_timedwait(&A->done, &A->mu, &ts) == 0)
        ;
    pthread_mutex_unlock(&A->mu);
}

/* ---- lifecycle ------------------------------------------------------------- */

sb_status sb_srv_account_start(sb_srv *srv, sb_error *err) {
    const sb_srv_params *p = &srv->p;
    /* --redis alone shares the cache through it as well as the limits. */
    const char *backend = p->cache ? p->cache : p->redis;
    bool cache = backend && strcmp(backend, "off") != 0;
    if (!cache && !p->state_dir && !p->request_log)
        return SB_OK;
    sb_srv_account *A = sb_calloc(1, sizeof *A);
    if (!A)
        return sb_fail(err, SB_ERR_NOMEM, "accounting: out of memory");
    A->srv = srv;
    pthread_mutex_init(&A->mu, NULL);
    pthread_cond_init(&A->work, NULL);
    pthread_cond_init(&A->done, NULL);
    pthread_mutex_init(&A->usage_mu, NULL);
    srv->account = A;
    sb_status st = SB_OK;
    if (cache) {
        sb_gw_cache_params cp = sb_gw_cache_default_params();
        cp.backend = backend;
        if (p->cache_bytes)
            cp.max_bytes = p->cache_bytes;
        if (p->cache_ttl_ms)
            cp.ttl_ms = p->cache_ttl_ms;
        st = sb_gw_cache_create(&cp, &A->cache, err);
    }
    if (st == SB_OK && p->request_log)
        st = sb_gw_reqlog_open(p->request_log, p->request_log_max_bytes, &A->log, err);
    if (st == SB_OK && p->state_dir) {
        A->usage_wanted = true;
        usage_ready(A); /* a failure is logged and retried by the writer */
    }
    if (st == SB_OK) {
        if (pthread_create(&A->thread, NULL, writer_main, A) != 0)
            st = sb_fail(err, SB_ERR_NOMEM, "accounting: cannot start the writer thread");
        else
            A->running = true;
    }
    if (st != SB_OK)
        sb_srv_account_stop(srv);
    return st;
}

void sb_srv_account_stop(sb_srv *srv) {
    sb_srv_account *A = srv->account;
    if (!A)
        return;
    if (A->running) {
        pthread_mutex_lock(&A->mu);
        A->stop = true;
        pthread_cond_signal(&A->work);
        pthread_mutex_unlock(&A->mu);
        pthread_join(A->thread, NULL);
    }
    sb_gw_cache_free(A->cache);
    sb_gw_reqlog_close(A->log);
    sb_gw_usage_close(A->usage);
    pthread_cond_destroy(&A->work);
    pthread_cond_destroy(&A->done);
    pthread_mutex_destroy(&A->mu);
    pthread_mutex_destroy(&A->usage_mu);
    sb_free(A);
    srv->account = NULL;
}

/* ---- endpoints ------------------------------------------------------------- */

void sb_srv_account_metrics(sb_srv *srv, sb_srv_buf *out) {
    sb_srv_account *A = srv->account;
    if (!A)
        return;
    pthread_mutex_lock(&A->mu);
    uint64_t dropped = A->dropped, pending = A->pending;
    pthread_mutex_unlock(&A->mu);
    sb_gw_cache_stats cs = {0};
    if (A->cache)
        sb_gw_cache_stats_get(A->cache, &cs);
    const struct {
        const char *name, *type, *help;
        uint64_t v;
    } figures[] = {
        {"switchboard_cache_entries", "gauge", "Entries in the in-memory response cache.", cs.entries},
        {"switchboard_cache_bytes", "gauge", "Bytes the in-memory response cache holds (bounded by --cache-bytes).",
         cs.bytes},
        {"switchboard_cache_evictions_total", "counter", "Response cache entries dropped for room.", cs.evictions},
        {"switchboard_cache_expired_total", "counter", "Response cache entries dropped for age (--cache-ttl).",
         cs.expired},
        {"switchboard_cache_backend_errors_total", "counter",
         "Redis cache commands that failed or timed out (each a miss, never an error).", cs.backend_errors},
        {"switchboard_accounting_pending", "gauge", "Ended requests whose usage and log line are not written yet.",
         pending},
        {"switchboard_accounting_dropped_total", "counter",
         "Requests whose usage and log line were dropped (the writer's queue was full).", dropped},
    };
    for (size_t i = 0; i < SB_ARRAY_LEN(figures); i++)
        sb_srv_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", figures[i].name, figures[i].help,
                          figures[i].name, figures[i].type, figures[i].name, (unsigned long long)figures[i].v);
}

/* Waits for the writer, then takes usage.db (unlock with pthread_mutex_unlock(&usage_mu));
 * NULL with e set when usage is off or unavailable. */
static sb_gw_usage *usage_take(sb_srv *srv, sb_oai_err *e) {
    sb_srv_account *A = srv->account;
    if (!A || !A->usage_wanted) {
        sb_oai_err_set(e, MHD_HTTP_NOT_FOUND, "invalid_request_error", "usage_off", NULL,
                       "usage is not recorded: start the server with --state-dir DIR");
        return NULL;
    }
    flush(A);
    pthread_mutex_lock(&A->usage_mu);
    if (A->usage)
        return A->usage;
    sb_oai_err_set(e, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", "usage_unavailable", NULL,
                   "usage is unavailable: %s", A->usage_error);
    pthread_mutex_unlock(&A->usage_mu);
    return NULL;
}

static cJSON *row_json(const sb_gw_usage_row *r, sb_gw_usage_by by) {
    static const char *const names[] = {[SB_GW_BY_MODEL] = "model", [SB_GW_BY_KEY] = "key", [SB_GW_BY_DAY] = "day"};
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, names[by], r->group);
    if (by == SB_GW_BY_MODEL)
        add_text(o, "route", r->arm);
    cJSON_AddNumberToObject(o, "requests", (double)r->requests);
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)r->prompt);
    cJSON_AddNumberToObject(o, "completion_tokens", (double)r->completion);
    cJSON_AddNumberToObject(o, "cached_tokens", (double)r->cached);
    cJSON_AddNumberToObject(o, "cache_hits", (double)r->cache_hits);
    cJSON_AddNumberToObject(o, "errors", (double)r->errors);
    cJSON_AddNumberToObject(o, "latency_ms_mean", r->latency_n ? r->latency_ms_sum / (double)r->latency_n : 0);
    if (r->ttft_n)
        cJSON_AddNumberToObject(o, "ttft_ms_mean", r->ttft_ms_sum / (double)r->ttft_n);
    else
        cJSON_AddNullToObject(o, "ttft_ms_mean");
    cJSON_AddNumberToObject(o, "cost", r->cost);
    if (r->rating_n)
        cJSON_AddNumberToObject(o, "rating_mean", r->rating_sum / (double)r->rating_n);
    else
        cJSON_AddNullToObject(o, "rating_mean");
    cJSON_AddNumberToObject(o, "rating_count", (double)r->rating_n);
    return o;
}

static bool put_json(cJSON *o, sb_srv_buf *out, sb_oai_err *e) {
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text) {
        sb_oai_err_set(e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, NULL, "out of memory");
        return false;
    }
    sb_srv_buf_puts(out, text);
    cJSON_free(text);
    return true;
}

bool sb_srv_account_usage(sb_srv *srv, const char *key, const char *by, const char *since, sb_srv_buf *out,
                          sb_oai_err *e) {
    sb_gw_usage_by b = SB_GW_BY_MODEL;
    if (by && !sb_gw_usage_by_parse(by, &b)) {
        char q[216];
        sb_oai_err_set(e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "invalid_value", "by",
                       "'by' must be model, key or day, not '%s'", sb_oai_quote(by, strlen(by), 200, q, sizeof q));
        return false;
    }
    if (since && !sb_gw_usage_day_valid(since)) {
        char q[216];
        sb_oai_err_set(e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "invalid_value", "since",
                       "'since' must be a date YYYY-MM-DD, not '%s'", sb_oai_quote(since, strlen(since), 200, q, sizeof q));
        return false;
    }
    sb_gw_usage *u = usage_take(srv, e);
    if (!u)
        return false;
    sb_gw_usage_row *rows;
    size_t n;
    sb_error err;
    sb_status st = sb_gw_usage_query(u, b, since, key, &rows, &n, &err);
    pthread_mutex_unlock(&srv->account->usage_mu);
    if (st != SB_OK) {
        sb_oai_err_set(e, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", "usage_unavailable", NULL, "%s", err.msg);
        return false;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "usage");
    cJSON_AddStringToObject(o, "by", by ? by : "model");
    add_text(o, "since", since);
    if (key)
        cJSON_AddStringToObject(o, "key", key);
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(data, row_json(&rows[i], b));
    sb_free(rows);
    return put_json(o, out, e);
}

static bool bad_body(sb_oai_err *e, const char *param, const char *fmt, const char *what) {
    sb_oai_err_set(e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", param ? "invalid_value" : "invalid_json", param,
                   fmt, what);
    return false;
}

bool sb_srv_account_feedback(sb_srv *srv, const char *key, const char *body, size_t len, sb_srv_buf *out,
                             sb_oai_err *e) {
    cJSON *root = cJSON_ParseWithLength(body ? body : "", len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return bad_body(e, NULL, "the body must be a JSON object {\"id\", \"rating\", \"comment\"}%s", "");
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(root, "id"),
                *rating = cJSON_GetObjectItemCaseSensitive(root, "rating"),
                *comment = cJSON_GetObjectItemCaseSensitive(root, "comment");
    bool ok = false;
    sb_gw_usage *u;
    if (!cJSON_IsString(id) || !id->valuestring[0] || strlen(id->valuestring) > 100)
        bad_body(e, "id", "'id' must be the id of a completion (a string such as \"chatcmpl-...\")%s", "");
    else if (!cJSON_IsNumber(rating) || !(rating->valuedouble >= SB_GW_RATING_MIN) ||
             !(rating->valuedouble <= SB_GW_RATING_MAX))
        bad_body(e, "rating", "'rating' must be a number from -1 (bad) to 1 (good)%s", "");
    else if (comment && !cJSON_IsNull(comment) && (!cJSON_IsString(comment) || strlen(comment->valuestring) > 4096))
        bad_body(e, "comment", "'comment' must be a string of at most 4096 bytes%s", "");
    else if ((u = usage_take(srv, e))) {
        char model[SB_GW_USAGE_NAME_MAX];
        sb_error err;
        sb_status st = sb_gw_usage_feedback(u, id->valuestring, key, rating->valuedouble,
                                            cJSON_IsString(comment) ? comment->valuestring : NULL, model, &err);
        pthread_mutex_unlock(&srv->account->usage_mu);
        if (st == SB_ERR_NOT_FOUND)
            sb_oai_err_set(e, MHD_HTTP_NOT_FOUND, "invalid_request_error", "completion_not_found", "id", "%s", err.msg);
        else if (st != SB_OK)
            sb_oai_err_set(e, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", "usage_unavailable", NULL, "%s", err.msg);
        else {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "object", "feedback");
            cJSON_AddStringToObject(o, "id", id->valuestring);
            cJSON_AddStringToObject(o, "model", model);
            cJSON_AddNumberToObject(o, "rating", rating->valuedouble);
            ok = put_json(o, out, e);
        }
    }
    cJSON_Delete(root);
    return ok;
}
