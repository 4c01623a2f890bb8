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
#include "model/model.h"
#include "server/gen.h"
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
typedef struct http_req {
    const route *route;  /* NULL: unknown path */
    sb_srv_endpoint ep;
    bool method_ok;
    bool answered;       /* a response was queued */
    bool too_large;      /* the body passes max_body: what comes is dropped, then 413 */
    uint64_t received;   /* body bytes so far */
    sb_srv_buf body;
    double t_start;
} http_req;

typedef enum MHD_Result (*handler_fn)(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *url);

struct route {
    const char *path;   /* exact path, or prefix when it ends in '/' */
    const char *method; /* "GET" or "POST" */
    sb_srv_endpoint ep;
    handler_fn fn;
};

/* Queues `response` with `status`, counts and logs it. Consumes the response. */
static enum MHD_Result respond(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *method,
                               const char *url, unsigned status, struct MHD_Response *response) {
    if (!response)
        return MHD_NO;
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

static enum MHD_Result respond_error(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *method,
                                     const char *url, const sb_oai_err *e) {
    sb_srv_buf b = {0};
    sb_oai_err_json(e, &b);
    struct MHD_Response *r = b.failed ? NULL : body_response("application/json", b.p, b.len);
    sb_srv_buf_free(&b);
    if (r && e->status == MHD_HTTP_SERVICE_UNAVAILABLE)
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (r && e->status == MHD_HTTP_METHOD_NOT_ALLOWED && q->route)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, q->route->method);
    return respond(srv, conn, q, method, url, e->status, r);
}

static enum MHD_Result respond_not_ready(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *url) {
    sb_oai_err e;
    sb_oai_err_set(&e, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", "model_loading", NULL,
                   "the model is not loaded (the server is starting or stopping); retry shortly");
    return respond_error(srv, conn, q, q->route ? q->route->method : "?", url, &e);
}

/* ---- handlers --------------------------------------------------------------- */

static enum MHD_Result handle_health(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *url) {
    if (!atomic_load(&srv->ready))
        return respond_not_ready(srv, conn, q, url);
    static const char ok[] = "{\"status\":\"ok\"}";
    return respond(srv, conn, q, "GET", url, MHD_HTTP_OK, body_response("application/json", ok, sizeof ok - 1));
}

static enum MHD_Result handle_metrics(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *url) {
    sb_engine_stats stats;
    bool have = false;
    pthread_rwlock_rdlock(&srv->engine_lock);
    if (srv->engine) {
        sb_engine_get_stats(srv->engine, &stats);
        have = true;
    }
    pthread_rwlock_unlock(&srv->engine_lock);
    /* Count this scrape before rendering, so the text includes it. */
    sb_srv_metrics_request(&srv->metrics, q->ep, MHD_HTTP_OK);
    sb_srv_buf b = {0};
    sb_srv_metrics_render(&srv->metrics, have ? &stats : NULL, &b);
    struct MHD_Response *r = b.failed ? NULL : body_response("text/plain; version=0.0.4; charset=utf-8", b.p, b.len);
    sb_srv_buf_free(&b);
    if (!r)
        return MHD_NO;
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
    if (*id == '/') { /* GET /v1/models/{id} */
        if (strcmp(id + 1, srv->id) != 0) {
            sb_oai_err e;
            sb_oai_err_set(&e, MHD_HTTP_NOT_FOUND, "invalid_request_error", "model_not_found", "model",
                           "The model '%.200s' does not exist; this server serves '%.200s'", id + 1, srv->id);
            return respond_error(srv, conn, q, "GET", url, &e);
        }
        sb_oai_models_json(srv, false, &b);
    } else {
        sb_oai_models_json(srv, true, &b);
    }
    enum MHD_Result r = respond_json(srv, conn, q, "GET", url, MHD_HTTP_OK, &b);
    sb_srv_buf_free(&b);
    return r;
}

/* An engine submission failure as an answer: the queue is full (503 with
 * Retry-After), the engine refuses the request (400), or not ready (503). */
static void submit_error(const sb_error *err, sb_status st, sb_oai_err *e) {
    if (st == SB_ERR_BUSY)
        sb_oai_err_set(e, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", "server_busy",
                       NULL, "the server is busy: too many requests are waiting; retry shortly");
    else if (st == SB_ERR_INVALID_ARG || st == SB_ERR_CONTEXT_FULL)
        sb_oai_err_set(e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "invalid_value", NULL, "%s", err->msg);
    else if (st == SB_ERR_UNSUPPORTED)
        sb_oai_err_set(e, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", "model_loading", NULL, "%s", err->msg);
    else
        sb_oai_err_set(e, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", NULL, NULL, "%s", err->msg);
}

static enum MHD_Result handle_generate(sb_srv *srv, struct MHD_Connection *conn, http_req *q, const char *url) {
    if (!atomic_load(&srv->ready))
        return respond_not_ready(srv, conn, q, url);
    sb_oai_kind kind = q->ep == SB_SRV_EP_CHAT ? SB_OAI_CHAT : q->ep == SB_SRV_EP_COMPLETIONS ? SB_OAI_COMPLETION
                                                                                           : SB_OAI_EMBEDDING;
    sb_oai_req req;
    sb_oai_err e;
    if (!sb_oai_parse(srv, kind, q->body.p ? q->body.p : "", q->body.len, &req, &e))
        return respond_error(srv, conn, q, "POST", url, &e);
    sb_srv_buf_free(&q->body); /* not needed any more: do not hold it during generation */

    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    sb_srv_gen *gen;
    sb_error err;
    sb_status st = sb_srv_gen_submit(srv, &req, ci ? ci->connect_fd : -1, &gen, &err);
    if (st != SB_OK) {
        sb_oai_req_free(&req);
        submit_error(&err, st, &e);
        return respond_error(srv, conn, q, "POST", url, &e);
    }
    if (req.stream)
        return respond(srv, conn, q, "POST", url, MHD_HTTP_OK, sb_srv_sse_response(srv, &req, gen));

    sb_oai_resp resp;
    enum MHD_Result result = MHD_NO;
    if (!sb_oai_resp_init(&resp, srv, &req)) {
        sb_srv_gen_cancel(gen);
        goto done;
    }
    for (;;) {
        bool gone;
        sb_srv_event *evs = sb_srv_gen_next(gen, &gone);
        if (gone) { /* nobody to answer: close the connection */
            sb_srv_metrics_request(&srv->metrics, q->ep, 499);
            sb__srv_log(srv, "POST %.200s: client went away; cancelled", url);
            goto done;
        }
        if (!evs)
            break;
        for (sb_srv_event *ev = evs; ev; ev = ev->next)
            sb_oai_resp_add(&resp, ev);
        sb_srv_events_free(evs);
    }
    sb_srv_buf body = {0};
    if (sb_oai_resp_body(&resp, &body, &e))
        result = respond_json(srv, conn, q, "POST", url, MHD_HTTP_OK, &body);
    else
        result = respond_error(srv, conn, q, "POST", url, &e);
    sb_srv_buf_free(&body);
done:
    sb_oai_resp_free(&resp);
    sb_srv_gen_release(gen);
    sb_oai_req_free(&req);
    return result;
}

static const route routes[] = {
    {"/v1/chat/completions", "POST", SB_SRV_EP_CHAT, handle_generate},
    {"/v1/completions", "POST", SB_SRV_EP_COMPLETIONS, handle_generate},
    {"/v1/embeddings", "POST", SB_SRV_EP_EMBEDDINGS, handle_generate},
    {"/v1/models", "GET", SB_SRV_EP_MODELS, handle_models},
    {"/v1/models/", "GET", SB_SRV_EP_MODELS, handle_models},
    {"/health", "GET", SB_SRV_EP_HEALTH, handle_health},
    {"/metrics", "GET", SB_SRV_EP_METRICS, handle_metrics},
};

static const route *find_route(const char *url) {
    for (size_t i = 0; i < SB_ARRAY_LEN(routes); i++) {
        size_t n = strlen(routes[i].path);
        if (routes[i].path[n - 1] == '/' ? strncmp(url, routes[i].path, n) == 0 && url[n]
                                         : strcmp(url, routes[i].path) == 0)
            return &routes[i];
    }
    return NULL;
}

/* ---- libmicrohttpd callbacks ----------------------------------------------- */

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
        q->route = find_route(url);
        q->ep = q->route ? q->route->ep : SB_SRV_EP_OTHER;
        q->method_ok = q->route && strcmp(method, q->route->method) == 0;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        const char *expect = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
        unsigned long long declared = cl ? strtoull(cl, NULL, 10) : 0;
        if (declared > srv->p.max_body) {
            /* A client waiting for "100 Continue", or one announcing more than
             * we would drain, is answered now; any other is already sending,
             * and closing on it would lose the answer in a reset: its body is
             * discarded as it comes and the 413 follows. */
            q->too_large = true;
            if (!(expect && strcasecmp(expect, "100-continue") == 0) && declared <= srv->p.max_body + DRAIN_LIMIT)
                return MHD_YES;
            sb_oai_err e;
            sb_oai_err_set(&e, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", "request_too_large", NULL,
                           "the request body is %llu bytes; this server accepts at most %zu (--max-body)", declared,
                           srv->p.max_body);
            return respond_error(srv, conn, q, method, url, &e);
        }
        return MHD_YES;
    }
    if (q->answered) /* answered early (413): ignore whatever still arrives */
        return MHD_YES;
    if (*upload_size) {
        q->received += *upload_size;
        if (q->received > srv->p.max_body + DRAIN_LIMIT)
            return MHD_NO; /* a body without end: close the connection */
        if (!q->too_large && q->received > srv->p.max_body) {
            q->too_large = true; /* the body passed the limit: stop keeping it */
            sb_srv_buf_free(&q->body);
        }
        if (!q->too_large) {
            sb_srv_buf_append(&q->body, upload_data, *upload_size);
            if (q->body.failed)
                return MHD_NO;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    sb_oai_err e;
    if (q->too_large) {
        sb_oai_err_set(&e, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", "request_too_large", NULL,
                       "the request body is larger than %zu bytes (--max-body)", srv->p.max_body);
        return respond_error(srv, conn, q, method, url, &e);
    }
    if (!q->route) {
        sb_oai_err_set(&e, MHD_HTTP_NOT_FOUND, "invalid_request_error", "unknown_url", NULL,
                       "Invalid URL (%.20s %.200s)", method, url);
        return respond_error(srv, conn, q, method, url, &e);
    }
    if (!q->method_ok) {
        sb_oai_err_set(&e, MHD_HTTP_METHOD_NOT_ALLOWED, "invalid_request_error", "method_not_allowed", NULL,
                       "%.20s is not allowed on %.200s; use %s", method, url, q->route->method);
        return respond_error(srv, conn, q, method, url, &e);
    }
    return q->route->fn(srv, conn, q, url);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    http_req *q = *con_cls;
    if (!q)
        return;
    sb_srv_buf_free(&q->body);
    sb_free(q);
    *con_cls = NULL;
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
        .engine = sb_engine_default_params(),
        .max_body = (size_t)8 << 20,
        .timeout_s = 30,
    };
}

/* The file name without directories and without a .gguf suffix. */
static char *model_id_from_path(const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n > 5 && strcmp(base + n - 5, ".gguf") == 0)
        n -= 5;
    return sb_strndup(base, n);
}

sb_status sb_srv_start(const sb_srv_params *params, sb_srv **out, sb_error *err) {
    *out = NULL;
    if (!params->model_path)
        return sb_fail(err, SB_ERR_INVALID_ARG, "server: no model file given");
    sb_srv *srv = sb_calloc(1, sizeof *srv);
    if (!srv)
        return sb_fail(err, SB_ERR_NOMEM, "server: out of memory");
    srv->p = *params;
    if (!srv->p.host)
        srv->p.host = "127.0.0.1";
    srv->id = params->model_id ? sb_strndup(params->model_id, strlen(params->model_id))
                               : model_id_from_path(params->model_path);
    srv->created = (int64_t)time(NULL);
    srv->salt = splitmix64((uint64_t)srv->created ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)srv);
    atomic_init(&srv->counter, 0);
    atomic_init(&srv->ready, false);
    sb_srv_metrics_init(&srv->metrics);
    pthread_rwlock_init(&srv->engine_lock, NULL);
    if (!srv->id) {
        sb_srv_stop(srv);
        return sb_fail(err, SB_ERR_NOMEM, "server: out of memory");
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
    memcpy(&addr, ai->ai_addr, SB_MIN((size_t)ai->ai_addrlen, sizeof addr));
    bool v6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);

    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    srv->daemon = MHD_start_daemon(flags, srv->p.port, NULL, NULL, on_request, srv,
                                   MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, srv,
                                   MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                                   MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)srv->p.timeout_s,
                                   MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                                   MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned int)1,
                                   MHD_OPTION_END);
    if (!srv->daemon) {
        sb_srv_stop(srv);
        return sb_fail(err, SB_ERR_IO, "server: cannot listen on %s:%u (address in use, or not an address of this host?)",
                       params->host, (unsigned)params->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? di->port : srv->p.port;
    *out = srv;
    return SB_OK;
}

uint16_t sb_srv_port(const sb_srv *srv) { return srv->port; }

sb_status sb_srv_load(sb_srv *srv, sb_error *err) {
    sb_model_t *model = NULL;
    sb_chat *chat = NULL;
    sb_grammar_vocab *gvocab = NULL;
    sb_engine *engine = NULL;
    sb_status st = sb_model_load(srv->p.model_path, &model, err);
    if (st == SB_OK)
        st = sb_chat_create(model, &chat, err);
    if (st == SB_OK)
        st = sb_grammar_vocab_create(model, &gvocab, err);
    if (st == SB_OK)
        st = sb_engine_create(model, &srv->p.engine, &engine, err);
    if (st != SB_OK) {
        sb_grammar_vocab_free(gvocab);
        sb_chat_free(chat);
        sb_model_free(model);
        return st;
    }
    srv->model = model;
    srv->chat = chat;
    srv->gvocab = gvocab;
    srv->n_embd = model->hp.n_embd;
    pthread_rwlock_wrlock(&srv->engine_lock);
    srv->engine = engine;
    pthread_rwlock_unlock(&srv->engine_lock);
    atomic_store(&srv->ready, true);
    sb__srv_log(srv, "serving '%s' (prompts: %s)", srv->id, sb_chat_describe(chat));
    return SB_OK;
}

void sb_srv_stop(sb_srv *srv) {
    if (!srv)
        return;
    atomic_store(&srv->ready, false);
    pthread_rwlock_wrlock(&srv->engine_lock);
    sb_engine *engine = srv->engine;
    srv->engine = NULL;
    pthread_rwlock_unlock(&srv->engine_lock);
    /* Cancels what runs: waiting connection threads get their DONE events and finish. */
    sb_engine_free(engine);
    if (srv->daemon)
        MHD_stop_daemon(srv->daemon);
    sb_chat_free(srv->chat);
    sb_grammar_vocab_free(srv->gvocab);
    sb_model_free(srv->model);
    pthread_rwlock_destroy(&srv->engine_lock);
    sb_srv_metrics_destroy(&srv->metrics);
    sb_free(srv->id);
    sb_free(srv);
}
