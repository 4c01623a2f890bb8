/*
 * cache_redis.c - the response cache's Redis backend (see cache_redis.h).
 */
#include "gateway/cache_redis.h"

#include <stdio.h>
#include <string.h>

#include "base/base.h"

#define NAME_LEN (9 + 2 * SB_GW_CACHE_KEY_BYTES)

static void key_name(const sb_gw_cache_key *key, char out[NAME_LEN + 1]) {
    static const char hex[] = "0123456789abcdef";
    memcpy(out, "sb:cache:", 9);
    for (size_t i = 0; i < SB_GW_CACHE_KEY_BYTES; i++) {
        out[9 + 2 * i] = hex[key->b[i] >> 4];
        out[9 + 2 * i + 1] = hex[key->b[i] & 15];
    }
    out[NAME_LEN] = '\0';
}

bool sb_gw__cache_redis_get(sb_redis *r, const sb_gw_cache_key *key, void **value, size_t *len, bool *failed) {
    char name[NAME_LEN + 1];
    key_name(key, name);
    const char *argv[] = {"GET", name};
    const size_t lens[] = {3, NAME_LEN};
    sb_error err;
    redisReply *rep = sb_redis_command(r, 2, argv, lens, &err);
    *failed = !rep;
    bool hit = false;
    if (rep && rep->type == REDIS_REPLY_STRING && (*value = sb_malloc(rep->len ? rep->len : 1))) {
        memcpy(*value, rep->str, rep->len);
        *len = rep->len;
        hit = true;
    }
    if (rep)
        freeReplyObject(rep);
    return hit;
}

bool sb_gw__cache_redis_put(sb_redis *r, const sb_gw_cache_key *key, const void *value, size_t len, int64_t ttl_ms) {
    char name[NAME_LEN + 1], ttl[24];
    key_name(key, name);
    snprintf(ttl, sizeof ttl, "%lld", (long long)ttl_ms);
    const char *argv[] = {"SET", name, value, "PX", ttl};
    const size_t lens[] = {3, NAME_LEN, len, 2, strlen(ttl)};
    sb_error err;
    redisReply *rep = sb_redis_command(r, 5, argv, lens, &err);
    bool ok = rep && rep->type == REDIS_REPLY_STATUS;
    if (rep)
        freeReplyObject(rep);
    return ok;
}
