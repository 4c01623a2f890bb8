/*
 * server-impl.h - the server object shared by the files of src/server/.
 *
 * `sb` (the public API's handle: the registry and its executor) is written
 * once by sb_srv_load before `ready` becomes true and stays valid until
 * every connection thread has ended (sb_srv_stop stops the daemon before it
 * frees it). Each request holds the model serving it (sb_oai_req.held).
 */
#ifndef SB_SRV_SERVER_IMPL_H
#define SB_SRV_SERVER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <microhttpd.h>

#include "server/metrics.h"
#include "server/openai.h"
#include "server/server.h"

/* Most models one /metrics scrape reports engine figures for. */
#define SB_SRV_MAX_MODELS 256

struct sb_srv {
    sb_srv_params p;      /* as given (strings borrowed); host defaulted */
    struct MHD_Daemon *daemon;
    struct sb_srv_door *door; /* the listening socket and heads still arriving (door.c) */
    uint16_t port;
    int64_t created;      /* unix time the server started: the model objects' "created" */

    atomic_bool ready;    /* registry read and executor running */
    sb_switchboard_t *sb;

    sb_srv_metrics metrics;
    struct sb_gw *gw;     /* admission: keys, limits, tiers (src/gateway/gateway.h) */
    atomic_uint_fast64_t counter; /* ids and default seeds */
    uint64_t salt;                /* mixed into ids and default seeds */
    struct sb_srv_account *account; /* cache, usage, request log (account.c); NULL when all are off */
    struct sb_srv_batches *batches; /* /v1/files and /v1/batches (batches.c); NULL without a state_dir */
};

/* One HTTP request, for the handlers of other files than server.c: they
 * answer through these (counted and logged as server.c's are). */
typedef struct sb_srv_http sb_srv_http;
enum MHD_Result sb__srv_respond(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url,
                                unsigned status, struct MHD_Response *response); /* consumes response */
enum MHD_Result sb__srv_respond_json(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url,
                                     unsigned status, sb_srv_buf *body);
enum MHD_Result sb__srv_respond_error(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url,
                                      const sb_oai_err *e);
enum MHD_Result sb__srv_respond_not_ready(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url);
/* The body received (routes without an upload function). */
const sb_srv_buf *sb__srv_http_body(const sb_srv_http *q);
/* An upload route's state: set on its first chunk, freed with the request. */
void *sb__srv_http_upload(const sb_srv_http *q);
/* Who sends it (after authentication: the key's name, "" anonymous). */
const sb_gw_caller *sb__srv_http_caller(const sb_srv_http *q);
void sb__srv_http_set_upload(sb_srv_http *q, void *state, void (*free_fn)(void *));

/* A fresh pseudo-random 64-bit number (distinct per call). */
uint64_t sb__srv_random(sb_srv *srv);
/* Tokens a finished request used, as its usage counts them (the
 * gateway's settlement). */
struct sb_oai_resp;
int64_t sb__srv_tokens_used(const struct sb_oai_resp *resp);
/* Logs one printf-style line through params.log. */
void sb__srv_log(sb_srv *srv, const char *fmt, ...) SB_PRINTF(2, 3);

#endif
