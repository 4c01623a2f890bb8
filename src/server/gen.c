/*
 * gen.c - generations in flight and their event queue (see gen.h).
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "server/gen.h"
#include "server/server-impl.h"

/* How often a waiting connection thread looks at its client's socket. */
#define HANGUP_POLL_NS 50000000L

typedef struct slot {
    sb_srv_gen *gen;
    int32_t index;  /* the choice */
    uint64_t id;    /* engine request id */
    bool submitted; /* the engine owes this slot a DONE event */
    bool done;      /* it came (under gen->mu) */
    double last_token_s; /* engine-thread clock of the previous token, for inter-token latency */
} slot;

struct sb_srv_gen {
    sb_srv *srv;
    sb_engine *engine;   /* of the request's lease, which outlives every use of it here */
    sb_srv_model_metrics *metrics; /* of the model that serves */
    atomic_int refs;
    int client_fd;
    bool wake_each; /* streaming: the connection thread wakes for every token, else when a choice ends */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled when an event is queued */
    int32_t n_slots;
    int32_t n_live; /* submitted slots without their DONE yet (under mu) */
    slot *slots;
    sb_srv_event *head, *tail; /* queue (under mu) */
};

void sb_srv_events_free(sb_srv_event *list) {
    while (list) {
        sb_srv_event *next = list->next;
        sb_free(list->embedding);
        sb_free(list->error);
        sb_free(list);
        list = next;
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void gen_destroy(sb_srv_gen *g) {
    sb_srv_events_free(g->head);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    sb_free(g->slots);
    sb_free(g);
}

void sb_srv_gen_release(sb_srv_gen *g) {
    if (g && atomic_fetch_sub(&g->refs, 1) == 1)
        gen_destroy(g);
}

/* Engine thread: copy the event, queue it, wake the connection thread. An
 * allocation failure loses a token event (the text then misses a piece) but
 * never a DONE: the slot is marked done either way so nobody waits forever. */
static void on_event(void *user, const sb_gen_event *ev) {
    slot *s = user;
    sb_srv_gen *g = s->gen;
    bool done = ev->kind == SB_GEN_DONE;
    size_t text_len = ev->text ? ev->text_len : 0;
    sb_srv_event *e = sb_malloc(sizeof *e + text_len + 1);
    if (e) {
        memset(e, 0, sizeof *e);
        e->choice = s->index;
        e->done = done;
        e->token = ev->token;
        e->logprob = ev->logprob;
        e->n_top = SB_MIN(SB_MAX(ev->n_top, 0), (int32_t)SB_ARRAY_LEN(e->top));
        if (e->n_top > 0)
            memcpy(e->top, ev->top, (size_t)e->n_top * sizeof e->top[0]);
        e->finish = ev->finish;
        e->n_prompt = ev->n_prompt;
        e->n_prompt_cached = ev->n_prompt_cached;
        e->n_generated = ev->n_generated;
        e->ttft_s = ev->ttft_s;
        if (done && ev->embedding && ev->n_embd > 0) {
            e->embedding = sb_malloc((size_t)ev->n_embd * sizeof(float));
            if (e->embedding) {
                memcpy(e->embedding, ev->embedding, (size_t)ev->n_embd * sizeof(float));
                e->n_embd = ev->n_embd;
            }
        }
        if (done && ev->error)
            e->error = sb_strndup(ev->error, strlen(ev->error));
        if (text_len)
            memcpy(e->text, ev->text, text_len);
        e->text[text_len] = '\0';
        e->text_len = text_len;
    }
    if (!done) {
        double t = now_s();
        if (s->last_token_s > 0)
            sb_srv_metrics_itl(g->metrics, t - s->last_token_s);
        s->last_token_s = t;
    } else {
        sb_srv_metrics_generation(g->metrics, ev->n_prompt, ev->n_generated, ev->ttft_s);
    }

    pthread_mutex_lock(&g->mu);
    if (e) {
        if (g->tail)
            g->tail->next = e;
        else
            g->head = e;
        g->tail = e;
    }
    if (done) {
        s->done = true;
        g->n_live--;
    }
    const bool wake = done || g->wake_each;
    pthread_mutex_unlock(&g->mu);
    /* Signalled after the unlock: a connection thread woken while the lock
     * is still held wakes only to block on it, and then has to be woken
     * again (two more futex calls and a context switch per token). g lives
     * on: the engine's reference goes only after this. */
    if (wake)
        pthread_cond_signal(&g->cv);
    if (done)
        sb_srv_gen_release(g);
}

void sb_srv_gen_cancel(sb_srv_gen *g) {
    for (int32_t i = 0; i < g->n_slots; i++)
        if (g->slots[i].submitted)
            sb_engine_cancel(g->engine, g->slots[i].id);
}

sb_status sb_srv_gen_submit(sb_srv *srv, const sb_oai_req *req, int client_fd, sb_srv_gen **out, sb_error *err) {
    *out = NULL;
    sb_srv_gen *g = sb_calloc(1, sizeof *g);
    slot *slots = sb_calloc((size_t)req->n_choices, sizeof *slots);
    if (!g || !slots) {
        sb_free(g);
        sb_free(slots);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for %d choices", (int)req->n_choices);
    }
    g->srv = srv;
    g->engine = sb_reg_lease_engine(req->lease);
    g->metrics = sb_srv_metrics_model(&srv->metrics, sb_reg_lease_name(req->lease));
    atomic_init(&g->refs, 1);
    g->client_fd = client_fd;
    g->wake_each = req->stream;
    g->slots = slots;
    g->n_slots = req->n_choices;
    pthread_mutex_init(&g->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->cv, &ca);
    pthread_condattr_destroy(&ca);

    sb_status st = g->metrics ? SB_OK : sb_fail(err, SB_ERR_NOMEM, "out of memory for the model's metrics");
    for (int32_t i = 0; st == SB_OK && i < g->n_slots; i++) {
        slot *s = &g->slots[i];
        s->gen = g;
        s->index = i;
        sb_gen_params gp;
        sb_oai_gen_params(req, i, &gp);
        /* Count the engine's reference first: the callback may run before submit returns. */
        atomic_fetch_add(&g->refs, 1);
        pthread_mutex_lock(&g->mu);
        g->n_live++;
        pthread_mutex_unlock(&g->mu);
        st = sb_engine_submit(g->engine, &gp, on_event, s, &s->id, err);
        if (st == SB_OK) {
            s->submitted = true;
        } else {
            atomic_fetch_sub(&g->refs, 1);
            pthread_mutex_lock(&g->mu);
            g->n_live--;
            pthread_mutex_unlock(&g->mu);
        }
    }
    if (st != SB_OK) {
        sb_srv_gen_cancel(g);
        sb_srv_gen_release(g);
        return st;
    }
    *out = g;
    return SB_OK;
}

sb_status sb_srv_gen_replay(sb_srv_event *events, sb_srv_gen **out, sb_error *err) {
    *out = NULL;
    sb_srv_gen *g = sb_calloc(1, sizeof *g);
    if (!g) {
        sb_srv_events_free(events);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for a cached answer");
    }
    atomic_init(&g->refs, 1);
    g->client_fd = -1;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->head = events;
    for (g->tail = events; g->tail && g->tail->next; g->tail = g->tail->next)
        ;
    *out = g;
    return SB_OK;
}

/* True if the peer closed or reset the connection. */
static bool client_gone(int fd) {
    if (fd < 0)
        return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    int r;
    do
        r = poll(&p, 1, 0);
    while (r < 0 && errno == EINTR);
    return r > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

sb_srv_event *sb_srv_gen_next(sb_srv_gen *g, bool *gone) {
    *gone = false;
    struct timespec next_check;
    clock_gettime(CLOCK_MONOTONIC, &next_check);
    pthread_mutex_lock(&g->mu);
    for (;;) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > next_check.tv_sec || (now.tv_sec == next_check.tv_sec && now.tv_nsec >= next_check.tv_nsec)) {
            pthread_mutex_unlock(&g->mu);
            if (client_gone(g->client_fd)) {
                sb_srv_gen_cancel(g);
                *gone = true;
                return NULL;
            }
            pthread_mutex_lock(&g->mu);
            next_check = now;
            next_check.tv_nsec += HANGUP_POLL_NS;
            if (next_check.tv_nsec >= 1000000000L) {
                next_check.tv_sec++;
                next_check.tv_nsec -= 1000000000L;
            }
        }
        if (g->head || g->n_live == 0)
            break;
        pthread_cond_timedwait(&g->cv, &g->mu, &next_check);
    }
    sb_srv_event *list = g->head;
    g->head = g->tail = NULL;
    pthread_mutex_unlock(&g->mu);
    return list;
}
