/*
 * account.h - what the server does for the gateway's accounting half
 * around each generation request: the response cache (look up before the
 * engine, store a deterministic answer after), usage and cost (usage.db),
 * the request log, and the /v1/usage, /admin/usage and /v1/feedback
 * endpoints.
 *
 * One sb_srv_acct follows one request from its parse to its end:
 *
 *   a = sb_srv_acct_begin(srv, &req, body, len, t_start);  (never NULL: out of
 *                                        memory it is a no-op object)
 *   events = sb_srv_acct_lookup(a);     a cached answer, or NULL (then submit)
 *   sb_srv_acct_id(a, resp.id);         the completion id the client sees
 *   sb_srv_acct_event(a, ev);           every event the answer is built from
 *   sb_srv_acct_end(a, status);         the answer is queued or the stream over
 *
 * _end hands the request to the accounting writer thread, which stores it
 * in a Redis cache, records its usage and writes its log line: nothing
 * slower than a memory-cache store runs on the request's own thread. The
 * writer's queue is bounded (SB_SRV_ACCT_QUEUE): past it, records are
 * dropped with a log line, never waited for.
 */
#ifndef SB_SRV_ACCOUNT_H
#define SB_SRV_ACCOUNT_H

#include <stdbool.h>

#include "server/buf.h"
#include "server/openai.h"
#include "server/pull.h"

struct MHD_Response;

#define SB_SRV_ACCT_QUEUE 4096

typedef struct sb_srv_account sb_srv_account;
typedef struct sb_srv_acct sb_srv_acct;

/* Opens what the parameters ask for (cache, usage.db under state_dir,
 * request log) and starts the writer. A bad cache backend or an
 * unwritable request log fail; a corrupt or locked usage.db does not: it
 * is logged, retried, and the server serves without usage meanwhile. */
sb_status sb_srv_account_start(sb_srv *srv, sb_error *err);
/* Writes what is queued, stops the writer, closes everything. */
void sb_srv_account_stop(sb_srv *srv);

sb_srv_acct *sb_srv_acct_begin(sb_srv *srv, const sb_oai_req *req, const char *body, size_t len, double t_start);
/* A cached answer for the request into *out (true), else false: a miss. */
bool sb_srv_acct_lookup(sb_srv_acct *a, sb_srv_replay *out);
void sb_srv_acct_id(sb_srv_acct *a, const char *id);
void sb_srv_acct_event(sb_srv_acct *a, const sb_stream_event *ev);
/* Adds x-switchboard-cache: hit|miss when the request could be cached. */
void sb_srv_acct_headers(const sb_srv_acct *a, struct MHD_Response *r);
/* Consumes a (NULL is a no-op). */
void sb_srv_acct_end(sb_srv_acct *a, unsigned status);
/* A generation request refused before a model served it (bad JSON or
 * parameter, unknown model; the gateway's refusals): a request log line
 * naming the model the body asked for, no usage (no model to count it on). */
void sb_srv_acct_refused(sb_srv *srv, sb_oai_kind kind, const sb_gw_caller *caller, const char *body, size_t len,
                         double t_start, unsigned status);

/* Appends the cache's and the writer's figures to a /metrics exposition. */
void sb_srv_account_metrics(sb_srv *srv, sb_srv_buf *out);

/* GET /v1/usage (key: the caller's key name, "" anonymous) and
 * GET /admin/usage (key NULL: every key); `by` and `since` are the query's
 * (NULL when absent). False with e set on a bad query or when usage is
 * unavailable. */
bool sb_srv_account_usage(sb_srv *srv, const char *key, const char *by, const char *since, sb_srv_buf *out,
                          sb_oai_err *e);
/* POST /v1/feedback by the caller with key name `key`. */
bool sb_srv_account_feedback(sb_srv *srv, const char *key, const char *body, size_t len, sb_srv_buf *out,
                             sb_oai_err *e);

#endif
