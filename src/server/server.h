/*
 * server.h - switchboard's OpenAI-compatible HTTP server: the registry's
 * models (src/registry/) behind /v1/chat/completions, /v1/completions,
 * /v1/embeddings, /v1/models and /v1/prompts, the administration routes
 * /admin/models, /admin/models/{name}/load|unload and /admin/reload, plus
 * /health and /metrics, on libmicrohttpd with a thread per connection.
 *
 * Lifecycle: sb_srv_start binds the socket (unless no_listen: then only
 * sb_srv_execute of server/inproc.h reaches it) and answers at once (503 while
 * starting); sb_srv_load reads the registry and starts the executor, after
 * which the endpoints serve (models load on demand); sb_srv_stop cancels
 * whatever runs, closes every connection and frees everything. One sb_srv
 * per process is the intended use, but nothing is global.
 */
#ifndef SB_SRV_SERVER_H
#define SB_SRV_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "gateway/gateway.h"
#include "switchboard.h"

typedef struct sb_srv sb_srv;

/* What each model's engine runs with unless its registry entry says
 * otherwise (sb_switchboard_params' fields of the same names; 0: the
 * engine's default, n_ctx 0: the model's trained context). */
typedef struct sb_srv_engine {
    int32_t n_ctx, n_parallel, max_batch_tokens, max_queue;
    sb_cache_type cache_type;
} sb_srv_engine;

typedef struct sb_srv_params {
    const char *models;     /* registry: models.json, a directory of .gguf files or one .gguf file (copied) */
    const char *model_id;   /* one .gguf file: the "model" clients name; NULL: the file name without .gguf */
    size_t memory_budget;   /* bytes all loaded models may take; 0: the registry's default */
    int64_t keep_alive_ms;  /* idle models unload after this (-1 never); entries may override */
    bool watch;             /* reload the registry when its files change */
    int32_t n_threads;      /* compute threads shared by every model; 0: one per online core */
    const char *host;       /* numeric address or name to bind; NULL: 127.0.0.1 */
    uint16_t port;          /* 0: any free port (see sb_srv_port) */
    bool no_listen;         /* bind nothing: the server serves only in-process calls (server/inproc.h) */
    sb_srv_engine engine;
    size_t max_body;        /* largest request body in bytes; larger ones get 413 */
    /* The state directory: keys.db (NULL: the keys of sb_gw_default_state_dir()),
     * and only when given usage.db, /v1/files' files and batch.db (NULL: those
     * routes answer 404 and no usage is recorded). */
    const char *state_dir;
    size_t max_file_bytes;  /* largest POST /v1/files body; larger ones get 413 */
    uint32_t timeout_s;     /* idle connection timeout: slow or stalled clients are dropped */
    uint32_t header_timeout_s; /* a new connection's request head must arrive within this (else 408) */
    uint32_t body_timeout_s;   /* a request body must arrive within this of its head (else closed) */
    uint32_t max_connections;  /* open connections; more are refused with 503 */
    /* The gateway (src/gateway/gateway.h, docs/GATEWAY.md). */
    sb_gw_auth auth;           /* SB_GW_AUTH_AUTO: required while any key exists, else off */
    const char *redis;         /* redis://host:port: rate limits shared by replicas; NULL: local */
    const char *tiers;         /* NAME:PRIORITY[:MAX_IN_FLIGHT],...; NULL: paid:10,free:0,batch:-10 */
    const char *cors;          /* allowed browser origins, comma-separated, or "*"; NULL: no CORS */
    bool metrics_auth;         /* /metrics needs an admin key */
    /* Receives one line per request and per notable event (no newline);
     * called from connection threads. NULL: silent. */
    void (*log)(void *user, const char *line);
    void *log_user;
    /* Accounting (server/account.h): response cache, usage.db, request log. */
    const char *cache;         /* NULL or "off", "memory", "redis://host:port" */
    size_t cache_bytes;        /* the memory cache's bound; 0: 256 MiB */
    int64_t cache_ttl_ms;      /* 0: one hour */
    const char *request_log;   /* JSON lines; NULL: none */
    uint64_t request_log_max_bytes; /* rotated past this; 0: 64 MiB */
    bool log_prompts;          /* the request log holds prompts and completions */
} sb_srv_params;
sb_srv_params sb_srv_default_params(void);

/* Binds and starts answering (every model endpoint says 503 "loading").
 * On failure *out is NULL and err says why (address in use, bad host). */
sb_status sb_srv_start(const sb_srv_params *params, sb_srv **out, sb_error *err);
/* The port actually bound. */
uint16_t sb_srv_port(const sb_srv *srv);
/* Reads the registry and starts the executor (and loads pinned models);
 * from then on the endpoints serve. On failure the server keeps answering 503. */
sb_status sb_srv_load(sb_srv *srv, sb_error *err);
/* Re-reads the registry (SIGHUP, POST /admin/reload); a bad file changes nothing. */
sb_status sb_srv_reload(sb_srv *srv, sb_error *err);
/* Cancels running requests, closes connections, frees everything. NULL is a no-op. */
void sb_srv_stop(sb_srv *srv);

#endif
