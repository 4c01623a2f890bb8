/*
 * cache.h - the response cache: answers to deterministic requests (greedy,
 * or sampled with a seed the client fixed) kept by the hash of everything
 * that decides them, so a repeated question is answered without the engine.
 *
 * This layer stores opaque values under 32-byte keys; what goes into a key
 * (the serving model's identity, the rendered prompt, every parameter that
 * changes the output) and what a value holds (the events a replay needs) is
 * the server's business (src/server/account.c). Keys are SHA-256 digests
 * made with the hasher below, so two different requests never share an
 * entry by accident.
 *
 * Backends:
 *   memory  - in this process: least-recently-used entries go first once
 *             the byte bound is reached, and every entry lives at most the
 *             TTL (an expired entry is a miss and is dropped when seen).
 *   redis   - shared by every replica pointed at the same Redis, through
 *             the gateway's Redis client (gateway/redis.h: bounded connect
 *             and command time, marked down and backed off on failure): a
 *             dead or slow Redis turns into misses after at most the
 *             timeout, never into errors. Entries expire by Redis's own PX.
 *
 * Threads: every function may be called from any thread.
 */
#ifndef SB_GW_CACHE_H
#define SB_GW_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "switchboard.h"

#define SB_GW_CACHE_KEY_BYTES 32
#define SB_GW_CACHE_DEFAULT_BYTES ((size_t)256 << 20)
#define SB_GW_CACHE_DEFAULT_TTL_MS (3600 * 1000)
#define SB_GW_CACHE_REDIS_TIMEOUT_MS 50 /* the gateway's Redis default (SB_REDIS_TIMEOUT_MS) */

typedef struct sb_gw_cache_key {
    uint8_t b[SB_GW_CACHE_KEY_BYTES];
} sb_gw_cache_key;

/* Incremental SHA-256 (OpenSSL) for building keys. */
typedef struct sb_gw_hasher {
    void *ctx; /* EVP_MD_CTX */
    bool failed;
} sb_gw_hasher;
void sb_gw_hasher_init(sb_gw_hasher *h);
void sb_gw_hasher_update(sb_gw_hasher *h, const void *data, size_t len);
/* A length-prefixed field, so that ("ab","c") and ("a","bc") differ. */
void sb_gw_hasher_field(sb_gw_hasher *h, const void *data, size_t len);
/* Writes the digest and frees the context; false if OpenSSL failed at any step. */
bool sb_gw_hasher_final(sb_gw_hasher *h, sb_gw_cache_key *out);

typedef struct sb_gw_cache sb_gw_cache;

typedef struct sb_gw_cache_params {
    const char *backend; /* "memory", or "redis://host[:port][/db]" */
    size_t max_bytes;    /* memory: the bound on keys, values and bookkeeping */
    int64_t ttl_ms;      /* > 0 */
    int timeout_ms;      /* redis: bound on connect and each command (<= 0: SB_GW_CACHE_REDIS_TIMEOUT_MS) */
} sb_gw_cache_params;
sb_gw_cache_params sb_gw_cache_default_params(void);

/* A malformed backend (not "memory" nor a redis:// URL) fails with
 * SB_ERR_INVALID_ARG; an unreachable Redis does not (it is retried). */
sb_status sb_gw_cache_create(const sb_gw_cache_params *p, sb_gw_cache **out, sb_error *err);
void sb_gw_cache_free(sb_gw_cache *c);

/* On a hit returns true with *value (sb_malloc'd copy, the caller frees
 * it) and *len; false on a miss, an expired entry or a backend failure. */
bool sb_gw_cache_get(sb_gw_cache *c, const sb_gw_cache_key *key, void **value, size_t *len);
/* Stores a copy (replacing an entry of the same key). A value larger than
 * the whole bound is not stored; a backend failure is counted, not raised. */
void sb_gw_cache_put(sb_gw_cache *c, const sb_gw_cache_key *key, const void *value, size_t len);
/* Whether puts cross the network (the caller then makes them off the
 * request's path). */
bool sb_gw_cache_remote(const sb_gw_cache *c);

typedef struct sb_gw_cache_stats {
    uint64_t entries, bytes;       /* memory backend */
    uint64_t evictions, expired;   /* entries dropped for room / for age */
    uint64_t backend_errors;       /* redis: commands that failed (then misses) */
} sb_gw_cache_stats;
void sb_gw_cache_stats_get(sb_gw_cache *c, sb_gw_cache_stats *out);

#endif
