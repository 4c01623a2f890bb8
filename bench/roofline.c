/*
 * roofline.c - this machine's ceilings for inference: memory read
 * bandwidth (decode streams every weight once per token), FP32 FMA
 * throughput and int8 VNNI throughput (prompts and batches are arithmetic:
 * the quantized formats' products are vpdpbusd). Prints them for 1..N
 * threads; docs/PERFORMANCE.md derives each benchmark file's bound from them.
 *
 *   bench/roofline [threads]     (build: part of the CMake build, bench_roofline)
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BUF_BYTES (1ull << 30)  /* beyond the caches (this machine's L3 is large: read it from /sys) */
#define HOT_BYTES (64ull << 20) /* a small model's weights: may stay in a large L3 */
#define REPS 5

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct job {
    const __m256i *p;
    size_t n;      /* 32-byte vectors */
    int passes;    /* over the same n vectors */
    uint64_t sink;
    pthread_barrier_t *start;
} job;

__attribute__((target("avx2"))) static void *read_stream(void *arg) {
    job *j = arg;
    pthread_barrier_wait(j->start);
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (int pass = 0; pass < j->passes; pass++)
    for (size_t i = 0; i + 4 <= j->n; i += 4) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256(j->p + i));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256(j->p + i + 1));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256(j->p + i + 2));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256(j->p + i + 3));
    }
    __m256i a = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    j->sink = (uint64_t)_mm256_extract_epi64(a, 0);
    return NULL;
}

/* Independent FMA chains (enough to cover the latency) on 512-bit vectors. */
__attribute__((target("avx512f"))) static void *fma_loop(void *arg) {
    job *j = arg;
    pthread_barrier_wait(j->start);
    __m512 acc[16];
    for (int k = 0; k < 16; k++)
        acc[k] = _mm512_set1_ps((float)k);
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (size_t i = 0; i < j->n; i++)
        for (int k = 0; k < 16; k++)
            acc[k] = _mm512_fmadd_ps(acc[k], m, c);
    float out[16];
    __m512 s = acc[0];
    for (int k = 1; k < 16; k++)
        s = _mm512_add_ps(s, acc[k]);
    _mm512_storeu_ps(out, s);
    j->sink = (uint64_t)out[0];
    return NULL;
}

/* Independent vpdpbusd chains on 512-bit vectors: 64 int8 multiply-adds
 * each, the quantized kernels' inner operation. */
__attribute__((target("avx512f,avx512vnni"))) static void *vnni_loop(void *arg) {
    job *j = arg;
    pthread_barrier_wait(j->start);
    __m512i acc[16];
    for (int k = 0; k < 16; k++)
        acc[k] = _mm512_set1_epi32(k);
    const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-5);
    for (size_t i = 0; i < j->n; i++)
        for (int k = 0; k < 16; k++)
            acc[k] = _mm512_dpbusd_epi32(acc[k], a, b);
    __m512i s = acc[0];
    for (int k = 1; k < 16; k++)
        s = _mm512_add_epi32(s, acc[k]);
    j->sink = (uint64_t)_mm512_reduce_add_epi32(s);
    return NULL;
}

static double run(int n_threads, void *(*fn)(void *), const __m256i *buf, size_t n_per_thread, int passes) {
    pthread_t t[64];
    job jobs[64];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)n_threads + 1);
    for (int i = 0; i < n_threads; i++) {
        jobs[i] = (job){.p = buf ? buf + (size_t)i * n_per_thread : NULL, .n = n_per_thread, .passes = passes,
                        .start = &start};
        pthread_create(&t[i], NULL, fn, &jobs[i]);
    }
    pthread_barrier_wait(&start);
    double t0 = now_s();
    for (int i = 0; i < n_threads; i++)
        pthread_join(t[i], NULL);
    double dt = now_s() - t0;
    pthread_barrier_destroy(&start);
    return dt;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int max_threads = argc > 1 ? atoi(argv[1]) : 2;
    if (max_threads < 1 || max_threads > 64)
        max_threads = 2;
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("avx512f")) {
        fprintf(stderr, "roofline: needs AVX2 and AVX-512F\n");
        return 1;
    }
    __m256i *buf = aligned_alloc(64, BUF_BYTES);
    if (!buf)
        return 1;
    memset(buf, 1, BUF_BYTES);
    const bool vnni = __builtin_cpu_supports("avx512vnni");
    printf("medians of %d runs\nthreads  read GB/s (1 GiB)  read GB/s (64 MiB, repeated)  FP32 FMA GFLOP/s  "
           "int8 VNNI GOP/s\n",
           REPS);
    for (int nt = 1; nt <= max_threads; nt++) {
        double bw[REPS], hot[REPS], fl[REPS], iop[REPS];
        size_t per = BUF_BYTES / 32 / (size_t)nt, hot_per = HOT_BYTES / 32 / (size_t)nt;
        size_t iters = 20000000;
        run(nt, read_stream, buf, hot_per, 1); /* warm the small buffer */
        for (int r = 0; r < REPS; r++) {
            bw[r] = (double)per * 32 * nt / run(nt, read_stream, buf, per, 1) / 1e9;
            hot[r] = (double)hot_per * 32 * nt * 16 / run(nt, read_stream, buf, hot_per, 16) / 1e9;
            fl[r] = (double)iters * 16 * 16 * 2 * nt / run(nt, fma_loop, NULL, iters, 1) / 1e9;
            iop[r] = vnni ? (double)iters * 16 * 64 * 2 * nt / run(nt, vnni_loop, NULL, iters, 1) / 1e9 : 0;
        }
        qsort(bw, REPS, sizeof(double), cmp_double);
        qsort(hot, REPS, sizeof(double), cmp_double);
        qsort(fl, REPS, sizeof(double), cmp_double);
        qsort(iop, REPS, sizeof(double), cmp_double);
        printf("%7d  %16.1f  %28.1f  %16.1f  ", nt, bw[REPS / 2], hot[REPS / 2], fl[REPS / 2]);
        if (vnni)
            printf("%15.1f\n", iop[REPS / 2]);
        else
            printf("%15s\n", "-");
    }
    free(buf);
    return 0;
}
