/*
 * switchboard.c - the high-level public API (include/switchboard.h, "the
 * high-level API"): a registry and its executor behind one handle, and
 * generation requests by model name.
 *
 * How it fits: routing a name takes a registry lease (the model, chat
 * formatter and engine that serve it) inside a held model (sb_held_t,
 * reference counted); a request holds a reference to it for its whole life,
 * so a swap or an eviction never frees them underneath. A request turns
 * each input into prompt tokens and submits one engine request per input.
 * sb_switchboard_submit is acquire, sb_held_submit, release. The engine's callback
 * runs on an executor thread: it copies the event into the request's queue
 * and returns at once; the caller's thread takes events from the queue
 * (sb_request_next), so embedder code never runs on an executor thread and
 * may block. The blocking calls and batch_infer are that loop.
 *
 * Lifetime: a request is reference counted (the caller's reference and one
 * per engine submission still owed its done event), so the caller may free
 * it while the engine still has events for it; the lease goes with the last
 * reference. The handle counts the request and held objects alive, and
 * sb_switchboard_free cancels them and waits for that count to reach zero
 * before it frees the registry.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "api/api-internal.h"
#include "base/base.h"
#include "engine/engine.h"
#include "engine/executor.h"
#include "model/chat.h"
#include "registry/registry.h"
#include "sampling/json_schema.h"

_Static_assert((int)SB_FINISHED_NOT == (int)SB_FINISH_NONE && (int)SB_FINISHED_STOP == (int)SB_FINISH_STOP &&
                   (int)SB_FINISHED_LENGTH == (int)SB_FINISH_LENGTH &&
                   (int)SB_FINISHED_CANCELLED == (int)SB_FINISH_CANCELLED &&
                   (int)SB_FINISHED_ERROR == (int)SB_FINISH_ERROR,
               "the public finish reasons are the engine's");
_Static_assert(sizeof(sb_token_logprob) == sizeof(sb_top_logprob), "the public logprob pair is the engine's");
_Static_assert((int)SB_MODEL_UNLOADED == (int)SB_REG_UNLOADED && (int)SB_MODEL_LOADING == (int)SB_REG_LOADING &&
                   (int)SB_MODEL_LOADED == (int)SB_REG_LOADED && (int)SB_MODEL_FAILED == (int)SB_REG_FAILED,
               "the public model states are the registry's");

#define MAX_TOP 20

struct sb_switchboard {
    sb_executor *exec;
    sb_registry *reg;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* signalled when a request object is destroyed */
    char default_name[128]; /* under mu */
    sb_profile last;        /* under mu */
    int32_t held;           /* requests and held models the caller has not freed (under mu) */
    int32_t alive;          /* request and held objects not yet destroyed (under mu) */
};

/* A routed model: the lease, shared by the caller and its requests. The
 * lease goes with the last reference, with the keep_alive last asked for. */
struct sb_held {
    sb_switchboard_t *sb;
    sb_reg_lease *lease;
    atomic_int refs;
    pthread_mutex_t mu;
    double keep_alive_s; /* under mu */
};

/* A copy of one engine event, queued for the caller's thread. */
typedef struct qevent {
    struct qevent *next;
    int32_t index;
    bool done;
    int32_t token;
    float logprob;
    int32_t n_top;
    sb_token_logprob top[MAX_TOP];
    sb_finish finish;
    int32_t n_prompt, n_prompt_cached, n_generated;
    double ttft_s, time_s;
    char *error;      /* sb_malloc'd */
    float *embedding; /* sb_malloc'd */
    int32_t n_embd;
    size_t text_len;
    char text[]; /* text_len bytes, NUL-terminated */
} qevent;

typedef struct slot {
    sb_request_t *req;
    int32_t index;
    uint64_t id;     /* the engine's */
    bool submitted;  /* the engine owes it a done event */
    /* under req->mu, written by an executor thread */
    bool done;
    double t_first, t_last, t_done; /* clock of the first and last token, and of the end; 0 before */
    int32_t n_prompt, n_prompt_cached, n_generated;
} slot;

struct sb_request {
    sb_switchboard_t *sb;
    sb_held_t *held;   /* a reference */
    sb_engine *engine;
    double keep_alive_s;
    atomic_int refs;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled when an event is queued */
    int32_t n_slots;
    slot *slots;
    qevent *head, *tail; /* under mu */
    int32_t dones_queued; /* done events in the queue (under mu) */
    bool want_each;      /* sb_request_next waits: wake it for every event (under mu) */
    qevent *current;   /* the event sb_request_next handed out last (caller's) */
    double t_start, t_submit, load_s;
    bool failed;       /* its submit failed: its profile does not become the handle's last */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void copy_str(char *dst, size_t cap, const char *src) {
    snprintf(dst, cap, "%s", src ? src : "");
}

const char *sb_finish_reason_str(sb_finish_reason r) {
    switch (r) {
    case SB_FINISHED_NOT: return "none";
    case SB_FINISHED_STOP: return "stop";
    case SB_FINISHED_LENGTH: return "length";
    case SB_FINISHED_CANCELLED: return "cancelled";
    case SB_FINISHED_ERROR: return "error";
    }
    return "unknown";
}

/* ---- the handle ------------------------------------------------------------ */

sb_switchboard_params sb_switchboard_default_params(void) {
    return (sb_switchboard_params){.cache_type = sb_engine_default_params().cache_type, .keep_alive_s = -1.0};
}

sb_status sb_switchboard_open(const char *path, const sb_switchboard_params *params, sb_switchboard_t **out,
                              sb_error *err) {
    SB_ASSERT(out);
    *out = NULL;
    sb_switchboard_params p = params ? *params : sb_switchboard_default_params();
    if (!path || !path[0])
        return sb_fail(err, SB_ERR_INVALID_ARG, "sb_switchboard_open: no path given (a models.json, a directory or a .gguf file)");
    if (p.n_threads < 0 || p.n_ctx < 0 || p.n_parallel < 0 || p.max_batch_tokens < 0 || p.max_queue < 0)
        return sb_fail(err, SB_ERR_INVALID_ARG,
                       "sb_switchboard_open: n_threads, n_ctx, n_parallel, max_batch_tokens and max_queue must be >= 0");
    sb_switchboard_t *sb = sb_calloc(1, sizeof *sb);
    if (!sb)
        return sb_fail(err, SB_ERR_NOMEM, "sb_switchboard_open: out of memory");
    pthread_mutex_init(&sb->mu, NULL);
    pthread_cond_init(&sb->cv, NULL);

    sb_executor_params xp = sb_executor_default_params();
    xp.n_threads = p.n_threads;
    sb_status st = sb_executor_create(&xp, &sb->exec, err);
    if (st == SB_OK) {
        sb_registry_params rp = sb_registry_default_params();
        rp.source = path;
        rp.model_id = p.model_name;
        rp.memory_budget = p.memory_budget;
        rp.engine.n_ctx = p.n_ctx;
        if (p.n_parallel > 0)
            rp.engine.n_parallel = p.n_parallel;
        rp.engine.cache_type = p.cache_type;
        if (p.max_batch_tokens > 0)
            rp.engine.max_batch_tokens = p.max_batch_tokens;
        if (p.max_queue > 0)
            rp.engine.max_queue = p.max_queue;
        rp.keep_alive_ms = p.keep_alive_s < 0 ? SB_REGFILE_FOREVER : llround(p.keep_alive_s * 1e3);
        rp.exec = sb->exec;
        rp.watch = p.watch;
        rp.log = p.log;
        rp.log_user = p.log_user;
        st = sb_registry_open(&rp, &sb->reg, err);
    }
    if (st != SB_OK) {
        sb_executor_free(sb->exec);
        pthread_cond_destroy(&sb->cv);
        pthread_mutex_destroy(&sb->mu);
        sb_free(sb);
        return st;
    }
    if (p.default_model) {
        copy_str(sb->default_name, sizeof sb->default_name, p.default_model);
    } else {
        sb_reg_info first;
        if (sb_registry_list(sb->reg, &first, 1) > 0)
            copy_str(sb->default_name, sizeof sb->default_name, first.name);
    }
    *out = sb;
    return SB_OK;
}

void sb_switchboard_free(sb_switchboard_t *sb) {
    if (!sb)
        return;
    pthread_mutex_lock(&sb->mu);
    SB_ASSERT(sb->held == 0); /* every sb_request freed */
    pthread_mutex_unlock(&sb->mu);
    /* Requests freed by their callers may still be owed done events: cancel
     * them and wait until the last one has dropped its lease. */
    sb_registry_cancel_all(sb->reg);
    pthread_mutex_lock(&sb->mu);
    while (sb->alive > 0)
        pthread_cond_wait(&sb->cv, &sb->mu);
    pthread_mutex_unlock(&sb->mu);
    sb_registry_free(sb->reg);
    sb_executor_free(sb->exec);
    pthread_cond_destroy(&sb->cv);
    pthread_mutex_destroy(&sb->mu);
    sb_free(sb);
}

sb_status sb_switchboard_reload(sb_switchboard_t *sb, sb_error *err) {
    return sb_registry_reload(sb->reg, err);
}

void sb_switchboard_cancel_all(sb_switchboard_t *sb) { sb_registry_cancel_all(sb->reg); }

int32_t sb_switchboard_models(sb_switchboard_t *sb, char *out, size_t cap) {
    return sb_registry_names(sb->reg, out, cap);
}

/* ---- administration ---------------------------------------------------------- */

const char *sb_model_state_str(sb_model_state s) { return sb_reg_state_name((sb_reg_state)s); }

static void model_info_of(const sb_reg_info *m, sb_model_info *o) {
    memset(o, 0, sizeof *o);
    copy_str(o->name, sizeof o->name, m->name);
    copy_str(o->path, sizeof o->path, m->path);
    copy_str(o->error, sizeof o->error, m->error);
    o->state = (sb_model_state)m->state;
    o->version = m->version;
    o->memory = m->memory;
    o->running = m->running;
    o->waiting = m->waiting;
    o->in_flight = m->leases;
    o->last_used = m->last_used;
    o->keep_alive_s = m->keep_alive_s;
    o->pinned = m->pinned;
    o->kv_blocks_used = m->engine.kv_blocks_used;
    o->kv_blocks_total = m->engine.kv_blocks_total;
    o->block_size = m->engine.block_size;
    o->prompt_tokens_computed = m->engine.prompt_tokens_computed;
    o->prompt_tokens_cached = m->engine.prompt_tokens_cached;
    o->generated_tokens = m->engine.generated_tokens;
    o->preemptions = m->engine.preemptions;
    o->steps = m->engine.steps;
}

int32_t sb_switchboard_list(sb_switchboard_t *sb, sb_model_info *out, int32_t cap) {
    if (!out || cap <= 0)
        return sb_registry_list(sb->reg, NULL, 0);
    sb_reg_info *info = sb_calloc((size_t)cap, sizeof *info);
    if (!info)
        return sb_registry_list(sb->reg, NULL, 0); /* the count still; nothing filled */
    int32_t n = sb_registry_list(sb->reg, info, cap);
    for (int32_t i = 0; i < SB_MIN(n, cap); i++)
        model_info_of(&info[i], &out[i]);
    sb_free(info);
    return n;
}

sb_status sb_switchboard_load(sb_switchboard_t *sb, const char *name, sb_error *err) {
    if (!name || !name[0])
        return sb_fail(err, SB_ERR_INVALID_ARG, "sb_switchboard_load: no model name given");
    return sb_registry_load(sb->reg, name, err);
}

sb_status sb_switchboard_unload(sb_switchboard_t *sb, const char *name, sb_error *err) {
    if (!name || !name[0])
        return sb_fail(err, SB_ERR_INVALID_ARG, "sb_switchboard_unload: no model name given");
    return sb_registry_unload(sb->reg, name, err);
}

void sb_switchboard_get_totals(sb_switchboard_t *sb, sb_switchboard_totals *out) {
    sb_reg_totals t;
    sb_registry_totals(sb->reg, &t);
    *out = (sb_switchboard_totals){.budget = t.budget, .used = t.used, .loads = t.loads,
                                   .load_failures = t.load_failures, .evictions = t.evictions, .swaps = t.swaps,
                                   .reloads = t.reloads};
}

struct sb_registry *sb__switchboard_registry(sb_switchboard_t *sb) { return sb->reg; }

void sb_switchboard_get_default(sb_switchboard_t *sb, char *out, size_t cap) {
    pthread_mutex_lock(&sb->mu);
    copy_str(out, cap, sb->default_name);
    pthread_mutex_unlock(&sb->mu);
}

static void served_of(const sb_reg_lease *l, sb_served *out) {
    memset(out, 0, sizeof *out);
    copy_str(out->model, sizeof out->model, sb_reg_lease_name(l));
    copy_str(out->route, sizeof out->route, sb_reg_lease_route(l));
    const char *why = sb_reg_lease_fallback(l);
    out->fallback = why != NULL;
    copy_str(out->fallback_reason, sizeof out->fallback_reason, why);
}

/* ---- memory figures for profiles --------------------------------------------- */

/* VmRSS and VmHWM of /proc/self/status, in bytes (0 where unreadable). */
static void process_rss(size_t *rss, size_t *peak) {
    *rss = *peak = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return;
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "VmRSS: %llu kB", &kb) == 1)
            *rss = (size_t)kb * 1024;
        else if (sscanf(line, "VmHWM: %llu kB", &kb) == 1)
            *peak = (size_t)kb * 1024;
    }
    fclose(f);
}

static void profile_memory(sb_switchboard_t *sb, sb_profile *p) {
    process_rss(&p->rss_bytes, &p->peak_rss_bytes);
    sb_reg_totals t;
    sb_registry_totals(sb->reg, &t);
    p->models_bytes = t.used;
    p->budget_bytes = t.budget;
}

static void set_last_profile(sb_switchboard_t *sb, const sb_profile *p) {
    pthread_mutex_lock(&sb->mu);
    sb->last = *p;
    pthread_mutex_unlock(&sb->mu);
}

void sb_switchboard_last_profile(sb_switchboard_t *sb, sb_profile *out) {
    pthread_mutex_lock(&sb->mu);
    *out = sb->last;
    pthread_mutex_unlock(&sb->mu);
}

/* ---- held models ---------------------------------------------------------------- */

static void count_objects(sb_switchboard_t *sb, int32_t alive, int32_t held) {
    pthread_mutex_lock(&sb->mu);
    sb->alive += alive;
    sb->held += held;
    if (sb->alive == 0)
        pthread_cond_broadcast(&sb->cv);
    pthread_mutex_unlock(&sb->mu);
}

static void held_unref(sb_held_t *h, double keep_alive_s) {
    if (keep_alive_s != SB_KEEP_ALIVE_UNCHANGED) {
        pthread_mutex_lock(&h->mu);
        h->keep_alive_s = keep_alive_s;
        pthread_mutex_unlock(&h->mu);
    }
    if (atomic_fetch_sub(&h->refs, 1) != 1)
        return;
    sb_switchboard_t *sb = h->sb;
    sb_reg_lease_release(h->lease, h->keep_alive_s);
    pthread_mutex_destroy(&h->mu);
    sb_free(h);
    count_objects(sb, -1, 0);
}

/* Routes `name` (NULL: the default) to a held model; *load_s gets the time it took. */
static sb_status acquire(sb_switchboard_t *sb, const char *name, const char *user, sb_held_t **out,
                         double *load_s, sb_error *err) {
    *out = NULL;
    char dflt[sizeof sb->default_name];
    if (!name) {
        sb_switchboard_get_default(sb, dflt, sizeof dflt);
        if (!dflt[0])
            return sb_fail(err, SB_ERR_MODEL_NOT_FOUND,
                           "no model named and no default model (the registry is empty; set one with sb_switchboard_set_default)");
        name = dflt;
    }
    sb_held_t *h = sb_calloc(1, sizeof *h);
    if (!h)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory routing '%s'", name);
    double t0 = now_s();
    sb_status st = sb_registry_acquire(sb->reg, name, user, &h->lease, err);
    *load_s = now_s() - t0;
    if (st != SB_OK) {
        sb_free(h);
        return st;
    }
    h->sb = sb;
    atomic_init(&h->refs, 1);
    pthread_mutex_init(&h->mu, NULL);
    h->keep_alive_s = SB_KEEP_ALIVE_UNCHANGED;
    count_objects(sb, 1, 1);
    *out = h;
    return SB_OK;
}

sb_status sb_switchboard_acquire(sb_switchboard_t *sb, const char *model, const char *user, sb_held_t **out,
                                 sb_error *err) {
    SB_ASSERT(sb && out);
    double load_s;
    return acquire(sb, model, user, out, &load_s, err);
}

void sb_held_release(sb_held_t *h, double keep_alive_s) {
    if (!h)
        return;
    count_objects(h->sb, 0, -1);
    held_unref(h, keep_alive_s);
}

const sb_model_t *sb_held_model(const sb_held_t *h) { return sb_reg_lease_model(h->lease); }
int32_t sb_held_n_ctx(const sb_held_t *h) { return sb_reg_lease_n_ctx(h->lease); }
void sb_held_served(const sb_held_t *h, sb_served *out) { served_of(h->lease, out); }
const struct sb_reg_lease *sb__held_lease(const sb_held_t *h) { return h->lease; }

sb_status sb_held_grammar(sb_held_t *h, const char *gbnf, size_t len, sb_grammar_t **out, sb_error *err) {
    SB_ASSERT(h && out);
    *out = NULL;
    if (!gbnf)
        return sb_fail(err, SB_ERR_INVALID_ARG, "sb_held_grammar: no grammar text");
    return sb_grammar_create(sb_reg_lease_gvocab(h->lease), gbnf, len, out, err);
}

sb_status sb_held_json_schema(sb_held_t *h, const char *schema_json, sb_grammar_t **out, sb_error *err) {
    SB_ASSERT(h && out);
    *out = NULL;
    if (!schema_json)
        return sb_fail(err, SB_ERR_INVALID_ARG, "sb_held_json_schema: no schema");
    const char *end = NULL;
    cJSON *schema = cJSON_ParseWithOpts(schema_json, &end, true);
    if (!schema)
        return sb_fail(err, SB_ERR_INVALID_ARG, "the JSON schema is not valid JSON (at offset %zu)",
                       end ? (size_t)(end - schema_json) : (size_t)0);
    char *gbnf = NULL;
    size_t len = 0;
    sb_status st = sb_json_schema_to_gbnf(schema, &gbnf, &len, err);
    cJSON_Delete(schema);
    if (st == SB_OK)
        st = sb_held_grammar(h, gbnf, len, out, err);
    sb_free(gbnf);
    return st;
}

void sb_grammar_free(sb_grammar_t *g) { sb_grammar_unref(g); }

sb_status sb_switchboard_set_default(sb_switchboard_t *sb, const char *name, sb_served *served, sb_error *err) {
    if (!name || !name[0])
        return sb_fail(err, SB_ERR_INVALID_ARG, "sb_switchboard_set_default: no model name given");
    if (strlen(name) >= sizeof sb->default_name)
        return sb_fail(err, SB_ERR_INVALID_ARG, "sb_switchboard_set_default: model name longer than %zu bytes",
                       sizeof sb->default_name - 1);
    double t0 = now_s();
    sb_held_t *h;
    double load_s;
    sb_status st = acquire(sb, name, NULL, &h, &load_s, err);
    if (st != SB_OK)
        return st;
    if (served)
        served_of(h->lease, served);
    sb_held_release(h, SB_KEEP_ALIVE_UNCHANGED);
    pthread_mutex_lock(&sb->mu);
    copy_str(sb->default_name, sizeof sb->default_name, name);
    pthread_mutex_unlock(&sb->mu);
    sb_profile p = {.load_s = load_s, .total_s = now_s() - t0};
    profile_memory(sb, &p);
    set_last_profile(sb, &p);
    return SB_OK;
}

/* ---- inputs: prompt tokens ----------------------------------------------------- */

sb_infer_params sb_infer_default_params(void) {
    return (sb_infer_params){.keep_alive_s = SB_KEEP_ALIVE_UNCHANGED};
}

static sb_status tokenize_text(const sb_model_t *model, const char *text, int32_t **ids, int32_t *n, size_t index,
                               sb_error *err) {
    if (!text)
        return sb_fail(err, SB_ERR_INVALID_ARG, "input %zu: no prompt text", index);
    size_t need = 0, len = strlen(text);
    int32_t probe[1];
    sb_status st = sb_tokenize(model, text, len, true, true, probe, 0, &need, err);
    if (st != SB_OK && st != SB_ERR_INVALID_ARG)
        return st;
    if (need == 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "input %zu: the prompt is empty", index);
    if (need > INT32_MAX / 2 || !(*ids = sb_malloc(need * sizeof(int32_t))))
        return sb_fail(err, SB_ERR_NOMEM, "input %zu: out of memory for %zu prompt tokens", index, need);
    if ((st = sb_tokenize(model, text, len, true, true, *ids, need, &need, err)) != SB_OK) {
        sb_free(*ids);
        *ids = NULL;
        return st;
    }
    *n = (int32_t)need;
    return SB_OK;
}

/* The messages of a chat input as a cJSON array (the caller deletes it). */
static sb_status chat_array(const sb_input *in, size_t index, cJSON **out, sb_error *err) {
    cJSON *msgs = NULL;
    if (in->kind == SB_INPUT_CHAT_JSON) {
        if (!in->text)
            return sb_fail(err, SB_ERR_INVALID_ARG, "input %zu: no messages JSON", index);
        const char *end = NULL;
        msgs = cJSON_ParseWithOpts(in->text, &end, true);
        if (!msgs)
            return sb_fail(err, SB_ERR_INVALID_ARG, "input %zu: messages are not valid JSON (at offset %zu)", index,
                           end ? (size_t)(end - in->text) : (size_t)0);
        if (!cJSON_IsArray(msgs)) {
            cJSON_Delete(msgs);
            return sb_fail(err, SB_ERR_INVALID_ARG, "input %zu: messages must be a JSON array of {\"role\", \"content\"}",
                           index);
        }
    } else {
        if (!in->messages && in->n_messages)
            return sb_fail(err, SB_ERR_INVALID_ARG, "input %zu: n_messages is %zu but messages is NULL", index,
                           in->n_messages);
        if (!(msgs = cJSON_CreateArray()))
            return sb_fail(err, SB_ERR_NOMEM, "input %zu: out of memory for the messages", index);
        for (size_t i = 0; i < in->n_messages; i++) {
            const sb_chat_message *m = &in->messages[i];
            if (!m->role || !m->content) {
                cJSON_Delete(msgs);
                return sb_fail(err, SB_ERR_INVALID_ARG, "input %zu: messages[%zu] has no %s", index, i,
                               m->role ? "content" : "role");
            }
            cJSON *o = cJSON_CreateObject();
            if (!o || !cJSON_AddStringToObject(o, "role", m->role) || !cJSON_AddStringToObject(o, "content", m->content) ||
                !cJSON_AddItemToArray(msgs, o)) {
                cJSON_Delete(o);
                cJSON_Delete(msgs);
                return sb_fail(err, SB_ERR_NOMEM, "input %zu: out of memory for the messages", index);
            }
        }
    }
    if (cJSON_GetArraySize(msgs) == 0) {
        cJSON_Delete(msgs);
        return sb_fail(err, SB_ERR_INVALID_ARG, "input %zu: no messages", index);
    }
    *out = msgs;
    return SB_OK;
}

/* Renders a chat input through the model's template, the registry's system
 * prompt first when the messages bring none. */
static sb_status tokenize_chat(const sb_reg_lease *l, const sb_input *in, size_t index, int32_t **ids, int32_t *n,
                               sb_error *err) {
    cJSON *msgs = NULL;
    sb_status st = chat_array(in, index, &msgs, err);
    if (st != SB_OK)
        return st;
    const char *sys = sb_reg_lease_config(l)->system_prompt;
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(msgs, 0), "role");
    if (sys && !(cJSON_IsString(role) && strcmp(role->valuestring, "system") == 0)) {
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddStringToObject(o, "role", "system") || !cJSON_AddStringToObject(o, "content", sys) ||
            !cJSON_InsertItemInArray(msgs, 0, o)) {
            cJSON_Delete(o);
            cJSON_Delete(msgs);
            return sb_fail(err, SB_ERR_NOMEM, "input %zu: out of memory for the system prompt", index);
        }
    }
    char *json = cJSON_PrintUnformatted(msgs);
    cJSON_Delete(msgs);
    if (!json)
        return sb_fail(err, SB_ERR_NOMEM, "input %zu: out of memory rendering the messages", index);
    size_t len = 0;
    st = sb_chat_tokenize(sb_reg_lease_chat(l), json, ids, &len, err);
    cJSON_free(json);
    if (st == SB_OK && len == 0) {
        sb_free(*ids);
        *ids = NULL;
        st = sb_fail(err, SB_ERR_INVALID_ARG, "input %zu: the messages render to an empty prompt", index);
    }
    *n = (int32_t)len;
    return st;
}

/* Token ids as given, checked against the vocabulary (copied: the engine
 * submission copies again, but a bad id fails here, before anything runs). */
static sb_status copy_tokens(const sb_model_t *model, const sb_input *in, size_t index, int32_t **ids, int32_t *n,
                             sb_error *err) {
    if (!in->tokens || in->n_tokens == 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "input %zu: no prompt tokens", index);
    if (in->n_tokens > INT32_MAX / 2 || !(*ids = sb_malloc(in->n_tokens * sizeof(int32_t))))
        return sb_fail(err, SB_ERR_NOMEM, "input %zu: out of memory for %zu prompt tokens", index, in->n_tokens);
    const int32_t n_vocab = sb_model_n_vocab(model);
    for (size_t i = 0; i < in->n_tokens; i++) {
        if (in->tokens[i] < 0 || in->tokens[i] >= n_vocab) {
            sb_free(*ids);
            *ids = NULL;
            return sb_fail(err, SB_ERR_INVALID_ARG, "input %zu: token %zu is %d, outside the vocabulary (0..%d)",
                           index, i, (int)in->tokens[i], (int)n_vocab - 1);
        }
        (*ids)[i] = in->tokens[i];
    }
    *n = (int32_t)in->n_tokens;
    return SB_OK;
}

static sb_status tokenize_input(const sb_reg_lease *l, const sb_input *in, size_t index, int32_t **ids, int32_t *n,
                                sb_error *err) {
    switch (in->kind) {
    case SB_INPUT_TOKENS: return copy_tokens(sb_reg_lease_model(l), in, index, ids, n, err);
    case SB_INPUT_TEXT: return tokenize_text(sb_reg_lease_model(l), in->text, ids, n, index, err);
    case SB_INPUT_CHAT_JSON:
    case SB_INPUT_CHAT: return tokenize_chat(l, in, index, ids, n, err);
    }
    return sb_fail(err, SB_ERR_INVALID_ARG, "input %zu: unknown kind %d", index, (int)in->kind);
}

/* The engine parameters of a call: the caller's, else the model's registry defaults. */
static void gen_params(const sb_reg_lease *l, const sb_infer_params *p, sb_gen_params *gp) {
    const sb_regfile_params *dflt = &sb_reg_lease_config(l)->params;
    memset(gp, 0, sizeof *gp);
    if (p->sampling) {
        gp->sampling = *p->sampling;
    } else {
        gp->sampling = sb_sampler_default_params();
        sb_regfile_params_apply(dflt, &gp->sampling);
    }
    gp->max_tokens = p->max_tokens;
    if (p->max_tokens == 0 && (dflt->set & SB_PARAM_MAX_TOKENS))
        gp->max_tokens = dflt->max_tokens;
    if (p->stops || p->n_stops) {
        gp->stops = p->stops;
        gp->n_stops = p->n_stops;
    } else if (dflt->set & SB_PARAM_STOP) {
        gp->stops = (const char *const *)dflt->stop;
        gp->n_stops = dflt->n_stop;
    }
    gp->logprobs = p->logprobs || p->top_logprobs > 0;
    gp->top_logprobs = p->top_logprobs;
    gp->ignore_eos = p->ignore_eos;
    gp->priority = p->priority;
    gp->embedding = p->embedding;
    gp->grammar = (sb_grammar *)p->grammar; /* the engine takes its own reference per sequence */
}

/* ---- requests ---------------------------------------------------------------- */

static void qevents_free(qevent *e) {
    while (e) {
        qevent *next = e->next;
        sb_free(e->error);
        sb_free(e->embedding);
        sb_free(e);
        e = next;
    }
}

static void request_destroy(sb_request_t *r) {
    sb_switchboard_t *sb = r->sb;
    /* The engine drops its reference under the lock (on_event): taking the
     * lock once waits until that thread is out of it. */
    pthread_mutex_lock(&r->mu);
    pthread_mutex_unlock(&r->mu);
    qevents_free(r->head);
    qevents_free(r->current);
    if (r->held)
        held_unref(r->held, r->keep_alive_s);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    sb_free(r->slots);
    sb_free(r);
    count_objects(sb, -1, 0);
}

static void request_unref(sb_request_t *r) {
    if (atomic_fetch_sub(&r->refs, 1) == 1)
        request_destroy(r);
}

/* Executor thread: copy the event, queue it, wake the caller. An allocation
 * failure loses a token event's copy (its text then misses a piece) but
 * never a done: the slot's figures are kept apart from the copy, and the
 * caller is woken to find the slot done. */
static void on_event(void *user, const sb_gen_event *ev) {
    slot *s = user;
    sb_request_t *r = s->req;
    const bool done = ev->kind == SB_GEN_DONE;
    const size_t text_len = ev->text ? ev->text_len : 0;
    qevent *e = sb_malloc(sizeof *e + text_len + 1);
    if (e) {
        memset(e, 0, sizeof *e);
        e->index = s->index;
        e->done = done;
        e->token = ev->token;
        e->logprob = ev->logprob;
        e->n_top = SB_MIN(SB_MAX(ev->n_top, 0), MAX_TOP);
        if (e->n_top > 0)
            memcpy(e->top, ev->top, (size_t)e->n_top * sizeof e->top[0]);
        e->finish = ev->finish;
        e->n_prompt = ev->n_prompt;
        e->n_prompt_cached = ev->n_prompt_cached;
        e->n_generated = ev->n_generated;
        e->ttft_s = ev->ttft_s;
        e->time_s = now_s() - r->t_submit;
        if (done && ev->error)
            e->error = sb_strndup(ev->error, strlen(ev->error));
        if (done && ev->embedding && ev->n_embd > 0 &&
            (e->embedding = sb_malloc((size_t)ev->n_embd * sizeof(float)))) {
            memcpy(e->embedding, ev->embedding, (size_t)ev->n_embd * sizeof(float));
            e->n_embd = ev->n_embd;
        }
        if (text_len)
            memcpy(e->text, ev->text, text_len);
        e->text[text_len] = '\0';
        e->text_len = text_len;
    }
    const double t = now_s();
    pthread_mutex_lock(&r->mu);
    if (done) {
        s->done = true;
        s->n_prompt = ev->n_prompt;
        s->n_prompt_cached = ev->n_prompt_cached;
        s->n_generated = ev->n_generated;
        s->t_done = t;
    } else {
        if (s->t_first == 0)
            s->t_first = t;
        s->t_last = t;
    }
    if (e) {
        if (r->tail)
            r->tail->next = e;
        else
            r->head = e;
        r->tail = e;
        r->dones_queued += done;
    }
    if (done) {
        /* The engine's reference goes under the lock, so that a caller who
         * sees the done event (under the lock) frees the last reference
         * itself and the model's hold ends on its thread, before it answers
         * anyone: a server's next request then finds the model idle. The
         * signal is under the lock too: once it is released, r may be gone. */
        const bool last = atomic_fetch_sub(&r->refs, 1) == 1;
        if (!last)
            pthread_cond_signal(&r->cv);
        pthread_mutex_unlock(&r->mu);
        if (last) /* the caller freed it already: nobody waits */
            request_destroy(r);
        return;
    }
    const bool wake = r->want_each;
    pthread_mutex_unlock(&r->mu);
    /* Signalled after the unlock: a thread woken while the lock is still
     * held wakes only to block on it (two more futex calls and a context
     * switch per token). Token events wake only a caller that waits for
     * them: one waiting for whole answers would take a core from the engine
     * for nothing. r lives on: the engine's reference is still held. */
    if (wake)
        pthread_cond_signal(&r->cv);
}

static void cancel_slots(sb_request_t *r) {
    for (int32_t i = 0; i < r->n_slots; i++)
        if (r->slots[i].submitted)
            sb_engine_cancel(r->engine, r->slots[i].id);
}

static sb_request_t *request_new(sb_switchboard_t *sb, size_t n, const sb_infer_params *p) {
    sb_request_t *r = sb_calloc(1, sizeof *r);
    slot *slots = sb_calloc(n, sizeof *slots);
    if (!r || !slots) {
        sb_free(r);
        sb_free(slots);
        return NULL;
    }
    r->sb = sb;
    r->slots = slots;
    r->n_slots = (int32_t)n;
    r->keep_alive_s = p->keep_alive_s;
    atomic_init(&r->refs, 1);
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    for (size_t i = 0; i < n; i++)
        slots[i] = (slot){.req = r, .index = (int32_t)i};
    count_objects(sb, 1, 1);
    return r;
}

/* Tokenizes every input first, so that a bad one fails the call before
 * anything runs, then submits them all. */
static sb_status submit_all(sb_request_t *r, const sb_input *inputs, const sb_infer_params *p, sb_error *err) {
    int32_t **ids = sb_calloc((size_t)r->n_slots, sizeof *ids);
    int32_t *lens = sb_calloc((size_t)r->n_slots, sizeof *lens);
    sb_status st = ids && lens ? SB_OK : sb_fail(err, SB_ERR_NOMEM, "out of memory for %d inputs", (int)r->n_slots);
    for (int32_t i = 0; st == SB_OK && i < r->n_slots; i++)
        st = tokenize_input(r->held->lease, &inputs[i], (size_t)i, &ids[i], &lens[i], err);
    sb_gen_params gp;
    gen_params(r->held->lease, p, &gp);
    const uint64_t seed = gp.sampling.seed;
    r->t_submit = now_s();
    for (int32_t i = 0; st == SB_OK && i < r->n_slots; i++) {
        slot *s = &r->slots[i];
        gp.prompt = ids[i];
        gp.n_prompt = lens[i];
        gp.sampling.seed = seed + inputs[i].seed_offset;
        atomic_fetch_add(&r->refs, 1); /* the engine's: its callback may run before submit returns */
        st = sb_engine_submit(r->engine, &gp, on_event, s, &s->id, err);
        if (st == SB_OK) {
            s->submitted = true;
        } else {
            atomic_fetch_sub(&r->refs, 1);
            if (r->n_slots > 1) {
                sb_error inner = *err;
                sb_fail(err, inner.status, "input %d: %s", (int)i, inner.msg);
            }
        }
    }
    for (int32_t i = 0; ids && i < r->n_slots; i++)
        sb_free(ids[i]);
    sb_free(ids);
    sb_free(lens);
    return st;
}

/* Submits on h (the request takes its own reference); load_s is what routing took. */
static sb_status held_submit(sb_held_t *h, const sb_input *inputs, size_t n, const sb_infer_params *params,
                             double t_start, double load_s, sb_request_t **out, sb_error *err) {
    SB_ASSERT(h && out);
    *out = NULL;
    const sb_infer_params p = params ? *params : sb_infer_default_params();
    if (n == 0 || !inputs)
        return sb_fail(err, SB_ERR_INVALID_ARG, "nothing to generate: no inputs");
    if (n > 4096)
        return sb_fail(err, SB_ERR_INVALID_ARG, "%zu inputs in one request; at most 4096", n);
    if (p.top_logprobs < 0 || p.top_logprobs > MAX_TOP)
        return sb_fail(err, SB_ERR_INVALID_ARG, "top_logprobs is %d; it must be 0..%d", (int)p.top_logprobs, MAX_TOP);
    if (p.n_stops && !p.stops)
        return sb_fail(err, SB_ERR_INVALID_ARG, "n_stops is %zu but stops is NULL", p.n_stops);
    sb_request_t *r = request_new(h->sb, n, &p);
    if (!r)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for a request of %zu inputs", n);
    r->t_start = t_start;
    r->load_s = load_s;
    atomic_fetch_add(&h->refs, 1);
    r->held = h;
    r->engine = sb_reg_lease_engine(h->lease);
    sb_status st = submit_all(r, inputs, &p, err);
    if (st != SB_OK) {
        r->failed = true;
        sb_request_free(r);
        return st;
    }
    *out = r;
    return SB_OK;
}

sb_status sb_held_submit(sb_held_t *h, const sb_input *inputs, size_t n, const sb_infer_params *params,
                         sb_request_t **out, sb_error *err) {
    return held_submit(h, inputs, n, params, now_s(), 0, out, err);
}

sb_status sb_switchboard_submit(sb_switchboard_t *sb, const sb_input *inputs, size_t n, const sb_infer_params *params,
                                sb_request_t **out, sb_error *err) {
    SB_ASSERT(sb && out);
    *out = NULL;
    const double t_start = now_s();
    double load_s;
    sb_held_t *h;
    sb_status st = acquire(sb, params ? params->model : NULL, params ? params->user : NULL, &h, &load_s, err);
    if (st != SB_OK)
        return st;
    st = held_submit(h, inputs, n, params, t_start, load_s, out, err);
    sb_held_release(h, SB_KEEP_ALIVE_UNCHANGED);
    return st;
}

/* Every submitted input has ended (under r->mu); with an empty queue, all
 * their events have been taken. */
static bool all_done(const sb_request_t *r) {
    for (int32_t i = 0; i < r->n_slots; i++)
        if (r->slots[i].submitted && !r->slots[i].done)
            return false;
    return true;
}

static void deadline_after(int64_t ms, struct timespec *t) {
    clock_gettime(CLOCK_MONOTONIC, t);
    t->tv_sec += ms / 1000;
    t->tv_nsec += (ms % 1000) * 1000000L;
    if (t->tv_nsec >= 1000000000L) {
        t->tv_sec++;
        t->tv_nsec -= 1000000000L;
    }
}

bool sb_request_next(sb_request_t *r, int64_t timeout_ms, sb_stream_event *ev) {
    qevents_free(r->current);
    r->current = NULL;
    struct timespec deadline;
    if (timeout_ms > 0)
        deadline_after(timeout_ms, &deadline);
    pthread_mutex_lock(&r->mu);
    r->want_each = true;
    while (!r->head && !all_done(r) && timeout_ms != 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&r->cv, &r->mu);
        else if (pthread_cond_timedwait(&r->cv, &r->mu, &deadline) != 0)
            break;
    }
    r->want_each = false;
    qevent *e = r->head;
    if (e) {
        r->head = e->next;
        if (!r->head)
            r->tail = NULL;
        e->next = NULL;
        r->dones_queued -= e->done;
    }
    pthread_mutex_unlock(&r->mu);
    if (!e)
        return false;
    r->current = e;
    *ev = (sb_stream_event){
        .index = e->index,
        .done = e->done,
        .token = e->token,
        .text = e->text,
        .text_len = e->text_len,
        .logprob = e->logprob,
        .top = e->top,
        .n_top = e->n_top,
        .finish = (sb_finish_reason)e->finish,
        .n_prompt = e->n_prompt,
        .n_prompt_cached = e->n_prompt_cached,
        .n_generated = e->n_generated,
        .ttft_s = e->ttft_s,
        .error = e->error,
        .embedding = e->embedding,
        .n_embd = e->n_embd,
        .time_s = e->time_s,
    };
    return true;
}

bool sb_request_wait(sb_request_t *r, int64_t timeout_ms) {
    struct timespec deadline;
    if (timeout_ms > 0)
        deadline_after(timeout_ms, &deadline);
    pthread_mutex_lock(&r->mu);
    while (r->dones_queued == 0 && !all_done(r) && timeout_ms != 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&r->cv, &r->mu);
        else if (pthread_cond_timedwait(&r->cv, &r->mu, &deadline) != 0)
            break;
    }
    const bool ready = r->dones_queued > 0 || all_done(r);
    pthread_mutex_unlock(&r->mu);
    return ready;
}

bool sb_request_finished(const sb_request_t *r) {
    sb_request_t *m = (sb_request_t *)r; /* the lock, not the request, changes */
    pthread_mutex_lock(&m->mu);
    bool fin = !r->head && all_done(r);
    pthread_mutex_unlock(&m->mu);
    return fin;
}

void sb_request_cancel(sb_request_t *r) { cancel_slots(r); }

void sb_request_served(const sb_request_t *r, sb_served *out) { served_of(r->held->lease, out); }

const sb_model_t *sb_request_model(const sb_request_t *r) { return sb_reg_lease_model(r->held->lease); }

/* The profile of inputs [lo, hi) of r (under r->mu). Speeds use the
 * request's own clock: ttft from submit to the first token of any input,
 * generation from the first token to the last, the first token of each
 * input excluded (it belongs to the prompt's time). */
static void range_profile(const sb_request_t *r, int32_t lo, int32_t hi, sb_profile *p) {
    memset(p, 0, sizeof *p);
    double first = 0, last = 0, end = 0;
    int32_t producing = 0;
    bool finished = true;
    for (int32_t i = lo; i < hi; i++) {
        const slot *s = &r->slots[i];
        p->n_prompt += s->n_prompt;
        p->n_prompt_cached += s->n_prompt_cached;
        p->n_generated += s->n_generated;
        finished &= s->done;
        end = SB_MAX(end, s->t_done);
        if (s->t_first > 0) {
            first = first == 0 ? s->t_first : SB_MIN(first, s->t_first);
            last = SB_MAX(last, s->t_last);
            producing++;
        }
    }
    p->load_s = r->load_s;
    p->total_s = (finished ? end : now_s()) - r->t_start;
    if (first > 0) {
        p->ttft_s = first - r->t_submit;
        if (p->ttft_s > 0)
            p->prompt_tps = (double)(p->n_prompt - p->n_prompt_cached) / p->ttft_s;
        if (last > first && p->n_generated > producing)
            p->gen_tps = (double)(p->n_generated - producing) / (last - first);
    }
    profile_memory(r->sb, p);
}

void sb_request_profile(const sb_request_t *r, sb_profile *out) {
    sb_request_t *m = (sb_request_t *)r;
    pthread_mutex_lock(&m->mu);
    range_profile(r, 0, r->n_slots, out);
    pthread_mutex_unlock(&m->mu);
}

void sb_request_free(sb_request_t *r) {
    if (!r)
        return;
    sb_switchboard_t *sb = r->sb;
    if (r->engine)
        cancel_slots(r);
    if (!r->failed) {
        sb_profile p;
        sb_request_profile(r, &p);
        set_last_profile(sb, &p);
    }
    count_objects(sb, 0, -1);
    request_unref(r);
}

/* ---- blocking calls ------------------------------------------------------------ */

void sb_result_free(sb_result *r) {
    if (!r)
        return;
    sb_free(r->text);
    r->text = NULL;
    r->text_len = 0;
}

static bool append(sb_result *res, size_t *cap, const char *text, size_t len) {
    if (res->text_len + len + 1 > *cap) {
        size_t want = SB_MAX(*cap * 2, res->text_len + len + 64);
        char *t = sb_realloc(res->text, want);
        if (!t)
            return false;
        res->text = t;
        *cap = want;
    }
    memcpy(res->text + res->text_len, text, len);
    res->text_len += len;
    res->text[res->text_len] = '\0';
    return true;
}

/* What run() keeps per input: its text's capacity, the tokens the caller
 * was given, and whether the caller's cancel cut it short. */
typedef struct run_input {
    size_t cap;
    int32_t seen;
    bool cut;
} run_input;

/* Submits, takes every event (handing each to params.on_event), and fills
 * results[0..n). Once the callback cancels, the events the engine produced
 * in the meantime reach neither the callback nor the results: each input
 * not yet done ends with a done event saying SB_FINISHED_CANCELLED (as the
 * callback's contract says), and its text and count are what the caller
 * was given. */
static sb_status run(sb_switchboard_t *sb, const sb_input *inputs, size_t n, const sb_infer_params *params,
                     sb_result *results, sb_profile *whole, sb_error *err) {
    SB_ASSERT(sb && results);
    memset(results, 0, n * sizeof *results);
    const sb_infer_params p = params ? *params : sb_infer_default_params();
    sb_request_t *r;
    sb_status st = sb_switchboard_submit(sb, inputs, n, &p, &r, err);
    if (st != SB_OK)
        return st;
    run_input *ins = sb_calloc(n, sizeof *ins);
    if (!ins) {
        sb_request_free(r);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for %zu results", n);
    }
    bool cancelled = false, called_off = false;
    sb_stream_event ev;
    while (sb_request_next(r, -1, &ev)) {
        run_input *in = &ins[ev.index];
        sb_result *res = &results[ev.index];
        if (called_off) {
            if (!ev.done)
                continue;
            ev = (sb_stream_event){.index = ev.index, .done = true, .text = "", .finish = SB_FINISHED_CANCELLED,
                                   .n_prompt = ev.n_prompt, .n_prompt_cached = ev.n_prompt_cached,
                                   .n_generated = in->seen, .ttft_s = ev.ttft_s, .time_s = ev.time_s};
            in->cut = true;
        }
        if (st == SB_OK && !append(res, &in->cap, ev.text, ev.text_len))
            st = sb_fail(err, SB_ERR_NOMEM, "input %d: out of memory for the generated text", (int)ev.index);
        if (ev.done) {
            res->finish = ev.finish;
            if (ev.finish == SB_FINISHED_ERROR && st == SB_OK)
                st = sb_fail(err, SB_ERR_NOMEM, "input %d: generation failed: %s", (int)ev.index,
                             ev.error ? ev.error : "(no message)");
        } else
            in->seen++;
        if (p.on_event && !p.on_event(p.user_data, &ev) && !called_off) {
            called_off = true;
            if (!cancelled)
                sb_request_cancel(r);
            cancelled = true;
        }
        if (st != SB_OK && !cancelled) {
            sb_request_cancel(r);
            cancelled = true;
        }
    }
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < n; i++) {
        sb_result *res = &results[i];
        const slot *s = &r->slots[i];
        res->n_prompt = s->n_prompt;
        res->n_prompt_cached = s->n_prompt_cached;
        res->n_generated = ins[i].cut ? ins[i].seen : s->n_generated;
        range_profile(r, (int32_t)i, (int32_t)i + 1, &res->profile);
        served_of(r->held->lease, &res->served);
        if (!res->text && st == SB_OK && !(res->text = sb_calloc(1, 1)))
            st = sb_fail(err, SB_ERR_NOMEM, "out of memory for the results");
    }
    sb_free(ins);
    if (whole)
        range_profile(r, 0, r->n_slots, whole);
    pthread_mutex_unlock(&r->mu);
    sb_request_free(r);
    if (st != SB_OK)
        for (size_t i = 0; i < n; i++)
            sb_result_free(&results[i]);
    return st;
}

sb_status sb_switchboard_complete(sb_switchboard_t *sb, const char *prompt, const sb_infer_params *params,
                                  sb_result *result, sb_error *err) {
    const sb_input in = {.kind = SB_INPUT_TEXT, .text = prompt};
    return run(sb, &in, 1, params, result, NULL, err);
}

sb_status sb_switchboard_chat(sb_switchboard_t *sb, const char *messages_json, const sb_infer_params *params,
                              sb_result *result, sb_error *err) {
    const sb_input in = {.kind = SB_INPUT_CHAT_JSON, .text = messages_json};
    return run(sb, &in, 1, params, result, NULL, err);
}

sb_status sb_switchboard_chat_messages(sb_switchboard_t *sb, const sb_chat_message *messages, size_t n_messages,
                                       const sb_infer_params *params, sb_result *result, sb_error *err) {
    const sb_input in = {.kind = SB_INPUT_CHAT, .messages = messages, .n_messages = n_messages};
    return run(sb, &in, 1, params, result, NULL, err);
}

sb_status sb_switchboard_batch_infer(sb_switchboard_t *sb, const char *const *prompts, size_t n,
                                     const sb_infer_params *params, sb_result *results, sb_profile *batch,
                                     sb_error *err) {
    if (n == 0 || !prompts || !results)
        return sb_fail(err, SB_ERR_INVALID_ARG, "sb_switchboard_batch_infer: no prompts");
    sb_input *inputs = sb_calloc(n, sizeof *inputs);
    if (!inputs)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for %zu prompts", n);
    for (size_t i = 0; i < n; i++)
        inputs[i] = (sb_input){.kind = SB_INPUT_TEXT, .text = prompts[i]};
    sb_status st = run(sb, inputs, n, params, results, batch, err);
    sb_free(inputs);
    return st;
}
