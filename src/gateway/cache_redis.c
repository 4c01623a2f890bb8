/*
 * cache_redis.c - the response cache's Redis backend (see cache_redis.h).
 *
 * One connection behind a mutex: a cache command is one round trip of a few
 * tens of microseconds, so requests queue on it briefly rather than open a
 * connection each. Connect and every command are bounded by the timeout
 * (hiredis's connect and socket timeouts); any failure drops the connection
 * and marks Redis down for a backoff (doubling from BACKOFF_MIN_MS to
 * BACKOFF_MAX_MS, reset by a success), so a dead Redis costs one timeout
 * per backoff window whatever the request rate, and a stopped one the same:
 * threads that queued behind the failing command find it down and return.
 */
#include "gateway/cache_redis.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"

#define BACKOFF_MIN_MS 500
#define BACKOFF_MAX_MS 8000

struct sb_gw__cache_redis {
    pthread_mutex_t mu;
    char host[256];
    int port, db;
    struct timeval timeout;
    redisContext *ctx;   /* NULL: not connected */
    int64_t down_until;  /* monotonic ms; no attempt before it */
    int64_t backoff_ms;  /* the next failure's wait */
};

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* redis://host[:port][/db] */
static bool parse_url(const char *url, sb_gw__cache_redis *r) {
    const char *p = url + strlen("redis://"), *colon = strchr(p, ':'), *slash = strchr(p, '/');
    const char *host_end = colon && (!slash || colon < slash) ? colon : slash ? slash : p + strlen(p);
    size_t n = (size_t)(host_end - p);
    if (n == 0 || n >= sizeof r->host)
        return false;
    memcpy(r->host, p, n);
    r->host[n] = '\0';
    r->port = 6379;
    r->db = 0;
    char *end;
    if (host_end == colon) {
        long port = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || port < 1 || port > 65535 || (*end && *end != '/'))
            return false;
        r->port = (int)port;
    }
    if (slash && slash[1]) {
        long db = strtol(slash + 1, &end, 10);
        if (*end || db < 0 || db > 1 << 20)
            return false;
        r->db = (int)db;
    }
    return true;
}

static void mark_down(sb_gw__cache_redis *r) {
    if (r->ctx)
        redisFree(r->ctx);
    r->ctx = NULL;
    r->down_until = now_ms() + r->backoff_ms;
    r->backoff_ms = SB_MIN(r->backoff_ms * 2, BACKOFF_MAX_MS);
}

/* With mu held: a connection, or false (down, or the attempt failed now). */
static bool connected(sb_gw__cache_redis *r) {
    if (r->ctx)
        return true;
    if (now_ms() < r->down_until)
        return false;
    r->ctx = redisConnectWithTimeout(r->host, r->port, r->timeout);
    if (!r->ctx || r->ctx->err || redisSetTimeout(r->ctx, r->timeout) != REDIS_OK) {
        mark_down(r);
        return false;
    }
    if (r->db) {
        redisReply *rep = redisCommand(r->ctx, "SELECT %d", r->db);
        bool ok = rep && rep->type == REDIS_REPLY_STATUS;
        if (rep)
            freeReplyObject(rep);
        if (!ok) {
            mark_down(r);
            return false;
        }
    }
    return true;
}

sb_status sb_gw__cache_redis_create(const char *url, int timeout_ms, sb_gw__cache_redis **out, sb_error *err) {
    *out = NULL;
    sb_gw__cache_redis *r = sb_calloc(1, sizeof *r);
    if (!r)
        return sb_fail(err, SB_ERR_NOMEM, "cache: out of memory");
    if (!parse_url(url, r)) {
        sb_free(r);
        return sb_fail(err, SB_ERR_INVALID_ARG, "cache: '%s' is not a Redis URL (redis://host[:port][/db])", url);
    }
    r->timeout = (struct timeval){.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    r->backoff_ms = BACKOFF_MIN_MS;
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_lock(&r->mu);
    connected(r); /* an unreachable Redis now is retried after the backoff */
    pthread_mutex_unlock(&r->mu);
    *out = r;
    return SB_OK;
}

void sb_gw__cache_redis_free(sb_gw__cache_redis *r) {
    if (!r)
        return;
    if (r->ctx)
        redisFree(r->ctx);
    pthread_mutex_destroy(&r->mu);
    sb_free(r);
}

static void key_name(const sb_gw_cache_key *key, char out[9 + 2 * SB_GW_CACHE_KEY_BYTES + 1]) {
    static const char hex[] = "0123456789abcdef";
    memcpy(out, "sb:cache:", 9);
    for (size_t i = 0; i < SB_GW_CACHE_KEY_BYTES; i++) {
        out[9 + 2 * i] = hex[key->b[i] >> 4];
        out[9 + 2 * i + 1] = hex[key->b[i] & 15];
    }
    out[9 + 2 * SB_GW_CACHE_KEY_BYTES] = '\0';
}

/* One command; NULL (and Redis marked down) when it failed. */
static redisReply *command(sb_gw__cache_redis *r, int argc, const char **argv, const size_t *lens) {
    if (!connected(r))
        return NULL;
    redisReply *rep = redisCommandArgv(r->ctx, argc, argv, lens);
    if (!rep || r->ctx->err) {
        if (rep)
            freeReplyObject(rep);
        mark_down(r);
        return NULL;
    }
    r->backoff_ms = BACKOFF_MIN_MS;
    return rep;
}

bool sb_gw__cache_redis_get(sb_gw__cache_redis *r, const sb_gw_cache_key *key, void **value, size_t *len,
                            bool *failed) {
    char name[9 + 2 * SB_GW_CACHE_KEY_BYTES + 1];
    key_name(key, name);
    const char *argv[] = {"GET", name};
    const size_t lens[] = {3, strlen(name)};
    pthread_mutex_lock(&r->mu);
    redisReply *rep = command(r, 2, argv, lens);
    pthread_mutex_unlock(&r->mu);
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

bool sb_gw__cache_redis_put(sb_gw__cache_redis *r, const sb_gw_cache_key *key, const void *value, size_t len,
                            int64_t ttl_ms) {
    char name[9 + 2 * SB_GW_CACHE_KEY_BYTES + 1], ttl[24];
    key_name(key, name);
    snprintf(ttl, sizeof ttl, "%lld", (long long)ttl_ms);
    const char *argv[] = {"SET", name, value, "PX", ttl};
    const size_t lens[] = {3, strlen(name), len, 2, strlen(ttl)};
    pthread_mutex_lock(&r->mu);
    redisReply *rep = command(r, 5, argv, lens);
    pthread_mutex_unlock(&r->mu);
    bool ok = rep && rep->type == REDIS_REPLY_STATUS;
    if (rep)
        freeReplyObject(rep);
    return ok;
}
