/*
 * redis.c - one bounded, self-healing Redis connection (see redis.h).
 */
#include "gateway/redis.h"

#include <errno.h>
#include <limits.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "gateway/clock.h"

struct sb_redis {
    pthread_mutex_t mu;
    char host[256];
    int port;
    int db;
    char addr[300];
    struct timeval timeout;
    redisContext *ctx;  /* NULL while down */
    int64_t retry_at;   /* monotonic us before which no connection is tried */
    int backoff_ms;     /* the next backoff after a failure */
    bool up;
};

static sb_status parse_url(sb_redis *r, const char *url, sb_error *err) {
    const char *p = url;
    if (strncmp(p, "redis://", 8) != 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "%s: a Redis URL starts with redis:// (redis://host[:port][/db])", url);
    p += 8;
    size_t hl = strcspn(p, ":/");
    if (hl == 0 || hl >= sizeof r->host)
        return sb_fail(err, SB_ERR_INVALID_ARG, "%s: the Redis URL has no host (redis://host[:port][/db])", url);
    memcpy(r->host, p, hl);
    r->host[hl] = '\0';
    p += hl;
    r->port = 6379;
    r->db = 0;
    if (*p == ':') {
        char *end;
        errno = 0;
        long port = strtol(p + 1, &end, 10);
        if (end == p + 1 || errno || port < 1 || port > 65535 || (*end && *end != '/'))
            return sb_fail(err, SB_ERR_INVALID_ARG, "%s: the Redis port must be a number from 1 to 65535", url);
        r->port = (int)port;
        p = end;
    }
    if (*p == '/' && p[1]) {
        char *end;
        errno = 0;
        long db = strtol(p + 1, &end, 10);
        if (end == p + 1 || errno || db < 0 || db > INT_MAX || *end)
            return sb_fail(err, SB_ERR_INVALID_ARG, "%s: the Redis database must be a number (redis://host:port/0)", url);
        r->db = (int)db;
    } else if (*p && strcmp(p, "/") != 0) {
        return sb_fail(err, SB_ERR_INVALID_ARG, "%s: unexpected '%s' after the Redis host", url, p);
    }
    snprintf(r->addr, sizeof r->addr, "%s:%d", r->host, r->port);
    return SB_OK;
}

/* Drops the connection and schedules the next attempt. Caller holds mu. */
static void mark_down(sb_redis *r) {
    if (r->ctx)
        redisFree(r->ctx);
    r->ctx = NULL;
    r->up = false;
    r->retry_at = sb_gw_now_us() + (int64_t)r->backoff_ms * 1000;
    r->backoff_ms = SB_MIN(r->backoff_ms * 2, SB_REDIS_BACKOFF_MAX_MS);
}

/* Sends one command on the live connection; NULL (and the connection
 * dropped) on any transport failure. Caller holds mu and r->ctx is set. */
static redisReply *roundtrip(sb_redis *r, int argc, const char **argv, const size_t *argvlen, sb_error *err) {
    redisReply *reply = redisCommandArgv(r->ctx, argc, argv, argvlen);
    if (!reply) {
        sb_fail(err, SB_ERR_IO, "redis %s: %s", r->addr, r->ctx->errstr[0] ? r->ctx->errstr : "no reply");
        mark_down(r);
    }
    return reply;
}

/* Makes sure a connection is up, connecting when the backoff allows.
 * Caller holds mu. */
static bool ensure_connected(sb_redis *r, sb_error *err) {
    if (r->ctx)
        return true;
    if (sb_gw_now_us() < r->retry_at) {
        sb_fail(err, SB_ERR_IO, "redis %s: down, next attempt after the backoff", r->addr);
        return false;
    }
    r->ctx = redisConnectWithTimeout(r->host, r->port, r->timeout);
    if (!r->ctx || r->ctx->err) {
        sb_fail(err, SB_ERR_IO, "redis %s: cannot connect: %s", r->addr, r->ctx ? r->ctx->errstr : "out of memory");
        mark_down(r);
        return false;
    }
    if (redisSetTimeout(r->ctx, r->timeout) != REDIS_OK) {
        sb_fail(err, SB_ERR_IO, "redis %s: cannot set the command timeout", r->addr);
        mark_down(r);
        return false;
    }
    if (r->db != 0) {
        char db[16];
        snprintf(db, sizeof db, "%d", r->db);
        const char *argv[] = {"SELECT", db};
        redisReply *reply = roundtrip(r, 2, argv, NULL, err);
        if (!reply)
            return false;
        bool ok = reply->type != REDIS_REPLY_ERROR;
        if (!ok)
            sb_fail(err, SB_ERR_IO, "redis %s: SELECT %d: %s", r->addr, r->db, reply->str);
        freeReplyObject(reply);
        if (!ok) {
            mark_down(r);
            return false;
        }
    }
    return true;
}

static void note_success(sb_redis *r) {
    r->up = true;
    r->backoff_ms = SB_REDIS_BACKOFF_MIN_MS;
}

sb_status sb_redis_create(const char *url, int timeout_ms, sb_redis **out, sb_error *err) {
    *out = NULL;
    sb_redis *r = sb_calloc(1, sizeof *r);
    if (!r)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for the Redis client");
    sb_status st = parse_url(r, url, err);
    if (st != SB_OK) {
        sb_free(r);
        return st;
    }
    if (timeout_ms <= 0)
        timeout_ms = SB_REDIS_TIMEOUT_MS;
    r->timeout.tv_sec = timeout_ms / 1000;
    r->timeout.tv_usec = (timeout_ms % 1000) * 1000;
    r->backoff_ms = SB_REDIS_BACKOFF_MIN_MS;
    pthread_mutex_init(&r->mu, NULL);
    /* A first attempt, so that sb_redis_up() tells the truth at start-up;
     * a failure only starts the backoff. */
    pthread_mutex_lock(&r->mu);
    if (ensure_connected(r, NULL))
        note_success(r);
    pthread_mutex_unlock(&r->mu);
    *out = r;
    return SB_OK;
}

void sb_redis_free(sb_redis *r) {
    if (!r)
        return;
    if (r->ctx)
        redisFree(r->ctx);
    pthread_mutex_destroy(&r->mu);
    sb_free(r);
}

redisReply *sb_redis_command(sb_redis *r, int argc, const char **argv, const size_t *argvlen, sb_error *err) {
    pthread_mutex_lock(&r->mu);
    redisReply *reply = NULL;
    if (ensure_connected(r, err)) {
        reply = roundtrip(r, argc, argv, argvlen, err);
        if (reply)
            note_success(r);
    }
    pthread_mutex_unlock(&r->mu);
    return reply;
}

void sb_redis_script_init(sb_redis_script *script, const char *source) {
    unsigned char md[SHA_DIGEST_LENGTH];
    SHA1((const unsigned char *)source, strlen(source), md);
    script->source = source;
    for (int i = 0; i < SHA_DIGEST_LENGTH; i++)
        snprintf(script->sha1 + 2 * i, 3, "%02x", md[i]);
}

redisReply *sb_redis_eval(sb_redis *r, const sb_redis_script *script, int nkeys, int nargs, const char **args,
                          const size_t *argslen, sb_error *err) {
    enum { MAX_ARGS = 32 };
    if (nargs < 0 || nargs > MAX_ARGS - 3 || nkeys < 0 || nkeys > nargs) {
        sb_fail(err, SB_ERR_INVALID_ARG, "redis: a script takes at most %d arguments", MAX_ARGS - 3);
        return NULL;
    }
    char nk[16];
    snprintf(nk, sizeof nk, "%d", nkeys);
    const char *argv[MAX_ARGS];
    size_t argvlen[MAX_ARGS];
    argv[0] = "EVALSHA";
    argv[1] = script->sha1;
    argv[2] = nk;
    for (int i = 0; i < 3; i++)
        argvlen[i] = strlen(argv[i]);
    for (int i = 0; i < nargs; i++) {
        argv[3 + i] = args[i];
        argvlen[3 + i] = argslen ? argslen[i] : strlen(args[i]);
    }
    redisReply *reply = sb_redis_command(r, 3 + nargs, argv, argvlen, err);
    if (reply && reply->type == REDIS_REPLY_ERROR && strncmp(reply->str, "NOSCRIPT", 8) == 0) {
        freeReplyObject(reply);
        argv[0] = "EVAL";
        argv[1] = script->source;
        argvlen[0] = 4;
        argvlen[1] = strlen(script->source);
        reply = sb_redis_command(r, 3 + nargs, argv, argvlen, err);
    }
    return reply;
}

bool sb_redis_up(sb_redis *r) {
    pthread_mutex_lock(&r->mu);
    bool up = r->up;
    pthread_mutex_unlock(&r->mu);
    return up;
}

const char *sb_redis_addr(const sb_redis *r) { return r->addr; }
