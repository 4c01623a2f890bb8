/*
 * server.h - switchboard's OpenAI-compatible HTTP server: one model behind
 * /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models, plus
 * /health and /metrics, on libmicrohttpd with a thread per connection.
 *
 * Lifecycle: sb_srv_start binds the socket and answers at once (503 while
 * loading); sb_srv_load loads the model and starts the engine, after which
 * the endpoints serve; sb_srv_stop cancels whatever runs, closes every
 * connection and frees everything. One sb_srv per process is the intended
 * use, but nothing is global: the state is this object.
 */
#ifndef SB_SRV_SERVER_H
#define SB_SRV_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "switchboard.h"

typedef struct sb_srv sb_srv;

typedef struct sb_srv_params {
    const char *model_path; /* GGUF file (borrowed until sb_srv_load returns) */
    const char *model_id;   /* the "model" clients name; NULL: the file name without .gguf */
    const char *host;       /* numeric address or name to bind; NULL: 127.0.0.1 */
    uint16_t port;          /* 0: any free port (see sb_srv_port) */
    sb_engine_params engine;
    size_t max_body;        /* largest request body in bytes; larger ones get 413 */
    uint32_t timeout_s;     /* idle connection timeout: slow or stalled clients are dropped */
    uint32_t header_timeout_s; /* a new connection's request head must arrive within this (else 408) */
    uint32_t body_timeout_s;   /* a request body must arrive within this of its head (else closed) */
    uint32_t max_connections;  /* open connections; more are refused with 503 */
    /* Receives one line per request and per notable event (no newline);
     * called from connection threads. NULL: silent. */
    void (*log)(void *user, const char *line);
    void *log_user;
} sb_srv_params;
sb_srv_params sb_srv_default_params(void);

/* Binds and starts answering (every model endpoint says 503 "loading").
 * On failure *out is NULL and err says why (address in use, bad host). */
sb_status sb_srv_start(const sb_srv_params *params, sb_srv **out, sb_error *err);
/* The port actually bound. */
uint16_t sb_srv_port(const sb_srv *srv);
/* Loads the model and its chat template and starts the engine; from then on
 * the endpoints serve. On failure the server keeps answering 503. */
sb_status sb_srv_load(sb_srv *srv, sb_error *err);
/* Cancels running requests, closes connections, frees everything. NULL is a no-op. */
void sb_srv_stop(sb_srv *srv);

#endif
