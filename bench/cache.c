/*
 * bench/cache.c - the response cache's in-process hit path, in microseconds
 * per operation over many iterations: hashing a canonical request of a
 * typical size into a key (SHA-256), a memory-cache hit (lookup, LRU touch,
 * copy of the value out), a miss, and a store (with eviction once the
 * bound is full). With --redis URL the same get against a Redis (a
 * round trip on loopback).
 *
 *   build/bench_cache [-n ITERATIONS (200000)] [-e ENTRIES (10000)] [-v VALUE_BYTES (2048)]
 *                     [-k KEY_INPUT_BYTES (1024)] [--redis redis://127.0.0.1:6379]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "gateway/cache.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static sb_gw_cache_key key_of(uint64_t i, const uint8_t *input, size_t len) {
    sb_gw_hasher h;
    sb_gw_hasher_init(&h);
    sb_gw_hasher_update(&h, &i, sizeof i);
    sb_gw_hasher_update(&h, input, len);
    sb_gw_cache_key k;
    if (!sb_gw_hasher_final(&h, &k)) {
        fprintf(stderr, "bench_cache: SHA-256 failed\n");
        exit(1);
    }
    return k;
}

/* Gets n keys spread over `entries`; returns microseconds per get and the hits. */
static double time_gets(sb_gw_cache *c, const sb_gw_cache_key *keys, long entries, long n, long offset, long *hits) {
    *hits = 0;
    double t0 = now_s();
    for (long i = 0; i < n; i++) {
        void *v;
        size_t len;
        if (sb_gw_cache_get(c, &keys[(i * 7919 + offset) % entries], &v, &len)) {
            (*hits)++;
            sb_free(v);
        }
    }
    return (now_s() - t0) * 1e6 / (double)n;
}

int main(int argc, char **argv) {
    long n = 200000, entries = 10000, vbytes = 2048, kbytes = 1024;
    const char *redis = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "bench_cache: %s needs a value\n", a);
            return 2;
        }
        if (strcmp(a, "-n") == 0)
            n = atol(v);
        else if (strcmp(a, "-e") == 0)
            entries = atol(v);
        else if (strcmp(a, "-v") == 0)
            vbytes = atol(v);
        else if (strcmp(a, "-k") == 0)
            kbytes = atol(v);
        else if (strcmp(a, "--redis") == 0)
            redis = v;
        else {
            fprintf(stderr, "bench_cache: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (n <= 0 || entries <= 0 || vbytes <= 0 || kbytes <= 0) {
        fprintf(stderr, "bench_cache: every count must be positive\n");
        return 2;
    }
    uint8_t *input = malloc((size_t)kbytes), *value = malloc((size_t)vbytes);
    sb_gw_cache_key *keys = malloc((size_t)entries * sizeof *keys);
    if (!input || !value || !keys)
        return 1;
    for (long i = 0; i < kbytes; i++)
        input[i] = (uint8_t)(i * 31 + 7);
    memset(value, 'x', (size_t)vbytes);

    double t0 = now_s();
    for (long i = 0; i < n; i++)
        keys[i % entries] = key_of((uint64_t)i, input, (size_t)kbytes);
    double hash_us = (now_s() - t0) * 1e6 / (double)n;
    for (long i = 0; i < entries; i++)
        keys[i] = key_of((uint64_t)i, input, (size_t)kbytes);

    sb_gw_cache_params p = sb_gw_cache_default_params();
    p.max_bytes = (size_t)entries * ((size_t)vbytes + 256);
    sb_gw_cache *c;
    sb_error err;
    if (sb_gw_cache_create(&p, &c, &err) != SB_OK) {
        fprintf(stderr, "bench_cache: %s\n", err.msg);
        return 1;
    }
    t0 = now_s();
    for (long i = 0; i < entries; i++)
        sb_gw_cache_put(c, &keys[i], value, (size_t)vbytes);
    double put_us = (now_s() - t0) * 1e6 / (double)entries;
    long hits;
    double hit_us = time_gets(c, keys, entries, n, 0, &hits);
    /* Misses: keys never stored. */
    sb_gw_cache_key *other = malloc((size_t)entries * sizeof *other);
    for (long i = 0; i < entries; i++)
        other[i] = key_of((uint64_t)(i + entries), input, 16);
    long miss_hits;
    double miss_us = time_gets(c, other, entries, n, 0, &miss_hits);
    /* Stores past the bound: each evicts the least recently used. */
    t0 = now_s();
    for (long i = 0; i < entries; i++)
        sb_gw_cache_put(c, &other[i], value, (size_t)vbytes);
    double evict_us = (now_s() - t0) * 1e6 / (double)entries;
    sb_gw_cache_stats st;
    sb_gw_cache_stats_get(c, &st);
    sb_gw_cache_free(c);

    printf("key (SHA-256 of %ld bytes)        %8.3f us\n", kbytes, hash_us);
    printf("memory hit  (%ld entries, %ld B)  %8.3f us  (%ld/%ld hits)\n", entries, vbytes, hit_us, hits, n);
    printf("memory miss                        %8.3f us  (%ld hits)\n", miss_us, miss_hits);
    printf("memory store                       %8.3f us\n", put_us);
    printf("memory store evicting              %8.3f us  (%llu evictions)\n", evict_us, (unsigned long long)st.evictions);

    if (redis) {
        p.backend = redis;
        if (sb_gw_cache_create(&p, &c, &err) != SB_OK) {
            fprintf(stderr, "bench_cache: %s\n", err.msg);
            return 1;
        }
        long rn = SB_MIN(n, 20000), re = SB_MIN(entries, 2000);
        for (long i = 0; i < re; i++)
            sb_gw_cache_put(c, &keys[i], value, (size_t)vbytes);
        double rhit = time_gets(c, keys, re, rn, 0, &hits);
        sb_gw_cache_stats_get(c, &st);
        printf("redis hit   (%s)  %8.3f us  (%ld/%ld hits, %llu errors)\n", redis, rhit, hits, rn,
               (unsigned long long)st.backend_errors);
        sb_gw_cache_free(c);
    }
    free(other);
    free(keys);
    free(value);
    free(input);
    return 0;
}
