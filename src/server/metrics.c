/*
 * metrics.c - Prometheus counters and histograms (see metrics.h).
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "server/metrics.h"

static const char *const endpoint_names[SB_SRV_EP_COUNT] = {
    [SB_SRV_EP_CHAT] = "/v1/chat/completions",
    [SB_SRV_EP_COMPLETIONS] = "/v1/completions",
    [SB_SRV_EP_EMBEDDINGS] = "/v1/embeddings",
    [SB_SRV_EP_MODELS] = "/v1/models",
    [SB_SRV_EP_HEALTH] = "/health",
    [SB_SRV_EP_METRICS] = "/metrics",
    [SB_SRV_EP_PROMPTS] = "/v1/prompts",
    [SB_SRV_EP_ADMIN] = "/admin",
    [SB_SRV_EP_USAGE] = "/v1/usage",
    [SB_SRV_EP_FEEDBACK] = "/v1/feedback",
    [SB_SRV_EP_FILES] = "/v1/files",
    [SB_SRV_EP_BATCHES] = "/v1/batches",
    [SB_SRV_EP_OTHER] = "other",
};

static const char *const status_names[SB_SRV_N_STATUS] = {"200", "400", "404", "405", "413",
                                                          "500", "503", "4xx", "5xx"};

/* Upper bounds in seconds; one more bucket (+Inf) follows each list. */
static const double ttft_bounds[SB_SRV_TTFT_BUCKETS - 1] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                            1,     2.5,  5,     10,   30,  60};
static const double itl_bounds[SB_SRV_ITL_BUCKETS - 1] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                          0.1,   0.25,   0.5,   1,    2.5};

void sb_srv_metrics_init(sb_srv_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void sb_srv_metrics_destroy(sb_srv_metrics *m) {
    while (m->models) {
        sb_srv_model_metrics *next = m->models->next;
        sb_free(m->models);
        m->models = next;
    }
    pthread_mutex_destroy(&m->mu);
}

sb_srv_model_metrics *sb_srv_metrics_model(sb_srv_metrics *m, const char *name) {
    pthread_mutex_lock(&m->mu);
    sb_srv_model_metrics *mm = m->models;
    while (mm && strcmp(mm->name, name) != 0)
        mm = mm->next;
    if (!mm && (mm = sb_calloc(1, sizeof *mm))) {
        snprintf(mm->name, sizeof mm->name, "%s", name);
        mm->mu = &m->mu;
        mm->next = m->models;
        m->models = mm;
    }
    pthread_mutex_unlock(&m->mu);
    return mm;
}

static int status_index(unsigned status) {
    static const unsigned known[] = {200, 400, 404, 405, 413, 500, 503};
    for (int i = 0; i < (int)SB_ARRAY_LEN(known); i++)
        if (known[i] == status)
            return i;
    return status >= 500 ? 8 : 7;
}

void sb_srv_metrics_request(sb_srv_metrics *m, sb_srv_endpoint ep, unsigned status) {
    pthread_mutex_lock(&m->mu);
    m->requests[ep][status_index(status)]++;
    pthread_mutex_unlock(&m->mu);
}

static void observe(sb_srv_hist *h, const double *bounds, int n_bounds, double v) {
    int i = 0;
    while (i < n_bounds && v > bounds[i])
        i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

void sb_srv_metrics_generation(sb_srv_model_metrics *mm, int32_t n_prompt, int32_t n_generated, double ttft_s) {
    pthread_mutex_lock(mm->mu);
    mm->generations++;
    mm->prompt_tokens += (uint64_t)SB_MAX(n_prompt, 0);
    mm->generated_tokens += (uint64_t)SB_MAX(n_generated, 0);
    if (ttft_s > 0)
        observe(&mm->ttft, ttft_bounds, SB_SRV_TTFT_BUCKETS - 1, ttft_s);
    pthread_mutex_unlock(mm->mu);
}

void sb_srv_metrics_cache(sb_srv_model_metrics *mm, bool hit) {
    pthread_mutex_lock(mm->mu);
    *(hit ? &mm->cache_hits : &mm->cache_misses) += 1;
    pthread_mutex_unlock(mm->mu);
}

void sb_srv_metrics_itl(sb_srv_model_metrics *mm, double seconds) {
    pthread_mutex_lock(mm->mu);
    observe(&mm->itl, itl_bounds, SB_SRV_ITL_BUCKETS - 1, seconds);
    pthread_mutex_unlock(mm->mu);
}

/* A label value as the exposition format writes it: \\, \" and \n escaped. */
static void label_value(sb_srv_buf *out, const char *v) {
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            sb_srv_buf_printf(out, "\\%c", *v);
        else if (*v == '\n')
            sb_srv_buf_puts(out, "\\n");
        else
            sb_srv_buf_append(out, v, 1);
    }
}

static void header(sb_srv_buf *out, const char *name, const char *type, const char *help) {
    sb_srv_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One sample `name{model="..."} v`. */
static void model_sample(sb_srv_buf *out, const char *name, const char *suffix, const char *model, const char *extra,
                         double v) {
    sb_srv_buf_printf(out, "%s%s{model=\"", name, suffix);
    label_value(out, model);
    sb_srv_buf_printf(out, "\"%s} %.17g\n", extra, v);
}

static void render_hist(sb_srv_buf *out, const char *model, const char *name, const sb_srv_hist *h,
                        const double *bounds, int n_bounds) {
    uint64_t cum = 0;
    char le[48];
    for (int i = 0; i < n_bounds; i++) {
        cum += h->counts[i];
        snprintf(le, sizeof le, ",le=\"%g\"", bounds[i]);
        model_sample(out, name, "_bucket", model, le, (double)cum);
    }
    model_sample(out, name, "_bucket", model, ",le=\"+Inf\"", (double)h->count);
    model_sample(out, name, "_sum", model, "", h->sum);
    model_sample(out, name, "_count", model, "", (double)h->count);
}

static void render_value(sb_srv_buf *out, const char *name, const char *type, const char *help, double v) {
    header(out, name, type, help);
    sb_srv_buf_printf(out, "%s %.17g\n", name, v);
}

/* Resident set size from /proc/self/statm (second field, in pages); 0 if unreadable. */
static double process_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return 0;
    unsigned long long size = 0, resident = 0;
    int n = fscanf(f, "%llu %llu", &size, &resident);
    fclose(f);
    return n == 2 ? (double)resident * (double)sysconf(_SC_PAGESIZE) : 0;
}

/* The per-model series of the models that served (copied under the lock). */
static void render_models(sb_srv_buf *out, const sb_srv_model_metrics *models, size_t n) {
    static const struct {
        const char *name, *help;
        size_t offset;
    } counters[] = {
        {"switchboard_generations_total", "Finished generations and embeddings, by serving model.",
         offsetof(sb_srv_model_metrics, generations)},
        {"switchboard_prompt_tokens_total", "Prompt tokens of finished requests (usage.prompt_tokens).",
         offsetof(sb_srv_model_metrics, prompt_tokens)},
        {"switchboard_generation_tokens_total", "Generated tokens of finished requests (usage.completion_tokens).",
         offsetof(sb_srv_model_metrics, generated_tokens)},
        {"switchboard_cache_hits_total", "Requests answered from the response cache.",
         offsetof(sb_srv_model_metrics, cache_hits)},
        {"switchboard_cache_misses_total", "Cacheable (deterministic) requests the response cache did not have.",
         offsetof(sb_srv_model_metrics, cache_misses)},
    };
    for (size_t c = 0; c < SB_ARRAY_LEN(counters); c++) {
        header(out, counters[c].name, "counter", counters[c].help);
        for (size_t i = 0; i < n; i++)
            model_sample(out, counters[c].name, "", models[i].name, "",
                         (double)*(const uint64_t *)((const char *)&models[i] + counters[c].offset));
    }
    header(out, "switchboard_time_to_first_token_seconds", "histogram", "Time from submission to the first token.");
    for (size_t i = 0; i < n; i++)
        render_hist(out, models[i].name, "switchboard_time_to_first_token_seconds", &models[i].ttft, ttft_bounds,
                    SB_SRV_TTFT_BUCKETS - 1);
    header(out, "switchboard_inter_token_latency_seconds", "histogram",
           "Time between consecutive tokens of a sequence.");
    for (size_t i = 0; i < n; i++)
        render_hist(out, models[i].name, "switchboard_inter_token_latency_seconds", &models[i].itl, itl_bounds,
                    SB_SRV_ITL_BUCKETS - 1);
}

/* The engines of the loaded models, one family per figure. */
static void render_engines(sb_srv_buf *out, const sb_model_info *es, size_t n) {
#define ENGINE_FIGURE(metric, type, help, expr)                                                              \
    do {                                                                                                     \
        header(out, metric, type, help);                                                                     \
        for (size_t i = 0; i < n; i++) {                                                                     \
            const sb_model_info *e = &es[i];                                                                 \
            model_sample(out, metric, "", e->name, "", (double)(expr));                                      \
        }                                                                                                    \
    } while (0)
    ENGINE_FIGURE("switchboard_prompt_tokens_computed_total", "counter", "Prompt positions run through the model.",
                  e->prompt_tokens_computed);
    ENGINE_FIGURE("switchboard_prompt_tokens_cached_total", "counter",
                  "Prompt positions reused from the prefix cache instead of computed.", e->prompt_tokens_cached);
    ENGINE_FIGURE("switchboard_engine_generated_tokens_total", "counter",
                  "Tokens sampled by the engine (including cancelled requests).", e->generated_tokens);
    ENGINE_FIGURE("switchboard_preemptions_total", "counter",
                  "Sequences preempted for lack of KV cache and recomputed later.", e->preemptions);
    ENGINE_FIGURE("switchboard_engine_steps_total", "counter", "Forward steps run by the engine.", e->steps);
    ENGINE_FIGURE("switchboard_queue_length", "gauge", "Requests waiting to start.", e->waiting);
    ENGINE_FIGURE("switchboard_running_sequences", "gauge", "Sequences being generated.", e->running);
    ENGINE_FIGURE("switchboard_kv_cache_blocks_used", "gauge", "KV-cache blocks in use.", e->kv_blocks_used);
    ENGINE_FIGURE("switchboard_kv_cache_blocks", "gauge", "KV-cache blocks in all (the pool's size).",
                  e->kv_blocks_total);
    ENGINE_FIGURE("switchboard_kv_cache_block_size", "gauge", "Positions per KV-cache block.", e->block_size);
    ENGINE_FIGURE("switchboard_model_memory_bytes", "gauge",
                  "What a loaded model costs: weights, KV pool and scratch, measured.", e->memory);
#undef ENGINE_FIGURE
}

void sb_srv_metrics_render(sb_srv_metrics *m, const sb_model_info *engines, size_t n_engines,
                           const sb_switchboard_totals *totals, sb_srv_buf *out) {
    /* Copied under the locks, rendered without them. */
    pthread_mutex_lock(&m->mu);
    uint64_t requests[SB_SRV_EP_COUNT][SB_SRV_N_STATUS];
    memcpy(requests, m->requests, sizeof requests);
    size_t n_models = 0;
    for (const sb_srv_model_metrics *mm = m->models; mm; mm = mm->next)
        n_models++;
    sb_srv_model_metrics *models = sb_calloc(n_models ? n_models : 1, sizeof *models);
    size_t k = 0;
    for (const sb_srv_model_metrics *mm = m->models; mm && models; mm = mm->next)
        models[k++] = *mm;
    pthread_mutex_unlock(&m->mu);

    header(out, "switchboard_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
    for (int e = 0; e < SB_SRV_EP_COUNT; e++)
        for (int s = 0; s < SB_SRV_N_STATUS; s++)
            if (requests[e][s])
                sb_srv_buf_printf(out, "switchboard_requests_total{endpoint=\"%s\",status=\"%s\"} %llu\n",
                                  endpoint_names[e], status_names[s], (unsigned long long)requests[e][s]);
    if (models)
        render_models(out, models, k);
    sb_free(models);
    render_engines(out, engines, n_engines);
    if (totals) {
        render_value(out, "switchboard_memory_budget_bytes", "gauge", "The memory budget of all loaded models.",
                     (double)totals->budget);
        render_value(out, "switchboard_memory_used_bytes", "gauge",
                     "What the loaded (and loading) models cost, against the budget.", (double)totals->used);
        render_value(out, "switchboard_model_loads_total", "counter", "Models loaded.", (double)totals->loads);
        render_value(out, "switchboard_model_load_failures_total", "counter", "Model loads that failed.",
                     (double)totals->load_failures);
        render_value(out, "switchboard_model_evictions_total", "counter",
                     "Idle models unloaded to make room under the budget.", (double)totals->evictions);
        render_value(out, "switchboard_model_swaps_total", "counter",
                     "New versions of a model that replaced a loaded one.", (double)totals->swaps);
        render_value(out, "switchboard_registry_reloads_total", "counter", "Registry files read and installed.",
                     (double)totals->reloads);
    }
    render_value(out, "process_resident_memory_bytes", "gauge", "Resident set size of the server process.",
                 process_rss_bytes());
}
