/*
 * test_gw_redis.c - the gateway's Redis client (src/gateway/redis.c) against
 * a real redis-server started here on a free port: commands and scripts
 * (EVALSHA, and EVAL after the server forgot the script), many threads on
 * one client, and the failure contract: a dead Redis and a Redis that never
 * answers each cost at most one bounded timeout, then commands fail at once
 * until the backoff ends, and the client reconnects by itself when Redis
 * is back. Skipped (77) when redis-server is not installed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "gateway/clock.h"
#include "gateway/limits.h"
#include "gateway/redis.h"
#include "testutil.h"

#define REDIS_SERVER "/usr/bin/redis-server"

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

static bool port_answers(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

static pid_t start_redis(int port) {
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        execl(REDIS_SERVER, REDIS_SERVER, "--port", p, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
              (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 500 && !port_answers(port); i++)
        usleep(10000);
    assert_true(port_answers(port));
    return pid;
}

static void stop_redis(pid_t pid) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static long long incr(sb_redis *r, const char *key) {
    const char *argv[] = {"INCR", key};
    sb_error err = {0};
    redisReply *reply = sb_redis_command(r, 2, argv, NULL, &err);
    if (!reply)
        return -1;
    long long v = reply->type == REDIS_REPLY_INTEGER ? reply->integer : -2;
    freeReplyObject(reply);
    return v;
}

static void test_urls(void **state) {
    (void)state;
    const char *bad[] = {"localhost:6379", "redis://", "redis://h:0", "redis://h:99999", "redis://h:x",
                         "redis://h:1/x", "http://h:1"};
    for (size_t i = 0; i < SB_ARRAY_LEN(bad); i++) {
        sb_redis *r = (sb_redis *)1;
        sb_error err = {0};
        assert_int_equal(sb_redis_create(bad[i], 0, &r, &err), SB_ERR_INVALID_ARG);
        assert_null(r);
        assert_non_null(strstr(err.msg, bad[i]));
    }
    /* Nothing listens there: creating still succeeds, the client is down. */
    sb_redis *r = NULL;
    assert_int_equal(sb_redis_create("redis://127.0.0.1:1/3", 20, &r, NULL), SB_OK);
    assert_false(sb_redis_up(r));
    assert_string_equal(sb_redis_addr(r), "127.0.0.1:1");
    sb_redis_free(r);
}

typedef struct {
    sb_redis *r;
    int n;
    int fails;
} incr_job;

static void *incr_many(void *arg) {
    incr_job *j = arg;
    for (int i = 0; i < j->n; i++)
        if (incr(j->r, "sbtest:counter") < 0)
            j->fails++;
    return NULL;
}

static void test_live(void **state) {
    (void)state;
    if (access(REDIS_SERVER, X_OK) != 0)
        SB_TEST_SKIP("no " REDIS_SERVER);
    int port = free_port();
    pid_t pid = start_redis(port);
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/2", port);
    sb_redis *r = NULL;
    assert_int_equal(sb_redis_create(url, 200, &r, NULL), SB_OK);
    assert_true(sb_redis_up(r));

    /* Scripts: first run loads by EVAL (NOSCRIPT), later ones by EVALSHA;
     * after SCRIPT FLUSH the fallback loads it again. */
    sb_redis_script s;
    sb_redis_script_init(&s, "return redis.call('INCRBY', KEYS[1], ARGV[1])");
    assert_int_equal(strlen(s.sha1), 40);
    const char *args[] = {"sbtest:s", "5"};
    for (int round = 0; round < 3; round++) {
        if (round == 2) {
            const char *flush[] = {"SCRIPT", "FLUSH"};
            freeReplyObject(sb_redis_command(r, 2, flush, NULL, NULL));
        }
        redisReply *reply = sb_redis_eval(r, &s, 1, 2, args, NULL, NULL);
        assert_non_null(reply);
        assert_int_equal(reply->type, REDIS_REPLY_INTEGER);
        assert_int_equal(reply->integer, 5 * (round + 1));
        freeReplyObject(reply);
    }
    /* A script error is a reply; the connection stays up. */
    sb_redis_script bad;
    sb_redis_script_init(&bad, "return redis.call('NOSUCHCOMMAND')");
    redisReply *reply = sb_redis_eval(r, &bad, 0, 0, NULL, NULL, NULL);
    assert_non_null(reply);
    assert_int_equal(reply->type, REDIS_REPLY_ERROR);
    freeReplyObject(reply);
    assert_true(sb_redis_up(r));

    /* Eight threads on one client: every INCR lands once. */
    pthread_t th[8];
    incr_job jobs[8];
    for (int i = 0; i < 8; i++) {
        jobs[i] = (incr_job){r, 500, 0};
        pthread_create(&th[i], NULL, incr_many, &jobs[i]);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].fails, 0);
    }
    assert_int_equal(incr(r, "sbtest:counter"), 8 * 500 + 1);

    /* Two limiters (two replicas) on one Redis share a key's buckets:
     * 10 requests per second between them, the tokens too; settling on
     * one gives back to both. */
    sb_redis *r2 = NULL;
    assert_int_equal(sb_redis_create(url, 200, &r2, NULL), SB_OK);
    sb_gw_limits *la = NULL, *lb = NULL;
    assert_int_equal(sb_gw_limits_create(r, &la, NULL), SB_OK);
    assert_int_equal(sb_gw_limits_create(r2, &lb, NULL), SB_OK);
    sb_gw_limit_spec spec = {.rps = 10, .tpm = 100000};
    int admitted = 0;
    sb_gw_limit_verdict lv;
    for (int i = 0; i < 40; i++) {
        sb_gw_limits_admit(i % 2 ? la : lb, "shared", &spec, 1000, 0, &lv);
        assert_true(lv.via_redis);
        admitted += lv.admitted;
        if (!lv.admitted)
            assert_true(lv.retry_after_us > 0 && lv.retry_after_us <= 100000);
    }
    assert_true(admitted >= 10 && admitted <= 11); /* 10, and one more if 100 ms passed meanwhile */
    sb_gw_limits_admit(la, "shared", &(sb_gw_limit_spec){.tpm = 100000}, 0, 0, &lv);
    int64_t before = lv.remaining_tokens;
    sb_gw_limits_settle(lb, "shared", &(sb_gw_limit_spec){.tpm = 100000}, 1000, 10, 0);
    sb_gw_limits_admit(la, "shared", &(sb_gw_limit_spec){.tpm = 100000}, 0, 0, &lv);
    assert_true(lv.remaining_tokens >= before + 990);
    sb_gw_limits_free(la);
    sb_gw_limits_free(lb);
    sb_redis_free(r2);

    /* Redis dies: the failing command is quick, then the client does not
     * even try until the backoff has passed. */
    stop_redis(pid);
    int64_t t0 = sb_gw_now_us();
    assert_int_equal(incr(r, "sbtest:counter"), -1);
    assert_true(sb_gw_now_us() - t0 < 300 * 1000);
    assert_false(sb_redis_up(r));
    t0 = sb_gw_now_us();
    for (int i = 0; i < 1000; i++)
        assert_int_equal(incr(r, "sbtest:counter"), -1);
    assert_true(sb_gw_now_us() - t0 < 100 * 1000);

    /* Back on the same port: reconnects by itself after the backoff (the
     * database number is selected again: the counter starts over because
     * nothing was saved). */
    pid = start_redis(port);
    int64_t deadline = sb_gw_now_us() + 5 * 1000000;
    long long v = -1;
    while (v < 0 && sb_gw_now_us() < deadline) {
        v = incr(r, "sbtest:after");
        usleep(20000);
    }
    assert_int_equal(v, 1);
    assert_true(sb_redis_up(r));
    const char *getdb[] = {"CLIENT", "INFO"};
    reply = sb_redis_command(r, 2, getdb, NULL, NULL);
    assert_non_null(reply);
    assert_non_null(strstr(reply->str, " db=2 "));
    freeReplyObject(reply);
    sb_redis_free(r);
    stop_redis(pid);
}

/* A server that accepts connections (the kernel's backlog) but never
 * answers: each command costs the timeout, once per backoff window. */
static void test_silent(void **state) {
    (void)state;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 16), 0);
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", ntohs(a.sin_port));
    sb_redis *r = NULL;
    assert_int_equal(sb_redis_create(url, 50, &r, NULL), SB_OK);
    int64_t t0 = sb_gw_now_us();
    sb_error err = {0};
    const char *argv[] = {"PING"};
    assert_null(sb_redis_command(r, 1, argv, NULL, &err));
    int64_t took = sb_gw_now_us() - t0;
    assert_true(took >= 40 * 1000 && took < 500 * 1000);
    assert_int_equal(err.status, SB_ERR_IO);
    t0 = sb_gw_now_us();
    for (int i = 0; i < 100; i++)
        assert_null(sb_redis_command(r, 1, argv, NULL, NULL));
    assert_true(sb_gw_now_us() - t0 < 20 * 1000);
    sb_redis_free(r);
    close(fd);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_urls),
        cmocka_unit_test(test_live),
        cmocka_unit_test(test_silent),
    };
    return sb_test_exit(cmocka_run_group_tests(tests, NULL, NULL));
}
