/*
 * threadpool.h - a persistent pool of worker threads for data-parallel
 * loops: matrix products, attention, activation quantization.
 *
 * Work is a loop of n chunks, split into one range of adjacent chunks per
 * thread; a thread claims chunks one at a time down its own range, in
 * order, then down the others' ranges, so a thread that the OS deschedules
 * (a busy neighbour on a shared machine) delays the loop by at most the
 * chunk it holds, not by a fixed share of the work. The loop is finished when every chunk is done,
 * not when every thread has checked in: a worker that wakes up late finds
 * nothing left and goes back to waiting. Idle workers spin briefly (the next
 * loop of a forward pass follows within microseconds) and then sleep.
 *
 * One thread at a time may call sb_threadpool_for on a pool (the pool of an
 * inference context belongs to that context).
 */
#ifndef SB_THREADPOOL_H
#define SB_THREADPOOL_H

#include <stdint.h>

#include "switchboard.h"

typedef struct sb_threadpool sb_threadpool;

/* A loop body: runs chunk `chunk` of the loop on thread `ith` (0 = the
 * caller; < n_threads), which may use per-thread scratch indexed by ith. */
typedef void (*sb_chunk_fn)(void *arg, int64_t chunk, int ith);

/* n_threads counts the caller: 1 starts no workers. */
sb_status sb_threadpool_create(int n_threads, sb_threadpool **out, sb_error *err);
void sb_threadpool_free(sb_threadpool *tp);
int sb_threadpool_n_threads(const sb_threadpool *tp); /* 1 for NULL */

/* Runs fn(arg, c, ith) for every c in [0, n_chunks) across the pool, the
 * caller included, and returns when all have finished. tp may be NULL
 * (everything runs on the caller). */
void sb_threadpool_for(sb_threadpool *tp, int64_t n_chunks, sb_chunk_fn fn, void *arg);

/* As sb_threadpool_for, with a first loop that must finish before the
 * main one starts: first(arg, c, ith) for every c in [0, n_first), then,
 * once all of those have finished, fn(arg, c, ith) for every c in
 * [0, n_chunks). One hand-off to the workers for both, so that a short
 * preparation (converting a batch's activations before a product) is
 * shared by the threads instead of run by the caller while they wait. */
void sb_threadpool_for_then(sb_threadpool *tp, int64_t n_first, sb_chunk_fn first, int64_t n_chunks, sb_chunk_fn fn,
                            void *arg);

/* Runs fn(arg, c, ith) for every c in [0, n_threads): one long task per
 * thread, each thread's own first (c = ith; a thread that ends early takes
 * a task no other has started). Unless the pool has one thread, never run
 * on the caller alone, and not counted by the straggler detector: the tasks' lengths differ by design
 * (the executor's engines, stepped side by side). */
void sb_threadpool_for_each_thread(sb_threadpool *tp, sb_chunk_fn fn, void *arg);

/* As sb_threadpool_for, for a loop of light per-element work over
 * `elements` floats in all (a norm that no product follows): at most
 * SB_THREADPOOL_LIGHT_ELEMENTS of them run on the caller alone. Handing a
 * loop to the workers and waiting for them costs microseconds (cache lines
 * crossing cores), more than such a loop's work: 8 rows of a 768-wide
 * model's norms and activation conversions on the caller made batched
 * steps 2-5% faster (110M, 2 threads), until they moved into the products'
 * own loops (sb_threadpool_for_then). */
#define SB_THREADPOOL_LIGHT_ELEMENTS 8192
void sb_threadpool_for_light(sb_threadpool *tp, int64_t n_chunks, int64_t elements, sb_chunk_fn fn, void *arg);

#endif
