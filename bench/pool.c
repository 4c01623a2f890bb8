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
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

typedef enum { LOOP_EMPTY, LOOP_TWO_PHASE, LOOP_EXCHANGE } loop_kind;

/* Microseconds per loop of `kind` (x: the exchange's buffer), the median of
 * PASSES passes. */
static double per_loop_us(sb_threadpool *tp, loop_kind kind, exchange *x) {
    double us[PASSES];
    for (int p = 0; p < PASSES; p++) {
        const double t0 = now_s();
        for (int i = 0; i < LOOPS; i++) {
            if (kind == LOOP_EMPTY) {
                sb_threadpool_for(tp, ROW_CHUNKS, nothing, NULL);
            } else if (kind == LOOP_TWO_PHASE) {
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

/* s as a whole decimal number in [lo, hi] into *out; false if it is not one. */
static bool parse_count(const char *s, long lo, long hi, long *out) {
    char *end;
    const long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

int main(int argc, char **argv) {
    long threads = 2;
    if (argc > 1 && !parse_count(argv[1], 1, 64, &threads)) {
        fprintf(stderr, "bench_pool: threads must be a number from 1 to 64, not '%s'\n", argv[1]);
        return 2;
    }
    sb_threadpool *tp;
    sb_error err;
    if (sb_threadpool_create((int)threads, &tp, &err) != SB_OK) {
        fprintf(stderr, "bench_pool: %s\n", err.msg);
        return 1;
    }
    printf("threads %ld, microseconds per loop (medians of %d passes of %d loops)\n", threads, PASSES, LOOPS);
    printf("empty %.2f, two-phase %.2f\n", per_loop_us(tp, LOOP_EMPTY, NULL), per_loop_us(tp, LOOP_TWO_PHASE, NULL));
    static const char *defaults[] = {"768", "2048"};
    const int n_sizes = argc > 2 ? argc - 2 : 2;
    int rc = 0;
    for (int s = 0; s < n_sizes; s++) {
        const char *arg = argc > 2 ? argv[2 + s] : defaults[s];
        long n;
        if (!parse_count(arg, ROW_CHUNKS, 1L << 24, &n)) {
            fprintf(stderr, "bench_pool: floats per token must be a number from %d to %ld, not '%s'\n", ROW_CHUNKS,
                    1L << 24, arg);
            rc = 2;
            continue;
        }
        exchange x = {.n = n};
        if (!(x.buf = calloc((size_t)TOKENS * (size_t)n, sizeof(uint32_t)))) {
            fprintf(stderr, "bench_pool: out of memory for %d rows of %ld floats\n", TOKENS, n);
            rc = 1;
            continue;
        }
        printf("exchange of %d tokens x %ld floats (%.0f KB) %.2f\n", TOKENS, n,
               (double)TOKENS * (double)n * sizeof(uint32_t) / 1024, per_loop_us(tp, LOOP_EXCHANGE, &x));
        free(x.buf);
    }
    sb_threadpool_free(tp);
    return rc;
}
