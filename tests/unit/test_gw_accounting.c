/*
 * test_gw_accounting.c - the gateway's accounting pieces without a server:
 * the response cache (keys, LRU order under the byte bound, TTL, an
 * unreachable Redis as bounded misses), usage.db (records summed per
 * group, feedback replacing, unknown and other keys' ids, a corrupt file)
 * and the request log's rotation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "gateway/cache.h"
#include "gateway/reqlog.h"
#include "gateway/usage.h"
#include "testutil.h"

static sb_gw_cache_key key_of(const char *s) {
    sb_gw_hasher h;
    sb_gw_hasher_init(&h);
    sb_gw_hasher_field(&h, s, strlen(s));
    sb_gw_cache_key k;
    assert_true(sb_gw_hasher_final(&h, &k));
    return k;
}

static bool has(sb_gw_cache *c, const char *k, const char *want) {
    sb_gw_cache_key key = key_of(k);
    void *v;
    size_t len;
    if (!sb_gw_cache_get(c, &key, &v, &len))
        return false;
    bool same = len == strlen(want) && memcmp(v, want, len) == 0;
    sb_free(v);
    assert_true(same);
    return true;
}

static void put(sb_gw_cache *c, const char *k, const char *v) {
    sb_gw_cache_key key = key_of(k);
    sb_gw_cache_put(c, &key, v, strlen(v));
}

static void test_keys_are_fields(void **state) {
    (void)state;
    /* Length-prefixed fields: ("ab","c") is not ("a","bc"). */
    sb_gw_hasher h1, h2;
    sb_gw_hasher_init(&h1);
    sb_gw_hasher_field(&h1, "ab", 2);
    sb_gw_hasher_field(&h1, "c", 1);
    sb_gw_hasher_init(&h2);
    sb_gw_hasher_field(&h2, "a", 1);
    sb_gw_hasher_field(&h2, "bc", 2);
    sb_gw_cache_key k1, k2;
    assert_true(sb_gw_hasher_final(&h1, &k1));
    assert_true(sb_gw_hasher_final(&h2, &k2));
    assert_memory_not_equal(k1.b, k2.b, sizeof k1.b);
    sb_gw_cache_key a = key_of("x"), b = key_of("x");
    assert_memory_equal(a.b, b.b, sizeof a.b);
}

static void test_lru_under_the_byte_bound(void **state) {
    (void)state;
    sb_gw_cache_params p = sb_gw_cache_default_params();
    sb_gw_cache *c;
    sb_error err;
    assert_int_equal(sb_gw_cache_create(&p, &c, &err), SB_OK);
    put(c, "probe", "0123456789");
    sb_gw_cache_stats st;
    sb_gw_cache_stats_get(c, &st);
    size_t one = st.bytes; /* what one 10-byte entry costs */
    sb_gw_cache_free(c);

    p.max_bytes = one * 3;
    assert_int_equal(sb_gw_cache_create(&p, &c, &err), SB_OK);
    put(c, "a", "AAAAAAAAAA");
    put(c, "b", "BBBBBBBBBB");
    put(c, "c", "CCCCCCCCCC");
    assert_true(has(c, "a", "AAAAAAAAAA")); /* a is the most recent now; b the least */
    put(c, "d", "DDDDDDDDDD");
    assert_false(has(c, "b", ""));
    assert_true(has(c, "a", "AAAAAAAAAA"));
    assert_true(has(c, "c", "CCCCCCCCCC"));
    assert_true(has(c, "d", "DDDDDDDDDD"));
    put(c, "c", "cccccccccc"); /* replaces */
    assert_true(has(c, "c", "cccccccccc"));
    sb_gw_cache_stats_get(c, &st);
    assert_int_equal(st.entries, 3);
    assert_true(st.bytes <= p.max_bytes);
    assert_int_equal(st.evictions, 1);
    /* A value larger than the whole bound is not stored, and evicts nothing. */
    char big[4096];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    put(c, "big", big);
    assert_false(has(c, "big", big));
    sb_gw_cache_stats_get(c, &st);
    assert_int_equal(st.entries, 3);
    /* Many entries: the table grows, every one is found. */
    sb_gw_cache_free(c);
    p.max_bytes = (size_t)64 << 20;
    assert_int_equal(sb_gw_cache_create(&p, &c, &err), SB_OK);
    char k[32], v[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(k, sizeof k, "k%d", i);
        snprintf(v, sizeof v, "v%d", i);
        put(c, k, v);
    }
    for (int i = 0; i < 5000; i += 7) {
        snprintf(k, sizeof k, "k%d", i);
        snprintf(v, sizeof v, "v%d", i);
        assert_true(has(c, k, v));
    }
    sb_gw_cache_free(c);
}

static void test_ttl(void **state) {
    (void)state;
    sb_gw_cache_params p = sb_gw_cache_default_params();
    p.ttl_ms = 50;
    sb_gw_cache *c;
    sb_error err;
    assert_int_equal(sb_gw_cache_create(&p, &c, &err), SB_OK);
    put(c, "a", "A");
    assert_true(has(c, "a", "A"));
    usleep(80 * 1000);
    assert_false(has(c, "a", ""));
    sb_gw_cache_stats st;
    sb_gw_cache_stats_get(c, &st);
    assert_int_equal(st.expired, 1);
    assert_int_equal(st.entries, 0);
    sb_gw_cache_free(c);
    p.ttl_ms = 0;
    assert_int_equal(sb_gw_cache_create(&p, &c, &err), SB_ERR_INVALID_ARG);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void test_unreachable_redis_is_a_fast_miss(void **state) {
    (void)state;
    sb_gw_cache_params p = sb_gw_cache_default_params();
    sb_gw_cache *c;
    sb_error err;
    p.backend = "redis://nohost:x";
    assert_int_equal(sb_gw_cache_create(&p, &c, &err), SB_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "port must be a number"));
    p.backend = "memcached://x";
    assert_int_equal(sb_gw_cache_create(&p, &c, &err), SB_ERR_INVALID_ARG);
    /* Port 1 on loopback: refused at once; then down for the backoff. */
    p.backend = "redis://127.0.0.1:1";
    assert_int_equal(sb_gw_cache_create(&p, &c, &err), SB_OK);
    assert_true(sb_gw_cache_remote(c));
    double t0 = now_s();
    for (int i = 0; i < 1000; i++) {
        put(c, "a", "A");
        assert_false(has(c, "a", ""));
    }
    assert_true(now_s() - t0 < 1.0);
    sb_gw_cache_free(c);
}

static void test_usage(void **state) {
    (void)state;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/usage-%d", sb_test_tmpdir(), (int)getpid());
    sb_gw_usage *u;
    sb_error err;
    assert_int_equal(sb_gw_usage_open(dir, &u, &err), SB_OK);
    int64_t t = 1796128114; /* 2026-12-01 */
    sb_gw_usage_rec recs[] = {
        {.time_s = t, .key = "alice", .model = "a", .requested = "ab", .id = "c1", .prompt = 10, .completion = 5,
         .cached = 2, .latency_ms = 10, .ttft_ms = 2, .cost = 0.5},
        {.time_s = t, .key = "alice", .model = "a", .requested = "ab", .id = "c2", .prompt = 20, .completion = 7,
         .cached = 20, .cache_hit = true, .latency_ms = 1, .ttft_ms = 1},
        {.time_s = t, .key = "bob", .model = "b", .requested = "ab", .id = "c3", .prompt = 3, .completion = 1,
         .latency_ms = 4, .ttft_ms = -1, .cost = 0.25},
        {.time_s = t + 86400, .key = "", .model = "a", .requested = "a", .error = true, .latency_ms = 2, .ttft_ms = -1},
    };
    assert_int_equal(sb_gw_usage_record(u, recs, 4, &err), SB_OK);
    char model[SB_GW_USAGE_NAME_MAX];
    assert_int_equal(sb_gw_usage_feedback(u, "c1", "alice", 1, "good", model, &err), SB_OK);
    assert_string_equal(model, "a");
    assert_int_equal(sb_gw_usage_feedback(u, "c1", "alice", -1, NULL, model, &err), SB_OK); /* replaces */
    assert_int_equal(sb_gw_usage_feedback(u, "c3", "alice", 1, NULL, model, &err), SB_ERR_NOT_FOUND); /* bob's */
    assert_int_equal(sb_gw_usage_feedback(u, "c3", NULL, 0.5, NULL, model, &err), SB_OK); /* an administrator */
    assert_int_equal(sb_gw_usage_feedback(u, "nope", NULL, 1, NULL, model, &err), SB_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "'nope'"));

    sb_gw_usage_row *rows;
    size_t n;
    assert_int_equal(sb_gw_usage_query(u, SB_GW_BY_MODEL, NULL, NULL, &rows, &n, &err), SB_OK);
    assert_int_equal(n, 3); /* (a, ab), (a, direct), (b, ab) */
    assert_string_equal(rows[0].group, "a");
    assert_string_equal(rows[0].arm, "");
    assert_int_equal(rows[0].errors, 1);
    assert_string_equal(rows[1].group, "a");
    assert_string_equal(rows[1].arm, "ab");
    assert_int_equal(rows[1].requests, 2);
    assert_int_equal(rows[1].prompt, 30);
    assert_int_equal(rows[1].completion, 12);
    assert_int_equal(rows[1].cached, 22);
    assert_int_equal(rows[1].cache_hits, 1);
    assert_int_equal(rows[1].rating_n, 1);
    assert_true(rows[1].rating_sum == -1);
    assert_true(rows[1].cost == 0.5);
    assert_int_equal(rows[1].ttft_n, 2);
    assert_true(rows[2].rating_sum == 0.5);
    sb_free(rows);
    assert_int_equal(sb_gw_usage_query(u, SB_GW_BY_KEY, NULL, "alice", &rows, &n, &err), SB_OK);
    assert_int_equal(n, 1);
    assert_int_equal(rows[0].requests, 2);
    sb_free(rows);
    assert_int_equal(sb_gw_usage_query(u, SB_GW_BY_DAY, "2026-12-02", NULL, &rows, &n, &err), SB_OK);
    assert_int_equal(n, 1);
    assert_string_equal(rows[0].group, "2026-12-02");
    sb_free(rows);
    sb_gw_usage_close(u);

    assert_true(sb_gw_usage_day_valid("2026-12-01"));
    assert_false(sb_gw_usage_day_valid("2026-13-01"));
    assert_false(sb_gw_usage_day_valid("yesterday"));
    assert_false(sb_gw_usage_day_valid("2026-12-011"));

    /* A file that is not a database: a clear error naming it. */
    char path[600];
    snprintf(path, sizeof path, "%s/usage.db", dir);
    unlink(path);
    char wal[620];
    snprintf(wal, sizeof wal, "%s-wal", path);
    unlink(wal);
    snprintf(wal, sizeof wal, "%s-shm", path);
    unlink(wal);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 100; i++)
        fputs("not a database at all\n", f);
    fclose(f);
    assert_int_equal(sb_gw_usage_open(dir, &u, &err), SB_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "usage.db"));
    assert_non_null(strstr(err.msg, "not a database"));
}

static size_t file_size(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 ? (size_t)st.st_size : 0;
}

static void test_reqlog_rotation(void **state) {
    (void)state;
    char path[512], old[530];
    snprintf(path, sizeof path, "%s/req-%d.log", sb_test_tmpdir(), (int)getpid());
    for (int k = 0; k <= SB_GW_REQLOG_KEEP + 1; k++) {
        snprintf(old, sizeof old, k ? "%s.%d" : "%s", path, k);
        unlink(old);
    }
    sb_gw_reqlog *l;
    sb_error err;
    assert_int_equal(sb_gw_reqlog_open(path, 100, &l, &err), SB_OK);
    const char line[] = "{\"n\":\"0123456789012345678901234567890123456789\"}\n"; /* 49 bytes: two per file */
    for (int i = 0; i < 20; i++)
        assert_true(sb_gw_reqlog_write(l, line, sizeof line - 1, &err));
    sb_gw_reqlog_close(l);
    assert_int_equal(file_size(path), 2 * (sizeof line - 1));
    for (int k = 1; k <= SB_GW_REQLOG_KEEP; k++) {
        snprintf(old, sizeof old, "%s.%d", path, k);
        assert_int_equal(file_size(old), 2 * (sizeof line - 1));
    }
    snprintf(old, sizeof old, "%s.%d", path, SB_GW_REQLOG_KEEP + 1);
    assert_int_equal(access(old, F_OK), -1);
    /* A line longer than the bound still goes out, alone in its file. */
    assert_int_equal(sb_gw_reqlog_open(path, 10, &l, &err), SB_OK);
    assert_true(sb_gw_reqlog_write(l, line, sizeof line - 1, &err));
    sb_gw_reqlog_close(l);
    assert_int_equal(file_size(path), sizeof line - 1);
    /* A directory that does not exist: a clear error. */
    assert_int_equal(sb_gw_reqlog_open("/nonexistent-dir-gwacct/x.log", 0, &l, &err), SB_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent-dir-gwacct/x.log"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys_are_fields),
        cmocka_unit_test(test_lru_under_the_byte_bound),
        cmocka_unit_test(test_ttl),
        cmocka_unit_test(test_unreachable_redis_is_a_fast_miss),
        cmocka_unit_test(test_usage),
        cmocka_unit_test(test_reqlog_rotation),
    };
    return sb_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
