/*
 * inproc.h - the generation endpoints (/v1/chat/completions,
 * /v1/completions, /v1/embeddings) without HTTP: one OpenAI request body in,
 * the JSON answer the server would send out, through the same parser,
 * scheduler and renderer.
 *
 * The HTTP handler and the in-process callers (batch jobs, the video
 * pipeline) share one code path, sb__srv_call_*: parse and submit, then (not
 * streaming) wait and render. An in-process caller uses sb_srv_execute on a
 * server made with sb_srv_params.no_listen (no socket) or on a serving one.
 */
#ifndef SB_SRV_INPROC_H
#define SB_SRV_INPROC_H

#include <stdbool.h>
#include <stddef.h>

#include "gateway/caller.h"
#include "gateway/gateway.h"
#include "server/account.h"
#include "server/buf.h"
#include "server/openai.h"
#include "server/pull.h"
#include "switchboard.h"

typedef struct sb_srv sb_srv;

/* The OpenAI kind of a generation endpoint's path; false for any other path. */
bool sb_srv_endpoint_kind(const char *url_path, sb_oai_kind *kind);

/* Runs one request to completion, as a non-streaming POST to `url_path`
 * with `body` (len bytes) would: *http_status and *response_json (sb_malloc'd
 * JSON, freed with sb_free) are the answer, the error JSON of a failure
 * included (400 invalid body, 404 unknown path or model, 503 not ready or
 * busy, 500 engine error). "stream": true is refused with a 400. `caller`
 * (NULL: anonymous, priority 0) sets the scheduler priority and is what the
 * gateway stages see. Blocks the calling thread; any number of threads may
 * call at once (their requests batch in the scheduler). Fails (nothing in
 * the outputs) only when memory runs out. */
sb_status sb_srv_execute(sb_srv *srv, const char *url_path, const char *body, size_t len, const sb_gw_caller *caller,
                         int *http_status, char **response_json, sb_error *err);

/* ---- the shared code path (server.c's handler and sb_srv_execute) ---- */

typedef struct sb_srv_call {
    sb_oai_req req;    /* parsed (holds the serving model) until sb__srv_call_free */
    sb_srv_pull *pull; /* the submitted request's events (or a cached answer's); a streaming caller takes it */
    sb_srv_acct *acct; /* cache, usage and log of this request (account.h); a streaming caller takes it */
    unsigned status;   /* HTTP status of the answer in `body` */
    int64_t tokens_used; /* prompt and generated tokens, for the gateway's settlement */
    sb_srv_buf body;   /* the JSON answer: an error after _start fails, the result after _finish */
} sb_srv_call;

/* Parses, admits (with `gw`, an HTTP request's authenticated admission
 * state: 403, 429 or 503 from the gateway; NULL: `caller` as it is, for
 * in-process callers, or anonymous when NULL too) and submits, or answers
 * from the response cache. False: c->status and c->body hold the error
 * answer (not ready, bad body, refused, busy). `client_fd`
 * (-1: none) is watched for the client hanging up; `may_stream` false
 * refuses "stream": true; `t_start` (monotonic seconds, 0: now) is when the
 * request arrived, for its latency. */
bool sb__srv_call_start(sb_srv *srv, sb_oai_kind kind, const char *body, size_t len, const sb_gw_caller *caller,
                        sb_gw_request *gw, int client_fd, bool may_stream, double t_start, sb_srv_call *c);
/* Not streaming: waits for every event and renders the answer into
 * c->status and c->body (the result, or the error of a failed choice).
 * False when there is nothing to answer: the client went away (the
 * generations are cancelled) or memory ran out. */
bool sb__srv_call_finish(sb_srv *srv, sb_srv_call *c, bool *gone);
/* Ends the request's accounting with c->status (call it once the answer is
 * queued), settles its tokens with the gateway, and frees. */
void sb__srv_call_free(sb_srv *srv, sb_srv_call *c);

#endif
