/*
 * gateway.c - admission: keys, tiers and rate limits together (see gateway.h).
 */
#include "gateway/gateway.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/base.h"
#include "gateway/clock.h"
#include "gateway/limits.h"
#include "gateway/redis.h"
#include "gateway/tiers.h"

struct sb_gw {
    sb_gw_params p;
    sb_gw_keys *keys;
    sb_gw_tiers tiers;
    sb_redis *redis;
    sb_gw_limits *limits;
};

/* One message for a missing-or-bad key whatever the reason, so that the
 * answer never tells whether a key exists, is disabled or expired. */
static const char bad_key_message[] =
    "Incorrect API key provided. Send a valid key as 'Authorization: Bearer KEY' or 'x-api-key: KEY' "
    "(switchboard keys create makes one).";

const char *sb_gw_default_state_dir(void) {
    static char dir[4096];
    const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg == '/')
        snprintf(dir, sizeof dir, "%s/switchboard", xdg);
    else if (home && *home == '/')
        snprintf(dir, sizeof dir, "%s/.local/state/switchboard", home);
    else
        snprintf(dir, sizeof dir, "switchboard-state");
    return dir;
}

bool sb_gw_parse_auth(const char *s, sb_gw_auth *out) {
    static const char *const names[] = {"off", "optional", "required"};
    for (size_t i = 0; i < SB_ARRAY_LEN(names); i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (sb_gw_auth)(SB_GW_AUTH_OFF + (int)i);
            return true;
        }
    return false;
}

sb_status sb_gw_create(const sb_gw_params *p, sb_gw **out, sb_error *err) {
    *out = NULL;
    sb_gw *gw = sb_calloc(1, sizeof *gw);
    if (!gw)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for the gateway");
    gw->p = *p;
    if (!gw->p.state_dir)
        gw->p.state_dir = sb_gw_default_state_dir();
    sb_status st = sb_gw_tiers_parse(p->tiers, &gw->tiers, err);
    if (st == SB_OK)
        st = sb_gw_keys_open(gw->p.state_dir, true, p->log, p->log_user, &gw->keys, err);
    if (st == SB_OK && p->redis_url)
        st = sb_redis_create(p->redis_url, 0, &gw->redis, err);
    if (st == SB_OK)
        st = sb_gw_limits_create(gw->redis, &gw->limits, err);
    if (st != SB_OK) {
        sb_gw_free(gw);
        return st;
    }
    *out = gw;
    return SB_OK;
}

void sb_gw_free(sb_gw *gw) {
    if (!gw)
        return;
    sb_gw_limits_free(gw->limits);
    sb_redis_free(gw->redis);
    sb_gw_keys_close(gw->keys);
    sb_free(gw);
}

static bool refuse(sb_gw_verdict *v, unsigned status, const char *type, const char *code, const char *fmt, ...)
    SB_PRINTF(5, 6);
static bool refuse(sb_gw_verdict *v, unsigned status, const char *type, const char *code, const char *fmt, ...) {
    v->status = status;
    v->type = type;
    v->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->message, sizeof v->message, fmt, ap);
    va_end(ap);
    return false;
}

static void add_header(sb_gw_verdict *v, const char *name, const char *fmt, ...) SB_PRINTF(3, 4);
static void add_header(sb_gw_verdict *v, const char *name, const char *fmt, ...) {
    if (v->n_headers == SB_GW_MAX_HEADERS)
        return;
    v->headers[v->n_headers].name = name;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->headers[v->n_headers].value, sizeof v->headers[0].value, fmt, ap);
    va_end(ap);
    v->n_headers++;
}

static void limit_headers(sb_gw_verdict *v, const sb_gw_limit_verdict *lv) {
    v->n_headers = 0;
    char d[24];
    if (lv->limits_requests) {
        add_header(v, "x-ratelimit-limit-requests", "%" PRId64, lv->limit_requests);
        add_header(v, "x-ratelimit-remaining-requests", "%" PRId64, lv->remaining_requests);
        sb_gw_format_duration(lv->reset_requests_us, d, sizeof d);
        add_header(v, "x-ratelimit-reset-requests", "%s", d);
    }
    if (lv->limits_tokens) {
        add_header(v, "x-ratelimit-limit-tokens", "%" PRId64, lv->limit_tokens);
        add_header(v, "x-ratelimit-remaining-tokens", "%" PRId64, lv->remaining_tokens);
        sb_gw_format_duration(lv->reset_tokens_us, d, sizeof d);
        add_header(v, "x-ratelimit-reset-tokens", "%s", d);
    }
}

static sb_gw_limit_spec spec_of(const sb_gw_key *k) { return (sb_gw_limit_spec){k->rps, k->rpm, k->tpm}; }

/* The credential in the headers: *raw NULL when there is none. False (and
 * v set) when a header is there but unusable. */
static bool credential(const char *authorization, const char *x_api_key, const char **raw, size_t *len,
                       sb_gw_verdict *v) {
    *raw = NULL;
    *len = 0;
    const char *s = x_api_key;
    if (authorization) {
        if (strncasecmp(authorization, "Bearer ", 7) != 0)
            return refuse(v, 401, "invalid_request_error", "invalid_api_key",
                          "The Authorization header must be 'Bearer KEY' (another scheme was sent).");
        s = authorization + 7;
        while (*s == ' ')
            s++;
    }
    if (!s)
        return true;
    size_t n = strlen(s);
    while (n && s[n - 1] == ' ')
        n--;
    if (n == 0)
        return refuse(v, 401, "invalid_request_error", "invalid_api_key", "%s", bad_key_message);
    if (n > SB_GW_KEY_MAX_LEN)
        return refuse(v, 401, "invalid_request_error", "invalid_api_key",
                      "The API key is %zu bytes; keys are at most %d.", n, SB_GW_KEY_MAX_LEN);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
            return refuse(v, 400, "invalid_request_error", "invalid_api_key",
                          "The API key contains a byte (0x%02x at %zu) no key has; keys are printable ASCII.",
                          (unsigned char)s[i], i);
    *raw = s;
    *len = n;
    return true;
}

static void set_tier(sb_gw *gw, sb_gw_caller *c, const char *tier) {
    sb_gw_tier *t = tier ? sb_gw_tiers_find(&gw->tiers, tier) : NULL;
    if (!t) /* anonymous, or a key of a tier this server was not given: the default */
        t = &gw->tiers.t[gw->tiers.def];
    snprintf(c->tier, sizeof c->tier, "%s", t->name);
    c->priority = t->priority;
}

bool sb_gw_authenticate(sb_gw *gw, sb_gw_route route, const char *authorization, const char *x_api_key,
                        sb_gw_request *req) {
    sb_gw_verdict *v = &req->verdict;
    memset(v, 0, sizeof *v);
    req->keyed = false;
    req->caller.key[0] = '\0';
    set_tier(gw, &req->caller, NULL);
    if (route == SB_GW_ROUTE_OPEN || (route == SB_GW_ROUTE_METRICS && !gw->p.metrics_auth))
        return true;
    sb_gw_auth mode = gw->p.auth;
    if (mode == SB_GW_AUTH_AUTO)
        mode = sb_gw_keys_count(gw->keys) ? SB_GW_AUTH_REQUIRED : SB_GW_AUTH_OFF;
    if (mode == SB_GW_AUTH_OFF && route != SB_GW_ROUTE_METRICS)
        return true;
    const char *raw;
    size_t len;
    if (!credential(authorization, x_api_key, &raw, &len, v))
        return false;
    if (!raw) {
        if (mode == SB_GW_AUTH_OPTIONAL && route == SB_GW_ROUTE_MODEL)
            return true;
        return refuse(v, 401, "invalid_request_error", "invalid_api_key", "%s", bad_key_message);
    }
    sb_gw_key *k = &req->key;
    if (!sb_gw_keys_lookup(gw->keys, raw, len, k) || !k->enabled || (k->expires && sb_gw_wall_s() >= k->expires))
        return refuse(v, 401, "invalid_request_error", "invalid_api_key", "%s", bad_key_message);
    req->keyed = true;
    snprintf(req->caller.key, sizeof req->caller.key, "%s", k->name);
    set_tier(gw, &req->caller, k->tier);
    if (route != SB_GW_ROUTE_MODEL && !k->admin)
        return refuse(v, 403, "invalid_request_error", "permission_denied",
                      "The key '%s' is not an admin key; %s needs one (switchboard keys create --admin).", k->name,
                      route == SB_GW_ROUTE_ADMIN ? "/admin/..." : "/metrics");
    return true;
}

void sb_gw_describe(sb_gw *gw, sb_gw_request *req) {
    if (!req->keyed)
        return;
    sb_gw_limit_verdict lv;
    sb_gw_limit_spec spec = spec_of(&req->key);
    sb_gw_limits_peek(gw->limits, req->key.name, &spec, sb_gw_now_us(), &lv);
    limit_headers(&req->verdict, &lv);
}

bool sb_gw_admit(sb_gw *gw, sb_gw_request *req, const char *model, int64_t tokens) {
    sb_gw_verdict *v = &req->verdict;
    memset(v, 0, sizeof *v);
    if (req->keyed && !sb_gw_key_allows(&req->key, model))
        return refuse(v, 403, "invalid_request_error", "model_not_allowed",
                      "The key '%s' may not use the model '%.100s' (it may use: %.120s).", req->key.name, model,
                      req->key.models);
    sb_gw_tier *tier = sb_gw_tiers_find(&gw->tiers, req->caller.tier);
    SB_ASSERT(tier);
    if (!sb_gw_tier_enter(tier)) /* the server's 503 answer adds Retry-After */
        return refuse(v, 503, "server_error", "server_busy",
                      "The server holds %d requests of the tier '%s', its most (--tiers); retry shortly.",
                      tier->max_in_flight, tier->name);
    if (req->keyed) {
        sb_gw_limit_verdict lv;
        sb_gw_limit_spec spec = spec_of(&req->key);
        sb_gw_limits_admit(gw->limits, req->key.name, &spec, tokens, sb_gw_now_us(), &lv);
        limit_headers(v, &lv);
        if (!lv.admitted) {
            sb_gw_tier_leave(tier);
            if (lv.never)
                return refuse(v, 429, "tokens", "rate_limit_exceeded",
                              "Request too large for the key '%s': it may need %" PRId64
                              " tokens and the key's limit is %" PRId64 " tokens per minute. Lower max_tokens.",
                              req->key.name, tokens, req->key.tpm);
            add_header(v, "Retry-After", "%" PRId64, (lv.retry_after_us + 999999) / 1000000);
            /* OpenAI's type says which limit it was: an empty request bucket, else the tokens. */
            return refuse(v, 429, lv.limits_requests && lv.remaining_requests == 0 ? "requests" : "tokens",
                          "rate_limit_exceeded",
                          "Rate limit reached for the key '%s' (%" PRId64 " requests per second, %" PRId64
                          " per minute, %" PRId64 " tokens per minute; 0: none); this request needs %" PRId64
                          " tokens. Retry in %.3f s.",
                          req->key.name, req->key.rps, req->key.rpm, req->key.tpm, tokens,
                          (double)lv.retry_after_us / 1e6);
        }
    }
    req->caller.admitted = true;
    req->caller.reserved_tokens = tokens;
    return true;
}

void sb_gw_settle(sb_gw *gw, sb_gw_caller *caller, int64_t tokens) {
    if (!gw || !caller->admitted)
        return;
    caller->admitted = false;
    sb_gw_tier *tier = sb_gw_tiers_find(&gw->tiers, caller->tier);
    if (tier)
        sb_gw_tier_leave(tier);
    sb_gw_key k;
    if (caller->key[0] && sb_gw_keys_find(gw->keys, caller->key, &k)) {
        sb_gw_limit_spec spec = spec_of(&k);
        sb_gw_limits_settle(gw->limits, k.name, &spec, caller->reserved_tokens, tokens, sb_gw_now_us());
    }
}
