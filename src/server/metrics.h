/*
 * metrics.h - the server's counters and latency histograms, rendered in the
 * Prometheus text exposition format for GET /metrics.
 *
 * Every function may be called from any thread (HTTP connection threads and
 * the engine thread); one mutex guards the whole struct, held for a few
 * increments at a time. Engine-side gauges (queue, running sequences, KV
 * blocks, prefix-cache counters) are not kept here: the renderer takes them
 * from sb_engine_get_stats at scrape time.
 */
#ifndef SB_SRV_METRICS_H
#define SB_SRV_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "engine/engine.h"
#include "server/buf.h"

/* The label values of switchboard_requests_total{endpoint=...}. */
typedef enum sb_srv_endpoint {
    SB_SRV_EP_CHAT,
    SB_SRV_EP_COMPLETIONS,
    SB_SRV_EP_EMBEDDINGS,
    SB_SRV_EP_MODELS,
    SB_SRV_EP_HEALTH,
    SB_SRV_EP_METRICS,
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

typedef struct sb_srv_metrics {
    pthread_mutex_t mu;
    uint64_t requests[SB_SRV_EP_COUNT][SB_SRV_N_STATUS];
    uint64_t prompt_tokens, generated_tokens; /* as reported to clients in usage */
    sb_srv_hist ttft, itl;
} sb_srv_metrics;

void sb_srv_metrics_init(sb_srv_metrics *m);
void sb_srv_metrics_destroy(sb_srv_metrics *m);

/* Counts one answered request. */
void sb_srv_metrics_request(sb_srv_metrics *m, sb_srv_endpoint ep, unsigned status);
/* Counts one finished generation (or embedding): usage and time to first token. */
void sb_srv_metrics_generation(sb_srv_metrics *m, int32_t n_prompt, int32_t n_generated, double ttft_s);
/* Records the gap between two consecutive tokens of one sequence. */
void sb_srv_metrics_itl(sb_srv_metrics *m, double seconds);

/* Appends the whole exposition to out. `stats` is NULL while the model loads. */
void sb_srv_metrics_render(sb_srv_metrics *m, const sb_engine_stats *stats, sb_srv_buf *out);

#endif
