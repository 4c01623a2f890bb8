/*
 * executor.c - see executor.h.
 *
 * The executor lock guards the engine list, the step counter and each
 * slot's `stepping` (its engine is being stepped now, outside the lock).
 * Lock order: the executor's, then an engine's (the thread takes each
 * engine's incoming requests while holding its own); a submitter releases
 * its engine's lock before kicking, so the two never nest the other way.
 * The thread takes every engine's incoming work and decides under the
 * executor lock, and a kick needs that lock, so a request that arrives
 * after the decision kicks a thread that is already waiting: no wake-up is
 * lost. Engines stepped side by side (lanes) take their own incoming work
 * between their steps, outside the executor lock: no other thread steps or
 * plans for them until the lanes end, and the plan after them takes every
 * engine's incoming work again.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "base/base.h"
#include "engine/executor.h"

typedef struct slot {
    sb_engine *engine;
    uint64_t last_step; /* the step counter when it was last stepped; 0: never */
    bool stepping;      /* a thread steps it now, outside the lock */
} slot;

/* Engines stepped side by side, one per pool thread, each on that thread
 * alone (executor.h). */
typedef struct lanes {
    sb_executor *x;
    sb_engine **engine; /* n_threads */
    int32_t priority;   /* theirs, the highest with work */
    int32_t max_steps;  /* per lane before the plan is made again; 0: no limit */
    atomic_bool end;    /* a lane has ended: the others end after their step */
} lanes;

struct sb_executor {
    sb_threadpool *pool;
    int32_t n_threads, steps_per_turn;
    pthread_t thread;
    bool started;

    pthread_mutex_t lock;
    pthread_cond_t wake;    /* the thread waits here for work */
    pthread_cond_t stepped; /* sb__executor_remove waits here for a step to end */
    bool stop, kicked;
    atomic_bool replan; /* set with kicked: lanes end after their current step */
    slot *slots;
    int32_t n_slots, cap_slots;
    uint64_t steps;
    sb_engine *last;  /* the engine of the current turn (only compared: it may be gone) */
    int32_t streak;   /* steps it has had in this turn */
    sb_engine **lane_engines; /* n_threads: the engines of the current lanes */
};

/* The engine this thread is stepping, if any: freeing it from its own
 * callback would wait for itself. */
static _Thread_local const sb_engine *stepping_here;

static void step_engine(sb_engine *e, sb_threadpool *pool) {
    stepping_here = e;
    sb__engine_step(e, pool);
    stepping_here = NULL;
}

sb_executor_params sb_executor_default_params(void) {
    return (sb_executor_params){.n_threads = 0, .steps_per_turn = 1};
}

static slot *slot_of(const sb_executor *x, const sb_engine *e) {
    for (int32_t i = 0; i < x->n_slots; i++)
        if (x->slots[i].engine == e)
            return &x->slots[i];
    return NULL;
}

/* The engines with work at the highest priority (*priority), least
 * recently stepped first, the first `max` of them into out; returns how
 * many there are in all. */
static int32_t top_engines(const sb_executor *x, sb_engine **out, int32_t max, int32_t *priority) {
    bool any = false;
    int32_t top = 0, prio, n = 0;
    for (int32_t i = 0; i < x->n_slots; i++)
        if (sb__engine_has_work(x->slots[i].engine, &prio) && (!any || prio > top))
            any = true, top = prio;
    for (int32_t i = 0; i < x->n_slots; i++) {
        if (!sb__engine_has_work(x->slots[i].engine, &prio) || prio != top)
            continue;
        const uint64_t at = x->slots[i].last_step;
        int32_t j = SB_MIN(n, max - 1); /* where it goes unless an earlier one was stepped later */
        if (n < max || slot_of(x, out[j])->last_step > at) {
            for (; j > 0 && slot_of(x, out[j - 1])->last_step > at; j--)
                out[j] = out[j - 1];
            out[j] = x->slots[i].engine;
        }
        n++;
    }
    *priority = top;
    return n;
}

/* Whether the engine of the current turn (x->last) has had fewer than
 * steps_per_turn steps and still has work at the top priority. */
static bool turn_goes_on(const sb_executor *x, int32_t top) {
    const slot *s = x->streak < x->steps_per_turn ? slot_of(x, x->last) : NULL; /* last may be gone */
    int32_t prio;
    return s && sb__engine_has_work(s->engine, &prio) && prio == top;
}

/* One lane: its engine's steps, on this thread alone, until it has no work
 * at the lanes' priority, a turn's steps are done, another lane has ended,
 * or the executor wants to plan again (new work, an engine removed). */
static void run_lane(void *arg, int64_t lane, int ith) {
    (void)ith;
    lanes *l = arg;
    sb_engine *e = l->engine[lane];
    for (int32_t steps = 1;; steps++) {
        step_engine(e, NULL);
        if (steps == l->max_steps || atomic_load(&l->end) || atomic_load(&l->x->replan))
            break;
        int32_t prio;
        sb__engine_take_incoming(e);
        if (!sb__engine_has_work(e, &prio) || prio != l->priority)
            break;
    }
    atomic_store(&l->end, true);
}

/* Marks the engines being stepped (or not), under the lock. */
static void mark_stepping(sb_executor *x, sb_engine *const *e, int32_t n, bool on) {
    for (int32_t i = 0; i < n; i++) {
        slot *s = slot_of(x, e[i]);
        s->stepping = on;
        if (on)
            s->last_step = ++x->steps;
    }
    if (!on)
        pthread_cond_broadcast(&x->stepped);
}

static void *executor_main(void *arg) {
    sb_executor *x = arg;
    pthread_mutex_lock(&x->lock);
    while (!x->stop) {
        x->kicked = false;
        atomic_store(&x->replan, false);
        for (int32_t i = 0; i < x->n_slots; i++)
            sb__engine_take_incoming(x->slots[i].engine);
        int32_t prio, n_top = top_engines(x, x->lane_engines, x->n_threads, &prio);
        if (n_top == 0) {
            while (!x->kicked && !x->stop)
                pthread_cond_wait(&x->wake, &x->lock);
            continue;
        }
        if (x->n_threads > 1 && n_top >= x->n_threads) {
            /* as many busy engines as threads: one thread each */
            lanes l = {.x = x, .engine = x->lane_engines, .priority = prio,
                       .max_steps = n_top > x->n_threads ? x->steps_per_turn : 0};
            mark_stepping(x, l.engine, x->n_threads, true);
            x->last = NULL;
            pthread_mutex_unlock(&x->lock);
            sb_threadpool_for_each_thread(x->pool, run_lane, &l);
            pthread_mutex_lock(&x->lock);
            mark_stepping(x, l.engine, x->n_threads, false);
            continue;
        }
        /* the engine of the current turn while it lasts, else the least recently stepped */
        sb_engine *e = turn_goes_on(x, prio) ? x->last : x->lane_engines[0];
        x->streak = e == x->last ? x->streak + 1 : 1;
        x->last = e;
        mark_stepping(x, &e, 1, true);
        pthread_mutex_unlock(&x->lock);
        step_engine(e, x->pool);
        pthread_mutex_lock(&x->lock);
        mark_stepping(x, &e, 1, false);
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
    x->lane_engines = sb_calloc((size_t)x->n_threads, sizeof(sb_engine *));
    sb_status st = x->lane_engines ? sb_threadpool_create(x->n_threads, &x->pool, err)
                                   : sb_fail(err, SB_ERR_NOMEM, "out of memory");
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
    sb_free(x->lane_engines);
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
    x->slots[x->n_slots++] = (slot){.engine = e};
    pthread_mutex_unlock(&x->lock);
    return SB_OK;
}

void sb__executor_remove(sb_executor *x, sb_engine *e) {
    SB_ASSERT(stepping_here != e); /* freed from its own callback */
    pthread_mutex_lock(&x->lock);
    atomic_store(&x->replan, true); /* lanes end after their step */
    for (slot *s; (s = slot_of(x, e)) && s->stepping;)
        pthread_cond_wait(&x->stepped, &x->lock);
    slot *s = slot_of(x, e);
    if (s)
        *s = x->slots[--x->n_slots];
    if (x->last == e)
        x->last = NULL; /* a new engine at the same address starts its own turn */
    pthread_mutex_unlock(&x->lock);
}

void sb__executor_kick(sb_executor *x) {
    pthread_mutex_lock(&x->lock);
    x->kicked = true;
    atomic_store(&x->replan, true);
    pthread_mutex_unlock(&x->lock);
    pthread_cond_signal(&x->wake); /* after the unlock: woken, the thread takes the lock at once */
}
