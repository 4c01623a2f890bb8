/*
 * sse.c - the streaming response generator (see sse.h).
 */
#include <string.h>

#include <microhttpd.h>

#include "base/base.h"
#include "gateway/gateway.h"
#include "server/server-impl.h"
#include "server/sse.h"

/* libmicrohttpd's buffer for one content-reader call. */
#define SSE_BLOCK_SIZE (16 * 1024)

typedef struct sse_stream {
    sb_srv *srv;
    sb_oai_req req;
    sb_srv_pull *pull;
    sb_srv_acct *acct;
    sb_oai_resp resp;
    sb_srv_buf out; /* rendered events not yet handed to libmicrohttpd */
    size_t off;     /* of out, already handed */
    bool ended;     /* "data: [DONE]" is in out */
} sse_stream;

/* The answer is whole once "data: [DONE]" is rendered: it is accounted for
 * (and stored in a memory response cache) now, before its last bytes go
 * out, so that a client that repeats the request the moment it reads
 * [DONE] finds it cached; at the response's end it raced the next request. */
static void sse_end(sse_stream *s) {
    s->ended = true;
    sb_srv_acct_end(s->acct, 200);
    s->acct = NULL;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    sse_stream *s = cls;
    for (;;) {
        if (s->off < s->out.len) {
            size_t n = SB_MIN(max, s->out.len - s->off);
            memcpy(buf, s->out.p + s->off, n);
            s->off += n;
            return (ssize_t)n;
        }
        if (s->ended)
            return MHD_CONTENT_READER_END_OF_STREAM;
        sb_srv_buf_clear(&s->out);
        s->off = 0;
        bool gone;
        sb_stream_event ev;
        if (sb_srv_pull_next(s->pull, &ev, &gone)) {
            sb_srv_acct_event(s->acct, &ev);
            if (sb_oai_resp_chunk(&s->resp, &ev, &s->out))
                sse_end(s);
        } else if (gone) {
            return MHD_CONTENT_READER_END_WITH_ERROR;
        } else { /* every choice finished but a done event was lost to an allocation failure */
            sb_srv_buf_puts(&s->out, "data: [DONE]\n\n");
            sse_end(s);
        }
        if (s->out.failed) {
            sb_srv_pull_cancel(s->pull);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void sse_free(void *cls) {
    sse_stream *s = cls;
    if (s->acct) /* the stream did not end: the client went away */
        sb_srv_acct_end(s->acct, 499);
    sb_gw_settle(s->srv->gw, &s->req.caller, sb__srv_tokens_used(&s->resp));
    sb_srv_pull_free(s->pull); /* cancels what still runs: the connection ended early, nobody wants the rest */
    sb_oai_resp_free(&s->resp);
    sb_oai_req_free(&s->req);
    sb_srv_buf_free(&s->out);
    sb_free(s);
}

struct MHD_Response *sb_srv_sse_response(sb_srv *srv, sb_oai_req *req, sb_srv_pull *pull, sb_srv_acct *acct) {
    sse_stream *s = sb_calloc(1, sizeof *s);
    if (!s) {
        sb_srv_acct_end(acct, 500);
        sb_srv_pull_free(pull);
        sb_gw_settle(srv->gw, &req->caller, 0);
        sb_oai_req_free(req);
        return NULL;
    }
    s->srv = srv;
    s->req = *req;
    memset(req, 0, sizeof *req);
    s->pull = pull;
    s->acct = acct;
    struct MHD_Response *r = NULL;
    if (sb_oai_resp_init(&s->resp, srv, &s->req)) {
        sb_srv_acct_id(acct, s->resp.id);
        sb_oai_resp_start(&s->resp, &s->out); /* the headers and these go out before the first token */
        if (!s->out.failed)
            r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK_SIZE, sse_read, s, sse_free);
    }
    if (!r) {
        sse_free(s);
        return NULL;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    return r;
}
