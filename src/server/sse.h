/*
 * sse.h - a streamed answer: a libmicrohttpd response whose body is
 * generated as server-sent events while the engine produces tokens.
 *
 * The response's content reader is the generator (h2o's proceed/stop shape
 * mapped onto libmicrohttpd): each call pulls the request's next event
 * (server/pull.h) until something is due, renders it as "data: {...}\n\n"
 * chunks, and ends after "data: [DONE]". libmicrohttpd calls it only when
 * the socket can take more, which is the backpressure; a client that goes
 * away ends the stream and cancels its generations.
 */
#ifndef SB_SRV_SSE_H
#define SB_SRV_SSE_H

#include "server/account.h"
#include "server/openai.h"
#include "server/pull.h"

struct MHD_Response;

/* Creates the streaming response for a submitted request. Takes ownership
 * of *req (left empty), of pull and of acct (its events are shown to it,
 * and it ends with the stream), also on failure (NULL: out of memory; the
 * generations are then cancelled). */
struct MHD_Response *sb_srv_sse_response(sb_srv *srv, sb_oai_req *req, sb_srv_pull *pull, sb_srv_acct *acct);

#endif
