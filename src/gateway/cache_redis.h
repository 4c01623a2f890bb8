/*
 * cache_redis.h - the response cache's Redis backend (internal to cache.c):
 * values under "sb:cache:<hex key>", written with SET ... PX ttl and read
 * with GET, every command bounded in time; a failure marks Redis down for
 * a backoff during which every call is a miss at once.
 */
#ifndef SB_GW_CACHE_REDIS_H
#define SB_GW_CACHE_REDIS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gateway/cache.h"

typedef struct sb_gw__cache_redis sb_gw__cache_redis;

sb_status sb_gw__cache_redis_create(const char *url, int timeout_ms, sb_gw__cache_redis **out, sb_error *err);
void sb_gw__cache_redis_free(sb_gw__cache_redis *r);
/* A hit: true, *value sb_malloc'd. *failed: Redis failed (down, slow, reset). */
bool sb_gw__cache_redis_get(sb_gw__cache_redis *r, const sb_gw_cache_key *key, void **value, size_t *len,
                            bool *failed);
/* False when Redis failed. */
bool sb_gw__cache_redis_put(sb_gw__cache_redis *r, const sb_gw_cache_key *key, const void *value, size_t len,
                            int64_t ttl_ms);

#endif
