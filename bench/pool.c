/*
 * pool.c - what a hand-off between the pool's threads costs on this machine,
 * the price of splitting a batch's products by rows (every product ends
 * with each thread reading rows the others wrote) against running lanes
 * (engine.c). Not a test: it prints numbers for docs/PERFORMANCE.md.
 *
 *   bench_pool [threads [floats per token ...]]   defaults: 2 threads, 768 2048
 *
 * Per loop, medians of 5 passes of 20000 loops each:
 *   empty     sb_threadpool_for of 4 chunks that do nothing (the fork and join);
 *   two-phase sb_threadpool_for_then of 8 and 4 empty chunks (a product's loop:
 *             the activations' conversion, then the rows);
 *   exchange  the same loop doing a product's memory traffic without its
 *             arithmetic: the first phase's chunk t reads token t's row of the
 *             buffer (8 tokens of n 4-byte values, a product's floats), the main phase's 4 chunks each
 *             write their quarter of every token's row, which the next loop
 *             reads. With one thread nothing moves between cores; with more,
 *             about half of each row was written by another core.
 * Run it with 1 and with 2 threads: the difference, beside half the
 * one-thread time, is what the hand-offs add.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tensor/threadpool.h"

#define TOKENS 8
#define ROW_CHUNKS 4
#define LOOPS 20000
#define PASSES 5

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Rows of 4-byte words (floats in the engine; integers here, so that
 * reading and writing them is vector loads and stores, not a chain of
 * float additions). */
typedef struct exchange {
    uint32_t *buf; /* TOKENS rows of n words */
    int64_t n;
    uint32_t seen[TOKENS]; /* what the readers found, so that the reads are kept */
    uint32_t stamp;        /* the loop's number, written into every row */
} exchange;

static void nothing(void *arg, int64_t i, int ith) {
    (void)arg;
    (void)i;
    (void)ith;
}

static void read_row(void *arg, int64_t t, int ith) {
    (void)ith;
    exchange *x = arg;
    const uint32_t *row = x->buf + t * x->n;
    uint32_t s = 0;
    for (int64_t i = 0; i < x->n; i++)
        s ^= row[i];
    x->seen[t] = s;
}

static void write_rows(void *arg, int64_t c, int ith) {
    (void)ith;
    exchange *x = arg;
    const int64_t r0 = x->n * c / ROW_CHUNKS, r1 = x->n * (c + 1) / ROW_CHUNKS;
    for (int t = 0; t < TOKENS; t++)
        for (int64_t r = r0; r < r1; r++)
            x->buf[t * x->n + r] = x->stamp + (uint32_t)r;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Microseconds per loop of `kind` (0 empty, 1 two-phase, 2 exchange), the
 * median of PASSES passes. */
static double per_loop_us(sb_threadpool *tp, int kind, exchange *x) {
    double us[PASSES];
    for (int p = 0; p < PASSES; p++) {
        const double t0 = now_s();
        for (int i = 0; i < LOOPS; i++) {
            if (kind == 0) {
                sb_threadpool_for(tp, ROW_CHUNKS, nothing, NULL);
            } else if (kind == 1) {
                sb_threadpool_for_then(tp, TOKENS, nothing, ROW_CHUNKS, nothing, NULL);
            } else {
                x->stamp = (uint32_t)i;
                sb_threadpool_for_then(tp, TOKENS, read_row, ROW_CHUNKS, write_rows, x);
            }
        }
        us[p] = (now_s() - t0) / LOOPS * 1e6;
    }
    qsort(us, PASSES, sizeof(us[0]), cmp_double);
    return us[PASSES / 2];
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2;
    if (threads < 1 || threads > 64) {
        fprintf(stderr, "bench_pool: threads must be 1-64, not '%s'\n", argv[1]);
        return 2;
    }
    sb_threadpool *tp;
    sb_error err;
    if (sb_threadpool_create(threads, &tp, &err) != SB_OK) {
        fprintf(stderr, "bench_pool: %s\n", err.msg);
        return 1;
    }
    printf("threads %d, microseconds per loop (medians of %d passes of %d loops)\n", threads, PASSES, LOOPS);
    printf("empty %.2f, two-phase %.2f\n", per_loop_us(tp, 0, NULL), per_loop_us(tp, 1, NULL));
    static const char *defaults[] = {"768", "2048"};
    const int n_sizes = argc > 2 ? argc - 2 : 2;
    int rc = 0;
    for (int s = 0; s < n_sizes; s++) {
        const char *arg = argc > 2 ? argv[2 + s] : defaults[s];
        const long n = strtol(arg, NULL, 10);
        exchange x = {.n = n};
        if (n < ROW_CHUNKS || n > (1L << 24) || !(x.buf = calloc((size_t)TOKENS * (size_t)n, sizeof(uint32_t)))) {
            fprintf(stderr, "bench_pool: floats per token must be %d to 2^24 (and fit in memory), not '%s'\n",
                    ROW_CHUNKS, arg);
            rc = 2;
            continue;
        }
        printf("exchange of %d tokens x %ld floats (%.0f KB) %.2f\n", TOKENS, n,
               (double)TOKENS * (double)n * sizeof(uint32_t) / 1024, per_loop_us(tp, 2, &x));
        free(x.buf);
    }
    sb_threadpool_free(tp);
    return rc;
}
