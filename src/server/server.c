/*
 * server.c - the server object and its HTTP front: libmicrohttpd in
 * thread-per-connection mode, the routing table, request bodies (bounded),
 * error answers and the handlers of each endpoint.
 *
 * A request goes through the access handler three ways: first call (headers
 * only: route it, refuse an oversized declared body at once), upload calls
 * (append the body, stop keeping it past max_body), last call (answer).
 * Generation endpoints answer either from the connection thread after the
 * engine finished (non-streaming; the wait watches for the client hanging
 * up) or with a streaming response (sse.c). Every answer goes through
 * respond(), which also counts it for /metrics and logs it.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "base/base.h"
#include "gateway/gateway.h"
#include "server/account.h"
#include "server/admin.h"
#include "server/batches.h"
#include "server/door.h"
#include "server/inproc.h"
#include "server/openai.h"
#include "server/server-impl.h"
#include "server/sse.h"

/* Oversized bodies are read and dropped up to this much past max_body so the
 * client, still sending, can read its 413; beyond it the connection closes. */
#define DRAIN_LIMIT ((uint64_t)64 << 20)

/* ---- utilities ------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t sb__srv_random(sb_srv *srv) { return splitmix64(srv->salt + atomic_fetch_add(&srv->counter, 1)); }

void sb__srv_log(sb_srv *srv, const char *fmt, ...) {
    if (!srv->p.log)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    srv->p.log(srv->p.log_user, line);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- requests and answers -------------------------------------------------- */

typedef struct route route;

/* One HTTP request (libmicrohttpd's per-request closure). */
typedef struct sb_srv_http {
    const route *route;  /* NULL: unknown path */
    sb_srv_endpoint ep;
    bool method_ok;
    bool answered;       /* a response was queued */
    bool too_large;      /* the body passes max_body: what comes is dropped, then 413 */
    bool close;          /* the answer closes the connection (where the next request starts is unclear) */
    uint64_t received;   /* body bytes so far */
    sb_srv_buf body;
    double t_start;
    void *upload;                     /* an upload route's state (batches.c), freed by upload_free */
    void (*upload_free)(void *upload);
    sb_gw_request gw;    /* who calls, what admission said (src/gateway/) */
    int8_t auth;         /* its key checked: 0 not yet, 1 passed, -1 refused (gw.verdict says why) */
    const char *origin;  /* the Origin header when --cors allows it, else NULL */
} http_req;

typedef enum MHD_Result (*handler_fn)(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *url);
/* Takes a body chunk of an upload route, which streams its body instead of
 * keeping it (up to max_file_bytes instead of max_body); false closes the connection. */
typedef bool (*upload_fn)(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *data, size_t n);

struct route {
    const char *path;   /* exact path, or prefix when it ends in '/' */
    const char *method; /* "GET" or "POST" */
    sb_srv_endpoint ep;
    handler_fn fn;
};

/* What every answer carries: its request id, CORS for an allowed origin,
 * and for a keyed request the x-ratelimit-* headers (and Retry-After). */
static void add_gateway_headers(const http_req *q, struct MHD_Response *r) {
    MHD_add_response_header(r, "x-request-id", q->gw.caller.request_id);
    if (q->origin) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", q->origin);
        MHD_add_response_header(r, "Access-Control-Expose-Headers",
                                "x-request-id, x-switchboard-model, x-switchboard-fallback, retry-after, "
                                "x-ratelimit-limit-requests, x-ratelimit-remaining-requests, x-ratelimit-reset-requests, "
                                "x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens, x-ratelimit-reset-tokens");
        if (strcmp(q->origin, "*") != 0)
            MHD_add_response_header(r, MHD_HTTP_HEADER_VARY, "Origin");
    }
    for (int i = 0; i < q->gw.verdict.n_headers; i++)
        MHD_add_response_header(r, q->gw.verdict.headers[i].name, q->gw.verdict.headers[i].value);
}

/* Queues `response` with `status`, counts and logs it. Consumes the response. */
static enum MHD_Result respond(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *method,
                               const char *url, unsigned status, struct MHD_Response *response) {
    if (!response)
        return MHD_NO;
    add_gateway_headers(q, response);
    if (q->close || sb_srv_door_busy(srv->door)) /* under load the next request comes through the door */
        MHD_add_response_header(response, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result r = MHD_queue_response(conn, status, response);
    MHD_destroy_response(response);
    q->answered = true;
    sb_srv_metrics_request(&srv->metrics, q->ep, status);
    sb__srv_log(srv, "%s %.200s %u %.1fms", method, url, status, (now_s() - q->t_start) * 1e3);
    return r;
}

static struct MHD_Response *body_response(const char *content_type, const char *data, size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (r)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    return r;
}

static enum MHD_Result respond_json(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *method,
                                    const char *url, unsigned status, sb_srv_buf *body) {
    if (body->failed)
        return MHD_NO;
    return respond(srv, conn, q, method, url, status, body_response("application/json", body->p ? body->p : "", body->len));
}

/* An error answer already rendered as {"error": {...}} (503s say when to retry). */
static enum MHD_Result respond_error_json(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *method,
                                          const char *url, unsigned status, const sb_srv_buf *b) {
    struct MHD_Response *r = b->failed ? NULL : body_response("application/json", b->p ? b->p : "", b->len);
    if (r && status == MHD_HTTP_SERVICE_UNAVAILABLE)
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (r && status == MHD_HTTP_METHOD_NOT_ALLOWED && q->route)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, q->route->method);
    return respond(srv, conn, q, method, url, status, r);
}

static enum MHD_Result respond_error(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *method,
                                     const char *url, const sb_oai_err *e) {
    sb_srv_buf b = {0};
    sb_oai_err_json(e, &b);
    enum MHD_Result r = respond_error_json(srv, conn, q, method, url, e->status, &b);
    sb_srv_buf_free(&b);
    return r;
}

/* The gateway's refusal (401, 403, 429, 503) as an OpenAI error. */
static enum MHD_Result respond_refusal(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *method,
                                       const char *url) {
    const sb_gw_verdict *v = &q->gw.verdict;
    sb_oai_err e;
    sb_oai_err_set(&e, v->status, v->type, v->code, NULL, "%s", v->message);
    return respond_error(srv, conn, q, method, url, &e);
}

static enum MHD_Result respond_not_ready(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *url) {
    sb_oai_err e;
    sb_oai_err_set(&e, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", "model_loading", NULL,
                   "the server is starting or stopping; retry shortly");
    return respond_error(srv, conn, q, q->route ? q->route->method : "?", url, &e);
}

/* For the handlers of other files (server-impl.h). */
enum MHD_Result sb__srv_respond(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url,
                                unsigned status, struct MHD_Response *response) {
    return respond(srv, conn, q, q->route->method, url, status, response);
}

enum MHD_Result sb__srv_respond_json(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url,
                                     unsigned status, sb_srv_buf *body) {
    return respond_json(srv, conn, q, q->route->method, url, status, body);
}

enum MHD_Result sb__srv_respond_error(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url,
                                      const sb_oai_err *e) {
    return respond_error(srv, conn, q, q->route->method, url, e);
}

enum MHD_Result sb__srv_respond_not_ready(sb_srv *srv, struct MHD_Connection *conn, sb_srv_http *q, const char *url) {
    return respond_not_ready(srv, conn, q, url);
}

const sb_srv_buf *sb__srv_http_body(const sb_srv_http *q) { return &q->body; }

void *sb__srv_http_upload(const sb_srv_http *q) { return q->upload; }
const sb_gw_caller *sb__srv_http_caller(const sb_srv_http *q) { return &q->gw.caller; }

void sb__srv_http_set_upload(sb_srv_http *q, void *state, void (*free_fn)(void *)) {
    q->upload = state;
    q->upload_free = free_fn;
}

/* ---- handlers --------------------------------------------------------------- */

static enum MHD_Result handle_health(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *url) {
    if (!atomic_load(&srv->ready))
        return respond_not_ready(srv, conn, q, url);
    static const char ok[] = "{\"status\":\"ok\"}";
    return respond(srv, conn, q, "GET", url, MHD_HTTP_OK, body_response("application/json", ok, sizeof ok - 1));
}

static enum MHD_Result handle_metrics(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *url) {
    bool ready = atomic_load(&srv->ready);
    sb_model_info *info = sb_calloc(SB_SRV_MAX_MODELS, sizeof *info);
    if (!info)
        return MHD_NO;
    size_t n = 0;
    sb_switchboard_totals totals;
    if (ready) {
        int32_t total = SB_MIN(sb_switchboard_list(srv->sb, info, SB_SRV_MAX_MODELS), SB_SRV_MAX_MODELS);
        for (int32_t i = 0; i < total; i++)
            if (info[i].state == SB_MODEL_LOADED)
                info[n++] = info[i];
        sb_switchboard_get_totals(srv->sb, &totals);
    }
    /* Count this scrape before rendering, so the text includes it. */
    sb_srv_metrics_request(&srv->metrics, q->ep, MHD_HTTP_OK);
    sb_srv_buf b = {0};
    sb_srv_metrics_render(&srv->metrics, info, n, ready ? &totals : NULL, &b);
    sb_free(info);
    sb_srv_account_metrics(srv, &b);
    struct MHD_Response *r = b.failed ? NULL : body_response("text/plain; version=0.0.4; charset=utf-8", b.p, b.len);
    sb_srv_buf_free(&b);
    if (!r)
        return MHD_NO;
    add_gateway_headers(q, r);
    enum MHD_Result res = MHD_queue_response(conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    q->answered = true;
    return res;
}

static enum MHD_Result handle_models(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *url) {
    if (!atomic_load(&srv->ready))
        return respond_not_ready(srv, conn, q, url);
    sb_srv_buf b = {0};
    const char *id = url + strlen("/v1/models");
    if (!sb_oai_models_json(srv, *id == '/' ? id + 1 : NULL, &b)) { /* GET /v1/models/{id} */
        sb_oai_err e;
        sb_oai_err_set(&e, MHD_HTTP_NOT_FOUND, "invalid_request_error", "model_not_found", "model",
                       "The model '%.200s' does not exist (GET /v1/models lists them)", id + 1);
        return respond_error(srv, conn, q, "GET", url, &e);
    }
    enum MHD_Result r = respond_json(srv, conn, q, "GET", url, MHD_HTTP_OK, &b);
    sb_srv_buf_free(&b);
    return r;
}

static enum MHD_Result handle_prompts(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *url) {
    if (!atomic_load(&srv->ready))
        return respond_not_ready(srv, conn, q, url);
    sb_srv_buf b = {0};
    struct sb_registry *reg = sb__switchboard_registry(srv->sb);
    const sb_regfile *rf = sb_registry_file_acquire(reg);
    sb_srv_admin_prompts_json(rf, &b);
    sb_registry_file_release(reg, rf);
    enum MHD_Result r = respond_json(srv, conn, q, "GET", url, MHD_HTTP_OK, &b);
    sb_srv_buf_free(&b);
    return r;
}

/* GET /admin/models, POST /admin/models/{name}/load|unload, POST /admin/reload. */
static enum MHD_Result handle_admin(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *url) {
    if (!atomic_load(&srv->ready))
        return respond_not_ready(srv, conn, q, url);
    sb_srv_buf b = {0};
    sb_oai_err e;
    const char *method = q->route->method;
    if (sb_srv_admin(srv, url, &b, &e)) {
        enum MHD_Result r = respond_json(srv, conn, q, method, url, MHD_HTTP_OK, &b);
        sb_srv_buf_free(&b);
        return r;
    }
    sb_srv_buf_free(&b);
    return respond_error(srv, conn, q, method, url, &e);
}

/* Says which model served, and why when it is a fallback: the body's
 * "model" and "metadata" say the same, these reach clients that only look
 * at headers (proxies, logs); and whether the response cache answered. */
static struct MHD_Response *with_model_headers(struct MHD_Response *r, const sb_held_t *held,
                                               const sb_srv_acct *acct) {
    if (!r)
        return NULL;
    sb_srv_acct_headers(acct, r);
    sb_served served;
    sb_held_served(held, &served);
    MHD_add_response_header(r, "x-switchboard-model", served.model);
    if (served.fallback)
        MHD_add_response_header(r, "x-switchboard-fallback", served.fallback_reason);
    return r;
}

static enum MHD_Result handle_generate(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *url) {
    sb_oai_kind kind = q->ep == SB_SRV_EP_CHAT ? SB_OAI_CHAT : q->ep == SB_SRV_EP_COMPLETIONS ? SB_OAI_COMPLETION
                                                                                           : SB_OAI_EMBEDDING;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    sb_srv_call c;
    bool ok = sb__srv_call_start(srv, kind, q->body.p, q->body.len, NULL, &q->gw, ci ? ci->connect_fd : -1, true,
                                 q->t_start, &c);
    sb_srv_buf_free(&q->body); /* not needed any more: do not hold it during generation */
    enum MHD_Result result;
    bool gone = false;
    if (ok && c.req.stream) { /* the stream takes req, pull and acct over, and with req the held model, which lives as long as the response */
        const sb_held_t *held = c.req.held;
        sb_srv_pull *pull = c.pull;
        sb_srv_acct *acct = c.acct;
        c.pull = NULL;
        c.acct = NULL;
        result = respond(srv, conn, q, "POST", url, MHD_HTTP_OK,
                         with_model_headers(sb_srv_sse_response(srv, &c.req, pull, acct), held, acct));
    } else if (ok && !sb__srv_call_finish(srv, &c, &gone)) {
        if (gone) { /* nobody to answer: close the connection */
            sb_srv_metrics_request(&srv->metrics, q->ep, 499);
            sb__srv_log(srv, "POST %.200s: client went away; cancelled", url);
        }
        result = MHD_NO;
    } else if (c.status == MHD_HTTP_OK) {
        result = c.body.failed ? MHD_NO
                               : respond(srv, conn, q, "POST", url, MHD_HTTP_OK,
                                         with_model_headers(body_response("application/json", c.body.p, c.body.len),
                                                            c.req.held, c.acct));
    } else {
        result = respond_error_json(srv, conn, q, "POST", url, c.status, &c.body);
    }
    sb__srv_call_free(srv, &c); /* after the answer is queued: its usage and log line follow it */
    return result;
}

/* GET /v1/usage: the caller's own; GET /admin/usage: every key's.
 * ?by=model|key|day&since=YYYY-MM-DD. */
static enum MHD_Result handle_usage(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *url) {
    const char *by = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "by"),
               *since = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "since");
    sb_srv_buf b = {0};
    sb_oai_err e;
    const char *key = q->ep == SB_SRV_EP_ADMIN ? NULL : q->gw.caller.key; /* "": anonymous */
    enum MHD_Result r = sb_srv_account_usage(srv, key, by, since, &b, &e) ? respond_json(srv, conn, q, "GET", url, 200, &b)
                                                                          : respond_error(srv, conn, q, "GET", url, &e);
    sb_srv_buf_free(&b);
    return r;
}

/* POST /v1/feedback {"id", "rating", "comment"}. */
static enum MHD_Result handle_feedback(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *url) {
    sb_srv_buf b = {0};
    sb_oai_err e;
    enum MHD_Result r = sb_srv_account_feedback(srv, q->gw.caller.key, q->body.p, q->body.len, &b, &e)
                            ? respond_json(srv, conn, q, "POST", url, 200, &b)
                            : respond_error(srv, conn, q, "POST", url, &e);
    sb_srv_buf_free(&b);
    return r;
}

static const route routes[] = {
    {"/v1/chat/completions", "POST", SB_SRV_EP_CHAT, handle_generate},
    {"/v1/completions", "POST", SB_SRV_EP_COMPLETIONS, handle_generate},
    {"/v1/embeddings", "POST", SB_SRV_EP_EMBEDDINGS, handle_generate},
    {"/v1/models", "GET", SB_SRV_EP_MODELS, handle_models},
    {"/v1/models/", "GET", SB_SRV_EP_MODELS, handle_models},
    {"/v1/prompts", "GET", SB_SRV_EP_PROMPTS, handle_prompts},
    {"/admin/models", "GET", SB_SRV_EP_ADMIN, handle_admin},
    {"/admin/models/", "POST", SB_SRV_EP_ADMIN, handle_admin},
    {"/admin/reload", "POST", SB_SRV_EP_ADMIN, handle_admin},
    {"/admin/usage", "GET", SB_SRV_EP_ADMIN, handle_usage},
    {"/v1/usage", "GET", SB_SRV_EP_USAGE, handle_usage},
    {"/v1/feedback", "POST", SB_SRV_EP_FEEDBACK, handle_feedback},
    {"/health", "GET", SB_SRV_EP_HEALTH, handle_health},
    {"/metrics", "GET", SB_SRV_EP_METRICS, handle_metrics},
    {"/v1/files", "POST", SB_SRV_EP_FILES, sb__srv_files_create},
    {"/v1/files", "GET", SB_SRV_EP_FILES, sb__srv_files_list},
    {"/v1/files/", "GET", SB_SRV_EP_FILES, sb__srv_files_get},
    {"/v1/files/", "DELETE", SB_SRV_EP_FILES, sb__srv_files_delete},
    {"/v1/batches", "POST", SB_SRV_EP_BATCHES, sb__srv_batches_create},
    {"/v1/batches", "GET", SB_SRV_EP_BATCHES, sb__srv_batches_list},
    {"/v1/batches/", "GET", SB_SRV_EP_BATCHES, sb__srv_batches_get},
    {"/v1/batches/", "POST", SB_SRV_EP_BATCHES, sb__srv_batches_cancel},
};

/* The routes whose body streams to an upload function instead of memory. */
static const struct {
    handler_fn fn;
    upload_fn upload;
} uploads[] = {
    {sb__srv_files_create, sb__srv_files_upload},
};

static upload_fn route_upload(const route *r) {
    for (size_t i = 0; r && i < SB_ARRAY_LEN(uploads); i++)
        if (uploads[i].fn == r->fn)
            return uploads[i].upload;
    return NULL;
}

/* HEAD on a GET route answers as GET; libmicrohttpd leaves the body out. */
static bool method_matches(const route *r, const char *method) {
    return strcmp(method, r->method) == 0 || (strcmp(method, "HEAD") == 0 && strcmp(r->method, "GET") == 0);
}

/* The route of url for method; a path served under other methods only gives
 * its first route (then 405). */
static const route *find_route(const char *url, const char *method) {
    const route *any = NULL;
    for (size_t i = 0; i < SB_ARRAY_LEN(routes); i++) {
        size_t n = strlen(routes[i].path);
        if (routes[i].path[n - 1] == '/' ? strncmp(url, routes[i].path, n) == 0 && url[n]
                                         : strcmp(url, routes[i].path) == 0) {
            if (method_matches(&routes[i], method))
                return &routes[i];
            if (!any)
                any = &routes[i];
        }
    }
    return any;
}

/* ---- libmicrohttpd callbacks ----------------------------------------------- */

/* The largest body q's route takes, and the option that sets it. */
static size_t body_limit(const sb_srv *srv, const http_req *q, const char **flag) {
    bool upload = q->method_ok && route_upload(q->route);
    *flag = upload ? "--max-file-bytes" : "--max-body";
    return upload ? srv->p.max_file_bytes : srv->p.max_body;
}

/* Collects a request's Content-Length values: lens[0] the first, lens[1] one that differs. */
static enum MHD_Result find_lengths(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    const char **lens = cls;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
        if (!lens[0])
            lens[0] = value;
        else if (strcmp(lens[0], value) != 0)
            lens[1] = value;
    }
    return MHD_YES;
}

/* ---- gateway: request ids, CORS, what each route needs ---------------------- */

/* The client's own x-request-id when it is a sane token, else a new one. */
static void set_request_id(sb_srv *srv, struct MHD_Connection *conn, http_req *q) {
    const char *id = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "x-request-id");
    size_t n = id ? strlen(id) : 0;
    bool ok = n > 0 && n < sizeof q->gw.caller.request_id;
    for (size_t i = 0; ok && i < n; i++)
        ok = (id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') || (id[i] >= '0' && id[i] <= '9') ||
             strchr("-_.:", id[i]);
    if (ok)
        memcpy(q->gw.caller.request_id, id, n + 1);
    else
        snprintf(q->gw.caller.request_id, sizeof q->gw.caller.request_id, "req_%016llx",
                 (unsigned long long)sb__srv_random(srv));
}

/* What Access-Control-Allow-Origin says to this Origin under --cors
 * ("*", or a comma-separated list of origins), or NULL. */
static const char *cors_origin(const sb_srv *srv, const char *origin) {
    const char *list = srv->p.cors;
    if (!list || !origin)
        return NULL;
    if (strcmp(list, "*") == 0)
        return "*";
    size_t ol = strlen(origin);
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        if (n == ol && strncmp(p, origin, n) == 0)
            return origin;
        p += n + (p[n] == ',');
    }
    return NULL;
}

/* A browser's preflight OPTIONS: which methods and headers it may send. */
static enum MHD_Result respond_preflight(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *url) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    if (q->origin) {
        const char *asked = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        bool sane = asked && strlen(asked) < 1024;
        for (const char *c = asked; sane && *c; c++)
            sane = *c >= 0x20 && *c < 0x7f;
        MHD_add_response_header(r, "Access-Control-Allow-Methods", q->route ? q->route->method : "GET, POST");
        MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                sane ? asked : "Authorization, Content-Type, x-api-key, x-request-id");
        MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
    }
    return respond(srv, conn, q, "OPTIONS", url, MHD_HTTP_NO_CONTENT, r);
}

static sb_gw_route gateway_route(sb_srv_endpoint ep) {
    switch (ep) {
    case SB_SRV_EP_CHAT:
    case SB_SRV_EP_COMPLETIONS:
    case SB_SRV_EP_EMBEDDINGS:
    case SB_SRV_EP_MODELS:
    case SB_SRV_EP_PROMPTS:
    case SB_SRV_EP_USAGE:
    case SB_SRV_EP_FEEDBACK:
    case SB_SRV_EP_FILES:
    case SB_SRV_EP_BATCHES:
        return SB_GW_ROUTE_MODEL;
    case SB_SRV_EP_ADMIN:
        return SB_GW_ROUTE_ADMIN;
    case SB_SRV_EP_METRICS:
        return SB_GW_ROUTE_METRICS;
    default:
        return SB_GW_ROUTE_OPEN;
    }
}

/* The routes whose requests run a model (admitted with its token estimate). */
static bool route_generates(sb_srv_endpoint ep) {
    return ep == SB_SRV_EP_CHAT || ep == SB_SRV_EP_COMPLETIONS || ep == SB_SRV_EP_EMBEDDINGS;
}

/* Checks the request's key once (uploads check it at their first chunk, so
 * that a refused caller's file never reaches the disk). */
static bool authenticated(sb_srv *srv, struct MHD_Connection *conn, http_req *q) {
    if (q->auth == 0)
        q->auth = sb_gw_authenticate(srv->gw, gateway_route(q->ep),
                                     MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION),
                                     MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "x-api-key"), &q->gw)
                      ? 1
                      : -1;
    return q->auth > 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size,
                                  void **con_cls) {
    sb_srv *srv = cls;
    http_req *q = *con_cls;
    if (!q) { /* headers are in; the body (if any) follows */
        if (!(q = sb_calloc(1, sizeof *q)))
            return MHD_NO;
        *con_cls = q;
        q->t_start = now_s();
        set_request_id(srv, conn, q);
        q->origin = cors_origin(srv, MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin"));
        q->route = find_route(url, method);
        q->ep = q->route ? q->route->ep : SB_SRV_EP_OTHER;
        q->method_ok = q->route && method_matches(q->route, method);
        /* The door checks a connection's first head; this, those after it on a kept-alive one. */
        const char *lens[2] = {NULL, NULL};
        MHD_get_connection_values(conn, MHD_HEADER_KIND, find_lengths, lens);
        if (lens[1]) {
            sb_oai_err e;
            sb_oai_err_set(&e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "invalid_request", NULL,
                           "the request has two different Content-Length headers");
            q->close = true;
            return respond_error(srv, conn, q, method, url, &e);
        }
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        const char *expect = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
        unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
        const char *flag;
        size_t limit = body_limit(srv, q, &flag);
        if (declared > limit) {
            /* A client waiting for "100 Continue", or one announcing more than
             * we would drain, is answered now; any other is already sending,
             * and closing on it would lose the answer in a reset: its body is
             * discarded as it comes and the 413 follows. */
            q->too_large = true;
            if (!(expect && strcasecmp(expect, "100-continue") == 0) && declared <= limit + DRAIN_LIMIT)
                return MHD_YES;
            sb_oai_err e;
            sb_oai_err_set(&e, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", "request_too_large", NULL,
                           "the request body is %llu bytes; this server accepts at most %zu (%s)", declared, limit,
                           flag);
            return respond_error(srv, conn, q, method, url, &e);
        }
        return MHD_YES;
    }
    if (q->answered) /* answered early (413): ignore whatever still arrives */
        return MHD_YES;
    if (*upload_size) {
        if (now_s() - q->t_start > srv->p.body_timeout_s) {
            sb__srv_log(srv, "%s %.200s: the body did not arrive within %u s (--body-timeout); closed", method, url,
                        srv->p.body_timeout_s);
            return MHD_NO;
        }
        q->received += *upload_size;
        const char *flag;
        size_t limit = body_limit(srv, q, &flag);
        if (q->received > limit + DRAIN_LIMIT)
            return MHD_NO; /* a body without end: close the connection */
        if (!q->too_large && q->received > limit) {
            q->too_large = true; /* the body passed the limit: stop keeping it */
            sb_srv_buf_free(&q->body);
        }
        upload_fn upload = q->method_ok ? route_upload(q->route) : NULL;
        if (upload && !authenticated(srv, conn, q)) {
            /* dropped as it comes: the refusal follows the body */
        } else if (!q->too_large && upload) {
            if (!upload(srv, conn, q, upload_data, *upload_size))
                return MHD_NO;
        } else if (!q->too_large) {
            sb_srv_buf_append(&q->body, upload_data, *upload_size);
            if (q->body.failed)
                return MHD_NO;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    sb_oai_err e;
    if (q->too_large) {
        const char *flag;
        size_t limit = body_limit(srv, q, &flag);
        sb_oai_err_set(&e, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", "request_too_large", NULL,
                       "the request body is larger than %zu bytes (%s)", limit, flag);
        return respond_error(srv, conn, q, method, url, &e);
    }
    if (!q->route) {
        char quoted[216];
        sb_oai_err_set(&e, MHD_HTTP_NOT_FOUND, "invalid_request_error", "unknown_url", NULL, "Invalid URL (%.20s %s)",
                       method, sb_oai_quote(url, strlen(url), 200, quoted, sizeof quoted));
        return respond_error(srv, conn, q, method, url, &e);
    }
    if (srv->p.cors && strcmp(method, "OPTIONS") == 0)
        return respond_preflight(srv, conn, q, url);
    if (!q->method_ok) {
        sb_oai_err_set(&e, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", "method_not_allowed", NULL,
                       "%.20s is not allowed on %.200s; use %s", method, url, q->route->method);
        return respond_error(srv, conn, q, method, url, &e);
    }
    if (!authenticated(srv, conn, q))
        return respond_refusal(srv, conn, q, method, url);
    if (gateway_route(q->ep) != SB_GW_ROUTE_MODEL || !route_generates(q->ep))
        sb_gw_describe(srv->gw, &q->gw);
    return q->route->fn(srv, conn, q, url);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    http_req *q = *con_cls;
    if (!q)
        return;
    sb_srv_buf_free(&q->body);
    if (q->upload_free)
        q->upload_free(q->upload);
    sb_free(q);
    *con_cls = NULL;
}

/* libmicrohttpd's own decoding of %XX, except that %00 stays as it is: a
 * NUL would end the path early ("/health%00x" is no route). */
static int hex_digit(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static size_t unescape_url(void *cls, struct MHD_Connection *conn, char *s) {
    char *w = s;
    for (const char *r = s; *r; r++) {
        int hi = r[0] == '%' ? hex_digit(r[1]) : -1, lo = hi >= 0 ? hex_digit(r[2]) : -1;
        if (lo >= 0 && (hi | lo)) {
            *w++ = (char)(hi << 4 | lo);
            r += 2;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
    return (size_t)(w - s);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    sb_srv *srv = cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
    sb__srv_log(srv, "http: %s", line);
}

/* ---- lifecycle ------------------------------------------------------------- */

sb_srv_params sb_srv_default_params(void) {
    return (sb_srv_params){
        .host = "127.0.0.1",
        .port = 8080,
        .engine = {.cache_type = sb_switchboard_default_params().cache_type},
        .keep_alive_ms = 5 * 60 * 1000, /* Ollama's default */
        .watch = true,
        .max_body = (size_t)8 << 20,
        .max_file_bytes = (size_t)512 << 20,
        .timeout_s = 30,
        .header_timeout_s = 10,
        .body_timeout_s = 60,
        .max_connections = 1024,
    };
}

sb_status sb_srv_start(const sb_srv_params *params, sb_srv **out, sb_error *err) {
    *out = NULL;
    if (!params->models)
        return sb_fail(err, SB_ERR_INVALID_ARG, "server: no model or registry given");
    sb_srv *srv = sb_calloc(1, sizeof *srv);
    if (!srv)
        return sb_fail(err, SB_ERR_NOMEM, "server: out of memory");
    srv->p = *params;
    if (!srv->p.host)
        srv->p.host = "127.0.0.1";
    srv->created = (int64_t)time(NULL);
    srv->salt = splitmix64((uint64_t)srv->created ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)srv);
    atomic_init(&srv->counter, 0);
    atomic_init(&srv->ready, false);
    sb_srv_metrics_init(&srv->metrics);
    sb_gw_params gp = {.state_dir = params->state_dir, .auth = params->auth, .redis_url = params->redis,
                       .tiers = params->tiers, .metrics_auth = params->metrics_auth, .log = params->log,
                       .log_user = params->log_user};
    sb_status st = sb_gw_create(&gp, &srv->gw, err);
    if (st == SB_OK)
        st = sb_srv_account_start(srv, err);
    if (st != SB_OK) {
        sb_srv_stop(srv);
        return st;
    }
    if (srv->p.no_listen) { /* in-process use only (sb_srv_execute) */
        *out = srv;
        return SB_OK;
    }

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    char port[8];
    snprintf(port, sizeof port, "%u", (unsigned)srv->p.port);
    int gai = getaddrinfo(srv->p.host, port, &hints, &ai);
    if (gai != 0) {
        sb_srv_stop(srv);
        return sb_fail(err, SB_ERR_INVALID_ARG, "server: cannot resolve host '%s': %s", params->host,
                       gai_strerror(gai));
    }
    struct sockaddr_storage addr;
    socklen_t addrlen = (socklen_t)SB_MIN((size_t)ai->ai_addrlen, sizeof addr);
    memcpy(&addr, ai->ai_addr, addrlen);
    freeaddrinfo(ai);
    st = sb_srv_door_open(srv, (struct sockaddr *)&addr, addrlen, &srv->door, err);
    if (st != SB_OK) {
        sb_srv_stop(srv);
        return st;
    }

    /* The door accepts and hands over connections whose head has arrived;
     * libmicrohttpd's cap and memory are above the door's so that what the
     * door lets in, it serves. */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
    srv->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, srv,
                                   MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, srv,
                                   MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)srv->p.timeout_s,
                                   MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                                   MHD_OPTION_NOTIFY_CONNECTION, sb_srv_door_on_connection, srv->door,
                                   MHD_OPTION_CONNECTION_LIMIT, (unsigned int)srv->p.max_connections + 64,
                                   MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)128 << 10,
                                   MHD_OPTION_UNESCAPE_CALLBACK, unescape_url, srv,
                                   MHD_OPTION_END);
    if (!srv->daemon || (st = sb_srv_door_run(srv->door, srv->daemon, err)) != SB_OK) {
        sb_srv_stop(srv);
        return srv->daemon ? st : sb_fail(err, SB_ERR_IO, "server: cannot start the HTTP daemon");
    }
    srv->port = sb_srv_door_port(srv->door);
    *out = srv;
    return SB_OK;
}

uint16_t sb_srv_port(const sb_srv *srv) { return srv->port; }

sb_status sb_srv_load(sb_srv *srv, sb_error *err) {
    const sb_srv_params *p = &srv->p;
    sb_switchboard_params sp = sb_switchboard_default_params();
    sp.n_threads = p->n_threads;
    sp.memory_budget = p->memory_budget;
    sp.model_name = p->model_id;
    sp.n_ctx = p->engine.n_ctx;
    sp.n_parallel = p->engine.n_parallel;
    sp.max_batch_tokens = p->engine.max_batch_tokens;
    sp.max_queue = p->engine.max_queue;
    sp.cache_type = p->engine.cache_type;
    sp.keep_alive_s = p->keep_alive_ms < 0 ? -1.0 : (double)p->keep_alive_ms / 1e3;
    sp.watch = p->watch;
    sp.log = p->log;
    sp.log_user = p->log_user;
    sb_status st = sb_switchboard_open(p->models, &sp, &srv->sb, err);
    if (st != SB_OK)
        return st;
    /* Before ready, so that /v1/batches answers as soon as /health does; the
     * batches left running continue (their requests wait out the 503s of
     * the moment until ready). */
    if ((st = sb__srv_batches_open(srv, err)) != SB_OK)
        return st;
    atomic_store(&srv->ready, true);
    return SB_OK;
}

sb_status sb_srv_reload(sb_srv *srv, sb_error *err) {
    if (!atomic_load(&srv->ready))
        return sb_fail(err, SB_ERR_BUSY, "the server is not ready");
    return sb_switchboard_reload(srv->sb, err);
}

void sb_srv_stop(sb_srv *srv) {
    if (!srv)
        return;
    atomic_store(&srv->ready, false);
    sb__srv_batches_interrupt(srv); /* before the cancel: the batch answers it cuts are not recorded */
    /* Requests end first (waiting connection threads get their DONE events
     * and finish), then the connections, whose requests hold leases. */
    if (srv->sb)
        sb_switchboard_cancel_all(srv->sb);
    sb_srv_door_stop(srv->door);
    if (srv->daemon)
        MHD_stop_daemon(srv->daemon);
    sb_srv_door_free(srv->door);
    sb__srv_batches_close(srv);
    sb_srv_account_stop(srv); /* after the connections: their streams' ends are recorded */
    sb_switchboard_free(srv->sb);
    sb_gw_free(srv->gw);
    sb_srv_metrics_destroy(&srv->metrics);
    sb_free(srv);
}
