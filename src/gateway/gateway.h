/*
 * gateway.h - admission: what the server asks before a request may use a
 * model, in two steps, and what it tells when the request ends.
 *
 *   sb_gw_authenticate  with the route and the headers, before the body is
 *                       read or a model looked up: who calls (401 missing,
 *                       wrong, disabled or expired key: one body for all;
 *                       403 a non-admin key on /admin/...)
 *   sb_gw_admit         with the serving model and the token estimate,
 *                       after parsing: 403 model not allowed, 503 the
 *                       tier's queue is full, 429 rate-limited
 *   sb_gw_settle        once per admitted request, when it ends, with the
 *                       tokens it really used
 *
 * Each fills an sb_gw_verdict: the status to answer with (0: go on), the
 * OpenAI-style error, and the headers every response to a keyed request
 * carries (x-ratelimit-*, Retry-After on refusals).
 *
 * Auth modes: off (no checks; every request is anonymous at the default
 * tier; /admin/... open, as before keys existed), optional (a request
 * without a key is anonymous; one with a key must have a good one; admin
 * routes need an admin key), required (every model and admin route needs a
 * key). The default is required while any key exists in the state
 * directory and off otherwise (decided per request, so the first
 * `keys create` switches a running server to required within a second).
 * /health is never checked; /metrics only with metrics_auth (admin key).
 */
#ifndef SB_GW_GATEWAY_H
#define SB_GW_GATEWAY_H

#include <stdbool.h>
#include <stdint.h>

#include "gateway/caller.h"
#include "gateway/keys.h"
#include "switchboard.h"

typedef enum sb_gw_auth { SB_GW_AUTH_AUTO, SB_GW_AUTH_OFF, SB_GW_AUTH_OPTIONAL, SB_GW_AUTH_REQUIRED } sb_gw_auth;

/* What a route needs. */
typedef enum sb_gw_route { SB_GW_ROUTE_OPEN, SB_GW_ROUTE_MODEL, SB_GW_ROUTE_ADMIN, SB_GW_ROUTE_METRICS } sb_gw_route;

typedef struct sb_gw_params {
    const char *state_dir; /* NULL: sb_gw_default_state_dir() */
    sb_gw_auth auth;
    const char *redis_url; /* NULL: local buckets only */
    const char *tiers;     /* NULL: SB_GW_TIERS_DEFAULT (tiers.h) */
    bool metrics_auth;     /* /metrics needs an admin key */
    void (*log)(void *user, const char *line);
    void *log_user;
} sb_gw_params;

#define SB_GW_MAX_HEADERS 8

typedef struct sb_gw_verdict {
    unsigned status;  /* 0: go on; else the HTTP status of the refusal */
    const char *type; /* the error's "type" and "code" */
    const char *code;
    char message[300];
    int n_headers;
    struct {
        const char *name;
        char value[40];
    } headers[SB_GW_MAX_HEADERS];
} sb_gw_verdict;

/* One request's admission state, held by the server from its first call to
 * its end. Zero it, set caller.request_id, then authenticate. */
typedef struct sb_gw_request {
    sb_gw_caller caller;
    sb_gw_key key; /* valid when keyed */
    bool keyed;
    sb_gw_verdict verdict;
} sb_gw_request;

typedef struct sb_gw sb_gw;

/* $XDG_STATE_HOME/switchboard, else $HOME/.local/state/switchboard, else
 * ./switchboard-state (a static string). */
const char *sb_gw_default_state_dir(void);
/* "off", "optional", "required" -> mode; false for anything else. */
bool sb_gw_parse_auth(const char *s, sb_gw_auth *out);

/* Opens the state directory's keys (a corrupt keys.db fails here, naming
 * the file), parses the tiers and connects to Redis (an unreachable one is
 * not an error: the local buckets decide until it answers). */
sb_status sb_gw_create(const sb_gw_params *p, sb_gw **out, sb_error *err);
void sb_gw_free(sb_gw *gw);

/* Step one. authorization and x_api_key are the headers' values or NULL.
 * Returns false when req->verdict says to refuse. */
bool sb_gw_authenticate(sb_gw *gw, sb_gw_route route, const char *authorization, const char *x_api_key,
                        sb_gw_request *req);
/* For a keyed request that uses no model (GET /v1/models): the
 * x-ratelimit-* headers into req->verdict, taking nothing. */
void sb_gw_describe(sb_gw *gw, sb_gw_request *req);
/* Step two, for model routes: `model` the served model's name, `tokens`
 * the prompt plus the most the request may generate. */
bool sb_gw_admit(sb_gw *gw, sb_gw_request *req, const char *model, int64_t tokens);
/* The request admitted as `caller` ended having used `tokens`. A caller not
 * admitted is ignored, so the server may call it on every path. */
void sb_gw_settle(sb_gw *gw, sb_gw_caller *caller, int64_t tokens);

#endif
