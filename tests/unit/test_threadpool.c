/*
 * test_threadpool.c - the persistent thread pool: every chunk of every loop
 * runs exactly once, on a valid thread index, across thousands of loops of
 * varying sizes (light ones too, and two-phase ones, whose first phase has
 * finished whole before any main chunk starts); a slow chunk does not stop other threads from taking the
 * rest; a worker that keeps holding the loops back hands them to the caller alone; and
 * model outputs do not depend on the thread count.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "switchboard.h"
#include "tensor/threadpool.h"
#include "testutil.h"

typedef struct counting {
    _Atomic int hits[1000];
    _Atomic int bad_ith;
    int n_threads;
    int64_t slow_chunk; /* this chunk sleeps 20 ms; -1 for none */
    int slow_ith; /* chunks busy for 0.2 ms, this thread's sleeping 2 ms more (a neighbour has its core); 0: none */
    int busy_us;  /* without slow_ith: every chunk busy this long (a prompt's long chunks) */
    _Atomic int by_thread[8];
    _Atomic int started;        /* chunks started so far */
    int start[1000], ran_on[1000]; /* each chunk's place in the order of starts, and its thread */
} counting;

static void count_chunk(void *arg, int64_t chunk, int ith) {
    counting *c = arg;
    if (ith < 0 || ith >= c->n_threads)
        atomic_fetch_add(&c->bad_ith, 1);
    else
        atomic_fetch_add(&c->by_thread[ith], 1);
    c->start[chunk] = atomic_fetch_add(&c->started, 1);
    c->ran_on[chunk] = ith;
    if (chunk == c->slow_chunk)
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    if (c->slow_ith > 0 || c->busy_us > 0) {
        const long busy_ns = (c->slow_ith > 0 ? 200 : c->busy_us) * 1000L;
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do
            clock_gettime(CLOCK_MONOTONIC, &t);
        while ((t.tv_sec - t0.tv_sec) * 1000000000L + t.tv_nsec - t0.tv_nsec < busy_ns);
        if (ith == c->slow_ith)
            nanosleep(&(struct timespec){0, 2 * 1000 * 1000}, NULL);
    }
    atomic_fetch_add(&c->hits[chunk], 1);
}

static void test_every_chunk_once(void **state) {
    (void)state;
    for (int n_threads = 1; n_threads <= 4; n_threads++) {
        sb_threadpool *tp;
        assert_int_equal(sb_threadpool_create(n_threads, &tp, NULL), SB_OK);
        assert_int_equal(sb_threadpool_n_threads(tp), n_threads);
        static counting c;
        for (int loop = 0; loop < 3000; loop++) {
            int64_t n = 1 + (loop * 7919) % 997;
            memset(&c, 0, sizeof(c));
            c.n_threads = n_threads;
            c.slow_chunk = -1;
            if (loop % 3 == 2) /* light loops: on the caller below the threshold, shared above it */
                sb_threadpool_for_light(tp, n, loop % 2 ? SB_THREADPOOL_LIGHT_ELEMENTS : n * 64, count_chunk, &c);
            else
                sb_threadpool_for(tp, n, count_chunk, &c);
            for (int64_t i = 0; i < n; i++)
                assert_int_equal(c.hits[i], 1);
            for (int64_t i = n; i < 1000; i++)
                assert_int_equal(c.hits[i], 0);
            assert_int_equal(c.bad_ith, 0);
        }
        sb_threadpool_free(tp);
    }
    sb_threadpool_for(NULL, 0, count_chunk, NULL); /* no chunks: no call */
}

/* A two-phase loop: first chunks count themselves in `first`; a main chunk
 * that starts before all of them have finished counts an early start. */
typedef struct phased {
    counting c;
    _Atomic int first_hits[100];
    _Atomic int64_t first;
    int64_t n_first;
    _Atomic int early;
} phased;

static void first_chunk(void *arg, int64_t chunk, int ith) {
    phased *p = arg;
    if (ith < 0 || ith >= p->c.n_threads)
        atomic_fetch_add(&p->c.bad_ith, 1);
    if (chunk % 3 == 0) /* some slow ones, so that a thread reaches the main phase first */
        nanosleep(&(struct timespec){0, 20 * 1000}, NULL);
    atomic_fetch_add(&p->first_hits[chunk], 1);
    atomic_fetch_add(&p->first, 1);
}

static void main_chunk(void *arg, int64_t chunk, int ith) {
    phased *p = arg;
    if (atomic_load(&p->first) != p->n_first)
        atomic_fetch_add(&p->early, 1);
    count_chunk(&p->c, chunk, ith);
}

static void test_first_phase_finishes_before_the_main_one(void **state) {
    (void)state;
    for (int n_threads = 1; n_threads <= 4; n_threads++) {
        sb_threadpool *tp;
        assert_int_equal(sb_threadpool_create(n_threads, &tp, NULL), SB_OK);
        static phased p;
        for (int loop = 0; loop < 1000; loop++) {
            int64_t n_first = loop % 9, n = (loop * 7919) % 300; /* either may be 0 */
            memset(&p, 0, sizeof(p));
            p.c.n_threads = n_threads;
            p.c.slow_chunk = -1;
            p.n_first = n_first;
            sb_threadpool_for_then(tp, n_first, first_chunk, n, main_chunk, &p);
            for (int64_t i = 0; i < 100; i++)
                assert_int_equal(p.first_hits[i], i < n_first ? 1 : 0);
            for (int64_t i = 0; i < 1000; i++)
                assert_int_equal(p.c.hits[i], i < n ? 1 : 0);
            assert_int_equal(p.early, 0);
            assert_int_equal(p.c.bad_ith, 0);
        }
        sb_threadpool_free(tp);
    }
}

static void test_slow_chunk_does_not_hold_the_rest(void **state) {
    (void)state;
    sb_threadpool *tp;
    assert_int_equal(sb_threadpool_create(2, &tp, NULL), SB_OK);
    static counting c;
    memset(&c, 0, sizeof(c));
    c.n_threads = 2;
    c.slow_chunk = 0; /* it sleeps 20 ms; the other thread does the rest meanwhile */
    sb_threadpool_for(tp, 200, count_chunk, &c);
    for (int i = 0; i < 200; i++)
        assert_int_equal(c.hits[i], 1);
    assert_true(c.by_thread[0] + c.by_thread[1] == 200);
    /* Whichever thread took it (the caller, or a worker that finished its
     * own range before the caller started and stole it), every chunk that
     * started after it ran on the other thread. */
    for (int i = 1; i < 200; i++)
        assert_true(c.start[i] < c.start[0] || c.ran_on[i] != c.ran_on[0]);
    sb_threadpool_free(tp);
}

/* One loop of 4 chunks; returns how many the worker (thread 1) ran. */
static int loop_of_four(sb_threadpool *tp, int slow_ith, int busy_us) {
    static counting c;
    memset(&c, 0, sizeof(c));
    c.n_threads = 2;
    c.slow_chunk = -1;
    c.slow_ith = slow_ith;
    c.busy_us = busy_us;
    sb_threadpool_for(tp, 4, count_chunk, &c);
    for (int i = 0; i < 4; i++)
        assert_int_equal(c.hits[i], 1);
    return c.by_thread[1];
}

/* Loops that take longer than the caller alone would (0.8 ms for 4 chunks;
 * the worker holds one for 2.2 ms) run on the caller alone once the straggler
 * detector's window (50 ms of loops) has seen it. */
static void test_slow_worker_sends_loops_to_the_caller(void **state) {
    (void)state;
    sb_threadpool *tp;
    assert_int_equal(sb_threadpool_create(2, &tp, NULL), SB_OK);
    int worker_chunks_late = 0;
    for (int loop = 0; loop < 60; loop++) {
        const int by_worker = loop_of_four(tp, 1, 0);
        if (loop >= 50)
            worker_chunks_late += by_worker;
    }
    assert_int_equal(worker_chunks_late, 0);
    sb_threadpool_free(tp);
}

/* Once the worker is no longer slow, long loops (a prompt's: 4 chunks of 1
 * ms) are shared again within the solo time (0.2 s), not after its 2048
 * loops (seconds of them). */
static void test_solo_loops_end_in_time(void **state) {
    (void)state;
    sb_threadpool *tp;
    assert_int_equal(sb_threadpool_create(2, &tp, NULL), SB_OK);
    int by_worker = 0;
    for (int loop = 0; loop < 60; loop++)
        by_worker = loop_of_four(tp, 1, 0);
    assert_int_equal(by_worker, 0); /* solo */
    int shared_at = -1;
    for (int loop = 0; loop < 200 && shared_at < 0; loop++) /* 0.8 s of loops alone */
        if (loop_of_four(tp, 0, 1000) > 0)
            shared_at = loop;
    assert_true(shared_at >= 0); /* at loop 0 too, if the first phase outlasted the solo time (a loaded host) */
    sb_threadpool_free(tp);
}

static void test_threads_do_not_change_logits(void **state) {
    (void)state;
    sb_model_t *m;
    assert_int_equal(sb_model_load(sb_test_fixture("models/stories260K-q8_0.gguf"), &m, NULL), SB_OK);
    int32_t toks[40];
    for (int i = 0; i < 40; i++)
        toks[i] = i == 0 ? 1 : 259 + (i * 53) % 250;
    float ref[512];
    for (int n_threads = 1; n_threads <= 3; n_threads++) {
        sb_ctx_params p = sb_ctx_default_params();
        p.n_threads = n_threads;
        sb_ctx_t *ctx;
        assert_int_equal(sb_ctx_create(m, &p, &ctx, NULL), SB_OK);
        assert_int_equal(sb_ctx_eval(ctx, toks, 30, NULL), SB_OK);
        for (int i = 30; i < 40; i++)
            assert_int_equal(sb_ctx_eval(ctx, &toks[i], 1, NULL), SB_OK);
        if (n_threads == 1)
            memcpy(ref, sb_ctx_logits(ctx), sizeof(ref));
        else
            assert_memory_equal(ref, sb_ctx_logits(ctx), sizeof(ref));
        sb_ctx_free(ctx);
    }
    sb_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_chunk_once),
        cmocka_unit_test(test_first_phase_finishes_before_the_main_one),
        cmocka_unit_test(test_slow_chunk_does_not_hold_the_rest),
        cmocka_unit_test(test_slow_worker_sends_loops_to_the_caller),
        cmocka_unit_test(test_solo_loops_end_in_time),
        cmocka_unit_test(test_threads_do_not_change_logits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
