/*
 * limits.h - per-key rate limits: three token buckets per key, requests
 * per second (capacity rps, refilled at rps per second), requests per
 * minute (capacity rpm, rpm/60 per second) and tokens per minute (capacity
 * tpm, tpm/60 per second). A bucket starts full; a request is admitted
 * only when every limited bucket holds its cost (1 request, and its token
 * reservation: prompt plus the most it may generate), and then all are
 * charged together, so in any window of T seconds a key is admitted at
 * most capacity + rate * T of each. When the request ends, settle gives
 * back what the reservation over-estimated (or takes what it missed).
 *
 * Arithmetic is exact in integers: a bucket's level is kept in units of
 * 1/window_us of a token, so refilling for dt microseconds adds dt * limit
 * and nothing is rounded (limits up to SB_GW_LIMIT_MAX keep every level
 * below 2^53, which the Redis script's doubles also hold exactly).
 *
 * Where: with a Redis client (redis.h) the buckets live in Redis, hash
 * "sb:rl:NAME", updated by one Lua script per admission and per
 * settlement, with Redis's own clock, so every replica shares one limit;
 * whenever Redis does not answer, this process's local buckets decide
 * (they are the only ones without Redis). One mutex guards the local ones.
 */
#ifndef SB_GW_LIMITS_H
#define SB_GW_LIMITS_H

#include <stdbool.h>
#include <stdint.h>

#include "gateway/redis.h"
#include "switchboard.h"

#define SB_GW_LIMIT_MAX 100000000 /* per second or per minute */

typedef struct sb_gw_limit_spec {
    int64_t rps, rpm, tpm; /* 0: unlimited */
} sb_gw_limit_spec;

/* What the x-ratelimit-* headers and a refusal say. The requests figures
 * are those of whichever request bucket (second or minute) is nearer to
 * empty. */
typedef struct sb_gw_limit_verdict {
    bool admitted;
    bool never;                  /* the cost exceeds a bucket's capacity: waiting cannot help */
    bool limits_requests, limits_tokens; /* whether the key has such limits at all */
    int64_t limit_requests, remaining_requests, reset_requests_us;
    int64_t limit_tokens, remaining_tokens, reset_tokens_us;
    int64_t retry_after_us;      /* refused: when the buckets will hold the cost */
    bool via_redis;
} sb_gw_limit_verdict;

typedef struct sb_gw_limits sb_gw_limits;

/* redis may be NULL (local buckets only); borrowed, must outlive the limits. */
sb_status sb_gw_limits_create(sb_redis *redis, sb_gw_limits **out, sb_error *err);
void sb_gw_limits_free(sb_gw_limits *l);

/* Admits (or not) one request of `tokens` for key `name` under `spec`,
 * at monotonic time now_us (local buckets; Redis uses its own clock). */
void sb_gw_limits_admit(sb_gw_limits *l, const char *name, const sb_gw_limit_spec *spec, int64_t tokens,
                        int64_t now_us, sb_gw_limit_verdict *v);
/* The figures for the headers, taking nothing (a keyed request that uses
 * no model: GET /v1/models). */
void sb_gw_limits_peek(sb_gw_limits *l, const char *name, const sb_gw_limit_spec *spec, int64_t now_us,
                       sb_gw_limit_verdict *v);
/* The request admitted with `reserved` tokens used `used`: the tokens
 * bucket gets reserved - used back (never above capacity). */
void sb_gw_limits_settle(sb_gw_limits *l, const char *name, const sb_gw_limit_spec *spec, int64_t reserved,
                         int64_t used, int64_t now_us);

/* OpenAI's duration format for the reset headers: "20ms", "1s", "1.5s",
 * "6m0s", "1h2m3s". */
void sb_gw_format_duration(int64_t us, char *out, size_t cap);

#endif
