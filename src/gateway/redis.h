/*
 * redis.h - the gateway's one way to talk to Redis (hiredis underneath),
 * shared by the rate limits (buckets several replicas share) and the
 * response cache: Redis is an optimisation there, never a dependency, so a
 * dead or slow Redis must cost a bounded delay and never an error to a
 * client.
 *
 * How: one connection behind a mutex; connecting and every command are
 * bounded by the timeout given at creation. Any failure (refused, reset,
 * timed out, a protocol error) drops the connection and marks Redis down;
 * while down, commands fail at once without touching the network, and the
 * next connection attempt waits for a backoff (doubling from
 * SB_REDIS_BACKOFF_MIN_MS to SB_REDIS_BACKOFF_MAX_MS, reset by a success).
 * So a dead Redis costs at most one timeout per backoff window, whatever
 * the request rate: callers that queue on the mutex behind the failing
 * command find Redis marked down and return immediately.
 *
 * A reply that Redis itself sends as an error (a script's error, a wrong
 * type) is a reply, not a failure: the connection stays up and the caller
 * sees REDIS_REPLY_ERROR.
 */
#ifndef SB_GW_REDIS_H
#define SB_GW_REDIS_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>

#include "switchboard.h"

#define SB_REDIS_TIMEOUT_MS 50 /* default bound on a connect or a command */
#define SB_REDIS_BACKOFF_MIN_MS 500
#define SB_REDIS_BACKOFF_MAX_MS 8000

typedef struct sb_redis sb_redis;

/* A Lua script run by EVALSHA (its SHA-1 computed here), sent whole by EVAL
 * only when the server answers NOSCRIPT (a restarted or flushed Redis). */
typedef struct sb_redis_script {
    const char *source; /* not owned: usually a string literal */
    char sha1[41];
} sb_redis_script;

/* Parses `url` (redis://host[:port][/db], port 6379 and db 0 by default)
 * and tries a first connection; an unreachable Redis is not an error (it is
 * retried after the backoff), a malformed URL is (SB_ERR_INVALID_ARG).
 * timeout_ms <= 0 means SB_REDIS_TIMEOUT_MS. */
sb_status sb_redis_create(const char *url, int timeout_ms, sb_redis **out, sb_error *err);
/* Closes the connection; NULL is a no-op. */
void sb_redis_free(sb_redis *r);

/* Runs one command given as argc strings (argvlen may be NULL for
 * NUL-terminated ones). Returns the reply, which the caller frees with
 * freeReplyObject, or NULL when Redis is down or failed now (err says why,
 * SB_ERR_IO). */
redisReply *sb_redis_command(sb_redis *r, int argc, const char **argv, const size_t *argvlen, sb_error *err);

/* Fills script->sha1 from script->source. */
void sb_redis_script_init(sb_redis_script *script, const char *source);
/* EVALSHA script nkeys args... (args holds the keys then the arguments),
 * falling back to EVAL once on NOSCRIPT. Same contract as sb_redis_command. */
redisReply *sb_redis_eval(sb_redis *r, const sb_redis_script *script, int nkeys, int nargs, const char **args,
                          const size_t *argslen, sb_error *err);

/* Whether the last attempt succeeded (false while in backoff). */
bool sb_redis_up(sb_redis *r);
/* "host:port" for messages. */
const char *sb_redis_addr(const sb_redis *r);

#endif
