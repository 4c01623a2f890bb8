/*
 * engine.c - the scheduler's throughput without the HTTP server: N requests
 * submitted at once to one engine, aggregate generated tokens per second.
 *
 *   bench_engine -m MODEL [-t THREADS] [-s 1,4,8,16] [-n TOKENS] [-r REPS] [--temp T]
 *
 * For every stream count S: S requests (prompts of 4..15 pseudo-random ids
 * after BOS, so the prompts differ as the server benchmark's do), each
 * generating exactly TOKENS tokens (ignore_eos), all submitted together.
 * t/s = S * TOKENS / (time from submission to the last completion); the
 * prompts are short, so this is the decode rate. Sampling is the server's
 * default for OpenAI requests: temperature T (0.8), no top-k, top-p or
 * min-p, a seed per request. Prints the median of REPS
 * runs per S and its ratio to the S = 1 median. bench/serve-load.mjs
 * measures the same through HTTP; the gap between the two is the server's
 * cost.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"

#define MAX_STREAMS 64
#define MAX_REPS 32

typedef struct waiter {
    pthread_mutex_t lock;
    pthread_cond_t done;
    int remaining;
} waiter;

static void on_event(void *user, const sb_gen_event *ev) {
    waiter *w = user;
    if (ev->kind != SB_GEN_DONE)
        return;
    pthread_mutex_lock(&w->lock);
    if (--w->remaining == 0)
        pthread_cond_signal(&w->done);
    pthread_mutex_unlock(&w->lock);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One run of S concurrent requests; returns aggregate generated t/s, or < 0. */
static double run_streams(sb_engine *e, const sb_model_t *m, int streams, int tokens, float temp, int rep) {
    waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, streams};
    int32_t prompts[MAX_STREAMS][16];
    const int32_t n_vocab = sb_model_n_vocab(m), bos = sb_model_token_bos(m);
    uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)rep;
    double t0 = now_s();
    for (int i = 0; i < streams; i++) {
        sb_gen_params p = {0};
        int32_t n = 5 + i % 11;
        prompts[i][0] = bos >= 0 ? bos : 1;
        for (int32_t k = 1; k < n; k++) {
            x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
            prompts[i][k] = (int32_t)((x * 0x2545f4914f6cdd1dull >> 33) % (uint64_t)(n_vocab - 3)) + 3;
        }
        p.prompt = prompts[i];
        p.n_prompt = n;
        p.max_tokens = tokens;
        p.ignore_eos = true;
        p.sampling = sb_sampler_default_params();
        p.sampling.temperature = temp;
        p.sampling.top_k = 0;
        p.sampling.top_p = 1.0f;
        p.sampling.min_p = 0.0f;
        p.sampling.seed = (uint64_t)(i + 1);
        sb_error err = {0};
        if (sb_engine_submit(e, &p, on_event, &w, NULL, &err) != SB_OK) {
            fprintf(stderr, "bench_engine: submit: %s\n", err.msg);
            return -1;
        }
    }
    pthread_mutex_lock(&w.lock);
    while (w.remaining > 0)
        pthread_cond_wait(&w.done, &w.lock);
    pthread_mutex_unlock(&w.lock);
    return streams * (double)tokens / (now_s() - t0);
}

static bool parse_int(const char *s, long min, long max, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || (*end && *end != ',') || v < min || v > max)
        return false;
    *out = (int)v;
    return true;
}

int main(int argc, char **argv) {
    const char *path = NULL, *list = "1,4,8,16";
    int threads = 2, tokens = 64, reps = 3;
    float temp = 0.8f;
    sb_cache_type cache_type = sb_engine_default_params().cache_type; /* the server's */
    for (int i = 1; i < argc; i += 2) { /* every option takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = v != NULL;
        if (ok && strcmp(a, "-m") == 0)
            path = v;
        else if (ok && strcmp(a, "-t") == 0)
            ok = parse_int(v, 1, 256, &threads);
        else if (ok && strcmp(a, "-s") == 0)
            list = v;
        else if (ok && strcmp(a, "-n") == 0)
            ok = parse_int(v, 1, 100000, &tokens);
        else if (ok && strcmp(a, "-r") == 0)
            ok = parse_int(v, 1, MAX_REPS, &reps);
        else if (ok && strcmp(a, "--temp") == 0)
            temp = strtof(v, NULL);
        else if (ok && strcmp(a, "--cache-type") == 0)
            ok = sb_cache_type_parse(v, &cache_type);
        else
            ok = false;
        if (!ok) {
            fputs("usage: bench_engine -m MODEL [-t THREADS] [-s 1,4,8,16] [-n TOKENS] [-r REPS] [--temp T]\n"
                  "                    [--cache-type f32|f16|q8_0]\n",
                  stderr);
            return 2;
        }
    }
    if (!path) {
        fputs("bench_engine: -m MODEL is required\n", stderr);
        return 2;
    }
    sb_error err = {0};
    sb_model_t *m = NULL;
    if (sb_model_load(path, &m, &err) != SB_OK) {
        fprintf(stderr, "bench_engine: %s\n", err.msg);
        return 1;
    }
    sb_engine_params ep = sb_engine_default_params();
    ep.n_threads = threads;
    ep.n_parallel = MAX_STREAMS;
    ep.cache_type = cache_type;
    sb_engine *e = NULL;
    if (sb_engine_create(m, &ep, &e, &err) != SB_OK) {
        fprintf(stderr, "bench_engine: %s\n", err.msg);
        sb_model_free(m);
        return 1;
    }
    printf("| streams | t/s median | min | max | x single |\n|--:|--:|--:|--:|--:|\n");
    double single = 0;
    int status = 0;
    for (const char *s = list; s && *s; s = strchr(s, ',') ? strchr(s, ',') + 1 : NULL) {
        int streams;
        if (!parse_int(s, 1, MAX_STREAMS, &streams)) {
            fprintf(stderr, "bench_engine: bad stream count in -s %s (1..%d)\n", list, MAX_STREAMS);
            status = 2;
            break;
        }
        double r[MAX_REPS];
        run_streams(e, m, streams, tokens, temp, -1); /* warm-up */
        for (int k = 0; k < reps; k++)
            r[k] = run_streams(e, m, streams, tokens, temp, k);
        qsort(r, (size_t)reps, sizeof(double), cmp_double);
        if (r[0] < 0) {
            status = 1;
            break;
        }
        double med = r[reps / 2];
        if (streams == 1)
            single = med;
        printf("| %d | %.1f | %.1f | %.1f | %.2f |\n", streams, med, r[0], r[reps - 1], single > 0 ? med / single : 0);
        fflush(stdout);
    }
    sb_engine_free(e);
    sb_model_free(m);
    return status;
}
