/*
 * limits.c - token buckets, local and in Redis (see limits.h).
 *
 * The three buckets of a key are indexed 0 (per second), 1 (requests per
 * minute), 2 (tokens per minute). A level is in 1/window_us units, so the
 * capacity is limit * window_us and dt microseconds refill dt * limit.
 */
#include "gateway/limits.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"
#include "gateway/keys.h"

#define N_BUCKETS 3
#define N_SLOTS 1024 /* chains of the local table (keys are few) */

static const int64_t window_us[N_BUCKETS] = {1000000, 60000000, 60000000};

/* The same arithmetic as refill(), fits() and charge() below, in Redis's
 * Lua (doubles, exact below 2^53), with Redis's clock: ARGV = rps, rpm,
 * tpm, the three costs (in requests, requests, tokens), and "1" to check
 * before charging (admission) or "0" to charge unconditionally (a
 * settlement's correction, negative for a refund). A bucket whose capacity
 * changed (the key's limit was edited) starts full again. */
static const char script_src[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
    "local win = {1000000, 60000000, 60000000}\n"
    "local s = redis.call('HMGET', KEYS[1], 'ts', 'l1', 'l2', 'l3', 'c1', 'c2', 'c3')\n"
    "local dt = now - (tonumber(s[1]) or now)\n"
    "if dt < 0 then dt = 0 end\n"
    "local lvl, cap, ok = {}, {}, 1\n"
    "for i = 1, 3 do\n"
    "  local lim = tonumber(ARGV[i])\n"
    "  cap[i] = lim * win[i]\n"
    "  local l = tonumber(s[i + 1])\n"
    "  if l == nil or tonumber(s[i + 4]) ~= cap[i] then l = cap[i] end\n"
    "  if lim > 0 and dt > (cap[i] - l) / lim then l = cap[i] elseif lim > 0 then l = l + dt * lim end\n"
    "  lvl[i] = l\n"
    "  local cost = tonumber(ARGV[3 + i]) * win[i]\n"
    "  if ARGV[7] == '1' and lim > 0 and cost > 0 and l < cost then ok = 0 end\n"
    "end\n"
    "if ok == 1 then\n"
    "  for i = 1, 3 do\n"
    "    if cap[i] > 0 then lvl[i] = math.min(cap[i], lvl[i] - tonumber(ARGV[3 + i]) * win[i]) end\n"
    "  end\n"
    "end\n"
    "redis.call('HSET', KEYS[1], 'ts', now, 'l1', lvl[1], 'l2', lvl[2], 'l3', lvl[3],"
    " 'c1', cap[1], 'c2', cap[2], 'c3', cap[3])\n"
    "redis.call('PEXPIRE', KEYS[1], 120000)\n"
    "return {ok, lvl[1], lvl[2], lvl[3]}\n";

typedef struct entry {
    struct entry *next;
    char name[64];
    int64_t level[N_BUCKETS];
    int64_t cap[N_BUCKETS];
    int64_t ts; /* monotonic us of the last refill */
} entry;

struct sb_gw_limits {
    pthread_mutex_t mu;
    entry *slots[N_SLOTS];
    sb_redis *redis;
    sb_redis_script script;
};

static void limits_of(const sb_gw_limit_spec *s, int64_t lim[N_BUCKETS]) {
    lim[0] = SB_MIN(SB_MAX(s->rps, 0), SB_GW_LIMIT_MAX);
    lim[1] = SB_MIN(SB_MAX(s->rpm, 0), SB_GW_LIMIT_MAX);
    lim[2] = SB_MIN(SB_MAX(s->tpm, 0), SB_GW_LIMIT_MAX);
}

static void refill(const int64_t lim[N_BUCKETS], int64_t level[N_BUCKETS], int64_t dt) {
    for (int i = 0; i < N_BUCKETS; i++) {
        int64_t cap = lim[i] * window_us[i];
        if (lim[i] > 0 && dt > (cap - level[i]) / lim[i])
            level[i] = cap;
        else if (lim[i] > 0)
            level[i] += dt * lim[i];
    }
}

/* Whether every limited bucket holds its cost; if not, how long until it
 * will (and whether it never can). */
static bool fits(const int64_t lim[N_BUCKETS], const int64_t level[N_BUCKETS], const int64_t cost[N_BUCKETS],
                 sb_gw_limit_verdict *v) {
    bool ok = true;
    v->retry_after_us = 0;
    for (int i = 0; i < N_BUCKETS; i++) {
        if (lim[i] <= 0 || cost[i] <= 0)
            continue;
        if (cost[i] > lim[i]) {
            v->never = true;
            ok = false;
            continue;
        }
        int64_t need = cost[i] * window_us[i];
        if (level[i] < need) {
            ok = false;
            v->retry_after_us = SB_MAX(v->retry_after_us, (need - level[i] + lim[i] - 1) / lim[i]);
        }
    }
    return ok;
}

/* Takes the costs (a negative one gives back), never above capacity. */
static void charge(const int64_t lim[N_BUCKETS], int64_t level[N_BUCKETS], const int64_t cost[N_BUCKETS]) {
    for (int i = 0; i < N_BUCKETS; i++)
        if (lim[i] > 0)
            level[i] = SB_MIN(lim[i] * window_us[i], level[i] - cost[i] * window_us[i]);
}

/* The header figures from the levels after the decision. */
static void report(const int64_t lim[N_BUCKETS], const int64_t level[N_BUCKETS], sb_gw_limit_verdict *v) {
    int64_t remaining[N_BUCKETS], reset[N_BUCKETS];
    for (int i = 0; i < N_BUCKETS; i++) {
        int64_t cap = lim[i] * window_us[i];
        remaining[i] = lim[i] > 0 ? SB_MAX(level[i], 0) / window_us[i] : 0;
        reset[i] = lim[i] > 0 ? (cap - level[i] + lim[i] - 1) / lim[i] : 0;
    }
    /* The request bucket nearer to empty, by the fraction left. */
    int r = lim[0] > 0 && (lim[1] <= 0 || remaining[0] * lim[1] <= remaining[1] * lim[0]) ? 0 : 1;
    v->limits_requests = lim[r] > 0;
    v->limit_requests = lim[r];
    v->remaining_requests = remaining[r];
    v->reset_requests_us = reset[r];
    v->limits_tokens = lim[2] > 0;
    v->limit_tokens = lim[2];
    v->remaining_tokens = remaining[2];
    v->reset_tokens_us = reset[2];
}

/* The key's local buckets, refilled to now (created full). Caller holds mu;
 * NULL only when out of memory. */
static entry *local_buckets(sb_gw_limits *l, const char *name, const int64_t lim[N_BUCKETS], int64_t now_us) {
    entry **slot = &l->slots[sb_gw_name_hash(name) % N_SLOTS], *e = *slot;
    while (e && strcmp(e->name, name) != 0)
        e = e->next;
    if (!e) {
        if (!(e = sb_calloc(1, sizeof *e)))
            return NULL;
        snprintf(e->name, sizeof e->name, "%s", name);
        e->ts = now_us;
        for (int i = 0; i < N_BUCKETS; i++)
            e->cap[i] = -1; /* filled below */
        e->next = *slot;
        *slot = e;
    }
    for (int i = 0; i < N_BUCKETS; i++)
        if (e->cap[i] != lim[i] * window_us[i]) { /* new, or the key's limit changed */
            e->cap[i] = lim[i] * window_us[i];
            e->level[i] = e->cap[i];
        }
    refill(lim, e->level, SB_MAX(now_us - e->ts, 0));
    e->ts = SB_MAX(e->ts, now_us);
    return e;
}

sb_status sb_gw_limits_create(sb_redis *redis, sb_gw_limits **out, sb_error *err) {
    sb_gw_limits *l = sb_calloc(1, sizeof *l);
    if (!l)
        return sb_fail(err, SB_ERR_NOMEM, "out of memory for the rate limits");
    pthread_mutex_init(&l->mu, NULL);
    l->redis = redis;
    sb_redis_script_init(&l->script, script_src);
    *out = l;
    return SB_OK;
}

void sb_gw_limits_free(sb_gw_limits *l) {
    if (!l)
        return;
    for (size_t i = 0; i < N_SLOTS; i++)
        for (entry *e = l->slots[i], *next; e; e = next) {
            next = e->next;
            sb_free(e);
        }
    pthread_mutex_destroy(&l->mu);
    sb_free(l);
}

/* Runs the script; false when Redis did not answer as expected. */
static bool redis_run(sb_gw_limits *l, const char *name, const int64_t lim[N_BUCKETS], const int64_t cost[N_BUCKETS],
                      bool check, int64_t level[N_BUCKETS], bool *ok) {
    if (!l->redis)
        return false;
    char key[96], a[6][24];
    snprintf(key, sizeof key, "sb:rl:%s", name);
    for (int i = 0; i < N_BUCKETS; i++) {
        snprintf(a[i], sizeof a[i], "%" PRId64, lim[i]);
        snprintf(a[3 + i], sizeof a[3 + i], "%" PRId64, cost[i]);
    }
    const char *args[] = {key, a[0], a[1], a[2], a[3], a[4], a[5], check ? "1" : "0"};
    redisReply *r = sb_redis_eval(l->redis, &l->script, 1, (int)SB_ARRAY_LEN(args), args, NULL, NULL);
    bool good = r && r->type == REDIS_REPLY_ARRAY && r->elements == 4;
    for (size_t i = 0; good && i < 4; i++)
        good = r->element[i]->type == REDIS_REPLY_INTEGER;
    if (good) {
        *ok = r->element[0]->integer == 1;
        for (int i = 0; i < N_BUCKETS; i++)
            level[i] = r->element[1 + i]->integer;
    }
    if (r)
        freeReplyObject(r);
    return good;
}

/* Admission with these costs (all zero: a look that takes nothing). */
static void decide(sb_gw_limits *l, const char *name, const sb_gw_limit_spec *spec, const int64_t cost[N_BUCKETS],
                   int64_t now_us, sb_gw_limit_verdict *v) {
    memset(v, 0, sizeof *v);
    int64_t lim[N_BUCKETS], level[N_BUCKETS];
    limits_of(spec, lim);
    if (!lim[0] && !lim[1] && !lim[2]) {
        v->admitted = true;
        return;
    }
    bool ok;
    if (redis_run(l, name, lim, cost, true, level, &ok)) {
        v->via_redis = true;
        if (!ok) /* the levels came back unchanged: why, and for how long */
            fits(lim, level, cost, v);
    } else {
        pthread_mutex_lock(&l->mu);
        entry *e = local_buckets(l, name, lim, now_us);
        ok = e && fits(lim, e->level, cost, v);
        if (ok)
            charge(lim, e->level, cost);
        if (e)
            memcpy(level, e->level, sizeof level);
        else
            memset(level, 0, sizeof level);
        pthread_mutex_unlock(&l->mu);
    }
    v->admitted = ok;
    report(lim, level, v);
}

void sb_gw_limits_admit(sb_gw_limits *l, const char *name, const sb_gw_limit_spec *spec, int64_t tokens,
                        int64_t now_us, sb_gw_limit_verdict *v) {
    const int64_t cost[N_BUCKETS] = {1, 1, SB_MAX(tokens, 0)};
    decide(l, name, spec, cost, now_us, v);
}

void sb_gw_limits_peek(sb_gw_limits *l, const char *name, const sb_gw_limit_spec *spec, int64_t now_us,
                       sb_gw_limit_verdict *v) {
    const int64_t cost[N_BUCKETS] = {0, 0, 0};
    decide(l, name, spec, cost, now_us, v);
}

void sb_gw_limits_settle(sb_gw_limits *l, const char *name, const sb_gw_limit_spec *spec, int64_t reserved,
                         int64_t used, int64_t now_us) {
    int64_t lim[N_BUCKETS], level[N_BUCKETS];
    limits_of(spec, lim);
    if (lim[2] <= 0 || used == reserved)
        return;
    int64_t cost[N_BUCKETS] = {0, 0, used - reserved};
    bool ok;
    if (redis_run(l, name, lim, cost, false, level, &ok))
        return;
    pthread_mutex_lock(&l->mu);
    entry *e = local_buckets(l, name, lim, now_us);
    if (e)
        charge(lim, e->level, cost);
    pthread_mutex_unlock(&l->mu);
}

void sb_gw_format_duration(int64_t us, char *out, size_t cap) {
    if (us < 0)
        us = 0;
    if (us < 1000000) {
        snprintf(out, cap, "%" PRId64 "ms", (us + 999) / 1000);
        return;
    }
    int64_t ms = (us + 999) / 1000;
    int64_t h = ms / 3600000, m = ms / 60000 % 60, s = ms / 1000 % 60, frac = ms % 1000;
    char sec[24];
    if (frac == 0)
        snprintf(sec, sizeof sec, "%" PRId64 "s", s);
    else {
        snprintf(sec, sizeof sec, "%" PRId64 ".%03" PRId64, s, frac);
        size_t n = strlen(sec);
        while (sec[n - 1] == '0')
            sec[--n] = '\0';
        snprintf(sec + n, sizeof sec - n, "s");
    }
    if (h)
        snprintf(out, cap, "%" PRId64 "h%" PRId64 "m%s", h, m, sec);
    else if (m)
        snprintf(out, cap, "%" PRId64 "m%s", m, sec);
    else
        snprintf(out, cap, "%s", sec);
}
