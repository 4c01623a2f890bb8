/*
 * metrics.h - the server's counters and latency histograms, rendered in the
 * Prometheus text exposition format for GET /metrics.
 *
 * Every function may be called from any thread (HTTP connection threads and
 * the executor's threads); one mutex guards the whole struct, held for a few
 * increments at a time. Series about generation carry a `model` label: the
 * model that served (never the alias or route the client named). Engine
 * gauges (queue, running sequences, KV blocks, prefix-cache counters) and
 * the registry's figures are not kept here: the renderer takes them at
 * scrape time. Every name passes `promtool check metrics`: counters end in
 * _total, nothing else does.
 */
#ifndef SB_SRV_METRICS_H
#define SB_SRV_METRICS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "server/buf.h"
#include "switchboard.h"

/* The label values of switchboard_requests_total{endpoint=...}. */
typedef enum sb_srv_endpoint {
    SB_SRV_EP_CHAT,
    SB_SRV_EP_COMPLETIONS,
    SB_SRV_EP_EMBEDDINGS,
    SB_SRV_EP_MODELS,
    SB_SRV_EP_HEALTH,
    SB_SRV_EP_METRICS,
    SB_SRV_EP_PROMPTS,
    SB_SRV_EP_ADMIN,
    SB_SRV_EP_USAGE,
    SB_SRV_EP_FEEDBACK,
    SB_SRV_EP_FILES,
    SB_SRV_EP_BATCHES,
    SB_SRV_EP_OTHER, /* unknown paths */
    SB_SRV_EP_COUNT
} sb_srv_endpoint;

#define SB_SRV_N_STATUS 9  /* 200 400 404 405 413 500 503, other 4xx, other 5xx */
#define SB_SRV_TTFT_BUCKETS 14
#define SB_SRV_ITL_BUCKETS 12

typedef struct sb_srv_hist {
    uint64_t counts[16]; /* per bucket (not cumulative); the last one is +Inf */
    double sum;
    uint64_t count;
} sb_srv_hist;

/* The series of one served model (label model="..."). */
typedef struct sb_srv_model_metrics {
    struct sb_srv_model_metrics *next;
    pthread_mutex_t *mu; /* the owning sb_srv_metrics' lock */
    char name[128];
    uint64_t generations;                     /* finished generations and embeddings */
    uint64_t prompt_tokens, generated_tokens; /* as reported to clients in usage */
    uint64_t cache_hits, cache_misses;        /* response cache lookups of cacheable requests */
    sb_srv_hist ttft, itl;
} sb_srv_model_metrics;

typedef struct sb_srv_metrics {
    pthread_mutex_t mu;
    uint64_t requests[SB_SRV_EP_COUNT][SB_SRV_N_STATUS];
    sb_srv_model_metrics *models; /* every model that served, newest first; kept until destroy */
} sb_srv_metrics;

void sb_srv_metrics_init(sb_srv_metrics *m);
void sb_srv_metrics_destroy(sb_srv_metrics *m);

/* Counts one answered request. */
void sb_srv_metrics_request(sb_srv_metrics *m, sb_srv_endpoint ep, unsigned status);
/* The series of the model `name` (created on first use; NULL if out of
 * memory). The pointer stays valid until sb_srv_metrics_destroy. */
sb_srv_model_metrics *sb_srv_metrics_model(sb_srv_metrics *m, const char *name);
/* Counts one finished generation (or embedding): usage and time to first token. */
void sb_srv_metrics_generation(sb_srv_model_metrics *mm, int32_t n_prompt, int32_t n_generated, double ttft_s);
/* Counts one response cache lookup. */
void sb_srv_metrics_cache(sb_srv_model_metrics *mm, bool hit);
/* Records the gap between two consecutive tokens of one sequence. */
void sb_srv_metrics_itl(sb_srv_model_metrics *mm, double seconds);

/* Appends the whole exposition to out: the counters, the engines of the
 * loaded models (their sb_switchboard_list entries at scrape time), and the
 * registry's totals (NULL while starting). */
void sb_srv_metrics_render(sb_srv_metrics *m, const sb_model_info *loaded, size_t n_loaded,
                           const sb_switchboard_totals *totals, sb_srv_buf *out);

#endif
