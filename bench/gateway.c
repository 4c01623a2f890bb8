/*
 * bench_gateway - what admission costs per request, in process, without
 * HTTP: sb_gw_authenticate (header parsing, HMAC-SHA-256 of the key, the
 * in-memory lookup, the tier) + sb_gw_admit (allowed models, the tier's
 * count, the three token buckets) + sb_gw_settle, on a state directory
 * holding --keys keys, each iteration with a key drawn from them, limits
 * high enough that nothing is refused. Prints the median over --rounds of
 * the mean per request in microseconds, for one thread and for --threads
 * threads at once (contention on the buckets' mutex and the keys' lock).
 * With --redis URL the buckets are in Redis: one script per admission and
 * per settlement, which is then the cost.
 *
 *   bench_gateway [--keys 1000] [--iters 200000] [--rounds 5] [--threads 2] [--redis redis://127.0.0.1:6379]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "gateway/clock.h"
#include "gateway/gateway.h"
#include "gateway/keys.h"

typedef struct {
    sb_gw *gw;
    char (*headers)[SB_GW_KEY_LEN + 16];
    int n_keys;
    long iters;
    unsigned seed;
    double us;
} job;

static void *run(void *arg) {
    job *j = arg;
    int64_t t0 = sb_gw_now_us();
    for (long i = 0; i < j->iters; i++) {
        j->seed = j->seed * 1103515245u + 12345u;
        sb_gw_request req = {0};
        if (!sb_gw_authenticate(j->gw, SB_GW_ROUTE_MODEL, j->headers[(j->seed >> 8) % (unsigned)j->n_keys], NULL,
                                &req) ||
            !sb_gw_admit(j->gw, &req, "stories260K", 100)) {
            fprintf(stderr, "bench_gateway: refused (%u): %s\n", req.verdict.status, req.verdict.message);
            exit(1);
        }
        sb_gw_settle(j->gw, &req.caller, 60);
    }
    j->us = (double)(sb_gw_now_us() - t0) / (double)j->iters;
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median over rounds of the mean per request across `threads` threads. */
static double measure(sb_gw *gw, char (*headers)[SB_GW_KEY_LEN + 16], int n_keys, long iters, int rounds,
                      int threads) {
    double *r = calloc((size_t)rounds, sizeof *r);
    for (int k = 0; k < rounds; k++) {
        pthread_t th[64];
        job jobs[64];
        for (int t = 0; t < threads; t++) {
            jobs[t] = (job){gw, headers, n_keys, iters / threads, 17u + (unsigned)t * 7919u + (unsigned)k, 0};
            pthread_create(&th[t], NULL, run, &jobs[t]);
        }
        double sum = 0;
        for (int t = 0; t < threads; t++) {
            pthread_join(th[t], NULL);
            sum += jobs[t].us;
        }
        r[k] = sum / threads;
    }
    qsort(r, (size_t)rounds, sizeof *r, cmp);
    double med = r[rounds / 2];
    free(r);
    return med;
}

int main(int argc, char **argv) {
    int n_keys = 1000, rounds = 5, threads = 2;
    long iters = 200000;
    const char *redis = NULL;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--keys") == 0)
            n_keys = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--iters") == 0)
            iters = atol(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--rounds") == 0)
            rounds = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--threads") == 0)
            threads = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--redis") == 0)
            redis = argv[++i];
        else {
            fprintf(stderr, "usage: bench_gateway [--keys N] [--iters N] [--rounds N] [--threads N] [--redis URL]\n");
            return 2;
        }
    }
    if (n_keys < 1 || iters < 1 || rounds < 1 || threads < 1 || threads > 64) {
        fprintf(stderr, "bench_gateway: --keys, --iters, --rounds >= 1; --threads 1..64\n");
        return 2;
    }
    char dir[] = "/tmp/sb-bench-gateway-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    sb_gw_keys *ks;
    sb_error err;
    if (sb_gw_keys_open(dir, false, NULL, NULL, &ks, &err) != SB_OK) {
        fprintf(stderr, "bench_gateway: %s\n", err.msg);
        return 1;
    }
    char(*headers)[SB_GW_KEY_LEN + 16] = calloc((size_t)n_keys, sizeof *headers);
    for (int i = 0; i < n_keys; i++) {
        sb_gw_key k = {.rps = 100000000, .rpm = 100000000, .tpm = 100000000};
        snprintf(k.name, sizeof k.name, "key%d", i);
        snprintf(k.tier, sizeof k.tier, i % 2 ? "paid" : "free");
        snprintf(k.models, sizeof k.models, "stories260K,other");
        char raw[SB_GW_KEY_LEN + 1];
        if (sb_gw_keys_create(ks, &k, raw, sizeof raw, &err) != SB_OK) {
            fprintf(stderr, "bench_gateway: %s\n", err.msg);
            return 1;
        }
        snprintf(headers[i], sizeof headers[i], "Bearer %s", raw);
    }
    sb_gw_keys_close(ks);
    sb_gw_params p = {.state_dir = dir, .auth = SB_GW_AUTH_REQUIRED, .redis_url = redis};
    sb_gw *gw;
    if (sb_gw_create(&p, &gw, &err) != SB_OK) {
        fprintf(stderr, "bench_gateway: %s\n", err.msg);
        return 1;
    }
    measure(gw, headers, n_keys, iters / 10 + 1, 1, 1); /* warm-up */
    double one = measure(gw, headers, n_keys, iters, rounds, 1);
    double many = measure(gw, headers, n_keys, iters, rounds, threads);
    printf("admission (authenticate + admit + settle), %d keys, buckets %s: %.2f us per request on 1 thread, "
           "%.2f us per request on each of %d threads at once\n",
           n_keys, redis ? redis : "local", one, many, threads);
    sb_gw_free(gw);
    free(headers);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}
