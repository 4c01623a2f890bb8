/*
 * executor.h - the process's compute: one thread pool and one scheduler
 * thread that steps every registered engine, so that several loaded models
 * share the cores without oversubscribing them.
 *
 * An engine (engine.h) owns a model's KV pool, forward scratch and
 * sequences, and no threads: sb_engine_create registers it with an
 * executor, whose thread runs one engine step (one batched forward pass and
 * its sampling) at a time, on the executor's pool. The pool counts the
 * executor thread itself, so n_threads is every compute thread there is,
 * however many engines are loaded.
 *
 * Between engines, each iteration steps one engine that has work: the one
 * whose most urgent sequence (waiting or running) has the highest
 * sb_gen_params.priority; among equals the one stepped least recently, so
 * busy models alternate step by step (or turn by turn: steps_per_turn). An
 * engine with only lower-priority work waits while a higher one has any (the
 * gateway's tiers map to priorities: paid > free > batch). Within an engine,
 * priorities order admission and preemption (engine.c). With no work
 * anywhere the thread sleeps; a submit or cancel on any engine wakes it.
 *
 * Lanes: when at least as many engines have work at the highest priority as
 * the pool has threads, each thread steps one of them on its own (the least
 * recently stepped), side by side, with no hand-offs between threads inside
 * a step, until one runs out of work at that priority or new work arrives
 * anywhere (then the executor plans again; with more such engines than
 * threads, after steps_per_turn steps). Alternating, two small models each
 * read their weights after the other's have pushed them out of the caches,
 * and every step pays the pool's hand-offs between threads; side by side,
 * their aggregate t/s over one model's alone (2 threads, bench_engine, two
 * 110M Q4_0 models) went from 0.82 to 1.12-1.18 at one stream each and
 * from 0.97-1.00 to 1.21-1.23 at 8; two 1.1B: 0.98 -> 1.11 and 0.97 -> 1.10.
 * The lanes run on the pool's own threads: still n_threads compute threads
 * in all. (An engine stepped on the pool may split its own decoding step
 * into lanes, one share of its sequences per thread: engine.c.)
 *
 * Threads: create/free from any one thread; sb_executor_free only after
 * every engine on it has been freed.
 */
#ifndef SB_EXECUTOR_H
#define SB_EXECUTOR_H

#include <stdbool.h>
#include <stdint.h>

#include "switchboard.h"
#include "tensor/threadpool.h"

typedef struct sb_executor sb_executor;
typedef struct sb_engine sb_engine;

typedef struct sb_executor_params {
    int32_t n_threads;      /* compute threads in all, the scheduler's included; 0 = online cores */
    int32_t steps_per_turn; /* steps an engine runs in a row while others of its priority wait; 0 = 1.
                               Each switch reads the next model's weights from farther away (two 110M
                               Q4_0 models, 2 threads: +2.6 ms CPU per 4-token request when requests
                               alternate), so a longer turn trades each model's token cadence for
                               throughput (1 stream each: 0.67 of one model's t/s with 1, 0.73-0.78 with
                               8, on a loaded host: docs/PERFORMANCE.md) */
} sb_executor_params;
sb_executor_params sb_executor_default_params(void);

sb_status sb_executor_create(const sb_executor_params *p, sb_executor **out, sb_error *err);
/* Stops the thread and the pool. Every engine must have been freed before. */
void sb_executor_free(sb_executor *x);
int32_t sb_executor_n_threads(const sb_executor *x);

/* ---- between the executor and its engines (engine.c only) ---------------- */

/* The pool every engine's forward pass and sampling run on (except in
 * lanes); only the executor thread calls into it. */
sb_threadpool *sb__executor_pool(sb_executor *x);
/* Registers an engine: from now on the executor thread may step it. */
sb_status sb__executor_add(sb_executor *x, sb_engine *e, sb_error *err);
/* Deregisters it, waiting for a step of it in progress to end; afterwards
 * the executor never touches it. Not from the executor thread itself (an
 * engine callback) for the engine it is stepping. */
void sb__executor_remove(sb_executor *x, sb_engine *e);
/* Work arrived for an engine (a submit, a cancel): wakes the thread. Call
 * after the work is visible to sb__engine_take_incoming. */
void sb__executor_kick(sb_executor *x);

/* What the executor asks of an engine, on the executor thread (engine.c). */
void sb__engine_take_incoming(sb_engine *e); /* moves submitted requests and cancellations in */
/* Whether the engine has work; if so *priority is its most urgent sequence's. */
bool sb__engine_has_work(const sb_engine *e, int32_t *priority);
/* One scheduling step on pool (NULL: on the calling thread alone, a lane). */
void sb__engine_step(sb_engine *e, sb_threadpool *pool);

#endif
