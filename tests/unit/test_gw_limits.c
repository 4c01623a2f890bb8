/*
 * test_gw_limits.c - the rate limits' token buckets (src/gateway/limits.c)
 * on the local path, with a clock the test drives: a bucket starts full,
 * refills at its rate, never admits more than capacity + rate * window in
 * any window (checked over every window of a long random arrival
 * sequence), a refusal's retry-after is exactly when the request fits,
 * token reservations settle back, a request larger than the bucket is
 * "never", eight threads at one instant get exactly the capacity, and the
 * reset headers' duration format.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>

#include <cmocka.h>

#include "base/base.h"
#include "gateway/limits.h"
#include "testutil.h"

static sb_gw_limits *make(void) {
    sb_gw_limits *l = NULL;
    assert_int_equal(sb_gw_limits_create(NULL, &l, NULL), SB_OK);
    return l;
}

static void test_rps_bucket(void **state) {
    (void)state;
    sb_gw_limits *l = make();
    sb_gw_limit_spec spec = {.rps = 5};
    sb_gw_limit_verdict v;
    int64_t t0 = 1000000000;
    for (int i = 0; i < 5; i++) {
        sb_gw_limits_admit(l, "k", &spec, 0, t0, &v);
        assert_true(v.admitted);
        assert_int_equal(v.remaining_requests, 4 - i);
        assert_int_equal(v.limit_requests, 5);
    }
    sb_gw_limits_admit(l, "k", &spec, 0, t0, &v);
    assert_false(v.admitted);
    assert_false(v.never);
    assert_int_equal(v.retry_after_us, 200000); /* one request refills in 1/5 s */
    assert_int_equal(v.reset_requests_us, 1000000);
    sb_gw_limits_admit(l, "k", &spec, 0, t0 + 199999, &v);
    assert_false(v.admitted);
    assert_int_equal(v.retry_after_us, 1);
    sb_gw_limits_admit(l, "k", &spec, 0, t0 + 200000, &v);
    assert_true(v.admitted);
    /* Another key has its own bucket. */
    sb_gw_limits_admit(l, "other", &spec, 0, t0, &v);
    assert_true(v.admitted);
    /* A key whose limit changes starts full at the new one. */
    spec.rps = 50;
    sb_gw_limits_admit(l, "k", &spec, 0, t0 + 200000, &v);
    assert_true(v.admitted);
    assert_int_equal(v.remaining_requests, 49);
    sb_gw_limits_free(l);
}

/* Arrivals every 0-40 ms for 30 s against rps 5 + rpm 120: in every
 * window [a, a + W] the admitted count stays within capacity + rate * W
 * of each bucket (W measured between admissions, the tightest windows). */
static void test_windows(void **state) {
    (void)state;
    sb_gw_limits *l = make();
    sb_gw_limit_spec spec = {.rps = 5, .rpm = 120};
    enum { MAX = 4000 };
    int64_t *at = malloc(MAX * sizeof *at);
    int n = 0;
    uint64_t rng = 42;
    int64_t t = 0;
    while (t < 30000000 && n < MAX) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        t += (int64_t)((rng >> 33) % 40000);
        sb_gw_limit_verdict v;
        sb_gw_limits_admit(l, "w", &spec, 0, t, &v);
        if (v.admitted)
            at[n++] = t;
    }
    assert_true(n > 100);
    for (int i = 0; i < n; i++)
        for (int j = i; j < n; j++) {
            int64_t w = at[j] - at[i];
            int count = j - i + 1;
            /* count <= capacity + rate * w / window, multiplied out by the window */
            assert_true((int64_t)count * 1000000 <= 5 * 1000000 + 5 * w);
            assert_true((int64_t)count * 60000000 <= 120 * 60000000LL + 120 * w);
        }
    /* And the limit is reached: the per-second bucket binds first (5 + 5 * 30
     * at most; arrivals every 20 ms on average leave it little slack). */
    assert_true(n >= 130 && n <= 155);
    free(at);
    sb_gw_limits_free(l);
}

static void test_tokens(void **state) {
    (void)state;
    sb_gw_limits *l = make();
    sb_gw_limit_spec spec = {.tpm = 1000};
    sb_gw_limit_verdict v;
    int64_t t0 = 5000000;
    sb_gw_limits_admit(l, "t", &spec, 600, t0, &v);
    assert_true(v.admitted);
    assert_int_equal(v.remaining_tokens, 400);
    assert_false(v.limits_requests);
    sb_gw_limits_admit(l, "t", &spec, 600, t0, &v);
    assert_false(v.admitted);
    assert_int_equal(v.retry_after_us, 12000000); /* 200 tokens at 1000 per minute */
    /* The first used 100 of its 600: 500 come back. */
    sb_gw_limits_settle(l, "t", &spec, 600, 100, t0);
    sb_gw_limits_admit(l, "t", &spec, 600, t0, &v);
    assert_true(v.admitted);
    assert_int_equal(v.remaining_tokens, 300);
    /* One that used more than it reserved takes the difference. */
    sb_gw_limits_settle(l, "t", &spec, 600, 900, t0);
    sb_gw_limits_admit(l, "t", &spec, 1, t0, &v);
    assert_false(v.admitted);
    assert_int_equal(v.remaining_tokens, 0);
    assert_int_equal(v.retry_after_us, 60000); /* one token at 1000 per minute */
    /* Never above capacity, however much is given back. */
    sb_gw_limits_settle(l, "t", &spec, 100000, 0, t0);
    sb_gw_limits_admit(l, "t", &spec, 0, t0, &v);
    assert_int_equal(v.remaining_tokens, 1000);
    /* Larger than the bucket: waiting cannot help. */
    sb_gw_limits_admit(l, "t", &spec, 1001, t0, &v);
    assert_false(v.admitted);
    assert_true(v.never);
    /* No limits at all: admitted, no headers. */
    sb_gw_limit_spec none = {0};
    sb_gw_limits_admit(l, "free", &none, 1 << 30, t0, &v);
    assert_true(v.admitted);
    assert_false(v.limits_requests || v.limits_tokens);
    sb_gw_limits_free(l);
}

typedef struct {
    sb_gw_limits *l;
    int admitted;
} job;

static void *hammer(void *arg) {
    job *j = arg;
    sb_gw_limit_spec spec = {.rps = 100, .tpm = 100000};
    for (int i = 0; i < 5000; i++) {
        sb_gw_limit_verdict v;
        sb_gw_limits_admit(j->l, "shared", &spec, 10, 777, &v);
        j->admitted += v.admitted;
    }
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    sb_gw_limits *l = make();
    pthread_t th[8];
    job jobs[8];
    for (int i = 0; i < 8; i++) {
        jobs[i] = (job){l, 0};
        pthread_create(&th[i], NULL, hammer, &jobs[i]);
    }
    int total = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        total += jobs[i].admitted;
    }
    assert_int_equal(total, 100); /* the clock stands still: exactly the capacity */
    sb_gw_limits_free(l);
}

static void test_durations(void **state) {
    (void)state;
    const struct {
        int64_t us;
        const char *s;
    } cases[] = {{0, "0ms"},           {1, "1ms"},           {12000, "12ms"},          {999999, "1000ms"},
                 {1000000, "1s"},      {1500000, "1.5s"},    {1234000, "1.234s"},      {59999000, "59.999s"},
                 {60000000, "1m0s"},   {360000000, "6m0s"},  {90500000, "1m30.5s"},    {3723000000, "1h2m3s"}};
    for (size_t i = 0; i < SB_ARRAY_LEN(cases); i++) {
        char out[32];
        sb_gw_format_duration(cases[i].us, out, sizeof out);
        assert_string_equal(out, cases[i].s);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rps_bucket), cmocka_unit_test(test_windows), cmocka_unit_test(test_tokens),
        cmocka_unit_test(test_threads),    cmocka_unit_test(test_durations),
    };
    return sb_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
