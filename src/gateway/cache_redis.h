/*
 * cache_redis.h - the response cache's Redis backend (internal to cache.c):
 * values under "sb:cache:<hex key>", written with SET ... PX ttl and read
 * with GET through the gateway's Redis client (gateway/redis.h), which
 * bounds every connect and command and marks a failing Redis down for a
 * backoff, so a dead or slow Redis is a miss within the timeout, never an
 * error.
 */
#ifndef SB_GW_CACHE_REDIS_H
#define SB_GW_CACHE_REDIS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gateway/cache.h"
#include "gateway/redis.h"

/* A hit: true, *value sb_malloc'd. *failed: Redis failed (down, slow, reset). */
bool sb_gw__cache_redis_get(sb_redis *r, const sb_gw_cache_key *key, void **value, size_t *len, bool *failed);
/* False when Redis failed. */
bool sb_gw__cache_redis_put(sb_redis *r, const sb_gw_cache_key *key, const void *value, size_t len, int64_t ttl_ms);

#endif
