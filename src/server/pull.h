/*
 * pull.h - where a generation endpoint's events come from: the public
 * request (switchboard.h's sb_request_t) its choices were submitted as,
 * pulled by the connection thread, or a cached answer replayed.
 *
 * There is no queue here: the request's own is the only one. The
 * connection thread takes events with a short timeout between looks at its
 * client's socket, so a client that hangs up gets its generations
 * cancelled within one poll interval even when no token is due. A
 * streaming call takes every event as it comes; a whole answer waits for
 * choices to finish (sb_request_wait), so its thread is not woken per token.
 * The served model's per-token figures (inter-token latency, usage, time to
 * first token) are counted here, from the events' own times.
 */
#ifndef SB_SRV_PULL_H
#define SB_SRV_PULL_H

#include <stdbool.h>
#include <stddef.h>

#include "server/openai.h"
#include "switchboard.h"

typedef struct sb_srv sb_srv;

/* A finished answer's events (the response cache's value): each event's
 * text and alternatives are owned here. */
typedef struct sb_srv_replayed {
    sb_stream_event ev; /* ev.text (sb_malloc'd) and ev.top (= top) point into this */
    sb_token_logprob top[20];
} sb_srv_replayed;
typedef struct sb_srv_replay {
    sb_srv_replayed *events;
    size_t n, cap;
} sb_srv_replay;
void sb_srv_replay_free(sb_srv_replay *r); /* the contents; NULL is a no-op */

typedef struct sb_srv_pull sb_srv_pull;

/* Submits one input per choice of `req` (read during the call only: the
 * request copies its prompts) on its held model. `client_fd` (-1: none) is watched for hang-ups.
 * On failure nothing stays submitted, *out is NULL and err says why
 * (SB_ERR_BUSY: the queue is full; SB_ERR_INVALID_ARG or
 * SB_ERR_CONTEXT_FULL: the engine refuses the request). */
sb_status sb_srv_pull_submit(sb_srv *srv, const sb_oai_req *req, int client_fd, sb_srv_pull **out, sb_error *err);
/* A pull over a cached answer (taken over, also on failure): its events
 * come at once; nothing runs in the engine. */
sb_status sb_srv_pull_replay(sb_srv_replay *replay, sb_srv_pull **out, sb_error *err);

/* The next event, in the order they happened (valid until the next call);
 * false when every choice has finished and its events were taken, or when
 * the client hung up meanwhile: then the generations are cancelled and
 * *gone is set. */
bool sb_srv_pull_next(sb_srv_pull *p, sb_stream_event *ev, bool *gone);
/* Cancels every generation still running (their done events follow). */
void sb_srv_pull_cancel(sb_srv_pull *p);
/* Cancels what still runs and frees. NULL is a no-op. */
void sb_srv_pull_free(sb_srv_pull *p);

#endif
