/*
 * executor.c - see executor.h.
 *
 * The executor lock guards the engine list, the step counter and `stepping`
 * (the engine whose step runs now, outside the lock). Lock order: the
 * executor's, then an engine's (the thread takes each engine's incoming
 * requests while holding its own); a submitter releases its engine's lock
 * before kicking, so the two never nest the other way. The thread takes
 * every engine's incoming work and decides under the executor lock, and a
 * kick needs that lock, so a request that arrives after the decision kicks
 * a thread that is already waiting: no wake-up is lost.
 */
#include <pthread.h>
#include <unistd.h>

#include "base/base.h"
#include "engine/executor.h"

typedef struct slot {
    sb_engine *engine;
    uint64_t last_step; /* the step counter when it was last stepped; 0: never */
} slot;

struct sb_executor {
    sb_threadpool *pool;
    int32_t n_threads, steps_per_turn;
    pthread_t thread;
    bool started;

    pthread_mutex_t lock;
    pthread_cond_t wake;    /* the thread waits here for work */
    pthread_cond_t stepped; /* sb__executor_remove waits here for a step to end */
    bool stop, kicked;
    slot *slots;
    int32_t n_slots, cap_slots;
    uint64_t steps;
    sb_engine *stepping;
    sb_engine *last;  /* the engine of the current turn (only compared: it may be gone) */
    int32_t streak;   /* steps it has had in this turn */
};

sb_executor_params sb_executor_default_params(void) {
    return (sb_executor_params){.n_threads = 0, .steps_per_turn = 1};
}

/* The slot to step next, or -1 when no engine has work: the highest
 * priority first; among equals the engine whose turn is not over, else the
 * least recently stepped. */
static int32_t choose(const sb_executor *x) {
    int32_t best = -1, best_prio = 0, keep = -1, keep_prio = 0;
    for (int32_t i = 0; i < x->n_slots; i++) {
        int32_t prio;
        if (!sb__engine_has_work(x->slots[i].engine, &prio))
            continue;
        if (x->slots[i].engine == x->last && x->streak < x->steps_per_turn)
            keep = i, keep_prio = prio;
        if (best < 0 || prio > best_prio ||
            (prio == best_prio && x->slots[i].last_step < x->slots[best].last_step)) {
            best = i;
            best_prio = prio;
        }
    }
    return keep >= 0 && keep_prio == best_prio ? keep : best;
}

static void *executor_main(void *arg) {
    sb_executor *x = arg;
    pthread_mutex_lock(&x->lock);
    while (!x->stop) {
        x->kicked = false;
        for (int32_t i = 0; i < x->n_slots; i++)
            sb__engine_take_incoming(x->slots[i].engine);
        int32_t pick = choose(x);
        if (pick < 0) {
            while (!x->kicked && !x->stop)
                pthread_cond_wait(&x->wake, &x->lock);
            continue;
        }
        sb_engine *e = x->stepping = x->slots[pick].engine;
        x->slots[pick].last_step = ++x->steps;
        x->streak = e == x->last ? x->streak + 1 : 1;
        x->last = e;
        pthread_mutex_unlock(&x->lock);
        sb__engine_step(e);
        pthread_mutex_lock(&x->lock);
        x->stepping = NULL;
        pthread_cond_broadcast(&x->stepped);
    }
    pthread_mutex_unlock(&x->lock);
    return NULL;
}

sb_status sb_executor_create(const sb_executor_params *params, sb_executor **out, sb_error *err) {
    *out = NULL;
    sb_executor_params p = params ? *params : sb_executor_default_params();
    if (p.n_threads < 0 || p.steps_per_turn < 0)
        return sb_fail(err, SB_ERR_INVALID_ARG, "n_threads (%d) and steps_per_turn (%d) must not be negative",
                       p.n_threads, p.steps_per_turn);
    sb_executor *x = sb_calloc(1, sizeof(*x));
    if (!x)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    x->n_threads = p.n_threads ? p.n_threads : SB_MAX(1, (int32_t)sysconf(_SC_NPROCESSORS_ONLN));
    x->steps_per_turn = SB_MAX(1, p.steps_per_turn);
    pthread_mutex_init(&x->lock, NULL);
    pthread_cond_init(&x->wake, NULL);
    pthread_cond_init(&x->stepped, NULL);
    sb_status st = sb_threadpool_create(x->n_threads, &x->pool, err);
    if (st == SB_OK && pthread_create(&x->thread, NULL, executor_main, x) != 0)
        st = sb_fail(err, SB_ERR_NOMEM, "cannot start the executor thread");
    if (st != SB_OK) {
        sb_executor_free(x);
        return st;
    }
    x->started = true;
    *out = x;
    return SB_OK;
}

void sb_executor_free(sb_executor *x) {
    if (!x)
        return;
    SB_ASSERT(x->n_slots == 0); /* an engine still registered would be stepped after its executor is gone */
    if (x->started) {
        pthread_mutex_lock(&x->lock);
        x->stop = true;
        pthread_mutex_unlock(&x->lock);
        pthread_cond_signal(&x->wake);
        pthread_join(x->thread, NULL);
    }
    sb_threadpool_free(x->pool);
    sb_free(x->slots);
    pthread_mutex_destroy(&x->lock);
    pthread_cond_destroy(&x->wake);
    pthread_cond_destroy(&x->stepped);
    sb_free(x);
}

int32_t sb_executor_n_threads(const sb_executor *x) { return x->n_threads; }

sb_threadpool *sb__executor_pool(sb_executor *x) { return x->pool; }

sb_status sb__executor_add(sb_executor *x, sb_engine *e, sb_error *err) {
    pthread_mutex_lock(&x->lock);
    if (x->n_slots == x->cap_slots) {
        int32_t cap = x->cap_slots ? 2 * x->cap_slots : 4;
        slot *s = sb_realloc(x->slots, (size_t)cap * sizeof(slot));
        if (!s) {
            pthread_mutex_unlock(&x->lock);
            return sb_fail(err, SB_ERR_NOMEM, "out of memory");
        }
        x->slots = s;
        x->cap_slots = cap;
    }
    /* Never stepped: it goes first among equals, as a newcomer should. */
    x->slots[x->n_slots++] = (slot){.engine = e, .last_step = 0};
    pthread_mutex_unlock(&x->lock);
    return SB_OK;
}

void sb__executor_remove(sb_executor *x, sb_engine *e) {
    pthread_mutex_lock(&x->lock);
    SB_ASSERT(!(x->stepping == e && pthread_equal(pthread_self(), x->thread))); /* freed from its own callback */
    while (x->stepping == e)
        pthread_cond_wait(&x->stepped, &x->lock);
    for (int32_t i = 0; i < x->n_slots; i++)
        if (x->slots[i].engine == e) {
            x->slots[i] = x->slots[--x->n_slots];
            break;
        }
    if (x->last == e)
        x->last = NULL; /* a new engine at the same address starts its own turn */
    pthread_mutex_unlock(&x->lock);
}

void sb__executor_kick(sb_executor *x) {
    pthread_mutex_lock(&x->lock);
    x->kicked = true;
    pthread_mutex_unlock(&x->lock);
    pthread_cond_signal(&x->wake); /* after the unlock: woken, the thread takes the lock at once */
}
