/*
 * usage.h - usage and cost in the state directory's usage.db (SQLite, WAL,
 * opened by sb_db_open): one row per (day, key, served model, requested
 * name) holding requests, prompt, completion and cached tokens, response
 * cache hits, errors, latency and time-to-first-token sums, cost and the
 * feedback ratings of those requests; beside it every completion id with
 * whose it was (so feedback finds its row) and the feedback itself.
 *
 * The requested name is the A/B arm's key: a request for a route serves
 * one of its models, so (requested, model) says which arm answered and
 * `--by model` compares the arms by speed, cost and rating.
 *
 * Calls are synchronous and take the connection's mutex; the server makes
 * them from a writer thread (src/server/account.c), so a slow or locked
 * file never holds up an answer. A locked file waits SB_DB_BUSY_TIMEOUT_MS
 * and then fails with SB_ERR_BUSY, a corrupt one with SB_ERR_FORMAT; both
 * name the file.
 */
#ifndef SB_GW_USAGE_H
#define SB_GW_USAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "switchboard.h"

#define SB_GW_USAGE_FILE "usage.db"
#define SB_GW_USAGE_NAME_MAX 128
/* Ratings are numbers from -1 (bad) to 1 (good); thumbs down/up are -1 and 1. */
#define SB_GW_RATING_MIN (-1.0)
#define SB_GW_RATING_MAX 1.0

typedef struct sb_gw_usage sb_gw_usage;

/* One finished request. Strings are borrowed. */
typedef struct sb_gw_usage_rec {
    int64_t time_s;        /* unix time it ended: its day (UTC) */
    const char *key;       /* the API key's name; "" anonymous */
    const char *model;     /* the model that served; "" when none did */
    const char *requested; /* the name the client asked for (a route, an alias, the model) */
    const char *id;        /* the completion id feedback refers to; NULL: none (errors) */
    int64_t prompt, completion, cached; /* as the response's usage said */
    bool cache_hit;        /* answered from the response cache */
    bool error;            /* not answered completely (4xx/5xx, engine error, client gone) */
    double latency_ms;     /* the whole request */
    double ttft_ms;        /* < 0: none (no token, or not generating) */
    double cost;           /* in the registry's price unit */
} sb_gw_usage_rec;

/* Opens (creating) DIR/usage.db. */
sb_status sb_gw_usage_open(const char *dir, sb_gw_usage **out, sb_error *err);
void sb_gw_usage_close(sb_gw_usage *u);

/* Adds n requests in one transaction (all or none). */
sb_status sb_gw_usage_record(sb_gw_usage *u, const sb_gw_usage_rec *recs, size_t n, sb_error *err);

/* Rates completion `id`; `key` is the rater's key name: only its own
 * completions are found (NULL: any, for administrators). A second rating
 * of the same id replaces the first. SB_ERR_NOT_FOUND for an unknown id
 * (or another key's); the model that served it in model_out. */
sb_status sb_gw_usage_feedback(sb_gw_usage *u, const char *id, const char *key, double rating, const char *comment,
                               char model_out[SB_GW_USAGE_NAME_MAX], sb_error *err);

typedef enum sb_gw_usage_by { SB_GW_BY_MODEL, SB_GW_BY_KEY, SB_GW_BY_DAY } sb_gw_usage_by;
/* "model", "key", "day"; false for anything else. */
bool sb_gw_usage_by_parse(const char *s, sb_gw_usage_by *out);

typedef struct sb_gw_usage_row {
    char group[SB_GW_USAGE_NAME_MAX]; /* the model, the key ("" anonymous) or the day */
    char arm[SB_GW_USAGE_NAME_MAX];   /* by model: the name requested when it differs (a route), else "" */
    int64_t requests, prompt, completion, cached, cache_hits, errors;
    double latency_ms_sum;
    int64_t latency_n;
    double ttft_ms_sum;
    int64_t ttft_n;
    double cost;
    double rating_sum;
    int64_t rating_n;
} sb_gw_usage_row;

/* The rows grouped `by`, from day `since` ("YYYY-MM-DD", NULL: all) on,
 * of key `key` only (NULL: every key; "" the anonymous requests). *rows is
 * sb_malloc'd (free with sb_free). */
sb_status sb_gw_usage_query(sb_gw_usage *u, sb_gw_usage_by by, const char *since, const char *key,
                            sb_gw_usage_row **rows, size_t *n, sb_error *err);

/* "YYYY-MM-DD" of unix time t (UTC). */
void sb_gw_usage_day(int64_t t, char out[11]);
/* Whether s is a date "YYYY-MM-DD". */
bool sb_gw_usage_day_valid(const char *s);

#endif
