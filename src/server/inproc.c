/*
 * inproc.c - the generation endpoints' work short of HTTP (see inproc.h):
 * parse the body, submit its choices on the held model (switchboard.h),
 * collect the events and render the answer, with every failure as OpenAI's
 * error JSON.
 */
#include <string.h>
#include <time.h>

#include <microhttpd.h>

#include "base/base.h"
#include "server/inproc.h"
#include "server/server-impl.h"

bool sb_srv_endpoint_kind(const char *url_path, sb_oai_kind *kind) {
    static const struct {
        const char *path;
        sb_oai_kind kind;
    } eps[] = {
        {"/v1/chat/completions", SB_OAI_CHAT},
        {"/v1/completions", SB_OAI_COMPLETION},
        {"/v1/embeddings", SB_OAI_EMBEDDING},
    };
    for (size_t i = 0; i < SB_ARRAY_LEN(eps); i++)
        if (url_path && strcmp(url_path, eps[i].path) == 0) {
            *kind = eps[i].kind;
            return true;
        }
    return false;
}

static bool call_error(sb_srv_call *c, const sb_oai_err *e) {
    c->status = e->status;
    sb_srv_buf_clear(&c->body);
    sb_oai_err_json(e, &c->body);
    return false;
}

/* A submission failure as an answer: the queue is full (503), the engine
 * refuses the request (400), or not ready (503). */
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

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* What the token bucket holds for a request while it runs: every prompt
 * once (as usage counts them) and each choice's most tokens to generate. */
static int64_t tokens_reserved(const sb_oai_req *req) {
    int64_t prompt = 0, longest = 0;
    for (int32_t p = 0; p < req->n_prompts; p++) {
        prompt += req->prompt_lens[p];
        longest = SB_MAX(longest, req->prompt_lens[p]);
    }
    if (req->kind == SB_OAI_EMBEDDING)
        return prompt;
    int64_t gen = req->max_tokens > 0 ? req->max_tokens : SB_MAX(sb_held_n_ctx(req->held) - longest, 0);
    return prompt + gen * req->n_choices;
}

int64_t sb__srv_tokens_used(const sb_oai_resp *resp) {
    int64_t used = 0;
    for (int32_t i = 0; resp->choices && i < resp->req->n_choices; i++)
        used += resp->choices[i].n_generated + (i % resp->req->n == 0 ? resp->choices[i].n_prompt : 0);
    return used;
}

/* Admission's refusal (403, 429, 503) as the call's answer; its headers
 * (Retry-After, x-ratelimit-*) are in gw->verdict for the HTTP layer. */
static bool refused(sb_srv_call *c, const sb_gw_verdict *v) {
    sb_oai_err e;
    sb_oai_err_set(&e, v->status, v->type, v->code, NULL, "%s", v->message);
    return call_error(c, &e);
}

bool sb__srv_call_start(sb_srv *srv, sb_oai_kind kind, const char *body, size_t len, const sb_gw_caller *caller,
                        sb_gw_request *gw, int client_fd, bool may_stream, double t_start, sb_srv_call *c) {
    memset(c, 0, sizeof *c);
    if (t_start <= 0)
        t_start = mono_s();
    sb_oai_err e;
    if (!atomic_load(&srv->ready)) {
        sb_oai_err_set(&e, MHD_HTTP_SERVICE_UNAVAILABLE, "server_error", "model_loading", NULL,
                       "the server is starting or stopping; retry shortly");
        return call_error(c, &e);
    }
    if (!sb_oai_parse(srv, kind, body ? body : "", len, &c->req, &e)) {
        sb_srv_acct_refused(srv, kind, caller ? caller : &c->req.caller, body, len, t_start, e.status);
        return call_error(c, &e);
    }
    if (gw) {
        sb_served served;
        sb_held_served(c->req.held, &served);
        if (!sb_gw_admit(srv->gw, gw, served.model, tokens_reserved(&c->req))) {
            sb_srv_acct_refused(srv, kind, &gw->caller, body, len, t_start, gw->verdict.status);
            return refused(c, &gw->verdict);
        }
        c->req.caller = gw->caller;
    } else if (caller) {
        c->req.caller = *caller;
    }
    if (c->req.stream && !may_stream) {
        sb_oai_err_set(&e, MHD_HTTP_BAD_REQUEST, "invalid_request_error", "invalid_value", "stream",
                       "\"stream\": true is not supported here (a batch request gets its whole answer)");
        return call_error(c, &e);
    }
    c->acct = sb_srv_acct_begin(srv, &c->req, body, len, t_start);
    sb_error err;
    sb_srv_replay cached;
    sb_status st = sb_srv_acct_lookup(c->acct, &cached) ? sb_srv_pull_replay(&cached, &c->pull, &err)
                                                        : sb_srv_pull_submit(srv, &c->req, client_fd, &c->pull, &err);
    if (st != SB_OK) {
        submit_error(&err, st, &e);
        return call_error(c, &e);
    }
    return true;
}

bool sb__srv_call_finish(sb_srv *srv, sb_srv_call *c, bool *gone) {
    *gone = false;
    sb_oai_resp resp;
    bool ok = false;
    c->status = MHD_HTTP_INTERNAL_SERVER_ERROR; /* until there is an answer */
    if (!sb_oai_resp_init(&resp, srv, &c->req)) {
        sb_srv_pull_cancel(c->pull);
        goto done;
    }
    sb_srv_acct_id(c->acct, resp.id);
    sb_stream_event ev;
    while (sb_srv_pull_next(c->pull, &ev, gone)) {
        sb_srv_acct_event(c->acct, &ev);
        sb_oai_resp_add(&resp, &ev);
    }
    if (*gone) {
        c->status = 499; /* nginx's "client closed request", as the metrics count it */
        goto done;
    }
    sb_oai_err e;
    if (sb_oai_resp_body(&resp, &c->body, &e))
        c->status = MHD_HTTP_OK;
    else
        call_error(c, &e);
    ok = !c->body.failed;
done:
    c->tokens_used = sb__srv_tokens_used(&resp);
    sb_oai_resp_free(&resp);
    return ok;
}

void sb__srv_call_free(sb_srv *srv, sb_srv_call *c) {
    sb_gw_settle(srv->gw, &c->req.caller, c->tokens_used); /* a no-op unless admitted */
    sb_srv_acct_end(c->acct, c->status);
    sb_srv_pull_free(c->pull);
    sb_oai_req_free(&c->req);
    sb_srv_buf_free(&c->body);
    memset(c, 0, sizeof *c);
}

sb_status sb_srv_execute(sb_srv *srv, const char *url_path, const char *body, size_t len, const sb_gw_caller *caller,
                         int *http_status, char **response_json, sb_error *err) {
    *http_status = 0;
    *response_json = NULL;
    sb_srv_call c;
    sb_oai_kind kind;
    if (!sb_srv_endpoint_kind(url_path, &kind)) {
        memset(&c, 0, sizeof c);
        char quoted[216];
        sb_oai_err e;
        sb_oai_err_set(&e, MHD_HTTP_NOT_FOUND, "invalid_request_error", "unknown_url", NULL, "Invalid URL (POST %s)",
                       sb_oai_quote(url_path ? url_path : "", url_path ? strlen(url_path) : 0, 200, quoted,
                                    sizeof quoted));
        call_error(&c, &e);
    } else if (sb__srv_call_start(srv, kind, body, len, caller, NULL, -1, false, 0, &c)) {
        bool gone;
        if (!sb__srv_call_finish(srv, &c, &gone)) { /* no client to go away: only memory can fail */
            sb__srv_call_free(srv, &c);
            return sb_fail(err, SB_ERR_NOMEM, "out of memory for the answer to %s", url_path);
        }
    }
    if (c.body.failed || !c.body.p) {
        sb__srv_call_free(srv, &c);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for the answer to %s", url_path);
    }
    *http_status = (int)c.status;
    *response_json = c.body.p; /* the buffer's allocation is the caller's now */
    c.body = (sb_srv_buf){0};
    sb__srv_call_free(srv, &c);
    return SB_OK;
}
