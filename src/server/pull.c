/*
 * pull.c - a call's events from its public request or a replay (see pull.h).
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "server/pull.h"
#include "server/server-impl.h"

/* How often a waiting connection thread looks at its client's socket. */
#define HANGUP_POLL_MS 50

struct sb_srv_pull {
    sb_request_t *req;       /* live; NULL for a replay */
    sb_srv_replay replay;    /* cached */
    size_t next;             /* of replay, the event to give next */
    int client_fd;
    bool whole;              /* not streaming: wait for choices to finish */
    bool draining;           /* whole: a done is queued; take events until none are */
    double next_check;       /* monotonic seconds of the next look at the socket */
    sb_srv_model_metrics *metrics; /* of the model that serves */
    double *last_token;      /* per choice: time_s of its previous token (0: none yet) */
    int32_t n_choices;
};

void sb_srv_replay_free(sb_srv_replay *r) {
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++)
        sb_free((char *)r->events[i].ev.text);
    sb_free(r->events);
    memset(r, 0, sizeof *r);
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

sb_status sb_srv_pull_submit(sb_srv *srv, const sb_oai_req *req, int client_fd, sb_srv_pull **out, sb_error *err) {
    *out = NULL;
    sb_srv_pull *p = sb_calloc(1, sizeof *p);
    sb_input *inputs = sb_calloc((size_t)req->n_choices, sizeof *inputs);
    double *last = sb_calloc((size_t)req->n_choices, sizeof *last);
    sb_served served;
    sb_held_served(req->held, &served);
    sb_srv_model_metrics *mm = sb_srv_metrics_model(&srv->metrics, served.model);
    sb_status st = p && inputs && last && mm ? SB_OK
                                             : sb_fail(err, SB_ERR_NOMEM, "out of memory for %d choices",
                                                       (int)req->n_choices);
    if (st == SB_OK) {
        sb_infer_params ip;
        sb_oai_inputs(req, inputs, &ip);
        st = sb_held_submit(req->held, inputs, (size_t)req->n_choices, &ip, &p->req, err);
    }
    sb_free(inputs);
    if (st != SB_OK) {
        sb_free(last);
        sb_free(p);
        return st;
    }
    p->client_fd = client_fd;
    p->whole = !req->stream;
    p->next_check = mono_s() + HANGUP_POLL_MS * 1e-3;
    p->metrics = mm;
    p->last_token = last;
    p->n_choices = req->n_choices;
    *out = p;
    return SB_OK;
}

sb_status sb_srv_pull_replay(sb_srv_replay *replay, sb_srv_pull **out, sb_error *err) {
    *out = NULL;
    sb_srv_pull *p = sb_calloc(1, sizeof *p);
    if (!p) {
        sb_srv_replay_free(replay);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for a cached answer");
    }
    p->replay = *replay;
    memset(replay, 0, sizeof *replay);
    p->client_fd = -1;
    *out = p;
    return SB_OK;
}

/* True if the peer closed or reset the connection. */
static bool client_gone(int fd) {
    if (fd < 0)
        return false;
    struct pollfd q = {.fd = fd, .events = POLLRDHUP};
    int r;
    do
        r = poll(&q, 1, 0);
    while (r < 0 && errno == EINTR);
    return r > 0 && (q.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Counts a live event for the serving model's series. */
static void observe(sb_srv_pull *p, const sb_stream_event *ev) {
    if (ev->index < 0 || ev->index >= p->n_choices)
        return;
    if (ev->done) {
        sb_srv_metrics_generation(p->metrics, ev->n_prompt, ev->n_generated, ev->ttft_s);
        return;
    }
    double *last = &p->last_token[ev->index];
    if (*last > 0)
        sb_srv_metrics_itl(p->metrics, ev->time_s - *last);
    *last = ev->time_s;
}

bool sb_srv_pull_next(sb_srv_pull *p, sb_stream_event *ev, bool *gone) {
    *gone = false;
    if (!p->req) {
        if (p->next >= p->replay.n)
            return false;
        *ev = p->replay.events[p->next].ev;
        ev->top = p->replay.events[p->next].top;
        p->next++;
        return true;
    }
    for (;;) {
        bool got = false;
        if (!p->whole || p->draining) {
            got = sb_request_next(p->req, p->whole ? 0 : HANGUP_POLL_MS, ev);
            if (!got && sb_request_finished(p->req))
                return false;
            p->draining = got;
        } else {
            p->draining = sb_request_wait(p->req, HANGUP_POLL_MS);
        }
        const double now = mono_s();
        if (now >= p->next_check) {
            p->next_check = now + HANGUP_POLL_MS * 1e-3;
            if (client_gone(p->client_fd)) {
                sb_request_cancel(p->req);
                *gone = true;
                return false;
            }
        }
        if (got) {
            observe(p, ev);
            return true;
        }
    }
}

void sb_srv_pull_cancel(sb_srv_pull *p) {
    if (p && p->req)
        sb_request_cancel(p->req);
}

void sb_srv_pull_free(sb_srv_pull *p) {
    if (!p)
        return;
    sb_request_free(p->req);
    sb_srv_replay_free(&p->replay);
    sb_free(p->last_token);
    sb_free(p);
}
