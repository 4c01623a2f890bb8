/*
 * gen.h - one HTTP request's generations in flight: the engine requests it
 * submitted (one per choice, or per embedding input) and the queue their
 * events arrive on.
 *
 * The engine callback runs on the engine thread: it copies the event into
 * the queue, signals (for a streaming request every token, otherwise only
 * a finished choice: a thread woken per token would take a core from the
 * engine for nothing), and returns without waiting for anything. The
 * connection thread takes events with sb_srv_gen_next, which also watches
 * the client's socket, so a client that hangs up gets its engine requests
 * cancelled within one poll interval even when no token is due.
 *
 * Lifetime: reference counted. The creator holds one reference, every
 * submitted engine request holds one until its SB_GEN_DONE event; the last
 * release frees the object, so a connection may end while the engine still
 * owes events.
 */
#ifndef SB_SRV_GEN_H
#define SB_SRV_GEN_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "server/openai.h"

typedef struct sb_srv sb_srv;

/* A copy of one sb_gen_event, tagged with the choice it belongs to. */
typedef struct sb_srv_event {
    struct sb_srv_event *next;
    int32_t choice;
    bool done; /* SB_GEN_DONE; otherwise SB_GEN_TOKEN */
    int32_t token;
    float logprob;
    int32_t n_top;
    sb_top_logprob top[20];
    sb_finish finish;
    int32_t n_prompt, n_prompt_cached, n_generated;
    double ttft_s;
    float *embedding; /* n_embd floats (sb_malloc'd), embedding requests only */
    int32_t n_embd;
    char *error;      /* SB_FINISH_ERROR: the engine's message (sb_malloc'd) */
    size_t text_len;
    char text[];      /* text_len bytes, NUL-terminated */
} sb_srv_event;

void sb_srv_events_free(sb_srv_event *list);

typedef struct sb_srv_gen sb_srv_gen;

/* Submits one engine request per choice of `req` (borrowed: it must outlive
 * the returned object's use by the caller; the engine copies what it keeps).
 * `client_fd` is the connection's socket, watched for hang-ups. On failure
 * nothing stays submitted, *out is NULL and err says why: SB_ERR_BUSY when
 * the queue is full, SB_ERR_INVALID_ARG for a request the engine refuses,
 * SB_ERR_UNSUPPORTED while the server is not ready. */
sb_status sb_srv_gen_submit(sb_srv *srv, const sb_oai_req *req, int client_fd, sb_srv_gen **out, sb_error *err);

/* A generation already finished: `events` (taken over), a whole answer
 * replayed from the response cache, are what sb_srv_gen_next returns, at
 * once; nothing runs in the engine. */
sb_status sb_srv_gen_replay(sb_srv_event *events, sb_srv_gen **out, sb_error *err);

/* Waits until events arrive (a non-streaming request: until a choice
 * finishes) and returns them in arrival order (free with
 * sb_srv_events_free), or returns NULL when every choice has already
 * finished and nothing is left. If the client hangs up meanwhile, cancels
 * the engine requests, sets *gone and returns NULL. */
sb_srv_event *sb_srv_gen_next(sb_srv_gen *g, bool *gone);

/* Cancels every engine request still running (their DONE events follow). */
void sb_srv_gen_cancel(sb_srv_gen *g);
/* Drops the caller's reference. */
void sb_srv_gen_release(sb_srv_gen *g);

#endif
