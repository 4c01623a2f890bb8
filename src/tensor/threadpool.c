/*
 * threadpool.c - see threadpool.h.
 *
 * A loop is published as (fn, arg, n_chunks) for each of its two phases
 * under a sequence counter (odd while the caller writes them, a seqlock),
 * plus one claim word per thread's range of each phase's chunks (a
 * thread's words on their own cache line), holding the loop's generation
 * in its high half and the range's next chunk in its low half. A
 * worker takes a consistent copy of the loop, then claims with a
 * compare-and-swap that also checks the generation, so a worker descheduled
 * anywhere in between can never run a chunk of a later loop with an earlier
 * loop's function, or the reverse. A thread claims down its own range (a
 * line no other thread touches while it keeps up), then down the others';
 * it adds the chunks it ran to a phase's count once, when nothing is left
 * to claim: to `first_done`, which every thread waits to see complete
 * before it claims main chunks, and to `done`, which the caller waits to
 * see reach n_chunks, after which the loop's memory may be reused. One
 * shared counter for claims and one for completions would cost two
 * contended cache-line transfers per chunk, and an 8-stream step has
 * ~3000 chunks (replacing them: server 1 stream +12%, engine 8 streams +5%).
 *
 * When another process takes a core, a worker that shares it runs its
 * chunks at a fraction of the speed and the caller ends every loop waiting
 * for it. When the loops take longer than the caller alone would have
 * taken (its own chunks' rate times the loops' chunks), the pool runs the
 * next loops on the caller alone (one thread at full speed beats two that
 * take turns with a neighbour), then tries its workers again. Results never
 * depend on how many threads ran a loop.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "tensor/threadpool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* Iterations an idle worker polls before it sleeps: long enough to bridge
 * the gap between the loops of one forward step, short enough that an idle
 * pool stops taking CPU from others within tens of microseconds. */
#define SPIN_ITERATIONS 20000

/* Once the parallel loops of a window have taken WINDOW_NS in all, the
 * caller compares that time with what it would have taken alone: each loop's
 * time on its own chunks, scaled to all the loop's chunks, and scaled by the
 * share of the window the caller had a core (a neighbour on the caller's
 * core stretches its chunks too, and alone it would have a core to itself).
 * When the pool was slower, the next SOLO_LOOPS loops, a few tokens' worth
 * of decoding, run on the caller alone, for SOLO_NS at most: a prompt's
 * loops are long, and 2048 of them (110M pp512, five runs) went at half
 * speed after a neighbour took the worker's core for 0.2 s. (How long the
 * caller waits misleads: a single stream's chunks are short, and a caller
 * that waited a quarter of the time for the worker's hand-offs had still
 * run 1.5-2x faster than alone; the rule "solo above a fifth of the time
 * waiting" sent the ~23 steps after a single stream's run, a whole batched
 * run, to one thread.)
 * The window is long in time, not in loops, so that one hiccup (a worker's
 * core taken away for a few milliseconds, as a virtual machine's host or a
 * kernel thread does now and then) does not count as a neighbour: a
 * sustained neighbour takes the worker's core every scheduler slice. */
#define WINDOW_NS 50000000
#define SOLO_LOOPS 2048
#define SOLO_NS 200000000
#define IDLE_GAP_NS 1000000

typedef struct worker {
    sb_threadpool *tp;
    pthread_t thread;
    int ith;
} worker;

/* A loop's two phases: the first's chunks all finish before any of the
 * second's starts (n_chunks 0: no first phase). */
enum { PHASE_FIRST, PHASE_MAIN, N_PHASES };

/* A thread's range of each phase of the current loop's chunks:
 * (generation << 32) | next. */
typedef struct range {
    _Alignas(64) _Atomic uint64_t claim[N_PHASES];
} range;

struct sb_threadpool {
    int n_threads;
    worker *workers; /* n_threads - 1 */

    /* The current loop, written by the caller while `seq` is odd. */
    _Atomic(sb_chunk_fn) fn[N_PHASES];
    _Atomic(void *) arg;
    _Atomic int64_t n_chunks[N_PHASES];
    range *ranges;       /* n_threads */
    /* The first phase's chunks finished, (generation << 32) | count, added
     * by each thread once: the generation lets a worker that waits for the
     * count from an ended loop see that it ended. */
    _Alignas(64) _Atomic uint64_t first_done;
    _Alignas(64) _Atomic int64_t done; /* main chunks finished, added by each thread once per loop */

    _Atomic uint32_t seq; /* 2 * generation, odd while a loop is written */
    atomic_bool stop;
    pthread_mutex_t lock;
    pthread_cond_t wake;

    /* Caller-side only: the straggler detector. */
    int64_t window_alone_ns, window_total_ns; /* the caller's estimate alone; the loops' time */
    int64_t window_start_ns, window_start_cpu_ns; /* wall and caller-thread CPU clocks */
    int64_t last_loop_end_ns;
    pthread_t window_caller; /* whose CPU clock window_start_cpu_ns read */
    int solo_loops;
    int64_t solo_end_ns; /* when the solo loops end at the latest */
};

static int64_t clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
static int64_t now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

/* Starts the straggler detector's window at `now`. */
static void start_window(sb_threadpool *tp, int64_t now) {
    tp->window_caller = pthread_self();
    tp->window_alone_ns = tp->window_total_ns = 0;
    tp->window_start_ns = tp->last_loop_end_ns = now;
    tp->window_start_cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID);
}

/* Accounts a parallel loop that ran from t0 to t2, the caller's `ran` of its
 * n_chunks chunks until t1; at the end of a window, decides on solo loops.
 * The window's wall time leaves out the gaps in which the caller ran no loop
 * for a while (the engine idle): it has no core then because it needs none. */
static void account_loop(sb_threadpool *tp, int64_t n_chunks, int64_t ran, int64_t t0, int64_t t1, int64_t t2) {
    if (!pthread_equal(tp->window_caller, pthread_self())) { /* another caller than the window's first */
        start_window(tp, t2);
        return;
    }
    if (t0 - tp->last_loop_end_ns > IDLE_GAP_NS)
        tp->window_start_ns += t0 - tp->last_loop_end_ns;
    tp->last_loop_end_ns = t2;
    tp->window_total_ns += t2 - t0;
    /* A loop the workers took whole says nothing of the caller's rate. */
    tp->window_alone_ns += ran > 0 ? (int64_t)((double)(t1 - t0) * (double)n_chunks / (double)ran) : t2 - t0;
    if (tp->window_total_ns < WINDOW_NS)
        return;
    double share = (double)(clock_ns(CLOCK_THREAD_CPUTIME_ID) - tp->window_start_cpu_ns) /
                   (double)(t2 - tp->window_start_ns);
    if ((double)tp->window_total_ns > (double)tp->window_alone_ns * (share < 1 ? share : 1)) {
        tp->solo_loops = SOLO_LOOPS;
        tp->solo_end_ns = t2 + SOLO_NS;
    }
    start_window(tp, t2);
}

/* First chunk of thread t's range: the ranges split the loop evenly, in order. */
static int64_t range_begin(int64_t n_chunks, int t, int n_threads) { return n_chunks * t / n_threads; }

/* Claims and runs chunks of phase ph of loop `gen` until none is left,
 * down thread ith's range first and then the others'; returns how many it
 * ran, or -1 when the loop has ended (a stale copy: it ran nothing). */
static int64_t run_chunks(sb_threadpool *tp, uint32_t gen, int ph, sb_chunk_fn fn, void *arg, int64_t n_chunks,
                          int ith) {
    const int n_threads = tp->n_threads;
    int64_t ran = 0;
    for (int k = 0; k < n_threads; k++) {
        const int t = (ith + k) % n_threads;
        const int64_t end = range_begin(n_chunks, t + 1, n_threads);
        _Atomic uint64_t *claim = &tp->ranges[t].claim[ph];
        uint64_t cur = atomic_load_explicit(claim, memory_order_acquire);
        for (;;) {
            if ((uint32_t)(cur >> 32) != gen) /* it ran nothing: a loop ends only once every chunk run is counted */
                return -1;
            int64_t chunk = (int64_t)(cur & 0xffffffffu);
            if (chunk >= end)
                break;
            if (!atomic_compare_exchange_weak_explicit(claim, &cur, cur + 1, memory_order_acq_rel,
                                                       memory_order_acquire))
                continue;
            fn(arg, chunk, ith);
            ran++;
            cur = atomic_load_explicit(claim, memory_order_acquire);
        }
    }
    return ran;
}

/* Thread ith's part of loop `gen`: chunks of the first phase, the wait
 * until all of them have finished, then chunks of the main phase. Adds
 * what it ran of each phase to its counter once; returns the main chunks
 * it ran. */
static int64_t run_loop(sb_threadpool *tp, uint32_t gen, const sb_chunk_fn *fn, void *arg, const int64_t *n_chunks,
                        int ith) {
    if (n_chunks[PHASE_FIRST] > 0) {
        int64_t ran = run_chunks(tp, gen, PHASE_FIRST, fn[PHASE_FIRST], arg, n_chunks[PHASE_FIRST], ith);
        if (ran < 0)
            return 0;
        if (ran > 0)
            atomic_fetch_add_explicit(&tp->first_done, (uint64_t)ran, memory_order_release);
        const uint64_t all = (uint64_t)gen << 32 | (uint64_t)n_chunks[PHASE_FIRST];
        for (uint64_t d; (d = atomic_load_explicit(&tp->first_done, memory_order_acquire)) != all; cpu_relax())
            if ((uint32_t)(d >> 32) != gen)
                return 0;
    }
    int64_t ran = run_chunks(tp, gen, PHASE_MAIN, fn[PHASE_MAIN], arg, n_chunks[PHASE_MAIN], ith);
    if (ran > 0)
        atomic_fetch_add_explicit(&tp->done, ran, memory_order_release);
    return ran > 0 ? ran : 0;
}

/* A new, completely written sequence number (even and not `seen`). */
static bool has_news(sb_threadpool *tp, uint32_t seen, uint32_t *seq) {
    *seq = atomic_load_explicit(&tp->seq, memory_order_acquire);
    return *seq != seen && (*seq & 1) == 0;
}

static void *worker_main(void *p) {
    worker *w = p;
    sb_threadpool *tp = w->tp;
    uint32_t seen = 0, seq;
    for (;;) {
        for (int spins = 0; !has_news(tp, seen, &seq) && spins < SPIN_ITERATIONS; spins++)
            cpu_relax();
        if (!has_news(tp, seen, &seq)) {
            pthread_mutex_lock(&tp->lock);
            while (!has_news(tp, seen, &seq))
                pthread_cond_wait(&tp->wake, &tp->lock);
            pthread_mutex_unlock(&tp->lock);
        }
        if (atomic_load_explicit(&tp->stop, memory_order_acquire))
            return NULL;
        sb_chunk_fn fn[N_PHASES];
        int64_t n_chunks[N_PHASES];
        for (int ph = 0; ph < N_PHASES; ph++) {
            fn[ph] = atomic_load_explicit(&tp->fn[ph], memory_order_relaxed);
            n_chunks[ph] = atomic_load_explicit(&tp->n_chunks[ph], memory_order_relaxed);
        }
        void *arg = atomic_load_explicit(&tp->arg, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&tp->seq, memory_order_relaxed) == seq) /* else torn: a later loop is being written */
            run_loop(tp, seq / 2, fn, arg, n_chunks, w->ith);
        seen = seq;
    }
}

sb_status sb_threadpool_create(int n_threads, sb_threadpool **out, sb_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return sb_fail(err, SB_ERR_INVALID_ARG, "thread count %d is not in 1..1024", n_threads);
    /* Both hold cache-line aligned members, beyond what malloc promises. */
    sb_threadpool *tp = sb_aligned_alloc(_Alignof(sb_threadpool), sizeof(*tp));
    range *ranges = sb_aligned_alloc(_Alignof(range), (size_t)n_threads * sizeof(range));
    if (!tp || !ranges) {
        sb_aligned_free(tp);
        sb_aligned_free(ranges);
        return sb_fail(err, SB_ERR_NOMEM, "out of memory");
    }
    memset(tp, 0, sizeof(*tp));
    memset(ranges, 0, (size_t)n_threads * sizeof(range));
    tp->n_threads = 1;
    tp->ranges = ranges;
    pthread_mutex_init(&tp->lock, NULL);
    pthread_cond_init(&tp->wake, NULL);
    if (n_threads > 1) {
        tp->workers = sb_calloc((size_t)n_threads - 1, sizeof(worker));
        if (!tp->workers) {
            sb_threadpool_free(tp);
            return sb_fail(err, SB_ERR_NOMEM, "out of memory");
        }
    }
    for (int i = 1; i < n_threads; i++) {
        worker *w = &tp->workers[i - 1];
        w->tp = tp;
        w->ith = i;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            sb_threadpool_free(tp);
            return sb_fail(err, SB_ERR_NOMEM, "cannot start worker thread %d of %d", i, n_threads);
        }
        tp->n_threads++;
    }
    start_window(tp, now_ns());
    *out = tp;
    return SB_OK;
}

/* Writes a loop (or the stop request) for the workers and wakes them.
 * Returns the loop's generation. */
static uint32_t publish(sb_threadpool *tp, const sb_chunk_fn *fn, void *arg, const int64_t *n_chunks) {
    uint32_t seq = atomic_load_explicit(&tp->seq, memory_order_relaxed);
    atomic_store_explicit(&tp->seq, seq + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    uint32_t gen = (seq + 2) / 2;
    for (int ph = 0; ph < N_PHASES; ph++) {
        atomic_store_explicit(&tp->fn[ph], fn[ph], memory_order_relaxed);
        atomic_store_explicit(&tp->n_chunks[ph], n_chunks[ph], memory_order_relaxed);
        for (int t = 0; t < tp->n_threads; t++)
            atomic_store_explicit(&tp->ranges[t].claim[ph],
                                  (uint64_t)gen << 32 | (uint64_t)range_begin(n_chunks[ph], t, tp->n_threads),
                                  memory_order_relaxed);
    }
    atomic_store_explicit(&tp->arg, arg, memory_order_relaxed);
    atomic_store_explicit(&tp->first_done, (uint64_t)gen << 32, memory_order_relaxed);
    atomic_store_explicit(&tp->done, 0, memory_order_relaxed);
    pthread_mutex_lock(&tp->lock);
    atomic_store_explicit(&tp->seq, seq + 2, memory_order_release);
    pthread_mutex_unlock(&tp->lock);
    /* After the unlock, so that a sleeping worker does not wake only to
     * block on the lock; one that saw no news under the lock is already
     * waiting, and is woken. */
    pthread_cond_broadcast(&tp->wake);
    return gen;
}

void sb_threadpool_free(sb_threadpool *tp) {
    if (!tp)
        return;
    atomic_store(&tp->stop, true);
    publish(tp, (sb_chunk_fn[N_PHASES]){0}, NULL, (int64_t[N_PHASES]){0});
    for (int i = 1; i < tp->n_threads; i++)
        pthread_join(tp->workers[i - 1].thread, NULL);
    pthread_mutex_destroy(&tp->lock);
    pthread_cond_destroy(&tp->wake);
    sb_free(tp->workers);
    sb_aligned_free(tp->ranges);
    sb_aligned_free(tp);
}

int sb_threadpool_n_threads(const sb_threadpool *tp) { return tp ? tp->n_threads : 1; }

/* Publishes a loop, runs the caller's part of it (until *t1) and waits for
 * the rest; returns the main chunks the caller ran. */
static int64_t run_parallel(sb_threadpool *tp, sb_chunk_fn first, int64_t n_first, sb_chunk_fn fn, int64_t n_chunks,
                            void *arg, int64_t *t1) {
    const sb_chunk_fn fns[N_PHASES] = {first, fn};
    const int64_t counts[N_PHASES] = {n_first, n_chunks};
    uint32_t gen = publish(tp, fns, arg, counts);
    int64_t ran = run_loop(tp, gen, fns, arg, counts, 0);
    *t1 = now_ns();
    while (atomic_load_explicit(&tp->done, memory_order_acquire) < n_chunks)
        cpu_relax();
    return ran;
}

void sb_threadpool_for_then(sb_threadpool *tp, int64_t n_first, sb_chunk_fn first, int64_t n_chunks, sb_chunk_fn fn,
                            void *arg) {
    if (n_chunks <= 0 && n_first <= 0)
        return;
    n_first = n_first > 0 ? n_first : 0;
    n_chunks = n_chunks > 0 ? n_chunks : 0;
    if (!tp || tp->n_threads == 1 || n_first + n_chunks == 1 || tp->solo_loops > 0) {
        if (tp && tp->solo_loops > 0) {
            const int64_t now = now_ns();
            if (--tp->solo_loops == 0 || now > tp->solo_end_ns) {
                tp->solo_loops = 0;
                start_window(tp, now);
            }
        }
        for (int64_t c = 0; c < n_first; c++)
            first(arg, c, 0);
        for (int64_t c = 0; c < n_chunks; c++)
            fn(arg, c, 0);
        return;
    }
    int64_t t0 = now_ns(), t1;
    int64_t ran = run_parallel(tp, first, n_first, fn, n_chunks, arg, &t1);
    account_loop(tp, n_chunks, ran, t0, t1, now_ns());
}

void sb_threadpool_for_each_thread(sb_threadpool *tp, sb_chunk_fn fn, void *arg) {
    if (!tp || tp->n_threads == 1) {
        fn(arg, 0, 0);
        return;
    }
    int64_t t1;
    run_parallel(tp, NULL, 0, fn, tp->n_threads, arg, &t1);
}

void sb_threadpool_for(sb_threadpool *tp, int64_t n_chunks, sb_chunk_fn fn, void *arg) {
    sb_threadpool_for_then(tp, 0, NULL, n_chunks, fn, arg);
}

void sb_threadpool_for_light(sb_threadpool *tp, int64_t n_chunks, int64_t elements, sb_chunk_fn fn, void *arg) {
    if (elements > SB_THREADPOOL_LIGHT_ELEMENTS) {
        sb_threadpool_for(tp, n_chunks, fn, arg);
        return;
    }
    for (int64_t c = 0; c < n_chunks; c++)
        fn(arg, c, 0);
}
