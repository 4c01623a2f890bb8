/*
 * metrics.c - Prometheus counters and histograms (see metrics.h).
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "server/metrics.h"

static const char *const endpoint_names[SB_SRV_EP_COUNT] = {
    [SB_SRV_EP_CHAT] = "/v1/chat/completions",
    [SB_SRV_EP_COMPLETIONS] = "/v1/completions",
    [SB_SRV_EP_EMBEDDINGS] = "/v1/embeddings",
    [SB_SRV_EP_MODELS] = "/v1/models",
    [SB_SRV_EP_HEALTH] = "/health",
    [SB_SRV_EP_METRICS] = "/metrics",
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

void sb_srv_metrics_destroy(sb_srv_metrics *m) { pthread_mutex_destroy(&m->mu); }

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

void sb_srv_metrics_generation(sb_srv_metrics *m, int32_t n_prompt, int32_t n_generated, double ttft_s) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)SB_MAX(n_prompt, 0);
    m->generated_tokens += (uint64_t)SB_MAX(n_generated, 0);
    if (ttft_s > 0)
        observe(&m->ttft, ttft_bounds, SB_SRV_TTFT_BUCKETS - 1, ttft_s);
    pthread_mutex_unlock(&m->mu);
}

void sb_srv_metrics_itl(sb_srv_metrics *m, double seconds) {
    pthread_mutex_lock(&m->mu);
    observe(&m->itl, itl_bounds, SB_SRV_ITL_BUCKETS - 1, seconds);
    pthread_mutex_unlock(&m->mu);
}

static void render_hist(sb_srv_buf *out, const char *name, const char *help, const sb_srv_hist *h,
                        const double *bounds, int n_bounds) {
    sb_srv_buf_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < n_bounds; i++) {
        cum += h->counts[i];
        sb_srv_buf_printf(out, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)cum);
    }
    sb_srv_buf_printf(out, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
                      (unsigned long long)h->count, name, h->sum, name, (unsigned long long)h->count);
}

static void render_value(sb_srv_buf *out, const char *name, const char *type, const char *help, double v) {
    sb_srv_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n%s %.0f\n", name, help, name, type, name, v);
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

void sb_srv_metrics_render(sb_srv_metrics *m, const sb_engine_stats *stats, sb_srv_buf *out) {
    pthread_mutex_lock(&m->mu);
    sb_srv_metrics snap = *m; /* copied under the lock, rendered without it */
    pthread_mutex_unlock(&m->mu);

    sb_srv_buf_puts(out, "# HELP switchboard_requests_total HTTP requests answered, by endpoint and status.\n"
                         "# TYPE switchboard_requests_total counter\n");
    for (int e = 0; e < SB_SRV_EP_COUNT; e++)
        for (int s = 0; s < SB_SRV_N_STATUS; s++)
            if (snap.requests[e][s])
                sb_srv_buf_printf(out, "switchboard_requests_total{endpoint=\"%s\",status=\"%s\"} %llu\n",
                                  endpoint_names[e], status_names[s], (unsigned long long)snap.requests[e][s]);
    render_value(out, "switchboard_prompt_tokens_total", "counter",
                 "Prompt tokens of finished requests (usage.prompt_tokens).", (double)snap.prompt_tokens);
    render_value(out, "switchboard_generation_tokens_total", "counter",
                 "Generated tokens of finished requests (usage.completion_tokens).", (double)snap.generated_tokens);
    render_hist(out, "switchboard_time_to_first_token_seconds", "Time from submission to the first token.",
                &snap.ttft, ttft_bounds, SB_SRV_TTFT_BUCKETS - 1);
    render_hist(out, "switchboard_inter_token_latency_seconds", "Time between consecutive tokens of a sequence.",
                &snap.itl, itl_bounds, SB_SRV_ITL_BUCKETS - 1);
    if (stats) {
        render_value(out, "switchboard_prompt_tokens_computed_total", "counter",
                     "Prompt positions run through the model.", (double)stats->prompt_tokens_computed);
        render_value(out, "switchboard_prompt_tokens_cached_total", "counter",
                     "Prompt positions reused from the prefix cache instead of computed.",
                     (double)stats->prompt_tokens_cached);
        render_value(out, "switchboard_engine_generated_tokens_total", "counter",
                     "Tokens sampled by the engine (including cancelled requests).",
                     (double)stats->generated_tokens);
        render_value(out, "switchboard_preemptions_total", "counter",
                     "Sequences preempted for lack of KV cache and recomputed later.", (double)stats->preemptions);
        render_value(out, "switchboard_engine_steps_total", "counter", "Forward steps run by the engine.",
                     (double)stats->steps);
        render_value(out, "switchboard_queue_length", "gauge", "Requests waiting to start.", stats->waiting);
        render_value(out, "switchboard_running_sequences", "gauge", "Sequences being generated.", stats->running);
        render_value(out, "switchboard_kv_cache_blocks_used", "gauge", "KV-cache blocks in use.",
                     stats->kv_blocks_used);
        render_value(out, "switchboard_kv_cache_blocks_total", "gauge", "KV-cache blocks in all.",
                     stats->kv_blocks_total);
        render_value(out, "switchboard_kv_cache_block_size", "gauge", "Positions per KV-cache block.",
                     stats->block_size);
    }
    render_value(out, "process_resident_memory_bytes", "gauge", "Resident set size of the server process.",
                 process_rss_bytes());
}
